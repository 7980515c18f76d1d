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
every candidate operator $o$ (upstream ``kv_model[o]``; refattn provides the two candidates of the
code's first operator set that take no edge features, ``"GCN"`` and ``"GIN"``) gives
$H_o = \mathrm{GNN}_o(X)$:

* ``GCN`` (PyG ``GCNConv``): $H = \hat A\,XW + b$, $\hat A = \tilde D^{-1/2}(A+I)\tilde D^{-1/2}$,
  $\tilde D_{ii} = 1 + \sum_jA_{ij}$ (in-degree);
* ``GIN`` (PyG ``GINConv``, $\epsilon = 0$): $H = \mathrm{relu}((X + AX)W_0 + b_0)W_2 + b_2$.

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
(the relu's selection held fixed; samplers keep $|u|$ away from 0).

Measured agreement with upstream: the code needs ``torch_geometric``, ``torch_scatter`` and ``nni``
(not installable here), so ``NASLayer``'s KV path was transcribed in a float64 torch scratch script
(PyG ``GCNConv``/``GINConv`` message passing written with ``index_add_`` over an edge list, the
standardisation and softmax mixture as in the file) feeding the real
``torch.nn.MultiheadAttention``; $N=7$, $C=6$, 2 heads, batch of 2 graphs processed one by one,
weights copied: output max abs error 4.4e-16 (rel 2.7e-16), gradients of $X$ and every
parameter max rel 4.9e-16 (the key-projection bias, whose exact gradient is 0 since softmax ignores
it, is ~1e-16 in both: abs difference 2.2e-16).

Conventions and what is not provided: upstream standardises over the whole PyG batch (all graphs
at once); refattn does it per batch entry (identical for one graph per call, and it keeps batch
entries independent). Dropouts are off (eval). The KV normalisation ``norm1_kv`` (BatchNorm by
default), the residual, ``norm1_attn`` and the feed-forward block of ``NASLayer``, and the other
candidates (``GAT``, ``SAGE``, and the edge-feature set ``GINE``, ``CustomGatedGCN``, ``GATV2``)
are not provided; nor is the causal-ablation interpretability analysis (not a layer).
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_choice, check_int, check_params
from ...nn.softmax import softmax_lse, softmax_vjp
from ...registry import Mechanism, Sample, register
from ..softmax.mha import mha_backward, mha_forward
from ._samples import draw_until, fd_max_rel

__all__ = ["DARTS_GT_CANDIDATES", "darts_gt_attention_forward", "darts_gt_attention_backward", "darts_gt_attention"]

DARTS_GT_CANDIDATES = ("GCN", "GIN")
_STD_EPS = 1e-8
_MHA = ("q_proj", "k_proj", "v_proj", "out_proj")


def _spec(C, candidates):
    spec = {"input_choice.alpha": (len(candidates),)}
    for i, op in enumerate(candidates):
        if op == "GCN":
            spec.update({f"kv_model.{i}.lin.weight": (C, C), f"kv_model.{i}.bias": (C,)})
        else:
            spec.update({f"kv_model.{i}.nn.0.weight": (C, C), f"kv_model.{i}.nn.0.bias": (C,),
                         f"kv_model.{i}.nn.2.weight": (C, C), f"kv_model.{i}.nn.2.bias": (C,)})
    for n in _MHA:
        spec[f"self_attn.{n}"] = (C, C)
        spec[f"self_attn.{n}_bias"] = (C,)
    return spec


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
    p = check_params(params, _spec(C, tuple(candidates)), where="darts_gt_asymmetric_attention")
    return x, adj.astype(x.dtype), cast_all(x.dtype, p), H, tuple(candidates)


def _gcn_norm(adj):
    a = adj + np.eye(adj.shape[-1], dtype=adj.dtype)
    r = 1.0 / np.sqrt(a.sum(axis=-1))
    return r[..., :, None] * a * r[..., None, :]


def darts_gt_attention_forward(x, adj, params, *, num_heads: int, candidates=DARTS_GT_CANDIDATES):
    r"""Asymmetric DARTS-GT attention on node features ``x (B, N, C)`` with adjacency ``adj (B, N, N)``
    (0/1, ``adj[b, i, j] = 1`` for an edge ``j -> i``; not differentiated).

    ``params`` (upstream names, linear weights ``(in, out)`` = torch ``weight.T``):
    ``input_choice.alpha (n_ops,)``; per candidate ``i``: GCN ``kv_model.i.lin.weight``,
    ``kv_model.i.bias``; GIN ``kv_model.i.nn.0.weight/bias``, ``kv_model.i.nn.2.weight/bias``; and
    ``self_attn.{q,k,v,out}_proj`` with ``_bias`` (torch's ``in_proj_weight`` split in three and
    transposed). Returns ``(y (B, N, C), cache)``."""
    x, adj, p, H, cands = _validate(x, adj, params, num_heads, candidates)
    hs, caches = [], []
    for i, op in enumerate(cands):
        if op == "GCN":
            ahat = _gcn_norm(adj)
            xw = x @ p[f"kv_model.{i}.lin.weight"]
            hs.append(ahat @ xw + p[f"kv_model.{i}.bias"])
            caches.append(ahat)
        else:
            z = x + adj @ x
            u = z @ p[f"kv_model.{i}.nn.0.weight"] + p[f"kv_model.{i}.nn.0.bias"]
            r = np.maximum(u, 0.0)
            hs.append(r @ p[f"kv_model.{i}.nn.2.weight"] + p[f"kv_model.{i}.nn.2.bias"])
            caches.append((z, u, r))
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
        dH = dh[:, i]
        if op == "GCN":
            ahat = cache["gnn"][i]
            dxw = np.swapaxes(ahat, -1, -2) @ dH
            W = p[f"kv_model.{i}.lin.weight"]
            grads[f"kv_model.{i}.lin.weight"] = np.einsum("bnc,bnd->cd", x, dxw)
            grads[f"kv_model.{i}.bias"] = dH.sum(axis=(0, 1))
            dx = dx + dxw @ W.T
        else:
            z, u, r = cache["gnn"][i]
            W0, W2 = p[f"kv_model.{i}.nn.0.weight"], p[f"kv_model.{i}.nn.2.weight"]
            grads[f"kv_model.{i}.nn.2.weight"] = np.einsum("bnc,bnd->cd", r, dH)
            grads[f"kv_model.{i}.nn.2.bias"] = dH.sum(axis=(0, 1))
            du = (dH @ W2.T) * (u > 0)
            grads[f"kv_model.{i}.nn.0.weight"] = np.einsum("bnc,bnd->cd", z, du)
            grads[f"kv_model.{i}.nn.0.bias"] = du.sum(axis=(0, 1))
            dz = du @ W0.T
            dx = dx + dz + np.swapaxes(adj, -1, -2) @ dz
    out = {"x": dx}
    out.update({k: np.asarray(grads[k], dtype=dt) for k in p})
    return out


def darts_gt_attention(x, adj, params, *, num_heads: int, candidates=DARTS_GT_CANDIDATES) -> np.ndarray:
    """Convenience wrapper: the output of :func:`darts_gt_attention_forward`."""
    return darts_gt_attention_forward(x, adj, params, num_heads=num_heads, candidates=candidates)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _darts_params(rng, C, cands):
    p = {}
    for k, shape in _spec(C, cands).items():
        p[k] = rng.standard_normal(shape) / (np.sqrt(C) if len(shape) == 2 else 2.0)
    return p


def _gin_margin(s):
    x, adj, p = s.inputs["x"], s.config["adj"], s.params
    u = (x + adj @ x) @ p["kv_model.1.nn.0.weight"] + p["kv_model.1.nn.0.bias"]
    return float(np.abs(u).min())


def _sample_darts(rng, size):
    B, N, C, H = (2, 4, 2, 1) if size == "tiny" else (2, 7, 6, 2)

    def draw(r):
        adj = (r.random((B, N, N)) < 0.4).astype(float)
        adj = np.maximum(adj, np.swapaxes(adj, 1, 2)) * (1 - np.eye(N))
        return Sample(inputs={"x": r.standard_normal((B, N, C))}, params=_darts_params(r, C, DARTS_GT_CANDIDATES),
                      config={"adj": adj, "num_heads": H})

    return draw_until(rng, draw, _gin_margin, 1e-3)


def _check_message_passing_explicit(rng):
    """GCN and GIN written edge by edge (PyG message passing: a loop over edges j -> i with the
    symmetric degree normalisation / the sum aggregation) equal the dense forms inside the layer:
    with alpha strongly favouring one candidate, the layer equals MHA over that candidate's
    standardised output."""
    s = _sample_darts(rng, "small")
    x, adj, p = s.inputs["x"][:1], s.config["adj"][:1], dict(s.params)
    N, C = x.shape[1:]
    deg = 1 + adj[0].sum(1)
    gcn = np.zeros((N, C))
    gin_z = x[0].copy()
    xw = x[0] @ p["kv_model.0.lin.weight"]
    for i in range(N):
        for j in list(np.nonzero(adj[0, i])[0]) + [i]:
            gcn[i] += xw[j] / np.sqrt(deg[i] * deg[j])
        for j in np.nonzero(adj[0, i])[0]:
            gin_z[i] += x[0, j]
    gcn += p["kv_model.0.bias"]
    gin = np.maximum(gin_z @ p["kv_model.1.nn.0.weight"] + p["kv_model.1.nn.0.bias"], 0) @ p["kv_model.1.nn.2.weight"] \
        + p["kv_model.1.nn.2.bias"]
    err = 0.0
    hh = np.stack([gcn, gin])
    e = (hh - hh.mean()) / (hh.std(ddof=1) + _STD_EPS)
    for k in (0, 1):
        p["input_choice.alpha"] = np.where(np.arange(2) == k, 60.0, -60.0)
        y = darts_gt_attention(x, adj, p, num_heads=2)
        mp = {n: p[f"self_attn.{n}"] for n in _MHA} | {f"{n}_bias": p[f"self_attn.{n}_bias"] for n in _MHA}
        ref = mha_forward(x, e[k][None], mp, num_heads=2)[0]
        err = max(err, float(np.abs(y - ref).max()))
    assert err < 1e-12, err
    return err


def _check_alpha_gradcheck_single_op(rng):
    """A single GCN candidate (softmax over one op is 1): gradcheck of x and the GCN/MHA weights."""
    B, N, C = 2, 4, 2
    adj = np.ones((B, N, N)) - np.eye(N)
    s = Sample(inputs={"x": rng.standard_normal((B, N, C))}, params=_darts_params(rng, C, ("GCN",)),
               config={"adj": adj, "num_heads": 2, "candidates": ("GCN",)})
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
                "gradcheck_single_gcn_candidate": _check_alpha_gradcheck_single_op},
        docs="linear/l6b.md#darts-gt-asymmetric-attention",
    ),
)
