r"""Causal linear attention (Katharopoulos et al.) as a Numba prefix-state scan, forward and backward.

Same signature and semantics as
:func:`refattn.attention.linear.katharopoulos.causal_linear_attention_forward` /
:func:`~refattn.attention.linear.katharopoulos.causal_linear_attention_backward`:

$$S_i = S_{i-1} + \phi(k_i)v_i^\top,\quad z_i = z_{i-1} + \phi(k_i),\quad
o_i = \frac{S_i^\top\phi(q_i)}{\phi(q_i)\cdot z_i + \epsilon}.$$

The feature map $\phi$ and its VJP are the reference's own
(:func:`refattn.attention.linear.core.feature_map_forward` / ``feature_map_backward``); the kernels
run the scans on the features. Backward (derivation in :mod:`refattn.attention.linear.core`):
$u_i = g_i/\mathrm{den}_i$, $c_i = -g_i\cdot o_i/\mathrm{den}_i$; a forward scan rebuilds
$S_i, z_i$ for $d\phi(q_i) = S_iu_i + c_iz_i$; a reverse scan accumulates
$R_j = \sum_{i\ge j}\phi(q_i)u_i^\top$, $r_j = \sum_{i\ge j}c_i\phi(q_i)$ for
$d\phi(k_j) = R_jv_j + r_j$ and $dv_j = R_j^\top\phi(k_j)$.

Parallel over the flattened (batch, head) axis; each work item holds one $d\times d_v$ state, so the
extra memory is $O(d\,d_v)$ per head plus the $N$ denominators (no $N\times N$ matrix).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..._checks import as_float, check_choice, check_positive, compute_dtype
from ._common import check_dout

__all__ = ["causal_linear_attention_forward", "causal_linear_attention_backward"]

BACKEND = "numba_cpu"
FEATURE_MAPS = ("elu_plus_one", "identity")


@njit(cache=True, parallel=True, fastmath=False)
def _scan_fwd(fq, fk, v, eps, out, den):
    B, N, d = fq.shape
    dv = v.shape[2]
    for b in prange(B):
        S = np.zeros((d, dv), dtype=fq.dtype)
        z = np.zeros(d, dtype=fq.dtype)
        num = np.empty(dv, dtype=fq.dtype)
        for i in range(N):
            for c in range(d):
                a = fk[b, i, c]
                for e in range(dv):
                    S[c, e] += a * v[b, i, e]
                z[c] += a
            for e in range(dv):
                num[e] = 0.0
            dd = 0.0
            for c in range(d):
                a = fq[b, i, c]
                for e in range(dv):
                    num[e] += a * S[c, e]
                dd += a * z[c]
            dd += eps
            den[b, i] = dd
            for e in range(dv):
                out[b, i, e] = num[e] / dd


@njit(cache=True, parallel=True, fastmath=False)
def _scan_bwd(fq, fk, v, g, out, den, dfq, dfk, dv_):
    B, N, d = fq.shape
    dv = v.shape[2]
    for b in prange(B):
        S = np.zeros((d, dv), dtype=fq.dtype)
        z = np.zeros(d, dtype=fq.dtype)
        u = np.empty(dv, dtype=fq.dtype)
        for i in range(N):
            for c in range(d):
                a = fk[b, i, c]
                for e in range(dv):
                    S[c, e] += a * v[b, i, e]
                z[c] += a
            di = den[b, i]
            go = 0.0
            for e in range(dv):
                u[e] = g[b, i, e] / di
                go += g[b, i, e] * out[b, i, e]
            ci = -go / di
            for c in range(d):
                acc = 0.0
                for e in range(dv):
                    acc += S[c, e] * u[e]
                dfq[b, i, c] = acc + ci * z[c]
        R = np.zeros((d, dv), dtype=fq.dtype)
        r = np.zeros(d, dtype=fq.dtype)
        for j in range(N - 1, -1, -1):
            dj = den[b, j]
            go = 0.0
            for e in range(dv):
                u[e] = g[b, j, e] / dj
                go += g[b, j, e] * out[b, j, e]
            cj = -go / dj
            for c in range(d):
                a = fq[b, j, c]
                for e in range(dv):
                    R[c, e] += a * u[e]
                r[c] += cj * a
            for c in range(d):
                acc = 0.0
                for e in range(dv):
                    acc += R[c, e] * v[b, j, e]
                dfk[b, j, c] = acc + r[c]
            for e in range(dv):
                dv_[b, j, e] = 0.0
            for c in range(d):
                a = fk[b, j, c]
                for e in range(dv):
                    dv_[b, j, e] += a * R[c, e]


def _validate(q, k, v, eps, feature_map):
    q = as_float(q, "q", min_ndim=3)
    k = as_float(k, "k", min_ndim=3)
    v = as_float(v, "v", min_ndim=3)
    for name, a in (("k", k), ("v", v)):
        if a.ndim != q.ndim or a.shape[:-2] != q.shape[:-2]:
            raise ValueError(f"{name} must have q's leading (batch, head) axes {q.shape[:-2]}; got {name} of "
                             f"shape {a.shape} (q {q.shape}); repeat K/V heads for GQA first")
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"the feature size (last axis) of q ({q.shape[-1]}) and k ({k.shape[-1]}) must agree")
    if k.shape[-2] != q.shape[-2] or v.shape[-2] != q.shape[-2]:
        raise ValueError(f"causal linear attention needs equal sequence lengths (axis -2); got q {q.shape}, "
                         f"k {k.shape}, v {v.shape}")
    eps = check_positive(eps, "eps", allow_zero=True)
    check_choice(feature_map, "feature_map", FEATURE_MAPS)
    return q, k, v, eps


def causal_linear_attention_forward(q, k, v, *, eps: float = 1e-6, feature_map: str = "elu_plus_one"):
    r"""Causal linear attention, prefix-state scan (Numba CPU).

    Parameters
    ----------
    q, k : (..., N, d); v : (..., N, dv)
        Equal leading axes (no GQA broadcasting).
    eps : float >= 0
        Added to the denominator (fast-transformers default 1e-6).
    feature_map : {"elu_plus_one", "identity"}

    Returns
    -------
    out (..., N, dv), cache
    """
    from ...attention.linear.core import feature_map_forward

    q, k, v, eps = _validate(q, k, v, eps, feature_map)
    dt = compute_dtype(q, k, v)
    q, k, v = (a.astype(dt, copy=False) for a in (q, k, v))
    fq = np.ascontiguousarray(feature_map_forward(q, feature_map), dtype=dt)
    fk = np.ascontiguousarray(feature_map_forward(k, feature_map), dtype=dt)
    n, d = q.shape[-2:]
    dv = v.shape[-1]
    fq3, fk3 = fq.reshape(-1, n, d), fk.reshape(-1, n, d)
    v3 = np.ascontiguousarray(v.reshape(-1, n, dv))
    out = np.empty((fq3.shape[0], n, dv), dtype=dt)
    den = np.empty((fq3.shape[0], n), dtype=dt)
    _scan_fwd(fq3, fk3, v3, float(eps), out, den)
    cache = {"backend": BACKEND, "kind": "causal_linear", "q": q, "k": k, "v3": v3, "fq3": fq3, "fk3": fk3,
             "out3": out, "den": den, "feature_map": feature_map, "eps": eps,
             "shapes": (q.shape, k.shape, v.shape)}
    return out.reshape(q.shape[:-1] + (dv,)), cache


def causal_linear_attention_backward(dout, cache):
    """Gradients ``{"q", "k", "v"}`` of :func:`causal_linear_attention_forward` (two scans)."""
    from ...attention.linear.core import feature_map_backward

    if not isinstance(cache, dict) or cache.get("kind") != "causal_linear" or cache.get("backend") != BACKEND:
        raise TypeError("cache must be the cache returned by causal_linear_attention_forward")
    c = cache
    qs, ks, vs = c["shapes"]
    fq3, fk3, v3, out = c["fq3"], c["fk3"], c["v3"], c["out3"]
    dt = fq3.dtype
    g = check_dout(dout, qs[:-1] + (vs[-1],), dt).reshape(out.shape)
    dfq, dfk, dvv = np.empty_like(fq3), np.empty_like(fk3), np.empty_like(v3)
    _scan_bwd(fq3, fk3, v3, g, out, c["den"], dfq, dfk, dvv)
    fm = c["feature_map"]
    return {"q": feature_map_backward(dfq.reshape(qs), c["q"], fm),
            "k": feature_map_backward(dfk.reshape(ks), c["k"], fm),
            "v": dvv.reshape(vs)}


def _parity_check(rng):
    """Scan kernels == reference causal scan (float64, 1e-10) on the output and gradients."""
    from ...attention.linear.katharopoulos import causal_linear_attention_backward as ref_bwd
    from ...attention.linear.katharopoulos import causal_linear_attention_forward as ref_fwd

    worst = 0.0
    for fm in FEATURE_MAPS:
        n = int(rng.integers(1, 12))
        q, k = rng.standard_normal((2, 2, 3, n, 4))
        v = rng.standard_normal((2, 3, n, 5))
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


from ._common import attach_kernel  # noqa: E402

# The record's forward is linear_attention_forward(..., causal=...); the kernel covers its causal
# form (the prefix-state scan), which is what the parity check compares.
attach_kernel("linear_attention_katharopoulos", "refattn.attention.linear.katharopoulos",
              causal_linear_attention_forward, _parity_check)
