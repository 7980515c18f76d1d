r"""Routing helpers shared by the routed blocks: top-k selection, capacity, gates, balance losses.

Used by `refattn.blocks.moe` (``moe_topk_gating``) and `refattn.blocks.moh`
(``mixture_of_head_attention``); public so that a user can route their own experts the same way.
All functions here are unvalidated except the two loss pairs, which a user calls directly.

Selection (held fixed in every backward)
----------------------------------------
With router probabilities $p = \mathrm{softmax}(\ell)$ over $E$ experts, `topk_mask` marks the
$k$ largest entries of each row (ties, which the samplers avoid, go to the lower index, as a
stable sort does; ``torch.topk`` leaves their order unspecified). The optional dynamic-$k$ rule of
DSTI / D2DMoE (Piórczyński, Szatkowski, Bałazy, Wójcik, arXiv 2310.04361) keeps only the selected
experts with $p_e \ge \tau\max_j p_j$ (`threshold_mask`). `capacity_mask` then drops the
assignments an expert cannot take: along the token axis $-2$ (one *group* per sequence), expert
$e$ keeps at most $c$ of the tokens that chose it, in one of three priorities:

* ``"slot"`` — all first choices in token order, then all second choices, ... (GShard;
  DeepSpeed ``top2gating``: ``locations2 += sum(mask1)``);
* ``"token"`` — token order, all choices of a token together (HF Switch ``cumsum(expert_index,
  dim=-2) <= expert_capacity``; DeepSpeed ``topkgating(drop_policy="position")``);
* ``"probs"`` — the $c$ tokens with the largest router probability (DeepSpeed
  ``topkgating(drop_policy="probs")``, batch-prioritised routing).

`expert_capacity` is $c = \max(\lceil k\,\phi\,N/E\rceil, c_{min})$ for a capacity factor $\phi$
(DeepSpeed ``_capacity`` with $\phi k$: ``top1gating`` $\phi$, ``top2gating`` $2\phi$).

Gates (differentiable, selection fixed)
---------------------------------------
`gates_forward` turns logits and the fixed masks into the combine weights $g$ (zero outside the
kept set $K$). With $p = \mathrm{softmax}(\ell)$, the renormalisation set $R$ (the selection, or
the kept set when renormalising after dropping) and $d = \max(\sum_{j\in R}p_j, \epsilon)$
($\epsilon$ = the dtype's machine epsilon, DeepSpeed's and MoH's clamp):

* ``order="softmax_topk"``: $g_i = [i\in K]\,p_i / d$ with ``renormalize=True`` (Mixtral, MoH,
  DeepSpeed top-2/top-k), $g_i = [i\in K]\,p_i$ without (Switch top-1, Qwen2-MoE's default);
* ``order="topk_softmax"``: $g = \mathrm{softmax}$ of the logits restricted to $R$, times
  $[i\in K]$ (mistral-inference ``MoeLayer``: ``topk`` of the logits, then softmax). Without
  dropping it equals ``softmax_topk`` with renormalisation exactly (a named check).

Backward: with $\bar g = \sum_i dg_i\,g_i$, $dp_i = ([i\in K]\,dg_i - [i\in R][s\ge\epsilon]\,\bar g)/d$
(renormalised) or $[i\in K]\,dg_i$, then $d\ell = p\odot(dp - \langle dp, p\rangle)$ (the softmax
VJP of `refattn.nn.softmax`). For ``topk_softmax`` it is the softmax VJP on $R$ with
$dq = [i\in K]\,dg$. Unselected experts get no gradient through the gates.

Load-balancing loss (`load_balancing_loss_forward` / `_backward`)
-----------------------------------------------------------------
Over the tokens $t$ of a group (weights $w_t\in\{0,1\}$ from an optional ``token_mask``,
HF Mixtral's ``attention_mask``), $f_e = \sum_t w_t\,m_{te}/\sum_t w_t$ (the fraction of tokens
routed to $e$, $m$ a top-1 or top-$k$ mask of the router probabilities, held fixed) and
$P_e = \sum_t w_t\,p_{te}/\sum_t w_t$:

$$L_{aux} = \frac{c}{G}\sum_{g=1}^{G}\sum_e f_{ge}P_{ge},\qquad
c = E\ (\text{``switch''}, \text{``topk''}),\quad c = E/k\ (\text{``topk\_normalized''}).$$

``variant="switch"``: $m$ = the top-1 choice (Switch, GShard, fairseq and DeepSpeed
``top1gating``/``top2gating``: ``ce = mean(mask1)``); ``"topk"``: $m$ = the top-$k$ set, so
$\sum_e f_e = k$ (HF Mixtral ``load_balancing_loss_func``, MoH ``l_aux``); ``"topk_normalized"``:
``"topk"`` divided by $k$ (DeepSpeed ``topkgating``). ``balance_over="batch"`` is one group of
all tokens (Mixtral, DeepSpeed, MoH), ``"sequence"`` one group per sequence, averaged (HF Switch's
per-group means). A uniform router gives $L_{aux} = 1$ (``"switch"``, ``"topk_normalized"``) or
$k$ (``"topk"``). The gradient flows through $P$ only ($f$ counts a fixed selection):

$$\frac{\partial L_{aux}}{\partial p_{te}} = \frac{c}{G}\,\frac{w_t f_{ge}}{\sum_{t'} w_{t'}},\qquad
d\ell_t = p_t\odot(dp_t - \langle dp_t, p_t\rangle).$$

Router z-loss (ST-MoE; HF Switch ``router_z_loss_func``): $L_z = \sum_t w_t\,(\log\sum_e
e^{\ell_{te}})^2/\sum_t w_t$, $\partial L_z/\partial\ell_t = 2\,w_t\,\mathrm{lse}_t\,p_t/\sum w$.

How a user adds them to the loss: the total loss is $L = L_{task} + \alpha L_{aux} + \beta L_z$
(HF: ``router_aux_loss_coef`` 0.001 for Mixtral and Switch, ``router_z_loss_coef`` 0.001; MoH:
0.01 times the mean over layers). Either pass ``daux_loss=alpha`` (and ``dz_loss=beta``) to a
routed block's backward, which adds $\alpha\,\partial L_{aux}/\partial\theta$ to every gradient,
or collect ``cache["router_logits"]`` of several layers, evaluate these pairs on them and hand
$\alpha\,\partial L_{aux}/\partial\ell$ back as the block backward's ``drouter_logits``.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, check_choice, check_int
from ..nn.softmax import apply_mask, softmax_lse, softmax_vjp

__all__ = [
    "SCORE_ORDERS", "CAPACITY_PRIORITIES", "AUX_LOSS_VARIANTS", "BALANCE_OVER",
    "topk_mask", "threshold_mask", "expert_capacity", "capacity_mask", "gates_forward", "gates_backward",
    "load_balancing_loss_forward", "load_balancing_loss_backward", "router_z_loss_forward", "router_z_loss_backward",
]

SCORE_ORDERS = ("softmax_topk", "topk_softmax")
CAPACITY_PRIORITIES = ("slot", "token", "probs")
AUX_LOSS_VARIANTS = ("switch", "topk", "topk_normalized")
BALANCE_OVER = ("batch", "sequence")


# --------------------------------------------------------------------------------------------
# Selection


def topk_mask(scores: np.ndarray, k: int) -> np.ndarray:
    """Boolean mask of the ``k`` largest entries along the last axis (ties to the lower index)."""
    order = np.argsort(-scores, axis=-1, kind="stable")[..., :k]
    mask = np.zeros(scores.shape, dtype=bool)
    np.put_along_axis(mask, order, True, axis=-1)
    return mask


def threshold_mask(probs: np.ndarray, tau: float) -> np.ndarray:
    r"""DSTI's dynamic-$k$ rule: $p_e \ge \tau\max_j p_j$ along the last axis."""
    return probs >= tau * probs.max(axis=-1, keepdims=True)


def expert_capacity(num_tokens: int, num_experts: int, k: int, capacity_factor: float, min_capacity: int = 0) -> int:
    r"""$\max(\lceil k\,\phi\,N/E\rceil, c_{min})$ (DeepSpeed ``_capacity`` with factor $k\phi$)."""
    return max(int(np.ceil(num_tokens / num_experts * capacity_factor * k - 1e-12)), int(min_capacity))


def capacity_mask(sel: np.ndarray, probs: np.ndarray, capacity: int, priority: str = "slot") -> np.ndarray:
    """The assignments of ``sel (..., N, E)`` each expert keeps within ``capacity`` per group
    (axis -2), in the priority ``"slot"``, ``"token"`` or ``"probs"`` (module docstring)."""
    if priority == "token":
        return sel & (np.cumsum(sel, axis=-2) <= capacity)
    if priority == "probs":
        score = np.where(sel, probs, -np.inf)
        order = np.argsort(-score, axis=-2, kind="stable")
        rank = np.empty_like(order)
        np.put_along_axis(rank, order, np.arange(sel.shape[-2]).reshape(-1, 1), axis=-2)
        return sel & (rank < capacity)
    # "slot": rank of each selected expert within its token's choices (0 = first choice)
    slot = np.argsort(np.argsort(-np.where(sel, probs, -np.inf), axis=-1, kind="stable"), axis=-1)
    keep = np.zeros_like(sel)
    offset = np.zeros(sel.shape[:-2] + (1, sel.shape[-1]), dtype=np.int64)
    for r in range(int(sel.sum(axis=-1).max(initial=0))):
        m = sel & (slot == r)
        loc = np.cumsum(m, axis=-2) - 1 + offset
        keep |= m & (loc < capacity)
        offset = offset + m.sum(axis=-2, keepdims=True)
    return keep


# --------------------------------------------------------------------------------------------
# Gates with the selection held fixed


def gates_forward(logits: np.ndarray, keep: np.ndarray, norm_set: np.ndarray, *, order: str = "softmax_topk",
                  renormalize: bool = True):
    r"""Combine weights $g$ (zero outside ``keep``) from ``logits (..., E)`` (module docstring).

    ``norm_set`` is the set $R$ a renormalisation divides by (the selection, or ``keep`` when
    renormalising after dropping). Returns ``(g, probs, cache)``; ``probs`` is the full softmax.
    """
    p, _ = softmax_lse(logits)
    if order == "topk_softmax":
        q, _ = softmax_lse(apply_mask(logits, norm_set))
        return q * keep, p, ("topk_softmax", q, keep)
    if not renormalize:
        return p * keep, p, ("plain", p, keep)
    s = np.sum(p * norm_set, axis=-1, keepdims=True)
    eps = np.finfo(p.dtype).eps
    d = np.maximum(s, eps)
    g = p * keep / d
    return g, p, ("renorm", p, keep, norm_set, g, d, s >= eps)


def gates_backward(dg: np.ndarray, cache) -> np.ndarray:
    """VJP of `gates_forward` with the masks fixed: ``dlogits``."""
    kind, p, keep = cache[:3]
    if kind == "topk_softmax":
        return softmax_vjp(p, dg * keep)
    if kind == "plain":
        return softmax_vjp(p, dg * keep)
    norm_set, g, d, live = cache[3:]
    gbar = np.sum(dg * g, axis=-1, keepdims=True)
    dp = (dg * keep - norm_set * live * gbar) / d
    return softmax_vjp(p, dp)


# --------------------------------------------------------------------------------------------
# Auxiliary losses on router logits


def _loss_inputs(router_logits, token_mask, balance_over):
    lg = as_float(router_logits, "router_logits", min_ndim=2)
    check_choice(balance_over, "balance_over", BALANCE_OVER)
    if token_mask is None:
        w = np.ones(lg.shape[:-1], dtype=lg.dtype)
    else:
        tm = np.asarray(token_mask)
        if tm.dtype != np.bool_ and tm.dtype.kind not in "fiu":
            raise TypeError(f"token_mask must be a boolean or 0/1 array; got dtype {tm.dtype}")
        if tm.shape != lg.shape[:-1]:
            raise ValueError(f"token_mask must have router_logits' token shape {lg.shape[:-1]}; got {tm.shape}")
        if tm.dtype != np.bool_ and not np.isin(tm, (0, 1)).all():
            raise ValueError("token_mask must hold 0/1 (or booleans)")
        w = tm.astype(lg.dtype)
    axes = tuple(range(lg.ndim - 1)) if balance_over == "batch" else (lg.ndim - 2,)
    return lg, w, axes


def load_balancing_loss_forward(router_logits, *, top_k: int = 2, variant: str = "topk", balance_over: str = "batch",
                                token_mask=None):
    r"""Switch/GShard-style load-balancing loss $L_{aux}$ of ``router_logits (..., N, E)``.

    Parameters
    ----------
    router_logits : array (..., N, E)
        Pre-softmax router scores (``cache["router_logits"]`` of a routed block).
    top_k : int
        $k$ for ``"topk"`` and ``"topk_normalized"`` (ignored by ``"switch"``).
    variant : {"switch", "topk", "topk_normalized"}
        Which tokens count for $f_e$ and the constant $c$ (module docstring).
    balance_over : {"batch", "sequence"}
        One group of all tokens, or one per sequence (axis -2), averaged.
    token_mask : bool array (..., N), optional
        False for padding tokens, which are left out of $f$ and $P$.

    Returns
    -------
    loss, cache
        ``loss`` a 0-d array; ``load_balancing_loss_backward(dloss, cache)`` gives
        ``{"router_logits": ...}``.
    """
    lg, w, axes = _loss_inputs(router_logits, token_mask, balance_over)
    check_choice(variant, "variant", AUX_LOSS_VARIANTS)
    e = lg.shape[-1]
    k = check_int(top_k, "top_k", minimum=1)
    if k > e:
        raise ValueError(f"top_k must be <= the number of experts {e} (router_logits' last axis); got {k}")
    p, _ = softmax_lse(lg)
    m = topk_mask(p, 1 if variant == "switch" else k)
    wk = w[..., None]
    n = np.sum(wk, axis=axes, keepdims=True)
    n_safe = np.where(n > 0, n, 1.0)
    f = np.sum(wk * m, axis=axes, keepdims=True) / n_safe
    pm = np.sum(wk * p, axis=axes, keepdims=True) / n_safe
    c = e / k if variant == "topk_normalized" else float(e)
    groups = f.size // e
    loss = np.asarray(c / groups * np.sum(f * pm), dtype=lg.dtype)
    cache = {"p": p, "f": f, "wk": wk, "n": n_safe, "scale": c / groups, "shape": lg.shape}
    return loss, cache


def load_balancing_loss_backward(dloss, cache):
    r"""Gradient of `load_balancing_loss_forward`: ``{"router_logits": dL/dl}`` (selection fixed)."""
    p = cache["p"]
    g = as_dout(dloss, (), p.dtype, name="dloss")
    dp = g * cache["scale"] * cache["wk"] * cache["f"] / cache["n"]
    return {"router_logits": softmax_vjp(p, np.broadcast_to(dp, p.shape))}


def router_z_loss_forward(router_logits, *, token_mask=None):
    r"""Router z-loss $L_z$ = mean over tokens of $(\log\sum_e e^{\ell_e})^2$ (ST-MoE).

    Returns ``(loss, cache)``; ``loss`` a 0-d array. ``token_mask`` as in
    `load_balancing_loss_forward`.
    """
    lg, w, axes = _loss_inputs(router_logits, token_mask, "batch")
    p, lse = softmax_lse(lg)
    n = max(float(w.sum()), 1.0)
    return np.asarray(np.sum(w * lse * lse) / n, dtype=lg.dtype), {"p": p, "lse": lse, "w": w, "n": n}


def router_z_loss_backward(dloss, cache):
    r"""Gradient of `router_z_loss_forward`: $2\,w_t\,\mathrm{lse}_t\,p_t/\sum w$."""
    p = cache["p"]
    g = as_dout(dloss, (), p.dtype, name="dloss")
    return {"router_logits": (g * 2.0 / cache["n"]) * (cache["w"] * cache["lse"])[..., None] * p}
