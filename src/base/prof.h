/* Where a training step's time goes (docs/design.md §8.10): wall-clock
 * seconds summed per phase, forward and backward by op class, then the
 * optimizer and the wait for the gradient reduction. Off unless enabled
 * (`momfmm bench` enables it): then a timed call costs two clock reads. */
#ifndef MOMFMM_PROF_H
#define MOMFMM_PROF_H
#include <stdbool.h>

typedef enum {
    PROF_FORWARD_LINEAR,     /* the linear layers' GEMMs (qkv, proj, MLP, head), bias adds */
    PROF_FORWARD_ATTENTION,  /* heads split and merged, RoPE, momentum shear, softmax or FMM */
    PROF_FORWARD_NORM,       /* LayerNorm with the residual add before it */
    PROF_FORWARD_ACTIVATION, /* GELU with the fc bias, a residual add without a norm after it */
    PROF_FORWARD_LOSS,       /* embedding, pooling, softmax cross-entropy (and its gradient, training) */
    PROF_BACKWARD_LINEAR,
    PROF_BACKWARD_ATTENTION,
    PROF_BACKWARD_NORM,
    PROF_BACKWARD_ACTIVATION,
    PROF_BACKWARD_LOSS,
    PROF_RECOMPUTE,   /* backward remaking forward state (train.recompute) */
    PROF_OPTIMIZER,   /* gradient norm, clipping, AdamW, the bf16 weight copy */
    PROF_REDUCE_WAIT, /* waiting for the gradient all-reduce after backward */
    PROF_PHASES
} prof_phase;

void prof_enable(bool on);
/* The time to pass to prof_add (0 when profiling is off). */
double prof_start(void);
/* Adds the seconds since `start` to the phase (nothing when off). */
void prof_add(prof_phase phase, double start);
/* While diverted, every phase's time goes to `phase` instead: backward's
 * recomputation runs the forward's own timed code, whose time must not
 * count as forward twice. PROF_PHASES ends the diversion. */
void prof_divert(prof_phase phase);
void prof_reset(void);
/* Seconds per phase since the last reset. */
void prof_read(double seconds[PROF_PHASES]);
/* "forward linear", ..., "reduce wait". */
const char *prof_phase_name(prof_phase phase);

/* Runs the statement `call` and adds its seconds to `phase`. */
#define PROF_TIMED(phase, call)            \
    do {                                   \
        double prof_start_ = prof_start(); \
        call;                              \
        prof_add(phase, prof_start_);      \
    } while (0)
#endif
