r"""Helpers shared by the softmax-attention family (and the families built on it), under public names.

* **The attention core**, `attention_core_forward` / `attention_core_backward`: softmax attention
  with an optional *differentiable* additive score bias, boolean or additive masks, a causal mask
  in either alignment, logit soft-capping, GQA/MQA head maps and the stored log-sum-exp. Every
  mechanism of the family calls it (SDPA, masks, additive biases, ALiBi, relative positions,
  MHA/GQA), and so do the differential and operator families. Its forward, the derivation of its
  backward (the standard attention VJP) and its conventions (``causal_alignment``,
  ``kv_group_map``, ``softcap``, ``attn_mask`` with ``is_causal``, ``scale``) are on the SDPA page:
  the docstring of `refattn.attention.softmax.sdpa`.
* **Head and position maps**: `expand_kv` / `reduce_kv` (the GQA expansion and its adjoint, see
  `refattn.attention.softmax.gqa`), `causal_keep`, `relative_positions` (the $j - (i + o)$ matrix
  that ALiBi and the relative position encodings share) and `sum_to_shape` (the adjoint of
  broadcasting, for bias gradients).
* **Validation**: `validate_attention_config` (SDPA's keywords against a score shape; shared with
  the kernels, which pass shapes only), `validate_qkv_config` (the same for ``q`` and ``k``) and
  `check_size`.
* **Explicit references** that the fast forms are verified against: `naive_attention` (a
  per-(batch, head, query) loop of the SDPA formula) and `sdpa_reference` (SDPA's keywords on top
  of it).

This module registers no mechanism.
"""

from __future__ import annotations

import numpy as np

from ..._checks import (
    as_bool_or_float_mask,
    as_dout,
    as_float,
    check_broadcastable,
    check_choice,
    check_positive,
    compute_dtype,
    validate_qkv,
)
from ...nn.softmax import softmax_lse, softmax_vjp

__all__ = [
    "KV_GROUP_MAPS",
    "CAUSAL_ALIGNMENTS",
    "expand_kv",
    "reduce_kv",
    "causal_keep",
    "relative_positions",
    "sum_to_shape",
    "check_size",
    "validate_attention_config",
    "validate_qkv_config",
    "attention_core_forward",
    "attention_core_backward",
    "naive_attention",
    "sdpa_reference",
]

KV_GROUP_MAPS = ("contiguous", "strided")
CAUSAL_ALIGNMENTS = ("top_left", "bottom_right")


# --------------------------------------------------------------------------------------------
# Small unvalidated helpers (shared with the rest of the family)


def expand_kv(x: np.ndarray, group: int, kv_group_map: str = "contiguous") -> np.ndarray:
    """``(..., Hkv, M, e) -> (..., Hkv * group, M, e)``: the kv head used by every query head.

    ``"contiguous"``: head $h$ gets kv head $h // r$ (``repeat_kv``); ``"strided"``: $h \\bmod H_{kv}$.
    """
    if group == 1:
        return x
    if kv_group_map == "contiguous":
        return np.repeat(x, group, axis=-3)
    return np.concatenate([x] * group, axis=-3)


def reduce_kv(dx: np.ndarray, group: int, kv_group_map: str = "contiguous") -> np.ndarray:
    """Adjoint of :func:`expand_kv`: sum the gradients of the query heads sharing a kv head."""
    if group == 1:
        return dx
    *lead, h, m, e = dx.shape
    hkv = h // group
    if kv_group_map == "contiguous":
        return dx.reshape(*lead, hkv, group, m, e).sum(axis=-3)
    return dx.reshape(*lead, group, hkv, m, e).sum(axis=-4)


def causal_keep(n: int, m: int, causal_alignment: str = "top_left") -> np.ndarray:
    """Boolean ``(n, m)`` keep-mask of causal attention: ``j <= i`` (top-left) or ``j <= i + m - n``."""
    offset = 0 if causal_alignment == "top_left" else m - n
    return np.tri(n, m, k=offset, dtype=bool)


def sum_to_shape(x: np.ndarray, shape: tuple) -> np.ndarray:
    """Sum ``x`` over the axes along which an array of ``shape`` was broadcast to ``x.shape``."""
    shape = tuple(shape)
    lead = x.ndim - len(shape)
    if lead:
        x = x.sum(axis=tuple(range(lead)))
    axes = tuple(i for i, n in enumerate(shape) if n == 1 and x.shape[i] != 1)
    if axes:
        x = x.sum(axis=axes, keepdims=True)
    return x


def _query_offset(n, m, causal_alignment):
    check_choice(causal_alignment, "causal_alignment", CAUSAL_ALIGNMENTS)
    return 0 if causal_alignment == "top_left" else m - n


def relative_positions(n: int, m: int, causal_alignment: str = "top_left") -> np.ndarray:
    """Integer ``(n, m)`` matrix of relative positions $j - (i + o)$ (memory minus query position)."""
    o = _query_offset(n, m, causal_alignment)
    return np.arange(m)[None, :] - (np.arange(n)[:, None] + o)


# --------------------------------------------------------------------------------------------
# Validation


def check_size(value, name, minimum=1):
    """Validate an integer size argument: an ``int`` (not a ``bool``) that is ``>= minimum``.

    Returns it as a Python ``int``; raises ``TypeError`` / ``ValueError`` naming ``name``.
    """
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer; got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}; got {value}")
    return int(value)


def validate_attention_config(scores_shape, attn_mask, is_causal, causal_alignment, scale, softcap,
                              kv_group_map):
    """Validate SDPA's keywords against the score shape ``(..., H, N, M)``; returns
    ``(attn_mask, is_causal, scale, softcap)``. Shared with the kernels (which pass shapes only)."""
    if not isinstance(is_causal, (bool, np.bool_)):
        raise TypeError(f"is_causal must be a bool; got {type(is_causal).__name__}")
    check_choice(causal_alignment, "causal_alignment", CAUSAL_ALIGNMENTS)
    check_choice(kv_group_map, "kv_group_map", KV_GROUP_MAPS)
    scale = check_positive(scale, "scale", allow_none=True)
    softcap = check_positive(softcap, "softcap", allow_none=True)
    attn_mask = as_bool_or_float_mask(attn_mask, "attn_mask")
    if attn_mask is not None:
        check_broadcastable("attn_mask", attn_mask.shape, tuple(scores_shape), "the scores (..., H, N, M) of shape")
    return attn_mask, bool(is_causal), scale, softcap


def validate_qkv_config(q, k, attn_mask, is_causal, causal_alignment, scale, softcap, kv_group_map):
    """`validate_attention_config` for validated ``q (..., H, N, d)`` and ``k (..., Hkv, M, d)``
    (the score shape is ``q.shape[:-1] + (M,)``); returns ``(attn_mask, is_causal, scale, softcap)``."""
    return validate_attention_config(q.shape[:-1] + (k.shape[-2],), attn_mask, is_causal, causal_alignment,
                                     scale, softcap, kv_group_map)


# --------------------------------------------------------------------------------------------
# The core


def attention_core_forward(q, k, v, bias=None, *, attn_mask=None, is_causal: bool = False,
                           causal_alignment: str = "top_left", scale=None, softcap=None,
                           kv_group_map: str = "contiguous"):
    r"""Softmax attention with an optional *differentiable* additive score bias.

    Parameters
    ----------
    q : array (..., H, N, d)
    k : array (..., Hkv, M, d)
        ``H`` must be a multiple of ``Hkv`` (GQA; MQA is ``Hkv = 1``).
    v : array (..., Hkv, M, dv)
    bias : array broadcastable to (..., H, N, M), optional
        Added to the (soft-capped) scores; its gradient is returned as ``"bias"``.
    attn_mask : bool or float array broadcastable to (..., H, N, M), optional
        Boolean True = keep, or additive (``-inf`` removes). Not differentiated.
    is_causal, causal_alignment
        Causal mask, aligned ``"top_left"`` (PyTorch) or ``"bottom_right"`` (flash-attn, KV cache).
    scale : float > 0, optional
        Score scale $s$; default $1/\sqrt d$.
    softcap : float > 0, optional
        Gemma-2 / flash-attn logit soft-capping $c\tanh(\cdot/c)$ before bias and masks.
    kv_group_map : {"contiguous", "strided"}
        Which kv head each query head uses (see `refattn.attention.softmax.sdpa`).

    Returns
    -------
    out, cache
        ``out`` of shape (..., H, N, dv). ``cache["lse"]`` (..., H, N) is the log-sum-exp of the
        final scores (``-inf`` on fully masked rows) and ``cache["p"]`` the attention weights.
    """
    q, k, v = validate_qkv(q, k, v)
    attn_mask, is_causal, scale, softcap = validate_qkv_config(
        q, k, attn_mask, is_causal, causal_alignment, scale, softcap, kv_group_map)
    target = q.shape[:-1] + (k.shape[-2],)
    if bias is not None:
        bias = as_float(bias, "bias")
        check_broadcastable("bias", bias.shape, target, "the scores (..., H, N, M) of shape")
    dt = compute_dtype(q, k, v, bias)
    q, k, v = (a.astype(dt, copy=False) for a in (q, k, v))
    if bias is not None:
        bias = bias.astype(dt, copy=False)
    if attn_mask is not None and attn_mask.dtype != np.bool_:
        attn_mask = attn_mask.astype(dt, copy=False)
    s = float(1.0 / np.sqrt(q.shape[-1])) if scale is None else scale  # a Python float keeps float32 float32
    group = q.shape[-3] // k.shape[-3]
    ke, ve = expand_kv(k, group, kv_group_map), expand_kv(v, group, kv_group_map)

    scores = s * (q @ np.swapaxes(ke, -1, -2))
    th = None
    if softcap is not None:
        th = np.tanh(scores / softcap)
        scores = softcap * th
    if bias is not None:
        scores = scores + bias
    if attn_mask is not None:
        scores = np.where(attn_mask, scores, -np.inf) if attn_mask.dtype == np.bool_ else scores + attn_mask
    if is_causal:
        scores = np.where(causal_keep(q.shape[-2], k.shape[-2], causal_alignment), scores, -np.inf)
    p, lse = softmax_lse(scores, axis=-1)
    out = p @ ve
    cache = {"q": q, "ke": ke, "ve": ve, "p": p, "lse": lse, "out": out, "th": th, "scale": s,
             "softcap": softcap, "group": group, "kv_group_map": kv_group_map,
             "bias_shape": None if bias is None else bias.shape}
    return out, cache


def attention_core_backward(dout, cache, *, dlse=None, dp=None):
    r"""Gradient of :func:`attention_core_forward` (the attention VJP derived on the SDPA page,
    the docstring of `refattn.attention.softmax.sdpa`).

    ``dlse`` (optional, shape (..., H, N)) is an upstream gradient on ``cache["lse"]``
    ($\partial L_i/\partial S_{ij} = P_{ij}$), for callers that merge partial attentions.
    ``dp`` (optional, shape (..., H, N, M)) is an extra upstream gradient on the attention
    weights ``cache["p"]`` (callers that also use $P$ elsewhere: Shaw value tables, map losses).
    Returns ``{"q", "k", "v"}`` plus ``"bias"`` when a bias was given.
    """
    p, ve, ke, q = cache["p"], cache["ve"], cache["ke"], cache["q"]
    dt = p.dtype
    g = as_dout(dout, cache["out"].shape, dt)
    dve = np.swapaxes(p, -1, -2) @ g
    dpp = g @ np.swapaxes(ve, -1, -2)
    if dp is not None:
        dpp = dpp + as_dout(dp, p.shape, dt, name="dp")
    ds = softmax_vjp(p, dpp)
    if dlse is not None:
        dlse = as_dout(dlse, cache["lse"].shape, dt, name="dlse")
        ds = ds + p * dlse[..., None]
    grads = {}
    if cache["bias_shape"] is not None:
        grads["bias"] = sum_to_shape(ds, cache["bias_shape"])
    if cache["th"] is not None:
        ds = ds * (1.0 - cache["th"] ** 2)
    s = cache["scale"]
    dq = s * (ds @ ke)
    dke = s * (np.swapaxes(ds, -1, -2) @ q)
    group, gm = cache["group"], cache["kv_group_map"]
    out = {"q": dq, "k": reduce_kv(dke, group, gm), "v": reduce_kv(dve, group, gm)}
    out.update(grads)
    return out


# --------------------------------------------------------------------------------------------
# Explicit references (the slow, obvious formulas the fast forms are checked against)


def naive_attention(q, k, v, *, bias=None, keep=None, scale=None, softcap=None, kv_group_map="contiguous"):
    """Explicit per-(batch, head, query) loop of the SDPA formula: the slow, obvious reference.

    ``keep`` is a boolean mask broadcastable to the scores (True = keep). Unvalidated.
    """
    q, k, v = (np.asarray(a) for a in (q, k, v))
    h, n, d = q.shape[-3:]
    hkv, m = k.shape[-3], k.shape[-2]
    r = h // hkv
    s = 1.0 / np.sqrt(d) if scale is None else scale
    lead = q.shape[:-3]
    shape = lead + (h, n, m)
    b = np.zeros(shape) if bias is None else np.broadcast_to(bias, shape)
    kp = np.ones(shape, bool) if keep is None else np.broadcast_to(keep, shape)
    out = np.zeros(lead + (h, n, v.shape[-1]), dtype=np.result_type(q, k, v))
    for idx in np.ndindex(*lead):
        for hh in range(h):
            g = hh // r if kv_group_map == "contiguous" else hh % hkv
            for i in range(n):
                logits = []
                for j in range(m):
                    x = s * float(np.dot(q[idx + (hh, i)], k[idx + (g, j)]))
                    if softcap is not None:
                        x = softcap * np.tanh(x / softcap)
                    logits.append(x + b[idx + (hh, i, j)])
                logits = np.array(logits)
                sel = kp[idx + (hh, i)]
                if not sel.any():
                    continue
                w = np.where(sel, np.exp(logits - logits[sel].max()), 0.0)
                out[idx + (hh, i)] = (w / w.sum()) @ v[idx + (g,)]
    return out


def sdpa_reference(q, k, v, *, attn_mask=None, is_causal=False, causal_alignment="top_left", scale=None,
                   softcap=None, kv_group_map="contiguous", return_lse=False):
    """SDPA's keywords on top of `naive_attention`: the explicit reference of the ``sdpa`` record and
    of the exact memory-efficient forms. An additive ``attn_mask`` removes its ``-inf`` entries and
    adds its finite ones as a bias; ``return_lse`` is accepted for signature symmetry and ignored."""
    keep = None
    if attn_mask is not None:
        keep = attn_mask if attn_mask.dtype == np.bool_ else np.isfinite(attn_mask)
    if is_causal:
        c = causal_keep(q.shape[-2], k.shape[-2], causal_alignment)
        keep = c if keep is None else keep & c
    bias = None if attn_mask is None or attn_mask.dtype == np.bool_ else np.where(np.isfinite(attn_mask), attn_mask, 0.0)
    return naive_attention(q, k, v, bias=bias, keep=keep, scale=scale, softcap=softcap, kv_group_map=kv_group_map)
