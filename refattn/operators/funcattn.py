r"""Functional Attention (FUNCATTN): attention among slice coefficients as a regularised
least-squares functional map.

Paper: Xiao, Gao, Weber, Yang, Cremers, "Functional Attention" (FUNCATTN), ICML 2026,
arXiv 2605.31559 (per the catalogue's listing; the authors' README names the same title).
Upstream: xjffff/FUNCATTN ``PDE-StandardBenchmark/model/Functional_attention.py`` @
1d93f7497e84a8438bf9bb8d4e309df9fae39c6a (``FunctionalMap_Attention_Structured_Mesh_2D``, the
full layer with convolutional projections; ``FunctionalMap_Attention_Irregular_Mesh_Shared``, the
same map whose slice front is computed once in the model,
``PDE-StandardBenchmark/model/Functional_Attention_Irregular_Mesh_Shared.py`` at the same commit).

Which part of the model this is: the attention layer. A FUNCATTN block is
``x + FuncAttn(LN(x))`` then ``x + MLP(LN(x))``; the surrounding blocks are ordinary pre-norm
transformer blocks and are not repeated here.

The layer (per head $h$; $D$ = ``dim_head``, $G$ = ``basis_num``)
-----------------------------------------------------------------
The front is Transolver's slice front (``refattn.operators.common.physics_front_forward``; its
derivation is on the Transolver page): $f = xW_{fx}+b_{fx}$, $x' = xW_x+b_x$ (split in heads),
basis $w = \mathrm{softmax}_G((x'W_s+b_s)/\tau_h)\in\mathbb R^{N\times G}$ and coefficients
$z_g = \sum_i w_{ig} f_i/(\sum_i w_{ig}+\epsilon)$. The softmax attention among slices is
replaced by a functional map between the coefficient sets, in the "dual" form of the code:

$$q = zW_q,\ k = zW_k,\ v = zW_v\in\mathbb R^{G\times D},\qquad a = \sigma(\alpha),$$
$$A = (1-a)\,k^\top k + a\,I_D,\qquad Z = A^{-1}k^\top\in\mathbb R^{D\times G},\qquad
C = qZ\in\mathbb R^{G\times G},$$
$$z' = Cv,\qquad y_i = \sum_g w_{ig}z'_g,\qquad \text{out} = [y_1\dots y_H]W_o + b_o.$$

$C = q\,((1-a)k^\top k + aI)^{-1}k^\top$ is the ridge-regression map that carries the key
coefficients onto the query coefficients ($C k \approx q$ up to the ridge term), so
$z' = Cv$ transports the values by that map. ``alpha`` is a single scalar shared by all heads (stored with shape (1,))
(upstream init 0 for the structured layer, 1e-3 for the irregular-mesh one).

Backward
--------
With $G_{z'} = \partial L/\partial z'$ (from the deslice, exactly as in Transolver):
$dC = G_{z'}v^\top$, $dv = C^\top G_{z'}$, $dq = dC\,Z^\top$, $dZ = q^\top dC$.
For the solve $Z = A^{-1}k^\top$: with $S = A^{-\top}dZ = A^{-1}dZ$ ($A$ is symmetric),
$d(k^\top) \mathrel{+}= S$ and $dA = -S Z^\top$. Then $A = (1-a)k^\top k + aI$ gives
$dk \mathrel{+}= (1-a)\,k\,(dA + dA^\top)$ and $da = \sum (dA\odot(I - k^\top k))$,
$d\alpha = \sum_{b,h} da\cdot a(1-a)$. Finally $dz = dq W_q^\top + dk W_k^\top + dv W_v^\top$,
$dW_t = \sum z^\top\,dt$, and the slice-front VJP (``physics_front_backward``) takes $dz$ and the
deslice's $dw = G_y z'^\top$.

Conventions (keywords, upstream defaults)
-----------------------------------------
* ``tau_clamp``: ``(0.1, 5)`` in the structured layer (default here, as upstream's full layer);
  the irregular-mesh model divides by the unclamped temperature (``tau_clamp=None``).
* ``slice_eps`` 1e-5; ``mesh_shape`` makes ``in_project_x``/``in_project_fx`` stride-1
  convolutions with padding ``k//2`` (upstream ``Conv2d(C, C, 3, 1, 1)``); without it they are
  Linears (the irregular-mesh front).
* Dropout is the identity (evaluation; upstream default ``dropout=0``).

Agreement with upstream (float64, CPU, torch 2.13; scratch script transcribing the upstream
forward into torch with its ``einops.rearrange`` written as ``permute``/``reshape``, since einops
is not installed; weights copied): irregular front + ``FunctionalMap_Attention_Irregular_Mesh_Shared``
and ``FunctionalMap_Attention_Structured_Mesh_2D`` (8x6 mesh, conv 3x3) — see the docs page
``docs/operators/operator-layers-t3b.md`` for the measured maximum errors of the output and
of every gradient.

Discretisation: the coefficients are weighted point averages, so repeating every point $k$
times leaves the output unchanged (exactly for $\epsilon = 0$; check
``uniform_refinement_invariance``), and a smooth field sampled on a grid and on its refinement
gives outputs at the shared points that converge at first order in $h$ (test in
``tests/test_operators_o4.py``).
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_int, compute_dtype
from ..nn.activations import sigmoid
from ..nn.linear import init_linear_prefixed, linear_prefixed, linear_prefixed_vjp, merge_heads, split_heads
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
    "funcattn_forward",
    "funcattn_backward",
    "funcattn_functional_attention",
    "funcattn_init_params",
]


def _funcattn_spec(params, n_points, mesh_shape):
    """Extra parameter shapes beyond the slice front, and the validated ``mesh_shape``."""
    c_out, mesh_shape, k = physics_front_mesh(params, n_points, mesh_shape)

    def spec(c, n_head, d, g):
        co = c if c_out is None else c_out
        out = {"to_q.weight": (d, d), "to_k.weight": (d, d), "to_v.weight": (d, d), "alpha": (1,),
               "to_out.0.weight": (n_head * d, co), "to_out.0.bias": (co,)}
        if k is not None:
            out.update({"in_project_x.weight": (n_head * d, c) + k, "in_project_fx.weight": (n_head * d, c) + k})
        return out
    return spec, mesh_shape


def funcattn_forward(x, params, *, n_head: int, tau_clamp=(0.1, 5.0), slice_eps: float = 1e-5,
                     mesh_shape=None):
    r"""FUNCATTN functional-map attention layer (``FunctionalMap_Attention_Structured_Mesh_2D``;
    without ``mesh_shape`` the irregular-mesh front with Linear projections).

    Parameters
    ----------
    x : array (B, N, C)
    params : dict
        Slice front: ``in_project_x.weight`` (C, H D) (conv ``(H D, C, k, k)`` with ``mesh_shape``),
        ``in_project_x.bias``; ``in_project_fx.*`` likewise; ``in_project_basis``'s weight under the
        key ``in_project_slice.weight`` (D, G) and ``.bias`` (G,); ``temperature`` (H,) (init 0.5).
        Map: ``to_q.weight``, ``to_k.weight``, ``to_v.weight`` (D, D), no bias, shared by heads;
        ``alpha`` (1,) the ridge logit (upstream a 0-d parameter); ``to_out.0.weight`` (H D, C_out), ``to_out.0.bias``.
        PyTorch Linear weights transposed (``W = linear.weight.T``).
    n_head : int
    tau_clamp : None or (min, max)
        Upstream structured layer ``(0.1, 5)`` (default); irregular-mesh model ``None``.
    slice_eps : float
        $\epsilon$ of the slice mass (upstream 1e-5).
    mesh_shape : None or tuple of ints
        Structured mesh (row-major points); the x/fx projections become convolutions.

    Returns
    -------
    out (B, N, C_out), cache
    """
    x_arr = as_float(x, "x", ndim=3)
    spec, mesh_shape = _funcattn_spec(params, x_arr.shape[1], mesh_shape)
    x, p, n_head, d, g, tau_clamp, slice_eps = validate_physics_front(
        x_arr, params, n_head, tau_clamp, slice_eps, spec)
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    w, tok, front = physics_front_forward(x, p, n_head, tau_clamp, slice_eps, mesh_shape)
    q, k, v = tok @ p["to_q.weight"], tok @ p["to_k.weight"], tok @ p["to_v.weight"]
    a = float(sigmoid(p["alpha"])[0])
    ktk = swap_last(k) @ k
    amat = (1.0 - a) * ktk + a * np.eye(d, dtype=dt)
    z = np.linalg.solve(amat, swap_last(k))      # (B, H, D, G)
    cmap = q @ z                                  # (B, H, G, G)
    zp = cmap @ v
    ym = merge_heads(w @ zp)
    out = linear_prefixed(p, "to_out.0", ym)
    cache = {"x": x, "p": p, "n_head": n_head, "w": w, "tok": tok, "q": q, "k": k, "v": v, "a": a,
             "ktk": ktk, "amat": amat, "z": z, "cmap": cmap, "zp": zp, "ym": ym, "front": front,
             "out_shape": out.shape}
    return out, cache


def funcattn_backward(dout, cache):
    """Gradients of :func:`funcattn_forward` (derivation in the module docstring)."""
    x, p, w = cache["x"], cache["p"], cache["w"]
    dout = as_dout(dout, cache["out_shape"], x.dtype)
    grads = {}
    dy = split_heads(linear_prefixed_vjp(grads, p, "to_out.0", dout, cache["ym"]), cache["n_head"])
    dzp = swap_last(w) @ dy
    dw = dy @ swap_last(cache["zp"])
    q, k, v, z, cmap, a = cache["q"], cache["k"], cache["v"], cache["z"], cache["cmap"], cache["a"]
    dcmap = dzp @ swap_last(v)
    dv = swap_last(cmap) @ dzp
    dq = dcmap @ swap_last(z)
    dz = swap_last(q) @ dcmap
    s = np.linalg.solve(cache["amat"], dz)       # A^{-T} dZ, A symmetric
    dk = swap_last(s)
    da_mat = -s @ swap_last(z)
    dk = dk + (1.0 - a) * k @ (da_mat + swap_last(da_mat))
    eye = np.eye(k.shape[-1], dtype=x.dtype)
    da = np.sum(da_mat * (eye - cache["ktk"]))
    grads["alpha"] = np.full(1, da * a * (1.0 - a), dtype=x.dtype)
    tok = cache["tok"]
    dtok = 0.0
    for t, gt in (("q", dq), ("k", dk), ("v", dv)):
        grads[f"to_{t}.weight"] = np.einsum("bhgi,bhgo->io", tok, gt)
        dtok = dtok + gt @ p[f"to_{t}.weight"].T
    grads["x"] = physics_front_backward(grads, p, x, dw, dtok, cache["front"])
    return grads


def funcattn_functional_attention(x, params, **config):
    """Convenience wrapper: the output of :func:`funcattn_forward`."""
    return funcattn_forward(x, params, **config)[0]


def funcattn_init_params(rng, dim: int, n_head: int = 8, dim_head: int = 32, basis_num: int = 64,
                         dtype=np.float64, *, alpha_init: float = 0.0, out_dim: int | None = None,
                         mesh_ndim: int | None = None, kernel: int = 3) -> dict:
    """Upstream initialisation: PyTorch default linears/convs, orthogonal ``in_project_basis``,
    temperature 0.5, ``alpha = alpha_init`` (structured layer 0, irregular-mesh 1e-3)."""
    p = physics_front_init(rng, dim, n_head, dim_head, basis_num)
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
    p["alpha"] = np.full(1, float(alpha_init))
    return {kk: np.asarray(vv, dtype=dtype) for kk, vv in p.items()}


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample_funcattn(rng, size):
    n, c, h, d, g = slice_sizes(rng, size)
    params = perturb_params(rng, funcattn_init_params(rng, c, h, d, g))
    params["temperature"] = rng.uniform(0.4, 1.2, h)
    params["alpha"] = rng.uniform(-1.0, 1.0, 1)
    return Sample(inputs={"x": rng.standard_normal((2, n, c))}, params=params,
                  config={"n_head": h, "tau_clamp": None})


def _reference_funcattn(x, params, *, n_head, tau_clamp=(0.1, 5.0), slice_eps=1e-5, mesh_shape=None):
    # Primal form with an explicit inverse: C = q (k^T k (1-a) + a I)^{-1} k^T.
    _, cache = funcattn_forward(x, params, n_head=n_head, tau_clamp=tau_clamp, slice_eps=slice_eps,
                                mesh_shape=mesh_shape)
    p, tok, a = cache["p"], cache["tok"], cache["a"]
    q, k, v = tok @ p["to_q.weight"], tok @ p["to_k.weight"], tok @ p["to_v.weight"]
    d = k.shape[-1]
    inv = np.linalg.inv((1 - a) * np.einsum("bhgi,bhgj->bhij", k, k) + a * np.eye(d))
    cmap = np.einsum("bhgi,bhij,bhkj->bhgk", q, inv, k)
    y = np.einsum("bhng,bhgk,bhkd->bhnd", cache["w"], cmap, v)
    return merge_heads(y) @ p["to_out.0.weight"] + p["to_out.0.bias"]


def _check_map_fits_keys(rng):
    # With a -> 0, G >= D full-rank keys and W_q = W_k, C k = k (k^T k)^{-1} k^T k = k: the
    # least-squares map reproduces the keys it was fitted on.
    s = _sample_funcattn(rng, "small")
    p = dict(s.params, alpha=np.full(1, -40.0))
    p["to_q.weight"] = p["to_k.weight"].copy()
    _, cache = funcattn_forward(s.inputs["x"], p, **s.config)
    err = float(np.abs(cache["cmap"] @ cache["k"] - cache["k"]).max())
    assert err < 1e-8, f"the least-squares map does not reproduce its keys: {err}"
    return err


def _check_structured_mesh(rng):
    # FunctionalMap_Attention_Structured_Mesh_2D: FD gradcheck with 3x3 conv projections; a 1x1
    # conv equals the Linear (irregular-mesh) front.
    from ..testing.gradcheck import gradcheck
    p = perturb_params(rng, funcattn_init_params(rng, 2, 1, 2, 2, out_dim=1, mesh_ndim=2))
    p["temperature"] = rng.uniform(0.4, 1.2, 1)
    s = Sample(inputs={"x": rng.standard_normal((2, 4, 2))}, params=p,
               config={"n_head": 1, "mesh_shape": (2, 2)})
    worst = gradcheck(funcattn_forward, funcattn_backward, s).max_rel
    err = check_conv1x1_matches_linear(funcattn_functional_attention, funcattn_init_params, rng)
    return max(worst, err)


register(
    Mechanism(
        slug="funcattn_functional_attention", family="3-operator", tier="T3",
        title="Functional Attention (FUNCATTN): attention as a functional map between learned bases",
        paper="Xiao, Gao, Weber, Yang, Cremers, Functional Attention, ICML 2026, arXiv 2605.31559",
        forward=funcattn_forward, backward=funcattn_backward, sample=_sample_funcattn,
        reference=_reference_funcattn,
        docs="operators/operator-layers-t3b.md#funcattn-functional-attention",
        checks={"least_squares_map_reproduces_keys": _check_map_fits_keys,
                "permutation_equivariance": check_point_permutation(funcattn_forward, _sample_funcattn),
                "uniform_refinement_invariance": check_uniform_refinement(
                    funcattn_forward, _sample_funcattn, slice_eps=0.0),
                "structured_mesh_conv_projections": _check_structured_mesh},
    ),
)
