r"""Multi-head (self or cross) attention layer with q/k/v/out projections, token-major; the
options of ``torch.nn.MultiheadAttention`` (separate key and value inputs, ``add_bias_kv``,
``add_zero_attn``, ``key_padding_mask``).

$$Q = XW_Q + b_Q,\quad K = CW_K + b_K,\quad V = C_vW_V + b_V,\quad
O_h = \mathrm{sdpa}(Q_h, K_{g(h)}, V_{g(h)}),\quad Y = [O_1\|\dots\|O_H]\,W_O + b_O,$$

$C = X$ for self-attention (``context=None``); any $C$ (with its own width and length) for
cross-attention; $C_v = C$ unless a separate ``value`` input is given (its own width, the keys'
length: PyTorch's ``kdim != vdim``). Heads split the projected width head-major (``(h d)``: head $h$
is columns $hd:(h+1)d$, the ``b n (h d)`` layout of PyTorch/HF). Params: ``q_proj (C, H*d)``,
``k_proj (Cc, Hkv*d)``, ``v_proj (Cv, Hkv*dv)``, ``out_proj (H*dv, C_out)`` and optional
``*_bias``. ``num_kv_heads < num_heads`` gives GQA (MQA for 1) with ``kv_group_map`` as in SDPA:
the ``gqa_mqa`` record, `refattn.attention.softmax.gqa`. The default scale is $1/\sqrt{d}$ with
$d$ the *head* width.

Appended key/value rows (PyTorch ``add_bias_kv``, ``add_zero_attn``)
--------------------------------------------------------------------
After the projections, ``bias_k (Hkv*d,)`` / ``bias_v (Hkv*dv,)`` (torch ``bias_k``/``bias_v``
of shape ``(1, 1, E)``: pass ``reshape(-1)``) are appended as one more key/value row of every
sequence, then (``add_zero_attn=True``) a row of zeros, in that order: $K' = [K; b_K; 0]$,
$V' = [V; b_V; 0]$. Every mask (``attn_mask``, ``key_padding_mask``, the causal mask) covers
the $M$ original keys only; the appended rows are always attended (PyTorch pads both masks with
a kept column). The zero row gives each query an extra logit $0$, so no row is fully masked.

Backward
--------
$dW_O = O^\top dY$, $dO = dY\,W_O^\top$ ($O$ the concatenated heads); the SDPA VJP per head (the
attention core, `refattn.attention.softmax.core`; derivation on the SDPA page) gives
$dQ, dK', dV'$; the appended rows' gradients are split off: $db_K = \sum_{\text{batch}} dK'_{M}$,
$db_V = \sum_{\text{batch}} dV'_{M}$ (merged over heads), the zero row's is dropped; then
$dW_Q = X^\top dQ$, $dX = dQ\,W_Q^\top$ and likewise for K and V, whose input gradients accumulate
into $dX$ for self-attention and into $dC$ (and $dC_v$) for cross-attention. Bias gradients are
the column sums of $dQ, dK, dV, dY$.

Loading PyTorch weights
-----------------------
``torch.nn.MultiheadAttention(E, H, batch_first=True)`` packs the in-projection:
``q_proj = in_proj_weight[:E].T``, ``k_proj = in_proj_weight[E:2E].T``,
``v_proj = in_proj_weight[2E:].T``, biases the same slices of ``in_proj_bias``,
``out_proj = out_proj.weight.T`` (with ``kdim``/``vdim`` set: ``q_proj_weight.T``,
``k_proj_weight.T``, ``v_proj_weight.T``; ``in_proj_bias`` stays packed). Its boolean
``attn_mask`` / ``key_padding_mask`` mean True = *masked* (refattn: True = keep; float masks are
additive in both). Pitfalls: the head layout ``(h d)`` vs ``(d h)`` must match the weights;
scaling by the full width instead of the head width (Set Transformer) is a different model.

Agreement with ``torch.nn.MultiheadAttention`` (torch 2.13, float64, ``batch_first=True``):
every combination of ``kdim``/``vdim`` (separate key and value inputs), ``add_bias_kv``,
``add_zero_attn``, ``bias``, boolean and float ``attn_mask`` (2-D and per head) and
``key_padding_mask`` matches to $2\times10^{-15}$ relative, output and every input and
parameter gradient (``tests/test_fidelity_layers.py``).

Paper: Vaswani et al., "Attention Is All You Need", NeurIPS 2017, arXiv 1706.03762.
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
    compute_dtype,
)
from ...nn.linear import linear_apply, linear_vjp, merge_heads, split_heads
from ...registry import Mechanism, register
from ._samples import sample_mha
from .core import attention_core_backward, attention_core_forward, causal_keep, check_size, naive_attention
from .sdpa import sdpa

__all__ = ["MHA_WEIGHTS", "mha_forward", "mha_backward", "mha", "init_mha_params"]

MHA_WEIGHTS = ("q_proj", "k_proj", "v_proj", "out_proj")
_KV_BIASES = ("bias_k", "bias_v")


def _validate_mha_params(params, c, cc, cv, num_heads, num_kv_heads):
    check_param_keys(params, MHA_WEIGHTS, [w + "_bias" for w in MHA_WEIGHTS] + list(_KV_BIASES),
                     where="mha (weights (in, out); PyTorch: weight.T)")
    w = {n: as_float(params[n], n, ndim=2) for n in MHA_WEIGHTS}
    b = {n: as_float(params[n + "_bias"], n + "_bias", ndim=1) for n in MHA_WEIGHTS if params.get(n + "_bias") is not None}
    h, hkv = num_heads, num_kv_heads
    if w["q_proj"].shape[0] != c or w["q_proj"].shape[1] % h:
        raise ValueError(f"q_proj must have shape (C={c}, H*d) with H={h} dividing the second axis; got {w['q_proj'].shape}")
    d = w["q_proj"].shape[1] // h
    if w["k_proj"].shape != (cc, hkv * d):
        raise ValueError(f"k_proj must have shape (C_context={cc}, Hkv*d={hkv * d}); got {w['k_proj'].shape}")
    if w["v_proj"].shape[0] != cv or w["v_proj"].shape[1] % hkv:
        raise ValueError(f"v_proj must have shape (C_value={cv}, Hkv*dv) with Hkv={hkv}; got {w['v_proj'].shape}")
    dv = w["v_proj"].shape[1] // hkv
    if w["out_proj"].shape[0] != h * dv:
        raise ValueError(f"out_proj must have shape (H*dv={h * dv}, C_out); got {w['out_proj'].shape}")
    for n, bb in b.items():
        if bb.shape[0] != w[n].shape[1]:
            raise ValueError(f"{n}_bias must have shape ({w[n].shape[1]},); got {bb.shape}")
    if ("bias_k" in params) != ("bias_v" in params):
        raise ValueError("params must hold both 'bias_k' and 'bias_v' (PyTorch add_bias_kv) or neither")
    kvb = {}
    for n, width in (("bias_k", hkv * d), ("bias_v", hkv * dv)):
        if n in params:
            kvb[n] = as_float(params[n], n, ndim=1)
            if kvb[n].shape != (width,):
                raise ValueError(f"{n} must have shape ({width},) (PyTorch's (1, 1, E): pass reshape(-1)); "
                                 f"got {kvb[n].shape}")
    return w, b, kvb, d, dv


def _keys_mask(attn_mask, key_padding_mask, is_causal, causal_alignment, lead, h, n, m, n_extra, dt):
    """One mask for the core over ``M + n_extra`` keys: ``attn_mask``, ``key_padding_mask`` and the
    causal mask over the ``M`` original keys, the appended columns always kept. Boolean (True =
    keep) when every given mask is boolean, else additive float. Returns ``(mask, use_is_causal)``:
    without extra rows and padding mask the masks go to the core unchanged."""
    scores = tuple(lead) + (h, n, m)
    am = as_bool_or_float_mask(attn_mask, "attn_mask")
    if am is not None:
        check_broadcastable("attn_mask", am.shape, scores, "the scores (..., H, N, M) of shape")
    kpm = as_bool_or_float_mask(key_padding_mask, "key_padding_mask")
    if kpm is not None:
        check_broadcastable("key_padding_mask", kpm.shape, tuple(lead) + (m,), "the keys (..., M) of shape")
        kpm = kpm.reshape(kpm.shape[:-1] + (1, 1, m))
        if kpm.ndim < len(scores):
            kpm = kpm.reshape((1,) * (len(scores) - kpm.ndim) + kpm.shape)
    if not isinstance(is_causal, (bool, np.bool_)):
        raise TypeError(f"is_causal must be a bool; got {type(is_causal).__name__}")
    if n_extra == 0 and kpm is None:
        return am, bool(is_causal)
    masks = [x for x in (am, kpm) if x is not None]
    if is_causal:
        masks.append(causal_keep(n, m, causal_alignment))
    if not masks:
        return None, False
    if all(x.dtype == np.bool_ for x in masks):
        keep = masks[0]
        for x in masks[1:]:
            keep = np.logical_and(keep, x)
        fill = True
    else:
        keep = sum(np.where(x, 0.0, -np.inf) if x.dtype == np.bool_ else x.astype(dt, copy=False) for x in masks)
        fill = 0.0
    if n_extra:
        keep = np.broadcast_to(keep, np.broadcast_shapes(keep.shape, (1,) * (len(scores) - 1) + (m,)))
        pad = np.full(keep.shape[:-1] + (n_extra,), fill, dtype=keep.dtype)
        keep = np.concatenate([keep, pad], axis=-1)
    return keep, False


def mha_forward(x, context=None, params=None, *, value=None, num_heads: int, num_kv_heads=None, attn_mask=None,
                key_padding_mask=None, is_causal: bool = False, causal_alignment: str = "top_left", scale=None,
                softcap=None, kv_group_map: str = "contiguous", add_zero_attn: bool = False):
    r"""Multi-head (self or cross) attention with projections, token-major.

    $$Q = XW_Q + b_Q,\quad K = CW_K + b_K,\quad V = C_vW_V + b_V,\quad
    O_h = \mathrm{sdpa}(Q_h, K'_{g(h)}, V'_{g(h)}),\quad Y = [O_1\|\dots\|O_H]\,W_O + b_O,$$

    $C = X$ for self-attention (``context=None``), $C_v = C$ unless ``value`` is given;
    $K' = [K; b_K; 0]$, $V' = [V; b_V; 0]$ with the optional appended rows (module docstring).
    Heads split the projected width head-major (``(h d)``: head $h$ is columns $hd:(h+1)d$, the
    ``b n (h d)`` layout of PyTorch/HF). ``num_kv_heads < num_heads`` gives GQA (MQA for 1) with
    ``kv_group_map`` as in SDPA.

    Parameters
    ----------
    x : array (..., N, C)
    context : array (..., M, Cc), optional
        Keys source (and values source without ``value``) for cross-attention; same leading axes
        as ``x``. PyTorch's ``key``.
    params : dict
        ``q_proj (C, H*d)``, ``k_proj (Cc, Hkv*d)``, ``v_proj (Cv, Hkv*dv)``, ``out_proj (H*dv, C_out)``,
        optional ``q_proj_bias`` … ``out_proj_bias``, and optional ``bias_k (Hkv*d,)``,
        ``bias_v (Hkv*dv,)`` (both or neither: PyTorch ``add_bias_kv=True``).
        From ``torch.nn.MultiheadAttention(E, H, batch_first=True)`` (packed in-projection):
        ``q_proj = in_proj_weight[:E].T``, ``k_proj = in_proj_weight[E:2E].T``,
        ``v_proj = in_proj_weight[2E:].T``, ``*_bias`` the matching slices of ``in_proj_bias``,
        ``out_proj = out_proj.weight.T``, ``out_proj_bias = out_proj.bias``, ``bias_k =
        bias_k.reshape(-1)``, ``bias_v = bias_v.reshape(-1)`` (with ``kdim/vdim`` set, use
        ``q_proj_weight.T`` etc.). HF ``q_proj/k_proj/v_proj/o_proj`` Linear layers map by
        ``.weight.T``.
    value : array (..., M, Cv), optional
        A separate values source (PyTorch's ``value`` with ``vdim``); default ``context`` (or ``x``).
    num_heads, num_kv_heads
        $H$ and $H_{kv}$ (default $H$).
    attn_mask : bool or float array broadcastable to (..., H, N, M), optional
        True = keep (PyTorch: True = masked, pass ``~mask``; a float mask is additive in both;
        PyTorch's 3-D ``(B*H, N, M)`` mask is ``reshape(B, H, N, M)``).
    key_padding_mask : bool or float array broadcastable to (..., M), optional
        Per key, True = keep (PyTorch ``key_padding_mask``: True = padding, pass ``~mask``);
        float: additive. Combined with ``attn_mask`` (AND for booleans, sum for floats).
    is_causal, causal_alignment, scale, softcap, kv_group_map
        As :func:`sdpa_forward`; the default scale is $1/\sqrt{d}$ with $d$ the *head* width. The
        causal mask covers the original keys only.
    add_zero_attn : bool
        Append a zero key/value row after the projections (and after ``bias_k``/``bias_v``), as
        PyTorch ``add_zero_attn=True``.

    Backward
    --------
    ``dY -> dW_O = O^\top dY``, ``dO = dY W_O^\top``; the SDPA VJP per head gives $dQ, dK', dV'$;
    the appended rows give $db_K, db_V$ (summed over the batch); then $dW_Q = X^\top dQ$,
    $dX = dQ\,W_Q^\top$ and likewise for K and V, whose input gradients accumulate into $dX$ for
    self-attention and into $dC$ / ``d value`` for cross-attention.
    """
    x = as_float(x, "x", min_ndim=2)
    num_heads = check_size(num_heads, "num_heads")
    num_kv_heads = num_heads if num_kv_heads is None else check_size(num_kv_heads, "num_kv_heads")
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    if context is not None:
        context = as_float(context, "context", ndim=x.ndim)
        if context.shape[:-2] != x.shape[:-2]:
            raise ValueError(f"context must have x's leading axes {x.shape[:-2]}; got context {context.shape}")
    src = x if context is None else context
    if value is not None:
        value = as_float(value, "value", ndim=x.ndim)
        if value.shape[:-1] != src.shape[:-1]:
            raise ValueError(f"value must have the keys' leading axes and length {src.shape[:-1]} (the "
                             f"{'context' if context is not None else 'x'} shape without its last axis); "
                             f"got value {value.shape}")
    vsrc = src if value is None else value
    if not isinstance(add_zero_attn, (bool, np.bool_)):
        raise TypeError(f"add_zero_attn must be a bool; got {type(add_zero_attn).__name__}")
    if params is None:
        raise TypeError("params is required: a dict with q_proj, k_proj, v_proj, out_proj")
    w, b, kvb, d, dv = _validate_mha_params(params, x.shape[-1], src.shape[-1], vsrc.shape[-1], num_heads,
                                            num_kv_heads)
    dt = compute_dtype(x, src, vsrc, *w.values(), *b.values(), *kvb.values())
    x, src, vsrc = x.astype(dt, copy=False), src.astype(dt, copy=False), vsrc.astype(dt, copy=False)
    w, b, kvb = cast_all(dt, w), cast_all(dt, b), cast_all(dt, kvb)
    lead, n, m = x.shape[:-2], x.shape[-2], src.shape[-2]
    n_extra = int(bool(kvb)) + int(bool(add_zero_attn))
    mask, causal = _keys_mask(attn_mask, key_padding_mask, is_causal, causal_alignment, lead, num_heads, n, m,
                              n_extra, dt)
    kp = linear_apply(src, w["k_proj"], b.get("k_proj"))
    vp = linear_apply(vsrc, w["v_proj"], b.get("v_proj"))
    rows_k, rows_v = [kp], [vp]
    if kvb:
        rows_k.append(np.broadcast_to(kvb["bias_k"], lead + (1, kvb["bias_k"].shape[0])))
        rows_v.append(np.broadcast_to(kvb["bias_v"], lead + (1, kvb["bias_v"].shape[0])))
    if add_zero_attn:
        rows_k.append(np.zeros(lead + (1, kp.shape[-1]), dtype=dt))
        rows_v.append(np.zeros(lead + (1, vp.shape[-1]), dtype=dt))
    if n_extra:
        kp, vp = np.concatenate(rows_k, axis=-2), np.concatenate(rows_v, axis=-2)
    qh = split_heads(linear_apply(x, w["q_proj"], b.get("q_proj")), num_heads, d)
    kh = split_heads(kp, num_kv_heads, d)
    vh = split_heads(vp, num_kv_heads, dv)
    o, core = attention_core_forward(qh, kh, vh, attn_mask=mask, is_causal=causal,
                                     causal_alignment=causal_alignment, scale=scale, softcap=softcap,
                                     kv_group_map=kv_group_map)
    oc = merge_heads(o)
    y = linear_apply(oc, w["out_proj"], b.get("out_proj"))
    cache = {"x": x, "src": src, "vsrc": vsrc, "self": context is None, "has_value": value is not None, "w": w,
             "has_bias": set(b), "kv_bias": bool(kvb), "m": m, "core": core, "oc": oc, "y_shape": y.shape}
    return y, cache


def mha_backward(dout, cache):
    """Gradient of :func:`mha_forward`: ``x`` (and ``context``, ``value``), every weight and given bias."""
    w, core = cache["w"], cache["core"]
    x, src, vsrc = cache["x"], cache["src"], cache["vsrc"]
    g = as_dout(dout, cache["y_shape"], x.dtype)
    grads = {}
    go = linear_vjp(g, cache["oc"], w["out_proj"], "out_proj" in cache["has_bias"])
    h, _, dv = core["out"].shape[-3:]
    gc = attention_core_backward(split_heads(go["x"], h, dv), core)
    dk, dvv = merge_heads(gc["k"]), merge_heads(gc["v"])
    m = cache["m"]
    if cache["kv_bias"]:  # row m of every sequence is the appended bias row: sum over the batch
        grads["bias_k"] = dk[..., m, :].reshape(-1, dk.shape[-1]).sum(axis=0)
        grads["bias_v"] = dvv[..., m, :].reshape(-1, dvv.shape[-1]).sum(axis=0)
    dk, dvv = dk[..., :m, :], dvv[..., :m, :]
    gq = linear_vjp(merge_heads(gc["q"]), x, w["q_proj"], "q_proj" in cache["has_bias"])
    gk = linear_vjp(dk, src, w["k_proj"], "k_proj" in cache["has_bias"])
    gv = linear_vjp(dvv, vsrc, w["v_proj"], "v_proj" in cache["has_bias"])
    dsrc = gk["x"] if cache["has_value"] else gk["x"] + gv["x"]
    if cache["self"]:
        grads["x"] = gq["x"] + dsrc
    else:
        grads["x"] = gq["x"]
        grads["context"] = dsrc
    if cache["has_value"]:
        grads["value"] = gv["x"]
    for name, gg in (("q_proj", gq), ("k_proj", gk), ("v_proj", gv), ("out_proj", go)):
        grads[name] = gg["weight"]
        if "bias" in gg:
            grads[name + "_bias"] = gg["bias"]
    return grads


def mha(x, context=None, params=None, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`mha_forward`."""
    return mha_forward(x, context, params, **config)[0]


def init_mha_params(rng, c: int, num_heads: int, head_dim: int, *, num_kv_heads=None, c_context=None,
                    c_out=None, v_head_dim=None, bias: bool = True) -> dict:
    """Random MHA parameters (xavier-uniform-like weights, small random biases) for tests and demos."""
    hkv = num_heads if num_kv_heads is None else num_kv_heads
    cc = c if c_context is None else c_context
    dv = head_dim if v_head_dim is None else v_head_dim
    co = c if c_out is None else c_out
    shapes = {"q_proj": (c, num_heads * head_dim), "k_proj": (cc, hkv * head_dim),
              "v_proj": (cc, hkv * dv), "out_proj": (num_heads * dv, co)}
    p = {}
    for n, (i, o) in shapes.items():
        lim = np.sqrt(6.0 / (i + o))
        p[n] = rng.uniform(-lim, lim, (i, o))
        if bias:
            p[n + "_bias"] = 0.1 * rng.standard_normal(o)
    return p


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _reference_mha(x, context=None, params=None, *, value=None, num_heads, num_kv_heads=None, attn_mask=None,
                   key_padding_mask=None, is_causal=False, causal_alignment="top_left", scale=None, softcap=None,
                   kv_group_map="contiguous", add_zero_attn=False):
    # Explicit: einsum projections, rows appended by concatenation, masks as keep/bias arrays over
    # the original keys, then the per-(batch, head, query) loop of naive_attention.
    P = params
    src = x if context is None else context
    vs = src if value is None else value

    def lin(a, name):
        return np.einsum("...i,io->...o", a, P[name]) + P.get(name + "_bias", 0.0)

    q, k, v = lin(x, "q_proj"), lin(src, "k_proj"), lin(vs, "v_proj")
    lead, n, m = x.shape[:-2], x.shape[-2], k.shape[-2]
    if "bias_k" in P:
        k = np.concatenate([k, np.broadcast_to(P["bias_k"], lead + (1, k.shape[-1]))], axis=-2)
        v = np.concatenate([v, np.broadcast_to(P["bias_v"], lead + (1, v.shape[-1]))], axis=-2)
    if add_zero_attn:
        k = np.concatenate([k, np.zeros(lead + (1, k.shape[-1]))], axis=-2)
        v = np.concatenate([v, np.zeros(lead + (1, v.shape[-1]))], axis=-2)
    h = num_heads
    hkv = h if num_kv_heads is None else num_kv_heads

    def heads(t, nh):
        return np.moveaxis(t.reshape(t.shape[:-1] + (nh, t.shape[-1] // nh)), -2, -3)

    qh, kh, vh = heads(q, h), heads(k, hkv), heads(v, hkv)
    shape = lead + (h, n, k.shape[-2])
    keep, bias = np.ones(shape, bool), np.zeros(shape)
    for mk in (attn_mask, None if key_padding_mask is None else np.asarray(key_padding_mask)[..., None, None, :]):
        if mk is None:
            continue
        mk = np.broadcast_to(mk, shape[:-1] + (m,))
        if mk.dtype == np.bool_:
            keep[..., :m] &= mk
        else:
            keep[..., :m] &= np.isfinite(mk)
            bias[..., :m] += np.where(np.isfinite(mk), mk, 0.0)
    if is_causal:
        keep[..., :m] &= causal_keep(n, m, causal_alignment)
    o = naive_attention(qh, kh, vh, bias=bias, keep=keep, scale=scale, softcap=softcap, kv_group_map=kv_group_map)
    oc = np.moveaxis(o, -3, -2).reshape(lead + (n, -1))
    return oc @ P["out_proj"] + P.get("out_proj_bias", 0.0)


def _check_mha_zero_attn_closed_form(rng):
    # add_zero_attn appends a logit 0 with value 0: o_i = sum_j e^{s_ij} v_j / (sum_j e^{s_ij} + 1)
    x = rng.standard_normal((2, 4, 3))
    p = init_mha_params(rng, 3, 1, 2, bias=False)
    y = mha(x, params=p, num_heads=1, add_zero_attn=True)
    q, k, v = x @ p["q_proj"], x @ p["k_proj"], x @ p["v_proj"]
    e = np.exp(q @ np.swapaxes(k, -1, -2) / np.sqrt(2))
    err = float(np.abs(y - (e @ v) / (e.sum(-1, keepdims=True) + 1.0) @ p["out_proj"]).max())
    assert err < 1e-12, err
    return err


def _check_mha_appended_rows_gradcheck(rng):
    # FD over every input and parameter with all of torch's options at once: separate value input,
    # add_bias_kv, add_zero_attn, key_padding_mask, additive attn_mask.
    from ...registry import Sample
    from ...testing import gradcheck

    x, ctx, val = rng.standard_normal((2, 3, 3)), rng.standard_normal((2, 4, 2)), rng.standard_normal((2, 4, 3))
    p = init_mha_params(rng, 3, 2, 2, c_context=2)
    p["v_proj"] = rng.uniform(-0.6, 0.6, (3, 4))
    p["bias_k"], p["bias_v"] = rng.standard_normal(4), rng.standard_normal(4)
    kpm = np.array([[True, True, False, True], [True, False, True, True]])
    am = np.where(rng.random((3, 4)) < 0.2, -np.inf, 0.3 * rng.standard_normal((3, 4)))
    s = Sample(inputs={"x": x, "context": ctx, "value": val}, params=p,
               config={"num_heads": 2, "add_zero_attn": True, "key_padding_mask": kpm, "attn_mask": am})
    return gradcheck(mha_forward, mha_backward, s).max_rel


def _check_mha_h1_is_sdpa(rng):
    x = rng.standard_normal((2, 5, 4))
    p = init_mha_params(rng, 4, 1, 3, bias=False)
    y = mha(x, params=p, num_heads=1)
    o = sdpa((x @ p["q_proj"])[:, None], (x @ p["k_proj"])[:, None], (x @ p["v_proj"])[:, None])[:, 0]
    err = float(np.abs(y - o @ p["out_proj"]).max())
    assert err < 1e-12, err
    return err


def _check_mha_key_bias_grad_zero(rng):
    x = rng.standard_normal((2, 5, 6))
    p = init_mha_params(rng, 6, 2, 3)
    y, c = mha_forward(x, params=p, num_heads=2)
    g = mha_backward(rng.standard_normal(y.shape), c)
    err = float(np.abs(g["k_proj_bias"]).max())
    assert err < 1e-12, err
    return err


def _check_mha_value_bias(rng):
    # rows of P sum to 1, so b_V adds exactly b_V W_O to every output row and dL/db_V = sum_i G_i W_O^T
    x, ctx = rng.standard_normal((2, 4, 5)), rng.standard_normal((2, 7, 3))
    p = init_mha_params(rng, 5, 2, 3, c_context=3)
    p0 = dict(p, v_proj_bias=np.zeros_like(p["v_proj_bias"]))
    y, c = mha_forward(x, ctx, p, num_heads=2)
    e1 = float(np.abs(y - mha(x, ctx, p0, num_heads=2) - p["v_proj_bias"] @ p["out_proj"]).max())
    G = rng.standard_normal(y.shape)
    dbv = mha_backward(G, c)["v_proj_bias"]
    e2 = float(np.abs(dbv - (G @ p["out_proj"].T).sum(axis=(0, 1))).max())
    assert e1 < 1e-12 and e2 < 1e-12, (e1, e2)
    return max(e1, e2)


register(
    Mechanism(
        slug="multi_head_attention", family="1-softmax", tier="T1",
        title="Multi-head self/cross attention with q/k/v/out projections",
        paper="Vaswani et al., Attention Is All You Need, NeurIPS 2017, arXiv 1706.03762",
        forward=mha_forward, backward=mha_backward, sample=sample_mha, reference=_reference_mha,
        docs="softmax-attention.md#multi-head-attention",
        checks={"h1_is_sdpa": _check_mha_h1_is_sdpa, "key_bias_grad_zero": _check_mha_key_bias_grad_zero,
                "value_bias_closed_form": _check_mha_value_bias,
                "zero_attn_closed_form": _check_mha_zero_attn_closed_form,
                "appended_rows_gradcheck": _check_mha_appended_rows_gradcheck},
    ),
)
