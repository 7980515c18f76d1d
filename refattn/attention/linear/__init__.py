r"""Linear, kernel, sparse, low-rank and set attention (catalogue family 4), one module per mechanism.

`core` holds the linear-attention core (feature maps, the causal scan and its explicit
$O(N^2)$ form) and the selection helpers the sparse attentions share; every fast form in the
family is tested against its explicit form.

Every public name of these modules is re-exported here. A function named like its own module
(``sdpa`` in ``sdpa.py``) is exported too, so ``package.sdpa`` is the function; import the
module's other names from the module itself (``from package.sdpa import sdpa_forward``).

Modules
-------
adaptive_filter
    Adaptive Filter Attention (isotropic AFA): attention weights from a linear SDE's propagated
    precisions, robustly reweighted by the query-key residual (``adaptive_filter_attention``).
atlas_omega
    ATLAS Omega rule, linear-memory case (OmegaNet with gradient descent): a matrix memory updated
    at test time on a sliding window of the last $c$ tokens, with polynomial feature maps
    (``atlas_omega_rule_memory``).
combiner
    Combiner: full (causal) attention through a structured factorisation of the attention
    distribution (``combiner_attention``).
condaformer
    ConDaFormer disassembled window attention: the cubic window of a 3-D point-cloud transformer
    split into three orthogonal planar windows (xy, xz, yz), a third of the heads on each, with
    contextual relative position encodings, and the "local structure enhancement" — sparse depthwise
    convolutions before and after the attention — of upstream's ``Window_Attention``
    (``condaformer_planar_window_attention``).
core
    Helpers shared by the linear / kernel attention family, under public names: feature maps, the
    linear-attention core (non-causal form and causal prefix-state scan) and input validation.
darts_gt
    DARTS-GT asymmetric attention: queries from the node features, keys and values from a
    DARTS-weighted mixture of GNN transformations of them (``darts_gt_asymmetric_attention``).
das_gate
    DAS: a deformable-convolution attention gate for CNNs — a depthwise-separable convolution, then
    a deformable convolution that reads the feature map at learned, input-dependent points, whose
    sigmoid gates the input: $y = x\odot\sigma(\mathrm{DeformConv}(\mathrm{DSConv}(x)))$, $O(n)$ in
    the number of pixels (``das_deformable_attention_gate``).
drsformer_tksa
    DRSformer TKSA: top-k sparse channel ("transposed") attention with mixed sparsity ratios
    (``drsformer_topk_channel_attention``).
dynamic_mask
    DMA: trainable dynamic-mask sparse attention (flash-dmattn, now flash-sparse-attn)
    (``dynamic_mask_attention``).
ecoformer
    EcoFormer: linear attention on binary codes from kernelised hashing of the shared query/key
    (``ecoformer_hash_attention``).
efficient
    Efficient Attention (Shen et al.): softmax over each query's features and over each key
    feature's positions, so attention costs $O(Md\,d_v)$ (``efficient_attention_shen``).
etc_attention
    ETC global–local attention: a few global tokens attend to everything, long tokens attend to a
    band of radius $r$ of long tokens plus all global tokens, with Shaw-style relative position ids
    in every piece (g2g, g2l, l2g, l2l) — upstream's ``FusedGlobalLocalAttention``
    (``etc_global_local_attention``).
fastmax
    Fastmax (FAST): factorisable polynomial-kernel attention, the truncated Taylor series of softmax
    (``fastmax_polynomial_attention``).
flatformer
    FlatFormer: flattened window attention — points sorted window by window, split into groups of
    EQUAL SIZE (not equal-shape windows), softmax attention within each group, un-permuted; the full
    FlatFormer layer (group attention with a coordinate encoding on queries and keys, post-norm
    residual, GELU MLP) and the four-layer block that alternates the sorting axis and shifts
    (``flatformer_flattened_window_attention``).
fourier_dct
    Fourier Transformer: DCT-based sequence truncation before softmax attention
    (``fourier_transformer_dct``).
hyena
    Hyena operator: implicit long convolutions (FFT) with data-controlled gating, the full
    `HyenaOperator` layer with its implicit `HyenaFilter` (``hyena_operator``).
hypformer
    Hypformer: linear focused attention in the Lorentz model of hyperbolic space
    (``TransConvLayer``) (``hypformer_lorentz_linear_attention``).
informer_probsparse
    Informer: ProbSparse self-attention (with its attention layer) and the self-attention distilling
    layer (``informer_probsparse_attention``).
infsa
    Infinite Self-Attention (InfSA) and Linear-InfSA: Frobenius-normalised single-hop diffusion and
    its principal-eigenvector (one power step) linear variant (``linear_infsa_neumann``).
katharopoulos
    Linear attention of Katharopoulos et al (``linear_attention_katharopoulos``).
kl_transformer
    KL-Transformer: linear attention on spectral random features whose distribution is learned
    (``kl_transformer_learned_spectral_kernel``).
laughing_hyena
    Laughing Hyena: a Hyena long convolution in modal (diagonal SSM) form, computed either by FFT
    convolution with the filter the modes generate or by the $O(1)$-per-token modal recurrence
    (``laughing_hyena_modal_ssm``).
linformer
    Linformer: self-attention with sequence-axis low-rank projections of the keys and values
    (``linformer_low_rank_attention``).
local_window
    Local-window attention schedules: CLEAR's circular image windows (with its optional pooled-key
    branch) and MASFormer's band (sliding-window) layers (``local_window_attention_variants``).
masked_linear
    Structured-mask linear attention: $(M\odot\Phi_Q\Phi_K^\top)V$ with only "multiply by $M$"
    needed (``masked_linear_attention_structured``).
mossformer
    MossFormer block: gated single-head transformer with joint local (quadratic) and global (linear)
    attention and convolution-augmented projections (``mossformer_gated_joint_attention``).
mra
    MRA-2: multiresolution (two-level) approximation of softmax self-attention
    (``mra_multiresolution_attention``).
ms_deform_attn
    Multi-scale deformable attention (Deformable DETR; RT-DETRv2 per-level points and discrete
    sampling; the DFA3D depth-weighted form), with gradients w.r.t
    (``multiscale_deformable_attention``).
pde_ssm
    PDE-SSM spectral mixer: token mixing by a learnable convection–diffusion–reaction PDE solved
    exactly in the Fourier domain (reconstruction from the abstract) (``pde_ssm_spectral_mixer``).
performer
    Performer FAVOR+: softmax-kernel attention estimated with positive (orthogonal) random features
    (``performer_favor_plus``).
reformer_lsh
    Reformer LSH self-attention: angular LSH with random rotations, sort by bucket, chunked
    attention to the own and previous chunk, shared QK with self-masking, several hash rounds
    (``reformer_lsh_attention``).
routing_transformer
    Routing Transformer: online k-means routing and attention within each cluster
    (``routing_transformer_kmeans``).
rpe_fft
    Kernelized attention with relative positional encoding via FFT (Luo et al.): Performer features
    weighted by a Toeplitz matrix $e^{b_{j-i}}$, applied in $O(N\log N)$ by FFT
    (``kernelized_attention_rpe_fft``).
seqcond
    SeqCond Attention (SCA): a linear-time spectral sequence operator whose state is a running,
    score-weighted average of each key's complex phase $k\,e^{i\varphi(k)}$, read out by complex
    queries, then a gated RMSNorm, a per-head sigmoid-gated readout (upstream's "SwiGLU") and an
    output projection (``seqcond_attention``).
set_transformer
    Set Transformer blocks: MAB, SAB, ISAB (inducing points) and PMA, with hand-derived backwards
    (``set_transformer_blocks``).
sinkformer
    Sinkformer: doubly stochastic attention via log-domain Sinkhorn iterations
    (``sinkformer_attention``).
sonnet_mvca
    Sonnet's Multivariable Coherence Attention (MVCA, ``CoherenceAttention``): attention weights
    over time from the spectral coherence of each token's query and key (``sonnet_mvca``).
sparsek
    SPARSEK attention: a scoring network and the differentiable top-$k$ mask operator SPARSEK
    (``sparsek_attention``).
spectraformer
    Spectraformer: random-feature linear attention as a weight matrix $W$ times a component function
    $f$ (``spectraformer_random_features``).
stack_attention
    Stack attention, superposition variant: a differentiable stack (Joulin & Mikolov) driven by
    per-token push/pop/no-op probabilities, read at the top after every step (``stack_attention``).
tcnca
    TCNCA: MEGA's moving-average gated attention with the exponential moving average replaced by a
    dilated temporal convolutional network, and softmax attention restricted to non-overlapping
    chunks (block-diagonal), so the layer costs $O(L)$ (``tcnca_chunked_attention``).
titans
    Titans neural long-term memory, linear-memory case: a matrix memory trained at test time by
    gradient descent with momentum ("surprise") and forgetting, read with the queries
    (``titans_neural_memory``).
topk_attention
    Top-$k$ (k-NN retrieved) softmax attention: the exact reference of IceFormer's retrieval
    attention (``topk_attention``).
transnormer
    TransNormer: NormAttention (linear attention with a norm instead of the row-sum denominator),
    its full layer as trained (``transnormer_t1``), and DiagAttention (softmax attention inside
    non-overlapping blocks) (``transnormer_norm_attention``).
two_mamba
    2Mamba: second-order (squared-score) linear attention with a softplus decay mask and
    softmax-style normalisation; the recurrent (state-space) form equals the explicit masked
    $O(N^2)$ form (``two_mamba_second_order_attention``).
udit
    U-DiT downsampled-token self-attention: attention within the four polyphase sub-maps of a
    feature map (``udit_downsampled_token_attention``).
vcc
    VCC: VIP-token centric compression around one transformer layer (``vcc_vip_token_compression``).
wavspa
    WavSpA: attention in a (learnable) wavelet coefficient space (``wavelet_space_attention``).
"""

from __future__ import annotations

from .adaptive_filter import (  # noqa: F401
    adaptive_filter_attention,
    adaptive_filter_attention_backward,
    adaptive_filter_attention_forward,
)
from .atlas_omega import (  # noqa: F401
    atlas_omega,
    atlas_omega_backward,
    atlas_omega_forward,
    omega_rule_scan,
)
from .combiner import (  # noqa: F401
    COMBINER_POOLING,
    COMBINER_VARIANTS,
    combiner_attention,
    combiner_attention_backward,
    combiner_attention_forward,
    combiner_core_backward,
    combiner_core_forward,
    combiner_dense_matrix,
    combiner_region_summaries,
)
from .condaformer import (  # noqa: F401
    CONDAFORMER_PLANES,
    condaformer_attention,
    condaformer_attention_backward,
    condaformer_attention_forward,
    condaformer_plane_windows,
    init_condaformer_params,
)
from .core import (  # noqa: F401
    FEATURE_MAPS,
    feature_map_backward,
    feature_map_forward,
    gather_rows,
    l2_normalize,
    l2_normalize_vjp,
    linear_core_backward,
    linear_core_forward,
    mT,
    scatter_add_rows,
    topk_keep,
    validate_linear_qkv,
)
from .darts_gt import (  # noqa: F401
    DARTS_GT_CANDIDATES,
    darts_gt_attention,
    darts_gt_attention_backward,
    darts_gt_attention_forward,
)
from .das_gate import (  # noqa: F401
    das_attention_gate,
    das_attention_gate_backward,
    das_attention_gate_forward,
    das_sampling_points,
    init_das_params,
)
from .drsformer_tksa import (  # noqa: F401
    DRSFORMER_RATIOS,
    drsformer_tksa,
    drsformer_tksa_backward,
    drsformer_tksa_forward,
    drsformer_topk_sizes,
)
from .dynamic_mask import (  # noqa: F401
    BIAS_FORMS,
    dynamic_mask_attention,
    dynamic_mask_attention_backward,
    dynamic_mask_attention_forward,
    dynamic_mask_bias,
)
from .ecoformer import (  # noqa: F401
    binary_linear_attention_backward,
    binary_linear_attention_forward,
    ecoformer_attention,
    ecoformer_attention_backward,
    ecoformer_attention_forward,
    ecoformer_hash_backward,
    ecoformer_hash_forward,
)
from .efficient import (  # noqa: F401
    efficient_attention,
    efficient_attention_backward,
    efficient_attention_forward,
    efficient_attention_layer,
    efficient_attention_layer_backward,
    efficient_attention_layer_forward,
)
from .etc_attention import (  # noqa: F401
    ETC_ROLES,
    etc_band_indices,
    etc_global_local_attention,
    etc_global_local_attention_backward,
    etc_global_local_attention_forward,
    etc_local_relative_position_ids,
    etc_relative_position_ids,
    init_etc_params,
)
from .fastmax import (  # noqa: F401
    FASTMAX_NORMALIZE,
    fastmax_attention,
    fastmax_backward,
    fastmax_features,
    fastmax_forward,
    fastmax_normalize_backward,
    fastmax_normalize_forward,
)
from .flatformer import (  # noqa: F401
    FLATFORMER_BLOCK_ORDERS,
    equal_size_groups,
    flatformer_block,
    flatformer_block_backward,
    flatformer_block_forward,
    flatformer_layer,
    flatformer_layer_backward,
    flatformer_layer_forward,
    flatformer_positional_embedding,
    flattened_window_order,
    init_flatformer_params,
)
from .fourier_dct import (  # noqa: F401
    dct_ortho,
    dct_truncate,
    dct_truncate_vjp,
    fourier_dct_attention,
    fourier_dct_attention_backward,
    fourier_dct_attention_forward,
    idct_ortho,
)
from .hyena import (  # noqa: F401
    causal_fft_conv,
    causal_fft_conv_vjp,
    hyena_filter_backward,
    hyena_filter_forward,
    hyena_modulation_deltas,
    hyena_operator,
    hyena_operator_backward,
    hyena_operator_forward,
    hyena_positional_embedding,
    init_hyena_operator_params,
)
from .hypformer import (  # noqa: F401
    focus_map_backward,
    focus_map_forward,
    hypformer_attention,
    hypformer_attention_backward,
    hypformer_attention_forward,
    lorentz_lift,
    lorentz_lift_backward,
)
from .informer_probsparse import (  # noqa: F401
    informer_attention,
    informer_attention_backward,
    informer_attention_forward,
    informer_distil_backward,
    informer_distil_forward,
    probsparse_attention_backward,
    probsparse_attention_forward,
    probsparse_index_sample,
    probsparse_measure,
    probsparse_sizes,
)
from .infsa import (  # noqa: F401
    INFSA_VARIANTS,
    infsa_attention,
    infsa_attention_backward,
    infsa_attention_forward,
    infsa_scores_backward,
    infsa_scores_forward,
)
from .katharopoulos import (  # noqa: F401
    causal_linear_attention_backward,
    causal_linear_attention_forward,
    linear_attention,
    linear_attention_backward,
    linear_attention_explicit,
    linear_attention_forward,
)
from .kl_transformer import (  # noqa: F401
    KL_FEATURES,
    kl_features_backward,
    kl_features_forward,
    kl_spectral_samples_backward,
    kl_spectral_samples_forward,
    kl_transformer_attention,
    kl_transformer_backward,
    kl_transformer_forward,
)
from .laughing_hyena import (  # noqa: F401
    laughing_hyena,
    laughing_hyena_backward,
    laughing_hyena_forward,
    modal_filter,
    modal_filter_vjp,
    modal_ssm_recurrent,
)
from .linformer import (  # noqa: F401
    LINFORMER_SHARING,
    init_linformer_params,
    linformer_attention,
    linformer_attention_backward,
    linformer_attention_forward,
)
from .local_window import (  # noqa: F401
    band_attention_backward,
    band_attention_forward,
    band_keep_mask,
    clear_attention,
    clear_attention_backward,
    clear_attention_forward,
    clear_keep_mask,
    clear_proportional_scale,
)
from .masked_linear import (  # noqa: F401
    MASK_KINDS,
    grid_toeplitz_correlation_fft,
    grid_toeplitz_dense,
    grid_toeplitz_matvec_fft,
    masked_linear_attention,
    masked_linear_attention_backward,
    masked_linear_attention_forward,
    tree_distances,
    tree_exp_matvec,
)
from .mossformer import (  # noqa: F401
    mossformer_gated_joint_attention,
    mossformer_gated_joint_attention_backward,
    mossformer_gated_joint_attention_forward,
    mossformer_joint_attention_backward,
    mossformer_joint_attention_explicit,
    mossformer_joint_attention_forward,
)
from .mra import (  # noqa: F401
    MRA_MODES,
    mra_attention,
    mra_attention_backward,
    mra_attention_forward,
    mra_block_scores,
    mra_block_selection,
)
from .ms_deform_attn import (  # noqa: F401
    DISCRETE_CLAMPS,
    MSDA_METHODS,
    dfa3d_core_backward,
    dfa3d_core_forward,
    ms_deform_attn,
    ms_deform_attn_backward,
    ms_deform_attn_core_backward,
    ms_deform_attn_core_forward,
    ms_deform_attn_forward,
    msda_point_levels,
)
from .pde_ssm import (  # noqa: F401
    pde_ssm_mixer,
    pde_ssm_mixer_backward,
    pde_ssm_mixer_forward,
    pde_ssm_multiplier,
)
from .performer import (  # noqa: F401
    performer,
    performer_backward,
    performer_features_backward,
    performer_features_forward,
    performer_forward,
    performer_projection_matrix,
    validate_performer_config,
)
from .reformer_lsh import (  # noqa: F401
    lsh_attention_core_backward,
    lsh_attention_core_forward,
    lsh_hash,
    lsh_random_rotations,
    reformer_lsh_attention,
    reformer_lsh_attention_backward,
    reformer_lsh_attention_forward,
)
from .routing_transformer import (  # noqa: F401
    CAUSAL_RULES,
    routing_assignments,
    routing_attention,
    routing_attention_backward,
    routing_attention_forward,
    routing_kmeans_ema_update,
)
from .rpe_fft import (  # noqa: F401
    kernelized_rpe,
    kernelized_rpe_backward,
    kernelized_rpe_forward,
    toeplitz_correlation_fft,
    toeplitz_dense,
    toeplitz_matvec_fft,
)
from .seqcond import (  # noqa: F401
    init_seqcond_params,
    seqcond_attention,
    seqcond_attention_backward,
    seqcond_attention_forward,
    seqcond_sizes,
)
from .set_transformer import (  # noqa: F401
    BLOCKS,
    mab_backward,
    mab_forward,
    set_transformer,
    set_transformer_backward,
    set_transformer_forward,
)
from .sinkformer import (  # noqa: F401
    sinkformer_attention,
    sinkformer_backward,
    sinkformer_forward,
    sinkformer_layer,
    sinkformer_layer_backward,
    sinkformer_layer_forward,
    sinkhorn_log,
    sinkhorn_log_vjp,
)
from .sonnet_mvca import (  # noqa: F401
    coherence_quadratic_form,
    sonnet_mvca,
    sonnet_mvca_backward,
    sonnet_mvca_forward,
)
from .sparsek import (  # noqa: F401
    SPARSEK_GATES,
    sparsek_attention,
    sparsek_attention_backward,
    sparsek_attention_forward,
    sparsek_mask,
    sparsek_mask_backward,
    sparsek_mask_forward,
    sparsek_mask_vjp,
    sparsek_sets,
    sparsek_threshold,
)
from .spectraformer import (  # noqa: F401
    SPECTRA_COMPONENTS,
    SPECTRA_WEIGHTS,
    fastfood_draw,
    fastfood_matrix,
    fastfood_matrix_vjp,
    spectraformer_attention,
    spectraformer_backward,
    spectraformer_features_backward,
    spectraformer_features_forward,
    spectraformer_forward,
    spectraformer_weight_matrix,
    walsh_hadamard,
)
from .stack_attention import (  # noqa: F401
    stack_attention,
    stack_attention_backward,
    stack_attention_forward,
    superposition_stack_forward,
)
from .tcnca import (  # noqa: F401
    init_tcnca_params,
    tcn_forward,
    tcnca_attention,
    tcnca_attention_backward,
    tcnca_attention_forward,
)
from .titans import (  # noqa: F401
    memory_l2,
    memory_l2_vjp,
    titans_memory,
    titans_memory_backward,
    titans_memory_forward,
    titans_memory_scan,
    validate_memory_params,
)
from .topk_attention import (  # noqa: F401
    mips_to_nns,
    topk_attention,
    topk_attention_backward,
    topk_attention_forward,
    topk_selection,
)
from .transnormer import (  # noqa: F401
    TRANSNORMER_FEATURE_MAPS,
    TRANSNORMER_NORMS,
    diag_attention_backward,
    diag_attention_forward,
    transnormer,
    transnormer_backward,
    transnormer_forward,
    transnormer_layer,
    transnormer_layer_backward,
    transnormer_layer_forward,
)
from .two_mamba import (  # noqa: F401
    second_order_features,
    second_order_features_vjp,
    two_mamba,
    two_mamba_backward,
    two_mamba_explicit,
    two_mamba_forward,
    two_mamba_scan_backward,
    two_mamba_scan_forward,
)
from .udit import (  # noqa: F401
    UDIT_ATTN_TYPES,
    UDIT_POSEMB,
    udit_attention,
    udit_attention_backward,
    udit_attention_forward,
    udit_polyphase_merge,
    udit_polyphase_split,
    udit_rope2d_angles,
)
from .vcc import (  # noqa: F401
    VCC_SCORE_GRADIENTS,
    vcc_block_relevance,
    vcc_layer,
    vcc_layer_backward,
    vcc_layer_forward,
    vcc_sort_tokens,
)
from .wavspa import (  # noqa: F401
    WAVELET_BOUNDARIES,
    daubechies_filter,
    wavedec,
    wavedec_vjp,
    wavelet_qmf,
    waverec,
    waverec_vjp,
    wavspa_attention,
    wavspa_attention_backward,
    wavspa_attention_forward,
)

__all__ = [
    "adaptive_filter_attention", "adaptive_filter_attention_backward", "adaptive_filter_attention_forward",
    "atlas_omega", "atlas_omega_backward", "atlas_omega_forward", "omega_rule_scan", "COMBINER_POOLING",
    "COMBINER_VARIANTS", "combiner_attention", "combiner_attention_backward", "combiner_attention_forward",
    "combiner_core_backward", "combiner_core_forward", "combiner_dense_matrix", "combiner_region_summaries",
    "CONDAFORMER_PLANES", "condaformer_attention", "condaformer_attention_backward", "condaformer_attention_forward",
    "condaformer_plane_windows", "init_condaformer_params", "FEATURE_MAPS", "feature_map_backward",
    "feature_map_forward", "gather_rows", "l2_normalize", "l2_normalize_vjp", "linear_core_backward",
    "linear_core_forward", "mT", "scatter_add_rows", "topk_keep", "validate_linear_qkv", "DARTS_GT_CANDIDATES",
    "darts_gt_attention", "darts_gt_attention_backward", "darts_gt_attention_forward", "das_attention_gate",
    "das_attention_gate_backward", "das_attention_gate_forward", "das_sampling_points", "init_das_params",
    "DRSFORMER_RATIOS", "drsformer_tksa", "drsformer_tksa_backward", "drsformer_tksa_forward", "drsformer_topk_sizes",
    "BIAS_FORMS", "dynamic_mask_attention", "dynamic_mask_attention_backward", "dynamic_mask_attention_forward",
    "dynamic_mask_bias", "binary_linear_attention_backward", "binary_linear_attention_forward", "ecoformer_attention",
    "ecoformer_attention_backward", "ecoformer_attention_forward", "ecoformer_hash_backward", "ecoformer_hash_forward",
    "efficient_attention", "efficient_attention_backward", "efficient_attention_forward", "efficient_attention_layer",
    "efficient_attention_layer_backward", "efficient_attention_layer_forward", "ETC_ROLES", "etc_band_indices",
    "etc_global_local_attention", "etc_global_local_attention_backward", "etc_global_local_attention_forward",
    "etc_local_relative_position_ids", "etc_relative_position_ids", "init_etc_params", "FASTMAX_NORMALIZE",
    "fastmax_attention", "fastmax_backward", "fastmax_features", "fastmax_forward", "fastmax_normalize_backward",
    "fastmax_normalize_forward", "FLATFORMER_BLOCK_ORDERS", "equal_size_groups", "flatformer_block",
    "flatformer_block_backward", "flatformer_block_forward", "flatformer_layer", "flatformer_layer_backward",
    "flatformer_layer_forward", "flatformer_positional_embedding", "flattened_window_order", "init_flatformer_params",
    "dct_ortho", "dct_truncate", "dct_truncate_vjp", "fourier_dct_attention", "fourier_dct_attention_backward",
    "fourier_dct_attention_forward", "idct_ortho", "causal_fft_conv", "causal_fft_conv_vjp", "hyena_filter_backward",
    "hyena_filter_forward", "hyena_modulation_deltas", "hyena_operator", "hyena_operator_backward",
    "hyena_operator_forward", "hyena_positional_embedding", "init_hyena_operator_params", "focus_map_backward",
    "focus_map_forward", "hypformer_attention", "hypformer_attention_backward", "hypformer_attention_forward",
    "lorentz_lift", "lorentz_lift_backward", "informer_attention", "informer_attention_backward",
    "informer_attention_forward", "informer_distil_backward", "informer_distil_forward",
    "probsparse_attention_backward", "probsparse_attention_forward", "probsparse_index_sample", "probsparse_measure",
    "probsparse_sizes", "INFSA_VARIANTS", "infsa_attention", "infsa_attention_backward", "infsa_attention_forward",
    "infsa_scores_backward", "infsa_scores_forward", "causal_linear_attention_backward",
    "causal_linear_attention_forward", "linear_attention", "linear_attention_backward", "linear_attention_explicit",
    "linear_attention_forward", "KL_FEATURES", "kl_features_backward", "kl_features_forward",
    "kl_spectral_samples_backward", "kl_spectral_samples_forward", "kl_transformer_attention",
    "kl_transformer_backward", "kl_transformer_forward", "laughing_hyena", "laughing_hyena_backward",
    "laughing_hyena_forward", "modal_filter", "modal_filter_vjp", "modal_ssm_recurrent", "LINFORMER_SHARING",
    "init_linformer_params", "linformer_attention", "linformer_attention_backward", "linformer_attention_forward",
    "band_attention_backward", "band_attention_forward", "band_keep_mask", "clear_attention",
    "clear_attention_backward", "clear_attention_forward", "clear_keep_mask", "clear_proportional_scale", "MASK_KINDS",
    "grid_toeplitz_correlation_fft", "grid_toeplitz_dense", "grid_toeplitz_matvec_fft", "masked_linear_attention",
    "masked_linear_attention_backward", "masked_linear_attention_forward", "tree_distances", "tree_exp_matvec",
    "mossformer_gated_joint_attention", "mossformer_gated_joint_attention_backward",
    "mossformer_gated_joint_attention_forward", "mossformer_joint_attention_backward",
    "mossformer_joint_attention_explicit", "mossformer_joint_attention_forward", "MRA_MODES", "mra_attention",
    "mra_attention_backward", "mra_attention_forward", "mra_block_scores", "mra_block_selection", "DISCRETE_CLAMPS",
    "MSDA_METHODS", "dfa3d_core_backward", "dfa3d_core_forward", "ms_deform_attn", "ms_deform_attn_backward",
    "ms_deform_attn_core_backward", "ms_deform_attn_core_forward", "ms_deform_attn_forward", "msda_point_levels",
    "pde_ssm_mixer", "pde_ssm_mixer_backward", "pde_ssm_mixer_forward", "pde_ssm_multiplier", "performer",
    "performer_backward", "performer_features_backward", "performer_features_forward", "performer_forward",
    "performer_projection_matrix", "validate_performer_config", "lsh_attention_core_backward",
    "lsh_attention_core_forward", "lsh_hash", "lsh_random_rotations", "reformer_lsh_attention",
    "reformer_lsh_attention_backward", "reformer_lsh_attention_forward", "CAUSAL_RULES", "routing_assignments",
    "routing_attention", "routing_attention_backward", "routing_attention_forward", "routing_kmeans_ema_update",
    "kernelized_rpe", "kernelized_rpe_backward", "kernelized_rpe_forward", "toeplitz_correlation_fft", "toeplitz_dense",
    "toeplitz_matvec_fft", "init_seqcond_params", "seqcond_attention", "seqcond_attention_backward",
    "seqcond_attention_forward", "seqcond_sizes", "BLOCKS", "mab_backward", "mab_forward", "set_transformer",
    "set_transformer_backward", "set_transformer_forward", "sinkformer_attention", "sinkformer_backward",
    "sinkformer_forward", "sinkformer_layer", "sinkformer_layer_backward", "sinkformer_layer_forward", "sinkhorn_log",
    "sinkhorn_log_vjp", "coherence_quadratic_form", "sonnet_mvca", "sonnet_mvca_backward", "sonnet_mvca_forward",
    "SPARSEK_GATES", "sparsek_attention", "sparsek_attention_backward", "sparsek_attention_forward", "sparsek_mask",
    "sparsek_mask_backward", "sparsek_mask_forward", "sparsek_mask_vjp", "sparsek_sets", "sparsek_threshold",
    "SPECTRA_COMPONENTS", "SPECTRA_WEIGHTS", "fastfood_draw", "fastfood_matrix", "fastfood_matrix_vjp",
    "spectraformer_attention", "spectraformer_backward", "spectraformer_features_backward",
    "spectraformer_features_forward", "spectraformer_forward", "spectraformer_weight_matrix", "walsh_hadamard",
    "stack_attention", "stack_attention_backward", "stack_attention_forward", "superposition_stack_forward",
    "init_tcnca_params", "tcn_forward", "tcnca_attention", "tcnca_attention_backward", "tcnca_attention_forward",
    "memory_l2", "memory_l2_vjp", "titans_memory", "titans_memory_backward", "titans_memory_forward",
    "titans_memory_scan", "validate_memory_params", "mips_to_nns", "topk_attention", "topk_attention_backward",
    "topk_attention_forward", "topk_selection", "TRANSNORMER_FEATURE_MAPS", "TRANSNORMER_NORMS",
    "diag_attention_backward", "diag_attention_forward", "transnormer", "transnormer_backward", "transnormer_forward",
    "transnormer_layer", "transnormer_layer_backward", "transnormer_layer_forward", "second_order_features",
    "second_order_features_vjp", "two_mamba", "two_mamba_backward", "two_mamba_explicit", "two_mamba_forward",
    "two_mamba_scan_backward", "two_mamba_scan_forward", "UDIT_ATTN_TYPES", "UDIT_POSEMB", "udit_attention",
    "udit_attention_backward", "udit_attention_forward", "udit_polyphase_merge", "udit_polyphase_split",
    "udit_rope2d_angles", "VCC_SCORE_GRADIENTS", "vcc_block_relevance", "vcc_layer", "vcc_layer_backward",
    "vcc_layer_forward", "vcc_sort_tokens", "WAVELET_BOUNDARIES", "daubechies_filter", "wavedec", "wavedec_vjp",
    "wavelet_qmf", "waverec", "waverec_vjp", "wavspa_attention", "wavspa_attention_backward",
    "wavspa_attention_forward",
]
