r"""GAOT MAGNO: multiscale attentional graph neural operator encoder/decoder with geometry embedding.

Paper: Wen, Kumbhat, Lingsch, Mousavi, Chandrashekar, Mishra, "Geometry Aware Operator Transformer
As An Efficient And Accurate Neural Surrogate For PDEs On Arbitrary Domains" (GAOT), arXiv
2505.18781. Upstream (verified: the paper's code link): camlab-ethz/GAOT
``src/model/layers/magno.py`` (``MAGNOEncoder``/``MAGNODecoder``, ``MAGNOConfig``),
``src/model/layers/agno.py`` (``AGNO``), ``src/model/layers/gemb.py`` (``GeometricEmbedding``,
``node_pos_encode``), ``src/model/layers/mlp.py`` (``ChannelMLP``, ``LinearChannelMLP``)
@ aec18bb6ef750b77097fbf6f84bf0031c84bb58a.

Which part of the model
-----------------------
GAOT = MAGNO encoder (physical points → a latent grid of tokens) → ViT processor on the latent
tokens → MAGNO decoder (latent tokens → arbitrary query points). This module is the MAGNO layer,
both roles (``role="encoder"``/``"decoder"``); the ViT processor is a standard transformer.

Forward
-------
Source points $x_j$ with features $f_j$ (``f``), target points $y_i$; scales $s$ with radii
$r_s = r\,s$ and neighbourhoods $A_s(y_i) = \{j : \lVert y_i - x_j\rVert\le r_s\}$
(:func:`refattn.operators.gno_kernel_integral.radius_neighbors`, tested against brute force).
Encoder lifting $u_j = f_jW_{lift} + b$ (a ``Conv1d(k=1)``; the decoder uses $u = f$).
Per scale (attentional GNO, ``AGNO``):

$$a_{ij} = \frac{e(y_i)}{\lVert e(y_i)\rVert}\cdot\frac{e(x_j)}{\lVert e(x_j)\rVert}\ (\texttt{"cosine"}),\qquad
\alpha_{ij} = \mathrm{softmax}_{j\in A_s(y_i)}(a_{ij}),$$

$$w_s(y_i) = \sum_{j\in A_s(y_i)}\alpha_{ij}\,\kappa\big([e(x_j), e(y_i)]\,(,u_j)\big)\odot u_j,$$

$\kappa$ a GELU MLP (``"linear"``; ``"nonlinear"`` also feeds $u_j$), $e$ the identity or
(``node_embedding``) $e(p) = [\sin(k\pi(p+1)), \cos(k\pi(p+1))]_{k=1..4}$; ``"dot_product"``:
$a_{ij} = (e(y_i)W_q + b_q)\cdot(e(x_j)W_k + b_k)/\sqrt{d_a}$. Geometry embedding of $A_s(y_i)$ (statistical):
$g_i = [\,|A|,\ \bar\rho,\ \mathrm{Var}\rho,\ \bar x - y_i,\ \lambda_1\ge\dots\ge\lambda_d\,]$ (distances
$\rho$, centroid $\bar x$, eigenvalues of the neighbour covariance; zero for an empty ball),
standardised over the targets (unbiased std, floored to 1 below $10^{-6}$), then
$\gamma_i = \mathrm{ReLU}(\mathrm{ReLU}(g_iW_1 + b_1)W_2 + b_2)$, and

$$\mathrm{enc}_s(y_i) = [w_s(y_i),\ \gamma_i]\,W_{rec} + b_{rec},\qquad
\mathrm{out}(y_i) = \tfrac1S\textstyle\sum_s\mathrm{enc}_s(y_i)\ \ \text{or}\ \ \sum_s\beta_s(y_i)\,\mathrm{enc}_s(y_i),$$

$\beta(y) = \mathrm{softmax}(\mathrm{ReLU}(yV_1 + c_1)V_2 + c_2)$ (``use_scale_weights``). The decoder
applies a final ``Conv1d(k=1)`` projection. $\kappa$, the attention, $\gamma$ and the recovery
layer are shared by the scales.

Backward
--------
The radius graphs are non-differentiable selections, held fixed; coordinates are geometry data
(upstream never differentiates them), so the geometry statistics $g$ and the attention logits of
the cosine type are constants. With $G$ the upstream gradient: scale combination ($dG_s = G/S$ or
$\beta_s G$, $d\beta_s = \sum_c G\odot\mathrm{enc}_s$ then the softmax and MLP VJPs); recovery
($d[w,\gamma] = dG_sW_{rec}^\top$); $\gamma$'s MLP VJP (parameters only); for every edge
$dv_{ij} = \alpha_{ij}\,dw_i$, $d\alpha_{ij} = dw_i\cdot v_{ij}$, the segment-softmax VJP
$da_{ij} = \alpha_{ij}(d\alpha_{ij} - \sum_{k}\alpha_{ik}d\alpha_{ik})$ (dot-product: into
$W_q, W_k$), $d\kappa_{ij} = dv_{ij}\odot u_j$, $du_j \mathrel{+}= \sum_i dv_{ij}\odot\kappa_{ij}$
(+ the kernel-input part for ``"nonlinear"``), the kernel MLP VJP, then the lifting (or, decoder,
$df = du$).

Conventions and upstream details
--------------------------------
* Defaults as ``MAGNOConfig``: ``scales=(1.0,)``, cosine attention, statistical geometry
  embedding, ``transform_type="linear"``, no scale weights, no node embedding. Upstream's default
  kernel MLP has 3 hidden layers of 64; here the widths are read from the parameters.
* ``F.normalize`` floor $10^{-12}$ on the norms (a coordinate at the origin gives $a = 0$).
* Upstream's ``"nonlinear"`` sizes the kernel input with the *raw* input width but feeds the
  lifted features (a shape error unless they agree); here the lifted width is used.
* Edge dropping (``sampling_strategy``) is a training-time random subsampling; not implemented.
  The ``"pointnet"`` geometry embedding (max-pooled) is not implemented.
* Batched coordinates ``(B, n, d)`` are upstream's "vx" mode. The decoder's scale weights use
  each batch element's own query coordinates (upstream uses element 0's for the whole batch).
* ``Conv1d`` weights keep PyTorch's ``(C_out, C_in, 1)`` layout; linear weights are ``(in, out)``.

Agreement with upstream
-----------------------
``MAGNOEncoder``/``MAGNODecoder`` in PyTorch float64 on CPU (CPU stand-ins for ``torch_scatter``,
``"native"`` neighbour search; 120 points, 30 targets, radius 0.35), maximum error relative to the
largest entry: default encoder output 5.7e-16, gradients <= 1.9e-15; two scales with scale weights
1.3e-15 / 4.0e-15; dot-product attention + nonlinear kernel + node embedding 2.2e-15 / 2.1e-15
(the key-projection bias's gradient is structurally zero, ~1e-17 in both); decoder, two scales
4.8e-16 / 1.6e-15.
"""

from __future__ import annotations

import numpy as np

from .._checks import (
    as_dout,
    as_float,
    cast_all,
    check_choice,
    check_params,
    check_positive,
    check_weight_in,
    compute_dtype,
)
from ..nn.activations import gelu, gelu_grad, relu
from ..nn.linear import init_linear_prefixed, linear_prefixed, linear_prefixed_spec, linear_prefixed_vjp
from ..nn.softmax import softmax_lse, softmax_vjp
from ..registry import Mechanism, Sample, register
from .gno_kernel_integral import radius_neighbors

__all__ = ["magno_forward", "magno_backward", "magno", "init_magno_params", "magno_geometry_features",
           "node_pos_encode"]

_K = "agno.channel_mlp.fcs"
_NORM_EPS = 1e-12
_ROLES = ("encoder", "decoder")


def node_pos_encode(p: np.ndarray, freq: int = 4) -> np.ndarray:
    r"""GAOT's node positional encoding: $(\ldots, d)\to(\ldots, 2\,\text{freq}\,d)$, entries
    $[\sin(k\pi(p_c+1))]_{c}$ then $[\cos(\cdot)]_c$ for $k = 1..\text{freq}$ (frequency-major)."""
    ang = np.arange(1, freq + 1)[:, None] * (np.pi * (p[..., None, :] + 1.0))
    return np.concatenate([np.sin(ang), np.cos(ang)], axis=-1).reshape(p.shape[:-1] + (-1,))


def magno_geometry_features(src: np.ndarray, dst: np.ndarray, index: np.ndarray, splits: np.ndarray) -> np.ndarray:
    r"""Standardised statistical geometry features $(M, 3 + 2d)$ of the neighbourhoods of ``dst``
    in ``src`` (CSR ``index``/``splits`` as :func:`radius_neighbors` returns): count, mean and
    variance of the distances, centroid offset, covariance eigenvalues (descending); zero rows for
    empty balls; standardised over the M targets (unbiased std, floored to 1 below 1e-6)."""
    m, d = dst.shape
    counts = np.diff(splits)
    owner = np.repeat(np.arange(m), counts)
    nb = src[index]
    dist = np.linalg.norm(nb - dst[owner], axis=-1)
    cnt = np.maximum(counts, 1).astype(src.dtype)
    mean_d = np.bincount(owner, dist, minlength=m) / cnt
    var_d = np.maximum(np.bincount(owner, dist * dist, minlength=m) / cnt - mean_d ** 2, 0.0)
    cen = np.stack([np.bincount(owner, nb[:, c], minlength=m) for c in range(d)], axis=-1) / cnt[:, None]
    cc = nb - cen[owner]
    cov = np.zeros((m, d, d), dtype=src.dtype)
    np.add.at(cov, owner, cc[:, :, None] * cc[:, None, :])
    cov /= cnt[:, None, None]
    eig = np.linalg.eigvalsh(cov)[:, ::-1]
    feats = np.concatenate([counts[:, None].astype(src.dtype), mean_d[:, None], var_d[:, None], cen - dst, eig], axis=1)
    feats[counts == 0] = 0.0
    mu = feats.mean(axis=0, keepdims=True)
    sd = feats.std(axis=0, ddof=1, keepdims=True) if m > 1 else np.full_like(mu, np.nan)
    sd = np.where(np.isnan(sd) | (sd < 1e-6), 1.0, sd)
    return ((feats - mu) / sd).astype(src.dtype, copy=False)


def _n_layers(params, prefix) -> int:
    n = 0
    while f"{prefix}.{n}.weight" in params:
        n += 1
    return n


def _coords(c, name, b):
    c = as_float(c, name, min_ndim=2, max_ndim=3)
    return np.broadcast_to(c, (b,) + c.shape) if c.ndim == 2 else c


def _validate(f, params, src_coord, dst_coord, radius, scales, role, attention_type, transform_type,
              use_geoembed, node_embedding, use_scale_weights):
    f = as_float(f, "f", ndim=3)
    b, n, c_in = f.shape
    src, dst = _coords(src_coord, "src_coord", b), _coords(dst_coord, "dst_coord", b)
    if src.shape[:2] != (b, n):
        raise ValueError(f"src_coord must have shape (N={n}, d) or (B={b}, N={n}, d) to match f; got {np.shape(src_coord)}")
    if dst.shape[0] != b or dst.shape[2] != src.shape[2]:
        raise ValueError(f"dst_coord must have shape (M, d={src.shape[2]}) or (B={b}, M, d); got {np.shape(dst_coord)}")
    radius = check_positive(radius, "radius")
    if not isinstance(scales, (tuple, list)) or not scales:
        raise ValueError(f"scales must be a non-empty tuple of positive radius factors; got {scales!r}")
    scales = tuple(check_positive(s, "scales") for s in scales)
    check_choice(role, "role", _ROLES)
    check_choice(attention_type, "attention_type", ("cosine", "dot_product"))
    check_choice(transform_type, "transform_type", ("linear", "nonlinear"))
    for name, v in (("use_geoembed", use_geoembed), ("node_embedding", node_embedding),
                    ("use_scale_weights", use_scale_weights)):
        if not isinstance(v, (bool, np.bool_)):
            raise TypeError(f"{name} must be a bool; got {type(v).__name__}")
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of arrays; got {type(params).__name__}")
    d = src.shape[2]
    kd = 8 * d if node_embedding else d
    spec = {}
    if role == "encoder":
        w = params.get("lifting.fcs.0.weight")
        if w is None:
            raise ValueError(f"params is missing 'lifting.fcs.0.weight' (expected shape (C, C_in={c_in}, 1))")
        ch = as_float(w, "lifting.fcs.0.weight", ndim=3).shape[0]
        spec.update({"lifting.fcs.0.weight": (ch, c_in, 1), "lifting.fcs.0.bias": (ch,)})
    else:
        ch = c_in
    n_k = _n_layers(params, _K)
    if n_k == 0:
        raise ValueError(f"params is missing '{_K}.0.weight' (the kernel MLP)")
    widths = [2 * kd + (ch if transform_type == "nonlinear" else 0)]
    for i in range(n_k):
        if np.ndim(params[f"{_K}.{i}.weight"]) == 2:  # the next width is read off its output axis
            check_weight_in(params, f"{_K}.{i}.weight", widths[i],
                            input_name="the kernel MLP's input" if i == 0 else f"{_K}.{i - 1}'s output")
        widths.append(as_float(params[f"{_K}.{i}.weight"], f"{_K}.{i}.weight", ndim=2).shape[1])
        spec.update(linear_prefixed_spec(f"{_K}.{i}", widths[i], widths[i + 1]))
    if widths[-1] != ch:
        raise ValueError(f"the kernel MLP must output C={ch} channels (it multiplies the features); got {widths[-1]}")
    if attention_type == "dot_product":
        da = as_float(params.get("agno.query_proj.weight", np.zeros((kd, 1))), "agno.query_proj.weight", ndim=2).shape[1]
        spec.update(linear_prefixed_spec("agno.query_proj", kd, da))
        spec.update(linear_prefixed_spec("agno.key_proj", kd, da))
    if use_geoembed:
        gh = as_float(params.get("geoembed.mlp.0.weight", np.zeros((1, 1))), "geoembed.mlp.0.weight", ndim=2).shape[1]
        spec.update(linear_prefixed_spec("geoembed.mlp.0", 3 + 2 * d, gh))
        spec.update(linear_prefixed_spec("geoembed.mlp.2", gh, ch))
        spec.update({"recovery.fcs.0.weight": (ch, 2 * ch, 1), "recovery.fcs.0.bias": (ch,)})
    if use_scale_weights:
        sh = as_float(params.get("scale_weighting.0.weight", np.zeros((1, 1))), "scale_weighting.0.weight",
                      ndim=2).shape[1]
        spec.update(linear_prefixed_spec("scale_weighting.0", d, sh))
        spec.update(linear_prefixed_spec("scale_weighting.2", sh, len(scales)))
    if role == "decoder":
        w = params.get("projection.fcs.0.weight")
        if w is None:
            raise ValueError(f"params is missing 'projection.fcs.0.weight' (expected shape (C_out, C={ch}, 1))")
        co = as_float(w, "projection.fcs.0.weight", ndim=3).shape[0]
        spec.update({"projection.fcs.0.weight": (co, ch, 1), "projection.fcs.0.bias": (co,)})
    p = check_params(params, spec)
    dt = compute_dtype(f, *p.values())                # coordinates follow the features' dtype
    return (f.astype(dt, copy=False), src.astype(dt, copy=False), dst.astype(dt, copy=False), cast_all(dt, p),
            radius, scales, n_k)


def _conv1(p, prefix, x):
    return x @ p[f"{prefix}.weight"][:, :, 0].T + p[f"{prefix}.bias"]


def _conv1_vjp(grads, p, prefix, dy, x):
    grads[f"{prefix}.weight"] = grads.get(f"{prefix}.weight", 0.0) + (
        dy.reshape(-1, dy.shape[-1]).T @ x.reshape(-1, x.shape[-1]))[:, :, None]
    grads[f"{prefix}.bias"] = grads.get(f"{prefix}.bias", 0.0) + dy.reshape(-1, dy.shape[-1]).sum(axis=0)
    return dy @ p[f"{prefix}.weight"][:, :, 0]


def _graph(src, dst, r, shared):
    # (eb, ei, ej) edges of every batch element; the geometry statistics of each element.
    eb, ei, ej, geo = [], [], [], []
    cached = None
    for bb in range(src.shape[0]):
        if cached is None or not shared:
            idx, spl = radius_neighbors(src[bb], dst[bb], r)
            cached = (idx, spl, magno_geometry_features(src[bb], dst[bb], idx, spl))
        idx, spl, g = cached
        ei.append(np.repeat(np.arange(dst.shape[1]), np.diff(spl)))
        ej.append(idx)
        eb.append(np.full(idx.shape, bb))
        geo.append(g)
    return tuple(np.concatenate(t).astype(np.int64) for t in (eb, ei, ej)), np.stack(geo)


def _segment_softmax(a, seg, n_seg):
    mx = np.full(n_seg, -np.inf, dtype=a.dtype)
    np.maximum.at(mx, seg, a)
    e = np.exp(a - mx[seg])
    den = np.bincount(seg, e, minlength=n_seg).astype(a.dtype, copy=False)   # bincount sums in float64
    return e / den[seg]


def magno_forward(f, params, *, src_coord, dst_coord, radius: float, scales=(1.0,), role: str = "encoder",
                  attention_type: str = "cosine", transform_type: str = "linear", use_geoembed: bool = True,
                  node_embedding: bool = False, use_scale_weights: bool = False):
    r"""MAGNO encoder or decoder (module docstring).

    Parameters
    ----------
    f : array (B, N, C_in)
        Features on the source points (encoder: physical nodes; decoder: latent tokens).
    params : dict
        ``lifting.fcs.0.{weight (C, C_in, 1), bias}`` (encoder) / ``projection.fcs.0.{weight (C_out, C, 1), bias}``
        (decoder); kernel MLP ``agno.channel_mlp.fcs.{i}.{weight (in, out), bias}`` with input width
        ``2 kd`` (+ C for ``"nonlinear"``) and output C; ``agno.query_proj``/``agno.key_proj`` (kd, d_a)
        for dot-product attention; ``geoembed.mlp.0`` (3 + 2d, h), ``geoembed.mlp.2`` (h, C) and
        ``recovery.fcs.0.{weight (C, 2C, 1), bias}`` with the geometry embedding;
        ``scale_weighting.0`` (d, h'), ``scale_weighting.2`` (h', S) with scale weights.
    src_coord : array (N, d) or (B, N, d)
        Source coordinates (shared over the batch, or per element). Not differentiated.
    dst_coord : array (M, d) or (B, M, d)
        Target coordinates (encoder: latent token grid; decoder: query points).
    radius : float
        Base radius $r$ (inclusive), multiplied by each of ``scales``.
    role : {"encoder", "decoder"}
    attention_type : {"cosine", "dot_product"}
    transform_type : {"linear", "nonlinear"}
    use_geoembed, node_embedding, use_scale_weights : bool

    Returns
    -------
    out, cache
        ``out (B, M, C)`` (encoder) or ``(B, M, C_out)`` (decoder); ``cache["graphs"]`` holds the
        (batch, target, source) edge lists per scale.
    """
    shared = np.ndim(src_coord) == 2 and np.ndim(dst_coord) == 2
    f, src, dst, p, radius, scales, n_k = _validate(
        f, params, src_coord, dst_coord, radius, scales, role, attention_type, transform_type, use_geoembed,
        node_embedding, use_scale_weights)
    b, m = f.shape[0], dst.shape[1]
    u = _conv1(p, "lifting.fcs.0", f) if role == "encoder" else f
    es, ed = (node_pos_encode(src), node_pos_encode(dst)) if node_embedding else (src, dst)
    if attention_type == "cosine":
        qa = ed / np.maximum(np.linalg.norm(ed, axis=-1, keepdims=True), _NORM_EPS)
        ka = es / np.maximum(np.linalg.norm(es, axis=-1, keepdims=True), _NORM_EPS)
    else:
        qa, ka = linear_prefixed(p, "agno.query_proj", ed), linear_prefixed(p, "agno.key_proj", es)
    per_scale = []
    for s in scales:
        (eb, ei, ej), geo = _graph(src, dst, radius * s, shared)
        seg = eb * m + ei
        logit = np.sum(qa[eb, ei] * ka[eb, ej], axis=-1)
        if attention_type == "dot_product":
            logit = logit / np.sqrt(qa.shape[-1])
        alpha = _segment_softmax(logit, seg, b * m)
        parts = [es[eb, ej], ed[eb, ei]] + ([u[eb, ej]] if transform_type == "nonlinear" else [])
        hs, pre = [np.concatenate(parts, axis=-1)], []
        for i in range(n_k):
            pre.append(linear_prefixed(p, f"{_K}.{i}", hs[-1]))
            hs.append(gelu(pre[-1]) if i < n_k - 1 else pre[-1])
        val = hs[-1] * u[eb, ej]
        w = np.zeros((b, m, u.shape[-1]), dtype=f.dtype)
        np.add.at(w, (eb, ei), alpha[:, None] * val)
        sc = dict(graph=(eb, ei, ej), seg=seg, alpha=alpha, hs=hs, pre=pre, val=val, w=w)
        if use_geoembed:
            g1 = linear_prefixed(p, "geoembed.mlp.0", geo)
            g2 = linear_prefixed(p, "geoembed.mlp.2", relu(g1))
            cat = np.concatenate([w, relu(g2)], axis=-1)
            enc = _conv1(p, "recovery.fcs.0", cat)
            sc.update(geo=geo, g1=g1, g2=g2, cat=cat)
        else:
            enc = w
        sc["enc"] = enc
        per_scale.append(sc)
    beta = None
    if use_scale_weights:
        z1 = linear_prefixed(p, "scale_weighting.0", dst)
        beta, _ = softmax_lse(linear_prefixed(p, "scale_weighting.2", relu(z1)), axis=-1)
        comb = sum(beta[..., k:k + 1] * sc["enc"] for k, sc in enumerate(per_scale))
    else:
        z1 = None
        comb = sum(sc["enc"] for sc in per_scale) / len(per_scale)
    out = _conv1(p, "projection.fcs.0", comb) if role == "decoder" else comb
    cache = dict(p=p, f=f, u=u, es=es, ed=ed, qa=qa, ka=ka, dst=dst, role=role, attention_type=attention_type,
                 transform_type=transform_type, use_geoembed=use_geoembed, n_k=n_k, scales=per_scale, beta=beta,
                 z1=z1, comb=comb, out_shape=out.shape, graphs=[sc["graph"] for sc in per_scale])
    return out, cache


def magno_backward(dout, cache):
    """Gradients of :func:`magno_forward` with the radius graphs held fixed: ``f`` and every params key
    (coordinates are geometry data and not differentiated)."""
    p, f, u = cache["p"], cache["f"], cache["u"]
    g = as_dout(dout, cache["out_shape"], f.dtype)
    grads = {}
    if cache["role"] == "decoder":
        g = _conv1_vjp(grads, p, "projection.fcs.0", g, cache["comb"])
    scs, beta = cache["scales"], cache["beta"]
    if beta is not None:
        dbeta = np.stack([np.sum(g * sc["enc"], axis=-1) for sc in scs], axis=-1)
        dlog = softmax_vjp(beta, dbeta, axis=-1)
        z1 = cache["z1"]
        dh = linear_prefixed_vjp(grads, p, "scale_weighting.2", dlog, relu(z1))
        linear_prefixed_vjp(grads, p, "scale_weighting.0", dh * (z1 > 0), cache["dst"])
        denc = [beta[..., k:k + 1] * g for k in range(len(scs))]
    else:
        denc = [g / len(scs) for _ in scs]
    du = np.zeros_like(u)
    dqa, dka = np.zeros_like(cache["qa"]), np.zeros_like(cache["ka"])
    n_k, m = cache["n_k"], cache["dst"].shape[1]
    for sc, de in zip(scs, denc):
        eb, ei, ej = sc["graph"]
        if cache["use_geoembed"]:
            dcat = _conv1_vjp(grads, p, "recovery.fcs.0", de, sc["cat"])
            ch = u.shape[-1]
            dw, dg2 = dcat[..., :ch], dcat[..., ch:] * (sc["g2"] > 0)
            dg1 = linear_prefixed_vjp(grads, p, "geoembed.mlp.2", dg2, relu(sc["g1"]))
            linear_prefixed_vjp(grads, p, "geoembed.mlp.0", dg1 * (sc["g1"] > 0), sc["geo"])
        else:
            dw = de
        dwe = dw[eb, ei]
        alpha, val = sc["alpha"], sc["val"]
        dval = alpha[:, None] * dwe
        dalpha = np.sum(dwe * val, axis=-1)
        s_grp = np.bincount(sc["seg"], alpha * dalpha, minlength=u.shape[0] * m).astype(alpha.dtype, copy=False)
        dlogit = alpha * (dalpha - s_grp[sc["seg"]])
        if cache["attention_type"] == "dot_product":
            dlogit = dlogit / np.sqrt(cache["qa"].shape[-1])
            np.add.at(dqa, (eb, ei), dlogit[:, None] * cache["ka"][eb, ej])
            np.add.at(dka, (eb, ej), dlogit[:, None] * cache["qa"][eb, ei])
        hs, pre = sc["hs"], sc["pre"]
        np.add.at(du, (eb, ej), dval * hs[-1])
        dk = dval * u[eb, ej]
        for i in reversed(range(n_k)):
            if i < n_k - 1:
                dk = dk * gelu_grad(pre[i])
            dk = linear_prefixed_vjp(grads, p, f"{_K}.{i}", dk, hs[i])
        if cache["transform_type"] == "nonlinear":
            kd = cache["es"].shape[-1]
            np.add.at(du, (eb, ej), dk[:, 2 * kd:])
    if cache["attention_type"] == "dot_product":
        linear_prefixed_vjp(grads, p, "agno.query_proj", dqa, cache["ed"])
        linear_prefixed_vjp(grads, p, "agno.key_proj", dka, cache["es"])
    grads["f"] = _conv1_vjp(grads, p, "lifting.fcs.0", du, f) if cache["role"] == "encoder" else du
    return grads


def magno(f, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`magno_forward`."""
    return magno_forward(f, params, **config)[0]


def init_magno_params(rng, in_channels: int, channels: int, coord_dim: int, *, role: str = "encoder",
                      out_channels=None, hidden: int = 64, mlp_layers: int = 3, geo_hidden: int = 64,
                      attention_type: str = "cosine", transform_type: str = "linear", use_geoembed: bool = True,
                      node_embedding: bool = False, n_scales: int = 1, use_scale_weights: bool = False,
                      attention_dim: int = 64, dtype=np.float64) -> dict:
    """Parameters as ``MAGNOEncoder``/``MAGNODecoder`` build them (PyTorch default initialisation):
    kernel MLP ``[2 kd (+ C)] + [hidden] * mlp_layers + [C]``; encoder lifting ``in_channels -> channels``;
    decoder projection ``channels (= in_channels) -> out_channels``."""
    check_choice(role, "role", _ROLES)
    kd = 8 * coord_dim if node_embedding else coord_dim

    def conv(prefix, c_in, c_out):
        lin = init_linear_prefixed(rng, c_in, c_out, prefix)
        return {f"{prefix}.weight": lin[f"{prefix}.weight"].T[:, :, None], f"{prefix}.bias": lin[f"{prefix}.bias"]}

    p = conv("lifting.fcs.0", in_channels, channels) if role == "encoder" else {}
    widths = [2 * kd + (channels if transform_type == "nonlinear" else 0)] + [hidden] * mlp_layers + [channels]
    for i in range(len(widths) - 1):
        p.update(init_linear_prefixed(rng, widths[i], widths[i + 1], f"{_K}.{i}"))
    if attention_type == "dot_product":
        p.update(init_linear_prefixed(rng, kd, attention_dim, "agno.query_proj"))
        p.update(init_linear_prefixed(rng, kd, attention_dim, "agno.key_proj"))
    if use_geoembed:
        p.update(init_linear_prefixed(rng, 3 + 2 * coord_dim, geo_hidden, "geoembed.mlp.0"))
        p.update(init_linear_prefixed(rng, geo_hidden, channels, "geoembed.mlp.2"))
        p.update(conv("recovery.fcs.0", 2 * channels, channels))
    if use_scale_weights:
        p.update(init_linear_prefixed(rng, coord_dim, max(hidden // 4, 1), "scale_weighting.0"))
        p.update(init_linear_prefixed(rng, max(hidden // 4, 1), n_scales, "scale_weighting.2"))
    if role == "decoder":
        p.update(conv("projection.fcs.0", channels, channels if out_channels is None else out_channels))
    return {k: np.asarray(v, dtype=dtype) for k, v in p.items()}


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size, *, role="encoder", attention_type="cosine", transform_type="linear", use_geoembed=True,
            node_embedding=False, use_scale_weights=False, shared=True):
    if size == "tiny":
        n, m, c_in, ch, hid, layers, gh = 5, 3, 2, 2, 3, 1, 3
    else:
        n, m, c_in, ch, hid, layers, gh = int(rng.integers(12, 20)), int(rng.integers(4, 7)), 3, 4, 6, 2, 5
    if role == "decoder":
        ch = c_in
    scales = (1.0, 1.6)
    p = init_magno_params(rng, c_in, ch, 2, role=role, out_channels=3, hidden=hid, mlp_layers=layers, geo_hidden=gh,
                          attention_type=attention_type, transform_type=transform_type, use_geoembed=use_geoembed,
                          node_embedding=node_embedding, n_scales=len(scales), use_scale_weights=use_scale_weights,
                          attention_dim=3)
    for k in p:
        if k.endswith("bias"):
            p[k] = 0.3 * rng.standard_normal(p[k].shape)
    src = rng.uniform(-1.0, 1.0, (n, 2) if shared else (2, n, 2))
    dst = rng.uniform(-0.8, 0.8, (m, 2) if shared else (2, m, 2))
    cfg = {"src_coord": src, "dst_coord": dst, "radius": 0.9, "scales": scales, "role": role,
           "attention_type": attention_type, "transform_type": transform_type, "use_geoembed": use_geoembed,
           "node_embedding": node_embedding, "use_scale_weights": use_scale_weights}
    return Sample(inputs={"f": rng.standard_normal((2, n, c_in))}, params=p, config=cfg)


def _dense_geometry(src, dst, mask):
    # The statistical features from the full (M, N) neighbourhood mask, masked sums.
    cnt = mask.sum(1)
    w = mask / np.maximum(cnt, 1)[:, None]
    diff = src[None] - dst[:, None]
    dist = np.linalg.norm(diff, axis=-1)
    mean_d = (w * dist).sum(1)
    var_d = np.maximum((w * dist ** 2).sum(1) - mean_d ** 2, 0.0)
    cen = w @ src
    cc = src[None] - cen[:, None]
    cov = np.einsum("mn,mnc,mne->mce", w, cc, cc)
    feats = np.concatenate([cnt[:, None], mean_d[:, None], var_d[:, None], cen - dst, np.linalg.eigvalsh(cov)[:, ::-1]],
                           axis=1)
    feats[cnt == 0] = 0.0
    sd = feats.std(0, ddof=1)
    sd[sd < 1e-6] = 1.0
    return (feats - feats.mean(0)) / sd


def _reference(f, params, *, src_coord, dst_coord, radius, scales=(1.0,), role="encoder", attention_type="cosine",
               transform_type="linear", use_geoembed=True, node_embedding=False, use_scale_weights=False):
    # Dense form: full distance matrices, masked softmax over all (target, source) pairs, the kernel
    # MLP on every pair.
    b = f.shape[0]
    src = np.broadcast_to(src_coord, (b,) + np.shape(src_coord)[-2:])
    dst = np.broadcast_to(dst_coord, (b,) + np.shape(dst_coord)[-2:])
    n_k = _n_layers(params, _K)

    def conv(prefix, x):
        return x @ params[f"{prefix}.weight"][:, :, 0].T + params[f"{prefix}.bias"]

    def lin(prefix, x):
        return x @ params[f"{prefix}.weight"] + params[f"{prefix}.bias"]

    outs = []
    for bb in range(b):
        u = conv("lifting.fcs.0", f[bb]) if role == "encoder" else f[bb]
        es, ed = (node_pos_encode(src[bb]), node_pos_encode(dst[bb])) if node_embedding else (src[bb], dst[bb])
        if attention_type == "cosine":
            a = (ed / np.linalg.norm(ed, axis=-1, keepdims=True)) @ (es / np.linalg.norm(es, axis=-1, keepdims=True)).T
        else:
            a = lin("agno.query_proj", ed) @ lin("agno.key_proj", es).T / np.sqrt(params["agno.query_proj.weight"].shape[1])
        m, n = a.shape
        pair = [np.broadcast_to(es[None], (m, n, es.shape[1])), np.broadcast_to(ed[:, None], (m, n, ed.shape[1]))]
        if transform_type == "nonlinear":
            pair.append(np.broadcast_to(u[None], (m, n, u.shape[1])))
        h = np.concatenate(pair, axis=-1)
        for i in range(n_k):
            h = lin(f"{_K}.{i}", h)
            if i < n_k - 1:
                h = gelu(h)
        encs = []
        for s in scales:
            mask = (np.linalg.norm(dst[bb][:, None] - src[bb][None], axis=-1) <= radius * s).astype(float)
            e = np.where(mask > 0, np.exp(a - a.max()), 0.0)
            att = e / np.maximum(e.sum(1, keepdims=True), 1e-300)
            w = np.einsum("mn,mnc->mc", att, h * u[None])
            if use_geoembed:
                gam = relu(lin("geoembed.mlp.2", relu(lin("geoembed.mlp.0", _dense_geometry(src[bb], dst[bb], mask)))))
                w = conv("recovery.fcs.0", np.concatenate([w, gam], axis=-1))
            encs.append(w)
        if use_scale_weights:
            lg = lin("scale_weighting.2", relu(lin("scale_weighting.0", dst[bb])))
            beta = np.exp(lg - lg.max(-1, keepdims=True))
            beta /= beta.sum(-1, keepdims=True)
            comb = sum(beta[:, k:k + 1] * e for k, e in enumerate(encs))
        else:
            comb = sum(encs) / len(encs)
        outs.append(conv("projection.fcs.0", comb) if role == "decoder" else comb)
    return np.stack(outs)


def _check_graph_matches_brute_force(rng):
    # The radius graph the layer builds (every scale) is the thresholded full distance matrix.
    s = _sample(rng, "small")
    _, cache = magno_forward(**s.inputs, params=s.params, **s.config)
    src, dst = s.config["src_coord"], s.config["dst_coord"]
    for sc_factor, (eb, ei, ej) in zip(s.config["scales"], cache["graphs"]):
        brute = np.argwhere(np.linalg.norm(dst[:, None] - src[None], axis=-1) <= s.config["radius"] * sc_factor)
        got = np.stack([ei[eb == 0], ej[eb == 0]], axis=1)
        assert np.array_equal(got, brute), "radius graph differs from the brute-force distance matrix"
    return 0.0


def _check_variants_reference(rng):
    # Decoder, dot-product attention, nonlinear kernel, node embedding, scale weights and per-batch
    # coordinates against the dense formula (their finite-difference checks: tests/test_operators_o3.py).
    errs = []
    for kw in ({"role": "decoder", "use_scale_weights": True}, {"attention_type": "dot_product", "shared": False},
               {"transform_type": "nonlinear", "node_embedding": True}, {"use_geoembed": False}):
        s = _sample(rng, "small", **kw)
        err = float(np.abs(magno(**s.inputs, params=s.params, **s.config)
                           - _reference(**s.inputs, params=s.params, **s.config)).max())
        assert err < 1e-11, f"{kw}: differs from the dense formula by {err:.2e}"
        errs.append(err)
    return max(errs)


def _check_duplication_invariance(rng):
    # Every source point duplicated: softmax weights halve per copy, counts double (standardised
    # away), distances/centroids/covariances are unchanged, so the output is unchanged.
    s = _sample(rng, "small")
    cfg = dict(s.config, src_coord=np.repeat(s.config["src_coord"], 2, axis=0))
    out2 = magno(np.repeat(s.inputs["f"], 2, axis=1), s.params, **cfg)
    err = float(np.abs(out2 - magno(**s.inputs, params=s.params, **s.config)).max())
    assert err < 1e-12, f"MAGNO changes when every source point is duplicated: {err:.2e}"
    return err


register(
    Mechanism(
        slug="gaot_magno", family="3-operator", tier="T3",
        title="GAOT: multiscale attentional graph neural operator (MAGNO) encoder/decoder with geometry embedding",
        paper="Wen, Kumbhat, Lingsch, Mousavi, Chandrashekar, Mishra, Geometry Aware Operator Transformer As An "
              "Efficient And Accurate Neural Surrogate For PDEs On Arbitrary Domains, arXiv 2505.18781",
        forward=magno_forward, backward=magno_backward, sample=_sample, reference=_reference,
        docs="operators/operator-attention-t3.md#gaot-magno",
        checks={"graph_matches_brute_force": _check_graph_matches_brute_force,
                "variants_match_dense_formula": _check_variants_reference,
                "point_duplication_invariance": _check_duplication_invariance},
    ),
)
