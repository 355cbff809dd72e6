"""The energy ratio R per layer at the reference's scale (docs/metrics.md §3 gain_R, gain_R_attn).

The R family of configs/experiments/suite.list (`chain_seed_R_*`: L = 30, γ = 0, 0.1, 0.2, 0.3)
has one seed per γ; the L = 30 runs of the chain family (γ = 0 vs 0.2, three seeds) add R's
seed spread. Part of the reference-scale section (momfmm.results.reference_scale).
"""
import os

import numpy as np

from momfmm.fmt import fmt_group, markdown, shortest
from momfmm.results.chain import REFERENCE_SCALE
from momfmm.results.claims import Claim, Verdict, changed_mark
from momfmm.results.figures import summary_figure
from momfmm.results.reference import REFERENCE_R_RANGE
from momfmm.results.runs import precision
from momfmm.results.stats import difference
from momfmm.results.suite import gamma_of, setting

PREFIX = REFERENCE_SCALE.claim_prefix
R_SAME_TOL = 0.10      # "R independent of γ": per layer, (max − min) / mean over γ within 10 %
DEFINITIONS = ("Two definitions, both with the same random δ (‖δ‖ = 10⁻³ ‖x‖) per layer and sample, last eval, "
               "docs/metrics.md §3: **gain_R** = ‖F(x+δ) − F(x)‖/‖δ‖ for the whole block F (attention and MLP "
               "sublayers with their residual paths, so ≈ 1 plus what the sublayers add); **gain_R_attn** = "
               "‖A(LN1(x+δ)) − A(LN1(x))‖/‖δ‖ for the attention sublayer A alone, without its residual path — the "
               f"definition the reference's range [{REFERENCE_R_RANGE[0]}, {REFERENCE_R_RANGE[1]}] matches.\n")


def layer_values(group, key):
    """[[per-layer values of the last eval] per run], runs that logged `key` only."""
    out = []
    for e in group.counted:
        table = e.run.eval.get(key)
        if table is not None and table.ndim == 2 and len(table) and np.all(np.isfinite(table[-1])):
            out.append(np.asarray(table[-1], float))
    return out


def layer_columns(group, key, n_layers):
    """Per layer, the last eval's value of `key` of each run: [[run values] per layer]."""
    per_run = layer_values(group, key)
    return [[v[i] for v in per_run if len(v) > i] for i in range(n_layers)]


def r_part(ctx, groups, out, findings):
    """The R family's table (groups sorted by γ), figure and claims."""
    n_layers = max((len(v) for g in groups for v in layer_values(g, "gain_R")), default=0)
    body = []
    for g in groups:
        cells = []
        for key in ("gain_R", "gain_R_attn"):
            per_run = layer_values(g, key)
            cells += [fmt_group([v[i] for v in per_run], "", 3) if per_run else g.missing()
                      for i in range(n_layers)]
        body.append([shortest(gamma_of(g.first)), g.status(), g.steps(), precision(g)] + cells + [ctx.reproduce(g)])
    header = (["γ", "runs done", "steps", "precision"] + [f"gain_R layer {i}" for i in range(n_layers)]
              + [f"gain_R_attn layer {i}" for i in range(n_layers)] + ["reproduce"])
    out.append(markdown(header, body))
    out.append("")
    r_figure(ctx, groups, n_layers, out)
    for key, what in (("gain_R", "whole block, residual included"), ("gain_R_attn", "attention sublayer alone")):
        findings.add(r_independent_claim(groups, key, what))
    findings.add(r_range_claim(groups))


def r_seeds_part(rows, out, findings):
    """R with its seed spread: the R family has one seed per γ, so the L = 30 runs of the chain
    family (γ = 0 and 0.2, several seeds, longer training) show whether a difference over γ is
    larger than the noise between seeds."""
    groups = [rows.base, rows.mom]
    out.append("**R with seed spread: the L = 30 runs of the chain family** (γ = 0 vs 0.2, their own steps, last "
               "eval, mean ± std over seeds; the R family above has one seed per γ)\n")
    n_layers = max((len(v) for g in groups for v in layer_values(g, "gain_R")),
                   default=int(setting(rows.base.first, "model.n_layers", "0") or 0))
    body = [[shortest(gamma_of(g.first)), g.status(), g.steps()]
            + [fmt_group(col, "", 3) if col else g.missing() for key in ("gain_R", "gain_R_attn")
               for col in layer_columns(g, key, n_layers)] for g in groups]
    out.append(markdown(["γ", "runs done", "steps"] + [f"gain_R layer {i}" for i in range(n_layers)]
                        + [f"gain_R_attn layer {i}" for i in range(n_layers)], body))
    out.append("")
    for key, what in (("gain_R", "whole block"), ("gain_R_attn", "attention sublayer alone")):
        findings.add(r_noise_claim(rows, key, what, n_layers))


def r_noise_claim(rows, key, what, n_layers):
    """"R does not depend on γ", γ = 0.2 vs 0 with seeds: held when every layer's means agree
    within R_SAME_TOL, did not hold when a layer's differ by more than that and beyond the seed
    noise, and not shown when the only larger differences are within the noise."""
    text = (f"{PREFIX}R does not depend on γ, against seed noise ({key}, {what}; L = 30 chain runs, γ = 0.2 vs "
            f"0): per layer within {R_SAME_TOL:.0%}")
    a_cols, b_cols = layer_columns(rows.mom, key, n_layers), layer_columns(rows.base, key, n_layers)
    if not n_layers or not all(a_cols) or not all(b_cols):
        return Claim(text, Verdict.MISSING, "not run yet")
    if not (rows.mom.finished and rows.base.finished):
        return Claim(text, Verdict.MISSING, "not judged yet (no finished run on one side, only partial ones)")
    parts, apart = [], []
    for i, (a, b) in enumerate(zip(a_cols, b_cols)):
        rel = abs(np.mean(a) - np.mean(b)) / max(abs(np.mean(b)), 1e-12)
        d = difference(a, b)
        apart.append((rel > R_SAME_TOL, d))
        parts.append(f"layer {i}: {fmt_group(a, '', 3)} vs {fmt_group(b, '', 3)}, {rel:.1%} apart{d.note()}")

    def judge(noisy):
        if any(far and not noisy(d) for far, d in apart):
            return Verdict.NOT_HELD
        return Verdict.NOT_SHOWN if any(far for far, _ in apart) else Verdict.HELD
    verdict, old = judge(lambda d: d.noisy), judge(lambda d: d.noisy_2se)
    shown = verdict.bold()
    if verdict is Verdict.NOT_SHOWN:
        shown += f": more than {R_SAME_TOL:.0%} apart, but within the seed noise"
    return Claim(text, verdict, f"{shown}{changed_mark(verdict, old)} ({'; '.join(parts)})", old_verdict=old)


def r_figure(ctx, groups, n_layers, out):
    curves = []
    for key in ("gain_R", "gain_R_attn"):
        for i in range(n_layers):
            pts = [(gamma_of(g.first), np.mean([v[i] for v in layer_values(g, key)])) for g in groups
                   if layer_values(g, key)]
            curves.append((f"{key} layer {i}", [p[0] for p in pts], [p[1] for p in pts], None))
    lo, hi = REFERENCE_R_RANGE
    out += summary_figure(ctx, os.path.join(REFERENCE_SCALE.figures, "energy_ratio.png"), "R per layer vs γ",
                          "Energy ratio per layer vs γ (L = 30, last eval)", "γ", "ratio", curves,
                          band=(lo, hi, f"reference's range [{lo}, {hi}]"))


def r_independent_claim(groups, key, what):
    text = (f"{PREFIX}R does not depend on γ ({key}, {what}): per layer, (max − min) / mean over γ "
            f"within {R_SAME_TOL:.0%}")
    means = [(gamma_of(g.first), np.mean(layer_values(g, key), axis=0)) for g in groups
             if g.finished and layer_values(g, key)]
    if len(means) < 2:
        return Claim(text, Verdict.MISSING, "not run yet")
    text += f" (γ = {', '.join(shortest(gm) for gm, _ in means)}" + (
        f" of {', '.join(shortest(gamma_of(g.first)) for g in groups)})" if len(means) < len(groups) else ")")
    arr = np.array([m for _, m in means])
    spread = (arr.max(axis=0) - arr.min(axis=0)) / np.maximum(np.abs(arr.mean(axis=0)), 1e-12)
    verdict = Verdict.HELD if np.all(spread <= R_SAME_TOL) else Verdict.NOT_HELD
    shown = "; ".join(f"layer {i}: {arr[:, i].min():.3f}..{arr[:, i].max():.3f} ({spread[i]:.1%})"
                      for i in range(arr.shape[1]))
    seeds = " — one seed per γ: no spread to judge noise" if all(len(g.counted) < 2 for g in groups) else ""
    return Claim(text, verdict, f"{verdict.bold()} ({shown}){seeds}")


def r_range_claim(groups):
    lo, hi = REFERENCE_R_RANGE
    text = f"{PREFIX}R lies in the reference's range [{lo}, {hi}] for every γ and layer (gain_R_attn)"
    done = [g for g in groups if g.finished]
    if len(done) < len(groups) and done:
        text += (f" (the finished γ = {', '.join(shortest(gamma_of(g.first)) for g in done)} of "
                 f"{', '.join(shortest(gamma_of(g.first)) for g in groups)})")
    vals = [x for g in done for v in layer_values(g, "gain_R_attn") for x in v]
    if not vals:
        return Claim(text, Verdict.MISSING, "not run yet")
    verdict = Verdict.HELD if lo <= min(vals) and max(vals) <= hi else Verdict.NOT_HELD
    whole = [x for g in done for v in layer_values(g, "gain_R") for x in v]
    note = f"; gain_R (whole block) spans {min(whole):.3f}..{max(whole):.3f}" if whole else ""
    return Claim(text, verdict, f"{verdict.bold()} (ours {min(vals):.3f}..{max(vals):.3f}{note})")
