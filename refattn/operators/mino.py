r"""MINO encoder: a graph-neural-operator kernel integral onto latent points, then Perceiver cross-attention.

Paper: Shi, Ross, Asimaki, Azizzadenesheli, "Mesh-Informed Neural Operator: A Transformer Generative
Approach" (MINO), arXiv 2506.16656. Upstream: yzshi5/MINO
``models/mino_modules/encoder_supernodes_gno_cross_attention.py`` (``EncoderSupernodes``),
``models/mino_modules/modules/supernode_pooling_gno.py`` (``SupernodePooling``),
``models/mino_modules/modules/gno_block.py`` (``GNOBlock``),
``models/mino_modules/modules/integral_transform.py`` (``IntegralTransform``),
``models/mino_modules/conditioner_timestep.py`` (``ContinuousSincosEmbed``)
@ 143e4b4fea84018641479192dc91749ba1554d29; the blocks are BenediktAlkin/KappaModules
``kappamodules/transformer/perceiver_block.py``, ``kappamodules/attention/perceiver_attention.py``,
``kappamodules/transformer/mlp.py`` @ 748c370beabfcf2b06bfe60ff8e9e7502476ace6.

Which part of the model
-----------------------
MINO is the backbone of a functional flow-matching model: the **encoder** (this module) maps a
function sampled on any mesh to tokens at fixed latent points by a GNO kernel integral and refines
them by Perceiver blocks that cross-attend to the GNO tokens; a Perceiver **decoder** then lets
query embeddings of arbitrary output points cross-attend to the latent tokens (the same block,
:func:`mino_perceiver_block_forward`, with queries from an MLP of the output position and value
embeddings); the time conditioning (``DitPerceiverBlock``) of the generative model is an adaLN
modulation of these blocks and is left to this text.

Forward
-------
Input function $f_j$ on points $y_j$, latent points $x_i$, radius $r$, $A(x_i) = \{j:\lVert x_i -
y_j\rVert\le r\}$ (:func:`refattn.operators.gno_kernel_integral.radius_neighbors`). With the
sin-cos embedding $e(p) = [\sin(128\,p_c\,\omega_k), \cos(128\,p_c\,\omega_k)]_{c,k}$ (per
coordinate $c$, $\omega_k = 10000^{-2k/D_c}$, zero-padded to width $h$) and the lift
$\ell_j = f_jW_{lift} + b$:

$$t_i = \frac{1}{|A(x_i)|}\sum_{j\in A(x_i)}\kappa\big([e(y_j),\ e(x_i),\ \ell_j]\big)\qquad(\text{nonlinear kernel-only GNO, mean}),$$

$\kappa$ a GELU MLP $3h\to 2h\to h$. Then the Perceiver blocks ($\mathrm{LN}$ affine, $\epsilon = 10^{-6}$):

$$\mathrm{blk}(q, kv) = q' + \mathrm{MLP}(\mathrm{LN}_2(q')),\quad q' = q + \mathrm{Attn}\big(\mathrm{LN}_q(q)W_q,
[K|V] = \mathrm{LN}_{kv}(kv)W_{kv}\big)W_{proj},$$

multi-head softmax attention with scale $d_h^{-1/2}$ and a GELU MLP; $h_1 = \mathrm{blk}_1(t, t)$ and
$h_{k+1} = \mathrm{blk}_{k+1}(h_k, t)$: every block after the first cross-attends from the running
latent state to the GNO tokens $t$.

Backward
--------
The radius graph is held fixed (a selection); coordinates are not differentiated (fixed meshes
upstream). Block VJP: $dq = g + \mathrm{LN}_2^{*}(\mathrm{MLP}^{*}g)$ on the MLP branch, then the
attention VJP (``attention_core_backward``) through $W_{proj}$, $W_q$ into $\mathrm{LN}_q$ and through
$W_{kv}$ into $\mathrm{LN}_{kv}$, whose input gradient adds to the key/value source ($t$ for every
block, plus the running state for block 1 where $q = kv$). GNO: $d\kappa_{ij} = dt_i/|A(x_i)|$, the
kernel MLP VJP, the $\ell$ part of the kernel input scattered back to $j$, then the lift.

Conventions and upstream details
--------------------------------
* ``ContinuousSincosEmbed``'s scale 128 and layout (per coordinate: all sines then all cosines;
  coordinates concatenated; zero padding to $h$) are MINO's, not neuraloperator's
  ``SinusoidalEmbedding`` (the GNOBlock in MINO replaces it). Upstream computes $\omega$ in float32;
  here in the compute dtype.
* The kernel MLP is ``channel_mlp_layers=[2h, h]`` prepended with $3h$; the reduction is the mean
  (hard-coded in MINO's ``IntegralTransform``).
* ``enc_proj`` is an identity (``LinearProjection(optional=True)`` with equal widths).
* Upstream shares one point cloud over the batch (``input_pos[0]``): coordinates are ``(n, d)``.
* Linear weights ``(in, out)`` = ``nn.Linear.weight.T``; the kernel MLP keys follow
  ``named_parameters()`` (``supernode_pooling.message.channel_mlp.fcs.{i}``).

Agreement with upstream
-----------------------
``EncoderSupernodes`` in PyTorch float64 on CPU (depth 3, 4 heads, width 16, 150 points, 20 latent
points; the embedding frequencies recomputed in float64, upstream builds them in float32), maximum
error relative to the largest entry: output 7.6e-16, gradients <= 1.2e-14.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_int, check_params, check_positive, compute_dtype
from ..attention.softmax import attention_core_backward, attention_core_forward
from ..nn.activations import gelu, gelu_grad
from ..nn.linear import (
    init_linear_prefixed,
    linear_prefixed,
    linear_prefixed_spec,
    linear_prefixed_vjp,
    merge_heads,
    split_heads,
)
from ..nn.norms import normalize_backward, normalize_forward
from ..registry import Mechanism, Sample, register
from .gno_kernel_integral import radius_neighbors

__all__ = ["mino_encoder_forward", "mino_encoder_backward", "mino_encoder", "mino_sincos_embedding",
           "mino_perceiver_block_forward", "mino_perceiver_block_backward", "perceiver_block_spec",
           "init_mino_encoder_params", "init_perceiver_block_params"]

_G = "supernode_pooling.message"
_LN_EPS = 1e-6
_SINCOS_SCALE = 128.0


def mino_sincos_embedding(p: np.ndarray, dim: int, max_wavelength: float = 10000.0, scale: float = _SINCOS_SCALE):
    r"""MINO's ``ContinuousSincosEmbed``: $(\ldots, d)\to(\ldots,$ ``dim``$)$, per coordinate
    $[\sin(s\,p_c\omega_k)]_k$ then $[\cos(\cdot)]_k$, $\omega_k = w^{-2k/D_c}$, coordinates
    concatenated, zero-padded (``dim`` too small for one frequency per coordinate raises)."""
    nd = p.shape[-1]
    pad_nd = dim % nd
    sc_pad = ((dim - pad_nd) // nd) % 2
    eff = (dim - pad_nd - sc_pad * nd) // nd
    if eff <= 0:
        raise ValueError(f"the embedding width {dim} is too small for {nd}-D coordinates (needs >= {2 * nd})")
    omega = 1.0 / max_wavelength ** (np.arange(0, eff, 2, dtype=p.dtype) / eff)
    ang = scale * p[..., None] * omega
    emb = np.concatenate([np.sin(ang), np.cos(ang)], axis=-1).reshape(p.shape[:-1] + (nd * eff,))
    pad = dim - nd * eff
    return np.concatenate([emb, np.zeros(p.shape[:-1] + (pad,), dtype=p.dtype)], axis=-1) if pad else emb


def perceiver_block_spec(prefix: str, dim: int, kv_dim: int, mlp_hidden: int) -> dict:
    """The ``check_params`` spec of a kappamodules ``PerceiverBlock`` under ``prefix``."""
    spec = {f"{prefix}.norm1q.weight": (dim,), f"{prefix}.norm1q.bias": (dim,),
            f"{prefix}.norm1kv.weight": (kv_dim,), f"{prefix}.norm1kv.bias": (kv_dim,),
            f"{prefix}.norm2.weight": (dim,), f"{prefix}.norm2.bias": (dim,)}
    spec.update(linear_prefixed_spec(f"{prefix}.attn.q", dim, dim))
    spec.update(linear_prefixed_spec(f"{prefix}.attn.kv", kv_dim, 2 * dim))
    spec.update(linear_prefixed_spec(f"{prefix}.attn.proj", dim, dim))
    spec.update(linear_prefixed_spec(f"{prefix}.mlp.fc1", dim, mlp_hidden))
    spec.update(linear_prefixed_spec(f"{prefix}.mlp.fc2", mlp_hidden, dim))
    return spec


def _ln(p, prefix, x, eps):
    xh, st = normalize_forward(x, (x.ndim - 1,), eps)
    return xh * p[f"{prefix}.weight"] + p[f"{prefix}.bias"], (xh, st)


def _ln_vjp(grads, p, prefix, dy, c):
    xh, st = c
    grads[f"{prefix}.weight"] = grads.get(f"{prefix}.weight", 0.0) + np.sum(dy * xh, axis=tuple(range(dy.ndim - 1)))
    grads[f"{prefix}.bias"] = grads.get(f"{prefix}.bias", 0.0) + np.sum(dy, axis=tuple(range(dy.ndim - 1)))
    return normalize_backward(dy * p[f"{prefix}.weight"], xh, st)


def mino_perceiver_block_forward(q, kv, p, prefix: str, num_heads: int, eps: float = _LN_EPS):
    """Unvalidated kappamodules ``PerceiverBlock`` (no layer scale, no drop path): ``q (B, Nq, D)``
    attends to ``kv (B, Nkv, Dkv)``; returns ``(out, cache)``. ``p`` holds the keys of
    :func:`perceiver_block_spec` under ``prefix``."""
    dim = q.shape[-1]
    qn, cq = _ln(p, f"{prefix}.norm1q", q, eps)
    kvn, ckv = _ln(p, f"{prefix}.norm1kv", kv, eps)
    qh = split_heads(linear_prefixed(p, f"{prefix}.attn.q", qn), num_heads)
    kvp = linear_prefixed(p, f"{prefix}.attn.kv", kvn)
    kh, vh = split_heads(kvp[..., :dim], num_heads), split_heads(kvp[..., dim:], num_heads)
    o, ca = attention_core_forward(qh, kh, vh)
    om = merge_heads(o)
    q1 = q + linear_prefixed(p, f"{prefix}.attn.proj", om)
    m2, c2 = _ln(p, f"{prefix}.norm2", q1, eps)
    z = linear_prefixed(p, f"{prefix}.mlp.fc1", m2)
    out = q1 + linear_prefixed(p, f"{prefix}.mlp.fc2", gelu(z))
    return out, dict(prefix=prefix, heads=num_heads, qn=qn, kvn=kvn, cq=cq, ckv=ckv, ca=ca, om=om, m2=m2, c2=c2, z=z)


def mino_perceiver_block_backward(g, c, p, grads):
    """VJP of :func:`mino_perceiver_block_forward`: returns ``(dq, dkv)``; parameter gradients are
    added into ``grads``."""
    pre, h = c["prefix"], c["heads"]
    dz = linear_prefixed_vjp(grads, p, f"{pre}.mlp.fc2", g, gelu(c["z"])) * gelu_grad(c["z"])
    dq1 = g + _ln_vjp(grads, p, f"{pre}.norm2", linear_prefixed_vjp(grads, p, f"{pre}.mlp.fc1", dz, c["m2"]), c["c2"])
    dom = linear_prefixed_vjp(grads, p, f"{pre}.attn.proj", dq1, c["om"])
    ga = attention_core_backward(split_heads(dom, h), c["ca"])
    dqn = linear_prefixed_vjp(grads, p, f"{pre}.attn.q", merge_heads(ga["q"]), c["qn"])
    dkvn = linear_prefixed_vjp(grads, p, f"{pre}.attn.kv",
                               np.concatenate([merge_heads(ga["k"]), merge_heads(ga["v"])], axis=-1), c["kvn"])
    return dq1 + _ln_vjp(grads, p, f"{pre}.norm1q", dqn, c["cq"]), _ln_vjp(grads, p, f"{pre}.norm1kv", dkvn, c["ckv"])


def _blocks(params):
    names = ["first_block"] if "first_block.attn.q.weight" in params else []
    k = 0
    while f"rest_block.{k}.attn.q.weight" in params:
        names.append(f"rest_block.{k}")
        k += 1
    return names


def _validate(f, params, input_pos, query_pos, radius, num_heads):
    f = as_float(f, "f", ndim=3)
    b, n, c_in = f.shape
    ypos = as_float(input_pos, "input_pos", ndim=2)
    xpos = as_float(query_pos, "query_pos", ndim=2)
    if ypos.shape[0] != n:
        raise ValueError(f"input_pos must have shape (N={n}, d) (one point per row of f); got {ypos.shape}")
    if xpos.shape[1] != ypos.shape[1]:
        raise ValueError(f"query_pos must have shape (M, d={ypos.shape[1]}); got {xpos.shape}")
    radius = check_positive(radius, "radius")
    heads = check_int(num_heads, "num_heads", minimum=1)
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of arrays; got {type(params).__name__}")
    w = params.get(f"{_G}.lift_ffn.weight")
    if w is None:
        raise ValueError(f"params is missing '{_G}.lift_ffn.weight' (expected shape (C_in={c_in}, hidden))")
    h = as_float(w, f"{_G}.lift_ffn.weight", ndim=2).shape[1]
    if h % heads:
        raise ValueError(f"the hidden width {h} must be divisible by num_heads={heads}")
    spec = linear_prefixed_spec(f"{_G}.lift_ffn", c_in, h)
    widths = [3 * h]
    i = 0
    while f"{_G}.channel_mlp.fcs.{i}.weight" in params:
        widths.append(as_float(params[f"{_G}.channel_mlp.fcs.{i}.weight"], f"{_G}.channel_mlp.fcs.{i}.weight",
                               ndim=2).shape[1])
        spec.update(linear_prefixed_spec(f"{_G}.channel_mlp.fcs.{i}", widths[i], widths[i + 1]))
        i += 1
    if i == 0 or widths[-1] != h:
        raise ValueError(f"params needs the kernel MLP '{_G}.channel_mlp.fcs.{{i}}' from 3*hidden={3 * h} to hidden={h}")
    blocks = _blocks(params)
    if not blocks or blocks[0] != "first_block":
        raise ValueError("params is missing the Perceiver block 'first_block.*'")
    for blk in blocks:
        hid = as_float(params.get(f"{blk}.mlp.fc1.weight", np.zeros((1, 1))), f"{blk}.mlp.fc1.weight", ndim=2).shape[1]
        spec.update(perceiver_block_spec(blk, h, h, hid))
    p = check_params(params, spec)
    mino_sincos_embedding(ypos, h)                    # raises early when h is too small
    dt = compute_dtype(f, *p.values())                # coordinates follow the features' dtype
    return f.astype(dt, copy=False), ypos.astype(dt, copy=False), xpos.astype(dt, copy=False), cast_all(dt, p), \
        radius, heads, h, i, blocks


def mino_encoder_forward(f, params, *, input_pos, query_pos, radius: float, num_heads: int):
    r"""MINO encoder (module docstring): GNO onto ``query_pos``, then the Perceiver blocks.

    Parameters
    ----------
    f : array (B, N, C_in)
        Input function on the N mesh points.
    params : dict
        ``supernode_pooling.message.lift_ffn.{weight (C_in, h), bias}``,
        ``supernode_pooling.message.channel_mlp.fcs.{i}.{weight, bias}`` (3h → … → h),
        ``first_block.*`` and ``rest_block.{k}.*`` (:func:`perceiver_block_spec` with D = Dkv = h);
        depth = 1 + number of ``rest_block`` entries. Weights ``(in, out)``.
    input_pos : array (N, d)
        Mesh coordinates (shared by the batch). Not differentiated.
    query_pos : array (M, d)
        Latent (supernode) coordinates.
    radius : float
        GNO radius (inclusive).
    num_heads : int

    Returns
    -------
    out, cache
        ``out (B, M, h)``; ``cache["graph"]`` holds the (latent, mesh) edge list.
    """
    f, ypos, xpos, p, radius, heads, h, n_k, blocks = _validate(f, params, input_pos, query_pos, radius, num_heads)
    b, m = f.shape[0], xpos.shape[0]
    idx, splits = radius_neighbors(ypos, xpos, radius)
    counts = np.diff(splits)
    ei = np.repeat(np.arange(m), counts)
    lift = linear_prefixed(p, f"{_G}.lift_ffn", f)
    ey, ex = mino_sincos_embedding(ypos, h), mino_sincos_embedding(xpos, h)
    e = len(idx)
    geo = np.concatenate([ey[idx], ex[ei]], axis=-1)
    hs = [np.concatenate([np.broadcast_to(geo, (b, e, 2 * h)), lift[:, idx]], axis=-1)]
    pre = []
    for i in range(n_k):
        pre.append(linear_prefixed(p, f"{_G}.channel_mlp.fcs.{i}", hs[-1]))
        hs.append(gelu(pre[-1]) if i < n_k - 1 else pre[-1])
    inv = (1.0 / np.maximum(counts, 1)).astype(f.dtype)
    tok = np.zeros((b, m, h), dtype=f.dtype)
    np.add.at(tok, (slice(None), ei), hs[-1] * inv[ei][:, None])
    state, bcaches = tok, []
    for blk in blocks:
        state, bc = mino_perceiver_block_forward(state, tok, p, blk, heads)
        bcaches.append(bc)
    cache = dict(p=p, f=f, idx=idx, ei=ei, inv=inv, hs=hs, pre=pre, n_k=n_k, h=h, bcaches=bcaches,
                 out_shape=state.shape, graph=(ei, idx))
    return state, cache


def mino_encoder_backward(dout, cache):
    """Gradients of :func:`mino_encoder_forward` with the radius graph held fixed: ``f`` and every params key."""
    p, f, h = cache["p"], cache["f"], cache["h"]
    g = as_dout(dout, cache["out_shape"], f.dtype)
    grads = {}
    dtok = np.zeros_like(g)
    for k in reversed(range(len(cache["bcaches"]))):
        dq, dkv = mino_perceiver_block_backward(g, cache["bcaches"][k], p, grads)
        dtok = dtok + dkv
        g = dq
    dtok = dtok + g                                   # the first block's query is the GNO output
    idx, ei, hs, pre = cache["idx"], cache["ei"], cache["hs"], cache["pre"]
    dk = dtok[:, ei] * cache["inv"][ei][:, None]
    for i in reversed(range(cache["n_k"])):
        if i < cache["n_k"] - 1:
            dk = dk * gelu_grad(pre[i])
        dk = linear_prefixed_vjp(grads, p, f"{_G}.channel_mlp.fcs.{i}", dk, hs[i])
    dlift = np.zeros(f.shape[:2] + (h,), dtype=f.dtype)
    np.add.at(dlift, (slice(None), idx), dk[..., 2 * h:])
    grads["f"] = linear_prefixed_vjp(grads, p, f"{_G}.lift_ffn", dlift, f)
    return grads


def mino_encoder(f, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`mino_encoder_forward`."""
    return mino_encoder_forward(f, params, **config)[0]


def init_perceiver_block_params(rng, prefix: str, dim: int, kv_dim=None, mlp_hidden=None) -> dict:
    """A ``PerceiverBlock`` as kappamodules initialises it (``init_weights="truncnormal"`` as MINO
    passes: weights N(0, 0.02) truncated at ±2, zero biases; norms weight 1, bias 0)."""
    kv_dim = dim if kv_dim is None else kv_dim
    mlp_hidden = 4 * dim if mlp_hidden is None else mlp_hidden
    p = {}
    for key, shape in perceiver_block_spec(prefix, dim, kv_dim, mlp_hidden).items():
        if ".norm" in key:
            p[key] = np.ones(shape) if key.endswith("weight") else np.zeros(shape)
        elif key.endswith("weight"):
            p[key] = np.clip(0.02 * rng.standard_normal(shape), -2.0, 2.0)
        else:
            p[key] = np.zeros(shape)
    return p


def init_mino_encoder_params(rng, in_channels: int, hidden: int, *, depth: int = 2, mlp_hidden=None,
                             dtype=np.float64) -> dict:
    """MINO encoder parameters: lift and kernel MLP ``[3h, 2h, h]`` with PyTorch default linears,
    ``depth`` Perceiver blocks (``first_block``, ``rest_block.{k}``)."""
    p = init_linear_prefixed(rng, in_channels, hidden, f"{_G}.lift_ffn")
    for i, (a, c) in enumerate([(3 * hidden, 2 * hidden), (2 * hidden, hidden)]):
        p.update(init_linear_prefixed(rng, a, c, f"{_G}.channel_mlp.fcs.{i}"))
    p.update(init_perceiver_block_params(rng, "first_block", hidden, mlp_hidden=mlp_hidden))
    for k in range(check_int(depth, "depth", minimum=1) - 1):
        p.update(init_perceiver_block_params(rng, f"rest_block.{k}", hidden, mlp_hidden=mlp_hidden))
    return {k: np.asarray(v, dtype=dtype) for k, v in p.items()}


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size):
    if size == "tiny":   # 1-D coordinates keep the width (and the FD Jacobian) small
        n, m, c_in, h, heads, hid, d = 5, 3, 2, 3, 1, 2, 1   # h = 3: LayerNorm over 2 is ill-conditioned
    else:
        n, m, c_in, h, heads, hid, d = int(rng.integers(12, 20)), int(rng.integers(4, 7)), 3, 8, 2, 6, 2
    p = init_mino_encoder_params(rng, c_in, h, depth=2, mlp_hidden=hid)
    for k in p:                                       # away from the init's zeros and unit norms
        p[k] = p[k] + (0.3 if k.endswith("bias") or ".norm" in k else 0.2) * rng.standard_normal(p[k].shape)
    ypos = rng.uniform(0.0, 1.0, (n, d))
    xpos = rng.uniform(0.1, 0.9, (m, d))
    return Sample(inputs={"f": rng.standard_normal((2, n, c_in))}, params=p,
                  config={"input_pos": ypos, "query_pos": xpos, "radius": 0.45, "num_heads": heads})


def _reference(f, params, *, input_pos, query_pos, radius, num_heads):
    # Dense form: the (M, N) neighbourhood mask, the kernel on every pair, a masked mean; the
    # Perceiver blocks with explicit per-head softmax attention and two-pass LayerNorm.
    def lin(prefix, x):
        return x @ params[f"{prefix}.weight"] + params[f"{prefix}.bias"]

    def ln(prefix, x):
        mu = x.mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + _LN_EPS) * params[f"{prefix}.weight"] \
            + params[f"{prefix}.bias"]

    def block(pre, q, kv):
        qq, kk = lin(f"{pre}.attn.q", ln(f"{pre}.norm1q", q)), lin(f"{pre}.attn.kv", ln(f"{pre}.norm1kv", kv))
        dim = q.shape[-1]
        dh = dim // num_heads
        heads = []
        for j in range(num_heads):
            s = slice(j * dh, (j + 1) * dh)
            a = qq[:, s] @ kk[:, :dim][:, s].T / np.sqrt(dh)
            a = np.exp(a - a.max(-1, keepdims=True))
            heads.append(a / a.sum(-1, keepdims=True) @ kk[:, dim:][:, s])
        q1 = q + lin(f"{pre}.attn.proj", np.concatenate(heads, axis=1))
        return q1 + lin(f"{pre}.mlp.fc2", gelu(lin(f"{pre}.mlp.fc1", ln(f"{pre}.norm2", q1))))

    h = params[f"{_G}.lift_ffn.weight"].shape[1]
    mask = np.linalg.norm(query_pos[:, None] - input_pos[None], axis=-1) <= radius
    m, n = mask.shape
    ey, ex = mino_sincos_embedding(input_pos, h), mino_sincos_embedding(query_pos, h)
    outs = []
    for bb in range(f.shape[0]):
        lift = lin(f"{_G}.lift_ffn", f[bb])
        k = np.concatenate([np.broadcast_to(ey[None], (m, n, h)), np.broadcast_to(ex[:, None], (m, n, h)),
                            np.broadcast_to(lift[None], (m, n, h))], axis=-1)
        i = 0
        while f"{_G}.channel_mlp.fcs.{i}.weight" in params:
            k = lin(f"{_G}.channel_mlp.fcs.{i}", k)
            i += 1
            if f"{_G}.channel_mlp.fcs.{i}.weight" in params:
                k = gelu(k)
        tok = np.einsum("mn,mnc->mc", mask / np.maximum(mask.sum(1, keepdims=True), 1), k)
        state = tok
        for blk in _blocks(params):
            state = block(blk, state, tok)
        outs.append(state)
    return np.stack(outs)


def _check_graph_matches_brute_force(rng):
    s = _sample(rng, "small")
    _, cache = mino_encoder_forward(**s.inputs, params=s.params, **s.config)
    ei, ej = cache["graph"]
    brute = np.argwhere(np.linalg.norm(s.config["query_pos"][:, None] - s.config["input_pos"][None], axis=-1)
                        <= s.config["radius"])
    assert np.array_equal(np.stack([ei, ej], 1), brute), "radius graph differs from the brute-force distance matrix"
    return 0.0


def _check_duplication_invariance(rng):
    # Every mesh point duplicated: the GNO mean is unchanged, hence the whole encoder.
    s = _sample(rng, "small")
    cfg = dict(s.config, input_pos=np.repeat(s.config["input_pos"], 2, axis=0))
    out2 = mino_encoder(np.repeat(s.inputs["f"], 2, axis=1), s.params, **cfg)
    err = float(np.abs(out2 - mino_encoder(**s.inputs, params=s.params, **s.config)).max())
    assert err < 1e-12, f"MINO encoder changes when every mesh point is duplicated: {err:.2e}"
    return err


register(
    Mechanism(
        slug="mino_gno_cross_attention", family="3-operator", tier="T3",
        official_code="yzshi5/MINO models/mino_modules/@143e4b4 (blocks from BenediktAlkin/KappaModules)",
        title="MINO: mesh-informed neural operator encoder (GNO kernel integral + Perceiver cross-attention)",
        paper="Shi, Ross, Asimaki, Azizzadenesheli, Mesh-Informed Neural Operator: A Transformer Generative "
              "Approach, arXiv 2506.16656",
        forward=mino_encoder_forward, backward=mino_encoder_backward, sample=_sample, reference=_reference,
        docs="operators/operator-attention-t3.md#mino-encoder",
        checks={"graph_matches_brute_force": _check_graph_matches_brute_force,
                "point_duplication_invariance": _check_duplication_invariance},
    ),
)
