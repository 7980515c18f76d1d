r"""Scaled dot-product attention (SDPA): softmax attention with masks, causal alignment, GQA, softcap and LSE.

`sdpa_forward` / `sdpa_backward` have PyTorch ``F.scaled_dot_product_attention`` semantics and
`sdpa` is the convenience wrapper. They run the attention core of `refattn.attention.softmax.core`
(`attention_core_forward` / `attention_core_backward`, which everything in the softmax family and
most later families call), or with ``backend="numba"`` / ``"cuda"`` the fused kernels of
`refattn.kernels`. The math below is the core's.

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
Reference loops: karpathy/llm.c ``dev/cuda/attention_backward.cu``@9964224 (CPU reference).
"""

from __future__ import annotations

import numpy as np

from ...kernels import backward_kernel, forward_kernel
from ...registry import Mechanism, Sample, register
from .core import KV_GROUP_MAPS, attention_core_backward, attention_core_forward, sdpa_reference

__all__ = ["sdpa_forward", "sdpa_backward", "sdpa"]


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


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


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
        forward=sdpa_forward, backward=sdpa_backward, sample=_sample_sdpa, reference=sdpa_reference,
        docs="softmax-attention.md#sdpa",
        checks={"fully_masked_rows": _check_fully_masked_rows, "key_bias_redundancy": _check_key_bias_redundancy,
                "permutation": _check_permutation, "causal_last_position": _check_causal_last_position,
                "lse": _check_lse, "causal_alignment": _check_causal_alignment},
    ),
)
