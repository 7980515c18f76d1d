"""Slice L6a of the linear family (spectral memory, flattened-window and global-local attention):
what the registry cannot express."""

import numpy as np
import pytest

from refattn.attention.linear.seqcond import (
    init_seqcond_params,
    seqcond_attention,
    seqcond_attention_backward,
    seqcond_attention_forward,
    seqcond_sizes,
)

# ---------------------------------------------------------------------------------------------
# SeqCond attention

_SC = {"num_heads": 4, "num_query_heads": 2, "num_anchor_heads": 1, "num_thetas": 1, "conv_kernel_size": 3,
       "out_expand_factor": 2}


def test_seqcond_sizes_follow_upstream_constructor():
    sz = seqcond_sizes(1024, num_heads=12, num_query_heads=6, num_thetas=1, out_expand_factor=3)
    assert (sz["H"], sz["E"], sz["C"]) == (85, 255, 12 * 85 + 12 + 6 * 2 * 85)
    with pytest.raises(ValueError, match="num_query_heads"):
        seqcond_sizes(16, num_heads=4, num_query_heads=3)


def test_seqcond_single_token_readout_retrieves_the_token():
    """With one token, the state is k e^{i phi} exactly (the weights normalise to 1): the readout
    is H^{-1/2} sum_m w_m k e^{i phi_m} conj(q_m), independent of the score and time prior."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 1, 16))
    p = init_seqcond_params(rng, 16, **_SC)
    _, c = seqcond_attention_forward(x, p, **_SC)
    kv, theta, g = c["kv"], c["theta"], c["g"]
    S = kv[..., None] * np.exp(1j * g[..., None] * theta)
    np.testing.assert_allclose(c["Re"] * c["inv"][..., None, None], S.real, atol=1e-15)
    np.testing.assert_allclose(c["Im"] * c["inv"][..., None, None], S.imag, atol=1e-15)
    p2 = dict(p, score_bias=p["score_bias"] + 3.0, anchor_slopes=p["anchor_slopes"] + 1.0)
    np.testing.assert_allclose(seqcond_attention(x, p2, **_SC), seqcond_attention(x, p, **_SC), atol=1e-14)


def test_seqcond_maxlen_none_depends_on_sequence_length():
    """Upstream's default L_max = L moves the decay prior with L. Its common factor e^{-slope(L-1)}
    cancels in the normalised state, except where the clip at 1e-4 engages: then appending tokens
    changes earlier outputs, unless maxlen is fixed (then the prefix is causal)."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 7, 16))
    p = init_seqcond_params(rng, 16, **_SC)
    p["decay_slopes"] = np.full(3, np.log(np.expm1(2.0)))  # slope 2: t=0 clipped at L=7, not at L=4
    a = seqcond_attention(x, p, **_SC)[:, :4]
    b = seqcond_attention(x[:, :4], p, **_SC)
    assert np.max(np.abs(a - b)) > 1e-6
    cfg = dict(_SC, maxlen=10)
    np.testing.assert_allclose(seqcond_attention(x, p, **cfg)[:, :4], seqcond_attention(x[:, :4], p, **cfg),
                               atol=1e-13)
    p["decay_slopes"] = np.full(3, np.log(np.expm1(0.1)))  # no clip: the prior's L-dependence cancels
    np.testing.assert_allclose(seqcond_attention(x, p, **_SC)[:, :4], seqcond_attention(x[:, :4], p, **_SC),
                               atol=1e-13)


def test_seqcond_float32_and_bad_input():
    rng = np.random.default_rng(2)
    p = init_seqcond_params(rng, 16, **_SC)
    x = rng.standard_normal((2, 5, 16))
    y32, c = seqcond_attention_forward(x.astype(np.float32), p, **_SC)
    assert y32.dtype == np.float32
    assert seqcond_attention_backward(np.ones_like(y32), c)["W_readout"].dtype == np.float32
    np.testing.assert_allclose(y32, seqcond_attention(x, p, **_SC), rtol=1e-3, atol=1e-4)
    with pytest.raises(ValueError, match="in_proj.weight"):
        seqcond_attention(x, dict(p, **{"in_proj.weight": p["in_proj.weight"][:, :-1]}), **_SC)
    with pytest.raises(ValueError, match="num_anchor_heads"):
        seqcond_attention(x, p, **dict(_SC, num_anchor_heads=5))
    with pytest.raises(ValueError, match="theta_d_raw"):
        seqcond_attention(x, p, **dict(_SC, num_thetas=2))
