r"""More rows of the :mod:`refattn.interop.torch` table (group ``ops_b``): neural-operator layers.

Each :class:`~refattn.interop.torch_specs.Spec` here maps a mechanism whose registry record's
forward is the upstream module's forward and whose params already carry the upstream names; it is
registered with the public :func:`~refattn.interop.torch_specs.add_specs` into the same
:data:`~refattn.interop.torch_specs.SPECS` that :mod:`refattn.interop.torch` reads (that module
imports this one). The reference modules the tests run are in ``tests/_upstream_ops_b.py``.
"""

from __future__ import annotations

from .torch_specs import Complex, Named, Spec, add_specs

__all__ = ["GROUP_SLUGS"]


# ---- CAPE PrmEmb_Block_1d / _2d: forward([x (B, C, n...), x_p (B, P)]) -> [out, x_p]; the grid is
# LayerNorm(normed_dim)'s shape, the spatial dimension its length


def _cape_build(rng, p, cfg, z):
    grid = p["LN.weight"].shape
    c = p["CNN_0.weight"].shape[1]
    x_p = rng.uniform(0.2, 2.0, (z["b"], p["fc0a.weight"].shape[0]))  # positive: sigmoid(log x_p) in 2-D
    return {"x": rng.standard_normal((z["b"], c) + grid), "x_p": x_p}, {}


def _cape_call(module, inp, cfg):
    return module([inp["x"], inp["x_p"]])[0]


_SPECS = [
    Spec("cape_parameter_channel_attention", "nec-research/CAPE-ML4Sci CAPE/models/PrmEmbd/PrmEmbd.py@8ae7d64 "
         "(PrmEmb_Block_1d, PrmEmb_Block_2d; forward([x, x_p])[0]; the grid is LN's normed_dim)",
         rules=[Named(r"fc[012][ab]\.weight", True), Complex("CNN_SC.weights1"), Complex("CNN_SC.weights2", optional=True),
                Named(r"(CNN_(0|AD|1|AC|2))\.(weight|bias)|LN\.(weight|bias)|fc[012][ab]\.bias", False)],
         required=("CNN_0.weight", "CNN_SC.weights1", "CNN_AD.weight", "CNN_1.weight", "CNN_AC.weight",
                   "CNN_2.weight", "fc0a.weight", "LN.weight"),
         call=_cape_call, build=_cape_build),
]

add_specs(*_SPECS)

GROUP_SLUGS = tuple(s.key for s in _SPECS)
"""The keys this module adds to :data:`~refattn.interop.torch_specs.SPECS`."""
