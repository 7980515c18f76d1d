"""Session-wide hooks: which tests are slow, and the robustness sweep's report.

The test suite runs in two steps (README, ``.ci/run``), both with pytest-xdist:

``python -m pytest -n auto -m "not slow"``
    everything a change is likely to break, a few minutes on 2 cores;
``python -m pytest -n auto -m slow --dist loadgroup``
    the expensive tests below, the second step of CI.

``slow`` is set here, in one place, for the tests whose cost is a fixed price rather than a
property of what they check (measured on 2 shared cores, cold caches, before this split):

* everything that runs a Numba CPU kernel: ``tests/test_kernels_cpu.py``, the robustness sweep's
  ``[numba]`` variants (``sdpa[numba]``: 95 s of a read-only-layout compile), the registry's
  ``kernel:`` parity checks (and a family's ``test_record_checks_pass`` of a record with kernels,
  which runs them), the README block that calls ``backend="numba"``, ``refattn bench``.
  The first call of a kernel signature compiles it (tens of seconds each; ``cache=True`` keeps it
  for later processes), wherever that call happens. Under ``--dist loadgroup`` they all go to one
  worker (:func:`pytest_xdist_make_scheduler`), which compiles each signature once instead of two
  workers compiling it side by side;
* the CUDA simulator run (a separate pytest process), the retrieval-demo training, the tutorial
  notebooks and the docs build (marked where they are defined).
"""

from __future__ import annotations

import functools
import re
import sys
from pathlib import Path

import pytest

# node-id fragments -> why they are slow
_SLOW_NUMBA = {
    "tests/test_kernels_cpu.py::": "compiles every Numba CPU kernel in float64 and float32",
    "[numba]": "robustness sweep through backend='numba' (compiles, incl. read-only layouts)",
    ":kernel:": "a registry kernel parity check (compiles the kernel)",
    "tests/test_testing.py::test_cli_bench_runs_the_source_benchmark": "refattn bench runs the kernels",
    "tests/test_docs.py::test_home_page_examples_run[kernels]": "the home page's Numba example",
}
_SLOW_OTHER = {
    "tests/test_cuda_sim.py::test_cuda_kernels_under_simulator": "tests/cuda under the CUDA simulator",
    "tests/test_demo_retrieval.py::test_differential_attention_puts_less_mass_on_distractors":
        "trains two attention models (80 s)",
}


@functools.cache
def _kernel_slugs() -> set[str]:
    from refattn import registry

    return {r.slug for r in registry.all(implemented=True) if r.kernels}


@functools.cache
def _readme_numba_blocks() -> set[int]:
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text(encoding="utf-8")
    return {i for i, b in enumerate(re.findall(r"```python\n(.*?)```", text, flags=re.S)) if 'backend="numba"' in b}


def runs_a_numba_kernel(nodeid: str) -> bool:
    """Whether the test with this node id runs a Numba CPU kernel (and so compiles it on a cold
    cache). A node-id rule, so that xdist's controller, which sees node ids only, can schedule
    these tests together."""
    nodeid = nodeid.replace("\\", "/")
    if any(frag in nodeid for frag in _SLOW_NUMBA):
        return True
    name, _, param = nodeid.partition("[")
    param = param.rstrip("]")
    if name.endswith("::test_record_checks_pass"):  # runs every check of a record, kernel parity too
        return bool(set(param.split("-")) & _kernel_slugs())
    if name.endswith("test_readme.py::test_readme_python_block_runs"):
        return param.isdigit() and int(param) in _readme_numba_blocks()
    return False


def pytest_itemcollected(item):
    # marked as each item is collected, so that -m selection sees the marks
    if runs_a_numba_kernel(item.nodeid) or item.get_closest_marker("numba") is not None:
        item.add_marker(pytest.mark.slow)
    elif any(frag in item.nodeid.replace("\\", "/") for frag in _SLOW_OTHER):
        item.add_marker(pytest.mark.slow)


@pytest.hookimpl(optionalhook=True)  # an xdist hook: absent when xdist is not installed
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup``: every test that runs a Numba kernel goes to one worker, and the tests
    that read the built docs site go to one worker (each worker would build the site otherwise).

    Two workers that reach the same kernel signature first would each compile it (the cache on
    disk is written after the compile). xdist's own ``xdist_group`` marks do not group under
    pytest 9.2 with xdist 3.8 (pytest-dev/pytest-xdist#1386), so the group is decided here, from
    the node id; the other tests are load-balanced one by one."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class NumbaGroupScheduling(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            if runs_a_numba_kernel(nodeid):
                return "numba"
            if nodeid.replace("\\", "/").startswith("tests/test_docs.py::"):
                return "docs"  # one worker builds the site once (a module-scoped fixture)
            return super()._split_scope(nodeid)

    return NumbaGroupScheduling(config, log)


# ---- the robustness sweep's case count, summed over xdist workers

_WORKER_CASES: list[int] = []


def _local_cases() -> tuple[int, int]:
    for name, mod in list(sys.modules.items()):
        if name.endswith("test_robustness") and hasattr(mod, "_COUNT"):
            return mod._COUNT["cases"], len(mod.SWEPT)
    return 0, 0


def pytest_sessionfinish(session):
    if hasattr(session.config, "workeroutput"):  # an xdist worker: hand the count to the controller
        session.config.workeroutput["robustness_cases"] = _local_cases()


@pytest.hookimpl(optionalhook=True)  # an xdist hook: absent when xdist is not installed
def pytest_testnodedown(node, error):
    cases = getattr(node, "workeroutput", {}).get("robustness_cases")
    if cases:
        _WORKER_CASES.append(cases)


def pytest_terminal_summary(terminalreporter):
    """Report how many bad-input/layout cases the robustness sweep tried."""
    n, swept = _local_cases()
    for cases, sw in _WORKER_CASES:
        n, swept = n + cases, max(swept, sw)
    if n:
        terminalreporter.write_line(f"robustness sweep: {n} bad-input/layout cases tried over {swept} entry points")
