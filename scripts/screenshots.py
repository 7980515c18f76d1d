"""Render docs pages in a real browser: screenshots, and a check that the maths was typeset.

Builds the site (``mkdocs build --strict``) unless ``--site`` names a built one, serves it on
127.0.0.1 (fonts and scripts load as they do for a reader, not from ``file://``), and runs
headless Chromium (Debian's ``chromium`` package) on the home page, one mechanism page and one
tutorial:

* ``--screenshot`` writes ``<out>/<name>.png`` (1280 px wide);
* ``--dump-dom`` reads the DOM after the scripts ran and counts MathJax's output elements
  (``<mjx-container>``) and its error marks (``<mjx-merror>``).

usage (from the repository root):

    python scripts/screenshots.py [--site DIR] [--out DIR]

It prints one line per page and exits 1 if a page with maths typeset none, or shows a TeX
error or raw TeX.
``tests/test_docs.py::test_maths_rendered_in_browser`` runs the same check.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# (name, path in the site, has maths): the home page, one mechanism page, one tutorial
PAGES = [
    ("home", "", False),
    ("mechanism-differential", "differential/", True),
    ("tutorial-01", "tutorials/01_softmax_attention_backward/", True),
]


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    return None


def _run(browser: str, url: str, *args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    # --virtual-time-budget lets MathJax finish typesetting before the dump / screenshot
    cmd = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
           "--virtual-time-budget=15000", *args, url]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def serve(site: Path):
    """A static server for ``site`` on a free loopback port; returns (base url, server)."""
    handler = functools.partial(_Quiet, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}/", server


def maths_report(dom: str) -> dict:
    """Count MathJax's output in a rendered DOM; raw TeX left in arithmatex elements means
    MathJax never ran."""
    return {
        "typeset": len(re.findall(r"<mjx-container\b", dom)),
        "errors": len(re.findall(r"<mjx-merror\b", dom)),
        "raw": len(re.findall(r'class="arithmatex">\\[\[(]', dom)),
    }


def render(site: Path, out: Path | None, pages=PAGES) -> dict[str, dict]:
    browser = chromium()
    if browser is None:
        raise SystemExit("no chromium: apt-get install chromium")
    base, server = serve(site)
    results = {}
    try:
        for name, path, has_maths in pages:
            url = base + path
            dom = _run(browser, url, "--dump-dom").stdout
            results[name] = maths_report(dom) | {"expected": has_maths, "bytes": len(dom)}
            if out is not None:
                shot = out / f"{name}.png"
                _run(browser, url, f"--screenshot={shot}", "--window-size=1280,1600")
                results[name]["png"] = str(shot)
    finally:
        server.shutdown()
    return results


def build(site: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=ROOT, capture_output=True, text=True)
    if proc.returncode:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-6000:])
        raise SystemExit("mkdocs build --strict failed")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--site", type=Path, help="an already built site (default: build one)")
    ap.add_argument("--out", type=Path, default=ROOT / "site-screenshots", help="where the PNGs go")
    args = ap.parse_args()
    site = args.site
    if site is None:
        site = Path(tempfile.mkdtemp(prefix="refattn-site-"))
        build(site)
    args.out.mkdir(parents=True, exist_ok=True)
    bad = 0
    for name, r in render(site, args.out).items():
        ok = r["bytes"] > 1000 and (r["typeset"] > 0 or not r["expected"]) and r["errors"] == 0 and r["raw"] == 0
        bad += not ok
        print(f"{'ok ' if ok else 'BAD'} {name:24} {r['typeset']:4} formulas typeset, {r['errors']} TeX errors, "
              f"{r['raw']} left raw -> {r.get('png', '')}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
