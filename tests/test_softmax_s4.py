"""Softmax-family slice 4 (additive, BiDAF, GMM/DCA, latent alignment, MHN HOA, monotonic location,
Neural Attention, VQA high-order attention): what the generated registry tests cannot express —
configurations the records' samplers do not draw at seed 0, the fixed selections and masks against
brute force, argument errors, and autograd parity of the two recurrences (backward through time)."""

from __future__ import annotations

import importlib

import numpy as np
import pytest
from scipy.stats import betabinom

from refattn.attention.softmax import additive as add_mod
from refattn.attention.softmax import (
    additive_scores,
    bidaf_attention_forward,
    dca_attention_backward,
    dca_attention_forward,
    dca_prior_filter,
    doubly_stochastic_penalty_backward,
    doubly_stochastic_penalty_forward,
    gmm_attention_backward,
    gmm_attention_forward,
    hoa_forward,
    hoa_param_spec,
    hoa_vqa_backward,
    hoa_vqa_forward,
    init_dca_params,
    init_gmm_params,
    init_neural_attention_params,
    latent_alignment_backward,
    latent_alignment_forward,
    monotonic_location_backward,
    monotonic_location_forward,
    neural_attention_forward,
    reverse_within_length,
    soft_attention_backward,
    soft_attention_forward,
)
from refattn.attention.softmax import bidaf as bidaf_mod
from refattn.attention.softmax import high_order_vqa as vqa_mod
from refattn.attention.softmax import location_relative as loc_mod
from refattn.attention.softmax import monotonic_location as mono_mod
from refattn.registry import Sample
from refattn.testing import gradcheck

# Modules named like their main function: the package attribute is the function, so take the module.
lat_mod = importlib.import_module("refattn.attention.softmax.latent_alignment")
na_mod = importlib.import_module("refattn.attention.softmax.neural_attention")


def test_additive_deep_attention_and_mask_gradcheck():
    rng = np.random.default_rng(11)
    s = add_mod._sample(rng, "tiny", selector=True, n_layers_att=3)
    s.config["mask"] = np.array([[True, True, False], [True, False, True]])
    gradcheck(soft_attention_forward, soft_attention_backward, s)
    z, c = soft_attention_forward(**s.inputs, params=s.params, **s.config)
    assert np.all(c["alpha"][0, :, 2] == 0.0) and np.all(c["alpha"][1, :, 1] == 0.0)


@pytest.mark.parametrize("normalize", ["mean", "sum"])
def test_doubly_stochastic_penalty_gradcheck(normalize):
    rng = np.random.default_rng(12)
    s = Sample(inputs={"alpha": rng.dirichlet(np.ones(4), size=(2, 3))}, config={"alpha_c": 0.6, "normalize": normalize})
    gradcheck(doubly_stochastic_penalty_forward, doubly_stochastic_penalty_backward, s)


def test_additive_scores_match_explicit_pairs():
    rng = np.random.default_rng(13)
    qp, kp, v = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 4)), rng.standard_normal(4)
    e, _ = additive_scores(qp, kp, v, 0.3)
    want = np.array([[[np.tanh(qp[b, t] + kp[b, i]) @ v + 0.3 for i in range(5)] for t in range(3)] for b in range(2)])
    np.testing.assert_allclose(e, want, rtol=0, atol=1e-14)


def test_bidaf_forward_equals_upstream_additive_mask():
    # Upstream adds -1e30 to masked logits; refattn replaces them. Forwards agree exactly (absorption).
    rng = np.random.default_rng(14)
    h, u = rng.standard_normal((2, 5, 3)), rng.standard_normal((2, 4, 3))
    p = bidaf_mod.init_bidaf_params(rng, 3)
    hm = np.array([[True] * 5, [True, True, True, False, False]])
    um = np.array([[True, True, False, False], [True] * 4])
    out, _ = bidaf_attention_forward(h, u, p, h_mask=hm, u_mask=um)
    s = bidaf_mod.bidaf_similarity(h, u, p["u_logits.first.Matrix"][:, 0], p["u_logits.first.Bias"][0])
    s = s + (1.0 - (hm[:, :, None] & um[:, None, :])) * -1e30
    a = np.exp(s - s.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    ut = a @ u
    m = s.max(-1)
    bw = np.exp(m - m.max(-1, keepdims=True))
    bw /= bw.sum(-1, keepdims=True)
    ht = np.einsum("bt,btd->bd", bw, h)[:, None]
    want = np.concatenate([h, ut, h * ut, h * ht], -1)
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-13)


def test_bidaf_argmax_is_held_fixed_in_backward():
    # The Q2C max routes its gradient to one query word per context word: brute force over the selection.
    rng = np.random.default_rng(15)
    s = bidaf_mod._sample(rng, "small")
    out, c = bidaf_attention_forward(**s.inputs, params=s.params, **s.config)
    jmax = c["jmax"]
    for bb in range(jmax.shape[0]):
        for t in range(jmax.shape[1]):
            row = c["s"][bb, t]
            assert row[jmax[bb, t]] == row.max()


def test_dca_prior_taps_and_causality():
    np.testing.assert_allclose(dca_prior_filter(11, 0.1, 0.9), betabinom.pmf(np.arange(11), 10, 0.1, 0.9), rtol=1e-15)
    rng = np.random.default_rng(16)
    p = init_dca_params(rng, 3, 4, static_channels=2, static_kernel_size=3, dynamic_channels=2, dynamic_kernel_size=3)
    q, mem = rng.standard_normal((2, 1, 3)), rng.standard_normal((2, 8, 2))
    a0 = rng.dirichlet(np.ones(8), size=2)
    _, c = dca_attention_forward(q, mem, p, initial_alignment=a0)
    taps = dca_prior_filter()
    want = np.array([[sum(taps[k] * a0[b, j - k] for k in range(11) if j - k >= 0) for j in range(8)] for b in range(2)])
    np.testing.assert_allclose(c["steps"][0]["pr"], want, rtol=0, atol=1e-15)


def test_dca_rejects_even_kernels_and_gmm_masks_positions():
    rng = np.random.default_rng(17)
    p = init_dca_params(rng, 3, 4, static_channels=2, static_kernel_size=4, dynamic_channels=2, dynamic_kernel_size=3)
    with pytest.raises(ValueError, match="F.weight"):
        dca_attention_forward(rng.standard_normal((2, 2, 3)), rng.standard_normal((2, 5, 2)), p)
    pg = init_gmm_params(rng, 3, 4, 2)
    mask = np.array([[True] * 5, [True, True, True, False, False]])
    ctx, c = gmm_attention_forward(rng.standard_normal((2, 3, 3)), rng.standard_normal((2, 5, 2)), pg, memory_mask=mask)
    assert np.all(c["alpha"][1, :, 3:] == 1e-8)
    g = gmm_attention_backward(np.ones_like(ctx), c)
    assert np.all(np.isfinite(g["query"]))


def _torch():
    return pytest.importorskip("torch")


def test_dca_backward_through_time_matches_autograd():
    # Independent autograd of the DCA recurrence written from the formulas (not upstream code).
    torch = _torch()
    rng = np.random.default_rng(18)
    p = init_dca_params(rng, 3, 4, static_channels=2, static_kernel_size=5, dynamic_channels=3, dynamic_kernel_size=3,
                        scale=1.5)
    q, mem = rng.standard_normal((2, 4, 3)), rng.standard_normal((2, 7, 2))
    ctx, c = dca_attention_forward(q, mem, p)
    G = rng.standard_normal(ctx.shape)
    g = dca_attention_backward(G, c)
    t = {k: torch.tensor(v, requires_grad=True) for k, v in p.items()}
    tq = torch.tensor(q, requires_grad=True)
    taps = torch.tensor(dca_prior_filter())
    prev = torch.zeros(2, 7, dtype=torch.float64)
    prev[:, 0] = 1.0
    outs = []
    for i in range(4):
        pad = torch.nn.functional.pad(prev, (10, 0))
        pr = sum(taps[k] * pad[:, 10 - k:10 - k + 7] for k in range(11))
        gk = (torch.tanh(tq[:, i] @ t["W.weight"] + t["W.bias"]) @ t["V.weight"]).reshape(2, 3, 3)
        w3, w5 = torch.nn.functional.pad(prev, (1, 1)), torch.nn.functional.pad(prev, (2, 2))
        f = torch.stack([sum(t["F.weight"][ch, 0, m] * w5[:, m:m + 7] for m in range(5)) for ch in range(2)], -1)
        gg = torch.stack([sum(gk[:, ch, m:m + 1] * w3[:, m:m + 7] for m in range(3)) for ch in range(3)], -1)
        e = torch.tanh(f @ t["U.weight"] + gg @ t["T.weight"] + t["T.bias"]) @ t["v.weight"][:, 0] + torch.log(pr.clamp_min(1e-6))
        prev = torch.softmax(e, -1)
        outs.append(torch.einsum("bn,bnd->bd", prev, torch.tensor(mem)))
    (torch.stack(outs, 1) * torch.tensor(G)).sum().backward()
    np.testing.assert_allclose(g["query"], tq.grad.numpy(), rtol=1e-10, atol=1e-12)
    for k in p:
        np.testing.assert_allclose(g[k], t[k].grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=k)


def test_gmm_backward_through_time_matches_autograd():
    torch = _torch()
    rng = np.random.default_rng(19)
    p = init_gmm_params(rng, 3, 4, 2)
    q, mem = rng.standard_normal((2, 5, 3)), rng.standard_normal((2, 9, 2))
    ctx, c = gmm_attention_forward(q, mem, p, version="2")
    G = rng.standard_normal(ctx.shape)
    g = gmm_attention_backward(G, c)
    t = {k: torch.tensor(v, requires_grad=True) for k, v in p.items()}
    tq = torch.tensor(q, requires_grad=True)
    raw = torch.tanh(tq @ t["mlp.0.weight"] + t["mlp.0.bias"]) @ t["mlp.2.weight"] + t["mlp.2.bias"]
    w = torch.softmax(raw[..., :2], -1)
    mu = torch.cumsum(torch.nn.functional.softplus(raw[..., 2:4]), 1)
    sig = torch.nn.functional.softplus(raw[..., 4:]) + 1e-5
    j = torch.arange(9, dtype=torch.float64)
    al = (w[..., None] / (np.sqrt(2 * np.pi) * sig[..., None]) * torch.exp(-(j - mu[..., None]) ** 2 / (2 * sig[..., None] ** 2))).sum(2)
    ((al @ torch.tensor(mem)) * torch.tensor(G)).sum().backward()
    np.testing.assert_allclose(g["query"], tq.grad.numpy(), rtol=1e-10, atol=1e-12)
    for k in p:
        np.testing.assert_allclose(g[k], t[k].grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=k)


def test_latent_alignment_argument_errors_and_masked_enum_gradcheck():
    rng = np.random.default_rng(20)
    s = lat_mod._sample_mode(rng, "tiny", "exact", "mlp")
    with pytest.raises(ValueError, match="q_scores"):
        latent_alignment_forward(**s.inputs, params=s.params, mode="enum")
    with pytest.raises(ValueError, match="q_scores"):
        latent_alignment_forward(**s.inputs, params=s.params, q_scores=np.zeros((2, 2, 3)), mode="exact")
    e = lat_mod._sample_mode(rng, "tiny", "enum", "general")
    e.config["memory_mask"] = np.array([[True, True, True], [True, True, False]])
    gradcheck(latent_alignment_forward, latent_alignment_backward, e)


def test_hoa_default_inter_channels_and_order_five():
    assert hoa_param_spec(512, 1)["order1_1_1.0.weight"] == (128, 512, 1, 1)
    rng = np.random.default_rng(21)
    from refattn.attention.softmax import high_order_mhn as mhn_mod
    s = mhn_mod._sample_order(rng, "tiny", 5)
    out, _ = hoa_forward(**s.inputs, params=s.params, **s.config)
    np.testing.assert_allclose(out, mhn_mod._reference(**s.inputs, params=s.params, **s.config), rtol=0, atol=1e-13)


@pytest.mark.parametrize("act,mix", [("relu", False), ("free", False), ("sigmoid", False), ("controlled_relu", True)])
def test_monotonic_remaining_step_activations_gradcheck(act, mix):
    rng = np.random.default_rng(22)
    gradcheck(monotonic_location_forward, monotonic_location_backward, mono_mod._sample_cfg(rng, "tiny", act, mix))


def test_monotonic_mask_must_be_a_prefix_and_reversal_brute_force():
    rng = np.random.default_rng(23)
    s = mono_mod._sample_cfg(rng, "tiny", "sigmoid", False)
    bad = np.array([[True, False, True, True], [True, True, True, True]])
    with pytest.raises(ValueError, match="memory_mask"):
        monotonic_location_forward(**s.inputs, params=s.params, **dict(s.config, memory_mask=bad))
    x = rng.standard_normal((2, 5, 3))
    r = reverse_within_length(x, np.array([5, 2]))
    np.testing.assert_array_equal(r[1, :2], x[1, 1::-1])
    assert np.all(r[1, 2:] == 0.0)


def test_neural_attention_mask_and_projection_errors():
    rng = np.random.default_rng(24)
    p = init_neural_attention_params(rng, 4, 2, 2, 2)
    p = dict(p, **{"q_proj.weight": p["q_proj.weight"][:, :1]})
    with pytest.raises(ValueError, match="projection_dim"):
        neural_attention_forward(rng.standard_normal((2, 3, 4)), p, heads=2)
    p = init_neural_attention_params(rng, 4, 2, 2, 2)
    x = rng.standard_normal((2, 3, 4))
    keep = np.array([[True, False, True]] * 3)
    out, c = neural_attention_forward(x, p, heads=2, causal=False, attn_mask=keep)
    assert np.all(c["a"][..., 1] == 0.0)
    np.testing.assert_allclose(out, na_mod._reference(x, p, heads=2, causal=False, attn_mask=keep), rtol=0, atol=1e-13)


def test_hoa_vqa_masked_question_gradcheck():
    rng = np.random.default_rng(25)
    s = vqa_mod._sample(rng, "tiny")
    s.config["ques_mask"] = np.array([[True, True], [True, False]])
    gradcheck(hoa_vqa_forward, hoa_vqa_backward, s)


def test_location_records_dispatch_on_parameter_names():
    rng = np.random.default_rng(26)
    for kind in ("gmm", "dca"):
        s = loc_mod._sample_kind(rng, "tiny", kind)
        _, c = loc_mod.location_relative_attention_forward(**s.inputs, params=s.params, **s.config)
        assert c["kind"] == kind
