"""The cases of the parity harness (test_parity.py): small models of every group (softmax,
momentum, fmm, cls), each a config, a sequence length and batch, and what its run checks
besides the loss and gradients (the same loss as softmax, learned gammas, FMM blends).
"""
from dataclasses import dataclass, field
from typing import Dict, List, Optional

GROUPS = ("softmax", "momentum", "fmm", "cls")
# bf16 runs a representative case or two of every group (unless --case)
BF16_SUBSET = ("two_layers_d32_h4_rope500", "noncausal_d24_h3", "tiled_T300_ragged", "gamma0.2_qk_post_rope",
               "all_options_pre_rope_q", "tiled_T300_all_options", "band5_elu", "T23_chunk8_band5",
               "momentum_all_kernels_learned", "band60_on_tiles_momentum_T150", "noncausal_band30_on_tiles_T130",
               "softmax_noncausal", "fmm_momentum_noncausal")



@dataclass
class Case:
    group: str
    name: str
    T: int
    B: int
    model: Dict[str, object]                 # vocab_size, d_model, n_heads, n_layers, d_ff, ...
    kind: str = "softmax"
    momentum: Dict[str, object] = field(default_factory=dict)
    fmm: Dict[str, object] = field(default_factory=dict)
    gammas: Optional[List[float]] = None     # values written to momentum_gamma (learn_gamma)
    blend: Optional[List[List[float]]] = None  # fmm_blend [2][H]; None = random
    batches: int = 3
    same_as_softmax: Optional[str] = None    # None, "bitwise" or "close"
    seed: int = 0
    impl: Optional[str] = None               # attention.impl (tiled | dense); None: the default (tiled)


def _m(V, d, H, L, F, **extra):
    return dict(vocab_size=V, d_model=d, n_heads=H, n_layers=L, d_ff=F, **extra)


CASES = [
    # ---- softmax ---------------------------------------------------------
    Case("softmax", "one_layer_d16_h2", 9, 2, _m(13, 16, 2, 1, 64)),
    Case("softmax", "two_layers_d32_h4_rope500", 16, 3, _m(37, 32, 4, 2, 64, rope_base=500)),
    Case("softmax", "noncausal_d24_h3", 12, 2, _m(21, 24, 3, 2, 48, causal=False)),
    # tiled softmax (the default) past one tile: 5 query tiles of 64, 2 key tiles of 256, ragged
    Case("softmax", "tiled_T300_ragged", 300, 2, _m(13, 16, 2, 1, 32)),
    Case("softmax", "tiled_T300_noncausal", 300, 2, _m(13, 16, 2, 1, 32, causal=False)),
    Case("softmax", "T1_single_position", 1, 3, _m(13, 16, 2, 2, 32)),
    Case("softmax", "dense_T70", 70, 2, _m(13, 16, 2, 2, 32), impl="dense"),
    # ---- momentum --------------------------------------------------------
    Case("momentum", "gamma0.2_qk_post_rope", 12, 2, _m(17, 16, 2, 2, 48),
         momentum=dict(gamma=0.2)),
    Case("momentum", "apply_to_q", 12, 2, _m(17, 16, 2, 2, 48),
         momentum=dict(gamma=0.2, apply_to="q")),
    Case("momentum", "pre_rope", 14, 2, _m(19, 16, 2, 2, 48),
         momentum=dict(gamma=0.2, placement="pre_rope")),
    Case("momentum", "anchor_false_buffers", 12, 3, _m(17, 16, 2, 2, 48),
         momentum=dict(gamma=0.2, anchor=False)),
    Case("momentum", "beta0.5", 13, 2, _m(17, 16, 2, 1, 32), momentum=dict(gamma=0.2, beta=0.5)),
    Case("momentum", "gamma2_0.1", 12, 2, _m(17, 16, 2, 2, 48),
         momentum=dict(gamma=0.2, gamma2=0.1)),
    Case("momentum", "learn_gamma_h4", 11, 2, _m(23, 32, 4, 2, 64),
         momentum=dict(gamma=0.1, learn_gamma=True), gammas=[0.35, -0.2, 0.05, 0.5]),
    Case("momentum", "all_options_pre_rope_q", 15, 2, _m(17, 24, 3, 2, 48),
         momentum=dict(gamma=0.15, learn_gamma=True, beta=0.3, gamma2=0.1, apply_to="q",
                       placement="pre_rope", anchor=False), gammas=[0.3, -0.1, 0.2]),
    Case("momentum", "tiled_T300_all_options", 300, 2, _m(17, 16, 2, 1, 32),
         momentum=dict(gamma=0.15, learn_gamma=True, beta=0.3, gamma2=0.1, anchor=False), gammas=[0.3, -0.1]),
    Case("momentum", "noncausal_beta_anchor_false", 12, 2, _m(17, 16, 2, 2, 48, causal=False),
         momentum=dict(gamma=0.2, beta=0.3, anchor=False)),
    Case("momentum", "gamma0_anchor_false_equals_softmax", 12, 2, _m(17, 16, 2, 2, 48),
         momentum=dict(gamma=0.0, anchor=False), same_as_softmax="bitwise"),
    Case("momentum", "learned_gamma0_equals_softmax", 12, 2, _m(17, 16, 2, 2, 48),
         momentum=dict(gamma=0.1, learn_gamma=True, beta=0.5, anchor=False),
         gammas=[0.0, 0.0], same_as_softmax="close"),
    # ---- fmm -------------------------------------------------------------
    Case("fmm", "band5_elu", 16, 2, _m(19, 16, 2, 2, 48), kind="fmm",
         fmm=dict(bandwidth=5, kernels="elu", chunk=4)),
    Case("fmm", "band3_elu_elu_flip", 20, 2, _m(19, 16, 2, 2, 48), kind="fmm",
         fmm=dict(bandwidth=3, kernels="elu,elu_flip", chunk=8)),
    Case("fmm", "band0_linear_only", 16, 2, _m(19, 32, 4, 2, 64), kind="fmm",
         fmm=dict(bandwidth=0, kernels="elu", chunk=4)),
    Case("fmm", "kernels_empty_band_only", 16, 2, _m(19, 16, 2, 2, 48), kind="fmm",
         fmm=dict(bandwidth=4, kernels="", chunk=4)),
    Case("fmm", "tanh_band2", 16, 2, _m(19, 16, 2, 1, 48), kind="fmm",
         fmm=dict(bandwidth=2, kernels="tanh", chunk=8)),
    Case("fmm", "band1_diagonal_elu", 10, 2, _m(13, 16, 2, 1, 32), kind="fmm",
         fmm=dict(bandwidth=1, kernels="elu", chunk=4)),
    Case("fmm", "noncausal_band3_elu_tanh", 14, 2, _m(19, 16, 2, 2, 48, causal=False),
         kind="fmm", fmm=dict(bandwidth=3, kernels="elu,tanh", chunk=4)),
    Case("fmm", "T23_chunk8_band5", 23, 2, _m(19, 16, 2, 2, 48), kind="fmm",
         fmm=dict(bandwidth=5, kernels="elu,elu_flip", chunk=8)),
    Case("fmm", "momentum_gamma0.2", 16, 2, _m(19, 16, 2, 2, 48), kind="fmm",
         momentum=dict(gamma=0.2), fmm=dict(bandwidth=4, kernels="elu,elu_flip", chunk=4)),
    Case("fmm", "momentum_all_kernels_learned", 18, 2, _m(19, 24, 3, 2, 48), kind="fmm",
         momentum=dict(gamma=0.1, learn_gamma=True, beta=0.3, gamma2=0.1,
                       placement="pre_rope", anchor=False),
         fmm=dict(bandwidth=3, kernels="elu,elu_flip,tanh", chunk=8), gammas=[0.25, -0.15, 0.4]),
    Case("fmm", "band_ge_T_kernels_empty", 12, 2, _m(19, 16, 2, 2, 48), kind="fmm",
         fmm=dict(bandwidth=32, kernels="", chunk=4), blend=[[2.0, -1.0], [0.5, 0.5]]),
    # bands of 48 keys or more run on tiled softmax's tiles (attention.impl = tiled), on rows with dense
    Case("fmm", "band60_on_tiles_momentum_T150", 150, 2, _m(19, 16, 2, 1, 32), kind="fmm",
         momentum=dict(gamma=0.2), fmm=dict(bandwidth=60, kernels="elu", chunk=8)),
    Case("fmm", "band60_dense_rows_T150", 150, 2, _m(19, 16, 2, 1, 32), kind="fmm", impl="dense",
         momentum=dict(gamma=0.2), fmm=dict(bandwidth=60, kernels="elu", chunk=8)),
    Case("fmm", "noncausal_band30_on_tiles_T130", 130, 2, _m(19, 16, 2, 1, 32, causal=False), kind="fmm",
         fmm=dict(bandwidth=30, kernels="elu,tanh", chunk=8)),
    # ---- cls -------------------------------------------------------------
    Case("cls", "softmax_noncausal", 20, 3, _m(24, 16, 2, 2, 48, causal=False)),
    Case("cls", "fmm_noncausal", 20, 3, _m(24, 16, 2, 2, 48, causal=False), kind="fmm",
         fmm=dict(bandwidth=3, kernels="elu,elu_flip", chunk=8)),
    Case("cls", "fmm_momentum_noncausal", 18, 3, _m(24, 16, 2, 2, 48, causal=False), kind="fmm",
         momentum=dict(gamma=0.2, learn_gamma=True), gammas=[0.3, -0.2],
         fmm=dict(bandwidth=4, kernels="tanh", chunk=4)),
    Case("cls", "softmax_causal_momentum", 16, 2, _m(24, 16, 2, 1, 48),
         momentum=dict(gamma=0.2, beta=0.3)),
]
for _i, _c in enumerate(CASES):
    _c.seed = 1000 + _i
