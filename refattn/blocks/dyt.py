r"""Dynamic Tanh (DyT): an element-wise, statistics-free replacement for LayerNorm.

Zhu, Chen, He, LeCun, Liu, "Transformers without Normalization", CVPR 2025, arXiv 2503.10622.
Upstream: jiachenzhu/DyT ``dynamic_tanh.py`` (``DynamicTanh``) @
aab5dde0bc1bdd4410f687dad404c87b31808f90; the LLaMA variant without bias is
``other_tasks/LLaMA/fms_fsdp/models/llama.py`` (``LayerNormParameterized``) at the same commit.

Forward
-------
With a learnable scalar $\alpha$ (``alpha``, shape ``(1,)``, upstream init ``alpha_init_value =
0.5``; the LLaMA runs use 1.0 and separate values for attention/FFN/final norms) and per-channel
$\gamma$ (``weight``, init 1) and $\beta$ (``bias``, init 0):

$$y = \gamma\odot\tanh(\alpha x) + \beta.$$

``channels_last=True`` (token-major ``(..., C)``, upstream's default for every ``nn.LayerNorm``
it replaces) broadcasts $\gamma, \beta$ over the last axis; ``channels_last=False`` (the
``LayerNorm2d`` replacement of ConvNeXt, ``(B, C, H, W)``) over axis 1, for any number of spatial
axes. ``bias`` is optional (absent in the LLaMA variant).

Backward
--------
With $t = \tanh(\alpha x)$ and $g = \partial L/\partial y$:

$$\frac{\partial L}{\partial x} = g\odot\gamma\,\alpha\,(1-t^2),\qquad
\frac{\partial L}{\partial\alpha} = \sum g\odot\gamma\odot x\,(1-t^2),\qquad
\frac{\partial L}{\partial\gamma_c} = \sum_{\ne c} g\odot t,\qquad
\frac{\partial L}{\partial\beta_c} = \sum_{\ne c} g,$$

the sums running over every axis but the channel axis (all axes for $\alpha$).

Agreement with upstream
-----------------------
``DynamicTanh`` run in float64 on CPU (both layouts, alpha 0.5 and random): output and the
gradients of ``x``, ``alpha``, ``weight``, ``bias`` agree to $4.1\times10^{-15}$ relative (max abs
$3.6\times10^{-15}$, on the summed parameter gradients).
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_params, compute_dtype
from ..registry import Mechanism, Sample, register

__all__ = ["dynamic_tanh_forward", "dynamic_tanh_backward", "dynamic_tanh", "DYT_ALPHA_INIT"]

DYT_ALPHA_INIT = 0.5
"""Upstream's ``alpha_init_value`` (``DynamicTanh``); the LLaMA experiments set it per norm."""


def dynamic_tanh_forward(x, params, *, channels_last: bool = True):
    r"""$y = \gamma\odot\tanh(\alpha x) + \beta$ (module docstring).

    Parameters
    ----------
    x : array (..., C) if ``channels_last`` else (B, C, *spatial)
    params : dict
        ``"alpha" (1,)``, ``"weight" (C,)`` and optional ``"bias" (C,)`` (upstream names).
    channels_last : bool
        Channel axis last (True, upstream default) or axis 1 (False, ``LayerNorm2d`` layout).

    Returns
    -------
    y, cache
        ``y`` of the shape of ``x``.
    """
    if not isinstance(channels_last, (bool, np.bool_)):
        raise TypeError(f"channels_last must be a bool; got {type(channels_last).__name__}")
    x = as_float(x, "x", min_ndim=1 if channels_last else 2)
    axis = x.ndim - 1 if channels_last else 1
    c = x.shape[axis]
    p = check_params(params, {"alpha": (1,), "weight": (c,), "bias": (c,)}, optional=("bias",),
                     where="dynamic_tanh")
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    shape = [1] * x.ndim
    shape[axis] = c
    w = p["weight"].reshape(shape)
    t = np.tanh(p["alpha"][0] * x)
    y = t * w
    if "bias" in p:
        y = y + p["bias"].reshape(shape)
    return y, {"x": x, "t": t, "p": p, "w": w, "axis": axis}


def dynamic_tanh_backward(dout, cache):
    r"""Gradients of `dynamic_tanh_forward` for ``x``, ``alpha``, ``weight`` (and ``bias``)."""
    x, t, p, w, axis = cache["x"], cache["t"], cache["p"], cache["w"], cache["axis"]
    g = as_dout(dout, x.shape, x.dtype)
    other = tuple(i for i in range(x.ndim) if i != axis)
    gw = g * w
    sech2 = 1.0 - t * t
    grads = {"x": gw * (p["alpha"][0] * sech2),
             "alpha": np.sum(gw * x * sech2, dtype=x.dtype).reshape(1),
             "weight": np.sum(g * t, axis=other)}
    if "bias" in p:
        grads["bias"] = np.sum(g, axis=other)
    return grads


def dynamic_tanh(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of `dynamic_tanh_forward`."""
    return dynamic_tanh_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size):
    last = bool(rng.random() < 0.5)
    if size == "tiny":
        c = int(rng.integers(2, 4))
        shape = (2, 3, c) if last else (2, c, 2, 2)
    else:
        c = int(rng.integers(4, 8))
        shape = (2, 6, c) if last else (2, c, 3, 4)
    p = {"alpha": np.array([0.5 + 0.3 * rng.random()]), "weight": 1.0 + 0.3 * rng.standard_normal(c),
         "bias": 0.2 * rng.standard_normal(c)}
    return Sample(inputs={"x": 2.0 * rng.standard_normal(shape)}, params=p, config={"channels_last": last})


def _reference(x, params, channels_last=True):
    # The element-wise formula with explicit per-channel broadcasting through einsum.
    t = np.tanh(params["alpha"][0] * x)
    if channels_last:
        return np.einsum("...c,c->...c", t, params["weight"]) + params.get("bias", 0.0)
    y = np.einsum("bc...,c->bc...", t, params["weight"])
    b = params.get("bias")
    return y if b is None else y + b.reshape((1, -1) + (1,) * (x.ndim - 2))


def _check_layouts_agree(rng):
    # channels-first on (B, C, H, W) equals channels-last on the permuted (B, H, W, C).
    x = rng.standard_normal((2, 3, 4, 5))
    p = {"alpha": np.array([0.7]), "weight": rng.standard_normal(3), "bias": rng.standard_normal(3)}
    y1, c1 = dynamic_tanh_forward(x, p, channels_last=False)
    y2, c2 = dynamic_tanh_forward(np.moveaxis(x, 1, -1), p, channels_last=True)
    err = float(np.abs(y1 - np.moveaxis(y2, -1, 1)).max())
    g = rng.standard_normal(y1.shape)
    g1, g2 = dynamic_tanh_backward(g, c1), dynamic_tanh_backward(np.moveaxis(g, 1, -1), c2)
    err = max(err, float(np.abs(g1["x"] - np.moveaxis(g2["x"], -1, 1)).max()),
              *(float(np.abs(g1[k] - g2[k]).max()) for k in ("alpha", "weight", "bias")))
    assert err < 1e-13, f"channels-first and channels-last DyT differ by {err}"
    return err


def _check_small_alpha_is_linear(rng):
    # tanh(a x) = a x + O(a^3): with a tiny alpha DyT is the affine map gamma * alpha * x + beta.
    x = rng.standard_normal((2, 5, 4))
    a = 1e-5
    p = {"alpha": np.array([a]), "weight": rng.standard_normal(4), "bias": rng.standard_normal(4)}
    err = float(np.abs(dynamic_tanh(x, p) - (p["weight"] * a * x + p["bias"])).max())
    assert err < 1e-13, f"small-alpha DyT is not linear: {err}"
    return err


def _check_saturation(rng):
    # Large |x| saturates at gamma * sign(x) + beta with zero input gradient (no overflow).
    x = np.array([[-1e6, -50.0, 50.0, 1e6]])
    p = {"alpha": np.array([1.0]), "weight": np.array([2.0, 2.0, 2.0, 2.0])}
    y, c = dynamic_tanh_forward(x, p)
    g = dynamic_tanh_backward(np.ones_like(y), c)
    assert np.array_equal(y, [[-2.0, -2.0, 2.0, 2.0]]) and np.all(g["x"] == 0.0), (y, g["x"])
    return 0.0


register(
    Mechanism(
        slug="dyt_dynamic_tanh", family="5-building-blocks", tier="T2",
        title="Dynamic Tanh: gamma * tanh(alpha x) + beta, a normalisation-free LayerNorm replacement",
        paper="Zhu, Chen, He, LeCun, Liu, Transformers without Normalization, CVPR 2025, arXiv 2503.10622",
        forward=dynamic_tanh_forward, backward=dynamic_tanh_backward, sample=_sample, reference=_reference,
        docs="blocks/norms-activations-init.md#dynamic-tanh-dyt",
        checks={"layouts_agree": _check_layouts_agree, "small_alpha_is_linear": _check_small_alpha_is_linear,
                "saturation": _check_saturation},
    ),
)
