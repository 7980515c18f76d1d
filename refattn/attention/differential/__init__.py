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
  the generic V1 layer) shared by V1 and the layers built on it.

DIFF Transformer V1 is ``v1``; the other variants are still in
``refattn.attention.differential_variants`` (being split into one module each).

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
from .v1 import diff_attention_v1, diff_attention_v1_backward, diff_attention_v1_forward

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
    "diff_attention_v1_forward",
    "diff_attention_v1_backward",
    "diff_attention_v1",
]
