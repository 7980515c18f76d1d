r"""Softmax attention: the scaled dot-product core (SDPA), GQA/MQA, masks, additive biases, MHA.

Everything in the softmax family (and most later families) calls one core,
:func:`attention_core_forward` / :func:`attention_core_backward`, whose public faces are
:func:`sdpa_forward` / :func:`sdpa_backward` (PyTorch ``F.scaled_dot_product_attention``
semantics) and :func:`sdpa`.

Forward
-------
Per batch element and query head $h$ (kv head $g(h)$, see *GQA*):

$$S^0 = s\,Q_h K_{g(h)}^\top,\qquad
T = \begin{cases} c\,\tanh(S^0/c) & \text{softcap } c\\ S^0 & \text{otherwise}\end{cases},\qquad
S = T + B + M,$$
$$P = \mathrm{softmax}_j(S),\qquad O_h = P\,V_{g(h)},\qquad L_i = \log\textstyle\sum_j e^{S_{ij}}.$$

$s$ defaults to $d^{-1/2}$; $B$ is an optional differentiable additive bias (ALiBi, relative
position tables, quadrature weights $\log w_j$ …); $M$ collects the (non-differentiable) masks:
``attn_mask`` (boolean, True = keep, or additive with ``-inf`` = remove) and ``is_causal``.

Backward (the standard attention VJP)
-------------------------------------
With upstream $G = \partial L/\partial O$ (and optionally $G^L = \partial L/\partial L_i$):

$$dV_{g} \mathrel{+}= P^\top G,\qquad dP = G\,V_g^\top,\qquad
dS = P\odot\big(dP - \mathrm{rowsum}(P\odot dP)\big) + P\odot G^L,$$
$$dB = dS\ (\text{summed over the axes } B \text{ was broadcast along}),\qquad
dS^0 = dS\odot\big(1 - \tanh^2(S^0/c)\big)\ (\text{softcap; else } dS^0 = dS),$$
$$dQ_h = s\,dS^0 K_g,\qquad dK_g \mathrel{+}= s\,(dS^0)^\top Q_h.$$

$\mathrm{rowsum}(P\odot dP)_i = G_i\cdot O_i = D_i$ is FlashAttention's $D$. The softmax part is
:func:`refattn.nn.softmax.softmax_vjp`; $\partial L_i/\partial S_{ij} = P_{ij}$ gives the LSE term.
Masked entries have $P_{ij}=0$ and so $dS_{ij}=0$; fully masked rows give $O_i = 0$,
$L_i=-\infty$ and zero gradients (refattn's convention, see :mod:`refattn.nn.softmax`; PyTorch
returns NaN there).

Conventions (keyword, default, who uses what)
---------------------------------------------
``is_causal`` with ``N != M`` — ``causal_alignment``:
    ``"top_left"`` (default, PyTorch ``F.scaled_dot_product_attention``: mask
    ``tril(ones(N, M))``, query $i$ sees keys $j\le i$) or ``"bottom_right"`` (flash-attn >= 2.1,
    xformers ``LowerTriangularFromBottomRightMask``, unilm Diff-Transformer KV-cache decoding
    ``triu(-inf, 1 + offset)`` with offset $M-N$: query $i$ sees keys $j \le i + M - N$). Both
    agree when ``N == M``. With ``bottom_right`` and ``N > M`` the first ``N - M`` rows are fully
    masked (output 0), as in flash-attn.
``kv_group_map`` (GQA, ``H`` query heads, ``Hkv`` kv heads, ``r = H / Hkv``):
    ``"contiguous"`` (default; HF/unilm ``repeat_kv``, flash-attn, PyTorch ``enable_gqa=True``:
    query head $h$ uses kv head $\lfloor h/r\rfloor$) or ``"strided"`` ($h \bmod H_{kv}$, i.e.
    kv heads tiled, as produced by ``k.repeat(1, r, 1, 1)``).
``softcap`` (Gemma-2, flash-attn ``softcap=``): $T = c\tanh(s\,QK^\top/c)$, applied to the
    scaled scores *before* the bias and the masks (HF ``Gemma2`` attention: scale, tanh-cap,
    then ``+ causal_mask``; flash-attn ``hopper``/``csrc`` apply softcap before ALiBi/masking).
``attn_mask`` and ``is_causal`` together:
    PyTorch raises; refattn combines them (logical AND of the keep sets).
``scale``: default $1/\sqrt{d}$ (PyTorch, flash-attn); T5 uses no scaling (pass ``scale=1.0``).

Paper: Vaswani et al., "Attention Is All You Need", NeurIPS 2017, arXiv 1706.03762.
Reference loops: karpathy/llm.c ``dev/cuda/attention_backward.cu`` (CPU reference).
"""

from __future__ import annotations

import numpy as np

from .._checks import (
    as_bool_or_float_mask,
    as_float,
    check_broadcastable,
    check_choice,
    check_positive,
    compute_dtype,
)
from ..nn.softmax import softmax_lse, softmax_vjp
from ..registry import Mechanism, Sample, register

__all__ = [
    "attention_core_forward",
    "attention_core_backward",
    "sdpa_forward",
    "sdpa_backward",
    "sdpa",
    "expand_kv",
    "reduce_kv",
    "causal_keep",
    "sum_to_shape",
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


# --------------------------------------------------------------------------------------------
# Validation


def _validate_qkv(q, k, v):
    q = as_float(q, "q", min_ndim=3)
    k = as_float(k, "k", min_ndim=3)
    v = as_float(v, "v", min_ndim=3)
    if k.ndim != q.ndim or v.ndim != q.ndim:
        raise ValueError(
            f"q, k and v must have the same number of dimensions (..., heads, tokens, features); "
            f"got q {q.shape}, k {k.shape}, v {v.shape}"
        )
    if k.shape[:-3] != q.shape[:-3] or v.shape[:-3] != q.shape[:-3]:
        raise ValueError(
            f"the leading (batch) axes of q, k and v must be equal; got q {q.shape}, k {k.shape}, v {v.shape}"
        )
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"k must have q's head width d={q.shape[-1]} on its last axis; got k {k.shape}")
    if v.shape[-3] != k.shape[-3]:
        raise ValueError(f"v must have k's number of kv heads {k.shape[-3]} on axis -3; got v {v.shape}")
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(f"v must have k's number of keys M={k.shape[-2]} on axis -2; got v {v.shape}")
    h, hkv = q.shape[-3], k.shape[-3]
    if h % hkv:
        raise ValueError(
            f"the number of query heads H={h} (q axis -3) must be a multiple of the number of kv heads "
            f"Hkv={hkv} (k axis -3)"
        )
    return q, k, v


def _validate_config(q, k, attn_mask, is_causal, causal_alignment, scale, softcap, kv_group_map):
    if not isinstance(is_causal, (bool, np.bool_)):
        raise TypeError(f"is_causal must be a bool; got {type(is_causal).__name__}")
    check_choice(causal_alignment, "causal_alignment", CAUSAL_ALIGNMENTS)
    check_choice(kv_group_map, "kv_group_map", KV_GROUP_MAPS)
    scale = check_positive(scale, "scale", allow_none=True)
    softcap = check_positive(softcap, "softcap", allow_none=True)
    target = q.shape[:-1] + (k.shape[-2],)
    attn_mask = as_bool_or_float_mask(attn_mask, "attn_mask")
    if attn_mask is not None:
        check_broadcastable("attn_mask", attn_mask.shape, target, "the scores (..., H, N, M) of shape")
    return attn_mask, bool(is_causal), scale, softcap


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
        Which kv head each query head uses (see the module docstring).

    Returns
    -------
    out, cache
        ``out`` of shape (..., H, N, dv). ``cache["lse"]`` (..., H, N) is the log-sum-exp of the
        final scores (``-inf`` on fully masked rows) and ``cache["p"]`` the attention weights.
    """
    q, k, v = _validate_qkv(q, k, v)
    attn_mask, is_causal, scale, softcap = _validate_config(
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


def _check_dout(dout, shape, dt, name="dout"):
    dout = as_float(dout, name, finite=False)
    if dout.shape != shape:
        raise ValueError(f"{name} must have the output's shape {shape}; got {dout.shape}")
    return dout.astype(dt, copy=False)


def attention_core_backward(dout, cache, *, dlse=None):
    r"""Gradient of :func:`attention_core_forward` (the attention VJP in the module docstring).

    ``dlse`` (optional, shape (..., H, N)) is an upstream gradient on ``cache["lse"]``
    ($\partial L_i/\partial S_{ij} = P_{ij}$), for callers that merge partial attentions.
    Returns ``{"q", "k", "v"}`` plus ``"bias"`` when a bias was given.
    """
    p, ve, ke, q = cache["p"], cache["ve"], cache["ke"], cache["q"]
    dt = p.dtype
    g = _check_dout(dout, cache["out"].shape, dt)
    dve = np.swapaxes(p, -1, -2) @ g
    ds = softmax_vjp(p, g @ np.swapaxes(ve, -1, -2))
    if dlse is not None:
        dlse = _check_dout(dlse, cache["lse"].shape, dt, "dlse")
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


def sdpa_forward(q, k, v, *, attn_mask=None, is_causal: bool = False, causal_alignment: str = "top_left",
                 scale=None, softcap=None, kv_group_map: str = "contiguous", return_lse: bool = False):
    r"""Scaled dot-product attention, PyTorch ``F.scaled_dot_product_attention`` layout.

    $O = \mathrm{softmax}(s\,QK^\top + M)\,V$ per head (see the module docstring for the
    conventions: GQA ``kv_group_map``, ``causal_alignment``, ``softcap``). Dropout is not
    implemented (reference code is deterministic).

    Parameters
    ----------
    q (..., H, N, d), k (..., Hkv, M, d), v (..., Hkv, M, dv)
        Leading axes must be equal (no broadcasting between q, k, v).
    attn_mask, is_causal, causal_alignment, scale, softcap, kv_group_map
        As :func:`attention_core_forward`.
    return_lse : bool
        The log-sum-exp (..., H, N) is always stored as ``cache["lse"]``; this flag exists for
        signature symmetry with :func:`sdpa`, which returns ``(out, lse)`` when it is set.

    Returns
    -------
    out, cache
        ``out`` (..., H, N, dv); ``sdpa_backward(dout, cache)`` gives ``{"q", "k", "v"}``.
    """
    if not isinstance(return_lse, (bool, np.bool_)):
        raise TypeError(f"return_lse must be a bool; got {type(return_lse).__name__}")
    return attention_core_forward(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                                  causal_alignment=causal_alignment, scale=scale, softcap=softcap,
                                  kv_group_map=kv_group_map)


def sdpa_backward(dout, cache, *, dlse=None):
    """Gradient of :func:`sdpa_forward`: ``{"q", "k", "v"}`` (GQA: summed over each kv group)."""
    return attention_core_backward(dout, cache, dlse=dlse)


def sdpa(q, k, v, *, attn_mask=None, is_causal: bool = False, causal_alignment: str = "top_left",
         scale=None, softcap=None, kv_group_map: str = "contiguous", return_lse: bool = False):
    """Convenience wrapper of :func:`sdpa_forward`: ``out``, or ``(out, lse)`` if ``return_lse``."""
    out, cache = sdpa_forward(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                              causal_alignment=causal_alignment, scale=scale, softcap=softcap,
                              kv_group_map=kv_group_map, return_lse=return_lse)
    return (out, cache["lse"]) if return_lse else out


# --------------------------------------------------------------------------------------------
# Registry records


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


def _sample_sdpa(rng, size):
    if size == "tiny":
        b, h, hkv, n, m, d, dv = 2, 2, int(rng.choice([1, 2])), int(rng.integers(2, 4)), int(rng.integers(2, 5)), 2, 2
    else:
        b, h, hkv = 2, 4, int(rng.choice([1, 2, 4]))
        n, m, d, dv = int(rng.integers(4, 9)), int(rng.integers(4, 11)), 4, 3
    q = rng.standard_normal((b, h, n, d))
    k = rng.standard_normal((b, hkv, m, d))
    v = rng.standard_normal((b, hkv, m, dv))
    config = {"is_causal": bool(rng.random() < 0.5), "causal_alignment": "bottom_right" if m >= n else "top_left",
              "scale": float(rng.uniform(0.3, 1.0)), "kv_group_map": str(rng.choice(KV_GROUP_MAPS))}
    if rng.random() < 0.5:
        config["softcap"] = float(rng.uniform(1.0, 3.0))
    return Sample(inputs={"q": q, "k": k, "v": v}, config=config)


def _sdpa_reference(q, k, v, *, attn_mask=None, is_causal=False, causal_alignment="top_left", scale=None,
                    softcap=None, kv_group_map="contiguous", return_lse=False):
    keep = None
    if attn_mask is not None:
        keep = attn_mask if attn_mask.dtype == np.bool_ else np.isfinite(attn_mask)
    if is_causal:
        c = causal_keep(q.shape[-2], k.shape[-2], causal_alignment)
        keep = c if keep is None else keep & c
    bias = None if attn_mask is None or attn_mask.dtype == np.bool_ else np.where(np.isfinite(attn_mask), attn_mask, 0.0)
    return naive_attention(q, k, v, bias=bias, keep=keep, scale=scale, softcap=softcap, kv_group_map=kv_group_map)


def _check_fully_masked_rows(rng):
    q = rng.standard_normal((2, 2, 4, 3))
    k = rng.standard_normal((2, 2, 5, 3))
    v = rng.standard_normal((2, 2, 5, 2))
    keep = rng.random((2, 2, 4, 5)) > 0.3
    keep[0, 1, 2] = False
    keep[1, :, 0] = False
    with np.errstate(all="raise"):
        out, cache = sdpa_forward(q, k, v, attn_mask=keep)
        g = sdpa_backward(rng.standard_normal(out.shape), cache)
    assert np.all(out[0, 1, 2] == 0) and np.all(out[1, :, 0] == 0), "fully masked rows are not 0"
    assert np.all(g["q"][0, 1, 2] == 0) and np.all(g["q"][1, :, 0] == 0), "fully masked rows have a q gradient"
    assert np.isneginf(cache["lse"][0, 1, 2])
    for a in (out, *g.values()):
        assert np.isfinite(a).all()
    return 0.0


def _check_key_bias_redundancy(rng):
    # Adding the same vector b to every key shifts every score row by a constant: O unchanged, and
    # the gradient wrt b, s * sum_i q_i * rowsum(dS_i) = sum_j dk_j, vanishes (catalogue [4-69]).
    q = rng.standard_normal((2, 3, 5, 4))
    k = rng.standard_normal((2, 3, 6, 4))
    v = rng.standard_normal((2, 3, 6, 3))
    bk = rng.standard_normal(4)
    o1, c = sdpa_forward(q, k, v)
    o2 = sdpa(q, k + bk, v)
    err = float(np.abs(o1 - o2).max())
    dk = sdpa_backward(rng.standard_normal(o1.shape), c)["k"]
    err_g = float(np.abs(dk.sum(axis=-2)).max())
    assert err < 1e-12 and err_g < 1e-12, (err, err_g)
    return max(err, err_g)


def _check_permutation(rng):
    # Equivariant under query permutations, invariant under a joint key/value permutation.
    q = rng.standard_normal((2, 2, 5, 3))
    k = rng.standard_normal((2, 2, 7, 3))
    v = rng.standard_normal((2, 2, 7, 2))
    o = sdpa(q, k, v)
    pq, pk = rng.permutation(5), rng.permutation(7)
    err = max(float(np.abs(sdpa(q[:, :, pq], k, v) - o[:, :, pq]).max()),
              float(np.abs(sdpa(q, k[:, :, pk], v[:, :, pk]) - o).max()))
    assert err < 1e-12, err
    return err


def _check_lse(rng):
    q = rng.standard_normal((2, 2, 3, 4)) * 3
    k = rng.standard_normal((2, 2, 6, 4)) * 3
    v = rng.standard_normal((2, 2, 6, 2))
    _, c = sdpa_forward(q, k, v, scale=0.7)
    x = 0.7 * q @ np.swapaxes(k, -1, -2)
    ref = np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1)) + x.max(-1)
    err = float(np.abs(c["lse"] - ref).max())
    assert err < 1e-12, err
    return err


def _check_causal_alignment(rng):
    # bottom_right == the last N rows of full causal attention over M keys; top_left == first N rows.
    q = rng.standard_normal((2, 2, 7, 3))
    k = rng.standard_normal((2, 2, 7, 3))
    v = rng.standard_normal((2, 2, 7, 2))
    full = sdpa(q, k, v, is_causal=True)
    br = sdpa(q[:, :, 4:], k, v, is_causal=True, causal_alignment="bottom_right")
    tl = sdpa(q[:, :, :3], k, v, is_causal=True, causal_alignment="top_left")
    err = max(float(np.abs(br - full[:, :, 4:]).max()), float(np.abs(tl - full[:, :, :3]).max()))
    assert err < 1e-12, err
    return err


register(
    Mechanism(
        slug="sdpa", family="1-softmax", tier="T1",
        title="Scaled dot-product attention (masks, causal alignment, GQA, softcap, LSE)",
        paper="Vaswani et al., Attention Is All You Need, NeurIPS 2017, arXiv 1706.03762",
        forward=sdpa_forward, backward=sdpa_backward, sample=_sample_sdpa, reference=_sdpa_reference,
        docs="softmax-attention.md#sdpa",
        checks={"fully_masked_rows": _check_fully_masked_rows, "key_bias_redundancy": _check_key_bias_redundancy,
                "permutation": _check_permutation, "lse": _check_lse, "causal_alignment": _check_causal_alignment},
    ),
)
