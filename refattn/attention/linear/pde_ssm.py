r"""PDE-SSM spectral mixer: token mixing by a learnable convection–diffusion–reaction PDE solved
exactly in the Fourier domain (reconstruction from the abstract).

Gal, Eliasof, Rout & Haber, "PDE-SSM: A Spectral State Space Approach to Spatial Mixing in
Diffusion Transformers", 2026, arXiv 2603.13663. No code is public (searched GitHub by title,
slug and author names); only the abstract and the opening of the arXiv page were available. The
abstract defines the operator class — a learnable convection–diffusion–reaction PDE replacing
attention, solved in the Fourier domain in $O(N\log N)$ — but not its parameterisation or the
block around it. What is implemented here is the simplest reading, every choice marked
"reconstruction"; the surrounding DiT block (projections, gating, conditioning) is not provided.

Forward
-------
Tokens on a periodic grid of $n_d\in\{1,2\}$ axes with unit spacing, $x\in\mathbb R^{B\times n_1(\times
n_2)\times C}$; every channel $c$ is the initial condition of its own constant-coefficient PDE

$$\partial_\tau u = \nabla\cdot(D_c\nabla u) - v_c\cdot\nabla u + r_cu,\qquad u(0) = x_{:,c},$$

integrated to $\tau = t$ (keyword, default 1; reconstruction). With wave vectors
$k = 2\pi\,\mathrm{fftfreq}(n)$ per axis the solution operator is diagonal in Fourier space:

$$\hat u(k, t) = m_c(k)\,\hat u(k, 0),\qquad m_c(k) = \exp\big(t\,\sigma_c(k)\big),\qquad
\sigma_c(k) = -k^\top D_ck - i\,v_c\cdot k + r_c,$$

$y = \mathrm{Re}\,\mathrm{IFFT}(m\odot\mathrm{FFT}(x))$ (the real part only matters at the Nyquist
mode of an even axis, where $e^{-iv\cdot k}$ is not Hermitian). Parameters (reconstruction; names
refattn's): ``diffusion`` $A_c\in\mathbb R^{n_d\times n_d}$ with $D_c = A_cA_c^\top$ (positive
semi-definite, so the flow never amplifies beyond $e^{r_ct}$), ``velocity`` $v_c\in\mathbb R^{n_d}$,
``reaction`` $r_c$.

Explicit form: $y$ is the circular convolution of $x$ with the real kernel
$h_c = \mathrm{Re}\,\frac1N\sum_k m_c(k)e^{ik\cdot s}$, computed by direct sums in $O(N^2)$; it
equals the FFT form to round-off in the output and every gradient (registry reference and the
``fft_equals_explicit_convolution_grads`` check).

Backward
--------
The map is real-linear in $x$ with adjoint $\bar x = \mathrm{Re}\,\mathrm{IFFT}(\bar m\odot\mathrm{FFT}(\bar y))$
($\bar m$ the complex conjugate; the DFT matrix is symmetric and
$\overline{F} = NF^{-1}$). For the multiplier, with $\hat u = \mathrm{FFT}(x)$, $\hat g = \mathrm{FFT}(\bar y)$:
$\delta L = \mathrm{Re}\sum_k\delta m(k)\,w(k)$, $w = \hat u\,\overline{\hat g}/N$, and
$\delta m = t\,m\,\delta\sigma$, so
$\bar r_c = t\,\mathrm{Re}\sum_k m w$, $\bar v_{c,a} = t\,\mathrm{Re}\sum_k m w(-ik_a)$,
$\bar D_{c,ab} = -t\,\mathrm{Re}\sum_k m w\,k_ak_b$, and through $D = AA^\top$:
$\bar A = (\bar D + \bar D^\top)A$.

No upstream code exists to compare with; the checks are the explicit convolution, the PDE itself
($\partial y/\partial t = \mathrm{Re}\,\mathrm{IFFT}(\sigma m\hat u)$ by central differences in $t$,
$y(0) = x$), exact integer advection (``np.roll``), and mass balance
$\sum_sy = e^{r t}\sum_sx$.
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_params, check_positive
from ...registry import Mechanism, Sample, register

__all__ = ["pde_ssm_multiplier", "pde_ssm_mixer_forward", "pde_ssm_mixer_backward", "pde_ssm_mixer"]


def _wavevectors(grid):
    ks = np.meshgrid(*[2 * np.pi * np.fft.fftfreq(n) for n in grid], indexing="ij")
    return np.stack(ks, axis=-1)  # (*grid, nd)


def pde_ssm_multiplier(grid, diffusion, velocity, reaction, t: float = 1.0):
    r"""$m_c(k) = \exp(t(-k^\top A_cA_c^\top k - iv_c\cdot k + r_c))$, shape ``(*grid, C)`` (complex).
    Unvalidated."""
    k = _wavevectors(grid)
    D = diffusion @ np.swapaxes(diffusion, -1, -2)
    quad = np.einsum("...a,cab,...b->...c", k, D, k)
    sigma = -quad - 1j * (k @ velocity.T) + reaction
    return np.exp(t * sigma), sigma, k


def _axes(x):
    return tuple(range(1, x.ndim - 1))


def pde_ssm_mixer_forward(x, params, *, t: float = 1.0):
    r"""Spectral convection–diffusion–reaction mixing of ``x (B, n, C)`` or ``(B, n1, n2, C)``.

    ``params``: ``diffusion (C, nd, nd)`` (the factor $A_c$, $D_c = A_cA_c^\top$), ``velocity (C, nd)``,
    ``reaction (C,)``. ``t`` is the integration time. Returns ``(y, cache)``, ``y`` like ``x``."""
    x = as_float(x, "x")
    if x.ndim not in (3, 4):
        raise ValueError(f"x must be (B, n, C) or (B, n1, n2, C); got shape {x.shape}")
    t = check_positive(t, "t", allow_zero=True)
    C, nd = x.shape[-1], x.ndim - 2
    p = check_params(params, {"diffusion": (C, nd, nd), "velocity": (C, nd), "reaction": (C,)},
                     where="pde_ssm_spectral_mixer")
    p = cast_all(x.dtype, p)
    grid = x.shape[1:-1]
    m, sigma, k = pde_ssm_multiplier(grid, p["diffusion"], p["velocity"], p["reaction"], t)
    ax = _axes(x)
    uh = np.fft.fftn(x, axes=ax)
    y = np.real(np.fft.ifftn(m * uh, axes=ax)).astype(x.dtype, copy=False)
    return y, {"p": p, "m": m, "sigma": sigma, "k": k, "uh": uh, "t": t, "shape": x.shape, "dtype": x.dtype}


def pde_ssm_mixer_backward(dout, cache) -> dict:
    """Gradients of :func:`pde_ssm_mixer_forward` w.r.t. ``x``, ``diffusion``, ``velocity``, ``reaction``."""
    dt, shape = cache["dtype"], cache["shape"]
    g = as_dout(dout, shape, dt)
    m, k, uh, t, p = cache["m"], cache["k"], cache["uh"], cache["t"], cache["p"]
    ax = tuple(range(1, len(shape) - 1))
    gh = np.fft.fftn(g, axes=ax)
    dx = np.real(np.fft.ifftn(np.conj(m) * gh, axes=ax))
    N = int(np.prod(shape[1:-1]))
    w = np.sum(uh * np.conj(gh), axis=0) / N * m * t  # (*grid, C): dL = Re sum dsigma * w
    wf, kf = w.reshape(-1, w.shape[-1]), k.reshape(-1, k.shape[-1])
    dr = np.real(wf.sum(axis=0))
    dv = np.real(np.einsum("nc,na->ca", -1j * wf, kf))
    dD = -np.real(np.einsum("nc,na,nb->cab", wf, kf, kf))
    A = p["diffusion"]
    dA = (dD + np.swapaxes(dD, -1, -2)) @ A
    return {"x": dx.astype(dt, copy=False), "diffusion": dA.astype(dt), "velocity": dv.astype(dt),
            "reaction": dr.astype(dt)}


def pde_ssm_mixer(x, params, *, t: float = 1.0) -> np.ndarray:
    """Convenience wrapper: the output of :func:`pde_ssm_mixer_forward`."""
    return pde_ssm_mixer_forward(x, params, t=t)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _explicit_kernel(grid, p, t):
    """$h_c(s) = \\mathrm{Re}\\,\\frac1N\\sum_k m_c(k)e^{ik\\cdot s}$ by a direct sum over k (no FFT)."""
    m, _, k = pde_ssm_multiplier(grid, p["diffusion"], p["velocity"], p["reaction"], t)
    pos = np.stack(np.meshgrid(*[np.arange(n) for n in grid], indexing="ij"), -1).reshape(-1, len(grid))
    kk, mm = k.reshape(-1, len(grid)), m.reshape(-1, m.shape[-1])
    phase = np.exp(1j * pos @ kk.T)  # (N_s, N_k)
    return np.real(phase @ mm / len(kk)).reshape(tuple(grid) + (m.shape[-1],))


def _reference_pde_ssm(x, params, *, t=1.0):
    """Dense circular convolution $y(s) = \\sum_{s'}h(s - s')x(s')$ with the explicit kernel."""
    grid = x.shape[1:-1]
    h = _explicit_kernel(grid, params, t)
    pos = np.stack(np.meshgrid(*[np.arange(n) for n in grid], indexing="ij"), -1).reshape(-1, len(grid))
    diff = (pos[:, None, :] - pos[None, :, :]) % np.array(grid)
    H = h[tuple(diff[..., a] for a in range(len(grid)))]  # (N, N, C)
    xf = x.reshape(x.shape[0], -1, x.shape[-1])
    return np.einsum("stc,btc->bsc", H, xf).reshape(x.shape)


def _pde_params(rng, C, nd):
    return {"diffusion": 0.5 * rng.standard_normal((C, nd, nd)), "velocity": rng.standard_normal((C, nd)),
            "reaction": 0.3 * rng.standard_normal(C)}


def _sample_pde_ssm(rng, size):
    if size == "tiny":
        return Sample(inputs={"x": rng.standard_normal((2, 3, 4, 2))}, params=_pde_params(rng, 2, 2), config={"t": 0.7})
    return Sample(inputs={"x": rng.standard_normal((2, 6, 5, 3))}, params=_pde_params(rng, 3, 2), config={"t": 1.0})


def _check_explicit_grads(rng):
    """1-D and 2-D grids (even and odd sizes): output equals the explicit convolution, the
    x-gradient equals the transposed dense operator applied to the cotangent, and the parameter
    gradients equal central differences of the explicit form (max relative error returned)."""
    err_exact, err_fd = 0.0, 0.0
    for shape in ((2, 6, 2), (2, 4, 3, 2)):
        nd = len(shape) - 2
        x = rng.standard_normal(shape)
        p = _pde_params(rng, 2, nd)
        y, cache = pde_ssm_mixer_forward(x, p, t=0.8)
        err_exact = max(err_exact, float(np.abs(y - _reference_pde_ssm(x, p, t=0.8)).max()))
        g = rng.standard_normal(shape)
        grads = pde_ssm_mixer_backward(g, cache)
        xg = np.zeros_like(x)
        for idx in np.ndindex(x.shape):
            e = np.zeros_like(x)
            e[idx] = 1.0
            xg[idx] = np.sum(g * _reference_pde_ssm(e, p, t=0.8))
        err_exact = max(err_exact, float(np.abs(xg - grads["x"]).max()))
        for key in p:
            fd = np.zeros_like(p[key])
            for idx in np.ndindex(p[key].shape):
                hi, lo = {k: v.copy() for k, v in p.items()}, {k: v.copy() for k, v in p.items()}
                hi[key][idx] += 1e-6
                lo[key][idx] -= 1e-6
                fd[idx] = np.sum(g * (_reference_pde_ssm(x, hi, t=0.8) - _reference_pde_ssm(x, lo, t=0.8))) / 2e-6
            err_fd = max(err_fd, float(np.abs(fd - grads[key]).max() / np.abs(fd).max()))
    assert err_exact < 1e-12 and err_fd < 1e-7, (err_exact, err_fd)
    return max(err_exact, err_fd)


def _check_solves_the_pde(rng):
    """$y(0) = x$ and $\\partial y/\\partial t = \\mathrm{Re}\\,\\mathrm{IFFT}(\\sigma m\\hat x)$, the spectral
    right-hand side (central differences in t; an even axis makes the Nyquist mode's odd part drop out)."""
    x = rng.standard_normal((1, 5, 6, 2))
    p = _pde_params(rng, 2, 2)
    err = float(np.abs(pde_ssm_mixer(x, p, t=0.0) - x).max())
    t, h = 0.6, 1e-5
    dydt = (pde_ssm_mixer(x, p, t=t + h) - pde_ssm_mixer(x, p, t=t - h)) / (2 * h)
    y, cache = pde_ssm_mixer_forward(x, p, t=t)
    rhs = np.real(np.fft.ifftn(cache["sigma"] * cache["m"] * cache["uh"], axes=(1, 2)))
    err = max(err, float(np.abs(dydt - rhs).max()))
    assert err < 1e-8, err
    return err


def _check_integer_advection_is_a_roll(rng):
    """$D = 0$, $r = 0$, $v = (1, -2)$, $t = 1$: the flow shifts every channel by $(1, -2)$ grid cells."""
    x = rng.standard_normal((2, 4, 6, 1))
    p = {"diffusion": np.zeros((1, 2, 2)), "velocity": np.array([[1.0, -2.0]]), "reaction": np.zeros(1)}
    err = float(np.abs(pde_ssm_mixer(x, p) - np.roll(x, (1, -2), axis=(1, 2))).max())
    assert err < 1e-13, err
    return err


def _check_mass_balance(rng):
    """The zero mode only sees the reaction: $\\sum_s y = e^{rt}\\sum_s x$ per channel."""
    x = rng.standard_normal((2, 7, 3))
    p = _pde_params(rng, 3, 1)
    y = pde_ssm_mixer(x, p, t=1.3)
    err = float(np.abs(y.sum(1) - np.exp(1.3 * p["reaction"]) * x.sum(1)).max())
    assert err < 1e-12, err
    return err


register(
    Mechanism(
        slug="pde_ssm_spectral_mixer", family="4-linear-kernel-sparse", tier="T3",
        title="PDE-SSM: convection–diffusion–reaction spectral mixer",
        paper="Gal, Eliasof, Rout & Haber, 'PDE-SSM: A Spectral State Space Approach to Spatial Mixing in Diffusion "
              "Transformers', 2026, arXiv 2603.13663",
        forward=pde_ssm_mixer_forward, backward=pde_ssm_mixer_backward, sample=_sample_pde_ssm,
        reference=_reference_pde_ssm,
        checks={"fft_equals_explicit_convolution_grads": _check_explicit_grads,
                "solves_the_pde": _check_solves_the_pde,
                "integer_advection_is_a_roll": _check_integer_advection_is_a_roll,
                "mass_balance": _check_mass_balance},
        docs="linear/l6b.md#pde-ssm-spectral-mixer",
    ),
)
