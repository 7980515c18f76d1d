r"""Poseidon / scOT block: time-conditioned LayerNorm around SwinV2 (shifted-)window attention.

Paper: Herde, Raonić, Rohner, Käppeli, Molinaro, de Bézenac, Mishra, "Poseidon: Efficient
Foundation Models for PDEs", NeurIPS 2024, arXiv 2405.19101. Upstream: camlab-ethz/poseidon
``scOT/model.py`` @ b8fa28f59bd7f7673323f28d11a12c6f3a215c61 (``ConditionalLayerNorm``, ``ScOTLayer``;
arithmetic unchanged since c53e3d6), which uses Hugging Face
``transformers`` SwinV2 modules (``Swinv2Attention``, ``Swinv2Intermediate``, ``Swinv2Output``,
``window_partition``/``window_reverse`` of ``models/swinv2/modeling_swinv2.py``, v4.35–4.50).

This module implements one ``ScOTLayer`` (the repeated unit of the U-shaped scOT) faithfully at
any size; patch (un)merging, ConvNeXt skips and the embedding/recovery convolutions of the full
model are not included.

Forward (``x (B, H, W, C)``, lead time ``t (B,)``)
--------------------------------------------------
*Conditional LayerNorm* ($\epsilon$ = ``layer_norm_eps`` = 1e-5):
$\mu = \overline{x}$, $\sigma^2 = \overline{x^2} - \mu^2$ (upstream's one-pass variance),
$\hat x = (x-\mu)/\sqrt{\sigma^2+\epsilon}$, $\mathrm{LN}_t(x) = \gamma(t)\odot\hat x + \beta(t)$ with
$\gamma(t) = t\,w_\gamma + b_\gamma$, $\beta(t) = t\,w_\beta + b_\beta$ (``nn.Linear(1, C)``; no other
affine).

*SwinV2 window attention* (``Swinv2Attention``; computed by refattn's single window-attention
implementation, `refattn.attention.softmax.swin.swin_window_attention_apply`, with HF parameter
names, scOT's window rule and the mask added twice): pad $H, W$ with zeros to multiples of the window
$w$; cyclically shift by $-s$ (odd blocks of a stage, $s = w/2$); split into $w\times w$ windows;
$q = xW_q + b_q$, $k = xW_k$ (no bias), $v = xW_v + b_v$; per head
$$S = \tau_h\,\hat q\hat k^\top + 16\,\sigma\big(\mathrm{CPB}\big)_{h} + 2M,\qquad
\tau_h = \exp\big(\min(\lambda_h, \log 100)\big),\qquad O = \mathrm{softmax}(S)\,v,$$
with $\hat q = q/\max(\|q\|, 10^{-12})$ (``F.normalize``), the continuous position bias
$\mathrm{CPB} = \mathrm{ReLU}(T W_0 + b_0)W_2$ of the log-spaced relative-coordinate table $T$
indexed by the relative position of each token pair, and the shifted-window mask $M$ (−100
between tokens from different image regions, 0 otherwise) — added **twice** by transformers'
``Swinv2SelfAttention`` (``mask_added_twice=True``). Heads merge and ``output.dense`` maps back;
windows reverse, the shift is undone and the padding cropped.

*Block* (res-post-norm): $h = x + \mathrm{LN}^{\text{before}}_t(\mathrm{Attn}(x))$,
$y = h + \mathrm{LN}^{\text{after}}_t\big(\mathrm{GELU}(hW_1 + b_1)W_2 + b_2\big)$.

Window/shift rule (``ScOTLayer.set_shift_and_window_size``): the window shrinks to ``H`` when
``H <= window_size``, and the shift is 0 when ``(H, W) <= (w, w)`` (a Python tuple comparison).

Backward
--------
Conditional LN: with $g = \gamma(t)\odot dy$, $dx = r\,(g - \bar g - \hat x\,\overline{g\hat x})$
(the one-pass variance equals the two-pass one exactly, so the VJP is the usual one),
$d\gamma_b = \sum_{\text{tokens}} dy\odot\hat x$, $d\beta_b = \sum dy$, $dw_\gamma = \sum_b t_b\,d\gamma_b$,
$db_\gamma = \sum_b d\gamma_b$, $dt_b = d\gamma_b\cdot w_\gamma + d\beta_b\cdot w_\beta$.
Attention: $dS = P\odot(dP - \mathrm{rowsum}(P\odot dP))$, $dP = G v^\top$, $dv = P^\top G$;
$d\hat q = \tau\,dS\,\hat k$, $d\hat k = \tau\,dS^\top\hat q$,
$d\lambda_h = \sum (dS\odot\hat q\hat k^\top)\,\tau_h\,[\lambda_h < \log 100]$;
normalize VJP $dq = (d\hat q - \hat q(\hat q\cdot d\hat q))/\|q\|$; CPB: scatter-add
$16\,\sigma(1-\sigma)\,dS$ (summed over batch and windows) into the table rows, then the
Linear–ReLU–Linear VJP (`refattn.attention.softmax.swin.swin_window_attention_vjp`). Windowing,
shifting, padding and cropping are permutations/selections: their VJPs are the inverse
permutation and zero-filling.
"""

from __future__ import annotations

import math

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_int, check_params, check_positive, compute_dtype
from ..attention.softmax.swin import (
    swin_canonical_weights,
    swin_named_grads,
    swin_window_attention_apply,
    swin_window_attention_vjp,
)
from ..nn.activations import gelu, gelu_grad
from ..nn.linear import linear_apply, linear_vjp
from ..nn.windows import swinv2_relative_coords_table
from ..registry import Mechanism, Sample, register

__all__ = ["scot_layer_forward", "scot_layer_backward", "scot_layer", "scot_param_shapes", "init_scot_params",
           "conditional_layer_norm"]

_LN_KEYS = ("weight.weight", "weight.bias", "bias.weight", "bias.bias")


def scot_param_shapes(dim: int, num_heads: int, *, mlp_ratio: float = 4.0, cpb_hidden: int = 512) -> dict:
    """Parameter names (upstream ``ScOTLayer`` ``state_dict`` keys) and shapes, ``W (in, out)``.

    PyTorch: every ``nn.Linear`` weight is transposed (``sd[k].T``); ``logit_scale`` keeps its
    ``(num_heads, 1, 1)`` shape; the ``ConditionalLayerNorm`` ``weight``/``bias`` Linears (1 -> C)
    become ``(1, C)`` weights and ``(C,)`` biases.
    """
    hid = int(mlp_ratio * dim)
    a = "attention.self."
    shapes = {a + "query.weight": (dim, dim), a + "query.bias": (dim,), a + "key.weight": (dim, dim),
              a + "value.weight": (dim, dim), a + "value.bias": (dim,), a + "logit_scale": (num_heads, 1, 1),
              a + "continuous_position_bias_mlp.0.weight": (2, cpb_hidden),
              a + "continuous_position_bias_mlp.0.bias": (cpb_hidden,),
              a + "continuous_position_bias_mlp.2.weight": (cpb_hidden, num_heads),
              "attention.output.dense.weight": (dim, dim), "attention.output.dense.bias": (dim,),
              "intermediate.dense.weight": (dim, hid), "intermediate.dense.bias": (hid,),
              "output.dense.weight": (hid, dim), "output.dense.bias": (dim,)}
    for ln in ("layernorm_before", "layernorm_after"):
        shapes[f"{ln}.weight.weight"] = (1, dim)
        shapes[f"{ln}.weight.bias"] = (dim,)
        shapes[f"{ln}.bias.weight"] = (1, dim)
        shapes[f"{ln}.bias.bias"] = (dim,)
    return shapes


def init_scot_params(rng, dim: int, num_heads: int, *, mlp_ratio: float = 4.0, cpb_hidden: int = 512,
                     initializer_range: float = 0.02) -> dict:
    """Parameters initialised like upstream: Linear weights ``N(0, initializer_range)``, biases 0,
    ``logit_scale = log 10``; conditional LN Linears as PyTorch's default ``nn.Linear(1, C)``
    (``U(-1, 1)``), which the Swinv2 ``_init_weights`` does not touch."""
    p = {}
    for k, shp in scot_param_shapes(dim, num_heads, mlp_ratio=mlp_ratio, cpb_hidden=cpb_hidden).items():
        if k.endswith("logit_scale"):
            p[k] = np.full(shp, math.log(10.0))
        elif k.startswith("layernorm"):
            p[k] = rng.uniform(-1.0, 1.0, shp)
        elif k.endswith("weight"):
            p[k] = initializer_range * rng.standard_normal(shp)
        else:
            p[k] = np.zeros(shp)
    return p


# --------------------------------------------------------------------------------------------
# Pieces


def _cln_forward(x, t, p, prefix, eps):
    """Conditional LayerNorm over the last axis of ``x (B, ..., C)`` with per-sample affine."""
    mean = x.mean(-1, keepdims=True)
    var = (x * x).mean(-1, keepdims=True) - mean * mean      # upstream's one-pass variance
    r = 1.0 / np.sqrt(var + eps)
    xhat = (x - mean) * r
    gam = t[:, None] * p[prefix + "weight.weight"][0] + p[prefix + "weight.bias"]
    bet = t[:, None] * p[prefix + "bias.weight"][0] + p[prefix + "bias.bias"]
    shp = (x.shape[0],) + (1,) * (x.ndim - 2) + (x.shape[-1],)
    return gam.reshape(shp) * xhat + bet.reshape(shp), (xhat, r, gam.reshape(shp))


def _cln_backward(dy, t, p, prefix, cache, grads):
    xhat, r, gam = cache
    red = tuple(range(1, dy.ndim - 1))
    dgam = np.sum(dy * xhat, axis=red)                        # (B, C)
    dbet = np.sum(dy, axis=red)
    grads[prefix + "weight.weight"] = (t @ dgam)[None, :]
    grads[prefix + "weight.bias"] = dgam.sum(0)
    grads[prefix + "bias.weight"] = (t @ dbet)[None, :]
    grads[prefix + "bias.bias"] = dbet.sum(0)
    dt = dgam @ p[prefix + "weight.weight"][0] + dbet @ p[prefix + "bias.weight"][0]
    g = gam * dy
    dx = r * (g - g.mean(-1, keepdims=True) - xhat * np.mean(g * xhat, -1, keepdims=True))
    return dx, dt


def conditional_layer_norm(x, t, params, *, eps: float = 1e-5):
    r"""Poseidon's ``ConditionalLayerNorm``: $\gamma(t)\odot\hat x + \beta(t)$ (see the module docstring).

    ``params``: ``weight.weight (1, C)``, ``weight.bias (C,)``, ``bias.weight (1, C)``, ``bias.bias (C,)``."""
    x = as_float(x, "x", min_ndim=2)
    t = as_float(t, "t", ndim=1)
    return _cln_forward(x, t, params, "", eps)[0]


def _window_and_shift(h, w, window_size, shift_size):
    ws = h if h <= window_size else window_size
    shift = 0 if (h, w) <= (ws, ws) else shift_size
    return ws, shift


# --------------------------------------------------------------------------------------------
# Forward / backward


def _validate(x, t, params, num_heads, window_size, shift_size, eps, mask_value, pretrained_window_size):
    x = as_float(x, "x", ndim=4)
    t = as_float(t, "t", ndim=1)
    b, h, w, c = x.shape
    if t.shape[0] != b:
        raise ValueError(f"t must have one lead time per batch element (B={b}); got shape {t.shape}")
    num_heads = check_int(num_heads, "num_heads", minimum=1)
    window_size = check_int(window_size, "window_size", minimum=1)
    shift_size = check_int(shift_size, "shift_size", minimum=0)
    pretrained_window_size = check_int(pretrained_window_size, "pretrained_window_size", minimum=0)
    eps = check_positive(eps, "eps")
    if not (isinstance(mask_value, (int, float)) and np.isfinite(mask_value) and mask_value <= 0):
        raise ValueError(f"mask_value must be a finite number <= 0; got {mask_value!r}")
    if c % num_heads:
        raise ValueError(f"channels of x ({c}) must be divisible by num_heads ({num_heads})")
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict (see scot_param_shapes); got {type(params).__name__}")
    try:
        cpb_hidden = np.shape(params["attention.self.continuous_position_bias_mlp.0.bias"])[0]
        hid = np.shape(params["intermediate.dense.bias"])[0]
    except (KeyError, IndexError):
        raise ValueError("params must contain every key of scot_param_shapes(dim, num_heads)") from None
    spec = scot_param_shapes(c, num_heads, mlp_ratio=hid / c, cpb_hidden=cpb_hidden)
    p = check_params(params, spec, where="scot_layer (the keys of scot_param_shapes)")
    ws, shift = _window_and_shift(h, w, window_size, shift_size)
    if shift >= ws:
        raise ValueError(f"shift_size ({shift_size}) must be smaller than the window ({ws})")
    dt = compute_dtype(x, t, *p.values())
    return (x.astype(dt, copy=False), t.astype(dt, copy=False), cast_all(dt, p),
            num_heads, ws, shift, eps, dt, pretrained_window_size)


def _attention_weights(p):
    """The ``attention.*`` sub-dict of the layer's params as `swin_window_attention_apply`'s weights."""
    sub = {k[len("attention."):]: v for k, v in p.items() if k.startswith("attention.")}
    return sub, swin_canonical_weights(sub, version="v2", param_names="hf")


def scot_layer_forward(x, t, params, *, num_heads: int, window_size: int, shift_size: int = 0,
                       eps: float = 1e-5, mask_value: float = -100.0, mask_added_twice: bool = True,
                       pretrained_window_size: int = 0):
    r"""One Poseidon ``ScOTLayer`` (see the module docstring for the math and conventions).

    Parameters
    ----------
    x : array (B, H, W, C)
        Tokens on the patch grid (upstream ``(B, H*W, C)`` with ``input_dimensions=(H, W)``).
    t : array (B,)
        Lead time (differentiable).
    params : dict
        Keys and shapes of :func:`scot_param_shapes` (``W (in, out)``: PyTorch ``weight.T``).
    num_heads, window_size : int
        Heads and target window (upstream ``config.window_size``, 16 in Poseidon-T/B/L).
    shift_size : int
        0 on even blocks, ``window_size // 2`` on odd blocks of a stage.
    eps : float
        ``layer_norm_eps`` (1e-5).
    mask_value, mask_added_twice
        Shifted-window mask fill (−100) and whether it is added twice (transformers'
        ``Swinv2SelfAttention`` adds it twice; the original Swin-V2 code once).
    pretrained_window_size : int
        Normalisation of the CPB coordinate table (0 = use the window itself, as scOT).

    Returns
    -------
    out, cache
        ``out (B, H, W, C)``.
    """
    x, t, p, nh, ws, shift, eps, dt, pws = _validate(x, t, params, num_heads, window_size, shift_size, eps,
                                                     mask_value, pretrained_window_size)
    sub, w = _attention_weights(p)
    att, c_att = swin_window_attention_apply(x, w, num_heads=nh, window=(ws, ws), shift=(shift, shift), version="v2",
                                             mask_value=float(mask_value), mask_added_twice=bool(mask_added_twice),
                                             pretrained_window_size=pws)
    ln1, c_ln1 = _cln_forward(att, t, p, "layernorm_before.", eps)
    hh = x + ln1
    z = linear_apply(hh, p["intermediate.dense.weight"], p["intermediate.dense.bias"])
    gz = gelu(z)
    m = linear_apply(gz, p["output.dense.weight"], p["output.dense.bias"])
    ln2, c_ln2 = _cln_forward(m, t, p, "layernorm_after.", eps)
    out = hh + ln2
    cache = dict(p=p, sub=sub, t=t, nh=nh, ws=ws, shift=shift, dt=dt, c_att=c_att, c_ln1=c_ln1, c_ln2=c_ln2,
                 hh=hh, z=z, gz=gz, shape=x.shape)
    return out, cache


def scot_layer_backward(dout, cache):
    """Gradients ``{"x", "t", <every params key>}`` (derivation in the module docstring)."""
    p, t, dt = cache["p"], cache["t"], cache["dt"]
    g = as_dout(dout, cache["shape"], dt)
    grads = {}
    dm, dt2 = _cln_backward(g, t, p, "layernorm_after.", cache["c_ln2"], grads)
    lo = linear_vjp(dm, cache["gz"], p["output.dense.weight"])
    grads["output.dense.weight"], grads["output.dense.bias"] = lo["weight"], lo["bias"]
    li = linear_vjp(lo["x"] * gelu_grad(cache["z"]), cache["hh"], p["intermediate.dense.weight"])
    grads["intermediate.dense.weight"], grads["intermediate.dense.bias"] = li["weight"], li["bias"]
    dh = g + li["x"]
    datt, dt1 = _cln_backward(dh, t, p, "layernorm_before.", cache["c_ln1"], grads)
    ga = swin_window_attention_vjp(datt, cache["c_att"])
    for k, v in swin_named_grads(ga, cache["sub"], version="v2", param_names="hf").items():
        grads["attention." + k] = v
    dx = dh + ga["x"]
    return {"x": dx, "t": dt1 + dt2, **grads}


def scot_layer(x, t, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`scot_layer_forward`."""
    return scot_layer_forward(x, t, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size, shift=True):
    while True:
        if size == "tiny":
            b, h, w, c, nh, ws, cpb, ratio = 2, 3, 3, 4, 2, 2, 3, 1.0
        else:
            b, h, w, c, nh, ws, cpb, ratio = 2, int(rng.integers(5, 7)), int(rng.integers(5, 7)), 4, 2, 4, 6, 2.0
        p = {k: rng.standard_normal(v) * (0.5 if v[0] > 1 else 1.0)
             for k, v in scot_param_shapes(c, nh, mlp_ratio=ratio, cpb_hidden=cpb).items()}
        p["attention.self.logit_scale"] = rng.uniform(0.5, 2.5, (nh, 1, 1))
        # Keep the CPB ReLU away from its kink (the table is a fixed grid).
        h1 = swinv2_relative_coords_table(ws) @ p["attention.self.continuous_position_bias_mlp.0.weight"] \
            + p["attention.self.continuous_position_bias_mlp.0.bias"]
        if np.abs(h1).min() > 1e-3:
            break
    cfg = {"num_heads": nh, "window_size": ws, "shift_size": ws // 2 if shift else 0}
    return Sample(inputs={"x": rng.standard_normal((b, h, w, c)), "t": rng.uniform(0.1, 1.0, b)},
                  params=p, config=cfg)


def _check_unit_affine_is_plain_ln(rng):
    x = rng.standard_normal((2, 5, 6)) * 3 + 1
    t = rng.uniform(0, 1, 2)
    p = {"weight.weight": np.zeros((1, 6)), "weight.bias": np.ones(6),
         "bias.weight": np.zeros((1, 6)), "bias.bias": np.zeros(6)}
    ref = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    err = float(np.abs(conditional_layer_norm(x, t, p) - ref).max())
    assert err < 1e-12, f"gamma(t)=1, beta(t)=0 differs from plain LayerNorm by {err:.2e}"
    return err


def _check_window_locality(rng):
    # Without shift, perturbing one token changes only the tokens of its own window (8x8 grid,
    # window 4: token (1, 1) is in the top-left window).
    s = _sample(rng, "small", shift=False)
    x = rng.standard_normal((2, 8, 8, 4))
    cfg = dict(s.config)
    y0 = scot_layer(x, s.inputs["t"], s.params, **cfg)
    x2 = x.copy()
    x2[:, 1, 1] += 1.0
    diff = np.abs(scot_layer(x2, s.inputs["t"], s.params, **cfg) - y0).max(axis=(0, 3))
    inside = np.zeros((8, 8), bool)
    inside[:4, :4] = True
    assert diff[~inside].max() < 1e-13 and diff[inside].min() > 0, "window attention leaked across windows"
    return float(diff[~inside].max())


def _check_shift_mask_blocks_regions(rng):
    # With shift s = 2 on an 8x8 grid (window 4) the last window (after the roll) mixes rows/cols
    # from different image regions; the -100 mask (twice) makes them invisible to each other.
    s = _sample(rng, "small")
    x = rng.standard_normal((1, 8, 8, 4))
    t = s.inputs["t"][:1]
    cfg = dict(s.config)
    y0 = scot_layer(x, t, s.params, **cfg)
    x2 = x.copy()
    x2[:, 0, 0] += 1.0      # region "top-left corner" after the cyclic shift
    diff = np.abs(scot_layer(x2, t, s.params, **cfg) - y0).max(axis=(0, 3))
    # Token (0, 0) shares a shifted window with (6, 6), (6, 0), (0, 6) ... but a different region
    # from (7, 7): only same-region tokens may change.
    assert diff[7, 7] < 1e-13 and diff[1, 1] > 0 and diff[3, 3] == 0, f"masked region leaked ({diff[7, 7]:.2e})"
    return float(diff[7, 7])


register(
    Mechanism(
        slug="scot_poseidon_block", family="3-operator", tier="T2",
        title="Poseidon/scOT layer: SwinV2 window attention (cosine scores, CPB, shifted mask) + time-conditioned LayerNorm",
        paper="Herde et al., Poseidon: Efficient Foundation Models for PDEs, NeurIPS 2024, arXiv 2405.19101",
        forward=scot_layer_forward, backward=scot_layer_backward, sample=_sample,
        docs="neural-operators.md#poseidon-scot-block",
        checks={"unit_affine_is_plain_layernorm": _check_unit_affine_is_plain_ln,
                "window_locality": _check_window_locality,
                "shift_mask_blocks_regions": _check_shift_mask_blocks_regions},
    ),
)
