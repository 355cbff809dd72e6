/* The run directory's names (docs/files.md §4, checkpoint names;
 * docs/design.md §8.4): the one rule of store_checkpoint_step in a table at
 * its limits and against an independent oracle over random names; the
 * listing ordered by value (step 10^8 has nine digits) over random widths;
 * the temporaries a run removes at its start, and only those. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/rng.h"
#include "store/store.h"
#include "test_util.h"

static void touch(const char *name) {
    FILE *f = fopen(test_path(name), "w");
    if (f) fclose(f);
}

static const struct {
    const char *name;
    bool checkpoint;
    long long step;
} NAMES[] = {
    {"ckpt_00000600.h5", true, 600},
    {"ckpt_600.h5", false, 0},
    {"ckpt_000000600.h5", false, 0},
    {"ckpt_0.h5", false, 0},
    {"ckpt_00000000.h5", true, 0},
    {"ckpt_99999999.h5", true, 99999999},
    {"ckpt_100000000.h5", true, 100000000},
    {"ckpt_9223372036854775807.h5", true, 9223372036854775807LL},
    {"ckpt_00000000000000000009223372036854775807.h5", false, 0},
    {"ckpt_0100000000.h5", false, 0},
    {"ckpt_9223372036854775808.h5", false, 0},
    {"ckpt_99999999999999999999.h5", false, 0},
    {"ckpt_-1.h5", false, 0},
    {"ckpt_+1.h5", false, 0},
    {"ckpt_ 1.h5", false, 0},
    {"ckpt_1e3.h5", false, 0},
    {"ckpt_0x10.h5", false, 0},
    {"ckpt_.h5", false, 0},
    {"ckpt_1.h5.tmp.42", false, 0},
    {"ckpt_1.h5x", false, 0},
    {"ckpt_1.H5", false, 0},
    {"Ckpt_1.h5", false, 0},
    {"ckpt_1", false, 0},
    {"best.h5", false, 0},
    {"", false, 0},
};

static void test_name_table(void) {
    for (size_t i = 0; i < sizeof NAMES / sizeof NAMES[0]; i++) {
        long long step = -1;
        bool is = store_checkpoint_step(NAMES[i].name, &step);
        char name[96];
        snprintf(name, sizeof name, "'%s': %s", NAMES[i].name, NAMES[i].checkpoint ? "a checkpoint" : "not one");
        bool ok = is == NAMES[i].checkpoint && (!is || step == NAMES[i].step);
        test_check(ok, name, ok ? NULL : "got %d, step %lld", is, step);
    }
}

/* The rule written another way: the digits compared as text against
 * LLONG_MAX's, after their leading zeros. */
static bool oracle(const char *name, long long *step) {
    size_t n = strlen(name);
    if (n < 9 || strncmp(name, "ckpt_", 5) != 0 || strcmp(name + n - 3, ".h5") != 0) return false;
    const char *digits = name + 5, *end = name + n - 3;
    if (digits == end) return false;
    for (const char *p = digits; p < end; p++)
        if (*p < '0' || *p > '9') return false;
    size_t len = (size_t)(end - digits);
    if (len < 8 || (len > 8 && *digits == '0')) return false; /* %08lld: 8 digits, more without a leading zero */
    if (len > 19 || (len == 19 && strncmp(digits, "9223372036854775807", 19) > 0)) return false;
    *step = 0;
    for (const char *p = digits; p < end; p++) *step = *step * 10 + (*p - '0');
    return true;
}

/* Random names near the rule: the prefix, a run of characters that are
 * mostly digits (sometimes a sign, a letter, a blank, 15-25 of them), the
 * suffix, each part sometimes damaged. */
static void random_name(uint64_t key, char *out, size_t len) {
    static const char *prefixes[] = {"ckpt_", "ckpt_", "ckpt_", "ckpt", "ckpt__", "ckp_"};
    static const char *suffixes[] = {".h5", ".h5", ".h5", ".h5.tmp.1", ".h", ".h55", ""};
    static const char alphabet[] = "0123456789012345678901234567890123456789-+e x";
    uint64_t c = 0;
    size_t used = (size_t)snprintf(out, len, "%s", prefixes[rng_u64(key, c++) % 6]);
    int digits = rng_u64(key, c++) % 3 ? 8 + (int)(rng_u64(key, c++) % 4) : (int)(rng_u64(key, c++) % 26);
    for (int i = 0; i < digits && used + 1 < len; i++)
        out[used++] = alphabet[rng_u64(key, c++) % (sizeof alphabet - 1)];
    out[used] = '\0';
    snprintf(out + used, len - used, "%s", suffixes[rng_u64(key, c++) % 7]);
}

static void test_name_property(void) {
    int agree = 0, checkpoints = 0, n = 20000;
    char name[96], first_bad[96] = "";
    for (int i = 0; i < n; i++) {
        random_name(rng_key(51, 0, 0, (uint64_t)i), name, sizeof name);
        long long got = -1, want = -1;
        bool is = store_checkpoint_step(name, &got), expected = oracle(name, &want);
        checkpoints += expected;
        if (is == expected && (!is || got == want)) agree++;
        else if (!first_bad[0]) snprintf(first_bad, sizeof first_bad, "%s", name);
    }
    test_check(agree == n, "20000 random names: the rule agrees with the oracle", agree == n ? NULL : "first: '%s'",
               first_bad);
    test_check(checkpoints > n / 50, "  and a fair share of them are checkpoints", "%d", checkpoints);
}

/* store_list orders by value whatever the widths (step 10^8 has nine digits). */
static void test_listing_order(void) {
    mkdir(test_path("order"), 0755);
    long long steps[] = {7, 99999999, 100000000, 1000000000, 5, 123456789012LL, 0};
    for (size_t i = 0; i < sizeof steps / sizeof steps[0]; i++) {
        char name[64];
        snprintf(name, sizeof name, "order/ckpt_%08lld.h5", steps[i]);
        touch(name);
    }
    touch("order/ckpt_5.h5"); /* not the name of step 5 */
    touch("order/ckpt_1e3.h5");
    touch("order/ckpt_-1.h5");
    store_listing l;
    store_list(test_path("order"), &l);
    bool sorted = l.n == 7;
    long long previous = -1;
    for (int i = 0; i < l.n && sorted; i++) {
        long long step;
        sorted = store_checkpoint_step(strrchr(l.paths[i], '/') + 1, &step) && step >= previous;
        previous = step;
    }
    test_check(sorted, "listing: 7 checkpoints of 8 to 12 digits, oldest first by value", "%d listed, newest %s", l.n,
               l.n ? strrchr(l.paths[l.n - 1], '/') + 1 : "-");
    test_check(l.n == 7 && strstr(l.paths[6], "ckpt_123456789012.h5"), "listing: the newest is step 123456789012",
               NULL);
    store_listing_free(&l);
}

/* A run's start removes exactly the temporaries of interrupted writes. */
static void test_stale_temporaries(void) {
    const char *stale[] = {"ckpt_00000004.h5.tmp.123", "ckpt_100000000.h5.tmp.9", "best.h5.tmp.77"};
    const char *kept[] = {"ckpt_00000004.h5",
                          "ckpt_4.h5.tmp.",
                          "ckpt_4.h5.tmp.x1",
                          "ckpt_x.h5.tmp.1",
                          "notes.tmp.1",
                          "best.h5.tmp.-1",
                          "ckpt_99999999999999999999.h5.tmp.1"};
    mkdir(test_path("run"), 0755);
    char name[128];
    for (size_t i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "run/%s", stale[i]);
        touch(name);
    }
    for (size_t i = 0; i < sizeof kept / sizeof kept[0]; i++) {
        snprintf(name, sizeof name, "run/%s", kept[i]);
        touch(name);
    }
    status st;
    int rc = store_open_run(test_path("run"), true, false, &st);
    test_check(rc == 0, "a run opens the directory", rc ? "%s" : NULL, st.message);
    int removed = 0, left = 0;
    for (size_t i = 0; i < 3; i++) {
        snprintf(name, sizeof name, "run/%s", stale[i]);
        removed += access(test_path(name), F_OK) != 0;
    }
    for (size_t i = 0; i < sizeof kept / sizeof kept[0]; i++) {
        snprintf(name, sizeof name, "run/%s", kept[i]);
        left += access(test_path(name), F_OK) == 0;
    }
    test_check(removed == 3, "start: the 3 temporaries of interrupted writes are removed", "%d", removed);
    test_check(left == 7, "start: the 7 names that are not temporaries are kept", "%d", left);
}

int main(void) {
    if (!test_scratch_make("test_store")) return test_summary("test_store");
    test_name_table();
    test_name_property();
    test_listing_order();
    test_stale_temporaries();
    test_scratch_remove();
    return test_summary("test_store");
}
