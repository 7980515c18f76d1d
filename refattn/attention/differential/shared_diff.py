r"""Shared DIFF Transformer: a shared base projection with low-rank updates per branch.

Cang, Liu, Zhang et al., "Shared DIFF Transformer", 2025, arXiv 2501.17900 (abstracts of v1 and
v2 only; no code found). Reconstruction, unverified (the catalogue's reading): the two query/key
branches of DIFF V1 share a base and differ by rank-$r$ updates,

$$W_{Q,a} = W_Q^{sh} + s\,A_{Q,a}B_{Q,a},\qquad W_{K,a} = W_K^{sh} + s\,A_{K,a}B_{K,a},\qquad a\in\{1,2\},$$

then exactly DIFF V1. Backward: V1's chain; the shared base accumulates both branches,
$dW^{sh} = dW_{Q,1} + dW_{Q,2}$ (``refattn.attention.differential.lora``).
"""

from __future__ import annotations

import numpy as np

from ...registry import Mechanism, Sample, register
from ._samples import two_branch_params
from .layer import V1_LAMBDA_KEYS, lambda_init_fn, resolve_lambda_init, rope_tables
from .lora import two_branch_backward, two_branch_forward
from .v1 import diff_attention_v1_backward, diff_attention_v1_forward

__all__ = [
    "shared_diff_attention_forward",
    "shared_diff_attention_backward",
    "shared_diff_attention",
]


_SHARED_NAMES = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "out_proj", "q2": "q2_proj", "k2": "k2_proj"}


def _bool_rescale(rescale):
    if not isinstance(rescale, (bool, np.bool_)):
        raise TypeError(f"rescale must be a bool; got {type(rescale).__name__}")
    return "lambda_init" if rescale else "none"


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
    return two_branch_forward(
        x, params, where="shared_diff_attention", names=_SHARED_NAMES, num_heads=num_heads,
        num_kv_heads=num_kv_heads, negative_term="base_lora", lora_scale=lora_scale, lambda_mode="reparam",
        lambda_init_value=lam0, attn_mask=attn_mask, is_causal=is_causal, causal_alignment=causal_alignment,
        rel_pos=rel_pos, rope_interleaved=rope_interleaved, scale=scale, subln=subln, subln_affine=subln_affine,
        subln_eps=subln_eps, rescale=_bool_rescale(rescale))


def shared_diff_attention_backward(dout, cache):
    """Gradient of :func:`shared_diff_attention_forward` (V1's chain; see its Notes)."""
    return two_branch_backward(dout, cache)


def shared_diff_attention(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`shared_diff_attention_forward`."""
    return shared_diff_attention_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample_shared(rng, size):
    if size == "tiny":
        B, n, C, H, d, r = 2, int(rng.integers(2, 4)), 3, 2, 1, 1
    else:
        B, n, C, H, d, r = 2, int(rng.integers(4, 7)), 6, 2, 2, 2
    Hkv = int(rng.choice([1, H]))
    depth = int(rng.integers(0, 6))
    P = two_branch_params(rng, C, H, Hkv, d, 2 * d, r, _SHARED_NAMES, reparam=True, norm=True,
                          lambda_init=lambda_init_fn(depth))
    cfg = {"num_heads": H, "num_kv_heads": Hkv, "depth": depth}
    if d % 2 == 0:
        cfg["rel_pos"] = rope_tables(n, d)
    return Sample(inputs={"x": rng.standard_normal((B, n, C))}, params=P, config=cfg)


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
        slug="shared_diff_attention", family="2-differential", tier="T1",
        title="Shared DIFF Transformer (shared base + low-rank updates)",
        paper="Cang, Liu, Zhang et al., 'Shared DIFF Transformer', 2025, arXiv 2501.17900",
        forward=shared_diff_attention_forward, backward=shared_diff_attention_backward, sample=_sample_shared,
        docs="differential.md#shared_diff_attention", checks={"equals_v1_with_merged_weights": _check_shared_is_v1},
    ),
)
