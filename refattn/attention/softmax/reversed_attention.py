r"""Reversed ("sending") attention of DependencyViT: each child token distributes its message over
its parents, and receivers sum what they are sent.

Per head $h$ (width $d$, $s = d^{-1/2}$), rows of $A$ are children $i$, columns parents $j$:

$$A_h = \mathrm{softmax}_j(s\,Q_hK_h^\top),\qquad
O_{h,j} = \sum_i A_{h,ij}\;p_{h,i}\,m_i\,v_{h,i}\quad(O_h = A_h^\top\tilde V_h),$$
$$p_{\cdot,i} = \mathrm{softmax}_h\big(x_iW_{hs}/\tau\big)\ (\text{head selector}),\qquad
m_i = m^{in}_i\,\sigma\big(\mathrm{GELU}(x_iW_1)W_2\big)\ (\text{message controller}),$$

$Y = [O_1\|\dots\|O_H]W_p + b_p$. A child's distribution over parents is normalised (rows of $A$
sum to one) but a parent's incoming mass is not: $\sum_j O_{h,j} = \sum_i \tilde v_{h,i}$ (mass
conservation), and the column sums of $A$ measure how much each token receives. The message
weights $m$ are cumulative over layers ($m^{in}$ is the previous layer's $m$, 1 at the first
layer); the layer returns its $m$ in ``cache["m"]`` for the next one, and the backward takes an
optional upstream gradient ``dm`` on it. Leaf tokens that send little (small $m$) are what
DependencyViT-Lite prunes.

Backward
--------
With $\tilde V = (p\,m)\odot V$ and $G = dO$: $dA = \tilde V G^\top$ (i.e. $dA_{ij} = \tilde v_i\cdot g_j$),
$d\tilde V = A\,G$; then $dV = (p\,m)\odot d\tilde V$, $dc_{h,i} = \langle d\tilde v_{h,i}, v_{h,i}\rangle$,
$dp = dc\,m$, $dm = \sum_h dc\,p + dm^{up}$. The row-softmax VJP of $A$ and the score
derivatives are the attention core's (`attention_core_backward` with ``dp=dA``; its value path is
unused). The head selector is a softmax over heads (`softmax_vjp` along the head axis, divided by
$\tau$); the controller is $\sigma'$, `gelu_grad` and two `linear_vjp`s; $dm^{in} = dm\,\sigma$.

Sources
-------
Paper: Mingyu Ding et al., "Visual Dependency Transformers: Dependency
Tree Emerges from Reversed Attention", CVPR 2023, arXiv 2304.03282. The official repository
named in the paper, dingmyu/DependencyViT @ 3dcf35910bfc9f013f752a09aa99b56f21e2ee78, holds only a
LICENSE and a .gitignore. The layer here follows the from-scratch timm port,
huggingface/pytorch-image-models ``timm/models/dependencyvit.py`` (``ReversedAttention``) @
f63d2e8071666d631909dc5bda553b13daf9dbcc, a side branch whose own header says it is not yet
verified against a reference implementation (none is public): head selector ``Linear(C, H, bias=False)`` with temperature 0.1 (the
paper's appendix D.1), message controller ``Mlp(C, C/2, 1, GELU, bias=False)``, ``qkv`` without
bias, ``proj`` with bias. Parameter names are that port's. ``head_selector`` and
``message_controller`` switch the two factors off (the bare reversed attention $A^\top V$).
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_param_keys, check_params, check_positive, compute_dtype
from ...nn.activations import gelu, gelu_grad, sigmoid
from ...nn.linear import linear_apply, linear_vjp, merge_heads, split_heads
from ...nn.softmax import softmax_lse, softmax_vjp
from ...registry import Mechanism, Sample, register
from .core import attention_core_backward, attention_core_forward, check_size

__all__ = ["reversed_attention_forward", "reversed_attention_backward", "reversed_attention",
           "init_reversed_attention_params"]


def _validate(x, params, h, head_selector, message_controller):
    c = x.shape[-1]
    if c % h:
        raise ValueError(f"the width C={c} of x must be a multiple of num_heads={h}")
    spec = {"qkv.weight": (c, 3 * c), "qkv.bias": (3 * c,), "proj.weight": (c, c), "proj.bias": (c,)}
    optional = ["qkv.bias", "proj.bias"]
    if head_selector:
        spec["head_selector.weight"] = (c, h)
    if message_controller:
        spec["message_controller.fc1.weight"] = (c, c // 2)
        spec["message_controller.fc2.weight"] = (c // 2, 1)
    check_param_keys(params, [k for k in spec if k not in optional], optional,
                     where="reversed_attention_dependencyvit (weights (in, out); PyTorch: weight.T)")
    return check_params(params, spec, optional=optional, where="reversed_attention_dependencyvit")


def reversed_attention_forward(x, params, m=None, *, num_heads: int, head_selector: bool = True,
                               message_controller: bool = True, head_selector_temperature: float = 0.1,
                               scale=None):
    r"""DependencyViT reversed attention layer: $O_h = A_h^\top\big((p_h m)\odot V_h\big)$.

    Parameters
    ----------
    x : array (B.., N, C)
    params : dict
        timm port names, weights ``(in, out)``: ``"qkv.weight" (C, 3C)`` (columns ``(3, H, d)``),
        optional ``"qkv.bias"``, ``"proj.weight" (C, C)``, optional ``"proj.bias"``; with
        ``head_selector``: ``"head_selector.weight" (C, H)``; with ``message_controller``:
        ``"message_controller.fc1.weight" (C, C//2)``, ``"message_controller.fc2.weight" (C//2, 1)``.
    m : array (B.., N), optional
        Cumulative message weights of the previous layers (default 1).
    num_heads : int
    head_selector, message_controller : bool
        Include the head-selector softmax $p$ / the controller gate $\sigma(\cdot)$ (timm: both).
    head_selector_temperature : float > 0
        $\tau$ (0.1).
    scale : float > 0, optional
        Default $d^{-1/2}$.

    Returns
    -------
    out, cache
        ``out (B.., N, C)``; ``cache["m"]`` is this layer's cumulative $m$ (B.., N).
    """
    x = as_float(x, "x", min_ndim=2)
    h = check_size(num_heads, "num_heads")
    for name, val in (("head_selector", head_selector), ("message_controller", message_controller)):
        if not isinstance(val, (bool, np.bool_)):
            raise TypeError(f"{name} must be a bool; got {type(val).__name__}")
    tau = check_positive(head_selector_temperature, "head_selector_temperature")
    scale = check_positive(scale, "scale", allow_none=True)
    if params is None:
        raise TypeError("params is required: a dict with qkv.weight, proj.weight and the selector/controller weights")
    p = _validate(x, params, h, head_selector, message_controller)
    if m is not None:
        m = as_float(m, "m", ndim=x.ndim - 1)
        if m.shape != x.shape[:-1]:
            raise ValueError(f"m must have shape {x.shape[:-1]} (one weight per token); got {m.shape}")
    dt = compute_dtype(x, m, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    c = x.shape[-1]
    d = c // h
    qkv = linear_apply(x, p["qkv.weight"], p.get("qkv.bias"))
    q, k, v = (split_heads(qkv[..., i * c:(i + 1) * c], h, d) for i in range(3))
    sel = hs_logits = None
    if head_selector:
        hs_logits = linear_apply(x, p["head_selector.weight"]) / tau
        sel, _ = softmax_lse(hs_logits, axis=-1)                       # (B.., N, H)
    u = gate = None
    m_in = np.ones(x.shape[:-1], dt) if m is None else m.astype(dt, copy=False)
    if message_controller:
        u = linear_apply(x, p["message_controller.fc1.weight"])
        gate = sigmoid(linear_apply(gelu(u), p["message_controller.fc2.weight"])[..., 0])
        m_out = m_in * gate
    else:
        m_out = m_in.copy()
    coef = m_out[..., None, :] * (1.0 if sel is None else np.swapaxes(sel, -1, -2))   # (B.., H, N)
    vt = coef[..., None] * v
    zeros = np.zeros(v.shape[:-1] + (1,), dt)
    _, core = attention_core_forward(q, k, zeros, scale=scale)
    a = core["p"]
    o = np.swapaxes(a, -1, -2) @ vt
    oc = merge_heads(o)
    y = linear_apply(oc, p["proj.weight"], p.get("proj.bias"))
    cache = {"x": x, "p": p, "q": q, "k": k, "v": v, "sel": sel, "tau": tau, "u": u, "gate": gate, "m_in": m_in,
             "m_given": m is not None, "m": m_out, "coef": coef, "vt": vt, "core": core, "oc": oc, "h": h, "d": d,
             "y_shape": y.shape}
    return y, cache


def reversed_attention_backward(dout, cache, *, dm=None):
    r"""Gradient of :func:`reversed_attention_forward`: ``x``, every params key and ``m`` (when given).

    ``dm`` (optional, shape (B.., N)) is an upstream gradient on ``cache["m"]``, the layer's
    cumulative message weights passed on to the next layer."""
    p, x, core = cache["p"], cache["x"], cache["core"]
    dt = x.dtype
    g = as_dout(dout, cache["y_shape"], dt)
    grads = {}
    go = linear_vjp(g, cache["oc"], p["proj.weight"], "proj.bias" in p)
    grads["proj.weight"] = go["weight"]
    if "proj.bias" in p:
        grads["proj.bias"] = go["bias"]
    do = split_heads(go["x"], cache["h"], cache["d"])
    a, vt, v, coef = core["p"], cache["vt"], cache["v"], cache["coef"]
    da = vt @ np.swapaxes(do, -1, -2)
    dvt = a @ do
    dv = coef[..., None] * dvt
    dcoef = np.sum(dvt * v, axis=-1)                                    # (B.., H, N)
    gc = attention_core_backward(np.zeros(core["out"].shape, dt), core, dp=da)
    dqkv = np.concatenate([merge_heads(gc["q"]), merge_heads(gc["k"]), merge_heads(dv)], axis=-1)
    gq = linear_vjp(dqkv, x, p["qkv.weight"], "qkv.bias" in p)
    dx = gq["x"]
    grads["qkv.weight"] = gq["weight"]
    if "qkv.bias" in p:
        grads["qkv.bias"] = gq["bias"]
    m_out, sel = cache["m"], cache["sel"]
    if sel is None:
        dm_out = np.sum(dcoef, axis=-2)
    else:
        dm_out = np.sum(dcoef * np.swapaxes(sel, -1, -2), axis=-2)
        dsel = np.swapaxes(dcoef * m_out[..., None, :], -1, -2)          # (B.., N, H)
        dlog = softmax_vjp(sel, dsel, axis=-1) / cache["tau"]
        gh = linear_vjp(dlog, x, p["head_selector.weight"], False)
        dx = dx + gh["x"]
        grads["head_selector.weight"] = gh["weight"]
    if dm is not None:
        dm_out = dm_out + as_dout(dm, m_out.shape, dt, name="dm")
    if cache["gate"] is None:
        dm_in = dm_out
    else:
        gate, u = cache["gate"], cache["u"]
        dz = (dm_out * cache["m_in"] * gate * (1.0 - gate))[..., None]
        g2 = linear_vjp(dz, gelu(u), p["message_controller.fc2.weight"], False)
        g1 = linear_vjp(g2["x"] * gelu_grad(u), x, p["message_controller.fc1.weight"], False)
        dx = dx + g1["x"]
        grads["message_controller.fc1.weight"], grads["message_controller.fc2.weight"] = g1["weight"], g2["weight"]
        dm_in = dm_out * gate
    grads["x"] = dx
    if cache["m_given"]:
        grads["m"] = dm_in
    return grads


def reversed_attention(x, params, m=None, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`reversed_attention_forward`."""
    return reversed_attention_forward(x, params, m, **config)[0]


def init_reversed_attention_params(rng, c: int, num_heads: int, *, head_selector: bool = True,
                                   message_controller: bool = True, qkv_bias: bool = False) -> dict:
    """Random parameters under the timm port's names (PyTorch-default-like uniform weights)."""
    def w(i, o):
        return rng.uniform(-1, 1, (i, o)) / np.sqrt(i)

    p = {"qkv.weight": w(c, 3 * c), "proj.weight": w(c, c), "proj.bias": rng.uniform(-1, 1, c) / np.sqrt(c)}
    if qkv_bias:
        p["qkv.bias"] = 0.1 * rng.standard_normal(3 * c)
    if head_selector:
        p["head_selector.weight"] = 0.1 * w(c, num_heads)
    if message_controller:
        p["message_controller.fc1.weight"] = w(c, c // 2)
        p["message_controller.fc2.weight"] = w(c // 2, 1)
    return p


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size):
    if size == "tiny":
        n, c, h = int(rng.integers(2, 4)), 4, 2
    else:
        n, c, h = int(rng.integers(4, 8)), 8, 2
    hs, mc = bool(rng.random() < 0.8), bool(rng.random() < 0.8)
    inputs = {"x": rng.standard_normal((2, n, c))}
    if rng.random() < 0.5:
        inputs["m"] = rng.uniform(0.3, 1.0, (2, n))
    params = init_reversed_attention_params(rng, c, h, head_selector=hs, message_controller=mc,
                                            qkv_bias=bool(rng.random() < 0.5))
    cfg = {"num_heads": h, "head_selector": hs, "message_controller": mc}
    return Sample(inputs=inputs, params=params, config=cfg)


def _reference(x, params, m=None, *, num_heads, head_selector=True, message_controller=True,
               head_selector_temperature=0.1, scale=None):
    # timm's ReversedAttention.forward written as explicit sums over senders i and receivers j
    from scipy.special import erf

    b, n, c = x.shape
    d = c // num_heads
    s = d ** -0.5 if scale is None else scale
    qkv = (x @ params["qkv.weight"] + params.get("qkv.bias", 0.0)).reshape(b, n, 3, num_heads, d)
    mm = np.ones((b, n)) if m is None else m
    if message_controller:
        u = x @ params["message_controller.fc1.weight"]
        z = (0.5 * u * (1 + erf(u / np.sqrt(2)))) @ params["message_controller.fc2.weight"]
        mm = mm / (1 + np.exp(-z[..., 0]))
    out = np.zeros((b, n, c))
    for bb in range(b):
        sel = np.ones((n, num_heads))
        if head_selector:
            lg = x[bb] @ params["head_selector.weight"] / head_selector_temperature
            sel = np.exp(lg - lg.max(-1, keepdims=True))
            sel /= sel.sum(-1, keepdims=True)
        for hh in range(num_heads):
            q, k, v = qkv[bb, :, 0, hh], qkv[bb, :, 1, hh], qkv[bb, :, 2, hh]
            for i in range(n):                       # child i sends to every parent j
                lg = s * k @ q[i]
                a = np.exp(lg - lg.max())
                a /= a.sum()
                for j in range(n):
                    out[bb, j, hh * d:(hh + 1) * d] += a[j] * sel[i, hh] * mm[bb, i] * v[i]
    return out @ params["proj.weight"] + params.get("proj.bias", 0.0)


def _check_mass_conservation(rng):
    x = rng.standard_normal((2, 6, 8))
    p = init_reversed_attention_params(rng, 8, 2)
    _, c = reversed_attention_forward(x, p, rng.uniform(0.2, 1, (2, 6)), num_heads=2)
    o = split_heads(c["oc"], 2, 4)
    err = float(np.abs(o.sum(axis=-2) - c["vt"].sum(axis=-2)).max())
    incoming = c["core"]["p"].sum(axis=-2)          # column sums: each receiver's incoming mass
    err = max(err, abs(float(incoming.sum(axis=-1).max()) - 6.0), abs(float(incoming.sum(axis=-1).min()) - 6.0))
    assert err < 1e-12, err
    return err


def _check_bare_is_transposed_attention(rng):
    # without selector and controller the layer is A^T V: the adjoint of ordinary attention's P V
    from .sdpa import sdpa_backward, sdpa_forward

    x = rng.standard_normal((2, 5, 4))
    p = init_reversed_attention_params(rng, 4, 2, head_selector=False, message_controller=False)
    _, c = reversed_attention_forward(x, p, num_heads=2, head_selector=False, message_controller=False)
    o = split_heads(c["oc"], 2, 2)
    _, cs = sdpa_forward(c["q"], c["k"], np.zeros_like(c["v"]))
    # <A^T V, G> = <V, A G>: the value gradient of SDPA with upstream G is A^T G
    err = float(np.abs(o - sdpa_backward(c["v"], cs)["v"]).max())
    assert err < 1e-12, err
    return err


def _check_message_gradient(rng):
    # the extra upstream gradient dm on the returned m: compare with central differences
    x = rng.standard_normal((2, 4, 4))
    m0 = rng.uniform(0.3, 1, (2, 4))
    p = init_reversed_attention_params(rng, 4, 2)
    gy, gm = rng.standard_normal((2, 4, 4)), rng.standard_normal((2, 4))

    def loss(xx, mm):
        y, c = reversed_attention_forward(xx, p, mm, num_heads=2)
        return float(np.sum(y * gy) + np.sum(c["m"] * gm))

    _, c = reversed_attention_forward(x, p, m0, num_heads=2)
    g = reversed_attention_backward(gy, c, dm=gm)
    eps, err = 1e-6, 0.0
    for arr, key in ((x, "x"), (m0, "m")):
        for idx in np.ndindex(arr.shape):
            a1, a2 = arr.copy(), arr.copy()
            a1[idx] += eps
            a2[idx] -= eps
            args1 = (a1, m0) if key == "x" else (x, a1)
            args2 = (a2, m0) if key == "x" else (x, a2)
            fd = (loss(*args1) - loss(*args2)) / (2 * eps)
            err = max(err, abs(fd - g[key][idx]) / max(1.0, abs(fd)))
    assert err < 1e-7, err
    return err


register(
    Mechanism(
        slug="reversed_attention_dependencyvit", family="1-softmax", tier="T2",
        title="Reversed (sending) attention of DependencyViT with head selector and message controller",
        paper="Mingyu Ding et al., Visual Dependency Transformers: Dependency Tree Emerges "
              "from Reversed Attention, CVPR 2023, arXiv 2304.03282",
        official_code="dingmyu/DependencyViT (empty); huggingface/pytorch-image-models timm/models/dependencyvit.py",
        forward=reversed_attention_forward, backward=reversed_attention_backward, sample=_sample,
        reference=_reference, docs="softmax/qkv-variants.md#reversed-attention-dependencyvit",
        checks={"mass_conservation": _check_mass_conservation,
                "bare_is_transposed_attention": _check_bare_is_transposed_attention,
                "message_gradient": _check_message_gradient},
    ),
)
