"""Build-time fixes for the markup the docs site receives from docstrings and Markdown pages.

The modules' docstrings are written for readers of the source as much as for the site, and
several engineers edit them at once, so the site adapts to them instead of the other way round:

* **Sphinx roles** (``:func:`sdpa_forward```, ``:mod:`refattn.nn.conv```, ``:class:``,
  ``:meth:``, ...) become mkdocstrings/autorefs cross-references to the object's canonical
  page and anchor. A role whose target griffe cannot resolve (a NumPy or PyTorch name, a typo)
  becomes plain code, never a broken link.
* **Display maths** (``$$ ... $$``) gets a blank line before and after each block: arithmatex
  reads a ``$$`` block only as its own paragraph, so two blocks on adjacent lines (or a block
  right under a line of text) rendered as a literal ``$$`` inside the formula.

Used twice: as a griffe extension (``mkdocs.yml``: ``extensions: [scripts/docs_markup.py]``,
rewriting every docstring of the ``refattn`` package once it is loaded) and by
``scripts/mkdocs_hooks.py`` on the Markdown pages.
"""

from __future__ import annotations

import html
import re
from collections.abc import Callable

import griffe

ROLE = re.compile(r":(?:py:)?(func|mod|class|meth|attr|data|obj|exc|const):`([^`]+)`")
_FENCE = re.compile(r"^\s*(```|~~~)")


def _display_blocks(lines: list[str]):
    """Yield ``(first, last)`` line indices of each ``$$`` display block that starts a line
    (outside fenced code)."""
    in_fence, i = False, 0
    while i < len(lines):
        line = lines[i]
        if _FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence and line.lstrip().startswith("$$"):
            j = i
            rest = line.lstrip()[2:]
            while "$$" not in rest and j + 1 < len(lines):
                j += 1
                rest = lines[j]
            if "$$" in rest:
                yield i, j
            i = j
        i += 1


def separate_display_math(text: str) -> str:
    """Make every ``$$`` display block that starts a line render as maths.

    * A block at the margin becomes a paragraph of its own (a blank line before and after), and
      words after its closing ``$$`` move to the next paragraph (punctuation moves inside).
    * A block indented by 1-3 spaces sits in a list item (docstrings indent continuation lines by
      two): a blank line would end the list, so it becomes inline ``$\\displaystyle ...$`` in place.

    Lines inside fenced code are left alone."""
    lines = text.split("\n")
    blocks = list(_display_blocks(lines))
    for first, last in reversed(blocks):
        indent = len(lines[first]) - len(lines[first].lstrip())
        head, tail = lines[first][:indent], lines[first][indent + 2:]
        body = [tail, *lines[first + 1:last + 1]] if last > first else [tail]
        close = body[-1].index("$$")
        after = body[-1][close + 2:].strip()
        body[-1] = body[-1][:close].rstrip()
        punct = len(after) - len(after.lstrip(".,;:"))
        body[-1], after = body[-1] + after[:punct], after[punct:].strip()
        if 0 < indent < 4:
            inner = "\n".join(body).strip()
            new = [head + "$\\displaystyle " + inner.split("\n")[0]] + inner.split("\n")[1:]
            new[-1] += "$" + (" " + after if after else "")
        else:
            new = [head + "$$" + body[0]] + body[1:]
            new[-1] += "$$"
            if first > 0 and lines[first - 1].strip():
                new.insert(0, "")
            if after:
                new += ["", head + after]
            elif last + 1 < len(lines) and lines[last + 1].strip():
                new.append("")
        lines[first:last + 1] = new
    return "\n".join(lines)


def sphinx_roles_to_refs(text: str, resolve: Callable[[str], str | None]) -> str:
    """Rewrite ``:role:`target``` into an autorefs cross-reference.

    ``resolve(target)`` returns the object's canonical dotted path, or ``None``. Resolved targets
    become ``<autoref identifier=PATH optional><code>shown</code></autoref>``, the form
    mkdocstrings itself writes for signatures: autorefs turns it into a link to the object's
    anchor, or into plain code if no page documents that object (a private helper). ``~a.b.c``
    shows ``c``, as in Sphinx."""

    def sub(m: re.Match) -> str:
        target = m.group(2).strip()
        if "<" in target and target.endswith(">"):  # :func:`title <target>`
            shown, target = target[:-1].split("<", 1)
            shown, target = shown.strip(), target.strip()
        else:
            shown = target.lstrip("~.")
            if target.startswith("~"):
                shown = shown.rsplit(".", 1)[-1]
        name = target.lstrip("~.").removesuffix("()")
        code = f"<code>{html.escape(shown)}</code>"
        path = resolve(name) if name else None
        if path is None:
            return code
        return f'<autoref identifier="{html.escape(path)}" optional>{code}</autoref>'

    return ROLE.sub(sub, text)


def _resolver(obj: griffe.Object, collection) -> Callable[[str], str | None]:
    def canonical(path: str) -> str | None:
        try:
            found = collection.get_member(path)
        except (KeyError, ValueError, AttributeError):
            return None
        if found is None:
            return None
        if found.is_alias:
            try:
                return found.final_target.path
            except (griffe.AliasResolutionError, griffe.CyclicAliasError):
                return None
        return found.path

    def resolve(name: str) -> str | None:
        head, _, tail = name.partition(".")
        if head in collection.members:  # absolute: refattn.nn.conv
            return canonical(name)
        scope: griffe.Object | None = obj
        while scope is not None:
            try:
                path = scope.resolve(head)
            except (griffe.NameResolutionError, KeyError, AttributeError):
                scope = scope.parent
                continue
            return canonical(f"{path}.{tail}" if tail else path)
        return None

    return resolve


def fix_docstring(obj: griffe.Object, collection) -> None:
    """Rewrite ``obj``'s docstring in place (roles, display maths)."""
    doc = obj.docstring
    if doc is None:
        return
    value = separate_display_math(doc.value)
    if ROLE.search(value):
        value = sphinx_roles_to_refs(value, _resolver(obj, collection))
    doc.value = value


class DocsMarkup(griffe.Extension):
    """griffe extension: once a package is loaded, fix every docstring in it."""

    def on_package(self, *, pkg: griffe.Module, loader: griffe.GriffeLoader, **kwargs) -> None:
        stack: list[griffe.Object] = [pkg]
        while stack:
            obj = stack.pop()
            fix_docstring(obj, loader.modules_collection)
            stack.extend(m for m in obj.members.values() if not m.is_alias)
