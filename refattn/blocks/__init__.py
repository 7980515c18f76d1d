r"""Family 5: transformer building blocks beyond the primitives in `refattn.nn`.

One module per block (feed-forward variants, residual schemes, gating and routing, token mixers,
initialisation schemes ...). A block that wraps attention takes the attention mechanism as a
registry slug or a forward/backward pair and chains its backward through it (`core`: the
sublayer protocol; `routing`: top-k routing, capacity and load-balancing losses).

Every public name of these modules is re-exported here. A function named like its own module
(``sdpa`` in ``sdpa.py``) is exported too, so ``package.sdpa`` is the function; import the
module's other names from the module itself (``from package.sdpa import sdpa_forward``).

Modules
-------
algebra_ffn
    Associative-algebra product FFN projection — registered as **not implemented** (T3).
bcos
    B-cos transform: a unit-norm linear map rescaled by the input-weight cosine to the power B-1
    (``bcos_transform``).
core
    Shared helpers of family 5: the sublayer protocol, prefixed norms and MLPs, a pre-norm block.
deep_delta
    Deep Delta Learning residual (DDL) and the depth-wise residual attention read (ShortSWA over
    depth) (``depth_attention_delta_residual``).
deepscalelm
    DeepScaleLM: a transformer layer with moment-preserving residual scaling, and its initialisation
    (``deepscalelm_residual_scaling``).
deformable_merging
    LIT deformable token merging: a deformable convolution with kernel = stride = patch, then
    BatchNorm and GELU, merges each patch of tokens at learned, input-dependent sampling points
    (``lit_deformable_token_merging``).
delight
    DeLighT: the DExTra transformation (group linear expand-reduce with input mixing) and block-wise
    scaling (``delight_dextra``).
denseformer
    DenseFormer: depth-weighted averages (DWA) of all past block outputs after every block
    (``denseformer_dwa``).
dico
    DiCo compact channel attention (CCA) and the DiCo convolutional token mixer
    (``dico_compact_channel_attention``).
dra
    Dynamic Range Activator (DRA): a learnable periodic-plus-saturating activation
    (``dynamic_range_activator``).
dydit
    DyDiT block: timestep-wise dynamic width (TDW) and spatial-wise dynamic tokens (SDT) in a DiT
    block (``dydit_dynamic_width_token``).
dyt
    Dynamic Tanh (DyT): an element-wise, statistics-free replacement for LayerNorm
    (``dyt_dynamic_tanh``).
equiformer_norm
    EquiformerV2 separable layer norm over spherical-harmonic degrees, and its attention
    re-normalisation (``equiformerv2_separable_layernorm``).
glu_ffn
    GLU-family feed-forward layers: GLU, Bilinear, ReGLU, GEGLU, SwiGLU (Shazeer 2020)
    (``glu_swiglu_ffn``).
gmu
    Gated Memory Unit (GMU): SambaY's cross-decoder layer that gates a shared SSM memory readout
    (``gated_memory_unit``).
headmask
    HeadMask: multi-head attention with training-time head masks (random or importance-based)
    (``headmask``).
hgf
    Hybrid Gated Flow: a ternary (1.58-bit) linear layer plus a gated low-rank full-precision
    correction (``hybrid_gated_flow_ternary``).
layerscale
    LayerScale: a pre-norm block whose two residual branches are scaled per channel (CaiT)
    (``layerscale``).
lmu
    LMUFormer's Legendre Memory Unit token mixer (the non-spiking ``LMU`` block, parallel form)
    (``lmu_token_mixer``).
looped
    Looped (weight-tied) transformer with input injection; AlgoFormer's pre/loop/post structure
    (``looped_transformer``).
low_rank_linear
    Low-rank factorised linear layer (LED unit of the Low-Rank Transformer), with SVD initialisation
    (``low_rank_factorized_linear``).
ltm
    LTM-Transformer learnable token merging — registered as **not implemented** (T3).
macaron
    Macaron block: half-step FFN, attention, half-step FFN (Strang-Marchuk splitting)
    (``macaron_block``).
magneto
    Magneto: the Sub-LayerNorm transformer layer and its DeepNet-derived initialisation
    (``magneto_subln_init``).
mindskip
    MindSkip (Router-Tuning): attention with dynamic depth — a router decides whether to run it
    (``mindskip_attention_dynamic_depth``).
moe
    Top-k mixture-of-experts feed-forward layer with load-balancing and router z-losses
    (``moe_topk_gating``).
moh
    MoH: multi-head attention as a mixture of heads (shared heads + top-K routed heads)
    (``mixture_of_head_attention``).
mohd
    MoHD, mixture of hidden dimensions — registered as **not implemented** (T3).
ngpt
    nGPT block: a normalised Transformer whose hidden states move on the unit hypersphere
    (``ngpt_normalized_block``).
nutime
    NuTime numerically multi-scaled embedding (NME) of unbounded scalars, and NuTime's window token
    (``nutime_multiscale_embedding``).
parallel
    Parallel attention + MLP block: both sublayers read the same normalised input
    (``parallel_attention_mlp_block``).
partialformer
    PartialFormer attention with per-head small FFNs (PG-FFNs), gating and residual-like attention
    (``partialformer_head_ffns``).
patch_embed
    ViT patch embedding: patchify + linear projection (a conv with kernel = stride = patch), class
    token and learned absolute positions (``vit_patch_embedding``).
polycom
    PolyCom activations: PolyReLU and PolyNorm (polynomial composition activations)
    (``polynorm_polycom``).
polyphase
    Adaptive polyphase anchoring: a shift-equivariant (or invariant) ViT patch embedding
    (``polyphase_anchoring``).
poolformer
    PoolFormer block: average pooling as the token mixer of a MetaFormer
    (``poolformer_pooling_mixer``).
repmixer
    FastViT RepMixer: a depthwise-conv token mixer trained with parallel branches and structurally
    re-parameterised into one depthwise conv for inference (``fastvit_repmixer``).
reversible
    Reversible residual layers (RevNet / Reformer) and multi-split reversible networks
    (``reversible_residual_block``).
routing
    Routing helpers shared by the routed blocks: top-k selection, capacity, gates, balance losses.
shallow_ffn
    Attentionless Transformer: a shallow feed-forward network over the whole padded sentence
    replaces attention (``shallow_ffn_attention_replacement``).
simplified
    Simplified Transformer block (He & Hofmann): parallel, skipless, value/projection-free
    (``simplified_block_he_hofmann``).
ssm2d
    2-D SSM: a two-dimensional (Roesser) state-space layer materialised as a causal 2-D convolution
    kernel (``ssm_2d_layer``).
stn
    Spatial transformer: a localisation network regresses an affine map, ``affine_grid`` turns it
    into a sampling grid and ``grid_sample`` reads the input there (bilinear)
    (``spatial_transformer_bilinear_sampler``).
tnt
    Transformer-in-Transformer (TNT) block: an inner block over the words of each patch, merged into
    the outer block over the patches (``tnt_block``).
token_pool
    Token Pooling: downsample a token set by clustering, keeping the cluster centres
    (``token_pooling``).
"""

from __future__ import annotations

from .bcos import (  # noqa: F401
    bcos,
    bcos_backward,
    bcos_dynamic_weights,
    bcos_forward,
)
from .core import (  # noqa: F401
    ACTIVATIONS,
    BATCH_NORM_KEYS,
    FUSED_QKV_NAMES,
    NORMS,
    SPLIT_QKV_NAMES,
    BlockNames,
    Sublayer,
    activation_functions,
    add_grad,
    add_prefix,
    batch_norm_backward,
    batch_norm_forward,
    batch_norm_spec,
    block_dtype,
    cache_nbytes,
    core_apply,
    core_vjp,
    head_gated_attention_backward,
    head_gated_attention_forward,
    head_gated_attention_spec,
    init_attention_params,
    mlp_backward,
    mlp_forward,
    mlp_spec,
    norm_backward,
    norm_forward,
    norm_spec,
    param_dim,
    resolve_attention_core,
    resolve_sublayer,
    split_block_params,
    transformer_block_backward,
    transformer_block_forward,
    transformer_block_spec,
)
from .deep_delta import (  # noqa: F401
    deep_delta_residual,
    deep_delta_residual_backward,
    deep_delta_residual_forward,
    depth_window_attention_backward,
    depth_window_attention_forward,
)
from .deepscalelm import (  # noqa: F401
    DSLM_FFN_SPLITS,
    DSLM_NORM_POSITIONS,
    deepscalelm_block,
    deepscalelm_block_backward,
    deepscalelm_block_forward,
    deepscalelm_gains,
    deepscalelm_init,
)
from .deformable_merging import (  # noqa: F401
    deform_conv2d_apply,
    deform_conv2d_vjp,
    deformable_token_merging,
    deformable_token_merging_backward,
    deformable_token_merging_forward,
)
from .delight import (  # noqa: F401
    delight_block_scaling,
    dextra,
    dextra_backward,
    dextra_config,
    dextra_forward,
)
from .denseformer import (  # noqa: F401
    denseformer_dwa,
    denseformer_dwa_backward,
    denseformer_dwa_forward,
    denseformer_dwa_init,
    dwa_read_indices,
)
from .dico import (  # noqa: F401
    compact_channel_attention_backward,
    compact_channel_attention_forward,
    dico_conv_module,
    dico_conv_module_backward,
    dico_conv_module_forward,
)
from .dra import (  # noqa: F401
    DRA_PARAMS,
    dra,
    dra_backward,
    dra_forward,
)
from .dydit import (  # noqa: F401
    DYDIT_ESTIMATORS,
    dydit_block,
    dydit_block_backward,
    dydit_block_forward,
)
from .dyt import (  # noqa: F401
    DYT_ALPHA_INIT,
    dynamic_tanh,
    dynamic_tanh_backward,
    dynamic_tanh_forward,
)
from .equiformer_norm import (  # noqa: F401
    SLN_NORM_TYPES,
    degree_index,
    equiformer_attention_weights_backward,
    equiformer_attention_weights_forward,
    separable_layer_norm,
    separable_layer_norm_backward,
    separable_layer_norm_forward,
)
from .glu_ffn import (  # noqa: F401
    GLU_VARIANTS,
    LLAMA_MLP_NAMES,
    glu_activation,
    glu_ffn,
    glu_ffn_backward,
    glu_ffn_forward,
)
from .gmu import (  # noqa: F401
    gated_memory_unit,
    gated_memory_unit_backward,
    gated_memory_unit_forward,
)
from .headmask import (  # noqa: F401
    head_importance,
    headmask_attention,
    headmask_attention_backward,
    headmask_attention_forward,
    headmask_important,
    headmask_random,
)
from .hgf import (  # noqa: F401
    HGF_ESTIMATORS,
    HGF_GATE_ACTIVATIONS,
    hgf_linear,
    hgf_linear_backward,
    hgf_linear_forward,
    ternary_quantize,
)
from .layerscale import (  # noqa: F401
    layerscale_block,
    layerscale_block_backward,
    layerscale_block_forward,
    layerscale_init_value,
)
from .lmu import (  # noqa: F401
    legendre_state_space,
    lmu_impulse_response,
    lmu_token_mixer,
    lmu_token_mixer_backward,
    lmu_token_mixer_forward,
)
from .looped import (  # noqa: F401
    LOOP_INJECTIONS,
    looped_transformer,
    looped_transformer_backward,
    looped_transformer_forward,
)
from .low_rank_linear import (  # noqa: F401
    low_rank_from_dense,
    low_rank_linear,
    low_rank_linear_backward,
    low_rank_linear_forward,
)
from .macaron import (  # noqa: F401
    MACARON_STEPS,
    macaron_block,
    macaron_block_backward,
    macaron_block_forward,
)
from .magneto import (  # noqa: F401
    MAGNETO_INIT_SCHEMES,
    MAGNETO_SCALED,
    magneto_gain,
    magneto_init,
    magneto_layer,
    magneto_layer_backward,
    magneto_layer_forward,
)
from .mindskip import (  # noqa: F401
    MINDSKIP_ESTIMATORS,
    MINDSKIP_ROUTE_LEVELS,
    mindskip_attention,
    mindskip_attention_backward,
    mindskip_attention_forward,
)
from .moe import (  # noqa: F401
    MIXTRAL_EXPERT_CONFIG,
    MIXTRAL_MOE_NAMES,
    moe_topk_gating,
    moe_topk_gating_backward,
    moe_topk_gating_forward,
)
from .moh import (  # noqa: F401
    mixture_of_head_attention,
    mixture_of_head_attention_backward,
    mixture_of_head_attention_forward,
)
from .ngpt import (  # noqa: F401
    NGPT_ROPE,
    ngpt_attention_backward,
    ngpt_attention_forward,
    ngpt_normalized_block,
    ngpt_normalized_block_backward,
    ngpt_normalized_block_forward,
    ngpt_rope_tables,
    unit_norm_backward,
    unit_norm_forward,
)
from .nutime import (  # noqa: F401
    multiscale_embedding,
    multiscale_embedding_backward,
    multiscale_embedding_forward,
    nutime_scales,
    nutime_window_embedding,
    nutime_window_embedding_backward,
    nutime_window_embedding_forward,
)
from .parallel import (  # noqa: F401
    parallel_attention_mlp_block,
    parallel_attention_mlp_block_backward,
    parallel_attention_mlp_block_forward,
)
from .partialformer import (  # noqa: F401
    partialformer_attention,
    partialformer_attention_backward,
    partialformer_attention_forward,
)
from .patch_embed import (  # noqa: F401
    patchify,
    unpatchify,
    vit_patch_embedding,
    vit_patch_embedding_backward,
    vit_patch_embedding_forward,
)
from .polycom import (  # noqa: F401
    POLYCOM_KINDS,
    polycom,
    polycom_backward,
    polycom_forward,
)
from .polyphase import (  # noqa: F401
    polyphase_anchor,
    polyphase_anchoring,
    polyphase_anchoring_backward,
    polyphase_anchoring_forward,
    polyphase_norms,
)
from .poolformer import (  # noqa: F401
    poolformer_pooling_mixer,
    poolformer_pooling_mixer_backward,
    poolformer_pooling_mixer_forward,
    pooling_mixer_backward,
    pooling_mixer_forward,
)
from .repmixer import (  # noqa: F401
    fastvit_repmixer,
    fastvit_repmixer_backward,
    fastvit_repmixer_forward,
    fastvit_repmixer_reparameterize,
    repmixer_branches,
)
from .reversible import (  # noqa: F401
    REVERSIBLE_FUNCTIONS,
    reversible_residual_block,
    reversible_residual_block_backward,
    reversible_residual_block_forward,
    reversible_residual_inverse,
)
from .routing import (  # noqa: F401
    AUX_LOSS_VARIANTS,
    BALANCE_OVER,
    CAPACITY_PRIORITIES,
    SCORE_ORDERS,
    capacity_mask,
    expert_capacity,
    gates_backward,
    gates_forward,
    load_balancing_loss_backward,
    load_balancing_loss_forward,
    router_z_loss_backward,
    router_z_loss_forward,
    threshold_mask,
    topk_mask,
)
from .shallow_ffn import (  # noqa: F401
    shallow_ffn_mixer,
    shallow_ffn_mixer_backward,
    shallow_ffn_mixer_forward,
)
from .simplified import (  # noqa: F401
    shaped_attention_sublayer_backward,
    shaped_attention_sublayer_forward,
    simplified_block_he_hofmann,
    simplified_block_he_hofmann_backward,
    simplified_block_he_hofmann_forward,
)
from .ssm2d import (  # noqa: F401
    SSM2D_A_KEYS,
    ssm_2d,
    ssm_2d_backward,
    ssm_2d_forward,
    ssm_2d_kernel,
)
from .stn import (  # noqa: F401
    LOCALIZATIONS,
    localization_backward,
    localization_forward,
    spatial_transformer,
    spatial_transformer_backward,
    spatial_transformer_forward,
)
from .tnt import (  # noqa: F401
    TNT_INNER,
    TNT_OUTER,
    tnt_block,
    tnt_block_backward,
    tnt_block_forward,
)
from .token_pool import (  # noqa: F401
    TOKEN_POOLING_METHODS,
    token_pooling,
    token_pooling_backward,
    token_pooling_clusters,
    token_pooling_forward,
)

__all__ = [
    "bcos", "bcos_backward", "bcos_dynamic_weights", "bcos_forward", "ACTIVATIONS", "BATCH_NORM_KEYS", "BlockNames",
    "FUSED_QKV_NAMES", "NORMS", "SPLIT_QKV_NAMES", "Sublayer", "activation_functions", "add_grad", "add_prefix",
    "batch_norm_backward", "batch_norm_forward", "batch_norm_spec", "block_dtype", "cache_nbytes", "core_apply",
    "core_vjp", "head_gated_attention_backward", "head_gated_attention_forward", "head_gated_attention_spec",
    "init_attention_params", "mlp_backward", "mlp_forward", "mlp_spec", "norm_backward", "norm_forward", "norm_spec",
    "param_dim", "resolve_attention_core", "resolve_sublayer", "split_block_params", "transformer_block_backward",
    "transformer_block_forward", "transformer_block_spec", "deep_delta_residual", "deep_delta_residual_backward",
    "deep_delta_residual_forward", "depth_window_attention_backward", "depth_window_attention_forward",
    "DSLM_FFN_SPLITS", "DSLM_NORM_POSITIONS", "deepscalelm_block", "deepscalelm_block_backward",
    "deepscalelm_block_forward", "deepscalelm_gains", "deepscalelm_init", "deform_conv2d_apply", "deform_conv2d_vjp",
    "deformable_token_merging", "deformable_token_merging_backward", "deformable_token_merging_forward",
    "delight_block_scaling", "dextra", "dextra_backward", "dextra_config", "dextra_forward", "denseformer_dwa",
    "denseformer_dwa_backward", "denseformer_dwa_forward", "denseformer_dwa_init", "dwa_read_indices",
    "compact_channel_attention_backward", "compact_channel_attention_forward", "dico_conv_module",
    "dico_conv_module_backward", "dico_conv_module_forward", "DRA_PARAMS", "dra", "dra_backward", "dra_forward",
    "DYDIT_ESTIMATORS", "dydit_block", "dydit_block_backward", "dydit_block_forward", "DYT_ALPHA_INIT", "dynamic_tanh",
    "dynamic_tanh_backward", "dynamic_tanh_forward", "SLN_NORM_TYPES", "degree_index",
    "equiformer_attention_weights_backward", "equiformer_attention_weights_forward", "separable_layer_norm",
    "separable_layer_norm_backward", "separable_layer_norm_forward", "GLU_VARIANTS", "LLAMA_MLP_NAMES",
    "glu_activation", "glu_ffn", "glu_ffn_backward", "glu_ffn_forward", "gated_memory_unit",
    "gated_memory_unit_backward", "gated_memory_unit_forward", "head_importance", "headmask_attention",
    "headmask_attention_backward", "headmask_attention_forward", "headmask_important", "headmask_random",
    "HGF_ESTIMATORS", "HGF_GATE_ACTIVATIONS", "hgf_linear", "hgf_linear_backward", "hgf_linear_forward",
    "ternary_quantize", "layerscale_block", "layerscale_block_backward", "layerscale_block_forward",
    "layerscale_init_value", "legendre_state_space", "lmu_impulse_response", "lmu_token_mixer",
    "lmu_token_mixer_backward", "lmu_token_mixer_forward", "LOOP_INJECTIONS", "looped_transformer",
    "looped_transformer_backward", "looped_transformer_forward", "low_rank_from_dense", "low_rank_linear",
    "low_rank_linear_backward", "low_rank_linear_forward", "MACARON_STEPS", "macaron_block", "macaron_block_backward",
    "macaron_block_forward", "MAGNETO_INIT_SCHEMES", "MAGNETO_SCALED", "magneto_gain", "magneto_init", "magneto_layer",
    "magneto_layer_backward", "magneto_layer_forward", "MINDSKIP_ESTIMATORS", "MINDSKIP_ROUTE_LEVELS",
    "mindskip_attention", "mindskip_attention_backward", "mindskip_attention_forward", "MIXTRAL_EXPERT_CONFIG",
    "MIXTRAL_MOE_NAMES", "moe_topk_gating", "moe_topk_gating_backward", "moe_topk_gating_forward",
    "mixture_of_head_attention", "mixture_of_head_attention_backward", "mixture_of_head_attention_forward", "NGPT_ROPE",
    "ngpt_attention_backward", "ngpt_attention_forward", "ngpt_normalized_block", "ngpt_normalized_block_backward",
    "ngpt_normalized_block_forward", "ngpt_rope_tables", "unit_norm_backward", "unit_norm_forward",
    "multiscale_embedding", "multiscale_embedding_backward", "multiscale_embedding_forward", "nutime_scales",
    "nutime_window_embedding", "nutime_window_embedding_backward", "nutime_window_embedding_forward",
    "parallel_attention_mlp_block", "parallel_attention_mlp_block_backward", "parallel_attention_mlp_block_forward",
    "partialformer_attention", "partialformer_attention_backward", "partialformer_attention_forward", "patchify",
    "unpatchify", "vit_patch_embedding", "vit_patch_embedding_backward", "vit_patch_embedding_forward", "POLYCOM_KINDS",
    "polycom", "polycom_backward", "polycom_forward", "polyphase_anchor", "polyphase_anchoring",
    "polyphase_anchoring_backward", "polyphase_anchoring_forward", "polyphase_norms", "poolformer_pooling_mixer",
    "poolformer_pooling_mixer_backward", "poolformer_pooling_mixer_forward", "pooling_mixer_backward",
    "pooling_mixer_forward", "fastvit_repmixer", "fastvit_repmixer_backward", "fastvit_repmixer_forward",
    "fastvit_repmixer_reparameterize", "repmixer_branches", "REVERSIBLE_FUNCTIONS", "reversible_residual_block",
    "reversible_residual_block_backward", "reversible_residual_block_forward", "reversible_residual_inverse",
    "AUX_LOSS_VARIANTS", "BALANCE_OVER", "CAPACITY_PRIORITIES", "SCORE_ORDERS", "capacity_mask", "expert_capacity",
    "gates_backward", "gates_forward", "load_balancing_loss_backward", "load_balancing_loss_forward",
    "router_z_loss_backward", "router_z_loss_forward", "threshold_mask", "topk_mask", "shallow_ffn_mixer",
    "shallow_ffn_mixer_backward", "shallow_ffn_mixer_forward", "shaped_attention_sublayer_backward",
    "shaped_attention_sublayer_forward", "simplified_block_he_hofmann", "simplified_block_he_hofmann_backward",
    "simplified_block_he_hofmann_forward", "SSM2D_A_KEYS", "ssm_2d", "ssm_2d_backward", "ssm_2d_forward",
    "ssm_2d_kernel", "LOCALIZATIONS", "localization_backward", "localization_forward", "spatial_transformer",
    "spatial_transformer_backward", "spatial_transformer_forward", "TNT_INNER", "TNT_OUTER", "tnt_block",
    "tnt_block_backward", "tnt_block_forward", "TOKEN_POOLING_METHODS", "token_pooling", "token_pooling_backward",
    "token_pooling_clusters", "token_pooling_forward",
]
