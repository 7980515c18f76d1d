r"""ENMA irregular-points-to-grid attention encoder — registered as **not implemented** (T3).

Paper: Kassaï Koupaï, Le Boudec, Serrano, Gallinari, "ENMA: Tokenwise Autoregression for Generative
Neural PDE Operators", arXiv 2506.06158 (2025). No official code is public (searched: the GitHub
index for "enma" and the authors' names, the code corpus; the project page enma-pde.github.io
links no repository).

What the reachable sources define
---------------------------------
The abstract, the opening of the project page and of the arXiv HTML (v1, v2), and a third-party
summary (alphaxiv overview). Together they say: irregularly sampled observations are mapped onto a
regular intermediate grid by a cross-attention in which the grid points attend to the input points,
with a geometry-aware bias added to the attention logits that penalises spatially distant
query-key pairs; causal 3-D convolutions then compress space and time into latent tokens (a VAE
tokenizer); a causal transformer and a masked autoregressive transformer with a flow-matching head
generate future tokens; in-context conditioning prepends past states or context trajectories.

What is missing
---------------
The encoder layer's definition. The method section of the paper, which states the bias formula,
could not be read here: only the opening of each page is reachable, and the summary prints the
formula with its symbols stripped. Missing are the form of the bias (squared or plain distance,
a fixed or learned scale, per head or shared), what the grid queries are (learned embeddings per
grid point or an embedding of the grid coordinates), what the keys and values are built from
(point values, coordinate Fourier features, both), and the head and layer counts. Any forward
written from the reachable text would be a new model rather than ENMA's encoder. The generative
parts (flow matching, masked autoregression, in-context conditioning) are training and sampling
procedures, not a deterministic layer. refattn already has the pieces such an encoder would
compose: latent cross-attention from fixed queries to a point cloud (``ipot_inducing_point_operator``)
and softmax attention with an additive logit bias (``attention_core_forward``'s float mask).
"""

from __future__ import annotations

from ..registry import Mechanism, register

__all__: list[str] = []

# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================

register(
    Mechanism(
        slug="enma_generative_operator", family="3-operator", tier="T3",
        title="ENMA: attention encoder from irregular points to a latent grid (not implemented: the encoder's "
              "bias formula is not in the reachable sources)",
        paper="Kassai Koupai, Le Boudec, Serrano, Gallinari, ENMA: Tokenwise Autoregression for Generative Neural PDE "
              "Operators, arXiv 2506.06158 (2025)",
        docs="operators/o5b.md#enma-irregular-points-to-grid-encoder-not-implemented",
        notes="Not implemented: no code is public, and of the paper only the abstract, the opening of the project page "
              "and of the arXiv HTML, and a third-party summary whose formulas are stripped could be read. They say "
              "that grid queries cross-attend the irregular input points with a geometry-aware logit bias that "
              "penalises distant pairs, but not the bias formula (distance form, fixed or learned scale, per head or "
              "shared), what the grid queries and the keys/values are built from, or the head and layer counts, so "
              "a forward written from them would be a new model; the flow-matching masked autoregressive generator "
              "and the in-context conditioning are training and sampling procedures, not a layer.",
    ),
)
