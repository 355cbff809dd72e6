"""The byte-level text section (both references): bits per byte of each attention variant."""
from momfmm.fmt import markdown
from momfmm.results.claims import close_claim, less_claim
from momfmm.results.figures import variant_figures
from momfmm.results.runs import find
from momfmm.results.suite import attention_label, setting, variant_rank

CLOSE_BPB = 0.05        # "matches": bits per byte within 0.05


def text_section(ctx, groups, out, findings):
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
    findings.add(close_claim(f"text: FMM matches softmax (bits per byte within {CLOSE_BPB})", fmm, soft, "bpb",
                             CLOSE_BPB))
    findings.add(less_claim("text: momentum lowers bits per byte (softmax)", mom, soft, "bpb"))
    findings.add(less_claim("text: momentum lowers bits per byte (FMM)", mfmm, fmm, "bpb"))
