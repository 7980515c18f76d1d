r"""Discrete-continuous (DISCO) convolutions — the localized integral kernel of the local neural
operator — and the local kernels of ``LocalNOBlocks`` (DISCO + finite-difference) as one layer.

Paper: Liu-Schiaffini, Berner, Bonev, Kurth, Azizzadenesheli, Anandkumar, "Neural Operators with
Localized Integral and Differential Kernels", ICML 2024, arXiv 2402.16845 (DISCO: Ocampo, Price,
McEwen, ICLR 2023, arXiv 2209.13603). Upstream: neuraloperator/neuraloperator
``neuralop/layers/discrete_continuous_convolution.py`` (``_precompute_convolution_filter_matrix``,
``DiscreteContinuousConv2d``, ``EquidistantDiscreteContinuousConv2d``) and ``local_no_block.py``
@ 93d3f0633e048c915004cd782cb339acf06e1157, with the filter basis of NVIDIA/torch-harmonics
``torch_harmonics/filter_basis.py`` (``PiecewiseLinearFilterBasis``) @ v0.7.4 =
41293968f6ccf50471081279d651ca46b70b2a76 (the version neuraloperator pins).

Kernel basis (piecewise linear on a disk of radius $r_c$)
---------------------------------------------------------
``kernel_shape = (n_r, n_\phi)``; $K = \lfloor n_r/2\rfloor n_\phi + (n_r \bmod 2)$ basis functions,
$\Delta r = 2r_c/(n_r+1)$, $\Delta\phi = 2\pi/n_\phi$, $\phi = \operatorname{atan2}(\delta_y,
\delta_x) + \pi$, circular distance $|\cdot|_\circ$. Isotropic ($n_\phi = 1$):
$\psi_l = (1 - |r - r_l|/\Delta r)_+\,[r\le r_c]$ with $r_l = l\Delta r$ (odd $n_r$) or
$(l+\tfrac12)\Delta r$ (even). Anisotropic, odd $n_r$: $\psi_0 = (1 - r/\Delta r)_+$ (a central
hat) and for $l\ge1$ the tensor hat
$(1-|r-r_l|/\Delta r)_+(1-|\phi-\phi_l|_\circ/\Delta\phi)_+$, $r_l = (\lfloor\frac{l-1}{n_\phi}\rfloor+1)
\Delta r$, $\phi_l = ((l-1)\bmod n_\phi)\Delta\phi - \pi$. Anisotropic, even $n_r$:
$r_l = (\lfloor l/n_\phi\rfloor + \tfrac12)\Delta r$, $\phi_l = (l\bmod n_\phi)\Delta\phi-\pi$, the
tensor hat plus its reflection through the centre ($-r$, $\phi-\pi$) for the inner ring.

Filter matrix and convolution
-----------------------------
For input points $y_j$ with quadrature weights $q_j$ and output points $x_i$,
$\Psi_{l,i,j} = \psi_l(y_j - x_i)$, normalised (``normalize=True``) per $(l, i)$ by
$\sum_j\Psi_{l,i,j}q_j + 10^{-9}$ (upstream's $\epsilon$), so that each basis function integrates to
one discretely. The DISCO convolution (unstructured, ``DiscreteContinuousConv2d``) is

$$(\mathcal Ku)_{o}(x_i) = \beta_o + \sum_{c\in g(o)}\sum_l W_{o,c',l}\sum_j\Psi_{l,i,j}\,q_j\,u_c(y_j),$$

a quadrature of $\int\kappa(y - x)u(y)\,dy$ with $\kappa = \sum_l W_l\hat\psi_l$: it converges as the
point cloud is refined. On an equidistant grid (``EquidistantDiscreteContinuousConv2d``, the one
``LocalNOBlocks`` uses) $\Psi$ is computed once on a local lattice of
$p = \lfloor 2r_cn/L\rfloor + 1$ points per axis over $[-r_c, r_c]$ (one output point at 0,
$q = L_hL_w/(n_hn_w)$), its patch is transposed and flipped (upstream's
``get_local_filter_matrix``), contracted with $W$ into a conv kernel, and applied as
``F.conv2d(q x, kernel, bias, stride=n_in/n_out, padding=(p+1)//2 - 1)``.

Backward
--------
Linear in $u$ and $W$. Unstructured: $\bar u_c(y_j) = q_j\sum_{l,i}\Psi_{l,i,j}\sum_{o\in g(c)}
W_{o,c',l}\bar y_o(x_i)$, $\bar W_{o,c',l} = \sum_{b,i}\bar y_{b,o,i}\,Z_{b,c,l,i}$ with
$Z = \Psi(qu)$, $\bar\beta = \sum\bar y$. Equidistant: :func:`refattn.nn.conv.conv_vjp` gives
$\bar u$ (times $q$) and the kernel gradient $G$, then $\bar W_{o,c,l} = \sum_{ab}G_{o,c,a,b}
\tilde\Psi_{l,a,b}$. The basis and the neighbourhoods are fixed (not differentiated), as upstream.

Conventions
-----------
* ``kernel_shape``: an int $k$ means $(k, k)$ as in neuraloperator (anisotropic); LocalNO
  default ``(2, 4)``.
* Weights: ``weight (C_out, C_in/groups, K)``. neuraloperator allocates $(n_r-1)n_\phi+1$ entries
  on the last axis while the basis has $K$ functions (they differ for $n_r\ne2$; the extra entries
  never reach the output): load ``weight[..., :K]``.
* ``radius_cutoff`` defaults as upstream: equidistant $\max_i L_i/n^{out}_i$.
* Upstream sets a circular ``padding_mode`` for ``periodic=True`` but never passes it to
  ``conv2d``: the equidistant layer always zero-pads. ``padding_mode="zeros"`` is that default;
  ``"circular"`` is offered as the evidently intended periodic variant (a refattn option).
* Only the piecewise-linear basis is implemented (neuraloperator's default); ``morlet`` and
  ``zernike`` and the transposed DISCO convolutions are not.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_int, check_params, check_positive, compute_dtype
from ..nn.conv import conv_apply, conv_vjp
from ..registry import Mechanism, Sample, register
from .differential_conv import finite_difference_conv_backward, finite_difference_conv_forward

__all__ = ["disco_basis", "disco_filter_matrix", "disco_conv_forward", "disco_conv_backward", "disco_conv",
           "equidistant_disco_kernel", "equidistant_disco_conv_forward", "equidistant_disco_conv_backward",
           "equidistant_disco_conv", "local_no_kernels_forward", "local_no_kernels_backward", "local_no_kernels"]

_NORM_EPS = 1e-9


def _kernel_shape(kernel_shape):
    ks = (kernel_shape, kernel_shape) if isinstance(kernel_shape, (int, np.integer)) else tuple(kernel_shape)
    if len(ks) == 1:
        ks = (ks[0], 1)
    if len(ks) != 2:
        raise ValueError(f"kernel_shape must be an int or (n_r, n_phi); got {kernel_shape!r}")
    return tuple(check_int(v, "kernel_shape", minimum=1) for v in ks)


def _circle_dist(a, b):
    d = np.abs(a - b)
    return np.minimum(d, np.abs(2 * np.pi - d))


def disco_basis(kernel_shape, r, phi, radius_cutoff: float) -> np.ndarray:
    r"""Piecewise-linear basis values ``(K, *r.shape)`` at polar offsets ``r >= 0``,
    ``phi`` in $[0, 2\pi]$ (torch-harmonics ``PiecewiseLinearFilterBasis``; module docstring)."""
    nr, nphi = _kernel_shape(kernel_shape)
    size = (nr // 2) * nphi + nr % 2
    dr = 2.0 * radius_cutoff / (nr + 1)
    lidx = np.arange(size).reshape((-1,) + (1,) * np.ndim(r))
    r, phi = np.asarray(r)[None], np.asarray(phi)[None]
    if nphi == 1:
        ir = (lidx if nr % 2 else lidx + 0.5) * dr
        return np.where((np.abs(r - ir) <= dr) & (r <= radius_cutoff), 1.0 - np.abs(r - ir) / dr, 0.0)
    dphi = 2.0 * np.pi / nphi
    if nr % 2:
        ir = ((lidx - 1) // nphi + 1) * dr
        iphi = ((lidx - 1) % nphi) * dphi - np.pi
        dist_phi = _circle_dist(phi, iphi)
        keep = (np.abs(r - ir) <= dr) & (r <= radius_cutoff) & ((lidx == 0) | (dist_phi <= dphi))
        vals = (1.0 - np.abs(r - ir) / dr) * np.where(lidx > 0, 1.0 - dist_phi / dphi, 1.0)
        return np.where(keep, vals, 0.0)
    ir = (lidx // nphi + 0.5) * dr
    iphi = (lidx % nphi) * dphi - np.pi
    rn, phin = -r, phi - np.pi
    cr = (np.abs(r - ir) <= dr) & (r <= radius_cutoff)
    cp = _circle_dist(phi, iphi) <= dphi
    crn = (np.abs(rn - ir) <= dr) & (rn <= radius_cutoff)
    cpn = _circle_dist(phin, iphi) <= dphi
    vals = cr * (1 - np.abs(r - ir) / dr) * cp * (1 - _circle_dist(phi, iphi) / dphi)
    vals = vals + crn * (1 - np.abs(rn - ir) / dr) * cpn * (1 - _circle_dist(phin, iphi) / dphi)
    return np.where((cr & cp) | (crn & cpn), vals, 0.0)


def disco_filter_matrix(grid_in, grid_out, kernel_shape, quadrature_weights, radius_cutoff: float, *,
                        periodic: bool = False, normalize: bool = True) -> np.ndarray:
    r"""$\Psi_{l,i,j} = \psi_l(y_j - x_i)$, ``(K, n_out, n_in)`` float64, for ``grid_in (n_in, 2)``,
    ``grid_out (n_out, 2)`` and ``quadrature_weights (n_in,)`` (upstream
    ``_precompute_convolution_filter_matrix``, dense). ``periodic`` wraps offsets on the unit torus."""
    grid_in = as_float(grid_in, "grid_in", ndim=2).astype(np.float64)
    grid_out = as_float(grid_out, "grid_out", ndim=2).astype(np.float64)
    q = as_float(quadrature_weights, "quadrature_weights", ndim=1).astype(np.float64)
    if grid_in.shape[1] != 2 or grid_out.shape[1] != 2 or q.shape[0] != grid_in.shape[0]:
        raise ValueError(f"grid_in (n_in, 2), grid_out (n_out, 2) and quadrature_weights (n_in,) expected; got "
                         f"{grid_in.shape}, {grid_out.shape}, {q.shape}")
    rc = check_positive(radius_cutoff, "radius_cutoff")
    d = grid_in[None, :, :] - grid_out[:, None, :]
    if periodic:
        pd = np.where(d > 0.0, d - 1.0, d + 1.0)
        d = np.where(np.abs(d) < np.abs(pd), d, pd)
    psi = disco_basis(kernel_shape, np.hypot(d[..., 0], d[..., 1]), np.arctan2(d[..., 1], d[..., 0]) + np.pi, rc)
    if normalize:
        psi = psi / (psi @ q + _NORM_EPS)[..., None]
    return psi


def _check_weight(params, c_in, groups, size, where):
    groups = check_int(groups, "groups", minimum=1)
    if c_in % groups:
        raise ValueError(f"groups ({groups}) must divide the input channels ({c_in})")
    if not isinstance(params, dict) or params.get("weight") is None:
        raise ValueError(f"params must be a dict with 'weight' (C_out, C_in/groups={c_in // groups}, K={size}) "
                         f"and optional 'bias' (C_out,)")
    w = as_float(params["weight"], "weight", ndim=3)
    if w.shape[0] % groups:
        raise ValueError(f"weight axis 0 (C_out={w.shape[0]}) must be a multiple of groups={groups}")
    spec = {"weight": (w.shape[0], c_in // groups, size), "bias": (w.shape[0],)}
    return check_params(params, spec, optional=("bias",), where=where), groups


def _group_contract(z, w, groups):
    """$\\sum_{c\\in g(o), l} W_{o,c',l} z_{b,c,l,\\ldots}$ for ``z (B, C_in, K, ...)``."""
    b, cin = z.shape[:2]
    zg = z.reshape((b, groups, cin // groups) + z.shape[2:])
    wg = w.reshape(groups, -1, w.shape[1], w.shape[2])
    out = np.einsum("bgck...,gock->bgo...", zg, wg)
    return out.reshape((b, w.shape[0]) + z.shape[3:])


def disco_conv_forward(x, params, *, psi, quadrature_weights, groups: int = 1):
    r"""DISCO convolution on point clouds (upstream ``DiscreteContinuousConv2d.forward``).

    Parameters
    ----------
    x : array (B, C_in, n_in)
        Input function on the points of ``grid_in``.
    params : dict
        ``weight (C_out, C_in/groups, K)``, optional ``bias (C_out,)``.
    psi : array (K, n_out, n_in)
        Filter matrix from :func:`disco_filter_matrix` (fixed, not differentiated).
    quadrature_weights : array (n_in,)
    groups : int

    Returns
    -------
    out, cache
        ``out (B, C_out, n_out)``.
    """
    x = as_float(x, "x", ndim=3)
    psi = as_float(psi, "psi", ndim=3)
    q = as_float(quadrature_weights, "quadrature_weights", ndim=1)
    if psi.shape[2] != x.shape[2] or q.shape[0] != x.shape[2]:
        raise ValueError(f"psi (K, n_out, n_in) and quadrature_weights (n_in,) must match x's n_in={x.shape[2]}; "
                         f"got psi {psi.shape}, quadrature_weights {q.shape}")
    p, groups = _check_weight(params, x.shape[1], groups, psi.shape[0], "disco_conv")
    dt = compute_dtype(x, *p.values())
    x, p, psi, q = x.astype(dt, copy=False), cast_all(dt, p), psi.astype(dt), q.astype(dt)
    z = np.einsum("lij,bcj->bcli", psi, x * q)
    out = _group_contract(z, p["weight"], groups)
    if "bias" in p:
        out = out + p["bias"][:, None]
    return out, {"z": z, "psi": psi, "q": q, "p": p, "groups": groups, "shape": out.shape, "dt": dt}


def disco_conv_backward(dout, cache):
    """Gradients ``{"x", "weight"[, "bias"]}`` of :func:`disco_conv_forward`."""
    g = as_dout(dout, cache["shape"], cache["dt"])
    w, groups, z = cache["p"]["weight"], cache["groups"], cache["z"]
    b, cin = z.shape[:2]
    gg = g.reshape(b, groups, -1, g.shape[2])
    wg = w.reshape(groups, -1, w.shape[1], w.shape[2])
    dz = np.einsum("bgoi,gock->bgcki", gg, wg).reshape(z.shape)
    zg = z.reshape(b, groups, cin // groups, z.shape[2], z.shape[3])
    grads = {"x": np.einsum("lij,bcli->bcj", cache["psi"], dz) * cache["q"],
             "weight": np.einsum("bgoi,bgcki->gock", gg, zg).reshape(w.shape)}
    if "bias" in cache["p"]:
        grads["bias"] = g.sum(axis=(0, 2))
    return grads


def disco_conv(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`disco_conv_forward`."""
    return disco_conv_forward(x, params, **config)[0]


def equidistant_disco_kernel(kernel_shape, in_shape, radius_cutoff: float, domain_length=(2.0, 2.0)):
    r"""The fixed part of ``EquidistantDiscreteContinuousConv2d``: the transposed-and-flipped local
    filter ``(K, p_w, p_h)``, the quadrature weight $q$ and the conv padding ``(h, w)``. Fresh
    arrays on every call (the construction is cached)."""
    rc = check_positive(radius_cutoff, "radius_cutoff")
    base, q, pads = _equidistant_kernel(_kernel_shape(kernel_shape), tuple(int(v) for v in in_shape), rc,
                                        tuple(float(v) for v in domain_length))
    return base.copy(), q, pads


@functools.lru_cache(maxsize=32)
def _equidistant_kernel(kernel_shape, in_shape, rc, domain_length):
    ph = math.floor(2 * rc * in_shape[0] / domain_length[0]) + 1
    pw = math.floor(2 * rc * in_shape[1] / domain_length[1]) + 1
    gx, gy = np.meshgrid(np.linspace(-rc, rc, ph), np.linspace(-rc, rc, pw), indexing="ij")
    q = domain_length[0] * domain_length[1] / in_shape[0] / in_shape[1]
    psi = disco_filter_matrix(np.stack([gx.ravel(), gy.ravel()], -1), np.zeros((1, 2)), kernel_shape,
                              np.full(ph * pw, q), rc)
    local = psi[:, 0].reshape(-1, ph, pw)
    return np.ascontiguousarray(local.transpose(0, 2, 1)[:, ::-1, ::-1]), q, ((ph + 1) // 2 - 1, (pw + 1) // 2 - 1)


def _equidistant_config(x, out_shape, kernel_shape, domain_length, radius_cutoff, padding_mode):
    in_shape = x.shape[2:]
    out_shape = tuple(in_shape) if out_shape is None else tuple(check_int(v, "out_shape", minimum=1) for v in out_shape)
    if len(out_shape) != 2 or any(i % o for i, o in zip(in_shape, out_shape)):
        raise ValueError(f"out_shape must be 2 sizes dividing x's spatial shape {tuple(in_shape)}; got {out_shape}")
    if len(domain_length) != 2:
        raise ValueError(f"domain_length must have 2 entries; got {domain_length!r}")
    dl = tuple(check_positive(v, "domain_length") for v in domain_length)
    if radius_cutoff is None:
        radius_cutoff = max(dl[i] / float(out_shape[i]) for i in (0, 1))
    if padding_mode not in ("zeros", "circular"):
        raise ValueError(f"padding_mode must be 'zeros' (upstream behaviour) or 'circular'; got {padding_mode!r}")
    base, q, pads = equidistant_disco_kernel(kernel_shape, in_shape, radius_cutoff, dl)
    stride = tuple(i // o for i, o in zip(in_shape, out_shape))
    return base, q, pads, stride


def equidistant_disco_conv_forward(x, params, *, kernel_shape=(2, 4), out_shape=None, domain_length=(2.0, 2.0),
                                   radius_cutoff=None, groups: int = 1, padding_mode: str = "zeros"):
    r"""DISCO convolution on an equidistant 2-D grid (upstream ``EquidistantDiscreteContinuousConv2d``).

    Parameters
    ----------
    x : array (B, C_in, n_h, n_w)
    params : dict
        ``weight (C_out, C_in/groups, K)``, optional ``bias (C_out,)``.
    kernel_shape : int or (n_r, n_phi)
        Basis layout (module docstring); ``LocalNOBlocks`` default ``(2, 4)``.
    out_shape : (int, int), optional
        Output grid, dividing the input grid (the stride); default the input shape.
    domain_length : (float, float)
        Physical extent (upstream default ``[2, 2]``, the square $[-1, 1]^2$).
    radius_cutoff : float, optional
        Kernel radius; default $\max_i L_i/n^{out}_i$ (upstream).
    groups : int
    padding_mode : {"zeros", "circular"}
        ``"zeros"`` is upstream's behaviour for every ``periodic`` setting (module docstring).

    Returns
    -------
    out, cache
        ``out (B, C_out, *out_shape)`` (for odd local lattices; see upstream's padding rule).
    """
    x = as_float(x, "x", ndim=4)
    base, q, pads, stride = _equidistant_config(x, out_shape, kernel_shape, domain_length, radius_cutoff,
                                                padding_mode)
    p, groups = _check_weight(params, x.shape[1], groups, base.shape[0], "equidistant_disco_conv")
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    base = base.astype(dt)
    kernel = np.einsum("kab,ogk->ogab", base, p["weight"])
    if any(s + 2 * pp < k for s, pp, k in zip(x.shape[2:], pads, kernel.shape[2:])):
        raise ValueError(f"the local DISCO stencil {kernel.shape[2:]} is larger than the padded input {x.shape[2:]}: "
                         f"reduce radius_cutoff")
    cfg = {"stride": stride, "padding": pads, "groups": groups, "padding_mode": padding_mode}
    xs = q * x
    y = conv_apply(xs, kernel, p.get("bias"), **cfg)
    return y, {"xs": xs, "q": q, "kernel": kernel, "base": base, "cfg": cfg, "has_bias": "bias" in p,
               "shape": y.shape, "dt": dt}


def equidistant_disco_conv_backward(dout, cache):
    """Gradients ``{"x", "weight"[, "bias"]}`` of :func:`equidistant_disco_conv_forward`."""
    g = as_dout(dout, cache["shape"], cache["dt"])
    gr = conv_vjp(g, cache["xs"], cache["kernel"], has_bias=cache["has_bias"], **cache["cfg"])
    out = {"x": cache["q"] * gr["x"], "weight": np.einsum("ogab,kab->ogk", gr["weight"], cache["base"])}
    if cache["has_bias"]:
        out["bias"] = gr["bias"]
    return out


def equidistant_disco_conv(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`equidistant_disco_conv_forward`."""
    return equidistant_disco_conv_forward(x, params, **config)[0]


_LOCAL_KEYS = ("differential.weight", "local_conv.weight", "local_conv.bias")


def local_no_kernels_forward(x, params, *, grid_width: float, fd_padding: str = "periodic",
                             fd_implementation: str = "subtract_middle", fd_groups: int = 1,
                             disco_kernel_shape=(2, 4), domain_length=(2.0, 2.0), radius_cutoff=None,
                             disco_groups: int = 1):
    r"""The local kernels of ``LocalNOBlocks``: $D_hu + \mathcal K_{\text{DISCO}}u$ (stride 1).

    ``LocalNOBlocks`` adds this sum to the FNO spectral convolution (and a linear skip) before its
    nonlinearity; the spectral path is :func:`refattn.operators.fno.fno_spectral_conv_forward`.
    Parameters: ``differential.weight`` (upstream ``differential.{i}.weight``),
    ``local_conv.weight``/``local_conv.bias`` (upstream ``local_convs.{i}``). Keywords are those of
    :func:`refattn.operators.differential_conv.finite_difference_conv_forward` (``fd_*``,
    ``grid_width``) and :func:`equidistant_disco_conv_forward`.
    """
    x = as_float(x, "x", ndim=4)
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict with keys {list(_LOCAL_KEYS)}; got {type(params).__name__}")
    extra = sorted(set(params) - set(_LOCAL_KEYS))
    if extra or params.get("differential.weight") is None or params.get("local_conv.weight") is None:
        raise ValueError(f"params must have keys {list(_LOCAL_KEYS)} (bias optional); got {sorted(params)}")
    try:
        yd, cd = finite_difference_conv_forward(x, {"weight": params["differential.weight"]}, grid_width=grid_width,
                                                padding=fd_padding, groups=fd_groups, implementation=fd_implementation)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{exc} (differential kernel: params key 'differential.weight')") from None
    pk = {"weight": params["local_conv.weight"], "bias": params.get("local_conv.bias")}
    try:
        yk, ck = equidistant_disco_conv_forward(x, pk, kernel_shape=disco_kernel_shape, domain_length=domain_length,
                                                radius_cutoff=radius_cutoff, groups=disco_groups)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{exc} (DISCO kernel: params keys 'local_conv.weight', 'local_conv.bias')") from None
    if yd.shape != yk.shape:
        raise ValueError(f"the differential ({yd.shape}) and DISCO ({yk.shape}) outputs differ in shape: the "
                         f"DISCO local lattice must be odd (adjust radius_cutoff)")
    return yd + yk, {"cd": cd, "ck": ck, "shape": yd.shape, "dt": np.result_type(yd, yk)}


def local_no_kernels_backward(dout, cache):
    """Gradients ``{"x", "differential.weight", "local_conv.weight"[, "local_conv.bias"]}``."""
    g = as_dout(dout, cache["shape"], cache["dt"])
    gd = finite_difference_conv_backward(g, cache["cd"])
    gk = equidistant_disco_conv_backward(g, cache["ck"])
    out = {"x": gd["x"] + gk["x"], "differential.weight": gd["weight"], "local_conv.weight": gk["weight"]}
    if "bias" in gk:
        out["local_conv.bias"] = gk["bias"]
    return out


def local_no_kernels(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`local_no_kernels_forward`."""
    return local_no_kernels_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size):
    if size == "tiny":
        n, cin, cout, ks = 6, 1, 2, (2, 4)
    else:
        n, cin, cout = 10, 3, 2
        ks = ((2, 4), (3, 3), (3, 1))[int(rng.integers(0, 3))]
    k = disco_basis(ks, np.zeros(1), np.zeros(1), 1.0).shape[0]
    params = {"differential.weight": rng.standard_normal((cout, cin, 3, 3)),
              "local_conv.weight": rng.standard_normal((cout, cin, k)), "local_conv.bias": rng.standard_normal(cout)}
    # radius 2 cells of the [-1, 1]^2 grid: an odd local lattice of 5 points per axis
    return Sample(inputs={"x": rng.standard_normal((2, cin, n, n))}, params=params,
                  config={"grid_width": 2.0 / n, "disco_kernel_shape": ks, "radius_cutoff": 4.0 / n})


def _reference(x, params, *, grid_width, fd_padding="periodic", fd_implementation="subtract_middle", fd_groups=1,
               disco_kernel_shape=(2, 4), domain_length=(2.0, 2.0), radius_cutoff=None, disco_groups=1):
    # Both kernels written as explicit sums over stencil offsets: the finite difference with
    # np.roll (periodic), DISCO by evaluating the basis at every lattice offset directly.
    n = x.shape[2]
    h = domain_length[0] / n
    fd, w = np.zeros((x.shape[0], params["differential.weight"].shape[0], n, n)), params["differential.weight"]
    for a in range(3):
        for b in range(3):
            shifted = np.roll(x, (1 - a, 1 - b), axis=(2, 3))
            fd += np.einsum("oc,bcij->boij", w[:, :, a, b], shifted - x)
    fd /= grid_width
    half = int(math.floor(2 * radius_cutoff * n / domain_length[0]) // 2)
    out = fd + params["local_conv.bias"][:, None, None]
    offs = np.arange(-half, half + 1)
    dx, dy = np.meshgrid(offs * h, offs * h, indexing="ij")
    vals = disco_basis(disco_kernel_shape, np.hypot(dx, dy), np.arctan2(dy, dx) + np.pi, radius_cutoff)
    vals = vals / (vals.sum(axis=(1, 2), keepdims=True) * h * h + _NORM_EPS)
    xp = np.pad(x, [(0, 0), (0, 0), (half, half), (half, half)])
    for a, oa in enumerate(offs):
        for b, ob in enumerate(offs):
            # the transposed-and-flipped patch: offset (oa, ob) reads the basis at (-ob, -oa)
            coef = np.einsum("ock,k->oc", params["local_conv.weight"], vals[:, 2 * half - b, 2 * half - a])
            out = out + h * h * np.einsum("oc,bcij->boij", coef, xp[:, :, half + oa:half + oa + n, half + ob:half + ob + n])
    return out


def _check_filter_normalised(rng):
    # Every basis function integrates to one discretely at every output point (exactly v/(v+eps)
    # with upstream's eps = 1e-9), on a random point cloud and on the periodic torus; the basis
    # isotropic hats (centres 0, dr, 2dr with dr = r_c/3 for n_r = 5) sum to one on [0, 2dr].
    pts = rng.uniform(0, 1, (300, 2))
    q = rng.uniform(0.5, 1.5, 300) / 300
    worst = 0.0
    for ks, periodic in (((3, 3), False), ((2, 4), True), ((4, 1), False)):
        raw = disco_filter_matrix(pts, pts[:20], ks, q, 0.2, periodic=periodic, normalize=False)
        v = raw @ q
        sums = disco_filter_matrix(pts, pts[:20], ks, q, 0.2, periodic=periodic) @ q
        worst = max(worst, float(np.abs(sums - v / (v + _NORM_EPS)).max()))
    r = np.linspace(0, 0.4, 41)
    pou = disco_basis((5, 1), r, np.zeros_like(r), 0.6).sum(axis=0)
    worst = max(worst, float(np.abs(pou - 1).max()))
    assert worst < 1e-12, f"DISCO basis normalisation / partition of unity off by {worst:.2e}"
    return worst


def _check_equidistant_is_unstructured(rng):
    # Away from the boundary the conv-based equidistant layer equals the unstructured DISCO on the
    # lattice, with the lattice's first axis read as the y coordinate and the offset taken as
    # x - y (upstream's transposed, flipped patch), the normalisation done on the full patch.
    n, rc, ks = 16, 0.375, (3, 4)
    x = rng.standard_normal((2, 2, n, n))
    w = rng.standard_normal((3, 2, disco_basis(ks, np.zeros(1), np.zeros(1), 1.0).shape[0]))
    yq = equidistant_disco_conv(x, {"weight": w}, kernel_shape=ks, radius_cutoff=rc)
    t = -1 + 2 * np.arange(n) / n
    A, B = np.meshgrid(t, t, indexing="ij")
    pts = np.stack([B.ravel(), A.ravel()], -1)                         # (x, y) = (axis 1, axis 0)
    psi = disco_filter_matrix(-pts, -pts, ks, np.full(n * n, 4.0 / n ** 2), rc)
    yu = disco_conv(x.reshape(2, 2, -1), {"weight": w}, psi=psi, quadrature_weights=np.full(n * n, 4.0 / n ** 2))
    inner = slice(4, n - 4)
    err = float(np.abs(yu.reshape(2, 3, n, n)[:, :, inner, inner] - yq[:, :, inner, inner]).max())
    assert err < 1e-12, f"equidistant and unstructured DISCO differ in the interior by {err:.2e}"
    return err


def _check_disco_converges(rng):
    # Discretisation convergence: the same smooth u on nested grids of n, 2n, 4n points over
    # [-1, 1)^2 with a fixed radius; the coarse-point outputs approach each other at second order
    # (the gap falls by ~4 per refinement; asserted > 3).
    w = rng.standard_normal((1, 1, 4))
    outs = []
    for n in (16, 32, 64):
        t = -1 + 2 * np.arange(n) / n
        X, Y = np.meshgrid(t, t, indexing="ij")
        u = (np.exp(-2 * (X ** 2 + Y ** 2)) * np.cos(2 * X + Y))[None, None]
        outs.append(equidistant_disco_conv(u, {"weight": w}, radius_cutoff=0.5)[0, 0, ::n // 16, ::n // 16])
    inner = slice(4, 12)
    g1 = float(np.abs(outs[0] - outs[1])[inner, inner].max())
    g2 = float(np.abs(outs[1] - outs[2])[inner, inner].max())
    assert g1 / g2 > 3.0, f"DISCO outputs do not converge under refinement: gaps {g1:.2e}, {g2:.2e}"
    return g2


register(
    Mechanism(
        slug="local_differential_disco_kernels", family="3-operator", tier="T2",
        title="Localized differential (finite-difference) and DISCO integral kernels of the local neural operator",
        paper="Liu-Schiaffini, Berner, Bonev, Kurth, Azizzadenesheli, Anandkumar, Neural Operators with Localized "
              "Integral and Differential Kernels, ICML 2024, arXiv 2402.16845",
        forward=local_no_kernels_forward, backward=local_no_kernels_backward, sample=_sample, reference=_reference,
        docs="operators/convolutional-and-wavelet-operators.md#localized-differential-and-disco-kernels",
        checks={"filter_normalised": _check_filter_normalised,
                "equidistant_is_unstructured": _check_equidistant_is_unstructured,
                "disco_converges_under_refinement": _check_disco_converges},
    ),
)
