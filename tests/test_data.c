/* Data of docs/tasks.md §2: the text corpus (directory walk order, separator
 * placement, split by whole documents, determinism, refused inputs), long
 * samples without stack arrays, listops limits and TSV labels refused at
 * open, fast_exp_nonpositive and its eight-lane form on NaN and infinite
 * inputs, fast_exp_coarse (bf16's) on every width (run it in the
 * sanitizer build too), and sentencepiece models read
 * whole or refused (every truncation, single-byte damage). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fast_math.h"
#include "base/sys.h"
#include "config/config.h"
#include "data/corpus.h"
#include "data/data.h"
#include "data/tokenizer.h"
#include "test_util.h"

/* A byte-level corpus of data.path, every file of a directory. */
static const corpus_options BYTES = {"data.path", CORPUS_AUTO, 256, "", ""};

static void write_file(const char *name, char fill, int size) {
    FILE *f = fopen(test_path(name), "wb");
    for (int i = 0; i < size; i++) fputc(fill, f);
    fclose(f);
}

/* A config of the defaults with "section.key=value" overrides (NULL-ended);
 * an override refused is a failed check (the test would check another config). */
static config config_with(const char *const *overrides) {
    config c;
    config_defaults(&c);
    status st;
    for (int i = 0; overrides[i]; i++)
        if (config_apply_override(&c, overrides[i], &st)) test_check(false, "override applies", "%s", st.message);
    return c;
}

/* The corpus: c/b.txt (300 'b'), c/a/z.txt (200 'z'), c/a-1.txt (100 '1'),
 * c/.hidden (skipped), c/empty (skipped). Sorted by full path: "a-1.txt" <
 * "a/z.txt" ('-' < '/') < "b.txt". */
static void make_corpus(void) {
    mkdir(test_path("c"), 0755);
    mkdir(test_path("c/a"), 0755);
    write_file("c/b.txt", 'b', 300);
    write_file("c/a/z.txt", 'z', 200);
    write_file("c/a-1.txt", '1', 100);
    write_file("c/.hidden", 'h', 50);
    write_file("c/empty", 'e', 0);
}

static void test_corpus(void) {
    corpus c;
    status st;
    int rc = corpus_open(&c, test_path("c"), &BYTES, &st);
    if (!test_check(rc == 0, "corpus: directory opens", rc ? "%s" : NULL, st.message)) return;
    if (!test_check(c.n_docs == 3, "corpus: 3 documents (hidden and empty skipped)", "%d", c.n_docs)) return;
    test_check(strstr(c.docs[0].path, "a-1.txt") && strstr(c.docs[1].path, "a/z.txt") &&
                   strstr(c.docs[2].path, "b.txt"),
               "corpus: sorted by full path", NULL);
    test_check(c.size == 600 + 2, "corpus: stream = documents + 2 separators", NULL);
    int32_t bytes[4];
    corpus_read(&c, 98, 4, bytes); /* last two of a-1.txt, the separator, the first of z.txt */
    test_check(bytes[0] == '1' && bytes[1] == '1' && bytes[2] == CORPUS_SEPARATOR && bytes[3] == 'z',
               "corpus: NUL separator between documents", NULL);
    long long train_end, eval_start;
    corpus_split(&c, 0.4, &train_end, &eval_start); /* target 240 bytes: b.txt (300) beats z+b (500) */
    test_check(eval_start == c.docs[2].start && train_end == eval_start - 1,
               "corpus: eval = the last documents closest to the fraction", NULL);
    corpus_split(&c, 0.99, &train_end, &eval_start); /* at least one document stays in train */
    test_check(eval_start == c.docs[1].start, "corpus: at least one document in each split", NULL);
    corpus_close(&c);

    test_check(corpus_open(&c, test_path("c/b.txt,"), &BYTES, &st) == EXIT_BAD_FILE && strstr(st.message, "empty path"),
               "corpus: an empty item of a comma list refused", NULL);
    char list[1100];
    snprintf(list, sizeof list, "%s,%s", test_path("c/b.txt"), test_path("c/a"));
    test_check(corpus_open(&c, list, &BYTES, &st) == 0 && c.n_docs == 2 && strstr(c.docs[0].path, "b.txt") &&
                   c.size == 501,
               "corpus: comma list opens", NULL);
    corpus_close(&c);

    test_check(mkfifo(test_path("fifo"), 0644) == 0, "corpus: a fifo to refuse is made", NULL);
    struct {
        const char *name, *why;
    } bad[] = {{"missing.txt", "No such file"},
               {"c/empty", "empty"},
               {"fifo", "not a regular file"},
               {"c/.hidden/x", "cannot"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char name[128];
        snprintf(name, sizeof name, "corpus: %s refused, naming it", bad[i].name);
        rc = corpus_open(&c, test_path(bad[i].name), &BYTES, &st);
        test_check(rc == EXIT_BAD_FILE && strstr(st.message, bad[i].name) && strstr(st.message, bad[i].why), name,
                   NULL);
    }
    mkdir(test_path("hollow"), 0755);
    write_file("hollow/.only_hidden", 'x', 10);
    test_check(corpus_open(&c, test_path("hollow"), &BYTES, &st) == EXIT_BAD_FILE && strstr(st.message, "hollow"),
               "corpus: directory without documents refused", NULL);
}

/* Train samples of a multi-document corpus never see the eval document, and
 * samples are a pure function of their key. */
static void test_text_split(void) {
    char path[600];
    snprintf(path, sizeof path, "data.path=%s", test_path("c"));
    const char *overrides[] = {
        "data.task=text", "model.vocab_size=256", "data.seq_len=64", "data.eval_fraction=0.4", path, NULL};
    config cfg = config_with(overrides);
    status st;
    data_source *d = data_open(&cfg, &st), *again = data_open(&cfg, &st);
    if (!test_check(d && again, "text: directory corpus opens", d && again ? NULL : "%s", st.message)) return;
    data_batch b, b2;
    data_batch_alloc(&b, 16, 64);
    data_batch_alloc(&b2, 16, 64);
    int train_sees_eval = 0, eval_outside = 0, differ = 0, fill_failed = 0;
    for (int step = 0; step < 20; step++) {
        fill_failed += data_fill(d, &b, SPLIT_TRAIN, step, 0, &st) != 0;
        fill_failed += data_fill(again, &b2, SPLIT_TRAIN, step, 0, &st) != 0;
        differ += memcmp(b.inputs, b2.inputs, sizeof(int32_t) * 16 * 64) != 0;
        for (int i = 0; i < 16 * 64; i++) train_sees_eval += b.inputs[i] == 'b' || b.targets[i] == 'b';
        fill_failed += data_fill(d, &b, SPLIT_EVAL, step, 0, &st) != 0;
        for (int i = 0; i < 16 * 64; i++) eval_outside += b.inputs[i] != 'b' || b.targets[i] != 'b';
    }
    test_check(fill_failed == 0, "text: every data_fill returns 0", fill_failed ? "%d failed: %s" : NULL, fill_failed,
               st.message);
    test_check(train_sees_eval == 0, "text: train samples only from train documents", NULL);
    test_check(eval_outside == 0, "text: eval samples only from the eval document", NULL);
    test_check(differ == 0, "text: the same samples from a second open", NULL);
    data_batch_free(&b);
    data_batch_free(&b2);
    data_close(d);
    data_close(again);

    const char *too_long[] = {
        "data.task=text", "model.vocab_size=256", "data.seq_len=310", "data.eval_fraction=0.4", path, NULL};
    cfg = config_with(too_long);
    test_check(!data_open(&cfg, &st) && st.code == EXIT_BAD_FILE && strstr(st.message, "train"),
               "text: train documents shorter than seq_len: exit 3", NULL);
}

/* Lengths far beyond the stack (8 MB): 3,000,001 int32 per sample, a chain of
 * 3,000,001 distinct tokens of 4,000,000. */
static void test_long_samples(void) {
    const char *chain[] = {"data.task=chain", "model.vocab_size=4000000", "data.chain_len=4000000",
                           "data.seq_len=3000000", NULL};
    config cfg = config_with(chain);
    status st;
    data_source *d = data_open(&cfg, &st);
    if (!test_check(d != NULL, "chain: L = 4e6, T = 3e6 opens", d ? NULL : "%s", st.message)) return;
    data_batch b;
    data_batch_alloc(&b, 1, cfg.seq_len);
    int rc = data_fill(d, &b, SPLIT_TRAIN, 1, 0, &st);
    if (test_check(rc == 0, "chain: data_fill returns 0", rc ? "%s" : NULL, st.message)) {
        uint8_t *seen = calloc((size_t)cfg.vocab_size, 1); /* tokens index it: only after a fill */
        int repeats = 0;
        for (int t = 0; t < cfg.seq_len; t++) repeats += seen[b.inputs[t]]++ > 0;
        test_check(repeats == 0 && b.targets[cfg.seq_len - 2] == b.inputs[cfg.seq_len - 1],
                   "chain: L = 4e6, T = 3e6: distinct tokens, no stack overflow", NULL);
        free(seen);
    }
    data_close(d);
    const char *copy[] = {"data.task=copy", "data.seq_len=3000000", NULL};
    cfg = config_with(copy);
    d = data_open(&cfg, &st);
    if (test_check(d != NULL, "copy: T = 3e6 opens", d ? NULL : "%s", st.message)) {
        rc = data_fill(d, &b, SPLIT_TRAIN, 1, 0, &st);
        if (test_check(rc == 0, "copy: data_fill returns 0", rc ? "%s" : NULL, st.message))
            test_check(b.inputs[0] >= 1 && b.inputs[0] <= 10, "copy: T = 3e6 without stack overflow", NULL);
        data_close(d);
    }
    data_batch_free(&b);
}

static uint64_t fnv(const int32_t *x, size_t n, uint64_t h) {
    const unsigned char *p = (const unsigned char *)x;
    for (size_t i = 0; i < n * sizeof *x; i++) h = (h ^ p[i]) * 1099511628211ULL;
    return h;
}

/* FNV-1a of inputs and targets of rows 3..7 of steps 0..2 of both splits. */
static uint64_t chain_hash(const config *cfg) {
    status st;
    data_source *d = data_open(cfg, &st);
    if (!d) return 0;
    data_batch b;
    data_batch_alloc(&b, 5, 100);
    uint64_t h = 1469598103934665603ULL;
    for (int split = 0; split < 2; split++)
        for (int step = 0; step < 3; step++) {
            data_fill(d, &b, split, step, 3, &st);
            h = fnv(b.targets, 500, fnv(b.inputs, 500, h));
        }
    data_batch_free(&b);
    data_close(d);
    return h;
}

/* Fixed-period chains (no chain_len_max, no chain_noise) are the samples of
 * the generator before those keys existed: hashes taken from it. */
static void test_chain_unchanged(void) {
    const char *sets[][4] = {{"data.chain_len=10", "data.seq_len=100", NULL},
                             {"data.chain_len=30", "data.noise=0.1", "data.seq_len=100", NULL},
                             {"data.chain_len=7", "model.vocab_size=8", "data.seq_len=100", NULL}};
    const uint64_t before[] = {0x252dea5cc47d7cc3ULL, 0x3288f44c87e4dd8cULL, 0x5eb9926edf9b3234ULL};
    for (int i = 0; i < 3; i++) {
        config cfg = config_with(sets[i]);
        uint64_t h = chain_hash(&cfg);
        test_check(h == before[i], "chain: fixed period, samples as before the new keys", "%s: %016llx", sets[i][0],
                   (unsigned long long)h);
    }
}

/* Row r of b checked against the chain rules of docs/tasks.md §2: chain
 * tokens (below first_filler) follow c_{m mod L} with L distinct tokens,
 * fillers lie in [first_filler, V), a target is -1 exactly where the next
 * token is a filler. Returns the number of fillers among the inputs, or -1. */
static int check_chain_row(const data_batch *b, int r, int L, int first_filler, int V) {
    const int32_t *x = b->inputs + (size_t)r * b->T, *y = b->targets + (size_t)r * b->T;
    int32_t chain[64];
    int m = 0, fillers = 0;
    for (int t = 0; t < b->T; t++) {
        if (x[t] < 0 || x[t] >= V) return -1;
        if (t + 1 < b->T && (y[t] < 0) != (x[t + 1] >= first_filler)) return -1;
        if (t + 1 < b->T && y[t] >= 0 && y[t] != x[t + 1]) return -1;
        if (x[t] >= first_filler) {
            fillers++;
            continue;
        }
        if (m < L) {
            for (int i = 0; i < m; i++)
                if (chain[i] == x[t]) return -1;
            chain[m] = x[t];
        } else if (x[t] != chain[m % L]) {
            return -1;
        }
        m++;
    }
    return fillers;
}

/* Periods drawn per sample in [chain_len, chain_len_max] (the eval split's
 * too, the length eval's from its own range), fillers between chain tokens
 * at about the rate asked for, and rows that do not depend on how a batch
 * is grouped (any rank count makes the same samples). */
static void test_chain_variants(void) {
    const char *sets[] = {"data.chain_len=5",       "data.chain_len_max=12",      "data.chain_noise=0.25",
                          "data.chain_fillers=8",   "model.vocab_size=40",        "data.seq_len=96",
                          "data.eval_chain_len=20", "data.eval_chain_len_max=24", NULL};
    config cfg = config_with(sets);
    status st;
    if (!test_check(config_check(&cfg, "test", &st) == 0, "chain variants: config accepted", "%s", st.message)) return;
    data_source *d = data_open(&cfg, &st);
    data_batch b, one;
    data_batch_alloc(&b, 64, cfg.seq_len);
    data_batch_alloc(&one, 1, cfg.seq_len);
    int lo[3] = {99, 99, 99}, hi[3] = {0}, bad = 0, regrouped = 0;
    long long fillers = 0, positions = 0;
    for (int split = 0; split < 3; split++) {
        data_fill(d, &b, split, 2, 10, &st);
        for (int r = 0; r < b.B; r++) {
            int L = data_sample_period(d, split, 2, 10 + r);
            lo[split] = L < lo[split] ? L : lo[split], hi[split] = L > hi[split] ? L : hi[split];
            int f = check_chain_row(&b, r, L, cfg.vocab_size - cfg.chain_fillers, cfg.vocab_size);
            bad += f < 0;
            fillers += f, positions += b.T;
            data_fill(d, &one, split, 2, 10 + r, &st);
            regrouped += memcmp(one.inputs, b.inputs + (size_t)r * b.T, sizeof(int32_t) * b.T) != 0 ||
                         memcmp(one.targets, b.targets + (size_t)r * b.T, sizeof(int32_t) * b.T) != 0;
        }
    }
    test_check(bad == 0, "chain variants: rows follow the chain with fillers apart", "%d bad rows", bad);
    test_check(lo[0] == 5 && hi[0] == 12 && lo[1] == 5 && hi[1] == 12,
               "chain variants: periods uniform in [chain_len, chain_len_max]", "train %d..%d, eval %d..%d", lo[0],
               hi[0], lo[1], hi[1]);
    test_check(lo[2] >= 20 && hi[2] <= 24 && lo[2] < hi[2], "chain variants: length eval periods in its own range",
               "%d..%d", lo[2], hi[2]);
    double rate = (double)fillers / positions;
    test_check(fabs(rate - 0.25) < 0.03, "chain variants: fillers at the rate data.chain_noise asks", "%.3f", rate);
    test_check(regrouped == 0, "chain variants: a row is the same filled alone or in a batch", "%d differ", regrouped);
    /* counter-based: a fresh source makes step 2 first, with no state carried from the steps drawn above */
    data_source *fresh = data_open(&cfg, &st);
    data_batch again;
    data_batch_alloc(&again, 64, cfg.seq_len);
    data_fill(fresh, &again, 2, 2, 10, &st);
    test_check(memcmp(again.inputs, b.inputs, sizeof(int32_t) * 64 * b.T) == 0 &&
                   memcmp(again.targets, b.targets, sizeof(int32_t) * 64 * b.T) == 0,
               "chain variants: a sample depends on its key alone (fresh source, other order)", NULL);
    data_batch_free(&again);
    data_close(fresh);
    data_batch_free(&one);
    data_batch_free(&b);
    data_close(d);
}

static void test_chain_refused(void) {
    const char *cases[][4] = {{"data.chain_len=10", "data.chain_len_max=9", NULL},
                              {"data.eval_chain_len=10", "data.eval_chain_len_max=5", NULL},
                              {"data.chain_len_max=65", NULL},
                              {"data.chain_noise=0.1", "data.chain_fillers=60", NULL},
                              {"data.chain_noise=0.1", "data.chain_fillers=64", NULL}};
    const char *expect[] = {"data.chain_len_max", "data.eval_chain_len_max", "data.chain_len_max",
                            "data.chain_len = 10 exceeds the 4", "data.chain_fillers"};
    for (int i = 0; i < 5; i++) {
        config cfg = config_with(cases[i]);
        status st;
        int rc = config_check(&cfg, "test", &st);
        test_check(rc == EXIT_USAGE && strstr(st.message, expect[i]), "chain: bad periods or fillers refused", "%s",
                   rc ? st.message : "accepted");
    }
}

static void test_listops_limits(void) {
    status st;
    const char *short_t[] = {"data.task=listops",      "model.head=cls",         "data.seq_len=3",
                             "data.listops_min_len=1", "data.listops_max_len=3", NULL};
    config cfg = config_with(short_t);
    test_check(!data_open(&cfg, &st) && st.code == EXIT_USAGE && strstr(st.message, "data.listops_max_len") &&
                   strstr(st.message, "data.seq_len"),
               "listops: seq_len = max_len = 3 refused (exit 2)", NULL);
    const char *shallow[] = {
        "data.task=listops",       "model.head=cls",           "data.seq_len=64",         "data.listops_min_len=20",
        "data.listops_max_len=64", "data.listops_max_depth=1", "data.listops_max_args=4", NULL};
    cfg = config_with(shallow);
    test_check(!data_open(&cfg, &st) && st.code == EXIT_USAGE && strstr(st.message, "data.listops_max_depth"),
               "listops: min_len above the longest expression refused", NULL);
    const char *rare[] = {
        "data.task=listops",        "model.head=cls",           "data.seq_len=100",        "data.listops_min_len=90",
        "data.listops_max_len=100", "data.listops_max_depth=3", "data.listops_max_args=5", NULL};
    cfg = config_with(rare);
    test_check(!data_open(&cfg, &st) && st.code == EXIT_USAGE && strstr(st.message, "attempts"),
               "listops: limits almost no expression meets refused", NULL);
    const char *fine[] = {"data.task=listops",      "model.head=cls",         "data.seq_len=4",
                          "data.listops_min_len=4", "data.listops_max_len=4", NULL};
    cfg = config_with(fine);
    data_source *d = data_open(&cfg, &st);
    test_check(d != NULL, "listops: the shortest expression alone is accepted", NULL);
    if (d) data_close(d);

    struct {
        const char *row, *why;
    } bad[] = {{"[MAX 1 2 ]\tnine\n", "Target 'nine'"},
               {"[MAX 1 2 ]\t10\n", "Target '10'"},
               {"[MAX 1 2 ]\t\n", "Target ''"},
               {"[MAX 1 x ]\t2\n", "Source"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        FILE *f = fopen(test_path("bad.tsv"), "w");
        fprintf(f, "Source\tTarget\n[MIN 1 2 ]\t1\n%s", bad[i].row);
        fclose(f);
        char path[600], name[128];
        snprintf(path, sizeof path, "data.path=%s", test_path("bad.tsv"));
        const char *tsv[] = {"data.task=listops", "model.head=cls", "data.seq_len=16", path, NULL};
        cfg = config_with(tsv);
        snprintf(name, sizeof name, "listops TSV: %s refused naming file:line", bad[i].why);
        test_check(!data_open(&cfg, &st) && st.code == EXIT_BAD_FILE && strstr(st.message, "bad.tsv:3") &&
                       strstr(st.message, bad[i].why),
                   name, NULL);
    }
}

static void test_exp(void) {
    float worst = 0;
    for (float x = -87.0f; x <= 0.0f; x += 0.01f) {
        float rel = fabsf(fast_exp_nonpositive(x) - expf(x)) / expf(x);
        worst = rel > worst ? rel : worst;
    }
    test_check(worst <= 3e-7f, "fast_exp_nonpositive: relative error <= 3e-7 over [-87, 0]", NULL);
    test_check(isnan(fast_exp_nonpositive(NAN)) && isnan(fast_exp_nonpositive(-NAN)),
               "fast_exp_nonpositive(NaN) is NaN", NULL);
    test_check(fast_exp_nonpositive(-INFINITY) == fast_exp_nonpositive(-87.0f) &&
                   fast_exp_nonpositive(-1e30f) == fast_exp_nonpositive(-87.0f),
               "fast_exp_nonpositive(-inf), (-1e30): e^-87", NULL);
    float top = fast_exp_nonpositive(88.0f);
    test_check(isfinite(top) && fast_exp_nonpositive(INFINITY) == top && fast_exp_nonpositive(1e30f) == top,
               "fast_exp_nonpositive(+inf), (1e30): e^88, finite", NULL);
    /* the vectorised softmax path of the kernels sees whole rows with a NaN */
    float row[37];
    for (int i = 0; i < 37; i++) row[i] = i == 5 ? NAN : -0.5f * i;
    int nan_out = 0;
    for (int i = 0; i < 37; i++) row[i] = fast_exp_nonpositive(row[i]), nan_out += isnan(row[i]);
    test_check(nan_out == 1 && isnan(row[5]), "fast_exp_nonpositive over a row: only the NaN stays NaN", NULL);
}

/* fast_exp_coarse, bf16's exponential: its bound, e^0 = 1 exactly, and
 * fast_exp_nonpositive's clamps and NaN. */
static void test_exp_coarse(void) {
    float worst = 0;
    for (float x = -87.0f; x <= 0.0f; x += 0.01f) worst = fmaxf(worst, fabsf(fast_exp_coarse(x) - expf(x)) / expf(x));
    test_check(worst <= 3.2e-6f && worst > 1e-6f, "fast_exp_coarse: relative error in (1e-6, 3.2e-6] over [-87, 0]",
               "%.3g", worst);
    test_check(fast_exp_coarse(0.0f) == 1.0f, "fast_exp_coarse(0) = 1 exactly", NULL);
    test_check(isnan(fast_exp_coarse(NAN)) && fast_exp_coarse(-INFINITY) == fast_exp_coarse(-87.0f) &&
                   isfinite(fast_exp_coarse(INFINITY)),
               "fast_exp_coarse(NaN), (-inf), (+inf): NaN, e^-87, finite", NULL);
}

#if FAST_EXP8_AVAILABLE
/* out[0..8) = fast_exp8_nonpositive(x[0..8)). */
__attribute__((target("avx2,fma"))) static void exp8(float *out, const float *x) {
    _mm256_storeu_ps(out, fast_exp8_nonpositive(_mm256_loadu_ps(x)));
}

/* out[0..16) = fast_exp8_coarse(x[0..16)), eight lanes at a time. */
__attribute__((target("avx2,fma"))) static void exp_coarse8(float *out, const float *x) {
    _mm256_storeu_ps(out, fast_exp8_coarse(_mm256_loadu_ps(x)));
    _mm256_storeu_ps(out + 8, fast_exp8_coarse(_mm256_loadu_ps(x + 8)));
}

/* out[0..16) = fast_exp16_coarse(x[0..16)). */
__attribute__((target("avx512f"))) static void exp_coarse16(float *out, const float *x) {
    _mm512_storeu_ps(out, fast_exp16_coarse(_mm512_loadu_ps(x)));
}

/* fast_exp_coarse's vector forms, whose reduction is one fused step: the
 * same bound, special inputs lane by lane, and where the CPU has AVX-512F
 * the same bits on eight and sixteen lanes (the tiles' exponentials mix
 * the widths within a tile). */
static void test_exp_coarse_lanes(void) {
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
        test_skip("fast_exp8_coarse and fast_exp16_coarse", "the CPU has no AVX2 and FMA");
        return;
    }
    bool wide = __builtin_cpu_supports("avx512f"), same = true;
    float worst = 0, x[16], e[16], e16[16];
    for (float x0 = -87.0f; x0 <= 0.0f; x0 += 0.16f) {
        for (int l = 0; l < 16; l++) x[l] = fminf(x0 + 0.01f * l, 0.0f);
        exp_coarse8(e, x);
        for (int l = 0; l < 16; l++) worst = fmaxf(worst, fabsf(e[l] - expf(x[l])) / expf(x[l]));
        if (wide) exp_coarse16(e16, x), same = same && !memcmp(e, e16, sizeof e);
    }
    test_check(worst <= 3.2e-6f, "fast_exp8_coarse: relative error <= 3.2e-6 over [-87, 0]", "%.3g", worst);
    const float special[16] = {NAN,    -NAN,  -INFINITY, -1e30f,  INFINITY,     1e30f,       0.0f,   -1.0f,
                               -87.0f, 88.0f, -0.0f,     -1e-30f, -0.34657359f, 0.34657359f, -86.9f, -126.0f};
    exp_coarse8(e, special);
    test_check(isnan(e[0]) && isnan(e[1]) && e[2] == e[8] && e[3] == e[8] && e[4] == e[9] && e[5] == e[9] &&
                   isfinite(e[9]) && e[6] == 1.0f && e[10] == 1.0f && e[11] == 1.0f && e[15] == e[8],
               "fast_exp8_coarse: NaN, +-inf, +-1e30, 0, -0 lane by lane", NULL);
    if (!wide) {
        test_skip("fast_exp16_coarse = fast_exp8_coarse", "the CPU has no AVX-512F");
        return;
    }
    exp_coarse16(e16, special);
    same = same && isnan(e16[0]) && isnan(e16[1]) && !memcmp(e + 2, e16 + 2, 14 * sizeof(float));
    test_check(same, "fast_exp16_coarse = fast_exp8_coarse, bits (a sweep of [-87, 0], special inputs)", NULL);
}

/* The eight-lane exp of tiled attention holds fast_exp_nonpositive's
 * bounds and its special inputs lane by lane. */
static void test_exp8(void) {
    if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return;
    float worst = 0, x[8], e[8];
    for (float x0 = -87.0f; x0 <= 0.0f; x0 += 0.08f) {
        for (int l = 0; l < 8; l++) x[l] = fminf(x0 + 0.01f * l, 0.0f);
        exp8(e, x);
        for (int l = 0; l < 8; l++) worst = fmaxf(worst, fabsf(e[l] - expf(x[l])) / expf(x[l]));
    }
    test_check(worst <= 3e-7f, "fast_exp8_nonpositive: relative error <= 3e-7 over [-87, 0]", "%.3g", worst);
    const float special[8] = {NAN, -NAN, -INFINITY, -1e30f, INFINITY, 1e30f, 0.0f, -1.0f};
    exp8(e, special);
    test_check(isnan(e[0]) && isnan(e[1]), "fast_exp8_nonpositive(NaN) is NaN", NULL);
    test_check(e[2] == fast_exp_nonpositive(-87.0f) && e[3] == e[2], "fast_exp8_nonpositive(-inf), (-1e30): e^-87",
               "%g", e[2]);
    test_check(isfinite(e[4]) && e[4] == e[5] && fabsf(e[4] / fast_exp_nonpositive(88.0f) - 1) < 1e-6f,
               "fast_exp8_nonpositive(+inf), (1e30): e^88, finite", "%g", e[4]);
    test_check(e[6] == 1.0f && fabsf(e[7] - expf(-1.0f)) <= 3e-7f * expf(-1.0f), "fast_exp8_nonpositive(0), (-1)",
               NULL);
}
#else
static void test_exp8(void) {}
static void test_exp_coarse_lanes(void) {}
#endif

/* ---- sentencepiece models (docs/tasks.md §2, tokenizer): whole, or refused ---- */

/* Appends a length-delimited field (wire type 2) of `len` bytes to out. */
static size_t put_field(unsigned char *out, int field, const void *bytes, size_t len) {
    size_t n = 0;
    out[n++] = (unsigned char)(field << 3 | 2);
    out[n++] = (unsigned char)len; /* every field here is below 128 bytes */
    memcpy(out + n, bytes, len);
    return n + len;
}

/* A ModelProto as sentencepiece writes it: the pieces, a TrainerSpec with
 * vocab_size = `vocab`, a NormalizerSpec. Returns its length. */
static size_t make_model(unsigned char *out, int vocab) {
    static const struct {
        const char *piece;
        int type;
    } pieces[] = {{"<unk>", 2},
                  {"<s>", 3},
                  {"<0x41>", 6},
                  {"ab", 1},
                  {"\xe2\x96\x81"
                   "c",
                   1}};
    size_t n = 0;
    for (size_t i = 0; i < sizeof pieces / sizeof pieces[0]; i++) {
        unsigned char piece[32];
        size_t len = put_field(piece, 1, pieces[i].piece, strlen(pieces[i].piece));
        piece[len++] = 3 << 3 | 0; /* the piece's type, a varint */
        piece[len++] = (unsigned char)pieces[i].type;
        n += put_field(out + n, 1, piece, len);
    }
    unsigned char trainer[] = {4 << 3 | 0, (unsigned char)vocab, 3 << 3 | 0, 2};
    n += put_field(out + n, 2, trainer, sizeof trainer);
    unsigned char normalizer[16];
    size_t len = put_field(normalizer, 1, "identity", 8);
    return n + put_field(out + n, 3, normalizer, len);
}

static int parse_model(const unsigned char *bytes, size_t n, tokenizer *t, status *st) {
    unsigned char *copy = sys_calloc(n + 1, 1);
    memcpy(copy, bytes, n);
    return tokenizer_from_bytes(t, copy, n, "model", st);
}

static void test_tokenizer_whole_or_refused(void) {
    unsigned char model[512];
    size_t n = make_model(model, 5);
    tokenizer t;
    status st;
    int rc = parse_model(model, n, &t, &st);
    bool decoded = rc == 0 && t.n_pieces == 5 && t.length[2] == 1 && t.text[2][0] == 'A' && t.length[3] == 2 &&
                   t.length[4] == 2 && t.text[4][0] == ' ' && t.length[1] == 0;
    test_check(decoded, "tokenizer: a whole model reads, 5 pieces decoded", rc ? "%s" : NULL, st.message);
    if (rc == 0) tokenizer_free(&t);
    /* a model cut after any byte is refused, whatever the cut: none reads as fewer pieces */
    size_t accepted = 0, first = 0;
    for (size_t cut = 0; cut < n; cut++) {
        if (parse_model(model, cut, &t, &st) != 0) continue;
        tokenizer_free(&t);
        if (!accepted++) first = cut;
    }
    test_check(accepted == 0, "tokenizer: every one of its strict prefixes is refused",
               accepted ? "%zu accepted, first %zu of %zu bytes" : NULL, accepted, first, n);
    rc = parse_model(model, n - 12, &t, &st);
    test_check(rc == EXIT_BAD_FILE && strstr(st.message, "model: not a sentencepiece model") &&
                   strstr(st.message, "truncated"),
               "tokenizer: the refusal names the origin and says truncated", "%s", st.message);
    n = make_model(model, 7);
    rc = parse_model(model, n, &t, &st);
    test_check(rc == EXIT_BAD_FILE && strstr(st.message, "5 pieces, but its trainer_spec says vocab_size = 7"),
               "tokenizer: fewer pieces than vocab_size is refused", "%s", st.message);
    /* any byte changed: refused or read, never a crash (the sanitizer build watches) */
    n = make_model(model, 5);
    int read = 0;
    for (size_t i = 0; i < n; i++)
        for (int v = 0; v < 256; v += 51) {
            unsigned char bad[512];
            memcpy(bad, model, n);
            bad[i] = (unsigned char)v;
            if (parse_model(bad, n, &t, &st) != 0) continue;
            read++;
            tokenizer_free(&t);
        }
    test_check(read < (int)n * 6, "tokenizer: single-byte damage: refused or read, no crash", "%d of %zu read", read,
               n * 6);
}

int main(void) {
    if (!test_scratch_make("test_data")) return test_summary("test_data");
    make_corpus();
    test_corpus();
    test_text_split();
    test_long_samples();
    test_chain_unchanged();
    test_chain_variants();
    test_chain_refused();
    test_listops_limits();
    test_exp();
    test_exp8();
    test_exp_coarse();
    test_exp_coarse_lanes();
    test_tokenizer_whole_or_refused();
    test_scratch_remove();
    return test_summary("test_data");
}
