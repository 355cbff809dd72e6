/* The logits file of `momfmm logits` (docs/cli.md §5, docs/files.md §4); see
 * logits_file.h. Written through the atomic writer. */
#include "store/logits_file.h"

#include <hdf5.h>
#include <stdio.h>

#include "base/build_info.h"
#include "hdf5/h5util.h"
#include "hdf5/h5writer.h"

typedef struct {
    const float *logits;
    int ndim;
    hsize_t dims[3];
    const logits_file_source *source;
} logits_content;

static herr_t write_logits_content(const h5writer *w, const void *ctx) {
    const logits_content *c = ctx;
    hid_t file = w->file;
    herr_t st = 0;
    st |= h5util_write_string_attr(file, "checkpoint", c->source->checkpoint);
    st |= h5util_write_attr(file, "step", H5T_NATIVE_LLONG, H5T_STD_I64LE, &c->source->step);
    st |= h5util_write_attr(file, "tokens_seen", H5T_NATIVE_LLONG, H5T_STD_I64LE, &c->source->tokens_seen);
    st |= h5util_write_string_attr(file, "momfmm_version", build_description());
    if (h5writer_agree(w, st < 0 ? -1 : 0) < 0) return -1;
    return h5writer_dataset(w, "/logits", H5T_NATIVE_FLOAT, H5T_IEEE_F32LE, c->ndim, c->dims, c->logits);
}

int logits_file_write(const char *path, const char *tmp, const float *logits, int ndim, int B, int T, int width,
                      const logits_file_source *source, status *err) {
    logits_content c = {logits, ndim, {(hsize_t)B, ndim == 3 ? (hsize_t)T : (hsize_t)width, (hsize_t)width}, source};
    return h5writer_run(path, tmp, H5WRITER_ALONE, write_logits_content, &c, err);
}
