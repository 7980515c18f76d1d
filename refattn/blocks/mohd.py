r"""MoHD, mixture of hidden dimensions — registered as **not implemented** (T3).

Chen, Shang, Zhang, Sheng, Liu, Wang, Sun, Wu, Wang, "Mixture of Hidden-Dimensions Transformer",
arXiv 2412.05644 (on OpenReview, H9CDAY3DPW, as "Mixture of Hidden-Dimensions: Not All
Hidden-States' Dimensions are Needed in Transformer"). No code is public (no repository found under the authors' or
the paper's name).

What the sources define
-----------------------
The abstract: trained Transformers use few hidden dimensions per token; MoHD keeps *shared*
sub-dimensions always active, *routes* each token to specialised sub-dimensions, and adds
*activation scaling* and *group fusion* "to preserve activation flow", expanding the hidden size
at a constant activated cost. The catalogue's reading is
$h = [h_{shared};\ \mathrm{scale}\sum_{g\in\mathrm{topk}}r_g(x)h_g]$.

What is missing
---------------
The method section, which was not available here (the stored copies of arXiv 2412.05644 hold its
abstract and introduction only), is the only place that says where the sub-dimension routing sits
(the residual stream, or the inputs/outputs of the attention and FFN projections), how the
hidden state is split into sub-dimensions, the router's form and its top-$k$ rule, the value of
the activation-scaling factor, and what the group-fusion operator is. The catalogue's formula
sums the routed sub-vectors, which already *is* a choice of group fusion; implementing it would
be a guess, not MoHD. The routing machinery it would need (top-$k$ selection with a fixed mask,
gates, balance losses) is in `refattn.blocks.routing`.
"""

from __future__ import annotations

from ..registry import Mechanism, register

__all__: list[str] = []

# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================

register(
    Mechanism(
        slug="mohd_hidden_dimension_routing", family="5-building-blocks", tier="T3",
        title="MoHD: mixture of hidden dimensions (not implemented: the method is not defined in the available sources)",
        paper="Chen, Shang, Zhang, Sheng, Liu, Wang, Sun, Wu, Wang, Mixture of Hidden-Dimensions Transformer, "
              "arXiv 2412.05644",
        docs="blocks/routing-and-gating.md#mohd-mixture-of-hidden-dimensions",
        notes="Not implemented: only the abstract and introduction of arXiv 2412.05644 were available and no code is "
              "public. They name shared sub-dimensions, routed specialised sub-dimensions, activation scaling and group "
              "fusion but do not define where the routing sits in the layer (residual stream or projection inputs and "
              "outputs), how the hidden state is split, the router and its top-k rule, the activation-scaling factor, or "
              "the group-fusion operator; the catalogue's h = [h_shared; scale * sum_g r_g(x) h_g] is a guess at these.",
    ),
)
