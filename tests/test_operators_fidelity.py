"""Fidelity of the operator mechanisms to their upstream modules (issue #20, operator items).

Every test runs a float64 PyTorch module next to refattn and compares the output and every input
and parameter gradient. Where the upstream installs from PyPI (neuraloperator) the real module is
used (skipped when it is not installed); otherwise the module is re-stated from the cited upstream
file in ``tests/_upstream_ops.py``. The measured agreement is recorded in the docs.
"""

from __future__ import annotations

import numpy as np
import pytest

from _upstream_ops import build_ono_orth, compare_module
from refattn.operators.ono import ono_attention_backward, ono_attention_forward

TOL = 1e-9


def _assert_close(errs, tol=TOL):
    bad = {k: v for k, v in errs.items() if not v < tol}
    assert not bad, f"upstream mismatch {bad} (all: {errs})"


# ------------------------------------------------------------------------ ONO (item 6)


@pytest.mark.parametrize("residual", [True, False])
def test_ono_matches_upstream_head_and_86e1bfe(residual):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    mu = rng.standard_normal(4)
    mod, mapping = build_ono_orth(torch, mu, residual=residual)
    inputs = {"psi": rng.standard_normal((2, 9, 4)) + 0.3, "fx": rng.standard_normal((2, 9, 3))}
    errs = compare_module(torch, mod, mapping, ono_attention_forward, ono_attention_backward, inputs,
                          config={"residual": residual})
    _assert_close(errs)


def test_ono_residual_keyword_rejects_non_bool():
    with pytest.raises(TypeError, match="residual"):
        ono_attention_forward(np.ones((2, 3, 1)), np.ones((2, 3, 1)), {"mu": np.ones(1)}, residual=1)
