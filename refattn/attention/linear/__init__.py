"""Linear, kernel and set attention (catalogue family 4), one module per mechanism.

* `core`: the helpers the family shares (feature maps, the linear-attention core with its causal
  scan, validation); registers nothing.
* `katharopoulos`: linear attention, "Transformers are RNNs" (record
  ``linear_attention_katharopoulos``), with the causal prefix-state scan the kernels mirror.
* `ecoformer`: EcoFormer kernelised-hashing binary linear attention (``ecoformer_hash_attention``).
* `efficient`: Efficient Attention of Shen et al. (``efficient_attention_shen``).
* `masked_linear`: structured-mask linear attention, causal / Toeplitz / d-dim RPE by FFT / tree
  masks (``masked_linear_attention_structured``).
* `performer`: Performer FAVOR+ positive random features (``performer_favor_plus``).
* `transnormer`: TransNormer NormAttention, its full layer and DiagAttention (``transnormer_norm_attention``).
* `rpe_fft`: kernelized attention with relative positional encoding via FFT
  (``kernelized_attention_rpe_fft``).
* `set_transformer`: Set Transformer MAB / SAB / ISAB / PMA (``set_transformer_blocks``).
* `sinkformer`: doubly stochastic attention by log-domain Sinkhorn (``sinkformer_attention``).
* `fastmax`: Fastmax / FAST factorisable polynomial-kernel attention (``fastmax_polynomial_attention``).
* `hypformer`: Hypformer linear focused attention in the Lorentz model
  (``hypformer_lorentz_linear_attention``).
* `infsa`: Infinite Self-Attention and Linear-InfSA (``linear_infsa_neumann``).
* `kl_transformer`: learned spectral-kernel random features, GMM / FastFood / generator
  (``kl_transformer_learned_spectral_kernel``).
* `spectraformer`: weight matrix x component function random features
  (``spectraformer_random_features``), with the FastFood / Hadamard helpers.

Every public name of these modules is re-exported here, so
``from refattn.attention.linear import causal_linear_attention_forward`` works.

A convenience wrapper named like its module (``performer``, ``transnormer``) is not re-exported, so that the
module name keeps naming the module: call it as ``refattn.attention.linear.<module>.<name>``.
"""

from __future__ import annotations

from .core import (  # noqa: F401
    FEATURE_MAPS,
    feature_map_backward,
    feature_map_forward,
    gather_rows,
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
from .topk_attention import (  # noqa: F401
    mips_to_nns,
    topk_attention_backward,
    topk_attention_forward,
    topk_selection,
)
from .transnormer import (  # noqa: F401
    TRANSNORMER_FEATURE_MAPS,
    TRANSNORMER_NORMS,
    diag_attention_backward,
    diag_attention_forward,
    transnormer_backward,
    transnormer_forward,
    transnormer_layer,
    transnormer_layer_backward,
    transnormer_layer_forward,
)

__all__ = [
    "FEATURE_MAPS",
    "feature_map_backward",
    "feature_map_forward",
    "gather_rows",
    "linear_core_backward",
    "linear_core_forward",
    "mT",
    "scatter_add_rows",
    "topk_keep",
    "validate_linear_qkv",
    "DRSFORMER_RATIOS",
    "drsformer_tksa_backward",
    "drsformer_tksa_forward",
    "drsformer_topk_sizes",
    "BIAS_FORMS",
    "dynamic_mask_attention",
    "dynamic_mask_attention_backward",
    "dynamic_mask_attention_forward",
    "dynamic_mask_bias",
    "binary_linear_attention_backward",
    "binary_linear_attention_forward",
    "ecoformer_attention",
    "ecoformer_attention_backward",
    "ecoformer_attention_forward",
    "ecoformer_hash_backward",
    "ecoformer_hash_forward",
    "efficient_attention",
    "efficient_attention_backward",
    "efficient_attention_forward",
    "FASTMAX_NORMALIZE",
    "fastmax_attention",
    "fastmax_backward",
    "fastmax_features",
    "fastmax_forward",
    "fastmax_normalize_backward",
    "fastmax_normalize_forward",
    "focus_map_backward",
    "focus_map_forward",
    "hypformer_attention",
    "hypformer_attention_backward",
    "hypformer_attention_forward",
    "lorentz_lift",
    "lorentz_lift_backward",
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
    "INFSA_VARIANTS",
    "infsa_attention",
    "infsa_attention_backward",
    "infsa_attention_forward",
    "infsa_scores_backward",
    "infsa_scores_forward",
    "causal_linear_attention_backward",
    "causal_linear_attention_forward",
    "linear_attention",
    "linear_attention_backward",
    "linear_attention_explicit",
    "linear_attention_forward",
    "KL_FEATURES",
    "kl_features_backward",
    "kl_features_forward",
    "kl_spectral_samples_backward",
    "kl_spectral_samples_forward",
    "kl_transformer_attention",
    "kl_transformer_backward",
    "kl_transformer_forward",
    "MASK_KINDS",
    "grid_toeplitz_correlation_fft",
    "grid_toeplitz_dense",
    "grid_toeplitz_matvec_fft",
    "masked_linear_attention",
    "masked_linear_attention_backward",
    "masked_linear_attention_forward",
    "tree_distances",
    "tree_exp_matvec",
    "performer_backward",
    "performer_features_backward",
    "performer_features_forward",
    "performer_forward",
    "performer_projection_matrix",
    "validate_performer_config",
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
    "SPECTRA_COMPONENTS",
    "SPECTRA_WEIGHTS",
    "fastfood_draw",
    "fastfood_matrix",
    "fastfood_matrix_vjp",
    "spectraformer_attention",
    "spectraformer_backward",
    "spectraformer_features_backward",
    "spectraformer_features_forward",
    "spectraformer_forward",
    "spectraformer_weight_matrix",
    "walsh_hadamard",
    "mips_to_nns",
    "topk_attention_backward",
    "topk_attention_forward",
    "topk_selection",
    "diag_attention_backward",
    "diag_attention_forward",
    "transnormer_backward",
    "transnormer_forward",
    "transnormer_layer",
    "transnormer_layer_backward",
    "transnormer_layer_forward",
    "TRANSNORMER_FEATURE_MAPS",
    "TRANSNORMER_NORMS",
]
