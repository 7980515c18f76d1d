"""The README's code blocks run as written (they are the first thing a new user copies)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


def _bash_blocks() -> list[str]:
    return re.findall(r"```bash\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.S)


# a block that calls a Numba kernel compiles it: that one runs with the slow tests (tests/conftest.py)
@pytest.mark.parametrize("i", [pytest.param(i, marks=pytest.mark.numba) if 'backend="numba"' in b else i
                               for i, b in enumerate(_python_blocks())])
def test_readme_python_block_runs(i):
    code = _python_blocks()[i]
    if "torch" in code:
        pytest.importorskip("torch")
    exec(compile(code, f"README.md[python block {i}]", "exec"), {})


def test_readme_has_the_two_setup_commands():
    blocks = [b.strip() for b in _bash_blocks()]
    assert any("refattn check --all" in b for b in blocks)
    assert any("pytest" in b for b in blocks)


def test_ci_runs_the_readme_test_command():
    ci = (README.parent / ".ci" / "run").read_text(encoding="utf-8")
    test_cmd = next(b for b in _bash_blocks() if "pytest" in b).strip()
    # everything after the venv activation and install must appear in .ci/run verbatim
    tail = test_cmd.split('pip install -e ".[dev]" && ', 1)[1]
    for part in tail.split(" && "):
        assert part in ci, f".ci/run does not run {part!r} from the README"
    # and so must the README's second (slow) step
    for block in _bash_blocks():
        for line in block.splitlines():
            if line.startswith("python -m pytest"):
                assert line.strip() in ci, f".ci/run does not run {line.strip()!r} from the README"


def test_readme_test_command_leaves_out_slow_tests_and_states_the_time():
    text = README.read_text(encoding="utf-8")
    test_cmd = next(b for b in _bash_blocks() if "pytest" in b)
    assert '-m "not slow"' in test_cmd and "-n auto" in test_cmd
    assert any('python -m pytest -n auto -m slow' in b for b in _bash_blocks())
    assert "minutes on 2 cores" in text
