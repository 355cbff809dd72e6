/* The context group of the parallel runtime (docs/design.md §8.12): with
 * dist.context = C every sequence is cut across C ranks, and the layers
 * above exchange halos, far-field states, momentum carries and ring blocks
 * with the other ranks of their group through these calls. They see float
 * buffers only; every exchange is a watched operation (arrivals.h) named
 * after what it carries, so that a rank that stops answering mid-exchange
 * is named by dist.timeout. With C = 1 (the default) each call is a no-op
 * (a copy where it returns something), so that the layers above need no
 * second code path. */
#ifndef MOMFMM_CONTEXT_H
#define MOMFMM_CONTEXT_H
#include <stdbool.h>
#include <stddef.h>

#include "base/status.h"

/* How the far field's state prefix crosses the group (dist.context_scan):
 * LASP-2's all-gather and a local prefix sum, MPI's exclusive scan, or
 * LASP's ring of sends (C - 1 steps one after the other). */
typedef enum { CONTEXT_SCAN_ALLGATHER = 0, CONTEXT_SCAN_EXSCAN = 1, CONTEXT_SCAN_RING = 2 } context_scan_method;

/* Groups of `size` consecutive ranks (rank r is context rank r mod size of
 * data group r div size); EXIT_USAGE when size does not divide the ranks.
 * After dist_init, before any exchange; the size 1 needs no MPI. */
int context_init(int size, context_scan_method scan, status *st);
void context_free(void);
/* This rank's place in the grid: context rank and size, data group and count. */
int context_rank(void);
int context_size(void);
int context_data_rank(void);
int context_data_size(void);

/* ---- the cut of a sequence (pure arithmetic, no MPI) */

/* Positions of one sequence of T held by one context rank: one range
 * (contiguous shards) or two (zigzag: chunks c and 2C - 1 - c of 2C). */
typedef struct {
    int n;            /* ranges, 1 or 2 */
    int start[2];     /* first position of each range */
    int len[2];       /* its length */
    int chunk[2];     /* its chunk index (0 .. chunks - 1) */
    int chunks;       /* chunks of the whole sequence: C, or 2C zigzag */
    int T_seq, total; /* the whole length; this rank's positions */
} context_cut;

/* Rank c of C's positions of a sequence of T; chunk k of n chunks is
 * [floor(T k / n), floor(T (k+1) / n)). */
context_cut context_cut_of(int T, int C, int c, bool zigzag);
/* The length of chunk k of a cut's sequence. */
int context_chunk_len(const context_cut *cut, int k);
/* The context rank that holds chunk k. */
int context_chunk_owner(const context_cut *cut, int k);

/* ---- exchanges within the group (each a no-op or a copy for C = 1) */

/* all [size][n] = every rank's mine [n], in context-rank order. */
void context_allgather(const float *mine, float *all, size_t n, const char *what);
/* In-place sum over the group. */
void context_sum(float *x, size_t n, const char *what);
/* out [n] = the sum of mine over the ranks before this one (reverse: after
 * it), by dist.context_scan's method; 0 on the first (last) rank. */
void context_scan(const float *mine, float *out, size_t n, bool reverse, const char *what);
/* Sends `send` [n_send] to the next context rank (reverse: the previous)
 * and receives `recv` [n_recv] from the previous (next); the ends send or
 * receive nothing. */
void context_shift(const float *send, size_t n_send, float *recv, size_t n_recv, bool reverse, const char *what);

/* A ring step (ring attention): send [n] to the next rank, recv [n] from
 * the previous, both non-blocking; context_ring_wait ends it. Between the
 * two, context_progress lets MPI move it (Open MPI moves non-blocking
 * messages only inside MPI calls). One step at a time. */
void context_ring_start(const float *send, float *recv, size_t n, const char *what);
void context_progress(void);
void context_ring_wait(void);

/* What crossed the group since the last call: bytes this rank sent, and
 * seconds it waited for the group's exchanges; then zeroed (bench, per
 * step). */
void context_take_stats(double *bytes_sent, double *wait_s);
#endif
