r"""PDEformer graph-Transformer attention: multi-head self-attention over the nodes of a PDE's
computational graph, biased by learned embeddings of the directed shortest-path distance in both
directions.

Papers: Zhanhong Ye, Xiang Huang, Leheng Chen, Hongsheng Liu, Zidong Wang, Bin Dong, "PDEformer:
Towards a Foundation Model for One-Dimensional Partial Differential Equations", arXiv 2402.12652
(2024); Zhanhong Ye, Zining Liu, Bingyang Wu, Hongjie Jiang, Leheng Chen, Minyan Zhang, Xiang Huang,
Qinghe Meng, Jingyuan Zou, Hongsheng Liu, Bin Dong, "PDEformer-2: A Versatile Foundation Model for
Two-Dimensional Partial Differential Equations", arXiv 2507.15409 (2025). Upstream (MindSpore):
functoreality/pdeformer-2 ``src/cell/pdeformer/graphormer/graphormer_layer.py`` (``GraphAttnBias``) and
``src/cell/pdeformer/graphormer/multihead_attention.py`` (``MultiheadAttention``)
@ 90330bfded4d66117fb3599286ca01bee4247137. The PDEformer-1 repository could not be retrieved here;
PDEformer-2 is the same group's successor and keeps the Graphormer encoder.

Which part of the model
-----------------------
PDEformer writes the PDE as a directed acyclic graph (nodes for the unknown field, operators,
coefficients, initial/boundary functions), embeds every node (type embedding, in/out-degree
embeddings, a function encoder for function-valued nodes), runs a Graphormer encoder, and decodes
the solution with an implicit neural representation (a Poly-INR whose layers are modulated by
hypernetworks fed with the encoder's node outputs). This module implements the two components the
paper introduces: the encoder's attention with its DAG bias (the registry record: it carries the
graph structure), and the INR decoder (``pdeformer_inr_forward``/``pdeformer_inr_backward``, the
Poly-INR with scale/shift hypernetworks, below). The node embedding and the encoder's feed-forward
sublayers and layer norms are standard layers left to the docs text.

Forward
-------
Node features $X\in\mathbb R^{N\times C}$, $H$ heads of width $d = C/H$, directed shortest-path
lengths $\phi(i, j)\in\{0,\dots,S-1\}$ (integers, upstream ``spatial_pos``), learned tables
$T^{\to}, T^{\leftarrow}\in\mathbb R^{S\times H}$ and an optional additive bias $A$ (upstream
``attn_bias``, e.g. the graph-token terms):

$$B_{h,ij} = T^{\to}[\phi(i,j), h] + T^{\leftarrow}[\phi(j,i), h] + A_{ij},$$

$$Q = (XW_q + b_q)/\sqrt d,\quad K = XW_k + b_k,\quad V = XW_v + b_v,\qquad
Y = \big[\mathrm{softmax}_j(Q_hK_h^\top + B_h + M)\,V_h\big]_{\text{heads}}\,W_o + b_o,$$

$M$ the key-padding mask ($-\infty$ on padded keys). Graphormer's undirected graphs use
$b_{\phi(i,j)}$ alone; for a DAG the reverse-direction term $d_{\phi(j,i)}$ is what PDEformer adds
(upstream comment: "For DAGs, we use A_ij = .. + b_phi(i,j) + d_phi(j,i)").

Backward
--------
The softmax-attention VJP (``attention_core_backward``) gives the score gradient $dS$; the bias is
additive, so $dA_{ij} = \sum_h dS_{h,ij}$ and the tables receive scatter-adds (the adjoints of the
gathers, the selection $\phi$ held fixed):

$$dT^{\to}[s, h] = \sum_{b}\sum_{(i,j):\,\phi(i,j)=s} dS_{b,h,ij},\qquad
dT^{\leftarrow}[s, h] = \sum_{b}\sum_{(i,j):\,\phi(j,i)=s} dS_{b,h,ij}.$$

The projections are Linear layers; the $1/\sqrt d$ on $Q$ after its bias gives
$dW_q = X^\top dQ/\sqrt d$, $db_q = \sum dQ/\sqrt d$. $dX$ sums the three input projections.

Conventions
-----------
* Batch-first ``(B, N, C)``; upstream is node-first ``(N, B, C)`` (a transpose).
* Parameter names are upstream's: ``spatial_pos_encoder.embedding_table`` and
  ``spatial_pos_encoder_rev.embedding_table`` ``(S, H)`` (``GraphAttnBias``), ``q_proj``, ``k_proj``,
  ``v_proj``, ``out_proj`` (``.weight`` stored ``(in, out)``, the transpose of MindSpore's
  ``nn.Dense.weight``; ``.bias``).
* Row 0 of each table is the embedding's ``padding_idx``: MindSpore zero-initialises it; the
  backward returns its scatter-add gradient like any other row (MindSpore's ``nn.Embedding`` does
  not freeze it; PyTorch's ``padding_idx`` would).
* ``key_padding_mask`` ``(B, N)``, True = padded node (upstream: ``node_type == 0``); a graph must keep
  at least one node.
* Upstream casts to float16 for the projections and float32 for the softmax; this runs in the
  input's dtype. Attention dropout is training-only and not applied.

INR decoder
-----------
``PolyINRWithHypernet`` with upstream defaults (scale and shift modulations, no affine modulation,
LeakyReLU(0.2) clamped to $\pm 256$, identity affine activation, one hypernetwork per hidden layer):

$$h_0 = 1,\qquad h_{l+1} = \mathrm{clamp}_{\pm c}\,\mathrm{LReLU}\Big((1+\sigma_l)\odot
\big((h_l\odot(xA_l + a_l))D_l + d_l\big) + \beta_l\Big),\qquad u = h_{L-1}W + w,$$

with $\sigma_l, \beta_l$ the outputs of ReLU MLPs (``scale_hypernets.{l}``, ``shift_hypernets.{l}``)
applied to ``hyper_in[l]``, the encoder outputs at the graph's decoder-feeding nodes. Backward: with
$dm_l = dh_{l+1}\odot\mathrm{LReLU}'(m_l)\odot[\lvert\mathrm{LReLU}(m_l)\rvert\le c]$,
$d\sigma_l = \sum_n dm_l\odot e_l$ ($e_l$ the dense output), $d\beta_l = \sum_n dm_l$,
$de_l = (1+\sigma_l)\odot dm_l$, then the dense layer's VJP gives $dp_l$ for $p_l = h_l\odot a_l$:
$da_l = dp_l\odot h_l$, $dh_l = dp_l\odot a_l$; $dx$ sums the affine layers' input gradients and
$dz_l$ the two hypernetworks' (ReLU MLP VJPs). At the LeakyReLU/ReLU/clamp kinks the derivative of
the active branch is taken (autograd's convention); the tests draw kink-free samples.
Transcribed ``PolyINR.construct``/``PolyINRWithHypernet``/``MLP`` in float64 ($B = 2$, $N = 7$,
$L = 4$, hidden 6, 2-layer hypernetworks): output 4.6e-16, every gradient <= 1.0e-15 (relative to
$\max(1, \text{largest entry})$).

Agreement with upstream
-----------------------
MindSpore is not installable here, so ``GraphAttnBias`` and ``MultiheadAttention.construct`` were
transcribed line for line into a PyTorch float64 scratch script (node-first layout, ``view``/
``transpose`` as upstream). $B = 2$, $N = 6$, $C = 8$, $H = 2$, $S = 5$, one padded node, an additive
``attn_bias``, parameters $\sim N(0, 0.25)$: maximum error relative to $\max(1, \text{largest entry})$,
output 3.0e-16, gradients of ``x``, ``attn_bias``, both tables and every projection <= 1.5e-15
(``k_proj.bias``, whose exact gradient is zero, included).
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_int, check_params, check_positive, compute_dtype
from ..attention.softmax import attention_core_backward, attention_core_forward
from ..nn.activations import relu, relu_grad
from ..nn.linear import (
    linear_prefixed,
    linear_prefixed_spec,
    linear_prefixed_vjp,
    merge_heads,
    split_heads,
)
from ..registry import Mechanism, Sample, register

__all__ = ["pdeformer_attention_forward", "pdeformer_attention_backward", "pdeformer_attention",
           "init_pdeformer_attention_params", "dag_spatial_bias", "pdeformer_inr_forward", "pdeformer_inr_backward",
           "init_pdeformer_inr_params"]

_PROJ = ("q_proj", "k_proj", "v_proj", "out_proj")
_FWD, _REV = "spatial_pos_encoder.embedding_table", "spatial_pos_encoder_rev.embedding_table"


def dag_spatial_bias(spatial_pos, table_fwd, table_rev) -> np.ndarray:
    r"""$B_{h,ij} = T^{\to}[\phi(i,j), h] + T^{\leftarrow}[\phi(j,i), h]$ (``GraphAttnBias`` without ``attn_bias``).

    ``spatial_pos`` integer ``(B, N, N)``, tables ``(S, H)`` -> ``(B, H, N, N)``.
    """
    sp = np.asarray(spatial_pos)
    b = table_fwd[sp] + table_rev[np.swapaxes(sp, -1, -2)]       # (B, N, N, H)
    return np.moveaxis(b, -1, 1)


def _scatter(ds, index, s):
    # Adjoint of table[index] for ds (B, H, N, N) and index (B, N, N): (S, H).
    h = ds.shape[1]
    flat = index.reshape(-1)
    out = np.empty((s, h), dtype=ds.dtype)
    for hh in range(h):
        out[:, hh] = np.bincount(flat, weights=ds[:, hh].reshape(-1), minlength=s)
    return out


def _validate(x, attn_bias, spatial_pos, params, num_heads, key_padding_mask):
    x = as_float(x, "x", ndim=3)
    b, n, c = x.shape
    h = check_int(num_heads, "num_heads", minimum=1)
    if c % h:
        raise ValueError(f"the width C={c} (x's last axis) must be divisible by num_heads={h}")
    if not isinstance(params, dict) or _FWD not in params:
        raise ValueError(f"params must be a dict with {_FWD!r} (S, H) and the projections")
    s = as_float(params[_FWD], _FWD, ndim=2).shape[0]
    spec = {_FWD: (s, h), _REV: (s, h)}
    for name in _PROJ:
        spec.update(linear_prefixed_spec(name, c, c))
    p = check_params(params, spec)
    sp = np.asarray(spatial_pos)
    if sp.dtype.kind not in "iu":
        raise TypeError(f"spatial_pos must be an integer array; got dtype {sp.dtype}")
    if sp.shape != (b, n, n):
        raise ValueError(f"spatial_pos must have shape (B={b}, N={n}, N={n}); got {sp.shape}")
    if sp.size and (sp.min() < 0 or sp.max() >= s):
        raise ValueError(f"spatial_pos entries must lie in [0, S={s}) (S = the tables' rows); "
                         f"got range [{sp.min()}, {sp.max()}]")
    a = None
    if attn_bias is not None:
        a = as_float(attn_bias, "attn_bias", ndim=3)
        if a.shape != (b, n, n):
            raise ValueError(f"attn_bias must have shape (B={b}, N={n}, N={n}); got {a.shape}")
    mask = None
    if key_padding_mask is not None:
        kp = np.asarray(key_padding_mask)
        if kp.dtype != np.bool_:
            raise TypeError(f"key_padding_mask must be boolean (True = padded node); got dtype {kp.dtype}")
        if kp.shape != (b, n):
            raise ValueError(f"key_padding_mask must have shape (B={b}, N={n}); got {kp.shape}")
        if kp.all(axis=1).any():
            raise ValueError("key_padding_mask pads every node of a graph; keep at least one")
        mask = ~kp[:, None, None, :]
    dt = compute_dtype(x, *p.values(), *(() if a is None else (a,)))
    return (x.astype(dt, copy=False), None if a is None else a.astype(dt, copy=False), sp, cast_all(dt, p), h,
            mask)


def pdeformer_attention_forward(x, attn_bias, params, *, spatial_pos, num_heads: int, key_padding_mask=None):
    r"""PDEformer's graph-biased multi-head self-attention (module docstring).

    Parameters
    ----------
    x : array (B, N, C)
        Node features of the PDE graphs (batch-first).
    attn_bias : array (B, N, N) or None
        Additive score bias shared by the heads (upstream ``attn_bias``).
    params : dict
        ``spatial_pos_encoder.embedding_table (S, H)``, ``spatial_pos_encoder_rev.embedding_table (S, H)``,
        ``q_proj``/``k_proj``/``v_proj``/``out_proj`` ``.weight (C, C)`` and ``.bias (C,)``.
    spatial_pos : int array (B, N, N)
        Directed shortest-path lengths $\phi(i, j)$ in ``[0, S)`` (not differentiated).
    num_heads : int
    key_padding_mask : bool array (B, N), optional
        True = padded node (excluded as a key).

    Returns
    -------
    out, cache
        ``out (B, N, C)``.
    """
    x, a, sp, p, h, mask = _validate(x, attn_bias, spatial_pos, params, num_heads, key_padding_mask)
    bias = dag_spatial_bias(sp, p[_FWD], p[_REV])
    if a is not None:
        bias = bias + a[:, None]
    q, k, v = (split_heads(linear_prefixed(p, name, x), h) for name in _PROJ[:3])
    o, core = attention_core_forward(q, k, v, bias, attn_mask=mask)
    om = merge_heads(o)
    out = linear_prefixed(p, "out_proj", om)
    return out, dict(p=p, x=x, sp=sp, h=h, has_a=a is not None, core=core, om=om, out_shape=out.shape)


def pdeformer_attention_backward(dout, cache):
    """Gradients of :func:`pdeformer_attention_forward`: ``x``, ``attn_bias`` (when given), both tables and the projections."""
    p, x, sp = cache["p"], cache["x"], cache["sp"]
    g = as_dout(dout, cache["out_shape"], x.dtype)
    grads = {}
    dom = linear_prefixed_vjp(grads, p, "out_proj", g, cache["om"])
    gc = attention_core_backward(split_heads(dom, cache["h"]), cache["core"])
    dx = np.zeros_like(x)
    for name, key in zip(_PROJ[:3], ("q", "k", "v")):
        dx = dx + linear_prefixed_vjp(grads, p, name, merge_heads(gc[key]), x)
    grads["x"] = dx
    ds = gc["bias"]                                              # (B, H, N, N)
    s = p[_FWD].shape[0]
    grads[_FWD] = _scatter(ds, sp, s)
    grads[_REV] = _scatter(ds, np.swapaxes(sp, -1, -2), s)
    if cache["has_a"]:
        grads["attn_bias"] = ds.sum(axis=1)
    return grads


def pdeformer_attention(x, attn_bias, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`pdeformer_attention_forward`."""
    return pdeformer_attention_forward(x, attn_bias, params, **config)[0]


def init_pdeformer_attention_params(rng, c: int, num_heads: int, num_spatial: int, *, dtype=np.float64) -> dict:
    """Upstream's initialisation: tables $N(0, 0.02^2)$ with row 0 zero (``padding_idx=0``); q/k/v weights
    Xavier-uniform with gain $1/\\sqrt2$ and biases $U(-1/\\sqrt C, 1/\\sqrt C)$; ``out_proj`` Xavier-uniform
    (gain 1) with zero bias."""
    c, h, s = check_int(c, "c", minimum=1), check_int(num_heads, "num_heads", minimum=1), \
        check_int(num_spatial, "num_spatial", minimum=1)
    p = {}
    for key in (_FWD, _REV):
        t = 0.02 * rng.standard_normal((s, h))
        t[0] = 0.0
        p[key] = t
    for name in _PROJ:
        gain = 1.0 if name == "out_proj" else 1.0 / np.sqrt(2.0)
        bd = gain * np.sqrt(6.0 / (2 * c))
        p[f"{name}.weight"] = rng.uniform(-bd, bd, (c, c))
        sc = 1.0 / np.sqrt(c)
        p[f"{name}.bias"] = np.zeros(c) if name == "out_proj" else rng.uniform(-sc, sc, c)
    return {k: np.asarray(v, dtype=dtype) for k, v in p.items()}


# --------------------------------------------------------------------------------------------
# The INR decoder: Poly-INR whose hidden layers are scaled and shifted by hypernetworks


def _mlp_keys(prefix, n_layers):
    if n_layers == 1:
        return [f"{prefix}.net"]
    return [f"{prefix}.net.{2 * k}" for k in range(n_layers)]


def _mlp_forward(p, prefix, n_layers, z):
    keys = _mlp_keys(prefix, n_layers)
    pre = []
    for i, key in enumerate(keys):
        z = linear_prefixed(p, key, z)
        if i < len(keys) - 1:
            pre.append(z)
            z = relu(z)
    return z, pre


def _mlp_backward(grads, p, prefix, n_layers, z0, pre, g):
    keys = _mlp_keys(prefix, n_layers)
    ins = [z0] + [relu(a) for a in pre]
    for i in range(len(keys) - 1, -1, -1):
        g = linear_prefixed_vjp(grads, p, keys[i], g, ins[i])
        if i > 0:
            g = g * relu_grad(pre[i - 1])
    return g


def _validate_inr(coordinate, hyper_in, params, num_layers, hyper_num_layers, negative_slope, clamp):
    x = as_float(coordinate, "coordinate", ndim=3)
    z = as_float(hyper_in, "hyper_in", ndim=3)
    nl = check_int(num_layers, "num_layers", minimum=2)
    hl = check_int(hyper_num_layers, "hyper_num_layers", minimum=1)
    if z.shape[0] != nl - 1 or z.shape[1] != x.shape[0]:
        raise ValueError(f"hyper_in must have shape (num_layers-1={nl - 1}, B={x.shape[0]}, hyper_dim_in); "
                         f"got {z.shape}")
    if not isinstance(params, dict) or "inr.dense_layers.0.weight" not in params or "inr.last_layer.weight" not in params:
        raise ValueError("params must hold 'inr.dense_layers.0.weight' (hidden, hidden) and 'inr.last_layer.weight'")
    hd = as_float(params["inr.dense_layers.0.weight"], "inr.dense_layers.0.weight", ndim=2).shape[0]
    do = as_float(params["inr.last_layer.weight"], "inr.last_layer.weight", ndim=2).shape[1]
    hh = hd if hl == 1 else as_float(params.get("scale_hypernets.0.net.0.weight", np.zeros((1, 1))),
                                     "scale_hypernets.0.net.0.weight", ndim=2).shape[1]
    spec = {}
    for lyr in range(nl - 1):
        spec.update(linear_prefixed_spec(f"inr.affines.{lyr}", x.shape[2], hd))
        spec.update(linear_prefixed_spec(f"inr.dense_layers.{lyr}", hd, hd))
        for kind in ("scale", "shift"):
            keys = _mlp_keys(f"{kind}_hypernets.{lyr}", hl)
            dims = [z.shape[2]] + [hh] * (hl - 1) + [hd]
            for i, key in enumerate(keys):
                spec.update(linear_prefixed_spec(key, dims[i], dims[i + 1]))
    spec.update(linear_prefixed_spec("inr.last_layer", hd, do))
    p = check_params(params, spec)
    ns = float(negative_slope)
    if not 0.0 <= ns < 1.0:
        raise ValueError(f"negative_slope must lie in [0, 1); got {negative_slope}")
    cl = check_positive(clamp, "clamp")
    dt = compute_dtype(x, z, *p.values())
    return x.astype(dt, copy=False), z.astype(dt, copy=False), cast_all(dt, p), nl, hl, ns, float(cl)


def pdeformer_inr_forward(coordinate, hyper_in, params, *, num_layers: int, hyper_num_layers: int,
                          negative_slope: float = 0.2, clamp: float = 256.0):
    r"""PDEformer's INR decoder: Poly-INR with scale and shift hypernetworks (upstream
    ``PolyINRWithHypernet`` with its defaults ``enable_scale=enable_shift=True``, ``enable_affine=False``,
    ``activation_fn="lrelu"``, ``affine_act_fn="identity"``, one hypernetwork per hidden layer).

    $$h_0 = 1,\quad h_{l+1} = \mathrm{clamp}_{\pm c}\,\mathrm{LReLU}\Big((1+\sigma_l)\odot
    \big((h_l\odot(xA_l + a_l))D_l + d_l\big) + \beta_l\Big),\quad u = h_{L-1}W + w,$$

    $\sigma_l = \mathrm{MLP}^{\text{scale}}_l(z_l)$, $\beta_l = \mathrm{MLP}^{\text{shift}}_l(z_l)$ (ReLU hidden
    layers), $z_l$ = ``hyper_in[l]`` (the graph encoder's outputs at the decoder-feeding nodes).

    Parameters
    ----------
    coordinate : array (B, N, dim_in)
        Query coordinates (e.g. $(t, x)$).
    hyper_in : array (num_layers - 1, B, hyper_dim_in)
    params : dict
        ``inr.affines.{l}``, ``inr.dense_layers.{l}``, ``inr.last_layer`` and ``{scale,shift}_hypernets.{l}.net.{2k}``
        (``.net`` when ``hyper_num_layers == 1``), each ``.weight (in, out)`` and ``.bias``.
    num_layers, hyper_num_layers : int
        Upstream ``inr_num_layers`` and ``hyper_num_layers``.
    negative_slope, clamp : float
        LeakyReLU slope (0.2) and the clamp threshold (256), as upstream.

    Returns
    -------
    out, cache
        ``out (B, N, dim_out)``.
    """
    x, z, p, nl, hl, ns, cl = _validate_inr(coordinate, hyper_in, params, num_layers, hyper_num_layers,
                                            negative_slope, clamp)
    h = None
    layers = []
    for lyr in range(nl - 1):
        sc, sc_pre = _mlp_forward(p, f"scale_hypernets.{lyr}", hl, z[lyr])
        sh, sh_pre = _mlp_forward(p, f"shift_hypernets.{lyr}", hl, z[lyr])
        a = linear_prefixed(p, f"inr.affines.{lyr}", x)
        prod = a if h is None else h * a
        d = linear_prefixed(p, f"inr.dense_layers.{lyr}", prod)
        m = (1.0 + sc[:, None]) * d + sh[:, None]
        lr = np.where(m > 0, m, ns * m)
        layers.append(dict(sc=sc, sc_pre=sc_pre, sh_pre=sh_pre, a=a, h_in=h, prod=prod, d=d, m=m,
                           live=(np.abs(lr) <= cl)))
        h = np.clip(lr, -cl, cl)
    out = linear_prefixed(p, "inr.last_layer", h)
    return out, dict(p=p, x=x, z=z, nl=nl, hl=hl, ns=ns, h=h, layers=layers, out_shape=out.shape)


def pdeformer_inr_backward(dout, cache):
    """Gradients of :func:`pdeformer_inr_forward`: ``coordinate``, ``hyper_in`` and every params key
    (the LeakyReLU and clamp kinks take the one-sided derivative of the active branch, as autograd)."""
    p, x, z, hl = cache["p"], cache["x"], cache["z"], cache["hl"]
    g = as_dout(dout, cache["out_shape"], x.dtype)
    grads = {}
    dh = linear_prefixed_vjp(grads, p, "inr.last_layer", g, cache["h"])
    dx = np.zeros_like(x)
    dz = np.zeros_like(z)
    for lyr in range(cache["nl"] - 2, -1, -1):
        c = cache["layers"][lyr]
        dm = dh * np.where(c["m"] > 0, 1.0, cache["ns"]) * c["live"]
        dsc = np.sum(dm * c["d"], axis=1)
        dsh = np.sum(dm, axis=1)
        dprod = linear_prefixed_vjp(grads, p, f"inr.dense_layers.{lyr}", dm * (1.0 + c["sc"][:, None]), c["prod"])
        if c["h_in"] is None:
            da = dprod
        else:
            da = dprod * c["h_in"]
            dh = dprod * c["a"]
        dx = dx + linear_prefixed_vjp(grads, p, f"inr.affines.{lyr}", da, x)
        dz[lyr] = (_mlp_backward(grads, p, f"scale_hypernets.{lyr}", hl, z[lyr], c["sc_pre"], dsc)
                   + _mlp_backward(grads, p, f"shift_hypernets.{lyr}", hl, z[lyr], c["sh_pre"], dsh))
    grads["coordinate"], grads["hyper_in"] = dx, dz
    return grads


def init_pdeformer_inr_params(rng, dim_in: int, dim_out: int, dim_hidden: int, num_layers: int, hyper_dim_in: int,
                              hyper_dim_hidden: int, hyper_num_layers: int, *, dtype=np.float64) -> dict:
    """Kaiming-uniform Dense layers (upstream ``UniformInitDense`` without ``modify_he_init``:
    $U(-1/\\sqrt{\\text{in}}, 1/\\sqrt{\\text{in}})$ for weight and bias)."""
    p = {}

    def lin(key, n_in, n_out):
        bd = 1.0 / np.sqrt(n_in)
        p[f"{key}.weight"] = rng.uniform(-bd, bd, (n_in, n_out))
        p[f"{key}.bias"] = rng.uniform(-bd, bd, n_out)

    for lyr in range(num_layers - 1):
        lin(f"inr.affines.{lyr}", dim_in, dim_hidden)
        lin(f"inr.dense_layers.{lyr}", dim_hidden, dim_hidden)
        for kind in ("scale", "shift"):
            keys = _mlp_keys(f"{kind}_hypernets.{lyr}", hyper_num_layers)
            dims = [hyper_dim_in] + [hyper_dim_hidden] * (hyper_num_layers - 1) + [dim_hidden]
            for i, key in enumerate(keys):
                lin(key, dims[i], dims[i + 1])
    lin("inr.last_layer", dim_hidden, dim_out)
    return {k: np.asarray(v, dtype=dtype) for k, v in p.items()}


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size):
    n, c, h, s = (3, 4, 2, 3) if size == "tiny" else (7, 8, 2, 5)
    p = init_pdeformer_attention_params(rng, c, h, s)
    for key in (_FWD, _REV):
        p[key] = 0.5 * rng.standard_normal((s, h))              # visible bias (row 0 too)
    for name in _PROJ:
        p[f"{name}.bias"] = 0.3 * rng.standard_normal(c)
    kp = np.zeros((2, n), bool)
    if size == "small":
        kp[1, -1] = True
    return Sample(inputs={"x": rng.standard_normal((2, n, c)), "attn_bias": 0.5 * rng.standard_normal((2, n, n))},
                  params=p, config={"spatial_pos": rng.integers(0, s, (2, n, n)), "num_heads": h,
                                    "key_padding_mask": kp})


def _softmax(z):
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _reference(x, attn_bias, params, *, spatial_pos, num_heads, key_padding_mask=None):
    # Per (graph, head, query) loops with the bias read entry by entry from the two tables.
    b, n, c = x.shape
    d = c // num_heads
    out = np.zeros_like(x)
    for bb in range(b):
        q, k, v = (x[bb] @ params[f"{nm}.weight"] + params[f"{nm}.bias"] for nm in _PROJ[:3])
        o = np.zeros((n, c))
        for hh in range(num_heads):
            sl = slice(hh * d, (hh + 1) * d)
            for i in range(n):
                srow = np.array([q[i, sl] @ k[j, sl] / np.sqrt(d) + params[_FWD][spatial_pos[bb, i, j], hh]
                                 + params[_REV][spatial_pos[bb, j, i], hh]
                                 + (0.0 if attn_bias is None else attn_bias[bb, i, j]) for j in range(n)])
                if key_padding_mask is not None:
                    srow = np.where(key_padding_mask[bb], -np.inf, srow)
                o[i, sl] = _softmax(srow) @ v[:, sl]
        out[bb] = o @ params["out_proj.weight"] + params["out_proj.bias"]
    return out


def _check_reverse_term_is_directional(rng):
    # On a DAG the reverse table sees phi transposed: with T_rev = T_fwd and a symmetric phi the
    # bias is 2 T[phi]; with a non-symmetric phi the two terms differ (what a DAG needs).
    s = _sample(rng, "small")
    sp = s.config["spatial_pos"]
    t = s.params[_FWD]
    sym = np.triu(sp) + np.swapaxes(np.triu(sp, 1), -1, -2)
    err = float(np.abs(dag_spatial_bias(sym, t, t) - 2 * np.moveaxis(t[sym], -1, 1)).max())
    assert err == 0.0, f"symmetric phi: bias is not 2 T[phi] ({err:.2e})"
    asym = np.abs(dag_spatial_bias(sp, t, t) - 2 * np.moveaxis(t[sp], -1, 1)).max()
    assert asym > 1e-3, "the reverse term did not see the transposed path lengths"
    return err


def _check_padding_isolated(rng):
    # A padded node changes nothing for the others: drop it and the remaining outputs agree.
    s = _sample(rng, "small")
    x, a, kp = s.inputs["x"], s.inputs["attn_bias"], s.config["key_padding_mask"]
    out = pdeformer_attention(x, a, s.params, **s.config)
    keep = ~kp[1]
    cfg = dict(s.config, spatial_pos=s.config["spatial_pos"][1:, keep][:, :, keep], key_padding_mask=None)
    sub = pdeformer_attention(x[1:, keep], a[1:, keep][:, :, keep], s.params, **cfg)
    err = float(np.abs(out[1:, keep] - sub).max())
    assert err < 1e-12, f"a padded node influences the others: {err:.2e}"
    return err


register(
    Mechanism(
        slug="pdeformer_graph_inr", family="3-operator", tier="T3",
        official_code="functoreality/pdeformer-2 src/cell/pdeformer/graphormer/@90330bf (MindSpore, not PyTorch)",
        title="PDEformer: graph-Transformer attention with forward and reverse shortest-path biases (DAG Graphormer)",
        paper="Ye, Huang, Chen, Liu, Wang, Dong, PDEformer: Towards a Foundation Model for One-Dimensional Partial "
              "Differential Equations, arXiv 2402.12652 (2024); PDEformer-2, arXiv 2507.15409 (2025)",
        forward=pdeformer_attention_forward, backward=pdeformer_attention_backward, sample=_sample,
        reference=_reference, docs="operators/o5a.md#pdeformer-graph-attention",
        checks={"reverse_term_is_directional": _check_reverse_term_is_directional,
                "padding_isolated": _check_padding_isolated},
    ),
)
