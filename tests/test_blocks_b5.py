"""Slice B5 of family 5 (residual/linear): tests the registry cannot express."""

import numpy as np
import pytest

from refattn.blocks.denseformer import (
    denseformer_dwa_backward,
    denseformer_dwa_forward,
    denseformer_dwa_init,
    dwa_read_indices,
)

# --------------------------------------------------------------------------------------------
# DenseFormer


def test_dwa_read_indices_match_brute_force():
    # Brute force: depths j <= i+1 congruent to i+1 modulo the dilation, for averaging blocks only.
    for k in (1, 2, 3, 4):
        for per in (1, 2, 5):
            for i in range(12):
                want = None if (i + 1) % per else [j for j in range(i + 2) if j % k == (i + 1) % k]
                assert dwa_read_indices(i, k, per) == want


def test_dwa_with_attention_blocks_and_custom_pair():
    from refattn.blocks.core import add_prefix, init_attention_params

    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4, 4))
    for block in ("multi_head_attention", "diff_attention_v1"):
        p = denseformer_dwa_init(3)
        for i in range(3):
            ap, cfg = init_attention_params(rng, block, 4, 1)
            p.update(add_prefix(ap, f"blocks.{i}"))
        y, cache = denseformer_dwa_forward(x, p, n_blocks=3, block=block, block_config=cfg)
        g = denseformer_dwa_backward(np.ones_like(y), cache)
        assert y.shape == x.shape and set(g) == set(p) | {"x"}


def test_dwa_errors():
    x = np.zeros((2, 3, 2))
    with pytest.raises(ValueError, match="dwa_modules.alphas.1.weight"):
        denseformer_dwa_forward(x, {"dwa_modules.alphas.0.weight": np.ones((1, 2))}, n_blocks=2,
                                block=(lambda x, params: (x, None), lambda d, c: {"x": d}))
    with pytest.raises(ValueError, match="dilation"):
        denseformer_dwa_init(3, dilation=0)
    with pytest.raises(ValueError, match="shape"):
        denseformer_dwa_forward(x, {"dwa_modules.alphas.0.weight": np.ones((1, 3))}, n_blocks=1,
                                block=(lambda x, params: (x, None), lambda d, c: {"x": d}))


# --------------------------------------------------------------------------------------------
# Low-rank factorised linear


def test_low_rank_torch_parity():
    torch = pytest.importorskip("torch")
    from refattn.blocks.low_rank_linear import low_rank_linear_backward, low_rank_linear_forward

    rng = np.random.default_rng(1)
    enc, dec = torch.nn.Linear(5, 2, bias=False).double(), torch.nn.Linear(2, 4).double()
    x = rng.standard_normal((2, 3, 5))
    xt = torch.tensor(x, requires_grad=True)
    y = dec(enc(xt))
    dy = rng.standard_normal(y.shape)
    y.backward(torch.tensor(dy))
    p = {"led_unit.0.weight": enc.weight.detach().numpy().T, "led_unit.1.weight": dec.weight.detach().numpy().T,
         "led_unit.1.bias": dec.bias.detach().numpy()}
    yr, cache = low_rank_linear_forward(x, p)
    g = low_rank_linear_backward(dy, cache)
    assert np.allclose(yr, y.detach().numpy(), atol=1e-14)
    assert np.allclose(g["x"], xt.grad.numpy(), atol=1e-14)
    assert np.allclose(g["led_unit.0.weight"], enc.weight.grad.numpy().T, atol=1e-14)
    assert np.allclose(g["led_unit.1.weight"], dec.weight.grad.numpy().T, atol=1e-14)


def test_low_rank_errors():
    from refattn.blocks.low_rank_linear import low_rank_from_dense, low_rank_linear

    p = {"led_unit.0.weight": np.ones((3, 2)), "led_unit.1.weight": np.ones((2, 4))}
    with pytest.raises(ValueError, match=r"led_unit\.0\.weight"):
        low_rank_linear(np.ones((2, 5)), p)
    with pytest.raises(ValueError, match="rank"):
        low_rank_from_dense(np.ones((3, 4)), 4)
    with pytest.raises(ValueError, match="led_unit.1.weight"):
        low_rank_linear(np.ones((2, 3)), {"led_unit.0.weight": np.ones((3, 2))})


# --------------------------------------------------------------------------------------------
# DeLighT DExTra


def test_dextra_group_linear_is_block_diagonal():
    # With one GLT group count forced to 1 (max_glt_groups=1) every layer is a dense Linear; the
    # result must equal the explicit reference, and the group count must drive the weight shapes.
    from refattn.blocks.delight import _random_params, _reference, dextra, dextra_config

    rng = np.random.default_rng(3)
    kw = {"in_proj_features": 4, "out_features": 4, "width_multiplier": 1.0, "dextra_depth": 2, "max_glt_groups": 1}
    p = _random_params(rng, 4, kw)
    assert p["dextra_layers.0.weights"].ndim == 2
    x = rng.standard_normal((2, 3, 4))
    assert np.abs(dextra(x, p, **kw) - _reference(x, p, **kw)).max() < 1e-12
    assert dextra_config(4, 4, 4, dextra_depth=2, max_glt_groups=1)["groups"] == [1, 1]


def test_dextra_errors():
    from refattn.blocks.delight import _random_params, dextra

    rng = np.random.default_rng(4)
    kw = {"in_proj_features": 4, "out_features": 4, "width_multiplier": 1.0, "dextra_depth": 3, "max_glt_groups": 4}
    p = _random_params(rng, 8, kw)
    with pytest.raises(ValueError, match="in_features"):
        dextra(np.ones((2, 6)), p, **kw)
    with pytest.raises(ValueError, match="dextra_depth"):
        dextra(np.ones((2, 8)), p, **dict(kw, dextra_depth=1))
    bad = dict(p)
    bad["dextra_layers.1.weights"] = bad["dextra_layers.1.weights"][:1]
    with pytest.raises(ValueError, match="dextra_layers.1.weights"):
        dextra(np.ones((2, 8)), bad, **kw)


# --------------------------------------------------------------------------------------------
# LMU token mixer


def test_lmu_convolution_equals_fft_and_recurrence():
    # The memory's convolution form (Toeplitz), an FFT convolution (upstream's route) and the
    # recurrence agree.
    from refattn.blocks.lmu import legendre_state_space, lmu_impulse_response

    rng = np.random.default_rng(5)
    q, n, theta = 6, 20, 7.0
    u = rng.standard_normal(n)
    h = lmu_impulse_response(q, theta, n)
    conv = np.array([sum(h[t - s] * u[s] for s in range(t + 1)) for t in range(n)])
    fu, fh = np.fft.rfft(u, 2 * n), np.fft.rfft(h, 2 * n, axis=0)
    fft = np.fft.irfft(fu[:, None] * fh, 2 * n, axis=0)[:n]
    a, b = legendre_state_space(q, theta)
    m, rec = np.zeros(q), []
    for t in range(n):
        m = a @ m + b[:, 0] * u[t]
        rec.append(m)
    assert np.abs(conv - fft).max() < 1e-12 and np.abs(conv - np.array(rec)).max() < 1e-12


def test_lmu_errors():
    from refattn.blocks.lmu import _random_params, lmu_token_mixer

    p = _random_params(np.random.default_rng(6), 3, 3, 3)
    with pytest.raises(ValueError, match=r"\(B, C, N\)"):
        lmu_token_mixer(np.ones((2, 3, 4, 1)), p)
    with pytest.raises(ValueError, match="lmu.W_h.weight"):
        lmu_token_mixer(np.ones((2, 6, 4)), p)
    with pytest.raises(ValueError, match="theta"):
        lmu_token_mixer(np.ones((2, 3, 4)), p, theta=0.0)


# --------------------------------------------------------------------------------------------
# NuTime


def test_nutime_scale_weights_brute_force():
    # alpha from the formula, scalar by scalar, against the forward's cache.
    from refattn.blocks.nutime import multiscale_embedding_forward, nutime_scales

    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 5)) * 30
    p = {"ws": rng.uniform(-1, 1, (5, 3)), "bs": rng.uniform(-1, 1, (5, 3))}
    _, cache = multiscale_embedding_forward(x, p, base=10.0)
    s = nutime_scales(5, 10.0)
    for idx in np.ndindex(*x.shape):
        r = 1.0 / (np.abs(np.log(np.abs(x[idx]) / s + 1e-6)) + 1e-6)
        assert np.allclose(cache["alpha"][idx], r / r.sum(), rtol=1e-13, atol=0)


def test_nutime_window_errors():
    from refattn.blocks.nutime import _window_sample, nutime_window_embedding

    s = _window_sample(np.random.default_rng(8))
    with pytest.raises(ValueError, match="multiple of window_size"):
        nutime_window_embedding(s.inputs["x"][..., :-1], s.params, window_size=4)
    with pytest.raises(ValueError, match="window_embedding.weight"):
        nutime_window_embedding(s.inputs["x"], s.params, window_size=2)
    with pytest.raises(ValueError, match=r"\(K, D\)"):
        from refattn.blocks.nutime import multiscale_embedding
        multiscale_embedding(np.ones(3), {"ws": np.ones(3), "bs": np.ones(3)})


# --------------------------------------------------------------------------------------------
# Shallow FFN attention replacement


def test_shallow_ffn_as_block_attention():
    # The substitute is a token mixer: a block takes it as its attention (ELR-style use).
    from refattn.blocks.layerscale import layerscale_block_backward, layerscale_block_forward
    from refattn.blocks.shallow_ffn import _random_params, shallow_ffn_mixer_backward, shallow_ffn_mixer_forward

    rng = np.random.default_rng(9)
    c, n = 3, 4
    p = {"gamma_1": np.full(c, 0.5), "gamma_2": np.full(c, 0.5), "norm1.weight": np.ones(c), "norm1.bias": np.zeros(c),
         "norm2.weight": np.ones(c), "norm2.bias": np.zeros(c), "mlp.fc1.weight": rng.standard_normal((c, 5)),
         "mlp.fc2.weight": rng.standard_normal((5, c))}
    p.update({f"attn.{k}": v for k, v in _random_params(rng, 5 * c, 4).items()})
    x = rng.standard_normal((2, n, c))
    y, cache = layerscale_block_forward(x, p, attention=(shallow_ffn_mixer_forward, shallow_ffn_mixer_backward),
                                        attention_config={"max_len": 5})
    g = layerscale_block_backward(np.ones_like(y), cache)
    assert set(g) == set(p) | {"x"}


def test_shallow_ffn_errors():
    from refattn.blocks.shallow_ffn import _random_params, shallow_ffn_mixer

    p = _random_params(np.random.default_rng(10), 6, 2)
    with pytest.raises(ValueError, match="max_len"):
        shallow_ffn_mixer(np.ones((2, 4, 2)), p, max_len=3)
    with pytest.raises(ValueError, match="mask"):
        shallow_ffn_mixer(np.ones((2, 3, 2)), p, max_len=3, mask=np.ones((2, 2), bool))
    with pytest.raises(ValueError, match="layers.0.weight"):
        shallow_ffn_mixer(np.ones((2, 3, 2)), p, max_len=4)
