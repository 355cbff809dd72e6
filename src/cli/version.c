/* `momfmm --version` (docs/cli.md §5). The version and the revision are
 * build_info.c's; the library versions from each library's header (built with) and from the library
 * itself (runs with), since a shared library may be replaced after the
 * build. MPI's are the parallel runtime's, the one folder that calls MPI (docs/design.md §8.3). */
#include "cli/version.h"

#include <cblas.h>
#include <hdf5.h>
#include <openblas_config.h>
#include <stdio.h>
#include <string.h>

#include "base/build_info.h"
#include "base/cpu.h"
#include "base/log.h"
#include "kernels/gemm.h"
#include "parallel/dist.h"

/* OPENBLAS_VERSION is " OpenBLAS 0.3.21 ": the number alone. */
static void openblas_build_version(char *out, size_t len) {
    const char *text = OPENBLAS_VERSION;
    const char *number = strstr(text, "OpenBLAS ");
    number = number ? number + strlen("OpenBLAS ") : text;
    snprintf(out, len, "%.*s", (int)strcspn(number, " "), number);
}

void version_print(void) {
    char mpi_built[128], mpi_running[256], blas_built[64];
    dist_build_version(mpi_built, sizeof mpi_built);
    dist_library_version(mpi_running, sizeof mpi_running);
    openblas_build_version(blas_built, sizeof blas_built);
    unsigned major = 0, minor = 0, release = 0;
    H5get_libversion(&major, &minor, &release);
    printf("%s\n", build_description());
    printf("MPI:      built with %s; running %s\n", mpi_built, mpi_running);
    printf("OpenBLAS: built with %s; running %s\n", blas_built, openblas_get_config());
    printf("HDF5:     built with %d.%d.%d; running %u.%u.%u\n", H5_VERS_MAJOR, H5_VERS_MINOR, H5_VERS_RELEASE, major,
           minor, release);
    /* whether train.precision = bf16 can run here (docs/scale.md §7); tests
     * read this line to skip bf16 runs on a CPU that has no bf16 at all */
    const char *why = gemm_unavailable_reason(GEMM_ONEDNN_BF16);
    if (why) printf("bf16:     unavailable: %s\n", why);
    else if (strcmp(gemm_bf16_how(), "native") == 0) printf("bf16:     native\n");
    else printf("bf16:     %s (MOMFMM_FORCE_BF16=1, slow)\n", gemm_bf16_how());
    /* whether train.gemm = avx512 can run here (docs/design.md §8.10) */
    why = gemm_unavailable_reason(GEMM_AVX512_F32);
    if (why) printf("avx512:   unavailable: %s\n", why);
    else printf("avx512:   momfmm's own fp32 kernel (train.gemm = avx512, and auto)\n");
    log_flush(); /* a failure is noted for the check at exit (cmd_finish_output) */
}
