/* Token files and directory walks of docs/tasks.md §2: llm.c's headered
 * .bin (magic, version and size checked) and nanoGPT's flat uint16 .bin
 * read back id for id, joined without a separator; ids checked against the
 * vocabulary at open (naming the first bad offset); text refused beside a
 * vocabulary other than 256; dangling links and binary files skipped and
 * counted; data.include/data.exclude globs. The HDF5 /tokens dataset and
 * files written by numpy are tested in tests/e2e/test_lm_data.py. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/corpus.h"
#include "data/token_file.h"
#include "test_util.h"

/* n uint16 tokens 7*i mod 1000, after llm.c's header when header_version > 0
 * (declaring `declared` tokens), little-endian as both writers make them. */
static void write_tokens(const char *name, int n, int header_version, int declared) {
    FILE *f = fopen(test_path(name), "wb");
    if (header_version > 0) {
        int32_t header[256] = {TOKEN_FILE_LLMC_MAGIC, header_version, declared};
        fwrite(header, sizeof header, 1, f);
    }
    for (int i = 0; i < n; i++) {
        unsigned char le[2] = {(unsigned char)((7 * i % 1000) & 0xff), (unsigned char)((7 * i % 1000) >> 8)};
        fwrite(le, 2, 1, f);
    }
    fclose(f);
}

static void write_text(const char *name, const char *text, size_t n) {
    FILE *f = fopen(test_path(name), "wb");
    fwrite(text, 1, n, f);
    fclose(f);
}

static corpus_options tokens_of(int format, int vocab) { return (corpus_options){"data.path", format, vocab, "", ""}; }

static void test_token_layouts(void) {
    mkdir(test_path("tok"), 0755);
    write_tokens("tok/a_llmc.bin", 300, 1, 300);
    write_tokens("tok/b_nanogpt.bin", 200, 0, 0);
    corpus c;
    status st;
    corpus_options opt = tokens_of(CORPUS_AUTO, 1000);
    int rc = corpus_open(&c, test_path("tok"), &opt, &st);
    if (!test_check(rc == 0, "tokens: llm.c and nanoGPT files open", rc ? "%s" : NULL, st.message)) return;
    test_check(c.format == CORPUS_TOKENS && c.n_docs == 2 && c.size == 500 && c.separator == 0,
               "tokens: 500 tokens, no separator", "%lld", c.size);
    int32_t ids[4];
    corpus_read(&c, 298, 4, ids); /* the last two of the llm.c file, the first two of nanoGPT's */
    test_check(ids[0] == 7 * 298 % 1000 && ids[1] == 7 * 299 % 1000 && ids[2] == 0 && ids[3] == 7,
               "tokens: ids read back across the file boundary", "%d %d %d %d", ids[0], ids[1], ids[2], ids[3]);
    long long train_end, eval_start;
    corpus_split(&c, 0.4, &train_end, &eval_start);
    test_check(train_end == 300 && eval_start == 300, "tokens: split by whole files, nothing between", NULL);
    corpus_close(&c);

    opt = tokens_of(CORPUS_AUTO, 990); /* 7 * 142 = 994 is the first id out of range */
    rc = corpus_open(&c, test_path("tok/b_nanogpt.bin"), &opt, &st);
    test_check(rc == EXIT_BAD_FILE && strstr(st.message, "b_nanogpt.bin") &&
                   strstr(st.message, "token id 994 at token 142") && strstr(st.message, "byte offset 284"),
               "tokens: an id >= vocab_size refused at open, naming the file and offset", "%s", st.message);
}

static void test_bad_token_files(void) {
    write_tokens("v2.bin", 10, 2, 10);
    write_tokens("short.bin", 10, 1, 11);
    write_text("odd.bin", "abc", 3);
    write_text("plain.txt", "hello world", 11);
    struct {
        const char *name, *why;
        int format, vocab, code;
    } bad[] = {{"v2.bin", "version 2", CORPUS_AUTO, 1000, EXIT_BAD_FILE},
               {"short.bin", "declares 11 tokens", CORPUS_AUTO, 1000, EXIT_BAD_FILE},
               {"odd.bin", "whole number of uint16", CORPUS_AUTO, 1000, EXIT_BAD_FILE},
               {"plain.txt", "model.vocab_size = 256", CORPUS_AUTO, 1000, EXIT_USAGE},
               {"plain.txt", "whole number of uint16", CORPUS_TOKENS, 1000, EXIT_BAD_FILE}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        corpus c;
        status st;
        corpus_options opt = tokens_of(bad[i].format, bad[i].vocab);
        char name[128];
        snprintf(name, sizeof name, "tokens: %s refused (%s)", bad[i].name, bad[i].why);
        int rc = corpus_open(&c, test_path(bad[i].name), &opt, &st);
        test_check(rc == bad[i].code && strstr(st.message, bad[i].name) && strstr(st.message, bad[i].why), name, "%s",
                   st.message);
    }
    corpus c;
    status st;
    corpus_options opt = tokens_of(CORPUS_BYTES, 256); /* data.format = bytes reads a .bin as text */
    test_check(corpus_open(&c, test_path("odd.bin"), &opt, &st) == 0 && c.size == 3, "tokens: bytes reads a .bin",
               NULL);
    corpus_close(&c);
}

static void test_walk(void) {
    mkdir(test_path("w"), 0755);
    mkdir(test_path("w/__pycache__"), 0755);
    write_text("w/a.txt", "first document", 14);
    write_text("w/b.py", "second = 2", 10);
    write_text("w/__pycache__/b.pyc", "compiled", 8);
    write_text("w/bin.dat",
               "\x7f"
               "ELF\0\0",
               6);
    test_check(symlink(test_path("w/gone.txt"), test_path("w/dangling.txt")) == 0, "walk: a dangling link is made",
               NULL);
    corpus c;
    status st;
    corpus_options opt = {"data.path", CORPUS_AUTO, 256, "", "__pycache__/*"};
    int rc = corpus_open(&c, test_path("w"), &opt, &st);
    if (!test_check(rc == 0, "walk: opens despite a dangling link and a binary", rc ? "%s" : NULL, st.message)) return;
    test_check(c.n_docs == 2 && c.n_skipped == 2 && c.size == 14 + 1 + 10,
               "walk: binary and dangling skipped and counted, .pyc excluded", "%d docs, %d skipped", c.n_docs,
               c.n_skipped);
    corpus_close(&c);
    opt = (corpus_options){"data.path", CORPUS_AUTO, 256, "*.py,*.txt", ""};
    test_check(corpus_open(&c, test_path("w"), &opt, &st) == 0 && c.n_docs == 2, "walk: data.include", NULL);
    corpus_close(&c);
    opt = (corpus_options){"data.eval_path", CORPUS_AUTO, 256, "*.md", ""};
    rc = corpus_open(&c, test_path("w"), &opt, &st);
    test_check(rc == EXIT_BAD_FILE && strstr(st.message, "data.eval_path") && strstr(st.message, "data.include"),
               "walk: nothing left is fatal, naming the key and the filters", "%s", st.message);
    write_tokens("w/t.bin", 10, 0, 0);
    opt = (corpus_options){"data.path", CORPUS_AUTO, 256, "", ""};
    rc = corpus_open(&c, test_path("w"), &opt, &st);
    test_check(rc == EXIT_BAD_FILE && strstr(st.message, "among"), "walk: token and text files mixed refused", "%s",
               st.message);
}

int main(void) {
    if (!test_scratch_make("test_token_file")) return test_summary("test_token_file");
    test_token_layouts();
    test_bad_token_files();
    test_walk();
    test_scratch_remove();
    return test_summary("test_token_file");
}
