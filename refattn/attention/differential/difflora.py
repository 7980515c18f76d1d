r"""DiffLoRA: differential attention on a pretrained model via low-rank adapters on both terms.

Misrahi, Chirkova, Louis, Nikoulina, "DiffLoRA: Differential Low-Rank Adapters for Large
Language Models", 2025, arXiv 2507.23588; followed code: the first author's implementation,
``AlexandreMisrahi2005/bergen``
``models/generators/DiffTransformer/llama_lora_diff_transformer_model.py`` and
``llama_lora_diff_transformer_config.py`` (commit 27a6bf1; model file versions 85450b0, 26c5a58):

$$Q_1 = xW_q + s\,(xA_{q1})B_{q1},\quad Q_2 = xW_q + s\,(xA_{q2})B_{q2}\ (\text{same for }K),\qquad
  O = \mathrm{rescale}\cdot\mathrm{RMSNorm}_d\bigl((A_1 - \lambda A_2)V\bigr)W_o ,$$

the base model's heads and width kept. The two-branch computation and its backward are in
``refattn.attention.differential.lora``; the negative-term, λ and output-factor variants of the
stored code versions are keywords of `difflora_forward`.
"""

from __future__ import annotations

import numpy as np

from ...nn.linear import merge_heads, split_heads
from ...registry import Mechanism, Sample, register
from ..softmax import sdpa_forward
from ._samples import two_branch_params
from .layer import rope_tables
from .lora import two_branch_backward, two_branch_forward

__all__ = [
    "difflora_forward",
    "difflora_backward",
    "difflora",
]


_LLAMA_NAMES = {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "o_proj", "q2": "q2_proj", "k2": "k2_proj"}


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
    return two_branch_forward(
        x, params, where="difflora", names=_LLAMA_NAMES, num_heads=num_heads, num_kv_heads=num_kv_heads,
        negative_term=negative_term, positive_term=positive_term, lora_scale=lora_scale, lambda_mode=lambda_mode,
        lambda_init_value=float(lambda_init), attn_mask=attn_mask, is_causal=is_causal,
        causal_alignment=causal_alignment, rel_pos=rel_pos, rope_interleaved=rope_interleaved, scale=scale,
        subln=subln, subln_affine=subln_affine, subln_eps=subln_eps, rescale=rescale)


def difflora_backward(dout, cache):
    """Gradient of :func:`difflora_forward` (derivation in its Notes): ``x`` and every params key."""
    return two_branch_backward(dout, cache)


def difflora(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`difflora_forward`."""
    return difflora_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


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
    P = two_branch_params(rng, C, H, Hkv, d, d, r, _LLAMA_NAMES, negative_term=mode, positive_term=positive,
                          reparam=lam_mode == "reparam", lambda_init=0.4, norm=subln == "rms")
    return Sample(inputs={"x": rng.standard_normal((B, n, C))}, params=P,
                  config={"num_heads": H, "num_kv_heads": Hkv, "lambda_init": 0.4, "lambda_mode": lam_mode,
                          "negative_term": mode, "positive_term": positive, "lora_scale": 2.0, "subln": subln,
                          "rescale": rescale, "rel_pos": rope_tables(n, d)})


def _check_difflora_init(rng):
    # B = 0 (default mode, fixed lambda = lambda_init, no norm, rescale "lambda_init"):
    # (1 - lambda_init)^2 x the base attention.
    B, n, C, H, Hkv, d = 2, 5, 6, 4, 2, 2
    x = rng.standard_normal((B, n, C))
    P = two_branch_params(rng, C, H, Hkv, d, d, 2, _LLAMA_NAMES, zero_B=True)
    lam0 = 0.3
    out = difflora(x, P, num_heads=H, num_kv_heads=Hkv, lambda_init=lam0, subln="none")
    q = split_heads(x @ P["q_proj.weight"], H, d)
    k = split_heads(x @ P["k_proj.weight"], Hkv, d)
    v = split_heads(x @ P["v_proj.weight"], Hkv, d)
    base = merge_heads(sdpa_forward(q, k, v, is_causal=True)[0]) @ P["o_proj.weight"]
    err = float(np.abs(out - (1 - lam0) ** 2 * base).max())
    assert err < 1e-12, f"DiffLoRA at init is not (1 - lambda_init)^2 x the base attention ({err})"
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
)
