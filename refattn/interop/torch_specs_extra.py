r"""More rows of the :mod:`refattn.interop.torch` table, kept apart from
:mod:`refattn.interop.torch_specs` (which is near the line cap of one module).

Each :class:`~refattn.interop.torch_specs.Spec` here maps a mechanism whose registry record's
forward is the upstream module's forward and whose params already carry the upstream names; it is
registered with the public :func:`~refattn.interop.torch_specs.add_specs` into the same
:data:`~refattn.interop.torch_specs.SPECS` that :mod:`refattn.interop.torch` reads (that module
imports this one). The reference modules the tests run are in ``tests/_upstream_layers.py``.
"""

from __future__ import annotations

import numpy as np

from .torch_specs import Named, Spec, add_specs

__all__ = ["EXTRA_SLUGS"]


# ---- PIBERT PhysicsBiasedAttention: forward(x, coords=None, pde_residuals=None, mask=None)


def _pibert_build(rng, p, cfg, z):
    c = p["q_proj.weight"].shape[0]
    r = rng.standard_normal((z["b"], z["n"], 3))
    r += 0.5 * np.where(r >= 0, 1.0, -1.0)  # the norm is not differentiable at 0: keep residuals away from it
    return {"x": rng.standard_normal((z["b"], z["n"], c)), "pde_residuals": r}, {}


def _pibert_call(module, inp, cfg):
    return module(inp["x"], pde_residuals=inp["pde_residuals"])


_SPECS = [
    Spec("physics_biased_fourier_wavelet_attention",
         "Samsomyajit/pibert pibert/physics/physics_attention.py@0b48dea (PhysicsBiasedAttention; "
         "forward(x, pde_residuals=); lambda_param > 0, as check_module draws residuals)",
         rules=[Named(r"(q|k|v|out)_proj\.weight", True), Named(r"(q|k|v|out)_proj\.bias", False)],
         required=("q_proj.weight", "k_proj.weight", "v_proj.weight", "out_proj.weight"),
         call=_pibert_call, build=_pibert_build,
         attrs={"num_heads": "num_heads", "lambda_param": "lambda_param"}),
]

add_specs(*_SPECS)

EXTRA_SLUGS = tuple(s.key for s in _SPECS)
"""The keys this module adds to :data:`~refattn.interop.torch_specs.SPECS`."""
