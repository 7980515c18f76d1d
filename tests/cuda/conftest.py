"""CUDA kernel tests: collected only where the kernels can run.

They run under the CUDA simulator (``NUMBA_ENABLE_CUDASIM=1``, set by ``tests/test_cuda_sim.py``
for a separate pytest process, because the simulator must be enabled before numba is imported) or
on a machine with an NVIDIA GPU (``scripts/gpu_check.sh``). In the main test run on a machine
without a GPU these files are not collected at all.

``REFATTN_CUDA_TEST_SIZE=toy`` (default; simulator-friendly: N <= 20, d <= 8, tiles of 2-8) or
``real`` (N in the hundreds, d = 64, automatic tiles) picks the problem sizes.
"""

from __future__ import annotations

import os

import pytest


def _enabled() -> bool:
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
        return True
    try:
        from refattn.kernels.cuda import cuda_available

        return cuda_available()
    except Exception:  # noqa: BLE001
        return False


ENABLED = _enabled()
if not ENABLED:
    collect_ignore_glob = ["test_*.py"]


def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(__file__)
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.cuda)
