"""Package init (temporary during the split)."""

from .core import (  # noqa: F401
    FEATURE_MAPS,
    feature_map_forward,
    feature_map_backward,
    linear_attention_forward,
    linear_attention_backward,
    linear_attention,
    linear_attention_explicit,
    causal_linear_attention_forward,
    causal_linear_attention_backward,
    efficient_attention_forward,
    efficient_attention_backward,
    efficient_attention,
    performer_projection_matrix,
    performer_features_forward,
    performer_features_backward,
    performer_forward,
    performer_backward,
    performer,
    transnormer_forward,
    transnormer_backward,
    transnormer,
    diag_attention_forward,
    diag_attention_backward,
    toeplitz_matvec_fft,
    toeplitz_correlation_fft,
    toeplitz_dense,
    kernelized_rpe_forward,
    kernelized_rpe_backward,
    kernelized_rpe,
)
from .set_transformer import (  # noqa: F401
    mab_forward,
    mab_backward,
    set_transformer_forward,
    set_transformer_backward,
    set_transformer,
    BLOCKS,
)
from .sinkformer import (  # noqa: F401
    sinkformer_forward,
    sinkformer_backward,
    sinkformer_attention,
    sinkhorn_log,
)

__all__ = ['FEATURE_MAPS', 'feature_map_forward', 'feature_map_backward', 'linear_attention_forward', 'linear_attention_backward', 'linear_attention', 'linear_attention_explicit', 'causal_linear_attention_forward', 'causal_linear_attention_backward', 'efficient_attention_forward', 'efficient_attention_backward', 'efficient_attention', 'performer_projection_matrix', 'performer_features_forward', 'performer_features_backward', 'performer_forward', 'performer_backward', 'performer', 'transnormer_forward', 'transnormer_backward', 'transnormer', 'diag_attention_forward', 'diag_attention_backward', 'toeplitz_matvec_fft', 'toeplitz_correlation_fft', 'toeplitz_dense', 'kernelized_rpe_forward', 'kernelized_rpe_backward', 'kernelized_rpe', 'mab_forward', 'mab_backward', 'set_transformer_forward', 'set_transformer_backward', 'set_transformer', 'BLOCKS', 'sinkformer_forward', 'sinkformer_backward', 'sinkformer_attention', 'sinkhorn_log']
