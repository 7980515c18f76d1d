r"""Softmax attention (catalogue family 1), one module per mechanism.

Scaled dot-product attention and the layers built on it: masks, multi-head and grouped-query
attention, additive and positional biases (ALiBi, Shaw/T5, iRPE ...), the exact memory-efficient
forms, vision window and channel attention, and the Q/K/V variants of the catalogue. `core`
holds what the family shares (the attention core, GQA head maps, causal and relative-position
maps, validation, the explicit references).

Every public name of these modules is re-exported here. A function named like its own module
(``sdpa`` in ``sdpa.py``) is exported too, so ``package.sdpa`` is the function; import the
module's other names from the module itself (``from package.sdpa import sdpa_forward``).

Modules
-------
additive
    Additive (MLP-score) soft attention: Bahdanau et al.'s score, as the soft attention of *Show,
    Attend and Tell*, with its gate ("selector") and the doubly-stochastic regulariser
    (``additive_attention_bahdanau``).
additive_bias
    Additive attention bias: a dense differentiable score bias and/or a bias table gathered through
    an integer index map (the T5 / Swin relative-bias layout), with the scatter-add gradient
    (``additive_attention_bias``).
alibi
    ALiBi: Attention with Linear Biases (reference slopes, symmetric option, learnable slopes)
    (``alibi``).
all_or_here
    All-or-Here Attention (AHA): a per-(token, head) binary router between full causal and
    sliding-window attention (``all_or_here_attention``).
better_attention
    Optimised, Efficient and Super Attention (Hosseini & Hosseini, "You Need to Pay Better
    Attention") (``optimised_efficient_super_attention``).
bidaf
    Bi-directional attention flow (BiDAF): the trilinear similarity, context-to-query and
    query-to-context attention, and the query-aware context representation $G$
    (``bidaf_attention_flow``).
cait
    CaiT class-attention (the class token attends to itself and the frozen patch tokens) and, as a
    separate option, CaiT's talking-heads self-attention (``class_attention``).
chiral_rope
    Chiral-RoPE: a rotary encoding whose relative rotation is signed by a handedness pseudoscalar
    (``chiral_rope``).
co4
    Co4 triadic Q/K/V modulation: the CLS latent modulates the patch tokens, a per-channel top-k
    pre-selects them, and attention runs over the CLS token and the $k$ selected rows only
    (``triadic_modulation_co4``).
coca
    CoCA: Collinear Constrained Attention (the Llama attention layer with ``t_proj`` instead of
    ``k_proj``) (``coca_collinear_attention``).
continuum_pl
    Continuum Attention over a piecewise-linear key/value curve (exact exponential moments)
    (``continuum_attention_piecewise_linear``).
converter
    Converter: synthetic unitary digraph convolution ("Kernelution") in place of self-attention,
    with the Converter encoder block around it (``converter_digraph_convolution``).
core
    Helpers shared by the softmax-attention family (and the families built on it), under public
    names.
crate
    CRATE white-box transformer block: MSSA (tied query = key = value) followed by one ISTA step
    (``crate_mssa_ista``).
diffqkv
    DiffQKV attention (Sigma): differently compressed K and V heads and an augmented query
    (``diffqkv_asymmetric_heads``).
duoformer
    DuoFormer: scale-wise attention inside each patch, patch-wise attention across patches
    (``duoformer_scale_wise_attention``).
extractors
    The Extractors (SHE, HE, WE, ME), drop-in replacements for self-attention — registered as **not
    implemented** (T3).
gqa
    Grouped-query and multi-query attention (GQA / MQA): the multi-head layer with fewer key/value
    heads than query heads (``gqa_mqa``).
hat
    HAT: the hybrid attention block (window self-attention + channel attention) and the overlapping
    cross-attention block (one record, ``hat_hybrid_attention``, ``block="hab"`` or ``"ocab"``)
    (``hat_hybrid_attention``).
high_order_mhn
    High-Order Attention (HOA) module of MHN: a channel-and-position gate built from elementwise
    products of $1\times1$ convolutions (polynomial terms of order $1..R$ of the features)
    (``high_order_attention_hoa``).
high_order_vqa
    High-order attention for three modalities (question, image, answers): unary, pairwise and
    ternary potentials merged per modality, then one softmax attention per modality
    (``high_order_attention_vqa``).
irpe
    iRPE: image relative position encodings (bias and contextual modes on queries, keys and values)
    (``irpe_image_relative_position``).
key_value
    Key-Value (query-free) attention: Borji's KV Transformer, symmetric and positional variants
    (``key_value_attention``).
latent_alignment
    Latent alignment attention: the exact marginal likelihood over a categorical alignment, the
    variational (enumerated) ELBO with an inference network's alignment posterior, and soft
    attention as the baseline (``latent_alignment_attention``).
lipschitz_l2
    LRFormer's Lipschitz-regularised attention: negative squared L2 distance scores normalised by a
    contractive Lipschitz bound (``lrformer_lipschitz_attention``).
location_relative
    Location-relative attention for long-form speech synthesis: GMM attention (V0, V1, V2) and
    Dynamic Convolution Attention (DCA), recurrent over decoder steps, with the backward through
    time (``gmm_dca_location_attention``).
magnetic_laplacian
    Magnetic-Laplacian positional encodings for directed graphs (the eigenvectors and their
    sign-invariant encoder, MagLapNet) (``magnetic_laplacian_pe``).
masks
    Attention masks: padding, causal (with an offset), sliding-window / band and block-diagonal
    keep-masks, and SDPA with a mask built from them (the ``attention_masks`` record)
    (``attention_masks``).
memory_efficient
    Exact memory-efficient forms of softmax attention: FlashAttention-2 recurrences, Rabe–Staats
    chunking with a checkpointed backward, and the associative (tree) merge of chunk summaries
    (``online_softmax_flash_attention``, ``memory_efficient_attention_rabe_staats``,
    ``tree_attention_merge``).
mha
    Multi-head (self or cross) attention layer with q/k/v/out projections, token-major; the options
    of ``torch.nn.MultiheadAttention`` (separate key and value inputs, ``add_bias_kv``,
    ``add_zero_attn``, ``key_padding_mask``) (``multi_head_attention``).
monotonic_location
    Monotonic location attention (OneStepAttn, MonoAttn, RMonoAttn and their content-mixed forms)
    with the forward/reverse interpolation of the encoder states, recurrent over decoder steps, with
    the backward through time (``monotonic_location_attention``).
multi_head_embedding
    Multi-head embedding attention (MHE): one shared query/key/value projection, heads made
    different by per-head embeddings, added (MHE-ADD) or multiplied (MHE-MUL)
    (``multi_head_embedding_attention``).
nats_mask
    Neural Attention Search (NAtS): causal attention under the mask defined by per-token types
    (``neural_attention_search_mask``).
neural_attention
    Neural Attention: the dot-product score replaced by a small feed-forward network on each (query,
    key) pair, in a multi-head self-attention layer (``neural_attention_mlp_scores``).
orthogonal_pe
    Orthogonal-basis (Legendre) absolute positional encoding, added to the token embeddings
    (``orthogonal_basis_positional_encoding``).
persistent_memory
    All-attention layer with persistent memory vectors (Sukhbaatar et al.): learned key/value slots
    appended to every head's keys and values, never masked (``persistent_memory_attention``).
plga
    Power-Law Graph Attention (PLGA): a learned metric tensor raised to learned element-wise powers
    (``plga_power_law_attention``).
poly_encoder
    Poly-encoder code attention (Humeau et al.): learned codes pool the context, the candidate
    attends over the pooled codes, and the score is a dot product (``poly_encoder_attention``).
position_coupling
    Position coupling: task-aligned tokens share one position ID of a learned absolute embedding
    (``position_coupling``).
qada
    QAdA: query-adaptive test of which heads need the long context, from local keys and a Gaussian
    bulk model (``qada_long_context_head_test``).
relation_detr
    Relation-DETR: an explicit position-relation bias for the decoder's self-attention
    (``relation_detr_position_bias``).
relational_attention
    Relational attention and the dual attention layer of the Dual Attention Transformer (DAT): heads
    that retrieve *relations* tagged with *symbols* next to ordinary (sensory) heads
    (``relational_attention``).
relative
    Relative position encodings: Shaw relative positions (clipped key/value tables) and T5's
    bucketed relative bias, under one record (``relative_position_encodings``, ``kind="shaw"`` or
    ``"t5"``) (``relative_position_encodings``).
reversed_attention
    Reversed ("sending") attention of DependencyViT: each child token distributes its message over
    its parents, and receivers sum what they are sent (``reversed_attention_dependencyvit``).
rpe_key_query
    Relative position embeddings with query *and* key interaction (method 4 of Huang et al.); BERT's
    ``position_embedding_type="relative_key_query"`` self-attention (``rpe_key_query_huang``).
sdpa
    Scaled dot-product attention (SDPA): softmax attention with masks, causal alignment, GQA,
    softcap and LSE (``sdpa``).
skip_layer
    Skip-Layer Attention (SLA): a chosen set of heads in layer $l$ attends with its queries to the
    keys and values of layer $l - n_l$, the other heads to layer $l$'s own
    (``skip_layer_attention``).
swin
    (Shifted-)window attention of the Swin Transformer (V1 relative-bias table, V2 scaled cosine +
    CPB) (``swin_window_attention``).
thg
    THG, Transformer with Hyperbolic Geometry (hyperbolic Q/K projections) — registered as **not
    implemented** (T3).
tova
    TOVA (Token Omission Via Attention): KV-cache eviction by the current query's head-averaged
    attention (``tova_kv_eviction``).
transposed_channel
    Transposed ("channel") attention: Restormer's MDTA, and the linear-projection form of XCiT / DAT
    (``transposed_channel_attention``).
tucker_attention
    Tucker Attention: multi-head attention whose stacked weight tensors are Tucker-factorised
    (``tucker_attention``).
urpe
    URPE: universal RPE-based attention — softmax attention with a relative bias, Hadamard-modulated
    by a learnable Toeplitz matrix (``urpe_toeplitz_modulated_attention``).
value_suppression
    Value-space parallel-component suppression (XSA family): edit each head's attention output along
    its own value (``value_parallel_suppression``).
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
    alibi_layer,
    alibi_layer_backward,
    alibi_layer_forward,
    alibi_slopes,
)
from .all_or_here import (  # noqa: F401
    AHA_GATE_GRADS,
    AHA_ROUTERS,
    aha_local_keep,
    aha_mix_backward,
    aha_mix_forward,
    aha_route,
    aha_sparsity_penalty,
    all_or_here,
    all_or_here_backward,
    all_or_here_forward,
    init_all_or_here_params,
)
from .better_attention import (  # noqa: F401
    better_attention,
    better_attention_backward,
    better_attention_forward,
    init_better_attention_params,
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
from .chiral_rope import (  # noqa: F401
    chiral_rope_attention,
    chiral_rope_attention_backward,
    chiral_rope_attention_forward,
    validate_chirality,
)
from .co4 import (  # noqa: F401
    co4_attention,
    co4_attention_backward,
    co4_attention_forward,
    co4_modulate,
    co4_param_spec,
    init_co4_params,
)
from .coca import (  # noqa: F401
    COCA_MODES,
    coca_attention,
    coca_attention_backward,
    coca_attention_forward,
    coca_key_magnitudes,
    coca_param_spec,
    coca_position_angles,
    coca_scores,
    init_coca_params,
)
from .continuum_pl import (  # noqa: F401
    continuum_pl_attention,
    continuum_pl_attention_backward,
    continuum_pl_attention_forward,
    exp_moment_f,
    exp_moment_f_prime,
)
from .converter import (  # noqa: F401
    KERNEL_TYPES,
    converter_block,
    converter_block_backward,
    converter_block_forward,
    converter_param_spec,
    dhhp_lower,
    dhhp_lower_vjp,
    dhhp_upper,
    dhhp_upper_vjp,
    givens_blocks,
    givens_blocks_vjp,
    init_converter_params,
    kpm_damping,
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
from .crate import (  # noqa: F401
    crate_block,
    crate_block_backward,
    crate_block_forward,
    init_crate_params,
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
from .key_value import (  # noqa: F401
    init_key_value_params,
    key_value_attention,
    key_value_attention_backward,
    key_value_attention_forward,
    positional_encoding_2d,
)
from .latent_alignment import (  # noqa: F401
    LATENT_ATTN_TYPES,
    LATENT_MODES,
    init_latent_alignment_params,
    latent_alignment,
    latent_alignment_backward,
    latent_alignment_forward,
    latent_alignment_param_spec,
)
from .lipschitz_l2 import (  # noqa: F401
    init_lipschitz_l2_params,
    lipschitz_l2_attention,
    lipschitz_l2_attention_backward,
    lipschitz_l2_attention_forward,
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
from .magnetic_laplacian import (  # noqa: F401
    MAGLAP_ACTIVATIONS,
    MAGLAP_PHASE_CONVENTIONS,
    init_maglap_pe_params,
    maglap_pe,
    maglap_pe_backward,
    maglap_pe_forward,
    maglap_pe_param_spec,
    maglap_stack,
    magnetic_laplacian_eigenpairs,
    magnetic_laplacian_matrix,
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
    MHA_ROPE_KEYS,
    MHA_WEIGHTS,
    init_mha_params,
    mha,
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
from .multi_head_embedding import (  # noqa: F401
    MHE_MODES,
    init_mhe_params,
    mhe_attention,
    mhe_attention_backward,
    mhe_attention_forward,
)
from .nats_mask import (  # noqa: F401
    NATS_GLOBAL,
    NATS_LOCAL,
    NATS_SLIDING,
    nats_attention,
    nats_attention_backward,
    nats_attention_forward,
    nats_keep_mask,
    nats_next_global,
    nats_token_types,
)
from .neural_attention import (  # noqa: F401
    init_neural_attention_params,
    neural_attention,
    neural_attention_backward,
    neural_attention_forward,
    neural_attention_param_spec,
    neural_attention_qkv_columns,
)
from .orthogonal_pe import (  # noqa: F401
    LEGENDRE_NORMALIZATIONS,
    legendre_basis,
    legendre_pe,
    legendre_pe_backward,
    legendre_pe_forward,
)
from .persistent_memory import (  # noqa: F401
    init_persistent_memory_params,
    persistent_memory_attention,
    persistent_memory_attention_backward,
    persistent_memory_attention_forward,
)
from .plga import (  # noqa: F401
    init_plga_params,
    plga_attention,
    plga_attention_backward,
    plga_attention_forward,
)
from .poly_encoder import (  # noqa: F401
    POLY_ATTENTION_TYPES,
    poly_encoder_attention,
    poly_encoder_attention_backward,
    poly_encoder_attention_forward,
)
from .position_coupling import (  # noqa: F401
    coupled_addition_position_ids,
    coupling_start_bounds,
    init_position_coupling_params,
    pad_position_ids,
    position_coupling_embed,
    position_coupling_embed_backward,
    position_coupling_embed_forward,
    position_coupling_param_spec,
    sample_coupling_start,
)
from .qada import (  # noqa: F401
    qada_attention,
    qada_attention_forward,
    qada_bulk_estimate,
    qada_window_keep,
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
    t5_attention_layer,
    t5_attention_layer_backward,
    t5_attention_layer_forward,
    t5_relative_position_bucket,
)
from .reversed_attention import (  # noqa: F401
    init_reversed_attention_params,
    reversed_attention,
    reversed_attention_backward,
    reversed_attention_forward,
)
from .rpe_key_query import (  # noqa: F401
    RPE_KEY_QUERY_TYPES,
    gather_rows_at,
    init_rpe_key_query_params,
    relative_distance_index,
    rpe_key_query,
    rpe_key_query_backward,
    rpe_key_query_forward,
    rpe_key_query_param_spec,
    scatter_rows_at,
)
from .sdpa import (  # noqa: F401
    sdpa,
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
from .tova import (  # noqa: F401
    tova_attention,
    tova_attention_backward,
    tova_attention_forward,
    tova_keep_mask,
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
from .tucker_attention import (  # noqa: F401
    TUCKER_POST,
    TUCKER_PRE,
    init_tucker_attention_params,
    tucker_attention,
    tucker_attention_backward,
    tucker_attention_forward,
    tucker_head_cores,
    tucker_weight_tensors,
)
from .urpe import (  # noqa: F401
    init_urpe_params,
    urpe_attention,
    urpe_attention_backward,
    urpe_attention_forward,
    urpe_bucket_ids,
    urpe_num_rows,
    urpe_param_spec,
    urpe_relative_bucket,
)
from .value_suppression import (  # noqa: F401
    PARALLEL_OPS,
    init_value_suppression_params,
    parallel_edit_coefficients,
    value_parallel_suppression,
    value_parallel_suppression_backward,
    value_parallel_suppression_forward,
)

__all__ = [
    "additive_scores", "additive_scores_vjp", "doubly_stochastic_penalty_backward", "doubly_stochastic_penalty_forward",
    "init_soft_attention_params", "soft_attention", "soft_attention_backward", "soft_attention_forward",
    "soft_attention_param_spec", "biased_attention_backward", "biased_attention_forward", "gather_bias",
    "scatter_bias_grad", "alibi_attention_backward", "alibi_attention_forward", "alibi_bias", "alibi_layer",
    "alibi_layer_backward", "alibi_layer_forward", "alibi_slopes", "AHA_GATE_GRADS", "AHA_ROUTERS", "aha_local_keep",
    "aha_mix_backward", "aha_mix_forward", "aha_route", "aha_sparsity_penalty", "all_or_here", "all_or_here_backward",
    "all_or_here_forward", "init_all_or_here_params", "better_attention", "better_attention_backward",
    "better_attention_forward", "init_better_attention_params", "bidaf_attention", "bidaf_attention_backward",
    "bidaf_attention_forward", "bidaf_param_spec", "bidaf_similarity", "init_bidaf_params", "class_attention_block",
    "class_attention_block_backward", "class_attention_block_forward", "class_attention_param_spec",
    "init_class_attention_params", "talking_heads_attention", "talking_heads_attention_backward",
    "talking_heads_attention_forward", "talking_heads_param_spec", "chiral_rope_attention",
    "chiral_rope_attention_backward", "chiral_rope_attention_forward", "validate_chirality", "co4_attention",
    "co4_attention_backward", "co4_attention_forward", "co4_modulate", "co4_param_spec", "init_co4_params",
    "COCA_MODES", "coca_attention", "coca_attention_backward", "coca_attention_forward", "coca_key_magnitudes",
    "coca_param_spec", "coca_position_angles", "coca_scores", "init_coca_params", "continuum_pl_attention",
    "continuum_pl_attention_backward", "continuum_pl_attention_forward", "exp_moment_f", "exp_moment_f_prime",
    "KERNEL_TYPES", "converter_block", "converter_block_backward", "converter_block_forward", "converter_param_spec",
    "dhhp_lower", "dhhp_lower_vjp", "dhhp_upper", "dhhp_upper_vjp", "givens_blocks", "givens_blocks_vjp",
    "init_converter_params", "kpm_damping", "CAUSAL_ALIGNMENTS", "KV_GROUP_MAPS", "attention_core_backward",
    "attention_core_forward", "causal_keep", "check_size", "expand_kv", "naive_attention", "reduce_kv",
    "relative_positions", "sdpa_reference", "sum_to_shape", "validate_attention_config", "validate_qkv_config",
    "crate_block", "crate_block_backward", "crate_block_forward", "init_crate_params", "DIFFQKV_ACTIVATIONS",
    "diffqkv_attention", "diffqkv_attention_backward", "diffqkv_attention_forward", "init_diffqkv_params",
    "DUOFORMER_STAGES", "duoformer_attention", "duoformer_attention_backward", "duoformer_attention_forward",
    "duoformer_param_spec", "init_duoformer_params", "HAT_BLOCKS", "hab_backward", "hab_forward", "hab_param_spec",
    "hat_block", "hat_block_backward", "hat_block_forward", "init_hat_params", "oca_relative_position_index",
    "oca_window_sizes", "ocab_backward", "ocab_forward", "ocab_param_spec", "hoa", "hoa_backward", "hoa_forward",
    "hoa_param_spec", "init_hoa_params", "HOA_VQA_MODALITIES", "hoa_vqa", "hoa_vqa_backward", "hoa_vqa_forward",
    "hoa_vqa_param_spec", "init_hoa_vqa_params", "IRPE_METHODS", "IRPE_MODES", "IRPE_TARGETS", "init_irpe_params",
    "irpe_attention", "irpe_attention_backward", "irpe_attention_forward", "irpe_bucket_ids", "irpe_coefficients",
    "irpe_num_buckets", "irpe_param_spec", "irpe_piecewise_index", "init_key_value_params", "key_value_attention",
    "key_value_attention_backward", "key_value_attention_forward", "positional_encoding_2d", "LATENT_ATTN_TYPES",
    "LATENT_MODES", "init_latent_alignment_params", "latent_alignment", "latent_alignment_backward",
    "latent_alignment_forward", "latent_alignment_param_spec", "init_lipschitz_l2_params", "lipschitz_l2_attention",
    "lipschitz_l2_attention_backward", "lipschitz_l2_attention_forward", "GMM_VERSIONS", "LOCATION_KINDS",
    "dca_attention_backward", "dca_attention_forward", "dca_param_spec", "dca_prior_filter", "gmm_attention_backward",
    "gmm_attention_forward", "gmm_param_spec", "init_dca_params", "init_gmm_params", "location_relative_attention",
    "location_relative_attention_backward", "location_relative_attention_forward", "MAGLAP_ACTIVATIONS",
    "MAGLAP_PHASE_CONVENTIONS", "init_maglap_pe_params", "maglap_pe", "maglap_pe_backward", "maglap_pe_forward",
    "maglap_pe_param_spec", "maglap_stack", "magnetic_laplacian_eigenpairs", "magnetic_laplacian_matrix", "MASK_KINDS",
    "band_mask", "block_diagonal_mask", "build_mask", "causal_mask", "masked_attention_backward",
    "masked_attention_forward", "padding_mask", "sliding_window_mask", "to_additive", "LOG2E", "attention_energy",
    "chunk_summary", "flash_attention", "flash_attention_backward", "flash_attention_forward", "merge_summaries",
    "rabe_staats_backward", "rabe_staats_forward", "tree_attention_backward", "tree_attention_forward", "tree_reduce",
    "MHA_ROPE_KEYS", "MHA_WEIGHTS", "init_mha_params", "mha", "mha_backward", "mha_forward", "STEP_ACTIVATIONS",
    "init_monotonic_location_params", "monotonic_location_attention", "monotonic_location_backward",
    "monotonic_location_forward", "monotonic_location_param_spec", "reverse_within_length", "MHE_MODES",
    "init_mhe_params", "mhe_attention", "mhe_attention_backward", "mhe_attention_forward", "NATS_GLOBAL", "NATS_LOCAL",
    "NATS_SLIDING", "nats_attention", "nats_attention_backward", "nats_attention_forward", "nats_keep_mask",
    "nats_next_global", "nats_token_types", "init_neural_attention_params", "neural_attention",
    "neural_attention_backward", "neural_attention_forward", "neural_attention_param_spec",
    "neural_attention_qkv_columns", "LEGENDRE_NORMALIZATIONS", "legendre_basis", "legendre_pe", "legendre_pe_backward",
    "legendre_pe_forward", "init_persistent_memory_params", "persistent_memory_attention",
    "persistent_memory_attention_backward", "persistent_memory_attention_forward", "init_plga_params", "plga_attention",
    "plga_attention_backward", "plga_attention_forward", "POLY_ATTENTION_TYPES", "poly_encoder_attention",
    "poly_encoder_attention_backward", "poly_encoder_attention_forward", "coupled_addition_position_ids",
    "coupling_start_bounds", "init_position_coupling_params", "pad_position_ids", "position_coupling_embed",
    "position_coupling_embed_backward", "position_coupling_embed_forward", "position_coupling_param_spec",
    "sample_coupling_start", "qada_attention", "qada_attention_forward", "qada_bulk_estimate", "qada_window_keep",
    "box_relation_encoding", "init_relation_detr_params", "position_relation_bias", "relation_detr_attention",
    "relation_detr_attention_backward", "relation_detr_attention_forward", "relation_detr_param_spec",
    "relation_sine_frequencies", "SYMBOL_RETRIEVERS", "dual_attention", "dual_attention_backward",
    "dual_attention_forward", "relational_attention_backward", "relational_attention_forward",
    "symbol_retrieval_backward", "symbol_retrieval_forward", "RPE_KINDS", "relative_position_attention_backward",
    "relative_position_attention_forward", "shaw_attention_backward", "shaw_attention_forward", "t5_attention_backward",
    "t5_attention_forward", "t5_attention_layer", "t5_attention_layer_backward", "t5_attention_layer_forward",
    "t5_relative_position_bucket", "init_reversed_attention_params", "reversed_attention",
    "reversed_attention_backward", "reversed_attention_forward", "RPE_KEY_QUERY_TYPES", "gather_rows_at",
    "init_rpe_key_query_params", "relative_distance_index", "rpe_key_query", "rpe_key_query_backward",
    "rpe_key_query_forward", "rpe_key_query_param_spec", "scatter_rows_at", "sdpa", "sdpa_backward", "sdpa_forward",
    "init_skip_layer_params", "skip_layer_attention_backward", "skip_layer_attention_forward", "skip_layer_stack",
    "skip_layer_stack_backward", "skip_layer_stack_forward", "SWIN_PARAM_NAMES", "SWIN_VERSIONS", "SWIN_WINDOW_RULES",
    "init_swin_params", "swin_canonical_weights", "swin_named_grads", "swin_param_spec", "swin_window_and_shift",
    "swin_window_attention", "swin_window_attention_apply", "swin_window_attention_backward",
    "swin_window_attention_forward", "swin_window_attention_vjp", "tova_attention", "tova_attention_backward",
    "tova_attention_forward", "tova_keep_mask", "CHANNEL_PROJECTIONS", "channel_attention_apply",
    "channel_attention_param_spec", "channel_attention_vjp", "init_channel_attention_params",
    "transposed_channel_attention", "transposed_channel_attention_backward", "transposed_channel_attention_forward",
    "TUCKER_POST", "TUCKER_PRE", "init_tucker_attention_params", "tucker_attention", "tucker_attention_backward",
    "tucker_attention_forward", "tucker_head_cores", "tucker_weight_tensors", "init_urpe_params", "urpe_attention",
    "urpe_attention_backward", "urpe_attention_forward", "urpe_bucket_ids", "urpe_num_rows", "urpe_param_spec",
    "urpe_relative_bucket", "PARALLEL_OPS", "init_value_suppression_params", "parallel_edit_coefficients",
    "value_parallel_suppression", "value_parallel_suppression_backward", "value_parallel_suppression_forward",
]
