"""Mechanism-specific tests of the shared primitives in refattn/nn (linear, norms, activations, RoPE).

Generic checks (FD gradcheck, dtype, bad input, inputs-never-modified …) are generated from the
registry elsewhere; these tests cover identities, PyTorch parity and edge cases.
"""

from __future__ import annotations

import numpy as np
import pytest

from refattn import registry
from refattn.nn.linear import linear, linear_backward, linear_forward
from refattn.testing import run_record_checks

SLUGS = ["linear"]


@pytest.mark.parametrize("slug", SLUGS)
def test_record_checks_pass(slug):
    res = run_record_checks(registry.get(slug))
    bad = [(r.check, r.message) for r in res.results if not r.passed]
    assert not bad, bad


# ------------------------------------------------------------------------------------ linear


def test_linear_torch_parity():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    layer = torch.nn.Linear(5, 3).double()
    x = rng.standard_normal((2, 4, 5))
    params = {"weight": layer.weight.detach().numpy().T, "bias": layer.bias.detach().numpy()}
    y, cache = linear_forward(x, params)
    xt = torch.from_numpy(x).requires_grad_()
    yt = layer(xt)
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-12, atol=1e-12)
    g = rng.standard_normal(y.shape)
    yt.backward(torch.from_numpy(g))
    grads = linear_backward(g, cache)
    np.testing.assert_allclose(grads["x"], xt.grad.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(grads["weight"], layer.weight.grad.numpy().T, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(grads["bias"], layer.bias.grad.numpy(), rtol=1e-12, atol=1e-12)


def test_linear_bad_params():
    x = np.ones((2, 3))
    with pytest.raises(ValueError, match="weight"):
        linear(x, {"weight": np.ones((4, 2))})
    with pytest.raises(ValueError, match="bias"):
        linear(x, {"weight": np.ones((3, 2)), "bias": np.ones(3)})
    with pytest.raises(ValueError, match="unknown keys"):
        linear(x, {"weight": np.ones((3, 2)), "w": np.ones(3)})
    with pytest.raises(TypeError, match="weight"):
        linear(x, {"weight": np.ones((3, 2), dtype=int)})


def test_linear_dtype_and_1d():
    w = np.ones((3, 2), np.float32)
    assert linear(np.ones((4, 3), np.float16), {"weight": w}).dtype == np.float32
    assert linear(np.ones((4, 3), np.float32), {"weight": w.astype(np.float64)}).dtype == np.float64
    y, cache = linear_forward(np.arange(3.0), {"weight": np.eye(3)[:, :2], "bias": np.ones(2)})
    assert y.shape == (2,)
    g = linear_backward(np.ones(2), cache)
    assert g["x"].shape == (3,) and g["weight"].shape == (3, 2) and g["bias"].shape == (2,)
