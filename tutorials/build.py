"""Regenerate the executed notebooks from their jupytext sources.

    python tutorials/build.py                 # every tutorials/NN_*.py
    python tutorials/build.py 01 04           # only the tutorials whose names start with these

Each ``NN_name.py`` (jupytext percent format, the file you edit) is converted to a notebook,
executed top to bottom with the current interpreter's ``python3`` kernel in the ``tutorials/``
folder, and written to ``NN_name.ipynb`` with its outputs, which the docs site renders without
re-executing (``mkdocs-jupyter`` with ``execute: false``). ``tests/test_tutorials.py`` checks
that the two files stay in sync and that every notebook still executes.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import jupytext
import nbformat
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
TIMEOUT = 180


def sources(prefixes=()) -> list[Path]:
    paths = sorted(p for p in HERE.glob("[0-9][0-9]_*.py"))
    if prefixes:
        paths = [p for p in paths if p.name.startswith(tuple(prefixes))]
    return paths


def execute(nb, timeout: int = TIMEOUT):
    """Run ``nb`` in place with the current interpreter (``python3`` kernel, cwd ``tutorials/``)."""
    # The inline backend (PNG outputs) regardless of a non-interactive MPLBACKEND set for CI.
    os.environ.pop("MPLBACKEND", None)
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", record_timing=False,
                            resources={"metadata": {"path": str(HERE)}})
    client.execute()
    return nb


def build(src: Path) -> float:
    nb = jupytext.read(src)
    t0 = time.perf_counter()
    execute(nb)
    dt = time.perf_counter() - t0
    nb.metadata.pop("widgets", None)
    nbformat.write(nb, src.with_suffix(".ipynb"))
    return dt


def main(argv=None) -> None:
    for src in sources(argv if argv is not None else sys.argv[1:]):
        print(f"{src.name}: {build(src):.1f} s", flush=True)


if __name__ == "__main__":
    main()
