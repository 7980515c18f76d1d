r"""Fourier-space operator layers: the FNO spectral convolution and the AFNO / DPOT Fourier mixer.

Both layers act on a grid function stored channel-last, ``x (B, n_1[, n_2], C)`` (the upstream
PyTorch modules are channel-first ``(B, C, n_1, n_2)``; permute with ``x.permute(0, 2, 3, 1)``).
The FFT runs over the spatial axes; the *last* spatial axis is the halved (``rfft``) axis.

Real-FFT adjoints (the shared core of both backwards)
-----------------------------------------------------
Write $N = \prod_a n_a$ and, for an FFT normalisation ``norm``, the forward scale
$\alpha$ (``"backward"``: 1, ``"ortho"``: $N^{-1/2}$, ``"forward"``: $N^{-1}$) and the inverse
scale $\beta$ (``"backward"``: $N^{-1}$, ``"ortho"``: $N^{-1/2}$, ``"forward"``: 1). A complex
intermediate $Z = A + iB$ carries the gradient $\bar Z = \partial L/\partial A + i\,\partial L/\partial B$,
so that $\delta L = \operatorname{Re}\sum \overline{\bar Z}\,\delta Z$.

*Inverse real FFT.* $y_t = \beta\sum_{k_1,\dots}\,c_{k_d}\operatorname{Re}\big(Y_k e^{i\theta_k\cdot t}\big)$
where $k_d$ runs over the kept half $0..\lfloor n_d/2\rfloor$ of the last axis and
$c = (1, 2, \dots, 2, 1)$ (the last 1 only for even $n_d$: the Nyquist bin has no mirror image).
Differentiating,

$$\bar Y = \beta\, c \odot \operatorname{rfftn}_{\text{unnorm}}(\bar y).$$

The imaginary parts of DC/Nyquist bins along the halved axis are discarded by ``irfft``; the formula
gives them zero gradient automatically (in 1-D; in 2-D they do matter for $k_1 \ne 0$ and the
formula gives them the right non-zero gradient).

*Forward real FFT.* $X_k = \alpha\sum_t x_t e^{-i\theta_k\cdot t}$ for $k_d \le n_d/2$, so
$\delta L = \operatorname{Re}\sum_k \overline{\bar X_k}\,\delta X_k$ gives
$\bar x_t = \alpha\operatorname{Re}\sum_k \bar X_k e^{+i\theta_k\cdot t}$ over the *half* spectrum,
which is an unnormalised ``irfftn`` of $\bar X$ with the mirror weighting undone:

$$\bar x = \alpha N\,\operatorname{irfftn}_{\text{backward}}(\bar X\odot w),\qquad w = 1/c = (1,\tfrac12,\dots,\tfrac12,1).$$

Forgetting $c$ (or $w$) is the classic bug; :func:`_check_rfft_adjoints` tests both identities
$\langle \mathcal F x, Y\rangle = \langle x, \mathcal F^* Y\rangle$ for every norm and odd/even sizes.

*Complex-linear maps.* For $Y = XW$ (complex, per mode) $\bar X = \bar Y\,W^{H}$ and
$\bar W = X^{H}\bar Y$; a complex weight stored as real/imaginary float arrays
$W = W_r + iW_i$ gets $\partial L/\partial W_r = \operatorname{Re}\bar W$,
$\partial L/\partial W_i = \operatorname{Im}\bar W$.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_choice, check_int, check_positive, compute_dtype
from ..nn.activations import gelu, gelu_grad
from ..registry import Mechanism, Sample, register
from ..testing.gradcheck import gradcheck
from .common import FFT_NORMS, cast_complex, fft_scales, irfftn_adjoint, mirror_count, rfftn_adjoint

__all__ = [
    "rfftn_adjoint",
    "irfftn_adjoint",
    "fno_spectral_conv_forward",
    "fno_spectral_conv_backward",
    "fno_spectral_conv",
    "fno_spectral_conv_explicit",
    "afno_mixer_forward",
    "afno_mixer_backward",
    "afno_mixer",
    "init_fno_params",
    "init_afno_params",
]

# ============================================================================================
# FNO spectral convolution


def _fno_validate(x, params, norm):
    x = as_float(x, "x", min_ndim=3, max_ndim=4)
    check_choice(norm, "norm", FFT_NORMS)
    d = x.ndim - 2
    grid = x.shape[1:-1]
    c_in = x.shape[-1]
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of weights; got {type(params).__name__}")
    corners = ["weights1"] if d == 1 else ["weights1", "weights2"]
    expected = {f"{c}_{p}" for c in corners for p in ("real", "imag")}
    if set(params) != expected:
        raise ValueError(f"params for a {d}-D spectral conv must have exactly the keys {sorted(expected)}; "
                         f"got {sorted(params)}")
    ws = {}
    shape0 = None
    for key in sorted(expected):
        w = as_float(params[key], key, ndim=2 + d)
        if shape0 is None:
            shape0 = w.shape
        elif w.shape != shape0:
            raise ValueError(f"{key} must have the same shape as the other weights {shape0}; got {w.shape}")
        ws[key] = w
    if shape0[0] != c_in:
        raise ValueError(f"weights must have shape (in_channels={c_in}, out_channels, modes...); "
                         f"got {shape0} for x with {c_in} channels")
    modes = shape0[2:]
    if modes[-1] > grid[-1] // 2 + 1:
        raise ValueError(f"modes along the last spatial axis ({modes[-1]}) must be <= n//2+1 = "
                         f"{grid[-1] // 2 + 1} for a grid of size {grid[-1]}")
    if d == 2 and 2 * modes[0] > grid[0]:
        raise ValueError(f"modes1 ({modes[0]}) must be <= n1/2 = {grid[0] / 2} so that the two kept "
                         f"corners [:m1] and [-m1:] of axis 1 do not overlap (grid {grid})")
    dt = compute_dtype(x, *ws.values())
    return x.astype(dt, copy=False), cast_all(dt, ws), d, grid, modes, dt


def _fno_corners(d, grid, modes):
    """[(weight prefix, index tuple into the half spectrum)] as in zongyi-li's fourier_{1,2}d.py."""
    if d == 1:
        return [("weights1", (slice(None), slice(0, modes[0])))]
    n1 = grid[0]
    return [("weights1", (slice(None), slice(0, modes[0]), slice(0, modes[1]))),
            ("weights2", (slice(None), slice(n1 - modes[0], n1), slice(0, modes[1])))]


def _fno_eins(d):
    sp = "xy"[:d]
    return f"b{sp}i,io{sp}->b{sp}o", f"b{sp}o,io{sp}->b{sp}i", f"b{sp}i,b{sp}o->io{sp}"


def fno_spectral_conv_forward(x, params, *, norm: str = "backward"):
    r"""FNO spectral convolution $\mathcal K v = \operatorname{irfftn}\big(R\cdot\operatorname{rfftn}(v)\big)$.

    Per retained Fourier mode $k$, the complex channel mix
    $\hat y_{k,o} = \sum_i \hat x_{k,i} R_{i,o,k}$; every other mode of the output is zero.

    Mode selection follows zongyi-li/fourier_neural_operator: 1-D ``fourier_1d.py`` keeps
    ``[:modes1]``; 2-D ``fourier_2d.py`` keeps two corners of the full (non-halved) first axis,
    ``[:m1, :m2]`` with ``weights1`` and ``[-m1:, :m2]`` with ``weights2`` (positive and negative
    frequencies). DPOT keeps one corner and AFNO the last axis only — see :func:`afno_mixer_forward`.

    Parameters
    ----------
    x : array (B, n1, C_in) or (B, n1, n2, C_in)
        Channel-last grid function (upstream: ``(B, C_in, n1[, n2])``).
    params : dict
        ``weights1_real``, ``weights1_imag`` (and in 2-D ``weights2_real``, ``weights2_imag``), each
        ``(C_in, C_out, m1[, m2])``: real and imaginary parts of upstream's complex ``weights1`` /
        ``weights2`` (``w.real.numpy()``, ``w.imag.numpy()``). Modes are read from the shape;
        ``m2 <= n2//2+1`` and ``2*m1 <= n1``.
    norm : {"backward", "ortho", "forward"}
        FFT normalisation of both transforms; upstream default ``"backward"`` (current
        ``torch.fft.rfft2``; the original 2020 files used ``torch.rfft(normalized=True)`` = ``"ortho"``
        with ``(..., 2)`` real weight tensors). ``"backward"`` is the only one that
        makes the layer discretisation-invariant: the same weights on a finer grid give the same
        function, see the ``discretisation_invariance`` check).

    Returns
    -------
    out, cache
        ``out (B, n1[, n2], C_out)``.
    """
    x, ws, d, grid, modes, dt = _fno_validate(x, params, norm)
    axes = tuple(range(1, d + 1))
    X = cast_complex(np.fft.rfftn(x, axes=axes, norm=norm), dt)
    c_out = ws["weights1_real"].shape[1]
    Y = np.zeros(X.shape[:-1] + (c_out,), dtype=X.dtype)
    fwd, _, _ = _fno_eins(d)
    for name, idx in _fno_corners(d, grid, modes):
        W = ws[f"{name}_real"] + 1j * ws[f"{name}_imag"]
        Y[idx] = np.einsum(fwd, X[idx], W)
    out = np.fft.irfftn(Y, s=grid, axes=axes, norm=norm).astype(dt, copy=False)
    return out, {"X": X, "ws": ws, "d": d, "grid": grid, "modes": modes, "norm": norm, "dt": dt}


def fno_spectral_conv_backward(dout, cache):
    """Gradients ``{"x", "weights1_real", "weights1_imag"[, "weights2_real", "weights2_imag"]}``."""
    X, ws, d, grid, norm, dt = cache["X"], cache["ws"], cache["d"], cache["grid"], cache["norm"], cache["dt"]
    c_out = ws["weights1_real"].shape[1]
    expected = (X.shape[0],) + tuple(grid) + (c_out,)
    dout = as_dout(dout, expected, dt)
    axes = tuple(range(1, d + 1))
    dY = cast_complex(irfftn_adjoint(dout, axes, norm), dt)
    dX = np.zeros_like(X)
    _, bwd_x, bwd_w = _fno_eins(d)
    grads = {}
    for name, idx in _fno_corners(d, grid, cache["modes"]):
        W = ws[f"{name}_real"] + 1j * ws[f"{name}_imag"]
        dX[idx] = np.einsum(bwd_x, dY[idx], np.conj(W))
        dW = np.einsum(bwd_w, np.conj(X[idx]), dY[idx])
        grads[f"{name}_real"] = dW.real.astype(dt, copy=False)
        grads[f"{name}_imag"] = dW.imag.astype(dt, copy=False)
    dx = rfftn_adjoint(dX, tuple(grid), axes, norm).astype(dt, copy=False)
    return {"x": dx, **grads}


def fno_spectral_conv(x, params, *, norm: str = "backward") -> np.ndarray:
    """Convenience wrapper: the output of :func:`fno_spectral_conv_forward`."""
    return fno_spectral_conv_forward(x, params, norm=norm)[0]


def fno_spectral_conv_explicit(x, params, *, norm: str = "backward") -> np.ndarray:
    r"""The same operator with explicit DFT matrices and no FFT (O(N^2) reference).

    $\hat x_k = \alpha\sum_t x_t e^{-i\theta_k\cdot t}$ for every kept mode $k$, the per-mode channel
    mix, then $y_t = \beta\sum_k c_{k_d}\operatorname{Re}(\hat y_k e^{i\theta_k\cdot t})$.
    """
    x, ws, d, grid, modes, dt = _fno_validate(x, params, norm)
    alpha, beta = fft_scales(norm, int(np.prod(grid)))
    c = mirror_count(grid[-1], np.float64)
    out = 0.0
    for name, idx in _fno_corners(d, grid, modes):
        W = ws[f"{name}_real"] + 1j * ws[f"{name}_imag"]
        freqs = [np.arange(grid[a])[idx[1 + a]] for a in range(d)]  # frequency index per axis
        mats = [np.exp(-2j * np.pi * np.outer(f, np.arange(n)) / n) for f, n in zip(freqs, grid)]
        if d == 1:
            Xk = alpha * np.einsum("kt,bti->bki", mats[0], x)
            Yk = np.einsum("bki,iok->bko", Xk, W)
            out = out + beta * np.einsum("k,bko,kt->bto", c[freqs[0]], Yk, np.conj(mats[0])).real
        else:
            Xk = alpha * np.einsum("ks,lt,bsti->bkli", mats[0], mats[1], x)
            Yk = np.einsum("bkli,iokl->bklo", Xk, W)
            out = out + beta * np.einsum("l,bklo,ks,lt->bsto", c[freqs[1]], Yk,
                                         np.conj(mats[0]), np.conj(mats[1])).real
    return np.asarray(out, dtype=dt)


def init_fno_params(rng, in_channels: int, out_channels: int, modes, *, dtype=np.float64) -> dict:
    """Weights initialised as zongyi-li's ``SpectralConv1d/2d``: ``scale * torch.rand(..., dtype=cfloat)``
    with ``scale = 1/(in*out)`` — real and imaginary parts each uniform on ``[0, scale)``.

    ``modes`` is ``(m1,)`` (1-D, keys ``weights1_*``) or ``(m1, m2)`` (2-D, ``weights1_*`` and
    ``weights2_*``)."""
    in_channels = check_int(in_channels, "in_channels", minimum=1)
    out_channels = check_int(out_channels, "out_channels", minimum=1)
    modes = tuple(check_int(m, "modes", minimum=1) for m in modes)
    if len(modes) not in (1, 2):
        raise ValueError(f"modes must have 1 or 2 entries; got {modes}")
    scale = 1.0 / (in_channels * out_channels)
    shape = (in_channels, out_channels) + modes
    names = ["weights1"] if len(modes) == 1 else ["weights1", "weights2"]
    return {f"{n}_{p}": (scale * rng.random(shape)).astype(dtype) for n in names for p in ("real", "imag")}


# --------------------------------------------------------------------------------------------
# FNO record


def _fno_params(rng, c_in, c_out, modes, d):
    shape = (c_in, c_out) + tuple(modes)
    names = ["weights1"] if d == 1 else ["weights1", "weights2"]
    return {f"{n}_{p}": rng.standard_normal(shape) / np.sqrt(c_in) for n in names for p in ("real", "imag")}


def _fno_sample(rng, size, d=2, norm=None):
    if size == "tiny":
        grid = (int(rng.integers(4, 6)),) if d == 1 else (4, int(rng.integers(4, 6)))
        c_in, c_out = 2, 2
    else:
        grid = (int(rng.integers(9, 14)),) if d == 1 else (int(rng.integers(6, 9)), int(rng.integers(6, 10)))
        c_in, c_out = 3, 4
    modes = (grid[0] // 2 + 1,) if d == 1 else (grid[0] // 2, grid[1] // 2 + 1)
    x = rng.standard_normal((2,) + grid + (c_in,))
    cfg = {"norm": norm} if norm is not None else {}
    return Sample(inputs={"x": x}, params=_fno_params(rng, c_in, c_out, modes, d), config=cfg)


def _check_rfft_adjoints(rng):
    worst = 0.0
    for grid in [(6,), (7,), (4, 6), (5, 7), (4, 5)]:
        axes = tuple(range(1, len(grid) + 1))
        x = rng.standard_normal((2,) + grid + (3,))
        for norm in FFT_NORMS:
            X = np.fft.rfftn(x, axes=axes, norm=norm)
            Z = rng.standard_normal(X.shape) + 1j * rng.standard_normal(X.shape)
            lhs = np.sum((X * np.conj(Z)).real)            # <F x, Z>
            rhs = np.sum(x * rfftn_adjoint(Z, grid, axes, norm))   # <x, F* Z>
            y = np.fft.irfftn(Z, s=grid, axes=axes, norm=norm)
            g = rng.standard_normal(y.shape)
            lhs2 = np.sum(y * g)                           # <G Z, g>
            rhs2 = np.sum((Z * np.conj(irfftn_adjoint(g, axes, norm))).real)
            err = max(abs(lhs - rhs) / (abs(lhs) + 1), abs(lhs2 - rhs2) / (abs(lhs2) + 1))
            assert err < 1e-12, f"rfft/irfft adjoint identity fails for grid {grid}, norm {norm}: {err:.2e}"
            worst = max(worst, err)
    return worst


def _check_fno_1d_and_norms(rng):
    worst = 0.0
    for d in (1, 2):
        for norm in FFT_NORMS:
            s = _fno_sample(rng, "tiny", d=d, norm=norm)
            worst = max(worst, gradcheck(fno_spectral_conv_forward, fno_spectral_conv_backward, s).max_rel)
            ref = fno_spectral_conv_explicit(**s.inputs, params=s.params, **s.config)
            err = float(np.abs(fno_spectral_conv(**s.inputs, params=s.params, **s.config) - ref).max())
            assert err < 1e-10, f"{d}-D norm={norm}: FFT form differs from DFT-matrix form by {err:.2e}"
    return worst


def _bandlimited(rng, n_grid, kmax, batch=2, channels=2):
    """Samples on an n-point periodic grid of a random trigonometric polynomial of degree kmax."""
    t = [np.arange(n) / n for n in n_grid]
    coef = rng.standard_normal((batch, channels) + (2 * kmax + 1,) * len(n_grid) + (2,))
    out = np.zeros((batch,) + tuple(n_grid) + (channels,))
    ks = range(-kmax, kmax + 1)
    for a, ka in enumerate(ks):
        if len(n_grid) == 1:
            ph = 2 * np.pi * ka * t[0]
            out += (coef[:, :, a, 0, None] * np.cos(ph) + coef[:, :, a, 1, None] * np.sin(ph)).transpose(0, 2, 1)
        else:
            for b_, kb in enumerate(ks):
                ph = 2 * np.pi * (ka * t[0][:, None] + kb * t[1][None, :])
                term = coef[:, :, a, b_, 0, None, None] * np.cos(ph) + coef[:, :, a, b_, 1, None, None] * np.sin(ph)
                out += term.transpose(0, 2, 3, 1)
    return out


def _check_discretisation_invariance(rng):
    # A degree-3 trigonometric polynomial sampled on 8 and on 16 points (per axis): with the same
    # weights (modes <= 4) and norm="backward", the fine output restricted to the coarse points
    # equals the coarse output — FNO is a map between functions, not between grids.
    worst = 0.0
    for d in (1, 2):
        coarse, fine = (8,) * d, (16,) * d
        modes = (4,) if d == 1 else (3, 4)
        params = _fno_params(rng, 2, 3, modes, d)
        u_c = _bandlimited(np.random.default_rng(7), coarse, 3)
        u_f = _bandlimited(np.random.default_rng(7), fine, 3)
        y_c = fno_spectral_conv(u_c, params)
        y_f = fno_spectral_conv(u_f, params)
        sub = (slice(None),) + (slice(None, None, 2),) * d
        err = float(np.abs(y_f[sub] - y_c).max())
        assert err < 1e-11, f"{d}-D: outputs on the two resolutions differ by {err:.2e}"
        worst = max(worst, err)
    return worst


def _check_truncation(rng):
    # Output modes outside the kept corners are exactly zero.
    s = _fno_sample(rng, "small", d=2)
    x = s.inputs["x"]
    n1, n2 = x.shape[1:3]
    p = {k: v[:, :, :2, :2] for k, v in s.params.items()}
    Y = np.fft.rfft2(fno_spectral_conv(x, p), axes=(1, 2))
    keep = np.zeros(Y.shape[1:3], bool)
    keep[:2, :2] = keep[n1 - 2:, :2] = True
    # irfft2 makes the DC column (and the Nyquist column for even n2) Hermitian along axis 1:
    # a kept bin (k1, 0) also feeds (-k1, 0). Upstream FNO has the same leak.
    for col in [0] + ([n2 // 2] if n2 % 2 == 0 and n2 // 2 < 2 else []):
        keep[:, col] |= np.roll(keep[::-1, col], 1)
    err = float(np.abs(Y[:, ~keep]).max())
    assert err < 1e-12, f"energy {err:.2e} in modes that must be truncated"
    return err


register(
    Mechanism(
        slug="fno_spectral_conv", family="3-operator", tier="T1",
        title="FNO spectral convolution (rfft, per-mode complex channel mix, two-corner truncation, irfft)",
        paper="Li et al., Fourier Neural Operator for Parametric PDEs, ICLR 2021, arXiv 2010.08895",
        forward=fno_spectral_conv_forward, backward=fno_spectral_conv_backward,
        sample=_fno_sample, reference=fno_spectral_conv_explicit,
        docs="neural-operators.md#fno-spectral-convolution",
        checks={"rfft_adjoints": _check_rfft_adjoints, "gradcheck_1d_2d_all_norms": _check_fno_1d_and_norms,
                "discretisation_invariance": _check_discretisation_invariance,
                "mode_truncation": _check_truncation},
    ),
)


# ============================================================================================
# AFNO / DPOT Fourier mixer

_SELECTIONS = ("afno_last_axis_fraction", "dpot_low_corner", "fno_two_corners")
def _act(z, kind):
    return np.maximum(z, 0.0) if kind == "relu" else gelu(z)


def _act_grad(z, kind):
    return (z > 0).astype(z.dtype) if kind == "relu" else gelu_grad(z).astype(z.dtype, copy=False)


def _afno_kept_mask(H, W, selection, hard_thresholding_fraction, modes, kept_modes_from):
    """Boolean (H, W//2+1) mask of the retained modes, reproducing each upstream selection."""
    wh = W // 2 + 1
    keep = np.zeros((H, wh), bool)
    if selection == "afno_last_axis_fraction":
        total = (H * W if kept_modes_from == "N" else W) // 2 + 1
        kept = int(total * hard_thresholding_fraction)
        keep[:, :kept] = True      # a slice [:kept] past the end keeps everything, as in torch
    elif selection == "dpot_low_corner":
        keep[:modes, :modes] = True
    else:
        keep[:modes, :modes] = True
        keep[max(H - modes, 0):, :modes] = True
    return keep


def _afno_validate(x, params, num_blocks, selection, activation, softshrink, fft_norm,
                   hard_thresholding_fraction, modes, kept_modes_from):
    x = as_float(x, "x", ndim=4)
    check_choice(selection, "mode_selection", _SELECTIONS)
    check_choice(activation, "activation", ("relu", "gelu"))
    check_choice(fft_norm, "fft_norm", FFT_NORMS)
    check_choice(kept_modes_from, "kept_modes_from", ("N", "W"))
    softshrink = check_positive(softshrink, "softshrink", allow_zero=True, allow_none=True)
    hard_thresholding_fraction = check_positive(hard_thresholding_fraction, "hard_thresholding_fraction",
                                                allow_zero=True)
    if selection != "afno_last_axis_fraction":
        if modes is None:
            raise ValueError(f"mode_selection={selection!r} needs modes (an int >= 1); got None")
        modes = check_int(modes, "modes", minimum=1)
    if not isinstance(params, dict) or set(params) != {"w1", "b1", "w2", "b2"}:
        got = sorted(params) if isinstance(params, dict) else type(params).__name__
        raise ValueError(f"params must be a dict with keys ['b1', 'b2', 'w1', 'w2']; got {got}")
    w1 = as_float(params["w1"], "w1", ndim=4)
    b1 = as_float(params["b1"], "b1", ndim=3)
    w2 = as_float(params["w2"], "w2", ndim=4)
    b2 = as_float(params["b2"], "b2", ndim=3)
    C = x.shape[-1]
    if w1.shape[0] != 2:
        raise ValueError(f"w1 must have shape (2, num_blocks, block_size, block_size*hidden_size_factor); got {w1.shape}")
    nb, bs, hid = w1.shape[1:]
    if nb * bs != C:
        raise ValueError(f"w1 of shape {w1.shape} implies num_blocks*block_size = {nb * bs}, but x has {C} channels")
    if num_blocks is not None and check_int(num_blocks, "num_blocks", minimum=1) != nb:
        raise ValueError(f"num_blocks ({num_blocks}) disagrees with w1.shape[1] ({nb})")
    for name, arr, shp in (("b1", b1, (2, nb, hid)), ("w2", w2, (2, nb, hid, bs)), ("b2", b2, (2, nb, bs))):
        if arr.shape != shp:
            raise ValueError(f"{name} must have shape {shp} (from w1 {w1.shape}); got {arr.shape}")
    dt = compute_dtype(x, w1, b1, w2, b2)
    p = {k: v.astype(dt, copy=False) for k, v in (("w1", w1), ("b1", b1), ("w2", w2), ("b2", b2))}
    return x.astype(dt, copy=False), p, dt, softshrink, hard_thresholding_fraction, modes


def afno_mixer_forward(x, params, *, num_blocks=None, mode_selection: str = "afno_last_axis_fraction",
                       hard_thresholding_fraction: float = 1.0, kept_modes_from: str = "N",
                       modes: int | None = None, activation: str = "relu", softshrink: float | None = 0.01,
                       fft_norm: str = "ortho", inner_residual: bool = True):
    r"""AFNO token mixer (and DPOT's variant): a block-diagonal complex 2-layer MLP per Fourier mode.

    $$\hat X = \operatorname{rfft2}(x),\quad
    O_1 = \sigma_{\mathbb C}(\hat X W_1 + b_1),\quad
    O_2 = O_1 W_2 + b_2,\quad
    y = \operatorname{irfft2}(S_\lambda(O_2)) + x$$

    on the retained modes (zero elsewhere, *including* the biases); $W_1, W_2$ block-diagonal
    over ``num_blocks`` channel blocks, complex products in real form
    ``(Re·w[0] − Im·w[1], Im·w[0] + Re·w[1])``; $\sigma_{\mathbb C}$ acts on real and
    imaginary parts separately; $S_\lambda$ = softshrink on real and imaginary parts.

    Upstream conventions (each a keyword here; defaults = NVlabs/AFNO-transformer ``afno/afno2d.py``):

    | keyword | AFNO (``afno2d.py``) | DPOT (``models/dpot.py``) |
    |---|---|---|
    | ``mode_selection`` | last axis ``[:, :, :kept]`` | ``[:, :modes, :modes]`` (one corner) |
    | ``activation`` | ``"relu"`` | ``"gelu"`` |
    | ``softshrink`` | ``0.01`` | ``None`` (commented out upstream) |
    | ``inner_residual`` | ``True`` (``x + bias``) | ``True`` |
    | init (see docs) | ``0.02 * randn`` | ``rand / (bs^2 * hsf)`` |

    ``kept_modes_from``: AFNO computes ``kept = int((N//2+1) * hard_thresholding_fraction)`` with
    ``N = H*W`` tokens at commit c3271a2/941e924 (``"N"``, default) and with ``N = W`` in later
    copies (``"W"``); with fraction 1 both keep every mode. ``"fno_two_corners"`` is the FNO
    selection (``[:m, :m]`` and ``[-m:, :m]``) for comparison.

    Parameters
    ----------
    x : array (B, H, W, C)
        Grid tokens (upstream ``(B, N, C)`` with ``N = H*W``: ``x.reshape(B, H, W, C)``).
    params : dict
        ``w1 (2, nb, bs, bs*hsf)``, ``b1 (2, nb, bs*hsf)``, ``w2 (2, nb, bs*hsf, bs)``,
        ``b2 (2, nb, bs)`` — the upstream parameter names and shapes (index 0 real, 1 imaginary).
    """
    x, p, dt, lam, frac, modes = _afno_validate(x, params, num_blocks, mode_selection, activation,
                                                softshrink, fft_norm, hard_thresholding_fraction, modes,
                                                kept_modes_from)
    B, H, W, C = x.shape
    nb, bs = p["w1"].shape[1:3]
    keep = _afno_kept_mask(H, W, mode_selection, frac, modes, kept_modes_from)
    X = cast_complex(np.fft.rfft2(x, axes=(1, 2), norm=fft_norm), dt)
    Xk = X[:, keep].reshape(B, -1, nb, bs)              # (B, K, nb, bs) retained modes
    xr, xi = Xk.real, Xk.imag
    w1, b1, w2, b2 = p["w1"], p["b1"], p["w2"], p["b2"]
    e = "...bi,bio->...bo"
    p1r = np.einsum(e, xr, w1[0]) - np.einsum(e, xi, w1[1]) + b1[0]
    p1i = np.einsum(e, xi, w1[0]) + np.einsum(e, xr, w1[1]) + b1[1]
    o1r, o1i = _act(p1r, activation), _act(p1i, activation)
    o2r = np.einsum(e, o1r, w2[0]) - np.einsum(e, o1i, w2[1]) + b2[0]
    o2i = np.einsum(e, o1i, w2[0]) + np.einsum(e, o1r, w2[1]) + b2[1]
    if lam is not None:
        sr = np.sign(o2r) * np.maximum(np.abs(o2r) - lam, 0.0)
        si = np.sign(o2i) * np.maximum(np.abs(o2i) - lam, 0.0)
    else:
        sr, si = o2r, o2i
    Y = np.zeros(X.shape, dtype=X.dtype)
    Y[:, keep] = (sr + 1j * si).reshape(B, -1, C)
    out = np.fft.irfft2(Y, s=(H, W), axes=(1, 2), norm=fft_norm).astype(dt, copy=False)
    if inner_residual:
        out = out + x
    cache = {"xr": xr, "xi": xi, "p1r": p1r, "p1i": p1i, "o1r": o1r, "o1i": o1i, "o2r": o2r, "o2i": o2i,
             "p": p, "keep": keep, "shape": x.shape, "dt": dt, "lam": lam, "activation": activation,
             "norm": fft_norm, "inner_residual": bool(inner_residual)}
    return out, cache


def afno_mixer_backward(dout, cache):
    r"""Gradients ``{"x", "w1", "b1", "w2", "b2"}`` of :func:`afno_mixer_forward`.

    Chain (real form, per block, $\bar{\cdot}$ = gradient):
    $\bar S = \mathrm{irfft2}^*(\bar y)$ on kept modes;
    $\bar O_2 = \bar S\odot[|O_2| > \lambda]$;
    $\bar W_2[0] = O_{1r}^\top\bar O_{2r} + O_{1i}^\top\bar O_{2i}$,
    $\bar W_2[1] = -O_{1i}^\top\bar O_{2r} + O_{1r}^\top\bar O_{2i}$, $\bar b_2 = \sum\bar O_2$;
    $\bar O_{1r} = \bar O_{2r}W_2[0]^\top + \bar O_{2i}W_2[1]^\top$,
    $\bar O_{1i} = -\bar O_{2r}W_2[1]^\top + \bar O_{2i}W_2[0]^\top$;
    $\bar P_1 = \bar O_1\odot\sigma'(P_1)$; the same pattern for $W_1, b_1, \hat X$;
    $\bar x = \mathrm{rfft2}^*(\bar{\hat X}) + \bar y$ (the residual).
    """
    B, H, W, C = cache["shape"]
    dt, p, keep = cache["dt"], cache["p"], cache["keep"]
    g = as_dout(dout, (B, H, W, C), dt)
    w1, w2 = p["w1"], p["w2"]
    nb, bs = w1.shape[1:3]
    dY = irfftn_adjoint(g, (1, 2), cache["norm"])
    dS = dY[:, keep].reshape(B, -1, nb, bs)
    dsr, dsi = dS.real.astype(dt, copy=False), dS.imag.astype(dt, copy=False)
    lam = cache["lam"]
    o2r, o2i = cache["o2r"], cache["o2i"]
    if lam is not None:
        dsr = dsr * (np.abs(o2r) > lam)
        dsi = dsi * (np.abs(o2i) > lam)
    o1r, o1i = cache["o1r"], cache["o1i"]
    eb = "...bo,bio->...bi"

    def ew(a, b_):  # sum over batch and modes of the per-block outer products
        return np.einsum("nbi,nbo->bio", a.reshape(-1, *a.shape[-2:]), b_.reshape(-1, *b_.shape[-2:]))

    red = tuple(range(dsr.ndim - 2))
    dw2 = np.stack([ew(o1r, dsr) + ew(o1i, dsi),
                    -ew(o1i, dsr) + ew(o1r, dsi)])
    db2 = np.stack([dsr.sum(axis=red), dsi.sum(axis=red)])
    do1r = np.einsum(eb, dsr, w2[0]) + np.einsum(eb, dsi, w2[1])
    do1i = -np.einsum(eb, dsr, w2[1]) + np.einsum(eb, dsi, w2[0])
    dp1r = do1r * _act_grad(cache["p1r"], cache["activation"])
    dp1i = do1i * _act_grad(cache["p1i"], cache["activation"])
    xr, xi = cache["xr"], cache["xi"]
    dw1 = np.stack([ew(xr, dp1r) + ew(xi, dp1i),
                    -ew(xi, dp1r) + ew(xr, dp1i)])
    db1 = np.stack([dp1r.sum(axis=red), dp1i.sum(axis=red)])
    dxr = np.einsum(eb, dp1r, w1[0]) + np.einsum(eb, dp1i, w1[1])
    dxi = -np.einsum(eb, dp1r, w1[1]) + np.einsum(eb, dp1i, w1[0])
    dX = np.zeros(dY.shape, dtype=dY.dtype)
    dX[:, keep] = (dxr + 1j * dxi).reshape(B, -1, C)
    dx = rfftn_adjoint(dX, (H, W), (1, 2), cache["norm"]).astype(dt, copy=False)
    if cache["inner_residual"]:
        dx = dx + g
    return {"x": dx, "w1": dw1, "b1": db1, "w2": dw2, "b2": db2}


def afno_mixer(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`afno_mixer_forward`."""
    return afno_mixer_forward(x, params, **config)[0]


def init_afno_params(rng, hidden_size: int, num_blocks: int = 8, hidden_size_factor: int = 1, *,
                     init: str = "afno", dtype=np.float64) -> dict:
    """``w1, b1, w2, b2`` initialised as upstream: ``init="afno"`` (afno2d.py) ``0.02 * randn``;
    ``init="dpot"`` (DPOT ``AFNO2D``) ``scale * rand`` with ``scale = 1/(block_size**2 * hsf)``."""
    hidden_size = check_int(hidden_size, "hidden_size", minimum=1)
    num_blocks = check_int(num_blocks, "num_blocks", minimum=1)
    hsf = check_int(hidden_size_factor, "hidden_size_factor", minimum=1)
    check_choice(init, "init", ("afno", "dpot"))
    if hidden_size % num_blocks:
        raise ValueError(f"hidden_size ({hidden_size}) must be divisible by num_blocks ({num_blocks})")
    bs = hidden_size // num_blocks
    shapes = {"w1": (2, num_blocks, bs, bs * hsf), "b1": (2, num_blocks, bs * hsf),
              "w2": (2, num_blocks, bs * hsf, bs), "b2": (2, num_blocks, bs)}
    if init == "afno":
        return {k: (0.02 * rng.standard_normal(s)).astype(dtype) for k, s in shapes.items()}
    scale = 1.0 / (bs * bs * hsf)
    return {k: (scale * rng.random(s)).astype(dtype) for k, s in shapes.items()}


# --------------------------------------------------------------------------------------------
# AFNO record


def _afno_params(rng, nb, bs, hsf, scale):
    return {"w1": scale * rng.standard_normal((2, nb, bs, bs * hsf)),
            "b1": scale * rng.standard_normal((2, nb, bs * hsf)),
            "w2": scale * rng.standard_normal((2, nb, bs * hsf, bs)),
            "b2": scale * rng.standard_normal((2, nb, bs))}


def _afno_margins(s):
    """Distance of the sample from the ReLU and softshrink kinks (FD needs > 1e-4)."""
    _, c = afno_mixer_forward(**s.inputs, params=s.params, **s.config)
    m = np.inf
    if c["activation"] == "relu":
        m = min(m, float(np.abs(c["p1r"]).min()), float(np.abs(c["p1i"]).min()))
    if c["lam"] is not None:
        for o in (c["o2r"], c["o2i"]):
            m = min(m, float(np.abs(np.abs(o) - c["lam"]).min()))
    return m


def _afno_sample(rng, size, **config):
    while True:
        if size == "tiny":
            H, W, nb, bs, hsf = 4, int(rng.integers(3, 5)), 2, 2, 1
        else:
            H, W, nb, bs, hsf = int(rng.integers(5, 8)), int(rng.integers(5, 8)), 2, 3, 2
        x = rng.standard_normal((2, H, W, nb * bs))
        s = Sample(inputs={"x": x}, params=_afno_params(rng, nb, bs, hsf, 0.7), config=dict(config))
        if _afno_margins(s) > 2e-4:
            return s


def _check_afno_variants(rng):
    # DPOT (gelu, no shrink, one corner), FNO corners and a thresholded AFNO, all by FD.
    worst = 0.0
    for cfg in ({"mode_selection": "dpot_low_corner", "modes": 2, "activation": "gelu", "softshrink": None},
                {"mode_selection": "fno_two_corners", "modes": 2, "fft_norm": "backward"},
                {"hard_thresholding_fraction": 0.5, "kept_modes_from": "W", "inner_residual": False}):
        s = _afno_sample(rng, "tiny", **cfg)
        worst = max(worst, gradcheck(afno_mixer_forward, afno_mixer_backward, s).max_rel)
    return worst


def _check_afno_selection(rng):
    # The index sets against the literal upstream slices on an (H, W//2+1) grid of ids.
    H, W = 6, 8
    ids = np.arange(H * (W // 2 + 1)).reshape(H, W // 2 + 1)
    m = 2
    cases = {
        ("dpot_low_corner", "N", 1.0): set(ids[:m, :m].ravel()),
        ("fno_two_corners", "N", 1.0): set(ids[:m, :m].ravel()) | set(ids[-m:, :m].ravel()),
        ("afno_last_axis_fraction", "W", 0.5): set(ids[:, : int((W // 2 + 1) * 0.5)].ravel()),
        ("afno_last_axis_fraction", "N", 0.1): set(ids[:, : int((H * W // 2 + 1) * 0.1)].ravel()),
    }
    for (sel, frm, frac), expected in cases.items():
        got = set(ids[_afno_kept_mask(H, W, sel, frac, m, frm)].ravel())
        assert got == expected, f"{sel}/{frm}/{frac}: kept {sorted(got)} != upstream {sorted(expected)}"
    return 0.0


def _check_afno_identity_low_pass(rng):
    # w1 = w2 = identity, zero biases, no shrink: a retained mode whose real and imaginary parts
    # are both positive passes the ReLU MLP unchanged, so the mixer is an ideal low-pass filter on it.
    H, W, C = 6, 6, 2
    nb, bs = 1, 2
    eye = np.eye(bs)
    params = {"w1": np.stack([eye, 0 * eye])[:, None], "b1": np.zeros((2, nb, bs)),
              "w2": np.stack([eye, 0 * eye])[:, None], "b2": np.zeros((2, nb, bs))}
    t = np.arange(H)[:, None] / H
    s = np.arange(W)[None, :] / W
    amp = rng.random(C) + 0.5
    ph = 2 * np.pi * (1 * t + 1 * s)
    # cos(phi + pi/4): its (1, 1) coefficient is proportional to exp(i pi/4) (positive real and
    # imaginary parts); the conjugate (-1, -1) bin is not stored on the halved axis.
    x = (amp[None, None, :] * np.cos(ph + np.pi / 4)[..., None])[None]
    out = afno_mixer(x, params, softshrink=None, inner_residual=False)
    err = float(np.abs(out - x).max())
    assert err < 1e-12, f"identity-weight mixer changed a kept positive-quadrant mode by {err:.2e}"
    # The same mode with mode_selection keeping only the DC column is removed entirely.
    out2 = afno_mixer(x, params, softshrink=None, inner_residual=False, hard_thresholding_fraction=0.25,
                      kept_modes_from="W")
    assert float(np.abs(out2).max()) < 1e-12, "a truncated mode leaked through"
    return err


register(
    Mechanism(
        slug="afno_dpot_fourier_mixer", family="3-operator", tier="T1",
        title="AFNO token mixer (block-diagonal complex MLP per Fourier mode, softshrink) and DPOT's variant",
        paper="Guibas et al., Adaptive Fourier Neural Operators, ICLR 2022, arXiv 2111.13587; "
              "Hao et al., DPOT, ICML 2024",
        forward=afno_mixer_forward, backward=afno_mixer_backward, sample=_afno_sample,
        docs="neural-operators.md#afno-dpot-fourier-mixer",
        checks={"dpot_fno_threshold_variants": _check_afno_variants, "mode_selection": _check_afno_selection,
                "identity_low_pass": _check_afno_identity_low_pass},
    ),
)
