r"""Fused differential attention (DIFF Transformer V1 core) on CUDA with numba.cuda.

$$O = \mathrm{softmax}\big(s\,Q_1K_1^\top + M\big)V - \lambda\,\mathrm{softmax}\big(s\,Q_2K_2^\top + M\big)V$$

The CUDA twin of :mod:`refattn.kernels.cpu.differential`: same signature and validation, semantics
of :func:`refattn.attention.differential.diff_attention_core_forward` /
:func:`~refattn.attention.differential.diff_attention_core_backward`. Both maps are evaluated in one
pass over the key/value tiles (each V tile is loaded into shared memory once and serves both online
softmaxes). The backward runs the same two deterministic kernels as SDPA with ``R = 2`` maps and
weights $(1, -\lambda)$: $D_a = w_a\,\mathrm{rowsum}(G\odot O_a)$, $dV = P_1^\top G - \lambda P_2^\top G$,
and $d\lambda = -\mathrm{rowsum}(G\odot O_2)$ summed to λ's shape (on the host: it is $O(N)$).
"""

from __future__ import annotations

import numpy as np

from ...attention.softmax import sum_to_shape
from ..cpu._common import compute_dtype, kv_map, mask_buffers
from ..cpu.differential import validate_arguments as cpu_validate
from . import _common as _c
from ._device import cuda, is_device_array, maybe_host, require_cuda
from .flash import grad_in

__all__ = ["diff_attention_forward", "diff_attention_backward", "diff_attention"]

BACKEND = "numba_cuda"


def diff_attention_forward(q1, k1, q2, k2, v, lam, *, attn_mask=None, is_causal: bool = False,
                           scale=None, kv_group_map: str = "contiguous",
                           causal_alignment: str = "bottom_right",
                           block_q: int | None = None, block_k: int | None = None):
    r"""Differential attention core $O = A_1V - \lambda A_2V$, fused (numba.cuda).

    Parameters as :func:`refattn.kernels.cpu.differential.diff_attention_forward`; ``q1, k1, q2, k2,
    v`` may be device arrays (results then stay on the device), ``lam`` and ``attn_mask`` are small
    and may be either. ``block_q``/``block_k`` default to ``None`` (chosen to fit shared memory).

    Returns
    -------
    out (..., H, N, dv), cache
        ``cache["lse"]`` (2, ..., H, N): the two maps' log-sum-exps.
    """
    on_dev = is_device_array(q1)
    block_q = _c.check_block(block_q, "block_q")
    block_k = _c.check_block(block_k, "block_k")
    if is_device_array(lam):
        lam = lam.copy_to_host()
    if is_device_array(attn_mask):
        attn_mask = attn_mask.copy_to_host()
    q1p, k1p, q2p, k2p, vp, lam, mask, scale, _, _ = cpu_validate(
        _c.proxy(q1), _c.proxy(k1), _c.proxy(q2), _c.proxy(k2), _c.proxy(v), lam, attn_mask, is_causal, scale,
        kv_group_map, causal_alignment, block_q or 1, block_k or 1)
    dt = compute_dtype(q1p, k1p, q2p, k2p, vp, lam)
    lead = q1p.shape[:-3]
    h, n, d = q1p.shape[-3:]
    hkv, m = k1p.shape[-3], k1p.shape[-2]
    dv = vp.shape[-1]
    tx = _c.threads_per_row()
    plan = _c.plan_tiles(2, d, dv, dt, block_q, block_k, tx, n, m)
    require_cuda()
    s = d ** -0.5 if scale is None else scale
    q = _c.stack_device([_c.as4(q1, dt), _c.as4(q2, dt)], dt)
    k = _c.stack_device([_c.as4(k1, dt), _c.as4(k2, dt)], dt)
    v4 = _c.as4(v, dt)
    b = q.shape[1]
    lam_rows = np.broadcast_to(lam.astype(dt, copy=False), q1p.shape[:-1]).reshape(b, h, n)
    w = cuda.to_device(np.ascontiguousarray(np.stack([np.ones((b, h, n), dtype=dt), -lam_rows])))
    maskd = _c.mask_device(mask_buffers(mask, lead, h, n, m, dt), dt)
    kvm = _c.const_device(("kvm", h, hkv, kv_group_map), lambda: kv_map(h, hkv, kv_group_map))
    offset = 0 if (causal_alignment == "top_left" or not is_causal) else m - n
    out4, omap, lse4 = _c.launch_forward(q, k, v4, w, kvm, maskd, float(s), 0.0, bool(is_causal), offset, plan,
                                         tx, omap_needed=True)
    out_l = maybe_host(out4, on_dev).reshape(lead + (h, n, dv))
    cache = {
        "backend": BACKEND, "kind": "diff", "q": q, "k": k, "v": v4, "w": w, "omap": omap, "out4": out4,
        "lse4": lse4, "lse": maybe_host(lse4, on_dev).reshape((2,) + lead + (h, n)), "out": out_l,
        "scale": float(s), "is_causal": bool(is_causal), "offset": offset, "kv_group_map": kv_group_map,
        "kvm": kvm, "mask": maskd, "plan": plan, "tx": tx, "shapes": (q1p.shape, k1p.shape, vp.shape),
        "lam_shape": lam.shape, "on_device": on_dev, "dtype": dt,
    }
    return out_l, cache


def diff_attention_backward(dout, cache):
    """Gradients ``{"q1", "k1", "q2", "k2", "v", "lam"}`` of :func:`diff_attention_forward`."""
    if not isinstance(cache, dict) or cache.get("backend") != BACKEND or cache.get("kind") != "diff":
        raise TypeError("cache must be the cache returned by refattn.kernels.cuda.diff_attention_forward")
    c = cache
    dt = c["dtype"]
    qs, ks, vs = c["shapes"]
    out4 = c["out4"]
    g4 = grad_in(dout, "dout", qs[:-1] + (vs[-1],), dt).reshape(out4.shape)
    q, k, v4, w = c["q"], c["k"], c["v"], c["w"]
    rs, delta = _c.launch_delta(g4, c["omap"], w, None)
    h, hkv = q.shape[2], k.shape[2]
    gm = c["kv_group_map"]
    heads = _c.const_device(("heads", h, hkv, gm), lambda: _c.head_groups(h, hkv, gm))
    dq, dk, dvv = _c.launch_backward(q, k, v4, w, c["kvm"], heads, c["mask"], c["scale"], 0.0, c["is_causal"],
                                     c["offset"], c["plan"], c["tx"], g4, c["lse4"], delta)
    on_dev = c["on_device"]
    dlam = sum_to_shape((-rs[1].copy_to_host()).reshape(qs[:-1]), c["lam_shape"])
    if on_dev:
        dlam = cuda.to_device(np.ascontiguousarray(dlam))
    dq, dk = maybe_host(dq, on_dev), maybe_host(dk, on_dev)
    return {"q1": dq[0].reshape(qs), "k1": dk[0].reshape(ks), "q2": dq[1].reshape(qs),
            "k2": dk[1].reshape(ks), "v": maybe_host(dvv, on_dev).reshape(vs), "lam": dlam}


def diff_attention(q1, k1, q2, k2, v, lam, **config):
    """Convenience wrapper: the output of :func:`diff_attention_forward`."""
    return diff_attention_forward(q1, k1, q2, k2, v, lam, **config)[0]


def _parity_check(rng):
    """CUDA kernel == reference core (float64, 1e-10) on the output and all six gradients."""
    from ...attention.differential import diff_attention_core_backward, diff_attention_core_forward

    worst = 0.0
    for cfg, lam_shape in zip([dict(), dict(is_causal=True)], [(1,), (2, 1)]):
        b, h, hkv = 1, 2, int(rng.choice([1, 2]))
        n, m, d, dv = int(rng.integers(1, 7)), int(rng.integers(1, 7)), 3, 4
        q1, q2 = rng.standard_normal((2, b, h, n, d))
        k1, k2 = rng.standard_normal((2, b, hkv, m, d))
        v = rng.standard_normal((b, hkv, m, dv))
        lam = np.asarray(rng.uniform(0.1, 0.9, lam_shape))
        out, c = diff_attention_forward(q1, k1, q2, k2, v, lam, block_q=4, block_k=3, **cfg)
        out_r, c_r = diff_attention_core_forward(q1, k1, q2, k2, v, lam, **cfg)
        g = rng.standard_normal(out.shape)
        gk, gr = diff_attention_backward(g, c), diff_attention_core_backward(g, c_r)
        errs = [np.abs(out - out_r).max()] + [np.abs(gk[x] - gr[x]).max() for x in gr]
        err = float(max(errs))
        assert err <= 1e-10, errs
        worst = max(worst, err)
    return worst


_c.attach_kernel("diff_attention_core", "refattn.attention.differential", diff_attention_forward, _parity_check)
