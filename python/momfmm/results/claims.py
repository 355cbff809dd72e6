"""A claim of the reproduced works, judged on our numbers: Claim, its Verdict, and the rules.

Each rule takes the claim's text and the two groups it compares (momfmm.results.runs.Group, or
anything with .vals(metric) and .finished) and returns a Claim. A side with no suite line, no
run or no finished run gives Verdict.MISSING. Claims about a difference of means are judged by
Welch's t-test at momfmm.results.stats.ALPHA; for one release the Claim also carries the
verdict of the earlier 2-standard-error rule (old_verdict), and the line says when the two
differ. The sections collect their claims and observations (findings without a claim of the
reference attached) in Findings.
"""
import dataclasses
import enum
from typing import List, Optional, Tuple

import numpy as np

from momfmm.fmt import fmt_group
from momfmm.results.stats import NOISE_SE, difference

SAME_TOL = 0.02         # "about unchanged": relative difference within 2 %
REFERENCE_LABEL = "reference"


class Verdict(enum.Enum):
    """What the numbers say of a claim; the value is the word RESULTS.md shows."""
    HELD = "held"
    NOT_HELD = "did not hold"
    NOT_SHOWN = "not shown"      # the difference is within the seed-to-seed noise
    MISSING = "not run"          # a side has no suite line, no run, or no finished run
    NOT_JUDGED = "not judged"    # the baseline did not learn the task at this size

    def bold(self):
        return f"**{self.value}**"


@dataclasses.dataclass(frozen=True)
class Claim:
    """One claim: text (what is claimed), the reference's own numbers (reference, e.g.
    "1.2262 vs 1.2785", None when it gives none) and any other qualifier (note), our per-seed
    values of both sides (ours: (claimed side, other side)), the verdict and detail, the line's
    account of how the numbers decided it; old_verdict, the earlier 2-s.e. rule's verdict where
    a noise test decides the claim (None where a tolerance does, or nothing was judged)."""
    text: str
    verdict: Verdict
    detail: str
    reference: Optional[str] = None
    note: Optional[str] = None
    ours: Tuple[Tuple[float, ...], ...] = ()
    old_verdict: Optional[Verdict] = None

    @property
    def changed(self):
        """True when the earlier 2-s.e. rule gives another verdict."""
        return self.old_verdict is not None and self.old_verdict is not self.verdict

    @property
    def statement(self):
        parts = ([f"{REFERENCE_LABEL}: {self.reference}"] if self.reference is not None else []) + (
            [self.note] if self.note else [])
        return f"{self.text} ({'; '.join(parts)})" if parts else self.text

    @property
    def line(self):
        return f"{self.statement}: {self.detail}"


class Findings:
    """What the sections found: claims (Claim) and observations (one line each, no claim of
    the reference attached), in the order the sections add them."""

    def __init__(self):
        self.claims: List[Claim] = []
        self.observations: List[str] = []

    def add(self, claim):
        self.claims.append(claim)

    def observe(self, text):
        self.observations.append(text)


def fmt_pair(vals):
    return fmt_group(vals, "", 4) + f" (n={len(vals)})"


def changed_mark(verdict, old):
    """What a line adds after its verdict when the earlier rule gives another one."""
    return "" if old is None or old is verdict else f" (**verdict changed**: {old.value} by the {NOISE_SE:g}-s.e. rule)"


def claim_sides(text, ga, gb, metric, **what):
    """(a, b, None): the per-seed values of both groups; or (None, None, Claim) when a
    side has no suite line or no finished run, so the claim cannot be judged."""
    if ga is None or gb is None:
        return None, None, Claim(text, Verdict.MISSING, "not run (no suite line)", **what)
    a, b = ga.vals(metric), gb.vals(metric)
    if not a or not b:
        return None, None, Claim(text, Verdict.MISSING, "not run yet", **what)
    if not (ga.finished and gb.finished):
        return None, None, Claim(text, Verdict.MISSING,
                                 "not judged yet (no finished run on one side, only partial ones)", **what)
    return a, b, None


def less_claim(text, ga, gb, metric, flip=False, **what):
    """Claim: mean metric of ga < mean of gb (flip: the claim is stated as gb > ga, which is
    the same test; values are printed as claimed-side first). Held or did not hold when the
    difference is beyond the seed noise, not shown when within it."""
    a, b, missing = claim_sides(text, ga, gb, metric, **what)
    if missing:
        return missing
    held = np.mean(a) < np.mean(b)
    d = difference(a, b)

    def judge(noisy):
        return Verdict.NOT_SHOWN if noisy else (Verdict.HELD if held else Verdict.NOT_HELD)
    verdict, old = judge(d.noisy), judge(d.noisy_2se)
    first, second = (b, a) if flip else (a, b)
    shown = verdict.bold()
    if verdict is Verdict.NOT_SHOWN:
        shown += (f": the means go {'the claimed way' if held else 'the other way'}, "
                  "but within the seed-to-seed noise")
    return Claim(text, verdict, f"{shown}{changed_mark(verdict, old)} ({fmt_pair(first)} vs {fmt_pair(second)}){d.note()}",
                 ours=(tuple(first), tuple(second)), old_verdict=old, **what)


def no_worse_claim(text, ga, gb, metric, **what):
    """Claim: ga's mean metric is not above gb's ("no degradation"): held when it is lower or
    higher within the seed noise (the line says which), did not hold when higher beyond it.
    With a single seed on a side, a higher mean does not hold."""
    a, b, missing = claim_sides(text, ga, gb, metric, **what)
    if missing:
        return missing
    d = difference(a, b)
    worse = np.mean(a) > np.mean(b)

    def judge(noisy):
        return Verdict.NOT_HELD if worse and not noisy else Verdict.HELD
    verdict, old = judge(d.noisy), judge(d.noisy_2se)
    how = ("higher, within seed noise" if worse else "not higher") if verdict is Verdict.HELD \
        else "higher beyond seed noise"
    rel = (np.mean(a) - np.mean(b)) / max(abs(np.mean(b)), 1e-12)
    return Claim(text, verdict, f"{verdict.bold()}{changed_mark(verdict, old)} ({how}: {fmt_pair(a)} vs {fmt_pair(b)}, "
                 f"{rel:+.2%}){d.note()}", ours=(tuple(a), tuple(b)), old_verdict=old, **what)


def same_claim(text, ga, gb, metric, **what):
    """Claim: the means of ga and gb agree within SAME_TOL relative."""
    a, b, missing = claim_sides(text, ga, gb, metric, **what)
    if missing:
        return missing
    rel = abs(np.mean(a) - np.mean(b)) / max(abs(np.mean(b)), 1e-12)
    verdict = Verdict.HELD if rel <= SAME_TOL else Verdict.NOT_HELD
    return Claim(text, verdict, f"{verdict.bold()} ({fmt_pair(a)} vs {fmt_pair(b)}, {rel:.1%} apart)",
                 ours=(tuple(a), tuple(b)), **what)


def close_claim(text, ga, gb, metric, tol, **what):
    """Claim: the means of ga and gb agree within tol (absolute)."""
    a, b, missing = claim_sides(text, ga, gb, metric, **what)
    if missing:
        return missing
    d = np.mean(a) - np.mean(b)
    verdict = Verdict.HELD if abs(d) <= tol else Verdict.NOT_HELD
    return Claim(text, verdict, f"{verdict.bold()} ({fmt_pair(a)} vs {fmt_pair(b)}, difference {d:+.4f})",
                 ours=(tuple(a), tuple(b)), **what)
