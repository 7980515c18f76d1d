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
# A generous hang guard, not a timing test (wall time on a shared 2-core machine varies 2x).
TIMEOUT_S = 900


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
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S,
    )
    elapsed = time.monotonic() - t0
    tail = (proc.stdout + proc.stderr)[-6000:]
    assert proc.returncode == 0, f"tests/cuda failed under the CUDA simulator (exit {proc.returncode}):\n{tail}"
    assert " passed" in proc.stdout, tail
    print(f"tests/cuda under the simulator: {elapsed:.0f} s")


def test_cuda_package_imports_without_numba_cuda():
    """The registry imports kernel packages leniently, but importing refattn.kernels.cuda must not
    fail even when numba.cuda itself cannot be imported."""
    code = (
        "import sys; sys.modules['numba.cuda'] = None\n"
        "import refattn.kernels.cuda as kc\n"
        "from refattn.kernels.cuda import flash, differential, linear\n"
        "assert kc.cuda_available() is False\n"
        "import numpy as np\n"
        "q = np.ones((1, 1, 2, 2))\n"
        "try:\n"
        "    flash.flash_attention_forward(q, q, q)\n"
        "except RuntimeError as e:\n"
        "    assert 'numba-cuda' in str(e), e\n"
        "else:\n"
        "    raise AssertionError('no RuntimeError')\n"
        "from refattn import registry\n"
        "assert 'numba_cuda' not in registry.get('sdpa').kernels\n"
        "print('ok')\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stdout + proc.stderr


def test_cuda_entry_points_validate_before_needing_a_device():
    """Without a GPU (and without the simulator) bad input still raises ValueError/TypeError; good
    input raises RuntimeError, never a crash."""
    import numpy as np

    from refattn.kernels.cuda import cuda_available, differential, flash, linear

    if cuda_available():
        pytest.skip("CUDA kernels can run here")
    q = np.ones((1, 2, 3, 4))
    with pytest.raises(ValueError):
        flash.flash_attention_forward(q, q[..., :2], q)
    with pytest.raises(TypeError):
        flash.flash_attention_forward(q.astype(int), q, q)
    with pytest.raises(RuntimeError):
        flash.flash_attention_forward(q, q, q)
    with pytest.raises(ValueError):
        differential.diff_attention_forward(q, q, q, q, q, np.ones((5, 1)))
    with pytest.raises(RuntimeError):
        differential.diff_attention_forward(q, q, q, q, q, np.ones(1))
    with pytest.raises(ValueError):
        linear.causal_linear_attention_forward(q, q, q, feature_map="relu")
    with pytest.raises(RuntimeError):
        linear.causal_linear_attention_forward(q, q, q)
