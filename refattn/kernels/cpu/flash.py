r"""Fused flash-style softmax attention (SDPA) on the CPU with Numba: forward (out + LSE) and
FlashAttention-2 backward.

Same signature and semantics as :func:`refattn.attention.softmax.sdpa.sdpa_forward` /
:func:`~refattn.attention.softmax.sdpa.sdpa_backward` (PyTorch ``F.scaled_dot_product_attention``
layout, ``causal_alignment``, ``kv_group_map``, ``softcap``, fully masked rows give 0 with 0
gradient and LSE ``-inf``), plus the tile sizes ``block_q`` / ``block_k``. The design (tiling,
online softmax, recomputation, parallel decomposition, memory) is in ``docs/kernels.md``.

Extra memory is $O(N d)$ per head: the LSE, the output and small per-task tiles; no $N\times M$
matrix is ever formed (a user-supplied full mask is read in place).

Example::

    from refattn.kernels.cpu.flash import flash_attention_forward, flash_attention_backward
    out, cache = flash_attention_forward(q, k, v, is_causal=True)
    grads = flash_attention_backward(dout, cache)      # {"q", "k", "v"}
"""

from __future__ import annotations

import numpy as np

from . import _attention as _k
from . import runtime
from ._common import (
    bwd_block_k,
    bwd_splits,
    check_dout,
    compute_dtype,
    flat4,
    kv_map,
    mask_buffers,
    readonly,
    run_kernel,
    sdpa_blocks,
    sdpa_row_group,
    validate_config,
    validate_qkv,
)

__all__ = ["flash_attention_forward", "flash_attention_backward", "flash_attention"]

BACKEND = "numba_cpu"


def flash_attention_forward(q, k, v, *, attn_mask=None, is_causal: bool = False,
                            causal_alignment: str = "top_left", scale=None, softcap=None,
                            kv_group_map: str = "contiguous", return_lse: bool = False,
                            block_q: int | None = None, block_k: int | None = None):
    r"""Scaled dot-product attention, fused and tiled (Numba CPU).

    $O = \mathrm{softmax}(T(s\,QK^\top) + M)\,V$, computed one query tile at a time with an online
    softmax; the log-sum-exp $L_i$ of every row is kept for the backward.

    Parameters
    ----------
    q (..., H, N, d), k (..., Hkv, M, d), v (..., Hkv, M, dv)
        float16/32/64 (float16 computes in float32; mixed float32/float64 in float64).
    attn_mask : bool or float array broadcastable to (..., H, N, M), optional
        Boolean True = keep, or additive (``-inf`` removes). Combined with ``is_causal``.
    is_causal, causal_alignment : bool, {"top_left", "bottom_right"}
        Query $i$ sees keys $j \le i$ (top-left, PyTorch) or $j \le i + M - N$ (bottom-right, flash-attn).
    scale : float > 0, optional
        Default $1/\sqrt d$.
    softcap : float > 0, optional
        $T(x) = c\tanh(x/c)$ on the scaled scores before the masks.
    kv_group_map : {"contiguous", "strided"}
        GQA: query head $h$ uses kv head $h // (H/H_{kv})$ or $h \bmod H_{kv}$.
    return_lse : bool
        Accepted for signature symmetry with the reference; the LSE is always ``cache["lse"]``.
    block_q, block_k : int, optional
        Query / key tile sizes; by default ``256 x 1024``
        (:func:`refattn.kernels.cpu._common.sdpa_blocks`). Under a causal mask, tiles that cross the
        diagonal are computed in row groups of ``min(block_q, 64)`` rows, each product stopping at
        the group's last visible key.

    Returns
    -------
    out, cache
        ``out`` (..., H, N, dv) in the compute dtype; ``cache["lse"]`` (..., H, N).
    """
    if not isinstance(return_lse, (bool, np.bool_)):
        raise TypeError(f"return_lse must be a bool; got {type(return_lse).__name__}")
    q, k, v = validate_qkv(q, k, v)
    attn_mask, is_causal, scale, softcap, bq_in, bk_in = validate_config(
        q.shape, k.shape[-2], attn_mask, is_causal, causal_alignment, scale, softcap, kv_group_map,
        1 if block_q is None else block_q, 1 if block_k is None else block_k)
    block_q, block_k = sdpa_blocks(q.shape[-2], is_causal, None if block_q is None else bq_in,
                                   None if block_k is None else bk_in)
    block_g = sdpa_row_group(block_q, is_causal)
    dt = compute_dtype(q, k, v)
    lead = q.shape[:-3]
    h, n, d = q.shape[-3:]
    hkv, m = k.shape[-3], k.shape[-2]
    dv = v.shape[-1]
    s = (1.0 / np.sqrt(d)) if scale is None else scale
    q4, k4, v4 = (readonly(flat4(a.astype(dt, copy=False))) for a in (q, k, v))
    b = q4.shape[0]
    mode, mb, mf, ms = mask_buffers(attn_mask, lead, h, n, m, dt)
    kvm = kv_map(h, hkv, kv_group_map)
    w = readonly(np.ones((1, b, h, n), dtype=dt))
    offset = 0 if causal_alignment == "top_left" else m - n
    out = np.empty((b, h, n, dv), dtype=dt)
    # R = 1, weight 1: the per-map output equals the output. The kernel writes it twice, into the
    # array the caller gets and into the cache's own copy (the backward reads it, so a caller's
    # in-place update of the returned array must not reach it): two stores of a row still in cache
    # instead of a copy of the whole output afterwards.
    omap = np.empty((1, b, h, n, dv), dtype=dt)
    lse = np.empty((1, b, h, n), dtype=np.float64)  # float64 inside, for the backward (see _attention)
    fp = runtime.gemm_pointer(dt)  # the BLAS of the tile products; the backward reuses it
    run_kernel(_k.attention_fwd, q4[None], k4[None], v4, w, kvm, mode, mb, mf, ms, float(s),
               float(softcap or 0.0), bool(is_causal), offset, block_q, block_k, block_g, out, omap, lse, fp,
               blas=fp >= 0)
    out_l = out.reshape(lead + (h, n, dv))
    cache = {
        "backend": BACKEND, "q": q4, "k": k4, "v": v4, "out4": omap[0], "out": omap[0].reshape(out_l.shape),
        "lse4": lse,
        "lse": lse[0].astype(dt).reshape(lead + (h, n)), "scale": float(s), "softcap": softcap,
        "is_causal": is_causal, "offset": offset, "kv_group_map": kv_group_map,
        "mask": (mode, mb, mf, ms), "block_q": block_q, "block_k": block_k,
        "block_g": block_g, "shapes": (q.shape, k.shape, v.shape), "fp": fp,
    }
    return out_l, cache


def reduce_heads(x: np.ndarray, hkv: int, kv_group_map: str) -> np.ndarray:
    """Sum per-query-head gradients ``(..., B, H, M, e)`` over each kv group (fixed order)."""
    h = x.shape[-3]
    group = h // hkv
    if group == 1:
        return x
    lead = x.shape[:-3]
    if kv_group_map == "contiguous":
        return x.reshape(lead + (hkv, group) + x.shape[-2:]).sum(axis=-3)
    return x.reshape(lead + (group, hkv) + x.shape[-2:]).sum(axis=-4)


def flash_attention_backward(dout, cache, *, dlse=None):
    r"""FlashAttention-2 backward of :func:`flash_attention_forward`: ``{"q", "k", "v"}``.

    $P$ is recomputed tile by tile from the stored LSE; $D_i = \mathrm{rowsum}(dO\odot O)_i$;
    $dS = P\odot(dO\,V^\top - D)$ (times $1-\tanh^2$ under softcap); $dV = P^\top dO$,
    $dK = s\,dS^\top Q$, $dQ = s\,dS\,K$. ``dlse`` (..., H, N) is an optional upstream gradient on
    ``cache["lse"]`` (it enters as $D_i \to D_i - dL_i$). Under GQA the gradients of the query heads
    sharing a kv head are summed.
    """
    if not isinstance(cache, dict) or cache.get("backend") != BACKEND or "lse4" not in cache:
        raise TypeError("cache must be the cache returned by flash_attention_forward")
    c = cache
    q4, k4, v4, out = c["q"], c["k"], c["v"], c["out4"]
    dt = q4.dtype
    qs, ks, vs = c["shapes"]
    g = check_dout(dout, qs[:-1] + (vs[-1],), dt)
    g4 = readonly(g.reshape(out.shape))
    delta = np.einsum("bhnc,bhnc->bhn", g4, out)[None]  # rowsum(dO * O) without an N x dv temporary
    if dlse is not None:
        dl = check_dout(dlse, qs[:-1], dt, "dlse")
        delta = delta - dl.reshape(delta.shape)
    delta = readonly(delta.astype(dt, copy=False))
    b, h, n, d = q4.shape
    hkv, m = k4.shape[1], k4.shape[2]
    bk = bwd_block_k(c["fp"], c["block_k"])  # the built-in products allow the backward its own key tiles
    nsplit = bwd_splits(b, h, m, bk, n, d)
    dq_part = np.zeros((nsplit, 1, b, h, n, d), dtype=np.float64)  # accumulated over key tiles
    dk_part = np.empty((1, b, h, m, d), dtype=dt)
    dv_part = np.empty((b, h, m, v4.shape[-1]), dtype=dt)
    mode, mb, mf, ms = c["mask"]
    kvm = kv_map(h, hkv, c["kv_group_map"])
    w = readonly(np.ones((1, b, h, n), dtype=dt))
    run_kernel(_k.attention_bwd, q4[None], k4[None], v4, w, kvm, mode, mb, mf, ms, c["scale"],
               float(c["softcap"] or 0.0), bool(c["is_causal"]), c["offset"], c["block_q"],
               bk, c["block_g"], nsplit, g4, readonly(c["lse4"]), delta, dq_part, dk_part, dv_part, c["fp"],
               blas=c["fp"] >= 0)
    dq = dq_part[0, 0]
    for i in range(1, nsplit):  # fixed order, in place (no extra float64 N x d arrays)
        dq += dq_part[i, 0]
    dq *= c["scale"]
    dq = dq.astype(dt)
    del dq_part
    dk = reduce_heads(dk_part[0], hkv, c["kv_group_map"])
    dk *= dt.type(c["scale"])
    dvv = reduce_heads(dv_part, hkv, c["kv_group_map"])
    return {"q": dq.reshape(qs), "k": dk.reshape(ks), "v": dvv.reshape(vs)}


def flash_attention(q, k, v, **kwargs):
    """Convenience wrapper: the output of :func:`flash_attention_forward`."""
    return flash_attention_forward(q, k, v, **kwargs)[0]


# --------------------------------------------------------------------------------------------
# Registry parity check


def _parity_check(rng):
    """Kernel == reference (float64, 1e-10) on out, LSE and the three gradients, over masks,
    causal alignments with N != M, GQA maps, softcap and tiles that do not divide the sizes."""
    from ...attention.softmax.sdpa import sdpa_backward as ref_bwd
    from ...attention.softmax.sdpa import sdpa_forward as ref_fwd

    worst = 0.0
    cases = [
        dict(),
        dict(is_causal=True, causal_alignment="bottom_right"),
        dict(is_causal=True, causal_alignment="top_left", kv_group_map="strided", softcap=2.0),
        dict(attn_mask="bool"),
        dict(attn_mask="additive", is_causal=True),
    ]
    for cfg in cases:
        b, h, hkv = 2, 4, int(rng.choice([1, 2, 4]))
        n, m, d, dv = int(rng.integers(1, 12)), int(rng.integers(1, 12)), 5, 3
        q = rng.standard_normal((b, h, n, d))
        k = rng.standard_normal((b, hkv, m, d))
        v = rng.standard_normal((b, hkv, m, dv))
        cfg = dict(cfg)
        if cfg.get("attn_mask") == "bool":
            cfg["attn_mask"] = rng.random((b, 1, n, m)) > 0.3
        elif cfg.get("attn_mask") == "additive":
            cfg["attn_mask"] = np.where(rng.random((n, m)) > 0.3, rng.standard_normal((n, m)), -np.inf)
        out, c = flash_attention_forward(q, k, v, block_q=4, block_k=3, **cfg)
        out_r, c_r = ref_fwd(q, k, v, **cfg)
        g = rng.standard_normal(out.shape)
        gk, gr = flash_attention_backward(g, c), ref_bwd(g, c_r)
        fin = np.isfinite(c_r["lse"])
        assert np.array_equal(fin, np.isfinite(c["lse"])), "LSE -inf pattern differs"
        errs = [np.abs(out - out_r).max(), np.abs(c["lse"][fin] - c_r["lse"][fin]).max(initial=0.0)]
        errs += [np.abs(gk[x] - gr[x]).max() for x in ("q", "k", "v")]
        err = float(max(errs))
        assert err <= 1e-10, (cfg.keys(), errs)
        worst = max(worst, err)
    return worst


from ._common import attach_kernel  # noqa: E402

attach_kernel("sdpa", "refattn.attention.softmax.sdpa", flash_attention_forward, _parity_check)
