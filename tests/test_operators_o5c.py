"""Operator slice o5c (issue 17, T3): what the registry cannot express.

AROMA: the encoder reads the input function through a softmax average over points, a quadrature of
an integral against the point density: on uniform grids the output converges as the grid is
refined (second order for midpoint grids), and bad arguments raise errors that name them.
"""

from __future__ import annotations

import numpy as np
import pytest

from refattn.operators import aroma_init_params
from refattn.operators.aroma import aroma, aroma_backward, aroma_forward


def _aroma_setup(rng):
    p = aroma_init_params(rng, num_channels=1, input_dim=1, hidden_dim=4, dim=4, num_latents=3,
                          latent_dim=2, latent_heads=2, latent_dim_head=2, cross_heads=2,
                          cross_dim_head=2, scales=(1, 2), mlp_feature_dim=2, depth_inr=1,
                          num_freq=3, depth=1, ff_mult=2)
    cfg = dict(depth=1, num_freq=3, max_pos_encoding_freq=2, scales=(1, 2), cross_heads=2, latent_heads=2)
    return p, cfg


def _grid(n):
    x = (np.arange(n) + 0.5) / n
    return np.sin(2 * np.pi * x)[None, :, None].repeat(2, 0), x[None, :, None].repeat(2, 0)


def test_aroma_grid_refinement_converges():
    rng = np.random.default_rng(0)
    p, cfg = _aroma_setup(rng)
    q = rng.random((2, 4, 1))
    outs = {n: aroma(*_grid(n), q, p, **cfg) for n in (32, 64, 128, 1024)}
    errs = [float(np.abs(outs[n] - outs[1024]).max()) for n in (32, 64, 128)]
    assert errs[0] > 0
    # midpoint quadrature of a smooth periodic integrand: the error falls at least 4x per halving
    assert errs[1] < errs[0] / 3.5 and errs[2] < errs[1] / 3.5, errs


def test_aroma_float32_and_errors():
    rng = np.random.default_rng(1)
    p, cfg = _aroma_setup(rng)
    u, x = _grid(5)
    q = rng.random((2, 3, 1))
    out64 = aroma(u, x, q, p, **cfg)
    out32 = aroma(u.astype(np.float32), x.astype(np.float32), q.astype(np.float32),
                  {k: v.astype(np.float32) for k, v in p.items()}, **cfg)
    assert out32.dtype == np.float32 and np.abs(out32 - out64).max() < 1e-4
    with pytest.raises(ValueError, match="coords"):
        aroma(u, x[:, :4], q, p, **cfg)
    with pytest.raises(ValueError, match="target_coords"):
        aroma(u, x, rng.random((2, 3, 2)), p, **cfg)
    with pytest.raises(ValueError, match="bottleneck_index"):
        aroma(u, x, q, p, **dict(cfg, bottleneck_index=2))
    with pytest.raises(ValueError, match="noise"):
        aroma(u, x, q, p, **dict(cfg, noise=np.zeros((2, 3, 3))))
    with pytest.raises(ValueError, match="latent_heads"):
        aroma(u, x, q, p, **dict(cfg, latent_heads=3))
    with pytest.raises(ValueError, match="norm_k"):
        aroma(u, x, q, p, **dict(cfg, num_freq=4))
    out, cache = aroma_forward(u, x, q, p, **cfg)
    with pytest.raises(ValueError, match="dout"):
        aroma_backward(np.ones((2, 2, 1)), cache)


def test_gnp_layer_converges_under_refinement():
    # One GNP layer on nested uniform 1-D grids with the radius graph of the points: the neighbour
    # mean is a quadrature of the ball average, so the output at the common nodes converges.
    from refattn.operators.gnp import gnp, gnp_init_params, gnp_radius_graph
    rng = np.random.default_rng(2)
    p = gnp_init_params(rng, 1, 2, 1, [2, 2], num_channels=1, neurons=3)
    p["lift.weight"][:] = [[1.0, 0.0]]
    p["lift.bias"][:] = [0.0, 1.0]

    def run(n):
        t = np.linspace(0.0, 1.0, n + 1)
        x = np.sin(2 * np.pi * t)[None, :, None]
        out = gnp(x, t[None, :, None], p, num_channels=1, nonlinearity="Tanh",
                  edge_index=gnp_radius_graph(t[:, None], 0.2 + 0.5 / n))
        return out[0, :, 0][:: n // 8]

    # radius 0.2 is a whole number of grid steps: the discrete ball is the closed ball, and the
    # mean over it is a trapezoid-like rule with first-order end corrections
    ref = run(1280)
    errs = [float(np.abs(run(n) - ref).max()) for n in (40, 80, 160)]
    assert errs[0] > 1e-6
    assert errs[1] < errs[0] / 1.7 and errs[2] < errs[1] / 1.7, errs


def test_gnp_errors():
    from refattn.operators.gnp import gnp, gnp_init_params
    rng = np.random.default_rng(3)
    p = gnp_init_params(rng, 2, 2, 1, [4, 4], num_channels=2, neurons=3)
    x, e = rng.standard_normal((2, 5, 2)), rng.standard_normal((2, 5, 1))
    with pytest.raises(ValueError, match="exactly one"):
        gnp(x, e, p, num_channels=2)
    with pytest.raises(ValueError, match="edge_index"):
        gnp(x, e, p, num_channels=2, edge_index=np.array([[0, 7], [1, 2]]))
    with pytest.raises(ValueError, match="num_channels"):
        gnp(x, e, p, num_channels=3, radius=1.0)
    with pytest.raises(ValueError, match="edge_data"):
        gnp(x, e[:, :4], p, num_channels=2, radius=1.0)


def test_nio_errors_and_sample_mean():
    from refattn.operators.nio import _grid, nio, nio_init_params
    rng = np.random.default_rng(4)
    p = nio_init_params(rng, 3, trunk_neurons=4, trunk_hidden_layers=2, width=3, modes=(2, 2), n_layers=1,
                        fc1_width=4)
    beta = rng.standard_normal((2, 5, 3))
    out = nio(beta, p, grid=_grid(6, 6))
    # the layer only sees the mean of the sample coefficients (the DeepONet is linear in beta)
    mean_only = nio(np.repeat(beta.mean(axis=1, keepdims=True), 3, axis=1), p, grid=_grid(6, 6))
    assert np.abs(out - mean_only).max() < 1e-12
    with pytest.raises(ValueError, match="grid"):
        nio(beta, p, grid=_grid(6, 6)[..., :1])
    with pytest.raises(ValueError, match="trunk.output_layer.weight"):
        nio(beta[..., :2], p, grid=_grid(6, 6))
    with pytest.raises(ValueError, match="modes"):
        nio(beta, p, grid=_grid(2, 2))


def test_vano_linear_decoder_is_linear_in_the_latent_and_errors():
    from refattn.operators.vano import vano_init_params, vano_reconstruct
    rng = np.random.default_rng(5)
    p = vano_init_params(rng, 8, 4, 1, enc_layers=1, enc_hidden=6, dec_layers=2, dec_hidden=5)
    u, y = rng.standard_normal((2, 8)), rng.random((2, 5, 1))
    e1, e2 = rng.standard_normal((2, 4)), rng.standard_normal((2, 4))
    f1, f2, f12 = (vano_reconstruct(u, y, p, noise=e) for e in (e1, e2, e1 + e2))
    f0 = vano_reconstruct(u, y, p, noise=np.zeros((2, 4)))
    # D(mu + sigma(e1 + e2)) = D(mu + sigma e1) + D(mu + sigma e2) - D(mu) for a linear decoder
    assert np.abs(f12 - (f1 + f2 - f0)).max() < 1e-12
    with pytest.raises(ValueError, match="noise"):
        vano_reconstruct(u, y, p, noise=np.zeros((2, 3)))
    with pytest.raises(ValueError, match="decoder"):
        vano_reconstruct(u, y, p, noise=e1, decoder="hash")
    from refattn.operators.vano import vano
    with pytest.raises(ValueError, match="s must have shape"):
        vano(u, y, rng.standard_normal((2, 5, 2)), p, noise=e1)


def test_tno_errors():
    from refattn.operators.tno import _square_complex, tno_init_params, tno_layer
    rng = np.random.default_rng(6)
    d0, d1 = _square_complex()
    p = tno_init_params(rng, 2, 3)
    h0, h1, h2 = rng.standard_normal((2, 4, 2)), rng.standard_normal((2, 5, 2)), rng.standard_normal((2, 2, 2))
    assert tno_layer(h0, h1, h2, p, d0=d0, d1=d1).shape == (2, 11, 3)
    bad = d1.copy()
    bad[0, 3] = 1.0
    with pytest.raises(ValueError, match="d1 @ d0"):
        tno_layer(h0, h1, h2, p, d0=d0, d1=bad)
    with pytest.raises(ValueError, match="d0"):
        tno_layer(h0, h1, h2, p, d0=d0[:4], d1=d1)
    with pytest.raises(ValueError, match="stars"):
        tno_layer(h0, h1, h2, p, d0=d0, d1=d1, stars=(np.ones(4), -np.ones(5), np.ones(2)))
    with pytest.raises(ValueError, match="h1"):
        tno_layer(h0, h1[..., :1], h2, p, d0=d0, d1=d1)


def test_sni_errors_and_zero_steps():
    from refattn.operators.sni import sni, sni_interval_decomposition, sni_pointwise_local_operator
    rng = np.random.default_rng(7)
    subs, bnds, dix = sni_interval_decomposition(9, 2, 1)
    p = {"local.0.weight": rng.standard_normal((2, 3)), "local.0.bias": rng.standard_normal(3),
         "local.2.weight": rng.standard_normal((3, 1)), "local.2.bias": rng.standard_normal(1)}
    f, g = rng.standard_normal((2, 9, 1)), rng.standard_normal((2, 2))
    cfg = dict(subdomains=subs, sub_boundaries=bnds, dirichlet_index=dix, local_operator=sni_pointwise_local_operator())
    u0 = sni(f, g, p, n_iter=0, **cfg)
    assert np.array_equal(u0[:, [0, 8]], g) and not np.any(u0[:, 1:8])
    with pytest.raises(TypeError, match="local_operator"):
        sni(f, g, p, **dict(cfg, local_operator=None))
    with pytest.raises(ValueError, match="subdomains"):
        sni(f, g, p, **dict(cfg, subdomains=[np.array([0, 9])] + subs[1:]))
    with pytest.raises(ValueError, match="g must have shape"):
        sni(f, g[:, :1], p, **cfg)
