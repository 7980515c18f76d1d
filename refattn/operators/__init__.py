"""Operator-learning attention and neural-operator layers."""

from .anie import anie_backward, anie_forward, anie_solve, init_anie_params  # noqa: F401
from .anisotropic_rbf import anisotropic_rbf_backward, anisotropic_rbf_forward, tangent_frames  # noqa: F401
from .gno_kernel_integral import (  # noqa: F401
    gno_kernel_integral_backward,
    gno_kernel_integral_forward,
    init_gno_params,
    radius_neighbors,
    sinusoidal_embedding,
    sinusoidal_embedding_vjp,
)
from .mamba import (  # noqa: F401
    linear_scan,
    selective_scan,
    selective_scan_backward,
    selective_scan_forward,
    softplus,
)
from .mamba_neural_operator import (  # noqa: F401
    init_mno_ss2d_params,
    mno_ss2d,
    mno_ss2d_backward,
    mno_ss2d_forward,
    scan_order_permutations,
)
from .multiwavelet import (  # noqa: F401
    init_mwt_cz1d_params,
    multiwavelet_filters,
    mwt_cz1d,
    mwt_cz1d_backward,
    mwt_cz1d_forward,
    mwt_decompose,
    mwt_reconstruct,
)
from .pde_transformer_channel_attention import (  # noqa: F401
    init_pde_channel_attention_params,
    pde_channel_attention,
    pde_channel_attention_backward,
    pde_channel_attention_forward,
)
from .pinto import init_pinto_params, pinto_backward, pinto_forward  # noqa: F401
from .schwarz_attention import (  # noqa: F401
    coarse_hat_basis,
    overlapping_subdomains,
    partition_of_unity,
    schwarz_attention_backward,
    schwarz_attention_forward,
)

__all__ = [
    "selective_scan_forward",
    "selective_scan_backward",
    "selective_scan",
    "linear_scan",
    "softplus",
    "mno_ss2d_forward",
    "mno_ss2d_backward",
    "mno_ss2d",
    "scan_order_permutations",
    "init_mno_ss2d_params",
    "radius_neighbors",
    "sinusoidal_embedding",
    "sinusoidal_embedding_vjp",
    "gno_kernel_integral_forward",
    "gno_kernel_integral_backward",
    "init_gno_params",
    "pinto_forward",
    "pinto_backward",
    "init_pinto_params",
    "anie_forward",
    "anie_backward",
    "anie_solve",
    "init_anie_params",
    "anisotropic_rbf_forward",
    "anisotropic_rbf_backward",
    "tangent_frames",
    "schwarz_attention_forward",
    "schwarz_attention_backward",
    "overlapping_subdomains",
    "partition_of_unity",
    "coarse_hat_basis",
    "pde_channel_attention_forward",
    "pde_channel_attention_backward",
    "pde_channel_attention",
    "init_pde_channel_attention_params",
    "multiwavelet_filters",
    "mwt_decompose",
    "mwt_reconstruct",
    "mwt_cz1d_forward",
    "mwt_cz1d_backward",
    "mwt_cz1d",
    "init_mwt_cz1d_params",
]
