r"""Differential attention (DIFF Transformer V1), its attention core and the close V1 variants.

Two softmax maps over the same values, combined with a signed weight:

$$O = \bigl(\mathrm{softmax}(sQ_1K_1^\top + M) - \lambda\,\mathrm{softmax}(sQ_2K_2^\top + M)\bigr)V .$$

This module holds

* :func:`diff_attention_core_forward` / :func:`diff_attention_core_backward` — the core above on
  PyTorch SDPA layouts, with a $\lambda$ that may be a scalar, per head or per token and head;
* :func:`diff_attention_v1_forward` / :func:`diff_attention_v1_backward` — the full unilm layer
  (projections, interleaved RoPE, half-head pairing, GQA pairing, $\lambda$ re-parameterisation,
  per-head RMSNorm, $(1-\lambda_{init})$, output projection);
* :func:`diffclip_attention_forward` — DiffCLIP's copy of the layer (biases, constant
  $\lambda_{init}$, no RoPE, no mask);
* :func:`grouped_differential_attention_forward` — GDA, unbalanced signal/noise head groups.

Backward of the core (derivation)
---------------------------------
Write $A_a = \mathrm{softmax}(S_a)$, $S_a = sQ_aK_a^\top + M$, $O_a = A_aV$ ($a = 1, 2$) and
$O = O_1 - \lambda O_2$. With $G = \partial L/\partial O$:

* $dO_1 = G$, $dO_2 = -\lambda G$ (λ broadcast over the value axis);
* $d\lambda = -\sum_c G_{\cdot c}\,O_{2,\cdot c}$, summed over every axis that shares λ;
* $dV = A_1^\top dO_1 + A_2^\top dO_2$;
* $dA_a = dO_a V^\top$, $dS_a = A_a\odot(dA_a - \mathrm{rowsum}(dA_a\odot A_a))$ (softmax VJP;
  masked entries and fully masked rows have $A_a = 0$ and receive 0);
* $dQ_a = s\,dS_aK_a$, $dK_a = s\,dS_a^\top Q_a$.

Under grouped-query attention a key/value head serves several query heads; its gradient is the
sum over those heads (the adjoint of the gather that repeats it).
"""

from __future__ import annotations

import math

import numpy as np

from .._checks import (
    as_bool_or_float_mask,
    as_dout,
    as_float,
    cast_all,
    check_broadcastable,
    check_choice,
    check_int,
    check_params,
    check_positive,
    compute_dtype,
)
from ..kernels import backward_kernel, forward_kernel
from ..nn.linear import linear_prefixed, linear_prefixed_vjp, merge_heads, split_heads
from ..nn.norms import normalize_backward, normalize_forward
from ..nn.rope import apply_rope, rope_angles
from ..nn.softmax import apply_mask, softmax_lse, softmax_vjp
from ..registry import Mechanism, Sample, register
from .softmax import causal_keep as _causal_keep
from .softmax import sum_to_shape

__all__ = [
    "lambda_init_fn",
    "causal_keep",
    "diff_attention_core_forward",
    "diff_attention_core_backward",
    "diff_attention_core",
    "diff_attention_v1_forward",
    "diff_attention_v1_backward",
    "diff_attention_v1",
]

PAPER_V1 = "Ye, Dong, Xia, Sun, Zhu, Huang, Wei, 'Differential Transformer', ICLR 2025, arXiv 2410.05258"


# --------------------------------------------------------------------------------------------
# Small shared pieces


def lambda_init_fn(depth, convention: str = "unilm") -> float:
    r"""The depth schedule $\lambda_{init} = 0.8 - 0.6\,e^{-0.3\,\ell}$ with an explicit layer index.

    Parameters
    ----------
    depth : int
        The layer index as the chosen convention counts it.
    convention : {"unilm", "paper", "motif"}
        * ``"unilm"`` (default; unilm ``lambda_init_fn(depth)``, timm, HF ``DiffLlama``):
          ``depth`` is the 0-based layer index, $\ell = \text{depth}$; the first layer has
          $\lambda_{init} = 0.2$.
        * ``"paper"``: ``depth`` is the paper's 1-based $l$, $\ell = l - 1$ (same values as
          ``"unilm"`` shifted by one index).
        * ``"motif"``: vLLM ``vllm/model_executor/models/motif.py`` (``MotifAttention.lambda_init_fn``
          returns ``0.8 - 0.6 * exp(-0.3 * (depth - 1))`` and is called with the 0-based
          ``extract_layer_index(prefix)``), $\ell = \text{depth} - 1$, so layer 0 gets
          $0.8 - 0.6e^{0.3}\approx -0.01$.
    """
    depth = check_int(depth, "depth")
    check_choice(convention, "lambda_init_convention", ("unilm", "paper", "motif"))
    if convention == "paper" and depth < 1:
        raise ValueError(f"depth must be >= 1 for the 1-based 'paper' convention; got {depth}")
    if convention != "paper" and depth < 0:
        raise ValueError(f"depth must be >= 0 for the 0-based '{convention}' convention; got {depth}")
    ell = depth if convention == "unilm" else depth - 1
    return 0.8 - 0.6 * math.exp(-0.3 * ell)


def causal_keep(n: int, m: int, alignment: str = "bottom_right") -> np.ndarray:
    """Boolean ``(n, m)`` causal mask (True = keep).

    ``"bottom_right"``: query ``i`` sees keys ``j <= i + (m - n)`` — unilm's
    ``triu(-inf, 1 + src_len - tgt_len)`` and flash-attn >= 2.1 ``causal=True``.
    ``"top_left"``: ``j <= i`` — PyTorch ``scaled_dot_product_attention(is_causal=True)``.
    The two agree when ``n == m``. (:func:`refattn.attention.softmax.causal_keep` with unilm's
    default alignment.)
    """
    return _causal_keep(n, m, alignment)


def _gather_heads(x: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """``x[..., idx, :, :]`` on the head axis (-3)."""
    return np.take(x, idx, axis=-3)


def _scatter_heads(g: np.ndarray, idx: np.ndarray, n_heads: int) -> np.ndarray:
    """Adjoint of :func:`_gather_heads`: sum the gathered heads back onto ``n_heads`` heads."""
    shape = g.shape[:-3] + (n_heads,) + g.shape[-2:]
    out = np.zeros(shape, dtype=g.dtype)
    for h, src in enumerate(idx):
        out[..., src, :, :] += g[..., h, :, :]
    return out


_KV_GROUP_MAPS = ("contiguous", "strided")


def kv_head_index(n_heads: int, n_kv_heads: int, kv_group_map: str = "contiguous") -> np.ndarray:
    """KV head used by each query head: ``h // (H / Hkv)`` (``"contiguous"``, PyTorch
    ``enable_gqa``, flash-attn, Llama ``repeat_kv``) or ``h % Hkv`` (``"strided"``, as in
    :func:`refattn.attention.softmax.sdpa_forward` and the kernels)."""
    check_choice(kv_group_map, "kv_group_map", _KV_GROUP_MAPS)
    h = np.arange(n_heads)
    return h // (n_heads // n_kv_heads) if kv_group_map == "contiguous" else h % n_kv_heads


def _combine_mask(mask, is_causal, n, m, alignment, dtype):
    """One mask (bool keep, or additive float) from ``attn_mask`` and ``is_causal``."""
    if not is_causal:
        if mask is not None and mask.dtype != np.bool_:
            return mask.astype(dtype, copy=False)
        return mask
    keep = causal_keep(n, m, alignment)
    if mask is None:
        return keep
    if mask.dtype == np.bool_:
        return np.logical_and(mask, keep)
    return np.where(keep, mask.astype(dtype, copy=False), -np.inf)


# --------------------------------------------------------------------------------------------
# RMSNorm and RoPE pieces (unilm semantics) on the shared refattn.nn primitives


def _subln_fwd(x, weight, bias, eps, center=False):
    r"""Per-head norm over the last axis: RMSNorm $y = x\,r\,w$ with $r = (\mathrm{mean}(x^2) + \epsilon)^{-1/2}$
    (unilm ``rms_norm.py``; ``center=False``) or LayerNorm $y = (x-\mu)\,r\,w + b$ (``center=True``),
    both on :func:`refattn.nn.norms.normalize_forward`."""
    xhat, stats = normalize_forward(x, (x.ndim - 1,), eps, center=center)
    y = xhat * weight if weight is not None else xhat
    if bias is not None:
        y = y + bias
    return y, (xhat, stats)


def _subln_bwd(dy, saved, weight, has_bias=False):
    r"""$g = dy\odot w$; RMSNorm: $dx = r\,(g - \hat x\,\mathrm{mean}(g\odot\hat x))$; LayerNorm adds
    $-r\,\mathrm{mean}(g)$; $dw = \sum dy\odot\hat x$, $db = \sum dy$.

    From $\hat x = x r$, $\partial r/\partial x_j = -r^3 x_j / n$:
    $dx_j = r g_j - \frac{r^3 x_j}{n}\sum_i g_i x_i = r\,(g_j - \hat x_j\,\frac1n\sum_i g_i\hat x_i)$
    (:func:`refattn.nn.norms.normalize_backward`).
    """
    xhat, stats = saved
    g = dy * weight if weight is not None else dy
    dx = normalize_backward(g, xhat, stats)
    dw = db = None
    if weight is not None:
        dw = (dy * xhat).reshape(-1, xhat.shape[-1]).sum(axis=0)
    if has_bias:
        db = dy.reshape(-1, xhat.shape[-1]).sum(axis=0)
    return dx, dw, db


def _rope_apply(x, cos, sin, interleaved, conjugate=False):
    r"""Rotary embedding on the last axis of ``x (..., N, d)`` with tables ``cos, sin (N_ro, r/2)``.

    Interleaved (GPT-J, unilm ``apply_rotary_emb(..., interleaved=True)``): pairs
    $(x_{2j}, x_{2j+1})$; rotate-half (GPT-NeoX): pairs $(x_j, x_{j+r/2})$. Each pair is rotated
    by $\theta_{t,j}$: $(a, b)\mapsto(a\cos - b\sin,\ a\sin + b\cos)$; channels past $r$ pass
    through (:func:`refattn.nn.rope.apply_rope`). The VJP of a rotation is the rotation by
    $-\theta$ (``conjugate=True``).
    """
    if cos is None:
        return x
    n = x.shape[-2]
    return apply_rope(x, cos[:n], -sin[:n] if conjugate else sin[:n], bool(interleaved))


def _check_rel_pos(rel_pos, n, d, dtype):
    """Validate ``rel_pos = (cos, sin)`` tables of shape ``(N_ro >= N, r/2)`` with ``r <= d``."""
    if rel_pos is None:
        return None, None
    if not isinstance(rel_pos, (tuple, list)) or len(rel_pos) != 2:
        raise TypeError(f"rel_pos must be a (cos, sin) pair of (seqlen, rotary_dim/2) arrays; got {type(rel_pos).__name__}")
    cos = as_float(rel_pos[0], "rel_pos[0] (cos)", ndim=2)
    sin = as_float(rel_pos[1], "rel_pos[1] (sin)", ndim=2)
    if cos.shape != sin.shape:
        raise ValueError(f"rel_pos cos and sin must have the same shape; got {cos.shape} and {sin.shape}")
    if cos.shape[0] < n:
        raise ValueError(f"rel_pos tables must cover the sequence: need >= {n} rows; got {cos.shape[0]}")
    if 2 * cos.shape[1] > d:
        raise ValueError(f"rel_pos rotary_dim = 2 * {cos.shape[1]} exceeds the (half-)head width {d}")
    return cos.astype(dtype, copy=False), sin.astype(dtype, copy=False)


def rope_tables(n: int, rotary_dim: int, base: float = 10000.0):
    r"""``(cos, sin)`` of shape ``(n, rotary_dim/2)`` with $\theta_{t,j} = t\,\text{base}^{-2j/r}$
    (flash-attn ``RotaryEmbedding``, the tables unilm passes as ``rel_pos``)."""
    ang = rope_angles(np.arange(n), rotary_dim, base=base)
    return np.cos(ang), np.sin(ang)


# --------------------------------------------------------------------------------------------
# The core


def _validate_core(q1, k1, q2, k2, v, lam, attn_mask, is_causal, scale, kv_group_map, causal_alignment):
    q1 = as_float(q1, "q1", min_ndim=3)
    k1 = as_float(k1, "k1", min_ndim=3)
    q2 = as_float(q2, "q2", min_ndim=3)
    k2 = as_float(k2, "k2", min_ndim=3)
    v = as_float(v, "v", min_ndim=3)
    lam = as_float(lam, "lam", min_ndim=1, max_ndim=q1.ndim - 1)
    if q2.shape != q1.shape:
        raise ValueError(f"q2 must have q1's shape {q1.shape}; got {q2.shape}")
    if k2.shape != k1.shape:
        raise ValueError(f"k2 must have k1's shape {k1.shape}; got {k2.shape}")
    if k1.ndim != q1.ndim or v.ndim != q1.ndim:
        raise ValueError(f"q1, k1 and v must have the same number of dimensions; got shapes "
                         f"{q1.shape}, {k1.shape}, {v.shape}")
    if q1.ndim == 3:
        raise ValueError(f"q1 must be (..., H, N, d) with a head axis; got shape {q1.shape}")
    if k1.shape[:-3] != q1.shape[:-3] or v.shape[:-3] != q1.shape[:-3]:
        raise ValueError(f"batch axes of q1 {q1.shape[:-3]}, k1 {k1.shape[:-3]} and v {v.shape[:-3]} must agree")
    if k1.shape[-1] != q1.shape[-1]:
        raise ValueError(f"k1 must have q1's head width d = {q1.shape[-1]}; got {k1.shape[-1]}")
    if v.shape[-3] != k1.shape[-3] or v.shape[-2] != k1.shape[-2]:
        raise ValueError(f"v must have k1's heads and length (Hkv, M) = {k1.shape[-3:-1]}; got {v.shape[-3:-1]}")
    H, Hkv = q1.shape[-3], k1.shape[-3]
    if H % Hkv:
        raise ValueError(f"the query heads H = {H} must be a multiple of the key/value heads Hkv = {Hkv}")
    out_shape = q1.shape[:-1] + (v.shape[-1],)
    check_broadcastable("lam", lam.shape, out_shape[:-1], "the (..., H, N) output rows of shape")
    mask = as_bool_or_float_mask(attn_mask, "attn_mask")
    score_shape = q1.shape[:-1] + (k1.shape[-2],)
    if mask is not None:
        check_broadcastable("attn_mask", mask.shape, score_shape, "the scores (..., H, N, M) of shape")
    if not isinstance(is_causal, (bool, np.bool_)):
        raise TypeError(f"is_causal must be a bool; got {type(is_causal).__name__}")
    check_choice(causal_alignment, "causal_alignment", ("bottom_right", "top_left"))
    check_choice(kv_group_map, "kv_group_map", _KV_GROUP_MAPS)
    scale = check_positive(scale, "scale", allow_none=True)
    return q1, k1, q2, k2, v, lam, mask, scale


def _row_average(o, kind):
    r"""$C\,o$ over the query axis (-2): ``"all"``: every row is the mean of all rows;
    ``"causal"``: row $i$ (0-based) is the mean of rows $0..i$."""
    if kind == "all":
        return np.broadcast_to(np.mean(o, axis=-2, keepdims=True), o.shape)
    return np.cumsum(o, axis=-2) / np.arange(1, o.shape[-2] + 1)[:, None]


def _row_average_T(g, kind):
    r"""$C^\top g$: ``"all"``: $\frac1N\sum_i g_i$ in every row; ``"causal"``: row $i'$ gets
    $\sum_{i\ge i'} g_i/(i+1)$ (a reverse cumulative sum)."""
    n = g.shape[-2]
    if kind == "all":
        return np.broadcast_to(np.sum(g, axis=-2, keepdims=True) / n, g.shape)
    w = g / np.arange(1, n + 1)[:, None]
    return np.flip(np.cumsum(np.flip(w, axis=-2), axis=-2), axis=-2)


def _core_fwd(q1, k1, q2, k2, v, lam, mask, scale, integral=None):
    r"""Unvalidated core on MHA-expanded heads. ``lam`` broadcasts to the (..., H, N) rows.

    ``integral=(kind, source)`` adds DINT's integral term $\lambda\,C A_a V$ (see
    :func:`_row_average`), $a$ = ``source`` in ``{"A1", "A2"}``.
    """
    lam_b = np.broadcast_to(lam, q1.shape[:-1])[..., None]
    p1, _ = softmax_lse(apply_mask(scale * (q1 @ np.swapaxes(k1, -1, -2)), mask))
    p2, _ = softmax_lse(apply_mask(scale * (q2 @ np.swapaxes(k2, -1, -2)), mask))
    o1 = p1 @ v
    o2 = p2 @ v
    out = o1 - lam_b * o2
    co = None
    if integral is not None:
        co = _row_average(o1 if integral[1] == "A1" else o2, integral[0])
        out = out + lam_b * co
    return out, {"q1": q1, "k1": k1, "q2": q2, "k2": k2, "v": v, "p1": p1, "p2": p2,
                 "o2": o2, "lam_b": lam_b, "scale": scale, "integral": integral, "co": co}


def _core_bwd(g, c):
    r"""Gradients of :func:`_core_fwd` (module docstring); ``lam`` gradient at the full row shape.

    With the integral term $+\lambda C O_a$: $d\lambda \mathrel{+}= \langle G, C O_a\rangle$ and
    $dO_a \mathrel{+}= \lambda C^\top G$.
    """
    lam_b, scale = c["lam_b"], c["scale"]
    do1 = g
    do2 = -lam_b * g
    dlam = -np.sum(g * c["o2"], axis=-1)
    if c["integral"] is not None:
        kind, src = c["integral"]
        dlam = dlam + np.sum(g * c["co"], axis=-1)
        extra = lam_b * _row_average_T(g, kind)
        if src == "A1":
            do1 = do1 + extra
        else:
            do2 = do2 + extra
    out = {"lam": dlam}
    dv = np.swapaxes(c["p1"], -1, -2) @ do1 + np.swapaxes(c["p2"], -1, -2) @ do2
    for a, do in (("1", do1), ("2", do2)):
        p = c["p" + a]
        ds = softmax_vjp(p, do @ np.swapaxes(c["v"], -1, -2))
        out["q" + a] = scale * (ds @ c["k" + a])
        out["k" + a] = scale * (np.swapaxes(ds, -1, -2) @ c["q" + a])
    out["v"] = dv
    return out


def diff_attention_core_forward(q1, k1, q2, k2, v, lam, *, attn_mask=None, is_causal: bool = False,
                                scale=None, kv_group_map: str = "contiguous",
                                causal_alignment: str = "bottom_right", backend: str = "numpy"):
    r"""Differential attention core $O = (A_1 - \lambda A_2)V$ on SDPA layouts.

    $$A_a = \mathrm{softmax}\bigl(s\,Q_aK_a^\top + M\bigr),\qquad
      O = A_1V - \lambda\odot A_2V .$$

    This is unilm ``multihead_flashdiff_1.py``'s ``flash_attn_func(q1, k1, v) - lambda_full *
    flash_attn_func(q2, k2, v)`` (values $2d$ wide, shared by both maps) before the per-head norm;
    ``multihead_flashdiff_2.py`` computes the same thing with $v$ split into halves (4 calls).

    Parameters
    ----------
    q1, q2 : array (..., H, N, d)
        Queries of the two maps.
    k1, k2 : array (..., Hkv, M, d)
        Keys of the two maps; ``H`` must be a multiple of ``Hkv`` (grouped-query attention).
    v : array (..., Hkv, M, dv)
        Values shared by both maps (unilm: ``dv = 2d``).
    lam : array broadcastable to (..., H, N), at least 1-d
        λ: shape ``(1,)`` for V1's single λ, ``(H, 1)`` per head, ``(B, H, N)`` per token and head
        (DIFF V2). Its gradient is summed back to its own shape.
    attn_mask : bool (True = keep) or additive float array broadcastable to (..., H, N, M)
        Applied to both maps. A fully masked row gives a 0 output row with 0 gradient
        (unilm's naive file gives NaN there).
    is_causal : bool
        Also apply a causal mask (combined with ``attn_mask`` by AND).
    scale : float, optional
        $s$; default $d^{-1/2}$ with $d$ the query/key width (unilm ``head_dim ** -0.5``).
    kv_group_map : {"contiguous", "strided"}
        KV head of query head ``h``: ``h // (H/Hkv)`` (PyTorch ``enable_gqa``, flash-attn) or
        ``h % Hkv`` (``"strided"``, as in :func:`refattn.attention.softmax.sdpa_forward`).
    causal_alignment : {"bottom_right", "top_left"}
        Default ``"bottom_right"`` as unilm (``triu(.., 1 + src_len - tgt_len)``) and flash-attn;
        PyTorch SDPA's ``is_causal`` is ``"top_left"``. They agree for ``N == M``.
    backend : {"numpy", "numba", "cuda"}
        ``"numpy"`` runs this reference; ``"numba"``/``"cuda"`` the fused kernels
        (:func:`refattn.kernels.cpu.differential.diff_attention_forward`: both maps in one pass
        over K/V). :func:`diff_attention_core_backward` follows the backend in the cache.

    Returns
    -------
    out, cache
        ``out (..., H, N, dv)``. :func:`diff_attention_core_backward` returns
        ``{"q1", "k1", "q2", "k2", "v", "lam"}``.
    """
    kernel = forward_kernel(backend, "differential", "diff_attention_forward")
    if kernel is not None:
        return kernel(q1, k1, q2, k2, v, lam, attn_mask=attn_mask, is_causal=is_causal, scale=scale,
                      kv_group_map=kv_group_map, causal_alignment=causal_alignment)
    q1, k1, q2, k2, v, lam, mask, scale = _validate_core(
        q1, k1, q2, k2, v, lam, attn_mask, is_causal, scale, kv_group_map, causal_alignment)
    dt = compute_dtype(q1, k1, q2, k2, v, lam)
    q1, k1, q2, k2, v, lam = (a.astype(dt, copy=False) for a in (q1, k1, q2, k2, v, lam))
    H, Hkv = q1.shape[-3], k1.shape[-3]
    n, m = q1.shape[-2], k1.shape[-2]
    mask = _combine_mask(mask, bool(is_causal), n, m, causal_alignment, dt)
    idx = kv_head_index(H, Hkv, kv_group_map)
    s = q1.shape[-1] ** -0.5 if scale is None else scale
    out, cache = _core_fwd(q1, _gather_heads(k1, idx), q2, _gather_heads(k2, idx),
                           _gather_heads(v, idx), lam, mask, s)
    cache.update(idx=idx, n_kv=Hkv, lam_shape=lam.shape, out_shape=out.shape)
    return out, cache


def diff_attention_core_backward(dout, cache):
    """Gradient of :func:`diff_attention_core_forward` (derivation in the module docstring); a
    cache made by a kernel backend is handed to that kernel's backward."""
    kernel = backward_kernel(cache, "differential", "diff_attention_backward")
    if kernel is not None:
        return kernel(dout, cache)
    g = _core_bwd(as_dout(dout, cache["out_shape"], cache["v"].dtype), cache)
    idx, hkv = cache["idx"], cache["n_kv"]
    return {"q1": g["q1"], "k1": _scatter_heads(g["k1"], idx, hkv), "q2": g["q2"],
            "k2": _scatter_heads(g["k2"], idx, hkv), "v": _scatter_heads(g["v"], idx, hkv),
            "lam": sum_to_shape(g["lam"], cache["lam_shape"])}


def diff_attention_core(q1, k1, q2, k2, v, lam, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`diff_attention_core_forward`."""
    return diff_attention_core_forward(q1, k1, q2, k2, v, lam, **config)[0]


# --------------------------------------------------------------------------------------------
# Layer pieces shared by V1, DiffCLIP, GDA, DiffLoRA and Shared DIFF


def _lambda_fwd(lq1, lk1, lq2, lk2, lambda_init):
    r"""$\lambda = e^{\lambda_{q1}\cdot\lambda_{k1}} - e^{\lambda_{q2}\cdot\lambda_{k2}} + \lambda_{init}$ (0-d)."""
    e1 = np.exp(np.dot(lq1, lk1))
    e2 = np.exp(np.dot(lq2, lk2))
    return np.asarray(e1 - e2 + lambda_init, dtype=lq1.dtype), (e1, e2)


def _lambda_bwd(dlam, lq1, lk1, lq2, lk2, saved):
    r"""$d\lambda_{q1} = d\lambda\,e_1\lambda_{k1}$, $d\lambda_{k1} = d\lambda\,e_1\lambda_{q1}$,
    $d\lambda_{q2} = -d\lambda\,e_2\lambda_{k2}$, $d\lambda_{k2} = -d\lambda\,e_2\lambda_{q2}$."""
    e1, e2 = saved
    dlam = float(np.sum(dlam))
    return {"lambda_q1": dlam * e1 * lk1, "lambda_k1": dlam * e1 * lq1,
            "lambda_q2": -dlam * e2 * lk2, "lambda_k2": -dlam * e2 * lq2}


def _heads_fwd(q1, k1, q2, k2, v, lam, *, mask, scale, cos, sin, interleaved, subln, norm_w, eps,
               rescale, integral=None, norm_b=None):
    """RoPE on the four query/key tensors, the core (MHA-expanded heads), per-head norm, rescale."""
    r = [_rope_apply(t, cos, sin, interleaved) for t in (q1, k1, q2, k2)]
    o, core = _core_fwd(r[0], r[1], r[2], r[3], v, lam, mask, scale, integral)
    saved = None
    if subln in ("rms", "layer"):
        o, saved = _subln_fwd(o, norm_w, norm_b, eps, center=subln == "layer")
    return o * rescale, {"core": core, "norm": saved, "rope": (cos, sin, interleaved), "rescale": rescale,
                         "has_bias": norm_b is not None}


def _heads_bwd(g, c, norm_w):
    """Gradients of :func:`_heads_fwd`: q1, k1, q2, k2, v, lam (full row shape), norm weight."""
    g = g * c["rescale"]
    dw = db = None
    if c["norm"] is not None:
        g, dw, db = _subln_bwd(g, c["norm"], norm_w, c["has_bias"])
    d = _core_bwd(g, c["core"])
    cos, sin, inter = c["rope"]
    for key in ("q1", "k1", "q2", "k2"):
        d[key] = _rope_apply(d[key], cos, sin, inter, conjugate=True)
    d["norm_weight"] = dw
    d["norm_bias"] = db
    return d


def _layer_config(x, n, is_causal, attn_mask, causal_alignment, rel_pos, rope_interleaved, scale, d,
                  subln, subln_eps, n_heads, dt):
    mask = as_bool_or_float_mask(attn_mask, "attn_mask")
    if mask is not None:
        check_broadcastable("attn_mask", mask.shape, x.shape[:-2] + (n_heads, n, n),
                            "the scores (B, H, N, N) of shape")
    if is_causal is None:
        is_causal = mask is None  # unilm: the causal mask is used only when no attn_mask is passed
    if not isinstance(is_causal, (bool, np.bool_)):
        raise TypeError(f"is_causal must be a bool or None; got {type(is_causal).__name__}")
    check_choice(causal_alignment, "causal_alignment", ("bottom_right", "top_left"))
    if not isinstance(rope_interleaved, (bool, np.bool_)):
        raise TypeError(f"rope_interleaved must be a bool; got {type(rope_interleaved).__name__}")
    check_choice(subln, "subln", ("rms", "layer", "none"))
    eps = check_positive(subln_eps, "subln_eps")
    scale = check_positive(scale, "scale", allow_none=True)
    cos, sin = _check_rel_pos(rel_pos, n, d, dt)
    mask = _combine_mask(mask, bool(is_causal), n, n, causal_alignment, dt)
    return mask, cos, sin, (d ** -0.5 if scale is None else scale), eps


def _resolve_lambda_init(depth, lambda_init, convention):
    if lambda_init is not None:
        if depth is not None:
            raise ValueError("pass either depth (the layer index) or lambda_init (a fixed value), not both")
        if isinstance(lambda_init, (bool, np.bool_)) or not isinstance(lambda_init, (int, float, np.number)):
            raise TypeError(f"lambda_init must be a real number; got {type(lambda_init).__name__}")
        if not np.isfinite(lambda_init):
            raise ValueError(f"lambda_init must be finite; got {lambda_init}")
        return float(lambda_init)
    if depth is None:
        raise ValueError("pass depth (the layer index, see lambda_init_convention) or lambda_init")
    return lambda_init_fn(depth, convention)


def v1_pairing_index(num_heads: int, num_kv_heads: int, pairing: str = "adjacent",
                     gqa_pairing: str = "naive"):
    r"""Index maps of the V1 layer: for each differential head ``i``, the query half-heads of
    $Q_1, Q_2$, the key half-heads of $K_1, K_2$ and the value head.

    * ``pairing="adjacent"`` (unilm: ``view(.., 2H, d)`` then ``view(.., H, 2, ..)``): $Q_1, Q_2$
      of head ``i`` are half-heads ``2i, 2i+1``; ``"halves"``: ``i`` and ``H + i``.
    * ``gqa_pairing="naive"`` (unilm ``multihead_diffattn.py``): ``repeat_kv`` repeats the ``2 Hkv``
      key half-heads contiguously, so query half-head ``j`` meets key half-head ``j // n_rep``;
      for ``n_rep = 2`` both maps of head ``i`` use key half-head ``i``.
      ``"flash"`` (``multihead_flashdiff_{1,2}.py``): head ``i`` uses kv head ``i // n_rep`` and
      its own pair of key half-heads. They agree when ``n_rep = 1``.
    * The value head is ``i // n_rep`` in both files.
    """
    check_choice(pairing, "pairing", ("adjacent", "halves"))
    check_choice(gqa_pairing, "gqa_pairing", ("naive", "flash"))
    h = np.arange(num_heads)
    n_rep = num_heads // num_kv_heads
    if pairing == "adjacent":
        qp1, qp2 = 2 * h, 2 * h + 1
    else:
        qp1, qp2 = h, num_heads + h
    j = h // n_rep
    if gqa_pairing == "naive":
        kp1, kp2 = qp1 // n_rep, qp2 // n_rep
    elif pairing == "adjacent":
        kp1, kp2 = 2 * j, 2 * j + 1
    else:
        kp1, kp2 = j, num_kv_heads + j
    return qp1, qp2, kp1, kp2, j


# --------------------------------------------------------------------------------------------
# DIFF Transformer V1 layer

_V1_LAMBDA = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")


def _v1_generic_forward(x, params, *, where, names, num_heads, q_halves, k_halves, v_heads, d, dv,
                        index, attn_mask, is_causal, causal_alignment, rel_pos, rope_interleaved,
                        scale, subln, subln_affine, subln_eps, lambda_init_value, rescale,
                        optional_bias, integral=None):
    """Projections -> gather (pairing/GQA) -> RoPE/core/norm -> merge -> out_proj."""
    x = as_float(x, "x", min_ndim=2)
    C = x.shape[-1]
    nq, nk, nv, no, nn_ = names["q"], names["k"], names["v"], names["o"], names["norm"]
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of arrays for {where}; got {type(params).__name__}")
    c_out = None
    if f"{no}.weight" in params:
        ow = np.shape(params[f"{no}.weight"])
        c_out = ow[1] if len(ow) == 2 else None
    if c_out is None:
        raise ValueError(f"params must contain '{no}.weight' of shape ({num_heads * dv}, C_out)")
    required = {f"{nq}.weight": (C, q_halves * d), f"{nk}.weight": (C, k_halves * d),
                f"{nv}.weight": (C, v_heads * dv), f"{no}.weight": (num_heads * dv, c_out)}
    for key in _V1_LAMBDA:
        required[key] = (d,)
    if subln != "none" and subln_affine:
        required[f"{nn_}.weight"] = (dv,)
        if subln == "layer":
            required[f"{nn_}.bias"] = (dv,)
    optional = {}
    if optional_bias:
        optional = {f"{nq}.bias": (q_halves * d,), f"{nk}.bias": (k_halves * d,),
                    f"{nv}.bias": (v_heads * dv,), f"{no}.bias": (c_out,)}
    P = check_params(params, {**required, **optional}, optional=tuple(optional), where=where)
    dt = compute_dtype(x, *P.values())
    x = x.astype(dt, copy=False)
    P = cast_all(dt, P)
    n = x.shape[-2]
    mask, cos, sin, s, eps = _layer_config(x, n, is_causal, attn_mask, causal_alignment, rel_pos,
                                           rope_interleaved, scale, d, subln, subln_eps, num_heads, dt)
    qp1, qp2, kp1, kp2, vp = index
    q = split_heads(linear_prefixed(P, nq, x), q_halves, d)
    k = split_heads(linear_prefixed(P, nk, x), k_halves, d)
    v = split_heads(linear_prefixed(P, nv, x), v_heads, dv)
    lam, lam_saved = _lambda_fwd(*(P[key] for key in _V1_LAMBDA), lambda_init_value)
    norm_w = P.get(f"{nn_}.weight")
    o, hc = _heads_fwd(_gather_heads(q, qp1), _gather_heads(k, kp1), _gather_heads(q, qp2),
                       _gather_heads(k, kp2), _gather_heads(v, vp), lam, mask=mask, scale=s,
                       cos=cos, sin=sin, interleaved=bool(rope_interleaved), subln=subln,
                       norm_w=norm_w, eps=eps, rescale=rescale, integral=integral,
                       norm_b=P.get(f"{nn_}.bias"))
    merged = merge_heads(o)
    out = linear_prefixed(P, no, merged)
    cache = {"x": x, "P": P, "names": names, "hc": hc, "merged": merged, "lam_saved": lam_saved,
             "index": index, "halves": (q_halves, k_halves, v_heads), "d": d, "dv": dv,
             "num_heads": num_heads, "out_shape": out.shape, "lam": lam}
    return out, cache


def _v1_generic_backward(dout, cache):
    x, P, names = cache["x"], cache["P"], cache["names"]
    dout = as_dout(dout, cache["out_shape"], x.dtype)
    grads: dict = {}
    dmerged = linear_prefixed_vjp(grads, P, names["o"], dout, cache["merged"])
    H, dv = cache["num_heads"], cache["dv"]
    do = split_heads(dmerged, H, dv)
    norm_key = f"{names['norm']}.weight"
    dh = _heads_bwd(do, cache["hc"], P.get(norm_key))
    if norm_key in P:
        grads[norm_key] = dh["norm_weight"]
    if f"{names['norm']}.bias" in P:
        grads[f"{names['norm']}.bias"] = dh["norm_bias"]
    grads.update(_lambda_bwd(dh["lam"], *(P[key] for key in _V1_LAMBDA), cache["lam_saved"]))
    qp1, qp2, kp1, kp2, vp = cache["index"]
    qh, kh, vh = cache["halves"]
    dq = _scatter_heads(dh["q1"], qp1, qh) + _scatter_heads(dh["q2"], qp2, qh)
    dk = _scatter_heads(dh["k1"], kp1, kh) + _scatter_heads(dh["k2"], kp2, kh)
    dvv = _scatter_heads(dh["v"], vp, vh)
    dx = linear_prefixed_vjp(grads, P, names["q"], merge_heads(dq), x)
    dx = dx + linear_prefixed_vjp(grads, P, names["k"], merge_heads(dk), x)
    dx = dx + linear_prefixed_vjp(grads, P, names["v"], merge_heads(dvv), x)
    grads["x"] = dx
    return grads


def diff_attention_v1_forward(x, params, *, num_heads: int, num_kv_heads: int | None = None,
                              depth: int | None = None, lambda_init: float | None = None,
                              lambda_init_convention: str = "unilm", attn_mask=None,
                              is_causal: bool | None = None, causal_alignment: str = "bottom_right",
                              rel_pos=None, rope_interleaved: bool = True, scale=None,
                              pairing: str = "adjacent", gqa_pairing: str = "naive",
                              subln: str = "rms", subln_affine: bool = True, subln_eps: float = 1e-5,
                              rescale: bool = True):
    r"""DIFF Transformer V1 multi-head differential attention layer (unilm semantics).

    Follows microsoft/unilm ``Diff-Transformer/multihead_diffattn.py`` (``MultiheadDiffAttn``),
    with the flash files ``multihead_flashdiff_1.py`` / ``multihead_flashdiff_2.py`` as the
    ``gqa_pairing="flash"`` option, ``rms_norm.py`` for the per-head norm and
    ``kernel/rotary.py`` (``apply_rotary_emb(..., interleaved=True)``) for RoPE. Paper: Ye et al.,
    "Differential Transformer", ICLR 2025, arXiv 2410.05258.

    With $H$ = ``num_heads`` (half the baseline's head count), half-head width $d$, $s = d^{-1/2}$:

    $$Q = XW_q\ (2H\text{ half-heads}),\ K = XW_k\ (2H_{kv}),\ V = XW_v\ (H_{kv}\text{ heads of }2d),$$
    $$\lambda = e^{\lambda_{q1}\cdot\lambda_{k1}} - e^{\lambda_{q2}\cdot\lambda_{k2}} + \lambda_{init},$$
    $$\mathrm{head}_i = (1-\lambda_{init})\,\mathrm{RMSNorm}_{2d}\bigl((A_{i,1} - \lambda A_{i,2})V_i\bigr),
      \quad A_{i,a} = \mathrm{softmax}(s\,\mathrm{rope}(Q_{i,a})\,\mathrm{rope}(K_{i,a})^\top + M),$$
    $$Y = [\mathrm{head}_1\|\dots\|\mathrm{head}_H]\,W_o .$$

    Parameters
    ----------
    x : array (B.., N, C)
    params : dict
        PyTorch ``state_dict`` names, linear weights transposed to ``(in, out)``:
        ``"q_proj.weight" (C, 2Hd)``, ``"k_proj.weight" (C, 2H_{kv}d)``,
        ``"v_proj.weight" (C, 2H_{kv}d)``, ``"out_proj.weight" (2Hd, C_out)``,
        ``"lambda_q1"``, ``"lambda_k1"``, ``"lambda_q2"``, ``"lambda_k2"`` ``(d,)`` and
        ``"subln.weight" (2d,)`` (only when ``subln_affine``). Optional ``"<proj>.bias"`` entries
        are accepted (unilm is bias-free). Load a checkpoint with
        ``{k: v.T if k.endswith("proj.weight") else v for k, v in sd.items()}``.
    num_heads, num_kv_heads : int
        Differential heads $H$ and kv heads $H_{kv}$ (default $H$); $d$ is inferred from
        ``q_proj.weight`` as ``out / (2H)``.
    depth, lambda_init, lambda_init_convention
        $\lambda_{init}$ = :func:`lambda_init_fn` ``(depth, lambda_init_convention)`` (unilm:
        ``depth`` is the 0-based layer index) or a fixed ``lambda_init`` (DiffCLIP: 0.8).
    attn_mask, is_causal, causal_alignment
        ``is_causal=None`` is unilm's rule: causal (``triu(-inf, 1 + src_len - tgt_len)``, i.e.
        bottom-right) when ``attn_mask`` is None, else only ``attn_mask``. The mask is shared by
        both maps of a head and broadcasts to ``(B, H, N, N)``. Fully masked rows give 0 (unilm:
        NaN).
    rel_pos : (cos, sin), optional
        RoPE tables ``(N_ro >= N, r/2)``, ``r <= d`` (see :func:`rope_tables`), applied to every
        query and key half-head; ``None`` = no RoPE.
    rope_interleaved : bool
        ``True`` (unilm, GPT-J pairs ``(2j, 2j+1)``) or ``False`` (rotate-half, GPT-NeoX).
    scale : float, optional
        Default $d^{-1/2}$ (half-head width, as unilm ``scaling``).
    pairing : {"adjacent", "halves"}
        Half-heads $(2i, 2i+1)$ (unilm) or $(i, H+i)$ (some ports); applies to queries and,
        under ``gqa_pairing="flash"``, to keys.
    gqa_pairing : {"naive", "flash"}
        See :func:`v1_pairing_index`; unilm's two files disagree when ``H / H_kv > 1``.
    subln, subln_affine, subln_eps
        Per-head norm over $2d$: ``"rms"`` (unilm ``RMSNorm(2d, eps=1e-5, elementwise_affine=True)``;
        the affine flag was False in the first release, PR #1644), ``"layer"`` (the paper's
        "GroupNorm applied to each head independently": mean-centred, with ``subln.weight`` and
        ``subln.bias`` of shape ``(2d,)`` shared by the heads) or ``"none"``.
    rescale : bool
        Multiply by $(1-\lambda_{init})$ after the norm (unilm: always).

    Returns
    -------
    out, cache
        ``out (B.., N, C_out)``; :func:`diff_attention_v1_backward` returns ``"x"`` and every
        params key.
    """
    return _diff_v1_forward_impl(
        x, params, num_heads=num_heads, num_kv_heads=num_kv_heads, depth=depth, lambda_init=lambda_init,
        lambda_init_convention=lambda_init_convention, attn_mask=attn_mask, is_causal=is_causal,
        causal_alignment=causal_alignment, rel_pos=rel_pos, rope_interleaved=rope_interleaved, scale=scale,
        pairing=pairing, gqa_pairing=gqa_pairing, subln=subln, subln_affine=subln_affine, subln_eps=subln_eps,
        rescale=rescale, integral=None)


def _diff_v1_forward_impl(x, params, *, num_heads, num_kv_heads, depth, lambda_init, lambda_init_convention,
                          attn_mask, is_causal, causal_alignment, rel_pos, rope_interleaved, scale, pairing,
                          gqa_pairing, subln, subln_affine, subln_eps, rescale, integral):
    """:func:`diff_attention_v1_forward` with DINT's optional integral term (``integral=(kind, source)``)."""
    num_heads = check_int(num_heads, "num_heads", minimum=1)
    num_kv_heads = num_heads if num_kv_heads is None else check_int(num_kv_heads, "num_kv_heads", minimum=1)
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    if not isinstance(params, dict) or "q_proj.weight" not in params:
        raise ValueError("params must be a dict containing 'q_proj.weight' of shape (C, 2 * num_heads * d)")
    qw = np.shape(params["q_proj.weight"])
    if len(qw) != 2 or qw[1] % (2 * num_heads):
        raise ValueError(f"q_proj.weight must have shape (C, 2 * num_heads * d) with num_heads = "
                         f"{num_heads}; got {qw}")
    d = qw[1] // (2 * num_heads)
    lam0 = _resolve_lambda_init(depth, lambda_init, lambda_init_convention)
    if not isinstance(rescale, (bool, np.bool_)) or not isinstance(subln_affine, (bool, np.bool_)):
        raise TypeError("rescale and subln_affine must be bools")
    index = v1_pairing_index(num_heads, num_kv_heads, pairing, gqa_pairing)
    out, cache = _v1_generic_forward(
        x, params, where="diff_attention_v1",
        names={"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "out_proj", "norm": "subln"},
        num_heads=num_heads, q_halves=2 * num_heads, k_halves=2 * num_kv_heads, v_heads=num_kv_heads,
        d=d, dv=2 * d, index=index, attn_mask=attn_mask, is_causal=is_causal,
        causal_alignment=causal_alignment, rel_pos=rel_pos, rope_interleaved=rope_interleaved,
        scale=scale, subln=subln, subln_affine=subln_affine, subln_eps=subln_eps,
        lambda_init_value=lam0, rescale=(1.0 - lam0) if rescale else 1.0, optional_bias=True,
        integral=integral)
    cache["lambda_init"] = lam0
    return out, cache


def diff_attention_v1_backward(dout, cache):
    r"""Gradient of :func:`diff_attention_v1_forward` for ``x`` and every params key.

    Chain (reverse of the forward): $dZ = G W_o^\top$, $dW_o = Z^\top G$ ($Z$ the merged heads);
    split heads; $\times(1-\lambda_{init})$; RMSNorm VJP (:func:`_subln_bwd`, gives
    ``subln.weight``); the core VJP (module docstring) with $d\lambda$ summed over batch, heads,
    positions and channels; λ re-parameterisation (:func:`_lambda_bwd`); RoPE VJP (rotation by
    $-\theta$); the adjoint of the pairing/GQA gather (sums over every differential head that used
    a half-head); $dX = \sum_p dY_p W_p^\top$ over the three projections.
    """
    return _v1_generic_backward(dout, cache)


def diff_attention_v1(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`diff_attention_v1_forward`."""
    return diff_attention_v1_forward(x, params, **config)[0]


# --------------------------------------------------------------------------------------------
# Registry: samplers and checks


def _explicit_core(q1, k1, q2, k2, v, lam, *, attn_mask=None, is_causal=False, scale=None,
                   kv_group_map="contiguous", causal_alignment="bottom_right"):
    """The core written as two separate attention maps with explicit loops over heads."""
    H, Hkv = q1.shape[-3], k1.shape[-3]
    idx = kv_head_index(H, Hkv, kv_group_map)
    s = q1.shape[-1] ** -0.5 if scale is None else scale
    n, m = q1.shape[-2], k1.shape[-2]
    keep = np.ones((n, m), bool)
    if is_causal:
        keep = causal_keep(n, m, causal_alignment)
    out = np.zeros(q1.shape[:-1] + (v.shape[-1],))
    lam_b = np.broadcast_to(lam, q1.shape[:-1])
    for h in range(H):
        maps = []
        for q, k in ((q1, k1), (q2, k2)):
            sc = s * np.einsum("...nd,...md->...nm", q[..., h, :, :], k[..., idx[h], :, :])
            bias = np.where(keep, 0.0, -np.inf)
            if attn_mask is not None:
                mk = np.broadcast_to(attn_mask, q1.shape[:-1] + (m,))[..., h, :, :]
                bias = bias + (np.where(mk, 0.0, -np.inf) if mk.dtype == bool else mk)
            sc = sc + bias
            mx = np.max(sc, axis=-1, keepdims=True)
            e = np.exp(sc - np.where(np.isfinite(mx), mx, 0.0))
            z = e.sum(-1, keepdims=True)
            maps.append(e / np.where(z == 0, 1.0, z))
        out[..., h, :, :] = (maps[0] @ v[..., idx[h], :, :]
                             - lam_b[..., h, :, None] * (maps[1] @ v[..., idx[h], :, :]))
    return out


def _sample_core(rng, size):
    if size == "tiny":
        B, H, Hkv, n, m, d, dv = 2, 2, 1, int(rng.integers(2, 4)), int(rng.integers(2, 4)), 2, 2
    else:
        B, H, Hkv, n, m, d, dv = 2, 4, 2, int(rng.integers(4, 7)), int(rng.integers(4, 7)), 4, 3
    q1, q2 = rng.standard_normal((2, B, H, n, d))
    k1, k2 = rng.standard_normal((2, B, Hkv, m, d))
    v = rng.standard_normal((B, Hkv, m, dv))
    lam = 0.5 + 0.3 * rng.standard_normal((B, H, 1))  # per batch element and head
    keep = rng.random((n, m)) > 0.3
    keep[:, 0] = True
    return Sample(inputs={"q1": q1, "k1": k1, "q2": q2, "k2": k2, "v": v, "lam": lam},
                  config={"attn_mask": keep, "is_causal": bool(rng.integers(0, 2))})


def _draw_lambda_vectors(rng, d, lambda_init, n=4):
    r"""λ vectors with $|1 - \lambda| \ge 0.3$: under a causal mask the first query sees one key,
    $A_1 = A_2$ there and its pre-norm output is $(1-\lambda)v_0$; RMSNorm is ill-conditioned near
    0, so a sample with $\lambda\approx 1$ is a near-kink for finite differences."""
    while True:
        vec = 0.4 * rng.standard_normal((n, d))
        lam = np.exp(vec[0] @ vec[1]) - np.exp(vec[2] @ vec[3]) + lambda_init
        if abs(1.0 - lam) >= 0.3:
            return dict(zip(_V1_LAMBDA, vec))


def _v1_params(rng, C, H, Hkv, d, c_out=None, bias=False, lambda_init=0.5):
    c_out = C if c_out is None else c_out
    P = {"q_proj.weight": rng.standard_normal((C, 2 * H * d)) / np.sqrt(C),
         "k_proj.weight": rng.standard_normal((C, 2 * Hkv * d)) / np.sqrt(C),
         "v_proj.weight": rng.standard_normal((C, 2 * Hkv * d)) / np.sqrt(C),
         "out_proj.weight": rng.standard_normal((2 * H * d, c_out)) / np.sqrt(2 * H * d)}
    P.update(_draw_lambda_vectors(rng, d, lambda_init))
    P["subln.weight"] = 1.0 + 0.2 * rng.standard_normal(2 * d)
    if bias:
        for key, w in list(P.items()):
            if key.endswith("proj.weight"):
                P[key.replace("weight", "bias")] = 0.1 * rng.standard_normal(w.shape[1])
    return P


def _sample_v1(rng, size):
    if size == "tiny":
        B, n, C, H, d = 2, int(rng.integers(2, 4)), 3, 2, 2
    else:
        B, n, C, H, d = 2, int(rng.integers(4, 7)), 6, 2, 4
    Hkv = int(rng.choice([1, H]))
    x = rng.standard_normal((B, n, C))
    depth = int(rng.integers(0, 6))
    subln = str(rng.choice(["rms", "rms", "layer"]))
    cfg = {"num_heads": H, "num_kv_heads": Hkv, "depth": depth, "subln": subln,
           "rel_pos": rope_tables(n, d), "gqa_pairing": str(rng.choice(["naive", "flash"]))}
    P = _v1_params(rng, C, H, Hkv, d, lambda_init=lambda_init_fn(depth))
    if subln == "layer":
        P["subln.bias"] = 0.1 * rng.standard_normal(2 * d)
    return Sample(inputs={"x": x}, params=P, config=cfg)


def _check_core_explicit_gqa(rng):
    s = _sample_core(rng, "small")
    for gm in _KV_GROUP_MAPS:
        cfg = dict(s.config, kv_group_map=gm)
        out = diff_attention_core(**s.inputs, **cfg)
        err = float(np.abs(out - _explicit_core(**s.inputs, **cfg)).max())
        assert err < 1e-12, f"core with kv_group_map={gm} differs from the explicit form by {err}"
    return err


def _check_core_two_sdpa(rng):
    # O = sdpa(q1, k1, v) - lam sdpa(q2, k2, v); gradients from sdpa_backward with dO1 = G, dO2 = -lam G.
    from .softmax import sdpa_backward, sdpa_forward

    s = _sample_core(rng, "small")
    for gm in ("contiguous", "strided"):
        cfg = dict(s.config, kv_group_map=gm)
        i = s.inputs
        out, cache = diff_attention_core_forward(**i, **cfg)
        o1, c1 = sdpa_forward(i["q1"], i["k1"], i["v"], causal_alignment="bottom_right", **cfg)
        o2, c2 = sdpa_forward(i["q2"], i["k2"], i["v"], causal_alignment="bottom_right", **cfg)
        lam_b = np.broadcast_to(i["lam"], o1.shape[:-1])[..., None]
        err = float(np.abs(out - (o1 - lam_b * o2)).max())
        g = rng.standard_normal(out.shape)
        mine = diff_attention_core_backward(g, cache)
        g1, g2 = sdpa_backward(g, c1), sdpa_backward(-lam_b * g, c2)
        ref = {"q1": g1["q"], "k1": g1["k"], "q2": g2["q"], "k2": g2["k"], "v": g1["v"] + g2["v"],
               "lam": sum_to_shape(-np.sum(g * o2, -1), i["lam"].shape)}
        err = max([err] + [float(np.abs(mine[k] - ref[k]).max()) for k in ref])
        assert err < 1e-12, f"core differs from two sdpa calls by {err} (kv_group_map={gm})"
    return err


def _check_core_rows_sum(rng):
    # With v = 1 the output is the row sum of A1 - lam A2, which must be 1 - lam (not 1).
    B, H, n, d = 2, 3, 4, 2
    q1, q2, k1, k2 = rng.standard_normal((4, B, H, n, d))
    lam = rng.standard_normal((B, H, n))
    out = diff_attention_core(q1, k1, q2, k2, np.ones((B, H, n, 1)), lam, is_causal=True)
    err = float(np.abs(out[..., 0] - (1 - lam)).max())
    assert err < 1e-13, f"row sums differ from 1 - lambda by {err}"
    return err


def _check_core_fully_masked(rng):
    B, H, n, d = 2, 2, 3, 2
    q1, q2, k1, k2, v = rng.standard_normal((5, B, H, n, d))
    keep = np.ones((n, n), bool)
    keep[1] = False
    out, cache = diff_attention_core_forward(q1, k1, q2, k2, v, np.array([0.7]), attn_mask=keep)
    g = diff_attention_core_backward(rng.standard_normal(out.shape), cache)
    assert np.all(out[..., 1, :] == 0) and np.all(g["q1"][..., 1, :] == 0) and np.all(g["q2"][..., 1, :] == 0)
    assert all(np.isfinite(a).all() for a in g.values())
    return 0.0


def _v1_reference_loop(x, params, *, num_heads, num_kv_heads=None, depth=None, lambda_init=None,
                       lambda_init_convention="unilm", attn_mask=None, is_causal=None,
                       causal_alignment="bottom_right", rel_pos=None, rope_interleaved=True,
                       scale=None, pairing="adjacent", gqa_pairing="naive", subln="rms",
                       subln_affine=True, subln_eps=1e-5, rescale=True):
    """unilm's naive file transcribed step by step (view, repeat_kv, 2H maps, view(.., 2, ..))."""
    H = num_heads
    Hkv = H if num_kv_heads is None else num_kv_heads
    n_rep = H // Hkv
    P = params
    B, n, C = x.shape
    d = P["q_proj.weight"].shape[1] // (2 * H)
    lam0 = lambda_init if lambda_init is not None else lambda_init_fn(depth, lambda_init_convention)
    q = (x @ P["q_proj.weight"]).reshape(B, n, 2 * H, d)
    k = (x @ P["k_proj.weight"]).reshape(B, n, 2 * Hkv, d)
    v = (x @ P["v_proj.weight"]).reshape(B, n, Hkv, 2 * d)
    if rel_pos is not None:
        cos, sin = rel_pos
        q = np.swapaxes(_rope_apply(np.swapaxes(q, 1, 2), cos, sin, rope_interleaved), 1, 2)
        k = np.swapaxes(_rope_apply(np.swapaxes(k, 1, 2), cos, sin, rope_interleaved), 1, 2)
    q = np.swapaxes(q, 1, 2)
    k, v = np.swapaxes(k, 1, 2), np.swapaxes(v, 1, 2)
    if gqa_pairing == "naive":
        k = np.repeat(k, n_rep, axis=1)  # repeat_kv: each half-head n_rep times, contiguously
    else:  # flash: reshape keys to (Hkv, 2, d) and repeat kv heads
        k = np.repeat(k.reshape(B, Hkv, 2, n, d), n_rep, axis=1).reshape(B, 2 * H, n, d)
    v = np.repeat(v, n_rep, axis=1)
    s = d ** -0.5 if scale is None else scale
    w = (q * s) @ np.swapaxes(k, -1, -2)
    if is_causal is None:
        is_causal = attn_mask is None
    bias = np.zeros((n, n))
    if is_causal:
        bias = np.triu(np.full((n, n), -np.inf), 1)
    if attn_mask is not None:
        bias = bias + (np.where(attn_mask, 0.0, -np.inf) if attn_mask.dtype == bool else attn_mask)
    w = w + bias
    w = np.exp(w - w.max(-1, keepdims=True))
    w = w / w.sum(-1, keepdims=True)
    lam = (np.exp(np.sum(P["lambda_q1"] * P["lambda_k1"])) - np.exp(np.sum(P["lambda_q2"] * P["lambda_k2"]))
           + lam0)
    w = w.reshape(B, H, 2, n, n)
    w = w[:, :, 0] - lam * w[:, :, 1]
    o = w @ v
    if subln != "none":
        if subln == "layer":
            o = o - np.mean(o, -1, keepdims=True)
        o = o / np.sqrt(np.mean(o ** 2, -1, keepdims=True) + subln_eps)
        if subln_affine:
            o = o * P["subln.weight"] + (P["subln.bias"] if subln == "layer" else 0.0)
    if rescale:
        o = o * (1 - lam0)
    o = np.swapaxes(o, 1, 2).reshape(B, n, H * 2 * d)
    return o @ P["out_proj.weight"]


def _v1_sample_lambda_zero(rng):
    """A small V1 sample whose ``lambda_k2`` is set so that lambda = 0 (``e1 - e2 = -lambda_init``);
    returns ``(sample, params, lambda_init)``."""
    s = _sample_v1(rng, "small")
    P = dict(s.params)
    lam0 = lambda_init_fn(s.config["depth"])
    e1 = np.exp(P["lambda_q1"] @ P["lambda_k1"])
    P["lambda_k2"] = P["lambda_q2"] * np.log(e1 + lam0) / (P["lambda_q2"] @ P["lambda_q2"])
    return s, P, lam0


def _check_v1_lambda_zero(rng):
    # lambda = 0 (e1 - e2 = -lambda_init): the layer is (1 - lambda_init) RMSNorm(A1 V) W_o.
    s, P, lam0 = _v1_sample_lambda_zero(rng)
    out, cache = diff_attention_v1_forward(**s.inputs, params=P, **s.config)
    assert abs(float(cache["lam"])) < 1e-12
    ref = _v1_reference_loop(**s.inputs, params=dict(P, lambda_q2=P["lambda_q1"], lambda_k2=P["lambda_k1"]),
                             **dict(s.config, depth=None, lambda_init=0.0, rescale=False))
    # the reference above has lambda = lambda_init = 0 and no rescale; apply (1 - lambda_init).
    err = float(np.abs(out - (1 - lam0) * ref).max())
    assert err < 1e-12, f"lambda = 0 differs from the plain normed softmax path by {err}"
    return err


def _check_v1_pairings(rng):
    # MHA: naive and flash pairings coincide bit for bit; GQA with n_rep = 2: they differ.
    s = _sample_v1(rng, "small")
    x = s.inputs["x"]
    P = _v1_params(rng, x.shape[-1], 2, 2, 4)
    cfg = dict(s.config, num_kv_heads=2, subln="rms")
    a = diff_attention_v1(x, P, **dict(cfg, gqa_pairing="naive"))
    b = diff_attention_v1(x, P, **dict(cfg, gqa_pairing="flash"))
    assert np.array_equal(a, b), "naive and flash pairings differ under MHA"
    P = _v1_params(rng, x.shape[-1], 2, 1, 4)
    cfg = dict(s.config, num_kv_heads=1, subln="rms")
    a = diff_attention_v1(x, P, **dict(cfg, gqa_pairing="naive"))
    b = diff_attention_v1(x, P, **dict(cfg, gqa_pairing="flash"))
    gap = float(np.abs(a - b).max())
    assert gap > 1e-3, "naive and flash pairings should differ when n_rep = 2"
    return 0.0


def _check_v1_causal(rng):
    s = _sample_v1(rng, "small")
    x = s.inputs["x"]
    out = diff_attention_v1(x, s.params, **s.config)
    x2 = x.copy()
    x2[:, -1] += 1.0
    out2 = diff_attention_v1(x2, s.params, **s.config)
    err = float(np.abs(out[:, :-1] - out2[:, :-1]).max())
    assert err < 1e-13, f"the last token leaks into earlier outputs ({err})"
    assert np.abs(out[:, -1] - out2[:, -1]).max() > 1e-6
    return err


register(
    Mechanism(
        slug="diff_attention_core", family="2-differential", tier="primitive",
        title="Differential attention core O = (A1 - lam A2) V (SDPA layouts, GQA, masks)",
        paper=PAPER_V1, forward=diff_attention_core_forward, backward=diff_attention_core_backward,
        sample=_sample_core, reference=_explicit_core, docs="differential.md#diff_attention_core",
        checks={"explicit_gqa_maps": _check_core_explicit_gqa, "equals_two_sdpa_calls": _check_core_two_sdpa,
                "rows_sum_to_one_minus_lambda": _check_core_rows_sum,
                "fully_masked_row": _check_core_fully_masked},
    ),
    Mechanism(
        slug="diff_attention_v1", family="2-differential", tier="T1",
        title="Differential attention (DIFF Transformer V1, exact unilm semantics)",
        paper=PAPER_V1, forward=diff_attention_v1_forward, backward=diff_attention_v1_backward,
        sample=_sample_v1, reference=_v1_reference_loop, docs="differential.md#diff_attention_v1",
        checks={"lambda_zero_is_normed_softmax": _check_v1_lambda_zero, "gqa_pairings": _check_v1_pairings,
                "causal_no_leakage": _check_v1_causal},
    ),
)
