"""The experiment suite's results report from its HDF5 files: `momfmm_report.py --results`.

    momfmm_report.py --results [--runs runs/experiments] [--suite configs/experiments/suite.list]
                     [--out FILE] [--figures DIR | --no-figures] [--allow-empty]
                     [--digests DIR | --no-digests] [--save-digests]

Reads every run of the suite (run directory RUNS/NAME, through momfmm.suite), groups the runs
of one configuration (suite lines that differ only in train.seed: mean ± sample std over the
seeds), and writes one Markdown report with, per family of the suite (momentum seed: chain
L = 10 and L = 30; FMM seed: copy at T = 128, 256, 512, ListOps; text):

  * tables of the final eval metrics (docs/metrics.md §3) beside the seed's numbers where the seed
    gives them, with the command that reproduces each row;
  * figures: momfmm.plot (tools/momfmm_plot.py) per table (one seed per configuration);
  * a claims section: each claim of the seeds, tested on the numbers ("held" / "did not
    hold", with the values), and the exact commands of every run.

Where it goes: stdout, or FILE with --out; figures into --figures DIR, by default the
directory figures/ beside FILE (none on stdout without --figures). Nothing in the source tree
changes unless named: the repository's RESULTS.md is rewritten by
`--results --out RESULTS.md` (its figures then go to figures/, which RESULTS.md links).

A run that is missing is a row saying "not run"; a run that stopped early shows the step it
reached. Works on any subset of the suite, but not on none of it: when no run of the suite
exists under --runs (a mistyped --runs, or nothing run yet) it writes nothing and exits 2,
unless --allow-empty. Paths in the suite are relative to the repository root. Exit 0 when the
report was written, 1 when --save-digests could not write a digest, 2 for a command-line or
suite error or no run.

Runs made on another machine come from their results digests (momfmm.digest), by default
results/experiments/NAME.json with the default --runs; --save-digests first writes the digest of
every finished run under --runs, to be committed (docs/design.md §8.8).
"""
import argparse
import datetime
import os
import shlex
import subprocess
import sys

from momfmm import seed_scale
from momfmm.chain_report import l_rep_during_training, loss_by_k_table, momentum_ahead_text
from momfmm.digest import write_digest
from momfmm.fmt import fmt_value, markdown, shortest
from momfmm.results_context import (SUITE, Context, figure_links, first_seed, plot_runs, root_relative,
                                    variant_figures)
from momfmm.suite import (NOISE_SE, PROG, ROOT, SAME_TOL, attention_label, builds_text, close_claim,
                          complete, eval_steps, family_of, find, group_entries, less_claim,
                          load_entries, momentum_label, noise_note, parse_suite, same_claim,
                          setting, variant_rank)

# The seeds' published numbers, as quoted in the issue. Keys: chain length L -> row -> metric.
# Only numbers the seed text gives are here; every other "seed" cell is "—".
SEED_MOMENTUM = {
    30: {"baseline": {"L_new": 6.9860, "L_rep": 1.7451, "delta_12": 4.6262},
         "momentum": {"L_new": 7.0202, "L_rep": 0.8288, "delta_12": 5.7893}},
    10: {"baseline": {"L_rep": 1.2785},
         "momentum": {"L_rep": 1.2262}},
}
# FMM seed (FMMformer): its abstract's Long Range Arena average over five tasks. Its per-task
# ListOps and copy-task numbers were not in the material this tool was written from: add them
# here (variant label -> value) to show them beside ours.
SEED_FMM_LRA_AVERAGE = {"softmax": 58.70, "FMMformer": 60.74}
SEED_LISTOPS_ACC = {}   # e.g. {"softmax": 0.371, "FMM (band 5, 2 kernels)": ...}
SEED_COPY_ACC = {}      # {(T, variant label): accuracy}
CLOSE_ACC = 0.05        # "matches": accuracy within 0.05
COPY_LEARNED = 0.5      # copy claims are judged where softmax's accuracy reaches this (chance ≈ 0.1)
CLOSE_BPB = 0.05        # "matches": bits per byte within 0.05

# ---------------------------------------------------------------- sections
class ChainRows:
    """The chain family's groups by role: base (γ=0) and mom (γ=0.2), both anchored and
    post_rope; abl, the ablations (unanchored, pre_rope); sweep, every anchored post_rope γ;
    shown, the rows of the loss-by-k table."""

    def __init__(self, groups):
        plain = {}
        for g in groups:
            e = g.first
            anchored = setting(e, "momentum.anchor", "true").lower() not in ("false", "0", "no", "off")
            post = setting(e, "momentum.placement", "post_rope") == "post_rope"
            g.gamma = float(setting(e, "momentum.gamma", "0") or 0)
            g.ablation = "" if anchored and post else ("unanchored" if not anchored else "pre_rope")
            if not g.ablation:
                plain[g.gamma] = g
        self.base, self.mom = plain.get(0.0), plain.get(0.2)
        self.abl = [g for g in groups if g.ablation]
        self.sweep = [plain[k] for k in sorted(plain)]
        self.shown = [g for g in ([self.base, self.mom] + self.abl) if g is not None]


def chain_section(ctx, L, groups, out, claims):
    out.append(f"### Chain task, L = {L}\n")
    cfgs = sorted({g.first.config for g in groups})
    out.append(f"Config: {', '.join(f'`{c}`' for c in cfgs)}; overrides per row below. Final eval of each run "
               "(docs/metrics.md §3), mean ± sample std over the seeds.\n")
    rows = ChainRows(groups)
    chain_tables(ctx, L, rows, out)
    loss_by_k_table(L, rows.shown, out)
    chain_figures(ctx, L, rows, out)
    chain_claims(L, rows, claims)


def chain_tables(ctx, L, chain, out):
    """The seed's table (γ = 0 vs 0.2), the ablations and the γ sweep."""
    seed = SEED_MOMENTUM.get(L, {})
    base, mom, abl, sweep = chain.base, chain.mom, chain.abl, chain.sweep
    out.append(f"**γ = 0 (baseline) vs γ = 0.2 (momentum), L = {L}** — ours beside the seed's table\n")
    rows = []
    for label, g, srow in (("baseline γ=0", base, seed.get("baseline", {})),
                           ("momentum γ=0.2", mom, seed.get("momentum", {}))):
        if g is None:
            rows.append([label, "no suite line"] + ["—"] * 8)
            continue
        rows.append([label, g.status(), g.steps(),
                     g.cell("L_new"), fmt_value(srow.get("L_new"), "", 4),
                     g.cell("L_rep"), fmt_value(srow.get("L_rep"), "", 4),
                     g.cell("delta_12"), fmt_value(srow.get("delta_12"), "", 4),
                     ctx.reproduce(g)])
    out.append(markdown(["row", "runs done", "steps", "L_new (ours)", "L_new (seed)", "L_rep (ours)", "L_rep (seed)",
                         "Δ1→2 (ours)", "Δ1→2 (seed)", "reproduce"], rows))
    out.append("")

    if abl or mom is not None:
        out.append(f"**Ablations at γ = 0.2, L = {L}**: unanchored first difference (`momentum.anchor = false`) "
                   "and shear before RoPE (`momentum.placement = pre_rope`)\n")
        rows = []
        for g in ([base, mom] if base else [mom]) + abl:
            if g is None:
                continue
            rows.append([momentum_label(g.first) + ("" if g.ablation or g.gamma == 0 else ", anchored, post_rope"),
                         g.status(), g.cell("L_new"), g.cell("L_rep"), g.cell("delta_12"), g.cell("loss"),
                         ctx.reproduce(g)])
        out.append(markdown(["variant", "runs done", "L_new", "L_rep", "Δ1→2", "loss", "reproduce"], rows))
        out.append("")

    if base is not None and mom is not None:
        l_rep_during_training(L, base, mom, out)

    out.append(f"**γ sweep, L = {L}** (anchored, post_rope)\n")
    rows = [[shortest(g.gamma), g.status(), g.cell("L_new"), g.cell("L_rep"), g.cell("delta_12"), g.cell("loss"),
             ctx.reproduce(g)] for g in sweep]
    out.append(markdown(["γ", "runs done", "L_new", "L_rep", "Δ1→2", "loss", "reproduce"], rows))
    out.append("")


def chain_figures(ctx, L, chain, out):
    base, mom, shown, sweep = chain.base, chain.mom, chain.shown, chain.sweep
    main = plot_runs(ctx, f"chain_L{L}_main", [(f"{momentum_label(g.first)} {e.name.rsplit('_', 1)[-1]}", e)
                                               for g in (base, mom) if g for e in g.members])
    ablf = plot_runs(ctx, f"chain_L{L}_ablations", [(momentum_label(g.first), first_seed(g)) for g in shown])
    swf = plot_runs(ctx, f"chain_L{L}_sweep", [(momentum_label(g.first), first_seed(g)) for g in sweep])
    links = figure_links(ctx, main, [("l_new_l_rep.png", f"L={L}: L_new and L_rep vs step, γ=0 vs γ=0.2, all seeds"),
                                     ("loss_by_k.png", f"L={L}: loss by k, γ=0 vs γ=0.2")])
    links += figure_links(ctx, ablf, [("l_new_l_rep.png", f"L={L}: ablations, L_new and L_rep vs step"),
                                      ("loss_by_k.png", f"L={L}: ablations, loss by k")])
    links += figure_links(ctx, swf, [("l_new_l_rep.png", f"L={L}: γ sweep, L_new and L_rep vs step"),
                                     ("loss.png", f"L={L}: γ sweep, loss"),
                                     ("bode.png", f"L={L}: γ sweep, momentum filter response")])
    if links:
        out.append("Figures (tools/momfmm_plot.py; the sweep and ablation figures show seed 1 of each row):\n")
        out.append("\n".join(links))
        out.append("")


def chain_claims(L, chain, claims):
    seed = SEED_MOMENTUM.get(L, {})
    base, mom, abl, sweep = chain.base, chain.mom, chain.abl, chain.sweep
    sl = seed.get("baseline", {}), seed.get("momentum", {})

    def seeds_text(metric):
        a, b = sl[1].get(metric), sl[0].get(metric)
        return f"seed: {a:.4f} vs {b:.4f}" if a is not None and b is not None else "seed gives no number"
    claims.append(less_claim(f"γ=0.2 lowers L_rep at L={L} ({seeds_text('L_rep')})", mom, base, "L_rep"))
    if "delta_12" in sl[1]:
        claims.append(less_claim(f"γ=0.2 raises Δ1→2 at L={L} ({seeds_text('delta_12')})", base, mom, "delta_12",
                                 flip=True))
    if "L_new" in sl[1]:
        claims.append(same_claim(f"γ=0.2 leaves L_new about unchanged at L={L} ({seeds_text('L_new')}; "
                                 f"tolerance {SAME_TOL:.0%} relative)", mom, base, "L_new"))
    unanch = next((g for g in abl if g.ablation == "unanchored"), None)
    pre = next((g for g in abl if g.ablation == "pre_rope"), None)
    claims.append(less_claim(f"anchoring matters at L={L}: anchored γ=0.2 has lower L_rep than unanchored "
                             "(docs/model.md §1.2: the unanchored variant is kinematically inconsistent)", mom, unanch, "L_rep"))
    claims.append(less_claim(f"Placement Corollary at L={L}: shearing after RoPE (post_rope) gives lower L_rep than "
                             "before it (pre_rope), at γ=0.2", mom, pre, "L_rep"))
    ahead = momentum_ahead_text(L, base, mom) if base is not None and mom is not None else None
    if ahead:
        claims.append(("observation", ahead))
    ran = [g for g in sweep if g.mean("L_rep") is not None]
    if ran:
        best = min(ran, key=lambda g: g.mean("L_rep"))
        text = (f"γ sweep at L={L}: lowest mean L_rep at γ={shortest(best.gamma)}; "
                + ", ".join(f"γ={shortest(g.gamma)}: {g.cell('L_rep')}" for g in ran))
        if base is not None and best is not base and base.vals("L_rep"):
            text += "; γ={} vs γ=0{}".format(shortest(best.gamma), noise_note(best.vals("L_rep"), base.vals("L_rep"))[0])
        claims.append(("observation", text))


def copy_section(ctx, by_T, out, claims):
    out.append("### Copy task (FMM seed)\n")
    cfgs = sorted({g.first.config for gs in by_T.values() for g in gs})
    out.append(f"Configs: {', '.join(f'`{c}`' for c in cfgs)}. Accuracy = token accuracy over the separator and "
               "the copied symbols (docs/metrics.md §3; chance ≈ 0.1), exact = whole-sequence exact match. Final eval, mean ± "
               "sample std over seeds.\n")
    Ts = sorted(by_T)
    variants = []
    for T in Ts:
        for g in by_T[T]:
            lab = attention_label(g.first)
            if lab not in variants:
                variants.append(lab)
    variants.sort(key=variant_rank)
    lookup = {(T, attention_label(g.first)): g for T in Ts for g in by_T[T]}
    rows = []
    for lab in variants:
        row = [lab]
        for T in Ts:
            g = lookup.get((T, lab))
            row.append(g.cell("acc") if g else "no suite line")
            if SEED_COPY_ACC:
                row.append(fmt_value(SEED_COPY_ACC.get((T, lab)), "", 4))
        rows.append(row)
    header = ["variant"]
    for T in Ts:
        header.append(f"acc T={T}")
        if SEED_COPY_ACC:
            header.append(f"seed T={T}")
    out.append("**Final accuracy per sequence length**\n")
    out.append(markdown(header, rows))
    out.append("")
    for T in Ts:
        groups = sorted(by_T[T], key=lambda g: variant_rank(attention_label(g.first)))
        steps = eval_steps(groups, most=6)
        out.append(f"**T = {T}: accuracy / loss at each eval step** (mean over seeds)\n")
        rows = []
        for g in groups:
            row = [attention_label(g.first), g.status()]
            for s in steps:
                acc, loss = g.mean_at("acc", s), g.mean_at("loss", s)
                row.append(f"{acc:.3f} / {loss:.3f}" if acc is not None and loss is not None else
                           g.missing())
            row += [g.cell("exact_match", 3), ctx.reproduce(g)]
            rows.append(row)
        out.append(markdown(["variant", "runs done"] + [f"step {s}" for s in steps] + ["exact (final)", "reproduce"],
                            rows))
        out.append("")
        variant_figures(ctx, out, f"copy_T{T}", groups, [("acc.png", f"copy T={T}: accuracy vs step"),
                                                         ("loss.png", f"copy T={T}: loss vs step")])
        copy_claims(T, groups, claims)


def copy_claims(T, groups, claims):
    """The FMM seed's copy-task claims at one T, judged only where softmax, the reference,
    learned the copy (accuracy >= COPY_LEARNED): below that, the claim "FMM matches softmax"
    would hold between two failures and the rankings would rank noise near chance."""
    fmm2 = find(groups, "FMM (band 5, 2 kernels")
    fmm1 = find(groups, "FMM (band 5, 1 kernel")
    lin, band, soft = find(groups, "linear"), find(groups, "band only"), find(groups, "softmax")
    soft_acc = soft.mean("acc") if soft is not None else None
    if soft_acc is not None and soft_acc < COPY_LEARNED:
        claims.append(("not judged", f"copy T={T}: no claim judged: softmax, the reference, ends at accuracy "
                       f"{soft_acc:.4f} (below {COPY_LEARNED}; chance ≈ 0.1), so at this size no variant learned "
                       "the copy and the four comparisons would rank noise"))
        return
    claims.append(less_claim(f"copy T={T}: FMM (band + 2 kernels) is more accurate than linear attention",
                             lin, fmm2, "acc", flip=True))
    claims.append(less_claim(f"copy T={T}: FMM (band + 2 kernels) is more accurate than band only",
                             band, fmm2, "acc", flip=True))
    claims.append(less_claim(f"copy T={T}: 2 far-field kernels are more accurate than 1", fmm1, fmm2, "acc",
                             flip=True))
    claims.append(close_claim(f"copy T={T}: FMM (2 kernels) matches softmax (accuracy within {CLOSE_ACC})",
                              fmm2, soft, "acc", CLOSE_ACC))


def listops_section(ctx, groups, out, claims):
    out.append("### ListOps (FMM seed; LRA generator)\n")
    cfgs = sorted({g.first.config for g in groups})
    out.append(f"Config: {', '.join(f'`{c}`' for c in cfgs)}. Accuracy of the cls head over the eval batches "
               f"(10 classes). Final eval, mean ± sample std over seeds. The seed reports Long Range Arena averages "
               f"over five tasks (softmax {SEED_FMM_LRA_AVERAGE['softmax']:.2f} %, FMMformer "
               f"{SEED_FMM_LRA_AVERAGE['FMMformer']:.2f} %); its ListOps column is not quoted here"
               + (" (see the seed column)" if SEED_LISTOPS_ACC else "") + ".\n")
    groups = sorted(groups, key=lambda g: variant_rank(attention_label(g.first)))
    rows = []
    for g in groups:
        lab = attention_label(g.first)
        row = [lab, g.status(), g.steps(), g.cell("acc"), g.cell("loss")]
        if SEED_LISTOPS_ACC:
            row.append(fmt_value(SEED_LISTOPS_ACC.get(lab), "", 4))
        rows.append(row + [ctx.reproduce(g)])
    header = ["variant", "runs done", "steps", "accuracy", "loss"] + (["seed acc"] if SEED_LISTOPS_ACC else []) + [
        "reproduce"]
    out.append(markdown(header, rows))
    out.append("")
    variant_figures(ctx, out, "listops", groups, [("acc.png", "ListOps: accuracy vs step"),
                                                  ("loss.png", "ListOps: loss vs step")])
    soft = find(groups, "softmax")
    fmm = find(groups, "FMM (band 5, 2 kernels")
    mfmm = find(groups, "momentum-FMM")
    claims.append(less_claim("ListOps: FMM (band 5, 2 kernels) is more accurate than softmax (the seed's LRA claim)",
                             soft, fmm, "acc", flip=True))
    claims.append(less_claim("ListOps: momentum-FMM is more accurate than FMM", fmm, mfmm, "acc", flip=True))


def text_section(ctx, groups, out, claims):
    out.append("### Text: bytes of Python's pydoc topics\n")
    cfgs = sorted({g.first.config for g in groups})
    paths = sorted({setting(g.first, "data.path") for g in groups})
    out.append(f"Config: {', '.join(f'`{c}`' for c in cfgs)}; corpus {', '.join(f'`{p}`' for p in paths)} "
               "(Debian package libpython3.11-stdlib), last 5 % = eval split. Bits per byte = final eval loss / ln 2, "
               "all rows at equal steps; mean ± sample std over seeds.\n")
    groups = sorted(groups, key=lambda g: variant_rank(attention_label(g.first)))
    rows = [[attention_label(g.first), g.status(), g.steps(), g.cell("bpb"), g.cell("loss"), g.cell("acc"),
             ctx.reproduce(g)] for g in groups]
    out.append(markdown(["variant", "runs done", "steps", "bits per byte", "loss (nats)", "byte accuracy", "reproduce"],
                        rows))
    out.append("")
    variant_figures(ctx, out, "text", groups, [("bpb.png", "text: eval bits per byte vs step"),
                                               ("loss.png", "text: loss vs step"),
                                               ("bode.png", "text: momentum filter response")])
    soft = find(groups, "softmax")
    fmm = find(groups, "FMM (band 5, 2 kernels")
    mom = find(groups, "momentum softmax")
    mfmm = find(groups, "momentum-FMM")
    claims.append(close_claim(f"text: FMM matches softmax (bits per byte within {CLOSE_BPB})", fmm, soft, "bpb",
                              CLOSE_BPB))
    claims.append(less_claim("text: momentum lowers bits per byte (softmax)", mom, soft, "bpb"))
    claims.append(less_claim("text: momentum lowers bits per byte (FMM)", mfmm, fmm, "bpb"))


# ---------------------------------------------------------------- main
def unlogged_text(entries):
    """The wall times' caveat: starts of a run that logged no exit (still running, or killed with
    their session) add nothing to them."""
    n = sum(e.wall_unlogged for e in entries)
    runs = sum(1 for e in entries if e.wall_unlogged)
    return (f" (lower bounds: {n} start{'s' if n > 1 else ''} of {runs} run{'s' if runs > 1 else ''} logged no exit, "
            "still running or killed with their session, and count nothing)" if n else "")


def git_commit():
    try:
        r = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        return r.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


RESULTS_DEFAULTS = {"runs": "runs/experiments", "suite": SUITE, "figures": None,
                    "no_figures": False, "allow_empty": False, "digests": None, "no_digests": False,
                    "save_digests": False}
DIGESTS = "results/experiments"  # the committed results digests of the default --runs (momfmm.digest)


def add_arguments(ap):
    """The --results mode's options (momfmm_report.py adds them to its own parser, with --out)."""
    ap.add_argument("--runs", metavar="DIR", help="parent of the run directories (default runs/experiments)")
    ap.add_argument("--suite", metavar="FILE", help="suite list (default configs/experiments/suite.list)")
    ap.add_argument("--figures", metavar="DIR",
                    help="directory for the figures (default: figures/ beside --out; without --out "
                         "no figures)")
    ap.add_argument("--no-figures", action="store_true", help="skip the figures")
    ap.add_argument("--allow-empty", action="store_true",
                    help="write the report even when no run of the suite exists (every row "
                         "'not run'); without it that is an error, exit 2")
    ap.add_argument("--digests", metavar="DIR",
                    help=f"results digests (NAME.json, momfmm.digest) of runs that --runs lacks or has "
                         f"not finished (default {DIGESTS} with the default --runs, else none)")
    ap.add_argument("--no-digests", action="store_true", help="read no results digests")
    ap.add_argument("--save-digests", action="store_true",
                    help="first write the digest of every finished run under --runs into --digests "
                         "(commit them: they outlive the machine's runs/)")


def options_given(args):
    """The --results options set on the command line, as "--name" (for the table mode's error)."""
    return [f"--{k.replace('_', '-')}" for k, default in RESULTS_DEFAULTS.items()
            if getattr(args, k, None) not in (None, False)]


def fill_defaults(args):
    for key, default in RESULTS_DEFAULTS.items():
        if getattr(args, key, None) is None:
            setattr(args, key, default)
    if args.no_digests:
        args.digests = None
    elif args.digests is None and os.path.normpath(args.runs) == "runs/experiments":
        args.digests = DIGESTS
    if args.figures is None and args.out is not None and not args.no_figures:
        args.figures = os.path.join(os.path.dirname(args.out), "figures")
    return args


def emit(text, out):
    """Markdown to stdout, or to the file out (its directory created): the only place a report
    goes, so a committed file changes only when named with --out."""
    if out is None:
        sys.stdout.write(text)
        return 0
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        f.write(text)
    return 0


def main(argv):
    """`python3 -m momfmm.results ...`: the same as `momfmm_report.py --results ...`."""
    ap = argparse.ArgumentParser(prog=f"{PROG} --results",
                                 description="Results report of the experiment suite's HDF5 files")
    ap.add_argument("--out", metavar="FILE", help="write to FILE instead of stdout")
    add_arguments(ap)
    return write_results(ap.parse_args(argv), ap)


def write_results(args, ap):
    """The results report of args.suite's runs under args.runs, to args.out (stdout if None),
    figures into args.figures (none if None). Refuses when no run exists: a report of nothing
    but "not run" rows is what a mistyped --runs produces, not something to keep."""
    fill_defaults(args)
    if not os.path.isfile(args.suite):
        ap.error(f"--suite {args.suite}: no such file")
    if args.save_digests and args.digests is None:
        ap.error("--save-digests needs --digests DIR (no default with --runs or --no-digests)")
    digests = args.digests
    if digests == "" or (digests is not None and os.path.exists(digests)
                         and not os.path.isdir(digests)):
        ap.error(f"--digests '{digests}': not a directory")
    entries = parse_suite(args.suite)
    load_entries(entries, args.runs, args.digests)
    if args.save_digests and not save_digests(entries, args.digests):
        return 1
    if not any(e.run is not None for e in entries) and not args.allow_empty:
        where = args.runs if os.path.isdir(args.runs) else f"{args.runs} (no such directory)"
        print(f"{PROG}: error: no run of {root_relative(args.suite)} under {where}: nothing to report "
              "(check --runs; --allow-empty writes the all-'not run' report anyway)", file=sys.stderr)
        return 2
    if args.figures is None and not args.no_figures:
        print(f"{PROG}: note: no figures without --out FILE or --figures DIR", file=sys.stderr)
    ctx = Context(args, entries)

    fams = {}
    for g in group_entries(entries):
        fams.setdefault(family_of(g.first), []).append(g)

    body, claims = [], []
    chain = sorted(k for k in fams if k[0] == "chain")
    if chain:
        body.append("## Momentum seed: chain task\n")
        body.append("The seed's claim: momentum attention (q, k sheared by their velocity, γ = 0.2) learns the "
                    "repeated chain (in-context recall, L_rep) better than softmax attention without momentum, "
                    "leaving L_new unchanged and widening the drop from the first to the second occurrence "
                    "(Δ1→2 = loss_by_k[0] − loss_by_k[1]).\n")
        for key in chain:
            chain_section(ctx, key[1], fams[key], body, claims)
    copies = {k[1]: fams[k] for k in fams if k[0] == "copy"}
    if copies or fams.get(("listops", None)):
        body.append("## FMM seed: copy task and ListOps\n")
        body.append("The seed's claim (FMMformer): a banded softmax near field plus a low-rank linear far field "
                    "keeps the accuracy of softmax attention at linear cost, where linear attention alone and a "
                    "band alone fall short; two far-field kernels do better than one.\n")
    if copies:
        copy_section(ctx, copies, body, claims)
    if ("listops", None) in fams:
        listops_section(ctx, fams[("listops", None)], body, claims)
    if ("text", None) in fams:
        body.append("## Text (both seeds)\n")
        text_section(ctx, fams[("text", None)], body, claims)
    # the seed's claims at its own scale (momfmm/seed_scale.py)
    seed_scale.section(ctx, fams, body, claims, SEED_MOMENTUM)

    n_ran = sum(1 for e in entries if e.run is not None)
    n_done = sum(1 for e in entries if complete(e))
    worlds = sorted({e.world_size for e in entries if e.world_size})
    walls = {}
    longest = max((e for e in entries if e.wall_s is not None), key=lambda e: e.wall_s, default=None)
    for e in entries:
        if e.wall_s is not None:
            fam = family_of(e)[0]
            walls[fam] = walls.get(fam, 0) + e.wall_s
    head = [
        "# RESULTS: the seeds' claims, run on momfmm",
        "",
        f"Generated by `tools/momfmm_report.py --results` from the HDF5 files under `{args.runs}`"
        f"{digests_text(entries, args.digests)} ({datetime.datetime.now().strftime('%Y-%m-%d %H:%M')}, commit {git_commit()}); do not edit by hand. "
        f"Suite: `{root_relative(args.suite)}`, {len(entries)} runs: {n_done} finished, "
        f"{n_ran - n_done} partial, {len(entries) - n_ran} not run.",
        "",
        f"Ranks per run: {', '.join(map(str, worlds)) if worlds else 'unknown'}. "
        + ("Measured wall time (train.log): " + ", ".join(f"{k} {v / 60:.1f} min" for k, v in sorted(walls.items()))
           + f", total {sum(walls.values()) / 60:.1f} min; longest run {longest.name}, {longest.wall_s} s"
           + unlogged_text(entries) + ". " if walls else "")
        + f"Builds that wrote the runs' checkpoints: {builds_text(entries)}. "
        + "Every table's numbers are the final eval of each finished run (docs/metrics.md §3); a partial run "
        "counts only in a row with no finished run, which then shows where it stands. To rerun everything: "
        f"`tools/run_experiments.sh{ctx.runner_flags}`, then `{report_command(args)}`. "
        "The sizes here are for a 2-core machine; `configs/experiments/README.md` compares them with the seeds'.",
        "",
    ]
    kinds = ("held", "did not hold", "within noise", "not run", "not judged")
    verdicts = [c for c in claims if c[0] in kinds]
    summary = {v: sum(1 for c in verdicts if c[0] == v) for v in kinds}
    claim_lines = ["## Claims: held or not", "",
                   f"Computed from the tables below: {summary['held']} held, {summary['did not hold']} did not hold, "
                   f"{summary['within noise']} not shown (difference within seed noise), {summary['not run']} could not "
                   f"be judged because runs are missing, {summary['not judged']} not judged because the reference "
                   "did not learn the task at this size. A claim \"held\" when the means (over seeds) move the claimed way by more "
                   f"than {shortest(NOISE_SE)} standard errors of the difference of means (where both sides have several seeds; "
                   "with a single seed the direction alone decides, and the line says so), \"did not hold\" when they "
                   "move the other way by as much; thresholds of \"matches\" and \"about unchanged\" claims are in "
                   "the claim.", ""]
    claim_lines += [f"- {c[1]}" for c in verdicts]
    obs = [c for c in claims if c[0] == "observation"]
    if obs:
        claim_lines += ["", "Observations (no seed claim attached):", ""] + [f"- {c[1]}" for c in obs]
    claim_lines.append("")

    commands = ["## Commands of every run", "",
                "Each row's `reproduce` command runs its suite lines through `tools/run_experiments.sh`; these are "
                "the exact commands it runs (from the repository root).", "", "<details><summary>"
                f"{len(entries)} commands</summary>", "", "```sh"]
    commands += [ctx.mpirun_command(e) for e in entries]
    commands += ["```", "", "</details>", ""]

    text = "\n".join(head + claim_lines + body + commands)
    emit(text, args.out)
    print(f"{'wrote ' + args.out if args.out else 'results'}: {n_done} finished, {n_ran - n_done} partial, "
          f"{len(entries) - n_ran} not run; claims {summary['held']} held, {summary['did not hold']} did not hold, "
          f"{summary['within noise']} within noise, {summary['not run']} not run, {summary['not judged']} not judged",
          file=sys.stderr if args.out is None else sys.stdout)
    return 0


def digests_text(entries, directory):
    n = sum(1 for e in entries if e.from_digest)
    return (f" and {n} results digest{'s' if n != 1 else ''} in `{directory}` (runs made on machines whose "
            "`runs/` is gone, docs/design.md §8.8)" if n else "")


def save_digests(entries, directory):
    """Writes DIR/NAME.json for every finished run read from its directory (docs/design.md §8.8);
    False, after a one-line error naming the file, when one cannot be written (a full disk)."""
    saved = [e for e in entries if complete(e) and not e.from_digest]
    for e in saved:
        path = os.path.join(directory, e.name + ".json")
        try:
            write_digest(path, e.run, e.wall_s, e.wall_unlogged)
        except OSError as exc:
            print(f"{PROG}: error: cannot write {path}: {exc.strerror or exc}", file=sys.stderr)
            return False
    print(f"{PROG}: saved {len(saved)} results digest{'s' if len(saved) != 1 else ''} in {directory}",
          file=sys.stderr)
    return True


def report_command(args):
    """The command that writes this report again, with the options that shaped it."""
    words = ["/usr/bin/python3", "tools/momfmm_report.py", "--results"]
    default_runs = os.path.normpath(args.runs) == "runs/experiments"
    if not default_runs:
        words += ["--runs", args.runs]
    if args.digests is None and default_runs:
        words += ["--no-digests"]
    elif args.digests is not None and (not default_runs or os.path.normpath(args.digests) != DIGESTS):
        words += ["--digests", args.digests]
    if os.path.realpath(args.suite) != os.path.realpath(SUITE):
        words += ["--suite", root_relative(args.suite)]
    if args.out:
        words += ["--out", args.out]
    return " ".join(shlex.quote(w) for w in words)
