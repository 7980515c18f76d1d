r"""Transolver Physics-Attention: slice the points, attend among the slices, deslice.

Paper: Wu, Luo, Wang, Wang, Long, "Transolver: A Fast Transformer Solver for PDEs on General
Geometries", ICML 2024, arXiv 2402.02366. Upstream: thuml/Transolver
``PDE-Solving-StandardBenchmark/model/Physics_Attention.py`` @
75e0f67643806a81cd1d3f6adc88dd8c02416fe7 (``Physics_Attention_Irregular_Mesh``; on structured
meshes ``Physics_Attention_Structured_Mesh_2D``/``_3D``, whose ``in_project_x``/``in_project_fx``
are ``Conv2d``/``Conv3d`` with kernel 3, padding 1: keyword ``mesh_shape``).

The slice front (input projections, temperature softmax over slices, slice tokens) is shared
with LinearNO (``refattn.operators.linear_no``, Physics-Attention recast as linear attention) and
GeoTransolver GALE (``refattn.operators.gale``); its code lives in ``refattn.operators.common``
and its derivation below.

Physics-Attention (per head $h$, $D$ = ``dim_head``, $G$ = ``slice_num``)
-------------------------------------------------------------------------
$$x' = xW_x + b_x,\quad f = xW_{fx} + b_{fx}\quad(\text{split into heads } (B,H,N,D)),$$
$$w = \mathrm{softmax}_G\big((x'W_s + b_s)/\tau_h\big)\in\mathbb{R}^{N\times G},\qquad
z_g = \frac{\sum_i w_{ig} f_i}{\sum_i w_{ig} + \epsilon},$$
$$z' = \mathrm{softmax}\big(zW_q (zW_k)^\top/\sqrt D\big)\,zW_v,\qquad
y_i = \sum_g w_{ig} z'_g,\qquad \text{out} = [y_1\dots y_H]W_o + b_o.$$

Backward
--------
$w$ enters twice, in the slice (through the numerator and the mass $m_g = \sum_i w_{ig}$) and
in the deslice, so its gradient is the sum of three terms. With $G_y = \partial L/\partial y$:
deslice $dz' = w^\top G_y$, $dw \mathrel{+}= G_y z'^\top$; slice attention: the SDPA VJP
(:func:`refattn.attention.softmax.attention_core_backward`) gives $dq, dk, dv$ and
$dz = dq W_q^\top + dk W_k^\top + dv W_v^\top$; the quotient $z = n/(m+\epsilon)$ gives
$dn = dz/(m+\epsilon)$, $dm_g = -\sum_c dz_{gc} z_{gc}/(m_g+\epsilon)$, hence
$dw \mathrel{+}= f\,dn^\top + \mathbf 1\,dm^\top$ and $df = w\,dn$. The softmax over slices
gives $d\ell = \mathrm{softmax\_vjp}(w, dw)$ for $\ell = $ logits$/\tau$; then
$d\text{logits} = d\ell/\tau$ and $d\tau_h = -\sum d\ell\odot\text{logits}/\tau_h^2$ (times
$\mathbb 1[\tau_{lo}\le\tau_h\le\tau_{hi}]$ when clamped, PyTorch's ``clamp`` subgradient).
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_choice, check_int, compute_dtype
from ..attention.softmax import attention_core_backward, attention_core_forward
from ..nn.linear import init_linear_prefixed, linear_prefixed, linear_prefixed_vjp, merge_heads, split_heads
from ..nn.softmax import softmax_lse
from ..registry import Mechanism, Sample, register
from ._samples import (
    check_conv1x1_matches_linear,
    check_point_permutation,
    check_uniform_refinement,
    perturb_params,
    slice_sizes,
)
from .common import (
    physics_front_backward,
    physics_front_forward,
    physics_front_init,
    physics_front_mesh,
    swap_last,
    validate_physics_front,
)

__all__ = [
    "transolver_physics_attention_forward",
    "transolver_physics_attention_backward",
    "transolver_physics_attention",
    "transolver_init_params",
]


def _transolver_spec_for(params, n_points, mesh_shape):
    """Parameter shapes: the output width is read from ``to_out.0.weight`` (any width), and on a
    structured mesh ``in_project_x``/``in_project_fx`` are conv weights ``(H D, C, *k)``."""
    c_out, mesh_shape, k = physics_front_mesh(params, n_points, mesh_shape)

    def spec(c, n_head, d, g):
        out = {"to_q.weight": (d, d), "to_k.weight": (d, d), "to_v.weight": (d, d),
               "to_out.0.weight": (n_head * d, c if c_out is None else c_out),
               "to_out.0.bias": (c if c_out is None else c_out,)}
        if k is not None:
            out.update({"in_project_x.weight": (n_head * d, c) + k, "in_project_fx.weight": (n_head * d, c) + k})
        return out
    return spec, mesh_shape


def transolver_physics_attention_forward(x, params, *, n_head: int, tau_clamp=None,
                                         slice_eps: float = 1e-5, slice_attention="softmax", mesh_shape=None):
    r"""Transolver Physics-Attention (``Physics_Attention_Irregular_Mesh``; with ``mesh_shape``
    ``Physics_Attention_Structured_Mesh_2D``/``_3D``).

    Parameters
    ----------
    x : array (B, N, C)
    params : dict
        ``in_project_x.weight`` (C, H D), ``in_project_x.bias``; ``in_project_fx.*`` likewise;
        ``in_project_slice.weight`` (D, G) and ``.bias`` (G,); ``temperature`` (H,)
        (upstream ``(1, H, 1, 1)``, init 0.5); ``to_q.weight``, ``to_k.weight``,
        ``to_v.weight`` (D, D), no bias, shared by the heads; ``to_out.0.weight`` (H D, C_out) and
        ``to_out.0.bias`` (C_out,), any ``C_out`` (upstream's is ``C``; the output width is read
        from the weight). PyTorch weights transposed (``W = linear.weight.T``). With
        ``mesh_shape``, ``in_project_x.weight``/``in_project_fx.weight`` are ``nn.Conv2d``/``Conv3d``
        weights in torch's layout ``(H D, C, k, k[, k])`` (upstream ``kernel=3``), biases ``(H D,)``.
    n_head : int
    tau_clamp : None or (min, max)
        Clamp of the temperature before use. Upstream ``Physics_Attention_Irregular_Mesh`` does not clamp
        (``None``, the default); its 2-D/3-D variants use ``(0.1, 5)``; PhysicsNeMo uses
        ``(0.5, 5)``.
    slice_eps : float
        $\epsilon$ of the slice mass (upstream 1e-5; PhysicsNeMo 1e-2).
    slice_attention : {"softmax", "identity"}
        ``"identity"`` skips the attention among slices ($z' = z$; ``to_q/k/v`` then get zero
        gradient) — the ablation under which Transolver is exactly a linear attention (LinearNO).
    mesh_shape : None or tuple of ints
        Structured mesh ``(H, W)`` or ``(H, W, D)`` (upstream ``H``, ``W``, ``D``): the $N$ points
        are ``x.reshape(B, H, W[, D], C)`` row-major, and ``in_project_x``/``in_project_fx`` are
        stride-1 convolutions with padding ``k//2`` (zero padding) on that grid. Upstream's
        structured variants also clamp the temperature to ``(0.1, 5)``: pass ``tau_clamp=(0.1, 5)``.

    Returns
    -------
    out (B, N, C_out), cache
    """
    check_choice(slice_attention, "slice_attention", ("softmax", "identity"))
    x_arr = as_float(x, "x", ndim=3)
    spec, mesh_shape = _transolver_spec_for(params, x_arr.shape[1], mesh_shape)
    x, p, n_head, d, g, tau_clamp, slice_eps = validate_physics_front(
        x_arr, params, n_head, tau_clamp, slice_eps, spec)
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    w, tok, front = physics_front_forward(x, p, n_head, tau_clamp, slice_eps, mesh_shape)
    if slice_attention == "softmax":
        q, k, v = tok @ p["to_q.weight"], tok @ p["to_k.weight"], tok @ p["to_v.weight"]
        zp, att_c = attention_core_forward(q, k, v)
    else:
        zp, att_c = tok, None
    y = w @ zp
    ym = merge_heads(y)
    out = linear_prefixed(p, "to_out.0", ym)
    cache = {"x": x, "p": p, "n_head": n_head, "w": w, "tok": tok, "zp": zp, "att": att_c,
             "ym": ym, "front": front, "out_shape": out.shape}
    return out, cache


def transolver_physics_attention_backward(dout, cache):
    """Gradients of :func:`transolver_physics_attention_forward` (derivation in the module docstring)."""
    x, p, w = cache["x"], cache["p"], cache["w"]
    dout = as_dout(dout, cache["out_shape"], x.dtype)
    grads = {}
    dy = split_heads(linear_prefixed_vjp(grads, p, "to_out.0", dout, cache["ym"]), cache["n_head"])
    dzp = swap_last(w) @ dy
    dw = dy @ swap_last(cache["zp"])
    if cache["att"] is not None:
        ga = attention_core_backward(dzp, cache["att"])
        tok = cache["tok"]
        dtok = 0.0
        for t in "qkv":
            wt = p[f"to_{t}.weight"]
            grads[f"to_{t}.weight"] = np.einsum("bhgi,bhgo->io", tok, ga[t])
            dtok = dtok + ga[t] @ wt.T
    else:
        dtok = dzp
        for t in "qkv":
            grads[f"to_{t}.weight"] = np.zeros_like(p[f"to_{t}.weight"])
    grads["x"] = physics_front_backward(grads, p, x, dw, dtok, cache["front"])
    return grads


def transolver_physics_attention(x, params, **config):
    """Convenience wrapper: the output of :func:`transolver_physics_attention_forward`."""
    return transolver_physics_attention_forward(x, params, **config)[0]


def transolver_init_params(rng, dim: int, n_head: int = 8, dim_head: int = 64,
                           slice_num: int = 64, dtype=np.float64, *, out_dim: int | None = None,
                           mesh_ndim: int | None = None, kernel: int = 3) -> dict:
    """Upstream initialisation: PyTorch default linears, orthogonal ``in_project_slice``,
    temperature 0.5. ``out_dim`` sets the ``to_out`` width (default ``dim``); ``mesh_ndim`` (2 or
    3) makes ``in_project_x``/``in_project_fx`` ``Conv{2,3}d(dim, H D, kernel)`` weights with
    PyTorch's default init ($U(\\pm1/\\sqrt{\text{fan\\_in}})$, fan_in $= \text{dim}\\cdot k^n$)."""
    p = physics_front_init(rng, dim, n_head, dim_head, slice_num)
    if mesh_ndim is not None:
        mesh_ndim = check_int(mesh_ndim, "mesh_ndim", minimum=1)
        kernel = check_int(kernel, "kernel", minimum=1)
        bound = 1.0 / np.sqrt(dim * kernel ** mesh_ndim)
        for t in ("x", "fx"):
            p[f"in_project_{t}.weight"] = rng.uniform(-bound, bound, (n_head * dim_head, dim) + (kernel,) * mesh_ndim)
            p[f"in_project_{t}.bias"] = rng.uniform(-bound, bound, n_head * dim_head)
    for t in "qkv":
        p.update(init_linear_prefixed(rng, dim_head, dim_head, f"to_{t}", bias=False))
    p.update(init_linear_prefixed(rng, n_head * dim_head, dim if out_dim is None else out_dim, "to_out.0"))
    return {k: v.astype(dtype) for k, v in p.items()}


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample_transolver(rng, size):
    n, c, h, d, g = slice_sizes(rng, size)
    params = perturb_params(rng, transolver_init_params(rng, c, h, d, g))
    params["temperature"] = rng.uniform(0.4, 1.2, h)
    return Sample(inputs={"x": rng.standard_normal((2, n, c))}, params=params,
                  config={"n_head": h})


def _check_slice_weights(rng):
    s = _sample_transolver(rng, "small")
    _, cache = transolver_physics_attention_forward(s.inputs["x"], s.params, **s.config)
    err = float(np.abs(cache["w"].sum(-1) - 1).max())
    assert err < 1e-14 and (cache["w"] > 0).all(), f"slice weights do not sum to 1: {err}"
    return err


def _check_transolver_g1(rng):
    # One slice: w = 1, z = sum f / (N + eps), attention over one token returns v = z W_v.
    n, c, h, d = 7, 4, 2, 2
    params = perturb_params(rng, transolver_init_params(rng, c, h, d, 1))
    x = rng.standard_normal((2, n, c))
    out = transolver_physics_attention(x, params, n_head=h)
    f = split_heads(x @ params["in_project_fx.weight"] + params["in_project_fx.bias"], h)
    z = f.sum(2, keepdims=True) / (n + 1e-5) @ params["to_v.weight"]
    ref = np.broadcast_to(z, f.shape)
    ref = merge_heads(ref) @ params["to_out.0.weight"] + params["to_out.0.bias"]
    err = float(np.abs(out - ref).max())
    assert err < 1e-12, f"G=1 is not the broadcast global mean: {err}"
    return err


def _check_transolver_is_linear_attention(rng):
    # arXiv 2511.06294: without the slice attention, Physics-Attention is the linear attention
    # y = Phi_q (Phi_k^T f) with Phi_q = w and Phi_k = w diag(1^T w + eps)^-1; in LinearNO's form
    # (softmax over points of the key logits) this is Phi_k = softmax_N(log w) when eps = 0.
    s = _sample_transolver(rng, "small")
    x, p, h = s.inputs["x"], s.params, s.config["n_head"]
    out, cache = transolver_physics_attention_forward(x, p, n_head=h, slice_attention="identity",
                                                      slice_eps=0.0)
    w, f = cache["w"], cache["front"]["fm"]
    phk, _ = softmax_lse(np.log(w), axis=-2)
    y = w @ (swap_last(phk) @ f)
    ref = merge_heads(y) @ p["to_out.0.weight"] + p["to_out.0.bias"]
    explicit = merge_heads((w @ swap_last(phk)) @ f) @ p["to_out.0.weight"] + p["to_out.0.bias"]
    err = max(float(np.abs(out - ref).max()), float(np.abs(out - explicit).max()))
    assert err < 1e-12, f"Transolver without slice attention differs from the linear attention: {err}"
    return err


def _check_structured_mesh(rng):
    # Physics_Attention_Structured_Mesh_{2D,3D}: FD gradcheck with conv projections on a 2-D and
    # a 3-D mesh (the latter with a to_out width != C); a 1x1(x1) conv equals the irregular form.
    from ..testing.gradcheck import gradcheck
    worst = 0.0
    for mesh, out_dim in (((2, 3), None), ((2, 2, 2), 3)):
        p = perturb_params(rng, transolver_init_params(rng, 2, 2, 2, 3, out_dim=out_dim, mesh_ndim=len(mesh)))
        p["temperature"] = rng.uniform(0.4, 1.2, 2)
        s = Sample(inputs={"x": rng.standard_normal((2, int(np.prod(mesh)), 2))}, params=p,
                   config={"n_head": 2, "mesh_shape": mesh, "tau_clamp": (0.1, 5)})
        worst = max(worst, gradcheck(transolver_physics_attention_forward, transolver_physics_attention_backward,
                                     s).max_rel)
    err = check_conv1x1_matches_linear(transolver_physics_attention, transolver_init_params, rng)
    return max(worst, err)


register(
    Mechanism(
        slug="transolver_physics_attention", family="3-operator", tier="T1",
        title="Transolver Physics-Attention (slice, attend among slices, deslice)",
        paper="Wu, Luo, Wang, Wang, Long, Transolver, ICML 2024, arXiv 2402.02366",
        forward=transolver_physics_attention_forward,
        backward=transolver_physics_attention_backward, sample=_sample_transolver,
        docs="operator-attention.md#transolver-physics-attention",
        checks={"slice_weights_sum_to_one": _check_slice_weights,
                "single_slice_is_global_mean": _check_transolver_g1,
                "permutation_equivariance": check_point_permutation(
                    transolver_physics_attention_forward, _sample_transolver),
                "identity_slice_attention_is_linear_attention": _check_transolver_is_linear_attention,
                "uniform_refinement_invariance": check_uniform_refinement(
                    transolver_physics_attention_forward, _sample_transolver, slice_eps=0.0),
                "structured_mesh_conv_projections": _check_structured_mesh},
    ),
)
