"""Operator-learning attention and neural-operator layers (catalogue family 3), one module per mechanism.

Attention on discretised functions (``docs/operator-attention.md``): ``galerkin`` (Galerkin- and
Fourier-type attention, one derivation), ``oformer``, ``gnot`` (heterogeneous normalized
attention), ``gnot_moe`` (geometric-gating mixture of experts), ``transolver`` (Physics-Attention),
``linear_no``, ``gale`` (GeoTransolver), ``ipot``. Neural-operator layers
(``docs/neural-operators.md``): ``fno``, ``afno`` (AFNO/DPOT mixer), ``factformer``,
``ifactformer``, ``ono``, ``continuum``, ``coda_no``, ``scot`` (Poseidon). ``common`` holds the
helpers several of them share (real-FFT adjoints, the Physics-Attention slice front, axial kernels,
initialisers); ``_samples`` the samplers and checks several registry records share.

Every public function of those modules is importable from here, e.g.
``from refattn.operators import fno_spectral_conv_forward``.
"""

from .afno import afno_mixer, afno_mixer_backward, afno_mixer_forward, init_afno_params
from .coda_no import codomain_attention, codomain_attention_backward, codomain_attention_forward
from .common import (
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
from .continuum import continuum_attention, continuum_attention_backward, continuum_attention_forward, trapezoid_weights
from .factformer import (
    factformer_attention,
    factformer_attention_backward,
    factformer_attention_forward,
    factformer_block_backward,
    factformer_block_forward,
    factformer_block_param_shapes,
    init_factformer_block_params,
)
from .fno import (
    fno_spectral_conv,
    fno_spectral_conv_backward,
    fno_spectral_conv_explicit,
    fno_spectral_conv_forward,
    init_fno_params,
)
from .gale import gale_init_params, geotransolver_gale, geotransolver_gale_backward, geotransolver_gale_forward
from .galerkin import (
    fourier_type_attention,
    fourier_type_attention_backward,
    fourier_type_attention_forward,
    galerkin_attention,
    galerkin_attention_backward,
    galerkin_attention_forward,
    init_params,
)
from .gnot import gnot_hna_attention, gnot_hna_attention_backward, gnot_hna_attention_forward, gnot_hna_init_params
from .gnot_moe import (
    gnot_geometric_gating_moe,
    gnot_geometric_gating_moe_backward,
    gnot_geometric_gating_moe_forward,
    gnot_moe_init_params,
)
from .ifactformer import ifactformer_m_attention, ifactformer_m_attention_backward, ifactformer_m_attention_forward
from .ipot import (
    ipot_inducing_point_operator,
    ipot_inducing_point_operator_backward,
    ipot_inducing_point_operator_forward,
    ipot_init_params,
)
from .linear_no import (
    linear_no_attention,
    linear_no_attention_backward,
    linear_no_attention_forward,
    linear_no_init_params,
)
from .oformer import oformer_attention, oformer_attention_backward, oformer_attention_forward, oformer_init_params
from .ono import cholesky_vjp, ono_attention, ono_attention_backward, ono_attention_forward, psd_safe_cholesky
from .scot import (
    conditional_layer_norm,
    init_scot_params,
    scot_layer,
    scot_layer_backward,
    scot_layer_forward,
    scot_param_shapes,
)
from .transolver import (
    transolver_init_params,
    transolver_physics_attention,
    transolver_physics_attention_backward,
    transolver_physics_attention_forward,
)

__all__ = [
    # common
    "swap_last", "xavier_uniform", "orthogonal_init", "FFT_NORMS", "fft_scales", "mirror_count",
    "irfftn_adjoint", "rfftn_adjoint", "cast_complex", "check_tau_clamp", "slice_dims",
    "tempered_softmax_forward", "tempered_softmax_backward", "slice_tokens_forward", "slice_tokens_backward",
    "physics_front_forward", "physics_front_backward", "physics_front_spec", "validate_physics_front",
    "physics_front_init", "validate_axial_operands", "axial_kernels", "axial_kernel_grads",
    # galerkin
    "galerkin_attention_forward", "galerkin_attention_backward", "galerkin_attention",
    "fourier_type_attention_forward", "fourier_type_attention_backward", "fourier_type_attention",
    "init_params",
    # oformer
    "oformer_attention_forward", "oformer_attention_backward", "oformer_attention", "oformer_init_params",
    # gnot
    "gnot_hna_attention_forward", "gnot_hna_attention_backward", "gnot_hna_attention", "gnot_hna_init_params",
    # gnot_moe
    "gnot_geometric_gating_moe_forward", "gnot_geometric_gating_moe_backward", "gnot_geometric_gating_moe",
    "gnot_moe_init_params",
    # transolver
    "transolver_physics_attention_forward", "transolver_physics_attention_backward",
    "transolver_physics_attention", "transolver_init_params",
    # linear_no
    "linear_no_attention_forward", "linear_no_attention_backward", "linear_no_attention",
    "linear_no_init_params",
    # gale
    "geotransolver_gale_forward", "geotransolver_gale_backward", "geotransolver_gale", "gale_init_params",
    # ipot
    "ipot_inducing_point_operator_forward", "ipot_inducing_point_operator_backward",
    "ipot_inducing_point_operator", "ipot_init_params",
    # fno
    "fno_spectral_conv_forward", "fno_spectral_conv_backward", "fno_spectral_conv",
    "fno_spectral_conv_explicit", "init_fno_params",
    # afno
    "afno_mixer_forward", "afno_mixer_backward", "afno_mixer", "init_afno_params",
    # factformer
    "factformer_attention_forward", "factformer_attention_backward", "factformer_attention",
    "factformer_block_forward", "factformer_block_backward", "factformer_block_param_shapes",
    "init_factformer_block_params",
    # ifactformer
    "ifactformer_m_attention_forward", "ifactformer_m_attention_backward", "ifactformer_m_attention",
    # ono
    "ono_attention_forward", "ono_attention_backward", "ono_attention", "psd_safe_cholesky", "cholesky_vjp",
    # continuum
    "continuum_attention_forward", "continuum_attention_backward", "continuum_attention", "trapezoid_weights",
    # coda_no
    "codomain_attention_forward", "codomain_attention_backward", "codomain_attention",
    # scot
    "scot_layer_forward", "scot_layer_backward", "scot_layer", "scot_param_shapes", "init_scot_params",
    "conditional_layer_norm",
]
