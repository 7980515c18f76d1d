r"""Layer pieces shared by DIFF Transformer V1 and the layers built on it.

DIFF V1 (``v1.py``), DiffCLIP (``diffclip.py``), GDA (``gda.py``) and DINT (``dint.py``) are one
computation with different head layouts and keywords; DiffLoRA and Shared DIFF (``lora.py``) reuse
its head chain, V2 and DEX its RoPE. That computation lives here, once:

* the $\lambda_{init}$ depth schedule `lambda_init_fn` (three layer-index conventions) and
  `resolve_lambda_init` (a depth or a fixed value);
* V1's λ re-parameterisation
  $\lambda = e^{\lambda_{q1}\cdot\lambda_{k1}} - e^{\lambda_{q2}\cdot\lambda_{k2}} + \lambda_{init}$,
  `lambda_reparam_forward` / `lambda_reparam_backward` (parameter keys `V1_LAMBDA_KEYS`);
* the per-head norm (``subln``: RMSNorm, unilm ``rms_norm.py``, or LayerNorm), `subln_forward` /
  `subln_backward`;
* RoPE on the query/key half-heads: `rope_tables`, `rope_apply` (its VJP is the rotation by
  $-\theta$), `validate_rel_pos`;
* one layer's head computation RoPE → core → norm → $\times$ rescale, `diff_heads_forward` /
  `diff_heads_backward`, and the validation of the layer keywords, `validate_layer_config`;
* the half-head / GQA pairing of V1, `v1_pairing_index`;
* the whole layer, projections → gather (pairing/GQA) → heads → merge → output projection,
  `v1_generic_forward` / `v1_generic_backward`, and V1's keyword handling around it,
  `v1_layer_forward` (with DINT's optional integral term).

The backward of the layer chains these VJPs in reverse: $dZ = GW_o^\top$, $dW_o = Z^\top G$;
split heads; $\times$ rescale; norm VJP (`subln_backward`); the core VJP
(``refattn.attention.differential.core``) with $d\lambda$ summed over batch, heads, positions and
channels; the λ re-parameterisation VJP (`lambda_reparam_backward`); RoPE VJP (rotation by
$-\theta$); the adjoint of the pairing/GQA gather (`scatter_heads`: a half-head's gradient is the
sum over every differential head that used it); $dX = \sum_p dY_pW_p^\top$ over the three
projections.
"""

from __future__ import annotations

import math

import numpy as np

from ..._checks import (
    as_bool_or_float_mask,
    as_dout,
    as_float,
    cast_all,
    check_broadcastable,
    check_choice,
    check_int,
    check_params,
    check_positive,
    check_weight_in,
    compute_dtype,
)
from ...nn.linear import linear_prefixed, linear_prefixed_vjp, merge_heads, split_heads
from ...nn.norms import normalize_backward, normalize_forward
from ...nn.rope import apply_rope, rope_angles
from .core import combine_mask, expanded_core_backward, expanded_core_forward, gather_heads, scatter_heads

__all__ = [
    "lambda_init_fn",
    "resolve_lambda_init",
    "V1_LAMBDA_KEYS",
    "lambda_reparam_forward",
    "lambda_reparam_backward",
    "subln_forward",
    "subln_backward",
    "rope_tables",
    "rope_apply",
    "validate_rel_pos",
    "diff_heads_forward",
    "diff_heads_backward",
    "validate_layer_config",
    "v1_pairing_index",
    "v1_generic_forward",
    "v1_generic_backward",
    "v1_layer_forward",
]


# --------------------------------------------------------------------------------------------
# λ schedule and re-parameterisation, per-head norm, RoPE


def lambda_init_fn(depth, convention: str = "unilm") -> float:
    r"""The depth schedule $\lambda_{init} = 0.8 - 0.6\,e^{-0.3\,\ell}$ with an explicit layer index.

    Parameters
    ----------
    depth : int
        The layer index as the chosen convention counts it.
    convention : {"unilm", "paper", "motif"}
        * ``"unilm"`` (default; unilm ``lambda_init_fn(depth)``, timm, HF ``DiffLlama``):
          ``depth`` is the 0-based layer index, $\ell = \text{depth}$; the first layer has
          $\lambda_{init} = 0.2$.
        * ``"paper"``: ``depth`` is the paper's 1-based $l$, $\ell = l - 1$ (same values as
          ``"unilm"`` shifted by one index).
        * ``"motif"``: vLLM ``vllm/model_executor/models/motif.py`` (``MotifAttention.lambda_init_fn``
          returns ``0.8 - 0.6 * exp(-0.3 * (depth - 1))`` and is called with the 0-based
          ``extract_layer_index(prefix)``), $\ell = \text{depth} - 1$, so layer 0 gets
          $0.8 - 0.6e^{0.3}\approx -0.01$.
    """
    depth = check_int(depth, "depth")
    check_choice(convention, "lambda_init_convention", ("unilm", "paper", "motif"))
    if convention == "paper" and depth < 1:
        raise ValueError(f"depth must be >= 1 for the 1-based 'paper' convention; got {depth}")
    if convention != "paper" and depth < 0:
        raise ValueError(f"depth must be >= 0 for the 0-based '{convention}' convention; got {depth}")
    ell = depth if convention == "unilm" else depth - 1
    return 0.8 - 0.6 * math.exp(-0.3 * ell)


def resolve_lambda_init(depth, lambda_init, convention):
    r"""$\lambda_{init}$ from a fixed ``lambda_init`` (a finite real) or from ``depth`` with
    `lambda_init_fn` and ``convention``; passing both or neither raises."""
    if lambda_init is not None:
        if depth is not None:
            raise ValueError("pass either depth (the layer index) or lambda_init (a fixed value), not both")
        if isinstance(lambda_init, (bool, np.bool_)) or not isinstance(lambda_init, (int, float, np.number)):
            raise TypeError(f"lambda_init must be a real number; got {type(lambda_init).__name__}")
        if not np.isfinite(lambda_init):
            raise ValueError(f"lambda_init must be finite; got {lambda_init}")
        return float(lambda_init)
    if depth is None:
        raise ValueError("pass depth (the layer index, see lambda_init_convention) or lambda_init")
    return lambda_init_fn(depth, convention)


def subln_forward(x, weight, bias, eps, center=False):
    r"""Per-head norm over the last axis: RMSNorm $y = x\,r\,w$ with $r = (\mathrm{mean}(x^2) + \epsilon)^{-1/2}$
    (unilm ``rms_norm.py``; ``center=False``) or LayerNorm $y = (x-\mu)\,r\,w + b$ (``center=True``),
    both on :func:`refattn.nn.norms.normalize_forward`."""
    xhat, stats = normalize_forward(x, (x.ndim - 1,), eps, center=center)
    y = xhat * weight if weight is not None else xhat
    if bias is not None:
        y = y + bias
    return y, (xhat, stats)


def subln_backward(dy, saved, weight, has_bias=False):
    r"""$g = dy\odot w$; RMSNorm: $dx = r\,(g - \hat x\,\mathrm{mean}(g\odot\hat x))$; LayerNorm adds
    $-r\,\mathrm{mean}(g)$; $dw = \sum dy\odot\hat x$, $db = \sum dy$.

    From $\hat x = x r$, $\partial r/\partial x_j = -r^3 x_j / n$:
    $dx_j = r g_j - \frac{r^3 x_j}{n}\sum_i g_i x_i = r\,(g_j - \hat x_j\,\frac1n\sum_i g_i\hat x_i)$
    (:func:`refattn.nn.norms.normalize_backward`).
    """
    xhat, stats = saved
    g = dy * weight if weight is not None else dy
    dx = normalize_backward(g, xhat, stats)
    dw = db = None
    if weight is not None:
        dw = (dy * xhat).reshape(-1, xhat.shape[-1]).sum(axis=0)
    if has_bias:
        db = dy.reshape(-1, xhat.shape[-1]).sum(axis=0)
    return dx, dw, db


def rope_apply(x, cos, sin, interleaved, conjugate=False):
    r"""Rotary embedding on the last axis of ``x (..., N, d)`` with tables ``cos, sin (N_ro, r/2)``.

    Interleaved (GPT-J, unilm ``apply_rotary_emb(..., interleaved=True)``): pairs
    $(x_{2j}, x_{2j+1})$; rotate-half (GPT-NeoX): pairs $(x_j, x_{j+r/2})$. Each pair is rotated
    by $\theta_{t,j}$: $(a, b)\mapsto(a\cos - b\sin,\ a\sin + b\cos)$; channels past $r$ pass
    through (:func:`refattn.nn.rope.apply_rope`). The VJP of a rotation is the rotation by
    $-\theta$ (``conjugate=True``).
    """
    if cos is None:
        return x
    n = x.shape[-2]
    return apply_rope(x, cos[:n], -sin[:n] if conjugate else sin[:n], bool(interleaved))


def validate_rel_pos(rel_pos, n, d, dtype):
    """Validate ``rel_pos = (cos, sin)`` tables of shape ``(N_ro >= N, r/2)`` with ``r <= d``."""
    if rel_pos is None:
        return None, None
    if not isinstance(rel_pos, (tuple, list)) or len(rel_pos) != 2:
        raise TypeError(f"rel_pos must be a (cos, sin) pair of (seqlen, rotary_dim/2) arrays; got {type(rel_pos).__name__}")
    cos = as_float(rel_pos[0], "rel_pos[0] (cos)", ndim=2)
    sin = as_float(rel_pos[1], "rel_pos[1] (sin)", ndim=2)
    if cos.shape != sin.shape:
        raise ValueError(f"rel_pos cos and sin must have the same shape; got {cos.shape} and {sin.shape}")
    if cos.shape[0] < n:
        raise ValueError(f"rel_pos tables must cover the sequence: need >= {n} rows; got {cos.shape[0]}")
    if 2 * cos.shape[1] > d:
        raise ValueError(f"rel_pos rotary_dim = 2 * {cos.shape[1]} exceeds the (half-)head width {d}")
    return cos.astype(dtype, copy=False), sin.astype(dtype, copy=False)


def rope_tables(n: int, rotary_dim: int, base: float = 10000.0):
    r"""``(cos, sin)`` of shape ``(n, rotary_dim/2)`` with $\theta_{t,j} = t\,\text{base}^{-2j/r}$
    (flash-attn ``RotaryEmbedding``, the tables unilm passes as ``rel_pos``)."""
    ang = rope_angles(np.arange(n), rotary_dim, base=base)
    return np.cos(ang), np.sin(ang)


def lambda_reparam_forward(lq1, lk1, lq2, lk2, lambda_init):
    r"""$\lambda = e^{\lambda_{q1}\cdot\lambda_{k1}} - e^{\lambda_{q2}\cdot\lambda_{k2}} + \lambda_{init}$ (0-d)."""
    e1 = np.exp(np.dot(lq1, lk1))
    e2 = np.exp(np.dot(lq2, lk2))
    return np.asarray(e1 - e2 + lambda_init, dtype=lq1.dtype), (e1, e2)


def lambda_reparam_backward(dlam, lq1, lk1, lq2, lk2, saved):
    r"""$d\lambda_{q1} = d\lambda\,e_1\lambda_{k1}$, $d\lambda_{k1} = d\lambda\,e_1\lambda_{q1}$,
    $d\lambda_{q2} = -d\lambda\,e_2\lambda_{k2}$, $d\lambda_{k2} = -d\lambda\,e_2\lambda_{q2}$."""
    e1, e2 = saved
    dlam = float(np.sum(dlam))
    return {"lambda_q1": dlam * e1 * lk1, "lambda_k1": dlam * e1 * lq1,
            "lambda_q2": -dlam * e2 * lk2, "lambda_k2": -dlam * e2 * lq2}


# --------------------------------------------------------------------------------------------
# One layer's head chain, its keywords and the V1 pairing


def diff_heads_forward(q1, k1, q2, k2, v, lam, *, mask, scale, cos, sin, interleaved, subln, norm_w, eps,
               rescale, integral=None, norm_b=None):
    """RoPE on the four query/key tensors, the core (MHA-expanded heads), per-head norm, rescale."""
    r = [rope_apply(t, cos, sin, interleaved) for t in (q1, k1, q2, k2)]
    o, core = expanded_core_forward(r[0], r[1], r[2], r[3], v, lam, mask, scale, integral)
    saved = None
    if subln in ("rms", "layer"):
        o, saved = subln_forward(o, norm_w, norm_b, eps, center=subln == "layer")
    return o * rescale, {"core": core, "norm": saved, "rope": (cos, sin, interleaved), "rescale": rescale,
                         "has_bias": norm_b is not None}


def diff_heads_backward(g, c, norm_w):
    """Gradients of :func:`diff_heads_forward`: q1, k1, q2, k2, v, lam (full row shape), norm weight."""
    g = g * c["rescale"]
    dw = db = None
    if c["norm"] is not None:
        g, dw, db = subln_backward(g, c["norm"], norm_w, c["has_bias"])
    d = expanded_core_backward(g, c["core"])
    cos, sin, inter = c["rope"]
    for key in ("q1", "k1", "q2", "k2"):
        d[key] = rope_apply(d[key], cos, sin, inter, conjugate=True)
    d["norm_weight"] = dw
    d["norm_bias"] = db
    return d


def validate_layer_config(x, n, is_causal, attn_mask, causal_alignment, rel_pos, rope_interleaved, scale, d,
                  subln, subln_eps, n_heads, dt):
    r"""Validate the attention keywords of a V1-style layer; returns ``(mask, cos, sin, scale, eps)``.

    The mask combines ``attn_mask`` and the causal mask (unilm's rule for ``is_causal=None``:
    causal only when no ``attn_mask`` is given); ``cos, sin`` are the checked RoPE tables
    (or None), ``scale`` defaults to $d^{-1/2}$ and ``eps`` is the norm's.
    """
    mask = as_bool_or_float_mask(attn_mask, "attn_mask")
    if mask is not None:
        check_broadcastable("attn_mask", mask.shape, x.shape[:-2] + (n_heads, n, n),
                            "the scores (B, H, N, N) of shape")
    if is_causal is None:
        is_causal = mask is None  # unilm: the causal mask is used only when no attn_mask is passed
    if not isinstance(is_causal, (bool, np.bool_)):
        raise TypeError(f"is_causal must be a bool or None; got {type(is_causal).__name__}")
    check_choice(causal_alignment, "causal_alignment", ("bottom_right", "top_left"))
    if not isinstance(rope_interleaved, (bool, np.bool_)):
        raise TypeError(f"rope_interleaved must be a bool; got {type(rope_interleaved).__name__}")
    check_choice(subln, "subln", ("rms", "layer", "none"))
    eps = check_positive(subln_eps, "subln_eps")
    scale = check_positive(scale, "scale", allow_none=True)
    cos, sin = validate_rel_pos(rel_pos, n, d, dt)
    mask = combine_mask(mask, bool(is_causal), n, n, causal_alignment, dt)
    return mask, cos, sin, (d ** -0.5 if scale is None else scale), eps


def v1_pairing_index(num_heads: int, num_kv_heads: int, pairing: str = "adjacent",
                     gqa_pairing: str = "naive"):
    r"""Index maps of the V1 layer: for each differential head ``i``, the query half-heads of
    $Q_1, Q_2$, the key half-heads of $K_1, K_2$ and the value head.

    * ``pairing="adjacent"`` (unilm: ``view(.., 2H, d)`` then ``view(.., H, 2, ..)``): $Q_1, Q_2$
      of head ``i`` are half-heads ``2i, 2i+1``; ``"halves"``: ``i`` and ``H + i``.
    * ``gqa_pairing="naive"`` (unilm ``multihead_diffattn.py``): ``repeat_kv`` repeats the ``2 Hkv``
      key half-heads contiguously, so query half-head ``j`` meets key half-head ``j // n_rep``;
      for ``n_rep = 2`` both maps of head ``i`` use key half-head ``i``.
      ``"flash"`` (``multihead_flashdiff_{1,2}.py``): head ``i`` uses kv head ``i // n_rep`` and
      its own pair of key half-heads. They agree when ``n_rep = 1``.
    * The value head is ``i // n_rep`` in both files.
    """
    check_choice(pairing, "pairing", ("adjacent", "halves"))
    check_choice(gqa_pairing, "gqa_pairing", ("naive", "flash"))
    h = np.arange(num_heads)
    n_rep = num_heads // num_kv_heads
    if pairing == "adjacent":
        qp1, qp2 = 2 * h, 2 * h + 1
    else:
        qp1, qp2 = h, num_heads + h
    j = h // n_rep
    if gqa_pairing == "naive":
        kp1, kp2 = qp1 // n_rep, qp2 // n_rep
    elif pairing == "adjacent":
        kp1, kp2 = 2 * j, 2 * j + 1
    else:
        kp1, kp2 = j, num_kv_heads + j
    return qp1, qp2, kp1, kp2, j


# --------------------------------------------------------------------------------------------
# The generic V1 layer (V1, DiffCLIP, GDA, DINT)


V1_LAMBDA_KEYS = ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2")


def v1_generic_forward(x, params, *, where, names, num_heads, q_halves, k_halves, v_heads, d, dv,
                        index, attn_mask, is_causal, causal_alignment, rel_pos, rope_interleaved,
                        scale, subln, subln_affine, subln_eps, lambda_init_value, rescale,
                        optional_bias, integral=None):
    """Projections -> gather (pairing/GQA) -> RoPE/core/norm -> merge -> out_proj."""
    x = as_float(x, "x", min_ndim=2)
    C = x.shape[-1]
    nq, nk, nv, no, nn_ = names["q"], names["k"], names["v"], names["o"], names["norm"]
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of arrays for {where}; got {type(params).__name__}")
    if np.shape(params.get(f"{no}.weight"))[1:] == (num_heads * dv,):  # PyTorch's (out, in) layout: say so
        check_weight_in(params, f"{no}.weight", num_heads * dv, input_name=f"the merged heads ({num_heads} x {dv})")
    c_out = None
    if f"{no}.weight" in params:
        ow = np.shape(params[f"{no}.weight"])
        c_out = ow[1] if len(ow) == 2 else None
    if c_out is None:
        raise ValueError(f"params must contain '{no}.weight' of shape ({num_heads * dv}, C_out)")
    required = {f"{nq}.weight": (C, q_halves * d), f"{nk}.weight": (C, k_halves * d),
                f"{nv}.weight": (C, v_heads * dv), f"{no}.weight": (num_heads * dv, c_out)}
    for key in V1_LAMBDA_KEYS:
        required[key] = (d,)
    if subln != "none" and subln_affine:
        required[f"{nn_}.weight"] = (dv,)
        if subln == "layer":
            required[f"{nn_}.bias"] = (dv,)
    optional = {}
    if optional_bias:
        optional = {f"{nq}.bias": (q_halves * d,), f"{nk}.bias": (k_halves * d,),
                    f"{nv}.bias": (v_heads * dv,), f"{no}.bias": (c_out,)}
    P = check_params(params, {**required, **optional}, optional=tuple(optional), where=where)
    dt = compute_dtype(x, *P.values())
    x = x.astype(dt, copy=False)
    P = cast_all(dt, P)
    n = x.shape[-2]
    mask, cos, sin, s, eps = validate_layer_config(x, n, is_causal, attn_mask, causal_alignment, rel_pos,
                                           rope_interleaved, scale, d, subln, subln_eps, num_heads, dt)
    qp1, qp2, kp1, kp2, vp = index
    q = split_heads(linear_prefixed(P, nq, x), q_halves, d)
    k = split_heads(linear_prefixed(P, nk, x), k_halves, d)
    v = split_heads(linear_prefixed(P, nv, x), v_heads, dv)
    lam, lam_saved = lambda_reparam_forward(*(P[key] for key in V1_LAMBDA_KEYS), lambda_init_value)
    norm_w = P.get(f"{nn_}.weight")
    o, hc = diff_heads_forward(gather_heads(q, qp1), gather_heads(k, kp1), gather_heads(q, qp2),
                       gather_heads(k, kp2), gather_heads(v, vp), lam, mask=mask, scale=s,
                       cos=cos, sin=sin, interleaved=bool(rope_interleaved), subln=subln,
                       norm_w=norm_w, eps=eps, rescale=rescale, integral=integral,
                       norm_b=P.get(f"{nn_}.bias"))
    merged = merge_heads(o)
    out = linear_prefixed(P, no, merged)
    cache = {"x": x, "P": P, "names": names, "hc": hc, "merged": merged, "lam_saved": lam_saved,
             "index": index, "halves": (q_halves, k_halves, v_heads), "d": d, "dv": dv,
             "num_heads": num_heads, "out_shape": out.shape, "lam": lam}
    return out, cache


def v1_generic_backward(dout, cache):
    """Gradient of `v1_generic_forward`: ``x`` and every params key (the chain is in the module
    docstring)."""
    x, P, names = cache["x"], cache["P"], cache["names"]
    dout = as_dout(dout, cache["out_shape"], x.dtype)
    grads: dict = {}
    dmerged = linear_prefixed_vjp(grads, P, names["o"], dout, cache["merged"])
    H, dv = cache["num_heads"], cache["dv"]
    do = split_heads(dmerged, H, dv)
    norm_key = f"{names['norm']}.weight"
    dh = diff_heads_backward(do, cache["hc"], P.get(norm_key))
    if norm_key in P:
        grads[norm_key] = dh["norm_weight"]
    if f"{names['norm']}.bias" in P:
        grads[f"{names['norm']}.bias"] = dh["norm_bias"]
    grads.update(lambda_reparam_backward(dh["lam"], *(P[key] for key in V1_LAMBDA_KEYS), cache["lam_saved"]))
    qp1, qp2, kp1, kp2, vp = cache["index"]
    qh, kh, vh = cache["halves"]
    dq = scatter_heads(dh["q1"], qp1, qh) + scatter_heads(dh["q2"], qp2, qh)
    dk = scatter_heads(dh["k1"], kp1, kh) + scatter_heads(dh["k2"], kp2, kh)
    dvv = scatter_heads(dh["v"], vp, vh)
    dx = linear_prefixed_vjp(grads, P, names["q"], merge_heads(dq), x)
    dx = dx + linear_prefixed_vjp(grads, P, names["k"], merge_heads(dk), x)
    dx = dx + linear_prefixed_vjp(grads, P, names["v"], merge_heads(dvv), x)
    grads["x"] = dx
    return grads


def v1_layer_forward(x, params, *, num_heads, num_kv_heads, depth, lambda_init, lambda_init_convention,
                          attn_mask, is_causal, causal_alignment, rel_pos, rope_interleaved, scale, pairing,
                          gqa_pairing, subln, subln_affine, subln_eps, rescale, integral):
    """:func:`diff_attention_v1_forward` with DINT's optional integral term (``integral=(kind, source)``)."""
    num_heads = check_int(num_heads, "num_heads", minimum=1)
    num_kv_heads = num_heads if num_kv_heads is None else check_int(num_kv_heads, "num_kv_heads", minimum=1)
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
    if not isinstance(params, dict) or "q_proj.weight" not in params:
        raise ValueError("params must be a dict containing 'q_proj.weight' of shape (C, 2 * num_heads * d)")
    check_weight_in(params, "q_proj.weight", as_float(x, "x", min_ndim=2).shape[-1], input_name="x")
    qw = np.shape(params["q_proj.weight"])
    if len(qw) != 2 or qw[1] % (2 * num_heads):
        raise ValueError(f"q_proj.weight must have shape (C, 2 * num_heads * d) with num_heads = "
                         f"{num_heads}; got {qw}")
    d = qw[1] // (2 * num_heads)
    lam0 = resolve_lambda_init(depth, lambda_init, lambda_init_convention)
    if not isinstance(rescale, (bool, np.bool_)) or not isinstance(subln_affine, (bool, np.bool_)):
        raise TypeError("rescale and subln_affine must be bools")
    index = v1_pairing_index(num_heads, num_kv_heads, pairing, gqa_pairing)
    out, cache = v1_generic_forward(
        x, params, where="diff_attention_v1",
        names={"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "out_proj", "norm": "subln"},
        num_heads=num_heads, q_halves=2 * num_heads, k_halves=2 * num_kv_heads, v_heads=num_kv_heads,
        d=d, dv=2 * d, index=index, attn_mask=attn_mask, is_causal=is_causal,
        causal_alignment=causal_alignment, rel_pos=rel_pos, rope_interleaved=rope_interleaved,
        scale=scale, subln=subln, subln_affine=subln_affine, subln_eps=subln_eps,
        lambda_init_value=lam0, rescale=(1.0 - lam0) if rescale else 1.0, optional_bias=True,
        integral=integral)
    cache["lambda_init"] = lam0
    return out, cache
