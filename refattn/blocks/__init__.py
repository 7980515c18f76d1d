"""Family 5: transformer building blocks beyond the primitives in `refattn.nn`.

One module per block (feed-forward variants, residual schemes, gating, token mixers,
initialisation schemes ...). A block that wraps attention takes the attention mechanism as a
registry slug or a forward/backward pair and chains its backward through it: the protocol is in
`refattn.blocks.core` (`Sublayer`, `resolve_sublayer`, `split_block_params`).
"""

from .core import (  # noqa: F401
    ACTIVATIONS,
    BATCH_NORM_KEYS,
    NORMS,
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
    init_attention_params,
    mlp_backward,
    mlp_forward,
    mlp_spec,
    norm_backward,
    norm_forward,
    norm_spec,
    param_dim,
    resolve_sublayer,
    split_block_params,
    transformer_block_backward,
    transformer_block_forward,
    transformer_block_spec,
)
from .deformable_merging import (  # noqa: F401
    deform_conv2d_apply,
    deform_conv2d_vjp,
    deformable_token_merging,
    deformable_token_merging_backward,
    deformable_token_merging_forward,
)
from .looped import LOOP_INJECTIONS, looped_transformer, looped_transformer_backward, looped_transformer_forward  # noqa: F401
from .macaron import MACARON_STEPS, macaron_block, macaron_block_backward, macaron_block_forward  # noqa: F401
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
from .parallel import (  # noqa: F401
    parallel_attention_mlp_block,
    parallel_attention_mlp_block_backward,
    parallel_attention_mlp_block_forward,
)
from .patch_embed import (  # noqa: F401
    patchify,
    unpatchify,
    vit_patch_embedding,
    vit_patch_embedding_backward,
    vit_patch_embedding_forward,
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
from .simplified import (  # noqa: F401
    shaped_attention_sublayer_backward,
    shaped_attention_sublayer_forward,
    simplified_block_he_hofmann,
    simplified_block_he_hofmann_backward,
    simplified_block_he_hofmann_forward,
)
from .stn import (  # noqa: F401
    LOCALIZATIONS,
    localization_backward,
    localization_forward,
    spatial_transformer,
    spatial_transformer_backward,
    spatial_transformer_forward,
)
from .tnt import TNT_INNER, TNT_OUTER, tnt_block, tnt_block_backward, tnt_block_forward  # noqa: F401
from .token_pool import (  # noqa: F401
    TOKEN_POOLING_METHODS,
    token_pooling,
    token_pooling_backward,
    token_pooling_clusters,
    token_pooling_forward,
)

__all__ = [
    "Sublayer", "resolve_sublayer", "split_block_params", "param_dim", "block_dtype", "add_grad", "add_prefix",
    "ACTIVATIONS", "activation_functions", "NORMS", "norm_spec", "norm_forward", "norm_backward",
    "mlp_spec", "mlp_forward", "mlp_backward", "BlockNames", "transformer_block_spec",
    "transformer_block_forward", "transformer_block_backward", "init_attention_params", "cache_nbytes",
    "BATCH_NORM_KEYS", "batch_norm_spec", "batch_norm_forward", "batch_norm_backward",
    "macaron_block_forward", "macaron_block_backward", "macaron_block", "MACARON_STEPS",
    "parallel_attention_mlp_block_forward", "parallel_attention_mlp_block_backward", "parallel_attention_mlp_block",
    "shaped_attention_sublayer_forward", "shaped_attention_sublayer_backward", "simplified_block_he_hofmann_forward",
    "simplified_block_he_hofmann_backward", "simplified_block_he_hofmann",
    "unit_norm_forward", "unit_norm_backward", "ngpt_rope_tables", "ngpt_attention_forward", "ngpt_attention_backward",
    "ngpt_normalized_block_forward", "ngpt_normalized_block_backward", "ngpt_normalized_block", "NGPT_ROPE",
    "looped_transformer_forward", "looped_transformer_backward", "looped_transformer", "LOOP_INJECTIONS",
    "reversible_residual_block_forward", "reversible_residual_block_backward", "reversible_residual_block",
    "reversible_residual_inverse", "REVERSIBLE_FUNCTIONS",
    "tnt_block_forward", "tnt_block_backward", "tnt_block", "TNT_INNER", "TNT_OUTER",
    "vit_patch_embedding_forward", "vit_patch_embedding_backward", "vit_patch_embedding", "patchify", "unpatchify",
    "poolformer_pooling_mixer_forward", "poolformer_pooling_mixer_backward", "poolformer_pooling_mixer",
    "pooling_mixer_forward", "pooling_mixer_backward",
    "fastvit_repmixer_forward", "fastvit_repmixer_backward", "fastvit_repmixer", "fastvit_repmixer_reparameterize",
    "repmixer_branches",
    "spatial_transformer_forward", "spatial_transformer_backward", "spatial_transformer", "LOCALIZATIONS",
    "localization_forward", "localization_backward",
    "token_pooling_forward", "token_pooling_backward", "token_pooling", "token_pooling_clusters",
    "TOKEN_POOLING_METHODS",
    "polyphase_anchoring_forward", "polyphase_anchoring_backward", "polyphase_anchoring", "polyphase_anchor",
    "polyphase_norms",
    "deformable_token_merging_forward", "deformable_token_merging_backward", "deformable_token_merging",
    "deform_conv2d_apply", "deform_conv2d_vjp",
]
