r"""Layer, RMS, group and instance normalisation, sharing one normalisation core.

All four layers are one operation with different statistics axes:

=================  ===============================================  =========
layer              statistics over                                  centred
=================  ===============================================  =========
``layer_norm``     ``axis`` (default the last)                      yes
``rms_norm``       ``axis`` (default the last)                      no
``group_norm``     each group of ``C/G`` channels x all point axes  yes
``instance_norm``  all point axes, per sample and channel           yes
=================  ===============================================  =========

The core (:func:`normalize_forward` / :func:`normalize_backward`) computes $\hat x$ over a
tuple of axes with an optional 0/1 weight ``m`` that excludes padded entries from the
statistics (masked instance norm, OFormer); the layers add their affine transform.

Forward (two-pass: the mean first, then the mean of squared deviations; the one-pass
$E[x^2]-E[x]^2$ loses every digit when $|\mu| \gg \sigma$). With $n = \sum m$ over the
statistics axes (the axis size when unmasked):

$$\mu = \tfrac1n\textstyle\sum_j m_j x_j,\quad \sigma^2 = \tfrac1n\sum_j m_j (x_j-\mu)^2,\quad
r = (\sigma^2+\epsilon)^{-1/2},\quad \hat x_i = m_i (x_i-\mu)\,r.$$

For RMSNorm $\mu$ is fixed at 0. Padded entries ($m_i = 0$) output 0 and receive gradient 0; a
sample with no real point gives $\hat x = 0$ (no NaN).

Derivation
----------
With $g = \partial L/\partial\hat x$ (masked: $g_i \leftarrow m_i g_i$), using
$\partial\mu/\partial x_i = m_i/n$ and $\partial\sigma^2/\partial x_i = 2m_i(x_i-\mu)/n$ (the
term through $\mu$ vanishes because $\sum_j m_j(x_j-\mu) = 0$), so
$\partial r/\partial x_i = -r^2 m_i\hat x_i/n$:

$$\frac{\partial L}{\partial x_i} = \sum_j g_j\frac{\partial\hat x_j}{\partial x_i}
= r\Big(g_i - \frac{m_i}{n}\sum_j g_j - \frac{m_i\hat x_i}{n}\sum_j g_j\hat x_j\Big).$$

RMSNorm drops the middle term. The affine layer $y = \gamma\odot\hat x + \beta$ gives
$g = \gamma\odot dy$, $d\gamma = \sum dy\odot\hat x$ and $d\beta = \sum dy$ over every axis along
which $\gamma,\beta$ are broadcast.
"""

from __future__ import annotations

import numpy as np

from .._checks import (
    as_dout,
    as_float,
    cast_all,
    check_broadcastable,
    check_int,
    check_param_keys,
    check_positive,
    compute_dtype,
)
from ..registry import Mechanism, Sample, register

__all__ = [
    "normalize_forward",
    "normalize_backward",
    "layer_norm_forward",
    "layer_norm_backward",
    "layer_norm",
    "rms_norm_forward",
    "rms_norm_backward",
    "rms_norm",
    "group_norm_forward",
    "group_norm_backward",
    "group_norm",
    "instance_norm_forward",
    "instance_norm_backward",
    "instance_norm",
]


# --------------------------------------------------------------------------------------------
# The shared core (unvalidated: callers validate first)


def normalize_forward(x: np.ndarray, axes: tuple[int, ...], eps: float, *, center: bool = True,
                      mask: np.ndarray | None = None):
    r"""$\hat x$ over ``axes`` (non-negative ints) with optional 0/1 float ``mask`` broadcastable
    to ``x`` (same ndim). Returns ``(xhat, stats)``; ``stats`` feeds :func:`normalize_backward`."""
    if mask is None:
        n = float(np.prod([x.shape[a] for a in axes]))
        xc = x - np.mean(x, axis=axes, keepdims=True) if center else x
        var = np.mean(xc * xc, axis=axes, keepdims=True)
    else:
        n = np.sum(np.broadcast_to(mask, x.shape), axis=axes, keepdims=True)
        n = np.maximum(n, 1.0)  # an all-padded group: sums are 0, output 0, no NaN
        xc = x - np.sum(mask * x, axis=axes, keepdims=True) / n if center else x
        var = np.sum(mask * xc * xc, axis=axes, keepdims=True) / n
    rstd = 1.0 / np.sqrt(var + eps)
    xhat = xc * rstd
    if mask is not None:
        xhat = xhat * mask
    return xhat, {"rstd": rstd, "n": n, "axes": axes, "center": center, "mask": mask}


def normalize_backward(g: np.ndarray, xhat: np.ndarray, stats: dict) -> np.ndarray:
    r"""$dx = r\,(g - \tfrac{m}{n}\sum g - \tfrac{m\hat x}{n}\sum g\hat x)$ (no middle term
    uncentred); see the module docstring."""
    axes, n, m = stats["axes"], stats["n"], stats["mask"]
    if m is not None:
        g = g * m
    dx = g - xhat * (np.sum(g * xhat, axis=axes, keepdims=True) / n)
    if stats["center"]:
        mean_g = np.sum(g, axis=axes, keepdims=True) / n
        dx = dx - (mean_g if m is None else m * mean_g)
    return stats["rstd"] * dx


# --------------------------------------------------------------------------------------------
# Validation helpers


def _norm_axes(axis, ndim: int, name: str = "axis") -> tuple[int, ...]:
    raw = (axis,) if isinstance(axis, (int, np.integer)) and not isinstance(axis, (bool, np.bool_)) else axis
    if not isinstance(raw, (tuple, list)) or len(raw) == 0:
        raise TypeError(f"{name} must be an int or a non-empty tuple of ints; got {axis!r}")
    out = []
    for a in raw:
        a = check_int(a, name)
        if not -ndim <= a < ndim:
            raise ValueError(f"{name} entries must be in [{-ndim}, {ndim}) for an input with {ndim} dimensions; got {a}")
        out.append(a % ndim)
    if len(set(out)) != len(out):
        raise ValueError(f"{name} has repeated axes: {axis!r}")
    return tuple(sorted(out))


def _validated_affine(params, allowed: tuple[str, ...], what: str) -> dict:
    """``{}`` for ``params=None`` (no affine); else the dict's non-None entries, after checking
    its keys: ``"weight"`` required, the rest of ``allowed`` optional (shapes: :func:`_affine_shapes`)."""
    if params is None:
        return {}
    check_param_keys(params, ("weight",), [k for k in allowed if k != "weight"], where=what)
    return {k: v for k, v in params.items() if v is not None}


def _affine_shapes(params: dict, x_shape: tuple, norm_shape: tuple, full_shape: tuple) -> dict:
    """Validate affine params: shape ``norm_shape`` (reshaped to ``full_shape``) or any shape that
    broadcasts to ``x`` (e.g. per-head ``(H, 1, d)``). Returns name -> broadcastable array."""
    out = {}
    for k, v in params.items():
        a = as_float(v, k)
        if a.shape == tuple(norm_shape):
            out[k] = a.reshape(full_shape)
        else:
            try:
                ok = np.broadcast_shapes(a.shape, x_shape) == tuple(x_shape)
            except ValueError:
                ok = False
            if not ok:
                raise ValueError(f"{k} must have shape {tuple(norm_shape)} or broadcast to x of shape "
                                 f"{tuple(x_shape)}; got {a.shape}")
            out[k] = a
    return out


def _unbroadcast(g: np.ndarray, shape: tuple) -> np.ndarray:
    """Sum ``g`` down to ``shape`` (the shape an array had before broadcasting to ``g``)."""
    lead = g.ndim - len(shape)
    g = g.sum(axis=tuple(range(lead))) if lead else g
    axes = tuple(i for i, s in enumerate(shape) if s == 1 and g.shape[i] != 1)
    return g.sum(axis=axes, keepdims=True) if axes else g


def _affine_forward(xhat, aff: dict, mask=None):
    y = xhat
    if "weight" in aff:
        y = y * aff["weight"]
    if "bias" in aff:
        y = y + aff["bias"]
        if mask is not None:
            y = y * mask  # padded points output 0, bias included
    return y


def _affine_backward(dy, xhat, aff: dict, shapes: dict, mask=None):
    """Returns ``(g, grads)``: ``g = dL/dxhat`` and the parameter gradients in their own shapes."""
    grads = {}
    if "bias" in aff:
        if mask is not None:
            dy = dy * mask
        grads["bias"] = _unbroadcast(dy, aff["bias"].shape).reshape(shapes["bias"])
    g = dy
    if "weight" in aff:
        grads["weight"] = _unbroadcast(dy * xhat, aff["weight"].shape).reshape(shapes["weight"])
        g = dy * aff["weight"]
    return g, grads


# --------------------------------------------------------------------------------------------
# LayerNorm and RMSNorm: statistics over `axis`


def _axis_norm_forward(x, params, axis, eps, center, allowed, what):
    x = as_float(x, "x", min_ndim=1)
    axes = _norm_axes(axis, x.ndim)
    eps = check_positive(eps, "eps", allow_zero=True)
    params = _validated_affine(params, allowed, what)
    norm_shape = tuple(x.shape[a] for a in axes)
    full = tuple(x.shape[i] if i in axes else 1 for i in range(x.ndim))
    aff = _affine_shapes(params, x.shape, norm_shape, full)
    dt = compute_dtype(x, *aff.values())
    x = x.astype(dt, copy=False)
    aff = cast_all(dt, aff)
    xhat, stats = normalize_forward(x, axes, eps, center=center)
    y = _affine_forward(xhat, aff)
    shapes = {k: np.shape(v) for k, v in params.items()}
    return y, {"xhat": xhat, "stats": stats, "aff": aff, "shapes": shapes}


def _axis_norm_backward(dout, cache):
    xhat = cache["xhat"]
    dout = as_dout(dout, xhat.shape, xhat.dtype)
    g, grads = _affine_backward(dout, xhat, cache["aff"], cache["shapes"])
    grads["x"] = normalize_backward(g, xhat, cache["stats"])
    return grads


def layer_norm_forward(x, params=None, *, axis=-1, eps: float = 1e-5):
    r"""Layer normalisation over ``axis``: $y = \gamma\odot(x-\mu)/\sqrt{\sigma^2+\epsilon} + \beta$.

    Parameters
    ----------
    x : array (...)
    params : dict or None
        ``None``: no affine (``elementwise_affine=False``). Otherwise ``"weight"`` $\gamma$ and
        optional ``"bias"`` $\beta$ (PyTorch ``LayerNorm(bias=False)`` has none), each of shape
        ``x.shape[axis]`` (PyTorch's ``normalized_shape``; load ``ln.weight``/``ln.bias``
        as-is) or any shape broadcastable to ``x`` — e.g. ``(H, 1, d)`` for the per-head LN of
        the Galerkin transformer on ``x (B, H, N, d)``.
    axis : int or tuple of ints
        Normalised axes, default the last. PyTorch ``LayerNorm(normalized_shape)`` with a
        ``k``-dim shape is ``axis=(-k, ..., -1)``.
    eps : float
        Added to the biased variance; PyTorch default ``1e-5`` (galerkin-transformer results
        depend on it in float32).
    """
    return _axis_norm_forward(x, params, axis, eps, True, ("weight", "bias"), "layer_norm")


def layer_norm_backward(dout, cache):
    r"""Gradient of :func:`layer_norm_forward`: $dx = r(d\hat x - \mathrm{mean}\,d\hat x -
    \hat x\,\mathrm{mean}(d\hat x\odot\hat x))$, $d\gamma = \sum dy\odot\hat x$, $d\beta = \sum dy$."""
    return _axis_norm_backward(dout, cache)


def layer_norm(x, params=None, *, axis=-1, eps: float = 1e-5) -> np.ndarray:
    """Convenience wrapper: the output of :func:`layer_norm_forward`."""
    return layer_norm_forward(x, params, axis=axis, eps=eps)[0]


def rms_norm_forward(x, params=None, *, axis=-1, eps: float = 1e-5):
    r"""RMS normalisation: $y = \gamma\odot x/\sqrt{\mathrm{mean}(x^2)+\epsilon}$ over ``axis``.

    Follows microsoft/unilm ``Diff-Transformer/diff/rms_norm.py`` (``x *
    rsqrt(x.pow(2).mean(-1) + eps)``, then ``* weight`` when ``elementwise_affine``).

    Parameters
    ----------
    x : array (...)
    params : dict or None
        ``None`` is ``elementwise_affine=False`` (DIFF V1 ``multihead_flashdiff_2`` and
        torchscale's sub-LN use both settings); otherwise ``{"weight": gamma}`` of shape
        ``x.shape[axis]`` or broadcastable to ``x``. RMSNorm has no bias.
    axis : int or tuple of ints
        Default the last axis (unilm, ``torch.nn.RMSNorm``).
    eps : float
        Default ``1e-5``, the value DIFF Transformer's attention passes for its per-head sub-LN
        (``RMSNorm(2 * head_dim, eps=1e-5)`` in unilm ``multihead_diffattn.py``). The
        ``RMSNorm`` class's own default in unilm ``diff/rms_norm.py`` is ``1e-6``;
        ``torch.nn.RMSNorm``'s is ``None`` = ``torch.finfo(dtype).eps``. Pass the one you match.
    """
    return _axis_norm_forward(x, params, axis, eps, False, ("weight",), "rms_norm")


def rms_norm_backward(dout, cache):
    r"""Gradient of :func:`rms_norm_forward`: $dx = r(d\hat x - \hat x\,\mathrm{mean}(d\hat x\odot\hat x))$,
    $d\gamma = \sum dy\odot\hat x$."""
    return _axis_norm_backward(dout, cache)


def rms_norm(x, params=None, *, axis=-1, eps: float = 1e-5) -> np.ndarray:
    """Convenience wrapper: the output of :func:`rms_norm_forward`."""
    return rms_norm_forward(x, params, axis=axis, eps=eps)[0]


# --------------------------------------------------------------------------------------------
# GroupNorm and InstanceNorm: per sample (axis 0) and channel group, over all point axes


def _channel_norm_forward(x, params, num_groups, channel_axis, eps, mask, what, min_ndim):
    x = as_float(x, "x", min_ndim=min_ndim)
    ch = check_int(channel_axis, "channel_axis")
    if not -x.ndim <= ch < x.ndim:
        raise ValueError(f"channel_axis must be in [{-x.ndim}, {x.ndim}) for x of shape {x.shape}; got {channel_axis}")
    ch %= x.ndim
    if ch == 0:
        raise ValueError("channel_axis must not be 0: axis 0 of x is the batch axis")
    C = x.shape[ch]
    if num_groups is None:
        num_groups = C
    G = check_int(num_groups, "num_groups", minimum=1)
    if C % G:
        raise ValueError(f"num_groups ({G}) must divide the number of channels x.shape[{ch}] = {C}")
    eps = check_positive(eps, "eps", allow_zero=True)
    params = _validated_affine(params, ("weight", "bias"), what)
    aff = {}
    for k, v in params.items():
        a = as_float(v, k, ndim=1)
        if a.shape[0] != C:
            raise ValueError(f"{k} must have shape (C,) = ({C},) (per channel); got {a.shape}")
        aff[k] = a
    if mask is not None:
        mask = np.asarray(mask)
        if mask.dtype != np.bool_:
            raise TypeError(f"mask must be a boolean array over points (True = real point); got dtype {mask.dtype}")
        pts = x.shape[:ch] + x.shape[ch + 1:]
        check_broadcastable("mask", mask.shape, pts, "x without its channel axis, of shape")
    dt = compute_dtype(x, *aff.values())
    x = x.astype(dt, copy=False)
    full = tuple(C if i == ch else 1 for i in range(x.ndim))
    aff = {k: v.astype(dt, copy=False).reshape(full) for k, v in aff.items()}
    # Grouped layout (B, *points, G, C/G): statistics over every axis but 0 and the G axis.
    xt = np.moveaxis(x, ch, -1)
    tshape = xt.shape
    xg = xt.reshape(tshape[:-1] + (G, C // G))
    axes = tuple(range(1, xg.ndim - 2)) + (xg.ndim - 1,)
    m = None
    mfull = None
    if mask is not None:
        pts = x.shape[:ch] + x.shape[ch + 1:]
        mb = np.broadcast_to(mask, pts).astype(dt)
        m = mb.reshape(mb.shape + (1, 1))
        mfull = np.expand_dims(mb, ch)
    xhat_g, stats = normalize_forward(xg, axes, eps, center=True, mask=m)
    xhat = np.moveaxis(xhat_g.reshape(tshape), -1, ch)
    y = _affine_forward(xhat, aff, mfull)
    shapes = {k: (C,) for k in aff}
    cache = {"xhat": xhat, "xhat_g": xhat_g, "stats": stats, "aff": aff, "shapes": shapes,
             "ch": ch, "tshape": tshape, "gshape": xg.shape, "mfull": mfull}
    return y, cache


def _channel_norm_backward(dout, cache):
    xhat = cache["xhat"]
    dout = as_dout(dout, xhat.shape, xhat.dtype)
    g, grads = _affine_backward(dout, xhat, cache["aff"], cache["shapes"], cache["mfull"])
    gg = np.moveaxis(g, cache["ch"], -1).reshape(cache["gshape"])
    dxg = normalize_backward(gg, cache["xhat_g"], cache["stats"])
    grads["x"] = np.moveaxis(dxg.reshape(cache["tshape"]), -1, cache["ch"])
    return grads


def group_norm_forward(x, params=None, *, num_groups: int, channel_axis: int = -1, eps: float = 1e-5):
    r"""Group normalisation: per sample, split the ``C`` channels into ``num_groups`` contiguous
    groups and normalise each group over (its channels x every point axis); per-channel affine.

    Parameters
    ----------
    x : array (B, ..., C) or, with ``channel_axis=1``, PyTorch's (B, C, *spatial)
        Axis 0 is the batch axis; every axis other than 0 and ``channel_axis`` is a point axis.
    params : dict or None
        ``{"weight": (C,), "bias": (C,)}`` (PyTorch ``gn.weight``, ``gn.bias`` as-is; ``bias``
        optional) or ``None`` (``affine=False``).
    num_groups : int
        Must divide ``C``. ``num_groups=1`` is LayerNorm over all non-batch axes (PoolFormer's
        ``GroupNorm(1, C)``); ``num_groups=C`` is InstanceNorm with affine.
    channel_axis : int
        Default ``-1`` for refattn's token-major ``(B, N, C)``; ``1`` for ``torch.nn.GroupNorm``.
    eps : float
        PyTorch default ``1e-5``.
    """
    return _channel_norm_forward(x, params, num_groups, channel_axis, eps, None, "group_norm", 2)


def group_norm_backward(dout, cache):
    """Gradient of :func:`group_norm_forward` (the LN VJP per group)."""
    return _channel_norm_backward(dout, cache)


def group_norm(x, params=None, *, num_groups: int, channel_axis: int = -1, eps: float = 1e-5) -> np.ndarray:
    """Convenience wrapper: the output of :func:`group_norm_forward`."""
    return group_norm_forward(x, params, num_groups=num_groups, channel_axis=channel_axis, eps=eps)[0]


def instance_norm_forward(x, params=None, *, channel_axis: int = -1, eps: float = 1e-5, mask=None):
    r"""Instance normalisation: per sample and channel, normalise over every point axis.

    Parameters
    ----------
    x : array (B, N, C) (token-major, default) or (B, C, *spatial) with ``channel_axis=1``
        At least one point axis. **The axis trap** (OFormer#3): PyTorch ``InstanceNorm1d`` on a
        token-major ``(B, N, C)`` tensor treats ``N`` as the channels and normalises each point
        over ``C``; refattn's default normalises each channel over the points, which is what
        OFormer, FactFormer and neuraloperator's ``AttentionKernelIntegral`` intend.
    params : dict or None
        Default ``None`` = no affine (PyTorch ``InstanceNorm*d(affine=False)``); otherwise
        ``{"weight": (C,), "bias": (C,)}``. No running statistics (``track_running_stats=False``).
    channel_axis : int
        As in :func:`group_norm_forward`.
    eps : float
        PyTorch default ``1e-5``.
    mask : bool array broadcastable to ``x`` without its channel axis, optional
        ``True`` = real point. Padded points are excluded from the mean and variance, output 0
        (bias included) and receive gradient 0; a sample with no real point outputs 0.
    """
    return _channel_norm_forward(x, params, None, channel_axis, eps, mask, "instance_norm", 3)


def instance_norm_backward(dout, cache):
    """Gradient of :func:`instance_norm_forward` (the LN VJP with statistics over points)."""
    return _channel_norm_backward(dout, cache)


def instance_norm(x, params=None, *, channel_axis: int = -1, eps: float = 1e-5, mask=None) -> np.ndarray:
    """Convenience wrapper: the output of :func:`instance_norm_forward`."""
    return instance_norm_forward(x, params, channel_axis=channel_axis, eps=eps, mask=mask)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sizes(rng, size):
    if size == "tiny":
        return int(rng.integers(2, 4)), int(rng.integers(3, 6))
    return int(rng.integers(5, 9)), int(rng.integers(6, 10))


def _affine(rng, shape, bias=True):
    p = {"weight": 1.0 + 0.5 * rng.standard_normal(shape)}
    if bias:
        p["bias"] = rng.standard_normal(shape)
    return p


def _sample_ln(rng, size):
    n, c = _sizes(rng, size)
    x = rng.standard_normal((2, n, c)) * 1.5 + 0.7
    return Sample(inputs={"x": x}, params=_affine(rng, (c,)), config={"axis": -1, "eps": 1e-5})


def _sample_rms(rng, size):
    n, c = _sizes(rng, size)
    x = rng.standard_normal((2, n, c)) * 1.5 + 0.3
    return Sample(inputs={"x": x}, params=_affine(rng, (c,), bias=False), config={"axis": -1, "eps": 1e-5})


def _sample_gn(rng, size):
    n, _ = _sizes(rng, size)
    g = int(rng.integers(1, 3))
    c = g * (2 if size == "tiny" else 3)
    x = rng.standard_normal((2, n, c)) * 1.5 + 0.5
    return Sample(inputs={"x": x}, params=_affine(rng, (c,)),
                  config={"num_groups": g, "channel_axis": -1, "eps": 1e-5})


def _sample_in(rng, size):
    n, c = _sizes(rng, size)
    n += 1
    x = rng.standard_normal((2, n, c)) * 1.5 - 0.4
    mask = np.ones((2, n), bool)
    mask[1, n - 1] = False  # one padded point in the second sample
    return Sample(inputs={"x": x}, params=_affine(rng, (c,)),
                  config={"channel_axis": -1, "eps": 1e-5, "mask": mask})


def _ln_reference(x, params=None, axis=-1, eps=1e-5):
    mu = x.mean(axis=axis, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=axis, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * params["weight"] + params["bias"]


def _rms_reference(x, params=None, axis=-1, eps=1e-5):
    return x / np.sqrt((x**2).mean(axis=axis, keepdims=True) + eps) * params["weight"]


def _gn_reference(x, params=None, num_groups=1, channel_axis=-1, eps=1e-5):
    # Explicit loops over samples and groups with the channel axis last.
    xt = np.moveaxis(x, channel_axis, -1)
    C = xt.shape[-1]
    cg = C // num_groups
    out = np.empty_like(xt)
    for b in range(xt.shape[0]):
        for gi in range(num_groups):
            blk = xt[b, ..., gi * cg:(gi + 1) * cg]
            out[b, ..., gi * cg:(gi + 1) * cg] = (blk - blk.mean()) / np.sqrt(blk.var() + eps)
    out = out * params["weight"] + params["bias"]
    return np.moveaxis(out, -1, channel_axis)


def _in_reference(x, params=None, channel_axis=-1, eps=1e-5, mask=None):
    # Explicit per (sample, channel) statistics over the real points only; padded rows are 0.
    xt = np.moveaxis(x, channel_axis, -1)
    out = np.zeros_like(xt)
    for b in range(xt.shape[0]):
        keep = np.ones(xt.shape[1:-1], bool) if mask is None else np.broadcast_to(mask, xt.shape[:-1])[b]
        for c in range(xt.shape[-1]):
            v = xt[b, ..., c][keep]
            out[b, ..., c][keep] = ((v - v.mean()) / np.sqrt(v.var() + eps)) * params["weight"][c] + params["bias"][c]
    return np.moveaxis(out, -1, channel_axis)


def _check_ln_moments(rng):
    x = rng.standard_normal((3, 4, 16)) * 3 + 100.0
    y = layer_norm(x, eps=0.0)
    err = max(float(np.abs(y.mean(-1)).max()), float(np.abs(y.var(-1) - 1).max()))
    assert err < 1e-10, f"LN rows are not mean 0 / variance 1 (err {err})"
    return err


def _check_ln_invariance(rng):
    x = rng.standard_normal((2, 3, 8))
    shift = rng.standard_normal((2, 3, 1)) * 5
    scale = np.exp(rng.standard_normal((2, 3, 1)))
    a = layer_norm(x, eps=0.0)
    b = layer_norm(x * scale + shift, eps=0.0)
    err = float(np.abs(a - b).max())
    assert err < 1e-12, f"LN is not invariant to per-row shift and positive scale (err {err})"
    return err


def _check_two_pass(rng):
    # A large common offset destroys the one-pass variance E[x^2]-E[x]^2 but not the two-pass one.
    x = rng.standard_normal((2, 32))
    a = layer_norm(x, eps=1e-5)
    b = layer_norm(x + 1e8, eps=1e-5)
    err = float(np.abs(a - b).max())
    assert err < 1e-6, f"LN loses precision under a 1e8 offset (err {err})"
    return err


def _check_rms_sign(rng):
    x = rng.standard_normal((2, 3, 7))
    errs = []
    for c in (-3.5, 0.25, 7.0):
        errs.append(float(np.abs(rms_norm(c * x, eps=0.0) - np.sign(c) * rms_norm(x, eps=0.0)).max()))
    err = max(errs)
    assert err < 1e-13, f"RMSNorm(c x) != sign(c) RMSNorm(x) at eps=0 (err {err})"
    return err


def _check_gn_g1_is_ln(rng):
    x = rng.standard_normal((2, 3, 4, 6))
    a = group_norm(x, num_groups=1)
    b = layer_norm(x, axis=(1, 2, 3))
    err = float(np.abs(a - b).max())
    assert err < 1e-13, f"GroupNorm(1, C) != LN over all non-batch axes (err {err})"
    return err


def _check_gn_gc_is_in(rng):
    x = rng.standard_normal((2, 5, 3, 4))
    p = _affine(rng, (5,))
    a = group_norm(x, p, num_groups=5, channel_axis=1)
    b = instance_norm(x, p, channel_axis=1)
    err = float(np.abs(a - b).max())
    assert err < 1e-13, f"GroupNorm(C, C) != InstanceNorm with affine (err {err})"
    return err


def _check_in_mask_ignores_padding(rng):
    x = rng.standard_normal((2, 6, 3))
    mask = np.ones((2, 6), bool)
    mask[0, 4:] = False
    y, cache = instance_norm_forward(x, channel_axis=-1, mask=mask)
    y_real = instance_norm(x[:1, :4])
    err = float(np.abs(y[0, :4] - y_real[0]).max())
    x2 = x.copy()
    x2[0, 4:] = 1e6  # padded values must not matter
    err = max(err, float(np.abs(instance_norm(x2, mask=mask) - y).max()))
    assert err < 1e-12, f"masked instance norm depends on padded points (err {err})"
    dx = instance_norm_backward(rng.standard_normal(y.shape), cache)["x"]
    assert np.all(y[0, 4:] == 0) and np.all(dx[0, 4:] == 0), "padded points must output 0 with 0 gradient"
    return err


def _check_in_all_padded(rng):
    x = rng.standard_normal((2, 4, 3))
    mask = np.ones((2, 4), bool)
    mask[1] = False
    y, cache = instance_norm_forward(x, {"weight": np.ones(3), "bias": np.ones(3)}, mask=mask)
    g = instance_norm_backward(np.ones_like(y), cache)
    assert np.all(y[1] == 0) and np.all(g["x"][1] == 0), "an all-padded sample must output 0 with 0 gradient"
    assert all(np.isfinite(v).all() for v in g.values())
    return 0.0


register(
    Mechanism(
        slug="layer_norm", family="5-building-blocks", tier="T1", title="Layer normalisation",
        paper="Ba, Kiros, Hinton, Layer Normalization, arXiv 1607.06450 (2016)",
        forward=layer_norm_forward, backward=layer_norm_backward, sample=_sample_ln,
        reference=_ln_reference, docs="building-blocks.md#layer_norm",
        checks={"moments": _check_ln_moments, "shift_scale_invariance": _check_ln_invariance,
                "two_pass_variance": _check_two_pass},
    ),
    Mechanism(
        slug="rms_norm", family="5-building-blocks", tier="T1",
        title='RMS normalisation (incl. DIFF per-head "sub-LN")',
        paper="Zhang, Sennrich, Root Mean Square Layer Normalization, NeurIPS 2019, arXiv 1910.07467",
        forward=rms_norm_forward, backward=rms_norm_backward, sample=_sample_rms,
        reference=_rms_reference, docs="building-blocks.md#rms_norm",
        checks={"sign_equivariance": _check_rms_sign},
    ),
    Mechanism(
        slug="group_norm", family="5-building-blocks", tier="T1", title="Group normalisation",
        paper="Wu, He, Group Normalization, ECCV 2018, arXiv 1803.08494",
        forward=group_norm_forward, backward=group_norm_backward, sample=_sample_gn,
        reference=_gn_reference, docs="building-blocks.md#group_norm",
        checks={"g1_is_layer_norm": _check_gn_g1_is_ln, "gc_is_instance_norm": _check_gn_gc_is_in},
    ),
    Mechanism(
        slug="instance_norm", family="5-building-blocks", tier="T1",
        title="Instance normalisation (over points per channel; optional point mask)",
        paper="Ulyanov, Vedaldi, Lempitsky, Instance Normalization, arXiv 1607.08022 (2016)",
        forward=instance_norm_forward, backward=instance_norm_backward, sample=_sample_in,
        reference=_in_reference, docs="building-blocks.md#instance_norm",
        checks={"mask_ignores_padding": _check_in_mask_ignores_padding,
                "all_padded_sample": _check_in_all_padded, "gc_is_group_norm": _check_gn_gc_is_in},
    ),
)
