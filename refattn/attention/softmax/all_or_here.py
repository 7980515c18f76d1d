r"""All-or-Here Attention (AHA): a per-(token, head) binary router between full causal and sliding-window attention.

Forward
-------
Every attention head $h$ of token $t$ either reads the whole causal context ("All") or only the
last $w$ tokens ("Here"). With $q_{t,h}, k_{j,h}, v_{j,h}$ the usual projections,

$$F_{t,h} = \sum_{j\le t}\mathrm{softmax}_j(s\,q_{t,h}\!\cdot k_{j,h})\,v_{j,h},\qquad
L_{t,h} = \sum_{t-w<j\le t}\mathrm{softmax}_j(s\,q_{t,h}\!\cdot k_{j,h})\,v_{j,h},$$

$$r_{t,h} = \mathbb 1\big[\sigma(g_{t,h}) > \tau\big],\qquad
o_{t,h} = r_{t,h}\,F_{t,h} + (1 - r_{t,h})\,L_{t,h},$$

$s = 1/\sqrt d$, $\tau = 0.5$. The router logit $g_{t,h}$ is one extra output channel per head of
the query projection (no separate router matrix, no bias): the layer's ``q_proj`` maps
$C \to H d + H$ and its last $H$ columns are the logits. The full layer (upstream's OLMo-2
attention) is

$$[\tilde Q \,|\, G] = XW_q,\quad \tilde K = XW_k,\quad V = XW_v,\quad
Q = \mathrm{RoPE}(\mathrm{RMSNorm}_{\gamma_q}(\tilde Q)),\quad K = \mathrm{RoPE}(\mathrm{RMSNorm}_{\gamma_k}(\tilde K)),$$

$$Y = [o_{\cdot,1}\|\dots\|o_{\cdot,H}]\,W_o,$$

with the RMSNorms over the whole projected width (OLMo-2's ``q_norm``/``k_norm``, keyword
``qk_norm``) and rotate-half RoPE at positions $0..N-1$ (keyword ``rope_base``; ``None`` skips it).
GQA: $K, V$ have $H_{kv}$ heads, query head $h$ uses kv head $\lfloor h/(H/H_{kv})\rfloor$.

Training (the paper's estimator)
--------------------------------
The route is a hard step, so the true derivative of $Y$ in $g$ is zero almost everywhere. AHA
trains the router with a straight-through estimator, forward $r$, backward through
$\sigma(g)$ ($r_{\text{ste}} = r + \sigma(g) - \mathrm{sg}[\sigma(g)]$), plus a sparsity penalty
$\lambda\,\mathrm{mean}(\sigma(g))$ on the soft gate ($\lambda = 3\cdot10^{-4}$) that pushes heads
towards the local branch.

Backward
--------
Let $dO_{t,h}$ be the head output gradient ($dO = \mathrm{split}(dY\,W_o^\top)$,
$dW_o = \mathrm{merge}(O)^\top dY$). With the route **held fixed** (``gate_grad="fixed"``, the
default: the exact gradient wherever no $\sigma(g)$ sits exactly on $\tau$)

$$dF_{t,h} = r_{t,h}\,dO_{t,h},\qquad dL_{t,h} = (1 - r_{t,h})\,dO_{t,h},\qquad dg_{t,h} = 0,$$

and each branch goes through the attention VJP (`attention_core_backward`: $dP = dF\,V^\top$,
$dS = P\odot(dP - \mathrm{rowsum}(dP\odot P))$, $dQ = s\,dS\,K$, $dK = s\,dS^\top Q$,
$dV = P^\top dF$); the two branches' $dQ, dK, dV$ add. With ``gate_grad="ste"`` the router gets
the straight-through gradient

$$dg_{t,h} = \sigma'(g_{t,h})\,\langle dO_{t,h},\,F_{t,h} - L_{t,h}\rangle,\qquad \sigma' = \sigma(1-\sigma),$$

which is the exact gradient of the relaxation $o = \sigma(g)F + (1-\sigma(g))L$
(``router="soft"``, smooth, FD-checked) because $o$ is affine in the gate and $dO$ does not depend
on it. The penalty enters through the backward's ``dgate`` argument (an upstream gradient on
$\sigma(g)$, see `aha_sparsity_penalty`): $dg \mathrel{+}= dgate\cdot\sigma'(g)$. Then
$d\tilde Q$ is RoPE's transpose ($R(-\phi)$) followed by the RMSNorm VJP
$dx = \rho^{-1}(d\hat x - \hat x\,\mathrm{mean}(d\hat x\odot\hat x))$, $d\gamma = \sum dy\odot\hat x$
(`refattn.nn.norms`), and $dX = [d\tilde Q\,|\,dG]W_q^\top + d\tilde K W_k^\top + dV W_v^\top$,
$dW_q = X^\top[d\tilde Q\,|\,dG]$, $dW_k = X^\top d\tilde K$, $dW_v = X^\top dV$.

Conventions (keyword, default)
------------------------------
``window`` $w$ = 256 (the paper's headline setting; the vLLM port uses 128): key $j$ is local to
query $t$ iff $0\le t-j < w$ (vLLM ``sliding_window = w`` = flash-attn ``window_size=(w-1, 0)``),
so $w\ge N$ makes both branches equal. ``tau`` 0.5, strict ``>``. ``router`` ``"hard"``
(upstream forward) or ``"soft"`` (the relaxation the STE differentiates). ``gate_grad``
``"fixed"`` or ``"ste"``. ``qk_norm`` True, ``rms_norm_eps`` 1e-6 (OLMo-2). ``rope_base``
500000 (OLMo-2-1B ``rope_theta``), non-interleaved. Weights ``(in, out)`` = torch ``weight.T``;
upstream has no biases (optional ``*.bias`` keys are accepted).

Paper: X. Luo, K. Zhang, X. Yan, "Learning When Not to Attend Globally" (All-or-Here Attention),
arXiv 2512.22562, 2025. The official training code (``xuan-luo/AHA-OLMO2``, ``modeling_faolmo.py``)
is not in the code index; read instead: wesleytruong/vllm-aha (an author's inference port of the
AHA-OLMO2 checkpoint) ``vllm/model_executor/models/olmo2_aha.py`` @
aedfaa151ded7983c805284dfb80b555e757f2d4 (``Olmo2AHAAttention``: fused ``q_proj`` gate, ``q_norm``,
``k_norm``, RoPE, hard gate, blend) and luoxuan-cs/All-or-Here-Native-Sparse-Attention
``fla/layers/ahnsa.py`` and ``AHNSA_DESIGN.md`` @ df771661d02a34c8dfaee88b4582f72cf513945f (the first
author's follow-up, which documents AHA's STE, $\tau = 0.5$ and $\lambda\,\mathrm{mean}(\sigma(g))$ with
$\lambda = 3\cdot10^{-4}$).

Measured agreement (float64, CPU, torch 2.13; transcribed, since the vLLM layer needs vLLM's
kernels): ``Olmo2AHAAttention.forward`` written in torch (``q_proj`` split, RMSNorm q/k, neox RoPE,
masked ``scaled_dot_product_attention`` for the full and the $w$-window branches, hard blend,
``o_proj``) with the route as a constant, with AHNSA's STE, and with the soft relaxation, against
autograd, over four shapes ($H/H_{kv}$ = 4/2, 2/2, 4/1, 2/1; $N$ 5-9; $w$ 2-8, including $w > N$):
output max abs error 2.7e-15; gradients of $x$ and of every weight max abs error 5.8e-15 for
``gate_grad="fixed"`` and ``"ste"`` (the gate columns of ``q_proj`` included), 3.6e-15 for
``router="soft"``.
"""

from __future__ import annotations

import numpy as np

from ..._checks import (
    as_dout,
    as_float,
    cast_all,
    check_choice,
    check_int,
    check_params,
    check_positive,
    check_weight_in,
    compute_dtype,
)
from ...nn.activations import sigmoid
from ...nn.linear import linear_prefixed, linear_prefixed_spec, linear_prefixed_vjp, merge_heads, split_heads
from ...nn.norms import rms_norm_backward, rms_norm_forward
from ...nn.rope import apply_rope, rope_angles
from ...registry import Mechanism, Sample, register
from .core import attention_core_backward, attention_core_forward

__all__ = ["AHA_ROUTERS", "AHA_GATE_GRADS", "aha_route", "aha_local_keep", "aha_mix_forward", "aha_mix_backward",
           "aha_sparsity_penalty", "all_or_here_forward", "all_or_here_backward", "all_or_here",
           "init_all_or_here_params"]

AHA_ROUTERS = ("hard", "soft")
AHA_GATE_GRADS = ("fixed", "ste")


def aha_route(gate_logits, *, tau: float = 0.5) -> np.ndarray:
    r"""The hard route $r = \mathbb 1[\sigma(g) > \tau]$ (1: full attention, 0: sliding window), as floats."""
    g = as_float(gate_logits, "gate_logits")
    tau = _check_tau(tau)
    return (sigmoid(g) > tau).astype(g.dtype)


def aha_local_keep(n: int, window: int) -> np.ndarray:
    r"""Boolean ``(n, n)`` keep-mask of the local branch: key $j$ visible to query $t$ iff $0\le t-j<w$."""
    d = np.arange(n)[:, None] - np.arange(n)[None, :]
    return (d >= 0) & (d < window)


def _check_tau(tau):
    tau = check_positive(tau, "tau")
    if not tau < 1.0:
        raise ValueError(f"tau must be in (0, 1) (a threshold on sigmoid(gate)); got {tau}")
    return tau


def aha_mix_forward(q, k, v, gate_logits, *, window: int = 256, tau: float = 0.5, router: str = "hard",
                    gate_grad: str = "fixed", scale=None, kv_group_map: str = "contiguous"):
    r"""The AHA core: route every (head, query) between causal full and sliding-window attention.

    Parameters
    ----------
    q : array (B, H, N, d)
    k, v : arrays (B, H_kv, N, d) and (B, H_kv, N, dv)
    gate_logits : array (B, H, N)
        Router logits $g$ (upstream's ``[B, T, H]`` transposed to the head-major layout).
    window : int >= 1
        Local reach $w$: key $j$ is local to query $t$ iff $0\le t-j<w$.
    tau : float in (0, 1)
        Threshold on $\sigma(g)$.
    router : {"hard", "soft"}
        ``"hard"``: $r = \mathbb 1[\sigma(g)>\tau]$ (upstream); ``"soft"``: $r = \sigma(g)$.
    gate_grad : {"fixed", "ste"}
        For ``router="hard"``: ``"fixed"`` holds the route fixed ($dg = 0$), ``"ste"`` returns
        the straight-through gradient. Ignored by ``router="soft"`` (exact gradient).
    scale : float > 0, optional
        Score scale, default $1/\sqrt d$.
    kv_group_map : {"contiguous", "strided"}

    Returns
    -------
    out, cache
        ``out (B, H, N, dv)``; ``cache["route"]`` the gate used in the blend (B, H, N) and
        ``cache["gate_soft"]`` $\sigma(g)$.
    """
    q = as_float(q, "q", ndim=4)
    k = as_float(k, "k", ndim=4)
    if k.shape[-2] != q.shape[-2]:
        raise ValueError(f"q and k must have the same sequence length (self-attention); got {q.shape}, {k.shape}")
    g = as_float(gate_logits, "gate_logits", ndim=3)
    if g.shape != q.shape[:3]:
        raise ValueError(f"gate_logits must have shape (B, H, N) = {q.shape[:3]}; got {g.shape}")
    window = check_int(window, "window", minimum=1)
    tau = _check_tau(tau)
    check_choice(router, "router", AHA_ROUTERS)
    check_choice(gate_grad, "gate_grad", AHA_GATE_GRADS)
    n = q.shape[-2]
    full, cf = attention_core_forward(q, k, v, is_causal=True, scale=scale, kv_group_map=kv_group_map)
    local, cl = attention_core_forward(q, k, v, attn_mask=aha_local_keep(n, window), scale=scale,
                                       kv_group_map=kv_group_map)
    dt = full.dtype
    g = g.astype(dt, copy=False)
    soft = sigmoid(g)
    r = soft if router == "soft" else (soft > tau).astype(dt)
    out = r[..., None] * full + (1.0 - r[..., None]) * local
    cache = {"cf": cf, "cl": cl, "full": full, "local": local, "route": r, "gate_soft": soft,
             "gate_on": router == "soft" or gate_grad == "ste", "shape": out.shape, "dtype": dt}
    return out, cache


def aha_mix_backward(dout, cache, *, dgate=None):
    r"""Gradient of :func:`aha_mix_forward` for ``q, k, v, gate_logits``.

    ``dgate`` (optional, shape (B, H, N)) is an upstream gradient on the soft gate $\sigma(g)$
    (the sparsity penalty); it reaches ``gate_logits`` as $dgate\cdot\sigma'(g)$ in every mode.
    """
    dt = cache["dtype"]
    do = as_dout(dout, cache["shape"], dt)
    r = cache["route"][..., None]
    gf = attention_core_backward(r * do, cache["cf"])
    gl = attention_core_backward((1.0 - r) * do, cache["cl"])
    soft = cache["gate_soft"]
    ds = np.zeros_like(soft)
    if cache["gate_on"]:
        ds = ds + np.sum(do * (cache["full"] - cache["local"]), axis=-1)
    if dgate is not None:
        ds = ds + as_dout(dgate, soft.shape, dt, name="dgate")
    return {"q": gf["q"] + gl["q"], "k": gf["k"] + gl["k"], "v": gf["v"] + gl["v"],
            "gate_logits": ds * soft * (1.0 - soft)}


def aha_sparsity_penalty(cache, *, coefficient: float = 3e-4):
    r"""AHA's router penalty $\lambda\,\mathrm{mean}(\sigma(g))$ from a forward ``cache``.

    Returns ``(value, dgate)``: pass ``dgate`` to the backward (``dgate=``) to add the penalty's
    gradient. ``cache`` is the cache of :func:`aha_mix_forward` or of :func:`all_or_here_forward`.
    """
    coefficient = check_positive(coefficient, "coefficient", allow_zero=True)
    soft = cache["gate_soft"] if "gate_soft" in cache else cache["mix"]["gate_soft"]
    return coefficient * float(soft.mean()), np.full_like(soft, coefficient / soft.size)


def _validate_layer(x, params, num_heads, num_kv_heads, qk_norm):
    x = as_float(x, "x", ndim=3)
    h = check_int(num_heads, "num_heads", minimum=1)
    hkv = h if num_kv_heads is None else check_int(num_kv_heads, "num_kv_heads", minimum=1)
    if h % hkv:
        raise ValueError(f"num_heads ({h}) must be a multiple of num_kv_heads ({hkv})")
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of the layer's weights; got {type(params).__name__}")
    if "q_proj.weight" not in params:
        raise ValueError("params must be a dict with 'q_proj.weight' (C, H*d + H), 'k_proj.weight', "
                         "'v_proj.weight', 'o_proj.weight' (and 'q_norm.weight', 'k_norm.weight' when qk_norm)")
    c = x.shape[-1]
    check_weight_in(params, "q_proj.weight", c, input_name="x")
    check_weight_in(params, "k_proj.weight", c, input_name="x")  # d is read off its output axis
    wq, wk = np.shape(params["q_proj.weight"]), np.shape(params.get("k_proj.weight"))
    d = wk[-1] // hkv if len(wk) == 2 and wk[-1] % hkv == 0 and wk[-1] else (wq[-1] - h) // h if len(wq) == 2 else 0
    if d < 1 or len(wq) != 2 or wq[-1] != h * d + h:
        hint = (f"; it has H*d = {h * d} columns: the {h} router columns are missing" if len(wq) == 2 and wq[-1] == h * d
                else "")
        raise ValueError(f"q_proj.weight must have shape (C, H*d + H) = ({c}, {h * d + h}) (queries, then one router "
                         f"logit per head; H = num_heads = {h}, d = k_proj width / num_kv_heads = {d}); got {wq}{hint}")
    spec = {}
    for name, width in (("q_proj", h * d + h), ("k_proj", hkv * d), ("v_proj", hkv * d)):
        spec.update(linear_prefixed_spec(name, c, width))
    spec.update(linear_prefixed_spec("o_proj", h * d, c))
    if qk_norm:
        spec.update({"q_norm.weight": (h * d,), "k_norm.weight": (hkv * d,)})
    optional = [key for key in spec if key.endswith(".bias")]
    p = check_params(params, spec, optional=optional, where="all_or_here (weights (in, out); PyTorch: weight.T)")
    return x, p, h, hkv, d


def all_or_here_forward(x, params, *, num_heads: int, num_kv_heads=None, window: int = 256, tau: float = 0.5,
                        router: str = "hard", gate_grad: str = "fixed", qk_norm: bool = True,
                        rms_norm_eps: float = 1e-6, rope_base=500000.0, scale=None):
    r"""The AHA attention layer (upstream ``Olmo2AHAAttention``; module docstring for the math).

    Parameters
    ----------
    x : array (B, N, C)
    params : dict
        ``q_proj.weight`` (C, H d + H) (query columns, then one router column per head),
        ``k_proj.weight``/``v_proj.weight`` (C, H_kv d), ``o_proj.weight`` (H d, C); with
        ``qk_norm`` also ``q_norm.weight`` (H d,) and ``k_norm.weight`` (H_kv d,). Optional biases.
    num_heads, num_kv_heads : int
        $H$ and $H_{kv}$ (default $H$).
    window, tau, router, gate_grad
        As in :func:`aha_mix_forward`.
    qk_norm : bool
        RMSNorm of the projected queries and keys over their whole width (OLMo-2).
    rms_norm_eps : float
    rope_base : float or None
        Rotate-half RoPE base at positions ``0..N-1``; ``None``: no RoPE.
    scale : float > 0, optional

    Returns
    -------
    out, cache
        ``out (B, N, C)``; ``cache["route"]`` (B, N, H) the route used, ``cache["gate_soft"]``
        $\sigma(g)$ (B, N, H) (upstream's ``[B, T, H]`` layout).
    """
    if not isinstance(qk_norm, (bool, np.bool_)):
        raise TypeError(f"qk_norm must be a bool; got {type(qk_norm).__name__}")
    x, p, h, hkv, d = _validate_layer(x, params, num_heads, num_kv_heads, qk_norm)
    rms_norm_eps = check_positive(rms_norm_eps, "rms_norm_eps")
    if rope_base is not None:
        rope_base = check_positive(rope_base, "rope_base")
        if d % 2:
            raise ValueError(f"RoPE needs an even head dim; got d = {d} (pass rope_base=None to skip RoPE)")
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    n = x.shape[1]
    qg = linear_prefixed(p, "q_proj", x)
    qt, g = qg[..., : h * d], qg[..., h * d:]
    kt = linear_prefixed(p, "k_proj", x)
    v = linear_prefixed(p, "v_proj", x)
    cq = ck = None
    if qk_norm:
        qt, cq = rms_norm_forward(qt, {"weight": p["q_norm.weight"]}, eps=rms_norm_eps)
        kt, ck = rms_norm_forward(kt, {"weight": p["k_norm.weight"]}, eps=rms_norm_eps)
    qh, kh, vh = split_heads(qt, h, d), split_heads(kt, hkv, d), split_heads(v, hkv, d)
    cos = sin = None
    if rope_base is not None:
        ang = rope_angles(np.arange(n), d, base=rope_base)
        cos, sin = np.cos(ang).astype(dt), np.sin(ang).astype(dt)
        qh, kh = apply_rope(qh, cos, sin), apply_rope(kh, cos, sin)
    o, cm = aha_mix_forward(qh, kh, vh, np.swapaxes(g, 1, 2), window=window, tau=tau, router=router,
                            gate_grad=gate_grad, scale=scale)
    om = merge_heads(o)
    out = linear_prefixed(p, "o_proj", om)
    cache = {"x": x, "p": p, "h": h, "hkv": hkv, "d": d, "cq": cq, "ck": ck, "cos": cos, "sin": sin, "mix": cm,
             "om": om, "route": np.swapaxes(cm["route"], 1, 2).copy(),
             "gate_soft": np.swapaxes(cm["gate_soft"], 1, 2).copy(), "shape": out.shape, "dtype": dt}
    return out, cache


def all_or_here_backward(dout, cache, *, dgate=None):
    r"""Gradient of :func:`all_or_here_forward` for ``x`` and every weight (module docstring).

    ``dgate`` (optional, (B, N, H)) is an upstream gradient on $\sigma(g)$, e.g. from
    :func:`aha_sparsity_penalty`.
    """
    dt = cache["dtype"]
    dy = as_dout(dout, cache["shape"], dt)
    x, p, h, d = cache["x"], cache["p"], cache["h"], cache["d"]
    grads = {}
    dom = linear_prefixed_vjp(grads, p, "o_proj", dy, cache["om"])
    if dgate is not None:
        dgate = np.swapaxes(as_dout(dgate, cache["gate_soft"].shape, dt, name="dgate"), 1, 2)
    gm = aha_mix_backward(split_heads(dom, h, d), cache["mix"], dgate=dgate)
    dq, dk = gm["q"], gm["k"]
    if cache["cos"] is not None:
        dq, dk = apply_rope(dq, cache["cos"], -cache["sin"]), apply_rope(dk, cache["cos"], -cache["sin"])
    dq, dk, dv = merge_heads(dq), merge_heads(dk), merge_heads(gm["v"])
    if cache["cq"] is not None:
        gq, gk = rms_norm_backward(dq, cache["cq"]), rms_norm_backward(dk, cache["ck"])
        dq, dk = gq["x"], gk["x"]
        grads["q_norm.weight"], grads["k_norm.weight"] = gq["weight"], gk["weight"]
    dqg = np.concatenate([dq, np.swapaxes(gm["gate_logits"], 1, 2)], axis=-1)
    dx = linear_prefixed_vjp(grads, p, "q_proj", dqg, x)
    dx = dx + linear_prefixed_vjp(grads, p, "k_proj", dk, x)
    dx = dx + linear_prefixed_vjp(grads, p, "v_proj", dv, x)
    return {"x": dx, **grads}


def all_or_here(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`all_or_here_forward`."""
    return all_or_here_forward(x, params, **config)[0]


def init_all_or_here_params(rng, c: int, num_heads: int, head_dim: int, *, num_kv_heads=None,
                            qk_norm: bool = True) -> dict:
    r"""PyTorch ``nn.Linear`` (bias-free) initialisation of the layer's weights, norms at 1."""
    hkv = num_heads if num_kv_heads is None else num_kv_heads
    out = {}
    for name, n_in, n_out in (("q_proj", c, num_heads * head_dim + num_heads), ("k_proj", c, hkv * head_dim),
                              ("v_proj", c, hkv * head_dim), ("o_proj", num_heads * head_dim, c)):
        bound = 1.0 / np.sqrt(n_in)
        out[f"{name}.weight"] = rng.uniform(-bound, bound, (n_in, n_out))
    if qk_norm:
        out["q_norm.weight"] = np.ones(num_heads * head_dim)
        out["k_norm.weight"] = np.ones(hkv * head_dim)
    return out


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size):
    sizes = {"tiny": (2, 4, 4, 2, 1, 2), "small": (2, 7, 6, 4, 2, 2)}
    b, n, c, h, hkv, d = sizes[size]
    x = rng.standard_normal((b, n, c))
    for _ in range(200):  # gate logits away from the threshold (the route is a step), both routes present
        p = {k: 0.5 * rng.standard_normal(np.shape(w)) for k, w in init_all_or_here_params(rng, c, h, d, num_kv_heads=hkv).items()}
        p["q_proj.weight"][:, h * d:] *= 6.0
        p["q_norm.weight"] = 1.0 + 0.2 * rng.standard_normal(h * d)
        p["k_norm.weight"] = 1.0 + 0.2 * rng.standard_normal(hkv * d)
        g = x @ p["q_proj.weight"][:, h * d:]
        if np.abs(g).min() > 0.05 and 0 < (g > 0).mean() < 1:
            break
    cfg = {"num_heads": h, "num_kv_heads": hkv, "window": 3 if size == "small" else 2, "rope_base": 10.0}
    return Sample(inputs={"x": x}, params=p, config=cfg)


def _reference(x, params=None, *, num_heads, num_kv_heads=None, window=256, tau=0.5, router="hard",
               gate_grad="fixed", qk_norm=True, rms_norm_eps=1e-6, rope_base=500000.0, scale=None):
    # the layer written per (batch, head, query) with explicit loops over the visible keys
    h = num_heads
    hkv = h if num_kv_heads is None else num_kv_heads
    d = (params["q_proj.weight"].shape[1] - h) // h
    qg = x @ params["q_proj.weight"]
    qt, g = qg[..., : h * d], qg[..., h * d:]
    kt, v = x @ params["k_proj.weight"], x @ params["v_proj.weight"]
    if qk_norm:
        qt = qt / np.sqrt((qt ** 2).mean(-1, keepdims=True) + rms_norm_eps) * params["q_norm.weight"]
        kt = kt / np.sqrt((kt ** 2).mean(-1, keepdims=True) + rms_norm_eps) * params["k_norm.weight"]
    b, n, _ = x.shape
    q, k, v = qt.reshape(b, n, h, d), kt.reshape(b, n, hkv, d), v.reshape(b, n, hkv, d)
    if rope_base is not None:
        half = d // 2
        for t in range(n):
            th = t * rope_base ** (-np.arange(half) * 2.0 / d)
            c_, s_ = np.cos(th), np.sin(th)
            for arr in (q, k):
                a, bb = arr[:, t, :, :half].copy(), arr[:, t, :, half:].copy()
                arr[:, t, :, :half], arr[:, t, :, half:] = a * c_ - bb * s_, a * s_ + bb * c_
    sc = d ** -0.5 if scale is None else scale
    o = np.zeros((b, n, h, d))
    for bi in range(b):
        for hh in range(h):
            kv = hh // (h // hkv)
            for t in range(n):
                sg = 1.0 / (1.0 + np.exp(-g[bi, t, hh]))
                r = sg if router == "soft" else float(sg > tau)
                for weight, lo in ((r, 0), (1.0 - r, max(0, t - window + 1))):
                    js = list(range(lo, t + 1))
                    s = np.array([sc * q[bi, t, hh] @ k[bi, j, kv] for j in js])
                    w = np.exp(s - s.max())
                    o[bi, t, hh] += weight * (w / w.sum()) @ v[bi, js, kv]
    return o.reshape(b, n, h * d) @ params["o_proj.weight"]


def _core(rng, n=6, h=2, hkv=1, d=3):
    q = rng.standard_normal((2, h, n, d))
    k, v = rng.standard_normal((2, hkv, n, d)), rng.standard_normal((2, hkv, n, d))
    return q, k, v


def _check_all_full_is_causal(rng):
    from .core import sdpa_reference

    q, k, v = _core(rng)
    y, _ = aha_mix_forward(q, k, v, np.full((2, 2, 6), 4.0), window=2)
    err = float(np.abs(y - sdpa_reference(q, k, v, is_causal=True)).max())
    assert err < 1e-12, err
    return err


def _check_all_local_is_banded(rng):
    from .core import sdpa_reference
    from .masks import band_mask

    q, k, v = _core(rng)
    y, _ = aha_mix_forward(q, k, v, np.full((2, 2, 6), -4.0), window=3)
    err = float(np.abs(y - sdpa_reference(q, k, v, attn_mask=band_mask(6, 6, left=2, right=0))).max())
    assert err < 1e-12, err
    return err


def _check_wide_window_branches_equal(rng):
    q, k, v = _core(rng)
    _, c = aha_mix_forward(q, k, v, rng.standard_normal((2, 2, 6)), window=6)
    err = float(np.abs(c["full"] - c["local"]).max())
    assert err < 1e-14, err
    return err


def _check_route_brute_force(rng):
    g = rng.standard_normal((3, 4, 5)) * 2
    for tau in (0.3, 0.5, 0.8):
        r = aha_route(g, tau=tau)
        bad = sum(r[i] != float(1.0 / (1.0 + np.exp(-g[i])) > tau) for i in np.ndindex(g.shape))
        assert bad == 0, (tau, bad)
    return 0.0


def _check_ste_is_soft_relaxation_gradient(rng):
    # the STE gate gradient equals the exact gradient of the soft blend (the blend is affine in the gate)
    s = _sample(rng, "tiny")
    dy = rng.standard_normal((2, 4, 4))
    _, ch = all_or_here_forward(s.inputs["x"], s.params, gate_grad="ste", **s.config)
    _, cs = all_or_here_forward(s.inputs["x"], s.params, router="soft", **s.config)
    gh, gs = all_or_here_backward(dy, ch), all_or_here_backward(dy, cs)
    hd = s.config["num_heads"] * 2
    err = float(np.abs(gh["q_proj.weight"][:, hd:] - gs["q_proj.weight"][:, hd:]).max())
    assert err < 1e-12, err
    return err


def _check_soft_router_directional(rng):
    # the relaxation is smooth everywhere: a random-direction VJP-vs-JVP check over every array at once
    from ...testing.gradcheck import directional_check

    s = _sample(rng, "tiny")
    s.config["router"] = "soft"
    return max(directional_check(all_or_here_forward, all_or_here_backward, s, seed=i).max_rel for i in range(3))


def _check_penalty_gradient(rng):
    # d/dg of  <u, y> + lambda mean(sigmoid(g))  through the layer, against central differences
    s = _sample(rng, "tiny")
    u = rng.standard_normal((2, 4, 4))
    lam = 0.7

    def loss(wq):
        p = dict(s.params, **{"q_proj.weight": wq})
        y, c = all_or_here_forward(s.inputs["x"], p, router="soft", **s.config)
        return float((u * y).sum()) + aha_sparsity_penalty(c, coefficient=lam)[0]

    _, c = all_or_here_forward(s.inputs["x"], s.params, router="soft", **s.config)
    grad = all_or_here_backward(u, c, dgate=aha_sparsity_penalty(c, coefficient=lam)[1])["q_proj.weight"]
    wq, eps, err = s.params["q_proj.weight"], 1e-6, 0.0
    for idx in [(0, 4), (1, 5), (2, 1)]:
        wp, wm = wq.copy(), wq.copy()
        wp[idx] += eps
        wm[idx] -= eps
        fd = (loss(wp) - loss(wm)) / (2 * eps)
        err = max(err, abs(fd - grad[idx]) / max(1.0, abs(fd)))
    assert err < 1e-7, err
    return err


register(
    Mechanism(
        slug="all_or_here_attention", family="1-softmax", tier="T2",
        title="All-or-Here Attention: per-(token, head) hard router between full and sliding-window attention",
        paper="X. Luo, K. Zhang, X. Yan, Learning When Not to Attend Globally (All-or-Here Attention), "
              "arXiv 2512.22562, 2025",
        official_code="xuan-luo/AHA-OLMO2 (not indexed); read wesleytruong/vllm-aha olmo2_aha.py",
        forward=all_or_here_forward, backward=all_or_here_backward, sample=_sample, reference=_reference,
        docs="softmax/s8.md#all-or-here-attention",
        checks={"all_full_is_causal_sdpa": _check_all_full_is_causal,
                "all_local_is_banded": _check_all_local_is_banded,
                "wide_window_branches_equal": _check_wide_window_branches_equal,
                "route_brute_force": _check_route_brute_force,
                "ste_is_soft_relaxation_gradient": _check_ste_is_soft_relaxation_gradient,
                "soft_router_directional": _check_soft_router_directional,
                "penalty_gradient": _check_penalty_gradient},
    ),
)
