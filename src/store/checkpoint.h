/* HDF5 files of docs/files.md §4: checkpoints and gradient files. The
 * file format only: where checkpoints go, their names and temporary names
 * are the store's (store.h, docs/design.md §8.4). Every function returns 0,
 * or an exit code (EXIT_BAD_FILE) with a message naming the file and the
 * problem in err (which may be NULL). */
#ifndef MOMFMM_CHECKPOINT_H
#define MOMFMM_CHECKPOINT_H
#include <stdbool.h>

#include "base/status.h"
#include "config/config.h"
#include "data/metrics.h"
#include "data/tokenizer.h"
#include "hdf5/h5writer.h"
#include "model/model.h"

#define CHECKPOINT_FORMAT "momfmm-checkpoint"
#define CHECKPOINT_FORMAT_VERSION 1

typedef struct {
    long long step, tokens_seen;
    int world_size;
    char init_from[CONFIG_PATH_MAX]; /* root attribute init_from: the --init checkpoint, or "" */
    long long skipped_steps;         /* root attribute, absent in older files (0) */
    /* root attribute gemm_engines (train.gemm = auto's engine per product
     * class, gemm_class_engines_format), or "" */
    char gemm_engines[128];
    /* Read only: root attribute momfmm_version, the build that wrote the file ("" when absent:
     * older files, files written by h5py). A write records this build's (build_info.h). */
    char written_by[128];
    /* Write only: the bytes of data.tokenizer's model, written as /tokenizer
     * (tokenizer_from_checkpoint reads it back), or NULL. */
    const unsigned char *tokenizer_model;
    size_t tokenizer_size;
} checkpoint_info;

/* Writes the docs/files.md §4 layout to `path` atomically: into `tmp` (a name in the
 * same directory, the same on every writer), flushed, fsync'ed, renamed to
 * `path`, directory fsync'ed. Metrics tables may be NULL. On a failure the
 * previous file under `path`, if any, is left as it was.
 * Who writes (docs/scale.md §7): with H5WRITER_ALONE the calling rank holds
 * the whole state and writes the file by itself. With H5WRITER_TOGETHER or
 * H5WRITER_COLLECTIVE every rank calls with the same arguments (ZeRO-1:
 * each holds only its slice of the moments, m->moment_first ...); the file
 * is opened through parallel HDF5 (MPI-IO), every rank writes the same
 * attributes and its slice of /model and /optim/m|v, with independent
 * (TOGETHER) or collective (COLLECTIVE, dist.collective_io) data
 * transfers, rank 0 the buffers and metrics; rank 0 renames the file into
 * place once all have closed it, and every rank returns the same outcome. */
int checkpoint_write(const char *path, const char *tmp, const model *m, const checkpoint_info *info,
                     const metric_table *train, const metric_table *eval, h5writer_mode writers, status *err);

/* About the bytes checkpoint_write takes for this state: the tensors,
 * buffers, metric rows, /tokenizer and config_ini, and HDF5's headers (about
 * 1 KiB per dataset): named when a write fails for want of space. */
double checkpoint_size_estimate(const model *m, const checkpoint_info *info, const metric_table *train,
                                const metric_table *eval);

/* The resolved config of a checkpoint (root attribute config_ini) and its info. */
int checkpoint_read_config(const char *path, config *c, checkpoint_info *info, status *err);

/* Fills parameters and buffers of a model created from that config; with
 * `optimizer` also /optim (only the model's moment range: a ZeRO-1 rank reads
 * its slice as hyperslabs, docs/scale.md §7), with tables also /metrics. A missing dataset or a
 * wrong shape names both. */
int checkpoint_read_state(const char *path, model *m, bool optimizer, metric_table *train, metric_table *eval,
                          status *err);

/* Only the /metrics tables (built for the checkpoint's config, as
 * checkpoint_read_state's): e.g. the history of best.h5. */
int checkpoint_read_metrics(const char *path, metric_table *train, metric_table *eval, status *err);

/* The sentencepiece model a checkpoint carries as /tokenizer (docs/files.md
 * §4), checked as every load checks it (whole, and the one config_ini's
 * data.tokenizer_checksum records): 0 with t->n_pieces = 0 when it carries
 * none; EXIT_BAD_FILE and a status otherwise. */
int checkpoint_read_tokenizer(const char *path, tokenizer *t, status *err);

/* A model created from a checkpoint's config (with gradients and moments
 * when `training`, else model_create_for_inference) holding its weights and
 * buffers: what loss and generate need. On a failure m is freed. */
int checkpoint_load_model(const char *path, model *m, bool training, status *err);

/* A run's metrics.h5 (live_metrics.h), which the run may still be writing
 * (opened for SWMR reading): the config of root attribute config_ini and
 * the standard tables (metric_tables_standard) with the rows that every
 * column holds. The caller frees the tables, also after a failure. */
int checkpoint_read_metrics_file(const char *path, config *c, metric_table *train, metric_table *eval, status *err);

/* /grads/<name> for every parameter, root attribute loss; atomically
 * through `tmp` as checkpoint_write. */
int checkpoint_write_grads(const char *path, const char *tmp, const model *m, double loss, status *err);
#endif
