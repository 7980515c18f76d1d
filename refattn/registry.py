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

Finding records: :func:`get` takes an exact slug; :func:`search` and :func:`resolve` also take an
alias (``mha``, ``fno``, ``flash_attention`` …, see :data:`ALIASES`), a run of slug words, a
substring, or words of the title, paper or upstream code, which is what ``refattn check`` /
``list`` / ``show`` accept. :func:`resolve_family` accepts ``2``, ``2-differential`` or
``differential``.

The record contract (see DESIGN.md):

``sample(rng, size)`` with ``size`` in ``{"tiny", "small"}`` returns a :class:`Sample`:
``inputs`` (differentiable arrays, keyword arguments of the forward), ``params`` (differentiable
parameter dict passed as ``params=``; may be empty) and ``config`` (everything else: masks,
positions, flags). Then::

    out, cache = rec.forward(**s.inputs, params=s.params, **s.config)   # params omitted if None
    grads = rec.backward(dout, cache)   # one key per name in s.inputs and in s.params

Compare cases (optional, ``Mechanism.cases``): named input cases that
:func:`refattn.testing.compare_implementation` runs an outside implementation on, each at several
seeds. A case is a builder ``case(rng, config) -> Sample``:

* ``config`` is the configuration the caller compares under (the dict passed as ``config=``), or
  ``None`` for "the record's own sampler configuration";
* the returned ``Sample.config`` is exactly the keywords both implementations are called with. A
  builder starts from ``config`` when one is given and only *adds* the data its case needs (the
  boolean ``attn_mask`` of a masked-row case, an ``index_map`` sized for its shapes); it never
  overrides a key the caller set. Where the case cannot exist under ``config`` (grouped kv
  heads when ``config`` pins ``num_kv_heads == num_heads``) it raises :class:`CaseNotApplicable`
  with the reason, and the compare report lists the case as skipped with that reason.

A record without cases gets a default battery from its sampler (``"tiny"`` and ``"small"``, the
caller's ``config`` replacing the sampler's). Case builders can be registered from outside the
mechanism's module with :func:`add_cases` (the softmax family's battery lives in
:mod:`refattn.testing.cases`: the record's sampler plus q/k/v shape edits: ``N != M``, grouped
kv heads, odd sizes, a fully masked row).
"""

from __future__ import annotations

import builtins
import csv
import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Mechanism", "Sample", "CaseNotApplicable", "UnknownMechanism", "register", "add_kernel", "add_cases",
           "get", "all", "search", "resolve", "resolve_family", "catalog_rows", "call_forward", "ALIASES"]

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
    cases: dict[str, Callable[[np.random.Generator, dict | None], Sample]] = field(default_factory=dict)
    """Named compare cases ``case(rng, config) -> Sample`` (see the module docstring); empty: the
    default battery built from ``sample``."""

    @property
    def implemented(self) -> bool:
        if self.forward is None or self.sample is None:
            return False
        return self.backward is not None or not self.differentiable


class CaseNotApplicable(Exception):
    """Raised by a compare case builder when its case cannot exist under the caller's config; the
    message is the reason shown in the report."""


class UnknownMechanism(KeyError):
    """No record has this slug. A ``KeyError`` (for ``except KeyError``) whose message prints
    without quotes, with suggestions."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


_RECORDS: dict[str, Mechanism] = {}
_CATALOG: dict[str, dict] = {}
_LOADED = False
_IMPL_PACKAGES = ("refattn.nn", "refattn.attention", "refattn.operators", "refattn.blocks")
# Kernel packages attach kernels to records registered above; a missing optional dependency
# (numba-cuda, a GPU) must not break the registry, so they are imported leniently.
_KERNEL_PACKAGES = ("refattn.kernels.cpu", "refattn.kernels.cuda")
# Modules that attach compare cases (Mechanism.cases) to records registered elsewhere.
_CASE_MODULES = ("refattn.testing.cases",)


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


def add_cases(slug: str, cases: dict[str, Callable]) -> None:
    """Attach compare cases ``{name: case(rng, config) -> Sample}`` to an implemented record (see
    the module docstring). A name the record already has is an error, not an override."""
    rec = _RECORDS.get(slug)
    if rec is None or not rec.implemented:
        raise ValueError(f"cannot attach compare cases: {slug!r} is not an implemented record")
    clash = sorted(set(cases) & set(rec.cases))
    if clash:
        raise ValueError(f"record {slug!r} already has compare cases {clash}")
    rec.cases.update(cases)


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
    for mod_name in _CASE_MODULES:
        importlib.import_module(mod_name)
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
    """The record for the exact ``slug``; :class:`UnknownMechanism` (a ``KeyError``) naming the
    closest records otherwise (:func:`resolve` also accepts aliases and search terms)."""
    _load()
    try:
        return _RECORDS[slug]
    except KeyError:
        close = [r.slug for r in search(str(slug))[:3]]
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise UnknownMechanism(f"no mechanism {slug!r}{hint} (`refattn list --all` shows every slug)") from None


def resolve_family(name: str) -> str:
    """The family key for ``name``: the key itself (``2-differential``), its number (``2``), its
    name (``differential``) or an unambiguous word prefix of the key or its description
    (``linear``, ``operator``, ``blocks``). ``ValueError`` listing the families otherwise."""
    q = str(name).strip().lower().replace("_", "-").replace(" ", "-")
    if q in FAMILIES:
        return q
    for key in FAMILIES:
        num, _, label = key.partition("-")
        if q in (num, label):
            return key
    words = {key: set(key.split("-")[1:]) | {w.strip("(),").lower() for w in FAMILIES[key].replace("-", " ").split()}
             for key in FAMILIES}
    stems = {q, q.rstrip("s")}
    hits = [key for key, ws in words.items() if any(w.startswith(s) for w in ws for s in stems if len(s) >= 3)]
    if len(hits) == 1:
        return hits[0]
    choices = ", ".join(f"{k} ({k.partition('-')[2]})" for k in FAMILIES)
    what = f"is ambiguous ({', '.join(hits)})" if hits else "is unknown"
    raise ValueError(f"family {name!r} {what}; choose one of {choices}")


def all(*, implemented: bool | None = None, family: str | None = None) -> list[Mechanism]:  # noqa: A001
    """All records: catalogue order first, then primitives. Filters are optional; ``family``
    goes through :func:`resolve_family` (an unknown family raises ``ValueError``)."""
    _load()
    order = {slug: i for i, slug in enumerate(catalog_rows())}
    recs = sorted(_RECORDS.values(), key=lambda r: (order.get(r.slug, len(order)), r.family, r.slug))
    if implemented is not None:
        recs = [r for r in recs if r.implemented == implemented]
    if family is not None:
        fam = resolve_family(family)
        recs = [r for r in recs if r.family == fam]
    return recs


# Names people use for a mechanism that are not (a run of words of) its slug.
ALIASES: dict[str, str] = {
    "mha": "multi_head_attention",
    "gqa": "gqa_mqa",
    "mqa": "gqa_mqa",
    "flash": "online_softmax_flash_attention",
    "flashattention": "online_softmax_flash_attention",
    "flash_attention": "online_softmax_flash_attention",
    "fno": "fno_spectral_conv",
    "afno": "afno_dpot_fourier_mixer",
    "transolver": "transolver_physics_attention",
    "diff_transformer": "diff_attention_v1",
    "difftransformer": "diff_attention_v1",
    "galerkin": "galerkin_attention",
    "performer": "performer_favor_plus",
    "t5": "relative_position_encodings",
}


def _norm(text: str) -> str:
    return "_".join(w for w in "".join(c if c.isalnum() else " " for c in text.lower()).split())


def _match_tier(q: str, rec: Mechanism) -> int | None:
    """How well ``q`` (normalised) names ``rec``: 0 slug, 1 alias, 2 a run of slug words or their
    initials, 3 a substring of the slug, 4 every word starts a word of title/paper/upstream code."""
    if q == rec.slug:
        return 0
    if ALIASES.get(q) == rec.slug:
        return 1
    toks, qt = rec.slug.split("_"), q.split("_")
    if any(toks[i:i + len(qt)] == qt for i in range(len(toks) - len(qt) + 1)) or \
            (len(q) >= 2 and "_" not in q and "".join(t[0] for t in toks) == q):
        return 2
    if q.replace("_", "") in rec.slug.replace("_", ""):
        return 3
    words = _norm(f"{rec.title} {rec.paper} {rec.official_code}").split("_")
    if len(q) >= 3 and builtins.all(any(w.startswith(t) for w in words) for t in qt if t):
        return 4
    return None


_TIER_ORDER = {t: i for i, t in enumerate(TIERS)}


def search(query: str) -> list[Mechanism]:
    """Records matching ``query``, best first: exact slug, alias (:data:`ALIASES`), a run of slug
    words or their initials (``flash_attention``, ``mha``), a substring of the slug, words of the
    title/paper/upstream code; failing all of those, close spellings of a slug. Within a kind of
    match, slugs that start with the query, implemented records and lower tiers come first."""
    _load()
    q = _norm(str(query))
    if not q:
        return []
    order = {slug: i for i, slug in enumerate(catalog_rows())}
    scored = []
    for rec in _RECORDS.values():
        tier = _match_tier(q, rec)
        if tier is not None:
            scored.append((_rank(q, rec, tier, order), rec))
    if not scored:
        import difflib

        close = difflib.get_close_matches(q, list(_RECORDS), n=5, cutoff=0.6)
        scored = [(_rank(q, _RECORDS[s], 5, order), _RECORDS[s]) for s in close]
    return [rec for _, rec in sorted(scored, key=lambda t: t[0])]


def _rank(q, rec, tier, order):
    return (tier, not rec.slug.startswith(q), not rec.implemented, _TIER_ORDER.get(rec.tier, 9),
            order.get(rec.slug, len(order)), rec.slug)


def resolve(query: str) -> Mechanism:
    """The one record ``query`` names (see :func:`search`): the best match when no other match is
    as good (same kind of match, both implemented or not, same tier); :class:`UnknownMechanism`
    when nothing matches or the best matches tie (``attention``)."""
    _load()
    if query in _RECORDS:
        return _RECORDS[query]
    hits = search(query)
    if not hits:
        raise UnknownMechanism(f"no mechanism matches {query!r} (`refattn list --all` shows every slug)")
    q = _norm(str(query))
    order = {slug: i for i, slug in enumerate(catalog_rows())}

    def key(rec):  # what decides between matches: kind of match, implemented, tier (not the order)
        tier = _match_tier(q, rec)
        rank = _rank(q, rec, 5 if tier is None else tier, order)
        return (rank[0], rank[2], rank[3])

    best = key(hits[0])
    tied = [r.slug for r in hits if key(r) == best]
    if len(tied) == 1:
        return hits[0]
    raise UnknownMechanism(f"{query!r} matches several mechanisms: {', '.join(tied[:8])}; name one of them")


def call_forward(rec: Mechanism, inputs: dict, params: dict | None, config: dict):
    """Call ``rec.forward`` with the sample convention (``params=`` only when not None)."""
    kwargs = dict(inputs)
    kwargs.update(config)
    if params is not None:
        kwargs["params"] = params
    return rec.forward(**kwargs)
