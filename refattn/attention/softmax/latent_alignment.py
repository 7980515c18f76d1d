r"""Latent alignment attention: the exact marginal likelihood over a categorical alignment, the
variational (enumerated) ELBO with an inference network's alignment posterior, and soft attention
as the baseline.

Paper: Deng, Kim, Chiu, Guo, Rush, "Latent Alignment and Variational Attention", NeurIPS 2018,
arXiv 1807.03756. Upstream: harvardnlp/var-attn @ce2ac9ae9e9ad1374ce252bec6bfe9dfa5f00165 —
``onmt/modules/VariationalAttention.py`` (``VariationalAttention.score``/``forward``),
``onmt/Models.py`` (``Generator``: ``mode="exact"`` log-sum-exp, ``mode="enum"`` expectation) and
``onmt/Loss.py`` (the ELBO's ``kl_divergence(q, p)``); ``va.sh`` trains every model with
``-global_attention mlp``.

Model
-----
Decoder state $h_t\in\mathbb R^{D_t}$ (input), source states $x_z\in\mathbb R^{D_s}$ (``memory``,
$z = 1..S$). The alignment prior is the attention distribution

$$\alpha_{tz} = \mathrm{softmax}_z(e_{tz}),\qquad e_{tz} = v^\top\tanh(W_qh_t + W_cx_z)\ \ (\texttt{"mlp"}),
\quad e_{tz} = (h_tW_{\rm in})\cdot x_z\ \ (\texttt{"general"}),$$

and, given an alignment $z$, the word distribution is
$p(y\mid z) = \mathrm{softmax}_y\big(\tanh([h_t; x_z]W_{\rm out} + b_{\rm out})\,W_p + b_p\big)$
(``linear_out`` then the generator's ``proj``; ``linear_out`` has a bias only with ``"mlp"``, as
upstream). ``mode`` picks what is returned, for **every** word $y$ of the vocabulary
``(B, T, V)`` (upstream's ``Generator`` output; the loss gathers the target):

* ``"exact"``: $\log p(y) = \log\sum_z\alpha_{tz}\,p(y\mid z)$ (a mixture of softmaxes; exact
  marginalisation, the paper's "exact" model);
* ``"enum"``: the ELBO $\sum_zq_{tz}\log p(y\mid z) - \lambda\,\mathrm{KL}(q_t\,\Vert\,\alpha_t)$ with
  $q_t = \mathrm{softmax}(\texttt{q\_scores}_t)$ the inference network's posterior (an input: the
  inference network is a separate bi-RNN encoder; ``memory_mask`` masks it too, as upstream's) and $\lambda$ = ``kl_weight`` (1 is the ELBO);
* ``"soft"``: soft attention $\log p(y\mid\mathbb E_\alpha[x])$, the same ``linear_out`` on the
  expected source state (upstream's ``h_c``).

All three are deterministic. Upstream's sampled estimators (``sample``: REINFORCE, ``gumbel``,
``wsram``) are stochastic and give score-function surrogates rather than gradients of a fixed
function; they are not reproduced. ``memory_mask`` (B, S), True = valid, removes source
positions ($-\infty$ scores, as upstream's ``sequence_mask``).

Backward
--------
``exact``: with the posterior $r_{tzy} = \alpha_{tz}p(y\mid z)/p(y)$ and $G = \partial\mathcal L/\partial\log p$,
$\partial/\partial\log\alpha_{tz} = \sum_yG_yr_{tzy}$ and $\partial/\partial\log p(y\mid z) = G_yr_{tzy}$
(the log-sum-exp VJP). ``enum``: $\partial/\partial\log p(y\mid z) = G_yq_z$,
$\partial/\partial\log\alpha_z = \lambda\bar Gq_z$ and
$\partial/\partial\texttt{q\_scores} = q\odot(a - \sum q\,a) - \lambda\bar G\,q\odot(\log q - \log\alpha - \mathrm{KL})$
with $a_z = \sum_yG_y\log p(y\mid z)$ and $\bar G = \sum_yG_y$. Then log-softmax VJPs
($d\ell - \mathrm{softmax}\cdot\sum d\ell$) to the scores and logits, the tanh layer (separable in
$h$ and $x_z$, so its weight gradient splits into the two row blocks of $W_{\rm out}$) and the score MLP
(`refattn.attention.softmax.additive.additive_scores_vjp`).

Agreement with upstream (measured)
---------------------------------
Upstream ``VariationalAttention`` (one-step decoding, as its decoder calls it) and ``Generator`` run
in float64 torch (CPU; ``1 - mask`` patched to ``~mask`` for torch 2 bool masks) against
`latent_alignment_forward`/`latent_alignment_backward`, output and every gradient: worst abs
$2.8\cdot10^{-15}$ / rel $6.4\cdot10^{-15}$ (exact, mlp), $2.2\cdot10^{-15}$ / $7.4\cdot10^{-15}$ (exact,
mlp, masked), $2.9\cdot10^{-15}$ / $4.5\cdot10^{-15}$ (enum, mlp, masked), $1.1\cdot10^{-15}$ /
$4.4\cdot10^{-16}$ (soft, mlp, masked), $3.7\cdot10^{-15}$ / $2.2\cdot10^{-15}$ (exact, general, masked),
$3.1\cdot10^{-15}$ / $1.2\cdot10^{-15}$ (enum, general).
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_choice, check_params, check_positive, compute_dtype
from ...nn.softmax import softmax_lse, softmax_vjp
from ...registry import Mechanism, Sample, register
from .additive import additive_scores, additive_scores_vjp

__all__ = [
    "LATENT_MODES",
    "LATENT_ATTN_TYPES",
    "latent_alignment_param_spec",
    "init_latent_alignment_params",
    "latent_alignment_forward",
    "latent_alignment_backward",
    "latent_alignment",
]

LATENT_MODES = ("exact", "enum", "soft")
LATENT_ATTN_TYPES = ("mlp", "general")


def latent_alignment_param_spec(tgt_dim: int, src_dim: int, attn_dim: int, vocab: int, *, attn_type: str = "mlp"):
    """``(spec, optional)``: ``VariationalAttention`` (``linear_context``, ``linear_query``, ``v`` or
    ``linear_in``; ``linear_out``) and the generator's ``proj``; weights ``(in, out)``."""
    if attn_type == "mlp":
        spec = {"linear_context.weight": (src_dim, attn_dim), "linear_query.weight": (tgt_dim, attn_dim),
                "v.weight": (attn_dim, 1)}
    else:
        spec = {"linear_in.weight": (tgt_dim, src_dim)}
    spec["linear_out.weight"] = (tgt_dim + src_dim, tgt_dim)
    if attn_type == "mlp":
        spec["linear_out.bias"] = (tgt_dim,)
    spec.update({"proj.weight": (tgt_dim, vocab), "proj.bias": (vocab,)})
    return spec


def init_latent_alignment_params(rng, tgt_dim: int, src_dim: int, attn_dim: int, vocab: int, *,
                                 attn_type: str = "mlp", scale: float = 1.0) -> dict:
    """Random parameters in spec order (normal, std ``scale / sqrt(fan_in)``; biases small normal)."""
    spec = latent_alignment_param_spec(tgt_dim, src_dim, attn_dim, vocab, attn_type=attn_type)
    return {k: (scale / np.sqrt(s[0])) * rng.standard_normal(s) if len(s) == 2 else 0.1 * rng.standard_normal(s)
            for k, s in spec.items()}


def _log_softmax(x):
    p, lse = softmax_lse(x, axis=-1)
    with np.errstate(invalid="ignore"):
        return np.where(p > 0, x - lse[..., None], -np.inf), p


def latent_alignment_forward(h, memory, params, q_scores=None, *, mode: str = "exact", attn_type: str = "mlp",
                             kl_weight: float = 1.0, memory_mask=None):
    r"""Latent alignment attention with a word distribution per alignment (module docstring).

    Parameters
    ----------
    h : array (B, T, D_t)
        Decoder states (upstream's ``input``).
    memory : array (B, S, D_s)
        Source states $x_z$ (``memory_bank``).
    params : dict
        ``latent_alignment_param_spec`` keys.
    q_scores : array (B, T, S), optional
        Inference-network scores (logits of $q$); required for, and only used by, ``mode="enum"``.
    mode : {"exact", "enum", "soft"}
    attn_type : {"mlp", "general"}
    kl_weight : float
        $\lambda$ of the enumerated ELBO.
    memory_mask : bool array (B, S), optional
        True = valid source position.

    Returns
    -------
    logp, cache
        ``(B, T, V)``: $\log p(y)$ (exact), the ELBO of every $y$ (enum) or $\log p(y\mid\mathbb E[x])$ (soft).
    """
    h = as_float(h, "h", ndim=3)
    x = as_float(memory, "memory", ndim=3)
    if x.shape[0] != h.shape[0]:
        raise ValueError(f"memory must have h's batch size {h.shape[0]} on axis 0; got shape {x.shape}")
    check_choice(mode, "mode", LATENT_MODES)
    check_choice(attn_type, "attn_type", LATENT_ATTN_TYPES)
    lam = check_positive(kl_weight, "kl_weight", allow_zero=True)
    b, t, dt_ = h.shape
    s, ds = x.shape[1:]
    if mode == "enum":
        if q_scores is None:
            raise ValueError("q_scores (B, T, S) is required with mode='enum'")
        q_scores = as_float(q_scores, "q_scores", ndim=3)
        if q_scores.shape != (b, t, s):
            raise ValueError(f"q_scores must have shape (B, T, S) = {(b, t, s)}; got {q_scores.shape}")
    elif q_scores is not None:
        raise ValueError(f"q_scores is only used with mode='enum'; got mode={mode!r}")
    if memory_mask is not None:
        memory_mask = np.asarray(memory_mask)
        if memory_mask.dtype != np.bool_:
            raise TypeError(f"memory_mask must be a boolean array (True = valid); got dtype {memory_mask.dtype}")
        if memory_mask.shape != (b, s):
            raise ValueError(f"memory_mask must have shape (B, S) = {(b, s)}; got {memory_mask.shape}")
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict (see latent_alignment_param_spec); got {type(params).__name__}")
    for key, nd in (("v.weight", 2), ("proj.bias", 1)):
        if key in params and np.ndim(params[key]) != nd:
            raise ValueError(f"params[{key!r}] must be {nd}-d (see latent_alignment_param_spec); "
                             f"got shape {np.shape(params[key])}")
    a_dim = np.shape(params.get("v.weight", np.zeros((1, 1))))[0]
    vocab = np.shape(params.get("proj.bias", np.zeros(1)))[0]
    spec = latent_alignment_param_spec(dt_, ds, a_dim, vocab, attn_type=attn_type)
    p = check_params(params, spec, where=f"latent_alignment (var-attn VariationalAttention, attn_type={attn_type!r})")
    dt = compute_dtype(h, x, q_scores, *p.values())
    h, x, p = h.astype(dt, copy=False), x.astype(dt, copy=False), cast_all(dt, p)
    if q_scores is not None:
        q_scores = q_scores.astype(dt, copy=False)
    if attn_type == "mlp":
        e, th = additive_scores(h @ p["linear_query.weight"], x @ p["linear_context.weight"], p["v.weight"][:, 0])
    else:
        e, th = (h @ p["linear_in.weight"]) @ np.swapaxes(x, -1, -2), None
    if memory_mask is not None:
        e = np.where(memory_mask[:, None, :], e, -np.inf)
    la, alpha = _log_softmax(e)
    w1, w2 = p["linear_out.weight"][:dt_], p["linear_out.weight"][dt_:]
    bo = p.get("linear_out.bias")
    cache = {"h": h, "x": x, "p": p, "mode": mode, "attn_type": attn_type, "th": th, "la": la, "alpha": alpha,
             "lam": lam, "mask": memory_mask}
    if mode == "soft":
        c = alpha @ x
        hy = np.tanh(h @ w1 + c @ w2 + (0.0 if bo is None else bo))
        lp, py = _log_softmax(hy @ p["proj.weight"] + p["proj.bias"])
        cache.update(c=c, hy=hy, py=py)
        out = lp
    else:
        hy = np.tanh((h @ w1)[:, :, None, :] + (x @ w2)[:, None, :, :] + (0.0 if bo is None else bo))  # (B, T, S, D_t)
        lp, py = _log_softmax(hy @ p["proj.weight"] + p["proj.bias"])                             # (B, T, S, V)
        cache.update(hy=hy, py=py, lp=lp)
        if mode == "exact":
            r, out = softmax_lse(la[..., None] + lp, axis=2)                                        # over z
            cache["r"] = r
        else:
            qs = q_scores if memory_mask is None else np.where(memory_mask[:, None, :], q_scores, -np.inf)
            lq, q = _log_softmax(qs)
            with np.errstate(invalid="ignore"):
                kl = np.sum(np.where(q > 0, q * (lq - la), 0.0), axis=-1)                         # (B, T)
                out = np.einsum("btz,btzv->btv", q, np.where(q[..., None] > 0, lp, 0.0)) - lam * kl[..., None]
            cache.update(q=q, lq=lq, kl=kl)
    cache["shape"] = out.shape
    return out, cache


def latent_alignment_backward(dout, cache):
    """Gradient of :func:`latent_alignment_forward`: ``h``, ``memory`` (and ``q_scores`` in enum
    mode) and every parameter."""
    h, x, p, mode = cache["h"], cache["x"], cache["p"], cache["mode"]
    g = as_dout(dout, cache["shape"], h.dtype)
    dt_ = h.shape[-1]
    w1, w2 = p["linear_out.weight"][:dt_], p["linear_out.weight"][dt_:]
    alpha, la = cache["alpha"], cache["la"]
    grads = {}
    out = {}
    if mode == "soft":
        hy, py = cache["hy"], cache["py"]
        dlog = g - py * g.sum(axis=-1, keepdims=True)
        grads["proj.weight"] = hy.reshape(-1, dt_).T @ dlog.reshape(-1, dlog.shape[-1])
        grads["proj.bias"] = dlog.sum(axis=(0, 1))
        dpre = (dlog @ p["proj.weight"].T) * (1.0 - hy * hy)                 # (B, T, D_t)
        c = cache["c"]
        grads["linear_out.weight"] = np.concatenate([h.reshape(-1, dt_).T @ dpre.reshape(-1, dt_),
                                                     c.reshape(-1, c.shape[-1]).T @ dpre.reshape(-1, dt_)])
        dh = dpre @ w1.T
        dc = dpre @ w2.T
        dx = np.swapaxes(alpha, -1, -2) @ dc
        dalpha = dc @ np.swapaxes(x, -1, -2)
        de = softmax_vjp(alpha, dalpha)
    else:
        hy, py, lp = cache["hy"], cache["py"], cache["lp"]
        if mode == "exact":
            r = cache["r"]
            dlp = g[:, :, None, :] * r                                          # (B, T, S, V)
            dla = dlp.sum(axis=-1)
        else:
            q, lq, lam, kl = cache["q"], cache["lq"], cache["lam"], cache["kl"]
            gbar = g.sum(axis=-1)                                               # (B, T)
            dlp = g[:, :, None, :] * q[..., None]
            dla = lam * gbar[..., None] * q
            with np.errstate(invalid="ignore"):
                a = np.einsum("btv,btzv->btz", g, np.where(q[..., None] > 0, lp, 0.0))
                dkl = np.where(q > 0, q * (lq - la - kl[..., None]), 0.0)
            out["q_scores"] = softmax_vjp(q, a) - lam * gbar[..., None] * dkl
        de = dla - alpha * dla.sum(axis=-1, keepdims=True)                      # log-softmax VJP
        dlog = dlp - py * dlp.sum(axis=-1, keepdims=True)
        grads["proj.weight"] = hy.reshape(-1, dt_).T @ dlog.reshape(-1, dlog.shape[-1])
        grads["proj.bias"] = dlog.sum(axis=(0, 1, 2))
        dpre = (dlog @ p["proj.weight"].T) * (1.0 - hy * hy)                   # (B, T, S, D_t)
        dph, dpx = dpre.sum(axis=2), dpre.sum(axis=1)                           # (B, T, D_t), (B, S, D_t)
        grads["linear_out.weight"] = np.concatenate([h.reshape(-1, dt_).T @ dph.reshape(-1, dt_),
                                                     x.reshape(-1, x.shape[-1]).T @ dpx.reshape(-1, dt_)])
        dh = dph @ w1.T
        dx = dpx @ w2.T
    if "linear_out.bias" in p:
        grads["linear_out.bias"] = dpre.reshape(-1, dt_).sum(axis=0)
    if cache["mask"] is not None:
        de = np.where(cache["mask"][:, None, :], de, 0.0)
    if cache["attn_type"] == "mlp":
        dqp, dkp, dv, _ = additive_scores_vjp(de, cache["th"], p["v.weight"][:, 0])
        grads["v.weight"] = dv[:, None]
        grads["linear_query.weight"] = h.reshape(-1, dt_).T @ dqp.reshape(-1, dqp.shape[-1])
        grads["linear_context.weight"] = x.reshape(-1, x.shape[-1]).T @ dkp.reshape(-1, dkp.shape[-1])
        dh = dh + dqp @ p["linear_query.weight"].T
        dx = dx + dkp @ p["linear_context.weight"].T
    else:
        hw = h @ p["linear_in.weight"]
        dhw = de @ x
        grads["linear_in.weight"] = h.reshape(-1, dt_).T @ dhw.reshape(-1, dhw.shape[-1])
        dh = dh + dhw @ p["linear_in.weight"].T
        dx = dx + np.swapaxes(de, -1, -2) @ hw
    return {"h": dh, "memory": dx, **out, **{k: grads[k] for k in p}}


def latent_alignment(h, memory, params, q_scores=None, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`latent_alignment_forward`."""
    return latent_alignment_forward(h, memory, params, q_scores, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample_mode(rng, size, mode, attn_type=None):
    if size == "tiny":
        b, t, s, dt_, ds, a, v = 2, 2, 3, 2, 2, 2, 3
    else:
        b, t, s, dt_, ds, a, v = 2, int(rng.integers(2, 5)), int(rng.integers(3, 7)), 4, 3, 3, 6
    attn_type = str(rng.choice(LATENT_ATTN_TYPES)) if attn_type is None else attn_type
    p = init_latent_alignment_params(rng, dt_, ds, a, v, attn_type=attn_type, scale=1.5)
    inputs = {"h": rng.standard_normal((b, t, dt_)), "memory": rng.standard_normal((b, s, ds))}
    cfg = {"mode": mode, "attn_type": attn_type}
    if mode == "enum":
        inputs["q_scores"] = rng.standard_normal((b, t, s))
        cfg["kl_weight"] = float(rng.uniform(0.5, 1.0))
    if size == "small" and rng.random() < 0.5:
        cfg["memory_mask"] = np.arange(s)[None, :] < np.array([s, s - 1])[:, None]
    return Sample(inputs=inputs, params=p, config=cfg)


def _sample(rng, size):
    return _sample_mode(rng, size, str(rng.choice(LATENT_MODES)))


def _word_probs(h_t, x_z, p):
    dt_ = h_t.shape[0]
    hy = np.tanh(h_t @ p["linear_out.weight"][:dt_] + x_z @ p["linear_out.weight"][dt_:] + p.get("linear_out.bias", 0.0))
    e = np.exp(hy @ p["proj.weight"] + p["proj.bias"])
    return e / e.sum()


def _reference(h, memory, params, q_scores=None, *, mode="exact", attn_type="mlp", kl_weight=1.0, memory_mask=None):
    # Probabilities, not logs: per (sample, step) enumerate the alignments and sum or average.
    p = params
    b, t, _ = h.shape
    s = memory.shape[1]
    out = []
    for bb in range(b):
        rows = []
        keep = np.ones(s, bool) if memory_mask is None else memory_mask[bb]
        for tt in range(t):
            if attn_type == "mlp":
                e = np.array([np.tanh(h[bb, tt] @ p["linear_query.weight"] + memory[bb, z] @ p["linear_context.weight"])
                              @ p["v.weight"][:, 0] for z in range(s)])
            else:
                e = np.array([h[bb, tt] @ p["linear_in.weight"] @ memory[bb, z] for z in range(s)])
            al = np.where(keep, np.exp(e - e[keep].max()), 0.0)
            al = al / al.sum()
            if mode == "soft":
                rows.append(np.log(_word_probs(h[bb, tt], al @ memory[bb], p)))
            elif mode == "exact":
                rows.append(np.log(sum(al[z] * _word_probs(h[bb, tt], memory[bb, z], p) for z in range(s) if keep[z])))
            else:
                qq = np.where(keep, np.exp(q_scores[bb, tt] - q_scores[bb, tt][keep].max()), 0.0)
                qq = qq / qq.sum()
                kl = sum(qq[z] * np.log(qq[z] / al[z]) for z in range(s) if keep[z])
                rows.append(sum(qq[z] * np.log(_word_probs(h[bb, tt], memory[bb, z], p)) for z in range(s) if keep[z])
                            - kl_weight * kl)
        out.append(np.stack(rows))
    return np.stack(out)


def _check_gradcheck_every_mode(rng):
    from ...testing import gradcheck
    return max(gradcheck(latent_alignment_forward, latent_alignment_backward,
                         _sample_mode(rng, "tiny", mode, at)).max_rel
               for mode, at in (("exact", "general"), ("enum", "mlp"), ("soft", "mlp")))


def _check_exact_marginal_is_a_distribution(rng):
    # exp(log p(y)) sums to one over the vocabulary: a mixture of softmaxes is a distribution.
    s = _sample_mode(rng, "small", "exact")
    out = latent_alignment(**s.inputs, params=s.params, **s.config)
    err = float(np.abs(np.exp(out).sum(-1) - 1.0).max())
    assert err < 1e-12, err
    return err


def _check_soft_differs_from_exact_unless_one_source(rng):
    # Soft attention feeds E[x] through the nonlinear word model: not the exact marginal when S > 1;
    # with a single source position both are log p(y | x_1).
    s = _sample_mode(rng, "small", "exact")
    ex = latent_alignment(**s.inputs, params=s.params, **s.config)
    so = latent_alignment(**s.inputs, params=s.params, **dict(s.config, mode="soft"))
    gap = float(np.abs(ex - so).max())
    assert gap > 1e-3, f"soft attention equals the exact marginal ({gap:.2e}) for S > 1"
    one = dict(s.inputs, memory=s.inputs["memory"][:, :1])
    cfg = {k: v for k, v in s.config.items() if k != "memory_mask"}
    err = float(np.abs(latent_alignment(**one, params=s.params, **cfg)
                       - latent_alignment(**one, params=s.params, **dict(cfg, mode="soft"))).max())
    assert err < 1e-12, err
    return err


def _check_elbo_bounds_and_tightness(rng):
    # With q = the prior (q_scores = the attention scores) the ELBO is below log p(y) (Jensen) and its
    # KL vanishes; with q = the exact posterior p(z | y) for one word y the bound is tight for that y.
    s = _sample_mode(rng, "small", "exact", "general")
    cfg = {k: v for k, v in s.config.items() if k not in ("mode", "memory_mask")}
    ex, c = latent_alignment_forward(**s.inputs, params=s.params, **cfg)
    el, ce = latent_alignment_forward(**s.inputs, params=s.params, q_scores=c["la"], mode="enum", **cfg)
    assert np.all(el <= ex + 1e-12), "the ELBO exceeds the exact log-likelihood"
    assert float(np.abs(ce["kl"]).max()) < 1e-12
    y = 1
    post = c["r"][..., y]                                                   # p(z | y) (B, T, S)
    with np.errstate(divide="ignore"):
        tight = latent_alignment(**s.inputs, params=s.params, q_scores=np.log(post), mode="enum", **cfg)
    err = float(np.abs(tight[..., y] - ex[..., y]).max())
    assert err < 1e-10, f"the ELBO with the exact posterior is not tight ({err:.2e})"
    return err


register(
    Mechanism(
        slug="latent_alignment_attention", family="1-softmax", tier="T2",
        title="Latent alignment attention: exact marginal likelihood, enumerated variational ELBO, soft baseline",
        paper="Deng, Kim, Chiu, Guo, Rush, Latent Alignment and Variational Attention, NeurIPS 2018, arXiv 1807.03756",
        forward=latent_alignment_forward, backward=latent_alignment_backward, sample=_sample, reference=_reference,
        docs="softmax/additive-and-alignment-attention.md#latent-alignment-and-variational-attention",
        checks={"gradcheck_every_mode": _check_gradcheck_every_mode,
                "exact_marginal_is_a_distribution": _check_exact_marginal_is_a_distribution,
                "soft_differs_from_exact_unless_one_source": _check_soft_differs_from_exact_unless_one_source,
                "elbo_bounds_and_tightness": _check_elbo_bounds_and_tightness},
    ),
)
