"""Bridges to deep-learning frameworks: load their weights into refattn and check their modules.

The only place in refattn where a framework may be imported, and only lazily, inside the functions
that need it: ``import refattn`` (and ``import refattn.interop``) never imports torch.

* :mod:`refattn.interop.torch` — ``params_from_state_dict`` (a PyTorch ``state_dict`` to
  refattn's params: transposes, fused-weight splits, prefixes, complex spectral weights,
  per-head norm stacking), its inverse on gradients ``grads_to_state_dict``, ``check_module``
  (your ``nn.Module`` against refattn, forward and every gradient) and ``supported_slugs``.
* :mod:`refattn.interop.torch_specs` — the per-slug table those functions read: each mapped
  mechanism's rules, the inputs ``check_module`` draws for it and how its upstream module is called.
* :mod:`refattn.interop.torch_specs_layers` (the full layers, ``"slug:layer"``) and
  :mod:`refattn.interop.torch_specs_extra` — more rows of that table, registered into it on import.
* :mod:`refattn.interop.coverage` — ``torch_coverage()``: every implemented catalogue mechanism as
  mapped, not mapped yet, or without official code.

The functions are reached through the module (``from refattn.interop.torch import
check_module``): this package deliberately re-exports nothing, so that naming a framework's
bridge is always explicit.
"""

__all__: list[str] = []
