r"""Relation-DETR: an explicit position-relation bias for the decoder's self-attention.

Paper: Hou, Liu, Zhang, Wei, Chen, Lan, "Relation DETR: Exploring Explicit Position Relation Prior
for Object Detection", ECCV 2024, arXiv 2407.11699. Upstream: xiuqhou/Relation-DETR
``models/bricks/relation_transformer.py`` (``box_rel_encoding``, ``PositionRelationEmbedding``,
``RelationTransformerDecoder.forward``, ``RelationTransformerDecoderLayer``) and
``models/bricks/position_encoding.py`` (``get_sine_pos_embed``)
@b485955c72452788240600da6d0f0b8cc49f33c7.

Forward
-------
Boxes $(c_x, c_y, w, h)$; ``src_boxes`` $s_i$ (the previous decoder layer's boxes, rows) and
``tgt_boxes`` $t_j$ (the current ones, columns; default the same set). The relation of a pair
($\epsilon = 10^{-5}$):

$$e_{ij} = \Big[\log\Big(\frac{|s^x_i - t^x_j|}{s^w_i+\epsilon}+1\Big),\ \log\Big(\frac{|s^y_i - t^y_j|}{s^h_i+\epsilon}+1\Big),\
\log\frac{s^w_i+\epsilon}{t^w_j+\epsilon},\ \log\frac{s^h_i+\epsilon}{t^h_j+\epsilon}\Big].$$

Each of the four scalars gets a sine embedding of $F$ features (``num_pos_feats``, 16 in the
decoder), frequencies $\omega_k = T^{-2k/F}$ ($T$ = ``temperature`` $10^4$, computed in float32 as
upstream's ``get_dim_t``), scale $\sigma = 100$: features
$[\sin(\sigma e\,\omega_0), \cos(\sigma e\,\omega_0), \sin(\sigma e\,\omega_1), \dots]$, concatenated
to $4F$ per pair. A $1\times1$ convolution to the $H$ heads and a ReLU give the bias

$$B_{h,ij} = \mathrm{ReLU}\Big(\sum_f W_{h,f}\,\phi_f(e_{ij}) + b_h\Big)$$

(``position_relation_embedding.pos_proj.0.weight (H, 4F, 1, 1)``, torch layout, and ``.bias``). It is
the float ``attn_mask`` of the decoder's ``nn.MultiheadAttention`` self-attention, i.e. added to the
scaled logits; pairs excluded by an attention mask get $-\infty$ (refattn: ``attn_mask`` boolean,
True = keep). The self-attention reads queries and keys from ``query + query_pos`` and values
from ``query`` (``self_attn.in_proj_weight (C, 3C)`` = torch ``in_proj_weight.T``,
``in_proj_bias``, ``out_proj``); the output is the attention sublayer's (the decoder layer adds the
residual and ``norm2``).

Backward (derivation)
---------------------
The attention VJP (`refattn.attention.softmax.attention_core_backward`) gives $dB$; then
$dz = dB\,[z > 0]$ (ReLU), $dW = \sum dz\,\phi^\top$, $db = \sum dz$, $d\phi = W^\top dz$; the sine
features give $de = \sum_k \sigma\omega_k(\cos(\cdot)\,d\phi^{\sin}_k - \sin(\cdot)\,d\phi^{\cos}_k)$;
and the relation: with $u = |\Delta x|/(s^w+\epsilon)$, $\partial e_0/\partial s^x_i =
\mathrm{sign}(\Delta x)/((u+1)(s^w_i+\epsilon))$ (minus that for $t^x_j$), $\partial e_0/\partial s^w_i =
-u/((u+1)(s^w_i+\epsilon))$, $\partial e_2/\partial s^w_i = 1/(s^w_i+\epsilon)$,
$\partial e_2/\partial t^w_j = -1/(t^w_j+\epsilon)$; $y, h$ likewise. $|\cdot|$ has a kink at
$\Delta = 0$; its derivative is taken as 0 there (PyTorch's convention), exact for the identically
zero diagonal of ``tgt_boxes=None``.

**Upstream detaches the boxes**: ``box_rel_encoding`` and the sine embedding run under
``torch.no_grad()``, so in Relation-DETR no gradient reaches the boxes; only ``pos_proj`` learns.
This function returns the mathematical box gradients too (``src_boxes``, ``tgt_boxes``); discard
them to reproduce upstream training.
"""

from __future__ import annotations

import math

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_broadcastable, check_params, check_positive, compute_dtype
from ...nn.linear import linear_apply, linear_vjp, merge_heads, split_heads
from ...registry import Mechanism, Sample, register
from .core import attention_core_backward, attention_core_forward, check_size

__all__ = [
    "box_relation_encoding",
    "relation_sine_frequencies",
    "position_relation_bias",
    "relation_detr_param_spec",
    "init_relation_detr_params",
    "relation_detr_attention_forward",
    "relation_detr_attention_backward",
    "relation_detr_attention",
]

_POS = "position_relation_embedding.pos_proj.0."


def box_relation_encoding(src_boxes, tgt_boxes, eps: float = 1e-5) -> np.ndarray:
    """``box_rel_encoding``: ``(..., N1, 4)``, ``(..., N2, 4)`` -> ``(..., N1, N2, 4)`` (unvalidated)."""
    xy1, wh1 = src_boxes[..., :2], src_boxes[..., 2:] + eps
    xy2, wh2 = tgt_boxes[..., :2], tgt_boxes[..., 2:] + eps
    dxy = np.abs(xy1[..., :, None, :] - xy2[..., None, :, :])
    return np.concatenate([np.log(dxy / wh1[..., :, None, :] + 1.0),
                           np.log(wh1[..., :, None, :] / wh2[..., None, :, :])], axis=-1)


def _box_relation_vjp(de, src_boxes, tgt_boxes, eps):
    """VJP of `box_relation_encoding`: ``(d src_boxes, d tgt_boxes)``."""
    xy1, wh1 = src_boxes[..., :2], src_boxes[..., 2:] + eps
    xy2, wh2 = tgt_boxes[..., :2], tgt_boxes[..., 2:] + eps
    diff = xy1[..., :, None, :] - xy2[..., None, :, :]
    w1 = wh1[..., :, None, :]
    u = np.abs(diff) / w1
    g0 = de[..., :2] / ((u + 1.0) * w1)                                  # d e / d|diff|
    gd = g0 * np.sign(diff)
    g2 = de[..., 2:]
    dxy1, dxy2 = gd.sum(-2), -gd.sum(-3)
    dwh1 = (-g0 * u).sum(-2) + g2.sum(-2) / wh1
    dwh2 = -g2.sum(-3) / wh2
    return np.concatenate([dxy1, dwh1], -1), np.concatenate([dxy2, dwh2], -1)


def relation_sine_frequencies(num_pos_feats: int, temperature: float = 10000.0) -> np.ndarray:
    """``get_dim_t``: $T^{2k/F}$, $k < F/2$, computed in float32 as upstream (returned as float64)."""
    k = np.arange(num_pos_feats // 2, dtype=np.float32)
    return (np.float32(temperature) ** (k * np.float32(2) / np.float32(num_pos_feats))).astype(np.float64)


def position_relation_bias(src_boxes, tgt_boxes, weight, bias, *, num_pos_feats: int = 16, temperature: float = 10000.0,
                           scale: float = 100.0, eps: float = 1e-5):
    r"""``PositionRelationEmbedding`` (unvalidated): the ReLU bias ``(..., H, N1, N2)`` and a cache.

    ``weight (H, 4F, 1, 1)`` and ``bias (H,)`` are ``pos_proj.0``'s (torch layout)."""
    e = box_relation_encoding(src_boxes, tgt_boxes, eps)                # (..., N1, N2, 4)
    dim_t = relation_sine_frequencies(num_pos_feats, temperature).astype(e.dtype)
    t = e[..., None] * scale / dim_t                                     # (..., 4, F/2)
    feats = np.stack([np.sin(t), np.cos(t)], -1).reshape(e.shape[:-1] + (4 * num_pos_feats,))
    z = np.moveaxis(linear_apply(feats, weight[:, :, 0, 0].T, bias), -1, -3)   # (..., H, N1, N2)
    return np.maximum(z, 0.0), {"t": t, "feats": feats, "z": z, "dim_t": dim_t, "scale": scale, "eps": eps}


def _position_relation_vjp(dbias, cache, src_boxes, tgt_boxes, weight):
    dz = np.moveaxis(dbias * (cache["z"] > 0), -3, -1)                  # (..., N1, N2, H)
    lz = linear_vjp(dz, cache["feats"], weight[:, :, 0, 0].T)
    t = cache["t"]
    dfe = lz["x"].reshape(t.shape + (2,))
    de = np.sum(cache["scale"] / cache["dim_t"] * (np.cos(t) * dfe[..., 0] - np.sin(t) * dfe[..., 1]), -1)
    ds, dt_ = _box_relation_vjp(de, src_boxes, tgt_boxes, cache["eps"])
    return ds, dt_, lz["weight"].T[:, :, None, None], lz["bias"]


def relation_detr_param_spec(dim: int, num_heads: int, *, num_pos_feats: int = 16) -> dict:
    """Names and shapes: ``self_attn.*`` (``nn.MultiheadAttention``, weights ``(in, out)``) and
    ``position_relation_embedding.pos_proj.0.*`` (conv, torch layout)."""
    c = dim
    return {"self_attn.in_proj_weight": (c, 3 * c), "self_attn.in_proj_bias": (3 * c,),
            "self_attn.out_proj.weight": (c, c), "self_attn.out_proj.bias": (c,),
            _POS + "weight": (num_heads, 4 * num_pos_feats, 1, 1), _POS + "bias": (num_heads,)}


def init_relation_detr_params(rng, dim: int, num_heads: int, *, num_pos_feats: int = 16) -> dict:
    """Random parameters (weights $U(\\pm1/\\sqrt{fan_{in}})$, biases $0.1\\mathcal N$)."""
    p = {}
    for k, shp in relation_detr_param_spec(dim, num_heads, num_pos_feats=num_pos_feats).items():
        fan_in = shp[0] if len(shp) == 2 else int(np.prod(shp[1:]))
        p[k] = rng.uniform(-1.0, 1.0, shp) / math.sqrt(fan_in) if len(shp) >= 2 else 0.1 * rng.standard_normal(shp)
    return p


def _boxes(b, name, lead):
    b = as_float(b, name, ndim=3)
    if b.shape[-1] != 4 or b.shape[0] != lead:
        raise ValueError(f"{name} must have shape (B={lead}, N, 4) with (cx, cy, w, h) boxes; got {b.shape}")
    return b


def relation_detr_attention_forward(query, query_pos, src_boxes, tgt_boxes=None, params=None, *, num_heads: int,
                                    num_pos_feats: int = 16, temperature: float = 10000.0, scale: float = 100.0,
                                    eps: float = 1e-5, attn_mask=None, detach_boxes: bool = False):
    r"""Relation-DETR decoder self-attention with the position-relation bias (see the module docstring).

    Parameters
    ----------
    query, query_pos : array (B, N, C)
        Decoder queries and their positional embeddings (q and k read ``query + query_pos``).
    src_boxes : array (B, N, 4)
        $(c_x, c_y, w, h)$ of the previous layer (rows of the bias).
    tgt_boxes : array (B, N, 4), optional
        The current boxes (columns); default ``src_boxes``.
    params : dict
        Keys of `relation_detr_param_spec`.
    num_heads : int
    num_pos_feats, temperature, scale, eps
        Sine embedding width per scalar (16 in the decoder), $T$, $\sigma$, the box epsilon.
    attn_mask : bool array broadcastable to (B, H, N, N), optional
        True = keep (upstream fills masked pairs of the relation with $-\infty$).
    detach_boxes : bool
        True: the boxes are constants, as upstream (``box_rel_encoding`` under ``torch.no_grad()``),
        so the backward returns no box gradients; False (default): it returns them too.

    Returns
    -------
    out, cache
        The attention sublayer's output ``(B, N, C)``.
    """
    query = as_float(query, "query", ndim=3)
    query_pos = as_float(query_pos, "query_pos", ndim=3)
    if query_pos.shape != query.shape:
        raise ValueError(f"query_pos must have query's shape {query.shape}; got {query_pos.shape}")
    b, n, c = query.shape
    src_boxes = _boxes(src_boxes, "src_boxes", b)
    self_rel = tgt_boxes is None
    tgt_boxes = src_boxes if self_rel else _boxes(tgt_boxes, "tgt_boxes", b)
    if src_boxes.shape[1] != n or tgt_boxes.shape[1] != n:
        raise ValueError(f"src_boxes and tgt_boxes need one box per query (N={n}); got {src_boxes.shape}, "
                         f"{tgt_boxes.shape}")
    nh = check_size(num_heads, "num_heads")
    if c % nh:
        raise ValueError(f"channels of query ({c}) must be divisible by num_heads ({nh})")
    f = check_size(num_pos_feats, "num_pos_feats", 2)
    if f % 2:
        raise ValueError(f"num_pos_feats must be even (sin and cos per frequency); got {f}")
    temperature, scale = check_positive(temperature, "temperature"), check_positive(scale, "scale")
    eps = check_positive(eps, "eps")
    for name, bx in (("src_boxes", src_boxes), ("tgt_boxes", tgt_boxes)):
        if np.any(bx[..., 2:] + eps <= 0):
            raise ValueError(f"{name} widths and heights must be > -eps (boxes are (cx, cy, w, h))")
    if attn_mask is not None:
        attn_mask = np.asarray(attn_mask)
        if attn_mask.dtype != np.bool_:
            raise TypeError(f"attn_mask must be a boolean array (True = keep); got dtype {attn_mask.dtype}")
        check_broadcastable("attn_mask", attn_mask.shape, (b, nh, n, n), "the scores (B, H, N, N) of shape")
    p = check_params(params, relation_detr_param_spec(c, nh, num_pos_feats=f), where="relation_detr_attention")
    dt = compute_dtype(query, query_pos, src_boxes, tgt_boxes, *p.values())
    query, query_pos, src_boxes, tgt_boxes = (a.astype(dt, copy=False) for a in (query, query_pos, src_boxes, tgt_boxes))
    p = cast_all(dt, p)
    rel, crel = position_relation_bias(src_boxes, tgt_boxes, p[_POS + "weight"], p[_POS + "bias"], num_pos_feats=f,
                                       temperature=temperature, scale=scale, eps=eps)
    w, bi = p["self_attn.in_proj_weight"], p["self_attn.in_proj_bias"]
    qk_in = query + query_pos
    q = split_heads(linear_apply(qk_in, w[:, :c], bi[:c]), nh)
    k = split_heads(linear_apply(qk_in, w[:, c:2 * c], bi[c:2 * c]), nh)
    v = split_heads(linear_apply(query, w[:, 2 * c:], bi[2 * c:]), nh)
    o, core = attention_core_forward(q, k, v, rel, attn_mask=attn_mask)
    om = merge_heads(o)
    y = linear_apply(om, p["self_attn.out_proj.weight"], p["self_attn.out_proj.bias"])
    return y, {"p": p, "qk_in": qk_in, "query": query, "src": src_boxes, "tgt": tgt_boxes, "self_rel": self_rel,
               "crel": crel, "core": core, "om": om, "nh": nh, "shape": y.shape, "detach_boxes": bool(detach_boxes)}


def relation_detr_attention_backward(dout, cache):
    """Gradient of :func:`relation_detr_attention_forward`: ``query``, ``query_pos``, ``src_boxes``
    (and ``tgt_boxes`` when given; otherwise both box gradients sum into ``src_boxes``; neither with
    ``detach_boxes=True``), every parameter."""
    p, nh = cache["p"], cache["nh"]
    g = as_dout(dout, cache["shape"], cache["query"].dtype)
    c = g.shape[-1]
    grads = {}
    lo = linear_vjp(g, cache["om"], p["self_attn.out_proj.weight"])
    grads["self_attn.out_proj.weight"], grads["self_attn.out_proj.bias"] = lo["weight"], lo["bias"]
    gc = attention_core_backward(split_heads(lo["x"], nh), cache["core"])
    w = p["self_attn.in_proj_weight"]
    lq = linear_vjp(merge_heads(gc["q"]), cache["qk_in"], w[:, :c])
    lk = linear_vjp(merge_heads(gc["k"]), cache["qk_in"], w[:, c:2 * c])
    lv = linear_vjp(merge_heads(gc["v"]), cache["query"], w[:, 2 * c:])
    grads["self_attn.in_proj_weight"] = np.concatenate([lq["weight"], lk["weight"], lv["weight"]], 1)
    grads["self_attn.in_proj_bias"] = np.concatenate([lq["bias"], lk["bias"], lv["bias"]])
    ds, dt_, grads[_POS + "weight"], grads[_POS + "bias"] = _position_relation_vjp(
        gc["bias"], cache["crel"], cache["src"], cache["tgt"], p[_POS + "weight"])
    dqk = lq["x"] + lk["x"]
    out = {"query": dqk + lv["x"], "query_pos": dqk}
    if cache.get("detach_boxes"):
        pass  # upstream's boxes are constants: no box gradients
    elif cache["self_rel"]:
        out["src_boxes"] = ds + dt_
    else:
        out["src_boxes"], out["tgt_boxes"] = ds, dt_
    return {**out, **{k: grads[k] for k in p}}


def relation_detr_attention(query, query_pos, src_boxes, tgt_boxes=None, params=None, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`relation_detr_attention_forward`."""
    return relation_detr_attention_forward(query, query_pos, src_boxes, tgt_boxes, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _random_boxes(rng, b, n):
    # distinct centres at least 0.04 apart, so |dx| stays away from the |.| kink and the log's curvature
    # stays small for finite differences; sizes in (0.3, 0.6) (sigmoid outputs; small ones curve the logs)
    cxy = 0.1 * rng.permutation(n * b * 2).reshape(b, n, 2) + rng.uniform(0.02, 0.08, (b, n, 2))
    return np.concatenate([cxy, rng.uniform(0.3, 0.6, (b, n, 2))], -1)


def _sample(rng, size):
    b, n, c, nh, f = (2, 3, 4, 2, 4) if size == "tiny" else (2, int(rng.integers(4, 8)), 6, 2, 8)
    while True:
        p = init_relation_detr_params(rng, c, nh, num_pos_feats=f)
        src, tgt = _random_boxes(rng, b, n), _random_boxes(rng, b, n)
        z = position_relation_bias(src, tgt, p[_POS + "weight"], p[_POS + "bias"], num_pos_feats=f, scale=3.0)[1]["z"]
        if np.abs(z).min() > 1e-3:                                        # the ReLU away from its kink
            break
    inputs = {"query": rng.standard_normal((b, n, c)), "query_pos": rng.standard_normal((b, n, c)),
              "src_boxes": src, "tgt_boxes": tgt}
    return Sample(inputs=inputs, params=p, config={"num_heads": nh, "num_pos_feats": f, "scale": 3.0})


def _reference(query, query_pos, src_boxes, tgt_boxes=None, params=None, *, num_heads, num_pos_feats=16,
               temperature=10000.0, scale=100.0, eps=1e-5, attn_mask=None):
    # Pair by pair: the four relation scalars, their sine features, the 1x1 conv + ReLU, then attention.
    from .core import naive_attention
    tgt = src_boxes if tgt_boxes is None else tgt_boxes
    b, n, c = query.shape
    dim_t = relation_sine_frequencies(num_pos_feats, temperature)
    w = params[_POS + "weight"][:, :, 0, 0]
    rel = np.zeros((b, num_heads, n, n))
    for bb in range(b):
        for i in range(n):
            for j in range(n):
                s, t = src_boxes[bb, i], tgt[bb, j]
                e = [math.log(abs(s[0] - t[0]) / (s[2] + eps) + 1), math.log(abs(s[1] - t[1]) / (s[3] + eps) + 1),
                     math.log((s[2] + eps) / (t[2] + eps)), math.log((s[3] + eps) / (t[3] + eps))]
                feats = [fn(ek * scale / dk) for ek in e for dk in dim_t for fn in (math.sin, math.cos)]
                rel[bb, :, i, j] = np.maximum(w @ np.array(feats) + params[_POS + "bias"], 0.0)
    wi, bi = params["self_attn.in_proj_weight"], params["self_attn.in_proj_bias"]
    qk = query + query_pos
    q, k, v = (split_heads(a @ wi[:, i * c:(i + 1) * c] + bi[i * c:(i + 1) * c], num_heads)
               for i, a in enumerate((qk, qk, query)))
    o = naive_attention(q, k, v, bias=rel, keep=attn_mask)
    return merge_heads(o) @ params["self_attn.out_proj.weight"] + params["self_attn.out_proj.bias"]


def _check_permutation_equivariance(rng):
    # Relabelling the boxes (the same permutation of src and tgt) permutes the bias's rows and columns.
    s = _sample(rng, "small")
    p, f = s.params, s.config["num_pos_feats"]
    src, tgt = s.inputs["src_boxes"], s.inputs["tgt_boxes"]
    perm = rng.permutation(src.shape[1])
    b0 = position_relation_bias(src, tgt, p[_POS + "weight"], p[_POS + "bias"], num_pos_feats=f)[0]
    b1 = position_relation_bias(src[:, perm], tgt[:, perm], p[_POS + "weight"], p[_POS + "bias"], num_pos_feats=f)[0]
    err = float(np.abs(b1 - b0[:, :, perm][:, :, :, perm]).max())
    # and the layer is permutation-equivariant in the queries with their boxes
    y = relation_detr_attention(**s.inputs, params=p, **s.config)
    yp = relation_detr_attention(**{k: v[:, perm] for k, v in s.inputs.items()}, params=p, **s.config)
    err = max(err, float(np.abs(yp - y[:, perm]).max()))
    assert err < 1e-12, f"the relation bias is not permutation-equivariant (err {err:.2e})"
    return err


def _check_relation_encoding(rng):
    # Same-size boxes give zero size terms; a box against itself gives all zeros; a box twice as wide gives log 2.
    bx = np.array([[[0.3, 0.4, 0.2, 0.1], [0.6, 0.1, 0.4, 0.1]]])
    e = box_relation_encoding(bx, bx, eps=0.0)
    err = max(float(np.abs(np.diagonal(e, axis1=1, axis2=2)).max()), abs(float(e[0, 1, 0, 2]) - math.log(2.0)),
              abs(float(e[0, 0, 1, 0]) - math.log(0.3 / 0.2 + 1.0)), abs(float(e[0, 0, 1, 3])))
    assert err < 1e-15, err
    return err


def _check_self_relation_gradient(rng):
    # tgt_boxes=None: the box gradient is the sum of the row and column paths, and the identically zero
    # diagonal |x_i - x_i| contributes nothing (central differences through the kink agree).
    from ...testing import gradcheck
    s = _sample(rng, "tiny")
    inputs = {k: v for k, v in s.inputs.items() if k != "tgt_boxes"}
    return gradcheck(relation_detr_attention_forward, relation_detr_attention_backward,
                     Sample(inputs=inputs, params=s.params, config=s.config)).max_rel


register(
    Mechanism(
        slug="relation_detr_position_bias", family="1-softmax", tier="T2",
        title="Position-relation attention bias (Relation-DETR)",
        paper="Hou, Liu, Zhang, Wei, Chen, Lan, Relation DETR: Exploring Explicit Position Relation Prior for "
              "Object Detection, ECCV 2024, arXiv 2407.11699",
        forward=relation_detr_attention_forward, backward=relation_detr_attention_backward, sample=_sample,
        reference=_reference, docs="softmax/vision-attention.md#relation-detr-position-bias",
        checks={"permutation_equivariance": _check_permutation_equivariance,
                "relation_encoding": _check_relation_encoding,
                "self_relation_gradient": _check_self_relation_gradient},
    ),
)
