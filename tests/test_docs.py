"""The docs site builds with ``mkdocs build --strict``: a broken link, a missing page or a bad
mkdocstrings reference fails CI."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def build_site(site_dir: Path) -> subprocess.CompletedProcess:
    """``mkdocs build --strict`` into ``site_dir`` (what CI and ``scripts/screenshots.py`` run)."""
    exe = shutil.which("mkdocs") or f"{sys.executable} -m mkdocs"
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    return subprocess.run(
        [*exe.split(), "build", "--strict", "--site-dir", str(site_dir)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site, built once for every test of this module that reads it."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    out = tmp_path_factory.mktemp("docs") / "site"
    proc = build_site(out)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-8000:]}"
    return out


def _pages(site: Path) -> list[Path]:
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 30, f"only {len(pages)} pages built"
    return pages


# What the checks below must not look into: code listings (mkdocstrings' "source code" blocks
# quote the raw docstrings, mkdocs-jupyter keeps a raw copy of each code cell for its copy
# button), inline code, scripts; and, except for the ``$$`` check, the maths itself.
_CODE = re.compile(r"<(pre|code|script|style|textarea)\b.*?</\1>|<div class=\"clipboard-copy-txt\".*?</div>", re.S)
_MATH = re.compile(r"<(span|div) class=\"arithmatex\">.*?</\1>", re.S)


@pytest.mark.slow
def test_mkdocs_build_strict(site):
    assert (site / "catalogue" / "index.html").exists()
    assert (site / "assets" / "vendor" / "mathjax" / "tex-mml-chtml.js").exists()


_REMOTE = re.compile(r"<(?:script|img|iframe)\b[^>]*\bsrc=[\"']((?:https?:)?//[^\"']+)"
                     r"|<link\b[^>]*\bhref=[\"']((?:https?:)?//[^\"']+)[^>]*>"
                     r"|@import\s+url\([\"']?((?:https?:)?//[^)\"']+)", re.I)


@pytest.mark.slow
def test_site_loads_nothing_from_another_host(site):
    """Offline readers and CI have no network: every script, stylesheet, font and image comes
    from the site itself (MathJax is vendored under docs/assets/vendor/mathjax)."""
    bad = []
    for page in [*_pages(site), *site.rglob("*.css")]:
        for m in _REMOTE.finditer(page.read_text(encoding="utf-8", errors="replace")):
            tag = m.group(0)
            if tag.startswith("<link") and not re.search(r"rel=[\"']?(stylesheet|preload|preconnect|icon|modulepreload)", tag):
                continue  # <link rel="canonical"> and the like load nothing
            bad.append(f"{page.relative_to(site)}: {next(g for g in m.groups() if g)}")
    assert not bad, "loaded from another host:\n" + "\n".join(sorted(set(bad))[:40])


@pytest.mark.slow
def test_no_broken_markup_in_html(site):
    """No literal ``$$`` (adjacent display blocks), no Sphinx role (``:func:`x```), no
    unresolved autorefs reference (``[x][]``) left in any page's text."""
    problems = []
    checks = {
        "literal $$": re.compile(r"\$\$|\$<span class=\"arithmatex\">|</span>\$"),
        "Sphinx role": re.compile(r":(?:py:)?(?:func|mod|class|meth|attr|data|obj|exc):(?:`|<code)"),
        "unresolved reference": re.compile(r"\]\[[\w.\-]*\]"),
    }
    for page in _pages(site):
        code_free = _CODE.sub(" ", page.read_text(encoding="utf-8"))
        for what, pat in checks.items():
            text = code_free if what == "literal $$" else _MATH.sub(" ", code_free)
            for m in pat.finditer(text):
                problems.append(f"{page.relative_to(site)}: {what}: ...{text[max(0, m.start() - 60):m.end() + 40]!r}")
    assert not problems, f"{len(problems)} problems:\n" + "\n".join(problems[:30])


def test_docs_markup_fixes():
    """The build-time fix itself: adjacent ``$$`` blocks, and a block under a line of text, become
    paragraphs of their own, which arithmatex needs; fenced code is left alone."""
    sys.path.insert(0, str(ROOT / "scripts"))
    from docs_markup import separate_display_math, sphinx_roles_to_refs

    got = separate_display_math("Forward:\n$$a\nb,$$\n$$c$$, then\ntext\n```\n$$x$$\n$$y$$\n```")
    assert got == "Forward:\n\n$$a\nb,$$\n\n$$c,$$\n\nthen\ntext\n```\n$$x$$\n$$y$$\n```"
    # in a list item (two-space continuation) a blank line would end the list: inline display style
    got = separate_display_math("* item:\n  $$p =\n  q$$.\n  more")
    assert got == "* item:\n  $\\displaystyle p =\n  q.$\n  more"
    got = sphinx_roles_to_refs(":func:`f` and :mod:`~a.b` and :func:`numpy.einsum`",
                               lambda n: None if n.startswith("numpy") else f"pkg.{n}")
    assert got == ('<autoref identifier="pkg.f" optional><code>f</code></autoref> and '
                   '<autoref identifier="pkg.a.b" optional><code>b</code></autoref> and <code>numpy.einsum</code>')


def test_every_registry_docs_anchor_exists():
    """Each record's docs page exists and, when it names an anchor, a heading produces it."""
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


_PIN = re.compile(r"@\s*`?[0-9a-f]{7,40}\b|\b(?:commit|git|HEAD)\s+`?[0-9a-f]{7,40}\b|\bv\d+\.\d+\.\d+\b")
_NO_CODE = re.compile(r"no (?:official|public) (?:PyTorch )?code|no public (?:repository|implementation)|no repository|"
                      r"no official implementation|could not be retrieved|proprietary|not public", re.I)


def test_every_mechanism_names_its_upstream_at_a_pinned_commit():
    """Issue #20: every mechanism whose catalogue entry names official code cites the upstream file at
    a pinned commit (or a release tag) in its module docstring or its docs section; one whose code
    cannot be had says so in words."""
    import importlib

    from refattn import registry

    bad = []
    for rec in registry.all(implemented=True):
        code = (rec.official_code or "").strip()
        if not code or code in ("-", "\u2014") or rec.family.startswith("0"):
            continue
        doc = importlib.import_module(rec.module).__doc__ or ""
        page, _, anchor = rec.docs.partition("#")
        text = (ROOT / "docs" / page).read_text(encoding="utf-8")
        if anchor:  # the section: from its heading to the next heading of the same or a higher level
            m = re.search(r"^(#+)\s+[^\n]*(?:\{#" + re.escape(anchor) + r"\}|\n)", text, flags=re.M)
            lines, out, level = text.splitlines(), [], None
            for line in lines:
                h = re.match(r"^(#+)\s", line)
                if level is None:
                    ids = re.findall(r"\{#([\w-]+)", line)
                    slug = re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", re.sub(r"\{.*\}", "", line)
                                                          .strip("# ").lower())).strip("-")
                    if h and (anchor in ids or slug == anchor):
                        level = len(h.group(1))
                        out.append(line)
                    continue
                if h and len(h.group(1)) <= level:
                    break
                out.append(line)
            text = "\n".join(out) if m or out else text
        if not (_PIN.search(doc) or _PIN.search(text) or _NO_CODE.search(doc) or _NO_CODE.search(text)):
            bad.append(f"{rec.slug} ({rec.module}; docs {rec.docs})")
    assert not bad, "no pinned upstream commit and no 'no public code' statement:\n" + "\n".join(bad)


def _home_examples():
    text = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) == 3, "the home page shows one example per user path"
    marks = {2: [pytest.mark.slow]}  # the Numba example compiles the kernel on a cold cache
    return [pytest.param(b, id=i, marks=marks.get(n, [])) for n, (i, b) in
            enumerate(zip(("learn", "check", "kernels"), blocks))]


@pytest.mark.parametrize("code", _home_examples())
def test_home_page_examples_run(code, capsys):
    """The three examples on the home page run as printed, and report success."""
    exec(compile(code, "docs/index.md", "exec"), {"__name__": "__home__"})
    out = capsys.readouterr().out
    assert out.strip(), "each example prints its result"
    assert "FAIL" not in out, out
    if "compare_implementation" in code:
        assert "PASS" in out, out
    if "max |kernel - reference|" in code:
        assert float(out.rsplit(":", 1)[1]) < 1e-4, out


@pytest.mark.slow
def test_maths_rendered_in_browser(site):
    """Headless Chromium (Debian's package) loads the home page, a mechanism page and a tutorial
    from a local server: MathJax, served by the site itself, typesets every formula (its
    ``<mjx-container>`` elements are in the DOM), with no TeX error and no raw TeX left.
    ``scripts/screenshots.py`` runs the same and saves screenshots."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import screenshots

    if screenshots.chromium() is None:
        pytest.skip("chromium is not installed (apt-get install chromium)")
    results = screenshots.render(site, None)
    for name, r in results.items():
        assert r["bytes"] > 1000, f"{name}: chromium returned no page"
        assert r["errors"] == 0 and r["raw"] == 0, f"{name}: {r}"
        if r["expected"]:
            assert r["typeset"] >= 20, f"{name}: MathJax typeset only {r['typeset']} formulas: {r}"
