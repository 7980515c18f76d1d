"""The tutorials: every notebook is in sync with its jupytext source and executes without error.

``tutorials/NN_name.py`` (percent format) is the source; ``tutorials/NN_name.ipynb`` is the same
notebook with stored outputs, rendered by the docs site. Regenerate with
``python tutorials/build.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = ROOT / "tutorials"
SOURCES = sorted(TUTORIALS.glob("[0-9][0-9]_*.py"))
NOTEBOOKS = sorted(TUTORIALS.glob("[0-9][0-9]_*.ipynb"))
TIMEOUT = 180  # seconds per notebook


def _cells(nb):
    return [(c.cell_type, c.source.strip()) for c in nb.cells if c.cell_type in ("code", "markdown")]


def test_every_source_has_a_notebook_and_back():
    assert SOURCES, "no tutorials found"
    assert {p.stem for p in SOURCES} == {p.stem for p in NOTEBOOKS}, (
        "each tutorials/NN_name.py needs its executed NN_name.ipynb (python tutorials/build.py) and vice versa")


@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.stem)
def test_notebook_in_sync_with_source(src):
    jupytext = pytest.importorskip("jupytext")
    nbformat = pytest.importorskip("nbformat")
    ipynb = src.with_suffix(".ipynb")
    assert ipynb.exists(), f"{ipynb.name} missing: run python tutorials/build.py {src.name[:2]}"
    expected = _cells(jupytext.read(src))
    stored_nb = nbformat.read(ipynb, as_version=4)
    stored = _cells(stored_nb)
    assert [c for c in stored if c[0] == "code"] == [c for c in expected if c[0] == "code"], (
        f"code cells of {ipynb.name} differ from {src.name}: run python tutorials/build.py {src.name[:2]}")
    assert stored == expected, (
        f"markdown cells of {ipynb.name} differ from {src.name}: run python tutorials/build.py {src.name[:2]}")
    # Stored outputs: every code cell was executed, in order, without an error output.
    counts = [c.get("execution_count") for c in stored_nb.cells if c.cell_type == "code"]
    assert counts == list(range(1, len(counts) + 1)), f"{ipynb.name} is not a fresh top-to-bottom execution"
    errors = [o for c in stored_nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors, f"{ipynb.name} has stored error outputs"


@pytest.mark.slow
@pytest.mark.parametrize("src", SOURCES, ids=lambda p: p.stem)
def test_notebook_executes(src, monkeypatch):
    jupytext = pytest.importorskip("jupytext")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    pytest.importorskip("matplotlib")
    if "import torch" in src.read_text(encoding="utf-8"):
        pytest.importorskip("torch")  # tutorial 7 (the test extra installs the CPU build)
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = jupytext.read(src)
    # The kernel must be this interpreter (the one refattn is installed in). jupyter_client replaces
    # a kernelspec's bare "python" by sys.executable; the cell inserted first proves it.
    nb.cells.insert(0, nbformat_code_cell("import sys; print(sys.prefix)"))
    client = nbclient.NotebookClient(nb, timeout=TIMEOUT, kernel_name="python3",
                                     resources={"metadata": {"path": str(TUTORIALS)}})
    client.execute()  # raises CellExecutionError (naming the cell) on any error
    kernel_prefix = nb.cells[0].outputs[0]["text"].strip()
    assert kernel_prefix == sys.prefix, (
        f"the notebook kernel ran in the environment {kernel_prefix}, not this one ({sys.prefix})")


def nbformat_code_cell(source):
    import nbformat

    return nbformat.v4.new_code_cell(source)
