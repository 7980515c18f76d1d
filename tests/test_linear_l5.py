"""Slice L5 of the linear family (long convolutions and memory): what the registry cannot express."""

import numpy as np
import pytest

from refattn.attention.linear.hyena import (
    causal_fft_conv,
    hyena_modulation_deltas,
    hyena_operator,
    hyena_operator_backward,
    hyena_operator_forward,
    hyena_positional_embedding,
    init_hyena_operator_params,
)


def _hyena(rng, D=3, L=6, l_max=8, order=2):
    p = init_hyena_operator_params(rng, D, l_max, order=order, filter_order=4)
    return rng.standard_normal((2, L, D)), p


def test_hyena_positional_embedding_formula():
    z = hyena_positional_embedding(10, 5)[0]
    t = np.arange(10)
    f = np.array([1e-4, 1.0])
    assert z.shape == (10, 5)
    np.testing.assert_allclose(z[:, 0], t / 9)
    np.testing.assert_allclose(z[:, 1:3], np.cos(2 * np.pi * f * t[:, None] / 10), atol=1e-15)
    np.testing.assert_allclose(z[:, 3:5], -np.sin(2 * np.pi * f * t[:, None] / 10), atol=1e-15)
    with pytest.raises(ValueError, match="emb_dim"):
        hyena_positional_embedding(10, 4)


def test_hyena_modulation_decays_are_upstream_range():
    d = hyena_modulation_deltas(5)
    np.testing.assert_allclose([d[0], d[-1]], [np.log(1e-2) / 1.5, np.log(1e-2) / 0.3])


def test_hyena_impulse_response_is_the_filter():
    """A unit impulse in the gated value passes the long filter unchanged: check the conv by a delta."""
    rng = np.random.default_rng(0)
    h = rng.standard_normal((3, 7))
    w = np.zeros((1, 3, 7))
    w[..., 0] = 1.0
    np.testing.assert_allclose(causal_fft_conv(h, w)[0], h, atol=1e-14)
    w = np.zeros((1, 3, 7))
    w[..., 2] = 1.0
    np.testing.assert_allclose(causal_fft_conv(h, w)[0], np.pad(h[:, :5], ((0, 0), (2, 0))), atol=1e-14)


def test_hyena_shorter_sequence_uses_first_filter_rows():
    """L < L_max: the result depends only on the first L rows of z (their gradient is zero beyond)."""
    rng = np.random.default_rng(1)
    u, p = _hyena(rng)
    y, cache = hyena_operator_forward(u, p)
    g = hyena_operator_backward(np.ones_like(y), cache)
    assert np.all(g["filter_fn.pos_emb.z"][0, 6:] == 0)
    p2 = dict(p)
    p2["filter_fn.pos_emb.z"] = p["filter_fn.pos_emb.z"].copy()
    p2["filter_fn.pos_emb.z"][0, 6:] += 5.0
    np.testing.assert_array_equal(hyena_operator(u, p2), y)


def test_hyena_float32_and_bad_inputs():
    rng = np.random.default_rng(2)
    u, p = _hyena(rng)
    y32 = hyena_operator(u.astype(np.float32), p)
    assert y32.dtype == np.float32
    np.testing.assert_allclose(y32, hyena_operator(u, p), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="L_max"):
        hyena_operator(rng.standard_normal((2, 9, 3)), p)
    with pytest.raises(ValueError, match="in_proj.weight"):
        hyena_operator(u, p, order=3)
    bad = dict(p)
    del bad["filter_fn.implicit_filter.1.freq"]
    with pytest.raises(ValueError, match="freq"):
        hyena_operator(u, bad)
    with pytest.raises(ValueError, match="order"):
        hyena_operator(u, p, order=1)


def _lh(rng, D=4, S=2, G=4, L=9):
    ang, rad = rng.uniform(0.2, 2.5, (G, S)), rng.uniform(0.5, 0.95, (G, S))
    p = {"short_filter_weight": rng.standard_normal((3 * D, 1, 3)), "short_filter_bias": rng.standard_normal(3 * D),
         "D": rng.standard_normal(D), "residues": rng.standard_normal((G, S, 1, 2)),
         "poles": np.stack([rad * np.cos(ang), rad * np.sin(ang)], axis=-1)[:, :, None, :]}
    return rng.standard_normal((2, L, 3 * D)), p


def test_laughing_hyena_single_mode_filter_is_geometric():
    """One real mode lambda=r, residue c: h_t = c r^t exactly (the SSM impulse response)."""
    from refattn.attention.linear.laughing_hyena import modal_filter

    poles = np.array([[[[0.7, 0.0]]]])
    res = np.array([[[[2.0, 0.5]]]])
    np.testing.assert_allclose(modal_filter(poles, res, 6)[0], 2.0 * 0.7 ** np.arange(6), atol=1e-15)


def test_laughing_hyena_recurrence_float32_and_errors():
    from refattn.attention.linear.laughing_hyena import laughing_hyena, modal_ssm_recurrent

    rng = np.random.default_rng(3)
    u, p = _lh(rng, G=1)
    y = laughing_hyena(u, p, num_heads=2)
    np.testing.assert_allclose(modal_ssm_recurrent(u, p, num_heads=2), y, atol=1e-12)
    y32 = laughing_hyena(u.astype(np.float32), p, num_heads=2)
    assert y32.dtype == np.float32
    np.testing.assert_allclose(y32, y, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="3\\*hidden_size"):
        laughing_hyena(u[..., :-1], p)
    with pytest.raises(ValueError, match="num_heads"):
        laughing_hyena(u, p, num_heads=3)
    bad = dict(p, poles=p["poles"][:, :1])
    with pytest.raises(ValueError, match="residues"):
        laughing_hyena(u, bad)
    bad = dict(p, poles=np.concatenate([p["poles"]] * 2))
    with pytest.raises(ValueError, match="poles"):
        laughing_hyena(u, dict(bad, residues=bad["poles"]))


def test_stack_attention_errors_and_float32():
    from refattn.attention.linear.stack_attention import stack_attention_forward

    rng = np.random.default_rng(4)
    p = {"action_layer.linear.weight": rng.standard_normal((3, 3)),
         "input_to_pushed_vector_layer.linear.weight": rng.standard_normal((3, 2)),
         "stack_reading_to_output_layer.linear.weight": rng.standard_normal((2, 3))}
    x = rng.standard_normal((2, 6, 3))
    y = stack_attention_forward(x, p)[0]
    y32 = stack_attention_forward(x.astype(np.float32), p)[0]
    assert y32.dtype == np.float32
    np.testing.assert_allclose(y32, y, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="action_layer"):
        stack_attention_forward(x, dict(p, **{"action_layer.linear.weight": np.ones((3, 4))}))
    with pytest.raises(ValueError, match="stack_reading_to_output_layer"):
        stack_attention_forward(x, {k: v for k, v in p.items() if "reading" not in k})


def test_stack_attention_no_push_reads_zero():
    """Without push probability nothing enters the stack: the output is exactly zero."""
    from refattn.attention.linear.stack_attention import superposition_stack_forward

    rng = np.random.default_rng(5)
    a = np.zeros((2, 7, 3))
    a[..., 1:] = rng.dirichlet([1.0, 1.0], (2, 7))
    S = superposition_stack_forward(a, rng.standard_normal((2, 7, 3)))
    assert np.all(S == 0)


def test_titans_errors_float32_and_forgetting():
    from refattn.attention.linear.titans import titans_memory, titans_memory_scan

    rng = np.random.default_rng(6)
    d = 3
    p = {"q_proj.weight": rng.standard_normal((d, 2)), "k_proj.weight": rng.standard_normal((d, 2)),
         "v_proj.weight": rng.standard_normal((d, 2))}
    for g in ("alpha_proj", "eta_proj", "theta_proj"):
        p[g + ".weight"] = rng.standard_normal((d, 1))
        p[g + ".bias"] = np.zeros(1)
    x = rng.standard_normal((2, 5, d))
    y = titans_memory(x, p)
    y32 = titans_memory(x.astype(np.float32), p)
    assert y32.dtype == np.float32
    np.testing.assert_allclose(y32, y, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="eta_proj"):
        titans_memory(x, {k: v for k, v in p.items() if not k.startswith("eta")})
    with pytest.raises(ValueError, match="the same for q and k"):
        titans_memory(x, dict(p, **{"k_proj.weight": np.ones((d, 3))}))
    # alpha = 1 wipes the memory each step: M_t = S_t, and with eta = 0 the memory is one delta step
    q, k, v = (rng.standard_normal((1, 4, 2)) for _ in range(3))
    th = np.full((1, 4), 0.2)
    yy, M, S = titans_memory_scan(q, k, v, np.ones((1, 4)), np.zeros((1, 4)), th)
    np.testing.assert_allclose(M[:, 1:], S[:, 1:])
    np.testing.assert_allclose(M[0, 2], 0.4 * np.outer(v[0, 1], k[0, 1]) - 0.4 * np.outer(M[0, 1] @ k[0, 1], k[0, 1]))


def test_atlas_omega_window_covers_whole_prefix_and_errors():
    from refattn.attention.linear.atlas_omega import atlas_omega, omega_rule_scan

    rng = np.random.default_rng(7)
    B, L = 2, 6
    q, k, v = rng.standard_normal((B, L, 3)), rng.standard_normal((B, L, 3)), rng.standard_normal((B, L, 2))
    al, et, ga = (rng.uniform(0.2, 0.9, (B, L)) for _ in range(3))
    # a window at least as long as the sequence is the same as an infinite window
    np.testing.assert_array_equal(omega_rule_scan(q, k, v, al, et, ga, L)[0], omega_rule_scan(q, k, v, al, et, ga, 99)[0])
    # each step uses exactly the last c tokens: rebuild M_{t+1} from M_t by hand
    c = 2
    _, M = omega_rule_scan(q, k, v, al, et, ga, c)
    for t in range(L):
        G = sum(2 * ga[:, i, None, None] * (np.einsum("bij,bj->bi", M[:, t], k[:, i]) - v[:, i])[:, :, None]
                * k[:, i, None, :] for i in range(max(0, t - c + 1), t + 1))
        np.testing.assert_allclose(M[:, t + 1], al[:, t, None, None] * M[:, t] - et[:, t, None, None] * G, atol=1e-13)
    d = 3
    p = {"q_proj.weight": rng.standard_normal((d, 2)), "k_proj.weight": rng.standard_normal((d, 2)),
         "v_proj.weight": rng.standard_normal((d, 2)), "poly_coeffs": np.array([1.0, 0.2])}
    for g in ("alpha_proj", "eta_proj", "gamma_proj"):
        p[g + ".weight"] = rng.standard_normal((d, 1))
        p[g + ".bias"] = np.zeros(1)
    x = rng.standard_normal((2, 5, d))
    assert atlas_omega(x.astype(np.float32), p).dtype == np.float32
    with pytest.raises(ValueError, match="window"):
        atlas_omega(x, p, window=0)
    with pytest.raises(ValueError, match="poly_coeffs"):
        atlas_omega(x, dict(p, poly_coeffs=np.ones((2, 2))))
