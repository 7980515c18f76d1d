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
2.13's SDPA also returns 0 there, an explicit softmax gives NaN).

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
    then ``+ causal_mask``; flash-attn ``csrc/flash_attn/src/flash_fwd_kernel.h``:
    ``apply_softcap(acc_s, ...)`` then ``mask.apply_mask`` which adds ALiBi and masks).
``attn_mask`` and ``is_causal`` together:
    PyTorch raises; refattn combines them (logical AND of the keep sets).
``scale``: default $1/\sqrt{d}$ (PyTorch, flash-attn); T5 uses no scaling (pass ``scale=1.0``).

Paper: Vaswani et al., "Attention Is All You Need", NeurIPS 2017, arXiv 1706.03762.
Reference loops: karpathy/llm.c ``dev/cuda/attention_backward.cu`` (CPU reference).
"""

from __future__ import annotations

import numpy as np

from ..._checks import (
    as_bool_or_float_mask,
    as_dout,
    as_float,
    cast_all,
    check_broadcastable,
    check_choice,
    check_param_keys,
    check_positive,
    compute_dtype,
    validate_qkv,
)
from ...kernels import backward_kernel, forward_kernel
from ...nn.linear import linear_apply, linear_vjp, merge_heads, split_heads
from ...nn.softmax import softmax_lse, softmax_vjp
from ...registry import Mechanism, Sample, register

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
    "causal_mask",
    "band_mask",
    "sliding_window_mask",
    "padding_mask",
    "block_diagonal_mask",
    "to_additive",
    "build_mask",
    "masked_attention_forward",
    "masked_attention_backward",
    "gather_bias",
    "scatter_bias_grad",
    "biased_attention_forward",
    "biased_attention_backward",
    "mha_forward",
    "mha_backward",
    "mha",
    "init_mha_params",
    "naive_attention",
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


def validate_attention_config(scores_shape, attn_mask, is_causal, causal_alignment, scale, softcap,
                              kv_group_map):
    """Validate SDPA's keywords against the score shape ``(..., H, N, M)``; returns
    ``(attn_mask, is_causal, scale, softcap)``. Shared with the kernels (which pass shapes only)."""
    if not isinstance(is_causal, (bool, np.bool_)):
        raise TypeError(f"is_causal must be a bool; got {type(is_causal).__name__}")
    check_choice(causal_alignment, "causal_alignment", CAUSAL_ALIGNMENTS)
    check_choice(kv_group_map, "kv_group_map", KV_GROUP_MAPS)
    scale = check_positive(scale, "scale", allow_none=True)
    softcap = check_positive(softcap, "softcap", allow_none=True)
    attn_mask = as_bool_or_float_mask(attn_mask, "attn_mask")
    if attn_mask is not None:
        check_broadcastable("attn_mask", attn_mask.shape, tuple(scores_shape), "the scores (..., H, N, M) of shape")
    return attn_mask, bool(is_causal), scale, softcap


def _validate_config(q, k, attn_mask, is_causal, causal_alignment, scale, softcap, kv_group_map):
    return validate_attention_config(q.shape[:-1] + (k.shape[-2],), attn_mask, is_causal, causal_alignment,
                                     scale, softcap, kv_group_map)


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
    q, k, v = validate_qkv(q, k, v)
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


def attention_core_backward(dout, cache, *, dlse=None, dp=None):
    r"""Gradient of :func:`attention_core_forward` (the attention VJP in the module docstring).

    ``dlse`` (optional, shape (..., H, N)) is an upstream gradient on ``cache["lse"]``
    ($\partial L_i/\partial S_{ij} = P_{ij}$), for callers that merge partial attentions.
    ``dp`` (optional, shape (..., H, N, M)) is an extra upstream gradient on the attention
    weights ``cache["p"]`` (callers that also use $P$ elsewhere: Shaw value tables, map losses).
    Returns ``{"q", "k", "v"}`` plus ``"bias"`` when a bias was given.
    """
    p, ve, ke, q = cache["p"], cache["ve"], cache["ke"], cache["q"]
    dt = p.dtype
    g = as_dout(dout, cache["out"].shape, dt)
    dve = np.swapaxes(p, -1, -2) @ g
    dpp = g @ np.swapaxes(ve, -1, -2)
    if dp is not None:
        dpp = dpp + as_dout(dp, p.shape, dt, name="dp")
    ds = softmax_vjp(p, dpp)
    if dlse is not None:
        dlse = as_dout(dlse, cache["lse"].shape, dt, name="dlse")
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
                 scale=None, softcap=None, kv_group_map: str = "contiguous", return_lse: bool = False,
                 backend: str = "numpy"):
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
    backend : {"numpy", "numba", "cuda"}
        ``"numpy"`` runs this reference; ``"numba"`` the fused Numba CPU kernel
        (:func:`refattn.kernels.cpu.flash.flash_attention_forward`), ``"cuda"`` the numba.cuda
        kernel. Same arguments, same results (to round-off); :func:`sdpa_backward` follows the
        backend recorded in the cache.

    Returns
    -------
    out, cache
        ``out`` (..., H, N, dv); ``sdpa_backward(dout, cache)`` gives ``{"q", "k", "v"}``.
    """
    if not isinstance(return_lse, (bool, np.bool_)):
        raise TypeError(f"return_lse must be a bool; got {type(return_lse).__name__}")
    kernel = forward_kernel(backend, "flash", "flash_attention_forward")
    if kernel is not None:
        return kernel(q, k, v, attn_mask=attn_mask, is_causal=is_causal, causal_alignment=causal_alignment,
                      scale=scale, softcap=softcap, kv_group_map=kv_group_map)
    return attention_core_forward(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                                  causal_alignment=causal_alignment, scale=scale, softcap=softcap,
                                  kv_group_map=kv_group_map)


def sdpa_backward(dout, cache, *, dlse=None):
    """Gradient of :func:`sdpa_forward`: ``{"q", "k", "v"}`` (GQA: summed over each kv group).

    A cache made by a kernel backend is handed to that kernel's backward."""
    kernel = backward_kernel(cache, "flash", "flash_attention_backward")
    if kernel is not None:
        return kernel(dout, cache, dlse=dlse)
    return attention_core_backward(dout, cache, dlse=dlse)


def sdpa(q, k, v, *, attn_mask=None, is_causal: bool = False, causal_alignment: str = "top_left",
         scale=None, softcap=None, kv_group_map: str = "contiguous", return_lse: bool = False,
         backend: str = "numpy"):
    """Convenience wrapper of :func:`sdpa_forward`: ``out``, or ``(out, lse)`` if ``return_lse``."""
    out, cache = sdpa_forward(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                              causal_alignment=causal_alignment, scale=scale, softcap=softcap,
                              kv_group_map=kv_group_map, return_lse=return_lse, backend=backend)
    return (out, cache["lse"]) if return_lse else out


# --------------------------------------------------------------------------------------------
# Mask builders (attention_masks)


def _check_size(value, name, minimum=1):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer; got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}; got {value}")
    return int(value)


def _check_opt_int(value, name, minimum=None):
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer or None; got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}; got {value}")
    return int(value)


def causal_mask(n: int, m: int, *, offset: int = 0) -> np.ndarray:
    r"""Boolean keep-mask ``(n, m)`` of causal attention: keep $j \le i + o$.

    ``offset=0`` is PyTorch's top-left alignment; ``offset=m-n`` is the KV-cache / flash-attn
    bottom-right alignment (unilm Diff-Transformer: ``torch.triu(full(-inf), 1 + offset)``).
    """
    n, m = _check_size(n, "n"), _check_size(m, "m")
    offset = _check_opt_int(offset, "offset")
    return np.tri(n, m, k=offset, dtype=bool)


def band_mask(n: int, m: int, *, left=None, right=0, offset: int = 0) -> np.ndarray:
    r"""Boolean keep-mask of a band around the (offset) diagonal: keep
    $-\text{left} \le j - (i + o) \le \text{right}$; ``None`` means unbounded on that side.

    This is flash-attn's ``window_size=(left, right)`` convention (there ``-1`` means unbounded and
    the diagonal is bottom-right aligned, i.e. ``offset = m - n``). ``left=None, right=0`` is
    causal; ``right=None`` with ``left=None`` keeps everything.
    """
    n, m = _check_size(n, "n"), _check_size(m, "m")
    left, right = _check_opt_int(left, "left", 0), _check_opt_int(right, "right", 0)
    offset = _check_opt_int(offset, "offset")
    rel = np.arange(m)[None, :] - (np.arange(n)[:, None] + offset)
    keep = np.ones((n, m), bool)
    if left is not None:
        keep &= rel >= -left
    if right is not None:
        keep &= rel <= right
    return keep


def sliding_window_mask(n: int, m: int, window: int, *, offset: int = 0) -> np.ndarray:
    r"""Causal sliding window of width $w$: keep $0 \le i + o - j < w$ (the query's own position
    and the $w-1$ before it; Mistral ``sliding_window``, Longformer/MASFormer causal band).

    Equals ``band_mask(n, m, left=w - 1, right=0, offset=o)``; with $w \ge m + |o|$ it is causal.
    """
    window = _check_size(window, "window")
    return band_mask(n, m, left=window - 1, right=0, offset=offset)


def padding_mask(key_lengths, m: int) -> np.ndarray:
    r"""Key-padding keep-mask from valid lengths: ``key_lengths`` of shape ``(...)`` (one per
    batch element) gives ``(..., 1, 1, m)`` with keep $j < \text{len}$, ready to broadcast against
    scores ``(..., H, N, M)``.

    PyTorch's ``nn.MultiheadAttention(key_padding_mask=...)`` uses the *opposite* boolean
    convention (True = padding, ignored): pass ``~key_padding_mask[:, None, None, :]`` instead.
    """
    m = _check_size(m, "m")
    lengths = np.asarray(key_lengths)
    if lengths.dtype.kind not in "iu":
        raise TypeError(f"key_lengths must be an integer array; got dtype {lengths.dtype}")
    if lengths.size and (lengths.min() < 0 or lengths.max() > m):
        raise ValueError(f"key_lengths must lie in [0, m={m}]; got range [{lengths.min()}, {lengths.max()}]")
    return (np.arange(m) < lengths[..., None])[..., None, None, :]


def block_diagonal_mask(seqlens_q, seqlens_k=None, *, causal: bool = False,
                        causal_alignment: str = "top_left") -> np.ndarray:
    r"""Block-diagonal (packed / chunked sequences) keep-mask ``(sum seqlens_q, sum seqlens_k)``:
    query $i$ of segment $a$ sees only keys of segment $a$ (xformers ``BlockDiagonalMask``).

    ``causal=True`` additionally applies a causal mask inside each block, aligned
    ``"top_left"`` (xformers ``BlockDiagonalCausalMask``) or ``"bottom_right"``
    (``BlockDiagonalCausalFromBottomRightMask``).
    """
    sq = [_check_size(int(x) if isinstance(x, np.integer) else x, "seqlens_q") for x in seqlens_q]
    sk = sq if seqlens_k is None else [_check_size(int(x) if isinstance(x, np.integer) else x, "seqlens_k")
                                       for x in seqlens_k]
    if len(sk) != len(sq):
        raise ValueError(f"seqlens_q ({len(sq)} segments) and seqlens_k ({len(sk)} segments) must agree")
    check_choice(causal_alignment, "causal_alignment", CAUSAL_ALIGNMENTS)
    keep = np.zeros((sum(sq), sum(sk)), bool)
    i0 = j0 = 0
    for a, b in zip(sq, sk, strict=True):
        keep[i0:i0 + a, j0:j0 + b] = causal_keep(a, b, causal_alignment) if causal else True
        i0, j0 = i0 + a, j0 + b
    return keep


def to_additive(keep, fill_value: float = -np.inf, dtype=np.float64) -> np.ndarray:
    """Boolean keep-mask -> additive mask: 0 where kept, ``fill_value`` where removed.

    Upstream finite fills: Swin / Poseidon ``-100.0``; IPOT ``-torch.finfo(dtype).max``. A finite
    fill turns a fully masked row into a *uniform* average of the values instead of refattn's 0.
    """
    keep = np.asarray(keep)
    if keep.dtype != np.bool_:
        raise TypeError(f"keep must be a boolean mask; got dtype {keep.dtype}")
    fill = float(fill_value)
    if np.isnan(fill) or fill > 0:
        raise ValueError(f"fill_value must be <= 0 (or -inf); got {fill_value!r}")
    return np.where(keep, 0.0, fill).astype(dtype)


MASK_KINDS = ("causal", "padding", "sliding_window", "band", "block_diagonal")


def build_mask(kind, n: int, m: int, *, key_lengths=None, offset=None, window=None, left=None, right=0,
               seqlens_q=None, seqlens_k=None, causal_alignment: str = "top_left"):
    """The keep-mask of one ``kind`` (or the AND of a tuple of kinds) for ``n`` queries, ``m`` keys.

    ``offset`` defaults to 0 for ``causal_alignment="top_left"`` and ``m - n`` for ``"bottom_right"``.
    """
    kinds = (kind,) if isinstance(kind, str) else tuple(kind)
    if not kinds:
        raise ValueError("mask_kind must name at least one kind")
    for k_ in kinds:
        check_choice(k_, "mask_kind", MASK_KINDS)
    check_choice(causal_alignment, "causal_alignment", CAUSAL_ALIGNMENTS)
    if offset is None:
        offset = 0 if causal_alignment == "top_left" else m - n
    keep = None
    for k_ in kinds:
        if k_ == "causal":
            mk = causal_mask(n, m, offset=offset)
        elif k_ == "padding":
            if key_lengths is None:
                raise ValueError("mask_kind 'padding' needs key_lengths")
            mk = padding_mask(key_lengths, m)
        elif k_ == "sliding_window":
            if window is None:
                raise ValueError("mask_kind 'sliding_window' needs window")
            mk = sliding_window_mask(n, m, window, offset=offset)
        elif k_ == "band":
            mk = band_mask(n, m, left=left, right=right, offset=offset)
        else:
            if seqlens_q is None:
                raise ValueError("mask_kind 'block_diagonal' needs seqlens_q")
            mk = block_diagonal_mask(seqlens_q, seqlens_k, causal=False)
            if mk.shape != (n, m):
                raise ValueError(f"seqlens_q/seqlens_k sum to {mk.shape}; expected (n={n}, m={m})")
        keep = mk if keep is None else keep & mk
    return keep


def masked_attention_forward(q, k, v, *, mask_kind="causal", key_lengths=None, offset=None, window=None,
                             left=None, right=0, seqlens_q=None, seqlens_k=None,
                             causal_alignment: str = "top_left", fill_value=None, scale=None,
                             kv_group_map: str = "contiguous"):
    r"""SDPA with a mask built by :func:`build_mask` (the ``attention_masks`` record).

    ``fill_value=None`` uses the boolean mask (removed entries are $-\infty$: fully masked rows
    give 0); a finite ``fill_value`` (e.g. Swin's ``-100``) adds :func:`to_additive` instead,
    which changes fully masked rows and leaves a (tiny) gradient through removed entries.

    Backward: :func:`masked_attention_backward` — $dS_{ij} = 0$ wherever $P_{ij} = 0$, otherwise
    the SDPA VJP; the mask itself is not differentiated.
    """
    q, k, v = validate_qkv(q, k, v)
    keep = build_mask(mask_kind, q.shape[-2], k.shape[-2], key_lengths=key_lengths, offset=offset,
                      window=window, left=left, right=right, seqlens_q=seqlens_q, seqlens_k=seqlens_k,
                      causal_alignment=causal_alignment)
    if key_lengths is not None and np.shape(key_lengths) != q.shape[:-3]:
        raise ValueError(f"key_lengths must have the batch shape {q.shape[:-3]}; got {np.shape(key_lengths)}")
    mask = keep if fill_value is None else to_additive(keep, fill_value, compute_dtype(q, k, v))
    return sdpa_forward(q, k, v, attn_mask=mask, scale=scale, kv_group_map=kv_group_map)


def masked_attention_backward(dout, cache):
    """Gradient of :func:`masked_attention_forward`: ``{"q", "k", "v"}`` (the SDPA backward)."""
    return sdpa_backward(dout, cache)


# --------------------------------------------------------------------------------------------
# Additive score biases (dense, and table + index map)


def gather_bias(table: np.ndarray, index_map: np.ndarray) -> np.ndarray:
    r"""$B_{h,ij} = \beta[\iota(i,j), h]$: table ``(T, H)`` (T5 ``relative_attention_bias.weight``,
    Swin ``relative_position_bias_table`` layout) and integer map ``(N, M)`` -> ``(H, N, M)``."""
    return np.moveaxis(table[index_map], -1, 0)


def scatter_bias_grad(dbias: np.ndarray, index_map: np.ndarray, num_entries: int) -> np.ndarray:
    r"""Adjoint of :func:`gather_bias`: $d\beta[t, h] = \sum_{(i,j):\iota(i,j)=t} dB_{h,ij}$ (summed
    over any leading batch axes of ``dbias`` (..., H, N, M)). Returns ``(T, H)``."""
    db = sum_to_shape(dbias, dbias.shape[-3:])
    h = db.shape[0]
    flat = index_map.reshape(-1)
    out = np.empty((num_entries, h), dtype=dbias.dtype)
    for hh in range(h):
        out[:, hh] = np.bincount(flat, weights=db[hh].reshape(-1), minlength=num_entries)
    return out


def _check_index_map(index_map, n, m, t, name="index_map"):
    idx = np.asarray(index_map)
    if idx.dtype.kind not in "iu":
        raise TypeError(f"{name} must be an integer array; got dtype {idx.dtype}")
    if idx.shape != (n, m):
        raise ValueError(f"{name} must have shape (N={n}, M={m}); got {idx.shape}")
    if idx.min() < 0 or idx.max() >= t:
        raise ValueError(f"{name} entries must lie in [0, {t}) (the table's rows); got [{idx.min()}, {idx.max()}]")
    return idx.astype(np.intp, copy=False)


def biased_attention_forward(q, k, v, bias=None, params=None, *, index_map=None, attn_mask=None,
                             is_causal: bool = False, causal_alignment: str = "top_left", scale=None,
                             softcap=None, kv_group_map: str = "contiguous"):
    r"""SDPA with additive score biases: a dense ``bias`` and/or a table-generated one.

    $$S = s\,QK^\top + B^{\text{dense}} + B^{\text{table}},\qquad B^{\text{table}}_{h,ij} = \beta[\iota(i,j), h].$$

    Parameters
    ----------
    q, k, v
        As :func:`sdpa_forward`.
    bias : array broadcastable to (..., H, N, M), optional
        Dense differentiable bias (graph biases, $\log w_j$ quadrature weights …).
    params : {"table": (T, H)}, optional
        Bias table (T5 ``relative_attention_bias.weight`` / Swin ``relative_position_bias_table``
        layout: one column per head); requires ``index_map`` (N, M) of integers in ``[0, T)``.

    Backward
    --------
    $dB^{\text{dense}} = dS$ summed over broadcast axes; the table gradient is the scatter-add
    $d\beta[t,h] = \sum_{b}\sum_{(i,j):\iota(i,j)=t} dS_{b,h,ij}$ (:func:`scatter_bias_grad`).
    """
    q, k, v = validate_qkv(q, k, v)
    table, idx = None, None
    if params is not None:
        check_param_keys(params, (), ("table",), where="biased_attention (table: (T, H))")
        table = params.get("table")
    if table is not None:
        table = as_float(table, "table", ndim=2)
        if table.shape[1] != q.shape[-3]:
            raise ValueError(f"table must have shape (T, H={q.shape[-3]}); got {table.shape}")
        if index_map is None:
            raise ValueError("index_map (N, M) is required with a bias table")
        idx = _check_index_map(index_map, q.shape[-2], k.shape[-2], table.shape[0])
    total = None
    if bias is not None:
        bias = as_float(bias, "bias", min_ndim=1)
        check_broadcastable("bias", bias.shape, q.shape[:-1] + (k.shape[-2],), "the scores (..., H, N, M) of shape")
    if table is not None:
        total = gather_bias(table, idx)
    if bias is not None:
        total = bias if total is None else bias + total
    out, cache = attention_core_forward(q, k, v, total, attn_mask=attn_mask, is_causal=is_causal,
                                        causal_alignment=causal_alignment, scale=scale, softcap=softcap,
                                        kv_group_map=kv_group_map)
    cache["bias_in_shape"] = None if bias is None else bias.shape
    cache["index_map"], cache["table_rows"] = idx, (None if table is None else table.shape[0])
    return out, cache


def biased_attention_backward(dout, cache):
    """Gradient of :func:`biased_attention_forward`: ``q, k, v`` and ``bias`` / ``table`` when given."""
    g = attention_core_backward(dout, cache)
    out = {"q": g["q"], "k": g["k"], "v": g["v"]}
    if cache["bias_in_shape"] is not None:
        out["bias"] = sum_to_shape(g["bias"], cache["bias_in_shape"])
    if cache["index_map"] is not None:
        out["table"] = scatter_bias_grad(g["bias"], cache["index_map"], cache["table_rows"])
    return out


# --------------------------------------------------------------------------------------------
# Multi-head attention layer (and GQA/MQA layers)

MHA_WEIGHTS = ("q_proj", "k_proj", "v_proj", "out_proj")


def _check_mha_params(params, c, cc, num_heads, num_kv_heads):
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
                kv_group_map: str = "contiguous"):
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

    Backward
    --------
    ``dY -> dW_O = O^\top dY``, ``dO = dY W_O^\top``; the SDPA VJP per head gives $dQ, dK, dV$;
    then $dW_Q = X^\top dQ$, $dX = dQ\,W_Q^\top$ and likewise for K and V, whose input
    gradients accumulate into $dX$ for self-attention and into $dC$ for cross-attention.
    """
    x = as_float(x, "x", min_ndim=2)
    num_heads = _check_size(num_heads, "num_heads")
    num_kv_heads = num_heads if num_kv_heads is None else _check_size(num_kv_heads, "num_kv_heads")
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    if context is not None:
        context = as_float(context, "context", ndim=x.ndim)
        if context.shape[:-2] != x.shape[:-2]:
            raise ValueError(f"context must have x's leading axes {x.shape[:-2]}; got context {context.shape}")
    if params is None:
        raise TypeError("params is required: a dict with q_proj, k_proj, v_proj, out_proj")
    src = x if context is None else context
    w, b, d, dv = _check_mha_params(params, x.shape[-1], src.shape[-1], num_heads, num_kv_heads)
    dt = compute_dtype(x, src, *w.values(), *b.values())
    x, src = x.astype(dt, copy=False), src.astype(dt, copy=False)
    w, b = cast_all(dt, w), cast_all(dt, b)
    qh = split_heads(linear_apply(x, w["q_proj"], b.get("q_proj")), num_heads, d)
    kh = split_heads(linear_apply(src, w["k_proj"], b.get("k_proj")), num_kv_heads, d)
    vh = split_heads(linear_apply(src, w["v_proj"], b.get("v_proj")), num_kv_heads, dv)
    o, core = attention_core_forward(qh, kh, vh, attn_mask=attn_mask, is_causal=is_causal,
                                     causal_alignment=causal_alignment, scale=scale, softcap=softcap,
                                     kv_group_map=kv_group_map)
    oc = merge_heads(o)
    y = linear_apply(oc, w["out_proj"], b.get("out_proj"))
    cache = {"x": x, "src": src, "self": context is None, "w": w, "has_bias": set(b), "core": core, "oc": oc,
             "y_shape": y.shape}
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


def _check_causal_last_position(rng):
    # with a causal mask and no position information, the last query's output is invariant to
    # permuting the tokens before it (catalogue [1-6])
    q = rng.standard_normal((2, 2, 6, 3))
    k = rng.standard_normal((2, 2, 6, 3))
    v = rng.standard_normal((2, 2, 6, 2))
    perm = np.concatenate([rng.permutation(5), [5]])
    a = sdpa(q, k, v, is_causal=True)[:, :, -1]
    b = sdpa(q[:, :, perm], k[:, :, perm], v[:, :, perm], is_causal=True)[:, :, -1]
    err = float(np.abs(a - b).max())
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
                "permutation": _check_permutation, "causal_last_position": _check_causal_last_position,
                "lse": _check_lse, "causal_alignment": _check_causal_alignment},
    ),
)


# ---- attention_masks


def _sample_masks(rng, size):
    b, h = 2, 2
    n, m, d = (int(rng.integers(2, 4)), int(rng.integers(3, 5)), 2) if size == "tiny" else \
        (int(rng.integers(5, 9)), int(rng.integers(6, 11)), 3)
    kind = str(rng.choice(["causal", "sliding_window", "band", "padding", "block_diagonal"]))
    cfg = {"mask_kind": kind, "causal_alignment": "bottom_right" if m >= n else "top_left"}
    if kind == "sliding_window":
        cfg["window"] = 2
    elif kind == "band":
        cfg.update(left=1, right=1)
    elif kind == "padding":
        cfg["mask_kind"] = ("padding", "causal")
        cfg["key_lengths"] = rng.integers(m - 1, m + 1, size=b)
    elif kind == "block_diagonal":
        m = n + 1
        cfg["seqlens_q"], cfg["seqlens_k"] = [1, n - 1], [2, n - 1]
    q = rng.standard_normal((b, h, n, d))
    k = rng.standard_normal((b, h, m, d))
    v = rng.standard_normal((b, h, m, d))
    return Sample(inputs={"q": q, "k": k, "v": v}, config=cfg)


def _qkv(rng, b=2, h=2, n=6, m=6, d=3, dv=2):
    return rng.standard_normal((b, h, n, d)), rng.standard_normal((b, h, m, d)), rng.standard_normal((b, h, m, dv))


def _check_future_tokens(rng):
    q, k, v = _qkv(rng, n=7, m=7)
    t = 3
    out = masked_attention_forward(q, k, v, mask_kind="causal")[0]
    q2, k2, v2 = q.copy(), k.copy(), v.copy()
    for a in (q2, k2, v2):
        a[:, :, t + 1:] = rng.standard_normal(a[:, :, t + 1:].shape) * 10
    out2 = masked_attention_forward(q2, k2, v2, mask_kind="causal")[0]
    assert np.array_equal(out[:, :, :t + 1], out2[:, :, :t + 1]), "future tokens influenced the past"
    return 0.0


def _check_offset_causal(rng):
    q, k, v = _qkv(rng, n=8, m=8)
    full = masked_attention_forward(q, k, v, mask_kind="causal")[0]
    last = masked_attention_forward(q[:, :, 5:], k, v, mask_kind="causal", offset=5)[0]
    err = float(np.abs(last - full[:, :, 5:]).max())
    assert err < 1e-12, err
    return err


def _check_band_wide_is_causal(rng):
    q, k, v = _qkv(rng, n=5, m=5)
    full = masked_attention_forward(q, k, v, mask_kind="causal")[0]
    err = max(float(np.abs(masked_attention_forward(q, k, v, mask_kind="sliding_window", window=5)[0] - full).max()),
              float(np.abs(masked_attention_forward(q, k, v, mask_kind="band", left=9, right=0)[0] - full).max()))
    w2 = masked_attention_forward(q, k, v, mask_kind="sliding_window", window=2)[0]
    assert err < 1e-12 and np.abs(w2 - full).max() > 1e-3, err
    return err


def _check_bool_vs_additive(rng):
    q, k, v = _qkv(rng)
    a = masked_attention_forward(q, k, v, mask_kind="band", left=1, right=2)[0]
    b = masked_attention_forward(q, k, v, mask_kind="band", left=1, right=2, fill_value=-np.inf)[0]
    c = masked_attention_forward(q, k, v, mask_kind="band", left=1, right=2, fill_value=-1e4)[0]
    err = float(np.abs(a - b).max())
    assert err == 0.0 and float(np.abs(a - c).max()) < 1e-12, err
    return err


def _check_block_diagonal(rng):
    q, k, v = _qkv(rng, n=5, m=6)
    out = masked_attention_forward(q, k, v, mask_kind="block_diagonal", seqlens_q=[2, 3], seqlens_k=[4, 2])[0]
    ref = np.concatenate([sdpa(q[:, :, :2], k[:, :, :4], v[:, :, :4]), sdpa(q[:, :, 2:], k[:, :, 4:], v[:, :, 4:])],
                         axis=2)
    err = float(np.abs(out - ref).max())
    assert err < 1e-12, err
    return err


def _check_padding(rng):
    q, k, v = _qkv(rng, n=4, m=6)
    lens = np.array([3, 6])
    out = masked_attention_forward(q, k, v, mask_kind="padding", key_lengths=lens)[0]
    err = max(float(np.abs(out[i] - sdpa(q[i:i + 1], k[i:i + 1, :, :n], v[i:i + 1, :, :n])[0]).max())
              for i, n in enumerate(lens))
    assert err < 1e-12, err
    return err


def _check_masked_rows_zero_grad(rng):
    q, k, v = _qkv(rng, n=4, m=3)
    with np.errstate(all="raise"):
        out, c = masked_attention_forward(q, k, v, mask_kind=("causal", "padding"), causal_alignment="bottom_right",
                                          key_lengths=np.array([3, 0]))
        g = masked_attention_backward(rng.standard_normal(out.shape), c)
    # bottom-right causal with N > M: row 0 sees no key; batch 1 has no valid key at all
    assert not out[:, :, 0].any() and not g["q"][:, :, 0].any()
    assert not out[1].any() and not any(x[1].any() for x in g.values())
    assert all(np.isfinite(x).all() for x in g.values())
    return 0.0


# ---- multi_head_attention / gqa_mqa


def _sample_mha(rng, size, gqa=False):
    bsz = 2
    if size == "tiny":
        n, m, c, h, d = int(rng.integers(2, 4)), int(rng.integers(2, 4)), 3, 2, 2
    else:
        n, m, c, h, d = int(rng.integers(4, 8)), int(rng.integers(4, 9)), 8, 4, 3
    hkv = (1 if size == "tiny" else int(rng.choice([1, 2]))) if gqa else h
    cross = bool(rng.random() < 0.5)
    cc = c + 1 if cross else c
    x = rng.standard_normal((bsz, n, c))
    inputs = {"x": x}
    if cross:
        inputs["context"] = rng.standard_normal((bsz, m, cc))
    params = init_mha_params(rng, c, h, d, num_kv_heads=hkv, c_context=cc, bias=not gqa or rng.random() < 0.5)
    cfg = {"num_heads": h, "num_kv_heads": hkv}
    if gqa:
        cfg["kv_group_map"] = str(rng.choice(KV_GROUP_MAPS))
    elif not cross and rng.random() < 0.5:
        cfg["is_causal"] = True
    return Sample(inputs=inputs, params=params, config=cfg)


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


def _duplicate_kv(p, h, hkv, kv_group_map):
    r = h // hkv
    out = dict(p)
    for n in ("k_proj", "v_proj"):
        w = p[n]
        e = w.shape[1] // hkv
        w3 = w.reshape(w.shape[0], hkv, e)
        out[n] = (np.repeat(w3, r, axis=1) if kv_group_map == "contiguous"
                  else np.concatenate([w3] * r, axis=1)).reshape(w.shape[0], h * e)
        if n + "_bias" in p:
            b2 = p[n + "_bias"].reshape(hkv, e)
            out[n + "_bias"] = (np.repeat(b2, r, axis=0) if kv_group_map == "contiguous"
                                else np.concatenate([b2] * r, axis=0)).reshape(-1)
    return out


def _check_gqa_equals_duplicated_mha(rng):
    err = 0.0
    for hkv, gm in ((2, "contiguous"), (2, "strided"), (1, "contiguous")):
        h = 4
        x = rng.standard_normal((2, 5, 6))
        p = init_mha_params(rng, 6, h, 2, num_kv_heads=hkv)
        y, c = mha_forward(x, params=p, num_heads=h, num_kv_heads=hkv, kv_group_map=gm)
        pd = _duplicate_kv(p, h, hkv, gm)
        y2, c2 = mha_forward(x, params=pd, num_heads=h)
        G = rng.standard_normal(y.shape)
        g, g2 = mha_backward(G, c), mha_backward(G, c2)
        err = max(err, float(np.abs(y - y2).max()), float(np.abs(g["x"] - g2["x"]).max()))
        r = h // hkv
        for n in ("k_proj", "v_proj"):
            w = g2[n].reshape(g2[n].shape[0], *((hkv, r) if gm == "contiguous" else (r, hkv)), -1)
            red = w.sum(axis=2 if gm == "contiguous" else 1).reshape(g[n].shape)
            err = max(err, float(np.abs(g[n] - red).max()))
    assert err < 1e-12, err
    return err


# ---- additive_attention_bias


def _sample_bias(rng, size):
    b, h = 2, 2
    n, m, d, t = (int(rng.integers(2, 4)), int(rng.integers(2, 4)), 2, 4) if size == "tiny" else \
        (int(rng.integers(4, 8)), int(rng.integers(4, 9)), 3, 9)
    q = rng.standard_normal((b, h, n, d))
    k = rng.standard_normal((b, h, m, d))
    v = rng.standard_normal((b, h, m, d))
    # axis 0 of every input is the batch axis; broadcasting over heads is exercised by (b, 1, n, m)
    bias = rng.standard_normal((b, h, n, m)) if rng.random() < 0.5 else rng.standard_normal((b, 1, n, m))
    idx = rng.integers(0, t, size=(n, m))
    return Sample(inputs={"q": q, "k": k, "v": v, "bias": bias}, params={"table": rng.standard_normal((t, h))},
                  config={"index_map": idx, "is_causal": bool(rng.random() < 0.5),
                          "causal_alignment": "bottom_right" if m >= n else "top_left"})


def _bias_reference(q, k, v, bias=None, params=None, *, index_map=None, is_causal=False, causal_alignment="top_left",
                    **_):
    total = np.zeros(q.shape[:-1] + (k.shape[-2],))
    if bias is not None:
        total = total + bias
    if params is not None:
        n, m = index_map.shape
        tab = np.zeros((q.shape[-3], n, m))
        for hh in range(q.shape[-3]):
            for i in range(n):
                for j in range(m):
                    tab[hh, i, j] = params["table"][index_map[i, j], hh]
        total = total + tab
    keep = causal_keep(q.shape[-2], k.shape[-2], causal_alignment) if is_causal else None
    return naive_attention(q, k, v, bias=total, keep=keep)


def _check_row_constant_bias(rng):
    q, k, v = _qkv(rng, n=4, m=5)
    c_row = rng.standard_normal((2, 2, 4, 1)) * 3
    out, cache = biased_attention_forward(q, k, v, c_row)
    db = biased_attention_backward(rng.standard_normal(out.shape), cache)["bias"]
    err = max(float(np.abs(out - sdpa(q, k, v)).max()), float(np.abs(db).max()))
    assert err < 1e-12, err
    return err


def _check_log_uniform_weights(rng):
    q, k, v = _qkv(rng, n=4, m=5)
    logw = np.log(np.full(5, 1 / 5))
    err = float(np.abs(biased_attention_forward(q, k, v, logw)[0] - sdpa(q, k, v)).max())
    assert err < 1e-12, err
    return err


def _check_table_equals_dense(rng):
    q, k, v = _qkv(rng, n=4, m=5)
    table = rng.standard_normal((6, 2))
    idx = rng.integers(0, 6, (4, 5))
    o1, c1 = biased_attention_forward(q, k, v, params={"table": table}, index_map=idx)
    dense = gather_bias(table, idx)
    o2, c2 = biased_attention_forward(q, k, v, dense)
    G = rng.standard_normal(o1.shape)
    dt_, dd = biased_attention_backward(G, c1)["table"], biased_attention_backward(G, c2)["bias"]
    ref = np.zeros_like(table)
    for i in range(4):
        for j in range(5):
            ref[idx[i, j]] += dd[:, i, j]
    err = max(float(np.abs(o1 - o2).max()), float(np.abs(dt_ - ref).max()))
    assert err < 1e-12, err
    return err


register(
    Mechanism(
        slug="attention_masks", family="1-softmax", tier="T1",
        title="Padding, causal (offset), sliding-window/band and block-diagonal masks",
        paper="standard; offset-causal as in microsoft/unilm Diff-Transformer multihead_diffattn.py",
        forward=masked_attention_forward, backward=masked_attention_backward, sample=_sample_masks,
        docs="softmax-attention.md#attention-masks",
        checks={"future_tokens_no_influence": _check_future_tokens, "offset_causal": _check_offset_causal,
                "wide_band_is_causal": _check_band_wide_is_causal, "bool_vs_additive": _check_bool_vs_additive,
                "block_diagonal": _check_block_diagonal, "padding": _check_padding,
                "masked_rows_zero": _check_masked_rows_zero_grad},
    ),
    Mechanism(
        slug="multi_head_attention", family="1-softmax", tier="T1",
        title="Multi-head self/cross attention with q/k/v/out projections",
        paper="Vaswani et al., Attention Is All You Need, NeurIPS 2017, arXiv 1706.03762",
        forward=mha_forward, backward=mha_backward, sample=_sample_mha,
        docs="softmax-attention.md#multi-head-attention",
        checks={"h1_is_sdpa": _check_mha_h1_is_sdpa, "key_bias_grad_zero": _check_mha_key_bias_grad_zero,
                "value_bias_closed_form": _check_mha_value_bias},
    ),
    Mechanism(
        slug="gqa_mqa", family="1-softmax", tier="T1",
        title="Grouped-query / multi-query attention layer (contiguous or strided kv grouping)",
        paper="Shazeer, arXiv 1911.02150 (MQA); Ainslie et al., GQA, EMNLP 2023, arXiv 2305.13245",
        forward=mha_forward, backward=mha_backward, sample=lambda rng, size: _sample_mha(rng, size, gqa=True),
        docs="softmax-attention.md#gqa-mqa",
        checks={"equals_duplicated_mha": _check_gqa_equals_duplicated_mha},
    ),
    Mechanism(
        slug="additive_attention_bias", family="1-softmax", tier="T1",
        title="Additive score bias: dense tensor and table + index map (scatter-add gradient)",
        paper="standard (T5 / Swin relative bias tables, ALiBi, quadrature log-weights)",
        forward=biased_attention_forward, backward=biased_attention_backward, sample=_sample_bias,
        reference=_bias_reference, docs="softmax-attention.md#additive-attention-bias",
        checks={"row_constant_bias": _check_row_constant_bias, "log_uniform_weights": _check_log_uniform_weights,
                "table_equals_dense": _check_table_equals_dense},
    ),
)
