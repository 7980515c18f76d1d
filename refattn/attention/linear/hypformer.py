r"""Hypformer: linear focused attention in the Lorentz model of hyperbolic space (``TransConvLayer``).

Yang, Chen, Huang, Wang, Chen, Sun, Xiong, Mohri, Zhang, Lin, Tang, Ying, "Hypformer: Exploring
Efficient Transformer Fully in Hyperbolic Space", KDD 2024, arXiv 2407.01290. Upstream:
``Graph-and-Geometric-Learning/hyperbolic-transformer`` ``Hypformer/hypformer.py``
(``TransConvLayer.linear_focus_attention``, ``forward``) and ``Hypformer/manifolds/layer.py``
(``HypLinear``) @ ``768fcec099bcb039d0d838e3e4ebe83ef6bb7426``.

A point of the Lorentz model with curvature $-1/\kappa$ is $x = [x_t; x_s]\in\mathbb R^{1+C}$ with
$x_t = \sqrt{\|x_s\|^2 + \kappa}$ ($-x_t^2 + \|x_s\|^2 = -\kappa$). The paper's two building
blocks: **HTC** (hyperbolic transformation with curvatures, ``HypLinear``) applies a Euclidean
linear map to the whole vector and recomputes the time coordinate,
$\mathrm{HTC}(x) = \mathrm{lift}(xW + b)$, $\mathrm{lift}(s) = [\sqrt{\|s\|^2+\kappa};\ s]$; **HRC**
(readjustment and refinement with curvatures, ``HypLayerNorm``/``HypActivation``) applies a
Euclidean function to the space part and lifts again. The attention layer, per head $h$
(``Wq[h]``, ``Wk[h]``, ``Wv[h]`` are HTC layers; only their space parts enter the attention):

$$q^{(h)} = xW_q^{(h)} + b_q^{(h)},\quad k^{(h)} = sW_k^{(h)} + b_k^{(h)},\quad v^{(h)} = sW_v^{(h)} + b_v^{(h)},$$
$$\phi(u) = f_p\Big(\frac{\mathrm{ReLU}(u) + 10^{-6}}{|\gamma| + 10^{-6}}\Big),\qquad
f_p(r) = \frac{\|r\|}{\|r^{\circ p}\|}\,r^{\circ p}\quad(\text{the focusing map, } p = \texttt{power\_k}),$$
$$Z^{(h)} = \frac{\phi(Q^{(h)})\big(\phi(K^{(h)})^\top V^{(h)}\big)}{\phi(Q^{(h)})\,\phi(K^{(h)})^\top\mathbf 1 + 10^{-6}}
+ V^{(h)}W_{vm} + b_{vm},\qquad z = \frac1H\sum_hZ^{(h)},\qquad \mathrm{out} = \mathrm{lift}(z),$$

$\gamma$ = ``norm_scale`` and $W_{vm}$ = ``v_map_mlp`` (the rank-restoring term; it needs
``in_channels == out_channels`` as upstream). ``heads_concat=True`` replaces the head mean by
``final_linear`` on the concatenated heads (upstream ``trans_heads_concat``). Sums over keys run
over the sequence of each batch element (upstream has no batch axis: its $N$ nodes are one set).

Backward
--------
$d\,\mathrm{lift}$: $ds = g_s + g_t\,s/x_t$. The linear core of `refattn.attention.linear.core`
(eps $10^{-6}$) gives $d\phi(Q), d\phi(K), dV$. The focusing map, with $w = r^{\circ p}$,
$a = \|r\|$, $b = \|w\|$ and upstream gradient $g$:

$$dr = \Big(\frac ab g - \frac{a\,(g\cdot w)}{b^3}w\Big)\odot p\,r^{\circ(p-1)} + \frac{g\cdot w}{ab}\,r,$$

then $du = dr\odot[u > 0]/(|\gamma| + 10^{-6})$ and
$d\gamma = -\mathrm{sign}(\gamma)\sum dr\odot r/(|\gamma| + 10^{-6})$; finally the linear VJPs
(`refattn.nn.linear`). ReLU and $|\gamma|$ have kinks at 0; the sampler stays away from them.

Conventions
-----------
``curvature`` $\kappa$ (``manifold.k``, default 1.0); ``power_k`` (default 2.0); the
$10^{-6}$ constants are upstream's. The layer's ``scale``/``bias`` parameters are used only by
upstream's quadratic ``full_attention`` and are not part of this record; the block around the
layer (Lorentz-midpoint residual ``mid_point``, ``HypLayerNorm``) is upstream's ``TransConv``,
outside the attention mechanism. Parameter keys follow the upstream ``state_dict``
(``Wq.{h}.linear.weight`` stored ``(in, out)``); ``norm_scale`` has shape ``(1,)`` where
upstream stores a 0-d tensor.
"""

from __future__ import annotations

import numpy as np

from ..._checks import (
    as_dout,
    as_float,
    check_param_keys,
    check_positive,
    check_weight_in,
    compute_dtype,
    shape_message,
)
from ...nn.linear import linear_prefixed, linear_prefixed_vjp
from ...registry import Mechanism, Sample, register
from ._samples import fd_max_rel
from .core import linear_core_backward, linear_core_forward, mT

__all__ = [
    "lorentz_lift",
    "lorentz_lift_backward",
    "focus_map_forward",
    "focus_map_backward",
    "hypformer_attention_forward",
    "hypformer_attention_backward",
    "hypformer_attention",
]

_FLOOR = 1e-6


def lorentz_lift(s: np.ndarray, curvature: float) -> np.ndarray:
    r"""$[\sqrt{\|s\|^2 + \kappa};\ s]$: the Lorentz point with space part ``s (..., C)``."""
    t = np.sqrt(np.sum(s * s, axis=-1, keepdims=True) + curvature)
    return np.concatenate([t, s], axis=-1)


def lorentz_lift_backward(dout: np.ndarray, lifted: np.ndarray) -> np.ndarray:
    """VJP of :func:`lorentz_lift` (``lifted`` its output): $ds = g_s + g_t\\,s/x_t$."""
    return dout[..., 1:] + dout[..., :1] * lifted[..., 1:] / lifted[..., :1]


def focus_map_forward(r: np.ndarray, p: float):
    r"""The focusing map $f_p(r) = (\|r\|/\|r^{\circ p}\|)\,r^{\circ p}$ over the last axis (``r > 0``)."""
    w = r ** p
    a = np.sqrt(np.sum(r * r, axis=-1, keepdims=True))
    b = np.sqrt(np.sum(w * w, axis=-1, keepdims=True))
    return (a / b) * w, {"r": r, "w": w, "a": a, "b": b, "p": p}


def focus_map_backward(g: np.ndarray, c: dict) -> np.ndarray:
    """VJP of :func:`focus_map_forward` (formula in the module docstring)."""
    r, w, a, b, p = c["r"], c["w"], c["a"], c["b"], c["p"]
    gw = np.sum(g * w, axis=-1, keepdims=True)
    dw = (a / b) * g - (a * gw / b ** 3) * w
    return dw * p * r ** (p - 1) + (gw / (a * b)) * r


def _head_linear(params, name, x, H):
    """Stack of the H per-head linear layers ``name.{h}.linear``: ``x (..., N, C) -> (..., H, N, D)``."""
    return np.stack([linear_prefixed(params, f"{name}.{h}.linear", x) for h in range(H)], axis=-3)


def _head_linear_vjp(grads, params, name, dy, x, H):
    return sum(linear_prefixed_vjp(grads, params, f"{name}.{h}.linear", dy[..., h, :, :], x) for h in range(H))


def _validate(x, source, params, num_heads, curvature, power_k, heads_concat):
    x = as_float(x, "x", min_ndim=2)
    src = x if source is None else as_float(source, "source", min_ndim=2)
    if src.shape != x.shape:
        raise ValueError(f"source must have x's shape {x.shape} (the v_map_mlp term adds V per query position, "
                         f"as upstream); got {src.shape}")
    if x.shape[-1] < 2:
        raise ValueError(f"x must be Lorentz points [time; space] with at least 2 entries on the last axis; got {x.shape}")
    if isinstance(num_heads, (bool, np.bool_)) or not isinstance(num_heads, (int, np.integer)) or num_heads < 1:
        raise ValueError(f"num_heads must be a positive int; got {num_heads!r}")
    curvature = check_positive(curvature, "curvature")
    power_k = check_positive(power_k, "power_k")
    if not isinstance(heads_concat, (bool, np.bool_)):
        raise TypeError(f"heads_concat must be a bool; got {type(heads_concat).__name__}")
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of arrays; got {type(params).__name__}")
    c_in = x.shape[-1] - 1
    w0 = params.get("Wq.0.linear.weight")
    if w0 is None:
        raise ValueError("params is missing key 'Wq.0.linear.weight' ((C+1, D): the first query head)")
    if np.ndim(w0) == 2:  # D is read off its output axis
        check_weight_in(params, "Wq.0.linear.weight", c_in + 1, input_name="x (C+1 Lorentz coordinates)")
    d = as_float(w0, "Wq.0.linear.weight", ndim=2).shape[1]
    if d != c_in:
        raise ValueError(f"Wq.0.linear.weight must map C+1={c_in + 1} to D=C={c_in} (v_map_mlp needs in == out); "
                         f"got {np.shape(w0)}")
    spec = {}
    for name in ("Wq", "Wk", "Wv"):
        for h in range(num_heads):
            spec[f"{name}.{h}.linear.weight"] = (c_in + 1, d)
            spec[f"{name}.{h}.linear.bias"] = (d,)
    spec.update({"norm_scale": (1,), "v_map_mlp.weight": (c_in, d), "v_map_mlp.bias": (d,)})
    if heads_concat:
        spec.update({"final_linear.weight": (num_heads * d, d), "final_linear.bias": (d,)})
    check_param_keys(params, tuple(spec), where="hypformer_attention", shapes=spec)
    P = {}
    for key, shape in spec.items():
        arr = as_float(params[key], key)
        if arr.shape != shape:
            raise ValueError(shape_message(key, arr.shape, shape))
        P[key] = arr
    dt = compute_dtype(x, src, *P.values())
    return x.astype(dt, copy=False), src.astype(dt, copy=False), {k: v.astype(dt, copy=False) for k, v in P.items()}, \
        curvature, power_k


def hypformer_attention_forward(x, source=None, params=None, *, num_heads: int = 1, curvature: float = 1.0,
                                power_k: float = 2.0, heads_concat: bool = False):
    r"""Hypformer linear focused attention in the Lorentz model (Yang et al., KDD 2024, arXiv 2407.01290).

    Parameters
    ----------
    x : (..., N, 1 + C)
        Query points on the Lorentz manifold ([time; space]).
    source : (..., N, 1 + C), optional
        Key/value points (default ``x``: self-attention, upstream ``conv(x, x)``); the same
        number of points as ``x`` (the ``v_map_mlp`` term adds $V$ per position).
    params : dict
        ``Wq.{h}.linear.weight`` ``(1+C, D)`` / ``.bias`` ``(D,)`` for ``Wq``, ``Wk``, ``Wv`` and
        every head, ``norm_scale`` ``(1,)``, ``v_map_mlp.weight`` ``(C, D)`` / ``.bias``
        (``D = C``), and ``final_linear.weight`` ``(H*D, D)`` / ``.bias`` with ``heads_concat``.
    num_heads, curvature, power_k, heads_concat
        Module docstring.

    Returns
    -------
    out : (..., N, 1 + D)
        Lorentz points, $-\mathrm{out}_t^2 + \|\mathrm{out}_s\|^2 = -\kappa$.
    """
    x, src, P, kappa, p = _validate(x, source, params, num_heads, curvature, power_k, heads_concat)
    H = num_heads
    qs, ks, vs = _head_linear(P, "Wq", x, H), _head_linear(P, "Wk", src, H), _head_linear(P, "Wv", src, H)
    den_s = np.abs(P["norm_scale"][0]) + _FLOOR
    rq, rk = (np.maximum(qs, 0) + _FLOOR) / den_s, (np.maximum(ks, 0) + _FLOOR) / den_s
    fq, cq = focus_map_forward(rq, p)
    fk, ck = focus_map_forward(rk, p)
    att, state = linear_core_forward(fq, fk, vs, causal=False, eps=_FLOOR, normalise=True)
    Z = att + linear_prefixed(P, "v_map_mlp", vs)
    if heads_concat:
        zc = np.swapaxes(Z, -3, -2).reshape(Z.shape[:-3] + (Z.shape[-2], H * Z.shape[-1]))
        z = linear_prefixed(P, "final_linear", zc)
    else:
        zc, z = None, Z.mean(axis=-3)
    out = lorentz_lift(z, kappa)
    cache = {"x": x, "src": src, "P": P, "H": H, "qs": qs, "ks": ks, "vs": vs, "den_s": den_s, "rq": rq, "rk": rk,
             "fq": fq, "fk": fk, "cq": cq, "ck": ck, "att": att, "state": state, "zc": zc, "out": out,
             "self": source is None, "concat": bool(heads_concat)}
    return out.copy(), cache


def hypformer_attention_backward(dout, cache):
    r"""Gradients ``{"x"[, "source"]}`` and every parameter of :func:`hypformer_attention_forward`
    (the chain of the module docstring)."""
    out = cache["out"]
    g = as_dout(dout, out.shape, out.dtype)
    P, H = cache["P"], cache["H"]
    grads = {}
    dz = lorentz_lift_backward(g, out)
    if cache["concat"]:
        dzc = linear_prefixed_vjp(grads, P, "final_linear", dz, cache["zc"])
        dZ = np.swapaxes(dzc.reshape(dzc.shape[:-1] + (H, -1)), -3, -2)
    else:
        dZ = np.broadcast_to(dz[..., None, :, :] / H, cache["att"].shape)
    dvs = linear_prefixed_vjp(grads, P, "v_map_mlp", dZ, cache["vs"])
    dfq, dfk, dv_att = linear_core_backward(dZ, cache["fq"], cache["fk"], cache["vs"], cache["att"], cache["state"],
                                            causal=False, normalise=True)
    dvs = dvs + dv_att
    drq, drk = focus_map_backward(dfq, cache["cq"]), focus_map_backward(dfk, cache["ck"])
    den_s, s = cache["den_s"], P["norm_scale"][0]
    grads["norm_scale"] = np.array([-np.sign(s) * (np.sum(drq * cache["rq"]) + np.sum(drk * cache["rk"])) / den_s],
                                   dtype=out.dtype)
    dqs = drq * (cache["qs"] > 0) / den_s
    dks = drk * (cache["ks"] > 0) / den_s
    dx = _head_linear_vjp(grads, P, "Wq", dqs, cache["x"], H)
    dsrc = _head_linear_vjp(grads, P, "Wk", dks, cache["src"], H) + _head_linear_vjp(grads, P, "Wv", dvs, cache["src"], H)
    if cache["self"]:
        grads["x"] = dx + dsrc
    else:
        grads["x"], grads["source"] = dx, dsrc
    return grads


def hypformer_attention(x, source=None, params=None, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`hypformer_attention_forward`."""
    return hypformer_attention_forward(x, source, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _reference(x, source=None, params=None, *, num_heads=1, curvature=1.0, power_k=2.0, heads_concat=False):
    """Explicit O(N^2) form: A = phi(Q) phi(K)^T per head, Z = AV / (A1 + 1e-6) + v_map(V)."""
    src = x if source is None else source
    outs = []
    for h in range(num_heads):
        qs = x @ params[f"Wq.{h}.linear.weight"] + params[f"Wq.{h}.linear.bias"]
        ks = src @ params[f"Wk.{h}.linear.weight"] + params[f"Wk.{h}.linear.bias"]
        vs = src @ params[f"Wv.{h}.linear.weight"] + params[f"Wv.{h}.linear.bias"]
        sc = abs(params["norm_scale"][0]) + 1e-6
        fq, _ = focus_map_forward((np.maximum(qs, 0) + 1e-6) / sc, power_k)
        fk, _ = focus_map_forward((np.maximum(ks, 0) + 1e-6) / sc, power_k)
        A = fq @ mT(fk)
        outs.append(A @ vs / (A.sum(-1, keepdims=True) + 1e-6) + vs @ params["v_map_mlp.weight"]
                    + params["v_map_mlp.bias"])
    z = (np.concatenate(outs, -1) @ params["final_linear.weight"] + params["final_linear.bias"]) if heads_concat \
        else sum(outs) / num_heads
    return lorentz_lift(z, curvature)


def _hyp_params(rng, H, C, concat=False):
    params = {}
    for name in ("Wq", "Wk", "Wv"):
        for h in range(H):
            params[f"{name}.{h}.linear.weight"] = rng.standard_normal((C + 1, C)) * 0.6
            params[f"{name}.{h}.linear.bias"] = 0.3 + 0.2 * rng.standard_normal(C)
    params.update({"norm_scale": np.array([rng.choice([-1.0, 1.0]) * rng.uniform(0.5, 1.5)]),
                   "v_map_mlp.weight": rng.standard_normal((C, C)) / np.sqrt(C),
                   "v_map_mlp.bias": 0.1 * rng.standard_normal(C)})
    if concat:
        params["final_linear.weight"] = rng.standard_normal((H * C, C)) / np.sqrt(H * C)
        params["final_linear.bias"] = 0.1 * rng.standard_normal(C)
    return params


def _points(rng, shape, kappa):
    return lorentz_lift(rng.standard_normal(shape), kappa)


def _sample(rng, size):
    C, H = (3, 2) if size == "tiny" else (4, 3)
    n = int(rng.integers(3, 6)) if size == "tiny" else int(rng.integers(8, 14))
    kappa = float(rng.uniform(0.5, 2.0))
    concat = bool(rng.integers(0, 2))
    x = _points(rng, (2, n, C), kappa)
    return Sample(inputs={"x": x}, params=_hyp_params(rng, H, C, concat),
                  config={"num_heads": H, "curvature": kappa, "power_k": float(rng.choice([2.0, 3.0])),
                          "heads_concat": concat})


def _check_on_manifold(rng):
    """The output lies on the hyperboloid: -t^2 + |z|^2 = -kappa to round-off."""
    s = _sample(rng, "small")
    out = hypformer_attention(**s.inputs, params=s.params, **s.config)
    err = float(np.max(np.abs(-out[..., 0] ** 2 + np.sum(out[..., 1:] ** 2, -1) + s.config["curvature"])))
    assert err < 1e-10, err
    return err


def _check_cross_attention_fd(rng):
    """Cross-attention (source != x) and the focusing map alone, by finite differences."""
    x, src = _points(rng, (1, 3, 3), 1.3), _points(rng, (1, 3, 3), 1.3)
    s2 = Sample(inputs={"x": x, "source": src}, params=_hyp_params(rng, 1, 3),
                config={"num_heads": 1, "curvature": 1.3, "power_k": 2.5})
    err = fd_max_rel(hypformer_attention_forward, hypformer_attention_backward, s2)
    r = rng.uniform(0.2, 2.0, (3, 4))
    gg = rng.standard_normal((3, 4))
    f, c = focus_map_forward(r, 2.5)
    num = np.zeros_like(r)
    for idx in np.ndindex(r.shape):
        e = np.zeros_like(r)
        e[idx] = 1e-6
        num[idx] = (np.sum(gg * focus_map_forward(r + e, 2.5)[0]) - np.sum(gg * focus_map_forward(r - e, 2.5)[0])) / 2e-6
    err2 = float(np.max(np.abs(num - focus_map_backward(gg, c))) / np.max(np.abs(num)))
    assert err2 < 1e-7, err2
    return max(err, err2)


register(
    Mechanism(
        slug="hypformer_lorentz_linear_attention", family="4-linear-kernel-sparse", tier="T2",
        title="Hypformer: linear focused attention in the Lorentz model (HTC heads, focusing map, lifted output)",
        paper="Yang, Chen, Huang, Wang, Chen, Sun, Xiong, Mohri, Zhang, Lin, Tang, Ying, 'Hypformer: Exploring "
              "Efficient Transformer Fully in Hyperbolic Space', KDD 2024, arXiv 2407.01290",
        forward=hypformer_attention_forward, backward=hypformer_attention_backward, sample=_sample,
        reference=_reference,
        checks={"output_on_the_hyperboloid": _check_on_manifold,
                "gradcheck_cross_attention_and_focus_map": _check_cross_attention_fd},
        docs="linear/kernel-features.md#hypformer",
    ),
)
