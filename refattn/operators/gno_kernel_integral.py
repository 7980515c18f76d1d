r"""Graph neural operator (GNO) kernel integral over radius neighbourhoods.

Paper: Kovachki, Li, Liu, Azizzadenesheli, Bhattacharya, Stuart, Anandkumar, "Neural Operator:
Learning Maps Between Function Spaces", JMLR 24 (2023), arXiv 2108.08481 (GNO: Li et al., "Neural
Operator: Graph Kernel Network for Partial Differential Equations", arXiv 2003.03485).
Upstream: neuraloperator/neuraloperator ``neuralop/layers/integral_transform.py``
(``IntegralTransform``), ``neighbor_search.py`` (``native_neighbor_search``), ``gno_block.py``
(``GNOBlock``: search + embedding + transform), ``embeddings.py`` (``SinusoidalEmbedding``),
``channel_mlp.py`` (``LinearChannelMLP``) @ 93d3f0633e048c915004cd782cb339acf06e1157.

Layer
-----
Input function $f$ on points $y_j$ (``y``), output points $x_i$ (``x``, default ``y``), radius
$r$, neighbourhoods $A(x_i) = \{j : \lVert x_i - y_j\rVert \le r\}$ (:func:`radius_neighbors`),
optional sinusoidal embedding $e(\cdot)$ of the coordinates and a kernel MLP $\kappa$ (GELU
between layers). For every edge $(i, j)$, $\kappa_{ij} = \kappa([e(y_j), e(x_i)])$ or, for the
nonlinear types, $\kappa([e(y_j), e(x_i), f(y_j)])$, and

$$\text{(a) linear\_kernelonly: } \textstyle\sum_{j\in A(x_i)} \kappa_{ij},\qquad
\text{(b) linear: } \sum_{j} \kappa_{ij}\odot f(y_j),$$

$$\text{(c) nonlinear\_kernelonly: } \textstyle\sum_{j} \kappa_{ij}(f),\qquad
\text{(d) nonlinear: } \sum_{j} \kappa_{ij}(f)\odot f(y_j),$$

with the reduction ``"sum"`` (upstream default) or ``"mean"`` ($1/|A(x_i)|$, the paper's Monte-Carlo
average), or, given quadrature weights $\mu_j$, $\sum_j \mu_j\,(\cdot)$ (a weighted sum; the
weights force the sum as upstream). Without $f$, type (a) is computed. A point with an empty
neighbourhood outputs 0. The kernel is diagonal (elementwise product), so types (b) and (d) need
$\kappa$'s width to equal $f$'s channel count.

Backward
--------
The neighbourhood is a non-differentiable selection: it is held fixed, and the gradient flows
through the selected edges. With $g_i = \partial L/\partial\mathrm{out}_i$ and per-edge
$\gamma_{ij} = g_i\,\mu_j$ (or $g_i/|A(x_i)|$, or $g_i$): $d\kappa_{ij} = \gamma_{ij}\odot f_j$
(or $\gamma_{ij}$ for kernel-only types), $df_j \mathrel{+}= \sum_i \gamma_{ij}\odot\kappa_{ij}$,
$d\mu_j = \sum_i g_i\cdot v_{ij}$ with $v_{ij}$ the unweighted edge value; the MLP VJP gives the
gradient of its input, which is scattered back onto $e(y_j)$, $e(x_i)$ and (nonlinear types)
$f_j$ (edge scatter-add), then through the embedding: for $e_{c,k}(p) = (\sin\omega_kp_c,
\cos\omega_kp_c)$, $dp_c = \sum_k \omega_k(d s_{c,k}\cos\omega_kp_c - d c_{c,k}\sin\omega_kp_c)$.
Coordinates are differentiable, as in upstream's autograd (where they only enter the kernel).

Conventions and upstream details
--------------------------------
* Neighbour search as ``native_neighbor_search``: inclusive ``<= radius``, neighbours ordered by
  data index, a point's own location (distance 0) included.
* Kernel input order $[y_j, x_i, f_j]$ as upstream (``rep_features`` first).
* ``pos_embedding``: ``"transformer"`` (GNOBlock default; frequencies
  $(1/\text{max\_positions})^{2k/L}$), ``"nerf"`` ($2^k\pi$) or ``None``; interleaved layout
  ``[coordinate][frequency][sin, cos]`` as upstream's ``view``.
* Quadrature ``weights`` are per input point $y_j$, as in the paper and in IntegralTransform up to
  c73e97a08db1f3667a5968141724f61fea7f247c (``weights[neighbors_index]``); since the Mollified-GNO
  change the current upstream multiplies a *per-edge* vector (``neighbors["weights"]``), which is
  not the same API. The mollified weighting functions are not part of this layer.
* Coordinates carry a batch axis here (``(B, n, d)``; one graph per batch element); upstream shares
  one point cloud over the batch: pass ``np.broadcast_to`` copies and sum the coordinate gradient.
"""

from __future__ import annotations

import numpy as np
from scipy.spatial import cKDTree

from .._checks import as_dout, as_float, cast_all, check_choice, check_int, check_params, check_positive, compute_dtype
from ..nn.activations import gelu, gelu_grad
from ..nn.linear import init_linear_prefixed, linear_prefixed, linear_prefixed_spec, linear_prefixed_vjp
from ..registry import Mechanism, Sample, register

__all__ = ["radius_neighbors", "sinusoidal_embedding", "sinusoidal_embedding_vjp", "gno_kernel_integral_forward",
           "gno_kernel_integral_backward", "gno_kernel_integral", "init_gno_params"]

_TYPES = ("linear_kernelonly", "linear", "nonlinear_kernelonly", "nonlinear")
_MLP = "channel_mlp.fcs"


def radius_neighbors(data, queries, radius: float):
    """Neighbours of every query point within ``radius`` (inclusive) in CSR form.

    Parameters
    ----------
    data : array (n, d)
        Candidate neighbours $y_j$.
    queries : array (m, d)
        Centres $x_i$.
    radius : float > 0

    Returns
    -------
    neighbors_index, row_splits : int64 arrays (E,), (m + 1,)
        The neighbours of query ``i`` are ``neighbors_index[row_splits[i]:row_splits[i + 1]]``,
        sorted by data index (upstream ``native_neighbor_search``'s order). A k-d tree does the
        search; the test suite compares it with the brute-force distance matrix.
    """
    data = as_float(data, "data", ndim=2)
    queries = as_float(queries, "queries", ndim=2)
    if data.shape[1] != queries.shape[1]:
        raise ValueError(f"data and queries must have the same coordinate dimension; got {data.shape} and "
                         f"{queries.shape}")
    radius = check_positive(radius, "radius")
    lists = cKDTree(data).query_ball_point(queries, r=radius, p=2.0, return_sorted=True)
    counts = np.fromiter((len(v) for v in lists), dtype=np.int64, count=len(lists))
    splits = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    index = np.fromiter((j for v in lists for j in v), dtype=np.int64, count=int(splits[-1]))
    return index, splits


def _frequencies(num_frequencies: int, embedding_type: str, max_positions: float) -> np.ndarray:
    k = np.arange(num_frequencies, dtype=float)
    if embedding_type == "nerf":
        return 2.0 ** k * np.pi
    return (1.0 / max_positions) ** (2.0 * k / num_frequencies)


def sinusoidal_embedding(p: np.ndarray, num_frequencies: int, embedding_type: str = "transformer",
                         max_positions: float = 10000.0) -> np.ndarray:
    r"""``SinusoidalEmbedding``: $(\ldots, d) \to (\ldots, 2dL)$, entries $[\sin\omega_kp_c, \cos\omega_kp_c]$
    ordered coordinate-major, then frequency, then (sin, cos). Unvalidated helper."""
    ang = p[..., :, None] * _frequencies(num_frequencies, embedding_type, max_positions).astype(p.dtype)
    return np.stack([np.sin(ang), np.cos(ang)], axis=-1).reshape(p.shape[:-1] + (-1,))


def sinusoidal_embedding_vjp(de: np.ndarray, p: np.ndarray, num_frequencies: int, embedding_type: str = "transformer",
                             max_positions: float = 10000.0) -> np.ndarray:
    """Gradient of :func:`sinusoidal_embedding` with respect to ``p`` for upstream gradient ``de``."""
    om = _frequencies(num_frequencies, embedding_type, max_positions).astype(p.dtype)
    ang = p[..., :, None] * om
    d = de.reshape(p.shape + (num_frequencies, 2))
    return np.sum(om * (d[..., 0] * np.cos(ang) - d[..., 1] * np.sin(ang)), axis=-1)


def _mlp_layers(params) -> int:
    n = 0
    while f"{_MLP}.{n}.weight" in params:
        n += 1
    return n


def _validate(y, x, f_y, weights, params, radius, transform_type, reduction, pos_embedding,
              pos_embedding_channels, max_positions, approximate):
    y = as_float(y, "y", ndim=3)
    b, n, dc = y.shape
    if x is not None:
        x = as_float(x, "x", ndim=3)
        if x.shape[0] != b or x.shape[2] != dc:
            raise ValueError(f"x must have shape (B={b}, m, d={dc}) like y; got {x.shape}")
    if f_y is not None:
        f_y = as_float(f_y, "f_y", ndim=3)
        if f_y.shape[:2] != (b, n):
            raise ValueError(f"f_y must have shape (B={b}, n={n}, channels) to match y; got {f_y.shape}")
    if weights is not None:
        weights = as_float(weights, "weights", ndim=2)
        if weights.shape != (b, n):
            raise ValueError(f"weights must have shape (B={b}, n={n}): one quadrature weight per point of y; "
                             f"got {weights.shape}")
    radius = check_positive(radius, "radius")
    check_choice(transform_type, "transform_type", _TYPES)
    check_choice(reduction, "reduction", ("sum", "mean"))
    check_choice(pos_embedding, "pos_embedding", ("transformer", "nerf", None))
    check_choice(approximate, "approximate", ("none", "tanh"))
    channels = check_int(pos_embedding_channels, "pos_embedding_channels", minimum=1)
    max_positions = check_positive(max_positions, "max_positions")
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict with keys {_MLP}.{{i}}.weight/.bias; got {type(params).__name__}")
    n_layers = _mlp_layers(params)
    if n_layers == 0:
        raise ValueError(f"params is missing keys ['{_MLP}.0.weight'] (the kernel MLP)")
    kind = "linear_kernelonly" if f_y is None else transform_type
    emb = dc if pos_embedding is None else 2 * dc * channels
    widths = [2 * emb + (f_y.shape[2] if kind.startswith("nonlinear") else 0)]
    spec = {}
    for i in range(n_layers):
        w = as_float(params[f"{_MLP}.{i}.weight"], f"{_MLP}.{i}.weight", ndim=2)
        widths.append(w.shape[1])
        spec.update(linear_prefixed_spec(f"{_MLP}.{i}", widths[i], widths[i + 1]))
    p = check_params(params, spec, optional=tuple(k for k in spec if k.endswith(".bias")))
    if kind in ("linear", "nonlinear") and widths[-1] != f_y.shape[2]:
        raise ValueError(f"transform_type={kind!r} multiplies the kernel by f_y: the last {_MLP} layer must "
                         f"output {f_y.shape[2]} channels; got {widths[-1]}")
    dt = compute_dtype(y, x, f_y, weights, *p.values())
    cast = {k: None if v is None else v.astype(dt, copy=False) for k, v in
            {"y": y, "x": x, "f_y": f_y, "weights": weights}.items()}
    return cast, cast_all(dt, p), n_layers, kind, radius, channels, max_positions


def gno_kernel_integral_forward(y, x=None, f_y=None, weights=None, params=None, *, radius: float,
                                transform_type: str = "linear", reduction: str = "sum",
                                pos_embedding="transformer", pos_embedding_channels: int = 32,
                                max_positions: float = 10000.0, approximate: str = "none"):
    r"""GNO kernel integral (``GNOBlock``): radius graph, coordinate embedding, kernel MLP, reduction.

    Parameters
    ----------
    y : array (B, n, d)
        Input points (the domain of integration), one point cloud per batch element.
    x : array (B, m, d), optional
        Output points; default ``y``.
    f_y : array (B, n, c), optional
        Input function on ``y``; without it the kernel-only transform (a) is computed.
    weights : array (B, n), optional
        Quadrature weights of the points of ``y`` (force a weighted sum).
    params : dict
        Kernel MLP ``channel_mlp.fcs.{i}.weight`` (in, out) (= ``nn.Linear.weight.T``) and
        ``.bias`` (out,); GELU between layers. :func:`init_gno_params` builds them.
    radius : float
        Neighbourhood radius (inclusive).
    transform_type : {"linear", "linear_kernelonly", "nonlinear", "nonlinear_kernelonly"}
    reduction : {"sum", "mean"}
        Neighbourhood reduction without weights (upstream default ``"sum"``).
    pos_embedding : {"transformer", "nerf", None}
        Sinusoidal coordinate embedding (GNOBlock default ``"transformer"``).
    pos_embedding_channels, max_positions
        Frequencies per coordinate (upstream 32) and the transformer base (10000).
    approximate : {"none", "tanh"}
        GELU form of the kernel MLP (``F.gelu`` default ``"none"``).

    Returns
    -------
    out, cache
        ``out (B, m, c_out)``; ``cache["graph"]`` holds the (batch, query, data) edge list.
    """
    a, p, n_layers, kind, radius, channels, max_pos = _validate(
        y, x, f_y, weights, params, radius, transform_type, reduction, pos_embedding,
        pos_embedding_channels, max_positions, approximate)
    y, f = a["y"], a["f_y"]
    xq = y if a["x"] is None else a["x"]
    b, m = xq.shape[0], xq.shape[1]
    eb, ei, ej = [], [], []
    for bb in range(b):
        idx, splits = radius_neighbors(y[bb], xq[bb], radius)
        ei.append(np.repeat(np.arange(m), np.diff(splits)))
        ej.append(idx)
        eb.append(np.full(idx.shape, bb))
    eb, ei, ej = (np.concatenate(t).astype(np.int64) for t in (eb, ei, ej))
    emb = (lambda t: t) if pos_embedding is None else (
        lambda t: sinusoidal_embedding(t, channels, pos_embedding, max_pos))
    ey, ex = emb(y), emb(xq)
    feats = [ey[eb, ej], ex[eb, ei]]
    if kind.startswith("nonlinear"):
        feats.append(f[eb, ej])
    hs = [np.concatenate(feats, axis=-1)]
    pre = []
    for i in range(n_layers):
        z = linear_prefixed(p, f"{_MLP}.{i}", hs[-1])
        pre.append(z)
        hs.append(gelu(z, approximate) if i < n_layers - 1 else z)
    kern = hs[-1]
    val = kern * f[eb, ej] if kind in ("linear", "nonlinear") else kern
    counts = np.zeros((b, m), dtype=y.dtype)
    np.add.at(counts, (eb, ei), 1.0)
    if a["weights"] is not None:
        scale = a["weights"][eb, ej]
    elif reduction == "mean":
        scale = 1.0 / counts[eb, ei]
    else:
        scale = None
    out = np.zeros((b, m, val.shape[-1]), dtype=y.dtype)
    np.add.at(out, (eb, ei), val if scale is None else val * scale[:, None])
    cache = dict(a, p=p, xq_given=a["x"] is not None, kind=kind, graph=(eb, ei, ej), hs=hs, pre=pre, val=val,
                 scale=scale, n_layers=n_layers, emb=(pos_embedding, channels, max_pos), approx=approximate,
                 out_shape=out.shape)
    return out, cache


def gno_kernel_integral_backward(dout, cache):
    """Gradients of :func:`gno_kernel_integral_forward` with the radius graph held fixed:
    ``y`` (and ``x``, ``f_y``, ``weights`` when given) and every kernel-MLP parameter."""
    y, f, p, kind = cache["y"], cache["f_y"], cache["p"], cache["kind"]
    eb, ei, ej = cache["graph"]
    g = as_dout(dout, cache["out_shape"], y.dtype)
    ge = g[eb, ei]
    grads = {}
    scale, val = cache["scale"], cache["val"]
    if cache["weights"] is not None:
        dw = np.zeros_like(cache["weights"])
        np.add.at(dw, (eb, ej), np.sum(ge * val, axis=-1))
        grads["weights"] = dw
    if scale is not None:
        ge = ge * scale[:, None]
    hs, pre = cache["hs"], cache["pre"]
    df = None if f is None else np.zeros_like(f)
    if kind in ("linear", "nonlinear"):
        np.add.at(df, (eb, ej), ge * hs[-1])
        dk = ge * f[eb, ej]
    else:
        dk = ge
    for i in reversed(range(cache["n_layers"])):
        if i < cache["n_layers"] - 1:
            dk = dk * gelu_grad(pre[i], cache["approx"])
        dk = linear_prefixed_vjp(grads, p, f"{_MLP}.{i}", dk, hs[i])
    emb_type, channels, max_pos = cache["emb"]
    d_emb = dk.shape[-1] - (f.shape[-1] if kind.startswith("nonlinear") else 0)
    half = d_emb // 2
    xq = cache["x"] if cache["xq_given"] else y
    dey = np.zeros(y.shape[:2] + (half,), dtype=y.dtype)
    dex = np.zeros(xq.shape[:2] + (half,), dtype=y.dtype)
    np.add.at(dey, (eb, ej), dk[:, :half])
    np.add.at(dex, (eb, ei), dk[:, half:d_emb])
    if kind.startswith("nonlinear"):
        np.add.at(df, (eb, ej), dk[:, d_emb:])
    if emb_type is not None:
        dey = sinusoidal_embedding_vjp(dey, y, channels, emb_type, max_pos)
        dex = sinusoidal_embedding_vjp(dex, xq, channels, emb_type, max_pos)
    if cache["xq_given"]:
        grads["y"], grads["x"] = dey, dex
    else:
        grads["y"] = dey + dex
    if f is not None:
        grads["f_y"] = df
    return grads


def gno_kernel_integral(y, x=None, f_y=None, weights=None, params=None, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`gno_kernel_integral_forward`."""
    return gno_kernel_integral_forward(y, x, f_y, weights, params, **config)[0]


def init_gno_params(rng, coord_dim: int, out_channels: int, *, in_channels: int = 0,
                    channel_mlp_layers=(128, 256, 128), transform_type: str = "linear",
                    pos_embedding="transformer", pos_embedding_channels: int = 32, dtype=np.float64) -> dict:
    """Kernel-MLP parameters as ``GNOBlock`` builds them: input width ``2 * emb (+ in_channels for
    the nonlinear types)``, hidden ``channel_mlp_layers`` (upstream default [128, 256, 128]), output
    ``out_channels``; PyTorch's default ``nn.Linear`` initialisation."""
    check_choice(transform_type, "transform_type", _TYPES)
    emb = coord_dim if pos_embedding is None else 2 * coord_dim * pos_embedding_channels
    widths = [2 * emb + (in_channels if transform_type.startswith("nonlinear") else 0), *channel_mlp_layers,
              out_channels]
    p = {}
    for i in range(len(widths) - 1):
        p.update(init_linear_prefixed(rng, widths[i], widths[i + 1], f"{_MLP}.{i}"))
    return {k: v.astype(dtype) for k, v in p.items()}


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _radius_between_distances(y, x):
    # A radius in the middle of the widest gap between pairwise distances (central half of their
    # range), so that no edge is within reach of a finite-difference step.
    d = np.sort(np.concatenate([np.linalg.norm(x[b][:, None] - y[b][None], axis=-1).ravel()
                                for b in range(y.shape[0])]))
    lo, hi = np.searchsorted(d, np.quantile(d, [0.25, 0.75]))
    gaps = np.diff(d[lo:hi + 1])
    k = int(np.argmax(gaps))
    return float(0.5 * (d[lo + k] + d[lo + k + 1]))


def _sample(rng, size, *, transform_type="nonlinear"):
    if size == "tiny":
        n, m, c, hidden, freqs = 4, 3, 2, 3, 1
    else:
        n, m, c, hidden, freqs = int(rng.integers(8, 13)), int(rng.integers(5, 9)), 3, 6, 2
    y = rng.uniform(0.0, 1.0, (2, n, 2))
    x = rng.uniform(0.0, 1.0, (2, m, 2))
    params = init_gno_params(rng, 2, c, in_channels=c, channel_mlp_layers=(hidden,), transform_type=transform_type,
                             pos_embedding="nerf", pos_embedding_channels=freqs)
    inputs = {"y": y, "x": x, "f_y": rng.standard_normal((2, n, c)), "weights": rng.uniform(0.5, 1.5, (2, n))}
    return Sample(inputs=inputs, params=params,
                  config={"radius": _radius_between_distances(y, x), "transform_type": transform_type,
                          "pos_embedding": "nerf", "pos_embedding_channels": freqs})


def _reference(y, x=None, f_y=None, weights=None, params=None, *, radius, transform_type="linear", reduction="sum",
               pos_embedding="transformer", pos_embedding_channels=32, max_positions=10000.0, approximate="none"):
    # Dense form: a 0/1 adjacency from the full distance matrix and the kernel evaluated on every
    # (i, j) pair, masked, then summed.
    xq = y if x is None else x
    n_layers = _mlp_layers(params)
    emb = (lambda t: t) if pos_embedding is None else (
        lambda t: sinusoidal_embedding(t, pos_embedding_channels, pos_embedding, max_positions))
    outs = []
    for b in range(y.shape[0]):
        adj = np.linalg.norm(xq[b][:, None] - y[b][None], axis=-1) <= radius
        m, n = adj.shape
        parts = [np.broadcast_to(emb(y[b])[None], (m, n, 2 * y.shape[2] * pos_embedding_channels
                                                   if pos_embedding else y.shape[2])),
                 np.broadcast_to(emb(xq[b])[:, None], (m, n, emb(xq[b]).shape[-1]))]
        kind = "linear_kernelonly" if f_y is None else transform_type
        if kind.startswith("nonlinear"):
            parts.append(np.broadcast_to(f_y[b][None], (m, n, f_y.shape[2])))
        h = np.concatenate(parts, axis=-1)
        for i in range(n_layers):
            h = h @ params[f"{_MLP}.{i}.weight"] + params[f"{_MLP}.{i}.bias"]
            if i < n_layers - 1:
                h = gelu(h, approximate)
        if kind in ("linear", "nonlinear"):
            h = h * f_y[b][None]
        w = adj.astype(float)
        if weights is not None:
            w = w * weights[b][None]
        elif reduction == "mean":
            w = w / np.maximum(adj.sum(1, keepdims=True), 1)
        outs.append(np.einsum("ij,ijc->ic", w, h))
    return np.stack(outs)


def _check_graph_matches_brute_force(rng):
    # k-d tree search == the full distance matrix thresholded at <= r (order, boundary, duplicates).
    for _ in range(5):
        data = rng.uniform(0, 1, (40, 2))
        data[5] = data[3]                                   # a duplicated point
        queries = np.concatenate([rng.uniform(0, 1, (15, 2)), data[:3]])
        r = float(rng.uniform(0.05, 0.4))
        idx, splits = radius_neighbors(data, queries, r)
        dist = np.linalg.norm(queries[:, None] - data[None], axis=-1)
        for i in range(len(queries)):
            brute = np.flatnonzero(dist[i] <= r)
            assert np.array_equal(idx[splits[i]:splits[i + 1]], brute), f"query {i}: {idx[splits[i]:splits[i + 1]]} != {brute}"
    return 0.0


def _check_infinite_radius_constant_kernel_is_mean(rng):
    # kappa = 1 (zero last layer, unit bias), r covering the domain, mean reduction: the global mean of f.
    y = rng.uniform(0, 1, (2, 7, 2))
    f = rng.standard_normal((2, 7, 3))
    p = init_gno_params(rng, 2, 3, channel_mlp_layers=(4,), pos_embedding=None)
    p[f"{_MLP}.1.weight"] = np.zeros((4, 3))
    p[f"{_MLP}.1.bias"] = np.ones(3)
    out = gno_kernel_integral(y, None, f, None, p, radius=10.0, reduction="mean", pos_embedding=None)
    err = float(np.abs(out - f.mean(axis=1, keepdims=True)).max())
    assert err < 1e-14, f"constant kernel over the whole domain differs from the mean by {err:.2e}"
    return err


def _check_permutation(rng):
    # Permuting the input points (with f and the weights) changes nothing; permuting the output
    # points permutes the output.
    s = _sample(rng, "small")
    base = gno_kernel_integral(**s.inputs, params=s.params, **s.config)
    pj, pi = rng.permutation(s.inputs["y"].shape[1]), rng.permutation(s.inputs["x"].shape[1])
    inp = {"y": s.inputs["y"][:, pj], "x": s.inputs["x"][:, pi], "f_y": s.inputs["f_y"][:, pj],
           "weights": s.inputs["weights"][:, pj]}
    out = gno_kernel_integral(**inp, params=s.params, **s.config)
    err = float(np.abs(out - base[:, pi]).max())
    assert err < 1e-13, f"GNO is not permutation equivariant: {err:.2e}"
    return err


def _check_discretisation_convergence(rng):
    # The same smooth f on midpoint grids of n and 3n cells of [0, 1] (refinement by 3 keeps the
    # coarse points), quadrature weights h: the weighted sum is a Riemann sum of
    # int_{|x-y|<=r} kappa(x, y) f(y) dy. (i) r beyond the domain: a smooth integrand, midpoint
    # rule, second order (the gap falls ~9x per refinement by 3). (ii) r inside: the ball cuts the
    # integrand, each cut cell errs by at most h max|kappa f|, so the gap is O(h) with constant
    # <= 4 max|kappa f| (two cuts, two grids). Without the weights the sums grow with n instead.
    p = init_gno_params(np.random.default_rng(5), 1, 2, channel_mlp_layers=(8,), pos_embedding=None)

    def run(n, r, weighted=True):
        t = (np.arange(n) + 0.5) / n
        f = np.stack([np.sin(2 * np.pi * t), np.exp(-t)], -1)[None]
        w = np.full((1, n), 1.0 / n) if weighted else None
        return gno_kernel_integral(t[None, :, None], None, f, w, p, radius=r, pos_embedding=None)

    smooth = [float(np.abs(run(n, 2.0) - run(3 * n, 2.0)[:, 1::3]).max()) for n in (10, 30)]
    assert smooth[1] < smooth[0] / 6, f"full-domain gaps {smooth} do not fall at second order"
    t = (np.arange(120) + 0.5) / 120
    pair = np.stack(np.broadcast_arrays(t[None, :], t[:, None]), -1).reshape(-1, 2)
    kern = gelu(pair @ p[f"{_MLP}.0.weight"] + p[f"{_MLP}.0.bias"]) @ p[f"{_MLP}.1.weight"] + p[f"{_MLP}.1.bias"]
    bound = 4.0 * float(np.abs(kern).max()) * 1.0                      # max|f| <= 1 on [0, 1]
    cut = []
    for n in (20, 40):
        gap = float(np.abs(run(n, 0.2357) - run(3 * n, 0.2357)[:, 1::3]).max())
        assert gap <= bound / n, f"n={n}: gap {gap:.2e} exceeds the first-order bound {bound / n:.2e}"
        cut.append(gap)
    raw = float(np.abs(run(40, 0.2357, weighted=False) - run(120, 0.2357, weighted=False)[:, 1::3]).max())
    assert raw > 10 * cut[-1], "unweighted sums unexpectedly resolution independent"
    return max(smooth[1], cut[-1])


register(
    Mechanism(
        slug="gno_kernel_integral_layer", family="3-operator", tier="T2",
        title="Graph/low-rank kernel-integral neural-operator layers (GNO, LNO)",
        paper="Kovachki, Li, Liu, Azizzadenesheli, Bhattacharya, Stuart, Anandkumar, Neural Operator: Learning "
              "Maps Between Function Spaces, JMLR 24 (2023), arXiv 2108.08481",
        forward=gno_kernel_integral_forward, backward=gno_kernel_integral_backward, sample=_sample,
        reference=_reference, docs="operators/kernel-integrals-and-scans.md#gno-kernel-integral",
        checks={"graph_matches_brute_force": _check_graph_matches_brute_force,
                "infinite_radius_constant_kernel_is_mean": _check_infinite_radius_constant_kernel_is_mean,
                "permutation_equivariance": _check_permutation,
                "discretisation_convergence": _check_discretisation_convergence},
    ),
)
