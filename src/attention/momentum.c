/* Momentum shear of docs/model.md §1.2, forward and adjoint, for one head of one
 * sequence.  x is [T, dh] row-major.  O(T * dh) time, no allocation. */
#include "attention/momentum.h"

#include "base/fast_math.h"

#include <assert.h>
#include <math.h>

/* Columns processed together in the forward; the p_{t-1} state of a block
 * lives on the stack, so the forward needs neither scratch nor the p output. */
#define MOM_BLOCK 64

/* docs/model.md §1.2:
 *   d_t = x_t - x_{t-1} (t >= 1),  d_0 = 0 (anchored) or x_0 - prev,
 *   p_t = d_t + beta p_{t-1},      a_t = p_t - p_{t-1},
 *   p_{-1} = 0, or the previous segment's last p when streaming,
 *   xhat_t = x_t + gamma p_t + gamma2 a_t. */
void momentum_shear_forward(const float *x, const float *prev, const float *p_prev, float *xhat, float *p,
                            momentum_coeffs c, int T, int dh) {
    /* With gamma = gamma2 = 0 the shear is the identity: copy x exactly
     * (x + 0 * p would turn -0 into +0), but still emit p for a learned gamma. */
    const int shear = c.gamma != 0.0f || c.gamma2 != 0.0f;
    for (int i0 = 0; i0 < dh; i0 += MOM_BLOCK) {
        const int n = dh - i0 < MOM_BLOCK ? dh - i0 : MOM_BLOCK;
        float pm[MOM_BLOCK];                                                /* p_{t-1}, column i0 + j */
        for (int j = 0; j < n; j++) pm[j] = p_prev ? p_prev[i0 + j] : 0.0f; /* p_{-1} */
        for (int t = 0; t < T; t++) {
            const size_t row = (size_t)t * dh + i0;
            const float *xt = x + row;
            for (int j = 0; j < n; j++) {
                float d;
                if (t > 0) d = xt[j] - xt[j - dh];           /* x_t - x_{t-1} */
                else d = prev ? xt[j] - prev[i0 + j] : 0.0f; /* d_0 */
                const float pt = d + c.beta * pm[j];
                const float at = pt - pm[j];
                xhat[row + j] = shear ? xt[j] + c.gamma * pt + c.gamma2 * at : xt[j];
                if (p) p[row + j] = pt;
                pm[j] = pt;
            }
        }
    }
}

/* Adjoint of the forward.  With g_t = dL/dxhat_t (g_T = 0), the total
 * gradient reaching p_t (through xhat_t, a_t, a_{t+1} and p_{t+1}) is
 *   u_t = (gamma + gamma2) g_t - gamma2 g_{t+1} + beta u_{t+1},  u_T = 0,
 * and dL/dd_t = u_t.  Since d_t = x_t - x_{t-1}:
 *   dx_t += g_t + u_t - u_{t+1}   for t >= 1,
 *   dx_0 += g_0 + u_0 - u_1       unanchored (d_0 = x_0 - prev),
 *   dx_0 += g_0       - u_1       anchored (d_0 = 0).
 * prev gets nothing (buffers carry no gradient).  dL/dgamma = sum_t g_t . p_t.
 * scratch[i] holds u_{t+1} for column i during the reverse sweep. */
void momentum_shear_backward(const float *dxhat, const float *p, float *dx, float *d_gamma, momentum_coeffs c,
                             int anchored, const float *g_next, const float *u_next, float *scratch, int T, int dh) {
    float *un = scratch;                                            /* u_{t+1} */
    for (int i = 0; i < dh; i++) un[i] = u_next ? u_next[i] : 0.0f; /* u_T */
    const float cg = c.gamma + c.gamma2;
    for (int t = T - 1; t >= 0; t--) {
        const float *g = dxhat + (size_t)t * dh;
        const float *gn = t + 1 < T ? g + dh : g_next; /* g_{t+1}; at T the next shard's, or 0 */
        float *dxt = dx + (size_t)t * dh;
        const int via_d = t > 0 || !anchored; /* does d_t read x_t? */
        for (int i = 0; i < dh; i++) {
            float u = cg * g[i] + c.beta * un[i];
            if (gn) u -= c.gamma2 * gn[i];
            dxt[i] += g[i] + (via_d ? u : 0.0f) - un[i];
            un[i] = u;
        }
    }
    if (d_gamma) {
        assert(p && "dL/dgamma needs p from the forward");
        *d_gamma += (float)fast_dot_lanes_double(dxhat, p, (size_t)T * dh);
    }
}

void momentum_p_end(const float *x, const float *prev, const float *p_prev, float beta, float *p_end, int T, int dh) {
    for (int i = 0; i < dh; i++) {
        float pm = p_prev ? p_prev[i] : 0.0f;
        for (int t = 0; t < T; t++) {
            const float *xt = x + (size_t)t * dh;
            float d = t > 0 ? xt[i] - xt[i - dh] : prev ? xt[i] - prev[i] : 0.0f;
            pm = d + beta * pm;
        }
        p_end[i] = pm;
    }
}

/* p_t is affine in the carries: with d_0 = x_0 - x_prev and p_{-1} = p_prev,
 * p_t = p0_t + beta^t (beta p_prev - x_prev), p0 the share with both 0. */
void momentum_carry_p(const float *p_end0, const float *x_prev, const float *p_prev, float beta, float *p_end, int T,
                      int dh) {
    float decay = powf(beta, (float)(T - 1));
    for (int i = 0; i < dh; i++) p_end[i] = p_end0[i] + decay * (beta * p_prev[i] - x_prev[i]);
}

void momentum_u_first(const float *dxhat, const float *g_next, const float *u_next, momentum_coeffs c, float *u_first,
                      int T, int dh) {
    const float cg = c.gamma + c.gamma2;
    for (int i = 0; i < dh; i++) {
        float un = u_next ? u_next[i] : 0.0f, gn = g_next ? g_next[i] : 0.0f;
        for (int t = T - 1; t >= 0; t--) {
            float g = dxhat[(size_t)t * dh + i];
            un = cg * g - c.gamma2 * gn + c.beta * un;
            gn = g;
        }
        u_first[i] = un;
    }
}

/* u_t is affine in the carries the same way, backwards from row T - 1:
 * u_t = u0_t + beta^(T-1-t) (beta u_next - gamma2 g_next). */
void momentum_carry_u(const float *u_first0, const float *g_next, const float *u_next, momentum_coeffs c,
                      float *u_first, int T, int dh) {
    float decay = powf(c.beta, (float)(T - 1));
    for (int i = 0; i < dh; i++) u_first[i] = u_first0[i] + decay * (c.beta * u_next[i] - c.gamma2 * g_next[i]);
}
