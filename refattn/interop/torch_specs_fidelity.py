r"""Rows of the :mod:`refattn.interop.torch` table for the operator modules of issue #20's fidelity
items, each checked by ``check_module`` against the upstream module (tests/test_interop_fidelity.py).

* Galerkin / Fourier ``SimpleAttention`` (scaomath/galerkin-transformer), self- and, with the build
  keyword ``cross=True``, cross-attention (upstream divides by the query length: refattn's
  ``galerkin_length="query"`` default);
* OFormer ``LinearAttention`` (BaratiLab/OFormer), unpadded and, with ``padded=True``, its
  ``masked_instance_norm`` branch (statistics detached: ``masked_norm_grad="detached"``), and
  neuraloperator's ``AttentionKernelIntegral`` (``to_q/to_k/to_v/to_out``; ``weighted=True`` draws
  quadrature weights) on the same forward;
* ONO's orthogonal-attention line (xzppp/ONO ``ONOmodel2.py``), with or without the residual;
* neuraloperator's centred ``SpectralConv`` as ``"fno_spectral_conv:neuralop"`` (channel-first module,
  channel-last refattn; the dense weight is ``weight.tensor`` in its state_dict);
* IPOT's whole model as ``"ipot_inducing_point_operator:model"`` (full state-dict names; the aliases
  ``processor.layers.*`` of the shared processor are read and dropped);
* FactFormer at c9801d1: ``FABlock2D`` as ``"factformer_factorized_attention:layer"`` (positions are
  inputs) and ``LowRankKernel`` as ``"factformer_factorized_attention:low_rank_kernel"``;
* weightless cores: performer-pytorch's ``FastAttention`` (pass ``config={"projection":
  module.projection_matrix}``; performer-pytorch's conventions are the defaults), IFactFormer-m's
  three-axis ``FABlock3D_m`` core as ``"ifactformer_m_parallel_attention:axial"``, and
  neuraloperator ``CODALayer``'s attention on ``(q, k, v)`` (K and Q may live on a coarser grid).
"""

from __future__ import annotations

import numpy as np

from ..operators import factformer, fno, ifactformer, ipot
from .torch_specs import Complex, Derived, Named, Spec, Stack, add_specs

__all__ = ["FIDELITY_SLUGS", "IPOT_LINEAR", "FABLOCK_LINEAR", "axial3_forward", "axial3_backward"]

# ---- Galerkin / Fourier SimpleAttention


def _galerkin_build(rng, p, cfg, z):
    """``cross=True`` (a build keyword): a separate query of ``m`` points (of ``n`` with coordinates,
    which upstream concatenates to the query and the keys alike)."""
    c = p["linears.0.weight"].shape[0]
    inp = {"x": rng.standard_normal((z["b"], z["n"], c))}
    if "fc.weight" in p:  # upstream builds fc only for coordinates (pos_dim > 0)
        h = int(cfg["n_head"])
        npos = (p["fc.weight"].shape[0] - c) // h
        inp["pos"] = rng.uniform(0, 1, (z["b"], z["n"], npos))
    if cfg.get("cross"):
        inp["query"] = rng.standard_normal((z["b"], z["n"] if "pos" in inp else z["m"], c))
    return inp, {}


def _galerkin_call(module, inp, cfg):
    x = inp["x"]
    return module(inp.get("query", x), x, x, pos=inp.get("pos"))[0]


def _galerkin_rules(norms):
    return [Named(r"linears\.[012]\.weight|fc\.weight", True), Named(r"linears\.[012]\.bias|fc\.bias", False)] + [
        Stack(f"norm_{t}", leaf) for t in norms for leaf in ("weight", "bias")]



# ---- OFormer LinearAttention (self-attention: to_qkv, to_out.0)


def _oformer_build(rng, p, cfg, z):
    """OFormer (``to_qkv``) or neuraloperator's AttentionKernelIntegral (``to_k``, ``to_v``, optional
    ``to_q``). Build keywords: ``padded=True`` pads the last sequence (OFormer's masked branch:
    norm over the real points, statistics detached unless ``masked_norm_grad`` says otherwise);
    ``weighted=True`` draws quadrature weights (AKI's ``weights``)."""
    b, n = z["b"], z["n"]
    x = rng.standard_normal((b, n, p["to_qkv.weight" if "to_qkv.weight" in p else "to_k.weight"].shape[0]))
    extra = {}
    if cfg.get("padded"):
        mask = np.ones((b, n), bool)
        mask[-1, max(1, n - n // 3):] = False
        extra = {"padding_mask": mask, "norm_axis": "points",
                 "masked_norm_grad": cfg.get("masked_norm_grad", "detached")}
    if cfg.get("weighted"):
        extra["weights"] = rng.uniform(0.1, 0.3, (b, n))
    return {"x": x}, extra


def _oformer_call(module, inp, cfg):
    import torch

    x = inp["x"]
    if hasattr(module, "to_k") and not hasattr(module, "to_qkv"):  # AttentionKernelIntegral(u, pos, weights)
        w = cfg.get("weights")
        pos = torch.zeros(*x.shape[:2], 2, dtype=x.dtype)  # only its shape is read (no positional term)
        return module(x, pos, weights=None if w is None else torch.from_numpy(w).to(x.dtype))
    if cfg.get("padding_mask") is not None:
        return module(x, torch.from_numpy(cfg["padding_mask"]))
    return module(x)


def _oformer_infer(keys):
    """AKI's separate ``to_q/to_k/to_v``: norm over each point's channels, weights on the output rows."""
    return {"weights_placement": "output"} if "to_k.weight" in keys else {}

# ---- ONO: the orthogonal-attention line of ONOBlock (psi = proj(x) and fx are inputs)


def _ono_build(rng, p, cfg, z):
    """``n >= d + 2`` points so that the batch covariance of ``psi`` is positive definite."""
    d = p["mu"].shape[0]
    n = max(z["n"], d + 2)
    return {"psi": rng.standard_normal((z["b"], n, d)) + 0.3, "fx": rng.standard_normal((z["b"], n, 3))}, {}


# ---- neuraloperator SpectralConv (centred modes): channel-first module, channel-last refattn


def _spectral_build(rng, p, cfg, z):
    """A grid holding the kept modes: ``n_i >= modes_i`` and ``n_d // 2 + 1 >= `` the last kept count."""
    w = p["weight_real"]
    modes, extra = w.shape[2:], z["n"] % 3
    grid = [m + 1 + extra for m in modes[:-1]] + [2 * (modes[-1] - 1) + 1 + z["n"] % 2]
    return {"x": rng.standard_normal((z["b"], *grid, w.shape[0]))}, {}


def _spectral_call(module, inp, cfg):
    return module(inp["x"].movedim(-1, 1)).movedim(1, -1)


# ---- IPOT whole model: (B, N, in_channel + d) function values and positions, queries (M, d)


def _ipot_build(rng, p, cfg, z):
    d = len(np.atleast_1d(cfg["num_bands"]))
    u = rng.standard_normal((z["b"], z["n"], int(cfg["in_channel"])))
    return {"inputs": np.concatenate([u, rng.random((z["b"], z["n"], d))], -1),
            "decoder_query": rng.random((z["m"], d))}, {}


IPOT_LINEAR = r".*\.(to_q|to_kv|to_out|net\.0|net\.3)\.weight"
"""IPOT's ``nn.Linear`` weights (the names the table transposes)."""

# ---- FactFormer (BaratiLab/FactFormer @ c9801d1): FABlock2D and LowRankKernel

FABLOCK_LINEAR = r"(to_v|to_in|to_[xy]\.\d\.to_in|to_[xy]\.\d\.out_ffn\.fn\.net\.[03]|low_rank_kernel_[xy]\.to_[qk]" \
                  r"|to_out\.[13])\.weight"
"""FactFormer FABlock2D's ``nn.Linear`` weights (the names the table transposes)."""


def _fablock_build(rng, p, cfg, z):
    nx, ny = 2 + z["n"] % 4, 3 + z["m"] % 3
    u = rng.standard_normal((z["b"], nx, ny, p["to_v.weight"].shape[0]))
    return {"u": u, "pos_x": np.sort(rng.random((nx, 1)), 0), "pos_y": np.sort(rng.random((ny, 1)), 0)}, {}


def _fablock_call(module, inp, cfg):
    return module(inp["u"], inp["pos_x"], inp["pos_y"])


def _lrk_build(rng, p, cfg, z):
    """``cross=True`` (a build keyword): a separate ``u_y`` of ``m`` points (upstream's cross kernel)."""
    c, n = p["to_q.weight"].shape[0], max(z["n"], 2)  # normalize=True takes an unbiased std over the points
    inp = {"u_x": rng.standard_normal((z["b"], n, c))}
    rotary = cfg.get("positional_embedding", "rotary") == "rotary"
    if rotary:
        inp["pos_x"] = np.sort(rng.random((n, 1)), 0)
    if cfg.get("cross"):
        inp["u_y"] = rng.standard_normal((z["b"], z["m"], c))
        if rotary:
            inp["pos_y"] = np.sort(rng.random((z["m"], 1)), 0)
    return inp, {}


def _lrk_call(module, inp, cfg):
    return module(inp["u_x"], u_y=inp.get("u_y"), pos_x=inp.get("pos_x"), pos_y=inp.get("pos_y"))


# ---- weightless cores: performer-pytorch FastAttention, IFactFormer-m FABlock3D_m, CODALayer


def _performer_build(rng, p, cfg, z):
    d = np.asarray(cfg["projection"]).shape[1]
    q, k, v = (0.7 * rng.standard_normal((z["b"], 2, z["n"], d)) for _ in range(3))
    return {"q": q, "k": k, "v": v}, ({} if "key_sum_eps" in cfg else {"key_sum_eps": 1e-6 if cfg.get("causal") else 0.0})


def _qkv_call(module, inp, cfg):
    return module(inp["q"], inp["k"], inp["v"])


def axial3_forward(v, q_x, k_x, q_y, k_y, q_z, k_z, *, scaling: float = 1.0):
    """IFactFormer-m's 3-D core with one input per axis: :func:`~refattn.operators.ifactformer.
    ifactformer_m_axial_forward` on ``[q_x, q_y, q_z]``, ``[k_x, k_y, k_z]``, every axis scaled alike
    (``FABlock3D_m``'s ``scaling_factor``)."""
    return ifactformer.ifactformer_m_axial_forward(v, [q_x, q_y, q_z], [k_x, k_y, k_z], scalings=(scaling,) * 3)


def axial3_backward(dout, cache):
    """The gradients of :func:`axial3_forward`, one per named input."""
    g = ifactformer.ifactformer_m_axial_backward(dout, cache)
    return {"v": g["v"], **{f"{t}_{a}": g[f"{t}s"][i] for i, a in enumerate("xyz") for t in "qk"}}


def _axial3_build(rng, p, cfg, z):
    grid, h, d = (2 + z["n"] % 3, 3, 2 + z["m"] % 2), 2, 3
    inp = {"v": rng.standard_normal((z["b"], h, *grid, 2))}
    for a, n in zip("xyz", grid):
        inp[f"q_{a}"], inp[f"k_{a}"] = rng.standard_normal((z["b"], h, n, d)), rng.standard_normal((z["b"], h, n, d))
    return inp, {}


def _axial3_call(module, inp, cfg):
    return module(*(inp[k] for k in ("v", "q_x", "k_x", "q_y", "k_y", "q_z", "k_z")))


def _coda_build(rng, p, cfg, z):
    """K and Q on a grid half as fine as V's (CODALayer's ``scale=0.5`` default)."""
    g = 2 + z["n"] % 2
    t = 1 + z["m"] % 3
    qk = [rng.standard_normal((z["b"], 2, t, 2, g, g)) for _ in range(2)]
    return {"q": qk[0], "k": qk[1], "v": rng.standard_normal((z["b"], 2, t, 3, 2 * g, 2 * g))}, {}

_SPECS = [
    Spec("galerkin_attention", "scaomath/galerkin-transformer libs/layers.py@2c9d23e (SimpleAttention, "
          "attention_type='galerkin')",
          rules=_galerkin_rules("KV"), required=("linears.0.weight", "linears.1.weight", "linears.2.weight"),
          call=_galerkin_call, build=_galerkin_build, attrs={"n_head": "n_head"}, build_keys=("cross",)),
    Spec("fourier_type_attention", "scaomath/galerkin-transformer libs/layers.py@2c9d23e (SimpleAttention, "
          "attention_type='fourier')",
          rules=_galerkin_rules("QK"), required=("linears.0.weight", "linears.1.weight", "linears.2.weight"),
          call=_galerkin_call, build=_galerkin_build, attrs={"n_head": "n_head"}, build_keys=("cross",)),
    Spec("oformer_attention", "BaratiLab/OFormer airfoil/nn_module/attention_module.py@f1111b3 (LinearAttention, "
         "self-attention, no positional embedding; unpadded: norm over each point's channels; padded=True: "
         "masked_instance_norm over the real points, statistics detached); neuraloperator "
         "neuralop/layers/attention_kernel_integral.py@93d3f06 (AttentionKernelIntegral; weighted=True)",
         rules=[Named(r"to_qkv\.weight|to_out\.0\.weight|to_[qkv]\.weight|to_out\.weight", True),
                Named(r"to_out\.0\.bias|to_out\.bias|[qkv]_norm\.(weight|bias)", False)],
         call=_oformer_call, build=_oformer_build, build_keys=("padded", "weighted"), infer=_oformer_infer,
         attrs={"n_head": ("heads", "n_heads"), "out_channels": "out_channels"}, defaults={"norm_axis": "channels"}),
    Spec("ono_orthogonal_attention", "xzppp/ONO ONOmodel2.py@8e4eee8 (ONOBlock's orthogonal-attention line, "
         "orth=True, training: psi = proj(x) and fx are the inputs; residual + fx, residual=False for 86e1bfe)",
         rules=[Named(r"mu", False)], required=("mu",), call=lambda m, inp, cfg: m(inp["psi"], inp["fx"]),
         build=_ono_build, attrs={"residual": "residual"}),
    Spec("fno_spectral_conv", "neuraloperator neuralop/layers/spectral_convolution.py@93d3f06 (SpectralConv, dense "
         "weight, channel-first; PyPI 2.0.0 is inverse_shift='fftshift')",
         rules=[Complex("weight.tensor", ref="weight"), Named(r"bias", False)], required=("weight.tensor",),
         call=_spectral_call, build=_spectral_build,
         layer=(fno.fno_spectral_conv_centred_forward, fno.fno_spectral_conv_centred_backward), variant="neuralop"),
    Spec("ipot_inducing_point_operator", "7tl7qns7ch/IPOT models/epd.py@18c1778 (EncoderProcessorDecoder with "
         "IPOTBasicPreprocessor and IPOTDecoder, pos2fourier; forward(inputs, decoder_query))",
         rules=[Named(IPOT_LINEAR, True), Named(r".*", False)], required=("encoder.latents",),
         call=lambda m, inp, cfg: m(inp["inputs"], inp["decoder_query"]), build=_ipot_build,
         attrs={"in_channel": "in_channel", "num_layers": "num_layers"},
         layer=(ipot.ipot_model_forward, ipot.ipot_model_backward), variant="model"),
    Spec("factformer_factorized_attention", "BaratiLab/FactFormer libs/factorization_module.py@c9801d1 (FABlock2D, "
         "use_rope=True; to_out GroupNorm(heads, domain_wise=True, affine=False) of libs/basics.py; "
         "forward(u, pos_x, pos_y))",
         rules=[Named(FABLOCK_LINEAR, True), Named(r".*", False)], required=("to_v.weight", "to_in.weight"),
         call=_fablock_call, build=_fablock_build, attrs={"heads": "heads", "dim_head": "dim_head"},
         kw_inputs=("pos_x", "pos_y"),
         layer=(factformer.factformer_block_forward, factformer.factformer_block_backward)),
    Spec("factformer_factorized_attention", "BaratiLab/FactFormer libs/attention.py@c9801d1 (LowRankKernel, "
         "pos_dim=1; forward(u_x, u_y=None, pos_x=None, pos_y=None); cross=True draws u_y)",
         rules=[Named(r"to_[qk]\.weight", True), Named(r"gamma", False)], required=("to_q.weight", "to_k.weight"),
         call=_lrk_call, build=_lrk_build, build_keys=("cross",), attrs={"heads": "heads"},
         layer=(factformer.low_rank_kernel_forward, factformer.low_rank_kernel_backward), variant="low_rank_kernel"),
    Spec("performer_favor_plus", "lucidrains/performer-pytorch performer_pytorch/performer_pytorch.py@fc8b784 "
         "(FastAttention with softmax_kernel; pass config={'projection': module.projection_matrix}; causal: "
         "causal_linear_attention_noncuda, key_sum_eps=1e-6)",
         rules=[Derived(r"projection_matrix")], call=_qkv_call, build=_performer_build, attrs={"causal": "causal"},
         defaults={"feature_eps": 1e-4, "denominator_guard": 0.0, "stabilizer_grad": False,
                   "key_stabilizer": "per_head"}),
    Spec("ifactformer_m_parallel_attention", "huiyu-2002/IFactFormer-m libs/factorization_module.py@3f110da "
         "(FABlock3D_m between the kernels and to_out: three axis branches concatenated; "
         "forward(v, q_x, k_x, q_y, k_y, q_z, k_z))",
         rules=[], call=_axial3_call, build=_axial3_build, attrs={"scaling": "scaling"},
         layer=(axial3_forward, axial3_backward), variant="axial"),
    Spec("coda_no_codomain_attention", "neuraloperator neuralop/layers/coda_layer.py@93d3f06 (CODALayer."
         "compute_attention after Key/Query/Value: forward(q, k, v), K and Q on their own grid)",
         rules=[], call=_qkv_call, build=_coda_build, attrs={"temperature": "temperature"}),
]

add_specs(*_SPECS)

FIDELITY_SLUGS = tuple(s.key for s in _SPECS)
"""The keys this module adds to :data:`~refattn.interop.torch_specs.SPECS`."""
