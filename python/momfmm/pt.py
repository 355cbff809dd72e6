"""PyTorch interop: a momfmm checkpoint as an `nn.Module` for analysis (docs/design.md §8.8).

    import momfmm.pt as mt
    model = mt.load("run/ckpt_00000600.h5")              # float32 on the CPU, eval mode
    logits = model(inputs)                               # lm: [B, T, V]; cls: [B, n_classes]
    mt.export("run/ckpt_00000600.h5", "model.pt")        # a plain state_dict

The module computes the model of docs/model.md §1 as the C code does: pre-LN blocks, RoPE
(§1.1), the momentum shear with its buffers (§1.2), softmax or FMM attention (§1.3), lm or cls
head. It is float32 by default (as the C code) and `.double()` works. It recomputes everything
per forward (no streaming state); `generate` re-runs the whole prefix for each new id and picks
it as `momfmm generate` does (greedy, or sampled with temperature, top-k, top-p and seed through
the same sampler and counter generator, src/base/rng.h), so both give the same ids.

Parameter names are the checkpoint's /model names (docs/files.md §4) with '/' -> '.', except the
embedding: `tok_emb` -> `tok_emb.weight`. Momentum buffers /buffers/blocks/<i>/attn/prev_q|prev_k
are the registered buffers `blocks.<i>.attn.prev_q|prev_k` (present when momentum is on).

`import torch` below is PyTorch itself (imports are absolute). The module was momfmm.torch, a
name that read as PyTorch's own; momfmm.torch stays for one release as a deprecated alias of
this one. Run with Debian's /usr/bin/python3 (torch, h5py, numpy).
"""
import dataclasses
import json
import math
from typing import List

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from momfmm import files, h5
from momfmm.sampling import GENERATE_STREAM, rng_key, rng_uniform, sample_next  # noqa: F401 (re-exported)

LN_EPS = 1e-5  # docs/model.md §1, item 3

# docs/model.md §1.3, far-field feature maps; all strictly positive.
FEATURE_MAPS = {
    "elu": lambda x: F.elu(x) + 1.0,
    "elu_flip": lambda x: F.elu(-x) + 1.0,
    "tanh": lambda x: torch.tanh(x) + 1.0,
}


# --------------------------------------------------------------------------
# Configuration: the keys the model depends on (docs/config.md §6 defaults)
# --------------------------------------------------------------------------
@dataclasses.dataclass
class ModelConfig:
    vocab_size: int = 64
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    d_ff: int = 256
    rope_base: float = 10000.0
    causal: bool = True
    head: str = "lm"                 # "lm" or "cls"
    n_classes: int = 10
    kind: str = "softmax"            # attention.kind: "softmax" or "fmm"
    gamma: float = 0.0               # momentum.*
    learn_gamma: bool = False
    beta: float = 0.0
    gamma2: float = 0.0
    apply_to: str = "qk"             # "qk" or "q"
    placement: str = "post_rope"     # "post_rope" or "pre_rope"
    anchor: bool = True
    bandwidth: int = 5               # fmm.*
    kernels: List[str] = dataclasses.field(default_factory=lambda: ["elu"])
    fmm_eps: float = 1e-6
    fmm_chunk: int = 16              # changes only float rounding (docs/model.md §1.3)

    @property
    def head_dim(self):
        return self.d_model // self.n_heads

    @property
    def momentum_on(self):
        """docs/model.md §1.2: on when gamma != 0 or learn_gamma."""
        return self.gamma != 0.0 or self.learn_gamma

    def check(self):
        choices = [("head", ("lm", "cls")), ("kind", ("softmax", "fmm")),
                   ("apply_to", ("qk", "q")), ("placement", ("post_rope", "pre_rope"))]
        for key, allowed in choices:
            if getattr(self, key) not in allowed:
                raise ValueError(f"{key} = {getattr(self, key)!r}, expected one of {allowed}")
        if self.d_model % self.n_heads or self.head_dim % 2:
            raise ValueError("d_model must be n_heads times an even head size (RoPE pairs)")
        unknown = [k for k in self.kernels if k not in FEATURE_MAPS]
        if unknown or self.bandwidth < 0 or self.fmm_chunk < 1:
            raise ValueError(f"bad fmm settings: kernels {self.kernels}, bandwidth "
                             f"{self.bandwidth}, chunk {self.fmm_chunk}")
        return self

    @classmethod
    def from_settings(cls, c):
        """From a momfmm.config.Config (a checkpoint's config_ini as the binary reads it:
        typed values, defaults filled in)."""
        g = c.get
        return cls(
            vocab_size=g("model.vocab_size"), d_model=g("model.d_model"), n_heads=g("model.n_heads"),
            n_layers=g("model.n_layers"), d_ff=g("model.d_ff"), rope_base=g("model.rope_base"),
            causal=g("model.causal"), head=g("model.head"), n_classes=g("model.n_classes"),
            kind=g("attention.kind"), gamma=g("momentum.gamma"), learn_gamma=g("momentum.learn_gamma"),
            beta=g("momentum.beta"), gamma2=g("momentum.gamma2"), apply_to=g("momentum.apply_to"),
            placement=g("momentum.placement"), anchor=g("momentum.anchor"), bandwidth=g("fmm.bandwidth"),
            kernels=list(g("fmm.kernels")), fmm_eps=g("fmm.eps"), fmm_chunk=g("fmm.chunk"),
        ).check()

    @classmethod
    def from_ini(cls, cfg):
        """From a configparser of a checkpoint's `config_ini` (missing keys: defaults)."""
        d = cls()

        def get(sec, key, default):
            return cfg.get(sec, key).strip() if cfg.has_option(sec, key) else default

        def boolean(sec, key, default):
            v = get(sec, key, None)
            return default if v is None else v.lower() in ("true", "1", "yes")

        return cls(
            vocab_size=int(get("model", "vocab_size", d.vocab_size)),
            d_model=int(get("model", "d_model", d.d_model)),
            n_heads=int(get("model", "n_heads", d.n_heads)),
            n_layers=int(get("model", "n_layers", d.n_layers)),
            d_ff=int(get("model", "d_ff", d.d_ff)),
            rope_base=float(get("model", "rope_base", d.rope_base)),
            causal=boolean("model", "causal", d.causal),
            head=get("model", "head", d.head),
            n_classes=int(get("model", "n_classes", d.n_classes)),
            kind=get("attention", "kind", d.kind),
            gamma=float(get("momentum", "gamma", d.gamma)),
            learn_gamma=boolean("momentum", "learn_gamma", d.learn_gamma),
            beta=float(get("momentum", "beta", d.beta)),
            gamma2=float(get("momentum", "gamma2", d.gamma2)),
            apply_to=get("momentum", "apply_to", d.apply_to),
            placement=get("momentum", "placement", d.placement),
            anchor=boolean("momentum", "anchor", d.anchor),
            bandwidth=int(get("fmm", "bandwidth", d.bandwidth)),
            kernels=[k.strip() for k in get("fmm", "kernels", "elu").split(",") if k.strip()],
            fmm_eps=float(get("fmm", "eps", d.fmm_eps)),
            fmm_chunk=int(get("fmm", "chunk", d.fmm_chunk)),
        ).check()


# --------------------------------------------------------------------------
# RoPE (docs/model.md §1.1) and the momentum shear (§1.2); vectors are [B, H, T, dh]
# --------------------------------------------------------------------------
def rope_tables(T, dh, base, like):
    """cos, sin [T, dh/2] of t·base^(−2j/dh), computed in double and rounded to like's dtype,
    as the C tables are (docs/model.md §1.1)."""
    t = torch.arange(T, dtype=torch.float64).unsqueeze(1)
    j = torch.arange(dh // 2, dtype=torch.float64).unsqueeze(0)
    angle = t * torch.pow(torch.tensor(float(base), dtype=torch.float64), -2.0 * j / dh)
    return (torch.cos(angle).to(like.device, like.dtype),
            torch.sin(angle).to(like.device, like.dtype))


def apply_rope(x, cos, sin):
    """Rotates the adjacent pairs (2j, 2j+1) of x [B, H, T, dh] by the angles of the tables."""
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).reshape(x.shape)


def momentum_shear(x, gamma, beta, gamma2, buf=None):
    """x̂ = x + γ_h p + γ₂ a along t (docs/model.md §1.2); gamma: [H].

    buf None: anchored, d_0 = 0; else d_0 = x_0 − buf with buf [H, dh] (the unanchored
    ablation). d_t = x_t − x_{t−1}, p_t = d_t + β p_{t−1}, a_t = p_t − p_{t−1}, p_{−1} = 0.
    """
    d0 = torch.zeros_like(x[:, :, :1]) if buf is None else x[:, :, :1] - buf[None, :, None, :]
    d = torch.cat([d0, x[:, :, 1:] - x[:, :, :-1]], dim=2)
    if beta == 0.0:
        p = d
    else:
        steps, prev = [], torch.zeros_like(d[:, :, 0])
        for t in range(d.shape[2]):
            prev = d[:, :, t] + beta * prev
            steps.append(prev)
        p = torch.stack(steps, dim=2)
    out = x + gamma[None, :, None, None] * p
    if gamma2 != 0.0:
        out = out + gamma2 * (p - F.pad(p[:, :, :-1], (0, 0, 1, 0)))
    return out


# --------------------------------------------------------------------------
# Attention kinds (docs/model.md §1.3); q, k, v are [B, H, T, dh]
# --------------------------------------------------------------------------
def softmax_attention(q, k, v, causal):
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        T = q.shape[2]
        future = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def _shift(x, offset):
    """y[:, :, i] = x[:, :, i − offset], zero where i − offset is outside [0, T)."""
    T = x.shape[2]
    if offset >= 0:
        return F.pad(x[:, :, :T - offset], (0, 0, offset, 0))
    return F.pad(x[:, :, -offset:], (0, 0, 0, -offset))


def near_field(q, k, v, bandwidth, causal):
    """Softmax over the band j ∈ (i − k, i] (causal) or |i − j| < k, one offset i − j at a
    time: [B, H, T, W] scores, nothing T × T (docs/model.md §1.3, near field)."""
    T = q.shape[2]
    width = min(bandwidth, T)
    offsets = list(range(width)) if causal else list(range(-(width - 1), width))
    i = torch.arange(T, device=q.device)
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = torch.stack([(q * _shift(k, o)).sum(-1) * scale for o in offsets], dim=-1)
    inside = torch.stack([(i - o >= 0) & (i - o < T) for o in offsets], dim=-1)   # [T, W]
    probs = torch.softmax(scores.masked_fill(~inside, float("-inf")), dim=-1)
    return sum(probs[..., n, None] * _shift(v, o) for n, o in enumerate(offsets))


def far_field(q, k, v, kernels, eps, causal, chunk):
    """(1/r) Σ_l φ_l(q̂_i)·Σ_j φ_l(k̂_j) v_jᵀ / (φ_l(q̂_i)·Σ_j φ_l(k̂_j) + ε), j ≤ i when causal,
    computed in chunks with a running state S = φ(K)ᵀ[V|1] as the C code does (§1.3)."""
    B, H, T, dh = v.shape
    v1 = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)         # [V | 1]
    total = torch.zeros_like(v)
    for name in kernels:
        phi = FEATURE_MAPS[name]
        fq, fk = phi(q), phi(k)
        if causal:
            rows, state = [], torch.zeros(B, H, dh, dh + 1, dtype=v.dtype, device=v.device)
            for s in range(0, T, chunk):
                e = min(s + chunk, T)
                a = (fq[:, :, s:e] @ fk[:, :, s:e].transpose(-1, -2)).tril()
                rows.append(a @ v1[:, :, s:e] + fq[:, :, s:e] @ state)
                state = state + fk[:, :, s:e].transpose(-1, -2) @ v1[:, :, s:e]
            y = torch.cat(rows, dim=2)
        else:
            y = fq @ (fk.transpose(-1, -2) @ v1)
        total = total + y[..., :dh] / (y[..., dh:] + eps)
    return total / len(kernels)


# --------------------------------------------------------------------------
# Layers (docs/model.md §1)
# --------------------------------------------------------------------------
class Attention(nn.Module):
    """qkv projection, RoPE, momentum shear, attention kind, output projection (§1.1–§1.3)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        d, H = cfg.d_model, cfg.n_heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        if cfg.learn_gamma:
            self.momentum_gamma = nn.Parameter(torch.full((H,), float(cfg.gamma)))
        if cfg.kind == "fmm":
            self.fmm_blend = nn.Parameter(torch.zeros(2, H))    # row 0 near, row 1 far
        if cfg.momentum_on:   # docs/model.md §1.2, read only when momentum.anchor = false
            self.register_buffer("prev_q", torch.zeros(H, cfg.head_dim))
            self.register_buffer("prev_k", torch.zeros(H, cfg.head_dim))

    def _gamma(self, like):
        if self.cfg.learn_gamma:
            return self.momentum_gamma
        return torch.full((self.cfg.n_heads,), self.cfg.gamma, dtype=like.dtype, device=like.device)

    def _rope_and_shear(self, q, k):
        """q̂, k̂ of docs/model.md §1.1–§1.2: shear the rotated vectors (post_rope) or shear,
        then rotate (pre_rope); apply_to = q leaves k unsheared."""
        c = self.cfg
        cos, sin = rope_tables(q.shape[2], c.head_dim, c.rope_base, q)
        if not c.momentum_on:
            return apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        gamma = self._gamma(q)

        def shear(x, buf):
            return momentum_shear(x, gamma, c.beta, c.gamma2, None if c.anchor else buf)

        def rotate_and_shear(x, buf, sheared):
            if not sheared:
                return apply_rope(x, cos, sin)
            if c.placement == "pre_rope":
                return apply_rope(shear(x, buf), cos, sin)
            return shear(apply_rope(x, cos, sin), buf)

        return (rotate_and_shear(q, self.prev_q, True),
                rotate_and_shear(k, self.prev_k, c.apply_to == "qk"))

    def forward(self, u):
        B, T, d = u.shape
        c = self.cfg
        heads = self.qkv(u).reshape(B, T, 3, c.n_heads, c.head_dim).permute(2, 0, 3, 1, 4)
        q, k = self._rope_and_shear(heads[0], heads[1])
        v = heads[2]
        if c.kind == "softmax":
            y = softmax_attention(q, k, v, c.causal)
        else:   # σ(w_0h) near + σ(w_1h) far; bandwidth 0 / no kernels drop a term (§1.3)
            w = torch.sigmoid(self.fmm_blend)[:, None, :, None, None]
            y = torch.zeros_like(v)
            if c.bandwidth > 0:
                y = y + w[0] * near_field(q, k, v, c.bandwidth, c.causal)
            if c.kernels:
                y = y + w[1] * far_field(q, k, v, c.kernels, c.fmm_eps, c.causal, c.fmm_chunk)
        return self.proj(y.transpose(1, 2).reshape(B, T, d))


class MLP(nn.Module):
    """gelu(u W₁ᵀ + b₁) W₂ᵀ + b₂ with the tanh gelu (docs/model.md §1, item 4)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, cfg.d_ff)
        self.proj = nn.Linear(cfg.d_ff, cfg.d_model)

    def forward(self, u):
        return self.proj(F.gelu(self.fc(u), approximate="tanh"))


class Block(nn.Module):
    """Pre-LN residual block: m = x + Attn(LN₁ x); x' = m + MLP(LN₂ m) (docs/model.md §1)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model, eps=LN_EPS)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model, eps=LN_EPS)
        self.mlp = MLP(cfg)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class MomfmmModel(nn.Module):
    """The momfmm model (docs/model.md §1). forward(inputs [B, T] long, valid_mask [B, T] bool)
    returns lm logits [B, T, V] or cls logits [B, n_classes]; the cls head averages the final
    hidden states over the valid positions (all positions when valid_mask is None)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.config = cfg.check()
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model, eps=LN_EPS)
        if cfg.head == "lm":
            self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        else:
            self.cls = nn.Linear(cfg.d_model, cfg.n_classes)

    def hidden(self, inputs):
        """LN_f(x^L) [B, T, d]: the features both heads read."""
        x = self.tok_emb(inputs)
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x)

    def forward(self, inputs, valid_mask=None):
        x = self.hidden(torch.as_tensor(inputs, dtype=torch.long, device=self.tok_emb.weight.device))
        if self.config.head == "lm":
            return self.head(x)
        if valid_mask is None:
            pooled = x.mean(dim=1)
        else:   # padding still took part in attention; only the pooling skips it (§1, item 5)
            mask = torch.as_tensor(valid_mask, device=x.device).to(x.dtype).unsqueeze(-1)
            counts = mask.sum(dim=1)
            if bool((counts == 0).any()):
                raise ValueError("a cls row has no valid position")
            pooled = (x * mask).sum(dim=1) / counts
        return self.cls(pooled)


# --------------------------------------------------------------------------
# Checkpoints, export, loss and generation
# --------------------------------------------------------------------------
def state_name(name):
    """PyTorch name of a checkpoint tensor name (/model or /buffers, docs/files.md §4)."""
    return "tok_emb.weight" if name == "tok_emb" else name.replace("/", ".")


def load(path, device="cpu", dtype=torch.float32):
    """The checkpoint at `path` as a MomfmmModel in eval mode. The file is read with the checks
    of the binary's reader (momfmm.h5.load_checkpoint: what `momfmm eval` accepts, and no tensor
    its config_ini does not name); raises h5.RunError naming the file otherwise."""
    ck = h5.load_checkpoint(path, optim=False, metrics=False)
    model = MomfmmModel(ModelConfig.from_settings(ck.settings))
    tensors = {state_name(n): torch.from_numpy(a) for n, a in ck.params.items()}
    tensors.update({state_name(n): torch.from_numpy(a) for n, a in ck.buffers.items()})
    # the reader gave exactly the config's name table: a difference is a bug of this module
    model.load_state_dict(tensors, strict=True)
    model.momfmm_positions = ck.settings.positions
    model.momfmm_config_ini = ck.attrs["config_ini"]
    return model.to(device=device, dtype=dtype).eval()


def export(path, out_pt, config_json=None):
    """Writes the checkpoint's parameters and buffers as a plain state_dict (torch.save) to
    out_pt, float32, with the names of state_name; with config_json also writes the ModelConfig
    as JSON, from which `build(json.load(f))` makes the module to load the state_dict into.
    Returns the ModelConfig."""
    model = load(path)
    with files.output_path(out_pt, inputs=[path]) as tmp:
        torch.save(model.state_dict(), tmp)
    if config_json is not None:
        files.write_text(config_json, json.dumps(dataclasses.asdict(model.config), indent=1), inputs=[path])
    return model.config


def checkpoint_name(name):
    """Checkpoint tensor name (docs/files.md §4) of a PyTorch state_dict name: state_name inverted."""
    return "tok_emb" if name == "tok_emb.weight" else name.replace(".", "/")


def _ini_value(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value)
    return repr(value) if isinstance(value, float) else str(value)


def _model_sections(cfg):
    """The config keys a ModelConfig stands for, by INI section (docs/config.md §6)."""
    return {
        "model": dict(vocab_size=cfg.vocab_size, d_model=cfg.d_model, n_heads=cfg.n_heads, n_layers=cfg.n_layers,
                      d_ff=cfg.d_ff, rope_base=cfg.rope_base, causal=cfg.causal, head=cfg.head,
                      n_classes=cfg.n_classes),
        "attention": dict(kind=cfg.kind),
        "momentum": dict(gamma=cfg.gamma, learn_gamma=cfg.learn_gamma, beta=cfg.beta, gamma2=cfg.gamma2,
                         apply_to=cfg.apply_to, placement=cfg.placement, anchor=cfg.anchor),
        "fmm": dict(bandwidth=cfg.bandwidth, kernels=cfg.kernels, eps=cfg.fmm_eps, chunk=cfg.fmm_chunk),
    }


def _set_ini_keys(text, sections):
    """INI text with each {section: {key: value}} set: the key's line replaced where it stands,
    else appended to its section (made at the end when missing); every other line as it was."""
    lines = text.splitlines()
    for section, keys in sections.items():
        for key, value in keys.items():
            line, current, at, end = f"{key} = {_ini_value(value)}", None, None, None
            for i, raw in enumerate(lines):
                stripped = raw.strip()
                if stripped.startswith("[") and stripped.endswith("]"):
                    current = stripped[1:-1].strip()
                    if current == section:
                        end = i + 1
                elif current == section:
                    if stripped.split("=", 1)[0].strip() == key and "=" in stripped:
                        at = i
                    if stripped:
                        end = i + 1
            if at is not None:
                lines[at] = line
            elif end is not None:
                lines.insert(end, line)
            else:
                lines += ["", f"[{section}]", line]
    return "\n".join(lines) + "\n"


def save(model, path, config_ini=None, sections=None, step=0, tokens_seen=0):
    """Writes `model` (a MomfmmModel) as a momfmm checkpoint (docs/files.md §4) that `momfmm eval`,
    `generate`, `logits`, `inspect` and `train --init` read: root attributes format,
    format_version 1, step, tokens_seen, world_size 1, config_ini, momfmm_version; /model/<name>
    float32 (checkpoint_name of each parameter); /buffers/blocks/<i>/attn/prev_q|prev_k when
    momentum is on. No /optim, so `train --resume` refuses it (train --init takes the weights
    with a fresh optimizer); a /tokenizer the loaded checkpoint carried is not copied.

    config_ini: the INI text to start from; by default the config_ini of the checkpoint the
    module was loaded from (load), else only the keys below and momfmm's defaults. The module's
    ModelConfig keys are then set in it (so config and tensors agree), then `sections`
    ({"data": {"seq_len": 64}, "model": {"max_seq_len": 256}, ...}: values written as they
    are, booleans as true/false). Written beside `path`, then renamed over it (momfmm.files.
    output_path: an existing regular file is replaced, as torch.save does; a symbolic link, FIFO
    or directory there is refused with files.ArgumentError). Raises ValueError for a non-finite
    tensor, before writing anything."""
    import h5py

    base = config_ini if config_ini is not None else getattr(model, "momfmm_config_ini", None) or ""
    ini = _set_ini_keys(base, _model_sections(model.config))
    if sections:
        ini = _set_ini_keys(ini, sections)
    buffers = {n for n, _ in model.named_buffers()}
    tensors = {}
    for name, value in model.state_dict().items():
        array = value.detach().to("cpu", torch.float32).numpy()
        if not np.isfinite(array).all():
            raise ValueError(f"{name} holds non-finite values: momfmm refuses such a checkpoint")
        group = "buffers" if name in buffers else "model"
        tensors[f"{group}/{checkpoint_name(name)}"] = array
    with files.output_path(path) as tmp:
        with h5py.File(tmp, "w") as f:
            f.attrs["format"] = h5.CHECKPOINT_FORMAT
            f.attrs["format_version"] = np.int32(1)
            f.attrs["step"] = np.int64(step)
            f.attrs["tokens_seen"] = np.int64(tokens_seen)
            f.attrs["world_size"] = np.int32(1)
            f.attrs["config_ini"] = ini
            f.attrs["momfmm_version"] = f"momfmm.pt.save (torch {torch.__version__})"
            for name, array in tensors.items():
                f[name] = array
    return path


def build(config):
    """A freshly initialised MomfmmModel from a ModelConfig or its dict (e.g. export's JSON)."""
    return MomfmmModel(config if isinstance(config, ModelConfig) else ModelConfig(**config))


def load_tokens(path):
    """(inputs, targets, labels or None) of a token file (docs/files.md §4) as long tensors,
    checked as momfmm.h5.load_tokens checks it."""
    return tuple(None if a is None else torch.from_numpy(a) for a in h5.load_tokens(path))


def loss(model, inputs, targets, labels=None):
    """The loss `momfmm loss` prints (docs/model.md §1, items 5–6): lm, mean cross-entropy over
    the targets that are not −1 (0 when there are none); cls, mean cross-entropy of labels, the
    pooling reading targets != −1 as the valid positions."""
    device = model.tok_emb.weight.device
    targets = torch.as_tensor(targets, dtype=torch.long, device=device)
    valid = targets != -1
    if model.config.head == "lm":
        logits = model(inputs)
        if not bool(valid.any()):
            return logits.new_zeros(())
        return F.cross_entropy(logits[valid], targets[valid])
    if labels is None:
        raise ValueError("the cls head needs labels")
    labels = torch.as_tensor(labels, dtype=torch.long, device=device)
    return F.cross_entropy(model(inputs, valid), labels)


def positions(model):
    """The positions `momfmm generate` holds without sliding its window: max(model.max_seq_len,
    data.seq_len) of the checkpoint the module was loaded from (load), else None."""
    return getattr(model, "momfmm_positions", None)


@torch.no_grad()
def generate(model, prompt_ids, n_tokens, temperature=0.0, top_k=0, top_p=1.0, seed=0, stop=None):
    """The continuation `momfmm generate --prompt ... --tokens n_tokens --temperature T --top-k K
    --top-p P --seed S [--stop ...]` prints, as a list of ids: each new id is sample_next of the
    last position's logits (float32) with key rng_key(seed, 0x6E4, 0, 0) and counter = its index
    among the new ids, re-running the whole sequence every step (lm head). `stop`: ids (or
    bytes, for byte-level models) that end the continuation once it ends with them, as --stop.

    The C command streams (KV cache) and this re-runs the prefix: the logits agree to float32
    rounding (~1e-6), not bit for bit, so the ids agree unless a draw falls within that of a
    boundary between two tokens' weights (or two logits tie to that), which the tests never
    met. Past the window (a sequence fed longer than `positions(model)`) the C command slides
    it, which a re-run cannot reproduce: that raises ValueError, as do top_k < 0, temperature
    < 0 and top_p outside (0, 1]."""
    if model.config.head != "lm":
        raise ValueError("generate needs an lm head")
    if temperature < 0 or top_k < 0 or not 0 < top_p <= 1:
        raise ValueError(f"temperature {temperature} (>= 0), top_k {top_k} (>= 0), top_p {top_p} (in (0, 1])")
    ids = [int(t) for t in prompt_ids]
    limit = positions(model)
    if limit is not None and len(ids) + n_tokens - 1 > limit:
        raise ValueError(f"a prompt of {len(ids)} and {n_tokens} new tokens run past the model's {limit} "
                         "positions, where momfmm generate slides its window; this re-run cannot")
    stop = [int(t) for t in stop] if stop is not None else []
    key = rng_key(int(seed), GENERATE_STREAM, 0, 0)
    device = model.tok_emb.weight.device
    out = []
    for i in range(n_tokens):
        logits = model(torch.tensor([ids + out], device=device))[0, -1]
        out.append(sample_next(logits.float().cpu().numpy(), temperature, top_k, top_p, key, i))
        if stop and out[-len(stop):] == stop:
            break
    return out
