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
* `swin`: Swin / SwinV2 (shifted-)window attention (``swin_window_attention``), the window
  attention that scOT and HAT call.
* `transposed_channel`: Restormer MDTA and XCiT/DAT channel attention (``transposed_channel_attention``).
* `cait`: CaiT class-attention block (``class_attention``) and talking-heads self-attention.
* `irpe`: iRPE image relative position encodings (``irpe_image_relative_position``).
* `relation_detr`: Relation-DETR's position-relation bias in decoder self-attention (``relation_detr_position_bias``).
* `duoformer`: DuoFormer scale-wise and patch-wise attention (``duoformer_scale_wise_attention``).
* `hat`: HAT's hybrid attention block and overlapping cross-attention block (``hat_hybrid_attention``).
* `additive`: additive (MLP-score) soft attention of Show, Attend and Tell, with the selector gate and the
  doubly-stochastic regulariser (``additive_attention_bahdanau``); its separable tanh score
  `additive_scores` is shared with ``latent_alignment``.
* `bidaf`: BiDAF's attention flow layer (``bidaf_attention_flow``).
* `location_relative`: GMM (V0/V1/V2) and Dynamic Convolution Attention over decoder steps, backward
  through time (``gmm_dca_location_attention``).
* `latent_alignment`: exact latent-alignment likelihood, enumerated variational ELBO, soft baseline
  (``latent_alignment_attention``).
* `high_order_mhn`: MHN's High-Order Attention module (``high_order_attention_hoa``).
* `monotonic_location`: monotonic location attention with forward/reverse mixing, backward through time
  (``monotonic_location_attention``).
* `neural_attention`: Neural Attention, MLP scores on query/key pairs (``neural_attention_mlp_scores``).
* `high_order_vqa`: three-modality high-order attention for VQA (``high_order_attention_vqa``).
* `memory_efficient`: the exact memory-efficient forms, FlashAttention-2, Rabe–Staats and the tree
  merge (``online_softmax_flash_attention``, ``memory_efficient_attention_rabe_staats``,
  ``tree_attention_merge``), one module because they share one derivation.

Every public name of these modules is re-exported here, so
``from refattn.attention.softmax import sdpa_forward`` works.

A convenience wrapper named like its module (``sdpa``, ``mha``) is not re-exported, so that the
module name keeps naming the module: call it as ``refattn.attention.softmax.<module>.<name>``.
"""

from __future__ import annotations

from .additive import (  # noqa: F401
    additive_scores,
    additive_scores_vjp,
    doubly_stochastic_penalty_backward,
    doubly_stochastic_penalty_forward,
    init_soft_attention_params,
    soft_attention,
    soft_attention_backward,
    soft_attention_forward,
    soft_attention_param_spec,
)
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
from .bidaf import (  # noqa: F401
    bidaf_attention,
    bidaf_attention_backward,
    bidaf_attention_forward,
    bidaf_param_spec,
    bidaf_similarity,
    init_bidaf_params,
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
from .high_order_mhn import (  # noqa: F401
    hoa,
    hoa_backward,
    hoa_forward,
    hoa_param_spec,
    init_hoa_params,
)
from .high_order_vqa import (  # noqa: F401
    HOA_VQA_MODALITIES,
    hoa_vqa,
    hoa_vqa_backward,
    hoa_vqa_forward,
    hoa_vqa_param_spec,
    init_hoa_vqa_params,
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
from .latent_alignment import (  # noqa: F401
    LATENT_ATTN_TYPES,
    LATENT_MODES,
    init_latent_alignment_params,
    latent_alignment_backward,
    latent_alignment_forward,
    latent_alignment_param_spec,
)
from .location_relative import (  # noqa: F401
    GMM_VERSIONS,
    LOCATION_KINDS,
    dca_attention_backward,
    dca_attention_forward,
    dca_param_spec,
    dca_prior_filter,
    gmm_attention_backward,
    gmm_attention_forward,
    gmm_param_spec,
    init_dca_params,
    init_gmm_params,
    location_relative_attention,
    location_relative_attention_backward,
    location_relative_attention_forward,
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
from .monotonic_location import (  # noqa: F401
    STEP_ACTIVATIONS,
    init_monotonic_location_params,
    monotonic_location_attention,
    monotonic_location_backward,
    monotonic_location_forward,
    monotonic_location_param_spec,
    reverse_within_length,
)
from .neural_attention import (  # noqa: F401
    init_neural_attention_params,
    neural_attention_backward,
    neural_attention_forward,
    neural_attention_param_spec,
    neural_attention_qkv_columns,
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
from .sdpa import (  # noqa: F401
    sdpa_backward,
    sdpa_forward,
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
    "box_relation_encoding",
    "init_relation_detr_params",
    "position_relation_bias",
    "relation_detr_attention",
    "relation_detr_attention_backward",
    "relation_detr_attention_forward",
    "relation_detr_param_spec",
    "relation_sine_frequencies",
    "RPE_KINDS",
    "relative_position_attention_backward",
    "relative_position_attention_forward",
    "shaw_attention_backward",
    "shaw_attention_forward",
    "t5_attention_backward",
    "t5_attention_forward",
    "t5_relative_position_bucket",
    "sdpa_backward",
    "sdpa_forward",
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
    "additive_scores",
    "additive_scores_vjp",
    "doubly_stochastic_penalty_backward",
    "doubly_stochastic_penalty_forward",
    "init_soft_attention_params",
    "soft_attention",
    "soft_attention_backward",
    "soft_attention_forward",
    "soft_attention_param_spec",
    "bidaf_attention",
    "bidaf_attention_backward",
    "bidaf_attention_forward",
    "bidaf_param_spec",
    "bidaf_similarity",
    "init_bidaf_params",
    "hoa",
    "hoa_backward",
    "hoa_forward",
    "hoa_param_spec",
    "init_hoa_params",
    "HOA_VQA_MODALITIES",
    "hoa_vqa",
    "hoa_vqa_backward",
    "hoa_vqa_forward",
    "hoa_vqa_param_spec",
    "init_hoa_vqa_params",
    "LATENT_ATTN_TYPES",
    "LATENT_MODES",
    "init_latent_alignment_params",
    "latent_alignment_backward",
    "latent_alignment_forward",
    "latent_alignment_param_spec",
    "GMM_VERSIONS",
    "LOCATION_KINDS",
    "dca_attention_backward",
    "dca_attention_forward",
    "dca_param_spec",
    "dca_prior_filter",
    "gmm_attention_backward",
    "gmm_attention_forward",
    "gmm_param_spec",
    "init_dca_params",
    "init_gmm_params",
    "location_relative_attention",
    "location_relative_attention_backward",
    "location_relative_attention_forward",
    "STEP_ACTIVATIONS",
    "init_monotonic_location_params",
    "monotonic_location_attention",
    "monotonic_location_backward",
    "monotonic_location_forward",
    "monotonic_location_param_spec",
    "reverse_within_length",
    "init_neural_attention_params",
    "neural_attention_backward",
    "neural_attention_forward",
    "neural_attention_param_spec",
    "neural_attention_qkv_columns",
]
