r"""MoH: multi-head attention as a mixture of heads (shared heads + top-K routed heads).

Jin, Zhu, Yuan, Yan, "MoH: Multi-Head Attention as Mixture-of-Head Attention", ICML 2025,
arXiv 2410.11842. Upstream: SkyworkAI/MoH ``MoH-DiT/models.py`` (``MoHAttention``) and
``MoH-ViT/attention_native.py`` (the same gating on TransNeXt's attention) @
66bb340a00e7172f0a2a33059ccdac405c8b0efd; the loss weighting in ``MoH-DiT/train.py`` and
``MoH-ViT/engine.py``.

Forward
-------
Multi-head attention is a sum over heads, $y_t = \sum_h o_{t,h}W_O^{(h)}$; MoH weights it,
$y_t = \sum_h g_{t,h}\,o_{t,h}W_O^{(h)} + b_O$, with $o_{t,h}$ the head outputs of any attention
core (default SDPA; `refattn.blocks.core.head_gated_attention_forward`). Of the $H$ heads the
first $S$ are *shared* (always active) and the other $H-S$ are *routed*: each token picks the top
$K$ of them. With $x_t$ the token and upstream's gate layers ``wg`` $(C, H{-}S)$, ``wg_1``
$(C, S)$, ``wg_0`` $(C, 2)$ (no biases),

$$r_t = K\cdot\frac{\mathrm{softmax}(x_tW_g)\odot m_t}{\max(\langle\mathrm{softmax}(x_tW_g), m_t\rangle, \epsilon)},
\qquad s_t = S\cdot\mathrm{softmax}(x_tW_{g1}),\qquad [\alpha_1, \alpha_2] = 2\cdot\mathrm{softmax}(x_tW_{g0}),$$
$$g_t = [\alpha_1 s_t,\ \alpha_2 r_t],$$

$m_t$ the top-$K$ mask of the routed probabilities (held fixed). With one shared head $s_t = 1$
(no ``wg_1``); without shared heads $g_t = r_t$; without routed heads ($K=0$, then $S=H$)
$g_t = s_t$. The paper writes the same gates without the renormalisation over the top $K$ and
without the factors $K$, $S$, 2 ($g = \alpha_1\mathrm{softmax}(W_sx)$ for shared heads,
$\alpha_2\mathrm{softmax}(W_rx)\,\mathbb 1[\mathrm{TopK}]$ for routed ones); the code renormalises
and rescales so that a uniform router gives the plain MHA (every gate 1). Both are keywords.

Load-balancing loss (upstream ``l_aux``, over the $E = H-S$ routed heads and all tokens):
$L_{aux} = E\sum_e f_eP_e$ with $f_e$ the fraction of tokens that select head $e$ among their
top $K$ and $P_e$ the mean routed probability — `refattn.blocks.routing.load_balancing_loss_forward`
with ``variant="topk"``, ``balance_over="batch"``. Upstream trains with
$L = L_{task} + 0.01\cdot\mathrm{mean}_{layers}L_{aux}$: pass ``daux_loss=0.01/num_layers`` to each
layer's backward (``cache["aux_loss"]`` holds the value).

Backward (top-K held fixed)
---------------------------
The head-gated attention's VJP gives $dx$ through the core and $dg_{t,h} = \langle dO_{t,h},
o_{t,h}\rangle$. Then $d\alpha_1 = \langle dg_{:S}, s\rangle$, $d\alpha_2 = \langle dg_{S:}, r\rangle$,
$ds = \alpha_1dg_{:S}$, $dr = \alpha_2dg_{S:}$; each softmax VJP (`refattn.nn.softmax.softmax_vjp`,
times the factors), the routed gates' VJP with the mask fixed
(`refattn.blocks.routing.gates_backward`: renormalisation, then softmax), plus
``daux_loss``$\cdot\partial L_{aux}/\partial(xW_g)$; finally the gate layers' linear VJPs add
into $dx$. Unselected routed heads receive gradient only through $L_{aux}$.

Conventions
-----------
``renormalize`` (True, code) and ``scale_by_count`` (True, code: the factors $K$, $S$, 2; False
with ``renormalize=False`` is the paper's formula); ``score_order`` (``"softmax_topk"``, code;
``"topk_softmax"`` equals it with renormalisation); the core (``"sdpa"``, $1/\sqrt d$ scale, as
timm's ``F.scaled_dot_product_attention``; any registry core or pair, e.g. ``"alibi"``); timm's
fused ``qkv (C, 3Hd)``/``proj (Hd, C)`` (``head_dim`` may differ from $C/H$, as MoH-DiT allows).
Not reproduced: ``qk_norm`` (off in MoH-DiT), dropout; TransNeXt's aggregated attention of
MoH-ViT (the gating there is identical and can wrap any core).

Agreement with upstream
-----------------------
Upstream ``MoHAttention`` (MoH-DiT, transcribed into a float64 CPU scratch script with timm's
``use_fused_attn`` off and ``mask.float()`` made float64) in training mode against this layer
with its weights, for $(H, S, K)$ = (6, 2, 3), (6, 0, 4), (6, 1, 2), (4, 4, 0) and (6, 2, 2) with
``head_dim=3`` ($\ne C/H$): output, ``l_aux`` and every gradient of
$\langle G, y\rangle + 0.01\,L_{aux}$ (``x``, ``qkv``, ``proj`` weights and biases, ``wg``,
``wg_0``, ``wg_1``) agree to $1.3\times10^{-15}$ relative. MoH-DiT reads ``wg_1`` for a single
shared head, which it never creates; the scratch copy (and this layer) use MoH-ViT's constant
gate 1 for that case.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_choice, check_int, check_weight_in
from ..nn.linear import linear_prefixed, linear_prefixed_spec, linear_prefixed_vjp
from ..nn.softmax import softmax_lse, softmax_vjp
from ..registry import Mechanism, Sample, register
from .core import (
    FUSED_QKV_NAMES,
    block_dtype,
    head_gated_attention_backward,
    head_gated_attention_forward,
    head_gated_attention_spec,
    param_dim,
    resolve_attention_core,
    split_block_params,
)
from .routing import (
    AUX_LOSS_VARIANTS,
    BALANCE_OVER,
    SCORE_ORDERS,
    gates_backward,
    gates_forward,
    load_balancing_loss_backward,
    load_balancing_loss_forward,
    topk_mask,
)

__all__ = ["mixture_of_head_attention_forward", "mixture_of_head_attention_backward", "mixture_of_head_attention"]


def _bool(flag, name):
    if not isinstance(flag, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool; got {type(flag).__name__}")
    return bool(flag)


def mixture_of_head_attention_forward(x, params, *, num_heads: int, shared_heads: int = 0, routed_heads: int = 1,
                                      core=None, core_config=None, score_order: str = "softmax_topk",
                                      renormalize: bool = True, scale_by_count: bool = True, aux_loss: str = "topk",
                                      balance_over: str = "batch"):
    r"""MoH attention $y_t = \sum_h g_{t,h}\,o_{t,h}W_O^{(h)} + b_O$ (module docstring), ``x (..., N, C)``.

    Parameters
    ----------
    x : array (..., N, C)
    params : dict
        ``"qkv.weight" (C, 3Hd)``, ``"proj.weight" (Hd, C)`` (optional ``".bias"``; PyTorch
        ``weight.T``), ``"wg.weight" (C, H-S)`` if $K>0$, ``"wg_0.weight" (C, 2)`` if $S>0$ and
        $K>0$, ``"wg_1.weight" (C, S)`` if $S>1$; a core's own parameters under ``"core."``.
    num_heads, shared_heads, routed_heads : int
        $H$, $S$ and $K$ (top $K$ of the $H-S$ routed heads; $K=0$ needs $S=H$).
    core, core_config
        The attention core: ``None`` (``"sdpa"``), a registry slug ``forward(q, k, v, ...)`` or a
        ``(forward, backward)`` pair, and its keyword configuration (``{"is_causal": True}`` ...).
    score_order : {"softmax_topk", "topk_softmax"}
    renormalize, scale_by_count : bool
        Upstream code (True, True) or the paper's formula (False, False).
    aux_loss : {"topk", "switch", "topk_normalized"}; balance_over : {"batch", "sequence"}

    Returns
    -------
    y, cache
        ``y (..., N, C)``; ``cache["aux_loss"]`` (0 without routed heads), ``cache["gates"]``
        ``(..., N, H)``, ``cache["router_logits"]`` (a copy, or None).
    """
    x = as_float(x, "x", min_ndim=2)
    h = check_int(num_heads, "num_heads", minimum=1)
    s_n = check_int(shared_heads, "shared_heads", minimum=0)
    k = check_int(routed_heads, "routed_heads", minimum=0)
    if s_n > h:
        raise ValueError(f"shared_heads must be <= num_heads={h}; got {s_n}")
    if k > h - s_n:
        raise ValueError(f"routed_heads must be <= the number of routed heads num_heads - shared_heads = {h - s_n}; "
                         f"got {k}")
    if k == 0 and s_n != h:
        raise ValueError(f"routed_heads=0 means every head is shared: shared_heads must equal num_heads={h}; got {s_n}")
    check_choice(score_order, "score_order", SCORE_ORDERS)
    check_choice(aux_loss, "aux_loss", AUX_LOSS_VARIANTS)
    check_choice(balance_over, "balance_over", BALANCE_OVER)
    renorm, scaled = _bool(renormalize, "renormalize"), _bool(scale_by_count, "scale_by_count")
    core = resolve_attention_core(core, prefix="core", config=core_config)
    c = x.shape[-1]
    check_weight_in(params, "qkv.weight", c, input_name="x")  # the head width is read off its output axis
    inner3 = param_dim(params, "qkv.weight", 1, where="mixture_of_head_attention", shape=("C", "3*H*d"))
    if inner3 % (3 * h):
        raise ValueError(f"qkv.weight's output width {inner3} must be 3 * num_heads={h} * head_dim")
    spec = head_gated_attention_spec(FUSED_QKV_NAMES, c, h, inner3 // (3 * h))
    if k > 0:
        spec.update(linear_prefixed_spec("wg", c, h - s_n, bias=False))
        if s_n > 0:
            spec.update(linear_prefixed_spec("wg_0", c, 2, bias=False))
    if s_n > 1:
        spec.update(linear_prefixed_spec("wg_1", c, s_n, bias=False))
    own, (cp,) = split_block_params(params, spec, (core,), optional=("qkv.bias", "proj.bias"),
                                    where="mixture_of_head_attention")
    dt = block_dtype(x, own, (cp,))
    x, own, cp = x.astype(dt, copy=False), cast_all(dt, own), cast_all(dt, cp)

    parts, lr, c_r, r, c_aux, aux = {}, None, None, None, None, 0.0
    if k > 0:
        lr = linear_prefixed(own, "wg", x)
        pr, _ = softmax_lse(lr)
        sel = topk_mask(pr, k)
        r, _, c_r = gates_forward(lr, sel, sel, order=score_order, renormalize=renorm)
        r = r * (k if scaled else 1.0)
        aux_v, c_aux = load_balancing_loss_forward(lr, top_k=k, variant=aux_loss, balance_over=balance_over)
        aux = float(aux_v)
    q1 = None
    if s_n > 1:
        q1, _ = softmax_lse(linear_prefixed(own, "wg_1", x))
        s_g = q1 * (s_n if scaled else 1.0)
    else:
        s_g = np.ones(x.shape[:-1] + (s_n,), dtype=dt)
    q0 = None
    if k > 0 and s_n > 0:
        q0, _ = softmax_lse(linear_prefixed(own, "wg_0", x))
        w0 = q0 * (2.0 if scaled else 1.0)
        gates = np.concatenate([w0[..., :1] * s_g, w0[..., 1:] * r], axis=-1)
        parts = {"w0": w0, "s": s_g}
    else:
        gates = r if k > 0 else s_g
    y, c_att = head_gated_attention_forward(own, x, gates, num_heads=h, core=core, core_params=cp,
                                            names=FUSED_QKV_NAMES)
    cache = {"x": x, "own": own, "att": c_att, "h": h, "S": s_n, "K": k, "scaled": scaled, "q0": q0, "q1": q1,
             "r": r, "c_r": c_r, "c_aux": c_aux, "parts": parts, "dtype": dt, "aux_loss": aux,
             "gates": gates.copy(), "router_logits": None if lr is None else lr.copy()}
    return y, cache


def mixture_of_head_attention_backward(dout, cache, *, daux_loss: float = 0.0):
    r"""Gradients of $\langle$``dout``$, y\rangle$ + ``daux_loss``$\,L_{aux}$ for ``x`` and every
    params key, the top-K selection held fixed (module docstring)."""
    x, own, dt = cache["x"], cache["own"], cache["dtype"]
    g = as_dout(dout, x.shape, dt)
    if isinstance(daux_loss, (bool, np.bool_)) or not np.isscalar(daux_loss) or not np.isfinite(float(daux_loss)):
        raise TypeError(f"daux_loss must be a finite real number; got {daux_loss!r}")
    s_n, k, scaled = cache["S"], cache["K"], cache["scaled"]
    grads: dict = {}
    dx, dgates = head_gated_attention_backward(grads, own, g, cache["att"])
    if k > 0 and s_n > 0:
        w0, s_g = cache["parts"]["w0"], cache["parts"]["s"]
        dsf, drf = dgates[..., :s_n], dgates[..., s_n:]
        dw0 = np.concatenate([np.sum(dsf * s_g, -1, keepdims=True), np.sum(drf * cache["r"], -1, keepdims=True)], -1)
        ds, dr = dsf * w0[..., :1], drf * w0[..., 1:]
        dl0 = softmax_vjp(cache["q0"], dw0) * (2.0 if scaled else 1.0)
        dx = dx + linear_prefixed_vjp(grads, own, "wg_0", dl0, x)
    elif k > 0:
        ds, dr = None, dgates
    else:
        ds, dr = dgates, None
    if k > 0:
        dlr = gates_backward(dr * (k if scaled else 1.0), cache["c_r"])
        if daux_loss:
            dlr = dlr + load_balancing_loss_backward(np.asarray(daux_loss, dtype=dt), cache["c_aux"])["router_logits"]
        dx = dx + linear_prefixed_vjp(grads, own, "wg", dlr, x)
    if s_n > 1:
        dl1 = softmax_vjp(cache["q1"], ds) * (s_n if scaled else 1.0)
        dx = dx + linear_prefixed_vjp(grads, own, "wg_1", dl1, x)
    grads["x"] = dx
    return grads


def mixture_of_head_attention(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of `mixture_of_head_attention_forward`."""
    return mixture_of_head_attention_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================

_LAYOUTS = ((0, 2), (1, 2), (2, 1), (4, 0), (1, 3))


def _params(rng, c, h, d, s_n, k, bias=True):
    p = {"qkv.weight": rng.standard_normal((c, 3 * h * d)) / np.sqrt(c),
         "proj.weight": rng.standard_normal((h * d, c)) / np.sqrt(h * d)}
    if bias:
        p["qkv.bias"] = 0.1 * rng.standard_normal(3 * h * d)
        p["proj.bias"] = 0.1 * rng.standard_normal(c)
    if k > 0:
        p["wg.weight"] = 1.5 * rng.standard_normal((c, h - s_n))
        if s_n > 0:
            p["wg_0.weight"] = rng.standard_normal((c, 2))
    if s_n > 1:
        p["wg_1.weight"] = rng.standard_normal((c, s_n))
    return p


def _sample(rng, size, layout=None, **fixed):
    h = 4
    s_n, k = _LAYOUTS[int(rng.integers(len(_LAYOUTS)))] if layout is None else layout
    n, c, d = (3, 3, 1) if size == "tiny" else (int(rng.integers(4, 7)), 6, 2)
    cfg = {"num_heads": h, "shared_heads": s_n, "routed_heads": k, "core_config": {"is_causal": bool(rng.random() < 0.5)},
           "score_order": str(rng.choice(SCORE_ORDERS)), "renormalize": bool(rng.random() < 0.7)}
    cfg["scale_by_count"] = cfg["renormalize"] or bool(rng.random() < 0.3)
    cfg.update(fixed)
    while True:
        x = rng.standard_normal((2, n, c))
        p = _params(rng, c, h, d, s_n, k, bias=bool(rng.random() < 0.7))
        if k == 0 or k == h - s_n:
            break
        lg = x @ p["wg.weight"]
        srt = -np.sort(-lg, axis=-1)  # a logit gap is a probability-ratio gap
        if np.min(srt[..., k - 1] - srt[..., k]) > 0.05:
            break
    return Sample(inputs={"x": x}, params=p, config=cfg)


def _softmax(a):
    e = np.exp(a - a.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _reference(x, params, num_heads, shared_heads=0, routed_heads=1, core_config=None, renormalize=True,
               scale_by_count=True, **_):
    # The gates written out token by token and the heads as explicit softmax attention.
    h, s_n, k = num_heads, shared_heads, routed_heads
    causal = bool((core_config or {}).get("is_causal", False))
    qkv = x @ params["qkv.weight"] + params.get("qkv.bias", 0.0)
    hd = qkv.shape[-1] // 3
    d = hd // h
    n = x.shape[-2]
    out = np.zeros(x.shape[:-1] + (hd,))
    for idx in np.ndindex(*x.shape[:-2]):
        xs = x[idx]
        gates = np.zeros((n, h))
        for t in range(n):
            r = np.zeros(h - s_n)
            if k:
                pr = _softmax(xs[t] @ params["wg.weight"])
                top = np.argsort(-pr)[:k]
                r[top] = pr[top] / (pr[top].sum() if renormalize else 1.0) * (k if scale_by_count else 1.0)
            sh = (_softmax(xs[t] @ params["wg_1.weight"]) * (s_n if scale_by_count else 1.0)) if s_n > 1 else np.ones(s_n)
            if k and s_n:
                a = _softmax(xs[t] @ params["wg_0.weight"]) * (2.0 if scale_by_count else 1.0)
                sh, r = a[0] * sh, a[1] * r
            gates[t] = np.concatenate([sh, r])
        for hh in range(h):
            q, kk, v = (qkv[idx][:, j * hd + hh * d: j * hd + (hh + 1) * d] for j in range(3))
            sc = q @ kk.T / np.sqrt(d)
            if causal:
                sc = np.where(np.tril(np.ones((n, n), bool)), sc, -np.inf)
            out[idx][:, hh * d:(hh + 1) * d] = gates[:, hh, None] * (_softmax(sc) @ v)
    return out @ params["proj.weight"] + params.get("proj.bias", 0.0)


def _check_uniform_gates_are_mha(rng):
    # Catalogue: all heads active with uniform gates is multi-head attention (global scale 1 with
    # the code's count factors): K = H - S routed heads, zero router weights.
    from .. import registry

    s = _sample(rng, "small", layout=(1, 3), renormalize=True, scale_by_count=True, core_config={})
    p = {k: (np.zeros_like(v) if k.startswith("wg") else v) for k, v in s.params.items()}
    y = mixture_of_head_attention(**s.inputs, params=p, **s.config)
    w = p["qkv.weight"]
    b = p.get("qkv.bias", np.zeros(w.shape[1]))
    hd = w.shape[1] // 3
    mp = {"q_proj": w[:, :hd], "k_proj": w[:, hd:2 * hd], "v_proj": w[:, 2 * hd:], "out_proj": p["proj.weight"],
          "q_proj_bias": b[:hd], "k_proj_bias": b[hd:2 * hd], "v_proj_bias": b[2 * hd:],
          "out_proj_bias": p.get("proj.bias", np.zeros(p["proj.weight"].shape[1]))}
    ref = registry.get("multi_head_attention").forward(s.inputs["x"], params=mp, num_heads=4)[0]
    err = float(np.abs(y - ref).max())
    assert err < 1e-13, f"uniform MoH gates differ from MHA by {err}"
    return err


def _check_aux_loss_gradient(rng):
    # L_aux through the layer, FD-checked (x and the routed gate weight; the rest rides in the config).
    from ..testing import gradcheck

    def fwd(x, params, rest, **cfg):
        y, c = mixture_of_head_attention_forward(x, {**params, **rest}, **cfg)
        c["_y"] = y
        return np.array([c["aux_loss"]]), c

    def bwd(g, c):
        grads = mixture_of_head_attention_backward(np.zeros_like(c["_y"]), c, daux_loss=float(g[0]))
        return {k: v for k, v in grads.items() if k in ("x", "wg.weight")}

    s = _sample(rng, "tiny", layout=(1, 2), aux_loss=str(rng.choice(AUX_LOSS_VARIANTS)))
    rest = {k: v for k, v in s.params.items() if k != "wg.weight"}
    s = Sample(s.inputs, {"wg.weight": s.params["wg.weight"]}, dict(s.config, rest=rest))
    return gradcheck(fwd, bwd, s).max_rel


register(
    Mechanism(
        slug="mixture_of_head_attention", family="5-building-blocks", tier="T2",
        title="MoH: mixture-of-head attention (shared + top-K routed heads, load-balancing loss, pluggable core)",
        paper="Jin, Zhu, Yuan, Yan, MoH: Multi-Head Attention as Mixture-of-Head Attention, ICML 2025, arXiv 2410.11842",
        forward=mixture_of_head_attention_forward, backward=mixture_of_head_attention_backward, sample=_sample,
        reference=_reference, docs="blocks/routing-and-gating.md#moh-mixture-of-head-attention",
        checks={"uniform_gates_are_mha": _check_uniform_gates_are_mha,
                "aux_loss_gradient": _check_aux_loss_gradient},
    ),
)
