"""mkdocs hook: pages generated from the code, so the site cannot drift from it.

* ``index.md``: the ``<!-- registry:coverage -->`` marker becomes the coverage table by family.
* ``catalogue.md``: the ``<!-- registry:table -->`` marker becomes a table of every registry
  record (status, tier, paper, upstream code, docs section), one section per family.
* ``port-an-official-module.md``: the ``<!-- interop:coverage -->`` marker becomes the table of
  which mechanisms ``refattn.interop.torch`` maps, which have no official code, which wait.
* ``api/``: one mkdocstrings page per family package (``refattn.attention.differential`` ...),
  with a section per mechanism module (its docstring is the mechanism's page, then every public
  function with its equations), plus an index.
* ``tutorials/*.ipynb``: the notebooks under the repository's ``tutorials/`` folder are added to
  the site (rendered by mkdocs-jupyter from their stored outputs; CI executes them separately).
"""

from __future__ import annotations

import logging
import pkgutil
import posixpath
import re
import sys
from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("mkdocs.hooks.refattn")
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
if str(ROOT / "scripts") not in sys.path:
    sys.path.insert(0, str(ROOT / "scripts"))

from docs_markup import separate_display_math  # noqa: E402


def _public_modules() -> list[str]:
    import refattn

    mods = ["refattn.registry"]
    for info in pkgutil.walk_packages(refattn.__path__, prefix="refattn."):
        parts = info.name.split(".")
        if any(p.startswith("_") for p in parts) or info.ispkg:
            continue
        if info.name in ("refattn.registry", "refattn.cli") or ".kernels.cuda" in info.name:
            # CUDA modules import numba.cuda; documented in kernels.md instead
            continue
        mods.append(info.name)
    return sorted(set(mods))


# One API page per family (package), with a section per mechanism module, in this order; a
# package that appears later (a new family) gets its own page after these.
API_PAGES = {
    "refattn.registry": "The registry: one record per catalogue slug",
    "refattn.nn": "Primitives (`refattn.nn`)",
    "refattn.attention.softmax": "Family 1: softmax attention (`refattn.attention.softmax`)",
    "refattn.attention.differential": "Family 2: differential attention (`refattn.attention.differential`)",
    "refattn.operators": "Family 3: operator learning (`refattn.operators`)",
    "refattn.attention.linear": "Family 4: linear, kernel, sparse and set attention (`refattn.attention.linear`)",
    "refattn.blocks": "Family 5: transformer building blocks (`refattn.blocks`)",
    "refattn.testing": "Verification tools (`refattn.testing`)",
    "refattn.interop": "Framework bridges (`refattn.interop`)",
    "refattn.kernels.cpu": "Numba CPU kernels (`refattn.kernels.cpu`)",
}


def api_pages() -> dict[str, list[str]]:
    """``{page package: [its public modules]}``: each module goes to the page of its package
    (top-level modules such as ``refattn.optim`` to a page of their own)."""
    pages: dict[str, list[str]] = {k: [] for k in API_PAGES}
    for mod in _public_modules():
        pkg = mod if mod in API_PAGES else mod.rsplit(".", 1)[0]
        if pkg == "refattn":
            pkg = mod
        pages.setdefault(pkg, []).append(mod)
    return {k: v for k, v in pages.items() if v}


def _api_page(pkg: str, mods: list[str]) -> str:
    title = API_PAGES.get(pkg, f"`{pkg}`")
    lines = [f"# {title}", ""]
    if len(mods) == 1 and mods[0] == pkg:
        lines += [f"::: {pkg}", ""]
        return "\n".join(lines)
    lines += [f"::: {pkg}", "    options:", "      show_root_heading: false", "      members: false", ""]
    for mod in mods:
        lines += [f"## `{mod.rsplit('.', 1)[-1]}`", "", f"::: {mod}", "    options:",
                  "      show_root_heading: false", "      heading_level: 3", ""]
    return "\n".join(lines)


# Before the plugins' on_files (default priority 0): mkdocs-jupyter turns the notebooks added here into
# rendered pages only if they are already in the file list when its own on_files runs.
@event_priority(50)
def on_files(files, config):
    pages = api_pages()
    for pkg, mods in pages.items():
        files.append(File.generated(config, f"api/{pkg}.md", content=_api_page(pkg, mods)))
    lines = ["# API reference", "",
             "One page per family, with a section per mechanism module: every public function with its "
             "docstring and equations. Start from the [architecture](../architecture.md) page to see how "
             "the packages fit together.", ""]
    for pkg, mods in pages.items():
        names = ", ".join(f"`{m.rsplit('.', 1)[-1]}`" for m in mods if m != pkg)
        lines.append(f"- [{API_PAGES.get(pkg, pkg)}]({pkg}.md)" + (f": {names}" if names else ""))
    files.append(File.generated(config, "api/index.md", content="\n".join(lines) + "\n"))
    tut = ROOT / "tutorials"
    for nb in sorted(tut.glob("*.ipynb")):
        files.append(File(f"tutorials/{nb.name}", src_dir=str(ROOT), dest_dir=config["site_dir"],
                          use_directory_urls=config["use_directory_urls"]))
    return files


def _registry_table(page_dir: str) -> str:
    from refattn import registry

    out = []
    impl = registry.all(implemented=True)
    allr = registry.all()
    out.append(f"**{len(impl)} implemented** of {len(allr)} records "
               f"({sum(r.tier == 'T1' and r.implemented for r in allr)} of "
               f"{sum(r.tier == 'T1' for r in allr)} T1 catalogue entries).\n")
    for fam, title in registry.FAMILIES.items():
        recs = [r for r in allr if r.family == fam]
        if not recs:
            continue
        out.append(f"\n## {title}\n")
        out.append("| slug | mechanism | tier | status | kernels | docs |")
        out.append("|---|---|---|---|---|---|")
        for r in recs:
            status = "implemented, FD-verified in CI" if r.implemented else "not implemented"
            docs = ""
            if r.docs:
                page, _, anchor = r.docs.partition("#")
                docs = f"[{page.removesuffix('.md')}]({page}{'#' + anchor if anchor else ''})"
            title_ = r.title.replace("|", "\\|")
            out.append(f"| `{r.slug}` | {title_} | {r.tier} | {status} | {', '.join(sorted(r.kernels)) or ''} | {docs} |")
    return "\n".join(out) + "\n"


def _coverage_table() -> str:
    """The home page's table: per family, implemented records, FD-verified backward passes,
    Numba kernels, and where to read about them (the family's section of the catalogue)."""
    from markdown.extensions.toc import slugify

    from refattn import registry

    allr = registry.all()
    rows = ["| family | implemented | of records | with Numba kernels | catalogue |",
            "|---|---:|---:|---:|---|"]
    tot = [0, 0, 0]
    for fam, title in registry.FAMILIES.items():
        recs = [r for r in allr if r.family == fam]
        if not recs:
            continue
        n_impl = sum(r.implemented for r in recs)
        n_kern = sum(bool(r.kernels) for r in recs)
        tot = [tot[0] + n_impl, tot[1] + len(recs), tot[2] + n_kern]
        rows.append(f"| {title} | {n_impl} | {len(recs)} | {n_kern} | "
                    f"[{fam}](catalogue.md#{slugify(title, '-')}) |")
    rows.append(f"| **all families** | **{tot[0]}** | **{tot[1]}** | **{tot[2]}** | [catalogue](catalogue.md) |")
    return ("\n".join(rows) + "\n\nEvery implemented record has its backward checked against float64 "
            "central finite differences in CI; the table is generated from the registry when the "
            "site is built.\n")


def _md_text(text: str) -> str:
    """Plain text in a Markdown table cell: ``|`` would end the cell, and ``[...](...)`` (e.g.
    ``differential[i](x)`` in an upstream call) or ``*``/``<`` would become markup."""
    for ch in "\\[]*<":
        text = text.replace(ch, "\\" + ch)
    return text.replace("|", "/")


def _interop_table() -> str:
    """The "Port an official module" page's table: every implemented catalogue mechanism with its
    ``refattn.interop.torch`` status (``refattn.interop.coverage.torch_coverage``)."""
    from refattn.interop.coverage import STATUSES, torch_coverage

    cov = torch_coverage()
    counts = {s: sum(v[0] == s for v in cov.values()) for s in STATUSES}
    lines = [", ".join(f"**{n}** {s}" for s, n in counts.items()) + f" (of {len(cov)} implemented catalogue "
             "mechanisms; generated from the registry when the site is built).", ""]
    for status in STATUSES:
        rows = sorted((k, v[1]) for k, v in cov.items() if v[0] == status)
        if not rows:
            continue
        lines += [f"### {status.capitalize()} ({len(rows)})", "", "| mechanism | upstream |", "|---|---|"]
        lines += [f"| `{k}` | {_md_text(d)} |" for k, d in rows]
        lines.append("")
    return "\n".join(lines)


def on_page_markdown(markdown, page, config, files):
    if "<!-- interop:coverage -->" in markdown:
        markdown = markdown.replace("<!-- interop:coverage -->", _interop_table())
    if "<!-- registry:coverage -->" in markdown:
        markdown = markdown.replace("<!-- registry:coverage -->", _coverage_table())
    if "<!-- registry:table -->" in markdown:
        markdown = markdown.replace("<!-- registry:table -->", _registry_table(page.file.src_uri))
    return separate_display_math(markdown)


_HREF = re.compile(r'href="(?!https?:|mailto:|#|/)([^"#?]+\.(?:md|ipynb))(#[^"]*)?"')
_MD_CELL = '<div class="jp-RenderedHTMLCommon jp-RenderedMarkdown'
_CODE = re.compile(r"(<code[^>]*>.*?</code>)", re.S)
_DISPLAY = re.compile(r"\$\$(.+?)\$\$", re.S)
_INLINE = re.compile(r"(?<![\\$])\$(?!\$)(.+?)(?<![\\$])\$", re.S)


def _arithmatex(text: str) -> str:
    """``$$x$$`` / ``$x$`` in rendered notebook Markdown -> arithmatex spans, outside ``<code>``."""
    parts = _CODE.split(text)
    for i in range(0, len(parts), 2):
        t = _DISPLAY.sub(lambda m: f'<span class="arithmatex">\\[{m.group(1)}\\]</span>', parts[i])
        parts[i] = _INLINE.sub(lambda m: f'<span class="arithmatex">\\({m.group(1)}\\)</span>', t)
    return "".join(parts)


def _notebook_math(html: str) -> str:
    """The site's MathJax typesets only ``.arithmatex`` elements (``javascripts/mathjax-config.js``,
    the mkdocs-material recipe for the Markdown pages); notebook Markdown cells keep TeX between
    dollars. Rewrite the math of every Markdown cell (never code cells or outputs) into the same
    arithmatex spans."""
    out, pos = [], 0
    while (start := html.find(_MD_CELL, pos)) != -1:
        body = html.index(">", start) + 1
        depth, j = 1, body
        while depth:
            nxt_open, nxt_close = html.find("<div", j), html.find("</div>", j)
            if nxt_open != -1 and nxt_open < nxt_close:
                depth, j = depth + 1, nxt_open + 4
            else:
                depth, j = depth - 1, nxt_close + 6
        end = j - 6
        out += [html[pos:body], _arithmatex(html[body:end])]
        pos = end
    out.append(html[pos:])
    return "".join(out)


def on_page_content(html, page, config, files):
    """Notebook pages: mkdocs-jupyter renders their Markdown without mkdocs' link resolution and
    without arithmatex. Relative links to other pages (``../conventions.md#x``,
    ``02_flash_attention.ipynb``, written relative to the notebook's place in the docs tree) are
    rewritten to the built pages' URLs, and the math is put into arithmatex spans."""
    if not page.file.src_uri.endswith(".ipynb"):
        return html
    base = posixpath.dirname(page.file.src_uri)

    def fix(m):
        target = files.get_file_from_path(posixpath.normpath(posixpath.join(base, m.group(1))))
        if target is None:
            log.warning("%s: link %r points to no documentation file", page.file.src_uri, m.group(1))
            return m.group(0)
        return f'href="{target.url_relative_to(page.file)}{m.group(2) or ""}"'

    return _notebook_math(_HREF.sub(fix, html))
