r"""Differential attention (catalogue family 2), one module per mechanism.

Differential attention combines two softmax maps over the same values with a signed weight,
$O = (A_1 - \lambda A_2)V$, so that attention noise common to both maps cancels. A reader finds
each mechanism by its name; each module's docstring is its page, and each module reads math
first (forward, backward, convenience wrapper) with its registry record (sampler, explicit
reference, identity checks) after a separator.

Shared pieces (public names):

* ``core`` — the differential core `diff_attention_core_forward` (a registered mechanism) and the
  helpers the family shares (head maps, masks, argument checks, the plain softmax-map pieces of
  the relatives);
* ``layer`` — the DIFF V1 layer pieces (λ schedule and re-parameterisation, per-head norm, RoPE,
  the generic V1 layer) shared by V1 and the layers built on it;
* ``lora`` — the two-branch low-rank layer shared by DiffLoRA and Shared DIFF.

Differential-attention variants built on the V1 pieces: ``v1`` (DIFF Transformer V1), ``v2``
(DIFF Transformer V2), ``diffclip`` (DiffCLIP), ``gda`` (Grouped Differential Attention),
``dint`` (DINT), ``dex`` (DEX), ``difflora`` (DiffLoRA), ``shared_diff`` (Shared DIFF) and
``cross`` (differential cross-attention: generic / GSRA and FDA). Each docstring says which
source (paper section, file and commit) was followed and what remains unverified; every unclear
choice is a keyword. Each forward documents its backward; all are verified against central
finite differences by the registry's generated tests.

The package re-exports every public function of its modules, except DiffLoRA's convenience
wrapper `difflora`, whose name is its module's: ``refattn.attention.differential.difflora`` is the
module (call `difflora_forward` or ``difflora.difflora``).

Relatives of differential attention — six catalogue entries of family 2 that are not DIFF
Transformer itself but share its idea of combining attention maps (or their inputs) with signed
weights: ``shaped`` (shaped attention), ``momentum`` (momentum attention), ``pct`` (PCT
offset-attention), ``reflexsplit`` (ReflexSplit dual-stream attention), ``mala`` (MALA linear
attention) and ``mta`` (Multi-Token Attention). Their derivations are in each function's
docstring and in ``docs/differential-relatives.md``. Layouts follow PyTorch SDPA
(``q (B, H, N, d)``) for the attention cores and token-major ``x (B, N, C)`` for the layers;
weights are ``(in, out)`` (PyTorch: ``linear.weight.T``; a 1x1 ``Conv1d``/``Conv2d`` weight
``w[:, :, 0].T``). Parameter keys are the upstream modules' ``state_dict`` names
(``"sa_qkv.weight"``, ``"lambda_sa"`` …) so a checkpoint maps over key by key.
"""

from __future__ import annotations

from .core import (
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
from .cross import (
    differential_cross_attention,
    differential_cross_attention_backward,
    differential_cross_attention_forward,
)
from .dex import dex_differential_adaptation, dex_differential_adaptation_backward, dex_differential_adaptation_forward
from .diffclip import diffclip_attention, diffclip_attention_backward, diffclip_attention_forward
from .difflora import difflora_backward, difflora_forward
from .dint import dint_attention, dint_attention_backward, dint_attention_forward
from .gda import (
    gda_head_index,
    gda_kv_index,
    grouped_differential_attention,
    grouped_differential_attention_backward,
    grouped_differential_attention_forward,
)
from .layer import (
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
from .lora import TWO_BRANCH_RESCALES, lora_apply, lora_backward, two_branch_backward, two_branch_forward
from .mala import (  # noqa: F401
    mala_layer,
    mala_layer_backward,
    mala_layer_forward,
    mala_linear_attention,
    mala_linear_attention_backward,
    mala_linear_attention_forward,
    mala_rope_tables,
)
from .momentum import momentum_attention, momentum_attention_backward, momentum_attention_forward, momentum_shear
from .mta import (  # noqa: F401
    multi_token_attention,
    multi_token_attention_backward,
    multi_token_attention_forward,
    multi_token_attention_layer,
    multi_token_attention_layer_backward,
    multi_token_attention_layer_forward,
)
from .pct import pct_offset_attention, pct_offset_attention_backward, pct_offset_attention_forward
from .reflexsplit import (
    reflexsplit_dual_stream_attention,
    reflexsplit_dual_stream_attention_backward,
    reflexsplit_dual_stream_attention_forward,
    swin_relative_position_index,
)
from .shaped import shaped_attention, shaped_attention_backward, shaped_attention_forward
from .shared_diff import shared_diff_attention, shared_diff_attention_backward, shared_diff_attention_forward
from .v1 import diff_attention_v1, diff_attention_v1_backward, diff_attention_v1_forward
from .v2 import diff_attention_v2, diff_attention_v2_backward, diff_attention_v2_forward

__all__ = [
    "PAPER_V1",
    "causal_keep",
    "KV_GROUP_MAPS",
    "kv_head_index",
    "gather_heads",
    "scatter_heads",
    "combine_mask",
    "validate_core",
    "row_average",
    "row_average_transpose",
    "expanded_core_forward",
    "expanded_core_backward",
    "diff_attention_core_forward",
    "diff_attention_core_backward",
    "diff_attention_core",
    "validate_qkv",
    "resolve_scale",
    "additive_mask",
    "softmax_map_forward",
    "softmax_map_backward",
    "per_head_param",
    "matrix_param",
    "vector_param",
    "lambda_init_fn",
    "resolve_lambda_init",
    "V1_LAMBDA_KEYS",
    "lambda_reparam_forward",
    "lambda_reparam_backward",
    "subln_forward",
    "subln_backward",
    "rope_tables",
    "rope_apply",
    "validate_rel_pos",
    "diff_heads_forward",
    "diff_heads_backward",
    "validate_layer_config",
    "v1_pairing_index",
    "v1_generic_forward",
    "v1_generic_backward",
    "v1_layer_forward",
    "TWO_BRANCH_RESCALES",
    "lora_apply",
    "lora_backward",
    "two_branch_forward",
    "two_branch_backward",
    "diff_attention_v1_forward",
    "diff_attention_v1_backward",
    "diff_attention_v1",
    "diff_attention_v2_forward",
    "diff_attention_v2_backward",
    "diff_attention_v2",
    "diffclip_attention_forward",
    "diffclip_attention_backward",
    "diffclip_attention",
    "gda_head_index",
    "gda_kv_index",
    "grouped_differential_attention_forward",
    "grouped_differential_attention_backward",
    "grouped_differential_attention",
    "dint_attention_forward",
    "dint_attention_backward",
    "dint_attention",
    "dex_differential_adaptation_forward",
    "dex_differential_adaptation_backward",
    "dex_differential_adaptation",
    "difflora_forward",
    "difflora_backward",
    "shared_diff_attention_forward",
    "shared_diff_attention_backward",
    "shared_diff_attention",
    "differential_cross_attention_forward",
    "differential_cross_attention_backward",
    "differential_cross_attention",
    "shaped_attention_forward",
    "shaped_attention_backward",
    "shaped_attention",
    "momentum_shear",
    "momentum_attention_forward",
    "momentum_attention_backward",
    "momentum_attention",
    "pct_offset_attention_forward",
    "pct_offset_attention_backward",
    "pct_offset_attention",
    "swin_relative_position_index",
    "reflexsplit_dual_stream_attention_forward",
    "reflexsplit_dual_stream_attention_backward",
    "reflexsplit_dual_stream_attention",
    "mala_rope_tables",
    "mala_layer_forward",
    "mala_layer_backward",
    "mala_layer",
    "mala_linear_attention_forward",
    "mala_linear_attention_backward",
    "mala_linear_attention",
    "multi_token_attention_forward",
    "multi_token_attention_backward",
    "multi_token_attention",
    "multi_token_attention_layer_forward",
    "multi_token_attention_layer_backward",
    "multi_token_attention_layer",
]
