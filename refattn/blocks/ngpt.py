r"""nGPT block: a normalised Transformer whose hidden states move on the unit hypersphere.

Loshchilov, Hsieh, Sun, Ginsburg, "nGPT: Normalized Transformer with Representation Learning on
the Hypersphere", ICLR 2025, arXiv 2410.01131. Upstream: NVIDIA/ngpt ``model.py`` (``Block`` with
``use_nGPT = 1``; ``train.py`` sets ``base_scale = 1/sqrt(n_embd)``) @
ed19eb232380d41a9d71024b58d2403937d8f2c9.

Forward
-------
$N(v) = v/\|v\|$ over the last axis (upstream ``justnorm``, no epsilon). For a block input $h$
(``(..., N, C)``) and an attention sublayer $A$:

$$h_1 = N\big(N(h) + \lambda_A\odot(N(A(h)) - N(h))\big),\qquad \lambda_A = |\alpha_A|,$$
$$[u\,v] = (h_1W_{fc})\odot s_{uv},\qquad h_M = (u\odot\mathrm{SiLU}(v))\,W_{proj},\qquad
y = N\big(N(h_1) + \lambda_M\odot(N(h_M) - N(h_1))\big),\ \lambda_M = |\alpha_M|.$$

Each update is a step from $N(h)$ towards the normalised sublayer output, with learned per-channel
"eigen learning rates" $\lambda$, followed by the retraction $N$ back to the sphere. The
parameters are stored as upstream stores them and rescaled in the forward ("init value / init
scaling" trick, which keeps Adam's effective step the same for all of them):
$\alpha_{A,M} = a\cdot(0.05/\text{base\_scale})$ with $a$ = ``attn_alpha`` / ``mlp_alpha``
(stored ``base_scale * ones``), $s_{uv} = $ ``suv``$\cdot\sqrt{C}$ (stored ones).

The default attention sublayer (`ngpt_attention_forward`, weights ``query``, ``key``, ``value``,
``att_c_proj`` and ``sqk`` at the block level, as upstream) is

$$q = s_{qk}\odot N(R(hW_q)),\quad k = s_{qk}\odot N(R(hW_k)),\quad
A(h) = \big[\mathrm{softmax}(\sqrt{d}\,q_hk_h^\top + M_{causal})\,v_h\big]_hW_o,$$

per head of width $d$, with $s_{qk}$ = ``sqk``$\cdot(1/\text{base\_scale})$ reshaped ``(H, d)`` and
the softmax scale $+\sqrt d$ (not $1/\sqrt d$: $q, k$ have norm $s_{qk}$). The attention core is
refattn's SDPA (``refattn.attention.softmax.sdpa_forward``) with ``scale = sqrt(d)``. Any other
token mixer can replace it (``attention="multi_head_attention"`` ...; its keys then also sit at
the block level).

RoPE ($R$)
----------
``rope="upstream"`` reproduces ``apply_rotary_position_embeddings`` as written: with the
sinusoidal table $P_{t,2j} = \sin t\omega_j$, $P_{t,2j+1} = \cos t\omega_j$
($\omega_j = 10000^{-2j/d}$) split as $S = P_{:, :d/2}$, $K = P_{:, d/2:}$, it outputs
$q'_{2i} = -q_{2i+1}K_{t,i}$, $q'_{2i+1} = q_{2i}S_{t,i}$ — a position-dependent linear map but
not a rotation (the table halves are taken as sin/cos and the $q\cos$ term is never added;
NVIDIA/ngpt issue #10). ``rope="interleaved"`` is the rotation the paper describes (GPT-J pairs,
`refattn.nn.rope.apply_rope`), ``rope="none"`` skips it. The default is upstream's, so that
upstream checkpoints load; the map is linear either way and its VJP is its transpose.

Backward
--------
$J_N^\top g = (g - \hat v\langle g, \hat v\rangle)/\|v\|$ (via `refattn.nn.norms.normalize_backward`,
RMS form without eps, times $1/\sqrt C$). For $r = a + \lambda\odot(b - a)$: $da = (1-\lambda)\odot dr$,
$db = \lambda\odot dr$, $d\lambda = \sum dr\odot(b-a)$ over all but the channel axis, and
$d\alpha_{stored} = \mathrm{sign}(\alpha)\,(0.05/\text{base\_scale})\,d\lambda$ (the kink of
$|\alpha|$ at 0 is avoided by the samplers). MLP: $du = dx_m\odot\mathrm{SiLU}(v)$,
$dv = dx_m\odot u\odot\mathrm{SiLU}'(v)$, $ds_{uv,stored} = \sqrt C\sum d[u\,v]\odot h_1W_{fc}$. The
attention's backward (the sublayer's own) receives $J_N^\top db$. In the default attention,
SDPA's backward gives $d\hat q, d\hat k, dv$; $ds_{qk} = \sum d\hat q\odot N(q') + d\hat k\odot N(k')$,
then $J_N^\top$, the RoPE transpose and the projections.

Conventions and not reproduced
------------------------------
``alpha_init_value = 0.05``, ``suv_init_value = 1``, ``sqk_init_value = 1``, ``base_scale =
1/sqrt(C)`` (train.py), causal attention, no biases (``bias=False``; optional keys accepted).
The weight-matrix normalisation after every optimiser step (``normalize_matrices``) is a
retraction of the optimiser, not part of the forward, and is left to the training loop; the
embedding and the scaled logits $s_z\odot hE^\top$ are outside the block. Upstream computes in
bfloat16 (flash-attn); the parity run casts the module to float64 and replaces
``flash_attn_func`` by PyTorch SDPA.

Agreement with upstream
-----------------------
Upstream ``Block`` (``use_nGPT=1``) in float64 on CPU, ``flash_attn_func`` replaced by PyTorch
SDPA and the bfloat16 casts removed: output and every gradient agree to $5.2\times10^{-8}$
relative (upstream's sinusoidal table is float32); with the table built in float64,
$9.4\times10^{-16}$.
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
from ..nn.activations import silu, silu_grad
from ..nn.linear import linear_prefixed, linear_prefixed_spec, linear_prefixed_vjp, merge_heads, split_heads
from ..nn.norms import normalize_backward, normalize_forward
from ..nn.rope import apply_rope, rope_angles
from ..registry import Mechanism, Sample, register
from .core import add_prefix, block_dtype, init_attention_params, param_dim, resolve_sublayer, split_block_params

__all__ = ["unit_norm_forward", "unit_norm_backward", "ngpt_rope_tables", "ngpt_attention_forward",
           "ngpt_attention_backward", "ngpt_normalized_block_forward", "ngpt_normalized_block_backward",
           "ngpt_normalized_block", "NGPT_ROPE"]

NGPT_ROPE = ("upstream", "interleaved", "none")
_ATTN_WEIGHTS = ("query", "key", "value", "att_c_proj")


def unit_norm_forward(v: np.ndarray):
    r"""$N(v) = v/\|v\|$ over the last axis (no epsilon, as upstream ``justnorm``): ``(n, cache)``."""
    xhat, stats = normalize_forward(v, (v.ndim - 1,), 0.0, center=False)
    c = float(np.sqrt(v.shape[-1]))  # a Python float: a NumPy float64 scalar would upcast float32
    return xhat / c, (xhat, stats, c)


def unit_norm_backward(dn: np.ndarray, cache) -> np.ndarray:
    r"""$J_N^\top dn = (dn - n\langle dn, n\rangle)/\|v\|$ (the RMS-norm VJP, rescaled)."""
    xhat, stats, c = cache
    return normalize_backward(dn / c, xhat, stats)


def ngpt_rope_tables(n: int, d: int, rope: str = "upstream", dtype=np.float64):
    r"""Per-position tables ``(a, b)`` of shape ``(n, d/2)``: for ``"upstream"`` the maps
    $q'_{2i} = -q_{2i+1}a_{t,i}$, $q'_{2i+1} = q_{2i}b_{t,i}$ (``a`` = cos half, ``b`` = sin half
    of upstream's table); for ``"interleaved"`` ``(cos, sin)`` of the standard RoPE angles."""
    if rope == "interleaved":
        ang = rope_angles(np.arange(n), d)
        return np.cos(ang).astype(dtype), np.sin(ang).astype(dtype)
    table = np.zeros((n, d))
    ang = np.arange(n)[:, None] * np.exp(np.arange(0, d, 2) * (-np.log(10000.0) / d))
    table[:, 0::2], table[:, 1::2] = np.sin(ang), np.cos(ang)
    return table[:, d // 2:].astype(dtype), table[:, : d // 2].astype(dtype)


def _rope(x, tables, rope, transpose=False):
    if rope == "none":
        return x
    a, b = tables
    if rope == "interleaved":
        return apply_rope(x, a, -b if transpose else b, interleaved=True)
    out = np.empty_like(x)
    if transpose:  # adjoint of q'_{2i} = -q_{2i+1} a, q'_{2i+1} = q_{2i} b
        out[..., 1::2] = -x[..., 0::2] * a
        out[..., 0::2] = x[..., 1::2] * b
    else:
        out[..., 0::2] = -x[..., 1::2] * a
        out[..., 1::2] = x[..., 0::2] * b
    return out


def ngpt_attention_forward(x, params, *, num_heads: int, rope: str = "upstream", base_scale=None,
                           sqk_init_value: float = 1.0, is_causal: bool = True):
    r"""nGPT's normalised attention sublayer (module docstring), ``x (..., N, C)`` -> ``(..., N, C)``.

    Parameters
    ----------
    x : array (..., N, C)
    params : dict
        ``"query.weight"``, ``"key.weight"``, ``"value.weight"`` ``(C, H*d)``, ``"att_c_proj.weight"
        (H*d, C)`` (PyTorch ``weight.T``; optional ``".bias"``), ``"sqk" (H*d,)`` (stored units).
    num_heads : int
    rope : {"upstream", "interleaved", "none"}
    base_scale : float, optional
        Default $1/\sqrt C$; $s_{qk}$ = ``sqk`` $\cdot$ ``sqk_init_value / base_scale``.
    sqk_init_value : float
    is_causal : bool
    """
    from ..attention.softmax import sdpa_forward

    x = as_float(x, "x", min_ndim=2)
    h = check_int(num_heads, "num_heads", minimum=1)
    check_choice(rope, "rope", NGPT_ROPE)
    c = x.shape[-1]
    bs = float(1.0 / np.sqrt(c)) if base_scale is None else check_positive(base_scale, "base_scale")
    s0 = check_positive(sqk_init_value, "sqk_init_value")
    inner = param_dim(params, "query.weight", 1, where="ngpt_attention", shape=("C", "H*d"))
    if inner % h or (rope != "none" and (inner // h) % 2):
        raise ValueError(f"query.weight's output width {inner} must be num_heads={h} times a head width "
                         f"(even for RoPE)")
    spec = {}
    for w in _ATTN_WEIGHTS:
        spec.update(linear_prefixed_spec(w, inner if w == "att_c_proj" else c, c if w == "att_c_proj" else inner))
    spec["sqk"] = (inner,)
    p = check_params(params, spec, optional=[f"{w}.bias" for w in _ATTN_WEIGHTS], where="ngpt_attention")
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    d, n = inner // h, x.shape[-2]
    tables = None if rope == "none" else ngpt_rope_tables(n, d, rope, dt)
    s_qk = (p["sqk"] * (s0 / bs)).reshape(h, 1, d)
    qr = _rope(split_heads(linear_prefixed(p, "query", x), h), tables, rope)
    kr = _rope(split_heads(linear_prefixed(p, "key", x), h), tables, rope)
    nq, cq = unit_norm_forward(qr)
    nk, ck = unit_norm_forward(kr)
    v = split_heads(linear_prefixed(p, "value", x), h)
    o, co = sdpa_forward(s_qk * nq, s_qk * nk, v, is_causal=bool(is_causal), scale=float(np.sqrt(d)))
    om = merge_heads(o)
    cache = {"x": x, "p": p, "om": om, "core": co, "nq": nq, "nk": nk, "cq": cq, "ck": ck, "s_qk": s_qk,
             "tables": tables, "rope": rope, "h": h, "sfac": s0 / bs, "dtype": dt}
    return linear_prefixed(p, "att_c_proj", om), cache


def ngpt_attention_backward(dout, cache):
    r"""Gradients of `ngpt_attention_forward` for ``x`` and every params key (module docstring)."""
    from ..attention.softmax import sdpa_backward

    x, p, h, s_qk = cache["x"], cache["p"], cache["h"], cache["s_qk"]
    g = as_dout(dout, x.shape, cache["dtype"])
    grads = {}
    dom = linear_prefixed_vjp(grads, p, "att_c_proj", g, cache["om"])
    gc = sdpa_backward(split_heads(dom, h), cache["core"])
    lead = tuple(range(gc["q"].ndim - 3)) + (gc["q"].ndim - 2,)
    ds = np.sum(gc["q"] * cache["nq"] + gc["k"] * cache["nk"], axis=lead)
    grads["sqk"] = (ds * cache["sfac"]).reshape(-1)
    dx = linear_prefixed_vjp(grads, p, "value", merge_heads(gc["v"]), x)
    for w, key, c in (("query", "q", cache["cq"]), ("key", "k", cache["ck"])):
        dr = _rope(unit_norm_backward(s_qk * gc[key], c), cache["tables"], cache["rope"], transpose=True)
        dx = dx + linear_prefixed_vjp(grads, p, w, merge_heads(dr), x)
    grads["x"] = dx
    return grads


def ngpt_normalized_block_forward(x, params, *, attention=None, attention_config=None, base_scale=None,
                                  alpha_init_value: float = 0.05, suv_init_value: float = 1.0):
    r"""nGPT block: two hypersphere updates, attention then SwiGLU MLP (module docstring).

    Parameters
    ----------
    x : array (..., N, C)
        The block input $h$ (unit rows in a trained model; any nonzero rows work).
    params : dict
        ``"attn_alpha"``, ``"mlp_alpha"`` ``(C,)``, ``"c_fc.weight" (C, 2F)``, ``"suv" (2F,)``,
        ``"mlp_c_proj.weight" (F, C)`` (PyTorch ``weight.T``; optional ``".bias"``), all in
        upstream's stored units; the attention's keys at the block level (default attention:
        ``"query.weight"``, ``"key.weight"``, ``"value.weight"``, ``"att_c_proj.weight"``,
        ``"sqk"``).
    attention : str, (forward, backward) or Sublayer, optional
        Default `ngpt_attention_forward` (``attention_config`` needs ``num_heads``; the block's
        ``base_scale`` is passed to it unless the config sets one).
    attention_config : dict, optional
    base_scale : float, optional
        Default $1/\sqrt C$.
    alpha_init_value, suv_init_value : float
        0.05 and 1 (upstream).
    """
    x = as_float(x, "x", min_ndim=2)
    c = x.shape[-1]
    bs = float(1.0 / np.sqrt(c)) if base_scale is None else check_positive(base_scale, "base_scale")
    a0 = check_positive(alpha_init_value, "alpha_init_value")
    u0 = check_positive(suv_init_value, "suv_init_value")
    if attention is None:
        attention = (ngpt_attention_forward, ngpt_attention_backward)
        if attention_config is None or "base_scale" not in attention_config:
            attention_config = dict(attention_config or {}, base_scale=bs)
    attn = resolve_sublayer(attention, prefix="", config=attention_config)
    check_weight_in(params, "c_fc.weight", c, input_name="x")  # 2F is read off its output axis
    f2 = param_dim(params, "c_fc.weight", 1, where="ngpt_normalized_block", shape=("C", "2F"))
    if f2 % 2:
        raise ValueError(f"c_fc.weight's output width must be even (u and v halves); got {f2}")
    spec = {"attn_alpha": (c,), "mlp_alpha": (c,), "suv": (f2,)}
    spec.update(linear_prefixed_spec("c_fc", c, f2))
    spec.update(linear_prefixed_spec("mlp_c_proj", f2 // 2, c))
    own, (ap,) = split_block_params(params, spec, (attn,), optional=("c_fc.bias", "mlp_c_proj.bias"),
                                    where="ngpt_normalized_block")
    dt = block_dtype(x, own, (ap,))
    x, own, ap = x.astype(dt, copy=False), cast_all(dt, own), cast_all(dt, ap)
    afac, sfac = a0 / bs, float(u0 * np.sqrt(c))
    nh, c_nh = unit_norm_forward(x)
    att, c_att = attn.apply(x, ap)
    r1, c_r1 = _sphere_step(nh, att, own["attn_alpha"] * afac)
    h1, c_h1 = unit_norm_forward(r1)
    z = linear_prefixed(own, "c_fc", h1)
    uv = z * (own["suv"] * sfac)
    f = f2 // 2
    u, v = uv[..., :f], uv[..., f:]
    xm = u * silu(v)
    hm = linear_prefixed(own, "mlp_c_proj", xm)
    nh1, c_nh1 = unit_norm_forward(h1)
    r2, c_r2 = _sphere_step(nh1, hm, own["mlp_alpha"] * afac)
    y, c_y = unit_norm_forward(r2)
    cache = {"attn": attn, "params": own, "c_nh": c_nh, "c_att": c_att, "c_r1": c_r1, "c_h1": c_h1, "h1": h1,
             "z": z, "uv": uv, "xm": xm, "c_nh1": c_nh1, "c_r2": c_r2, "c_y": c_y, "afac": afac, "sfac": sfac,
             "shape": x.shape, "dtype": dt}
    return y, cache


def _sphere_step(a, out, alpha):
    # r = a + |alpha| (N(out) - a); returns r and what its VJP needs.
    b, cb = unit_norm_forward(out)
    lam = np.abs(alpha)
    return a + lam * (b - a), (a, b, cb, lam, alpha)


def _sphere_step_backward(dr, cache, grads, key, afac):
    a, b, cb, lam, alpha = cache
    lead = tuple(range(dr.ndim - 1))
    grads[key] = np.sum(dr * (b - a), axis=lead) * np.sign(alpha) * afac
    return (1.0 - lam) * dr, unit_norm_backward(lam * dr, cb)


def ngpt_normalized_block_backward(dout, cache):
    r"""Gradients of `ngpt_normalized_block_forward` for ``x`` and every params key (module docstring)."""
    own, afac, sfac = cache["params"], cache["afac"], cache["sfac"]
    g = as_dout(dout, cache["shape"], cache["dtype"])
    grads = {}
    dr2 = unit_norm_backward(g, cache["c_y"])
    dnh1, dhm = _sphere_step_backward(dr2, cache["c_r2"], grads, "mlp_alpha", afac)
    dxm = linear_prefixed_vjp(grads, own, "mlp_c_proj", dhm, cache["xm"])
    uv, f = cache["uv"], cache["xm"].shape[-1]
    u, v = uv[..., :f], uv[..., f:]
    duv = np.concatenate([dxm * silu(v), dxm * u * silu_grad(v)], axis=-1)
    lead = tuple(range(duv.ndim - 1))
    grads["suv"] = np.sum(duv * cache["z"], axis=lead) * sfac
    dh1 = linear_prefixed_vjp(grads, own, "c_fc", duv * (own["suv"] * sfac), cache["h1"])
    dh1 = dh1 + unit_norm_backward(dnh1, cache["c_nh1"])
    dr1 = unit_norm_backward(dh1, cache["c_h1"])
    dnh, datt = _sphere_step_backward(dr1, cache["c_r1"], grads, "attn_alpha", afac)
    dx = cache["attn"].vjp(datt, cache["c_att"], grads) + unit_norm_backward(dnh, cache["c_nh"])
    grads["x"] = dx
    return grads


def ngpt_normalized_block(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of `ngpt_normalized_block_forward`."""
    return ngpt_normalized_block_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _away_from_zero(rng, shape, scale):
    return scale * rng.choice([-1.0, 1.0], shape) * (0.5 + rng.random(shape))


def _params(rng, c, f, h, attention=None):
    bs = 1.0 / np.sqrt(c)
    p = {"attn_alpha": _away_from_zero(rng, c, bs), "mlp_alpha": _away_from_zero(rng, c, bs),
         "c_fc.weight": rng.standard_normal((c, 2 * f)) / np.sqrt(c), "suv": 1.0 + 0.3 * rng.standard_normal(2 * f),
         "mlp_c_proj.weight": rng.standard_normal((f, c)) / np.sqrt(f)}
    if attention is None:
        for w in ("query", "key", "value"):
            p[f"{w}.weight"] = rng.standard_normal((c, c)) / np.sqrt(c)
        p["att_c_proj.weight"] = rng.standard_normal((c, c)) / np.sqrt(c)
        p["sqk"] = bs * (1.0 + 0.3 * rng.standard_normal(c))
        return p, {"num_heads": h}
    ap, acfg = init_attention_params(rng, attention, c, h)
    p.update(add_prefix(ap, ""))
    return p, acfg


def _sample(rng, size, attention=None, rope=None):
    if size == "tiny":
        n, c, f, h = int(rng.integers(2, 4)), 4, 3, 2
    else:
        n, c, f, h = int(rng.integers(4, 7)), 8, 8, 2
    p, acfg = _params(rng, c, f, h, attention)
    if attention is None:
        acfg["rope"] = rope or str(rng.choice(NGPT_ROPE))
    cfg = {"attention_config": acfg} if attention is None else {"attention": attention, "attention_config": acfg}
    return Sample(inputs={"x": rng.standard_normal((2, n, c))}, params=p, config=cfg)


def _check_on_the_sphere(rng):
    s = _sample(rng, "small")
    y = ngpt_normalized_block(**s.inputs, params=s.params, **s.config)
    err = float(np.abs(np.linalg.norm(y, axis=-1) - 1.0).max())
    assert err < 1e-12, f"hidden states leave the unit sphere by {err}"
    return err


def _check_u_scale_invariance(rng):
    # Scaling the u half of s_uv scales h_M, which N(h_M) removes: the output does not change.
    s = _sample(rng, "small")
    p = dict(s.params)
    f = p["suv"].shape[0] // 2
    p["suv"] = np.concatenate([3.0 * p["suv"][:f], p["suv"][f:]])
    a = ngpt_normalized_block(**s.inputs, params=s.params, **s.config)
    b = ngpt_normalized_block(**s.inputs, params=p, **s.config)
    err = float(np.abs(a - b).max())
    assert err < 1e-12, f"the u-scale changed the output by {err}"
    return err


def _check_alpha_zero_keeps_the_state(rng):
    # alpha_A = alpha_M = 0: no step is taken, y = N(h).
    s = _sample(rng, "small")
    p = dict(s.params, attn_alpha=np.zeros_like(s.params["attn_alpha"]), mlp_alpha=np.zeros_like(s.params["mlp_alpha"]))
    x = s.inputs["x"]
    y = ngpt_normalized_block(x, p, **s.config)
    err = float(np.abs(y - x / np.linalg.norm(x, axis=-1, keepdims=True)).max())
    assert err < 1e-12, f"with zero eigen learning rates the block moved the state by {err}"
    return err


def _check_upstream_rope_map(rng):
    # rope="upstream" equals upstream's expression with its table split into halves.
    n, d = 5, 6
    q = rng.standard_normal((2, 1, n, d))
    a, b = ngpt_rope_tables(n, d, "upstream")
    pos = np.arange(n)[:, None]
    table = np.zeros((n, d))
    table[:, 0::2] = np.sin(pos * np.exp(np.arange(0, d, 2) * -np.log(10000.0) / d))
    table[:, 1::2] = np.cos(pos * np.exp(np.arange(0, d, 2) * -np.log(10000.0) / d))
    sin, cos = table[:, : d // 2], table[:, d // 2:]
    ref = (np.stack([-q[..., 1::2], q[..., 0::2]], -1).reshape(q.shape[:-1] + (d // 2, 2))
           * np.stack([cos, sin], -1)).reshape(q.shape)
    err = float(np.abs(_rope(q, (a, b), "upstream") - ref).max())
    dq = rng.standard_normal(q.shape)
    adj = abs(float(np.sum(_rope(q, (a, b), "upstream") * dq) - np.sum(q * _rope(dq, (a, b), "upstream", True))))
    assert err < 1e-14 and adj < 1e-12, f"upstream RoPE map error {err}, adjoint error {adj}"
    return max(err, adj)


register(
    Mechanism(
        slug="ngpt_normalized_block", family="5-building-blocks", tier="T2",
        title="nGPT normalised block: hypersphere updates with eigen learning rates, pluggable attention",
        paper="Loshchilov, Hsieh, Sun, Ginsburg, nGPT: Normalized Transformer with Representation Learning on "
              "the Hypersphere, ICLR 2025, arXiv 2410.01131",
        forward=ngpt_normalized_block_forward, backward=ngpt_normalized_block_backward, sample=_sample,
        docs="blocks/residual-blocks.md#ngpt-normalised-block",
        checks={"on_the_sphere": _check_on_the_sphere, "u_scale_invariance": _check_u_scale_invariance,
                "alpha_zero_keeps_the_state": _check_alpha_zero_keeps_the_state,
                "upstream_rope_map": _check_upstream_rope_map},
    ),
)
