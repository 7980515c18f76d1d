"""Run the refattn CPU benchmark and write benchmarks/results/bench.{json,md,png}.

Usage (from the repository root)::

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python benchmarks/run.py [--quick] [--sizes 512 1024]

OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE, when set, force a slower OpenBLAS kernel under NumPy; unset them
for the benchmark only (the report records which BLAS core ran). ``OMP_WAIT_POLICY`` defaults to
PASSIVE (set by ``benchmarks/bench.py``'s ``main``; see there why). All options: ``--help`` (same as
``refattn bench``).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
