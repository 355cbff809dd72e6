/* The geometry of a shard (docs/design.md §8.12): its halo, the largest
 * shard of the group, its ranges, what it keeps and its scratch; the sizes
 * attention.h reports for a shard. Below the three files that run attention
 * on a shard (attention_shard.c, shard_fmm.c, shard_ring.c), which all read
 * it. */
#include <omp.h>

#include "attention/fmm.h"
#include "kernels/tiled_softmax.h"
#include "parallel/context.h"

#include "attention_shard.h"
#include "shard_internal.h"

/* The band's halo: the k - 1 keys before a shard (and after it, non-causal). */
int shard_halo_rows(const attention_layer_sizes *z) {
    if (z->cfg->attention != ATTENTION_FMM) return 0;
    int T = z->cut->T_seq, half = z->fmm->bandwidth < T ? z->fmm->bandwidth : T;
    return half > 1 ? half - 1 : 0;
}

int shard_halo_left(const attention_layer_sizes *z) {
    int h = shard_halo_rows(z), start = z->cut->start[0];
    return h < start ? h : start;
}

int shard_halo_right(const attention_layer_sizes *z) {
    if (z->cfg->causal) return 0;
    int h = shard_halo_rows(z), after = z->cut->T_seq - z->cut->start[0] - z->cut->len[0];
    return h < after ? h : after;
}

/* The most rows any context rank holds (ring blocks are sent at this size). */
int shard_most_rows(const context_cut *cut) {
    int most = 0, C = cut->n == 2 ? cut->chunks / 2 : cut->chunks;
    for (int c = 0; c < C; c++) {
        context_cut other = context_cut_of(cut->T_seq, C, c, cut->n == 2);
        most = other.total > most ? other.total : most;
    }
    return most;
}

attention_layer_sizes shard_sizes(const attention_layer *a, int T) {
    return (attention_layer_sizes){a->cfg, a->fmm, a->cut, T};
}

/* What a shard keeps beyond the kernel's own: far_in, then the halo rows. */
size_t shard_state_floats(const attention_layer_sizes *z) {
    if (z->cfg->attention != ATTENTION_FMM) return 0;
    int dh = config_head_dim(z->cfg);
    return fmm_far_state_floats(z->fmm, dh) + 2 * (size_t)(shard_halo_left(z) + shard_halo_right(z)) * dh;
}

/* FMM's saved floats and the shard's state; ring attention's log-sum-exp. */
size_t attention_shard_saved_per_head(const attention_layer_sizes *z) {
    if (z->cfg->attention == ATTENTION_FMM)
        return fmm_head_saved_floats(z->fmm, z->T, config_head_dim(z->cfg)) + shard_state_floats(z);
    return (size_t)z->T;
}

/* The kernel's scratch; FMM's keys, values and their gradients with the
 * halos, or a ring block's output and log-sum-exp; five [T, dh] temporaries. */
size_t attention_shard_scratch_per_head(const attention_layer_sizes *z) {
    int dh = config_head_dim(z->cfg), T = z->T, Tk = shard_halo_left(z) + T + shard_halo_right(z);
    if (z->cfg->attention == ATTENTION_FMM)
        return fmm_head_scratch_floats(z->fmm, T, dh) + 4 * (size_t)Tk * dh + 5 * (size_t)T * dh;
    return tiled_softmax_scratch_floats(T, dh) + (size_t)T * (dh + 1) + 5 * (size_t)T * dh;
}

/* Rows of range r within a head's [T, dh] (ranges are stored in order). */
int shard_range_row(const context_cut *cut, int r) { return r == 0 ? 0 : cut->len[0]; }

float *shard_thread_scratch(const attention_layer *a, const attention_saved *s, int T) {
    attention_layer_sizes z = shard_sizes(a, T);
    return s->scratch + (size_t)omp_get_thread_num() * attention_shard_scratch_per_head(&z);
}

/* The last 5 [T, dh] of a head's scratch (attention_scratch_per_head). */
float *shard_tail_scratch(const attention_layer *a, float *scratch, int T) {
    attention_layer_sizes z = shard_sizes(a, T);
    return scratch + attention_shard_scratch_per_head(&z) - 5 * (size_t)T * a->dh;
}
