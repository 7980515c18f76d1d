"""Mechanism-specific tests of slice S9 of the softmax family (refattn/attention/softmax/co4.py).

Generic checks (FD gradcheck, directional, reference, dtype, bad input) are generated from the
registry; here: the top-k selection against brute force, PyTorch-autograd parity with a
transcription of the Co4 laws written from the formulas on docs/softmax/s9.md (torch.topk and
scatter, as the official layer uses them), and argument errors.
"""

from __future__ import annotations

import numpy as np
import pytest

from refattn import registry
from refattn.attention.softmax import co4 as CO4


def _sample(seed, size="small"):
    return registry.get("triadic_modulation_co4").sample(np.random.default_rng(seed), size)


@pytest.mark.parametrize("seed", range(3))
def test_selection_matches_brute_force(seed):
    s = _sample(seed)
    x, p, cfg = s.inputs["x"], s.params, s.config
    _, cache = CO4.co4_attention_forward(x, p, **cfg)
    for name, m in zip(("iq", "ik", "iv"), CO4.co4_modulate(cache["q"], cache["k"], cache["v"])):
        idx = cache[name]
        for b, h, j in np.ndindex(m.shape[0], m.shape[1], m.shape[3]):
            col = m[b, h, :, j]
            want = sorted(range(col.size), key=lambda i, col=col: -col[i])[:cfg["top_k"]]
            assert list(idx[b, h, :, j]) == want, (name, b, h, j)


def _torch_co4(torch, x, w, bias, nh, k):
    # Transcription of the laws (docs/softmax/s9.md), per head, with torch.topk / scatter.
    b, n, c = x.shape
    qkv = x @ w + (bias if bias is not None else 0.0)
    q, k_, v = (t.reshape(b, n, nh, c // nh).transpose(1, 2) for t in qkv.split(c, dim=-1))
    q0, k0, v0 = q[:, :, :1], k_[:, :, :1], v[:, :, :1]
    qp, kp, vp = q[:, :, 1:], k_[:, :, 1:], v[:, :, 1:]
    mq, mk = q0 * kp + qp, k0 * qp + kp
    mv = vp ** 2 + 2 * vp + q0 * k0 * (1 + v0.abs())
    qs, _ = mq.topk(k, dim=2)
    ks, _ = mk.topk(k, dim=2)
    vs, iv = mv.topk(k, dim=2)
    qa, ka, va = torch.cat([q0, qs], 2), torch.cat([k0, ks], 2), torch.cat([v0, vs], 2)
    o = torch.softmax(qa @ ka.transpose(-1, -2) * (c // nh) ** -0.5, dim=-1) @ va
    yp = mv + torch.zeros_like(mv).scatter(2, iv, o[:, :, 1:])
    return torch.cat([o[:, :, :1], yp], 2).transpose(1, 2).reshape(b, n, c)


@pytest.mark.parametrize("seed", range(2))
@pytest.mark.parametrize("size", ["tiny", "small"])
def test_torch_autograd_parity(seed, size):
    torch = pytest.importorskip("torch")
    s = _sample(seed, size)
    x, p, cfg = s.inputs["x"], s.params, s.config
    y, cache = CO4.co4_attention_forward(x, p, **cfg)
    g = np.random.default_rng(seed + 10).standard_normal(y.shape)
    grads = CO4.co4_attention_backward(g, cache)
    xt = torch.tensor(x, requires_grad=True)
    wt = torch.tensor(p["qkv.weight"], requires_grad=True)
    bt = torch.tensor(p["qkv.bias"], requires_grad=True) if "qkv.bias" in p else None
    yt = _torch_co4(torch, xt, wt, bt, cfg["num_heads"], cfg["top_k"])
    assert np.allclose(yt.detach().numpy(), y, atol=1e-12, rtol=1e-12)
    (yt * torch.tensor(g)).sum().backward()
    assert np.allclose(xt.grad.numpy(), grads["x"], atol=1e-11, rtol=1e-10)
    assert np.allclose(wt.grad.numpy(), grads["qkv.weight"], atol=1e-11, rtol=1e-10)
    if bt is not None:
        assert np.allclose(bt.grad.numpy(), grads["qkv.bias"], atol=1e-11, rtol=1e-10)


def test_argument_errors():
    s = _sample(0, "tiny")
    x, p = s.inputs["x"], s.params
    with pytest.raises(ValueError, match="top_k"):
        CO4.co4_attention_forward(x, p, top_k=x.shape[1])
    with pytest.raises(ValueError, match="num_heads"):
        CO4.co4_attention_forward(x, p, num_heads=3)
    with pytest.raises(ValueError, match=r"qkv.weight"):
        CO4.co4_attention_forward(x, {"qkv.weight": p["qkv.weight"].T}, top_k=2)
    with pytest.raises(TypeError, match="top_k"):
        CO4.co4_attention_forward(x, p, top_k=2.0)


# ------------------------------------------------------------------------------ Converter

from refattn.attention.softmax import converter as CV  # noqa: E402


def _csample(seed, size="tiny", **config):
    return registry.get("converter_digraph_convolution").sample(np.random.default_rng(seed), size, **config)


@pytest.mark.parametrize("stage", ["upper", "lower"])
def test_dhhp_stage_vjp_matches_torch_autograd(stage):
    # The stage recurrences transcribed in torch (complex128 autograd) against the hand-written VJPs.
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    b, n, d = 2, 5, 3
    co = [np.exp(1j * rng.standard_normal((b, n - 1))) * rng.uniform(0.5, 1.5, (b, n - 1)) for _ in range(4)]
    x = rng.standard_normal((b, n, d)) + 1j * rng.standard_normal((b, n, d))
    g = rng.standard_normal((b, n, d)) + 1j * rng.standard_normal((b, n, d))
    fwd, vjp = (CV.dhhp_upper, CV.dhhp_upper_vjp) if stage == "upper" else (CV.dhhp_lower, CV.dhhp_lower_vjp)
    out, state = fwd(x, *co)
    gx, gco = vjp(g, x, state, *co)
    xt = torch.tensor(x, requires_grad=True)
    ct = [torch.tensor(c, requires_grad=True) for c in co]
    ii, ij, ji, jj = ct
    if stage == "upper":
        h = [torch.zeros_like(xt[:, 0])]
        for t in range(n - 2, -1, -1):
            h.insert(0, ii[:, t, None] * xt[:, t] + ij[:, t, None] * h[0])
        rows = [h[0]] + [ji[:, t - 1, None] * xt[:, t - 1] + jj[:, t - 1, None] * h[t] for t in range(1, n)]
    else:
        lv = [torch.zeros_like(xt[:, 0])]
        for t in range(1, n):
            lv.append(ji[:, t - 1, None] * lv[-1] + jj[:, t - 1, None] * xt[:, t])
        rows = [ii[:, t, None] * lv[t] + ij[:, t, None] * xt[:, t + 1] for t in range(n - 1)] + [lv[-1]]
    yt = torch.stack(rows, 1)
    np.testing.assert_allclose(yt.detach().numpy(), out, atol=1e-13)
    (yt * torch.tensor(g).conj()).real.sum().backward()   # L = Re<g, y>: torch's grad is then g-bar convention
    np.testing.assert_allclose(xt.grad.numpy(), gx, atol=1e-12)
    for c, gc in zip(ct, gco):
        np.testing.assert_allclose(c.grad.numpy(), gc, atol=1e-12)


def test_permutation_is_upstream_reshuffle():
    # permutation_dim M: token q*M + m moves to position m*(N/M) + q, and back at the end.
    n, m = 6, 2
    perm, inv = CV._permutation(n, m)
    x = np.arange(n)
    want = x.reshape(n // m, m).T.reshape(-1)
    assert list(x[perm]) == list(want)
    assert list(x[perm][inv]) == list(x)


def test_kpm_damping_values():
    k = 3
    np.testing.assert_allclose(CV.kpm_damping("fejer", k), [1, 0.75, 0.5, 0.25])
    np.testing.assert_allclose(CV.kpm_damping("none", k), np.ones(4))
    lz = CV.kpm_damping("lanczos", k, mu=3)
    np.testing.assert_allclose(lz[1:], (np.sin(np.pi * np.arange(1, 4) / 4) / (np.pi * np.arange(1, 4) / 4)) ** 3)
    with pytest.raises(ValueError, match="kernel_type"):
        CV.kpm_damping("vekic", k)


def test_converter_argument_errors():
    s = _csample(0)
    x, p = s.inputs["x"], s.params
    with pytest.raises(ValueError, match="permutation_dim"):
        CV.converter_block_forward(x, p, permutation_dim=3)
    with pytest.raises(ValueError, match="at least 2 tokens"):
        CV.converter_block_forward(x[:, :1], p)
    with pytest.raises(ValueError, match="cheb_coef"):
        CV.converter_block_forward(x, dict(p, **{"kernelution.seq_kernel_poly.cheb_coef": np.zeros((3, 3))}))
    with pytest.raises(ValueError, match="kernel_type"):
        CV.converter_block_forward(x, p, kernel_type="vekic")
