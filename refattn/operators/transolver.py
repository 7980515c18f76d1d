r"""Transolver Physics-Attention, LinearNO and GeoTransolver GALE (slice -> attend -> deslice).

Transolver: Wu, Luo, Wang, Wang, Long, "Transolver: A Fast Transformer Solver for PDEs on General
Geometries", ICML 2024, arXiv 2402.02366; upstream thuml/Transolver
``PDE-Solving-StandardBenchmark/model/Physics_Attention.py`` (``Physics_Attention_1D``).
LinearNO: Hu, Liu, Qiao, Sun, Dou, "Transolver is a Linear Transformer: Revisiting
Physics-Attention through the Lens of Linear Attention", AAAI 2026, arXiv 2511.06294; upstream
HiPRL/LinearNO ``Standard_PDE_Benchmark/model/LinearAttnNeuralOperator.py`` (``LinearNO``,
commit 3f2b80d). GeoTransolver GALE: NVIDIA PhysicsNeMo, arXiv 2512.20399; upstream
NVIDIA/physicsnemo ``physicsnemo/experimental/models/geotransolver/gale.py`` (``GALE``) on top of
``physicsnemo/nn/module/physics_attention.py`` (``PhysicsAttentionIrregularMesh``).

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

from .._checks import as_dout, as_float, cast_all, check_choice, check_int, check_params, compute_dtype
from ..attention.softmax import attention_core_backward, attention_core_forward
from ..nn.activations import gelu, gelu_grad, sigmoid
from ..nn.linear import init_linear_prefixed, linear_prefixed, linear_prefixed_vjp, merge_heads, split_heads
from ..nn.softmax import softmax_lse, softmax_vjp
from ..registry import Mechanism, Sample, register
from ._samples import check_point_permutation, check_uniform_refinement, perturb_params, slice_sizes
from .common import (
    check_tau_clamp,
    physics_front_backward,
    physics_front_forward,
    physics_front_init,
    swap_last,
    tempered_softmax_backward,
    tempered_softmax_forward,
    validate_physics_front,
)

__all__ = [
    "transolver_physics_attention_forward",
    "transolver_physics_attention_backward",
    "transolver_physics_attention",
    "transolver_init_params",
    "linear_no_attention_forward",
    "linear_no_attention_backward",
    "linear_no_attention",
    "linear_no_init_params",
    "geotransolver_gale_forward",
    "geotransolver_gale_backward",
    "geotransolver_gale",
    "gale_init_params",
]


# --------------------------------------------------------------------------------------------
# Transolver


def _transolver_spec(c, n_head, d, g):
    return {"to_q.weight": (d, d), "to_k.weight": (d, d), "to_v.weight": (d, d),
            "to_out.0.weight": (n_head * d, c), "to_out.0.bias": (c,)}


def transolver_physics_attention_forward(x, params, *, n_head: int, tau_clamp=None,
                                         slice_eps: float = 1e-5, slice_attention="softmax"):
    r"""Transolver Physics-Attention (irregular-mesh ``Physics_Attention_1D``).

    Parameters
    ----------
    x : array (B, N, C)
    params : dict
        ``in_project_x.weight`` (C, H D), ``in_project_x.bias``; ``in_project_fx.*`` likewise;
        ``in_project_slice.weight`` (D, G) and ``.bias`` (G,); ``temperature`` (H,)
        (upstream ``(1, H, 1, 1)``, init 0.5); ``to_q.weight``, ``to_k.weight``,
        ``to_v.weight`` (D, D), no bias, shared by the heads; ``to_out.0.weight`` (H D, C) and
        ``to_out.0.bias`` (C,). PyTorch weights transposed (``W = linear.weight.T``).
    n_head : int
    tau_clamp : None or (min, max)
        Clamp of the temperature before use. Upstream ``Physics_Attention_1D`` does not clamp
        (``None``, the default); its 2-D/3-D variants use ``(0.1, 5)``; PhysicsNeMo uses
        ``(0.5, 5)``.
    slice_eps : float
        $\epsilon$ of the slice mass (upstream 1e-5; PhysicsNeMo 1e-2).
    slice_attention : {"softmax", "identity"}
        ``"identity"`` skips the attention among slices ($z' = z$; ``to_q/k/v`` then get zero
        gradient) — the ablation under which Transolver is exactly a linear attention (LinearNO).

    Returns
    -------
    out (B, N, C), cache
    """
    check_choice(slice_attention, "slice_attention", ("softmax", "identity"))
    x, p, n_head, d, g, tau_clamp, slice_eps = validate_physics_front(
        x, params, n_head, tau_clamp, slice_eps, _transolver_spec)
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    w, tok, front = physics_front_forward(x, p, n_head, tau_clamp, slice_eps)
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
                           slice_num: int = 64, dtype=np.float64) -> dict:
    """Upstream initialisation: PyTorch default linears, orthogonal ``in_project_slice``,
    temperature 0.5."""
    p = physics_front_init(rng, dim, n_head, dim_head, slice_num)
    for t in "qkv":
        p.update(init_linear_prefixed(rng, dim_head, dim_head, f"to_{t}", bias=False))
    p.update(init_linear_prefixed(rng, n_head * dim_head, dim, "to_out.0"))
    return {k: v.astype(dtype) for k, v in p.items()}


# --------------------------------------------------------------------------------------------
# LinearNO


def _linear_no_spec(use_temperature):
    def spec(c, n_head, d, m):
        s = {"in_project_x.weight": (c, n_head * d), "in_project_x.bias": (n_head * d,),
             "to_q.weight": (d, m), "to_k.weight": (d, m), "to_v.weight": (d, d),
             "to_out.0.weight": (n_head * d, c), "to_out.0.bias": (c,)}
        if use_temperature:
            s["temperature_q"] = (n_head,)
            s["temperature_k"] = (n_head,)
        return s
    return spec


def linear_no_attention_forward(x, params, *, n_head: int, use_temperature: bool = False,
                                tau_clamp=(0.01, 1.0)):
    r"""LinearNO: $Y_h = \mathrm{softmax}_M(X_hW_q)\,[\mathrm{softmax}_N(X_hW_k)^\top X_hW_v]$.

    $X_h$ are the heads of ``in_project_x(x)``; $M$ = ``key_ratio`` (upstream class default 4).
    Cost $O(NMD)$.

    Parameters
    ----------
    x : array (B, N, C)
    params : dict
        ``in_project_x.weight`` (C, H D) and ``.bias``; ``to_q.weight`` (D, M),
        ``to_k.weight`` (D, M), ``to_v.weight`` (D, D) (no bias, shared by heads);
        ``to_out.0.weight`` (H D, C), ``to_out.0.bias``; with ``use_temperature`` also
        ``temperature_q``, ``temperature_k`` (H,) (upstream ``(1, H, 1, 1)``, init 0.5).
    use_temperature : bool
        Upstream ``LinearNO_temp``: the logits are divided by the per-head temperatures clamped
        to ``tau_clamp`` (upstream ``(0.01, 1)``). ``LinearNO`` (default) has none.

    Notes
    -----
    Upstream takes $V$ from the same ``x_mid`` as $Q, K$ (LinearNO#2 discusses the paper's
    separate value projection); refattn follows the code.

    Backward: with $A = \Phi_q$, $S = \Phi_k^\top V$, $dA = G S^\top$, $dS = A^\top G$,
    $d\Phi_k = V\,dS^\top$, $dV = \Phi_k\,dS$; the two softmax VJPs run along different axes
    (over $M$ per point for $\Phi_q$, over the $N$ points per column for $\Phi_k$).
    """
    if not isinstance(use_temperature, (bool, np.bool_)):
        raise TypeError(f"use_temperature must be a bool; got {type(use_temperature).__name__}")
    x = as_float(x, "x", ndim=3)
    n_head = check_int(n_head, "n_head", minimum=1)
    if not isinstance(params, dict) or params.get("to_q.weight") is None:
        raise ValueError("params must be a dict containing 'to_q.weight' of shape (dim_head, key_ratio)")
    d, m = as_float(params["to_q.weight"], "to_q.weight", ndim=2).shape
    tau_clamp = check_tau_clamp(tau_clamp) if use_temperature else None
    p = check_params(params, _linear_no_spec(use_temperature)(x.shape[2], n_head, d, m))
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    xm = split_heads(linear_prefixed(p, "in_project_x", x), n_head)
    lq, lk, v = xm @ p["to_q.weight"], xm @ p["to_k.weight"], xm @ p["to_v.weight"]
    if use_temperature:
        phq, cq = tempered_softmax_forward(lq, p["temperature_q"], tau_clamp, -1)
        phk, ck = tempered_softmax_forward(lk, p["temperature_k"], tau_clamp, -2)
    else:
        (phq, _), (phk, _) = softmax_lse(lq, -1), softmax_lse(lk, -2)
        cq = ck = None
    s = swap_last(phk) @ v
    y = phq @ s
    ym = merge_heads(y)
    out = linear_prefixed(p, "to_out.0", ym)
    cache = {"x": x, "p": p, "n_head": n_head, "xm": xm, "phq": phq, "phk": phk, "v": v, "s": s,
             "ym": ym, "cq": cq, "ck": ck, "out_shape": out.shape}
    return out, cache


def linear_no_attention_backward(dout, cache):
    """Gradients of :func:`linear_no_attention_forward` (derivation in its docstring)."""
    x, p = cache["x"], cache["p"]
    dout = as_dout(dout, cache["out_shape"], x.dtype)
    grads = {}
    dy = split_heads(linear_prefixed_vjp(grads, p, "to_out.0", dout, cache["ym"]), cache["n_head"])
    phq, phk, v, s, xm = cache["phq"], cache["phk"], cache["v"], cache["s"], cache["xm"]
    dphq = dy @ swap_last(s)
    ds = swap_last(phq) @ dy
    dphk = v @ swap_last(ds)
    dv = phk @ ds
    if cache["cq"] is not None:
        dlq, grads["temperature_q"] = tempered_softmax_backward(dphq, cache["cq"])
        dlk, grads["temperature_k"] = tempered_softmax_backward(dphk, cache["ck"])
    else:
        dlq, dlk = softmax_vjp(phq, dphq, -1), softmax_vjp(phk, dphk, -2)
    dxm = 0.0
    for name, dl in (("to_q", dlq), ("to_k", dlk), ("to_v", dv)):
        grads[f"{name}.weight"] = np.einsum("bhni,bhno->io", xm, dl)
        dxm = dxm + dl @ p[f"{name}.weight"].T
    grads["x"] = linear_prefixed_vjp(grads, p, "in_project_x", merge_heads(dxm), x)
    return grads


def linear_no_attention(x, params, **config):
    """Convenience wrapper: the output of :func:`linear_no_attention_forward`."""
    return linear_no_attention_forward(x, params, **config)[0]


def linear_no_init_params(rng, dim: int, n_head: int = 8, dim_head: int = 64, key_ratio: int = 4,
                          use_temperature: bool = False, dtype=np.float64) -> dict:
    """PyTorch default linears (upstream applies no special init); temperatures 0.5."""
    p = init_linear_prefixed(rng, dim, n_head * dim_head, "in_project_x")
    p.update(init_linear_prefixed(rng, dim_head, key_ratio, "to_q", bias=False))
    p.update(init_linear_prefixed(rng, dim_head, key_ratio, "to_k", bias=False))
    p.update(init_linear_prefixed(rng, dim_head, dim_head, "to_v", bias=False))
    p.update(init_linear_prefixed(rng, n_head * dim_head, dim, "to_out.0"))
    if use_temperature:
        p["temperature_q"] = np.full(n_head, 0.5)
        p["temperature_k"] = np.full(n_head, 0.5)
    return {k: v.astype(dtype) for k, v in p.items()}


# --------------------------------------------------------------------------------------------
# GeoTransolver GALE


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
        The slice front as :func:`transolver_physics_attention_forward` (``in_project_x``,
        ``in_project_fx``, ``in_project_slice``, ``temperature`` (H,) — PhysicsNeMo stores
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


# --------------------------------------------------------------------------------------------
# Records


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


def _sample_linear_no(use_temperature):
    def sample(rng, size):
        n, c, h, d, m = slice_sizes(rng, size)
        params = perturb_params(rng, linear_no_init_params(rng, c, h, d, m, use_temperature))
        if use_temperature:
            params["temperature_q"] = rng.uniform(0.3, 0.9, h)
            params["temperature_k"] = rng.uniform(0.3, 0.9, h)
        return Sample(inputs={"x": rng.standard_normal((2, n, c))}, params=params,
                      config={"n_head": h, "use_temperature": use_temperature})
    return sample


def _linear_no_reference(x, params, *, n_head, use_temperature=False, tau_clamp=(0.01, 1.0)):
    # Explicit O(N^2) form Y = (Phi_q Phi_k^T) V.
    _, c = linear_no_attention_forward(x, params, n_head=n_head, use_temperature=use_temperature,
                                       tau_clamp=tau_clamp)
    y = (c["phq"] @ swap_last(c["phk"])) @ c["v"]
    return merge_heads(y) @ c["p"]["to_out.0.weight"] + c["p"]["to_out.0.bias"]


def _check_linear_no_temperature(rng):
    # The temperature variant checked by FD too (the default record has none).
    from ..testing.gradcheck import gradcheck
    return gradcheck(linear_no_attention_forward, linear_no_attention_backward,
                     _sample_linear_no(True)(rng, "tiny")).max_rel


def _check_linear_no_vs_transolver(rng):
    # LinearNO's core with q-logits = Transolver slice logits / tau and k-logits = log w reproduces
    # Transolver without slice attention (eps = 0) when V = f (to_v = I, x_mid = f).
    n, c, h, d, g = 9, 4, 2, 2, 3
    tp = perturb_params(rng, transolver_init_params(rng, c, h, d, g))
    x = rng.standard_normal((2, n, c))
    out_t, ct = transolver_physics_attention_forward(x, tp, n_head=h, slice_attention="identity",
                                                     slice_eps=0.0)
    fm = ct["front"]["fm"]
    lq = ct["front"]["sm"]["logits"] / ct["front"]["sm"]["tb"]
    lk = np.log(ct["w"])
    phq, _ = softmax_lse(lq, -1)
    phk, _ = softmax_lse(lk, -2)
    y = phq @ (swap_last(phk) @ fm)
    ref = merge_heads(y) @ tp["to_out.0.weight"] + tp["to_out.0.bias"]
    err = float(np.abs(out_t - ref).max())
    assert err < 1e-12, f"LinearNO form does not reproduce Transolver: {err}"
    return err


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
                    transolver_physics_attention_forward, _sample_transolver, slice_eps=0.0)},
    ),
    Mechanism(
        slug="linear_no_attention", family="3-operator", tier="T1",
        title="LinearNO: Physics-Attention recast as canonical linear attention",
        paper="Hu, Liu, Qiao, Sun, Dou, Transolver is a Linear Transformer, AAAI 2026, arXiv 2511.06294",
        forward=linear_no_attention_forward, backward=linear_no_attention_backward,
        sample=_sample_linear_no(False), reference=_linear_no_reference,
        docs="operator-attention.md#linearno",
        checks={"permutation_equivariance": check_point_permutation(linear_no_attention_forward,
                                                               _sample_linear_no(False)),
                "temperature_variant_gradcheck": _check_linear_no_temperature,
                "reproduces_transolver_without_slice_attention": _check_linear_no_vs_transolver,
                "uniform_refinement_invariance": check_uniform_refinement(linear_no_attention_forward,
                                                                   _sample_linear_no(False))},
    ),
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
