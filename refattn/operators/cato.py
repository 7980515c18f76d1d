r"""CATO charted axial attention — registered as **not implemented** (T3).

Cheng, Wang, Schönlieb, Aviles-Rivero, "CATO: Charted Attention for Neural PDE Operators"
(Charted Axial Transformer Operator), arXiv 2605.09016. No official code is public (searched: the
GitHub index, the code corpus; the paper listings say "no code").

What the sources define
-----------------------
The abstract (and summaries of it): CATO learns a continuous latent *chart* that maps mesh
coordinates into a learned chart space, where *chart-conditioned axial attention* captures
long-range dependencies at reduced cost; a *derivative-aware physics loss* for steady PDEs
supervises values, mesh-consistent gradients and an auxiliary flux-like field; a theorem says that
under a favourable chart the charted axial attention represents low-rank axial solution operators
with controlled error, and that small chart perturbations degrade it boundedly.

What is missing
---------------
The layer itself. The sources do not say how the chart is parameterised (network, output range,
any invertibility or distortion regulariser), how the unstructured mesh points are arranged along
chart axes so that attention can run axially (binning, interpolation onto a chart grid, sorting),
what "chart-conditioned" adds to the attention (positional terms, gates, modulation), or the form
of the axial attention (FactFormer-style kernels, softmax per axis, heads, projections). Each of
these is a design decision of the method, not a convention; any forward written from the abstract
would be a new model, not CATO. The derivative-aware loss is a training objective, not a layer.
So no forward is registered; the record's ``notes`` say this.
"""

from __future__ import annotations

from ..registry import Mechanism, register

__all__: list[str] = []

# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================

register(
    Mechanism(
        slug="cato_charted_axial_attention", family="3-operator", tier="T3",
        title="CATO charted axial attention (not implemented: the layer is undefined in the available sources)",
        paper="Cheng, Wang, Schönlieb, Aviles-Rivero, CATO: Charted Attention for Neural PDE Operators, "
              "arXiv 2605.09016",
        docs="operators/operator-attention-t3.md#cato-charted-axial-attention-not-implemented",
        notes="Not implemented: the only sources available are the abstract of arXiv 2605.09016 and summaries of "
              "it, and no code is public. They name a learned continuous chart of the mesh coordinates and "
              "chart-conditioned axial attention in chart space, but define neither the chart's parameterisation "
              "(network, output range, regularisation), nor how the unstructured mesh points are arranged along the "
              "chart axes for axial attention (binning, interpolation onto a chart grid or sorting), nor what "
              "conditions the attention on the chart, nor the axial attention's form; the derivative-aware physics "
              "loss is a training objective, not a layer.",
    ),
)
