r"""The two-branch low-rank differential layer shared by DiffLoRA and Shared DIFF.

Both mechanisms give the two attention terms of DIFF their own low-rank updates of one base
projection,

$$Q_a = xW_q + s\,(xA_{q,a})B_{q,a},\qquad K_a = xW_k + s\,(xA_{k,a})B_{k,a},\qquad V = xW_v,$$

then run V1's head computation on $(Q_1, K_1, Q_2, K_2, V)$ (``refattn.attention.differential.layer``,
`diff_heads_forward`) and $Y = ZW_o$. `two_branch_forward` / `two_branch_backward` implement it
once with the options both need (positive and negative term, fixed or re-parameterised λ, output
factor `TWO_BRANCH_RESCALES`); ``difflora.py`` and ``shared_diff.py`` hold the mechanisms.

Backward: V1's head chain and GQA scatter, then per branch $dW_q \mathrel{+}= x^\top dQ_a$,
$dB_{qa} = s\,(xA_{qa})^\top dQ_a$, $dA_{qa} = s\,x^\top dQ_aB_{qa}^\top$,
$dx \mathrel{+}= dQ_a W_q^\top + s\,dQ_aB_{qa}^\top A_{qa}^\top$ (same for $K$; `lora_backward`).
"""

from __future__ import annotations

import numpy as np

from ..._checks import (
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
from ...nn.linear import linear_prefixed_vjp, merge_heads, split_heads
from .core import gather_heads, kv_head_index, scatter_heads
from .layer import (
    V1_LAMBDA_KEYS,
    diff_heads_backward,
    diff_heads_forward,
    lambda_reparam_backward,
    lambda_reparam_forward,
    validate_layer_config,
)

__all__ = [
    "TWO_BRANCH_RESCALES",
    "lora_apply",
    "lora_backward",
    "two_branch_forward",
    "two_branch_backward",
]


TWO_BRANCH_RESCALES = ("lambda_init", "lambda_with_norm", "none")


def lora_apply(x, A, B, s):
    r"""$y = s\,(xA)B$; returns ``(y, xA)`` (``xA`` is saved for `lora_backward`)."""
    xa = x @ A
    return s * (xa @ B), xa


def lora_backward(dy, x, xa, A, B, s):
    r"""$y = s\,(xA)B$: $dB = s\,(xA)^\top dy$, $dA = s\,x^\top(dy\,B^\top)$, $dx = s\,dy\,B^\top A^\top$."""
    r = A.shape[1]
    dyb = dy @ B.T
    dB = s * (xa.reshape(-1, r).T @ dy.reshape(-1, B.shape[1]))
    dA = s * (x.reshape(-1, A.shape[0]).T @ dyb.reshape(-1, r))
    return dA, dB, s * (dyb @ A.T)


def two_branch_forward(x, params, *, where, names, num_heads, num_kv_heads, negative_term, lora_scale,
                       lambda_mode, lambda_init_value, attn_mask, is_causal, causal_alignment, rel_pos,
                       rope_interleaved, scale, subln, subln_affine, subln_eps, rescale,
                       positive_term="base_lora"):
    r"""$Q_a = xW_q + s\,(xA_{q,a})B_{q,a}$ (and $K_a$), $V = xW_v$; the V1 head computation on
    $(Q_1, K_1, Q_2, K_2, V)$; $Y = ZW_o$. Branch 1 per ``positive_term``, branch 2 per
    ``negative_term``; ``rescale`` in :data:`TWO_BRANCH_RESCALES` (``"lambda_with_norm"``: $\times(1-\lambda)$
    after the norm, none without a norm)."""
    H = check_int(num_heads, "num_heads", minimum=1)
    Hkv = H if num_kv_heads is None else check_int(num_kv_heads, "num_kv_heads", minimum=1)
    if H % Hkv:
        raise ValueError(f"num_heads ({H}) must be a multiple of num_kv_heads ({Hkv})")
    check_choice(negative_term, "negative_term", ("base_lora", "lora_only", "full"))
    check_choice(positive_term, "positive_term", ("base_lora", "base"))
    check_choice(lambda_mode, "lambda_mode", ("fixed", "reparam"))
    check_choice(rescale, "rescale", TWO_BRANCH_RESCALES)
    s = check_positive(lora_scale, "lora_scale")
    if not isinstance(subln_affine, (bool, np.bool_)):
        raise TypeError("subln_affine must be a bool")
    x = as_float(x, "x", min_ndim=2)
    C = x.shape[-1]
    nq, nk, nv, no = names["q"], names["k"], names["v"], names["o"]
    branches = tuple(a for a, on in (("1", positive_term == "base_lora"), ("2", negative_term != "full")) if on)
    need = (f"{nq}.weight", f"{nv}.weight", f"{no}.weight")
    if not isinstance(params, dict) or any(k not in params for k in need):
        raise ValueError(f"params must be a dict containing {list(need)} and the other projections of {where}")
    check_weight_in(params, f"{nq}.weight", C, input_name="x")
    check_weight_in(params, f"{nv}.weight", C, input_name="x")
    qw, vw, ow = (np.shape(params[k]) for k in need)
    if len(qw) != 2 or qw[1] % H:
        raise ValueError(f"{nq}.weight must have shape (C, num_heads * d) with num_heads = {H}; got {qw}")
    if len(vw) != 2 or vw[1] % Hkv:
        raise ValueError(f"{nv}.weight must have shape (C, num_kv_heads * dv) with num_kv_heads = {Hkv}; got {vw}")
    if len(ow) != 2:
        raise ValueError(f"{no}.weight must be (num_heads * dv, C_out); got {ow}")
    r = None
    if branches:
        akey = f"{nq}.lora_A{branches[0]}"
        if akey not in params or len(np.shape(params[akey])) != 2:
            raise ValueError(f"params must contain {akey} of shape (C, rank)")
        r = np.shape(params[akey])[1]
    d, dv = qw[1] // H, vw[1] // Hkv
    check_weight_in(params, f"{no}.weight", H * dv, input_name=f"the merged heads ({H} x {dv})")
    req = {f"{nq}.weight": (C, H * d), f"{nk}.weight": (C, Hkv * d), f"{nv}.weight": (C, Hkv * dv),
           f"{no}.weight": (H * dv, ow[1])}
    for t, w in ((nq, H * d), (nk, Hkv * d)):
        for a in branches:
            req[f"{t}.lora_A{a}"] = (C, r)
            req[f"{t}.lora_B{a}"] = (r, w)
    if negative_term == "full":
        req[f"{names['q2']}.weight"] = (C, H * d)
        req[f"{names['k2']}.weight"] = (C, Hkv * d)
    if lambda_mode == "reparam":
        for key in V1_LAMBDA_KEYS:
            req[key] = (d,)
    if subln != "none" and subln_affine:
        req["subln.weight"] = (dv,)
        if subln == "layer":
            req["subln.bias"] = (dv,)
    P = check_params(params, req, where=where)
    dt = compute_dtype(x, *P.values())
    x = x.astype(dt, copy=False)
    P = cast_all(dt, P)
    n = x.shape[-2]
    mask, cos, sin, sc, eps = validate_layer_config(x, n, is_causal, attn_mask, causal_alignment, rel_pos,
                                            rope_interleaved, scale, d, subln, subln_eps, H, dt)
    proj, saved = {}, {}
    for t, tag, heads in ((nq, "q", H), (nk, "k", Hkv)):
        base = x @ P[f"{t}.weight"]
        lora = {}
        for a in branches:
            lora[a], saved[(t, a)] = lora_apply(x, P[f"{t}.lora_A{a}"], P[f"{t}.lora_B{a}"], s)
        proj[tag + "1"] = base + lora["1"] if "1" in lora else base
        if negative_term == "full":
            proj[tag + "2"] = x @ P[f"{names[tag + '2']}.weight"]
        elif negative_term == "lora_only":
            proj[tag + "2"] = lora["2"]
        else:
            proj[tag + "2"] = base + lora["2"]
        for a in ("1", "2"):
            proj[tag + a] = split_heads(proj[tag + a], heads, d)
    v = split_heads(x @ P[f"{nv}.weight"], Hkv, dv)
    idx = kv_head_index(H, Hkv, "contiguous")
    if lambda_mode == "reparam":
        lam, lam_saved = lambda_reparam_forward(*(P[key] for key in V1_LAMBDA_KEYS), lambda_init_value)
    else:
        lam, lam_saved = np.asarray(lambda_init_value, dtype=dt), None
    post = 1.0  # the factor applied after diff_heads_forward: (1 - lambda) for "lambda_with_norm" with a norm
    if rescale == "lambda_init":
        fixed = 1.0 - lambda_init_value
    else:
        fixed = 1.0
        if rescale == "lambda_with_norm" and subln != "none":
            post = 1.0 - lam
    o, hc = diff_heads_forward(proj["q1"], gather_heads(proj["k1"], idx), proj["q2"], gather_heads(proj["k2"], idx),
                       gather_heads(v, idx), lam, mask=mask, scale=sc, cos=cos, sin=sin,
                       interleaved=bool(rope_interleaved), subln=subln, norm_w=P.get("subln.weight"),
                       norm_b=P.get("subln.bias"), eps=eps, rescale=fixed)
    o_pre = o
    o = o * post
    z = merge_heads(o)
    out = z @ P[f"{no}.weight"]
    cache = {"x": x, "P": P, "names": names, "hc": hc, "z": z, "saved": saved, "s": s, "idx": idx,
             "H": H, "Hkv": Hkv, "dv": dv, "negative_term": negative_term, "lam_saved": lam_saved,
             "post": post, "o_pre": o_pre if rescale == "lambda_with_norm" and subln != "none" else None,
             "out_shape": out.shape}
    return out, cache


def two_branch_backward(dout, cache):
    """Gradient of `two_branch_forward`: ``x`` and every params key (derivation in the module
    docstring)."""
    x, P, names, s = cache["x"], cache["P"], cache["names"], cache["s"]
    nq, nk, nv, no = names["q"], names["k"], names["v"], names["o"]
    dout = as_dout(dout, cache["out_shape"], x.dtype)
    grads: dict = {}
    dz = linear_prefixed_vjp(grads, P, no, dout, cache["z"])
    do = split_heads(dz, cache["H"], cache["dv"])
    dlam_post = 0.0
    if cache["o_pre"] is not None:  # o = (1 - lam) * o_pre
        dlam_post = -float(np.sum(do * cache["o_pre"]))
        do = do * cache["post"]
    dh = diff_heads_backward(do, cache["hc"], P.get("subln.weight"))
    if "subln.weight" in P:
        grads["subln.weight"] = dh["norm_weight"]
    if "subln.bias" in P:
        grads["subln.bias"] = dh["norm_bias"]
    if cache["lam_saved"] is not None:
        grads.update(lambda_reparam_backward(np.sum(dh["lam"]) + dlam_post, *(P[key] for key in V1_LAMBDA_KEYS),
                                 cache["lam_saved"]))
    idx, Hkv, mode = cache["idx"], cache["Hkv"], cache["negative_term"]
    d_in = {"q1": dh["q1"], "q2": dh["q2"], "k1": scatter_heads(dh["k1"], idx, Hkv),
            "k2": scatter_heads(dh["k2"], idx, Hkv)}
    dx = linear_prefixed_vjp(grads, P, nv, merge_heads(scatter_heads(dh["v"], idx, Hkv)), x)
    for t, tag in ((nq, "q"), (nk, "k")):
        dy1, dy2 = merge_heads(d_in[tag + "1"]), merge_heads(d_in[tag + "2"])
        dbase = dy1 + dy2 if mode == "base_lora" else dy1
        dx = dx + linear_prefixed_vjp(grads, P, t, dbase, x)
        for a, dy in (("1", dy1), ("2", dy2)):
            if (t, a) in cache["saved"]:
                dA, dB, dxa = lora_backward(dy, x, cache["saved"][(t, a)], P[f"{t}.lora_A{a}"], P[f"{t}.lora_B{a}"], s)
                grads[f"{t}.lora_A{a}"], grads[f"{t}.lora_B{a}"] = dA, dB
                dx = dx + dxa
        if mode == "full":
            dx = dx + linear_prefixed_vjp(grads, P, names[tag + "2"], dy2, x)
    grads["x"] = dx
    return grads
