"""Process-wide set-up of the Numba CPU kernels: on-disk cache, BLAS threads, compile notice.

Imported by every kernel module *before* its ``@njit`` functions are defined.

* **Cache directory.** Every kernel is ``@njit(cache=True)``. Numba writes the cache next to the
  source (``refattn/kernels/cpu/__pycache__``) when that folder is writeable, else to
  ``NUMBA_CACHE_DIR`` when set, else to the user-wide ``~/.cache/numba``. When none of these can be
  written (a read-only install under a read-only home), Numba would refuse to define a cached
  function; :func:`cache_dir` then points Numba at ``$REFATTN_CACHE_DIR/numba`` (default
  ``~/.cache/refattn/numba``) or, failing that, a per-user folder in the temporary directory.
* **BLAS threads.** The kernels' tile products are ``np.dot`` calls, which Numba sends to the BLAS
  that SciPy's ``cython_blas`` exposes (on pip installs, SciPy's bundled OpenBLAS). The kernels
  are already parallel over (batch, head, tile) with Numba's threads, so every tile product must
  run on one BLAS thread: a multi-threaded OpenBLAS called from several Numba workers at once ran
  the same tile product at 0.4–1.9 GFLOP/s instead of ~60. :func:`single_blas_thread` sets every
  BLAS library in the process to one thread while a kernel runs and restores the previous count
  afterwards (through ``threadpoolctl`` when it is installed, else directly through SciPy's
  OpenBLAS). The kernels' own parallelism is ``numba.get_num_threads()``.
* **Which tile products.** The SDPA / differential kernels multiply their tiles with refattn's own
  register-blocked micro-kernels (:mod:`._gemm`) by default; :func:`set_blas` (or ``REFATTN_BLAS``)
  sends them to SciPy's BLAS or to oneMKL instead (:func:`gemm_pointer`), the latter loaded on its
  sequential threading layer. The causal linear scan always uses SciPy's BLAS.
* **Compile notice.** The first call of a kernel for a dtype compiles it (tens of seconds); a
  one-line message on stderr says so instead of a silent stall. Later processes load the compiled
  code from the on-disk cache (about a second) and print nothing.
"""

from __future__ import annotations

import contextlib
import glob
import os
import sys
import tempfile
import threading
from pathlib import Path

from numba.core import config as _numba_config
from numba.core import event as _event

__all__ = ["cache_dir", "single_blas_thread", "blas_libraries", "register_entry_point", "COMPILE_SECONDS",
           "set_blas", "get_blas", "gemm_pointer", "blas_description", "mkl_available", "mkl_description", "BLAS_CHOICES"]


def _writeable_dir(path: Path) -> bool:
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path):
            pass
        return True
    except OSError:
        return False


def _setup_cache_dir() -> str:
    """Where Numba will keep the compiled kernels; sets ``numba.config.CACHE_DIR`` only when
    neither the package folder, ``NUMBA_CACHE_DIR`` nor the user-wide Numba cache is writeable."""
    if _numba_config.CACHE_DIR:
        return _numba_config.CACHE_DIR
    here = Path(__file__).resolve().parent / "__pycache__"
    if _writeable_dir(here):
        return str(here)
    from numba.misc.appdirs import AppDirs

    user_wide = Path(AppDirs(appname="numba", appauthor=False).user_cache_dir)
    if _writeable_dir(user_wide):
        return str(user_wide)
    base = os.environ.get("REFATTN_CACHE_DIR")
    candidates = [Path(base) / "numba"] if base else []
    candidates.append(Path.home() / ".cache" / "refattn" / "numba")
    candidates.append(Path(tempfile.gettempdir()) / f"refattn-numba-{os.getuid() if hasattr(os, 'getuid') else 0}")
    for cand in candidates:
        if _writeable_dir(cand):
            _numba_config.CACHE_DIR = str(cand)
            return str(cand)
    return ""  # nothing writeable: Numba compiles in every process


_CACHE_DIR = _setup_cache_dir()


def cache_dir() -> str:
    """The folder that holds the compiled kernels ('' when no writeable folder was found)."""
    return _CACHE_DIR


# --------------------------------------------------------------------------------------------
# BLAS threads


def _blas_controllers():
    """``[(get, set, description)]`` for every BLAS library in the process that can be pinned."""
    import scipy.linalg.cython_blas  # noqa: F401  (the BLAS Numba's np.dot calls; load it first)

    try:
        from threadpoolctl import ThreadpoolController
    except ImportError:
        ThreadpoolController = None
    out = []
    if ThreadpoolController is not None:
        for lib in ThreadpoolController().select(user_api="blas").lib_controllers:
            out.append((lib.get_num_threads, lib.set_num_threads,
                        f"{lib.internal_api} {lib.version} ({getattr(lib, 'architecture', '?')}) {lib.filepath}"))
        return out
    import ctypes

    import scipy

    libdir = Path(scipy.__file__).resolve().parent.parent / "scipy.libs"
    for path in sorted(glob.glob(str(libdir / "*openblas*.so*"))):
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix in ("scipy_openblas", "openblas"):
            get = getattr(lib, f"{prefix}_get_num_threads", None)
            set_ = getattr(lib, f"{prefix}_set_num_threads", None)
            if get is not None and set_ is not None:
                set_.argtypes = [ctypes.c_int]
                out.append((get, lambda n, s=set_: s(int(n)), f"openblas {path}"))
                break
    return out


_BLAS = None
_BLAS_LOCK = threading.Lock()
_BLAS_DEPTH = 0
_BLAS_SAVED: list = []


def blas_libraries() -> list[str]:
    """Descriptions of the BLAS libraries the kernels pin to one thread while they run."""
    global _BLAS
    if _BLAS is None:
        _BLAS = _blas_controllers()
    return [desc for _, _, desc in _BLAS]


@contextlib.contextmanager
def single_blas_thread():
    """Every BLAS library at one thread for the duration (re-entrant, thread-safe), then restored."""
    global _BLAS, _BLAS_DEPTH, _BLAS_SAVED
    with _BLAS_LOCK:
        if _BLAS is None:
            _BLAS = _blas_controllers()
        if _BLAS_DEPTH == 0:
            _BLAS_SAVED = [get() for get, _, _ in _BLAS]
            for (_, set_, _), n in zip(_BLAS, _BLAS_SAVED):
                if n != 1:
                    set_(1)
        _BLAS_DEPTH += 1
    try:
        yield
    finally:
        with _BLAS_LOCK:
            _BLAS_DEPTH -= 1
            if _BLAS_DEPTH == 0:
                for (_, set_, _), n in zip(_BLAS, _BLAS_SAVED):
                    if n != 1:
                        set_(n)


# --------------------------------------------------------------------------------------------
# Which BLAS runs the SDPA / differential tile products

BLAS_CHOICES = ("builtin", "scipy", "mkl", "auto")
_MKL_SEQUENTIAL = 1  # MKL_THREADING_SEQUENTIAL
_blas_choice = None
_mkl_lib = None


def _load_mkl():
    """oneMKL's single dynamic library (``libmkl_rt``, e.g. from the ``mkl`` wheel), or ``None``.

    It is switched to its sequential threading layer before any other MKL call: the kernels'
    tile products already run on Numba's threads, one product per thread."""
    global _mkl_lib
    if _mkl_lib is not None:
        return _mkl_lib or None
    import ctypes
    import ctypes.util

    names = []
    for prefix in dict.fromkeys((sys.prefix, sys.base_prefix)):
        names += sorted(glob.glob(os.path.join(prefix, "lib", "libmkl_rt.so*")), reverse=True)
        names += sorted(glob.glob(os.path.join(prefix, "Library", "bin", "mkl_rt*.dll")), reverse=True)
    found = ctypes.util.find_library("mkl_rt")
    if found:
        names.append(found)
    for name in names:
        try:
            lib = ctypes.CDLL(name)
            lib.cblas_sgemm, lib.cblas_dgemm  # noqa: B018  (both must exist)
        except (OSError, AttributeError):
            continue
        set_layer = getattr(lib, "MKL_Set_Threading_Layer", None)
        if set_layer is not None:
            set_layer.argtypes = [ctypes.c_int]
            set_layer(_MKL_SEQUENTIAL)  # no effect if MKL was already initialised by another library
        lib._refattn_path = name
        _mkl_lib = lib
        return lib
    _mkl_lib = False
    return None


def mkl_available() -> bool:
    """Whether oneMKL can be loaded, so that ``set_blas("mkl")`` would succeed."""
    return _load_mkl() is not None


def set_blas(name: str) -> str:
    """Choose what multiplies the SDPA and differential kernels' tiles; returns the choice.

    * ``"builtin"`` (what ``"auto"``, the default, chooses): refattn's own micro-kernels
      (:mod:`._gemm`), no BLAS call. On an Intel Xeon (AVX-512) they ran the tile products as fast
      as oneMKL and 20-40 % faster than SciPy's OpenBLAS (see docs/performance.md);
    * ``"scipy"``: ``np.dot`` inside Numba, i.e. the BLAS SciPy's ``cython_blas`` exposes (on pip
      installs SciPy's bundled OpenBLAS);
    * ``"mkl"``: oneMKL's CBLAS (``pip install mkl``, or ``refattn[mkl]``); an error if it cannot
      be loaded.

    The environment variable ``REFATTN_BLAS`` sets the initial choice (read at the first kernel
    call). All give float64 parity and bit-identical results across thread counts; they round
    float32 differently from each other. A forward's cache remembers its choice, so a backward
    always repeats the forward's products."""
    global _blas_choice
    if not isinstance(name, str) or name.lower() not in BLAS_CHOICES:
        raise ValueError(f"blas must be one of {BLAS_CHOICES}, got {name!r}")
    name = name.lower()
    if name == "mkl" and _load_mkl() is None:
        raise ValueError("blas='mkl': oneMKL's libmkl_rt could not be loaded (install it with "
                         "`pip install mkl` or `pip install refattn[mkl]`)")
    if name == "auto":
        name = "builtin"
    _blas_choice = name
    return name


def get_blas() -> str:
    """What multiplies the tiles now: ``"builtin"``, ``"scipy"`` or ``"mkl"`` (see :func:`set_blas`)."""
    if _blas_choice is None:
        env = os.environ.get("REFATTN_BLAS", "auto")
        try:
            set_blas(env)
        except ValueError as exc:
            raise ValueError(f"REFATTN_BLAS={env!r}: {exc}") from None
    return _blas_choice


def gemm_pointer(dtype) -> int:
    """What the kernels pass as ``fp``: -1 for the built-in micro-kernels, 0 for SciPy's BLAS
    (``np.dot``), else the address of oneMKL's ``cblas_sgemm`` / ``cblas_dgemm`` for ``dtype``."""
    if get_blas() == "builtin":
        return -1
    if get_blas() == "scipy":
        return 0
    import ctypes

    import numpy as np

    lib = _load_mkl()
    fn = lib.cblas_sgemm if np.dtype(dtype) == np.float32 else lib.cblas_dgemm
    return int(ctypes.cast(fn, ctypes.c_void_p).value)


def mkl_description() -> str:
    """One line naming the oneMKL library ``set_blas("mkl")`` uses (call when :func:`mkl_available`)."""
    return f"oneMKL (CBLAS, sequential) {_load_mkl()._refattn_path}"


def blas_description() -> str:
    """One line: what multiplies the tiles now (library and file, or the micro-kernels' shape)."""
    if get_blas() == "builtin":
        from . import _gemm

        isa = "AVX-512" if _gemm.AVX512 else "AVX2 or narrower"
        return (f"refattn's micro-kernels ({isa}: {_gemm.MR} x {_gemm.NV} vectors of "
                f"{_gemm.VECTOR_BYTES * 8} bits)")
    if get_blas() == "mkl":
        return mkl_description()
    return "SciPy's cython_blas (np.dot inside Numba)"


# --------------------------------------------------------------------------------------------
# Compile notice

# One-time compile time of each entry point for one dtype, measured in a fresh process on the
# 2-core AMD EPYC development VM while other test suites loaded it (load average 8-12), rounded
# up: what the notice announces as an upper figure (an idle machine compiles faster).
COMPILE_SECONDS = {"attention_fwd": 75, "attention_bwd": 75, "scan_fwd": 40, "scan_bwd": 75}

_ENTRY_POINTS: dict = {}


def register_entry_point(dispatcher, name: str):
    """Announce compiles of ``dispatcher`` (a kernel entry point) on stderr; returns it."""
    _ENTRY_POINTS[id(dispatcher)] = name
    return dispatcher


class _CompileNotice(_event.Listener):
    def on_start(self, event):
        data = event.data or {}
        name = _ENTRY_POINTS.get(id(data.get("dispatcher")))
        if name is None:
            return
        args = data.get("args") or ()
        dtype = next((str(a.dtype) for a in args if hasattr(a, "dtype")), "?")
        where = f"cached in {_CACHE_DIR}" if _CACHE_DIR else "no writeable cache folder: compiled in every process"
        print(f"refattn: compiling Numba kernel {name} for {dtype} (one time, up to about "
              f"{COMPILE_SECONDS.get(name, 75)} s; {where})", file=sys.stderr, flush=True)

    def on_end(self, event):
        pass


_event.register("numba:compile", _CompileNotice())
