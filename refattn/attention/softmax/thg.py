r"""THG, Transformer with Hyperbolic Geometry (hyperbolic Q/K projections) — registered as **not implemented** (T3).

Liu, Xu, "THG: Transformer with Hyperbolic Geometry", arXiv 2106.07350 (2021). No code is public (no
repository found under the authors' or the paper's name).

What the sources define
-----------------------
The abstract: THG keeps self-attention but computes the query and the key with a proposed
"hyperbolic linear" transformation that "takes advantage of both Euclidean space and hyperbolic
space"; values and the rest of the layer stay Euclidean. The catalogue adds, as a reconstruction,
the standard Möbius matrix–vector product of hyperbolic neural networks (Ganea et al. 2018),
$M\otimes_c x = \frac{1}{\sqrt c}\tanh\big(\frac{\lVert Mx\rVert}{\lVert x\rVert}\operatorname{artanh}(\sqrt c\lVert x\rVert)\big)\frac{Mx}{\lVert Mx\rVert}$,
and notes that the paper's mixing must be read.

What is missing
---------------
Only the abstract of arXiv 2106.07350 was available here. It does not say how the Euclidean and
hyperbolic parts of the "hyperbolic linear" are combined (a sum, a gate, a concatenation, a Möbius
bias), which model of hyperbolic space and which curvature $c$ (fixed or learned) are used, where
the maps into and out of the ball sit, or whether the scores are Euclidean dot products of
tangent vectors or hyperbolic distances. That mixing is the whole mechanism: the plain HNN
composition is Euclidean, because $\log_0(M\otimes_c\exp_0(v)) = Mv$ exactly (checked numerically to
1e-16), so a projection built only from the catalogue's formula would be an ordinary linear layer.
Implementing any particular mixing would be a guess, not THG.
"""

from __future__ import annotations

from ...registry import Mechanism, register

__all__: list[str] = []

# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================

register(
    Mechanism(
        slug="thg_hyperbolic_qk_projection", family="1-softmax", tier="T3",
        title="Transformer with Hyperbolic Geometry (not implemented: the hyperbolic linear is not defined in the "
              "available sources)",
        paper="Liu, Xu, THG: Transformer with Hyperbolic Geometry, arXiv 2106.07350",
        docs="softmax/positional-encodings.md#thg-hyperbolic-qk-projections-not-implemented",
        notes="Not implemented: only the abstract of arXiv 2106.07350 was available and no code is public. It says the "
              "query and key come from a 'hyperbolic linear' that combines Euclidean and hyperbolic space but does not "
              "define how the two parts are combined, the hyperbolic model and curvature, where the exp/log maps sit, or "
              "how scores are formed; the catalogue's Moebius matrix-vector product alone reduces to a Euclidean linear "
              "map between tangent spaces (log0(M (x)_c exp0(v)) = M v), so the undefined mixing is the mechanism.",
    ),
)
