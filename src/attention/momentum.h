/* Momentum shear of docs/model.md §1.2 for one head of one sequence: x is [T, dh]. */
#ifndef MOMFMM_MOMENTUM_H
#define MOMFMM_MOMENTUM_H
#include <stddef.h>

typedef struct {
    float gamma;  /* gamma_h of this head (fixed or learned) */
    float beta;   /* decay of p */
    float gamma2; /* second-order coefficient */
} momentum_coeffs;

/* xhat_t = x_t + gamma p_t + gamma2 a_t, with d_t = x_t - x_{t-1}, d_0 = 0 when
 * prev == NULL (anchored) or x_0 - prev (unanchored); p_t = d_t + beta p_{t-1};
 * a_t = p_t - p_{t-1}, p_{-1} = 0.  p (if not NULL, [T, dh]) receives p_t,
 * which the backward of a learned gamma needs.  x and xhat may not alias.
 * p_prev ([dh] or NULL = 0) is p_{-1}: streaming inference carries the
 * previous segment's last p with its last x (prev), so that a stream fed in
 * segments equals the whole stream fed at once even with beta, gamma2 != 0. */
void momentum_shear_forward(const float *x, const float *prev, const float *p_prev, float *xhat, float *p,
                            momentum_coeffs c, int T, int dh);

/* Adds dL/dx into dx ([T, dh]).  If d_gamma != NULL adds dL/dgamma (needs p
 * from the forward).  anchored: nonzero iff the forward ran with prev == NULL
 * (unanchored, x_0 reaches p_0 through d_0 = x_0 - prev).  The buffer prev
 * carries no gradient (docs/model.md §1.2).  g_next and u_next ([dh] or
 * NULL = 0) continue the reverse sweep from the rows after these (a shard
 * of a longer sequence, docs/design.md §8.12): g and u at row T.
 * scratch: dh floats. */
void momentum_shear_backward(const float *dxhat, const float *p, float *dx, float *d_gamma, momentum_coeffs c,
                             int anchored, const float *g_next, const float *u_next, float *scratch, int T, int dh);

/* Context parallelism (docs/design.md §8.12): the recurrences cross the
 * shards of a sequence through one [dh] vector each way, and each is affine
 * in what comes in, so every shard first computes its share with nothing
 * coming in, the shares are gathered, and the carries follow in O(C dh).
 *
 * p at the last of T rows, for the carries prev and p_prev as the forward
 * takes them (prev NULL: anchored). */
void momentum_p_end(const float *x, const float *prev, const float *p_prev, float beta, float *p_end, int T, int dh);
/* The last row's p of a shard of T rows whose p_end0 was computed with
 * prev = 0 and no p_prev, once its carries are known:
 * p_end0 + beta^(T-1) (beta p_prev - x_prev). */
void momentum_carry_p(const float *p_end0, const float *x_prev, const float *p_prev, float beta, float *p_end, int T,
                      int dh);
/* u at the first of T rows (the backward's sweep), for the carries g_next,
 * u_next (NULL = 0). */
void momentum_u_first(const float *dxhat, const float *g_next, const float *u_next, momentum_coeffs c, float *u_first,
                      int T, int dh);
/* The first row's u of a shard of T rows whose u_first0 was computed with
 * no carries: u_first0 + beta^(T-1) (beta u_next - gamma2 g_next). */
void momentum_carry_u(const float *u_first0, const float *g_next, const float *u_next, momentum_coeffs c,
                      float *u_first, int T, int dh);
#endif
