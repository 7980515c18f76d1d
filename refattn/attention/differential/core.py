r"""The differential attention core $O = (A_1 - \lambda A_2)V$ and the helpers the family shares.

Two softmax maps over the same values, combined with a signed weight:

$$O = \bigl(\mathrm{softmax}(sQ_1K_1^\top + M) - \lambda\,\mathrm{softmax}(sQ_2K_2^\top + M)\bigr)V .$$

`diff_attention_core_forward` / `diff_attention_core_backward` compute the core above
on PyTorch SDPA layouts, with a $\lambda$ that may be a scalar, per head or per token and head.
It is unilm ``multihead_flashdiff_1.py``'s ``flash_attn_func(q1, k1, v) - lambda_full *
flash_attn_func(q2, k2, v)`` before the per-head norm (paper: Ye et al., "Differential
Transformer", ICLR 2025, arXiv 2410.05258); the fused Numba kernels of
``refattn.kernels.cpu.differential`` / ``refattn.kernels.cuda.differential`` mirror it and share
its argument check (`validate_core`).

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

Shared helpers
--------------
The other modules of ``refattn.attention.differential`` build on these public helpers:

* head maps and masks: `kv_head_index`, `gather_heads` / `scatter_heads` (its adjoint),
  `causal_keep`, `combine_mask`;
* the core on MHA-expanded heads without validation, `expanded_core_forward` /
  `expanded_core_backward` (with DINT's optional integral term, `row_average` /
  `row_average_transpose`), and the core's argument check `validate_core`;
* the plain softmax-map pieces of the relatives (shaped, momentum, PCT, ReflexSplit, MALA, MTA):
  `validate_qkv`, `resolve_scale`, `additive_mask`, `softmax_map_forward` /
  `softmax_map_backward` and the parameter checks `per_head_param`, `matrix_param`,
  `vector_param`.

The layer pieces of DIFF V1 and its variants (λ schedule and re-parameterisation, per-head norm,
RoPE, the generic V1 layer) are in ``refattn.attention.differential.layer``.
"""

from __future__ import annotations

import math

import numpy as np

from ..._checks import (
    as_bool_or_float_mask,
    as_dout,
    as_float,
    check_broadcastable,
    check_choice,
    check_positive,
    compute_dtype,
)
from ...kernels import backward_kernel, forward_kernel
from ...nn.softmax import apply_mask, softmax_lse, softmax_vjp
from ...registry import Mechanism, Sample, register
from ..softmax import causal_keep as _causal_keep
from ..softmax import sdpa_backward, sdpa_forward, sum_to_shape

__all__ = [
    "PAPER_V1",
    "causal_keep",
    "KV_GROUP_MAPS",
    "kv_head_index",
    "gather_heads",
    "scatter_heads",
    "combine_mask",
    "validate_core",
    "row_average",
    "row_average_transpose",
    "expanded_core_forward",
    "expanded_core_backward",
    "diff_attention_core_forward",
    "diff_attention_core_backward",
    "diff_attention_core",
    "validate_qkv",
    "resolve_scale",
    "additive_mask",
    "softmax_map_forward",
    "softmax_map_backward",
    "per_head_param",
    "matrix_param",
    "vector_param",
]


PAPER_V1 = "Ye, Dong, Xia, Sun, Zhu, Huang, Wei, 'Differential Transformer', ICLR 2025, arXiv 2410.05258"


# --------------------------------------------------------------------------------------------
# Head maps and masks


def causal_keep(n: int, m: int, alignment: str = "bottom_right") -> np.ndarray:
    """Boolean ``(n, m)`` causal mask (True = keep).

    ``"bottom_right"``: query ``i`` sees keys ``j <= i + (m - n)`` — unilm's
    ``triu(-inf, 1 + src_len - tgt_len)`` and flash-attn >= 2.1 ``causal=True``.
    ``"top_left"``: ``j <= i`` — PyTorch ``scaled_dot_product_attention(is_causal=True)``.
    The two agree when ``n == m``. (:func:`refattn.attention.softmax.causal_keep` with unilm's
    default alignment.)
    """
    return _causal_keep(n, m, alignment)


def gather_heads(x: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """``x[..., idx, :, :]`` on the head axis (-3)."""
    return np.take(x, idx, axis=-3)


def scatter_heads(g: np.ndarray, idx: np.ndarray, n_heads: int) -> np.ndarray:
    """Adjoint of :func:`gather_heads`: sum the gathered heads back onto ``n_heads`` heads."""
    shape = g.shape[:-3] + (n_heads,) + g.shape[-2:]
    out = np.zeros(shape, dtype=g.dtype)
    for h, src in enumerate(idx):
        out[..., src, :, :] += g[..., h, :, :]
    return out


KV_GROUP_MAPS = ("contiguous", "strided")


def kv_head_index(n_heads: int, n_kv_heads: int, kv_group_map: str = "contiguous") -> np.ndarray:
    """KV head used by each query head: ``h // (H / Hkv)`` (``"contiguous"``, PyTorch
    ``enable_gqa``, flash-attn, Llama ``repeat_kv``) or ``h % Hkv`` (``"strided"``, as in
    :func:`refattn.attention.softmax.sdpa_forward` and the kernels)."""
    check_choice(kv_group_map, "kv_group_map", KV_GROUP_MAPS)
    h = np.arange(n_heads)
    return h // (n_heads // n_kv_heads) if kv_group_map == "contiguous" else h % n_kv_heads


def combine_mask(mask, is_causal, n, m, alignment, dtype):
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
# The core


def validate_core(q1, k1, q2, k2, v, lam, attn_mask, is_causal, scale, kv_group_map, causal_alignment):
    """Check and convert the arguments of `diff_attention_core_forward` (shapes, GQA head counts,
    λ and mask broadcasting, keywords); returns ``q1, k1, q2, k2, v, lam, mask, scale``.

    The Numba CPU and CUDA kernels call it too, so every backend raises the same errors.
    """
    q1 = as_float(q1, "q1", min_ndim=3)
    k1 = as_float(k1, "k1", min_ndim=3)
    q2 = as_float(q2, "q2", min_ndim=3)
    k2 = as_float(k2, "k2", min_ndim=3)
    v = as_float(v, "v", min_ndim=3)
    # ranks first, so that an error names the array that is wrong: the rank most of q1, k1, q2,
    # k2, v share (q1's on a tie) is the expected one, and the arrays off it are named. Only then
    # are the arrays compared with one another and lam with q1's rank.
    qkv = {"q1": q1, "k1": k1, "q2": q2, "k2": k2, "v": v}
    ranks = [a.ndim for a in qkv.values()]
    rank = max(sorted(set(ranks)), key=lambda r: (ranks.count(r), r == q1.ndim))
    odd = [name for name, a in qkv.items() if a.ndim != rank]
    if odd:
        got = ", ".join(f"{name} {qkv[name].shape}" for name in odd)
        raise ValueError(f"{' and '.join(odd)} must have {rank} dimensions (..., H, N, d) like the other "
                         f"q1, k1, q2, k2, v arrays; got {got}")
    if q2.shape != q1.shape:
        raise ValueError(f"q2 must have q1's shape {q1.shape}; got {q2.shape}")
    if k2.shape != k1.shape:
        raise ValueError(f"k2 must have k1's shape {k1.shape}; got {k2.shape}")
    lam = as_float(lam, "lam", min_ndim=1, max_ndim=q1.ndim - 1)
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
    check_choice(kv_group_map, "kv_group_map", KV_GROUP_MAPS)
    scale = check_positive(scale, "scale", allow_none=True)
    return q1, k1, q2, k2, v, lam, mask, scale


def row_average(o, kind):
    r"""$C\,o$ over the query axis (-2): ``"all"``: every row is the mean of all rows;
    ``"causal"``: row $i$ (0-based) is the mean of rows $0..i$."""
    if kind == "all":
        return np.broadcast_to(np.mean(o, axis=-2, keepdims=True), o.shape)
    return np.cumsum(o, axis=-2) / np.arange(1, o.shape[-2] + 1)[:, None]


def row_average_transpose(g, kind):
    r"""$C^\top g$: ``"all"``: $\frac1N\sum_i g_i$ in every row; ``"causal"``: row $i'$ gets
    $\sum_{i\ge i'} g_i/(i+1)$ (a reverse cumulative sum)."""
    n = g.shape[-2]
    if kind == "all":
        return np.broadcast_to(np.sum(g, axis=-2, keepdims=True) / n, g.shape)
    w = g / np.arange(1, n + 1)[:, None]
    return np.flip(np.cumsum(np.flip(w, axis=-2), axis=-2), axis=-2)


def expanded_core_forward(q1, k1, q2, k2, v, lam, mask, scale, integral=None):
    r"""Unvalidated core on MHA-expanded heads. ``lam`` broadcasts to the (..., H, N) rows.

    ``integral=(kind, source)`` adds DINT's integral term $\lambda\,C A_a V$ (see
    :func:`row_average`), $a$ = ``source`` in ``{"A1", "A2"}``.
    """
    lam_b = np.broadcast_to(lam, q1.shape[:-1])[..., None]
    p1, _ = softmax_lse(apply_mask(scale * (q1 @ np.swapaxes(k1, -1, -2)), mask))
    p2, _ = softmax_lse(apply_mask(scale * (q2 @ np.swapaxes(k2, -1, -2)), mask))
    o1 = p1 @ v
    o2 = p2 @ v
    out = o1 - lam_b * o2
    co = None
    if integral is not None:
        co = row_average(o1 if integral[1] == "A1" else o2, integral[0])
        out = out + lam_b * co
    return out, {"q1": q1, "k1": k1, "q2": q2, "k2": k2, "v": v, "p1": p1, "p2": p2,
                 "o2": o2, "lam_b": lam_b, "scale": scale, "integral": integral, "co": co}


def expanded_core_backward(g, c):
    r"""Gradients of :func:`expanded_core_forward` (module docstring); ``lam`` gradient at the full row shape.

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
        extra = lam_b * row_average_transpose(g, kind)
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
    q1, k1, q2, k2, v, lam, mask, scale = validate_core(
        q1, k1, q2, k2, v, lam, attn_mask, is_causal, scale, kv_group_map, causal_alignment)
    dt = compute_dtype(q1, k1, q2, k2, v, lam)
    q1, k1, q2, k2, v, lam = (a.astype(dt, copy=False) for a in (q1, k1, q2, k2, v, lam))
    H, Hkv = q1.shape[-3], k1.shape[-3]
    n, m = q1.shape[-2], k1.shape[-2]
    mask = combine_mask(mask, bool(is_causal), n, m, causal_alignment, dt)
    idx = kv_head_index(H, Hkv, kv_group_map)
    s = q1.shape[-1] ** -0.5 if scale is None else scale
    out, cache = expanded_core_forward(q1, gather_heads(k1, idx), q2, gather_heads(k2, idx),
                           gather_heads(v, idx), lam, mask, s)
    cache.update(idx=idx, n_kv=Hkv, lam_shape=lam.shape, out_shape=out.shape)
    return out, cache


def diff_attention_core_backward(dout, cache):
    """Gradient of :func:`diff_attention_core_forward` (derivation in the module docstring); a
    cache made by a kernel backend is handed to that kernel's backward."""
    kernel = backward_kernel(cache, "differential", "diff_attention_backward")
    if kernel is not None:
        return kernel(dout, cache)
    g = expanded_core_backward(as_dout(dout, cache["out_shape"], cache["v"].dtype), cache)
    idx, hkv = cache["idx"], cache["n_kv"]
    return {"q1": g["q1"], "k1": scatter_heads(g["k1"], idx, hkv), "q2": g["q2"],
            "k2": scatter_heads(g["k2"], idx, hkv), "v": scatter_heads(g["v"], idx, hkv),
            "lam": sum_to_shape(g["lam"], cache["lam_shape"])}


def diff_attention_core(q1, k1, q2, k2, v, lam, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`diff_attention_core_forward`."""
    return diff_attention_core_forward(q1, k1, q2, k2, v, lam, **config)[0]


# --------------------------------------------------------------------------------------------
# Plain softmax-map pieces shared by the relatives (shaped, momentum, PCT, ReflexSplit, MALA, MTA)


def validate_qkv(q, k, v, *, same_heads=True, self_attention=False):
    """Validate SDPA-layout ``q (..., H, N, d)``, ``k (..., H, M, d)``, ``v (..., H, M, dv)``."""
    q = as_float(q, "q", min_ndim=3)
    k = as_float(k, "k", ndim=q.ndim)
    v = as_float(v, "v", ndim=q.ndim)
    if k.shape[:-3] != q.shape[:-3] or v.shape[:-3] != q.shape[:-3]:
        raise ValueError(f"q, k and v must share their batch axes; got q {q.shape}, k {k.shape}, v {v.shape}")
    if same_heads and (k.shape[-3] != q.shape[-3] or v.shape[-3] != q.shape[-3]):
        raise ValueError(f"q, k and v must have the same number of heads (axis -3); got q {q.shape}, "
                         f"k {k.shape}, v {v.shape}")
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"the head width (last axis) of q ({q.shape[-1]}) and k ({k.shape[-1]}) must agree")
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(f"k and v must have the same number of keys (axis -2); got k {k.shape}, v {v.shape}")
    if self_attention and k.shape[-2] != q.shape[-2]:
        raise ValueError(f"this mechanism is self-attention: q and k must have the same length (axis -2); "
                         f"got q {q.shape}, k {k.shape}")
    dt = compute_dtype(q, k, v)
    return q.astype(dt, copy=False), k.astype(dt, copy=False), v.astype(dt, copy=False), dt


def resolve_scale(scale, d):
    r"""The softmax scale: ``scale`` (checked positive) or $d^{-1/2}$."""
    # a Python float (not np.float64) so that float32 inputs stay float32 (NEP 50 weak scalars)
    return 1.0 / math.sqrt(d) if scale is None else check_positive(scale, "scale")


def additive_mask(attn_mask, is_causal, s_shape, *, align="top_left"):
    r"""Combine a user mask and the causal mask into one additive float mask (or None).

    ``align="top_left"`` keeps $j \le i$ (PyTorch SDPA ``is_causal``); ``"bottom_right"`` keeps
    $j \le i + M - N$ (HF GPT-2, used by He & Hofmann's code).
    """
    if not isinstance(is_causal, (bool, np.bool_)):
        raise TypeError(f"is_causal must be a bool; got {type(is_causal).__name__}")
    mask = as_bool_or_float_mask(attn_mask, "attn_mask")
    if mask is not None:
        check_broadcastable("attn_mask", mask.shape, s_shape, "the score map of shape")
        if mask.dtype == np.bool_:
            mask = np.where(mask, 0.0, -np.inf)
    if is_causal:
        n, m = s_shape[-2], s_shape[-1]
        off = 0 if align == "top_left" else m - n
        keep = np.arange(m)[None, :] <= np.arange(n)[:, None] + off
        causal = np.where(keep, 0.0, -np.inf)
        mask = causal if mask is None else mask + causal
    return mask


def softmax_map_forward(q, k, mask, scale):
    r"""$P = \mathrm{softmax}(s\,QK^\top + M)$ (fully masked rows are 0)."""
    s = scale * (q @ np.swapaxes(k, -1, -2))
    p, _ = softmax_lse(apply_mask(s, mask), -1)
    return p


def softmax_map_backward(dp, p, q, k, scale):
    r"""Given $dP$: $dS = P\odot(dP - \mathrm{rowsum}(P\odot dP))$, $dQ = s\,dS K$, $dK = s\,dS^\top Q$."""
    ds = softmax_vjp(p, dp, -1)
    return scale * (ds @ k), scale * (np.swapaxes(ds, -1, -2) @ q), ds


def per_head_param(params, name, h, dt, *, allow_scalar=False):
    """``params[name]`` as an ``(H,)`` vector (or a scalar when ``allow_scalar``) in dtype ``dt``."""
    x = as_float(params[name], name, max_ndim=1)
    if x.ndim == 0 and allow_scalar:
        return x.astype(dt, copy=False)
    if x.shape != (h,):
        shape = "() or " if allow_scalar else ""
        raise ValueError(f"{name} must have shape {shape}(H,) = ({h},); got {x.shape}")
    return x.astype(dt, copy=False)


def matrix_param(params, name, n_in, dt, *, n_out=None):
    """``params[name]`` as an ``(in, out)`` weight with ``in = n_in`` (and ``out = n_out`` when given),
    in dtype ``dt``; the error message reminds that PyTorch stores ``(out, in)``."""
    w = as_float(params[name], name, ndim=2)
    if w.shape[0] != n_in or (n_out is not None and w.shape[1] != n_out):
        want = f"({n_in}, {n_out if n_out is not None else 'out'})"
        raise ValueError(f"{name} must have shape (in, out) = {want}; got {w.shape} "
                         f"(PyTorch stores (out, in): pass its transpose)")
    return w.astype(dt, copy=False)


def vector_param(params, name, n, dt):
    """``params[name]`` as a ``(n,)`` vector (a bias or a norm weight) in dtype ``dt``."""
    b = as_float(params[name], name, ndim=1)
    if b.shape != (n,):
        raise ValueError(f"{name} must have shape ({n},); got {b.shape}")
    return b.astype(dt, copy=False)


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


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


def _check_core_explicit_gqa(rng):
    s = _sample_core(rng, "small")
    for gm in KV_GROUP_MAPS:
        cfg = dict(s.config, kv_group_map=gm)
        out = diff_attention_core(**s.inputs, **cfg)
        err = float(np.abs(out - _explicit_core(**s.inputs, **cfg)).max())
        assert err < 1e-12, f"core with kv_group_map={gm} differs from the explicit form by {err}"
    return err


def _check_core_two_sdpa(rng):
    # O = sdpa(q1, k1, v) - lam sdpa(q2, k2, v); gradients from sdpa_backward with dO1 = G, dO2 = -lam G.
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
)
