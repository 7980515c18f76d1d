r"""DIFF Transformer V2: per-token, per-head $\lambda = \sigma(xW_\lambda)$, shared K/V within a GQA group.

microsoft/unilm ``Diff-Transformer/Diff-Transformer-V2/multihead_flashdiffv2.py``@31646c5
(``MultiheadFlashDiffV2`` with ``use_diff_v2=True``; README of the same folder; no paper id):
$2H$ query heads of full width $d$, one attention call over all of them, then per token $t$ and
output head $i$

$$O_{t,i} = \mathrm{attn}_{2i}(x)_t - \sigma\bigl(x_tW_\lambda\bigr)_i\,\mathrm{attn}_{2i+1}(x)_t,
  \qquad Y = [O_1\|\cdots\|O_H]\,W_o ;$$

the two query heads of a pair share K/V, and there is no per-head norm and no
$(1-\lambda_{init})$ factor.

Backward (derivation in the Notes of `diff_attention_v2_forward`): the gradient of the sigmoid
gate, $d\ell_{t,i} = \sigma_{t,i}(1-\sigma_{t,i})\,d\sigma_{t,i}$ with
$d\sigma_{t,i} = -\langle G_{t,i}, \mathrm{attn}_{2i+1,t}\rangle$, then one SDPA backward over the
$2H$ heads, the RoPE VJP and the projection VJPs.
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
    "diff_attention_v2_forward",
    "diff_attention_v2_backward",
    "diff_attention_v2",
]


def _sigmoid(z):
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # overflow-free logistic


def diff_attention_v2_forward(x, params, *, num_heads: int, num_kv_heads: int | None = None,
                              attn_mask=None, is_causal: bool = True,
                              causal_alignment: str = "bottom_right", rel_pos=None,
                              rope_interleaved: bool = True, scale=None,
                              require_shared_kv: bool = True):
    r"""DIFF Transformer V2 attention (microsoft/unilm ``Diff-Transformer-V2/multihead_flashdiffv2.py``,
    ``MultiheadFlashDiffV2`` with ``use_diff_v2=True``; README of the same folder).

    $2H$ query heads of width $d$ (not halved), $H_{kv}$ key/value heads, one flash-attention call
    over all $2H$ query heads (GQA, query head $h$ reads kv head $\lfloor h/(2H/H_{kv})\rfloor$),
    then per token $t$ and output head $i$:

    $$O_{t,i} = \mathrm{attn}_{2i}(x)_t - \sigma\bigl(x_tW_\lambda\bigr)_i\,\mathrm{attn}_{2i+1}(x)_t,
      \qquad Y = [O_1\|\cdots\|O_H]\,W_o .$$

    No per-head RMSNorm and no $(1-\lambda_{init})$ factor (README: removed because they "can lead
    to instability in later stages of large-scale pretraining"). The two heads of a pair share K/V
    when $2H/H_{kv}$ is even (README: "subtracts two heads that are in the same GQA group ...
    crucial to performance"); ``require_shared_kv=True`` enforces it, ``False`` allows what the
    upstream code would also run.

    Parameters
    ----------
    x : array (B.., N, C)
    params : dict
        ``"q_proj.weight" (C, 2Hd)``, ``"k_proj.weight" (C, H_{kv}d)``, ``"v_proj.weight" (C, H_{kv}d)``,
        ``"o_proj.weight" (Hd, C_out)``, ``"lambda_proj.weight" (C, H)`` (upstream names, weights
        transposed to ``(in, out)``; all bias-free upstream).
    num_heads, num_kv_heads : int
        $H$ output heads (upstream ``num_heads``), $H_{kv}$ (default $H$).
    attn_mask, is_causal, causal_alignment
        Upstream always calls ``flash_attn_func(..., causal=True)`` (bottom-right alignment) and
        takes no mask; ``attn_mask`` (bool keep / additive, broadcastable to ``(B, H, N, N)``, shared
        by both heads of a pair) is an extension. Fully masked rows give 0.
    rel_pos, rope_interleaved
        RoPE tables ``(cos, sin)`` of shape ``(N_ro >= N, r/2)``, ``r <= d``; interleaved as upstream.
    scale : float, optional
        Default $d^{-1/2}$ (flash-attn's default ``softmax_scale``).

    Returns
    -------
    out, cache
        ``out (B.., N, C_out)``.

    Notes
    -----
    Backward. With $G$ the gradient of the merged heads ($dZ = G_YW_o^\top$, $dW_o = Z^\top G_Y$):
    $d\mathrm{attn}_{2i} = G_i$, $d\mathrm{attn}_{2i+1} = -\sigma_{t,i}G_i$,
    $d\sigma_{t,i} = -\langle G_{t,i}, \mathrm{attn}_{2i+1,t}\rangle$,
    $d\ell_{t,i} = \sigma_{t,i}(1-\sigma_{t,i})\,d\sigma_{t,i}$ for the logits $\ell = xW_\lambda$,
    $dW_\lambda = x^\top d\ell$, $dx \mathrel{+}= d\ell\,W_\lambda^\top$; then one SDPA backward over
    the $2H$ heads (:func:`refattn.attention.softmax.sdpa_backward`, which sums each kv group), the
    RoPE VJP and the three projection VJPs.
    """
    H = check_int(num_heads, "num_heads", minimum=1)
    Hkv = H if num_kv_heads is None else check_int(num_kv_heads, "num_kv_heads", minimum=1)
    if (2 * H) % Hkv:
        raise ValueError(f"2 * num_heads ({2 * H} query heads) must be a multiple of num_kv_heads ({Hkv})")
    g = 2 * H // Hkv
    if require_shared_kv and g % 2:
        raise ValueError(f"with require_shared_kv the two query heads of a pair must share a kv head: "
                         f"2 * num_heads / num_kv_heads = {g} must be even (num_kv_heads <= num_heads)")
    x = as_float(x, "x", min_ndim=2)
    C = x.shape[-1]
    if not isinstance(params, dict) or "q_proj.weight" not in params or "o_proj.weight" not in params:
        raise ValueError("params must be a dict with 'q_proj.weight' (C, 2Hd), 'k_proj.weight', "
                         "'v_proj.weight', 'o_proj.weight' (Hd, C_out) and 'lambda_proj.weight' (C, H)")
    check_weight_in(params, "q_proj.weight", C, input_name="x")
    qw, ow = np.shape(params["q_proj.weight"]), np.shape(params["o_proj.weight"])
    if len(qw) != 2 or qw[1] % (2 * H):
        raise ValueError(f"q_proj.weight must have shape (C, 2 * num_heads * d) with num_heads = {H}; got {qw}")
    if len(ow) != 2:
        raise ValueError(f"o_proj.weight must have shape (num_heads * d, C_out); got {ow}")
    d = qw[1] // (2 * H)
    check_weight_in(params, "o_proj.weight", H * d, input_name=f"the merged heads ({H} x {d})")
    P = check_params(params, {"q_proj.weight": (C, 2 * H * d), "k_proj.weight": (C, Hkv * d),
                              "v_proj.weight": (C, Hkv * d), "o_proj.weight": (H * d, ow[1]),
                              "lambda_proj.weight": (C, H)}, where="diff_attention_v2")
    dt = compute_dtype(x, *P.values())
    x = x.astype(dt, copy=False)
    P = cast_all(dt, P)
    n = x.shape[-2]
    mask = as_bool_or_float_mask(attn_mask, "attn_mask")
    if mask is not None:
        check_broadcastable("attn_mask", mask.shape, x.shape[:-2] + (H, n, n), "the scores (B, H, N, N) of shape")
        if mask.ndim >= 3 and mask.shape[-3] == H and H > 1:
            mask = np.repeat(mask, 2, axis=-3)  # both heads of pair i see head i's mask
    cos, sin = validate_rel_pos(rel_pos, n, d, dt)
    q = rope_apply(split_heads(linear_prefixed(P, "q_proj", x), 2 * H, d), cos, sin, rope_interleaved)
    k = rope_apply(split_heads(linear_prefixed(P, "k_proj", x), Hkv, d), cos, sin, rope_interleaved)
    v = split_heads(linear_prefixed(P, "v_proj", x), Hkv, d)
    attn, sc = sdpa_forward(q, k, v, attn_mask=mask, is_causal=is_causal, causal_alignment=causal_alignment,
                            scale=scale)
    sig = np.swapaxes(_sigmoid(x @ P["lambda_proj.weight"]), -1, -2)[..., None]  # (B.., H, N, 1)
    o = attn[..., 0::2, :, :] - sig * attn[..., 1::2, :, :]
    z = merge_heads(o)
    out = z @ P["o_proj.weight"]
    cache = {"x": x, "P": P, "sdpa": sc, "attn2": attn[..., 1::2, :, :], "sig": sig, "z": z, "H": H,
             "d": d, "Hkv": Hkv, "rope": (cos, sin, rope_interleaved), "out_shape": out.shape}
    return out, cache


def diff_attention_v2_backward(dout, cache):
    """Gradient of :func:`diff_attention_v2_forward` (derivation in its Notes): ``x`` and every params key."""
    x, P, H, d = cache["x"], cache["P"], cache["H"], cache["d"]
    dout = as_dout(dout, cache["out_shape"], x.dtype)
    grads: dict = {}
    dz = linear_prefixed_vjp(grads, P, "o_proj", dout, cache["z"])
    go = split_heads(dz, H, d)
    sig = cache["sig"]
    dsig = -np.sum(go * cache["attn2"], axis=-1)  # (B.., H, N)
    dlogit = np.swapaxes(dsig * sig[..., 0] * (1.0 - sig[..., 0]), -1, -2)  # (B.., N, H)
    w = P["lambda_proj.weight"]
    grads["lambda_proj.weight"] = x.reshape(-1, w.shape[0]).T @ dlogit.reshape(-1, H)
    dattn = np.empty(go.shape[:-3] + (2 * H,) + go.shape[-2:], dtype=go.dtype)
    dattn[..., 0::2, :, :] = go
    dattn[..., 1::2, :, :] = -sig * go
    gs = sdpa_backward(dattn, cache["sdpa"])
    cos, sin, inter = cache["rope"]
    dq = rope_apply(gs["q"], cos, sin, inter, conjugate=True)
    dk = rope_apply(gs["k"], cos, sin, inter, conjugate=True)
    dx = dlogit @ w.T
    dx = dx + linear_prefixed_vjp(grads, P, "q_proj", merge_heads(dq), x)
    dx = dx + linear_prefixed_vjp(grads, P, "k_proj", merge_heads(dk), x)
    dx = dx + linear_prefixed_vjp(grads, P, "v_proj", merge_heads(gs["v"]), x)
    grads["x"] = dx
    return grads


def diff_attention_v2(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`diff_attention_v2_forward`."""
    return diff_attention_v2_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _v2_params(rng, C, H, Hkv, d, c_out=None):
    c_out = C if c_out is None else c_out
    return {"q_proj.weight": rng.standard_normal((C, 2 * H * d)) / np.sqrt(C),
            "k_proj.weight": rng.standard_normal((C, Hkv * d)) / np.sqrt(C),
            "v_proj.weight": rng.standard_normal((C, Hkv * d)) / np.sqrt(C),
            "o_proj.weight": rng.standard_normal((H * d, c_out)) / np.sqrt(H * d),
            "lambda_proj.weight": rng.standard_normal((C, H)) / np.sqrt(C)}


def _sample_v2(rng, size):
    if size == "tiny":
        B, n, C, H, d = 2, int(rng.integers(2, 4)), 3, 2, 2
    else:
        B, n, C, H, d = 2, int(rng.integers(4, 7)), 6, 2, 4
    Hkv = int(rng.choice([1, H]))
    return Sample(inputs={"x": rng.standard_normal((B, n, C))}, params=_v2_params(rng, C, H, Hkv, d),
                  config={"num_heads": H, "num_kv_heads": Hkv, "rel_pos": rope_tables(n, d)})


def _v2_reference(x, params, *, num_heads, num_kv_heads=None, attn_mask=None, is_causal=True,
                  causal_alignment="bottom_right", rel_pos=None, rope_interleaved=True, scale=None,
                  require_shared_kv=True):
    """Upstream transcribed with explicit per-head softmax loops (no sdpa)."""
    H = num_heads
    Hkv = H if num_kv_heads is None else num_kv_heads
    B, n, C = x.shape
    d = params["q_proj.weight"].shape[1] // (2 * H)
    q = np.swapaxes((x @ params["q_proj.weight"]).reshape(B, n, 2 * H, d), 1, 2)
    k = np.swapaxes((x @ params["k_proj.weight"]).reshape(B, n, Hkv, d), 1, 2)
    v = np.swapaxes((x @ params["v_proj.weight"]).reshape(B, n, Hkv, d), 1, 2)
    if rel_pos is not None:
        q = rope_apply(q, rel_pos[0], rel_pos[1], rope_interleaved)
        k = rope_apply(k, rel_pos[0], rel_pos[1], rope_interleaved)
    s = d ** -0.5 if scale is None else scale
    attn = np.zeros((B, 2 * H, n, d))
    for h in range(2 * H):
        j = h // (2 * H // Hkv)
        sc = s * q[:, h] @ np.swapaxes(k[:, j], -1, -2)
        if is_causal:
            sc = sc + np.triu(np.full((n, n), -np.inf), 1)
        p = np.exp(sc - sc.max(-1, keepdims=True))
        attn[:, h] = (p / p.sum(-1, keepdims=True)) @ v[:, j]
    lam = 1.0 / (1.0 + np.exp(-(x @ params["lambda_proj.weight"])))  # (B, N, H)
    attn = np.swapaxes(attn, 1, 2)  # (B, N, 2H, d)
    o = attn[:, :, 0::2] - lam[..., None] * attn[:, :, 1::2]
    return o.reshape(B, n, H * d) @ params["o_proj.weight"]


def _check_v2_sigma_zero(rng):
    # sigma -> 0 (lambda logits -> -inf): V2 is GQA attention of the even query heads, o_proj applied.
    s = _sample_v2(rng, "small")
    x = np.abs(s.inputs["x"]) + 0.5  # positive features so that a negative weight drives logits to -inf
    P = dict(s.params)
    P["lambda_proj.weight"] = -60.0 * np.ones_like(P["lambda_proj.weight"])
    out = diff_attention_v2(x, P, **s.config)
    H, Hkv = s.config["num_heads"], s.config["num_kv_heads"]
    d = P["q_proj.weight"].shape[1] // (2 * H)
    q = split_heads(x @ P["q_proj.weight"], 2 * H, d)[..., 0::2, :, :]
    cos, sin = s.config["rel_pos"]
    q = rope_apply(q, cos, sin, True)
    k = rope_apply(split_heads(x @ P["k_proj.weight"], Hkv, d), cos, sin, True)
    v = split_heads(x @ P["v_proj.weight"], Hkv, d)
    ref = merge_heads(sdpa_forward(q, k, v, is_causal=True)[0]) @ P["o_proj.weight"]
    err = float(np.abs(out - ref).max())
    assert err < 1e-12, f"sigma -> 0 differs from GQA attention of heads 0::2 by {err}"
    return err


def _check_v2_causal(rng):
    s = _sample_v2(rng, "small")
    x = s.inputs["x"]
    out = diff_attention_v2(x, s.params, **s.config)
    x2 = x.copy()
    x2[:, -1] -= 1.0
    err = float(np.abs(diff_attention_v2(x2, s.params, **s.config)[:, :-1] - out[:, :-1]).max())
    assert err < 1e-13, f"future token leaks ({err})"
    return err


register(
    Mechanism(
        slug="diff_attention_v2", family="2-differential", tier="T1",
        title="DIFF Transformer V2 (token/head-wise sigmoid λ, shared K/V within a GQA group)",
        paper="microsoft/unilm Diff-Transformer-V2 (README and multihead_flashdiffv2.py, 2026; no paper id)",
        forward=diff_attention_v2_forward, backward=diff_attention_v2_backward, sample=_sample_v2,
        reference=_v2_reference, docs="differential.md#diff_attention_v2",
        checks={"sigma_zero_is_gqa_even_heads": _check_v2_sigma_zero, "causal_no_leakage": _check_v2_causal},
    ),
)
