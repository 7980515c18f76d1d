r"""DEX: a differential operation on the output of pretrained softmax heads.

Kong, Jang, Kwak, "Understanding Differential Transformer Unchains Pretrained Self-Attentions",
NeurIPS 2025, arXiv 2505.16333; the form is the paper's Fig. 9 pseudocode (no public code):

$$O_h = A_hV_h - \lambda\,[h\in\mathcal S]\;f_D(A_hV_h),\qquad f_D(o) = oW_D\,(+\,b_D),
  \qquad Y = [O_1\|\cdots\|O_H]\,W_o,$$

with $A_h$ the pretrained softmax map of head $h$ and $\mathcal S$ the adapted head subset.
Backward: $d(A_hV_h) = G_h - \lambda\bar G_hW_D^\top$, $dW_D = -\lambda\sum (A_hV_h)^\top\bar G_h$,
$d\lambda = -\langle\bar G, f_D(AV)\rangle$, then the SDPA, RoPE and projection VJPs (full
derivation and what remains unverified in `dex_differential_adaptation_forward`).
"""

from __future__ import annotations

import numpy as np

from ..._checks import (
    as_bool_or_float_mask,
    as_dout,
    as_float,
    cast_all,
    check_broadcastable,
    check_int,
    check_params,
    check_weight_in,
    compute_dtype,
)
from ...nn.linear import linear_prefixed, linear_prefixed_vjp, merge_heads, split_heads
from ...registry import Mechanism, Sample, register
from ..softmax import sdpa_backward, sdpa_forward
from .layer import rope_apply, rope_tables, validate_rel_pos

__all__ = [
    "dex_differential_adaptation_forward",
    "dex_differential_adaptation_backward",
    "dex_differential_adaptation",
]


def dex_differential_adaptation_forward(x, params, *, num_heads: int, num_kv_heads: int | None = None,
                                        heads=None, attn_mask=None, is_causal: bool = True,
                                        causal_alignment: str = "bottom_right", rel_pos=None,
                                        rope_interleaved: bool = False, scale=None):
    r"""DEX (Kong, Jang, Kwak, "Understanding Differential Transformer Unchains Pretrained
    Self-Attentions", NeurIPS 2025, arXiv 2505.16333): a differential operation on the *output* of
    pretrained softmax heads.

    [paper] DEX reuses the pretrained softmax map and adds "a lightweight differential operation
    on the output value matrix" on a selected subset of heads, with λ annealed during a short
    adaptation ("selective head adaptation and lambda annealing"); "some part of the code is
    proprietary" (NeurIPS checklist), none is public. The form below is the paper's Fig. 9
    pseudocode, read from a verbatim quotation of the figure and its caption ("The output value
    matrix O is transformed by subtracting a λ-modulated projection from itself. This operation
    targets a layer-specific subset of attention heads."; ri.k117.org reproducibility page for the
    NeurIPS 2025 paper) — ``O = softmax(A) @ V`` then ``O = O − λ f_D(O) if do else O`` per head,
    ``do = (i in hs)``, then ``Concat(O) @ W_o``:

    $$O_h = A_hV_h - \lambda\,[h\in\mathcal S]\;f_D(A_hV_h),\qquad f_D(o) = oW_D\,(+\,b_D),
      \qquad Y = [O_1\|\cdots\|O_H]\,W_o,$$

    with $A_h$ the pretrained (GQA, causal, RoPE) softmax map of head $h$ (Fig. 9 writes plain
    ``softmax(Q @ K.T * s)``; mask and RoPE are the pretrained model's). $f_D$ is "a projection"
    (Fig. 9 caption): here a learnable linear map on the value width, shared by all heads
    (``f_D.weight (dv, dv)``) or per head (``(H, dv, dv)``), with an optional bias — which of these
    (and its initialisation) the paper uses is not stated in the parts read: unverified. λ is a
    scalar parameter (``params["lambda"]``, shape ``(1,)``) so the annealing schedule lives outside
    the op (its gradient is returned; ignore it for a fixed schedule); the head subset
    $\mathcal S$ (``hs``) is the ``heads`` keyword — the paper's selection rule is not reproduced.

    Parameters
    ----------
    x : array (B.., N, C)
    params : dict
        Llama names (the pretrained model): ``q_proj.weight (C, Hd)``, ``k_proj.weight (C, H_{kv}d)``,
        ``v_proj.weight (C, H_{kv}d_v)``, ``o_proj.weight (Hd_v, C_out)``; DEX: ``f_D.weight``
        ``(d_v, d_v)`` or ``(H, d_v, d_v)``, optional ``f_D.bias`` ``(d_v,)``, ``lambda (1,)``.
    num_heads, num_kv_heads : int
        The pretrained model's heads (no halving).
    heads : sequence of int, optional
        The adapted head subset $\mathcal S$ (default: all heads).
    attn_mask, is_causal, causal_alignment, rel_pos, rope_interleaved, scale
        The pretrained attention: causal by default, RoPE rotate-half (Llama/HF) unless
        ``rope_interleaved``; :func:`refattn.attention.softmax.sdpa_forward` computes it.

    Notes
    -----
    Backward: with $G_h$ the gradient of $O_h$ (after $dZ = G_YW_o^\top$) and $\bar G_h = [h\in\mathcal S]G_h$:
    $d(A_hV_h) = G_h - \lambda\bar G_hW_D^\top$, $dW_D = -\lambda\sum (A_hV_h)^\top\bar G_h$,
    $db_D = -\lambda\sum\bar G_h$, $d\lambda = -\langle\bar G, f_D(AV)\rangle$; then the SDPA,
    RoPE and projection VJPs.
    """
    H = check_int(num_heads, "num_heads", minimum=1)
    Hkv = H if num_kv_heads is None else check_int(num_kv_heads, "num_kv_heads", minimum=1)
    if H % Hkv:
        raise ValueError(f"num_heads ({H}) must be a multiple of num_kv_heads ({Hkv})")
    x = as_float(x, "x", min_ndim=2)
    C = x.shape[-1]
    need = ("q_proj.weight", "v_proj.weight", "o_proj.weight", "f_D.weight")
    if not isinstance(params, dict) or any(k not in params for k in need):
        raise ValueError(f"params must be a dict containing {list(need)}, 'k_proj.weight' and 'lambda'")
    check_weight_in(params, "q_proj.weight", C, input_name="x")
    check_weight_in(params, "v_proj.weight", C, input_name="x")
    qw, vw, ow, fw = (np.shape(params[k]) for k in need)
    if len(qw) != 2 or qw[1] % H:
        raise ValueError(f"q_proj.weight must have shape (C, num_heads * d) with num_heads = {H}; got {qw}")
    if len(vw) != 2 or vw[1] % Hkv:
        raise ValueError(f"v_proj.weight must have shape (C, num_kv_heads * dv) with num_kv_heads = {Hkv}; got {vw}")
    if len(ow) != 2:
        raise ValueError(f"o_proj.weight must have shape (num_heads * dv, C_out); got {ow}")
    d, dv = qw[1] // H, vw[1] // Hkv
    check_weight_in(params, "o_proj.weight", H * dv, input_name=f"the merged heads ({H} x {dv})")
    per_head = len(fw) == 3
    required = {"q_proj.weight": (C, H * d), "k_proj.weight": (C, Hkv * d), "v_proj.weight": (C, Hkv * dv),
                "o_proj.weight": (H * dv, ow[1]), "f_D.weight": (H, dv, dv) if per_head else (dv, dv),
                "lambda": (1,)}
    P = check_params(params, {**required, "f_D.bias": (dv,)}, optional=("f_D.bias",),
                     where="dex_differential_adaptation")
    sel = np.zeros(H, bool)
    if heads is None:
        sel[:] = True
    else:
        try:
            idx = [int(h) for h in heads]
        except TypeError:
            raise TypeError(f"heads must be a sequence of head indices; got {type(heads).__name__}") from None
        if any(isinstance(h, (bool, np.bool_)) for h in heads) or any(not 0 <= h < H for h in idx):
            raise ValueError(f"heads must be indices in [0, {H}); got {list(heads)}")
        sel[idx] = True
    dt = compute_dtype(x, *P.values())
    x = x.astype(dt, copy=False)
    P = cast_all(dt, P)
    n = x.shape[-2]
    mask = as_bool_or_float_mask(attn_mask, "attn_mask")
    if mask is not None:
        check_broadcastable("attn_mask", mask.shape, x.shape[:-2] + (H, n, n), "the scores (B, H, N, N) of shape")
    cos, sin = validate_rel_pos(rel_pos, n, d, dt)
    q = rope_apply(split_heads(linear_prefixed(P, "q_proj", x), H, d), cos, sin, rope_interleaved)
    k = rope_apply(split_heads(linear_prefixed(P, "k_proj", x), Hkv, d), cos, sin, rope_interleaved)
    v = split_heads(linear_prefixed(P, "v_proj", x), Hkv, dv)
    o, sc = sdpa_forward(q, k, v, attn_mask=mask, is_causal=is_causal, causal_alignment=causal_alignment,
                         scale=scale)
    W = P["f_D.weight"]
    f = np.einsum("...hnd,hde->...hne", o, W) if per_head else o @ W
    if "f_D.bias" in P:
        f = f + P["f_D.bias"]
    selb = sel[:, None, None].astype(dt)
    o2 = o - P["lambda"][0] * selb * f
    z = merge_heads(o2)
    out = z @ P["o_proj.weight"]
    cache = {"x": x, "P": P, "sdpa": sc, "o": o, "f": f, "sel": selb, "z": z, "H": H, "dv": dv,
             "per_head": per_head, "rope": (cos, sin, rope_interleaved), "out_shape": out.shape}
    return out, cache


def dex_differential_adaptation_backward(dout, cache):
    """Gradient of :func:`dex_differential_adaptation_forward` (derivation in its Notes)."""
    x, P = cache["x"], cache["P"]
    dout = as_dout(dout, cache["out_shape"], x.dtype)
    grads: dict = {}
    dz = linear_prefixed_vjp(grads, P, "o_proj", dout, cache["z"])
    go = split_heads(dz, cache["H"], cache["dv"])
    lam = P["lambda"][0]
    gbar = go * cache["sel"]
    W, o = P["f_D.weight"], cache["o"]
    grads["lambda"] = np.array([-np.sum(gbar * cache["f"])])
    if cache["per_head"]:
        o4, g4 = o.reshape((-1,) + o.shape[-3:]), gbar.reshape((-1,) + o.shape[-3:])
        grads["f_D.weight"] = -lam * np.einsum("bhnd,bhne->hde", o4, g4)
        do = go - lam * np.einsum("...hne,hde->...hnd", gbar, W)
    else:
        grads["f_D.weight"] = -lam * (o.reshape(-1, o.shape[-1]).T @ gbar.reshape(-1, o.shape[-1]))
        do = go - lam * (gbar @ W.T)
    if "f_D.bias" in P:
        grads["f_D.bias"] = -lam * gbar.reshape(-1, o.shape[-1]).sum(axis=0)
    gs = sdpa_backward(do, cache["sdpa"])
    cos, sin, inter = cache["rope"]
    dq = rope_apply(gs["q"], cos, sin, inter, conjugate=True)
    dk = rope_apply(gs["k"], cos, sin, inter, conjugate=True)
    dx = linear_prefixed_vjp(grads, P, "q_proj", merge_heads(dq), x)
    dx = dx + linear_prefixed_vjp(grads, P, "k_proj", merge_heads(dk), x)
    dx = dx + linear_prefixed_vjp(grads, P, "v_proj", merge_heads(gs["v"]), x)
    grads["x"] = dx
    return grads


def dex_differential_adaptation(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`dex_differential_adaptation_forward`."""
    return dex_differential_adaptation_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _dex_params(rng, C, H, Hkv, d, dv, per_head=False, bias=True):
    P = {"q_proj.weight": rng.standard_normal((C, H * d)) / np.sqrt(C),
         "k_proj.weight": rng.standard_normal((C, Hkv * d)) / np.sqrt(C),
         "v_proj.weight": rng.standard_normal((C, Hkv * dv)) / np.sqrt(C),
         "o_proj.weight": rng.standard_normal((H * dv, C)) / np.sqrt(H * dv),
         "f_D.weight": rng.standard_normal((H, dv, dv) if per_head else (dv, dv)) / np.sqrt(dv),
         "lambda": np.array([0.3 + 0.4 * rng.random()])}
    if bias:
        P["f_D.bias"] = 0.1 * rng.standard_normal(dv)
    return P


def _sample_dex(rng, size):
    if size == "tiny":
        B, n, C, H, d, dv = 2, int(rng.integers(2, 4)), 3, 2, 2, 2
    else:
        B, n, C, H, d, dv = 2, int(rng.integers(4, 7)), 6, 4, 2, 3
    Hkv = int(rng.choice([1, 2]))
    per_head = bool(rng.integers(0, 2))
    heads = None if rng.random() < 0.5 else [int(rng.integers(0, H))]
    return Sample(inputs={"x": rng.standard_normal((B, n, C))},
                  params=_dex_params(rng, C, H, Hkv, d, dv, per_head=per_head),
                  config={"num_heads": H, "num_kv_heads": Hkv, "heads": heads, "rel_pos": rope_tables(n, d)})


def _dex_plain(x, P, cfg):
    H, Hkv = cfg["num_heads"], cfg["num_kv_heads"]
    d = P["q_proj.weight"].shape[1] // H
    dv = P["v_proj.weight"].shape[1] // Hkv
    cos, sin = cfg["rel_pos"]
    q = rope_apply(split_heads(x @ P["q_proj.weight"], H, d), cos, sin, False)
    k = rope_apply(split_heads(x @ P["k_proj.weight"], Hkv, d), cos, sin, False)
    o = sdpa_forward(q, k, split_heads(x @ P["v_proj.weight"], Hkv, dv), is_causal=True)[0]
    return o


def _check_dex_reductions(rng):
    # lambda = 0 or an empty head subset: the pretrained attention; f_D = I, no bias: (1 - lambda) A V.
    s = _sample_dex(rng, "small")
    x, P, cfg = s.inputs["x"], dict(s.params), dict(s.config)
    o = _dex_plain(x, P, cfg)
    plain = merge_heads(o) @ P["o_proj.weight"]
    err = float(np.abs(dex_differential_adaptation(x, dict(P, **{"lambda": np.zeros(1)}), **cfg) - plain).max())
    err = max(err, float(np.abs(dex_differential_adaptation(x, P, **dict(cfg, heads=[])) - plain).max()))
    dv = o.shape[-1]
    P_id = {k: v for k, v in P.items() if k != "f_D.bias"}
    P_id["f_D.weight"] = np.eye(dv)
    lam = P["lambda"][0]
    sel = np.zeros(cfg["num_heads"])
    sel[cfg["heads"] if cfg["heads"] is not None else slice(None)] = 1.0
    ref = merge_heads(o * (1 - lam * sel[:, None, None])) @ P["o_proj.weight"]
    err = max(err, float(np.abs(dex_differential_adaptation(x, P_id, **dict(cfg, num_kv_heads=cfg["num_kv_heads"]))
                                - ref).max()))
    assert err < 1e-12, f"DEX reductions fail ({err})"
    return err


register(
    Mechanism(
        slug="dex_differential_adaptation", family="2-differential", tier="T1",
        title="DEX: differential operation on the output of pretrained softmax heads",
        paper="Kong, Jang, Kwak, 'Understanding Differential Transformer Unchains Pretrained Self-Attentions', "
              "NeurIPS 2025, arXiv 2505.16333",
        forward=dex_differential_adaptation_forward, backward=dex_differential_adaptation_backward,
        sample=_sample_dex, docs="differential.md#dex_differential_adaptation",
        checks={"lambda_zero_empty_heads_identity_fd": _check_dex_reductions},
    ),
)
