r"""Differentiable sampling: ``grid_sample`` (2-D bilinear / 3-D trilinear, nearest) and
``affine_grid``, in exact PyTorch ``F.grid_sample`` / ``F.affine_grid`` semantics, with gradients
w.r.t. the input, the grid and ``theta``.

Layout: ``x (B, C, H, W)`` with ``grid (B, H_out, W_out, 2)``, or ``x (B, C, D, H, W)`` with
``grid (B, D_out, H_out, W_out, 3)``. The last axis of the grid is **(x, y[, z])** = (width,
height[, depth]) — reversed with respect to the array axes — in normalised coordinates, $-1$ the
left/top edge and $+1$ the right/bottom edge. Output ``(B, C, *out_spatial)``.

Forward (per spatial axis of size $L$, grid coordinate $g$)
-----------------------------------------------------------
1. Unnormalise: $u = \frac{g+1}{2}(L-1)$ (``align_corners=True``: $\pm1$ are the centres of
   the corner pixels) or $u = \frac{(g+1)L - 1}{2}$ (``False``: $\pm1$ are the outer edges of the
   corner pixels). $du/dg = (L-1)/2$ or $L/2$.
2. Padding: ``"zeros"`` keeps $u$ (taps outside the input read 0); ``"border"`` clips
   $c = \min(L-1, \max(u, 0))$; ``"reflection"`` reflects $u$ about the borders — $0$ and $L-1$
   (align_corners) or $-\tfrac12$ and $L-\tfrac12$ — as often as needed, then clips. $dc/du$
   is $0$ where the clip is active and $\pm1$ (the sign flips with each reflection) elsewhere,
   PyTorch's ``clip_coordinates_set_grad`` / ``reflect_coordinates_set_grad``; a border point
   ($c \le 0$ or $c \ge L-1$) counts as clipped, as in PyTorch.
3. Interpolate. Bilinear/trilinear: with $i_a = \lfloor c_a\rfloor$, $f_a = c_a - i_a$,

   $$y_{b,c} = \sum_{\epsilon\in\{0,1\}^n} \Big(\prod_a w_a^{\epsilon_a}\Big)\,
   x_{b,c,\,i+\epsilon},\qquad w_a^{1} = f_a,\ w_a^{0} = 1 - f_a,$$

   each corner counted only if it lies inside the input. Nearest: $x_{b,c,\mathrm{rint}(c)}$
   with ``rint`` rounding half to even (PyTorch's ``nearbyint``), 0 outside.

Backward
--------
$\bar x$: every output gradient is scattered to the (up to $2^n$) corners it read, with the
same weights (``np.add.at``; the transposed interpolation). Grid:
$\partial y/\partial c_a = \sum_\epsilon (\pm1)_{\epsilon_a}\prod_{e\ne a} w_e^{\epsilon_e}
x_{i+\epsilon}$ ($+$ for the upper corner), so $\bar c_a = \sum_c \bar y_c\,\partial y_c/\partial c_a$ and
$\bar g_a = \bar c_a \cdot (dc/du)_a \cdot (du/dg)_a$. Nearest has a zero grid gradient (piecewise
constant), as in PyTorch.

**Kinks.** The sample is not differentiable where a coordinate $c$ is an integer (bilinear: the
corner set changes), a half-integer (nearest: the rounding flips; reflection without
align_corners: the mirror at $-\tfrac12$, $L-\tfrac12$), or at a clip boundary. PyTorch returns
one-sided values there; the samplers place every coordinate at least $0.1$ pixel from integers and
half-integers so that finite differences see a smooth function.

affine_grid
-----------
``F.affine_grid(theta, size, align_corners)``: base coordinates per axis
$\mathrm{linspace}(-1, 1, L)$, scaled by $(L-1)/L$ without align_corners (pixel centres), and $0$
when $L = 1$; then $\mathrm{grid}_{b,p} = \theta_b\,[x_p, y_p(, z_p), 1]^\top$ with
``theta (B, 2, 3)`` (2-D) or ``(B, 3, 4)`` (3-D). Backward:
$\bar\theta_b = \sum_p \bar{\mathrm{grid}}_{b,p}\,[x_p, y_p(, z_p), 1]$.
"""

from __future__ import annotations

import itertools

import numpy as np

from .._checks import as_dout, as_float, check_choice, compute_dtype
from ..registry import Mechanism, Sample, register

__all__ = [
    "grid_sample_forward",
    "grid_sample_backward",
    "grid_sample",
    "grid_sample_apply",
    "grid_sample_vjp",
    "grid_coordinates",
    "affine_grid_forward",
    "affine_grid_backward",
    "affine_grid",
    "affine_grid_apply",
    "affine_grid_vjp",
    "affine_base_grid",
]

MODES = ("bilinear", "nearest")
PADDING_MODES = ("zeros", "border", "reflection")


# --------------------------------------------------------------------------------------------
# Coordinates (unvalidated)


def _reflect(u, twice_low, twice_high):
    """PyTorch's ``reflect_coordinates_set_grad``: the reflected coordinate and its derivative."""
    if twice_low == twice_high:
        return np.zeros_like(u), np.zeros_like(u)
    lo = twice_low / 2
    span = (twice_high - twice_low) / 2
    v = u - lo
    sign = np.where(v < 0, -1.0, 1.0).astype(u.dtype)
    v = np.abs(v)
    extra = np.fmod(v, span)
    even = np.floor(v / span) % 2 == 0
    return np.where(even, extra + lo, span - extra + lo), np.where(even, sign, -sign)


def grid_coordinates(g, size: int, padding_mode: str, align_corners: bool):
    """Pixel coordinate ``c`` of normalised grid values ``g`` along an axis of length ``size``, and
    ``dc/dg`` (steps 1-2 of the module docstring)."""
    if align_corners:
        u, du = (g + 1) / 2 * (size - 1), (size - 1) / 2
    else:
        u, du = ((g + 1) * size - 1) / 2, size / 2
    if padding_mode == "zeros":
        return u, np.full_like(u, du)
    m = np.ones_like(u)
    if padding_mode == "reflection":
        u, m = _reflect(u, 0, 2 * (size - 1)) if align_corners else _reflect(u, -1, 2 * size - 1)
    m = m * ((u > 0) & (u < size - 1))
    return np.clip(u, 0, size - 1), m * du


def _corners(coords, spatial):
    """For each of the 2^n corners: flat index into the input (clipped), validity, the per-axis
    weights and their signs (+1 for the upper neighbour)."""
    base = [np.floor(c) for c in coords]
    frac = [c - b for c, b in zip(coords, base)]
    base = [b.astype(np.int64) for b in base]
    for bits in itertools.product((0, 1), repeat=len(coords)):
        idx = [b + e for b, e in zip(base, bits)]
        valid = np.logical_and.reduce([(i >= 0) & (i < L) for i, L in zip(idx, spatial)])
        flat = np.ravel_multi_index([np.clip(i, 0, L - 1) for i, L in zip(idx, spatial)], spatial)
        weights = [f if e else 1 - f for f, e in zip(frac, bits)]
        yield flat, valid, weights, [1.0 if e else -1.0 for e in bits]


def _nearest(coords, spatial):
    idx = [np.rint(c).astype(np.int64) for c in coords]  # half to even, as PyTorch's nearbyint
    valid = np.logical_and.reduce([(i >= 0) & (i < L) for i, L in zip(idx, spatial)])
    return np.ravel_multi_index([np.clip(i, 0, L - 1) for i, L in zip(idx, spatial)], spatial), valid


def _gather(xf, flat):
    """``xf (B, C, S)``, ``flat (B, P)`` -> ``(B, C, P)``."""
    return np.take_along_axis(xf, flat[:, None, :], axis=2)


def _scatter(dxt, flat, vals):
    """Add ``vals (B, C, P)`` into ``dxt (B, S, C)`` at ``flat (B, P)`` (repeated indices add)."""
    np.add.at(dxt, (np.arange(flat.shape[0])[:, None], flat), np.swapaxes(vals, 1, 2))


def grid_sample_apply(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False):
    """Unvalidated ``F.grid_sample`` for ``x (B, C, *S)`` and ``grid (B, *O, n)``, ``n = x.ndim - 2``."""
    n = x.ndim - 2
    spatial = x.shape[2:]
    B, C = x.shape[:2]
    out_sp = grid.shape[1:-1]
    g = grid.reshape(B, -1, n)
    coords = [grid_coordinates(g[..., n - 1 - a], spatial[a], padding_mode, align_corners)[0] for a in range(n)]
    xf = x.reshape(B, C, -1)
    if mode == "nearest":
        flat, valid = _nearest(coords, spatial)
        y = _gather(xf, flat) * valid[:, None, :].astype(x.dtype)
    else:
        y = np.zeros((B, C, g.shape[1]), dtype=x.dtype)
        for flat, valid, w, _ in _corners(coords, spatial):
            y += (np.prod(w, axis=0) * valid)[:, None, :] * _gather(xf, flat)
    return y.reshape((B, C) + out_sp)


def grid_sample_vjp(dy, x, grid, mode="bilinear", padding_mode="zeros", align_corners=False) -> dict:
    """Unvalidated gradients of :func:`grid_sample_apply`: ``{"x", "grid"}``."""
    n = x.ndim - 2
    spatial = x.shape[2:]
    B, C = x.shape[:2]
    g = grid.reshape(B, -1, n)
    cm = [grid_coordinates(g[..., n - 1 - a], spatial[a], padding_mode, align_corners) for a in range(n)]
    coords = [c for c, _ in cm]
    xf = x.reshape(B, C, -1)
    gy = dy.reshape(B, C, -1)
    dxt = np.zeros((B, xf.shape[2], C), dtype=x.dtype)
    dgrid = np.zeros_like(g)
    if mode == "nearest":
        flat, valid = _nearest(coords, spatial)
        _scatter(dxt, flat, gy * valid[:, None, :])
    else:
        dc = [np.zeros(g.shape[:2], dtype=x.dtype) for _ in range(n)]
        for flat, valid, w, signs in _corners(coords, spatial):
            _scatter(dxt, flat, gy * (np.prod(w, axis=0) * valid)[:, None, :])
            gv = np.sum(gy * _gather(xf, flat), axis=1) * valid  # (B, P)
            for a in range(n):
                others = np.prod([w[e] for e in range(n) if e != a], axis=0) if n > 1 else 1.0
                dc[a] += signs[a] * others * gv
        for a in range(n):
            dgrid[..., n - 1 - a] = dc[a] * cm[a][1]
    return {"x": np.swapaxes(dxt, 1, 2).reshape(x.shape), "grid": dgrid.reshape(grid.shape)}


def affine_base_grid(spatial, align_corners: bool, dtype=np.float64) -> np.ndarray:
    """``(prod(spatial), n + 1)`` rows $[x, y(, z), 1]$ of PyTorch's ``affine_grid`` base grid
    (x runs along the last array axis)."""
    def lin(L):
        if L <= 1:
            return np.zeros(1, dtype=np.float64)
        r = np.linspace(-1.0, 1.0, L)
        return r if align_corners else r * (L - 1) / L
    axes = np.meshgrid(*[lin(L) for L in spatial], indexing="ij")
    cols = [a.reshape(-1) for a in axes[::-1]] + [np.ones(int(np.prod(spatial)))]
    return np.stack(cols, axis=1).astype(dtype)


def affine_grid_apply(theta, spatial, align_corners=False):
    """Unvalidated ``F.affine_grid``: ``theta (B, n, n+1)`` -> ``grid (B, *spatial, n)``."""
    base = affine_base_grid(spatial, align_corners, theta.dtype)
    return (base @ np.swapaxes(theta, 1, 2)).reshape((theta.shape[0],) + tuple(spatial) + (theta.shape[1],))


def affine_grid_vjp(dgrid, spatial, align_corners=False):
    r"""Unvalidated gradient of :func:`affine_grid_apply`: $\bar\theta_b = \bar G_b^\top [\mathrm{base}]$."""
    n = dgrid.shape[-1]
    base = affine_base_grid(spatial, align_corners, dgrid.dtype)
    return np.swapaxes(dgrid.reshape(dgrid.shape[0], -1, n), 1, 2) @ base


# --------------------------------------------------------------------------------------------
# Validated pairs


def _check_flag(value, name):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool; got {type(value).__name__}")
    return bool(value)


def grid_sample_forward(x, grid, *, mode: str = "bilinear", padding_mode: str = "zeros", align_corners: bool = False):
    r"""Sample ``x`` at the grid's normalised coordinates, ``F.grid_sample`` semantics.

    Parameters
    ----------
    x : array (B, C, H, W) or (B, C, D, H, W)
    grid : array (B, H_out, W_out, 2) or (B, D_out, H_out, W_out, 3)
        Last axis (x, y[, z]): x indexes W, y indexes H, z indexes D; $[-1, 1]$ spans the input.
    mode : ``"bilinear"`` (trilinear for 5-D input) or ``"nearest"``
        (``"bicubic"`` is not implemented.)
    padding_mode : ``"zeros"``, ``"border"`` or ``"reflection"``
    align_corners : bool
        Default False (PyTorch's default since 1.3).

    Returns
    -------
    y, cache
        ``y (B, C, *out_spatial)``.
    """
    x = as_float(x, "x")
    grid = as_float(grid, "grid")
    if x.ndim not in (4, 5):
        raise ValueError(f"x must be (B, C, H, W) or (B, C, D, H, W); got shape {x.shape}")
    n = x.ndim - 2
    if grid.ndim != x.ndim or grid.shape[-1] != n:
        want = "(B, H_out, W_out, 2)" if n == 2 else "(B, D_out, H_out, W_out, 3)"
        raise ValueError(f"grid must have shape {want} for x of shape {x.shape}; got {grid.shape}")
    if grid.shape[0] != x.shape[0]:
        raise ValueError(f"grid and x must have the same batch size; got grid {grid.shape}, x {x.shape}")
    check_choice(mode, "mode", MODES)
    check_choice(padding_mode, "padding_mode", PADDING_MODES)
    align_corners = _check_flag(align_corners, "align_corners")
    dt = compute_dtype(x, grid)
    x, grid = x.astype(dt, copy=False), grid.astype(dt, copy=False)
    cfg = {"mode": mode, "padding_mode": padding_mode, "align_corners": align_corners}
    y = grid_sample_apply(x, grid, **cfg)
    return y, {"x": x, "grid": grid, "cfg": cfg, "out_shape": y.shape}


def grid_sample_backward(dout, cache):
    r"""Gradients of :func:`grid_sample_forward`: ``{"x", "grid"}`` (scatter of ``dout`` to the corners
    read; $\bar g = \bar c\cdot dc/dg$; zero grid gradient for ``mode="nearest"``)."""
    g = as_dout(dout, cache["out_shape"], cache["x"].dtype)
    return grid_sample_vjp(g, cache["x"], cache["grid"], **cache["cfg"])


def grid_sample(x, grid, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`grid_sample_forward`."""
    return grid_sample_forward(x, grid, **config)[0]


def affine_grid_forward(theta, *, size, align_corners: bool = False):
    r"""Sampling grid of a batch of affine maps, ``F.affine_grid`` semantics.

    Parameters
    ----------
    theta : array (B, 2, 3) or (B, 3, 4)
        Maps output coordinates $[x, y(, z), 1]$ to input coordinates (normalised).
    size : tuple of ints
        The target size ``(B, C, H, W)`` or ``(B, C, D, H, W)`` (``C`` is unused, as in PyTorch).
    align_corners : bool
        As :func:`grid_sample_forward`; use the same value for both.

    Returns
    -------
    grid, cache
        ``grid (B, H, W, 2)`` or ``(B, D, H, W, 3)``.
    """
    theta = as_float(theta, "theta", ndim=3)
    if theta.shape[1:] not in ((2, 3), (3, 4)):
        raise ValueError(f"theta must have shape (B, 2, 3) (2-D) or (B, 3, 4) (3-D); got {theta.shape}")
    n = theta.shape[1]
    if not isinstance(size, (tuple, list)) or len(size) != n + 2 or any(
            isinstance(s, (bool, np.bool_)) or not isinstance(s, (int, np.integer)) or s < 1 for s in size):
        want = "(B, C, H, W)" if n == 2 else "(B, C, D, H, W)"
        raise ValueError(f"size must be {want} (positive ints) for theta of shape {theta.shape}; got {size!r}")
    if size[0] != theta.shape[0]:
        raise ValueError(f"size[0] ({size[0]}) must equal the batch size of theta ({theta.shape[0]})")
    align_corners = _check_flag(align_corners, "align_corners")
    spatial = tuple(int(s) for s in size[2:])
    grid = affine_grid_apply(theta, spatial, align_corners)
    return grid, {"spatial": spatial, "align_corners": align_corners, "shape": grid.shape, "dtype": theta.dtype}


def affine_grid_backward(dout, cache):
    r"""Gradient of :func:`affine_grid_forward`: ``{"theta"}``, $\bar\theta_b = \sum_p \bar g_{b,p}[x_p, y_p(, z_p), 1]$."""
    g = as_dout(dout, cache["shape"], cache["dtype"])
    return {"theta": affine_grid_vjp(g, cache["spatial"], cache["align_corners"])}


def affine_grid(theta, *, size, align_corners: bool = False) -> np.ndarray:
    """Convenience wrapper: the output of :func:`affine_grid_forward`."""
    return affine_grid_forward(theta, size=size, align_corners=align_corners)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _kink_free_grid(rng, shape, spatial, align_corners):
    """Grid values whose pixel coordinates lie in [-2, L+1) at >= 0.1 from every integer and
    half-integer (the kinks of bilinear/nearest/reflection; see the module docstring)."""
    n = len(spatial)
    grid = np.empty(shape + (n,))
    for a in range(n):
        L = spatial[n - 1 - a]  # grid component a indexes array axis n-1-a
        frac = rng.uniform(0.1, 0.4, shape) + 0.5 * rng.integers(0, 2, shape)
        u = rng.integers(-2, L + 1, shape) + frac
        grid[..., a] = 2 * u / (L - 1) - 1 if align_corners else (2 * u + 1) / L - 1
    return grid


def _sample_grid(rng, size):
    n = int(rng.integers(2, 4))
    if size == "tiny":
        spatial, out, c = ((3, 4), (3, 3), 2) if n == 2 else ((3, 3, 3), (2, 2, 2), 1)
    else:
        spatial, out, c = ((5, 6), (4, 5), 3) if n == 2 else ((4, 3, 5), (3, 2, 3), 2)
    align = bool(rng.random() < 0.5)
    x = rng.standard_normal((2, c) + spatial)
    grid = _kink_free_grid(rng, (2,) + out, spatial, align)
    cfg = {"mode": MODES[int(rng.random() < 0.25)], "padding_mode": PADDING_MODES[int(rng.integers(0, 3))],
           "align_corners": align}
    return Sample(inputs={"x": x, "grid": grid}, config=cfg)


def _ref_coord(g, L, padding_mode, align):
    # Scalar transcription of PyTorch's grid_sampler_compute_source_index.
    u = (g + 1) / 2 * (L - 1) if align else ((g + 1) * L - 1) / 2
    if padding_mode == "zeros":
        return u
    if padding_mode == "reflection":
        lo2, hi2 = (0, 2 * (L - 1)) if align else (-1, 2 * L - 1)
        if lo2 == hi2:
            return 0.0
        lo, span = lo2 / 2, (hi2 - lo2) / 2
        v = abs(u - lo)
        extra, flips = v % span, int(v // span)
        u = extra + lo if flips % 2 == 0 else span - extra + lo
    return min(L - 1.0, max(u, 0.0))


def _grid_reference(x, grid, *, mode="bilinear", padding_mode="zeros", align_corners=False):
    n = x.ndim - 2
    spatial = x.shape[2:]
    out_sp = grid.shape[1:-1]
    y = np.zeros(x.shape[:2] + out_sp)
    for b in range(x.shape[0]):
        for p in np.ndindex(*out_sp):
            c = [_ref_coord(float(grid[(b,) + p + (n - 1 - a,)]), spatial[a], padding_mode, align_corners)
                 for a in range(n)]
            if mode == "nearest":
                i = tuple(int(np.rint(ci)) for ci in c)
                if all(0 <= ii < L for ii, L in zip(i, spatial)):
                    y[(b, slice(None)) + p] = x[(b, slice(None)) + i]
                continue
            for bits in itertools.product((0, 1), repeat=n):
                i = tuple(int(np.floor(ci)) + e for ci, e in zip(c, bits))
                if all(0 <= ii < L for ii, L in zip(i, spatial)):
                    w = np.prod([ci - np.floor(ci) if e else 1 - (ci - np.floor(ci)) for ci, e in zip(c, bits)])
                    y[(b, slice(None)) + p] += w * x[(b, slice(None)) + i]
    return y


def _check_identity_grid(rng):
    # The identity affine grid samples every pixel exactly (both align_corners conventions, 2-D/3-D).
    err = 0.0
    for shape in [(2, 3, 4, 5), (2, 2, 3, 4, 2)]:
        x = rng.standard_normal(shape)
        n = x.ndim - 2
        theta = np.broadcast_to(np.eye(n, n + 1), (2, n, n + 1))
        for align in (True, False):
            grid = affine_grid(theta, size=shape, align_corners=align)
            for mode in MODES:
                for pad in PADDING_MODES:
                    y = grid_sample(x, grid, mode=mode, padding_mode=pad, align_corners=align)
                    err = max(err, float(np.abs(y - x).max()))
    assert err < 1e-12, f"grid_sample on the identity grid != input (err {err})"
    return err


def _check_integer_translation(rng):
    # Shifting the identity grid by 2 pixels along x (align_corners=True: 2 * 2/(W-1)) reads
    # x[..., j + 2]: zeros padding past the edge, border padding repeats the last column.
    x = rng.standard_normal((2, 2, 4, 6))
    theta = np.broadcast_to(np.array([[1.0, 0, 4 / 5], [0, 1, 0]]), (2, 2, 3))
    grid = affine_grid(theta, size=x.shape, align_corners=True)
    y0 = grid_sample(x, grid, padding_mode="zeros", align_corners=True)
    yb = grid_sample(x, grid, padding_mode="border", align_corners=True)
    want0 = np.concatenate([x[..., 2:], np.zeros_like(x[..., :2])], axis=-1)
    wantb = np.concatenate([x[..., 2:], x[..., -1:], x[..., -1:]], axis=-1)
    err = max(float(np.abs(y0 - want0).max()), float(np.abs(yb - wantb).max()))
    assert err < 1e-12, f"integer translation is not an exact shift (err {err})"
    return err


def _check_affine_function_reproduced(rng):
    # Bilinear interpolation is exact for affine functions of the pixel coordinates (interior).
    i, j = np.meshgrid(np.arange(5.0), np.arange(6.0), indexing="ij")
    x = np.broadcast_to(0.7 * i - 1.3 * j + 0.2, (2, 1, 5, 6))
    grid = _kink_free_grid(rng, (2, 4, 4), (5, 6), False)
    grid = np.clip(grid, -0.8, 0.8)  # interior: every corner inside
    y = grid_sample(x, grid, align_corners=False)
    u = ((grid[..., 0] + 1) * 6 - 1) / 2
    v = ((grid[..., 1] + 1) * 5 - 1) / 2
    err = float(np.abs(y[:, 0] - (0.7 * v - 1.3 * u + 0.2)).max())
    assert err < 1e-12, f"bilinear sampling of an affine function is not exact (err {err})"
    return err


def _check_nearest_zero_grid_grad(rng):
    s = _sample_grid(rng, "small")
    y, cache = grid_sample_forward(**s.inputs, **dict(s.config, mode="nearest"))
    g = grid_sample_backward(rng.standard_normal(y.shape), cache)
    assert not np.any(g["grid"]), "nearest mode must have a zero grid gradient"
    return 0.0


def _sample_affine(rng, size):
    n = int(rng.integers(2, 4))
    spatial = ((int(rng.integers(2, 5)), int(rng.integers(2, 5))) if n == 2 else (2, 3, int(rng.integers(2, 4)))) \
        if size == "tiny" else tuple(int(v) for v in rng.integers(3, 8, n))
    theta = np.eye(n, n + 1) + 0.3 * rng.standard_normal((2, n, n + 1))
    return Sample(inputs={"theta": theta}, config={"size": (2, 1) + spatial, "align_corners": bool(rng.random() < 0.5)})


def _affine_reference(theta, *, size, align_corners=False):
    n = theta.shape[1]
    spatial = size[2:]
    grid = np.zeros((theta.shape[0],) + tuple(spatial) + (n,))
    for b in range(theta.shape[0]):
        for p in np.ndindex(*spatial):
            pt = []
            for a in range(n - 1, -1, -1):  # x from the last array axis
                L, i = spatial[a], p[a]
                pt.append(0.0 if L == 1 else (-1 + 2 * i / (L - 1) if align_corners else (2 * i + 1) / L - 1))
            grid[(b,) + p] = theta[b] @ np.array(pt + [1.0])
    return grid


def _check_affine_identity(rng):
    # Identity theta gives the base grid: corner centres at +-1 (align_corners) or +-(1 - 1/L).
    g = affine_grid(np.broadcast_to(np.eye(2, 3), (2, 2, 3)), size=(2, 1, 3, 5), align_corners=True)
    err = float(np.abs(g[0, 0, 0] - [-1, -1]).max() + np.abs(g[0, -1, -1] - [1, 1]).max())
    g = affine_grid(np.broadcast_to(np.eye(2, 3), (2, 2, 3)), size=(2, 1, 3, 5), align_corners=False)
    err += float(np.abs(g[1, -1, -1] - [1 - 1 / 5, 1 - 1 / 3]).max())
    assert err < 1e-14, f"identity affine grid corners are wrong (err {err})"
    return err


_DOCS = "building-blocks.md#convolution-sampling-pooling-and-windows"
register(
    Mechanism(
        slug="grid_sample", family="5-building-blocks", tier="primitive",
        title="grid_sample: bilinear/trilinear and nearest sampling (F.grid_sample; zeros/border/reflection)",
        paper="Jaderberg, Simonyan, Zisserman, Kavukcuoglu, Spatial Transformer Networks, NeurIPS 2015, "
              "arXiv 1506.02025; PyTorch torch.nn.functional.grid_sample",
        forward=grid_sample_forward, backward=grid_sample_backward, sample=_sample_grid, reference=_grid_reference,
        docs=_DOCS, checks={"identity_grid": _check_identity_grid, "integer_translation": _check_integer_translation,
                            "affine_function_exact": _check_affine_function_reproduced,
                            "nearest_zero_grid_gradient": _check_nearest_zero_grid_grad},
        notes="not differentiable at integer / half-integer pixel coordinates and clip borders: the "
              "sampler keeps every coordinate >= 0.1 pixel away",
    ),
    Mechanism(
        slug="affine_grid", family="5-building-blocks", tier="primitive",
        title="affine_grid: sampling grid of affine maps (F.affine_grid, 2-D and 3-D)",
        paper="Jaderberg et al., Spatial Transformer Networks, NeurIPS 2015, arXiv 1506.02025; "
              "PyTorch torch.nn.functional.affine_grid",
        forward=affine_grid_forward, backward=affine_grid_backward, sample=_sample_affine,
        reference=_affine_reference, docs=_DOCS, checks={"identity_theta": _check_affine_identity},
    ),
)
