r"""Differential attention (catalogue family 2), one module per mechanism.

Differential attention combines two softmax maps over the same values with a signed weight,
$O = (A_1 - \lambda A_2)V$, so that attention noise common to both maps cancels. A reader finds
each mechanism by its name; each module's docstring is its page, and each module reads math
first (forward, backward, convenience wrapper) with its registry record (sampler, explicit
reference, identity checks) after a separator.

Shared pieces (public names):

* ``core`` — the differential core `diff_attention_core_forward` (a registered mechanism) and the
  helpers the family shares (head maps, masks, argument checks);
* ``layer`` — the DIFF V1 layer pieces (λ schedule and re-parameterisation, per-head norm, RoPE,
  the generic V1 layer) shared by V1 and the layers built on it;
* ``lora`` — the two-branch low-rank layer shared by DiffLoRA and Shared DIFF.

Differential-attention variants built on the V1 pieces: ``v1`` (DIFF Transformer V1), ``v2``
(DIFF Transformer V2), ``diffclip`` (DiffCLIP), ``gda`` (Grouped Differential Attention),
``dint`` (DINT), ``dex`` (DEX), ``diff_lora`` (DiffLoRA), ``shared_diff`` (Shared DIFF) and
``cross`` (differential cross-attention: generic / GSRA and FDA). Each docstring says which
source (paper section, file and commit) was followed and what remains unverified; every unclear
choice is a keyword. Each forward documents its backward; all are verified against central
finite differences by the registry's generated tests.

The relatives of differential attention are still in ``refattn.attention.differential_relatives``.
"""

from __future__ import annotations

from .core import (
    KV_GROUP_MAPS,
    PAPER_V1,
    causal_keep,
    combine_mask,
    diff_attention_core,
    diff_attention_core_backward,
    diff_attention_core_forward,
    expanded_core_backward,
    expanded_core_forward,
    gather_heads,
    kv_head_index,
    row_average,
    row_average_transpose,
    scatter_heads,
    validate_core,
)
from .cross import (
    differential_cross_attention,
    differential_cross_attention_backward,
    differential_cross_attention_forward,
)
from .dex import dex_differential_adaptation, dex_differential_adaptation_backward, dex_differential_adaptation_forward
from .diff_lora import difflora, difflora_backward, difflora_forward
from .diffclip import diffclip_attention, diffclip_attention_backward, diffclip_attention_forward
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
    "difflora",
    "shared_diff_attention_forward",
    "shared_diff_attention_backward",
    "shared_diff_attention",
    "differential_cross_attention_forward",
    "differential_cross_attention_backward",
    "differential_cross_attention",
]
