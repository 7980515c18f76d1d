"""Run the refattn CPU benchmark and write benchmarks/results/bench.{json,md} and roofline.png.

Usage (from the repository root)::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/run.py [--quick] [--sizes 1024 2048]

OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE, when set, force a slower OpenBLAS kernel under NumPy; unset them
for the benchmark only (the report records which BLAS kernel ran). ``OMP_WAIT_POLICY`` defaults to
PASSIVE (set by ``benchmarks/bench.py``'s ``main``; see there why). Every case is measured on one
thread (process CPU time) and on all cores (wall time) in the same run. All options: ``--help``
(same as ``refattn bench``).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
