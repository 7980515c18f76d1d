"""Slice B6 of family 5 (T3 blocks): tests the registry cannot express."""

import numpy as np
import pytest

from refattn.blocks.dico import dico_conv_module_backward, dico_conv_module_forward

# --------------------------------------------------------------------------------------------
# DiCo compact channel attention


def _dico_params(rng, c, k=3):
    p = {}
    for n in ("conv1", "ca.1", "conv3"):
        p[f"{n}.weight"] = rng.standard_normal((c, c, 1, 1)) / np.sqrt(c)
        p[f"{n}.bias"] = 0.2 * rng.standard_normal(c)
    p["conv2.weight"] = rng.standard_normal((c, 1, k, k)) / k
    p["conv2.bias"] = 0.2 * rng.standard_normal(c)
    return p


@pytest.mark.parametrize("k", [3, 5])
def test_dico_matches_torch_functional(k):
    # DiCoBlock's conv path written with torch.nn.functional (F.conv2d, F.gelu,
    # F.adaptive_avg_pool2d, sigmoid): forward and every gradient in float64.
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(k)
    c = 4
    x = rng.standard_normal((2, c, 5, 4))
    p = _dico_params(rng, c, k)
    y, cache = dico_conv_module_forward(x, p)
    dy = rng.standard_normal(y.shape)
    g = dico_conv_module_backward(dy, cache)
    tp = {n: torch.tensor(v, requires_grad=True) for n, v in p.items()}
    tx = torch.tensor(x, requires_grad=True)
    h = F.gelu(F.conv2d(F.conv2d(tx, tp["conv1.weight"], tp["conv1.bias"]), tp["conv2.weight"], tp["conv2.bias"],
                        padding=k // 2, groups=c))
    h = h * torch.sigmoid(F.conv2d(F.adaptive_avg_pool2d(h, 1), tp["ca.1.weight"], tp["ca.1.bias"]))
    ty = F.conv2d(h, tp["conv3.weight"], tp["conv3.bias"])
    ty.backward(torch.tensor(dy))
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(g["x"], tx.grad.numpy(), rtol=1e-12, atol=1e-13)
    for n in p:
        np.testing.assert_allclose(g[n], tp[n].grad.numpy(), rtol=1e-12, atol=1e-13, err_msg=n)


def test_dico_rejects_even_kernel_and_keeps_inputs():
    rng = np.random.default_rng(1)
    p = _dico_params(rng, 2, 3)
    bad = dict(p, **{"conv2.weight": np.ones((2, 1, 2, 2))})
    x = rng.standard_normal((2, 2, 3, 3))
    with pytest.raises(ValueError, match="conv2.weight"):
        dico_conv_module_forward(x, bad)
    x0 = x.copy()
    y, cache = dico_conv_module_forward(x, p)
    y[...] = 0.0
    dico_conv_module_backward(np.ones_like(y), cache)
    np.testing.assert_array_equal(x, x0)
    np.testing.assert_array_equal(dico_conv_module_forward(x, p)[0], dico_conv_module_forward(x, p)[0])
