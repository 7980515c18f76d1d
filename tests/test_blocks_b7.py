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


# --------------------------------------------------------------------------------------------
# 2-D SSM


def test_ssm2d_kernel_matches_loop_reference():
    # The vectorised kernel (closed-form halving masks) equals the scalar-loop kernel that applies
    # upstream's rule dynamically, with and without the kernel normalisation, for several sides.
    from refattn.blocks.ssm2d import _params, _reference_kernel, ssm_2d_kernel

    rng = np.random.default_rng(2)
    for side in (1, 2, 3, 5):
        p = _params(rng, 2, 4, 1, 2, False, False)
        for kn in (True, False):
            k, _ = ssm_2d_kernel(p, side, kernel_normalization=kn)
            np.testing.assert_allclose(k, _reference_kernel(p, side, kn), rtol=1e-13, atol=1e-14)


def test_ssm2d_normalisation_changes_the_kernel():
    # The halving rule is not a no-op beyond the origin's neighbours (side >= 3).
    from refattn.blocks.ssm2d import _params, ssm_2d_kernel

    p = _params(np.random.default_rng(4), 2, 2, 1, 2, False, False)
    k1, _ = ssm_2d_kernel(p, 3)
    k0, _ = ssm_2d_kernel(p, 3, kernel_normalization=False)
    assert k1[0, 0].tolist() == k0[0, 0].tolist()
    assert np.abs(k1[2, 2] - k0[2, 2]).max() > 1e-3


def test_ssm2d_rejects_bad_input_and_keeps_inputs():
    from refattn.blocks.ssm2d import _params, ssm_2d_backward, ssm_2d_forward

    rng = np.random.default_rng(1)
    p = _params(rng, 2, 4, 1, 2, True, True)
    x = rng.standard_normal((2, 9, 2))
    with pytest.raises(ValueError, match="L = S\\^2"):
        ssm_2d_forward(rng.standard_normal((2, 8, 2)), p, use_residual=True, normalize=True)
    with pytest.raises(ValueError, match="directions"):
        ssm_2d_forward(x, p, directions=3, use_residual=True, normalize=True)
    with pytest.raises(ValueError, match="C_1"):
        ssm_2d_forward(x, dict(p, C_1=np.ones((3, 2))), use_residual=True, normalize=True)
    with pytest.raises(ValueError, match="omega"):
        ssm_2d_forward(x, {k: v for k, v in p.items() if k != "omega"}, use_residual=True, normalize=True)
    x0, p0 = x.copy(), {k: v.copy() for k, v in p.items()}
    y, cache = ssm_2d_forward(x, p, use_residual=True, normalize=True)
    y[...] = 0.0
    ssm_2d_backward(np.ones_like(y), cache)
    np.testing.assert_array_equal(x, x0)
    for k in p:
        np.testing.assert_array_equal(p[k], p0[k])
    np.testing.assert_array_equal(ssm_2d_forward(x, p, use_residual=True, normalize=True)[0],
                                  ssm_2d_forward(x, p, use_residual=True, normalize=True)[0])


# --------------------------------------------------------------------------------------------
# Hybrid Gated Flow


@pytest.mark.parametrize("estimator", ["ste", "fixed"])
def test_hgf_matches_torch_ste(estimator):
    # BitNet b1.58's weight_quant with the straight-through estimator (or the fixed-code
    # derivative) written in torch: forward and every gradient in float64.
    torch = pytest.importorskip("torch")
    from refattn.blocks.hgf import _params, hgf_linear_backward, hgf_linear_forward

    rng = np.random.default_rng(7)
    p = _params(rng, 8, 6, 3)
    x = rng.standard_normal((2, 5, 8))
    y, cache = hgf_linear_forward(x, p, gate_activation="sigmoid", estimator=estimator)
    dy = rng.standard_normal(y.shape)
    g = hgf_linear_backward(dy, cache)
    t = {k: torch.tensor(v, requires_grad=True) for k, v in p.items()}
    tx = torch.tensor(x, requires_grad=True)
    w = t["weight"]
    if estimator == "ste":
        s = 1.0 / w.abs().mean().clamp(min=1e-5)
        w_hat = w + ((w * s).round().clamp(-1, 1) / s - w).detach()
    else:
        gam = w.abs().mean()
        w_hat = gam * (w / gam).round().clamp(-1, 1).detach()
    ty = tx @ w_hat + t["bias"] + torch.sigmoid(t["gate"][0]) * ((tx @ t["lora_A.weight"]) @ t["lora_B.weight"])
    ty.backward(torch.tensor(dy))
    np.testing.assert_allclose(y, ty.detach().numpy(), rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(g["x"], tx.grad.numpy(), rtol=1e-12, atol=1e-13)
    for k in p:
        np.testing.assert_allclose(g[k], t[k].grad.numpy(), rtol=1e-12, atol=1e-13, err_msg=k)


def test_hgf_rejects_bad_input():
    from refattn.blocks.hgf import _params, hgf_linear_forward

    rng = np.random.default_rng(0)
    p = _params(rng, 4, 3, 2)
    x = rng.standard_normal((2, 3, 4))
    with pytest.raises(ValueError, match="C_in"):
        hgf_linear_forward(rng.standard_normal((2, 3, 5)), p)
    with pytest.raises(ValueError, match="estimator"):
        hgf_linear_forward(x, p, estimator="soft")
    with pytest.raises(ValueError, match="lora_B.weight"):
        hgf_linear_forward(x, dict(p, **{"lora_B.weight": np.ones((3, 3))}))
    with pytest.raises(ValueError, match="gate"):
        hgf_linear_forward(x, dict(p, gate=np.ones(2)))
