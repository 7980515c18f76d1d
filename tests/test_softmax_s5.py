"""Slice 5 of the softmax breadth (masks and selection): what the registry cannot express.

Selections against brute-force loops, special cases named by the catalogue, argument errors."""

import importlib

import numpy as np
import pytest

crate = importlib.import_module("refattn.attention.softmax.crate")


# --------------------------------------------------------------------------------------------- CRATE

def test_crate_zero_dictionary_is_shifted_relu_of_layernorm():
    # D = 0: Z+ = ReLU(X - eta*lambda) with X = LN(Z + MSSA(LN Z))
    rng = np.random.default_rng(0)
    z = rng.standard_normal((2, 5, 6))
    p = crate.init_crate_params(rng, 6, 2, 3)
    p["ff.fn.weight"] = np.zeros((6, 6))
    y, c = crate.crate_block_forward(z, p, num_heads=2, step_size=0.5, lambd=0.2)
    assert np.allclose(y, np.maximum(c["x"] - 0.1, 0.0), atol=1e-14)


def test_crate_tied_projection_equals_mha_with_three_equal_weights():
    # the MSSA half-step is MHA whose q/k/v weights are all U (checked through the residual Z^{1/2})
    from refattn.attention.softmax.mha import mha_forward
    from refattn.nn.norms import layer_norm
    rng = np.random.default_rng(1)
    z = rng.standard_normal((2, 4, 6))
    p = crate.init_crate_params(rng, 6, 3, 2)
    _, c = crate.crate_block_forward(z, p, num_heads=3)
    u = p["attn.fn.qkv.weight"]
    y1 = layer_norm(z, {"weight": p["attn.norm.weight"], "bias": p["attn.norm.bias"]})
    o, _ = mha_forward(y1, params={"q_proj": u, "k_proj": u, "v_proj": u, "out_proj": p["attn.fn.to_out.0.weight"]},
                       num_heads=3)
    assert np.allclose(c["oc"] @ p["attn.fn.to_out.0.weight"], o, atol=1e-13)


def test_crate_bad_arguments():
    rng = np.random.default_rng(2)
    z = rng.standard_normal((2, 4, 6))
    p = crate.init_crate_params(rng, 6, 2, 3)
    with pytest.raises(ValueError, match="attn.fn.qkv.weight"):
        crate.crate_block_forward(z, p, num_heads=4)
    q = {k: v for k, v in p.items() if not k.startswith("attn.fn.to_out")}
    with pytest.raises(ValueError, match="qkv width must equal"):
        crate.crate_block_forward(z, {**q, "attn.fn.qkv.weight": np.ones((6, 4))}, num_heads=2)
    with pytest.raises(ValueError, match="step_size"):
        crate.crate_block_forward(z, p, num_heads=2, step_size=-1.0)


# ---------------------------------------------------------------------------------------------- TOVA

tova = importlib.import_module("refattn.attention.softmax.tova")


def _brute_eviction_order(q, k, cache_size):
    # token by token: grow the cache, then delete the argmin of the head-mean softmax weights
    h, n, d = q.shape
    g = h // k.shape[0]
    cache, evicted = [], []
    for t in range(n):
        cache.append(t)
        if len(cache) > cache_size:
            a = np.zeros(len(cache))
            for hh in range(h):
                sc = np.array([q[hh, t] @ k[hh // g, j] / np.sqrt(d) for j in cache])
                w = np.exp(sc - sc.max())
                a += w / w.sum() / h
            evicted.append(cache.pop(int(np.argmin(a))))
        else:
            evicted.append(None)
    return evicted


@pytest.mark.parametrize("hkv", [1, 3])
def test_tova_eviction_order_matches_brute_force(hkv):
    rng = np.random.default_rng(10 + hkv)
    q, k = rng.standard_normal((3, 3, 11, 4)), rng.standard_normal((3, hkv, 11, 4))
    _, hist = tova.tova_keep_mask(q, k, cache_size=4)
    for b in range(3):
        order = _brute_eviction_order(q[b], k[b], 4)
        for t in range(11):
            prev = set(hist[b][t - 1]) | {t} if t else {0}
            gone = prev - set(hist[b][t])
            assert gone == ({order[t]} if order[t] is not None else set()), (b, t)


def test_tova_prefill_block_keeps_top_k_of_last_prompt_query():
    rng = np.random.default_rng(3)
    q, k = rng.standard_normal((2, 2, 8, 3)), rng.standard_normal((2, 2, 8, 3))
    _, hist = tova.tova_keep_mask(q, k, cache_size=3, prefill=6)
    for b in range(2):
        s = np.einsum("hd,hjd->hj", q[b, :, 5], k[b, :, :6]) / np.sqrt(3)
        w = np.exp(s - s.max(-1, keepdims=True))
        a = (w / w.sum(-1, keepdims=True)).mean(0)
        assert list(hist[b][5]) == sorted(np.argsort(-a)[:3].tolist())


def test_tova_gradient_is_masked_attention_with_fixed_mask():
    from refattn.attention.softmax.core import attention_core_backward, attention_core_forward
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((2, 2, 7, 3)) for _ in range(3))
    y, c = tova.tova_attention_forward(q, k, v, cache_size=3)
    y2, c2 = attention_core_forward(q, k, v, attn_mask=c["keep"][:, None])
    G = rng.standard_normal(y.shape)
    g, g2 = tova.tova_attention_backward(G, c), attention_core_backward(G, c2)
    assert np.allclose(y, y2, atol=1e-14) and all(np.allclose(g[n], g2[n], atol=1e-14) for n in "qkv")
    assert not c["keep"][:, 6, :3].all()          # something was evicted


def test_tova_bad_arguments():
    q = np.zeros((2, 2, 5, 3))
    with pytest.raises(ValueError, match="cache_size"):
        tova.tova_attention_forward(q, q, q, cache_size=0)
    with pytest.raises(ValueError, match="prefill"):
        tova.tova_attention_forward(q, q, q, cache_size=2, prefill=6)
    with pytest.raises(ValueError, match="one batch axis"):
        tova.tova_attention_forward(q[0], q[0], q[0], cache_size=2)


# ---------------------------------------------------------------------------------------------- PLGA

plga = importlib.import_module("refattn.attention.softmax.plga")


def test_plga_metric_causal_matches_prefix_loop_and_gradient_has_no_future():
    # metric_causal: the Jacobian of output t w.r.t. any input after t is zero (backward included)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 4, 6))
    p = plga.init_plga_params(rng, 6, 2, 3)
    y, c = plga.plga_attention_forward(x, x, x, p, num_heads=2, metric_causal=True, is_causal=True)
    assert np.allclose(y, plga._reference(x, x, x, p, num_heads=2, metric_causal=True, is_causal=True), atol=1e-13)
    G = np.zeros_like(y)
    G[:, 1] = rng.standard_normal((2, y.shape[-1]))
    g = plga.plga_attention_backward(G, c)
    for name in ("query", "key", "value"):
        assert np.abs(g[name][:, 2:]).max() == 0.0 and np.abs(g[name][:, :2]).max() > 1e-6


def test_plga_bad_arguments():
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 4, 6))
    p = plga.init_plga_params(rng, 6, 2, 3)
    with pytest.raises(ValueError, match="wq.kernel"):
        plga.plga_attention_forward(x, x, x, p, num_heads=4)
    with pytest.raises(ValueError, match="metric_causal"):
        plga.plga_attention_forward(x, x[:, :3], x[:, :3], p, num_heads=2, metric_causal=True)
    with pytest.raises(ValueError, match="adj_power0"):
        plga.plga_attention_forward(x, x, x, {**p, "plga_layer.adj_power0": np.ones((2, 2, 2))}, num_heads=2)
    with pytest.raises(ValueError, match="denseA1"):
        plga.plga_attention_forward(x, x, x, {**p, "layernormA1.gamma": np.ones(3)}, num_heads=2)


# ------------------------------------------------------------------------------- value suppression

vps = importlib.import_module("refattn.attention.softmax.value_suppression")


def test_value_suppression_clamped_norm_branch_gradient():
    # a value with ||v||^2 < 1e-6 uses the clamp: forward and backward agree with finite differences
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3, 4))
    p = vps.init_value_suppression_params(rng, 4, 1, 2, bias=True)
    # make token 1's value (almost) zero through the value bias: v = x W_v + b_v
    wv = p["c_attn.weight"][:, 4:6]
    p["c_attn.bias"][4:6] = -(x[0, 1] @ wv) + 1e-4
    y, c = vps.value_parallel_suppression_forward(x, p, num_heads=1, use_rope=False)
    assert not c["active"][0, 0, 1, 0]
    G = rng.standard_normal(y.shape)
    g = vps.value_parallel_suppression_backward(G, c)["c_proj.weight"]
    eps, num = 1e-6, np.zeros_like(g)
    for idx in np.ndindex(g.shape):
        pp = {k: v.copy() for k, v in p.items()}
        pp["c_proj.weight"][idx] += eps
        up = np.sum(G * vps.value_parallel_suppression(x, pp, num_heads=1, use_rope=False))
        pp["c_proj.weight"][idx] -= 2 * eps
        num[idx] = (up - np.sum(G * vps.value_parallel_suppression(x, pp, num_heads=1, use_rope=False))) / (2 * eps)
    assert np.allclose(g, num, atol=1e-7)


def test_value_suppression_bad_arguments():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, 3, 4))
    p = vps.init_value_suppression_params(rng, 4, 2, 2)
    with pytest.raises(ValueError, match="op"):
        vps.value_parallel_suppression_forward(x, p, num_heads=2, op="drop_parallel")
    with pytest.raises(ValueError, match="c_attn.weight"):
        vps.value_parallel_suppression_forward(x, p, num_heads=3)
    with pytest.raises(TypeError, match="alpha"):
        vps.value_parallel_suppression_forward(x, p, num_heads=2, alpha="1")
    q = vps.init_value_suppression_params(rng, 4, 1, 3)
    with pytest.raises(ValueError, match="even head width"):
        vps.value_parallel_suppression_forward(x, q, num_heads=1)


# ---------------------------------------------------------------------------------------------- NAtS

nats = importlib.import_module("refattn.attention.softmax.nats_mask")


def test_nats_local_token_leaves_cache_after_next_global():
    # types  G L S L G L : the Local token 1 is seen by queries 1..4 (next Global at 4), not 5;
    # the Sliding token 2 with w=1 by queries 2..3; Global tokens 0 and 4 by every later query
    t = np.array([[[0, 1, 2, 1, 0, 1]]])
    keep = nats.nats_keep_mask(t, local_seq_max_length=1)[0, 0]
    assert keep[1:5, 1].all() and not keep[5, 1]
    assert keep[2:4, 2].all() and not keep[4:, 2].any()
    assert keep[:, 0].all() and keep[4:, 4].all()
    assert keep[5, 5] and not np.triu(keep, 1).any()


def test_nats_type_rule():
    lg = np.zeros((1, 3, 1, 3))
    lg[0, :, 0] = [[0.0, 0.05, -1.0], [0.0, 0.2, -1.0], [0.0, 0.0, 0.3]]
    # token 0: Local by 0.05 without the bonus, Global with it (and forced); token 1: 0.2 beats the
    # 0.1 bonus -> Local; token 2 -> Sliding
    assert nats.nats_token_types(lg).tolist() == [[[0, 1, 2]]]
    assert nats.nats_token_types(lg, force_first_global=False).tolist() == [[[0, 1, 2]]]
    assert nats.nats_token_types(lg, global_token_enhanced_value=0.0, force_first_global=False).tolist() == [[[1, 1, 2]]]


def test_nats_bad_arguments():
    q = np.zeros((2, 2, 4, 3))
    with pytest.raises(ValueError, match="token_types must have shape"):
        nats.nats_attention_forward(q, q, q, token_types=np.zeros((2, 1, 4), dtype=int))
    with pytest.raises(ValueError, match="token_types must be integers"):
        nats.nats_attention_forward(q, q, q, token_types=np.full((2, 2, 4), 3))
