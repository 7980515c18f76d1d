r"""Linear attention of Katharopoulos et al. ("Transformers are RNNs"): non-causal, and causal as a
prefix-state scan (the RNN form).

Katharopoulos, Vyas, Pappas, Fleuret, "Transformers are RNNs: Fast Autoregressive Transformers
with Linear Attention", ICML 2020, arXiv 2006.16236. Follows idiap/fast-transformers
``fast_transformers/attention/linear_attention.py``@b07cc93 (``Z = 1/(Q·K.sum + eps)``, eps 1e-6) and
``causal_linear_attention.py`` (``K.cumsum`` denominator, ``causal_dot_product`` numerator).

$$o_i = \frac{\phi(q_i)^\top\sum_j\phi(k_j)v_j^\top}{\phi(q_i)^\top\sum_j\phi(k_j)+\epsilon},\qquad
\phi(x) = \mathrm{elu}(x) + 1,$$

with sums over $j\le i$ when causal: $S_i = S_{i-1} + \phi(k_i)v_i^\top$,
$z_i = z_{i-1} + \phi(k_i)$, $o_i = \phi(q_i)^\top S_i/(\phi(q_i)^\top z_i + \epsilon)$, one
$d\times d_v$ state per head. No $1/\sqrt d$ scaling. It equals the explicit $O(N^2)$ form
$O = \mathrm{diag}(A\mathbf 1 + \epsilon)^{-1}AV$, $A = \phi(Q)\phi(K)^\top$ (lower-triangular when
causal), `linear_attention_explicit`.

Backward
--------
The feature-space core of `refattn.attention.linear.core` (derivation in its docstring): with
$u_i = g_i/\mathrm{den}_i$ and $c_i = -g_i\cdot o_i/\mathrm{den}_i$, $d\Phi_Q = US^\top + cz^\top$,
$d\Phi_K = V\,dS^\top + \mathbf 1\,dz^\top$, $dV = \Phi_K\,dS$ (non-causal), and in the causal case a
forward scan that rebuilds $S_i, z_i$ for $d\phi(q_i) = S_iu_i + c_iz_i$ and a reverse scan of
$R_j = \sum_{i\ge j}\phi(q_i)u_i^\top$, $r_j = \sum_{i\ge j}c_i\phi(q_i)$ for
$d\phi(k_j) = R_jv_j + r_j$, $dv_j = R_j^\top\phi(k_j)$. Then the ELU+1 VJP
$\phi'(x) = 1$ ($x>0$) or $e^x$ (ELU+1 is $C^1$ at 0, so finite differences are valid everywhere).

Conventions
-----------
``key_padding_mask`` (True = keep) zeroes $\phi(k_j)$ of removed keys (fast-transformers'
``key_lengths``: ``K = K * key_lengths.float_matrix``); a query that sees no key outputs 0.
``normalise=False`` drops the denominator (the un-normalised form TransNormer builds on).
``causal_linear_attention_forward`` is the stable, kernel-mirrored signature of the causal scan
(``backend="numba"`` / ``"cuda"`` runs ``refattn.kernels.cpu.linear`` / ``refattn.kernels.cuda.linear``).
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, check_choice, check_positive
from ...kernels import backward_kernel, forward_kernel
from ...registry import Mechanism, Sample, register
from ._samples import fd_max_rel, random_qkv
from .core import (
    FEATURE_MAPS,
    feature_map_backward,
    feature_map_forward,
    linear_core_backward,
    linear_core_forward,
    mT,
    validate_linear_qkv,
)

__all__ = [
    "linear_attention_forward",
    "linear_attention_backward",
    "linear_attention",
    "linear_attention_explicit",
    "causal_linear_attention_forward",
    "causal_linear_attention_backward",
]


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
    Backward: the feature-space core of `refattn.attention.linear.core`, then the ELU+1 VJP
    $\phi'(x) = 1$ ($x>0$) or $e^x$.
    """
    eps = _lin_config(eps, feature_map, causal)
    q, k, v = validate_linear_qkv(q, k, v, same_length=bool(causal))
    kmask = _key_mask(key_padding_mask, k)
    fq = feature_map_forward(q, feature_map)
    fk = feature_map_forward(k, feature_map)
    if kmask is not None:
        fk = fk * kmask[..., None]
    if not isinstance(normalise, (bool, np.bool_)):
        raise TypeError(f"normalise must be a bool; got {type(normalise).__name__}")
    out, state = linear_core_forward(fq, fk, v, causal=bool(causal), eps=eps, normalise=bool(normalise))
    cache = {"q": q, "k": k, "v": v, "fq": fq, "fk": fk, "out": out.copy(), "state": state, "kmask": kmask,
             "causal": bool(causal), "feature_map": feature_map, "eps": eps, "normalise": bool(normalise)}
    return out, cache


def linear_attention_backward(dout, cache):
    r"""Gradients ``{"q", "k", "v"}`` of :func:`linear_attention_forward` (core VJP of the module
    docstring — quotient rule on the denominator; reverse scans when causal — then the feature-map
    VJP)."""
    out = cache["out"]
    g = as_dout(dout, out.shape, out.dtype)
    dfq, dfk, dv = linear_core_backward(g, cache["fq"], cache["fk"], cache["v"], out, cache["state"],
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
    q, k, v = validate_linear_qkv(q, k, v, same_length=bool(causal))
    kmask = _key_mask(key_padding_mask, k)
    A = feature_map_forward(q, feature_map) @ mT(feature_map_forward(k, feature_map))
    if kmask is not None:
        A = A * kmask[..., None, :]
    if causal:
        A = np.tril(A)
    if not normalise:
        return A @ v
    den = A.sum(-1, keepdims=True) + eps
    return (A @ v) / np.where(den == 0, 1.0, den)


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample_katharopoulos(rng, size):
    q, k, v = random_qkv(rng, size)
    config = {"causal": bool(rng.integers(0, 2)), "eps": 1e-6, "feature_map": "elu_plus_one"}
    if rng.random() < 0.5:  # per-batch key padding (lengths), the first key always kept
        lengths = rng.integers(1, k.shape[-2] + 1, size=k.shape[0])
        config["key_padding_mask"] = np.arange(k.shape[-2])[None, :] < lengths[:, None]
        config["key_padding_mask"] = config["key_padding_mask"][:, None, :]  # (B, 1, M)
    return Sample(inputs={"q": q, "k": k, "v": v}, config=config)


def _check_causal_equals_masked(rng):
    q, k, v = random_qkv(rng, "small")
    a = linear_attention(q, k, v, causal=True)
    b = linear_attention_explicit(q, k, v, causal=True)
    err = float(np.max(np.abs(a - b)))
    assert err < 1e-12, f"causal scan differs from the masked explicit form by {err}"
    return err


def _check_linear_equals_explicit(rng):
    q, k, v = random_qkv(rng, "small", same_length=False)
    a = linear_attention(q, k, v)
    b = linear_attention_explicit(q, k, v)
    err = float(np.max(np.abs(a - b)))
    assert err < 1e-12, f"linear form differs from the explicit form by {err}"
    return err


def _check_rnn_equals_scan(rng):
    """Step-by-step recurrent evaluation (one token at a time, as in decoding) == the scan."""
    q, k, v = random_qkv(rng, "small")
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
            q, k, v = random_qkv(rng, "tiny")
            config = {"causal": causal, "normalise": normalise}
            if padded:  # batch 0 keeps 2 keys, batch 1 all
                keep = np.ones(k.shape[:-1], dtype=bool)
                keep[0, :, 2:] = False
                config["key_padding_mask"] = keep
            s = Sample(inputs={"q": q, "k": k, "v": v}, config=config)
            errs.append(fd_max_rel(linear_attention_forward, linear_attention_backward, s))
    return max(errs)


def _check_rows_are_convex(rng):
    """eps = 0: the explicit weights are non-negative with rows summing to 1, so each output is a
    convex combination of values."""
    q, k, v = random_qkv(rng, "small")
    fq, fk = feature_map_forward(q, "elu_plus_one"), feature_map_forward(k, "elu_plus_one")
    A = fq @ mT(fk)
    P = A / A.sum(-1, keepdims=True)
    assert (P >= 0).all()
    err = float(np.max(np.abs(P.sum(-1) - 1)))
    o = linear_attention(q, k, v, eps=0.0)
    err = max(err, float(np.max(np.abs(o - P @ v))))
    assert err < 1e-12
    return err


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
)
