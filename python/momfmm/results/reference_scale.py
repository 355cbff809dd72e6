"""The results report's "Reference scale" section: the momentum reference's claims at its own configuration.

Three families of configs/experiments/suite.list (configs/experiments/README.md, "Seed scale"):

  chain_seed_L*   chain task (docs/tasks.md §2), d 256, vocabulary 1024, T 448, L = 10, 20, 30, 40,
                  γ = 0 vs 0.2, three seeds: the L = 10 and L = 30 tables and the loss-by-k table
                  beside the reference's numbers, the L_rep improvement vs L (table and figure), and
                  per L the training curves and loss by k of every run (momfmm.plot);
  chain_seed_R_*  L = 30, γ = 0, 0.1, 0.2, 0.3: the energy ratio per layer (momfmm.results.energy_ratio);
  text_seed_*     bytes of text, γ = 0, 0.01, 0.05, 0.15, 0.3, three seeds: bits per byte vs γ.

Each claim is judged by momfmm.results.claims' rules. A family with no run yet says so, with the
command that runs it. The chain part is momfmm.results.chain's, as for the 2-core family.
"""
import dataclasses
import math
import os
import warnings

import numpy as np

from momfmm.fmt import fmt_group, fmt_value, markdown, shortest
from momfmm.results import energy_ratio
from momfmm.results.chain import (BESIDE_REFERENCE, REFERENCE_SCALE, beside_reference, by_chain_len,
                                  l_rep_during_training, loss_by_k_table, main_figure_links, main_rows,
                                  observe_ahead, reference_claims)
from momfmm.results.claims import Claim, Verdict, changed_mark, less_claim, no_worse_claim
from momfmm.results.figures import summary_figure
from momfmm.results.reference import (REFERENCE_IMPROVEMENT, REFERENCE_LOSS_BY_K_L30, REFERENCE_MOMENTUM,
                                      REFERENCE_TEXT_BEST_GAMMA, REFERENCE_TEXT_GAIN)
from momfmm.results.runs import NOT_RUN, final, precision, precision_summary
from momfmm.results.suite import gamma_of

PREFIX = REFERENCE_SCALE.claim_prefix
K_COLUMNS = (0, 1, 2, 3, "≥10")
HOURS = {"chain_seed": 12.5, "chain_seed_R": 1.1, "text_seed": 1.5}   # measured, np = 2 (configs/experiments/README.md)
ONLY = {"chain_seed": "^chain_seed_L", "chain_seed_R": "^chain_seed_R_", "text_seed": "^text_seed_"}


class Values:
    """Per-seed values computed here (not a logged metric), in the shape the claim rules read:
    .vals(metric) -> [float], and .finished (False: from partial runs only, not judged)."""

    def __init__(self, vals, finished=True):
        self._vals = [v for v in vals if v is not None and math.isfinite(v)]
        self.finished = finished

    def vals(self, _metric):
        return self._vals


def not_run_yet(ctx, fam, groups, out):
    """True (and the note with the command) when no run of the family exists yet."""
    if any(g.ran for g in groups):
        return False
    out.append(f"**Not run yet.** Run: `tools/run_experiments.sh{ctx.runner_flags} --only '{ONLY[fam]}'` "
               f"(about {shortest(HOURS[fam])} h at np = 2 on a 2-core machine, resumable; "
               "configs/experiments/README.md), then write this report again.\n")
    return True


def section(ctx, fams, out, findings):
    """The section into out and its claims and observations into findings."""
    chain, r_runs, text = (fams.get((k, None), []) for k in ("chain_seed", "chain_seed_R", "text_seed"))
    if not (chain or r_runs or text):
        return
    out.append("## Reference scale: the momentum reference's claims at its own configuration\n")
    out.append("The reference's recommended configuration: d_model 256, 8 heads (d_head 32), γ 0.2 vs 0, β 0, lr 3e-4, "
               "batch 32, weight decay 0.01, vocabulary 1024 (the chain task; 256 bytes for text), 2 layers; "
               f"{precision_summary(chain + r_runs + text)}. "
               "`configs/experiments/chain_seed.ini` and `text_seed.ini` say why T, the depth and the steps are what "
               "they are. Mean ± sample std over seeds; final eval of each finished run.\n")
    if chain:
        chain_part(ctx, chain, out, findings)
    if r_runs:
        groups = sorted(r_runs, key=lambda g: gamma_of(g.first))
        out.append("### Energy ratio R per layer vs γ at reference scale (L = 30)\n")
        out.append(energy_ratio.DEFINITIONS)
        not_run_yet(ctx, "chain_seed_R", groups, out)
        energy_ratio.r_part(ctx, groups, out, findings)
    l30 = by_chain_len(chain).get(30)
    if l30 is not None and l30.base is not None and l30.mom is not None:
        energy_ratio.r_seeds_part(l30, out, findings)
    if text:
        text_part(ctx, text, out, findings)


# ---------------------------------------------------------------- chain, L = 10 .. 40
def chain_part(ctx, groups, out, findings):
    out.append("### Chain task at reference scale, L = 10, 20, 30, 40 (`chain_seed.ini`)\n")
    roles_by_L = by_chain_len(groups)
    not_run_yet(ctx, "chain_seed", groups, out)
    chain_table(ctx, roles_by_L, out)
    improvement_part(ctx, roles_by_L, out, findings)
    if 30 in roles_by_L:
        loss_by_k_vs_reference(roles_by_L[30], out, findings)
    for L, roles in roles_by_L.items():
        loss_by_k_table(L, [g for g in (roles.base, roles.mom) if g is not None], out)
    for L, roles in roles_by_L.items():
        if roles.base is not None and roles.mom is not None:
            l_rep_during_training(L, roles.base, roles.mom, out)
            observe_ahead(REFERENCE_SCALE, L, roles, findings)
    links = [link for L, roles in roles_by_L.items() for link in main_figure_links(ctx, REFERENCE_SCALE, L, roles)]
    if links:
        out += ["Figures (tools/momfmm_plot.py):\n", "\n".join(links), ""]
    for L in (10, 30):
        if L in roles_by_L:
            reference_claims(REFERENCE_SCALE, L, roles_by_L[L], findings)


def chain_table(ctx, roles_by_L, out):
    out.append("**γ = 0 (baseline) vs γ = 0.2 (momentum)** — ours beside the reference's table (the reference "
               "gives L = 10 and L = 30)\n")
    body = [[L, label, g.status(), g.steps(), precision(g)] + beside_reference(g, reference_row) + [ctx.reproduce(g)]
            for L, roles in roles_by_L.items() for label, g, reference_row in main_rows(L, roles) if g is not None]
    out.append(markdown(["L", "row", "runs done", "steps", "precision"] + BESIDE_REFERENCE + ["reproduce"], body))
    out.append("")


def paired_l_rep(rows, how):
    """how(L_rep(γ=0), L_rep(γ=0.2)) per seed, pairing the runs of equal train.seed; pairs where
    how gives None, or a run diverged (a non-finite L_rep), are left out, as runs.values does;
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


def reference_difference(L):
    """The reference's L_rep(γ=0) − L_rep(γ=0.2) at L, or None where it gives no pair."""
    rows = REFERENCE_MOMENTUM.get(L, {})
    b, m = rows.get("baseline", {}).get("L_rep"), rows.get("momentum", {}).get("L_rep")
    return b - m if b is not None and m is not None else None


def improvement_part(ctx, roles_by_L, out, findings):
    imp = {L: improvements(rows) for L, rows in roles_by_L.items()}
    out.append("**L_rep improvement vs L**: 100 (L_rep(γ=0) − L_rep(γ=0.2)) / L_rep(γ=0), per seed (runs of equal "
               "`train.seed` paired), mean ± std; beside it the difference L_rep(γ=0) − L_rep(γ=0.2) in nats, "
               "which a near-zero L_rep(γ=0) does not inflate\n")
    diff = {L: paired_l_rep(rows, lambda b, m: b - m) for L, rows in roles_by_L.items()}
    reference_diff = {L: reference_difference(L) for L in roles_by_L}
    body = [[L, fmt_group(v, "", 1) if v else NOT_RUN, len(v), fmt_value(REFERENCE_IMPROVEMENT.get(L), "", 1),
             fmt_group(diff[L], "", 4) if diff[L] else NOT_RUN, fmt_value(reference_diff[L], "", 4)]
            for L, v in imp.items()]
    out.append(markdown(["L", "improvement % (ours)", "seeds", "improvement % (reference)", "difference (ours)",
                         "difference (reference)"], body))
    out.append("")
    by_l_figure(ctx, "l_rep_improvement.png", "L_rep improvement of γ=0.2 over γ=0 vs chain length",
                "improvement (%)", imp, REFERENCE_IMPROVEMENT, out)
    # in nats: unlike the %, a near-zero L_rep(γ=0) does not blow it up
    by_l_figure(ctx, "l_rep_difference.png", "L_rep(γ=0) − L_rep(γ=0.2) vs L (above 0: momentum recalls better)",
                "difference (nats)", diff, reference_diff, out)
    if 10 in imp and 30 in imp:
        findings.add(grows_claim(imp[10], imp[30]))
    shown = [f"L={L}: {fmt_group(v, '', 1)} %" for L, v in imp.items() if v]
    if shown:
        findings.observe(f"{PREFIX}L_rep improvement of γ=0.2 over γ=0 by L: " + ", ".join(shown))


def by_l_figure(ctx, name, title, ylabel, ours_by_L, reference_by_L, out):
    """Ours (mean ± std over the per-seed values at each L) beside the reference's, vs L."""
    ours = [(L, np.mean(v), np.std(v, ddof=1) if len(v) > 1 else 0.0) for L, v in ours_by_L.items() if v]
    reference = sorted((L, v) for L, v in reference_by_L.items() if v is not None)
    out += summary_figure(ctx, os.path.join(REFERENCE_SCALE.figures, name), title, title, "chain length L", ylabel,
                          [("ours (mean ± std over seeds)", [a[0] for a in ours], [a[1] for a in ours],
                            [a[2] for a in ours]),
                           ("reference", [a[0] for a in reference], [a[1] for a in reference], None)])


def grows_claim(imp10, imp30):
    """"The advantage grows with L": the L = 30 improvement is larger than the L = 10 one, and
    positive. Without the second test, two losses of momentum (say −1168 % and −18 %) would
    read as a growing advantage; with it, no advantage at L = 30 does not hold, whatever the
    noise between the two lengths."""
    c = less_claim(f"{PREFIX}the advantage grows with L: L_rep improvement at L=30 is larger than at L=10, and "
                   "positive", Values(imp10), Values(imp30), "improvement", flip=True,
                   reference=f"{REFERENCE_IMPROVEMENT[30]}% vs {REFERENCE_IMPROVEMENT[10]}%", note="per-seed %")

    def grows(verdict):  # either rule's verdict, once "and positive" is tested too
        return Verdict.NOT_HELD if verdict in (Verdict.HELD, Verdict.NOT_SHOWN) and np.mean(imp30) <= 0 else verdict
    verdict, old = grows(c.verdict), grows(c.old_verdict)
    if verdict is c.verdict:
        return dataclasses.replace(c, old_verdict=old, detail=c.detail.replace(
            changed_mark(c.verdict, c.old_verdict), changed_mark(verdict, old), 1)) if old is not c.old_verdict else c
    return dataclasses.replace(c, verdict=verdict, old_verdict=old, detail=(
        f"**did not hold**{changed_mark(verdict, old)}: γ=0.2 has no advantage at L=30 to grow (improvement "
        f"{fmt_group(imp30, '', 1)} % at L=30, {fmt_group(imp10, '', 1)} % at L=10)"))


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


def loss_by_k_vs_reference(rows, out, findings):
    out.append("**Eval loss by occurrence count k, L = 30, beside the reference's** (last eval, mean ± std over seeds; "
               "k ≥ 10 = plain mean of our bins 10 .. 15)\n")
    body = []
    for label, key, g in (("baseline γ=0", "baseline", rows.base), ("momentum γ=0.2", "momentum", rows.mom)):
        vals = [k_values(g, k).vals(None) if g is not None else [] for k in K_COLUMNS]
        body.append([f"{label} (ours)"] + [fmt_group(v, "", 4) if v else NOT_RUN for v in vals])
        body.append([f"{label} (reference)"] + [fmt_value(REFERENCE_LOSS_BY_K_L30[key][k], "", 4) if k != "≥10"
                                           else f"≈{REFERENCE_LOSS_BY_K_L30[key][k]}" for k in K_COLUMNS])
    out.append(markdown(["row"] + [f"k={k}" if k != "≥10" else "k≥10" for k in K_COLUMNS], body))
    out.append("")
    rb, rm = REFERENCE_LOSS_BY_K_L30["baseline"], REFERENCE_LOSS_BY_K_L30["momentum"]
    for k in (1, 2, 3, "≥10"):
        text = f"{PREFIX}γ=0.2 lowers the loss at {'k ≥ 10' if k == '≥10' else f'k = {k}'} at L=30"
        if rows.mom is None or rows.base is None:
            findings.add(Claim(text, Verdict.MISSING, "not run (no suite line)"))
            continue
        findings.add(less_claim(text, k_values(rows.mom, k), k_values(rows.base, k), "loss_by_k",
                                reference=f"{rm[k]} vs {rb[k]}"))


# ---------------------------------------------------------------- text, γ sweep
def text_part(ctx, groups, out, findings):
    out.append("### Text at reference scale: bits per byte vs γ (`text_seed.ini`)\n")
    groups = sorted(groups, key=lambda g: gamma_of(g.first))
    not_run_yet(ctx, "text_seed", groups, out)
    base = next((g for g in groups if gamma_of(g.first) == 0), None)
    b0 = base.mean("bpb") if base is not None else None
    body = []
    for g in groups:
        m = g.mean("bpb")
        rel = f"{100 * (b0 - m) / b0:+.2f} %" if m is not None and b0 else "—"
        body.append([shortest(gamma_of(g.first)), g.status(), g.steps(), precision(g), g.cell("bpb"), rel,
                     g.cell("loss"), ctx.reproduce(g)])
    out.append(markdown(["γ", "runs done", "steps", "precision", "bits per byte", "improvement vs γ=0", "loss (nats)",
                         "reproduce"], body))
    out.append("")
    text_figure(ctx, groups, out)
    for g in groups:
        if 0 < gamma_of(g.first) <= 0.15:
            findings.add(no_worse_claim(f"{PREFIX}text: γ={shortest(gamma_of(g.first))} does not degrade bits per "
                                        "byte vs γ=0", g, base, "bpb", reference="no degradation for γ ≤ 0.15"))
    best = next((g for g in groups if gamma_of(g.first) == REFERENCE_TEXT_BEST_GAMMA), None)
    findings.add(less_claim(f"{PREFIX}text: γ={REFERENCE_TEXT_BEST_GAMMA} lowers bits per byte vs γ=0", best, base,
                            "bpb", reference=f"+{REFERENCE_TEXT_GAIN} %"))
    findings.add(best_claim(groups, best))


def text_figure(ctx, groups, out):
    pts = [(gamma_of(g.first), g.vals("bpb")) for g in groups if g.vals("bpb")]
    out += summary_figure(ctx, os.path.join(REFERENCE_SCALE.figures, "text_bpb_vs_gamma.png"),
                          "text bits per byte vs γ", "Text: eval bits per byte vs γ (mean ± std over seeds)", "γ",
                          "bits per byte", [("ours", [p[0] for p in pts], [np.mean(p[1]) for p in pts],
                                             [np.std(p[1], ddof=1) if len(p[1]) > 1 else 0.0 for p in pts])])


def best_claim(groups, best):
    text = f"{PREFIX}text: γ={REFERENCE_TEXT_BEST_GAMMA} has the lowest bits per byte of the sweep"
    ran = [g for g in groups if g.vals("bpb")]
    if best is None or best not in ran or len(ran) < 2:
        return Claim(text, Verdict.MISSING, "not run yet")
    runner_up = min((g for g in ran if g is not best), key=lambda g: g.mean("bpb"))
    lowest = min(ran, key=lambda g: g.mean("bpb"))
    other = runner_up if lowest is best else lowest
    c = less_claim(text, best, other, "bpb")
    return dataclasses.replace(c, detail=f"{c.detail}; compared with the {'runner-up' if lowest is best else 'lowest'}, "
                                         f"γ={shortest(gamma_of(other.first))}")
