r"""NHMO harmonic-measure boundary kernel — registered as **not implemented** (T3).

"Neural Harmonic Measure Operator" (NHMO), catalogue seed 2-67. No official code is public and no
paper text beyond the abstract was found (searched: the GitHub index, the code corpus, the pages
corpus for the title and for "harmonic measure" + "Walk-on-Spheres").

What the sources define
-----------------------
The abstract: the harmonic measure of a domain is the boundary probability distribution that,
integrated against Dirichlet data $g$, gives the Laplace solution,
$u(x) = \int_{\partial\Omega}\omega(x, y)\,g(y)\,dy$; NHMO parameterises the density $\omega$ as a
"transformer-based boundary kernel" supervised by Walk-on-Spheres exit samples; Poisson problems
add an auxiliary network for the source-induced correction (a classical decomposition); inference
re-integrates new boundary data against the fitted kernel.

What is missing
---------------
The layer itself. The abstract does not say what the transformer's tokens are (boundary points,
patches, a shape encoding), what the query is (the interior point $x$ alone or with features), how
the density is normalised to a probability over the boundary (softmax over boundary samples, a
positive field divided by a quadrature sum, or unnormalised), which quadrature weights enter the
discretised integral, or how the auxiliary Poisson network is built. The catalogue's
``softmax_j(s(x, y_j)) g(y_j)`` reading is one of several incompatible possibilities, not the
paper's definition; the Walk-on-Spheres supervision is a training objective, not a layer.
"""

from __future__ import annotations

from ..registry import Mechanism, register

__all__: list[str] = []

# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================

register(
    Mechanism(
        slug="nhmo_harmonic_measure_kernel", family="3-operator", tier="T3",
        title="NHMO: transformer boundary kernel for the harmonic measure (not implemented: the layer is "
              "undefined in the available sources)",
        paper="Neural Harmonic Measure Operator (NHMO), catalogue seed 2-67 (abstract only; no arXiv listing found)",
        docs="operators/operator-layers-t3b.md#nhmo-harmonic-measure-kernel-not-implemented",
        notes="Not implemented: the abstract is the only source found and no code is public. It states that the "
              "harmonic-measure density is a transformer-based boundary kernel supervised by Walk-on-Spheres exit "
              "samples, but defines neither the transformer's tokens and query (boundary points, patches or a shape "
              "encoding; the interior point alone or with features), nor how the density is normalised over the "
              "boundary (softmax over samples, a positive field over a quadrature sum, or unnormalised), nor the "
              "quadrature weights of the discretised integral, nor the auxiliary Poisson-correction network; the "
              "Walk-on-Spheres supervision is a training objective, not a layer.",
    ),
)
