r"""Position biases for softmax attention: ALiBi, Shaw relative positions, T5 bucketed bias.

All three build on :func:`refattn.attention.softmax.attention_core_forward` (a differentiable
additive score bias) and share one convention for *where* query $i$ sits relative to the keys
when $N \ne M$: the relative distance is $j - (i + o)$ with $o = 0$ for
``causal_alignment="top_left"`` (PyTorch) and $o = M - N$ for ``"bottom_right"`` (KV-cache
decoding: HF T5 offsets query positions by the cache length, flash-attn's ALiBi uses
$|i + M - N - j|$). The same keyword aligns the causal mask, so the two always agree.

ALiBi
-----
Press, Smith, Lewis, "Train Short, Test Long: Attention with Linear Biases Enables Input Length
Extrapolation", ICLR 2022, arXiv 2108.12409; official code ofirpress/attention_with_linear_biases
(``get_slopes`` in its fairseq ``models/transformer.py``).

$$B_{h,ij} = -m_h\,\big((i + o) - j\big)\quad(\texttt{symmetric=False}),\qquad
B_{h,ij} = -m_h\,\lvert (i + o) - j\rvert\quad(\texttt{symmetric=True}).$$

Slopes: for $H = 2^a$, $m_h = 2^{-8(h+1)/H}$ (start $= $ ratio $= 2^{-2^{-(\log_2 H - 3)}}$); otherwise
the reference takes the $2^{\lfloor\log_2 H\rfloor}$ slopes and appends every other slope of
the $2^{\lfloor\log_2 H\rfloor + 1}$ set (:func:`alibi_slopes` follows that recursion exactly).
The reference adds $m_h\,j$ under a causal mask, which differs from $-m_h(i - j)$ by the row
constant $m_h i$ and gives the same softmax. The bidirectional (``symmetric``) form is the one
flash-attn applies without a causal mask and the baseline in catalogue seed [5-30].
Learnable slopes (``params={"alibi_slopes": (H,)}``, flash-attn's argument name) have gradient

$$dm_h = -\sum_{b,i,j} dS_{b,h,ij}\,\delta_{ij},\qquad \delta_{ij} = (i+o) - j\ \text{or}\ |(i+o)-j|.$$

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
``scale=1.0`` is the T5 default here. Table gradient: the scatter-add of
:func:`refattn.attention.softmax.scatter_bias_grad`.
"""

from __future__ import annotations

import math

import numpy as np

from ..._checks import as_dout, as_float, check_choice, check_param_keys, check_positive, validate_qkv
from ...registry import Mechanism, Sample, register
from .core import (
    CAUSAL_ALIGNMENTS,
    _check_size,
    attention_core_backward,
    attention_core_forward,
    biased_attention_backward,
    biased_attention_forward,
    causal_keep,
    naive_attention,
    sdpa,
    sum_to_shape,
)

__all__ = [
    "alibi_slopes",
    "alibi_bias",
    "alibi_attention_forward",
    "alibi_attention_backward",
    "relative_positions",
    "t5_relative_position_bucket",
    "shaw_attention_forward",
    "shaw_attention_backward",
    "t5_attention_forward",
    "t5_attention_backward",
    "relative_position_attention_forward",
    "relative_position_attention_backward",
]


def _query_offset(n, m, causal_alignment):
    check_choice(causal_alignment, "causal_alignment", CAUSAL_ALIGNMENTS)
    return 0 if causal_alignment == "top_left" else m - n


def relative_positions(n: int, m: int, causal_alignment: str = "top_left") -> np.ndarray:
    """Integer ``(n, m)`` matrix of relative positions $j - (i + o)$ (memory minus query position)."""
    o = _query_offset(n, m, causal_alignment)
    return np.arange(m)[None, :] - (np.arange(n)[:, None] + o)


# --------------------------------------------------------------------------------------------
# ALiBi


def alibi_slopes(num_heads: int) -> np.ndarray:
    """Head slopes of ALiBi exactly as the reference ``get_slopes(n)`` (ofirpress), float64 ``(H,)``."""
    num_heads = _check_size(num_heads, "num_heads")

    def power_of_2(n):
        start = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [start * start**i for i in range(n)]

    def slopes(n):
        if math.log2(n).is_integer():
            return power_of_2(n)
        closest = 2 ** math.floor(math.log2(n))
        return power_of_2(closest) + slopes(2 * closest)[0::2][: n - closest]

    return np.array(slopes(num_heads), dtype=np.float64)


def _alibi_distance(n, m, symmetric, causal_alignment):
    d = -relative_positions(n, m, causal_alignment)  # (i + o) - j
    return np.abs(d) if symmetric else d


def alibi_bias(n: int, m: int, slopes, *, symmetric: bool = False, causal_alignment: str = "top_left") -> np.ndarray:
    r"""ALiBi bias ``(H, n, m)``: $-m_h\,((i+o) - j)$, or $-m_h|(i+o)-j|$ when ``symmetric``."""
    slopes = as_float(slopes, "slopes", ndim=1)
    dist = _alibi_distance(_check_size(n, "n"), _check_size(m, "m"), symmetric, causal_alignment)
    return -slopes[:, None, None] * dist


def alibi_attention_forward(q, k, v, params=None, *, is_causal: bool = True, symmetric: bool = False,
                            causal_alignment: str = "top_left", attn_mask=None, scale=None,
                            kv_group_map: str = "contiguous"):
    r"""Attention with Linear Biases (see the module docstring for the formula and conventions).

    Parameters
    ----------
    q (..., H, N, d), k (..., Hkv, M, d), v (..., Hkv, M, dv)
    params : {"alibi_slopes": (H,)}, optional
        Learnable slopes; default: the fixed reference slopes :func:`alibi_slopes` (no gradient).
    is_causal : bool
        Default True (ALiBi was introduced for causal LMs); with ``symmetric=False`` and no causal
        mask, future keys get a *positive* bias that grows with distance.
    symmetric : bool
        $|i - j|$ distances (flash-attn non-causal ALiBi, [5-30]).
    causal_alignment, attn_mask, scale, kv_group_map
        As :func:`refattn.attention.softmax.sdpa_forward`; the alignment also sets the query
        position offset $o$.

    Returns
    -------
    out, cache
        ``alibi_attention_backward(dout, cache)`` gives ``q, k, v`` (and ``alibi_slopes``).
    """
    q, k, v = validate_qkv(q, k, v)
    if not isinstance(symmetric, (bool, np.bool_)):
        raise TypeError(f"symmetric must be a bool; got {type(symmetric).__name__}")
    h, n, m = q.shape[-3], q.shape[-2], k.shape[-2]
    learn = False
    if params is not None:
        check_param_keys(params, (), ("alibi_slopes",), where="alibi_attention (alibi_slopes: (H,))")
        learn = "alibi_slopes" in params
    if learn:
        slopes = as_float(params["alibi_slopes"], "alibi_slopes", ndim=1)
        if slopes.shape[0] != h:
            raise ValueError(f"alibi_slopes must have shape (H={h},); got {slopes.shape}")
    else:
        slopes = alibi_slopes(h)
    dist = _alibi_distance(n, m, bool(symmetric), causal_alignment)
    dt = np.result_type(q, k, v, slopes) if learn else np.result_type(q, k, v)
    bias = -slopes.astype(dt, copy=False)[:, None, None] * dist.astype(dt)
    out, cache = attention_core_forward(q, k, v, bias, attn_mask=attn_mask, is_causal=is_causal,
                                        causal_alignment=causal_alignment, scale=scale, kv_group_map=kv_group_map)
    cache["alibi"] = {"learn": learn, "dist": dist}
    return out, cache


def alibi_attention_backward(dout, cache):
    r"""Gradient of :func:`alibi_attention_forward`; ``alibi_slopes``: $dm_h = -\sum dS_{h,ij}\delta_{ij}$."""
    g = attention_core_backward(dout, cache)
    out = {"q": g["q"], "k": g["k"], "v": g["v"]}
    if cache["alibi"]["learn"]:
        db = sum_to_shape(g["bias"], g["bias"].shape[-3:])
        out["alibi_slopes"] = -np.einsum("hij,ij->h", db, cache["alibi"]["dist"].astype(db.dtype))
    return out


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
    num_buckets = _check_size(num_buckets, "num_buckets", 2)
    max_distance = _check_size(max_distance, "max_distance", 1)
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
    kmax = _check_size(max_relative_position, "max_relative_position", 0)
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

RPE_KINDS = ("shaw", "t5")


def relative_position_attention_forward(q, k, v, params, *, kind: str = "shaw", max_relative_position=None,
                                        bidirectional: bool = True, num_buckets: int = 32, max_distance: int = 128,
                                        scale=None, is_causal: bool = False, causal_alignment: str = "top_left",
                                        kv_group_map: str = "contiguous"):
    """Dispatch to :func:`shaw_attention_forward` (``kind="shaw"``) or :func:`t5_attention_forward`
    (``kind="t5"``; here ``scale=None`` means $1/\\sqrt d$, pass ``1.0`` for T5's convention)."""
    check_choice(kind, "kind", RPE_KINDS)
    if kind == "shaw":
        if max_relative_position is None:
            raise ValueError("kind='shaw' needs max_relative_position")
        out, cache = shaw_attention_forward(q, k, v, params, max_relative_position=max_relative_position, scale=scale,
                                            is_causal=is_causal, causal_alignment=causal_alignment,
                                            kv_group_map=kv_group_map)
    else:
        out, cache = t5_attention_forward(q, k, v, params, bidirectional=bidirectional, num_buckets=num_buckets,
                                          max_distance=max_distance, scale=scale, is_causal=is_causal,
                                          causal_alignment=causal_alignment, kv_group_map=kv_group_map)
    cache["rpe_kind"] = kind
    return out, cache


def relative_position_attention_backward(dout, cache):
    """Gradient of :func:`relative_position_attention_forward` (Shaw or T5 backward)."""
    if cache["rpe_kind"] == "shaw":
        return shaw_attention_backward(dout, cache)
    return t5_attention_backward(dout, cache)


# --------------------------------------------------------------------------------------------
# Records


def _qkv(rng, b, h, hkv, n, m, d, dv):
    return (rng.standard_normal((b, h, n, d)), rng.standard_normal((b, hkv, m, d)),
            rng.standard_normal((b, hkv, m, dv)))


def _sample_alibi(rng, size):
    if size == "tiny":
        h, n, m, d = 2, int(rng.integers(2, 4)), int(rng.integers(2, 5)), 2
    else:
        h, n, m, d = int(rng.choice([3, 4, 6])), int(rng.integers(4, 9)), int(rng.integers(4, 10)), 3
    q, k, v = _qkv(rng, 2, h, h, n, m, d, d)
    symmetric = bool(rng.random() < 0.5)
    cfg = {"symmetric": symmetric, "is_causal": not symmetric,
           "causal_alignment": "bottom_right" if m >= n else "top_left"}
    return Sample(inputs={"q": q, "k": k, "v": v}, params={"alibi_slopes": alibi_slopes(h) * rng.uniform(0.5, 2.0, h)},
                  config=cfg)


def _alibi_reference(q, k, v, params=None, *, is_causal=True, symmetric=False, causal_alignment="top_left", **_):
    h, n, m = q.shape[-3], q.shape[-2], k.shape[-2]
    slopes = params["alibi_slopes"] if params else alibi_slopes(h)
    o = 0 if causal_alignment == "top_left" else m - n
    bias = np.zeros((h, n, m))
    for hh in range(h):
        for i in range(n):
            for j in range(m):
                dist = (i + o) - j
                bias[hh, i, j] = -slopes[hh] * (abs(dist) if symmetric else dist)
    keep = causal_keep(n, m, causal_alignment) if is_causal else None
    return naive_attention(q, k, v, bias=bias, keep=keep)


def _check_alibi_slopes(rng):
    # closed forms: H = 2^a -> 2^{-8(h+1)/H}; H = 2^a + r -> the 2^a set + 2^{-8(2t+1)/2^{a+1}}, t < r
    err = 0.0
    for h in (1, 2, 4, 8, 12, 16, 20, 24, 6):
        p2 = 2 ** int(math.floor(math.log2(h)))
        ref = [2.0 ** (-8.0 * (t + 1) / p2) for t in range(p2)]
        ref += [2.0 ** (-8.0 * (2 * t + 1) / (2 * p2)) for t in range(h - p2)]
        err = max(err, float(np.abs(alibi_slopes(h) - np.array(ref)).max() / np.max(ref)))
    assert err < 1e-14, err
    assert np.allclose(alibi_slopes(8), [1 / 2 ** (i + 1) for i in range(8)], rtol=1e-15)
    return err


def _check_alibi_zero_slopes(rng):
    q, k, v = _qkv(rng, 2, 3, 3, 5, 5, 4, 2)
    out = alibi_attention_forward(q, k, v, {"alibi_slopes": np.zeros(3)})[0]
    err = float(np.abs(out - sdpa(q, k, v, is_causal=True)).max())
    assert err < 1e-12, err
    return err


def _check_alibi_reference_form(rng):
    # the official code adds +m_h * j (a row shift of -m_h (i - j)): same causal attention
    q, k, v = _qkv(rng, 2, 4, 4, 6, 6, 3, 2)
    slopes = alibi_slopes(4)
    ref_form = slopes[:, None, None] * np.arange(6)[None, None, :]
    from .core import biased_attention_forward as biased
    a = biased(q, k, v, np.broadcast_to(ref_form, (4, 6, 6)), is_causal=True)[0]
    err = float(np.abs(a - alibi_attention_forward(q, k, v)[0]).max())
    assert err < 1e-12, err
    return err


def _check_alibi_translation(rng):
    # decoding the last 2 queries against the cache equals the last rows of full causal attention
    q, k, v = _qkv(rng, 2, 2, 2, 6, 6, 3, 2)
    full = alibi_attention_forward(q, k, v)[0]
    last = alibi_attention_forward(q[:, :, 4:], k, v, causal_alignment="bottom_right")[0]
    err = float(np.abs(last - full[:, :, 4:]).max())
    assert err < 1e-12, err
    b1 = alibi_bias(4, 4, np.ones(1), symmetric=True)
    assert np.array_equal(b1, alibi_bias(4, 4, np.ones(1), symmetric=True).transpose(0, 2, 1))
    return err


def _sample_rpe(rng, size, kind=None):
    kind = kind or str(rng.choice(RPE_KINDS))
    if size == "tiny":
        h, hkv, n, m, d, dv = 2, 2, int(rng.integers(2, 4)), int(rng.integers(2, 5)), 2, 2
    else:
        h, hkv, n, m, d, dv = 4, int(rng.choice([2, 4])), int(rng.integers(4, 9)), int(rng.integers(4, 11)), 3, 2
    q, k, v = _qkv(rng, 2, h, hkv, n, m, d, dv)
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
    s = 1.0 / np.sqrt(d) if scale is None else scale
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
    q, k, v = _qkv(rng, 2, 2, 2, 4, 5, 3, 2)
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


register(
    Mechanism(
        slug="alibi", family="1-softmax", tier="T1",
        title="ALiBi: linear distance biases (reference slopes, symmetric option, learnable slopes)",
        paper="Press, Smith, Lewis, Train Short, Test Long, ICLR 2022, arXiv 2108.12409",
        forward=alibi_attention_forward, backward=alibi_attention_backward, sample=_sample_alibi,
        reference=_alibi_reference, docs="softmax-attention.md#alibi",
        checks={"reference_slopes": _check_alibi_slopes, "zero_slopes_is_causal_sdpa": _check_alibi_zero_slopes,
                "official_row_shift_form": _check_alibi_reference_form, "translation": _check_alibi_translation},
    ),
    Mechanism(
        slug="relative_position_encodings", family="1-softmax", tier="T1",
        title="Shaw relative positions (clipped key/value tables) and T5 bucketed relative bias",
        paper="Shaw, Uszkoreit, Vaswani, NAACL 2018, arXiv 1803.02155; Raffel et al., T5, JMLR 2020, arXiv 1910.10683",
        forward=relative_position_attention_forward, backward=relative_position_attention_backward,
        sample=_sample_rpe, reference=_rpe_reference, docs="softmax-attention.md#relative-position-encodings",
        checks={"t5_buckets_match_reference": _check_t5_buckets, "shaw_k0": _check_shaw_k0,
                "gradcheck_shaw": _gradcheck_kind("shaw"), "gradcheck_t5": _gradcheck_kind("t5")},
    ),
)
