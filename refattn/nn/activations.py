r"""Pointwise activations with hand-derived derivatives: GELU, SiLU, sigmoid, ELU+1, SwiGLU, ReLU.

Each activation comes in two forms:

* plain helpers ``f(x)`` and ``f_grad(x)`` (the elementwise derivative $f'(x)$), unvalidated, for
  use inside other mechanisms' forward/backward after they have validated their own inputs;
* a validated pair ``f_forward(x) -> (y, cache)`` / ``f_backward(dout, cache) -> {"x": dx}``
  with $dx = dout\odot f'(x)$, plus a registry record.

Derivatives
-----------
* sigmoid: $\sigma(x) = 1/(1+e^{-x})$, $\sigma' = \sigma(1-\sigma)$ (evaluated with
  ``scipy.special.expit``, which never overflows).
* SiLU (swish-1): $x\sigma(x)$, derivative $\sigma(x)\,(1 + x(1-\sigma(x)))$.
* GELU exact (PyTorch ``approximate="none"``): $x\Phi(x)$ with
  $\Phi(x) = \tfrac12(1+\operatorname{erf}(x/\sqrt2))$; derivative $\Phi(x) + x\varphi(x)$ with
  $\varphi(x) = e^{-x^2/2}/\sqrt{2\pi}$.
* GELU tanh (``approximate="tanh"``, GPT-2/BERT): $\tfrac12x(1+\tanh u)$,
  $u = \sqrt{2/\pi}\,(x + 0.044715x^3)$; derivative
  $\tfrac12(1+\tanh u) + \tfrac12x(1-\tanh^2u)\sqrt{2/\pi}\,(1+3\cdot0.044715x^2)$.
* ELU+1 (Katharopoulos et al. 2020 linear-attention feature map, ``F.elu(x) + 1``, $\alpha=1$):
  $x+1$ for $x>0$, $e^x$ for $x\le0$; derivative $1$ for $x>0$, $e^x$ for $x\le0$ (continuous at
  0, the second derivative jumps: samplers stay away from 0).
* ReLU: $\max(x, 0)$, derivative $1$ for $x>0$ and $0$ otherwise (PyTorch's convention at the
  kink $x = 0$; samplers stay away from 0). Plain helpers only (the FFNs of the building blocks
  use it: fairseq/Macaron, the simplified block's leaky ReLU with slope 0).
* SwiGLU (activation form, Shazeer 2020): the last axis of width $2h$ is split into halves
  $a = x_{[:h]}$, $b = x_{[h:]}$ and $y = \mathrm{SiLU}(a)\odot b$ (width $h$); $da = dy\odot
  b\odot\mathrm{SiLU}'(a)$, $db = dy\odot\mathrm{SiLU}(a)$. The first half is the gated one, as
  in ``a, b = x.chunk(2, -1); F.silu(a) * b``. The FFN ``(SiLU(xW_1) * xW_3) W_2`` is this with
  ``x = concat(xW_1, xW_3)``.
"""

from __future__ import annotations

import numpy as np
from scipy.special import erf, expit

from .._checks import as_dout, as_float, check_choice
from ..registry import Mechanism, Sample, register

__all__ = [
    "sigmoid", "sigmoid_grad", "silu", "silu_grad", "gelu", "gelu_grad", "elu_plus_one",
    "elu_plus_one_grad", "swiglu", "swiglu_vjp", "relu", "relu_grad",
    "sigmoid_forward", "sigmoid_backward", "silu_forward", "silu_backward", "gelu_forward",
    "gelu_backward", "elu_plus_one_forward", "elu_plus_one_backward", "swiglu_forward",
    "swiglu_backward",
]

# Python floats, not NumPy float64 scalars: under NumPy 2 promotion rules a float64 scalar would
# silently upcast float32 arrays.
_SQRT_2_OVER_PI = float(np.sqrt(2.0 / np.pi))
_INV_SQRT_2 = float(1.0 / np.sqrt(2.0))
_INV_SQRT_2PI = float(1.0 / np.sqrt(2.0 * np.pi))
_GELU_C = 0.044715


# --------------------------------------------------------------------------------------------
# Plain helpers (unvalidated; the dtype of x is kept)


def sigmoid(x: np.ndarray) -> np.ndarray:
    r"""$\sigma(x) = 1/(1+e^{-x})$, overflow-free."""
    return expit(x)


def sigmoid_grad(x: np.ndarray) -> np.ndarray:
    r"""$\sigma'(x) = \sigma(x)(1-\sigma(x))$."""
    s = expit(x)
    return s * (1.0 - s)


def silu(x: np.ndarray) -> np.ndarray:
    r"""$\mathrm{SiLU}(x) = x\,\sigma(x)$."""
    return x * expit(x)


def silu_grad(x: np.ndarray) -> np.ndarray:
    r"""$\mathrm{SiLU}'(x) = \sigma(x)(1 + x(1-\sigma(x)))$."""
    s = expit(x)
    return s * (1.0 + x * (1.0 - s))


def gelu(x: np.ndarray, approximate: str = "none") -> np.ndarray:
    r"""GELU, exact $x\Phi(x)$ (``"none"``) or the tanh approximation (``"tanh"``), as PyTorch."""
    if approximate == "tanh":
        u = _SQRT_2_OVER_PI * (x + _GELU_C * x**3)
        return 0.5 * x * (1.0 + np.tanh(u))
    return 0.5 * x * (1.0 + erf(x * _INV_SQRT_2))


def gelu_grad(x: np.ndarray, approximate: str = "none") -> np.ndarray:
    r"""Derivative of :func:`gelu` (see the module docstring)."""
    if approximate == "tanh":
        t = np.tanh(_SQRT_2_OVER_PI * (x + _GELU_C * x**3))
        return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * _SQRT_2_OVER_PI * (1.0 + 3.0 * _GELU_C * x * x)
    return 0.5 * (1.0 + erf(x * _INV_SQRT_2)) + x * _INV_SQRT_2PI * np.exp(-0.5 * x * x)


def elu_plus_one(x: np.ndarray) -> np.ndarray:
    r"""$\mathrm{ELU}(x)+1$: $x+1$ for $x>0$, $e^x$ otherwise (always positive)."""
    return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))


def elu_plus_one_grad(x: np.ndarray) -> np.ndarray:
    r"""Derivative of :func:`elu_plus_one`: 1 for $x>0$, $e^x$ otherwise."""
    return np.where(x > 0, 1.0, np.exp(np.minimum(x, 0.0))).astype(x.dtype, copy=False)


def relu(x: np.ndarray) -> np.ndarray:
    r"""$\max(x, 0)$ (the dtype of ``x`` is kept)."""
    return np.maximum(x, 0.0).astype(x.dtype, copy=False)


def relu_grad(x: np.ndarray) -> np.ndarray:
    r"""Derivative of `relu`: 1 for $x>0$, 0 otherwise (0 at the kink, as PyTorch)."""
    return (x > 0).astype(x.dtype)


def swiglu(x: np.ndarray) -> np.ndarray:
    r"""$\mathrm{SiLU}(a)\odot b$ with ``a, b`` the first and second halves of the last axis."""
    h = x.shape[-1] // 2
    return silu(x[..., :h]) * x[..., h:]


def swiglu_vjp(dy: np.ndarray, x: np.ndarray) -> np.ndarray:
    r"""Gradient of :func:`swiglu` with respect to ``x``: ``concat(dy*b*silu'(a), dy*silu(a))``."""
    h = x.shape[-1] // 2
    a, b = x[..., :h], x[..., h:]
    return np.concatenate([dy * b * silu_grad(a), dy * silu(a)], axis=-1)


# --------------------------------------------------------------------------------------------
# Validated forward/backward pairs


def _pointwise_backward(dout, cache, grad_fn):
    x = cache["x"]
    dout = as_dout(dout, x.shape, x.dtype)
    return {"x": dout * grad_fn(x)}


def sigmoid_forward(x):
    r"""$y = \sigma(x)$ elementwise. Returns ``(y, cache)``."""
    x = as_float(x, "x", min_ndim=1)
    return sigmoid(x), {"x": x}


def sigmoid_backward(dout, cache):
    r"""$dx = dout\odot\sigma(x)(1-\sigma(x))$."""
    return _pointwise_backward(dout, cache, sigmoid_grad)


def silu_forward(x):
    r"""$y = x\sigma(x)$ elementwise (PyTorch ``F.silu``). Returns ``(y, cache)``."""
    x = as_float(x, "x", min_ndim=1)
    return silu(x), {"x": x}


def silu_backward(dout, cache):
    r"""$dx = dout\odot\sigma(x)(1 + x(1-\sigma(x)))$."""
    return _pointwise_backward(dout, cache, silu_grad)


def gelu_forward(x, *, approximate: str = "none"):
    r"""GELU elementwise, as PyTorch ``F.gelu(x, approximate=...)``.

    ``approximate="none"`` (PyTorch default; ViT, most operator-learning code) is the exact
    $x\Phi(x)$; ``"tanh"`` is the GPT-2/BERT approximation
    $\tfrac12x(1+\tanh(\sqrt{2/\pi}(x+0.044715x^3)))$.
    """
    x = as_float(x, "x", min_ndim=1)
    check_choice(approximate, "approximate", ("none", "tanh"))
    return gelu(x, approximate), {"x": x, "approximate": approximate}


def gelu_backward(dout, cache):
    r"""$dx = dout\odot\mathrm{GELU}'(x)$ (see the module docstring for both forms)."""
    return _pointwise_backward(dout, cache, lambda x: gelu_grad(x, cache["approximate"]))


def elu_plus_one_forward(x):
    r"""$y = \mathrm{ELU}(x) + 1$ (Katharopoulos et al. linear-attention feature map, $\alpha=1$)."""
    x = as_float(x, "x", min_ndim=1)
    return elu_plus_one(x), {"x": x}


def elu_plus_one_backward(dout, cache):
    r"""$dx = dout$ where $x>0$, $dout\odot e^x$ elsewhere."""
    return _pointwise_backward(dout, cache, elu_plus_one_grad)


def swiglu_forward(x):
    r"""SwiGLU activation: $y = \mathrm{SiLU}(a)\odot b$, ``a, b = x[..., :h], x[..., h:]``.

    Parameters
    ----------
    x : array (..., 2h)
        The concatenated gate and value pre-activations (the last axis must be even).

    Returns
    -------
    y, cache
        ``y`` of shape ``(..., h)``.
    """
    x = as_float(x, "x", min_ndim=1)
    if x.shape[-1] % 2:
        raise ValueError(f"x's last axis must be even (gate and value halves); got shape {x.shape}")
    return swiglu(x), {"x": x}


def swiglu_backward(dout, cache):
    r"""$dx = [\,dy\odot b\odot\mathrm{SiLU}'(a),\; dy\odot\mathrm{SiLU}(a)\,]$ along the last axis."""
    x = cache["x"]
    dout = as_dout(dout, x.shape[:-1] + (x.shape[-1] // 2,), x.dtype)
    return {"x": swiglu_vjp(dout, x)}


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _shape(rng, size, last=None):
    if size == "tiny":
        n, c = int(rng.integers(2, 4)), int(rng.integers(2, 5))
    else:
        n, c = int(rng.integers(4, 8)), int(rng.integers(5, 9))
    return (2, n, last if last is not None else c)


def _away_from_zero(rng, shape, scale=2.0):
    # Keeps |x| >= 0.05 so the FD stencil (step 1e-6) never straddles elu+1's kink at 0.
    x = rng.standard_normal(shape) * scale
    return np.where(np.abs(x) < 0.05, np.sign(x + 1e-300) * (0.05 + np.abs(x)), x)


def _sample_plain(rng, size):
    return Sample(inputs={"x": rng.standard_normal(_shape(rng, size)) * 2.5})


def _sample_gelu(rng, size):
    approx = "tanh" if rng.random() < 0.5 else "none"
    return Sample(inputs={"x": rng.standard_normal(_shape(rng, size)) * 2.5}, config={"approximate": approx})


def _sample_elu(rng, size):
    return Sample(inputs={"x": _away_from_zero(rng, _shape(rng, size))})


def _sample_swiglu(rng, size):
    h = int(rng.integers(1, 4)) if size == "tiny" else int(rng.integers(3, 7))
    return Sample(inputs={"x": rng.standard_normal(_shape(rng, size, 2 * h)) * 2.0})


def _ref_sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _ref_silu(x):
    return x / (1.0 + np.exp(-x))


def _ref_gelu(x, approximate="none"):
    if approximate == "tanh":
        return 0.5 * x * (1.0 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    from scipy.stats import norm

    return x * norm.cdf(x)


def _ref_elu(x):
    return np.where(x > 0, x, np.expm1(np.minimum(x, 0.0))) + 1.0


def _ref_swiglu(x):
    h = x.shape[-1] // 2
    return _ref_silu(x[..., :h]) * x[..., h:]


def _check_sigmoid_extremes(rng):
    x = np.array([-1e4, -800.0, 0.0, 800.0, 1e4])
    y, c = sigmoid_forward(x)
    dx = sigmoid_backward(np.ones_like(x), c)["x"]
    assert np.all(np.isfinite(y)) and np.all(np.isfinite(dx)), "sigmoid overflows at extreme inputs"
    assert np.array_equal(y, [0.0, 0.0, 0.5, 1.0, 1.0]) and dx[2] == 0.25
    return 0.0


def _check_silu_is_x_sigmoid(rng):
    x = rng.standard_normal(50) * 5
    err = float(np.abs(silu(x) - x * sigmoid(x)).max())
    assert err == 0.0
    err = float(np.abs(silu(x) - _ref_silu(x)).max())
    assert err < 1e-14
    return err


def _check_gelu_tanh_close(rng):
    # The tanh form approximates the exact GELU to ~1e-3 (Hendrycks & Gimpel); not identical.
    x = np.linspace(-6, 6, 241)
    diff = float(np.abs(gelu(x, "tanh") - gelu(x, "none")).max())
    assert 1e-5 < diff < 1e-3, f"tanh GELU vs exact differ by {diff}"
    return diff


def _check_elu_positive(rng):
    x = np.concatenate([rng.standard_normal(20) * 10, [-700.0, 0.0, 700.0]])
    y = elu_plus_one(x)
    assert np.all(y >= 0) and np.all(np.isfinite(y)), "elu+1 must be a non-negative feature map"
    assert elu_plus_one(np.array([0.0]))[0] == 1.0 and elu_plus_one_grad(np.array([0.0]))[0] == 1.0
    return 0.0


def _check_swiglu_halves(rng):
    a, b = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    y = swiglu(np.concatenate([a, b], axis=-1))
    err = float(np.abs(y - silu(a) * b).max())
    assert err == 0.0, "SwiGLU must gate the first half by SiLU and multiply by the second"
    return err


register(
    Mechanism(
        slug="sigmoid", family="5-building-blocks", tier="primitive", title="Logistic sigmoid",
        paper="standard", forward=sigmoid_forward, backward=sigmoid_backward, sample=_sample_plain,
        reference=_ref_sigmoid, docs="building-blocks.md#activations",
        checks={"extremes": _check_sigmoid_extremes},
    ),
    Mechanism(
        slug="silu", family="5-building-blocks", tier="primitive", title="SiLU / swish-1: x sigmoid(x)",
        paper="Elfwing, Uchibe, Doya, Sigmoid-weighted linear units, arXiv 1702.03118 (2017)",
        forward=silu_forward, backward=silu_backward, sample=_sample_plain, reference=_ref_silu,
        docs="building-blocks.md#activations", checks={"x_sigmoid": _check_silu_is_x_sigmoid},
    ),
    Mechanism(
        slug="gelu", family="5-building-blocks", tier="primitive", title="GELU (exact or tanh approximation)",
        paper="Hendrycks, Gimpel, Gaussian Error Linear Units, arXiv 1606.08415 (2016)",
        forward=gelu_forward, backward=gelu_backward, sample=_sample_gelu, reference=_ref_gelu,
        docs="building-blocks.md#activations", checks={"tanh_approximates_exact": _check_gelu_tanh_close},
    ),
    Mechanism(
        slug="elu_plus_one", family="5-building-blocks", tier="primitive",
        title="ELU(x)+1 feature map (linear attention)",
        paper="Katharopoulos, Vyas, Pappas, Fleuret, Transformers are RNNs, ICML 2020, arXiv 2006.16236",
        forward=elu_plus_one_forward, backward=elu_plus_one_backward, sample=_sample_elu,
        reference=_ref_elu, docs="building-blocks.md#activations", checks={"positive": _check_elu_positive},
    ),
    Mechanism(
        slug="swiglu", family="5-building-blocks", tier="primitive",
        title="SwiGLU activation SiLU(a) * b on the two halves of the last axis",
        paper="Shazeer, GLU Variants Improve Transformer, arXiv 2002.05202 (2020)",
        forward=swiglu_forward, backward=swiglu_backward, sample=_sample_swiglu, reference=_ref_swiglu,
        docs="building-blocks.md#activations", checks={"halves": _check_swiglu_halves},
    ),
)
