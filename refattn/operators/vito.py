r"""ViTO (U-Net with a vision transformer for inverse PDE problems): registered as **not
implemented** (T3).

Paper: Oded Ovadia, Adar Kahana, Panos Stinis, Eli Turkel, Dan Givoli, George Em Karniadakis, "ViTO:
Vision Transformer-Operator", Computer Methods in Applied Mechanics and Engineering 428 (2024)
117109 (catalogue seed 0-17). No official code is public. Searched: the GitHub index (``ViTO``,
"Vision Transformer-Operator", the authors), the code corpus, and the pages and docs corpora for the
title. The pages corpus did not return the paper text.

What the sources define
-----------------------
The abstract says that ViTO "combines a U-Net based architecture with a vision transformer" to
solve inverse problems for the wave, Navier-Stokes and Darcy equations, including
super-resolution (coarse input, fine output), with under 10% of the leading competitor's parameters.
The catalogue reads it as standard softmax multi-head self-attention inside a U-Net. That attention
is refattn's existing ``multi_head_attention`` / ``sdpa``.

What is missing
---------------
A layer that ViTO introduces. The available sources do not say where the transformer sits (the
bottleneck, every level, or the skips), how the U-Net's feature maps are tokenised (patch size,
embedding, positional encoding), the transformer block's layout (pre/post norm, MLP width), or how
the coarse input is lifted to the fine output grid for super-resolution (interpolation before the
network, or learned up-sampling). Composing refattn's convolutions and MHSA into "a U-Net with a
ViT" would be a guess at an architecture, not ViTO's definition. Its attention adds nothing new to
implement.
"""

from __future__ import annotations

from ..registry import Mechanism, register

__all__: list[str] = []

# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================

register(
    Mechanism(
        slug="vito_unet_vit_operator", family="3-operator", tier="T3",
        title="ViTO: U-Net with a vision transformer for inverse PDE problems (not implemented: the U-Net/ViT "
              "composition is undefined in the available sources; its attention is standard MHSA)",
        paper="Ovadia, Kahana, Stinis, Turkel, Givoli, Karniadakis, ViTO: Vision Transformer-Operator, Computer Methods "
              "in Applied Mechanics and Engineering 428 (2024) 117109",
        docs="operators/o5a.md#vito-not-implemented",
        notes="Not implemented: the abstract and citing works are the only sources found and no code is public. They "
              "state that ViTO combines a U-Net with a vision transformer (standard softmax multi-head self-attention, "
              "already in refattn as multi_head_attention) for inverse problems with super-resolution. They do not "
              "define where the transformer sits in the U-Net, how feature maps are tokenised (patch size, embedding, "
              "positional encoding), the block layout, or how the coarse input reaches the fine output grid, so there "
              "is no new layer to implement and a composition would be a guess.",
    ),
)
