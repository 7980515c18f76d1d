r"""FNO spectral convolution: a per-mode complex channel mix between a real FFT and its inverse.

Paper: Li, Kovachki, Azizzadenesheli, Liu, Bhattacharya, Stuart, Anandkumar, "Fourier Neural
Operator for Parametric PDEs", ICLR 2021, arXiv 2010.08895. Upstream:
zongyi-li/fourier_neural_operator ``fourier_1d.py``, ``fourier_2d.py`` (``SpectralConv1d/2d``).

The layer acts on a grid function stored channel-last, ``x (B, n_1[, n_2], C)`` (the upstream
PyTorch modules are channel-first ``(B, C, n_1, n_2)``; permute with ``x.permute(0, 2, 3, 1)``).
The FFT runs over the spatial axes; the *last* spatial axis is the halved (``rfft``) axis.

Forward
-------
$$\mathcal K v = \operatorname{irfftn}\big(R\cdot\operatorname{rfftn}(v)\big),\qquad
\hat y_{k,o} = \sum_i \hat x_{k,i} R_{i,o,k}$$

on every kept mode $k$, every other output mode zero. Kept modes: 1-D ``[:m1]``; 2-D **two
corners** of the non-halved axis, ``[:m1, :m2]`` with ``weights1`` and ``[-m1:, :m2]`` with
``weights2`` (positive and negative frequencies). The full FNO layer is
$\sigma(Wv + \mathcal Kv + b)$ (``refattn.demos.pde`` builds it from this and ``linear``).

Backward
--------
$\bar{\hat y} = \operatorname{irfftn}^*(\bar y)$ (``irfftn_adjoint``); per corner the complex-linear
VJP; $\bar x = \operatorname{rfftn}^*(\bar{\hat x})$ (``rfftn_adjoint``). Truncated modes get zero
gradient. The two real-FFT adjoints (the mirror count $c = (1, 2, \dots, 2, 1)$ and its inverse) are
derived in the module docstring of ``refattn.operators.common``, which AFNO shares.

*Complex-linear maps.* For $Y = XW$ (complex, per mode) $\bar X = \bar Y\,W^{H}$ and
$\bar W = X^{H}\bar Y$; a complex weight stored as real/imaginary float arrays
$W = W_r + iW_i$ gets $\partial L/\partial W_r = \operatorname{Re}\bar W$,
$\partial L/\partial W_i = \operatorname{Im}\bar W$.

Conventions
-----------
* ``norm`` (``"backward"``, the torch.fft default and zongyi-li's current ``rfft2``): the original
  2020 files used ``torch.rfft(normalized=True)`` = ``"ortho"`` with ``(..., 2)`` real weight
  tensors. Only ``"backward"`` makes the layer discretisation-invariant (check
  ``discretisation_invariance``).
* Mode selection: two corners in 2-D (FNO); DPOT keeps one corner and AFNO the last axis only
  (``refattn.operators.afno``).
* Complex weights are stored as ``weights{1,2}_real`` / ``weights{1,2}_imag`` float arrays.

neuraloperator's ``SpectralConv`` (``neuralop/layers/spectral_convolution.py`` @
93d3f0633e048c915004cd782cb339acf06e1157) is :func:`fno_spectral_conv_centred_forward`: one
weight on the block of modes centred on the zero frequency after ``fftshift`` over every axis but
the last, any number of spatial axes, odd mode counts, optional bias, ``fft_norm="forward"``.
Measured agreement with the real module (float64): ≤ 6e-16, output and every gradient (docs).
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_choice, check_int, compute_dtype
from ..registry import Mechanism, Sample, register
from ..testing.gradcheck import gradcheck
from .common import FFT_NORMS, cast_complex, fft_scales, irfftn_adjoint, mirror_count, rfftn_adjoint

__all__ = [
    "fno_spectral_conv_forward",
    "fno_spectral_conv_backward",
    "fno_spectral_conv",
    "fno_spectral_conv_explicit",
    "init_fno_params",
    "fno_spectral_conv_centred_forward",
    "fno_spectral_conv_centred_backward",
    "fno_spectral_conv_centred",
    "init_fno_centred_params",
]

# neuraloperator's inverse shift and its adjoint (a permutation's adjoint is its inverse)
_SHIFTS = {"ifftshift": (np.fft.ifftshift, np.fft.fftshift), "fftshift": (np.fft.fftshift, np.fft.ifftshift)}


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
    frequencies). DPOT keeps one corner and AFNO the last axis only — see
    [`afno_mixer_forward`][refattn.operators.afno.afno_mixer_forward].

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


def _centred_validate(x, params, fft_norm):
    x = as_float(x, "x", min_ndim=3)
    check_choice(fft_norm, "fft_norm", FFT_NORMS)
    d = x.ndim - 2
    grid = x.shape[1:-1]
    c_in = x.shape[-1]
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of weights; got {type(params).__name__}")
    allowed = {"weight_real", "weight_imag", "bias"}
    if not {"weight_real", "weight_imag"} <= set(params) <= allowed:
        raise ValueError(f"params must have the keys 'weight_real', 'weight_imag' and optionally 'bias'; "
                         f"got {sorted(params)}")
    wr = as_float(params["weight_real"], "weight_real", ndim=2 + d)
    wi = as_float(params["weight_imag"], "weight_imag", ndim=2 + d)
    if wi.shape != wr.shape:
        raise ValueError(f"weight_imag must have the shape of weight_real {wr.shape}; got {wi.shape}")
    if wr.shape[0] != c_in:
        raise ValueError(f"weight must have shape (in_channels={c_in}, out_channels, k_1, ..., k_{d}); "
                         f"got {wr.shape} for x with {c_in} channels")
    kept = wr.shape[2:]
    limits = tuple(grid[:-1]) + (grid[-1] // 2 + 1,)
    for a, (k, lim) in enumerate(zip(kept, limits)):
        if k > lim:
            raise ValueError(f"weight keeps {k} modes along spatial axis {a}, more than the grid "
                             f"{tuple(grid)} holds ({lim}; the last axis holds n//2+1)")
    c_out = wr.shape[1]
    ws = {"weight_real": wr, "weight_imag": wi}
    if "bias" in params:
        b = as_float(params["bias"], "bias")
        if b.shape not in ((c_out,), (c_out,) + (1,) * d):
            raise ValueError(f"bias must have shape ({c_out},) or upstream's {(c_out,) + (1,) * d}; got {b.shape}")
        ws["bias"] = b
    dt = compute_dtype(x, *ws.values())
    return x.astype(dt, copy=False), cast_all(dt, ws), d, tuple(grid), kept, dt


def _centred_index(grid, kept):
    """Index of the kept block in the shifted half spectrum ``(B, n_1, ..., n_d//2+1, C)``: on every
    axis but the last ``[n//2 - k//2, n//2 - k//2 + k)``, the frequencies $-\\lfloor k/2\rfloor, \\dots,
    \\lceil k/2\rceil - 1$ around the zero frequency at ``n//2`` (odd ``k``: symmetric; even ``k``: one
    more negative than positive); on the last axis ``[:k]``."""
    idx = [slice(None)]
    idx += [slice(n // 2 - k // 2, n // 2 - k // 2 + k) for n, k in zip(grid[:-1], kept[:-1])]
    idx += [slice(0, kept[-1]), slice(None)]
    return tuple(idx)


def fno_spectral_conv_centred_forward(x, params, *, fft_norm: str = "forward", inverse_shift: str = "ifftshift"):
    r"""neuraloperator's ``SpectralConv`` (dense weight): one weight in the centred mode layout, any
    number of spatial axes, optional bias.

    $$\hat X = S\big(\operatorname{rfftn}(x)\big),\quad \hat Y_{k,o} = \sum_i \hat X_{k,i}W_{i,o,k}
    \ (k\in\mathcal K),\quad y = \operatorname{irfftn}\big(S^{-1}\hat Y\big) + b,$$

    $S$ = ``fftshift`` over every spatial axis but the last (none in 1-D), $\mathcal K$ the block of
    ``k_a`` modes centred on the zero frequency (index ``n_a//2``) of each shifted axis and the first
    ``k_d`` modes of the halved last axis; every other output mode is zero.

    Parameters
    ----------
    x : array (B, n_1, ..., n_d, C_in)
        Channel-last grid function, $d \ge 1$ (upstream ``(B, C_in, n_1, ..., n_d)``).
    params : dict
        ``weight_real``, ``weight_imag`` ``(C_in, C_out, k_1, ..., k_d)``: upstream's complex
        ``weight`` (state-dict key ``weight.tensor``), ``k_a`` = ``n_modes[a]`` on the first
        $d-1$ axes (odd allowed) and ``n_modes[-1]//2 + 1`` on the last; optional ``bias``
        ``(C_out,)`` or upstream's ``(C_out, 1, ..., 1)`` (gradient returned in the given shape).
    fft_norm : {"forward", "backward", "ortho"}
        Upstream default ``"forward"`` (zongyi-li's files use ``"backward"``).
    inverse_shift : {"ifftshift", "fftshift"}
        How the centred output spectrum is shifted back before the inverse FFT. ``"ifftshift"``
        (GitHub HEAD 93d3f06, the exact inverse of $S$). ``"fftshift"`` reproduces the PyPI release
        neuraloperator 2.0.0, which shifts again: identical when every non-last axis has even
        length, a one-bin roll of the output spectrum along each odd-length non-last axis otherwise.

    Returns
    -------
    out, cache
        ``out (B, n_1, ..., n_d, C_out)``.
    """
    x, ws, d, grid, kept, dt = _centred_validate(x, params, fft_norm)
    check_choice(inverse_shift, "inverse_shift", ("ifftshift", "fftshift"))
    unshift, unshift_adj = _SHIFTS[inverse_shift]
    axes = tuple(range(1, d + 1))
    X = cast_complex(np.fft.rfftn(x, axes=axes, norm=fft_norm), dt)
    if d > 1:
        X = np.fft.fftshift(X, axes=axes[:-1])
    W = np.moveaxis(ws["weight_real"] + 1j * ws["weight_imag"], (0, 1), (-2, -1))   # (k..., i, o)
    idx = _centred_index(grid, kept)
    Y = np.zeros(X.shape[:-1] + (W.shape[-1],), dtype=X.dtype)
    Y[idx] = (X[idx][..., None, :] @ W)[..., 0, :]
    if d > 1:
        Y = unshift(Y, axes=axes[:-1])
    out = np.fft.irfftn(Y, s=grid, axes=axes, norm=fft_norm).astype(dt, copy=False)
    if "bias" in ws:
        out = out + ws["bias"].reshape(-1)
    return out, {"X": X, "W": W, "d": d, "grid": grid, "kept": kept, "norm": fft_norm, "dt": dt,
                 "bias_shape": ws["bias"].shape if "bias" in ws else None, "unshift_adj": unshift_adj}


def fno_spectral_conv_centred_backward(dout, cache):
    r"""Gradients ``{"x", "weight_real", "weight_imag"[, "bias"]}``.

    $\bar b = \sum_{b,t}\bar y$; $\bar{\hat Y} = (S')^{*}\operatorname{irfftn}^*(\bar y)$ with $S'$ the
    inverse shift (a permutation: its adjoint is its inverse); on the kept block $\bar{\hat X} = \bar{\hat Y}W^H$ and
    $\bar W = \sum_b \hat X^H\bar{\hat Y}$; $\bar x = \operatorname{rfftn}^*\big(S^{-1}\bar{\hat X}\big)$."""
    X, W, d, grid, dt = cache["X"], cache["W"], cache["d"], cache["grid"], cache["dt"]
    g = as_dout(dout, (X.shape[0],) + grid + (W.shape[-1],), dt)
    axes = tuple(range(1, d + 1))
    dY = cast_complex(irfftn_adjoint(g, axes, cache["norm"]), dt)
    if d > 1:
        dY = cache["unshift_adj"](dY, axes=axes[:-1])
    idx = _centred_index(grid, cache["kept"])
    dX = np.zeros_like(X)
    dX[idx] = (dY[idx][..., None, :] @ np.swapaxes(np.conj(W), -1, -2))[..., 0, :]
    dW = np.moveaxis(np.einsum("b...i,b...o->...io", np.conj(X[idx]), dY[idx]), (-2, -1), (0, 1))
    if d > 1:
        dX = np.fft.ifftshift(dX, axes=axes[:-1])
    grads = {"x": rfftn_adjoint(dX, grid, axes, cache["norm"]).astype(dt, copy=False),
             "weight_real": dW.real.astype(dt, copy=False), "weight_imag": dW.imag.astype(dt, copy=False)}
    if cache["bias_shape"] is not None:
        grads["bias"] = g.sum(axis=tuple(range(d + 1))).reshape(cache["bias_shape"])
    return grads


def fno_spectral_conv_centred(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`fno_spectral_conv_centred_forward`."""
    return fno_spectral_conv_centred_forward(x, params, **config)[0]



def init_fno_centred_params(rng, in_channels: int, out_channels: int, n_modes, *, bias: bool = True,
                            init_std="auto", dtype=np.float64) -> dict:
    r"""Weights shaped as neuraloperator's dense ``SpectralConv(in, out, n_modes)``: ``weight``
    ``(in, out, n_modes[0], ..., n_modes[-1]//2 + 1)``, complex ``normal(0, init_std)`` (real and
    imaginary parts each with std ``init_std/√2``, torch's complex-normal convention),
    ``init_std = "auto"`` = $\sqrt{2/(in+out)}$; ``bias``
    ``(out, 1, ..., 1)`` ``init_std * randn``."""
    in_channels = check_int(in_channels, "in_channels", minimum=1)
    out_channels = check_int(out_channels, "out_channels", minimum=1)
    n_modes = [check_int(m, "n_modes", minimum=1) for m in np.atleast_1d(n_modes).tolist()]
    kept = tuple(n_modes[:-1]) + (n_modes[-1] // 2 + 1,)
    std = (2.0 / (in_channels + out_channels)) ** 0.5 if init_std == "auto" else float(init_std)
    shape = (in_channels, out_channels) + kept
    p = {k: (std / np.sqrt(2.0) * rng.standard_normal(shape)).astype(dtype) for k in ("weight_real", "weight_imag")}
    if bias:
        p["bias"] = (std * rng.standard_normal((out_channels,) + (1,) * len(kept))).astype(dtype)
    return p


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


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


def _check_centred_layout(rng):
    # neuraloperator's centred single-weight layout: FD gradcheck in 1-D, 2-D with odd kept modes
    # on axis 0 and 3-D, with bias, both inverse shifts, all norms; and with an even number 2m of
    # axis-0 modes it equals zongyi-li's two corners (weights1 = upper half, weights2 = lower half)
    # whenever the FFT norm is shared.
    worst = 0.0
    for grid, n_modes, shift, norm in (((6,), (6,), "ifftshift", "forward"), ((5, 6), (3, 4), "ifftshift", "backward"),
                                       ((5, 4), (3, 4), "fftshift", "forward"), ((3, 4, 5), (3, 2, 4), "ifftshift", "ortho")):
        p = init_fno_centred_params(rng, 2, 2, n_modes)
        s = Sample(inputs={"x": rng.standard_normal((2,) + grid + (2,))}, params=p,
                   config={"fft_norm": norm, "inverse_shift": shift})
        worst = max(worst, gradcheck(fno_spectral_conv_centred_forward, fno_spectral_conv_centred_backward, s).max_rel)
    x = rng.standard_normal((2, 8, 7, 3))
    p = init_fno_centred_params(rng, 3, 2, (6, 6), bias=False)
    m1 = 3
    two = {f"weights1_{t}": p[f"weight_{t}"][:, :, m1:] for t in ("real", "imag")}
    two.update({f"weights2_{t}": p[f"weight_{t}"][:, :, :m1] for t in ("real", "imag")})
    err = float(np.abs(fno_spectral_conv_centred(x, p, fft_norm="backward") - fno_spectral_conv(x, two)).max())
    assert err < 1e-12, f"centred layout with even modes differs from the two-corner layout: {err:.2e}"
    return max(worst, err)


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
                "mode_truncation": _check_truncation, "neuraloperator_centred_layout": _check_centred_layout},
    ),
)
