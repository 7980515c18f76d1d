r"""FlatFormer: flattened window attention — points sorted window by window, split into groups
of EQUAL SIZE (not equal-shape windows), softmax attention within each group, un-permuted; the
full FlatFormer layer (group attention with a coordinate encoding on queries and keys, post-norm
residual, GELU MLP) and the four-layer block that alternates the sorting axis and shifts.

Liu, Yang, Zhao, Chen, Mao, Han, "FlatFormer: Flattened Window Attention for Efficient Point
Cloud Transformer", CVPR 2023, arXiv 2301.08739. Upstream read:
``mit-han-lab/flatformer mmdet3d/models/middle_encoders/flatformer.py``
@31dc5a923915040682ec4f7c05df35737227a8f5 (``FlattenedWindowMapping``,
``get_window_coors_shift``, ``PositionalEmbedding``, ``GroupAttention``, ``BasicLayer``,
``BasicBlock``). Parameter names are upstream's (``attn.attn.in_proj_weight`` — the packed
``nn.MultiheadAttention`` projection stored ``(C, 3C)`` = torch ``in_proj_weight.T``, columns
$[W_q|W_k|W_v]$ —, ``attn.attn.in_proj_bias``, ``attn.attn.out_proj``, ``fc1``, ``fc2``,
``norm1``, ``norm2``; a block prefixes them with ``block.{0..3}.``).

Selection: the flattened-window order
-------------------------------------
Token $i$ of a batch element has integer BEV coordinates ``coords[i] = (y, x)`` (upstream's
``coords[:, 2:4]``; the batch index is axis 0 here). With windows $w_x\times w_y$
(``window_shape``) and, when ``shifted``, $x \mathrel{+}= \lfloor w_x/2\rfloor$,
$y \mathrel{+}= \lfloor w_y/2\rfloor$: window $(x_1, y_1) = (\lfloor x/w_x\rfloor, \lfloor y/w_y\rfloor)$,
in-window $(x_2, y_2) = (x \bmod w_x, y \bmod w_y)$. Order ``"x"`` sorts by the upstream key

$$
v_x = (n_1y_1 + (-1)^{y_1}x_1)\,n_2m_2 + (-1)^{y_1}\big(m_2x_2 + (-1)^{x_2}y_2\big),
$$

$n_2 = 2w_x$, $m_2 = 2w_y$, $n_1 = 2(\lceil S_x/w_x\rceil + 1)$ ($S$ = ``sparse_shape``): windows
row by row in a snake (boustrophedon) order, and inside a window columns in a snake order,
reversed on odd window rows. Order ``"y"`` swaps the roles of $x$ and $y$. The key is the
lexicographic order of $(y_1, \pm x_1, \pm(x_2, \pm y_2))$ (tested against a Python tuple sort).
Coordinates must be distinct within a batch element (the order then has no ties).

Equal-size groups
-----------------
In the sorted order, groups are $[0,G), [G,2G), \dots$. When $r = N \bmod G \ne 0$, upstream
pads the last group with copies of the $G-r$ tokens just before it (``flat2win``), so the last
group's queries attend over the LAST $G$ sorted tokens (overlapping the previous group); the
copies' outputs are dropped (``win2flat``). ``last_group="mask"`` instead lets the last group attend
only to its own $r$ tokens (the "pad and mask" reading). $N<G$: one group of all $N$ tokens
(upstream reads past the batch element there).

Forward (``BasicLayer``)
------------------------
With $\pi$ the order and $\mathcal G(i)$ the key set of the group of token $i$:
$q_i = (x_i + e_i)W_q + b_q$, $k_j = (x_j + e_j)W_k + b_k$, $v_j = x_jW_v + b_v$ ($e$ the
sine–cosine coordinate encoding of ``PositionalEmbedding``), per head
$a_i = \sum_{j\in\mathcal G(i)}\mathrm{softmax}_j(q_i^\top k_j/\sqrt{d})\,v_j$, then
$h = \mathrm{LN}_1(x + aW_o + b_o)$, $\mathrm{out} = \mathrm{LN}_2(h + \mathrm{fc}_2(\mathrm{GELU}(\mathrm{fc}_1 h)))$.
Written densely this is masked softmax attention with $M_{ij} = [j\in\mathcal G(i)]$ — a block
diagonal mask under $\pi$ (plus the overlap of the last group) — which the registry's reference
evaluates.

Backward
--------
The order and the group partition depend only on the integer coordinates: piecewise constant,
held fixed. The gather $X_{g,s} = x_{\pi(\mathrm{idx}_{g,s})}$ has the scatter-add adjoint
($\bar x_{\pi(j)} = \sum_{(g,s):\mathrm{idx}_{g,s}=j}\bar X_{g,s}$, so a token used as a key in
two groups collects both), the output pick $a_{\pi(j)} = A_{\mathrm{own}(j)}$ scatters into the
owning slot only (the copies' outputs get zero gradient); in between the softmax-attention VJP
(`refattn.attention.softmax.core.attention_core_backward`), the linear VJPs, and the
layer-norm and GELU VJPs of `refattn.nn`. The coordinate encoding is not differentiated.

Conventions (keywords, upstream defaults): ``last_group="duplicate"``, ``activation="gelu"``
(exact erf; upstream also lists ``"relu"``; its ``"glu"`` halves the width and cannot run with
its ``fc2``), ``pos_temperature=10000``, ``normalize_pos=False`` (when True, $x\mapsto 2\cdot3.1415\,x/S_x$),
LayerNorm eps 1e-5, scale $1/\sqrt{d}$ (flash-attn's default), no dropout (upstream passes 0).

Measured agreement with upstream: the file cannot run here (``flash_attn`` CUDA kernel, ``mmcv``,
device ``"cuda"`` hard-coded in ``inv_freq``). Its source was executed in a scratch script with
only those replaced — ``flash_attn_unpadded_qkvpacked_func`` by per-sequence
``F.scaled_dot_product_attention`` (equal ``cu_seqlens``, scale $1/\sqrt d$), ``auto_fp16`` and
the registry decorator by identities, the ``inv_freq`` device and dtype by CPU float64 —, so
the mapping, padding, encoding and layer code ran as written. Float64, ``BasicBlock`` (4 layers,
orders x, x-shift, y, y-shift), $C=16$, 4 heads, $G=5$, window (3, 4), sparse shape (11, 13),
batch 2 with 23 tokens each ($r=3$): output max abs error 3.6e-15 (rel 9.1e-16); gradients of
$x$ and of all 48 parameters max rel error 3.6e-15; the four orders equal upstream's
``torch.sort`` of $v_x, v_y$ exactly.
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_choice, check_int, check_params
from ...nn.activations import gelu, gelu_grad, relu, relu_grad
from ...nn.linear import linear_prefixed, linear_prefixed_vjp, merge_heads, split_heads
from ...nn.norms import layer_norm_backward, layer_norm_forward
from ...registry import Mechanism, Sample, register
from ..softmax.core import attention_core_backward, attention_core_forward

__all__ = ["flattened_window_order", "equal_size_groups", "flatformer_positional_embedding",
           "flatformer_layer_forward", "flatformer_layer_backward", "flatformer_layer",
           "flatformer_block_forward", "flatformer_block_backward", "flatformer_block",
           "init_flatformer_params", "FLATFORMER_BLOCK_ORDERS"]

FLATFORMER_BLOCK_ORDERS = (("x", False), ("x", True), ("y", False), ("y", True))
"""The orders of upstream ``BasicBlock``'s four layers: ``mappings["x"]``, ``"x_shift"``, ``"y"``, ``"y_shift"``."""


def _check_coords(coords, n_tokens, sparse_shape):
    c = np.asarray(coords)
    if not np.issubdtype(c.dtype, np.integer):
        raise TypeError(f"coords must be an integer array (y, x) per token; got dtype {c.dtype}")
    if c.ndim != 3 or c.shape[-1] != 2 or (n_tokens is not None and c.shape[:2] != n_tokens):
        want = "(B, N, 2)" if n_tokens is None else f"{n_tokens + (2,)}"
        raise ValueError(f"coords must have shape {want} (y, x per token); got {c.shape}")
    sx, sy = sparse_shape[0], sparse_shape[1]
    if c.min() < 0 or c[..., 1].max() >= sx or c[..., 0].max() >= sy:
        raise ValueError(f"coords must lie in [0, sparse_shape): x < {sx}, y < {sy}; got x in "
                         f"[{c[..., 1].min()}, {c[..., 1].max()}], y in [{c[..., 0].min()}, {c[..., 0].max()}]")
    for b in range(c.shape[0]):
        if len(np.unique(c[b], axis=0)) != c.shape[1]:
            raise ValueError(f"coords of batch element {b} repeat a location; the flattened-window order "
                             "needs distinct coordinates (one token per voxel/pillar)")
    return c.astype(np.int64)


def _shape3(v, name):
    t = tuple(int(a) for a in v)
    if len(t) not in (2, 3) or min(t) < 1:
        raise ValueError(f"{name} must be 2 or 3 positive ints (x, y[, z]); got {v!r}")
    return t


def flattened_window_order(coords, *, window_shape=(13, 13, 1), sparse_shape=(468, 468, 1), axis: str = "x",
                           shifted: bool = False) -> np.ndarray:
    r"""The flattened-window sort permutation ``perm (B, N)`` (``x[b, perm[b]]`` is the sorted
    sequence): argsort of upstream's key $v_x$ (``axis="x"``) or $v_y$ (``"y"``), see the module
    docstring. ``coords (B, N, 2)`` integer ``(y, x)``."""
    check_choice(axis, "axis", ("x", "y"))
    window_shape, sparse_shape = _shape3(window_shape, "window_shape"), _shape3(sparse_shape, "sparse_shape")
    c = _check_coords(coords, None, sparse_shape)
    return _order(c, window_shape, sparse_shape, axis, shifted)


def _order(c, window_shape, sparse_shape, axis, shifted):
    wx, wy = window_shape[0], window_shape[1]
    n1 = 2 * (int(np.ceil(sparse_shape[0] / wx)) + 1)
    m1 = 2 * (int(np.ceil(sparse_shape[1] / wy)) + 1)
    n2, m2 = 2 * wx, 2 * wy
    x, y = c[..., 1], c[..., 0]
    if shifted:
        x, y = x + wx // 2, y + wy // 2
    x1, y1, x2, y2 = x // wx, y // wy, x % wx, y % wy
    sgn = lambda a: 1 - 2 * (a % 2)  # noqa: E731  (-1)**a for a >= 0
    if axis == "x":
        key = (n1 * y1 + sgn(y1) * x1) * n2 * m2 + sgn(y1) * (m2 * x2 + sgn(x2) * y2)
    else:
        key = (m1 * x1 + sgn(x1) * y1) * m2 * n2 + sgn(x1) * (n2 * y2 + sgn(y2) * x2)
    return np.argsort(key, axis=-1, kind="stable")


def equal_size_groups(n: int, group_size: int, last_group: str = "duplicate"):
    """The equal-size partition of ``n`` sorted positions: ``idx (n_groups, G')`` (the sorted
    positions each group reads as keys), ``own (n,)`` (the flat slot ``g*G' + s`` whose output
    position ``j`` takes) and ``keep (n_groups, G')`` (False on key slots the last group may not
    see; all True for ``"duplicate"``). ``G' = min(G, n)``."""
    n = check_int(n, "n", minimum=1)
    G = min(check_int(group_size, "group_size", minimum=1), n)
    check_choice(last_group, "last_group", ("duplicate", "mask"))
    ng = -(-n // G)
    r = n % G
    idx = np.arange(ng * G).reshape(ng, G)
    own = np.arange(n)
    keep = np.ones((ng, G), dtype=bool)
    if r:
        idx[-1] = np.arange(n - G, n)           # upstream: the last G sorted tokens
        own[n - r:] = (ng - 1) * G + (G - r) + np.arange(r)
        if last_group == "mask":
            keep[-1, :G - r] = False
    return idx, own, keep


def flatformer_positional_embedding(coords, feat_dim: int, *, sparse_shape=(468, 468, 1), pos_temperature=10000.0,
                                    normalize_pos: bool = False, dtype=np.float64) -> np.ndarray:
    r"""Upstream ``PositionalEmbedding``: with $P = 2\lfloor C/4\rfloor$ and
    $f_i = T^{2\lfloor i/2\rfloor/P}$, $[\sin(x/f_0), \cos(x/f_1), \sin(x/f_2), \dots]$ then the same
    for $y$, zero-padded to ``feat_dim``. ``coords (B, N, 2)`` integer ``(y, x)``."""
    sparse_shape = _shape3(sparse_shape, "sparse_shape")
    c = _check_coords(coords, None, sparse_shape)
    C = check_int(feat_dim, "feat_dim", minimum=1)
    x, y = c[..., 1].astype(np.float64), c[..., 0].astype(np.float64)
    if normalize_pos:
        x, y = x / sparse_shape[0] * 2 * 3.1415, y / sparse_shape[1] * 2 * 3.1415
    P = (C // 4) * 2
    f = float(pos_temperature) ** (2 * (np.arange(P) // 2) / max(P, 1))

    def enc(t):
        a = t[..., None] / f
        return np.stack([np.sin(a[..., ::2]), np.cos(a[..., 1::2])], axis=-1).reshape(t.shape + (P,))

    pe = np.concatenate([enc(x), enc(y)], axis=-1)
    pe = np.concatenate([pe, np.zeros(pe.shape[:-1] + (C - 2 * P,))], axis=-1)
    return pe.astype(dtype)


def _layer_spec(C):
    return {"attn.attn.in_proj_weight": (C, 3 * C), "attn.attn.in_proj_bias": (3 * C,),
            "attn.attn.out_proj.weight": (C, C), "attn.attn.out_proj.bias": (C,),
            "fc1.weight": (C, 2 * C), "fc1.bias": (2 * C,), "fc2.weight": (2 * C, C), "fc2.bias": (C,),
            "norm1.weight": (C,), "norm1.bias": (C,), "norm2.weight": (C,), "norm2.bias": (C,)}


def _validate(x, coords, num_heads, group_size, window_shape, sparse_shape, activation, last_group):
    x = as_float(x, "x", ndim=3)
    B, N, C = x.shape
    h = check_int(num_heads, "num_heads", minimum=1)
    if C % h:
        raise ValueError(f"num_heads ({h}) must divide the channel count C = x.shape[-1] = {C}")
    check_int(group_size, "group_size", minimum=1)
    check_choice(activation, "activation", ("gelu", "relu"))
    check_choice(last_group, "last_group", ("duplicate", "mask"))
    ws, ss = _shape3(window_shape, "window_shape"), _shape3(sparse_shape, "sparse_shape")
    return x, _check_coords(coords, (B, N), ss), ws, ss


def _layer_core(x, pe, perm, p, num_heads, group_size, activation, last_group):
    """One ``BasicLayer`` on validated arrays with a given order ``perm``; returns ``(out, cache)``."""
    B, N, C = x.shape
    idx, own, keep = equal_size_groups(N, group_size, last_group)
    ng, G = idx.shape
    rows = np.arange(B)[:, None]
    src = perm[:, idx.reshape(-1)]                                       # (B, ng*G) token ids per slot
    xg = x[rows, src].reshape(B, ng, G, C)
    qk_in = xg + pe[rows, src].reshape(B, ng, G, C)
    w, bqkv = p["attn.attn.in_proj_weight"], p["attn.attn.in_proj_bias"]
    q = split_heads(qk_in @ w[:, :C] + bqkv[:C], num_heads)             # (B, ng, h, G, d)
    k = split_heads(qk_in @ w[:, C:2 * C] + bqkv[C:2 * C], num_heads)
    v = split_heads(xg @ w[:, 2 * C:] + bqkv[2 * C:], num_heads)
    mask = None if keep.all() else keep[:, None, None, :]
    o, acache = attention_core_forward(q, k, v, attn_mask=mask)
    og = merge_heads(o).reshape(B, ng * G, C)
    a = np.empty_like(x)
    a[rows, perm] = og[:, own]                                           # pick the owning slot, un-permute
    ao = linear_prefixed(p, "attn.attn.out_proj", a)
    h1, c1 = layer_norm_forward(x + ao, {"weight": p["norm1.weight"], "bias": p["norm1.bias"]})
    f1 = linear_prefixed(p, "fc1", h1)
    act = gelu(f1) if activation == "gelu" else relu(f1)
    f2 = linear_prefixed(p, "fc2", act)
    out, c2 = layer_norm_forward(h1 + f2, {"weight": p["norm2.weight"], "bias": p["norm2.bias"]})
    cache = {"p": p, "x": x, "perm": perm, "src": src, "own": own, "ng": ng, "G": G, "qk_in": qk_in, "xg": xg,
             "acache": acache, "a": a, "c1": c1, "h1": h1, "f1": f1, "act": act, "c2": c2,
             "activation": activation, "num_heads": num_heads}
    return out, cache


def _layer_core_backward(dout, cache):
    p, x, perm = cache["p"], cache["x"], cache["perm"]
    B, N, C = x.shape
    ng, G = cache["ng"], cache["G"]
    rows = np.arange(B)[:, None]
    grads: dict = {}
    d2 = layer_norm_backward(dout, cache["c2"])
    grads["norm2.weight"], grads["norm2.bias"] = d2["weight"], d2["bias"]
    dact = linear_prefixed_vjp(grads, p, "fc2", d2["x"], cache["act"])
    f1 = cache["f1"]
    df1 = dact * (gelu_grad(f1) if cache["activation"] == "gelu" else relu_grad(f1))
    dh1 = d2["x"] + linear_prefixed_vjp(grads, p, "fc1", df1, cache["h1"])
    d1 = layer_norm_backward(dh1, cache["c1"])
    grads["norm1.weight"], grads["norm1.bias"] = d1["weight"], d1["bias"]
    dx = d1["x"].copy()
    da = linear_prefixed_vjp(grads, p, "attn.attn.out_proj", d1["x"], cache["a"])
    dog = np.zeros((B, ng * G, C), dtype=x.dtype)
    dog[:, cache["own"]] = da[rows, perm]
    g = attention_core_backward(split_heads(dog.reshape(B, ng, G, C), cache["num_heads"]), cache["acache"])
    dq, dk, dv = (merge_heads(g[n]) for n in ("q", "k", "v"))
    w = p["attn.attn.in_proj_weight"]
    qk_in, xg = cache["qk_in"], cache["xg"]
    red = lambda a, b: a.reshape(-1, a.shape[-1]).T @ b.reshape(-1, b.shape[-1])  # noqa: E731
    grads["attn.attn.in_proj_weight"] = np.concatenate([red(qk_in, dq), red(qk_in, dk), red(xg, dv)], axis=1)
    grads["attn.attn.in_proj_bias"] = np.concatenate([t.sum(axis=(0, 1, 2)) for t in (dq, dk, dv)])
    dxg = dq @ w[:, :C].T + dk @ w[:, C:2 * C].T + dv @ w[:, 2 * C:].T     # q, k read x + e; v reads x
    np.add.at(dx, (rows, cache["src"]), dxg.reshape(B, ng * G, C))       # scatter-add: a key may sit in 2 groups
    return dx, grads


def flatformer_layer_forward(x, coords, params, *, num_heads: int, group_size: int = 69, window_shape=(9, 9, 1),
                             sparse_shape=(468, 468, 1), axis: str = "x", shifted: bool = False,
                             activation: str = "gelu", pos_temperature=10000.0, normalize_pos: bool = False,
                             last_group: str = "duplicate"):
    r"""One FlatFormer layer (upstream ``BasicLayer`` applied in one flattened-window order) on
    ``x (B, N, C)`` with integer ``coords (B, N, 2)`` ``(y, x)``. Defaults are upstream's
    ``FlatFormer`` constructor's. Returns ``(out (B, N, C), cache)``."""
    check_choice(axis, "axis", ("x", "y"))
    x, c, ws, ss = _validate(x, coords, num_heads, group_size, window_shape, sparse_shape, activation, last_group)
    dt = x.dtype
    p = cast_all(dt, check_params(params, _layer_spec(x.shape[-1]), where="flatformer_layer"))
    pe = flatformer_positional_embedding(c, x.shape[-1], sparse_shape=ss, pos_temperature=pos_temperature,
                                         normalize_pos=normalize_pos, dtype=dt)
    out, cache = _layer_core(x, pe, _order(c, ws, ss, axis, shifted), p, num_heads, group_size, activation, last_group)
    cache["shape"] = out.shape
    return out, cache


def flatformer_layer_backward(dout, cache) -> dict:
    """Gradients of :func:`flatformer_layer_forward` w.r.t. ``x`` and every parameter (the order,
    the groups and the coordinate encoding are held fixed: they depend on integer coordinates)."""
    dout = as_dout(dout, cache["shape"], cache["x"].dtype)
    dx, grads = _layer_core_backward(dout, cache)
    return {"x": dx, **grads}


def flatformer_layer(x, coords, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`flatformer_layer_forward`."""
    return flatformer_layer_forward(x, coords, params, **config)[0]


def flatformer_block_forward(x, coords, params, *, num_heads: int, group_size: int = 69, window_shape=(9, 9, 1),
                             sparse_shape=(468, 468, 1), activation: str = "gelu", pos_temperature=10000.0,
                             normalize_pos: bool = False, last_group: str = "duplicate"):
    """Upstream ``BasicBlock``: four layers (params ``block.{k}.<layer key>``) in the orders
    :data:`FLATFORMER_BLOCK_ORDERS` (x, x shifted, y, y shifted). Returns ``(out, cache)``."""
    x, c, ws, ss = _validate(x, coords, num_heads, group_size, window_shape, sparse_shape, activation, last_group)
    dt = x.dtype
    spec = {f"block.{k}.{key}": s for k in range(4) for key, s in _layer_spec(x.shape[-1]).items()}
    p = cast_all(dt, check_params(params, spec, where="flatformer_block"))
    pe = flatformer_positional_embedding(c, x.shape[-1], sparse_shape=ss, pos_temperature=pos_temperature,
                                         normalize_pos=normalize_pos, dtype=dt)
    caches = []
    h = x
    for k, (axis, shifted) in enumerate(FLATFORMER_BLOCK_ORDERS):
        pk = {key[len(f"block.{k}."):]: v for key, v in p.items() if key.startswith(f"block.{k}.")}
        h, ck = _layer_core(h, pe, _order(c, ws, ss, axis, shifted), pk, num_heads, group_size, activation, last_group)
        caches.append(ck)
    return h, {"caches": caches, "shape": h.shape, "dtype": dt}


def flatformer_block_backward(dout, cache) -> dict:
    """Gradients of :func:`flatformer_block_forward` w.r.t. ``x`` and every ``block.{k}.*`` parameter."""
    g = as_dout(dout, cache["shape"], cache["dtype"])
    out = {}
    for k in reversed(range(4)):
        g, gk = _layer_core_backward(g, cache["caches"][k])
        out.update({f"block.{k}.{key}": v for key, v in gk.items()})
    return {"x": g, **out}


def flatformer_block(x, coords, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`flatformer_block_forward`."""
    return flatformer_block_forward(x, coords, params, **config)[0]


def init_flatformer_params(rng, C: int, *, block: bool = False) -> dict:
    """Random parameters with upstream's names: Xavier-uniform matrices (upstream's
    ``_reset_parameters``), small random biases and norm affines (upstream: zeros and ones).
    ``block=True``: the four layers of a ``BasicBlock`` (``block.{k}.`` prefixes)."""
    def one():
        p = {}
        for key, shape in _layer_spec(C).items():
            if len(shape) == 2:
                lim = np.sqrt(6.0 / sum(shape))
                p[key] = rng.uniform(-lim, lim, shape)
            else:
                p[key] = (1.0 if key.startswith("norm") and key.endswith("weight") else 0.0) \
                    + 0.1 * rng.standard_normal(shape)
        return p
    if not block:
        return one()
    return {f"block.{k}.{key}": v for k in range(4) for key, v in one().items()}


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _distinct_coords(rng, B, N, sx, sy):
    flat = np.stack([rng.choice(sx * sy, size=N, replace=False) for _ in range(B)])
    return np.stack([flat // sx, flat % sx], axis=-1)                    # (y, x)


def _sample_flatformer(rng, size):
    C, N, G, heads, ws, ss = (4, 7, 3, 2, (3, 2, 1), (7, 6, 1)) if size == "tiny" else \
        (8, 17, 5, 2, (3, 4, 1), (11, 9, 1))
    cfg = {"num_heads": heads, "group_size": G, "window_shape": ws, "sparse_shape": ss, "axis": "y", "shifted": True}
    return Sample(inputs={"x": rng.standard_normal((2, N, C))}, params=init_flatformer_params(rng, C),
                  config={"coords": _distinct_coords(rng, 2, N, ss[0], ss[1]), **cfg})


def _brute_force_order(coords_b, window_shape, axis, shifted):
    """The order as a Python sort of lexicographic tuples (window snake, then in-window snake)."""
    wx, wy = window_shape[0], window_shape[1]
    keys = []
    for yy, xx in coords_b:
        x, y = (xx + wx // 2, yy + wy // 2) if shifted else (xx, yy)
        x1, y1, x2, y2 = x // wx, y // wy, x % wx, y % wy
        if axis == "y":                       # the same construction with the axes' roles swapped
            x1, y1, x2, y2 = y1, x1, y2, x2
        inner = (x2, y2 if x2 % 2 == 0 else -y2)
        keys.append((y1, x1 if y1 % 2 == 0 else -x1) + (inner if y1 % 2 == 0 else (-inner[0], -inner[1])))
    return sorted(range(len(keys)), key=keys.__getitem__)


def _reference_flatformer(x, coords, params, *, num_heads, group_size=69, window_shape=(9, 9, 1),
                          sparse_shape=(468, 468, 1), axis="x", shifted=False, activation="gelu",
                          pos_temperature=10000.0, normalize_pos=False, last_group="duplicate"):
    """Explicit form: dense masked softmax attention over all N tokens with M_ij = [j in group of
    i] built from a Python tuple sort, then the post-norm MLP written out."""
    from scipy.special import erf

    B, N, C = x.shape
    d = C // num_heads
    pe = flatformer_positional_embedding(coords, C, sparse_shape=sparse_shape, pos_temperature=pos_temperature,
                                         normalize_pos=normalize_pos)
    w, bb = params["attn.attn.in_proj_weight"], params["attn.attn.in_proj_bias"]
    out = np.empty_like(x)
    G = min(group_size, N)
    ln = lambda t, g, b: (t - t.mean(-1, keepdims=True)) / np.sqrt(t.var(-1, keepdims=True) + 1e-5) * g + b  # noqa: E731
    for b in range(B):
        order = _brute_force_order(coords[b], window_shape, axis, shifted)
        rank = np.empty(N, dtype=int)
        rank[order] = np.arange(N)
        mask = np.zeros((N, N), dtype=bool)
        r = N % G
        for i in range(N):
            ri = rank[i]
            if r and ri >= N - r:
                lo = N - r if last_group == "mask" else N - G
                mask[i] = rank >= lo
            else:
                mask[i] = rank // G == ri // G
        qk = x[b] + pe[b]
        q, k, v = qk @ w[:, :C] + bb[:C], qk @ w[:, C:2 * C] + bb[C:2 * C], x[b] @ w[:, 2 * C:] + bb[2 * C:]
        a = np.zeros((N, C))
        for hh in range(num_heads):
            sl = slice(hh * d, (hh + 1) * d)
            s = np.where(mask, q[:, sl] @ k[:, sl].T / np.sqrt(d), -np.inf)
            e = np.exp(s - s.max(-1, keepdims=True))
            a[:, sl] = (e / e.sum(-1, keepdims=True)) @ v[:, sl]
        h1 = ln(x[b] + a @ params["attn.attn.out_proj.weight"] + params["attn.attn.out_proj.bias"],
                params["norm1.weight"], params["norm1.bias"])
        f = h1 @ params["fc1.weight"] + params["fc1.bias"]
        f = 0.5 * f * (1 + erf(f / np.sqrt(2))) if activation == "gelu" else np.maximum(f, 0)
        out[b] = ln(h1 + f @ params["fc2.weight"] + params["fc2.bias"], params["norm2.weight"], params["norm2.bias"])
    return out


def _check_order_is_brute_force_sort(rng):
    """The arithmetic key's argsort equals the lexicographic tuple sort, for all four orders, odd
    windows and sizes, and a sparse shape much larger than the occupied region."""
    bad = 0
    for ws, ss in (((3, 2, 1), (7, 6, 1)), ((4, 5, 1), (13, 11, 1)), ((13, 13, 1), (468, 468, 1))):
        c = _distinct_coords(rng, 2, 30, min(ss[0], 40), min(ss[1], 40))
        for axis, shifted in FLATFORMER_BLOCK_ORDERS:
            perm = flattened_window_order(c, window_shape=ws, sparse_shape=ss, axis=axis, shifted=shifted)
            for b in range(2):
                bad += int(list(perm[b]) != _brute_force_order(c[b], ws, axis, shifted))
    assert bad == 0, bad
    return 0.0


def _check_groups_equal_size_and_cover(rng):
    """Every group has G key slots; every token is owned by exactly one slot; the last group of
    the duplicate mode is the last G sorted positions, and its padding copies are never owned."""
    for n in (7, 9, 12, 23):
        for G in (1, 3, 4, 5, 30):
            idx, own, keep = equal_size_groups(n, G)
            Gp = min(G, n)
            assert idx.shape == (-(-n // Gp), Gp)
            flat = idx.reshape(-1)
            assert np.array_equal(flat[own], np.arange(n))
            assert len(set(own.tolist())) == n
            if n % Gp:
                assert np.array_equal(idx[-1], np.arange(n - Gp, n))
            assert keep.all()
    return 0.0


def _check_flatformer_mask_mode_fd(rng):
    """``last_group="mask"`` and ReLU: a random-direction derivative check and the dense reference."""
    from ...testing import directional_check  # lazy: testing imports the registry

    s = _sample_flatformer(rng, "small")
    s.config.update(last_group="mask", activation="relu")
    err = directional_check(flatformer_layer_forward, flatformer_layer_backward, s).max_rel
    ref = _reference_flatformer(**s.inputs, params=s.params, **s.config)
    e2 = float(np.max(np.abs(flatformer_layer(**s.inputs, params=s.params, **s.config) - ref)))
    assert err < 1e-6 and e2 < 1e-12, (err, e2)
    return max(err, e2)


def _check_gradients_equal_dense_form(rng):
    """The fast form's hand-derived gradients equal the explicit form's (central difference of
    the registry reference along a random direction over every input and parameter)."""
    from ._samples import reference_gradient_error

    err = reference_gradient_error(flatformer_layer_forward, flatformer_layer_backward, _reference_flatformer, _sample_flatformer(rng, "small"), rng)
    assert err < 1e-6, err
    return err


register(
    Mechanism(
        slug="flatformer_flattened_window_attention", family="4-linear-kernel-sparse", tier="T2",
        title="FlatFormer: flattened, equal-size group attention for point clouds",
        paper="Liu, Yang, Zhao, Chen, Mao, Han, 'FlatFormer: Flattened Window Attention for Efficient Point "
              "Cloud Transformer', CVPR 2023, arXiv 2301.08739",
        seeds=("5-32",),
        official_code="mit-han-lab/flatformer mmdet3d/models/middle_encoders/flatformer.py"
                      "@31dc5a923915040682ec4f7c05df35737227a8f5",
        forward=flatformer_layer_forward, backward=flatformer_layer_backward, sample=_sample_flatformer,
        reference=_reference_flatformer,
        checks={"order_is_brute_force_tuple_sort": _check_order_is_brute_force_sort,
                "gradients_equal_dense_form": _check_gradients_equal_dense_form,
                "groups_equal_size_and_cover": _check_groups_equal_size_and_cover,
                "mask_mode_directional_and_dense_reference": _check_flatformer_mask_mode_fd},
        docs="linear/l6a.md#flatformer-flattened-window-attention",
    ),
)
