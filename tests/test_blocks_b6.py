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


# --------------------------------------------------------------------------------------------
# Deep Delta residual and the depth-wise read


def _fd(f, arrays, dout, eps=1e-6):
    out = {}
    for name, a in arrays.items():
        g = np.zeros_like(a)
        for i in np.ndindex(a.shape):
            old = a[i]
            a[i] = old + eps
            fp = np.sum(f() * dout)
            a[i] = old - eps
            fm = np.sum(f() * dout)
            a[i] = old
            g[i] = (fp - fm) / (2 * eps)
        out[name] = g
    return out


def test_depth_window_attention_brute_force_and_gradients():
    from refattn.blocks.deep_delta import depth_window_attention_backward, depth_window_attention_forward

    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, 5, 3)) for _ in range(3))
    for w in (1, 2, 3, 7):
        h, cache = depth_window_attention_forward(q, k, v, window=w)
        want = np.zeros_like(h)
        for b in range(2):
            for layer in range(5):
                js = list(range(max(0, layer - w + 1), layer + 1))
                s = np.array([q[b, layer] @ k[b, j] / np.sqrt(3) for j in js])
                a = np.exp(s - s.max())
                want[b, layer] = (a / a.sum()) @ v[b, js]
        np.testing.assert_allclose(h, want, rtol=1e-12, atol=1e-14)
    dh = rng.standard_normal(h.shape)
    h, cache = depth_window_attention_forward(q, k, v, window=2)
    g = depth_window_attention_backward(dh, cache)
    fd = _fd(lambda: depth_window_attention_forward(q, k, v, window=2)[0], {"q": q, "k": k, "v": v}, dh)
    for n in fd:
        np.testing.assert_allclose(g[n], fd[n], rtol=1e-6, atol=1e-8, err_msg=n)
    with pytest.raises(ValueError, match="window"):
        depth_window_attention_forward(q, k, v, window=0)


def test_ddl_chained_through_mlp_sublayer():
    # Upstream's Block: c = RMSNorm(x), k = MLP(c), y = DDL(x, k, c). The chain's gradient
    # (DDL backward -> MLP and RMSNorm VJPs) against finite differences.
    from refattn.blocks.deep_delta import deep_delta_residual_backward, deep_delta_residual_forward
    from refattn.nn.norms import rms_norm_backward, rms_norm_forward

    rng = np.random.default_rng(4)
    c = 4
    x = rng.standard_normal((2, 3, c))
    w1, w2 = rng.standard_normal((c, 5)) / 2, rng.standard_normal((5, c)) / 2
    p = {"beta.weight": rng.standard_normal((c, 1)), "beta.bias": np.array([0.2]),
         "v_proj.weight": rng.standard_normal((c, 1)), "v_proj.bias": np.array([-0.1])}
    nw = 1.0 + 0.1 * rng.standard_normal(c)

    def run():
        cn, cc = rms_norm_forward(x, {"weight": nw})
        hid = np.tanh(cn @ w1)
        y, cd = deep_delta_residual_forward(x, hid @ w2, cn, p)
        return y, (cc, cn, hid, cd)

    y, (cc, cn, hid, cd) = run()
    dy = rng.standard_normal(y.shape)
    g = deep_delta_residual_backward(dy, cd)
    dhid = (g["k"] @ w2.T) * (1 - hid ** 2)
    dcn = g["context"] + dhid @ w1.T
    dx = g["x"] + rms_norm_backward(dcn, cc)["x"]
    fd = _fd(lambda: run()[0], {"x": x}, dy)
    np.testing.assert_allclose(dx, fd["x"], rtol=1e-6, atol=1e-8)


# --------------------------------------------------------------------------------------------
# PartialFormer


def test_partialformer_expanded_heads_fd_and_errors():
    from refattn.blocks.partialformer import (
        partialformer_attention_backward,
        partialformer_attention_forward,
    )

    rng = np.random.default_rng(5)
    c, h, e, r = 4, 2, 3, 1
    d = c // h
    p = {}
    for pr in ("q_proj", "k_proj", "v_proj", "u_proj"):
        p[f"{pr}.weight"] = rng.standard_normal((c, e * d)) / 2
        p[f"{pr}.bias"] = 0.2 * rng.standard_normal(e * d) + (0.5 if pr == "u_proj" else 0.0)
    p["ff1.weight"], p["ff1.bias"] = rng.standard_normal((d, r * d)), 0.1 * rng.standard_normal(r * d)
    p["ff2.weight"], p["ff2.bias"] = rng.standard_normal((r * d, d)), 0.1 * rng.standard_normal(d)
    p["out_proj.weight"], p["out_proj.bias"] = rng.standard_normal((e * d, c)) / 2, np.zeros(c)
    x = rng.standard_normal((2, 3, c))
    y, cache = partialformer_attention_forward(x, p, num_heads=h, expand_heads=e, activation="gelu")
    assert y.shape == x.shape
    dy = rng.standard_normal(y.shape)
    g = partialformer_attention_backward(dy, cache)
    arrays = {"x": x, "ff1.weight": p["ff1.weight"], "q_proj.weight": p["q_proj.weight"]}
    fd = _fd(lambda: partialformer_attention_forward(x, p, num_heads=h, expand_heads=e, activation="gelu")[0],
             arrays, dy)
    for n in fd:
        np.testing.assert_allclose(g[n], fd[n], rtol=1e-6, atol=1e-8, err_msg=n)
    with pytest.raises(ValueError, match="num_heads"):
        partialformer_attention_forward(rng.standard_normal((2, 3, 5)), p, num_heads=2)
    with pytest.raises(ValueError, match="attn_before"):
        partialformer_attention_forward(x, p, np.zeros((2, 2, 3, 3)), num_heads=h, expand_heads=e)
