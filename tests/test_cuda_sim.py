"""Run the CUDA kernel tests (tests/cuda) under the numba CUDA simulator in a separate process.

The simulator has to be switched on (``NUMBA_ENABLE_CUDASIM=1``) before numba is first imported, so
it cannot run inside this pytest process, which has already imported numba for the CPU kernels.
The subprocess runs the same tests a GPU machine runs (``scripts/gpu_check.sh``), at toy sizes
(``REFATTN_CUDA_TEST_SIZE=toy``). On a machine with a real GPU the main run collects tests/cuda
itself, so this wrapper skips there.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TIME_LIMIT_S = 180


def _numba_cuda_importable() -> bool:
    try:
        import numba.cuda  # noqa: F401
    except Exception:  # noqa: BLE001
        return False
    return True


@pytest.mark.cuda
@pytest.mark.skipif(not _numba_cuda_importable(), reason="numba.cuda (numba-cuda) is not importable")
def test_cuda_kernels_under_simulator():
    from refattn.kernels.cuda import cuda_available, simulator_enabled

    if cuda_available() and not simulator_enabled():
        pytest.skip("a CUDA GPU is present: tests/cuda runs directly in this pytest process")
    env = dict(os.environ)
    env.update(NUMBA_ENABLE_CUDASIM="1", REFATTN_CUDA_TEST_SIZE="toy", PYTHONDONTWRITEBYTECODE="1")
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "tests/cuda", "-q", "-p", "no:cacheprovider"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=2 * TIME_LIMIT_S,
    )
    elapsed = time.monotonic() - t0
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, f"tests/cuda failed under the CUDA simulator (exit {proc.returncode}):\n{tail}"
    assert " passed" in proc.stdout, tail
    assert elapsed < TIME_LIMIT_S, f"tests/cuda took {elapsed:.0f} s under the simulator (budget {TIME_LIMIT_S} s)"
