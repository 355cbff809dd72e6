/* metrics.h5 in the run directory (docs/files.md §4): the /metrics
 * tables of docs/files.md §4, appended at every log and eval and readable while the
 * run writes them, through HDF5 single-writer/multiple-reader (SWMR) mode.
 * Readers: h5py.File(path, "r", libver="latest", swmr=True). */
#ifndef MOMFMM_LIVE_METRICS_H
#define MOMFMM_LIVE_METRICS_H
#include <stddef.h>

#include "data/metrics.h"

typedef struct live_metrics live_metrics;

/* Creates dir/metrics.h5 (replacing an older one) with the root attribute
 * config_ini and the rows the tables have so far, then starts SWMR writing.
 * NULL with EXIT_BAD_FILE in err when the file cannot be written. */
live_metrics *live_metrics_open(const char *dir, const char *config_ini, const metric_table *train,
                                const metric_table *eval, status *err);
/* Writes the rows added to the tables since the last call and flushes them.
 * Returns 0, or EXIT_BAD_FILE in err (the caller may stop using the file). */
int live_metrics_append(live_metrics *lm, const metric_table *train, const metric_table *eval, status *err);
void live_metrics_close(live_metrics *lm);
/* After a failed append: forget the file without closing it. HDF5 1.10.8
 * crashes at exit after an H5Fclose that fails on a full disk
 * (HDFFV-11052); main() calls H5dont_atexit, so an abandoned file is simply
 * left to the operating system. */
void live_metrics_abandon(live_metrics *lm);
#endif
