"""The chain task's report, for both scales: the 2-core family (`chain_L10.ini`, `chain_L30.ini`:
one section per L, with ablations and a γ sweep) and the reference-scale family
(`chain_seed.ini`, momfmm.results.reference_scale: L = 10 .. 40 in one section).

Shared by both: the roles of a family's groups at one L (ChainRoles), our numbers beside the
reference's, L_rep of γ = 0 vs γ = 0.2 at each eval step, the eval loss by occurrence count k
(docs/metrics.md §3 `loss_by_k`), the figures of every run of γ = 0 and γ = 0.2, and the claims
of the reference's chain table. A Scale says how one scale names its claims and figures.
"""
import dataclasses
import math
import os
import warnings

import numpy as np

from momfmm.fmt import fmt_value, markdown, shortest
from momfmm.results.claims import SAME_TOL, less_claim, same_claim
from momfmm.results.figures import first_seed, run_figures
from momfmm.results.reference import REFERENCE_MOMENTUM
from momfmm.results.runs import eval_steps
from momfmm.results.stats import difference
from momfmm.results.suite import gamma_of, momentum_label, setting, unanchored


@dataclasses.dataclass(frozen=True)
class Scale:
    """How one scale names things: the prefix of its claims and observations and of its figures'
    captions, the directory of its figures under the report's figures/ ("" for none of its
    own), and there the directory of an L's figures of γ = 0 vs 0.2."""
    claim_prefix: str
    caption_prefix: str
    figures: str
    main_figures: str      # format string of L

    def main_figures_dir(self, L):
        return os.path.join(self.figures, self.main_figures.format(L=L))


TWO_CORE = Scale("", "", "", "chain_L{L}_main")
REFERENCE_SCALE = Scale("reference scale: ", "reference scale, ", "reference_scale", "chain_L{L}")


def ablation_of(group):
    """"" for the anchored, post_rope shear; else "unanchored" or "pre_rope"."""
    e = group.first
    if unanchored(e):
        return "unanchored"
    return "" if setting(e, "momentum.placement", "post_rope") == "post_rope" else "pre_rope"


class ChainRoles:
    """A chain family's groups at one L by role: base (γ=0) and mom (γ=0.2), both anchored and
    post_rope; abl, the ablations (unanchored, pre_rope); sweep, every anchored post_rope γ;
    shown, the rows of the loss-by-k table."""

    def __init__(self, groups):
        plain = {}
        for g in groups:
            if not ablation_of(g):
                plain[gamma_of(g.first)] = g
        self.base, self.mom = plain.get(0.0), plain.get(0.2)
        self.abl = [g for g in groups if ablation_of(g)]
        self.sweep = [plain[k] for k in sorted(plain)]
        self.shown = [g for g in ([self.base, self.mom] + self.abl) if g is not None]


def by_chain_len(groups):
    """{L: ChainRoles} of a family's groups, by data.chain_len."""
    by_L = {}
    for g in groups:
        by_L.setdefault(int(setting(g.first, "data.chain_len", "0")), []).append(g)
    return {L: ChainRoles(gs) for L, gs in sorted(by_L.items())}


# ---------------------------------------------------------------- tables
def main_rows(L, roles):
    """[(label, group, the reference's row)] of γ = 0 vs γ = 0.2 at L."""
    reference = REFERENCE_MOMENTUM.get(L, {})
    return [("baseline γ=0", roles.base, reference.get("baseline", {})),
            ("momentum γ=0.2", roles.mom, reference.get("momentum", {}))]


BESIDE_REFERENCE = ["L_new (ours)", "L_new (reference)", "L_rep (ours)", "L_rep (reference)", "Δ1→2 (ours)",
                    "Δ1→2 (reference)"]


def beside_reference(group, reference_row):
    """Our L_new, L_rep and Δ1→2 cells, each beside the reference's (columns BESIDE_REFERENCE)."""
    return [cell for m in ("L_new", "L_rep", "delta_12")
            for cell in (group.cell(m), fmt_value(reference_row.get(m), "", 4))]


def l_rep_during_training(L, base, mom, out):
    """Mean L_rep of γ = 0 and γ = 0.2 at evenly spaced eval steps: the reference's single
    number may come from a stage of training other than our last eval."""
    steps = eval_steps([base, mom], most=10)
    if not steps:
        return
    out.append(f"**L_rep during training, L = {L}** (mean over seeds at each eval step)\n")
    rows = [[label] + [fmt_value(g.mean_at("L_rep", s), "", 3) for s in steps]
            for label, g in (("baseline γ=0", base), ("momentum γ=0.2", mom))]
    out.append(markdown(["row"] + [f"step {s}" for s in steps], rows))
    out.append("")


def last_loss_by_k(group):
    """Mean over the counted runs of the last eval's loss_by_k row (bins no target reached stay
    NaN), or None when no run logged it."""
    rows_k = [e.run.eval["loss_by_k"][-1] for e in group.counted
              if "loss_by_k" in e.run.eval and e.run.eval["loss_by_k"].ndim == 2 and len(e.run.eval["loss_by_k"])]
    if not rows_k:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # bins no target reached stay NaN
        return np.nanmean(np.asarray(rows_k, float), axis=0)


def loss_by_k_table(L, shown, out):
    """Eval loss by occurrence count k (docs/metrics.md §3 loss_by_k), last eval, mean over seeds."""
    per = [(g, last_loss_by_k(g)) for g in shown]
    kmax = 0
    for _, m in per:
        finite = np.where(np.isfinite(m))[0] if m is not None else []
        if len(finite):
            kmax = max(kmax, int(finite[-1]))
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


def observe_ahead(scale, L, roles, findings):
    """The observation of momentum_ahead_text, when both rows have an eval step in common."""
    ahead = momentum_ahead_text(L, roles.base, roles.mom) if roles.base is not None and roles.mom is not None else None
    if ahead:
        findings.observe(scale.claim_prefix + ahead)


# ---------------------------------------------------------------- figures
def main_figure_links(ctx, scale, L, roles):
    """The training curves and loss by k of every run of γ = 0 and γ = 0.2 at L, as links."""
    p = scale.caption_prefix
    return run_figures(ctx, scale.main_figures_dir(L),
                       [(f"{momentum_label(g.first)} {e.name.rsplit('_', 1)[-1]}", e)
                        for g in (roles.base, roles.mom) if g is not None for e in g.members],
                       [("l_new_l_rep.png", f"{p}L={L}: L_new and L_rep vs step, γ=0 vs γ=0.2, all seeds"),
                        ("loss_by_k.png", f"{p}L={L}: loss by k, γ=0 vs γ=0.2")])


# ---------------------------------------------------------------- claims
def reference_pair(L, metric):
    """The reference's "γ=0.2 vs γ=0" numbers of metric at L (Claim.reference), or None."""
    reference = REFERENCE_MOMENTUM.get(L, {})
    b, m = reference.get("baseline", {}).get(metric), reference.get("momentum", {}).get(metric)
    return f"{m:.4f} vs {b:.4f}" if m is not None and b is not None else None


def reference_claims(scale, L, roles, findings):
    """The reference's chain-table claims at L: γ=0.2 lowers L_rep, raises Δ1→2 and leaves L_new
    about unchanged (the last two where the reference gives the numbers)."""
    p, given = scale.claim_prefix, REFERENCE_MOMENTUM.get(L, {}).get("momentum", {})

    def quoted(metric, note=None):
        ref = reference_pair(L, metric)
        notes = ([] if ref is not None else ["the reference gives no number"]) + ([note] if note else [])
        return dict(reference=ref, note="; ".join(notes) or None)
    findings.add(less_claim(f"{p}γ=0.2 lowers L_rep at L={L}", roles.mom, roles.base, "L_rep", **quoted("L_rep")))
    if "delta_12" in given:
        findings.add(less_claim(f"{p}γ=0.2 raises Δ1→2 at L={L}", roles.base, roles.mom, "delta_12", flip=True,
                                **quoted("delta_12")))
    if "L_new" in given:
        findings.add(same_claim(f"{p}γ=0.2 leaves L_new about unchanged at L={L}", roles.mom, roles.base, "L_new",
                                **quoted("L_new", f"tolerance {SAME_TOL:.0%} relative")))


# ---------------------------------------------------------------- the 2-core family
def chain_section(ctx, L, groups, out, findings):
    """One L of the 2-core chain family: tables, loss by k, figures, claims."""
    out.append(f"### Chain task, L = {L}\n")
    cfgs = sorted({g.first.config for g in groups})
    out.append(f"Config: {', '.join(f'`{c}`' for c in cfgs)}; overrides per row below. Final eval of each run "
               "(docs/metrics.md §3), mean ± sample std over the seeds.\n")
    roles = ChainRoles(groups)
    main_table(ctx, L, roles, out)
    ablation_table(ctx, L, roles, out)
    if roles.base is not None and roles.mom is not None:
        l_rep_during_training(L, roles.base, roles.mom, out)
    sweep_table(ctx, L, roles, out)
    loss_by_k_table(L, roles.shown, out)
    two_core_figures(ctx, L, roles, out)
    reference_claims(TWO_CORE, L, roles, findings)
    ablation_claims(L, roles, findings)
    observe_ahead(TWO_CORE, L, roles, findings)
    observe_sweep(L, roles, findings)


def main_table(ctx, L, roles, out):
    """The reference's table (γ = 0 vs 0.2), ours beside it."""
    out.append(f"**γ = 0 (baseline) vs γ = 0.2 (momentum), L = {L}** — ours beside the reference's table\n")
    rows = []
    for label, g, reference_row in main_rows(L, roles):
        if g is None:
            rows.append([label, "no suite line"] + ["—"] * 8)
            continue
        rows.append([label, g.status(), g.steps()] + beside_reference(g, reference_row) + [ctx.reproduce(g)])
    out.append(markdown(["row", "runs done", "steps"] + BESIDE_REFERENCE + ["reproduce"], rows))
    out.append("")


def ablation_table(ctx, L, roles, out):
    base, mom = roles.base, roles.mom
    if not roles.abl and mom is None:
        return
    out.append(f"**Ablations at γ = 0.2, L = {L}**: unanchored first difference (`momentum.anchor = false`) "
               "and shear before RoPE (`momentum.placement = pre_rope`)\n")
    rows = []
    for g in ([base, mom] if base else [mom]) + roles.abl:
        if g is None:
            continue
        plain = not ablation_of(g) and gamma_of(g.first) != 0
        rows.append([momentum_label(g.first) + (", anchored, post_rope" if plain else ""),
                     g.status(), g.cell("L_new"), g.cell("L_rep"), g.cell("delta_12"), g.cell("loss"),
                     ctx.reproduce(g)])
    out.append(markdown(["variant", "runs done", "L_new", "L_rep", "Δ1→2", "loss", "reproduce"], rows))
    out.append("")


def sweep_table(ctx, L, roles, out):
    out.append(f"**γ sweep, L = {L}** (anchored, post_rope)\n")
    rows = [[shortest(gamma_of(g.first)), g.status(), g.cell("L_new"), g.cell("L_rep"), g.cell("delta_12"),
             g.cell("loss"), ctx.reproduce(g)] for g in roles.sweep]
    out.append(markdown(["γ", "runs done", "L_new", "L_rep", "Δ1→2", "loss", "reproduce"], rows))
    out.append("")


def two_core_figures(ctx, L, roles, out):
    links = main_figure_links(ctx, TWO_CORE, L, roles)
    links += run_figures(ctx, f"chain_L{L}_ablations", [(momentum_label(g.first), first_seed(g)) for g in roles.shown],
                         [("l_new_l_rep.png", f"L={L}: ablations, L_new and L_rep vs step"),
                          ("loss_by_k.png", f"L={L}: ablations, loss by k")])
    links += run_figures(ctx, f"chain_L{L}_sweep", [(momentum_label(g.first), first_seed(g)) for g in roles.sweep],
                         [("l_new_l_rep.png", f"L={L}: γ sweep, L_new and L_rep vs step"),
                          ("loss.png", f"L={L}: γ sweep, loss"),
                          ("bode.png", f"L={L}: γ sweep, momentum filter response")])
    if links:
        out.append("Figures (tools/momfmm_plot.py; the sweep and ablation figures show seed 1 of each row):\n")
        out.append("\n".join(links))
        out.append("")


def ablation_claims(L, roles, findings):
    unanch = next((g for g in roles.abl if ablation_of(g) == "unanchored"), None)
    pre = next((g for g in roles.abl if ablation_of(g) == "pre_rope"), None)
    findings.add(less_claim(f"anchoring matters at L={L}: anchored γ=0.2 has lower L_rep than unanchored",
                            roles.mom, unanch, "L_rep",
                            note="docs/model.md §1.2: the unanchored variant is kinematically inconsistent"))
    findings.add(less_claim(f"Placement Corollary at L={L}: shearing after RoPE (post_rope) gives lower L_rep than "
                            "before it (pre_rope), at γ=0.2", roles.mom, pre, "L_rep"))


def observe_sweep(L, roles, findings):
    """The γ of the lowest mean L_rep, each γ's L_rep, and the best against γ = 0."""
    ran = [g for g in roles.sweep if g.mean("L_rep") is not None]
    if not ran:
        return
    best = min(ran, key=lambda g: g.mean("L_rep"))
    text = (f"γ sweep at L={L}: lowest mean L_rep at γ={shortest(gamma_of(best.first))}; "
            + ", ".join(f"γ={shortest(gamma_of(g.first))}: {g.cell('L_rep')}" for g in ran))
    base = roles.base
    if base is not None and best is not base and base.vals("L_rep"):
        text += "; γ={} vs γ=0{}".format(shortest(gamma_of(best.first)),
                                         difference(best.vals("L_rep"), base.vals("L_rep")).note())
    findings.observe(text)
