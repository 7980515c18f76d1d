"""Slice L6b of the linear family (MossFormer, 2Mamba, AFA, PDE-SSM, DARTS-GT, Sonnet MVCA): what the
registry cannot express."""

import numpy as np
import pytest

from refattn.attention.linear.mossformer import (
    mossformer_gated_joint_attention_backward,
    mossformer_gated_joint_attention_forward,
    mossformer_joint_attention_explicit,
    mossformer_joint_attention_forward,
)
from refattn.registry import get


def _moss(rng, N=9, C=4):
    s = get("mossformer_gated_joint_attention").sample(rng, "small")
    return rng.standard_normal((2, N, C)), s.params


def test_mossformer_causal_core_ignores_the_future_block_does_not():
    """causal=True: the joint attention core is causal (perturbing tokens from t on leaves its
    outputs before t bit-identical), but the full block is not, as upstream: FFConvM's 'same'-padded
    depthwise convolutions look (k-1)/2 steps ahead."""
    rng = np.random.default_rng(0)
    x, p = _moss(rng)
    y = mossformer_gated_joint_attention_forward(x, p, group_size=4, causal=True)[0]
    x2 = x.copy()
    x2[:, 6:] += 1.0
    y2 = mossformer_gated_joint_attention_forward(x2, p, group_size=4, causal=True)[0]
    assert not np.allclose(y[:, :6], y2[:, :6])
    qq, lq, qk, lk, v, u = (rng.standard_normal((2, 9, 3)) for _ in range(6))
    av = mossformer_joint_attention_forward(qq, lq, qk, lk, v, u, group_size=4, causal=True)[0][0]
    v2 = v.copy()
    v2[:, 6:] += 1.0
    qk2, lk2 = qk.copy(), lk.copy()
    qk2[:, 6:] += 1.0
    lk2[:, 6:] += 1.0
    av2 = mossformer_joint_attention_forward(qq, lq, qk2, lk2, v2, u, group_size=4, causal=True)[0][0]
    np.testing.assert_array_equal(av[:, :6], av2[:, :6])


def test_mossformer_linear_part_sees_only_earlier_chunks():
    """Causal: the linear (global) part of A is nonzero exactly where the key's chunk precedes the query's."""
    rng = np.random.default_rng(1)
    z = np.zeros((1, 7, 2))
    lq, lk = rng.standard_normal((1, 7, 2)), rng.standard_normal((1, 7, 2))
    A = mossformer_joint_attention_explicit(z, lq, z, lk, group_size=3, causal=True)[0]
    c = np.arange(7) // 3
    np.testing.assert_array_equal(A != 0, c[None, :] < c[:, None])
    A = mossformer_joint_attention_explicit(z, lq, z, lk, group_size=3, causal=False)[0]
    np.testing.assert_allclose(A, lq[0] @ lk[0].T / 7, atol=1e-15)


def test_mossformer_float32_in_float32_out_and_no_input_mutation():
    rng = np.random.default_rng(2)
    x, p = _moss(rng)
    x32 = x.astype(np.float32)
    keep = x32.copy()
    y, cache = mossformer_gated_joint_attention_forward(x32, p, group_size=4)
    assert y.dtype == np.float32
    np.testing.assert_array_equal(x32, keep)
    g = mossformer_gated_joint_attention_backward(np.ones_like(y), cache)
    assert all(v.dtype == np.float32 for v in g.values())
    y64 = mossformer_gated_joint_attention_forward(x, p, group_size=4)[0]
    assert np.abs(y - y64).max() < 1e-4 * np.abs(y64).max()


def test_mossformer_bad_params_name_the_key():
    rng = np.random.default_rng(3)
    x, p = _moss(rng)
    bad = dict(p)
    bad["to_qk.mdl.1.weight"] = np.zeros((5, 4))
    with pytest.raises(ValueError, match="to_qk.mdl.1.weight"):
        mossformer_gated_joint_attention_forward(x, bad, group_size=4)
    bad = dict(p)
    bad["to_hidden.mdl.3.sequential.1.conv.weight"] = np.zeros((8, 1, 4))
    with pytest.raises(ValueError, match="odd"):
        mossformer_gated_joint_attention_forward(x, bad, group_size=4)
    with pytest.raises(ValueError, match="norm"):
        mossformer_gated_joint_attention_forward(x, p, group_size=4, norm="rmsnorm")
    with pytest.raises(ValueError, match="group_size"):
        mossformer_gated_joint_attention_forward(x, p, group_size=0)


def test_two_mamba_causal_and_decay_mask():
    """The layer is causal (conv and scan), and the core's weights are exactly the explicit
    (q.k)^2 exp(sum a) mask: a key far in the past with a very negative decay drops out."""
    from refattn.attention.linear.two_mamba import two_mamba_forward, two_mamba_scan_forward

    rng = np.random.default_rng(4)
    s = get("two_mamba_second_order_attention").sample(rng, "small")
    x = s.inputs["x"]
    y = two_mamba_forward(x, s.params, num_heads=2)[0]
    x2 = x.copy()
    x2[:, 7:] += 1.0
    y2 = two_mamba_forward(x2, s.params, num_heads=2)[0]
    np.testing.assert_array_equal(y[:, :7], y2[:, :7])
    assert not np.allclose(y[:, 7:], y2[:, 7:])
    q, k, v = rng.standard_normal((1, 1, 3, 2)), rng.standard_normal((1, 1, 3, 2)), rng.standard_normal((1, 1, 3, 2))
    a = np.array([[[0.0, -800.0, 0.0]]])  # exp(-800) underflows: token 0 is forgotten from t = 1 on
    out = two_mamba_scan_forward(q, k, v, a)[0]
    w = (k[0, 0, 1:] @ q[0, 0, 2]) ** 2
    np.testing.assert_allclose(out[0, 0, 2], w @ v[0, 0, 1:] / w.sum(), rtol=1e-13)


def test_two_mamba_zero_denominator_row_outputs_value_sum():
    from refattn.attention.linear.two_mamba import two_mamba_explicit, two_mamba_scan_backward, two_mamba_scan_forward

    q = np.zeros((1, 1, 3, 2))
    q[0, 0, 1] = 1.0
    k, v = np.ones((1, 1, 3, 2)), np.arange(6.0).reshape(1, 1, 3, 2)
    y, cache = two_mamba_scan_forward(q, k, v, -np.ones((1, 1, 3)))
    np.testing.assert_allclose(y[0, 0, 0], v[0, 0, 0])
    np.testing.assert_allclose(y[0, 0, 2], v[0, 0].sum(0))
    np.testing.assert_allclose(y, two_mamba_explicit(q, k, v, -np.ones((1, 1, 3))), atol=1e-15)
    g = two_mamba_scan_backward(np.ones_like(y), cache)
    assert np.all(np.isfinite(g["q"])) and np.all(np.isfinite(g["a"]))


def test_two_mamba_bad_params_name_the_key():
    from refattn.attention.linear.two_mamba import two_mamba_forward

    rng = np.random.default_rng(5)
    s = get("two_mamba_second_order_attention").sample(rng, "small")
    with pytest.raises(ValueError, match="num_heads"):
        two_mamba_forward(s.inputs["x"], s.params, num_heads=5)
    bad = dict(s.params)
    bad["A_mask_proj.weight"] = np.zeros((8, 3))
    with pytest.raises(ValueError, match="A_mask_proj.weight"):
        two_mamba_forward(s.inputs["x"], bad, num_heads=2)


def test_afa_is_causal_and_float32_stays_float32():
    from refattn.attention.linear.adaptive_filter import (
        adaptive_filter_attention_backward,
        adaptive_filter_attention_forward,
    )

    rng = np.random.default_rng(6)
    s = get("adaptive_filter_attention").sample(rng, "small")
    z = s.inputs
    y = adaptive_filter_attention_forward(**z, params=s.params, num_heads=2)[0]
    z2 = {k: v.copy() for k, v in z.items()}
    for v in z2.values():
        v[:, 5:] += 1.0
    y2 = adaptive_filter_attention_forward(**z2, params=s.params, num_heads=2)[0]
    np.testing.assert_allclose(y[:, :5], y2[:, :5], rtol=0, atol=1e-14)
    assert not np.allclose(y[:, 5:], y2[:, 5:])
    z32 = {k: v.astype(np.float32) for k, v in z.items()}
    y32, cache = adaptive_filter_attention_forward(**z32, params=s.params, num_heads=2)
    assert y32.dtype == np.float32
    assert all(g.dtype == np.float32 for g in adaptive_filter_attention_backward(np.ones_like(y32), cache).values())
    assert np.abs(y32 - y).max() < 1e-4 * np.abs(y).max()


def test_afa_bad_input_names_the_argument():
    from refattn.attention.linear.adaptive_filter import adaptive_filter_attention_forward

    rng = np.random.default_rng(7)
    s = get("adaptive_filter_attention").sample(rng, "small")
    with pytest.raises(ValueError, match="z_k"):
        adaptive_filter_attention_forward(s.inputs["z_q"], s.inputs["z_k"][:, :3], s.inputs["z_v"], s.params,
                                          num_heads=2)
    bad = dict(s.params)
    bad["lambda_imag_v"] = np.zeros((2, 3))
    with pytest.raises(ValueError, match="lambda_imag_v"):
        adaptive_filter_attention_forward(**s.inputs, params=bad, num_heads=2)


def test_pde_ssm_heat_kernel_is_gaussian_smoothing():
    """D = kappa I, v = 0, r = 0 on a long 1-D grid: an impulse spreads into the periodic heat kernel
    (variance 2 kappa t, unit mass) — the mixer is a diffusion, not a generic filter."""
    from refattn.attention.linear.pde_ssm import pde_ssm_mixer

    n, kappa, t = 64, 0.5, 3.0
    x = np.zeros((1, n, 1))
    x[0, 0, 0] = 1.0
    p = {"diffusion": np.full((1, 1, 1), np.sqrt(kappa)), "velocity": np.zeros((1, 1)), "reaction": np.zeros(1)}
    y = pde_ssm_mixer(x, p, t=t)[0, :, 0]
    s = np.arange(n)
    s = np.minimum(s, n - s)
    gauss = np.exp(-(s**2) / (4 * kappa * t)) / np.sqrt(4 * np.pi * kappa * t)
    # the spectral heat kernel of the lattice equals the continuum Gaussian up to aliasing/lattice effects
    assert abs(y.sum() - 1.0) < 1e-12
    assert np.abs(y - gauss).max() < 2e-3
    assert abs(np.sum(s**2 * y) - 2 * kappa * t) < 1e-6


def test_pde_ssm_bad_input_and_dtype():
    from refattn.attention.linear.pde_ssm import pde_ssm_mixer_backward, pde_ssm_mixer_forward

    rng = np.random.default_rng(8)
    s = get("pde_ssm_spectral_mixer").sample(rng, "small")
    with pytest.raises(ValueError, match="velocity"):
        pde_ssm_mixer_forward(s.inputs["x"], dict(s.params, velocity=np.zeros((3, 1))))
    with pytest.raises(ValueError, match="x"):
        pde_ssm_mixer_forward(s.inputs["x"][0, 0], s.params)
    y, cache = pde_ssm_mixer_forward(s.inputs["x"].astype(np.float32), s.params)
    assert y.dtype == np.float32
    assert all(g.dtype == np.float32 for g in pde_ssm_mixer_backward(np.ones_like(y), cache).values())


def test_darts_gt_queries_from_features_keys_from_structure():
    """Asymmetry: with no edges, GCN and GIN act node-wise, so permuting the nodes permutes the
    output; adding an edge changes keys/values (structure) but never the query path."""
    from refattn.attention.linear.darts_gt import darts_gt_attention

    rng = np.random.default_rng(9)
    s = get("darts_gt_asymmetric_attention").sample(rng, "small")
    x, p = s.inputs["x"], s.params
    adj = np.zeros_like(s.config["adj"])
    perm = rng.permutation(x.shape[1])
    y = darts_gt_attention(x, adj, p, num_heads=2)
    np.testing.assert_allclose(darts_gt_attention(x[:, perm], adj, p, num_heads=2), y[:, perm], atol=1e-13)
    adj2 = adj.copy()
    adj2[:, 0, 1] = 1.0
    assert not np.allclose(darts_gt_attention(x, adj2, p, num_heads=2), y)


def test_darts_gt_bad_input():
    from refattn.attention.linear.darts_gt import darts_gt_attention

    rng = np.random.default_rng(10)
    s = get("darts_gt_asymmetric_attention").sample(rng, "small")
    with pytest.raises(ValueError, match="adj"):
        darts_gt_attention(s.inputs["x"], s.config["adj"][:, :3], s.params, num_heads=2)
    with pytest.raises(ValueError, match="candidates"):
        darts_gt_attention(s.inputs["x"], s.config["adj"], s.params, num_heads=2, candidates=("GINE",))
    with pytest.raises(ValueError, match="num_heads"):
        darts_gt_attention(s.inputs["x"], s.config["adj"], s.params, num_heads=4)


def test_sonnet_mvca_weights_are_a_softmax_over_time_of_coherence():
    """The weights sum to one over time and rescale each token's value (no sum over time), and
    var_attn enters only through the trace of its row softmax (upstream's 'c c' einsum): adding a
    constant to a row changes nothing, while raising a diagonal entry changes the output."""
    from refattn.attention.linear.sonnet_mvca import sonnet_mvca_forward

    rng = np.random.default_rng(11)
    s = get("sonnet_mvca").sample(rng, "small")
    c, p = s.inputs["coeffs"], s.params
    y, cache = sonnet_mvca_forward(c, p)
    a = cache["a"]
    np.testing.assert_allclose(a.sum(-1), 1.0, atol=1e-13)
    P = c @ p["proj.weight"] + p["proj.bias"]
    np.testing.assert_allclose(cache["o"], a[..., None] * P[..., 2::3], atol=1e-13)
    shifted = p["var_attn"] + rng.standard_normal((p["var_attn"].shape[0], 1))
    np.testing.assert_allclose(sonnet_mvca_forward(c, dict(p, var_attn=shifted))[0], y, atol=1e-13)
    bumped = p["var_attn"] + 2.0 * np.eye(p["var_attn"].shape[0])
    assert not np.allclose(sonnet_mvca_forward(c, dict(p, var_attn=bumped))[0], y)


def test_sonnet_mvca_bad_params():
    from refattn.attention.linear.sonnet_mvca import sonnet_mvca_forward

    rng = np.random.default_rng(12)
    s = get("sonnet_mvca").sample(rng, "small")
    with pytest.raises(ValueError, match="var_attn"):
        sonnet_mvca_forward(s.inputs["coeffs"], dict(s.params, var_attn=np.eye(3)))
    with pytest.raises(ValueError, match="proj.weight"):
        sonnet_mvca_forward(s.inputs["coeffs"], dict(s.params, **{"proj.weight": np.zeros((5, 7))}))
