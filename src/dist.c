/* MPI data parallelism. The loss is scaled by 1 / (global count of targets)
 * before backward, so the gradient all-reduce is a plain sum. */
#include "momfmm/dist.h"

#include <cblas.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "momfmm/blas_core.h"
#include "momfmm/common.h"
#include "momfmm/float_env.h"

void dist_init(int *argc, char ***argv) {
    int provided;
    MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
    openblas_set_num_threads(dist_threads());
}

void dist_finalize(void) { MPI_Finalize(); }

int dist_threads(void) {
    const char *env = getenv("OMP_NUM_THREADS");
    int n = env ? atoi(env) : 1;
    return n > 0 ? n : 1;
}

void dist_describe(void) {
    char host[MPI_MAX_PROCESSOR_NAME] = {0};
    int len = 0, size = process_count(), rank = process_rank();
    MPI_Get_processor_name(host, &len);
    char *all = rank == 0 ? xcalloc((size_t)size, MPI_MAX_PROCESSOR_NAME) : NULL;
    MPI_Gather(host, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, 0, MPI_COMM_WORLD);
    if (rank != 0) return;
    printf("momfmm: %d rank%s x %d thread%s on", size, size == 1 ? "" : "s", dist_threads(),
           dist_threads() == 1 ? "" : "s");
    for (int r = 0; r < size; r++) {
        const char *h = all + (size_t)r * MPI_MAX_PROCESSOR_NAME;
        bool seen = false;
        for (int q = 0; q < r && !seen; q++) seen = strcmp(h, all + (size_t)q * MPI_MAX_PROCESSOR_NAME) == 0;
        if (!seen) printf(" %s", h);
    }
    printf(" | OpenBLAS core %s | subnormals %s\n", blas_core_description(),
           float_env_flushing() ? "flushed to zero" : "kept (IEEE)");
    fflush(stdout);
    free(all);
}

void dist_check_launch(void) {
    const char *tasks = getenv("SLURM_STEP_NUM_TASKS");
    if (tasks && atoi(tasks) > 1 && process_count() == 1 && getenv("SLURM_PROCID"))
        fail(EXIT_USAGE,
             "srun started %s tasks but MPI sees a world of 1: launch with 'srun --mpi=pmix ...' "
             "or 'mpirun' inside the allocation",
             tasks);
}

void dist_sum_doubles(double *x, int n) {
    if (process_count() > 1) MPI_Allreduce(MPI_IN_PLACE, x, n, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
}

double dist_max_double(double x) {
    double out = x;
    if (process_count() > 1) MPI_Allreduce(&x, &out, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    return out;
}

bool dist_any(bool mine) {
    int in = mine ? 1 : 0, out = in;
    if (process_count() > 1) MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    return out != 0;
}

void dist_barrier(void) {
    if (process_count() > 1) MPI_Barrier(MPI_COMM_WORLD);
}

int dist_node_ranks(void) {
    if (process_count() == 1) return 1;
    MPI_Comm node;
    int n = 1;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    MPI_Comm_size(node, &n);
    MPI_Comm_free(&node);
    return n;
}

/* MPI counts are int: move large arrays in pieces. */
void dist_broadcast_bytes(void *x, size_t n) {
    if (process_count() == 1) return;
    char *p = x;
    for (size_t done = 0; done < n;) {
        int piece = n - done > (1u << 30) ? (1 << 30) : (int)(n - done);
        MPI_Bcast(p + done, piece, MPI_BYTE, 0, MPI_COMM_WORLD);
        done += (size_t)piece;
    }
}

void dist_broadcast_floats(float *x, size_t n) { dist_broadcast_bytes(x, n * sizeof(float)); }

static uint64_t params_checksum(const model *m) {
    /* FNV-1a over the bit patterns: any difference in any weight shows. */
    uint64_t h = 1469598103934665603ULL;
    const unsigned char *bytes = (const unsigned char *)m->params;
    for (size_t i = 0; i < m->n_params * sizeof(float); i++) h = (h ^ bytes[i]) * 1099511628211ULL;
    return h;
}

void dist_check_consistency(const model *m, long long step) {
    int size = process_count();
    if (size == 1) return;
    uint64_t mine = params_checksum(m);
    uint64_t *all = xcalloc((size_t)size, sizeof(uint64_t));
    MPI_Allgather(&mine, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, MPI_COMM_WORLD);
    for (int r = 1; r < size; r++)
        if (all[r] != all[0]) {
            /* every rank knows; rank 0 alone reports and takes the job down */
            if (process_rank() == 0)
                fail(1, "step %lld: parameters of rank %d differ from rank 0 (checksum %016llx vs %016llx)", step, r,
                     (unsigned long long)all[r], (unsigned long long)all[0]);
            MPI_Barrier(MPI_COMM_WORLD); /* never completes: rank 0 aborts the job */
        }
    free(all);
}

typedef struct {
    size_t start, count;
    int ready_after; /* launch once backward has finished block `ready_after` (-1: all) */
    bool launched;
} bucket;

struct grad_reducer {
    float *grads;
    bucket *buckets;
    MPI_Request *requests;
    int n_buckets, n_launched;
    bool overlap, active;
};

/* The block after whose backward a tensor's gradient is final: its own block;
 * ln_f and the head finish before every block (n_layers - 1); the embedding
 * only at the very end (-1). */
static int tensor_ready_after(const model *m, const param_entry *e) {
    if (e->layer >= 0) return e->layer;
    return e->offset == 0 ? -1 : m->L - 1;
}

/* Buckets of about bucket_mb, cut at tensor boundaries, built from the end
 * of the buffer because backward finishes the last blocks first. */
grad_reducer *grad_reducer_create(const model *m, double bucket_mb, bool overlap) {
    grad_reducer *r = xcalloc(1, sizeof *r);
    r->grads = m->grads;
    r->overlap = overlap;
    r->active = process_count() > 1;
    r->buckets = xcalloc((size_t)m->n_entries, sizeof(bucket));
    r->requests = xcalloc((size_t)m->n_entries, sizeof(MPI_Request));
    for (int i = 0; i < m->n_entries; i++) r->requests[i] = MPI_REQUEST_NULL;
    size_t limit = (size_t)(bucket_mb * 1024 * 1024 / sizeof(float));
    if (limit < 1) limit = 1;
    bucket *current = NULL;
    for (int i = m->n_entries - 1; i >= 0; i--) {
        const param_entry *e = &m->entries[i];
        if (!current || current->count >= limit) {
            current = &r->buckets[r->n_buckets++];
            current->start = e->offset + e->numel;
            current->ready_after = m->L;
        }
        current->start = e->offset;
        current->count += e->numel;
        int ready = tensor_ready_after(m, e);
        if (ready < current->ready_after) current->ready_after = ready;
    }
    return r;
}

void grad_reducer_free(grad_reducer *r) {
    if (!r) return;
    free(r->buckets);
    free(r->requests);
    free(r);
}

static void launch(grad_reducer *r, int index) {
    bucket *b = &r->buckets[index];
    b->launched = true;
    /* Same buckets with and without overlap: identical message sizes give
     * identical reduction order, so overlap does not change the weights. */
    MPI_Iallreduce(MPI_IN_PLACE, r->grads + b->start, (int)b->count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD,
                   &r->requests[index]);
    r->n_launched++;
}

static void grad_reducer_progress(void *reducer) {
    grad_reducer *r = reducer;
    if (!r || !r->active || r->n_launched == 0) return;
    int done;
    MPI_Testall(r->n_buckets, r->requests, &done, MPI_STATUSES_IGNORE);
}

static void grad_reducer_block_done(void *reducer, int layer) {
    grad_reducer *r = reducer;
    if (!r->active || (!r->overlap && layer >= 0)) return;
    for (int i = 0; i < r->n_buckets; i++)
        if (!r->buckets[i].launched && (layer < 0 || r->buckets[i].ready_after >= layer)) launch(r, i);
    grad_reducer_progress(r);
}

backward_hooks grad_reducer_hooks(grad_reducer *r) {
    backward_hooks hooks = {grad_reducer_block_done, grad_reducer_progress, r};
    return hooks;
}

double grad_reducer_finish(grad_reducer *r) {
    if (!r->active) return 0.0;
    grad_reducer_block_done(r, -1);
    double start = wall_seconds();
    MPI_Waitall(r->n_buckets, r->requests, MPI_STATUSES_IGNORE);
    double waited = wall_seconds() - start;
    for (int i = 0; i < r->n_buckets; i++) {
        r->buckets[i].launched = false;
        r->requests[i] = MPI_REQUEST_NULL;
    }
    r->n_launched = 0;
    return waited;
}
