"""Mechanism-specific tests of softmax slice S8 (docs/softmax/s8.md). Generic FD/reference/robustness
checks are generated from the registry; these cover the router selection, the training estimator,
torch parity and the layers' errors."""

from __future__ import annotations

import importlib

import numpy as np
import pytest

aha = importlib.import_module("refattn.attention.softmax.all_or_here")


def _aha_case(rng, h=4, hkv=2, d=2, c=6, n=7):
    x = rng.standard_normal((2, n, c))
    p = aha.init_all_or_here_params(rng, c, h, d, num_kv_heads=hkv)
    p["q_proj.weight"][:, h * d:] *= 8.0
    p["q_norm.weight"] = 1 + 0.2 * rng.standard_normal(h * d)
    p["k_norm.weight"] = 1 + 0.2 * rng.standard_normal(hkv * d)
    return x, p, {"num_heads": h, "num_kv_heads": hkv, "window": 3, "rope_base": 100.0}


def test_aha_route_is_the_thresholded_router_column():
    rng = np.random.default_rng(0)
    x, p, cfg = _aha_case(rng)
    for tau in (0.2, 0.5, 0.9):
        _, c = aha.all_or_here_forward(x, p, tau=tau, **cfg)
        g = x @ p["q_proj.weight"][:, 8:]
        expect = np.array([[[float(1 / (1 + np.exp(-g[b, t, h])) > tau) for h in range(4)] for t in range(7)]
                           for b in range(2)])
        assert np.array_equal(c["route"], expect)
        assert 0 < c["route"].mean() < 1


def test_aha_route_selects_the_branch_per_head_and_token():
    # a head routed to "all" gives the causal SDPA row, a head routed "here" the windowed row
    from refattn.attention.softmax.core import sdpa_reference
    from refattn.attention.softmax.masks import band_mask

    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((2, 2, 6, 3)), rng.standard_normal((2, 1, 6, 3)), rng.standard_normal((2, 1, 6, 3))
    g = rng.standard_normal((2, 2, 6)) * 3
    y, _ = aha.aha_mix_forward(q, k, v, g, window=2)
    full = sdpa_reference(q, k, v, is_causal=True)
    local = sdpa_reference(q, k, v, attn_mask=band_mask(6, 6, left=1, right=0))
    on = (g > 0)[..., None]
    np.testing.assert_allclose(y, np.where(on, full, local), atol=1e-13)
    assert not np.allclose(full, local)


def test_aha_fixed_route_gives_the_router_no_gradient_and_ste_does():
    rng = np.random.default_rng(2)
    x, p, cfg = _aha_case(rng)
    dy = rng.standard_normal((2, 7, 6))
    gf = aha.all_or_here_backward(dy, aha.all_or_here_forward(x, p, **cfg)[1])
    gs = aha.all_or_here_backward(dy, aha.all_or_here_forward(x, p, gate_grad="ste", **cfg)[1])
    assert np.all(gf["q_proj.weight"][:, 8:] == 0)
    assert np.abs(gs["q_proj.weight"][:, 8:]).max() > 1e-3
    np.testing.assert_array_equal(gf["q_proj.weight"][:, :8], gs["q_proj.weight"][:, :8])


def test_aha_sparsity_penalty_value_and_gradient_shape():
    rng = np.random.default_rng(3)
    x, p, cfg = _aha_case(rng)
    _, c = aha.all_or_here_forward(x, p, **cfg)
    val, dg = aha.aha_sparsity_penalty(c, coefficient=3e-4)
    g = x @ p["q_proj.weight"][:, 8:]
    assert val == pytest.approx(3e-4 * np.mean(1 / (1 + np.exp(-g))), rel=1e-12)
    assert dg.shape == (2, 7, 4)
    # the penalty alone moves only the router columns of q_proj (and x)
    gr = aha.all_or_here_backward(np.zeros((2, 7, 6)), c, dgate=dg)
    assert np.all(gr["q_proj.weight"][:, :8] == 0) and np.abs(gr["q_proj.weight"][:, 8:]).max() > 0


def test_aha_matches_torch_sdpa_composition_with_ste():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(4)
    x, p, cfg = _aha_case(rng, h=2, hkv=1, d=4, c=5, n=6)
    h, hkv, d, n, w = 2, 1, 4, 6, 3
    y, c = aha.all_or_here_forward(x, p, gate_grad="ste", **cfg)
    dy = rng.standard_normal(y.shape)
    g = aha.all_or_here_backward(dy, c)

    xt = torch.tensor(x, requires_grad=True)
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in p.items()}
    qg = xt @ tp["q_proj.weight"]
    qt, gate = qg[..., : h * d], qg[..., h * d:]

    def rms(t, wgt):
        return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6) * wgt

    def rot(t):  # (B, H, N, d), rotate-half
        ang = torch.arange(n, dtype=torch.float64)[:, None] * 100.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
        a, b = t[..., : d // 2], t[..., d // 2:]
        return torch.cat([a * ang.cos() - b * ang.sin(), a * ang.sin() + b * ang.cos()], -1)

    q = rot(rms(qt, tp["q_norm.weight"]).view(2, n, h, d).transpose(1, 2))
    k = rot(rms(xt @ tp["k_proj.weight"], tp["k_norm.weight"]).view(2, n, hkv, d).transpose(1, 2))
    v = (xt @ tp["v_proj.weight"]).view(2, n, hkv, d).transpose(1, 2)
    k, v = k.repeat_interleave(h // hkv, 1), v.repeat_interleave(h // hkv, 1)
    i, j = torch.arange(n)[:, None], torch.arange(n)[None]
    full = F.scaled_dot_product_attention(q, k, v, attn_mask=j <= i)
    local = F.scaled_dot_product_attention(q, k, v, attn_mask=(j <= i) & (i - j < w))
    soft = torch.sigmoid(gate)
    r = ((soft > 0.5).double() + soft - soft.detach()).transpose(1, 2)[..., None]
    o = (r * full + (1 - r) * local).transpose(1, 2).reshape(2, n, h * d)
    yt = o @ tp["o_proj.weight"]
    yt.backward(torch.tensor(dy))
    np.testing.assert_allclose(y, yt.detach().numpy(), atol=1e-12)
    np.testing.assert_allclose(g["x"], xt.grad.numpy(), atol=1e-12)
    for k_ in p:
        np.testing.assert_allclose(g[k_], tp[k_].grad.numpy(), atol=1e-12, err_msg=k_)


def test_aha_does_not_modify_inputs_or_alias_the_cache():
    rng = np.random.default_rng(5)
    x, p, cfg = _aha_case(rng)
    x0, p0 = x.copy(), {k: v.copy() for k, v in p.items()}
    y, c = aha.all_or_here_forward(x, p, **cfg)
    y[...] = 0.0
    g = aha.all_or_here_backward(np.ones_like(y), c)
    assert np.array_equal(x, x0) and all(np.array_equal(p[k], p0[k]) for k in p)
    np.testing.assert_allclose(aha.all_or_here(x, p, **cfg), aha._reference(x, p, **cfg), atol=1e-12)
    assert set(g) == {"x", *p}


@pytest.mark.parametrize("kw, msg", [
    ({"tau": 1.5}, "tau"), ({"tau": 0.0}, "tau"), ({"router": "gumbel"}, "router"),
    ({"gate_grad": "reinforce"}, "gate_grad"), ({"window": 0}, "window"), ({"num_kv_heads": 3}, "num_kv_heads"),
    ({"rms_norm_eps": -1.0}, "rms_norm_eps"),
])
def test_aha_bad_config_names_the_argument(kw, msg):
    rng = np.random.default_rng(6)
    x, p, cfg = _aha_case(rng)
    cfg.update(kw)
    with pytest.raises((ValueError, TypeError), match=msg):
        aha.all_or_here_forward(x, p, **cfg)


def test_aha_bad_weights_name_the_parameter():
    rng = np.random.default_rng(7)
    x, p, cfg = _aha_case(rng)
    with pytest.raises(ValueError, match="q_proj.weight"):
        aha.all_or_here_forward(x, dict(p, **{"q_proj.weight": p["q_proj.weight"][:, :8]}), **cfg)
    with pytest.raises(ValueError, match="k_norm.weight"):
        aha.all_or_here_forward(x, {k: v for k, v in p.items() if k != "k_norm.weight"}, **cfg)
    with pytest.raises(ValueError, match="o_proj.weight"):
        aha.all_or_here_forward(x, dict(p, **{"o_proj.weight": p["o_proj.weight"].T}), **cfg)
    with pytest.raises(ValueError, match="gate_logits"):
        aha.aha_mix_forward(np.zeros((1, 2, 3, 2)), np.zeros((1, 1, 3, 2)), np.zeros((1, 1, 3, 2)), np.zeros((1, 3, 2)))


tk = importlib.import_module("refattn.attention.softmax.tucker_attention")


def _tucker_case(rng, d=6, h=3, ranks=(2, 4, 4), rt=(2, 3, 5), shared=False):
    x = rng.standard_normal((2, 5, d))
    p = tk.init_tucker_attention_params(rng, d, h, ranks, rt, shared_kv=shared)
    return x, {k: v * (1 + 0.3 * rng.standard_normal(v.shape)) for k, v in p.items()}


def test_tucker_gqa_special_case():
    # two kv groups of two heads: U3 = [W^K_1 | W^K_2] (key rank 2 d_H), C_i puts W^Q_i against its group's block
    rng = np.random.default_rng(10)
    d, h, g, dh = 8, 4, 2, 2
    x = rng.standard_normal((2, 5, d))
    wq, wo = rng.standard_normal((h, d, dh)), rng.standard_normal((h, dh, d))
    wk, wv = rng.standard_normal((g, d, dh)), rng.standard_normal((g, d, dh))
    ref = np.zeros_like(x)
    core, core_t = np.zeros((h, d, g * dh)), np.zeros((h, d, g * dh))
    for i in range(h):
        j = i // (h // g)
        sc = (x @ wq[i]) @ np.swapaxes(x @ wk[j], 1, 2) / np.sqrt(d / h)
        a = np.exp(sc - sc.max(-1, keepdims=True))
        ref += (a / a.sum(-1, keepdims=True)) @ (x @ wv[j]) @ wo[i]
        core[i][:, j * dh:(j + 1) * dh] = wq[i]
        core_t[i][:, j * dh:(j + 1) * dh] = wo[i].T
    p = {"core": core, "U1": np.eye(h), "U2": np.eye(d), "U3": np.concatenate(list(wk), 1), "core_tilde": core_t,
         "U1_tilde": np.eye(h), "U2_tilde": np.eye(d), "U3_tilde": np.concatenate(list(wv), 1)}
    np.testing.assert_allclose(tk.tucker_attention(x, p), ref, atol=1e-12)


def test_tucker_head_rank_one_makes_all_heads_share_one_core():
    rng = np.random.default_rng(11)
    x, p = _tucker_case(rng, ranks=(1, 4, 4))
    b = tk.tucker_head_cores(p["core"], p["U1"])
    for i in range(1, 3):
        np.testing.assert_allclose(b[i] * p["U1"][0, 0], b[0] * p["U1"][i, 0], atol=1e-12)
    w, wt = tk.tucker_weight_tensors(p)
    assert w.shape == wt.shape == (3, 6, 6)
    assert np.linalg.matrix_rank(w.reshape(3, -1)) == 1


def test_tucker_causal_rows_ignore_future_tokens():
    rng = np.random.default_rng(12)
    x, p = _tucker_case(rng)
    y = tk.tucker_attention(x, p, is_causal=True, rope_base=10.0)
    x2 = x.copy()
    x2[:, 3:] = rng.standard_normal(x2[:, 3:].shape)
    np.testing.assert_allclose(tk.tucker_attention(x2, p, is_causal=True, rope_base=10.0)[:, :3], y[:, :3], atol=1e-13)


def test_tucker_interleaved_rope_is_a_permutation_of_rotate_half():
    from refattn.nn.rope import interleave_permutation

    rng = np.random.default_rng(13)
    x, p = _tucker_case(rng)
    perm = interleave_permutation(4)
    pp = dict(p, core=p["core"][:, :, perm], U3=p["U3"][:, perm])
    np.testing.assert_allclose(tk.tucker_attention(x, p, rope_base=10.0, rope_interleaved=True),
                               tk.tucker_attention(x, pp, rope_base=10.0), atol=1e-12)


def test_tucker_bad_params_name_the_key():
    rng = np.random.default_rng(14)
    x, p = _tucker_case(rng)
    with pytest.raises(ValueError, match="U2"):
        tk.tucker_attention(x, dict(p, U2=p["U2"].T))
    with pytest.raises(ValueError, match="U3_tilde"):
        tk.tucker_attention(x, {k: v for k, v in p.items() if k != "U3_tilde"})
    with pytest.raises(ValueError, match="shared_kv"):
        tk.tucker_attention(x, {k: v for k, v in p.items() if k != "U3_tilde"}, shared_kv=True)
    with pytest.raises(ValueError, match="r3"):
        tk.tucker_attention(x, dict(p, core=p["core"][:, :, :3], U3=p["U3"][:, :3]), rope_base=10.0)
    with pytest.raises(TypeError, match="params"):
        tk.tucker_attention(x, [p])


qd = importlib.import_module("refattn.attention.softmax.qada")


def test_qada_window_mask_brute_force():
    for ts, tl in [(0, 1), (2, 3), (4, 2), (10, 10)]:
        keep = qd.qada_window_keep(9, ts, tl)
        for i in range(9):
            for j in range(9):
                assert keep[i, j] == (j <= i and (j < ts or i - j < tl)), (ts, tl, i, j)


def test_qada_labels_brute_force_and_cache():
    rng = np.random.default_rng(20)
    q, k, v = rng.standard_normal((2, 4, 14, 3)), rng.standard_normal((2, 2, 14, 3)), rng.standard_normal((2, 2, 14, 3))
    _, c = qd.qada_attention_forward(q, k, v, t_sink=2, t_local=4, tau=0.3)
    lab = np.zeros((2, 4, 14), dtype=bool)
    for b in range(2):
        for h in range(4):
            for t in range(14):
                window = sorted(set(range(min(2, t + 1))) | set(range(max(0, t - 3), t + 1)))
                n_bulk = t + 1 - len(window)
                rec = k[b, h // 2, max(0, t - 3): t + 1]
                cov = np.cov(rec.T, bias=True)
                qt = q[b, h, t] / np.sqrt(3)
                est = n_bulk * np.exp(qt @ rec.mean(0) + 0.5 * qt @ cov @ qt)
                lab[b, h, t] = n_bulk > 0 and est / (est + np.exp(k[b, h // 2, window] @ qt).sum()) > 0.3
                bulk = [j for j in range(t + 1) if j not in window]
                exact = np.exp(k[b, h // 2, bulk] @ qt).sum()
                assert c["p_oracle"][b, h, t] == pytest.approx(exact / (exact + np.exp(k[b, h // 2, window] @ qt).sum()))
    assert np.array_equal(c["long_context"], lab) and 0 < lab.mean() < 1
    assert c["sparsity"] == pytest.approx(1 - lab.mean())


def test_qada_is_forward_only_and_keeps_float32():
    from refattn import registry

    rec = registry.get("qada_long_context_head_test")
    assert rec.backward is None and not rec.differentiable and rec.implemented and "no backward" in rec.notes
    rng = np.random.default_rng(21)
    q, k, v = (rng.standard_normal((1, 2, 12, 4)).astype(np.float32) for _ in range(3))
    assert qd.qada_attention(q, k, v, t_sink=1, t_local=3).dtype == np.float32


@pytest.mark.parametrize("kw, msg", [({"tau": 1.0}, "tau"), ({"t_local": 0}, "t_local"), ({"t_sink": -1}, "t_sink"),
                                     ({"kv_group_map": "x"}, "kv_group_map"), ({"scale": -1.0}, "scale")])
def test_qada_bad_config(kw, msg):
    q = k = v = np.zeros((1, 1, 5, 2))
    with pytest.raises((ValueError, TypeError), match=msg):
        qd.qada_attention(q, k, v, **kw)
    with pytest.raises(ValueError, match="same N"):
        qd.qada_attention(q, np.zeros((1, 1, 4, 2)), np.zeros((1, 1, 4, 2)))
