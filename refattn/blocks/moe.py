r"""Top-k mixture-of-experts feed-forward layer with load-balancing and router z-losses.

Catalogue entry ``moe_topk_gating`` (papers: Zheng, Ren, Xia, Xiao, Xie, "Dense2MoE: Restructuring
Diffusion Transformer to MoE for Efficient Text-to-Image Generation", ICCV 2025, arXiv
2510.09094 — a dense DiT's FFNs replaced by this layer; Piórczyński, Szatkowski, Bałazy, Wójcik,
"Exploiting Transformer Activation Sparsity with Dynamic Inference", arXiv 2310.04361 — the
dynamic-$k$ rule). The layer itself is the sparsely gated MoE of Shazeer et al. (2017) in the
forms of Switch (Fedus, Zoph, Shazeer, JMLR 2022, arXiv 2101.03961), GShard and Mixtral (Jiang et
al., arXiv 2401.04088). Upstream files read and run (see "Agreement"):
huggingface/transformers ``src/transformers/models/mixtral/modeling_mixtral.py``
(``MixtralSparseMoeBlock``, ``load_balancing_loss_func``) @ 00d4b3d2142cb4ced2f51b90614b5d26bc045015,
``src/transformers/models/switch_transformers/modeling_switch_transformers.py``
(``SwitchTransformersTop1Router``, ``SwitchTransformersSparseMLP``, ``router_z_loss_func``,
``load_balancing_loss_func``) @ 00dcc6dda6f6d8e69541a6b51f97986a80242367, and deepspeedai/DeepSpeed
``deepspeed/moe/sharded_moe.py`` (``top1gating``, ``top2gating``, ``topkgating``, ``_capacity``)
@ 0c691a52a6e00461dfd59eff07a840aaecb30d89, and mistralai/mistral-inference
``src/mistral_inference/moe.py`` (``MoeLayer``) @ 26a52a14eb5019ef0d40a822c1fe46456d6c378b.

Forward
-------
For tokens $x_t\in\mathbb R^C$ (``x (..., N, C)``), router logits $\ell_t = x_tW_g (+b_g)$
(``gate.weight (C, E)``), $p_t = \mathrm{softmax}(\ell_t)$, the selection $S_t$ = the top-$k$ of
$p_t$ (optionally only the $e$ with $p_{te}\ge\tau\max p_t$, DSTI's dynamic $k$), the kept set
$K_t\subseteq S_t$ after the capacity limit, and the gates $g_t$ of
`refattn.blocks.routing.gates_forward` (zero outside $K_t$),

$$y_t = \sum_{e\in K_t} g_{te}\,E_e(x_t)\;\Big(+\,E_{shared}(x_t)\Big).$$

Each expert $E_e$ is a token-wise FFN sublayer (`refattn.blocks.core` protocol; default
``"glu_swiglu_ffn"`` with Mixtral's keys ``experts.{e}.w1/w3/w2.weight``: $E(x) =
(\mathrm{SiLU}(xW_1)\odot xW_3)W_2$), run only on the tokens routed to it (gathered into an
``(n_e, C)`` array, the HF ``index_add_`` dispatch). An optional shared expert (DeepSeekMoE's
``shared_experts``) sees every token, ungated. The layer also returns, in its cache, the
load-balancing loss $L_{aux}$ and the router z-loss $L_z$ of the logits
(`refattn.blocks.routing`; ``cache["aux_loss"]``, ``cache["z_loss"]``, ``cache["router_logits"]``).

Backward (selection held fixed)
-------------------------------
Top-$k$, the threshold and the capacity limit are piecewise-constant selections: the backward
goes through the selected experts and the gate values with $S$ and $K$ fixed (the samplers keep a
margin between the $k$-th and $(k{+}1)$-th probabilities, around $\tau\max p$ and between
competing tokens, so finite differences see the same selection). With $G = \partial L/\partial y$:

$$dg_{te} = \langle G_t, E_e(x_t)\rangle\ (e\in K_t),\qquad
dx_t \mathrel{+}= J_{E_e}^\top(g_{te}G_t),\qquad d\theta_e \mathrel{+}= J_{E_e,\theta}^\top(g_{te}G_t),$$

then $d\ell$ = `gates_backward` (renormalisation and softmax VJPs),
$d\ell \mathrel{+}= \alpha\,\partial L_{aux}/\partial\ell + \beta\,\partial L_z/\partial\ell +$
``drouter_logits``, $dW_g = \sum_t x_t^\top d\ell_t$, $dx_t \mathrel{+}= d\ell_tW_g^\top$. Experts
that receive no token get zero gradients. ``moe_topk_gating_backward(dout, cache, daux_loss=a,
dz_loss=b)`` therefore returns the gradient of $\langle G, y\rangle + a\,L_{aux} + b\,L_z$: a
training loop adds the auxiliary losses by passing their coefficients (module docstring of
`refattn.blocks.routing`). Its gradient is FD-checked by the named check
``aux_and_z_loss_gradients``.

Conventions (keywords; defaults = HF Mixtral)
---------------------------------------------
``num_experts_per_tok`` $k$ (2); ``score_order`` ``"softmax_topk"`` (softmax over all experts,
then top-$k$: Mixtral, Switch, DeepSpeed, MoH) or ``"topk_softmax"`` (top-$k$ logits, then
softmax: mistral-inference); ``renormalize`` (True: Mixtral, DeepSpeed top-2/top-k; False:
Switch top-1, Qwen2-MoE ``norm_topk_prob=False``, DeepSpeed top-1); ``dynamic_threshold`` $\tau$
(None; DSTI); ``capacity_factor`` $\phi$ / ``expert_capacity`` $c$ (None = no dropping, Mixtral;
$c = \max(\lceil k\phi N/E\rceil,$ ``min_capacity``$)$ per sequence, DeepSpeed's formula; HF
Switch passes $c$ directly); ``capacity_priority`` ``"slot"`` (GShard/DeepSpeed top-2),
``"token"`` (HF Switch, DeepSpeed ``drop_policy="position"``) or ``"probs"`` (DeepSpeed
``drop_policy="probs"``); ``normalize_before_dropping`` (False: renormalise over the kept experts,
DeepSpeed and fairseq's default); ``aux_loss`` ``"topk"`` (Mixtral) / ``"switch"`` /
``"topk_normalized"`` and ``balance_over`` ``"batch"`` / ``"sequence"`` (routing module);
``names`` (router prefix, expert prefix: Mixtral ``("gate", "experts")``; HF Switch
``("router.classifier", "experts.expert_{}")`` with ``expert=`` a ReLU MLP pair).

Not reproduced: router jitter noise and DeepSpeed's random token selection (training-time
randomness; pass a perturbed ``x`` or use ``capacity_priority`` instead), expert parallelism.
A dropped token gets zero from that expert (Switch, DeepSpeed, current HF); an older HF Switch
passed dropped tokens through unchanged (times their gate). HF Switch computes its $f_e$ from the
argmax of the capacity-masked one-hot, which counts a dropped token for expert 0; here $f$ uses
the selection before dropping, as DeepSpeed and fairseq do.

Agreement with upstream
-----------------------
The upstream functions, transcribed into a float64 CPU scratch script (not committed), against
this layer with the same weights:

* HF ``MixtralSparseMoeBlock`` + ``load_balancing_loss_func`` ($B=2, N=7, C=6, F=5, E=4, k=2$):
  output, router logits, $L_{aux}$ and every gradient of $\langle G, y\rangle + 0.02\,L_{aux}$
  (``x``, ``gate``, all expert weights) agree to $6.6\times10^{-16}$ relative once upstream's
  float32 casts (``softmax(..., dtype=torch.float)``, ``expert_mask.float()``) are removed;
  $1.2\times10^{-7}$ with them.
* HF ``SwitchTransformersSparseMLP`` with ``expert_capacity=2`` (top-1, token priority, 3 tokens
  dropped; ReLU ``wi``/``wo`` experts as a user pair, ``names=("router.classifier",
  "experts.expert_{}")``) + ``router_z_loss_func``: output, $L_z$ and every gradient of
  $\langle G, y\rangle + 0.001\,L_z$ to $5.2\times10^{-16}$. Its ``load_balancing_loss_func``
  equals ``aux_loss="switch", balance_over="sequence"`` to $1.7\times10^{-16}$ on the
  pre-capacity argmax; on the capacity-masked argmax HF passes in (the quirk above) it differs
  whenever tokens are dropped (1.138 vs 1.306 in that run).
* mistral-inference ``MoeLayer`` (top-2 logits, then softmax; its float32 softmax cast removed)
  against ``score_order="topk_softmax"``: output and every gradient to $7.2\times10^{-16}$.
* DeepSpeed ``top2gating`` (capacity factor 0.6, ``top2_2nd_expert_sampling`` off) and
  ``topkgating`` ($k=3$, factor 0.5, both drop policies) on 20 random $12\times4$ logit sets:
  identical kept masks and capacities, combine weights to $1.1\times10^{-16}$ absolute,
  ``l_aux`` to $3.8\times10^{-16}$ relative (float casts removed; $3\times10^{-8}$ with them).
"""

from __future__ import annotations

from numbers import Real

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_choice, check_int, check_positive
from ..nn.linear import linear_prefixed, linear_prefixed_spec, linear_prefixed_vjp
from ..registry import Mechanism, Sample, register
from .core import add_grad, block_dtype, param_dim, resolve_sublayer, split_block_params
from .routing import (
    AUX_LOSS_VARIANTS,
    BALANCE_OVER,
    CAPACITY_PRIORITIES,
    SCORE_ORDERS,
    capacity_mask,
    gates_backward,
    gates_forward,
    load_balancing_loss_backward,
    load_balancing_loss_forward,
    router_z_loss_backward,
    router_z_loss_forward,
    threshold_mask,
    topk_mask,
)
from .routing import expert_capacity as capacity_for

__all__ = ["moe_topk_gating_forward", "moe_topk_gating_backward", "moe_topk_gating", "MIXTRAL_MOE_NAMES",
           "MIXTRAL_EXPERT_CONFIG"]

MIXTRAL_MOE_NAMES = ("gate", "experts")
MIXTRAL_EXPERT_CONFIG = {"names": ("w1", "w3", "w2")}
"""The default expert: ``"glu_swiglu_ffn"`` with Mixtral's ``w1`` (gate), ``w3`` (up), ``w2`` (down)."""


def _expert_prefix(fmt: str, e: int) -> str:
    return fmt.format(e) if "{}" in fmt else f"{fmt}.{e}"


def _real(value, name):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (Real, np.floating, np.integer)) \
            or not np.isfinite(float(value)):
        raise TypeError(f"{name} must be a finite real number; got {value!r}")
    return float(value)


def moe_topk_gating_forward(x, params, *, num_experts_per_tok: int = 2, expert=None, expert_config=None,
                            shared_expert=None, shared_expert_config=None, score_order: str = "softmax_topk",
                            renormalize: bool = True, dynamic_threshold=None, capacity_factor=None,
                            expert_capacity=None, min_capacity: int = 0, capacity_priority: str = "slot",
                            normalize_before_dropping: bool = False, aux_loss: str = "topk",
                            balance_over: str = "batch", names=MIXTRAL_MOE_NAMES):
    r"""Top-$k$ MoE layer $y_t = \sum_{e\in K_t} g_{te}E_e(x_t)$ (module docstring), ``x (..., N, C)``.

    Parameters
    ----------
    x : array (..., N, C)
        Tokens; capacity is counted per sequence (axis -2).
    params : dict
        ``"gate.weight" (C, E)`` (optional ``"gate.bias"``), each expert's keys under
        ``"experts.{e}."`` (default expert: ``w1.weight (C, F)``, ``w3.weight (C, F)``,
        ``w2.weight (F, C)``), the shared expert's under ``"shared_experts."``.
    num_experts_per_tok : int
        $k$.
    expert, expert_config
        The expert FFN: a registry slug or ``(forward, backward)`` pair of a token-wise layer
        ``forward(x, params=p, **config)``; default ``"glu_swiglu_ffn"`` with
        `MIXTRAL_EXPERT_CONFIG`.
    shared_expert, shared_expert_config
        Optional always-on expert (same protocol), ungated.
    score_order : {"softmax_topk", "topk_softmax"}
    renormalize : bool
    dynamic_threshold : float in [0, 1], optional
        DSTI's $\tau$: keep only selected experts with $p\ge\tau\max p$.
    capacity_factor : float, optional; expert_capacity : int, optional
        The capacity $c$ per expert and sequence (at most one of the two; neither: no dropping).
    min_capacity : int
    capacity_priority : {"slot", "token", "probs"}
    normalize_before_dropping : bool
    aux_loss : {"topk", "switch", "topk_normalized"}; balance_over : {"batch", "sequence"}
    names : (str, str)
        Router prefix and expert prefix (``"{}"`` marks the expert index; else ``".{e}"`` is
        appended).

    Returns
    -------
    y, cache
        ``y (..., N, C)``; ``cache["aux_loss"]``, ``cache["z_loss"]`` (floats),
        ``cache["router_logits"]`` (a copy), ``cache["expert_mask"]`` (the kept assignments).
    """
    x = as_float(x, "x", min_ndim=2)
    k = check_int(num_experts_per_tok, "num_experts_per_tok", minimum=1)
    check_choice(score_order, "score_order", SCORE_ORDERS)
    check_choice(capacity_priority, "capacity_priority", CAPACITY_PRIORITIES)
    check_choice(aux_loss, "aux_loss", AUX_LOSS_VARIANTS)
    check_choice(balance_over, "balance_over", BALANCE_OVER)
    for flag, n in ((renormalize, "renormalize"), (normalize_before_dropping, "normalize_before_dropping")):
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"{n} must be a bool; got {type(flag).__name__}")
    tau = None if dynamic_threshold is None else check_positive(dynamic_threshold, "dynamic_threshold", allow_zero=True)
    if tau is not None and tau > 1:
        raise ValueError(f"dynamic_threshold must be in [0, 1]; got {dynamic_threshold}")
    if capacity_factor is not None and expert_capacity is not None:
        raise ValueError("pass capacity_factor or expert_capacity, not both")
    cf = None if capacity_factor is None else check_positive(capacity_factor, "capacity_factor")
    cap_fixed = None if expert_capacity is None else check_int(expert_capacity, "expert_capacity", minimum=1)
    min_cap = check_int(min_capacity, "min_capacity", minimum=0)
    if not (isinstance(names, (tuple, list)) and len(names) == 2 and all(isinstance(n, str) and n for n in names)):
        raise TypeError(f"names must be two non-empty strings (router prefix, expert prefix); got {names!r}")
    router, efmt = names
    c = x.shape[-1]
    e_num = param_dim(params, f"{router}.weight", 1, where="moe_topk_gating", shape=("C", "E"))
    if k > e_num:
        raise ValueError(f"num_experts_per_tok must be <= the number of experts E={e_num} ({router}.weight's "
                         f"second axis); got {k}")
    spec_e = MIXTRAL_EXPERT_CONFIG if expert is None and expert_config is None else expert_config
    experts = [resolve_sublayer("glu_swiglu_ffn" if expert is None else expert, prefix=_expert_prefix(efmt, e),
                                config=spec_e, name="expert") for e in range(e_num)]
    subl = list(experts)
    if shared_expert is not None:
        subl.append(resolve_sublayer(shared_expert, prefix="shared_experts", config=shared_expert_config,
                                     name="shared_expert"))
    spec = linear_prefixed_spec(router, c, e_num)
    own, subs = split_block_params(params, spec, subl, optional=(f"{router}.bias",), where="moe_topk_gating")
    keys0 = set(subs[0])
    for e in range(e_num):
        if not subs[e] or set(subs[e]) != keys0:
            raise ValueError(f"params must hold the same keys for every expert; expert {e} ('{experts[e].prefix}.*') "
                             f"has {sorted(subs[e])}, expert 0 has {sorted(keys0)}")
    if shared_expert is not None and not subs[-1]:
        raise ValueError("params has no keys under 'shared_experts.' for the shared expert")
    dt = block_dtype(x, own, subs)
    x, own, subs = x.astype(dt, copy=False), cast_all(dt, own), [cast_all(dt, s) for s in subs]

    logits = linear_prefixed(own, router, x)
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    sel = topk_mask(probs, k)
    if tau is not None:
        sel &= threshold_mask(probs, tau)
    n = x.shape[-2]
    cap = cap_fixed if cap_fixed is not None else (None if cf is None else capacity_for(n, e_num, k, cf, min_cap))
    keep = sel if cap is None else capacity_mask(sel, probs, cap, capacity_priority)
    gates, _, c_gate = gates_forward(logits, keep, sel if normalize_before_dropping else keep, order=score_order,
                                     renormalize=bool(renormalize))
    xf, gf = x.reshape(-1, c), gates.reshape(-1, e_num)
    keepf = keep.reshape(-1, e_num)
    y = np.zeros_like(xf)
    runs = []
    for e in range(e_num):
        idx = np.nonzero(keepf[:, e])[0]
        if idx.size == 0:
            runs.append(None)
            continue
        ye, ce = experts[e].apply(xf[idx], subs[e])
        y[idx] += gf[idx, e, None] * ye
        runs.append((idx, ye, ce))
    y = y.reshape(x.shape)
    c_shared = None
    if shared_expert is not None:
        ys, c_shared = subl[-1].apply(x, subs[-1])
        y = y + ys
    aux, c_aux = load_balancing_loss_forward(logits, top_k=k, variant=aux_loss, balance_over=balance_over)
    z, c_z = router_z_loss_forward(logits)
    cache = {"x": x, "own": own, "subs": subs, "subl": subl, "experts": experts, "runs": runs, "gates": gates,
             "c_gate": c_gate, "c_aux": c_aux, "c_z": c_z, "router": router, "shared": c_shared,
             "aux_loss": float(aux), "z_loss": float(z), "router_logits": logits.copy(), "expert_mask": keep,
             "capacity": cap, "dtype": dt}
    return y, cache


def moe_topk_gating_backward(dout, cache, *, daux_loss: float = 0.0, dz_loss: float = 0.0, drouter_logits=None):
    r"""Gradients of $\langle$``dout``$, y\rangle$ + ``daux_loss``$\,L_{aux}$ + ``dz_loss``$\,L_z$
    (+ $\langle$``drouter_logits``$, \ell\rangle$) for ``x`` and every params key, the selection
    held fixed (module docstring)."""
    x, own, dt = cache["x"], cache["own"], cache["dtype"]
    g = as_dout(dout, x.shape, dt)
    a, b = _real(daux_loss, "daux_loss"), _real(dz_loss, "dz_loss")
    c, gates = x.shape[-1], cache["gates"]
    e_num = gates.shape[-1]
    gf, gatef = g.reshape(-1, c), gates.reshape(-1, e_num)
    grads: dict = {}
    dxf = np.zeros_like(gf)
    dgates = np.zeros_like(gatef)
    for e, run in enumerate(cache["runs"]):
        sub, expert = cache["subs"][e], cache["experts"][e]
        if run is None:
            for key, val in sub.items():
                add_grad(grads, expert.key(key), np.zeros_like(val))
            continue
        idx, ye, ce = run
        dgates[idx, e] = np.sum(gf[idx] * ye, axis=-1)
        dxf[idx] += expert.vjp(gatef[idx, e, None] * gf[idx], ce, grads)
    dlogits = gates_backward(dgates.reshape(gates.shape), cache["c_gate"])
    if a:
        dlogits = dlogits + load_balancing_loss_backward(np.asarray(a, dtype=dt), cache["c_aux"])["router_logits"]
    if b:
        dlogits = dlogits + router_z_loss_backward(np.asarray(b, dtype=dt), cache["c_z"])["router_logits"]
    if drouter_logits is not None:
        dlogits = dlogits + as_dout(drouter_logits, gates.shape, dt, name="drouter_logits")
    dx = dxf.reshape(x.shape) + linear_prefixed_vjp(grads, own, cache["router"], dlogits, x)
    if cache["shared"] is not None:
        dx = dx + cache["subl"][-1].vjp(g, cache["shared"], grads)
    grads["x"] = dx
    return grads


def moe_topk_gating(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of `moe_topk_gating_forward`."""
    return moe_topk_gating_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _expert_params(rng, c, f, prefix):
    return {f"{prefix}.w1.weight": rng.standard_normal((c, f)) / np.sqrt(c),
            f"{prefix}.w3.weight": rng.standard_normal((c, f)) / np.sqrt(c),
            f"{prefix}.w2.weight": rng.standard_normal((f, c)) / np.sqrt(f)}


def _margins_ok(probs, cfg, margin=5e-3):
    # Keep every routing decision away from its boundary: the k-th vs (k+1)-th probability, the
    # dynamic threshold, the slot order of a token's choices and the capacity cut of each expert.
    k, tau = cfg["num_experts_per_tok"], cfg.get("dynamic_threshold")
    srt = -np.sort(-probs, axis=-1)
    if k < probs.shape[-1] and np.min(srt[..., k - 1] - srt[..., k]) < margin:
        return False
    sel = topk_mask(probs, k)
    if tau is not None:
        if np.min(np.where(sel, np.abs(probs - tau * srt[..., :1]), 1.0)) < margin:
            return False
        sel &= threshold_mask(probs, tau)
    if "capacity_factor" not in cfg:
        return True
    if cfg.get("capacity_priority", "slot") == "slot":
        ss = -np.sort(-np.where(sel, probs, -1.0), axis=-1)
        gaps = np.where(ss[..., 1:] > 0, ss[..., :-1] - ss[..., 1:], 1.0)
        if np.min(gaps, initial=1.0) < margin:
            return False
    n, e_num = probs.shape[-2:]
    cap = capacity_for(n, e_num, k, cfg["capacity_factor"], 0)
    if cfg.get("capacity_priority") == "probs":
        col = -np.sort(-np.where(sel, probs, -1.0), axis=-2)
        cut = col[..., cap - 1, :] - col[..., cap, :] if cap < n else np.ones(1)
        if np.min(np.where(col[..., cap - 1, :] > 0, cut, 1.0)) < margin:
            return False
    return True


def _sample(rng, size, shared=None, **fixed):
    if size == "tiny":
        n, c, e, f = int(rng.integers(3, 5)), 3, 3, 2
    else:
        n, c, e, f = int(rng.integers(5, 8)), 6, 4, 5
    k = int(rng.integers(1, 3))
    cfg = {"num_experts_per_tok": k, "score_order": str(rng.choice(SCORE_ORDERS)),
           "renormalize": bool(rng.random() < 0.6), "aux_loss": str(rng.choice(AUX_LOSS_VARIANTS)),
           "balance_over": str(rng.choice(BALANCE_OVER))}
    if rng.random() < 0.5:
        cfg["capacity_factor"] = float(rng.choice([0.7, 1.0]))
        cfg["capacity_priority"] = str(rng.choice(CAPACITY_PRIORITIES))
        cfg["normalize_before_dropping"] = bool(rng.random() < 0.3)
    if rng.random() < 0.3:
        cfg["dynamic_threshold"] = 0.5
        cfg["num_experts_per_tok"] = k = e
    cfg.update(fixed)
    while True:
        x = rng.standard_normal((2, n, c))
        p = {"gate.weight": 1.5 * rng.standard_normal((c, e))}
        lg = x @ p["gate.weight"]
        probs = np.exp(lg - lg.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        if _margins_ok(probs, cfg):
            break
    for i in range(e):
        p.update(_expert_params(rng, c, f, f"experts.{i}"))
    if (rng.random() < 0.3) if shared is None else shared:
        cfg["shared_expert"] = "glu_swiglu_ffn"
        cfg["shared_expert_config"] = {"names": ("w1", "w3", "w2")}
        p.update(_expert_params(rng, c, f, "shared_experts"))
    return Sample(inputs={"x": x}, params=p, config=cfg)


def _swiglu(x, p, prefix):
    a = x @ p[f"{prefix}.w1.weight"]
    return (a / (1 + np.exp(-a)) * (x @ p[f"{prefix}.w3.weight"])) @ p[f"{prefix}.w2.weight"]


def _reference(x, params, num_experts_per_tok=2, score_order="softmax_topk", renormalize=True, dynamic_threshold=None,
               capacity_factor=None, min_capacity=0, capacity_priority="slot", normalize_before_dropping=False,
               shared_expert=None, shared_expert_config=None, **_):
    # Every expert on every token (dense), with the routing written out token by token.
    k, w = num_experts_per_tok, params["gate.weight"]
    e_num = w.shape[1]
    lead, n = x.shape[:-2], x.shape[-2]
    y = np.zeros_like(x)
    for idx in np.ndindex(*lead):
        xs = x[idx]
        lg = xs @ w
        pr = np.exp(lg - lg.max(-1, keepdims=True))
        pr /= pr.sum(-1, keepdims=True)
        choices = []
        for t in range(n):
            order = sorted(range(e_num), key=lambda j: -pr[t, j])[:k]
            if dynamic_threshold is not None:
                order = [j for j in order if pr[t, j] >= dynamic_threshold * pr[t].max()]
            choices.append(order)
        kept = [list(ch) for ch in choices]
        if capacity_factor is not None:
            cap = max(int(np.ceil(n / e_num * capacity_factor * k - 1e-12)), min_capacity)
            if capacity_priority == "token":
                queue = [(t, j) for t in range(n) for j in choices[t]]
            elif capacity_priority == "slot":
                queue = [(t, ch[r]) for r in range(k) for t, ch in enumerate(choices) if r < len(ch)]
            else:
                queue = sorted(((t, j) for t in range(n) for j in choices[t]), key=lambda tj: -pr[tj])
            load = [0] * e_num
            kept = [[] for _ in range(n)]
            for t, j in queue:
                if load[j] < cap:
                    load[j] += 1
                    kept[t].append(j)
        for t in range(n):
            norm = choices[t] if normalize_before_dropping else kept[t]
            if score_order == "topk_softmax":
                z = np.exp(lg[t, norm] - lg[t, norm].max()) if norm else np.zeros(0)
                gate = {j: z[i] / z.sum() for i, j in enumerate(norm)}
            else:
                den = max(sum(pr[t, j] for j in norm), np.finfo(float).eps) if renormalize else 1.0
                gate = {j: pr[t, j] / den for j in norm}
            for j in kept[t]:
                y[idx + (t,)] += gate[j] * _swiglu(xs[t], params, f"experts.{j}")
    if shared_expert is not None:
        y = y + _swiglu(x, params, "shared_experts")
    return y


def _check_dense_soft_mixture(rng):
    # Catalogue: k = E without renormalisation is the dense soft mixture sum_e p_e E_e(x).
    s = _sample(rng, "small", shared=False, num_experts_per_tok=4)
    x, p = s.inputs["x"], s.params
    y = moe_topk_gating(x, p, num_experts_per_tok=4, renormalize=False)
    lg = x @ p["gate.weight"]
    pr = np.exp(lg - lg.max(-1, keepdims=True))
    pr /= pr.sum(-1, keepdims=True)
    ref = sum(pr[..., e, None] * _swiglu(x, p, f"experts.{e}") for e in range(4))
    err = float(np.abs(y - ref).max())
    assert err < 1e-13, f"k = E differs from the dense soft mixture by {err}"
    return err


def _check_topk_softmax_equals_renormalized(rng):
    # Softmax over the top-k logits == softmax over all, top-k, renormalised (no dropping).
    s = _sample(rng, "small", num_experts_per_tok=2)
    cfg = {k: v for k, v in s.config.items() if k not in ("capacity_factor", "dynamic_threshold")}
    y1, c1 = moe_topk_gating_forward(**s.inputs, params=s.params, **dict(cfg, score_order="topk_softmax"))
    y2, c2 = moe_topk_gating_forward(**s.inputs, params=s.params, **dict(cfg, score_order="softmax_topk",
                                                                          renormalize=True))
    g = rng.standard_normal(y1.shape)
    g1, g2 = moe_topk_gating_backward(g, c1), moe_topk_gating_backward(g, c2)
    err = max(float(np.abs(y1 - y2).max()), max(float(np.abs(g1[k] - g2[k]).max()) for k in g1))
    assert err < 1e-13, f"topk_softmax and renormalised softmax_topk differ by {err}"
    return err


def _check_aux_and_z_loss_gradients(rng):
    # The auxiliary losses' gradients through the layer, FD-checked: out = [L_aux, L_z] as a
    # function of x and the router (the experts do not enter the losses; they ride in the config).
    from ..testing import gradcheck

    def fwd(x, params, experts, **cfg):
        y, c = moe_topk_gating_forward(x, {**params, **experts}, **cfg)
        c["_y"] = y
        return np.array([c["aux_loss"], c["z_loss"]]), c

    def bwd(g, c):
        grads = moe_topk_gating_backward(np.zeros_like(c["_y"]), c, daux_loss=float(g[0]), dz_loss=float(g[1]))
        return {k: v for k, v in grads.items() if k in ("x", "gate.weight")}

    worst = 0.0
    for variant in (str(rng.choice(AUX_LOSS_VARIANTS)),):  # every variant: tests/test_blocks_b3.py
        s = _sample(rng, "tiny", shared=False, aux_loss=variant)
        experts = {k: v for k, v in s.params.items() if k != "gate.weight"}
        s = Sample(s.inputs, {"gate.weight": s.params["gate.weight"]}, dict(s.config, experts=experts))
        worst = max(worst, gradcheck(fwd, bwd, s).max_rel)
    return worst


def _check_loss_pair_fd(rng):
    # The standalone load-balancing pair (every variant, padding mask, per-sequence groups) and the
    # z-loss pair, FD-checked with the selection held fixed.
    from ..testing import gradcheck

    def fwd(router_logits, variant, balance_over, token_mask):
        lb, c1 = load_balancing_loss_forward(router_logits, top_k=2, variant=variant, balance_over=balance_over,
                                             token_mask=token_mask)
        z, c2 = router_z_loss_forward(router_logits, token_mask=token_mask)
        return np.array([lb, z]), (c1, c2)

    def bwd(g, c):
        return {"router_logits": load_balancing_loss_backward(g[0], c[0])["router_logits"]
                + router_z_loss_backward(g[1], c[1])["router_logits"]}

    worst = 0.0
    for variant in AUX_LOSS_VARIANTS:
        for over in (str(rng.choice(BALANCE_OVER)),):
            while True:
                lg = 2.0 * rng.standard_normal((2, 4, 4))
                srt = -np.sort(-lg, axis=-1)
                if np.min(srt[..., 0] - srt[..., 1]) > 0.05 and np.min(srt[..., 1] - srt[..., 2]) > 0.05:
                    break
            mask = rng.random((2, 4)) < 0.8
            mask[:, 0] = True
            s = Sample({"router_logits": lg}, None, {"variant": variant, "balance_over": over, "token_mask": mask})
            worst = max(worst, gradcheck(fwd, bwd, s).max_rel)
    return worst


def _check_uniform_router_loss(rng):
    # A uniform router (zero logits) gives L_aux = k ("topk") or 1 ("switch", "topk_normalized")
    # whatever the tie-breaking, and L_z = log(E)^2.
    lg = np.zeros((2, 5, 4))
    err = 0.0
    for variant, want in (("topk", 3.0), ("switch", 1.0), ("topk_normalized", 1.0)):
        for over in BALANCE_OVER:
            val = float(load_balancing_loss_forward(lg, top_k=3, variant=variant, balance_over=over)[0])
            err = max(err, abs(val - want))
    err = max(err, abs(float(router_z_loss_forward(lg)[0]) - np.log(4.0) ** 2))
    assert err < 1e-14, f"uniform-router losses off by {err}"
    return err


register(
    Mechanism(
        slug="moe_topk_gating", family="5-building-blocks", tier="T2",
        official_code="huggingface/transformers src/transformers/models/mixtral/modeling_mixtral.py@00d4b3d (MixtralSparseMoeBlock)",
        title="Top-k mixture-of-experts FFN (softmax/top-k order, renormalisation, capacity, dynamic k, "
              "load-balancing and z-losses)",
        paper="Zheng, Ren, Xia, Xiao, Xie, Dense2MoE: Restructuring Diffusion Transformer to MoE for Efficient "
              "Text-to-Image Generation, ICCV 2025, arXiv 2510.09094; Piorczynski, Szatkowski, Balazy, Wojcik, "
              "Exploiting Transformer Activation Sparsity with Dynamic Inference, arXiv 2310.04361; layer and "
              "losses as in Fedus, Zoph, Shazeer, Switch Transformers, JMLR 2022, arXiv 2101.03961",
        forward=moe_topk_gating_forward, backward=moe_topk_gating_backward, sample=_sample, reference=_reference,
        docs="blocks/routing-and-gating.md#top-k-mixture-of-experts",
        checks={"dense_soft_mixture_when_k_equals_E": _check_dense_soft_mixture,
                "topk_softmax_equals_renormalized": _check_topk_softmax_equals_renormalized,
                "aux_and_z_loss_gradients": _check_aux_and_z_loss_gradients,
                "loss_pairs_fd": _check_loss_pair_fd,
                "uniform_router_losses": _check_uniform_router_loss},
    ),
)
