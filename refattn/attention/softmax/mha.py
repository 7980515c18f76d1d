r"""Multi-head (self or cross) attention layer with q/k/v/out projections, token-major.

$$Q = XW_Q + b_Q,\quad K = CW_K + b_K,\quad V = CW_V + b_V,\quad
O_h = \mathrm{sdpa}(Q_h, K_{g(h)}, V_{g(h)}),\quad Y = [O_1\|\dots\|O_H]\,W_O + b_O,$$

$C = X$ for self-attention (``context=None``); any $C$ (with its own width and length) for
cross-attention. Heads split the projected width head-major (``(h d)``: head $h$ is columns
$hd:(h+1)d$, the ``b n (h d)`` layout of PyTorch/HF). Params: ``q_proj (C, H*d)``,
``k_proj (Cc, Hkv*d)``, ``v_proj (Cc, Hkv*dv)``, ``out_proj (H*dv, C_out)`` and optional
``*_bias``. ``num_kv_heads < num_heads`` gives GQA (MQA for 1) with ``kv_group_map`` as in SDPA:
the ``gqa_mqa`` record, `refattn.attention.softmax.gqa`. The default scale is $1/\sqrt{d}$ with
$d$ the *head* width.

Rotary positions (``rope=``): the composed reference of a decoder layer's attention
(HF ``LlamaAttention``: project, rotate $Q$ and $K$ per head, then the core),
$$\tilde Q_h = R_{\Theta}(p)\,Q_h,\quad \tilde K_h = R_{\Theta}(p')\,K_h,\quad
O_h = \mathrm{sdpa}(\tilde Q_h, \tilde K_{g(h)}, V_{g(h)}),$$
with `refattn.nn.rope` (its keywords: ``base`` $=\theta$, ``interleaved`` — False is HF/GPT-NeoX
rotate-half, True GPT-J/RoFormer pairs — ``rotary_dim``, ``offset``, ``positions``; and
``key_positions`` for the keys, default ``positions``). $V$ is not rotated. Backward: RoPE is
orthogonal, so $dQ_h = R_\Theta(p)^\top d\tilde Q_h$ (`rope_backward`), likewise $dK_h$.

Backward
--------
$dW_O = O^\top dY$, $dO = dY\,W_O^\top$ ($O$ the concatenated heads); the SDPA VJP per head (the
attention core, `refattn.attention.softmax.core`; derivation on the SDPA page) gives
$dQ, dK, dV$; then $dW_Q = X^\top dQ$, $dX = dQ\,W_Q^\top$ and likewise for K and V, whose input
gradients accumulate into $dX$ for self-attention and into $dC$ for cross-attention. Bias
gradients are the column sums of $dQ, dK, dV, dY$.

Loading PyTorch weights
-----------------------
``torch.nn.MultiheadAttention(E, H, batch_first=True)`` packs the in-projection:
``q_proj = in_proj_weight[:E].T``, ``k_proj = in_proj_weight[E:2E].T``,
``v_proj = in_proj_weight[2E:].T``, biases the same slices of ``in_proj_bias``,
``out_proj = out_proj.weight.T`` (see `mha_forward`). Its boolean ``attn_mask`` /
``key_padding_mask`` mean True = *masked* (refattn: True = keep). Pitfalls: the head layout
``(h d)`` vs ``(d h)`` must match the weights; scaling by the full width instead of the head width
(Set Transformer) is a different model.

Paper: Vaswani et al., "Attention Is All You Need", NeurIPS 2017, arXiv 1706.03762.
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_param_keys, compute_dtype
from ...nn.linear import linear_apply, linear_vjp, merge_heads, split_heads
from ...nn.rope import rope_backward, rope_forward
from ...registry import Mechanism, register
from ._samples import sample_mha
from .core import attention_core_backward, attention_core_forward, check_size
from .sdpa import sdpa

__all__ = ["MHA_WEIGHTS", "MHA_ROPE_KEYS", "mha_forward", "mha_backward", "mha", "init_mha_params"]

MHA_WEIGHTS = ("q_proj", "k_proj", "v_proj", "out_proj")
MHA_ROPE_KEYS = ("base", "interleaved", "rotary_dim", "offset", "positions", "key_positions")
"""Keys of ``mha_forward``'s ``rope=`` dict: `refattn.nn.rope.rope_forward`'s keywords, plus
``key_positions`` (the keys' positions, default ``positions``)."""


def _rope_options(rope) -> tuple[dict, dict] | None:
    """``rope=`` as (query, key) keyword dicts for `rope_forward`; None: no rotation."""
    if rope is None or rope is False:
        return None
    if rope is True:
        rope = {}
    if not isinstance(rope, dict):
        raise TypeError(f"rope must be None, True or a dict with keys from {list(MHA_ROPE_KEYS)}; "
                        f"got {type(rope).__name__}")
    unknown = sorted(set(rope) - set(MHA_ROPE_KEYS))
    if unknown:
        raise ValueError(f"rope has unknown keys {unknown}; allowed: {list(MHA_ROPE_KEYS)} "
                         f"(theta is 'base'; rotate-half is interleaved=False)")
    q_opts = {k: v for k, v in rope.items() if k != "key_positions"}
    k_opts = dict(q_opts)
    if rope.get("key_positions") is not None:
        k_opts["positions"] = rope["key_positions"]
    return q_opts, k_opts


def _rope_heads(xh, opts, name):
    try:
        return rope_forward(xh, **opts)
    except (ValueError, TypeError) as exc:
        raise type(exc)(f"rope on the {name} heads {xh.shape}: {exc}") from None


def _validate_mha_params(params, c, cc, num_heads, num_kv_heads):
    check_param_keys(params, MHA_WEIGHTS, [w + "_bias" for w in MHA_WEIGHTS],
                     where="mha (weights (in, out); PyTorch: weight.T)")
    w = {n: as_float(params[n], n, ndim=2) for n in MHA_WEIGHTS}
    b = {n: as_float(params[n + "_bias"], n + "_bias", ndim=1) for n in MHA_WEIGHTS if params.get(n + "_bias") is not None}
    h, hkv = num_heads, num_kv_heads
    if w["q_proj"].shape[0] != c or w["q_proj"].shape[1] % h:
        raise ValueError(f"q_proj must have shape (C={c}, H*d) with H={h} dividing the second axis; got {w['q_proj'].shape}")
    d = w["q_proj"].shape[1] // h
    if w["k_proj"].shape != (cc, hkv * d):
        raise ValueError(f"k_proj must have shape (C_context={cc}, Hkv*d={hkv * d}); got {w['k_proj'].shape}")
    if w["v_proj"].shape[0] != cc or w["v_proj"].shape[1] % hkv:
        raise ValueError(f"v_proj must have shape (C_context={cc}, Hkv*dv) with Hkv={hkv}; got {w['v_proj'].shape}")
    dv = w["v_proj"].shape[1] // hkv
    if w["out_proj"].shape[0] != h * dv:
        raise ValueError(f"out_proj must have shape (H*dv={h * dv}, C_out); got {w['out_proj'].shape}")
    for n, bb in b.items():
        if bb.shape[0] != w[n].shape[1]:
            raise ValueError(f"{n}_bias must have shape ({w[n].shape[1]},); got {bb.shape}")
    return w, b, d, dv


def mha_forward(x, context=None, params=None, *, num_heads: int, num_kv_heads=None, attn_mask=None,
                is_causal: bool = False, causal_alignment: str = "top_left", scale=None, softcap=None,
                kv_group_map: str = "contiguous", rope=None):
    r"""Multi-head (self or cross) attention with projections, token-major.

    $$Q = XW_Q + b_Q,\quad K = CW_K + b_K,\quad V = CW_V + b_V,\quad
    O_h = \mathrm{sdpa}(Q_h, K_{g(h)}, V_{g(h)}),\quad Y = [O_1\|\dots\|O_H]\,W_O + b_O,$$

    $C = X$ for self-attention (``context=None``). Heads split the projected width head-major
    (``(h d)``: head $h$ is columns $hd:(h+1)d$, the ``b n (h d)`` layout of PyTorch/HF).
    ``num_kv_heads < num_heads`` gives GQA (MQA for 1) with ``kv_group_map`` as in SDPA.

    Parameters
    ----------
    x : array (..., N, C)
    context : array (..., M, Cc), optional
        Keys/values source for cross-attention; same leading axes as ``x``.
    params : dict
        ``q_proj (C, H*d)``, ``k_proj (Cc, Hkv*d)``, ``v_proj (Cc, Hkv*dv)``, ``out_proj (H*dv, C_out)``,
        optional ``q_proj_bias`` … ``out_proj_bias``.
        From ``torch.nn.MultiheadAttention(E, H, batch_first=True)`` (packed in-projection):
        ``q_proj = in_proj_weight[:E].T``, ``k_proj = in_proj_weight[E:2E].T``,
        ``v_proj = in_proj_weight[2E:].T``, ``*_bias`` the matching slices of ``in_proj_bias``,
        ``out_proj = out_proj.weight.T``, ``out_proj_bias = out_proj.bias`` (with ``kdim/vdim``
        set, use ``q_proj_weight.T`` etc.). HF ``q_proj/k_proj/v_proj/o_proj`` Linear layers map
        by ``.weight.T``. Note ``nn.MultiheadAttention``'s boolean ``attn_mask`` and
        ``key_padding_mask`` mean True = *masked*; refattn's mean True = keep.
    num_heads, num_kv_heads
        $H$ and $H_{kv}$ (default $H$).
    attn_mask, is_causal, causal_alignment, scale, softcap, kv_group_map
        As :func:`sdpa_forward`; the default scale is $1/\sqrt{d}$ with $d$ the *head* width.
    rope : None, True or dict, optional
        Rotary embeddings on the projected query and key heads before the core (HF
        ``LlamaAttention``: ``apply_rotary_pos_emb`` after ``q_proj``/``k_proj``). A dict of
        `refattn.nn.rope.rope_forward` keywords: ``base`` ($\theta$, default 10000; HF
        ``rope_theta``), ``interleaved`` (default False = HF/GPT-NeoX rotate-half; True =
        GPT-J/RoFormer adjacent pairs), ``rotary_dim``, ``offset`` (KV-cache position offset),
        ``positions`` (default ``arange(N)``, HF ``position_ids``) and ``key_positions`` (the
        keys', default ``positions``; for cross-attention with M != N give both). ``True`` uses
        the defaults. None (default): no rotation.

    Backward
    --------
    ``dY -> dW_O = O^\top dY``, ``dO = dY W_O^\top``; the SDPA VJP per head gives $dQ, dK, dV$;
    then $dW_Q = X^\top dQ$, $dX = dQ\,W_Q^\top$ and likewise for K and V, whose input
    gradients accumulate into $dX$ for self-attention and into $dC$ for cross-attention.
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
    if params is None:
        raise TypeError("params is required: a dict with q_proj, k_proj, v_proj, out_proj")
    src = x if context is None else context
    w, b, d, dv = _validate_mha_params(params, x.shape[-1], src.shape[-1], num_heads, num_kv_heads)
    dt = compute_dtype(x, src, *w.values(), *b.values())
    x, src = x.astype(dt, copy=False), src.astype(dt, copy=False)
    w, b = cast_all(dt, w), cast_all(dt, b)
    qh = split_heads(linear_apply(x, w["q_proj"], b.get("q_proj")), num_heads, d)
    kh = split_heads(linear_apply(src, w["k_proj"], b.get("k_proj")), num_kv_heads, d)
    vh = split_heads(linear_apply(src, w["v_proj"], b.get("v_proj")), num_kv_heads, dv)
    rope_opts, rope_caches = _rope_options(rope), None
    if rope_opts is not None:
        qh, rq = _rope_heads(qh, rope_opts[0], "query")
        kh, rk = _rope_heads(kh, rope_opts[1], "key")
        rope_caches = (rq, rk)
    o, core = attention_core_forward(qh, kh, vh, attn_mask=attn_mask, is_causal=is_causal,
                                     causal_alignment=causal_alignment, scale=scale, softcap=softcap,
                                     kv_group_map=kv_group_map)
    oc = merge_heads(o)
    y = linear_apply(oc, w["out_proj"], b.get("out_proj"))
    cache = {"x": x, "src": src, "self": context is None, "w": w, "has_bias": set(b), "core": core, "oc": oc,
             "y_shape": y.shape, "rope": rope_caches}
    return y, cache


def mha_backward(dout, cache):
    """Gradient of :func:`mha_forward`: ``x`` (and ``context``), every weight and given bias."""
    w, core = cache["w"], cache["core"]
    x, src = cache["x"], cache["src"]
    g = as_dout(dout, cache["y_shape"], x.dtype)
    grads = {}
    go = linear_vjp(g, cache["oc"], w["out_proj"], "out_proj" in cache["has_bias"])
    h, _, dv = core["out"].shape[-3:]
    gc = attention_core_backward(split_heads(go["x"], h, dv), core)
    if cache["rope"] is not None:  # RoPE is orthogonal: rotate the head gradients back
        gc = dict(gc, q=rope_backward(gc["q"], cache["rope"][0])["x"], k=rope_backward(gc["k"], cache["rope"][1])["x"])
    gq = linear_vjp(merge_heads(gc["q"]), x, w["q_proj"], "q_proj" in cache["has_bias"])
    gk = linear_vjp(merge_heads(gc["k"]), src, w["k_proj"], "k_proj" in cache["has_bias"])
    gv = linear_vjp(merge_heads(gc["v"]), src, w["v_proj"], "v_proj" in cache["has_bias"])
    dsrc = gk["x"] + gv["x"]
    if cache["self"]:
        grads["x"] = gq["x"] + dsrc
    else:
        grads["x"] = gq["x"]
        grads["context"] = dsrc
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


def _check_mha_rope_is_rotated_sdpa(rng):
    # rope= is exactly: project, rotate q and k per head (refattn.nn.rope), SDPA, merge, project
    from ...nn.rope import rope

    x = rng.standard_normal((2, 6, 8))
    p = init_mha_params(rng, 8, 4, 4, num_kv_heads=2)
    err = 0.0
    for opts in ({"base": 500000.0}, {"base": 100.0, "interleaved": True, "offset": 3, "rotary_dim": 2}):
        y = mha(x, params=p, num_heads=4, num_kv_heads=2, is_causal=True, rope=opts)
        q = rope(split_heads(x @ p["q_proj"] + p["q_proj_bias"], 4, 4), **opts)
        k = rope(split_heads(x @ p["k_proj"] + p["k_proj_bias"], 2, 4), **opts)
        v = split_heads(x @ p["v_proj"] + p["v_proj_bias"], 2, 4)
        o = sdpa(q, k, v, is_causal=True)
        err = max(err, float(np.abs(y - (merge_heads(o) @ p["out_proj"] + p["out_proj_bias"])).max()))
    # and the rotation is relative: shifting every position by the same offset changes nothing
    y0 = mha(x, params=p, num_heads=4, num_kv_heads=2, is_causal=True, rope={"offset": 0})
    y5 = mha(x, params=p, num_heads=4, num_kv_heads=2, is_causal=True, rope={"offset": 5})
    err = max(err, float(np.abs(y0 - y5).max()))
    assert err < 1e-12, err
    return err


register(
    Mechanism(
        slug="multi_head_attention", family="1-softmax", tier="T1",
        title="Multi-head self/cross attention with q/k/v/out projections",
        paper="Vaswani et al., Attention Is All You Need, NeurIPS 2017, arXiv 1706.03762",
        forward=mha_forward, backward=mha_backward, sample=sample_mha,
        docs="softmax-attention.md#multi-head-attention",
        checks={"h1_is_sdpa": _check_mha_h1_is_sdpa, "key_bias_grad_zero": _check_mha_key_bias_grad_zero,
                "value_bias_closed_form": _check_mha_value_bias,
                "rope_is_rotated_sdpa": _check_mha_rope_is_rotated_sdpa},
    ),
)
