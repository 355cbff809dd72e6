"""Independent float64 PyTorch reference of the momfmm model (docs/model.md §1).

Written for clarity, not speed: every attention variant is a direct O(T^2)
computation with explicit masks, so it shares none of the C implementation's
tricks (banded storage, chunked linear attention, fused kernels).

Public API
    load_checkpoint(path)  -> (cfg, params, buffers)       docs/files.md §4 layout
    load_tokens(path)      -> (inputs, targets, labels)    docs/files.md §4 token file
    forward_loss(cfg, params, buffers, inputs, targets, labels=None) -> loss
    loss_and_grads(cfg, params, buffers, inputs, targets, labels=None)
                           -> (loss: float, grads: dict name -> float64 tensor)

Building blocks (used by selftest_reference.py): apply_rope, momentum_shear,
softmax_attention, fmm_near_field, fmm_far_field, fmm_attention.

Everything is computed in the dtype of the parameters (float64 when loaded by
load_checkpoint); nothing here hard-codes a dtype except the loaders.
"""
import configparser
import math
from dataclasses import dataclass
from typing import Dict, List, Tuple

import numpy as np
import torch

# The one HDF5 reader is momfmm.h5 (docs/design.md §8.8), found through PYTHONPATH=python (CTest
# sets it for the tests that use this model).
from momfmm import h5

LN_EPS = 1e-5  # docs/model.md §1, item 2

# docs/model.md §1.3 feature maps, phi(x) > 0 elementwise.
FEATURE_MAPS = {
    "elu": lambda x: torch.nn.functional.elu(x) + 1.0,
    "elu_flip": lambda x: torch.nn.functional.elu(-x) + 1.0,
    "tanh": lambda x: torch.tanh(x) + 1.0,
}


# --------------------------------------------------------------------------
# Configuration (docs/config.md §6 keys, docs/model.md §1 semantics)
# --------------------------------------------------------------------------
@dataclass
class ModelSettings:
    """The config keys the model math depends on, with docs/config.md §6 defaults."""
    vocab_size: int
    d_model: int
    n_heads: int
    n_layers: int
    d_ff: int
    rope_base: float
    causal: bool
    head: str                # "lm" or "cls"
    n_classes: int
    kind: str                # "softmax" or "fmm"
    gamma: float
    learn_gamma: bool
    beta: float
    gamma2: float
    apply_to: str            # "qk" or "q"
    placement: str           # "post_rope" or "pre_rope"
    anchor: bool
    bandwidth: int
    kernels: List[str]
    fmm_eps: float

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def momentum_on(self) -> bool:
        """docs/model.md §1.2: enabled when gamma != 0 or learn_gamma = true."""
        return self.gamma != 0.0 or self.learn_gamma


def parameter_shapes(s: ModelSettings) -> Dict[str, Tuple[int, ...]]:
    """docs/files.md §4 parameter names and PyTorch shapes for these settings."""
    d, H, F = s.d_model, s.n_heads, s.d_ff
    shapes = {"tok_emb": (s.vocab_size, d), "ln_f/weight": (d,), "ln_f/bias": (d,)}
    for i in range(s.n_layers):
        p = f"blocks/{i}/"
        shapes.update({
            p + "ln1/weight": (d,), p + "ln1/bias": (d,),
            p + "attn/qkv/weight": (3 * d, d), p + "attn/qkv/bias": (3 * d,),
            p + "attn/proj/weight": (d, d), p + "attn/proj/bias": (d,),
            p + "ln2/weight": (d,), p + "ln2/bias": (d,),
            p + "mlp/fc/weight": (F, d), p + "mlp/fc/bias": (F,),
            p + "mlp/proj/weight": (d, F), p + "mlp/proj/bias": (d,),
        })
        if s.learn_gamma:
            shapes[p + "attn/momentum_gamma"] = (H,)
        if s.kind == "fmm":
            shapes[p + "attn/fmm_blend"] = (2, H)
    if s.head == "lm":
        shapes["head/weight"] = (s.vocab_size, d)
    else:
        shapes["cls/weight"] = (s.n_classes, d)
        shapes["cls/bias"] = (s.n_classes,)
    return shapes


def parse_kernel_list(text: str) -> List[str]:
    """`fmm.kernels`: comma-separated feature-map names; empty means none."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    for n in names:
        if n not in FEATURE_MAPS:
            raise ValueError(f"fmm.kernels: unknown feature map {n!r}")
    return names


def settings_from_config(cfg: configparser.ConfigParser) -> ModelSettings:
    """Reads the resolved config, falling back to docs/config.md §6 defaults."""
    def get(sec, key, default=None):
        if cfg.has_option(sec, key):
            return cfg.get(sec, key).strip()
        if default is None:
            raise KeyError(f"config has no {sec}.{key}")
        return default

    def get_bool(sec, key, default):
        v = get(sec, key, default).lower()
        if v in ("true", "1", "yes", "on"):
            return True
        if v in ("false", "0", "no", "off"):
            return False
        raise ValueError(f"{sec}.{key}: not a boolean: {v!r}")

    s = ModelSettings(
        vocab_size=int(get("model", "vocab_size")),
        d_model=int(get("model", "d_model")),
        n_heads=int(get("model", "n_heads")),
        n_layers=int(get("model", "n_layers")),
        d_ff=int(get("model", "d_ff")),
        rope_base=float(get("model", "rope_base", "10000")),
        causal=get_bool("model", "causal", "true"),
        head=get("model", "head", "lm"),
        n_classes=int(get("model", "n_classes", "0")),
        kind=get("attention", "kind", "softmax"),
        gamma=float(get("momentum", "gamma", "0")),
        learn_gamma=get_bool("momentum", "learn_gamma", "false"),
        beta=float(get("momentum", "beta", "0")),
        gamma2=float(get("momentum", "gamma2", "0")),
        apply_to=get("momentum", "apply_to", "qk"),
        placement=get("momentum", "placement", "post_rope"),
        anchor=get_bool("momentum", "anchor", "true"),
        bandwidth=int(get("fmm", "bandwidth", "5")),
        kernels=parse_kernel_list(get("fmm", "kernels", "elu")),
        fmm_eps=float(get("fmm", "eps", "1e-6")),
    )
    checks = [
        (s.head in ("lm", "cls"), "model.head"),
        (s.kind in ("softmax", "fmm"), "attention.kind"),
        (s.apply_to in ("qk", "q"), "momentum.apply_to"),
        (s.placement in ("post_rope", "pre_rope"), "momentum.placement"),
        (s.d_model % s.n_heads == 0 and s.head_dim % 2 == 0, "model.d_model/n_heads"),
        (s.bandwidth >= 0, "fmm.bandwidth"),
    ]
    for ok, key in checks:
        if not ok:
            raise ValueError(f"unsupported value for {key}")
    return s


# --------------------------------------------------------------------------
# Loaders (docs/files.md §4)
# --------------------------------------------------------------------------
def load_checkpoint(path: str):
    """Returns (cfg, params, buffers), read by momfmm.h5 (docs/files.md §4 layout).

    params: name -> float64 leaf tensor with requires_grad (names as /model).
    buffers: name -> float64 tensor, e.g. "blocks/0/attn/prev_q" (may be empty).
    """
    ck = h5.load_checkpoint(path, optim=False, metrics=False)
    params = {name: torch.tensor(np.asarray(a, dtype=np.float64)).requires_grad_(True)
              for name, a in ck.params.items()}
    buffers = {name: torch.tensor(np.asarray(a, dtype=np.float64))
               for name, a in ck.buffers.items()}
    return ck.config, params, buffers


def load_tokens(path: str):
    """Returns (inputs [B,T], targets [B,T], labels [B] or None) as int64 tensors."""
    inputs, targets, labels = h5.load_tokens(path)
    return (torch.from_numpy(inputs), torch.from_numpy(targets),
            None if labels is None else torch.from_numpy(labels))


# --------------------------------------------------------------------------
# Elementary layers (docs/model.md §1, items 2-5)
# --------------------------------------------------------------------------
def layer_norm(x, weight, bias):
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)   # biased, as PyTorch
    return (x - mean) / torch.sqrt(var + LN_EPS) * weight + bias


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def linear(x, weight, bias=None):
    """PyTorch convention: weight [out, in], y = x W^T + b."""
    y = x @ weight.transpose(0, 1)
    return y if bias is None else y + bias


# --------------------------------------------------------------------------
# RoPE (docs/model.md §1.1) and momentum (docs/model.md §1.2); x is [B, H, T, dh]
# --------------------------------------------------------------------------
def apply_rope(x, base: float):
    """Rotates pairs (2j, 2j+1) at position t by t * base^(-2j/dh)."""
    T, dh = x.shape[-2], x.shape[-1]
    t = torch.arange(T, dtype=x.dtype).unsqueeze(1)                    # [T, 1]
    j = torch.arange(dh // 2, dtype=x.dtype).unsqueeze(0)              # [1, dh/2]
    angle = t * torch.pow(torch.tensor(base, dtype=x.dtype), -2.0 * j / dh)
    cos, sin = torch.cos(angle), torch.sin(angle)
    even, odd = x[..., 0::2], x[..., 1::2]
    new_even = even * cos - odd * sin
    new_odd = even * sin + odd * cos
    return torch.stack([new_even, new_odd], dim=-1).reshape(x.shape)


def momentum_shear(x, gamma, beta: float, gamma2: float, anchor: bool, buf):
    """x_hat = x + gamma_h p + gamma2 a, per head and per sequence.

    x: [B, H, T, dh]; gamma: [H] tensor; buf: [H, dh] (the same buffer for
    every batch row; used only when anchor is False; no gradient).
    d_t = x_t - x_{t-1}; d_0 = 0 (anchored) or x_0 - buf; p_t = d_t + beta p_{t-1};
    a_t = p_t - p_{t-1}; p_{-1} = 0.
    """
    T = x.shape[2]
    if anchor:
        d0 = torch.zeros_like(x[:, :, :1])
    else:
        d0 = x[:, :, :1] - buf.detach().to(x.dtype)[None, :, None, :]
    d = torch.cat([d0, x[:, :, 1:] - x[:, :, :-1]], dim=2)
    p_steps = []
    p_prev = torch.zeros_like(x[:, :, 0])
    for t in range(T):
        p_prev = d[:, :, t] + beta * p_prev
        p_steps.append(p_prev)
    p = torch.stack(p_steps, dim=2)
    p_before = torch.cat([torch.zeros_like(p[:, :, :1]), p[:, :, :-1]], dim=2)
    a = p - p_before
    return x + gamma[None, :, None, None] * p + gamma2 * a


# --------------------------------------------------------------------------
# Attention kinds (docs/model.md §1.3); q, k, v are [B, H, T, dh]
# --------------------------------------------------------------------------
def _masked_softmax_attention(q, k, v, allowed):
    """softmax over the keys j with allowed[i, j] of s_ij = q_i.k_j / sqrt(dh)."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    scores = scores.masked_fill(~allowed, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def _positions(T):
    i = torch.arange(T).unsqueeze(1)
    j = torch.arange(T).unsqueeze(0)
    return i, j


def softmax_attention(q, k, v, causal: bool):
    i, j = _positions(q.shape[2])
    allowed = (j <= i) if causal else torch.ones_like(i * j, dtype=torch.bool)
    return _masked_softmax_attention(q, k, v, allowed)


def fmm_near_field(q, k, v, bandwidth: int, causal: bool):
    """Softmax over the band: j in (i-k, i] (causal) or |i-j| < k."""
    i, j = _positions(q.shape[2])
    if causal:
        allowed = (j <= i) & (j > i - bandwidth)
    else:
        allowed = (i - j).abs() < bandwidth
    return _masked_softmax_attention(q, k, v, allowed)


def fmm_far_field(q, k, v, kernels: List[str], eps: float, causal: bool):
    """(1/r) sum_l  sum_j A_l[i,j] v_j / (sum_j A_l[i,j] + eps), A_l = phi(q) phi(k)^T,
    j <= i when causal (a lower-triangular mask on A), all j otherwise."""
    i, j = _positions(q.shape[2])
    keep = (j <= i) if causal else torch.ones_like(i * j, dtype=torch.bool)
    keep = keep.to(q.dtype)
    total = 0
    for name in kernels:
        phi = FEATURE_MAPS[name]
        a = (phi(q) @ phi(k).transpose(-1, -2)) * keep
        total = total + (a @ v) / (a.sum(dim=-1, keepdim=True) + eps)
    return total / len(kernels)


def fmm_attention(q, k, v, blend, bandwidth: int, kernels: List[str], eps: float,
                  causal: bool):
    """y = sigmoid(blend[0,h]) near + sigmoid(blend[1,h]) far; blend: [2, H].
    bandwidth 0 drops the near term, an empty kernel list the far term."""
    w = torch.sigmoid(blend)[:, None, :, None, None]       # [2, 1, H, 1, 1]
    y = torch.zeros_like(v)
    if bandwidth > 0:
        y = y + w[0] * fmm_near_field(q, k, v, bandwidth, causal)
    if kernels:
        y = y + w[1] * fmm_far_field(q, k, v, kernels, eps, causal)
    return y


# --------------------------------------------------------------------------
# The model (docs/model.md §1)
# --------------------------------------------------------------------------
def _buffer(buffers, layer: int, which: str, H: int, dh: int, like):
    """Momentum buffer prev_q / prev_k [H, dh] of a layer; absent -> zeros."""
    b = buffers.get(f"blocks/{layer}/attn/{which}")
    if b is None:
        return torch.zeros(H, dh, dtype=like.dtype)
    return b.detach().to(like.dtype).reshape(H, dh)


def attention_layer(s: ModelSettings, params, buffers, layer: int, u):
    """docs/model.md §1.1-1.3: qkv projection, RoPE, momentum, attention kind, output proj."""
    B, T, d = u.shape
    H, dh = s.n_heads, s.head_dim
    pre = f"blocks/{layer}/attn/"
    qkv = linear(u, params[pre + "qkv/weight"], params[pre + "qkv/bias"])

    def heads(x):                                   # [B, T, d] -> [B, H, T, dh]
        return x.reshape(B, T, H, dh).transpose(1, 2)
    q, k, v = heads(qkv[..., :d]), heads(qkv[..., d:2 * d]), heads(qkv[..., 2 * d:])

    def rope(x):
        return apply_rope(x, s.rope_base)

    if s.momentum_on:
        if s.learn_gamma:
            gamma = params[pre + "momentum_gamma"]
        else:
            gamma = torch.full((H,), s.gamma, dtype=u.dtype)

        def shear(x, which):
            buf = _buffer(buffers, layer, which, H, dh, u)
            return momentum_shear(x, gamma, s.beta, s.gamma2, s.anchor, buf)

        shear_k = s.apply_to == "qk"
        if s.placement == "pre_rope":
            q = rope(shear(q, "prev_q"))
            k = rope(shear(k, "prev_k") if shear_k else k)
        else:
            q = shear(rope(q), "prev_q")
            k = shear(rope(k), "prev_k") if shear_k else rope(k)
    else:
        q, k = rope(q), rope(k)

    if s.kind == "softmax":
        y = softmax_attention(q, k, v, s.causal)
    else:
        y = fmm_attention(q, k, v, params[pre + "fmm_blend"], s.bandwidth, s.kernels,
                          s.fmm_eps, s.causal)
    y = y.transpose(1, 2).reshape(B, T, d)
    return linear(y, params[pre + "proj/weight"], params[pre + "proj/bias"])


def mlp_layer(params, layer: int, u):
    pre = f"blocks/{layer}/mlp/"
    h = gelu_tanh(linear(u, params[pre + "fc/weight"], params[pre + "fc/bias"]))
    return linear(h, params[pre + "proj/weight"], params[pre + "proj/bias"])


def final_hidden(s: ModelSettings, params, buffers, inputs):
    """x after the final LayerNorm, [B, T, d]."""
    x = params["tok_emb"][inputs]
    for i in range(s.n_layers):
        pre = f"blocks/{i}/"
        x = x + attention_layer(s, params, buffers, i,
                                layer_norm(x, params[pre + "ln1/weight"], params[pre + "ln1/bias"]))
        x = x + mlp_layer(params, i,
                          layer_norm(x, params[pre + "ln2/weight"], params[pre + "ln2/bias"]))
    return layer_norm(x, params["ln_f/weight"], params["ln_f/bias"])


def _cross_entropy(logits, target):
    """Mean over rows of -log softmax(logits)[target]."""
    logp = torch.log_softmax(logits, dim=-1)
    return -logp.gather(-1, target.unsqueeze(-1)).squeeze(-1).mean()


def forward_loss(cfg, params, buffers, inputs, targets, labels=None):
    """Scalar loss of docs/model.md §1 item 4.

    lm: mean cross-entropy over positions with target != -1.
    cls: x is averaged over the positions with target != -1 (targets act as the
    position mask), logits = W_cls m + b_cls, mean cross-entropy against labels.
    """
    s = cfg if isinstance(cfg, ModelSettings) else settings_from_config(cfg)
    inputs = torch.as_tensor(inputs, dtype=torch.long)
    targets = torch.as_tensor(targets, dtype=torch.long)
    x = final_hidden(s, params, buffers, inputs)
    valid = targets != -1
    if s.head == "lm":
        if not bool(valid.any()):
            raise ValueError("no counted targets")
        logits = linear(x, params["head/weight"])
        return _cross_entropy(logits[valid], targets[valid])
    if labels is None:
        raise ValueError("cls head needs /labels")
    mask = valid.to(x.dtype).unsqueeze(-1)                      # [B, T, 1]
    counts = mask.sum(dim=1)
    if bool((counts == 0).any()):
        raise ValueError("cls row without valid positions")
    pooled = (x * mask).sum(dim=1) / counts
    logits = linear(pooled, params["cls/weight"], params["cls/bias"])
    return _cross_entropy(logits, torch.as_tensor(labels, dtype=torch.long))


def loss_and_grads(cfg, params, buffers, inputs, targets, labels=None
                   ) -> Tuple[float, Dict[str, torch.Tensor]]:
    """Loss and d loss / d param for every parameter (zeros if unused)."""
    names = sorted(params)
    loss = forward_loss(cfg, params, buffers, inputs, targets, labels)
    grads = torch.autograd.grad(loss, [params[n] for n in names], allow_unused=True)
    out = {}
    for n, g in zip(names, grads):
        out[n] = torch.zeros_like(params[n]).detach() if g is None else g.detach()
    return float(loss.detach()), out


def load_and_compute(ckpt_path: str, tokens_path: str):
    """Convenience: loss and grads for a checkpoint and a token file."""
    cfg, params, buffers = load_checkpoint(ckpt_path)
    inputs, targets, labels = load_tokens(tokens_path)
    return loss_and_grads(cfg, params, buffers, inputs, targets, labels)
