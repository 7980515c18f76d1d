"""Mechanism-specific tests of softmax slice S6 (T3): Optimised / Efficient / Super attention
(refattn/attention/softmax/better_attention.py). Generic FD/reference/robustness checks are generated
from the registry; these cover every variant's gradients, torch parity and the layer's errors."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

ba = importlib.import_module("refattn.attention.softmax.better_attention")

VARIANTS = ("optimised", "efficient", "super")


def _fd_grads(f, arrays, eps=1e-6):
    out = {}
    for name, a in arrays.items():
        g = np.zeros_like(a)
        for idx in np.ndindex(a.shape):
            old = a[idx]
            a[idx] = old + eps
            fp = f()
            a[idx] = old - eps
            fm = f()
            a[idx] = old
            g[idx] = (fp - fm) / (2 * eps)
        out[name] = g
    return out


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("causal", [False, True])
def test_every_variant_matches_finite_differences(variant, causal):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 4))
    p = ba.init_better_attention_params(rng, 4, 3, variant=variant, qk_dim=6, bias=True)
    y, c = ba.better_attention_forward(x, p, num_heads=2, variant=variant, is_causal=causal)
    G = rng.standard_normal(y.shape)
    g = ba.better_attention_backward(G, c)
    arrays = {"x": x, **p}
    fd = _fd_grads(lambda: float(np.sum(G * ba.better_attention(x, p, num_heads=2, variant=variant,
                                                                   is_causal=causal))), arrays)
    assert set(g) == set(arrays)
    for k in arrays:
        np.testing.assert_allclose(g[k], fd[k], rtol=1e-6, atol=1e-8, err_msg=k)
    if variant == "super" and causal:
        assert np.all(np.triu(g["w_a"], 1) == 0)


@pytest.mark.parametrize("variant", VARIANTS)
def test_matches_torch_float64(variant):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(5)
    B, L, C, H = 2, 5, 6, 3
    x = rng.standard_normal((B, L, C))
    p = ba.init_better_attention_params(rng, C, L, variant=variant, qk_dim=6, bias=True)
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in p.items()}
    tx = torch.tensor(x, requires_grad=True)

    def sp(t):
        return t.reshape(B, L, H, -1).transpose(1, 2)

    q = sp(tx @ tp["q_proj.weight"] + tp["q_proj.bias"])
    k = sp(tx @ tp["k_proj.weight"] + tp["k_proj.bias"]) if variant == "optimised" else sp(tx)
    v = sp(tp["w_a"] @ tx) if variant == "super" else sp(tx)
    o = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, L, C)
    out = o @ tp["o_proj.weight"] + tp["o_proj.bias"]
    G = rng.standard_normal(out.shape)
    out.backward(torch.tensor(G))
    y, c = ba.better_attention_forward(x, p, num_heads=H, variant=variant)
    g = ba.better_attention_backward(G, c)
    np.testing.assert_allclose(y, out.detach().numpy(), rtol=0, atol=1e-12)
    np.testing.assert_allclose(g["x"], tx.grad.numpy(), rtol=0, atol=1e-12)
    for key in p:
        np.testing.assert_allclose(g[key], tp[key].grad.numpy(), rtol=0, atol=1e-12, err_msg=key)


def test_super_mixes_along_sequence_and_breaks_permutation_equivariance():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 4, 4))
    perm = np.array([2, 0, 3, 1])
    pe = ba.init_better_attention_params(rng, 4, variant="efficient")
    ye = ba.better_attention(x, pe, num_heads=2, variant="efficient")
    np.testing.assert_allclose(ba.better_attention(x[:, perm], pe, num_heads=2, variant="efficient"), ye[:, perm],
                               atol=1e-12)
    ps = ba.init_better_attention_params(rng, 4, 4, variant="super")
    ys = ba.better_attention(x, ps, num_heads=2, variant="super")
    assert np.abs(ba.better_attention(x[:, perm], ps, num_heads=2, variant="super") - ys[:, perm]).max() > 1e-3


def test_float32_stays_float32_and_inputs_untouched():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    p = {k: v.astype(np.float32) for k, v in ba.init_better_attention_params(rng, 4, 3).items()}
    x0, p0 = x.copy(), {k: v.copy() for k, v in p.items()}
    y, c = ba.better_attention_forward(x, p, num_heads=2)
    g = ba.better_attention_backward(np.ones_like(y), c)
    assert y.dtype == np.float32 and all(v.dtype == np.float32 for v in g.values())
    np.testing.assert_array_equal(x, x0)
    for k in p:
        np.testing.assert_array_equal(p[k], p0[k])


def test_bad_input_errors_name_the_argument():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 4))
    p = ba.init_better_attention_params(rng, 4, 3)
    with pytest.raises(ValueError, match="variant"):
        ba.better_attention(x, p, num_heads=2, variant="standard")
    with pytest.raises(ValueError, match="num_heads"):
        ba.better_attention(x, p, num_heads=3)
    with pytest.raises(ValueError, match="w_a"):
        ba.better_attention(rng.standard_normal((2, 5, 4)), p, num_heads=2)
    po = ba.init_better_attention_params(rng, 4, variant="optimised", qk_dim=6)
    with pytest.raises(ValueError, match="q_proj.weight"):
        ba.better_attention(x, {k: v for k, v in po.items() if k != "k_proj.weight"}, num_heads=2,
                            variant="efficient")
    with pytest.raises(TypeError, match="params"):
        ba.better_attention(x, None, num_heads=2)
    y, c = ba.better_attention_forward(x, p, num_heads=2)
    with pytest.raises(ValueError, match="dout"):
        ba.better_attention_backward(np.ones((2, 3, 5)), c)


# ----------------------------------------------------------------------------------------------
# Continuum attention over the piecewise-linear curve (refattn/attention/softmax/continuum_pl.py)

ca = importlib.import_module("refattn.attention.softmax.continuum_pl")


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("spread", [1.0, 1e-3])
def test_continuum_gradients_match_finite_differences(causal, spread):
    # spread=1e-3 puts every neighbouring score difference inside the Taylor branch of F and F'
    rng = np.random.default_rng(7)
    q = spread * rng.standard_normal((2, 4, 2))
    k = rng.standard_normal((2, 5 if not causal else 4, 2))
    v = rng.standard_normal(k.shape[:-1] + (3,))
    y, c = ca.continuum_pl_attention_forward(q, k, v, is_causal=causal)
    G = rng.standard_normal(y.shape)
    g = ca.continuum_pl_attention_backward(G, c)
    fd = _fd_grads(lambda: float(np.sum(G * ca.continuum_pl_attention(q, k, v, is_causal=causal))),
                   {"q": q, "k": k, "v": v})
    for n in "qkv":
        np.testing.assert_allclose(g[n], fd[n], rtol=1e-6, atol=1e-9, err_msg=n)


def test_continuum_closed_form_matches_quadrature_of_the_curve():
    rng = np.random.default_rng(8)
    q, k, v = 2.0 * rng.standard_normal((2, 5, 3)), rng.standard_normal((2, 5, 3)), rng.standard_normal((2, 5, 2))
    for causal in (True, False):
        np.testing.assert_allclose(ca.continuum_pl_attention(q, k, v, is_causal=causal),
                                   ca._reference(q, k, v, is_causal=causal), atol=1e-12)


def test_continuum_differs_from_softmax_and_broadcasts_heads():
    rng = np.random.default_rng(9)
    q, k, v = (rng.standard_normal((2, 2, 5, 3)) for _ in range(3))
    y = ca.continuum_pl_attention(q, k, v)
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(3)
    s = np.where(np.tri(5, dtype=bool), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    assert np.abs(y - (p / p.sum(-1, keepdims=True)) @ v).max() > 1e-3
    y1, c1 = ca.continuum_pl_attention_forward(q, k[:1], v[:1])   # keys shared over the batch axis
    g = ca.continuum_pl_attention_backward(np.ones_like(y1), c1)
    assert g["k"].shape == (1, 2, 5, 3) and g["v"].shape == (1, 2, 5, 3)


def test_continuum_bad_input():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 4, 3)) for _ in range(3))
    with pytest.raises(ValueError, match="N <= M"):
        ca.continuum_pl_attention(rng.standard_normal((2, 6, 3)), k, v)
    with pytest.raises(ValueError, match="feature axis"):
        ca.continuum_pl_attention(rng.standard_normal((2, 4, 2)), k, v)
    with pytest.raises(ValueError, match="scale"):
        ca.continuum_pl_attention(q, k, v, scale=-1.0)
    with pytest.raises(TypeError, match="is_causal"):
        ca.continuum_pl_attention(q, k, v, is_causal="yes")
    y, c = ca.continuum_pl_attention_forward(q, k, v)
    with pytest.raises(ValueError, match="dout"):
        ca.continuum_pl_attention_backward(np.ones((2, 4, 4)), c)


# ----------------------------------------------------------------------------------------------
# LRFormer Lipschitz-regularised L2 attention (refattn/attention/softmax/lipschitz_l2.py)

lr = importlib.import_module("refattn.attention.softmax.lipschitz_l2")


@pytest.mark.parametrize("tied", [True, False])
def test_lrformer_gradients_match_finite_differences(tied):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 3, 3))
    x[:, 1] *= 3.0                      # a unique max-norm token per sample (the bound's selection)
    p = lr.init_lipschitz_l2_params(rng, 3, 2, 2, tied=tied)
    y, c = lr.lipschitz_l2_attention_forward(x, p, num_heads=2, alpha=4.0, tied=tied)
    G = rng.standard_normal(y.shape)
    g = lr.lipschitz_l2_attention_backward(G, c)
    arrays = {"x": x, **p}
    fd = _fd_grads(lambda: float(np.sum(G * lr.lipschitz_l2_attention(x, p, num_heads=2, alpha=4.0, tied=tied))),
                   arrays)
    assert set(g) == set(arrays)
    for key in arrays:
        np.testing.assert_allclose(g[key], fd[key], rtol=1e-6, atol=1e-9, err_msg=key)


def test_lrformer_bad_input():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 4))
    p = lr.init_lipschitz_l2_params(rng, 4, 2, 2)
    with pytest.raises(ValueError, match="alpha"):
        lr.lipschitz_l2_attention(x, p, num_heads=2, alpha=0.0)
    with pytest.raises(ValueError, match="k_proj.weight"):
        lr.lipschitz_l2_attention(x, p, num_heads=2, tied=False)
    with pytest.raises(ValueError, match="num_heads"):
        lr.lipschitz_l2_attention(x, p, num_heads=3)
    with pytest.raises(TypeError, match="tied"):
        lr.lipschitz_l2_attention(x, p, num_heads=2, tied=1)
    y, c = lr.lipschitz_l2_attention_forward(x, p, num_heads=2)
    with pytest.raises(ValueError, match="dout"):
        lr.lipschitz_l2_attention_backward(np.ones((2, 3, 3)), c)
