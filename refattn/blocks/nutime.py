r"""NuTime numerically multi-scaled embedding (NME) of unbounded scalars, and NuTime's window token.

Lin, Wen, Cao, Huang, Bian, Lin, Wu, "NuTime: Numerically Multi-Scaled Embedding for Large-Scale
Time-Series Pretraining", TMLR 2024, arXiv 2310.07402. Upstream: chenguolin/NuTime
``src/models/encoders/MultiBiasEncoder.py`` (``MultiBiasEncoder``) and
``src/models/encoders/WindowNormEncoder.py`` (``WindowNormEncoder``) @
9acdd3d0e82df0914217ef752fa3b95ec82cd960.

Numerically multi-scaled embedding
----------------------------------
$K$ scales $s_k = \beta^k$ with $k$ over upstream's ``range(-(K-1)//2, (K+1)//2)`` ($K$ odd:
$-(K-1)/2,\dots,(K-1)/2$; $K$ even: $-K/2,\dots,K/2-1$; $K=9$, $\beta=10$ gives
$10^{-4},\dots,10^4$), learnable $w_k, b_k\in\mathbb R^D$ (``ws``, ``bs`` of shape $(K, D)$):

$$e_k(x) = \mathrm{LN}(x\,w_k + s_k b_k)\quad(\text{no affine, } \epsilon_{LN} = 10^{-5}),$$
$$r_k(x) = \frac{1}{|\ln(|x|/s_k + \epsilon)| + \epsilon},\qquad \alpha_k = r_k\Big/\sum_j r_j,\qquad
\mathrm{NME}(x) = \sum_k \alpha_k(x)\,e_k(x),$$

with $\epsilon = 10^{-6}$: the scale closest to $|x|$ in log space dominates. By LayerNorm's scale
invariance $e_k(x) = \mathrm{LN}((x/s_k)w_k + b_k)$: each embedding sees $x$ at its own scale.
``scale_weighted_sum=False`` replaces $\alpha_k$ by 1 (upstream's ablation). This is upstream's
``MultiBiasEncoder`` with its released configuration (``locs=None`` i.e. one location at 0,
``loc_weighted_sum=False``, ``use_loc_emb=False``); the multi-location ablations are not
reproduced.

Backward of the NME
-------------------
With $dy$ the output gradient: $d\alpha_k = \langle dy, e_k\rangle$, $dz_k = J_{LN}^\top(\alpha_k dy)$
(`refattn.nn.norms.normalize_backward`), $dw_k = \sum x\,dz_k$, $db_k = s_k\sum dz_k$,
$dx \mathrel{+}= \langle dz_k, w_k\rangle$. Through the weights: $dr_k = (d\alpha_k - \sum_j \alpha_j
d\alpha_j)/\sum_j r_j$, $\partial r_k/\partial x = -r_k^2\,\mathrm{sign}(L_k)\,\mathrm{sign}(x)/(s_k(|x|/s_k+\epsilon))$
with $L_k = \ln(|x|/s_k+\epsilon)$. $\alpha$ is not differentiable at $|x| = s_k(1-\epsilon)$ (the
kink of $|L_k|$) and $x=0$ (kink of $|x|$); the sampler keeps away from both.

Window token
------------
`nutime_window_embedding_forward` is the ``WindowNormEncoder`` of the released models
(``use_ms_embed``, ``mean_std_encode='mbe'``, one channel): a series $x\in\mathbb R^{B\times L}$ is
cut into $N = L/W$ windows; window $n$ with mean $\mu_n$ and unbiased std $\sigma_n$ gives the
token

$$t_n = \mathrm{LN}_2\big([\,\mathrm{LN}_1(\mathrm{Conv}_W((x_n-\mu_n)/(\sigma_n+10^{-8})));\ \mathrm{NME}(\mu_n);\ \mathrm{NME}(\sigma_n)\,]\,W_{fc} + b_{fc}\big)$$

(``window_embedding`` = a conv with kernel = stride = $W$, ``window_embed_norm``,
``ms_embed_fc.0``/``.1``, NME parameters under ``multi_bias_encoder.*``). Upstream detaches
$\mu_n, \sigma_n$ (``.detach()``): with ``detach_stats=True`` (default) the backward does the same
(it is then the gradient of upstream's graph, not the derivative of the forward); with
``detach_stats=False`` it is the full derivative through the statistics (what the
finite-difference tests check). Multi-channel series (``channel_embedding``) are not reproduced.

Agreement with upstream
-----------------------
``MultiBiasEncoder`` ($K, \beta$ = (9, 10) and (4, 3) weighted, (9, 10) unweighted; $x$ spread
log-uniformly over $10^{-5}..10^{5}$ with both signs; the ``scales`` buffer cast to float64) in
float64 on CPU: output and the gradients of $x$, ``ws``, ``bs`` agree to $1.6\times10^{-15}$
relative to the largest entry ($4.5\times10^{-12}$ absolute, on gradients of order $10^{3}$).
``WindowNormEncoder`` (one and two channels, $L=32$, $W=8$, $D_w=16$, $D=8$, $K=5$, norms
perturbed from their init), compared with ``detach_stats=True``: output and the gradients of $x$ and every
parameter agree to $8.9\times10^{-15}$ absolute ($7.5\times10^{-16}$ relative).
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_int, check_params, check_positive, compute_dtype
from ..nn.linear import linear_apply, linear_vjp
from ..nn.norms import normalize_backward, normalize_forward
from ..registry import Mechanism, Sample, register
from .core import add_grad, norm_backward, norm_forward

__all__ = ["multiscale_embedding_forward", "multiscale_embedding_backward", "multiscale_embedding",
           "nutime_scales", "nutime_window_embedding_forward", "nutime_window_embedding_backward",
           "nutime_window_embedding"]

_EPS = 1e-6


def nutime_scales(num_bias: int, base: float = 10.0) -> np.ndarray:
    r"""Upstream's scales $\beta^k$, $k$ in ``range(-(K-1)//2, (K+1)//2)``."""
    k = check_int(num_bias, "num_bias", minimum=1)
    base = check_positive(base, "base")
    return np.array([float(base) ** i for i in range(-(k - 1) // 2, (k + 1) // 2)])


def multiscale_embedding_forward(x, params, *, base: float = 10.0, scale_weighted_sum: bool = True,
                                 eps: float = 1e-5):
    r"""$\mathrm{NME}(x) = \sum_k\alpha_k(x)\,\mathrm{LN}(xw_k + s_kb_k)$ per scalar of ``x`` (module docstring).

    Parameters
    ----------
    x : array (...)
        Scalars (any shape; upstream flattens all but the batch axis).
    params : dict
        ``"ws" (K, D)``, ``"bs" (K, D)``.
    base : float
        $\beta$ of the scales $\beta^k$ (upstream ``base_bias``, 10 in the released configs).
    scale_weighted_sum : bool
        Weight the scales by $\alpha_k(x)$ (True, upstream) or sum them (False).
    eps : float
        LayerNorm epsilon (``nn.LayerNorm`` default 1e-5).

    Returns
    -------
    y, cache
        ``y`` of shape ``x.shape + (D,)``.
    """
    x = as_float(x, "x", min_ndim=1)
    if not isinstance(scale_weighted_sum, (bool, np.bool_)):
        raise TypeError(f"scale_weighted_sum must be a bool; got {type(scale_weighted_sum).__name__}")
    eps = check_positive(eps, "eps", allow_zero=True)
    if not isinstance(params, dict) or params.get("ws") is None:
        raise ValueError("params must be a dict with 'ws' (K, D) and 'bs' (K, D) for multiscale_embedding")
    ws = as_float(params["ws"], "ws")
    if ws.ndim != 2:
        raise ValueError(f"ws must have shape (K, D); got {ws.shape}")
    p = check_params(params, {"ws": ws.shape, "bs": ws.shape}, where="multiscale_embedding")
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    s = nutime_scales(ws.shape[0], base).astype(dt)
    z = x[..., None, None] * p["ws"] + (p["bs"] * s[:, None])
    e, stats = normalize_forward(z, (z.ndim - 1,), eps)
    if scale_weighted_sum:
        ax = np.abs(x)[..., None]
        lk = np.log(ax / s + _EPS)
        r = 1.0 / (np.abs(lk) + _EPS)
        alpha = r / r.sum(axis=-1, keepdims=True)
    else:
        lk = r = None
        alpha = np.ones(x.shape + (ws.shape[0],), dtype=dt)
    y = np.einsum("...k,...kd->...d", alpha, e)
    cache = {"x": x, "p": p, "s": s, "e": e, "stats": stats, "alpha": alpha, "lk": lk, "r": r,
             "weighted": bool(scale_weighted_sum), "shape": y.shape, "dtype": dt}
    return y, cache


def multiscale_embedding_backward(dout, cache):
    r"""Gradients of `multiscale_embedding_forward` for ``x``, ``ws`` and ``bs`` (module docstring)."""
    g = as_dout(dout, cache["shape"], cache["dtype"])
    x, p, s, e, alpha = cache["x"], cache["p"], cache["s"], cache["e"], cache["alpha"]
    dz = normalize_backward(alpha[..., None] * g[..., None, :], e, cache["stats"])
    lead = tuple(range(x.ndim))
    k, d = p["ws"].shape
    grads = {"ws": np.einsum("b,bkd->kd", x.reshape(-1), dz.reshape(-1, k, d)), "bs": dz.sum(axis=lead) * s[:, None]}
    dx = np.einsum("...kd,kd->...", dz, p["ws"])
    if cache["weighted"]:
        r, lk = cache["r"], cache["lk"]
        da = np.einsum("...d,...kd->...k", g, e)
        dr = (da - np.sum(alpha * da, axis=-1, keepdims=True)) / r.sum(axis=-1, keepdims=True)
        ax = np.abs(x)[..., None]
        dlk = -np.sign(lk) * r * r * dr
        dx = dx + np.sum(dlk / (ax / s + _EPS) / s, axis=-1) * np.sign(x)
    grads["x"] = dx
    return grads


def multiscale_embedding(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of `multiscale_embedding_forward`."""
    return multiscale_embedding_forward(x, params, **config)[0]


_MBE = "multi_bias_encoder"


def nutime_window_embedding_forward(x, params, *, window_size: int, base: float = 10.0,
                                    scale_weighted_sum: bool = True, detach_stats: bool = True, eps: float = 1e-5):
    r"""NuTime's window tokens $t_n$ (module docstring, "Window token").

    Parameters
    ----------
    x : array (B, C, L)
        The series, $L$ a multiple of ``window_size``.
    params : dict
        ``"window_embedding.weight" (D_w, 1, W)``, ``"window_embedding.bias" (D_w,)``,
        ``"window_embed_norm.weight"/".bias" (D_w,)``, ``"multi_bias_encoder.ws"/".bs" (K, D)``,
        ``"ms_embed_fc.0.weight" (D_w + 2D, D_w)``, ``"ms_embed_fc.0.bias"``,
        ``"ms_embed_fc.1.weight"/".bias" (D_w,)``; for $C > 1$ also
        ``"channel_embedding.0.weight" (C D_w, D_w)``, ``".0.bias"``, ``"channel_embedding.1.weight"/".bias"``.
    window_size : int
        $W$ (upstream ``window_size`` = ``stride``, 16 in the released configs).
    base, scale_weighted_sum
        The NME's (`multiscale_embedding_forward`).
    detach_stats : bool
        Treat the window mean and std as constants in the backward (True, upstream's ``.detach()``)
        or differentiate through them (False).
    eps : float
        LayerNorm epsilon.

    Returns
    -------
    y, cache
        Tokens of shape ``(B, N, D_w)`` (upstream returns the transpose ``(B, D_w, N)``).
    """
    x = as_float(x, "x", min_ndim=3)
    if x.ndim != 3:
        raise ValueError(f"x must have shape (B, C, L); got {x.shape}")
    w = check_int(window_size, "window_size", minimum=2)
    if not isinstance(detach_stats, (bool, np.bool_)):
        raise TypeError(f"detach_stats must be a bool; got {type(detach_stats).__name__}")
    bsz, c, length = x.shape
    if length % w:
        raise ValueError(f"the series length L = {length} must be a multiple of window_size = {w}")
    if not isinstance(params, dict) or params.get("window_embedding.weight") is None \
            or params.get(f"{_MBE}.ws") is None:
        raise ValueError("params must hold 'window_embedding.weight' (D_w, 1, W) and 'multi_bias_encoder.ws' (K, D)")
    dw = as_float(params["window_embedding.weight"], "window_embedding.weight").shape[0]
    kd = as_float(params[f"{_MBE}.ws"], f"{_MBE}.ws").shape
    if len(kd) != 2:
        raise ValueError(f"{_MBE}.ws must have shape (K, D); got {kd}")
    spec = {"window_embedding.weight": (dw, 1, w), "window_embedding.bias": (dw,), "window_embed_norm.weight": (dw,),
            "window_embed_norm.bias": (dw,), f"{_MBE}.ws": kd, f"{_MBE}.bs": kd,
            "ms_embed_fc.0.weight": (dw + 2 * kd[1], dw), "ms_embed_fc.0.bias": (dw,),
            "ms_embed_fc.1.weight": (dw,), "ms_embed_fc.1.bias": (dw,)}
    if c > 1:
        spec.update({"channel_embedding.0.weight": (c * dw, dw), "channel_embedding.0.bias": (dw,),
                     "channel_embedding.1.weight": (dw,), "channel_embedding.1.bias": (dw,)})
    p = check_params(params, spec, where="nutime_window_embedding")
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    n = length // w
    xw = x.reshape(bsz, c, n, w)
    mu = xw.mean(axis=-1, keepdims=True)
    sd = xw.std(axis=-1, ddof=1, keepdims=True)
    den = sd + 1e-8
    xn = (xw - mu) / den
    a = np.einsum("bcnw,dw->bcnd", xn, p["window_embedding.weight"][:, 0, :]) + p["window_embedding.bias"]
    h1, c1 = norm_forward(p, "window_embed_norm", a, eps=eps)
    mbe = {"ws": p[f"{_MBE}.ws"], "bs": p[f"{_MBE}.bs"]}
    em, cm = multiscale_embedding_forward(mu[..., 0], mbe, base=base, scale_weighted_sum=scale_weighted_sum)
    es, cs = multiscale_embedding_forward(sd[..., 0], mbe, base=base, scale_weighted_sum=scale_weighted_sum)
    cat = np.concatenate([h1, em, es], axis=-1)
    f = linear_apply(cat, p["ms_embed_fc.0.weight"], p["ms_embed_fc.0.bias"])
    t, c2 = norm_forward(p, "ms_embed_fc.1", f, eps=eps)
    flat = np.swapaxes(t, 1, 2).reshape(bsz, n, c * dw)
    cc = None
    if c > 1:
        g_in = flat
        fc = linear_apply(g_in, p["channel_embedding.0.weight"], p["channel_embedding.0.bias"])
        y, c3 = norm_forward(p, "channel_embedding.1", fc, eps=eps)
        cc = (g_in, c3)
    else:
        y = flat.copy()
    cache = {"p": p, "xw": xw, "mu": mu, "den": den, "xn": xn, "c1": c1, "cm": cm, "cs": cs, "cat": cat, "c2": c2,
             "cc": cc, "dims": (bsz, c, n, w, dw, kd[1]), "detach": bool(detach_stats), "shape": y.shape, "dtype": dt}
    return y, cache


def nutime_window_embedding_backward(dout, cache):
    r"""Gradients of `nutime_window_embedding_forward` for ``x`` and every params key; with
    ``detach_stats`` the window statistics are held constant, as upstream's ``.detach()``."""
    g = as_dout(dout, cache["shape"], cache["dtype"])
    p = cache["p"]
    bsz, c, n, w, dw, d = cache["dims"]
    grads = {}
    if c > 1:
        g_in, c3 = cache["cc"]
        df = norm_backward(grads, p, g, c3)
        gl = linear_vjp(df, g_in, p["channel_embedding.0.weight"])
        add_grad(grads, "channel_embedding.0.weight", gl["weight"])
        add_grad(grads, "channel_embedding.0.bias", gl["bias"])
        g = gl["x"]
    dt_ = np.swapaxes(g.reshape(bsz, n, c, dw), 1, 2)
    df = norm_backward(grads, p, dt_, cache["c2"])
    gl = linear_vjp(df, cache["cat"], p["ms_embed_fc.0.weight"])
    add_grad(grads, "ms_embed_fc.0.weight", gl["weight"])
    add_grad(grads, "ms_embed_fc.0.bias", gl["bias"])
    dh1, dem, des = gl["x"][..., :dw], gl["x"][..., dw:dw + d], gl["x"][..., dw + d:]
    da = norm_backward(grads, p, dh1, cache["c1"])
    wk = p["window_embedding.weight"][:, 0, :]
    add_grad(grads, "window_embedding.weight", np.einsum("bcnd,bcnw->dw", da, cache["xn"])[:, None, :])
    add_grad(grads, "window_embedding.bias", da.sum(axis=(0, 1, 2)))
    dxn = np.einsum("bcnd,dw->bcnw", da, wk)
    den = cache["den"]
    dxw = dxn / den
    gm = multiscale_embedding_backward(dem, cache["cm"])
    gs = multiscale_embedding_backward(des, cache["cs"])
    for k in ("ws", "bs"):
        add_grad(grads, f"{_MBE}.{k}", gm[k] + gs[k])
    if not cache["detach"]:
        xc = cache["xw"] - cache["mu"]
        dmu = gm["x"][..., None] - np.sum(dxn, axis=-1, keepdims=True) / den
        dsd = gs["x"][..., None] - np.sum(dxn * xc, axis=-1, keepdims=True) / den ** 2
        sd = den - 1e-8
        dxw = dxw + dmu / w + dsd * xc / ((w - 1) * sd)
    grads["x"] = dxw.reshape(bsz, c, n * w)
    return grads


def nutime_window_embedding(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of `nutime_window_embedding_forward`."""
    return nutime_window_embedding_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _draw_x(rng, shape, base, k):
    # |x| log-uniform over the scales' range, at least 10% (in ratio) away from every scale and
    # from 0; random sign.
    s = nutime_scales(k, base)
    lo, hi = np.log(s[0]) - 1.0, np.log(s[-1]) + 1.0
    out = np.empty(int(np.prod(shape)))
    for i in range(out.size):
        while True:
            v = rng.uniform(lo, hi)
            if np.min(np.abs(v - np.log(s))) > 0.1:
                break
        out[i] = np.exp(v) * rng.choice([-1.0, 1.0])
    return out.reshape(shape)


def _sample(rng, size):
    k, d, shape = (3, 3, (2, 3)) if size == "tiny" else (5, 6, (2, 4, 3))
    base = float(rng.choice([3.0, 10.0]))
    p = {"ws": rng.uniform(-1, 1, (k, d)), "bs": rng.uniform(-1, 1, (k, d))}
    return Sample(inputs={"x": _draw_x(rng, shape, base, k)}, params=p,
                  config={"base": base, "scale_weighted_sum": bool(rng.random() < 0.8)})


def _reference(x, params, base=10.0, scale_weighted_sum=True, eps=1e-5):
    # Scalar by scalar with the scale-invariant form LN((x / s_k) w_k + b_k) (exact up to eps).
    ws, bs = params["ws"], params["bs"]
    s = nutime_scales(ws.shape[0], base)
    out = np.zeros(x.shape + (ws.shape[1],))
    for idx in np.ndindex(*x.shape):
        v = x[idx]
        r = np.array([1.0 / (abs(np.log(abs(v) / sk + 1e-6)) + 1e-6) for sk in s])
        a = r / r.sum() if scale_weighted_sum else np.ones_like(r)
        for kk, sk in enumerate(s):
            z = v * ws[kk] + sk * bs[kk]
            out[idx] += a[kk] * (z - z.mean()) / np.sqrt(z.var() + eps)
    return out


def _check_scales(rng):
    got = [nutime_scales(9, 10.0), nutime_scales(4, 2.0), nutime_scales(1)]
    want = [10.0 ** np.arange(-4, 5), 2.0 ** np.arange(-2, 2), np.array([1.0])]
    err = max(float(np.abs(a / b - 1).max()) for a, b in zip(got, want))
    assert err < 1e-12, (got, want)
    return err


def _check_scale_invariance(rng):
    # The catalogue identity LN(x w + s b) = LN((x / s) w + b): with eps = 0 and unit weights the
    # NME is the sum over k of the standardised (x / s_k) w_k + b_k.
    ws, bs = rng.uniform(-1, 1, (3, 5)), rng.uniform(-1, 1, (3, 5))
    x = np.array([0.37, -2.5, 13.0])
    y1 = multiscale_embedding(x, {"ws": ws, "bs": bs}, base=10.0, eps=0.0, scale_weighted_sum=False)
    z = (x[:, None, None] / nutime_scales(3, 10.0)[:, None]) * ws + bs
    y2 = ((z - z.mean(-1, keepdims=True)) / z.std(-1, keepdims=True)).sum(axis=1)
    err = float(np.abs(y1 - y2).max())
    assert err < 1e-12, err
    return err


def _check_weights_pick_nearest_scale(rng):
    # alpha concentrates on the scale nearest |x| in log space (alpha_k -> 1 as |x| -> s_k).
    p = {"ws": rng.uniform(-1, 1, (5, 4)), "bs": rng.uniform(-1, 1, (5, 4))}
    x = np.array([1.0001e-2, -0.99999, 1.00001e2, 2.0e1])
    _, c = multiscale_embedding_forward(x, p)
    a = c["alpha"]
    assert list(a.argmax(-1)) == [0, 2, 4, 3] and a[:3].max(-1).min() > 0.99, a
    return float(1 - a[:3].max(-1).min())


def _window_sample(rng, c=1, n=2, w=4, dw=3, k=3, d=2, detach=False):
    # Window means and stds kept 10% (in ratio) away from every scale 10^j.
    s = nutime_scales(k, 10.0)
    for _ in range(500):
        x = rng.standard_normal((2, c, n * w)) * rng.uniform(0.3, 3.0) + rng.uniform(-3, 3)
        xw = x.reshape(2, c, n, w)
        st = np.concatenate([np.abs(xw.mean(-1)).ravel(), xw.std(-1, ddof=1).ravel()])
        if np.min(np.abs(np.log(st[:, None] / s))) > 0.1:
            break
    p = {"window_embedding.weight": rng.standard_normal((dw, 1, w)) / np.sqrt(w),
         "window_embedding.bias": 0.1 * rng.standard_normal(dw),
         "window_embed_norm.weight": 1 + 0.2 * rng.standard_normal(dw), "window_embed_norm.bias": 0.1 * rng.standard_normal(dw),
         f"{_MBE}.ws": rng.uniform(-1, 1, (k, d)), f"{_MBE}.bs": rng.uniform(-1, 1, (k, d)),
         "ms_embed_fc.0.weight": rng.standard_normal((dw + 2 * d, dw)) / np.sqrt(dw + 2 * d),
         "ms_embed_fc.0.bias": 0.1 * rng.standard_normal(dw),
         "ms_embed_fc.1.weight": 1 + 0.2 * rng.standard_normal(dw), "ms_embed_fc.1.bias": 0.1 * rng.standard_normal(dw)}
    if c > 1:
        p.update({"channel_embedding.0.weight": rng.standard_normal((c * dw, dw)) / np.sqrt(c * dw),
                  "channel_embedding.0.bias": 0.1 * rng.standard_normal(dw),
                  "channel_embedding.1.weight": 1 + 0.2 * rng.standard_normal(dw),
                  "channel_embedding.1.bias": 0.1 * rng.standard_normal(dw)})
    return Sample(inputs={"x": x}, params=p, config={"window_size": w, "base": 10.0, "detach_stats": detach})


def _check_window_token_gradients(rng):
    # The window token's hand-derived backward against central differences (full derivative
    # through the window statistics; two channels, so the channel embedding is covered too).
    from ..testing.gradcheck import gradcheck

    err = 0.0
    rep = gradcheck(nutime_window_embedding_forward, nutime_window_embedding_backward,
                    _window_sample(rng, c=2, n=2, w=3, dw=2))
    err = max(err, rep.max_rel)
    return err


def _check_window_token_detached_stats(rng):
    # detach_stats=True: the parameter gradients are unchanged and dx is the full dx minus the
    # statistics' share, which vanishes for a perturbation that keeps every window's mean and std
    # (an orthogonal-to-{1, x - mu} direction): <dx_detached - dx_full, v> = 0 for such v.
    s = _window_sample(rng)
    y, c_full = nutime_window_embedding_forward(s.inputs["x"], s.params, **dict(s.config, detach_stats=False))
    _, c_det = nutime_window_embedding_forward(s.inputs["x"], s.params, **dict(s.config, detach_stats=True))
    g = rng.standard_normal(y.shape)
    gf, gd = nutime_window_embedding_backward(g, c_full), nutime_window_embedding_backward(g, c_det)
    err = max(float(np.abs(gf[k] - gd[k]).max()) for k in s.params)
    xw = c_full["xw"]
    v = rng.standard_normal(xw.shape)
    basis = np.stack([np.ones_like(xw), xw - c_full["mu"]], axis=-1)
    for idx in np.ndindex(*xw.shape[:-1]):
        q, _ = np.linalg.qr(basis[idx])
        v[idx] -= q @ (q.T @ v[idx])
    diff = float(np.sum((gf["x"] - gd["x"]).reshape(xw.shape) * v))
    err = max(err, abs(diff))
    assert err < 1e-12, f"detached statistics change more than the statistics' share: {err}"
    return err


register(
    Mechanism(
        slug="nutime_multiscale_embedding", family="5-building-blocks", tier="T2",
        title="NuTime numerically multi-scaled embedding: sum_k alpha_k(x) LN(x w_k + s_k b_k), log-distance "
              "scale weights",
        paper="Lin, Wen, Cao, Huang, Bian, Lin, Wu, NuTime: Numerically Multi-Scaled Embedding for Large-Scale "
              "Time-Series Pretraining, TMLR 2024, arXiv 2310.07402",
        forward=multiscale_embedding_forward, backward=multiscale_embedding_backward, sample=_sample,
        reference=_reference, docs="blocks/residual-and-linear.md#nutime-multi-scaled-embedding",
        checks={"scales": _check_scales, "scale_invariance": _check_scale_invariance,
                "weights_pick_nearest_scale": _check_weights_pick_nearest_scale,
                "window_token_gradients": _check_window_token_gradients,
                "window_token_detached_stats": _check_window_token_detached_stats},
    ),
)
