"""The results report's "Seed scale" section: the momentum seed's claims at its own configuration.

Three families of configs/experiments/suite.list (configs/experiments/README.md, "Seed scale"):

  chain_seed_L*   chain task (docs/tasks.md §2), d 256, vocabulary 1024, T 448, L = 10, 20, 30, 40,
                  γ = 0 vs 0.2, three seeds: the L = 10 and L = 30 tables and the loss-by-k table
                  beside the seed's numbers, the L_rep improvement vs L (table and figure), and
                  per L the training curves and loss by k of every run (momfmm.plot);
  chain_seed_R_*  L = 30, γ = 0, 0.1, 0.2, 0.3: the energy ratio per layer, both as gain_R (whole
                  block, residual included) and gain_R_attn (attention sublayer alone), docs/metrics.md §3;
                  one seed per γ, so the L = 30 runs of chain_seed_L* (γ = 0 vs 0.2, three seeds)
                  add R's seed spread;
  text_seed_*     bytes of text, γ = 0, 0.01, 0.05, 0.15, 0.3, three seeds: bits per byte vs γ.

Each claim is judged by momfmm.suite's rules (held / did not hold / within noise / not run). A
family with no run yet says so, with the command that runs it. momfmm.results calls section()
and hands in what it shares with the small-scale chain section (the seed's table and the
loss-by-k table writer), so that this module does not import momfmm.results back.
"""
import math
import os
import warnings

import numpy as np

from momfmm import plot
from momfmm.chain_report import l_rep_during_training, loss_by_k_table, momentum_ahead_text
from momfmm.fmt import fmt_group, fmt_value, markdown, shortest
from momfmm.results_context import figure_links, plot_runs
from momfmm.suite import (NOT_RUN, SAME_TOL, final, less_claim, momentum_label, no_worse_claim, noise_note,
                          same_claim, setting)

# The seed's numbers, as quoted in the issue (γ = 0 "baseline" vs γ = 0.2 "momentum").
SEED_IMPROVEMENT = {10: 4.1, 30: 52.5}   # L_rep improvement of γ = 0.2 over γ = 0, %
SEED_LOSS_BY_K_L30 = {"baseline": {0: 6.9860, 1: 2.3598, 2: 1.5645, 3: 1.4266, "≥10": 1.41},
                      "momentum": {0: 7.0202, 1: 1.2309, 2: 0.6515, 3: 0.5334, "≥10": 1.28}}
SEED_R_RANGE = (0.37, 0.60)              # "R = ||ΔF|| / ||Δx|| lies in [0.37, 0.60] for every configuration"
SEED_TEXT_BEST_GAMMA, SEED_TEXT_GAIN = 0.01, 0.65   # "γ = 0.01 is best (+0.65 %)"
R_SAME_TOL = 0.10                        # "R independent of γ": per layer, (max − min) / mean over γ within 10 %
K_COLUMNS = (0, 1, 2, 3, "≥10")
SEED_SCALE_HOURS = {"chain_seed": 12.5, "seed_R": 1.1, "text_seed": 1.5}   # measured, np = 2 (configs/experiments/README.md)
ONLY = {"chain_seed": "^chain_seed_L", "seed_R": "^chain_seed_R_", "text_seed": "^text_seed_"}


class Values:
    """Per-seed values computed here (not a logged metric), in the shape momfmm.suite's claim
    tests read: .vals(metric) -> [float], and .finished (False: from partial runs only, not judged)."""

    def __init__(self, vals, finished=True):
        self._vals = [v for v in vals if v is not None and math.isfinite(v)]
        self.finished = finished

    def vals(self, _metric):
        return self._vals


def gamma_of(group):
    return float(setting(group.first, "momentum.gamma", "0") or 0)


def run_precisions(groups):
    """The train.precision values the groups' runs recorded, sorted."""
    return sorted({e.run.cfg("train.precision", "fp32") or "fp32" for g in groups for e in g.ran})


def precision(group):
    """The train.precision each run of the group recorded; for a group not run yet, its config's."""
    used = run_precisions([group])
    return "/".join(used) if used else (setting(group.first, "train.precision", "fp32") or "fp32")


def precision_summary(groups):
    """One phrase for the section's opening: which precision the runs used."""
    used = run_precisions(groups)
    if not used:
        return "precision as the configs set it (fp32; no run yet)"
    if len(used) == 1:
        return f"{used[0]} in every run (the tables' precision column)"
    return f"precisions {', '.join(used)}: each row's is in its table's precision column"


def not_run_yet(ctx, fam, groups, out):
    """True (and the note with the command) when no run of the family exists yet."""
    if any(g.ran for g in groups):
        return False
    out.append(f"**Not run yet.** Run: `tools/run_experiments.sh{ctx.runner_flags} --only '{ONLY[fam]}'` "
               f"(about {shortest(SEED_SCALE_HOURS[fam])} h at np = 2 on a 2-core machine, resumable; "
               "configs/experiments/README.md), then write this report again.\n")
    return True


class ChainRoles:
    """A chain family's groups at one L: base (γ = 0) and mom (γ = 0.2)."""

    def __init__(self, groups):
        self.base = next((g for g in groups if gamma_of(g) == 0), None)
        self.mom = next((g for g in groups if gamma_of(g) == 0.2), None)


def section(ctx, fams, out, claims, seed_momentum):
    """The section into out and its claims; seed_momentum: the seed's chain table {L: {row:
    {metric: value}}}."""
    chain, r_runs, text = (fams.get((k, None), []) for k in ("chain_seed", "seed_R", "text_seed"))
    if not (chain or r_runs or text):
        return
    out.append("## Seed scale: the momentum seed's claims at its own configuration\n")
    out.append("The seed's recommended configuration: d_model 256, 8 heads (d_head 32), γ 0.2 vs 0, β 0, lr 3e-4, "
               "batch 32, weight decay 0.01, vocabulary 1024 (the chain task; 256 bytes for text), 2 layers; "
               f"{precision_summary(chain + r_runs + text)}. "
               "`configs/experiments/chain_seed.ini` and `text_seed.ini` say why T, the depth and the steps are what "
               "they are. Mean ± sample std over seeds; final eval of each finished run.\n")
    if chain:
        chain_part(ctx, chain, out, claims, seed_momentum)
    if r_runs:
        r_part(ctx, r_runs, out, claims)
    l30 = by_chain_len(chain).get(30)
    if l30 is not None and l30.base is not None and l30.mom is not None:
        r_seeds_part(l30, out, claims)
    if text:
        text_part(ctx, text, out, claims)


# ---------------------------------------------------------------- chain, L = 10 .. 40
def by_chain_len(groups):
    by_L = {}
    for g in groups:
        by_L.setdefault(int(setting(g.first, "data.chain_len", "0")), []).append(g)
    return {L: ChainRoles(gs) for L, gs in sorted(by_L.items())}


def chain_part(ctx, groups, out, claims, seed_momentum):
    out.append("### Chain task at seed scale, L = 10, 20, 30, 40 (`chain_seed.ini`)\n")
    rows_by_L = by_chain_len(groups)
    not_run_yet(ctx, "chain_seed", groups, out)
    chain_table(ctx, rows_by_L, out, seed_momentum)
    improvement_part(ctx, rows_by_L, out, claims, seed_momentum)
    if 30 in rows_by_L:
        loss_by_k_vs_seed(rows_by_L[30], out, claims)
    for L, rows in rows_by_L.items():
        loss_by_k_table(L, [g for g in (rows.base, rows.mom) if g is not None], out)
    training_part(rows_by_L, out, claims)
    chain_figures(ctx, rows_by_L, out)
    for L in (10, 30):
        if L in rows_by_L:
            chain_claims(L, rows_by_L[L], claims, seed_momentum.get(L, {}))


def training_part(rows_by_L, out, claims):
    """Per L, L_rep of both rows at each eval step, and at how many of them γ = 0.2 is ahead:
    whether momentum helps before both rows have learnt the chain, not only at the last eval
    (the seed's own baseline had not: its L_rep 1.75 at L = 30)."""
    for L, rows in rows_by_L.items():
        if rows.base is None or rows.mom is None:
            continue
        l_rep_during_training(L, rows.base, rows.mom, out)
        ahead = momentum_ahead_text(L, rows.base, rows.mom)
        if ahead:
            claims.append(("observation", "seed scale: " + ahead))


def chain_figures(ctx, rows_by_L, out):
    """Per L, the training curves and loss by k of every run, γ = 0 vs 0.2, as the small-scale
    chain sections show them."""
    links = []
    for L, rows in rows_by_L.items():
        paths = plot_runs(ctx, os.path.join("seed_scale", f"chain_L{L}"),
                          [(f"{momentum_label(g.first)} {e.name.rsplit('_', 1)[-1]}", e)
                           for g in (rows.base, rows.mom) if g is not None for e in g.members])
        links += figure_links(ctx, paths, [
            ("l_new_l_rep.png", f"seed scale, L={L}: L_new and L_rep vs step, γ=0 vs γ=0.2, all seeds"),
            ("loss_by_k.png", f"seed scale, L={L}: loss by k, γ=0 vs γ=0.2")])
    if links:
        out += ["Figures (tools/momfmm_plot.py):\n", "\n".join(links), ""]


def chain_table(ctx, rows_by_L, out, seed_momentum):
    out.append("**γ = 0 (baseline) vs γ = 0.2 (momentum)** — ours beside the seed's table (the seed gives L = 10 "
               "and L = 30)\n")
    body = []
    for L, rows in rows_by_L.items():
        seed = seed_momentum.get(L, {})
        for label, g, srow in (("baseline γ=0", rows.base, seed.get("baseline", {})),
                               ("momentum γ=0.2", rows.mom, seed.get("momentum", {}))):
            if g is None:
                continue
            body.append([L, label, g.status(), g.steps(), precision(g), g.cell("L_new"),
                         fmt_value(srow.get("L_new"), "", 4), g.cell("L_rep"), fmt_value(srow.get("L_rep"), "", 4), g.cell("delta_12"),
                         fmt_value(srow.get("delta_12"), "", 4), ctx.reproduce(g)])
    out.append(markdown(["L", "row", "runs done", "steps", "precision", "L_new (ours)", "L_new (seed)",
                         "L_rep (ours)", "L_rep (seed)", "Δ1→2 (ours)", "Δ1→2 (seed)", "reproduce"], body))
    out.append("")


def paired_l_rep(rows, how):
    """how(L_rep(γ=0), L_rep(γ=0.2)) per seed, pairing the runs of equal train.seed; pairs where
    how gives None, or a run diverged (a non-finite L_rep), are left out, as suite.values does;
    so are partial runs (their last eval is from an earlier step than their partner's)."""
    if rows.base is None or rows.mom is None:
        return []
    base = {e.seed: final(e, "L_rep") for e in rows.base.done}
    out = []
    for e in rows.mom.done:
        b, m = base.get(e.seed), final(e, "L_rep")
        v = how(b, m) if b is not None and m is not None and math.isfinite(b) and math.isfinite(m) else None
        if v is not None:
            out.append(v)
    return out


def improvements(rows):
    """Per-seed L_rep improvement of γ = 0.2 over γ = 0 in %."""
    return paired_l_rep(rows, lambda b, m: 100.0 * (b - m) / b if b > 0 else None)


def seed_difference(seed_momentum, L):
    """The seed's L_rep(γ=0) − L_rep(γ=0.2) at L, or None where it gives no pair."""
    rows = seed_momentum.get(L, {})
    b, m = rows.get("baseline", {}).get("L_rep"), rows.get("momentum", {}).get("L_rep")
    return b - m if b is not None and m is not None else None


def improvement_part(ctx, rows_by_L, out, claims, seed_momentum):
    imp = {L: improvements(rows) for L, rows in rows_by_L.items()}
    out.append("**L_rep improvement vs L**: 100 (L_rep(γ=0) − L_rep(γ=0.2)) / L_rep(γ=0), per seed (runs of equal "
               "`train.seed` paired), mean ± std; beside it the difference L_rep(γ=0) − L_rep(γ=0.2) in nats, "
               "which a near-zero L_rep(γ=0) does not inflate\n")
    diff = {L: paired_l_rep(rows, lambda b, m: b - m) for L, rows in rows_by_L.items()}
    seed_diff = {L: seed_difference(seed_momentum, L) for L in rows_by_L}
    body = [[L, fmt_group(v, "", 1) if v else NOT_RUN, len(v), fmt_value(SEED_IMPROVEMENT.get(L), "", 1),
             fmt_group(diff[L], "", 4) if diff[L] else NOT_RUN, fmt_value(seed_diff[L], "", 4)]
            for L, v in imp.items()]
    out.append(markdown(["L", "improvement % (ours)", "seeds", "improvement % (seed)", "difference (ours)",
                         "difference (seed)"], body))
    out.append("")
    by_l_figure(ctx, "l_rep_improvement.png", "L_rep improvement of γ=0.2 over γ=0 vs chain length",
                "improvement (%)", imp, SEED_IMPROVEMENT, out)
    # in nats: unlike the %, a near-zero L_rep(γ=0) does not blow it up
    by_l_figure(ctx, "l_rep_difference.png", "L_rep(γ=0) − L_rep(γ=0.2) vs L (above 0: momentum recalls better)",
                "difference (nats)", diff, seed_diff, out)
    if 10 in imp and 30 in imp:
        claims.append(grows_claim(imp[10], imp[30]))
    shown = [f"L={L}: {fmt_group(v, '', 1)} %" for L, v in imp.items() if v]
    if shown:
        claims.append(("observation", "seed scale: L_rep improvement of γ=0.2 over γ=0 by L: " + ", ".join(shown)))


def by_l_figure(ctx, name, title, ylabel, ours_by_L, seed_by_L, out):
    """Ours (mean ± std over the per-seed values at each L) beside the seed's, vs L."""
    if not ctx.figures or ctx.args.no_figures:
        return
    ours = [(L, np.mean(v), np.std(v, ddof=1) if len(v) > 1 else 0.0) for L, v in ours_by_L.items() if v]
    seed = sorted((L, v) for L, v in seed_by_L.items() if v is not None)
    path = plot.plot_points(os.path.join(ctx.figures, "seed_scale", name), title, "chain length L", ylabel,
                            [("ours (mean ± std over seeds)", [a[0] for a in ours], [a[1] for a in ours],
                              [a[2] for a in ours]),
                             ("seed", [a[0] for a in seed], [a[1] for a in seed], None)])
    if path:
        out += [f"![{title}]({ctx.rel(path)})", ""]


def grows_claim(imp10, imp30):
    """"The advantage grows with L": the L = 30 improvement is larger than the L = 10 one, and
    positive. Without the second test, two losses of momentum (say −1168 % and −18 %) would
    read as a growing advantage; with it, no advantage at L = 30 does not hold, whatever the
    noise between the two lengths."""
    text = (f"seed scale: the advantage grows with L: L_rep improvement at L=30 is larger than at L=10, and "
            f"positive (seed: {SEED_IMPROVEMENT[30]}% vs {SEED_IMPROVEMENT[10]}%; per-seed %)")
    verdict, line = less_claim(text, Values(imp10), Values(imp30), "improvement", flip=True)
    if verdict not in ("held", "within noise") or np.mean(imp30) > 0:
        return verdict, line
    return ("did not hold", f"{text}: **did not hold**: γ=0.2 has no advantage at L=30 to grow "
            f"(improvement {fmt_group(imp30, '', 1)} % at L=30, {fmt_group(imp10, '', 1)} % at L=10)")


def k_value(e, k):
    """The last eval's loss_by_k bin k of one run; "≥10": the plain mean of the populated bins
    10 .. 15 (the logged bins carry no counts to weight them by)."""
    table = e.run.eval.get("loss_by_k") if e.run is not None else None
    if table is None or table.ndim != 2 or not len(table):
        return None
    row = np.asarray(table[-1], float)
    if k == "≥10":
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            v = float(np.nanmean(row[10:]))
    else:
        v = float(row[k])
    return v if math.isfinite(v) else None


def k_values(group, k):
    return Values([k_value(e, k) for e in group.counted], group.finished) if group is not None else None


def loss_by_k_vs_seed(rows, out, claims):
    out.append("**Eval loss by occurrence count k, L = 30, beside the seed's** (last eval, mean ± std over seeds; "
               "k ≥ 10 = plain mean of our bins 10 .. 15)\n")
    body = []
    for label, key, g in (("baseline γ=0", "baseline", rows.base), ("momentum γ=0.2", "momentum", rows.mom)):
        vals = [k_values(g, k).vals(None) if g is not None else [] for k in K_COLUMNS]
        body.append([f"{label} (ours)"] + [fmt_group(v, "", 4) if v else NOT_RUN for v in vals])
        body.append([f"{label} (seed)"] + [fmt_value(SEED_LOSS_BY_K_L30[key][k], "", 4) if k != "≥10"
                                           else f"≈{SEED_LOSS_BY_K_L30[key][k]}" for k in K_COLUMNS])
    out.append(markdown(["row"] + [f"k={k}" if k != "≥10" else "k≥10" for k in K_COLUMNS], body))
    out.append("")
    sb, sm = SEED_LOSS_BY_K_L30["baseline"], SEED_LOSS_BY_K_L30["momentum"]
    for k in (1, 2, 3, "≥10"):
        kt = "k ≥ 10" if k == "≥10" else f"k = {k}"
        claims.append(less_claim(f"seed scale: γ=0.2 lowers the loss at {kt} at L=30 (seed: {sm[k]} vs {sb[k]})",
                                 k_values(rows.mom, k), k_values(rows.base, k), "loss_by_k")
                      if rows.mom is not None and rows.base is not None
                      else ("not run", f"seed scale: γ=0.2 lowers the loss at {kt} at L=30: not run (no suite line)"))


def chain_claims(L, rows, claims, seed):
    sb, sm = seed.get("baseline", {}), seed.get("momentum", {})

    def seed_text(metric):
        return (f"seed: {sm[metric]:.4f} vs {sb[metric]:.4f}" if metric in sm and metric in sb
                else "seed gives no number")
    claims.append(less_claim(f"seed scale: γ=0.2 lowers L_rep at L={L} ({seed_text('L_rep')})", rows.mom, rows.base,
                             "L_rep"))
    if "delta_12" in sm:
        claims.append(less_claim(f"seed scale: γ=0.2 raises Δ1→2 at L={L} ({seed_text('delta_12')})", rows.base,
                                 rows.mom, "delta_12", flip=True))
    if "L_new" in sm:
        claims.append(same_claim(f"seed scale: γ=0.2 leaves L_new about unchanged at L={L} ({seed_text('L_new')}; "
                                 f"tolerance {SAME_TOL:.0%} relative)", rows.mom, rows.base, "L_new"))


# ---------------------------------------------------------------- energy ratio R
def layer_values(group, key):
    """[[per-layer values of the last eval] per run], runs that logged `key` only."""
    out = []
    for e in group.counted:
        table = e.run.eval.get(key)
        if table is not None and table.ndim == 2 and len(table) and np.all(np.isfinite(table[-1])):
            out.append(np.asarray(table[-1], float))
    return out


def r_part(ctx, groups, out, claims):
    out.append("### Energy ratio R per layer vs γ at seed scale (L = 30)\n")
    out.append("Two definitions, both with the same random δ (‖δ‖ = 10⁻³ ‖x‖) per layer and sample, last eval, "
               "docs/metrics.md §3: **gain_R** = ‖F(x+δ) − F(x)‖/‖δ‖ for the whole block F (attention and MLP "
               "sublayers with their residual paths, so ≈ 1 plus what the sublayers add); **gain_R_attn** = "
               "‖A(LN1(x+δ)) − A(LN1(x))‖/‖δ‖ for the attention sublayer A alone, without its residual path — the "
               f"definition the seed's range [{SEED_R_RANGE[0]}, {SEED_R_RANGE[1]}] matches.\n")
    groups = sorted(groups, key=gamma_of)
    not_run_yet(ctx, "seed_R", groups, out)
    n_layers = max((len(v) for g in groups for v in layer_values(g, "gain_R")), default=0)
    body = []
    for g in groups:
        cells = []
        for key in ("gain_R", "gain_R_attn"):
            per_run = layer_values(g, key)
            cells += [fmt_group([v[i] for v in per_run], "", 3) if per_run else g.missing()
                      for i in range(n_layers)]
        body.append([shortest(gamma_of(g)), g.status(), g.steps(), precision(g)] + cells + [ctx.reproduce(g)])
    header = (["γ", "runs done", "steps", "precision"] + [f"gain_R layer {i}" for i in range(n_layers)]
              + [f"gain_R_attn layer {i}" for i in range(n_layers)] + ["reproduce"])
    out.append(markdown(header, body))
    out.append("")
    r_figure(ctx, groups, n_layers, out)
    for key, what in (("gain_R", "whole block, residual included"), ("gain_R_attn", "attention sublayer alone")):
        claims.append(r_independent_claim(groups, key, what))
    claims.append(r_range_claim(groups))


def r_seeds_part(rows, out, claims):
    """R with its seed spread: the R family has one seed per γ, so the L = 30 runs of the chain
    family (γ = 0 and 0.2, several seeds, longer training) show whether a difference over γ is
    larger than the noise between seeds."""
    groups = [rows.base, rows.mom]
    out.append("**R with seed spread: the L = 30 runs of the chain family** (γ = 0 vs 0.2, their own steps, last "
               "eval, mean ± std over seeds; the R family above has one seed per γ)\n")
    n_layers = max((len(v) for g in groups for v in layer_values(g, "gain_R")),
                   default=int(setting(rows.base.first, "model.n_layers", "0") or 0))
    body = [[shortest(gamma_of(g)), g.status(), g.steps()]
            + [fmt_group(col, "", 3) if col else g.missing() for key in ("gain_R", "gain_R_attn")
               for col in layer_columns(g, key, n_layers)] for g in groups]
    out.append(markdown(["γ", "runs done", "steps"] + [f"gain_R layer {i}" for i in range(n_layers)]
                        + [f"gain_R_attn layer {i}" for i in range(n_layers)], body))
    out.append("")
    for key, what in (("gain_R", "whole block"), ("gain_R_attn", "attention sublayer alone")):
        claims.append(r_noise_claim(rows, key, what, n_layers))


def layer_columns(group, key, n_layers):
    """Per layer, the last eval's value of `key` of each run: [[run values] per layer]."""
    per_run = layer_values(group, key)
    return [[v[i] for v in per_run if len(v) > i] for i in range(n_layers)]


def r_noise_claim(rows, key, what, n_layers):
    """"R does not depend on γ", γ = 0.2 vs 0 with seeds: held when every layer's means agree
    within R_SAME_TOL, did not hold when a layer's differ by more than that and beyond the seed
    noise, and not shown (within noise) when the only larger differences are within the noise."""
    text = (f"seed scale: R does not depend on γ, against seed noise ({key}, {what}; L = 30 chain runs, γ = 0.2 vs "
            f"0): per layer within {R_SAME_TOL:.0%}")
    a_cols, b_cols = layer_columns(rows.mom, key, n_layers), layer_columns(rows.base, key, n_layers)
    if not n_layers or not all(a_cols) or not all(b_cols):
        return ("not run", f"{text}: not run yet")
    if not (rows.mom.finished and rows.base.finished):
        return ("not run", f"{text}: not judged yet (no finished run on one side, only partial ones)")
    parts, apart, noisy_apart = [], False, False
    for i, (a, b) in enumerate(zip(a_cols, b_cols)):
        rel = abs(np.mean(a) - np.mean(b)) / max(abs(np.mean(b)), 1e-12)
        note, noisy = noise_note(a, b)
        apart |= rel > R_SAME_TOL and not noisy
        noisy_apart |= rel > R_SAME_TOL and noisy
        parts.append(f"layer {i}: {fmt_group(a, '', 3)} vs {fmt_group(b, '', 3)}, {rel:.1%} apart{note}")
    if apart:
        verdict, shown = "did not hold", "**did not hold**"
    elif noisy_apart:
        verdict, shown = "within noise", f"**not shown**: more than {R_SAME_TOL:.0%} apart, but within the seed noise"
    else:
        verdict, shown = "held", "**held**"
    return (verdict, f"{text}: {shown} ({'; '.join(parts)})")


def r_figure(ctx, groups, n_layers, out):
    if not ctx.figures or ctx.args.no_figures or not n_layers:
        return
    curves = []
    for key in ("gain_R", "gain_R_attn"):
        for i in range(n_layers):
            pts = [(gamma_of(g), np.mean([v[i] for v in layer_values(g, key)])) for g in groups if layer_values(g, key)]
            curves.append((f"{key} layer {i}", [p[0] for p in pts], [p[1] for p in pts], None))
    path = plot.plot_points(os.path.join(ctx.figures, "seed_scale", "energy_ratio.png"),
                            "Energy ratio per layer vs γ (L = 30, last eval)", "γ", "ratio",
                            curves, band=(*SEED_R_RANGE, f"seed's range [{SEED_R_RANGE[0]}, {SEED_R_RANGE[1]}]"))
    if path:
        out += [f"![R per layer vs γ]({ctx.rel(path)})", ""]


def r_independent_claim(groups, key, what):
    text = (f"seed scale: R does not depend on γ ({key}, {what}): per layer, (max − min) / mean over γ "
            f"within {R_SAME_TOL:.0%}")
    means = [(gamma_of(g), np.mean(layer_values(g, key), axis=0)) for g in groups
             if g.finished and layer_values(g, key)]
    if len(means) < 2:
        return ("not run", f"{text}: not run yet")
    text += f" (γ = {', '.join(shortest(gm) for gm, _ in means)}" + (
        f" of {', '.join(shortest(gamma_of(g)) for g in groups)})" if len(means) < len(groups) else ")")
    arr = np.array([m for _, m in means])
    spread = (arr.max(axis=0) - arr.min(axis=0)) / np.maximum(np.abs(arr.mean(axis=0)), 1e-12)
    verdict = "held" if np.all(spread <= R_SAME_TOL) else "did not hold"
    shown = "; ".join(f"layer {i}: {arr[:, i].min():.3f}..{arr[:, i].max():.3f} ({spread[i]:.1%})"
                      for i in range(arr.shape[1]))
    seeds = " — one seed per γ: no spread to judge noise" if all(len(g.counted) < 2 for g in groups) else ""
    return (verdict, f"{text}: **{verdict}** ({shown}){seeds}")


def r_range_claim(groups):
    lo, hi = SEED_R_RANGE
    text = f"seed scale: R lies in the seed's range [{lo}, {hi}] for every γ and layer (gain_R_attn)"
    done = [g for g in groups if g.finished]
    if len(done) < len(groups) and done:
        text += (f" (the finished γ = {', '.join(shortest(gamma_of(g)) for g in done)} of "
                 f"{', '.join(shortest(gamma_of(g)) for g in groups)})")
    groups = done
    vals = [x for g in groups for v in layer_values(g, "gain_R_attn") for x in v]
    if not vals:
        return ("not run", f"{text}: not run yet")
    verdict = "held" if lo <= min(vals) and max(vals) <= hi else "did not hold"
    whole = [x for g in groups for v in layer_values(g, "gain_R") for x in v]
    note = f"; gain_R (whole block) spans {min(whole):.3f}..{max(whole):.3f}" if whole else ""
    return (verdict, f"{text}: **{verdict}** (ours {min(vals):.3f}..{max(vals):.3f}{note})")


# ---------------------------------------------------------------- text, γ sweep
def text_part(ctx, groups, out, claims):
    out.append("### Text at seed scale: bits per byte vs γ (`text_seed.ini`)\n")
    groups = sorted(groups, key=gamma_of)
    not_run_yet(ctx, "text_seed", groups, out)
    base = next((g for g in groups if gamma_of(g) == 0), None)
    b0 = base.mean("bpb") if base is not None else None
    body = []
    for g in groups:
        m = g.mean("bpb")
        rel = f"{100 * (b0 - m) / b0:+.2f} %" if m is not None and b0 else "—"
        body.append([shortest(gamma_of(g)), g.status(), g.steps(), precision(g), g.cell("bpb"), rel,
                     g.cell("loss"), ctx.reproduce(g)])
    out.append(markdown(["γ", "runs done", "steps", "precision", "bits per byte", "improvement vs γ=0", "loss (nats)",
                         "reproduce"], body))
    out.append("")
    if ctx.figures and not ctx.args.no_figures:
        pts = [(gamma_of(g), g.vals("bpb")) for g in groups if g.vals("bpb")]
        path = plot.plot_points(os.path.join(ctx.figures, "seed_scale", "text_bpb_vs_gamma.png"),
                                "Text: eval bits per byte vs γ (mean ± std over seeds)", "γ", "bits per byte",
                                [("ours", [p[0] for p in pts], [np.mean(p[1]) for p in pts],
                                  [np.std(p[1], ddof=1) if len(p[1]) > 1 else 0.0 for p in pts])])
        if path:
            out += [f"![text bits per byte vs γ]({ctx.rel(path)})", ""]
    for g in groups:
        if 0 < gamma_of(g) <= 0.15:
            claims.append(no_worse_claim(f"seed scale: text: γ={shortest(gamma_of(g))} does not degrade bits per byte "
                                         "vs γ=0 (seed: no degradation for γ ≤ 0.15)", g, base, "bpb"))
    best = next((g for g in groups if gamma_of(g) == SEED_TEXT_BEST_GAMMA), None)
    claims.append(less_claim(f"seed scale: text: γ={SEED_TEXT_BEST_GAMMA} lowers bits per byte vs γ=0 "
                             f"(seed: +{SEED_TEXT_GAIN} %)", best, base, "bpb"))
    claims.append(best_claim(groups, best))


def best_claim(groups, best):
    text = f"seed scale: text: γ={SEED_TEXT_BEST_GAMMA} has the lowest bits per byte of the sweep"
    ran = [g for g in groups if g.vals("bpb")]
    if best is None or best not in ran or len(ran) < 2:
        return ("not run", f"{text}: not run yet")
    runner_up = min((g for g in ran if g is not best), key=lambda g: g.mean("bpb"))
    lowest = min(ran, key=lambda g: g.mean("bpb"))
    verdict, line = less_claim(text, best, runner_up if lowest is best else lowest, "bpb")
    other = runner_up if lowest is best else lowest
    return verdict, f"{line}; compared with the {'runner-up' if lowest is best else 'lowest'}, γ={shortest(gamma_of(other))}"
