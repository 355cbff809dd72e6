/* Every numeric key's documented range trains, or is refused with a message
 * that says why (docs/config.md §6): the key table walked at both limits of
 * every numeric key (just inside an open one), on a tiny softmax and a tiny
 * FMM model with momentum on, each accepted config created as a trainer
 * and stepped three times; a loss or gradient norm that is not finite fails
 * the check. A value just outside each limit is refused naming the key.
 * The memory a run may take is held to 32 MiB (MOMFMM_TEST_MEMORY_AVAILABLE),
 * so that a limit whose model cannot fit (4096 layers, d_ff 2^20, 2^24
 * positions) is refused by the trainer's memory check, as on a machine that
 * small, instead of taking gigabytes and minutes here. */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/status.h"
#include "base/sys.h"
#include "config/config.h"
#include "test_util.h"
#include "training/train.h"

#define STEPS 3

/* A tiny chain run; `fmm` selects the FMM attention with both far-field
 * feature maps, and momentum is on (order 2) so that every momentum key acts. */
static config tiny(bool fmm) {
    static const char *sets[] = {
        "model.vocab_size=16", "model.d_model=8",   "model.n_heads=2",     "model.n_layers=1",    "model.d_ff=16",
        "data.seq_len=8",      "data.chain_len=3",  "train.batch_size=2",  "train.steps=10",      "train.gemm=openblas",
        "momentum.gamma=0.5",  "momentum.beta=0.5", "momentum.gamma2=0.1", "fmm.kernels=elu,tanh"};
    config c;
    status st;
    config_defaults(&c);
    for (size_t i = 0; i < sizeof sets / sizeof sets[0]; i++) config_apply_override(&c, sets[i], &st);
    if (fmm) config_apply_override(&c, "attention.kind=fmm", &st);
    return c;
}

/* "section.key=value", integers as integers, doubles in full. */
static void assignment(const config_numeric_key *k, double v, char *out, size_t len) {
    if (k->integer) snprintf(out, len, "%s=%.0f", k->name, v);
    else snprintf(out, len, "%s=%.17g", k->name, v);
}

/* Trains STEPS steps of `c`: "" when every loss and gradient norm is
 * finite, or what went wrong in `why`. A refusal (config check, trainer)
 * with a message is an answer too: *refused names it. */
static bool trains(const config *c, char *why, size_t len, bool *refused) {
    status st;
    *refused = false;
    if (config_check(c, "test", &st) != 0) {
        *refused = st.code == EXIT_USAGE && st.message[0];
        snprintf(why, len, "refused: %s", st.message);
        return *refused;
    }
    trainer t;
    if (trainer_create(&t, c, TRAINER_FRESH, &st) != 0) { /* left as it is: the program exits after a refusal */
        *refused = (st.code == EXIT_USAGE || st.code == EXIT_BAD_FILE) && st.message[0];
        snprintf(why, len, "refused by the trainer: %s", st.message);
        return *refused;
    }
    bool finite = true;
    for (int s = 0; s < STEPS && s < c->steps && finite; s++) {
        train_step_result r;
        if (trainer_step(&t, &r, &st) != 0) {
            snprintf(why, len, "step %d failed: %s", s + 1, st.message);
            finite = false;
        } else if (r.nonfinite || !isfinite(r.loss) || !isfinite(r.grad_norm)) {
            snprintf(why, len, "step %d: loss %g, grad_norm %g", s + 1, r.loss, r.grad_norm);
            finite = false;
        }
    }
    if (finite) snprintf(why, len, "trains");
    trainer_free(&t);
    return finite;
}

static void walk_limit(const config_numeric_key *k, double v, bool fmm) {
    config c = tiny(fmm);
    status st;
    char set[128], name[160], why[1100];
    assignment(k, v, set, sizeof set);
    snprintf(name, sizeof name, "%s %s", fmm ? "fmm" : "softmax", set);
    if (config_apply_override(&c, set, &st) != 0) {
        test_check(false, name, "the documented limit is refused: %s", st.message);
        return;
    }
    bool refused, ok = trains(&c, why, sizeof why, &refused);
    test_check(ok, name, "%.300s", why);
}

/* Just outside the range: refused, naming the key and its range. */
static void walk_outside(const config_numeric_key *k, double v) {
    if (!isfinite(v)) return;
    config c = tiny(false);
    status st;
    char set[128], name[160];
    assignment(k, v, set, sizeof set);
    snprintf(name, sizeof name, "outside: %s refused", set);
    int rc = config_apply_override(&c, set, &st);
    bool ok = rc == EXIT_USAGE && strstr(st.message, k->name) && strstr(st.message, "out of range");
    test_check(ok, name, ok ? NULL : "%s", rc ? st.message : "accepted");
}

int main(void) {
    setenv("MOMFMM_TEST_MEMORY_AVAILABLE", "33554432", 1); /* 32 MiB: see the top */
    log_set_rank(1);                                       /* the trainer's start-up lines are not this test's */
    config_numeric_key k;
    size_t n = 0;
    for (size_t i = 0; config_numeric_key_at(i, &k); i++, n++) {
        /* an open limit is walked just inside it; 1e18 is an open end (docs/config.md §6) */
        double lo = k.exclusive ? nextafter(k.min, k.max) : k.min, hi = k.exclusive ? nextafter(k.max, k.min) : k.max;
        for (int fmm = 0; fmm < 2; fmm++) {
            walk_limit(&k, lo, fmm);
            walk_limit(&k, hi, fmm);
        }
        /* a step that survives rounding at the limit (2^53 + 1 is 2^53 as a double) */
        double below = k.integer ? fmax(1, fabs(k.min) * 1e-15) : fmax(fabs(k.min) * 1e-6, 1e-9);
        double above = k.integer ? fmax(1, fabs(k.max) * 1e-15) : fmax(fabs(k.max) * 1e-6, 1e-9);
        walk_outside(&k, k.exclusive ? k.min : k.min - below);
        walk_outside(&k, k.exclusive ? k.max : k.max + above);
    }
    test_check(n > 40, "the key table's numeric keys were walked", "%zu keys", n);
    return test_summary("test_ranges");
}
