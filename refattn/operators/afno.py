r"""AFNO token mixer and DPOT's variant: a block-diagonal complex 2-layer MLP per Fourier mode.

Papers: Guibas et al., "Adaptive Fourier Neural Operators: Efficient Token Mixers for
Transformers", ICLR 2022, arXiv 2111.13587; Hao et al., "DPOT: Auto-Regressive Denoising Operator
Transformer for Large-Scale PDE Pre-Training", ICML 2024. Upstream: NVlabs/AFNO-transformer
``afno/afno2d.py`` @ 941e924ffdb34cb93897b5fd6e22e5965fdc1111 (unchanged since c3271a2; measured
agreement with the real ``AFNO2D`` in float64 <= 6.4e-16, docs); thu-ml/DPOT ``models/dpot.py``
(``AFNO2D``, commit dcd2f9a).

The mixer acts on a grid function stored channel-last, ``x (B, H, W, C)`` (the upstream
PyTorch modules are channel-first ``(B, C, H, W)`` or token-major ``(B, H*W, C)``). The FFT runs
over the two spatial axes; the *last* spatial axis is the halved (``rfft``) axis.

Forward
-------
On the retained modes only (elsewhere zero, biases included):

$$\hat X = \operatorname{rfft2}(x),\quad O_1 = \sigma_{\mathbb C}(\hat X W_1 + b_1),\quad
O_2 = O_1 W_2 + b_2,\quad y = \operatorname{irfft2}\big(S_\lambda(O_2)\big) + x,$$

$W_1, W_2$ block-diagonal over ``num_blocks`` channel blocks, complex products in real form
``(Re·w[0] − Im·w[1], Im·w[0] + Re·w[1])``, $\sigma_{\mathbb C}$ on real and imaginary parts
separately, $S_\lambda$ the softshrink of both parts.

Backward
--------
$\bar S = \operatorname{irfft2}^*(\bar y)$ on the kept modes (``irfftn_adjoint``),
$\bar O_2 = \bar S\odot[|O_2|>\lambda]$, the real-form complex linear VJPs and the activation
derivative (written out in ``afno_mixer_backward``), then
$\bar x = \operatorname{rfft2}^*(\bar{\hat X}) + \bar y$ (``rfftn_adjoint`` plus the residual).
The real-FFT adjoints are derived in the module docstring of ``refattn.operators.common`` (shared
with the FNO layer). ReLU and softshrink have kinks: the sampler rejects draws within
$2\cdot10^{-4}$ of them.

Conventions
-----------
The two "AFNO" codes differ in four places (``mode_selection``, ``activation``, ``softshrink``,
init); each is a keyword, tabulated in ``afno_mixer_forward``. ``kept_modes_from`` reproduces the
token count AFNO uses for its ``hard_thresholding_fraction`` (``N = H*W`` at commit
c3271a2/941e924, ``W`` in later copies). ``"fno_two_corners"`` is the FNO selection, for
comparison. DPOT's block (``GroupNorm`` → filter → double skip → MLP) is not part of this layer.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, check_choice, check_int, check_positive, compute_dtype
from ..nn.activations import gelu, gelu_grad
from ..registry import Mechanism, Sample, register
from ..testing.gradcheck import gradcheck
from .common import FFT_NORMS, cast_complex, irfftn_adjoint, rfftn_adjoint

__all__ = ["afno_mixer_forward", "afno_mixer_backward", "afno_mixer", "init_afno_params"]

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


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


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
