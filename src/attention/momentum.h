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
 * carries no gradient (docs/model.md §1.2).  scratch: dh floats. */
void momentum_shear_backward(const float *dxhat, const float *p, float *dx, float *d_gamma, momentum_coeffs c,
                             int anchored, float *scratch, int T, int dh);
#endif
