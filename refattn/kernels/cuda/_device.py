"""Guarded access to ``numba.cuda`` and host/device array plumbing for the CUDA kernels.

Importing this module never fails: when ``numba.cuda`` (package ``numba-cuda``) cannot be imported,
``cuda`` is ``None`` and :func:`cuda_available` is False. The kernels run when a CUDA GPU is present
or under the CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``, set before numba is first imported).
"""

from __future__ import annotations

import os

import numpy as np

try:  # pragma: no cover - depends on the machine
    from numba import cuda  # noqa: F401

    _IMPORT_ERROR = None
except Exception as exc:  # ImportError, or a broken CUDA installation
    cuda = None
    _IMPORT_ERROR = exc

__all__ = ["cuda", "cuda_available", "simulator_enabled", "require_cuda", "is_device_array",
           "shape_proxy", "to_device", "to_host", "maybe_host"]


def simulator_enabled() -> bool:
    """True when numba runs CUDA kernels in its Python simulator (``NUMBA_ENABLE_CUDASIM=1``)."""
    if cuda is None:
        return False
    try:
        from numba import config

        return bool(config.ENABLE_CUDASIM)
    except Exception:  # pragma: no cover
        return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0")


def cuda_available() -> bool:
    """True when the CUDA kernels can run here: a usable CUDA GPU, or the CUDA simulator."""
    if cuda is None:
        return False
    if simulator_enabled():
        return True
    try:
        return bool(cuda.is_available())
    except Exception:  # pragma: no cover - driver problems
        return False


def require_cuda() -> None:
    """Raise ``RuntimeError`` (after argument validation, before any launch) without a device."""
    if not cuda_available():
        why = f" (numba.cuda import failed: {_IMPORT_ERROR})" if _IMPORT_ERROR is not None else ""
        raise RuntimeError(
            "refattn CUDA kernels need numba-cuda and an NVIDIA GPU, or the CUDA simulator "
            f"(NUMBA_ENABLE_CUDASIM=1){why}"
        )


def is_device_array(x) -> bool:
    """A numba device array (or simulator fake array) or any ``__cuda_array_interface__`` object."""
    if x is None or isinstance(x, np.ndarray):
        return False
    return hasattr(x, "__cuda_array_interface__") or (hasattr(x, "copy_to_host") and hasattr(x, "shape"))


def shape_proxy(x):
    """A zero-stride NumPy stand-in with ``x``'s shape and dtype (no device-to-host copy), so that a
    device array goes through exactly the same Python validation as a host array.

    Device arrays must already be float32 or float64; their values are not checked for NaN/inf.
    """
    dt = np.dtype(x.dtype)
    if dt.kind == "f" and dt not in (np.float32, np.float64):
        raise TypeError(f"device arrays must be float32 or float64; got dtype {dt}")
    return np.lib.stride_tricks.as_strided(np.zeros(1, dtype=dt), shape=tuple(x.shape),
                                           strides=(0,) * len(x.shape))


def to_device(x, dtype=None):
    """Host array -> C-contiguous device array of ``dtype``; device arrays are returned as they are
    when contiguous and of the right dtype (else ``as_cuda_array``/copy through the host)."""
    if is_device_array(x):
        if not hasattr(x, "copy_to_host"):
            x = cuda.as_cuda_array(x)
        if (dtype is None or np.dtype(x.dtype) == np.dtype(dtype)) and _c_contiguous(x):
            return x
        return cuda.to_device(np.ascontiguousarray(x.copy_to_host(), dtype=dtype))
    return cuda.to_device(np.ascontiguousarray(x, dtype=dtype))


def _c_contiguous(x) -> bool:
    flags = getattr(x, "flags", None)
    if flags is not None:
        try:
            return bool(flags["C_CONTIGUOUS"])
        except Exception:  # pragma: no cover
            pass
    return bool(getattr(x, "is_c_contiguous", lambda: True)())


def to_host(x) -> np.ndarray:
    return x.copy_to_host() if is_device_array(x) else np.asarray(x)


def maybe_host(x, on_device: bool):
    """Return ``x`` as it is when the caller passed device arrays, else copy it to the host."""
    return x if on_device else to_host(x)
