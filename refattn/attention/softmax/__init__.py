"""Softmax attention (catalogue family 1), one module per mechanism.

* `core`: the helpers the family shares (the attention core, GQA head maps, causal and
  relative-position maps, validation, the explicit references); registers nothing.
* `sdpa`: scaled dot-product attention (record ``sdpa``).
* `masks`: padding, causal, sliding-window / band and block-diagonal masks (``attention_masks``).
* `additive_bias`: dense and table additive score biases (``additive_attention_bias``).
* `mha`: the multi-head self/cross attention layer (``multi_head_attention``).
* `gqa`: grouped-query / multi-query attention (``gqa_mqa``; the MHA layer with fewer kv heads).
* `alibi`: ALiBi linear biases (``alibi``).
* `relative`: Shaw and T5 relative position encodings (``relative_position_encodings``).
* `memory_efficient`: the exact memory-efficient forms, FlashAttention-2, Rabe–Staats and the tree
  merge (``online_softmax_flash_attention``, ``memory_efficient_attention_rabe_staats``,
  ``tree_attention_merge``), one module because they share one derivation.

Every public name of these modules is re-exported here, so
``from refattn.attention.softmax import sdpa_forward`` works.
"""

from __future__ import annotations

from .additive_bias import (
    biased_attention_backward,
    biased_attention_forward,
    gather_bias,
    scatter_bias_grad,
)
from .alibi import (
    alibi_attention_backward,
    alibi_attention_forward,
    alibi_bias,
    alibi_slopes,
)
from .core import (
    CAUSAL_ALIGNMENTS,
    KV_GROUP_MAPS,
    attention_core_backward,
    attention_core_forward,
    causal_keep,
    check_size,
    expand_kv,
    naive_attention,
    reduce_kv,
    relative_positions,
    sdpa_reference,
    sum_to_shape,
    validate_attention_config,
    validate_qkv_config,
)
from .masks import (
    MASK_KINDS,
    band_mask,
    block_diagonal_mask,
    build_mask,
    causal_mask,
    masked_attention_backward,
    masked_attention_forward,
    padding_mask,
    sliding_window_mask,
    to_additive,
)
from .memory_efficient import (
    LOG2E,
    attention_energy,
    chunk_summary,
    flash_attention,
    flash_attention_backward,
    flash_attention_forward,
    merge_summaries,
    rabe_staats_backward,
    rabe_staats_forward,
    tree_attention_backward,
    tree_attention_forward,
    tree_reduce,
)
from .mha import (
    MHA_WEIGHTS,
    init_mha_params,
    mha,
    mha_backward,
    mha_forward,
)
from .relative import (
    RPE_KINDS,
    relative_position_attention_backward,
    relative_position_attention_forward,
    shaw_attention_backward,
    shaw_attention_forward,
    t5_attention_backward,
    t5_attention_forward,
    t5_relative_position_bucket,
)
from .sdpa import (
    sdpa,
    sdpa_backward,
    sdpa_forward,
)

__all__ = [
    "KV_GROUP_MAPS",
    "CAUSAL_ALIGNMENTS",
    "expand_kv",
    "reduce_kv",
    "causal_keep",
    "relative_positions",
    "sum_to_shape",
    "check_size",
    "validate_attention_config",
    "validate_qkv_config",
    "attention_core_forward",
    "attention_core_backward",
    "naive_attention",
    "sdpa_reference",
    "sdpa_forward",
    "sdpa_backward",
    "sdpa",
    "MASK_KINDS",
    "causal_mask",
    "band_mask",
    "sliding_window_mask",
    "padding_mask",
    "block_diagonal_mask",
    "to_additive",
    "build_mask",
    "masked_attention_forward",
    "masked_attention_backward",
    "gather_bias",
    "scatter_bias_grad",
    "biased_attention_forward",
    "biased_attention_backward",
    "MHA_WEIGHTS",
    "mha_forward",
    "mha_backward",
    "mha",
    "init_mha_params",
    "alibi_slopes",
    "alibi_bias",
    "alibi_attention_forward",
    "alibi_attention_backward",
    "RPE_KINDS",
    "t5_relative_position_bucket",
    "t5_attention_forward",
    "t5_attention_backward",
    "shaw_attention_forward",
    "shaw_attention_backward",
    "relative_position_attention_forward",
    "relative_position_attention_backward",
    "LOG2E",
    "flash_attention_forward",
    "flash_attention_backward",
    "flash_attention",
    "rabe_staats_forward",
    "rabe_staats_backward",
    "chunk_summary",
    "merge_summaries",
    "tree_reduce",
    "tree_attention_forward",
    "tree_attention_backward",
    "attention_energy",
]
