"""Mechanism-specific tests of the shared primitives in refattn/nn (linear, norms, activations, RoPE).

Generic checks (FD gradcheck, dtype, bad input, inputs-never-modified …) are generated from the
registry elsewhere; these tests cover identities, PyTorch parity and edge cases.
"""

from __future__ import annotations

import numpy as np
import pytest

from refattn import registry
from refattn.nn.activations import (
    elu_plus_one,
    elu_plus_one_backward,
    elu_plus_one_forward,
    elu_plus_one_grad,
    gelu,
    gelu_backward,
    gelu_forward,
    gelu_grad,
    sigmoid,
    sigmoid_backward,
    sigmoid_forward,
    sigmoid_grad,
    silu,
    silu_backward,
    silu_forward,
    silu_grad,
    swiglu,
    swiglu_backward,
    swiglu_forward,
)
from refattn.nn.linear import linear, linear_backward, linear_forward
from refattn.nn.norms import (
    group_norm,
    group_norm_backward,
    group_norm_forward,
    instance_norm,
    instance_norm_backward,
    instance_norm_forward,
    layer_norm,
    layer_norm_backward,
    layer_norm_forward,
    rms_norm,
    rms_norm_backward,
    rms_norm_forward,
)
from refattn.nn.rope import apply_rope, rope, rope_angles_vjp, rope_backward, rope_forward
from refattn.testing import run_record_checks

SLUGS = ["linear", "layer_norm", "rms_norm", "group_norm", "instance_norm",
         "sigmoid", "silu", "gelu", "elu_plus_one", "swiglu", "rope"]


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


# ------------------------------------------------------------------------------------- norms


def _torch_grads(fn, arrays, g):
    """Forward and autograd gradients of a torch function of float64 arrays."""
    torch = pytest.importorskip("torch")
    ts = [torch.from_numpy(np.ascontiguousarray(a)).requires_grad_() for a in arrays]
    out = fn(*ts)
    out.backward(torch.from_numpy(g))
    return out.detach().numpy(), [t.grad.numpy() for t in ts]


def _assert_grads(grads, names, tgrads):
    for n, tg in zip(names, tgrads, strict=True):
        np.testing.assert_allclose(grads[n], tg, rtol=1e-10, atol=1e-12, err_msg=n)


def test_layer_norm_torch_parity_multi_axis():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 4, 5)) * 2 + 1
    w, b = rng.standard_normal((4, 5)), rng.standard_normal((4, 5))
    y, cache = layer_norm_forward(x, {"weight": w, "bias": b}, axis=(-2, -1), eps=1e-5)
    g = rng.standard_normal(y.shape)
    ty, tg = _torch_grads(lambda x_, w_, b_: F.layer_norm(x_, (4, 5), w_, b_, 1e-5), [x, w, b], g)
    np.testing.assert_allclose(y, ty, rtol=1e-10, atol=1e-12)
    _assert_grads(layer_norm_backward(g, cache), ["x", "weight", "bias"], tg)


def test_rms_norm_torch_parity():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 3, 2, 6))
    w = rng.standard_normal(6)
    y, cache = rms_norm_forward(x, {"weight": w}, eps=1e-6)
    g = rng.standard_normal(y.shape)
    ty, tg = _torch_grads(lambda x_, w_: F.rms_norm(x_, (6,), w_, 1e-6), [x, w], g)
    np.testing.assert_allclose(y, ty, rtol=1e-10, atol=1e-12)
    _assert_grads(rms_norm_backward(g, cache), ["x", "weight"], tg)
    # elementwise_affine=False
    y0, cache0 = rms_norm_forward(x, None, eps=1e-6)
    ty0, tg0 = _torch_grads(lambda x_: F.rms_norm(x_, (6,), None, 1e-6), [x], g)
    np.testing.assert_allclose(y0, ty0, rtol=1e-10, atol=1e-12)
    _assert_grads(rms_norm_backward(g, cache0), ["x"], tg0)
    assert set(rms_norm_backward(g, cache0)) == {"x"}


@pytest.mark.parametrize("groups", [1, 2, 6])
def test_group_norm_torch_parity(groups):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 6, 3, 2)) + 0.5
    w, b = rng.standard_normal(6), rng.standard_normal(6)
    y, cache = group_norm_forward(x, {"weight": w, "bias": b}, num_groups=groups, channel_axis=1)
    g = rng.standard_normal(y.shape)
    ty, tg = _torch_grads(lambda x_, w_, b_: F.group_norm(x_, groups, w_, b_, 1e-5), [x, w, b], g)
    np.testing.assert_allclose(y, ty, rtol=1e-10, atol=1e-12)
    _assert_grads(group_norm_backward(g, cache), ["x", "weight", "bias"], tg)
    # token-major layout (B, H, W, C) with the default channel_axis=-1 is the same map
    xt = np.moveaxis(x, 1, -1)
    yt, cache_t = group_norm_forward(xt, {"weight": w, "bias": b}, num_groups=groups)
    np.testing.assert_allclose(yt, np.moveaxis(ty, 1, -1), rtol=1e-10, atol=1e-12)
    gt = group_norm_backward(np.moveaxis(g, 1, -1), cache_t)
    np.testing.assert_allclose(gt["x"], np.moveaxis(tg[0], 1, -1), rtol=1e-10, atol=1e-12)


def test_instance_norm_torch_parity_and_axis_trap():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 4, 7)) * 3 - 1  # (B, C, N), PyTorch layout
    w, b = rng.standard_normal(4), rng.standard_normal(4)
    y, cache = instance_norm_forward(x, {"weight": w, "bias": b}, channel_axis=1)
    g = rng.standard_normal(y.shape)
    ty, tg = _torch_grads(lambda x_, w_, b_: F.instance_norm(x_, weight=w_, bias=b_, eps=1e-5), [x, w, b], g)
    np.testing.assert_allclose(y, ty, rtol=1e-10, atol=1e-12)
    _assert_grads(instance_norm_backward(g, cache), ["x", "weight", "bias"], tg)
    # Token-major default: statistics over the points (axis 1), checked with explicit NumPy.
    xt = np.swapaxes(x, 1, 2)  # (B, N, C)
    yt = instance_norm(xt)
    mu, var = xt.mean(axis=1, keepdims=True), xt.var(axis=1, keepdims=True)
    np.testing.assert_allclose(yt, (xt - mu) / np.sqrt(var + 1e-5), rtol=1e-12, atol=1e-12)
    # ... which is NOT what InstanceNorm1d does on a (B, N, C) tensor (it normalises over C).
    trap = F.instance_norm(torch.from_numpy(xt)).numpy()
    assert np.abs(trap - yt).max() > 0.1


def test_masked_instance_norm_matches_unpadded_and_fd():
    rng = np.random.default_rng(5)
    lengths = [5, 3]
    x = rng.standard_normal((2, 5, 3))
    mask = np.arange(5)[None, :] < np.array(lengths)[:, None]
    p = {"weight": rng.standard_normal(3), "bias": rng.standard_normal(3)}
    y, cache = instance_norm_forward(x, p, mask=mask)
    g = rng.standard_normal(y.shape)
    grads = instance_norm_backward(g, cache)
    for bi, n in enumerate(lengths):
        yb, cb = instance_norm_forward(x[bi:bi + 1, :n], p)
        np.testing.assert_allclose(y[bi, :n], yb[0], rtol=1e-12, atol=1e-12)
        gb = instance_norm_backward(g[bi:bi + 1, :n], cb)
        np.testing.assert_allclose(grads["x"][bi, :n], gb["x"][0], rtol=1e-12, atol=1e-12)
        assert np.all(y[bi, n:] == 0) and np.all(grads["x"][bi, n:] == 0)


def test_layer_norm_per_head_affine():
    # Galerkin per-head LN: x (B, H, N, d) with gamma, beta of shape (H, 1, d).
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 3, 4, 5))
    w, b = rng.standard_normal((3, 1, 5)), rng.standard_normal((3, 1, 5))
    y, cache = layer_norm_forward(x, {"weight": w, "bias": b})
    np.testing.assert_allclose(y, layer_norm(x) * w + b, rtol=1e-12, atol=1e-12)
    grads = layer_norm_backward(np.ones_like(y), cache)
    assert grads["weight"].shape == (3, 1, 5) and grads["bias"].shape == (3, 1, 5)
    np.testing.assert_allclose(grads["bias"], np.full((3, 1, 5), 8.0))
    np.testing.assert_allclose(grads["weight"], layer_norm(x).sum(axis=(0, 2), keepdims=True)[0], atol=1e-12)


def test_norms_bad_input():
    x = np.ones((2, 3, 4))
    with pytest.raises(ValueError, match="num_groups"):
        group_norm(x, num_groups=3)
    with pytest.raises(ValueError, match="channel_axis"):
        group_norm(x, num_groups=1, channel_axis=0)
    with pytest.raises(ValueError, match="axis"):
        layer_norm(x, axis=3)
    with pytest.raises(ValueError, match="repeated"):
        layer_norm(x, axis=(1, -2))
    with pytest.raises(ValueError, match="weight"):
        layer_norm(x, {"weight": np.ones(3)})
    with pytest.raises(ValueError, match="unknown keys"):
        rms_norm(x, {"weight": np.ones(4), "bias": np.ones(4)})
    with pytest.raises(ValueError, match="mask"):
        instance_norm(x, mask=np.ones((2, 4), bool))
    with pytest.raises(TypeError, match="mask"):
        instance_norm(x, mask=np.ones((2, 3)))
    with pytest.raises(ValueError, match="eps"):
        layer_norm(x, eps=-1.0)
    with pytest.raises(ValueError, match="x"):
        instance_norm(np.ones((2, 3)))
    with pytest.raises(TypeError, match="x"):
        layer_norm(np.ones((2, 3), dtype=np.int64))


def test_norms_float32():
    x = np.random.default_rng(7).standard_normal((2, 3, 4)).astype(np.float32)
    for fn in (layer_norm, rms_norm, instance_norm):
        assert fn(x).dtype == np.float32
    assert group_norm(x, num_groups=2).dtype == np.float32
    assert layer_norm(x, {"weight": np.ones(4)}).dtype == np.float64


# ------------------------------------------------------------------------------- activations


def _torch_acts():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    return {
        "sigmoid": (sigmoid_forward, sigmoid_backward, {}, torch.sigmoid),
        "silu": (silu_forward, silu_backward, {}, F.silu),
        "gelu_none": (gelu_forward, gelu_backward, {"approximate": "none"}, lambda t: F.gelu(t)),
        "gelu_tanh": (gelu_forward, gelu_backward, {"approximate": "tanh"},
                      lambda t: F.gelu(t, approximate="tanh")),
        "elu_plus_one": (elu_plus_one_forward, elu_plus_one_backward, {}, lambda t: F.elu(t) + 1),
        "swiglu": (swiglu_forward, swiglu_backward, {}, lambda t: F.silu(t.chunk(2, -1)[0]) * t.chunk(2, -1)[1]),
    }


@pytest.mark.parametrize("name", ["sigmoid", "silu", "gelu_none", "gelu_tanh", "elu_plus_one", "swiglu"])
def test_activation_torch_parity(name):
    fwd, bwd, cfg, tfn = _torch_acts()[name]
    rng = np.random.default_rng(8)
    x = np.concatenate([rng.standard_normal((2, 3, 6)) * 3, np.full((2, 3, 2), 35.0), np.full((2, 3, 2), -35.0)], -1)
    y, cache = fwd(x, **cfg)
    g = rng.standard_normal(y.shape)
    ty, (tdx,) = _torch_grads(tfn, [x], g)
    np.testing.assert_allclose(y, ty, rtol=1e-13, atol=1e-14)
    np.testing.assert_allclose(bwd(g, cache)["x"], tdx, rtol=1e-12, atol=1e-14)


def test_activation_helpers_keep_float32():
    x = np.linspace(-3, 3, 7, dtype=np.float32)
    for f in (sigmoid, sigmoid_grad, silu, silu_grad, elu_plus_one, elu_plus_one_grad):
        assert f(x).dtype == np.float32, f.__name__
    for a in ("none", "tanh"):
        assert gelu(x, a).dtype == np.float32 and gelu_grad(x, a).dtype == np.float32
    assert swiglu(x[:6]).dtype == np.float32


def test_activation_bad_input():
    with pytest.raises(ValueError, match="even"):
        swiglu_forward(np.ones((2, 3)))
    with pytest.raises(ValueError, match="approximate"):
        gelu_forward(np.ones((2, 3)), approximate="erf")
    with pytest.raises(ValueError, match="dout"):
        _, c = swiglu_forward(np.ones((2, 4)))
        swiglu_backward(np.ones((2, 4)), c)


# -------------------------------------------------------------------------------------- rope


def _rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def _rotate_every_two(x):
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = -x[..., 1::2], x[..., 0::2]
    return out


def test_rope_matches_llama_and_gptj_formulas():
    # HF Llama / NeoX: x * cos + rotate_half(x) * sin with cos = cat(freqs, freqs);
    # GPT-J: x * cos + rotate_every_two(x) * sin with cos = repeat_interleave(freqs, 2).
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 3, 5, 8))
    inv_freq = 1.0 / (500000.0 ** (np.arange(0, 8, 2) / 8))
    freqs = np.outer(np.arange(5) + 2, inv_freq)
    emb = np.concatenate([freqs, freqs], -1)
    llama = x * np.cos(emb) + _rotate_half(x) * np.sin(emb)
    np.testing.assert_allclose(rope(x, base=500000.0, offset=2), llama, rtol=1e-13, atol=1e-13)
    emb2 = np.repeat(freqs, 2, axis=-1)
    gptj = x * np.cos(emb2) + _rotate_every_two(x) * np.sin(emb2)
    np.testing.assert_allclose(rope(x, base=500000.0, offset=2, interleaved=True), gptj, rtol=1e-13, atol=1e-13)


def test_rope_angle_gradient_fd():
    rng = np.random.default_rng(10)
    x = rng.standard_normal((2, 4, 6))
    phi = rng.uniform(-3, 3, (4, 3))
    G = rng.standard_normal(x.shape)
    for inter in (False, True):
        def loss(p, inter=inter):
            return float(np.sum(G * apply_rope(x, np.cos(p), np.sin(p), inter)))

        y = apply_rope(x, np.cos(phi), np.sin(phi), inter)
        ana = rope_angles_vjp(G, y, 6, inter).sum(axis=0)  # angles broadcast over the batch
        num = np.zeros_like(phi)
        for idx in np.ndindex(phi.shape):
            e = np.zeros_like(phi)
            e[idx] = 1e-6
            num[idx] = (loss(phi + e) - loss(phi - e)) / 2e-6
        assert np.abs(ana - num).max() / np.abs(num).max() < 1e-6


def test_rope_token_major_layout_and_positions():
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 5, 3, 4))  # (B, N, H, d) as in unilm / flash-attn
    y = rope(x, positions=np.arange(5)[:, None], interleaved=True)
    ref = np.swapaxes(rope(np.swapaxes(x, 1, 2), interleaved=True), 1, 2)
    np.testing.assert_allclose(y, ref, rtol=1e-14, atol=1e-14)
    # per-sample positions (B, 1, N) broadcast over heads; integer positions accepted
    xs = np.swapaxes(x, 1, 2)
    pos = np.stack([np.arange(5), np.arange(5) + 7])[:, None, :]
    yb = rope(xs, positions=pos)
    np.testing.assert_allclose(yb[1], rope(xs[1:], offset=7)[0], rtol=1e-13, atol=1e-13)


def test_rope_float32_and_bad_input():
    x32 = np.ones((2, 3, 4), np.float32)
    y, cache = rope_forward(x32)
    assert y.dtype == np.float32 and rope_backward(np.ones_like(y), cache)["x"].dtype == np.float32
    x = np.ones((2, 3, 4))
    with pytest.raises(ValueError, match="even"):
        rope(np.ones((2, 3, 5)))
    with pytest.raises(ValueError, match="rotary_dim"):
        rope(x, rotary_dim=6)
    with pytest.raises(ValueError, match="rotary_dim"):
        rope(x, rotary_dim=3)
    with pytest.raises(ValueError, match="positions"):
        rope(x, positions=np.arange(4))
    with pytest.raises(TypeError, match="positions"):
        rope(x, positions=np.ones(3, bool))
    with pytest.raises(TypeError, match="offset"):
        rope(x, offset=1.5)
    with pytest.raises(ValueError, match="base"):
        rope(x, base=0.0)
    with pytest.raises(TypeError, match="interleaved"):
        rope(x, interleaved="yes")
    assert rope(np.ones((2, 3, 5)), rotary_dim=4).shape == (2, 3, 5)


def test_degenerate_sizes_are_finite():
    # d = 1 LayerNorm and N = 1 InstanceNorm have zero variance: x_hat = 0, output = bias, dx = 0.
    x = np.array([[[3.0], [-2.0]], [[0.5], [7.0]]])  # (2, 2, 1)
    y, cache = layer_norm_forward(x, {"weight": np.array([2.0]), "bias": np.array([0.25])})
    assert np.array_equal(y, np.full_like(x, 0.25))
    g = layer_norm_backward(np.ones_like(y), cache)
    assert np.array_equal(g["x"], np.zeros_like(x)) and g["bias"][0] == 4.0 and g["weight"][0] == 0.0
    x1 = np.random.default_rng(12).standard_normal((2, 1, 3))
    y1, c1 = instance_norm_forward(x1)
    assert np.array_equal(y1, np.zeros_like(x1))
    assert np.all(np.isfinite(instance_norm_backward(np.ones_like(y1), c1)["x"]))
    assert rope(np.ones((2, 1, 2))).shape == (2, 1, 2)
