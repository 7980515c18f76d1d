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
from . import runtime
from ._common import check_dout, readonly, run_kernel

__all__ = ["causal_linear_attention_forward", "causal_linear_attention_backward"]

BACKEND = "numba_cpu"
FEATURE_MAPS = ("elu_plus_one", "identity")


# Tokens per chunk of the scan: the intra-chunk products are (CHUNK x CHUNK x d) gemms.
CHUNK = 64


@njit(cache=True)
def _chunk_fwd(fq, fk, v, eps, b, chunk, S, z, A, num, out, den):
    """Forward scan of one (batch, head) row ``b``, ``chunk`` tokens at a time (see module doc)."""
    N, d = fq.shape[1], fq.shape[2]
    dv = v.shape[2]
    for c0 in range(0, N, chunk):
        nc = min(chunk, N - c0)
        Q = fq[b, c0:c0 + nc]
        K = fk[b, c0:c0 + nc]
        V = v[b, c0:c0 + nc]
        a = A[:nc * nc].reshape(nc, nc)
        np.dot(Q, K.T, a)  # phi(q_i) . phi(k_j)
        for i in range(nc):
            for j in range(i + 1, nc):
                a[i, j] = 0.0  # causal: keys after the query
        nm = num[:nc * dv].reshape(nc, dv)
        np.dot(a, V, nm)  # intra-chunk numerator
        tq = num[nc * dv:2 * nc * dv].reshape(nc, dv)
        np.dot(Q, S, tq)  # the state of the previous chunks
        for i in range(nc):
            # the denominator, a dot product that ends in a division: accumulated in float64
            dd = 0.0
            for j in range(i + 1):
                dd += a[i, j]
            for c in range(d):
                dd += Q[i, c] * z[c]
            dd += eps
            den[b, c0 + i] = dd
            for e in range(dv):
                out[b, c0 + i, e] = (nm[i, e] + tq[i, e]) / dd
        ts = A[:d * dv].reshape(d, dv)
        np.dot(K.T, V, ts)  # this chunk's contribution to the state
        for c in range(d):
            for e in range(dv):
                S[c, e] += ts[c, e]
        for j in range(nc):
            for c in range(d):
                z[c] += K[j, c]


@njit(cache=True, parallel=True)
def scan_fwd(fq, fk, v, eps, chunk, out, den):
    B, N, d = fq.shape
    dv = v.shape[2]
    for b in prange(B):
        S = np.zeros((d, dv), dtype=fq.dtype)
        z = np.zeros(d, dtype=fq.dtype)
        A = np.empty(max(chunk * chunk, d * dv), dtype=fq.dtype)
        num = np.empty(2 * chunk * dv, dtype=fq.dtype)
        _chunk_fwd(fq, fk, v, eps, b, chunk, S, z, A, num, out, den)


@njit(cache=True)
def _chunk_weights(g, out, den, v, b, c0, nc, U, cv, W):
    """``U = G / den``, ``c = -rowsum(G o O) / den`` and ``W = tril(U V^T + c 1^T)`` of a chunk."""
    dv = v.shape[2]
    for i in range(nc):
        di = den[b, c0 + i]
        go = 0.0
        for e in range(dv):
            U[i, e] = g[b, c0 + i, e] / di
            go += g[b, c0 + i, e] * out[b, c0 + i, e]
        cv[i] = -go / di
    np.dot(U, v[b, c0:c0 + nc].T, W)
    for i in range(nc):
        for j in range(nc):
            W[i, j] = W[i, j] + cv[i] if j <= i else 0.0


@njit(cache=True)
def _chunk_bwd(fq, fk, v, g, out, den, b, chunk, S, z, R, r, ubuf, cv, wbuf, tbuf, f64buf, pmbuf, dfq, dfk,
               dv_):
    """Backward of one (batch, head) row: a forward pass over the chunks for d phi(q) (needs the
    prefix state S, z), then a reverse pass for d phi(k) and dv (needs the suffix state R, r)."""
    N, d = fq.shape[1], fq.shape[2]
    dv = v.shape[2]
    for c0 in range(0, N, chunk):
        nc = min(chunk, N - c0)
        Q = fq[b, c0:c0 + nc]
        K = fk[b, c0:c0 + nc]
        V = v[b, c0:c0 + nc]
        U = ubuf[:nc * dv].reshape(nc, dv)
        W = wbuf[:nc * nc].reshape(nc, nc)
        _chunk_weights(g, out, den, v, b, c0, nc, U, cv, W)
        t1 = tbuf[:nc * d].reshape(nc, d)
        np.dot(W, K, t1)  # intra-chunk part
        t2 = tbuf[nc * d:2 * nc * d].reshape(nc, d)
        np.dot(U, S.T, t2)  # previous chunks, S_prev u_i
        for i in range(nc):
            for c in range(d):
                dfq[b, c0 + i, c] = t1[i, c] + t2[i, c] + cv[i] * z[c]
        ts = tbuf[:d * dv].reshape(d, dv)
        np.dot(K.T, V, ts)
        for c in range(d):
            for e in range(dv):
                S[c, e] += ts[c, e]
        for j in range(nc):
            for c in range(d):
                z[c] += K[j, c]
    nch = (N + chunk - 1) // chunk
    for ci in range(nch - 1, -1, -1):
        c0 = ci * chunk
        nc = min(chunk, N - c0)
        Q = fq[b, c0:c0 + nc]
        K = fk[b, c0:c0 + nc]
        V = v[b, c0:c0 + nc]
        U = ubuf[:nc * dv].reshape(nc, dv)
        W = wbuf[:nc * nc].reshape(nc, nc)
        _chunk_weights(g, out, den, v, b, c0, nc, U, cv, W)
        t1 = tbuf[:nc * d].reshape(nc, d)
        np.dot(W.T, Q, t1)  # intra-chunk part of d phi(k)
        t2 = tbuf[nc * d:2 * nc * d].reshape(nc, d)
        np.dot(V, R.T, t2)  # later chunks, R_next v_j
        for j in range(nc):
            for c in range(d):
                dfk[b, c0 + j, c] = t1[j, c] + t2[j, c] + r[c]
        # intra-chunk part of dv, sum_{i >= j} (phi(q_i) . phi(k_j)) u_i, in float64: its terms are
        # large (phi >= 0) and cancel (u has either sign); products rounded to float32 made the
        # float32 dv ~2.3x less accurate than the naive float32 reference (measured, AVX-512)
        Q64 = f64buf[:nc * d].reshape(nc, d)
        K64 = f64buf[nc * d:2 * nc * d].reshape(nc, d)
        U64 = f64buf[2 * nc * d:2 * nc * d + nc * dv].reshape(nc, dv)
        t64 = f64buf[2 * nc * d + nc * dv:2 * nc * d + 2 * nc * dv].reshape(nc, dv)
        pm = pmbuf[:nc * nc].reshape(nc, nc)
        for i in range(nc):
            for c in range(d):
                Q64[i, c] = Q[i, c]
                K64[i, c] = K[i, c]
            di = np.float64(den[b, c0 + i])
            for e in range(dv):
                U64[i, e] = g[b, c0 + i, e] / di
        np.dot(Q64, K64.T, pm)  # phi(q_i) . phi(k_j), i >= j
        for i in range(nc):
            for j in range(i + 1, nc):
                pm[i, j] = 0.0
        np.dot(pm.T, U64, t64)
        t4 = tbuf[nc * dv:2 * nc * dv].reshape(nc, dv)
        np.dot(K, R, t4)
        for j in range(nc):
            for e in range(dv):
                dv_[b, c0 + j, e] = t64[j, e] + t4[j, e]
        tr = tbuf[:d * dv].reshape(d, dv)
        np.dot(Q.T, U, tr)
        for c in range(d):
            for e in range(dv):
                R[c, e] += tr[c, e]
            acc = 0.0
            for i in range(nc):
                acc += cv[i] * Q[i, c]
            r[c] += acc


@njit(cache=True, parallel=True)
def scan_bwd(fq, fk, v, g, out, den, chunk, dfq, dfk, dv_):
    B, N, d = fq.shape
    dv = v.shape[2]
    for b in prange(B):
        S = np.zeros((d, dv), dtype=fq.dtype)
        z = np.zeros(d, dtype=fq.dtype)
        R = np.zeros((d, dv), dtype=fq.dtype)
        r = np.zeros(d, dtype=fq.dtype)
        ubuf = np.empty(chunk * dv, dtype=fq.dtype)
        cv = np.empty(chunk, dtype=fq.dtype)
        wbuf = np.empty(chunk * chunk, dtype=fq.dtype)
        tbuf = np.empty(max(2 * chunk * max(d, dv), d * dv), dtype=fq.dtype)
        f64buf = np.empty(chunk * (2 * d + 2 * dv), dtype=np.float64)
        pmbuf = np.empty(chunk * chunk, dtype=np.float64)
        _chunk_bwd(fq, fk, v, g, out, den, b, chunk, S, z, R, r, ubuf, cv, wbuf, tbuf, f64buf, pmbuf, dfq, dfk,
                   dv_)


runtime.register_entry_point(scan_fwd, "scan_fwd")
runtime.register_entry_point(scan_bwd, "scan_bwd")


def validate_arguments(q, k, v, eps, feature_map):
    """Checks of the arguments (shared with the CUDA port); returns ``q, k, v, eps``."""
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

    q, k, v, eps = validate_arguments(q, k, v, eps, feature_map)
    dt = compute_dtype(q, k, v)
    q, k, v = (a.astype(dt, copy=False) for a in (q, k, v))
    fq = np.ascontiguousarray(feature_map_forward(q, feature_map), dtype=dt)
    fk = np.ascontiguousarray(feature_map_forward(k, feature_map), dtype=dt)
    n, d = q.shape[-2:]
    dv = v.shape[-1]
    fq3, fk3 = readonly(fq.reshape(-1, n, d)), readonly(fk.reshape(-1, n, d))
    v3 = readonly(v.reshape(-1, n, dv))
    out = np.empty((fq3.shape[0], n, dv), dtype=dt)
    den = np.empty((fq3.shape[0], n), dtype=dt)
    run_kernel(scan_fwd, fq3, fk3, v3, float(eps), CHUNK, out, den)
    cache = {"backend": BACKEND, "kind": "causal_linear", "q": q, "k": k, "v3": v3, "fq3": fq3, "fk3": fk3,
             "out3": out, "den": den, "feature_map": feature_map, "eps": eps,
             "shapes": (q.shape, k.shape, v.shape)}
    # the caller gets a copy: the backward reads out3, which an in-place update must not reach
    return out.reshape(q.shape[:-1] + (dv,)).copy(), cache


def causal_linear_attention_backward(dout, cache):
    """Gradients ``{"q", "k", "v"}`` of :func:`causal_linear_attention_forward` (two scans)."""
    from ...attention.linear.core import feature_map_backward

    if not isinstance(cache, dict) or cache.get("kind") != "causal_linear" or cache.get("backend") != BACKEND:
        raise TypeError("cache must be the cache returned by causal_linear_attention_forward")
    c = cache
    qs, ks, vs = c["shapes"]
    fq3, fk3, v3, out = c["fq3"], c["fk3"], c["v3"], c["out3"]
    dt = fq3.dtype
    g = readonly(check_dout(dout, qs[:-1] + (vs[-1],), dt).reshape(out.shape))
    dfq, dfk, dvv = (np.empty(a.shape, dtype=dt) for a in (fq3, fk3, v3))
    run_kernel(scan_bwd, fq3, fk3, v3, g, readonly(out), readonly(c["den"]), CHUNK, dfq, dfk, dvv)
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
