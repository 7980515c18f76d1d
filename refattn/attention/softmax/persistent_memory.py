r"""All-attention layer with persistent memory vectors (Sukhbaatar et al.): learned key/value slots
appended to every head's keys and values, never masked.

Per head $h$ (width $d$), with $P$ learned memory slots $M_K^h, M_V^h\in\mathbb R^{P\times d}$:

$$Q = XW_q,\quad K = CW_k,\quad V = CW_v,\qquad
K'_h = [K_h;\,M_K^h],\quad V'_h = [V_h;\,M_V^h],$$
$$O_h = \mathrm{softmax}\big(s\,Q_hK_h'^\top + [\,M\,|\,0\,]\big)\,V'_h,\qquad Y = [O_1\|\dots\|O_H]\,W_o,$$

$C = X$ for self-attention. The mask $M$ (``attn_mask``, ``is_causal``) covers the $M$ context
columns only: the $P$ memory columns are attendable from every query, so even the first causal
row (or a row whose context is fully masked) has a well-defined output. The softmax is *joint*
over context and memory (upstream concatenates the two logit blocks before one softmax). The
paper removes the feed-forward sub-layer and lets the memory play its role; this module is the
attention layer itself.

Upstream parameterisation (``memory_reparam=True``, the default): the stored tensors are
``persistent_memory.key`` $\kappa^h\in\mathbb R^{d\times P}$ (initialised $\mathcal N(0,1/d)$) and
``persistent_memory.val`` $\nu^h\in\mathbb R^{P\times d}$ ($\mathcal N(0, 1/P)$), used as
$M_K^h = \sqrt d\,\kappa^{h\top}$ and $M_V^h = \sqrt P\,\nu^h$: with the shared scale
$s = d^{-1/2}$ the memory logit is exactly $q\cdot\kappa$. ``memory_reparam=False`` uses the stored
tensors as $M_K^{h\top}$ and $M_V^h$ directly.

Backward
--------
The attention core (`refattn.attention.softmax.core`) runs on $(Q, K', V')$ with the extended mask;
the memory gradients are the key/value gradients of the memory columns summed over the batch,
$d\kappa^h = \sqrt d\,(\sum_b dK'_{h,M:})^\top$, $d\nu^h = \sqrt P\sum_b dV'_{h,M:}$, and the context
columns go back through the projections (`linear_vjp`), into $dX$ (self) or $dC$ (cross).

Upstream: facebookresearch/adaptive-span ``persistent_memory.py`` (``PersistentMemory``) and
``models.py`` (``SeqAttention``, ``MultiHeadSeqAttention``) @
27b815fee821acce2c2d4104cc0720cb1dc74c37. Its attention span (each query sees the previous
``attn_span`` cached positions, *not* itself, through the skew trick) and its learned relative
position term ``key_pe`` belong to adaptive-span, not to this entry: pass the span as a boolean
``attn_mask`` over ``context = [cache; x]`` to reproduce it (the agreement test does).
Paper: Sukhbaatar, Grave, Lample, Jégou, Joulin, "Augmenting Self-attention with Persistent
Memory", arXiv 1907.01470 (2019).
"""

from __future__ import annotations

import numpy as np

from ..._checks import (
    as_bool_or_float_mask,
    as_dout,
    as_float,
    cast_all,
    check_broadcastable,
    check_param_keys,
    check_params,
    check_weight_in,
    compute_dtype,
)
from ...nn.linear import linear_prefixed, linear_prefixed_vjp, merge_heads, split_heads
from ...registry import Mechanism, Sample, register
from .core import CAUSAL_ALIGNMENTS, attention_core_backward, attention_core_forward, causal_keep, check_size

__all__ = ["persistent_memory_attention_forward", "persistent_memory_attention_backward",
           "persistent_memory_attention", "init_persistent_memory_params"]

_PROJ = ("proj_query", "proj_key", "proj_val", "proj_out")
_MEM = ("persistent_memory.key", "persistent_memory.val")


def _validate(x, src, params, h):
    check_param_keys(params, [p + ".weight" for p in _PROJ] + list(_MEM), [p + ".bias" for p in _PROJ],
                     where="persistent_memory_attention (weights (in, out); PyTorch: weight.T)")
    check_weight_in(params, "proj_query.weight", x.shape[-1], input_name="x")
    wq = as_float(params["proj_query.weight"], "proj_query.weight", ndim=2)
    if wq.shape[0] != x.shape[-1] or wq.shape[1] % h:
        raise ValueError(f"proj_query.weight must have shape (C={x.shape[-1]}, H*d) with H={h} dividing its second "
                         f"axis; got {wq.shape}")
    e = wq.shape[1]
    d = e // h
    wo = as_float(params["proj_out.weight"], "proj_out.weight", ndim=2)
    cc, co = src.shape[-1], wo.shape[1]
    spec = {"proj_query.weight": (x.shape[-1], e), "proj_key.weight": (cc, e), "proj_val.weight": (cc, e),
            "proj_out.weight": (e, co), "proj_query.bias": (e,), "proj_key.bias": (e,), "proj_val.bias": (e,),
            "proj_out.bias": (co,)}
    sub = {k: v for k, v in params.items() if k not in _MEM}
    p = check_params(sub, spec, optional=[q + ".bias" for q in _PROJ], where="persistent_memory_attention")
    key = as_float(params["persistent_memory.key"], "persistent_memory.key", ndim=3, allow_empty=True)
    if key.shape[:2] != (h, d):
        raise ValueError(f"persistent_memory.key must have shape (H={h}, d={d}, P); got {key.shape}")
    val = as_float(params["persistent_memory.val"], "persistent_memory.val", ndim=3, allow_empty=True)
    if val.shape != (h, key.shape[2], d):
        raise ValueError(f"persistent_memory.val must have shape (H={h}, P={key.shape[2]}, d={d}); got {val.shape}")
    p["persistent_memory.key"], p["persistent_memory.val"] = key, val
    return p, d


def _context_mask(attn_mask, is_causal, causal_alignment, target, dt):
    """Additive ``(..., H, N, M)`` mask of the context columns (``None`` when nothing is masked)."""
    if attn_mask is None and not is_causal:
        return None
    add = np.zeros(target, dtype=dt)
    if attn_mask is not None:
        add = np.where(attn_mask, add, -np.inf) if attn_mask.dtype == np.bool_ else add + attn_mask.astype(dt)
    if is_causal:
        add = np.where(causal_keep(target[-2], target[-1], causal_alignment), add, -np.inf)
    return add


def persistent_memory_attention_forward(x, context=None, params=None, *, num_heads: int, attn_mask=None,
                                        is_causal: bool = False, causal_alignment: str = "top_left", scale=None,
                                        memory_reparam: bool = True):
    r"""Multi-head attention whose keys and values are extended by $P$ learned persistent vectors.

    $O_h = \mathrm{softmax}(s\,Q_h[K_h; M_K^h]^\top + [M|0])\,[V_h; M_V^h]$ (module docstring);
    the mask never touches the memory columns.

    Parameters
    ----------
    x : array (B.., N, C)
    context : array (B.., M, Cc), optional
        Keys/values source (default ``x``); for upstream's cached segment pass ``[cache; x]``.
    params : dict
        ``"proj_query.weight" (C, Hd)``, ``"proj_key.weight" (Cc, Hd)``, ``"proj_val.weight" (Cc, Hd)``,
        ``"proj_out.weight" (Hd, C_out)`` (upstream bias-free; optional ``"<name>.bias"``),
        ``"persistent_memory.key" (H, d, P)`` and ``"persistent_memory.val" (H, P, d)`` — the
        upstream names and layouts, ``P = 0`` allowed.
    num_heads : int
    attn_mask, is_causal, causal_alignment
        Mask of the context columns, broadcastable to ``(B.., H, N, M)`` (True = keep, or additive).
    scale : float > 0, optional
        Default $d^{-1/2}$ (also applied to the memory logits).
    memory_reparam : bool
        Upstream's $M_K = \sqrt d\,\kappa^\top$, $M_V = \sqrt P\,\nu$ (True) or the raw tensors (False).

    Returns
    -------
    out, cache
        ``out (B.., N, C_out)``.
    """
    x = as_float(x, "x", min_ndim=2)
    h = check_size(num_heads, "num_heads")
    if not isinstance(memory_reparam, (bool, np.bool_)):
        raise TypeError(f"memory_reparam must be a bool; got {type(memory_reparam).__name__}")
    if not isinstance(is_causal, (bool, np.bool_)):
        raise TypeError(f"is_causal must be a bool; got {type(is_causal).__name__}")
    if causal_alignment not in CAUSAL_ALIGNMENTS:
        raise ValueError(f"causal_alignment must be one of {CAUSAL_ALIGNMENTS}; got {causal_alignment!r}")
    if context is not None:
        context = as_float(context, "context", ndim=x.ndim)
        if context.shape[:-2] != x.shape[:-2]:
            raise ValueError(f"context must have x's leading axes {x.shape[:-2]}; got context {context.shape}")
    if params is None:
        raise TypeError("params is required: a dict with proj_query/proj_key/proj_val/proj_out weights and "
                        "persistent_memory.key / persistent_memory.val")
    src = x if context is None else context
    p, d = _validate(x, src, params, h)
    lead, n, m = x.shape[:-2], x.shape[-2], src.shape[-2]
    target = lead + (h, n, m)
    attn_mask = as_bool_or_float_mask(attn_mask, "attn_mask")
    if attn_mask is not None:
        check_broadcastable("attn_mask", attn_mask.shape, target, "the context scores (..., H, N, M) of shape")
    dt = compute_dtype(x, src, *p.values())
    x, src, p = x.astype(dt, copy=False), src.astype(dt, copy=False), cast_all(dt, p)
    key, val = p["persistent_memory.key"], p["persistent_memory.val"]
    n_mem = key.shape[2]
    ck, cv = (float(np.sqrt(d)), float(np.sqrt(n_mem))) if memory_reparam else (1.0, 1.0)
    mk = np.broadcast_to(ck * np.swapaxes(key, -1, -2), lead + (h, n_mem, d))
    mv = np.broadcast_to(cv * val, lead + (h, n_mem, d))
    q = split_heads(linear_prefixed(p, "proj_query", x), h, d)
    k = split_heads(linear_prefixed(p, "proj_key", src), h, d)
    v = split_heads(linear_prefixed(p, "proj_val", src), h, d)
    ctx = _context_mask(attn_mask, is_causal, causal_alignment, target, dt)
    full = None if ctx is None else np.concatenate([ctx, np.zeros(lead + (h, n, n_mem), dt)], axis=-1)
    o, core = attention_core_forward(q, np.concatenate([k, mk], axis=-2), np.concatenate([v, mv], axis=-2),
                                     attn_mask=full, scale=scale)
    oc = merge_heads(o)
    y = linear_prefixed(p, "proj_out", oc)
    cache = {"x": x, "src": src, "self": context is None, "p": p, "core": core, "oc": oc, "h": h, "d": d, "m": m,
             "ck": ck, "cv": cv, "y_shape": y.shape}
    return y, cache


def persistent_memory_attention_backward(dout, cache):
    """Gradient of :func:`persistent_memory_attention_forward`: ``x`` (and ``context``), every weight
    and both memory tensors (the memory columns' key/value gradients, summed over the batch)."""
    p, core, x, src = cache["p"], cache["core"], cache["x"], cache["src"]
    g = as_dout(dout, cache["y_shape"], x.dtype)
    grads = {}
    do = linear_prefixed_vjp(grads, p, "proj_out", g, cache["oc"])
    gc = attention_core_backward(split_heads(do, cache["h"], cache["d"]), core)
    m = cache["m"]
    batch_axes = tuple(range(gc["k"].ndim - 3))
    dmk = gc["k"][..., m:, :].sum(axis=batch_axes)
    dmv = gc["v"][..., m:, :].sum(axis=batch_axes)
    dx = linear_prefixed_vjp(grads, p, "proj_query", merge_heads(gc["q"]), x)
    dsrc = linear_prefixed_vjp(grads, p, "proj_key", merge_heads(gc["k"][..., :m, :]), src)
    dsrc = dsrc + linear_prefixed_vjp(grads, p, "proj_val", merge_heads(gc["v"][..., :m, :]), src)
    if cache["self"]:
        grads["x"] = dx + dsrc
    else:
        grads["x"], grads["context"] = dx, dsrc
    grads["persistent_memory.key"] = cache["ck"] * np.swapaxes(dmk, -1, -2)
    grads["persistent_memory.val"] = cache["cv"] * dmv
    return grads


def persistent_memory_attention(x, context=None, params=None, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`persistent_memory_attention_forward`."""
    return persistent_memory_attention_forward(x, context, params, **config)[0]


def init_persistent_memory_params(rng, c: int, num_heads: int, head_dim: int, n_memory: int, *, c_context=None,
                                  c_out=None, bias: bool = False) -> dict:
    """Random parameters with upstream's memory initialisation (``key`` $\\mathcal N(0, 1/d)$,
    ``val`` $\\mathcal N(0, 1/P)$) and xavier-like projections."""
    e = num_heads * head_dim
    cc = c if c_context is None else c_context
    co = c if c_out is None else c_out
    p = {}
    for name, (i, o) in {"proj_query": (c, e), "proj_key": (cc, e), "proj_val": (cc, e), "proj_out": (e, co)}.items():
        p[name + ".weight"] = rng.uniform(-1, 1, (i, o)) * np.sqrt(6.0 / (i + o))
        if bias:
            p[name + ".bias"] = 0.1 * rng.standard_normal(o)
    p["persistent_memory.key"] = rng.standard_normal((num_heads, head_dim, n_memory)) / np.sqrt(head_dim)
    p["persistent_memory.val"] = rng.standard_normal((num_heads, n_memory, head_dim)) / np.sqrt(max(n_memory, 1))
    return p


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size):
    if size == "tiny":
        n, m, c, h, d, pm = int(rng.integers(2, 4)), int(rng.integers(2, 4)), 3, 2, 2, 2
    else:
        n, m, c, h, d, pm = int(rng.integers(4, 8)), int(rng.integers(4, 9)), 6, 2, 3, 3
    cross = bool(rng.random() < 0.5)
    inputs = {"x": rng.standard_normal((2, n, c))}
    if cross:
        inputs["context"] = rng.standard_normal((2, m, c + 1))
    params = init_persistent_memory_params(rng, c, h, d, pm, c_context=c + 1 if cross else c,
                                           bias=bool(rng.random() < 0.5))
    cfg = {"num_heads": h, "memory_reparam": bool(rng.random() < 0.7)}
    if rng.random() < 0.5:
        cfg["is_causal"] = True
        cfg["causal_alignment"] = "top_left" if not cross or m < n else str(rng.choice(CAUSAL_ALIGNMENTS))
    return Sample(inputs=inputs, params=params, config=cfg)


def _reference(x, context=None, params=None, *, num_heads, attn_mask=None, is_causal=False,
               causal_alignment="top_left", scale=None, memory_reparam=True):
    # explicit loop over (batch, head, query): softmax over [context keys; memory keys] jointly
    src = x if context is None else context
    b, n, _ = x.shape
    m = src.shape[1]
    e = params["proj_query.weight"].shape[1]
    d = e // num_heads
    key, val = params["persistent_memory.key"], params["persistent_memory.val"]
    pm = key.shape[2]
    ck, cv = (np.sqrt(d), np.sqrt(pm)) if memory_reparam else (1.0, 1.0)
    q = x @ params["proj_query.weight"] + params.get("proj_query.bias", 0.0)
    k = src @ params["proj_key.weight"] + params.get("proj_key.bias", 0.0)
    v = src @ params["proj_val.weight"] + params.get("proj_val.bias", 0.0)
    s = d ** -0.5 if scale is None else scale
    keep = np.ones((n, m), bool) if not is_causal else causal_keep(n, m, causal_alignment)
    out = np.zeros((b, n, e))
    for bb in range(b):
        for hh in range(num_heads):
            sl = slice(hh * d, (hh + 1) * d)
            kk = np.concatenate([k[bb, :, sl], ck * key[hh].T])
            vv = np.concatenate([v[bb, :, sl], cv * val[hh]])
            for i in range(n):
                logits = s * kk @ q[bb, i, sl]
                sel = np.concatenate([keep[i], np.ones(pm, bool)])
                w = np.where(sel, np.exp(logits - logits[sel].max()), 0.0)
                out[bb, i, sl] = w @ vv / w.sum()
    return out @ params["proj_out.weight"] + params.get("proj_out.bias", 0.0)


def _check_p0_is_mha(rng):
    from .mha import mha

    x = rng.standard_normal((2, 5, 4))
    p = init_persistent_memory_params(rng, 4, 2, 3, 0, bias=True)
    err = 0.0
    for causal in (False, True):
        y = persistent_memory_attention(x, params=p, num_heads=2, is_causal=causal)
        pm = {n: p[f"proj_{u}.weight"] for n, u in (("q_proj", "query"), ("k_proj", "key"), ("v_proj", "val"),
                                                     ("out_proj", "out"))}
        pm.update({n + "_bias": p[f"proj_{u}.bias"] for n, u in (("q_proj", "query"), ("k_proj", "key"),
                                                                 ("v_proj", "val"), ("out_proj", "out"))})
        err = max(err, float(np.abs(y - mha(x, params=pm, num_heads=2, is_causal=causal)).max()))
    assert err < 1e-12, err
    return err


def _check_memory_never_masked(rng):
    # causal row 0 and a fully masked context row still attend to every memory slot; a row whose
    # context is fully masked is the pure memory read softmax(q M_K^T s) M_V
    x = rng.standard_normal((2, 4, 4))
    p = init_persistent_memory_params(rng, 4, 2, 2, 3)
    keep = np.ones((4, 4), bool)
    keep[2] = False
    _, c = persistent_memory_attention_forward(x, params=p, num_heads=2, is_causal=True, attn_mask=keep)
    w = c["core"]["p"]
    assert np.all(w[..., 4:] > 0), "a memory column was masked"
    assert np.all(w[..., 2, :4] == 0) and np.all(w[..., 0, 1:4] == 0)
    q = split_heads(x @ p["proj_query.weight"], 2, 2)[:, :, 2]
    mk = np.sqrt(2) * np.swapaxes(p["persistent_memory.key"], -1, -2)
    lg = np.einsum("bhd,hpd->bhp", q, mk) / np.sqrt(2)
    ref = np.exp(lg - lg.max(-1, keepdims=True))
    ref = ref / ref.sum(-1, keepdims=True)
    err = float(np.abs(w[..., 2, 4:] - ref).max())
    assert err < 1e-12, err
    return err


def _check_memory_logit_is_q_dot_key(rng):
    # upstream reparameterisation: the memory logit is q . kappa exactly, whatever d
    x = rng.standard_normal((2, 3, 5))
    p = init_persistent_memory_params(rng, 5, 1, 4, 2)
    _, c = persistent_memory_attention_forward(x, params=p, num_heads=1)
    s = np.log(c["core"]["p"]) + c["core"]["lse"][..., None]
    q = x @ p["proj_query.weight"]
    err = float(np.abs(s[:, 0, :, 3:] - q @ p["persistent_memory.key"][0]).max())
    assert err < 1e-12, err
    return err


register(
    Mechanism(
        slug="persistent_memory_attention", family="1-softmax", tier="T2",
        title="All-attention layer with persistent memory vectors (memory slots never masked)",
        paper="Sukhbaatar, Grave, Lample, Jégou, Joulin, Augmenting Self-attention with Persistent Memory, "
              "arXiv 1907.01470 (2019)",
        official_code="facebookresearch/adaptive-span",
        forward=persistent_memory_attention_forward, backward=persistent_memory_attention_backward,
        sample=_sample, reference=_reference, docs="softmax/qkv-variants.md#persistent-memory-attention",
        checks={"p0_is_mha": _check_p0_is_mha, "memory_never_masked": _check_memory_never_masked,
                "memory_logit_is_q_dot_key": _check_memory_logit_is_q_dot_key},
    ),
)
