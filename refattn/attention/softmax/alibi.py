r"""ALiBi: Attention with Linear Biases (reference slopes, symmetric option, learnable slopes).

ALiBi builds on `attention_core_forward` of `refattn.attention.softmax.core` (a differentiable
additive score bias) and shares with the relative position encodings
(`refattn.attention.softmax.relative`) one convention for *where* query $i$ sits relative to the
keys when $N \ne M$: the relative distance is $j - (i + o)$ (`relative_positions`) with $o = 0$ for
``causal_alignment="top_left"`` (PyTorch) and $o = M - N$ for ``"bottom_right"`` (KV-cache
decoding: flash-attn's ALiBi uses $|i + M - N - j|$). The same keyword aligns the causal mask, so
the two always agree.

Press, Smith, Lewis, "Train Short, Test Long: Attention with Linear Biases Enables Input Length
Extrapolation", ICLR 2022, arXiv 2108.12409; official code ofirpress/attention_with_linear_biases
@ 4b92f28a005ead2567abe2359f633e73e08f3833 (``get_slopes`` in its fairseq ``models/transformer.py``).
The full layer ``alibi_layer_forward`` is that repository's decoder self-attention (fairseq
``MultiheadAttention`` with ``q_proj``/``k_proj``/``v_proj``/``out_proj``); a module written from it
agrees in float64 within $6\times10^{-16}$ relative, output and every gradient.

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
"""

from __future__ import annotations

import math

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_param_keys, check_params, compute_dtype, validate_qkv
from ...nn.linear import linear_prefixed, linear_prefixed_spec, linear_prefixed_vjp, merge_heads, split_heads
from ...registry import Mechanism, Sample, register
from ._samples import random_qkv_heads
from .core import (
    attention_core_backward,
    attention_core_forward,
    causal_keep,
    check_size,
    naive_attention,
    relative_positions,
    sum_to_shape,
)
from .sdpa import sdpa

__all__ = ["alibi_slopes", "alibi_bias", "alibi_attention_forward", "alibi_attention_backward", "alibi_layer_forward",
           "alibi_layer_backward", "alibi_layer"]


def alibi_slopes(num_heads: int) -> np.ndarray:
    """Head slopes of ALiBi exactly as the reference ``get_slopes(n)`` (ofirpress), float64 ``(H,)``."""
    num_heads = check_size(num_heads, "num_heads")

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
    dist = _alibi_distance(check_size(n, "n"), check_size(m, "m"), symmetric, causal_alignment)
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
# The full layer (the official fairseq decoder's self-attention)

_ALIBI_PROJ = ("q_proj", "k_proj", "v_proj", "out_proj")


def alibi_layer_forward(x, params, *, num_heads: int, is_causal: bool = True, symmetric: bool = False,
                        attn_mask=None, scale=None):
    r"""ALiBi self-attention layer as the official code runs it: fairseq ``MultiheadAttention``
    (``self_attention=True``) of ofirpress/attention_with_linear_biases, with the decoder's
    ``buffered_future_mask`` (causal $-\infty$ plus the ALiBi bias) as its ``attn_mask``.

    $$Q = XW_q + b_q,\ K = XW_k + b_k,\ V = XW_v + b_v,\qquad
    Y = \big[\mathrm{softmax}(s\,Q_hK_h^\top + B_h)\,V_h\big]_h\,W_o + b_o,$$

    $s = d^{-1/2}$ (fairseq ``scaling``, applied to $Q$ after its bias), $B_h$ the ALiBi bias of
    :func:`alibi_attention_forward` (upstream adds $m_h j$, which differs by the row constant
    $m_h i$: the same softmax).

    Parameters
    ----------
    x : array (B.., N, C)
        Token-major (fairseq is time-major ``(T, B, C)``: pass ``x.transpose(1, 0, 2)``).
    params : dict
        Upstream ``state_dict`` names, ``nn.Linear`` weights ``(in, out)`` (PyTorch ``weight.T``):
        ``q_proj.weight (C, C)``, ``q_proj.bias (C,)``, likewise ``k_proj``, ``v_proj``,
        ``out_proj`` (biases optional: fairseq ``bias=False``); optional ``alibi_slopes (H,)``
        for learnable slopes (upstream: fixed :func:`alibi_slopes`).
    num_heads : int
        $H$ (upstream ``decoder_attention_heads``); $d = C/H$.
    is_causal, symmetric, attn_mask, scale
        As :func:`alibi_attention_forward` (upstream: causal, not symmetric, $d^{-1/2}$). A fairseq
        ``key_padding_mask`` (True = pad) is ``attn_mask=~kpm[:, None, None, :]``.

    Backward
    --------
    $dW_o$, $db_o$ from $Z^\top G$; :func:`alibi_attention_backward` gives $dQ, dK, dV$ (and
    the slopes' gradient when learnable); then $dW_p = X^\top dP$, $db_p = \sum dP$ and
    $dX = \sum_p dP\,W_p^\top$ over $p \in \{q, k, v\}$.
    """
    x = as_float(x, "x", min_ndim=2)
    h = check_size(num_heads, "num_heads")
    c = x.shape[-1]
    if c % h:
        raise ValueError(f"num_heads={h} must divide the embedding width C={c} of x")
    spec = {}
    for name in _ALIBI_PROJ:
        spec.update(linear_prefixed_spec(name, c, c))
    spec["alibi_slopes"] = (h,)
    optional = tuple(f"{n}.bias" for n in _ALIBI_PROJ) + ("alibi_slopes",)
    p = check_params(params, spec, optional=optional, where="alibi_layer")
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    q, k, v = (split_heads(linear_prefixed(p, name, x), h) for name in _ALIBI_PROJ[:3])
    core_params = {"alibi_slopes": p["alibi_slopes"]} if "alibi_slopes" in p else None
    o, core = alibi_attention_forward(q, k, v, core_params, is_causal=is_causal, symmetric=symmetric,
                                      attn_mask=attn_mask, scale=scale)
    merged = merge_heads(o)
    y = linear_prefixed(p, "out_proj", merged)
    return y, {"x": x, "p": p, "core": core, "merged": merged, "h": h, "shape": y.shape}


def alibi_layer_backward(dout, cache):
    """Gradients of :func:`alibi_layer_forward` for ``x`` and every params key."""
    x, p, h = cache["x"], cache["p"], cache["h"]
    g = as_dout(dout, cache["shape"], x.dtype)
    grads: dict = {}
    dm = linear_prefixed_vjp(grads, p, "out_proj", g, cache["merged"])
    gc = alibi_attention_backward(split_heads(dm, h), cache["core"])
    dx = 0.0
    for key, name in zip("qkv", _ALIBI_PROJ[:3]):
        dx = dx + linear_prefixed_vjp(grads, p, name, merge_heads(gc[key]), x)
    if "alibi_slopes" in gc:
        grads["alibi_slopes"] = gc["alibi_slopes"]
    grads["x"] = dx
    return grads


def alibi_layer(x, params, **config):
    """Convenience wrapper: the output of :func:`alibi_layer_forward`."""
    return alibi_layer_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample_alibi(rng, size):
    if size == "tiny":
        h, n, m, d = 2, int(rng.integers(2, 4)), int(rng.integers(2, 5)), 2
    else:
        h, n, m, d = int(rng.choice([3, 4, 6])), int(rng.integers(4, 9)), int(rng.integers(4, 10)), 3
    q, k, v = random_qkv_heads(rng, 2, h, h, n, m, d, d)
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
    q, k, v = random_qkv_heads(rng, 2, 3, 3, 5, 5, 4, 2)
    out = alibi_attention_forward(q, k, v, {"alibi_slopes": np.zeros(3)})[0]
    err = float(np.abs(out - sdpa(q, k, v, is_causal=True)).max())
    assert err < 1e-12, err
    return err


def _check_alibi_reference_form(rng):
    # the official code adds +m_h * j (a row shift of -m_h (i - j)): same causal attention
    q, k, v = random_qkv_heads(rng, 2, 4, 4, 6, 6, 3, 2)
    slopes = alibi_slopes(4)
    ref_form = slopes[:, None, None] * np.arange(6)[None, None, :]
    from .additive_bias import biased_attention_forward as biased
    a = biased(q, k, v, np.broadcast_to(ref_form, (4, 6, 6)), is_causal=True)[0]
    err = float(np.abs(a - alibi_attention_forward(q, k, v)[0]).max())
    assert err < 1e-12, err
    return err


def _check_alibi_translation(rng):
    # decoding the last 2 queries against the cache equals the last rows of full causal attention
    q, k, v = random_qkv_heads(rng, 2, 2, 2, 6, 6, 3, 2)
    full = alibi_attention_forward(q, k, v)[0]
    last = alibi_attention_forward(q[:, :, 4:], k, v, causal_alignment="bottom_right")[0]
    err = float(np.abs(last - full[:, :, 4:]).max())
    assert err < 1e-12, err
    b1 = alibi_bias(4, 4, np.ones(1), symmetric=True)
    assert np.array_equal(b1, alibi_bias(4, 4, np.ones(1), symmetric=True).transpose(0, 2, 1))
    return err


def _check_alibi_layer_gradcheck(rng):
    """The full layer (fairseq q/k/v/out projections with biases around the core): FD gradcheck of x
    and every parameter, fixed slopes (causal) and learnable slopes (symmetric, bidirectional)."""
    from ...testing import gradcheck

    c, worst = 4, 0.0
    for learn in (False, True):
        params = {}
        for name in _ALIBI_PROJ:
            params[f"{name}.weight"] = 0.6 * rng.standard_normal((c, c))
            params[f"{name}.bias"] = 0.2 * rng.standard_normal(c)
        cfg = {"num_heads": 2}
        if learn:
            params["alibi_slopes"] = rng.uniform(0.1, 0.6, 2)
            cfg.update(is_causal=False, symmetric=True)
        s = Sample(inputs={"x": rng.standard_normal((2, 3, c))}, params=params, config=cfg)
        worst = max(worst, gradcheck(alibi_layer_forward, alibi_layer_backward, s).max_rel)
    return worst


register(
    Mechanism(
        slug="alibi", family="1-softmax", tier="T1",
        title="ALiBi: linear distance biases (reference slopes, symmetric option, learnable slopes)",
        paper="Press, Smith, Lewis, Train Short, Test Long, ICLR 2022, arXiv 2108.12409",
        forward=alibi_attention_forward, backward=alibi_attention_backward, sample=_sample_alibi,
        reference=_alibi_reference, docs="softmax-attention.md#alibi",
        checks={"reference_slopes": _check_alibi_slopes, "zero_slopes_is_causal_sdpa": _check_alibi_zero_slopes,
                "official_row_shift_form": _check_alibi_reference_form, "translation": _check_alibi_translation,
                "layer_gradcheck": _check_alibi_layer_gradcheck},
    ),
)
