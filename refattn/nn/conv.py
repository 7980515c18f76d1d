r"""N-d convolution and transposed convolution (PyTorch ``F.conv{1,2,3}d`` /
``F.conv_transpose{1,2,3}d``), with the padding, im2col and col2im helpers the other spatial
primitives (pooling, unfold/fold) share.

Layout (PyTorch's, unlike :mod:`refattn.nn.linear`)
----------------------------------------------------
Channels first: ``x (B, C_in, *spatial)`` with $n$ = ``len(spatial)`` spatial axes (PyTorch
offers $n\in\{1,2,3\}$; the code is the same for any $n\ge1$). **Conv weights keep PyTorch's
layout** — load ``nn.Conv{n}d``/``nn.ConvTranspose{n}d`` parameters as they are, no transpose:

* convolution ``weight (C_out, C_in/groups, *k)``, ``bias (C_out,)``;
* transposed convolution ``weight (C_in, C_out/groups, *k)``, ``bias (C_out,)``.

(The ``(in, out)`` rule of DESIGN.md is for matrices applied to the last axis; a conv weight is
not one, and its checkpoints are far more common in PyTorch's layout.)

Forward
-------
With stride $s$, dilation $d$, groups $G$ (channel $c$ of group $g(c)$, $c' = c \bmod C_{in}/G$)
and the input padded to $x_p$ (``padding_mode`` zeros/reflect/replicate/circular, as
``nn.Conv{n}d`` pads with ``F.pad`` before a zero-padding convolution):

$$y_{b,o,\mathbf p} = \beta_o + \sum_{c\in g(o)}\sum_{\mathbf k} W_{o,c',\mathbf k}\,
x_{p;\,b,c,\ \mathbf p\odot s + \mathbf k\odot d},\qquad
O_i = \Big\lfloor\frac{S_i + p^{lo}_i + p^{hi}_i - d_i(k_i-1) - 1}{s_i}\Big\rfloor + 1.$$

It is computed as im2col (a strided view of every window, :func:`im2col`) times the weight
matrix, one matmul per group. ``padding`` is an int, a tuple of $n$ ints, ``"valid"`` (0) or
``"same"`` (stride 1 only; total $d(k-1)$ split as ``total // 2`` before and the rest after,
as PyTorch does for even kernels). The unvalidated helpers also take $n$ ``(before, after)``
pairs (asymmetric or causal padding, not a PyTorch option).

Backward (derivation)
---------------------
$y$ is linear in $x_p$, so $\partial L/\partial x_{p;b,c,\mathbf q} = \sum_{o\in g(c)}
\sum_{\mathbf k,\mathbf p:\ \mathbf p s+\mathbf k d=\mathbf q} W_{o,c',\mathbf k}\,
\bar y_{b,o,\mathbf p}$ with $\bar y = \partial L/\partial y$: each output gradient is spread
back over the window it was read from — :func:`col2im` of $\bar y W$ (per group,
$\overline{\mathrm{cols}} = \bar y_g^\top W_g$). Written as a convolution this is the
**transposed convolution**: insert $s-1$ zeros between the entries of $\bar y$, pad by
$d(k-1)$, and correlate with the spatially flipped kernel with input/output channels swapped.
The padding's adjoint then gives $\bar x$: a crop for zeros; for reflect/replicate/circular,
every padded entry's gradient is added to the entry it copied (:func:`pad_nd_vjp`). The weight
and bias gradients are $\bar W_{o,c',\mathbf k} = \sum_{b,\mathbf p}\bar y_{b,o,\mathbf p}\,
x_{p;b,c,\mathbf p s+\mathbf k d}$ (im2col columns times $\bar y$) and
$\bar\beta_o = \sum_{b,\mathbf p}\bar y_{b,o,\mathbf p}$.

Transposed convolution
----------------------
``F.conv_transpose{n}d(x, weight, bias, stride, padding, output_padding, groups, dilation)`` is
*by definition* the x-gradient map of a convolution whose weight is ``weight`` (read as
``(C_out_conv, C_in_conv/G, *k)`` = ``(C_in, C_out/G, *k)``): col2im of $x^\top W$ into a
buffer of length $L_{full} = (L-1)s + d(k-1) + 1 + \text{output\_padding}$, then the crop
``[padding : L_full - padding]``, so that

$$O = (L-1)s - 2p + d(k-1) + \text{output\_padding} + 1.$$

Its backward is therefore the convolution forward: $\bar x$ = im2col of $\bar y$ zero-padded by
$p$ (back to $L_{full}$) correlated with ``weight``; $\bar W$ uses the same columns. Only zero
padding exists for it (as in PyTorch).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from .._checks import as_dout, as_float, check_choice, check_param_keys, compute_dtype
from ..registry import Mechanism, Sample, register

__all__ = [
    "conv_forward",
    "conv_backward",
    "conv",
    "conv_apply",
    "conv_vjp",
    "conv_transpose_forward",
    "conv_transpose_backward",
    "conv_transpose",
    "conv_transpose_apply",
    "conv_transpose_vjp",
    "conv_output_size",
    "conv_transpose_output_size",
    "conv_padding",
    "check_int_tuple",
    "pad_nd",
    "pad_nd_vjp",
    "im2col",
    "col2im",
    "PADDING_MODES",
]

PADDING_MODES = ("zeros", "reflect", "replicate", "circular")
_NP_PAD = {"reflect": "reflect", "replicate": "edge", "circular": "wrap"}


# --------------------------------------------------------------------------------------------
# Config normalisation (validating: raises naming the argument; cheap, used by the helpers too)


def check_int_tuple(value, n: int, name: str, *, minimum: int = 0) -> tuple[int, ...]:
    """An int (repeated ``n`` times) or a length-``n`` tuple/list of ints, each ``>= minimum``."""
    items = (value,) * n if isinstance(value, (int, np.integer)) else value
    if isinstance(value, (bool, np.bool_)) or not isinstance(items, (tuple, list)) or len(items) != n or any(
            isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) for v in items):
        raise TypeError(f"{name} must be an int or a tuple of {n} ints (one per spatial axis); got {value!r}")
    if any(v < minimum for v in items):
        raise ValueError(f"{name} entries must be >= {minimum}; got {value!r}")
    return tuple(int(v) for v in items)


def conv_padding(padding, n: int, kernel_size, dilation=1, stride=1) -> tuple[tuple[int, int], ...]:
    """``(before, after)`` pairs per spatial axis from a PyTorch ``padding`` argument.

    ``padding``: int, tuple of ``n`` ints, ``"valid"`` (no padding), ``"same"`` (stride 1;
    total $d(k-1)$, ``total // 2`` before), or a tuple of ``n`` ``(before, after)`` pairs."""
    k = check_int_tuple(kernel_size, n, "kernel_size", minimum=1)
    d = check_int_tuple(dilation, n, "dilation", minimum=1)
    if isinstance(padding, str):
        check_choice(padding, "padding", ("same", "valid"))
        if padding == "valid":
            return ((0, 0),) * n
        if any(si != 1 for si in check_int_tuple(stride, n, "stride", minimum=1)):
            raise ValueError(f"padding='same' needs stride 1 (as in PyTorch); got stride={stride!r}")
        return tuple((di * (ki - 1) // 2, di * (ki - 1) - di * (ki - 1) // 2) for ki, di in zip(k, d))
    if isinstance(padding, (tuple, list)) and len(padding) == n and all(isinstance(p, (tuple, list)) for p in padding):
        pairs = tuple(check_int_tuple(tuple(p), 2, "padding") for p in padding)
        return pairs
    p = check_int_tuple(padding, n, "padding")
    return tuple((pi, pi) for pi in p)


def conv_output_size(spatial, kernel_size, stride, pads, dilation) -> tuple[int, ...]:
    r"""$O_i = \lfloor (S_i + p^{lo}_i + p^{hi}_i - d_i(k_i-1) - 1)/s_i\rfloor + 1$ (may be <= 0)."""
    return tuple((si + lo + hi - di * (ki - 1) - 1) // st + 1
                 for si, ki, st, (lo, hi), di in zip(spatial, kernel_size, stride, pads, dilation))


def conv_transpose_output_size(spatial, kernel_size, stride, padding, dilation, output_padding) -> tuple[int, ...]:
    """$O_i = (L_i-1)s_i - 2p_i + d_i(k_i-1) + \\text{output\\_padding}_i + 1$ (PyTorch's formula)."""
    return tuple((li - 1) * st - 2 * pi + di * (ki - 1) + op + 1
                 for li, ki, st, pi, di, op in zip(spatial, kernel_size, stride, padding, dilation, output_padding))


# --------------------------------------------------------------------------------------------
# Padding, im2col, col2im on the last n axes (unvalidated)


def pad_nd(x: np.ndarray, pads, mode: str = "zeros", value: float = 0.0) -> np.ndarray:
    """Pad the last ``len(pads)`` axes by ``(before, after)`` pairs, as ``F.pad``: ``"zeros"``
    (constant ``value``), ``"reflect"`` (no edge repeat), ``"replicate"``, ``"circular"``."""
    if all(lo == 0 and hi == 0 for lo, hi in pads):
        return x
    widths = [(0, 0)] * (x.ndim - len(pads)) + [tuple(p) for p in pads]
    if mode == "zeros":
        return np.pad(x, widths, mode="constant", constant_values=value)
    return np.pad(x, widths, mode=_NP_PAD[mode])


def pad_nd_vjp(g: np.ndarray, pads, mode: str = "zeros") -> np.ndarray:
    """Adjoint of :func:`pad_nd`: crop for ``"zeros"``; otherwise every padded entry's gradient is
    added back to the entry it copies (a 0/1 matrix per axis, built by padding ``arange``)."""
    n = len(pads)
    if mode == "zeros":
        return g[(Ellipsis,) + tuple(slice(lo, g.shape[g.ndim - n + i] - hi) for i, (lo, hi) in enumerate(pads))]
    for i, (lo, hi) in enumerate(pads):
        if lo == 0 and hi == 0:
            continue
        ax = g.ndim - n + i
        size = g.shape[ax] - lo - hi
        src = np.pad(np.arange(size), (lo, hi), mode=_NP_PAD[mode])
        onehot = (src[:, None] == np.arange(size)).astype(g.dtype)  # (padded, size)
        g = np.moveaxis(np.moveaxis(g, ax, -1) @ onehot, -1, ax)
    return g


def im2col(xp: np.ndarray, kernel_size, stride, dilation, out_shape=None) -> np.ndarray:
    """Every window of the last ``n`` axes: ``(..., *S) -> (..., *O, *k)``, a read-only strided view
    with ``cols[..., o, j] = xp[..., o*s + j*d]``. ``out_shape`` (optional) keeps the first ``O``
    windows along each axis (the transposed convolution's backward needs that)."""
    n = len(kernel_size)
    ext = tuple(di * (ki - 1) + 1 for ki, di in zip(kernel_size, dilation))
    win = np.lib.stride_tricks.sliding_window_view(xp, ext, axis=tuple(range(xp.ndim - n, xp.ndim)))
    sl = [slice(None, None if out_shape is None else (o - 1) * s + 1, s) for o, s in
          zip(out_shape if out_shape is not None else (None,) * n, stride)]
    return win[(Ellipsis,) + tuple(sl) + tuple(slice(None, None, di) for di in dilation)]


def col2im(cols: np.ndarray, out_spatial, stride, dilation) -> np.ndarray:
    """Adjoint of :func:`im2col`: scatter-add ``cols (..., *O, *k)`` into ``(..., *out_spatial)``
    (overlapping windows sum). One strided slice-add per kernel offset."""
    n = len(out_spatial)
    ksz = cols.shape[-n:]
    osz = cols.shape[-2 * n:-n]
    out = np.zeros(cols.shape[:-2 * n] + tuple(out_spatial), dtype=cols.dtype)
    for j in itertools.product(*(range(k) for k in ksz)):
        sl = tuple(slice(ji * di, ji * di + (oi - 1) * si + 1, si) for ji, di, oi, si in zip(j, dilation, osz, stride))
        out[(Ellipsis,) + sl] += cols[(Ellipsis,) + j]
    return out


# --------------------------------------------------------------------------------------------
# The grouped correlation core and its two adjoints (unvalidated)


def _columns(xp, k, stride, dilation, groups, out_shape=None):
    """The im2col matrix per group, ``(B, G, C_g*K, P)`` (kernel-major rows, positions last), and
    the output spatial shape."""
    n = len(k)
    cols = im2col(xp, k, stride, dilation, out_shape)                    # (B, C_in, *O, *k) view
    osz = cols.shape[2:2 + n]
    cols = np.moveaxis(cols, tuple(range(2, 2 + n)), tuple(range(2 + n, 2 + 2 * n)))  # (B, C_in, *k, *O)
    return cols.reshape(xp.shape[0], groups, -1, math.prod(osz)), osz


def _correlate(xp, w, stride, dilation, groups, out_shape=None):
    """$y_{b,o,p} = \\sum_{c\\in g(o),j} W_{o,c',j}\\,x_{p;b,c,ps+jd}$ for ``w (C_out, C_in/G, *k)``:
    ``W_g (O_g, C_g*K) @ cols_g (C_g*K, P)`` per batch entry and group."""
    cols, osz = _columns(xp, w.shape[2:], stride, dilation, groups, out_shape)
    y = w.reshape(groups, w.shape[0] // groups, -1) @ cols                # (B, G, O_g, P)
    return y.reshape((xp.shape[0], w.shape[0]) + osz)


def _correlate_adj_x(dy, w, stride, dilation, groups, padded_spatial):
    """x-adjoint of :func:`_correlate`: col2im of $W_g^\\top \\bar y_g$ (the transposed convolution)."""
    n = w.ndim - 2
    B, cout = dy.shape[:2]
    wm = w.reshape(groups, cout // groups, -1)                             # (G, O_g, C_g*K)
    wt, dyr = np.swapaxes(wm, -1, -2), dy.reshape(B, groups, cout // groups, -1)
    # (B, G, C_g*K, P); with one output channel per group (depthwise) this is an outer product,
    # which NumPy broadcasts several times faster than its matmul with an inner dimension of 1
    dc = wt * dyr if cout == groups else wt @ dyr
    dc = dc.reshape((B, groups * w.shape[1]) + w.shape[2:] + dy.shape[2:])   # (B, C_in, *k, *O)
    # col2im reads one kernel offset at a time: with k before O each slice is contiguous
    return col2im(np.moveaxis(dc, tuple(range(2, 2 + n)), tuple(range(2 + n, 2 + 2 * n))),
                  padded_spatial, stride, dilation)


def _correlate_adj_w(dy, cols, w_shape, groups):
    """Weight adjoint of :func:`_correlate` from its im2col matrix ``cols (B, G, C_g*K, P)``."""
    B, cout = dy.shape[:2]
    dyr = dy.reshape(B, groups, cout // groups, -1)                       # (B, G, O_g, P)
    return (dyr @ np.swapaxes(cols, -1, -2)).sum(axis=0).reshape(w_shape)


def conv_apply(x, weight, bias=None, *, stride=1, padding=0, dilation=1, groups=1, padding_mode="zeros"):
    """Unvalidated ``F.conv{n}d`` (plus ``padding_mode`` as ``nn.Conv{n}d``) for callers that have
    validated their arrays. Config as :func:`conv_forward` (``padding`` may also be pairs)."""
    n = weight.ndim - 2
    s = check_int_tuple(stride, n, "stride", minimum=1)
    d = check_int_tuple(dilation, n, "dilation", minimum=1)
    pads = conv_padding(padding, n, weight.shape[2:], d, s)
    y = _correlate(pad_nd(x, pads, padding_mode), weight, s, d, groups)
    if bias is not None:
        y = y + bias.reshape((-1,) + (1,) * n)
    return y


def conv_vjp(dy, x, weight, *, stride=1, padding=0, dilation=1, groups=1, padding_mode="zeros",
             has_bias=True) -> dict:
    """Unvalidated gradients of :func:`conv_apply`: ``{"x", "weight"[, "bias"]}``."""
    n = weight.ndim - 2
    s = check_int_tuple(stride, n, "stride", minimum=1)
    d = check_int_tuple(dilation, n, "dilation", minimum=1)
    pads = conv_padding(padding, n, weight.shape[2:], d, s)
    xp = pad_nd(x, pads, padding_mode)
    cols, _ = _columns(xp, weight.shape[2:], s, d, groups, dy.shape[2:])
    dxp = _correlate_adj_x(dy, weight, s, d, groups, xp.shape[2:])
    grads = {"x": pad_nd_vjp(dxp, pads, padding_mode), "weight": _correlate_adj_w(dy, cols, weight.shape, groups)}
    if has_bias:
        grads["bias"] = dy.sum(axis=(0,) + tuple(range(2, dy.ndim)))
    return grads


def _full_spatial(spatial, k, s, d, op):
    return tuple((li - 1) * si + di * (ki - 1) + 1 + oi for li, ki, si, di, oi in zip(spatial, k, s, d, op))


def conv_transpose_apply(x, weight, bias=None, *, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    """Unvalidated ``F.conv_transpose{n}d``: the x-adjoint of the convolution with ``weight``
    ``(C_in, C_out/G, *k)``, then the crop by ``padding``; config as :func:`conv_transpose_forward`."""
    n = weight.ndim - 2
    k = weight.shape[2:]
    s, p, d, op = (check_int_tuple(v, n, nm, minimum=m) for v, nm, m in
                   ((stride, "stride", 1), (padding, "padding", 0), (dilation, "dilation", 1),
                    (output_padding, "output_padding", 0)))
    full = _correlate_adj_x(x, weight, s, d, groups, _full_spatial(x.shape[2:], k, s, d, op))
    y = full[(Ellipsis,) + tuple(slice(pi, f - pi) for pi, f in zip(p, full.shape[2:]))]
    if bias is not None:
        y = y + bias.reshape((-1,) + (1,) * n)
    return y


def conv_transpose_vjp(dy, x, weight, *, stride=1, padding=0, output_padding=0, groups=1, dilation=1,
                       has_bias=True) -> dict:
    """Unvalidated gradients of :func:`conv_transpose_apply`: the convolution of ``dy`` zero-padded
    back to the full buffer, ``{"x", "weight"[, "bias"]}``."""
    n = weight.ndim - 2
    s, p, d = (check_int_tuple(v, n, nm, minimum=m) for v, nm, m in
               ((stride, "stride", 1), (padding, "padding", 0), (dilation, "dilation", 1)))
    dyf = pad_nd(dy, tuple((pi, pi) for pi in p))
    cols, _ = _columns(dyf, weight.shape[2:], s, d, groups, x.shape[2:])
    dx = weight.reshape(groups, weight.shape[0] // groups, -1) @ cols     # (B, G, C_in_g, P)
    grads = {"x": dx.reshape(x.shape), "weight": _correlate_adj_w(x, cols, weight.shape, groups)}
    if has_bias:
        grads["bias"] = dy.sum(axis=(0,) + tuple(range(2, dy.ndim)))
    return grads


# --------------------------------------------------------------------------------------------
# Validated pairs


def _check_conv_params(params, x, transposed: bool, groups):
    what = "conv_transpose" if transposed else "conv"
    check_param_keys(params, ("weight",), ("bias",), where=what)
    w = as_float(params["weight"], "weight", min_ndim=3)
    n = w.ndim - 2
    layout = "(C_in, C_out/groups, *kernel)" if transposed else "(C_out, C_in/groups, *kernel)"
    if x.ndim != w.ndim:
        raise ValueError(f"x must be (B, C, *spatial) with as many spatial axes as weight {layout} has kernel "
                         f"axes ({n}): x.ndim must be {w.ndim}; got x {x.shape}, weight {w.shape}")
    if isinstance(groups, (bool, np.bool_)) or not isinstance(groups, (int, np.integer)):
        raise TypeError(f"groups must be an int; got {type(groups).__name__}")
    if groups < 1:
        raise ValueError(f"groups must be >= 1; got {groups}")
    cin = x.shape[1]
    if cin % groups:
        raise ValueError(f"groups ({groups}) must divide the input channels x.shape[1] = {cin}")
    if transposed:
        if w.shape[0] != cin:
            raise ValueError(f"weight must have shape {layout} with C_in = x.shape[1] = {cin}; got {w.shape}")
        cout = w.shape[1] * groups
    else:
        cout = w.shape[0]
        if cout % groups:
            raise ValueError(f"groups ({groups}) must divide the output channels weight.shape[0] = {cout}")
        if w.shape[1] * groups != cin:
            raise ValueError(f"weight must have shape {layout} = ({cout}, {cin // groups}, ...) for x with "
                             f"{cin} channels and groups={groups}; got {w.shape}")
    b = params.get("bias")
    if b is not None:
        b = as_float(b, "bias", ndim=1)
        if b.shape[0] != cout:
            raise ValueError(f"bias must have shape (C_out,) = ({cout},); got {b.shape}")
    dt = compute_dtype(x, w, b)
    return x.astype(dt, copy=False), w.astype(dt, copy=False), None if b is None else b.astype(dt, copy=False)


def _padded_size_check(spatial, pads, mode):
    if mode == "reflect" and any(max(lo, hi) >= si for si, (lo, hi) in zip(spatial, pads)):
        raise ValueError(f"padding_mode='reflect' needs padding < the input size on each axis; got padding "
                         f"{[list(p) for p in pads]} for x of spatial shape {tuple(spatial)}")
    if mode == "circular" and any(max(lo, hi) > si for si, (lo, hi) in zip(spatial, pads)):
        raise ValueError(f"padding_mode='circular' needs padding <= the input size on each axis; got padding "
                         f"{[list(p) for p in pads]} for x of spatial shape {tuple(spatial)}")


def conv_forward(x, params, *, stride=1, padding=0, dilation=1, groups: int = 1, padding_mode: str = "zeros"):
    r"""N-d convolution, ``F.conv{n}d`` / ``nn.Conv{n}d`` semantics (cross-correlation, no kernel flip).

    Parameters
    ----------
    x : array (B, C_in, *spatial)
        Channels first, ``n = x.ndim - 2`` spatial axes (1, 2 or 3 in PyTorch; any ``n >= 1`` here).
    params : dict
        ``"weight"`` ``(C_out, C_in/groups, *k)`` — **PyTorch's layout, not transposed**
        (``conv.weight`` as is) — and optional ``"bias"`` ``(C_out,)``.
    stride, dilation : int or tuple of n ints
    padding : int, tuple of n ints, ``"valid"`` or ``"same"``
        ``"same"`` needs stride 1; an odd total ``d(k-1)`` puts the extra entry after (PyTorch).
        Also accepted (not a PyTorch option): a tuple of n ``(before, after)`` pairs.
    groups : int
        Divides ``C_in`` and ``C_out``; depthwise is ``groups = C_in``.
    padding_mode : ``"zeros"``, ``"reflect"``, ``"replicate"`` or ``"circular"``
        As ``nn.Conv{n}d(padding_mode=...)`` (``F.pad`` first); ``reflect`` needs padding < size,
        ``circular`` padding <= size.

    Returns
    -------
    y, cache
        ``y (B, C_out, *O)`` with $O_i = \lfloor(S_i+p^{lo}_i+p^{hi}_i-d_i(k_i-1)-1)/s_i\rfloor+1$.
    """
    x = as_float(x, "x", min_ndim=3)
    x, w, b = _check_conv_params(params, x, False, groups)
    n = w.ndim - 2
    check_choice(padding_mode, "padding_mode", PADDING_MODES)
    s = check_int_tuple(stride, n, "stride", minimum=1)
    d = check_int_tuple(dilation, n, "dilation", minimum=1)
    pads = conv_padding(padding, n, w.shape[2:], d, s)
    _padded_size_check(x.shape[2:], pads, padding_mode)
    osz = conv_output_size(x.shape[2:], w.shape[2:], s, pads, d)
    if min(osz) < 1:
        raise ValueError(f"the padded input is smaller than the dilated kernel: x spatial {x.shape[2:]}, padding "
                         f"{[list(p) for p in pads]}, weight kernel {w.shape[2:]}, dilation {d} give output {osz}")
    cfg = {"stride": s, "padding": pads, "dilation": d, "groups": int(groups), "padding_mode": padding_mode}
    y = conv_apply(x, w, b, **cfg)
    return y, {"x": x, "weight": w, "has_bias": b is not None, "cfg": cfg, "out_shape": y.shape}


def conv_backward(dout, cache):
    r"""Gradients of :func:`conv_forward`: ``{"x", "weight"[, "bias"]}``. $\bar x$ is the transposed
    convolution of ``dout`` followed by the padding's adjoint (module docstring)."""
    g = as_dout(dout, cache["out_shape"], cache["x"].dtype)
    return conv_vjp(g, cache["x"], cache["weight"], has_bias=cache["has_bias"], **cache["cfg"])


def conv(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`conv_forward`."""
    return conv_forward(x, params, **config)[0]


def conv_transpose_forward(x, params, *, stride=1, padding=0, output_padding=0, groups: int = 1, dilation=1):
    r"""N-d transposed convolution, ``F.conv_transpose{n}d`` semantics (the adjoint of ``conv``).

    Parameters
    ----------
    x : array (B, C_in, *spatial)
    params : dict
        ``"weight"`` ``(C_in, C_out/groups, *k)`` — PyTorch's ``ConvTranspose`` layout, as is — and
        optional ``"bias"`` ``(C_out,)``.
    stride, padding, dilation : int or tuple of n ints
        ``padding`` crops $p$ from both ends of the full output (zero padding only, as PyTorch).
    output_padding : int or tuple of n ints
        Extra entries at the end of each axis; must be < max(stride, dilation) (PyTorch's rule).
        It resolves the ambiguity of $O$ for strided convolutions.
    groups : int

    Returns
    -------
    y, cache
        ``y (B, C_out, *O)``, $O_i = (L_i-1)s_i - 2p_i + d_i(k_i-1) + \mathrm{output\_padding}_i + 1$.
    """
    x = as_float(x, "x", min_ndim=3)
    x, w, b = _check_conv_params(params, x, True, groups)
    n = w.ndim - 2
    s = check_int_tuple(stride, n, "stride", minimum=1)
    p = check_int_tuple(padding, n, "padding")
    d = check_int_tuple(dilation, n, "dilation", minimum=1)
    op = check_int_tuple(output_padding, n, "output_padding")
    if any(o >= max(si, di) for o, si, di in zip(op, s, d)):
        raise ValueError(f"output_padding must be smaller than max(stride, dilation) on each axis; got "
                         f"output_padding {op}, stride {s}, dilation {d}")
    osz = conv_transpose_output_size(x.shape[2:], w.shape[2:], s, p, d, op)
    if min(osz) < 1:
        raise ValueError(f"padding {p} crops more than the full output of x spatial {x.shape[2:]} with weight "
                         f"kernel {w.shape[2:]}: output {osz}")
    cfg = {"stride": s, "padding": p, "output_padding": op, "groups": int(groups), "dilation": d}
    y = conv_transpose_apply(x, w, b, **cfg)
    return y, {"x": x, "weight": w, "has_bias": b is not None, "cfg": cfg, "out_shape": y.shape}


def conv_transpose_backward(dout, cache):
    """Gradients of :func:`conv_transpose_forward`: ``{"x", "weight"[, "bias"]}`` (a convolution of
    ``dout``; module docstring)."""
    g = as_dout(dout, cache["out_shape"], cache["x"].dtype)
    cfg = dict(cache["cfg"])
    return conv_transpose_vjp(g, cache["x"], cache["weight"], has_bias=cache["has_bias"], **cfg)


def conv_transpose(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`conv_transpose_forward`."""
    return conv_transpose_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _draw_conv_config(rng, size):
    """Dimensionality, channels and options drawn from ``rng`` (tiny: <= ~300 entries in all)."""
    n = int(rng.integers(1, 4))
    groups = int(rng.integers(1, 3))
    k = tuple(int(v) for v in rng.integers(2, 4, n)) if n < 3 else (2,) + tuple(int(v) for v in rng.integers(1, 3, 2))
    dil = tuple(int(v) for v in rng.integers(1, 3, n))
    stride = tuple(int(v) for v in rng.integers(1, 3, n))
    if size == "tiny":
        spatial = {1: (6,), 2: (4, 5), 3: (3, 4, 3)}[n]
        cg_in, cg_out = 1 if n == 3 else int(rng.integers(1, 3)), int(rng.integers(1, 3))
    else:
        spatial = {1: (13,), 2: (7, 9), 3: (5, 6, 5)}[n]
        cg_in, cg_out = int(rng.integers(2, 4)), int(rng.integers(2, 4))
    return n, groups, k, dil, stride, spatial, cg_in, cg_out


def _sample_conv(rng, size):
    n, groups, k, dil, stride, spatial, cg_in, cg_out = _draw_conv_config(rng, size)
    mode = PADDING_MODES[int(rng.integers(0, 4))]
    pad = tuple(int(rng.integers(0, min(2, s - 1) + 1)) for s in spatial)
    # keep the dilated kernel inside the padded input (output size >= 1)
    dil = tuple(di if di * (ki - 1) + 1 <= si + 2 * pi else 1 for di, ki, si, pi in zip(dil, k, spatial, pad))
    padding = "same" if (rng.random() < 0.25) else pad
    if padding == "same":
        stride = 1
    x = rng.standard_normal((2, groups * cg_in) + spatial)
    params = {"weight": rng.standard_normal((groups * cg_out, cg_in) + k) / np.sqrt(cg_in * np.prod(k)),
              "bias": rng.standard_normal(groups * cg_out)}
    return Sample(inputs={"x": x}, params=params, config={"stride": stride, "padding": padding, "dilation": dil,
                                                          "groups": groups, "padding_mode": mode})


def _conv_reference(x, params, *, stride=1, padding=0, dilation=1, groups=1, padding_mode="zeros"):
    # The definition, one output entry at a time, with numpy's own np.pad for the padding modes.
    w, b = params["weight"], params.get("bias")
    n = w.ndim - 2
    s, d = (stride,) * n if isinstance(stride, int) else stride, (dilation,) * n if isinstance(dilation, int) else dilation
    pads = conv_padding(padding, n, w.shape[2:], d, s)
    np_mode = {"zeros": "constant", "reflect": "reflect", "replicate": "edge", "circular": "wrap"}[padding_mode]
    xp = np.pad(x, [(0, 0), (0, 0)] + list(pads), mode=np_mode)
    osz = conv_output_size(x.shape[2:], w.shape[2:], s, pads, d)
    cout, cg = w.shape[0], w.shape[1]
    og = cout // groups
    y = np.zeros((x.shape[0], cout) + osz)
    for bi in range(x.shape[0]):
        for o in range(cout):
            g = o // og
            for pos in np.ndindex(*osz):
                acc = 0.0 if b is None else b[o]
                for c in range(cg):
                    for j in np.ndindex(*w.shape[2:]):
                        idx = tuple(pi * si + ji * di for pi, si, ji, di in zip(pos, s, j, d))
                        acc += w[(o, c) + j] * xp[(bi, g * cg + c) + idx]
                y[(bi, o) + pos] = acc
    return y


def _sample_conv_transpose(rng, size):
    n, groups, k, dil, stride, spatial, cg_in, cg_out = _draw_conv_config(rng, size)
    spatial = tuple(max(2, si - 2) for si in spatial)
    # output size >= 1 needs 2p <= (L-1)s + d(k-1)
    pad = tuple(min(int(rng.integers(0, 2)), ((li - 1) * si + di * (ki - 1)) // 2)
                for li, si, di, ki in zip(spatial, stride, dil, k))
    op = tuple(int(rng.integers(0, max(si, di))) for si, di in zip(stride, dil))
    x = rng.standard_normal((2, groups * cg_in) + spatial)
    params = {"weight": rng.standard_normal((groups * cg_in, cg_out) + k) / np.sqrt(cg_in * np.prod(k)),
              "bias": rng.standard_normal(groups * cg_out)}
    return Sample(inputs={"x": x}, params=params, config={"stride": stride, "padding": pad, "output_padding": op,
                                                          "groups": groups, "dilation": dil})


def _conv_transpose_reference(x, params, *, stride=1, padding=0, output_padding=0, groups=1, dilation=1):
    # Scatter form: input entry (c, q) adds x * W[c, o', j] at output position q*s + j*d - p.
    w, b = params["weight"], params.get("bias")
    n = w.ndim - 2
    s, p, op, d = (check_int_tuple(v, n, "cfg") for v in (stride, padding, output_padding, dilation))
    osz = conv_transpose_output_size(x.shape[2:], w.shape[2:], s, p, d, op)
    cin, og = w.shape[0], w.shape[1]
    ig = cin // groups
    y = np.zeros((x.shape[0], og * groups) + osz)
    for bi in range(x.shape[0]):
        for c in range(cin):
            g = c // ig
            for q in np.ndindex(*x.shape[2:]):
                for o in range(og):
                    for j in np.ndindex(*w.shape[2:]):
                        t = tuple(qi * si + ji * di - pi for qi, si, ji, di, pi in zip(q, s, j, d, p))
                        if all(0 <= ti < oi for ti, oi in zip(t, osz)):
                            y[(bi, g * og + o) + t] += x[(bi, c) + q] * w[(c, o) + j]
    if b is not None:
        y += b.reshape((-1,) + (1,) * n)
    return y


def _check_conv_adjoint(rng):
    # <conv(x), y> = <x, conv_transpose(y)> for zero padding, with conv_transpose's output_padding
    # chosen so that its output has x's shape (this is what makes it "the" transposed conv).
    errs = []
    for n, s, p, d, g in [(1, 2, 1, 1, 1), (2, (2, 1), (1, 0), (1, 2), 2), (3, 1, 1, 2, 1), (2, 3, 2, 1, 1)]:
        spatial = (7, 6, 5)[:n]
        k = (3, 2, 2)[:n]
        x = rng.standard_normal((2, 2 * g) + spatial)
        w = rng.standard_normal((3 * g, 2) + k)
        sx, px, dx_ = (check_int_tuple(v, n, "cfg") for v in (s, p, d))
        y = conv(x, {"weight": w}, stride=s, padding=p, dilation=d, groups=g)
        op = tuple(si - ((oi - 1) * st - 2 * pi + di * (ki - 1) + 1)
                   for si, oi, st, pi, di, ki in zip(spatial, y.shape[2:], sx, px, dx_, k))
        v = rng.standard_normal(y.shape)
        xt = conv_transpose(v, {"weight": w}, stride=s, padding=p, dilation=d, groups=g, output_padding=op)
        lhs, rhs = float(np.sum(y * v)), float(np.sum(x * xt))
        errs.append(abs(lhs - rhs) / max(abs(lhs), 1.0))
    err = max(errs)
    assert err < 1e-12, f"<conv(x), y> != <x, conv_transpose(y)> (rel err {err})"
    return err


def _check_depthwise_is_per_channel(rng):
    # groups = C_in: each channel convolved alone with its own kernel (1-channel convolutions).
    x = rng.standard_normal((2, 3, 6, 5))
    w = rng.standard_normal((6, 1, 3, 3))
    y = conv(x, {"weight": w}, padding=1, groups=3, padding_mode="reflect")
    parts = [conv(x[:, c:c + 1], {"weight": w[2 * c:2 * c + 2]}, padding=1, padding_mode="reflect") for c in range(3)]
    err = float(np.abs(y - np.concatenate(parts, axis=1)).max())
    assert err < 1e-13, f"depthwise conv != per-channel convs (err {err})"
    return err


def _check_same_padding_shape(rng):
    # "same" keeps the spatial shape for odd and even (dilated) kernels.
    x = rng.standard_normal((2, 2, 7, 6))
    for k, d in [((3, 4), (1, 1)), ((2, 2), (2, 3)), ((5, 1), (1, 1))]:
        y = conv(x, {"weight": rng.standard_normal((3, 2) + k)}, padding="same", dilation=d, padding_mode="circular")
        assert y.shape == (2, 3, 7, 6), f"padding='same' changed the shape to {y.shape} (k={k}, d={d})"
    return 0.0


def _check_padding_adjoint(rng):
    # <pad(x), g> = <x, pad_vjp(g)> for every mode.
    x = rng.standard_normal((2, 3, 5, 4))
    pads = ((2, 1), (3, 0))
    errs = []
    for mode in PADDING_MODES:
        xp = pad_nd(x, pads, mode)
        g = rng.standard_normal(xp.shape)
        errs.append(abs(float(np.sum(xp * g)) - float(np.sum(x * pad_nd_vjp(g, pads, mode)))))
    err = max(errs)
    assert err < 1e-12, f"pad_nd_vjp is not the adjoint of pad_nd (err {err})"
    return err


register(
    Mechanism(
        slug="conv", family="5-building-blocks", tier="primitive",
        title="N-d convolution (F.conv{1,2,3}d; weight (C_out, C_in/groups, *k) as in PyTorch)",
        paper="standard (PyTorch torch.nn.functional.conv{1,2,3}d, nn.Conv{1,2,3}d padding_mode)",
        forward=conv_forward, backward=conv_backward, sample=_sample_conv, reference=_conv_reference,
        docs="building-blocks.md#convolution-sampling-pooling-and-windows",
        checks={"conv_transpose_is_adjoint": _check_conv_adjoint, "depthwise_is_per_channel": _check_depthwise_is_per_channel,
                "same_padding_keeps_shape": _check_same_padding_shape, "padding_adjoint": _check_padding_adjoint},
    ),
    Mechanism(
        slug="conv_transpose", family="5-building-blocks", tier="primitive",
        title="N-d transposed convolution (F.conv_transpose{1,2,3}d; weight (C_in, C_out/groups, *k))",
        paper="standard (PyTorch torch.nn.functional.conv_transpose{1,2,3}d)",
        forward=conv_transpose_forward, backward=conv_transpose_backward, sample=_sample_conv_transpose,
        reference=_conv_transpose_reference, docs="building-blocks.md#convolution-sampling-pooling-and-windows",
        checks={"adjoint_of_conv": _check_conv_adjoint},
    ),
)
