r"""Causal linear attention (Katharopoulos et al.) as a numba.cuda prefix-state scan, forward and
backward.

The CUDA twin of :mod:`refattn.kernels.cpu.linear` (same signature and validation), semantics of
:func:`refattn.attention.linear.katharopoulos.causal_linear_attention_forward` /
:func:`~refattn.attention.linear.katharopoulos.causal_linear_attention_backward`:

$$S_i = S_{i-1} + \phi(k_i)v_i^\top,\quad z_i = z_{i-1} + \phi(k_i),\quad
o_i = \frac{S_i^\top\phi(q_i)}{\phi(q_i)\cdot z_i + \epsilon}.$$

One thread block per (batch, head) row; tiles of ``T`` tokens are staged in shared memory. In the
forward, thread ``e`` owns the state column $S_{:,e}$ (so $o_{ie}$ needs no reduction between
threads). The backward (derivation in :mod:`refattn.attention.linear.core`) runs a forward scan in which
thread ``c`` owns the state row $S_{c,:}$ and $z_c$ ($d\phi(q_i)_c = S_{c,:}u_i + c_iz_c$), then a
reverse scan in which thread ``c`` owns $R_{c,:}, r_c$ ($d\phi(k_j)_c$) and thread ``e`` owns
$R_{:,e}$ ($dv_{je}$). The feature map $\phi$ (ELU+1 or identity) and its derivative are applied in
the kernels. As in the CPU scan, the states are kept in the input dtype and the per-step dot
products that end in a division (denominators, $g\cdot o$, $d\phi$ sums) accumulate in float64. Extra memory: $O(d\,d_v)$ registers per head plus the $N$ denominators.
"""

from __future__ import annotations

import numpy as np

from ..._checks import compute_dtype
from ..cpu.linear import validate_arguments as cpu_validate
from . import _attention as _k
from . import _common as _c
from ._device import cuda, is_device_array, maybe_host, require_cuda, to_device
from .flash import grad_in

__all__ = ["causal_linear_attention_forward", "causal_linear_attention_backward"]

BACKEND = "numba_cuda"
_FM = {"identity": 0, "elu_plus_one": 1}
MAX_TILE = 32
"""Tokens staged in shared memory per step of the scan (the largest that fits is used, up to this)."""


def _tile(d, dv, isz):
    for t in (32, 16, 8, 4, 2, 1):
        if t <= MAX_TILE and _k.smem_lin(t, d, dv, isz) <= _c.SMEM_LIMIT:
            return t
    raise ValueError(f"feature sizes d={d}, dv={dv} are too large for the CUDA scan's shared-memory tiles")


def _as3(x, dt):
    shape3 = (int(np.prod(x.shape[:-2], dtype=np.int64)),) + tuple(x.shape[-2:])
    if is_device_array(x):
        return to_device(x, dt).reshape(shape3)
    return cuda.to_device(np.ascontiguousarray(np.asarray(x).reshape(shape3), dtype=dt))


def _launch_fwd(q3, k3, v3, feature_map, eps, tile):
    b, n, d = q3.shape
    dv = v3.shape[2]
    dt = np.dtype(q3.dtype)
    out = cuda.device_array((b, n, dv), dtype=dt)
    den = cuda.device_array((b, n), dtype=dt)
    kern = _k.get_lin_fwd(dt.name, tile, d, dv)
    kern[(b,), (max(d, dv),)](q3, k3, v3, _FM[feature_map], np.float64(eps), out, den)
    return out, den


def causal_linear_attention_forward(q, k, v, *, eps: float = 1e-6, feature_map: str = "elu_plus_one"):
    r"""Causal linear attention, prefix-state scan (numba.cuda).

    Parameters
    ----------
    q, k : (..., N, d); v : (..., N, dv)
        Equal leading axes (no GQA broadcasting). NumPy or device arrays.
    eps : float >= 0
    feature_map : {"elu_plus_one", "identity"}

    Returns
    -------
    out (..., N, dv), cache
    """
    on_dev = is_device_array(q)
    qp, kp, vp, eps = cpu_validate(_c.proxy(q), _c.proxy(k), _c.proxy(v), eps, feature_map)
    dt = compute_dtype(qp, kp, vp)
    n, d = qp.shape[-2:]
    dv = vp.shape[-1]
    tile = _tile(d, dv, dt.itemsize)
    if max(d, dv) > _c.MAX_THREADS:  # one thread per feature column
        raise ValueError(f"feature sizes d={d}, dv={dv} exceed the CUDA scan's {_c.MAX_THREADS} threads per block")
    require_cuda()
    q3, k3, v3 = _as3(q, dt), _as3(k, dt), _as3(v, dt)
    out, den = _launch_fwd(q3, k3, v3, feature_map, eps, tile)
    out_l = maybe_host(out, on_dev).reshape(qp.shape[:-1] + (dv,))
    cache = {"backend": BACKEND, "kind": "causal_linear", "q3": q3, "k3": k3, "v3": v3, "out3": out,
             "den": den, "feature_map": feature_map, "eps": eps, "tile": tile,
             "shapes": (qp.shape, kp.shape, vp.shape), "on_device": on_dev, "dtype": dt}
    if on_dev:  # out_l is a view of out3, which the backward reads: hand the caller a copy
        ret = cuda.device_array(out_l.shape, dtype=out_l.dtype)
        ret.copy_to_device(out_l)
        return ret, cache
    return out_l, cache


def causal_linear_attention_backward(dout, cache):
    """Gradients ``{"q", "k", "v"}`` of :func:`causal_linear_attention_forward` (two scans)."""
    if not isinstance(cache, dict) or cache.get("kind") != "causal_linear" or cache.get("backend") != BACKEND:
        raise TypeError("cache must be the cache returned by refattn.kernels.cuda.causal_linear_attention_forward")
    c = cache
    qs, ks, vs = c["shapes"]
    dt = c["dtype"]
    out = c["out3"]
    g = grad_in(dout, "dout", qs[:-1] + (vs[-1],), dt).reshape(out.shape)
    q3, k3, v3 = c["q3"], c["k3"], c["v3"]
    b, n, d = q3.shape
    dv = v3.shape[2]
    dq = cuda.device_array((b, n, d), dtype=dt)
    dk = cuda.device_array((b, n, d), dtype=dt)
    dvv = cuda.device_array((b, n, dv), dtype=dt)
    kern = _k.get_lin_bwd(dt.name, c["tile"], d, dv)
    kern[(b,), (max(d, dv),)](q3, k3, v3, _FM[c["feature_map"]], g, out, c["den"], dq, dk, dvv)
    on_dev = c["on_device"]
    return {"q": maybe_host(dq, on_dev).reshape(qs), "k": maybe_host(dk, on_dev).reshape(ks),
            "v": maybe_host(dvv, on_dev).reshape(vs)}


def _parity_check(rng):
    """CUDA scans == reference causal scan (float64, 1e-10) on the output and gradients."""
    from ...attention.linear.katharopoulos import causal_linear_attention_backward as ref_bwd
    from ...attention.linear.katharopoulos import causal_linear_attention_forward as ref_fwd

    worst = 0.0
    for fm in ("elu_plus_one", "identity"):
        n = int(rng.integers(1, 8))
        q, k = rng.standard_normal((2, 1, 2, n, 3))
        v = rng.standard_normal((1, 2, n, 2))
        if fm == "identity":
            q, k = np.abs(q), np.abs(k)
        out, c = causal_linear_attention_forward(q, k, v, feature_map=fm)
        out_r, c_r = ref_fwd(q, k, v, feature_map=fm)
        g = rng.standard_normal(out.shape)
        gk, gr = causal_linear_attention_backward(g, c), ref_bwd(g, c_r)
        err = float(max([np.abs(out - out_r).max()] + [np.abs(gk[x] - gr[x]).max() for x in "qkv"]))
        assert err <= 1e-10, err
        worst = max(worst, err)
    return worst


# The record's forward is linear_attention_forward(..., causal=...); the kernel covers its causal form.
_c.attach_kernel("linear_attention_katharopoulos", "refattn.attention.linear.katharopoulos",
                 causal_linear_attention_forward, _parity_check)
