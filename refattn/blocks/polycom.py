r"""PolyCom activations: PolyReLU and PolyNorm (polynomial composition activations).

Zhuo, Wang, Zeng, Li, Zhou, Ma, "Polynomial Composition Activations: Unleashing the Dynamics of
Large Language Models", ICLR 2025, arXiv 2411.03884. Upstream: BryceZhuo/PolyCom
``dense_model/megatron_patch/model/llama2/transformer.py`` (``polynorm``, ``poly``, ``PolyNorm``,
``PolyReLU``) and ``README.md`` (the stand-alone ``PolyNorm``) @
0ed8ad460f1e54eb1817163a9aecdaf7c3887643. Used as the FFN activation $y = W_2\,\mathrm{Poly}(W_1x)$.

Forward
-------
Both carry ``weight`` $w\in\mathbb R^3$ (init $1/3$) and ``bias`` $b\in\mathbb R^1$ (init 0);
**upstream orders the weights from the highest power down** ($w_0$ multiplies the cube):

$$\mathrm{PolyReLU}(x) = w_0r^3 + w_1r^2 + w_2r + b,\qquad r = \max(x, 0),$$
$$\mathrm{PolyNorm}(x) = w_0N(x^3) + w_1N(x^2) + w_2N(x) + b,\qquad
N(z) = z\,\big(\mathrm{mean}_{\text{last}}(z^2) + \epsilon\big)^{-1/2},$$

$N$ an RMSNorm without gain over the last axis, $\epsilon = 10^{-6}$.

Backward
--------
With $g = \partial L/\partial y$: $db = \sum g$, $dw_i = \sum g\odot(\text{term } i)$. PolyReLU:
$dx = g\odot(3w_0r^2 + 2w_1r + w_2)\,\mathbb 1[x>0]$ (0 at the kink, as PyTorch; samplers keep
$x$ away from 0). PolyNorm: for the power $p$ with $z = x^p$, $\hat z = N(z)$ and
$\rho = (\mathrm{mean}(z^2)+\epsilon)^{-1/2}$, the RMSNorm VJP of `refattn.nn.norms`
$dz = \rho\,(h - \hat z\,\mathrm{mean}(h\odot\hat z))$ with $h = w_i g$, then
$dx \mathrel{+}= dz\odot p\,x^{p-1}$.

Conventions
-----------
``kind`` (``"polynorm"``, the paper's best; ``"polyrelu"``), ``eps`` (``1e-6``, both upstream
files). The MoE model's PolyNorm (``moe_model/olmo/model.py``) first regroups the hidden axis into
per-head blocks before the same ``polynorm``; that reshape is not reproduced. float32: $x^3$ of
large inputs overflows sooner than the input itself (compute in float64 for such ranges).

Agreement with upstream
-----------------------
Upstream's ``polynorm``/``poly`` functions (taken from the file) and the README ``PolyNorm``
module in float64 on CPU: output and the gradients of ``x``, ``weight``, ``bias`` agree to
$1.1\times10^{-15}$ relative (max abs $1.4\times10^{-14}$, on the summed weight gradient) for both
kinds.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_choice, check_params, check_positive, compute_dtype
from ..nn.norms import normalize_backward, normalize_forward
from ..registry import Mechanism, Sample, register

__all__ = ["polycom_forward", "polycom_backward", "polycom", "POLYCOM_KINDS"]

POLYCOM_KINDS = ("polynorm", "polyrelu")


def polycom_forward(x, params, *, kind: str = "polynorm", eps: float = 1e-6):
    r"""PolyNorm (default) or PolyReLU over ``x`` (module docstring).

    Parameters
    ----------
    x : array (..., F)
        PolyNorm normalises each power over the last axis; PolyReLU is element-wise.
    params : dict
        ``"weight" (3,)`` (highest power first, as upstream) and ``"bias" (1,)``.
    kind : {"polynorm", "polyrelu"}
    eps : float
        The RMS epsilon of PolyNorm (unused by PolyReLU).

    Returns
    -------
    y, cache
        ``y`` of the shape of ``x``.
    """
    x = as_float(x, "x", min_ndim=1)
    check_choice(kind, "kind", POLYCOM_KINDS)
    eps = check_positive(eps, "eps", allow_zero=True)
    p = check_params(params, {"weight": (3,), "bias": (1,)}, where="polycom")
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    w = p["weight"]
    base = np.maximum(x, 0.0) if kind == "polyrelu" else x
    powers = (base * base * base, base * base, base)
    if kind == "polyrelu":
        terms, stats = powers, None
    else:
        normed = [normalize_forward(z, (x.ndim - 1,), eps, center=False) for z in powers]
        terms, stats = [t for t, _ in normed], [s for _, s in normed]
    y = w[0] * terms[0] + w[1] * terms[1] + w[2] * terms[2] + p["bias"][0]
    return y, {"x": x, "base": base, "terms": terms, "stats": stats, "w": w, "kind": kind}


def polycom_backward(dout, cache):
    r"""Gradients of `polycom_forward` for ``x``, ``weight`` and ``bias`` (module docstring)."""
    x, base, terms, w = cache["x"], cache["base"], cache["terms"], cache["w"]
    g = as_dout(dout, x.shape, x.dtype)
    dw = np.array([np.sum(g * t, dtype=x.dtype) for t in terms], dtype=x.dtype)
    db = np.sum(g, dtype=x.dtype).reshape(1)
    if cache["kind"] == "polyrelu":
        dx = g * (3.0 * w[0] * base * base + 2.0 * w[1] * base + w[2]) * (x > 0)
    else:
        # d x^p / dx = p x^(p-1): powers 3, 2, 1 in the order of the weights.
        dpow = (3.0 * x * x, 2.0 * x, 1.0)
        dx = sum(normalize_backward(w[i] * g, terms[i], cache["stats"][i]) * dpow[i] for i in range(3))
    return {"x": dx.astype(x.dtype, copy=False), "weight": dw, "bias": db}


def polycom(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of `polycom_forward`."""
    return polycom_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _away_from_zero(rng, shape):
    # |x| >= 0.1 keeps the FD stencil off PolyReLU's kink at 0.
    x = rng.standard_normal(shape)
    return np.sign(x) * (0.1 + np.abs(x))


def _sample(rng, size):
    kind = str(rng.choice(POLYCOM_KINDS))
    shape = (2, 3, int(rng.integers(2, 4))) if size == "tiny" else (2, 5, int(rng.integers(5, 9)))
    p = {"weight": 1.0 / 3.0 + 0.3 * rng.standard_normal(3), "bias": 0.2 * rng.standard_normal(1)}
    return Sample(inputs={"x": _away_from_zero(rng, shape)}, params=p, config={"kind": kind})


def _reference(x, params, kind="polynorm", eps=1e-6):
    # The upstream expressions written out: N(z) = z / sqrt(mean(z^2) + eps).
    w, b = params["weight"], params["bias"][0]
    if kind == "polyrelu":
        r = np.maximum(x, 0.0)
        return w[0] * r**3 + w[1] * r**2 + w[2] * r + b

    def n(z):
        return z / np.sqrt(np.mean(z**2, axis=-1, keepdims=True) + eps)

    return w[0] * n(x**3) + w[1] * n(x**2) + w[2] * n(x) + b


def _check_linear_term_is_rmsnorm(rng):
    # weight = (0, 0, 1), bias = 0: PolyNorm is the gain-free RMSNorm of x.
    from ..nn.norms import rms_norm

    x = rng.standard_normal((2, 4, 6))
    p = {"weight": np.array([0.0, 0.0, 1.0]), "bias": np.zeros(1)}
    err = float(np.abs(polycom(x, p) - rms_norm(x, None, eps=1e-6)).max())
    assert err < 1e-14, f"PolyNorm with w = (0, 0, 1) is not RMSNorm: {err}"
    return err


def _check_polyrelu_negative_half(rng):
    # PolyReLU is the constant bias with zero input gradient for x < 0.
    x = -0.1 - np.abs(rng.standard_normal((2, 3, 4)))
    p = {"weight": rng.standard_normal(3), "bias": np.array([0.7])}
    y, cache = polycom_forward(x, p, kind="polyrelu")
    g = polycom_backward(np.ones_like(y), cache)
    err = max(float(np.abs(y - 0.7).max()), float(np.abs(g["x"]).max()))
    assert err == 0.0, f"PolyReLU on x < 0: {err}"
    return err


def _check_scale_invariance(rng):
    # Each N(x^p) is invariant to x -> s x (s > 0) up to eps: PolyNorm(sx) ~= PolyNorm(x).
    x = rng.standard_normal((2, 3, 5))
    p = {"weight": rng.standard_normal(3), "bias": rng.standard_normal(1)}
    err = float(np.abs(polycom(3.0 * x, p, eps=0.0) - polycom(x, p, eps=0.0)).max())
    assert err < 1e-12, f"PolyNorm (eps = 0) is not scale invariant: {err}"
    return err


register(
    Mechanism(
        slug="polynorm_polycom", family="5-building-blocks", tier="T2",
        title="PolyCom activations: PolyNorm (RMS-normalised powers) and PolyReLU",
        paper="Zhuo, Wang, Zeng, Li, Zhou, Ma, Polynomial Composition Activations: Unleashing the Dynamics "
              "of Large Language Models, ICLR 2025, arXiv 2411.03884",
        forward=polycom_forward, backward=polycom_backward, sample=_sample, reference=_reference,
        docs="blocks/norms-activations-init.md#polycom-polynorm-and-polyrelu",
        checks={"linear_term_is_rmsnorm": _check_linear_term_is_rmsnorm,
                "polyrelu_negative_half": _check_polyrelu_negative_half,
                "scale_invariance": _check_scale_invariance},
    ),
)
