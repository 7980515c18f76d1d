r"""HodgeFormer: multi-head attention heads as learned discrete Hodge stars on a triangle mesh.

Paper: Akis Nousias, Stavros Nousias, "HodgeFormer: Transformers for Learnable Operators on
Triangular Meshes through Data-Driven Hodge Matrices", WACV 2026, arXiv 2509.01839. Upstream:
hodgeformer/hodgeformer ``packages/mesh_opformer/src/mesh_opformer/layers/attention_hodge.py`` @
3d6d5271ad1b4d029fea7a818a0b6e0ebfdfbccb (``MeshMultiHeadHodgeAttention``, ``mesh_attention_{v,e,f}``,
``hodge_diagonal_ops``, ``hodge_full_ops``).

Which part of the model this is: the attention layer of a HodgeFormer block (the blocks add
residuals, norms and feed-forwards around it, and the model embeds vertex/edge/face features).

The layer
---------
Vertex, edge and face features $x_v\in\mathbb R^{n\times c}$, $x_e\in\mathbb R^{m\times c}$,
$x_f\in\mathbb R^{k\times c}$ and the signed incidence matrices $d_0\in\mathbb R^{m\times n}$,
$d_1\in\mathbb R^{k\times m}$ (fixed inputs). Per element type $s$ and head $h$:
$Q_s = \mathrm{LN}(x_sW^Q_s)$, $K_s = \mathrm{LN}(x_sW^K_s)$ (LayerNorm over the head width
without affine; ``attn_sym=True``, the upstream default, uses $K_s = Q_s$), $V_s = x_sW^V_s$.
A Hodge star $\star_s$ built from $(Q_s, K_s)$ acts on a cochain $u$ (``hodge_type``):

* ``"diag"``: $\star u = \mathrm{diag}(\sigma)\,u$ with $\sigma_i = q_i\cdot k_i/\sqrt{d}$, and
  $\star^{-1}u = \mathrm{diag}(1/(\sigma+\epsilon))\,u$ ($\epsilon = 10^{-6}$);
* ``"full"``: $\star u = \mathrm{softmax}(QK^\top/\sqrt d)\,u$ and
  $\star^{-1}u = \mathrm{softmax}(KQ^\top/\sqrt d)\,u$ (no explicit inverse; upstream's convention).

The three operators (the DEC Hodge Laplacians, upstream's order of application):

$$y_v = \star_0^{-1}d_0^\top\star_1 d_0 V_v,\qquad
y_e = \star_1^{-1}d_1^\top\star_2 d_1 V_e + d_0\star_0^{-1}d_0^\top\star_1 V_e,\qquad
y_f = d_1\star_1^{-1}d_1^\top\star_2 V_f,$$

then per type the heads are merged and $\text{out}_s = y_sW^O_s + b^O_s$ for $s$ in ``modes``;
an element type not in ``modes`` is passed through unchanged (upstream's ``nn.Identity``).

Backward
--------
Each operator is a chain of incidence products and Hodge stars, so the backward walks the chain in
reverse: an incidence product $u\mapsto Du$ has VJP $\bar u = D^\top\bar y$. A diagonal star
$y = r\odot u$ ($r = \sigma$ or $1/(\sigma+\epsilon)$) gives $\bar u = r\odot\bar y$,
$\bar r_i = \sum_c\bar y_{ic}u_{ic}$, $\bar\sigma = \bar r$ (or $-\bar r\,r^2$ for the inverse) and
$\bar q_i \mathrel{+}= \bar\sigma_i k_i/\sqrt d$, $\bar k_i \mathrel{+}= \bar\sigma_i q_i/\sqrt d$. A full
star is softmax attention with values $u$ (queries $Q$, keys $K$, or swapped for the inverse) and
uses the attention VJP (``refattn.attention.softmax.attention_core_backward``). The gradients on
$Q_s, K_s$ are summed over every star that uses them (with ``attn_sym``, $\bar Q_s$ collects both),
pass the LayerNorm VJP (``refattn.nn.norms.normalize_backward``) and the projection VJPs.
$d_0, d_1$ are fixed combinatorial inputs (no gradient).

Conventions (keywords, upstream defaults)
-----------------------------------------
``modes=("v", "e")``, ``attn_sym=True``, ``norm_type="layer_norm"`` (``None``: no norm),
``hodge_type``: upstream's default is ``"grouped"`` (sparse attention over precomputed local
neighbourhoods) — here the two dense forms ``"diag"`` (default) and ``"full"`` are implemented;
``"grouped"`` and ``"full-linear"`` (Flowformer linear attention) are not. Dropout is the identity.
All three element types share the width ``c`` here (upstream allows $d_v, d_e, d_f$ to differ).
Parameter keys follow upstream: ``{v,e,f}_linears.{0,1,2}.weight`` for $W^Q, W^K, W^V$ (only those
upstream creates for the given ``modes``/``attn_sym``), ``{v,e,f}_linear_out.weight``/``.bias``.
The output is ``concat([out_v, out_e, out_f], axis=1)`` (upstream returns the tuple; split with
:func:`hodgeformer_split`).

Agreement with upstream (float64, CPU, torch 2.13): a scratch torch transcription of
``MeshMultiHeadHodgeAttention.forward`` and ``mesh_attention_{v,e,f}`` with the dense Hodge types
(einops not installed), weights copied, on the boundary of a tetrahedron: 24 configurations
(modes (v,e), (v,e,f), (f); ``attn_sym`` on/off; LayerNorm on/off; diag/full) agree to at most
9.8e-12 absolute (1.5e-14 relative) in the output and 8.2e-10 absolute (3.3e-12 relative to the
compared array's largest entry) in every gradient.

Discretisation: HodgeFormer is a shape-analysis layer on a given mesh; the paper claims no
discretisation invariance, so no refinement test applies.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_choice, check_int, check_params, compute_dtype
from ..attention.softmax import attention_core_backward, attention_core_forward
from ..nn.linear import merge_heads, split_heads
from ..nn.norms import normalize_backward, normalize_forward
from ..registry import Mechanism, Sample, register

__all__ = [
    "hodgeformer_forward",
    "hodgeformer_backward",
    "hodgeformer_hodge_attention",
    "hodgeformer_split",
    "hodgeformer_init_params",
]

# Which of W^Q, W^K, W^V exist per element type (rows v, e, f) for each mode (upstream tables).
_LINEARS = {"v": [[1, 1, 1], [1, 1, 0], [0, 0, 0]], "e": [[1, 1, 0], [1, 1, 1], [1, 1, 0]],
            "f": [[0, 0, 0], [1, 1, 0], [1, 1, 1]]}
_LINEARS_SYM = {"v": [[1, 0, 1], [1, 0, 0], [0, 0, 0]], "e": [[1, 0, 0], [1, 0, 1], [1, 0, 0]],
                "f": [[0, 0, 0], [1, 0, 0], [1, 0, 1]]}
_TYPES = ("v", "e", "f")
_EPS_INV = 1e-6
_LN_EPS = 1e-5


def _layout(modes, attn_sym):
    table = _LINEARS_SYM if attn_sym else _LINEARS
    rows = [[0, 0, 0] for _ in range(3)]
    for mode in modes:
        rows = [[a or b for a, b in zip(r, t)] for r, t in zip(rows, table[mode])]
    return {s: rows[i] for i, s in enumerate(_TYPES)}


def _spec(c, modes, attn_sym):
    spec = {}
    for s, row in _layout(modes, attn_sym).items():
        for j, on in enumerate(row):
            if on:
                spec[f"{s}_linears.{j}.weight"] = (c, c)
    for s in modes:
        spec[f"{s}_linear_out.weight"] = (c, c)
        spec[f"{s}_linear_out.bias"] = (c,)
    return spec


def _chains(modes):
    """Per mode, the list of chains (value type, steps); a step is ("d0"|"d0t"|"d1"|"d1t") or
    ("star", type, inverse)."""
    out = {}
    if "v" in modes:
        out["v"] = [("v", ["d0", ("star", "e", False), "d0t", ("star", "v", True)])]
    if "e" in modes:
        out["e"] = [("e", ["d1", ("star", "f", False), "d1t", ("star", "e", True)]),
                    ("e", [("star", "e", False), "d0t", ("star", "v", True), "d0"])]
    if "f" in modes:
        out["f"] = [("f", [("star", "f", False), "d1t", ("star", "e", True), "d1"])]
    return out


def _inc(u, mat):
    return np.einsum("bmn,bhnd->bhmd", mat, u)


def _star_forward(u, q, k, inverse, hodge_type):
    if hodge_type == "diag":
        sig = np.sum(q * k, axis=-1) / float(np.sqrt(q.shape[-1]))
        r = 1.0 / (sig + _EPS_INV) if inverse else sig
        return r[..., None] * u, {"r": r, "u": u}
    y, c = attention_core_forward(k, q, u) if inverse else attention_core_forward(q, k, u)
    return y, {"att": c}


def _star_backward(dy, c, q, k, inverse, hodge_type):
    """Returns (du, dq, dk)."""
    if hodge_type == "diag":
        r = c["r"]
        dr = np.sum(dy * c["u"], axis=-1)
        dsig = -dr * r * r if inverse else dr
        sc = float(1.0 / np.sqrt(q.shape[-1]))
        return r[..., None] * dy, dsig[..., None] * k * sc, dsig[..., None] * q * sc
    g = attention_core_backward(dy, c["att"])
    return (g["v"], g["k"], g["q"]) if inverse else (g["v"], g["q"], g["k"])


def hodgeformer_forward(x_v, x_e, x_f, params, *, d0, d1, n_head: int, modes=("v", "e"),
                        attn_sym: bool = True, norm_type="layer_norm", hodge_type: str = "diag"):
    r"""HodgeFormer mesh Hodge attention (``MeshMultiHeadHodgeAttention`` with a dense Hodge type).

    Parameters
    ----------
    x_v, x_e, x_f : arrays (B, n, c), (B, m, c), (B, k, c)
        Vertex, edge and face features (one width ``c``).
    params : dict
        ``{v,e,f}_linears.{0,1,2}.weight`` (c, c) for Q/K/V where upstream creates them,
        ``{s}_linear_out.weight`` (c, c) and ``.bias`` (c,) for ``s`` in ``modes``
        (PyTorch ``weight.T``).
    d0, d1 : arrays (B, m, n), (B, k, m)
        Signed incidence matrices (fixed; no gradient).
    n_head : int
    modes : tuple of {"v", "e", "f"}
    attn_sym : bool
        ``True`` (upstream default): $K_s = Q_s$, so each star is symmetric.
    norm_type : {"layer_norm", None}
    hodge_type : {"diag", "full"}

    Returns
    -------
    out (B, n + m + k, c): ``[out_v; out_e; out_f]`` (types not in ``modes`` passed through), cache
    """
    if not isinstance(modes, (tuple, list)) or not modes or any(m not in _TYPES for m in modes) \
            or len(set(modes)) != len(modes):
        raise ValueError(f"modes must be a non-empty tuple of distinct 'v', 'e', 'f'; got {modes!r}")
    modes = tuple(modes)
    if not isinstance(attn_sym, (bool, np.bool_)):
        raise TypeError(f"attn_sym must be a bool; got {type(attn_sym).__name__}")
    if norm_type is not None:
        check_choice(norm_type, "norm_type", ("layer_norm",))
    check_choice(hodge_type, "hodge_type", ("diag", "full"))
    xs = {"v": as_float(x_v, "x_v", ndim=3), "e": as_float(x_e, "x_e", ndim=3), "f": as_float(x_f, "x_f", ndim=3)}
    b, c = xs["v"].shape[0], xs["v"].shape[2]
    for s in "ef":
        if xs[s].shape[0] != b or xs[s].shape[2] != c:
            raise ValueError(f"x_{s} must have shape (B={b}, *, c={c}); got {xs[s].shape}")
    n, m, k = xs["v"].shape[1], xs["e"].shape[1], xs["f"].shape[1]
    d0 = as_float(d0, "d0", ndim=3)
    d1 = as_float(d1, "d1", ndim=3)
    if d0.shape != (b, m, n):
        raise ValueError(f"d0 must have shape (B, m, n) = {(b, m, n)}; got {d0.shape}")
    if d1.shape != (b, k, m):
        raise ValueError(f"d1 must have shape (B, k, m) = {(b, k, m)}; got {d1.shape}")
    n_head = check_int(n_head, "n_head", minimum=1)
    if c % n_head:
        raise ValueError(f"the width c={c} must be divisible by n_head={n_head}")
    p = check_params(params, _spec(c, modes, bool(attn_sym)))
    dt = compute_dtype(*xs.values(), *p.values())
    xs = {s: a.astype(dt, copy=False) for s, a in xs.items()}
    p = cast_all(dt, p)
    mats = {"d0": d0.astype(dt), "d0t": np.swapaxes(d0, 1, 2).astype(dt),
            "d1": d1.astype(dt), "d1t": np.swapaxes(d1, 1, 2).astype(dt)}
    lay = _layout(modes, bool(attn_sym))
    qk, norm_c, proj = {}, {}, {}
    for s in _TYPES:
        for j, name in ((0, "q"), (1, "k"), (2, "v")):
            if lay[s][j]:
                pre = split_heads(xs[s] @ p[f"{s}_linears.{j}.weight"], n_head)
                if name != "v" and norm_type is not None:
                    pre, norm_c[(s, name)] = normalize_forward(pre, (3,), _LN_EPS)
                proj[(s, name)] = pre
        if (s, "q") in proj:
            qk[s] = (proj[(s, "q")], proj[(s, "q")] if attn_sym else proj[(s, "k")])
    outs, tapes, ys = [], {}, {}
    for s in _TYPES:
        if s not in modes:
            outs.append(xs[s].copy())
            continue
        y = 0.0
        tapes[s] = []
        for vt, steps in _chains(modes)[s]:
            u, tape = proj[(vt, "v")], []
            for st in steps:
                if isinstance(st, str):
                    tape.append((st, None))
                    u = _inc(u, mats[st])
                else:
                    q, kk = qk[st[1]]
                    u, sc = _star_forward(u, q, kk, st[2], hodge_type)
                    tape.append((st, sc))
            tapes[s].append((vt, tape))
            y = y + u
        ys[s] = merge_heads(y)
        outs.append(ys[s] @ p[f"{s}_linear_out.weight"] + p[f"{s}_linear_out.bias"])
    out = np.concatenate(outs, axis=1)
    cache = {"xs": xs, "p": p, "mats": mats, "lay": lay, "qk": qk, "norm": norm_c, "tapes": tapes, "ys": ys,
             "modes": modes, "sym": bool(attn_sym), "hodge_type": hodge_type, "n_head": n_head,
             "sizes": (n, m, k), "out_shape": out.shape}
    return out, cache


def hodgeformer_backward(dout, cache):
    """Gradients of :func:`hodgeformer_forward` for ``x_v, x_e, x_f`` and every parameter."""
    xs, p, mats, qk = cache["xs"], cache["p"], cache["mats"], cache["qk"]
    dt = xs["v"].dtype
    dout = as_dout(dout, cache["out_shape"], dt)
    n, m, k = cache["sizes"]
    douts = dict(zip(_TYPES, np.split(dout, [n, n + m], axis=1)))
    grads = {f"x_{s}": np.zeros_like(xs[s]) for s in _TYPES}
    dq = {s: np.zeros_like(qk[s][0]) for s in qk}
    dk = {s: np.zeros_like(qk[s][0]) for s in qk}
    dval = {}
    for s in _TYPES:
        if s not in cache["modes"]:
            grads[f"x_{s}"] += douts[s]
            continue
        grads[f"{s}_linear_out.weight"] = np.einsum("bni,bno->io", cache["ys"][s], douts[s])
        grads[f"{s}_linear_out.bias"] = douts[s].sum(axis=(0, 1))
        dy = split_heads(douts[s] @ p[f"{s}_linear_out.weight"].T, cache["n_head"])
        for vt, tape in cache["tapes"][s]:
            g = dy
            for st, sc in reversed(tape):
                if isinstance(st, str):
                    g = _inc(g, mats[st[:2] if st.endswith("t") else st + "t"])
                else:
                    q, kk = qk[st[1]]
                    g, gq, gk = _star_backward(g, sc, q, kk, st[2], cache["hodge_type"])
                    dq[st[1]] += gq
                    dk[st[1]] += gk
            dval[vt] = dval.get(vt, 0.0) + g
    for s in _TYPES:
        for j, name in ((0, "q"), (1, "k"), (2, "v")):
            if not cache["lay"][s][j]:
                continue
            if name == "v":
                g = dval.get(s)
                if g is None:
                    g = np.zeros((xs[s].shape[0], cache["n_head"], xs[s].shape[1], xs[s].shape[2] // cache["n_head"]), dt)
            elif s not in qk:
                g = np.zeros((xs[s].shape[0], cache["n_head"], xs[s].shape[1], xs[s].shape[2] // cache["n_head"]), dt)
            elif name == "q":
                g = dq[s] + dk[s] if cache["sym"] else dq[s]
            else:
                g = dk[s]
            if name != "v" and (s, name) in cache["norm"]:
                xhat = qk[s][0] if name == "q" else qk[s][1]
                g = normalize_backward(g, xhat, cache["norm"][(s, name)])
            gm = merge_heads(g)
            grads[f"{s}_linears.{j}.weight"] = np.einsum("bni,bno->io", xs[s], gm)
            grads[f"x_{s}"] += gm @ p[f"{s}_linears.{j}.weight"].T
    return grads


def hodgeformer_hodge_attention(x_v, x_e, x_f, params, **config):
    """Convenience wrapper: the output of :func:`hodgeformer_forward`."""
    return hodgeformer_forward(x_v, x_e, x_f, params, **config)[0]


def hodgeformer_split(out, n_vertices: int, n_edges: int):
    """Split the concatenated output into ``(out_v, out_e, out_f)`` (upstream's tuple)."""
    return tuple(np.split(out, [n_vertices, n_vertices + n_edges], axis=1))


def hodgeformer_init_params(rng, dim: int, *, modes=("v", "e"), attn_sym: bool = True, dtype=np.float64) -> dict:
    """PyTorch default Linear init ($U(\\pm 1/\\sqrt{\\text{dim}})$) for the layers upstream creates."""
    bound = 1.0 / np.sqrt(dim)
    return {key: rng.uniform(-bound, bound, shape).astype(dtype)
            for key, shape in _spec(dim, tuple(modes), attn_sym).items()}


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _tetra_boundary():
    """The boundary of a tetrahedron: 4 vertices, 6 edges, 4 faces; signed incidences."""
    edges = [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
    faces = [(0, 1, 2), (0, 1, 3), (0, 2, 3), (1, 2, 3)]
    d0 = np.zeros((6, 4))
    for i, (a, b) in enumerate(edges):
        d0[i, a], d0[i, b] = -1.0, 1.0
    d1 = np.zeros((4, 6))
    for i, (a, b, c) in enumerate(faces):
        for (u, v), sgn in (((a, b), 1.0), ((b, c), 1.0), ((a, c), -1.0)):
            d1[i, edges.index((u, v))] = sgn
    return d0, d1


def _sample_hodge(modes, attn_sym, hodge_type):
    def sample(rng, size):
        d0, d1 = _tetra_boundary()
        c, h = (3, 1) if size == "tiny" else (6, 2)
        p = hodgeformer_init_params(rng, c, modes=modes, attn_sym=attn_sym)
        p = {kk: v * 2.0 for kk, v in p.items()}
        xs = {f"x_{s}": rng.standard_normal((2, nn, c)) for s, nn in zip(_TYPES, (4, 6, 4))}
        return Sample(inputs=xs, params=p,
                      config={"d0": np.stack([d0, d0]), "d1": np.stack([d1, d1]), "n_head": h,
                              "modes": modes, "attn_sym": attn_sym, "hodge_type": hodge_type})
    return sample


def _reference_hodge(x_v, x_e, x_f, params, *, d0, d1, n_head, modes=("v", "e"), attn_sym=True,
                     norm_type="layer_norm", hodge_type="diag"):
    # Explicit matrices: build star_s as (B, H, M, M) and the Laplacians as matrix products.
    xs, c = {"v": x_v, "e": x_e, "f": x_f}, x_v.shape[2]
    dh = c // n_head

    def ln(t):
        t = t - t.mean(-1, keepdims=True)
        return t / np.sqrt((t * t).mean(-1, keepdims=True) + _LN_EPS) if norm_type else t

    def heads(t):
        return t.reshape(t.shape[0], t.shape[1], n_head, dh).transpose(0, 2, 1, 3)

    lay = _layout(modes, attn_sym)
    q, kk, v, star, istar = {}, {}, {}, {}, {}
    for s in _TYPES:
        if lay[s][0]:
            q[s] = heads(xs[s] @ params[f"{s}_linears.0.weight"])
            q[s] = ln(q[s]) if norm_type else q[s]
            kk[s] = q[s] if attn_sym else (ln(heads(xs[s] @ params[f"{s}_linears.1.weight"])) if norm_type
                                           else heads(xs[s] @ params[f"{s}_linears.1.weight"]))
            sc = np.einsum("bhid,bhjd->bhij", q[s], kk[s]) / np.sqrt(dh)
            if hodge_type == "diag":
                dg = np.einsum("bhii->bhi", sc)
                star[s] = np.einsum("bhi,ij->bhij", dg, np.eye(dg.shape[-1]))
                istar[s] = np.einsum("bhi,ij->bhij", 1 / (dg + _EPS_INV), np.eye(dg.shape[-1]))
            else:
                star[s] = np.exp(sc - sc.max(-1, keepdims=True))
                star[s] /= star[s].sum(-1, keepdims=True)
                st = np.swapaxes(sc, -1, -2)
                istar[s] = np.exp(st - st.max(-1, keepdims=True))
                istar[s] /= istar[s].sum(-1, keepdims=True)
        if lay[s][2]:
            v[s] = heads(xs[s] @ params[f"{s}_linears.2.weight"])
    D0, D1 = d0[:, None], d1[:, None]
    T0, T1 = np.swapaxes(D0, -1, -2), np.swapaxes(D1, -1, -2)
    outs = []
    for s in _TYPES:
        if s not in modes:
            outs.append(xs[s])
            continue
        if s == "v":
            L = istar["v"] @ T0 @ star["e"] @ D0
        elif s == "e":
            L = istar["e"] @ T1 @ star["f"] @ D1 + D0 @ istar["v"] @ T0 @ star["e"]
        else:
            L = D1 @ istar["e"] @ T1 @ star["f"]
        y = (L @ v[s]).transpose(0, 2, 1, 3).reshape(xs[s].shape)
        outs.append(y @ params[f"{s}_linear_out.weight"] + params[f"{s}_linear_out.bias"])
    return np.concatenate(outs, axis=1)


def _check_exterior_identities(rng):
    # d1 d0 = 0 and d0 1 = 0 on the sample complex; the learned vertex operator starts with d0, so
    # values constant over the vertices are annihilated: out_v = the output bias.
    d0, d1 = _tetra_boundary()
    err = float(np.abs(d1 @ d0).max() + np.abs(d0 @ np.ones(4)).max())
    s = _sample_hodge(("v",), True, "diag")(rng, "small")
    p = dict(s.params)
    p["v_linears.2.weight"] = np.zeros_like(p["v_linears.2.weight"])
    p["v_linears.2.weight"][0] = 1.0          # V = x_v[:, :, :1] broadcast: constant if x_v[..., 0] is
    xv = s.inputs["x_v"].copy()
    xv[..., 0] = 0.7
    out, _ = hodgeformer_forward(xv, s.inputs["x_e"], s.inputs["x_f"], p, **s.config)
    err = max(err, float(np.abs(out[:, :4] - p["v_linear_out.bias"]).max()))
    assert err < 1e-12, f"the learned vertex Laplacian does not annihilate constants: {err}"
    return err


register(
    Mechanism(
        slug="hodgeformer_hodge_operators", family="3-operator", tier="T3",
        official_code="hodgeformer/hodgeformer packages/mesh_opformer/src/mesh_opformer/layers/attention_hodge.py@3d6d527",
        title="HodgeFormer: attention heads approximating discrete Hodge stars",
        paper="Nousias, Nousias, HodgeFormer: Transformers for Learnable Operators on Triangular Meshes through "
              "Data-Driven Hodge Matrices, WACV 2026, arXiv 2509.01839",
        forward=hodgeformer_forward, backward=hodgeformer_backward,
        sample=_sample_hodge(("v", "e", "f"), True, "diag"), reference=_reference_hodge,
        docs="operators/operator-layers-t3b.md#hodgeformer-hodge-attention",
        checks={"laplacian_annihilates_constants": _check_exterior_identities},
    ),
)
