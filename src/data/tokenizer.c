/* sentencepiece models of docs/tasks.md §2 (tokenizer); see tokenizer.h. The
 * model file is a protobuf ModelProto: field 1 (repeated) is a SentencePiece
 * message with field 1 the piece (string) and field 3 its type (varint:
 * 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte); field
 * 2 the TrainerSpec, whose field 4 is vocab_size; field 3 the
 * NormalizerSpec. sentencepiece writes them in that order, so a file cut
 * anywhere either cuts a field (its length runs past the end) or loses the
 * specs: a model is taken only whole. */
#include "data/tokenizer.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/sys.h"
#include "parallel/dist.h"

enum { PIECE_NORMAL = 1, PIECE_USER_DEFINED = 4, PIECE_BYTE = 6 };
#define MAX_MODEL_BYTES (64L << 20)
#define CONFIG_ORIGIN_MAX 1100 /* "data.tokenizer = " and a path */

typedef struct {
    const unsigned char *at, *end;
    int bad;
} reader;

static uint64_t varint(reader *r) {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (r->at >= r->end) break;
        unsigned char b = *r->at++;
        v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80)) return v;
    }
    r->bad = 1;
    return 0;
}

/* Skips a field of wire type `wire`; a length past the end is a bad file. */
static void skip(reader *r, int wire) {
    uint64_t n = wire == 0 ? (varint(r), 0) : wire == 1 ? 8 : wire == 5 ? 4 : wire == 2 ? varint(r) : (r->bad = 1);
    if (n > (uint64_t)(r->end - r->at)) r->bad = 1;
    else r->at += n;
}

/* The bytes a piece decodes to: "▁" (U+2581) is a space, "<0xNN>" of a
 * byte piece the byte, control and unknown pieces nothing. */
static int decode_piece(const unsigned char *p, size_t n, int type, unsigned char *out) {
    if (type == PIECE_BYTE) {
        unsigned v;
        char hex[8] = "";
        memcpy(hex, p, n < 7 ? n : 7);
        if (n != 6 || sscanf(hex, "<0x%2X>", &v) != 1) return -1;
        out[0] = (unsigned char)v;
        return 1;
    }
    if (type != PIECE_NORMAL && type != PIECE_USER_DEFINED) return 0;
    int len = 0;
    for (size_t i = 0; i < n; i++) {
        if (i + 2 < n && p[i] == 0xe2 && p[i + 1] == 0x96 && p[i + 2] == 0x81) {
            out[len++] = ' ';
            i += 2;
        } else {
            out[len++] = p[i];
        }
    }
    return len;
}

static int add_piece(tokenizer *t, reader *msg) {
    const unsigned char *piece = NULL;
    size_t piece_len = 0;
    int type = PIECE_NORMAL;
    while (msg->at < msg->end && !msg->bad) {
        uint64_t key = varint(msg);
        if (key == (1 << 3 | 2)) {
            piece_len = (size_t)varint(msg);
            if (piece_len > (size_t)(msg->end - msg->at)) return -1;
            piece = msg->at;
            msg->at += piece_len;
        } else if (key == (3 << 3 | 0)) {
            type = (int)varint(msg);
        } else {
            skip(msg, (int)(key & 7));
        }
    }
    if (msg->bad || !piece || type < 1 || type > PIECE_BYTE) return -1;
    unsigned char *text = sys_calloc(piece_len + 1, 1);
    int len = decode_piece(piece, piece_len, type, text);
    if (len < 0) {
        free(text);
        return -1;
    }
    t->length = sys_realloc(t->length, sizeof(int) * (size_t)(t->n_pieces + 1));
    t->text = sys_realloc(t->text, sizeof(unsigned char *) * (size_t)(t->n_pieces + 1));
    t->length[t->n_pieces] = len;
    t->text[t->n_pieces++] = text;
    return 0;
}

/* TrainerSpec's vocab_size (field 4), or 0 when absent; -1 when the message is bad. */
static long long trainer_vocab_size(reader msg) {
    long long vocab = 0;
    while (msg.at < msg.end && !msg.bad) {
        uint64_t key = varint(&msg);
        if (key == (4 << 3 | 0)) vocab = (long long)varint(&msg);
        else skip(&msg, (int)(key & 7));
    }
    return msg.bad ? -1 : vocab;
}

/* The whole ModelProto: 0, or -1 with why it is not a model in `why`. */
static int parse(tokenizer *t, const unsigned char *bytes, size_t n, char *why, size_t len) {
    reader r = {bytes, bytes + n, 0};
    long long vocab = -2; /* -2: no TrainerSpec */
    bool normalizer = false;
    const char *bad = NULL;
    while (r.at < r.end && !r.bad && !bad) {
        uint64_t key = varint(&r);
        int field = (int)(key >> 3), wire = (int)(key & 7);
        uint64_t size = !r.bad && field > 0 && wire == 2 && field <= 3 ? varint(&r) : 0;
        if (r.bad || field == 0) bad = "a malformed field (not a protobuf message)";
        else if (wire != 2 || field > 3) skip(&r, wire);
        else if (size > (uint64_t)(r.end - r.at)) bad = "a field runs past the end of the file (truncated?)";
        else {
            reader msg = {r.at, r.at + size, 0};
            if (field == 1 && add_piece(t, &msg) != 0) bad = "a malformed piece";
            if (field == 2 && (vocab = trainer_vocab_size(msg)) < 0) bad = "a malformed trainer_spec";
            normalizer |= field == 3;
            r.at += size;
        }
    }
    if (!bad && r.bad) bad = "a field runs past the end of the file (truncated?)";
    if (!bad && t->n_pieces == 0) bad = "no pieces";
    if (!bad && (vocab == -2 || !normalizer)) bad = "no trainer_spec or normalizer_spec after the pieces (truncated?)";
    if (bad) snprintf(why, len, "%s", bad);
    else if (vocab > 0 && vocab != t->n_pieces)
        snprintf(why, len, "%d pieces, but its trainer_spec says vocab_size = %lld (truncated?)", t->n_pieces, vocab);
    else return 0;
    return -1;
}

int tokenizer_from_bytes(tokenizer *t, unsigned char *bytes, size_t n, const char *origin, status *st) {
    memset(t, 0, sizeof *t);
    t->model = bytes;
    t->model_size = n;
    t->checksum = dist_checksum(bytes, n);
    char why[128];
    bool hdf5 = sys_has_hdf5_signature(bytes, n); /* a checkpoint given as data.tokenizer, say */
    snprintf(why, sizeof why, "%s", n == 0 ? "empty" : hdf5 ? "an HDF5 file" : "above 64 MiB");
    if (n > 0 && !hdf5 && n < MAX_MODEL_BYTES && parse(t, bytes, n, why, sizeof why) == 0) return 0;
    tokenizer_free(t);
    return status_fail(st, EXIT_BAD_FILE, "%s: not a sentencepiece model (momfmm-tokenize train): %s", origin, why);
}

int tokenizer_open(tokenizer *t, const char *path, status *st) {
    memset(t, 0, sizeof *t);
    status_clear(st);
    int fd = sys_open_file(path, SYS_READ, "data.tokenizer", st);
    if (fd < 0) return st->code;
    struct stat s;
    size_t size = fstat(fd, &s) == 0 && s.st_size > 0 && s.st_size < MAX_MODEL_BYTES ? (size_t)s.st_size : 0;
    unsigned char *bytes = sys_calloc(size + 1, 1);
    size_t n = 0;
    for (ssize_t got = 1; n < size && got > 0; n += got > 0 ? (size_t)got : 0) got = read(fd, bytes + n, size - n);
    close(fd);
    char origin[CONFIG_ORIGIN_MAX];
    snprintf(origin, sizeof origin, "data.tokenizer = %s", path);
    return tokenizer_from_bytes(t, bytes, n == size ? n : 0, origin, st);
}

void tokenizer_free(tokenizer *t) {
    for (int i = 0; i < t->n_pieces; i++) free(t->text[i]);
    free(t->text);
    free(t->length);
    free(t->model);
    memset(t, 0, sizeof *t);
}

void tokenizer_checksum_text(uint64_t checksum, char out[17]) {
    snprintf(out, 17, "%016llx", (unsigned long long)checksum);
}
