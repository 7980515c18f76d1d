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
* Q/K/V variants (page ``softmax/qkv-variants.md``): `key_value` (``key_value_attention``),
  `persistent_memory` (``persistent_memory_attention``), `poly_encoder` (``poly_encoder_attention``),
  `reversed_attention` (``reversed_attention_dependencyvit``),
  `multi_head_embedding` (``multi_head_embedding_attention``), `diffqkv` (``diffqkv_asymmetric_heads``),
  `skip_layer` (``skip_layer_attention``), `relational_attention` (``relational_attention``: relational heads,
  symbol retrievers and the dual attention layer).
* `memory_efficient`: the exact memory-efficient forms, FlashAttention-2, Rabe–Staats and the tree
  merge (``online_softmax_flash_attention``, ``memory_efficient_attention_rabe_staats``,
  ``tree_attention_merge``), one module because they share one derivation.

Every public name of these modules is re-exported here, so
``from refattn.attention.softmax import sdpa_forward`` works.

A convenience wrapper named like its module (``sdpa``, ``mha``) is not re-exported, so that the
module name keeps naming the module: call it as ``refattn.attention.softmax.<module>.<name>``.
"""

from __future__ import annotations

from .additive_bias import (  # noqa: F401
    biased_attention_backward,
    biased_attention_forward,
    gather_bias,
    scatter_bias_grad,
)
from .alibi import (  # noqa: F401
    alibi_attention_backward,
    alibi_attention_forward,
    alibi_bias,
    alibi_slopes,
)
from .core import (  # noqa: F401
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
from .diffqkv import (  # noqa: F401
    DIFFQKV_ACTIVATIONS,
    diffqkv_attention,
    diffqkv_attention_backward,
    diffqkv_attention_forward,
    init_diffqkv_params,
)
from .key_value import (  # noqa: F401
    init_key_value_params,
    key_value_attention,
    key_value_attention_backward,
    key_value_attention_forward,
    positional_encoding_2d,
)
from .masks import (  # noqa: F401
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
from .memory_efficient import (  # noqa: F401
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
from .mha import (  # noqa: F401
    MHA_WEIGHTS,
    init_mha_params,
    mha_backward,
    mha_forward,
)
from .multi_head_embedding import (  # noqa: F401
    MHE_MODES,
    init_mhe_params,
    mhe_attention,
    mhe_attention_backward,
    mhe_attention_forward,
)
from .persistent_memory import (  # noqa: F401
    init_persistent_memory_params,
    persistent_memory_attention,
    persistent_memory_attention_backward,
    persistent_memory_attention_forward,
)
from .poly_encoder import (  # noqa: F401
    POLY_ATTENTION_TYPES,
    poly_encoder_attention,
    poly_encoder_attention_backward,
    poly_encoder_attention_forward,
)
from .relational_attention import (  # noqa: F401
    SYMBOL_RETRIEVERS,
    dual_attention,
    dual_attention_backward,
    dual_attention_forward,
    relational_attention_backward,
    relational_attention_forward,
    symbol_retrieval_backward,
    symbol_retrieval_forward,
)
from .relative import (  # noqa: F401
    RPE_KINDS,
    relative_position_attention_backward,
    relative_position_attention_forward,
    shaw_attention_backward,
    shaw_attention_forward,
    t5_attention_backward,
    t5_attention_forward,
    t5_relative_position_bucket,
)
from .reversed_attention import (  # noqa: F401
    init_reversed_attention_params,
    reversed_attention_backward,
    reversed_attention_forward,
)
from .sdpa import (  # noqa: F401
    sdpa_backward,
    sdpa_forward,
)
from .skip_layer import (  # noqa: F401
    init_skip_layer_params,
    skip_layer_attention_backward,
    skip_layer_attention_forward,
    skip_layer_stack,
    skip_layer_stack_backward,
    skip_layer_stack_forward,
)

__all__ = [
    "biased_attention_backward",
    "biased_attention_forward",
    "gather_bias",
    "scatter_bias_grad",
    "alibi_attention_backward",
    "alibi_attention_forward",
    "alibi_bias",
    "alibi_slopes",
    "CAUSAL_ALIGNMENTS",
    "KV_GROUP_MAPS",
    "attention_core_backward",
    "attention_core_forward",
    "causal_keep",
    "check_size",
    "expand_kv",
    "naive_attention",
    "reduce_kv",
    "relative_positions",
    "sdpa_reference",
    "sum_to_shape",
    "validate_attention_config",
    "validate_qkv_config",
    "DIFFQKV_ACTIVATIONS",
    "diffqkv_attention",
    "diffqkv_attention_backward",
    "diffqkv_attention_forward",
    "init_diffqkv_params",
    "init_key_value_params",
    "key_value_attention",
    "key_value_attention_backward",
    "key_value_attention_forward",
    "positional_encoding_2d",
    "MASK_KINDS",
    "band_mask",
    "block_diagonal_mask",
    "build_mask",
    "causal_mask",
    "masked_attention_backward",
    "masked_attention_forward",
    "padding_mask",
    "sliding_window_mask",
    "to_additive",
    "LOG2E",
    "attention_energy",
    "chunk_summary",
    "flash_attention",
    "flash_attention_backward",
    "flash_attention_forward",
    "merge_summaries",
    "rabe_staats_backward",
    "rabe_staats_forward",
    "tree_attention_backward",
    "tree_attention_forward",
    "tree_reduce",
    "MHA_WEIGHTS",
    "init_mha_params",
    "mha_backward",
    "mha_forward",
    "MHE_MODES",
    "init_mhe_params",
    "mhe_attention",
    "mhe_attention_backward",
    "mhe_attention_forward",
    "init_persistent_memory_params",
    "persistent_memory_attention",
    "persistent_memory_attention_backward",
    "persistent_memory_attention_forward",
    "POLY_ATTENTION_TYPES",
    "poly_encoder_attention",
    "poly_encoder_attention_backward",
    "poly_encoder_attention_forward",
    "SYMBOL_RETRIEVERS",
    "dual_attention",
    "dual_attention_backward",
    "dual_attention_forward",
    "relational_attention_backward",
    "relational_attention_forward",
    "symbol_retrieval_backward",
    "symbol_retrieval_forward",
    "RPE_KINDS",
    "relative_position_attention_backward",
    "relative_position_attention_forward",
    "shaw_attention_backward",
    "shaw_attention_forward",
    "t5_attention_backward",
    "t5_attention_forward",
    "t5_relative_position_bucket",
    "init_reversed_attention_params",
    "reversed_attention_backward",
    "reversed_attention_forward",
    "sdpa_backward",
    "sdpa_forward",
    "init_skip_layer_params",
    "skip_layer_attention_backward",
    "skip_layer_attention_forward",
    "skip_layer_stack",
    "skip_layer_stack_backward",
    "skip_layer_stack_forward",
]
