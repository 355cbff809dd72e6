/* The chain task's generator (docs/tasks.md §2 `chain`); see chain.h. Counter
 * ranges of one sample's key, kept apart so that no draw moves another:
 * chain tokens 0, 1, ...; data.noise 2^40 + 2t (+1); fillers 2^41 + 2t (+1);
 * the period 2^42. Without chain_len_max and chain_noise the samples are
 * those of the fixed-period task before they existed, bit for bit
 * (tests/test_data.c pins them). */
#include "data/chain.h"

#include <stdlib.h>

#include "base/rng.h"
#include "base/sys.h"

#define NOISE_COUNTERS (1ULL << 40)
#define FILLER_COUNTERS (1ULL << 41)
#define PERIOD_COUNTER (1ULL << 42)

struct chain_sampler {
    config cfg;
    int32_t *chain;      /* the drawn chain tokens: at most seq_len + 1 are reached */
    uint64_t *seen;      /* bitmap of the chain tokens drawn so far */
    int32_t *sequence;   /* x_0 .. x_T */
    unsigned char *fill; /* 1 where x_t is a filler */
};

static int upper(int lo, int max) { return max > lo ? max : lo; }

chain_periods chain_periods_of(const config *c, bool length_eval) {
    if (length_eval) return (chain_periods){c->eval_chain_len, upper(c->eval_chain_len, c->eval_chain_len_max)};
    return (chain_periods){c->chain_len, upper(c->chain_len, c->chain_len_max)};
}

int chain_period(uint64_t key, chain_periods p) {
    if (p.hi <= p.lo) return p.lo;
    return p.lo + (int)rng_below(key, PERIOD_COUNTER, (uint32_t)(p.hi - p.lo + 1));
}

/* The first filler token: V - data.chain_fillers with data.chain_noise > 0
 * (chain tokens lie below it), else V (no fillers). */
static int chain_first_filler(const config *c) {
    return c->chain_noise > 0 ? c->vocab_size - c->chain_fillers : c->vocab_size;
}

chain_sampler *chain_open(const config *c) {
    chain_sampler *s = sys_calloc(1, sizeof *s);
    s->cfg = *c;
    size_t len = (size_t)c->seq_len + 1;
    s->chain = sys_calloc(len, sizeof(int32_t));
    s->seen = sys_calloc(((size_t)c->vocab_size + 63) / 64, sizeof(uint64_t));
    s->sequence = sys_calloc(len, sizeof(int32_t));
    s->fill = sys_calloc(len, 1);
    return s;
}

void chain_close(chain_sampler *s) {
    if (!s) return;
    free(s->chain);
    free(s->seen);
    free(s->sequence);
    free(s->fill);
    free(s);
}

/* `drawn` distinct tokens below `range`: token i is below(key, n, range) with
 * n a running counter, a repeat redrawn with the next counter. A bitmap of
 * the tokens drawn so far makes it O(drawn), not O(drawn^2). */
static void draw_chain(chain_sampler *s, uint64_t key, int drawn, int range) {
    uint64_t counter = 0;
    for (int i = 0; i < drawn; i++) {
        uint32_t token;
        do token = rng_below(key, counter++, (uint32_t)range);
        while (s->seen[token / 64] >> (token % 64) & 1);
        s->seen[token / 64] |= 1ULL << (token % 64);
        s->chain[i] = (int32_t)token;
    }
    for (int i = 0; i < drawn; i++) s->seen[s->chain[i] / 64] = 0; /* clear for the next sample */
}

/* x_0 .. x_{len-1}: at each position a filler with probability chain_noise,
 * else the next chain token m (c_{m mod L}), which data.noise replaces from
 * the second pass on (m >= L; without fillers m = t, as before). */
static void lay_out(chain_sampler *s, uint64_t key, int L, int len) {
    const config *c = &s->cfg;
    int first_filler = chain_first_filler(c);
    long long m = 0;
    for (int t = 0; t < len; t++) {
        uint64_t at = 2 * (uint64_t)t;
        s->fill[t] = c->chain_noise > 0 && rng_uniform(key, FILLER_COUNTERS + at) < c->chain_noise;
        if (s->fill[t]) {
            s->sequence[t] =
                first_filler + (int32_t)rng_below(key, FILLER_COUNTERS + at + 1, (uint32_t)c->chain_fillers);
            continue;
        }
        s->sequence[t] = s->chain[m % L];
        if (m >= L && c->noise > 0 && rng_uniform(key, NOISE_COUNTERS + at) < c->noise)
            s->sequence[t] = (int32_t)rng_below(key, NOISE_COUNTERS + at + 1, (uint32_t)c->vocab_size);
        m++;
    }
}

void chain_sample(chain_sampler *s, uint64_t key, chain_periods p, int32_t *inputs, int32_t *targets, int T) {
    int L = chain_period(key, p), len = T + 1;
    /* only the chain tokens a sample can reach are drawn: token i's draws depend on the tokens before it alone */
    draw_chain(s, key, L < len ? L : len, chain_first_filler(&s->cfg));
    lay_out(s, key, L, len);
    for (int t = 0; t < T; t++) {
        inputs[t] = s->sequence[t];
        targets[t] = s->fill[t + 1] ? -1 : s->sequence[t + 1];
    }
}
