r"""Operator-learning attention and neural-operator layers (catalogue family 3), one module per mechanism.

Attention on discretised functions (Galerkin/Fourier, OFormer, GNOT, Transolver, IPOT ...),
spectral, convolutional, wavelet and kernel-integral layers (FNO, AFNO, CNO, GNO, DISCO, MWT
...) and scans. `common` holds what several share (real-FFT adjoints, the Physics-Attention slice
front, axial kernels, initialisers).

Every public name of these modules is re-exported here. A function named like its own module
(``sdpa`` in ``sdpa.py``) is exported too, so ``package.sdpa`` is the function; import the
module's other names from the module itself (``from package.sdpa import sdpa_forward``).

Modules
-------
afno
    AFNO token mixer and DPOT's variant: a block-diagonal complex 2-layer MLP per Fourier mode
    (``afno_dpot_fourier_mixer``).
anie
    ANIE: attentional neural integral equations, solved by (smoothed) fixed-point iteration
    (``anie_attentional_integral_equation``).
anisotropic_rbf
    Anisotropic RBF field decoder: a continuous field, queried anywhere, from oriented Gaussian
    centres (``anisotropic_rbf_field_decoder``).
aot_pot
    AOT-POT multi-stream residual mixing: adaptive aggregation, redistribution and
    Sinkhorn-projected stream mixing (``aot_pot_multistream_sinkhorn``).
aroma
    AROMA: Perceiver encoder to latent tokens, local neural-field decoder by cross-attention
    (``aroma_latent_neural_field_operator``).
beno
    BENO: the boundary-embedded message-passing layer (a boundary Transformer conditions each GNN
    step) (``beno_boundary_embedded_operator``).
cape
    CAPE: channel attention guided by PDE-parameter embeddings (the parameter-embedding block of a
    neural PDE solver) (``cape_parameter_channel_attention``).
cato
    CATO charted axial attention — registered as **not implemented** (T3).
cno
    Convolutional Neural Operator (CNO): the CNO block and residual block with the anti-aliased
    (filtered) leaky-ReLU activation and its up/down-sampling (``cno_convolutional_operator``).
coda_no
    CoDA-NO codomain attention: softmax attention among physical variables (function-valued tokens)
    (``coda_no_codomain_attention``).
common
    Helpers shared by the operator-learning modules (no mechanism and no registry record here).
continuum
    Continuum (function-space) attention discretised with quadrature weights
    (``continuum_attention_quadrature``).
differential_conv
    Finite-difference (localized differential) convolution of the local neural operator
    (``finite_difference_conv``).
disco_conv
    Discrete-continuous (DISCO) convolutions — the localized integral kernel of the local neural
    operator — and the local kernels of ``LocalNOBlocks`` (DISCO + finite-difference) as one layer
    (``local_differential_disco_kernels``).
ditto
    DiTTO time conditioning: a sinusoidal embedding of the PDE time, an MLP, and a residual
    convolution block whose normalised features are scaled and shifted by that embedding
    (``ditto_time_conditioned_operator``).
echo
    ECHO (generative transformer operator for million-point PDE trajectories): registered as **not
    implemented** (T3).
enma
    ENMA irregular-points-to-grid attention encoder — registered as **not implemented** (T3).
factformer
    FactFormer's axial factorised kernel integral (and the full ``FABlock2D`` around it)
    (``factformer_factorized_attention``).
fno
    FNO spectral convolution: a per-mode complex channel mix between a real FFT and its inverse
    (``fno_spectral_conv``).
fno_vit_hybrid
    Hybrid FNO + transformer scattering operator: smooth background by an FNO, high-contrast
    correction by a ViT (``fno_vit_scattering_hybrid``).
funcattn
    Functional Attention (FUNCATTN): attention among slice coefficients as a regularised
    least-squares functional map (``funcattn_functional_attention``).
gale
    GeoTransolver GALE: Transolver slices, slice self-attention mixed with cross-attention to a
    context (``geotransolver_gale``).
galerkin
    Galerkin-type and Fourier-type attention (Cao, NeurIPS 2021): one layer, two associations
    (``galerkin_attention``, ``fourier_type_attention``).
gaot_magno
    GAOT MAGNO: multiscale attentional graph neural operator encoder/decoder with geometry embedding
    (``gaot_magno``).
gno_kernel_integral
    Graph neural operator (GNO) kernel integral over radius neighbourhoods
    (``gno_kernel_integral_layer``).
gnot
    GNOT heterogeneous normalized (linear) attention (HNA) (``gnot_hna_attention``).
gnot_moe
    GNOT geometric gating: a mixture-of-experts FFN gated by the point coordinates
    (``gnot_geometric_gating_moe``).
gnp
    Geometric Neural Operator (GNP): block-factorised kernel integral on a point-cloud radius graph
    (``gnp_geometric_neural_operator``).
ho_fno
    HO-FNO: the higher-order (n-linear) spectral convolution and the HO-FNO block
    (``ho_fno_higher_order_spectral_conv``).
hodgeformer
    HodgeFormer: multi-head attention heads as learned discrete Hodge stars on a triangle mesh
    (``hodgeformer_hodge_operators``).
hypino
    HyPINO: the hypernetwork decoder that turns PDE feature maps into PINN weights, and the
    generated PINN (``hypino_hypernetwork_pinn``).
ifactformer
    IFactFormer-m's parallel axial attention: two axis integrals of the same values, concatenated
    (``ifactformer_m_parallel_attention``).
interp_conv
    NNs-to-NOs: the resolution-adaptive convolution (``InterpConv2d``), a CNN layer turned into a
    neural operator (``nns_to_nos_recipe``).
ipot
    IPOT: Inducing Point Operator Transformer (encode -> process latents -> decode anywhere)
    (``ipot_inducing_point_operator``).
linear_no
    LinearNO: Transolver's Physics-Attention recast as canonical linear attention
    (``linear_no_attention``).
mamba
    Mamba's selective state-space scan (S6): a recurrent reference, a chunked parallel form and the
    backward through time (``selective_scan``).
mamba_neural_operator
    Mamba Neural Operator (MNO): the multi-order selective-scan mixer ``SS2D`` that replaces
    attention in the Galerkin Transformer / GNOT / OFormer encoder layers
    (``mamba_selective_scan_operator``).
mano
    MANO multipole attention: windowed attention on a hierarchy of coarsened grids, summed back up
    (``mano_multipole_attention``).
mgno
    MgNO: a neural-operator layer whose linear operator is one multigrid V-cycle of convolutions
    (``mgno_multigrid_operator``).
mino
    MINO encoder: a graph-neural-operator kernel integral onto latent points, then Perceiver
    cross-attention (``mino_gno_cross_attention``).
mono_cotap
    MoNo CoTAP: cross-scale optimal-transport assignment and projection between points and latent
    tokens (``mono_cotap_ot_projection``).
multiwavelet
    Multiwavelet neural operator (MWT): Legendre/Chebyshev multiwavelet filters, the multiwavelet
    transform and the 1-D ``MWT_CZ1d`` layer (``multiwavelet_operator``).
nhmo
    NHMO harmonic-measure boundary kernel — registered as **not implemented** (T3).
nio
    NIO: Neural Inverse Operator, a DeepONet over operator samples averaged into an FNO
    (``nio_neural_inverse_operator``).
oformer
    OFormer linear attention: Galerkin/Fourier-type attention with quadrature weights, masks and
    RoPE (``oformer_attention``).
ono
    ONO orthogonal attention: Cholesky-whitened eigenfunction features and a Mercer-type kernel
    (``ono_orthogonal_attention``).
pde_transformer_channel_attention
    PDE-Transformer (separate channels): channel-wise self-attention between the tokens of the
    physical channels, with adaptive-LayerNorm conditioning (``pde_transformer_channel_attention``).
pdeformer
    PDEformer graph-Transformer attention: multi-head self-attention over the nodes of a PDE's
    computational graph, biased by learned embeddings of the directed shortest-path distance in both
    directions (``pdeformer_graph_inr``).
physgto_attention
    PhysGTO projection-inspired attention: learned tokens project the mesh, attend, and re-project
    back (``physgto_projection_attention``).
pibert_attention
    PIBERT physics-biased self-attention: softmax attention whose logits are shifted by the norm of
    a PDE residual at every token (``physics_biased_fourier_wavelet_attention``).
pinnsformer
    PINNsFormer: pseudo-sequences of collocation points, the Wavelet activation and the
    encoder-decoder PINN transformer built from them (``pinnsformer_wavelet_pseudosequence``,
    ``wavelet_activation``).
pinto
    PINTO: physics-informed transformer neural operator with cross-attention kernel-integral units
    (``pinto_cross_attention_kernel_integral``).
prose
    PROSE multimodal operator decoding: data and symbol tokens are fused with modality-type
    embeddings, and the solution is decoded by cross-attention from query embeddings (output time +
    patch position) to the fused tokens (``prose_multimodal_operator``).
schwarz_attention
    Two-level overlapping Schwarz (domain-decomposition) attention
    (``schwarz_domain_decomposition_attention``).
scot
    Poseidon / scOT block: time-conditioned LayerNorm around SwinV2 (shifted-)window attention
    (``scot_poseidon_block``).
sni
    SNI: Schwarz Neural Inference, relaxed additive Schwarz iterations around a local neural
    operator (``schwarz_neural_inference``).
tno
    TNO: a topological neural operator layer on a 2-complex (fixed DEC routes, learned transforms)
    (``tno_topological_neural_operator``).
transolver
    Transolver Physics-Attention: slice the points, attend among the slices, deslice
    (``transolver_physics_attention``).
vano
    VANO: variational autoencoding neural operator (Gaussian encoder, function decoder, ELBO)
    (``vano_variational_autoencoding_operator``).
vicon
    VICON: the in-context masked patch transformer of Vision In-Context Operator Networks
    (``vicon_in_context_operator``).
vito
    ViTO (U-Net with a vision transformer for inverse PDE problems): registered as **not
    implemented** (T3).
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
    anisotropic_rbf,
    anisotropic_rbf_backward,
    anisotropic_rbf_forward,
    tangent_frames,
)
from .aot_pot import (  # noqa: F401
    aot_pot_stream_mixing,
    aot_pot_stream_mixing_backward,
    aot_pot_stream_mixing_forward,
    init_aot_pot_params,
)
from .aroma import (  # noqa: F401
    aroma,
    aroma_backward,
    aroma_forward,
    aroma_init_params,
    fourier_encode_backward,
    fourier_encode_forward,
    nerf_bands,
)
from .beno import (  # noqa: F401
    beno_layer,
    beno_layer_backward,
    beno_layer_forward,
    beno_param_shapes,
    boundary_positional_table,
    init_beno_params,
)
from .cape import (  # noqa: F401
    cape_block,
    cape_block_backward,
    cape_block_forward,
    init_cape_params,
)
from .cno import (  # noqa: F401
    cno_activation_operators,
    cno_block,
    cno_block_backward,
    cno_block_forward,
    cno_lowpass_filter,
    cno_resample,
    cno_residual_block,
    cno_residual_block_backward,
    cno_residual_block_forward,
    fft_resample_matrix,
    kink_margin,
    upfirdn_matrix,
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
    physics_front_mesh,
    physics_front_spec,
    rfftn_adjoint,
    sinkhorn_implicit_vjp,
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
from .differential_conv import (  # noqa: F401
    FD_PADDINGS,
    finite_difference_conv,
    finite_difference_conv_backward,
    finite_difference_conv_forward,
    zero_sum_stencil,
)
from .disco_conv import (  # noqa: F401
    disco_basis,
    disco_conv,
    disco_conv_backward,
    disco_conv_forward,
    disco_filter_matrix,
    equidistant_disco_conv,
    equidistant_disco_conv_backward,
    equidistant_disco_conv_forward,
    equidistant_disco_kernel,
    local_no_kernels,
    local_no_kernels_backward,
    local_no_kernels_forward,
)
from .ditto import (  # noqa: F401
    ditto_block,
    ditto_block_backward,
    ditto_block_forward,
    init_ditto_block_params,
    sinusoidal_time_embedding,
)
from .factformer import (  # noqa: F401
    factformer_attention,
    factformer_attention_backward,
    factformer_attention_forward,
    factformer_block_backward,
    factformer_block_forward,
    factformer_block_param_shapes,
    init_factformer_block_params,
    low_rank_kernel,
    low_rank_kernel_backward,
    low_rank_kernel_forward,
)
from .fno import (  # noqa: F401
    fno_spectral_conv,
    fno_spectral_conv_backward,
    fno_spectral_conv_centred,
    fno_spectral_conv_centred_backward,
    fno_spectral_conv_centred_forward,
    fno_spectral_conv_explicit,
    fno_spectral_conv_forward,
    init_fno_centred_params,
    init_fno_params,
)
from .fno_vit_hybrid import (  # noqa: F401
    fno_vit_hybrid,
    fno_vit_hybrid_backward,
    fno_vit_hybrid_forward,
    fno_vit_hybrid_param_shapes,
    init_fno_vit_hybrid_params,
)
from .funcattn import (  # noqa: F401
    funcattn_backward,
    funcattn_forward,
    funcattn_functional_attention,
    funcattn_init_params,
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
from .gaot_magno import (  # noqa: F401
    init_magno_params,
    magno,
    magno_backward,
    magno_forward,
    magno_geometry_features,
    node_pos_encode,
)
from .gno_kernel_integral import (  # noqa: F401
    gno_kernel_integral,
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
from .gnp import (  # noqa: F401
    gnp,
    gnp_backward,
    gnp_forward,
    gnp_init_params,
    gnp_radius_graph,
)
from .ho_fno import (  # noqa: F401
    ho_block,
    ho_block_backward,
    ho_block_forward,
    ho_spectral_conv,
    ho_spectral_conv_backward,
    ho_spectral_conv_forward,
    two_thirds_padding,
)
from .hodgeformer import (  # noqa: F401
    hodgeformer_backward,
    hodgeformer_forward,
    hodgeformer_hodge_attention,
    hodgeformer_init_params,
    hodgeformer_split,
)
from .hypino import (  # noqa: F401
    fourier_features,
    hypino_decoder,
    hypino_decoder_backward,
    hypino_decoder_forward,
    hypino_decoder_param_shapes,
    init_hypino_decoder_params,
)
from .ifactformer import (  # noqa: F401
    ifactformer_m_attention,
    ifactformer_m_attention_backward,
    ifactformer_m_attention_forward,
    ifactformer_m_axial,
    ifactformer_m_axial_backward,
    ifactformer_m_axial_forward,
)
from .interp_conv import (  # noqa: F401
    interp_conv2d,
    interp_conv2d_backward,
    interp_conv2d_forward,
    interpolated_kernel_size,
    kernel_resampling_matrices,
)
from .ipot import (  # noqa: F401
    ipot_inducing_point_operator,
    ipot_inducing_point_operator_backward,
    ipot_inducing_point_operator_forward,
    ipot_init_params,
    ipot_model_backward,
    ipot_model_forward,
    pos2fourier_backward,
    pos2fourier_forward,
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
from .mano import (  # noqa: F401
    init_mano_params,
    mano_attention,
    mano_attention_backward,
    mano_attention_forward,
    mano_levels,
)
from .mgno import (  # noqa: F401
    init_mgno_params,
    mgno_layer,
    mgno_layer_backward,
    mgno_layer_forward,
    mgno_param_shapes,
    mgno_vcycle,
)
from .mino import (  # noqa: F401
    init_mino_encoder_params,
    init_perceiver_block_params,
    mino_encoder,
    mino_encoder_backward,
    mino_encoder_forward,
    mino_perceiver_block_backward,
    mino_perceiver_block_forward,
    mino_sincos_embedding,
    perceiver_block_spec,
)
from .mono_cotap import (  # noqa: F401
    cotap,
    cotap_backward,
    cotap_forward,
    cotap_project,
    init_cotap_params,
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
from .nio import (  # noqa: F401
    nio,
    nio_backward,
    nio_forward,
    nio_init_params,
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
from .pdeformer import (  # noqa: F401
    dag_spatial_bias,
    init_pdeformer_attention_params,
    init_pdeformer_inr_params,
    pdeformer_attention,
    pdeformer_attention_backward,
    pdeformer_attention_forward,
    pdeformer_inr_backward,
    pdeformer_inr_forward,
)
from .physgto_attention import (  # noqa: F401
    PHYSGTO_VARIANTS,
    init_physgto_attention_params,
    physgto_attention,
    physgto_attention_backward,
    physgto_attention_forward,
)
from .pibert_attention import (  # noqa: F401
    init_pibert_attention_params,
    pibert_attention,
    pibert_attention_backward,
    pibert_attention_forward,
    residual_norm_bias,
)
from .pinnsformer import (  # noqa: F401
    init_pinnsformer_params,
    make_time_sequence,
    pinnsformer,
    pinnsformer_backward,
    pinnsformer_forward,
    pinnsformer_param_shapes,
    wave_activation,
    wave_activation_backward,
    wave_activation_forward,
)
from .pinto import (  # noqa: F401
    init_pinto_params,
    pinto,
    pinto_backward,
    pinto_forward,
)
from .prose import (  # noqa: F401
    PROSE_TIME_EMBEDS,
    init_prose_decoder_params,
    prose_decoder,
    prose_decoder_backward,
    prose_decoder_forward,
)
from .schwarz_attention import (  # noqa: F401
    coarse_hat_basis,
    overlapping_subdomains,
    partition_of_unity,
    schwarz_attention,
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
from .sni import (  # noqa: F401
    sni,
    sni_backward,
    sni_exact_poisson1d_local_operator,
    sni_forward,
    sni_interval_decomposition,
    sni_pointwise_local_operator,
)
from .tno import (  # noqa: F401
    tno_init_params,
    tno_layer,
    tno_layer_backward,
    tno_layer_forward,
    tno_split,
)
from .transolver import (  # noqa: F401
    transolver_init_params,
    transolver_physics_attention,
    transolver_physics_attention_backward,
    transolver_physics_attention_forward,
)
from .vano import (  # noqa: F401
    vano,
    vano_backward,
    vano_forward,
    vano_init_params,
    vano_reconstruct,
)
from .vicon import (  # noqa: F401
    in_context_mask,
    init_vicon_params,
    vicon,
    vicon_backward,
    vicon_forward,
    vicon_param_shapes,
)

__all__ = [
    "afno_mixer", "afno_mixer_backward", "afno_mixer_forward", "init_afno_params", "anie_backward", "anie_forward",
    "anie_solve", "init_anie_params", "anisotropic_rbf", "anisotropic_rbf_backward", "anisotropic_rbf_forward",
    "tangent_frames", "aot_pot_stream_mixing", "aot_pot_stream_mixing_backward", "aot_pot_stream_mixing_forward",
    "init_aot_pot_params", "aroma", "aroma_backward", "aroma_forward", "aroma_init_params", "fourier_encode_backward",
    "fourier_encode_forward", "nerf_bands", "beno_layer", "beno_layer_backward", "beno_layer_forward",
    "beno_param_shapes", "boundary_positional_table", "init_beno_params", "cape_block", "cape_block_backward",
    "cape_block_forward", "init_cape_params", "cno_activation_operators", "cno_block", "cno_block_backward",
    "cno_block_forward", "cno_lowpass_filter", "cno_resample", "cno_residual_block", "cno_residual_block_backward",
    "cno_residual_block_forward", "fft_resample_matrix", "kink_margin", "upfirdn_matrix", "codomain_attention",
    "codomain_attention_backward", "codomain_attention_forward", "FFT_NORMS", "axial_kernel_grads", "axial_kernels",
    "cast_complex", "check_tau_clamp", "fft_scales", "irfftn_adjoint", "mirror_count", "orthogonal_init",
    "physics_front_backward", "physics_front_forward", "physics_front_init", "physics_front_mesh", "physics_front_spec",
    "rfftn_adjoint", "sinkhorn_implicit_vjp", "slice_dims", "slice_tokens_backward", "slice_tokens_forward",
    "swap_last", "tempered_softmax_backward", "tempered_softmax_forward", "validate_axial_operands",
    "validate_physics_front", "xavier_uniform", "continuum_attention", "continuum_attention_backward",
    "continuum_attention_forward", "trapezoid_weights", "FD_PADDINGS", "finite_difference_conv",
    "finite_difference_conv_backward", "finite_difference_conv_forward", "zero_sum_stencil", "disco_basis",
    "disco_conv", "disco_conv_backward", "disco_conv_forward", "disco_filter_matrix", "equidistant_disco_conv",
    "equidistant_disco_conv_backward", "equidistant_disco_conv_forward", "equidistant_disco_kernel", "local_no_kernels",
    "local_no_kernels_backward", "local_no_kernels_forward", "ditto_block", "ditto_block_backward",
    "ditto_block_forward", "init_ditto_block_params", "sinusoidal_time_embedding", "factformer_attention",
    "factformer_attention_backward", "factformer_attention_forward", "factformer_block_backward",
    "factformer_block_forward", "factformer_block_param_shapes", "init_factformer_block_params", "low_rank_kernel",
    "low_rank_kernel_backward", "low_rank_kernel_forward", "fno_spectral_conv", "fno_spectral_conv_backward",
    "fno_spectral_conv_centred", "fno_spectral_conv_centred_backward", "fno_spectral_conv_centred_forward",
    "fno_spectral_conv_explicit", "fno_spectral_conv_forward", "init_fno_centred_params", "init_fno_params",
    "fno_vit_hybrid", "fno_vit_hybrid_backward", "fno_vit_hybrid_forward", "fno_vit_hybrid_param_shapes",
    "init_fno_vit_hybrid_params", "funcattn_backward", "funcattn_forward", "funcattn_functional_attention",
    "funcattn_init_params", "gale_init_params", "geotransolver_gale", "geotransolver_gale_backward",
    "geotransolver_gale_forward", "fourier_type_attention", "fourier_type_attention_backward",
    "fourier_type_attention_forward", "galerkin_attention", "galerkin_attention_backward", "galerkin_attention_forward",
    "init_params", "init_magno_params", "magno", "magno_backward", "magno_forward", "magno_geometry_features",
    "node_pos_encode", "gno_kernel_integral", "gno_kernel_integral_backward", "gno_kernel_integral_forward",
    "init_gno_params", "radius_neighbors", "sinusoidal_embedding", "sinusoidal_embedding_vjp", "gnot_hna_attention",
    "gnot_hna_attention_backward", "gnot_hna_attention_forward", "gnot_hna_init_params", "gnot_geometric_gating_moe",
    "gnot_geometric_gating_moe_backward", "gnot_geometric_gating_moe_forward", "gnot_moe_init_params", "gnp",
    "gnp_backward", "gnp_forward", "gnp_init_params", "gnp_radius_graph", "ho_block", "ho_block_backward",
    "ho_block_forward", "ho_spectral_conv", "ho_spectral_conv_backward", "ho_spectral_conv_forward",
    "two_thirds_padding", "hodgeformer_backward", "hodgeformer_forward", "hodgeformer_hodge_attention",
    "hodgeformer_init_params", "hodgeformer_split", "fourier_features", "hypino_decoder", "hypino_decoder_backward",
    "hypino_decoder_forward", "hypino_decoder_param_shapes", "init_hypino_decoder_params", "ifactformer_m_attention",
    "ifactformer_m_attention_backward", "ifactformer_m_attention_forward", "ifactformer_m_axial",
    "ifactformer_m_axial_backward", "ifactformer_m_axial_forward", "interp_conv2d", "interp_conv2d_backward",
    "interp_conv2d_forward", "interpolated_kernel_size", "kernel_resampling_matrices", "ipot_inducing_point_operator",
    "ipot_inducing_point_operator_backward", "ipot_inducing_point_operator_forward", "ipot_init_params",
    "ipot_model_backward", "ipot_model_forward", "pos2fourier_backward", "pos2fourier_forward", "linear_no_attention",
    "linear_no_attention_backward", "linear_no_attention_forward", "linear_no_init_params", "linear_scan",
    "selective_scan", "selective_scan_backward", "selective_scan_forward", "softplus", "init_mno_ss2d_params",
    "mno_ss2d", "mno_ss2d_backward", "mno_ss2d_forward", "scan_order_permutations", "init_mano_params",
    "mano_attention", "mano_attention_backward", "mano_attention_forward", "mano_levels", "init_mgno_params",
    "mgno_layer", "mgno_layer_backward", "mgno_layer_forward", "mgno_param_shapes", "mgno_vcycle",
    "init_mino_encoder_params", "init_perceiver_block_params", "mino_encoder", "mino_encoder_backward",
    "mino_encoder_forward", "mino_perceiver_block_backward", "mino_perceiver_block_forward", "mino_sincos_embedding",
    "perceiver_block_spec", "cotap", "cotap_backward", "cotap_forward", "cotap_project", "init_cotap_params",
    "init_mwt_cz1d_params", "multiwavelet_filters", "mwt_cz1d", "mwt_cz1d_backward", "mwt_cz1d_forward",
    "mwt_decompose", "mwt_reconstruct", "nio", "nio_backward", "nio_forward", "nio_init_params", "oformer_attention",
    "oformer_attention_backward", "oformer_attention_forward", "oformer_init_params", "cholesky_vjp", "ono_attention",
    "ono_attention_backward", "ono_attention_forward", "psd_safe_cholesky", "init_pde_channel_attention_params",
    "pde_channel_attention", "pde_channel_attention_backward", "pde_channel_attention_forward", "dag_spatial_bias",
    "init_pdeformer_attention_params", "init_pdeformer_inr_params", "pdeformer_attention",
    "pdeformer_attention_backward", "pdeformer_attention_forward", "pdeformer_inr_backward", "pdeformer_inr_forward",
    "PHYSGTO_VARIANTS", "init_physgto_attention_params", "physgto_attention", "physgto_attention_backward",
    "physgto_attention_forward", "init_pibert_attention_params", "pibert_attention", "pibert_attention_backward",
    "pibert_attention_forward", "residual_norm_bias", "init_pinnsformer_params", "make_time_sequence", "pinnsformer",
    "pinnsformer_backward", "pinnsformer_forward", "pinnsformer_param_shapes", "wave_activation",
    "wave_activation_backward", "wave_activation_forward", "init_pinto_params", "pinto", "pinto_backward",
    "pinto_forward", "PROSE_TIME_EMBEDS", "init_prose_decoder_params", "prose_decoder", "prose_decoder_backward",
    "prose_decoder_forward", "coarse_hat_basis", "overlapping_subdomains", "partition_of_unity", "schwarz_attention",
    "schwarz_attention_backward", "schwarz_attention_forward", "conditional_layer_norm", "init_scot_params",
    "scot_layer", "scot_layer_backward", "scot_layer_forward", "scot_param_shapes", "sni", "sni_backward",
    "sni_exact_poisson1d_local_operator", "sni_forward", "sni_interval_decomposition", "sni_pointwise_local_operator",
    "tno_init_params", "tno_layer", "tno_layer_backward", "tno_layer_forward", "tno_split", "transolver_init_params",
    "transolver_physics_attention", "transolver_physics_attention_backward", "transolver_physics_attention_forward",
    "vano", "vano_backward", "vano_forward", "vano_init_params", "vano_reconstruct", "in_context_mask",
    "init_vicon_params", "vicon", "vicon_backward", "vicon_forward", "vicon_param_shapes",
]
