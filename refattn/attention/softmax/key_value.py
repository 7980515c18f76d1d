r"""Key-Value (query-free) attention: Borji's KV Transformer, symmetric and positional variants.

The query projection is dropped and the keys attend to themselves. Per head $h$ (width $d$,
$E = Hd$), with ``kv_proj`` producing keys and values in one matrix:

$$[K_h\,|\,V_h] = X W_{kv} + b_{kv}\ \ (\text{head-major, } 2d \text{ columns per head}),\qquad
A_h = s\,K_h K_h^\top,\quad s = d^{-1/2},$$

symmetric variant (``positional=False``, upstream ``attn_type='kv-nopos'``): $S_h = A_h$;
positional ("asymmetric") variant (``positional=True``, upstream ``attn_type='kv'``): a fixed 2-D
sinusoidal table $\mathcal E\in\mathbb R^{N\times N\times p}$ (`positional_encoding_2d`, the
``positional_encodings`` package's ``PositionalEncoding2D(p)`` that upstream uses, $p$ = ``pos_dim``
= 10) is added to every score before a learned map ``map_pos`` $\mathbb R^p\to\mathbb R$:

$$S_{h,ij} = \sum_{c} w_c\,(A_{h,ij} + \mathcal E_{ijc}) + b = g\,A_{h,ij} + (\mathcal E w)_{ij} + b,\qquad
g = \textstyle\sum_c w_c,$$

so the learned positional term $P = \mathcal E w$ (the paper's "2-D positional encoding of the
attention matrix") breaks the symmetry, $g$ is a learned temperature and $b$ cancels in the
softmax. Then $O_h = \mathrm{softmax}(S_h + M)\,V_h$ ($M$: optional causal mask, as in upstream's
nanoGPT notebook) and $Y = [O_1\|\dots\|O_H]W_o + b_o$.

Backward
--------
The attention core (`refattn.attention.softmax.core`) is called with query $gK$ (positional) or
$K$, key $K$, value $V$ and additive bias $\mathcal E w + b$; it returns $dQ_c, dK_c, dV, dB$.
$S$ is quadratic in $K$, so the key receives both paths,

$$dK = g\,dQ_c + dK_c = s\,g\,(dS + dS^\top)K\quad(\text{symmetric variant: } g = 1),$$

the tutorial contrast to QKV attention, where the two paths land on two different weights. The
map gets $dw_c = \sum_{h,i,j}(A_{h,ij} + \mathcal E_{ijc})\,dS_{h,ij} = dg + \sum_{ij}\mathcal E_{ijc}\,dB_{ij}$
with $dg = \langle dQ_c, K\rangle$, and $db = \sum dS = 0$ exactly (softmax rows are shift
invariant). The projections use `linear_vjp`.

Conventions (keyword, default)
------------------------------
``positional`` (False: the symmetric KV model; True: upstream ``'kv'``), ``pos_dim`` (10), ``scale``
(default $1/\sqrt d$ as ``Reverse_sort_pos.py``; the nanoGPT notebook ``gpt_dev_pos.ipynb``
divides by $\sqrt{C}$ with $C$ the model width: pass ``scale=C**-0.5``), ``is_causal`` (False;
the notebook is causal). Upstream's fused ``kv_proj`` splits each head's $2d$ columns as
$[k_h | v_h]$ (``reshape(B, N, H, 2d).chunk(2)``), which is the layout here.

Paper: A. Borji, "Key-Value Transformer", arXiv 2305.19129 (2023). Upstream:
aliborji/kv-transformer ``Reverse_sort_pos.py`` (class ``MultiheadAttention_KV``) and
``gpt_dev_pos.ipynb`` (class ``Head``) @ d9eafa5761ab7070d1b9838d216bd611cf9dd6b0, with
tatp22/multidim-positional-encoding ``positional_encodings/torch_encodings.py``
(``PositionalEncoding2D``, interleaved sin/cos) @ efeb8d9d70e8184da50eae9fddd1bbda10896529.
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_param_keys, check_params, check_weight_in, compute_dtype
from ...nn.linear import linear_apply, linear_vjp, merge_heads, split_heads
from ...registry import Mechanism, Sample, register
from .core import attention_core_backward, attention_core_forward, check_size, sum_to_shape

__all__ = ["positional_encoding_2d", "key_value_attention_forward", "key_value_attention_backward",
           "key_value_attention", "init_key_value_params"]

_WEIGHTS = ("kv_proj.weight", "o_proj.weight")
_OPTIONAL = ("kv_proj.bias", "o_proj.bias", "map_pos.weight", "map_pos.bias")


def positional_encoding_2d(n_rows: int, n_cols: int, channels: int) -> np.ndarray:
    r"""The fixed 2-D sinusoidal table ``(n_rows, n_cols, channels)`` of ``PositionalEncoding2D``.

    With $c' = 2\lceil \text{channels}/4\rceil$ and $f_m = 10000^{-2m/c'}$, the first $c'$ channels
    encode the row $i$ and the next $c'$ the column $j$, each as interleaved
    $[\sin(i f_0), \cos(i f_0), \sin(i f_1), \dots]$; the table is cut to ``channels``. float64.
    """
    half = 2 * int(np.ceil(channels / 4))
    freq = 1.0 / (10000.0 ** (np.arange(0, half, 2, dtype=np.float64) / half))

    def emb(n):
        a = np.arange(n, dtype=np.float64)[:, None] * freq
        return np.stack([np.sin(a), np.cos(a)], axis=-1).reshape(n, half)

    out = np.zeros((n_rows, n_cols, 2 * half))
    out[:, :, :half] = emb(n_rows)[:, None, :]
    out[:, :, half:] = emb(n_cols)[None, :, :]
    return out[:, :, :channels]


def _validate(x, params, num_heads, positional, pos_dim):
    check_param_keys(params, _WEIGHTS, _OPTIONAL, where="key_value_attention (weights (in, out); PyTorch: weight.T)")
    c = x.shape[-1]
    check_weight_in(params, "kv_proj.weight", c, input_name="x")
    kv = as_float(params["kv_proj.weight"], "kv_proj.weight", ndim=2)
    if kv.shape[0] != c or kv.shape[1] % (2 * num_heads):
        raise ValueError(f"kv_proj.weight must have shape (C={c}, 2*H*d) with 2*H={2 * num_heads} dividing its "
                         f"second axis; got {kv.shape}")
    e = kv.shape[1] // 2
    wo = as_float(params["o_proj.weight"], "o_proj.weight", ndim=2)
    spec = {"kv_proj.weight": (c, 2 * e), "kv_proj.bias": (2 * e,), "o_proj.weight": (e, wo.shape[1]),
            "o_proj.bias": (wo.shape[1],)}
    optional = ["kv_proj.bias", "o_proj.bias"]
    if positional:
        spec.update({"map_pos.weight": (pos_dim, 1), "map_pos.bias": (1,)})
        optional.append("map_pos.bias")
    elif "map_pos.weight" in params or "map_pos.bias" in params:
        raise ValueError("map_pos.weight / map_pos.bias are only used with positional=True")
    return check_params(params, spec, optional=optional, where="key_value_attention"), e // num_heads


def key_value_attention_forward(x, params, *, num_heads: int, positional: bool = False, pos_dim: int = 10,
                                is_causal: bool = False, attn_mask=None, scale=None):
    r"""Key-Value attention layer (Borji's KV Transformer), token-major.

    $S_h = s K_h K_h^\top$ (symmetric) or $g\,sK_hK_h^\top + \mathcal E w + b$ (``positional``),
    $O_h = \mathrm{softmax}(S_h)V_h$, $Y = [O_1\|\dots\|O_H] W_o + b_o$ (module docstring).

    Parameters
    ----------
    x : array (B.., N, C)
    params : dict
        ``"kv_proj.weight" (C, 2Hd)`` (head-major $[k_h|v_h]$ columns), ``"o_proj.weight" (Hd, C_out)``,
        optional ``"kv_proj.bias"``, ``"o_proj.bias"``; with ``positional``: ``"map_pos.weight"
        (pos_dim, 1)`` and optional ``"map_pos.bias" (1,)``. PyTorch ``nn.Linear`` weights are
        transposed (``weight.T``).
    num_heads : int
    positional : bool
        Add the learned 2-D positional term (upstream ``attn_type='kv'``).
    pos_dim : int
        Channels $p$ of the 2-D table (upstream 10).
    is_causal, attn_mask
        Optional causal / boolean-or-additive mask over the ``(N, N)`` scores (as SDPA).
    scale : float > 0, optional
        Default $d^{-1/2}$.

    Returns
    -------
    out, cache
        ``out (B.., N, C_out)``.
    """
    x = as_float(x, "x", min_ndim=2)
    h = check_size(num_heads, "num_heads")
    pos_dim = check_size(pos_dim, "pos_dim")
    if not isinstance(positional, (bool, np.bool_)):
        raise TypeError(f"positional must be a bool; got {type(positional).__name__}")
    if params is None:
        raise TypeError("params is required: a dict with kv_proj.weight and o_proj.weight")
    p, d = _validate(x, params, h, positional, pos_dim)
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    n = x.shape[-2]
    kv = split_heads(linear_apply(x, p["kv_proj.weight"], p.get("kv_proj.bias")), h, 2 * d)
    k, v = kv[..., :d], kv[..., d:]
    bias, table, g = None, None, 1.0
    if positional:
        table = positional_encoding_2d(n, n, pos_dim).astype(dt)
        w = p["map_pos.weight"][:, 0]
        g = w.sum()
        bias = table @ w + (p["map_pos.bias"][0] if "map_pos.bias" in p else 0.0)
    o, core = attention_core_forward(g * k if positional else k, k, v, bias, attn_mask=attn_mask,
                                     is_causal=is_causal, scale=scale)
    oc = merge_heads(o)
    y = linear_apply(oc, p["o_proj.weight"], p.get("o_proj.bias"))
    cache = {"x": x, "p": p, "k": k, "g": g, "table": table, "core": core, "oc": oc, "d": d, "h": h,
             "y_shape": y.shape}
    return y, cache


def key_value_attention_backward(dout, cache):
    r"""Gradient of :func:`key_value_attention_forward`: ``x`` and every params key.

    $dK = g\,dQ_c + dK_c$ (both paths of the quadratic score), $dw_c = \langle dQ_c, K\rangle +
    \sum_{ij}\mathcal E_{ijc} dB_{ij}$, $db = \sum_{ij} dB_{ij}$ (zero up to round-off)."""
    p, core, x, k = cache["p"], cache["core"], cache["x"], cache["k"]
    g = as_dout(dout, cache["y_shape"], x.dtype)
    grads = {}
    go = linear_vjp(g, cache["oc"], p["o_proj.weight"], "o_proj.bias" in p)
    gc = attention_core_backward(split_heads(go["x"], cache["h"], cache["d"]), core)
    dk = cache["g"] * gc["q"] + gc["k"]
    if cache["table"] is not None:
        dgain = np.sum(gc["q"] * k)
        dbias = sum_to_shape(gc["bias"], cache["table"].shape[:2])
        grads["map_pos.weight"] = (dgain + np.einsum("ijc,ij->c", cache["table"], dbias))[:, None]
        if "map_pos.bias" in p:
            grads["map_pos.bias"] = np.atleast_1d(dbias.sum()).astype(x.dtype)
    gkv = linear_vjp(merge_heads(np.concatenate([dk, gc["v"]], axis=-1)), x, p["kv_proj.weight"],
                     "kv_proj.bias" in p)
    grads["x"] = gkv["x"]
    grads["kv_proj.weight"], grads["o_proj.weight"] = gkv["weight"], go["weight"]
    if "kv_proj.bias" in p:
        grads["kv_proj.bias"] = gkv["bias"]
    if "o_proj.bias" in p:
        grads["o_proj.bias"] = go["bias"]
    return grads


def key_value_attention(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`key_value_attention_forward`."""
    return key_value_attention_forward(x, params, **config)[0]


def init_key_value_params(rng, c: int, num_heads: int, head_dim: int, *, positional: bool = False,
                          pos_dim: int = 10, c_out=None, bias: bool = True) -> dict:
    """Random parameters (xavier-like weights, small biases) for tests and demos."""
    e = num_heads * head_dim
    co = c if c_out is None else c_out
    p = {"kv_proj.weight": rng.uniform(-1, 1, (c, 2 * e)) * np.sqrt(6.0 / (c + 2 * e)),
         "o_proj.weight": rng.uniform(-1, 1, (e, co)) * np.sqrt(6.0 / (e + co))}
    if bias:
        p["kv_proj.bias"] = 0.1 * rng.standard_normal(2 * e)
        p["o_proj.bias"] = 0.1 * rng.standard_normal(co)
    if positional:
        p["map_pos.weight"] = rng.uniform(-1, 1, (pos_dim, 1)) * np.sqrt(6.0 / (pos_dim + 1)) + 0.3
        if bias:
            p["map_pos.bias"] = 0.1 * rng.standard_normal(1)
    return p


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size):
    if size == "tiny":
        n, c, h, d = int(rng.integers(2, 4)), 3, 2, 2
    else:
        n, c, h, d = int(rng.integers(4, 8)), 6, 2, 3
    positional = bool(rng.random() < 0.5)
    x = rng.standard_normal((2, n, c))
    params = init_key_value_params(rng, c, h, d, positional=positional, pos_dim=4 if size == "tiny" else 10)
    cfg = {"num_heads": h, "positional": positional, "pos_dim": 4 if size == "tiny" else 10}
    if rng.random() < 0.5:
        cfg["is_causal"] = True
    return Sample(inputs={"x": x}, params=params, config=cfg)


def _reference(x, params, *, num_heads, positional=False, pos_dim=10, is_causal=False, attn_mask=None,
               scale=None):
    # per-head loop of the formula; the positional term as upstream writes it: map_pos(A[..., None] + E)
    b, n, _ = x.shape
    kv = x @ params["kv_proj.weight"] + params.get("kv_proj.bias", 0.0)
    e = kv.shape[-1] // 2
    d = e // num_heads
    kv = kv.reshape(b, n, num_heads, 2 * d)
    out = np.zeros((b, n, e))
    s = d ** -0.5 if scale is None else scale
    table = positional_encoding_2d(n, n, pos_dim)
    for bb in range(b):
        for hh in range(num_heads):
            k, v = kv[bb, :, hh, :d], kv[bb, :, hh, d:]
            a = s * k @ k.T
            if positional:
                a = (a[:, :, None] + table) @ params["map_pos.weight"][:, 0] + params.get("map_pos.bias", [0.0])[0]
            if is_causal:
                a = np.where(np.tri(n, dtype=bool), a, -np.inf)
            w = np.exp(a - a.max(-1, keepdims=True))
            out[bb, :, hh * d:(hh + 1) * d] = (w / w.sum(-1, keepdims=True)) @ v
    return out @ params["o_proj.weight"] + params.get("o_proj.bias", 0.0)


def _check_scores_symmetric(rng):
    x = rng.standard_normal((2, 5, 4))
    p = init_key_value_params(rng, 4, 2, 3)
    _, c = key_value_attention_forward(x, p, num_heads=2)
    s = np.log(c["core"]["p"]) + c["core"]["lse"][..., None]   # the scores the forward used
    err = float(np.abs(s - np.swapaxes(s, -1, -2)).max())
    pp = init_key_value_params(rng, 4, 2, 3, positional=True)
    _, cp = key_value_attention_forward(x, pp, num_heads=2, positional=True)
    sp = np.log(cp["core"]["p"]) + cp["core"]["lse"][..., None]
    asym = float(np.abs(sp - np.swapaxes(sp, -1, -2)).max())
    assert err < 1e-12 and asym > 1e-3, (err, asym)
    return err


def _check_two_key_paths(rng):
    # dW_kv of the KV layer == dW_q + dW_k of an MHA whose query and key weights are both W_k:
    # the quadratic score sends the gradient into K along the query path and the key path.
    from .mha import mha_backward, mha_forward

    x = rng.standard_normal((2, 5, 4))
    h, d = 2, 3
    p = init_key_value_params(rng, 4, h, d, bias=False)
    y, c = key_value_attention_forward(x, p, num_heads=h)
    w = p["kv_proj.weight"].reshape(4, h, 2, d)
    wk, wv = w[:, :, 0].reshape(4, h * d), w[:, :, 1].reshape(4, h * d)
    pm = {"q_proj": wk, "k_proj": wk, "v_proj": wv, "out_proj": p["o_proj.weight"]}
    y2, c2 = mha_forward(x, params=pm, num_heads=h)
    G = rng.standard_normal(y.shape)
    g, g2 = key_value_attention_backward(G, c), mha_backward(G, c2)
    dw = g["kv_proj.weight"].reshape(4, h, 2, d)
    err = max(float(np.abs(y - y2).max()), float(np.abs(g["x"] - g2["x"]).max()),
              float(np.abs(dw[:, :, 0].reshape(4, h * d) - g2["q_proj"] - g2["k_proj"]).max()),
              float(np.abs(dw[:, :, 1].reshape(4, h * d) - g2["v_proj"]).max()))
    assert err < 1e-12, err
    return err


def _check_map_bias_gradient_zero(rng):
    x = rng.standard_normal((2, 6, 4))
    p = init_key_value_params(rng, 4, 2, 2, positional=True)
    y, c = key_value_attention_forward(x, p, num_heads=2, positional=True)
    db = key_value_attention_backward(rng.standard_normal(y.shape), c)["map_pos.bias"]
    p2 = dict(p, **{"map_pos.bias": p["map_pos.bias"] + 3.0})
    err = max(float(np.abs(db).max()), float(np.abs(key_value_attention(x, p2, num_heads=2, positional=True) - y).max()))
    assert err < 1e-12, err
    return err


def _check_positional_table(rng):
    # the 2-D table against its element formula: channel 2m / 2m+1 = sin / cos(i f_m), then the column
    n_r, n_c, ch = int(rng.integers(2, 7)), int(rng.integers(2, 7)), 10
    t = positional_encoding_2d(n_r, n_c, ch)
    half = 2 * int(np.ceil(ch / 4))
    err = 0.0
    for i in range(n_r):
        for j in range(n_c):
            for c in range(ch):
                pos, cc = (i, c) if c < half else (j, c - half)
                f = 10000.0 ** (-(cc // 2 * 2) / half)
                ref = np.sin(pos * f) if cc % 2 == 0 else np.cos(pos * f)
                err = max(err, abs(t[i, j, c] - ref))
    assert err < 1e-14, err
    return float(err)


register(
    Mechanism(
        slug="key_value_attention", family="1-softmax", tier="T2",
        title="Key-Value (query-free) attention: symmetric KK^T and the 2-D positional variant",
        paper="A. Borji, Key-Value Transformer, arXiv 2305.19129 (2023)",
        official_code="aliborji/kv-transformer",
        forward=key_value_attention_forward, backward=key_value_attention_backward, sample=_sample,
        reference=_reference, docs="softmax/qkv-variants.md#key-value-attention",
        checks={"scores_symmetric": _check_scores_symmetric, "two_key_paths": _check_two_key_paths,
                "map_bias_gradient_zero": _check_map_bias_gradient_zero,
                "positional_table_formula": _check_positional_table},
    ),
)
