/* The oneDNN engines of gemm.h: one matmul primitive per call shape, created
 * on the first call and cached (docs/scale.md §7).
 *
 * Why a cache: creating a oneDNN primitive generates JIT code (milliseconds),
 * and the training loop must not allocate per step; a model has a few dozen
 * distinct product shapes, so each gets its primitive, memory objects and
 * scratchpad once and later calls only point the memory objects at the
 * caller's arrays. The key is everything a primitive is compiled for:
 * transposes, M, N, K, the leading dimensions the primitive sees, alpha
 * (output scale) and beta (sum post-op).
 *
 * bf16: oneDNN's matmul takes bf16 A and B and writes fp32 C. Operands come
 * in fp32 (activations) and are converted here into dense bf16 buffers grown
 * to the largest operand seen, or come with a bf16 copy (weights, converted
 * once per optimizer step by the model). Dense buffers matter beyond
 * conversion: oneDNN 2.6 runs its brgemm kernel (brg:avx512_core_bf16) only
 * for operands without padding between rows and falls back to gemm:jit
 * otherwise. */
#include "gemm_onednn.h"

#include "base/cpu.h"
#include "base/status.h"
#include "base/sys.h"

#include <oneapi/dnnl/dnnl.h>
#include <oneapi/dnnl/dnnl_debug.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if DNNL_CPU_RUNTIME == DNNL_RUNTIME_OMP
#include <omp.h>
#endif

typedef struct {
    int trans_a, trans_b, M, N, K, lda, ldb, ldc;
    float alpha, beta;
} primitive_key;

typedef struct {
    primitive_key key;
    dnnl_primitive_t primitive;
    dnnl_memory_t src, weights, dst, scratchpad; /* handles set per call */
} cached_primitive;

typedef struct {
    uint16_t *data;
    size_t capacity; /* elements */
} bf16_buffer;

struct gemm_onednn {
    bool bf16;
    int threads;
    dnnl_engine_t engine;
    dnnl_stream_t stream;
    cached_primitive *cache;
    size_t cached, cache_capacity;
    /* One scratchpad for all primitives: they run one at a time. */
    void *scratchpad;
    size_t scratchpad_bytes;
    bf16_buffer a_bf16, b_bf16;
    char impls[256]; /* distinct implementation names, comma-separated */
    char text[320];
};

/* A oneDNN call that fails here (primitive creation for a shape, execution)
 * is an internal error with no caller able to recover mid-product: it
 * panics (exit 1, every rank; docs/design.md §8.7) naming the call. */
#define DNNL_CHECK(call)                                                                                             \
    do {                                                                                                             \
        dnnl_status_t check_status_ = (call);                                                                        \
        if (check_status_ != dnnl_success) status_panic(1, "oneDNN: %s: %s", #call, dnnl_status2str(check_status_)); \
    } while (0)

/* oneDNN's OpenMP runtime reads its thread count from the calling thread's
 * OpenMP state, which OMP_NUM_THREADS set when libgomp loaded (all cores
 * when unset); OpenBLAS got blas_core_threads() instead. Setting it before every
 * creation and run (a store into the thread's OpenMP state) keeps both
 * engines at the same parallelism from whichever thread calls. */
static void use_threads(const gemm_onednn *dnn) {
#if DNNL_CPU_RUNTIME == DNNL_RUNTIME_OMP
    omp_set_num_threads(dnn->threads);
#else
    (void)dnn; /* TBB or threadpool builds: their own pools, not set here */
#endif
}

static void *aligned_bytes(size_t bytes) {
    void *p = NULL;
    if (posix_memalign(&p, 64, bytes ? bytes : 64) != 0) status_panic(1, "out of memory allocating %zu bytes", bytes);
    return p;
}

static bool listed(const char *list, const char *name) {
    size_t len = strlen(name);
    for (const char *p = list; *p;) {
        const char *end = strstr(p, ", ");
        size_t n = end ? (size_t)(end - p) : strlen(p);
        if (n == len && strncmp(p, name, len) == 0) return true;
        if (!end) break;
        p = end + 2;
    }
    return false;
}

static void note_impl(gemm_onednn *dnn, const_dnnl_primitive_desc_t pd) {
    const char *impl = NULL;
    DNNL_CHECK(dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, (void *)&impl));
    if (listed(dnn->impls, impl)) return;
    size_t used = strlen(dnn->impls);
    snprintf(dnn->impls + used, sizeof dnn->impls - used, "%s%s", used ? ", " : "", impl);
}

/* A row-major matrix of rows x cols, stored transposed when trans. */
static void matrix_desc(dnnl_memory_desc_t *md, int rows, int cols, bool trans, int ld, dnnl_data_type_t type) {
    dnnl_dims_t dims = {rows, cols};
    dnnl_dims_t strides = {trans ? 1 : ld, trans ? ld : 1};
    DNNL_CHECK(dnnl_memory_desc_init_by_strides(md, 2, dims, type, strides));
}

static dnnl_primitive_desc_t make_primitive_desc(gemm_onednn *dnn, const primitive_key *k) {
    dnnl_data_type_t in_type = dnn->bf16 ? dnnl_bf16 : dnnl_f32;
    dnnl_memory_desc_t src, weights, dst;
    matrix_desc(&src, k->M, k->K, k->trans_a, k->lda, in_type);
    matrix_desc(&weights, k->K, k->N, k->trans_b, k->ldb, in_type);
    matrix_desc(&dst, k->M, k->N, false, k->ldc, dnnl_f32);
    dnnl_matmul_desc_t desc;
    DNNL_CHECK(dnnl_matmul_desc_init(&desc, &src, &weights, NULL, &dst));

    /* C = alpha * A B + beta * C: alpha is a common output scale applied to
     * the product, beta the scale of a sum post-op that reads C first. The
     * scratchpad is ours (user mode) so that no run allocates. */
    dnnl_primitive_attr_t attr;
    DNNL_CHECK(dnnl_primitive_attr_create(&attr));
    DNNL_CHECK(dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));
    if (k->alpha != 1.0f) DNNL_CHECK(dnnl_primitive_attr_set_output_scales(attr, 1, 0, &k->alpha));
    if (k->beta != 0.0f) {
        dnnl_post_ops_t post_ops;
        DNNL_CHECK(dnnl_post_ops_create(&post_ops));
        DNNL_CHECK(dnnl_post_ops_append_sum(post_ops, k->beta));
        DNNL_CHECK(dnnl_primitive_attr_set_post_ops(attr, post_ops));
        DNNL_CHECK(dnnl_post_ops_destroy(post_ops));
    }
    dnnl_primitive_desc_t pd;
    DNNL_CHECK(dnnl_primitive_desc_create(&pd, &desc, attr, dnn->engine, NULL));
    DNNL_CHECK(dnnl_primitive_attr_destroy(attr));
    return pd;
}

static dnnl_memory_t memory_for(gemm_onednn *dnn, const_dnnl_primitive_desc_t pd, dnnl_query_t what) {
    dnnl_memory_t memory;
    DNNL_CHECK(dnnl_memory_create(&memory, dnnl_primitive_desc_query_md(pd, what, 0), dnn->engine, DNNL_MEMORY_NONE));
    return memory;
}

static cached_primitive *create_primitive(gemm_onednn *dnn, const primitive_key *key) {
    use_threads(dnn); /* the kernel's blocking depends on the thread count */
    dnnl_primitive_desc_t pd = make_primitive_desc(dnn, key);
    note_impl(dnn, pd);
    size_t scratch = dnnl_memory_desc_get_size(dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0));
    if (scratch > dnn->scratchpad_bytes) {
        free(dnn->scratchpad);
        dnn->scratchpad = aligned_bytes(scratch);
        dnn->scratchpad_bytes = scratch;
    }
    if (dnn->cached == dnn->cache_capacity) {
        dnn->cache_capacity = dnn->cache_capacity ? 2 * dnn->cache_capacity : 16;
        dnn->cache = sys_realloc(dnn->cache, dnn->cache_capacity * sizeof *dnn->cache);
    }
    cached_primitive *entry = &dnn->cache[dnn->cached++];
    *entry = (cached_primitive){.key = *key};
    DNNL_CHECK(dnnl_primitive_create(&entry->primitive, pd));
    entry->src = memory_for(dnn, pd, dnnl_query_src_md);
    entry->weights = memory_for(dnn, pd, dnnl_query_weights_md);
    entry->dst = memory_for(dnn, pd, dnnl_query_dst_md);
    entry->scratchpad = scratch ? memory_for(dnn, pd, dnnl_query_scratchpad_md) : NULL;
    DNNL_CHECK(dnnl_primitive_desc_destroy(pd));
    return entry;
}

static bool same_key(const primitive_key *a, const primitive_key *b) {
    return a->trans_a == b->trans_a && a->trans_b == b->trans_b && a->M == b->M && a->N == b->N && a->K == b->K &&
           a->lda == b->lda && a->ldb == b->ldb && a->ldc == b->ldc && a->alpha == b->alpha && a->beta == b->beta;
}

static cached_primitive *find_primitive(gemm_onednn *dnn, const primitive_key *key) {
    for (size_t i = 0; i < dnn->cached; i++)
        if (same_key(&dnn->cache[i].key, key)) return &dnn->cache[i];
    return create_primitive(dnn, key);
}

gemm_onednn *gemm_onednn_create(bool bf16, int threads) {
    gemm_onednn *dnn = sys_calloc(1, sizeof *dnn);
    dnn->bf16 = bf16;
    dnn->threads = threads;
    /* an AVX2 core played (cpu.h): oneDNN's JIT kept to AVX2 as well; only
     * its first call counts, before any primitive. Should it not take, the
     * start-up line's implementation (`brg:avx512_core` rather than
     * `gemm:jit`) shows it, so its status is not checked. */
    if (cpu_avx512f_played_away()) dnnl_set_max_cpu_isa(dnnl_cpu_isa_avx2);
    DNNL_CHECK(dnnl_engine_create(&dnn->engine, dnnl_cpu, 0));
    DNNL_CHECK(dnnl_stream_create(&dnn->stream, dnn->engine, dnnl_stream_default_flags));
    /* Name the implementation of a typical product for the start-up line
     * before any call has happened (its descriptor only: no JIT, no count). */
    use_threads(dnn);
    primitive_key probe = {.M = 256, .N = 256, .K = 256, .lda = 256, .ldb = 256, .ldc = 256, .alpha = 1.0f};
    dnnl_primitive_desc_t pd = make_primitive_desc(dnn, &probe);
    note_impl(dnn, pd);
    DNNL_CHECK(dnnl_primitive_desc_destroy(pd));
    return dnn;
}

void gemm_onednn_destroy(gemm_onednn *dnn) {
    if (!dnn) return;
    for (size_t i = 0; i < dnn->cached; i++) {
        cached_primitive *e = &dnn->cache[i];
        dnnl_primitive_destroy(e->primitive);
        dnnl_memory_destroy(e->src);
        dnnl_memory_destroy(e->weights);
        dnnl_memory_destroy(e->dst);
        if (e->scratchpad) dnnl_memory_destroy(e->scratchpad);
    }
    free(dnn->cache);
    free(dnn->scratchpad);
    free(dnn->a_bf16.data);
    free(dnn->b_bf16.data);
    dnnl_stream_destroy(dnn->stream);
    dnnl_engine_destroy(dnn->engine);
    free(dnn);
}

size_t gemm_onednn_primitives(const gemm_onednn *dnn) { return dnn->cached; }

const char *gemm_onednn_describe(gemm_onednn *dnn) {
    const dnnl_version_t *v = dnnl_version();
    snprintf(dnn->text, sizeof dnn->text, "oneDNN %d.%d.%d: %s", v->major, v->minor, v->patch, dnn->impls);
    return dnn->text;
}

#define BF16_BUFFER_MIN ((size_t)1 << 20) /* bf16 elements: 2 MiB */

/* The bf16 form of an operand stored as rows x cols with leading dimension
 * ld: its own bf16 copy when it has one, else a dense conversion into buf.
 * *used_ld is the leading dimension of what is returned. */
static const uint16_t *bf16_operand(bf16_buffer *buf, const float *f32, const uint16_t *copy, int rows, int cols,
                                    int ld, int *used_ld) {
    if (copy) {
        *used_ld = ld;
        return copy;
    }
    size_t need = (size_t)rows * (size_t)cols;
    if (need > buf->capacity) { /* only when a larger operand first appears */
        free(buf->data);
        /* on huge pages (at least one, so 2 MiB-aligned), as the
         * activations it is converted from: the product reads it across
         * rows, and on 4 KiB pages its TLB misses slowed the product */
        buf->capacity = need > BF16_BUFFER_MIN ? need : BF16_BUFFER_MIN;
        buf->data = sys_calloc_huge(buf->capacity, sizeof *buf->data);
    }
    for (int r = 0; r < rows; r++) cpu_f32_to_bf16(buf->data + (size_t)r * cols, f32 + (size_t)r * ld, (size_t)cols);
    *used_ld = cols;
    return buf->data;
}

void gemm_onednn_run(gemm_onednn *dnn, bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float *A,
                     const uint16_t *A16, int lda, const float *B, const uint16_t *B16, int ldb, float beta, float *C,
                     int ldc) {
    const void *a = A, *b = B;
    if (dnn->bf16) {
        a = bf16_operand(&dnn->a_bf16, A, A16, trans_a ? K : M, trans_a ? M : K, lda, &lda);
        b = bf16_operand(&dnn->b_bf16, B, B16, trans_b ? N : K, trans_b ? K : N, ldb, &ldb);
    }
    primitive_key key = {trans_a, trans_b, M, N, K, lda, ldb, ldc, alpha, beta};
    cached_primitive *p = find_primitive(dnn, &key);
    DNNL_CHECK(dnnl_memory_set_data_handle(p->src, (void *)a));
    DNNL_CHECK(dnnl_memory_set_data_handle(p->weights, (void *)b));
    DNNL_CHECK(dnnl_memory_set_data_handle(p->dst, C));
    dnnl_exec_arg_t args[4] = {
        {DNNL_ARG_SRC, p->src}, {DNNL_ARG_WEIGHTS, p->weights}, {DNNL_ARG_DST, p->dst}, {DNNL_ARG_SCRATCHPAD, NULL}};
    int nargs = 3;
    if (p->scratchpad) {
        DNNL_CHECK(dnnl_memory_set_data_handle(p->scratchpad, dnn->scratchpad));
        args[nargs++].memory = p->scratchpad;
    }
    use_threads(dnn);
    DNNL_CHECK(dnnl_primitive_execute(p->primitive, dnn->stream, nargs, args));
    DNNL_CHECK(dnnl_stream_wait(dnn->stream));
}
