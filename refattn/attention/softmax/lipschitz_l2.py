r"""LRFormer's Lipschitz-regularised attention: negative squared L2 distance scores normalised by a
contractive Lipschitz bound.

Per sample (batch element) and head $h$ ($d$ = head width, $E = Hd$):

$$Q = XW_Q + b_Q,\quad K = Q\ (\text{tied, default})\ \text{or}\ XW_K + b_K,\quad V = XW_V + b_V,$$

$$D_{h,ij} = \|q_{h,i} - k_{h,j}\|^2,\qquad
S_h = -\alpha\,\frac{D_h}{c},\qquad c = \|Q\|_F\,\mu + \varepsilon,\quad \mu = \max_t\|x_t\|,$$

$O_h = \mathrm{softmax}(S_h)V_h$, $Y = [O_1\|\dots\|O_H]W_O + b_O$. The distance similarity
(Banach-space distance, here the Euclidean one) keeps the map Lipschitz on unbounded inputs, and the
bound $c$ makes the score map contractive; $\alpha$ (default 100) sets the sharpness.

Backward
--------
The softmax VJP gives $dS$. Then $dD = -\alpha\,dS/c$ and $dc = -\sum_{h,i,j}S_{h,ij}dS_{h,ij}/c$
(summed over the sample's heads). For $D_{ij} = \|q_i\|^2 - 2q_i\cdot k_j + \|k_j\|^2$:

$$dq_i = 2\Big(q_i\sum_j dD_{ij} - \sum_j dD_{ij}k_j\Big),\qquad
dk_j = 2\Big(k_j\sum_i dD_{ij} - \sum_i dD_{ij}q_i\Big),$$

and through $c$: $dQ \mathrel{+}= dc\,\mu\,Q/\|Q\|_F$, $dx_{t^\*} \mathrel{+}= dc\,\|Q\|_F\,x_{t^\*}/\|x_{t^\*}\|$
with $t^\*$ the arg-max token (a selection held fixed: the gradient flows to that token only; the
sampler avoids ties). Tied: $dQ_{\text{total}} = dQ + dK$. Projections use `linear_prefixed_vjp`.

Sources and reconstruction
--------------------------
Paper: X. Cao et al., "Mitigating Transformer Overconfidence via Lipschitz Regularization"
(LRFormer), UAI 2023, arXiv 2306.06849 — not the unrelated low-resolution LRFormer (TPAMI 2025).
No official code was found; the paper's text beyond the abstract could not be retrieved here, so the
formula is the catalogue's reconstruction from third-party ports (which were read but cannot be
cited: the search index did not name their repositories). Reconstruction choices, as keywords:
``tied`` (True: $W_Q = W_K$ as in one port; False: separate key projection as in another),
``alpha`` (100), ``eps`` (1e-6; the ports have none), and the normalisation **per sample**
($\|Q\|_F$ over the sample's heads and tokens, $\mu$ over its tokens) — one port reduces over the
whole mini-batch, which couples independent samples. No $1/\sqrt d$ scale (the ports have none).
"""

from __future__ import annotations

import numpy as np

from ..._checks import (
    as_dout,
    as_float,
    cast_all,
    check_param_keys,
    check_params,
    check_positive,
    check_weight_in,
    compute_dtype,
)
from ...nn.linear import linear_prefixed, linear_prefixed_vjp, merge_heads, split_heads
from ...nn.softmax import softmax_lse, softmax_vjp
from ...registry import Mechanism, Sample, register
from .core import check_size

__all__ = ["lipschitz_l2_attention_forward", "lipschitz_l2_attention_backward", "lipschitz_l2_attention",
           "init_lipschitz_l2_params"]


def _validate(x, params, h, tied):
    if params is None:
        raise TypeError("params is required: a dict with q_proj.weight, v_proj.weight and o_proj.weight")
    req = ["q_proj.weight", "v_proj.weight", "o_proj.weight"] + ([] if tied else ["k_proj.weight"])
    opt = ["q_proj.bias", "v_proj.bias", "o_proj.bias"] + ([] if tied else ["k_proj.bias"])
    check_param_keys(params, req, opt, where=f"lipschitz_l2_attention(tied={tied}) (weights (in, out); "
                                             "PyTorch: weight.T)")
    c = x.shape[-1]
    check_weight_in(params, "q_proj.weight", c, input_name="x")
    e = as_float(params["q_proj.weight"], "q_proj.weight", ndim=2).shape[1]
    if e % h:
        raise ValueError(f"q_proj.weight's second axis {e} must be divisible by num_heads={h}")
    co = as_float(params["o_proj.weight"], "o_proj.weight", ndim=2).shape[1]
    spec = {"q_proj.weight": (c, e), "q_proj.bias": (e,), "k_proj.weight": (c, e), "k_proj.bias": (e,),
            "v_proj.weight": (c, e), "v_proj.bias": (e,), "o_proj.weight": (e, co), "o_proj.bias": (co,)}
    return check_params(params, {k: v for k, v in spec.items() if k in req or k in opt}, optional=opt,
                        where="lipschitz_l2_attention")


def lipschitz_l2_attention_forward(x, params, *, num_heads: int, alpha: float = 100.0, tied: bool = True,
                                   eps: float = 1e-6):
    r"""LRFormer Lipschitz-regularised L2 attention layer, token-major (module docstring).

    Parameters
    ----------
    x : array (B.., N, C)
    params : dict
        ``"q_proj.weight" (C, E)``, ``"v_proj.weight" (C, E)``, ``"o_proj.weight" (E, C_out)``,
        ``"k_proj.weight" (C, E)`` when ``tied=False``; optional biases. PyTorch weights transposed.
    num_heads : int
    alpha : float > 0
        Score sharpness $\alpha$ (100).
    tied : bool
        $W_Q = W_K$ (True, default) or a separate key projection.
    eps : float > 0
        Added to the bound $c$.

    Returns
    -------
    out, cache
        ``out (B.., N, C_out)``.
    """
    x = as_float(x, "x", min_ndim=2)
    h = check_size(num_heads, "num_heads")
    alpha = float(check_positive(alpha, "alpha"))
    eps = float(check_positive(eps, "eps"))
    if not isinstance(tied, (bool, np.bool_)):
        raise TypeError(f"tied must be a bool; got {type(tied).__name__}")
    p = _validate(x, params, h, tied)
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    q = split_heads(linear_prefixed(p, "q_proj", x), h)
    k = q if tied else split_heads(linear_prefixed(p, "k_proj", x), h)
    v = split_heads(linear_prefixed(p, "v_proj", x), h)
    qn = np.sqrt(np.sum(q * q, axis=(-3, -2, -1), keepdims=True))        # ||Q||_F per sample
    xn = np.linalg.norm(x, axis=-1)                                       # (B.., N)
    tstar = np.argmax(xn, axis=-1)
    mu = np.take_along_axis(xn, tstar[..., None], axis=-1)[..., None, None]   # (B.., 1, 1, 1)
    c = qn * mu + eps
    dist = (np.sum(q * q, axis=-1)[..., :, None] - 2.0 * (q @ np.swapaxes(k, -1, -2))
            + np.sum(k * k, axis=-1)[..., None, :])
    s = -alpha * dist / c
    pr, _ = softmax_lse(s, axis=-1)
    o = pr @ v
    oc = merge_heads(o)
    y = linear_prefixed(p, "o_proj", oc)
    cache = {"x": x, "p": p, "q": q, "k": k, "v": v, "pr": pr, "s": s, "c": c, "qn": qn, "mu": mu,
             "tstar": tstar, "oc": oc, "h": h, "tied": bool(tied), "alpha": alpha, "y_shape": y.shape}
    return y, cache


def lipschitz_l2_attention_backward(dout, cache):
    r"""Gradient of :func:`lipschitz_l2_attention_forward`: ``x`` and every params key."""
    p, x, q, k, v, pr, s, c = (cache[n] for n in ("p", "x", "q", "k", "v", "pr", "s", "c"))
    g = as_dout(dout, cache["y_shape"], x.dtype)
    grads = {}
    do = split_heads(linear_prefixed_vjp(grads, p, "o_proj", g, cache["oc"]), cache["h"])
    dv = np.swapaxes(pr, -1, -2) @ do
    ds = softmax_vjp(pr, do @ np.swapaxes(v, -1, -2))
    dd = -cache["alpha"] * ds / c
    dc = -np.sum(s * ds, axis=(-3, -2, -1), keepdims=True) / c
    rs, cs = dd.sum(axis=-1), dd.sum(axis=-2)
    dq = 2.0 * (q * rs[..., None] - dd @ k)
    dk = 2.0 * (k * cs[..., None] - np.swapaxes(dd, -1, -2) @ q)
    dq = dq + dc * cache["mu"] * q / cache["qn"]
    if cache["tied"]:
        dq = dq + dk
    dx = linear_prefixed_vjp(grads, p, "q_proj", merge_heads(dq), x)
    if not cache["tied"]:
        dx = dx + linear_prefixed_vjp(grads, p, "k_proj", merge_heads(dk), x)
    dx = dx + linear_prefixed_vjp(grads, p, "v_proj", merge_heads(dv), x)
    # the bound's max-norm token (selection held fixed)
    ts = cache["tstar"][..., None]
    xt = np.take_along_axis(x, ts[..., None], axis=-2)                   # (B.., 1, C)
    dmu = (dc * cache["qn"])[..., 0, 0]                                   # (B.., 1)
    upd = dmu[..., None] * xt / np.linalg.norm(xt, axis=-1, keepdims=True)
    onehot = (np.arange(x.shape[-2]) == ts)[..., None]
    grads["x"] = dx + onehot * upd
    return grads


def lipschitz_l2_attention(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`lipschitz_l2_attention_forward`."""
    return lipschitz_l2_attention_forward(x, params, **config)[0]


def init_lipschitz_l2_params(rng, c: int, num_heads: int, head_dim: int, *, tied: bool = True,
                             c_out: int | None = None, bias: bool = True) -> dict:
    """Random parameters (xavier-like weights, small biases) for tests and demos."""
    e, co = num_heads * head_dim, (c if c_out is None else c_out)
    names = ["q_proj", "v_proj"] + ([] if tied else ["k_proj"])
    p = {f"{n}.weight": rng.uniform(-1, 1, (c, e)) * np.sqrt(6.0 / (c + e)) for n in names}
    p["o_proj.weight"] = rng.uniform(-1, 1, (e, co)) * np.sqrt(6.0 / (e + co))
    if bias:
        for n in names:
            p[f"{n}.bias"] = 0.1 * rng.standard_normal(e)
        p["o_proj.bias"] = 0.1 * rng.standard_normal(co)
    return p


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size):
    n, c, h, d = (3, 3, 2, 2) if size == "tiny" else (int(rng.integers(4, 8)), 6, 2, 3)
    tied = bool(rng.random() < 0.5)
    x = rng.standard_normal((2, n, c))
    x[:, 0] *= 2.5          # one clearly largest token per sample: no tie in max_t ||x_t||
    p = init_lipschitz_l2_params(rng, c, h, d, tied=tied)
    return Sample(inputs={"x": x}, params=p, config={"num_heads": h, "tied": tied, "alpha": 5.0})


def _reference(x, params, *, num_heads, alpha=100.0, tied=True, eps=1e-6):
    # per-sample, per-head loop of the explicit distance formula
    b, n, _ = x.shape
    q = x @ params["q_proj.weight"] + params.get("q_proj.bias", 0.0)
    k = q if tied else x @ params["k_proj.weight"] + params.get("k_proj.bias", 0.0)
    v = x @ params["v_proj.weight"] + params.get("v_proj.bias", 0.0)
    d = q.shape[-1] // num_heads
    out = np.zeros_like(v)
    for bb in range(b):
        c = np.sqrt(np.sum(q[bb] ** 2)) * max(np.linalg.norm(x[bb, t]) for t in range(n)) + eps
        for hh in range(num_heads):
            sl = slice(hh * d, (hh + 1) * d)
            dist = np.array([[np.sum((q[bb, i, sl] - k[bb, j, sl]) ** 2) for j in range(n)] for i in range(n)])
            s = -alpha * dist / c
            w = np.exp(s - s.max(-1, keepdims=True))
            out[bb, :, sl] = (w / w.sum(-1, keepdims=True)) @ v[bb, :, sl]
    return out @ params["o_proj.weight"] + params.get("o_proj.bias", 0.0)


def _check_input_scale_invariant_scores(rng):
    # without biases, scaling x by t scales D by t^2 and c by t^2 (eps aside): the attention map
    # is unchanged and the output scales by t (a homogeneity the bound is built for)
    x = rng.standard_normal((2, 5, 4))
    p = init_lipschitz_l2_params(rng, 4, 2, 2, bias=False)
    y, c1 = lipschitz_l2_attention_forward(x, p, num_heads=2, eps=1e-300)
    y3, c3 = lipschitz_l2_attention_forward(3.0 * x, p, num_heads=2, eps=1e-300)
    err = max(float(np.abs(c1["pr"] - c3["pr"]).max()), float(np.abs(3.0 * y - y3).max()))
    assert err < 1e-12, err
    return err


def _check_self_is_most_attended_tied(rng):
    # tied W_Q = W_K: D_ii = 0 is the row minimum, so every token attends most to itself
    x = rng.standard_normal((2, 6, 4))
    p = init_lipschitz_l2_params(rng, 4, 2, 3)
    _, c = lipschitz_l2_attention_forward(x, p, num_heads=2, alpha=50.0)
    pr = c["pr"]
    ok = np.all(np.argmax(pr, axis=-1) == np.arange(6))
    assert ok
    return 0.0


def _check_samples_independent(rng):
    # the bound is per sample: changing sample 1 leaves sample 0 unchanged
    x = rng.standard_normal((2, 4, 3))
    p = init_lipschitz_l2_params(rng, 3, 1, 2, tied=False)
    y = lipschitz_l2_attention(x, p, num_heads=1, tied=False)
    x2 = x.copy()
    x2[1] *= 4.0
    err = float(np.abs(lipschitz_l2_attention(x2, p, num_heads=1, tied=False)[0] - y[0]).max())
    assert err == 0.0, err
    return err


register(
    Mechanism(
        slug="lrformer_lipschitz_attention", family="1-softmax", tier="T3",
        title="Lipschitz-regularised (distance-based) attention",
        paper="X. Cao et al., Mitigating Transformer Overconfidence via Lipschitz Regularization (LRFormer), "
              "UAI 2023, arXiv 2306.06849",
        forward=lipschitz_l2_attention_forward, backward=lipschitz_l2_attention_backward, sample=_sample,
        reference=_reference, docs="softmax/t3-attention.md#lrformer-lipschitz-regularised-attention",
        checks={"input_scale_invariant_scores": _check_input_scale_invariant_scores,
                "self_is_most_attended_tied": _check_self_is_most_attended_tied,
                "samples_independent": _check_samples_independent},
    ),
)
