#!/usr/bin/python3
"""The results report's rules for judging a claim (momfmm.results), on made-up
per-seed values, so that each verdict is reached on purpose:

    /usr/bin/python3 tests/python/test_claims.py        (or: pytest tests/python)

1. difference: a single seed has no spread; Welch's t-test (scipy, with the Welch-Satterthwaite
   df the line prints) at p < 0.05 is beyond the noise, and beside it the earlier rule, a
   difference of NOISE_SE standard errors, which with 2 seeds a side is no 5 % test; no spread on
   either side gives p = 0 (a difference) or 1 (none).
2. less_claim, no_worse_claim, same_claim: held / did not hold / not shown / not run; a verdict
   the earlier rule would have given otherwise is marked "verdict changed".
3. The L_rep improvement pairs finished runs by seed and leaves out a diverged run. "The advantage grows
   with L": a larger L = 30 improvement holds only when it is positive (two losses of
   momentum, the smaller at L = 30, do not make a growing advantage).
4. The energy ratio's claims: "R does not depend on γ" over the one-seed γ sweep (10 % rule), and
   against the seed noise of the L = 30 chain runs (held, not shown, did not hold).
5. The report's line on the builds behind the runs (momfmm_version): counted per build, older
   files "not recorded", and a file's attribute of any type shown rather than failing the report.
6. Wall time from train.log: the starts that logged an exit add up, whatever their exit code; a
   start without one (killed with its session, or still running) makes the figure a lower bound.
7. A partial run (still running, or stopped before its steps) stays out of the means beside a
   finished one; a group with only partial runs shows them, but no claim judges it.
8. The chain recall section (momfmm.results.recall): L_rep at one period of a variable-period
   run comes from its L_rep_by_period entry (period − chain_len), a period no eval sample drew
   (NaN) gives no value, and "the advantage grows with L" pairs those per-period values by seed.
9. A comparison against a baseline that learned nothing is not judged: softmax's accuracy below
   the task's floor (copy 0.5, ListOps 0.25) gives one "not judged" finding and no claim.
"""
import os
import tempfile
import unittest

import numpy as np

from momfmm.results.chain import ChainRoles
from momfmm.results.claims import Verdict, less_claim, no_worse_claim, same_claim
from momfmm.results.document import unlogged_text
from momfmm.results.claims import Findings
from momfmm.results.energy_ratio import r_independent_claim, r_noise_claim
from momfmm.results.fmm import LISTOPS_LEARNED, baseline_unlearned
from momfmm.results.recall import Derived, grows, period_l_rep
from momfmm.results.reference_scale import grows_claim, improvements, paired_l_rep
from momfmm.results.runs import Group, builds_text, read_wall_time
from momfmm.results.stats import ALPHA, difference
from scipy import stats
from momfmm.results.suite import Entry as SuiteEntry


def judged(claim):
    """(verdict, line) of a Claim."""
    return claim.verdict, claim.line


class Values:
    """A group as the claim rules read it: per-seed values of one metric, of finished runs."""
    finished = True

    def __init__(self, vals):
        self._vals = list(vals)

    def vals(self, _metric):
        return self._vals


class Run:
    def __init__(self, eval_tables):
        self.eval = eval_tables


class Entry:
    def __init__(self, run):
        self.run = run


class Entry0:
    """A suite line's settings for momfmm.results.suite.setting: the gamma override only."""

    def __init__(self, gamma):
        self.sets = [("momentum.gamma", str(gamma))]
        self.config = "configs/experiments/chain_seed.ini"


class LayerGroup:
    """A group whose runs logged per-layer gain_R and gain_R_attn at their last eval."""

    finished = True

    def __init__(self, gamma, per_run):
        self.first = Entry0(gamma)
        self.counted = [Entry(Run({"gain_R": np.array([layers]), "gain_R_attn": np.array([layers])}))
                    for layers in per_run]


class Noise(unittest.TestCase):
    def test_single_seed_has_no_spread(self):
        d = difference([1.0], [2.0, 2.1])
        self.assertTrue(d.single)
        self.assertFalse(d.noisy or d.noisy_2se)
        self.assertIn("single seed", d.note())

    def test_within_and_beyond(self):
        within = difference([1.0, 1.2, 0.8], [1.05, 1.25, 0.85])
        self.assertTrue(within.noisy and within.noisy_2se)
        beyond = difference([1.0, 1.01, 0.99], [2.0, 2.01, 1.99])
        self.assertFalse(beyond.noisy or beyond.noisy_2se)
        self.assertIn("|Δ| = 1.0000 ≥ 2 s.e.", beyond.note())
        self.assertIn(f"p = {beyond.p:.3g} < 0.05", beyond.note())

    def test_welch_is_scipy_with_its_degrees_of_freedom(self):
        a, b = [1.0, 2.0, 3.5], [4.0, 5.0, 7.5, 6.0]
        d = difference(a, b)
        t, p = stats.ttest_ind(a, b, equal_var=False)
        self.assertAlmostEqual(d.t, t)
        self.assertAlmostEqual(d.p, p)
        self.assertAlmostEqual(d.p, 2 * stats.t.sf(abs(d.t), d.df))  # the df the line prints is the test's

    def test_two_standard_errors_is_not_a_5_percent_test(self):
        # 2.5 s.e. apart with 2 seeds a side: the earlier rule calls it beyond the noise, Welch (p ≈ 0.13) not
        d = difference([1.0, 1.2], [1.0 + 0.35, 1.2 + 0.35])
        self.assertFalse(d.noisy_2se)
        self.assertTrue(d.noisy)
        self.assertGreater(d.p, ALPHA)

    def test_no_spread_on_either_side(self):
        apart, same = difference([1.0, 1.0], [2.0, 2.0, 2.0]), difference([1.0, 1.0], [1.0, 1.0])
        self.assertEqual((apart.se, apart.p, apart.noisy), (0.0, 0.0, False))
        self.assertIn("no spread on either side", apart.note())
        self.assertEqual((same.p, same.noisy), (1.0, True))


class ClaimRules(unittest.TestCase):
    def test_less_claim(self):
        low, high = Values([1.0, 1.01, 0.99]), Values([2.0, 2.01, 1.99])
        self.assertEqual(less_claim("c", low, high, "m").verdict, Verdict.HELD)
        self.assertEqual(less_claim("c", high, low, "m").verdict, Verdict.NOT_HELD)
        self.assertEqual(less_claim("c", high, low, "m", flip=True).verdict, Verdict.NOT_HELD)
        verdict, line = judged(less_claim("c", Values([1.0, 1.3, 0.7]), Values([1.05, 1.35, 0.75]), "m"))
        self.assertEqual(verdict, Verdict.NOT_SHOWN)
        self.assertIn("**not shown**", line)
        self.assertEqual(less_claim("c", None, high, "m").verdict, Verdict.MISSING)
        self.assertEqual(less_claim("c", Values([]), high, "m").verdict, Verdict.MISSING)

    def test_no_worse_claim(self):
        base = Values([1.0, 1.2, 0.8])
        self.assertEqual(no_worse_claim("c", Values([1.05, 1.25, 0.85]), base, "m").verdict, Verdict.HELD)
        verdict, line = judged(no_worse_claim("c", Values([3.0, 3.01, 2.99]), Values([1.0, 1.01, 0.99]), "m"))
        self.assertEqual(verdict, Verdict.NOT_HELD)
        self.assertIn("higher beyond seed noise", line)
        self.assertEqual(no_worse_claim("c", Values([2.0]), Values([1.0]), "m").verdict, Verdict.NOT_HELD)

    def test_changed_verdict_is_marked(self):
        c = less_claim("c", Values([1.0, 1.2]), Values([1.35, 1.55]), "m")
        self.assertEqual((c.verdict, c.old_verdict, c.changed), (Verdict.NOT_SHOWN, Verdict.HELD, True))
        self.assertIn("**not shown**", c.line)
        self.assertIn("(**verdict changed**: held by the 2-s.e. rule)", c.line)
        c = less_claim("c", Values([1.0, 1.01, 0.99]), Values([2.0, 2.01, 1.99]), "m")
        self.assertFalse(c.changed)
        self.assertNotIn("verdict changed", c.line)
        self.assertFalse(same_claim("c", Values([1.01]), Values([1.0]), "m").changed)  # a tolerance, no noise rule

    def test_same_claim(self):
        self.assertEqual(same_claim("c", Values([1.01]), Values([1.0]), "m").verdict, Verdict.HELD)
        self.assertEqual(same_claim("c", Values([1.05]), Values([1.0]), "m").verdict, Verdict.NOT_HELD)


class GrowsWithL(unittest.TestCase):
    def test_positive_and_larger_holds(self):
        verdict, line = judged(grows_claim([4.0, 5.0, 3.5], [50.0, 52.0, 55.0]))
        self.assertEqual(verdict, Verdict.HELD, line)

    def test_smaller_at_30_does_not_hold(self):
        verdict, line = judged(grows_claim([40.0, 50.0, 45.0], [10.0, 12.0, 11.0]))
        self.assertEqual(verdict, Verdict.NOT_HELD, line)

    def test_two_losses_are_no_growing_advantage(self):
        # the first seed-scale runs: −1168 % at L = 10, −18 % at L = 30 (one seed each)
        verdict, line = judged(grows_claim([-1168.1], [-18.1]))
        self.assertEqual(verdict, Verdict.NOT_HELD, line)
        self.assertIn("no advantage at L=30", line)
        verdict, line = judged(grows_claim([-20.0, -30.0, -10.0], [-15.0, -35.0, 5.0]))   # within noise, mean < 0
        self.assertEqual(verdict, Verdict.NOT_HELD, line)

    def test_noise_with_positive_mean_stays_within_noise(self):
        verdict, _ = judged(grows_claim([10.0, 30.0, 20.0], [15.0, 35.0, 25.0]))
        self.assertEqual(verdict, Verdict.NOT_SHOWN)

    def test_missing_length_is_not_run(self):
        verdict, _ = judged(grows_claim([], [10.0]))
        self.assertNotIn(verdict, (Verdict.HELD, Verdict.NOT_HELD, Verdict.NOT_SHOWN))


class SeedRun:
    """A run as the L_rep pairing reads it: its train.seed and final eval L_rep."""

    def __init__(self, seed, l_rep):
        self.seed, self.l_rep = seed, l_rep
        self.run = self

    def final_eval(self, _key):
        return self.l_rep


class SeedGroup:
    def __init__(self, gamma, by_seed):
        self.first = Entry0(gamma)
        self.done = [SeedRun(seed, v) for seed, v in by_seed.items()]


class Improvement(unittest.TestCase):
    def test_pairs_by_seed_and_skips_diverged_runs(self):
        rows = ChainRoles([SeedGroup(0, {1: 2.0, 2: 1.0, 3: float("nan"), 4: 0.5}),
                           SeedGroup(0.2, {1: 1.0, 2: 1.5, 3: 0.7, 5: 0.1})])
        self.assertEqual(improvements(rows), [50.0, -50.0])           # seeds 1, 2; 3 diverged, 4/5 unpaired
        self.assertEqual(paired_l_rep(rows, lambda b, m: b - m), [1.0, -0.5])
        self.assertEqual(improvements(ChainRoles([SeedGroup(0, {1: 0.0}), SeedGroup(0.2, {1: 0.1})])), [])


class EnergyRatio(unittest.TestCase):
    def test_independent_over_gamma_sweep(self):
        flat = [LayerGroup(g, [[1.0, 2.0]]) for g in (0, 0.1, 0.2)]
        self.assertEqual(r_independent_claim(flat, "gain_R", "w").verdict, Verdict.HELD)
        moved = flat[:2] + [LayerGroup(0.2, [[1.0, 2.5]])]
        verdict, line = judged(r_independent_claim(moved, "gain_R", "w"))
        self.assertEqual(verdict, Verdict.NOT_HELD)
        self.assertIn("one seed per γ", line)
        self.assertEqual(r_independent_claim(flat[:1], "gain_R", "w").verdict, Verdict.MISSING)

    def test_against_seed_noise(self):
        def rows(base, mom):
            return ChainRoles([LayerGroup(0, base), LayerGroup(0.2, mom)])
        base = [[1.0, 2.0], [1.02, 2.02], [0.98, 1.98]]
        close = [[1.03, 2.05], [1.05, 2.07], [1.01, 2.03]]
        self.assertEqual(r_noise_claim(rows(base, close), "gain_R", "w", 2).verdict, Verdict.HELD)
        far = [[1.5, 2.0], [1.52, 2.02], [1.48, 1.98]]
        verdict, line = judged(r_noise_claim(rows(base, far), "gain_R", "w", 2))
        self.assertEqual(verdict, Verdict.NOT_HELD)
        self.assertIn("layer 0: 1.500 ± 0.020 vs 1.000 ± 0.020, 50.0% apart", line)
        noisy_base = [[1.0, 2.0], [2.0, 2.0], [0.5, 2.0]]
        noisy_mom = [[1.6, 2.0], [2.6, 2.0], [0.9, 2.0]]
        verdict, line = judged(r_noise_claim(rows(noisy_base, noisy_mom), "gain_R", "w", 2))
        self.assertEqual(verdict, Verdict.NOT_SHOWN)
        self.assertIn("**not shown**", line)
        self.assertEqual(r_noise_claim(rows(base, []), "gain_R", "w", 2).verdict, Verdict.MISSING)


class StepRun:
    """A run directory as momfmm.results.runs.Group reads it: its step, its stored train.steps and
    its last eval's L_rep."""
    has_config = True

    def __init__(self, step, l_rep):
        self.step, self.l_rep = step, l_rep
        self.eval = {"step": np.array([step])}

    def cfg(self, key, default=None):
        return "1500" if key == "train.steps" else default

    def final_eval(self, _key):
        return self.l_rep


def step_group(gamma, by_seed):
    """A momfmm.results.runs.Group of chain_seed runs: {seed: (step, L_rep)}."""
    entries = []
    for seed, (step, l_rep) in by_seed.items():
        e = SuiteEntry(f"chain_seed_L30_g{gamma}_s{seed}", "configs/experiments/chain_seed.ini",
                       [("momentum.gamma", str(gamma)), ("train.seed", str(seed))], 1, "")
        e.run = StepRun(step, l_rep)
        entries.append(e)
    return Group(entries)


class PartialRuns(unittest.TestCase):
    def test_partial_run_beside_finished_stays_out_of_the_means(self):
        g = step_group(0.2, {1: (1500, 0.01), 2: (300, 6.5)})
        self.assertEqual(g.vals("L_rep"), [0.01])
        self.assertEqual(g.steps(), "1500")
        self.assertIn("1/2; partial, not in the means: chain_seed_L30_g0.2_s2 at step 300/1500", g.status())

    def test_partial_only_group_is_shown_not_judged(self):
        partial = step_group(0.2, {1: (300, 6.5)})
        self.assertEqual(partial.vals("L_rep"), [6.5])
        self.assertIn("0/1; partial: chain_seed_L30_g0.2_s1 at step 300/1500", partial.status())
        done = step_group(0, {1: (1500, 0.01), 2: (1500, 0.012)})
        verdict, line = judged(less_claim("c", partial, done, "L_rep"))
        self.assertEqual(verdict, Verdict.MISSING)
        self.assertIn("not judged yet", line)
        self.assertNotEqual(less_claim("c", done, done, "L_rep").verdict, Verdict.MISSING)     # finished: judged
        not_run = step_group(0.2, {1: (0, None)})
        not_run.members[0].run = None                                               # no run directory
        self.assertEqual(judged(less_claim("c", not_run, done, "L_rep")), (Verdict.MISSING, "c: not run yet"))

    def test_improvement_pairs_finished_runs_only(self):
        rows = ChainRoles([step_group(0, {1: (1500, 0.02), 2: (1500, 0.02)}),
                           step_group(0.2, {1: (1500, 0.01), 2: (300, 6.5)})])
        self.assertEqual(improvements(rows), [50.0])


class PeriodRun(StepRun):
    """A finished variable-period run (chain_len 10, chain_len_max 40) with its last L_rep_by_period row."""

    def __init__(self, by_period):
        super().__init__(1500, None)
        row = np.full(31, np.nan)
        for L, v in by_period.items():
            row[L - 10] = v
        self.eval["L_rep_by_period"] = np.array([row])

    def cfg(self, key, default=None):
        return {"train.steps": "1500", "data.chain_len": "10"}.get(key, default)


def period_group(gamma, by_seed):
    entries = []
    for seed, by_period in by_seed.items():
        e = SuiteEntry(f"recall_varL_l2_g{gamma}_s{seed}", "configs/experiments/chain_recall.ini",
                       [("model.n_layers", "2"), ("momentum.gamma", str(gamma)), ("train.seed", str(seed))], 1, "")
        e.run = PeriodRun(by_period)
        entries.append(e)
    return Group(entries)


class Recall(unittest.TestCase):
    def test_l_rep_at_a_period(self):
        g = period_group(0, {1: {10: 2.0, 30: 4.0}, 2: {10: 1.0}})
        self.assertEqual(Derived(g, period_l_rep(10)).vals(), [2.0, 1.0])
        self.assertEqual(Derived(g, period_l_rep(30)).vals(), [4.0])             # seed 2 drew no L = 30 sample
        self.assertEqual(Derived(g, period_l_rep(41)).vals(), [])                # outside the training range

    def test_grows_pairs_periods_by_seed(self):
        base = period_group(0, {1: {10: 2.0, 30: 4.0}, 2: {10: 2.0, 30: 4.0}, 3: {10: 2.0, 30: 4.1}})
        mom = period_group(0.2, {1: {10: 1.9, 30: 2.0}, 2: {10: 1.8, 30: 2.1}, 3: {10: 1.9, 30: 1.9}})
        verdict, line = judged(grows("p: ", base, mom))
        self.assertEqual(verdict, Verdict.HELD)
        self.assertTrue(line.startswith("p: the advantage grows with L"))
        worse = period_group(0.2, {1: {10: 1.9, 30: 5.0}, 2: {10: 1.8, 30: 5.1}, 3: {10: 1.9, 30: 5.2}})
        self.assertEqual(grows("p: ", base, worse).verdict, Verdict.NOT_HELD)   # no advantage at L = 30 to grow
        self.assertEqual(grows("p: ", base, None).verdict, Verdict.MISSING)


class Builds(unittest.TestCase):
    def test_counts_and_odd_values(self):
        class Attrs:
            def __init__(self, attrs):
                self.attrs = attrs
        entries = [Entry(Attrs({"momfmm_version": "momfmm 0.2.0 (git a)"})),
                   Entry(Attrs({"momfmm_version": "momfmm 0.2.0 (git a)"})),
                   Entry(Attrs({"momfmm_version": np.int32(7)})), Entry(Attrs({})), Entry(None)]
        text = builds_text(entries)
        self.assertIn("momfmm 0.2.0 (git a) (2 runs)", text)
        self.assertIn("7 (1 run)", text)
        self.assertIn("not recorded (1 run", text)
        self.assertEqual(builds_text([Entry(None)]), "none (no run yet)")


class WallTime(unittest.TestCase):
    LOG = ("# 2026-11-30T19:57:59  19:57:59 up  9:21,  0 user,  load average: 2.02\n"
           "# mpirun -np 2 momfmm train chain_seed.ini --resume auto\n"
           "step 1100/1500 | loss 0.7\n"                                        # killed: no exit line
           "# 2026-11-30T23:19:42  23:19:42 up 12:43,  0 user,  load average: 0.00\n"
           "# mpirun -np 2 momfmm train chain_seed.ini --resume auto\n"
           "# exit 143 after 60 s\n"                                            # preempted, time spent
           "# 2026-11-30T23:21:00  23:21:00 up 12:45,  0 user,  load average: 0.00\n"
           "# exit 0 after 397 s\n")

    def entry(self, text):
        e = SuiteEntry("chain_seed_L40_g0.2_s1", "configs/experiments/chain_seed.ini", [], 1, "")
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "train.log")
            if text is not None:
                with open(path, "w") as f:
                    f.write(text)
            read_wall_time(e, path)
        return e

    def test_sum_and_unlogged_starts(self):
        e = self.entry(self.LOG)
        self.assertEqual((e.wall_s, e.wall_unlogged), (457, 1))
        self.assertIn("lower bounds: 1 start of 1 run logged no exit", unlogged_text([e]))

    def test_complete_or_missing_log(self):
        e = self.entry(self.LOG.split("step 1100")[0].replace("# mpirun", "# exit 0 after 5 s\n# mpirun", 1))
        self.assertEqual((e.wall_s, e.wall_unlogged), (5, 0))
        self.assertEqual(unlogged_text([e]), "")
        e = self.entry(None)
        self.assertEqual((e.wall_s, e.wall_unlogged), (None, 0))




class Accuracy:
    """A softmax group as baseline_unlearned reads it: its mean final accuracy."""

    def __init__(self, acc):
        self.acc = acc

    def mean(self, _metric):
        return self.acc


class UnlearnedBaseline(unittest.TestCase):
    def test_below_the_floor_is_not_judged(self):
        findings = Findings()
        self.assertTrue(baseline_unlearned(findings, "ListOps T=2000", Accuracy(0.2031), LISTOPS_LEARNED,
                                           "the most frequent class", "the task"))
        self.assertEqual([c.verdict for c in findings.claims], [Verdict.NOT_JUDGED])
        self.assertIn("0.2031 (below 0.25", findings.claims[0].detail)

    def test_learned_or_missing_is_judged(self):
        findings = Findings()
        self.assertFalse(baseline_unlearned(findings, "ListOps", Accuracy(0.362), LISTOPS_LEARNED, "", ""))
        self.assertFalse(baseline_unlearned(findings, "ListOps", None, LISTOPS_LEARNED, "", ""))
        self.assertFalse(baseline_unlearned(findings, "ListOps", Accuracy(None), LISTOPS_LEARNED, "", ""))
        self.assertEqual(findings.claims, [])


if __name__ == "__main__":
    unittest.main()
