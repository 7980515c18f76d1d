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


# ---------------------------------------------------------------------------------------------
# FlatFormer

from refattn.attention.linear.flatformer import (  # noqa: E402
    FLATFORMER_BLOCK_ORDERS,
    equal_size_groups,
    flatformer_block,
    flatformer_block_backward,
    flatformer_block_forward,
    flatformer_layer,
    flattened_window_order,
    init_flatformer_params,
)
from refattn.registry import Sample  # noqa: E402
from refattn.testing import directional_check  # noqa: E402

_FF = {"num_heads": 2, "group_size": 4, "window_shape": (3, 2, 1), "sparse_shape": (8, 7, 1)}


def _ff_coords(rng, B, N, sx=8, sy=7):
    flat = np.stack([rng.choice(sx * sy, N, replace=False) for _ in range(B)])
    return np.stack([flat // sx, flat % sx], axis=-1)


def test_flatformer_output_depends_only_on_own_group():
    """The selection held fixed: out_i changes under a perturbation of x_j iff j is a key of i's
    group (brute-force group sets from the order), in both last-group modes."""
    rng = np.random.default_rng(3)
    N = 10
    x = rng.standard_normal((1, N, 4))
    c = _ff_coords(rng, 1, N)
    p = init_flatformer_params(rng, 4)
    for mode in ("duplicate", "mask"):
        cfg = dict(_FF, axis="x", shifted=True, last_group=mode)
        perm = flattened_window_order(c, window_shape=_FF["window_shape"], sparse_shape=_FF["sparse_shape"],
                                      axis="x", shifted=True)[0]
        rank = np.argsort(perm)
        base = flatformer_layer(x, c, p, **cfg)
        for j in range(N):
            xp = x.copy()
            xp[0, j] += 0.5
            changed = np.abs(flatformer_layer(xp, c, p, **cfg) - base).max(-1)[0] > 1e-12
            for i in range(N):
                ri, rj = rank[i], rank[j]
                if ri >= 8:  # last (partial) group: 2 tokens of 10 with G = 4
                    lo = 8 if mode == "mask" else 6
                    expect = rj >= lo
                else:
                    expect = ri // 4 == rj // 4
                assert changed[i] == (expect or i == j), (mode, i, j)


def test_flatformer_permuting_tokens_permutes_outputs():
    rng = np.random.default_rng(4)
    x, c = rng.standard_normal((2, 9, 4)), _ff_coords(rng, 2, 9)
    p = init_flatformer_params(rng, 4)
    sigma = rng.permutation(9)
    y = flatformer_layer(x, c, p, **_FF)
    np.testing.assert_allclose(flatformer_layer(x[:, sigma], c[:, sigma], p, **_FF), y[:, sigma], atol=1e-13)


def test_flatformer_block_is_four_layers_in_upstream_orders_and_its_gradient():
    rng = np.random.default_rng(5)
    x, c = rng.standard_normal((2, 9, 4)), _ff_coords(rng, 2, 9)
    pb = init_flatformer_params(rng, 4, block=True)
    h = x
    for k, (axis, shifted) in enumerate(FLATFORMER_BLOCK_ORDERS):
        pk = {key.split(".", 2)[2]: v for key, v in pb.items() if key.startswith(f"block.{k}.")}
        h = flatformer_layer(h, c, pk, axis=axis, shifted=shifted, **_FF)
    np.testing.assert_allclose(flatformer_block(x, c, pb, **_FF), h, atol=1e-14)
    s = Sample(inputs={"x": x}, params=pb, config={"coords": c, **_FF})
    assert directional_check(flatformer_block_forward, flatformer_block_backward, s).max_rel < 1e-6


def test_flatformer_group_partition_small_n_and_bad_input():
    idx, own, keep = equal_size_groups(3, 5)
    assert idx.shape == (1, 3) and np.array_equal(own, [0, 1, 2])
    _, _, keep = equal_size_groups(7, 3, "mask")
    assert keep.tolist() == [[True] * 3, [True] * 3, [False, False, True]]
    rng = np.random.default_rng(6)
    x, c = rng.standard_normal((2, 6, 4)), _ff_coords(rng, 2, 6)
    p = init_flatformer_params(rng, 4)
    bad = c.copy()
    bad[0, 1] = bad[0, 0]
    with pytest.raises(ValueError, match="repeat a location"):
        flatformer_layer(x, bad, p, **_FF)
    with pytest.raises(TypeError, match="integer"):
        flatformer_layer(x, c.astype(float), p, **_FF)
    with pytest.raises(ValueError, match="sparse_shape"):
        flatformer_layer(x, c + 8, p, **_FF)
    with pytest.raises(ValueError, match="num_heads"):
        flatformer_layer(x, c, p, **dict(_FF, num_heads=3))
    y32 = flatformer_layer(x.astype(np.float32), c, p, **_FF)
    assert y32.dtype == np.float32


# ---------------------------------------------------------------------------------------------
# ETC global-local attention

from refattn.attention.linear.etc_attention import (  # noqa: E402
    etc_band_indices,
    etc_global_local_attention,
    etc_global_local_attention_backward,
    etc_global_local_attention_forward,
    init_etc_params,
)
from refattn.registry import get  # noqa: E402


def _sample_etc(rng, size):
    return get("etc_global_local_attention").sample(rng, size)


def test_etc_band_indices_brute_force():
    for n, r in ((1, 1), (5, 1), (7, 3), (4, 6)):
        idx, inside = etc_band_indices(n, r)
        for i in range(n):
            got = sorted(int(idx[i, w]) for w in range(2 * r + 1) if inside[i, w])
            assert got == [j for j in range(n) if abs(i - j) <= r]
            assert [int(idx[i, w]) for w in range(2 * r + 1) if inside[i, w]] == got  # slot w is key i - r + w


def test_etc_band_adjoint_is_overlap_add():
    """<gather(x), y> = <x, overlap_add(y)>: the backward's band adjoint, via the l2l value path."""
    rng = np.random.default_rng(7)
    n, r = 6, 2
    idx, inside = etc_band_indices(n, r)
    x, y = rng.standard_normal((n, 3)), rng.standard_normal((n, 2 * r + 1, 3)) * inside[..., None]
    acc = np.zeros_like(x)
    np.add.at(acc, idx, y)
    assert abs(np.sum(x[idx] * y) - np.sum(x * acc)) < 1e-12


def test_etc_sharing_variants_gradients():
    from refattn.testing import directional_check

    rng = np.random.default_rng(8)
    for flags in ({"share_qkv_projections": True, "share_att_output_projection": True}, {"share_kv_projections": True}):
        s = _sample_etc(rng, "small")
        s.params = init_etc_params(rng, 8, 2, relative_vocab_size=7, **flags)
        s.config = {k: v for k, v in s.config.items() if not k.startswith("share")} | flags
        assert directional_check(etc_global_local_attention_forward, etc_global_local_attention_backward,
                                 s).max_rel < 1e-6


def test_etc_masked_key_has_no_weight_and_bad_input():
    rng = np.random.default_rng(9)
    s = _sample_etc(rng, "small")
    cfg = dict(s.config)
    y = etc_global_local_attention(**s.inputs, params=s.params, **cfg)
    # changing a global token that every long and global query has masked out changes nothing
    cfg["l2g_att_mask"] = cfg["l2g_att_mask"].copy()
    cfg["g2g_att_mask"] = cfg["g2g_att_mask"].copy()
    cfg["l2g_att_mask"][:, :, 0] = 0
    cfg["g2g_att_mask"][:, :, 0] = 0
    cfg["g2g_att_mask"][:, 1:, 1] = 1
    cfg["g2g_att_mask"][:, 0, 1] = 1
    y1 = etc_global_local_attention(**s.inputs, params=s.params, **cfg)
    xg = s.inputs["global_input"].copy()
    xg[:, 0] += 3.0
    y2 = etc_global_local_attention(s.inputs["long_input"], xg, s.params, **cfg)
    Ng = xg.shape[1]
    np.testing.assert_allclose(y2[:, 1:], y1[:, 1:], atol=1e-13)   # every row but global token 0's own
    assert np.max(np.abs(y1 - y)) > 1e-6
    y32 = etc_global_local_attention(s.inputs["long_input"].astype(np.float32), s.inputs["global_input"].astype(np.float32),
                                     s.params, **s.config)
    assert y32.dtype == np.float32 and y32.shape == (2, Ng + 11, 8)
    bad = dict(s.config, l2g_att_mask=s.config["l2g_att_mask"] * 2)
    with pytest.raises(ValueError, match="l2g_att_mask"):
        etc_global_local_attention(**s.inputs, params=s.params, **bad)
    bad = dict(s.config, g2l_relative_att_ids=s.config["g2l_relative_att_ids"] + 7)
    with pytest.raises(ValueError, match="g2l_relative_att_ids"):
        etc_global_local_attention(**s.inputs, params=s.params, **bad)
    bad = dict(s.config, l2g_relative_att_ids=None)
    with pytest.raises(ValueError, match="both given"):
        etc_global_local_attention(**s.inputs, params=s.params, **bad)
    with pytest.raises(ValueError, match="global_input"):
        etc_global_local_attention(s.inputs["long_input"], s.inputs["global_input"][..., :4], s.params, **s.config)


# ---------------------------------------------------------------------------------------------
# ConDaFormer

from refattn.attention.linear.condaformer import (  # noqa: E402
    condaformer_attention,
    condaformer_attention_backward,
    condaformer_attention_forward,
    init_condaformer_params,
)


def _cd_sample(rng, size="small"):
    return get("condaformer_planar_window_attention").sample(rng, size)


def _group_out(cache, pl, N):
    """The attention output of head group ``pl`` (before the post convs), from the cached windows."""
    o = np.zeros((N, 2, 2))
    for _b, plane, idx, valid, _rel, _tq, _tk, TV, _qg, _kg, vg, pr in cache["wins"]:
        if plane == pl:
            og = np.einsum("whij,wjhd->wihd", pr, vg) + np.einsum("whij,wijhd->wihd", pr, TV)
            o[idx[valid]] = og[valid]
    return o


def test_condaformer_head_groups_see_only_their_planar_window():
    """With 1x1x1 enhancement convs (they do not mix points), perturbing point j changes the
    attention output of head group g at point i exactly when j shares i's window in plane g
    (brute force over all pairs)."""
    rng = np.random.default_rng(10)
    s = _cd_sample(rng)
    cfg = dict(s.config)
    x = s.inputs["x"][:1]
    cfg["coords"], cfg["xyz"] = cfg["coords"][:1], cfg["xyz"][:1]
    p = init_condaformer_params(rng, 12, 6, window_size=2.0, quant_size=0.5, kernel_size=1)
    _, cache = condaformer_attention_forward(x, p, **cfg)
    from refattn.attention.linear.condaformer import condaformer_plane_windows

    N = x.shape[1]
    for j in range(N):
        xp = x.copy()
        xp[0, j] += 0.7
        _, cj = condaformer_attention_forward(xp, p, **cfg)
        for pl, name in enumerate(("xy", "xz", "yz")):
            win, _ = condaformer_plane_windows(cfg["xyz"][0], name, window_size=2.0, quant_size=0.5, shift=cfg["shift"])
            base = _group_out(cache, pl, N)
            changed = np.abs(_group_out(cj, pl, N) - base).max(axis=(1, 2)) > 1e-12
            assert np.array_equal(changed, win == win[j]), (j, name)


def test_condaformer_float32_and_bad_input():
    rng = np.random.default_rng(11)
    s = _cd_sample(rng)
    y = condaformer_attention(**s.inputs, params=s.params, **s.config)
    y32 = condaformer_attention(s.inputs["x"].astype(np.float32), s.params, **s.config)
    assert y32.dtype == np.float32 and np.max(np.abs(y32 - y)) < 1e-3 * np.max(np.abs(y)) + 1e-4
    g = condaformer_attention_backward(np.ones_like(y), condaformer_attention_forward(**s.inputs, params=s.params,
                                                                                       **s.config)[1])
    assert set(g) == {"x", *s.params}
    bad = dict(s.config, coords=s.config["coords"].copy())
    bad["coords"][0, 1] = bad["coords"][0, 0]
    with pytest.raises(ValueError, match="repeat a voxel"):
        condaformer_attention(**s.inputs, params=s.params, **bad)
    with pytest.raises(ValueError, match="num_heads"):
        condaformer_attention(**s.inputs, params=s.params, **dict(s.config, num_heads=4))
    with pytest.raises(ValueError, match="xyz"):
        condaformer_attention(**s.inputs, params=s.params, **dict(s.config, xyz=s.config["xyz"][:, :, :2]))


# ---------------------------------------------------------------------------------------------
# TCNCA

from refattn.attention.linear.tcnca import init_tcnca_params, tcnca_attention, tcnca_attention_forward  # noqa: E402


def test_tcnca_single_chunk_is_full_attention_and_bad_input():
    """chunk_size >= L: one chunk, i.e. MEGA's full (non-chunked) attention; the relative bias
    then uses the centre 2L-1 entries of the table as upstream with max_positions = chunk_size."""
    rng = np.random.default_rng(12)
    p = init_tcnca_params(rng, 4, zdim=2, hdim=3, chunk_size=8, tcn_layers=2)
    x = rng.standard_normal((2, 5, 4))
    ref = get("tcnca_chunked_attention").reference(x, p, chunk_size=8, causal=False)
    np.testing.assert_allclose(tcnca_attention(x, p, chunk_size=8, causal=False), ref, atol=1e-13)
    with pytest.raises(ValueError, match="multiple of chunk_size"):
        tcnca_attention(rng.standard_normal((2, 10, 4)), p, chunk_size=8)
    y32, _ = tcnca_attention_forward(x.astype(np.float32), p, chunk_size=8)
    assert y32.dtype == np.float32
    bad = dict(p)
    bad["rel_pos_bias.rel_pos_bias"] = bad["rel_pos_bias.rel_pos_bias"][:-1]
    with pytest.raises(ValueError, match="rel_pos_bias"):
        tcnca_attention(x, bad, chunk_size=8)


# ---------------------------------------------------------------------------------------------
# DAS

from refattn.attention.linear.das_gate import das_attention_gate, das_attention_gate_forward, init_das_params  # noqa: E402


def test_das_gate_bounds_and_spatial_gate_broadcast():
    """0 < y / x < 1 elementwise (a sigmoid gate); with C_g = 1 every channel of a pixel gets the
    same gate; bad shapes raise."""
    rng = np.random.default_rng(13)
    x = rng.standard_normal((2, 4, 6, 6))
    p = init_das_params(rng, 4, reduced=2, gate_channels=1)
    y, c = das_attention_gate_forward(x, p)
    ratio = y / x
    assert np.all((ratio > 0) & (ratio < 1))
    np.testing.assert_allclose(ratio, np.broadcast_to(ratio[:, :1], ratio.shape), rtol=1e-12)
    with pytest.raises(ValueError, match="C_g"):
        das_attention_gate(x, init_das_params(rng, 4, reduced=2, gate_channels=3))
    with pytest.raises(ValueError, match="odd"):
        das_attention_gate(x, init_das_params(rng, 4, reduced=2, kernel_size=2))
    with pytest.raises(ValueError, match="activation"):
        das_attention_gate(x, p, activation="tanh")
    assert das_attention_gate(x.astype(np.float32), p).dtype == np.float32
