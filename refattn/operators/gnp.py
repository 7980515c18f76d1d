r"""Geometric Neural Operator (GNP): block-factorised kernel integral on a point-cloud radius graph.

Paper: Quackenbush & Atzberger, "Geometric Neural Operators (GNPs) for Data-Driven Deep Learning in
Non-Euclidean Settings", Machine Learning: Science and Technology 5(4) 045033 (2024), arXiv 2404.10843
(the released ``BlockGNP`` backbone is that of their follow-up, arXiv 2503.04649). Upstream: atzberg/geo_neural_op @
64735617c3fb421fb7b7edec8daf6b6ce36f6471 ``gnp/models/layers.py`` (``BlockKernel``,
``BlockConv``), ``gnp/models/gnp.py`` (``BlockGNP``) and ``gnp/dataset/patch.py``
(``graph_from_dict``: the radius graph and the edge features).

Which part of the model
-----------------------
``BlockGNP`` is the operator backbone of every GNP in the paper (metric and curvature estimation
on point-cloud patches, Laplace-Beltrami solution maps); ``PatchGNP`` puts a masked mean pool and
an MLP head on it for the patch-level geometry estimates. This module is ``BlockGNP.forward``:
lifting, the kernel-integral layers, projection.

Forward
-------
Nodes $i\le n$ with features $x_i\in\mathbb R^{c_0}$ and edge data $p_i\in\mathbb R^{q}$ (upstream
default $p = x$, the point coordinates), directed edges $e = (s_e \to t_e)$ of a radius graph
(``graph_from_dict``: every pair with $\lVert x_s - x_t\rVert\le r$, self-loops included), edge
features $a_e = [p_{s_e}\,\|\,p_{t_e}]$. Layer $\ell$ maps width $d$ to $d'$ with $C$ =
``num_channels`` blocks of sizes $h = d/C$, $h' = d'/C$:

$$K_e = \mathrm{reshape}_{C\times h\times h'}\big(\sigma(a_eA_1 + \alpha_1)A_2 + \alpha_2\big),\qquad
m_{e,c} = v_{s_e,c}^\top K_{e,c}\in\mathbb R^{h'},$$

$$z_t = \frac{1}{|\{e: t_e = t\}|}\sum_{e:\,t_e = t} m_e\quad(0\text{ without incoming edges}),\qquad
v \leftarrow vW_\ell + b_\ell + z\,M_\ell + \beta_\ell,$$

with $\sigma$ between layers (not after the last), $v_0 = xW_{lift} + b_{lift}$ and the output
$vW_{proj} + b_{proj}$. $W_\ell$ is the identity when $d = d'$ (upstream ``nn.Identity``). The
mean over the neighbours is the Monte-Carlo quadrature of
$\frac{1}{|B_r(x_t)|}\int_{B_r(x_t)}K(p(y), p(x_t))^\top v(y)\,dy$ on the point cloud: a
block-diagonal (``num_channels`` blocks) matrix-valued kernel, where GNO's is diagonal.

Backward
--------
The graph is a selection held fixed. With $\bar z_t$ the output gradient of the aggregation,
$\bar m_e = \bar z_{t_e}/\deg(t_e)$; $\bar v_{s_e,c} \mathrel{+}= K_{e,c}\bar m_{e,c}$ and
$\bar K_{e,c} = v_{s_e,c}\bar m_{e,c}^\top$; the kernel MLP's VJP gives $\bar a_e$, whose halves
scatter-add onto $\bar p_{s_e}$ and $\bar p_{t_e}$. The linear maps, the residual sum and the
activation add their usual terms.

Conventions made explicit
-------------------------
* Edge orientation: ``graph_from_dict`` stacks ``(rows = centre, cols = neighbour)`` and PyTorch
  Geometric reads ``edge_index[0]`` as the source, ``edge_index[1]`` as the target (``aggr='mean'``):
  messages flow from the centre to its neighbours. With a symmetric radius graph this is the same
  as gathering from the neighbours. ``edge_index`` here is that ``(2, E)`` array (source row 0).
* ``max_num_neighbors``: upstream subsamples each neighbourhood at random to 32 points; that random
  selection is not part of the layer — pass the subsampled ``edge_index`` (held fixed).
* ``nonlinearity``: any of ``"ReLU"`` (upstream's pretrained models), ``"GELU"``, ``"Tanh"``,
  ``"SiLU"`` (upstream takes any ``torch.nn`` name).

Measured agreement with the upstream module (float64, CPU, torch_geometric 2.8.1; docs page):
output <= 3.4e-16 absolute, every gradient (node features, edge data, all parameters)
<= 3.2e-15 absolute and <= 1.1e-15 relative, for ReLU, GELU and Tanh on 40-point radius graphs.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_choice, check_int, check_params, check_positive, compute_dtype
from ..nn.activations import gelu, gelu_grad, relu, relu_grad, silu, silu_grad
from ..nn.linear import init_linear_prefixed, linear_prefixed, linear_prefixed_vjp
from ..registry import Mechanism, Sample, register
from .gno_kernel_integral import radius_neighbors

__all__ = ["gnp_radius_graph", "gnp_forward", "gnp_backward", "gnp", "gnp_init_params"]

_ACT = {"ReLU": (relu, relu_grad), "GELU": (gelu, gelu_grad), "SiLU": (silu, silu_grad),
        "Tanh": (np.tanh, lambda x: 1.0 - np.tanh(x) ** 2)}


def gnp_radius_graph(points, radius: float) -> np.ndarray:
    """Upstream's radius graph (``graph_from_dict`` without the random subsampling): the ``(2, E)``
    int64 ``edge_index`` of every pair at distance ``<= radius``, self-loops included, row 0 the
    centre (PyG source) and row 1 the neighbour (PyG target)."""
    pts = as_float(points, "points", ndim=2)
    nbr, splits = radius_neighbors(pts, pts, radius)
    rows = np.repeat(np.arange(pts.shape[0], dtype=np.int64), np.diff(splits))
    return np.stack([rows, nbr])


def _depth(params):
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict; got {type(params).__name__}")
    depth = 0
    while f"mixes.{depth}.weight" in params:
        depth += 1
    keys = ["lift.weight", "proj.weight"] + [f"mixes.{i}.weight" for i in range(depth)]
    keys += [f"convs.{i}.nn.layers.0.weight" for i in range(depth)]
    for key in keys:
        if np.ndim(params.get(key)) != 2:
            raise ValueError(f"params must contain {key!r} as a 2-d weight")
    return depth


def _edges(edge_index, radius, x, b, n):
    if (edge_index is None) == (radius is None):
        raise ValueError("give exactly one of edge_index (the graph) and radius (build it from x)")
    if radius is not None:
        radius = check_positive(radius, "radius")
        return [gnp_radius_graph(x[i], radius) for i in range(b)]
    per = edge_index if isinstance(edge_index, (list, tuple)) else [edge_index] * b
    if len(per) != b:
        raise ValueError(f"edge_index must be one (2, E) array or a list of B={b} of them; got {len(per)}")
    out = []
    for e in per:
        e = np.asarray(e)
        if e.ndim != 2 or e.shape[0] != 2 or not np.issubdtype(e.dtype, np.integer):
            raise ValueError(f"edge_index must be an integer array of shape (2, E); got {e.dtype} {e.shape}")
        if e.size and (e.min() < 0 or e.max() >= n):
            raise ValueError(f"edge_index entries must lie in [0, n={n}); got [{e.min()}, {e.max()}]")
        out.append(e.astype(np.int64))
    return out


def gnp_forward(x, edge_data, params, *, num_channels: int, edge_index=None, radius=None,
                nonlinearity: str = "ReLU"):
    r"""``BlockGNP.forward`` on a batch of point clouds (see the module docstring).

    Parameters
    ----------
    x : array (B, n, node_dim)
        Node features (upstream ``data.x``; the point coordinates in the paper's models).
    edge_data : array (B, n, q)
        Per-node data whose source/target pairs form the edge features (upstream ``edge_data``,
        default ``x``: pass ``x`` again; the two gradients then add up).
    params : dict
        ``BlockGNP`` state-dict names, linear weights ``(in, out)``: ``lift.*`` (node_dim, L_0);
        per layer ``W.{l}.*`` (L_l, L_{l+1}; absent when equal), ``mixes.{l}.*`` (L_{l+1}, L_{l+1}),
        ``convs.{l}.nn.layers.0.*`` (2q, neurons), ``convs.{l}.nn.layers.1.*``
        (neurons, C (L_l/C)(L_{l+1}/C)); ``proj.*`` (L_last, out_dim).
    num_channels : int
        Blocks $C$ of the kernel factorisation (upstream ``num_channels``; 4 in the released model).
    edge_index : int array (2, E) or list of B of them, optional
        The graph (row 0 source, row 1 target), held fixed.
    radius : float, optional
        Instead of ``edge_index``: the radius graph of ``x`` per batch element (:func:`gnp_radius_graph`).
    nonlinearity : {"ReLU", "GELU", "Tanh", "SiLU"}

    Returns
    -------
    out (B, n, out_dim), cache
    """
    x = as_float(x, "x", ndim=3)
    edge_data = as_float(edge_data, "edge_data", ndim=3)
    b, n, c0 = x.shape
    if edge_data.shape[:2] != (b, n):
        raise ValueError(f"edge_data must have shape (B={b}, n={n}, q) like x; got {edge_data.shape}")
    q = edge_data.shape[2]
    check_choice(nonlinearity, "nonlinearity", tuple(_ACT))
    ch = check_int(num_channels, "num_channels", minimum=1)
    depth = _depth(params)
    widths = [np.shape(params["lift.weight"])[1]] + [np.shape(params[f"mixes.{i}.weight"])[1] for i in range(depth)]
    neurons = [np.shape(params[f"convs.{i}.nn.layers.0.weight"])[1] for i in range(depth)]
    spec = {"lift.weight": (c0, widths[0]), "lift.bias": (widths[0],),
            "proj.weight": (widths[-1], np.shape(params["proj.weight"])[1]),
            "proj.bias": (np.shape(params["proj.weight"])[1],)}
    for i, (di, do) in enumerate(zip(widths, widths[1:])):
        if di % ch or do % ch:
            raise ValueError(f"layer {i} widths {di} -> {do} must be divisible by num_channels={ch}")
        if di != do:
            spec.update({f"W.{i}.weight": (di, do), f"W.{i}.bias": (do,)})
        spec.update({f"mixes.{i}.weight": (do, do), f"mixes.{i}.bias": (do,),
                     f"convs.{i}.nn.layers.0.weight": (2 * q, neurons[i]),
                     f"convs.{i}.nn.layers.0.bias": (neurons[i],),
                     f"convs.{i}.nn.layers.1.weight": (neurons[i], ch * (di // ch) * (do // ch)),
                     f"convs.{i}.nn.layers.1.bias": (ch * (di // ch) * (do // ch),)})
    p = check_params(params, spec)
    edges = _edges(edge_index, radius, x, b, n)
    dt = compute_dtype(x, edge_data, *p.values())
    x, edge_data, p = x.astype(dt, copy=False), edge_data.astype(dt, copy=False), cast_all(dt, p)
    act, _ = _ACT[nonlinearity]

    attr = [np.concatenate([edge_data[k][e[0]], edge_data[k][e[1]]], axis=-1) for k, e in enumerate(edges)]
    deg = [np.maximum(np.bincount(e[1], minlength=n), 1).astype(dt) for e in edges]
    v = linear_prefixed(p, "lift", x)
    layers = []
    for i, (di, do) in enumerate(zip(widths, widths[1:])):
        hi, ho = di // ch, do // ch
        z = np.zeros((b, n, do), dt)
        lc = {"v": v, "hid": [], "K": []}
        for k, e in enumerate(edges):
            hid = linear_prefixed(p, f"convs.{i}.nn.layers.0", attr[k])
            kern = linear_prefixed(p, f"convs.{i}.nn.layers.1", act(hid)).reshape(-1, ch, hi, ho)
            msg = np.einsum("ech,echo->eco", v[k][e[0]].reshape(-1, ch, hi), kern).reshape(-1, do)
            np.add.at(z[k], e[1], msg)
            z[k] /= deg[k][:, None]
            lc["hid"].append(hid)
            lc["K"].append(kern)
        lc["z"] = z
        pre = (linear_prefixed(p, f"W.{i}", v) if di != do else v) + linear_prefixed(p, f"mixes.{i}", z)
        lc["pre"] = pre
        v = act(pre) if i < depth - 1 else pre
        layers.append(lc)
    out = linear_prefixed(p, "proj", v)
    cache = {"p": p, "x": x, "edges": edges, "attr": attr, "deg": deg, "layers": layers, "v_last": v,
             "widths": widths, "ch": ch, "act": nonlinearity, "q": q, "out_shape": out.shape, "dt": dt}
    return out, cache


def gnp_backward(dout, cache):
    """Gradients of :func:`gnp_forward`: ``x``, ``edge_data`` and every params key."""
    p, dt, ch, q = cache["p"], cache["dt"], cache["ch"], cache["q"]
    act, act_grad = _ACT[cache["act"]]
    g = as_dout(dout, cache["out_shape"], dt)
    grads = {}
    dv = linear_prefixed_vjp(grads, p, "proj", g, cache["v_last"])
    widths, layers, edges = cache["widths"], cache["layers"], cache["edges"]
    b, n = cache["x"].shape[:2]
    dedge = np.zeros((b, n, q), dt)
    for i in reversed(range(len(layers))):
        lc, di, do = layers[i], widths[i], widths[i + 1]
        hi, ho = di // ch, do // ch
        dpre = dv * act_grad(lc["pre"]) if i < len(layers) - 1 else dv
        dz = linear_prefixed_vjp(grads, p, f"mixes.{i}", dpre, lc["z"])
        dv = linear_prefixed_vjp(grads, p, f"W.{i}", dpre, lc["v"]) if di != do else dpre.copy()
        for k, e in enumerate(edges):
            dmsg = (dz[k] / cache["deg"][k][:, None])[e[1]].reshape(-1, ch, ho)
            kern, hid = lc["K"][k], lc["hid"][k]
            vs = lc["v"][k][e[0]].reshape(-1, ch, hi)
            np.add.at(dv[k], e[0], np.einsum("echo,eco->ech", kern, dmsg).reshape(-1, di))
            dk = np.einsum("ech,eco->echo", vs, dmsg).reshape(kern.shape[0], -1)
            dh = linear_prefixed_vjp(grads, p, f"convs.{i}.nn.layers.1", dk, act(hid))
            da = linear_prefixed_vjp(grads, p, f"convs.{i}.nn.layers.0", dh * act_grad(hid), cache["attr"][k])
            np.add.at(dedge[k], e[0], da[:, :q])
            np.add.at(dedge[k], e[1], da[:, q:])
    grads["x"] = linear_prefixed_vjp(grads, p, "lift", dv, cache["x"])
    grads["edge_data"] = dedge
    return grads


def gnp(x, edge_data, params, **config):
    """Convenience wrapper: the output of :func:`gnp_forward`."""
    return gnp_forward(x, edge_data, params, **config)[0]


def gnp_init_params(rng, node_dim: int, edge_dim: int, out_dim: int, layers, *, num_channels: int,
                    neurons: int, dtype=np.float64) -> dict:
    """``BlockGNP`` parameters (PyTorch-default linears) under the upstream names; ``edge_dim`` is
    the width of the edge features $[p_s\\|p_t]$ (upstream ``edge_dim``, 2q)."""
    layers = list(layers)
    p = init_linear_prefixed(rng, node_dim, layers[0], "lift")
    for i, (di, do) in enumerate(zip(layers, layers[1:])):
        if di != do:
            p.update(init_linear_prefixed(rng, di, do, f"W.{i}"))
        p.update(init_linear_prefixed(rng, do, do, f"mixes.{i}"))
        p.update(init_linear_prefixed(rng, edge_dim, neurons, f"convs.{i}.nn.layers.0"))
        p.update(init_linear_prefixed(rng, neurons, num_channels * (di // num_channels) * (do // num_channels),
                                      f"convs.{i}.nn.layers.1"))
    p.update(init_linear_prefixed(rng, layers[-1], out_dim, "proj"))
    return {k: np.asarray(v, dtype=dtype) for k, v in p.items()}


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size, nonlinearity="GELU"):
    if size == "tiny":
        n, c0, q, widths, ch, neu, out = 3, 1, 1, [2, 2, 4], 2, 2, 1
    else:
        n, c0, q, widths, ch, neu, out = 7, 2, 2, [4, 4, 6], 2, 3, 2
    p = gnp_init_params(rng, c0, 2 * q, out, widths, num_channels=ch, neurons=neu)
    p = {k: v * 1.5 for k, v in p.items()}
    b = 2
    edges = []
    for _ in range(b):
        mask = rng.random((n, n)) < 0.6
        mask |= np.eye(n, dtype=bool)
        mask[:, 0] = False      # node 0 receives no messages: its aggregate is 0
        mask[0, 0] = False
        edges.append(np.stack(np.nonzero(mask)).astype(np.int64))
    return Sample(inputs={"x": rng.standard_normal((b, n, c0)), "edge_data": rng.standard_normal((b, n, q))},
                  params=p, config={"num_channels": ch, "edge_index": edges, "nonlinearity": nonlinearity})


def _reference(x, edge_data, params, *, num_channels, edge_index=None, radius=None, nonlinearity="ReLU"):
    # Explicit form: per edge the full (d, d') block-diagonal kernel matrix, then a dense
    # (n, E) mean-aggregation matrix.
    act = _ACT[nonlinearity][0]
    b, n, _ = x.shape
    edges = _edges(edge_index, radius, x, b, n)
    depth = _depth(params)
    outs = []
    for k, e in enumerate(edges):
        v = x[k] @ params["lift.weight"] + params["lift.bias"]
        a = np.concatenate([edge_data[k][e[0]], edge_data[k][e[1]]], axis=-1)
        agg = np.zeros((n, e.shape[1]))
        agg[e[1], np.arange(e.shape[1])] = 1.0
        agg /= np.maximum(agg.sum(1, keepdims=True), 1.0)
        for i in range(depth):
            di, do = v.shape[1], params[f"mixes.{i}.weight"].shape[0]
            kv = act(a @ params[f"convs.{i}.nn.layers.0.weight"] + params[f"convs.{i}.nn.layers.0.bias"])
            kv = kv @ params[f"convs.{i}.nn.layers.1.weight"] + params[f"convs.{i}.nn.layers.1.bias"]
            kv = kv.reshape(-1, num_channels, di // num_channels, do // num_channels)
            full = np.zeros((e.shape[1], di, do))
            for c in range(num_channels):
                full[:, c * (di // num_channels):(c + 1) * (di // num_channels),
                     c * (do // num_channels):(c + 1) * (do // num_channels)] = kv[:, c]
            z = agg @ np.einsum("ed,edo->eo", v[e[0]], full)
            w = v @ params[f"W.{i}.weight"] + params[f"W.{i}.bias"] if di != do else v
            v = w + z @ params[f"mixes.{i}.weight"] + params[f"mixes.{i}.bias"]
            v = act(v) if i < depth - 1 else v
        outs.append(v @ params["proj.weight"] + params["proj.bias"])
    return np.stack(outs)


def _check_radius_graph_brute_force(rng):
    pts = rng.random((30, 2))
    d = np.linalg.norm(pts[:, None] - pts[None], axis=-1)
    r = float(np.sort(d.ravel())[200] + np.sort(d.ravel())[201]) / 2
    e = gnp_radius_graph(pts, r)
    got = np.zeros((30, 30), bool)
    got[e[0], e[1]] = True
    bad = int(np.sum(got != (d <= r)))
    assert bad == 0, f"radius graph differs from brute force in {bad} pairs"
    return float(bad)


def _check_relu_fd_and_radius(rng):
    # The upstream ReLU (sampler keeps pre-activations away from 0 with probability ~1) and the
    # graph built from x by radius; the radius sits between pairwise distances, so finite
    # differences of x do not change the graph.
    from ..testing.gradcheck import gradcheck
    s = _sample(rng, "tiny", nonlinearity="ReLU")
    worst = gradcheck(gnp_forward, gnp_backward, s).max_rel
    s = _sample(rng, "tiny", nonlinearity="Tanh")
    x = s.inputs["x"]
    dd = [np.sort(np.abs(x[k][:, None, 0] - x[k][None, :, 0]).ravel()) for k in range(2)]
    r = None
    for cand in np.linspace(0.3, 2.0, 50):
        if all(np.min(np.abs(v - cand)) > 1e-3 for v in dd):
            r = float(cand)
            break
    s.config.pop("edge_index")
    s.config["radius"] = r
    return max(worst, gradcheck(gnp_forward, gnp_backward, s).max_rel)


def _check_permutation(rng):
    s = _sample(rng, "small")
    out = gnp(**s.inputs, params=s.params, **s.config)
    n = s.inputs["x"].shape[1]
    perm = rng.permutation(n)
    inv = np.argsort(perm)
    e2 = [inv[e] for e in s.config["edge_index"]]
    out_p = gnp(s.inputs["x"][:, perm], s.inputs["edge_data"][:, perm], s.params,
                **dict(s.config, edge_index=e2))
    err = float(np.abs(out_p - out[:, perm]).max())
    assert err < 1e-12, f"not equivariant under node relabelling: {err}"
    return err


register(
    Mechanism(
        slug="gnp_geometric_neural_operator", family="3-operator", tier="T3",
        title="Geometric neural operator (BlockGNP): block-factorised kernel integral on a point-cloud radius graph",
        paper="Quackenbush & Atzberger, Geometric Neural Operators (GNPs) for Data-Driven Deep Learning in "
              "Non-Euclidean Settings, Mach. Learn.: Sci. Technol. 5(4) 045033 (2024), arXiv 2404.10843",
        forward=gnp_forward, backward=gnp_backward, sample=_sample, reference=_reference,
        docs="operators/o5c.md#gnp-block-factorised-kernel-integral-on-a-point-cloud",
        checks={"radius_graph_brute_force": _check_radius_graph_brute_force,
                "relu_and_radius_graph_gradcheck": _check_relu_fd_and_radius,
                "node_relabelling_equivariance": _check_permutation},
    ),
)
