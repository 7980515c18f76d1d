r"""DyDiT block: timestep-wise dynamic width (TDW) and spatial-wise dynamic tokens (SDT) in a DiT block.

Zhao, Han, Tang, Wang, Song, Huang, Wang, You, "Dynamic Diffusion Transformer", ICLR 2025, arXiv
2410.03456. Upstream: NUS-HPC-AI-Lab/Dynamic-Diffusion-Transformer-DyDiT- ``models.py``
(``DiTBlock``, ``Attention``, ``Mlp``, ``DynaLinear``) and ``dynamic_model.py`` (``DiffRate``,
``TokenSelect``, ``_gumbel_sigmoid``) @ dd68c47711398f1a492baabc139a9caf5661f819. T3 entry: the code
defines the block; the open choices are keywords (see "Conventions").

Forward
-------
A DiT block with adaLN-Zero conditioning $[\beta_1, \gamma_1, \alpha_1, \beta_2, \gamma_2,
\alpha_2] = \mathrm{SiLU}(c)W_{ada} + b_{ada}$ (``adaLN_modulation.1``), $\mathrm{mod}(h) =
\mathrm{LN}(h)\odot(1+\gamma) + \beta$ (LayerNorm without affine, $\epsilon = 10^{-6}$), and three
binary masks from three routers:

* TDW, attention: $m^a = \mathrm{bin}(tW_a + b_a)\in\{0,1\}^H$ per sample from the timestep
  embedding $t$ (``attn_rate.router``, ``(C, H)``): head $h$ is computed or skipped;
* TDW, MLP: $m^f = \mathrm{bin}(tW_f + b_f)\in\{0,1\}^H$ (``mlp_rate.router``) switches the
  $H$ groups of $F/H$ hidden channels of the MLP;
* SDT: $m^s_n = \mathrm{bin}(\mathrm{ReLU}(x_nW_1 + b_1)W_2 + b_2)$ per token
  (``token_selection.mlp_head.0``/``.2``, hidden width $C/16$ upstream) skips the MLP for
  unimportant tokens.

$$x' = x + \alpha_1\odot\Big[m^a_h\,\mathrm{core}(q_h, k_h, v_h)\Big]_h W_O,\quad
(q, k, v) = \mathrm{mod}_1(x)W_{qkv},$$
$$y = x' + m^s\odot\alpha_2\odot\Big(\mathrm{GELU}_{\tanh}\big(m^f_{\lceil j\rceil}\odot
(\mathrm{mod}_2(x')W_1 + b_1)\big)W_2 + b_2\Big),$$

the SDT router reading $x'$, the MLP mask applied to ``fc1``'s output before the activation (as
upstream; $\mathrm{GELU}(0) = 0$). $\mathrm{bin}(\ell) = \mathbb 1[\sigma(\ell) > \tfrac12]$ in
evaluation, $\mathbb 1[\sigma((\ell + g)/\tau) > \tfrac12]$ in training with $g$ a logistic sample
(a difference of two Gumbels, passed as ``gumbel_noise``; $\tau = 5$). Skipped heads, channel
groups and tokens are multiplied by 0 (upstream's static ``DynaLinear`` slicing with
``width_mult=1`` is the full layer).

Backward
--------
With the masks fixed, the block is smooth: the adaLN VJP (``dmod`` concatenated, $dW = \mathrm{SiLU}(c)^\top
d\mathrm{mod}$, $dc = d\mathrm{mod}\,W^\top\odot\mathrm{SiLU}'(c)$), the LayerNorm VJP, the
head-gated attention's VJP (`refattn.blocks.core`, any core), the MLP VJP with
$d(\text{fc1 out}) = m^f\odot\mathrm{GELU}'\odot d(\cdot)$, and the residuals. The masks'
gradients are $dm^a_h = \sum_n\langle dO_{n,h}, o_{n,h}\rangle$, $dm^f_g = \sum_n\sum_{j\in g}
d(\text{act in})_j\,(\text{fc1 out})_j$, $dm^s_n = \langle dy_n, \alpha_2\odot\mathrm{MLP}_n\rangle$.
Three gradient modes for the routers:

* ``hard=True, estimator="ste"`` (upstream): the straight-through Gumbel-sigmoid, ``y_hard -
  y_soft.detach() + y_soft``: $d\ell = dm\,\sigma'(\cdot)$ ($/\tau$ in training), then the router
  layers' VJPs (into $t$, and into $x'$ for SDT);
* ``hard=True, estimator="fixed"``: the exact derivative of the hard forward — zero for the
  routers (finite differences check this mode);
* ``hard=False``: upstream's soft relaxation ``_gumbel_sigmoid(hard=False)``, masks $=\sigma(\cdot)$:
  a smooth block whose router gradients finite differences check. At a small $\tau$ in training
  mode the soft block's forward equals the hard one to round-off and its gradient equals the STE
  (named check ``ste_is_small_tau_limit_of_soft``).

Conventions
-----------
``hard`` True, ``estimator`` ``"ste"``, ``training`` False (evaluation; ``gumbel_noise`` =
``{"attn": (B, H), "mlp": (B, H), "token": (B, N, 1)}`` in training), ``tau`` 5, ``threshold``
0.5, ``complete_model`` False (True: every mask 1, routers unused — upstream's flag), LayerNorm
$\epsilon = 10^{-6}$, GELU tanh, the core (``"sdpa"``). Widths come from the weights (MLP ratio,
the SDT hidden width). Not a layer, so not here: the FLOPs-target loss that trains the routers
(it is in the training code, not in the released repository), TD-LoRA, the final layer.

Agreement with upstream
-----------------------
Upstream ``DiTBlock`` (``models.py``, ``DynaLinear``/``DynaQKVLinear`` at ``width_mult=1``,
``DiffRate``/``TokenSelect`` with their hard straight-through ``_gumbel_sigmoid``; the Gumbel
difference passed in), transcribed into a float64 CPU scratch script: $B=3, N=6, C=16, H=4,
F=32$, SDT width 2, in evaluation mode and in training mode ($\tau$ = 5 and 1), with and without
``complete_model``, masks mixed (e.g. 58% of heads, 42% of MLP groups, 83% of tokens kept):
output and every gradient (``x``, ``c``, ``t``, all weights and biases, the three routers
through the STE) agree to $7.5\times10^{-15}$ relative to $\max(|\text{upstream}|, 10^{-8})$.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_choice, check_int, check_positive
from ..nn.activations import gelu, gelu_grad, relu, sigmoid, silu, silu_grad
from ..nn.linear import linear_prefixed, linear_prefixed_spec, linear_prefixed_vjp
from ..nn.norms import normalize_backward, normalize_forward
from ..registry import Mechanism, Sample, register
from .core import (
    block_dtype,
    head_gated_attention_backward,
    head_gated_attention_forward,
    head_gated_attention_spec,
    param_dim,
    resolve_attention_core,
    split_block_params,
)

__all__ = ["dydit_block_forward", "dydit_block_backward", "dydit_block", "DYDIT_ESTIMATORS"]

DYDIT_ESTIMATORS = ("ste", "fixed")
_ATTN = ("attn.qkv", "attn.proj")
_TOK = ("token_selection.mlp_head.0", "token_selection.mlp_head.2")


def _ln(h, eps):
    return normalize_forward(h, (h.ndim - 1,), eps)


def dydit_block_forward(x, c, t, params, *, num_heads: int, hard: bool = True, estimator: str = "ste",
                        training: bool = False, gumbel_noise=None, tau: float = 5.0, threshold: float = 0.5,
                        complete_model: bool = False, core=None, core_config=None, eps: float = 1e-6):
    r"""DyDiT block (module docstring): ``x (B, N, C)``, conditioning ``c (B, C)``, timestep embedding ``t (B, C)``.

    Parameters
    ----------
    x, c, t : arrays (B, N, C), (B, C), (B, C)
    params : dict
        Upstream ``DiTBlock`` keys with weights ``(in, out)`` (PyTorch ``weight.T``):
        ``adaLN_modulation.1`` ``(C, 6C)``, ``attn.qkv`` ``(C, 3C)``, ``attn.proj`` ``(C, C)``,
        ``mlp.fc1`` ``(C, F)``, ``mlp.fc2`` ``(F, C)``, ``attn_rate.router`` and
        ``mlp_rate.router`` ``(C, H)``, ``token_selection.mlp_head.0`` ``(C, r)`` and ``.2``
        ``(r, 1)``, each ``.weight`` with its ``.bias``.
    num_heads : int
        $H$ (divides $C$ and $F$).
    hard, estimator, training, gumbel_noise, tau, threshold, complete_model
        Mask and gradient modes (module docstring).
    core, core_config
        Attention core (default ``"sdpa"``) and its configuration.
    eps : float
        LayerNorm epsilon.

    Returns
    -------
    y, cache
        ``cache["masks"]``: ``{"attn": (B, H), "mlp": (B, H), "token": (B, N, 1)}``.
    """
    x = as_float(x, "x", ndim=3)
    c = as_float(c, "c", ndim=2)
    t = as_float(t, "t", ndim=2)
    b, n, ch = x.shape
    for name, a in (("c", c), ("t", t)):
        if a.shape != (b, ch):
            raise ValueError(f"{name} must have shape (B, C) = {(b, ch)}; got {a.shape}")
    h = check_int(num_heads, "num_heads", minimum=1)
    for flag, name in ((hard, "hard"), (training, "training"), (complete_model, "complete_model")):
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"{name} must be a bool; got {type(flag).__name__}")
    check_choice(estimator, "estimator", DYDIT_ESTIMATORS)
    tau = check_positive(tau, "tau")
    thr = check_positive(threshold, "threshold")
    if thr >= 1:
        raise ValueError(f"threshold must be in (0, 1); got {threshold}")
    eps = check_positive(eps, "eps", allow_zero=True)
    if ch % h:
        raise ValueError(f"num_heads={h} must divide the width C={ch}")
    f = param_dim(params, "mlp.fc1.weight", 1, where="dydit_block", shape=("C", "F"))
    r = param_dim(params, f"{_TOK[0]}.weight", 1, where="dydit_block", shape=("C", "r"))
    if f % h:
        raise ValueError(f"num_heads={h} must divide the MLP width F={f} (mlp.fc1.weight's second axis)")
    core = resolve_attention_core(core, prefix="core", config=core_config)
    spec = linear_prefixed_spec("adaLN_modulation.1", ch, 6 * ch)
    spec.update(head_gated_attention_spec(_ATTN, ch, h, ch // h))
    spec.update(linear_prefixed_spec("mlp.fc1", ch, f))
    spec.update(linear_prefixed_spec("mlp.fc2", f, ch))
    spec.update(linear_prefixed_spec("attn_rate.router", ch, h))
    spec.update(linear_prefixed_spec("mlp_rate.router", ch, h))
    spec.update(linear_prefixed_spec(_TOK[0], ch, r))
    spec.update(linear_prefixed_spec(_TOK[1], r, 1))
    own, (cp,) = split_block_params(params, spec, (core,), where="dydit_block")
    noise = {"attn": None, "mlp": None, "token": None}
    if training and not complete_model:
        if not isinstance(gumbel_noise, dict) or set(gumbel_noise) != set(noise):
            raise ValueError("training=True needs gumbel_noise={'attn': (B, H), 'mlp': (B, H), 'token': (B, N, 1)} "
                             f"(logistic samples); got {type(gumbel_noise).__name__}")
        for key, shape in (("attn", (b, h)), ("mlp", (b, h)), ("token", (b, n, 1))):
            noise[key] = as_float(gumbel_noise[key], f"gumbel_noise['{key}']")
            if noise[key].shape != shape:
                raise ValueError(f"gumbel_noise['{key}'] must have shape {shape}; got {noise[key].shape}")
    dt = block_dtype(x, {**own, "c": c, "t": t}, (cp,))
    x, c, t = (a.astype(dt, copy=False) for a in (x, c, t))
    own, cp = cast_all(dt, own), cast_all(dt, cp)
    kw = {"hard": bool(hard), "training": bool(training), "tau": tau, "thr": thr, "complete": bool(complete_model),
          "ste": estimator == "ste"}

    def mask(logits, key):
        if kw["complete"]:
            return np.ones_like(logits), None
        s = sigmoid((logits + noise[key].astype(dt)) / tau) if training else sigmoid(logits)
        return ((s > thr).astype(dt) if hard else s), s

    cs = silu(c)
    mod = linear_prefixed(own, "adaLN_modulation.1", cs)
    sh1, sc1, ga1, sh2, sc2, ga2 = (m[:, None, :] for m in np.split(mod, 6, axis=-1))
    h1, st1 = _ln(x, eps)
    u1 = h1 * (1.0 + sc1) + sh1
    ma, sa = mask(linear_prefixed(own, "attn_rate.router", t), "attn")
    att, c_att = head_gated_attention_forward(own, u1, np.broadcast_to(ma[:, None, :], (b, n, h)), num_heads=h,
                                              core=core, core_params=cp, names=_ATTN)
    x1 = x + ga1 * att
    pre = linear_prefixed(own, _TOK[0], x1)
    rt = relu(pre)
    mt, stok = mask(linear_prefixed(own, _TOK[1], rt), "token")
    mm, sm = mask(linear_prefixed(own, "mlp_rate.router", t), "mlp")
    h2, st2 = _ln(x1, eps)
    u2 = h2 * (1.0 + sc2) + sh2
    fc = linear_prefixed(own, "mlp.fc1", u2)
    mmx = np.repeat(mm, f // h, axis=-1)[:, None, :]
    a_in = fc * mmx
    act = gelu(a_in, "tanh")
    o = linear_prefixed(own, "mlp.fc2", act)
    y = x1 + mt * (ga2 * o)
    cache = {"x": x, "c": c, "t": t, "own": own, "cs": cs, "mod": (sh1, sc1, ga1, sh2, sc2, ga2), "h1": h1, "st1": st1,
             "att": att, "c_att": c_att, "x1": x1, "pre": pre, "rt": rt, "h2": h2, "st2": st2, "u2": u2, "fc": fc,
             "mmx": mmx, "a_in": a_in, "act": act, "o": o, "m": (ma, mm, mt), "s": (sa, sm, stok), "kw": kw,
             "f": f, "h": h, "dtype": dt, "masks": {"attn": ma.copy(), "mlp": mm.copy(), "token": mt.copy()}}
    return y, cache


def _router_dlogit(dm, s, kw):
    # d logit of a mask: soft sigmoid, or the hard mask's STE; None when the router gets no gradient.
    if kw["complete"] or (kw["hard"] and not kw["ste"]):
        return None
    return dm * s * (1.0 - s) / (kw["tau"] if kw["training"] else 1.0)


def dydit_block_backward(dout, cache):
    r"""Gradients of `dydit_block_forward` for ``x``, ``c``, ``t`` and every params key (router
    gradients by the mode chosen in the forward; module docstring)."""
    x, own, dt, kw = cache["x"], cache["own"], cache["dtype"], cache["kw"]
    g = as_dout(dout, x.shape, dt)
    sh1, sc1, ga1, sh2, sc2, ga2 = cache["mod"]
    ma, mm, mt = cache["m"]
    sa, sm, stok = cache["s"]
    f, h = cache["f"], cache["h"]
    grads: dict = {}
    dx1 = g.copy()
    d_o = g * mt * ga2
    dga2 = np.sum(g * mt * cache["o"], axis=1)
    dmt = np.sum(g * ga2 * cache["o"], axis=-1, keepdims=True)
    dact = linear_prefixed_vjp(grads, own, "mlp.fc2", d_o, cache["act"])
    dain = dact * gelu_grad(cache["a_in"], "tanh")
    dmm = np.sum((dain * cache["fc"]).reshape(dain.shape[:-1] + (h, f // h)), axis=(1, 3))
    du2 = linear_prefixed_vjp(grads, own, "mlp.fc1", dain * cache["mmx"], cache["u2"])
    dsc2, dsh2 = np.sum(du2 * cache["h2"], axis=1), np.sum(du2, axis=1)
    dx1 = dx1 + normalize_backward(du2 * (1.0 + sc2), cache["h2"], cache["st2"])
    dt_in = np.zeros_like(cache["t"])
    for key, dm, s, rkey in (("token", dmt, stok, None), ("mlp", dmm, sm, "mlp_rate.router")):
        dl = _router_dlogit(dm, s, kw)
        if key == "token":
            if dl is None:
                for p in _TOK:
                    grads[f"{p}.weight"], grads[f"{p}.bias"] = np.zeros_like(own[f"{p}.weight"]), np.zeros_like(own[f"{p}.bias"])
            else:
                drt = linear_prefixed_vjp(grads, own, _TOK[1], dl, cache["rt"])
                dx1 = dx1 + linear_prefixed_vjp(grads, own, _TOK[0], drt * (cache["pre"] > 0), cache["x1"])
        elif dl is None:
            grads[f"{rkey}.weight"], grads[f"{rkey}.bias"] = np.zeros_like(own[f"{rkey}.weight"]), np.zeros_like(own[f"{rkey}.bias"])
        else:
            dt_in = dt_in + linear_prefixed_vjp(grads, own, rkey, dl, cache["t"])
    datt = dx1 * ga1
    dga1 = np.sum(dx1 * cache["att"], axis=1)
    du1, dgates = head_gated_attention_backward(grads, own, datt, cache["c_att"])
    dl = _router_dlogit(np.sum(dgates, axis=1), sa, kw)
    if dl is None:
        grads["attn_rate.router.weight"] = np.zeros_like(own["attn_rate.router.weight"])
        grads["attn_rate.router.bias"] = np.zeros_like(own["attn_rate.router.bias"])
    else:
        dt_in = dt_in + linear_prefixed_vjp(grads, own, "attn_rate.router", dl, cache["t"])
    dsc1, dsh1 = np.sum(du1 * cache["h1"], axis=1), np.sum(du1, axis=1)
    dx = dx1 + normalize_backward(du1 * (1.0 + sc1), cache["h1"], cache["st1"])
    dmod = np.concatenate([dsh1, dsc1, dga1, dsh2, dsc2, dga2], axis=-1)
    dcs = linear_prefixed_vjp(grads, own, "adaLN_modulation.1", dmod, cache["cs"])
    grads.update({"x": dx, "c": dcs * silu_grad(cache["c"]), "t": dt_in})
    return grads


def dydit_block(x, c, t, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of `dydit_block_forward`."""
    return dydit_block_forward(x, c, t, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _params(rng, ch, h, f, r):
    p = {}
    for name, i, o, s in (("adaLN_modulation.1", ch, 6 * ch, 0.5), ("attn.qkv", ch, 3 * ch, 1.0), ("attn.proj", ch, ch, 1.0),
                          ("mlp.fc1", ch, f, 1.0), ("mlp.fc2", f, ch, 1.0), ("attn_rate.router", ch, h, 1.0),
                          ("mlp_rate.router", ch, h, 1.0), (_TOK[0], ch, r, 1.0), (_TOK[1], r, 1, 1.0)):
        p[f"{name}.weight"] = s * rng.standard_normal((i, o)) / np.sqrt(i)
        p[f"{name}.bias"] = 0.3 * rng.standard_normal(o)
    return p


def _sample(rng, size, **fixed):
    b, (n, ch, h, f, r) = 2, ((2, 3, 3, 3, 1) if size == "tiny" else (int(rng.integers(3, 6)), 8, 2, 8, 2))
    cfg = {"num_heads": h, "hard": bool(rng.random() < 0.6), "estimator": "fixed",
           "training": bool(rng.random() < 0.3), "tau": float(rng.choice([1.0, 5.0]))}
    cfg.update(fixed)
    while True:
        x, c, t = rng.standard_normal((b, n, ch)), rng.standard_normal((b, ch)), rng.standard_normal((b, ch))
        p = _params(rng, ch, h, f, r)
        if cfg["training"]:
            cfg["gumbel_noise"] = {k: np.log(u / (1 - u)) for k, u in (("attn", rng.random((b, h))),
                                                                       ("mlp", rng.random((b, h))),
                                                                       ("token", rng.random((b, n, 1))))}
        _, cache = dydit_block_forward(x, c, t, p, **cfg)
        gaps = [np.abs(cache["pre"]).min()]  # the SDT router's ReLU kink
        if cfg["hard"]:
            gaps += [np.abs(s - cfg.get("threshold", 0.5)).min() for s in cache["s"]]
        if min(gaps) > 0.02:
            break
    return Sample(inputs={"x": x, "c": c, "t": t}, params=p, config=cfg)


def _reference(x, c, t, params, num_heads, hard=True, training=False, gumbel_noise=None, tau=5.0, threshold=0.5,
               complete_model=False, eps=1e-6, core_config=None, **_):
    # The upstream DiTBlock written out with plain NumPy, per sample and per head.
    p, h = params, num_heads
    b, n, ch = x.shape
    d = ch // h

    def lin(a, name):
        return a @ p[f"{name}.weight"] + p[f"{name}.bias"]

    def ln(a):
        mu = a.mean(-1, keepdims=True)
        return (a - mu) / np.sqrt(((a - mu) ** 2).mean(-1, keepdims=True) + eps)

    def binm(logit, key):
        if complete_model:
            return np.ones_like(logit)
        s = 1 / (1 + np.exp(-((logit + gumbel_noise[key]) / tau if training else logit)))
        return (s > threshold).astype(float) if hard else s

    mod = lin(c / (1 + np.exp(-c)), "adaLN_modulation.1")
    sh1, sc1, ga1, sh2, sc2, ga2 = np.split(mod, 6, axis=-1)
    y = np.zeros_like(x)
    ma, mm = binm(lin(t, "attn_rate.router"), "attn"), binm(lin(t, "mlp_rate.router"), "mlp")
    for i in range(b):
        u = ln(x[i]) * (1 + sc1[i]) + sh1[i]
        qkv = lin(u, "attn.qkv")
        heads = []
        for hh in range(h):
            q, k, v = (qkv[:, j * ch + hh * d: j * ch + (hh + 1) * d] for j in range(3))
            s = q @ k.T / np.sqrt(d)
            a = np.exp(s - s.max(-1, keepdims=True))
            heads.append(ma[i, hh] * (a / a.sum(-1, keepdims=True)) @ v)
        x1 = x[i] + ga1[i] * lin(np.concatenate(heads, -1), "attn.proj")
        tok = binm(lin(np.maximum(lin(x1, _TOK[0]), 0), _TOK[1])[None], "token")[0]
        u2 = ln(x1) * (1 + sc2[i]) + sh2[i]
        a_in = lin(u2, "mlp.fc1") * np.repeat(mm[i], p["mlp.fc1.weight"].shape[1] // h)
        act = 0.5 * a_in * (1 + np.tanh(np.sqrt(2 / np.pi) * (a_in + 0.044715 * a_in ** 3)))
        y[i] = x1 + tok * ga2[i] * lin(act, "mlp.fc2")
    return y


def _check_ste_is_small_tau_limit_of_soft(rng):
    # Training mode at tau = 0.04 with noise placing every (logit + noise) at +-[1, 1.5]: the soft
    # masks sigmoid((l+g)/tau) are within e^-25 of the hard ones, so the soft block's output equals
    # the hard one and its gradient (routers included, relative to their size) equals the STE's.
    tau = 0.04
    s = _sample(rng, "small", hard=True, training=False)
    x, c, t, p = s.inputs["x"], s.inputs["c"], s.inputs["t"], s.params
    b, n, _ = x.shape

    def noise_for(logit):
        return rng.choice([-1.0, 1.0], logit.shape) * rng.uniform(1.0, 1.5, logit.shape) - logit

    la = t @ p["attn_rate.router.weight"] + p["attn_rate.router.bias"]
    lm = t @ p["mlp_rate.router.weight"] + p["mlp_rate.router.bias"]
    gn = {"attn": noise_for(la), "mlp": noise_for(lm), "token": np.zeros((b, n, 1))}
    cfg = dict(s.config, training=True, tau=tau, estimator="ste", gumbel_noise=gn)
    _, c0 = dydit_block_forward(x, c, t, p, **cfg)
    gn["token"] = noise_for(c0["rt"] @ p[f"{_TOK[1]}.weight"] + p[f"{_TOK[1]}.bias"])
    yh, ch_ = dydit_block_forward(x, c, t, p, **cfg)
    ys, cs_ = dydit_block_forward(x, c, t, p, **dict(cfg, hard=False))
    g = rng.standard_normal(yh.shape)
    gh, gs = dydit_block_backward(g, ch_), dydit_block_backward(g, cs_)
    err = float(np.abs(yh - ys).max())
    gerr = max(float(np.abs(gh[k] - gs[k]).max() / max(np.abs(gs[k]).max(), 1e-300)) for k in gh)
    assert err < 1e-9 and gerr < 1e-8, f"hard STE vs soft at small tau: output {err}, gradients {gerr}"
    return max(err, gerr)


def _check_open_masks_are_dit_block(rng):
    # Router biases far positive (every mask 1) give the plain DiT block (complete_model=True).
    s = _sample(rng, "small", hard=True, training=False)
    p = dict(s.params)
    for k in ("attn_rate.router.bias", "mlp_rate.router.bias", f"{_TOK[1]}.bias"):
        p[k] = np.full_like(p[k], 60.0)
    y_open = dydit_block(**s.inputs, params=p, **s.config)
    y_full = dydit_block(**s.inputs, params=s.params, **dict(s.config, complete_model=True))
    err = float(np.abs(y_open - y_full).max())
    assert err < 1e-12, f"all-open DyDiT differs from the complete DiT block by {err}"
    return err


register(
    Mechanism(
        slug="dydit_dynamic_width_token", family="5-building-blocks", tier="T3",
        title="DyDiT block: timestep-wise dynamic width (heads, MLP groups) and spatial-wise dynamic tokens "
              "(hard masks with STE/fixed gradients, soft relaxation)",
        paper="Zhao, Han, Tang, Wang, Song, Huang, Wang, You, Dynamic Diffusion Transformer, ICLR 2025, arXiv 2410.03456",
        official_code="NUS-HPC-AI-Lab/Dynamic-Diffusion-Transformer-DyDiT-",
        forward=dydit_block_forward, backward=dydit_block_backward, sample=_sample, reference=_reference,
        docs="blocks/routing-and-gating.md#dydit-dynamic-width-and-tokens",
        checks={"ste_is_small_tau_limit_of_soft": _check_ste_is_small_tau_limit_of_soft,
                "open_masks_are_dit_block": _check_open_masks_are_dit_block},
    ),
)
