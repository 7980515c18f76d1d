"""numba.cuda kernels mirroring :mod:`refattn.kernels.cpu` (same signatures and validation).

* :mod:`.flash` — fused flash-style SDPA forward (out + LSE) and deterministic backward;
* :mod:`.differential` — fused differential attention forward/backward (incl. dλ);
* :mod:`.linear` — causal linear attention prefix-state scans.

Importing this package never fails on a machine without CUDA (``numba.cuda`` is imported under a
guard); :func:`cuda_available` says whether the kernels can run: a CUDA GPU, or the CUDA simulator
(``NUMBA_ENABLE_CUDASIM=1`` in the environment before numba is imported). Without either, the entry
points validate their arguments and then raise ``RuntimeError``. Kernels are attached to the registry
as backend ``"numba_cuda"`` only when :func:`cuda_available` is true.
"""

from ._device import cuda_available, simulator_enabled

__all__ = [
    "cuda_available",
    "simulator_enabled",
    "flash_attention_forward",
    "flash_attention_backward",
    "diff_attention_forward",
    "diff_attention_backward",
    "causal_linear_attention_forward",
    "causal_linear_attention_backward",
]

_LAZY = {
    "flash_attention_forward": ".flash",
    "flash_attention_backward": ".flash",
    "diff_attention_forward": ".differential",
    "diff_attention_backward": ".differential",
    "causal_linear_attention_forward": ".linear",
    "causal_linear_attention_backward": ".linear",
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
