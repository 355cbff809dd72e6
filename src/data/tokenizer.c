/* sentencepiece models of docs/tasks.md §2 (tokenizer); see tokenizer.h. The
 * model file is a protobuf ModelProto: field 1 (repeated) is a SentencePiece
 * message with field 1 the piece (string) and field 3 its type (varint:
 * 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte). */
#include "data/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/sys.h"
#include "hdf5/h5reader.h"
#include "parallel/dist.h"

enum { PIECE_NORMAL = 1, PIECE_USER_DEFINED = 4, PIECE_BYTE = 6 };
#define MAX_MODEL_BYTES (64L << 20)

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
    if (msg->bad || !piece) return -1;
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

static int parse(tokenizer *t, const unsigned char *bytes, size_t n) {
    reader r = {bytes, bytes + n, 0};
    while (r.at < r.end && !r.bad) {
        uint64_t key = varint(&r);
        if (key != (1 << 3 | 2)) {
            skip(&r, (int)(key & 7));
            continue;
        }
        uint64_t len = varint(&r);
        if (r.bad || len > (uint64_t)(r.end - r.at)) return -1;
        reader msg = {r.at, r.at + len, 0};
        if (add_piece(t, &msg) != 0) return -1;
        r.at += len;
    }
    return r.bad || t->n_pieces == 0 ? -1 : 0;
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
    int rc = n == 0 || n != size ? -1 : parse(t, bytes, n);
    t->checksum = dist_checksum(bytes, n);
    t->model = bytes;
    t->model_size = n;
    if (rc != 0) {
        tokenizer_free(t);
        return status_fail(st, EXIT_BAD_FILE, "data.tokenizer = %s: not a sentencepiece model (momfmm-tokenize train)",
                           path);
    }
    return 0;
}

void tokenizer_free(tokenizer *t) {
    for (int i = 0; i < t->n_pieces; i++) free(t->text[i]);
    free(t->text);
    free(t->length);
    free(t->model);
    memset(t, 0, sizeof *t);
}

/* The reader's body: /tokenizer, 1-D unsigned bytes, below the model limit. */
static void checkpoint_body(h5reader *r, void *ctx) {
    tokenizer *t = ctx;
    if (!h5reader_exists(r, "/tokenizer")) return;
    int ndim;
    hsize_t dims[H5S_MAX_RANK];
    hid_t dset = h5reader_open_dataset(r, "/tokenizer", &ndim, dims);
    h5reader_require_integer(r, "/tokenizer", dset);
    H5Dclose(dset);
    if (ndim != 1 || dims[0] == 0 || dims[0] >= MAX_MODEL_BYTES)
        h5reader_fail(r, "/tokenizer must hold the bytes of a sentencepiece model (1-D, below %ld MiB)",
                      MAX_MODEL_BYTES >> 20);
    t->model_size = (size_t)dims[0];
    t->model = sys_calloc(t->model_size, 1);
    h5reader_read_checked(r, "/tokenizer", H5T_NATIVE_UCHAR, 1, dims, t->model);
}

int tokenizer_from_checkpoint(tokenizer *t, const char *path, status *st) {
    memset(t, 0, sizeof *t);
    if (h5reader_run(path, "checkpoint", checkpoint_body, t, st) != 0 || !t->model) {
        free(t->model);
        memset(t, 0, sizeof *t);
        return st->code;
    }
    t->checksum = dist_checksum(t->model, t->model_size);
    if (parse(t, t->model, t->model_size) != 0) {
        tokenizer_free(t);
        return status_fail(st, EXIT_BAD_FILE, "%s: /tokenizer is not a sentencepiece model", path);
    }
    return 0;
}

void tokenizer_checksum_text(uint64_t checksum, char out[17]) {
    snprintf(out, 17, "%016llx", (unsigned long long)checksum);
}
