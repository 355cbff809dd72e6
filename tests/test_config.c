/* Config errors come back as a status naming the file, line or key, with the
 * exit code of docs/design.md §8.7, instead of ending the process; every
 * compiled-in default parses (config_defaults relies on it); lines of any
 * length, duplicates, suggestions and range messages (docs/config.md §6);
 * numbers in config_ini in their shortest round-trip form. */
#include <float.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/status.h"
#include "base/suggest.h"
#include "base/sys.h"
#include "config/config.h"
#include "test_util.h"

/* The checks of this file print their detail only when they fail: the name
 * already says what is expected (most are the expected message itself). */

/* Checks an outcome: rc == code, and for a failure the status's code and
 * message. name NULL: the check is named by the expected message. */
static void expect_status(const char *name, int rc, const status *st, int code, const char *message) {
    bool ok = rc == code && (code == 0 || (st->code == code && strcmp(st->message, message) == 0));
    test_check(ok, name ? name : message, ok ? NULL : "expected %d '%s', got %d '%s'", code, message, rc,
               rc ? st->message : "");
}

/* The start of a config text on one line, for a check's name: control and
 * non-ASCII bytes escaped, cut with "..." after about 40 characters. */
static const char *one_line(const char *text) {
    static char out[64];
    size_t j = 0, i = 0;
    for (; text[i] && j < 40; i++) {
        unsigned char ch = (unsigned char)text[i];
        if (ch == '\n') j += (size_t)snprintf(out + j, sizeof out - j, "\\n");
        else if (ch == '\r') j += (size_t)snprintf(out + j, sizeof out - j, "\\r");
        else if (ch < 0x20 || ch >= 0x7f) j += (size_t)snprintf(out + j, sizeof out - j, "\\x%02x", ch);
        else out[j++] = (char)ch;
    }
    snprintf(out + j, sizeof out - j, "%s", text[i] ? "..." : "");
    return out;
}

/* Parses `text` over the defaults; `message` "" expects success. */
static config expect_text(const char *text, const char *message) {
    config c;
    config_defaults(&c);
    status st;
    int rc = config_load_string(&c, text, "t.ini", &st);
    const char *err = st.message;
    if (message[0]) {
        bool ok = rc == EXIT_USAGE && !strcmp(err, message);
        test_check(ok, message, ok ? NULL : "'%.60s': got '%s'", text, rc ? err : "");
    } else {
        char name[96];
        snprintf(name, sizeof name, "parses: %s", one_line(text));
        test_check(rc == 0, name, rc ? "got '%s'" : NULL, err);
    }
    return c;
}

static void expect_override(const char *assignment, const char *message) {
    config c;
    config_defaults(&c);
    status st;
    status_clear(&st);
    expect_status(NULL, config_apply_override(&c, assignment, &st), &st, EXIT_USAGE, message);
}

static char *repeat(char ch, size_t n) {
    char *s = malloc(n + 1);
    memset(s, ch, n);
    s[n] = '\0';
    return s;
}

static void test_statuses(void) {
    status st;
    status_clear(&st);
    expect_status("compiled-in defaults pass config_check_defaults", config_check_defaults(&st), &st, 0, "");
    config c;
    config_defaults(&c);
    expect_status(NULL, config_load_file(&c, "/nonexistent/x.ini", &st), &st, EXIT_USAGE,
                  "/nonexistent/x.ini: cannot open config: No such file or directory");
    expect_status("--set model.d_model=32 accepted", config_apply_override(&c, "model.d_model=32", &st), &st, 0, "");
    test_check(c.d_model == 32, "--set model.d_model=32 sets model.d_model", c.d_model == 32 ? NULL : "%d", c.d_model);
    expect_status(NULL, config_apply_override(&c, "d_model", &st), &st, EXIT_USAGE,
                  "--set d_model: expected section.key=value");
    expect_status(NULL, config_apply_override(&c, "model.nope=1", &st), &st, EXIT_USAGE,
                  "--set unknown key model.nope");
    expect_status(NULL, config_apply_override(&c, "model.d_model=abc", &st), &st, EXIT_USAGE,
                  "--set model.d_model = 'abc': expected an integer");
}

/* A line used to be cut at inih's 200-byte buffer and its tail parsed as a
 * line of its own. */
static void test_long_lines(void) {
    size_t n = 10000;
    char *pad = repeat('x', n), *text = malloc(3 * n);
    snprintf(text, 3 * n, "[train]\n; %s lr = 1000000\nsteps = 5\n", pad);
    config c = expect_text(text, "");
    bool ok = c.lr == 1e-3 && c.steps == 5;
    test_check(ok, "10000-byte comment line ignored", ok ? NULL : "lr %g steps %lld", c.lr, c.steps);
    snprintf(text, 3 * n, "[train]\nlr = 0.5 %*s; %s\n", (int)n, "", pad);
    c = expect_text(text, "");
    test_check(c.lr == 0.5, "value before 10000 blanks and a comment read", c.lr == 0.5 ? NULL : "lr %g", c.lr);
    char *dir = repeat('d', 1000);
    snprintf(text, 3 * n, "[train]\nout_dir = /%s\n", dir);
    c = expect_text(text, "");
    size_t len = strlen(c.out_dir);
    test_check(len == 1001, "1001-byte out_dir read whole", len == 1001 ? NULL : "%zu bytes", len);
    snprintf(text, 3 * n, "[train]\nout_dir = %s\n", pad);
    expect_text(text, "t.ini:2: train.out_dir = "
                      "'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...': longer than 1023 characters");
    /* config_ini of a checkpoint goes through the same h5reader */
    char *ini = config_to_ini(&c);
    config back = expect_text(ini, "");
    bool same =
        config_compare_keys(&c, &back, true, NULL, 0) == 0 && config_compare_keys(&c, &back, false, NULL, 0) == 0;
    test_check(same, "config_ini with a long out_dir reads back", NULL);
    free(ini), free(dir), free(pad), free(text);
}

static void test_syntax(void) {
    expect_text("\xEF\xBB\xBF[model]\r\n  d_model: 32 ; inline\r\n# c\n\n[ fmm ]\nkernels = elu,tanh\n", "");
    expect_text("[train]\nlr = 1\nlr = 2\n", "t.ini:3: duplicate key train.lr (first set at line 2)");
    expect_text("[train]\nlr = 1\n[model]\n\n[train]\n", "t.ini:5: duplicate section [train] (first at line 1)");
    expect_text("[model\n", "t.ini:1: malformed line (expected [section] or key = value): [model");
    expect_text("[model] junk\n", "t.ini:1: malformed line (expected [section] or key = value): [model] junk");
    expect_text("[model]\n= 3\n", "t.ini:2: malformed line (expected [section] or key = value): = 3");
}

static void test_suggestions(void) {
    expect_text("[train]\nlrr = 1\n", "t.ini:2: unknown key train.lrr; did you mean train.lr?");
    expect_text("[train]\nlearning_rate = 1\n", "t.ini:2: unknown key train.learning_rate; did you mean train.lr?");
    expect_text("[model]\nn_head = 2\n", "t.ini:2: unknown key model.n_head; did you mean model.n_heads?");
    expect_text("[momentum]\ngama = 0.5\n", "t.ini:2: unknown key momentum.gama; did you mean momentum.gamma?");
    expect_text("[trian]\nlr = 1\n", "t.ini:2: unknown section [trian] (key lr); did you mean train.lr?");
    expect_text("[modle]\nfoo = 1\n", "t.ini:2: unknown section [modle] (key foo); did you mean [model]?");
    expect_text("[train]\nd_model = 32\n", "t.ini:2: unknown key train.d_model; did you mean model.d_model?");
    expect_text("lr = 1\n", "t.ini:1: key lr is outside any [section]; did you mean train.lr?");
    expect_text("[data]\ntask = chian\n",
                "t.ini:2: data.task = 'chian': not one of the allowed values (allowed: chain|copy|listops|text); "
                "did you mean chain?");
    expect_text("[model]\ncausal = ture\n",
                "t.ini:2: model.causal = 'ture': expected true or false; did you mean true?");
    expect_override("train.lrr=1", "--set unknown key train.lrr; did you mean train.lr?");
    expect_override("learning_rate=3e-4",
                    "--set learning_rate=3e-4: expected section.key=value; did you mean train.lr=3e-4?");
    expect_override("n_heads=2", "--set n_heads=2: expected section.key=value; did you mean model.n_heads=2?");
    int distance = suggest_distance("trian", "train", 2);
    test_check(distance == 1, "suggest_distance(trian, train) = 1", distance == 1 ? NULL : "%d", distance);
    const char *commands[] = {"train", "init", "loss", "eval", "inspect", "generate", "bench"};
    test_check(suggest_closest("trian", commands, 7) == commands[0], "suggest_closest: trian -> train", NULL);
    test_check(suggest_closest("fly", commands, 7) == NULL, "suggest_closest: fly has no suggestion", NULL);
}

/* train.steps' range and why (docs/config.md §6). */
#define STEPS_RANGE \
    "must be in [0, 9007199254740992]: steps are stored as doubles in the metric tables, exact up to 2^53"
#define BETA_RANGE                                                                                                    \
    "must be in (-1, 1): |beta| < 1: the velocity p_t = d_t + beta p_(t-1) grows as beta^t otherwise, and the first " \
    "step's loss is NaN at T = 512 for beta = 2"

static void test_limits(void) {
    expect_text("[train]\nsteps = -5\n", "t.ini:2: train.steps = -5 is out of range: " STEPS_RANGE);
    /* open limits: |beta| < 1, 1 and -1 included in the refusal */
    expect_text("[momentum]\nbeta = 2\n", "t.ini:2: momentum.beta = 2 is out of range: " BETA_RANGE);
    expect_text("[momentum]\nbeta = 1\n", "t.ini:2: momentum.beta = 1 is out of range: " BETA_RANGE);
    expect_text("[momentum]\nbeta = -1\n", "t.ini:2: momentum.beta = -1 is out of range: " BETA_RANGE);
    expect_text("[momentum]\nbeta = -0.999\n", "");
    expect_text("[model]\nn_heads = 0\n", "t.ini:2: model.n_heads = 0 is out of range: must be in [1, 4096]");
    expect_text("[model]\nn_layers = 99999999999999999999\n",
                "t.ini:2: model.n_layers = 99999999999999999999 is out of range: must be in [1, 4096]");
    expect_text("[model]\nn_classes = 1\n", "t.ini:2: model.n_classes = 1 is out of range: must be in [2, 1048576]");
    expect_text("[train]\nadam_eps = 0\n",
                "t.ini:2: train.adam_eps = 0 is out of range: must be >= 1e-30 (at most 1e+18): 0 would make "
                "0/0 of a sum whose terms all underflow");
    expect_override("train.steps=-5", "--set train.steps = -5 is out of range: " STEPS_RANGE);
    /* the chain's fillers (docs/tasks.md §2): a rate below 1, or no chain token would be left */
    expect_text("[data]\nchain_noise = 0.95\n",
                "t.ini:2: data.chain_noise = 0.95 is out of range: must be in [0, 0.9]");
    expect_text("[data]\nchain_noise = -0.1\n",
                "t.ini:2: data.chain_noise = -0.1 is out of range: must be in [0, 0.9]");
    expect_override("data.chain_len_max=-1", "--set data.chain_len_max = -1 is out of range: must be in [0, 16777216]");
    expect_override("data.chain_fillers=0", "--set data.chain_fillers = 0 is out of range: must be in [1, 16777216]");
    config c = expect_text("[model]\nhead = cls\nn_classes = 5\n[data]\ntask = listops\n", "");
    status st;
    const char *want = "t.ini: model.n_classes = 5 is below the 10 classes of data.task = listops";
    bool ok = config_check(&c, "t.ini", &st) == EXIT_USAGE && !strcmp(st.message, want);
    test_check(ok, want, ok ? NULL : "got '%s'", st.message);
}

/* fmm.kernels, a list key (docs/config.md §6): `want` is one letter per name
 * (e = elu, f = elu_flip, t = tanh) on success, else the refused item. */
static void expect_kernels(const char *value, bool good, const char *want) {
    config c;
    config_defaults(&c);
    char assignment[128], joined[16] = "", message[256], name[128];
    snprintf(assignment, sizeof assignment, "fmm.kernels=%s", value);
    status st;
    int rc = config_apply_override(&c, assignment, &st);
    for (int i = 0; rc == 0 && i < c.fmm_kernels.n; i++) strncat(joined, &"eft"[c.fmm_kernels.items[i]], 1);
    /* --set strips the blanks around the value, as a file's line does */
    char stripped[128];
    snprintf(stripped, sizeof stripped, "%s", value + strspn(value, " "));
    for (size_t n = strlen(stripped); n > 0 && stripped[n - 1] == ' ';) stripped[--n] = '\0';
    snprintf(message, sizeof message, "--set fmm.kernels = '%s': '%s' is not one of", stripped, want);
    if (good) {
        snprintf(name, sizeof name, "fmm.kernels '%s' accepted as '%s'", value, want);
        bool ok = rc == 0 && !strcmp(joined, want);
        test_check(ok, name, ok ? NULL : "got '%s' (%s)", joined, rc ? st.message : "");
    } else {
        snprintf(name, sizeof name, "fmm.kernels '%s' refused, naming '%s'", value, want);
        bool ok = rc == EXIT_USAGE && !strncmp(st.message, message, strlen(message));
        test_check(ok, name, ok ? NULL : "got '%s'", rc ? st.message : "accepted");
    }
}

static void test_lists(void) {
    expect_kernels("", true, "");
    expect_kernels("   ", true, "");
    expect_kernels("elu", true, "e");
    expect_kernels("elu,elu_flip", true, "ef");
    expect_kernels(" tanh , elu_flip,elu ", true, "tfe");
    expect_kernels("elu,elu,elu,elu,elu,elu,elu,tanh", true, "eeeeeeet");
    expect_kernels("elu,foo", false, "foo");
    expect_kernels(" gelu ", false, "gelu");
    expect_kernels("ELU", false, "ELU");
    expect_kernels("elu,,tanh", false, "");
    expect_kernels("elu,", false, "");
    expect_kernels("elu,elu,elu,elu,elu,elu,elu,elu,tanh", false, "tanh");
    expect_kernels("elu,elu_fl1p", false, "elu_fl1p");
    /* the canonical text in config_ini, read back to the same list */
    config c;
    config_defaults(&c);
    status st;
    int rc = config_apply_override(&c, "fmm.kernels= tanh ,elu", &st);
    test_check(rc == 0, "--set fmm.kernels= tanh ,elu accepted", rc ? "%s" : NULL, st.message);
    char *ini = config_to_ini(&c);
    bool written = strstr(ini, "kernels = tanh,elu\n") != NULL;
    test_check(written, "config_ini writes kernels = tanh,elu", written ? NULL : "config_ini:\n%s", ini);
    config back = expect_text(ini, "");
    test_check(back.fmm_kernels.n == 2 && back.fmm_kernels.items[0] == 2 && back.fmm_kernels.items[1] == 0,
               "fmm.kernels reads back from config_ini", NULL);
    free(ini);
}

static void test_shortest_numbers(void) {
    static const struct {
        double x;
        const char *text;
    } cases[] = {{0.1, "0.1"},
                 {0.2, "0.2"},
                 {1e-6, "1e-06"},
                 {3e-4, "0.0003"},
                 {1.0 / 3, "0.3333333333333333"},
                 {1e300, "1e+300"},
                 {4.9406564584124654e-324, "5e-324"},
                 {-0.0, "-0"},
                 {10000, "10000"},
                 {0.999999999, "0.999999999"},
                 {1e18, "1e+18"},
                 {1048576, "1048576"},
                 {DBL_MIN / 3, "7.41691286169067e-309"},
                 {DBL_MAX, "1.7976931348623157e+308"}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char out[32];
        config_format_double(cases[i].x, out, sizeof out);
        char name[64];
        snprintf(name, sizeof name, "shortest round-trip form: %s", cases[i].text);
        bool ok = !strcmp(out, cases[i].text) && strtod(out, NULL) == cases[i].x;
        test_check(ok, name, ok ? NULL : "%.17g written as '%s'", cases[i].x, out);
    }
    config c;
    config_defaults(&c);
    c.lr = 0.2, c.gamma = 1.0 / 3;
    char *ini = config_to_ini(&c);
    bool shortest =
        strstr(ini, "lr = 0.2\n") && strstr(ini, "gamma = 0.3333333333333333\n") && strstr(ini, "eps = 1e-06\n");
    test_check(shortest, "config_ini writes numbers in their shortest form", shortest ? NULL : "config_ini:\n%s", ini);
    config back = expect_text(ini, "");
    test_check(back.lr == c.lr && back.gamma == c.gamma, "config_ini numbers read back", NULL);
    free(ini);
}

/* A string through config_to_ini and back (docs/config.md §6, escaping):
 * data.path set to s, the INI text parsed over the defaults; true when the
 * value read back is s. */
static bool round_trips(const char *s, char *got, size_t len) {
    config c;
    config_defaults(&c);
    snprintf(c.data_path, sizeof c.data_path, "%s", s);
    snprintf(c.out_dir, sizeof c.out_dir, "%s", s);
    char *ini = config_to_ini(&c);
    config back;
    config_defaults(&back);
    status st;
    int rc = config_load_string(&back, ini, "config_ini", &st);
    free(ini);
    snprintf(got, len, "%s", rc ? st.message : back.data_path);
    return rc == 0 && !strcmp(back.data_path, s) && !strcmp(back.out_dir, s);
}

/* The property: any string of bytes 1..255 (no NUL, which a C string cannot
 * hold) reads back identically, over a seeded random sample weighted
 * towards the bytes the syntax gives a meaning to. */
static void test_escaping_property(void) {
    static const char special[] = " \t\n\r\"\\;#=:[]\x01\x1f\x7f\x80\xc3\xa9\xef\xbb\xbf\xff";
    uint64_t x = 0x9E3779B97F4A7C15ULL;
    int failed = 0, cases = 4000;
    char first_bad[128] = "", got[CONFIG_VALUE_MAX];
    for (int n = 0; n < cases; n++) {
        char s[CONFIG_PATH_MAX];
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        size_t len = n < 100 ? (size_t)n % 8 : (size_t)(x % 64), big = n % 500 == 499 ? CONFIG_PATH_MAX - 1 : len;
        for (size_t i = 0; i < big; i++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            unsigned char b = (x >> 8) % 3 == 0 ? (unsigned char)(1 + (x >> 16) % 255)
                                                : (unsigned char)special[(x >> 16) % (sizeof special - 1)];
            s[i] = (char)b;
        }
        s[big] = '\0';
        if (!round_trips(s, got, sizeof got) && failed++ == 0)
            snprintf(first_bad, sizeof first_bad, "'%s' read back as '%s'", one_line(s), one_line(got));
    }
    test_check(failed == 0, "random strings read back identically from config_ini", "%d cases, %d failed %s", cases,
               failed, first_bad);
    static const char *named[] = {"a\nb",  "run ;x",      "run #x",   " lead",       "trail\t",
                                  "\"q\"", "back\\slash", "\xff\xfe", "caf\xc3\xa9", "\x7f",
                                  "=",     "[x]",         "\\x41",    "\"",          ""};
    for (size_t i = 0; i < sizeof named / sizeof named[0]; i++) {
        char name[96];
        snprintf(name, sizeof name, "round trip: '%s'", one_line(named[i]));
        bool ok = round_trips(named[i], got, sizeof got);
        test_check(ok, name, ok ? NULL : "got '%s'", one_line(got));
    }
    /* the escaped form: one line, quoted only when needed, old files' plain values unchanged */
    config c;
    config_defaults(&c);
    snprintf(c.data_path, sizeof c.data_path, "%s", "a\nb ;c\x01");
    snprintf(c.out_dir, sizeof c.out_dir, "%s", "runs/plain");
    char *ini = config_to_ini(&c);
    bool quoted = strstr(ini, "path = \"a\\nb ;c\\x01\"\n") && strstr(ini, "out_dir = runs/plain\n");
    test_check(quoted, "config_ini quotes and escapes only the values that need it", quoted ? NULL : "%s", ini);
    free(ini);
}

static void test_quoted_values(void) {
    config c = expect_text("[data]\npath = \"a;b\" ; comment\n", "");
    test_check(!strcmp(c.data_path, "a;b"), "a quoted value keeps its ';'", "%s", c.data_path);
    c = expect_text("[data]\npath = \" x\\ty\\\\ \\\"z\\\" \\x41\\;\\#\"\n", "");
    test_check(!strcmp(c.data_path, " x\ty\\ \"z\" A;#"), "escapes decoded", "'%s'", one_line(c.data_path));
    c = expect_text("[data]\npath = plain\"quote\\n\n", "");
    test_check(!strcmp(c.data_path, "plain\"quote\\n"), "an unquoted value is verbatim", "'%s'", c.data_path);
    c = expect_text("[train]\nlr = 0.5 # a comment\nsteps = 7# not one\n", "t.ini:3: train.steps = '7# not one': "
                                                                           "expected an integer");
    c = expect_text("[train]\nlr = 0.5 # a comment\n", "");
    test_check(c.lr == 0.5, "'#' after a blank starts a comment", "lr %g", c.lr);
    expect_text("[data]\npath = \"abc\n", "t.ini:2: data.path = \"abc: bad quoted value: no closing quote");
    expect_text("[data]\npath = \"a\\qb\"\n",
                "t.ini:2: data.path = \"a\\qb\": bad quoted value: unknown escape \\q (known: \\n \\t \\r \\\\ \\\" "
                "\\; \\# \\xNN)");
    expect_text("[data]\npath = \"a\\x00b\"\n",
                "t.ini:2: data.path = \"a\\x00b\": bad quoted value: \\x00: a value cannot hold a NUL byte");
    expect_text("[data]\npath = \"a\" b\n", "t.ini:2: data.path = \"a\" b: bad quoted value: text after the closing "
                                            "quote");
    expect_text("[data]\npath = \"a\\x4\"\n", "t.ini:2: data.path = \"a\\x4\": bad quoted value: \\x needs two hex "
                                              "digits");
    /* control bytes of a value are shown escaped */
    expect_text("[train]\nsteps = 1\x1b[2J\n", "t.ini:2: train.steps = '1\\x1b[2J': expected an integer");
}

static void test_override_syntax(void) {
    config c;
    config_defaults(&c);
    status st;
    int rc = config_apply_override(&c, " train . lr = 0.01 ", &st);
    test_check(rc == 0 && c.lr == 0.01, "--set ' train . lr = 0.01 ' sets train.lr", "%s", rc ? st.message : "");
    rc = config_apply_override(&c, "data.path=\" spaced \"", &st);
    test_check(rc == 0 && !strcmp(c.data_path, " spaced "), "--set takes a quoted value", "'%s'", c.data_path);
    rc = config_apply_override(&c, "data.path=a ;b", &st);
    test_check(rc == 0 && !strcmp(c.data_path, "a ;b"), "--set: ';' does not start a comment", "'%s'", c.data_path);
    expect_override(
        "train.weight_decay=1e400",
        "--set train.weight_decay = 1e400 is out of range: beyond what a double holds (must be >= 0 (at most 1e+18))");
    expect_override(
        "train.weight_decay=1e-400",
        "--set train.weight_decay = 1e-400 is out of range: beyond what a double holds (must be >= 0 (at most 1e+18))");
    expect_override("train.steps=99999999999999999999",
                    "--set train.steps = 99999999999999999999 is out of range: " STEPS_RANGE);
    expect_override("train.lrr = 1", "--set unknown key train.lrr; did you mean train.lr?");
    expect_override("lr\x07=1", "--set lr\\x07=1: expected section.key=value");
}

static void test_resolved_path(void) {
    char cwd[CONFIG_PATH_MAX], want[3 * CONFIG_PATH_MAX];
    if (!getcwd(cwd, sizeof cwd)) return;
    config c;
    config_defaults(&c);
    status st;
    snprintf(c.data_path, sizeof c.data_path, "%s", "corpus.txt,/abs/b,sub/c");
    int rc = config_resolve_data_path(&c, false, &st);
    snprintf(want, sizeof want, "%s/corpus.txt,/abs/b,%s/sub/c", cwd, cwd);
    test_check(rc == 0 && !strcmp(c.data_resolved, want), "data.resolved_path: each relative item made absolute",
               "'%s'", c.data_resolved);
    test_check(!strcmp(config_data_source(&c), want), "the data modules read data.resolved_path", NULL);
    snprintf(c.data_resolved, sizeof c.data_resolved, "%s", "/recorded/corpus.txt");
    rc = config_resolve_data_path(&c, true, &st);
    test_check(rc == 0 && !strcmp(c.data_resolved, "/recorded/corpus.txt"), "a checkpoint's resolved path is kept",
               "'%s'", c.data_resolved);
    rc = config_resolve_data_path(&c, false, &st);
    test_check(rc == 0 && !strcmp(c.data_resolved, want), "a new run resolves data.path again", "'%s'",
               c.data_resolved);
    config other = c;
    snprintf(other.data_resolved, sizeof other.data_resolved, "%s", "/elsewhere/corpus.txt");
    char diff[4096];
    int n = config_compare_keys(&c, &other, true, diff, sizeof diff);
    test_check(n == 1 && strstr(diff, "data.resolved_path"), "another resolved path is a data key that must match",
               "%s", diff);
    other = c;
    snprintf(other.data_path, sizeof other.data_path, "%s", "./corpus.txt,/abs/b,sub/c");
    test_check(config_compare_keys(&c, &other, true, NULL, 0) == 0,
               "the same files under another spelling of data.path: no data key differs", NULL);
    n = config_first_difference(&c, &other, diff, sizeof diff);
    test_check(n == 1 && !strcmp(diff, "data.path = corpus.txt,/abs/b,sub/c vs ./corpus.txt,/abs/b,sub/c"),
               "config_first_difference names the key and both values", "%d '%s'", n, diff);
    snprintf(c.eval_path, sizeof c.eval_path, "%s", "val");
    rc = config_resolve_data_path(&c, false, &st);
    snprintf(want, sizeof want, "%s/val", cwd);
    test_check(rc == 0 && !strcmp(config_eval_source(&c), want), "data.eval_path resolved as data.path is", "'%s'",
               c.eval_resolved);
    config_defaults(&c);
    rc = config_resolve_data_path(&c, false, &st);
    test_check(rc == 0 && !c.data_resolved[0] && !c.eval_resolved[0], "no data.path: no resolved path", NULL);
}

/* The text task's keys: bytes needs V = 256; the corpus keys belong to text. */
static void test_text_keys(void) {
    struct {
        const char *text, *want;
    } bad[] = {
        {"[model]\nvocab_size = 300\n[data]\ntask = text\npath = x\nformat = bytes\n",
         "t.ini: data.format = bytes is byte-level and needs model.vocab_size = 256"},
        {"[data]\neval_path = v.bin\n",
         "t.ini: data.eval_path, data.format, data.include, data.exclude and data.tokenizer are for data.task = text"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        config c = expect_text(bad[i].text, "");
        status st;
        bool ok = config_check(&c, "t.ini", &st) == EXIT_USAGE && !strcmp(st.message, bad[i].want);
        test_check(ok, bad[i].want, ok ? NULL : "got '%s'", st.message);
    }
    config c = expect_text("[model]\nvocab_size = 50304\n[data]\ntask = text\npath = x.bin\n", "");
    status st;
    test_check(config_check(&c, "t.ini", &st) == 0, "text at vocab_size 50304 (token files) accepted", "%s",
               st.message);
}

int main(void) {
    test_statuses();
    test_long_lines();
    test_syntax();
    test_suggestions();
    test_limits();
    test_shortest_numbers();
    test_lists();
    test_escaping_property();
    test_quoted_values();
    test_override_syntax();
    test_resolved_path();
    test_text_keys();
    return test_summary("test_config");
}
