r"""DARTS-GT asymmetric attention: queries from the node features, keys and values from a
DARTS-weighted mixture of GNN transformations of them.

Chakraborty & Minary, "DARTS-GT: Differentiable Architecture Search for Graph Transformers with
Quantifiable Instance-Specific Interpretability Analysis", 2025, arXiv 2510.14336. Official code
read: ``shrutiOx/DARTS_GT`` ``DARTS_GT_LRGB/dartsgt/layer/NAS_layer.py`` (``NASLayer.forward``,
``_initialize_kv_models``; the ``Transformer`` global model, ``routing_mode='nas'``)
@41e59ded4abec9d50fff588b14e5a9a1af0ba44a.

Forward (one graph per batch entry, dense adjacency, the attention sub-block of ``NASLayer``)
------------------------------------------------------------------------------------------------
For node features $X\in\mathbb R^{N\times C}$ and adjacency $A$ ($A_{ij}=1$ for an edge $j\to i$),
every candidate operator $o$ of the code's first operator set (``gnns_type_used=1``, upstream
order ``GIN, GCN, GAT, SAGE``; upstream ``kv_model[o]``) gives $H_o = \mathrm{GNN}_o(X)$:

* ``GIN`` (PyG ``GINConv``, $\epsilon = 0$): $H = \mathrm{relu}((X + AX)W_0 + b_0)W_2 + b_2$;
* ``GCN`` (PyG ``GCNConv``): $H = \hat A\,XW + b$, $\hat A = \tilde D^{-1/2}(A+I)\tilde D^{-1/2}$,
  $\tilde D_{ii} = 1 + \sum_jA_{ij}$ (in-degree);
* ``GAT`` (PyG ``GATConv``, ``heads = num_heads``, width $C/H$ per head, self loops):
  $X' = XW$, $\alpha_{ij} = \mathrm{softmax}_{j\in\mathcal N(i)\cup\{i\}}\,\mathrm{LeakyReLU}_{0.2}(a_{dst}\cdot X'_i +
  a_{src}\cdot X'_j)$ per head, $H_i = \big\Vert_h\sum_j\alpha_{ij}X'_j + b$;
* ``SAGE`` (PyG ``SAGEConv(aggr='max')``): $H_i = (\max_{j\in\mathcal N(i)}X_j)W_l + b_l + X_iW_r$ (channel-wise
  max; 0 for a node without neighbours, PyG's scatter fill).

Upstream sets its flag ``kv_gnn_with_edge_attr`` inside the candidate loop, so after the last
candidate (``SAGE``) every candidate of this set is called without edge features; ``GATConv``'s
``lin_edge``/``att_edge`` (``edge_dim`` is set) are therefore unused and not part of ``params``.

The expert outputs are standardised together, $E_o = (H_o - \mu)/(s + 10^{-8})$ with $\mu, s$ the
mean and unbiased standard deviation of all experts' entries, mixed by the DARTS architecture
weights, $\mathrm{KV} = \sum_o\mathrm{softmax}(\alpha)_oE_o$ (nni ``InputChoice`` in DARTS mode),
and the attention is asymmetric, $Y = \mathrm{MHA}(Q{=}X, K{=}\mathrm{KV}, V{=}\mathrm{KV})$
(``torch.nn.MultiheadAttention``; `refattn.attention.softmax.mha`).

Backward
--------
MHA's VJP (`refattn.attention.softmax.mha.mha_backward`) gives $\bar X$ (query path) and
$\overline{\mathrm{KV}}$. Mixture: $\bar E_o = w_o\overline{\mathrm{KV}}$,
$\bar\alpha = \mathrm{softmax\_vjp}(w, [\langle\overline{\mathrm{KV}}, E_o\rangle]_o)$. Standardisation
over the $M$ stacked entries $h$, $e = (h-\mu)/(s+\epsilon)$:
$\bar h = \frac{1}{s+\epsilon}\big(\bar e - \overline{\bar e}\big) -
\frac{\langle\bar e, h-\mu\rangle}{(s+\epsilon)^2}\,\frac{h-\mu}{(M-1)s}$.
GCN: $\overline{XW} = \hat A^\top\bar H$, $\bar W = X^\top\overline{XW}$, $\bar b = \sum\bar H$,
$\bar X \mathrel{+}= \overline{XW}W^\top$. GIN, $z = X + AX$, $u = zW_0 + b_0$:
$\bar u = (\bar HW_2^\top)\odot[u>0]$, $\bar z = \bar uW_0^\top$, $\bar X \mathrel{+}= \bar z + A^\top\bar z$
(the relu's selection held fixed). GAT: $\bar\alpha_{ij} = \langle\bar H_i, X'_j\rangle$ per head,
$\bar X'_j \mathrel{+}= \sum_i\alpha_{ij}\bar H_i$, the softmax VJP over $j$, the leaky-relu slope, then
$\bar a_{src} = \sum_j(\sum_i\bar e_{ij})X'_j$, $\bar a_{dst} = \sum_i(\sum_j\bar e_{ij})X'_i$,
$\bar X' \mathrel{+}= (\sum_i\bar e_{ij})a_{src} + (\sum_j\bar e_{ij})a_{dst}$, $\bar W = X^\top\bar X'$.
SAGE: the max's gradient goes to the selected neighbour of each channel (selection held fixed).
Samplers keep every selection (relu, leaky-relu, max) at least $10^{-3}$ from its switch.

Measured agreement with upstream: the code needs ``torch_geometric``, ``torch_scatter`` and ``nni``
(not installable here), so ``NASLayer``'s KV path was transcribed in a float64 torch scratch script
(PyG ``GINConv``/``GCNConv``/``GATConv``/``SAGEConv(max)`` as edge-list message passing with
``index_add_``/``index_reduce_``, the standardisation and softmax mixture as in the file) feeding
the real ``torch.nn.MultiheadAttention``; $N=7$ (one isolated node), $C=6$, 2 heads, 2 graphs,
weights copied: output max abs error 4.4e-16 (rel 2.8e-16), gradients of $X$ and every parameter
max rel 3.6e-15 (the key-projection bias, whose exact gradient is 0 since softmax ignores it, is
~5e-16 in both: abs difference 3.7e-16).

Conventions and what is not provided: upstream standardises over the whole PyG batch (all graphs
at once); refattn does it per batch entry (identical for one graph per call, and it keeps batch
entries independent). Dropouts are off (eval). The KV normalisation ``norm1_kv`` (BatchNorm by
default), the residual, ``norm1_attn`` and the feed-forward block of ``NASLayer``, and the second
(edge-feature) operator set ``GINE``, ``CustomGatedGCN``, ``GATV2`` are not provided; nor is the
causal-ablation interpretability analysis (not a layer).
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_choice, check_int, check_params
from ...nn.softmax import softmax_lse, softmax_vjp
from ...registry import Mechanism, Sample, register
from ..softmax.mha import mha_backward, mha_forward
from ._samples import draw_until, fd_max_rel

__all__ = ["DARTS_GT_CANDIDATES", "darts_gt_attention_forward", "darts_gt_attention_backward", "darts_gt_attention"]

DARTS_GT_CANDIDATES = ("GIN", "GCN", "GAT", "SAGE")
_GAT_SLOPE = 0.2
_STD_EPS = 1e-8
_MHA = ("q_proj", "k_proj", "v_proj", "out_proj")


def _spec(C, candidates, heads):
    spec = {"input_choice.alpha": (len(candidates),)}
    for i, op in enumerate(candidates):
        pre = f"kv_model.{i}"
        if op == "GCN":
            spec.update({f"{pre}.lin.weight": (C, C), f"{pre}.bias": (C,)})
        elif op == "GIN":
            spec.update({f"{pre}.nn.0.weight": (C, C), f"{pre}.nn.0.bias": (C,), f"{pre}.nn.2.weight": (C, C),
                         f"{pre}.nn.2.bias": (C,)})
        elif op == "GAT":
            spec.update({f"{pre}.lin.weight": (C, C), f"{pre}.att_src": (1, heads, C // heads),
                         f"{pre}.att_dst": (1, heads, C // heads), f"{pre}.bias": (C,)})
        else:
            spec.update({f"{pre}.lin_l.weight": (C, C), f"{pre}.lin_l.bias": (C,), f"{pre}.lin_r.weight": (C, C)})
    for n in _MHA:
        spec[f"self_attn.{n}"] = (C, C)
        spec[f"self_attn.{n}_bias"] = (C,)
    return spec


def _gnn_forward(op, pre, x, adj, p, heads):
    """One candidate's output ``(B, N, C)`` and what its backward needs."""
    if op == "GCN":
        ahat = _gcn_norm(adj)
        return ahat @ (x @ p[f"{pre}.lin.weight"]) + p[f"{pre}.bias"], ahat
    if op == "GIN":
        z = x + adj @ x
        u = z @ p[f"{pre}.nn.0.weight"] + p[f"{pre}.nn.0.bias"]
        r = np.maximum(u, 0.0)
        return r @ p[f"{pre}.nn.2.weight"] + p[f"{pre}.nn.2.bias"], (z, u, r)
    B, N, C = x.shape
    if op == "GAT":
        xp = (x @ p[f"{pre}.lin.weight"]).reshape(B, N, heads, C // heads)
        es = np.sum(xp * p[f"{pre}.att_src"], -1)  # (B, N, heads)
        ed = np.sum(xp * p[f"{pre}.att_dst"], -1)
        pre_act = ed[:, :, None, :] + es[:, None, :, :]  # (B, i, j, heads)
        logit = np.where(pre_act > 0, pre_act, _GAT_SLOPE * pre_act)
        keep = (adj + np.eye(N)) > 0
        alpha, _ = softmax_lse(np.where(keep[..., None], logit, -np.inf), axis=2)
        out = np.einsum("bijh,bjhc->bihc", alpha, xp).reshape(B, N, C) + p[f"{pre}.bias"]
        return out, (xp, pre_act, alpha)
    vals = np.where(adj[..., None] > 0, x[:, None, :, :], -np.inf)  # (B, i, j, C)
    idx = np.argmax(vals, axis=2)
    has = adj.sum(-1) > 0
    mx = np.where(has[..., None], np.take_along_axis(vals, idx[:, :, None, :], axis=2)[:, :, 0], 0.0)
    out = mx @ p[f"{pre}.lin_l.weight"] + p[f"{pre}.lin_l.bias"] + x @ p[f"{pre}.lin_r.weight"]
    return out, (mx, idx, has)


def _gnn_backward(op, pre, dH, gc, x, adj, p, grads):
    """Accumulate one candidate's parameter gradients into ``grads``; return its ``dx``."""
    if op == "GCN":
        dxw = np.swapaxes(gc, -1, -2) @ dH
        grads[f"{pre}.lin.weight"] = np.einsum("bnc,bnd->cd", x, dxw)
        grads[f"{pre}.bias"] = dH.sum(axis=(0, 1))
        return dxw @ p[f"{pre}.lin.weight"].T
    if op == "GIN":
        z, u, r = gc
        grads[f"{pre}.nn.2.weight"] = np.einsum("bnc,bnd->cd", r, dH)
        grads[f"{pre}.nn.2.bias"] = dH.sum(axis=(0, 1))
        du = (dH @ p[f"{pre}.nn.2.weight"].T) * (u > 0)
        grads[f"{pre}.nn.0.weight"] = np.einsum("bnc,bnd->cd", z, du)
        grads[f"{pre}.nn.0.bias"] = du.sum(axis=(0, 1))
        dz = du @ p[f"{pre}.nn.0.weight"].T
        return dz + np.swapaxes(adj, -1, -2) @ dz
    B, N, C = x.shape
    if op == "GAT":
        xp, pre_act, alpha = gc
        grads[f"{pre}.bias"] = dH.sum(axis=(0, 1))
        do = dH.reshape(xp.shape)
        dalpha = np.einsum("bihc,bjhc->bijh", do, xp)
        dxp = np.einsum("bijh,bihc->bjhc", alpha, do)
        dlogit = softmax_vjp(alpha, dalpha, axis=2)
        dpre = dlogit * np.where(pre_act > 0, 1.0, _GAT_SLOPE).astype(dlogit.dtype)
        ded, des = dpre.sum(axis=2), dpre.sum(axis=1)  # (B, N, heads)
        grads[f"{pre}.att_src"] = np.einsum("bnh,bnhc->hc", des, xp)[None]
        grads[f"{pre}.att_dst"] = np.einsum("bnh,bnhc->hc", ded, xp)[None]
        dxp = dxp + des[..., None] * p[f"{pre}.att_src"] + ded[..., None] * p[f"{pre}.att_dst"]
        dxp = dxp.reshape(B, N, C)
        grads[f"{pre}.lin.weight"] = np.einsum("bnc,bnd->cd", x, dxp)
        return dxp @ p[f"{pre}.lin.weight"].T
    mx, idx, has = gc
    grads[f"{pre}.lin_l.weight"] = np.einsum("bnc,bnd->cd", mx, dH)
    grads[f"{pre}.lin_l.bias"] = dH.sum(axis=(0, 1))
    grads[f"{pre}.lin_r.weight"] = np.einsum("bnc,bnd->cd", x, dH)
    dmx = (dH @ p[f"{pre}.lin_l.weight"].T) * has[..., None]
    onehot = (np.arange(N)[None, None, :, None] == idx[:, :, None, :])  # (B, i, j, C): the selected neighbour
    return dH @ p[f"{pre}.lin_r.weight"].T + np.einsum("bijc,bic->bjc", onehot, dmx)


def _validate(x, adj, params, num_heads, candidates):
    x = as_float(x, "x", ndim=3)
    B, N, C = x.shape
    adj = np.asarray(adj)
    if adj.shape != (B, N, N):
        raise ValueError(f"adj must have shape (B, N, N) = {(B, N, N)}; got {adj.shape}")
    if not np.isin(adj, (0, 1)).all():
        raise ValueError("adj must hold 0/1 entries (A[b, i, j] = 1 for an edge j -> i)")
    H = check_int(num_heads, "num_heads", minimum=1)
    if C % H:
        raise ValueError(f"num_heads={H} must divide the feature width C={C} (torch MultiheadAttention)")
    if isinstance(candidates, str) or not len(candidates):
        raise TypeError(f"candidates must be a non-empty sequence of names from {DARTS_GT_CANDIDATES}")
    for op in candidates:
        check_choice(op, "candidates", DARTS_GT_CANDIDATES)
    p = check_params(params, _spec(C, tuple(candidates), H), where="darts_gt_asymmetric_attention")
    return x, adj.astype(x.dtype), cast_all(x.dtype, p), H, tuple(candidates)


def _gcn_norm(adj):
    a = adj + np.eye(adj.shape[-1], dtype=adj.dtype)
    r = 1.0 / np.sqrt(a.sum(axis=-1))
    return r[..., :, None] * a * r[..., None, :]


def darts_gt_attention_forward(x, adj, params, *, num_heads: int, candidates=DARTS_GT_CANDIDATES):
    r"""Asymmetric DARTS-GT attention on node features ``x (B, N, C)`` with adjacency ``adj (B, N, N)``
    (0/1, ``adj[b, i, j] = 1`` for an edge ``j -> i``; not differentiated).

    ``params`` (upstream names, linear weights ``(in, out)`` = torch ``weight.T``):
    ``input_choice.alpha (n_ops,)``; per candidate ``i``: GIN ``kv_model.i.nn.0.weight/bias``,
    ``kv_model.i.nn.2.weight/bias``; GCN ``kv_model.i.lin.weight``, ``kv_model.i.bias``; GAT
    ``kv_model.i.lin.weight``, ``kv_model.i.att_src/att_dst (1, H, C/H)``, ``kv_model.i.bias``; SAGE
    ``kv_model.i.lin_l.weight/bias``, ``kv_model.i.lin_r.weight``; and
    ``self_attn.{q,k,v,out}_proj`` with ``_bias`` (torch's ``in_proj_weight`` split in three and
    transposed). Returns ``(y (B, N, C), cache)``."""
    x, adj, p, H, cands = _validate(x, adj, params, num_heads, candidates)
    hs, caches = [], []
    for i, op in enumerate(cands):
        hi, gc = _gnn_forward(op, f"kv_model.{i}", x, adj, p, H)
        hs.append(hi)
        caches.append(gc)
    h = np.stack(hs, axis=1)  # (B, n_ops, N, C)
    axes = (1, 2, 3)
    M = h[0].size
    mu = h.mean(axis=axes, keepdims=True)
    c = h - mu
    s = np.sqrt(np.sum(c * c, axis=axes, keepdims=True) / (M - 1))
    e = c / (s + _STD_EPS)
    w, _ = softmax_lse(p["input_choice.alpha"])
    kv = np.einsum("o,bonc->bnc", w, e)
    mp = {n: p[f"self_attn.{n}"] for n in _MHA} | {f"{n}_bias": p[f"self_attn.{n}_bias"] for n in _MHA}
    y, mc = mha_forward(x, kv, mp, num_heads=H)
    cache = {"x": x, "adj": adj, "p": p, "cands": cands, "gnn": caches, "c": c, "s": s, "e": e, "w": w, "M": M,
             "mha": mc, "shape": y.shape, "dtype": x.dtype}
    return y, cache


def darts_gt_attention_backward(dout, cache) -> dict:
    """Gradients of :func:`darts_gt_attention_forward` w.r.t. ``x`` and every parameter."""
    dt = cache["dtype"]
    g = as_dout(dout, cache["shape"], dt)
    p, x, adj = cache["p"], cache["x"], cache["adj"]
    mg = mha_backward(g, cache["mha"])
    grads = {f"self_attn.{k}": v for k, v in mg.items() if k not in ("x", "context")}
    dx = mg["x"]
    dkv = mg["context"]
    w, e, c, s, M = cache["w"], cache["e"], cache["c"], cache["s"], cache["M"]
    grads["input_choice.alpha"] = softmax_vjp(w, np.einsum("bnc,bonc->o", dkv, e))
    de = w[None, :, None, None] * dkv[:, None]
    axes = (1, 2, 3)
    se = s + _STD_EPS
    dh = (de - de.mean(axis=axes, keepdims=True)) / se \
        - np.sum(de * c, axis=axes, keepdims=True) / se**2 * c / ((M - 1) * s)
    for i, op in enumerate(cache["cands"]):
        dx = dx + _gnn_backward(op, f"kv_model.{i}", dh[:, i], cache["gnn"][i], x, adj, p, grads)
    out = {"x": np.asarray(dx, dtype=dt)}
    out.update({k: np.asarray(grads[k], dtype=dt) for k in p})
    return out


def darts_gt_attention(x, adj, params, *, num_heads: int, candidates=DARTS_GT_CANDIDATES) -> np.ndarray:
    """Convenience wrapper: the output of :func:`darts_gt_attention_forward`."""
    return darts_gt_attention_forward(x, adj, params, num_heads=num_heads, candidates=candidates)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _darts_params(rng, C, cands, heads):
    p = {}
    for k, shape in _spec(C, cands, heads).items():
        p[k] = rng.standard_normal(shape) / (np.sqrt(C) if len(shape) == 2 else 2.0)
    return p


def _selection_margin(s):
    """Distance of every non-smooth selection from its switch: GIN's relu inputs, GAT's leaky-relu
    inputs on kept pairs, and SAGE's gap between the two largest neighbour values."""
    x, adj, p = s.inputs["x"], s.config["adj"], s.params
    cands = s.config.get("candidates", DARTS_GT_CANDIDATES)
    N = x.shape[1]
    margin = np.inf
    for i, op in enumerate(cands):
        _, gc = _gnn_forward(op, f"kv_model.{i}", x, adj, p, s.config["num_heads"])
        if op == "GIN":
            margin = min(margin, float(np.abs(gc[1]).min()))
        elif op == "GAT":
            keep = np.broadcast_to(((adj + np.eye(N)) > 0)[..., None], gc[1].shape)
            margin = min(margin, float(np.abs(gc[1][keep]).min()))
        elif op == "SAGE":
            vals = np.sort(np.where(adj[..., None] > 0, x[:, None, :, :], -np.inf), axis=2)
            two = np.broadcast_to((adj.sum(-1) >= 2)[..., None], vals.shape[:2] + vals.shape[3:])
            if two.any():
                with np.errstate(invalid="ignore"):  # rows with < 2 neighbours hold -inf - -inf; masked out
                    gap = vals[:, :, -1] - vals[:, :, -2]
                margin = min(margin, float(gap[two].min()))
    return margin


def _sample_darts(rng, size):
    B, N, C, H = (2, 4, 2, 1) if size == "tiny" else (2, 7, 6, 2)

    def draw(r):
        adj = (r.random((B, N, N)) < 0.4).astype(float)
        adj = np.maximum(adj, np.swapaxes(adj, 1, 2)) * (1 - np.eye(N))
        return Sample(inputs={"x": r.standard_normal((B, N, C))},
                      params=_darts_params(r, C, DARTS_GT_CANDIDATES, H), config={"adj": adj, "num_heads": H})

    return draw_until(rng, draw, _selection_margin, 1e-3)


def _edgewise_candidates(x, adj, p, heads):
    """The four candidates written edge by edge as PyG message passing (edges j -> i)."""
    N, C = x.shape
    c = C // heads
    nb = [list(np.nonzero(adj[i])[0]) for i in range(N)]
    deg = 1 + adj.sum(1)
    gin, gcn, gat, sage = (np.zeros((N, C)) for _ in range(4))
    xw = x @ p["kv_model.1.lin.weight"]
    xa = (x @ p["kv_model.2.lin.weight"]).reshape(N, heads, c)
    for i in range(N):
        gin[i] = x[i] + sum((x[j] for j in nb[i]), np.zeros(C))
        for j in nb[i] + [i]:
            gcn[i] += xw[j] / np.sqrt(deg[i] * deg[j])
        for h in range(heads):
            src = nb[i] + [i]
            e = np.array([xa[i, h] @ p["kv_model.2.att_dst"][0, h] + xa[j, h] @ p["kv_model.2.att_src"][0, h]
                          for j in src])
            e = np.where(e > 0, e, _GAT_SLOPE * e)
            w = np.exp(e - e.max())
            gat[i, h * c:(h + 1) * c] = (w / w.sum()) @ xa[src, h]
        sage[i] = np.max(x[nb[i]], axis=0) if nb[i] else 0.0
    gin = np.maximum(gin @ p["kv_model.0.nn.0.weight"] + p["kv_model.0.nn.0.bias"], 0) @ p["kv_model.0.nn.2.weight"] \
        + p["kv_model.0.nn.2.bias"]
    gcn += p["kv_model.1.bias"]
    gat += p["kv_model.2.bias"]
    sage = sage @ p["kv_model.3.lin_l.weight"] + p["kv_model.3.lin_l.bias"] + x @ p["kv_model.3.lin_r.weight"]
    return np.stack([gin, gcn, gat, sage])


def _check_message_passing_explicit(rng):
    """GIN, GCN, GAT and SAGE(max) written edge by edge (PyG message passing over edges j -> i)
    equal the dense forms inside the layer: with alpha saturated on one candidate, the layer
    equals MHA over that candidate's standardised edge-wise output."""
    s = _sample_darts(rng, "small")
    x, adj, p = s.inputs["x"][:1], s.config["adj"][:1], dict(s.params)
    hh = _edgewise_candidates(x[0], adj[0], p, 2)
    e = (hh - hh.mean()) / (hh.std(ddof=1) + _STD_EPS)
    mp = {n: p[f"self_attn.{n}"] for n in _MHA} | {f"{n}_bias": p[f"self_attn.{n}_bias"] for n in _MHA}
    err = 0.0
    for k in range(4):
        p["input_choice.alpha"] = np.where(np.arange(4) == k, 80.0, -80.0)
        y = darts_gt_attention(x, adj, p, num_heads=2)
        err = max(err, float(np.abs(y - mha_forward(x, e[k][None], mp, num_heads=2)[0]).max()))
    assert err < 1e-12, err
    return err


def _check_gat_sage_gradcheck_two_heads(rng):
    """Gradcheck of the GAT (two attention heads) and SAGE candidates alone, with an isolated node
    (SAGE's empty max is 0, as PyG's scatter-max fill)."""
    B, N, C, H = 2, 3, 2, 2

    def draw(r):
        adj = np.ones((B, N, N)) - np.eye(N)
        adj[:, 2, :] = 0.0
        adj[:, :, 2] = 0.0
        return Sample(inputs={"x": r.standard_normal((B, N, C))}, params=_darts_params(r, C, ("GAT", "SAGE"), H),
                      config={"adj": adj, "num_heads": H, "candidates": ("GAT", "SAGE")})

    s = draw_until(rng, draw, _selection_margin, 1e-3)
    err = fd_max_rel(darts_gt_attention_forward, darts_gt_attention_backward, s)
    assert err < 1e-6, err
    return err


register(
    Mechanism(
        slug="darts_gt_asymmetric_attention", family="4-linear-kernel-sparse", tier="T3",
        title="DARTS-GT: asymmetric graph-transformer attention with searched GNN keys/values",
        paper="Chakraborty & Minary, 'DARTS-GT: Differentiable Architecture Search for Graph Transformers with "
              "Quantifiable Instance-Specific Interpretability Analysis', 2025, arXiv 2510.14336",
        official_code="shrutiOx/DARTS_GT DARTS_GT_LRGB/dartsgt/layer/NAS_layer.py"
                      "@41e59ded4abec9d50fff588b14e5a9a1af0ba44a",
        forward=darts_gt_attention_forward, backward=darts_gt_attention_backward, sample=_sample_darts,
        checks={"message_passing_explicit": _check_message_passing_explicit,
                "gradcheck_gat_sage_two_heads": _check_gat_sage_gradcheck_two_heads},
        docs="linear/l6b.md#darts-gt-asymmetric-attention",
    ),
)
