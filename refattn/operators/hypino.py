r"""HyPINO: the hypernetwork decoder that turns PDE feature maps into PINN weights, and the generated PINN.

Paper: Bischof, Piovarči, Kraus, Mishra, Bickel, "HyPINO: Multi-Physics Neural Operators via
HyperPINNs and the Method of Manufactured Solutions", arXiv 2509.05117 (2025). Upstream:
rbischof/hypino ``src/models/hypino.py`` (``HyperNetDecoder``, ``ModulationMFNN``) and
``src/models/utils.py`` (``AttentionPooling``, ``FourierMapping``) @
28d73081ee1498ec4c3353305d3acbe1c1466d75.

Which part of the model
-----------------------
HyPINO = ``HyperNetEncoder`` (convolutional embeddings of the PDE's grids: domain/boundary masks,
boundary values, source; a timm Swin Transformer whose four stages are FiLM-conditioned on the PDE
coefficients) + ``HyperNetDecoder`` (this module) + the MMS / physics-informed training and the
iterative "delta-PINN" ensemble refinement (inference recipes). The decoder is the hypernetwork's
mechanism: per Swin stage $s$, learned queries cross-attend the stage's tokens (``AttentionPooling``,
an ``nn.MultiheadAttention``), the $Q = 2(n_L + 4)$ pooled vectors (concatenated over stages) are
mapped one by one to every weight matrix and bias vector of a target PINN, and the PINN — a
Fourier-featured modified MLP (``ModulationMFNN``) — is evaluated at the query coordinates. The
Swin encoder and its FiLM conditioning are left to the docs (timm is not installed here).

Forward
-------
Pooling, per stage $s$ with tokens $X_s\in\mathbb R^{N_s\times C_s}$ and queries $Q_s\in\mathbb R^{Q\times C_s}$:
$P_s = \mathrm{MHA}_s(Q_s, X_s, X_s)$; $c = [P_1\,\|\dots\|\,P_S]\in\mathbb R^{Q\times C}$, $C = \sum_s C_s$.
Heads (``_create_ffn``): $h(z) = W_2\,\mathrm{GN}_G(\mathrm{GELU}(W_1z + b_1)) + b_2$. With
$F = d(2n_f + 1)$ Fourier features of the $d$-dimensional coordinates and PINN width $L$:

$$W_k = h^{w}_k(c_k)\ (F\times L,\ k = 0,1,2),\quad W_k = h^{w}_k(c_k)\ (L\times L,\ 3\le k < n_L + 3),\quad
W_{-1} = h^{w}_{-1}(c_{n_L+3})\ (L\times d_o),$$

$$b_k = h^{b}_k(c_{n_L+4+k})\ (k < n_L + 3),\qquad b_{-1} = h^{b}_{-1}(c_{Q-1}).$$

PINN (``ModulationMFNN``) at points $y\in\mathbb R^{M\times d}$: $\phi(y) = [\sin(2\pi y\otimes\omega),
\cos(2\pi y\otimes\omega), y]$, $\omega_j = 0.1\cdot2^j$ ($j < n_f$), then
$U = \tanh(\phi W_0 + b_0)$, $V = \tanh(\phi W_1 + b_1)$, $x = \sigma(\phi W_2 + b_2)$ and for each latent
layer $x \leftarrow \sigma\big((U\odot x + V\odot(1 - x))W_k + b_k\big)$; output $xW_{-1} + b_{-1}$.

Backward
--------
PINN: the output layer's $dW_{-1} = x^\top g$, $db_{-1} = \sum g$ (per sample); each latent layer
$da = g\odot\sigma'(a)$, $dW_k = m^\top da$, $dm = da\,W_k^\top$ with $m = U\odot x + V\odot(1-x)$:
$dx = dm\odot(U - V)$, $dU \mathrel{+}= dm\odot x$, $dV \mathrel{+}= dm\odot(1 - x)$; then
$da_U = dU(1 - U^2)$, $da_V = dV(1-V^2)$ and the first layer, summing into $d\phi$;
$dy = 2\pi\omega\,(\cos\cdot\,d\phi_{\sin} - \sin\cdot\,d\phi_{\cos}) + d\phi_y$. Heads: linear,
GroupNorm (``group_norm_backward``) and GELU VJPs give $dc_k$. Pooling: ``mha_backward`` gives
$dX_s$ and $dQ_s = \sum_b dQ_{s,b}$ (the queries are shared by the batch).

Conventions
-----------
* Params are ``HyperNetDecoder``'s ``state_dict`` keys: ``attention_pooling.{s}.queries (Q, C_s)``,
  ``attention_pooling.{s}.attention.in_proj_weight (C_s, 3C_s)`` (torch's transposed),
  ``in_proj_bias``, ``out_proj.{weight,bias}``; ``weight_maps.{k}.{0,2,3}.*`` and
  ``bias_maps.{k}.{0,2,3}.*`` (Linear, GroupNorm, Linear). The target net's ``in_map``/``out_map``
  layers exist upstream but are never used in its forward; its ``frequencies`` are fixed.
* ``num_heads`` per stage (upstream ``(4, 8, 8, 16)``, one per given stage); ``norm_groups``
  ``(4, 16, 1, 4, 1)``: GroupNorm groups of the first three weight heads, the latent weight heads,
  the output weight head, the hidden bias heads and the output bias head, as upstream.
* ``num_fourier_features`` 5 and ``fourier_scale`` 0.1 (upstream ``FourierMapping(num_features=5,
  scale=0.1)``); ``activation`` ``"tanh"`` (upstream default), ``"gelu"`` or ``"silu"``.
* 1 to 4 stages (``skip_0`` ... ``skip_3``; upstream uses four Swin stages).

Agreement with upstream
-----------------------
``hypino.py`` imports pytorch_lightning and timm (not installed), so a scratch script
(``/tmp/scratch-o5b``, not committed) transcribes ``HyperNetDecoder.forward`` (with ``xy``),
``ModulationMFNN``, ``AttentionPooling`` and ``FourierMapping`` into torch with
``nn.MultiheadAttention``/``nn.GroupNorm``; float64, CPU, torch 2.13, four stages of widths
(16, 32, 32, 64), heads (4, 8, 8, 16), token counts (12, 6, 4, 2), PINN width 8 with 2 latent
layers, 2-D coordinates (upstream sizes otherwise: 5 Fourier features, GroupNorm groups
(4, 16, 1, 4, 1), output-bias hidden 32), stage grids (3x4, 2x3, 2x2, 1x2), 20 points, batch 2,
parameters perturbed by $0.3\,N(0,1)$, three seeds: output max abs error 3.9e-13 (4.6e-14
relative to the largest entry); worst gradient over the coordinates, stage tokens and every
parameter 7.8e-10 abs, 6.4e-13 relative to its array's largest entry. The errors are larger than
a single layer's because the generated weights multiply one another in the PINN, which amplifies
the heads' round-off: on the same inputs refattn's own forward and its explicit-loop reference
differ by 2.4e-13 (outputs up to 13.6), so this is the map's conditioning, not a difference in
the math.
"""

from __future__ import annotations

import numpy as np

from .._checks import (
    as_dout,
    as_float,
    cast_all,
    check_choice,
    check_int,
    check_params,
    check_positive,
    check_weight_in,
    compute_dtype,
)
from ..attention.softmax.mha import mha_backward, mha_forward
from ..nn.activations import gelu, gelu_grad, silu, silu_grad
from ..nn.linear import init_torch_default, linear_prefixed, linear_prefixed_spec, linear_prefixed_vjp
from ..nn.norms import group_norm_backward, group_norm_forward
from ..registry import Mechanism, Sample, register

__all__ = ["hypino_decoder_param_shapes", "fourier_features", "hypino_decoder_forward", "hypino_decoder_backward",
           "hypino_decoder", "init_hypino_decoder_params"]

ACTIVATIONS = ("tanh", "gelu", "silu")
_STAGES = ("skip_0", "skip_1", "skip_2", "skip_3")


def _act(name):
    if name == "tanh":
        return np.tanh, (lambda a: 1.0 - np.tanh(a) ** 2)
    if name == "gelu":
        return gelu, gelu_grad
    return silu, silu_grad


def fourier_features(y, num_features: int = 5, scale: float = 0.1):
    r"""``FourierMapping``: $[\sin(2\pi y_i\omega_j)]_{i,j}, [\cos(2\pi y_i\omega_j)]_{i,j}, y$ with
    $\omega_j = \text{scale}\cdot 2^j$ (feature index $i n_f + j$, input-major), ``(..., d(2n_f+1))``."""
    w = scale * 2.0 ** np.arange(num_features, dtype=y.dtype)
    t = 2 * np.pi * y[..., :, None] * w
    lead = y.shape[:-1]
    return np.concatenate([np.sin(t).reshape(lead + (-1,)), np.cos(t).reshape(lead + (-1,)), y], axis=-1)


def _head_spec(prefix, c, hid, out):
    s = dict(linear_prefixed_spec(f"{prefix}.0", c, hid))
    s.update({f"{prefix}.2.weight": (hid,), f"{prefix}.2.bias": (hid,)})
    s.update(linear_prefixed_spec(f"{prefix}.3", hid, out))
    return s


def hypino_decoder_param_shapes(stage_dims, *, in_dim: int = 2, out_dim: int = 1, lat_dim: int = 32,
                                n_layers: int = 3, num_fourier_features: int = 5, bias_hidden: int = 32) -> dict:
    """``{key: shape}`` of ``HyperNetDecoder`` for Swin stage widths ``stage_dims`` (Linear ``(in, out)``;
    ``bias_hidden``: the hidden width of the output-bias head, 32 upstream)."""
    q = 2 * (n_layers + 4)
    c = int(sum(stage_dims))
    f = in_dim * (2 * num_fourier_features + 1)
    s = {}
    for i, cs in enumerate(stage_dims):
        pre = f"attention_pooling.{i}"
        s.update({f"{pre}.queries": (q, cs), f"{pre}.attention.in_proj_weight": (cs, 3 * cs),
                  f"{pre}.attention.in_proj_bias": (3 * cs,), f"{pre}.attention.out_proj.weight": (cs, cs),
                  f"{pre}.attention.out_proj.bias": (cs,)})
    for k in range(3):
        s.update(_head_spec(f"weight_maps.{k}", c, 2 * f * lat_dim, f * lat_dim))
    for k in range(3, 3 + n_layers):
        s.update(_head_spec(f"weight_maps.{k}", c, c, lat_dim * lat_dim))
    s.update(_head_spec(f"weight_maps.{3 + n_layers}", c, 2 * lat_dim * out_dim, lat_dim * out_dim))
    for k in range(n_layers + 3):
        s.update(_head_spec(f"bias_maps.{k}", c, 2 * lat_dim, lat_dim))
    s.update(_head_spec(f"bias_maps.{n_layers + 3}", c, bias_hidden, out_dim))
    return s


def _validate(xy, skips, params, num_heads, norm_groups, nf, scale, activation):
    xy = as_float(xy, "xy", ndim=3)
    stages = []
    for name, t in zip(_STAGES, skips):
        if t is None:
            break
        stages.append(as_float(t, name, ndim=3))
    if not stages or any(t is not None for t in skips[len(stages):]):
        raise ValueError("give the stage tokens in order: skip_0 (required), then skip_1, skip_2, skip_3 (optional)")
    b = xy.shape[0]
    for i, t in enumerate(stages):
        if t.shape[0] != b:
            raise ValueError(f"skip_{i} must have xy's batch size {b} on axis 0 ((B, N_s, C_s)); got {t.shape}")
    heads = tuple(num_heads)[:len(stages)]
    if len(heads) != len(stages):
        raise ValueError(f"num_heads needs one entry per stage ({len(stages)}); got {num_heads!r}")
    heads = tuple(check_int(h, "num_heads", minimum=1) for h in heads)
    groups = tuple(check_int(g, "norm_groups", minimum=1) for g in norm_groups)
    if len(groups) != 5:
        raise ValueError(f"norm_groups must have 5 entries (first weight heads, latent weight heads, output weight "
                         f"head, bias heads, output bias head); got {norm_groups!r}")
    nf = check_int(nf, "num_fourier_features", minimum=1)
    check_positive(scale, "fourier_scale")
    check_choice(activation, "activation", ACTIVATIONS)
    if not isinstance(params, dict) or params.get("attention_pooling.0.queries") is None:
        raise ValueError("params must be a dict with HyperNetDecoder's weights (attention_pooling.0.queries (Q, C_0), ...)")
    q = as_float(params["attention_pooling.0.queries"], "attention_pooling.0.queries", ndim=2).shape[0]
    if q % 2 or q < 8:
        raise ValueError(f"attention_pooling.0.queries must have Q = 2 (n_layers + 4) >= 8 rows; got {q}")
    n_layers = q // 2 - 4
    # widths are read off output axes below: check the heads' input axes first (Linear, GroupNorm, Linear)
    c = sum(t.shape[2] for t in stages)
    for k0, k3 in (("weight_maps.0.0.weight", "weight_maps.0.3.weight"),
                   (f"bias_maps.{n_layers + 3}.0.weight", f"bias_maps.{n_layers + 3}.3.weight")):
        hid = check_weight_in(params, k0, c, input_name=f"a pooled token (C = {c})")
        if hid and np.ndim(params.get(k3)) == 2:
            check_weight_in(params, k3, hid[1], input_name=f"{k0[:-7]}'s output")
    key = "weight_maps.0.3.weight"
    f_lat = as_float(params.get(key, np.zeros((1, 1))), key, ndim=2).shape[1]
    f = xy.shape[2] * (2 * nf + 1)
    if f_lat % f:
        raise ValueError(f"{key} must output F * L values with F = d (2 n_f + 1) = {f} Fourier features of the "
                         f"{xy.shape[2]}-D coordinates; got {f_lat}")
    lat = f_lat // f
    ko = f"bias_maps.{n_layers + 3}.3.weight"
    out_dim = as_float(params.get(ko, np.zeros((1, 1))), ko, ndim=2).shape[1]
    kh = f"bias_maps.{n_layers + 3}.0.weight"
    bias_hidden = as_float(params.get(kh, np.zeros((1, 32))), kh, ndim=2).shape[1]
    spec = hypino_decoder_param_shapes([t.shape[2] for t in stages], in_dim=xy.shape[2], out_dim=out_dim, lat_dim=lat,
                                       n_layers=n_layers, num_fourier_features=nf, bias_hidden=bias_hidden)
    p = check_params(params, spec, where="hypino_decoder")
    for i, (t, h) in enumerate(zip(stages, heads)):
        if t.shape[2] % h:
            raise ValueError(f"num_heads[{i}] = {h} must divide the width {t.shape[2]} of skip_{i}")
    dt = compute_dtype(xy, *stages, *p.values())
    return (xy.astype(dt, copy=False), [t.astype(dt, copy=False) for t in stages], cast_all(dt, p), heads, groups,
            n_layers, lat, out_dim, dt)


def _mha_params(p, pre, c):
    w, b = p[f"{pre}.attention.in_proj_weight"], p[f"{pre}.attention.in_proj_bias"]
    return {"q_proj": w[:, :c], "k_proj": w[:, c:2 * c], "v_proj": w[:, 2 * c:], "out_proj": p[f"{pre}.attention.out_proj.weight"],
            "q_proj_bias": b[:c], "k_proj_bias": b[c:2 * c], "v_proj_bias": b[2 * c:],
            "out_proj_bias": p[f"{pre}.attention.out_proj.bias"]}


def _head(p, prefix, z, groups):
    a = linear_prefixed(p, f"{prefix}.0", z)
    n, cn = group_norm_forward(gelu(a), {"weight": p[f"{prefix}.2.weight"], "bias": p[f"{prefix}.2.bias"]},
                               num_groups=groups)
    return linear_prefixed(p, f"{prefix}.3", n), (prefix, z, a, n, cn)


def _head_vjp(grads, p, g, cache):
    prefix, z, a, n, cn = cache
    gn = group_norm_backward(linear_prefixed_vjp(grads, p, f"{prefix}.3", g, n), cn)
    grads[f"{prefix}.2.weight"], grads[f"{prefix}.2.bias"] = gn["weight"], gn["bias"]
    return linear_prefixed_vjp(grads, p, f"{prefix}.0", gn["x"] * gelu_grad(a), z)


def hypino_decoder_forward(xy, skip_0, params, skip_1=None, skip_2=None, skip_3=None, *, num_heads=(4, 8, 8, 16),
                           norm_groups=(4, 16, 1, 4, 1), num_fourier_features: int = 5, fourier_scale: float = 0.1,
                           activation: str = "tanh"):
    r"""``HyperNetDecoder.forward(skip_connections, xy)`` (module docstring): pool the stages, generate
    the PINN's weights and biases, evaluate the PINN at ``xy``.

    Parameters
    ----------
    xy : array (B, M, d)
        Query coordinates of each sample's PINN.
    skip_0, skip_1, skip_2, skip_3 : arrays (B, N_s, C_s)
        Tokens of the encoder stages (upstream: the Swin stage outputs ``(B, H, W, C)`` flattened);
        ``skip_1`` ... optional, in order.
    params : dict
        :func:`hypino_decoder_param_shapes` keys.
    num_heads, norm_groups, num_fourier_features, fourier_scale, activation
        See the module docstring (upstream defaults).

    Returns
    -------
    out, cache
        ``out (B, M, d_o)``: the generated PINN's values.
    """
    xy, stages, p, heads, groups, nl, lat, d_o, dt = _validate(xy, (skip_0, skip_1, skip_2, skip_3), params, num_heads,
                                                               norm_groups, num_fourier_features, fourier_scale,
                                                               activation)
    b = xy.shape[0]
    pooled, pool_caches = [], []
    for i, (t, h) in enumerate(zip(stages, heads)):
        pre = f"attention_pooling.{i}"
        qry = np.broadcast_to(p[f"{pre}.queries"], (b,) + p[f"{pre}.queries"].shape)
        o, c = mha_forward(qry, t, _mha_params(p, pre, t.shape[2]), num_heads=h)
        pooled.append(o)
        pool_caches.append(c)
    comp = np.concatenate(pooled, axis=-1)                                  # (B, Q, C)
    f = xy.shape[2] * (2 * num_fourier_features + 1)
    g_first, g_lat, g_wout, g_bias, g_bout = groups
    heads_c, ws, bs = [], [], []
    for k in range(nl + 4):
        grp = g_first if k < 3 else (g_lat if k < nl + 3 else g_wout)
        shape = (f, lat) if k < 3 else ((lat, lat) if k < nl + 3 else (lat, d_o))
        y, c = _head(p, f"weight_maps.{k}", comp[:, k], grp)
        ws.append(y.reshape((b,) + shape))
        heads_c.append(c)
    for k in range(nl + 4):
        y, c = _head(p, f"bias_maps.{k}", comp[:, nl + 4 + k], g_bias if k < nl + 3 else g_bout)
        bs.append(y)
        heads_c.append(c)
    act, _ = _act(activation)
    phi = fourier_features(xy, num_features=num_fourier_features, scale=fourier_scale)
    au = phi @ ws[0] + bs[0][:, None]
    av = phi @ ws[1] + bs[1][:, None]
    u, v = np.tanh(au), np.tanh(av)
    a = phi @ ws[2] + bs[2][:, None]
    x = act(a)
    tape = [(None, a)]
    for k in range(3, 3 + nl):
        m = u * x + v * (1.0 - x)
        a = m @ ws[k] + bs[k][:, None]
        tape.append((x, m, a))
        x = act(a)
    out = x @ ws[-1] + bs[-1][:, None]
    cache = {"p": p, "xy": xy, "stages": stages, "pool": pool_caches, "heads": heads_c, "ws": ws, "phi": phi, "u": u,
             "v": v, "tape": tape, "x": x, "nl": nl, "act": activation, "nf": num_fourier_features,
             "scale": fourier_scale, "widths": [t.shape[2] for t in stages], "shape": out.shape, "dt": dt}
    return out, cache


def hypino_decoder_backward(dout, cache):
    """Gradients of :func:`hypino_decoder_forward`: ``xy``, the given ``skip_*`` and every params key."""
    p, nl, ws = cache["p"], cache["nl"], cache["ws"]
    g = as_dout(dout, cache["shape"], cache["dt"])
    _, act_grad = _act(cache["act"])
    u, v, x = cache["u"], cache["v"], cache["x"]
    dws = [None] * len(ws)
    dbs = [None] * len(ws)
    dws[-1] = np.swapaxes(x, 1, 2) @ g
    dbs[-1] = g.sum(axis=1)
    gx = g @ np.swapaxes(ws[-1], 1, 2)
    du = np.zeros_like(u)
    dv = np.zeros_like(v)
    for k in range(3 + nl - 1, 2, -1):
        xin, m, a = cache["tape"][k - 2]
        da = gx * act_grad(a)
        dws[k] = np.swapaxes(m, 1, 2) @ da
        dbs[k] = da.sum(axis=1)
        dm = da @ np.swapaxes(ws[k], 1, 2)
        du += dm * xin
        dv += dm * (1.0 - xin)
        gx = dm * (u - v)
    a2 = cache["tape"][0][1]
    phi = cache["phi"]
    dphi = 0.0
    for k, da in ((2, gx * act_grad(a2)), (0, du * (1.0 - u ** 2)), (1, dv * (1.0 - v ** 2))):
        dws[k] = np.swapaxes(phi, 1, 2) @ da
        dbs[k] = da.sum(axis=1)
        dphi = dphi + da @ np.swapaxes(ws[k], 1, 2)
    xy = cache["xy"]
    d, nf = xy.shape[2], cache["nf"]
    w = cache["scale"] * 2.0 ** np.arange(nf, dtype=xy.dtype)
    t = 2 * np.pi * xy[..., :, None] * w
    lead = xy.shape[:-1]
    ds, dc = dphi[..., :d * nf].reshape(lead + (d, nf)), dphi[..., d * nf:2 * d * nf].reshape(lead + (d, nf))
    gxy = (2 * np.pi * w * (np.cos(t) * ds - np.sin(t) * dc)).sum(axis=-1) + dphi[..., 2 * d * nf:]
    grads = {"xy": gxy}
    b = xy.shape[0]
    comp_grad = np.zeros((b, 2 * (nl + 4), sum(cache["widths"])), dtype=g.dtype)
    for k in range(nl + 4):
        comp_grad[:, k] = _head_vjp(grads, p, dws[k].reshape(b, -1), cache["heads"][k])
        comp_grad[:, nl + 4 + k] = _head_vjp(grads, p, dbs[k], cache["heads"][nl + 4 + k])
    off = 0
    for i, (cw, c) in enumerate(zip(cache["widths"], cache["pool"])):
        pre = f"attention_pooling.{i}"
        r = mha_backward(comp_grad[..., off:off + cw], c)
        off += cw
        grads[f"{pre}.queries"] = r["x"].sum(axis=0)
        grads[f"{pre}.attention.in_proj_weight"] = np.concatenate([r["q_proj"], r["k_proj"], r["v_proj"]], axis=1)
        grads[f"{pre}.attention.in_proj_bias"] = np.concatenate([r["q_proj_bias"], r["k_proj_bias"], r["v_proj_bias"]])
        grads[f"{pre}.attention.out_proj.weight"] = r["out_proj"]
        grads[f"{pre}.attention.out_proj.bias"] = r["out_proj_bias"]
        grads[_STAGES[i]] = r["context"]
    return grads


def hypino_decoder(xy, skip_0, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`hypino_decoder_forward`."""
    return hypino_decoder_forward(xy, skip_0, params, **config)[0]


def init_hypino_decoder_params(rng, stage_dims, *, in_dim: int = 2, out_dim: int = 1, lat_dim: int = 32,
                               n_layers: int = 3, num_fourier_features: int = 5, bias_hidden: int = 32,
                               dtype=np.float64) -> dict:
    """PyTorch-default initialisation: queries $N(0, 1)$, ``in_proj_weight`` xavier-uniform with zero
    in/out biases, Linear $U(\\pm1/\\sqrt{\\text{in}})$, GroupNorm 1/0."""
    shapes = hypino_decoder_param_shapes(stage_dims, in_dim=in_dim, out_dim=out_dim, lat_dim=lat_dim,
                                         n_layers=n_layers, num_fourier_features=num_fourier_features,
                                         bias_hidden=bias_hidden)
    p = init_torch_default(rng, shapes, normal=("queries",), norm=(".2.",))
    return {k: np.asarray(v, dtype=dtype) for k, v in p.items()}


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size, activation="tanh"):
    if size == "tiny":
        dims, heads, toks, nl, lat, d, nf, bh, m = (2,), (1,), (3,), 0, 1, 1, 1, 2, 3
    else:
        dims, heads, toks, nl, lat, d, nf, bh, m = (4, 2), (2, 1), (5, 3), 1, 2, 2, 1, 4, 6
    p = init_hypino_decoder_params(rng, dims, in_dim=d, out_dim=1, lat_dim=lat, n_layers=nl, num_fourier_features=nf,
                                   bias_hidden=bh)
    p = {k: v + 0.3 * rng.standard_normal(v.shape) for k, v in p.items()}
    inputs = {"xy": rng.uniform(-1, 1, (2, m, d))}
    for i, (c, n) in enumerate(zip(dims, toks)):
        inputs[f"skip_{i}"] = rng.standard_normal((2, n, c))
    return Sample(inputs=inputs, params=p, config={"num_heads": heads, "norm_groups": (1, 1, 1, 1, 1),
                                                   "num_fourier_features": nf, "activation": activation})


def _reference(xy, skip_0, params, skip_1=None, skip_2=None, skip_3=None, *, num_heads=(4, 8, 8, 16),
               norm_groups=(4, 16, 1, 4, 1), num_fourier_features=5, fourier_scale=0.1, activation="tanh"):
    # Explicit per-sample, per-head loops; GroupNorm from its definition; the PINN layer by layer.
    p = params
    stages = [t for t in (skip_0, skip_1, skip_2, skip_3) if t is not None]
    act = _act(activation)[0]
    q = p["attention_pooling.0.queries"].shape[0]
    nl = q // 2 - 4
    b = xy.shape[0]
    out = []
    for bi in range(b):
        pooled = []
        for i, t in enumerate(stages):
            pre = f"attention_pooling.{i}"
            c = t.shape[2]
            w, bb = p[f"{pre}.attention.in_proj_weight"], p[f"{pre}.attention.in_proj_bias"]
            qq = p[f"{pre}.queries"] @ w[:, :c] + bb[:c]
            kk = t[bi] @ w[:, c:2 * c] + bb[c:2 * c]
            vv = t[bi] @ w[:, 2 * c:] + bb[2 * c:]
            dh = c // num_heads[i]
            heads = []
            for h in range(num_heads[i]):
                sl = slice(h * dh, (h + 1) * dh)
                sc = qq[:, sl] @ kk[:, sl].T / np.sqrt(dh)
                e = np.exp(sc - sc.max(1, keepdims=True))
                heads.append(e / e.sum(1, keepdims=True) @ vv[:, sl])
            pooled.append(np.concatenate(heads, 1) @ p[f"{pre}.attention.out_proj.weight"]
                          + p[f"{pre}.attention.out_proj.bias"])
        comp = np.concatenate(pooled, 1)

        def head(prefix, z, grp):
            a = gelu(z @ p[f"{prefix}.0.weight"] + p[f"{prefix}.0.bias"])
            gsz = a.shape[0] // grp
            n = np.concatenate([(a[j * gsz:(j + 1) * gsz] - a[j * gsz:(j + 1) * gsz].mean())
                                / np.sqrt(a[j * gsz:(j + 1) * gsz].var() + 1e-5) for j in range(grp)])
            return (n * p[f"{prefix}.2.weight"] + p[f"{prefix}.2.bias"]) @ p[f"{prefix}.3.weight"] + p[f"{prefix}.3.bias"]

        gf, gl, gw, gb, go = norm_groups
        ws = [head(f"weight_maps.{k}", comp[k], gf if k < 3 else (gl if k < nl + 3 else gw)) for k in range(nl + 4)]
        bs = [head(f"bias_maps.{k}", comp[nl + 4 + k], gb if k < nl + 3 else go) for k in range(nl + 4)]
        y = xy[bi]
        feats = [np.sin(2 * np.pi * y[:, i] * fourier_scale * 2.0 ** j) for i in range(y.shape[1])
                 for j in range(num_fourier_features)]
        feats += [np.cos(2 * np.pi * y[:, i] * fourier_scale * 2.0 ** j) for i in range(y.shape[1])
                  for j in range(num_fourier_features)]
        phi = np.stack(feats + [y[:, i] for i in range(y.shape[1])], 1)
        f = phi.shape[1]
        lat = ws[0].size // f
        u = np.tanh(phi @ ws[0].reshape(f, lat) + bs[0])
        v = np.tanh(phi @ ws[1].reshape(f, lat) + bs[1])
        x = act(phi @ ws[2].reshape(f, lat) + bs[2])
        for k in range(3, 3 + nl):
            x = act((u * x + v * (1 - x)) @ ws[k].reshape(lat, lat) + bs[k])
        out.append(x @ ws[-1].reshape(lat, -1) + bs[-1])
    return np.stack(out)


def _check_weights_are_generated_per_sample(rng):
    # The PINN of sample b depends on sample b's stage tokens only (the hypernetwork generates one
    # network per PDE), and the small (two-stage, one latent layer, GELU PINN) variant matches the
    # explicit formula.
    s = _sample(rng, "small")
    out = hypino_decoder(**s.inputs, params=s.params, **s.config)
    moved = dict(s.inputs, skip_1=s.inputs["skip_1"].copy())
    moved["skip_1"][1] += 1.0
    out2 = hypino_decoder(**moved, params=s.params, **s.config)
    err = float(np.abs(out2[0] - out[0]).max())
    assert err == 0.0, f"sample 0's PINN moved with sample 1's tokens: {err:.2e}"
    assert np.abs(out2[1] - out[1]).max() > 1e-8, "the PINN ignores the encoder stage"
    t = _sample(rng, "small", activation="gelu")
    e2 = float(np.abs(hypino_decoder(**t.inputs, params=t.params, **t.config)
                      - _reference(**t.inputs, params=t.params, **t.config)).max())
    assert e2 < 1e-12, f"GELU PINN differs from the explicit formula by {e2:.2e}"
    return e2


register(
    Mechanism(
        slug="hypino_hypernetwork_pinn", family="3-operator", tier="T3",
        official_code="rbischof/hypino src/models/hypino.py, src/models/utils.py@28d7308",
        title="HyPINO hypernetwork decoder: attention pooling of encoder stages into generated PINN weights",
        paper="Bischof, Piovarci, Kraus, Mishra, Bickel, HyPINO: Multi-Physics Neural Operators via HyperPINNs and the "
              "Method of Manufactured Solutions, arXiv 2509.05117 (2025)",
        forward=hypino_decoder_forward, backward=hypino_decoder_backward, sample=_sample, reference=_reference,
        docs="operators/o5b.md#hypino-hypernetwork-decoder-and-generated-pinn",
        checks={"weights_are_generated_per_sample": _check_weights_are_generated_per_sample},
    ),
)
