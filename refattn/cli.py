"""The ``refattn`` console script: ``list``, ``check`` and ``bench``.

``refattn list``   the registry as a table (slug, family, tier, forward/backward, last FD result,
                   kernels, docs page).
``refattn check``  runs the finite-difference checks, the explicit-formula references, the
                   identities and the kernel parity checks of the chosen records; prints a
                   pass/fail table with the max errors and exits 1 on any failure.
``refattn bench``  the kernel benchmark (see ``refattn bench --help``).
"""

from __future__ import annotations

import argparse
import json
import os
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
    out += [fmt.format(*[str(c) for c in r]) for r in rows]
    return "\n".join(out)


def _select(args) -> list[registry.Mechanism]:
    if args.slugs:
        recs = []
        for s in args.slugs:
            try:
                recs.append(registry.get(s))
            except KeyError as exc:
                raise SystemExit(f"refattn: {exc.args[0]}") from None
        return recs
    recs = registry.all(family=args.family) if args.family else registry.all()
    return recs


def cmd_list(args) -> int:
    status = _load_status()
    recs = _select(args)
    if args.implemented:
        recs = [r for r in recs if r.implemented]
    if args.json:
        print(json.dumps([
            {"slug": r.slug, "family": r.family, "tier": r.tier, "title": r.title,
             "implemented": r.implemented, "fd": status.get(r.slug, {}).get("gradcheck"),
             "kernels": sorted(r.kernels), "docs": r.docs} for r in recs], indent=1))
        return 0
    rows = []
    for r in recs:
        st = status.get(r.slug, {})
        fd = st.get("gradcheck")
        fd_s = "-" if not r.implemented else ("not run" if fd is None else
                                               ("pass" if fd["passed"] else "FAIL") +
                                               (f" {fd['error']:.1e}" if fd.get("error") is not None else ""))
        rows.append([r.slug, r.family, r.tier, "yes" if r.forward else "-", "yes" if r.backward else "-",
                     fd_s, ",".join(sorted(r.kernels)) or "-", r.docs or "-"])
    print(_table(rows, ["slug", "family", "tier", "forward", "backward", "FD (last check)", "kernels", "docs"]))
    n_impl = sum(r.implemented for r in recs)
    print(f"\n{len(recs)} records, {n_impl} implemented. FD column: result of the last `refattn check` on this machine.")
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
    for rec in recs:
        res = run_record_checks(rec, seed=args.seed, on_check=lambda c: bar.step(f"{c.slug}:{c.check}"))
        st = status.setdefault(rec.slug, {})
        for c in res.results:
            st[c.check] = {"passed": c.passed, "error": c.error}
            rows.append([rec.slug, c.check, "pass" if c.passed else "FAIL",
                         "-" if c.error is None else f"{c.error:.2e}", f"{c.seconds:.2f}"])
            if not c.passed:
                failures.append(c)
    _save_status(status)
    if args.json:
        print(json.dumps([dict(zip(["slug", "check", "result", "max_error", "seconds"], r)) for r in rows], indent=1))
    else:
        print(_table(rows, ["slug", "check", "result", "max err", "seconds"]))
    for c in failures:
        print(f"\nFAILED {c.slug} {c.check}:\n{c.message}", file=sys.stderr)
    print(f"\n{len(rows) - len(failures)} passed, {len(failures)} failed "
          f"({len(recs)} mechanisms, {time.perf_counter() - bar.t0:.1f}s)")
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
    pl = sub.add_parser("list", help="table of the registry")
    pl.add_argument("slugs", nargs="*", help="only these slugs")
    pl.add_argument("--family", help="a family, e.g. 2 or 2-differential")
    pl.add_argument("--implemented", action="store_true", help="only implemented records")
    pl.add_argument("--json", action="store_true")
    pc = sub.add_parser("check", help="run FD checks, references, identities and kernel parity")
    pc.add_argument("slugs", nargs="*", help="slugs to check")
    pc.add_argument("--family", help="all implemented records of a family, e.g. 1 or 1-softmax")
    pc.add_argument("--all", action="store_true", help="every implemented record")
    pc.add_argument("--seed", type=int, default=0)
    pc.add_argument("--json", action="store_true")
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
    if args.cmd == "list":
        return cmd_list(args)
    return cmd_check(args)


if __name__ == "__main__":
    sys.exit(main())
