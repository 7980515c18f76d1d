"""Slice B7 of family 5 (T3 blocks): tests the registry cannot express."""

import numpy as np
import pytest

from refattn.blocks.deepscalelm import (
    deepscalelm_block_backward,
    deepscalelm_block_forward,
    deepscalelm_gains,
    deepscalelm_init,
)

# --------------------------------------------------------------------------------------------
# DeepScaleLM


@pytest.mark.parametrize("pos", ["pre", "post"])
def test_deepscalelm_matches_torch_functional(pos):
    # The two residual steps written with torch (F.layer_norm, scaled_dot_product_attention,
    # autograd): forward and every gradient in float64.
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(3)
    c, f, h, n = 8, 12, 2, 4
    p, acfg = deepscalelm_init(rng, c, f, num_heads=h)
    p = {k: v + 0.3 * rng.standard_normal(v.shape) for k, v in p.items()}
    x = rng.standard_normal((2, n, c))
    y, cache = deepscalelm_block_forward(x, p, num_layers=24, norm_position=pos, attention_config=acfg)
    dy = rng.standard_normal(y.shape)
    g = deepscalelm_block_backward(dy, cache)
    t = {k: torch.tensor(v, requires_grad=True) for k, v in p.items()}
    tx = torch.tensor(x, requires_grad=True)
    lam, b = deepscalelm_gains(24)

    def ln(z, name):
        return F.layer_norm(z, (c,), t[f"{name}.weight"], t[f"{name}.bias"], 1e-5)

    def att(z):
        q, k, v = (z @ t[f"attn.{m}_proj"] + t[f"attn.{m}_proj_bias"] for m in "qkv")
        sh = lambda a: a.reshape(2, n, h, c // h).transpose(1, 2)  # noqa: E731
        o = F.scaled_dot_product_attention(sh(q), sh(k), sh(v)).transpose(1, 2).reshape(2, n, c)
        return o @ t["attn.out_proj"] + t["attn.out_proj_bias"]

    def mlp(z):
        return torch.relu(z @ t["mlp.fc1.weight"] + t["mlp.fc1.bias"]) @ t["mlp.fc2.weight"] + t["mlp.fc2.bias"]

    if pos == "pre":
        u = lam * tx + b * att(ln(tx, "norm1"))
        ty = lam * u + b * mlp(ln(u, "norm2"))
    else:
        u = ln(lam * tx + b * att(tx), "norm1")
        ty = ln(lam * u + b * mlp(u), "norm2")
    ty.backward(torch.tensor(dy))
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(g["x"], tx.grad.numpy(), rtol=1e-12, atol=1e-13)
    for k in p:
        np.testing.assert_allclose(g[k], t[k].grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=k)


def test_deepscalelm_takes_another_attention():
    # The block chains through Diff V1 as well as MHA: FD check of dx with Diff attention.
    from refattn.blocks.core import add_prefix, init_attention_params

    rng = np.random.default_rng(5)
    c, f = 8, 6
    p, _ = deepscalelm_init(rng, c, f)
    p = {k: v for k, v in p.items() if not k.startswith("attn.")}
    ap, acfg = init_attention_params(rng, "diff_attention_v1", c, 1)
    p.update(add_prefix(ap, "attn"))
    x = rng.standard_normal((2, 3, c))
    cfg = {"beta": 0.4, "attention": "diff_attention_v1", "attention_config": acfg}
    y, cache = deepscalelm_block_forward(x, p, **cfg)
    dy = rng.standard_normal(y.shape)
    dx = deepscalelm_block_backward(dy, cache)["x"]
    e = rng.standard_normal(x.shape)
    h = 1e-6
    fd = (np.sum(dy * deepscalelm_block_forward(x + h * e, p, **cfg)[0])
          - np.sum(dy * deepscalelm_block_forward(x - h * e, p, **cfg)[0])) / (2 * h)
    assert abs(fd - np.sum(dx * e)) < 1e-7 * max(1.0, abs(fd))


def test_deepscalelm_rejects_bad_gains():
    rng = np.random.default_rng(0)
    p, acfg = deepscalelm_init(rng, 4, 4)
    x = rng.standard_normal((2, 3, 4))
    with pytest.raises(ValueError, match="k must be <= num_layers"):
        deepscalelm_gains(1, k=2.0)
    with pytest.raises(ValueError, match="either num_layers"):
        deepscalelm_block_forward(x, p, num_layers=4, beta=0.5, attention_config=acfg)
    with pytest.raises(ValueError, match="num_layers .* or beta"):
        deepscalelm_block_forward(x, p, attention_config=acfg)
    with pytest.raises(ValueError, match="beta"):
        deepscalelm_block_forward(x, p, beta=1.5, attention_config=acfg)
    with pytest.raises(ValueError, match="norm_position"):
        deepscalelm_block_forward(x, p, num_layers=4, norm_position="mid", attention_config=acfg)
