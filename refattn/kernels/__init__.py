"""Jitted kernels: ``kernels.cpu`` (Numba) and ``kernels.cuda`` (numba.cuda), mirroring the reference.

The reference functions reach them through a ``backend`` keyword (``"numpy"``, the default;
``"numba"``; ``"cuda"``): :func:`forward_kernel` resolves the kernel's forward, and
:func:`backward_kernel` the matching backward from the ``"backend"`` entry the kernel stored in
its cache, so ``xxx_backward(dout, cache)`` needs no backend argument.
"""

from __future__ import annotations

import importlib

from .._checks import check_choice

__all__ = ["BACKENDS", "forward_kernel", "backward_kernel"]

BACKENDS = ("numpy", "numba", "cuda")
_PACKAGE = {"numba": "cpu", "cuda": "cuda"}
_CACHE_TAG = {"numba_cpu": "cpu", "numba_cuda": "cuda"}


def forward_kernel(backend: str, module: str, name: str):
    """The kernel ``refattn.kernels.<cpu|cuda>.<module>.<name>`` for ``backend``, or None for
    ``"numpy"`` (the reference itself runs)."""
    check_choice(backend, "backend", BACKENDS)
    if backend == "numpy":
        return None
    return getattr(importlib.import_module(f"refattn.kernels.{_PACKAGE[backend]}.{module}"), name)


def backward_kernel(cache, module: str, name: str):
    """The kernel backward for a cache a kernel forward produced, or None for a reference cache."""
    tag = cache.get("backend") if isinstance(cache, dict) else None
    if tag not in _CACHE_TAG:
        return None
    return getattr(importlib.import_module(f"refattn.kernels.{_CACHE_TAG[tag]}.{module}"), name)
