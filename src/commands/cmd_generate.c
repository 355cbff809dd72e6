/* The `generate` command (docs/cli.md §5): a prompt of token ids (--prompt) or of
 * text bytes (--text, byte-level models) continued through streaming
 * inference (docs/design.md §8.6), greedy or sampled (temperature, top-k,
 * top-p, seed), past model.max_seq_len through the stream's sliding window
 * (docs/model.md, streaming), until --tokens or the --stop byte sequence.
 * Every rank computes the same continuation (the sampler's random numbers
 * depend only on the seed and the position), and rank 0 prints it. */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/rng.h"
#include "base/status.h"
#include "base/sys.h"
#include "commands/cmd_common.h"
#include "commands/commands.h"
#include "config/ini.h"
#include "data/tokenizer.h"
#include "model/stream.h"
#include "parallel/dist.h"
#include "store/checkpoint.h"
#include "store/store.h"

#define BYTE_VOCAB 256

static int parse_prompt(const char *text, int vocab, int32_t **out) {
    int n = 0, cap = 16;
    int32_t *tokens = sys_calloc((size_t)cap, sizeof(int32_t));
    for (const char *p = text; *p;) {
        while (*p == ',' || isspace((unsigned char)*p)) p++;
        if (!*p) break;
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v >= vocab)
            cmd_fail_all(EXIT_USAGE, "--prompt: '%.20s' is not a token in [0, %d)", p, vocab);
        if (n == cap) tokens = sys_realloc(tokens, sizeof(int32_t) * (size_t)(cap *= 2));
        tokens[n++] = (int32_t)v;
        p = end;
    }
    if (n == 0) cmd_fail_all(EXIT_USAGE, "--prompt: no tokens");
    *out = tokens;
    return n;
}

/* The bytes of --stop, with the escapes of a quoted config value (\n, \t,
 * \r, \\, \xNN ...; docs/config.md §6), decoded strictly by the one
 * decoder (ini_unescape): a malformed escape or an empty stop string, which
 * would never match and so never stop, exits 2 before the model is loaded.
 * Returns the count; *out is allocated. */
static int parse_stop(const char *text, int32_t **out) {
    char *bytes = strdup(text), why[160];
    status st; /* status_fail shows the value's control bytes as \xNN */
    if (ini_unescape(bytes, why, sizeof why) != 0) {
        status_fail(&st, EXIT_USAGE, "--stop '%.60s': %s", text, why);
        cmd_fail_all(st.code, "%s", st.message);
    }
    int n = (int)strlen(bytes);
    if (n == 0) cmd_fail_all(EXIT_USAGE, "--stop '': an empty stop string never matches; leave --stop out instead");
    *out = sys_calloc((size_t)n, sizeof(int32_t));
    for (int i = 0; i < n; i++) (*out)[i] = (unsigned char)bytes[i];
    free(bytes);
    return n;
}

/* ---- text output: valid UTF-8 as it is, anything else escaped ---------- */

/* Length of the valid UTF-8 sequence at b (n bytes available): 1..4, 0 when
 * it is invalid, -1 when it is a valid but incomplete prefix. */
static int utf8_length(const unsigned char *b, int n) {
    if (b[0] < 0x80) return 1;
    int len = b[0] >= 0xC2 && b[0] <= 0xDF   ? 2
              : b[0] >= 0xE0 && b[0] <= 0xEF ? 3
              : b[0] >= 0xF0 && b[0] <= 0xF4 ? 4
                                             : 0;
    if (len == 0) return 0;
    for (int i = 1; i < len; i++) {
        if (i >= n) return -1;
        unsigned char lo = 0x80, hi = 0xBF; /* no overlong forms, surrogates or code points past U+10FFFF */
        if (i == 1 && b[0] == 0xE0) lo = 0xA0;
        if (i == 1 && b[0] == 0xED) hi = 0x9F;
        if (i == 1 && b[0] == 0xF0) lo = 0x90;
        if (i == 1 && b[0] == 0xF4) hi = 0x8F;
        if (b[i] < lo || b[i] > hi) return 0;
    }
    return len;
}

/* Prints bytes [0, n) as text and returns how many were printed: control
 * bytes other than \n and \t and bytes that are not UTF-8 as \xNN; without
 * `final`, an incomplete sequence at the end waits for more bytes. */
static int print_text(const unsigned char *b, int n, bool final) {
    int i = 0;
    while (i < n) {
        int len = utf8_length(b + i, n - i);
        if (len < 0 && !final) break;
        bool control = len == 1 && ((b[i] < 0x20 && b[i] != '\n' && b[i] != '\t') || b[i] == 0x7F);
        if (len <= 0 || control) {
            printf("\\x%02X", b[i]);
            i++;
        } else {
            fwrite(b + i, 1, (size_t)len, stdout);
            i += len;
        }
    }
    log_flush();
    return i;
}

/* ---- sampling ------------------------------------------------------------ */

typedef struct {
    float logit;
    int index;
} ranked_token;

static int by_logit_descending(const void *a, const void *b) {
    const ranked_token *x = a, *y = b;
    if (x->logit != y->logit) return x->logit < y->logit ? 1 : -1;
    return x->index - y->index; /* ties in a fixed order: the same choice on every rank */
}

/* Greedy at temperature 0 or top-k 1; else a draw from softmax(z / T) over
 * the top-k tokens, cut to the smallest set holding top-p of the mass. */
static int32_t sample_next(const float *logits, int V, const command_generate_options *o, ranked_token *ranked,
                           uint64_t key, uint64_t counter) {
    int best = 0;
    for (int v = 1; v < V; v++) best = logits[v] > logits[best] ? v : best;
    if (o->temperature <= 0 || o->top_k == 1) return best;
    for (int v = 0; v < V; v++) ranked[v] = (ranked_token){logits[v], v};
    qsort(ranked, (size_t)V, sizeof *ranked, by_logit_descending);
    int kept = o->top_k > 0 && o->top_k < V ? o->top_k : V;
    double total = 0;
    for (int i = 0; i < kept; i++) total += exp((ranked[i].logit - ranked[0].logit) / o->temperature);
    double mass = 0, cut = o->top_p * total;
    int within = 0;
    while (within < kept && (within == 0 || mass < cut))
        mass += exp((ranked[within++].logit - ranked[0].logit) / o->temperature);
    double u = rng_uniform(key, counter) * mass;
    for (int i = 0; i < within; i++) {
        double w = exp((ranked[i].logit - ranked[0].logit) / o->temperature);
        if (u < w) return ranked[i].index;
        u -= w;
    }
    return ranked[within - 1].index;
}

/* ---- the stream ------------------------------------------------------------ */

/* Feeds n tokens; a full cache first slides to keep the newest capacity - 1
 * positions (docs/model.md, streaming). Returns the logits of the last token. */
static const float *feed(model *m, stream_state *st, const int32_t *tokens, int n, float *logits) {
    status err;
    int piece = 0;
    for (int done = 0; done < n; done += piece) {
        if (st->pos == st->capacity) stream_slide(m, st, st->capacity - 1);
        piece = n - done;
        if (piece > st->capacity - st->pos) piece = st->capacity - st->pos;
        if (piece > st->n_max) piece = st->n_max;
        if (stream_forward(m, st, tokens + done, piece, logits, &err)) cmd_fail(err.code, "%s", err.message);
    }
    return logits + (size_t)(piece - 1) * m->V;
}

static bool ends_with(const int32_t *tokens, int n, const int32_t *stop, int n_stop) {
    return n_stop > 0 && n >= n_stop && memcmp(tokens + n - n_stop, stop, sizeof(int32_t) * (size_t)n_stop) == 0;
}

static int read_prompt(const command_generate_options *o, const model *m, int32_t **tokens) {
    if (!o->prompt == !o->text)
        cmd_fail_all(EXIT_USAGE, "generate: give exactly one of --prompt TOKENS and --text TEXT");
    if (o->prompt) return parse_prompt(o->prompt, m->V, tokens);
    if (m->V != BYTE_VOCAB)
        cmd_fail_all(EXIT_USAGE,
                     "--text needs a byte-level model (model.vocab_size = %d), but this one has vocab_size = %d",
                     BYTE_VOCAB, m->V);
    int n = (int)strlen(o->text);
    if (n == 0) cmd_fail_all(EXIT_USAGE, "--text: empty prompt");
    *tokens = sys_calloc((size_t)n, sizeof(int32_t));
    for (int i = 0; i < n; i++) (*tokens)[i] = (unsigned char)o->text[i];
    return n;
}

/* A token model trained with data.tokenizer (docs/tasks.md §2) also prints
 * the text of prompt and continuation, decoded with that model when it is
 * still the one the run recorded; else a note says why not. */
static void print_decoded(const char *ckpt, const model *m, const int32_t *prompt, int n_prompt, const int32_t *out,
                          int n_out) {
    const config *c = &m->cfg;
    if (!c->tokenizer[0] || dist_rank() != 0) return;
    tokenizer t;
    status st;
    char now[17] = "";
    /* the model the checkpoint carries, else the file data.tokenizer names */
    if (checkpoint_read_tokenizer(ckpt, &t, &st) == 0 && t.n_pieces == 0) tokenizer_open(&t, c->tokenizer, &st);
    if (t.n_pieces > 0) tokenizer_checksum_text(t.checksum, now);
    if (!now[0] || (c->tokenizer_checksum[0] && strcmp(now, c->tokenizer_checksum) != 0)) {
        printf("text: not decoded: %s\n", now[0] ? "data.tokenizer has changed since the run (checksum)" : st.message);
        if (now[0]) tokenizer_free(&t);
        return;
    }
    size_t n = 0, cap = 64;
    unsigned char *bytes = sys_calloc(cap, 1);
    for (int i = 0; i < n_prompt + n_out; i++) {
        int id = i < n_prompt ? prompt[i] : out[i - n_prompt];
        int len = id < t.n_pieces ? t.length[id] : 0;
        while (n + (size_t)len > cap) bytes = sys_realloc(bytes, cap *= 2);
        if (len) memcpy(bytes + n, t.text[id], (size_t)len);
        n += (size_t)len;
    }
    printf("text: ");
    print_text(bytes, (int)n, true);
    printf("\n");
    free(bytes);
    tokenizer_free(&t);
}

int command_generate(const char *ckpt, const command_generate_options *o) {
    model m;
    status err;
    char path[STORE_PATH_MAX];
    int32_t *stop = NULL;
    int n_stop = o->stop ? parse_stop(o->stop, &stop) : 0;
    command_load_run_checkpoint(ckpt, &m, path, sizeof path, NULL);
    int32_t *prompt;
    int n_prompt = read_prompt(o, &m, &prompt);
    long long total = (long long)n_prompt + o->n_tokens;
    int capacity = total < m.rope_positions ? (int)total : m.rope_positions; /* the window */
    int n_max = n_prompt < capacity ? n_prompt : capacity;
    stream_state st;
    if (stream_create(&st, &m, 1, capacity, n_max, &err)) cmd_fail_all(err.code, "%s", err.message);
    float *logits = sys_calloc((size_t)n_max * m.V, sizeof(float));
    ranked_token *ranked = sys_calloc((size_t)m.V, sizeof(ranked_token));
    int32_t *out = sys_calloc((size_t)o->n_tokens, sizeof(int32_t));
    bool text = o->text != NULL, rank0 = dist_rank() == 0;
    unsigned char *bytes = sys_calloc((size_t)n_prompt + o->n_tokens, 1);
    int n_bytes = 0, printed = 0;
    if (text) {
        for (int i = 0; i < n_prompt; i++) bytes[n_bytes++] = (unsigned char)prompt[i];
        if (rank0) printed = print_text(bytes, n_bytes, false);
    } else {
        log_rank0("prompt:");
        for (int i = 0; i < n_prompt; i++) log_rank0(" %d", prompt[i]);
        log_rank0("\ngenerated:");
    }
    const float *last = feed(&m, &st, prompt, n_prompt, logits);
    uint64_t key = rng_key((uint64_t)o->seed, 0x6E4, 0, 0);
    int n_generated = 0;
    for (int i = 0; i < o->n_tokens; i++) {
        out[i] = sample_next(last, m.V, o, ranked, key, (uint64_t)i);
        n_generated = i + 1;
        if (text) {
            bytes[n_bytes++] = (unsigned char)out[i];
            if (rank0) printed += print_text(bytes + printed, n_bytes - printed, false);
        } else {
            log_rank0(" %d", out[i]);
        }
        if (i + 1 == o->n_tokens || ends_with(out, i + 1, stop, n_stop)) break;
        last = feed(&m, &st, &out[i], 1, logits);
    }
    if (text && rank0) print_text(bytes + printed, n_bytes - printed, true);
    log_rank0("\n");
    if (!text) print_decoded(path, &m, prompt, n_prompt, out, n_generated);
    free(bytes), free(out), free(ranked), free(logits), free(stop), free(prompt);
    stream_free(&st);
    model_free(&m);
    return 0;
}
