/* The parallel runtime over MPI (docs/design.md §8.3): start-up and the
 * collectives. Only the files of src/parallel/ call MPI; this one owns the
 * communicators, the thread level and the int-count limit of every MPI call
 * (dist_internal.h shares them with arrivals.c, the watched-wait protocol,
 * and reducer.c, the gradient reducer). It sees buffers and spans, not the
 * model. The loss is scaled by 1 / (global count of targets) before
 * backward, so the gradient all-reduce is a plain sum. */
#include "parallel/dist.h"

#include <hdf5.h>

#include <limits.h>
#include <mpi.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/blas_core.h"
#include "base/log.h"
#include "base/sys.h"
#include "parallel/dist_hdf5.h"
#include "parallel/watchdog.h"

#include "dist_internal.h"

/* Created once in dist_init, freed in dist_finalize. A private duplicate of
 * the world keeps our collectives apart from any other library's traffic; the
 * node communicator (ranks sharing memory) serves dist_node_ranks. */
static MPI_Comm world = MPI_COMM_NULL;
static MPI_Comm node = MPI_COMM_NULL;
/* The world's rank and size, kept from dist_init so that dist_rank and
 * dist_size make no MPI call (a second thread may ask: MPI_THREAD_FUNNELED
 * allows MPI calls from the main thread only). */
static int world_rank = 0, world_size = 1, node_size = 1;
/* Gathered once in dist_init: every rank's host name
 * ([size][MPI_MAX_PROCESSOR_NAME]), for the watchdog's messages and
 * dist_host_names, and the table dist_first_differing_rank gathers into. */
static char *hosts;
static uint64_t *checksums;

MPI_Comm dist_world(void) { return world; }

/* MPI counts are int, so a size_t count goes out in pieces of at most this
 * many bytes (docs/design.md §8.3). 1 GiB also stays clear of transports that
 * mishandle single messages above 2 GiB; tests lower it to exercise the split. */
static size_t max_message_bytes = (size_t)1 << 30;

void dist_set_max_message_bytes(size_t bytes) {
    max_message_bytes = bytes > 0 && bytes < ((size_t)1 << 30) ? bytes : (size_t)1 << 30;
}

size_t dist_max_count(size_t element_size) {
    size_t n = max_message_bytes / element_size;
    if (n > INT_MAX) n = INT_MAX;
    return n > 0 ? n : 1;
}

static int piece(size_t remaining, size_t element_size) {
    size_t limit = dist_max_count(element_size);
    return (int)(remaining < limit ? remaining : limit);
}

/* The panic hook (status.h): a failure on one rank that no caller can
 * handle ends the whole job, so that no rank waits for it in a collective. */
static void abort_job(int exit_code) {
    if (dist_size() > 1) dist_abort(exit_code);
}

static void gather_hosts(void) {
    char host[MPI_MAX_PROCESSOR_NAME] = {0};
    int host_len = 0;
    MPI_Get_processor_name(host, &host_len);
    hosts = sys_calloc((size_t)world_size, MPI_MAX_PROCESSOR_NAME);
    checksums = sys_calloc((size_t)world_size, sizeof(uint64_t));
    MPI_Allgather(host, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, hosts, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, world);
}

/* MPI_THREAD_FUNNELED: OpenBLAS and oneDNN run their own worker threads, so
 * MPI_THREAD_SINGLE would promise MPI a single-threaded process that we are
 * not; every MPI call, including the progress calls between backward
 * kernels, comes from the main thread, so nothing above FUNNELED is needed.
 * An MPI that provides less is refused rather than trusted (exit 1,
 * docs/design.md §8.7). */
int dist_init(int *argc, char ***argv, status *st) {
    /* Rabenseifner's all-reduce for the gradient buckets, not libnbc's
     * binomial tree of whole buckets; mpirun's --mca choice stays
     * (docs/design.md §8.3). */
    setenv("OMPI_MCA_coll_libnbc_iallreduce_algorithm", "3", 0);
    int provided = MPI_THREAD_SINGLE;
    MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
    MPI_Comm_dup(MPI_COMM_WORLD, &world);
    MPI_Comm_set_errhandler(world, MPI_ERRORS_ARE_FATAL);
    MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
    MPI_Comm_rank(world, &world_rank);
    MPI_Comm_size(world, &world_size);
    MPI_Comm_size(node, &node_size);
    gather_hosts();
    dist_arrivals_create(world, world_rank, world_size, hosts);
    log_set_rank(dist_rank());
    status_at_panic(abort_job);
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

/* libnbc's all-reduce algorithm as MPI_T reads it back, for the start-up
 * line (0, its default for an in-place call, is the binomial tree). */
const char *dist_allreduce_algorithm(void) {
    static const char *const NAMES[] = {"binomial", "ring", "binomial", "rabenseifner", "recursive doubling"};
    int provided, index, count, value = -1;
    MPI_T_cvar_handle handle;
    if (MPI_T_init_thread(MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) return "unknown";
    if (MPI_T_cvar_get_index("coll_libnbc_iallreduce_algorithm", &index) == MPI_SUCCESS &&
        MPI_T_cvar_handle_alloc(index, NULL, &handle, &count) == MPI_SUCCESS) {
        if (count != 1 || MPI_T_cvar_read(handle, &value) != MPI_SUCCESS) value = -1;
        MPI_T_cvar_handle_free(&handle);
    }
    MPI_T_finalize();
    return value >= 0 && value < (int)(sizeof NAMES / sizeof NAMES[0]) ? NAMES[value] : "unknown";
}

/* The variables by which a launcher tells its processes that they belong to
 * an MPI job: Open MPI's mpirun (OMPI_COMM_WORLD_SIZE), PMIx (srun
 * --mpi=pmix, PRRTE, Open MPI 5: PMIX_RANK), PMI-1/2 (MPICH's Hydra, srun
 * --mpi=pmi2: PMI_RANK, PMI_SIZE, PMI_FD). */
bool dist_launched(void) {
    static const char *const VARS[] = {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE", "PMI_FD"};
    for (size_t i = 0; i < sizeof VARS / sizeof VARS[0]; i++)
        if (getenv(VARS[i])) return true;
    return false;
}

/* Test hook: MOMFMM_TEST_STOP="RANK:N:OPERATION" (dist_internal.h), so that
 * a test loses a rank in the middle of a chosen exchange rather than
 * wherever a signal from outside happens to land. */
void dist_test_stop(const char *operation) {
    static int rank = -2, count;
    static long after;
    static char name[64];
    if (rank == -2) {
        const char *v = getenv("MOMFMM_TEST_STOP");
        rank = -1;
        if (v && sscanf(v, "%d:%ld:%63[^\n]", &rank, &after, name) != 3) rank = -1;
    }
    if (rank == world_rank && strcmp(operation, name) == 0 && ++count == after) raise(SIGSTOP);
}

/* The shutdown exchange first (arrivals.c: no peer sends this rank anything
 * after it), then MPI_Finalize, still watched as a whole: a rank never
 * hangs at the end of a run (docs/design.md §8.11). The host table lives
 * until the watchdog, which names hosts from it, has stopped. */
void dist_finalize(void) {
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (!initialized || finalized) return;
    if (world_size > 1) dist_test_stop("shutdown");
    dist_arrivals_shutdown();
    watchdog_phase("MPI_Finalize", true);
    dist_arrivals_free();
    free(checksums);
    checksums = NULL;
    if (node != MPI_COMM_NULL) MPI_Comm_free(&node);
    if (world != MPI_COMM_NULL) MPI_Comm_free(&world);
    MPI_Finalize();
    watchdog_free();
    free(hosts);
    hosts = NULL;
    world_rank = 0, world_size = node_size = 1;
}

_Noreturn void dist_abort(int exit_code) {
    if (world != MPI_COMM_NULL) MPI_Abort(world, exit_code);
    exit(exit_code);
}

int dist_rank(void) { return world_rank; }
int dist_size(void) { return world_size; }

/* From the table gathered in dist_init: no MPI call. */
void dist_host_names(char *out, size_t len) {
    char host[MPI_MAX_PROCESSOR_NAME] = {0};
    if (!hosts) gethostname(host, sizeof host - 1); /* a world of one without MPI */
    if (len) out[0] = '\0';
    size_t used = 0;
    for (int r = 0; r < dist_size() && used < len; r++) {
        const char *h = hosts ? hosts + (size_t)r * MPI_MAX_PROCESSOR_NAME : host;
        bool seen = false;
        for (int q = 0; q < r && !seen; q++) seen = strcmp(h, hosts + (size_t)q * MPI_MAX_PROCESSOR_NAME) == 0;
        if (!seen) used += (size_t)snprintf(out + used, len - used, " %s", h);
    }
}

int dist_check_launch(status *st) {
    const char *tasks = getenv("SLURM_STEP_NUM_TASKS");
    if (tasks && atoi(tasks) > 1 && dist_size() == 1 && getenv("SLURM_PROCID"))
        return status_fail(st, EXIT_USAGE,
                           "srun started %s tasks but MPI sees a world of 1: launch with 'srun --mpi=pmix ...' "
                           "or 'mpirun' inside the allocation",
                           tasks);
    return 0;
}

void dist_sum_doubles(double *x, size_t n) {
    if (dist_size() == 1) return;
    for (size_t done = 0; done < n;) {
        int count = piece(n - done, sizeof(double));
        MPI_Request request;
        MPI_Iallreduce(MPI_IN_PLACE, x + done, count, MPI_DOUBLE, MPI_SUM, world, &request);
        dist_watch_wait("sum all-reduce", &request);
        done += (size_t)count;
    }
}

int dist_agree_status(int rc, status *st) {
    if (rc != 0) st->code = rc;
    int ranks = dist_size();
    if (ranks == 1) return rc;
    /* the lowest failing rank, or `ranks` when none failed: a max of negated ranks */
    int first = (int)-dist_max_double(rc != 0 ? -(double)dist_rank() : -(double)ranks);
    if (first == ranks) return 0;
    dist_broadcast_bytes_from(first, st, sizeof *st);
    return st->code;
}

double dist_max_double(double x) {
    double out = x;
    if (dist_size() == 1) return out;
    MPI_Request request;
    MPI_Iallreduce(&x, &out, 1, MPI_DOUBLE, MPI_MAX, world, &request);
    dist_watch_wait("max all-reduce", &request);
    return out;
}

bool dist_any(bool mine) {
    int in = mine ? 1 : 0, out = in;
    if (dist_size() == 1) return out != 0;
    MPI_Request request;
    MPI_Iallreduce(&in, &out, 1, MPI_INT, MPI_MAX, world, &request);
    dist_watch_wait("agreement all-reduce", &request);
    return out != 0;
}

void dist_barrier(void) {
    if (dist_size() == 1) return;
    MPI_Request request;
    MPI_Ibarrier(world, &request);
    dist_watch_wait("barrier", &request);
}

int dist_node_ranks(void) { return node_size; }

int dist_node_cpus(void) {
    unsigned char bits[128]; /* 1,024 CPUs, glibc's cpu_set_t */
    blas_core_cpu_mask(bits, sizeof bits);
    if (node_size > 1) {
        MPI_Request request;
        MPI_Iallreduce(MPI_IN_PLACE, bits, (int)sizeof bits, MPI_UNSIGNED_CHAR, MPI_BOR, node, &request);
        dist_watch_wait("node CPU mask all-reduce", &request);
    }
    int cpus = 0;
    for (size_t i = 0; i < sizeof bits; i++) cpus += __builtin_popcount(bits[i]);
    return cpus;
}

void dist_broadcast_bytes(void *x, size_t n) { dist_broadcast_bytes_from(0, x, n); }

void dist_share_partitions(float *x, size_t n) {
    for (int r = 0; r < dist_size(); r++) {
        size_t first, count;
        dist_partition(n, r, dist_size(), &first, &count);
        dist_broadcast_bytes_from(r, x + first, count * sizeof(float));
    }
}

static uint64_t checksum(const void *bytes, size_t n) {
    /* FNV-1a over the bit patterns: any difference in any byte shows. */
    uint64_t h = 1469598103934665603ULL;
    const unsigned char *p = bytes;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ULL;
    return h;
}

/* Every rank gathers every checksum, so every rank returns the same status. */
int dist_check_consistency(const void *bytes, size_t n, long long step, status *st) {
    int r = dist_first_differing_rank(checksum(bytes, n));
    if (r < 0) return 0;
    const uint64_t *all = checksums;
    return status_fail(st, 1, "step %lld: parameters of rank %d differ from rank 0 (checksum %016llx vs %016llx)", step,
                       r, (unsigned long long)all[r], (unsigned long long)all[0]);
}

uint64_t dist_checksum(const void *bytes, size_t n) { return checksum(bytes, n); }

/* Into the table made at start-up: no allocation per call. */
int dist_first_differing_rank(uint64_t mine) {
    if (dist_size() == 1) return -1;
    MPI_Request request;
    MPI_Iallgather(&mine, 1, MPI_UINT64_T, checksums, 1, MPI_UINT64_T, world, &request);
    dist_watch_wait("checksum all-gather", &request);
    for (int r = 1; r < dist_size(); r++)
        if (checksums[r] != checksums[0]) return r;
    return -1;
}

void dist_broadcast_bytes_from(int root, void *x, size_t n) {
    if (dist_size() == 1) return;
    char *p = x;
    for (size_t done = 0; done < n;) {
        int count = piece(n - done, 1);
        MPI_Request request;
        MPI_Ibcast(p + done, count, MPI_BYTE, root, world, &request);
        dist_watch_wait("broadcast", &request);
        done += (size_t)count;
    }
}

void dist_partition(size_t n, int rank, int ranks, size_t *first, size_t *count) {
    size_t lo = n * (size_t)rank / (size_t)ranks, hi = n * (size_t)(rank + 1) / (size_t)ranks;
    *first = lo;
    *count = hi - lo;
}

int dist_hdf5_mpio(hid_t fapl) { return H5Pset_fapl_mpio(fapl, world, MPI_INFO_NULL) < 0 ? -1 : 0; }
