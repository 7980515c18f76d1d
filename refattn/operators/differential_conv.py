r"""Finite-difference (localized differential) convolution of the local neural operator.

Paper: Liu-Schiaffini, Berner, Bonev, Kurth, Azizzadenesheli, Anandkumar, "Neural Operators with
Localized Integral and Differential Kernels", ICML 2024, arXiv 2402.16845. Upstream:
neuraloperator/neuraloperator ``neuralop/layers/differential_conv.py``
(``FiniteDifferenceConvolution``) @ 93d3f0633e048c915004cd782cb339acf06e1157 (``"subtract_middle"``);
the ``"subtract_all"`` form is the one of the first version of that file, @ 6bfe3585.
The DISCO integral kernel that the paper adds beside it is :mod:`refattn.operators.disco_conv`.

Forward
-------
For ``x (B, C_in, *spatial)``, an odd stencil ``weight (C_out, C_in/groups, *k)`` (PyTorch's
``Conv{n}d`` layout) and the grid width $h$:

$$\text{subtract\_middle:}\quad Du = \tfrac1h\big(K\star u - u\,\textstyle\sum_jK_j\big),\qquad
\text{subtract\_all:}\quad Du = \tfrac1h\,(K - \bar K)\star u,$$

with $\star$ the ``padding="same"`` cross-correlation of ``F.conv`` (the padding mode as
configured) and $\bar K$ the mean over the stencil. Both are a convolution with a *zero-sum*
effective stencil, $K^{\text{eff}} = P(K)$: $P_{\text{mid}}(K) = K - (\sum_jK_j)\,\delta_{\text{centre}}$
and $P_{\text{all}}(K) = K - \bar K$. For smooth $u$,
$\frac1h\sum_j K^{\text{eff}}_j u(x + hz_j) = \sum_jK^{\text{eff}}_j\,z_j\cdot\nabla u + O(h)$: the
layer converges to a learned directional derivative as the grid is refined, and it maps constants
to zero. Since the two parameterisations span the same zero-sum stencils,
subtract_all$(K)$ = subtract_middle$(K - \bar K)$ exactly.

Backward
--------
$Du = \frac1h\,\mathrm{conv}(u, P(K))$, so $\bar u = \frac1h\,\mathrm{conv}^*(\bar y)$ and
$\overline{P(K)} = \frac1h\,\mathrm{conv}_W^*(\bar y)$ from :func:`refattn.nn.conv.conv_vjp`
(the transposed convolution, with the padding's adjoint), then $\bar K = P^*(\overline{P(K)})$:
$P_{\text{mid}}^*(G) = G - G_{\text{centre}}$ (broadcast over the stencil) and
$P_{\text{all}}^* = P_{\text{all}}$ (an orthogonal projection).

Conventions
-----------
* ``padding``: ``"periodic"`` (upstream default; PyTorch ``"circular"``), ``"replicate"``,
  ``"reflect"``, ``"zeros"``.
* ``grid_width``: $h$. Inside ``LocalNOBlocks`` upstream passes the *relative* width
  ``1 / (n / default_in_shape[0])`` (1 at the training resolution).
* ``implementation``: ``"subtract_middle"`` (current upstream) or ``"subtract_all"``.
* Parameters: ``weight`` = upstream's ``weight`` (= ``conv.weight``; ``conv_kernel`` in the old
  ``subtract_all`` version), no bias (``bias=False`` upstream).
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, check_choice, check_int, check_params, check_positive, compute_dtype
from ..nn.conv import conv_apply, conv_vjp
from ..registry import Mechanism, Sample, register

__all__ = ["finite_difference_conv_forward", "finite_difference_conv_backward", "finite_difference_conv",
           "zero_sum_stencil", "FD_PADDINGS"]

FD_PADDINGS = {"periodic": "circular", "replicate": "replicate", "reflect": "reflect", "zeros": "zeros"}
_IMPLEMENTATIONS = ("subtract_middle", "subtract_all")


def zero_sum_stencil(weight: np.ndarray, implementation: str = "subtract_middle") -> np.ndarray:
    """The effective stencil $P(K)$ of ``weight (C_out, C_in/g, *k)`` (module docstring). Unvalidated."""
    n = weight.ndim - 2
    axes = tuple(range(2, 2 + n))
    if implementation == "subtract_all":
        return weight - weight.mean(axis=axes, keepdims=True)
    out = weight.copy()
    out[(Ellipsis,) + tuple(k // 2 for k in weight.shape[2:])] -= weight.sum(axis=axes)
    return out


def _zero_sum_stencil_vjp(g: np.ndarray, implementation: str) -> np.ndarray:
    n = g.ndim - 2
    if implementation == "subtract_all":
        return g - g.mean(axis=tuple(range(2, 2 + n)), keepdims=True)
    centre = g[(Ellipsis,) + tuple(k // 2 for k in g.shape[2:])]
    return g - centre.reshape(centre.shape + (1,) * n)


def _validate(x, params, grid_width, padding, groups, implementation):
    x = as_float(x, "x", min_ndim=3)
    n = x.ndim - 2
    check_choice(padding, "padding", tuple(FD_PADDINGS))
    check_choice(implementation, "implementation", _IMPLEMENTATIONS)
    h = check_positive(grid_width, "grid_width")
    groups = check_int(groups, "groups", minimum=1)
    if x.shape[1] % groups:
        raise ValueError(f"groups ({groups}) must divide the input channels x.shape[1] = {x.shape[1]}")
    if not isinstance(params, dict) or "weight" not in params:
        raise ValueError("params must be a dict with key 'weight' of shape (C_out, C_in/groups, *k), k odd")
    w = as_float(params["weight"], "weight", ndim=n + 2)
    if w.shape[1] != x.shape[1] // groups or w.shape[0] % groups or any(k % 2 == 0 for k in w.shape[2:]):
        raise ValueError(f"weight must have shape (C_out (a multiple of groups={groups}), C_in/groups="
                         f"{x.shape[1] // groups}, *k) with odd k for x of shape {x.shape}; got {w.shape}")
    w = check_params(params, {"weight": w.shape})["weight"]
    pads = tuple(k // 2 for k in w.shape[2:])
    for ax, (size, p) in enumerate(zip(x.shape[2:], pads)):
        if padding == "reflect" and p >= size or padding == "periodic" and p > size:
            raise ValueError(f"padding={padding!r} needs the stencil half-width {p} to be smaller than x's "
                             f"spatial axis {ax} (size {size})")
    dt = compute_dtype(x, w)
    return x.astype(dt, copy=False), w.astype(dt, copy=False), h, groups, pads, dt


def finite_difference_conv_forward(x, params, *, grid_width: float, padding: str = "periodic", groups: int = 1,
                                   implementation: str = "subtract_middle"):
    r"""Finite-difference convolution $\frac1h\,\mathrm{conv}(x, P(K))$ (upstream ``FiniteDifferenceConvolution``).

    Parameters
    ----------
    x : array (B, C_in, *spatial)
        Channels first, any number of spatial axes (upstream: 1 to 3).
    params : dict
        ``weight (C_out, C_in/groups, *k)``, odd ``k`` (PyTorch's conv layout, as is).
    grid_width : float
        $h$, the grid spacing the stencil is scaled by.
    padding : {"periodic", "replicate", "reflect", "zeros"}
        Boundary handling (upstream default ``"periodic"``).
    groups : int
        Channel groups (``LocalNOBlocks`` uses ``in_channels`` when ``mix_derivatives=False``).
    implementation : {"subtract_middle", "subtract_all"}
        Zero-sum parameterisation (module docstring); current upstream ``"subtract_middle"``.

    Returns
    -------
    out, cache
        ``out (B, C_out, *spatial)``.
    """
    x, w, h, groups, pads, dt = _validate(x, params, grid_width, padding, groups, implementation)
    k_eff = zero_sum_stencil(w, implementation)
    cfg = {"padding": pads, "groups": groups, "padding_mode": FD_PADDINGS[padding]}
    y = conv_apply(x, k_eff, **cfg) / h
    return y, {"x": x, "k_eff": k_eff, "cfg": cfg, "h": h, "impl": implementation, "shape": y.shape, "dt": dt}


def finite_difference_conv_backward(dout, cache):
    """Gradients ``{"x", "weight"}`` of :func:`finite_difference_conv_forward` (module docstring)."""
    g = as_dout(dout, cache["shape"], cache["dt"]) / cache["h"]
    gr = conv_vjp(g, cache["x"], cache["k_eff"], has_bias=False, **cache["cfg"])
    return {"x": gr["x"], "weight": _zero_sum_stencil_vjp(gr["weight"], cache["impl"])}


def finite_difference_conv(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`finite_difference_conv_forward`."""
    return finite_difference_conv_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size):
    if size == "tiny":
        spatial, cin, cout, k, groups = (5, 4), 2, 2, 3, 1
    else:
        spatial, cin, cout, k, groups = ((9, 8), (13,), (5, 6, 5))[int(rng.integers(0, 3))], 4, 4, 3, 2
    n = len(spatial)
    padding = tuple(FD_PADDINGS)[int(rng.integers(0, 4))] if size == "small" else "periodic"
    impl = _IMPLEMENTATIONS[int(rng.integers(0, 2))]
    return Sample(inputs={"x": rng.standard_normal((2, cin) + spatial)},
                  params={"weight": rng.standard_normal((cout, cin // groups) + (k,) * n)},
                  config={"grid_width": float(rng.uniform(0.2, 1.0)), "padding": padding, "groups": groups,
                          "implementation": impl})


def _reference(x, params, *, grid_width, padding="periodic", groups=1, implementation="subtract_middle"):
    # The upstream recipe literally: conv with the raw stencil minus conv with its 1x1 sum (or
    # the explicitly padded valid conv with the mean-free stencil), via numpy's own np.pad.
    w = params["weight"]
    n = w.ndim - 2
    half = w.shape[2] // 2
    mode = {"periodic": "wrap", "replicate": "edge", "reflect": "reflect", "zeros": "constant"}[padding]
    xp = np.pad(x, [(0, 0), (0, 0)] + [(half, half)] * n, mode=mode)
    axes = tuple(range(2, 2 + n))
    if implementation == "subtract_middle":
        y = conv_apply(xp, w, groups=groups) - conv_apply(x, w.sum(axis=axes, keepdims=True), groups=groups)
    else:
        y = conv_apply(xp, w - w.mean(axis=axes, keepdims=True), groups=groups)
    return y / grid_width


def _check_constants_to_zero(rng):
    # A constant field has zero derivative: zero output for every non-zero padding.
    worst = 0.0
    for impl in _IMPLEMENTATIONS:
        for pad in ("periodic", "replicate", "reflect"):
            x = np.broadcast_to(rng.standard_normal((2, 3, 1, 1)), (2, 3, 6, 7))
            y = finite_difference_conv(x, {"weight": rng.standard_normal((2, 3, 3, 3))}, grid_width=0.1,
                                       padding=pad, implementation=impl)
            worst = max(worst, float(np.abs(y).max()))
    assert worst < 1e-12, f"constant input gives non-zero output {worst:.2e}"
    return worst


def _check_implementations_agree(rng):
    # subtract_all(K) == subtract_middle(K - mean K): both parameterise the zero-sum stencils.
    x = rng.standard_normal((2, 2, 7, 6))
    w = rng.standard_normal((3, 2, 3, 3))
    a = finite_difference_conv(x, {"weight": w}, grid_width=0.3, implementation="subtract_all")
    b = finite_difference_conv(x, {"weight": w - w.mean(axis=(2, 3), keepdims=True)}, grid_width=0.3)
    err = float(np.abs(a - b).max())
    assert err < 1e-13, f"subtract_all and subtract_middle disagree by {err:.2e}"
    return err


def _check_converges_to_derivative(rng):
    # u(x, y) = sin(2 pi x) cos(2 pi y) on periodic grids of n^2 points, h = 1/n: the output tends
    # to sum_j K_j (z_j . grad u) at first order (the gap to the limit halves when h halves).
    w = rng.standard_normal((1, 1, 3, 3))
    z = np.stack(np.meshgrid([-1, 0, 1], [-1, 0, 1], indexing="ij"), -1)        # offsets (3, 3, 2)
    keff = zero_sum_stencil(w)[0, 0]
    gx, gy = np.einsum("ij,ij->", keff, z[..., 0]), np.einsum("ij,ij->", keff, z[..., 1])
    errs = []
    for n in (32, 64, 128):
        t = np.arange(n) / n
        X, Y = np.meshgrid(t, t, indexing="ij")
        u = np.sin(2 * np.pi * X) * np.cos(2 * np.pi * Y)
        ux = 2 * np.pi * np.cos(2 * np.pi * X) * np.cos(2 * np.pi * Y)
        uy = -2 * np.pi * np.sin(2 * np.pi * X) * np.sin(2 * np.pi * Y)
        y = finite_difference_conv(u[None, None], {"weight": w}, grid_width=1.0 / n)[0, 0]
        errs.append(float(np.abs(y - (gx * ux + gy * uy)).max()))
    r1, r2 = errs[0] / errs[1], errs[1] / errs[2]
    assert 1.8 < r1 < 2.2 and 1.8 < r2 < 2.2, f"errors {errs} do not fall at first order"
    return errs[-1]


register(
    Mechanism(
        slug="finite_difference_conv", family="3-operator", tier="primitive",
        title="Finite-difference convolution (zero-sum stencil / h, converging to a directional derivative)",
        paper="Liu-Schiaffini, Berner, Bonev, Kurth, Azizzadenesheli, Anandkumar, Neural Operators with Localized "
              "Integral and Differential Kernels, ICML 2024, arXiv 2402.16845",
        official_code="neuraloperator/neuraloperator",
        forward=finite_difference_conv_forward, backward=finite_difference_conv_backward, sample=_sample,
        reference=_reference, docs="operators/convolutional-and-wavelet-operators.md#localized-differential-and-disco-kernels",
        checks={"constants_to_zero": _check_constants_to_zero, "implementations_agree": _check_implementations_agree,
                "converges_to_derivative": _check_converges_to_derivative},
    ),
)
