r"""BENO: the boundary-embedded message-passing layer (a boundary Transformer conditions each GNN step).

Paper: Wang, Li, Dwivedi, Hara, Wu, "BENO: Boundary-embedded Neural Operators for Elliptic PDEs",
ICLR 2024, arXiv 2401.09323. Upstream: AI4Science-WestlakeU/beno ``BE_MPNN.py``
(``InteractionNetwork``, ``build_mlp``) and ``transformer.py`` (``Transformer``,
``DataEmbedding_wo_temp``, ``TokenEmbedding``, ``PositionalEmbedding``, ``EncoderLayer``,
``AttentionLayer``, ``FullAttention``, ``Encoder``) @ 6ac99f38b1d58a0d6c8f765a00a8696bf529a0df.

Which part of the model
-----------------------
``HeteroGNS`` (the BENO model) has an MLP encoder, a processor of two stacks of
``InteractionNetwork`` layers (branch 1: the interior source with zero boundary values; branch 2:
zero source with the boundary values $g$) and an MLP decoder summing the two branches, a discrete
analogue of the Green's-function split $u = \int G f + \int \partial_n G\, g$. The mechanism the
paper introduces is this module's layer: **every** message-passing layer owns a Transformer
(``boundary_fn``) that encodes the boundary point set $\{(x_k, y_k, g_k)\}$ into a latent vector
$z$, which is concatenated to every node's update input. The encoder/decoder MLPs, the graph
construction (k-nearest neighbours on the interior grid) and the two-branch sum stay in the docs.

Forward
-------
Boundary encoder ($L$ boundary points $b\in\mathbb R^{L\times c}$, width $D_b$, upstream
``Transformer(enc_in=3, d_model=boundary_dim, n_heads=2, d_ff=16, enc_layers=trans_layer)``):

$$h^{(0)}_t = \sum_{k=0}^{2} W^{tok}_{:,:,k}\, b_{(t+k-1)\bmod L} + \mathrm{PE}_t$$

(``tokenConv``: circular ``Conv1d`` of width 3 without bias; $\mathrm{PE}$ the sinusoidal table
$\mathrm{PE}_{t,2i} = \sin(t\,\omega_i)$, $\mathrm{PE}_{t,2i+1} = \cos(t\,\omega_i)$,
$\omega_i = 10000^{-2i/D_b}$), then per encoder layer (post-norm, unmasked softmax attention with
separate $q/k/v/o$ projections, $1\times1$ convolutions as the feed-forward, exact GELU)

$$h \leftarrow \mathrm{LN}_1(h + \mathrm{MHA}(h)),\qquad
h \leftarrow \mathrm{LN}_2\big(h + \mathrm{conv}_2(\mathrm{GELU}(\mathrm{conv}_1 h))\big),$$

a final LayerNorm and a global max pool over the points (``AdaptiveMaxPool1d(1)``):
$z_c = \max_t \mathrm{LN}(h)_{t,c}$.

Message passing on the graph ``edge_index`` (row 0 sources $j$, row 1 targets $i$; PyG's
``source_to_target`` flow), with ``edge_fn``/``node_fn`` = ``build_mlp`` (Linear layers ``NN-k``
with the activation between them) followed by a LayerNorm:

$$m_e = \mathrm{LN}_e\big(\mathrm{MLP}_e[x_{i_e}, x_{j_e}, e_e]\big),\qquad
a_i = \frac{1}{\max(1, |\{e: i_e = i\}|)}\sum_{e:\,i_e = i} m_e,$$

$$x'_i = x_i + \mathrm{LN}_n\big(\mathrm{MLP}_n[a_i, x_i, z]\big).$$

The layer's edge output is ``2 * edge_features``: upstream's ``update`` returns the edge features
passed to ``propagate`` (PyG hands ``update`` the original keyword argument, not the messages) and
``forward`` adds the residual; the messages reach the nodes only. This module returns $x'$.

Backward
--------
Reverse mode through reused VJPs. $dx = dx'$ (residual) plus, through ``node_fn`` (LayerNorm
``normalize_backward``, the linear chain), the split of $d[a, x, z]$: $dz = \sum_i dz_i$. The mean:
$dm_e = da_{i_e}/\max(1, \deg i_e)$; through ``edge_fn`` into $d[x_i, x_j, e]$, scattered with
``np.add.at`` to targets and sources. The max pool routes $dz_c$ to the arg-max point of channel
$c$ (the selection held fixed; the sampler avoids ties). Then the final LayerNorm, each encoder
layer in reverse ($dv = J_{\mathrm{LN}_2}^\top dh$, $du = dv + J_{FF}^\top dv$,
$dw = J_{\mathrm{LN}_1}^\top du$, $dh = dw + J_{\mathrm{MHA}}^\top dw$; ``mha_backward``), and the
circular convolution's VJP (``conv_vjp`` with ``padding_mode="circular"``: the adjoint of the
wrap-around folds the padded columns back). The positional table is a constant.

Conventions
-----------
* Parameter names are upstream's ``state_dict`` keys of one ``InteractionNetwork`` (Linear
  weights ``(in, out)`` = torch ``weight.T``; convolution weights in torch's ``(C_out, C_in, k)``
  layout). The positional-table buffer ``boundary_fn.enc_embedding.position_embedding.pe`` is not
  a parameter: it is recomputed in the compute dtype (upstream builds it in float32). The frozen
  ``boundary_fn.enc_embedding.temporal_embedding.*`` tables of upstream's ``state_dict`` are never
  used (``DataEmbedding_wo_temp`` adds no temporal term): drop them when loading.
* ``activation`` of ``build_mlp``: ``"silu"`` (default: ``train.py`` runs with ``args.act = 'silu'``),
  ``"elu"`` (``HeteroGNS``'s default), ``"relu"``, ``"leaky_relu"`` (slope 0.01).
* ``n_heads`` 2 (upstream hard-codes it); the widths, the number of encoder layers
  (``trans_layer``) and of MLP layers are read from the parameter shapes. LayerNorm eps 1e-5.
* A batch axis of graphs sharing one ``edge_index`` (upstream processes one graph per call, the
  boundary as a batch of 1); nodes without incoming edges aggregate to 0 (PyG's scatter mean).
* Nothing is reconstruction: the code defines every step.

Agreement with upstream
-----------------------
A scratch script (``/tmp/scratch-o5b``, not committed) imports upstream's ``transformer.py`` from
the snapshot and runs ``Transformer`` itself; ``InteractionNetwork`` needs ``torch_geometric``
(not installed), so its ``message``/``update`` and PyG's mean aggregation are transcribed into
torch (``index_add`` over targets divided by the clamped in-degree). Float64, CPU, torch 2.13,
upstream weights perturbed by $0.3\,N(0,1)$ and copied over, the float32 ``pe`` buffer replaced by
the float64 table; $D_b = 8$, 2 heads, 2 encoder layers, ``d_ff`` 16, latent 6, ``nmlp_layers`` 2
(hidden 7), 12 nodes, 30 random edges (one node without incoming edges), 7 boundary points, three
seeds, SiLU: output max abs error 2.2e-15 (6.1e-16 relative to the largest entry); worst gradient
over the nodes, edges, boundary points and every parameter 2.5e-14 abs, 5.0e-15 relative to its
array's largest entry. The key-projection biases' gradients are structurally zero (softmax is
invariant to a per-row constant) and are ~1e-16 in both. The edge output equals
``2 * edge_features`` exactly.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_choice, check_int, check_params, compute_dtype
from ..attention.softmax.mha import mha_backward, mha_forward
from ..blocks.core import norm_backward, norm_forward
from ..nn.activations import elu_plus_one, elu_plus_one_grad, gelu, gelu_grad, relu, relu_grad, silu, silu_grad
from ..nn.conv import conv_apply, conv_vjp
from ..nn.linear import linear_apply, linear_prefixed, linear_prefixed_spec, linear_prefixed_vjp, linear_vjp
from ..registry import Mechanism, Sample, register

__all__ = ["beno_param_shapes", "boundary_positional_table", "beno_layer_forward", "beno_layer_backward",
           "beno_layer", "init_beno_params"]

ACTIVATIONS = ("silu", "elu", "relu", "leaky_relu")
_ENC = "boundary_fn.encoder.attn_layers.{}"
_TOK = "boundary_fn.enc_embedding.value_embedding.tokenConv.weight"
_PROJ = ("query", "key", "value", "out")
_MHA = {"query": "q_proj", "key": "k_proj", "value": "v_proj", "out": "out_proj"}
_EPS = 1e-5


def _act(name):
    if name == "silu":
        return silu, silu_grad
    if name == "relu":
        return relu, relu_grad
    if name == "elu":
        return (lambda x: elu_plus_one(x) - 1.0), elu_plus_one_grad
    return (lambda x: np.where(x > 0, x, 0.01 * x)), (lambda x: np.where(x > 0, 1.0, 0.01).astype(x.dtype))


def boundary_positional_table(length: int, width: int, dtype=np.float64) -> np.ndarray:
    r"""The sinusoidal table of ``PositionalEmbedding``: ``(length, width)`` with
    $\mathrm{PE}_{t,2i} = \sin(t\,\omega_i)$, $\mathrm{PE}_{t,2i+1} = \cos(t\,\omega_i)$,
    $\omega_i = \exp(-2i\ln(10^4)/\text{width})$ (``width`` even)."""
    t = np.arange(length, dtype=dtype)[:, None]
    w = np.exp(np.arange(0, width, 2, dtype=dtype) * -(np.log(10000.0) / width))
    pe = np.zeros((length, width), dtype=dtype)
    pe[:, 0::2], pe[:, 1::2] = np.sin(t * w), np.cos(t * w)
    return pe


def _mlp_spec(prefix, sizes):
    s = {}
    for k in range(len(sizes) - 1):
        s.update(linear_prefixed_spec(f"{prefix}.0.NN-{k}", sizes[k], sizes[k + 1]))
    s.update({f"{prefix}.1.weight": (sizes[-1],), f"{prefix}.1.bias": (sizes[-1],)})
    return s


def beno_param_shapes(node_dim: int, edge_dim: int, boundary_in: int, boundary_dim: int, *, trans_layer: int,
                      d_ff: int = 16, nmlp_layers: int, mlp_hidden_dim: int) -> dict:
    """``{key: shape}`` of one upstream ``InteractionNetwork`` (node/edge widths unchanged by the layer)."""
    h = [mlp_hidden_dim] * nmlp_layers
    s = {_TOK: (boundary_dim, boundary_in, 3)}
    for i in range(trans_layer):
        pre = _ENC.format(i)
        for name in _PROJ:
            s.update(linear_prefixed_spec(f"{pre}.attention.{name}_projection", boundary_dim, boundary_dim))
        s.update({f"{pre}.conv1.weight": (d_ff, boundary_dim, 1), f"{pre}.conv1.bias": (d_ff,),
                  f"{pre}.conv2.weight": (boundary_dim, d_ff, 1), f"{pre}.conv2.bias": (boundary_dim,),
                  f"{pre}.norm1.weight": (boundary_dim,), f"{pre}.norm1.bias": (boundary_dim,),
                  f"{pre}.norm2.weight": (boundary_dim,), f"{pre}.norm2.bias": (boundary_dim,)})
    s.update({"boundary_fn.encoder.norm.weight": (boundary_dim,), "boundary_fn.encoder.norm.bias": (boundary_dim,)})
    s.update(_mlp_spec("edge_fn", [2 * node_dim + edge_dim] + h + [edge_dim]))
    s.update(_mlp_spec("node_fn", [node_dim + edge_dim + boundary_dim] + h + [node_dim]))
    return s


def _validate(x, edge_features, boundary, params, edge_index, n_heads, activation):
    x = as_float(x, "x", ndim=3)
    e = as_float(edge_features, "edge_features", ndim=3)
    bd = as_float(boundary, "boundary", ndim=3)
    b, n, dn = x.shape
    if e.shape[0] != b or bd.shape[0] != b:
        raise ValueError(f"x, edge_features and boundary must share the batch axis; got x {x.shape}, "
                         f"edge_features {e.shape}, boundary {bd.shape}")
    ei = np.asarray(edge_index)
    if ei.ndim != 2 or ei.shape[0] != 2 or ei.shape[1] != e.shape[1] or not np.issubdtype(ei.dtype, np.integer):
        raise ValueError(f"edge_index must be an integer array of shape (2, E={e.shape[1]}) (sources, targets); "
                         f"got {ei.dtype} {ei.shape}")
    if ei.size and (ei.min() < 0 or ei.max() >= n):
        raise ValueError(f"edge_index entries must lie in [0, N={n}); got range [{ei.min()}, {ei.max()}]")
    heads = check_int(n_heads, "n_heads", minimum=1)
    check_choice(activation, "activation", ACTIVATIONS)
    if not isinstance(params, dict) or params.get(_TOK) is None:
        raise ValueError(f"params must be a dict with the InteractionNetwork weights ({_TOK} (D_b, c, 3), ...)")
    tok = as_float(params[_TOK], _TOK, ndim=3)
    db, c_in = tok.shape[:2]
    if bd.shape[2] != c_in:
        raise ValueError(f"boundary must have {c_in} features per point (axis 1 of {_TOK}); got {bd.shape[2]}")
    if db % 2 or db % heads:
        raise ValueError(f"the boundary width {db} (axis 0 of {_TOK}) must be even (sinusoidal table) and divisible "
                         f"by n_heads={heads}")
    layers = 0
    while f"{_ENC.format(layers)}.attention.query_projection.weight" in params:
        layers += 1
    if layers < 1:
        raise ValueError(f"params needs at least one encoder layer ('{_ENC.format(0)}.attention.query_projection.weight')")
    k1 = f"{_ENC.format(0)}.conv1.weight"
    d_ff = as_float(params.get(k1, np.zeros((16, 1, 1))), k1, ndim=3).shape[0]
    n_mlp = 0
    while f"edge_fn.0.NN-{n_mlp + 1}.weight" in params:
        n_mlp += 1
    k0 = "edge_fn.0.NN-0.weight"
    hid = as_float(params.get(k0, np.zeros((1, 1))), k0, ndim=2).shape[1] if n_mlp else 1
    spec = beno_param_shapes(dn, e.shape[2], c_in, db, trans_layer=layers, d_ff=d_ff, nmlp_layers=n_mlp,
                             mlp_hidden_dim=hid)
    p = check_params(params, spec, where="beno")
    dt = compute_dtype(x, e, bd, *p.values())
    return (x.astype(dt, copy=False), e.astype(dt, copy=False), bd.astype(dt, copy=False), cast_all(dt, p),
            ei.astype(np.intp), heads, layers, n_mlp, dt)


def _mlp_ln(p, prefix, h, n_lin, act, tape):
    f = _act(act)[0]
    for k in range(n_lin):
        tape.append(h)
        h = linear_prefixed(p, f"{prefix}.0.NN-{k}", h)
        if k < n_lin - 1:
            tape.append(h)
            h = f(h)
    y, c = norm_forward(p, f"{prefix}.1", h, eps=_EPS)
    tape.append(c)
    return y


def _mlp_ln_vjp(grads, p, prefix, g, n_lin, act, tape):
    fp = _act(act)[1]
    t = list(tape)
    g = norm_backward(grads, p, g, t.pop())
    for k in reversed(range(n_lin)):
        if k < n_lin - 1:
            g = g * fp(t.pop())
        g = linear_prefixed_vjp(grads, p, f"{prefix}.0.NN-{k}", g, t.pop())
    return g


def _encoder_forward(bd, p, heads, layers):
    tok = conv_apply(np.swapaxes(bd, 1, 2), p[_TOK], padding=1, padding_mode="circular")
    h = np.swapaxes(tok, 1, 2) + boundary_positional_table(bd.shape[1], tok.shape[1], bd.dtype)
    caches = []
    for i in range(layers):
        pre = _ENC.format(i)
        mp = {_MHA[n]: p[f"{pre}.attention.{n}_projection.weight"] for n in _PROJ}
        mp.update({f"{_MHA[n]}_bias": p[f"{pre}.attention.{n}_projection.bias"] for n in _PROJ})
        a, ca = mha_forward(h, None, mp, num_heads=heads)
        h1, c1 = norm_forward(p, f"{pre}.norm1", h + a, eps=_EPS)
        w1, w2 = p[f"{pre}.conv1.weight"][..., 0].T, p[f"{pre}.conv2.weight"][..., 0].T
        u = linear_apply(h1, w1, p[f"{pre}.conv1.bias"])
        ff = linear_apply(gelu(u), w2, p[f"{pre}.conv2.bias"])
        h, c2 = norm_forward(p, f"{pre}.norm2", h1 + ff, eps=_EPS)
        caches.append((pre, ca, c1, h1, u, c2))
    hf, cf = norm_forward(p, "boundary_fn.encoder.norm", h, eps=_EPS)
    arg = np.argmax(hf, axis=1)                                      # (B, D_b): the pooled point per channel
    z = np.take_along_axis(hf, arg[:, None, :], axis=1)[:, 0]
    return z, (caches, cf, arg, hf.shape)


def _encoder_backward(dz, bd, p, cache, grads):
    caches, cf, arg, shape = cache
    dh = np.zeros(shape, dtype=dz.dtype)
    np.put_along_axis(dh, arg[:, None, :], dz[:, None, :], axis=1)
    dh = norm_backward(grads, p, dh, cf)
    for pre, ca, c1, h1, u, c2 in reversed(caches):
        dv = norm_backward(grads, p, dh, c2)
        w1, w2 = p[f"{pre}.conv1.weight"][..., 0].T, p[f"{pre}.conv2.weight"][..., 0].T
        r2 = linear_vjp(dv, gelu(u), w2)
        r1 = linear_vjp(r2["x"] * gelu_grad(u), h1, w1)
        grads[f"{pre}.conv2.weight"], grads[f"{pre}.conv2.bias"] = r2["weight"].T[..., None], r2["bias"]
        grads[f"{pre}.conv1.weight"], grads[f"{pre}.conv1.bias"] = r1["weight"].T[..., None], r1["bias"]
        dw = norm_backward(grads, p, dv + r1["x"], c1)
        ra = mha_backward(dw, ca)
        for n in _PROJ:
            grads[f"{pre}.attention.{n}_projection.weight"] = ra[_MHA[n]]
            grads[f"{pre}.attention.{n}_projection.bias"] = ra[f"{_MHA[n]}_bias"]
        dh = dw + ra["x"]
    rc = conv_vjp(np.swapaxes(dh, 1, 2), np.swapaxes(bd, 1, 2), p[_TOK], padding=1, padding_mode="circular",
                  has_bias=False)
    grads[_TOK] = rc["weight"]
    return np.swapaxes(rc["x"], 1, 2)


def beno_layer_forward(x, edge_features, boundary, params, *, edge_index, n_heads: int = 2,
                       activation: str = "silu"):
    r"""One boundary-embedded ``InteractionNetwork`` step (module docstring).

    Parameters
    ----------
    x : array (B, N, D_n)
        Node latents.
    edge_features : array (B, E, D_e)
        Edge latents, in the order of ``edge_index``'s columns.
    boundary : array (B, L, c)
        Boundary points (upstream: coordinates and boundary value, $c = 3$).
    params : dict
        :func:`beno_param_shapes` keys (upstream names).
    edge_index : int array (2, E)
        Row 0 the source $j$, row 1 the target $i$ of each edge (PyG convention); shared by the batch.
    n_heads : int
        Heads of the boundary Transformer (upstream 2).
    activation : {"silu", "elu", "relu", "leaky_relu"}
        ``build_mlp``'s activation.

    Returns
    -------
    out, cache
        ``out (B, N, D_n)`` $= x'$; the layer's edge output is ``2 * edge_features`` (module docstring).
    """
    x, e, bd, p, ei, heads, layers, n_mlp, dt = _validate(x, edge_features, boundary, params, edge_index, n_heads,
                                                          activation)
    b, n, _ = x.shape
    z, enc = _encoder_forward(bd, p, heads, layers)
    src, dst = ei
    tape_e = []
    m = _mlp_ln(p, "edge_fn", np.concatenate([x[:, dst], x[:, src], e], axis=-1), n_mlp + 1, activation, tape_e)
    deg = np.maximum(np.bincount(dst, minlength=n), 1).astype(dt)
    agg = np.zeros((b, n, m.shape[-1]), dtype=dt)
    np.add.at(agg, (slice(None), dst), m)
    agg = agg / deg[:, None]
    tape_n = []
    zrep = np.broadcast_to(z[:, None, :], (b, n, z.shape[-1]))
    u = _mlp_ln(p, "node_fn", np.concatenate([agg, x, zrep], axis=-1), n_mlp + 1, activation, tape_n)
    cache = {"p": p, "bd": bd, "ei": ei, "deg": deg, "enc": enc, "tape_e": tape_e, "tape_n": tape_n,
             "n_lin": n_mlp + 1, "act": activation, "dims": (x.shape[-1], e.shape[-1], m.shape[-1]), "shape": x.shape,
             "dt": dt}
    return x + u, cache


def beno_layer_backward(dout, cache):
    """Gradients of :func:`beno_layer_forward`: ``x``, ``edge_features``, ``boundary`` and every params key."""
    p, act, n_lin = cache["p"], cache["act"], cache["n_lin"]
    g = as_dout(dout, cache["shape"], cache["dt"])
    dn, de, dm_w = cache["dims"]
    grads = {}
    dcat = _mlp_ln_vjp(grads, p, "node_fn", g, n_lin, act, cache["tape_n"])
    dagg, dx, dz = dcat[..., :dm_w], g + dcat[..., dm_w:dm_w + dn], dcat[..., dm_w + dn:].sum(axis=1)
    src, dst = cache["ei"]
    dm = dagg[:, dst] / cache["deg"][dst][:, None]
    dcat_e = _mlp_ln_vjp(grads, p, "edge_fn", dm, n_lin, act, cache["tape_e"])
    np.add.at(dx, (slice(None), dst), dcat_e[..., :dn])
    np.add.at(dx, (slice(None), src), dcat_e[..., dn:2 * dn])
    grads["x"], grads["edge_features"] = dx, dcat_e[..., 2 * dn:].copy()
    grads["boundary"] = _encoder_backward(dz, cache["bd"], p, cache["enc"], grads)
    return grads


def beno_layer(x, edge_features, boundary, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`beno_layer_forward`."""
    return beno_layer_forward(x, edge_features, boundary, params, **config)[0]


def init_beno_params(rng, node_dim: int, edge_dim: int, boundary_in: int = 3, boundary_dim: int = 128, *,
                     trans_layer: int = 3, d_ff: int = 16, nmlp_layers: int = 2, mlp_hidden_dim: int = 128,
                     dtype=np.float64) -> dict:
    """PyTorch-default initialisation: Linear and $1\\times1$ convolutions $U(\\pm1/\\sqrt{\\text{fan-in}})$,
    ``tokenConv`` Kaiming-normal (fan-in, leaky-ReLU gain), LayerNorm 1/0."""
    shapes = beno_param_shapes(node_dim, edge_dim, boundary_in, boundary_dim, trans_layer=trans_layer, d_ff=d_ff,
                               nmlp_layers=nmlp_layers, mlp_hidden_dim=mlp_hidden_dim)
    p = {}
    for k, s in shapes.items():
        if k == _TOK:
            gain = np.sqrt(2.0 / (1 + 0.01 ** 2))
            p[k] = rng.standard_normal(s) * gain / np.sqrt(s[1] * s[2])
        elif "norm" in k or k.startswith(("edge_fn.1", "node_fn.1")):
            p[k] = np.ones(s) if k.endswith("weight") else np.zeros(s)
        else:
            wk = k[:-len("bias")] + "weight" if k.endswith("bias") else k
            ws = shapes[wk]
            fan_in = ws[0] if len(ws) == 2 else ws[1] * ws[2]
            p[k] = rng.uniform(-1 / np.sqrt(fan_in), 1 / np.sqrt(fan_in), s)
    return {k: np.asarray(v, dtype=dtype) for k, v in p.items()}


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _graph(rng, n, n_edges):
    # random directed edges without self-loops; node n-1 receives none (the empty-mean branch)
    src = rng.integers(0, n, n_edges)
    dst = rng.integers(0, n - 1, n_edges)
    dst = np.where(dst == src, (dst + 1) % (n - 1), dst)
    return np.stack([src, dst])


def _sample(rng, size, activation="silu"):
    if size == "tiny":
        b, n, ne, dn, lb, db, layers, ff, nm, hid = 2, 3, 4, 3, 3, 4, 1, 2, 1, 3
    else:
        b, n, ne, dn, lb, db, layers, ff, nm, hid = 2, 6, 12, 4, 5, 6, 2, 5, 2, 5
    p = init_beno_params(rng, dn, dn, 3, db, trans_layer=layers, d_ff=ff, nmlp_layers=nm, mlp_hidden_dim=hid)
    p = {k: v + 0.3 * rng.standard_normal(v.shape) for k, v in p.items()}
    inputs = {"x": rng.standard_normal((b, n, dn)), "edge_features": rng.standard_normal((b, ne, dn)),
              "boundary": rng.standard_normal((b, lb, 3))}
    return Sample(inputs=inputs, params=p, config={"edge_index": _graph(rng, n, ne), "n_heads": 2,
                                                   "activation": activation})


def _reference(x, edge_features, boundary, params, *, edge_index, n_heads=2, activation="silu"):
    # Explicit loops: the circular convolution as a sum over taps, attention per head, the mean per node.
    p = params
    f = _act(activation)[0]

    def ln(t, pre):
        mu = t.mean(-1, keepdims=True)
        return (t - mu) / np.sqrt(((t - mu) ** 2).mean(-1, keepdims=True) + _EPS) * p[f"{pre}.weight"] + p[f"{pre}.bias"]

    def mlp(t, pre):
        k = 0
        while f"{pre}.0.NN-{k}.weight" in p:
            if k:
                t = f(t)
            t = t @ p[f"{pre}.0.NN-{k}.weight"] + p[f"{pre}.0.NN-{k}.bias"]
            k += 1
        return ln(t, f"{pre}.1")

    w = p[_TOK]
    b, lb, _ = boundary.shape
    db = w.shape[0]
    h = np.zeros((b, lb, db))
    for t in range(lb):
        for k in range(3):
            h[:, t] += boundary[:, (t + k - 1) % lb] @ w[:, :, k].T
    h = h + boundary_positional_table(lb, db)
    dh = db // n_heads
    i = 0
    while f"{_ENC.format(i)}.attention.query_projection.weight" in p:
        pre = _ENC.format(i) + ".attention"
        q, k_, v = (h @ p[f"{pre}.{n}_projection.weight"] + p[f"{pre}.{n}_projection.bias"] for n in _PROJ[:3])
        heads = []
        for hh in range(n_heads):
            sl = slice(hh * dh, (hh + 1) * dh)
            s = q[..., sl] @ np.swapaxes(k_[..., sl], 1, 2) / np.sqrt(dh)
            a = np.exp(s - s.max(-1, keepdims=True))
            heads.append(a / a.sum(-1, keepdims=True) @ v[..., sl])
        att = np.concatenate(heads, -1) @ p[f"{pre}.out_projection.weight"] + p[f"{pre}.out_projection.bias"]
        pre = _ENC.format(i)
        h = ln(h + att, f"{pre}.norm1")
        y = gelu(h @ p[f"{pre}.conv1.weight"][..., 0].T + p[f"{pre}.conv1.bias"])
        h = ln(h + y @ p[f"{pre}.conv2.weight"][..., 0].T + p[f"{pre}.conv2.bias"], f"{pre}.norm2")
        i += 1
    z = ln(h, "boundary_fn.encoder.norm").max(axis=1)
    n = x.shape[1]
    out = x.copy()
    for node in range(n):
        msgs = [mlp(np.concatenate([x[:, node], x[:, j], edge_features[:, e]], -1), "edge_fn")
                for e, (j, i_) in enumerate(edge_index.T) if i_ == node]
        agg = np.mean(msgs, axis=0) if msgs else np.zeros((b, p["edge_fn.1.weight"].shape[0]))
        out[:, node] += mlp(np.concatenate([agg, x[:, node], z], -1), "node_fn")
    return out


def _check_node_relabelling(rng):
    # Relabelling the nodes (and the edge_index accordingly) permutes the output rows.
    s = _sample(rng, "small")
    out = beno_layer(**s.inputs, params=s.params, **s.config)
    n = s.inputs["x"].shape[1]
    perm = rng.permutation(n)
    inv = np.argsort(perm)
    cfg = dict(s.config, edge_index=inv[s.config["edge_index"]])
    out_p = beno_layer(**dict(s.inputs, x=s.inputs["x"][:, perm]), params=s.params, **cfg)
    err = float(np.abs(out_p - out[:, perm]).max())
    assert err < 1e-12, f"not equivariant under node relabelling: {err:.2e}"
    return err


def _check_boundary_latent_conditions_every_node(rng):
    # The boundary enters through the pooled latent z at every node: moving the boundary moves
    # every node's output, the isolated node (no incoming edge, zero aggregate) included; and the
    # variants (ELU / ReLU / leaky ReLU MLPs) match the explicit formula.
    s = _sample(rng, "small")
    o1 = beno_layer(**s.inputs, params=s.params, **s.config)
    o2 = beno_layer(**dict(s.inputs, boundary=s.inputs["boundary"] + 1.0), params=s.params, **s.config)
    assert np.all(np.abs(o1 - o2).max(axis=-1) > 1e-8), "some node ignores the boundary latent"
    errs = []
    for act in ("elu", "relu", "leaky_relu"):
        t = _sample(rng, "small", activation=act)
        errs.append(float(np.abs(beno_layer(**t.inputs, params=t.params, **t.config)
                                 - _reference(**t.inputs, params=t.params, **t.config)).max()))
        assert errs[-1] < 1e-12, f"{act}: differs from the explicit formula by {errs[-1]:.2e}"
    return max(errs)


register(
    Mechanism(
        slug="beno_boundary_embedded_operator", family="3-operator", tier="T3",
        title="BENO: message-passing layer conditioned on a Transformer embedding of the boundary",
        paper="Wang, Li, Dwivedi, Hara, Wu, BENO: Boundary-embedded Neural Operators for Elliptic PDEs, ICLR 2024, "
              "arXiv 2401.09323",
        forward=beno_layer_forward, backward=beno_layer_backward, sample=_sample, reference=_reference,
        docs="operators/o5b.md#beno-boundary-embedded-message-passing-layer",
        checks={"node_relabelling": _check_node_relabelling,
                "boundary_latent_conditions_every_node": _check_boundary_latent_conditions_every_node},
    ),
)
