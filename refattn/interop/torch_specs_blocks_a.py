r"""Rows of the :mod:`refattn.interop.torch` table for building blocks (group ``blocks_a``): norms,
activations and whole transformer blocks whose registry record's forward is the upstream module's
forward, with the upstream parameter names.

Each :class:`~refattn.interop.torch_specs.Spec` here is registered with the public
:func:`~refattn.interop.torch_specs.add_specs` into the same
:data:`~refattn.interop.torch_specs.SPECS` that :mod:`refattn.interop.torch` reads (that module
imports every ``torch_specs_<group>`` module). The reference modules the tests run are in
``tests/_upstream_blocks_a.py``.
"""

from __future__ import annotations

from .torch_specs import Named, Spec, add_specs, call_x

__all__ = ["GROUP_SLUGS"]


def _x_last(key, axis=0):
    """x ``(b, n, C)``, C the size of params[key] along ``axis``."""
    def build(rng, p, cfg, z):
        return {"x": rng.standard_normal((z["b"], z["n"], p[key].shape[axis]))}, {}
    return build


# ---- DyT DynamicTanh: channels_last (b, n, C) or channel-first images (B, C, H, W)


def _dyt_build(rng, p, cfg, z):
    c = p["weight"].shape[0]
    if cfg.get("channels_last", True):
        return {"x": 2 * rng.standard_normal((z["b"], z["n"], c))}, {}
    return {"x": 2 * rng.standard_normal((z["b"], c, 2 + z["n"] % 3, 1 + z["n"] % 4))}, {}


_SPECS = [
    Spec("rms_norm", "microsoft/unilm Diff-Transformer/diff/rms_norm.py@45d438e (RMSNorm, elementwise_affine=True; "
         "normalises the last axis)",
         rules=[Named(r"weight", False)], required=("weight",), call=call_x, build=_x_last("weight"),
         attrs={"eps": "eps"}, defaults={"eps": 1e-6}),
    Spec("dyt_dynamic_tanh", "jiachenzhu/DyT dynamic_tanh.py@aab5dde (DynamicTanh; channels_last=False takes "
         "(B, C, H, W))",
         rules=[Named(r"alpha|weight|bias", False)], required=("alpha", "weight"), call=call_x, build=_dyt_build,
         attrs={"channels_last": "channels_last"}),
    Spec("dynamic_range_activator", "Baran-phys/DynamicFormer dra/activations.py@28139ba (DRA)",
         rules=[Named(r"[abcd]", False)], required=("a", "b", "c", "d"), call=call_x,
         build=lambda rng, p, cfg, z: ({"x": 2 * rng.standard_normal((z["b"], z["n"], 3 + z["m"] % 4))}, {})),
    Spec("polynorm_polycom", "BryceZhuo/PolyCom dense_model/megatron_patch/model/llama2/transformer.py@0ed8ad4 "
         "(PolyNorm with polynorm: kind='polynorm'; PolyReLU with poly: kind='polyrelu'; README.md PolyNorm)",
         rules=[Named(r"weight|bias", False)], required=("weight", "bias"), call=call_x,
         build=lambda rng, p, cfg, z: ({"x": 1.5 * rng.standard_normal((z["b"], z["n"], 3 + z["m"] % 5))}, {}),
         attrs={"eps": "eps"}),
]

add_specs(*_SPECS)

GROUP_SLUGS = tuple(s.key for s in _SPECS)
"""The keys this module adds to :data:`~refattn.interop.torch_specs.SPECS`."""
