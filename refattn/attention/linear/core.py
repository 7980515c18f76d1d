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

from ..._checks import as_dout, as_float, check_choice, check_dim, check_int, check_params, check_positive, compute_dtype
from ...kernels import backward_kernel, forward_kernel
from ...nn.activations import elu_plus_one, elu_plus_one_grad
from ...nn.norms import layer_norm_backward, layer_norm_forward, rms_norm_backward, rms_norm_forward
from ...nn.softmax import softmax_lse, softmax_vjp
from ...registry import Mechanism, Sample, register
from ..softmax.core import sum_to_shape

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
    "performer_projection_matrix",
    "performer_features_forward",
    "performer_features_backward",
    "performer_forward",
    "performer_backward",
    "performer",
    "transnormer_forward",
    "transnormer_backward",
    "transnormer",
    "diag_attention_forward",
    "diag_attention_backward",
    "toeplitz_matvec_fft",
    "toeplitz_correlation_fft",
    "toeplitz_dense",
    "kernelized_rpe_forward",
    "kernelized_rpe_backward",
    "kernelized_rpe",
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
    return elu_plus_one(x)


def feature_map_backward(dphi: np.ndarray, x: np.ndarray, feature_map: str) -> np.ndarray:
    r"""VJP of :func:`feature_map_forward`: $\phi'(x) = 1$ for $x>0$, $e^x$ otherwise (ELU+1 is
    $C^1$ at 0, so FD checks are valid everywhere)."""
    if feature_map == "identity":
        return dphi
    return dphi * elu_plus_one_grad(x)


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
                den = np.where(np.abs(den) <= den_guard, den + 2.0 * den_guard, den)  # keeps the dtype
            den = np.where(den == 0, 1.0, den)  # no key at all (padding, eps = 0): num = 0, out = 0
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
                di = np.where(np.abs(di) <= den_guard, di + 2.0 * den_guard, di)
            di = np.where(di == 0, 1.0, di)
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


def _key_mask(mask, k):
    """Validate a boolean key-padding mask (True = keep) broadcastable to ``k.shape[:-1]``."""
    if mask is None:
        return None
    try:
        m = np.asarray(mask)
    except Exception as exc:  # noqa: BLE001
        raise TypeError(f"key_padding_mask could not be converted to an array: {exc}") from None
    if m.dtype != np.bool_:
        raise TypeError(f"key_padding_mask must be boolean (True = keep the key); got dtype {m.dtype}")
    try:
        ok = np.broadcast_shapes(m.shape, k.shape[:-1]) == k.shape[:-1]
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"key_padding_mask of shape {m.shape} does not broadcast to k's (..., M) = {k.shape[:-1]}")
    return m


def _lin_config(eps, feature_map, causal):
    eps = check_positive(eps, "eps", allow_zero=True)
    check_choice(feature_map, "feature_map", FEATURE_MAPS)
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be a bool; got {type(causal).__name__}")
    return eps


def linear_attention_forward(q, k, v, *, causal: bool = False, eps: float = 1e-6,
                             feature_map: str = "elu_plus_one", key_padding_mask=None,
                             normalise: bool = True):
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
    key_padding_mask : bool array broadcastable to ``(..., M)``, optional
        ``True`` keeps a key; a removed key gets $\phi(k_j) = 0$ and so leaves both the
        numerator and the denominator (fast-transformers' ``key_lengths``:
        ``K = K * key_lengths.float_matrix``). A query that sees no key outputs 0 (with
        ``eps = 0`` too).
    normalise : bool
        ``False`` drops the denominator: $o_i = \phi(q_i)^\top\sum_j\phi(k_j)v_j^\top$ (the
        un-normalised form TransNormer builds on; ``eps`` is then unused). fast-transformers
        always normalises (default True).

    Returns
    -------
    out : (..., N, dv), cache

    Notes
    -----
    Backward: the feature-space core of the module docstring, then the ELU+1 VJP
    $\phi'(x) = 1$ ($x>0$) or $e^x$.
    """
    eps = _lin_config(eps, feature_map, causal)
    q, k, v = _validate_qkv(q, k, v, same_length=bool(causal))
    kmask = _key_mask(key_padding_mask, k)
    fq = feature_map_forward(q, feature_map)
    fk = feature_map_forward(k, feature_map)
    if kmask is not None:
        fk = fk * kmask[..., None]
    if not isinstance(normalise, (bool, np.bool_)):
        raise TypeError(f"normalise must be a bool; got {type(normalise).__name__}")
    out, state = _core_forward(fq, fk, v, causal=bool(causal), eps=eps, normalise=bool(normalise))
    cache = {"q": q, "k": k, "v": v, "fq": fq, "fk": fk, "out": out, "state": state, "kmask": kmask,
             "causal": bool(causal), "feature_map": feature_map, "eps": eps, "normalise": bool(normalise)}
    return out, cache


def linear_attention_backward(dout, cache):
    r"""Gradients ``{"q", "k", "v"}`` of :func:`linear_attention_forward` (core VJP of the module
    docstring — quotient rule on the denominator; reverse scans when causal — then the feature-map
    VJP)."""
    out = cache["out"]
    g = as_dout(dout, out.shape, out.dtype)
    dfq, dfk, dv = _core_backward(g, cache["fq"], cache["fk"], cache["v"], out, cache["state"],
                                  causal=cache["causal"], normalise=cache.get("normalise", True))
    fm = cache["feature_map"]
    if cache.get("kmask") is not None:
        dfk = dfk * cache["kmask"][..., None]
    return {"q": feature_map_backward(dfq, cache["q"], fm),
            "k": feature_map_backward(dfk, cache["k"], fm), "v": dv}


def linear_attention(q, k, v, *, causal: bool = False, eps: float = 1e-6,
                     feature_map: str = "elu_plus_one", key_padding_mask=None, normalise: bool = True) -> np.ndarray:
    """Convenience wrapper: the output of :func:`linear_attention_forward`."""
    return linear_attention_forward(q, k, v, causal=causal, eps=eps, feature_map=feature_map,
                                    key_padding_mask=key_padding_mask, normalise=normalise)[0]


def causal_linear_attention_forward(q, k, v, *, eps: float = 1e-6, feature_map: str = "elu_plus_one",
                                    backend: str = "numpy"):
    r"""Causal linear attention as a prefix-state scan (stable signature; kernels mirror it).

    $S_i = S_{i-1} + \phi(k_i)v_i^\top$, $z_i = z_{i-1} + \phi(k_i)$,
    $o_i = \phi(q_i)^\top S_i/(\phi(q_i)^\top z_i + \epsilon)$.
    Layouts ``q, k (B, H, N, d)``, ``v (B, H, N, dv)`` (any leading axes). Memory: one
    $d\times d_v$ state per head; the cache holds the inputs, the features and the $N$
    denominators only.

    ``backend="numba"``/``"cuda"`` runs the scan kernel of ``refattn.kernels.cpu.linear`` /
    ``refattn.kernels.cuda.linear`` instead; :func:`causal_linear_attention_backward` follows the
    backend recorded in the cache.
    """
    kernel = forward_kernel(backend, "linear", "causal_linear_attention_forward")
    if kernel is not None:
        return kernel(q, k, v, eps=eps, feature_map=feature_map)
    return linear_attention_forward(q, k, v, causal=True, eps=eps, feature_map=feature_map)


def causal_linear_attention_backward(dout, cache):
    r"""Reverse-scan backward of :func:`causal_linear_attention_forward`: a forward scan rebuilds
    $S_i, z_i$ for $d\phi(q_i) = S_iu_i + c_iz_i$; a reverse scan accumulates
    $R_j = \sum_{i\ge j}\phi(q_i)u_i^\top$, $r_j = \sum_{i\ge j}c_i\phi(q_i)$ for
    $d\phi(k_j) = R_jv_j + r_j$, $dv_j = R_j^\top\phi(k_j)$ ($u_i = g_i/\mathrm{den}_i$,
    $c_i = -g_i\cdot o_i/\mathrm{den}_i$). Returns ``{"q", "k", "v"}``."""
    kernel = backward_kernel(cache, "linear", "causal_linear_attention_backward")
    if kernel is not None:
        return kernel(dout, cache)
    return linear_attention_backward(dout, cache)


def linear_attention_explicit(q, k, v, *, causal: bool = False, eps: float = 1e-6,
                              feature_map: str = "elu_plus_one", key_padding_mask=None,
                              normalise: bool = True) -> np.ndarray:
    r"""The explicit $O(N^2)$ form: $A = \phi(Q)\phi(K)^\top$ (lower-triangular if causal, zero
    columns for padded keys), $O = AV/(A\mathbf 1+\epsilon)$ (0 for a row without keys)."""
    eps = _lin_config(eps, feature_map, causal)
    q, k, v = _validate_qkv(q, k, v, same_length=bool(causal))
    kmask = _key_mask(key_padding_mask, k)
    A = feature_map_forward(q, feature_map) @ _mT(feature_map_forward(k, feature_map))
    if kmask is not None:
        A = A * kmask[..., None, :]
    if causal:
        A = np.tril(A)
    if not normalise:
        return A @ v
    den = A.sum(-1, keepdims=True) + eps
    return (A @ v) / np.where(den == 0, 1.0, den)


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
    from ...testing import gradcheck  # lazy: testing imports the registry

    return gradcheck(forward, backward, sample).max_rel


def _sample_katharopoulos(rng, size):
    q, k, v = _qkv(rng, size)
    config = {"causal": bool(rng.integers(0, 2)), "eps": 1e-6, "feature_map": "elu_plus_one"}
    if rng.random() < 0.5:  # per-batch key padding (lengths), the first key always kept
        lengths = rng.integers(1, k.shape[-2] + 1, size=k.shape[0])
        config["key_padding_mask"] = np.arange(k.shape[-2])[None, :] < lengths[:, None]
        config["key_padding_mask"] = config["key_padding_mask"][:, None, :]  # (B, 1, M)
    return Sample(inputs={"q": q, "k": k, "v": v}, config=config)


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
        for padded, normalise in ((False, True), (True, True), (True, False)):
            q, k, v = _qkv(rng, "tiny")
            config = {"causal": causal, "normalise": normalise}
            if padded:  # batch 0 keeps 2 keys, batch 1 all
                keep = np.ones(k.shape[:-1], dtype=bool)
                keep[0, :, 2:] = False
                config["key_padding_mask"] = keep
            s = Sample(inputs={"q": q, "k": k, "v": v}, config=config)
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
        c = k.shape[-2] ** -0.5  # a Python float keeps float32
        rq, rk = q * c, k * c
    S = _mT(rk) @ v
    out = rq @ S
    return out, {"rq": rq, "rk": rk, "v": v, "S": S, "norm": normalization, "out_shape": out.shape}


def efficient_attention_backward(dout, cache):
    r"""Gradients ``{"q", "k", "v"}`` of :func:`efficient_attention_forward` (see its docstring)."""
    rq, rk, v, S = cache["rq"], cache["rk"], cache["v"], cache["S"]
    g = as_dout(dout, cache["out_shape"], rq.dtype)
    drq = g @ _mT(S)
    dS = _mT(rq) @ g
    drk = v @ _mT(dS)
    dv = rk @ dS
    if cache["norm"] == "softmax":
        dq = softmax_vjp(rq, drq, axis=-1)
        dk = softmax_vjp(rk, drk, axis=-2)
    else:
        c = rk.shape[-2] ** -0.5
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



# --------------------------------------------------------------------------------------------
# Performer FAVOR+ (positive random features)


def performer_projection_matrix(nb_features: int, dim: int, *, seed: int = 0, scaling: int = 0,
                                orthogonal: bool = True) -> np.ndarray:
    r"""Random projection $W\in\mathbb R^{m\times d}$ for FAVOR+ (deterministic given ``seed``).

    Mirrors google-research ``performer/fast_attention/jax/fast_attention.py``
    ``GaussianOrthogonalRandomMatrix``: stacked blocks, each the transpose of the Q factor of a
    $d\times d$ Gaussian matrix (rows orthonormal within a block, the last block truncated), rows
    then scaled by the norms of an independent Gaussian $m\times d$ matrix (``scaling=0``, so rows
    are marginally $\mathcal N(0, I_d)$-distributed in norm) or by $\sqrt d$ (``scaling=1``).
    ``orthogonal=False`` gives i.i.d. Gaussian rows (``GaussianUnstructuredRandomMatrix``). The
    upstream draws use JAX's PRNG, so values differ.

    Deviation: each Q factor is sign-corrected ($Q\,\mathrm{diag}(\mathrm{sign}\,R_{ii})$, the
    standard recipe for a Haar-random orthogonal matrix). Upstream takes the raw ``qr`` output;
    with LAPACK's Householder convention (``numpy.linalg.qr``) the raw factor is *not* uniformly
    distributed (e.g. the first column's first entry always has the sign opposite to the
    Gaussian's), and the FAVOR+ estimate then stays biased however many features are drawn —
    refattn's ``converges_to_softmax_attention`` check fails without the correction.
    """
    m = check_int(nb_features, "nb_features", minimum=1)
    d = check_int(dim, "dim", minimum=1)
    check_choice(scaling, "scaling", (0, 1))
    rng = np.random.default_rng(check_int(seed, "seed"))
    if not orthogonal:
        return rng.standard_normal((m, d))
    blocks = []
    for _ in range(-(-m // d)):
        qmat, rmat = np.linalg.qr(rng.standard_normal((d, d)))
        # sign-fix so the block is Haar-distributed (LAPACK's Householder QR makes R's diagonal
        # sign depend on the data, which biases the rows; see the docstring)
        blocks.append((qmat * np.where(np.diag(rmat) < 0, -1.0, 1.0)).T)
    w = np.vstack(blocks)[:m]
    mult = np.linalg.norm(rng.standard_normal((m, d)), axis=1) if scaling == 0 else np.full(m, np.sqrt(d))
    return mult[:, None] * w


_KEY_STAB = ("per_head", "global")


def performer_features_forward(x: np.ndarray, projection: np.ndarray, *, is_query: bool,
                               feature_eps: float = 1e-6, normalize_data: bool = True,
                               key_stabilizer: str = "per_head"):
    r"""Positive softmax-kernel features (unvalidated; ``x (..., N, d)``, ``projection (m, d)``).

    $$\phi(x)_l = m^{-1/2}\big(\exp(a\,w_l^\top x - \tfrac{a^2}{2}\|x\|^2 - s) + \varepsilon\big),
    \qquad a = d^{-1/4}\ (\texttt{normalize\_data}),$$

    so that $\mathbb E_w[\phi(q)\cdot\phi(k)] \propto \exp(q\cdot k/\sqrt d)$ (for
    $\varepsilon = 0$). The stabiliser $s$ (google-research
    ``nonnegative_softmax_kernel_feature_creator``): queries, the max of $a\,w_l^\top x$ over the
    $m$ features of each row; keys, the max over all positions and features of each leading index
    (``"per_head"``: per (batch, head), as the JAX code) or over the whole tensor (``"global"``,
    older performer-pytorch ``torch.max(data_dash)``, which couples batch elements).
    Returns ``(phi, cache)``.
    """
    a = x.shape[-1] ** -0.25 if normalize_data else 1.0
    m = projection.shape[0]
    ratio = m ** -0.5
    dd = a * (x @ projection.T)
    diag = (0.5 * a * a) * np.sum(x * x, axis=-1, keepdims=True)
    if is_query:
        axes = (-1,)
    elif key_stabilizer == "per_head":
        axes = (-2, -1)
    else:
        axes = tuple(range(dd.ndim))
    stab = np.max(dd, axis=axes, keepdims=True)
    e = ratio * np.exp(dd - diag - stab)
    return e + ratio * feature_eps, {"x": x, "e": e, "dd": dd, "a": a, "axes": axes, "W": projection}


def performer_features_backward(dphi: np.ndarray, fcache: dict, *, stabilizer_grad: bool = True):
    r"""VJP of :func:`performer_features_forward`.

    With $e_l = m^{-1/2}\exp(h_l - s)$, $h_l = a\,w_l^\top x - \tfrac{a^2}{2}\|x\|^2$:
    $\partial e_l/\partial x = e_l\,(a\,w_l - a^2x) - e_l\,\partial s/\partial x$, so with
    $\gamma = \partial L/\partial\phi\odot e$:

    $$dx = a\,\gamma W - a^2\,x\textstyle\sum_l\gamma_l - a\,\Big(\sum_{\text{stab group}}\gamma\Big)\,
    w_{l^*}\ \text{at the arg-max row}.$$

    The last term is the (sub)gradient of the max stabiliser, which lands on the arg-max entry
    $(n^*, l^*)$ of its group ($\partial s/\partial x_{n^*} = a\,w_{l^*}$). ``stabilizer_grad``:
    True differentiates through the max like the JAX code (no ``stop_gradient`` there); False
    treats $s$ as a constant (performer-pytorch ``.detach()``). The two agree exactly when
    ``feature_eps = 0`` and no denominator guard fires, because $s$ then cancels in the attention
    ratio.
    """
    x, e, a, W, axes = fcache["x"], fcache["e"], fcache["a"], fcache["W"], fcache["axes"]
    ge = dphi * e
    dx = a * (ge @ W) - (a * a) * x * np.sum(ge, axis=-1, keepdims=True)
    if stabilizer_grad:
        dd = fcache["dd"]
        lead = dd.shape[: dd.ndim - len(axes)]
        flat = dd.reshape(lead + (-1,))
        onehot = np.zeros_like(flat)
        np.put_along_axis(onehot, np.argmax(flat, axis=-1)[..., None], 1.0, axis=-1)
        onehot = onehot.reshape(dd.shape)
        tot = np.sum(ge, axis=axes, keepdims=True)
        dx = dx - a * ((onehot * tot) @ W)
    return dx


def _performer_config(projection, d, dtype, feature_eps, denominator_guard, key_stabilizer, causal,
                      normalize_data, stabilizer_grad):
    projection = as_float(projection, "projection", ndim=2)
    if projection.shape[1] != d:
        raise ValueError(f"projection must have shape (nb_features, d={d}); got {projection.shape}")
    feature_eps = check_positive(feature_eps, "feature_eps", allow_zero=True)
    denominator_guard = check_positive(denominator_guard, "denominator_guard", allow_zero=True)
    check_choice(key_stabilizer, "key_stabilizer", _KEY_STAB)
    for name, val in (("causal", causal), ("normalize_data", normalize_data),
                      ("stabilizer_grad", stabilizer_grad)):
        if not isinstance(val, (bool, np.bool_)):
            raise TypeError(f"{name} must be a bool; got {type(val).__name__}")
    return projection.astype(dtype, copy=False), feature_eps, denominator_guard


def performer_forward(q, k, v, *, projection, causal: bool = False, feature_eps: float = 1e-6,
                      denominator_guard: float = 1e-6, normalize_data: bool = True,
                      key_stabilizer: str = "per_head", stabilizer_grad: bool = True):
    r"""Performer FAVOR+ softmax-kernel attention (Choromanski et al., ICLR 2021, arXiv 2009.14794).

    $O = \Phi_Q(\Phi_K^\top V)\oslash\Phi_Q(\Phi_K^\top\mathbf 1)$ (prefix sums when causal) with
    the positive random features of :func:`performer_features_forward`; it estimates
    $\mathrm{softmax}(QK^\top/\sqrt d)V$. Follows google-research
    ``performer/fast_attention/jax/fast_attention.py`` (``FastAttentionviaLowRankDecomposition``).

    Parameters
    ----------
    q (..., N, d), k (..., M, d), v (..., M, dv)
    projection : (m, d) array, config
        The random features $W$ (not differentiated; draw it once, e.g. with
        :func:`performer_projection_matrix`; upstream redraws are a training-time choice).
    causal : bool
        Prefix sums (``unidirectional``).
    feature_eps : float
        Added inside each feature (JAX ``numerical_stabilizer`` = 1e-6 via
        ``make_fast_softmax_attention``; the creator's own default and performer-pytorch use 1e-4).
    denominator_guard : float
        JAX: ``R + 2*s*(|R| <= s)`` with ``s = numerical_stabilizer`` (1e-6); performer-pytorch:
        none (0). Piecewise constant, so it has no gradient.
    normalize_data : bool
        Pre-scale by $d^{-1/4}$ (the $1/\sqrt d$ softmax temperature).
    key_stabilizer : {"per_head", "global"}
        See :func:`performer_features_forward`.
    stabilizer_grad : bool
        Differentiate through the max stabilisers (JAX, default) or stop-gradient
        (performer-pytorch ``detach``); see :func:`performer_features_backward`.

    Notes
    -----
    Backward: the feature-space linear-attention core (quotient rule; scans when causal), then
    :func:`performer_features_backward` for $Q$ and $K$.
    """
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be a bool; got {type(causal).__name__}")
    q, k, v = _validate_qkv(q, k, v, same_length=bool(causal))
    projection, feature_eps, guard = _performer_config(
        projection, q.shape[-1], q.dtype, feature_eps, denominator_guard, key_stabilizer, causal,
        normalize_data, stabilizer_grad)
    fq, cq = performer_features_forward(q, projection, is_query=True, feature_eps=feature_eps,
                                        normalize_data=bool(normalize_data), key_stabilizer=key_stabilizer)
    fk, ck = performer_features_forward(k, projection, is_query=False, feature_eps=feature_eps,
                                        normalize_data=bool(normalize_data), key_stabilizer=key_stabilizer)
    out, state = _core_forward(fq, fk, v, causal=bool(causal), eps=0.0, normalise=True, den_guard=guard)
    return out, {"fq": fq, "fk": fk, "cq": cq, "ck": ck, "v": v, "out": out, "state": state,
                 "causal": bool(causal), "stabilizer_grad": bool(stabilizer_grad)}


def performer_backward(dout, cache):
    r"""Gradients ``{"q", "k", "v"}`` of :func:`performer_forward`: core VJP, then the positive
    feature VJP $\partial\phi_l/\partial x = e_l(a w_l - a^2 x)$ minus the stabiliser term."""
    out = cache["out"]
    g = as_dout(dout, out.shape, out.dtype)
    dfq, dfk, dv = _core_backward(g, cache["fq"], cache["fk"], cache["v"], out, cache["state"],
                                  causal=cache["causal"], normalise=True)
    sg = cache["stabilizer_grad"]
    return {"q": performer_features_backward(dfq, cache["cq"], stabilizer_grad=sg),
            "k": performer_features_backward(dfk, cache["ck"], stabilizer_grad=sg), "v": dv}


def performer(q, k, v, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`performer_forward`."""
    return performer_forward(q, k, v, **config)[0]


def _performer_reference(q, k, v, *, projection, causal=False, feature_eps=1e-6, denominator_guard=1e-6,
                         normalize_data=True, key_stabilizer="per_head", stabilizer_grad=True):
    q, k, v = _validate_qkv(q, k, v, same_length=causal)
    fq, _ = performer_features_forward(q, projection, is_query=True, feature_eps=feature_eps,
                                       normalize_data=normalize_data, key_stabilizer=key_stabilizer)
    fk, _ = performer_features_forward(k, projection, is_query=False, feature_eps=feature_eps,
                                       normalize_data=normalize_data, key_stabilizer=key_stabilizer)
    A = fq @ _mT(fk)
    if causal:
        A = np.tril(A)
    den = A.sum(-1, keepdims=True)
    den = den + 2 * denominator_guard * (np.abs(den) <= denominator_guard)
    return (A @ v) / den


def _sample_performer(rng, size):
    q, k, v = _qkv(rng, size, same_length=True)
    m = 6 if size == "tiny" else 16
    proj = performer_projection_matrix(m, q.shape[-1], seed=int(rng.integers(0, 2**31)))
    return Sample(inputs={"q": q * 0.7, "k": k * 0.7, "v": v},
                  config={"projection": proj, "causal": bool(rng.integers(0, 2))})


def _softmax_attention(q, k, v):
    s = q @ _mT(k) / np.sqrt(q.shape[-1])
    p, _ = softmax_lse(s, axis=-1)
    return p @ v


def _check_performer_converges(rng):
    """Fixed-seed statistical bound: the FAVOR+ estimate approaches softmax attention as the number
    of features grows (error at m = 16384 below 0.03 and below a fifth of the error at m = 16).
    Inputs and projections use their own fixed seeds, so the bound is deterministic."""
    rng = np.random.default_rng(2024)
    q = rng.standard_normal((2, 2, 8, 4)) * 0.5
    k = rng.standard_normal((2, 2, 8, 4)) * 0.5
    v = rng.standard_normal((2, 2, 8, 3))
    exact = _softmax_attention(q, k, v)
    errs = {}
    for m in (16, 16384):
        proj = performer_projection_matrix(m, 4, seed=1234)
        errs[m] = float(np.max(np.abs(performer(q, k, v, projection=proj, feature_eps=0.0) - exact)))
    assert errs[16384] < 0.03 and errs[16384] < errs[16] / 5, f"no convergence to softmax attention: {errs}"
    return errs[16384]


def _check_performer_unbiased(rng):
    """Monte-Carlo unbiasedness (fixed seeds): with i.i.d. Gaussian rows and feature_eps = 0,
    phi(q).phi(k) times exp(s_q + s_k) (undoing the stabilisers) estimates exp(q.k/sqrt d); the
    estimate must lie within 4 standard errors of the exact kernel, the standard error below 2%."""
    rng = np.random.default_rng(7)
    d, m = 4, 200_000
    q = 0.6 * rng.standard_normal((1, 1, d))
    k = 0.6 * rng.standard_normal((1, 1, d))
    w = performer_projection_matrix(m, d, seed=99, orthogonal=False)
    fq, cq = performer_features_forward(q, w, is_query=True, feature_eps=0.0)
    fk, ck = performer_features_forward(k, w, is_query=False, feature_eps=0.0)
    terms = m * fq[0, 0] * fk[0, 0] * np.exp(cq["dd"].max() + ck["dd"].max())
    est, se = terms.mean(), terms.std() / np.sqrt(m)
    exact = float(np.exp(np.sum(q * k) / np.sqrt(d)))
    assert se < 0.02 * exact and abs(est - exact) < 4 * se, (est, exact, se)
    return abs(est - exact) / exact


def _check_performer_stabilizers_cancel(rng):
    """feature_eps = 0, no guard: outputs invariant to the stabiliser choice, and the stop-gradient
    backward equals the full one (the max shifts cancel in the ratio)."""
    q, k, v = _qkv(rng, "small")
    proj = performer_projection_matrix(8, q.shape[-1], seed=5)
    kw = {"projection": proj, "feature_eps": 0.0, "denominator_guard": 0.0}
    o1, c1 = performer_forward(q, k, v, key_stabilizer="per_head", **kw)
    o2, _ = performer_forward(q, k, v, key_stabilizer="global", **kw)
    _, c3 = performer_forward(q, k, v, key_stabilizer="per_head", stabilizer_grad=False, **kw)
    g = rng.standard_normal(o1.shape)
    g1, g3 = performer_backward(g, c1), performer_backward(g, c3)
    err = max(float(np.max(np.abs(o1 - o2))), *(float(np.max(np.abs(g1[n] - g3[n]))) for n in g1))
    assert err < 1e-10, f"stabilisers do not cancel: {err}"
    return err


def _check_performer_fd_variants(rng):
    errs = []
    for causal, stab in ((False, "global"), (True, "per_head"), (False, "per_head")):
        q, k, v = _qkv(rng, "tiny")
        proj = performer_projection_matrix(5, q.shape[-1], seed=3)
        s = Sample(inputs={"q": q, "k": k, "v": v},
                   config={"projection": proj, "causal": causal, "key_stabilizer": stab, "feature_eps": 1e-3})
        errs.append(_fd(performer_forward, performer_backward, s))
    return max(errs)


def _check_projection_orthogonal(rng):
    w = performer_projection_matrix(10, 4, seed=int(rng.integers(0, 1000)))
    u = w / np.linalg.norm(w, axis=1, keepdims=True)
    err = 0.0
    for start in range(0, 10, 4):
        blk = u[start:start + 4]
        err = max(err, float(np.max(np.abs(blk @ blk.T - np.eye(len(blk))))))
    assert err < 1e-12, f"blocks are not orthogonal: {err}"
    return err


# --------------------------------------------------------------------------------------------
# TransNormer: NormAttention and DiagAttention


_NORMS = {"layernorm": (layer_norm_forward, layer_norm_backward, ("weight", "bias")),
          "rmsnorm": (rms_norm_forward, rms_norm_backward, ("weight",))}


def transnormer_forward(q, k, v, params=None, *, causal: bool = False, feature_map: str = "elu_plus_one",
                        norm: str = "layernorm", norm_over: str = "concat_heads", norm_eps: float = 1e-5):
    r"""TransNormer NormAttention (Qin et al., "The Devil in Linear Transformer", EMNLP 2022,
    arXiv 2210.10340): linear attention **without** the row-sum denominator, followed by a norm,

    $$O = \mathrm{Norm}\big(\phi(Q)(\phi(K)^\top V)\big),\qquad
    O_i = \mathrm{Norm}\Big(\phi(q_i)^\top\sum_{j\le i}\phi(k_j)v_j^\top\Big)\ \text{(causal)}.$$

    Upstream: the ``NormLinearAttention`` module of the authors' fairseq fork
    (OpenNLPLab/fairseq-evo, referenced by OpenNLPLab/Transnormer): ``q = act(q_proj(x))``,
    ``k = act(k_proj(x))``, ``o1 = k^T v``, ``output = q o1`` (causal: masked ``q k^T`` then
    ``@ v``), heads concatenated, then ``layer_norm`` over the full ``embed_dim`` and
    ``out_proj``. Projections are outside this core.

    Parameters
    ----------
    q (..., N, d), k (..., M, d), v (..., M, dv)
    params : dict or None
        The norm's affine parameters under upstream names ``"layer_norm.weight"`` (and
        ``"layer_norm.bias"`` for LayerNorm), shape ``(H*dv,)`` for ``norm_over="concat_heads"``
        (PyTorch's ``layer_norm.weight`` as-is; head ``h`` owns entries ``h*dv:(h+1)*dv``) or
        ``(dv,)`` for ``"head"``. ``None``: no affine.
    causal : bool
    feature_map : {"elu_plus_one", "identity"}
        The kernel $\phi$. Upstream's ``act_fun`` is configurable (``"1+elu"``, ``"elu"``,
        ``"relu"``, ``"gelu"`` …; constructor default ``"gelu"``); [recon] the transnormer arches'
        setting is not visible in the stored code — ``"elu_plus_one"`` keeps $\phi>0$ and smooth.
    norm : {"layernorm", "rmsnorm"}
        Upstream ``norm_type`` (default ``"layernorm"``; ``"rmsnorm"`` there uses
        ``x / (rms + eps)`` with eps 1e-8 outside the root — refattn's RMSNorm puts eps inside).
    norm_over : {"concat_heads", "head"}
        Statistics over the concatenated heads ($H\,d_v$ values per token; upstream, needs the
        layout ``(B, H, N, dv)``) or over each head's $d_v$ values.
    norm_eps : float
        PyTorch ``LayerNorm`` default 1e-5.

    Notes
    -----
    Backward: the norm VJP (:mod:`refattn.nn.norms`), then the feature-space core without the
    denominator ($\mathrm{den}=1$, no quotient rule), then the feature-map VJP.
    """
    check_choice(norm, "norm", tuple(_NORMS))
    check_choice(norm_over, "norm_over", ("concat_heads", "head"))
    check_choice(feature_map, "feature_map", FEATURE_MAPS)
    norm_eps = check_positive(norm_eps, "norm_eps")
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be a bool; got {type(causal).__name__}")
    q, k, v = _validate_qkv(q, k, v, same_length=bool(causal))
    if norm_over == "concat_heads" and q.ndim < 4:
        raise ValueError(f"norm_over='concat_heads' needs q of layout (B, H, N, d); got q of shape {q.shape}")
    fwd, _, keys = _NORMS[norm]
    width = q.shape[-3] * v.shape[-1] if norm_over == "concat_heads" else v.shape[-1]
    nparams = None
    if params is not None:
        spec = {f"layer_norm.{x}": (width,) for x in keys}
        checked = check_params(params, spec, optional=[k for k in spec if k != "layer_norm.weight"],
                               where=f"norm={norm!r}, norm_over={norm_over!r}")
        nparams = {}
        for key, a in checked.items():
            a = a.astype(q.dtype, copy=False)
            if norm_over == "concat_heads":
                a = a.reshape(q.shape[-3], 1, v.shape[-1])
            nparams[key.split(".", 1)[1]] = a
    fq = feature_map_forward(q, feature_map)
    fk = feature_map_forward(k, feature_map)
    h, state = _core_forward(fq, fk, v, causal=bool(causal), eps=0.0, normalise=False)
    axis = (-3, -1) if norm_over == "concat_heads" else -1
    out, ncache = fwd(h, nparams, axis=axis, eps=norm_eps)
    return out, {"q": q, "k": k, "v": v, "fq": fq, "fk": fk, "h": h, "state": state, "ncache": ncache,
                 "norm": norm, "causal": bool(causal), "feature_map": feature_map,
                 "param_shapes": None if params is None else {key: np.shape(params[key]) for key in params}}


def transnormer_backward(dout, cache):
    r"""Gradients ``{"q", "k", "v"}`` (+ ``"layer_norm.weight"``/``"layer_norm.bias"``) of
    :func:`transnormer_forward`: norm VJP, core VJP with $\mathrm{den}=1$, feature-map VJP."""
    h = cache["h"]
    g = as_dout(dout, h.shape, h.dtype)
    ng = _NORMS[cache["norm"]][1](g, cache["ncache"])
    dfq, dfk, dv = _core_backward(ng["x"], cache["fq"], cache["fk"], cache["v"], h, cache["state"],
                                  causal=cache["causal"], normalise=False)
    fm = cache["feature_map"]
    grads = {"q": feature_map_backward(dfq, cache["q"], fm), "k": feature_map_backward(dfk, cache["k"], fm),
             "v": dv}
    for key, shape in (cache["param_shapes"] or {}).items():
        grads[key] = np.asarray(ng[key.split(".", 1)[1]]).reshape(shape)
    return grads


def transnormer(q, k, v, params=None, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`transnormer_forward`."""
    return transnormer_forward(q, k, v, params, **config)[0]


def diag_attention_forward(q, k, v, *, block_size: int, causal: bool = False, scale: float | None = None):
    r"""TransNormer DiagAttention: softmax attention restricted to non-overlapping blocks of
    ``block_size`` consecutive positions (block-diagonal mask, optionally causal inside blocks),

    $P = \mathrm{softmax}(sQK^\top + \log M)$, $O = PV$, $M_{ij} = [\lfloor i/w\rfloor =
    \lfloor j/w\rfloor]$ (and $j\le i$), $s = 1/\sqrt d$ by default. Used in TransNormer's early
    layers against attention dilution. Dense reference with an $N\times N$ mask.

    Backward: $dV = P^\top G$, $dS = P\odot(GV^\top - \mathrm{rowsum}(P\odot GV^\top))$,
    $dQ = s\,dS\,K$, $dK = s\,dS^\top Q$.
    """
    w = check_int(block_size, "block_size", minimum=1)
    q, k, v = _validate_qkv(q, k, v, same_length=True)
    scale = check_positive(scale, "scale", allow_none=True)
    s = q.shape[-1] ** -0.5 if scale is None else scale
    n = q.shape[-2]
    blk = np.arange(n) // w
    keep = blk[:, None] == blk[None, :]
    if causal:
        keep &= np.tri(n, dtype=bool)
    S = np.where(keep, s * (q @ _mT(k)), -np.inf)
    P, _ = softmax_lse(S, axis=-1)
    out = P @ v
    return out, {"q": q, "k": k, "v": v, "P": P, "s": s, "out_shape": out.shape}


def diag_attention_backward(dout, cache):
    """Gradients ``{"q", "k", "v"}`` of :func:`diag_attention_forward` (see its docstring)."""
    P, q, k, v, s = cache["P"], cache["q"], cache["k"], cache["v"], cache["s"]
    g = as_dout(dout, cache["out_shape"], P.dtype)
    dS = softmax_vjp(P, g @ _mT(v), axis=-1)
    return {"q": s * (dS @ k), "k": s * (_mT(dS) @ q), "v": _mT(P) @ g}


def _sample_transnormer(rng, size):
    q, k, v = _qkv(rng, size)
    causal = bool(rng.integers(0, 2))
    width = q.shape[1] * v.shape[-1]
    params = {"layer_norm.weight": 1.0 + 0.3 * rng.standard_normal(width),
              "layer_norm.bias": 0.3 * rng.standard_normal(width)}
    return Sample(inputs={"q": q, "k": k, "v": v}, params=params, config={"causal": causal})


def _transnormer_reference(q, k, v, params=None, *, causal=False, feature_map="elu_plus_one",
                           norm="layernorm", norm_over="concat_heads", norm_eps=1e-5):
    q, k, v = _validate_qkv(q, k, v, same_length=causal)
    h = _explicit(feature_map_forward(q, feature_map), feature_map_forward(k, feature_map), v,
                  causal=causal, eps=0.0, normalise=False)
    ax = (-3, -1) if norm_over == "concat_heads" else (-1,)
    mu = h.mean(axis=ax, keepdims=True) if norm == "layernorm" else 0.0
    var = ((h - mu) ** 2).mean(axis=ax, keepdims=True)
    y = (h - mu) / np.sqrt(var + norm_eps)
    if params:
        shp = (q.shape[-3], 1, v.shape[-1]) if norm_over == "concat_heads" else (v.shape[-1],)
        y = y * params["layer_norm.weight"].reshape(shp)
        if "layer_norm.bias" in params:
            y = y + params["layer_norm.bias"].reshape(shp)
    return y


def _check_transnormer_scale_invariance(rng):
    """The norm absorbs a positive rescaling of phi(Q) (identity map, scaled non-negative q):
    without affine and with a tiny norm eps the output is unchanged."""
    q, k, v = _qkv(rng, "small")
    q, k = np.abs(q) + 0.1, np.abs(k) + 0.1
    kw = {"feature_map": "identity", "norm_eps": 1e-12, "norm_over": "head"}
    a = transnormer(q, k, v, **kw)
    b = transnormer(3.7 * q, k, v, **kw)
    err = float(np.max(np.abs(a - b)))
    assert err < 1e-8, f"not invariant to rescaling phi(Q): {err}"
    return err


def _check_transnormer_fd_variants(rng):
    errs = []
    for causal, norm, over in ((True, "rmsnorm", "head"), (False, "layernorm", "head"),
                               (True, "layernorm", "concat_heads")):
        # dv = 3: a LayerNorm over 2 values is nearly a sign function (ill-conditioned FD)
        q, k, v = _qkv(rng, "tiny", dv=3)
        width = v.shape[-1] if over == "head" else q.shape[1] * v.shape[-1]
        params = {"layer_norm.weight": 1.0 + 0.2 * rng.standard_normal(width)}
        s = Sample(inputs={"q": q, "k": k, "v": v}, params=params,
                   config={"causal": causal, "norm": norm, "norm_over": over})
        errs.append(_fd(transnormer_forward, transnormer_backward, s))
        s = Sample(inputs={"q": q, "k": k, "v": v}, config={"causal": causal, "norm": norm, "norm_over": over})
        errs.append(_fd(transnormer_forward, transnormer_backward, s))
    return max(errs)


def _check_diag_attention(rng):
    """DiagAttention: FD gradcheck (causal and not); block_size >= N equals full softmax attention;
    block_size 1 returns v."""
    errs = []
    for causal in (False, True):
        q, k, v = _qkv(rng, "tiny")
        s = Sample(inputs={"q": q, "k": k, "v": v}, config={"block_size": 2, "causal": causal})
        errs.append(_fd(diag_attention_forward, diag_attention_backward, s))
    q, k, v = _qkv(rng, "small")
    full, _ = diag_attention_forward(q, k, v, block_size=q.shape[-2])
    e1 = float(np.max(np.abs(full - _softmax_attention(q, k, v))))
    one, _ = diag_attention_forward(q, k, v, block_size=1)
    e2 = float(np.max(np.abs(one - v)))
    assert e1 < 1e-12 and e2 < 1e-12, (e1, e2)
    return max(errs + [e1, e2])


# --------------------------------------------------------------------------------------------
# Kernelized attention with RPE via FFT (Luo et al. 2021)


def _circulant_filter(c: np.ndarray) -> np.ndarray:
    """Length-2N circulant first column h with h[(i-j) mod 2N] = c[j-i+N-1]."""
    n = (c.shape[-1] + 1) // 2
    zero = np.zeros(c.shape[:-1] + (1,), dtype=c.dtype)
    return np.concatenate([c[..., :n][..., ::-1], zero, c[..., n:][..., ::-1]], axis=-1)


def toeplitz_matvec_fft(c: np.ndarray, x: np.ndarray) -> np.ndarray:
    r"""$y_i = \sum_j C_{ij}x_j$ for the Toeplitz $C_{ij} = c_{j-i+N-1}$, by FFT (unvalidated).

    ``c (..., 2N-1)`` (entry $N-1+r$ is the coefficient of offset $r = j-i$), ``x (..., N, F)``
    (``c``'s leading axes broadcast against ``x``'s). $C$ is embedded in a circulant of size
    $2N$ (no wrap-around for $|r|\le N-1$): $y = \mathrm{irfft}(\mathrm{rfft}(h)\,\mathrm{rfft}(x))$.
    Cost $O(FN\log N)$. The transpose $C^\top$ is the Toeplitz matrix of ``c[..., ::-1]``.
    """
    n = x.shape[-2]
    L = 2 * n
    H = np.fft.rfft(_circulant_filter(c), n=L, axis=-1)
    X = np.fft.rfft(x, n=L, axis=-2)
    y = np.fft.irfft(H[..., :, None] * X, n=L, axis=-2)[..., :n, :]
    return y.astype(x.dtype, copy=False)


def toeplitz_correlation_fft(dy: np.ndarray, x: np.ndarray) -> np.ndarray:
    r"""Gradient of $\langle dy, Cx\rangle$ w.r.t. ``c``: $dc_{N-1+r} = \sum_i dy_i\cdot x_{i+r}$
    (cross-correlation over the sequence, summed over features), by FFT. Returns ``(..., 2N-1)``."""
    n = x.shape[-2]
    L = 2 * n
    R = np.fft.irfft(np.conj(np.fft.rfft(dy, n=L, axis=-2)) * np.fft.rfft(x, n=L, axis=-2), n=L, axis=-2)
    R = R.sum(axis=-1)
    return np.concatenate([R[..., n + 1:], R[..., :n]], axis=-1).astype(x.dtype, copy=False)


def toeplitz_dense(c: np.ndarray) -> np.ndarray:
    """The dense ``(..., N, N)`` Toeplitz matrix $C_{ij} = c_{j-i+N-1}$ of ``c (..., 2N-1)``."""
    n = (c.shape[-1] + 1) // 2
    idx = np.arange(n)[None, :] - np.arange(n)[:, None] + n - 1
    return c[..., idx]


def kernelized_rpe_forward(q, k, v, params, *, projection, causal: bool = False, eps: float = 0.0,
                           feature_eps: float = 1e-6, normalize_data: bool = True,
                           key_stabilizer: str = "per_head", stabilizer_grad: bool = True):
    r"""Kernelized attention with relative positional encoding via FFT (Luo, Li, Cai, Feng, He
    et al., "Stable, Fast and Accurate: Kernelized Attention with Relative Positional Encoding",
    NeurIPS 2021, arXiv 2106.12566). No official code is known; this follows the paper.

    $$z_i = \frac{\sum_j e^{b_{j-i}}\,\phi(q_i)^\top\phi(k_j)\,v_j}
                 {\sum_j e^{b_{j-i}}\,\phi(q_i)^\top\phi(k_j) + \epsilon}$$

    with Performer positive random features $\phi$ (:func:`performer_features_forward`; the same
    keywords as :func:`performer_forward`). $C_{ij} = e^{b_{j-i}}$ is Toeplitz (zero above the
    diagonal when ``causal``). With $G_j = \phi(k_j)\otimes v_j$: $U = CG$ and $u = C\phi(K)$ by
    FFT Toeplitz products (:func:`toeplitz_matvec_fft`, $O(m\,d_v N\log N)$),
    $\mathrm{num}_i = \sum_a\phi(q_i)_aU_{i,a,:}$, $\mathrm{den}_i = \phi(q_i)\cdot u_i+\epsilon$.

    Parameters
    ----------
    q, k (..., N, d), v (..., N, dv)
    params : {"b": (..., 2N-1)}
        Relative-position logits, entry $N-1+r$ for offset $r = j-i$; leading axes broadcast
        against ``q``'s (``(H, 2N-1)`` for per-head biases).
    projection, feature_eps, normalize_data, key_stabilizer, stabilizer_grad
        As in :func:`performer_forward`.
    eps : float
        Added to the denominator (default 0: positive features keep it positive).

    Notes
    -----
    Backward: $dn_i = g_i/\mathrm{den}_i$, $c_i = -g_i\cdot z_i/\mathrm{den}_i$;
    $d\phi(q_i)_a = dn_i\cdot U_{i,a} + c_iu_{i,a}$; $dU_i = \phi(q_i)\otimes dn_i$,
    $du_i = c_i\phi(q_i)$; $dG = C^\top dU$ and $d\phi(K) \mathrel{+}= C^\top du$ (Toeplitz of the
    reversed ``c``, same FFT routine); $d\phi(k_j) \mathrel{+}= dG_j v_j$, $dv_j = dG_j^\top\phi(k_j)$;
    $dc_{N-1+r} = \sum_i (dU_i\cdot G_{i+r} + du_i\cdot\phi(k_{i+r}))$ (FFT cross-correlation) and
    $db = e^b\odot dc$ (0 on the causally removed offsets), summed over broadcast axes.
    """
    q, k, v = _validate_qkv(q, k, v, same_length=True)
    projection, feature_eps, _ = _performer_config(
        projection, q.shape[-1], q.dtype, feature_eps, 0.0, key_stabilizer, causal, normalize_data,
        stabilizer_grad)
    eps = check_positive(eps, "eps", allow_zero=True)
    if not isinstance(params, dict) or set(params) != {"b"}:
        raise ValueError(f"params must be a dict with the single key 'b' (..., 2N-1); got "
                         f"{sorted(params) if isinstance(params, dict) else type(params).__name__}")
    n = q.shape[-2]
    b = as_float(params["b"], "b", min_ndim=1)
    if b.shape[-1] != 2 * n - 1:
        raise ValueError(f"b must have last axis 2N-1 = {2 * n - 1} (offsets -(N-1)..N-1); got shape {b.shape}")
    try:
        ok = np.broadcast_shapes(b.shape[:-1], q.shape[:-2]) == q.shape[:-2]
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"b's leading axes {b.shape[:-1]} must broadcast to q's {q.shape[:-2]}")
    b = b.astype(q.dtype, copy=False)
    c = np.exp(b)
    if causal:
        c = np.where(np.arange(2 * n - 1) > n - 1, 0.0, c)
    fq, cq = performer_features_forward(q, projection, is_query=True, feature_eps=feature_eps,
                                        normalize_data=bool(normalize_data), key_stabilizer=key_stabilizer)
    fk, ck = performer_features_forward(k, projection, is_query=False, feature_eps=feature_eps,
                                        normalize_data=bool(normalize_data), key_stabilizer=key_stabilizer)
    m, dv = fk.shape[-1], v.shape[-1]
    G = (fk[..., :, None] * v[..., None, :]).reshape(fk.shape[:-1] + (m * dv,))
    U = toeplitz_matvec_fft(c, G).reshape(fk.shape[:-1] + (m, dv))
    u = toeplitz_matvec_fft(c, fk)
    num = np.einsum("...na,...nae->...ne", fq, U)
    den = np.einsum("...na,...na->...n", fq, u) + eps
    out = num / den[..., None]
    return out, {"fq": fq, "fk": fk, "cq": cq, "ck": ck, "v": v, "G": G, "U": U, "u": u, "den": den,
                 "out": out, "c": c, "b_shape": b.shape, "stabilizer_grad": bool(stabilizer_grad)}


def kernelized_rpe_backward(dout, cache):
    r"""Gradients ``{"q", "k", "v", "b"}`` of :func:`kernelized_rpe_forward` (derivation in its
    docstring)."""
    out = cache["out"]
    g = as_dout(dout, out.shape, out.dtype)
    fq, fk, v, U, u, den, c = (cache[x] for x in ("fq", "fk", "v", "U", "u", "den", "c"))
    m, dv = fk.shape[-1], v.shape[-1]
    dn = g / den[..., None]
    cc = -np.sum(g * out, axis=-1) / den
    dfq = np.einsum("...ne,...nae->...na", dn, U) + cc[..., None] * u
    dU = (fq[..., :, None] * dn[..., None, :]).reshape(fq.shape[:-1] + (m * dv,))
    du = cc[..., None] * fq
    crev = c[..., ::-1]
    dG = toeplitz_matvec_fft(crev, dU).reshape(fk.shape[:-1] + (m, dv))
    dfk = toeplitz_matvec_fft(crev, du) + np.einsum("...nae,...ne->...na", dG, v)
    dvv = np.einsum("...nae,...na->...ne", dG, fk)
    dc = toeplitz_correlation_fft(dU, cache["G"]) + toeplitz_correlation_fft(du, fk)
    db = sum_to_shape(dc * c, cache["b_shape"])
    sg = cache["stabilizer_grad"]
    return {"q": performer_features_backward(dfq, cache["cq"], stabilizer_grad=sg),
            "k": performer_features_backward(dfk, cache["ck"], stabilizer_grad=sg), "v": dvv, "b": db}


def kernelized_rpe(q, k, v, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`kernelized_rpe_forward`."""
    return kernelized_rpe_forward(q, k, v, params, **config)[0]


def _rpe_reference(q, k, v, params, *, projection, causal=False, eps=0.0, feature_eps=1e-6,
                   normalize_data=True, key_stabilizer="per_head", stabilizer_grad=True):
    """Dense path: $A = (\\Phi_Q\\Phi_K^\\top)\\odot C$, $z = AV/(A\\mathbf 1+\\epsilon)$."""
    fq, _ = performer_features_forward(q, projection, is_query=True, feature_eps=feature_eps,
                                       normalize_data=normalize_data, key_stabilizer=key_stabilizer)
    fk, _ = performer_features_forward(k, projection, is_query=False, feature_eps=feature_eps,
                                       normalize_data=normalize_data, key_stabilizer=key_stabilizer)
    C = toeplitz_dense(np.exp(params["b"]))
    if causal:
        C = np.tril(C)
    A = (fq @ _mT(fk)) * C
    return (A @ v) / (A.sum(-1, keepdims=True) + eps)


def _sample_rpe(rng, size):
    q, k, v = _qkv(rng, size, same_length=True)
    n = q.shape[-2]
    m = 4 if size == "tiny" else 12
    if size == "tiny":
        q, k, v = q[:, :1], k[:, :1], v[:, :1]
    proj = performer_projection_matrix(m, q.shape[-1], seed=int(rng.integers(0, 2**31)))
    b = 0.5 * rng.standard_normal((q.shape[1], 2 * n - 1))
    return Sample(inputs={"q": q * 0.7, "k": k * 0.7, "v": v}, params={"b": b},
                  config={"projection": proj, "causal": bool(rng.integers(0, 2))})


def _check_toeplitz_fft_dense_and_adjoint(rng):
    n, f = 7, 3
    c = rng.standard_normal((2, 2 * n - 1))
    x = rng.standard_normal((2, n, f))
    y = rng.standard_normal((2, n, f))
    C = toeplitz_dense(c)
    e1 = float(np.max(np.abs(toeplitz_matvec_fft(c, x) - C @ x)))
    e2 = float(np.max(np.abs(toeplitz_matvec_fft(c[..., ::-1], y) - _mT(C) @ y)))
    # <y, Cx> = <C^T y, x>, and the correlation is d<y, Cx>/dc
    e3 = abs(float(np.sum(y * toeplitz_matvec_fft(c, x)) - np.sum(toeplitz_matvec_fft(c[..., ::-1], y) * x)))
    dc = toeplitz_correlation_fft(y, x)
    idx = np.arange(n)[None, :] - np.arange(n)[:, None] + n - 1
    dc_dense = np.zeros_like(c)
    for i in range(n):
        for j in range(n):
            dc_dense[..., idx[i, j]] += np.sum(y[..., i, :] * x[..., j, :], axis=-1)
    e4 = float(np.max(np.abs(dc - dc_dense)))
    err = max(e1, e2, e3, e4)
    assert err < 1e-12, (e1, e2, e3, e4)
    return err


def _check_rpe_zero_bias_is_performer(rng):
    q, k, v = _qkv(rng, "small")
    proj = performer_projection_matrix(8, q.shape[-1], seed=2)
    b = np.zeros((q.shape[1], 2 * q.shape[-2] - 1))
    errs = []
    for causal in (False, True):
        a = kernelized_rpe(q, k, v, {"b": b}, projection=proj, causal=causal)
        p = performer(q, k, v, projection=proj, causal=causal, denominator_guard=0.0)
        errs.append(float(np.max(np.abs(a - p))))
    assert max(errs) < 1e-12, errs
    return max(errs)


def _check_rpe_fd_variants(rng):
    errs = []
    for causal in (False, True):
        q, k, v = _qkv(rng, "tiny")
        q, k, v = q[:, :1], k[:, :1], v[:, :1]
        proj = performer_projection_matrix(3, q.shape[-1], seed=4)
        b = 0.5 * rng.standard_normal((2 * q.shape[-2] - 1,))  # shared over batch and heads
        s = Sample(inputs={"q": q, "k": k, "v": v}, params={"b": b},
                   config={"projection": proj, "causal": causal, "eps": 1e-3})
        errs.append(_fd(kernelized_rpe_forward, kernelized_rpe_backward, s))
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
                "gradcheck_causal_padded_unnormalised": _check_fd_both_modes,
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

    Mechanism(
        slug="performer_favor_plus", family="4-linear-kernel-sparse", tier="T1",
        title="Performer FAVOR+ (positive orthogonal random features, fixed projection)",
        paper="Choromanski et al., 'Rethinking Attention with Performers', ICLR 2021, arXiv 2009.14794",
        forward=performer_forward, backward=performer_backward, sample=_sample_performer,
        reference=_performer_reference,
        checks={"converges_to_softmax_attention": _check_performer_converges,
                "kernel_estimate_unbiased": _check_performer_unbiased,
                "stabilizers_cancel_without_eps": _check_performer_stabilizers_cancel,
                "gradcheck_variants": _check_performer_fd_variants,
                "projection_blocks_orthogonal": _check_projection_orthogonal},
        docs="linear-attention.md#performer-favor",
    ),
    Mechanism(
        slug="transnormer_norm_attention", family="4-linear-kernel-sparse", tier="T1",
        title="TransNormer NormAttention (norm instead of the denominator) and DiagAttention",
        paper="Qin, Han, Sun, Li, Kong, Barnes, Zhong, 'The Devil in Linear Transformer', EMNLP 2022, "
              "arXiv 2210.10340",
        forward=transnormer_forward, backward=transnormer_backward, sample=_sample_transnormer,
        reference=_transnormer_reference,
        checks={"invariant_to_rescaled_query_features": _check_transnormer_scale_invariance,
                "gradcheck_variants": _check_transnormer_fd_variants,
                "diag_attention": _check_diag_attention},
        docs="linear-attention.md#transnormer",
    ),
    Mechanism(
        slug="kernelized_attention_rpe_fft", family="4-linear-kernel-sparse", tier="T2",
        title="Kernelized (Performer-feature) attention with relative positional encoding via FFT",
        paper="Luo, Li, Cai, Feng, He et al., 'Stable, Fast and Accurate: Kernelized Attention with "
              "Relative Positional Encoding', NeurIPS 2021, arXiv 2106.12566",
        forward=kernelized_rpe_forward, backward=kernelized_rpe_backward, sample=_sample_rpe,
        reference=_rpe_reference,
        checks={"toeplitz_fft_equals_dense_and_adjoint": _check_toeplitz_fft_dense_and_adjoint,
                "zero_bias_is_performer": _check_rpe_zero_bias_is_performer,
                "gradcheck_variants": _check_rpe_fd_variants},
        docs="linear-attention.md#kernelized-attention-rpe-fft",
    ),
)
