r"""Efficient Attention (Shen et al.): softmax over each query's features and over each key feature's
positions, so attention costs $O(Md\,d_v)$.

Shen, Zhang, Zhao, Yi, Li, "Efficient Attention: Attention with Linear Complexities", WACV 2021,
arXiv 1812.01243. Upstream: cmsflash/efficient-attention @ 46a5f9eaf09470affb0ab30932b7748cc3c871ef
``efficient_attention.py``. The full layer ``efficient_attention_layer_forward`` is its
``EfficientAttention`` module (1x1 convs ``keys``/``queries``/``values``/``reprojection``, residual);
a module written from it agrees in float64 within $1.3\times10^{-15}$ relative, output and every
gradient (``tests/test_fidelity_layers.py``).

$$E = \rho_q(Q)\,\big(\rho_k(K)^\top V\big)$$

``normalization="softmax"``: $\rho_q$ = softmax over the $d$ features of each query row, $\rho_k$ =
softmax over the $M$ positions of each key column (upstream ``keys.softmax(dim=2)`` over positions,
``queries.softmax(dim=1)`` over channels, in its ``(n, c, h*w)`` layout; scaomath/galerkin-transformer
``'linear'`` type). ``"scaling"``: $\rho_q(Y)=\rho_k(Y)=Y/\sqrt M$, i.e. exactly $(QK^\top/M)V$.
No extra normaliser, no $1/\sqrt d$; non-causal. Layouts as the linear family
(`refattn.attention.linear.core`): ``q (..., N, d)``, ``k (..., M, d)``, ``v (..., M, dv)``.

Backward
--------
With $S = \rho_k^\top V$ and upstream $G$: $dS = \rho_q^\top G$, $d\rho_q = G S^\top$,
$d\rho_k = V\,dS^\top$, $dV = \rho_k\,dS$, then two softmax VJPs
$dx = p\odot(dp - \sum p\odot dp)$ along different axes (features for $Q$, positions for $K$), or
the factor $M^{-1/2}$ for ``"scaling"``.
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_choice, check_int, check_params, compute_dtype
from ...nn.conv import conv_apply, conv_vjp
from ...nn.softmax import softmax_lse, softmax_vjp
from ...registry import Mechanism, Sample, register
from ._samples import fd_max_rel, random_qkv
from .core import mT, validate_linear_qkv

__all__ = ["efficient_attention_forward", "efficient_attention_backward", "efficient_attention",
           "efficient_attention_layer_forward", "efficient_attention_layer_backward", "efficient_attention_layer"]


def efficient_attention_forward(q, k, v, *, normalization: str = "softmax"):
    r"""Efficient Attention (Shen, Zhang, Zhao, Yi, Li, WACV 2021, arXiv 1812.01243).

    $$E = \rho_q(Q)\,\big(\rho_k(K)^\top V\big)$$

    ``normalization="softmax"``: $\rho_q$ = softmax over the $d$ features of each query row,
    $\rho_k$ = softmax over the $M$ positions of each key column (cmsflash/efficient-attention
    ``efficient_attention.py``: ``keys.softmax(dim=2)`` over positions, ``queries.softmax(dim=1)``
    over channels, in its ``(n, c, h*w)`` layout; scaomath/galerkin-transformer ``'linear'``
    type). ``"scaling"``: $\rho_q(Y)=\rho_k(Y)=Y/\sqrt M$, i.e. exactly $(QK^\top/M)V$.
    No extra normaliser, no $1/\sqrt d$. Cost $O(Md\,d_v)$; non-causal.

    Backward: $dS = \rho_q^\top G$, $d\rho_q = G S^\top$, $d\rho_k = V\,dS^\top$,
    $dV = \rho_k\,dS$ ($S = \rho_k^\top V$), then two softmax VJPs
    $dx = p\odot(dp - \sum p\odot dp)$ along different axes (features for $Q$, positions for $K$).
    """
    check_choice(normalization, "normalization", ("softmax", "scaling"))
    q, k, v = validate_linear_qkv(q, k, v)
    if normalization == "softmax":
        rq, _ = softmax_lse(q, axis=-1)
        rk, _ = softmax_lse(k, axis=-2)
    else:
        c = k.shape[-2] ** -0.5  # a Python float keeps float32
        rq, rk = q * c, k * c
    S = mT(rk) @ v
    out = rq @ S
    return out, {"rq": rq, "rk": rk, "v": v, "S": S, "norm": normalization, "out_shape": out.shape}


def efficient_attention_backward(dout, cache):
    r"""Gradients ``{"q", "k", "v"}`` of :func:`efficient_attention_forward` (see its docstring)."""
    rq, rk, v, S = cache["rq"], cache["rk"], cache["v"], cache["S"]
    g = as_dout(dout, cache["out_shape"], rq.dtype)
    drq = g @ mT(S)
    dS = mT(rq) @ g
    drk = v @ mT(dS)
    dv = rk @ dS
    if cache["norm"] == "softmax":
        dq = softmax_vjp(rq, drq, axis=-1)
        dk = softmax_vjp(rk, drk, axis=-2)
    else:
        c = rk.shape[-2] ** -0.5
        dq, dk = drq * c, drk * c
    return {"q": dq, "k": dk, "v": dv}


def efficient_attention(q, k, v, *, normalization: str = "softmax") -> np.ndarray:
    """Convenience wrapper: the output of :func:`efficient_attention_forward`."""
    return efficient_attention_forward(q, k, v, normalization=normalization)[0]


# --------------------------------------------------------------------------------------------
# The full layer (upstream EfficientAttention)


def efficient_attention_layer_forward(x, params, *, head_count: int, residual: bool = True,
                                      normalization: str = "softmax"):
    r"""Efficient Attention layer: upstream ``EfficientAttention`` (cmsflash/efficient-attention
    ``efficient_attention.py``) on an image ``x (B, C, H, W)``.

    $$K = \mathrm{keys}(x),\ Q = \mathrm{queries}(x),\ V = \mathrm{values}(x)\ (\text{1x1 convs}),\qquad
    Y = \mathrm{reprojection}\big([E(Q_h, K_h, V_h)]_h\big) + x,$$

    heads the contiguous channel blocks (head $h$: key channels $h\,d_k:(h+1)\,d_k$, value channels
    likewise), positions the $H W$ pixels in row-major order, $E$ :func:`efficient_attention_forward`
    (softmax over each position's $d_k$ key-channel block of $Q$, over the positions of each key
    channel of $K$).

    Parameters
    ----------
    x : array (B, C, H, W)
    params : dict
        Upstream ``state_dict`` names, PyTorch ``Conv2d`` layout (`refattn.nn.conv`):
        ``keys.weight (C_k, C, 1, 1)``, ``queries.weight (C_k, C, 1, 1)``, ``values.weight
        (C_v, C, 1, 1)``, ``reprojection.weight (C, C_v, 1, 1)`` and their ``.bias`` (optional;
        upstream has them). A checkpoint maps over unchanged.
    head_count : int
        Upstream ``head_count``; must divide $C_k$ and $C_v$.
    residual : bool
        Upstream adds the input (``reprojected_value + input_``): True.
    normalization : {"softmax", "scaling"}
        As :func:`efficient_attention_forward` (upstream: softmax).

    Backward
    --------
    $dx$ starts at $G$ (residual); ``reprojection``'s VJP gives $dE$; the core's VJP gives
    $dQ, dK, dV$ per head; the three 1x1 convolution VJPs add into $dx$ and give the weight and
    bias gradients.
    """
    x = as_float(x, "x", ndim=4)
    nh = check_int(head_count, "head_count", minimum=1)
    if not isinstance(residual, (bool, np.bool_)):
        raise TypeError(f"residual must be a bool; got {type(residual).__name__}")
    b, c, hh, ww = x.shape
    if not isinstance(params, dict) or "keys.weight" not in params or "values.weight" not in params:
        raise ValueError("params must be a dict with keys.weight (C_k, C, 1, 1) and values.weight (C_v, C, 1, 1)")
    ck, cv = np.shape(params["keys.weight"])[0], np.shape(params["values.weight"])[0]
    if ck % nh or cv % nh:
        raise ValueError(f"head_count={nh} must divide the key channels ({ck}) and value channels ({cv})")
    spec = {"keys.weight": (ck, c, 1, 1), "keys.bias": (ck,), "queries.weight": (ck, c, 1, 1), "queries.bias": (ck,),
            "values.weight": (cv, c, 1, 1), "values.bias": (cv,), "reprojection.weight": (c, cv, 1, 1),
            "reprojection.bias": (c,)}
    p = check_params(params, spec, optional=tuple(k for k in spec if k.endswith(".bias")),
                     where="efficient_attention_layer")
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)

    def heads(name, width):  # (B, width*nh, H, W) -> (B, nh, HW, width)
        return conv_apply(x, p[f"{name}.weight"], p.get(f"{name}.bias")).reshape(b, nh, width, hh * ww).swapaxes(-1, -2)

    q, k, v = heads("queries", ck // nh), heads("keys", ck // nh), heads("values", cv // nh)
    e, core = efficient_attention_forward(q, k, v, normalization=normalization)
    agg = e.swapaxes(-1, -2).reshape(b, cv, hh, ww)
    y = conv_apply(agg, p["reprojection.weight"], p.get("reprojection.bias"))
    if residual:
        y = y + x
    return y, {"x": x, "p": p, "core": core, "agg": agg, "residual": bool(residual), "nh": nh, "shape": y.shape}


def efficient_attention_layer_backward(dout, cache):
    """Gradients of :func:`efficient_attention_layer_forward` for ``x`` and every params key."""
    x, p, nh = cache["x"], cache["p"], cache["nh"]
    g = as_dout(dout, cache["shape"], x.dtype)
    b, c, hh, ww = x.shape
    grads = {}
    gr = conv_vjp(g, cache["agg"], p["reprojection.weight"], has_bias="reprojection.bias" in p)
    cv = cache["agg"].shape[1]
    gc = efficient_attention_backward(gr["x"].reshape(b, nh, cv // nh, hh * ww).swapaxes(-1, -2), cache["core"])
    dx = g.copy() if cache["residual"] else np.zeros_like(x)
    for key, name in (("q", "queries"), ("k", "keys"), ("v", "values"), (None, "reprojection")):
        if key is None:
            gg = gr
        else:
            du = gc[key].swapaxes(-1, -2).reshape(b, -1, hh, ww)
            gg = conv_vjp(du, x, p[f"{name}.weight"], has_bias=f"{name}.bias" in p)
            dx += gg["x"]
        grads[f"{name}.weight"] = gg["weight"]
        if f"{name}.bias" in p:
            grads[f"{name}.bias"] = gg["bias"]
    grads["x"] = dx
    return grads


def efficient_attention_layer(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`efficient_attention_layer_forward`."""
    return efficient_attention_layer_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _efficient_reference(q, k, v, *, normalization="softmax"):
    q, k, v = validate_linear_qkv(q, k, v)
    if normalization == "scaling":
        return (q @ mT(k) / k.shape[-2]) @ v
    rq = np.exp(q - q.max(-1, keepdims=True))
    rq /= rq.sum(-1, keepdims=True)
    rk = np.exp(k - k.max(-2, keepdims=True))
    rk /= rk.sum(-2, keepdims=True)
    return (rq @ mT(rk)) @ v


def _sample_efficient(rng, size):
    q, k, v = random_qkv(rng, size, same_length=False)
    return Sample(inputs={"q": q, "k": k, "v": v},
                  config={"normalization": "softmax" if rng.random() < 0.7 else "scaling"})


def _check_efficient_scaling_dense(rng):
    q, k, v = random_qkv(rng, "small", same_length=False)
    a = efficient_attention(q, k, v, normalization="scaling")
    b = (q @ mT(k) / k.shape[-2]) @ v
    err = float(np.max(np.abs(a - b)))
    assert err < 1e-12
    return err


def _check_efficient_fd_both(rng):
    errs = []
    for norm in ("softmax", "scaling"):
        q, k, v = random_qkv(rng, "tiny", same_length=False)
        s = Sample(inputs={"q": q, "k": k, "v": v}, config={"normalization": norm})
        errs.append(fd_max_rel(efficient_attention_forward, efficient_attention_backward, s))
    return max(errs)


def _check_efficient_layer_gradcheck(rng):
    """The full layer (keys/queries/values/reprojection 1x1 convs, residual): FD gradcheck of x and
    every parameter, 2 heads with C_k != C_v."""
    from ...testing import gradcheck

    c, ck, cv = 2, 4, 2
    params = {"keys.weight": rng.standard_normal((ck, c, 1, 1)), "keys.bias": 0.2 * rng.standard_normal(ck),
              "queries.weight": rng.standard_normal((ck, c, 1, 1)), "queries.bias": 0.2 * rng.standard_normal(ck),
              "values.weight": rng.standard_normal((cv, c, 1, 1)), "values.bias": 0.2 * rng.standard_normal(cv),
              "reprojection.weight": rng.standard_normal((c, cv, 1, 1)),
              "reprojection.bias": 0.2 * rng.standard_normal(c)}
    s = Sample(inputs={"x": rng.standard_normal((2, c, 2, 3))}, params=params, config={"head_count": 2})
    return gradcheck(efficient_attention_layer_forward, efficient_attention_layer_backward, s).max_rel


register(
    Mechanism(
        slug="efficient_attention_shen", family="4-linear-kernel-sparse", tier="T1",
        title="Efficient Attention: softmax over query features and over key positions",
        paper="Shen, Zhang, Zhao, Yi, Li, 'Efficient Attention: Attention with Linear Complexities', "
              "WACV 2021, arXiv 1812.01243",
        forward=efficient_attention_forward, backward=efficient_attention_backward,
        sample=_sample_efficient, reference=_efficient_reference,
        checks={"scaling_variant_equals_dense_QKt_over_n": _check_efficient_scaling_dense,
                "gradcheck_both_normalizations": _check_efficient_fd_both,
                "layer_gradcheck": _check_efficient_layer_gradcheck},
        docs="linear-attention.md#efficient-attention-shen",
    ),
)
