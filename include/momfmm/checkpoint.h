/* HDF5 files of SPEC 4: checkpoints, token files and gradient files. */
#ifndef MOMFMM_CHECKPOINT_H
#define MOMFMM_CHECKPOINT_H
#include <stdbool.h>

#include "momfmm/config.h"
#include "momfmm/data.h"
#include "momfmm/metrics.h"
#include "momfmm/model.h"

#define CHECKPOINT_FORMAT "momfmm-checkpoint"
#define CHECKPOINT_FORMAT_VERSION 1

typedef struct {
    long long step, tokens_seen;
    int world_size;
} checkpoint_info;

/* Writes the SPEC 4 layout to `path` atomically: a temporary name in the
 * same directory, flushed, fsync'ed, renamed, directory fsync'ed. Metrics
 * tables may be NULL. Returns 0, or -1 with a message in err (the previous
 * file under `path`, if any, is left as it was). */
int checkpoint_write(const char *path, const model *m, const checkpoint_info *info,
                     const metric_table *train, const metric_table *eval, char *err, size_t err_len);

/* Reads the resolved config of a checkpoint (root attribute config_ini) and
 * its info. Exits 3 naming the file and the problem. */
void checkpoint_read_config(const char *path, config *c, checkpoint_info *info);

/* Fills parameters and buffers of a model created from that config; with
 * `optimizer` also /optim, with tables also /metrics. Exits 3 on a missing
 * dataset or a wrong shape, naming both. */
void checkpoint_read_state(const char *path, model *m, bool optimizer, metric_table *train,
                           metric_table *eval);

/* A model created from a checkpoint's config with its weights and buffers
 * (SPEC 4: what loss and generate need). Exits 3 on a bad file. */
void checkpoint_load_model(const char *path, model *m);

/* The same two reads without exiting: 0, or -1 with a message naming the
 * file and the problem (--resume auto skips a checkpoint that fails). */
int checkpoint_try_read_config(const char *path, config *c, checkpoint_info *info, char *err, size_t err_len);
int checkpoint_try_read_state(const char *path, model *m, bool optimizer, metric_table *train, metric_table *eval,
                              char *err, size_t err_len);

/* Token file (SPEC 4): /inputs, /targets int32 [B,T], /labels [B] for cls.
 * Exits 3 on a problem, 3 also for tokens out of the vocabulary. */
void tokens_read(const char *path, const model *m, batch *b);

/* /grads/<name> for every parameter, root attribute loss. */
int grads_write(const char *path, const model *m, double loss, char *err, size_t err_len);
#endif
