"""Run every verification a registry record declares; used by ``refattn check`` and the tests."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from ..registry import Mechanism, call_forward
from .compare import assert_close
from .gradcheck import GradcheckError, directional_check, gradcheck

__all__ = ["CheckResult", "run_record_checks"]


@dataclass
class CheckResult:
    """One line of ``refattn check``: a named check of a record, its verdict and max error."""

    slug: str
    check: str
    passed: bool
    error: float | None = None
    message: str = ""
    seconds: float = 0.0


@dataclass
class RecordResults:
    slug: str
    results: list[CheckResult] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)


def _run(slug, name, fn) -> CheckResult:
    t0 = time.perf_counter()
    try:
        err = fn()
        ok, msg = True, ""
    except GradcheckError as exc:
        err, ok, msg = exc.report.max_rel, False, str(exc.report)
    except AssertionError as exc:
        err, ok, msg = None, False, str(exc) or "assertion failed"
    except Exception as exc:  # a crash is a failure of the check, reported, not raised
        err, ok, msg = None, False, f"{type(exc).__name__}: {exc}"
    if hasattr(err, "max_rel"):
        err = err.max_rel
    return CheckResult(slug, name, ok, err if isinstance(err, (float, int, np.floating)) else None,
                       msg, time.perf_counter() - t0)


def record_check_names(rec: Mechanism) -> list[str]:
    names = ["gradcheck", "directional"]
    if rec.reference is not None:
        names.append("reference")
    names += [f"check:{k}" for k in rec.checks]
    return names


def run_record_checks(rec: Mechanism, *, seed: int = 0, only: str | None = None,
                      on_check=None) -> RecordResults:
    """FD gradcheck (tiny), directional check (small), explicit reference and named checks."""
    out = RecordResults(rec.slug)
    if not rec.implemented:
        return out

    def fd():
        s = rec.sample(np.random.default_rng(seed), "tiny")
        return gradcheck(rec.forward, rec.backward, s, rtol=rec.fd_rtol, seed=seed).max_rel

    def directional():
        s = rec.sample(np.random.default_rng(seed + 1), "small")
        return directional_check(rec.forward, rec.backward, s, rtol=rec.fd_rtol, seed=seed).max_rel

    def reference():
        s = rec.sample(np.random.default_rng(seed + 2), "small")
        out_, _ = call_forward(rec, s.inputs, s.params, s.config)
        kw = dict(s.inputs)
        kw.update(s.config)
        if s.params is not None:
            kw["params"] = s.params
        ref = rec.reference(**kw)
        assert_close(out_, ref, rtol=1e-10, atol=1e-12, name=f"{rec.slug} forward vs explicit formula")
        return float(np.max(np.abs(np.asarray(out_) - np.asarray(ref))))

    plan = [("gradcheck", fd), ("directional", directional)] if rec.differentiable else []
    if rec.reference is not None:
        plan.append(("reference", reference))
    for name, fn in rec.checks.items():
        plan.append((f"check:{name}", lambda fn=fn: fn(np.random.default_rng(seed + 3))))
    for name, fn in plan:
        if only is not None and name != only:
            continue
        res = _run(rec.slug, name, fn)
        out.results.append(res)
        if on_check is not None:
            on_check(res)
    return out
