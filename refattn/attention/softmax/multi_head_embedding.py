r"""Multi-head embedding attention (MHE): one shared query/key/value projection, heads made
different by per-head embeddings, added (MHE-ADD) or multiplied (MHE-MUL).

With shared projections to one head width $d$ and embeddings $e_h^Q, e_h^K, e_h^V\in\mathbb R^d$
($3Hd$ extra parameters instead of $H$ separate projections):

$$\bar Q = XW_Q + b_Q,\ \bar K = CW_K + b_K,\ \bar V = CW_V + b_V\in\mathbb R^{\cdot\times d},\qquad
Q_h = \bar Q \oplus \mathbf 1 e_h^{Q\top},\ K_h = \bar K\oplus\mathbf 1e_h^{K\top},\ V_h = \bar V\oplus\mathbf 1e_h^{V\top},$$
$$\mathrm{head}_h = \mathrm{sdpa}(Q_h, K_h, V_h),\qquad Y = [\mathrm{head}_1\|\dots\|\mathrm{head}_H]\,W_O + b_O,$$

$\oplus = +$ (``mode="add"``) or $\odot$ (``"mul"``). Exact identities: in MHE-ADD the key
embedding adds $q_{h,i}\cdot e_h^K$ to every score of row $i$ — a constant per row — so it has
**no effect and a zero gradient** (the key-bias redundancy of SDPA); the value embedding adds
$e_h^V$ to every output row of head $h$ (rows of $P$ sum to one), i.e. a constant
$\sum_h e_h^V W_O^{(h)}$ to $Y$. MHE-MUL is MHA with per-head projections $W_Q\,\mathrm{diag}(e_h^Q)$
(and likewise for K, V), which a check verifies.

Backward
--------
The attention core gives $dQ_h, dK_h, dV_h$ per head. ADD: $de^Q_h = \sum_{b,i} dQ_{h,i}$,
$d\bar Q = \sum_h dQ_h$; MUL: $de^Q_h = \sum_{b,i} dQ_{h,i}\odot\bar Q_i$,
$d\bar Q = \sum_h dQ_h\odot e^Q_h$ (same for K, V); then `linear_vjp` for the shared projections.

Sources
-------
Paper: Xue & Aletras, "Pit One Against Many: Leveraging Attention-head Embeddings for
Parameter-efficient Multi-head Attention", Findings of EMNLP 2023 (arXiv 2310.07911). No code was
found. **Reconstruction:** the parameter names (``q_proj``/``k_proj``/``v_proj``/``out_proj`` as in
`mha_forward`, embeddings ``q_head_embed``/``k_head_embed``/``v_head_embed`` of shape ``(H, d)``),
that the embeddings act after the projection's bias, and that the output projection maps the
concatenated heads as in MHA.
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_choice, check_param_keys, check_params, compute_dtype
from ...nn.linear import linear_apply, linear_vjp, merge_heads, split_heads
from ...registry import Mechanism, Sample, register
from .core import attention_core_backward, attention_core_forward, check_size

__all__ = ["MHE_MODES", "mhe_attention_forward", "mhe_attention_backward", "mhe_attention", "init_mhe_params"]

MHE_MODES = ("add", "mul")
_PROJ = ("q_proj", "k_proj", "v_proj", "out_proj")
_EMB = ("q_head_embed", "k_head_embed", "v_head_embed")


def _validate(x, src, params, h):
    check_param_keys(params, list(_PROJ) + list(_EMB), [p + "_bias" for p in _PROJ],
                     where="multi_head_embedding_attention (weights (in, out); PyTorch: weight.T)")
    wq = as_float(params["q_proj"], "q_proj", ndim=2)
    wo = as_float(params["out_proj"], "out_proj", ndim=2)
    d, co = wq.shape[1], wo.shape[1]
    spec = {"q_proj": (x.shape[-1], d), "k_proj": (src.shape[-1], d), "v_proj": (src.shape[-1], d),
            "out_proj": (h * d, co), "q_proj_bias": (d,), "k_proj_bias": (d,), "v_proj_bias": (d,),
            "out_proj_bias": (co,)}
    spec.update({e: (h, d) for e in _EMB})
    return check_params(params, spec, optional=[p + "_bias" for p in _PROJ], where="multi_head_embedding_attention"), d


def _heads(t, e, h, mode):
    t = np.broadcast_to(t[..., None, :, :], t.shape[:-2] + (h,) + t.shape[-2:])
    return t + e[:, None, :] if mode == "add" else t * e[:, None, :]


def mhe_attention_forward(x, context=None, params=None, *, num_heads: int, mode: str = "add", attn_mask=None,
                          is_causal: bool = False, causal_alignment: str = "top_left", scale=None):
    r"""Multi-head embedding attention: shared projections, per-head embeddings (ADD or MUL).

    Parameters
    ----------
    x : array (B.., N, C)
    context : array (B.., M, Cc), optional
        Keys/values source (default ``x``).
    params : dict
        ``"q_proj" (C, d)``, ``"k_proj" (Cc, d)``, ``"v_proj" (Cc, d)``, ``"out_proj" (H*d, C_out)``,
        optional ``"<name>_bias"``; ``"q_head_embed"``, ``"k_head_embed"``, ``"v_head_embed"`` ``(H, d)``.
    num_heads : int
    mode : {"add", "mul"}
        MHE-ADD or MHE-MUL.
    attn_mask, is_causal, causal_alignment, scale
        As :func:`sdpa_forward` (default scale $d^{-1/2}$).

    Returns
    -------
    out, cache
        ``out (B.., N, C_out)``.
    """
    x = as_float(x, "x", min_ndim=2)
    h = check_size(num_heads, "num_heads")
    check_choice(mode, "mode", MHE_MODES)
    if context is not None:
        context = as_float(context, "context", ndim=x.ndim)
        if context.shape[:-2] != x.shape[:-2]:
            raise ValueError(f"context must have x's leading axes {x.shape[:-2]}; got context {context.shape}")
    if params is None:
        raise TypeError("params is required: shared q_proj/k_proj/v_proj, out_proj and the three head embeddings")
    src = x if context is None else context
    p, d = _validate(x, src, params, h)
    dt = compute_dtype(x, src, *p.values())
    x, src, p = x.astype(dt, copy=False), src.astype(dt, copy=False), cast_all(dt, p)
    shared = {n: linear_apply(x if n == "q_proj" else src, p[n], p.get(n + "_bias")) for n in _PROJ[:3]}
    q, k, v = (_heads(shared[n], p[e], h, mode) for n, e in zip(_PROJ[:3], _EMB))
    o, core = attention_core_forward(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                                     causal_alignment=causal_alignment, scale=scale)
    oc = merge_heads(o)
    y = linear_apply(oc, p["out_proj"], p.get("out_proj_bias"))
    cache = {"x": x, "src": src, "self": context is None, "p": p, "shared": shared, "mode": mode, "core": core,
             "oc": oc, "h": h, "d": d, "y_shape": y.shape}
    return y, cache


def mhe_attention_backward(dout, cache):
    """Gradient of :func:`mhe_attention_forward`: ``x`` (and ``context``), the shared projections,
    the output projection and the three head embeddings."""
    p, x, src, mode = cache["p"], cache["x"], cache["src"], cache["mode"]
    g = as_dout(dout, cache["y_shape"], x.dtype)
    go = linear_vjp(g, cache["oc"], p["out_proj"], "out_proj_bias" in p)
    grads = {"out_proj": go["weight"]}
    if "out_proj_bias" in p:
        grads["out_proj_bias"] = go["bias"]
    gc = attention_core_backward(split_heads(go["x"], cache["h"], cache["d"]), cache["core"])
    dx = np.zeros_like(x)
    dsrc = np.zeros_like(src)
    for name, emb, key in zip(_PROJ[:3], _EMB, ("q", "k", "v")):
        dh = gc[key]                                             # (B.., H, L, d)
        axes = tuple(range(dh.ndim - 3)) + (dh.ndim - 2,)
        if mode == "add":
            grads[emb] = dh.sum(axis=axes)
            dshared = dh.sum(axis=-3)
        else:
            grads[emb] = (dh * cache["shared"][name][..., None, :, :]).sum(axis=axes)
            dshared = np.einsum("...hld,hd->...ld", dh, p[emb])
        gl = linear_vjp(dshared, x if name == "q_proj" else src, p[name], name + "_bias" in p)
        grads[name] = gl["weight"]
        if name + "_bias" in p:
            grads[name + "_bias"] = gl["bias"]
        if name == "q_proj":
            dx = dx + gl["x"]
        else:
            dsrc = dsrc + gl["x"]
    if cache["self"]:
        grads["x"] = dx + dsrc
    else:
        grads["x"], grads["context"] = dx, dsrc
    return grads


def mhe_attention(x, context=None, params=None, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`mhe_attention_forward`."""
    return mhe_attention_forward(x, context, params, **config)[0]


def init_mhe_params(rng, c: int, num_heads: int, head_dim: int, *, mode: str = "add", c_context=None, c_out=None,
                    bias: bool = True) -> dict:
    """Random MHE parameters: xavier-like shared projections; embeddings around 0 (ADD) or 1 (MUL)."""
    cc = c if c_context is None else c_context
    co = c if c_out is None else c_out
    p = {}
    for n, (i, o) in {"q_proj": (c, head_dim), "k_proj": (cc, head_dim), "v_proj": (cc, head_dim),
                      "out_proj": (num_heads * head_dim, co)}.items():
        p[n] = rng.uniform(-1, 1, (i, o)) * np.sqrt(6.0 / (i + o))
        if bias:
            p[n + "_bias"] = 0.1 * rng.standard_normal(o)
    for e in _EMB:
        p[e] = (0.0 if mode == "add" else 1.0) + 0.5 * rng.standard_normal((num_heads, head_dim))
    return p


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size):
    if size == "tiny":
        n, m, c, h, d = int(rng.integers(2, 4)), int(rng.integers(2, 4)), 3, 2, 2
    else:
        n, m, c, h, d = int(rng.integers(4, 8)), int(rng.integers(4, 8)), 6, 3, 3
    mode = str(rng.choice(MHE_MODES))
    cross = bool(rng.random() < 0.4)
    inputs = {"x": rng.standard_normal((2, n, c))}
    if cross:
        inputs["context"] = rng.standard_normal((2, m, c + 1))
    params = init_mhe_params(rng, c, h, d, mode=mode, c_context=c + 1 if cross else c, bias=bool(rng.random() < 0.5))
    cfg = {"num_heads": h, "mode": mode}
    if not cross and rng.random() < 0.5:
        cfg["is_causal"] = True
    return Sample(inputs=inputs, params=params, config=cfg)


def _to_mha(p, h, mode):
    # MHE as an MHA: per-head projections W diag(e_h) (MUL) or W with the embedding folded into the bias (ADD)
    out = {"out_proj": p["out_proj"]}
    if "out_proj_bias" in p:
        out["out_proj_bias"] = p["out_proj_bias"]
    for n, e in zip(_PROJ[:3], _EMB):
        w, b = p[n], p.get(n + "_bias", np.zeros(p[n].shape[1]))
        if mode == "mul":
            out[n] = np.concatenate([w * p[e][i] for i in range(h)], axis=1)
            out[n + "_bias"] = np.concatenate([b * p[e][i] for i in range(h)])
        else:
            out[n] = np.concatenate([w] * h, axis=1)
            out[n + "_bias"] = np.concatenate([b + p[e][i] for i in range(h)])
    return out


def _reference(x, context=None, params=None, *, num_heads, mode="add", attn_mask=None, is_causal=False,
               causal_alignment="top_left", scale=None):
    from .mha import mha

    return mha(x, context, _to_mha(params, num_heads, mode), num_heads=num_heads, attn_mask=attn_mask,
               is_causal=is_causal, causal_alignment=causal_alignment, scale=scale)


def _check_add_key_embedding_no_effect(rng):
    x = rng.standard_normal((2, 5, 4))
    p = init_mhe_params(rng, 4, 3, 2, mode="add")
    y, c = mhe_attention_forward(x, params=p, num_heads=3, mode="add", is_causal=True)
    p2 = dict(p, k_head_embed=p["k_head_embed"] + 5.0 * rng.standard_normal(p["k_head_embed"].shape))
    e1 = float(np.abs(mhe_attention(x, params=p2, num_heads=3, mode="add", is_causal=True) - y).max())
    e2 = float(np.abs(mhe_attention_backward(rng.standard_normal(y.shape), c)["k_head_embed"]).max())
    assert e1 < 1e-12 and e2 < 1e-12, (e1, e2)
    return max(e1, e2)


def _check_add_value_embedding_shift(rng):
    # e^V_h shifts head h's output rows by e^V_h: Y changes by sum_h e^V_h W_O^(h), the same for every row
    x = rng.standard_normal((2, 5, 4))
    p = init_mhe_params(rng, 4, 2, 3, mode="add")
    delta = rng.standard_normal((2, 3))
    y1 = mhe_attention(x, params=p, num_heads=2, mode="add")
    y2 = mhe_attention(x, params=dict(p, v_head_embed=p["v_head_embed"] + delta), num_heads=2, mode="add")
    err = float(np.abs(y2 - y1 - delta.reshape(-1) @ p["out_proj"]).max())
    assert err < 1e-12, err
    return err


def _check_one_head_mul_ones_is_attention(rng):
    from .mha import mha

    x = rng.standard_normal((2, 4, 5))
    p = init_mhe_params(rng, 5, 1, 3, mode="mul")
    for e in _EMB:
        p[e] = np.ones((1, 3))
    pm = {n: p[n] for n in _PROJ}
    pm.update({n + "_bias": p[n + "_bias"] for n in _PROJ})
    err = float(np.abs(mhe_attention(x, params=p, num_heads=1, mode="mul") - mha(x, params=pm, num_heads=1)).max())
    assert err < 1e-12, err
    return err


register(
    Mechanism(
        slug="multi_head_embedding_attention", family="1-softmax", tier="T2",
        title="MHE: shared projections plus per-head embeddings (MHE-ADD / MHE-MUL)",
        paper="Xue & Aletras, Pit One Against Many: Leveraging Attention-head Embeddings for Parameter-efficient "
              "Multi-head Attention, Findings of EMNLP 2023, arXiv 2310.07911",
        forward=mhe_attention_forward, backward=mhe_attention_backward, sample=_sample, reference=_reference,
        docs="softmax/qkv-variants.md#multi-head-embedding-attention",
        checks={"add_key_embedding_no_effect": _check_add_key_embedding_no_effect,
                "add_value_embedding_shift": _check_add_value_embedding_shift,
                "one_head_mul_ones_is_attention": _check_one_head_mul_ones_is_attention},
    ),
)
