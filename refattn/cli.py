"""The ``refattn`` console script: ``list``, ``show``, ``check`` and ``bench``.

``refattn list [TERM ...]``  the implemented records as a table that fits the terminal (slug,
                   family, tier, last FD result, kernels, title); ``--all`` adds the catalogue
                   entries not implemented yet; terms search slugs, aliases, titles and papers.
``refattn show SLUG``  one record: summary, conventions (the forward's keywords and defaults and
                   the module's conventions section), upstream paper and code, checks.
``refattn check``  runs the finite-difference checks, the explicit-formula references, the
                   identities and the kernel parity checks of the chosen records; prints a
                   pass/fail table with the max errors (``--json``: JSON only on stdout, the
                   summary on stderr) and exits 1 on any failure.
``refattn bench``  the kernel benchmark (see ``refattn bench --help``).

Records are named by slug, alias or search term (``mha``, ``fno``, ``flash_attention``,
``transolver``; see :func:`refattn.registry.resolve`), families by ``2``, ``2-differential`` or
``differential``. A name or family that matches nothing exits with status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import os
import re
import shutil
import signal
import sys
import time
from pathlib import Path

from . import registry

_STATUS_FILE = Path(os.environ.get("REFATTN_CACHE_DIR", Path.home() / ".cache" / "refattn")) / "check-status.json"


def _load_status() -> dict:
    try:
        return json.loads(_STATUS_FILE.read_text())
    except (OSError, ValueError):
        return {}


def _save_status(status: dict) -> None:
    try:
        _STATUS_FILE.parent.mkdir(parents=True, exist_ok=True)
        _STATUS_FILE.write_text(json.dumps(status, indent=1, sort_keys=True))
    except OSError:  # a read-only home must not fail the check itself
        pass


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    out = [fmt.format(*header), fmt.format(*["-" * w for w in widths])]
    out += [fmt.format(*[str(c) for c in r]).rstrip() for r in rows]
    return "\n".join(out)


class _UsageError(Exception):
    """A slug or family on the command line that names nothing: one line on stderr, exit status 2."""


def _family(name: str | None) -> str | None:
    if name is None:
        return None
    try:
        return registry.resolve_family(name)
    except ValueError as exc:
        raise _UsageError(str(exc)) from None


def _resolve(query: str) -> registry.Mechanism:
    """The record a slug, alias or search term names; the resolution is echoed on stderr."""
    try:
        rec = registry.resolve(query)
    except KeyError as exc:
        raise _UsageError(str(exc)) from None
    if rec.slug != query:
        print(f"refattn: {query!r} -> {rec.slug}", file=sys.stderr)
    return rec


def _select(args) -> list[registry.Mechanism]:
    """The records named on the command line (resolved), else those of ``--family``, else all."""
    fam = _family(args.family)
    if args.slugs:
        recs = []
        for query in args.slugs:
            rec = _resolve(query)
            if rec not in recs:
                recs.append(rec)
        return [r for r in recs if fam is None or r.family == fam]
    return registry.all(family=fam)


def _fd_cell(rec, status) -> str:
    if not rec.implemented:
        return "-"
    fd = status.get(rec.slug, {}).get("gradcheck")
    if fd is None:
        return "not run"
    return ("pass" if fd["passed"] else "FAIL") + (f" {fd['error']:.1e}" if fd.get("error") is not None else "")


def _terminal_width() -> int:
    return max(40, shutil.get_terminal_size((100, 24)).columns)


def _fit(header: list[str], rows: list[list[str]], width: int, steps) -> str:
    """The table with its last column (the title) cut to fit ``width`` (with an ellipsis, down to
    20 characters); while even that is too wide, apply the next of ``steps`` (each maps
    ``(header, rows)`` to a narrower table, e.g. drops a column). The first column (the slug)
    stays whole, so below its width only the slugs are listed."""
    steps = list(steps)
    while True:
        natural = [max(len(str(r[c])) for r in [header, *rows]) for c in range(len(header))]
        rest = sum(natural[:-1]) + 2 * (len(header) - 1)
        room = width - rest
        if room >= min(20, natural[-1]) or not steps:
            break
        header, rows = steps.pop(0)(header, rows)
    if room < 8:  # not even a stub of the title fits: slugs only
        header, rows, natural, room = header[:-1] + [""], [r[:-1] + [""] for r in rows], natural[:-1] + [0], 0
    last = min(room, natural[-1])

    def line(r):
        cells = [str(c).ljust(natural[i]) for i, c in enumerate(r[:-1])]
        title = str(r[-1])
        return "  ".join([*cells, title if len(title) <= last else title[:last - 1] + "…"]).rstrip()

    rule = "  ".join("-" * w for w in [*natural[:-1], last]).rstrip()
    return "\n".join([line(header), rule, *(line(r) for r in rows)])


def _drop(name: str):
    def step(header, rows):
        i = header.index(name)
        return header[:i] + header[i + 1:], [r[:i] + r[i + 1:] for r in rows]
    return step


def _family_numbers(header, rows):
    i = header.index("family")
    return header, [r[:i] + [r[i].split("-", 1)[0]] + r[i + 1:] for r in rows]


def cmd_list(args) -> int:
    status = _load_status()
    fam = _family(args.family)
    if args.slugs:  # search terms: every match, best first
        recs = []
        for term in args.slugs:
            hits = registry.search(term)
            if not hits:
                raise _UsageError(f"nothing matches {term!r} (`refattn list --all` shows every slug)")
            recs += [r for r in hits if r not in recs]
        recs = [r for r in recs if fam is None or r.family == fam]
    else:
        recs = registry.all(family=fam)
    shown = recs if args.all else [r for r in recs if r.implemented]
    hidden = len(recs) - len(shown)
    if args.json:
        print(json.dumps([
            {"slug": r.slug, "family": r.family, "tier": r.tier, "title": r.title,
             "implemented": r.implemented, "fd": status.get(r.slug, {}).get("gradcheck"),
             "kernels": sorted(r.kernels), "docs": r.docs} for r in shown], indent=1))
        return 0
    header = ["slug", "family", "tier", *(["impl"] if args.all else []), "last FD", "kernels", "title"]
    rows = [[r.slug, r.family, r.tier, *(["yes" if r.implemented else "-"] if args.all else []), _fd_cell(r, status),
             ",".join(sorted(k.replace("numba_", "") for k in r.kernels)) or "-", r.title] for r in shown]
    # a narrow terminal cuts the title, then shows family numbers, then drops kernels, tier, FD
    steps = [_family_numbers, _drop("kernels"), _drop("tier"), _drop("last FD"), _drop("family")]
    print(_fit(header, rows, _terminal_width(), steps) if rows else "(no records)")
    more = f"; {hidden} more not implemented yet (--all)" if hidden else ""
    print(f"\n{len(shown)} records, {sum(r.implemented for r in shown)} implemented{more}. "
          f"FD: the last `refattn check` here. `refattn show SLUG` for one record.")
    return 0


def _clean_doc(text: str | None) -> str:
    """A docstring as plain text: Sphinx roles and double backticks reduced to the names."""
    text = inspect.cleandoc(text or "")
    text = re.sub(r":(?:func|mod|class|meth|data|attr):`~?([^`]+)`", r"\1", text)
    return text.replace("``", "`")


def _section(doc: str, word: str) -> str:
    """Title and body of the first ``Title / -----`` section of ``doc`` whose title has ``word``."""
    parts = re.split(r"^(\S.*)\n-{3,}[ \t]*$", doc, flags=re.M)
    for i in range(1, len(parts) - 1, 2):
        if word.lower() in parts[i].lower():
            body = parts[i + 1].strip("\n")
            # stop at the first paragraph that is not part of the section (Paper:, References …)
            body = re.split(r"\n\n(?=Paper:|Reference|References)", body)[0]
            return f"{parts[i].strip()}\n{body}".rstrip()
    return ""


def _indent(text: str, pad: str = "  ") -> str:
    return "\n".join(pad + line if line.strip() else "" for line in text.splitlines())


def cmd_show(args) -> int:
    """One record: what it is, its conventions and where upstream it comes from."""
    import importlib

    rec = _resolve(args.slug)
    status = _load_status().get(rec.slug, {})
    out = [f"{rec.slug}: {rec.title}", "",
           f"  family       {rec.family} ({registry.FAMILIES.get(rec.family, '')})",
           f"  tier         {rec.tier}",
           f"  implemented  {'yes' if rec.implemented else 'not yet (a catalogue entry)'}"]
    row = registry.catalog_rows().get(rec.slug)
    if row and row["name"] != rec.title:
        out.append(f"  catalogue    {row['name']}")
    mod_doc = fwd_doc = ""
    if rec.implemented:
        mod_doc = _clean_doc(importlib.import_module(rec.module).__doc__)
        fwd_doc = _clean_doc(rec.forward.__doc__)
        try:
            source = Path(inspect.getsourcefile(rec.forward)).resolve().relative_to(Path(__file__).resolve().parents[1])
        except (TypeError, ValueError):
            source = rec.module
        checks = ["gradcheck", "directional", *(["reference"] if rec.reference else []), *rec.checks]
        out += [f"  forward      {rec.forward.__module__}.{rec.forward.__qualname__}",
                f"  backward     {rec.backward.__module__}.{rec.backward.__qualname__}",
                f"  source       {source}",
                f"  docs         {'docs/' + rec.docs if rec.docs else '-'}",
                f"  kernels      {', '.join(sorted(rec.kernels)) or '-'}",
                f"  checks       {', '.join(checks)}"]
        if rec.cases:
            out.append(f"  compare      cases {', '.join(rec.cases)} (refattn.testing.compare_implementation)")
        if status:
            last = ", ".join(f"{k} {'pass' if v['passed'] else 'FAIL'}" for k, v in sorted(status.items()))
            out.append(f"  last check   {last}")
    out += ["", "Upstream", f"  paper        {rec.paper or '-'}", f"  code         {rec.official_code or '-'}"]
    cited = sorted(set(re.findall(r"[\w./-]+\.(?:py|cu|h|cpp)\b", f"{mod_doc}\n{fwd_doc}")))
    if cited:
        out.append(f"  files cited  {', '.join(cited)}")
    if rec.seeds:
        out.append(f"  catalogue    seed abstracts {', '.join(rec.seeds)}")
    if rec.implemented:
        summary = fwd_doc.split("\n\n")[0] or mod_doc.split("\n\n")[0]
        out += ["", "Summary", _indent(summary)]
        kw = [f"{p.name}={p.default!r}" for p in inspect.signature(rec.forward).parameters.values()
              if p.default is not inspect.Parameter.empty and p.name != "params"]
        out += ["", "Conventions", _indent("keywords of the forward, with their (upstream) defaults:"),
                _indent(", ".join(kw) or "none", "    ")]
        conv = _section(mod_doc, "convention")
        out += ["", _indent(conv)] if conv else \
            [_indent(f"where upstream implementations disagree: docs/{rec.docs.split('#')[0]}")]
    print("\n".join(out))
    return 0


class _Progress:
    """A dependency-free progress bar on stderr (plain lines when stderr is not a terminal)."""

    def __init__(self, total: int):
        self.total, self.done, self.t0 = total, 0, time.perf_counter()
        self.tty = sys.stderr.isatty()

    def step(self, label: str) -> None:
        self.done += 1
        frac = self.done / max(self.total, 1)
        bar = "#" * int(30 * frac) + "." * (30 - int(30 * frac))
        el = time.perf_counter() - self.t0
        line = f"[{bar}] {self.done}/{self.total} {el:6.1f}s {label}"
        if self.tty:
            sys.stderr.write("\r" + line[:120].ljust(120))
            if self.done == self.total:
                sys.stderr.write("\n")
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()


def cmd_check(args) -> int:
    from .testing.runner import record_check_names, run_record_checks

    if not (args.slugs or args.family or args.all):
        print("refattn check: name SLUG(s), --family F or --all", file=sys.stderr)
        return 2
    recs = _select(args)
    missing = [r.slug for r in recs if not r.implemented]
    if args.slugs and missing:
        print(f"refattn check: not implemented yet: {', '.join(missing)}", file=sys.stderr)
        return 2
    recs = [r for r in recs if r.implemented]
    if not recs:
        print("refattn check: nothing to check", file=sys.stderr)
        return 2
    total = sum(len(record_check_names(r)) for r in recs)
    bar = _Progress(total)
    status = _load_status()
    rows, failures = [], []
    # with --json, stdout carries the JSON document only: anything a check prints goes to stderr
    quiet = contextlib.redirect_stdout(sys.stderr) if args.json else contextlib.nullcontext()
    for rec in recs:
        with quiet:
            res = run_record_checks(rec, seed=args.seed, on_check=lambda c: bar.step(f"{c.slug}:{c.check}"))
        st = status.setdefault(rec.slug, {})
        for c in res.results:
            st[c.check] = {"passed": c.passed, "error": c.error}
            rows.append({"slug": rec.slug, "check": c.check, "result": "pass" if c.passed else "FAIL",
                         "max_error": None if c.error is None else float(c.error), "seconds": round(c.seconds, 3)})
            if not c.passed:
                failures.append(c)
    _save_status(status)
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(_table([[r["slug"], r["check"], r["result"], "-" if r["max_error"] is None else f"{r['max_error']:.2e}",
                       f"{r['seconds']:.2f}"] for r in rows], ["slug", "check", "result", "max err", "seconds"]))
    for c in failures:
        print(f"\nFAILED {c.slug} {c.check}:\n{c.message}", file=sys.stderr)
    print(f"\n{len(rows) - len(failures)} passed, {len(failures)} failed "
          f"({len(recs)} mechanisms, {time.perf_counter() - bar.t0:.1f}s)", file=sys.stderr if args.json else sys.stdout)
    return 1 if failures else 0


def cmd_bench(rest: list[str]) -> int:
    """Run the benchmark suite of the source checkout (``benchmarks/bench.py``).

    The suite lives outside the package because it drives PyTorch as the comparison baseline and
    refattn itself stays framework-free; it is available where refattn is installed from a
    checkout (``pip install -e .``)."""
    import importlib.util

    runner = Path(__file__).resolve().parents[1] / "benchmarks" / "bench.py"
    if not runner.exists():
        print("refattn bench runs the benchmark suite in the repository's benchmarks/ folder; "
              "install refattn from a source checkout (pip install -e .) to use it", file=sys.stderr)
        return 2
    spec = importlib.util.spec_from_file_location("refattn_benchmarks", runner)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.main(rest)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="refattn", description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    pl = sub.add_parser("list", help="the implemented records as a table (--all: the whole catalogue)")
    pl.add_argument("slugs", nargs="*", metavar="TERM",
                    help="only records matching these slugs, aliases or words of the title/paper")
    pl.add_argument("--family", help="a family: 2, 2-differential or differential")
    pl.add_argument("--all", action="store_true", help="also the catalogue entries not implemented yet")
    pl.add_argument("--implemented", action="store_true", help=argparse.SUPPRESS)  # the default now
    pl.add_argument("--json", action="store_true")
    ps = sub.add_parser("show", help="one record: summary, conventions, upstream paper and code")
    ps.add_argument("slug", metavar="SLUG", help="a slug, alias (mha, fno) or search term")
    pc = sub.add_parser("check", help="run FD checks, references, identities and kernel parity")
    pc.add_argument("slugs", nargs="*", metavar="SLUG", help="slugs (or aliases, search terms) to check")
    pc.add_argument("--family", help="all implemented records of a family: 1, 1-softmax or softmax")
    pc.add_argument("--all", action="store_true", help="every implemented record")
    pc.add_argument("--seed", type=int, default=0)
    pc.add_argument("--json", action="store_true", help="JSON on stdout only (progress and summary on stderr)")
    sub.add_parser("bench", help="kernel benchmarks: single-thread and all-core speed vs torch and NumPy, "
                   "sgemm and BLAS kernel of the same run (arguments after `bench` go to the runner)",
                   add_help=False)
    return p


def main(argv: list[str] | None = None) -> int:
    if hasattr(signal, "SIGPIPE"):  # `refattn list | head` should not print a traceback
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "bench":
        return cmd_bench(argv[1:])
    args = build_parser().parse_args(argv)
    try:
        return {"list": cmd_list, "show": cmd_show, "check": cmd_check}[args.cmd](args)
    except _UsageError as exc:
        print(f"refattn {args.cmd}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
