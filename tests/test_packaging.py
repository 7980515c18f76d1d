"""Install and CI policy (issue #18): users get a torch range, CI pins one build, slow tests are split off."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _extra(name: str) -> list[str]:
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    data = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return data["project"]["optional-dependencies"][name]


def test_test_extra_gives_users_a_torch_range_and_xdist():
    test = _extra("test")
    torch = [r for r in test if re.match(r"torch\b", r)]
    assert torch and "==" not in torch[0] and ">=" in torch[0], torch  # no downgrade of a user's torch
    assert any(r.startswith("pytest-xdist") for r in test)


def test_ci_pins_torch_exactly_and_runs_both_steps():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert 'pip install -q "torch==2.13.0"' in ci
    assert ci.index("torch==2.13.0") < ci.index('-e ".[dev]"')  # pinned before the extra resolves torch
    assert '-m "not slow"' in ci and "-m slow" in ci and "set -euo pipefail" in ci


def test_slow_tests_stay_out_of_the_fast_step():
    """The README's command (-m "not slow") compiles no Numba kernel (tests/conftest.py marks them)."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "-m", "not slow",
         "tests/test_kernels_cpu.py", "tests/test_robustness.py", "tests/test_readme.py",
         "tests/test_softmax_attention.py"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    ids = [line for line in proc.stdout.splitlines() if "::" in line]
    assert ids, proc.stdout + proc.stderr
    assert not [i for i in ids if "test_kernels_cpu" in i or "[numba]" in i or "record_checks_pass[sdpa]" in i], ids
    assert any("[sdpa]" in i for i in ids)  # the NumPy entry points stay in the fast step
    numba_block = next(i for i, b in enumerate(re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(
        encoding="utf-8"), flags=re.S)) if 'backend="numba"' in b)
    assert f"test_readme_python_block_runs[{numba_block}]" not in proc.stdout
    assert "test_readme_python_block_runs[0]" in proc.stdout


def test_numba_tests_are_recognised_by_node_id():
    """xdist's controller schedules by node id: the rule must know every kernel-running test."""
    # By path: under xdist another directory's conftest (tests/cuda) may hold the name "conftest".
    spec = importlib.util.spec_from_file_location("_tests_conftest", Path(__file__).with_name("conftest.py"))
    conftest = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(conftest)
    runs_a_numba_kernel = conftest.runs_a_numba_kernel

    numba = ["tests/test_kernels_cpu.py::test_flash_float32_error_rule[False]",
             "tests/test_robustness.py::test_layouts_and_read_only_inputs_work[sdpa[numba]]",
             "tests/test_registry.py::test_named_check[sdpa:kernel:numba_cpu]",
             "tests/test_softmax_attention.py::test_record_checks_pass[sdpa]",
             "tests/test_differential.py::test_record_checks_pass[0-diff_attention_core]",
             "tests/test_testing.py::test_cli_bench_runs_the_source_benchmark"]
    numpy = ["tests/test_registry.py::test_gradcheck_tiny_float64[sdpa]",
             "tests/test_robustness.py::test_layouts_and_read_only_inputs_work[sdpa]",
             "tests/test_nn.py::test_record_checks_pass[linear]",
             "tests/test_readme.py::test_readme_python_block_runs[0]"]
    assert all(runs_a_numba_kernel(n) for n in numba)
    assert not any(runs_a_numba_kernel(n) for n in numpy)
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"), flags=re.S)
    for i, block in enumerate(blocks):
        assert runs_a_numba_kernel(f"tests/test_readme.py::test_readme_python_block_runs[{i}]") == (
            'backend="numba"' in block)
