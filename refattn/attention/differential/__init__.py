r"""Differential attention (catalogue family 2), one module per mechanism.

Differential attention combines two softmax maps over the same values with a signed weight,
$O = (A_1 - \lambda A_2)V$, so that attention noise common to both maps cancels. `core` holds the
differential core and the helpers the family shares, `layer` the DIFF V1 layer pieces (the
$\lambda$ schedule and re-parameterisation, per-head norm, RoPE, the generic V1 layer) and `lora`
the two-branch low-rank layer of DiffLoRA and Shared DIFF. The relatives (shaped, momentum, PCT,
ReflexSplit, MALA, MTA) share the idea of combining attention maps with signed weights.

Every public name of these modules is re-exported here. A function named like its own module
(``sdpa`` in ``sdpa.py``) is exported too, so ``package.sdpa`` is the function; import the
module's other names from the module itself (``from package.sdpa import sdpa_forward``).

Modules
-------
core
    The differential attention core $O = (A_1 - \lambda A_2)V$ and the helpers the family shares
    (``diff_attention_core``).
cross
    Differential cross-attention with masked or external keys: generic / GSRA and FDA
    (``differential_cross_attention``).
dex
    DEX: a differential operation on the output of pretrained softmax heads
    (``dex_differential_adaptation``).
diff_mamba
    Differential Mamba: two whole Mamba blocks subtracted with a DIFF-style λ, then RMSNorm
    (``diff_mamba``).
diffclip
    DiffCLIP: DiffCLIP's copy of the V1 layer (biases, constant $\lambda_{init}$, no RoPE, no mask)
    (``diffclip_attention``).
difflora
    DiffLoRA: differential attention on a pretrained model via low-rank adapters on both terms
    (``difflora``).
dint
    DINT: differential-integral attention, rows normalised to sum to one (``dint_attention``).
dydila
    DyDiLA: dynamic differential linear attention — registered as **not implemented** (T3).
extraction_scoring
    Attention-guided extraction scoring (SAGE): differential attention relevance of context tokens
    (``attention_guided_extraction_scoring``).
gda
    Grouped Differential Attention (GDA): unbalanced signal / noise-control head groups
    (``grouped_differential_attention``).
layer
    Layer pieces shared by DIFF Transformer V1 and the layers built on it.
lora
    The two-branch low-rank differential layer shared by DiffLoRA and Shared DIFF.
mala
    MALA magnitude-aware linear attention: signed token weights $(1 + 1/z_i)a_{ij} - z_i/N$ that sum
    to one (``mala_linear_attention``).
momentum
    Momentum attention: a high-pass shear $(1+\gamma)q_t - \gamma q_{t-1}$ of queries and keys
    (``momentum_attention``).
mta
    Multi-Token Attention: key–query convolution over the score map, head mixing, RMS "group norm",
    gating (``multi_token_attention``).
opamp
    OpAmp attention: a differential plus a common-mode term with a finite CMRR, via adapters
    (``opamp_attention``).
pct
    PCT offset-attention: $x + \mathrm{ReLU}(\mathrm{BN}((x - x_r)W_t + b_t))$ with a
    column-renormalised softmax map (``pct_offset_attention``).
reflexsplit
    ReflexSplit's cross-stream differential window attention: $A_T - \lambda A_R$ and $A_R - \lambda
    A_T$ (``reflexsplit_dual_stream_attention``).
shaped
    Shaped attention: $A = \beta\,\mathrm{softmax}(S) + \alpha I - \gamma C$ (He & Hofmann; Noci et
    al.) (``shaped_attention``).
shared_diff
    Shared DIFF Transformer: a shared base projection with low-rank updates per branch
    (``shared_diff_attention``).
v1
    DIFF Transformer V1: the multi-head differential attention layer, exact unilm semantics
    (``diff_attention_v1``).
v2
    DIFF Transformer V2: per-token, per-head $\lambda = \sigma(xW_\lambda)$, shared K/V within a GQA
    group (``diff_attention_v2``).
"""

from __future__ import annotations

from .core import (  # noqa: F401
    KV_GROUP_MAPS,
    PAPER_V1,
    additive_mask,
    causal_keep,
    combine_mask,
    diff_attention_core,
    diff_attention_core_backward,
    diff_attention_core_forward,
    expanded_core_backward,
    expanded_core_forward,
    gather_heads,
    kv_head_index,
    matrix_param,
    per_head_param,
    resolve_scale,
    row_average,
    row_average_transpose,
    scatter_heads,
    softmax_map_backward,
    softmax_map_forward,
    validate_core,
    validate_qkv,
    vector_param,
)
from .cross import (  # noqa: F401
    differential_cross_attention,
    differential_cross_attention_backward,
    differential_cross_attention_forward,
)
from .dex import (  # noqa: F401
    dex_differential_adaptation,
    dex_differential_adaptation_backward,
    dex_differential_adaptation_forward,
)
from .diff_mamba import (  # noqa: F401
    diff_mamba,
    diff_mamba_backward,
    diff_mamba_forward,
    init_diff_mamba_params,
)
from .diffclip import (  # noqa: F401
    diffclip_attention,
    diffclip_attention_backward,
    diffclip_attention_forward,
)
from .difflora import (  # noqa: F401
    difflora,
    difflora_backward,
    difflora_forward,
)
from .dint import (  # noqa: F401
    dint_attention,
    dint_attention_backward,
    dint_attention_forward,
)
from .extraction_scoring import (  # noqa: F401
    assemble_document_scores,
    attention_guided_extraction_scoring,
    attention_guided_extraction_scoring_forward,
    chunk_attention_scores,
    farthest_question_index,
    select_budget_windows,
)
from .gda import (  # noqa: F401
    gda_head_index,
    gda_kv_index,
    grouped_differential_attention,
    grouped_differential_attention_backward,
    grouped_differential_attention_forward,
)
from .layer import (  # noqa: F401
    V1_LAMBDA_KEYS,
    diff_heads_backward,
    diff_heads_forward,
    lambda_init_fn,
    lambda_reparam_backward,
    lambda_reparam_forward,
    resolve_lambda_init,
    rope_apply,
    rope_tables,
    subln_backward,
    subln_forward,
    v1_generic_backward,
    v1_generic_forward,
    v1_layer_forward,
    v1_pairing_index,
    validate_layer_config,
    validate_rel_pos,
)
from .lora import (  # noqa: F401
    TWO_BRANCH_RESCALES,
    lora_apply,
    lora_backward,
    two_branch_backward,
    two_branch_forward,
)
from .mala import (  # noqa: F401
    mala_layer,
    mala_layer_backward,
    mala_layer_forward,
    mala_linear_attention,
    mala_linear_attention_backward,
    mala_linear_attention_forward,
    mala_rope_tables,
)
from .momentum import (  # noqa: F401
    momentum_attention,
    momentum_attention_backward,
    momentum_attention_forward,
    momentum_shear,
)
from .mta import (  # noqa: F401
    multi_token_attention,
    multi_token_attention_backward,
    multi_token_attention_forward,
    multi_token_attention_layer,
    multi_token_attention_layer_backward,
    multi_token_attention_layer_forward,
)
from .opamp import (  # noqa: F401
    ADAPTER_NAMES,
    opamp_attention,
    opamp_attention_backward,
    opamp_attention_forward,
    opamp_gains,
)
from .pct import (  # noqa: F401
    pct_offset_attention,
    pct_offset_attention_backward,
    pct_offset_attention_forward,
)
from .reflexsplit import (  # noqa: F401
    reflexsplit_dual_stream_attention,
    reflexsplit_dual_stream_attention_backward,
    reflexsplit_dual_stream_attention_forward,
    swin_relative_position_index,
)
from .shaped import (  # noqa: F401
    shaped_attention,
    shaped_attention_backward,
    shaped_attention_forward,
    shaped_attention_layer,
    shaped_attention_layer_backward,
    shaped_attention_layer_forward,
)
from .shared_diff import (  # noqa: F401
    shared_diff_attention,
    shared_diff_attention_backward,
    shared_diff_attention_forward,
)
from .v1 import (  # noqa: F401
    diff_attention_v1,
    diff_attention_v1_backward,
    diff_attention_v1_forward,
)
from .v2 import (  # noqa: F401
    diff_attention_v2,
    diff_attention_v2_backward,
    diff_attention_v2_forward,
)

__all__ = [
    "KV_GROUP_MAPS", "PAPER_V1", "additive_mask", "causal_keep", "combine_mask", "diff_attention_core",
    "diff_attention_core_backward", "diff_attention_core_forward", "expanded_core_backward", "expanded_core_forward",
    "gather_heads", "kv_head_index", "matrix_param", "per_head_param", "resolve_scale", "row_average",
    "row_average_transpose", "scatter_heads", "softmax_map_backward", "softmax_map_forward", "validate_core",
    "validate_qkv", "vector_param", "differential_cross_attention", "differential_cross_attention_backward",
    "differential_cross_attention_forward", "dex_differential_adaptation", "dex_differential_adaptation_backward",
    "dex_differential_adaptation_forward", "diff_mamba", "diff_mamba_backward", "diff_mamba_forward",
    "init_diff_mamba_params", "diffclip_attention", "diffclip_attention_backward", "diffclip_attention_forward",
    "difflora", "difflora_backward", "difflora_forward", "dint_attention", "dint_attention_backward",
    "dint_attention_forward", "assemble_document_scores", "attention_guided_extraction_scoring",
    "attention_guided_extraction_scoring_forward", "chunk_attention_scores", "farthest_question_index",
    "select_budget_windows", "gda_head_index", "gda_kv_index", "grouped_differential_attention",
    "grouped_differential_attention_backward", "grouped_differential_attention_forward", "V1_LAMBDA_KEYS",
    "diff_heads_backward", "diff_heads_forward", "lambda_init_fn", "lambda_reparam_backward", "lambda_reparam_forward",
    "resolve_lambda_init", "rope_apply", "rope_tables", "subln_backward", "subln_forward", "v1_generic_backward",
    "v1_generic_forward", "v1_layer_forward", "v1_pairing_index", "validate_layer_config", "validate_rel_pos",
    "TWO_BRANCH_RESCALES", "lora_apply", "lora_backward", "two_branch_backward", "two_branch_forward", "mala_layer",
    "mala_layer_backward", "mala_layer_forward", "mala_linear_attention", "mala_linear_attention_backward",
    "mala_linear_attention_forward", "mala_rope_tables", "momentum_attention", "momentum_attention_backward",
    "momentum_attention_forward", "momentum_shear", "multi_token_attention", "multi_token_attention_backward",
    "multi_token_attention_forward", "multi_token_attention_layer", "multi_token_attention_layer_backward",
    "multi_token_attention_layer_forward", "ADAPTER_NAMES", "opamp_attention", "opamp_attention_backward",
    "opamp_attention_forward", "opamp_gains", "pct_offset_attention", "pct_offset_attention_backward",
    "pct_offset_attention_forward", "reflexsplit_dual_stream_attention", "reflexsplit_dual_stream_attention_backward",
    "reflexsplit_dual_stream_attention_forward", "swin_relative_position_index", "shaped_attention",
    "shaped_attention_backward", "shaped_attention_forward", "shaped_attention_layer",
    "shaped_attention_layer_backward", "shaped_attention_layer_forward", "shared_diff_attention",
    "shared_diff_attention_backward", "shared_diff_attention_forward", "diff_attention_v1",
    "diff_attention_v1_backward", "diff_attention_v1_forward", "diff_attention_v2", "diff_attention_v2_backward",
    "diff_attention_v2_forward",
]
