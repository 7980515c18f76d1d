r"""Power-Law Graph Attention (PLGA): a learned metric tensor raised to learned element-wise powers.

The multi-head layer of the Power Law Graph Transformer. Per head ($d$ = depth, $s = d^{-1/2}$)
with $Q = X_qW_q + b_q$, $K$, $V$ likewise, split into heads:

$$A_0 = Q^\top Q\in\mathbb R^{d\times d}\quad(\text{summed over the query tokens}),\qquad
A = \mathrm{ResA}(A_0),$$

$\mathrm{ResA}$ a stack of ``num_reslayerA`` residual units $A\mapsto\mathrm{LN}(A + \mathrm{Dense}
(\mathrm{ReLU}\text{-Dense}^{\,n}(A)))$ acting on the rows of $A$ (``num_denseA`` = $n$ ReLU layers of
width ``A_dff``, then a linear layer back to $d$; LayerNorm $\epsilon = 10^{-6}$), then

$$\tilde A = \mathrm{ReLU}(WA + b) + 10^{-9},\qquad G = a\,\tilde A^{\circ P} + b_a,\qquad
E = \mathrm{softmax}\big(\mathrm{LeakyReLU}_{0.2}(s\,QGK^\top) + M\big),\qquad H = EV,$$

with per-head learned $W, b, P, a, b_a\in\mathbb R^{d\times d}$ (matrix products $WA$, $a\tilde A^{\circ P}$;
$\circ P$ element-wise powers) and $Y = [H_1\|\dots\|H_h]W_o + b_o$.

``metric_causal`` (refattn option, not upstream): upstream sums $A_0$ over *all* query positions,
so in masked decoder self-attention the metric of query $t$ sees later tokens (teacher forcing
leaks the future through $G$). With ``metric_causal=True`` query $t$ uses its own prefix metric
$A_{0,t} = \sum_{s\le t} q_sq_s^\top$ and $G_t$ built from it; scores $s\,q_tG_tk_j^\top$.
Position $t$'s output then does not depend on any input after $t$ (test in tests/test_softmax_s5.py).

Backward
--------
$dH$ gives $dV = E^\top dH$ and $dE = dH\,V^\top$; the softmax VJP gives $dL$ for the leaky output,
$dT = dL\odot(\mathbb 1[T>0] + 0.2\,\mathbb 1[T\le0])$ for $T = s\,QGK^\top$. Then

$$dQ \mathrel{+}= s\,dT\,K\,G^\top,\qquad dK = s\,dT^\top QG,\qquad dG = s\,Q^\top dT\,K$$

(causal metric: $dG_t = s\,q_t\otimes (dT K)_t$ per query). Through $G = a\tilde A^{\circ P} + b_a$:
$db_a = dG$, $da = dG\,(\tilde A^{\circ P})^\top$, $dR = a^\top dG$ for $R = \tilde A^{\circ P}$,

$$dP = dR\odot R\odot\ln\tilde A,\qquad d\tilde A = dR\odot P\odot\tilde A^{\circ(P-1)},$$

(large where $\tilde A\approx10^{-9}$ and $P<1$: the sampler keeps $WA + b$ away from 0 and $P>0$),
then the ReLU mask, $dW = dZ\,A^\top$, $db = dZ$, $dA = W^\top dZ$ ($Z = WA+b$), the residual units
backwards (LayerNorm, linear, ReLU VJPs), and finally the metric path into $Q$:
$A_0 = Q^\top Q \Rightarrow dQ \mathrel{+}= Q(dA_0 + dA_0^\top)$ (causal: $dq_s \mathrel{+}=
\sum_{t\ge s}(dA_{0,t} + dA_{0,t}^\top)q_s$, a suffix sum). Parameters shared over the batch sum
their per-example gradients.

Conventions (keyword, default = upstream)
-----------------------------------------
``num_heads``; the residual stack's size is read from the params (upstream ``num_reslayerA`` = 1,
``num_denseA`` = 1, ``A_dff`` = ``d_model`` by default); ``negative_slope`` 0.2 (``tf.nn.leaky_relu``);
``metric_causal`` False (upstream). Masks: ``is_causal`` (upstream's look-ahead mask) and a boolean
keep-mask ``attn_mask`` (upstream adds $-10^9$ to masked logits; here they are removed, which is the
same in float64 unless a whole row is masked). Parameter names are upstream's Keras layer names with
Keras kernels, already ``(in, out)``: ``wq/wk/wv/dense.kernel|bias``, ``denseA{i}{j}.kernel|bias``
(hidden ReLU layers of residual unit $i$), ``denseA{i}.kernel|bias``, ``layernormA{i}.gamma|beta``,
``plga_layer.weight0`` ($W$), ``bias_w0`` ($b$), ``adj_power0`` ($P$), ``att_vector0`` ($a$),
``bias_a0`` ($b_a$), each ``(h, d, d)``. Dropout is the identity (evaluation).

Paper: B. Gokden, "Power Law Graph Transformer for Machine Translation and Representation
Learning", arXiv 2107.02039 (2021). Upstream: burcgokden/Power-Law-Graph-Transformer
``power_law_attention_layer.py`` (``plga_layer``) and ``plga_transformer_model.py``
(``MultiHeadAttention``, ``ResLayerA``) @ fef664bb6f786a0ac7ef2819cbbffde95b9ea212.

Measured agreement (float64, CPU): upstream is TensorFlow (not installed here), so the two
upstream files were transcribed line by line into a torch scratch script (``tf.matmul``, ``pow``,
``leaky_relu(alpha=0.2)``, additive $-10^9$ mask, Keras ``Dense``/``LayerNormalization``) and run with
autograd: cross-attention ($M = 3, 4$) and causal self-attention ($N = 5$), $h=2$, $d=3$, ``A_dff`` 5,
zero, one and two residual units with one and two hidden layers, batch 2: output max abs error
6.7e-16; gradients of the three inputs and of every parameter max rel error 6.0e-15.
``metric_causal`` has no upstream counterpart: it is
checked against a per-query loop of the formula (registry reference).
"""

from __future__ import annotations

import re

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_params, check_positive, compute_dtype
from ...nn.linear import linear_apply, linear_vjp, merge_heads, split_heads
from ...nn.norms import layer_norm_backward, layer_norm_forward
from ...nn.softmax import softmax_lse, softmax_vjp
from ...registry import Mechanism, Sample, register
from .core import check_size

__all__ = ["plga_attention_forward", "plga_attention_backward", "plga_attention", "init_plga_params"]

_ADJ_EPS = 1e-9
_PLGA = ("weight0", "bias_w0", "adj_power0", "att_vector0", "bias_a0")


def _structure(params, num_heads, c):
    # read the residual stack (units i, hidden layers j) from the keys; validate every shape
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict; got {type(params).__name__}")
    wq = as_float(params.get("wq.kernel"), "wq.kernel", ndim=2) if "wq.kernel" in params else None
    if wq is None:
        raise ValueError("params is missing 'wq.kernel' (C, d_model)")
    dm = wq.shape[1]
    if wq.shape[0] != c or dm % num_heads:
        raise ValueError(f"wq.kernel must have shape (C={c}, d_model) with num_heads={num_heads} dividing d_model; "
                         f"got {wq.shape}")
    d = dm // num_heads
    units = sorted({int(m.group(1)) for k in params if (m := re.fullmatch(r"layernormA(\d+)\.gamma", k))})
    if units != list(range(len(units))):
        raise ValueError(f"the residual units layernormA<i>.gamma must be numbered 0..n-1; got {units}")
    spec = {f"{n}.{t}": s for n in ("wq", "wk", "wv") for t, s in (("kernel", (c, dm)), ("bias", (dm,)))}
    dense_k = as_float(params.get("dense.kernel", np.zeros((dm, 1))), "dense.kernel", ndim=2)
    spec.update({"dense.kernel": (dm, dense_k.shape[1]), "dense.bias": (dense_k.shape[1],)})
    layout = []
    for i in units:
        hidden = sorted(int(m.group(1)) for k in params if (m := re.fullmatch(rf"denseA{i}(\d+)\.kernel", k)))
        if not hidden or hidden != list(range(len(hidden))):
            raise ValueError(f"residual unit {i} needs hidden layers denseA{i}0, denseA{i}1, ... ; got {hidden}")
        width = as_float(params[f"denseA{i}0.kernel"], f"denseA{i}0.kernel", ndim=2).shape[1]
        for j in hidden:
            spec[f"denseA{i}{j}.kernel"] = (d if j == 0 else width, width)
            spec[f"denseA{i}{j}.bias"] = (width,)
        spec.update({f"denseA{i}.kernel": (width, d), f"denseA{i}.bias": (d,), f"layernormA{i}.gamma": (d,),
                     f"layernormA{i}.beta": (d,)})
        layout.append(len(hidden))
    for name in _PLGA:
        spec["plga_layer." + name] = (num_heads, d, d)
    return check_params(params, spec, where="plga_attention (Keras kernels, (in, out))"), d, layout


def plga_attention_forward(query, key, value, params, *, num_heads: int, metric_causal: bool = False,
                           is_causal: bool = False, attn_mask=None, negative_slope: float = 0.2):
    r"""Power-law graph multi-head attention (module docstring).

    Parameters
    ----------
    query : array (B, N, C)
    key, value : array (B, M, C)
    params : dict
        Upstream Keras names (module docstring); kernels ``(in, out)``.
    num_heads : int
    metric_causal : bool
        Query $t$ uses the prefix metric $\sum_{s\le t}q_sq_s^\top$ (needs $M = N$); False: upstream.
    is_causal : bool
        Look-ahead mask (needs $M = N$).
    attn_mask : bool array broadcastable to (B, h, N, M), optional
        True = keep.
    negative_slope : float
        LeakyReLU slope on the scores (0.2, ``tf.nn.leaky_relu``).

    Returns
    -------
    out, cache
        ``out (B, N, C_out)``.
    """
    query = as_float(query, "query", ndim=3)
    key = as_float(key, "key", ndim=3)
    value = as_float(value, "value", ndim=3)
    h = check_size(num_heads, "num_heads")
    if key.shape[0] != query.shape[0] or value.shape[:2] != key.shape[:2] or \
            key.shape[2] != query.shape[2] or value.shape[2] != query.shape[2]:
        raise ValueError(f"query (B, N, C), key and value (B, M, C) must agree; got {query.shape}, {key.shape}, "
                         f"{value.shape}")
    for flag, name in ((metric_causal, "metric_causal"), (is_causal, "is_causal")):
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"{name} must be a bool; got {type(flag).__name__}")
        if flag and key.shape[1] != query.shape[1]:
            raise ValueError(f"{name}=True needs self-attention lengths N == M; got N={query.shape[1]}, "
                             f"M={key.shape[1]}")
    slope = check_positive(negative_slope, "negative_slope", allow_zero=True)
    p, d, layout = _structure(params, h, query.shape[-1])
    keep = None
    if attn_mask is not None:
        keep = np.asarray(attn_mask)
        if keep.dtype != np.bool_:
            raise TypeError(f"attn_mask must be a boolean keep-mask; got dtype {keep.dtype}")
        np.broadcast_shapes(keep.shape, (query.shape[0], h, query.shape[1], key.shape[1]))
    dt = compute_dtype(query, key, value, *p.values())
    query, key, value, p = query.astype(dt), key.astype(dt), value.astype(dt), cast_all(dt, p)

    q = split_heads(linear_apply(query, p["wq.kernel"], p["wq.bias"]), h)      # (B, h, N, d)
    k = split_heads(linear_apply(key, p["wk.kernel"], p["wk.bias"]), h)
    v = split_heads(linear_apply(value, p["wv.kernel"], p["wv.bias"]), h)
    outer = q[..., :, None] * q[..., None, :]                                   # (B, h, N, d, d)
    a0 = np.cumsum(outer, axis=2) if metric_causal else outer.sum(axis=2, keepdims=True)
    a, res_caches = a0, []
    for i, n_hidden in enumerate(layout):
        hs = [a]
        for j in range(n_hidden):
            hs.append(np.maximum(linear_apply(hs[-1], p[f"denseA{i}{j}.kernel"], p[f"denseA{i}{j}.bias"]), 0.0))
        r = linear_apply(hs[-1], p[f"denseA{i}.kernel"], p[f"denseA{i}.bias"])
        a, ln = layer_norm_forward(r + a, {"weight": p[f"layernormA{i}.gamma"], "bias": p[f"layernormA{i}.beta"]},
                                   eps=1e-6)
        res_caches.append((hs, ln))
    wm, bw = p["plga_layer.weight0"][:, None], p["plga_layer.bias_w0"][:, None]
    pw, av, ba = p["plga_layer.adj_power0"][:, None], p["plga_layer.att_vector0"][:, None], p["plga_layer.bias_a0"][:, None]
    z = wm @ a + bw
    at = np.maximum(z, 0.0) + _ADJ_EPS
    rpow = at ** pw
    g = av @ rpow + ba                                                           # (B, h, T, d, d)
    s = d ** -0.5
    qg = np.einsum("bhnd,bhnde->bhne", q, np.broadcast_to(g, q.shape + (d,)))
    t = s * (qg @ np.swapaxes(k, -1, -2))
    lk = np.where(t > 0, t, slope * t)
    if is_causal:
        lk = np.where(np.tri(t.shape[-2], t.shape[-1], dtype=bool), lk, -np.inf)
    if keep is not None:
        lk = np.where(keep, lk, -np.inf)
    e, _ = softmax_lse(lk, axis=-1)
    hcat = merge_heads(e @ v)
    y = linear_apply(hcat, p["dense.kernel"], p["dense.bias"])
    cache = {"p": p, "inputs": (query, key, value), "q": q, "k": k, "v": v, "a0": a0, "res": res_caches, "a": a,
             "z": z, "at": at, "rpow": rpow, "g": g, "qg": qg, "t": t, "e": e, "hcat": hcat, "s": s, "slope": slope,
             "layout": layout, "h": h, "metric_causal": metric_causal, "y_shape": y.shape}
    return y, cache


def plga_attention_backward(dout, cache):
    r"""Gradient of :func:`plga_attention_forward` for ``query``, ``key``, ``value`` and every params key
    (module docstring): attention, LeakyReLU, the bilinear metric, the power law, the residual stack
    and the metric path $A_0 = Q^\top Q$."""
    p, c = cache["p"], cache
    query, key, value = c["inputs"]
    gy = as_dout(dout, c["y_shape"], query.dtype)
    grads = {}
    go = linear_vjp(gy, c["hcat"], p["dense.kernel"])
    grads["dense.kernel"], grads["dense.bias"] = go["weight"], go["bias"]
    dh = split_heads(go["x"], c["h"])
    e, q, k, v, s = c["e"], c["q"], c["k"], c["v"], c["s"]
    dv = np.swapaxes(e, -1, -2) @ dh
    dl = softmax_vjp(e, dh @ np.swapaxes(v, -1, -2))
    dt = np.where(c["t"] > 0, dl, c["slope"] * dl)
    dqg = s * (dt @ k)                                                           # (B, h, N, d)
    dk = s * (np.swapaxes(dt, -1, -2) @ c["qg"])
    gb = np.broadcast_to(c["g"], q.shape + (q.shape[-1],))
    dq = np.einsum("bhne,bhnde->bhnd", dqg, gb)
    dg = q[..., :, None] * dqg[..., None, :]                                     # per query (B, h, N, d, d)
    if not c["metric_causal"]:
        dg = dg.sum(axis=2, keepdims=True)
    rpow, at, pw = c["rpow"], c["at"], p["plga_layer.adj_power0"][:, None]
    av, wm = p["plga_layer.att_vector0"][:, None], p["plga_layer.weight0"][:, None]
    red = (0, 2)                                                                 # batch and metric-time axes
    grads["plga_layer.bias_a0"] = dg.sum(axis=red)
    grads["plga_layer.att_vector0"] = (dg @ np.swapaxes(rpow, -1, -2)).sum(axis=red)
    dr = np.swapaxes(av, -1, -2) @ dg
    grads["plga_layer.adj_power0"] = (dr * rpow * np.log(at)).sum(axis=red)
    dz = dr * pw * at ** (pw - 1.0) * (c["z"] > 0)
    grads["plga_layer.bias_w0"] = dz.sum(axis=red)
    grads["plga_layer.weight0"] = (dz @ np.swapaxes(c["a"], -1, -2)).sum(axis=red)
    da = np.swapaxes(wm, -1, -2) @ dz
    for i in reversed(range(len(c["layout"]))):
        hs, ln = c["res"][i]
        gl = layer_norm_backward(da, ln)
        grads[f"layernormA{i}.gamma"], grads[f"layernormA{i}.beta"] = gl["weight"], gl["bias"]
        dsum = gl["x"]
        gd = linear_vjp(dsum, hs[-1], p[f"denseA{i}.kernel"])
        grads[f"denseA{i}.kernel"], grads[f"denseA{i}.bias"] = gd["weight"], gd["bias"]
        dhid = gd["x"]
        for j in reversed(range(c["layout"][i])):
            dhid = dhid * (hs[j + 1] > 0)
            gj = linear_vjp(dhid, hs[j], p[f"denseA{i}{j}.kernel"])
            grads[f"denseA{i}{j}.kernel"], grads[f"denseA{i}{j}.bias"] = gj["weight"], gj["bias"]
            dhid = gj["x"]
        da = dsum + dhid
    sym = da + np.swapaxes(da, -1, -2)                                           # dA0 + dA0^T
    if c["metric_causal"]:
        sym = np.flip(np.cumsum(np.flip(sym, axis=2), axis=2), axis=2)           # suffix sums over t >= s
    dq = dq + np.einsum("bhnde,bhne->bhnd", np.broadcast_to(sym, q.shape + (q.shape[-1],)), q)
    for name, dx, x in (("wq", dq, query), ("wk", dk, key), ("wv", dv, value)):
        gl = linear_vjp(merge_heads(dx), x, p[f"{name}.kernel"])
        grads[f"{name}.kernel"], grads[f"{name}.bias"] = gl["weight"], gl["bias"]
        grads[{"wq": "query", "wk": "key", "wv": "value"}[name]] = gl["x"]
    return grads


def plga_attention(query, key, value, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`plga_attention_forward`."""
    return plga_attention_forward(query, key, value, params, **config)[0]


def init_plga_params(rng, c: int, num_heads: int, depth: int, *, a_dff=None, num_reslayer: int = 1,
                     num_dense: int = 1, c_out=None) -> dict:
    """Random parameters for tests and demos (powers drawn in [0.6, 1.4], metric biases positive)."""
    dm = num_heads * depth
    co = c if c_out is None else c_out
    width = dm if a_dff is None else a_dff
    p = {}
    for n, (i, o) in (("wq", (c, dm)), ("wk", (c, dm)), ("wv", (c, dm)), ("dense", (dm, co))):
        p[f"{n}.kernel"] = rng.standard_normal((i, o)) * np.sqrt(2.0 / (i + o))
        p[f"{n}.bias"] = 0.1 * rng.standard_normal(o)
    for i in range(num_reslayer):
        for j in range(num_dense):
            fan = depth if j == 0 else width
            p[f"denseA{i}{j}.kernel"] = rng.standard_normal((fan, width)) * np.sqrt(2.0 / (fan + width))
            p[f"denseA{i}{j}.bias"] = 0.1 * rng.standard_normal(width)
        p[f"denseA{i}.kernel"] = rng.standard_normal((width, depth)) * np.sqrt(2.0 / (width + depth))
        p[f"denseA{i}.bias"] = 0.1 * rng.standard_normal(depth)
        p[f"layernormA{i}.gamma"] = 1.0 + 0.1 * rng.standard_normal(depth)
        p[f"layernormA{i}.beta"] = 0.1 * rng.standard_normal(depth)
    shp = (num_heads, depth, depth)
    p["plga_layer.weight0"] = rng.standard_normal(shp) * 0.3
    p["plga_layer.bias_w0"] = 1.0 + 0.2 * rng.standard_normal(shp)
    p["plga_layer.adj_power0"] = rng.uniform(0.6, 1.4, shp)
    p["plga_layer.att_vector0"] = rng.standard_normal(shp) * np.sqrt(1.0 / depth)
    p["plga_layer.bias_a0"] = 0.1 * rng.standard_normal(shp)
    return p


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _kinks_ok(x, p, cfg, margin=0.02):
    _, c = plga_attention_forward(*x, p, **cfg)
    return np.abs(c["z"]).min() > margin and np.abs(c["t"]).min() > margin


def _sample(rng, size):
    # depth >= 3: LayerNorm over a 2-vector is +-1, which would make the metric piecewise constant
    n, c, h, d = (3, 3, 1, 3) if size == "tiny" else (5, 6, 2, 3)
    cfg = {"num_heads": h}
    r = rng.random()
    if r < 0.4:
        cfg.update(metric_causal=True, is_causal=True)
    elif r < 0.6:
        cfg["is_causal"] = True
    m = n if cfg.get("is_causal") else int(rng.integers(2, n + 1))
    for _ in range(100):
        x = (rng.standard_normal((2, n, c)), rng.standard_normal((2, m, c)), rng.standard_normal((2, m, c)))
        p = init_plga_params(rng, c, h, d, a_dff=3 if size == "tiny" else 5, c_out=2 if size == "tiny" else None)
        if _kinks_ok(x, p, cfg):
            break
    return Sample(inputs={"query": x[0], "key": x[1], "value": x[2]}, params=p, config=cfg)


def _ln(x, g, b, eps=1e-6):
    mu = x.mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + eps) * g + b


def _reference(query, key, value, params, *, num_heads, metric_causal=False, is_causal=False, attn_mask=None,
               negative_slope=0.2):
    # a per-(batch, head, query) loop of the formulas; ResA applied to each query's metric
    p = params
    dm = p["wq.kernel"].shape[1]
    d = dm // num_heads
    q = (query @ p["wq.kernel"] + p["wq.bias"]).reshape(query.shape[0], -1, num_heads, d)
    k = (key @ p["wk.kernel"] + p["wk.bias"]).reshape(key.shape[0], -1, num_heads, d)
    v = (value @ p["wv.kernel"] + p["wv.bias"]).reshape(value.shape[0], -1, num_heads, d)
    units = sum(1 for kk in p if kk.startswith("layernormA") and kk.endswith(".gamma"))
    n, m = q.shape[1], k.shape[1]
    out = np.zeros((q.shape[0], n, dm))
    for b in range(q.shape[0]):
        for hh in range(num_heads):
            for i in range(n):
                rows = q[b, : i + 1, hh] if metric_causal else q[b, :, hh]
                a = rows.T @ rows
                for u in range(units):
                    x = a
                    j = 0
                    while f"denseA{u}{j}.kernel" in p:
                        x = np.maximum(x @ p[f"denseA{u}{j}.kernel"] + p[f"denseA{u}{j}.bias"], 0)
                        j += 1
                    a = _ln(x @ p[f"denseA{u}.kernel"] + p[f"denseA{u}.bias"] + a, p[f"layernormA{u}.gamma"],
                            p[f"layernormA{u}.beta"])
                at = np.maximum(p["plga_layer.weight0"][hh] @ a + p["plga_layer.bias_w0"][hh], 0) + 1e-9
                g = p["plga_layer.att_vector0"][hh] @ at ** p["plga_layer.adj_power0"][hh] + p["plga_layer.bias_a0"][hh]
                sc = np.array([q[b, i, hh] @ g @ k[b, j, hh] for j in range(m)]) / np.sqrt(d)
                sc = np.where(sc > 0, sc, negative_slope * sc)
                vis = np.ones(m, bool) if not is_causal else np.arange(m) <= i
                if attn_mask is not None:
                    vis = vis & np.broadcast_to(attn_mask, (q.shape[0], num_heads, n, m))[b, hh, i]
                w = np.where(vis, np.exp(sc - sc[vis].max()), 0.0)
                out[b, i, hh * d:(hh + 1) * d] = (w / w.sum()) @ v[b, :, hh]
    return out @ p["dense.kernel"] + p["dense.bias"]


def _check_metric_causal_no_leak(rng):
    # metric_causal: changing the last token changes no earlier output; upstream's metric leaks
    x = rng.standard_normal((2, 5, 6))
    p = init_plga_params(rng, 6, 2, 3)
    x2 = x.copy()
    x2[:, -1] += rng.standard_normal((2, 6))
    y1 = plga_attention(x, x, x, p, num_heads=2, metric_causal=True, is_causal=True)
    y2 = plga_attention(x2, x2, x2, p, num_heads=2, metric_causal=True, is_causal=True)
    leak = float(np.abs(y1[:, :-1] - y2[:, :-1]).max())
    u1 = plga_attention(x, x, x, p, num_heads=2, is_causal=True)
    u2 = plga_attention(x2, x2, x2, p, num_heads=2, is_causal=True)
    assert leak < 1e-13 and np.abs(u1[:, :-1] - u2[:, :-1]).max() > 1e-6, leak
    return leak


def _check_power_one_linear_metric(rng):
    # P = 1, W = I, b large (ReLU inactive), a = I, b_a = 0: G = A + b + 1e-9 (the power law drops out)
    x = rng.standard_normal((2, 4, 3))
    p = init_plga_params(rng, 3, 1, 3, num_reslayer=0)
    eye = np.eye(3)[None]
    p.update({"plga_layer.adj_power0": np.ones((1, 3, 3)), "plga_layer.weight0": eye.copy(),
              "plga_layer.bias_w0": np.full((1, 3, 3), 50.0), "plga_layer.att_vector0": eye.copy(),
              "plga_layer.bias_a0": np.zeros((1, 3, 3))})
    _, c = plga_attention_forward(x, x, x, p, num_heads=1)
    want = c["a0"] + 50.0 + 1e-9
    err = float(np.abs(c["g"] - want).max() / np.abs(want).max())
    assert err < 1e-14, err
    return err


register(
    Mechanism(
        slug="plga_power_law_attention", family="1-softmax", tier="T2",
        title="Power-Law Graph Attention: learned metric tensor with element-wise learned powers",
        paper="B. Gokden, Power Law Graph Transformer for Machine Translation and Representation Learning, "
              "arXiv 2107.02039 (2021)",
        official_code="burcgokden/Power-Law-Graph-Transformer",
        forward=plga_attention_forward, backward=plga_attention_backward, sample=_sample, reference=_reference,
        docs="softmax/masks-and-selection.md#power-law-graph-attention",
        checks={"metric_causal_no_leak": _check_metric_causal_no_leak,
                "power_one_linear_metric": _check_power_one_linear_metric},
    ),
)
