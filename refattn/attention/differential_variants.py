r"""Differential-attention variants built on the V1 pieces of :mod:`refattn.attention.differential`.

* :func:`diff_attention_v2_forward` — DIFF Transformer V2 (unilm
  ``Diff-Transformer/Diff-Transformer-V2/multihead_flashdiffv2.py``): per-token, per-head
  $\lambda = \sigma(xW_\lambda)$, the two query heads of a pair share K/V, no per-head norm.
* :func:`diffclip_attention_forward` — DiffCLIP (hammoudhasan/DiffCLIP ``diff_attention.py``).
* :func:`grouped_differential_attention_forward` — GDA (unbalanced signal / noise head groups;
  Motif Technologies' vLLM code).
* :func:`difflora_forward` — DiffLoRA (the first author's code, AlexandreMisrahi2005/bergen).
* :func:`dex_differential_adaptation_forward` — DEX (the paper's Fig. 9 pseudocode).
* :func:`differential_cross_attention_forward` — generic / GSRA (PhaSR code) and FDA (its code).
* :func:`dint_attention_forward`, :func:`shared_diff_attention_forward` — DINT (one third-party
  implementation) and Shared DIFF (abstract only): reconstructions, marked unverified where so.

Each docstring says which source (paper section, file and commit) was followed and what remains
unverified; every unclear choice is a keyword.

Each forward documents its backward; all are verified against central finite differences by the
registry's generated tests.
"""

from __future__ import annotations

import numpy as np

from .._checks import (
    as_bool_or_float_mask,
    as_dout,
    as_float,
    cast_all,
    check_broadcastable,
    check_int,
    check_params,
    compute_dtype,
)
from ..nn.linear import linear_prefixed, linear_prefixed_vjp, merge_heads, split_heads
from ..registry import Mechanism, Sample, register
from .differential._samples import draw_lambda_vectors, sample_v1, v1_sample_lambda_zero
from .differential.core import expanded_core_forward, gather_heads, kv_head_index, scatter_heads
from .differential.layer import (
    V1_LAMBDA_KEYS,
    diff_heads_backward,
    diff_heads_forward,
    lambda_init_fn,
    lambda_reparam_backward,
    lambda_reparam_forward,
    resolve_lambda_init,
    rope_apply,
    rope_tables,
    v1_generic_backward,
    v1_generic_forward,
    v1_layer_forward,
    v1_pairing_index,
    validate_layer_config,
    validate_rel_pos,
)
from .differential.v1 import diff_attention_v1_backward, diff_attention_v1_forward
from .softmax import sdpa_backward, sdpa_forward, sum_to_shape

__all__ = [
    "diff_attention_v2_forward",
    "diff_attention_v2_backward",
    "diff_attention_v2",
    "diffclip_attention_forward",
    "diffclip_attention_backward",
    "diffclip_attention",
    "gda_head_index",
    "gda_kv_index",
    "grouped_differential_attention_forward",
    "grouped_differential_attention_backward",
    "grouped_differential_attention",
    "dint_attention_forward",
    "dint_attention_backward",
    "dint_attention",
    "dex_differential_adaptation_forward",
    "dex_differential_adaptation_backward",
    "dex_differential_adaptation",
    "difflora_forward",
    "difflora_backward",
    "difflora",
    "shared_diff_attention_forward",
    "shared_diff_attention_backward",
    "shared_diff_attention",
    "differential_cross_attention_forward",
    "differential_cross_attention_backward",
    "differential_cross_attention",
]


def _sigmoid(z):
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # overflow-free logistic


# --------------------------------------------------------------------------------------------
# DIFF Transformer V2


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
    qw, ow = np.shape(params["q_proj.weight"]), np.shape(params["o_proj.weight"])
    if len(qw) != 2 or qw[1] % (2 * H):
        raise ValueError(f"q_proj.weight must have shape (C, 2 * num_heads * d) with num_heads = {H}; got {qw}")
    if len(ow) != 2:
        raise ValueError(f"o_proj.weight must have shape (num_heads * d, C_out); got {ow}")
    d = qw[1] // (2 * H)
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


# --------------------------------------------------------------------------------------------
# DiffCLIP

_DIFFCLIP_NAMES = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "out_proj", "norm": "diff_norm"}


def diffclip_attention_forward(x, params, *, num_heads: int, lambda_init: float = 0.8,
                               qkv_bias: bool = True, attn_mask=None, is_causal: bool = False,
                               scale=None):
    r"""DiffCLIP differential attention (hammoudhasan/DiffCLIP ``diff_attention.py``, ``DiffAttention``;
    Hammoud & Ghanem, "DiffCLIP: Differential Attention Meets CLIP", 2025).

    The V1 algebra (:func:`refattn.attention.differential.diff_attention_v1_forward`) with these
    differences, each read from the file:

    * ``num_heads`` is the *original* CLIP head count (must be even); the differential heads are
      ``num_heads // 2`` and the half-head width is ``dim // num_heads`` (V1 passes the halved count);
    * ``qkv_bias=True`` and ``out_proj`` has a bias (V1 is bias-free);
    * $\lambda_{init}$ = 0.8 for every block (a constant, no depth schedule);
    * no RoPE and no mask (vision tower); λ is ``exp(sum(lambda_q1 * lambda_k1))`` without dtype casts;
    * the norm is ``diff_norm = RMSNorm(2 * head_dim, eps=1e-5, elementwise_affine=True)``, then
      ``* (1 - lambda_init)`` as in V1;
    * attention dropout is applied to the probabilities before the subtraction upstream; refattn is
      deterministic (dropout off, the upstream default ``attn_drop=0``);
    * multi-head only (no GQA).

    Parameters
    ----------
    x : array (B.., N, C)
    params : dict
        ``q_proj.weight, k_proj.weight, v_proj.weight`` ``(C, C)`` with ``.bias (C,)`` when
        ``qkv_bias``; ``out_proj.weight (C, C_out)``, ``out_proj.bias (C_out,)``; ``lambda_q1,
        lambda_k1, lambda_q2, lambda_k2`` ``(C / num_heads,)``; ``diff_norm.weight (2C / num_heads,)``.
    attn_mask, is_causal
        Extensions (upstream has none): a mask shared by both maps, broadcastable to ``(B, H/2, N, N)``.

    Returns
    -------
    out, cache
        :func:`diffclip_attention_backward` gives ``x`` and every params key (the V1 chain).
    """
    num_heads = check_int(num_heads, "num_heads", minimum=2)
    if num_heads % 2:
        raise ValueError(f"num_heads must be even for differential attention (DiffCLIP); got {num_heads}")
    if not isinstance(qkv_bias, (bool, np.bool_)):
        raise TypeError(f"qkv_bias must be a bool; got {type(qkv_bias).__name__}")
    if not isinstance(params, dict) or "q_proj.weight" not in params:
        raise ValueError("params must be a dict containing 'q_proj.weight' of shape (C, C)")
    qw = np.shape(params["q_proj.weight"])
    if len(qw) != 2 or qw[1] % num_heads:
        raise ValueError(f"q_proj.weight must have shape (C, C) with C divisible by num_heads = {num_heads}; got {qw}")
    for key in ("q_proj.bias", "k_proj.bias", "v_proj.bias"):
        if qkv_bias and key not in params:
            raise ValueError(f"params is missing {key!r} (qkv_bias=True, the DiffCLIP default)")
        if not qkv_bias and key in params:
            raise ValueError(f"params has {key!r} but qkv_bias=False")
    if "out_proj.bias" not in params:
        raise ValueError("params is missing 'out_proj.bias' (DiffCLIP's output projection has a bias)")
    d = qw[1] // num_heads
    H = num_heads // 2
    lam0 = resolve_lambda_init(None, lambda_init, "unilm")
    out, cache = v1_generic_forward(
        x, params, where="diffclip_attention", names=_DIFFCLIP_NAMES, num_heads=H, q_halves=2 * H,
        k_halves=2 * H, v_heads=H, d=d, dv=2 * d, index=v1_pairing_index(H, H), attn_mask=attn_mask,
        is_causal=is_causal, causal_alignment="bottom_right", rel_pos=None, rope_interleaved=True,
        scale=scale, subln="rms", subln_affine=True, subln_eps=1e-5, lambda_init_value=lam0,
        rescale=1.0 - lam0, optional_bias=True)
    return out, cache


def diffclip_attention_backward(dout, cache):
    r"""Gradient of :func:`diffclip_attention_forward` (the V1 chain, biases included:
    $db = \sum_{\text{rows}} dY$ for each projection)."""
    return v1_generic_backward(dout, cache)


def diffclip_attention(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`diffclip_attention_forward`."""
    return diffclip_attention_forward(x, params, **config)[0]


def _diffclip_params(rng, C, num_heads, c_out=None):
    c_out = C if c_out is None else c_out
    d = C // num_heads
    P = {}
    for name in ("q_proj", "k_proj", "v_proj"):
        P[f"{name}.weight"] = rng.standard_normal((C, C)) / np.sqrt(C)
        P[f"{name}.bias"] = 0.1 * rng.standard_normal(C)
    P["out_proj.weight"] = rng.standard_normal((C, c_out)) / np.sqrt(C)
    P["out_proj.bias"] = 0.1 * rng.standard_normal(c_out)
    P.update(draw_lambda_vectors(rng, d, 0.8))
    P["diff_norm.weight"] = 1.0 + 0.2 * rng.standard_normal(2 * d)
    return P


def _sample_diffclip(rng, size):
    if size == "tiny":
        B, n, C, heads = 2, int(rng.integers(2, 4)), 4, 2
    else:
        B, n, C, heads = 2, int(rng.integers(4, 7)), 8, 4
    return Sample(inputs={"x": rng.standard_normal((B, n, C))}, params=_diffclip_params(rng, C, heads),
                  config={"num_heads": heads})


def _check_diffclip_is_v1(rng):
    # DiffCLIP == V1 with lambda_init = const(0.8), biases, no RoPE, no mask, halved head count.
    s = _sample_diffclip(rng, "small")
    P = {("subln.weight" if k == "diff_norm.weight" else k): v for k, v in s.params.items()}
    a = diffclip_attention(**s.inputs, params=s.params, **s.config)
    b = diff_attention_v1_forward(**s.inputs, params=P, num_heads=s.config["num_heads"] // 2,
                                  lambda_init=0.8, is_causal=False)[0]
    err = float(np.abs(a - b).max())
    assert err < 1e-14, f"DiffCLIP differs from V1(lambda_init=0.8, biases, no mask) by {err}"
    return err


# --------------------------------------------------------------------------------------------
# Grouped Differential Attention (GDA)


def gda_head_index(num_signal_heads: int, noise_group_ratio: int, head_layout: str = "grouped"):
    r"""Query half-head indices of GDA: for signal head $i$, its own query half-head and the shared
    noise half-head of group $g(i) = \lfloor i/r\rfloor$.

    ``"grouped"``: blocks of $r$ signal half-heads followed by their noise half-head,
    ``[s_0 .. s_{r-1}, n_0, s_r .. s_{2r-1}, n_1, ...]`` — the layout of the Motif-2-12.7B code
    (vLLM ``GroupedDifferentialAttentionImpl.split_q_heads``: "``[Q1, ..., Q1, Q2]``" per group,
    ``rearrange(q, "... (num_groups group_size) D -> ...")``); for $r = 1$ exactly V1's adjacent pairing.
    ``"split"``: all signal half-heads, then all noise half-heads — for $r = 1$ V1's ``"halves"``.
    Returns ``(signal_idx, noise_idx)`` of length $H_s$.
    """
    i = np.arange(num_signal_heads)
    g = i // noise_group_ratio
    if head_layout == "grouped":
        return g * (noise_group_ratio + 1) + i % noise_group_ratio, g * (noise_group_ratio + 1) + noise_group_ratio
    return i, num_signal_heads + g


def gda_kv_index(num_signal_heads: int, num_kv_heads: int, head_layout: str = "grouped"):
    r"""Key/value indices of GDA's grouped key/value layout (``kv_layout="gqa"``).

    $G$ = ``num_kv_heads`` key/value groups, each with one $K_1$ half-head, one $K_2$ half-head
    (width $d$) and one value head; signal head $i$ (and its noise head $g(i)$) use group
    $j = \lfloor i/(H_s/G)\rfloor$. ``k_proj`` holds $2G$ half-heads: ``"grouped"`` interleaves them
    ``[k1_0, k2_0, k1_1, k2_1, ...]`` (vLLM ``split_heads``: ``rearrange(x, "... (H two) D -> ... H two D")``),
    ``"split"`` stores ``[k1_0 .. k1_{G-1}, k2_0 .. k2_{G-1}]``. Returns ``(k1_idx, k2_idx, v_idx)``
    of length $H_s$.
    """
    j = np.arange(num_signal_heads) // (num_signal_heads // num_kv_heads)
    if head_layout == "grouped":
        return 2 * j, 2 * j + 1, j
    return j, num_kv_heads + j, j


def grouped_differential_attention_forward(x, params, *, num_signal_heads: int, noise_group_ratio: int = 1,
                                           head_layout: str = "grouped", kv_layout: str = "gqa",
                                           num_kv_heads: int | None = None, depth: int | None = None,
                                           lambda_init: float | None = None,
                                           lambda_init_convention: str = "motif", attn_mask=None,
                                           is_causal: bool | None = None,
                                           causal_alignment: str = "bottom_right", rel_pos=None,
                                           rope_interleaved: bool = False, scale=None, subln: str = "rms",
                                           subln_affine: bool = True, subln_eps: float = 1e-5,
                                           rescale: bool = True):
    r"""Grouped Differential Attention (Lim et al., Motif Technologies, "Grouped Differential
    Attention", 2025, arXiv 2510.06949).

    [paper, abstract] Heads are split *unevenly* into $H_s$ signal-preserving heads $(Q_1, K_1)$
    and $H_n = H_s/r$ noise-control heads $(Q_2, K_2)$; each noise head is shared by $r$ signal
    heads "through controlled repetition (akin to GQA)"; ratios 3:1 / 4:1 work best. The paper's
    method section could not be read here (only its abstract and third-party summaries), so the
    default follows the authors' released implementation instead:

    * [code] Motif Technologies' vLLM fork, ``MotifTechnologies/vllm``
      ``vllm/model_executor/models/motif.py`` (commit 477e4d7, ``MotifAttention``), and the GDA backend
      it calls, ``vllm-project/vllm`` ``vllm/v1/attention/backends/grouped_diff_attn.py`` (commit
      49902a1, ``GroupedDifferentialAttentionImpl.forward``): query half-heads in groups
      ``[Q1 x r, Q2]``; keys and values grouped GQA-style (``num_kv_heads`` $=2G$ key half-heads,
      ``k1, k2 = split_heads(k)``, ``v1, v2 = split_heads(v)``); every signal head attends with
      $(Q_1^i, K_1^{j(i)})$ to the value group $V^{j(i)}$ (width $2d$, ``cat([attn11, attn12])``), every
      noise head with $(Q_2^{n}, K_2^{j})$ to the same value group, the noise outputs are repeated
      $r$ times (``repeat(attn2, "... H D -> ... (H r) D", r=ratio)``), then
      ``attn1 - lambda_full * attn2`` → ``subln`` (``RMSNorm(2 * head_dim)``) → ``* (1 - lambda_init)``.
      λ is one scalar per layer with V1's re-parameterisation (``lambda_q1..k2``), $\lambda_{init} =
      0.8 - 0.6e^{-0.3(\text{layer\_idx}-1)}$ with the 0-based layer index
      (``lambda_init_convention="motif"``), RoPE rotate-half (``get_rope(..., is_neox_style=True)``),
      scale $d^{-1/2}$, causal:

    $$\mathrm{head}_i = (1-\lambda_{init})\,\mathrm{RMSNorm}_{2d}\bigl(\mathrm{softmax}(sQ_1^iK_1^{j(i)\top}+M)V^{j(i)}
      - \lambda\,\mathrm{softmax}(sQ_2^{g(i)}K_2^{j(i)\top}+M)V^{j(i)}\bigr),\qquad Y = [\mathrm{head}_i]_iW_o,$$

    $g(i) = \lfloor i/r\rfloor$, $j(i) = \lfloor i/(H_s/G)\rfloor$, $G \mid H_n$ (the vLLM backend asserts
    ``num_q2_heads % (num_kv_heads // 2) == 0``); $G$ defaults to $H_n$ (Motif-2-12.7B:
    ``num_attention_heads=40``, ``num_noise_heads=8``, ``num_key_value_heads=16``, i.e. $H_s=32$,
    $r=4$, $G=8$). ``noise_group_ratio=1`` is V1 exactly (``head_layout="grouped"`` ↔ V1
    ``pairing="adjacent"``, ``"split"`` ↔ ``"halves"``; with $G < H_s$ V1's ``gqa_pairing="flash"``).

    ``kv_layout="per_head"`` keeps the earlier reconstruction (not in the Motif code; unverified):
    one key half-head per query half-head (``k_proj`` laid out like ``q_proj``, $(H_s+H_n)$ half-heads)
    and one value head per signal head; the noise map of head $i$ multiplies head $i$'s own values.

    Parameters
    ----------
    x : array (B.., N, C)
    params : dict
        V1's names (weights ``(in, out)``): ``q_proj.weight (C, (H_s + H_n) d)`` laid out by
        ``head_layout`` (:func:`gda_head_index`); ``k_proj.weight (C, 2Gd)`` (:func:`gda_kv_index`) or,
        per head, ``(C, (H_s + H_n) d)``; ``v_proj.weight (C, G d_v)`` or ``(C, H_s d_v)`` ($d_v = 2d$
        upstream); ``out_proj.weight (H_s d_v, C_out)``; ``lambda_q1..lambda_k2 (d,)``;
        ``subln.weight (d_v,)``; optional ``*.bias``.
    num_signal_heads, noise_group_ratio : int
        $H_s$ and $r$ ($H_s$ divisible by $r$; $H_n = H_s/r$; Motif's ``num_attention_heads`` is
        $H_s + H_n$).
    head_layout : {"grouped", "split"}
    kv_layout : {"gqa", "per_head"}
    num_kv_heads : int, optional
        $G$ for ``kv_layout="gqa"`` (default $H_n$; upstream ``num_key_value_heads`` $= 2G$).
    depth, lambda_init, lambda_init_convention, attn_mask, is_causal, causal_alignment, rel_pos,
    rope_interleaved, scale, subln, subln_affine, subln_eps, rescale
        As :func:`refattn.attention.differential.diff_attention_v1_forward`, with the Motif defaults
        ``lambda_init_convention="motif"`` and ``rope_interleaved=False``.

    Returns
    -------
    out, cache
        The backward is V1's; the adjoint of the repetition sums the gradient of each noise
        half-head (and of each shared key/value group) over the signal heads that use it.
    """
    from .._checks import check_choice

    Hs = check_int(num_signal_heads, "num_signal_heads", minimum=1)
    r = check_int(noise_group_ratio, "noise_group_ratio", minimum=1)
    if Hs % r:
        raise ValueError(f"num_signal_heads ({Hs}) must be a multiple of noise_group_ratio ({r})")
    check_choice(head_layout, "head_layout", ("grouped", "split"))
    check_choice(kv_layout, "kv_layout", ("gqa", "per_head"))
    Hn = Hs // r
    if kv_layout == "per_head":
        if num_kv_heads is not None:
            raise ValueError("num_kv_heads applies to kv_layout='gqa' only (per_head has one key per query half-head)")
        G = None
    else:
        G = Hn if num_kv_heads is None else check_int(num_kv_heads, "num_kv_heads", minimum=1)
        if Hn % G:
            raise ValueError(f"the noise heads H_n = {Hn} must be a multiple of num_kv_heads ({G}) "
                             "(vLLM grouped_diff_attn: num_q2_heads % (num_kv_heads // 2) == 0)")
    if not isinstance(params, dict) or "q_proj.weight" not in params or "v_proj.weight" not in params:
        raise ValueError("params must be a dict containing 'q_proj.weight' (C, (H_s + H_n) d) and 'v_proj.weight'")
    qw, vw = np.shape(params["q_proj.weight"]), np.shape(params["v_proj.weight"])
    if len(qw) != 2 or qw[1] % (Hs + Hn):
        raise ValueError(f"q_proj.weight must have shape (C, (H_s + H_n) d) with H_s + H_n = {Hs + Hn}; got {qw}")
    v_heads = Hs if G is None else G
    if len(vw) != 2 or vw[1] % v_heads:
        raise ValueError(f"v_proj.weight must have shape (C, {'H_s' if G is None else 'G'} d_v) with "
                         f"{'H_s' if G is None else 'G'} = {v_heads}; got {vw}")
    d, dv = qw[1] // (Hs + Hn), vw[1] // v_heads
    if not isinstance(rescale, (bool, np.bool_)) or not isinstance(subln_affine, (bool, np.bool_)):
        raise TypeError("rescale and subln_affine must be bools")
    lam0 = resolve_lambda_init(depth, lambda_init, lambda_init_convention)
    sig, noise = gda_head_index(Hs, r, head_layout)
    if G is None:
        index, k_halves = (sig, noise, sig, noise, np.arange(Hs)), Hs + Hn
    else:
        k1, k2, vj = gda_kv_index(Hs, G, head_layout)
        index, k_halves = (sig, noise, k1, k2, vj), 2 * G
    out, cache = v1_generic_forward(
        x, params, where="grouped_differential_attention",
        names={"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "out_proj", "norm": "subln"},
        num_heads=Hs, q_halves=Hs + Hn, k_halves=k_halves, v_heads=v_heads, d=d, dv=dv, index=index,
        attn_mask=attn_mask, is_causal=is_causal, causal_alignment=causal_alignment, rel_pos=rel_pos,
        rope_interleaved=rope_interleaved, scale=scale, subln=subln, subln_affine=subln_affine,
        subln_eps=subln_eps, lambda_init_value=lam0, rescale=(1.0 - lam0) if rescale else 1.0,
        optional_bias=True)
    cache["lambda_init"] = lam0
    return out, cache


def grouped_differential_attention_backward(dout, cache):
    """Gradient of :func:`grouped_differential_attention_forward`: V1's chain; a noise half-head's
    query/key gradient is the sum over the $r$ signal heads that share it."""
    return v1_generic_backward(dout, cache)


def grouped_differential_attention(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`grouped_differential_attention_forward`."""
    return grouped_differential_attention_forward(x, params, **config)[0]


def _gda_params(rng, C, Hs, r, d, dv=None, lambda_init=0.5, kv_layout="gqa", G=None):
    dv = 2 * d if dv is None else dv
    Hn = Hs // r
    if kv_layout == "gqa":
        G = Hn if G is None else G
        kh, vh = 2 * G, G
    else:
        kh, vh = Hs + Hn, Hs
    P = {"q_proj.weight": rng.standard_normal((C, (Hs + Hn) * d)) / np.sqrt(C),
         "k_proj.weight": rng.standard_normal((C, kh * d)) / np.sqrt(C),
         "v_proj.weight": rng.standard_normal((C, vh * dv)) / np.sqrt(C),
         "out_proj.weight": rng.standard_normal((Hs * dv, C)) / np.sqrt(Hs * dv)}
    P.update(draw_lambda_vectors(rng, d, lambda_init))
    P["subln.weight"] = 1.0 + 0.2 * rng.standard_normal(dv)
    return P


def _sample_gda(rng, size):
    if size == "tiny":
        B, n, C, Hs, r, d = 2, int(rng.integers(2, 4)), 3, 2, 2, 2
    else:
        B, n, C, Hs, r, d = 2, int(rng.integers(4, 7)), 6, 6, 3, 2
    depth = int(rng.integers(1, 6))
    layout = str(rng.choice(["grouped", "split"]))
    kv_layout = str(rng.choice(["gqa", "per_head"]))
    cfg = {"num_signal_heads": Hs, "noise_group_ratio": r, "head_layout": layout, "kv_layout": kv_layout,
           "depth": depth, "rel_pos": rope_tables(n, d)}
    G = None
    if kv_layout == "gqa":
        G = int(rng.choice([g for g in range(1, Hs // r + 1) if (Hs // r) % g == 0]))
        cfg["num_kv_heads"] = G
    return Sample(inputs={"x": rng.standard_normal((B, n, C))},
                  params=_gda_params(rng, C, Hs, r, d, lambda_init=lambda_init_fn(depth, "motif"),
                                     kv_layout=kv_layout, G=G),
                  config=cfg)


# The GDA defaults that differ from diff_attention_v1's (Motif code vs unilm code).
_GDA_V1_DEFAULTS = {"lambda_init_convention": "motif", "rope_interleaved": False}


def _check_gda_ratio_one_is_v1(rng):
    s = _sample_gda(rng, "small")
    x = s.inputs["x"]
    err = 0.0
    for kv_layout, G in (("gqa", None), ("gqa", 1), ("per_head", None)):
        P = _gda_params(rng, x.shape[-1], 2, 1, 2, kv_layout=kv_layout, G=G)
        extra = {} if G is None else {"num_kv_heads": G, "gqa_pairing": "flash"}
        for layout, pairing in (("grouped", "adjacent"), ("split", "halves")):
            kw = {} if kv_layout == "gqa" and G is None else {"kv_layout": kv_layout}
            if G is not None:
                kw["num_kv_heads"] = G
            a = grouped_differential_attention(x, P, num_signal_heads=2, noise_group_ratio=1, head_layout=layout,
                                               depth=2, rel_pos=s.config["rel_pos"], **kw)
            b = diff_attention_v1_forward(x, P, num_heads=2, depth=2, rel_pos=s.config["rel_pos"], pairing=pairing,
                                          **_GDA_V1_DEFAULTS, **extra)[0]
            err = max(err, float(np.abs(a - b).max()))
    assert err == 0.0, f"GDA with ratio 1 differs from V1 by {err}"
    return err


def _duplicated_v1(P, cfg, d):
    """V1 weights and keywords equal to a GDA layer: each noise query half-head is copied to its r
    signal heads (adjacent pairs for ``"grouped"``, halves for ``"split"``); the per-head key layout
    copies the noise keys the same way, the grouped one is V1's GQA with ``gqa_pairing="flash"``."""
    Hs, r, layout = cfg["num_signal_heads"], cfg["noise_group_ratio"], cfg.get("head_layout", "grouped")
    sig, noise = gda_head_index(Hs, r, layout)
    cols = np.arange(P["q_proj.weight"].shape[1]).reshape(-1, d)
    if layout == "grouped":
        order = np.stack([cols[sig], cols[noise]], axis=1).reshape(-1)  # (s_0, n_g(0), s_1, n_g(1), ...)
    else:
        order = np.concatenate([cols[sig], cols[noise]], axis=0).reshape(-1)
    Q = dict(P)
    Q["q_proj.weight"] = P["q_proj.weight"][:, order]
    vcfg = {k: v for k, v in cfg.items()
            if k not in ("num_signal_heads", "noise_group_ratio", "head_layout", "kv_layout", "num_kv_heads")}
    for k, v in _GDA_V1_DEFAULTS.items():
        vcfg.setdefault(k, v)
    vcfg["pairing"] = "adjacent" if layout == "grouped" else "halves"
    korder = None
    if cfg.get("kv_layout", "gqa") == "per_head":
        Q["k_proj.weight"] = P["k_proj.weight"][:, order]
        korder = order
    else:
        vcfg["num_kv_heads"] = cfg.get("num_kv_heads") or Hs // r
        vcfg["gqa_pairing"] = "flash"
    return Q, vcfg, order, korder


def _check_gda_noise_gradient_is_group_sum(rng):
    # GDA == V1 with duplicated noise weights; the GDA gradient of a noise column is the sum over copies.
    s = _sample_gda(rng, "small")
    x, P, cfg = s.inputs["x"], s.params, dict(s.config)
    Hs, r = cfg["num_signal_heads"], cfg["noise_group_ratio"]
    d = P["q_proj.weight"].shape[1] // (Hs + Hs // r)
    Q, vcfg, order, korder = _duplicated_v1(P, cfg, d)
    out, cache = grouped_differential_attention_forward(x, P, **cfg)
    ref, vcache = diff_attention_v1_forward(x, Q, num_heads=Hs, **vcfg)
    err = float(np.abs(out - ref).max())
    g = rng.standard_normal(out.shape)
    ga = grouped_differential_attention_backward(g, cache)
    gv = diff_attention_v1_backward(g, vcache)
    for key, idx in (("q_proj.weight", order), ("k_proj.weight", korder)):
        if idx is None:
            err = max(err, float(np.abs(ga[key] - gv[key]).max()))
            continue
        summed = np.zeros_like(P[key])
        np.add.at(summed.T, idx, gv[key].T)
        err = max(err, float(np.abs(ga[key] - summed).max()))
    for key in ("x", "v_proj.weight", "out_proj.weight", "subln.weight", *V1_LAMBDA_KEYS):
        err = max(err, float(np.abs(ga[key] - gv[key]).max()))
    assert err < 1e-11, f"GDA vs duplicated-noise V1: {err}"
    return err


def _check_gda_matches_vllm_transcription(rng):
    # Independent transcription of vLLM grouped_diff_attn.py (GroupedDifferentialAttentionImpl.forward)
    # with the motif.py projections: split_q_heads / split_heads / four attentions / repeat / subln.
    B, n, C, Hs, r, G, d = 2, 5, 6, 4, 2, 2, 2
    Hn = Hs // r
    x = rng.standard_normal((B, n, C))
    P = _gda_params(rng, C, Hs, r, d, lambda_init=lambda_init_fn(3, "motif"), G=G)
    cos, sin = rope_tables(n, d)
    out = grouped_differential_attention(x, P, num_signal_heads=Hs, noise_group_ratio=r, num_kv_heads=G, depth=3,
                                         rel_pos=(cos, sin))

    def rope_neox(t):  # (B, n, heads, d), rotate-half
        c, s_ = cos[:, None, :], sin[:, None, :]
        a, b = t[..., : d // 2], t[..., d // 2:]
        return np.concatenate([a * c - b * s_, a * s_ + b * c], axis=-1)

    q = rope_neox((x @ P["q_proj.weight"]).reshape(B, n, Hs + Hn, d))
    k = rope_neox((x @ P["k_proj.weight"]).reshape(B, n, 2 * G, d))
    v = (x @ P["v_proj.weight"]).reshape(B, n, 2 * G, d)
    qg = q.reshape(B, n, Hn, r + 1, d)                       # (num_groups group_size)
    q1, q2 = qg[:, :, :, :r].reshape(B, n, Hs, d), qg[:, :, :, r:].reshape(B, n, Hn, d)
    k1, k2 = k[:, :, 0::2], k[:, :, 1::2]                    # "(H two) D -> H two D"
    v1, v2 = v[:, :, 0::2], v[:, :, 1::2]
    keep = np.tril(np.ones((n, n), bool))

    def flash(qq, kk, vv):  # causal, GQA q head h -> kv head h // (Hq / Hkv)
        rep = qq.shape[2] // kk.shape[2]
        kk, vv = np.repeat(kk, rep, axis=2), np.repeat(vv, rep, axis=2)
        sc = np.einsum("bihd,bjhd->bhij", qq, kk) * d ** -0.5
        sc = np.where(keep, sc, -np.inf)
        p = np.exp(sc - sc.max(-1, keepdims=True))
        return np.einsum("bhij,bjhd->bihd", p / p.sum(-1, keepdims=True), vv)

    attn1 = np.concatenate([flash(q1, k1, v1), flash(q1, k1, v2)], axis=-1)
    attn2 = np.repeat(np.concatenate([flash(q2, k2, v1), flash(q2, k2, v2)], axis=-1), r, axis=2)
    lam0 = 0.8 - 0.6 * np.exp(-0.3 * (3 - 1))
    lam = np.exp(P["lambda_q1"] @ P["lambda_k1"]) - np.exp(P["lambda_q2"] @ P["lambda_k2"]) + lam0
    a = attn1 - lam * attn2
    a = a / np.sqrt(np.mean(a * a, axis=-1, keepdims=True) + 1e-5) * P["subln.weight"]
    ref = (a * (1 - lam0)).reshape(B, n, -1) @ P["out_proj.weight"]
    err = float(np.abs(out - ref).max())
    assert err < 1e-12, f"GDA differs from the vLLM grouped_diff_attn transcription by {err}"
    return err


register(
    Mechanism(
        slug="diffclip_attention", family="2-differential", tier="T1",
        title="DiffCLIP differential attention (vision/text encoders)",
        paper="Hammoud & Ghanem, 'DiffCLIP: Differential Attention Meets CLIP', 2025",
        forward=diffclip_attention_forward, backward=diffclip_attention_backward, sample=_sample_diffclip,
        docs="differential.md#diffclip_attention", checks={"equals_v1_constant_lambda_init": _check_diffclip_is_v1},
    ),
    Mechanism(
        slug="grouped_differential_attention", family="2-differential", tier="T1",
        title="GDA: unbalanced signal / noise-control head groups",
        paper="Lim et al., 'Grouped Differential Attention', 2025, arXiv 2510.06949",
        forward=grouped_differential_attention_forward, backward=grouped_differential_attention_backward,
        sample=_sample_gda, docs="differential.md#grouped_differential_attention",
        checks={"ratio_one_is_v1": _check_gda_ratio_one_is_v1,
                "noise_gradient_is_group_sum": _check_gda_noise_gradient_is_group_sum,
                "matches_vllm_grouped_diff_attn": _check_gda_matches_vllm_transcription},
    ),
)


# --------------------------------------------------------------------------------------------
# DINT


def dint_attention_forward(x, params, *, num_heads: int, num_kv_heads: int | None = None,
                           integral: str = "auto", integral_source: str = "A1", **v1_config):
    r"""DINT attention (Cang, Liu, Zhang, Zhao, Shi, "DINT Transformer", EMNLP 2025, arXiv 2501.17486).

    [paper, abstract only — the method section could not be retrieved here, no official code]
    DIFF attention plus an *integral* term of "global importance scores" integrated into the
    attention matrix, with one unified λ so that every attention row sums to exactly 1 (DIFF's rows
    sum to $1-\lambda$):

    $$A = A_1 - \lambda A_2 + \lambda G,\qquad G = C A_{\text{src}},$$

    where $C$ averages over query rows. [third-party code] The only implementation found,
    ``jwliao1209/Differential-FT-Transformer`` ``src/models/layers.py`` (commit 5e94ec8, ``MultiheadDintAttention``,
    a bidirectional tabular model that cites the paper), computes exactly the ``integral="all"``,
    ``integral_source="A1"`` form: ``a3 = attn_weights[:, :, 0].mean(dim=2)[:, :, None]`` (the column
    mean of $A_1$ over the queries) and ``attn_weights = lam * a3 + a1 - lam * a2``. [recon, unverified]
    the causal average and the ``"A2"`` source:

    ``integral="all"`` (bidirectional) $G_{ij} = \frac1N\sum_{i'}A_{1,i'j}$ (every row is the column
    mean of $A_1$), ``"causal"`` $G_{ij} = \frac1{i+1}\sum_{i'\le i}A_{1,i'j}$ (running mean over earlier
    queries, keeps causality — how the paper's causal language models avoid future leakage is not
    known here); ``"auto"`` picks ``"causal"`` when the layer is causal. ``integral_source="A2"``
    integrates $A_2$ instead. Rows of $G$ sum to 1, so rows of $A$ sum to $1-\lambda+\lambda = 1$ (rows
    of fully masked queries excepted). Then as V1: $\mathrm{head} = (1-\lambda_{init})\,\mathrm{RMSNorm}(AV)$,
    $Y = [\mathrm{head}_i]W_o$ (the third-party code uses GroupNorm and no λ-init factor unless
    ``use_rms_norm``; not adopted).

    Since $GV = C(A_1V)$, the term costs one row average of $O_1 = A_1V$ (no $N\times N$ product).

    Parameters
    ----------
    x, params, num_heads, num_kv_heads
        As :func:`refattn.attention.differential.diff_attention_v1_forward` (same params keys).
    integral : {"auto", "causal", "all"}
    integral_source : {"A1", "A2"}
    **v1_config
        Every other keyword of ``diff_attention_v1_forward`` (``depth``, ``lambda_init``, masks,
        RoPE, pairing, ``subln*``, ``rescale``).

    Notes
    -----
    Backward: V1's with $O = O_1 - \lambda O_2 + \lambda C O_a$: $dO_a \mathrel{+}= \lambda C^\top G$
    ($C^\top$: a reverse cumulative sum of $G_i/(i+1)$ for ``"causal"``, the column mean for
    ``"all"``) and $d\lambda \mathrel{+}= \langle G, C O_a\rangle$.
    """
    from .._checks import check_choice

    check_choice(integral, "integral", ("auto", "causal", "all"))
    check_choice(integral_source, "integral_source", ("A1", "A2"))
    if "is_causal" in v1_config and v1_config["is_causal"] is not None and not isinstance(
            v1_config["is_causal"], (bool, np.bool_)):
        raise TypeError(f"is_causal must be a bool or None; got {type(v1_config['is_causal']).__name__}")
    causal = v1_config.get("is_causal")
    if causal is None:
        causal = v1_config.get("attn_mask") is None
    kind = ("causal" if causal else "all") if integral == "auto" else integral
    cfg = dict(depth=None, lambda_init=None, lambda_init_convention="unilm", attn_mask=None, is_causal=None,
               causal_alignment="bottom_right", rel_pos=None, rope_interleaved=True, scale=None,
               pairing="adjacent", gqa_pairing="naive", subln="rms", subln_affine=True, subln_eps=1e-5,
               rescale=True)
    unknown = sorted(set(v1_config) - set(cfg))
    if unknown:
        raise TypeError(f"dint_attention_forward got unexpected keywords {unknown}; expected {sorted(cfg)}")
    cfg.update(v1_config)
    return v1_layer_forward(x, params, num_heads=num_heads, num_kv_heads=num_kv_heads,
                                 integral=(kind, integral_source), **cfg)


def dint_attention_backward(dout, cache):
    """Gradient of :func:`dint_attention_forward` (V1's chain with the integral term, see its Notes)."""
    return v1_generic_backward(dout, cache)


def dint_attention(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`dint_attention_forward`."""
    return dint_attention_forward(x, params, **config)[0]


def _sample_dint(rng, size):
    s = sample_v1(rng, size)
    s.config["integral"] = str(rng.choice(["auto", "all"]))
    s.config["integral_source"] = str(rng.choice(["A1", "A2"]))
    return s


def _check_dint_rows_sum_to_one(rng):
    B, H, n, d = 2, 3, 5, 2
    q1, q2, k1, k2 = rng.standard_normal((4, B, H, n, d))
    lam = rng.standard_normal((B, H, 1))
    err = 0.0
    keep = np.tril(np.ones((n, n), bool))
    for kind, mask in (("causal", keep), ("all", None), ("all", keep)):
        for src in ("A1", "A2"):
            out, _ = expanded_core_forward(q1, k1, q2, k2, np.ones((B, H, n, 1)), lam, mask, 0.7, (kind, src))
            err = max(err, float(np.abs(out - 1.0).max()))
    assert err < 1e-13, f"DINT rows do not sum to 1 ({err})"
    return err


def _check_dint_lambda_zero_is_v1(rng):
    s, P, _ = v1_sample_lambda_zero(rng)
    a = dint_attention(**s.inputs, params=P, **s.config)
    b = diff_attention_v1_forward(**s.inputs, params=P, **s.config)[0]
    err = float(np.abs(a - b).max())
    assert err < 1e-12, f"DINT with lambda = 0 differs from V1 by {err}"
    return err


def _check_dint_causal(rng):
    s = _sample_dint(rng, "small")
    s.config["integral"] = "causal"
    x = s.inputs["x"]
    out = dint_attention(x, s.params, **s.config)
    x2 = x.copy()
    x2[:, -1] += 1.0
    err = float(np.abs(dint_attention(x2, s.params, **s.config)[:, :-1] - out[:, :-1]).max())
    assert err < 1e-13, f"future token leaks through the causal integral ({err})"
    return err


register(
    Mechanism(
        slug="dint_attention", family="2-differential", tier="T1",
        title="DINT: differential-integral attention (row-normalised)",
        paper="Cang, Liu, Zhang, Zhao, Shi, 'DINT Transformer', EMNLP 2025, arXiv 2501.17486",
        forward=dint_attention_forward, backward=dint_attention_backward, sample=_sample_dint,
        docs="differential.md#dint_attention",
        checks={"rows_sum_to_one": _check_dint_rows_sum_to_one, "lambda_zero_is_v1": _check_dint_lambda_zero_is_v1,
                "causal_no_leakage": _check_dint_causal},
    ),
)


# --------------------------------------------------------------------------------------------
# DEX: differential operation on the output of pretrained softmax heads


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
    qw, vw, ow, fw = (np.shape(params[k]) for k in need)
    if len(qw) != 2 or qw[1] % H:
        raise ValueError(f"q_proj.weight must have shape (C, num_heads * d) with num_heads = {H}; got {qw}")
    if len(vw) != 2 or vw[1] % Hkv:
        raise ValueError(f"v_proj.weight must have shape (C, num_kv_heads * dv) with num_kv_heads = {Hkv}; got {vw}")
    if len(ow) != 2:
        raise ValueError(f"o_proj.weight must have shape (num_heads * dv, C_out); got {ow}")
    d, dv = qw[1] // H, vw[1] // Hkv
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


# --------------------------------------------------------------------------------------------
# Two-branch low-rank differential layers: DiffLoRA and Shared DIFF


def _lora_apply(x, A, B, s):
    xa = x @ A
    return s * (xa @ B), xa


def _lora_bwd(dy, x, xa, A, B, s):
    r"""$y = s\,(xA)B$: $dB = s\,(xA)^\top dy$, $dA = s\,x^\top(dy\,B^\top)$, $dx = s\,dy\,B^\top A^\top$."""
    r = A.shape[1]
    dyb = dy @ B.T
    dB = s * (xa.reshape(-1, r).T @ dy.reshape(-1, B.shape[1]))
    dA = s * (x.reshape(-1, A.shape[0]).T @ dyb.reshape(-1, r))
    return dA, dB, s * (dyb @ A.T)


_RESCALES = ("lambda_init", "lambda_with_norm", "none")


def _twobranch_forward(x, params, *, where, names, num_heads, num_kv_heads, negative_term, lora_scale,
                       lambda_mode, lambda_init_value, attn_mask, is_causal, causal_alignment, rel_pos,
                       rope_interleaved, scale, subln, subln_affine, subln_eps, rescale,
                       positive_term="base_lora"):
    r"""$Q_a = xW_q + s\,(xA_{q,a})B_{q,a}$ (and $K_a$), $V = xW_v$; the V1 head computation on
    $(Q_1, K_1, Q_2, K_2, V)$; $Y = ZW_o$. Branch 1 per ``positive_term``, branch 2 per
    ``negative_term``; ``rescale`` in :data:`_RESCALES` (``"lambda_with_norm"``: $\times(1-\lambda)$
    after the norm, none without a norm)."""
    from .._checks import check_choice, check_positive

    H = check_int(num_heads, "num_heads", minimum=1)
    Hkv = H if num_kv_heads is None else check_int(num_kv_heads, "num_kv_heads", minimum=1)
    if H % Hkv:
        raise ValueError(f"num_heads ({H}) must be a multiple of num_kv_heads ({Hkv})")
    check_choice(negative_term, "negative_term", ("base_lora", "lora_only", "full"))
    check_choice(positive_term, "positive_term", ("base_lora", "base"))
    check_choice(lambda_mode, "lambda_mode", ("fixed", "reparam"))
    check_choice(rescale, "rescale", _RESCALES)
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
            lora[a], saved[(t, a)] = _lora_apply(x, P[f"{t}.lora_A{a}"], P[f"{t}.lora_B{a}"], s)
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


def _twobranch_backward(dout, cache):
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
                dA, dB, dxa = _lora_bwd(dy, x, cache["saved"][(t, a)], P[f"{t}.lora_A{a}"], P[f"{t}.lora_B{a}"], s)
                grads[f"{t}.lora_A{a}"], grads[f"{t}.lora_B{a}"] = dA, dB
                dx = dx + dxa
        if mode == "full":
            dx = dx + linear_prefixed_vjp(grads, P, names[tag + "2"], dy2, x)
    grads["x"] = dx
    return grads


def difflora_forward(x, params, *, num_heads: int, lambda_init: float, num_kv_heads: int | None = None,
                     lambda_mode: str = "fixed", negative_term: str = "base_lora", positive_term: str = "base_lora",
                     lora_scale: float = 2.0, attn_mask=None, is_causal: bool = True,
                     causal_alignment: str = "bottom_right", rel_pos=None, rope_interleaved: bool = False,
                     scale=None, subln: str = "rms", subln_affine: bool = True, subln_eps: float = 1e-5,
                     rescale="lambda_init"):
    r"""DiffLoRA (Misrahi, Chirkova, Louis, Nikoulina, "DiffLoRA: Differential Low-Rank Adapters for
    Large Language Models", 2025, arXiv 2507.23588): differential attention on a pretrained model
    via low-rank adapters on both attention terms.

    [paper, abstract] Low-rank adapters on the positive and the negative attention term; LoRA-level
    parameter cost. The method section could not be retrieved here. [code] The first author's
    implementation, ``AlexandreMisrahi2005/bergen``
    ``models/generators/DiffTransformer/llama_lora_diff_transformer_model.py``
    (``LlamaLoraCustomDiffAttention`` / ``LlamaLoraDiffAttention``, eager path) and
    ``llama_lora_diff_transformer_config.py`` (commit 27a6bf1, ``LlamaLoraDiffTransformerConfig``),
    is followed; three stored versions of the model file were read (commits 85450b0, 26c5a58 and a
    third with the ``LlamaLoraCustomFlashDiffAttention2`` class). The base model's heads and head
    width are kept (no halving), $V = xW_v$ unchanged, $s$ = ``lora_scale`` (``lora_scaling =
    attention_lora_alpha / attention_lora_r``, config defaults 64/32 = 2):

    $$Q_1 = xW_q + s\,(xA_{q1})B_{q1},\qquad K_1 = xW_k + s\,(xA_{k1})B_{k1}$$

    (``positive_term="base"``: $Q_1 = xW_q$, $K_1 = xW_k$ — config ``lora_negative_term_only``), and the
    negative term per ``negative_term``: ``"base_lora"`` (default) $Q_2 = xW_q + s\,(xA_{q2})B_{q2}$
    (same for $K_2$), ``"lora_only"`` $Q_2 = s\,(xA_{q2})B_{q2}$ (``negative_term_lora_only``), ``"full"``
    $Q_2 = xW_{q2}$ (``negative_term_full_dim``, ``wq_2``/``wk_2`` → ``q2_proj.weight``/``k2_proj.weight``).
    RoPE rotate-half on all four (``apply_rotary_pos_emb``), ``repeat_kv`` GQA, scale $d^{-1/2}$, causal
    mask added to both score matrices, then

    $$O = \mathrm{rescale}\cdot\mathrm{RMSNorm}_d\bigl((A_1 - \lambda A_2)V\bigr)W_o,$$

    the per-head norm ``subln = LlamaRMSNorm(head_dim, eps=1e-5) if config.groupnorm`` (config default
    ``groupnorm=True``: ``subln="rms"``). λ is fixed (``learn_lambda=False``, the config default:
    ``lambda_init_value`` = ``diff_attn_lambda`` serves as λ and as $\lambda_{init}$,
    ``lambda_mode="fixed"``) or V1's re-parameterisation (``learn_lambda=True``: ``lambda_mode="reparam"``,
    params ``lambda_q1..k2``; the code's $\lambda_{init}$ is ``lambda_init_fn(layer_idx)`` of unilm, or
    ``diff_attn_lambda`` when non-zero — pass it as ``lambda_init``). The output factor differs
    between the stored versions:

    * ``rescale="lambda_init"`` (default; commit 85450b0 and the version with the flash class):
      ``attn_output = attn_output * (1 - self.lambda_init)`` after the optional norm, applied even
      without a norm — with $B = 0$ a converted model then outputs $(1-\lambda_{init})(1-\lambda)$ times
      the pretrained attention and does not reproduce the pretrained model at init;
    * ``rescale="lambda_with_norm"`` (commit 26c5a58): ``attn_output * (1 - lambda_full)`` inside the
      ``if self.subln is not None`` branch only — the factor uses the current λ (a parameter in
      ``"reparam"`` mode, whose gradient includes $-\langle G, \mathrm{RMSNorm}(\cdot)\rangle$) and is absent
      without a norm;
    * ``rescale="none"``. ``True``/``False`` are accepted for ``"lambda_init"``/``"none"``.

    Not provided (options of that code outside the attention map): ``relu_on_differential``
    ($\mathrm{ReLU}(A_1-\lambda A_2)$), adapters on $V$ and on the output (``lora_v``, ``lora_o``),
    dropout.

    Parameters
    ----------
    x : array (B.., N, C)
    params : dict
        Llama names: ``q_proj.weight (C, Hd)``, ``k_proj.weight (C, H_{kv}d)``,
        ``v_proj.weight (C, H_{kv}d)``, ``o_proj.weight (Hd, C_out)``; adapters in ``(in, out)``
        orientation ``q_proj.lora_A1 (C, r)``, ``q_proj.lora_B1 (r, Hd)``, ``..._A2``, ``..._B2``
        and the same for ``k_proj`` (upstream ``wq_lora_A1.weight (r, in)``, ``wq_lora_B1.weight
        (out, r)``: pass their transposes); no ``*_A1/_B1`` for ``positive_term="base"``;
        ``q2_proj.weight``, ``k2_proj.weight`` for ``negative_term="full"``;
        ``lambda_q1..lambda_k2 (d,)`` for ``lambda_mode="reparam"``; ``subln.weight (d,)`` for
        ``subln="rms"`` with ``subln_affine``.
    num_heads, num_kv_heads, lambda_init
        Base model heads; λ (fixed) or $\lambda_{init}$ (reparam). Required (config default
        ``diff_attn_lambda=0.0`` would make the layer plain attention).
    negative_term, positive_term, lambda_mode, lora_scale
        See above.
    attn_mask, is_causal, causal_alignment, rel_pos, rope_interleaved, scale
        As the base Llama attention: causal, rotate-half RoPE, $d^{-1/2}$.
    subln, subln_affine, subln_eps, rescale
        Per-head norm (default ``"rms"``, eps $10^{-5}$) and the output factor (above).

    Notes
    -----
    Backward: V1's head chain (:func:`refattn.attention.differential.layer.diff_heads_backward`), GQA scatter,
    then per branch $dW_q \mathrel{+}= x^\top dQ_a$ (both branches in ``"base_lora"``),
    $dB_{qa} = s\,(xA_{qa})^\top dQ_a$, $dA_{qa} = s\,x^\top dQ_aB_{qa}^\top$,
    $dx \mathrel{+}= dQ_a W_q^\top + s\,dQ_aB_{qa}^\top A_{qa}^\top$ (same for $K$). With
    ``"lambda_with_norm"`` ($Y = (1-\lambda)\,N W_o$): $dN = (1-\lambda)\,dN_{out}$ and
    $d\lambda \mathrel{+}= -\langle dN_{out}, N\rangle$.
    """
    if isinstance(lambda_init, (bool, np.bool_)) or not isinstance(lambda_init, (int, float, np.number)):
        raise TypeError(f"lambda_init must be a real number; got {type(lambda_init).__name__}")
    if not np.isfinite(lambda_init):
        raise ValueError(f"lambda_init must be finite; got {lambda_init}")
    if isinstance(rescale, (bool, np.bool_)):
        rescale = "lambda_init" if rescale else "none"
    return _twobranch_forward(
        x, params, where="difflora", names=_LLAMA_NAMES, num_heads=num_heads, num_kv_heads=num_kv_heads,
        negative_term=negative_term, positive_term=positive_term, lora_scale=lora_scale, lambda_mode=lambda_mode,
        lambda_init_value=float(lambda_init), attn_mask=attn_mask, is_causal=is_causal,
        causal_alignment=causal_alignment, rel_pos=rel_pos, rope_interleaved=rope_interleaved, scale=scale,
        subln=subln, subln_affine=subln_affine, subln_eps=subln_eps, rescale=rescale)


def difflora_backward(dout, cache):
    """Gradient of :func:`difflora_forward` (derivation in its Notes): ``x`` and every params key."""
    return _twobranch_backward(dout, cache)


def difflora(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`difflora_forward`."""
    return difflora_forward(x, params, **config)[0]


def _bool_rescale(rescale):
    if not isinstance(rescale, (bool, np.bool_)):
        raise TypeError(f"rescale must be a bool; got {type(rescale).__name__}")
    return "lambda_init" if rescale else "none"


_LLAMA_NAMES = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "q2": "q2_proj", "k2": "k2_proj"}
_SHARED_NAMES = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "out_proj", "q2": "q2_proj", "k2": "k2_proj"}


def shared_diff_attention_forward(x, params, *, num_heads: int, num_kv_heads: int | None = None,
                                  depth: int | None = None, lambda_init: float | None = None,
                                  lambda_init_convention: str = "unilm", lora_scale: float = 1.0,
                                  attn_mask=None, is_causal: bool | None = None,
                                  causal_alignment: str = "bottom_right", rel_pos=None,
                                  rope_interleaved: bool = True, scale=None, subln: str = "rms",
                                  subln_affine: bool = True, subln_eps: float = 1e-5, rescale: bool = True):
    r"""Shared DIFF Transformer (Cang, Liu, Zhang et al., "Shared DIFF Transformer", 2025, arXiv 2501.17900).

    [paper, abstracts of arXiv v1 and v2 only — the method section could not be retrieved here,
    and no code, official or third-party, was found] A shared base matrix models global patterns
    and low-rank updates add task-specific flexibility ("differential amplifier" design), reducing
    DIFF's parameter redundancy (v2: also "unstable noise extraction"). [recon, unverified] (the
    catalogue's reading): the two query/key branches of DIFF V1 share a base and differ by rank-$r$
    updates,

    $$W_{Q,a} = W_Q^{sh} + s\,A_{Q,a}B_{Q,a},\qquad W_{K,a} = W_K^{sh} + s\,A_{K,a}B_{K,a},\qquad a\in\{1,2\},$$

    then exactly ``diff_attention_v1`` (λ re-parameterisation with $\lambda_{init}(\text{depth})$,
    per-head RMSNorm over the value width, $(1-\lambda_{init})$, interleaved RoPE, causal by
    unilm's rule). Unverified: the ranks, whether $V$ (and $W_o$) are shared or get updates, the
    λ form, and whether the updates are independent per branch — a "differential amplifier"
    reading with opposite updates ($W_{Q,1,2} = W_Q^{sh} \pm \Delta$) is the special case
    $A_{Q,2}B_{Q,2} = -A_{Q,1}B_{Q,1}$ of this parameterisation. Head $i$ uses $Q_{1,i}, Q_{2,i}$ and kv
    head $\lfloor i/n_{rep}\rfloor$ of $K_1, K_2, V$
    (V1's ``gqa_pairing="flash"``: each branch is its own projection).

    Parameters
    ----------
    x : array (B.., N, C)
    params : dict
        ``q_proj.weight (C, Hd)`` = $W_Q^{sh}$, ``k_proj.weight (C, H_{kv}d)``, ``v_proj.weight
        (C, H_{kv}d_v)`` (V1: $d_v = 2d$), ``out_proj.weight (Hd_v, C_out)``, low-rank factors
        ``q_proj.lora_A1 (C, r)``, ``q_proj.lora_B1 (r, Hd)``, ``..._A2``, ``..._B2`` (and for
        ``k_proj``), ``lambda_q1..lambda_k2 (d,)``, ``subln.weight (d_v,)``.
    lora_scale : float
        $s$ (1 in the paper's form).
    num_heads, num_kv_heads, depth, lambda_init, lambda_init_convention, attn_mask, is_causal, causal_alignment, rel_pos, rope_interleaved, scale, subln, subln_affine, subln_eps, rescale
        As :func:`refattn.attention.differential.diff_attention_v1_forward`.

    Notes
    -----
    Backward: V1's chain; the shared base accumulates both branches, $dW^{sh} = dW_{Q,1} + dW_{Q,2}$,
    and each low-rank pair gets $dB = s(xA)^\top dQ_a$, $dA = s\,x^\top dQ_aB^\top$.
    """
    lam0 = resolve_lambda_init(depth, lambda_init, lambda_init_convention)
    return _twobranch_forward(
        x, params, where="shared_diff_attention", names=_SHARED_NAMES, num_heads=num_heads,
        num_kv_heads=num_kv_heads, negative_term="base_lora", lora_scale=lora_scale, lambda_mode="reparam",
        lambda_init_value=lam0, attn_mask=attn_mask, is_causal=is_causal, causal_alignment=causal_alignment,
        rel_pos=rel_pos, rope_interleaved=rope_interleaved, scale=scale, subln=subln, subln_affine=subln_affine,
        subln_eps=subln_eps, rescale=_bool_rescale(rescale))


def shared_diff_attention_backward(dout, cache):
    """Gradient of :func:`shared_diff_attention_forward` (V1's chain; see its Notes)."""
    return _twobranch_backward(dout, cache)


def shared_diff_attention(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`shared_diff_attention_forward`."""
    return shared_diff_attention_forward(x, params, **config)[0]


def _twobranch_params(rng, C, H, Hkv, d, dv, r, names, *, negative_term="base_lora", reparam=False,
                      norm=False, lambda_init=0.5, zero_B=False, positive_term="base_lora"):
    P = {f"{names['q']}.weight": rng.standard_normal((C, H * d)) / np.sqrt(C),
         f"{names['k']}.weight": rng.standard_normal((C, Hkv * d)) / np.sqrt(C),
         f"{names['v']}.weight": rng.standard_normal((C, Hkv * dv)) / np.sqrt(C),
         f"{names['o']}.weight": rng.standard_normal((H * dv, C)) / np.sqrt(H * dv)}
    branches = tuple(a for a, on in (("1", positive_term == "base_lora"), ("2", negative_term != "full")) if on)
    for t, w in ((names["q"], H * d), (names["k"], Hkv * d)):
        for a in branches:
            P[f"{t}.lora_A{a}"] = rng.standard_normal((C, r)) / np.sqrt(C)
            P[f"{t}.lora_B{a}"] = np.zeros((r, w)) if zero_B else 0.5 * rng.standard_normal((r, w))
    if negative_term == "full":
        P[f"{names['q2']}.weight"] = rng.standard_normal((C, H * d)) / np.sqrt(C)
        P[f"{names['k2']}.weight"] = rng.standard_normal((C, Hkv * d)) / np.sqrt(C)
    if reparam:
        P.update(draw_lambda_vectors(rng, d, lambda_init))
    if norm:
        P["subln.weight"] = 1.0 + 0.2 * rng.standard_normal(dv)
    return P


def _sample_difflora(rng, size):
    if size == "tiny":
        B, n, C, H, d, r = 2, int(rng.integers(2, 4)), 3, 2, 2, 1
    else:
        B, n, C, H, d, r = 2, int(rng.integers(4, 7)), 6, 4, 2, 2
    Hkv = int(rng.choice([1, 2]))
    mode = str(rng.choice(["base_lora", "lora_only", "full"]))
    positive = str(rng.choice(["base_lora", "base"])) if mode != "full" else "base_lora"
    lam_mode = str(rng.choice(["fixed", "reparam"]))
    subln = str(rng.choice(["rms", "none"]))
    rescale = str(rng.choice(["lambda_init", "lambda_with_norm", "none"]))
    P = _twobranch_params(rng, C, H, Hkv, d, d, r, _LLAMA_NAMES, negative_term=mode, positive_term=positive,
                          reparam=lam_mode == "reparam", lambda_init=0.4, norm=subln == "rms")
    return Sample(inputs={"x": rng.standard_normal((B, n, C))}, params=P,
                  config={"num_heads": H, "num_kv_heads": Hkv, "lambda_init": 0.4, "lambda_mode": lam_mode,
                          "negative_term": mode, "positive_term": positive, "lora_scale": 2.0, "subln": subln,
                          "rescale": rescale, "rel_pos": rope_tables(n, d)})


def _sample_shared(rng, size):
    if size == "tiny":
        B, n, C, H, d, r = 2, int(rng.integers(2, 4)), 3, 2, 1, 1
    else:
        B, n, C, H, d, r = 2, int(rng.integers(4, 7)), 6, 2, 2, 2
    Hkv = int(rng.choice([1, H]))
    depth = int(rng.integers(0, 6))
    P = _twobranch_params(rng, C, H, Hkv, d, 2 * d, r, _SHARED_NAMES, reparam=True, norm=True,
                          lambda_init=lambda_init_fn(depth))
    cfg = {"num_heads": H, "num_kv_heads": Hkv, "depth": depth}
    if d % 2 == 0:
        cfg["rel_pos"] = rope_tables(n, d)
    return Sample(inputs={"x": rng.standard_normal((B, n, C))}, params=P, config=cfg)


def _check_difflora_init(rng):
    # B = 0 (default mode, fixed lambda = lambda_init, no norm, rescale "lambda_init"):
    # (1 - lambda_init)^2 x the base attention.
    B, n, C, H, Hkv, d = 2, 5, 6, 4, 2, 2
    x = rng.standard_normal((B, n, C))
    P = _twobranch_params(rng, C, H, Hkv, d, d, 2, _LLAMA_NAMES, zero_B=True)
    lam0 = 0.3
    out = difflora(x, P, num_heads=H, num_kv_heads=Hkv, lambda_init=lam0, subln="none")
    q = split_heads(x @ P["q_proj.weight"], H, d)
    k = split_heads(x @ P["k_proj.weight"], Hkv, d)
    v = split_heads(x @ P["v_proj.weight"], Hkv, d)
    base = merge_heads(sdpa_forward(q, k, v, is_causal=True)[0]) @ P["o_proj.weight"]
    err = float(np.abs(out - (1 - lam0) ** 2 * base).max())
    assert err < 1e-12, f"DiffLoRA at init is not (1 - lambda_init)^2 x the base attention ({err})"
    return err


def _v1_from_shared(P, H, Hkv, d, s):
    """V1 params (adjacent half-heads, one q_proj) equivalent to Shared DIFF params."""
    Q = {k: v for k, v in P.items() if "lora" not in k}
    for t, heads in (("q_proj", H), ("k_proj", Hkv)):
        w = [P[f"{t}.weight"] + s * P[f"{t}.lora_A{a}"] @ P[f"{t}.lora_B{a}"] for a in ("1", "2")]
        C = w[0].shape[0]
        Q[f"{t}.weight"] = np.stack([w[0].reshape(C, heads, d), w[1].reshape(C, heads, d)], axis=2).reshape(C, -1)
    return Q


def _check_shared_is_v1(rng):
    # Shared DIFF == V1 (flash GQA pairing) with W_{Q,a} = W_sh + s A_a B_a; dW_sh = dW_{Q,1} + dW_{Q,2}.
    s = _sample_shared(rng, "small")
    x, P, cfg = s.inputs["x"], s.params, s.config
    H, Hkv = cfg["num_heads"], cfg["num_kv_heads"]
    d = P["q_proj.weight"].shape[1] // H
    out, cache = shared_diff_attention_forward(x, P, lora_scale=1.5, **cfg)
    Q = _v1_from_shared(P, H, Hkv, d, 1.5)
    ref, vcache = diff_attention_v1_forward(x, Q, gqa_pairing="flash", **cfg)
    err = float(np.abs(out - ref).max())
    g = rng.standard_normal(out.shape)
    ga, gv = shared_diff_attention_backward(g, cache), diff_attention_v1_backward(g, vcache)
    for t, heads in (("q_proj", H), ("k_proj", Hkv)):
        dw = gv[f"{t}.weight"].reshape(-1, heads, 2, d)
        err = max(err, float(np.abs(ga[f"{t}.weight"] - (dw[:, :, 0] + dw[:, :, 1]).reshape(-1, heads * d)).max()))
    for key in ("x", "v_proj.weight", "out_proj.weight", "subln.weight", *V1_LAMBDA_KEYS):
        err = max(err, float(np.abs(ga[key] - gv[key]).max()))
    assert err < 1e-11, f"Shared DIFF vs V1 with merged weights: {err}"
    return err


register(
    Mechanism(
        slug="difflora", family="2-differential", tier="T1",
        title="DiffLoRA: differential attention via LoRA adapters on both terms",
        paper="Misrahi, Chirkova, Louis, Nikoulina, 'DiffLoRA: Differential Low-Rank Adapters for Large "
              "Language Models', 2025, arXiv 2507.23588",
        forward=difflora_forward, backward=difflora_backward, sample=_sample_difflora,
        docs="differential.md#difflora", checks={"init_is_scaled_base_attention": _check_difflora_init},
    ),
    Mechanism(
        slug="shared_diff_attention", family="2-differential", tier="T1",
        title="Shared DIFF Transformer (shared base + low-rank updates)",
        paper="Cang, Liu, Zhang et al., 'Shared DIFF Transformer', 2025, arXiv 2501.17900",
        forward=shared_diff_attention_forward, backward=shared_diff_attention_backward, sample=_sample_shared,
        docs="differential.md#shared_diff_attention", checks={"equals_v1_with_merged_weights": _check_shared_is_v1},
    ),
)


# --------------------------------------------------------------------------------------------
# Differential cross-attention


def differential_cross_attention_forward(q1, k1, v1, q2, k2, v2, lam, *, attn_mask=None, attn_mask2=None,
                                         scale=None, kv_group_map: str = "contiguous", combine: str = "output"):
    r"""Differential cross-attention with masked or external keys (FDA, STR decoders, GSRA).

    Papers: Tian, Lin, Zhao, Shen, "Function-word De-Attention" (FDA), 2025, arXiv 2512.07222;
    a scene-text-recognition decoder with differential cross-attention (no code found);
    PhaSR's GSRA (geometric–semantic rectification attention). Two combinations:

    ``combine="output"`` (default; the generic difference of two attentions):

    $$O = \mathrm{softmax}(sQ_1K_1^\top + M_1)V_1 - \lambda\odot\mathrm{softmax}(sQ_2K_2^\top + M_2)V_2 .$$

    [code] It is the differential term of PhaSR's GSRA, ``ming053l/PhaSR`` ``model.py`` (commit c2686d7,
    ``DifferentialWindowAttention.forward``): one query, ``attn_diff = attn_sem - lambda_val * attn_geo``,
    ``x_diff = attn_diff @ v_sem`` — i.e. ``q2 = q1``, ``k1 = k_sem``, ``k2 = k_geo``, ``v2 = v1 = v_sem``,
    the shared relative-position bias as ``attn_mask = attn_mask2``; that layer then adds
    ``attn_geo @ v_geo``, applies ``LayerNorm(dim)`` over all heads, ``* (1 - lambda_init)`` and a
    projection, with ``lambda_val = sigmoid(lambda_q1 * lambda_k1) + lambda_init`` (compose those
    around this op). The V1-style STR form (two query projections, $K_1, K_2$ over one memory,
    shared $V$) is :func:`refattn.attention.differential.diff_attention_core_forward` with $N \ne M$
    [recon, unverified: no STR code was found]. A second memory of its own length $M_2$ (and kv heads)
    is allowed.

    ``combine="fda"`` [code] FDA's released code, ``michaeltian108/FDA``
    ``finetune/models/xbert_FDA.py`` (commit 3346ed8, ``BertSelfAttention.forward``, the branch "Apply
    Function-word De-Attention (FDA) at the selected fusion layers"): the function-word branch has its
    own *queries* (``fda_query_layer = query(fda_hidden_states)``) against the same keys; both score
    matrices are normalised over the keys (``ver``, ``Softmax(dim=-1)``) *and* over the queries
    (``hor``, ``Softmax(dim=-2)``); the subtraction is on the maps with a ReLU, and the two are
    combined by an elementwise minimum (``torch.clamp_max(attention_probs_hor, attention_probs_ver)``):

    $$A = \min\bigl(\mathrm{ReLU}(P^{q}_1 - \lambda P^{q}_2),\ \mathrm{ReLU}(P^{k}_1 - \lambda P^{k}_2)\bigr),\qquad O = AV_1,$$

    $P^{k}_a = \mathrm{softmax}_{\text{keys}}(S_a)$, $P^{q}_a = \mathrm{softmax}_{\text{queries}}(S_a)$,
    $S_a = sQ_aK_a^\top + M_a$. Upstream λ is ``self.gate`` (a scalar initialised to ``config.lbd``)
    times a head mask (FDA on the first 6 of 12 heads, ``mask[:, 6:] = 0``): pass ``lam`` of shape
    ``(H, 1)`` with zeros on the other heads (those heads still get $\min(P^q_1, P^k_1)$, as upstream).
    ``k2`` must have ``k1``'s shape (upstream ``k2 = k1``); ``v2`` is unused (its gradient is 0).
    Fully masked rows/columns give 0 (upstream's additive ``-10000`` key-padding mask leaves
    $P^q$ of a padded column unchanged, but $P^k = 0$ there makes $A = 0$ either way).

    Parameters
    ----------
    q1, q2 : array (B.., H, N, d)
    k1, v1 : arrays (B.., Hkv, M1, d) and (B.., Hkv, M1, dv)
    k2, v2 : arrays (B.., Hkv2, M2, d) and (B.., Hkv2, M2, dv)
    lam : array broadcastable to (B.., H, N), at least 1-d
    attn_mask, attn_mask2 : bool (True = keep) or additive masks of branch 1 / branch 2,
        broadcastable to ``(B.., H, N, M1)`` / ``(B.., H, N, M2)``. A query whose branch-2 row is
        fully masked (an empty subset) gets 0 from that branch, i.e. plain cross-attention.
    scale : float, optional
        Default $d^{-1/2}$.
    kv_group_map : {"contiguous", "strided"}
        GQA map of both branches (as :func:`refattn.attention.softmax.sdpa_forward`).
    combine : {"output", "fda"}

    Notes
    -----
    Backward (``"output"``): two independent SDPA backwards with $dO_1 = G$, $dO_2 = -\lambda G$, and
    $d\lambda = -\sum_c G_{\cdot c}O_{2,\cdot c}$ summed to λ's shape. (``"fda"``): $dA = GV_1^\top$,
    $dV_1 = A^\top G$; the minimum routes $dA$ to the query-normalised term where
    $A^q \le A^k$ (``clamp_max``'s rule) and to the key-normalised one elsewhere; the ReLUs pass it where
    their argument is $> 0$, giving $dX^q, dX^k$; $dP^{q}_1 = dX^q$, $dP^q_2 = -\lambda dX^q$ (same for $k$),
    $d\lambda = -\sum_m (dX^q P^q_2 + dX^k P^k_2)$; softmax VJPs along the keys for $P^k$ and along the
    queries for $P^q$ add up to $dS_a$; $dQ_a = s\,dS_aK_a$, $dK_a = s\,dS_a^\top Q_a$ (summed over each
    kv group).
    """
    from .._checks import check_choice

    check_choice(combine, "combine", ("output", "fda"))
    q1 = as_float(q1, "q1", min_ndim=4)
    q2 = as_float(q2, "q2", min_ndim=4)
    k1, v1 = as_float(k1, "k1", min_ndim=4), as_float(v1, "v1", min_ndim=4)
    k2, v2 = as_float(k2, "k2", min_ndim=4), as_float(v2, "v2", min_ndim=4)
    if q2.shape != q1.shape:
        raise ValueError(f"q2 must have q1's shape {q1.shape}; got {q2.shape}")
    for name, k, v in (("1", k1, v1), ("2", k2, v2)):
        if k.ndim != q1.ndim or v.ndim != q1.ndim:
            raise ValueError(f"k{name} and v{name} must have q1's number of dimensions {q1.ndim}; got "
                             f"{k.shape} and {v.shape}")
        if k.shape[:-3] != q1.shape[:-3] or v.shape[:-3] != q1.shape[:-3]:
            raise ValueError(f"batch axes of k{name} {k.shape[:-3]} and v{name} {v.shape[:-3]} must equal q1's "
                             f"{q1.shape[:-3]}")
        if k.shape[-1] != q1.shape[-1]:
            raise ValueError(f"k{name} must have q1's head width d = {q1.shape[-1]}; got {k.shape[-1]}")
        if v.shape[-3:-1] != k.shape[-3:-1]:
            raise ValueError(f"v{name} must have k{name}'s heads and length {k.shape[-3:-1]}; got {v.shape[-3:-1]}")
        if q1.shape[-3] % k.shape[-3]:
            raise ValueError(f"the query heads H = {q1.shape[-3]} must be a multiple of k{name}'s heads {k.shape[-3]}")
    if v2.shape[-1] != v1.shape[-1]:
        raise ValueError(f"v2 must have v1's value width {v1.shape[-1]}; got {v2.shape[-1]}")
    if combine == "fda" and k2.shape != k1.shape:
        raise ValueError(f"combine='fda' subtracts the maps entrywise: k2 must have k1's shape {k1.shape}; "
                         f"got {k2.shape}")
    lam = as_float(lam, "lam", min_ndim=1, max_ndim=q1.ndim - 1)
    check_broadcastable("lam", lam.shape, q1.shape[:-1], "the (..., H, N) output rows of shape")
    m1 = as_bool_or_float_mask(attn_mask, "attn_mask")
    m2 = as_bool_or_float_mask(attn_mask2, "attn_mask2")
    if m1 is not None:
        check_broadcastable("attn_mask", m1.shape, q1.shape[:-1] + (k1.shape[-2],), "the scores (..., H, N, M1) of shape")
    if m2 is not None:
        check_broadcastable("attn_mask2", m2.shape, q1.shape[:-1] + (k2.shape[-2],), "the scores (..., H, N, M2) of shape")
    dt = compute_dtype(q1, q2, k1, v1, k2, v2, lam)
    q1, q2, k1, v1, k2, v2, lam = (a.astype(dt, copy=False) for a in (q1, q2, k1, v1, k2, v2, lam))
    if combine == "fda":
        return _fda_forward(q1, k1, v1, q2, k2, v2, lam, m1, m2, scale, kv_group_map)
    o1, c1 = sdpa_forward(q1, k1, v1, attn_mask=m1, scale=scale, kv_group_map=kv_group_map)
    o2, c2 = sdpa_forward(q2, k2, v2, attn_mask=m2, scale=scale, kv_group_map=kv_group_map)
    lam_b = np.broadcast_to(lam, o1.shape[:-1])[..., None]
    out = o1 - lam_b * o2
    return out, {"combine": "output", "c1": c1, "c2": c2, "o2": o2, "lam_b": lam_b, "lam_shape": lam.shape,
                 "out_shape": out.shape}


def _fda_forward(q1, k1, v1, q2, k2, v2, lam, m1, m2, scale, kv_group_map):
    from .._checks import check_positive
    from ..nn.softmax import apply_mask, softmax_lse

    H, Hkv = q1.shape[-3], k1.shape[-3]
    s = q1.shape[-1] ** -0.5 if scale is None else check_positive(scale, "scale")
    idx = kv_head_index(H, Hkv, kv_group_map)
    K1, K2, V = gather_heads(k1, idx), gather_heads(k2, idx), gather_heads(v1, idx)
    S1 = apply_mask(s * (q1 @ np.swapaxes(K1, -1, -2)), m1)
    S2 = apply_mask(s * (q2 @ np.swapaxes(K2, -1, -2)), m2)
    pk1, pq1 = softmax_lse(S1, -1)[0], softmax_lse(S1, -2)[0]
    pk2, pq2 = softmax_lse(S2, -1)[0], softmax_lse(S2, -2)[0]
    lam_b = np.broadcast_to(lam, q1.shape[:-1])[..., None]
    xq, xk = pq1 - lam_b * pq2, pk1 - lam_b * pk2
    aq, ak = np.maximum(xq, 0.0), np.maximum(xk, 0.0)
    sel_q = aq <= ak                      # torch.clamp_max(hor, ver): the gradient goes to hor where hor <= ver
    A = np.where(sel_q, aq, ak)
    out = A @ V
    cache = {"combine": "fda", "q1": q1, "q2": q2, "K1": K1, "K2": K2, "V": V, "A": A, "sel_q": sel_q,
             "xq": xq, "xk": xk, "pk1": pk1, "pq1": pq1, "pk2": pk2, "pq2": pq2, "lam_b": lam_b, "s": s,
             "idx": idx, "Hkv": Hkv, "v2_shape": v2.shape, "lam_shape": lam.shape, "out_shape": out.shape}
    return out, cache


def _fda_backward(g, c):
    from ..nn.softmax import softmax_vjp
    A, V, s, lam_b = c["A"], c["V"], c["s"], c["lam_b"]
    dA = g @ np.swapaxes(V, -1, -2)
    dV = np.swapaxes(A, -1, -2) @ g
    dxq = np.where(c["sel_q"], dA, 0.0) * (c["xq"] > 0)
    dxk = np.where(c["sel_q"], 0.0, dA) * (c["xk"] > 0)
    dlam = -(np.sum(dxq * c["pq2"], axis=-1) + np.sum(dxk * c["pk2"], axis=-1))
    dS1 = softmax_vjp(c["pk1"], dxk, -1) + softmax_vjp(c["pq1"], dxq, -2)
    dS2 = softmax_vjp(c["pk2"], -lam_b * dxk, -1) + softmax_vjp(c["pq2"], -lam_b * dxq, -2)
    idx, Hkv = c["idx"], c["Hkv"]
    return {"q1": s * (dS1 @ c["K1"]), "q2": s * (dS2 @ c["K2"]),
            "k1": scatter_heads(s * (np.swapaxes(dS1, -1, -2) @ c["q1"]), idx, Hkv),
            "k2": scatter_heads(s * (np.swapaxes(dS2, -1, -2) @ c["q2"]), idx, Hkv),
            "v1": scatter_heads(dV, idx, Hkv), "v2": np.zeros(c["v2_shape"], dtype=g.dtype),
            "lam": sum_to_shape(dlam, c["lam_shape"])}


def differential_cross_attention_backward(dout, cache):
    """Gradient of :func:`differential_cross_attention_forward`: ``q1, k1, v1, q2, k2, v2, lam``."""
    fda = cache["combine"] == "fda"
    g = as_dout(dout, cache["out_shape"], (cache["A"] if fda else cache["o2"]).dtype)
    if fda:
        return _fda_backward(g, cache)
    g1 = sdpa_backward(g, cache["c1"])
    g2 = sdpa_backward(-cache["lam_b"] * g, cache["c2"])
    return {"q1": g1["q"], "k1": g1["k"], "v1": g1["v"], "q2": g2["q"], "k2": g2["k"], "v2": g2["v"],
            "lam": sum_to_shape(-np.sum(g * cache["o2"], axis=-1), cache["lam_shape"])}


def differential_cross_attention(q1, k1, v1, q2, k2, v2, lam, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`differential_cross_attention_forward`."""
    return differential_cross_attention_forward(q1, k1, v1, q2, k2, v2, lam, **config)[0]


def _sample_cross(rng, size):
    if size == "tiny":
        B, H, Hkv, n, m1, m2, d, dv = 2, 2, 1, int(rng.integers(2, 4)), int(rng.integers(2, 4)), 2, 2, 2
    else:
        B, H, Hkv, n, m1, m2, d, dv = 2, 4, 2, int(rng.integers(3, 6)), int(rng.integers(4, 8)), 3, 3, 4
    combine = str(rng.choice(["output", "fda"]))
    if combine == "fda":
        m2 = m1
    q1, q2 = rng.standard_normal((2, B, H, n, d))
    keep1 = rng.random((B, 1, n, m1)) > 0.3
    keep1[..., 0] = True
    keep2 = rng.random((B, 1, n, m2)) > 0.3
    cfg = {"attn_mask": keep1, "attn_mask2": keep2}
    if combine == "fda":
        cfg["combine"] = "fda"
    return Sample(inputs={"q1": q1, "k1": rng.standard_normal((B, Hkv, m1, d)),
                          "v1": rng.standard_normal((B, Hkv, m1, dv)), "q2": q2,
                          "k2": rng.standard_normal((B, Hkv, m2, d)), "v2": rng.standard_normal((B, Hkv, m2, dv)),
                          "lam": 0.5 + 0.3 * rng.standard_normal((B, H, 1))},
                  config=cfg)


def _check_cross_identities(rng):
    s = _sample_cross(rng, "small")
    i = s.inputs
    plain = sdpa_forward(i["q1"], i["k1"], i["v1"], attn_mask=s.config["attn_mask"])[0]
    # empty branch-2 subset: branch 2 contributes 0, the result is plain cross-attention
    fda = differential_cross_attention(i["q1"], i["k1"], i["v1"], i["q2"], i["k1"], i["v1"], i["lam"],
                                       attn_mask=s.config["attn_mask"],
                                       attn_mask2=np.zeros(i["k1"].shape[-2], bool))
    err = float(np.abs(fda - plain).max())
    # identical branches with lambda = 1 cancel exactly
    same = differential_cross_attention(i["q1"], i["k1"], i["v1"], i["q1"], i["k1"], i["v1"], np.ones(1),
                                        attn_mask=s.config["attn_mask"], attn_mask2=s.config["attn_mask"])
    err = max(err, float(np.abs(same).max()))
    # shared memory and values: the V1 core on cross-attention lengths
    from .differential.core import diff_attention_core

    core = diff_attention_core(i["q1"], i["k1"], i["q2"], i["k1"] * 0.5, i["v1"], i["lam"])
    cross = differential_cross_attention(i["q1"], i["k1"], i["v1"], i["q2"], i["k1"] * 0.5, i["v1"], i["lam"])
    err = max(err, float(np.abs(core - cross).max()))
    # FDA: identical branches with lambda = 1 give A = 0; lambda = 0 gives min(P^q, P^k) (upstream's non-FDA heads)
    m = s.config["attn_mask"]
    zero = differential_cross_attention(i["q1"], i["k1"], i["v1"], i["q1"], i["k1"], i["v1"], np.ones(1),
                                        attn_mask=m, attn_mask2=m, combine="fda")
    err = max(err, float(np.abs(zero).max()))
    from ..nn.softmax import apply_mask, softmax_lse

    H, Hkv = i["q1"].shape[-3], i["k1"].shape[-3]
    K = np.repeat(i["k1"], H // Hkv, axis=-3)
    V = np.repeat(i["v1"], H // Hkv, axis=-3)
    S = apply_mask(i["q1"] @ np.swapaxes(K, -1, -2) * i["q1"].shape[-1] ** -0.5, m)
    ref = np.minimum(softmax_lse(S, -1)[0], softmax_lse(S, -2)[0]) @ V
    got = differential_cross_attention(i["q1"], i["k1"], i["v1"], i["q2"], i["k1"], i["v1"], np.zeros(1),
                                       attn_mask=m, combine="fda")
    err = max(err, float(np.abs(got - ref).max()))
    assert err < 1e-12, f"differential cross-attention identities fail ({err})"
    return err


register(
    Mechanism(
        slug="differential_cross_attention", family="2-differential", tier="T1",
        title="Differential cross-attention with masked or external keys (FDA, STR decoder, GSRA)",
        paper="Tian, Lin, Zhao, Shen, 'Function-word De-Attention', 2025, arXiv 2512.07222; STR decoder "
              "and PhaSR GSRA (see the docs)",
        forward=differential_cross_attention_forward, backward=differential_cross_attention_backward,
        sample=_sample_cross, docs="differential.md#differential_cross_attention",
        checks={"empty_subset_cancel_and_core": _check_cross_identities},
    ),
)
