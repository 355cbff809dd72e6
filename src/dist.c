/* MPI data parallelism (docs/design.md §8.3). This is the only file that calls
 * MPI: it owns the communicators, the thread level and the int-count limit of
 * every MPI call. The loss is scaled by 1 / (global count of targets) before
 * backward, so the gradient all-reduce is a plain sum. */
#include "momfmm/dist.h"

#include <hdf5.h>

#include <cblas.h>
#include <limits.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "momfmm/blas_core.h"
#include "momfmm/build_info.h"
#include "momfmm/common.h"
#include "momfmm/dist_hdf5.h"
#include "momfmm/float_env.h"

/* Created once in dist_try_init, freed in dist_finalize. A private duplicate of
 * the world keeps our collectives apart from any other library's traffic; the
 * node communicator (ranks sharing memory) serves dist_node_ranks. */
static MPI_Comm world = MPI_COMM_NULL;
static MPI_Comm node = MPI_COMM_NULL;

/* MPI counts are int, so a size_t count goes out in pieces of at most this
 * many bytes (docs/design.md §8.3). 1 GiB also stays clear of transports that
 * mishandle single messages above 2 GiB; tests lower it to exercise the split. */
static size_t max_message_bytes = (size_t)1 << 30;

void dist_set_max_message_bytes(size_t bytes) {
    max_message_bytes = bytes > 0 && bytes < ((size_t)1 << 30) ? bytes : (size_t)1 << 30;
}

/* Elements of `element_size` bytes that one MPI call may carry. */
static size_t max_count(size_t element_size) {
    size_t n = max_message_bytes / element_size;
    if (n > INT_MAX) n = INT_MAX;
    return n > 0 ? n : 1;
}

static int piece(size_t remaining, size_t element_size) {
    size_t limit = max_count(element_size);
    return (int)(remaining < limit ? remaining : limit);
}

/* MPI_THREAD_FUNNELED: OpenBLAS runs its own worker threads (dist_threads),
 * so MPI_THREAD_SINGLE would promise MPI a single-threaded process that we
 * are not; every MPI call, including the progress calls between backward
 * kernels, comes from the main thread, so nothing above FUNNELED is needed.
 * An MPI that provides less is refused rather than trusted (exit 1,
 * docs/design.md §8.7). */
int dist_try_init(int *argc, char ***argv, status *st) {
    int provided = MPI_THREAD_SINGLE;
    MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
    MPI_Comm_dup(MPI_COMM_WORLD, &world);
    MPI_Comm_set_errhandler(world, MPI_ERRORS_ARE_FATAL);
    MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    openblas_set_num_threads(dist_threads());
    if (provided < MPI_THREAD_FUNNELED)
        return status_fail(st, 1,
                           "MPI provides thread level %d, below MPI_THREAD_FUNNELED (%d) that OpenBLAS threads "
                           "need: use an MPI library built with thread support",
                           provided, MPI_THREAD_FUNNELED);
    return 0;
}

void dist_build_version(char *out, size_t len) {
#ifdef OMPI_MAJOR_VERSION
    snprintf(out, len, "Open MPI %d.%d.%d, MPI %d.%d", OMPI_MAJOR_VERSION, OMPI_MINOR_VERSION, OMPI_RELEASE_VERSION,
             MPI_VERSION, MPI_SUBVERSION);
#else
    snprintf(out, len, "MPI %d.%d", MPI_VERSION, MPI_SUBVERSION);
#endif
}

void dist_library_version(char *out, size_t len) {
    char text[MPI_MAX_LIBRARY_VERSION_STRING];
    int n = 0;
    MPI_Get_library_version(text, &n);
    text[n] = '\0';
    snprintf(out, len, "%.*s", (int)strcspn(text, "\n"), text);
}

void dist_finalize(void) {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (!initialized || finalized) return;
    if (node != MPI_COMM_NULL) MPI_Comm_free(&node);
    if (world != MPI_COMM_NULL) MPI_Comm_free(&world);
    MPI_Finalize();
}

_Noreturn void dist_abort(int exit_code) {
    if (world != MPI_COMM_NULL) MPI_Abort(world, exit_code);
    exit(exit_code);
}

/* Before dist_try_init and after dist_finalize the process is a world of one. */
int process_rank(void) {
    int rank = 0;
    if (world != MPI_COMM_NULL) MPI_Comm_rank(world, &rank);
    return rank;
}

int process_count(void) {
    int size = 1;
    if (world != MPI_COMM_NULL) MPI_Comm_size(world, &size);
    return size;
}

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
    MPI_Gather(host, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, 0, world);
    if (rank != 0) return;
    printf("momfmm: %d rank%s x %d thread%s on", size, size == 1 ? "" : "s", dist_threads(),
           dist_threads() == 1 ? "" : "s");
    for (int r = 0; r < size; r++) {
        const char *h = all + (size_t)r * MPI_MAX_PROCESSOR_NAME;
        bool seen = false;
        for (int q = 0; q < r && !seen; q++) seen = strcmp(h, all + (size_t)q * MPI_MAX_PROCESSOR_NAME) == 0;
        if (!seen) printf(" %s", h);
    }
    printf(" | OpenBLAS core %s | subnormals %s | version %s (git %s)\n", blas_core_description(),
           float_env_flushing() ? "flushed to zero" : "kept (IEEE)", build_version_number(), build_revision());
    fflush(stdout);
    free(all);
}

int dist_try_check_launch(status *st) {
    const char *tasks = getenv("SLURM_STEP_NUM_TASKS");
    if (tasks && atoi(tasks) > 1 && process_count() == 1 && getenv("SLURM_PROCID"))
        return status_fail(st, EXIT_USAGE,
                           "srun started %s tasks but MPI sees a world of 1: launch with 'srun --mpi=pmix ...' "
                           "or 'mpirun' inside the allocation",
                           tasks);
    return 0;
}

void dist_sum_doubles(double *x, size_t n) {
    if (process_count() == 1) return;
    for (size_t done = 0; done < n;) {
        int count = piece(n - done, sizeof(double));
        MPI_Allreduce(MPI_IN_PLACE, x + done, count, MPI_DOUBLE, MPI_SUM, world);
        done += (size_t)count;
    }
}

double dist_max_double(double x) {
    double out = x;
    if (process_count() > 1) MPI_Allreduce(&x, &out, 1, MPI_DOUBLE, MPI_MAX, world);
    return out;
}

bool dist_any(bool mine) {
    int in = mine ? 1 : 0, out = in;
    if (process_count() > 1) MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_MAX, world);
    return out != 0;
}

void dist_barrier(void) {
    if (process_count() > 1) MPI_Barrier(world);
}

int dist_node_ranks(void) {
    int n = 1;
    if (node != MPI_COMM_NULL) MPI_Comm_size(node, &n);
    return n;
}

void dist_broadcast_bytes(void *x, size_t n) {
    if (process_count() == 1) return;
    char *p = x;
    for (size_t done = 0; done < n;) {
        int count = piece(n - done, 1);
        MPI_Bcast(p + done, count, MPI_BYTE, 0, world);
        done += (size_t)count;
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

/* Every rank gathers every checksum, so every rank returns the same status. */
int dist_try_check_consistency(const model *m, long long step, status *st) {
    int size = process_count();
    if (size == 1) return 0;
    uint64_t mine = params_checksum(m);
    uint64_t *all = xcalloc((size_t)size, sizeof(uint64_t));
    MPI_Allgather(&mine, 1, MPI_UINT64_T, all, 1, MPI_UINT64_T, world);
    int code = 0;
    for (int r = 1; r < size && code == 0; r++)
        if (all[r] != all[0])
            code = status_fail(st, 1, "step %lld: parameters of rank %d differ from rank 0 (checksum %016llx vs %016llx)",
                               step, r, (unsigned long long)all[r], (unsigned long long)all[0]);
    free(all);
    return code;
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
    /* ZeRO-1 (docs/scale.md §7): this rank's slice [first, first + count) of
     * the flat buffer; slice receives its reduced gradients; counts and
     * displs give every rank's part of each bucket ([n_buckets][ranks]) */
    bool sharded;
    size_t first, count;
    float *slice;
    int *counts, *displs;
};

/* The block after whose backward a tensor's gradient is final: its own block;
 * ln_f and the head finish before every block (n_layers - 1); the embedding
 * only at the very end (-1). */
static int tensor_ready_after(const model *m, const param_entry *e) {
    if (e->layer >= 0) return e->layer;
    return e->offset == 0 ? -1 : m->L - 1;
}

/* Buckets of about bucket_mb, cut at tensor boundaries, built from the end
 * of the buffer because backward finishes the last blocks first. A bucket
 * never exceeds one MPI call's count (max_count): a larger tensor is cut
 * inside, so each bucket is one non-blocking all-reduce (docs/design.md §8.3). */
grad_reducer *grad_reducer_create(const model *m, double bucket_mb, bool overlap) {
    grad_reducer *r = xcalloc(1, sizeof *r);
    r->grads = m->grads;
    r->overlap = overlap;
    r->active = process_count() > 1;
    size_t cap = max_count(sizeof(float));
    /* every bucket starts at a tensor's end or follows a full one */
    size_t max_buckets = (size_t)m->n_entries + m->n_params / cap + 1;
    r->buckets = xcalloc(max_buckets, sizeof(bucket));
    r->requests = xcalloc(max_buckets, sizeof(MPI_Request));
    for (size_t i = 0; i < max_buckets; i++) r->requests[i] = MPI_REQUEST_NULL;
    size_t limit = (size_t)(bucket_mb * 1024 * 1024 / sizeof(float));
    if (limit < 1) limit = 1;
    bucket *current = NULL;
    for (int i = m->n_entries - 1; i >= 0; i--) {
        const param_entry *e = &m->entries[i];
        int ready = tensor_ready_after(m, e);
        size_t end = e->offset + e->numel; /* [e->offset, end) is not in a bucket yet */
        do {
            if (!current || current->count >= limit || current->count >= cap) {
                current = &r->buckets[r->n_buckets++];
                current->start = end;
                current->ready_after = m->L;
            }
            size_t room = cap - current->count, left = end - e->offset;
            size_t taken = left < room ? left : room;
            current->start -= taken;
            current->count += taken;
            end -= taken;
            if (ready < current->ready_after) current->ready_after = ready;
        } while (end > e->offset);
    }
    return r;
}

void grad_reducer_shard(grad_reducer *r, const model *m) {
    int ranks = process_count();
    r->sharded = true;
    r->first = m->moment_first;
    r->count = m->moment_count;
    if (!r->active) return; /* one rank: the slice is the whole buffer */
    r->slice = xcalloc(r->count ? r->count : 1, sizeof(float));
    r->counts = xcalloc((size_t)r->n_buckets * ranks, sizeof(int));
    r->displs = xcalloc((size_t)r->n_buckets * ranks, sizeof(int));
    for (int i = 0; i < r->n_buckets; i++)
        for (int q = 0; q < ranks; q++) {
            size_t first, count, start = r->buckets[i].start, end = start + r->buckets[i].count;
            model_moment_range(m->n_params, q, ranks, &first, &count);
            size_t lo = first > start ? first : start, hi = first + count < end ? first + count : end;
            r->counts[i * ranks + q] = lo < hi ? (int)(hi - lo) : 0;
            r->displs[i * ranks + q] = lo < hi ? (int)(lo - start) : 0;
        }
}

float *grad_reducer_slice(grad_reducer *r) { return r->slice ? r->slice : r->grads + r->first; }

/* This rank's part [lo, hi) of bucket i; false when empty. */
static bool my_part(const grad_reducer *r, int i, size_t *lo, size_t *hi) {
    size_t start = r->buckets[i].start, end = start + r->buckets[i].count;
    *lo = r->first > start ? r->first : start;
    *hi = r->first + r->count < end ? r->first + r->count : end;
    return *lo < *hi;
}

double grad_reducer_gather(grad_reducer *r, float *params, slice_update update, void *ctx) {
    if (!r->active) {
        update(ctx, r->first, r->first + r->count);
        return 0.0;
    }
    int ranks = process_count();
    /* update a bucket's part, then start its all-gather while the next
     * part updates */
    for (int i = 0; i < r->n_buckets; i++) {
        size_t lo, hi;
        if (my_part(r, i, &lo, &hi)) update(ctx, lo, hi);
        MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, params + r->buckets[i].start, r->counts + i * ranks,
                        r->displs + i * ranks, MPI_FLOAT, world, &r->requests[i]);
        int done;
        MPI_Testall(i + 1, r->requests, &done, MPI_STATUSES_IGNORE);
    }
    double start = wall_seconds();
    MPI_Waitall(r->n_buckets, r->requests, MPI_STATUSES_IGNORE);
    return wall_seconds() - start;
}

int dist_hdf5_mpio(hid_t fapl) { return H5Pset_fapl_mpio(fapl, world, MPI_INFO_NULL) < 0 ? -1 : 0; }

void grad_reducer_free(grad_reducer *r) {
    if (!r) return;
    free(r->slice);
    free(r->counts);
    free(r->displs);
    free(r->buckets);
    free(r->requests);
    free(r);
}

static void launch(grad_reducer *r, int index) {
    bucket *b = &r->buckets[index];
    b->launched = true;
    /* Same buckets with and without overlap: identical message sizes give
     * identical reduction order, so overlap does not change the weights. */
    if (r->sharded) {
        /* each rank receives the sum of its part of the bucket (ZeRO-1):
         * the data volume of a reduce-scatter, half an all-reduce's */
        size_t lo, hi;
        float *recv = my_part(r, index, &lo, &hi) ? r->slice + (lo - r->first) : r->slice;
        MPI_Ireduce_scatter(r->grads + b->start, recv, r->counts + (size_t)index * process_count(), MPI_FLOAT,
                            MPI_SUM, world, &r->requests[index]);
    } else {
        MPI_Iallreduce(MPI_IN_PLACE, r->grads + b->start, (int)b->count, MPI_FLOAT, MPI_SUM, world,
                       &r->requests[index]);
    }
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
