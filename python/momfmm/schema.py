"""What a config fixes in a checkpoint (docs/files.md §4): the tensor names and shapes of the model
(src/model/model.c's name table, docs/design.md §8.2), its momentum buffers, and the columns of
its metric tables (src/data/metrics.c), for a momfmm.config.Config. momfmm.h5 checks every
checkpoint and metrics file against them. Imports nothing of the package.
"""
import math

OCCURRENCE_BINS = 16     # loss_by_k's bins (src/data/metrics.h)


# ---------------------------------------------------------------- the model's tensors (src/model/model.c)
def model_tensors(c):
    """[(name, shape)] of the model a config describes, in the name table's order (docs/files.md
    §4, docs/design.md §8.2): the datasets /model/<name> of a checkpoint."""
    V, d, H, L = c.get("model.vocab_size"), c.get("model.d_model"), c.get("model.n_heads"), c.get("model.n_layers")
    d_ff = c.get("model.d_ff")
    out = [("tok_emb", (V, d))]
    for i in range(L):
        b = f"blocks/{i}/"
        out += [(b + "ln1/weight", (d,)), (b + "ln1/bias", (d,)), (b + "attn/qkv/weight", (3 * d, d)),
                (b + "attn/qkv/bias", (3 * d,)), (b + "attn/proj/weight", (d, d)), (b + "attn/proj/bias", (d,))]
        if c.get("momentum.learn_gamma"):
            out.append((b + "attn/momentum_gamma", (H,)))
        if c.get("attention.kind") == "fmm":
            out.append((b + "attn/fmm_blend", (2, H)))
        out += [(b + "ln2/weight", (d,)), (b + "ln2/bias", (d,)), (b + "mlp/fc/weight", (d_ff, d)),
                (b + "mlp/fc/bias", (d_ff,)), (b + "mlp/proj/weight", (d, d_ff)), (b + "mlp/proj/bias", (d,))]
    out += [("ln_f/weight", (d,)), ("ln_f/bias", (d,))]
    if c.get("model.head") == "lm":
        out.append(("head/weight", (V, d)))
    else:
        n = c.get("model.n_classes")
        out += [("cls/weight", (n, d)), ("cls/bias", (n,))]
    return out


def buffer_tensors(c):
    """[(name, shape)] of the momentum buffers /buffers/<name>, present when momentum is on."""
    if not c.momentum_on:
        return []
    H, dh = c.get("model.n_heads"), c.get("model.d_model") // c.get("model.n_heads")
    return [(f"blocks/{i}/attn/{w}", (H, dh)) for i in range(c.get("model.n_layers")) for w in ("prev_q", "prev_k")]


def model_floats(c):
    """The floats of the model: parameters and RoPE tables (src/store/checkpoint.c model_floats)."""
    params = sum(math.prod(shape) for _, shape in model_tensors(c))
    return float(params) + float(c.positions) * (c.get("model.d_model") // c.get("model.n_heads"))


# ---------------------------------------------------------------- metric tables (src/data/metrics.c)
class Column:
    """A metric column: its name, whether it holds integers (step), and the shape of one row
    (() for a scalar, (w,) or (outer, inner))."""
    __slots__ = ("name", "integer", "row")

    def __init__(self, name, integer, row):
        self.name, self.integer, self.row = name, integer, row


def _column(name, width, integer=False, vector=False, inner=1):
    """metric_column_shape: a width-1 column that is not a vector is 1-D; inner <= 1 2-D."""
    if width == 1 and inner <= 1 and not vector:
        return Column(name, integer, ())
    if inner <= 1:
        return Column(name, integer, (width,))
    return Column(name, integer, (width // inner, inner))


# Columns added to /metrics after format_version 1 (docs/files.md §4): a file may lack them.
def added_later(name):
    return name in ("gain_R_attn", "bpb", "L_rep_by_period") or name.startswith(("lengen_", "attn_"))


def metric_columns(c, split):
    """[Column] of /metrics/<split> ("train" or "eval") for the config's model and task:
    metric_tables_standard and metric_tables_add_task_columns."""
    L, H = c.get("model.n_layers"), c.get("model.n_heads")
    task = c.get("data.task")
    if split == "train":
        cols = [_column("step", 1, integer=True)] + [_column(n, 1) for n in ("loss", "lr", "grad_norm",
                                                                              "tokens_per_s")]
        return cols + ([_column("bpb", 1)] if task == "text" else [])
    cols = [_column("step", 1, integer=True)]
    cols += [_column(n, 1) for n in ("loss", "L_new", "L_rep", "delta_12", "acc", "exact_match")]
    cols += [_column("loss_by_k", OCCURRENCE_BINS), _column("gain_R", L), _column("gain_R_attn", L),
             _column("gamma", L * H, inner=H)]
    if task == "text":
        cols.append(_column("bpb", 1))
    if task == "chain":
        cols += [_column(n, 1) for n in ("lengen_loss", "lengen_L_new", "lengen_L_rep", "lengen_delta_12")]
        cols.append(_column("lengen_loss_by_k", OCCURRENCE_BINS))
        lo, hi = c.get("data.chain_len"), max(c.get("data.chain_len"), c.get("data.chain_len_max"))
        cols.append(_column("L_rep_by_period", hi - lo + 1, vector=True))
        cols += [_column(n, L * H, inner=H) for n in ("attn_positional", "attn_induction", "lengen_attn_positional",
                                                       "lengen_attn_induction")]
    return cols
