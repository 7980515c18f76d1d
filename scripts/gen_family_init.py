"""Regenerate a family package's __init__: docstring module list + re-exports from the modules' __all__.

The docstring keeps its header (everything before a line 'Modules' followed by '-------'); the
module list below it (a numpy-style "Modules" section) is generated from each module's docstring
summary and registered slugs.
usage (from the repository root): python scripts/gen_family_init.py refattn/attention/softmax [refattn/blocks ...]"""
import ast
import importlib
import pkgutil
import sys
import textwrap
from pathlib import Path

FOOTER = ("Every public name of these modules is re-exported here. A function named like its own module\n"
          "(``sdpa`` in ``sdpa.py``) is exported too, so ``package.sdpa`` is the function; import the\n"
          "module's other names from the module itself (``from package.sdpa import sdpa_forward``).")

def summary(mod):
    para = " ".join((mod.__doc__ or "").strip().split("\n\n")[0].split())
    for end in (". ", ".\n"):
        if end in para:
            para = para.split(end)[0]
    return para.rstrip(".")

for pkgdir in sys.argv[1:]:
    pkgdir = Path(pkgdir)
    init = pkgdir / "__init__.py"
    src = init.read_text()
    doc = ast.get_docstring(ast.parse(src), clean=False) or ""
    header = doc.split("\nModules\n-------\n")[0].rstrip()
    pkgname = ".".join(pkgdir.parts)
    infos = list(pkgutil.iter_modules([str(pkgdir)]))
    mods = sorted(i.name for i in infos if not i.name.startswith("_") and not i.ispkg)
    subs = {i.name for i in infos}
    from refattn import registry
    recs = registry.all()
    bullets = []
    lines = []
    allnames, seen = [], {}
    for m in mods:
        mod = importlib.import_module(f"{pkgname}.{m}")
        slugs = [r.slug for r in recs if r.module == f"{pkgname}.{m}"]
        # A numpy-style "Modules" section (griffe renders it as a table): the name alone on a line,
        # its description indented by four spaces below it.
        text = summary(mod) + (f" ({', '.join(f'``{s}``' for s in slugs)})" if slugs else "") + "."
        bullets.append(m + "\n" + textwrap.fill(text, 100, initial_indent="    ", subsequent_indent="    ",
                                                 break_on_hyphens=False, break_long_words=False))
        # A name equal to a submodule's is exported only from that submodule (the function the
        # module is named after); from any other module it would hide that module.
        names = [n for n in getattr(mod, "__all__", []) if n not in subs or n == m]
        for n in names:
            if n in seen:
                raise SystemExit(f"{pkgname}: {n} exported by both {seen[n]} and {m}")
            seen[n] = m
        if not names:
            continue
        lines.append(f"from .{m} import (  # noqa: F401")
        lines += [f"    {n}," for n in sorted(names)]
        lines.append(")")
        allnames += sorted(names)
    # The footer goes above the section: numpy-style parsers would read a paragraph after the
    # last item as one more item.
    header = header.replace(FOOTER, "").rstrip()
    newdoc = header + "\n\n" + FOOTER + "\n\nModules\n-------\n" + "\n".join(bullets) + "\n"
    out = ['r"""' + newdoc.replace('"""', "'''") + '"""', "", "from __future__ import annotations", ""]
    out += lines
    # several names a line: the import blocks above already list each name once per line, and a
    # family of 40 modules must stay under the 800-line module budget (tests/test_layout.py)
    names_wrapped = textwrap.wrap(" ".join(f'"{n}",' for n in allnames), 116,
                                  break_long_words=False, break_on_hyphens=False)
    out += ["", "__all__ = ["] + [f"    {line}" for line in names_wrapped] + ["]"]
    init.write_text("\n".join(out) + "\n")
    print(pkgname, len(allnames), "names,", len(mods), "modules")
