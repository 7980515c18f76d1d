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
