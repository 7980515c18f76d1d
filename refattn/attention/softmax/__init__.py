r"""Softmax attention (catalogue family 1), one module per mechanism.

Scaled dot-product attention and the layers built on it: masks, multi-head and grouped-query
attention, additive and positional biases (ALiBi, Shaw/T5, iRPE ...), the exact memory-efficient
forms, vision window and channel attention, and the Q/K/V variants of the catalogue. `core`
holds what the family shares (the attention core, GQA head maps, causal and relative-position
maps, validation, the explicit references).

Modules
-------
* `additive_bias`: Additive attention bias: a dense differentiable score bias and/or a bias table
  gathered through an integer index map (the T5 / Swin relative-bias layout), with the scatter-add
  gradient (``additive_attention_bias``).
* `alibi`: ALiBi: Attention with Linear Biases (reference slopes, symmetric option, learnable
  slopes) (``alibi``).
* `cait`: CaiT class-attention (the class token attends to itself and the frozen patch tokens) and,
  as a separate option, CaiT's talking-heads self-attention (``class_attention``).
* `core`: Helpers shared by the softmax-attention family (and the families built on it), under
  public names.
* `diffqkv`: DiffQKV attention (Sigma): differently compressed K and V heads and an augmented query
  (``diffqkv_asymmetric_heads``).
* `duoformer`: DuoFormer: scale-wise attention inside each patch, patch-wise attention across
  patches (``duoformer_scale_wise_attention``).
* `gqa`: Grouped-query and multi-query attention (GQA / MQA): the multi-head layer with fewer
  key/value heads than query heads (``gqa_mqa``).
* `hat`: HAT: the hybrid attention block (window self-attention + channel attention) and the
  overlapping cross-attention block (one record, ``hat_hybrid_attention``, ``block="hab"`` or
  ``"ocab"``) (``hat_hybrid_attention``).
* `irpe`: iRPE: image relative position encodings (bias and contextual modes on queries, keys and
  values) (``irpe_image_relative_position``).
* `key_value`: Key-Value (query-free) attention: Borji's KV Transformer, symmetric and positional
  variants (``key_value_attention``).
* `masks`: Attention masks: padding, causal (with an offset), sliding-window / band and
  block-diagonal keep-masks, and SDPA with a mask built from them (the ``attention_masks`` record)
  (``attention_masks``).
* `memory_efficient`: Exact memory-efficient forms of softmax attention: FlashAttention-2
  recurrences, Rabe–Staats chunking with a checkpointed backward, and the associative (tree) merge
  of chunk summaries (``online_softmax_flash_attention``,
  ``memory_efficient_attention_rabe_staats``, ``tree_attention_merge``).
* `mha`: Multi-head (self or cross) attention layer with q/k/v/out projections, token-major
  (``multi_head_attention``).
* `multi_head_embedding`: Multi-head embedding attention (MHE): one shared query/key/value
  projection, heads made different by per-head embeddings, added (MHE-ADD) or multiplied (MHE-MUL)
  (``multi_head_embedding_attention``).
* `persistent_memory`: All-attention layer with persistent memory vectors (Sukhbaatar et al.):
  learned key/value slots appended to every head's keys and values, never masked
  (``persistent_memory_attention``).
* `poly_encoder`: Poly-encoder code attention (Humeau et al.): learned codes pool the context, the
  candidate attends over the pooled codes, and the score is a dot product
  (``poly_encoder_attention``).
* `relation_detr`: Relation-DETR: an explicit position-relation bias for the decoder's
  self-attention (``relation_detr_position_bias``).
* `relational_attention`: Relational attention and the dual attention layer of the Dual Attention
  Transformer (DAT): heads that retrieve *relations* tagged with *symbols* next to ordinary
  (sensory) heads (``relational_attention``).
* `relative`: Relative position encodings: Shaw relative positions (clipped key/value tables) and
  T5's bucketed relative bias, under one record (``relative_position_encodings``, ``kind="shaw"`` or
  ``"t5"``) (``relative_position_encodings``).
* `reversed_attention`: Reversed ("sending") attention of DependencyViT: each child token
  distributes its message over its parents, and receivers sum what they are sent
  (``reversed_attention_dependencyvit``).
* `sdpa`: Scaled dot-product attention (SDPA): softmax attention with masks, causal alignment, GQA,
  softcap and LSE (``sdpa``).
* `skip_layer`: Skip-Layer Attention (SLA): a chosen set of heads in layer $l$ attends with its
  queries to the keys and values of layer $l - n_l$, the other heads to layer $l$'s own
  (``skip_layer_attention``).
* `swin`: (Shifted-)window attention of the Swin Transformer (V1 relative-bias table, V2 scaled
  cosine + CPB) (``swin_window_attention``).
* `transposed_channel`: Transposed ("channel") attention: Restormer's MDTA, and the
  linear-projection form of XCiT / DAT (``transposed_channel_attention``).

Every public name of these modules is re-exported here, except a function named like its
module (it would shadow the module); call that one as ``package.module.name``.
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
from .cait import (  # noqa: F401
    class_attention_block,
    class_attention_block_backward,
    class_attention_block_forward,
    class_attention_param_spec,
    init_class_attention_params,
    talking_heads_attention,
    talking_heads_attention_backward,
    talking_heads_attention_forward,
    talking_heads_param_spec,
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
from .duoformer import (  # noqa: F401
    DUOFORMER_STAGES,
    duoformer_attention,
    duoformer_attention_backward,
    duoformer_attention_forward,
    duoformer_param_spec,
    init_duoformer_params,
)
from .hat import (  # noqa: F401
    HAT_BLOCKS,
    hab_backward,
    hab_forward,
    hab_param_spec,
    hat_block,
    hat_block_backward,
    hat_block_forward,
    init_hat_params,
    oca_relative_position_index,
    oca_window_sizes,
    ocab_backward,
    ocab_forward,
    ocab_param_spec,
)
from .irpe import (  # noqa: F401
    IRPE_METHODS,
    IRPE_MODES,
    IRPE_TARGETS,
    init_irpe_params,
    irpe_attention,
    irpe_attention_backward,
    irpe_attention_forward,
    irpe_bucket_ids,
    irpe_coefficients,
    irpe_num_buckets,
    irpe_param_spec,
    irpe_piecewise_index,
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
from .relation_detr import (  # noqa: F401
    box_relation_encoding,
    init_relation_detr_params,
    position_relation_bias,
    relation_detr_attention,
    relation_detr_attention_backward,
    relation_detr_attention_forward,
    relation_detr_param_spec,
    relation_sine_frequencies,
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
from .swin import (  # noqa: F401
    SWIN_PARAM_NAMES,
    SWIN_VERSIONS,
    SWIN_WINDOW_RULES,
    init_swin_params,
    swin_canonical_weights,
    swin_named_grads,
    swin_param_spec,
    swin_window_and_shift,
    swin_window_attention,
    swin_window_attention_apply,
    swin_window_attention_backward,
    swin_window_attention_forward,
    swin_window_attention_vjp,
)
from .transposed_channel import (  # noqa: F401
    CHANNEL_PROJECTIONS,
    channel_attention_apply,
    channel_attention_param_spec,
    channel_attention_vjp,
    init_channel_attention_params,
    transposed_channel_attention,
    transposed_channel_attention_backward,
    transposed_channel_attention_forward,
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
    "class_attention_block",
    "class_attention_block_backward",
    "class_attention_block_forward",
    "class_attention_param_spec",
    "init_class_attention_params",
    "talking_heads_attention",
    "talking_heads_attention_backward",
    "talking_heads_attention_forward",
    "talking_heads_param_spec",
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
    "DUOFORMER_STAGES",
    "duoformer_attention",
    "duoformer_attention_backward",
    "duoformer_attention_forward",
    "duoformer_param_spec",
    "init_duoformer_params",
    "HAT_BLOCKS",
    "hab_backward",
    "hab_forward",
    "hab_param_spec",
    "hat_block",
    "hat_block_backward",
    "hat_block_forward",
    "init_hat_params",
    "oca_relative_position_index",
    "oca_window_sizes",
    "ocab_backward",
    "ocab_forward",
    "ocab_param_spec",
    "IRPE_METHODS",
    "IRPE_MODES",
    "IRPE_TARGETS",
    "init_irpe_params",
    "irpe_attention",
    "irpe_attention_backward",
    "irpe_attention_forward",
    "irpe_bucket_ids",
    "irpe_coefficients",
    "irpe_num_buckets",
    "irpe_param_spec",
    "irpe_piecewise_index",
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
    "box_relation_encoding",
    "init_relation_detr_params",
    "position_relation_bias",
    "relation_detr_attention",
    "relation_detr_attention_backward",
    "relation_detr_attention_forward",
    "relation_detr_param_spec",
    "relation_sine_frequencies",
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
    "SWIN_PARAM_NAMES",
    "SWIN_VERSIONS",
    "SWIN_WINDOW_RULES",
    "init_swin_params",
    "swin_canonical_weights",
    "swin_named_grads",
    "swin_param_spec",
    "swin_window_and_shift",
    "swin_window_attention",
    "swin_window_attention_apply",
    "swin_window_attention_backward",
    "swin_window_attention_forward",
    "swin_window_attention_vjp",
    "CHANNEL_PROJECTIONS",
    "channel_attention_apply",
    "channel_attention_param_spec",
    "channel_attention_vjp",
    "init_channel_attention_params",
    "transposed_channel_attention",
    "transposed_channel_attention_backward",
    "transposed_channel_attention_forward",
]
