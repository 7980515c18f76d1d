"""The catalogue in code: one :class:`Mechanism` record per slug.

Every slug of the catalogue (``refattn/data/catalog_index.csv``, a copy of the project's
``catalog/index.csv``) has a record. A record whose mechanism is implemented carries its
``forward``/``backward``/``sample``; a record that is not yet implemented says so
(``implemented`` is False) and is listed but never tested or called done. Primitives that are not
catalogue entries (softmax, linear, activations …) have records too, with ``tier="primitive"``.

Implementations register themselves: each module under ``refattn.nn``, ``refattn.attention``,
``refattn.operators`` and ``refattn.blocks`` calls :func:`register` at import time with the
records it implements, so adding a mechanism is one new module whose record sits below the
module's registry separator (see ``docs/architecture.md``). Tests, ``refattn list``/``check`` and the
docs catalogue page are generated from :func:`all`.

The record contract (see DESIGN.md):

``sample(rng, size)`` with ``size`` in ``{"tiny", "small"}`` returns a :class:`Sample`:
``inputs`` (differentiable arrays, keyword arguments of the forward), ``params`` (differentiable
parameter dict passed as ``params=``; may be empty) and ``config`` (everything else: masks,
positions, flags). Then::

    out, cache = rec.forward(**s.inputs, params=s.params, **s.config)   # params omitted if None
    grads = rec.backward(dout, cache)   # one key per name in s.inputs and in s.params
"""

from __future__ import annotations

import csv
import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Mechanism", "Sample", "register", "add_kernel", "get", "all", "catalog_rows", "call_forward"]

FAMILIES = {
    "1-softmax": "Softmax attention and exact memory-efficient forms",
    "2-differential": "Differential attention",
    "3-operator": "Operator attention and neural-operator layers",
    "4-linear-kernel-sparse": "Linear, kernel, sparse and low-rank attention",
    "5-building-blocks": "Transformer building blocks",
}
TIERS = ("T1", "T2", "T3", "primitive")


@dataclass
class Sample:
    """Valid arguments for a mechanism: differentiable ``inputs`` and ``params``, and ``config``."""

    inputs: dict[str, np.ndarray]
    params: dict[str, np.ndarray] | None = None
    config: dict[str, Any] = field(default_factory=dict)

    def arrays(self) -> dict[str, np.ndarray]:
        """All differentiable arrays, inputs first then params (names are unique)."""
        out = dict(self.inputs)
        for k, v in (self.params or {}).items():
            if k in out:
                raise ValueError(f"parameter name {k!r} clashes with an input name")
            out[k] = v
        return out


@dataclass
class Mechanism:
    """One catalogue entry (or primitive) and everything needed to run and verify it."""

    slug: str
    family: str
    tier: str
    title: str
    paper: str = ""
    seeds: tuple[str, ...] = ()
    official_code: str = ""
    forward: Callable | None = None
    backward: Callable | None = None
    sample: Callable[[np.random.Generator, str], Sample] | None = None
    reference: Callable | None = None
    """Optional explicit formula ``reference(**inputs, params=..., **config) -> out`` that the
    forward must equal (e.g. the O(N^2) form of a linear-cost mechanism)."""
    checks: dict[str, Callable[[np.random.Generator], Any]] = field(default_factory=dict)
    """Named identity/property checks; each raises ``AssertionError`` on failure and may return
    the max error it measured (a float) for the report."""
    kernels: dict[str, Callable] = field(default_factory=dict)
    docs: str = ""
    fd_rtol: float = 1e-6
    batched: bool = True
    """True when axis 0 of every input (and of the output) is an independent batch axis; the
    property tests then check that batch elements do not influence each other."""
    module: str = ""
    notes: str = ""
    """For an unimplemented catalogue entry: what its sources leave undefined. For a forward-only
    record: why it has no backward (``"no backward: inference utility ..."``)."""
    differentiable: bool = True
    """False for a forward-only record (an inference utility such as a training-free scoring
    rule): it has no backward, and the generated gradient tests skip it. Never a fake backward."""

    @property
    def implemented(self) -> bool:
        if self.forward is None or self.sample is None:
            return False
        return self.backward is not None or not self.differentiable


_RECORDS: dict[str, Mechanism] = {}
_CATALOG: dict[str, dict] = {}
_LOADED = False
_IMPL_PACKAGES = ("refattn.nn", "refattn.attention", "refattn.operators", "refattn.blocks")
# Kernel packages attach kernels to records registered above; a missing optional dependency
# (numba-cuda, a GPU) must not break the registry, so they are imported leniently.
_KERNEL_PACKAGES = ("refattn.kernels.cpu", "refattn.kernels.cuda")


def catalog_rows() -> dict[str, dict]:
    """The catalogue index (slug -> row of index.csv), in catalogue order."""
    if not _CATALOG:
        path = Path(__file__).parent / "data" / "catalog_index.csv"
        with path.open(newline="", encoding="utf-8") as fh:
            for row in csv.DictReader(fh):
                _CATALOG[row["slug"]] = row
    return _CATALOG


def register(*records: Mechanism) -> None:
    """Add implemented records. A catalogue slug keeps the catalogue's family and tier."""
    cat = catalog_rows()
    for rec in records:
        if rec.slug in _RECORDS and _RECORDS[rec.slug].implemented:
            raise ValueError(f"mechanism {rec.slug!r} is registered twice")
        row = cat.get(rec.slug)
        if row is not None:
            if rec.family != row["family"] or rec.tier != row["tier"]:
                raise ValueError(
                    f"record {rec.slug!r}: family/tier {rec.family}/{rec.tier} differ from the "
                    f"catalogue's {row['family']}/{row['tier']}"
                )
            rec.seeds = rec.seeds or tuple(s for s in row["seed_ids"].split(";") if s)
            rec.official_code = rec.official_code or row["official_code"]
        if rec.family not in FAMILIES:
            raise ValueError(f"record {rec.slug!r}: unknown family {rec.family!r}")
        if rec.tier not in TIERS:
            raise ValueError(f"record {rec.slug!r}: unknown tier {rec.tier!r}")
        if not rec.module and rec.forward is not None:
            rec.module = rec.forward.__module__
        _RECORDS[rec.slug] = rec


def add_kernel(slug: str, backend: str, fn: Callable, check: Callable | None = None) -> None:
    """Attach a kernel (``backend`` e.g. ``"numba_cpu"``) to an implemented record, with an
    optional parity check ``check(rng)`` that ``refattn check`` runs as ``kernel:<backend>``."""
    rec = _RECORDS.get(slug)
    if rec is None or not rec.implemented:
        raise ValueError(f"cannot attach kernel {backend!r}: {slug!r} is not an implemented record")
    rec.kernels[backend] = fn
    if check is not None:
        rec.checks[f"kernel:{backend}"] = check


def _load() -> None:
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    for pkg_name in _IMPL_PACKAGES:
        pkg = importlib.import_module(pkg_name)
        for info in pkgutil.walk_packages(pkg.__path__, prefix=pkg_name + "."):
            importlib.import_module(info.name)
    for pkg_name in _KERNEL_PACKAGES:
        try:
            pkg = importlib.import_module(pkg_name)
        except ImportError:
            continue
        for info in pkgutil.walk_packages(pkg.__path__, prefix=pkg_name + "."):
            try:
                importlib.import_module(info.name)
            except ImportError:
                continue
    # Catalogue entries without an implementation are listed as such.
    for slug, row in catalog_rows().items():
        if slug not in _RECORDS:
            _RECORDS[slug] = Mechanism(
                slug=slug,
                family=row["family"],
                tier=row["tier"],
                title=row["name"],
                seeds=tuple(s for s in row["seed_ids"].split(";") if s),
                official_code=row["official_code"],
            )


def get(slug: str) -> Mechanism:
    """The record for ``slug``; ``KeyError`` listing close matches if it does not exist."""
    _load()
    try:
        return _RECORDS[slug]
    except KeyError:
        import difflib

        close = difflib.get_close_matches(slug, list(_RECORDS), n=3)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise KeyError(f"no mechanism {slug!r}{hint}") from None


def all(*, implemented: bool | None = None, family: str | None = None) -> list[Mechanism]:  # noqa: A001
    """All records: catalogue order first, then primitives. Filters are optional."""
    _load()
    order = list(catalog_rows())
    recs = sorted(
        _RECORDS.values(),
        key=lambda r: (order.index(r.slug) if r.slug in order else len(order), r.family, r.slug),
    )
    if implemented is not None:
        recs = [r for r in recs if r.implemented == implemented]
    if family is not None:
        recs = [r for r in recs if r.family == family or r.family.split("-", 1)[0] == str(family)]
    return recs


def call_forward(rec: Mechanism, inputs: dict, params: dict | None, config: dict):
    """Call ``rec.forward`` with the sample convention (``params=`` only when not None)."""
    kwargs = dict(inputs)
    kwargs.update(config)
    if params is not None:
        kwargs["params"] = params
    return rec.forward(**kwargs)
