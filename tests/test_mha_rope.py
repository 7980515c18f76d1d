"""``mha_forward(..., rope=)``: the composed reference of causal MHA with RoPE (issue 18).

Parity with a hand-written HF-LLaMA-style attention in PyTorch float64 (``LlamaAttention``:
q/k/v/o projections without bias, ``LlamaRotaryEmbedding`` with ``rope_theta``, ``rotate_half``,
``repeat_kv``, causal softmax), forward and every gradient through autograd; the same model
through ``compare_implementation``'s ``causal_rope`` case; and the ``rope=`` errors.
"""

from __future__ import annotations

import numpy as np
import pytest

from refattn.attention.softmax.mha import init_mha_params, mha, mha_backward, mha_forward
from refattn.testing import compare_implementation


def _llama_attention(torch, x, wq, wk, wv, wo, *, num_heads, num_kv_heads, theta, position_ids,
                     biases=(None, None, None, None)):
    """HF ``LlamaAttention.forward`` (eager path), written out: weights (out, in) as nn.Linear;
    ``biases`` as ``attention_bias=True``."""
    b, n, _ = x.shape
    d = wq.shape[0] // num_heads

    def lin(t, w, bias):
        return t @ w.T if bias is None else t @ w.T + bias

    q = lin(x, wq, biases[0]).view(b, n, num_heads, d).transpose(1, 2)
    k = lin(x, wk, biases[1]).view(b, n, num_kv_heads, d).transpose(1, 2)
    v = lin(x, wv, biases[2]).view(b, n, num_kv_heads, d).transpose(1, 2)
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    freqs = position_ids[:, :, None].to(torch.float64) * inv_freq          # (b, n, d/2)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos()[:, None], emb.sin()[:, None]                      # unsqueeze_dim=1

    def rotate_half(t):
        t1, t2 = t[..., : t.shape[-1] // 2], t[..., t.shape[-1] // 2:]
        return torch.cat((-t2, t1), dim=-1)

    q = q * cos + rotate_half(q) * sin
    k = k * cos + rotate_half(k) * sin
    rep = num_heads // num_kv_heads                                        # repeat_kv
    k = k[:, :, None].expand(b, num_kv_heads, rep, n, d).reshape(b, num_heads, n, d)
    v = v[:, :, None].expand(b, num_kv_heads, rep, n, d).reshape(b, num_heads, n, d)
    scores = q @ k.transpose(2, 3) / d ** 0.5
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    scores = scores.masked_fill(~causal, float("-inf"))
    o = torch.softmax(scores, dim=-1) @ v
    return lin(o.transpose(1, 2).reshape(b, n, num_heads * d), wo, biases[3])


@pytest.mark.parametrize("num_kv_heads,theta,offset", [(4, 10000.0, 0), (2, 500000.0, 0), (1, 100.0, 7)])
def test_mha_rope_matches_hf_llama_attention_float64(num_kv_heads, theta, offset):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(num_kv_heads)
    b, n, c, h, d = 2, 9, 16, 4, 6
    x = rng.standard_normal((b, n, c))
    p = init_mha_params(rng, c, h, d, num_kv_heads=num_kv_heads, bias=False)
    rope = {"base": theta} | ({"offset": offset} if offset else {})
    y, cache = mha_forward(x, params=p, num_heads=h, num_kv_heads=num_kv_heads, is_causal=True, rope=rope)
    g = rng.standard_normal(y.shape)
    grads = mha_backward(g, cache)

    t = {k: torch.tensor(v.T.copy(), requires_grad=True) for k, v in p.items()}   # nn.Linear (out, in)
    tx = torch.tensor(x, requires_grad=True)
    pos = (torch.arange(n) + offset)[None].expand(b, n)
    ty = _llama_attention(torch, tx, t["q_proj"], t["k_proj"], t["v_proj"], t["out_proj"], num_heads=h,
                          num_kv_heads=num_kv_heads, theta=theta, position_ids=pos)
    ty.backward(torch.tensor(g))
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=0, atol=1e-13)
    np.testing.assert_allclose(grads["x"], tx.grad.numpy(), rtol=0, atol=1e-12)
    for k in p:
        np.testing.assert_allclose(grads[k], t[k].grad.numpy().T, rtol=0, atol=1e-12, err_msg=k)


def test_compare_implementation_causal_rope_case_with_a_llama_style_torch_model():
    torch = pytest.importorskip("torch")

    def fn(x, q_proj, k_proj, v_proj, out_proj, num_heads, num_kv_heads=None, is_causal=False, rope=None,
           q_proj_bias=None, k_proj_bias=None, v_proj_bias=None, out_proj_bias=None):
        assert is_causal and rope is not None and not rope.get("interleaved", False)
        n = x.shape[-2]
        pos = torch.arange(n)[None].expand(x.shape[0], n)
        return _llama_attention(torch, x, q_proj.T, k_proj.T, v_proj.T, out_proj.T, num_heads=num_heads,
                                num_kv_heads=num_kv_heads or num_heads, theta=rope["base"], position_ids=pos,
                                biases=(q_proj_bias, k_proj_bias, v_proj_bias, out_proj_bias))

    def vjp(dout, **kw):
        kw = {k: v.requires_grad_() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
        fn(**kw).backward(dout)
        return {k: v.grad for k, v in kw.items() if isinstance(v, torch.Tensor)}

    conv = torch.from_numpy
    report = compare_implementation(fn, "multi_head_attention", vjp=vjp, cases="causal_rope", convert=conv)
    assert report.passed, str(report)
    # a wrong theta is caught
    wrong = compare_implementation(lambda **kw: fn(**dict(kw, rope={"base": 10000.0})), "multi_head_attention",
                                   cases="causal_rope", convert=conv)
    assert not wrong.passed


def test_rope_option_is_exactly_no_rope_when_none_and_rejects_bad_values():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 8))
    p = init_mha_params(rng, 8, 2, 4)
    assert np.array_equal(mha(x, params=p, num_heads=2, rope=None), mha(x, params=p, num_heads=2))
    assert not np.allclose(mha(x, params=p, num_heads=2, rope=True), mha(x, params=p, num_heads=2))
    with pytest.raises(ValueError, match=r"rope has unknown keys \['theta'\]"):
        mha(x, params=p, num_heads=2, rope={"theta": 1e4})
    with pytest.raises(TypeError, match="rope must be"):
        mha(x, params=p, num_heads=2, rope="llama")
    p3 = init_mha_params(rng, 8, 2, 3)
    with pytest.raises(ValueError, match="rope on the query heads"):
        mha(x, params=p3, num_heads=2, rope=True)   # odd head width: rotary_dim needed
    ctx = rng.standard_normal((2, 7, 8))
    y = mha(x, ctx, p, num_heads=2, rope={"positions": np.arange(5) + 2, "key_positions": np.arange(7)})
    assert y.shape == (2, 5, 8)
