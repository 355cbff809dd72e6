/* Data of docs/tasks.md §2: the text corpus (directory walk order, separator
 * placement, split by whole documents, determinism, refused inputs), long
 * samples without stack arrays, listops limits and TSV labels refused at
 * open, and fast_exp_nonpositive on NaN and infinite inputs (run it in the
 * sanitizer build too). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "momfmm/config.h"
#include "momfmm/corpus.h"
#include "momfmm/data.h"
#include "momfmm/fast_math.h"

static int check(const char *name, int ok) {
    printf("%-64s %s\n", name, ok ? "ok" : "FAIL");
    return !ok;
}

static char workdir[] = "/tmp/test_data_XXXXXX";

static const char *path_in(const char *name) {
    static char path[4][512];
    static int next;
    next = (next + 1) % 4;
    snprintf(path[next], sizeof path[next], "%s/%s", workdir, name);
    return path[next];
}

static void write_file(const char *name, char fill, int size) {
    FILE *f = fopen(path_in(name), "wb");
    for (int i = 0; i < size; i++) fputc(fill, f);
    fclose(f);
}

/* A config of the defaults with "section.key=value" overrides (NULL-ended). */
static config config_with(const char *const *overrides) {
    config c;
    config_defaults(&c);
    status st;
    for (int i = 0; overrides[i]; i++)
        if (config_apply_override(&c, overrides[i], &st)) printf("bad override %s: %s\n", overrides[i], st.message);
    return c;
}

/* The corpus: c/b.txt (300 'b'), c/a/z.txt (200 'z'), c/a-1.txt (100 '1'),
 * c/.hidden (skipped), c/empty (skipped). Sorted by full path: "a-1.txt" <
 * "a/z.txt" ('-' < '/') < "b.txt". */
static void make_corpus(void) {
    mkdir(path_in("c"), 0755);
    mkdir(path_in("c/a"), 0755);
    write_file("c/b.txt", 'b', 300);
    write_file("c/a/z.txt", 'z', 200);
    write_file("c/a-1.txt", '1', 100);
    write_file("c/.hidden", 'h', 50);
    write_file("c/empty", 'e', 0);
}

static int test_corpus(void) {
    int fails = 0;
    corpus c;
    status st;
    fails += check("corpus: directory opens", corpus_open(&c, path_in("c"), &st) == 0);
    fails += check("corpus: 3 documents (hidden and empty skipped)", c.n_docs == 3);
    if (c.n_docs != 3) return fails + 1;
    fails += check("corpus: sorted by full path", strstr(c.docs[0].path, "a-1.txt") && strstr(c.docs[1].path, "a/z.txt") &&
                                                     strstr(c.docs[2].path, "b.txt"));
    fails += check("corpus: stream = documents + 2 separators", c.size == 600 + 2);
    int32_t bytes[4];
    corpus_read(&c, 98, 4, bytes); /* last two of a-1.txt, the separator, the first of z.txt */
    fails += check("corpus: NUL separator between documents",
                   bytes[0] == '1' && bytes[1] == '1' && bytes[2] == CORPUS_SEPARATOR && bytes[3] == 'z');
    long long train_end, eval_start;
    corpus_split(&c, 0.4, &train_end, &eval_start); /* target 240 bytes: b.txt (300) beats z+b (500) */
    fails += check("corpus: eval = the last documents closest to the fraction",
                   eval_start == c.docs[2].start && train_end == eval_start - 1);
    corpus_split(&c, 0.99, &train_end, &eval_start); /* at least one document stays in train */
    fails += check("corpus: at least one document in each split", eval_start == c.docs[1].start);
    corpus_close(&c);

    fails += check("corpus: an empty item of a comma list refused",
                   corpus_open(&c, path_in("c/b.txt,") , &st) == EXIT_BAD_FILE && strstr(st.message, "empty path"));
    char list[1100];
    snprintf(list, sizeof list, "%s,%s", path_in("c/b.txt"), path_in("c/a"));
    fails += check("corpus: comma list opens", corpus_open(&c, list, &st) == 0 && c.n_docs == 2 &&
                                                   strstr(c.docs[0].path, "b.txt") && c.size == 501);
    corpus_close(&c);

    mkfifo(path_in("fifo"), 0644);
    struct { const char *name, *why; } bad[] = {
        {"missing.txt", "No such file"}, {"c/empty", "empty"}, {"fifo", "not a regular file"}, {"c/.hidden/x", "cannot"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char name[128];
        snprintf(name, sizeof name, "corpus: %s refused, naming it", bad[i].name);
        int rc = corpus_open(&c, path_in(bad[i].name), &st);
        fails += check(name, rc == EXIT_BAD_FILE && strstr(st.message, bad[i].name) && strstr(st.message, bad[i].why));
    }
    mkdir(path_in("hollow"), 0755);
    write_file("hollow/.only_hidden", 'x', 10);
    fails += check("corpus: directory without documents refused",
                   corpus_open(&c, path_in("hollow"), &st) == EXIT_BAD_FILE && strstr(st.message, "hollow"));
    return fails;
}

/* Train samples of a multi-document corpus never see the eval document, and
 * samples are a pure function of their key. */
static int test_text_split(void) {
    int fails = 0;
    char path[600];
    snprintf(path, sizeof path, "data.path=%s", path_in("c"));
    const char *overrides[] = {"data.task=text", "model.vocab_size=256", "data.seq_len=64", "data.eval_fraction=0.4",
                               path, NULL};
    config cfg = config_with(overrides);
    status st;
    data_source *d = data_open(&cfg, &st), *again = data_open(&cfg, &st);
    if (check("text: directory corpus opens", d && again)) return 1;
    data_batch b, b2;
    data_batch_alloc(&b, 16, 64);
    data_batch_alloc(&b2, 16, 64);
    int train_sees_eval = 0, eval_outside = 0, differ = 0;
    for (int step = 0; step < 20; step++) {
        data_fill(d, &b, SPLIT_TRAIN, step, 0, &st);
        data_fill(again, &b2, SPLIT_TRAIN, step, 0, &st);
        differ += memcmp(b.inputs, b2.inputs, sizeof(int32_t) * 16 * 64) != 0;
        for (int i = 0; i < 16 * 64; i++) train_sees_eval += b.inputs[i] == 'b' || b.targets[i] == 'b';
        data_fill(d, &b, SPLIT_EVAL, step, 0, &st);
        for (int i = 0; i < 16 * 64; i++) eval_outside += b.inputs[i] != 'b' || b.targets[i] != 'b';
    }
    fails += check("text: train samples only from train documents", train_sees_eval == 0);
    fails += check("text: eval samples only from the eval document", eval_outside == 0);
    fails += check("text: the same samples from a second open", differ == 0);
    data_batch_free(&b);
    data_batch_free(&b2);
    data_close(d);
    data_close(again);

    const char *too_long[] = {"data.task=text", "model.vocab_size=256", "data.seq_len=310", "data.eval_fraction=0.4",
                              path, NULL};
    cfg = config_with(too_long);
    fails += check("text: train documents shorter than seq_len: exit 3",
                   !data_open(&cfg, &st) && st.code == EXIT_BAD_FILE && strstr(st.message, "train"));
    return fails;
}

/* Lengths far beyond the stack (8 MB): 3,000,001 int32 per sample, a chain of
 * 3,000,001 distinct tokens of 4,000,000. */
static int test_long_samples(void) {
    int fails = 0;
    const char *chain[] = {"data.task=chain", "model.vocab_size=4000000", "data.chain_len=4000000",
                           "data.seq_len=3000000", NULL};
    config cfg = config_with(chain);
    status st;
    data_source *d = data_open(&cfg, &st);
    data_batch b;
    data_batch_alloc(&b, 1, cfg.seq_len);
    data_fill(d, &b, SPLIT_TRAIN, 1, 0, &st);
    uint8_t *seen = calloc((size_t)cfg.vocab_size, 1);
    int repeats = 0;
    for (int t = 0; t < cfg.seq_len; t++) repeats += seen[b.inputs[t]]++ > 0;
    fails += check("chain: L = 4e6, T = 3e6: distinct tokens, no stack overflow", repeats == 0 &&
                                                                                     b.targets[cfg.seq_len - 2] == b.inputs[cfg.seq_len - 1]);
    free(seen);
    data_close(d);
    const char *copy[] = {"data.task=copy", "data.seq_len=3000000", NULL};
    cfg = config_with(copy);
    d = data_open(&cfg, &st);
    data_fill(d, &b, SPLIT_TRAIN, 1, 0, &st);
    fails += check("copy: T = 3e6 without stack overflow", b.inputs[0] >= 1 && b.inputs[0] <= 10);
    data_close(d);
    data_batch_free(&b);
    return fails;
}

static int test_listops_limits(void) {
    int fails = 0;
    status st;
    const char *short_t[] = {"data.task=listops", "model.head=cls", "data.seq_len=3", "data.listops_min_len=1",
                             "data.listops_max_len=3", NULL};
    config cfg = config_with(short_t);
    fails += check("listops: seq_len = max_len = 3 refused (exit 2)",
                   !data_open(&cfg, &st) && st.code == EXIT_USAGE && strstr(st.message, "data.listops_max_len") &&
                       strstr(st.message, "data.seq_len"));
    const char *shallow[] = {"data.task=listops", "model.head=cls", "data.seq_len=64", "data.listops_min_len=20",
                             "data.listops_max_len=64", "data.listops_max_depth=1", "data.listops_max_args=4", NULL};
    cfg = config_with(shallow);
    fails += check("listops: min_len above the longest expression refused",
                   !data_open(&cfg, &st) && st.code == EXIT_USAGE && strstr(st.message, "data.listops_max_depth"));
    const char *rare[] = {"data.task=listops", "model.head=cls", "data.seq_len=100", "data.listops_min_len=90",
                          "data.listops_max_len=100", "data.listops_max_depth=3", "data.listops_max_args=5", NULL};
    cfg = config_with(rare);
    fails += check("listops: limits almost no expression meets refused",
                   !data_open(&cfg, &st) && st.code == EXIT_USAGE && strstr(st.message, "attempts"));
    const char *fine[] = {"data.task=listops", "model.head=cls", "data.seq_len=4", "data.listops_min_len=4",
                          "data.listops_max_len=4", NULL};
    cfg = config_with(fine);
    data_source *d = data_open(&cfg, &st);
    fails += check("listops: the shortest expression alone is accepted", d != NULL);
    if (d) data_close(d);

    struct { const char *row, *why; } bad[] = {
        {"[MAX 1 2 ]\tnine\n", "Target 'nine'"}, {"[MAX 1 2 ]\t10\n", "Target '10'"},
        {"[MAX 1 2 ]\t\n", "Target ''"}, {"[MAX 1 x ]\t2\n", "Source"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        FILE *f = fopen(path_in("bad.tsv"), "w");
        fprintf(f, "Source\tTarget\n[MIN 1 2 ]\t1\n%s", bad[i].row);
        fclose(f);
        char path[600], name[128];
        snprintf(path, sizeof path, "data.path=%s", path_in("bad.tsv"));
        const char *tsv[] = {"data.task=listops", "model.head=cls", "data.seq_len=16", path, NULL};
        cfg = config_with(tsv);
        snprintf(name, sizeof name, "listops TSV: %s refused naming file:line", bad[i].why);
        fails += check(name, !data_open(&cfg, &st) && st.code == EXIT_BAD_FILE && strstr(st.message, "bad.tsv:3") &&
                                 strstr(st.message, bad[i].why));
    }
    return fails;
}

static int test_exp(void) {
    int fails = 0;
    float worst = 0;
    for (float x = -87.0f; x <= 0.0f; x += 0.01f) {
        float rel = fabsf(fast_exp_nonpositive(x) - expf(x)) / expf(x);
        worst = rel > worst ? rel : worst;
    }
    fails += check("fast_exp_nonpositive: relative error <= 3e-7 over [-87, 0]", worst <= 3e-7f);
    fails += check("fast_exp_nonpositive(NaN) is NaN", isnan(fast_exp_nonpositive(NAN)) && isnan(fast_exp_nonpositive(-NAN)));
    fails += check("fast_exp_nonpositive(-inf), (-1e30): e^-87", fast_exp_nonpositive(-INFINITY) == fast_exp_nonpositive(-87.0f) &&
                                                             fast_exp_nonpositive(-1e30f) == fast_exp_nonpositive(-87.0f));
    float top = fast_exp_nonpositive(88.0f);
    fails += check("fast_exp_nonpositive(+inf), (1e30): e^88, finite",
                   isfinite(top) && fast_exp_nonpositive(INFINITY) == top && fast_exp_nonpositive(1e30f) == top);
    /* the vectorised softmax path of the kernels sees whole rows with a NaN */
    float row[37];
    for (int i = 0; i < 37; i++) row[i] = i == 5 ? NAN : -0.5f * i;
    int nan_out = 0;
    for (int i = 0; i < 37; i++) row[i] = fast_exp_nonpositive(row[i]), nan_out += isnan(row[i]);
    fails += check("fast_exp_nonpositive over a row: only the NaN stays NaN", nan_out == 1 && isnan(row[5]));
    return fails;
}

int main(void) {
    if (!mkdtemp(workdir)) return 1;
    make_corpus();
    int fails = test_corpus() + test_text_split() + test_long_samples() + test_listops_limits() + test_exp();
    char command[600];
    snprintf(command, sizeof command, "rm -rf %s", workdir);
    if (system(command) != 0) fails++;
    printf("%s\n", fails ? "FAILED" : "all passed");
    return fails != 0;
}
