"""Mechanism-specific tests of the softmax attention family (the modules of refattn/attention/softmax/:
sdpa, masks, additive_bias, mha, gqa, alibi, relative, memory_efficient). Generic checks are
generated from the registry elsewhere."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from refattn import registry
from refattn.attention.softmax import (
    alibi_attention_backward,
    alibi_attention_forward,
    alibi_slopes,
    attention_core_backward,
    attention_core_forward,
    band_mask,
    biased_attention_forward,
    block_diagonal_mask,
    build_mask,
    causal_mask,
    chunk_summary,
    flash_attention,
    flash_attention_backward,
    flash_attention_forward,
    init_mha_params,
    merge_summaries,
    mha,
    mha_backward,
    mha_forward,
    padding_mask,
    rabe_staats_backward,
    rabe_staats_forward,
    sdpa,
    sdpa_backward,
    sdpa_forward,
    shaw_attention_forward,
    sliding_window_mask,
    t5_attention_backward,
    t5_attention_forward,
    t5_relative_position_bucket,
    to_additive,
    tree_attention_backward,
    tree_attention_forward,
    tree_reduce,
)
from refattn.testing import run_record_checks

SLUGS = ["sdpa", "attention_masks", "multi_head_attention", "gqa_mqa", "additive_attention_bias", "alibi",
         "relative_position_encodings", "online_softmax_flash_attention", "memory_efficient_attention_rabe_staats",
         "tree_attention_merge"]


@pytest.mark.parametrize("slug", SLUGS)
def test_record_checks_pass(slug):
    res = run_record_checks(registry.get(slug))
    bad = [(r.check, r.message) for r in res.results if not r.passed]
    assert not bad, bad


# ------------------------------------------------------------------------------ torch parity

def _torch_sdpa(q, k, v, dout, **kw):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    qt, kt, vt = (torch.from_numpy(a.copy()).requires_grad_() for a in (q, k, v))
    if "attn_mask" in kw and kw["attn_mask"] is not None:
        kw["attn_mask"] = torch.from_numpy(np.ascontiguousarray(kw["attn_mask"]))
    out = F.scaled_dot_product_attention(qt, kt, vt, **kw)
    out.backward(torch.from_numpy(dout))
    return out.detach().numpy(), {"q": qt.grad.numpy(), "k": kt.grad.numpy(), "v": vt.grad.numpy()}


CASES = {
    "plain": dict(n=5, m=5, h=2, hkv=2, kw={}),
    "causal": dict(n=6, m=6, h=2, hkv=2, kw={"is_causal": True}),
    "causal_cross_top_left": dict(n=4, m=7, h=2, hkv=2, kw={"is_causal": True}),
    "scale": dict(n=4, m=6, h=3, hkv=3, kw={"scale": 0.37}),
    "cross": dict(n=3, m=8, h=2, hkv=2, kw={}),
    "gqa": dict(n=5, m=6, h=6, hkv=2, kw={"enable_gqa": True}),
    "mqa": dict(n=5, m=4, h=4, hkv=1, kw={"enable_gqa": True}),
    "bool_mask": dict(n=5, m=6, h=2, hkv=2, kw={"attn_mask": "bool"}),
    "additive_mask": dict(n=5, m=6, h=2, hkv=2, kw={"attn_mask": "float"}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_torch_parity(case):
    pytest.importorskip("torch")
    c = CASES[case]
    rng = np.random.default_rng(len(case))
    b, d, dv = 2, 4, 3
    q = rng.standard_normal((b, c["h"], c["n"], d))
    k = rng.standard_normal((b, c["hkv"], c["m"], d))
    v = rng.standard_normal((b, c["hkv"], c["m"], dv))
    kw = dict(c["kw"])
    ours = {k_: v_ for k_, v_ in kw.items() if k_ != "enable_gqa"}
    if kw.get("attn_mask") == "bool":
        keep = rng.random((c["n"], c["m"])) > 0.4
        keep[:, 0] = True
        kw["attn_mask"] = ours["attn_mask"] = keep
    elif kw.get("attn_mask") == "float":
        add = rng.standard_normal((b, 1, c["n"], c["m"]))
        add[rng.random(add.shape) < 0.3] = -np.inf
        add[..., 1] = 0.5
        kw["attn_mask"] = ours["attn_mask"] = add
    out, cache = sdpa_forward(q, k, v, **ours)
    dout = rng.standard_normal(out.shape)
    g = sdpa_backward(dout, cache)
    out_t, g_t = _torch_sdpa(q, k, v, dout, **kw)
    np.testing.assert_allclose(out, out_t, rtol=1e-12, atol=1e-12)
    for name in "qkv":
        np.testing.assert_allclose(g[name], g_t[name], rtol=1e-11, atol=1e-12, err_msg=name)


def test_strided_gqa_equals_tiled_kv():
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 6, 4, 3))
    k = rng.standard_normal((2, 2, 5, 3))
    v = rng.standard_normal((2, 2, 5, 2))
    out, cache = sdpa_forward(q, k, v, kv_group_map="strided")
    kt, vt = np.concatenate([k] * 3, axis=1), np.concatenate([v] * 3, axis=1)
    out2, cache2 = sdpa_forward(q, kt, vt)
    np.testing.assert_allclose(out, out2, rtol=0, atol=1e-14)
    g, g2 = sdpa_backward(np.ones_like(out), cache), sdpa_backward(np.ones_like(out), cache2)
    np.testing.assert_allclose(g["k"], g2["k"].reshape(2, 3, 2, 5, 3).sum(1), atol=1e-13)
    # and contiguous differs from strided
    assert np.abs(sdpa(q, k, v) - out).max() > 1e-3


# ------------------------------------------------------------------------------ edge cases

def test_fully_masked_rows_no_nan_no_warning():
    rng = np.random.default_rng(2)
    q = rng.standard_normal((1, 2, 4, 3))
    k = rng.standard_normal((1, 2, 3, 3))
    v = rng.standard_normal((1, 2, 3, 2))
    add = np.zeros((4, 3))
    add[1] = -np.inf
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")
        # bottom_right with N > M: the first N - M rows see no key at all.
        out, cache = sdpa_forward(q, k, v, is_causal=True, causal_alignment="bottom_right", attn_mask=add)
        g = sdpa_backward(rng.standard_normal(out.shape), cache)
    assert np.all(out[:, :, :2] == 0)  # row 0 (causal) and row 1 (mask)
    assert np.all(g["q"][:, :, :2] == 0)
    assert np.isneginf(cache["lse"][:, :, :2]).all()
    for a in (out, *g.values()):
        assert np.isfinite(a).all()
    # a fully masked batch gives zero k/v gradients too
    out, cache = sdpa_forward(q, k, v, attn_mask=np.zeros((4, 3), bool))
    g = sdpa_backward(np.ones_like(out), cache)
    assert not out.any() and not any(x.any() for x in g.values())


def test_tiny_shapes():
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 1, 1, 1))
    k = rng.standard_normal((1, 1, 1, 1))
    v = rng.standard_normal((1, 1, 1, 1))
    out, cache = sdpa_forward(q, k, v)
    np.testing.assert_array_equal(out, v)  # one key: weight 1
    g = sdpa_backward(np.ones_like(out), cache)
    assert g["q"][0, 0, 0, 0] == 0 and g["k"][0, 0, 0, 0] == 0 and g["v"][0, 0, 0, 0] == 1


def test_huge_logits():
    q = np.array([[[[1.0], [-1.0]]]]) * 100
    k = np.array([[[[100.0], [-100.0], [0.0]]]])
    v = np.array([[[[1.0], [2.0], [3.0]]]])
    # exp(-2e4) underflows to 0 by design; overflow/invalid/divide must not happen
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        out, cache = sdpa_forward(q, k, v, scale=1.0)  # logits +-1e4
        g = sdpa_backward(np.ones_like(out), cache)
    np.testing.assert_allclose(out[..., 0], [[[1.0, 2.0]]], atol=1e-15)
    assert all(np.isfinite(x).all() for x in g.values())


def test_float32_error_budget():
    rng = np.random.default_rng(4)
    q = rng.standard_normal((2, 4, 33, 16)) * 2
    k = rng.standard_normal((2, 2, 40, 16)) * 2
    v = rng.standard_normal((2, 2, 40, 16))
    ref = sdpa(q, k, v, is_causal=True)

    def naive32(q, k, v):
        q, k, v = (a.astype(np.float32) for a in (q, k, v))
        k, v = np.repeat(k, 2, axis=1), np.repeat(v, 2, axis=1)
        s = q @ np.swapaxes(k, -1, -2) / np.float32(4.0)
        s = np.where(np.tri(33, 40, dtype=bool), s, -np.inf)
        e = np.exp(s - s.max(-1, keepdims=True))
        return (e / e.sum(-1, keepdims=True)) @ v

    got = sdpa(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), is_causal=True)
    assert got.dtype == np.float32
    assert np.abs(got - ref).max() <= 2 * np.abs(naive32(q, k, v) - ref).max() + 1e-7


def test_dlse_gradient():
    # d/dq of sum(w * lse) by finite differences
    rng = np.random.default_rng(5)
    q = rng.standard_normal((1, 2, 3, 2))
    k = rng.standard_normal((1, 2, 4, 2))
    v = rng.standard_normal((1, 2, 4, 2))
    w = rng.standard_normal((1, 2, 3))
    _, cache = sdpa_forward(q, k, v)
    g = sdpa_backward(np.zeros((1, 2, 3, 2)), cache, dlse=w)
    eps = 1e-6
    for name, arr in (("q", q), ("k", k)):
        num = np.zeros_like(arr)
        for i in np.ndindex(arr.shape):
            a = arr.copy()
            a[i] += eps
            lp = (w * sdpa(*(a if n == name else x for n, x in zip("qkv", (q, k, v), strict=True)),
                           return_lse=True)[1]).sum()
            a[i] -= 2 * eps
            lm = (w * sdpa(*(a if n == name else x for n, x in zip("qkv", (q, k, v), strict=True)),
                           return_lse=True)[1]).sum()
            num[i] = (lp - lm) / (2 * eps)
        np.testing.assert_allclose(g[name], num, atol=1e-8)


def test_core_bias_gradient_broadcast():
    rng = np.random.default_rng(6)
    q = rng.standard_normal((2, 2, 3, 2))
    k = rng.standard_normal((2, 2, 4, 2))
    v = rng.standard_normal((2, 2, 4, 2))
    bias = rng.standard_normal((2, 1, 4))  # (H, 1, M): broadcast over batch and queries
    out, cache = attention_core_forward(q, k, v, bias, softcap=2.0)
    G = rng.standard_normal(out.shape)
    db = attention_core_backward(G, cache)["bias"]
    assert db.shape == bias.shape
    eps = 1e-6
    num = np.zeros_like(bias)
    for i in np.ndindex(bias.shape):
        b = bias.copy()
        b[i] += eps
        lp = (attention_core_forward(q, k, v, b, softcap=2.0)[0] * G).sum()
        b[i] -= 2 * eps
        lm = (attention_core_forward(q, k, v, b, softcap=2.0)[0] * G).sum()
        num[i] = (lp - lm) / (2 * eps)
    np.testing.assert_allclose(db, num, atol=1e-8)


def test_bad_inputs():
    q = np.ones((1, 4, 3, 2))
    k = np.ones((1, 3, 5, 2))
    v = np.ones((1, 3, 5, 2))
    with pytest.raises(ValueError, match="multiple"):
        sdpa(q, k, v)
    k, v = np.ones((1, 2, 5, 2)), np.ones((1, 2, 5, 2))
    with pytest.raises(ValueError, match="attn_mask"):
        sdpa(q, k, v, attn_mask=np.ones((3, 4), bool))
    with pytest.raises(TypeError, match="attn_mask"):
        sdpa(q, k, v, attn_mask=np.ones((3, 5), int))
    with pytest.raises(ValueError, match="scale"):
        sdpa(q, k, v, scale=0.0)
    with pytest.raises(ValueError, match="causal_alignment"):
        sdpa(q, k, v, is_causal=True, causal_alignment="bottom")
    with pytest.raises(ValueError, match="kv_group_map"):
        sdpa(q, k, v, kv_group_map="interleaved")
    with pytest.raises(ValueError, match="v must have k's number of keys"):
        sdpa(q, k, np.ones((1, 2, 4, 2)))
    with pytest.raises(ValueError, match="leading"):
        sdpa(q, np.ones((2, 2, 5, 2)), np.ones((2, 2, 5, 2)))
    with pytest.raises(TypeError, match="q"):
        sdpa(q.astype(int), k, v)


# ------------------------------------------------------------------------------ layers

def _mha_params_from_torch(layer, e):
    w, b = layer.in_proj_weight.detach().numpy(), layer.in_proj_bias.detach().numpy()
    return {"q_proj": w[:e].T, "k_proj": w[e:2 * e].T, "v_proj": w[2 * e:].T,
            "q_proj_bias": b[:e], "k_proj_bias": b[e:2 * e], "v_proj_bias": b[2 * e:],
            "out_proj": layer.out_proj.weight.detach().numpy().T, "out_proj_bias": layer.out_proj.bias.detach().numpy()}


@pytest.mark.parametrize("cross", [False, True])
def test_mha_torch_parity(cross):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    e, h = 8, 2
    layer = torch.nn.MultiheadAttention(e, h, batch_first=True).double()
    with torch.no_grad():
        layer.in_proj_bias.normal_()
        layer.out_proj.bias.normal_()
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 5, e))
    ctx = rng.standard_normal((2, 7, e)) if cross else None
    keep = np.tri(5, 7 if cross else 5, k=2, dtype=bool)
    params = _mha_params_from_torch(layer, e)
    y, cache = mha_forward(x, ctx, params, num_heads=h, attn_mask=keep)
    xt = torch.from_numpy(x).requires_grad_()
    ct = torch.from_numpy(ctx).requires_grad_() if cross else xt
    yt, _ = layer(xt, ct, ct, attn_mask=torch.from_numpy(~keep), need_weights=False)  # torch: True = masked
    np.testing.assert_allclose(y, yt.detach().numpy(), rtol=1e-12, atol=1e-12)
    G = rng.standard_normal(y.shape)
    yt.backward(torch.from_numpy(G))
    g = mha_backward(G, cache)
    np.testing.assert_allclose(g["x"], xt.grad.numpy(), rtol=1e-10, atol=1e-12)
    if cross:
        np.testing.assert_allclose(g["context"], ct.grad.numpy(), rtol=1e-10, atol=1e-12)
    wg, bg = layer.in_proj_weight.grad.numpy(), layer.in_proj_bias.grad.numpy()
    np.testing.assert_allclose(np.concatenate([g["q_proj"], g["k_proj"], g["v_proj"]], axis=1).T, wg,
                               rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(np.concatenate([g["q_proj_bias"], g["k_proj_bias"], g["v_proj_bias"]]), bg,
                               rtol=1e-10, atol=1e-11)
    np.testing.assert_allclose(g["out_proj"].T, layer.out_proj.weight.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_mha_bad_params():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, 3, 4))
    p = init_mha_params(rng, 4, 2, 3)
    with pytest.raises(ValueError, match="k_proj"):
        mha(x, params=dict(p, k_proj=np.ones((4, 5))), num_heads=2)
    with pytest.raises(ValueError, match="unknown keys"):
        mha(x, params=dict(p, in_proj_weight=np.ones((4, 5))), num_heads=2)
    with pytest.raises(ValueError, match="num_heads"):
        mha(x, params=p, num_heads=2, num_kv_heads=4)
    with pytest.raises(ValueError, match="context"):
        mha(x, rng.standard_normal((3, 3, 4)), params=p, num_heads=2)


def test_mask_builders():
    assert np.array_equal(causal_mask(2, 4, offset=2), [[1, 1, 1, 0], [1, 1, 1, 1]])
    assert np.array_equal(sliding_window_mask(4, 4, 2),
                          [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]])
    assert np.array_equal(band_mask(3, 3, left=0, right=1), [[1, 1, 0], [0, 1, 1], [0, 0, 1]])
    assert np.array_equal(block_diagonal_mask([1, 2], causal=True), [[1, 0, 0], [0, 1, 0], [0, 1, 1]])
    assert padding_mask(np.array([1, 3]), 3).shape == (2, 1, 1, 3)
    with pytest.raises(ValueError, match="key_lengths"):
        padding_mask(np.array([4]), 3)
    with pytest.raises(ValueError, match="mask_kind"):
        build_mask("diagonal", 3, 3)
    with pytest.raises(ValueError, match="window"):
        build_mask("sliding_window", 3, 3)
    a = to_additive(np.array([True, False]), -100.0)
    assert a.tolist() == [0.0, -100.0]


def test_bias_table_bad_index_map():
    rng = np.random.default_rng(9)
    q, k, v = rng.standard_normal((1, 2, 3, 2)), rng.standard_normal((1, 2, 4, 2)), rng.standard_normal((1, 2, 4, 2))
    table = rng.standard_normal((5, 2))
    with pytest.raises(ValueError, match="index_map"):
        biased_attention_forward(q, k, v, params={"table": table}, index_map=np.full((3, 4), 5))
    with pytest.raises(TypeError, match="index_map"):
        biased_attention_forward(q, k, v, params={"table": table}, index_map=np.zeros((3, 4)))
    with pytest.raises(ValueError, match="table"):
        biased_attention_forward(q, k, v, params={"table": table[:, :1]}, index_map=np.zeros((3, 4), int))


# ------------------------------------------------------------------------------ positions

def _hf_t5_bucket(torch, rp, bidirectional, num_buckets, max_distance):
    # transcription of HF T5Attention._relative_position_bucket (torch, float32 log as upstream)
    import math
    rb = 0
    if bidirectional:
        num_buckets //= 2
        rb += (rp > 0).to(torch.long) * num_buckets
        rp = torch.abs(rp)
    else:
        rp = -torch.min(rp, torch.zeros_like(rp))
    max_exact = num_buckets // 2
    is_small = rp < max_exact
    large = max_exact + (torch.log(rp.float() / max_exact) / math.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).to(torch.long)
    large = torch.min(large, torch.full_like(large, num_buckets - 1))
    return rb + torch.where(is_small, rp, large)


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("nb,md", [(32, 128), (16, 64), (8, 20)])
def test_t5_bucket_matches_hf(bidirectional, nb, md):
    torch = pytest.importorskip("torch")
    r = np.arange(-512, 513)
    ref = _hf_t5_bucket(torch, torch.from_numpy(r), bidirectional, nb, md).numpy()
    got = t5_relative_position_bucket(r, bidirectional=bidirectional, num_buckets=nb, max_distance=md)
    np.testing.assert_array_equal(got, ref)


def test_t5_attention_matches_hf_style_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(10)
    h, n, d = 3, 6, 4
    q, k, v = (rng.standard_normal((2, h, n, d)) for _ in range(3))
    table = rng.standard_normal((32, h))
    out, cache = t5_attention_forward(q, k, v, {"relative_attention_bias": table})
    # HF: position_bias = embedding(bucket(memory - context)).permute([2, 0, 1]); scores = q k^T + bias (no scale)
    rel = torch.arange(n)[None, :] - torch.arange(n)[:, None]
    bias = torch.from_numpy(table)[_hf_t5_bucket(torch, rel, True, 32, 128)].permute(2, 0, 1)
    qt, kt, vt = (torch.from_numpy(a).requires_grad_() for a in (q, k, v))
    tt = torch.from_numpy(table).requires_grad_()
    bias = tt[_hf_t5_bucket(torch, rel, True, 32, 128)].permute(2, 0, 1)
    ot = torch.softmax(qt @ kt.transpose(-1, -2) + bias, -1) @ vt
    np.testing.assert_allclose(out, ot.detach().numpy(), rtol=1e-12, atol=1e-12)
    G = rng.standard_normal(out.shape)
    ot.backward(torch.from_numpy(G))
    g = t5_attention_backward(G, cache)
    np.testing.assert_allclose(g["relative_attention_bias"], tt.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(g["q"], qt.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_alibi_slopes_reference_values():
    # values printed by the reference get_slopes for H = 12 and H = 6
    np.testing.assert_allclose(alibi_slopes(12)[8:], [2 ** -0.5, 2 ** -1.5, 2 ** -2.5, 2 ** -3.5], rtol=1e-15)
    np.testing.assert_allclose(alibi_slopes(6), [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3], rtol=1e-15)


def test_alibi_torch_parity():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(11)
    h, n, d = 4, 5, 3
    q, k, v = (rng.standard_normal((2, h, n, d)) for _ in range(3))
    slopes = alibi_slopes(h)
    out, cache = alibi_attention_forward(q, k, v, {"alibi_slopes": slopes})
    ii = torch.arange(n)
    qt, kt, vt = (torch.from_numpy(a).requires_grad_() for a in (q, k, v))
    st = torch.from_numpy(slopes).requires_grad_()
    bias = -st[:, None, None] * (ii[:, None] - ii[None, :]).double()
    ot = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, attn_mask=bias.masked_fill(
        ii[None, :] > ii[:, None], float("-inf")))
    np.testing.assert_allclose(out, ot.detach().numpy(), rtol=1e-12, atol=1e-12)
    G = rng.standard_normal(out.shape)
    ot.backward(torch.from_numpy(G))
    g = alibi_attention_backward(G, cache)
    np.testing.assert_allclose(g["alibi_slopes"], st.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(g["k"], kt.grad.numpy(), rtol=1e-10, atol=1e-12)
    # fixed slopes: no slope gradient
    assert set(alibi_attention_backward(G, alibi_attention_forward(q, k, v)[1])) == {"q", "k", "v"}


def test_shaw_matches_t2t_style_materialised():
    rng = np.random.default_rng(12)
    n, d, kk = 5, 3, 2
    q, k, v = (rng.standard_normal((1, 2, n, d)) for _ in range(3))
    ak, av = rng.standard_normal((2 * kk + 1, d)), rng.standard_normal((2 * kk + 1, d))
    out = shaw_attention_forward(q, k, v, {"relative_positions_keys": ak, "relative_positions_values": av},
                                 max_relative_position=kk)[0]
    # tensor2tensor: materialise (N, N, d) embeddings of clip(j - i) and use them in both products
    rel = np.clip(np.arange(n)[None, :] - np.arange(n)[:, None], -kk, kk) + kk
    ek, ev = ak[rel], av[rel]
    logits = (q @ np.swapaxes(k, -1, -2) + np.einsum("bhid,ijd->bhij", q, ek)) / np.sqrt(d)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    w /= w.sum(-1, keepdims=True)
    ref = w @ v + np.einsum("bhij,ijd->bhid", w, ev)
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-13)


# ------------------------------------------------------------------------------ exact memory-efficient forms

EXACT = {
    "flash": (flash_attention_forward, flash_attention_backward, lambda n, m: {"block_q": 3, "block_k": 5}),
    "flash_base2": (flash_attention_forward, flash_attention_backward,
                    lambda n, m: {"block_q": 4, "block_k": 2, "lse_base": "2"}),
    "rabe_staats": (rabe_staats_forward, rabe_staats_backward,
                    lambda n, m: {"query_chunk_size": 3, "key_chunk_size": 4}),
    "rabe_staats_flash_bwd": (rabe_staats_forward, rabe_staats_backward,
                              lambda n, m: {"query_chunk_size": 5, "key_chunk_size": 3, "backward_mode": "flash"}),
    "tree": (tree_attention_forward, tree_attention_backward, lambda n, m: {"chunk_sizes": [2, 1, m - 3]}),
}


@pytest.mark.parametrize("name", list(EXACT))
@pytest.mark.parametrize("causal", [False, True])
def test_exact_forms_equal_sdpa(name, causal):
    fwd, bwd, blocks = EXACT[name]
    rng = np.random.default_rng(13)
    n, m = 7, 11  # not multiples of the block sizes
    q = rng.standard_normal((2, 4, n, 3)) * 2
    k = rng.standard_normal((2, 2, m, 3)) * 2
    v = rng.standard_normal((2, 2, m, 2))
    keep = rng.random((2, 1, n, m)) > 0.25
    keep[:, :, 3] = False  # fully masked row
    cfg = {"attn_mask": keep, "is_causal": causal, "causal_alignment": "bottom_right", "scale": 0.6}
    with warnings.catch_warnings(), np.errstate(all="raise"):
        warnings.simplefilter("error")
        out, cache = fwd(q, k, v, **blocks(n, m), **cfg)
        G = rng.standard_normal(out.shape)
        g = bwd(G, cache)
    ref, rc = sdpa_forward(q, k, v, **cfg)
    gr = sdpa_backward(G, rc)
    np.testing.assert_allclose(out, ref, rtol=0, atol=1e-12)
    assert not out[:, :, 3].any() and not g["q"][:, :, 3].any()
    for x in "qkv":
        np.testing.assert_allclose(g[x], gr[x], rtol=0, atol=1e-12, err_msg=x)
    lse = cache["lse"] * np.log(2) if cache.get("lse_base") == "2" else cache["lse"]
    fin = np.isfinite(rc["lse"])
    np.testing.assert_array_equal(np.isfinite(lse), fin)
    np.testing.assert_allclose(lse[fin], rc["lse"][fin], rtol=0, atol=1e-12)


def test_exact_forms_huge_logits_and_tiny():
    rng = np.random.default_rng(14)
    q = rng.standard_normal((1, 1, 3, 1)) * 100
    k = rng.standard_normal((1, 1, 4, 1)) * 100  # logits ~ +-1e4
    v = rng.standard_normal((1, 1, 4, 1))
    ref = sdpa(q, k, v, scale=1.0)
    with np.errstate(over="raise", invalid="raise", divide="raise"):
        for fwd, _, blocks in EXACT.values():
            out = fwd(q, k, v, scale=1.0, **blocks(3, 4))[0]
            np.testing.assert_allclose(out, ref, rtol=0, atol=1e-12)
    one = [rng.standard_normal((1, 1, 1, 1)) for _ in range(3)]
    np.testing.assert_array_equal(flash_attention(*one), one[2])
    np.testing.assert_array_equal(rabe_staats_forward(*one)[0], one[2])
    np.testing.assert_array_equal(tree_attention_forward(*one, num_chunks=1)[0], one[2])


def test_tree_merge_order_free():
    rng = np.random.default_rng(15)
    parts = [chunk_summary(rng.standard_normal((3, c)) * 4, rng.standard_normal((c, 2))) for c in (1, 4, 2, 3, 5)]
    a, rounds = tree_reduce(parts)
    b, _ = tree_reduce(parts[::-1])
    c = parts[0]
    for p in parts[1:]:
        c = merge_summaries(c, p)  # left fold (flash-decoding order)
    assert rounds == 3
    for x, y in ((a, b), (a, c)):
        for u, w in zip(x, y, strict=True):
            np.testing.assert_allclose(u, w, rtol=1e-13, atol=1e-13)


def test_exact_forms_bad_blocks():
    q = np.ones((1, 1, 3, 2))
    with pytest.raises(ValueError, match="block_q"):
        flash_attention_forward(q, q, q, block_q=0)
    with pytest.raises(TypeError, match="key_chunk_size"):
        rabe_staats_forward(q, q, q, key_chunk_size=2.0)
    with pytest.raises(ValueError, match="chunk_sizes"):
        tree_attention_forward(q, q, q, chunk_sizes=[1, 1])
    with pytest.raises(ValueError, match="lse_base"):
        flash_attention_forward(q, q, q, lse_base="10")


@pytest.mark.parametrize("name", ["flash", "rabe_staats"])
def test_exact_forms_peak_memory(name):
    # no N x M score matrix: the tiled forward's peak allocation is far below plain SDPA's
    import tracemalloc
    fwd = {"flash": lambda q, k, v: flash_attention_forward(q, k, v, block_q=32, block_k=32),
           "rabe_staats": lambda q, k, v: rabe_staats_forward(q, k, v, query_chunk_size=32, key_chunk_size=32)}[name]
    rng = np.random.default_rng(16)
    q, k, v = (rng.standard_normal((1, 1, 384, 8)) for _ in range(3))
    peaks = []
    for f in (lambda q, k, v: sdpa_forward(q, k, v), fwd):
        tracemalloc.start()
        out = f(q, k, v)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        del out
    assert peaks[1] * 4 < peaks[0], peaks
