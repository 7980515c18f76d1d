r"""Multi-scale deformable attention (Deformable DETR; RT-DETRv2 per-level points and discrete
sampling; the DFA3D depth-weighted form), with gradients w.r.t. the sampling locations.

Papers: Zhu, Su, Lu, Li, Wang, Dai, "Deformable DETR: Deformable Transformers for End-to-End
Object Detection", ICLR 2021, arXiv 2010.04159; Lv, Zhao, Xu, Wei, Wang, Liu, "RT-DETRv2: Improved
Baseline with Bag-of-Freebies for Real-Time Detection Transformer", 2024, arXiv 2407.17140; Li,
Zhang, Zeng, Liu, Li, Zhang, "DFA3D: 3D Deformable Attention for 2D-to-3D Feature Lifting", ICCV
2023, arXiv 2307.12972. Upstream: fundamentalvision/Deformable-DETR
``models/ops/functions/ms_deform_attn_func.py`` (``ms_deform_attn_core_pytorch``) and
``models/ops/modules/ms_deform_attn.py`` (``MSDeformAttn``) @11169a60c33333af00a4849f1808023eba96a931;
lyuwenyu/RT-DETR ``rtdetrv2_pytorch/src/zoo/rtdetr/utils.py`` (``deformable_attention_core_func_v2``)
and ``rtdetrv2_decoder.py`` (``MSDeformableAttention``) @068dfde65f2667ad6555883c69d73de886518cad;
IDEA-Research/3D-deformable-attention ``DFA3D/dfa3D/ops/csrc/common/cuda/{wms_deform_attn,
ms_depth_score_sample}_cuda_kernel.cuh`` @cc38675493eb3343fa66be1924a1739b185464a2.

The core (``ms_deform_attn_core_*``)
-------------------------------------
Values ``value (B, S, M, D)`` of $L$ flattened feature maps ($S = \sum_l H_lW_l$, level $l$ rows
$s_l \dots s_l + H_lW_l - 1$ row-major), per head $m$; normalised sampling locations
$p\in[0,1]^2$ = (x, y) (``(B, Lq, M, L, P, 2)``, or ``(B, Lq, M, \sum_l P_l, 2)`` with per-level
point counts ``points_per_level``, RT-DETRv2) and weights $A$ (same without the last axis):

$$\mathrm{out}_{q,m} = \sum_l\sum_{k\le P_l} A_{qmlk}\;V^{(m)}_l\big(p_{qmlk}\big),$$

channels ordered $m D + d$. $V_l(p)$ is ``F.grid_sample`` of the level map at the grid
$g = 2p - 1$ (`refattn.nn.sampling.grid_sample_apply`): bilinear, ``padding_mode`` zeros and
``align_corners=False`` upstream (both keywords, PyTorch semantics; $u = pW - \tfrac12$ without
align_corners). RT-DETRv2's ``method="discrete"`` reads the pixel
$(\lfloor p_xW + \tfrac12\rfloor, \lfloor p_yH + \tfrac12\rfloor)$ clipped to $[0, H-1]$ on both
axes (``discrete_clamp="rtdetrv2"``, upstream's "FIX ME? for rectangle input"; ``"per_axis"``
clips x to $[0, W-1]$). Note that this is not ``grid_sample(mode="nearest")``: it rounds
$pW$, not $pW - \tfrac12$.

Backward. $\bar A_{qmlk} = \langle \bar o_{qm}, V_l(p)\rangle$; $\overline{V_l(p)} = A\,\bar o$
goes through the sampler VJP (`refattn.nn.sampling.grid_sample_vjp`): scattered to the four
corners with the bilinear weights ($\bar V$), and to the location: with $u = c_0 + f$,
$\partial V/\partial u = (1-f_y)(V_{x+1,y} - V_{x,y}) + f_y(V_{x+1,y+1} - V_{x,y+1})$ (the
difference of neighbouring features), times $du/dg = W/2$ (or $(W-1)/2$) and $dg/dp = 2$. Discrete
sampling is piecewise constant: zero location gradient (RT-DETRv2 freezes ``sampling_offsets``).
Kinks: bilinear sampling is not differentiable where $u$ is an integer (the corner set changes);
the samplers keep every coordinate off integer pixel coordinates.

The layer (``ms_deform_attn_*``, Deformable DETR ``MSDeformAttn`` / RT-DETRv2 ``MSDeformableAttention``)
--------------------------------------------------------------------------------------------------------
$V = \mathrm{value\_proj}(X)$ (zeroed at ``input_padding_mask``), split into $M$ heads;
$\Delta = \mathrm{sampling\_offsets}(z_q)$, $A = \mathrm{softmax}_{(l,k)}(\mathrm{attention\_weights}(z_q))$
per head, and with reference points $r$ (``(B, Lq, L, 2|4)``, or ``(B, Lq, 1, 2|4)`` shared by all
levels as in RT-DETR):

$$p = r_{xy} + \Delta/(W_l, H_l)\ \ (r\ \text{points}),\qquad
p = r_{xy} + \Delta\cdot\tfrac{1}{P_l}\cdot r_{wh}\cdot s\ \ (r\ \text{boxes},\ s = \texttt{offset\_scale} = 0.5),$$

then $Y = \mathrm{output\_proj}(\mathrm{core})$. Parameters under the upstream names
(``sampling_offsets``, ``attention_weights``, ``value_proj``, ``output_proj``; ``.weight (in, out)``
= torch ``weight.T``, ``.bias``); the offset columns are ordered (head, level, point, xy) as
``view(N, Lq, M, L, P, 2)``. Backward: $\bar\Delta = \bar p/(W,H)$ or $\bar p\,r_{wh}s/P_l$,
$\bar r_{xy} = \sum_{m,k}\bar p$, $\bar r_{wh} = \sum_{m,k}\bar p\,\Delta s/P_l$, the softmax VJP
for the weights' logits, and the linear VJPs (the query gets both branches).

DFA3D (``dfa3d_core_*``)
-------------------------
Depth distributions ``depth (B, S, M, Z)`` per pixel expand the 2-D features to
$\tilde F(u, v, d) = F(u, v)\,D(u, v, d)$; a 3-D location $(x, y, z)\in[0,1]^3$ samples $\tilde F$
trilinearly (``align_corners=False``, zeros). The memory-efficient form never builds $\tilde F$:

$$\tilde F(p) = \sum_{(u,v)\in\text{4 corners}} w_{uv}\,F(u,v)\,\big[(1-f_d)D(u,v,d_0) + f_dD(u,v,d_0+1)\big],$$

(per-corner "depth scores", upstream ``ms_depth_score_sample``, then ``wms_deform_attn``); the
registry check compares it with 3-D ``grid_sample`` of the materialised $\tilde F$. Its backward
differentiates the same sum: $\bar F$, $\bar D$ (both lerp weights), and the location through
$\partial w_{uv}/\partial(u, v)$ and $\partial/\partial d$ of the lerp ($D_{d_0+1} - D_{d_0}$).

Measured agreement with upstream (float64, CPU, torch 2.13; scratch scripts, not committed): output
and every gradient within 1.3e-15 abs of ``MSDeformAttn`` (its CUDA function replaced by the
repository's ``ms_deform_attn_core_pytorch``; point and box references) and 3.7e-15 abs (gradients of
reference points; relative <= 1e-15) of RT-DETRv2's ``MSDeformableAttention`` (default and discrete);
DFA3D (CUDA-only upstream) within 2.2e-16 of torch's trilinear ``F.grid_sample`` of the materialised
$\tilde F$. Table: ``docs/linear/local-and-deformable.md``.
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_choice, check_int, check_params, check_positive, compute_dtype
from ...nn.linear import linear_prefixed, linear_prefixed_spec, linear_prefixed_vjp
from ...nn.sampling import PADDING_MODES, grid_sample_apply, grid_sample_vjp
from ...nn.softmax import softmax_lse, softmax_vjp
from ...registry import Mechanism, Sample, register

__all__ = ["MSDA_METHODS", "DISCRETE_CLAMPS", "msda_point_levels", "ms_deform_attn_core_forward",
           "ms_deform_attn_core_backward", "ms_deform_attn_forward", "ms_deform_attn_backward", "ms_deform_attn",
           "dfa3d_core_forward", "dfa3d_core_backward"]

MSDA_METHODS = ("default", "discrete")
DISCRETE_CLAMPS = ("rtdetrv2", "per_axis")
_NAMES = ("sampling_offsets", "attention_weights", "value_proj", "output_proj")


def msda_point_levels(points_per_level) -> np.ndarray:
    """The level of each flattened sampling point, ``repeat(arange(L), P_l)``."""
    return np.repeat(np.arange(len(points_per_level)), points_per_level)


def _check_shapes(spatial_shapes, name="spatial_shapes"):
    if not isinstance(spatial_shapes, (tuple, list)) or not spatial_shapes or any(
            not isinstance(s, (tuple, list)) or len(s) != 2 or any(
                isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or v < 1 for v in s)
            for s in spatial_shapes):
        raise ValueError(f"{name} must be a non-empty sequence of (H, W) pairs of positive ints; got {spatial_shapes!r}")
    return tuple((int(h), int(w)) for h, w in spatial_shapes)


def _check_points(points, n_levels, name):
    if isinstance(points, (int, np.integer)) and not isinstance(points, (bool, np.bool_)):
        return (check_int(points, name, minimum=1),) * n_levels
    if not isinstance(points, (tuple, list)) or len(points) != n_levels:
        raise ValueError(f"{name} must be an int or one int per level ({n_levels}); got {points!r}")
    return tuple(check_int(p, name, minimum=1) for p in points)


def _sampling_config(method, align_corners, padding_mode, discrete_clamp):
    check_choice(method, "method", MSDA_METHODS)
    check_choice(padding_mode, "padding_mode", PADDING_MODES)
    check_choice(discrete_clamp, "discrete_clamp", DISCRETE_CLAMPS)
    if not isinstance(align_corners, (bool, np.bool_)):
        raise TypeError(f"align_corners must be a bool; got {type(align_corners).__name__}")
    return {"method": method, "align_corners": bool(align_corners), "padding_mode": padding_mode,
            "discrete_clamp": discrete_clamp}


# --------------------------------------------------------------------------------------------
# The core (unvalidated helpers and the validated pair)


def _level_views(value, loc, attn, shapes, points):
    """Per level: ``v (B*M, D, H, W)``, ``g (B*M, Lq, P_l, 2)`` locations, ``a (B*M, 1, Lq, P_l)``."""
    b, _, m, d = value.shape
    lq = loc.shape[1]
    start, p0 = 0, 0
    for (h, w), pl in zip(shapes, points):
        v = value[:, start:start + h * w].transpose(0, 2, 3, 1).reshape(b * m, d, h, w)
        g = loc[:, :, :, p0:p0 + pl].transpose(0, 2, 1, 3, 4).reshape(b * m, lq, pl, 2)
        a = attn[:, :, :, p0:p0 + pl].transpose(0, 2, 1, 3).reshape(b * m, 1, lq, pl)
        yield v, g, a, (start, p0, h, w, pl)
        start, p0 = start + h * w, p0 + pl


def _discrete_index(g, h, w, clamp):
    """RT-DETRv2's discrete sampling: flat pixel index ``(B*M, Lq*P_l)``."""
    ix = np.floor(g[..., 0] * w + 0.5).astype(np.int64)
    iy = np.floor(g[..., 1] * h + 0.5).astype(np.int64)
    ix = np.clip(ix, 0, (h if clamp == "rtdetrv2" else w) - 1)
    iy = np.clip(iy, 0, h - 1)
    if np.any(ix >= w):
        raise ValueError(f"sampling_locations: discrete_clamp='rtdetrv2' clips x to H-1 = {h - 1} on a level of "
                         f"width {w} and would index past the row (upstream indexes out of range); use "
                         f"discrete_clamp='per_axis'")
    return (iy * w + ix).reshape(g.shape[0], -1)


def ms_deform_attn_core_apply(value, loc, attn, shapes, points, cfg):
    """Unvalidated core on flattened points: ``value (B, S, M, D)``, ``loc (B, Lq, M, P, 2)``,
    ``attn (B, Lq, M, P)``. Returns ``(out (B, Lq, M*D), samples)``."""
    b, _, m, d = value.shape
    lq = loc.shape[1]
    out = np.zeros((b * m, d, lq), dtype=value.dtype)
    samples = []
    for v, g, a, (_, _, h, w, pl) in _level_views(value, loc, attn, shapes, points):
        if cfg["method"] == "default":
            s = grid_sample_apply(v, 2.0 * g - 1.0, "bilinear", cfg["padding_mode"], cfg["align_corners"])
        else:
            flat = _discrete_index(g, h, w, cfg["discrete_clamp"])
            s = np.take_along_axis(v.reshape(b * m, d, h * w), flat[:, None, :], axis=2).reshape(b * m, d, lq, pl)
        samples.append(s)
        out += np.sum(s * a, axis=-1)
    return out.reshape(b, m * d, lq).transpose(0, 2, 1), samples


def ms_deform_attn_core_vjp(g_out, value, loc, attn, samples, shapes, points, cfg):
    """Unvalidated gradients ``(dvalue, dloc, dattn)`` of `ms_deform_attn_core_apply`."""
    b, _, m, d = value.shape
    lq = loc.shape[1]
    go = g_out.transpose(0, 2, 1).reshape(b * m, d, lq)[..., None]
    dvalue, dloc, dattn = np.zeros_like(value), np.zeros_like(loc), np.zeros_like(attn)
    for (v, g, a, (start, p0, h, w, pl)), s in zip(_level_views(value, loc, attn, shapes, points), samples):
        da = np.sum(go * s, axis=1)                                          # (B*M, Lq, P_l)
        dattn[:, :, :, p0:p0 + pl] = da.reshape(b, m, lq, pl).transpose(0, 2, 1, 3)
        ds = go * a
        if cfg["method"] == "default":
            r = grid_sample_vjp(ds, v, 2.0 * g - 1.0, "bilinear", cfg["padding_mode"], cfg["align_corners"])
            dv = r["x"].reshape(b * m, d, h * w)
            dloc[:, :, :, p0:p0 + pl] = 2.0 * r["grid"].reshape(b, m, lq, pl, 2).transpose(0, 2, 1, 3, 4)
        else:
            flat = _discrete_index(g, h, w, cfg["discrete_clamp"])
            dv = np.zeros((b * m, h * w, d), dtype=value.dtype)
            np.add.at(dv, (np.arange(b * m)[:, None], flat), ds.reshape(b * m, d, -1).transpose(0, 2, 1))
            dv = dv.transpose(0, 2, 1)
        dvalue[:, start:start + h * w] = dv.reshape(b, m, d, h * w).transpose(0, 3, 1, 2)
    return dvalue, dloc, dattn


def _validate_core(value, sampling_locations, attention_weights, spatial_shapes, points_per_level, coord=2):
    value = as_float(value, "value", ndim=4)
    shapes = _check_shapes(spatial_shapes)
    b, s, m, _ = value.shape
    if s != sum(h * w for h, w in shapes):
        raise ValueError(f"value axis 1 must be sum(H*W) = {sum(h * w for h, w in shapes)} for spatial_shapes "
                         f"{shapes}; got {value.shape}")
    loc = as_float(sampling_locations, "sampling_locations", min_ndim=5, max_ndim=6)
    attn = as_float(attention_weights, "attention_weights", min_ndim=4, max_ndim=5)
    nl = len(shapes)
    if points_per_level is None:
        if loc.ndim != 6 or loc.shape[0] != b or loc.shape[2:4] != (m, nl) or loc.shape[-1] != coord:
            raise ValueError(f"sampling_locations must be (B, Lq, M, L, P, {coord}) = ({b}, Lq, {m}, {nl}, P, "
                             f"{coord}); got {loc.shape}")
        points = (loc.shape[4],) * nl
    else:
        points = _check_points(points_per_level, nl, "points_per_level")
        if loc.ndim != 5 or loc.shape[0] != b or loc.shape[2:] != (m, sum(points), coord):
            raise ValueError(f"sampling_locations must be (B, Lq, M, sum(P_l), {coord}) = ({b}, Lq, {m}, "
                             f"{sum(points)}, {coord}); got {loc.shape}")
    if attn.shape != loc.shape[:-1]:
        raise ValueError(f"attention_weights must have shape {loc.shape[:-1]} (sampling_locations without its "
                         f"last axis); got {attn.shape}")
    dt = compute_dtype(value, loc, attn)
    flat = (b, loc.shape[1], m, sum(points))
    return (value.astype(dt, copy=False), loc.astype(dt, copy=False).reshape(flat + (coord,)),
            attn.astype(dt, copy=False).reshape(flat), shapes, points, loc.shape)


def ms_deform_attn_core_forward(value, sampling_locations, attention_weights, *, spatial_shapes,
                                points_per_level=None, method: str = "default", align_corners: bool = False,
                                padding_mode: str = "zeros", discrete_clamp: str = "rtdetrv2"):
    r"""The multi-scale deformable attention core (``ms_deform_attn_core_pytorch``; module docstring).

    Parameters
    ----------
    value : (B, S, M, D)
    sampling_locations : (B, Lq, M, L, P, 2), or (B, Lq, M, sum(P_l), 2) with ``points_per_level``
        Normalised (x, y) in [0, 1] (0: left/top edge, 1: right/bottom edge).
    attention_weights : sampling_locations' shape without the last axis
    spatial_shapes : sequence of (H_l, W_l)
    points_per_level : tuple of ints, optional
        RT-DETRv2's ``num_points_list`` (flattened point axis).
    method : {"default", "discrete"}
    align_corners, padding_mode
        ``F.grid_sample`` conventions of the bilinear sampler (upstream: False, "zeros").
    discrete_clamp : {"rtdetrv2", "per_axis"}

    Returns
    -------
    out (B, Lq, M*D), cache
    """
    cfg = _sampling_config(method, align_corners, padding_mode, discrete_clamp)
    value, loc, attn, shapes, points, loc_shape = _validate_core(value, sampling_locations, attention_weights,
                                                                 spatial_shapes, points_per_level)
    out, samples = ms_deform_attn_core_apply(value, loc, attn, shapes, points, cfg)
    return out, {"value": value, "loc": loc, "attn": attn, "samples": samples, "shapes": shapes, "points": points,
                 "cfg": cfg, "loc_shape": loc_shape, "out_shape": out.shape}


def ms_deform_attn_core_backward(dout, cache):
    """Gradients ``{"value", "sampling_locations", "attention_weights"}`` of `ms_deform_attn_core_forward`."""
    g = as_dout(dout, cache["out_shape"], cache["value"].dtype)
    dv, dl, da = ms_deform_attn_core_vjp(g, cache["value"], cache["loc"], cache["attn"], cache["samples"],
                                         cache["shapes"], cache["points"], cache["cfg"])
    ls = cache["loc_shape"]
    return {"value": dv, "sampling_locations": dl.reshape(ls), "attention_weights": da.reshape(ls[:-1])}


# --------------------------------------------------------------------------------------------
# The layer


def _layer_spec(c, m, points):
    p = sum(points)
    spec = {}
    for name, width in zip(_NAMES, (m * p * 2, m * p, c, c)):
        spec.update(linear_prefixed_spec(name, c, width))
    return spec


def ms_deform_attn_forward(query, reference_points, input_flatten, params, *, spatial_shapes, n_heads: int,
                           n_points=4, input_padding_mask=None, offset_scale: float = 0.5, method: str = "default",
                           align_corners: bool = False, padding_mode: str = "zeros",
                           discrete_clamp: str = "rtdetrv2"):
    r"""Deformable DETR's ``MSDeformAttn`` (RT-DETRv2 ``MSDeformableAttention`` with ``n_points`` a list).

    Parameters
    ----------
    query : (B, Lq, C)
    reference_points : (B, Lq, L, 2) points or (B, Lq, L, 4) boxes (cx, cy, w, h) in [0, 1];
        a level axis of 1 is shared by all levels (RT-DETR)
    input_flatten : (B, S, C), the L maps flattened, S = sum(H_l W_l)
    params : dict
        ``sampling_offsets``, ``attention_weights``, ``value_proj``, ``output_proj`` ``.weight (in, out)``
        / ``.bias`` (biases optional).
    spatial_shapes : sequence of (H_l, W_l)
    n_heads : int
    n_points : int or one int per level
    input_padding_mask : bool (B, S), optional
        True marks padding (its values are zeroed).
    offset_scale : float
        Box references: $p = r_{xy} + \Delta r_{wh}s/P_l$ (0.5 upstream).
    method, align_corners, padding_mode, discrete_clamp
        As `ms_deform_attn_core_forward`.

    Returns
    -------
    out (B, Lq, C), cache
    """
    cfg = _sampling_config(method, align_corners, padding_mode, discrete_clamp)
    shapes = _check_shapes(spatial_shapes)
    nl = len(shapes)
    points = _check_points(n_points, nl, "n_points")
    m = check_int(n_heads, "n_heads", minimum=1)
    offset_scale = check_positive(offset_scale, "offset_scale")
    query = as_float(query, "query", ndim=3)
    ref = as_float(reference_points, "reference_points", ndim=4)
    x = as_float(input_flatten, "input_flatten", ndim=3)
    b, lq, c = query.shape
    if c % m:
        raise ValueError(f"query's width C={c} must be divisible by n_heads={m}")
    if ref.shape[:2] != (b, lq) or ref.shape[2] not in (1, nl) or ref.shape[3] not in (2, 4):
        raise ValueError(f"reference_points must be (B, Lq, L or 1, 2 or 4) = ({b}, {lq}, {nl}, 2|4); got {ref.shape}")
    if x.shape != (b, sum(h * w for h, w in shapes), c):
        raise ValueError(f"input_flatten must be (B, sum(H*W), C) = {(b, sum(h * w for h, w in shapes), c)}; "
                         f"got {x.shape}")
    mask = None
    if input_padding_mask is not None:
        mask = np.asarray(input_padding_mask)
        if mask.dtype != np.bool_ or mask.shape != x.shape[:2]:
            raise ValueError(f"input_padding_mask must be a bool array of shape {x.shape[:2]}; got "
                             f"{mask.dtype} {mask.shape}")
    p = check_params(params, _layer_spec(c, m, points), optional=[f"{n}.bias" for n in _NAMES],
                     where="ms_deform_attn")
    dt = compute_dtype(query, ref, x, *p.values())
    query, ref, x, p = query.astype(dt, copy=False), ref.astype(dt, copy=False), x.astype(dt, copy=False), cast_all(dt, p)
    lev = msda_point_levels(points)
    npts = lev.size
    value = linear_prefixed(p, "value_proj", x)
    if mask is not None:
        value = np.where(mask[..., None], 0.0, value)
    value = value.reshape(b, -1, m, c // m)
    off = linear_prefixed(p, "sampling_offsets", query).reshape(b, lq, m, npts, 2)
    attn, _ = softmax_lse(linear_prefixed(p, "attention_weights", query).reshape(b, lq, m, npts), axis=-1)
    refp = ref[:, :, lev if ref.shape[2] == nl else np.zeros_like(lev)][:, :, None]       # (B, Lq, 1, P, 2|4)
    if ref.shape[3] == 2:
        scale = 1.0 / np.array([(w, h) for h, w in shapes], dtype=dt)[lev]                 # (P, 2)
    else:
        scale = (offset_scale / np.array(points, dtype=dt)[lev])[:, None] * refp[..., 2:]  # (B, Lq, 1, P, 2)
    loc = refp[..., :2] + off * scale
    out_core, samples = ms_deform_attn_core_apply(value, loc, attn, shapes, points, cfg)
    out = linear_prefixed(p, "output_proj", out_core)
    cache = {"query": query, "ref": ref, "x": x, "p": p, "mask": mask, "value": value, "off": off, "attn": attn,
             "scale": scale, "loc": loc, "core": out_core, "samples": samples, "shapes": shapes, "points": points,
             "lev": lev, "cfg": cfg, "offset_scale": offset_scale, "out_shape": out.shape}
    return out, cache


def ms_deform_attn_backward(dout, cache):
    """Gradients of `ms_deform_attn_forward`: ``query``, ``reference_points``, ``input_flatten`` and
    every params key (module docstring)."""
    p, ref, lev = cache["p"], cache["ref"], cache["lev"]
    g = as_dout(dout, cache["out_shape"], cache["value"].dtype)
    grads = {}
    g_core = linear_prefixed_vjp(grads, p, "output_proj", g, cache["core"])
    dvalue, dloc, dattn = ms_deform_attn_core_vjp(g_core, cache["value"], cache["loc"], cache["attn"],
                                                  cache["samples"], cache["shapes"], cache["points"], cache["cfg"])
    b, lq, m, npts = cache["attn"].shape
    dref_p = np.zeros((b, lq, npts, ref.shape[3]), dtype=ref.dtype)
    dref_p[..., :2] = dloc.sum(axis=2)
    if ref.shape[3] == 4:
        dref_p[..., 2:] = np.sum(dloc * cache["off"] * (cache["offset_scale"] / np.array(cache["points"],
                                 dtype=ref.dtype)[lev])[:, None], axis=2)
    dref = np.zeros_like(ref)
    if ref.shape[2] == len(cache["shapes"]):
        np.add.at(dref, (slice(None), slice(None), lev), dref_p)
    else:
        dref[:, :, 0] = dref_p.sum(axis=2)
    doff = dloc * cache["scale"]
    dlogits = softmax_vjp(cache["attn"], dattn)
    query, x = cache["query"], cache["x"]
    dq = linear_prefixed_vjp(grads, p, "sampling_offsets", doff.reshape(b, lq, -1), query)
    dq = dq + linear_prefixed_vjp(grads, p, "attention_weights", dlogits.reshape(b, lq, -1), query)
    dval = dvalue.reshape(b, -1, dvalue.shape[2] * dvalue.shape[3])
    if cache["mask"] is not None:
        dval = np.where(cache["mask"][..., None], 0.0, dval)
    dx = linear_prefixed_vjp(grads, p, "value_proj", dval, x)
    return {"query": dq, "reference_points": dref, "input_flatten": dx, **grads}


def ms_deform_attn(query, reference_points, input_flatten, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of `ms_deform_attn_forward`."""
    return ms_deform_attn_forward(query, reference_points, input_flatten, params, **config)[0]


# --------------------------------------------------------------------------------------------
# DFA3D: depth-weighted bilinear sampling (the memory-efficient trilinear form)


def _dfa3d_level(v, dep, xyz, h, w):
    """Per-corner pieces for ``v (BM, HW, D)``, ``dep (BM, HW, Z)``, ``xyz (BM, Q, 3)``: yields
    ``(flat, valid, w_hw, sgn, d_low, fd, depth scores)`` for the four (u, v) corners."""
    z = dep.shape[-1]
    px, py, pz = xyz[..., 0] * w - 0.5, xyz[..., 1] * h - 0.5, xyz[..., 2] * z - 0.5
    x0, y0, d0 = np.floor(px), np.floor(py), np.floor(pz)
    fx, fy, fd = px - x0, py - y0, pz - d0
    x0, y0, d0 = x0.astype(np.int64), y0.astype(np.int64), d0.astype(np.int64)
    rows = np.arange(v.shape[0])[:, None]
    dvalid = [(d0 + e >= 0) & (d0 + e < z) for e in (0, 1)]
    for ey in (0, 1):
        for ex in (0, 1):
            iy, ix = y0 + ey, x0 + ex
            valid = (iy >= 0) & (iy < h) & (ix >= 0) & (ix < w)
            flat = np.clip(iy, 0, h - 1) * w + np.clip(ix, 0, w - 1)
            wy, wx = (fy if ey else 1 - fy), (fx if ex else 1 - fx)
            dl = [np.where(dvalid[e], dep[rows, flat, np.clip(d0 + e, 0, z - 1)], 0.0) for e in (0, 1)]
            score = (1 - fd) * dl[0] + fd * dl[1]
            yield flat, valid, (wy, wx), (2 * ey - 1, 2 * ex - 1), d0, dvalid, fd, dl, score


def dfa3d_core_forward(value, depth, sampling_locations, attention_weights, *, spatial_shapes):
    r"""DFA3D's depth-weighted multi-scale deformable attention (memory-efficient form; module docstring).

    ``value (B, S, M, D)``, ``depth (B, S, M, Z)``, ``sampling_locations (B, Lq, M, L, P, 3)`` = (x, y, z)
    in [0, 1] (``align_corners=False``, zeros outside), ``attention_weights (B, Lq, M, L, P)``.
    Returns ``out (B, Lq, M*D)`` and the cache."""
    value, loc, attn, shapes, points, loc_shape = _validate_core(value, sampling_locations, attention_weights,
                                                                 spatial_shapes, None, coord=3)
    depth = as_float(depth, "depth", ndim=4)
    if depth.shape[:3] != value.shape[:3]:
        raise ValueError(f"depth must be (B, S, M, Z) with value's first axes {value.shape[:3]}; got {depth.shape}")
    dt = compute_dtype(value, depth)
    value, depth, loc, attn = (a.astype(dt, copy=False) for a in (value, depth, loc, attn))
    b, _, m, d = value.shape
    lq = loc.shape[1]
    out = np.zeros((b * m, lq, d), dtype=dt)
    start, p0 = 0, 0
    for (h, w), pl in zip(shapes, points):
        v = value[:, start:start + h * w].transpose(0, 2, 1, 3).reshape(b * m, h * w, d)
        dep = depth[:, start:start + h * w].transpose(0, 2, 1, 3).reshape(b * m, h * w, -1)
        xyz = loc[:, :, :, p0:p0 + pl].transpose(0, 2, 1, 3, 4).reshape(b * m, lq * pl, 3)
        a = attn[:, :, :, p0:p0 + pl].transpose(0, 2, 1, 3).reshape(b * m, lq, pl)
        for flat, valid, (wy, wx), _, _, _, _, _, score in _dfa3d_level(v, dep, xyz, h, w):
            coef = (valid * wy * wx * score).reshape(b * m, lq, pl) * a
            out += np.einsum("bqp,bqpd->bqd", coef, np.take_along_axis(v, flat[..., None], 1).reshape(b * m, lq, pl, d))
        start, p0 = start + h * w, p0 + pl
    out = out.reshape(b, m, lq, d).transpose(0, 2, 1, 3).reshape(b, lq, m * d)
    return out, {"value": value, "depth": depth, "loc": loc, "attn": attn, "shapes": shapes, "points": points,
                 "loc_shape": loc_shape, "out_shape": out.shape}


def dfa3d_core_backward(dout, cache):
    """Gradients ``{"value", "depth", "sampling_locations", "attention_weights"}`` of `dfa3d_core_forward`."""
    value, depth, loc, attn = cache["value"], cache["depth"], cache["loc"], cache["attn"]
    b, _, m, d = value.shape
    lq = loc.shape[1]
    z = depth.shape[-1]
    g = as_dout(dout, cache["out_shape"], value.dtype).reshape(b, lq, m, d).transpose(0, 2, 1, 3).reshape(b * m, lq, d)
    dvalue, ddepth, dloc, dattn = (np.zeros_like(a) for a in (value, depth, loc, attn))
    rows = np.arange(b * m)[:, None]
    start, p0 = 0, 0
    for (h, w), pl in zip(cache["shapes"], cache["points"]):
        v = value[:, start:start + h * w].transpose(0, 2, 1, 3).reshape(b * m, h * w, d)
        dep = depth[:, start:start + h * w].transpose(0, 2, 1, 3).reshape(b * m, h * w, z)
        xyz = loc[:, :, :, p0:p0 + pl].transpose(0, 2, 1, 3, 4).reshape(b * m, lq * pl, 3)
        a = attn[:, :, :, p0:p0 + pl].transpose(0, 2, 1, 3).reshape(b * m, lq * pl)
        gq = np.repeat(g, pl, axis=1)                                           # (BM, Q, D) per point
        dv, ddep = np.zeros_like(v), np.zeros_like(dep)
        da, dxyz = np.zeros_like(a), np.zeros_like(xyz)
        for flat, valid, (wy, wx), (sy, sx), d0, dvalid, fd, dl, score in _dfa3d_level(v, dep, xyz, h, w):
            gv = np.sum(gq * np.take_along_axis(v, flat[..., None], 1), axis=-1) * valid   # <g, F(u, v)>
            da += wy * wx * score * gv
            np.add.at(dv, (rows, flat), (a * valid * wy * wx * score)[..., None] * gq)
            gs = a * gv * wy * wx                                               # gradient of the depth score
            for e, lw in ((0, 1 - fd), (1, fd)):
                np.add.at(ddep, (rows, flat, np.clip(d0 + e, 0, z - 1)), gs * lw * dvalid[e])
            dxyz[..., 0] += a * gv * wy * sx * score * w
            dxyz[..., 1] += a * gv * wx * sy * score * h
            dxyz[..., 2] += gs * (dl[1] - dl[0]) * z
        dvalue[:, start:start + h * w] = dv.reshape(b, m, h * w, d).transpose(0, 2, 1, 3)
        ddepth[:, start:start + h * w] = ddep.reshape(b, m, h * w, z).transpose(0, 2, 1, 3)
        dloc[:, :, :, p0:p0 + pl] = dxyz.reshape(b, m, lq, pl, 3).transpose(0, 2, 1, 3, 4)
        dattn[:, :, :, p0:p0 + pl] = da.reshape(b, m, lq, pl).transpose(0, 2, 1, 3)
        start, p0 = start + h * w, p0 + pl
    ls = cache["loc_shape"]
    return {"value": dvalue, "depth": ddepth, "sampling_locations": dloc.reshape(ls),
            "attention_weights": dattn.reshape(ls[:-1])}


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _pixel_margin(loc, shapes, points, align_corners):
    """Smallest distance of a sampling coordinate from an integer pixel coordinate (the kinks of
    bilinear sampling and the jumps of discrete sampling)."""
    lev = msda_point_levels(points)
    size = np.array([(w, h) for h, w in shapes], dtype=np.float64)[lev]          # (P, 2) = (W, H)
    u = loc * (size - 1) if align_corners else loc * size - 0.5
    dist = np.abs(u - np.round(u))
    if align_corners:   # an axis of size 1 maps every location to u = 0: u does not move, no kink
        dist = np.where(size == 1, np.inf, dist)
    return float(np.min(dist))


def _draw(rng, size, method=None, ref_dim=None, shared_ref=None):
    b = 2
    if size == "tiny":
        shapes, c, m, lq = ((2, 3), (1, 2)), 4, 2, 2
    else:
        shapes, c, m, lq = ((4, 5), (3, 2), (2, 2)), 6, 2, int(rng.integers(3, 6))
    nl = len(shapes)
    points = int(rng.integers(1, 3)) if rng.random() < 0.5 else tuple(int(v) for v in rng.integers(1, 3, nl))
    method = method or ("discrete" if rng.random() < 0.25 else "default")
    ref_dim = ref_dim or (2 if rng.random() < 0.5 else 4)
    shared_ref = bool(rng.random() < 0.3) if shared_ref is None else shared_ref
    npts = sum(points) if isinstance(points, tuple) else points * nl
    cfg = {"spatial_shapes": shapes, "n_heads": m, "n_points": points, "method": method,
           "align_corners": bool(rng.random() < 0.4), "discrete_clamp": "per_axis"}
    s = sum(h * w for h, w in shapes)

    def draw(r):
        ref = r.uniform(0.25, 0.75, (b, lq, 1 if shared_ref else nl, ref_dim))
        if ref_dim == 4:
            ref[..., 2:] = r.uniform(0.3, 0.8, ref[..., 2:].shape)
        params = {}
        for name, width in zip(_NAMES, (m * npts * 2, m * npts, c, c)):
            params[f"{name}.weight"] = r.standard_normal((c, width)) / np.sqrt(c)
            params[f"{name}.bias"] = 0.3 * r.standard_normal(width)
        inputs = {"query": r.standard_normal((b, lq, c)), "reference_points": ref,
                  "input_flatten": r.standard_normal((b, s, c))}
        return Sample(inputs=inputs, params=params, config=cfg)

    def margin(smp):
        _, cache = ms_deform_attn_forward(**smp.inputs, params=smp.params, **smp.config)
        return _pixel_margin(cache["loc"], cache["shapes"], cache["points"], cfg["align_corners"])

    for _ in range(500):
        smp = draw(rng)
        if margin(smp) >= 0.004:
            return smp
    raise RuntimeError("no sample with sampling locations away from integer pixel coordinates")


def _sample(rng, size):
    return _draw(rng, size)


def _bilinear_scalar(img, x, y, align_corners):
    """One bilinear read of ``img (H, W, D)`` at normalised (x, y), zeros outside (scalar loops)."""
    h, w = img.shape[:2]
    u = x * (w - 1) if align_corners else x * w - 0.5
    v = y * (h - 1) if align_corners else y * h - 0.5
    out = np.zeros(img.shape[-1])
    for iy in (int(np.floor(v)), int(np.floor(v)) + 1):
        for ix in (int(np.floor(u)), int(np.floor(u)) + 1):
            if 0 <= iy < h and 0 <= ix < w:
                out += (1 - abs(v - iy)) * (1 - abs(u - ix)) * img[iy, ix]
    return out


def _reference(query, reference_points, input_flatten, params, *, spatial_shapes, n_heads, n_points=4,
               input_padding_mask=None, offset_scale=0.5, method="default", align_corners=False,
               padding_mode="zeros", discrete_clamp="rtdetrv2"):
    # Every (batch, query, head, point) on its own: projections, softmax over the head's points,
    # the location from its reference, and a scalar read (bilinear or rounded) of its level.
    nl = len(spatial_shapes)
    points = (n_points,) * nl if isinstance(n_points, int) else tuple(n_points)
    b, lq, c = query.shape
    m, dh = n_heads, c // n_heads
    val = input_flatten @ params["value_proj.weight"] + params["value_proj.bias"]
    if input_padding_mask is not None:
        val = np.where(input_padding_mask[..., None], 0.0, val)
    starts = np.cumsum([0] + [h * w for h, w in spatial_shapes])
    out = np.zeros((b, lq, c))
    for bi in range(b):
        for qi in range(lq):
            off = query[bi, qi] @ params["sampling_offsets.weight"] + params["sampling_offsets.bias"]
            logit = query[bi, qi] @ params["attention_weights.weight"] + params["attention_weights.bias"]
            k = 0
            for mi in range(m):
                wts = np.exp(logit[mi * sum(points):(mi + 1) * sum(points)])
                wts = wts / wts.sum()
                j = 0
                for li, ((h, w), pl) in enumerate(zip(spatial_shapes, points)):
                    r = reference_points[bi, qi, li if reference_points.shape[2] == nl else 0]
                    img = val[bi, starts[li]:starts[li + 1], mi * dh:(mi + 1) * dh].reshape(h, w, dh)
                    for _ in range(pl):
                        o = off[2 * k:2 * k + 2]
                        loc = r[:2] + (o / np.array([w, h]) if r.size == 2 else o / pl * r[2:] * offset_scale)
                        if method == "default":
                            sv = _bilinear_scalar(img, loc[0], loc[1], align_corners)
                        else:
                            ix = min(max(int(np.floor(loc[0] * w + 0.5)), 0), (w if discrete_clamp == "per_axis" else h) - 1)
                            iy = min(max(int(np.floor(loc[1] * h + 0.5)), 0), h - 1)
                            sv = img[iy, ix]
                        out[bi, qi, mi * dh:(mi + 1) * dh] += wts[j] * sv
                        j, k = j + 1, k + 1
    return out @ params["output_proj.weight"] + params["output_proj.bias"]


def _core_sample(rng, points=(1, 2), shapes=((3, 4), (2, 3)), lq=3, padding_mode="zeros", align=False, m=2, d=2):
    b = 2
    s = sum(h * w for h, w in shapes)
    for _ in range(1000):
        loc = rng.uniform(-0.15, 1.15, (b, lq, m, sum(points), 2))
        if _pixel_margin(loc, shapes, points, align) > 0.01:
            break
    else:
        raise RuntimeError("no core sample with locations away from integer pixel coordinates")
    inputs = {"value": rng.standard_normal((b, s, m, d)), "sampling_locations": loc,
              "attention_weights": rng.uniform(0.1, 1.0, (b, lq, m, sum(points)))}
    return Sample(inputs=inputs, config={"spatial_shapes": shapes, "points_per_level": points,
                                         "padding_mode": padding_mode, "align_corners": align})


def _check_core_gradients_all_conventions(rng):
    from ._samples import fd_max_rel
    # zeros/align_corners=False is the registry sample's; tests/test_linear_l4.py sweeps all six.
    err = 0.0
    for pad, align in (("border", True), ("reflection", False)):
        smp = _core_sample(rng, (1, 1), ((2, 3), (1, 2)), 2, pad, align, m=1, d=1)
        err = max(err, fd_max_rel(ms_deform_attn_core_forward, ms_deform_attn_core_backward, smp))
    return err


def _check_bilinear_adjoint(rng):
    # The core is linear in value: <G, core(V)> = <core_vjp_value(G), V> (the scatter is the adjoint).
    s = _core_sample(rng)
    out, cache = ms_deform_attn_core_forward(**s.inputs, **s.config)
    g = rng.standard_normal(out.shape)
    dv = ms_deform_attn_core_backward(g, cache)["value"]
    err = abs(float(np.sum(g * out)) - float(np.sum(dv * s.inputs["value"])))
    assert err < 1e-12, f"sampling scatter is not the adjoint of the gather (err {err:.2e})"
    return err


def _check_per_level_layout(rng):
    # RT-DETRv2's flattened (sum P_l) layout with equal counts is Deformable DETR's (L, P) layout.
    s = _core_sample(rng, points=(2, 2))
    b, lq, m = s.inputs["attention_weights"].shape[:3]
    six = {"value": s.inputs["value"], "sampling_locations": s.inputs["sampling_locations"].reshape(b, lq, m, 2, 2, 2),
           "attention_weights": s.inputs["attention_weights"].reshape(b, lq, m, 2, 2)}
    a = ms_deform_attn_core_forward(**s.inputs, **s.config)[0]
    cfg = dict(s.config, points_per_level=None)
    bb = ms_deform_attn_core_forward(**six, **cfg)[0]
    err = float(np.max(np.abs(a - bb)))
    assert err < 1e-14, f"per-level layout differs from the (L, P) layout by {err:.2e}"
    return err


def _check_pixel_centres_read_pixels(rng):
    # align_corners=False: the location ((j + 0.5) / W, (i + 0.5) / H) reads pixel (i, j) exactly.
    shapes = ((3, 4),)
    v = rng.standard_normal((2, 12, 1, 3))
    i, j = rng.integers(0, 3, (2, 5)), rng.integers(0, 4, (2, 5))
    loc = np.stack([(j + 0.5) / 4, (i + 0.5) / 3], -1)[:, :, None, None, None, :]
    out = ms_deform_attn_core_forward(v, loc, np.ones(loc.shape[:-1]), spatial_shapes=shapes)[0]
    want = np.take_along_axis(v[:, :, 0], (i * 4 + j)[..., None], axis=1)
    err = float(np.max(np.abs(out - want)))
    assert err < 1e-14, f"a pixel-centre location does not read its pixel (err {err:.2e})"
    return err


def _check_discrete_sampling(rng):
    # RT-DETRv2 discrete: reads pixel (round(x W), round(y H)) clipped, zero location gradient.
    s = _core_sample(rng)
    cfg = dict(s.config, method="discrete", discrete_clamp="per_axis")
    out, cache = ms_deform_attn_core_forward(**s.inputs, **cfg)
    loc, a, v = s.inputs["sampling_locations"], s.inputs["attention_weights"], s.inputs["value"]
    lev, starts = msda_point_levels((1, 2)), (0, 12)
    want = np.zeros_like(out)
    for bi, qi, mi, pi in np.ndindex(*a.shape):
        h, w = ((3, 4), (2, 3))[lev[pi]]
        ix = min(max(int(np.floor(loc[bi, qi, mi, pi, 0] * w + 0.5)), 0), w - 1)
        iy = min(max(int(np.floor(loc[bi, qi, mi, pi, 1] * h + 0.5)), 0), h - 1)
        want[bi, qi, 2 * mi:2 * mi + 2] += a[bi, qi, mi, pi] * v[bi, starts[lev[pi]] + iy * w + ix, mi]
    g = ms_deform_attn_core_backward(rng.standard_normal(out.shape), cache)
    err = float(np.max(np.abs(out - want)))
    assert err < 1e-14 and not np.any(g["sampling_locations"]), f"discrete sampling error {err:.2e}"
    return err


def _dfa3d_sample(rng):
    shapes, b, m, d, z, lq, p = ((2, 3), (1, 2)), 2, 1, 1, 3, 2, 1
    s = sum(h * w for h, w in shapes)
    for _ in range(1000):
        loc = rng.uniform(-0.1, 1.1, (b, lq, m, 2, p, 3))
        size = np.array([[w, h, z] for h, w in shapes], dtype=float)[None, None, None, :, None, :]
        u = loc * size - 0.5
        if np.min(np.abs(u - np.round(u))) > 0.01:
            break
    else:
        raise RuntimeError("no DFA3D sample with locations away from integer voxel coordinates")
    inputs = {"value": rng.standard_normal((b, s, m, d)), "depth": rng.uniform(0.1, 1.0, (b, s, m, z)),
              "sampling_locations": loc, "attention_weights": rng.uniform(0.1, 1.0, (b, lq, m, 2, p))}
    return Sample(inputs=inputs, config={"spatial_shapes": shapes})


def _check_dfa3d_equals_trilinear(rng):
    # The memory-efficient form equals trilinear grid_sample of the materialised F~ = F(u,v) D(u,v,d).
    s = _dfa3d_sample(rng)
    out = dfa3d_core_forward(**s.inputs, **s.config)[0]
    v, dep, loc, a = (s.inputs[k] for k in ("value", "depth", "sampling_locations", "attention_weights"))
    b, lq, m = a.shape[:3]
    want = np.zeros_like(out)
    start = 0
    for li, (h, w) in enumerate(s.config["spatial_shapes"]):
        vl = v[:, start:start + h * w].transpose(0, 2, 3, 1).reshape(b * m, -1, h, w)
        dl = dep[:, start:start + h * w].transpose(0, 2, 3, 1).reshape(b * m, -1, h, w)
        vol = vl[:, :, None] * dl[:, None]                                      # (BM, D, Z, H, W)
        grid = 2 * loc[:, :, :, li].transpose(0, 2, 1, 3, 4).reshape(b * m, lq, -1, 1, 3) - 1
        smp = grid_sample_apply(vol, grid, "bilinear", "zeros", False)[..., 0]  # (BM, D, Lq, P)
        al = a[:, :, :, li].transpose(0, 2, 1, 3).reshape(b * m, 1, lq, -1)
        want += np.sum(smp * al, -1).reshape(b, m * v.shape[-1], lq).transpose(0, 2, 1)
        start += h * w
    err = float(np.max(np.abs(out - want)))
    assert err < 1e-13, f"DFA3D memory-efficient form differs from trilinear sampling of F~ by {err:.2e}"
    return err


def _check_dfa3d_gradients(rng):
    from ._samples import fd_max_rel
    return fd_max_rel(dfa3d_core_forward, dfa3d_core_backward, _dfa3d_sample(rng))


register(
    Mechanism(
        slug="multiscale_deformable_attention", family="4-linear-kernel-sparse", tier="T2",
        title="Multi-scale deformable attention (Deformable DETR; RT-DETRv2 per-level points and discrete "
              "sampling; DFA3D depth-weighted form)",
        paper="Zhu, Su, Lu, Li, Wang, Dai, 'Deformable DETR', ICLR 2021, arXiv 2010.04159; Lv, Zhao, Xu, Wei, "
              "Wang, Liu, 'RT-DETRv2', 2024, arXiv 2407.17140; Li, Zhang, Zeng, Liu, Li, Zhang, 'DFA3D: 3D "
              "Deformable Attention for 2D-to-3D Feature Lifting', ICCV 2023, arXiv 2307.12972",
        forward=ms_deform_attn_forward, backward=ms_deform_attn_backward, sample=_sample, reference=_reference,
        checks={"core_fd_border_and_reflection": _check_core_gradients_all_conventions,
                "bilinear_scatter_is_adjoint": _check_bilinear_adjoint,
                "per_level_points_layout": _check_per_level_layout,
                "pixel_centres_read_pixels": _check_pixel_centres_read_pixels,
                "discrete_sampling_brute_force": _check_discrete_sampling,
                "dfa3d_equals_trilinear_of_expanded_features": _check_dfa3d_equals_trilinear,
                "dfa3d_fd": _check_dfa3d_gradients},
        docs="linear/local-and-deformable.md#multi-scale-deformable-attention",
        notes="not differentiable at integer pixel coordinates (bilinear kinks, discrete jumps): the sampler "
              "keeps every sampling coordinate off them",
    ),
)
