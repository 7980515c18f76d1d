r"""N-d average, max and adaptive average pooling (PyTorch ``F.avg_pool{1,2,3}d``,
``F.max_pool{1,2,3}d``, ``F.adaptive_avg_pool{1,2,3}d``), with hand-derived backward passes.

Layout: channels first, ``x (B, C, *spatial)``; ``n`` spatial axes, ``n = len(kernel_size)``
when a tuple is given, else ``x.ndim - 2``. Every window is read with the im2col view of
:mod:`refattn.nn.conv` and every backward scatters with its adjoint, col2im.

Window geometry (PyTorch's ``pooling_output_shape``)
----------------------------------------------------
Per axis, with kernel $k$, stride $s$ (default $k$), padding $p\le\lfloor k/2\rfloor$,
dilation $d$ (max pool only):

$$O = \Big\lfloor\frac{L + 2p - d(k-1) - 1 + [\text{ceil}](s-1)}{s}\Big\rfloor + 1,$$

and with ``ceil_mode`` the last window is dropped when it would start in the right padding,
$(O-1)s \ge L + p$. Window $o$ covers $[os - p,\ os - p + d(k-1)]$; a window may run past
$L + p$ in ceil mode (that overhang is never counted).

Average pooling
---------------
$y_o = \frac{1}{D_o}\sum_{j} x_{os-p+j}$ over the real entries of the window (padding adds 0),
with the divisor (per axis, multiplied over axes as PyTorch does)

* ``count_include_pad=True``: $D = \min(os-p+k,\ L+p) - (os-p)$ — the window clipped to the
  padded extent (padding counted, ceil overhang not);
* ``count_include_pad=False``: $D = \min(os-p+k,\ L) - \max(os-p,\ 0)$ — real entries only;
* ``divisor_override`` $=D$ for every window.

Backward: $y$ is linear, $\bar x_i = \sum_{o:\ i\in\text{window}(o)} \bar y_o / D_o$ (col2im of
$\bar y/D$ broadcast over the window, then the padding cropped).

Max pooling
-----------
$y_o = \max_{j} x_{os-p+jd}$ with $-\infty$ padding. The backward routes $\bar y_o$ to the
arg-max $j^*(o)$, held fixed (the first maximum in row-major window order, as PyTorch's CPU
kernel and ``np.argmax``); $\bar x_i = \sum_{o:\ \text{argmax}(o) = i}\bar y_o$. The map is
piecewise linear: it is not differentiable at ties, which the sampler avoids.

Adaptive average pooling
------------------------
Output bin $i$ of $O$ over an axis of length $L$ averages $[\lfloor iL/O\rfloor,
\lceil (i+1)L/O\rceil)$ (PyTorch's ``start_index``/``end_index``; bins overlap when $L$ is not a
multiple of $O$, and $O > L$ is allowed). Per axis this is a fixed row-stochastic matrix
$A\in\mathbb R^{O\times L}$; the N-d pool applies one per axis, and the backward applies
$A^\top$ per axis.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float
from ..registry import Mechanism, Sample, register
from .conv import check_int_tuple, col2im, conv, im2col, pad_nd, pad_nd_vjp

__all__ = [
    "avg_pool_forward",
    "avg_pool_backward",
    "avg_pool",
    "avg_pool_apply",
    "avg_pool_vjp",
    "max_pool_forward",
    "max_pool_backward",
    "max_pool",
    "max_pool_apply",
    "max_pool_vjp",
    "adaptive_avg_pool_forward",
    "adaptive_avg_pool_backward",
    "adaptive_avg_pool",
    "adaptive_avg_pool_apply",
    "adaptive_avg_pool_vjp",
    "adaptive_pool_matrix",
    "pool_output_size",
]


def pool_output_size(length: int, kernel: int, stride: int, padding: int, dilation: int, ceil_mode: bool) -> int:
    """PyTorch's ``pooling_output_shape`` for one axis (see the module docstring)."""
    num = length + 2 * padding - dilation * (kernel - 1) - 1 + (stride - 1 if ceil_mode else 0)
    out = num // stride + 1
    if ceil_mode and (out - 1) * stride >= length + padding:
        out -= 1
    return out


def _pool_config(x_ndim, kernel_size, stride, padding, dilation, ceil_mode):
    """Normalised ``(n, k, s, p, d)``; raises naming the argument."""
    n = len(kernel_size) if isinstance(kernel_size, (tuple, list)) else x_ndim - 2
    if n < 1:
        raise ValueError(f"x must be (B, C, *spatial) with at least one spatial axis; got {x_ndim} dimensions")
    k = check_int_tuple(kernel_size, n, "kernel_size", minimum=1)
    s = k if stride is None else check_int_tuple(stride, n, "stride", minimum=1)
    p = check_int_tuple(padding, n, "padding")
    d = check_int_tuple(dilation, n, "dilation", minimum=1)
    if any(pi > ki // 2 for pi, ki in zip(p, k)):
        raise ValueError(f"padding must be at most half the kernel size (PyTorch's rule): got padding {p}, "
                         f"kernel_size {k}")
    if not isinstance(ceil_mode, (bool, np.bool_)):
        raise TypeError(f"ceil_mode must be a bool; got {type(ceil_mode).__name__}")
    return n, k, s, p, d


def _windows(x, k, s, p, d, ceil_mode, value):
    """Output size, the padding used (right side extended for ceil mode) and the im2col view."""
    n = len(k)
    spatial = x.shape[-n:]
    osz = tuple(pool_output_size(li, ki, si, pi, di, ceil_mode) for li, ki, si, pi, di in zip(spatial, k, s, p, d))
    need = tuple((oi - 1) * si + di * (ki - 1) + 1 for oi, si, di, ki in zip(osz, s, d, k))
    pads = tuple((pi, max(ni - li - pi, 0)) for pi, ni, li in zip(p, need, spatial))
    xp = pad_nd(x, pads, "zeros", value)
    return osz, pads, xp, im2col(xp, k, s, d, osz)


def _divisor(spatial, osz, k, s, p, count_include_pad, divisor_override, dtype):
    if divisor_override is not None:
        return np.asarray(divisor_override, dtype=dtype)
    div = np.ones((), dtype=dtype)
    for ax, (li, oi, ki, si, pi) in enumerate(zip(spatial, osz, k, s, p)):
        start = np.arange(oi) * si - pi
        end = np.minimum(start + ki, li + pi)
        cnt = end - start if count_include_pad else np.minimum(end, li) - np.maximum(start, 0)
        div = div * cnt.astype(dtype).reshape((-1,) + (1,) * (len(osz) - ax - 1))
    return div


# --------------------------------------------------------------------------------------------
# Unvalidated helpers


def avg_pool_apply(x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                   divisor_override=None):
    """Unvalidated ``F.avg_pool{n}d`` over the last ``n`` axes (``n`` from ``kernel_size``)."""
    n, k, s, p, _ = _pool_config(x.ndim, kernel_size, stride, padding, 1, ceil_mode)
    osz, _, _, cols = _windows(x, k, s, p, (1,) * n, ceil_mode, 0.0)
    div = _divisor(x.shape[-n:], osz, k, s, p, count_include_pad, divisor_override, x.dtype)
    return cols.sum(axis=tuple(range(-n, 0))) / div


def avg_pool_vjp(dy, x_shape, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                 divisor_override=None):
    """Unvalidated gradient of :func:`avg_pool_apply` w.r.t. ``x`` of shape ``x_shape``."""
    n, k, s, p, d = _pool_config(len(x_shape), kernel_size, stride, padding, 1, ceil_mode)
    spatial = tuple(x_shape[-n:])
    osz = dy.shape[-n:]
    need = tuple((oi - 1) * si + ki for oi, si, ki in zip(osz, s, k))
    pads = tuple((pi, max(ni - li - pi, 0)) for pi, ni, li in zip(p, need, spatial))
    g = dy / _divisor(spatial, osz, k, s, p, count_include_pad, divisor_override, dy.dtype)
    cols = np.broadcast_to(g.reshape(g.shape + (1,) * n), g.shape + k)
    padded = tuple(li + lo + hi for li, (lo, hi) in zip(spatial, pads))
    return pad_nd_vjp(col2im(cols, padded, s, d), pads)


def max_pool_apply(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    """Unvalidated ``F.max_pool{n}d``: returns ``(y, argmax)``, ``argmax`` the flat index of the
    maximum inside each window (row-major over the kernel offsets), for :func:`max_pool_vjp`."""
    n, k, s, p, d = _pool_config(x.ndim, kernel_size, stride, padding, dilation, ceil_mode)
    _, _, _, cols = _windows(x, k, s, p, d, ceil_mode, -np.inf)
    flat = cols.reshape(cols.shape[:-n] + (-1,))
    arg = np.argmax(flat, axis=-1)
    return np.take_along_axis(flat, arg[..., None], axis=-1)[..., 0], arg


def max_pool_vjp(dy, argmax, x_shape, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    """Unvalidated gradient of :func:`max_pool_apply`: ``dy`` routed to each window's ``argmax``."""
    n, k, s, p, d = _pool_config(len(x_shape), kernel_size, stride, padding, dilation, ceil_mode)
    spatial = tuple(x_shape[-n:])
    osz = dy.shape[-n:]
    need = tuple((oi - 1) * si + di * (ki - 1) + 1 for oi, si, di, ki in zip(osz, s, d, k))
    pads = tuple((pi, max(ni - li - pi, 0)) for pi, ni, li in zip(p, need, spatial))
    cols = np.zeros(dy.shape + (int(np.prod(k)),), dtype=dy.dtype)
    np.put_along_axis(cols, argmax[..., None], dy[..., None], axis=-1)
    padded = tuple(li + lo + hi for li, (lo, hi) in zip(spatial, pads))
    return pad_nd_vjp(col2im(cols.reshape(dy.shape + k), padded, s, d), pads)


def adaptive_pool_matrix(length: int, out: int, dtype=np.float64) -> np.ndarray:
    r"""The ``(out, length)`` averaging matrix of one axis: row $i$ is uniform on
    $[\lfloor iL/O\rfloor, \lceil (i+1)L/O\rceil)$."""
    i = np.arange(out)
    start = (i * length) // out
    end = -((-(i + 1) * length) // out)
    j = np.arange(length)
    inside = (j >= start[:, None]) & (j < end[:, None])
    return (inside / (end - start)[:, None]).astype(dtype)


def _adaptive_sizes(x_shape, output_size):
    n = len(output_size) if isinstance(output_size, (tuple, list)) else len(x_shape) - 2
    if n < 1:
        raise ValueError(f"x must be (B, C, *spatial) with at least one spatial axis; got shape {tuple(x_shape)}")
    items = output_size if isinstance(output_size, (tuple, list)) else (output_size,) * n
    spatial = tuple(x_shape[-n:])
    filled = tuple(li if oi is None else oi for oi, li in zip(items, spatial))
    return n, check_int_tuple(filled, n, "output_size", minimum=1)


def adaptive_avg_pool_apply(x, output_size):
    """Unvalidated ``F.adaptive_avg_pool{n}d`` over the last ``n`` axes (``None`` keeps a size)."""
    n, osz = _adaptive_sizes(x.shape, output_size)
    y = x
    for i, oi in enumerate(osz):
        ax = x.ndim - n + i
        a = adaptive_pool_matrix(x.shape[ax], oi, x.dtype)
        y = np.moveaxis(np.moveaxis(y, ax, -1) @ a.T, -1, ax)
    return y


def adaptive_avg_pool_vjp(dy, x_shape):
    """Unvalidated gradient of :func:`adaptive_avg_pool_apply`: $A^\\top$ along each pooled axis
    (every axis whose size changed; an unchanged size is the identity matrix)."""
    g = dy
    for ax in range(dy.ndim):
        if dy.shape[ax] == x_shape[ax]:
            continue
        a = adaptive_pool_matrix(x_shape[ax], dy.shape[ax], dy.dtype)
        g = np.moveaxis(np.moveaxis(g, ax, -1) @ a, -1, ax)
    return g


# --------------------------------------------------------------------------------------------
# Validated pairs


def _check_x(x, n):
    if x.ndim != n + 2:
        raise ValueError(f"x must be (B, C, *spatial) with {n} spatial axes (one per kernel_size entry), i.e. "
                         f"{n + 2} dimensions; got shape {x.shape}")


def _check_fits(x, osz, what):
    if min(osz) < 1:
        raise ValueError(f"x of spatial shape {x.shape[2:]} is smaller than the (padded) {what}: output {osz}")


def avg_pool_forward(x, *, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
                     count_include_pad: bool = True, divisor_override=None):
    r"""Average pooling, ``F.avg_pool{n}d`` semantics.

    Parameters
    ----------
    x : array (B, C, *spatial)
    kernel_size : int or tuple of n ints
        A tuple sets the number of spatial axes ``n``; an int means ``n = x.ndim - 2``.
    stride : int, tuple or None
        Default ``kernel_size`` (PyTorch).
    padding : int or tuple
        Implicit zeros, at most ``kernel_size // 2``.
    ceil_mode : bool
        Ceil instead of floor in the output size (a last window may run past the end).
    count_include_pad : bool
        Whether padded zeros count in the divisor (PyTorch default True); see the module docstring.
    divisor_override : int or None
        A fixed non-zero divisor for every window.

    Returns
    -------
    y, cache
        ``y (B, C, *O)``.
    """
    x = as_float(x, "x", min_ndim=3)
    n, k, s, p, _ = _pool_config(x.ndim, kernel_size, stride, padding, 1, ceil_mode)
    _check_x(x, n)
    if not isinstance(count_include_pad, (bool, np.bool_)):
        raise TypeError(f"count_include_pad must be a bool; got {type(count_include_pad).__name__}")
    if divisor_override is not None and (isinstance(divisor_override, (bool, np.bool_)) or not isinstance(
            divisor_override, (int, np.integer)) or divisor_override == 0):
        raise ValueError(f"divisor_override must be None or a non-zero int; got {divisor_override!r}")
    cfg = {"kernel_size": k, "stride": s, "padding": p, "ceil_mode": bool(ceil_mode),
           "count_include_pad": bool(count_include_pad), "divisor_override": divisor_override}
    _check_fits(x, tuple(pool_output_size(li, ki, si, pi, 1, ceil_mode)
                         for li, ki, si, pi in zip(x.shape[2:], k, s, p)), "kernel")
    y = avg_pool_apply(x, **cfg)
    return y, {"x_shape": x.shape, "dtype": x.dtype, "cfg": cfg, "out_shape": y.shape}


def avg_pool_backward(dout, cache):
    r"""Gradient of :func:`avg_pool_forward`: ``{"x"}``, $\bar x$ = col2im of $\bar y/D$."""
    g = as_dout(dout, cache["out_shape"], cache["dtype"])
    return {"x": avg_pool_vjp(g, cache["x_shape"], **cache["cfg"])}


def avg_pool(x, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`avg_pool_forward`."""
    return avg_pool_forward(x, **config)[0]


def max_pool_forward(x, *, kernel_size, stride=None, padding=0, dilation=1, ceil_mode: bool = False):
    r"""Max pooling, ``F.max_pool{n}d`` semantics (implicit $-\infty$ padding).

    Parameters
    ----------
    x : array (B, C, *spatial)
    kernel_size, stride, padding, ceil_mode
        As :func:`avg_pool_forward` (``padding <= kernel_size // 2``).
    dilation : int or tuple
        Spacing of the window entries.

    Returns
    -------
    y, cache
        ``y (B, C, *O)``; the cache holds the arg-max of every window (first maximum in
        row-major kernel order, PyTorch's tie rule), which the backward keeps fixed.
    """
    x = as_float(x, "x", min_ndim=3)
    n, k, s, p, d = _pool_config(x.ndim, kernel_size, stride, padding, dilation, ceil_mode)
    _check_x(x, n)
    _check_fits(x, tuple(pool_output_size(li, ki, si, pi, di, ceil_mode)
                         for li, ki, si, pi, di in zip(x.shape[2:], k, s, p, d)), "dilated kernel")
    cfg = {"kernel_size": k, "stride": s, "padding": p, "dilation": d, "ceil_mode": bool(ceil_mode)}
    y, arg = max_pool_apply(x, **cfg)
    return y, {"x_shape": x.shape, "dtype": x.dtype, "argmax": arg, "cfg": cfg}


def max_pool_backward(dout, cache):
    """Gradient of :func:`max_pool_forward`: ``{"x"}``, each ``dout`` entry added at its window's arg-max."""
    g = as_dout(dout, cache["argmax"].shape, cache["dtype"])
    return {"x": max_pool_vjp(g, cache["argmax"], cache["x_shape"], **cache["cfg"])}


def max_pool(x, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`max_pool_forward`."""
    return max_pool_forward(x, **config)[0]


def adaptive_avg_pool_forward(x, *, output_size):
    r"""Adaptive average pooling, ``F.adaptive_avg_pool{n}d`` semantics.

    Parameters
    ----------
    x : array (B, C, *spatial)
    output_size : int or tuple of n (int or None)
        A tuple sets ``n``; ``None`` keeps that axis' size (PyTorch). Bins as in the module
        docstring; output sizes larger than the input are allowed.

    Returns
    -------
    y, cache
        ``y (B, C, *output_size)``.
    """
    x = as_float(x, "x", min_ndim=3)
    n, osz = _adaptive_sizes(x.shape, output_size)
    _check_x(x, n)
    y = adaptive_avg_pool_apply(x, osz)
    return y, {"x_shape": x.shape, "dtype": x.dtype, "out_shape": y.shape}


def adaptive_avg_pool_backward(dout, cache):
    r"""Gradient of :func:`adaptive_avg_pool_forward`: ``{"x"}``, $\bar x = A^\top\bar y$ per axis."""
    g = as_dout(dout, cache["out_shape"], cache["dtype"])
    return {"x": adaptive_avg_pool_vjp(g, cache["x_shape"])}


def adaptive_avg_pool(x, *, output_size) -> np.ndarray:
    """Convenience wrapper: the output of :func:`adaptive_avg_pool_forward`."""
    return adaptive_avg_pool_forward(x, output_size=output_size)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _draw_pool(rng, size, dilated):
    n = int(rng.integers(1, 4))
    if size == "tiny":
        spatial = {1: (7,), 2: (5, 6), 3: (4, 3, 5)}[n]
        c = 2 if n < 3 else 1
    else:
        spatial = {1: (15,), 2: (9, 8), 3: (6, 5, 7)}[n]
        c = 3
    k = tuple(int(rng.integers(1, 4)) for _ in range(n))
    k = (max(k[0], 2),) + k[1:]
    s = None if rng.random() < 0.3 else tuple(int(rng.integers(1, 3)) for _ in range(n))
    p = tuple(int(rng.integers(0, ki // 2 + 1)) for ki in k)
    d = tuple(int(rng.integers(1, 3)) if dilated else 1 for _ in range(n))
    d = tuple(di if di * (ki - 1) + 1 <= li + 2 * pi else 1 for di, ki, li, pi in zip(d, k, spatial, p))
    return (2, c) + spatial, k, s, p, d, bool(rng.random() < 0.5)


def _sample_avg(rng, size):
    shape, k, s, p, _, ceil = _draw_pool(rng, size, False)
    cfg = {"kernel_size": k, "stride": s, "padding": p, "ceil_mode": ceil,
           "count_include_pad": bool(rng.random() < 0.5)}
    if rng.random() < 0.15:
        cfg["divisor_override"] = int(rng.integers(2, 5))
    return Sample(inputs={"x": rng.standard_normal(shape)}, config=cfg)


def _sample_max(rng, size):
    shape, k, s, p, d, ceil = _draw_pool(rng, size, True)
    # distinct values at least ~0.04 apart: no tie and no arg-max switch under the FD step
    x = rng.permutation(int(np.prod(shape))).reshape(shape) * 0.1 + rng.uniform(-0.03, 0.03, shape)
    return Sample(inputs={"x": x}, config={"kernel_size": k, "stride": s, "padding": p, "dilation": d,
                                           "ceil_mode": ceil})


def _sample_adaptive(rng, size):
    n = int(rng.integers(1, 4))
    spatial = ({1: (7,), 2: (5, 6), 3: (4, 3, 5)} if size == "tiny" else {1: (13,), 2: (9, 7), 3: (6, 5, 7)})[n]
    out = tuple(int(rng.integers(1, li + 3)) for li in spatial)
    out = tuple(None if rng.random() < 0.15 else oi for oi in out)
    x = rng.standard_normal((2, 2 if size == "tiny" and n == 3 else 3) + spatial)
    return Sample(inputs={"x": x}, config={"output_size": out})


def _windows_1d(li, oi, ki, si, pi, di):
    start = oi * si - pi
    return [start + j * di for j in range(ki) if 0 <= start + j * di < li]


def _avg_reference(x, *, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,
                   divisor_override=None):
    # PyTorch's CPU kernel, one window at a time: sum over the real entries, divisor from the
    # window clipped to [-p, L+p) (count_include_pad) or to [0, L).
    n, k, s, p, _ = _pool_config(x.ndim, kernel_size, stride, padding, 1, ceil_mode)
    spatial = x.shape[2:]
    osz = tuple(pool_output_size(li, ki, si, pi, 1, ceil_mode) for li, ki, si, pi in zip(spatial, k, s, p))
    y = np.zeros(x.shape[:2] + osz)
    for o in np.ndindex(*osz):
        idx = [_windows_1d(li, oi, ki, si, pi, 1) for li, oi, ki, si, pi in zip(spatial, o, k, s, p)]
        total = x[(Ellipsis,) + np.ix_(*idx)].sum(axis=tuple(range(2, 2 + n)))
        if divisor_override is not None:
            div = divisor_override
        elif count_include_pad:
            div = np.prod([min(oi * si - pi + ki, li + pi) - (oi * si - pi)
                           for li, oi, ki, si, pi in zip(spatial, o, k, s, p)])
        else:
            div = np.prod([len(ix) for ix in idx])
        y[(Ellipsis,) + o] = total / div
    return y


def _max_reference(x, *, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False):
    n, k, s, p, d = _pool_config(x.ndim, kernel_size, stride, padding, dilation, ceil_mode)
    spatial = x.shape[2:]
    osz = tuple(pool_output_size(li, ki, si, pi, di, ceil_mode) for li, ki, si, pi, di in zip(spatial, k, s, p, d))
    y = np.zeros(x.shape[:2] + osz)
    for o in np.ndindex(*osz):
        idx = [_windows_1d(li, oi, ki, si, pi, di) for li, oi, ki, si, pi, di in zip(spatial, o, k, s, p, d)]
        y[(Ellipsis,) + o] = x[(Ellipsis,) + np.ix_(*idx)].max(axis=tuple(range(2, 2 + n)))
    return y


def _adaptive_reference(x, *, output_size):
    n, osz = _adaptive_sizes(x.shape, output_size)
    spatial = x.shape[2:]
    y = np.zeros(x.shape[:2] + osz)
    for o in np.ndindex(*osz):
        idx = [np.arange((oi * li) // oo, -((-(oi + 1) * li) // oo)) for oi, li, oo in zip(o, spatial, osz)]
        y[(Ellipsis,) + o] = x[(Ellipsis,) + np.ix_(*idx)].mean(axis=tuple(range(2, 2 + n)))
    return y


def _check_avg_constant(rng):
    # A constant input: count_include_pad=False gives the constant everywhere (padding and ceil
    # overhang included); count_include_pad=True scales border windows by real/counted entries.
    x = np.full((2, 3, 7, 6), 2.5)
    a = avg_pool(x, kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False)
    err = float(np.abs(a - 2.5).max())
    b = avg_pool(x, kernel_size=3, stride=2, padding=1, ceil_mode=False, count_include_pad=True)
    real = avg_pool(np.ones_like(x), kernel_size=3, stride=2, padding=1, divisor_override=1)
    err = max(err, float(np.abs(b - 2.5 * real / 9.0).max()))
    assert err < 1e-14, f"average pool of a constant is wrong (err {err})"
    return err


def _check_avg_is_depthwise_conv(rng):
    x = rng.standard_normal((2, 3, 8, 7))
    a = avg_pool(x, kernel_size=(3, 2), stride=(2, 1), padding=(1, 1))
    c = conv(x, {"weight": np.full((3, 1, 3, 2), 1 / 6)}, stride=(2, 1), padding=(1, 1), groups=3)
    err = float(np.abs(a - c).max())
    assert err < 1e-14, f"avg_pool(count_include_pad) != depthwise conv with weights 1/K (err {err})"
    return err


def _check_max_identities(rng):
    x = rng.standard_normal((2, 3, 6, 5))
    err = float(np.abs(max_pool(x, kernel_size=1, stride=1) - x).max())
    y, cache = max_pool_forward(x, kernel_size=3, stride=2, padding=1, dilation=1, ceil_mode=True)
    g = rng.standard_normal(y.shape)
    dx = max_pool_backward(g, cache)["x"]
    err = max(err, abs(float(dx.sum() - g.sum())))
    assert np.all(max_pool(x, kernel_size=2) >= avg_pool(x, kernel_size=2)), "max pool below the average"
    assert err < 1e-12, f"max pool identity / gradient routing failed (err {err})"
    return err


def _check_adaptive_identities(rng):
    x = rng.standard_normal((2, 3, 8, 6))
    err = float(np.abs(adaptive_avg_pool(x, output_size=(8, 6)) - x).max())
    err = max(err, float(np.abs(adaptive_avg_pool(x, output_size=(4, 3)) - avg_pool(x, kernel_size=2)).max()))
    err = max(err, float(np.abs(adaptive_avg_pool(x, output_size=1) - x.mean(axis=(2, 3), keepdims=True)).max()))
    assert err < 1e-14, f"adaptive pool identities failed (err {err})"
    return err


_DOCS = "building-blocks.md#convolution-sampling-pooling-and-windows"
register(
    Mechanism(
        slug="avg_pool", family="5-building-blocks", tier="primitive",
        title="N-d average pooling (F.avg_pool{1,2,3}d: ceil_mode, count_include_pad, divisor_override)",
        paper="standard (PyTorch torch.nn.functional.avg_pool{1,2,3}d)",
        forward=avg_pool_forward, backward=avg_pool_backward, sample=_sample_avg, reference=_avg_reference,
        docs=_DOCS, checks={"constant_input": _check_avg_constant, "is_depthwise_conv": _check_avg_is_depthwise_conv},
    ),
    Mechanism(
        slug="max_pool", family="5-building-blocks", tier="primitive",
        title="N-d max pooling (F.max_pool{1,2,3}d; arg-max fixed in the backward)",
        paper="standard (PyTorch torch.nn.functional.max_pool{1,2,3}d)",
        forward=max_pool_forward, backward=max_pool_backward, sample=_sample_max, reference=_max_reference,
        docs=_DOCS, checks={"identities": _check_max_identities},
        notes="piecewise linear: the sampler keeps entries >= ~0.04 apart (no ties, no arg-max switch)",
    ),
    Mechanism(
        slug="adaptive_avg_pool", family="5-building-blocks", tier="primitive",
        title="N-d adaptive average pooling (F.adaptive_avg_pool{1,2,3}d bins)",
        paper="standard (PyTorch torch.nn.functional.adaptive_avg_pool{1,2,3}d)",
        forward=adaptive_avg_pool_forward, backward=adaptive_avg_pool_backward, sample=_sample_adaptive,
        reference=_adaptive_reference, docs=_DOCS, checks={"identities": _check_adaptive_identities},
    ),
)
