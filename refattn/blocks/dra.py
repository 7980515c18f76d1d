r"""Dynamic Range Activator (DRA): a learnable periodic-plus-saturating activation.

Hashemi, Corominas, Giacchetto, "Can Transformers Do Enumerative Geometry?", ICLR 2025,
arXiv 2408.14915. Upstream: Baran-phys/DynamicFormer ``dra/activations.py`` (``DRA``) @
28139baa47dfc8e2703ccd4e39203da69eee2c58 (also published as the ``torch-dra`` package).

Forward
-------
Four learnable scalars $a, b, c, d$ (each of shape ``(1,)``, upstream init $\mathcal N(0, 1)$):

$$\mathrm{DRA}(x) = x + \frac{b}{a}\sin^2(ax) + c\cos(ax) + d\tanh(bx).$$

This is the code's form (a third-party summary writes $a\sin^2(x/b)$; the code wins). Upstream
divides by $a$; here $\sin^2(ax)/a$ is evaluated as $a x^2\,\mathrm{sinc}^2(ax/\pi)$ (NumPy's
normalised sinc), equal for $a\ne0$ and continuous through $a = 0$ (value $0$), where upstream
returns NaN.

Backward
--------
With $u = ax$, $s(a, x) = \sin^2(u)/a$ and $g = \partial L/\partial y$:

$$\partial_x y = 1 + b\sin(2u) - ac\sin(u) + bd\,(1-\tanh^2(bx)),$$
$$\partial_a s = \frac{x\sin 2u}{a} - \frac{\sin^2u}{a^2} = x^2\Big(2\,\mathrm{sinc}\tfrac{2u}{\pi} -
\mathrm{sinc}^2\tfrac{u}{\pi}\Big),$$
$$\partial_a y = b\,\partial_a s - cx\sin u,\quad \partial_b y = s + dx(1-\tanh^2(bx)),\quad
\partial_c y = \cos u,\quad \partial_d y = \tanh(bx);$$

$dx = g\odot\partial_x y$ and each scalar gradient is $\sum g\odot\partial y$. The sinc form of
$\partial_a s$ has no cancellation at small $u$ (it tends to $x^2$).

Agreement with upstream
-----------------------
``torch-dra`` is not on the package index this project uses, so the upstream ``DRA`` module was
run from the repository file in float64 on CPU: output and the gradients of ``x``, ``a``, ``b``,
``c``, ``d`` agree to $3.7\times10^{-15}$ relative (max abs $7.1\times10^{-15}$, on the summed
scalar gradients; three random parameter draws).
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_params, compute_dtype
from ..registry import Mechanism, Sample, register

__all__ = ["dra_forward", "dra_backward", "dra", "DRA_PARAMS"]

DRA_PARAMS = ("a", "b", "c", "d")


def dra_forward(x, params):
    r"""$y = x + \tfrac ba\sin^2(ax) + c\cos(ax) + d\tanh(bx)$ element-wise (module docstring).

    Parameters
    ----------
    x : array (...)
    params : dict
        ``"a"``, ``"b"``, ``"c"``, ``"d"``, each of shape ``(1,)`` (upstream's ``nn.Parameter``).

    Returns
    -------
    y, cache
        ``y`` of the shape of ``x``.
    """
    x = as_float(x, "x", min_ndim=1)
    p = check_params(params, {k: (1,) for k in DRA_PARAMS}, where="dra")
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    a, b, c, d = (p[k][0] for k in DRA_PARAMS)
    u = a * x
    sinc = np.sinc(u / np.pi)
    s = a * x * x * sinc * sinc  # sin^2(ax) / a, continuous at a = 0
    tb = np.tanh(b * x)
    y = x + b * s + c * np.cos(u) + d * tb
    return y, {"x": x, "p": p, "s": s, "tb": tb, "sinc": sinc}


def dra_backward(dout, cache):
    r"""Gradients of `dra_forward` for ``x``, ``a``, ``b``, ``c``, ``d`` (module docstring)."""
    x, p, s, tb, sinc = cache["x"], cache["p"], cache["s"], cache["tb"], cache["sinc"]
    g = as_dout(dout, x.shape, x.dtype)
    a, b, c, d = (p[k][0] for k in DRA_PARAMS)
    u = a * x
    su = np.sin(u)
    sech2 = 1.0 - tb * tb
    ds_da = x * x * (2.0 * np.sinc(2.0 * u / np.pi) - sinc * sinc)
    dx = g * (1.0 + b * np.sin(2.0 * u) - a * c * su + b * d * sech2)

    def total(v):
        return np.sum(g * v, dtype=x.dtype).reshape(1)

    return {"x": dx, "a": total(b * ds_da - c * x * su), "b": total(s + d * x * sech2),
            "c": total(np.cos(u)), "d": total(tb)}


def dra(x, params) -> np.ndarray:
    """Convenience wrapper: the output of `dra_forward`."""
    return dra_forward(x, params)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size):
    shape = (2, 3, int(rng.integers(2, 4))) if size == "tiny" else (2, 6, int(rng.integers(4, 8)))
    # |a| away from 0 so the reference's division is well conditioned; upstream init is N(0, 1).
    p = {k: np.array([rng.choice([-1.0, 1.0]) * (0.4 + rng.random())]) for k in DRA_PARAMS}
    return Sample(inputs={"x": 1.5 * rng.standard_normal(shape)}, params=p)


def _reference(x, params):
    # The upstream expression, dividing by a.
    a, b, c, d = (params[k][0] for k in DRA_PARAMS)
    return x + b * np.sin(a * x) ** 2 / a + c * np.cos(a * x) + d * np.tanh(b * x)


def _check_a_to_zero(rng):
    # At a = 0: sin^2(ax)/a -> 0, so DRA(x) = x + c + d tanh(bx); its a-gradient is the limit
    # b x^2 (d/da of sin^2(ax)/a at 0), matched against a central difference at a = +-1e-4.
    x = rng.standard_normal((2, 5))
    p = {"a": np.array([0.0]), "b": np.array([0.8]), "c": np.array([-0.3]), "d": np.array([0.6])}
    y, cache = dra_forward(x, p)
    err = float(np.abs(y - (x + p["c"][0] + p["d"][0] * np.tanh(0.8 * x))).max())
    g = dra_backward(np.ones_like(y), cache)
    h = 1e-4
    fd = (dra(x, dict(p, a=np.array([h]))).sum() - dra(x, dict(p, a=np.array([-h]))).sum()) / (2 * h)
    err = max(err, abs(float(g["a"][0]) - fd) / max(1.0, abs(fd)))
    assert np.all(np.isfinite(g["x"])) and err < 1e-7, f"DRA at a = 0: {err}"
    return err


def _check_zero_params_identity(rng):
    # b = c = d = 0 reduces DRA to the identity with unit input gradient.
    x = rng.standard_normal((2, 4, 3))
    p = {"a": np.array([1.3]), "b": np.array([0.0]), "c": np.array([0.0]), "d": np.array([0.0])}
    y, cache = dra_forward(x, p)
    g = dra_backward(np.ones_like(y), cache)
    err = max(float(np.abs(y - x).max()), float(np.abs(g["x"] - 1.0).max()))
    assert err < 1e-15, f"DRA with b = c = d = 0 is not the identity: {err}"
    return err


register(
    Mechanism(
        slug="dynamic_range_activator", family="5-building-blocks", tier="T2",
        title="Dynamic Range Activator: x + (b/a) sin^2(ax) + c cos(ax) + d tanh(bx)",
        paper="Hashemi, Corominas, Giacchetto, Can Transformers Do Enumerative Geometry?, ICLR 2025, "
              "arXiv 2408.14915",
        forward=dra_forward, backward=dra_backward, sample=_sample, reference=_reference,
        docs="blocks/norms-activations-init.md#dynamic-range-activator-dra",
        checks={"a_to_zero": _check_a_to_zero, "zero_params_identity": _check_zero_params_identity},
    ),
)
