r"""CaiT class-attention (the class token attends to itself and the frozen patch tokens) and, as a
separate option, CaiT's talking-heads self-attention.

Paper: Touvron, Cord, Sablayrolles, Synnaeve, Jégou, "Going deeper with Image Transformers",
ICCV 2021, arXiv 2103.17239 (its two changes are LayerScale and class-attention); talking heads:
Shazeer, Lan, Cheng, Ding, Hou, "Talking-Heads Attention", arXiv 2003.02436. Upstream:
facebookresearch/deit ``cait_models.py`` @7e160fe43f0252d17191b71cbb5826254114ea5b
(``Class_Attention``, ``LayerScale_Block_CA``, ``Attention_talking_head``).

Class-attention block (``LayerScale_Block_CA``)
-----------------------------------------------
Patch tokens $x\in\mathbb R^{N\times C}$ (the output of the self-attention stage, frozen here), the
class token $x_c\in\mathbb R^{1\times C}$, $z = [x_c; x]$, $\hat z = \mathrm{LN}_1(z)$:

$$q = \hat z_0W_q,\quad K = \hat zW_k,\quad V = \hat zW_v,\quad
a_h = \mathrm{softmax}\big(s\,q_hK_h^\top\big),\quad \mathrm{CA}(z) = [a_1V_1\|\dots\|a_HV_H]\,W_p + b_p,$$
$$x_c' = x_c + \gamma_1\odot\mathrm{CA}(z),\qquad x_c'' = x_c' + \gamma_2\odot\mathrm{MLP}(\mathrm{LN}_2(x_c')),$$

$s = d^{-1/2}$ (``qk_scale``); $\gamma_{1,2}$ LayerScale (``gamma_1``, ``gamma_2``, init $10^{-4}$ or
$10^{-5}$ by depth); LayerNorm $\epsilon = 10^{-6}$ (``partial(nn.LayerNorm, eps=1e-6)`` in every
CaiT model; ``eps``). Only the class token is updated: the patch tokens leave the block
unchanged and are read only through $K$ and $V$. Parameters (``state_dict`` names, linear weights
``(in, out)`` = torch ``weight.T``): ``norm1.*``, ``attn.q/k/v.weight`` (and ``.bias`` with
``qkv_bias=True``; CaiT's default has none), ``attn.proj.*``, ``gamma_1``, ``norm2.*``,
``mlp.fc1.*``, ``mlp.fc2.*``, ``gamma_2``.

Backward: with $G$ on $x_c''$: $dx_c' = G + \mathrm{LN}_2^\top(\mathrm{MLP}^\top(\gamma_2\odot G))$,
$d\gamma_2 = \sum G\odot\mathrm{MLP}$, $d\gamma_1 = \sum dx_c'\odot\mathrm{CA}$; the attention VJP with a
single query row (`refattn.attention.softmax.attention_core_backward`) gives $dq, dK, dV$, then
$d\hat z_0 = dq\,W_q^\top + dK_0W_k^\top + dV_0W_v^\top$, $d\hat z_{1..N} = dKW_k^\top + dVW_v^\top$, and
$dz = \mathrm{LN}_1^\top(d\hat z)$ splits into $dx_c$ (plus the residual $dx_c'$) and $dx$.

Talking-heads attention (``Attention_talking_head``, the self-attention of CaiT's first stage)
-----------------------------------------------------------------------------------------------
$S_h = s\,Q_hK_h^\top$, logits mixed across heads before the softmax and weights after it,
$$S'_g = \sum_h L_{hg}S_h + \ell_g,\qquad P_g = \mathrm{softmax}(S'_g),\qquad
P'_g = \sum_h W_{hg}P_h + w_g,\qquad O_g = P'_gV_g,$$
with ``proj_l`` ($L$, $\ell$) and ``proj_w`` ($W$, $w$) the $H\times H$ linear maps over the head
axis, ``qkv``/``proj`` as usual. Backward: $dP' = dO\,V^\top$, $dV = P'^\top dO$,
$dW = \sum P_h\,dP'_g$, $dP_h = \sum_g W_{hg}\,dP'_g$, $dS' = $ softmax VJP, $dL = \sum S_h\,dS'_g$,
$dS_h = \sum_g L_{hg}\,dS'_g$, $dQ = s\,dS\,K$, $dK = dS^\top(sQ)$. It is exposed as
`talking_heads_attention_forward`/`_backward` and verified by the ``class_attention`` record's
named checks (it has no catalogue slug of its own).
"""

from __future__ import annotations

import math

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_params, check_positive, compute_dtype
from ...blocks.core import mlp_backward, mlp_forward, norm_backward, norm_forward
from ...nn.linear import linear_apply, linear_vjp, merge_heads, split_heads
from ...nn.softmax import softmax_lse, softmax_vjp
from ...registry import Mechanism, Sample, register
from .core import attention_core_backward, attention_core_forward, check_size

__all__ = [
    "class_attention_param_spec",
    "init_class_attention_params",
    "class_attention_block_forward",
    "class_attention_block_backward",
    "class_attention_block",
    "talking_heads_param_spec",
    "talking_heads_attention_forward",
    "talking_heads_attention_backward",
    "talking_heads_attention",
]


def class_attention_param_spec(dim: int, *, mlp_hidden: int) -> tuple[dict, tuple]:
    """``(spec, optional)`` of ``LayerScale_Block_CA`` (names as its ``state_dict``; linear ``(in, out)``)."""
    c = dim
    spec = {"norm1.weight": (c,), "norm1.bias": (c,)}
    for n in ("q", "k", "v"):
        spec[f"attn.{n}.weight"] = (c, c)
        spec[f"attn.{n}.bias"] = (c,)
    spec.update({"attn.proj.weight": (c, c), "attn.proj.bias": (c,), "gamma_1": (c,), "norm2.weight": (c,),
                 "norm2.bias": (c,), "mlp.fc1.weight": (c, mlp_hidden), "mlp.fc1.bias": (mlp_hidden,),
                 "mlp.fc2.weight": (mlp_hidden, c), "mlp.fc2.bias": (c,), "gamma_2": (c,)})
    return spec, ("attn.q.bias", "attn.k.bias", "attn.v.bias")


def init_class_attention_params(rng, dim: int, *, mlp_ratio: float = 4.0, qkv_bias: bool = False,
                                init_values: float = 1e-4) -> dict:
    """Random parameters; ``gamma_1 = gamma_2 = init_values`` (CaiT's LayerScale init) plus noise."""
    spec, optional = class_attention_param_spec(dim, mlp_hidden=int(dim * mlp_ratio))
    p = {}
    for k, shp in spec.items():
        if k in optional and not qkv_bias:
            continue
        if k.startswith("gamma"):
            p[k] = init_values * (1.0 + 0.3 * rng.standard_normal(shp))
        elif k.startswith("norm"):
            p[k] = (1.0 if k.endswith("weight") else 0.0) + 0.1 * rng.standard_normal(shp)
        elif len(shp) == 2:
            p[k] = rng.uniform(-1.0, 1.0, shp) / math.sqrt(shp[0])
        else:
            p[k] = 0.1 * rng.standard_normal(shp)
    return p


def _heads_and_scale(num_heads, c, scale):
    nh = check_size(num_heads, "num_heads")
    if c % nh:
        raise ValueError(f"the channels ({c}) must be divisible by num_heads ({nh})")
    scale = check_positive(scale, "scale", allow_none=True)
    return nh, float((c // nh) ** -0.5) if scale is None else scale


# --------------------------------------------------------------------------------------------
# Class-attention block


def class_attention_block_forward(x, x_cls, params, *, num_heads: int, scale=None, eps: float = 1e-6):
    r"""CaiT's class-attention block (``LayerScale_Block_CA``; see the module docstring).

    Parameters
    ----------
    x : array (B, N, C)
        Patch tokens (read through keys and values only; not updated).
    x_cls : array (B, 1, C)
        The class token.
    params : dict
        Keys of `class_attention_param_spec` (``attn.q/k/v.bias`` optional).
    num_heads : int
    scale : float, optional
        ``qk_scale``; default $d^{-1/2}$ with $d = C/H$.
    eps : float
        LayerNorm epsilon (1e-6 in every CaiT model).

    Returns
    -------
    out, cache
        The updated class token ``(B, 1, C)``.
    """
    x = as_float(x, "x", ndim=3)
    x_cls = as_float(x_cls, "x_cls", ndim=3)
    if x_cls.shape != (x.shape[0], 1, x.shape[2]):
        raise ValueError(f"x_cls must have shape (B, 1, C) = {(x.shape[0], 1, x.shape[2])}; got {x_cls.shape}")
    c = x.shape[-1]
    nh, s = _heads_and_scale(num_heads, c, scale)
    eps = check_positive(eps, "eps")
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict (see class_attention_param_spec); got {type(params).__name__}")
    hid = np.shape(params["mlp.fc1.weight"])[-1] if np.ndim(params.get("mlp.fc1.weight")) == 2 else 4 * c
    spec, optional = class_attention_param_spec(c, mlp_hidden=hid)
    p = check_params(params, spec, optional=optional, where="class_attention_block (CaiT LayerScale_Block_CA)")
    dt = compute_dtype(x, x_cls, *p.values())
    x, x_cls, p = x.astype(dt, copy=False), x_cls.astype(dt, copy=False), cast_all(dt, p)
    z = np.concatenate([x_cls, x], axis=1)
    zh, c1 = norm_forward(p, "norm1", z, eps=eps)
    q = split_heads(linear_apply(zh[:, :1], p["attn.q.weight"], p.get("attn.q.bias")), nh)   # (B, H, 1, d)
    k = split_heads(linear_apply(zh, p["attn.k.weight"], p.get("attn.k.bias")), nh)          # (B, H, N+1, d)
    v = split_heads(linear_apply(zh, p["attn.v.weight"], p.get("attn.v.bias")), nh)
    o, core = attention_core_forward(q, k, v, scale=s)
    om = merge_heads(o)
    ca = linear_apply(om, p["attn.proj.weight"], p["attn.proj.bias"])
    u = x_cls + p["gamma_1"] * ca
    h2, c2 = norm_forward(p, "norm2", u, eps=eps)
    m, cm = mlp_forward(p, h2, fc1="mlp.fc1", fc2="mlp.fc2", activation="gelu")
    y = u + p["gamma_2"] * m
    return y, {"p": p, "zh": zh, "c1": c1, "core": core, "om": om, "ca": ca, "c2": c2, "cm": cm, "m": m,
               "nh": nh, "shape": y.shape}


def class_attention_block_backward(dout, cache):
    """Gradient of :func:`class_attention_block_forward`: ``x``, ``x_cls`` and every parameter."""
    p, zh, nh = cache["p"], cache["zh"], cache["nh"]
    g = as_dout(dout, cache["shape"], zh.dtype)
    grads = {"gamma_2": np.sum(g * cache["m"], axis=(0, 1))}
    du = g + norm_backward(grads, p, mlp_backward(grads, p, g * p["gamma_2"], cache["cm"]), cache["c2"])
    grads["gamma_1"] = np.sum(du * cache["ca"], axis=(0, 1))
    lo = linear_vjp(du * p["gamma_1"], cache["om"], p["attn.proj.weight"])
    grads["attn.proj.weight"], grads["attn.proj.bias"] = lo["weight"], lo["bias"]
    gc = attention_core_backward(split_heads(lo["x"], nh), cache["core"])
    dzh = np.zeros_like(zh)
    for n, src in (("q", zh[:, :1]), ("k", zh), ("v", zh)):
        lz = linear_vjp(merge_heads(gc[n]), src, p[f"attn.{n}.weight"], f"attn.{n}.bias" in p)
        grads[f"attn.{n}.weight"] = lz["weight"]
        if f"attn.{n}.bias" in p:
            grads[f"attn.{n}.bias"] = lz["bias"]
        if n == "q":
            dzh[:, :1] += lz["x"]
        else:
            dzh += lz["x"]
    dz = norm_backward(grads, p, dzh, cache["c1"])
    return {"x": dz[:, 1:], "x_cls": du + dz[:, :1], **{k: grads[k] for k in p}}


def class_attention_block(x, x_cls, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`class_attention_block_forward`."""
    return class_attention_block_forward(x, x_cls, params, **config)[0]


# --------------------------------------------------------------------------------------------
# Talking-heads self-attention


def talking_heads_param_spec(dim: int, num_heads: int) -> tuple[dict, tuple]:
    """``(spec, optional)`` of ``Attention_talking_head``: ``qkv (C, 3C)`` (bias optional), ``proj``,
    ``proj_l``/``proj_w`` ``(H, H)`` with biases (weights ``(in, out)`` = torch ``weight.T``)."""
    c, h = dim, num_heads
    spec = {"qkv.weight": (c, 3 * c), "qkv.bias": (3 * c,), "proj.weight": (c, c), "proj.bias": (c,),
            "proj_l.weight": (h, h), "proj_l.bias": (h,), "proj_w.weight": (h, h), "proj_w.bias": (h,)}
    return spec, ("qkv.bias",)


def talking_heads_attention_forward(x, params, *, num_heads: int, scale=None):
    r"""CaiT's talking-heads self-attention on ``x (B, N, C)`` (see the module docstring); ``params``
    as `talking_heads_param_spec`; ``scale`` default $d^{-1/2}$. Returns ``(out (B, N, C), cache)``."""
    x = as_float(x, "x", ndim=3)
    c = x.shape[-1]
    nh, s = _heads_and_scale(num_heads, c, scale)
    spec, optional = talking_heads_param_spec(c, nh)
    p = check_params(params, spec, optional=optional, where="talking_heads_attention (CaiT Attention_talking_head)")
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    qkv = linear_apply(x, p["qkv.weight"], p.get("qkv.bias"))
    q, k, v = (split_heads(qkv[..., i * c:(i + 1) * c], nh) for i in range(3))   # (B, H, N, d)
    qs = q * s
    sc = qs @ np.swapaxes(k, -1, -2)                                             # (B, H, N, N)
    sl = np.moveaxis(linear_apply(np.moveaxis(sc, 1, -1), p["proj_l.weight"], p["proj_l.bias"]), -1, 1)
    pr, _ = softmax_lse(sl, axis=-1)
    pw = np.moveaxis(linear_apply(np.moveaxis(pr, 1, -1), p["proj_w.weight"], p["proj_w.bias"]), -1, 1)
    om = merge_heads(pw @ v)
    y = linear_apply(om, p["proj.weight"], p["proj.bias"])
    return y, {"x": x, "p": p, "qs": qs, "k": k, "v": v, "sc": sc, "pr": pr, "pw": pw, "om": om, "s": s, "nh": nh,
               "shape": y.shape}


def talking_heads_attention_backward(dout, cache):
    """Gradient of :func:`talking_heads_attention_forward`: ``x`` and every parameter."""
    p, x, nh = cache["p"], cache["x"], cache["nh"]
    g = as_dout(dout, cache["shape"], x.dtype)
    grads = {}
    lo = linear_vjp(g, cache["om"], p["proj.weight"])
    grads["proj.weight"], grads["proj.bias"] = lo["weight"], lo["bias"]
    do = split_heads(lo["x"], nh)
    v, pw = cache["v"], cache["pw"]
    dv = np.swapaxes(pw, -1, -2) @ do
    dpw = do @ np.swapaxes(v, -1, -2)
    lw = linear_vjp(np.moveaxis(dpw, 1, -1), np.moveaxis(cache["pr"], 1, -1), p["proj_w.weight"])
    grads["proj_w.weight"], grads["proj_w.bias"] = lw["weight"], lw["bias"]
    dsl = softmax_vjp(cache["pr"], np.moveaxis(lw["x"], -1, 1))
    ll = linear_vjp(np.moveaxis(dsl, 1, -1), np.moveaxis(cache["sc"], 1, -1), p["proj_l.weight"])
    grads["proj_l.weight"], grads["proj_l.bias"] = ll["weight"], ll["bias"]
    dsc = np.moveaxis(ll["x"], -1, 1)
    dq = cache["s"] * (dsc @ cache["k"])
    dk = np.swapaxes(dsc, -1, -2) @ cache["qs"]
    dqkv = np.concatenate([merge_heads(dq), merge_heads(dk), merge_heads(dv)], axis=-1)
    lq = linear_vjp(dqkv, x, p["qkv.weight"], "qkv.bias" in p)
    grads["qkv.weight"] = lq["weight"]
    if "qkv.bias" in p:
        grads["qkv.bias"] = lq["bias"]
    return {"x": lq["x"], **{k: grads[k] for k in p}}


def talking_heads_attention(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`talking_heads_attention_forward`."""
    return talking_heads_attention_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size):
    b, n, c, nh = (2, 3, 4, 2) if size == "tiny" else (2, int(rng.integers(4, 10)), 6, 3)
    p = init_class_attention_params(rng, c, mlp_ratio=1.0 if size == "tiny" else 2.0,
                                    qkv_bias=bool(rng.random() < 0.5), init_values=0.5)
    return Sample(inputs={"x": rng.standard_normal((b, n, c)), "x_cls": rng.standard_normal((b, 1, c))}, params=p,
                  config={"num_heads": nh})


def _ln(z, w, b, eps):
    mu = z.mean(-1, keepdims=True)
    return (z - mu) / np.sqrt(((z - mu) ** 2).mean(-1, keepdims=True) + eps) * w + b


def _reference(x, x_cls, params, *, num_heads, scale=None, eps=1e-6):
    # Per batch element and head, the single class query over all N + 1 tokens, written out.
    from ...nn.activations import gelu
    p = params
    b, n, c = x.shape
    d = c // num_heads
    s = d ** -0.5 if scale is None else scale
    z = _ln(np.concatenate([x_cls, x], axis=1), p["norm1.weight"], p["norm1.bias"], eps)
    out = np.zeros((b, 1, c))
    for bb in range(b):
        q = z[bb, 0] @ p["attn.q.weight"] + p.get("attn.q.bias", 0.0)
        k = z[bb] @ p["attn.k.weight"] + p.get("attn.k.bias", 0.0)
        v = z[bb] @ p["attn.v.weight"] + p.get("attn.v.bias", 0.0)
        for h in range(num_heads):
            sl = slice(h * d, (h + 1) * d)
            e = np.array([s * q[sl] @ k[j, sl] for j in range(n + 1)])
            w = np.exp(e - e.max())
            out[bb, 0, sl] = (w / w.sum()) @ v[:, sl]
    u = x_cls + p["gamma_1"] * (out @ p["attn.proj.weight"] + p["attn.proj.bias"])
    h2 = _ln(u, p["norm2.weight"], p["norm2.bias"], eps)
    return u + p["gamma_2"] * (gelu(h2 @ p["mlp.fc1.weight"] + p["mlp.fc1.bias"]) @ p["mlp.fc2.weight"]
                               + p["mlp.fc2.bias"])


def _check_equals_mha_single_query(rng):
    # Class attention is multi-head attention with one query row (the class token) over [cls; patches].
    from .mha import mha
    s = _sample(rng, "small")
    p, cfg = s.params, s.config
    y, cache = class_attention_block_forward(s.inputs["x"], s.inputs["x_cls"], p, **cfg)
    zh = cache["zh"]
    mp = {"q_proj": p["attn.q.weight"], "k_proj": p["attn.k.weight"], "v_proj": p["attn.v.weight"],
          "out_proj": p["attn.proj.weight"], "out_proj_bias": p["attn.proj.bias"]}
    for n, m in (("q", "q_proj"), ("k", "k_proj"), ("v", "v_proj")):
        if f"attn.{n}.bias" in p:
            mp[m + "_bias"] = p[f"attn.{n}.bias"]
    err = float(np.abs(mha(zh[:, :1], zh, mp, num_heads=cfg["num_heads"]) - cache["ca"]).max())
    assert err < 1e-12, f"class attention differs from MHA with a single query by {err:.2e}"
    return err


def _check_patches_only_through_kv(rng):
    # The patch tokens reach the class token only through K and V: with W_k = W_v = 0 (and no k/v bias)
    # their gradient vanishes, and the forward never returns or modifies them.
    s = _sample(rng, "small")
    p = {k: v for k, v in s.params.items() if k not in ("attn.k.bias", "attn.v.bias")}
    p["attn.k.weight"] = np.zeros_like(p["attn.k.weight"])
    p["attn.v.weight"] = np.zeros_like(p["attn.v.weight"])
    x = s.inputs["x"]
    x0 = x.copy()
    y, c = class_attention_block_forward(x, s.inputs["x_cls"], p, **s.config)
    g = class_attention_block_backward(rng.standard_normal(y.shape), c)
    err = float(np.abs(g["x"]).max())
    assert err == 0.0 and np.array_equal(x, x0) and y.shape == s.inputs["x_cls"].shape, err
    return err


def _sample_talking(rng, size):
    b, n, c, nh = (2, 3, 4, 2) if size == "tiny" else (2, 6, 6, 3)
    spec, _ = talking_heads_param_spec(c, nh)
    p = {k: rng.uniform(-1, 1, shp) / math.sqrt(shp[0]) if len(shp) == 2 else 0.1 * rng.standard_normal(shp)
         for k, shp in spec.items()}
    return Sample(inputs={"x": rng.standard_normal((b, n, c))}, params=p, config={"num_heads": nh})


def _check_talking_heads_gradcheck(rng):
    from ...testing import gradcheck
    return gradcheck(talking_heads_attention_forward, talking_heads_attention_backward,
                     _sample_talking(rng, "tiny")).max_rel


def _check_talking_heads_reference(rng):
    # Explicit head mixing with einsum; identity mixing (L = W = I, zero biases) is plain MHA.
    from .sdpa import sdpa
    s = _sample_talking(rng, "small")
    p, nh = s.params, s.config["num_heads"]
    x = s.inputs["x"]
    c = x.shape[-1]
    qkv = x @ p["qkv.weight"] + p["qkv.bias"]
    q, k, v = (split_heads(qkv[..., i * c:(i + 1) * c], nh) for i in range(3))
    sc = (c // nh) ** -0.5 * np.einsum("bhid,bhjd->bhij", q, k)
    sl = np.einsum("bhij,hg->bgij", sc, p["proj_l.weight"]) + p["proj_l.bias"][:, None, None]
    e = np.exp(sl - sl.max(-1, keepdims=True))
    pw = np.einsum("bhij,hg->bgij", e / e.sum(-1, keepdims=True), p["proj_w.weight"]) + p["proj_w.bias"][:, None, None]
    want = merge_heads(pw @ v) @ p["proj.weight"] + p["proj.bias"]
    err = float(np.abs(talking_heads_attention(x, p, num_heads=nh) - want).max())
    eye = dict(p, **{"proj_l.weight": np.eye(nh), "proj_l.bias": np.zeros(nh), "proj_w.weight": np.eye(nh),
                     "proj_w.bias": np.zeros(nh)})
    plain = merge_heads(sdpa(q, k, v)) @ p["proj.weight"] + p["proj.bias"]
    err = max(err, float(np.abs(talking_heads_attention(x, eye, num_heads=nh) - plain).max()))
    assert err < 1e-12, f"talking-heads attention differs from its explicit form by {err:.2e}"
    return err


register(
    Mechanism(
        slug="class_attention", family="1-softmax", tier="T2",
        title="CaiT class-attention (CLS-only queries)",
        paper="Touvron, Cord, Sablayrolles, Synnaeve, Jégou, Going deeper with Image Transformers, ICCV 2021, "
              "arXiv 2103.17239",
        forward=class_attention_block_forward, backward=class_attention_block_backward, sample=_sample,
        reference=_reference, docs="softmax/vision-attention.md#class-attention",
        checks={"equals_mha_single_query": _check_equals_mha_single_query,
                "patches_only_through_kv": _check_patches_only_through_kv,
                "talking_heads_gradcheck": _check_talking_heads_gradcheck,
                "talking_heads_reference": _check_talking_heads_reference},
    ),
)
