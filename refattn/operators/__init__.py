"""Operator-learning attention and neural-operator layers (catalogue family 3), one module per mechanism.

Attention on discretised functions (``docs/operator-attention.md``): ``galerkin`` (Galerkin- and
Fourier-type attention, one derivation), ``oformer``, ``gnot`` (heterogeneous normalized
attention), ``gnot_moe`` (geometric-gating mixture of experts), ``transolver`` (Physics-Attention),
``linear_no``, ``gale`` (GeoTransolver), ``ipot``. Neural-operator layers
(``docs/neural-operators.md``): ``fno``, ``afno`` (AFNO/DPOT mixer), ``factformer``,
``ifactformer``, ``ono``, ``continuum``, ``coda_no``, ``scot`` (Poseidon). ``common`` holds the
helpers several of them share (real-FFT adjoints, the Physics-Attention slice front, axial kernels,
initialisers); ``_samples`` the samplers and checks several registry records share. Kernel
integrals and scans (``docs/operators/``): ``mamba`` (the selective scan), ``mamba_neural_operator``,
``gno_kernel_integral``, ``pinto``, ``anie``, ``anisotropic_rbf``, ``schwarz_attention``,
``pde_transformer_channel_attention``.

Every public function of those modules is importable from here, e.g.
``from refattn.operators import fno_spectral_conv_forward``.
"""

from __future__ import annotations

from .afno import (  # noqa: F401
    afno_mixer,
    afno_mixer_backward,
    afno_mixer_forward,
    init_afno_params,
)
from .anie import (  # noqa: F401
    anie_backward,
    anie_forward,
    anie_solve,
    init_anie_params,
)
from .anisotropic_rbf import (  # noqa: F401
    anisotropic_rbf_backward,
    anisotropic_rbf_forward,
    tangent_frames,
)
from .coda_no import (  # noqa: F401
    codomain_attention,
    codomain_attention_backward,
    codomain_attention_forward,
)
from .common import (  # noqa: F401
    FFT_NORMS,
    axial_kernel_grads,
    axial_kernels,
    cast_complex,
    check_tau_clamp,
    fft_scales,
    irfftn_adjoint,
    mirror_count,
    orthogonal_init,
    physics_front_backward,
    physics_front_forward,
    physics_front_init,
    physics_front_spec,
    rfftn_adjoint,
    slice_dims,
    slice_tokens_backward,
    slice_tokens_forward,
    swap_last,
    tempered_softmax_backward,
    tempered_softmax_forward,
    validate_axial_operands,
    validate_physics_front,
    xavier_uniform,
)
from .continuum import (  # noqa: F401
    continuum_attention,
    continuum_attention_backward,
    continuum_attention_forward,
    trapezoid_weights,
)
from .factformer import (  # noqa: F401
    factformer_attention,
    factformer_attention_backward,
    factformer_attention_forward,
    factformer_block_backward,
    factformer_block_forward,
    factformer_block_param_shapes,
    init_factformer_block_params,
)
from .fno import (  # noqa: F401
    fno_spectral_conv,
    fno_spectral_conv_backward,
    fno_spectral_conv_explicit,
    fno_spectral_conv_forward,
    init_fno_params,
)
from .gale import (  # noqa: F401
    gale_init_params,
    geotransolver_gale,
    geotransolver_gale_backward,
    geotransolver_gale_forward,
)
from .galerkin import (  # noqa: F401
    fourier_type_attention,
    fourier_type_attention_backward,
    fourier_type_attention_forward,
    galerkin_attention,
    galerkin_attention_backward,
    galerkin_attention_forward,
    init_params,
)
from .gno_kernel_integral import (  # noqa: F401
    gno_kernel_integral_backward,
    gno_kernel_integral_forward,
    init_gno_params,
    radius_neighbors,
    sinusoidal_embedding,
    sinusoidal_embedding_vjp,
)
from .gnot import (  # noqa: F401
    gnot_hna_attention,
    gnot_hna_attention_backward,
    gnot_hna_attention_forward,
    gnot_hna_init_params,
)
from .gnot_moe import (  # noqa: F401
    gnot_geometric_gating_moe,
    gnot_geometric_gating_moe_backward,
    gnot_geometric_gating_moe_forward,
    gnot_moe_init_params,
)
from .ifactformer import (  # noqa: F401
    ifactformer_m_attention,
    ifactformer_m_attention_backward,
    ifactformer_m_attention_forward,
)
from .ipot import (  # noqa: F401
    ipot_inducing_point_operator,
    ipot_inducing_point_operator_backward,
    ipot_inducing_point_operator_forward,
    ipot_init_params,
)
from .linear_no import (  # noqa: F401
    linear_no_attention,
    linear_no_attention_backward,
    linear_no_attention_forward,
    linear_no_init_params,
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
from .oformer import (  # noqa: F401
    oformer_attention,
    oformer_attention_backward,
    oformer_attention_forward,
    oformer_init_params,
)
from .ono import (  # noqa: F401
    cholesky_vjp,
    ono_attention,
    ono_attention_backward,
    ono_attention_forward,
    psd_safe_cholesky,
)
from .pde_transformer_channel_attention import (  # noqa: F401
    init_pde_channel_attention_params,
    pde_channel_attention,
    pde_channel_attention_backward,
    pde_channel_attention_forward,
)
from .pinto import (  # noqa: F401
    init_pinto_params,
    pinto_backward,
    pinto_forward,
)
from .schwarz_attention import (  # noqa: F401
    coarse_hat_basis,
    overlapping_subdomains,
    partition_of_unity,
    schwarz_attention_backward,
    schwarz_attention_forward,
)
from .scot import (  # noqa: F401
    conditional_layer_norm,
    init_scot_params,
    scot_layer,
    scot_layer_backward,
    scot_layer_forward,
    scot_param_shapes,
)
from .transolver import (  # noqa: F401
    transolver_init_params,
    transolver_physics_attention,
    transolver_physics_attention_backward,
    transolver_physics_attention_forward,
)

__all__ = [
    "afno_mixer",
    "afno_mixer_backward",
    "afno_mixer_forward",
    "init_afno_params",
    "anie_backward",
    "anie_forward",
    "anie_solve",
    "init_anie_params",
    "anisotropic_rbf_backward",
    "anisotropic_rbf_forward",
    "tangent_frames",
    "codomain_attention",
    "codomain_attention_backward",
    "codomain_attention_forward",
    "FFT_NORMS",
    "axial_kernel_grads",
    "axial_kernels",
    "cast_complex",
    "check_tau_clamp",
    "fft_scales",
    "irfftn_adjoint",
    "mirror_count",
    "orthogonal_init",
    "physics_front_backward",
    "physics_front_forward",
    "physics_front_init",
    "physics_front_spec",
    "rfftn_adjoint",
    "slice_dims",
    "slice_tokens_backward",
    "slice_tokens_forward",
    "swap_last",
    "tempered_softmax_backward",
    "tempered_softmax_forward",
    "validate_axial_operands",
    "validate_physics_front",
    "xavier_uniform",
    "continuum_attention",
    "continuum_attention_backward",
    "continuum_attention_forward",
    "trapezoid_weights",
    "factformer_attention",
    "factformer_attention_backward",
    "factformer_attention_forward",
    "factformer_block_backward",
    "factformer_block_forward",
    "factformer_block_param_shapes",
    "init_factformer_block_params",
    "fno_spectral_conv",
    "fno_spectral_conv_backward",
    "fno_spectral_conv_explicit",
    "fno_spectral_conv_forward",
    "init_fno_params",
    "gale_init_params",
    "geotransolver_gale",
    "geotransolver_gale_backward",
    "geotransolver_gale_forward",
    "fourier_type_attention",
    "fourier_type_attention_backward",
    "fourier_type_attention_forward",
    "galerkin_attention",
    "galerkin_attention_backward",
    "galerkin_attention_forward",
    "init_params",
    "gno_kernel_integral_backward",
    "gno_kernel_integral_forward",
    "init_gno_params",
    "radius_neighbors",
    "sinusoidal_embedding",
    "sinusoidal_embedding_vjp",
    "gnot_hna_attention",
    "gnot_hna_attention_backward",
    "gnot_hna_attention_forward",
    "gnot_hna_init_params",
    "gnot_geometric_gating_moe",
    "gnot_geometric_gating_moe_backward",
    "gnot_geometric_gating_moe_forward",
    "gnot_moe_init_params",
    "ifactformer_m_attention",
    "ifactformer_m_attention_backward",
    "ifactformer_m_attention_forward",
    "ipot_inducing_point_operator",
    "ipot_inducing_point_operator_backward",
    "ipot_inducing_point_operator_forward",
    "ipot_init_params",
    "linear_no_attention",
    "linear_no_attention_backward",
    "linear_no_attention_forward",
    "linear_no_init_params",
    "linear_scan",
    "selective_scan",
    "selective_scan_backward",
    "selective_scan_forward",
    "softplus",
    "init_mno_ss2d_params",
    "mno_ss2d",
    "mno_ss2d_backward",
    "mno_ss2d_forward",
    "scan_order_permutations",
    "oformer_attention",
    "oformer_attention_backward",
    "oformer_attention_forward",
    "oformer_init_params",
    "cholesky_vjp",
    "ono_attention",
    "ono_attention_backward",
    "ono_attention_forward",
    "psd_safe_cholesky",
    "init_pde_channel_attention_params",
    "pde_channel_attention",
    "pde_channel_attention_backward",
    "pde_channel_attention_forward",
    "init_pinto_params",
    "pinto_backward",
    "pinto_forward",
    "coarse_hat_basis",
    "overlapping_subdomains",
    "partition_of_unity",
    "schwarz_attention_backward",
    "schwarz_attention_forward",
    "conditional_layer_norm",
    "init_scot_params",
    "scot_layer",
    "scot_layer_backward",
    "scot_layer_forward",
    "scot_param_shapes",
    "transolver_init_params",
    "transolver_physics_attention",
    "transolver_physics_attention_backward",
    "transolver_physics_attention_forward",
]
