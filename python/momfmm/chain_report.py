"""The chain task's per-L tables, shared by the small-scale chain sections (momfmm.results)
and the seed-scale ones (momfmm.seed_scale): L_rep of γ = 0 vs γ = 0.2 at each eval step, the
eval loss by occurrence count k (docs/metrics.md §3 `loss_by_k`), and the line saying at which
eval steps momentum is ahead. Groups are momfmm.suite groups."""
import math
import warnings

import numpy as np

from momfmm.fmt import fmt_value, markdown
from momfmm.suite import eval_steps, momentum_label


def l_rep_during_training(L, base, mom, out):
    """Mean L_rep of γ = 0 and γ = 0.2 at evenly spaced eval steps: the seed's single
    number may come from a stage of training other than our last eval."""
    steps = eval_steps([base, mom], most=10)
    if not steps:
        return
    out.append(f"**L_rep during training, L = {L}** (mean over seeds at each eval step)\n")
    rows = [[label] + [fmt_value(g.mean_at("L_rep", s), "", 3) for s in steps]
            for label, g in (("baseline γ=0", base), ("momentum γ=0.2", mom))]
    out.append(markdown(["row"] + [f"step {s}" for s in steps], rows))
    out.append("")


def loss_by_k_table(L, shown, out):
    """Eval loss by occurrence count k (docs/metrics.md §3 loss_by_k), last eval, mean over seeds."""
    kmax = 0
    per = []
    for g in shown:
        rows_k = [e.run.eval["loss_by_k"][-1] for e in g.counted
                  if "loss_by_k" in e.run.eval and e.run.eval["loss_by_k"].ndim == 2 and len(e.run.eval["loss_by_k"])]
        if rows_k:
            arr = np.asarray(rows_k, float)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)  # bins no target reached stay NaN
                m = np.nanmean(arr, axis=0)
            finite = np.where(np.isfinite(m))[0]
            if len(finite):
                kmax = max(kmax, int(finite[-1]))
            per.append((g, m))
        else:
            per.append((g, None))
    kmax = min(max(kmax, 3), 15)
    out.append(f"**Eval loss by occurrence count k, L = {L}** (last eval, mean over seeds; `loss_by_k`; "
               "k = 15 holds k ≥ 15; — = no target with that k)\n")
    rows = []
    for g, m in per:
        label = momentum_label(g.first)
        if m is None:
            rows.append([label] + [g.missing()] * (kmax + 1))
        else:
            rows.append([label] + [fmt_value(float(v), "", 3) if math.isfinite(v) else "—" for v in m[:kmax + 1]])
    out.append(markdown(["variant"] + [f"k={k}" for k in range(kmax + 1)], rows))
    out.append("")


def momentum_ahead_text(L, base, mom):
    """At which eval steps the mean L_rep of γ = 0.2 is below the baseline's (None before
    both rows have an eval step in common)."""
    steps = eval_steps([base, mom])
    pairs = [(s, mom.mean_at("L_rep", s), base.mean_at("L_rep", s)) for s in steps]
    pairs = [(s, m, b) for s, m, b in pairs if m is not None and b is not None]
    if not pairs:
        return None
    ahead = [(s, m, b) for s, m, b in pairs if m < b]
    text = f"L_rep during training at L={L}: γ=0.2 is below γ=0 at {len(ahead)} of {len(pairs)} eval steps"
    if ahead:
        s, m, b = max(ahead, key=lambda t: t[2] - t[1])
        text += (f" (steps {', '.join(str(a[0]) for a in ahead)}; widest gap at step {s}: {m:.4f} vs {b:.4f})")
    return text + "; see the table \"L_rep during training\"."
