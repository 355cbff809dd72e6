"""The results report's "Chain recall" section: the momentum reference's chain claims judged
again on chain tasks that need content (docs/tasks.md §2, configs/experiments/README.md,
"Chain recall").

With one fixed period L the next chain token is always L − 1 positions back, which one head
with RoPE learns without reading content: the earlier chain verdicts measure momentum beside
a positional head. Three families of configs/experiments/suite.list, at the reference's
configuration scaled to 2 cores:

  recall_varL_*     chain_recall.ini: a period per sample, L ∈ [10, 40] (no fixed offset works);
  recall_fillers_*  chain_recall_fillers.ini: the same with filler tokens between the chain
                    tokens (the offset varies inside a sample too);
  recall_fixedL_*   chain_recall_fixedL.ini: the old fixed L = 30, kept beside them with its
                    length-generalisation loss measured, to say what the old verdicts meant.

Each row is γ = 0 vs 0.2 at 1 and 2 layers (fixed L: 2), three seeds, plus the anchor and
placement ablations at one depth. The claims are the reference's chain claims (L_rep at L = 10
and 30, loss by k, Δ1→2, L_new unchanged, the advantage growing with L), judged by
momfmm.results.claims' rules; L_rep at one period of a variable-period run comes from its
L_rep_by_period column (docs/metrics.md §3). A family not run yet says so, with the command.
"""
import dataclasses
import math
import os
import warnings

import numpy as np

from momfmm.fmt import fmt_group, markdown, shortest
from momfmm.results.chain import ChainRoles, l_rep_during_training, loss_by_k_table
from momfmm.results.claims import SAME_TOL, Claim, Verdict, less_claim, same_claim
from momfmm.results.figures import first_seed, run_figures
from momfmm.results.reference import REFERENCE_IMPROVEMENT, REFERENCE_LOSS_BY_K_L30, REFERENCE_MOMENTUM
from momfmm.results.reference_scale import grows_claim
from momfmm.results.stats import difference
from momfmm.results.suite import gamma_of, momentum_label, setting

TASKS = ("varL", "fillers", "fixedL")
ONLY = "^recall_"
HOURS = 14           # the family's wall time at np = 1, from a pilot (configs/experiments/README.md, "Chain recall")
FIGURES = "chain_recall"
NP = 1               # ranks per run (configs/experiments/README.md, "Chain recall")


def task_text(groups):
    """How a family's chains are made, from its config: "L ∈ [10, 40], fillers 0.2 (64 tokens)"."""
    e = groups[0].first
    lo, hi = int(setting(e, "data.chain_len", "10")), int(setting(e, "data.chain_len_max", "0") or 0)
    text = f"L ∈ [{lo}, {hi}]" if hi > lo else f"fixed L = {lo}"
    noise = float(setting(e, "data.chain_noise", "0") or 0)
    if noise > 0:
        text += f", fillers {shortest(noise)} ({setting(e, 'data.chain_fillers', '16')} tokens)"
    glo = int(setting(e, "data.eval_chain_len", "0") or 0)
    ghi = max(int(setting(e, "data.eval_chain_len_max", "0") or 0), glo)
    return text + (f"; length eval L ∈ [{glo}, {ghi}]" if glo else "")


def periods_label(groups, n):
    """"10 … 40, 2 layers": the L of a table header (chain's "L = {L}")."""
    e = groups[0].first
    lo, hi = int(setting(e, "data.chain_len", "10")), int(setting(e, "data.chain_len_max", "0") or 0)
    return (f"{lo} … {hi}" if hi > lo else str(lo)) + f", {n} layer{'s' if n != 1 else ''}"


def layers_of(group):
    return int(setting(group.first, "model.n_layers", "2"))


def by_depth(groups):
    """{n_layers: ChainRoles} of a family's groups, shallow first."""
    out = {}
    for g in groups:
        out.setdefault(layers_of(g), []).append(g)
    return {n: ChainRoles(gs) for n, gs in sorted(out.items())}


# ---------------------------------------------------------------- per-run values
def last_row(e, key):
    """The last eval row of column key of one run, as float array, or None."""
    if e.run is None:
        return None
    table = e.run.eval.get(key)
    if table is None or not len(table):
        return None
    return np.asarray(table[-1], float)


def finite(v):
    return v if v is not None and math.isfinite(v) else None


def period_l_rep(L):
    """The run's L_rep on its eval samples of period L (column L_rep_by_period)."""
    def value(e):
        row = last_row(e, "L_rep_by_period")
        lo = int(float(e.run.cfg("data.chain_len", "10") or 10)) if e.run is not None else 0
        if row is None or row.ndim != 1 or not 0 <= L - lo < len(row):
            return None
        return finite(float(row[L - lo]))
    return value


def k_loss(k):
    def value(e):
        row = last_row(e, "loss_by_k")
        return finite(float(row[k])) if row is not None and row.ndim == 1 and k < len(row) else None
    return value


def best_head(key):
    """The highest score over the layers and heads of an attention read-out column."""
    def value(e):
        row = last_row(e, key)
        if row is None or not np.isfinite(row).any():
            return None
        return float(np.nanmax(row))
    return value


def final_of(key):
    def value(e):
        return finite(e.run.final_eval(key)) if e.run is not None else None
    return value


class Derived:
    """Per-seed values fn(entry) of a group's counted runs, in the shape the claim rules read
    (.vals(metric), .finished); cell() as Group.cell."""

    def __init__(self, group, fn):
        self.group, self.fn = group, fn
        self.finished = group.finished if group is not None else False

    def vals(self, _metric=None):
        if self.group is None:
            return []
        return [v for v in (self.fn(e) for e in self.group.counted) if v is not None]

    def cell(self, digits=4):
        v = self.vals()
        return fmt_group(v, "", digits) if v else self.group.missing()

    def by_seed(self):
        return {e.seed: v for e in (self.group.done if self.group is not None else [])
                for v in [self.fn(e)] if v is not None}


def derived(group, fn):
    return Derived(group, fn) if group is not None else None


# ---------------------------------------------------------------- the section
def section(ctx, fams, out, findings):
    families = {t: fams.get(("recall", t), []) for t in TASKS}
    if not any(families.values()):
        return
    everyone = [g for gs in families.values() for g in gs]
    members = [e for g in everyone for e in g.members]
    done = sum(len(g.done) for g in everyone)
    out.append("## Chain recall: the momentum claims on chain tasks that need content\n")
    out.append(
        "With one fixed period L the next token of the chain is always the token L − 1 positions back, which a single "
        "head with RoPE learns without reading content: the chain verdicts above measure how momentum's shear "
        "coexists with a positional head. Here the period is drawn per sample (`data.chain_len_max`), and in the "
        "second task filler tokens sit between the chain tokens (`data.chain_noise`), so no fixed offset works and "
        "the chain must be recalled from context (docs/tasks.md §2). Every run also measures the loss on periods "
        "outside its training range (`lengen_L_rep`: a positional solution fails there) and, per head, where "
        "attention goes: the mean weight on the positional key (offset L − 1 for L = `data.chain_len`) vs the "
        "induction key (the position after the previous occurrence of the current token; docs/metrics.md §3). The "
        "old fixed L = 30 runs are made again at the same size beside them.\n")
    out.append(
        f"Configuration (`configs/experiments/chain_recall*.ini`): the reference's d_head 32, vocabulary 1024, lr 3e-4 "
        "(cosine to 3e-5), batch 32, weight decay 0.01, β 0, scaled to 2 cores: d_model 128 (4 heads) instead of 256 "
        "(8 heads), T = 128, 3000 steps, one rank per run; `*_full.ini` keep d 256, 8 heads, T 448, 5000 steps for a "
        "bigger machine (configs/experiments/README.md, \"Chain recall\", says what was cut and why). "
        f"**{done} of {len(members)} runs finished** "
        f"(run on with `tools/run_experiments.sh{ctx.runner_flags} --np {NP} --only '{ONLY}'`, resumable; about "
        f"{shortest(HOURS)} h in all at np = {NP} on this machine); everything below judges only the finished runs, "
        "\"not run\" elsewhere. Mean ± sample std over seeds; final eval of each finished run.\n")
    if not any(g.ran for g in everyone):
        out.append("**Not run yet: the runs are pending**, so no number below is measured and every claim reads "
                   f"\"not run\". Run: `tools/run_experiments.sh{ctx.runner_flags} --np {NP} --only '{ONLY}'` (about "
                   f"{shortest(HOURS)} h, resumable; configs/experiments/README.md, \"Chain recall\"), then write this "
                   "report again.\n")
    for task in ("varL", "fillers"):
        if families[task]:
            task_part(ctx, task, families[task], out, findings)
    if families["fixedL"]:
        fixed_part(ctx, families["fixedL"], families["varL"], out, findings)


def prefix(task, n):
    name = {"varL": "variable L", "fillers": "fillers", "fixedL": "fixed L = 30"}[task]
    return f"recall, {name}, {n} layer{'s' if n != 1 else ''}: "


MAIN_COLUMNS = ["layers", "row", "runs done", "steps", "L_new", "L_rep", "L_rep at L=10", "L_rep at L=30", "Δ1→2",
                "lengen L_rep", "induction (best head)", "positional (best head)", "reproduce"]


def main_row(ctx, n, label, g):
    if g is None:
        return [n, label, "no suite line"] + ["—"] * (len(MAIN_COLUMNS) - 3)
    return [n, label, g.status(), g.steps(), g.cell("L_new"), g.cell("L_rep"), Derived(g, period_l_rep(10)).cell(),
            Derived(g, period_l_rep(30)).cell(), g.cell("delta_12"), g.cell("lengen_L_rep"),
            Derived(g, best_head("attn_induction")).cell(3), Derived(g, best_head("attn_positional")).cell(3),
            ctx.reproduce(g, NP)]


def rows_of(roles):
    rows = [("baseline γ=0", roles.base), ("momentum γ=0.2", roles.mom)]
    return rows + [(momentum_label(g.first), g) for g in roles.abl]


def task_part(ctx, task, groups, out, findings):
    depths = by_depth(groups)
    title = {"varL": "a period per sample", "fillers": "a period per sample, with fillers"}[task]
    out.append(f"### Chain recall, {title}: {task_text(groups)}\n")
    body = [main_row(ctx, n, label, g) for n, roles in depths.items() for label, g in rows_of(roles)]
    out.append("**γ = 0 vs γ = 0.2 at 1 and 2 layers, and the ablations** (L_rep at L = 10 and 30: the eval samples of "
               "that period, `L_rep_by_period`; lengen: the length-generalisation eval; induction and positional: "
               "the attention read-out of the eval split, the highest score over all heads)\n")
    out.append(markdown(MAIN_COLUMNS, body))
    out.append("")
    for n, roles in depths.items():
        if roles.base is not None and roles.mom is not None:
            l_rep_during_training(periods_label(groups, n), roles.base, roles.mom, out)
    for n, roles in depths.items():
        loss_by_k_table(periods_label(groups, n), roles.shown, out)
    links = []
    for n, roles in depths.items():
        links += figure_links(ctx, task, n, roles)
    if links:
        out += ["Figures (tools/momfmm_plot.py; the attention read-out shows seed 1 of each row):\n", "\n".join(links),
                ""]
    for n, roles in depths.items():
        recall_claims(prefix(task, n), roles, findings)
        observe_lengen(prefix(task, n), roles, findings)


def figure_links(ctx, task, n, roles):
    where = os.path.join(FIGURES, f"{task}_l{n}")
    depth = f"{n} layer{'s' if n != 1 else ''}"
    pairs = [(f"{momentum_label(g.first)} {e.name.rsplit('_', 1)[-1]}", e)
             for g in (roles.base, roles.mom) if g is not None for e in g.members]
    links = run_figures(ctx, where, pairs,
                        [("l_new_l_rep.png", f"recall {task}, {depth}: L_new and L_rep vs step, γ=0 vs γ=0.2"),
                         ("lengen.png", f"recall {task}, {depth}: L_rep on training and on longer periods"),
                         ("loss_by_k.png", f"recall {task}, {depth}: loss by k")])
    seeds = [(momentum_label(g.first), first_seed(g)) for g in roles.shown]
    links += run_figures(ctx, where + "_attention", seeds,
                         [("attention.png", f"recall {task}, {depth}: attention read-out, positional vs induction")])
    return links


# ---------------------------------------------------------------- claims
def recall_claims(p, roles, findings):
    """The reference's chain claims on one recall task at one depth, and the ablations there."""
    base, mom = roles.base, roles.mom
    for L in (10, 30):
        ref = REFERENCE_MOMENTUM.get(L, {})
        reference = (f"{ref['momentum']['L_rep']:.4f} vs {ref['baseline']['L_rep']:.4f} at a fixed L"
                     if "L_rep" in ref.get("momentum", {}) else None)
        findings.add(less_claim(f"{p}γ=0.2 lowers L_rep at L={L}", derived(mom, period_l_rep(L)),
                                derived(base, period_l_rep(L)), "L_rep", reference=reference,
                                note="the eval samples of that period"))
    findings.add(grows(p, base, mom))
    for k in (1, 2, 3):
        findings.add(less_claim(f"{p}γ=0.2 lowers the loss at k = {k}", derived(mom, k_loss(k)),
                                derived(base, k_loss(k)), "loss_by_k",
                                reference=f"{REFERENCE_LOSS_BY_K_L30['momentum'][k]} vs "
                                          f"{REFERENCE_LOSS_BY_K_L30['baseline'][k]} at L = 30"))
    findings.add(less_claim(f"{p}γ=0.2 raises Δ1→2", base, mom, "delta_12", flip=True))
    findings.add(same_claim(f"{p}γ=0.2 leaves L_new about unchanged", mom, base, "L_new",
                            note=f"tolerance {SAME_TOL:.0%} relative"))
    if not roles.abl:
        return
    unanch = next((g for g in roles.abl if "unanchored" in momentum_label(g.first)), None)
    pre = next((g for g in roles.abl if "pre_rope" in momentum_label(g.first)), None)
    findings.add(less_claim(f"{p}anchoring matters: anchored γ=0.2 has lower L_rep than unanchored", mom, unanch,
                            "L_rep", note="docs/model.md §1.2: the unanchored variant is kinematically inconsistent"))
    findings.add(less_claim(f"{p}Placement Corollary: shearing after RoPE (post_rope) gives lower L_rep than before "
                            "it (pre_rope), at γ=0.2", mom, pre, "L_rep"))


def improvement(base, mom, L):
    """Per-seed % improvement of L_rep at period L, γ = 0.2 over γ = 0, runs paired by seed."""
    if base is None or mom is None:
        return []
    b, m = Derived(base, period_l_rep(L)).by_seed(), Derived(mom, period_l_rep(L)).by_seed()
    return [100.0 * (b[s] - m[s]) / b[s] for s in sorted(set(b) & set(m)) if b[s] > 0]


def grows(p, base, mom):
    """"The advantage grows with L" (reference_scale.grows_claim's rule) on L_rep at L = 10 and
    30 of the same runs."""
    text = f"{p}the advantage grows with L: L_rep improvement at L=30 is larger than at L=10, and positive"
    if base is None or mom is None:
        return Claim(text, Verdict.MISSING, "not run (no suite line)")
    imp10, imp30 = improvement(base, mom, 10), improvement(base, mom, 30)
    if not imp10 or not imp30:
        return Claim(text, Verdict.MISSING, "not run yet" if not (base.finished and mom.finished)
                     else "no seed with both rows finished", reference=f"{REFERENCE_IMPROVEMENT[30]}% vs "
                                                                      f"{REFERENCE_IMPROVEMENT[10]}%")
    return dataclasses.replace(grows_claim(imp10, imp30), text=text)


def observe_lengen(p, roles, findings):
    """Observation: the length-generalisation L_rep of γ = 0.2 vs γ = 0 (no reference claim: the
    reference does not measure it)."""
    base, mom = roles.base, roles.mom
    if base is None or mom is None or not (base.finished and mom.finished):
        return
    a, b = mom.vals("lengen_L_rep"), base.vals("lengen_L_rep")
    if a and b:
        findings.observe(f"{p}length-generalisation L_rep, γ=0.2 vs γ=0: {fmt_group(a, '', 4)} vs "
                         f"{fmt_group(b, '', 4)}{difference(a, b).note()}")


# ---------------------------------------------------------------- fixed L, beside
def fixed_part(ctx, groups, varl, out, findings):
    out.append(f"### The old task beside them: {task_text(groups)}\n")
    out.append("What the fixed-period verdicts meant: the same model and steps on one fixed period, measured on the "
               "periods of the length eval too. An L_rep far above the training period's on those periods (above "
               "ln 1024 = 6.93 when a model predicts confidently from the wrong position) is a positional "
               "solution; the read-out on the length eval, where the positional key (offset 29) and the "
               "induction key part, says which key the heads read.\n")
    depths = by_depth(groups)
    body = []
    for n, roles in depths.items():
        for label, g in rows_of(roles):
            if g is None:
                continue
            body.append([n, label, g.status(), g.steps(), g.cell("L_rep"), g.cell("lengen_L_rep"),
                         Derived(g, best_head("lengen_attn_induction")).cell(3),
                         Derived(g, best_head("lengen_attn_positional")).cell(3), ctx.reproduce(g, NP)])
    out.append(markdown(["layers", "row", "runs done", "steps", "L_rep (L = 30)", "lengen L_rep",
                         "induction on lengen (best head)", "positional on lengen (best head)", "reproduce"], body))
    out.append("")
    links = []
    for n, roles in depths.items():
        links += figure_links(ctx, "fixedL", n, roles)
        findings.add(less_claim(f"{prefix('fixedL', n)}γ=0.2 lowers L_rep at L=30 (the old task, made again)",
                                roles.mom, roles.base, "L_rep"))
        positional_observation(prefix("fixedL", n), roles, findings)
    if links:
        out += ["Figures (tools/momfmm_plot.py):\n", "\n".join(links), ""]


def positional_observation(p, roles, findings):
    """Whether the fixed-period runs solved their task by position: lengen L_rep against L_rep."""
    for label, g in (("γ=0", roles.base), ("γ=0.2", roles.mom)):
        if g is None or not g.finished:
            continue
        rep, gen = g.vals("L_rep"), g.vals("lengen_L_rep")
        if rep and gen:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", RuntimeWarning)
                gap = float(np.mean(gen) - np.mean(rep))
            findings.observe(f"{p}{label}: L_rep {fmt_group(rep, '', 4)} at its training period, "
                             f"{fmt_group(gen, '', 4)} on the length eval's (+{gap:.2f} nats"
                             f"{'; above ln 1024: positional' if np.mean(gen) > math.log(1024) else ''})"
                             if gap >= 0 else
                             f"{p}{label}: L_rep {fmt_group(rep, '', 4)} at its training period, "
                             f"{fmt_group(gen, '', 4)} on the length eval's ({gap:.2f} nats)")

