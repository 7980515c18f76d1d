r"""Multiwavelet neural operator (MWT): Legendre/Chebyshev multiwavelet filters, the multiwavelet
transform and the 1-D ``MWT_CZ1d`` layer.

Paper: Gupta, Xiao, Bogdan, "Multiwavelet-based Operator Learning for Differential Equations",
NeurIPS 2021, arXiv 2109.13459. Upstream: gaurav71531/mwt-operator ``models/utils.py``
(``get_phi_psi``, ``get_filter``) and ``models/models.py`` (``sparseKernelFT1d``, ``MWT_CZ1d``)
@ 4b0770c0987a325b5a18775a0bdb63ab6d69435e; the port in neuraloperator's ``mwno_block.py``
(pull request 636 @ e05286707834af2e64bcce01aeb799915aa7ca68) builds the same filters.

Filters (the paper's construction, Alpert's multiwavelets)
----------------------------------------------------------
Scaling functions of order $k$ on $[0, 1]$: Legendre $\varphi_i(x) = \sqrt{2i+1}\,P_i(2x-1)$
(orthonormal in $L^2[0,1]$) or Chebyshev $\varphi_0 = \sqrt{2/\pi}$,
$\varphi_i = \tfrac{2}{\sqrt\pi}T_i(2x-1)$ (orthonormal for the weight $1/\sqrt{1-(2x-1)^2}$),
$i < k$. The multiwavelets $\psi_i$ are piecewise polynomials of degree $< k$ on $[0,\tfrac12]$
and $(\tfrac12, 1]$: Gram-Schmidt of $v_i = \sqrt2\,\varphi_i(2x)\,\mathbb 1_{[0,1/2]}$ against
$\{\varphi_j\}$ and $\{\psi_{j<i}\}$, normalised. The two-scale filters are

$$H^0_{ij} = \tfrac{1}{\sqrt2}\textstyle\sum_m w_m\,\varphi_i(\tfrac{x_m}{2})\varphi_j(x_m),\quad
H^1_{ij} = \tfrac{1}{\sqrt2}\sum_m w_m\,\varphi_i(\tfrac{x_m+1}{2})\varphi_j(x_m),$$

and $G^0, G^1$ alike with $\psi_i$ in place of $\varphi_i$. Legendre: $(x_m, w_m)$ is $k$-point
Gauss-Legendre on $[0,1]$ and the inner products are exact integrals, so
$\begin{bmatrix}H^0&H^1\\G^0&G^1\end{bmatrix}$ is orthogonal. Chebyshev: $2k$-point
Gauss-Chebyshev nodes, $w_m = \pi/4k$, and *every* inner product (also the Gram-Schmidt) is that
discrete one, as upstream; the transform is then not orthogonal and the reconstruction carries
the correction $\Phi^0_{ij} = 2\sum_m w_m\varphi_i(2x_m)\varphi_j(2x_m)$,
$\Phi^1_{ij} = 2\sum_m w_m\varphi_i(2x_m-1)\varphi_j(2x_m-1)$ ($\Phi = I$ for Legendre).

Each $\psi_i$ is stored by its coefficients in the Chebyshev basis of each half interval (fitted
at $k$ Chebyshev points, exact for degree $< k$), Gram-Schmidt runs twice ("twice is enough") in
float64. Upstream works with power-basis coefficients and zeroes entries below $10^{-8}$; its
filters agree with these to $2\cdot10^{-13}$ ($k\le3$), $2\cdot10^{-9}$ ($k=4,5$) and
$8\cdot10^{-7}$ ($k=6$); beyond that upstream's power basis breaks down (at $k=8$ its Legendre
filters differ by 0.4 and are no longer orthogonal) while these stay orthogonal to $10^{-14}$.

Transform (one level, upstream ``wavelet_transform`` / ``evenOdd``)
-------------------------------------------------------------------
For coefficients $x\in\mathbb R^{B\times N\times c\times k}$ with $N$ even (row vectors):

$$s_l = x_{2l}H^{0\top} + x_{2l+1}H^{1\top},\qquad d_l = x_{2l}G^{0\top} + x_{2l+1}G^{1\top},$$

$$x_{2l} = (s_lH^0 + d_lG^0)\,\Phi^0,\qquad x_{2l+1} = (s_lH^1 + d_lG^1)\,\Phi^1 .$$

Perfect reconstruction holds for both bases (checked to $10^{-12}$ for $k\le 5$).

Layer (``MWT_CZ1d``)
--------------------
With $n_s = \lfloor\log_2N\rfloor$ and $L$ coarse levels kept: for $i = 0..n_s-L-1$ decompose
$s^{i+1}, d^{i+1}$ from $s^i$ ($s^0 = x$) and form $U_d^i = A(d^{i+1}) + B(s^{i+1})$,
$U_s^i = C(d^{i+1})$; at the coarsest scale $\hat s = T_0(s^{n_s-L})$ (``nn.Linear(k, k)`` on the
last axis); then for $i$ from $n_s-L-1$ down to 0 reconstruct from $(\hat s + U_s^i, U_d^i)$.
$A, B, C$ are ``sparseKernelFT1d``: the $c\cdot k$ values of a position form the channels, and
$K(u) = \mathrm{irfft}(W_{:,:,:\ell}\cdot\mathrm{rfft}(u))$ with $\ell = \min(\alpha, n/2+1)$ modes
of the level's length $n$ — refattn's :func:`fno_spectral_conv_forward` on the truncated weights.

Backward
--------
Every step is linear except the spectral kernels, whose VJP is
:func:`fno_spectral_conv_backward` (its gradient lands in the first $\ell$ modes of the weight).
Reconstruction: $\bar y = \bar x_{\text{even}}\,(\,[H^0;G^0]\Phi^0)^\top + \bar x_{\text{odd}}
([H^1;G^1]\Phi^1)^\top$ split into $\bar{\hat s}$ (flows down unchanged, and into $\bar U_s$) and
$\bar U_d$. $T_0$: $\bar W = s^\top\bar{\hat s}$, $\bar b = \sum\bar{\hat s}$,
$\bar s = \bar{\hat s}W^\top$. Decomposition: $\bar d = \bar U_dA^* + \bar U_sC^*$,
$\bar s \mathrel{+}= \bar U_dB^*$, and $\bar x_{2l} = \bar s_lH^0 + \bar d_lG^0$,
$\bar x_{2l+1} = \bar s_lH^1 + \bar d_lG^1$ (the transposes of the analysis matrices).

Conventions
-----------
* Layout as upstream: ``x (B, N, c, k)``, $N$ a power of two; ``k`` and ``c`` are read from x.
* Parameters: ``{A,B,C}.weights1_real/_imag (c*k, c*k, alpha)`` = upstream's complex
  ``weights1`` (``.real``, ``.imag``); ``T0.weight (k, k)`` = ``T0.weight.T``; ``T0.bias``.
* ``base``: ``"legendre"`` (upstream default) or ``"chebyshev"``; ``L`` coarse levels (default 0).
* The 2-D/3-D layers (``MWT_CZ2d/3d``: Kronecker filters, FFT kernel + ReLU + Linear for $A$,
  3x3 conv + ReLU + Linear for $B, C$) are not implemented; the 1-D layer is the paper's operator
  for the Burgers/KdV experiments.

Agreement with upstream: see ``docs/operators/convolutional-and-wavelet-operators.md``.
"""

from __future__ import annotations

import functools

import numpy as np
from numpy.polynomial import chebyshev as _cheb
from numpy.polynomial import legendre as _leg

from .._checks import as_dout, as_float, cast_all, check_choice, check_int, check_params, compute_dtype
from ..registry import Mechanism, Sample, register
from .fno import fno_spectral_conv_backward, fno_spectral_conv_explicit, fno_spectral_conv_forward

__all__ = ["multiwavelet_filters", "mwt_decompose", "mwt_reconstruct", "mwt_cz1d_forward", "mwt_cz1d_backward",
           "mwt_cz1d", "init_mwt_cz1d_params"]

BASES = ("legendre", "chebyshev")
_KERNELS = ("A", "B", "C")


# --------------------------------------------------------------------------------------------
# Filters


def _scaling(base: str, k: int, x) -> np.ndarray:
    """$\\varphi_i(x)$, ``(k, len(x))``, zero outside $[0, 1]$ (upstream ``phi_``'s mask)."""
    x = np.asarray(x, dtype=np.float64)
    t = 2.0 * x - 1.0
    if base == "legendre":
        v = _leg.legvander(t, k - 1) * np.sqrt(2.0 * np.arange(k) + 1.0)
    else:
        v = _cheb.chebvander(t, k - 1) * (2.0 / np.sqrt(np.pi))
        v[:, 0] = np.sqrt(2.0 / np.pi)
    return (v * ((x >= 0) & (x <= 1))[:, None]).T


def _pieces(coef: np.ndarray, x, k: int) -> np.ndarray:
    """Piecewise polynomials from Chebyshev coefficients on $[0,\\frac12]$ (first k) and
    $(\\frac12, 1]$ (last k), evaluated at ``x``: ``(m, len(x))``."""
    x = np.asarray(x, dtype=np.float64)
    left = (x >= 0) & (x <= 0.5)
    right = (x > 0.5) & (x <= 1)
    vl = _cheb.chebvander(4.0 * x - 1.0, k - 1) * left[:, None]
    vr = _cheb.chebvander(4.0 * x - 3.0, k - 1) * right[:, None]
    return coef[:, :k] @ vl.T + coef[:, k:] @ vr.T


@functools.lru_cache(maxsize=64)
def _filters(k: int, base: str):
    theta = np.pi * (np.arange(k) + 0.5) / k
    nl, nr = (1 + np.cos(theta)) / 4, (3 + np.cos(theta)) / 4      # Chebyshev points of each half
    vl, vr = _cheb.chebvander(4 * nl - 1, k - 1), _cheb.chebvander(4 * nr - 3, k - 1)

    def fit(fl, fr):
        return np.concatenate([np.linalg.solve(vl, fl.T).T, np.linalg.solve(vr, fr.T).T], axis=1)

    phi = fit(_scaling(base, k, nl), _scaling(base, k, nr))
    start = fit(np.sqrt(2.0) * _scaling(base, k, 2 * nl), np.zeros((k, k)))
    if base == "legendre":
        g, w = _leg.leggauss(k)
        qn, qw = np.concatenate([(1 + g) / 4, (3 + g) / 4]), np.concatenate([w / 4, w / 4])   # exact per half
        fn, fw = (1 + g) / 2, w / 2
    else:
        m = np.arange(1, 2 * k + 1)
        qn = (1 + np.cos((2 * m - 1) * np.pi / (4 * k))) / 2
        qw = np.full(2 * k, np.pi / (4 * k))
        fn, fw = qn, qw
    ev = _pieces(np.eye(2 * k), qn, k)
    gram = (ev * qw) @ ev.T
    psi = np.zeros((k, 2 * k))
    for i in range(k):
        v = start[i]
        for _ in range(2):
            v = v - (v @ gram @ phi.T) @ phi - (v @ gram @ psi[:i].T) @ psi[:i]
        psi[i] = v / np.sqrt(v @ gram @ v)
    ph = functools.partial(_scaling, base, k)
    r2 = np.sqrt(2.0)
    out = {"H0": (ph(fn / 2) * fw) @ ph(fn).T / r2, "H1": (ph((fn + 1) / 2) * fw) @ ph(fn).T / r2,
           "G0": (_pieces(psi, fn / 2, k) * fw) @ ph(fn).T / r2,
           "G1": (_pieces(psi, (fn + 1) / 2, k) * fw) @ ph(fn).T / r2}
    if base == "legendre":
        out["PHI0"] = out["PHI1"] = np.eye(k)
    else:
        out["PHI0"] = 2 * (ph(2 * fn) * fw) @ ph(2 * fn).T
        out["PHI1"] = 2 * (ph(2 * fn - 1) * fw) @ ph(2 * fn - 1).T
    return out


def multiwavelet_filters(k: int, base: str = "legendre") -> dict:
    r"""The two-scale filters ``{"H0", "H1", "G0", "G1", "PHI0", "PHI1"}``, each ``(k, k)`` float64
    (upstream ``get_filter(base, k)``; module docstring). Fresh copies on every call."""
    k = check_int(k, "k", minimum=1)
    check_choice(base, "base", BASES)
    return {name: a.copy() for name, a in _filters(k, base).items()}


def _analysis(f: dict):
    """``ec_s (2k, k)``, ``ec_d``, ``rc_e``, ``rc_o`` as upstream's buffers."""
    return (np.concatenate([f["H0"].T, f["H1"].T]), np.concatenate([f["G0"].T, f["G1"].T]),
            np.concatenate([f["H0"] @ f["PHI0"], f["G0"] @ f["PHI0"]]),
            np.concatenate([f["H1"] @ f["PHI1"], f["G1"] @ f["PHI1"]]))


def mwt_decompose(x: np.ndarray, filters: dict):
    """One analysis level on axis 1 of ``x (B, N, ..., k)`` (N even): returns ``(d, s)``, each
    ``(B, N/2, ..., k)``. Unvalidated helper (``filters`` from :func:`multiwavelet_filters`)."""
    ec_s, ec_d, _, _ = (m.astype(x.dtype, copy=False) for m in _analysis(filters))
    xa = np.concatenate([x[:, ::2], x[:, 1::2]], axis=-1)
    return xa @ ec_d, xa @ ec_s


def mwt_reconstruct(s: np.ndarray, d: np.ndarray, filters: dict) -> np.ndarray:
    """One synthesis level (upstream ``evenOdd`` of ``cat(s, d)``): ``(B, n, ..., k) -> (B, 2n, ..., k)``."""
    _, _, rc_e, rc_o = (m.astype(s.dtype, copy=False) for m in _analysis(filters))
    y = np.concatenate([s, d], axis=-1)
    out = np.empty((s.shape[0], 2 * s.shape[1]) + s.shape[2:], dtype=s.dtype)
    out[:, ::2] = y @ rc_e
    out[:, 1::2] = y @ rc_o
    return out


# --------------------------------------------------------------------------------------------
# The MWT_CZ1d layer


def _validate(x, params, base, L):
    x = as_float(x, "x", ndim=4)
    b, n, c, k = x.shape
    check_choice(base, "base", BASES)
    L = check_int(L, "L", minimum=0)
    ns = int(np.floor(np.log2(n)))
    if 2 ** ns != n:
        raise ValueError(f"x axis 1 (N) must be a power of two (the transform halves it {ns} times); got N={n}")
    if L > ns:
        raise ValueError(f"L (coarse levels kept) must be <= log2(N) = {ns}; got L={L}")
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of arrays; got {type(params).__name__}")
    w0 = params.get("A.weights1_real")
    alpha = as_float(w0, "A.weights1_real", ndim=3).shape[2] if w0 is not None else 1
    spec = {f"{m}.weights1_{p}": (c * k, c * k, alpha) for m in _KERNELS for p in ("real", "imag")}
    spec.update({"T0.weight": (k, k), "T0.bias": (k,)})
    p = check_params(params, spec, where="mwt_cz1d")
    dt = compute_dtype(x, *p.values())
    return x.astype(dt, copy=False), cast_all(dt, p), ns, L, alpha, dt


def _kernel(p, name, u, alpha):
    """``sparseKernelFT1d`` on ``u (B, n, c, k)``: the first min(alpha, n/2+1) modes."""
    b, n = u.shape[:2]
    ell = min(alpha, n // 2 + 1)
    w = {f"weights1_{q}": p[f"{name}.weights1_{q}"][:, :, :ell] for q in ("real", "imag")}
    y, cache = fno_spectral_conv_forward(u.reshape(b, n, -1), w)
    return y.reshape(u.shape), (cache, ell)


def mwt_cz1d_forward(x, params, *, base: str = "legendre", L: int = 0):
    r"""One multiwavelet layer (upstream ``MWT_CZ1d``; math in the module docstring).

    Parameters
    ----------
    x : array (B, N, c, k)
        Multiwavelet coefficients, ``N`` a power of two (upstream layout).
    params : dict
        ``A/B/C.weights1_real``, ``A/B/C.weights1_imag`` ``(c*k, c*k, alpha)`` (real and imaginary
        parts of upstream's complex ``weights1``), ``T0.weight (k, k)`` (= ``T0.weight.T``),
        ``T0.bias (k,)``. :func:`init_mwt_cz1d_params` builds them.
    base : {"legendre", "chebyshev"}
        Multiwavelet family (upstream default ``"legendre"``).
    L : int
        Coarse levels kept: ``log2(N) - L`` decompositions (upstream default 0).

    Returns
    -------
    out, cache
        ``out (B, N, c, k)``.
    """
    x, p, ns, L, alpha, dt = _validate(x, params, base, L)
    f = {key: v.astype(dt) for key, v in _filters(x.shape[3], base).items()}
    s = x
    levels = []
    for _ in range(ns - L):
        d, s = mwt_decompose(s, f)
        a, ca = _kernel(p, "A", d, alpha)
        bb, cb = _kernel(p, "B", s, alpha)
        cc, ccc = _kernel(p, "C", d, alpha)
        levels.append({"Ud": a + bb, "Us": cc, "caches": (ca, cb, ccc)})
    s_coarse = s
    s = s @ p["T0.weight"] + p["T0.bias"]
    for i in range(ns - L - 1, -1, -1):
        s = mwt_reconstruct(s + levels[i]["Us"], levels[i]["Ud"], f)
    cache = {"p": p, "f": f, "levels": [lv["caches"] for lv in levels], "s_coarse": s_coarse, "shape": x.shape,
             "dt": dt, "alpha": alpha}
    return s, cache


def _kernel_vjp(grads, name, dy, kc, alpha):
    cache, ell = kc
    b, n = dy.shape[:2]
    g = fno_spectral_conv_backward(dy.reshape(b, n, -1), cache)
    for q in ("real", "imag"):
        key = f"{name}.weights1_{q}"
        grads[key][:, :, :ell] += g[f"weights1_{q}"]
    return g["x"].reshape(dy.shape)


def mwt_cz1d_backward(dout, cache):
    """Gradients of :func:`mwt_cz1d_forward`: ``x``, ``A/B/C.weights1_real/_imag``, ``T0.weight``,
    ``T0.bias`` (module docstring)."""
    p, f, dt = cache["p"], cache["f"], cache["dt"]
    g = as_dout(dout, cache["shape"], dt)
    ec_s, ec_d, rc_e, rc_o = _analysis(f)
    grads = {k: np.zeros_like(v) for k, v in p.items()}
    k = cache["shape"][3]
    n_lev = len(cache["levels"])
    d_ud, d_us = [None] * n_lev, [None] * n_lev
    for i in range(n_lev):                                   # reconstruction, fine to coarse
        dy = g[:, ::2] @ rc_e.T + g[:, 1::2] @ rc_o.T
        g, d_ud[i] = dy[..., :k], dy[..., k:]
        d_us[i] = g
    s_c = cache["s_coarse"]
    grads["T0.weight"] = s_c.reshape(-1, k).T @ g.reshape(-1, k)
    grads["T0.bias"] = g.reshape(-1, k).sum(axis=0)
    gs = g @ p["T0.weight"].T
    for i in range(n_lev - 1, -1, -1):                       # decomposition, coarse to fine
        ca, cb, cc = cache["levels"][i]
        dd = _kernel_vjp(grads, "A", d_ud[i], ca, cache["alpha"]) + _kernel_vjp(grads, "C", d_us[i], cc, cache["alpha"])
        gs = gs + _kernel_vjp(grads, "B", d_ud[i], cb, cache["alpha"])
        dxa = dd @ ec_d.T + gs @ ec_s.T
        prev = np.empty((dxa.shape[0], 2 * dxa.shape[1]) + dxa.shape[2:-1] + (k,), dtype=dt)
        prev[:, ::2], prev[:, 1::2] = dxa[..., :k], dxa[..., k:]
        gs = prev
    grads["x"] = gs
    return grads


def mwt_cz1d(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`mwt_cz1d_forward`."""
    return mwt_cz1d_forward(x, params, **config)[0]


def init_mwt_cz1d_params(rng, k: int = 3, alpha: int = 5, c: int = 1, *, dtype=np.float64) -> dict:
    """Parameters as ``MWT_CZ1d(k, alpha, c=c)`` initialises them: ``scale * torch.rand`` complex
    weights (real and imaginary parts uniform on ``[0, scale)``, ``scale = 1/(ck)^2``) and
    PyTorch's default ``nn.Linear(k, k)``."""
    k, alpha, c = (check_int(v, nm, minimum=1) for v, nm in ((k, "k"), (alpha, "alpha"), (c, "c")))
    scale = 1.0 / (c * k) ** 2
    p = {f"{m}.weights1_{q}": scale * rng.random((c * k, c * k, alpha)) for m in _KERNELS for q in ("real", "imag")}
    bound = 1.0 / np.sqrt(k)
    p["T0.weight"] = rng.uniform(-bound, bound, (k, k))
    p["T0.bias"] = rng.uniform(-bound, bound, k)
    return {key: v.astype(dtype) for key, v in p.items()}


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size):
    if size == "tiny":
        n, c, k, alpha, L, base = 4, 1, 2, 2, 0, "legendre"
    else:
        n, c, k, alpha, L = 16, 2, 3, 3, int(rng.integers(0, 2))
        base = BASES[int(rng.integers(0, 2))]
    params = {f"{m}.weights1_{q}": rng.standard_normal((c * k, c * k, alpha)) / (c * k)
              for m in _KERNELS for q in ("real", "imag")}
    params["T0.weight"] = rng.standard_normal((k, k)) / np.sqrt(k)
    params["T0.bias"] = rng.standard_normal(k)
    return Sample(inputs={"x": rng.standard_normal((2, n, c, k))}, params=params, config={"base": base, "L": L})


def _reference(x, params, *, base="legendre", L=0):
    # Explicit form: the transform written per position with the filter matrices, the kernels as
    # explicit DFT sums (fno_spectral_conv_explicit), levels kept in plain lists.
    f = multiwavelet_filters(x.shape[3], base)
    b, n, c, k = x.shape
    alpha = params["A.weights1_real"].shape[2]

    def kern(name, u):
        ell = min(alpha, u.shape[1] // 2 + 1)
        w = {f"weights1_{q}": params[f"{name}.weights1_{q}"][:, :, :ell] for q in ("real", "imag")}
        return fno_spectral_conv_explicit(u.reshape(b, u.shape[1], -1), w).reshape(u.shape)

    s, ud, us = x, [], []
    for _ in range(int(np.log2(n)) - L):
        m = s.shape[1] // 2
        s_new = np.stack([s[:, 2 * j] @ f["H0"].T + s[:, 2 * j + 1] @ f["H1"].T for j in range(m)], axis=1)
        d_new = np.stack([s[:, 2 * j] @ f["G0"].T + s[:, 2 * j + 1] @ f["G1"].T for j in range(m)], axis=1)
        ud.append(kern("A", d_new) + kern("B", s_new))
        us.append(kern("C", d_new))
        s = s_new
    s = s @ params["T0.weight"] + params["T0.bias"]
    for i in reversed(range(len(ud))):
        s = s + us[i]
        rows = []
        for j in range(s.shape[1]):
            rows.append((s[:, j] @ f["H0"] + ud[i][:, j] @ f["G0"]) @ f["PHI0"])
            rows.append((s[:, j] @ f["H1"] + ud[i][:, j] @ f["G1"]) @ f["PHI1"])
        s = np.stack(rows, axis=1)
    return s


def _check_perfect_reconstruction(rng):
    # Full multi-level analysis followed by synthesis returns the input, both bases, k = 1..5.
    worst = 0.0
    for base in BASES:
        for k in range(1, 6):
            f = multiwavelet_filters(k, base)
            x = rng.standard_normal((2, 16, 3, k))
            s, ds = x, []
            for _ in range(4):
                d, s = mwt_decompose(s, f)
                ds.append(d)
            for d in reversed(ds):
                s = mwt_reconstruct(s, d, f)
            worst = max(worst, float(np.abs(s - x).max()))
    assert worst < 1e-12, f"multiwavelet analysis + synthesis misses the input by {worst:.2e}"
    return worst


def _check_legendre_orthonormal(rng):
    # [[H0, H1], [G0, G1]] is orthogonal for Legendre multiwavelets (k up to 8), and k = 1 is Haar.
    worst = 0.0
    for k in range(1, 9):
        f = multiwavelet_filters(k, "legendre")
        m = np.block([[f["H0"], f["H1"]], [f["G0"], f["G1"]]])
        worst = max(worst, float(np.abs(m @ m.T - np.eye(2 * k)).max()))
    assert worst < 1e-13, f"Legendre two-scale matrix is not orthogonal: {worst:.2e}"
    f = multiwavelet_filters(1, "legendre")
    haar = np.array([[1.0, 1.0], [1.0, -1.0]]) / np.sqrt(2.0)
    err = float(np.abs(np.block([[f["H0"], f["H1"]], [f["G0"], f["G1"]]]) - haar).max())
    assert err < 1e-15, f"k = 1 Legendre filters are not the Haar filters: {err:.2e}"
    return max(worst, err)


def _check_two_scale_projection(rng):
    # Resolution consistency of the transform (Legendre): the exact projections of a smooth f onto
    # the scaling functions of level n+1 are mapped by one analysis step to those of level n.
    k, nq = 4, 24
    g, w = _leg.leggauss(nq)
    func = lambda t: np.sin(3 * t) + t ** 5                                     # noqa: E731

    def proj(level):
        m = 2 ** level
        cells = []
        for j in range(m):
            t = (j + (1 + g) / 2) / m
            cells.append((np.sqrt(m) * _scaling("legendre", k, (1 + g) / 2) * (w / 2 / m)) @ func(t))
        return np.stack(cells)[None, :, None, :]

    d, s = mwt_decompose(proj(5), multiwavelet_filters(k, "legendre"))
    err = float(np.abs(s - proj(4)).max())
    assert err < 1e-13, f"two-scale relation violated by {err:.2e}"
    return err


def _check_identity_paths(rng):
    # A = identity on every retained mode (all modes kept), B = C = 0, T0 = identity: the layer
    # passes the details through untouched and reproduces its input exactly.
    c, k, n = 2, 3, 8
    x = rng.standard_normal((2, n, c, k))
    eye = np.repeat(np.eye(c * k)[:, :, None], n // 2 + 1, axis=2)
    p = {f"{m}.weights1_{q}": np.zeros_like(eye) for m in _KERNELS for q in ("real", "imag")}
    p["A.weights1_real"] = eye
    p["T0.weight"], p["T0.bias"] = np.eye(k), np.zeros(k)
    err = max(float(np.abs(mwt_cz1d(x, p, base=base) - x).max()) for base in BASES)
    assert err < 1e-12, f"identity-path layer changes its input by {err:.2e}"
    return err


register(
    Mechanism(
        slug="multiwavelet_operator", family="3-operator", tier="T2",
        title="Multiwavelet neural operator (MWT): Legendre/Chebyshev multiwavelet filters and the MWT_CZ1d layer",
        paper="Gupta, Xiao, Bogdan, Multiwavelet-based Operator Learning for Differential Equations, NeurIPS 2021, "
              "arXiv 2109.13459",
        forward=mwt_cz1d_forward, backward=mwt_cz1d_backward, sample=_sample, reference=_reference,
        docs="operators/convolutional-and-wavelet-operators.md#multiwavelet-operator",
        checks={"perfect_reconstruction": _check_perfect_reconstruction,
                "legendre_orthonormal_and_haar": _check_legendre_orthonormal,
                "two_scale_projection": _check_two_scale_projection,
                "identity_paths_reproduce_input": _check_identity_paths},
    ),
)
