r"""TNO: a topological neural operator layer on a 2-complex (fixed DEC routes, learned transforms).

Paper: Bastian, Leventhal, Hajij, Birdal, "Topological Neural Operators", arXiv 2606.09806 (2026);
project page circle-group.github.io/research/TNO. No code is public (the project page lists it as
"coming soon"; searched GitHub and the code index for it).

Which part of the model, and what is reconstruction
---------------------------------------------------
A TNO stacks layers that exchange features between the cells of a cell complex (vertices, edges,
faces) along fixed Discrete-Exterior-Calculus operators and transform them with learned maps; the
hierarchical variant (HTNO) adds learned coarse complexes. This module is one TNO layer on a
2-complex. **The whole layer is reconstruction**: the sources we could read (the abstract, the
paper's opening section and secondary summaries) state the design principle (where information
flows is fixed: gradient/curl routes by the coboundary $d$, divergence routes by the codifferential
$\delta = \star^{-1}d^\top\star$; how it is transformed is learned) but not the block equations,
normalisations or nonlinearity, so the layer below is the simplest reading of that principle (the
catalogue's [recon] formula), with those choices as keywords. HTNO's coarse complexes are not
implemented.

Forward
-------
Cochains $h_0\in\mathbb R^{n_0\times c}$ (vertices), $h_1\in\mathbb R^{n_1\times c}$ (edges),
$h_2\in\mathbb R^{n_2\times c}$ (faces); signed incidence (coboundary) matrices
$d_0\in\{0,\pm1\}^{n_1\times n_0}$, $d_1\in\{0,\pm1\}^{n_2\times n_1}$ with $d_1d_0 = 0$; positive
diagonal Hodge stars $\star_k = \mathrm{diag}(s_k)$ (default 1: the combinatorial case);
codifferentials $\delta_{k+1} = \star_k^{-1}d_k^\top\star_{k+1}$. For each rank $k$:

$$h_k' = \sigma\Big(h_kS_k + b_k + \underbrace{d_{k-1}h_{k-1}U_k}_{\text{gradient / curl route}}
+ \underbrace{\delta_{k+1}h_{k+1}D_k}_{\text{divergence route}}\Big),$$

with the routes that exist ($U_0$ and $D_2$ do not). The output is the three new cochains stacked
along the cell axis, $(B, n_0+n_1+n_2, c')$.

Backward
--------
With $\bar z_k = \bar h_k'\odot\sigma'(z_k)$: $\bar S_k = h_k^\top\bar z_k$, $\bar b_k = \sum\bar z_k$,
$\bar h_k \mathrel{+}= \bar z_kS_k^\top$; gradient route $a = d_{k-1}h_{k-1}$:
$\bar U_k = a^\top\bar z_k$, $\bar h_{k-1} \mathrel{+}= d_{k-1}^\top\bar z_kU_k^\top$; divergence route
$a = \delta_{k+1}h_{k+1}$: $\bar D_k = a^\top\bar z_k$,
$\bar h_{k+1} \mathrel{+}= \delta_{k+1}^\top\bar z_kD_k^\top = \star_{k+1}d_k\star_k^{-1}\bar z_kD_k^\top$
(batch sums for the parameters). The complex ($d_k$, $\star_k$) is fixed: no gradient.

Exactness inherited from the routes: $d_1d_0 = 0$, so with only gradient routes and a linear
$\sigma$ a vertex signal never reaches the faces in two layers (check ``curl_of_gradient_vanishes``).

Parameters: ``self.{k}.weight`` (c, c'), ``self.{k}.bias`` (c',), ``up.{k}.weight`` (k = 1, 2),
``down.{k}.weight`` (k = 0, 1); no upstream names exist.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_choice, check_params, compute_dtype
from ..nn.activations import gelu, gelu_grad
from ..nn.linear import init_linear_prefixed
from ..registry import Mechanism, Sample, register

__all__ = ["tno_layer_forward", "tno_layer_backward", "tno_layer", "tno_init_params", "tno_split"]

_ACT = {"gelu": (gelu, gelu_grad), "tanh": (np.tanh, lambda x: 1.0 - np.tanh(x) ** 2),
        "identity": (lambda x: x, np.ones_like)}


def _incidence(a, name, shape):
    a = np.asarray(a)
    if a.shape != shape or not np.issubdtype(a.dtype, np.number) or np.iscomplexobj(a):
        raise ValueError(f"{name} must be a real matrix of shape {shape}; got {a.dtype} {a.shape}")
    return a.astype(np.float64)


def tno_layer_forward(h0, h1, h2, params, *, d0, d1, stars=None, activation: str = "gelu"):
    r"""One TNO layer on a 2-complex (module docstring; reconstruction).

    Parameters
    ----------
    h0, h1, h2 : arrays (B, n_0, c), (B, n_1, c), (B, n_2, c)
        Vertex, edge and face cochains.
    params : dict
        ``self.{0,1,2}.weight`` (c, c'), ``self.{0,1,2}.bias`` (c',), ``up.{1,2}.weight`` (c, c'),
        ``down.{0,1}.weight`` (c, c').
    d0, d1 : arrays (n_1, n_0), (n_2, n_1)
        Signed incidence (coboundary) matrices; $d_1d_0 = 0$ is required.
    stars : tuple of three positive arrays (n_0,), (n_1,), (n_2,), optional
        Diagonal Hodge stars (default ones).
    activation : {"gelu", "tanh", "identity"}

    Returns
    -------
    out (B, n_0 + n_1 + n_2, c'), cache
    """
    hs = [as_float(h, f"h{k}", ndim=3) for k, h in enumerate((h0, h1, h2))]
    b, c = hs[0].shape[0], hs[0].shape[2]
    for k, h in enumerate(hs):
        if h.shape[0] != b or h.shape[2] != c:
            raise ValueError(f"h{k} must have shape (B={b}, n_{k}, c={c}) like h0; got {h.shape}")
    n = [h.shape[1] for h in hs]
    check_choice(activation, "activation", tuple(_ACT))
    ds = [_incidence(d0, "d0", (n[1], n[0])), _incidence(d1, "d1", (n[2], n[1]))]
    if np.abs(ds[1] @ ds[0]).max(initial=0.0) > 1e-12:
        raise ValueError("d1 @ d0 must vanish (the boundary of a boundary); got a nonzero product")
    if stars is None:
        stars = [np.ones(m) for m in n]
    if len(stars) != 3:
        raise ValueError(f"stars must hold three diagonals (vertices, edges, faces); got {len(stars)}")
    st = []
    for k, s in enumerate(stars):
        s = as_float(s, f"stars[{k}]", ndim=1)
        if s.shape != (n[k],) or not np.all(s > 0):
            raise ValueError(f"stars[{k}] must be positive of shape ({n[k]},); got {s.shape}")
        st.append(s)
    w = params.get("self.0.weight") if isinstance(params, dict) else None
    if w is None or np.ndim(w) != 2:
        raise ValueError("params must contain 'self.0.weight' of shape (c, c')")
    co = np.shape(w)[1]
    spec = {}
    for k in range(3):
        spec[f"self.{k}.weight"], spec[f"self.{k}.bias"] = (c, co), (co,)
    spec.update({"up.1.weight": (c, co), "up.2.weight": (c, co), "down.0.weight": (c, co), "down.1.weight": (c, co)})
    p = check_params(params, spec)
    dt = compute_dtype(*hs, *p.values())
    hs, p = [h.astype(dt, copy=False) for h in hs], cast_all(dt, p)
    ds, st = [d.astype(dt) for d in ds], [s.astype(dt) for s in st]
    act = _ACT[activation][0]
    routes, zs = [], []
    for k in range(3):
        z = hs[k] @ p[f"self.{k}.weight"] + p[f"self.{k}.bias"]
        r = {}
        if k > 0:
            r["up"] = np.einsum("ij,bjc->bic", ds[k - 1], hs[k - 1])
            z = z + r["up"] @ p[f"up.{k}.weight"]
        if k < 2:
            r["down"] = np.einsum("ji,bjc->bic", ds[k], hs[k + 1] * st[k + 1][:, None]) / st[k][:, None]
            z = z + r["down"] @ p[f"down.{k}.weight"]
        routes.append(r)
        zs.append(z)
    out = np.concatenate([act(z) for z in zs], axis=1)
    cache = {"hs": hs, "p": p, "ds": ds, "st": st, "routes": routes, "zs": zs, "act": activation,
             "n": n, "dt": dt, "out_shape": out.shape}
    return out, cache


def tno_layer_backward(dout, cache):
    """Gradients of :func:`tno_layer_forward`: ``h0``, ``h1``, ``h2`` and every params key."""
    p, dt, n, ds, st, hs = cache["p"], cache["dt"], cache["n"], cache["ds"], cache["st"], cache["hs"]
    g = as_dout(dout, cache["out_shape"], dt)
    grad = _ACT[cache["act"]][1]
    gs = np.split(g, np.cumsum(n)[:-1], axis=1)
    dh = [np.zeros_like(h) for h in hs]
    grads = {}
    for k in range(3):
        dz = gs[k] * grad(cache["zs"][k])
        grads[f"self.{k}.weight"] = np.einsum("bic,bio->co", hs[k], dz)
        grads[f"self.{k}.bias"] = dz.sum(axis=(0, 1))
        dh[k] += dz @ p[f"self.{k}.weight"].T
        r = cache["routes"][k]
        if k > 0:
            grads[f"up.{k}.weight"] = np.einsum("bic,bio->co", r["up"], dz)
            dh[k - 1] += np.einsum("ij,bic->bjc", ds[k - 1], dz @ p[f"up.{k}.weight"].T)
        if k < 2:
            grads[f"down.{k}.weight"] = np.einsum("bic,bio->co", r["down"], dz)
            da = (dz @ p[f"down.{k}.weight"].T) / st[k][:, None]
            dh[k + 1] += np.einsum("ji,bic->bjc", ds[k], da) * st[k + 1][:, None]
    grads.update(h0=dh[0], h1=dh[1], h2=dh[2])
    return grads


def tno_layer(h0, h1, h2, params, **config):
    """Convenience wrapper: the output of :func:`tno_layer_forward`."""
    return tno_layer_forward(h0, h1, h2, params, **config)[0]


def tno_split(out, n_vertices: int, n_edges: int):
    """Split the stacked output into the (vertex, edge, face) cochains."""
    return out[:, :n_vertices], out[:, n_vertices:n_vertices + n_edges], out[:, n_vertices + n_edges:]


def tno_init_params(rng, channels: int, out_channels: int, dtype=np.float64) -> dict:
    """PyTorch-default linears for every route (self maps with bias, routes without)."""
    p = {}
    for k in range(3):
        p.update(init_linear_prefixed(rng, channels, out_channels, f"self.{k}"))
    for key in ("up.1", "up.2", "down.0", "down.1"):
        p.update(init_linear_prefixed(rng, channels, out_channels, key, bias=False))
    return {k: np.asarray(v, dtype=dtype) for k, v in p.items()}


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _square_complex():
    # Unit square split into two triangles: vertices 0..3, edges (0,1),(1,2),(2,3),(3,0),(0,2),
    # faces (0,1,2) and (0,2,3), edges oriented low -> high index, faces counter-clockwise.
    edges = [(0, 1), (1, 2), (2, 3), (0, 3), (0, 2)]
    d0 = np.zeros((5, 4))
    for e, (a, b_) in enumerate(edges):
        d0[e, a], d0[e, b_] = -1.0, 1.0
    d1 = np.zeros((2, 5))
    d1[0, [0, 1, 4]] = [1.0, 1.0, -1.0]     # 0->1, 1->2, then 2->0 = -(0->2)
    d1[1, [4, 2, 3]] = [1.0, 1.0, -1.0]     # 0->2, 2->3, then 3->0 = -(0->3)
    return d0, d1


def _sample(rng, size, activation="gelu"):
    d0, d1 = _square_complex()
    c, co = (2, 2) if size == "tiny" else (3, 4)
    p = tno_init_params(rng, c, co)
    p = {k: v + 0.3 * rng.standard_normal(v.shape) for k, v in p.items()}
    stars = (0.5 + rng.random(4), 0.5 + rng.random(5), 0.5 + rng.random(2))
    return Sample(inputs={"h0": rng.standard_normal((2, 4, c)), "h1": rng.standard_normal((2, 5, c)),
                          "h2": rng.standard_normal((2, 2, c))},
                  params=p, config={"d0": d0, "d1": d1, "stars": stars, "activation": activation})


def _reference(h0, h1, h2, params, *, d0, d1, stars=None, activation="gelu"):
    # One dense block operator on the stacked cochains: [[S0, d0^T-codiff, 0], [d0, S1, codiff], [0, d1, S2]].
    n = [h0.shape[1], h1.shape[1], h2.shape[1]]
    st = stars if stars is not None else [np.ones(m) for m in n]
    off = np.concatenate([[0], np.cumsum(n)])
    tot = off[-1]
    h = np.concatenate([h0, h1, h2], axis=1)
    z = np.zeros(h.shape[:2] + (params["self.0.weight"].shape[1],))
    ds = [d0, d1]
    for k in range(3):
        z[:, off[k]:off[k + 1]] += h[:, off[k]:off[k + 1]] @ params[f"self.{k}.weight"] + params[f"self.{k}.bias"]
        for j, key in ((k - 1, "up"), (k + 1, "down")):
            if not 0 <= j <= 2:
                continue
            m = np.zeros((n[k], tot))
            op = ds[k - 1] if key == "up" else np.diag(1 / st[k]) @ ds[k].T @ np.diag(st[k + 1])
            m[:, off[j]:off[j + 1]] = op
            z[:, off[k]:off[k + 1]] += np.einsum("it,btc->bic", m, h) @ params[f"{key}.{k}.weight"]
    return _ACT[activation][0](z)


def _check_curl_of_gradient_vanishes(rng):
    # d1 d0 = 0: with only gradient routes and a linear activation, two layers never carry a
    # vertex signal onto the faces.
    s = _sample(rng, "small", activation="identity")
    p = {k: (v if k.startswith("up") else np.zeros_like(v)) for k, v in s.params.items()}
    p2 = tno_init_params(rng, 4, 4)
    p2 = {k: (v if k.startswith("up") else np.zeros_like(v)) for k, v in p2.items()}
    cfg = dict(s.config)
    out1 = tno_layer(**s.inputs, params=p, **cfg)
    v, e, f = tno_split(out1, 4, 5)
    out2 = tno_layer(v, e, np.zeros_like(f), p2, **cfg)
    faces = tno_split(out2, 4, 5)[2]
    # faces after two layers = d1 (d0 h0 U1) U2 = 0
    err = float(np.abs(faces).max())
    assert err < 1e-12, f"a vertex signal reached the faces through two gradient routes: {err}"
    return err


def _check_activation_variants_fd(rng):
    from ..testing.gradcheck import gradcheck
    worst = 0.0
    for act in ("tanh", "identity"):
        s = _sample(rng, "tiny", activation=act)
        worst = max(worst, gradcheck(tno_layer_forward, tno_layer_backward, s).max_rel)
    return worst


def _check_orientation_equivariance(rng):
    # Flipping the orientation of an edge (a sign on its row of d0 and column of d1) and the sign
    # of its feature flips the sign of its output when the activation is odd and biases are 0.
    s = _sample(rng, "small", activation="tanh")
    p = dict(s.params)
    for k in range(3):
        p[f"self.{k}.bias"] = np.zeros_like(p[f"self.{k}.bias"])
    flip = np.ones(5)
    flip[2] = -1.0
    d0, d1 = s.config["d0"], s.config["d1"]
    out = tno_layer(**s.inputs, params=p, **s.config)
    h1 = s.inputs["h1"] * flip[:, None]
    out_f = tno_layer(s.inputs["h0"], h1, s.inputs["h2"], p, **dict(s.config, d0=d0 * flip[:, None], d1=d1 * flip))
    e, ef = tno_split(out, 4, 5)[1], tno_split(out_f, 4, 5)[1]
    err = float(np.abs(ef - e * flip[:, None]).max())
    v, vf = tno_split(out, 4, 5)[0], tno_split(out_f, 4, 5)[0]
    err = max(err, float(np.abs(vf - v).max()))
    assert err < 1e-12, f"not equivariant under an edge re-orientation: {err}"
    return err


register(
    Mechanism(
        slug="tno_topological_neural_operator", family="3-operator", tier="T3",
        title="TNO layer on a 2-complex: fixed coboundary/codifferential routes, learned transforms (reconstruction)",
        paper="Bastian, Leventhal, Hajij, Birdal, Topological Neural Operators, arXiv 2606.09806 (2026)",
        forward=tno_layer_forward, backward=tno_layer_backward, sample=_sample, reference=_reference,
        docs="operators/o5c.md#tno-topological-neural-operator-layer-reconstruction",
        checks={"curl_of_gradient_vanishes": _check_curl_of_gradient_vanishes,
                "activation_variants_gradcheck": _check_activation_variants_fd,
                "edge_orientation_equivariance": _check_orientation_equivariance},
    ),
)
