"""The docs site builds with ``mkdocs build --strict``: a broken link, a missing page or a bad
mkdocstrings reference fails CI."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_mkdocs_build_strict(tmp_path):
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    exe = shutil.which("mkdocs") or f"{sys.executable} -m mkdocs"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    proc = subprocess.run(
        [*exe.split(), "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    assert (tmp_path / "site" / "catalogue" / "index.html").exists()


def test_every_registry_docs_anchor_exists():
    """Each record's docs page exists and, when it names an anchor, a heading produces it."""
    import re

    from refattn import registry

    def slugify(h: str) -> str:  # python-markdown's toc slugify
        h = re.sub(r"[^\w\s-]", "", h.strip().lower())
        return re.sub(r"[-\s]+", "-", h).strip("-")

    missing = []
    for rec in registry.all(implemented=True):
        page, _, anchor = rec.docs.partition("#")
        path = ROOT / "docs" / page
        if not path.exists():
            missing.append(f"{rec.slug}: {page} missing")
            continue
        if anchor:
            text = path.read_text(encoding="utf-8")
            heads = {slugify(m) for m in re.findall(r"^#+\s+(.*?)\s*(?:\{.*\})?$", text, flags=re.M)}
            heads |= set(re.findall(r"\{#([\w-]+)", text))
            if anchor not in heads:
                missing.append(f"{rec.slug}: #{anchor} not in {page}")
    assert not missing, "\n".join(missing)
