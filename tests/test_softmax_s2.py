"""Softmax Q/K/V variants (issue 14, slice s2): what the generated registry tests cannot express.

* finite-difference gradchecks over the configurations one registry sample cannot cover (every
  symbol retriever, given symbols and GQA of the dual attention layer; every selector/controller
  combination of reversed attention; both MHE modes with cross-attention; DiffQKV with the
  compressed-key projection, RoPE and both activations; the single skip-layer layer with its
  ``skip_k``/``skip_v`` inputs and the extra ``dk``/``dv`` gradients);
* PyTorch parity against ``torch.nn.functional.scaled_dot_product_attention`` where a layer
  reduces to it (DiffQKV's independent key/value head maps, persistent memory as SDPA over the
  concatenated keys), skipped without torch;
* the ``positional_encodings`` package's 2-D table (KV Transformer), skipped without it;
* edge cases (fully padded poly-encoder context, masked rows reading only the memory) and
  argument errors that name the argument.
"""

from __future__ import annotations

import numpy as np
import pytest

from refattn.attention.softmax import (
    diffqkv_attention_backward,
    diffqkv_attention_forward,
    dual_attention_backward,
    dual_attention_forward,
    init_diffqkv_params,
    init_mhe_params,
    init_persistent_memory_params,
    init_reversed_attention_params,
    init_skip_layer_params,
    key_value_attention_forward,
    mhe_attention_backward,
    mhe_attention_forward,
    persistent_memory_attention_forward,
    poly_encoder_attention_backward,
    poly_encoder_attention_forward,
    positional_encoding_2d,
    relational_attention_backward,
    relational_attention_forward,
    reversed_attention_backward,
    reversed_attention_forward,
    skip_layer_attention_backward,
    skip_layer_attention_forward,
    skip_layer_stack_backward,
    skip_layer_stack_forward,
)
from refattn.registry import Sample
from refattn.testing import gradcheck

RNG = np.random.default_rng(1234)


def _dual_params(rng, c, hsa, hra, retrieval, **kw):
    from refattn.attention.softmax import relational_attention as ra

    return ra._init(rng, c, hsa, hra, retrieval=retrieval, **kw)  # noqa: SLF001 - test helper of the record


@pytest.mark.parametrize("retrieval", ["symbolic_attention", "positional_symbols", "position_relative"])
def test_dual_attention_gradcheck_every_retriever(retrieval):
    rng = np.random.default_rng(0)
    p = _dual_params(rng, 4, 1, 1, retrieval, n_symbols=2, max_rel=1, bias=True)
    s = Sample(inputs={"x": rng.standard_normal((2, 3, 4))}, params=p,
               config={"n_heads_sa": 1, "n_heads_ra": 1, "symbol_retrieval": retrieval, "is_causal": True})
    gradcheck(dual_attention_forward, dual_attention_backward, s)


def test_dual_attention_given_symbols_gqa_symmetric_gradcheck():
    rng = np.random.default_rng(1)
    p = _dual_params(rng, 6, 1, 2, "symbolic_attention", symmetric_rels=True)
    p = {k: v for k, v in p.items() if not k.startswith("symbol_retriever.")}
    c = 6 // 3
    p["relational_attention.wk_attn.weight"] = p["relational_attention.wk_attn.weight"][:, :c]
    p["relational_attention.wv.weight"] = p["relational_attention.wv.weight"][:, :c]
    s = Sample(inputs={"x": rng.standard_normal((2, 3, 6)), "symbols": rng.standard_normal((2, 3, 6))}, params=p,
               config={"n_heads_sa": 1, "n_heads_ra": 2, "n_kv_heads": 1, "symmetric_rels": True})
    gradcheck(dual_attention_forward, dual_attention_backward, s)


def test_relational_attention_relative_symbol_table_gradcheck():
    # symbols of shape (N, N, C): the pair-wise contraction alpha_ij * G_i W_v^T for the table's gradient
    rng = np.random.default_rng(2)
    p = _dual_params(rng, 4, 0, 2, "position_relative")
    p = {k.removeprefix("relational_attention."): v for k, v in p.items() if k.startswith("relational_attention.")}
    s = Sample(inputs={"x": rng.standard_normal((2, 3, 4)), "symbols": rng.standard_normal((3, 3, 4))}, params=p,
               config={"n_heads": 2, "relative_symbols": True, "is_causal": True})

    def fwd(x, symbols, params, **cfg):
        return relational_attention_forward(x, symbols, params, **cfg)

    gradcheck(fwd, relational_attention_backward, s)


@pytest.mark.parametrize("hs,mc", [(True, True), (True, False), (False, True), (False, False)])
def test_reversed_attention_gradcheck_every_combination(hs, mc):
    rng = np.random.default_rng(3)
    p = init_reversed_attention_params(rng, 4, 2, head_selector=hs, message_controller=mc, qkv_bias=True)
    s = Sample(inputs={"x": rng.standard_normal((2, 3, 4)), "m": rng.uniform(0.3, 1, (2, 3))}, params=p,
               config={"num_heads": 2, "head_selector": hs, "message_controller": mc})
    gradcheck(reversed_attention_forward, reversed_attention_backward, s)


def test_reversed_attention_without_m_has_no_m_gradient():
    rng = np.random.default_rng(4)
    p = init_reversed_attention_params(rng, 4, 2)
    y, c = reversed_attention_forward(rng.standard_normal((2, 3, 4)), p, num_heads=2)
    assert "m" not in reversed_attention_backward(np.ones_like(y), c)
    with pytest.raises(ValueError, match="m must have shape"):
        reversed_attention_forward(rng.standard_normal((2, 3, 4)), p, np.ones((2, 4)), num_heads=2)


@pytest.mark.parametrize("mode", ["add", "mul"])
def test_mhe_cross_attention_gradcheck(mode):
    rng = np.random.default_rng(5)
    p = init_mhe_params(rng, 3, 2, 2, mode=mode, c_context=4)
    s = Sample(inputs={"x": rng.standard_normal((2, 3, 3)), "context": rng.standard_normal((2, 4, 4))}, params=p,
               config={"num_heads": 2, "mode": mode})
    gradcheck(mhe_attention_forward, mhe_attention_backward, s)


@pytest.mark.parametrize("act", ["silu", "gelu"])
def test_diffqkv_compressed_key_rope_gradcheck(act):
    rng = np.random.default_rng(6)
    p = init_diffqkv_params(rng, 3, 2, 1, 2, 2, key_dim=1, aug_dim=3, bias=True)
    s = Sample(inputs={"x": rng.standard_normal((2, 3, 3))}, params=p,
               config={"num_heads": 2, "num_key_heads": 1, "num_value_heads": 2, "aug_q_act": act,
                       "rope_theta": 100.0})
    gradcheck(diffqkv_attention_forward, diffqkv_attention_backward, s)


def test_diffqkv_matches_torch_sdpa_with_separate_head_maps():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    hq, hk, hv, d = 6, 2, 3, 2
    p = init_diffqkv_params(rng, 5, hq, hk, hv, d)
    x = rng.standard_normal((2, 4, 5))
    y, c = diffqkv_attention_forward(x, p, num_heads=hq, num_key_heads=hk, num_value_heads=hv, augmented_q=False)
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in p.items()}
    xt = torch.tensor(x, requires_grad=True)

    def heads(t, n):
        return t.view(2, 4, n, -1).transpose(1, 2)

    q, k, v = heads(xt @ tp["q_proj.weight"], hq), heads(xt @ tp["k_proj.weight"], hk), heads(xt @ tp["v_proj.weight"], hv)
    k, v = k.repeat_interleave(hq // hk, dim=1), v.repeat_interleave(hq // hv, dim=1)
    o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    yt = o.transpose(1, 2).reshape(2, 4, -1) @ tp["o_proj.weight"]
    g = rng.standard_normal(y.shape)
    yt.backward(torch.tensor(g))
    grads = diffqkv_attention_backward(g, c)
    assert np.abs(y - yt.detach().numpy()).max() < 1e-13
    assert np.abs(grads["x"] - xt.grad.numpy()).max() < 1e-13
    for key in p:
        assert np.abs(grads[key] - tp[key].grad.numpy()).max() < 1e-13, key


def test_diffqkv_argument_errors():
    rng = np.random.default_rng(8)
    p = init_diffqkv_params(rng, 4, 4, 2, 2, 2)
    x = rng.standard_normal((2, 3, 4))
    with pytest.raises(ValueError, match="num_value_heads"):
        diffqkv_attention_forward(x, p, num_heads=4, num_key_heads=2, num_value_heads=3, augmented_q=False)
    with pytest.raises(ValueError, match="q_gate_proj.weight"):
        diffqkv_attention_forward(x, p, num_heads=4, num_key_heads=2, num_value_heads=2)
    with pytest.raises(ValueError, match="k_up_proj.weight"):
        bad = dict(p, **{"k_proj.weight": rng.standard_normal((4, 2))})
        diffqkv_attention_forward(x, bad, num_heads=4, num_key_heads=2, num_value_heads=2, augmented_q=False)


def test_skip_layer_single_layer_gradcheck_with_skip_inputs():
    rng = np.random.default_rng(9)
    p = init_skip_layer_params(rng, 3, 2, 1)
    s = Sample(inputs={"x": rng.standard_normal((2, 3, 3)), "skip_k": rng.standard_normal((2, 2, 3, 1)),
                       "skip_v": rng.standard_normal((2, 2, 3, 1))}, params=p,
               config={"num_heads": 2, "skip_heads": (1,), "is_causal": True})
    gradcheck(skip_layer_attention_forward, skip_layer_attention_backward, s)


def test_skip_layer_extra_kv_gradients_and_unused_heads():
    rng = np.random.default_rng(10)
    p = init_skip_layer_params(rng, 4, 2, 2)
    x, sk, sv = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 2, 3, 2)), rng.standard_normal((2, 2, 3, 2))
    y, c = skip_layer_attention_forward(x, p, sk, sv, num_heads=2, skip_heads=1)
    g, dk, dv = rng.standard_normal(y.shape), rng.standard_normal(c["k"].shape), rng.standard_normal(c["v"].shape)
    grads = skip_layer_attention_backward(g, c, dk=dk, dv=dv)
    # the unused (non-skip) head of skip_k gets nothing; the loss <y,G> + <k,dk> + <v,dv> is matched by FD on x
    assert np.all(grads["skip_k"][:, 1] == 0) and np.all(grads["skip_v"][:, 1] == 0)

    def loss(xx):
        yy, cc = skip_layer_attention_forward(xx, p, sk, sv, num_heads=2, skip_heads=1)
        return np.sum(yy * g) + np.sum(cc["k"] * dk) + np.sum(cc["v"] * dv)

    eps = 1e-6
    for idx in [(0, 0, 0), (1, 2, 3), (0, 1, 2)]:
        xp, xm = x.copy(), x.copy()
        xp[idx] += eps
        xm[idx] -= eps
        fd = (loss(xp) - loss(xm)) / (2 * eps)
        assert abs(fd - grads["x"][idx]) < 1e-7 * max(1.0, abs(fd))


def test_skip_layer_stack_three_layers_distance_two_gradcheck():
    rng = np.random.default_rng(11)
    p = init_skip_layer_params(rng, 2, 2, 1, num_layers=3, bias=False)
    s = Sample(inputs={"x": rng.standard_normal((2, 3, 2))}, params=p,
               config={"num_layers": 3, "num_heads": 2, "skip_heads": (0, 1), "skip_distance": 2})
    gradcheck(skip_layer_stack_forward, skip_layer_stack_backward, s)


def test_skip_layer_argument_errors():
    rng = np.random.default_rng(12)
    p = init_skip_layer_params(rng, 4, 2, 2)
    x = rng.standard_normal((2, 3, 4))
    with pytest.raises(ValueError, match="skip_heads"):
        skip_layer_attention_forward(x, p, num_heads=2, skip_heads=(0, 2))
    with pytest.raises(ValueError, match="skip_heads"):
        skip_layer_attention_forward(x, p, num_heads=2, skip_heads=3)
    with pytest.raises(TypeError, match="skip_k and skip_v"):
        skip_layer_attention_forward(x, p, np.zeros((2, 2, 3, 2)), num_heads=2)
    with pytest.raises(ValueError, match="skip_k"):
        skip_layer_attention_forward(x, p, np.zeros((2, 3, 3, 2)), np.zeros((2, 3, 3, 2)), num_heads=2)


def test_persistent_memory_is_sdpa_over_concatenated_keys_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(13)
    p = init_persistent_memory_params(rng, 4, 2, 3, 2)
    x = rng.standard_normal((2, 5, 4))
    y, c = persistent_memory_attention_forward(x, params=p, num_heads=2, memory_reparam=False)

    def heads(t):
        return t.reshape(2, 5, 2, 3).transpose(0, 2, 1, 3)

    q, k, v = heads(x @ p["proj_query.weight"]), heads(x @ p["proj_key.weight"]), heads(x @ p["proj_val.weight"])
    mk = np.broadcast_to(np.swapaxes(p["persistent_memory.key"], 1, 2), (2, 2, 2, 3))
    mv = np.broadcast_to(p["persistent_memory.val"], (2, 2, 2, 3))
    o = torch.nn.functional.scaled_dot_product_attention(torch.tensor(q), torch.tensor(np.concatenate([k, mk], 2)),
                                                         torch.tensor(np.concatenate([v, mv], 2))).numpy()
    ref = o.transpose(0, 2, 1, 3).reshape(2, 5, 6) @ p["proj_out.weight"]
    assert np.abs(y - ref).max() < 1e-13


def test_persistent_memory_argument_errors():
    rng = np.random.default_rng(14)
    p = init_persistent_memory_params(rng, 4, 2, 2, 3)
    x = rng.standard_normal((2, 3, 4))
    with pytest.raises(ValueError, match="persistent_memory.val"):
        persistent_memory_attention_forward(x, params=dict(p, **{"persistent_memory.val": np.zeros((2, 4, 2))}),
                                            num_heads=2)
    with pytest.raises(ValueError, match="attn_mask"):
        persistent_memory_attention_forward(x, params=p, num_heads=2, attn_mask=np.ones((3, 4), bool))


def test_poly_encoder_fully_padded_context_and_errors():
    rng = np.random.default_rng(15)
    ctxt, cand = rng.standard_normal((2, 4, 3)), rng.standard_normal((2, 2, 3))
    mask = np.ones((2, 4), bool)
    mask[1] = False
    out, c = poly_encoder_attention_forward(ctxt, cand, {"codes": rng.uniform(0, 1, (3, 3))}, ctxt_mask=mask)
    assert np.all(out[1] == 0) and np.all(np.isfinite(out))
    g = poly_encoder_attention_backward(np.ones_like(out), c)
    assert np.all(g["ctxt"][1] == 0)
    with pytest.raises(TypeError, match="ctxt_pos"):
        poly_encoder_attention_forward(ctxt, cand, {"codes": np.ones((3, 3))}, attention_keys="position")
    with pytest.raises(ValueError, match="codes"):
        poly_encoder_attention_forward(ctxt, cand, {"codes": np.ones((3, 2))})
    with pytest.raises(TypeError, match="ctxt_mask"):
        poly_encoder_attention_forward(ctxt, cand, {"codes": np.ones((3, 3))}, ctxt_mask=np.ones((2, 4)))


def test_key_value_table_matches_positional_encodings_package():
    torch = pytest.importorskip("torch")
    pe = pytest.importorskip("positional_encodings.torch_encodings")
    ref = pe.PositionalEncoding2D(10)(torch.zeros(1, 7, 5, 10, dtype=torch.float64))[0].numpy()
    # the package computes its frequencies in float32
    assert np.abs(positional_encoding_2d(7, 5, 10) - ref).max() < 1e-6


def test_key_value_errors_name_the_argument():
    rng = np.random.default_rng(16)
    x = rng.standard_normal((2, 3, 4))
    with pytest.raises(ValueError, match="kv_proj.weight"):
        key_value_attention_forward(x, {"kv_proj.weight": np.ones((4, 6)), "o_proj.weight": np.ones((2, 4))},
                                    num_heads=2)
    with pytest.raises(ValueError, match="map_pos"):
        key_value_attention_forward(x, {"kv_proj.weight": np.ones((4, 8)), "o_proj.weight": np.ones((4, 4)),
                                        "map_pos.weight": np.ones((10, 1))}, num_heads=2)
