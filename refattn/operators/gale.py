r"""GeoTransolver GALE: Transolver slices, slice self-attention mixed with cross-attention to a context.

Paper: NVIDIA PhysicsNeMo, GeoTransolver, arXiv 2512.20399. Upstream: NVIDIA/physicsnemo
``physicsnemo/nn/module/gale.py`` @ 94b355108cfd10e253d3d41cacdc0c0112b078e4 (``GALE``,
``_gale_cross_init``, ``_mix_self_and_cross``; PyPI nvidia-physicsnemo 2.2.2 ships the same file;
the earlier ``physicsnemo/experimental/models/geotransolver/gale.py`` is gone) on top of
``physicsnemo/nn/module/physics_attention.py`` (``PhysicsAttentionIrregularMesh``). Measured
agreement with the real ``GALE`` in float64: <= 4.3e-16, output and every gradient (docs).

Forward
-------
Transolver's slice front (``refattn.operators.common``; PhysicsNeMo variant: temperature clamped
to $[0.5, 5]$, slice mass $+10^{-2}$), a fused ``qkv_project`` $D\to3D$ without bias, then

$$z_{self} = \mathrm{SDPA}(zW_q, zW_k, zW_v),\qquad
z_{cross} = \mathrm{SDPA}(zW_{cq}+b_{cq},\; CW_{ck}+b_{ck},\; CW_{cv}+b_{cv})$$

with a context $C\in\mathbb R^{B\times H\times S_c\times D_c}$ (geometry / global embeddings,
built once upstream and shared by every block); ``"weighted"``:
$z' = \sigma(\beta)z_{self} + (1-\sigma(\beta))z_{cross}$ ($\beta$ = ``state_mixing``, init 0);
``"concat_project"``: $z' = \mathrm{GELU}([z_{self}, z_{cross}]W_c + b_c)$; deslice
$y_i = \sum_g w_{ig}z'_g$ and ``out_linear``. A convex sigmoid mix, not "z + SliceAttn +
CrossAttn". Without ``context`` it is PhysicsNeMo's Transolver and the cross/mixing parameters,
if given, get zero gradient.

Backward
--------
The Transolver VJP (module docstring of ``refattn.operators.transolver``), two SDPA VJPs and the
mix: $dz_{self} = \sigma\,dz'$, $dz_{cross} = (1-\sigma)\,dz'$,
$d\beta = \sigma'(\beta)\langle dz', z_{self}-z_{cross}\rangle$; concat-project: GELU and linear
VJPs, split back into the two halves. The context gradient is returned as ``context``; a model
that shares one context across blocks sums the per-block gradients.

Conventions
-----------
``tau_clamp`` (PhysicsNeMo ``(0.5, 5)``; thuml's 1-D Transolver: none), ``slice_eps``
(PhysicsNeMo ``1e-2``; thuml 1e-5), ``state_mixing`` 0-d as upstream (shape (1,) accepted), the
temperature stored ``(H,)`` (PhysicsNeMo ``(1, 1, H, 1)``).
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_choice, compute_dtype
from ..attention.softmax import attention_core_backward, attention_core_forward
from ..nn.activations import gelu, gelu_grad, sigmoid
from ..nn.linear import init_linear_prefixed, linear_prefixed, linear_prefixed_vjp, merge_heads, split_heads
from ..registry import Mechanism, Sample, register
from ._samples import check_point_permutation, perturb_params, slice_sizes
from .common import physics_front_backward, physics_front_forward, physics_front_init, swap_last, validate_physics_front
from .transolver import transolver_physics_attention

__all__ = [
    "geotransolver_gale_forward",
    "geotransolver_gale_backward",
    "geotransolver_gale",
    "gale_init_params",
]


def _gale_spec(state_mixing_mode, dc, beta_shape=()):
    def spec(c, n_head, d, g):
        s = {"qkv_project.weight": (d, 3 * d), "out_linear.weight": (n_head * d, c),
             "out_linear.bias": (c,),
             "cross_q.weight": (d, d), "cross_q.bias": (d,),
             "cross_k.weight": (dc, d), "cross_k.bias": (d,),
             "cross_v.weight": (dc, d), "cross_v.bias": (d,)}
        if state_mixing_mode == "weighted":
            s["state_mixing"] = beta_shape
        else:
            s["concat_project.0.weight"] = (2 * d, d)
            s["concat_project.0.bias"] = (d,)
        return s
    return spec


def geotransolver_gale_forward(x, params, context=None, *, n_head: int, state_mixing_mode="weighted",
                               tau_clamp=(0.5, 5.0), slice_eps: float = 1e-2):
    r"""GeoTransolver GALE: Transolver slices, self-attention among slices mixed with
    cross-attention from the slices to a geometry/global context, deslice.

    $$z_{self} = \mathrm{SDPA}(zW_q, zW_k, zW_v),\qquad
    z_{cross} = \mathrm{SDPA}(zW_{cq}+b_{cq},\; CW_{ck}+b_{ck},\; CW_{cv}+b_{cv}),$$
    ``"weighted"``: $z' = \sigma(\beta)z_{self} + (1-\sigma(\beta))z_{cross}$ ($\beta$ =
    ``state_mixing``, init 0); ``"concat_project"``:
    $z' = \mathrm{GELU}([z_{self}, z_{cross}]W_c + b_c)$; then $y_i = \sum_g w_{ig}z'_g$ and
    ``out_linear``. Without ``context`` it is Transolver (PhysicsNeMo conventions below) and the
    cross/mixing parameters, if given, get zero gradient.

    Parameters
    ----------
    x : array (B, N, C)
    params : dict
        The slice front as
        [`transolver_physics_attention_forward`][refattn.operators.transolver.transolver_physics_attention_forward]
        (``in_project_x``, ``in_project_fx``, ``in_project_slice``, ``temperature`` (H,) — PhysicsNeMo stores
        ``(1, 1, H, 1)``); ``qkv_project.weight`` (D, 3D) (no bias; columns q | k | v);
        ``out_linear.weight`` (H D, C), ``out_linear.bias``; ``cross_q.*`` (D, D), ``cross_k.*``
        and ``cross_v.*`` (D_c, D) with biases; ``state_mixing`` (scalar) or
        ``concat_project.0.weight`` (2D, D) and ``.bias``. ``state_mixing`` is 0-d as upstream
        (shape (1,) is accepted too).
    context : array (B, H, S_c, D_c), optional
        Context tokens (differentiable; shared by all blocks upstream, so callers accumulate).
    state_mixing_mode : {"weighted", "concat_project"}
    tau_clamp : (min, max) or None
        PhysicsNeMo clamps the temperature to ``(0.5, 5)`` (thuml 1-D Transolver: no clamp).
    slice_eps : float
        PhysicsNeMo adds ``1e-2`` to the slice mass (thuml Transolver: 1e-5).

    Notes
    -----
    Backward: Transolver VJP; two SDPA VJPs; weighted mix $dz_{self} = \sigma dz'$,
    $dz_{cross} = (1-\sigma)dz'$, $d\beta = \sigma'(\beta)\langle dz', z_{self}-z_{cross}\rangle$;
    concat-project: GELU and linear VJPs, split back into the two halves.
    """
    check_choice(state_mixing_mode, "state_mixing_mode", ("weighted", "concat_project"))
    if context is not None:
        context = as_float(context, "context", ndim=4)
        dc = context.shape[-1]
    else:
        w_ck = params.get("cross_k.weight") if isinstance(params, dict) else None
        dc = np.shape(w_ck)[0] if w_ck is not None and np.ndim(w_ck) == 2 else 0
    cross_keys = {"cross_q.weight", "cross_q.bias", "cross_k.weight", "cross_k.bias",
                  "cross_v.weight", "cross_v.bias", "state_mixing", "concat_project.0.weight",
                  "concat_project.0.bias"}
    optional = cross_keys if context is None else ()
    # the mixing scalar: upstream a 0-d parameter; a (1,) array is accepted too
    beta_shape = np.shape(params.get("state_mixing")) if isinstance(params, dict) else ()
    beta_shape = beta_shape if beta_shape in ((), (1,)) else ()
    x, p, n_head, d, g, tau_clamp, slice_eps = validate_physics_front(
        x, params, n_head, tau_clamp, slice_eps, _gale_spec(state_mixing_mode, dc, beta_shape), optional)
    b = x.shape[0]
    if context is not None and context.shape[:2] != (b, n_head):
        raise ValueError(f"context must have shape (B={b}, H={n_head}, S_c, D_c); got {context.shape}")
    dt = compute_dtype(x, context, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    w, tok, front = physics_front_forward(x, p, n_head, tau_clamp, slice_eps)
    wqkv = p["qkv_project.weight"]
    q, k, v = tok @ wqkv[:, :d], tok @ wqkv[:, d:2 * d], tok @ wqkv[:, 2 * d:]
    z_self, self_c = attention_core_forward(q, k, v)
    mix = None
    if context is not None:
        context = context.astype(dt, copy=False)
        cq, ck, cv = linear_prefixed(p, "cross_q", tok), linear_prefixed(p, "cross_k", context), linear_prefixed(p, "cross_v", context)
        z_cross, cross_c = attention_core_forward(cq, ck, cv)
        if state_mixing_mode == "weighted":
            s = sigmoid(p["state_mixing"])
            zp = s * z_self + (1.0 - s) * z_cross
            mix = {"s": s}
        else:
            cat = np.concatenate([z_self, z_cross], axis=-1)
            pre = linear_prefixed(p, "concat_project.0", cat)
            zp = gelu(pre)
            mix = {"cat": cat, "pre": pre}
    else:
        z_cross, cross_c, zp = None, None, z_self
    y = w @ zp
    ym = merge_heads(y)
    out = linear_prefixed(p, "out_linear", ym)
    cache = {"x": x, "p": p, "n_head": n_head, "d": d, "w": w, "tok": tok, "zp": zp, "ym": ym,
             "front": front, "self": self_c, "cross": cross_c, "z_self": z_self, "z_cross": z_cross,
             "context": context, "mix": mix, "mode": state_mixing_mode, "out_shape": out.shape}
    return out, cache


def geotransolver_gale_backward(dout, cache):
    """Gradients of :func:`geotransolver_gale_forward`: ``x``, ``context`` (if given), params."""
    x, p, w, d, tok = cache["x"], cache["p"], cache["w"], cache["d"], cache["tok"]
    dout = as_dout(dout, cache["out_shape"], x.dtype)
    grads = {}
    dy = split_heads(linear_prefixed_vjp(grads, p, "out_linear", dout, cache["ym"]), cache["n_head"])
    dzp = swap_last(w) @ dy
    dw = dy @ swap_last(cache["zp"])
    dtok = 0.0
    if cache["context"] is not None:
        mix = cache["mix"]
        if cache["mode"] == "weighted":
            s = mix["s"]
            dz_self, dz_cross = s * dzp, (1.0 - s) * dzp
            grads["state_mixing"] = np.reshape(
                np.sum(dzp * (cache["z_self"] - cache["z_cross"])) * s * (1.0 - s), np.shape(s))
        else:
            dpre = dzp * gelu_grad(mix["pre"])
            dcat = linear_prefixed_vjp(grads, p, "concat_project.0", dpre, mix["cat"])
            dz_self, dz_cross = dcat[..., :d], dcat[..., d:]
        gc = attention_core_backward(dz_cross, cache["cross"])
        dtok = dtok + linear_prefixed_vjp(grads, p, "cross_q", gc["q"], tok)
        ctx = cache["context"]
        grads["context"] = (linear_prefixed_vjp(grads, p, "cross_k", gc["k"], ctx)
                            + linear_prefixed_vjp(grads, p, "cross_v", gc["v"], ctx))
    else:
        dz_self = dzp
        for k in ("cross_q.weight", "cross_q.bias", "cross_k.weight", "cross_k.bias",
                  "cross_v.weight", "cross_v.bias", "state_mixing", "concat_project.0.weight",
                  "concat_project.0.bias"):
            if k in p:
                grads[k] = np.zeros_like(p[k])
    ga = attention_core_backward(dz_self, cache["self"])
    wqkv = p["qkv_project.weight"]
    dq = np.concatenate([ga["q"], ga["k"], ga["v"]], axis=-1)
    grads["qkv_project.weight"] = np.einsum("bhgi,bhgo->io", tok, dq)
    dtok = dtok + dq @ wqkv.T
    grads["x"] = physics_front_backward(grads, p, x, dw, dtok, cache["front"])
    return grads


def geotransolver_gale(x, params, context=None, **config):
    """Convenience wrapper: the output of :func:`geotransolver_gale_forward`."""
    return geotransolver_gale_forward(x, params, context, **config)[0]


def gale_init_params(rng, dim: int, n_head: int = 8, dim_head: int = 64, slice_num: int = 64,
                     context_dim: int = 0, state_mixing_mode="weighted", dtype=np.float64) -> dict:
    """PhysicsNeMo initialisation: PyTorch default linears, orthogonal ``in_project_slice``,
    temperature 0.5, ``state_mixing`` 0 (balanced mix)."""
    check_choice(state_mixing_mode, "state_mixing_mode", ("weighted", "concat_project"))
    p = physics_front_init(rng, dim, n_head, dim_head, slice_num)
    p.update(init_linear_prefixed(rng, dim_head, 3 * dim_head, "qkv_project", bias=False))
    p.update(init_linear_prefixed(rng, n_head * dim_head, dim, "out_linear"))
    if context_dim > 0:
        p.update(init_linear_prefixed(rng, dim_head, dim_head, "cross_q"))
        p.update(init_linear_prefixed(rng, context_dim, dim_head, "cross_k"))
        p.update(init_linear_prefixed(rng, context_dim, dim_head, "cross_v"))
        if state_mixing_mode == "weighted":
            p["state_mixing"] = np.array(0.0)
        else:
            p.update(init_linear_prefixed(rng, 2 * dim_head, dim_head, "concat_project.0"))
    return {k: np.asarray(v, dtype=dtype) for k, v in p.items()}


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample_gale(mode):
    def sample(rng, size):
        n, c, h, d, g = slice_sizes(rng, size)
        sc, dcx = (2, 2) if size == "tiny" else (3, 3)
        params = perturb_params(rng, gale_init_params(rng, c, h, d, g, context_dim=dcx,
                                                state_mixing_mode=mode))
        params["temperature"] = rng.uniform(0.7, 1.5, h)   # inside the (0.5, 5) clamp
        x = rng.standard_normal((2, n, c))
        ctx = rng.standard_normal((2, h, sc, dcx))
        return Sample(inputs={"x": x, "context": ctx}, params=params,
                      config={"n_head": h, "state_mixing_mode": mode})
    return sample


def _check_gale_beta_inf_is_transolver(rng):
    s = _sample_gale("weighted")(rng, "small")
    p = dict(s.params, state_mixing=np.array(60.0))
    out = geotransolver_gale(s.inputs["x"], p, s.inputs["context"], n_head=2)
    tp = {k: v for k, v in p.items() if k.startswith(("in_project", "temperature"))}
    d = tp["in_project_slice.weight"].shape[0]
    wqkv = p["qkv_project.weight"]
    tp.update({"to_q.weight": wqkv[:, :d], "to_k.weight": wqkv[:, d:2 * d],
               "to_v.weight": wqkv[:, 2 * d:], "to_out.0.weight": p["out_linear.weight"],
               "to_out.0.bias": p["out_linear.bias"]})
    ref = transolver_physics_attention(s.inputs["x"], tp, n_head=2, tau_clamp=(0.5, 5.0),
                                       slice_eps=1e-2)
    err = float(np.abs(out - ref).max())
    assert err < 1e-12, f"sigmoid(beta) = 1 does not reduce GALE to Transolver: {err}"
    return err


def _check_gale_single_context(rng):
    # S_c = 1: cross-attention is the broadcast of C W_cv + b_cv to every slice.
    s = _sample_gale("weighted")(rng, "small")
    ctx = s.inputs["context"][:, :, :1]
    p = dict(s.params, state_mixing=np.array(-60.0))   # sigmoid -> 0: pure cross
    _, cache = geotransolver_gale_forward(s.inputs["x"], p, ctx, n_head=2)
    ref = ctx @ p["cross_v.weight"] + p["cross_v.bias"]
    err = float(np.abs(cache["z_cross"] - ref).max())
    assert err < 1e-12, f"single context token is not broadcast: {err}"
    return err


def _check_gale_concat_fd(rng):
    from ..testing.gradcheck import gradcheck
    return gradcheck(geotransolver_gale_forward, geotransolver_gale_backward,
                     _sample_gale("concat_project")(rng, "tiny")).max_rel


register(
    Mechanism(
        slug="geotransolver_gale", family="3-operator", tier="T1",
        title="GeoTransolver GALE: slice self-attention mixed with cross-attention to a context",
        paper="NVIDIA PhysicsNeMo, GeoTransolver, arXiv 2512.20399",
        forward=geotransolver_gale_forward, backward=geotransolver_gale_backward,
        sample=_sample_gale("weighted"), docs="operator-attention.md#geotransolver-gale",
        checks={"beta_inf_is_transolver": _check_gale_beta_inf_is_transolver,
                "single_context_token_broadcast": _check_gale_single_context,
                "concat_project_gradcheck": _check_gale_concat_fd,
                "permutation_equivariance": check_point_permutation(geotransolver_gale_forward,
                                                                    _sample_gale("weighted"))},
    ),
)
