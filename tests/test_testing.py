"""The verification tools must catch wrong backwards and wrong outside implementations."""

from __future__ import annotations

import numpy as np
import pytest

from refattn.nn.softmax import softmax_backward, softmax_forward
from refattn.registry import Sample
from refattn.testing import (
    GradcheckError,
    assert_close,
    compare_implementation,
    directional_check,
    gradcheck,
    to_numpy,
    tolerances,
)


def _sample():
    return Sample(inputs={"x": np.random.default_rng(0).standard_normal((2, 5))})


def _wrong_backward(dout, cache):
    return {"x": cache["p"] * dout}  # forgets the -sum(p * dout) term


def test_gradcheck_passes_a_correct_backward():
    rep = gradcheck(softmax_forward, softmax_backward, _sample())
    assert rep.passed and rep.max_rel < 1e-6
    assert "x" in str(rep)


def test_gradcheck_catches_a_wrong_backward_with_a_table():
    with pytest.raises(GradcheckError) as ei:
        gradcheck(softmax_forward, _wrong_backward, _sample())
    assert "FAIL" in str(ei.value) and "x" in str(ei.value)
    assert gradcheck(softmax_forward, _wrong_backward, _sample(), raise_on_failure=False).passed is False


def test_directional_check_catches_a_wrong_backward():
    assert directional_check(softmax_forward, softmax_backward, _sample()).passed
    with pytest.raises(GradcheckError):
        directional_check(softmax_forward, _wrong_backward, _sample())


def test_gradcheck_reports_missing_gradient_keys():
    with pytest.raises(GradcheckError, match="missing"):
        gradcheck(softmax_forward, lambda d, c: {}, _sample())


def test_gradcheck_requires_float64():
    s = Sample(inputs={"x": np.ones((2, 3), np.float32)})
    with pytest.raises(TypeError, match="float64"):
        gradcheck(softmax_forward, softmax_backward, s)


def test_assert_close_tolerances_and_message():
    assert tolerances(np.float64)[0] < tolerances(np.float32)[0] < tolerances(np.float16)[0]
    assert_close(np.array([1.0, 2.0]), np.array([1.0, 2.0 + 1e-13]))
    with pytest.raises(AssertionError, match="worst at"):
        assert_close(np.array([1.0, 2.0]), np.array([1.0, 2.1]), name="out")
    with pytest.raises(AssertionError, match="shape"):
        assert_close(np.ones(2), np.ones(3))
    assert_close(np.float32([1.0]), np.float64([1.0 + 1e-6]))  # float32 tolerance applies


def test_compare_implementation_numpy_pass_and_fail():
    def good(x, **cfg):
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    def bad(x, **cfg):
        return np.exp(x) / np.exp(x).sum(-1, keepdims=True) + 1e-3

    def vjp(dout, x, **cfg):
        p = good(x)
        return {"x": p * (dout - (p * dout).sum(-1, keepdims=True))}

    assert compare_implementation(good, "softmax", vjp=vjp, config={}).passed
    rep = compare_implementation(bad, "softmax", config={})
    assert not rep.passed and "FAIL" in str(rep)


def test_compare_implementation_torch_catches_a_wrong_scale():
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    def wrong(q, k, v, **cfg):  # ignores the requested scale
        return F.scaled_dot_product_attention(q, k, v)

    rep = compare_implementation(wrong, "sdpa", convert=torch.from_numpy, config={"scale": 0.3})
    assert not rep.passed
    assert to_numpy(torch.ones(2, requires_grad=True)).shape == (2,)


def test_compare_module_docstring_example_runs():
    """The PyTorch example in refattn.testing.compare's docstring (shown on the API page) runs."""
    pytest.importorskip("torch")
    import doctest

    import refattn.testing.compare as mod

    res = doctest.testmod(mod)
    assert res.attempted > 0 and res.failed == 0


def test_cli_bench_runs_the_source_benchmark(tmp_path, capsys):
    """`refattn bench` drives benchmarks/bench.py from the checkout (a tiny run)."""
    from refattn.cli import main

    assert main(["bench", "--sizes", "64", "--repeats", "1", "--cases", "linear", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "bench.json").exists()
