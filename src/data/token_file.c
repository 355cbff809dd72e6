/* Token files of docs/tasks.md §2; see token_file.h. */
#include "data/token_file.h"

#include <hdf5.h>
#include <stdio.h>
#include <string.h>

#include "base/sys.h"
#include "hdf5/h5kind.h"
#include "hdf5/h5reader.h"

static long long le32(const unsigned char *p) {
    return (long long)(int32_t)((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24);
}

static int ends_with(const char *s, const char *tail) {
    size_t n = strlen(s), m = strlen(tail);
    return n >= m && strcmp(s + n - m, tail) == 0;
}

token_file_kind token_file_detect(int format, const char *path, const unsigned char *head, size_t head_len) {
    if (format == 1) return TOKEN_FILE_TEXT;
    if (head_len >= 4 && le32(head) == TOKEN_FILE_LLMC_MAGIC) return TOKEN_FILE_LLMC;
    if (sys_has_hdf5_signature(head, head_len)) return TOKEN_FILE_HDF5;
    if (format == 2 || ends_with(path, ".bin")) return TOKEN_FILE_NANOGPT;
    return TOKEN_FILE_TEXT;
}

static int llmc_layout(const char *key, const char *path, const unsigned char *head, size_t head_len, long long size,
                       token_file_layout *out, status *st) {
    if (head_len < TOKEN_FILE_LLMC_HEADER)
        return status_fail(st, EXIT_BAD_FILE, "%s = %s: an llm.c token file shorter than its %d-byte header", key, path,
                           TOKEN_FILE_LLMC_HEADER);
    long long version = le32(head + 4), count = le32(head + 8);
    if (version != 1)
        return status_fail(st, EXIT_BAD_FILE, "%s = %s: llm.c header version %lld, expected 1 (uint16 tokens)", key,
                           path, version);
    if (count < 1 || TOKEN_FILE_LLMC_HEADER + 2 * count != size)
        return status_fail(st, EXIT_BAD_FILE,
                           "%s = %s: the llm.c header declares %lld tokens (%lld bytes with the header), the file "
                           "has %lld bytes",
                           key, path, count, TOKEN_FILE_LLMC_HEADER + 2 * count, size);
    *out = (token_file_layout){TOKEN_FILE_LLMC, TOKEN_FILE_LLMC_HEADER, count, 2};
    return 0;
}

/* The HDF5 reader's body: /tokens, 1-D, uint16 or int32 little-endian,
 * contiguous and unfiltered (so its bytes lie in the file as they are and
 * can be mapped), allocated inside the file. */
static void hdf5_body(h5reader *r, void *ctx) {
    token_file_layout *out = ctx;
    int ndim;
    hsize_t dims[H5S_MAX_RANK];
    h5kind_require(r, H5KIND_TOKENS);
    hid_t dset = h5reader_open_dataset(r, "/tokens", &ndim, dims);
    if (ndim != 1) h5reader_fail(r, "/tokens must be 1-D, it has %d dimensions", ndim);
    h5reader_require_integer(r, "/tokens", dset);
    hid_t type = H5Dget_type(dset), dcpl = H5Dget_create_plist(dset);
    size_t width = H5Tget_size(type);
    H5T_sign_t sign = H5Tget_sign(type);
    H5T_order_t order = H5Tget_order(type);
    H5D_layout_t layout = H5Pget_layout(dcpl);
    int filters = H5Pget_nfilters(dcpl);
    H5Tclose(type);
    H5Pclose(dcpl);
    if (!(width == 2 && sign == H5T_SGN_NONE) && !(width == 4 && sign == H5T_SGN_2))
        h5reader_fail(r, "/tokens must be uint16 or int32, not a %s %zu-byte integer",
                      sign == H5T_SGN_NONE ? "unsigned" : "signed", width);
    if (order != H5T_ORDER_LE) h5reader_fail(r, "/tokens must be little-endian");
    if (layout != H5D_CONTIGUOUS || filters != 0)
        h5reader_fail(r, "/tokens is chunked or compressed and cannot be memory-mapped; write it contiguous "
                         "(h5py: no chunks, compression or maxshape)");
    haddr_t offset = H5Dget_offset(dset);
    if (dims[0] == 0 || offset == HADDR_UNDEF) h5reader_fail(r, "/tokens is empty");
    *out = (token_file_layout){TOKEN_FILE_HDF5, (long long)offset, (long long)dims[0], (int)width};
    H5Dclose(dset);
}

int token_file_layout_of(const char *key, const char *path, token_file_kind kind, const unsigned char *head,
                         size_t head_len, long long size, token_file_layout *out, status *st) {
    status_clear(st);
    if (kind == TOKEN_FILE_LLMC) return llmc_layout(key, path, head, head_len, size, out, st);
    if (kind == TOKEN_FILE_NANOGPT) {
        if (size % 2 != 0)
            return status_fail(st, EXIT_BAD_FILE,
                               "%s = %s: %lld bytes is not a whole number of uint16 tokens (nanoGPT's .bin)", key, path,
                               size);
        *out = (token_file_layout){TOKEN_FILE_NANOGPT, 0, size / 2, 2};
        return 0;
    }
    if (h5reader_run(path, "token file", hdf5_body, out, st) != 0) {
        char message[sizeof st->message];
        snprintf(message, sizeof message, "%s", st->message);
        return status_fail(st, EXIT_BAD_FILE, "%s = %s", key, message);
    }
    if (out->offset + out->count * out->width > size)
        return status_fail(st, EXIT_BAD_FILE, "%s = %s: /tokens runs past the end of the file", key, path);
    return 0;
}
