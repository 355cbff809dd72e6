/* The floating-point environment of a rank. */
#ifndef MOMFMM_FLOAT_ENV_H
#define MOMFMM_FLOAT_ENV_H
#include <stdbool.h>

/* Subnormal floats (|x| < 1.2e-38) take a microcode assist on x86: every
 * product with one costs ~100 cycles. A model whose attention has
 * collapsed (copy task, T = 512, softmax: probabilities of exp(-100))
 * fills the attention matrices with them, and training slowed from 64,000
 * to 12,000 tokens/s in the middle of a run. This sets flush-to-zero and
 * denormals-are-zero for the calling thread (and threads it starts later),
 * as -ffast-math's start-up code does and torch.set_flush_denormal(True)
 * offers; it changes only values below 1.2e-38. MOMFMM_KEEP_DENORMALS=1
 * keeps IEEE subnormals. OpenBLAS worker threads started when the library
 * loaded (only with OMP_NUM_THREADS > 1) keep the default mode. No-op off
 * x86. */
void float_env_flush_denormals(void);

/* True when flush-to-zero and denormals-are-zero are on in this thread. */
bool float_env_flushing(void);
#endif
