r"""Helpers shared by the operator-learning modules (no mechanism and no registry record here).

Each helper has a public name because more than one mechanism module uses it; a helper used by
one module only stays private in that module.

* **Initialisers** — :func:`xavier_uniform` (Galerkin/Fourier, OFormer) and
  :func:`orthogonal_init` (Transolver, GALE): PyTorch's ``nn.init`` rules on ``W (in, out)``.
* **Real-FFT adjoints** — :func:`rfftn_adjoint`, :func:`irfftn_adjoint` and their scale
  helpers, the shared core of the FNO (``refattn.operators.fno``) and AFNO/DPOT
  (``refattn.operators.afno``) backwards; derivation below.
* **Physics-Attention slice front** — the temperature softmax over slices, the slice tokens
  and the input projections of Transolver (``refattn.operators.transolver``), reused by
  LinearNO (``refattn.operators.linear_no``, the temperature softmax) and GeoTransolver GALE
  (``refattn.operators.gale``). Their derivation is on the Transolver page (module docstring
  of ``refattn.operators.transolver``).
* **Axial kernels** — validation, $K_x, K_y$ and their gradients for FactFormer
  (``refattn.operators.factformer``) and IFactFormer-m (``refattn.operators.ifactformer``).
* **Implicit Sinkhorn VJP** — :func:`sinkhorn_implicit_vjp`, the gradient of an entropic-OT plan
  at its fixed point, for MoNo's CoTAP (``refattn.operators.mono_cotap``) and AOT-POT's stream
  mixing (``refattn.operators.aot_pot``); the unrolled VJP is
  ``refattn.attention.linear.sinkformer.sinkhorn_log_vjp``.

Real-FFT adjoints (the shared core of the FNO and AFNO backwards)
-----------------------------------------------------------------
Both Fourier layers act on a grid function stored channel-last, ``x (B, n_1[, n_2], C)``; the
FFT runs over the spatial axes and the *last* spatial axis is the halved (``rfft``) axis.

Write $N = \prod_a n_a$ and, for an FFT normalisation ``norm``, the forward scale
$\alpha$ (``"backward"``: 1, ``"ortho"``: $N^{-1/2}$, ``"forward"``: $N^{-1}$) and the inverse
scale $\beta$ (``"backward"``: $N^{-1}$, ``"ortho"``: $N^{-1/2}$, ``"forward"``: 1). A complex
intermediate $Z = A + iB$ carries the gradient $\bar Z = \partial L/\partial A + i\,\partial L/\partial B$,
so that $\delta L = \operatorname{Re}\sum \overline{\bar Z}\,\delta Z$.

*Inverse real FFT.* $y_t = \beta\sum_{k_1,\dots}\,c_{k_d}\operatorname{Re}\big(Y_k e^{i\theta_k\cdot t}\big)$
where $k_d$ runs over the kept half $0..\lfloor n_d/2\rfloor$ of the last axis and
$c = (1, 2, \dots, 2, 1)$ (the last 1 only for even $n_d$: the Nyquist bin has no mirror image).
Differentiating,

$$\bar Y = \beta\, c \odot \operatorname{rfftn}_{\text{unnorm}}(\bar y).$$

The imaginary parts of DC/Nyquist bins along the halved axis are discarded by ``irfft``; the formula
gives them zero gradient automatically (in 1-D; in 2-D they do matter for $k_1 \ne 0$ and the
formula gives them the right non-zero gradient).

*Forward real FFT.* $X_k = \alpha\sum_t x_t e^{-i\theta_k\cdot t}$ for $k_d \le n_d/2$, so
$\delta L = \operatorname{Re}\sum_k \overline{\bar X_k}\,\delta X_k$ gives
$\bar x_t = \alpha\operatorname{Re}\sum_k \bar X_k e^{+i\theta_k\cdot t}$ over the *half* spectrum,
which is an unnormalised ``irfftn`` of $\bar X$ with the mirror weighting undone:

$$\bar x = \alpha N\,\operatorname{irfftn}_{\text{backward}}(\bar X\odot w),\qquad w = 1/c = (1,\tfrac12,\dots,\tfrac12,1).$$

Forgetting $c$ (or $w$) is the classic bug; the ``rfft_adjoints`` check of the
``fno_spectral_conv`` record (``refattn check fno_spectral_conv``) tests both identities
$\langle \mathcal F x, Y\rangle = \langle x, \mathcal F^* Y\rangle$ for every norm and odd/even sizes.
"""

from __future__ import annotations

import math

import numpy as np

from .._checks import as_float, check_int, check_params, check_positive, check_weight_in, compute_dtype
from ..nn.conv import conv_apply, conv_vjp
from ..nn.linear import init_linear_prefixed, linear_prefixed, linear_prefixed_vjp, merge_heads, split_heads
from ..nn.softmax import softmax_lse, softmax_vjp

__all__ = [
    "physics_front_mesh",
    "swap_last",
    "xavier_uniform",
    "orthogonal_init",
    "FFT_NORMS",
    "fft_scales",
    "mirror_count",
    "irfftn_adjoint",
    "rfftn_adjoint",
    "cast_complex",
    "check_tau_clamp",
    "slice_dims",
    "check_head_width",
    "tempered_softmax_forward",
    "tempered_softmax_backward",
    "slice_tokens_forward",
    "slice_tokens_backward",
    "physics_front_forward",
    "physics_front_backward",
    "physics_front_spec",
    "validate_physics_front",
    "physics_front_init",
    "validate_axial_operands",
    "axial_kernels",
    "axial_kernel_grads",
    "sinkhorn_implicit_vjp",
]


def swap_last(t):
    r"""Swap the last two axes (the batched matrix transpose $t^\top$)."""
    return np.swapaxes(t, -1, -2)


# --------------------------------------------------------------------------------------------
# Initialisers


def xavier_uniform(rng, n_in, n_out, gain):
    """``torch.nn.init.xavier_uniform_(gain)`` on a weight, returned as ``(n_in, n_out)``."""
    bound = gain * np.sqrt(6.0 / (n_in + n_out))
    return rng.uniform(-bound, bound, (n_in, n_out))


def orthogonal_init(rng, n_in, n_out):
    """``torch.nn.init.orthogonal_`` on the ``(out, in)`` PyTorch weight, returned as ``(in, out)``."""
    a = rng.standard_normal((max(n_in, n_out), min(n_in, n_out)))
    qm, r = np.linalg.qr(a)
    qm = qm * np.sign(np.diag(r))
    return qm if n_in >= n_out else qm.T


# --------------------------------------------------------------------------------------------
# Real-FFT adjoints (FNO, AFNO/DPOT)

FFT_NORMS = ("backward", "ortho", "forward")
"""The FFT normalisations of ``numpy.fft`` / ``torch.fft``."""


def fft_scales(norm: str, n_total: int) -> tuple[float, float]:
    """(alpha, beta): the scale of the forward and of the inverse transform under ``norm``."""
    if norm == "backward":
        return 1.0, 1.0 / n_total
    if norm == "ortho":
        s = 1.0 / math.sqrt(n_total)
        return s, s
    return 1.0 / n_total, 1.0


def mirror_count(n_last: int, dtype) -> np.ndarray:
    """$c_k$ along the halved axis: 1 for DC (and Nyquist when ``n_last`` is even), else 2."""
    c = np.full(n_last // 2 + 1, 2.0, dtype=dtype)
    c[0] = 1.0
    if n_last % 2 == 0:
        c[-1] = 1.0
    return c


def irfftn_adjoint(g: np.ndarray, axes: tuple[int, ...], norm: str = "backward") -> np.ndarray:
    r"""Gradient w.r.t. the half spectrum $Y$ of $y = \operatorname{irfftn}(Y, s, \text{axes}, \text{norm})$.

    ``g`` is $\partial L/\partial y$ (real, the grid's shape); returns $\bar Y = \beta\,c\odot
    \operatorname{rfftn}_{\text{unnorm}}(g)$ (see the module docstring)."""
    grid = tuple(g.shape[a] for a in axes)
    _, beta = fft_scales(norm, int(np.prod(grid)))
    c = mirror_count(grid[-1], g.real.dtype)
    shape = [1] * g.ndim
    shape[axes[-1]] = c.size
    return beta * c.reshape(shape) * np.fft.rfftn(g, axes=axes, norm="backward")


def rfftn_adjoint(dX: np.ndarray, grid: tuple[int, ...], axes: tuple[int, ...],
                  norm: str = "backward") -> np.ndarray:
    r"""Gradient w.r.t. the real grid function $x$ of $X = \operatorname{rfftn}(x, \text{axes}, \text{norm})$.

    ``dX`` is $\bar X$ on the half spectrum; returns
    $\alpha N\,\operatorname{irfftn}_{\text{backward}}(\bar X\odot w)$, $w = 1/c$."""
    n_total = int(np.prod(grid))
    alpha, _ = fft_scales(norm, n_total)
    w = 1.0 / mirror_count(grid[-1], dX.real.dtype)
    shape = [1] * dX.ndim
    shape[axes[-1]] = w.size
    return (alpha * n_total) * np.fft.irfftn(dX * w.reshape(shape), s=grid, axes=axes, norm="backward")


def cast_complex(z: np.ndarray, dt) -> np.ndarray:
    """``z`` as the complex dtype matching the real compute dtype ``dt`` (complex64 for float32)."""
    return z.astype(np.result_type(dt, np.complex64), copy=False)


# --------------------------------------------------------------------------------------------
# Physics-Attention slice front (Transolver, LinearNO, GALE): temperature softmax over slices,
# slice tokens, input projections. Derivation: module docstring of refattn.operators.transolver.


def check_tau_clamp(tau_clamp):
    """Validate a temperature clamp: ``None`` or a ``(min, max)`` pair of positive numbers."""
    if tau_clamp is None:
        return None
    if not isinstance(tau_clamp, (tuple, list)) or len(tau_clamp) != 2:
        raise ValueError(f"tau_clamp must be None or a (min, max) pair; got {tau_clamp!r}")
    lo = check_positive(tau_clamp[0], "tau_clamp[0]")
    hi = check_positive(tau_clamp[1], "tau_clamp[1]")
    if lo > hi:
        raise ValueError(f"tau_clamp must have min <= max; got {tau_clamp!r}")
    return lo, hi


def slice_dims(params):
    """Infer (D, G) from ``in_project_slice.weight`` before the full validation."""
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of arrays; got {type(params).__name__}")
    w = params.get("in_project_slice.weight")
    if w is None:
        raise ValueError("params is missing 'in_project_slice.weight' (expected shape (dim_head, slice_num))")
    w = as_float(w, "in_project_slice.weight", ndim=2)
    return w.shape


def tempered_softmax_forward(logits, tau, tau_clamp, axis):
    r"""$w = \mathrm{softmax}_{axis}(\ell/\tau_h)$ with per-head temperatures ``tau (H,)``
    (clamped to ``tau_clamp`` when given); ``logits (B, H, ., .)``. Returns ``(w, cache)``."""
    t = tau if tau_clamp is None else np.clip(tau, *tau_clamp)
    tb = t[None, :, None, None]
    w, _ = softmax_lse(logits / tb, axis=axis)
    return w, {"logits": logits, "t": t, "tb": tb, "tau": tau, "clamp": tau_clamp, "axis": axis, "w": w}


def tempered_softmax_backward(dw, c):
    r"""``(dlogits, dtau)`` of :func:`tempered_softmax_forward`: $d\ell = \mathrm{softmax\_vjp}/\tau$,
    $d\tau_h = -\sum d\ell\odot\text{logits}/\tau_h^2$, times $\mathbb 1[\tau_{lo}\le\tau_h\le\tau_{hi}]$
    when clamped (PyTorch's ``clamp`` subgradient)."""
    dl = softmax_vjp(c["w"], dw, axis=c["axis"])
    dlogits = dl / c["tb"]
    dtau = -np.sum(dl * c["logits"], axis=(0, 2, 3)) / c["t"] ** 2
    if c["clamp"] is not None:
        lo, hi = c["clamp"]
        dtau = dtau * ((c["tau"] >= lo) & (c["tau"] <= hi))
    return dlogits, dtau


def slice_tokens_forward(w, f, eps):
    r"""Slice tokens $z_g = \sum_i w_{ig} f_i / (\sum_i w_{ig} + \epsilon)$; ``w (B, H, N, G)``,
    ``f (B, H, N, D)`` -> ``(B, H, G, D)``. Returns ``(tok, cache)``."""
    den = w.sum(axis=2) + eps                  # (B, H, G)
    tok = (swap_last(w) @ f) / den[..., None]  # (B, H, G, D)
    return tok, {"w": w, "f": f, "den": den, "tok": tok}


def slice_tokens_backward(dtok, c):
    r"""``(dw, df)`` of :func:`slice_tokens_forward` (the quotient rule through numerator and mass)."""
    dnum = dtok / c["den"][..., None]
    dden = -np.sum(dtok * c["tok"], axis=-1) / c["den"]
    dw = c["f"] @ swap_last(dnum) + dden[:, :, None, :]
    df = c["w"] @ dnum
    return dw, df


def _front_projection(p, prefix, x, mesh_shape):
    """``in_project_{x,fx}``: a Linear on the points, or on a structured mesh (Transolver's
    ``Physics_Attention_Structured_Mesh_{2D,3D}``) a stride-1 convolution with padding ``k//2``
    over the points reshaped row-major to ``mesh_shape`` (torch conv weight layout)."""
    if mesh_shape is None:
        return linear_prefixed(p, prefix, x)
    b, n, c = x.shape
    w = p[f"{prefix}.weight"]
    xc = np.moveaxis(x.reshape((b,) + tuple(mesh_shape) + (c,)), -1, 1)
    y = conv_apply(xc, w, p[f"{prefix}.bias"], padding=tuple(k // 2 for k in w.shape[2:]))
    return np.moveaxis(y, 1, -1).reshape(b, n, w.shape[0])


def _front_projection_vjp(grads, p, prefix, dy, x, mesh_shape):
    if mesh_shape is None:
        return linear_prefixed_vjp(grads, p, prefix, dy, x)
    b, n, c = x.shape
    w = p[f"{prefix}.weight"]
    xc = np.moveaxis(x.reshape((b,) + tuple(mesh_shape) + (c,)), -1, 1)
    dyc = np.moveaxis(dy.reshape((b,) + tuple(mesh_shape) + (w.shape[0],)), -1, 1)
    g = conv_vjp(dyc, xc, w, padding=tuple(k // 2 for k in w.shape[2:]))
    for k in ("weight", "bias"):
        key = f"{prefix}.{k}"
        grads[key] = grads[key] + g[k] if key in grads else g[k]
    return np.moveaxis(g["x"], 1, -1).reshape(b, n, c)


def physics_front_forward(x, p, n_head, tau_clamp, slice_eps, mesh_shape=None):
    """Projections, slice weights and slice tokens (Transolver steps 1). ``mesh_shape`` (structured
    mesh, ``N = prod(mesh_shape)`` points in row-major order) makes ``in_project_x``/``in_project_fx``
    convolutions (weights ``(H D, C, *k)``, odd ``k``, padding ``k//2``)."""
    xm = split_heads(_front_projection(p, "in_project_x", x, mesh_shape), n_head)
    fm = split_heads(_front_projection(p, "in_project_fx", x, mesh_shape), n_head)
    logits = linear_prefixed(p, "in_project_slice", xm)
    w, sm_c = tempered_softmax_forward(logits, p["temperature"], tau_clamp, -1)
    tok, tok_c = slice_tokens_forward(w, fm, slice_eps)
    return w, tok, {"xm": xm, "fm": fm, "sm": sm_c, "tok": tok_c, "mesh_shape": mesh_shape}


def physics_front_backward(grads, p, x, dw, dtok, c):
    """Gradient of ``x`` through :func:`physics_front_forward` given ``dw`` (the deslice use of the
    slice weights) and ``dtok``; the front's parameter gradients are written into ``grads``."""
    dw2, dfm = slice_tokens_backward(dtok, c["tok"])
    dlogits, dtau = tempered_softmax_backward(dw + dw2, c["sm"])
    grads["temperature"] = dtau
    dxm = linear_prefixed_vjp(grads, p, "in_project_slice", dlogits, c["xm"])
    mesh = c.get("mesh_shape")
    dx = _front_projection_vjp(grads, p, "in_project_x", merge_heads(dxm), x, mesh)
    dx = dx + _front_projection_vjp(grads, p, "in_project_fx", merge_heads(dfm), x, mesh)
    return dx


def physics_front_spec(c, n_head, d, g):
    """Parameter shapes of the slice front (``in_project_x``, ``in_project_fx``, ``in_project_slice``,
    ``temperature``)."""
    return {"in_project_x.weight": (c, n_head * d), "in_project_x.bias": (n_head * d,),
            "in_project_fx.weight": (c, n_head * d), "in_project_fx.bias": (n_head * d,),
            "in_project_slice.weight": (d, g), "in_project_slice.bias": (g,),
            "temperature": (n_head,)}


def physics_front_mesh(params, n_points, mesh_shape):
    """Read what a slice-front layer's params say about its shape: the output width from
    ``to_out.0.weight`` (None: the input width) and, on a structured mesh, the validated
    ``mesh_shape`` and the conv kernel ``k`` of ``in_project_x.weight`` ``(H D, C, *k)`` (None on an
    irregular mesh). Shared by Transolver and FUNCATTN. Returns ``(c_out, mesh_shape, k)``."""
    c_out = None
    w_out = params.get("to_out.0.weight") if isinstance(params, dict) else None
    if w_out is not None and np.ndim(w_out) == 2:
        c_out = np.shape(w_out)[1]
    k = None
    if mesh_shape is not None:
        if not isinstance(mesh_shape, (tuple, list)) or not mesh_shape:
            raise TypeError(f"mesh_shape must be a tuple of grid sizes (H, W) or (H, W, D); got {mesh_shape!r}")
        mesh_shape = tuple(check_int(m, "mesh_shape", minimum=1) for m in mesh_shape)
        if int(np.prod(mesh_shape)) != n_points:
            raise ValueError(f"mesh_shape {mesh_shape} holds {int(np.prod(mesh_shape))} points; x has {n_points}")
        w_x = params.get("in_project_x.weight") if isinstance(params, dict) else None
        if w_x is None or np.ndim(w_x) != 2 + len(mesh_shape):
            raise ValueError(f"with mesh_shape={mesh_shape} (a {len(mesh_shape)}-D structured mesh) in_project_x.weight "
                             f"must be a conv weight "
                             f"(H*D, C, {', '.join('k' * len(mesh_shape))}); got shape {np.shape(w_x)}")
        k = tuple(np.shape(w_x)[2:])
        if any(kk % 2 == 0 for kk in k):
            raise ValueError(f"conv kernel sizes must be odd (padding k//2 keeps the mesh); got {k}")
    return c_out, mesh_shape, k


def check_head_width(params, key, c, n_head):
    """Check the ``(D, out)`` weight ``params[key]`` whose input axis a layer reads the head width
    ``D`` off, against ``in_project_x.weight``'s ``H D`` (checked first against the input width
    ``c``; a structured mesh's conv weight ``(H D, C, *k)`` gives ``H D`` on axis 0), so that
    PyTorch's untransposed ``(out, in)`` weight is named with its transpose instead of making the
    layer expect a wrong ``in_project_x`` shape. ``params[key]`` is checked only where its
    transpose fits (otherwise, e.g. for a wrong ``n_head``, the full validation reads ``D`` off it
    and says what disagrees); nothing where a key is absent."""
    if not isinstance(params, dict) or params.get("in_project_x.weight") is None:
        return
    shp = np.shape(params["in_project_x.weight"])
    if len(shp) == 2:
        shp = check_weight_in(params, "in_project_x.weight", c, input_name="x")
        hd = shp[1]
    elif len(shp) > 2:
        hd = shp[0]
    else:
        return
    w = np.shape(params.get(key))
    # only where the transpose fits: otherwise (a wrong n_head, say) the full validation reads D off this key
    if hd % n_head == 0 and len(w) == 2 and w[0] != hd // n_head and w[1] == hd // n_head:
        check_weight_in(params, key, hd // n_head,
                        input_name=f"a head (in_project_x's width {hd} / n_head {n_head})")


def validate_physics_front(x, params, n_head, tau_clamp, slice_eps, extra_spec, optional=()):
    """Validate ``x`` and the params of a slice-front layer: the front's spec plus
    ``extra_spec(c, n_head, d, g)``. Returns ``(x, p, n_head, d, g, tau_clamp, slice_eps)``."""
    x = as_float(x, "x", ndim=3)
    c = x.shape[2]
    n_head = check_int(n_head, "n_head", minimum=1)
    check_head_width(params, "in_project_slice.weight", c, n_head)
    d, g = slice_dims(params)
    tau_clamp = check_tau_clamp(tau_clamp)
    slice_eps = check_positive(slice_eps, "slice_eps", allow_zero=True)
    spec = physics_front_spec(c, n_head, d, g)
    spec.update(extra_spec(c, n_head, d, g))
    p = check_params(params, spec, optional=optional)
    if np.any(p["temperature"] <= 0) and tau_clamp is None:
        raise ValueError("temperature must be > 0 (or pass tau_clamp)")
    return x, p, n_head, d, g, tau_clamp, slice_eps


def physics_front_init(rng, dim, n_head, dim_head, slice_num):
    """Upstream initialisation of the slice front: PyTorch default linears, orthogonal
    ``in_project_slice``, temperature 0.5."""
    p = {}
    p.update(init_linear_prefixed(rng, dim, n_head * dim_head, "in_project_x"))
    p.update(init_linear_prefixed(rng, dim, n_head * dim_head, "in_project_fx"))
    p.update(init_linear_prefixed(rng, dim_head, slice_num, "in_project_slice"))
    p["in_project_slice.weight"] = orthogonal_init(rng, dim_head, slice_num)
    p["temperature"] = np.full(n_head, 0.5)
    return p


# --------------------------------------------------------------------------------------------
# Axial kernels (FactFormer, IFactFormer-m)


def validate_axial_operands(v, q_x, k_x, q_y, k_y, scaling_x, scaling_y):
    """Validate ``v (B, H, nx, ny, c)``, ``q_x, k_x (B, H, nx, d)``, ``q_y, k_y (B, H, ny, d)`` and
    the two scales. Returns ``(v, {"q_x", "k_x", "q_y", "k_y"}, sx, sy, dtype)``."""
    v = as_float(v, "v", ndim=5)
    b, h, nx, ny, _ = v.shape
    arrs = {}
    for name, arr, n in (("q_x", q_x, nx), ("k_x", k_x, nx), ("q_y", q_y, ny), ("k_y", k_y, ny)):
        a = as_float(arr, name, ndim=4)
        if a.shape[:3] != (b, h, n):
            raise ValueError(f"{name} must have shape (B={b}, H={h}, {n}, d) to match v of shape {v.shape}; "
                             f"got {a.shape}")
        arrs[name] = a
    for ax in "xy":
        if arrs[f"q_{ax}"].shape[-1] != arrs[f"k_{ax}"].shape[-1]:
            raise ValueError(f"feature sizes of q_{ax} ({arrs[f'q_{ax}'].shape[-1]}) and k_{ax} "
                             f"({arrs[f'k_{ax}'].shape[-1]}) must agree")
    sx = check_positive(scaling_x, "scaling_x")
    sy = check_positive(scaling_y, "scaling_y")
    dt = compute_dtype(v, *arrs.values())
    return v.astype(dt, copy=False), {k: a.astype(dt, copy=False) for k, a in arrs.items()}, sx, sy, dt


def axial_kernels(a, sx, sy):
    r"""$K_x = s_x q_x k_x^\top$, $K_y = s_y q_y k_y^\top$ from the operands ``a``."""
    kx = sx * (a["q_x"] @ np.swapaxes(a["k_x"], -1, -2))
    ky = sy * (a["q_y"] @ np.swapaxes(a["k_y"], -1, -2))
    return kx, ky


def axial_kernel_grads(a, dkx, dky, sx, sy):
    r"""Gradients of the operands from $dK_x, dK_y$: $dq_x = s_x\,dK_x k_x$, $dk_x = s_x\,dK_x^\top q_x$
    (same for $y$)."""
    return {"q_x": sx * (dkx @ a["k_x"]), "k_x": sx * (np.swapaxes(dkx, -1, -2) @ a["q_x"]),
            "q_y": sy * (dky @ a["k_y"]), "k_y": sy * (np.swapaxes(dky, -1, -2) @ a["q_y"])}


# --------------------------------------------------------------------------------------------
# Implicit differentiation of a Sinkhorn plan (MoNo CoTAP, AOT-POT)


def sinkhorn_implicit_vjp(P: np.ndarray, dP: np.ndarray) -> np.ndarray:
    r"""Gradient w.r.t. the log-kernel $L$ of a Sinkhorn plan at its fixed point.

    $P_{ij} = e^{L_{ij}+u_i+v_j}$ with the row sums $r = P\mathbf 1$ and column sums
    $c = P^\top\mathbf 1$ held fixed, so $dP = P\odot(dL + du\oplus dv)$ with vanishing row and
    column sums. Since $\sum_{ij}(\alpha_i+\beta_j)\,dP_{ij} = 0$ for any $\alpha,\beta$, choosing
    them so that the coefficients of $du, dv$ vanish,

    $$r_i\alpha_i + (P\beta)_i = -\textstyle\sum_j P_{ij}\bar G_{ij},\qquad
    (P^\top\alpha)_j + c_j\beta_j = -\sum_i P_{ij}\bar G_{ij},$$

    gives $\partial\mathcal L/\partial L = P\odot(\bar G + \alpha\oplus\beta)$ ($\bar G = $ ``dP``).
    Eliminating $\alpha$ leaves $(\operatorname{diag}c - P^\top\operatorname{diag}(1/r)P)\beta =
    \ldots$, singular along $\mathbf 1$ (the $\alpha\oplus\beta$ gauge) and consistent; it is solved
    with $\beta_{M-1} = 0$. ``P, dP (..., N, M)``. Exact only at convergence: for a finite number
    of iterations the unrolled VJP (``sinkhorn_log_vjp``) is the gradient of what was computed.
    """
    r = P.sum(axis=-1)
    pg = P * dP
    gr, gc = pg.sum(axis=-1), pg.sum(axis=-2)
    m = P.shape[-1]
    beta = np.zeros(P.shape[:-2] + (m,), dtype=P.dtype)
    if m > 1:
        pt = swap_last(P)
        schur = -(pt / r[..., None, :]) @ P
        idx = np.arange(m)
        schur[..., idx, idx] += P.sum(axis=-2)
        rhs = -gc + (pt @ (gr / r)[..., None])[..., 0]
        beta[..., :-1] = np.linalg.solve(schur[..., :-1, :-1], rhs[..., :-1, None])[..., 0]
    alpha = -(gr + (P @ beta[..., None])[..., 0]) / r
    return P * (dP + alpha[..., :, None] + beta[..., None, :])
