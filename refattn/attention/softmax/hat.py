r"""HAT: the hybrid attention block (window self-attention + channel attention) and the overlapping
cross-attention block (one record, ``hat_hybrid_attention``, ``block="hab"`` or ``"ocab"``).

Papers: Chen, Wang, Zhou, Qiao, Dong, "Activating More Pixels in Image Super-Resolution
Transformer", CVPR 2023, arXiv 2205.04437; Chen et al., "HAT: Hybrid Attention Transformer for
Image Restoration", arXiv 2309.05239 (same blocks). Upstream: XPixelGroup/HAT
``hat/archs/hat_arch.py`` @1638a9a822581657811867bf670717f8371fc3e5 (``CAB``, ``ChannelAttention``,
``WindowAttention``, ``HAB``, ``OCAB``, ``calculate_rpi_sa``, ``calculate_rpi_oca``,
``calculate_mask``). Both blocks work on a token grid ``x (B, H, W, C)`` (upstream
``(b, h*w, c)`` with ``x_size = (h, w)``); parameters keep the upstream ``state_dict`` names, with
linear weights ``(in, out)`` (torch ``weight.T``) and conv weights in torch's layout.

Hybrid attention block (HAB)
----------------------------
$$h = \mathrm{LN}_1(x),\quad u = x + \mathrm{(S)W\text{-}MSA}(h) + \alpha\,\mathrm{CAB}(h),\quad
y = u + \mathrm{MLP}(\mathrm{LN}_2(u)),$$

$\alpha$ = ``conv_scale`` (0.01). The (shifted-)window attention is Swin V1 exactly (HAT's
``WindowAttention`` with its ``rpi_sa`` is Swin's index and ``calculate_mask`` Swin's mask, fill
−100): `refattn.attention.softmax.swin.swin_window_attention_apply` with the parameters
``attn.qkv``, ``attn.relative_position_bias_table``, ``attn.proj``. The channel attention block
(RCAN-style) on $h$ in channels-first layout:

$$a_1 = \mathrm{Conv}_{3\times3}(h),\ a_2 = \mathrm{Conv}_{3\times3}(\mathrm{GELU}(a_1)),\quad
m = \mathrm{mean}_{HW}(a_2),\ g = \sigma\big(W_3\,\mathrm{ReLU}(W_1m + b_1) + b_3\big),\quad
\mathrm{CAB}(h) = a_2\odot g$$

(``conv_block.cab.0`` $C\to C/r_c$, ``cab.2`` $C/r_c\to C$, ``cab.3.attention.1``/``.3`` the $1\times1$
squeeze/excite convs, $C\to C/r_s\to C$). MLP: ``mlp.fc1``, GELU, ``mlp.fc2``.

Overlapping cross-attention block (OCAB)
----------------------------------------
$h = \mathrm{LN}_1(x)$, $[q, k, v] = h\,W_{qkv} + b$. Queries come from non-overlapping
$M\times M$ windows of $q$; keys and values from overlapping $M_o\times M_o$ windows,
$M_o = M + \lfloor\gamma M\rfloor$ (``overlap_ratio`` $\gamma$ = 0.5), cut from the *projected*
$[k; v]$ by ``F.unfold`` (kernel $M_o$, stride $M$, zero padding $(M_o - M)/2$: positions outside
the image give zero keys and values, which still take part in the softmax, as upstream). Per
window and head, $P = \mathrm{softmax}(s\,qk^\top + B)$ with the ``relative_position_bias_table`` of
$(M + M_o - 1)^2$ rows indexed by ``calculate_rpi_oca``; $O = Pv$ back on the grid, then
$u = x + OW_p + b_p$ (``proj``) and $y = u + \mathrm{MLP}(\mathrm{LN}_2(u))$.

*The OCA index.* ``calculate_rpi_oca`` offsets the coordinate difference (extended minus
original) by $M - M_o + 1$ per axis, so some indices are negative and PyTorch's indexing wraps them
(row $\iota \bmod T$, $T = (M+M_o-1)^2$). The map is still a bijection from relative offsets to
rows (a permutation of the natural index), so it is reproduced exactly for checkpoint compatibility
(`oca_relative_position_index`).

Backward (derivation)
---------------------
Everything is a composition of primitives with known VJPs: LayerNorm
(`refattn.blocks.core.norm_backward`), the MLP (`refattn.blocks.core.mlp_backward`), the window
attention (`refattn.attention.softmax.swin.swin_window_attention_vjp`), convolutions
(`refattn.nn.conv.conv_vjp`), and for CAB's gate, with $G = \partial L/\partial\,\mathrm{CAB}$:
$da_2 = G\odot g + \tfrac{1}{HW}\,dm$, $dg = \sum_{HW} G\odot a_2$, $de = dg\odot g(1-g)$,
$dW_3 = de^\top r$, $dr = de\,W_3$, $dz = dr\,[z > 0]$, $dW_1 = dz^\top m$, $dm = dz\,W_1$.
In OCAB, window partition and ``unfold`` are fixed gathers, so their VJPs are
`refattn.nn.windows.window_reverse_apply` and ``fold`` (`refattn.nn.windows.fold_apply`), the
scatter-add in which overlapping windows accumulate; the attention VJP is the core's
(`refattn.attention.softmax.attention_core_backward`, with the gathered bias's scatter-add into the
table). The residual splits the gradient: $dx = du + \mathrm{LN}_1^\top(dh)$ with $dh$ from the
attention and (HAB) $\alpha\,$CAB branches.

Selections (windows, shift, mask, unfold) are fixed: the backward is the gradient of the selected
computation. HAB pads the grid to a multiple of the window like HF Swin (HAT pads the image at the
model level, so its blocks see divisible sizes, where the two agree); OCAB needs $H, W$ divisible by
$M$ and $M_o - M$ even (otherwise ``unfold`` does not give one key window per query window upstream
either).
"""

from __future__ import annotations

import math

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_choice, check_params, check_positive, compute_dtype
from ...blocks.core import mlp_backward, mlp_forward, norm_backward, norm_forward
from ...nn.activations import gelu, gelu_grad, sigmoid
from ...nn.conv import conv_apply, conv_vjp
from ...nn.linear import linear_apply, linear_vjp, merge_heads, split_heads
from ...nn.windows import (
    fold_apply,
    relative_position_index,
    unfold_apply,
    window_partition_apply,
    window_reverse_apply,
)
from ...registry import Mechanism, Sample, register
from .core import attention_core_backward, attention_core_forward, check_size
from .swin import (
    swin_canonical_weights,
    swin_named_grads,
    swin_window_and_shift,
    swin_window_attention_apply,
    swin_window_attention_vjp,
)

__all__ = [
    "HAT_BLOCKS",
    "hab_param_spec",
    "ocab_param_spec",
    "oca_window_sizes",
    "oca_relative_position_index",
    "init_hat_params",
    "hab_forward",
    "hab_backward",
    "ocab_forward",
    "ocab_backward",
    "hat_block_forward",
    "hat_block_backward",
    "hat_block",
]

HAT_BLOCKS = ("hab", "ocab")
_CAB = "conv_block.cab."


# --------------------------------------------------------------------------------------------
# Shapes and indices


def hab_param_spec(dim: int, num_heads: int, window_size: int, *, cab_hidden: int, se_hidden: int,
                   mlp_hidden: int) -> dict:
    """HAB parameter names and shapes (``state_dict`` keys of ``HAB``; linear ``(in, out)``, conv torch layout)."""
    c, m = dim, window_size
    return {"norm1.weight": (c,), "norm1.bias": (c,),
            "attn.relative_position_bias_table": ((2 * m - 1) ** 2, num_heads),
            "attn.qkv.weight": (c, 3 * c), "attn.qkv.bias": (3 * c,), "attn.proj.weight": (c, c),
            "attn.proj.bias": (c,),
            _CAB + "0.weight": (cab_hidden, c, 3, 3), _CAB + "0.bias": (cab_hidden,),
            _CAB + "2.weight": (c, cab_hidden, 3, 3), _CAB + "2.bias": (c,),
            _CAB + "3.attention.1.weight": (se_hidden, c, 1, 1), _CAB + "3.attention.1.bias": (se_hidden,),
            _CAB + "3.attention.3.weight": (c, se_hidden, 1, 1), _CAB + "3.attention.3.bias": (c,),
            "norm2.weight": (c,), "norm2.bias": (c,),
            "mlp.fc1.weight": (c, mlp_hidden), "mlp.fc1.bias": (mlp_hidden,),
            "mlp.fc2.weight": (mlp_hidden, c), "mlp.fc2.bias": (c,)}


def oca_window_sizes(window_size: int, overlap_ratio: float) -> tuple[int, int, int]:
    """``(M, M_o, padding)``: HAT's ``overlap_win_size = int(M * ratio) + M`` and unfold padding
    ``(M_o - M) // 2``."""
    mo = int(window_size * overlap_ratio) + window_size
    return window_size, mo, (mo - window_size) // 2


def ocab_param_spec(dim: int, num_heads: int, window_size: int, overlap_ratio: float, *, mlp_hidden: int) -> dict:
    """OCAB parameter names and shapes (``state_dict`` keys of ``OCAB``)."""
    m, mo, _ = oca_window_sizes(window_size, overlap_ratio)
    c = dim
    return {"norm1.weight": (c,), "norm1.bias": (c,), "qkv.weight": (c, 3 * c), "qkv.bias": (3 * c,),
            "relative_position_bias_table": ((m + mo - 1) ** 2, num_heads),
            "proj.weight": (c, c), "proj.bias": (c,), "norm2.weight": (c,), "norm2.bias": (c,),
            "mlp.fc1.weight": (c, mlp_hidden), "mlp.fc1.bias": (mlp_hidden,),
            "mlp.fc2.weight": (mlp_hidden, c), "mlp.fc2.bias": (c,)}


def oca_relative_position_index(window_size: int, overlap_window_size: int) -> np.ndarray:
    r"""HAT's ``calculate_rpi_oca`` ``(M^2, M_o^2)``: per axis $e - o + M - M_o + 1$ (extended minus
    original coordinate), combined in base $M + M_o - 1$, taken modulo the table size (PyTorch's
    wrap of negative indices)."""
    m, mo = window_size, overlap_window_size
    base = m + mo - 1
    co = np.stack(np.meshgrid(np.arange(m), np.arange(m), indexing="ij")).reshape(2, -1)
    ce = np.stack(np.meshgrid(np.arange(mo), np.arange(mo), indexing="ij")).reshape(2, -1)
    rel = ce[:, None, :] - co[:, :, None] + (m - mo + 1)               # (2, M^2, M_o^2)
    return (rel[0] * base + rel[1]) % (base * base)


def init_hat_params(rng, dim: int, num_heads: int, window_size: int, *, block: str = "hab",
                    compress_ratio: int = 3, squeeze_factor: int = 30, mlp_ratio: float = 2.0,
                    overlap_ratio: float = 0.5) -> dict:
    """Random parameters: norms near 1/0, linear/conv weights $U(\\pm1/\\sqrt{fan_{in}})$, biases $0.1\\mathcal N$,
    tables $0.5\\mathcal N$."""
    check_choice(block, "block", HAT_BLOCKS)
    hid = int(dim * mlp_ratio)
    spec = (hab_param_spec(dim, num_heads, window_size, cab_hidden=dim // compress_ratio,
                           se_hidden=dim // squeeze_factor, mlp_hidden=hid) if block == "hab" else
            ocab_param_spec(dim, num_heads, window_size, overlap_ratio, mlp_hidden=hid))
    p = {}
    for k, shp in spec.items():
        if k.startswith("norm"):
            p[k] = (1.0 if k.endswith("weight") else 0.0) + 0.1 * rng.standard_normal(shp)
        elif k.endswith("bias_table"):
            p[k] = 0.5 * rng.standard_normal(shp)
        elif len(shp) >= 2:
            fan_in = shp[0] if len(shp) == 2 else math.prod(shp[1:])
            p[k] = rng.uniform(-1.0, 1.0, shp) / math.sqrt(fan_in)
        else:
            p[k] = 0.1 * rng.standard_normal(shp)
    return p


# --------------------------------------------------------------------------------------------
# CAB (channel attention block), unvalidated


def _cab_forward(p, h):
    """``h (B, H, W, C)`` -> ``(CAB(h) (B, H, W, C), cache)``."""
    hc = np.moveaxis(h, -1, 1)
    a1 = conv_apply(hc, p[_CAB + "0.weight"], p[_CAB + "0.bias"], padding=1)
    g1 = gelu(a1)
    a2 = conv_apply(g1, p[_CAB + "2.weight"], p[_CAB + "2.bias"], padding=1)
    m = a2.mean(axis=(2, 3))                                            # (B, C)
    w1, w3 = p[_CAB + "3.attention.1.weight"][:, :, 0, 0], p[_CAB + "3.attention.3.weight"][:, :, 0, 0]
    z = m @ w1.T + p[_CAB + "3.attention.1.bias"]
    r = np.maximum(z, 0.0)
    g = sigmoid(r @ w3.T + p[_CAB + "3.attention.3.bias"])             # (B, C)
    out = a2 * g[:, :, None, None]
    return np.moveaxis(out, 1, -1), (hc, a1, g1, a2, m, z, r, g, w1, w3)


def _cab_backward(grads, p, dout, cache):
    hc, a1, g1, a2, m, z, r, g, w1, w3 = cache
    gc = np.moveaxis(dout, -1, 1)
    dgate = np.sum(gc * a2, axis=(2, 3))
    de = dgate * g * (1.0 - g)
    grads[_CAB + "3.attention.3.weight"] = (de.T @ r)[:, :, None, None]
    grads[_CAB + "3.attention.3.bias"] = de.sum(0)
    dz = (de @ w3) * (z > 0)
    grads[_CAB + "3.attention.1.weight"] = (dz.T @ m)[:, :, None, None]
    grads[_CAB + "3.attention.1.bias"] = dz.sum(0)
    dm = dz @ w1
    da2 = gc * g[:, :, None, None] + dm[:, :, None, None] / (a2.shape[2] * a2.shape[3])
    l2 = conv_vjp(da2, g1, p[_CAB + "2.weight"], padding=1)
    l1 = conv_vjp(l2["x"] * gelu_grad(a1), hc, p[_CAB + "0.weight"], padding=1)
    for name, lg in (("2", l2), ("0", l1)):
        grads[_CAB + name + ".weight"], grads[_CAB + name + ".bias"] = lg["weight"], lg["bias"]
    return np.moveaxis(l1["x"], 1, -1)


def _sub(p, prefix):
    return {k[len(prefix):]: v for k, v in p.items() if k.startswith(prefix)}


# --------------------------------------------------------------------------------------------
# Validation


def _common(x, num_heads, window_size, eps, scale):
    x = as_float(x, "x", ndim=4)
    num_heads = check_size(num_heads, "num_heads")
    window_size = check_size(window_size, "window_size")
    eps = check_positive(eps, "eps")
    scale = check_positive(scale, "scale", allow_none=True)
    if x.shape[-1] % num_heads:
        raise ValueError(f"channels of x ({x.shape[-1]}) must be divisible by num_heads ({num_heads})")
    return x, num_heads, window_size, eps, scale


def _hidden(params, key, axis, what):
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of the upstream HAT parameters; got {type(params).__name__}")
    v = params.get(key)
    if v is None or np.ndim(v) <= axis:
        raise ValueError(f"params is missing {key!r} (its shape gives the {what})")
    return int(np.shape(v)[axis])


# --------------------------------------------------------------------------------------------
# HAB


def hab_forward(x, params, *, num_heads: int, window_size: int = 7, shift_size: int = 0, conv_scale: float = 0.01,
                scale=None, eps: float = 1e-5, mask_value: float = -100.0):
    r"""HAT's hybrid attention block on ``x (B, H, W, C)`` (see the module docstring).

    ``params``: the keys of `hab_param_spec`; ``shift_size`` 0 on even blocks and ``window_size // 2``
    on odd ones; ``conv_scale`` $\alpha$ (0.01); ``scale`` the attention scale (``qk_scale``, default
    $d^{-1/2}$); ``eps`` the LayerNorm epsilon; ``mask_value`` the shift-mask fill (−100)."""
    x, nh, m, eps, scale = _common(x, num_heads, window_size, eps, scale)
    conv_scale = float(check_positive(conv_scale, "conv_scale", allow_zero=True))
    if not isinstance(mask_value, (int, float, np.floating)) or isinstance(mask_value, bool) \
            or np.isnan(mask_value) or mask_value > 0:
        raise ValueError(f"mask_value must be a number <= 0; got {mask_value!r}")
    c = x.shape[-1]
    window, shift = swin_window_and_shift(x.shape[1:3], m, check_size(shift_size, "shift_size", 0), "microsoft")
    spec = hab_param_spec(c, nh, window[0], cab_hidden=_hidden(params, _CAB + "0.weight", 0, "CAB width"),
                          se_hidden=_hidden(params, _CAB + "3.attention.1.weight", 0, "squeeze width"),
                          mlp_hidden=_hidden(params, "mlp.fc1.weight", 1, "MLP width"))
    p = check_params(params, spec, where="hab (HAT hybrid attention block)")
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    h, c1 = norm_forward(p, "norm1", x, eps=eps)
    cab, ccab = _cab_forward(p, h)
    attn_p = _sub(p, "attn.")
    a, ca = swin_window_attention_apply(h, swin_canonical_weights(attn_p, version="v1", param_names="microsoft"),
                                        num_heads=nh, window=window, shift=shift, scale=scale,
                                        mask_value=float(mask_value))
    u = x + a + conv_scale * cab
    h2, c2 = norm_forward(p, "norm2", u, eps=eps)
    mo, cm = mlp_forward(p, h2, fc1="mlp.fc1", fc2="mlp.fc2", activation="gelu")
    y = u + mo
    return y, {"p": p, "attn_p": attn_p, "c1": c1, "ccab": ccab, "ca": ca, "c2": c2, "cm": cm,
               "alpha": conv_scale, "shape": y.shape, "dt": dt}


def hab_backward(dout, cache):
    """Gradient of :func:`hab_forward`: ``x`` and every parameter."""
    p = cache["p"]
    g = as_dout(dout, cache["shape"], cache["dt"])
    grads = {}
    du = g + norm_backward(grads, p, mlp_backward(grads, p, g, cache["cm"]), cache["c2"])
    ga = swin_window_attention_vjp(du, cache["ca"])
    for k, v in swin_named_grads(ga, cache["attn_p"], version="v1", param_names="microsoft").items():
        grads["attn." + k] = v
    dh = ga["x"] + _cab_backward(grads, p, cache["alpha"] * du, cache["ccab"])
    dx = du + norm_backward(grads, p, dh, cache["c1"])
    return {"x": dx, **{k: grads[k] for k in p}}


# --------------------------------------------------------------------------------------------
# OCAB


def ocab_forward(x, params, *, num_heads: int, window_size: int = 16, overlap_ratio: float = 0.5, scale=None,
                 eps: float = 1e-5):
    r"""HAT's overlapping cross-attention block on ``x (B, H, W, C)`` (see the module docstring).

    ``params``: the keys of `ocab_param_spec`; $H, W$ multiples of ``window_size``; the overlapping
    window is ``int(window_size * overlap_ratio) + window_size`` and must exceed the window by an
    even number."""
    x, nh, m, eps, scale = _common(x, num_heads, window_size, eps, scale)
    overlap_ratio = float(check_positive(overlap_ratio, "overlap_ratio", allow_zero=True))
    m, mo, pad = oca_window_sizes(m, overlap_ratio)
    b, hh, ww, c = x.shape
    if hh % m or ww % m:
        raise ValueError(f"x spatial size {(hh, ww)} must be a multiple of window_size ({m}) for OCAB "
                         f"(HAT pads the image at the model level)")
    if (mo - m) % 2:
        raise ValueError(f"overlap_ratio={overlap_ratio} gives an overlapping window {mo} that exceeds window_size {m} "
                         f"by an odd number; unfold would not give one key window per query window")
    spec = ocab_param_spec(c, nh, m, overlap_ratio, mlp_hidden=_hidden(params, "mlp.fc1.weight", 1, "MLP width"))
    p = check_params(params, spec, where="ocab (HAT overlapping cross-attention block)")
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    h, c1 = norm_forward(p, "norm1", x, eps=eps)
    qkv = linear_apply(h, p["qkv.weight"], p["qkv.bias"])              # (B, H, W, 3C)
    qw = window_partition_apply(qkv[..., :c], m)                       # (B, nW, M^2, C)
    kv = np.moveaxis(qkv[..., c:], -1, 1)                              # (B, 2C, H, W)
    cols = unfold_apply(kv, (mo, mo), padding=pad, stride=m)           # (B, 2C*Mo^2, nW)
    cols = cols.reshape(b, 2, c, mo * mo, -1).transpose(1, 0, 4, 3, 2)  # (2, B, nW, Mo^2, C)
    d = c // nh
    qh, kh, vh = split_heads(qw, nh), split_heads(cols[0], nh), split_heads(cols[1], nh)
    idx = oca_relative_position_index(m, mo)
    bias = p["relative_position_bias_table"][idx].transpose(2, 0, 1)   # (nh, M^2, Mo^2)
    o, core = attention_core_forward(qh, kh, vh, bias, scale=float(d ** -0.5) if scale is None else scale)
    ow = window_reverse_apply(merge_heads(o), m, (hh, ww))
    u = x + linear_apply(ow, p["proj.weight"], p["proj.bias"])
    h2, c2 = norm_forward(p, "norm2", u, eps=eps)
    mo_, cm = mlp_forward(p, h2, fc1="mlp.fc1", fc2="mlp.fc2", activation="gelu")
    y = u + mo_
    return y, {"p": p, "c1": c1, "h": h, "core": core, "ow": ow, "idx": idx, "c2": c2, "cm": cm,
               "geom": (m, mo, pad, nh, hh, ww, c), "shape": y.shape, "dt": dt}


def ocab_backward(dout, cache):
    """Gradient of :func:`ocab_forward`: ``x`` and every parameter (unfold's VJP is fold)."""
    p = cache["p"]
    m, mo, pad, nh, hh, ww, c = cache["geom"]
    g = as_dout(dout, cache["shape"], cache["dt"])
    b = g.shape[0]
    grads = {}
    du = g + norm_backward(grads, p, mlp_backward(grads, p, g, cache["cm"]), cache["c2"])
    lp = linear_vjp(du, cache["ow"], p["proj.weight"])
    grads["proj.weight"], grads["proj.bias"] = lp["weight"], lp["bias"]
    do = split_heads(window_partition_apply(lp["x"], m), nh)
    gc = attention_core_backward(do, cache["core"])
    dtable = np.zeros_like(p["relative_position_bias_table"])
    np.add.at(dtable, cache["idx"].reshape(-1), gc["bias"].transpose(1, 2, 0).reshape(-1, nh))
    grads["relative_position_bias_table"] = dtable
    dcols = np.stack([merge_heads(gc["k"]), merge_heads(gc["v"])])     # (2, B, nW, Mo^2, C)
    dcols = dcols.transpose(1, 0, 4, 3, 2).reshape(b, 2 * c * mo * mo, -1)
    dkv = fold_apply(dcols, (hh, ww), (mo, mo), padding=pad, stride=m)  # (B, 2C, H, W)
    dq = window_reverse_apply(merge_heads(gc["q"]), m, (hh, ww))
    dqkv = np.concatenate([dq, np.moveaxis(dkv, 1, -1)], axis=-1)
    lq = linear_vjp(dqkv, cache["h"], p["qkv.weight"])
    grads["qkv.weight"], grads["qkv.bias"] = lq["weight"], lq["bias"]
    dx = du + norm_backward(grads, p, lq["x"], cache["c1"])
    return {"x": dx, **{k: grads[k] for k in p}}


# --------------------------------------------------------------------------------------------
# The record's entry point: one of the two blocks


def hat_block_forward(x, params, *, block: str = "hab", num_heads: int, window_size: int = 16, shift_size: int = 0,
                      conv_scale: float = 0.01, overlap_ratio: float = 0.5, scale=None, eps: float = 1e-5):
    """Dispatch to :func:`hab_forward` (``block="hab"``) or :func:`ocab_forward` (``"ocab"``)."""
    check_choice(block, "block", HAT_BLOCKS)
    if block == "hab":
        y, cache = hab_forward(x, params, num_heads=num_heads, window_size=window_size, shift_size=shift_size,
                               conv_scale=conv_scale, scale=scale, eps=eps)
    else:
        y, cache = ocab_forward(x, params, num_heads=num_heads, window_size=window_size, overlap_ratio=overlap_ratio,
                                scale=scale, eps=eps)
    cache["block"] = block
    return y, cache


def hat_block_backward(dout, cache):
    """Gradient of :func:`hat_block_forward` (HAB or OCAB backward)."""
    return hab_backward(dout, cache) if cache["block"] == "hab" else ocab_backward(dout, cache)


def hat_block(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`hat_block_forward`."""
    return hat_block_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample_block(rng, size, block):
    if size == "tiny":      # one head and two channels keep the full FD Jacobian small; "small" has two heads
        b, h, w, c, nh, m = 2, 4, 4, 2, 1, 2
    else:
        b, h, w, c, nh, m = 2, 6, 6, 6, 2, 3
    while True:
        x = rng.standard_normal((b, h, w, c))
        if block == "hab":
            p = init_hat_params(rng, c, nh, m, block="hab", compress_ratio=c // 2 if size == "small" else 2,
                                squeeze_factor=c // 2 if size == "small" else 2, mlp_ratio=1.0)
            cfg = {"block": "hab", "num_heads": nh, "window_size": m, "shift_size": m // 2,
                   "conv_scale": float(rng.uniform(0.3, 1.0))}
            # the squeeze-excite ReLU away from its kink
            hh = norm_forward(p, "norm1", x)[0]
            z = _cab_forward(p, hh)[1][5]
            if np.abs(z).min() > 1e-3:
                break
        else:
            p = init_hat_params(rng, c, nh, m, block="ocab", mlp_ratio=1.0, overlap_ratio=1.0 if size == "tiny" else 2 / 3)
            cfg = {"block": "ocab", "num_heads": nh, "window_size": m,
                   "overlap_ratio": 1.0 if size == "tiny" else 2 / 3}
            break
    return Sample(inputs={"x": x}, params=p, config=cfg)


def _sample(rng, size):
    return _sample_block(rng, size, str(rng.choice(HAT_BLOCKS)))


def _oca_attention(p, x, m, mo, pad, nh):
    # OCA by explicit loops: for each query window and head, keys are read from the zero-padded
    # projected grid at the overlapping window's positions.
    b, hh, ww, c = x.shape
    d = c // nh
    h = norm_forward(p, "norm1", x)[0]
    qkv = h @ p["qkv.weight"] + p["qkv.bias"]
    kvp = np.zeros((b, hh + 2 * pad, ww + 2 * pad, 2 * c))
    kvp[:, pad:pad + hh, pad:pad + ww] = qkv[..., c:]
    idx = oca_relative_position_index(m, mo)
    out = np.zeros((b, hh, ww, c))
    for wi in range(hh // m):
        for wj in range(ww // m):
            q = qkv[:, wi * m:(wi + 1) * m, wj * m:(wj + 1) * m, :c].reshape(b, m * m, nh, d)
            kv = kvp[:, wi * m:wi * m + mo, wj * m:wj * m + mo].reshape(b, mo * mo, 2 * c)
            k, v = kv[..., :c].reshape(b, -1, nh, d), kv[..., c:].reshape(b, -1, nh, d)
            for hd in range(nh):
                s = d ** -0.5 * np.einsum("bid,bjd->bij", q[:, :, hd], k[:, :, hd])
                s = s + p["relative_position_bias_table"][idx, hd]
                e = np.exp(s - s.max(-1, keepdims=True))
                o = (e / e.sum(-1, keepdims=True)) @ v[:, :, hd]
                out[:, wi * m:(wi + 1) * m, wj * m:(wj + 1) * m, hd * d:(hd + 1) * d] = o.reshape(b, m, m, d)
    return out


def _reference(x, params, *, block="hab", num_heads, window_size=16, shift_size=0, conv_scale=0.01,
               overlap_ratio=0.5, scale=None, eps=1e-5):
    # HAB: the Swin layer (verified by its own record) plus an explicit CAB; OCAB: explicit OCA loops.
    p = params
    if block == "hab":
        from .swin import swin_window_attention
        h = norm_forward(p, "norm1", x, eps=eps)[0]
        a = swin_window_attention(h, _sub(p, "attn."), num_heads=num_heads, window_size=window_size,
                                  shift_size=shift_size, scale=scale)
        hc = np.moveaxis(h, -1, 1)
        a2 = conv_apply(gelu(conv_apply(hc, p[_CAB + "0.weight"], p[_CAB + "0.bias"], padding=1)),
                        p[_CAB + "2.weight"], p[_CAB + "2.bias"], padding=1)
        z = np.einsum("bc,oc->bo", a2.mean((2, 3)), p[_CAB + "3.attention.1.weight"][:, :, 0, 0])
        z = np.maximum(z + p[_CAB + "3.attention.1.bias"], 0.0)
        e = np.einsum("bc,oc->bo", z, p[_CAB + "3.attention.3.weight"][:, :, 0, 0]) + p[_CAB + "3.attention.3.bias"]
        u = x + a + conv_scale * np.moveaxis(a2 / (1.0 + np.exp(-e))[:, :, None, None], 1, -1)
    else:
        m, mo, pad = oca_window_sizes(window_size, overlap_ratio)
        u = x + _oca_attention(p, x, m, mo, pad, num_heads) @ p["proj.weight"] + p["proj.bias"]
    h2 = norm_forward(p, "norm2", u, eps=eps)[0]
    return u + gelu(h2 @ p["mlp.fc1.weight"] + p["mlp.fc1.bias"]) @ p["mlp.fc2.weight"] + p["mlp.fc2.bias"]


def _check_oca_gamma0_is_window_attention(rng):
    # overlap_ratio 0: the key windows are the query windows; with the table re-indexed from HAT's OCA
    # index to Swin's, OCAB's attention equals (non-shifted) Swin window attention.
    from .swin import swin_window_attention
    c, nh, m = 6, 2, 3
    p = init_hat_params(rng, c, nh, m, block="ocab", overlap_ratio=0.0)
    x = rng.standard_normal((2, 6, 9, c))
    y = ocab_forward(x, p, num_heads=nh, window_size=m, overlap_ratio=0.0)[0]
    table = np.zeros_like(p["relative_position_bias_table"])
    table[relative_position_index(m).reshape(-1)] = p["relative_position_bias_table"][
        oca_relative_position_index(m, m).reshape(-1)]
    h = norm_forward(p, "norm1", x)[0]
    sw = {"qkv.weight": p["qkv.weight"], "qkv.bias": p["qkv.bias"], "relative_position_bias_table": table,
          "proj.weight": p["proj.weight"], "proj.bias": p["proj.bias"]}
    u = x + swin_window_attention(h, sw, num_heads=nh, window_size=m)
    want = u + mlp_forward(p, norm_forward(p, "norm2", u)[0], fc1="mlp.fc1", fc2="mlp.fc2", activation="gelu")[0]
    err = float(np.abs(y - want).max())
    assert err < 1e-12, f"OCAB with overlap 0 differs from window attention by {err:.2e}"
    return err


def _check_unfold_fold_adjoint(rng):
    # <unfold(x), y> = <x, fold(y)> in OCAB's geometry (kernel M_o, stride M, padding (M_o - M)/2).
    m, mo, pad = oca_window_sizes(4, 0.5)
    x = rng.standard_normal((2, 3, 8, 12))
    cols = unfold_apply(x, (mo, mo), padding=pad, stride=m)
    yv = rng.standard_normal(cols.shape)
    err = abs(float(np.sum(cols * yv)) - float(np.sum(x * fold_apply(yv, (8, 12), (mo, mo), padding=pad, stride=m))))
    assert cols.shape[-1] == (8 // m) * (12 // m) and err < 1e-10, (cols.shape, err)
    return err


def _check_oca_index_matches_hat(rng):
    # calculate_rpi_oca transcribed (per-axis offset M - M_o + 1, base M + M_o - 1), wrapped like torch.
    for m, mo in ((2, 4), (4, 6), (3, 3)):
        base = m + mo - 1
        want = np.zeros((m * m, mo * mo), dtype=np.int64)
        for i in range(m * m):
            for j in range(mo * mo):
                dh = (j // mo) - (i // m) + m - mo + 1
                dw = (j % mo) - (i % m) + m - mo + 1
                want[i, j] = dh * base + dw
        got = oca_relative_position_index(m, mo)
        assert np.array_equal(got, want % (base * base)), (m, mo)
        assert want.min() >= -base * base, "an index torch could not wrap"
        # a bijection from relative offsets to rows: equal offsets share a row, different ones do not
        off = [((j // mo) - (i // m), (j % mo) - (i % m)) for i in range(m * m) for j in range(mo * mo)]
        pairs = set(zip(off, got.reshape(-1).tolist()))
        assert len(pairs) == len(set(off)) == len({r for _, r in pairs}), (m, mo)
    return 0.0


def _check_cab_gate(rng):
    # alpha = 0 removes the channel branch exactly (HAB = a Swin block); the CAB gate is in (0, 1).
    s = _sample_block(rng, "small", "hab")
    x = s.inputs["x"]
    cfg = {k: v for k, v in s.config.items() if k != "block"}
    y0 = hab_forward(x, s.params, **dict(cfg, conv_scale=0.0))[0]
    y1, c1 = hab_forward(x, s.params, **cfg)
    g = c1["ccab"][7]
    p = s.params
    h = norm_forward(p, "norm1", x)[0]
    from .swin import swin_window_attention
    u = x + swin_window_attention(h, _sub(p, "attn."), num_heads=cfg["num_heads"], window_size=cfg["window_size"],
                                  shift_size=cfg["shift_size"])
    want = u + mlp_forward(p, norm_forward(p, "norm2", u)[0], fc1="mlp.fc1", fc2="mlp.fc2", activation="gelu")[0]
    err = float(np.abs(y0 - want).max())
    assert err < 1e-12 and np.all((g > 0) & (g < 1)) and np.abs(y1 - y0).max() > 1e-6, err
    return err


register(
    Mechanism(
        slug="hat_hybrid_attention", family="1-softmax", tier="T2",
        title="Hybrid Attention Transformer: window SA + channel attention + overlapping cross-attention",
        paper="Chen, Wang, Zhou, Qiao, Dong, Activating More Pixels in Image Super-Resolution Transformer, CVPR 2023, "
              "arXiv 2205.04437; Chen et al., HAT: Hybrid Attention Transformer for Image Restoration, arXiv 2309.05239",
        forward=hat_block_forward, backward=hat_block_backward, sample=_sample, reference=_reference,
        docs="softmax/vision-attention.md#hat-hybrid-attention",
        checks={"oca_gamma0_is_window_attention": _check_oca_gamma0_is_window_attention,
                "unfold_fold_adjoint": _check_unfold_fold_adjoint,
                "oca_index_matches_hat": _check_oca_index_matches_hat,
                "cab_gate": _check_cab_gate},
    ),
)
