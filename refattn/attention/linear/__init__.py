"""Linear, kernel and set attention (catalogue family 4), one module per mechanism.

* `core`: the helpers the family shares (feature maps, the linear-attention core with its causal
  scan, validation); registers nothing.
* `katharopoulos`: linear attention, "Transformers are RNNs" (record
  ``linear_attention_katharopoulos``), with the causal prefix-state scan the kernels mirror.
* `efficient`: Efficient Attention of Shen et al. (``efficient_attention_shen``).
* `performer`: Performer FAVOR+ positive random features (``performer_favor_plus``).
* `transnormer`: TransNormer NormAttention and DiagAttention (``transnormer_norm_attention``).
* `rpe_fft`: kernelized attention with relative positional encoding via FFT
  (``kernelized_attention_rpe_fft``).
* `set_transformer`: Set Transformer MAB / SAB / ISAB / PMA (``set_transformer_blocks``).
* `sinkformer`: doubly stochastic attention by log-domain Sinkhorn (``sinkformer_attention``).
* `topk_attention`: top-k (k-NN retrieved) softmax attention, IceFormer's exact reference
  (``topk_attention``).
* `drsformer_tksa`: DRSformer top-k sparse channel attention (``drsformer_topk_channel_attention``).
* `informer_probsparse`: Informer ProbSparse attention layer and distilling layer
  (``informer_probsparse_attention``).
* `reformer_lsh`: Reformer LSH self-attention (``reformer_lsh_attention``).
* `sparsek`: the SPARSEK operator and SPARSEK attention (``sparsek_attention``).
* `routing_transformer`: Routing Transformer online k-means routing (``routing_transformer_kmeans``).
* `dynamic_mask`: DMA, value-generated dynamic bias and top-k mask (``dynamic_mask_attention``).
* `linformer`: Linformer sequence-axis low-rank projections (``linformer_low_rank_attention``).
* `combiner`: Combiner full attention by structured factorisation (``combiner_attention``).
* `fourier_dct`: Fourier Transformer DCT sequence truncation (``fourier_transformer_dct``).
* `udit`: U-DiT downsampled-token (polyphase) attention (``udit_downsampled_token_attention``).
* `wavspa`: WavSpA attention in wavelet coefficient space (``wavelet_space_attention``).
* `mra`: MRA-2 multiresolution approximation of attention (``mra_multiresolution_attention``).
* `vcc`: VCC VIP-token centric compression (``vcc_vip_token_compression``).

Every public name of these modules is re-exported here, so
``from refattn.attention.linear import causal_linear_attention_forward`` works.

A convenience wrapper named like its module (``performer``, ``transnormer``) is not re-exported, so that the
module name keeps naming the module: call it as ``refattn.attention.linear.<module>.<name>``.
"""

from __future__ import annotations

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
from .drsformer_tksa import (  # noqa: F401
    DRSFORMER_RATIOS,
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
from .efficient import (  # noqa: F401
    efficient_attention,
    efficient_attention_backward,
    efficient_attention_forward,
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
from .katharopoulos import (  # noqa: F401
    causal_linear_attention_backward,
    causal_linear_attention_forward,
    linear_attention,
    linear_attention_backward,
    linear_attention_explicit,
    linear_attention_forward,
)
from .linformer import (  # noqa: F401
    LINFORMER_SHARING,
    init_linformer_params,
    linformer_attention,
    linformer_attention_backward,
    linformer_attention_forward,
)
from .mra import (  # noqa: F401
    MRA_MODES,
    mra_attention,
    mra_attention_backward,
    mra_attention_forward,
    mra_block_scores,
    mra_block_selection,
)
from .performer import (  # noqa: F401
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
from .set_transformer import (  # noqa: F401
    BLOCKS,
    mab_backward,
    mab_forward,
    set_transformer_backward,
    set_transformer_forward,
)
from .sinkformer import (  # noqa: F401
    sinkformer_attention,
    sinkformer_backward,
    sinkformer_forward,
    sinkhorn_log,
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
from .topk_attention import (  # noqa: F401
    mips_to_nns,
    topk_attention_backward,
    topk_attention_forward,
    topk_selection,
)
from .transnormer import (  # noqa: F401
    diag_attention_backward,
    diag_attention_forward,
    transnormer_backward,
    transnormer_forward,
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
    "FEATURE_MAPS",
    "feature_map_backward",
    "feature_map_forward",
    "linear_core_backward",
    "linear_core_forward",
    "mT",
    "validate_linear_qkv",
    "topk_keep",
    "gather_rows",
    "scatter_add_rows",
    "l2_normalize",
    "l2_normalize_vjp",
    "DRSFORMER_RATIOS",
    "drsformer_tksa_backward",
    "drsformer_tksa_forward",
    "drsformer_topk_sizes",
    "informer_attention",
    "informer_attention_backward",
    "informer_attention_forward",
    "informer_distil_backward",
    "informer_distil_forward",
    "probsparse_attention_backward",
    "probsparse_attention_forward",
    "probsparse_index_sample",
    "probsparse_measure",
    "probsparse_sizes",
    "lsh_attention_core_backward",
    "lsh_attention_core_forward",
    "lsh_hash",
    "lsh_random_rotations",
    "reformer_lsh_attention",
    "reformer_lsh_attention_backward",
    "reformer_lsh_attention_forward",
    "CAUSAL_RULES",
    "routing_assignments",
    "routing_attention",
    "routing_attention_backward",
    "routing_attention_forward",
    "routing_kmeans_ema_update",
    "SPARSEK_GATES",
    "sparsek_attention",
    "sparsek_attention_backward",
    "sparsek_attention_forward",
    "sparsek_mask",
    "sparsek_mask_backward",
    "sparsek_mask_forward",
    "sparsek_mask_vjp",
    "sparsek_sets",
    "sparsek_threshold",
    "BIAS_FORMS",
    "dynamic_mask_attention",
    "dynamic_mask_attention_backward",
    "dynamic_mask_attention_forward",
    "dynamic_mask_bias",
    "mips_to_nns",
    "topk_attention_backward",
    "topk_attention_forward",
    "topk_selection",
    "efficient_attention",
    "efficient_attention_backward",
    "efficient_attention_forward",
    "causal_linear_attention_backward",
    "causal_linear_attention_forward",
    "linear_attention",
    "linear_attention_backward",
    "linear_attention_explicit",
    "linear_attention_forward",
    "performer_backward",
    "performer_features_backward",
    "performer_features_forward",
    "performer_forward",
    "performer_projection_matrix",
    "validate_performer_config",
    "kernelized_rpe",
    "kernelized_rpe_backward",
    "kernelized_rpe_forward",
    "toeplitz_correlation_fft",
    "toeplitz_dense",
    "toeplitz_matvec_fft",
    "BLOCKS",
    "mab_backward",
    "mab_forward",
    "set_transformer_backward",
    "set_transformer_forward",
    "sinkformer_attention",
    "sinkformer_backward",
    "sinkformer_forward",
    "sinkhorn_log",
    "diag_attention_backward",
    "diag_attention_forward",
    "transnormer_backward",
    "transnormer_forward",
    "LINFORMER_SHARING",
    "init_linformer_params",
    "linformer_attention",
    "linformer_attention_backward",
    "linformer_attention_forward",
    "COMBINER_POOLING",
    "COMBINER_VARIANTS",
    "combiner_attention",
    "combiner_attention_backward",
    "combiner_attention_forward",
    "combiner_core_backward",
    "combiner_core_forward",
    "combiner_dense_matrix",
    "combiner_region_summaries",
    "dct_ortho",
    "dct_truncate",
    "dct_truncate_vjp",
    "fourier_dct_attention",
    "fourier_dct_attention_backward",
    "fourier_dct_attention_forward",
    "idct_ortho",
    "UDIT_ATTN_TYPES",
    "UDIT_POSEMB",
    "udit_attention",
    "udit_attention_backward",
    "udit_attention_forward",
    "udit_polyphase_merge",
    "udit_polyphase_split",
    "udit_rope2d_angles",
    "WAVELET_BOUNDARIES",
    "daubechies_filter",
    "wavedec",
    "wavedec_vjp",
    "waverec",
    "waverec_vjp",
    "wavelet_qmf",
    "wavspa_attention",
    "wavspa_attention_backward",
    "wavspa_attention_forward",
    "MRA_MODES",
    "mra_attention",
    "mra_attention_backward",
    "mra_attention_forward",
    "mra_block_scores",
    "mra_block_selection",
    "VCC_SCORE_GRADIENTS",
    "vcc_block_relevance",
    "vcc_layer",
    "vcc_layer_backward",
    "vcc_layer_forward",
    "vcc_sort_tokens",
]
