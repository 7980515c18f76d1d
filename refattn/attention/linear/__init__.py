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
    linear_core_backward,
    linear_core_forward,
    mT,
    validate_linear_qkv,
)
from .efficient import (  # noqa: F401
    efficient_attention,
    efficient_attention_backward,
    efficient_attention_forward,
)
from .katharopoulos import (  # noqa: F401
    causal_linear_attention_backward,
    causal_linear_attention_forward,
    linear_attention,
    linear_attention_backward,
    linear_attention_explicit,
    linear_attention_forward,
)
from .performer import (  # noqa: F401
    performer_backward,
    performer_features_backward,
    performer_features_forward,
    performer_forward,
    performer_projection_matrix,
    validate_performer_config,
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
    sinkhorn_log_vjp,
)
from .transnormer import (  # noqa: F401
    diag_attention_backward,
    diag_attention_forward,
    transnormer_backward,
    transnormer_forward,
)

__all__ = [
    "FEATURE_MAPS",
    "feature_map_backward",
    "feature_map_forward",
    "linear_core_backward",
    "linear_core_forward",
    "mT",
    "validate_linear_qkv",
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
    "sinkhorn_log_vjp",
    "diag_attention_backward",
    "diag_attention_forward",
    "transnormer_backward",
    "transnormer_forward",
]
