/* Flush-to-zero / denormals-are-zero; see float_env.h for why. */
#include "base/float_env.h"

#include <stdlib.h>

#if defined(__x86_64__) || defined(__i386__)
#include <pmmintrin.h>
#include <xmmintrin.h>

void float_env_flush_denormals(void) {
    if (getenv("MOMFMM_KEEP_DENORMALS")) return;
    _MM_SET_FLUSH_ZERO_MODE(_MM_FLUSH_ZERO_ON);
    _MM_SET_DENORMALS_ZERO_MODE(_MM_DENORMALS_ZERO_ON);
}

bool float_env_flushing(void) {
    return _MM_GET_FLUSH_ZERO_MODE() == _MM_FLUSH_ZERO_ON && _MM_GET_DENORMALS_ZERO_MODE() == _MM_DENORMALS_ZERO_ON;
}
#else
void float_env_flush_denormals(void) {}

bool float_env_flushing(void) { return false; }
#endif
