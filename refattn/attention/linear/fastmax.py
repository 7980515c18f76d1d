r"""Fastmax (FAST): factorisable polynomial-kernel attention, the truncated Taylor series of softmax.

Gerami, Hoover, Dulepet, Duraiswami, "FAST: Factorizable Attention for Speeding up Transformers",
arXiv 2402.07901 (2024). Upstream (the authors' code, which the catalogue did not know):
``armingerami/fastmax`` ``test_fastmax.py`` / ``example.py`` (``fastmax_function``, the PyTorch
path of ``FASTMultiHeadAttention(use_custom_gradient=False)``) @
``28eb11a72e819cd5b7fcd89a140d2cdd1182b7d5``; the custom CUDA gradient (``fastmax_cuda``) computes
the same function with less memory.

$$a_{ij} = \frac{f(\hat q_i^\top\hat k_j)}{\sum_{j'} f(\hat q_i^\top\hat k_{j'})},\qquad
f(x) = a_0 + a_1\frac{x}{t} + a_2\frac{x^2}{t^2}\ (p = 2),\quad a_0 + a_1\frac xt\ (p = 1),$$

$O = AV$ (sums over $j\le i$ when causal). The defaults $a = (1, 1, \tfrac12)$ are the second-order
Taylor polynomial of $e^x$, and $1 + x + x^2/2 > 0$ for every $x$, so the weights are a convex
combination without any clamp. The factorisation (the paper's "moments"):

$$\sum_j f(\hat q_i^\top\hat k_j)v_j = a_0\sum_jv_j + \tfrac{a_1}{t}\hat q_i^\top\sum_j\hat k_jv_j^\top
+ \tfrac{a_2}{t^2}(\hat q_i\otimes\hat q_i)^\top\sum_j(\hat k_j\otimes\hat k_j)v_j^\top,$$

and likewise the denominator with $v_j\to1$: the $O(N^2)$ attention becomes $O(ND^{p+1})$, and
the causal form prefix sums of the moments. Here it is the linear-attention core of
`refattn.attention.linear.core` on the asymmetric polynomial features
$\phi_Q(q) = [a_0;\ \tfrac{a_1}{t}q;\ \tfrac{a_2}{t^2}\,q\otimes q]$,
$\phi_K(k) = [1;\ k;\ k\otimes k]$ (so $\phi_Q(q)^\top\phi_K(k) = f(q^\top k)$ exactly).

Normalisation of $q, k$ (``normalize``)
---------------------------------------
``"none"`` (upstream ``normalize=False``, default); ``"max_norm"`` (upstream ``normalize=True``:
$\hat q_n = \ell\,q_n/\max_{n'}\|q_{n'}\|$ per (batch, head), $\ell$ = ``lim``, so every $\hat q$
lies in the ball of radius $\ell$); ``"unit"`` ($\hat q = q/\|q\|$) and ``"standard"``
($\hat q = (q - \bar q)/\|q - \bar q\|$, the mean over the feature axis) are **reconstructions** of
the paper's "normalized queries and keys" (the catalogue leaves unit-norm vs standardised open;
the code has neither).

Backward
--------
The core VJP gives $d\phi_Q, d\phi_K$; then
$d\hat q = \tfrac{a_1}{t}d\phi_Q^{(1)} + \tfrac{a_2}{t^2}(D + D^\top)\hat q$ with $D$ the
$d\times d$ block $d\phi_Q^{(2)}$ (and without the coefficients for $\hat k$); then the
normalisation: ``unit``/``standard`` via `refattn.nn.norms.normalize_backward` (scaled by
$d^{-1/2}$); ``max_norm`` $dq_n = \tfrac{\ell}{r^*}d\hat q_n - [n = n^*]\,\tfrac{\ell}{r^{*3}}
\big(\sum_{n'}d\hat q_{n'}^\top q_{n'}\big)q_{n^*}$ with $r^* = \|q_{n^*}\|$ the largest row norm.

Conventions
-----------
``temperature`` $t$ (upstream's PyTorch path overwrites it with 1 in both branches; the keyword
applies it, default 1); ``a0, a1, a2`` and ``p`` as upstream; upstream's ``dropout`` (on the
$q\otimes q$ / $k\otimes k$ moments) and the ``rpe_matrix`` of the CUDA path are training-time /
disabled options and are not part of this reference.
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, check_choice, check_positive
from ...nn.norms import normalize_backward, normalize_forward
from ...registry import Mechanism, Sample, register
from ._samples import fd_max_rel, random_qkv, softmax_attention_reference
from .core import linear_core_backward, linear_core_forward, mT, validate_linear_qkv

__all__ = [
    "FASTMAX_NORMALIZE",
    "fastmax_normalize_forward",
    "fastmax_normalize_backward",
    "fastmax_features",
    "fastmax_forward",
    "fastmax_backward",
    "fastmax_attention",
]

FASTMAX_NORMALIZE = ("none", "max_norm", "unit", "standard")
_NORM_EPS = 1e-12


def fastmax_normalize_forward(x, mode: str, lim: float = 1.0):
    r"""$\hat x$ of ``x (..., N, d)`` for ``mode`` in ``FASTMAX_NORMALIZE`` (unvalidated). Returns ``(xhat, cache)``."""
    if mode == "none":
        return x, {"mode": mode}
    if mode == "max_norm":
        r = np.sqrt(np.sum(x * x, axis=-1))
        nstar = np.argmax(r, axis=-1)
        rstar = np.take_along_axis(r, nstar[..., None], axis=-1)[..., None]  # (..., 1, 1)
        return lim * x / rstar, {"mode": mode, "x": x, "nstar": nstar, "rstar": rstar, "lim": lim}
    xh, st = normalize_forward(x, (x.ndim - 1,), _NORM_EPS, center=(mode == "standard"))
    s = x.shape[-1] ** -0.5
    return s * xh, {"mode": mode, "xh": xh, "st": st, "s": s}


def fastmax_normalize_backward(dxhat, cache):
    """VJP of :func:`fastmax_normalize_forward`."""
    mode = cache["mode"]
    if mode == "none":
        return dxhat
    if mode == "max_norm":
        x, rstar, lim = cache["x"], cache["rstar"], cache["lim"]
        dx = lim * dxhat / rstar
        tot = np.sum(dxhat * x, axis=(-2, -1), keepdims=True)
        xstar = np.take_along_axis(x, cache["nstar"][..., None, None], axis=-2)  # (..., 1, d)
        onehot = np.zeros(x.shape[:-1] + (1,), dtype=x.dtype)
        np.put_along_axis(onehot, cache["nstar"][..., None, None], 1.0, axis=-2)
        return dx - onehot * (lim * tot / rstar ** 3) * xstar
    return normalize_backward(cache["s"] * dxhat, cache["xh"], cache["st"])


def fastmax_features(x, *, p: int, coeffs=None):
    r"""Polynomial features ``[c0, c1 x, c2 vec(x x^T)]`` (``p = 2``) or ``[c0, c1 x]`` (``p = 1``) of
    ``x (..., N, d)``; ``coeffs = (c0, c1, c2)`` (None: all ones, the key side)."""
    c0, c1, c2 = (1.0, 1.0, 1.0) if coeffs is None else coeffs
    parts = [np.full(x.shape[:-1] + (1,), c0, dtype=x.dtype), c1 * x]
    if p == 2:
        parts.append(c2 * (x[..., :, None] * x[..., None, :]).reshape(x.shape[:-1] + (x.shape[-1] ** 2,)))
    return np.concatenate(parts, axis=-1)


def _features_vjp(dphi, x, p, coeffs):
    d = x.shape[-1]
    _, c1, c2 = (1.0, 1.0, 1.0) if coeffs is None else coeffs
    dx = c1 * dphi[..., 1:1 + d]
    if p == 2:
        D = dphi[..., 1 + d:].reshape(dphi.shape[:-1] + (d, d))
        dx = dx + c2 * np.einsum("...ab,...b->...a", D + mT(D), x)
    return dx


def fastmax_forward(q, k, v, *, p: int = 2, causal: bool = False, normalize: str = "none",
                    temperature: float = 1.0, a0: float = 1.0, a1: float = 1.0, a2: float = 0.5, lim: float = 1.0):
    r"""Fastmax attention (Gerami, Hoover, Dulepet, Duraiswami, "FAST: Factorizable Attention for
    Speeding up Transformers", arXiv 2402.07901): $a_{ij}\propto f(\hat q_i^\top\hat k_j)$ with the
    polynomial $f$ of the module docstring, in $O(ND^{p+1})$ by moments (prefix sums when causal).

    Parameters
    ----------
    q (..., N, d), k (..., M, d), v (..., M, dv)
    p : {1, 2}
        Polynomial order (upstream ``p``, default 2).
    causal : bool
        Upstream ``mask``.
    normalize : {"none", "max_norm", "unit", "standard"}
        Normalisation of $q, k$ (module docstring; ``unit``/``standard`` are reconstructions).
    temperature, a0, a1, a2, lim : float
        $t$, the coefficients, and the radius of ``max_norm`` (upstream defaults 1, 1, 1, 0.5, 1).
    """
    check_choice(p, "p", (1, 2))
    check_choice(normalize, "normalize", FASTMAX_NORMALIZE)
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be a bool; got {type(causal).__name__}")
    t = check_positive(temperature, "temperature")
    lim = check_positive(lim, "lim")
    coeffs = []
    for name, val in (("a0", a0), ("a1", a1), ("a2", a2)):
        if isinstance(val, (bool, np.bool_)) or not isinstance(val, (int, float, np.floating, np.integer)) \
                or not np.isfinite(val):
            raise TypeError(f"{name} must be a finite real number; got {val!r}")
        coeffs.append(float(val))
    q, k, v = validate_linear_qkv(q, k, v, same_length=bool(causal))
    qh, cq = fastmax_normalize_forward(q, normalize, lim)
    kh, ck = fastmax_normalize_forward(k, normalize, lim)
    cf = (coeffs[0], coeffs[1] / t, coeffs[2] / t ** 2)
    fq = fastmax_features(qh, p=p, coeffs=cf)
    fk = fastmax_features(kh, p=p)
    out, state = linear_core_forward(fq, fk, v, causal=bool(causal), eps=0.0, normalise=True)
    cache = {"fq": fq, "fk": fk, "qh": qh, "kh": kh, "cq": cq, "ck": ck, "v": v, "out": out, "state": state,
             "causal": bool(causal), "p": p, "cf": cf}
    return out.copy(), cache


def fastmax_backward(dout, cache):
    r"""Gradients ``{"q", "k", "v"}`` of :func:`fastmax_forward`: the core VJP, the polynomial-feature
    VJP $d\hat x = c_1 d\phi^{(1)} + c_2(D + D^\top)\hat x$, then the normalisation VJP."""
    out = cache["out"]
    g = as_dout(dout, out.shape, out.dtype)
    dfq, dfk, dv = linear_core_backward(g, cache["fq"], cache["fk"], cache["v"], out, cache["state"],
                                        causal=cache["causal"], normalise=True)
    dqh = _features_vjp(dfq, cache["qh"], cache["p"], cache["cf"])
    dkh = _features_vjp(dfk, cache["kh"], cache["p"], None)
    return {"q": fastmax_normalize_backward(dqh, cache["cq"]), "k": fastmax_normalize_backward(dkh, cache["ck"]),
            "v": dv}


def fastmax_attention(q, k, v, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`fastmax_forward`."""
    return fastmax_forward(q, k, v, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _reference(q, k, v, *, p=2, causal=False, normalize="none", temperature=1.0, a0=1.0, a1=1.0, a2=0.5, lim=1.0):
    """Explicit O(N^2) form: the score matrix f(q_i . k_j), masked, row-normalised, times V."""
    qh, _ = fastmax_normalize_forward(q, normalize, lim)
    kh, _ = fastmax_normalize_forward(k, normalize, lim)
    x = qh @ mT(kh) / temperature
    A = a0 + a1 * x + (a2 * x * x if p == 2 else 0.0)
    if causal:
        A = np.tril(A)
    return (A @ v) / A.sum(-1, keepdims=True)


def _sample(rng, size):
    q, k, v = random_qkv(rng, size)
    p = int(rng.integers(1, 3))
    config = {"p": p, "causal": bool(rng.integers(0, 2)), "normalize": FASTMAX_NORMALIZE[int(rng.integers(0, 4))]}
    if config["normalize"] == "none":
        config["normalize"] = "max_norm" if p == 1 else "none"  # p = 1 needs |q.k| < 1 to stay positive
        q, k = 0.5 * q, 0.5 * k
    return Sample(inputs={"q": q, "k": k, "v": v}, config=config)


def _check_fd_every_option(rng):
    errs = []
    for i, normalize in enumerate(FASTMAX_NORMALIZE):
        for p in ((2,) if i % 2 else (1, 2)):
            q, k, v = random_qkv(rng, "tiny")
            q, k, v = q[:, :1, :3], k[:, :1, :3], v[:, :1, :3]
            s = Sample(inputs={"q": 0.4 * q, "k": 0.4 * k, "v": v},
                       config={"p": p, "normalize": normalize, "causal": p == 2, "temperature": 1.3, "a2": 0.7})
            errs.append(fd_max_rel(fastmax_forward, fastmax_backward, s))
    return max(errs)


def _check_moments_equal_explicit(rng):
    """The moment (factorised) form == the explicit score matrix, every option, causal or not."""
    q, k, v = random_qkv(rng, "small", same_length=True)
    err = 0.0
    for normalize in FASTMAX_NORMALIZE:
        for p in (1, 2):
            for causal in (False, True):
                kw = {"p": p, "causal": causal, "normalize": normalize, "temperature": 1.7, "a1": 0.9}
                err = max(err, float(np.max(np.abs(fastmax_attention(q, k, v, **kw) - _reference(q, k, v, **kw)))))
    assert err < 1e-10, err
    return err


def _check_taylor_rate(rng):
    """Fastmax is the order-p Taylor truncation of softmax attention: shrinking the logits by s
    shrinks the output error against softmax(QK^T) like s^(p+1) (one halving: factor 2^(p+1),
    accepted within [0.7, 1.4] of it)."""
    q, k, v = random_qkv(np.random.default_rng(4), "small")
    out = {}
    for p in (1, 2):
        errs = []
        for s in (0.02, 0.01):
            ref = softmax_attention_reference(s * np.sqrt(q.shape[-1]) * q, k, v)  # logits s q.k
            errs.append(float(np.max(np.abs(fastmax_attention(s * q, k, v, p=p, a2=0.5) - ref))))
        ratio = errs[0] / errs[1]
        assert 0.7 * 2 ** (p + 1) < ratio < 1.4 * 2 ** (p + 1), (p, errs, ratio)
        out[p] = ratio
    return abs(out[2] / 8 - 1)


def _check_weights_convex(rng):
    """p = 2 with a = (1, 1, 1/2): f(x) = 1 + x + x^2/2 > 0 for every x, so the weights are
    non-negative and sum to 1 even for large logits (no normalisation)."""
    q, k, v = random_qkv(rng, "small")
    q = 5.0 * q
    x = q @ mT(k)
    A = 1 + x + 0.5 * x * x
    assert np.all(A > 0)
    P = A / A.sum(-1, keepdims=True)
    err = float(np.max(np.abs(fastmax_attention(q, k, v) - P @ v)))
    assert err < 1e-10, err
    return err


register(
    Mechanism(
        slug="fastmax_polynomial_attention", family="4-linear-kernel-sparse", tier="T2",
        title="Fastmax / FAST: factorisable polynomial-kernel (truncated Taylor) attention",
        paper="Gerami, Hoover, Dulepet, Duraiswami, 'FAST: Factorizable Attention for Speeding up Transformers', "
              "2024, arXiv 2402.07901",
        official_code="armingerami/fastmax (test_fastmax.py)",
        forward=fastmax_forward, backward=fastmax_backward, sample=_sample, reference=_reference,
        checks={"moments_equal_explicit": _check_moments_equal_explicit,
                "gradcheck_every_option": _check_fd_every_option,
                "taylor_rate_against_softmax": _check_taylor_rate,
                "weights_convex_for_any_logit": _check_weights_convex},
        docs="linear/kernel-features.md#fastmax",
    ),
)
