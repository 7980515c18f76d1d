r"""Linear and kernel attention: Katharopoulos et al., Efficient Attention (Shen et al.), Performer
FAVOR+, TransNormer NormAttention and kernelized attention with RPE via FFT (Luo et al.).

All of them are one computation on non-negative *features* $\Phi_Q = \phi(Q)$,
$\Phi_K = \phi(K)$:

$$O = \frac{\Phi_Q(\Phi_K^\top V)}{\Phi_Q(\Phi_K^\top\mathbf 1) + \epsilon}\qquad
\text{(row-wise division; causal: prefix sums over } j\le i\text{)},$$

which equals the explicit $O(N^2)$ form $O = \mathrm{diag}(A\mathbf 1+\epsilon)^{-1}AV$ with
$A = \Phi_Q\Phi_K^\top$ (masked lower-triangular when causal). The mechanisms differ only in
$\phi$, the normaliser and what happens after.

Layouts (PyTorch SDPA): ``q (..., N, d)``, ``k (..., M, d)``, ``v (..., M, dv)`` with equal leading
axes (``(B, H)`` typically; no GQA broadcasting: repeat K/V heads first). Causal forms need
``M == N``.

Shared feature-space core (derivation)
--------------------------------------
Non-causal: $S = \Phi_K^\top V\in\mathbb R^{d\times d_v}$, $z = \Phi_K^\top\mathbf 1$,
$\mathrm{num}_i = S^\top\phi_i$, $\mathrm{den}_i = \phi_i\cdot z + \epsilon$,
$o_i = \mathrm{num}_i/\mathrm{den}_i$ ($\phi_i$ = row $i$ of $\Phi_Q$). With $g_i=\partial L/\partial o_i$:
$u_i = g_i/\mathrm{den}_i$ (gradient of $\mathrm{num}_i$) and
$c_i = -g_i\cdot o_i/\mathrm{den}_i$ (gradient of $\mathrm{den}_i$), so

$$d\Phi_Q = U S^\top + c\,z^\top,\quad dS = \Phi_Q^\top U,\quad dz = \Phi_Q^\top c,\quad
d\Phi_K = V\,dS^\top + \mathbf 1\,dz^\top,\quad dV = \Phi_K\,dS.$$

Causal: $S_i = \sum_{j\le i}\phi(k_j)v_j^\top$, $z_i = \sum_{j\le i}\phi(k_j)$. The same local
rules give $d\phi(q_i) = S_iu_i + c_iz_i$ (a forward scan that rebuilds $S_i$) and, since
$S_i$ feeds every $i\ge j$, with the reverse prefix sums $R_j = \sum_{i\ge j}\phi(q_i)u_i^\top$,
$r_j = \sum_{i\ge j}c_i\phi(q_i)$:

$$d\phi(k_j) = R_jv_j + r_j,\qquad dv_j = R_j^\top\phi(k_j)$$

(a reverse scan). Both scans hold one $d\times d_v$ state per head: $O(Nd\,d_v)$ time and
$O(d\,d_v)$ extra memory, as in fast-transformers' ``causal_product`` kernels. Without the
normaliser (TransNormer) $c=0$ and $\mathrm{den}=1$.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_float, check_choice, check_dim, check_int, check_positive, compute_dtype
from ..nn.norms import layer_norm_backward, layer_norm_forward, rms_norm_backward, rms_norm_forward
from ..nn.softmax import softmax_lse, softmax_vjp
from ..registry import Mechanism, Sample, register

__all__ = [
    "FEATURE_MAPS",
    "feature_map_forward",
    "feature_map_backward",
    "linear_attention_forward",
    "linear_attention_backward",
    "linear_attention",
    "linear_attention_explicit",
    "causal_linear_attention_forward",
    "causal_linear_attention_backward",
    "efficient_attention_forward",
    "efficient_attention_backward",
    "efficient_attention",
]

FEATURE_MAPS = ("elu_plus_one", "identity")


# --------------------------------------------------------------------------------------------
# Feature maps


def feature_map_forward(x: np.ndarray, feature_map: str) -> np.ndarray:
    r"""Apply a named feature map elementwise (unvalidated).

    ``"elu_plus_one"``: $\phi(x) = \mathrm{elu}(x)+1$ ($x+1$ for $x>0$, $e^x$ otherwise; the
    Katharopoulos map, fast-transformers ``elu_feature_map``). ``"identity"``: $q,k$ are already
    features (they must then be non-negative for a well-defined normaliser).
    """
    if feature_map == "identity":
        return x
    return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))


def feature_map_backward(dphi: np.ndarray, x: np.ndarray, feature_map: str) -> np.ndarray:
    r"""VJP of :func:`feature_map_forward`: $\phi'(x) = 1$ for $x>0$, $e^x$ otherwise (ELU+1 is
    $C^1$ at 0, so FD checks are valid everywhere)."""
    if feature_map == "identity":
        return dphi
    return dphi * np.where(x > 0, 1.0, np.exp(np.minimum(x, 0.0)))


# --------------------------------------------------------------------------------------------
# Validation


def _validate_qkv(q, k, v, *, same_length: bool = False):
    q = as_float(q, "q", min_ndim=3)
    k = as_float(k, "k", min_ndim=3)
    v = as_float(v, "v", min_ndim=3)
    for name, a in (("k", k), ("v", v)):
        if a.shape[:-2] != q.shape[:-2]:
            raise ValueError(
                f"{name} must have q's leading (batch, head) axes {q.shape[:-2]}; got {name} of shape "
                f"{a.shape} (q {q.shape}); repeat K/V heads for GQA first"
            )
    check_dim("q", q.shape[-1], "k", k.shape[-1], "the feature size (last axis)")
    check_dim("k", k.shape[-2], "v", v.shape[-2], "the sequence length (axis -2)")
    if same_length:
        check_dim("q", q.shape[-2], "k", k.shape[-2], "the sequence length (axis -2, causal)")
    dt = compute_dtype(q, k, v)
    return q.astype(dt, copy=False), k.astype(dt, copy=False), v.astype(dt, copy=False)


def _check_dout(dout, shape, dtype):
    dout = as_float(dout, "dout", finite=False)
    if dout.shape != tuple(shape):
        raise ValueError(f"dout must have the output's shape {tuple(shape)}; got {dout.shape}")
    return dout.astype(dtype, copy=False)


def _mT(a):
    return np.swapaxes(a, -1, -2)


# --------------------------------------------------------------------------------------------
# Feature-space core


def _core_forward(fq, fk, v, *, causal: bool, eps: float, normalise: bool, den_guard: float = 0.0):
    """Linear attention on features. Returns ``(out, state)``; ``state`` feeds :func:`_core_backward`."""
    if not causal:
        S = _mT(fk) @ v  # (..., d, dv)
        num = fq @ S
        if normalise:
            z = np.sum(fk, axis=-2)  # (..., d)
            den = np.einsum("...nd,...d->...n", fq, z) + eps
            if den_guard > 0:  # google-research performer: R + 2 s (|R| <= s); locally constant
                den = den + 2.0 * den_guard * (np.abs(den) <= den_guard)
            out = num / den[..., None]
        else:
            den, out = None, num
        return out, {"S": S, "den": den}
    n = fq.shape[-2]
    S = np.zeros(fq.shape[:-2] + (fq.shape[-1], v.shape[-1]), dtype=fq.dtype)
    z = np.zeros(fq.shape[:-2] + (fq.shape[-1],), dtype=fq.dtype)
    out = np.empty(fq.shape[:-1] + (v.shape[-1],), dtype=fq.dtype)
    den = np.empty(fq.shape[:-1], dtype=fq.dtype) if normalise else None
    for i in range(n):
        S = S + fk[..., i, :, None] * v[..., i, None, :]
        num = np.einsum("...d,...de->...e", fq[..., i, :], S)
        if normalise:
            z = z + fk[..., i, :]
            di = np.einsum("...d,...d->...", fq[..., i, :], z) + eps
            if den_guard > 0:
                di = di + 2.0 * den_guard * (np.abs(di) <= den_guard)
            den[..., i] = di
            out[..., i, :] = num / di[..., None]
        else:
            out[..., i, :] = num
    return out, {"den": den}


def _core_backward(g, fq, fk, v, out, state, *, causal: bool, normalise: bool):
    """Gradients ``(dfq, dfk, dv)`` of :func:`_core_forward` (see the module derivation)."""
    den = state["den"]
    if normalise:
        u = g / den[..., None]
        c = -np.sum(g * out, axis=-1) / den
    else:
        u, c = g, None
    if not causal:
        S = state["S"]
        dfq = u @ _mT(S)
        dS = _mT(fq) @ u
        dfk = v @ _mT(dS)
        if normalise:
            z = np.sum(fk, axis=-2)
            dfq = dfq + c[..., None] * z[..., None, :]
            dz = np.einsum("...n,...nd->...d", c, fq)
            dfk = dfk + dz[..., None, :]
        dv = fk @ dS
        return dfq, dfk, dv
    n = fq.shape[-2]
    dfq = np.empty_like(fq)
    dfk = np.empty_like(fk)
    dv = np.empty_like(v)
    # forward scan: d phi(q_i) = S_i u_i + c_i z_i
    S = np.zeros(fq.shape[:-2] + (fq.shape[-1], v.shape[-1]), dtype=fq.dtype)
    z = np.zeros(fq.shape[:-2] + (fq.shape[-1],), dtype=fq.dtype)
    for i in range(n):
        S = S + fk[..., i, :, None] * v[..., i, None, :]
        dq_i = np.einsum("...de,...e->...d", S, u[..., i, :])
        if normalise:
            z = z + fk[..., i, :]
            dq_i = dq_i + c[..., i, None] * z
        dfq[..., i, :] = dq_i
    # reverse scan: R_j = sum_{i>=j} phi(q_i) u_i^T, r_j = sum_{i>=j} c_i phi(q_i)
    R = np.zeros_like(S)
    r = np.zeros_like(z)
    for j in range(n - 1, -1, -1):
        R = R + fq[..., j, :, None] * u[..., j, None, :]
        dk_j = np.einsum("...de,...e->...d", R, v[..., j, :])
        if normalise:
            r = r + c[..., j, None] * fq[..., j, :]
            dk_j = dk_j + r
        dfk[..., j, :] = dk_j
        dv[..., j, :] = np.einsum("...de,...d->...e", R, fk[..., j, :])
    return dfq, dfk, dv


def _explicit(fq, fk, v, *, causal: bool, eps: float, normalise: bool = True):
    """The explicit $O(N^2)$ form $\\mathrm{diag}(A1+\\epsilon)^{-1}AV$, $A = \\Phi_Q\\Phi_K^\\top$."""
    A = fq @ _mT(fk)
    if causal:
        A = np.tril(A)
    num = A @ v
    if not normalise:
        return num
    return num / (np.sum(A, axis=-1, keepdims=True) + eps)


# --------------------------------------------------------------------------------------------
# Katharopoulos et al.


def _lin_config(eps, feature_map, causal):
    eps = check_positive(eps, "eps", allow_zero=True)
    check_choice(feature_map, "feature_map", FEATURE_MAPS)
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be a bool; got {type(causal).__name__}")
    return eps


def linear_attention_forward(q, k, v, *, causal: bool = False, eps: float = 1e-6,
                             feature_map: str = "elu_plus_one"):
    r"""Linear attention (Katharopoulos et al., "Transformers are RNNs", ICML 2020, arXiv 2006.16236).

    $$o_i = \frac{\phi(q_i)^\top\sum_j\phi(k_j)v_j^\top}{\phi(q_i)^\top\sum_j\phi(k_j)+\epsilon},$$

    sums over $j\le i$ when ``causal`` (a prefix-state scan, :func:`causal_linear_attention_forward`).
    No $1/\sqrt d$ scaling. Follows idiap/fast-transformers
    ``fast_transformers/attention/linear_attention.py`` (``Z = 1/(Q·K.sum + eps)``, eps 1e-6) and
    ``causal_linear_attention.py`` (``K.cumsum`` denominator, ``causal_dot_product`` numerator).

    Parameters
    ----------
    q : (..., N, d); k : (..., M, d); v : (..., M, dv)
        Equal leading axes. ``causal`` needs ``M == N``.
    causal : bool
        Prefix sums over $j\le i$.
    eps : float >= 0
        Added to the denominator (fast-transformers default 1e-6).
    feature_map : {"elu_plus_one", "identity"}
        $\phi$; ``"identity"`` takes ``q``/``k`` as ready (non-negative) features.

    Returns
    -------
    out : (..., N, dv), cache

    Backward: the feature-space core of the module docstring, then the ELU+1 VJP
    $\phi'(x) = 1$ ($x>0$) or $e^x$.
    """
    eps = _lin_config(eps, feature_map, causal)
    q, k, v = _validate_qkv(q, k, v, same_length=bool(causal))
    fq = feature_map_forward(q, feature_map)
    fk = feature_map_forward(k, feature_map)
    out, state = _core_forward(fq, fk, v, causal=bool(causal), eps=eps, normalise=True)
    cache = {"q": q, "k": k, "v": v, "fq": fq, "fk": fk, "out": out, "state": state,
             "causal": bool(causal), "feature_map": feature_map, "eps": eps}
    return out, cache


def linear_attention_backward(dout, cache):
    r"""Gradients ``{"q", "k", "v"}`` of :func:`linear_attention_forward` (core VJP of the module
    docstring — quotient rule on the denominator; reverse scans when causal — then the feature-map
    VJP)."""
    out = cache["out"]
    g = _check_dout(dout, out.shape, out.dtype)
    dfq, dfk, dv = _core_backward(g, cache["fq"], cache["fk"], cache["v"], out, cache["state"],
                                  causal=cache["causal"], normalise=True)
    fm = cache["feature_map"]
    return {"q": feature_map_backward(dfq, cache["q"], fm),
            "k": feature_map_backward(dfk, cache["k"], fm), "v": dv}


def linear_attention(q, k, v, *, causal: bool = False, eps: float = 1e-6,
                     feature_map: str = "elu_plus_one") -> np.ndarray:
    """Convenience wrapper: the output of :func:`linear_attention_forward`."""
    return linear_attention_forward(q, k, v, causal=causal, eps=eps, feature_map=feature_map)[0]


def causal_linear_attention_forward(q, k, v, *, eps: float = 1e-6, feature_map: str = "elu_plus_one"):
    r"""Causal linear attention as a prefix-state scan (stable signature; kernels mirror it).

    $S_i = S_{i-1} + \phi(k_i)v_i^\top$, $z_i = z_{i-1} + \phi(k_i)$,
    $o_i = \phi(q_i)^\top S_i/(\phi(q_i)^\top z_i + \epsilon)$.
    Layouts ``q, k (B, H, N, d)``, ``v (B, H, N, dv)`` (any leading axes). Memory: one
    $d\times d_v$ state per head; the cache holds the inputs, the features and the $N$
    denominators only.
    """
    return linear_attention_forward(q, k, v, causal=True, eps=eps, feature_map=feature_map)


def causal_linear_attention_backward(dout, cache):
    r"""Reverse-scan backward of :func:`causal_linear_attention_forward`: a forward scan rebuilds
    $S_i, z_i$ for $d\phi(q_i) = S_iu_i + c_iz_i$; a reverse scan accumulates
    $R_j = \sum_{i\ge j}\phi(q_i)u_i^\top$, $r_j = \sum_{i\ge j}c_i\phi(q_i)$ for
    $d\phi(k_j) = R_jv_j + r_j$, $dv_j = R_j^\top\phi(k_j)$ ($u_i = g_i/\mathrm{den}_i$,
    $c_i = -g_i\cdot o_i/\mathrm{den}_i$). Returns ``{"q", "k", "v"}``."""
    return linear_attention_backward(dout, cache)


def linear_attention_explicit(q, k, v, *, causal: bool = False, eps: float = 1e-6,
                              feature_map: str = "elu_plus_one") -> np.ndarray:
    r"""The explicit $O(N^2)$ form: $A = \phi(Q)\phi(K)^\top$ (lower-triangular if causal),
    $O = AV/(A\mathbf 1+\epsilon)$."""
    eps = _lin_config(eps, feature_map, causal)
    q, k, v = _validate_qkv(q, k, v, same_length=bool(causal))
    return _explicit(feature_map_forward(q, feature_map), feature_map_forward(k, feature_map), v,
                     causal=bool(causal), eps=eps)


# --------------------------------------------------------------------------------------------
# Generic sampling / checking helpers


def _qkv(rng, size, *, same_length=True, d=None, dv=None):
    if size == "tiny":
        n = int(rng.integers(3, 6))
        m = n if same_length else int(rng.integers(3, 6))
        d = d or 3
        dv = dv or 2
        shape = (2, 2)
    else:
        n = int(rng.integers(9, 17))
        m = n if same_length else int(rng.integers(7, 15))
        d = d or 5
        dv = dv or 4
        shape = (2, 3)
    q = rng.standard_normal(shape + (n, d))
    k = rng.standard_normal(shape + (m, d))
    v = rng.standard_normal(shape + (m, dv))
    return q, k, v


def _fd(forward, backward, sample):
    from ..testing import gradcheck  # lazy: testing imports the registry

    return gradcheck(forward, backward, sample).max_rel


def _sample_katharopoulos(rng, size):
    q, k, v = _qkv(rng, size)
    return Sample(inputs={"q": q, "k": k, "v": v},
                  config={"causal": bool(rng.integers(0, 2)), "eps": 1e-6, "feature_map": "elu_plus_one"})


def _check_causal_equals_masked(rng):
    q, k, v = _qkv(rng, "small")
    a = linear_attention(q, k, v, causal=True)
    b = linear_attention_explicit(q, k, v, causal=True)
    err = float(np.max(np.abs(a - b)))
    assert err < 1e-12, f"causal scan differs from the masked explicit form by {err}"
    return err


def _check_linear_equals_explicit(rng):
    q, k, v = _qkv(rng, "small", same_length=False)
    a = linear_attention(q, k, v)
    b = linear_attention_explicit(q, k, v)
    err = float(np.max(np.abs(a - b)))
    assert err < 1e-12, f"linear form differs from the explicit form by {err}"
    return err


def _check_rnn_equals_scan(rng):
    """Step-by-step recurrent evaluation (one token at a time, as in decoding) == the scan."""
    q, k, v = _qkv(rng, "small")
    full = linear_attention(q, k, v, causal=True)
    fq, fk = feature_map_forward(q, "elu_plus_one"), feature_map_forward(k, "elu_plus_one")
    S = np.zeros(q.shape[:-2] + (q.shape[-1], v.shape[-1]))
    z = np.zeros(q.shape[:-2] + (q.shape[-1],))
    err = 0.0
    for i in range(q.shape[-2]):
        S += np.einsum("...d,...e->...de", fk[..., i, :], v[..., i, :])
        z += fk[..., i, :]
        o = np.einsum("...d,...de->...e", fq[..., i, :], S) / (
            np.einsum("...d,...d->...", fq[..., i, :], z)[..., None] + 1e-6)
        err = max(err, float(np.max(np.abs(o - full[..., i, :]))))
    assert err < 1e-12, f"recurrent evaluation differs from the scan by {err}"
    return err


def _check_fd_both_modes(rng):
    errs = []
    for causal in (False, True):
        q, k, v = _qkv(rng, "tiny")
        s = Sample(inputs={"q": q, "k": k, "v": v}, config={"causal": causal})
        errs.append(_fd(linear_attention_forward, linear_attention_backward, s))
    return max(errs)


def _check_rows_are_convex(rng):
    """eps = 0: the explicit weights are non-negative with rows summing to 1, so each output is a
    convex combination of values."""
    q, k, v = _qkv(rng, "small")
    fq, fk = feature_map_forward(q, "elu_plus_one"), feature_map_forward(k, "elu_plus_one")
    A = fq @ _mT(fk)
    P = A / A.sum(-1, keepdims=True)
    assert (P >= 0).all()
    err = float(np.max(np.abs(P.sum(-1) - 1)))
    o = linear_attention(q, k, v, eps=0.0)
    err = max(err, float(np.max(np.abs(o - P @ v))))
    assert err < 1e-12
    return err


# --------------------------------------------------------------------------------------------
# Efficient Attention (Shen et al.)


def efficient_attention_forward(q, k, v, *, normalization: str = "softmax"):
    r"""Efficient Attention (Shen, Zhang, Zhao, Yi, Li, WACV 2021, arXiv 1812.01243).

    $$E = \rho_q(Q)\,\big(\rho_k(K)^\top V\big)$$

    ``normalization="softmax"``: $\rho_q$ = softmax over the $d$ features of each query row,
    $\rho_k$ = softmax over the $M$ positions of each key column (cmsflash/efficient-attention
    ``efficient_attention.py``: ``keys.softmax(dim=2)`` over positions, ``queries.softmax(dim=1)``
    over channels, in its ``(n, c, h*w)`` layout; scaomath/galerkin-transformer ``'linear'``
    type). ``"scaling"``: $\rho_q(Y)=\rho_k(Y)=Y/\sqrt M$, i.e. exactly $(QK^\top/M)V$.
    No extra normaliser, no $1/\sqrt d$. Cost $O(Md\,d_v)$; non-causal.

    Backward: $dS = \rho_q^\top G$, $d\rho_q = G S^\top$, $d\rho_k = V\,dS^\top$,
    $dV = \rho_k\,dS$ ($S = \rho_k^\top V$), then two softmax VJPs
    $dx = p\odot(dp - \sum p\odot dp)$ along different axes (features for $Q$, positions for $K$).
    """
    check_choice(normalization, "normalization", ("softmax", "scaling"))
    q, k, v = _validate_qkv(q, k, v)
    if normalization == "softmax":
        rq, _ = softmax_lse(q, axis=-1)
        rk, _ = softmax_lse(k, axis=-2)
    else:
        c = 1.0 / np.sqrt(k.shape[-2])
        rq, rk = q * c, k * c
    S = _mT(rk) @ v
    out = rq @ S
    return out, {"rq": rq, "rk": rk, "v": v, "S": S, "norm": normalization, "out_shape": out.shape}


def efficient_attention_backward(dout, cache):
    r"""Gradients ``{"q", "k", "v"}`` of :func:`efficient_attention_forward` (see its docstring)."""
    rq, rk, v, S = cache["rq"], cache["rk"], cache["v"], cache["S"]
    g = _check_dout(dout, cache["out_shape"], rq.dtype)
    drq = g @ _mT(S)
    dS = _mT(rq) @ g
    drk = v @ _mT(dS)
    dv = rk @ dS
    if cache["norm"] == "softmax":
        dq = softmax_vjp(rq, drq, axis=-1)
        dk = softmax_vjp(rk, drk, axis=-2)
    else:
        c = 1.0 / np.sqrt(rk.shape[-2])
        dq, dk = drq * c, drk * c
    return {"q": dq, "k": dk, "v": dv}


def efficient_attention(q, k, v, *, normalization: str = "softmax") -> np.ndarray:
    """Convenience wrapper: the output of :func:`efficient_attention_forward`."""
    return efficient_attention_forward(q, k, v, normalization=normalization)[0]


def _efficient_reference(q, k, v, *, normalization="softmax"):
    q, k, v = _validate_qkv(q, k, v)
    if normalization == "scaling":
        return (q @ _mT(k) / k.shape[-2]) @ v
    rq = np.exp(q - q.max(-1, keepdims=True))
    rq /= rq.sum(-1, keepdims=True)
    rk = np.exp(k - k.max(-2, keepdims=True))
    rk /= rk.sum(-2, keepdims=True)
    return (rq @ _mT(rk)) @ v


def _sample_efficient(rng, size):
    q, k, v = _qkv(rng, size, same_length=False)
    return Sample(inputs={"q": q, "k": k, "v": v},
                  config={"normalization": "softmax" if rng.random() < 0.7 else "scaling"})


def _check_efficient_scaling_dense(rng):
    q, k, v = _qkv(rng, "small", same_length=False)
    a = efficient_attention(q, k, v, normalization="scaling")
    b = (q @ _mT(k) / k.shape[-2]) @ v
    err = float(np.max(np.abs(a - b)))
    assert err < 1e-12
    return err


def _check_efficient_fd_both(rng):
    errs = []
    for norm in ("softmax", "scaling"):
        q, k, v = _qkv(rng, "tiny", same_length=False)
        s = Sample(inputs={"q": q, "k": k, "v": v}, config={"normalization": norm})
        errs.append(_fd(efficient_attention_forward, efficient_attention_backward, s))
    return max(errs)


register(
    Mechanism(
        slug="linear_attention_katharopoulos", family="4-linear-kernel-sparse", tier="T1",
        title="Linear attention (Transformers are RNNs), non-causal and causal prefix-state scan",
        paper="Katharopoulos, Vyas, Pappas, Fleuret, 'Transformers are RNNs: Fast Autoregressive "
              "Transformers with Linear Attention', ICML 2020, arXiv 2006.16236",
        forward=linear_attention_forward, backward=linear_attention_backward,
        sample=_sample_katharopoulos, reference=linear_attention_explicit,
        checks={"causal_scan_equals_masked_explicit": _check_causal_equals_masked,
                "linear_equals_explicit_cross": _check_linear_equals_explicit,
                "recurrent_equals_scan": _check_rnn_equals_scan,
                "gradcheck_causal_and_noncausal": _check_fd_both_modes,
                "weights_convex_eps0": _check_rows_are_convex},
        docs="linear-attention.md#linear-attention-katharopoulos",
    ),
    Mechanism(
        slug="efficient_attention_shen", family="4-linear-kernel-sparse", tier="T1",
        title="Efficient Attention: softmax over query features and over key positions",
        paper="Shen, Zhang, Zhao, Yi, Li, 'Efficient Attention: Attention with Linear Complexities', "
              "WACV 2021, arXiv 1812.01243",
        forward=efficient_attention_forward, backward=efficient_attention_backward,
        sample=_sample_efficient, reference=_efficient_reference,
        checks={"scaling_variant_equals_dense_QKt_over_n": _check_efficient_scaling_dense,
                "gradcheck_both_normalizations": _check_efficient_fd_both},
        docs="linear-attention.md#efficient-attention-shen",
    ),
)
