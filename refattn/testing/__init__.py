"""Verification tools: finite-difference checks, tolerances, and checks of outside implementations.

* :func:`gradcheck` — float64 central differences on every input and parameter.
* :func:`directional_check` — random-direction JVP-vs-VJP check for larger sizes.
* :func:`assert_close` / :func:`tolerances` — dtype-aware comparisons.
* :func:`compare_implementation` — judge your own PyTorch/JAX/NumPy forward (and VJP) against
  refattn's reference for any registry slug, on a battery of cases (:mod:`refattn.testing.cases`).
* :func:`compare_cases` — the same battery as ``pytest.mark.parametrize`` cases, one line in a suite.
* :func:`run_record_checks` — everything a registry record declares (used by ``refattn check``).
"""

from .compare import (
    DEFAULT_SEEDS,
    ArrayResult,
    CaseResult,
    CompareCase,
    CompareReport,
    assert_close,
    battery,
    compare_cases,
    compare_implementation,
    to_numpy,
    tolerances,
)
from .gradcheck import GradcheckError, GradReport, directional_check, gradcheck
from .runner import CheckResult, run_record_checks

__all__ = [
    "DEFAULT_SEEDS",
    "ArrayResult",
    "CaseResult",
    "CheckResult",
    "CompareCase",
    "CompareReport",
    "battery",
    "compare_cases",
    "GradReport",
    "GradcheckError",
    "assert_close",
    "compare_implementation",
    "directional_check",
    "gradcheck",
    "run_record_checks",
    "to_numpy",
    "tolerances",
]
