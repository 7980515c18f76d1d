r"""Fused differential attention (DIFF Transformer V1 core) on the CPU with Numba.

$$O = \mathrm{softmax}\big(s\,Q_1K_1^\top + M\big)V - \lambda\,\mathrm{softmax}\big(s\,Q_2K_2^\top + M\big)V$$

Same signature and semantics as
:func:`refattn.attention.differential.diff_attention_core_forward` /
:func:`~refattn.attention.differential.diff_attention_core_backward` (λ broadcastable to the
``(..., H, N)`` output rows, GQA ``kv_group_map`` ``"contiguous"``/``"strided"``,
``causal_alignment`` default ``"bottom_right"`` as unilm), plus ``block_q`` / ``block_k``.

Fusion: both maps are evaluated in *one* pass over the key/value tiles (each V tile is loaded
once and serves both online softmaxes), with two running (max, sum, accumulator) triples per
query row; the output $O_1 - \lambda O_2$ is formed in the epilogue. The backward is one
FlashAttention-2 pass over the key tiles for both maps: $dO_1 = G$, $dO_2 = -\lambda G$,
$D_a = \mathrm{rowsum}(dO_a\odot O_a)$, $dV = P_1^\top dO_1 + P_2^\top dO_2$ accumulated in one
tile, and $d\lambda = -\mathrm{rowsum}(G\odot O_2)$ summed to λ's shape. Extra memory: $O_1, O_2$
and the two LSE vectors ($O(N d_v)$ per head).

Compared with the composition ``sdpa(q1, k1, v) - lam * sdpa(q2, k2, v)`` it saves the second pass
over V (and its second read of K/V tiles from memory) and the two intermediate output tensors' extra
traffic; the arithmetic is the same.
"""

from __future__ import annotations

import numpy as np

from ..._checks import check_int
from ...attention.softmax import sum_to_shape
from . import _attention as _k
from . import runtime
from ._common import (
    DEFAULT_BLOCK_K,
    DEFAULT_BLOCK_Q,
    bwd_block_k,
    bwd_splits,
    check_dout,
    compute_dtype,
    flat4,
    kv_map,
    mask_buffers,
    readonly,
    run_kernel,
)
from .flash import reduce_heads

__all__ = ["diff_attention_forward", "diff_attention_backward", "diff_attention"]

BACKEND = "numba_cpu"


def validate_arguments(q1, k1, q2, k2, v, lam, attn_mask, is_causal, scale, kv_group_map, causal_alignment,
                       block_q, block_k):
    """The reference's validation (same checks, same messages) plus the tile sizes; shared with the
    CUDA port so that both backends accept and reject the same arguments."""
    from ...attention.differential.core import validate_core

    q1, k1, q2, k2, v, lam, mask, scale = validate_core(
        q1, k1, q2, k2, v, lam, attn_mask, is_causal, scale, kv_group_map, causal_alignment)
    block_q = check_int(block_q, "block_q", minimum=1)
    block_k = check_int(block_k, "block_k", minimum=1)
    return q1, k1, q2, k2, v, lam, mask, scale, block_q, block_k


def diff_attention_forward(q1, k1, q2, k2, v, lam, *, attn_mask=None, is_causal: bool = False,
                           scale=None, kv_group_map: str = "contiguous",
                           causal_alignment: str = "bottom_right",
                           block_q: int = DEFAULT_BLOCK_Q, block_k: int = DEFAULT_BLOCK_K):
    r"""Differential attention core $O = A_1V - \lambda A_2V$, fused (Numba CPU).

    Parameters
    ----------
    q1, q2 : (..., H, N, d); k1, k2 : (..., Hkv, M, d); v : (..., Hkv, M, dv)
    lam : array broadcastable to (..., H, N)
        One λ ``(1,)``, per head ``(H, 1)`` or per token and head (at least 1-d, as the reference).
    attn_mask, is_causal, scale, kv_group_map, causal_alignment
        As :func:`refattn.attention.differential.diff_attention_core_forward`.
    block_q, block_k : int
        Tile sizes.

    Returns
    -------
    out (..., H, N, dv), cache
        ``cache["lse"]`` (2, ..., H, N): the two maps' log-sum-exps.
    """
    q1, k1, q2, k2, v, lam, mask, scale, block_q, block_k = validate_arguments(
        q1, k1, q2, k2, v, lam, attn_mask, is_causal, scale, kv_group_map, causal_alignment,
        block_q, block_k)
    dt = compute_dtype(q1, k1, q2, k2, v, lam)
    lead = q1.shape[:-3]
    h, n, d = q1.shape[-3:]
    hkv, m = k1.shape[-3], k1.shape[-2]
    dv = v.shape[-1]
    s = d ** -0.5 if scale is None else scale
    q = readonly(np.stack([flat4(q1.astype(dt, copy=False)), flat4(q2.astype(dt, copy=False))]))
    k = readonly(np.stack([flat4(k1.astype(dt, copy=False)), flat4(k2.astype(dt, copy=False))]))
    v4 = readonly(flat4(v.astype(dt, copy=False)))
    b = q.shape[1]
    lam_rows = np.broadcast_to(lam.astype(dt, copy=False), q1.shape[:-1]).reshape(b, h, n)
    w = readonly(np.stack([np.ones((b, h, n), dtype=dt), -lam_rows]))
    mode, mb, mf, ms = mask_buffers(mask, lead, h, n, m, dt)
    kvm = kv_map(h, hkv, kv_group_map)
    offset = 0 if (causal_alignment == "top_left" or not is_causal) else m - n
    out = np.empty((b, h, n, dv), dtype=dt)
    omap = np.empty((2, b, h, n, dv), dtype=dt)
    lse = np.empty((2, b, h, n), dtype=np.float64)  # float64 inside, for the backward (see _attention)
    fp = runtime.gemm_pointer(dt)  # the BLAS of the tile products; the backward reuses it
    run_kernel(_k.attention_fwd, q, k, v4, w, kvm, mode, mb, mf, ms, float(s), 0.0, bool(is_causal), offset,
               block_q, block_k, block_q, out, omap, lse, fp, blas=fp >= 0)
    out_l = out.reshape(lead + (h, n, dv))
    cache = {
        "backend": BACKEND, "q": q, "k": k, "v": v4, "w": w, "omap": omap, "lse4": lse,
        "lse": lse.astype(dt).reshape((2,) + lead + (h, n)), "out": out_l, "scale": float(s),
        "is_causal": bool(is_causal), "offset": offset, "kv_group_map": kv_group_map,
        "mask": (mode, mb, mf, ms), "block_q": block_q, "block_k": block_k,
        "shapes": (q1.shape, k1.shape, v.shape), "lam_shape": lam.shape, "kind": "diff", "fp": fp,
    }
    return out_l, cache


def diff_attention_backward(dout, cache):
    """Gradients ``{"q1", "k1", "q2", "k2", "v", "lam"}`` of :func:`diff_attention_forward`."""
    if not isinstance(cache, dict) or cache.get("backend") != BACKEND or cache.get("kind") != "diff":
        raise TypeError("cache must be the cache returned by diff_attention_forward")
    c = cache
    q, k, v4, w, omap = c["q"], c["k"], c["v"], c["w"], c["omap"]
    dt = q.dtype
    qs, ks, vs = c["shapes"]
    g = check_dout(dout, qs[:-1] + (vs[-1],), dt)
    g4 = readonly(g.reshape(omap.shape[1:]))
    rs = np.einsum("bhnc,rbhnc->rbhn", g4, omap)  # rowsum(G o O_a), (2, B, H, N), no temporary
    delta = readonly(w * rs)
    _, b, h, n, d = q.shape
    hkv, m = k.shape[2], k.shape[3]
    bk = bwd_block_k(c["fp"], c["block_k"])  # the built-in products allow the backward its own key tiles
    nsplit = bwd_splits(b, h, m, bk, 2 * n, d)
    dq_part = np.zeros((nsplit, 2, b, h, n, d), dtype=np.float64)  # accumulated over key tiles
    dk_part = np.empty((2, b, h, m, d), dtype=dt)
    dv_part = np.empty((b, h, m, v4.shape[-1]), dtype=dt)
    mode, mb, mf, ms = c["mask"]
    kvm = kv_map(h, hkv, c["kv_group_map"])
    run_kernel(_k.attention_bwd, q, k, v4, w, kvm, mode, mb, mf, ms, c["scale"], 0.0, c["is_causal"],
               c["offset"], c["block_q"], bk, c["block_q"], nsplit, g4, readonly(c["lse4"]), delta, dq_part,
               dk_part, dv_part, c["fp"],
               blas=c["fp"] >= 0)
    dq = dq_part[0]
    for i in range(1, nsplit):  # fixed order, in place
        dq += dq_part[i]
    dq *= c["scale"]
    dq = dq.astype(dt)
    del dq_part
    dk = reduce_heads(dk_part, hkv, c["kv_group_map"])
    dk *= dt.type(c["scale"])
    dvv = reduce_heads(dv_part, hkv, c["kv_group_map"])
    dlam = sum_to_shape((-rs[1]).reshape(qs[:-1]), c["lam_shape"])
    return {"q1": dq[0].reshape(qs), "k1": dk[0].reshape(ks), "q2": dq[1].reshape(qs),
            "k2": dk[1].reshape(ks), "v": dvv.reshape(vs), "lam": dlam}


def diff_attention(q1, k1, q2, k2, v, lam, **config):
    """Convenience wrapper: the output of :func:`diff_attention_forward`."""
    return diff_attention_forward(q1, k1, q2, k2, v, lam, **config)[0]


def _parity_check(rng):
    """Kernel == reference core (float64, 1e-10) on the output and all six gradients."""
    from ...attention.differential import diff_attention_core_backward, diff_attention_core_forward

    worst = 0.0
    cases = [dict(), dict(is_causal=True), dict(is_causal=True, causal_alignment="top_left",
                                                  kv_group_map="strided"), dict(attn_mask="bool")]
    for cfg, lam_shape in zip(cases, [(1,), (4, 1), (2, 4, 1), (1,)]):
        b, h, hkv = 2, 4, int(rng.choice([1, 2, 4]))
        n, m, d, dv = int(rng.integers(1, 10)), int(rng.integers(1, 10)), 4, 6
        q1, q2 = rng.standard_normal((2, b, h, n, d))
        k1, k2 = rng.standard_normal((2, b, hkv, m, d))
        v = rng.standard_normal((b, hkv, m, dv))
        lam = np.asarray(rng.uniform(0.1, 0.9, lam_shape))
        if cfg.get("attn_mask") == "bool":
            cfg = dict(cfg, attn_mask=rng.random((b, h, n, m)) > 0.3)
        out, c = diff_attention_forward(q1, k1, q2, k2, v, lam, block_q=4, block_k=3, **cfg)
        out_r, c_r = diff_attention_core_forward(q1, k1, q2, k2, v, lam, **cfg)
        g = rng.standard_normal(out.shape)
        gk, gr = diff_attention_backward(g, c), diff_attention_core_backward(g, c_r)
        errs = [np.abs(out - out_r).max()] + [np.abs(gk[x] - gr[x]).max() for x in gr]
        err = float(max(errs))
        assert err <= 1e-10, errs
        worst = max(worst, err)
    return worst


from ._common import attach_kernel  # noqa: E402

attach_kernel("diff_attention_core", "refattn.attention.differential", diff_attention_forward, _parity_check)
