r"""Fused flash-style softmax attention (SDPA) on CUDA with numba.cuda: forward (out + LSE) and a
deterministic FlashAttention-2 style backward.

The CUDA twin of :mod:`refattn.kernels.cpu.flash`: same signature, same argument validation (the CPU
validators are reused), same semantics as :func:`refattn.attention.softmax.sdpa.sdpa_forward` /
:func:`~refattn.attention.softmax.sdpa.sdpa_backward` (``causal_alignment``, ``kv_group_map`` GQA,
``softcap``, boolean/additive masks, fully masked rows give 0 with 0 gradient and LSE ``-inf``).

``block_q`` / ``block_k`` default to ``None``: tiles are then chosen per kernel to fit 48 KiB of
static shared memory. Inputs may be NumPy arrays (copied to the device and results copied back) or
numba device arrays (results stay on the device; values are then not checked for NaN/inf and must
be float32/float64). The kernels are described in :mod:`refattn.kernels.cuda._attention`.

Example::

    from refattn.kernels.cuda.flash import flash_attention_forward, flash_attention_backward
    out, cache = flash_attention_forward(q, k, v, is_causal=True)
    grads = flash_attention_backward(dout, cache)      # {"q", "k", "v"}
"""

from __future__ import annotations

import numpy as np

from ..cpu._common import check_dout, compute_dtype, kv_map, mask_buffers, validate_config, validate_qkv
from . import _common as _c
from ._device import cuda, is_device_array, maybe_host, require_cuda, shape_proxy, to_device

__all__ = ["flash_attention_forward", "flash_attention_backward", "flash_attention"]

BACKEND = "numba_cuda"


def flash_attention_forward(q, k, v, *, attn_mask=None, is_causal: bool = False,
                            causal_alignment: str = "top_left", scale=None, softcap=None,
                            kv_group_map: str = "contiguous", return_lse: bool = False,
                            block_q: int | None = None, block_k: int | None = None):
    r"""Scaled dot-product attention, fused and tiled (numba.cuda).

    $O = \mathrm{softmax}(T(s\,QK^\top) + M)\,V$, one query tile per thread block with an online
    softmax over key tiles in shared memory; the log-sum-exp $L_i$ of every row is kept for the
    backward.

    Parameters
    ----------
    q (..., H, N, d), k (..., Hkv, M, d), v (..., Hkv, M, dv)
        NumPy (float16/32/64) or device (float32/64) arrays; mixed float32/float64 computes in float64.
    attn_mask, is_causal, causal_alignment, scale, softcap, kv_group_map, return_lse
        As :func:`refattn.kernels.cpu.flash.flash_attention_forward`.
    block_q, block_k : int or None
        Tile sizes (all three kernels); ``None`` chooses them to fit the shared memory.

    Returns
    -------
    out, cache
        ``out`` (..., H, N, dv) in the compute dtype (a device array when ``q`` is one);
        ``cache["lse"]`` (..., H, N).
    """
    if not isinstance(return_lse, (bool, np.bool_)):
        raise TypeError(f"return_lse must be a bool; got {type(return_lse).__name__}")
    on_dev = is_device_array(q)
    block_q = _c.check_block(block_q, "block_q")
    block_k = _c.check_block(block_k, "block_k")
    qp, kp, vp = validate_qkv(_c.proxy(q), _c.proxy(k), _c.proxy(v))
    if is_device_array(attn_mask):
        attn_mask = attn_mask.copy_to_host()
    attn_mask, is_causal, scale, softcap, _, _ = validate_config(
        qp.shape, kp.shape[-2], attn_mask, is_causal, causal_alignment, scale, softcap, kv_group_map,
        block_q or 1, block_k or 1)
    dt = compute_dtype(qp, kp, vp)
    lead = qp.shape[:-3]
    h, n, d = qp.shape[-3:]
    hkv, m = kp.shape[-3], kp.shape[-2]
    dv = vp.shape[-1]
    tx = _c.threads_per_row()
    plan = _c.plan_tiles(1, d, dv, dt, block_q, block_k, tx, n, m)
    require_cuda()
    s = (1.0 / np.sqrt(d)) if scale is None else scale
    q4, k4, v4 = _c.as4(q, dt), _c.as4(k, dt), _c.as4(v, dt)
    b = q4.shape[0]
    mask = mask_buffers(attn_mask, lead, h, n, m, dt)
    maskd = _c.mask_device(mask, dt)
    kvm = _c.const_device(("kvm", h, hkv, kv_group_map), lambda: kv_map(h, hkv, kv_group_map))
    w = _c.const_device(("ones", dt.name, b, h, n), lambda: np.ones((1, b, h, n), dtype=dt))
    offset = 0 if causal_alignment == "top_left" else m - n
    qr, kr = q4.reshape((1,) + q4.shape), k4.reshape((1,) + k4.shape)
    out4, _, lse4 = _c.launch_forward(qr, kr, v4, w, kvm, maskd, float(s), float(softcap or 0.0), is_causal,
                                      offset, plan, tx, omap_needed=False)
    out_l = maybe_host(out4, on_dev).reshape(lead + (h, n, dv))
    lse_l = maybe_host(lse4, on_dev).reshape(lead + (h, n))
    cache = {
        "backend": BACKEND, "q": qr, "k": kr, "v": v4, "w": w, "out4": out4, "lse4": lse4, "out": out_l,
        "lse": lse_l, "scale": float(s), "softcap": softcap, "is_causal": is_causal, "offset": offset,
        "kv_group_map": kv_group_map, "kvm": kvm, "mask": maskd, "plan": plan, "tx": tx,
        "shapes": (qp.shape, kp.shape, vp.shape), "on_device": on_dev, "dtype": dt,
    }
    if on_dev:  # out_l is a view of out4, which the backward reads: hand the caller a copy
        ret = cuda.device_array(out_l.shape, dtype=out_l.dtype)
        ret.copy_to_device(out_l)
        return ret, cache
    return out_l, cache


def grad_in(x, name, shape, dt):
    """Validate an upstream gradient (host or device) and return it on the device."""
    if is_device_array(x):
        check_dout(shape_proxy(x), shape, dt, name)
        return to_device(x, dt)
    return cuda.to_device(check_dout(x, shape, dt, name))


def flash_attention_backward(dout, cache, *, dlse=None):
    r"""Backward of :func:`flash_attention_forward`: ``{"q", "k", "v"}``.

    $P$ is recomputed tile by tile from the stored LSE; $D_i = \mathrm{rowsum}(dO\odot O)_i - dL_i$;
    $dS = P\odot(dO\,V^\top - D)$ (times $1-\tanh^2$ under softcap); $dV = P^\top dO$,
    $dK = s\,dS^\top Q$ (one kernel over key tiles, looping over the query heads of each kv group),
    $dQ = s\,dS\,K$ (a second kernel over query tiles). No atomics: results are deterministic.
    """
    if not isinstance(cache, dict) or cache.get("backend") != BACKEND or "lse4" not in cache:
        raise TypeError("cache must be the cache returned by refattn.kernels.cuda.flash_attention_forward")
    c = cache
    dt = c["dtype"]
    qs, ks, vs = c["shapes"]
    out4 = c["out4"]
    g4 = grad_in(dout, "dout", qs[:-1] + (vs[-1],), dt).reshape(out4.shape)
    dl = None if dlse is None else grad_in(dlse, "dlse", qs[:-1], dt)
    q, k, v4, w = c["q"], c["k"], c["v"], c["w"]
    omap = out4.reshape((1,) + tuple(out4.shape))
    _, delta = _c.launch_delta(g4, omap, w, dl)
    h, hkv = q.shape[2], k.shape[2]
    gm = c["kv_group_map"]
    heads = _c.const_device(("heads", h, hkv, gm), lambda: _c.head_groups(h, hkv, gm))
    dq, dk, dvv = _c.launch_backward(q, k, v4, w, c["kvm"], heads, c["mask"], c["scale"],
                                     float(c["softcap"] or 0.0), c["is_causal"], c["offset"], c["plan"], c["tx"],
                                     g4, c["lse4"], delta)
    on_dev = c["on_device"]
    return {"q": maybe_host(dq, on_dev).reshape(qs), "k": maybe_host(dk, on_dev).reshape(ks),
            "v": maybe_host(dvv, on_dev).reshape(vs)}


def flash_attention(q, k, v, **kwargs):
    """Convenience wrapper: the output of :func:`flash_attention_forward`."""
    return flash_attention_forward(q, k, v, **kwargs)[0]


def _parity_check(rng):
    """CUDA kernel == reference (float64, 1e-10) on out, LSE and the three gradients (toy sizes)."""
    from ...attention.softmax.sdpa import sdpa_backward as ref_bwd
    from ...attention.softmax.sdpa import sdpa_forward as ref_fwd

    worst = 0.0
    cases = [dict(), dict(is_causal=True, causal_alignment="bottom_right"),
             dict(is_causal=True, kv_group_map="strided", softcap=2.0), dict(attn_mask="bool")]
    for cfg in cases:
        b, h, hkv = 1, 2, int(rng.choice([1, 2]))
        n, m, d, dv = int(rng.integers(1, 7)), int(rng.integers(1, 7)), 3, 2
        q = rng.standard_normal((b, h, n, d))
        k = rng.standard_normal((b, hkv, m, d))
        v = rng.standard_normal((b, hkv, m, dv))
        cfg = dict(cfg)
        if cfg.get("attn_mask") == "bool":
            cfg["attn_mask"] = rng.random((b, 1, n, m)) > 0.3
        out, c = flash_attention_forward(q, k, v, block_q=4, block_k=3, **cfg)
        out_r, c_r = ref_fwd(q, k, v, **cfg)
        g = rng.standard_normal(out.shape)
        gk, gr = flash_attention_backward(g, c), ref_bwd(g, c_r)
        fin = np.isfinite(c_r["lse"])
        assert np.array_equal(fin, np.isfinite(c["lse"])), "LSE -inf pattern differs"
        errs = [np.abs(out - out_r).max(), np.abs(c["lse"][fin] - c_r["lse"][fin]).max(initial=0.0)]
        errs += [np.abs(gk[x] - gr[x]).max() for x in ("q", "k", "v")]
        err = float(max(errs))
        assert err <= 1e-10, (sorted(cfg), errs)
        worst = max(worst, err)
    return worst


_c.attach_kernel("sdpa", "refattn.attention.softmax.sdpa", flash_attention_forward, _parity_check)
