"""Family 5: transformer building blocks beyond the primitives in `refattn.nn`.

One module per block (feed-forward variants, residual schemes, gating, token mixers,
initialisation schemes ...). A block that wraps attention takes the attention mechanism as a
registry slug or a forward/backward pair and chains its backward through it: the protocol is in
`refattn.blocks.core` (`Sublayer`, `resolve_sublayer`, `split_block_params`).
"""

from .bcos import bcos_backward, bcos_dynamic_weights, bcos_forward  # noqa: F401
from .core import (  # noqa: F401
    ACTIVATIONS,
    NORMS,
    BlockNames,
    Sublayer,
    activation_functions,
    add_grad,
    add_prefix,
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
from .dra import DRA_PARAMS, dra_backward, dra_forward  # noqa: F401
from .dyt import DYT_ALPHA_INIT, dynamic_tanh, dynamic_tanh_backward, dynamic_tanh_forward  # noqa: F401
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
    glu_ffn_backward,
    glu_ffn_forward,
)
from .layerscale import (  # noqa: F401
    layerscale_block,
    layerscale_block_backward,
    layerscale_block_forward,
    layerscale_init_value,
)
from .looped import LOOP_INJECTIONS, looped_transformer, looped_transformer_backward, looped_transformer_forward  # noqa: F401
from .macaron import MACARON_STEPS, macaron_block, macaron_block_backward, macaron_block_forward  # noqa: F401
from .magneto import (  # noqa: F401
    MAGNETO_INIT_SCHEMES,
    MAGNETO_SCALED,
    magneto_gain,
    magneto_init,
    magneto_layer,
    magneto_layer_backward,
    magneto_layer_forward,
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
from .parallel import (  # noqa: F401
    parallel_attention_mlp_block,
    parallel_attention_mlp_block_backward,
    parallel_attention_mlp_block_forward,
)
from .polycom import POLYCOM_KINDS, polycom_backward, polycom_forward  # noqa: F401
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
from .tnt import TNT_INNER, TNT_OUTER, tnt_block, tnt_block_backward, tnt_block_forward  # noqa: F401

__all__ = [
    "Sublayer", "resolve_sublayer", "split_block_params", "param_dim", "block_dtype", "add_grad", "add_prefix",
    "ACTIVATIONS", "activation_functions", "NORMS", "norm_spec", "norm_forward", "norm_backward",
    "mlp_spec", "mlp_forward", "mlp_backward", "BlockNames", "transformer_block_spec",
    "transformer_block_forward", "transformer_block_backward", "init_attention_params", "cache_nbytes",
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
    "dynamic_tanh_forward", "dynamic_tanh_backward", "dynamic_tanh", "DYT_ALPHA_INIT",
    "dra_forward", "dra_backward", "DRA_PARAMS",
    "polycom_forward", "polycom_backward", "POLYCOM_KINDS",
    "glu_ffn_forward", "glu_ffn_backward", "glu_activation", "GLU_VARIANTS", "LLAMA_MLP_NAMES",
    "layerscale_block_forward", "layerscale_block_backward", "layerscale_block", "layerscale_init_value",
    "bcos_forward", "bcos_backward", "bcos_dynamic_weights",
    "separable_layer_norm_forward", "separable_layer_norm_backward", "separable_layer_norm",
    "equiformer_attention_weights_forward", "equiformer_attention_weights_backward", "degree_index", "SLN_NORM_TYPES",
    "magneto_layer_forward", "magneto_layer_backward", "magneto_layer", "magneto_gain", "magneto_init",
    "MAGNETO_SCALED", "MAGNETO_INIT_SCHEMES",
]
