"""The tests of a difference of means over seeds that the claims use (momfmm.results.claims).

Welch's t-test (unequal variances, two-sided, scipy.stats.ttest_ind with equal_var=False) at
level ALPHA decides whether a difference of means is beyond the seed-to-seed noise. The earlier
rule, a difference of at least NOISE_SE standard errors of the difference, is reported beside
it for one release, so that the verdicts it changes can be seen: with 2-3 seeds per side that
rule is a test at p of about 0.12-0.18, not the 0.05 a reader assumes. With a single seed on a
side neither is possible (no spread): the direction alone decides, and the line says so.
"""
import dataclasses
import math
from typing import Optional, Tuple

import numpy as np

from momfmm.fmt import shortest

ALPHA = 0.05            # Welch's t-test, two-sided: p < ALPHA is beyond the seed noise
NOISE_SE = 2.0          # the earlier rule: a difference below NOISE_SE standard errors is within the noise
SINGLE = "single seed on at least one side, no spread to judge noise"


@dataclasses.dataclass(frozen=True)
class Difference:
    """mean(a) − mean(b) over per-seed values, its standard error and Welch's t-test of it
    (se, t, df and p are None with a single seed on a side)."""
    a: Tuple[float, ...]
    b: Tuple[float, ...]
    diff: float
    se: Optional[float]
    t: Optional[float]
    df: Optional[float]
    p: Optional[float]

    @property
    def single(self):
        return self.se is None

    @property
    def noisy(self):
        """Within the noise by Welch's t-test (p ≥ ALPHA); False with a single seed."""
        return not self.single and self.p >= ALPHA

    @property
    def noisy_2se(self):
        """Within the noise by the earlier rule (|Δ| < NOISE_SE s.e.); False with a single seed."""
        return not self.single and abs(self.diff) < NOISE_SE * self.se

    def welch_text(self):
        if self.single:
            return SINGLE
        if self.se == 0:
            return (f"Welch's t-test: no spread on either side, so the difference {abs(self.diff):.4f} is "
                    f"{'exact' if self.diff else 'none'} (p = {shortest(self.p)})")
        return (f"Welch's t-test: t = {self.t:.2f}, df = {self.df:.1f}, p = {self.p:.3g} "
                f"{'≥' if self.noisy else '<'} {shortest(ALPHA)}")

    def se_text(self):
        """The earlier rule's account, as it read before: |Δ| against NOISE_SE s.e."""
        d, limit = abs(self.diff), NOISE_SE * self.se
        return f"|Δ| = {d:.4f} {'<' if self.noisy_2se else '≥'} {shortest(NOISE_SE)} s.e. = {limit:.4f}"

    def note(self):
        """Both rules' account, for a claim's line (leading " — ")."""
        if self.single:
            return f" — {SINGLE}"
        return f" — {self.welch_text()}; {shortest(NOISE_SE)}-s.e. rule: {self.se_text()}"


def difference(a, b):
    """The Difference of per-seed values a and b (sequences of finite floats, neither empty)."""
    a, b = tuple(float(x) for x in a), tuple(float(x) for x in b)
    diff = float(np.mean(a) - np.mean(b))
    if len(a) < 2 or len(b) < 2:
        return Difference(a, b, diff, None, None, None, None)
    va, vb = np.var(a, ddof=1) / len(a), np.var(b, ddof=1) / len(b)
    se = math.sqrt(va + vb)
    if se == 0:  # no spread on either side: the difference is exact (or there is none)
        return Difference(a, b, diff, 0.0, math.copysign(math.inf, diff) if diff else 0.0, None,
                          0.0 if diff else 1.0)
    from scipy import stats  # here, not at the top: 0.4 s of every report's start for one call

    test = stats.ttest_ind(a, b, equal_var=False)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))  # Welch-Satterthwaite
    return Difference(a, b, diff, se, float(test.statistic), float(df), float(test.pvalue))

