r"""MindSkip (Router-Tuning): attention with dynamic depth — a router decides whether to run it.

He, Ge, Sun, Tian, Wang, Yu, "Router-Tuning: A Simple and Effective Approach for Enabling
Dynamic-Depth in Transformers", EMNLP 2025, arXiv 2410.13184. Upstream: CASE-Lab-UMD/Router-Tuning-
Mixture-of-Depths ``utils/model/model_patch.py`` (``_compute_routing_state``,
``_apply_routing_mask``, ``_patched_decoder_layer_forward``, ``STEFunction``) @
772c16005e05ccdbaf9ddb263a9b8d8b27b47b4b, and the earlier
``ckpt/llama3-8b-minskip/modeling_llama_mod.py`` (``LlamaMindSkipDecoderLayer.mindskip_attn``) @
6ec13c528a46d4fd747c5307ea22c4bebbcc084b. T3 entry: the code defines the mechanism; the choices it
leaves open are keywords and marked "reconstruction" below.

Forward
-------
For a decoder layer's input $x$ (``(..., N, C)``), its pre-attention norm $\hat x = N(x)$ (LLaMA's
RMSNorm ``input_layernorm``), a router $w_r\in\mathbb R^{C}$ (``router.weight (C, 1)``, no bias) and
a threshold $\tau$ (0.5):

$$z = \bar{\hat x}\,w_r,\qquad s = \sigma(z),\qquad m = \mathbb 1[s-\tau\ge 0],\qquad
y = x + m\odot\mathrm{Attn}(\hat x),$$

with $\bar{\hat x}$ the mean of $\hat x$ over the tokens of a sequence (``route_level="sequence"``,
MindSkip's ``attn_sequence`` default: the whole sequence skips the attention or not) or $\hat x$
itself (``"token"``, ``attn_token``: a per-token skip). Skipped sequences are not computed upstream
(their rows are gathered out); the result is the same. The attention is any token mixer
(`refattn.blocks.core` protocol; default ``"multi_head_attention"``) with its keys under
``"self_attn."``; passing an MLP pair instead gives upstream's ``mlp`` route target. The
*capacity* is $\bar m$ (the fraction of routed units); the router's regulariser is
$L_{cap} = \lambda\,\bar m$ (the earlier file) or $\lambda\,\mathrm{relu}(\bar m - c^*)$ with a
target capacity $c^*$ (current file), $\lambda$ = ``gradient_scale``.

Backward
--------
Everything but the router, with the mask held fixed: $dx = dy + J_N^\top J_{Attn}^\top(m\odot dy)$
(the attention's own backward, the RMSNorm VJP). The mask is a step function of the router, so
its exact derivative is zero (``estimator="fixed"``: the router gets a zero gradient; this is
what the finite-difference checks verify). Upstream trains the router with a straight-through
estimator, $\partial m/\partial s := 1$ (``STEFunction``: forward $\mathbb 1[\cdot\ge0]$, backward
identity), which is ``estimator="ste"`` (the default):

$$dm = \sum \langle dy, \mathrm{Attn}(\hat x)\rangle + \lambda'\,\frac{\partial L_{cap}}{\partial m},\qquad
dz = dm\,s(1-s),\qquad dw_r = \bar{\hat x}^\top dz,\qquad d\hat x \mathrel{+}= dz\,w_r^\top/N_{pool},$$

the sums over the unit a mask covers (sequence: tokens and channels; token: channels), $\lambda'$
= ``dcapacity_loss`` and $N_{pool}$ the tokens averaged (1 for token routing). The STE gradient is
not the derivative of the forward, so no finite difference can check it; the named check
``ste_router_gradient`` compares it with this formula evaluated independently, and the scratch
parity run compares it with upstream's autograd.

Conventions (reconstruction where marked)
-----------------------------------------
``threshold`` 0.5, ``route_level`` ``"sequence"``, ``estimator`` ``"ste"``, ``norm`` ``"rms"``
with ``eps`` 1e-5 (LLaMA-3's ``rms_norm_eps``; ``"layer"``/``"none"`` for other models),
``target_capacity`` None (earlier $\lambda\bar m$ form) and ``gradient_scale`` 0 (upstream
default; the paper's runs set it). Only the attention half of a decoder layer is the mechanism;
the MLP half that follows is a plain pre-norm residual (reconstruction: the layer boundary).
Router-Tuning freezes every weight but the router: use the router's gradient only.

Agreement with upstream
-----------------------
Upstream's ``_compute_routing_state`` + ``_apply_routing_mask`` with ``STEFunction`` (training
mode) around a PyTorch multi-head attention with refattn's ``multi_head_attention`` weights and
``LlamaRMSNorm``, in float64 on CPU, sequence and token routing, with the $\mathrm{relu}(\bar m - c^*)$
loss: output, capacity, loss and every gradient of $\langle G, y\rangle + L_{cap}$ (``x``, the
norm weight, the router (STE), all attention weights) agree to $1.6\times10^{-15}$ relative (the
key bias, whose gradient vanishes in exact arithmetic, to round-off).
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_choice, check_positive
from ..nn.activations import sigmoid
from ..registry import Mechanism, Sample, register
from .core import (
    add_prefix,
    block_dtype,
    init_attention_params,
    norm_backward,
    norm_forward,
    norm_spec,
    resolve_sublayer,
    split_block_params,
)

__all__ = ["mindskip_attention_forward", "mindskip_attention_backward", "mindskip_attention", "MINDSKIP_ESTIMATORS",
           "MINDSKIP_ROUTE_LEVELS"]

MINDSKIP_ESTIMATORS = ("ste", "fixed")
MINDSKIP_ROUTE_LEVELS = ("sequence", "token")


def mindskip_attention_forward(x, params, *, attention=None, attention_config=None, route_level: str = "sequence",
                               threshold: float = 0.5, estimator: str = "ste", norm: str = "rms", eps: float = 1e-5,
                               target_capacity=None, gradient_scale: float = 0.0):
    r"""MindSkip attention step $y = x + m\odot\mathrm{Attn}(N(x))$ (module docstring), ``x (..., N, C)``.

    Parameters
    ----------
    x : array (..., N, C)
    params : dict
        ``"input_layernorm.weight" (C,)`` (and ``".bias"`` for ``norm="layer"``),
        ``"router.weight" (C, 1)``, the attention's keys under ``"self_attn."``.
    attention, attention_config
        Token mixer (registry slug or ``(forward, backward)``; default ``"multi_head_attention"``).
    route_level : {"sequence", "token"}
    threshold : float
        $\tau$ in (0, 1).
    estimator : {"ste", "fixed"}
        Router gradient: upstream's straight-through estimator or the exact (zero) derivative.
    norm : {"rms", "layer", "none"}; eps : float
    target_capacity : float in [0, 1], optional; gradient_scale : float
        The capacity loss $\lambda\,\mathrm{relu}(\bar m - c^*)$ (or $\lambda\bar m$ without a target).

    Returns
    -------
    y, cache
        ``cache["mask"]`` (``(..., 1, 1)`` or ``(..., N, 1)``), ``cache["capacity"]`` $\bar m$,
        ``cache["capacity_loss"]``, ``cache["router_scores"]`` $s$.
    """
    x = as_float(x, "x", min_ndim=2)
    check_choice(route_level, "route_level", MINDSKIP_ROUTE_LEVELS)
    check_choice(estimator, "estimator", MINDSKIP_ESTIMATORS)
    check_choice(norm, "norm", ("rms", "layer", "none"))
    tau = check_positive(threshold, "threshold")
    if tau >= 1:
        raise ValueError(f"threshold must be in (0, 1) (a sigmoid score); got {threshold}")
    eps = check_positive(eps, "eps", allow_zero=True)
    lam = check_positive(gradient_scale, "gradient_scale", allow_zero=True)
    target = None if target_capacity is None else check_positive(target_capacity, "target_capacity", allow_zero=True)
    attn = resolve_sublayer("multi_head_attention" if attention is None else attention, prefix="self_attn",
                            config=attention_config)
    c = x.shape[-1]
    spec = norm_spec("input_layernorm", c, norm)
    spec["router.weight"] = (c, 1)
    own, (ap,) = split_block_params(params, spec, (attn,), where="mindskip_attention")
    dt = block_dtype(x, own, (ap,))
    x, own, ap = x.astype(dt, copy=False), cast_all(dt, own), cast_all(dt, ap)
    h, c_norm = norm_forward(own, "input_layernorm", x, kind=norm, eps=eps)
    pooled = h.mean(axis=-2, keepdims=True) if route_level == "sequence" else h
    z = pooled @ own["router.weight"]
    s = sigmoid(z)
    m = (s - tau >= 0).astype(dt)
    a, c_attn = attn.apply(h, ap)
    cap = float(m.mean())
    loss = lam * (cap if target is None else max(cap - target, 0.0))
    cache = {"x": x, "own": own, "attn": attn, "c_attn": c_attn, "c_norm": c_norm, "a": a, "pooled": pooled, "s": s,
             "m": m, "seq": route_level == "sequence", "ste": estimator == "ste", "lam": lam, "target": target, "dtype": dt, "mask": m.copy(),
             "capacity": cap, "capacity_loss": float(loss), "router_scores": s.copy()}
    return x + m * a, cache


def mindskip_attention_backward(dout, cache, *, dcapacity_loss: float = 0.0):
    r"""Gradients of $\langle$``dout``$, y\rangle$ (+ ``dcapacity_loss``$\,L_{cap}$ through the STE) for
    ``x`` and every params key; the router's gradient follows ``estimator`` (module docstring)."""
    x, own, dt, m = cache["x"], cache["own"], cache["dtype"], cache["m"]
    g = as_dout(dout, x.shape, dt)
    if isinstance(dcapacity_loss, (bool, np.bool_)) or not np.isscalar(dcapacity_loss) \
            or not np.isfinite(float(dcapacity_loss)):
        raise TypeError(f"dcapacity_loss must be a finite real number; got {dcapacity_loss!r}")
    grads: dict = {}
    dh = cache["attn"].vjp(m * g, cache["c_attn"], grads)
    if cache["ste"]:
        dm = np.sum(g * cache["a"], axis=-1, keepdims=True)
        if cache["seq"]:
            dm = np.sum(dm, axis=-2, keepdims=True)
        target = cache["target"]
        if dcapacity_loss and (target is None or cache["capacity"] > target):
            dm = dm + float(dcapacity_loss) * cache["lam"] / m.size
        s = cache["s"]
        dz = dm * s * (1.0 - s)
        pooled = cache["pooled"]
        grads["router.weight"] = pooled.reshape(-1, pooled.shape[-1]).T @ dz.reshape(-1, 1)
        dh = dh + (dz @ own["router.weight"].T) / (x.shape[-2] if cache["seq"] else 1)
    else:
        grads["router.weight"] = np.zeros_like(own["router.weight"])
    grads["x"] = g + norm_backward(grads, own, dh, cache["c_norm"])
    return grads


def mindskip_attention(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of `mindskip_attention_forward`."""
    return mindskip_attention_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size, attention=None, **fixed):
    attention = attention or str(rng.choice(["multi_head_attention", "diff_attention_v1"]))
    n, c, heads = ((3, 4 if attention == "diff_attention_v1" else 3, 1) if size == "tiny"
                   else (int(rng.integers(4, 7)), 8, 2))
    ap, acfg = init_attention_params(rng, attention, c, heads)
    cfg = {"attention": attention, "attention_config": acfg, "route_level": str(rng.choice(MINDSKIP_ROUTE_LEVELS)),
           "estimator": "fixed"}
    cfg.update(fixed)
    while True:
        x = rng.standard_normal((2, n, c))
        p = {"input_layernorm.weight": 1.0 + 0.2 * rng.standard_normal(c), "router.weight": rng.standard_normal((c, 1))}
        h = x / np.sqrt(np.mean(x * x, -1, keepdims=True) + 1e-5) * p["input_layernorm.weight"]
        pooled = h.mean(-2) if cfg["route_level"] == "sequence" else h
        s = 1.0 / (1.0 + np.exp(-(pooled @ p["router.weight"])))
        if np.min(np.abs(s - 0.5)) > 0.02 and (size == "tiny" or 0 < np.mean(s > 0.5) < 1):
            break
    p.update(add_prefix(ap, "self_attn"))
    return Sample(inputs={"x": x}, params=p, config=cfg)


def _reference(x, params, attention=None, attention_config=None, route_level="sequence", threshold=0.5, eps=1e-5,
               **_):
    from .. import registry

    h = x / np.sqrt(np.mean(x * x, -1, keepdims=True) + eps) * params["input_layernorm.weight"]
    sub = {k[len("self_attn."):]: v for k, v in params.items() if k.startswith("self_attn.")}
    a = registry.get(attention or "multi_head_attention").forward(h, params=sub, **(attention_config or {}))[0]
    y = x.copy()
    for idx in np.ndindex(*x.shape[:-2]):
        if route_level == "sequence":
            s = 1.0 / (1.0 + np.exp(-(h[idx].mean(0) @ params["router.weight"][:, 0])))
            if s >= threshold:
                y[idx] = x[idx] + a[idx]
        else:
            for t in range(x.shape[-2]):
                if 1.0 / (1.0 + np.exp(-(h[idx][t] @ params["router.weight"][:, 0]))) >= threshold:
                    y[idx + (t,)] = x[idx + (t,)] + a[idx + (t,)]
    return y


def _check_ste_router_gradient(rng):
    # STE: d router = pooled^T (sum<dy, Attn> + capacity term) s(1-s); the attention's gradients equal
    # the fixed-mask ones (x and the norm weight also get the router path).
    s = _sample(rng, "small", target_capacity=0.2, gradient_scale=0.5)
    worst = 0.0
    for level in MINDSKIP_ROUTE_LEVELS:
        cfg = dict(s.config, route_level=level, estimator="ste")
        y, c = mindskip_attention_forward(**s.inputs, params=s.params, **cfg)
        g = rng.standard_normal(y.shape)
        ste = mindskip_attention_backward(g, c, dcapacity_loss=2.0)
        fixed = mindskip_attention_backward(g, mindskip_attention_forward(**s.inputs, params=s.params,
                                                                          **dict(cfg, estimator="fixed"))[1])
        a, sc, pooled, m = c["a"], c["s"], c["pooled"], c["m"]
        dm = (g * a).sum(-1, keepdims=True)
        if level == "sequence":
            dm = dm.sum(-2, keepdims=True)
        if c["capacity"] > 0.2:
            dm = dm + 2.0 * 0.5 / m.size
        want = pooled.reshape(-1, pooled.shape[-1]).T @ (dm * sc * (1 - sc)).reshape(-1, 1)
        worst = max(worst, float(np.abs(ste["router.weight"] - want).max()))
        worst = max(worst, max(float(np.abs(ste[k] - fixed[k]).max()) for k in ste if k.startswith("self_attn.")))
    assert worst < 1e-12, f"STE router gradient differs from its formula by {worst}"
    return worst


def _check_threshold_extremes(rng):
    # Every sequence routed (threshold near 0): the pre-norm residual x + Attn(RMSNorm x); none
    # routed (threshold near 1): the identity.
    from .. import registry

    s = _sample(rng, "small")
    x, p = s.inputs["x"], s.params
    h = x / np.sqrt(np.mean(x * x, -1, keepdims=True) + 1e-5) * p["input_layernorm.weight"]
    sub = {k[len("self_attn."):]: v for k, v in p.items() if k.startswith("self_attn.")}
    a = registry.get(s.config["attention"]).forward(h, params=sub, **s.config["attention_config"])[0]
    lo = mindskip_attention(x, p, **dict(s.config, threshold=1e-300))
    hi = mindskip_attention(x, p, **dict(s.config, threshold=1 - 1e-16))
    err = max(float(np.abs(lo - (x + a)).max()), float(np.abs(hi - x).max()))
    assert err < 1e-13, f"threshold extremes off by {err}"
    return err


register(
    Mechanism(
        slug="mindskip_attention_dynamic_depth", family="5-building-blocks", tier="T3",
        title="MindSkip / Router-Tuning: routed attention skip (sequence or token router, STE or fixed-mask gradient, "
              "capacity loss)",
        paper="He, Ge, Sun, Tian, Wang, Yu, Router-Tuning: A Simple and Effective Approach for Enabling Dynamic-Depth "
              "in Transformers, EMNLP 2025, arXiv 2410.13184",
        official_code="CASE-Lab-UMD/Router-Tuning-Mixture-of-Depths",
        forward=mindskip_attention_forward, backward=mindskip_attention_backward, sample=_sample, reference=_reference,
        docs="blocks/routing-and-gating.md#mindskip-router-tuning",
        checks={"ste_router_gradient": _check_ste_router_gradient, "threshold_extremes": _check_threshold_extremes},
    ),
)
