r"""ECHO (generative transformer operator for million-point PDE trajectories): registered as
**not implemented** (T3).

Paper: Armand Kassaï Koupaï, Lise Le Boudec, Patrick Gallinari, "Efficient Generative Transformer
Operators for Million-Point PDEs" (ECHO), arXiv 2512.04974 (2025), catalogue seed 2-41; project page
echo-pde.github.io. Searched: the GitHub index (``echo-pde``, the authors, "ECHO" with PDE/operator
terms), the code corpus, and the pages corpus. The pages corpus returned the arXiv abstract and
introduction, the project page's abstract, and third-party overviews. No code was found.

What the sources define
-----------------------
ECHO is an encode-generate-decode pipeline. (i) Continuous/adaptive convolutions map the
irregular input points onto a regular latent grid. Stacked spatio-temporal "compress blocks" (each
halving a spatial or the temporal axis) and "residual blocks" then reach about 100x compression,
and a mirrored transposed-convolution decoder maps back to the mesh points. (ii) A three-stage
training and adaptation strategy generates high-resolution solutions from sparse input grids. (iii)
A transformer trained with a flow-matching objective generates whole latent trajectory segments,
conditionally or unconditionally, instead of rolling out autoregressively.

What is missing
---------------
An attention formula or any other layer definition. The sources give no attention formula (the
catalogue notes the same), and the transformer is described only as a flow-matching generator over
latent tokens. The compress and residual blocks are named but not specified: kernel sizes, strides
per axis, normalisation and activation are not given. Neither is the continuous/adaptive
convolution's kernel parameterisation, nor how the flow time and the conditioning frames enter the
transformer. The training stages and the flow-matching objective are training recipes, not layers.
"""

from __future__ import annotations

from ..registry import Mechanism, register

__all__: list[str] = []

# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================

register(
    Mechanism(
        slug="echo_generative_trajectory_operator", family="3-operator", tier="T3",
        title="ECHO: hierarchical convolutional compression + flow-matching transformer over trajectory segments "
              "(not implemented: no layer is defined in the available sources)",
        paper="Kassaï Koupaï, Le Boudec, Gallinari, Efficient Generative Transformer Operators for Million-Point PDEs "
              "(ECHO), arXiv 2512.04974 (2025)",
        docs="operators/o5a.md#echo-not-implemented",
        notes="Not implemented: the abstract, introduction, project page and third-party overviews are the only sources "
              "found and no code is public. They describe continuous/adaptive convolutions onto a latent grid, stacked "
              "spatio-temporal compress and residual blocks with a mirrored transposed-convolution decoder, and a "
              "transformer trained by flow matching over latent trajectory segments. They give no attention formula "
              "and do not specify the blocks' kernels, strides, normalisation or activation, the adaptive "
              "convolution's kernel parameterisation, or how flow time and conditioning frames enter the "
              "transformer. The training stages and the flow-matching objective are recipes, not layers.",
    ),
)
