r"""Relative position encodings: Shaw relative positions (clipped key/value tables) and T5's bucketed
relative bias, under one record (``relative_position_encodings``, ``kind="shaw"`` or ``"t5"``).

Both build on `attention_core_forward` of `refattn.attention.softmax.core` (a differentiable
additive score bias) and share with ALiBi (`refattn.attention.softmax.alibi`) one convention for
*where* query $i$ sits relative to the keys when $N \ne M$: the relative distance is $j - (i + o)$
(`relative_positions`) with $o = 0$ for ``causal_alignment="top_left"`` (PyTorch) and $o = M - N$
for ``"bottom_right"`` (KV-cache decoding: HF T5 offsets query positions by the cache length). The
same keyword aligns the causal mask, so the two always agree.

Shaw relative positions
-----------------------
Shaw, Uszkoreit, Vaswani, "Self-Attention with Relative Position Representations", NAACL 2018,
arXiv 1803.02155; tensor2tensor ``common_attention.dot_product_attention_relative`` (tables
shared by all heads; relative position ``range_k[None, :] - range_q[:, None]``, i.e. $j - i$):

$$e_{ij} = s\,q_i\cdot\big(k_j + a^K_{c_{ij}}\big),\qquad
y_i = \sum_j \alpha_{ij}\big(v_j + a^V_{c_{ij}}\big),\qquad c_{ij} = \mathrm{clip}(j - (i+o), -K, K) + K.$$

Computed as $qa = q\,(a^K)^\top$ (``N x (2K+1)`` per head) gathered into a score bias
$B_{ij} = s\,qa_{i,c_{ij}}$, plus $W\,a^V$ with $W_{ic} = \sum_{j: c_{ij}=c}\alpha_{ij}$ (no
$N\times M\times d$ tensor). Backward: with $G$ upstream,
$da^V = \sum W^\top G$, an extra $dP_{ij} \mathrel{+}= (G\,(a^V)^\top)_{i,c_{ij}}$ into the softmax
VJP, then from $dB = dS$: $d(qa)_{ic} = s\sum_{j:c_{ij}=c} dS_{ij}$, $dq \mathrel{+}= d(qa)\,a^K$,
$da^K = \sum d(qa)^\top q$.

T5 relative bias
----------------
Raffel et al., "Exploring the Limits of Transfer Learning with a Unified Text-to-Text
Transformer", JMLR 2020, arXiv 1910.10683; bucket function from mesh-tensorflow
``transformer/transformer_layers.py::_relative_position_bucket`` (HF ``T5Attention._relative_position_bucket``):
$B_{h,ij} = \beta[\mathrm{bucket}(j - (i+o)), h]$ with table ``relative_attention_bias``
``(num_buckets, H)``; bidirectional: half the buckets per sign; exact buckets for
$|r| <$ ``max_exact`` $=$ ``num_buckets/2`` (of the half), log-spaced up to ``max_distance``, all
further distances share the last bucket. The log is evaluated in float32 as upstream
(``tf.to_float`` / ``.float()``). T5 does **not** scale by $1/\sqrt d$ (its init absorbs it):
``scale=1.0`` is the T5 default here, also through the record's dispatcher. Table gradient: the
scatter-add of :func:`refattn.attention.softmax.additive_bias.scatter_bias_grad`.

The full layer ``t5_attention_layer_forward`` is HF ``T5Attention`` (bias-free ``q``/``k``/``v``/``o``
projections under their ``state_dict`` names, optional ``relative_attention_bias.weight``, self- or
cross-attention). Upstream: huggingface/transformers @ 6b8b757dfcb582379a64f013cdce46c43629f2b0
``src/transformers/models/t5/modeling_t5.py``; a module written from it agrees in float64 within
$7.5\times10^{-16}$ relative, output and every gradient (``tests/test_fidelity_layers.py``).
"""

from __future__ import annotations

import math

import numpy as np

from ..._checks import (
    as_dout,
    as_float,
    cast_all,
    check_choice,
    check_int,
    check_params,
    check_positive,
    compute_dtype,
    validate_qkv,
)
from ...nn.linear import linear_prefixed, linear_prefixed_spec, linear_prefixed_vjp, merge_heads, split_heads
from ...registry import Mechanism, Sample, register
from ._samples import random_qkv_heads
from .additive_bias import biased_attention_backward, biased_attention_forward
from .core import attention_core_backward, attention_core_forward, causal_keep, check_size, relative_positions
from .sdpa import sdpa

__all__ = [
    "RPE_KINDS",
    "t5_relative_position_bucket",
    "t5_attention_forward",
    "t5_attention_backward",
    "shaw_attention_forward",
    "shaw_attention_backward",
    "relative_position_attention_forward",
    "relative_position_attention_backward",
    "t5_attention_layer_forward",
    "t5_attention_layer_backward",
    "t5_attention_layer",
]

RPE_KINDS = ("shaw", "t5")


# --------------------------------------------------------------------------------------------
# T5 buckets


def t5_relative_position_bucket(relative_position, *, bidirectional: bool = True, num_buckets: int = 32,
                                max_distance: int = 128) -> np.ndarray:
    """T5's bucket of each relative position (memory minus query), as mesh-tensorflow/HF.

    Integer array of the input's shape with values in ``[0, num_buckets)``.
    """
    rp = np.asarray(relative_position)
    if rp.dtype.kind not in "iu":
        raise TypeError(f"relative_position must be an integer array; got dtype {rp.dtype}")
    num_buckets = check_size(num_buckets, "num_buckets", 2)
    max_distance = check_size(max_distance, "max_distance", 1)
    ret = np.zeros(rp.shape, dtype=np.int64)
    n = -rp.astype(np.int64)
    if bidirectional:
        num_buckets //= 2
        ret += (n < 0) * num_buckets
        n = np.abs(n)
    else:
        n = np.maximum(n, 0)
    max_exact = num_buckets // 2
    if max_exact < 1 or max_distance <= max_exact:
        raise ValueError(f"need num_buckets >= {4 if bidirectional else 2} and max_distance > max_exact "
                         f"({max_exact}); got num_buckets={num_buckets * (2 if bidirectional else 1)}, "
                         f"max_distance={max_distance}")
    is_small = n < max_exact
    # float32 as upstream (tf.to_float / torch .float()); n >= 1 inside the log avoids log(0)
    ratio = np.maximum(n, 1).astype(np.float32) / np.float32(max_exact)
    large = max_exact + (np.log(ratio) / np.float32(math.log(max_distance / max_exact))
                         * np.float32(num_buckets - max_exact)).astype(np.int64)
    large = np.minimum(large, num_buckets - 1)
    return ret + np.where(is_small, n, large)


def t5_attention_forward(q, k, v, params, *, bidirectional: bool = True, num_buckets: int = 32,
                         max_distance: int = 128, scale=1.0, is_causal: bool = False,
                         causal_alignment: str = "top_left", attn_mask=None, kv_group_map: str = "contiguous"):
    r"""Attention with T5's bucketed relative position bias.

    $S_{h,ij} = s\,q_i\cdot k_j + \beta[\mathrm{bucket}(j - (i+o)), h]$, ``params =
    {"relative_attention_bias": (num_buckets, H)}`` (HF ``T5Attention.relative_attention_bias.weight``,
    no transpose needed). ``scale`` defaults to 1.0 (T5; pass ``None`` for $1/\sqrt d$).
    Encoder: ``bidirectional=True``; decoder self-attention: ``bidirectional=False, is_causal=True``.
    """
    q, k, v = validate_qkv(q, k, v)
    if not isinstance(params, dict) or "relative_attention_bias" not in params:
        raise TypeError("params must be a dict {'relative_attention_bias': (num_buckets, H)}")
    extra = sorted(set(params) - {"relative_attention_bias"})
    if extra:
        raise ValueError(f"params has unknown keys {extra}; expected 'relative_attention_bias'")
    table = as_float(params["relative_attention_bias"], "relative_attention_bias", ndim=2)
    if table.shape[0] != num_buckets:
        raise ValueError(f"relative_attention_bias must have num_buckets={num_buckets} rows; got {table.shape}")
    if table.shape[1] != q.shape[-3]:
        raise ValueError(f"relative_attention_bias must have shape (num_buckets, H={q.shape[-3]}); got {table.shape}")
    if not isinstance(bidirectional, (bool, np.bool_)):
        raise TypeError(f"bidirectional must be a bool; got {type(bidirectional).__name__}")
    buckets = t5_relative_position_bucket(relative_positions(q.shape[-2], k.shape[-2], causal_alignment),
                                          bidirectional=bool(bidirectional), num_buckets=num_buckets,
                                          max_distance=max_distance)
    out, cache = biased_attention_forward(q, k, v, params={"table": table}, index_map=buckets, attn_mask=attn_mask,
                                          is_causal=is_causal, causal_alignment=causal_alignment, scale=scale,
                                          kv_group_map=kv_group_map)
    return out, cache


def t5_attention_backward(dout, cache):
    """Gradient of :func:`t5_attention_forward`: ``q, k, v, relative_attention_bias`` (bucket scatter-add)."""
    g = biased_attention_backward(dout, cache)
    return {"q": g["q"], "k": g["k"], "v": g["v"], "relative_attention_bias": g["table"]}


# --------------------------------------------------------------------------------------------
# Shaw


def shaw_attention_forward(q, k, v, params, *, max_relative_position: int, scale=None, is_causal: bool = False,
                           causal_alignment: str = "top_left", attn_mask=None, kv_group_map: str = "contiguous"):
    r"""Shaw et al. relative position attention (see the module docstring).

    Parameters
    ----------
    q (..., H, N, d), k (..., Hkv, M, d), v (..., Hkv, M, dv)
    params : dict
        ``relative_positions_keys`` $a^K$ ``(2K+1, d)`` and optional ``relative_positions_values``
        $a^V$ ``(2K+1, dv)`` (tensor2tensor variable scopes; shared by all heads).
    max_relative_position : int
        The clipping distance $K \ge 0$.
    scale
        Default $1/\sqrt d$ (tensor2tensor scales $q$ by $d^{-1/2}$).
    """
    q, k, v = validate_qkv(q, k, v)
    kmax = check_size(max_relative_position, "max_relative_position", 0)
    if not isinstance(params, dict) or "relative_positions_keys" not in params:
        raise TypeError("params must be a dict with 'relative_positions_keys' (2K+1, d) "
                        "and optional 'relative_positions_values' (2K+1, dv)")
    extra = sorted(set(params) - {"relative_positions_keys", "relative_positions_values"})
    if extra:
        raise ValueError(f"params has unknown keys {extra}")
    ak = as_float(params["relative_positions_keys"], "relative_positions_keys", ndim=2)
    if ak.shape != (2 * kmax + 1, q.shape[-1]):
        raise ValueError(f"relative_positions_keys must have shape (2K+1={2 * kmax + 1}, d={q.shape[-1]}); "
                         f"got {ak.shape}")
    av = params.get("relative_positions_values")
    if av is not None:
        av = as_float(av, "relative_positions_values", ndim=2)
        if av.shape != (2 * kmax + 1, v.shape[-1]):
            raise ValueError(f"relative_positions_values must have shape (2K+1={2 * kmax + 1}, dv={v.shape[-1]}); "
                             f"got {av.shape}")
    dt = np.result_type(q, k, v, ak, *(() if av is None else (av,)))
    q, ak = q.astype(dt, copy=False), ak.astype(dt, copy=False)
    av = None if av is None else av.astype(dt, copy=False)
    n, m = q.shape[-2], k.shape[-2]
    c = np.clip(relative_positions(n, m, causal_alignment), -kmax, kmax) + kmax
    onehot = (c[..., None] == np.arange(2 * kmax + 1)).astype(dt)  # (N, M, 2K+1)
    scale = check_positive(scale, "scale", allow_none=True)
    s = float(1.0 / np.sqrt(q.shape[-1])) if scale is None else scale
    qa = q @ ak.T  # (..., H, N, 2K+1): the key term enters the scores scaled by s
    bias = s * np.einsum("...nc,nmc->...nm", qa, onehot)
    out, cache = attention_core_forward(q, k.astype(dt, copy=False), v.astype(dt, copy=False), bias,
                                        attn_mask=attn_mask, is_causal=is_causal, causal_alignment=causal_alignment,
                                        scale=s, kv_group_map=kv_group_map)
    w = None
    if av is not None:
        w = np.einsum("...nm,nmc->...nc", cache["p"], onehot)
        out = out + w @ av
    cache["shaw"] = {"onehot": onehot, "ak": ak, "av": av, "w": w, "s": s, "q": q}
    cache["out_total_shape"] = out.shape
    return out, cache


def shaw_attention_backward(dout, cache):
    """Gradient of :func:`shaw_attention_forward`: ``q, k, v, relative_positions_keys`` (and ``_values``)."""
    sh = cache["shaw"]
    onehot, ak, av, w = sh["onehot"], sh["ak"], sh["av"], sh["w"]
    g = as_dout(dout, cache["out_total_shape"], ak.dtype)
    grads = {}
    dp = None
    if av is not None:
        grads["relative_positions_values"] = w.reshape(-1, w.shape[-1]).T @ g.reshape(-1, g.shape[-1])
        dp = np.einsum("...nc,nmc->...nm", g @ av.T, onehot)
    gc = attention_core_backward(g, cache, dp=dp)
    dqa = sh["s"] * np.einsum("...nm,nmc->...nc", gc["bias"], onehot)
    out = {"q": gc["q"] + dqa @ ak, "k": gc["k"], "v": gc["v"],
           "relative_positions_keys": dqa.reshape(-1, dqa.shape[-1]).T @ sh["q"].reshape(-1, sh["q"].shape[-1])}
    out.update(grads)
    return out


# --------------------------------------------------------------------------------------------
# The relative_position_encodings record: one forward for both kinds


def relative_position_attention_forward(q, k, v, params, *, kind: str = "shaw", max_relative_position=None,
                                        bidirectional: bool = True, num_buckets: int = 32, max_distance: int = 128,
                                        scale=None, is_causal: bool = False, causal_alignment: str = "top_left",
                                        kv_group_map: str = "contiguous"):
    """Dispatch to :func:`shaw_attention_forward` (``kind="shaw"``) or :func:`t5_attention_forward`
    (``kind="t5"``). ``scale=None`` is each kind's upstream convention: $1/\\sqrt d$ for Shaw
    (tensor2tensor), **no scale** (1.0) for T5 (HF ``T5Attention``, mesh-tensorflow); pass
    ``scale=d**-0.5`` to scale T5's scores."""
    check_choice(kind, "kind", RPE_KINDS)
    if kind == "shaw":
        if max_relative_position is None:
            raise ValueError("kind='shaw' needs max_relative_position")
        out, cache = shaw_attention_forward(q, k, v, params, max_relative_position=max_relative_position, scale=scale,
                                            is_causal=is_causal, causal_alignment=causal_alignment,
                                            kv_group_map=kv_group_map)
    else:
        out, cache = t5_attention_forward(q, k, v, params, bidirectional=bidirectional, num_buckets=num_buckets,
                                          max_distance=max_distance, scale=1.0 if scale is None else scale,
                                          is_causal=is_causal,
                                          causal_alignment=causal_alignment, kv_group_map=kv_group_map)
    cache["rpe_kind"] = kind
    return out, cache


def relative_position_attention_backward(dout, cache):
    """Gradient of :func:`relative_position_attention_forward` (Shaw or T5 backward)."""
    if cache["rpe_kind"] == "shaw":
        return shaw_attention_backward(dout, cache)
    return t5_attention_backward(dout, cache)


# --------------------------------------------------------------------------------------------
# The full T5 attention layer (HF T5Attention)

_T5_PROJ = ("q", "k", "v", "o")


def t5_attention_layer_forward(x, params, *, num_heads: int, key_value_states=None, is_decoder: bool = False,
                               is_causal: bool = False, num_buckets: int = 32, max_distance: int = 128,
                               attn_mask=None):
    r"""T5 attention layer: HF ``T5Attention`` (huggingface/transformers
    ``src/transformers/models/t5/modeling_t5.py``), self- or cross-attention, without cache.

    $$Q = XW_q,\ K = X_{kv}W_k,\ V = X_{kv}W_v,\qquad
    Y = \big[\mathrm{softmax}(Q_hK_h^\top + B_h + \mathrm{mask})\,V_h\big]_h\,W_o,$$

    **no** $1/\sqrt d$ scale (T5's initialisation absorbs it), $B_h$ the bucketed relative bias of
    :func:`t5_attention_forward` (relative position $j - i$, ``bidirectional = not is_decoder``) when
    ``params`` holds ``relative_attention_bias.weight`` (upstream ``has_relative_attention_bias``:
    the first block's self-attention) and zero otherwise (upstream's zero ``position_bias``; the
    other blocks receive the first block's bias, which is this layer's ``attn_mask`` argument).

    Parameters
    ----------
    x : array (B.., N, C)
        ``hidden_states``.
    params : dict
        Upstream ``state_dict`` names, ``nn.Linear`` weights ``(in, out)`` (PyTorch ``weight.T``),
        all bias-free as upstream: ``q.weight (C, H*d)``, ``k.weight (C_kv, H*d)``,
        ``v.weight (C_kv, H*d)``, ``o.weight (H*d, C_out)``; optional
        ``relative_attention_bias.weight (num_buckets, H)`` (the ``nn.Embedding`` weight, no transpose).
    num_heads : int
        $H$; $d$ is inferred from ``q.weight``.
    key_value_states : array (B.., M, C_kv), optional
        Cross-attention memory (the encoder output); default: self-attention on ``x``.
    is_decoder : bool
        Upstream ``config.is_decoder``: unidirectional buckets (``bidirectional=False``).
    is_causal : bool
        Causal mask (what T5's decoder passes as its extended attention mask).
    num_buckets, max_distance
        ``config.relative_attention_num_buckets`` (32), ``relative_attention_max_distance`` (128).
    attn_mask : bool or float array broadcastable to (B.., H, N, M), optional
        True = keep, or additive (upstream's ``mask``, e.g. ``(B, 1, 1, M)`` padding); not differentiated.

    Returns
    -------
    out, cache
        ``out (B.., N, C_out)``; :func:`t5_attention_layer_backward` returns ``"x"``,
        ``"key_value_states"`` when given, and every params key.

    Backward
    --------
    $dW_o = Z^\top G$; the core's backward (:func:`t5_attention_backward`, which scatter-adds
    $dS$ into the bucket table, or the plain softmax-attention backward without a table); then
    $dW_p = X_p^\top dP$ and $dX = dQ\,W_q^\top$, $dX_{kv} = dK\,W_k^\top + dV\,W_v^\top$ (summed
    into $dX$ for self-attention).
    """
    x = as_float(x, "x", min_ndim=2)
    h = check_int(num_heads, "num_heads", minimum=1)
    if not isinstance(params, dict) or "q.weight" not in params:
        raise ValueError("params must be a dict containing 'q.weight' of shape (C, num_heads * d_kv)")
    cross = key_value_states is not None
    kv = as_float(key_value_states, "key_value_states", min_ndim=2) if cross else x
    if cross and kv.shape[:-2] != x.shape[:-2]:
        raise ValueError(f"key_value_states must have the batch dims {x.shape[:-2]} of x; got {kv.shape}")
    qw = np.shape(params["q.weight"])
    c, ckv = x.shape[-1], kv.shape[-1]
    if len(qw) != 2 or qw[0] != c or qw[1] % h:
        raise ValueError(f"q.weight must have shape (C={c}, num_heads * d_kv) with num_heads={h}; got {qw}")
    inner = qw[1]
    ow = np.shape(params.get("o.weight", ()))
    c_out = ow[1] if len(ow) == 2 else c
    spec = {**linear_prefixed_spec("q", c, inner, False), **linear_prefixed_spec("k", ckv, inner, False),
            **linear_prefixed_spec("v", ckv, inner, False), **linear_prefixed_spec("o", inner, c_out, False),
            "relative_attention_bias.weight": (num_buckets, h)}
    p = check_params(params, spec, optional=("relative_attention_bias.weight",), where="t5_attention_layer")
    if not isinstance(is_decoder, (bool, np.bool_)):
        raise TypeError(f"is_decoder must be a bool; got {type(is_decoder).__name__}")
    dt = compute_dtype(x, kv, *p.values())
    x, kv, p = x.astype(dt, copy=False), kv.astype(dt, copy=False), cast_all(dt, p)
    q, k, v = (split_heads(linear_prefixed(p, name, src), h) for name, src in (("q", x), ("k", kv), ("v", kv)))
    if "relative_attention_bias.weight" in p:
        o, core = t5_attention_forward(q, k, v, {"relative_attention_bias": p["relative_attention_bias.weight"]},
                                       bidirectional=not is_decoder, num_buckets=num_buckets,
                                       max_distance=max_distance, scale=1.0, is_causal=is_causal, attn_mask=attn_mask)
    else:
        o, core = attention_core_forward(q, k, v, attn_mask=attn_mask, is_causal=is_causal, scale=1.0)
    merged = merge_heads(o)
    y = linear_prefixed(p, "o", merged)
    return y, {"x": x, "kv": kv if cross else None, "p": p, "core": core, "merged": merged, "h": h, "shape": y.shape}


def t5_attention_layer_backward(dout, cache):
    """Gradients of :func:`t5_attention_layer_forward` for ``x`` (and ``key_value_states``) and every params key."""
    x, p, h = cache["x"], cache["p"], cache["h"]
    g = as_dout(dout, cache["shape"], x.dtype)
    grads: dict = {}
    dm = linear_prefixed_vjp(grads, p, "o", g, cache["merged"])
    if "relative_attention_bias.weight" in p:
        gc = t5_attention_backward(split_heads(dm, h), cache["core"])
        grads["relative_attention_bias.weight"] = gc["relative_attention_bias"]
    else:
        gc = attention_core_backward(split_heads(dm, h), cache["core"])
    kv = x if cache["kv"] is None else cache["kv"]
    dx = linear_prefixed_vjp(grads, p, "q", merge_heads(gc["q"]), x)
    dkv = linear_prefixed_vjp(grads, p, "k", merge_heads(gc["k"]), kv)
    dkv = dkv + linear_prefixed_vjp(grads, p, "v", merge_heads(gc["v"]), kv)
    if cache["kv"] is None:
        grads["x"] = dx + dkv
    else:
        grads["x"], grads["key_value_states"] = dx, dkv
    return grads


def t5_attention_layer(x, params, **config):
    """Convenience wrapper: the output of :func:`t5_attention_layer_forward`."""
    return t5_attention_layer_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample_rpe(rng, size, kind=None):
    kind = kind or str(rng.choice(RPE_KINDS))
    if size == "tiny":
        h, hkv, n, m, d, dv = 2, 2, int(rng.integers(2, 4)), int(rng.integers(2, 5)), 2, 2
    else:
        h, hkv, n, m, d, dv = 4, int(rng.choice([2, 4])), int(rng.integers(4, 9)), int(rng.integers(4, 11)), 3, 2
    q, k, v = random_qkv_heads(rng, 2, h, hkv, n, m, d, dv)
    cfg = {"kind": kind, "is_causal": bool(rng.random() < 0.5),
           "causal_alignment": "bottom_right" if m >= n else "top_left", "scale": float(rng.uniform(0.4, 1.0))}
    if kind == "shaw":
        kk = int(rng.integers(1, 3))
        cfg["max_relative_position"] = kk
        params = {"relative_positions_keys": rng.standard_normal((2 * kk + 1, d)),
                  "relative_positions_values": rng.standard_normal((2 * kk + 1, dv))}
    else:
        cfg.update(num_buckets=8, max_distance=16, bidirectional=not cfg["is_causal"])
        params = {"relative_attention_bias": rng.standard_normal((8, h))}
    return Sample(inputs={"q": q, "k": k, "v": v}, params=params, config=cfg)


def _rpe_reference(q, k, v, params, *, kind="shaw", max_relative_position=None, bidirectional=True, num_buckets=32,
                   max_distance=128, scale=None, is_causal=False, causal_alignment="top_left", kv_group_map="contiguous"):
    # explicit per-entry formulas: e_ij = s q_i.(k_j + aK_c), y_i = sum_j a_ij (v_j + aV_c); T5 per-entry bucket
    h, n, d = q.shape[-3:]
    m = k.shape[-2]
    o = 0 if causal_alignment == "top_left" else m - n
    s = (1.0 / np.sqrt(d) if kind == "shaw" else 1.0) if scale is None else scale
    keep = causal_keep(n, m, causal_alignment) if is_causal else np.ones((n, m), bool)
    r = h // k.shape[-3]
    out = np.zeros(q.shape[:-1] + (v.shape[-1],))
    for b in range(q.shape[0]):
        for hh in range(h):
            g = hh // r if kv_group_map == "contiguous" else hh % k.shape[-3]
            for i in range(n):
                e, vals = [], []
                for j in range(m):
                    rel = j - (i + o)
                    if kind == "shaw":
                        c = min(max(rel, -max_relative_position), max_relative_position) + max_relative_position
                        e.append(s * q[b, hh, i] @ (k[b, g, j] + params["relative_positions_keys"][c]))
                        vals.append(v[b, g, j] + params["relative_positions_values"][c])
                    else:
                        bk = int(t5_relative_position_bucket(np.array(rel), bidirectional=bidirectional,
                                                             num_buckets=num_buckets, max_distance=max_distance))
                        e.append(s * q[b, hh, i] @ k[b, g, j] + params["relative_attention_bias"][bk, hh])
                        vals.append(v[b, g, j])
                e = np.where(keep[i], np.array(e), -np.inf)
                if not keep[i].any():
                    continue
                w = np.exp(e - e.max())
                out[b, hh, i] = (w / w.sum()) @ np.array(vals)
    return out


def _bucket_python(r, bidirectional, num_buckets, max_distance):
    # a plain-Python transcription of mesh-tensorflow's _relative_position_bucket (one int at a time)
    ret, n = 0, -r
    if bidirectional:
        num_buckets //= 2
        ret += num_buckets if n < 0 else 0
        n = abs(n)
    else:
        n = max(n, 0)
    max_exact = num_buckets // 2
    if n < max_exact:
        return ret + n
    val = max_exact + int(math.log(n / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact))
    return ret + min(val, num_buckets - 1)


def _check_t5_buckets(rng):
    r = np.arange(-512, 513)
    for bidirectional in (True, False):
        for nb, md in ((32, 128), (8, 16), (64, 256)):
            got = t5_relative_position_bucket(r, bidirectional=bidirectional, num_buckets=nb, max_distance=md)
            ref = np.array([_bucket_python(int(x), bidirectional, nb, md) for x in r])
            assert np.array_equal(got, ref), (bidirectional, nb, md, np.nonzero(got != ref))
    assert t5_relative_position_bucket(np.array([0, -1, 1, -200]), num_buckets=32, max_distance=128).tolist() == \
        [0, 1, 17, 15]
    return 0.0


def _check_shaw_k0(rng):
    # K = 0: the key table adds q.a_0 to every score of a row (cancels: zero gradient) and the
    # value table adds a^V_0 to every output row
    q, k, v = random_qkv_heads(rng, 2, 2, 2, 4, 5, 3, 2)
    p = {"relative_positions_keys": rng.standard_normal((1, 3)), "relative_positions_values": rng.standard_normal((1, 2))}
    out, c = shaw_attention_forward(q, k, v, p, max_relative_position=0)
    e1 = float(np.abs(out - sdpa(q, k, v) - p["relative_positions_values"][0]).max())
    g = shaw_attention_backward(rng.standard_normal(out.shape), c)
    e2 = float(np.abs(g["relative_positions_keys"]).max())
    assert e1 < 1e-12 and e2 < 1e-12, (e1, e2)
    return max(e1, e2)


def _gradcheck_kind(kind):
    def check(rng):
        from ...testing import gradcheck
        s = _sample_rpe(rng, "tiny", kind)
        return gradcheck(relative_position_attention_forward, relative_position_attention_backward, s).max_rel
    return check


def _check_t5_default_unscaled(rng):
    """Through the record, kind='t5' without a scale is T5's convention (no 1/sqrt(d)), while Shaw
    keeps 1/sqrt(d); the check fails if the T5 default is scaled (d = 4, so 1/sqrt(d) != 1)."""
    q, k, v = random_qkv_heads(rng, 2, 2, 2, 4, 5, 4, 3)
    params = {"relative_attention_bias": rng.standard_normal((8, 2))}
    got = relative_position_attention_forward(q, k, v, params, kind="t5", num_buckets=8, max_distance=16)[0]
    want = t5_attention_forward(q, k, v, params, num_buckets=8, max_distance=16, scale=1.0)[0]
    scaled = t5_attention_forward(q, k, v, params, num_buckets=8, max_distance=16, scale=0.5)[0]
    assert np.abs(scaled - want).max() > 1e-3
    err = float(np.abs(got - want).max())
    assert err == 0.0, f"relative_position_attention_forward(kind='t5') without scale differs from scale=1.0 by {err}"
    return err


def _check_t5_layer_gradcheck(rng):
    """The full layer (HF T5Attention): FD gradcheck of x, key_value_states and every parameter,
    encoder self-attention with the bias table, and decoder cross-attention without it."""
    from ...testing import gradcheck

    c, h, d, worst = 3, 2, 2, 0.0
    for cross in (False, True):
        params = {f"{n}.weight": 0.6 * rng.standard_normal((c, h * d)) for n in "qkv"}
        params["o.weight"] = 0.6 * rng.standard_normal((h * d, c))
        inputs = {"x": rng.standard_normal((2, 3, c))}
        cfg = {"num_heads": h, "num_buckets": 6, "max_distance": 8}
        if cross:
            inputs["key_value_states"] = rng.standard_normal((2, 4, c))
            cfg["is_decoder"] = True
        else:
            params["relative_attention_bias.weight"] = rng.standard_normal((6, h))
        s = Sample(inputs=inputs, params=params, config=cfg)
        worst = max(worst, gradcheck(t5_attention_layer_forward, t5_attention_layer_backward, s).max_rel)
    return worst


register(
    Mechanism(
        slug="relative_position_encodings", family="1-softmax", tier="T1",
        title="Shaw relative positions (clipped key/value tables) and T5 bucketed relative bias",
        paper="Shaw, Uszkoreit, Vaswani, NAACL 2018, arXiv 1803.02155; Raffel et al., T5, JMLR 2020, arXiv 1910.10683",
        forward=relative_position_attention_forward, backward=relative_position_attention_backward,
        sample=_sample_rpe, reference=_rpe_reference, docs="softmax-attention.md#relative-position-encodings",
        checks={"t5_buckets_match_reference": _check_t5_buckets, "shaw_k0": _check_shaw_k0,
                "gradcheck_shaw": _gradcheck_kind("shaw"), "gradcheck_t5": _gradcheck_kind("t5"),
                "t5_default_unscaled": _check_t5_default_unscaled, "t5_layer_gradcheck": _check_t5_layer_gradcheck},
    ),
)
