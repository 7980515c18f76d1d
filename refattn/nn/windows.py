r"""Swin-style window helpers and ``F.unfold`` / ``F.fold``.

Window partition (Swin, microsoft/Swin-Transformer ``models/swin_transformer.py``)
---------------------------------------------------------------------------------
Token-major ``x (B, *S, C)`` — ``(B, H, W, C)`` for images, ``(B, T, H, W, C)`` for Video Swin —
and a window $M$ (int or one per spatial axis). :func:`window_partition_forward`:

1. pad every spatial axis **at its end** with zeros to a multiple of $M$ (Swin's
   ``F.pad(x, (0, 0, 0, pad_r, 0, pad_b))``; HF's ``maybe_pad``);
2. cyclic shift by $-s$ when ``shift_size`` $s > 0$ (``torch.roll(x, (-s, -s), (1, 2))``);
3. cut into windows: ``(B, nW, N, C)`` with $nW = \prod_a \lceil S_a/M_a\rceil$ windows in
   row-major order over the window grid and $N = \prod_a M_a$ tokens per window, row-major.

**Layout.** Swin returns ``(B * nW, M_h, M_w, C)``; refattn keeps the batch axis,
``(B, nW, N, C)`` (``.reshape(-1, M_h, M_w, C)`` gives Swin's), so that ``split_heads`` gives
``(B, nW, heads, N, d)``, a relative bias ``(heads, N, N)`` broadcasts and the shift mask
``(nW, N, N)`` broadcasts as ``mask[:, None]`` (Swin: ``attn.view(B, nW, nH, N, N) +
mask.unsqueeze(1).unsqueeze(0)``).

:func:`window_reverse_forward` undoes the three steps (windows back on the grid, shift by $+s$,
crop the padding). Both maps are linear; partition is a zero-pad, a permutation and a roll, so
**reverse is the adjoint of partition and vice versa**, and ``reverse(partition(x)) = x``. Each
backward is therefore the other map.

Shifted-window mask
-------------------
:func:`shifted_window_mask`: on the padded grid, each axis is split into the three slices
``[0, L-M)``, ``[L-M, L-s)``, ``[L-s, L)`` (Swin's ``h_slices``/``w_slices``); a token's region
id is its slice tuple read in base 3 (Swin's ``cnt`` loop, axis 0 outermost). Tokens of one window
from different regions were not neighbours before the roll; their score gets ``fill_value``
(Swin, HF: $-100$; $-\infty$ also works) and 0 otherwise: ``(nW, N, N)``. Swin's rule of
shrinking the window to the resolution and dropping the shift when ``min(resolution) <= M``
belongs to the mechanism, not here.

Relative position index
-----------------------
:func:`relative_position_index`: for tokens $i, j$ of an $M_h\times M_w$ window with
coordinates $(h, w)$, $\mathrm{idx}_{ij} = (h_i - h_j + M_h - 1)(2M_w - 1) + (w_i - w_j + M_w - 1)$,
an index into Swin's ``relative_position_bias_table`` of $(2M_h-1)(2M_w-1)$ rows (any number of
axes: Video Swin's 3-D index is the same base-$(2M-1)$ number). :func:`relative_position_bias`
gathers ``table[idx]`` to ``(heads, N, N)``; its VJP scatter-adds into the table rows.
:func:`swinv2_relative_coords_table` is SwinV2's log-spaced coordinate table fed to its CPB MLP.

unfold / fold (``F.unfold`` / ``F.fold``)
-----------------------------------------
``unfold(x (B, C, *S))`` extracts every sliding block (kernel $k$, dilation, zero padding,
stride) into ``(B, C\cdot\prod k, L)``: row $c\prod k + j$ (channel-major, then the kernel offset
$j$ row-major) and column $l$ = the block's position on the output grid, row-major — the im2col
matrix of :mod:`refattn.nn.conv`. ``fold`` is its adjoint: each column is added back at its
block's place (overlaps sum) and the padding is cropped. So ``fold(unfold(x)) = x \odot
\mathrm{fold}(\mathrm{unfold}(1))`` (the count of blocks covering each pixel), and the
backward of each is the other. PyTorch supports 2 spatial axes; the same code takes any number.
"""

from __future__ import annotations

import math

import numpy as np

from .._checks import as_dout, as_float
from ..registry import Mechanism, Sample, register
from .conv import check_int_tuple, col2im, conv_output_size, im2col, pad_nd, pad_nd_vjp

__all__ = [
    "window_partition_forward",
    "window_partition_backward",
    "window_partition",
    "window_partition_apply",
    "window_reverse_forward",
    "window_reverse_backward",
    "window_reverse",
    "window_reverse_apply",
    "cyclic_shift",
    "cyclic_shift_vjp",
    "shifted_window_region_ids",
    "shifted_window_mask",
    "relative_position_index",
    "relative_position_bias",
    "relative_position_bias_vjp",
    "swinv2_relative_coords_table",
    "unfold_forward",
    "unfold_backward",
    "unfold",
    "unfold_apply",
    "fold_forward",
    "fold_backward",
    "fold",
    "fold_apply",
]


# --------------------------------------------------------------------------------------------
# Windows (unvalidated helpers)


def _padded(spatial, window):
    return tuple(-(-si // mi) * mi for si, mi in zip(spatial, window))


def cyclic_shift(x, shift_size, axes):
    """Swin's cyclic shift: ``np.roll(x, -shift_size, axes)`` (content moves toward the origin).
    Its adjoint and inverse is :func:`cyclic_shift_vjp`."""
    s = tuple(shift_size) if isinstance(shift_size, (tuple, list)) else (shift_size,) * len(axes)
    return np.roll(x, tuple(-si for si in s), axis=tuple(axes)) if any(s) else x


def cyclic_shift_vjp(g, shift_size, axes):
    """Adjoint (= inverse) of :func:`cyclic_shift`: ``np.roll(g, +shift_size, axes)``."""
    s = tuple(shift_size) if isinstance(shift_size, (tuple, list)) else (shift_size,) * len(axes)
    return np.roll(g, s, axis=tuple(axes)) if any(s) else g


def window_partition_apply(x, window_size, shift_size=0):
    """Unvalidated ``(B, *S, C) -> (B, nW, N, C)``: pad at the end, shift by ``-shift_size``, cut."""
    n = x.ndim - 2
    m = check_int_tuple(window_size, n, "window_size", minimum=1)
    s = check_int_tuple(shift_size, n, "shift_size")
    spatial = x.shape[1:-1]
    pads = tuple((0, p - si) for p, si in zip(_padded(spatial, m), spatial))
    xp = np.moveaxis(pad_nd(np.moveaxis(x, -1, 1), pads), 1, -1)
    xp = cyclic_shift(xp, s, tuple(range(1, n + 1)))
    grid = tuple(p // mi for p, mi in zip(xp.shape[1:-1], m))
    split = xp.reshape((x.shape[0],) + tuple(v for gm in zip(grid, m) for v in gm) + (x.shape[-1],))
    order = (0,) + tuple(range(1, 2 * n, 2)) + tuple(range(2, 2 * n + 1, 2)) + (2 * n + 1,)
    return split.transpose(order).reshape(x.shape[0], math.prod(grid), math.prod(m), x.shape[-1])


def window_reverse_apply(windows, window_size, spatial_shape, shift_size=0):
    """Unvalidated ``(B, nW, N, C) -> (B, *spatial_shape, C)``: the adjoint and left inverse of
    :func:`window_partition_apply` (windows to the grid, shift by ``+shift_size``, crop)."""
    n = len(spatial_shape)
    m = check_int_tuple(window_size, n, "window_size", minimum=1)
    s = check_int_tuple(shift_size, n, "shift_size")
    padded = _padded(spatial_shape, m)
    grid = tuple(p // mi for p, mi in zip(padded, m))
    B, C = windows.shape[0], windows.shape[-1]
    w = windows.reshape((B,) + grid + m + (C,))
    order = (0,) + tuple(v for a in range(n) for v in (1 + a, 1 + n + a)) + (2 * n + 1,)
    xp = w.transpose(order).reshape((B,) + padded + (C,))
    xp = cyclic_shift_vjp(xp, s, tuple(range(1, n + 1)))
    return xp[(slice(None),) + tuple(slice(0, si) for si in spatial_shape)]


def shifted_window_region_ids(spatial_shape, window_size, shift_size) -> np.ndarray:
    """Swin's ``img_mask`` on the padded grid: region id (base-3 slice tuple) of every token."""
    m, s = _window_config(len(spatial_shape), window_size, shift_size)
    regions = []
    for L, mi, si in zip(_padded(spatial_shape, m), m, s):
        p = np.arange(L)
        regions.append(np.where(p < L - mi, 0, np.where(p < L - si, 1, 2)))
    mesh = np.meshgrid(*regions, indexing="ij")
    return np.ravel_multi_index(mesh, (3,) * len(m))


def shifted_window_mask(spatial_shape, window_size, shift_size, *, fill_value: float = -100.0,
                        dtype=np.float64) -> np.ndarray:
    """Additive shifted-window attention mask ``(nW, N, N)``: ``fill_value`` between tokens of
    different regions, 0 within a region (all zeros when ``shift_size`` is 0)."""
    ids = shifted_window_region_ids(spatial_shape, window_size, shift_size)
    mw = window_partition_apply(ids[None, ..., None], window_size)[0, ..., 0]  # (nW, N)
    return np.where(mw[:, None, :] != mw[:, :, None], fill_value, 0.0).astype(dtype)


def relative_position_index(window_size) -> np.ndarray:
    r"""Swin's ``relative_position_index`` ``(N, N)`` for a window of any number of axes (int or
    tuple; an int means 2-D): $\mathrm{idx}_{ij}$ = the base-$(2M-1)$ number of $c_i - c_j + M - 1$."""
    m = check_int_tuple(window_size, 2, "window_size", minimum=1) if isinstance(window_size, (int, np.integer)) \
        else check_int_tuple(window_size, len(window_size), "window_size", minimum=1)
    coords = np.stack(np.meshgrid(*[np.arange(mi) for mi in m], indexing="ij")).reshape(len(m), -1)
    rel = coords[:, :, None] - coords[:, None, :] + np.array(m)[:, None, None] - 1
    return np.ravel_multi_index(tuple(rel), tuple(2 * mi - 1 for mi in m))


def relative_position_bias(table, index) -> np.ndarray:
    """``table ((2M-1)^n, heads)`` gathered at ``index (N, N)`` -> ``(heads, N, N)``."""
    n = index.shape[0]
    return table[index.reshape(-1)].reshape(n, n, -1).transpose(2, 0, 1)


def relative_position_bias_vjp(dbias, index, table_rows: int) -> np.ndarray:
    """Gradient of :func:`relative_position_bias`: ``dbias (..., heads, N, N)`` summed over leading
    axes and scatter-added into ``(table_rows, heads)``."""
    h, n = dbias.shape[-3], dbias.shape[-1]
    d = dbias.reshape((-1, h, n, n)).sum(axis=0)
    out = np.zeros((table_rows, h), dtype=dbias.dtype)
    np.add.at(out, index.reshape(-1), d.transpose(1, 2, 0).reshape(n * n, h))
    return out


def swinv2_relative_coords_table(window_size, pretrained_window_size=0) -> np.ndarray:
    r"""SwinV2's log-spaced relative coordinates ``((2M_h-1)(2M_w-1), 2)`` for the CPB MLP:
    $\Delta/(M'-1)\cdot 8$ then $\mathrm{sign}\cdot\log_2(|\cdot|+1)/3$, with $M'$ the pretrained
    window if > 0, else the window (skipped when it is 1: HF transformers' guard; microsoft's code
    divides by 0 there). Rows in :func:`relative_position_index` order."""
    m = check_int_tuple(window_size, 2, "window_size", minimum=1)
    pw = check_int_tuple(pretrained_window_size, 2, "pretrained_window_size")
    axes = [np.arange(-(mi - 1), mi, dtype=np.float64) for mi in m]
    table = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1)
    for a in range(2):
        if pw[a] > 0:
            table[..., a] /= pw[a] - 1
        elif m[a] > 1:
            table[..., a] /= m[a] - 1
    table = table * 8
    return (np.sign(table) * np.log2(np.abs(table) + 1.0) / np.log2(8)).reshape(-1, 2)


# --------------------------------------------------------------------------------------------
# unfold / fold (unvalidated helpers)


def _block_geometry(n, kernel_size, dilation, padding, stride):
    k = check_int_tuple(kernel_size, n, "kernel_size", minimum=1)
    d = check_int_tuple(dilation, n, "dilation", minimum=1)
    p = check_int_tuple(padding, n, "padding")
    s = check_int_tuple(stride, n, "stride", minimum=1)
    return k, d, tuple((pi, pi) for pi in p), s


def unfold_apply(x, kernel_size, dilation=1, padding=0, stride=1):
    """Unvalidated ``F.unfold``: ``(B, C, *S) -> (B, C * prod(k), L)``."""
    n = len(kernel_size) if isinstance(kernel_size, (tuple, list)) else x.ndim - 2
    k, d, pads, s = _block_geometry(n, kernel_size, dilation, padding, stride)
    cols = im2col(pad_nd(x, pads), k, s, d)                          # (B, C, *O, *k)
    B, C = x.shape[:2]
    cols = np.moveaxis(cols, tuple(range(2, 2 + n)), tuple(range(2 + n, 2 + 2 * n)))  # (B, C, *k, *O)
    return cols.reshape(B, C * math.prod(k), -1)


def fold_apply(cols, output_size, kernel_size, dilation=1, padding=0, stride=1):
    """Unvalidated ``F.fold``: ``(B, C * prod(k), L) -> (B, C, *output_size)``, overlaps summed."""
    n = len(output_size)
    k, d, pads, s = _block_geometry(n, kernel_size, dilation, padding, stride)
    osz = conv_output_size(output_size, k, s, pads, d)
    B = cols.shape[0]
    c = cols.reshape((B, -1) + k + osz)
    c = np.moveaxis(c, tuple(range(2, 2 + n)), tuple(range(2 + n, 2 + 2 * n)))   # (B, C, *O, *k)
    padded = tuple(L + 2 * lo for L, (lo, _) in zip(output_size, pads))
    return pad_nd_vjp(col2im(c, padded, s, d), pads)


# --------------------------------------------------------------------------------------------
# Validated pairs


def _window_config(n, window_size, shift_size):
    m = check_int_tuple(window_size, n, "window_size", minimum=1)
    s = check_int_tuple(shift_size, n, "shift_size")
    if any(si >= mi for si, mi in zip(s, m)):
        raise ValueError(f"shift_size must be smaller than window_size on every axis; got shift_size {s}, "
                         f"window_size {m}")
    return m, s


def window_partition_forward(x, *, window_size, shift_size=0):
    r"""Swin window partition (pad at the end, cyclic shift by $-s$, cut into windows).

    Parameters
    ----------
    x : array (B, *spatial, C)
        Token-major (``(B, H, W, C)`` for Swin; ``(B, T, H, W, C)`` for Video Swin).
    window_size : int or tuple
        Window $M$ per spatial axis; spatial sizes need not be multiples (zero padding at the end).
    shift_size : int or tuple
        Swin's shift $s$ (``window_size // 2`` on odd blocks, 0 otherwise); $0\le s < M$.

    Returns
    -------
    windows, cache
        ``windows (B, nW, N, C)``, $N = \prod M$, $nW = \prod\lceil S/M\rceil$ (Swin:
        ``windows.reshape(-1, M_h, M_w, C)``).
    """
    x = as_float(x, "x", min_ndim=3)
    m, s = _window_config(x.ndim - 2, window_size, shift_size)
    w = window_partition_apply(x, m, s)
    return w, {"spatial": x.shape[1:-1], "window": m, "shift": s, "shape": w.shape, "dtype": x.dtype}


def window_partition_backward(dout, cache):
    """Gradient of :func:`window_partition_forward`: ``{"x": window_reverse(dout)}`` (its adjoint)."""
    g = as_dout(dout, cache["shape"], cache["dtype"])
    return {"x": window_reverse_apply(g, cache["window"], cache["spatial"], cache["shift"])}


def window_partition(x, *, window_size, shift_size=0) -> np.ndarray:
    """Convenience wrapper: the output of :func:`window_partition_forward`."""
    return window_partition_forward(x, window_size=window_size, shift_size=shift_size)[0]


def window_reverse_forward(windows, *, window_size, spatial_shape, shift_size=0):
    r"""Swin window reverse: windows back on the grid, cyclic shift by $+s$, padding cropped.

    Parameters
    ----------
    windows : array (B, nW, N, C)
        As produced by :func:`window_partition_forward` with the same ``window_size``,
        ``shift_size`` and ``spatial_shape``.
    window_size, shift_size : int or tuple
    spatial_shape : tuple of ints
        The unpadded spatial shape ``(H, W)`` (or ``(T, H, W)``) to return.

    Returns
    -------
    x, cache
        ``x (B, *spatial_shape, C)``.
    """
    windows = as_float(windows, "windows", ndim=4)
    if not isinstance(spatial_shape, (tuple, list)) or len(spatial_shape) < 1:
        raise TypeError(f"spatial_shape must be a non-empty tuple of ints; got {spatial_shape!r}")
    sp = check_int_tuple(tuple(spatial_shape), len(spatial_shape), "spatial_shape", minimum=1)
    m, s = _window_config(len(sp), window_size, shift_size)
    nw, nt = math.prod(p // mi for p, mi in zip(_padded(sp, m), m)), math.prod(m)
    if windows.shape[1:3] != (nw, nt):
        raise ValueError(f"windows must have shape (B, nW={nw}, N={nt}, C) for spatial_shape {sp} and window_size "
                         f"{m}; got {windows.shape}")
    x = window_reverse_apply(windows, m, sp, s)
    return x, {"spatial": sp, "window": m, "shift": s, "shape": x.shape, "dtype": windows.dtype}


def window_reverse_backward(dout, cache):
    """Gradient of :func:`window_reverse_forward`: ``{"windows": window_partition(dout)}`` (its adjoint)."""
    g = as_dout(dout, cache["shape"], cache["dtype"])
    return {"windows": window_partition_apply(g, cache["window"], cache["shift"])}


def window_reverse(windows, *, window_size, spatial_shape, shift_size=0) -> np.ndarray:
    """Convenience wrapper: the output of :func:`window_reverse_forward`."""
    return window_reverse_forward(windows, window_size=window_size, spatial_shape=spatial_shape,
                                  shift_size=shift_size)[0]


def _fold_checks(n, kernel_size, dilation, padding, stride, spatial):
    k, d, pads, s = _block_geometry(n, kernel_size, dilation, padding, stride)
    osz = conv_output_size(spatial, k, s, pads, d)
    if min(osz) < 1:
        raise ValueError(f"the padded spatial size {tuple(spatial)} (padding {padding!r}) is smaller than the "
                         f"dilated kernel_size {k} (dilation {d}): no block fits")
    return k, d, pads, s, osz


def unfold_forward(x, *, kernel_size, dilation=1, padding=0, stride=1):
    r"""Sliding blocks as columns, ``F.unfold`` semantics.

    Parameters
    ----------
    x : array (B, C, *spatial)
        PyTorch: 2 spatial axes; here any number (``n = len(kernel_size)`` for a tuple, else
        ``x.ndim - 2``).
    kernel_size, dilation, padding, stride : int or tuple of n ints
        Zero padding on both sides.

    Returns
    -------
    cols, cache
        ``cols (B, C * prod(k), L)``: rows channel-major then kernel offset, columns the block
        positions row-major.
    """
    x = as_float(x, "x", min_ndim=3)
    n = len(kernel_size) if isinstance(kernel_size, (tuple, list)) else x.ndim - 2
    if x.ndim != n + 2:
        raise ValueError(f"x must be (B, C, *spatial) with {n} spatial axes (one per kernel_size entry); "
                         f"got shape {x.shape}")
    k, d, pads, s, _ = _fold_checks(n, kernel_size, dilation, padding, stride, x.shape[2:])
    cfg = {"kernel_size": k, "dilation": d, "padding": tuple(lo for lo, _ in pads), "stride": s}
    y = unfold_apply(x, **cfg)
    return y, {"x_shape": x.shape, "cfg": cfg, "shape": y.shape, "dtype": x.dtype}


def unfold_backward(dout, cache):
    """Gradient of :func:`unfold_forward`: ``{"x": fold(dout)}`` (its adjoint)."""
    g = as_dout(dout, cache["shape"], cache["dtype"])
    return {"x": fold_apply(g, cache["x_shape"][2:], **cache["cfg"])}


def unfold(x, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`unfold_forward`."""
    return unfold_forward(x, **config)[0]


def fold_forward(x, *, output_size, kernel_size, dilation=1, padding=0, stride=1):
    r"""Columns added back into an image, ``F.fold`` semantics (the adjoint of :func:`unfold_forward`).

    Parameters
    ----------
    x : array (B, C * prod(k), L)
        ``L`` must equal the number of blocks that fit ``output_size``.
    output_size : int or tuple of ints
        Spatial shape of the result (an int means 2-D, as PyTorch).
    kernel_size, dilation, padding, stride : int or tuple

    Returns
    -------
    y, cache
        ``y (B, C, *output_size)``; overlapping blocks sum.
    """
    x = as_float(x, "x", ndim=3)
    n = len(output_size) if isinstance(output_size, (tuple, list)) else 2
    osz_in = check_int_tuple(output_size, n, "output_size", minimum=1)
    k, d, pads, s, blocks = _fold_checks(n, kernel_size, dilation, padding, stride, osz_in)
    kk = math.prod(k)
    if x.shape[1] % kk:
        raise ValueError(f"x.shape[1] ({x.shape[1]}) must be C * prod(kernel_size) = C * {kk}")
    if x.shape[2] != math.prod(blocks):
        raise ValueError(f"x.shape[2] must be the number of blocks L = {math.prod(blocks)} ({blocks}) for "
                         f"output_size {osz_in}; got x of shape {x.shape}")
    cfg = {"kernel_size": k, "dilation": d, "padding": tuple(lo for lo, _ in pads), "stride": s}
    y = fold_apply(x, osz_in, **cfg)
    return y, {"cols_shape": x.shape, "cfg": cfg, "shape": y.shape, "dtype": x.dtype}


def fold_backward(dout, cache):
    """Gradient of :func:`fold_forward`: ``{"x": unfold(dout)}`` (its adjoint)."""
    g = as_dout(dout, cache["shape"], cache["dtype"])
    return {"x": unfold_apply(g, **cache["cfg"])}


def fold(x, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`fold_forward`."""
    return fold_forward(x, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _draw_windows(rng, size):
    n = 3 if rng.random() < 0.25 else 2
    if n == 2:
        sp = tuple(int(v) for v in rng.integers(3, 6, 2)) if size == "tiny" else tuple(int(v) for v in rng.integers(5, 10, 2))
        m = tuple(int(v) for v in rng.integers(2, 4, 2))
    else:
        sp = (2, 3, 3) if size == "tiny" else (3, 5, 4)
        m = (2, 2, int(rng.integers(2, 4)))
    s = tuple(int(rng.integers(0, mi)) for mi in m)
    return sp, m, s, 2 if size == "tiny" else 3


def _sample_partition(rng, size):
    sp, m, s, c = _draw_windows(rng, size)
    return Sample(inputs={"x": rng.standard_normal((2,) + sp + (c,))}, config={"window_size": m, "shift_size": s})


def _sample_reverse(rng, size):
    sp, m, s, c = _draw_windows(rng, size)
    nw = math.prod(-(-si // mi) for si, mi in zip(sp, m))
    w = rng.standard_normal((2, nw, math.prod(m), c))
    return Sample(inputs={"windows": w}, config={"window_size": m, "spatial_shape": sp, "shift_size": s})


def _partition_reference(x, *, window_size, shift_size=0):
    # Token by token: padded-and-rolled position q of window (grid index g, offset j) reads
    # x[(g*M + j + s) mod Lp] if inside the unpadded input, else 0.
    sp = x.shape[1:-1]
    n = len(sp)
    m, s = check_int_tuple(window_size, n, "w"), check_int_tuple(shift_size, n, "s")
    lp = _padded(sp, m)
    grid = tuple(p // mi for p, mi in zip(lp, m))
    out = np.zeros((x.shape[0], math.prod(grid), math.prod(m), x.shape[-1]))
    for wi, g in enumerate(np.ndindex(*grid)):
        for ti, j in enumerate(np.ndindex(*m)):
            q = tuple((gi * mi + ji + si) % L for gi, mi, ji, si, L in zip(g, m, j, s, lp))
            if all(qi < L for qi, L in zip(q, sp)):
                out[:, wi, ti] = x[(slice(None),) + q]
    return out


def _reverse_reference(windows, *, window_size, spatial_shape, shift_size=0):
    n = len(spatial_shape)
    m, s = check_int_tuple(window_size, n, "w"), check_int_tuple(shift_size, n, "s")
    lp = _padded(spatial_shape, m)
    grid = tuple(p // mi for p, mi in zip(lp, m))
    out = np.zeros((windows.shape[0],) + tuple(spatial_shape) + (windows.shape[-1],))
    for wi, g in enumerate(np.ndindex(*grid)):
        for ti, j in enumerate(np.ndindex(*m)):
            q = tuple((gi * mi + ji + si) % L for gi, mi, ji, si, L in zip(g, m, j, s, lp))
            if all(qi < L for qi, L in zip(q, spatial_shape)):
                out[(slice(None),) + q] = windows[:, wi, ti]
    return out


def _check_round_trip_and_adjoint(rng):
    errs = []
    for sp, m, s in [((7, 9), (3, 4), (1, 2)), ((8, 8), 4, 2), ((3, 5, 4), (2, 2, 3), (1, 0, 1))]:
        x = rng.standard_normal((2,) + sp + (3,))
        w = window_partition(x, window_size=m, shift_size=s)
        back = window_reverse(w, window_size=m, spatial_shape=sp, shift_size=s)
        errs.append(float(np.abs(back - x).max()))
        v = rng.standard_normal(w.shape)
        xv = window_reverse(v, window_size=m, spatial_shape=sp, shift_size=s)
        errs.append(abs(float(np.sum(w * v)) - float(np.sum(x * xv))))
    err = max(errs)
    assert err < 1e-12, f"window reverse(partition(x)) != x or the maps are not adjoint (err {err})"
    return err


def _swin_mask_transcription(H, W, ws, shift):
    # microsoft/Swin-Transformer SwinTransformerBlock.__init__ (attn_mask), in NumPy.
    img = np.zeros((1, H, W, 1))
    cnt = 0
    sl = (slice(0, -ws), slice(-ws, -shift), slice(-shift, None))
    for h in sl:
        for w in sl:
            img[:, h, w, :] = cnt
            cnt += 1
    mw = img.reshape(1, H // ws, ws, W // ws, ws, 1).transpose(0, 1, 3, 2, 4, 5).reshape(-1, ws * ws)
    am = mw[:, None, :] - mw[:, :, None]
    return np.where(am != 0, -100.0, 0.0)


def _check_shift_mask_matches_swin(rng):
    for (H, W), ws, shift in [((8, 8), 4, 2), ((12, 6), 3, 1), ((14, 14), 7, 3)]:
        got = shifted_window_mask((H, W), ws, shift)
        want = _swin_mask_transcription(H, W, ws, shift)
        assert got.shape == want.shape and np.array_equal(got, want), f"mask differs from Swin's for {(H, W, ws, shift)}"
    # padding: the mask of an unpadded size is the mask of the padded size
    assert np.array_equal(shifted_window_mask((7, 9), 4, 2, fill_value=-np.inf),
                          shifted_window_mask((8, 12), 4, 2, fill_value=-np.inf))
    assert not shifted_window_mask((8, 8), 4, 0).any(), "shift 0 must give an all-zero mask"
    return 0.0


def _check_relative_position_index(rng):
    # microsoft/Swin-Transformer WindowAttention.__init__, transcribed; and Video Swin's 3-D index.
    for wh, ww in [(7, 7), (3, 5), (1, 4)]:
        ch, cw = np.meshgrid(np.arange(wh), np.arange(ww), indexing="ij")
        cf = np.stack([ch.ravel(), cw.ravel()])
        rel = (cf[:, :, None] - cf[:, None, :]).transpose(1, 2, 0).copy()
        rel[:, :, 0] += wh - 1
        rel[:, :, 1] += ww - 1
        rel[:, :, 0] *= 2 * ww - 1
        assert np.array_equal(relative_position_index((wh, ww)), rel.sum(-1)), f"index differs for {(wh, ww)}"
    idx3 = relative_position_index((2, 3, 2))
    assert idx3.max() == 3 * 5 * 3 - 1 and idx3.shape == (12, 12) and np.all(np.diag(idx3) == (3 * 5 * 3) // 2)
    # the bias gather and its scatter-add VJP are adjoint
    idx = relative_position_index((3, 4))
    table = rng.standard_normal((5 * 7, 2))
    b = relative_position_bias(table, idx)
    g = rng.standard_normal((3,) + b.shape)
    err = abs(float(np.sum(b * g.sum(0))) - float(np.sum(table * relative_position_bias_vjp(g, idx, 35))))
    assert err < 1e-12, f"relative_position_bias_vjp is not the adjoint of the gather (err {err})"
    return err


def _check_swinv2_table(rng):
    # SwinV2 (microsoft/Swin-Transformer swin_transformer_v2.py) transcribed for a 4x6 window.
    t = swinv2_relative_coords_table((4, 6))
    h, w = np.meshgrid(np.arange(-3, 4) / 3 * 8, np.arange(-5, 6) / 5 * 8, indexing="ij")
    want = np.stack([h, w], -1).reshape(-1, 2)
    want = np.sign(want) * np.log2(np.abs(want) + 1) / np.log2(8)
    err = float(np.abs(t - want).max())
    assert err < 1e-15 and np.isfinite(swinv2_relative_coords_table(1)).all()
    return err


def _sample_unfold(rng, size):
    sp = (4, 5) if size == "tiny" else (7, 8)
    k = tuple(int(v) for v in rng.integers(1, 4, 2))
    d = tuple(int(v) for v in rng.integers(1, 3, 2))
    p = tuple(int(v) for v in rng.integers(0, 2, 2))
    d = tuple(di if di * (ki - 1) + 1 <= si + 2 * pi else 1 for di, ki, si, pi in zip(d, k, sp, p))
    s = tuple(int(v) for v in rng.integers(1, 3, 2))
    x = rng.standard_normal((2, 2 if size == "tiny" else 3) + sp)
    return Sample(inputs={"x": x}, config={"kernel_size": k, "dilation": d, "padding": p, "stride": s})


def _sample_fold(rng, size):
    s = _sample_unfold(rng, size)
    cols = unfold(s.inputs["x"], **s.config)
    if size == "tiny" and cols.size > 300:
        s.config["stride"] = (2, 2)
        cols = unfold(s.inputs["x"], **s.config)
    return Sample(inputs={"x": rng.standard_normal(cols.shape)},
                  config=dict(s.config, output_size=s.inputs["x"].shape[2:]))


def _unfold_reference(x, *, kernel_size, dilation=1, padding=0, stride=1):
    # F.unfold's definition: column l (block at grid position o), row c*K + j reads
    # x[c, o*s + j*d - p], zero outside.
    k, d, p, s = (check_int_tuple(v, 2, "cfg") for v in (kernel_size, dilation, padding, stride))
    osz = conv_output_size(x.shape[2:], k, s, tuple((pi, pi) for pi in p), d)
    B, C = x.shape[:2]
    out = np.zeros((B, C * math.prod(k), math.prod(osz)))
    for li, o in enumerate(np.ndindex(*osz)):
        for c in range(C):
            for ji, j in enumerate(np.ndindex(*k)):
                q = tuple(oi * si + jj * di - pi for oi, si, jj, di, pi in zip(o, s, j, d, p))
                if all(0 <= qi < L for qi, L in zip(q, x.shape[2:])):
                    out[:, c * math.prod(k) + ji, li] = x[(slice(None), c) + q]
    return out


def _fold_reference(x, *, output_size, kernel_size, dilation=1, padding=0, stride=1):
    k, d, p, s = (check_int_tuple(v, 2, "cfg") for v in (kernel_size, dilation, padding, stride))
    osz = conv_output_size(output_size, k, s, tuple((pi, pi) for pi in p), d)
    kk = math.prod(k)
    out = np.zeros((x.shape[0], x.shape[1] // kk) + tuple(output_size))
    for li, o in enumerate(np.ndindex(*osz)):
        for c in range(x.shape[1] // kk):
            for ji, j in enumerate(np.ndindex(*k)):
                q = tuple(oi * si + jj * di - pi for oi, si, jj, di, pi in zip(o, s, j, d, p))
                if all(0 <= qi < L for qi, L in zip(q, output_size)):
                    out[(slice(None), c) + q] += x[:, c * kk + ji, li]
    return out


def _check_fold_unfold(rng):
    x = rng.standard_normal((2, 3, 7, 6))
    cfg = {"kernel_size": (3, 2), "dilation": (1, 2), "padding": (1, 1), "stride": (2, 1)}
    cols = unfold(x, **cfg)
    v = rng.standard_normal(cols.shape)
    err = abs(float(np.sum(cols * v)) - float(np.sum(x * fold(v, output_size=(7, 6), **cfg))))
    count = fold(unfold(np.ones_like(x), **cfg), output_size=(7, 6), **cfg)
    err = max(err, float(np.abs(fold(cols, output_size=(7, 6), **cfg) - x * count).max()))
    # non-overlapping blocks (stride = kernel) are a pure permutation: fold(unfold(x)) = x
    err = max(err, float(np.abs(fold(unfold(x[..., :6], kernel_size=(1, 3), stride=(1, 3)),
                                     output_size=(7, 6), kernel_size=(1, 3), stride=(1, 3)) - x[..., :6]).max()))
    assert err < 1e-12, f"fold/unfold adjoint or round-trip identity failed (err {err})"
    return err


_DOCS = "building-blocks.md#convolution-sampling-pooling-and-windows"
_SWIN = ("Liu et al., Swin Transformer: Hierarchical Vision Transformer using Shifted Windows, ICCV 2021, "
         "arXiv 2103.14030")
_WINDOW_CHECKS = {"round_trip_and_adjoint": _check_round_trip_and_adjoint,
                  "shift_mask_matches_swin": _check_shift_mask_matches_swin,
                  "relative_position_index_matches_swin": _check_relative_position_index,
                  "swinv2_coords_table": _check_swinv2_table}
register(
    Mechanism(
        slug="window_partition", family="5-building-blocks", tier="primitive",
        title="Swin window partition (pad to a multiple, cyclic shift, windows (B, nW, N, C))",
        paper=_SWIN, forward=window_partition_forward, backward=window_partition_backward,
        sample=_sample_partition, reference=_partition_reference, docs=_DOCS, checks=_WINDOW_CHECKS,
    ),
    Mechanism(
        slug="window_reverse", family="5-building-blocks", tier="primitive",
        title="Swin window reverse (windows to the grid, reverse shift, crop the padding)",
        paper=_SWIN, forward=window_reverse_forward, backward=window_reverse_backward, sample=_sample_reverse,
        reference=_reverse_reference, docs=_DOCS, checks={"round_trip_and_adjoint": _check_round_trip_and_adjoint},
    ),
    Mechanism(
        slug="unfold", family="5-building-blocks", tier="primitive",
        title="unfold: sliding blocks as columns (F.unfold, im2col)",
        paper="standard (PyTorch torch.nn.functional.unfold)", forward=unfold_forward, backward=unfold_backward,
        sample=_sample_unfold, reference=_unfold_reference, docs=_DOCS, checks={"fold_is_adjoint": _check_fold_unfold},
    ),
    Mechanism(
        slug="fold", family="5-building-blocks", tier="primitive",
        title="fold: columns summed back into an image (F.fold, col2im; the adjoint of unfold)",
        paper="standard (PyTorch torch.nn.functional.fold)", forward=fold_forward, backward=fold_backward,
        sample=_sample_fold, reference=_fold_reference, docs=_DOCS, checks={"unfold_is_adjoint": _check_fold_unfold},
    ),
)
