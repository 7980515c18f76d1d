r"""DiffCLIP: DiffCLIP's copy of the V1 layer (biases, constant $\lambda_{init}$, no RoPE, no mask).

Hammoud & Ghanem, "DiffCLIP: Differential Attention Meets CLIP", 2025; code
hammoudhasan/DiffCLIP ``diff_attention.py``@bec1d61 (``DiffAttention``). The V1 algebra
(``refattn.attention.differential.v1``) with CLIP's head count (halved inside), biases on every
projection, $\lambda_{init} = 0.8$ in every block and the per-head norm named ``diff_norm``; the
backward is V1's chain with $db = \sum_{\text{rows}} dY$ for each projection. Every difference
is listed in `diffclip_attention_forward`.
"""

from __future__ import annotations

import numpy as np

from ..._checks import check_int
from ...registry import Mechanism, Sample, register
from ._samples import draw_lambda_vectors
from .layer import resolve_lambda_init, v1_generic_backward, v1_generic_forward, v1_pairing_index
from .v1 import diff_attention_v1_forward

__all__ = [
    "diffclip_attention_forward",
    "diffclip_attention_backward",
    "diffclip_attention",
]


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


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


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


register(
    Mechanism(
        slug="diffclip_attention", family="2-differential", tier="T1",
        title="DiffCLIP differential attention (vision/text encoders)",
        paper="Hammoud & Ghanem, 'DiffCLIP: Differential Attention Meets CLIP', 2025",
        forward=diffclip_attention_forward, backward=diffclip_attention_backward, sample=_sample_diffclip,
        docs="differential.md#diffclip_attention", checks={"equals_v1_constant_lambda_init": _check_diffclip_is_v1},
    ),
)
