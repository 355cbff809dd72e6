/* The network between the ranks it runs on, measured for the alpha-beta
 * cost model of tools/scaling_model.py (docs/design.md §8.11): ping-pong
 * between rank 0 and every other rank at sizes from 8 B up, the median
 * one-way time of each size; alpha (latency) and beta (bandwidth) fitted
 * to t(m) = alpha + m / beta by least squares (fit: beta from the large
 * sizes, alpha from the small ones); then MPI_Allreduce of floats (a sum in place, as momfmm's
 * gradient buckets) at the same sizes, its median beside the ring model
 * 2 (p - 1) alpha + 2 (p - 1) / p * m / beta with the fitted alpha, beta.
 *
 *   mpirun -np P build/net_probe [--max-bytes B] [--seconds S]
 *
 * A standalone measuring program like tools/bench_gemm.c, outside momfmm's
 * layers (docs/design.md §8.1: there dist.c alone speaks MPI). Prints, on
 * rank 0, one line per size and the fit:
 *
 *   fit alpha_us=24.1 beta_gbps=0.94 pairs=1 sizes=11 (...)
 */
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tool_args.h"

enum { MAX_SIZES = 40, MAX_REPS = 200 };

static int compare(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, compare);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Repetitions of one size: enough to fill about `seconds` at an assumed
 * 1 Gb/s, at least 5, at most MAX_REPS. */
static int reps_for(size_t bytes, double seconds) {
    double each = 50e-6 + (double)bytes / 125e6;
    int n = (int)(seconds / each);
    return n < 5 ? 5 : n > MAX_REPS ? MAX_REPS : n;
}

/* Median one-way time of `bytes` between rank 0 and `peer` (a round trip
 * halved); every rank takes part in the barriers, the median is rank 0's. */
static double ping_pong(char *buf, size_t bytes, int peer, int reps) {
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    double t[MAX_REPS];
    MPI_Barrier(MPI_COMM_WORLD);
    for (int i = 0; i < reps; i++) {
        double start = MPI_Wtime();
        if (rank == 0) {
            MPI_Send(buf, (int)bytes, MPI_BYTE, peer, 0, MPI_COMM_WORLD);
            MPI_Recv(buf, (int)bytes, MPI_BYTE, peer, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else if (rank == peer) {
            MPI_Recv(buf, (int)bytes, MPI_BYTE, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(buf, (int)bytes, MPI_BYTE, 0, 0, MPI_COMM_WORLD);
        }
        t[i] = (MPI_Wtime() - start) / 2;
    }
    return median(t, reps);
}

/* Median time of an in-place float sum of `bytes`, the slowest rank's. */
static double allreduce(float *buf, size_t bytes, int reps) {
    double t[MAX_REPS];
    for (int i = 0; i < reps; i++) {
        MPI_Barrier(MPI_COMM_WORLD);
        double start = MPI_Wtime();
        MPI_Allreduce(MPI_IN_PLACE, buf, (int)(bytes / sizeof(float)), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        double mine = MPI_Wtime() - start;
        MPI_Allreduce(&mine, &t[i], 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    }
    return median(t, reps);
}

/* Least squares of t = alpha + m / beta in two parts, since a shaped link
 * is not one line: a token bucket passes messages below its burst at the
 * wire's speed. 1 / beta is the least-squares slope over the large sizes
 * (m >= large), alpha the least-squares constant of t - m / beta over the
 * small ones (m <= 4 KiB). */
static void fit(const double *m, const double *t, int n, double large, double *alpha, double *beta) {
    double sm = 0, st = 0, smm = 0, smt = 0, k = 0, rest = 0, j = 0;
    for (int i = 0; i < n; i++)
        if (m[i] >= large) sm += m[i], st += t[i], smm += m[i] * m[i], smt += m[i] * t[i], k++;
    double g = k > 1 && k * smm - sm * sm > 0 ? (k * smt - sm * st) / (k * smm - sm * sm) : 0;
    *beta = g > 0 ? 1 / g : INFINITY;
    for (int i = 0; i < n; i++)
        if (m[i] <= 4096) rest += t[i] - m[i] * g, j++;
    *alpha = j > 0 ? rest / j : 0;
}

static int usage(void) {
    fprintf(stderr,
            "usage: net_probe [--max-bytes B (8 .. 1 GiB, default 16 MiB)] [--seconds S per size, 0.05 .. 60]\n");
    return 2;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, size;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    double max_bytes = 16 << 20, seconds = 0.5;
    bool ok = true; /* the first argument it cannot read ends the loop: a later good one does not undo it */
    for (int i = 1; ok && i < argc; i++) {
        if (!strcmp(argv[i], "--max-bytes") && i + 1 < argc) ok = tool_double(argv[++i], 8, 1 << 30, &max_bytes);
        else if (!strcmp(argv[i], "--seconds") && i + 1 < argc) ok = tool_double(argv[++i], 0.05, 60, &seconds);
        else ok = false;
    }
    if (!ok) {
        if (rank == 0) usage();
        MPI_Finalize();
        return 2;
    }
    if (size < 2) {
        if (rank == 0) fprintf(stderr, "net_probe: needs at least 2 ranks (mpirun -np 2 or more)\n");
        MPI_Finalize();
        return 2;
    }
    char *buf = calloc((size_t)max_bytes, 1);
    double m[MAX_SIZES];
    int n = 0, pairs = size - 1 < 32 ? size - 1 : 32;
    for (double b = 8; b <= max_bytes && n < MAX_SIZES; b *= 4, n++) m[n] = b;
    double fm[MAX_SIZES * 32], ft[MAX_SIZES * 32];
    int nf = 0;
    for (int i = 0; i < n; i++)
        for (int peer = 1; peer <= pairs; peer++) {
            double one_way = ping_pong(buf, (size_t)m[i], peer, reps_for((size_t)m[i], seconds));
            fm[nf] = m[i], ft[nf++] = one_way;
            if (rank == 0)
                printf("pingpong ranks=0,%d bytes=%.0f one_way_us=%.2f gbps=%.3f\n", peer, m[i], one_way * 1e6,
                       m[i] * 8 / one_way / 1e9);
        }
    double alpha, beta, large = m[n - 1] / 16;
    fit(fm, ft, nf, large, &alpha, &beta);
    if (rank == 0)
        printf("fit alpha_us=%.2f beta_gbps=%.3f pairs=%d sizes=%d (t = alpha + bytes / beta; 1 / beta: least-squares "
               "slope over %.0f B and up, alpha over 4096 B and less)\n",
               alpha * 1e6, beta * 8 / 1e9, pairs, n, large);
    for (int i = 0; i < n; i++) {
        if (m[i] < sizeof(float)) continue;
        double got = allreduce((float *)buf, (size_t)m[i], reps_for((size_t)m[i] * 2, seconds));
        double model = 2.0 * (size - 1) * alpha + 2.0 * (size - 1) / size * m[i] / beta;
        if (rank == 0)
            printf("allreduce ranks=%d bytes=%.0f ms=%.3f ring_model_ms=%.3f\n", size, m[i], got * 1e3, model * 1e3);
    }
    free(buf);
    MPI_Finalize();
    return 0;
}
