"""The test of a difference of means over seeds that the claims use (momfmm.results.claims).

noise_note: the 2-standard-error rule: a difference of means below NOISE_SE standard errors of
the difference is within the seed-to-seed noise.
"""
import math

import numpy as np

from momfmm.fmt import shortest

NOISE_SE = 2.0          # a difference below NOISE_SE standard errors is "within seed noise"


def noise_note(a, b):
    """(note, within_noise): the difference of means against NOISE_SE standard errors."""
    if len(a) < 2 or len(b) < 2:
        return " — single seed on at least one side, no spread to judge noise", False
    se = math.sqrt(np.var(a, ddof=1) / len(a) + np.var(b, ddof=1) / len(b))
    diff = abs(np.mean(a) - np.mean(b))
    if diff < NOISE_SE * se:
        return f" — |Δ| = {diff:.4f} < {shortest(NOISE_SE)} s.e. = {NOISE_SE * se:.4f}", True
    return f" — beyond seed noise (|Δ| = {diff:.4f} ≥ {shortest(NOISE_SE)} s.e. = {NOISE_SE * se:.4f})", False
