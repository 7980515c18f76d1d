"""Compile every refattn CUDA kernel to PTX without a GPU (type-checks the real compile path, which
the CUDA simulator does not) and report float64 instructions in the float32 kernels.

Needs NVVM/NVRTC (e.g. ``pip install --target DIR nvidia-cuda-nvcc-cu12 nvidia-cuda-nvrtc-cu12`` and
``LD_LIBRARY_PATH``/``CUDA_HOME`` pointing there). Run without NUMBA_ENABLE_CUDASIM::

    python scripts/cuda_compile_check.py
"""

from __future__ import annotations

import re
import sys

from numba import cuda, types

from refattn.kernels.cuda import _attention as _k


def arr(dt, nd):
    return types.Array(dt, nd, "C")


def _no_driver_device_compiles() -> None:
    """Device functions are compiled for the current device's compute capability; without a driver
    pretend an sm_90 device (only for this PTX check)."""
    from numba.cuda import dispatcher

    class _FakeDevice:
        compute_capability = (9, 0)

    try:
        dispatcher.get_current_device().compute_capability  # noqa: B018
    except Exception:  # noqa: BLE001 - no driver here
        dispatcher.get_current_device = lambda: _FakeDevice()


def main() -> int:
    _no_driver_device_compiles()
    failures = 0
    i64, u8 = types.int64, types.uint8
    cases = [("float32", types.float32, 1, 64, 32, 64, 64, 4), ("float64", types.float64, 2, 16, 8, 8, 16, 2)]
    for name, dt, R, BQ, BK, D, DV, TX in cases:
        att = (arr(dt, 5), arr(dt, 5), arr(dt, 4), arr(dt, 4))
        mask = (i64, arr(u8, 1), arr(dt, 1), arr(i64, 1), dt, dt, i64, i64)
        sigs = {
            "fwd": (_k.get_fwd(name, R, BQ, BK, D, DV, TX), att + (arr(i64, 1),) + mask
                    + (arr(dt, 4), arr(dt, 5), arr(dt, 4))),
            "bwd_kv": (_k.get_bwd_kv(name, R, BQ, BK, D, DV, TX), att + (arr(i64, 2),) + mask
                       + (arr(dt, 4), arr(dt, 4), arr(dt, 4), arr(dt, 5), arr(dt, 4))),
            "bwd_q": (_k.get_bwd_q(name, R, BQ, BK, D, DV, TX), att + (arr(i64, 1),) + mask
                      + (arr(dt, 4), arr(dt, 4), arr(dt, 4), arr(dt, 5))),
            "delta": (_k.get_delta(name), (arr(dt, 2), arr(dt, 3), arr(dt, 2), arr(dt, 1), i64, arr(dt, 2),
                                           arr(dt, 2))),
            "lin_fwd": (_k.get_lin_fwd(name, 16, D, DV), (arr(dt, 3), arr(dt, 3), arr(dt, 3), i64, dt, arr(dt, 3),
                                                            arr(dt, 2))),
            "lin_bwd": (_k.get_lin_bwd(name, 16, D, DV), (arr(dt, 3),) * 3 + (i64,) + (arr(dt, 3),) * 2
                        + (arr(dt, 2),) + (arr(dt, 3),) * 3),
        }
        for kname, (disp, sig) in sigs.items():
            try:
                ptx, _ = cuda.compile_ptx(disp.py_func, sig, cc=(9, 0))
            except Exception as exc:  # noqa: BLE001
                failures += 1
                print(f"FAIL {name} {kname}: {type(exc).__name__}: {str(exc)[:2000]}")
                continue
            f64 = len(re.findall(r"\.f64\b", ptx)) if name == "float32" else 0
            local = "local" if ".local" in ptx else ""
            print(f"ok   {name} {kname}: {len(ptx)} chars of PTX" + (f", {f64} .f64 ops" if f64 else "")
                  + (f" ({local} memory used)" if local else ""))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
