"""Routing, gating and dynamic computation (issue 16, slice b3): what the generated registry tests
cannot express.

* the selections — top-k, the dynamic-k threshold, expert capacity in its three priorities, HeadMask's
  important heads — against brute force (enumeration of subsets, a queue simulation);
* the auxiliary losses (every variant, padding masks, per-sequence groups) against their
  upstream formulas and finite differences, through the loss pairs and through the layers;
* the attention-core protocol with different cores (``"sdpa"``, ``"alibi"`` with its own
  parameters, linear attention, a user pair) and the token-mixer protocol with two attentions;
* HeadMask's random masks (exact count, uniformity), importance = the mask gradient;
* the gradient modes of the hard routers (fixed / STE / soft) and argument errors.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from refattn.blocks import (
    capacity_mask,
    dydit_block_backward,
    dydit_block_forward,
    expert_capacity,
    gated_memory_unit_forward,
    gates_backward,
    gates_forward,
    head_importance,
    headmask_attention,
    headmask_attention_backward,
    headmask_attention_forward,
    headmask_important,
    headmask_random,
    load_balancing_loss_backward,
    load_balancing_loss_forward,
    mindskip_attention_backward,
    mindskip_attention_forward,
    mixture_of_head_attention,
    mixture_of_head_attention_backward,
    mixture_of_head_attention_forward,
    moe_topk_gating_backward,
    moe_topk_gating_forward,
    router_z_loss_forward,
    threshold_mask,
    topk_mask,
)
from refattn.blocks import dydit as dydit_mod
from refattn.blocks import gmu as gmu_mod
from refattn.blocks import headmask as headmask_mod
from refattn.blocks import mindskip as mindskip_mod
from refattn.blocks import moe as moe_mod
from refattn.blocks import moh as moh_mod
from refattn.registry import Sample
from refattn.testing import gradcheck


def _softmax(a):
    e = np.exp(a - a.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# --------------------------------------------------------------------------------------------
# Selections against brute force


@pytest.mark.parametrize("k", [1, 2, 3])
def test_topk_mask_is_the_best_subset(k):
    rng = np.random.default_rng(k)
    scores = rng.standard_normal((6, 5))
    mask = topk_mask(scores, k)
    for row, m in zip(scores, mask):
        best = max(itertools.combinations(range(5), k), key=lambda s: sum(row[list(s)]))
        assert set(np.nonzero(m)[0]) == set(best)
    # ties go to the lower index (stable order)
    assert topk_mask(np.array([[1.0, 2.0, 2.0, 0.0]]), 1).tolist() == [[False, True, False, False]]


def test_threshold_mask():
    p = np.array([[0.5, 0.3, 0.2], [0.34, 0.33, 0.33]])
    assert threshold_mask(p, 0.5).tolist() == [[True, True, False], [True, True, True]]


def _queue_capacity(sel, probs, cap, priority):
    # A literal simulation: walk the assignments in priority order, give each expert `cap` seats.
    keep = np.zeros_like(sel)
    for g in np.ndindex(*sel.shape[:-2]):
        s, p = sel[g], probs[g]
        n, e_num = s.shape
        choices = [sorted(np.nonzero(s[t])[0], key=lambda j: -p[t, j]) for t in range(n)]
        if priority == "token":
            queue = [(t, j) for t in range(n) for j in choices[t]]
        elif priority == "slot":
            queue = [(t, ch[r]) for r in range(e_num) for t, ch in enumerate(choices) if r < len(ch)]
        else:
            queue = sorted(((t, j) for t in range(n) for j in choices[t]), key=lambda tj: -p[tj])
        seats = [0] * e_num
        for t, j in queue:
            if seats[j] < cap:
                seats[j] += 1
                keep[g + (t, j)] = True
    return keep


@pytest.mark.parametrize("priority", ["slot", "token", "probs"])
@pytest.mark.parametrize("k,cap", [(1, 1), (2, 2), (3, 2)])
def test_capacity_mask_matches_queue_simulation(priority, k, cap):
    rng = np.random.default_rng(10 * k + cap)
    probs = _softmax(2.0 * rng.standard_normal((3, 7, 4)))
    sel = topk_mask(probs, k)
    keep = capacity_mask(sel, probs, cap, priority)
    np.testing.assert_array_equal(keep, _queue_capacity(sel, probs, cap, priority))
    assert keep.sum(axis=-2).max() <= cap and not (keep & ~sel).any()


def test_expert_capacity_formula():
    # DeepSpeed: ceil(T / E * capacity_factor * k), at least min_capacity
    assert expert_capacity(12, 4, 2, 0.6) == 4
    assert expert_capacity(12, 4, 1, 1.0) == 3
    assert expert_capacity(10, 4, 1, 1.0, min_capacity=4) == 4
    assert expert_capacity(12, 4, 3, 0.5) == 5


def test_moe_routing_matches_brute_force():
    # The layer's kept assignments = enumerated top-k + queue-simulated capacity.
    rng = np.random.default_rng(0)
    for priority in ("slot", "token", "probs"):
        s = moe_mod._sample(rng, "small", shared=False, num_experts_per_tok=2, capacity_factor=0.7,
                            capacity_priority=priority, dynamic_threshold=None)
        _, c = moe_topk_gating_forward(**s.inputs, params=s.params, **s.config)
        probs = _softmax(s.inputs["x"] @ s.params["gate.weight"])
        sel = np.zeros_like(probs, dtype=bool)
        for idx in np.ndindex(*probs.shape[:-1]):
            best = max(itertools.combinations(range(probs.shape[-1]), 2), key=lambda q: probs[idx][list(q)].sum())
            sel[idx + (list(best),)] = True
        cap = expert_capacity(probs.shape[-2], probs.shape[-1], 2, 0.7)
        np.testing.assert_array_equal(c["expert_mask"], _queue_capacity(sel, probs, cap, priority))


# --------------------------------------------------------------------------------------------
# Gates and losses


@pytest.mark.parametrize("order,renorm,before", [("softmax_topk", True, False), ("softmax_topk", True, True),
                                                 ("softmax_topk", False, False), ("topk_softmax", True, True)])
def test_gates_vjp_fd(order, renorm, before):
    rng = np.random.default_rng(1)
    lg = 2.0 * rng.standard_normal((2, 5, 4))
    p = _softmax(lg)
    sel = topk_mask(p, 3)
    keep = capacity_mask(sel, p, 3, "probs")
    assert (keep != sel).any()
    rset = sel if before else keep

    def fwd(logits):
        g, _, c = gates_forward(logits, keep, rset, order=order, renormalize=renorm)
        return g, c

    gradcheck(fwd, lambda d, c: {"logits": gates_backward(d, c)}, Sample({"logits": lg}))


def _hf_mixtral_loss(lg, k):
    p = _softmax(lg.reshape(-1, lg.shape[-1]))
    m = topk_mask(p, k)
    return lg.shape[-1] * np.sum(m.mean(0) * p.mean(0))


def _hf_switch_loss(lg):
    p = _softmax(lg)
    m = topk_mask(p, 1).astype(float)
    return np.mean(m.mean(-2) * p.mean(-2)) * lg.shape[-1] ** 2


def test_loss_values_match_upstream_formulas():
    rng = np.random.default_rng(2)
    lg = rng.standard_normal((3, 6, 5))
    assert np.isclose(float(load_balancing_loss_forward(lg, top_k=2)[0]), _hf_mixtral_loss(lg, 2), rtol=1e-14)
    assert np.isclose(float(load_balancing_loss_forward(lg, variant="switch", balance_over="sequence")[0]),
                      _hf_switch_loss(lg), rtol=1e-14)
    # DeepSpeed topkgating: mean(me * ce) * E^2 / k over all tokens
    p = _softmax(lg.reshape(-1, 5))
    ds = np.mean(p.mean(0) * topk_mask(p, 3).mean(0)) * 25 / 3
    assert np.isclose(float(load_balancing_loss_forward(lg, top_k=3, variant="topk_normalized")[0]), ds, rtol=1e-14)
    # HF Switch z-loss: sum(logsumexp^2) / (groups * tokens)
    lse = np.log(np.exp(lg).sum(-1))
    assert np.isclose(float(router_z_loss_forward(lg)[0]), np.sum(lse ** 2) / 18, rtol=1e-14)


def test_loss_token_mask_drops_padding():
    # Padding tokens change nothing: the loss of the unpadded tokens alone.
    rng = np.random.default_rng(3)
    lg = rng.standard_normal((2, 5, 4))
    mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    full = float(load_balancing_loss_forward(lg, top_k=2, token_mask=mask)[0])
    kept = np.concatenate([lg[0, :3], lg[1]])[None]
    assert np.isclose(full, float(load_balancing_loss_forward(kept, top_k=2)[0]), rtol=1e-14)
    g = load_balancing_loss_backward(1.0, load_balancing_loss_forward(lg, top_k=2, token_mask=mask)[1])
    assert np.all(g["router_logits"][0, 3:] == 0)


@pytest.mark.parametrize("variant", ["switch", "topk", "topk_normalized"])
@pytest.mark.parametrize("over", ["batch", "sequence"])
def test_loss_pair_fd(variant, over):
    rng = np.random.default_rng(4)
    while True:
        lg = 2.0 * rng.standard_normal((2, 4, 5))
        srt = -np.sort(-lg, axis=-1)
        if np.min(srt[..., :3] - srt[..., 1:4]) > 0.05:
            break
    mask = np.array([[1, 1, 0, 1], [1, 1, 1, 1]], bool)

    def fwd(router_logits):
        return load_balancing_loss_forward(router_logits, top_k=2, variant=variant, balance_over=over,
                                           token_mask=mask)[0][None], \
            load_balancing_loss_forward(router_logits, top_k=2, variant=variant, balance_over=over, token_mask=mask)[1]

    gradcheck(fwd, lambda g, c: load_balancing_loss_backward(g[0], c), Sample({"router_logits": lg}))


def test_loss_argument_errors():
    lg = np.zeros((2, 3, 4))
    with pytest.raises(ValueError, match="top_k"):
        load_balancing_loss_forward(lg, top_k=5)
    with pytest.raises(ValueError, match="token_mask"):
        load_balancing_loss_forward(lg, token_mask=np.ones((2, 4), bool))
    with pytest.raises(ValueError, match="variant"):
        load_balancing_loss_forward(lg, variant="gshard2")
    with pytest.raises(ValueError, match="dloss"):
        load_balancing_loss_backward(np.ones(2), load_balancing_loss_forward(lg)[1])


# --------------------------------------------------------------------------------------------
# The MoE layer


@pytest.mark.parametrize("variant", ["switch", "topk", "topk_normalized"])
def test_moe_aux_and_z_loss_gradients_every_variant(variant):
    rng = np.random.default_rng(5)
    s = moe_mod._sample(rng, "tiny", shared=False, aux_loss=variant, capacity_factor=0.7)
    rest = {k: v for k, v in s.params.items() if k != "gate.weight"}

    def fwd(x, params, **cfg):
        y, c = moe_topk_gating_forward(x, {**params, **rest}, **cfg)
        c["_y"] = y
        return np.array([c["aux_loss"], c["z_loss"]]), c

    def bwd(g, c):
        gr = moe_topk_gating_backward(np.zeros_like(c["_y"]), c, daux_loss=float(g[0]), dz_loss=float(g[1]))
        return {k: gr[k] for k in ("x", "gate.weight")}

    gradcheck(fwd, bwd, Sample(s.inputs, {"gate.weight": s.params["gate.weight"]}, s.config))


def test_moe_drouter_logits_equals_daux():
    # The HF-style path (loss on collected router logits, its gradient handed back) = daux_loss.
    rng = np.random.default_rng(6)
    s = moe_mod._sample(rng, "small", shared=False)
    y, c = moe_topk_gating_forward(**s.inputs, params=s.params, **s.config)
    g = rng.standard_normal(y.shape)
    a = moe_topk_gating_backward(g, c, daux_loss=0.3)
    _, lc = load_balancing_loss_forward(c["router_logits"], top_k=s.config["num_experts_per_tok"],
                                        variant=s.config["aux_loss"], balance_over=s.config["balance_over"])
    b = moe_topk_gating_backward(g, c, drouter_logits=0.3 * load_balancing_loss_backward(1.0, lc)["router_logits"])
    for k in a:
        np.testing.assert_allclose(a[k], b[k], rtol=1e-13, atol=1e-14)


def _relu_forward(x, params):
    a = x @ params["wi.weight"]
    return np.maximum(a, 0) @ params["wo.weight"], (x, a, params)


def _relu_backward(dy, cache):
    x, a, p = cache
    da = dy @ p["wo.weight"].T * (a > 0)
    return {"x": da @ p["wi.weight"].T, "wi.weight": x.T @ da, "wo.weight": np.maximum(a, 0).T @ dy}


def test_moe_switch_layer_with_user_expert_pair():
    # HF Switch layout: top-1, no renormalisation, fixed expert capacity, token priority, ReLU experts
    # given as a (forward, backward) pair under "experts.expert_{i}".
    rng = np.random.default_rng(7)
    c_, e_num, f = 3, 3, 4
    while True:
        x = rng.standard_normal((2, 5, c_))
        p = {"router.classifier.weight": 1.5 * rng.standard_normal((c_, e_num))}
        for i in range(e_num):
            p[f"experts.expert_{i}.wi.weight"] = rng.standard_normal((c_, f))
            p[f"experts.expert_{i}.wo.weight"] = rng.standard_normal((f, c_))
        srt = -np.sort(-_softmax(x @ p["router.classifier.weight"]), -1)
        pre = np.concatenate([x @ p[f"experts.expert_{i}.wi.weight"] for i in range(e_num)], -1)
        counts = topk_mask(_softmax(x @ p["router.classifier.weight"]), 1).sum(-2)
        if np.min(srt[..., 0] - srt[..., 1]) > 0.02 and np.min(np.abs(pre)) > 0.02 and counts.max() > 2:
            break
    cfg = {"num_experts_per_tok": 1, "renormalize": False, "expert": (_relu_forward, _relu_backward),
           "expert_capacity": 2, "capacity_priority": "token", "names": ("router.classifier", "experts.expert_{}"),
           "aux_loss": "switch", "balance_over": "sequence"}
    y, c = moe_topk_gating_forward(x, p, **cfg)
    dropped = c["expert_mask"].sum(-1) == 0
    assert dropped.any(), "the sample should drop a token"
    np.testing.assert_array_equal(y[dropped], 0.0)
    gradcheck(moe_topk_gating_forward, moe_topk_gating_backward, Sample({"x": x}, p, cfg))


def test_moe_shared_expert_and_errors():
    rng = np.random.default_rng(8)
    s = moe_mod._sample(rng, "tiny", shared=True)
    gradcheck(moe_topk_gating_forward, moe_topk_gating_backward, s)
    x, p, cfg = s.inputs["x"], s.params, s.config
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        moe_topk_gating_forward(x, p, **dict(cfg, num_experts_per_tok=4))
    with pytest.raises(ValueError, match="same keys for every expert"):
        moe_topk_gating_forward(x, {k: v for k, v in p.items() if k != "experts.1.w3.weight"}, **cfg)
    with pytest.raises(ValueError, match="not both"):
        moe_topk_gating_forward(x, p, **dict(cfg, capacity_factor=1.0, expert_capacity=2))
    with pytest.raises(TypeError, match="expert"):
        moe_topk_gating_forward(x, p, **dict(cfg, expert=3))
    with pytest.raises(ValueError, match="unknown keys"):
        moe_topk_gating_forward(x, p, **{k: v for k, v in cfg.items() if not k.startswith("shared")})
    _, c = moe_topk_gating_forward(x, p, **cfg)
    with pytest.raises(ValueError, match="drouter_logits"):
        moe_topk_gating_backward(np.ones_like(x), c, drouter_logits=np.ones((2, 1)))
    with pytest.raises(TypeError, match="daux_loss"):
        moe_topk_gating_backward(np.ones_like(x), c, daux_loss="0.1")


def test_moe_float32():
    rng = np.random.default_rng(9)
    s = moe_mod._sample(rng, "small", shared=False)
    y64, _ = moe_topk_gating_forward(**s.inputs, params=s.params, **s.config)
    p32 = {k: v.astype(np.float32) for k, v in s.params.items()}
    y32, c32 = moe_topk_gating_forward(s.inputs["x"].astype(np.float32), p32, **s.config)
    assert y32.dtype == np.float32 and np.abs(y32 - y64).max() < 1e-4
    g = moe_topk_gating_backward(np.ones_like(y32), c32, daux_loss=0.01)
    assert all(v.dtype == np.float32 for v in g.values())


# --------------------------------------------------------------------------------------------
# MoH and HeadMask over different attention cores


def _alibi_params(s, h, prefix="core"):
    return dict(s.params, **{f"{prefix}.alibi_slopes": 2.0 ** -np.arange(1, h + 1)})


@pytest.mark.parametrize("core", ["alibi", "linear_attention_katharopoulos", "pair"])
def test_moh_with_other_cores(core):
    from refattn.attention.softmax import sdpa_backward, sdpa_forward

    rng = np.random.default_rng(11)
    s = moh_mod._sample(rng, "tiny", layout=(1, 2))
    cfg = dict(s.config)
    p = s.params
    if core == "alibi":
        p, cfg["core"], cfg["core_config"] = _alibi_params(s, 4), "alibi", {"is_causal": True}
    elif core == "linear_attention_katharopoulos":
        cfg["core"], cfg["core_config"] = core, {"causal": False}
    else:
        cfg["core"], cfg["core_config"] = (sdpa_forward, sdpa_backward), {"scale": 0.7}
    gradcheck(mixture_of_head_attention_forward, mixture_of_head_attention_backward, Sample(s.inputs, p, cfg))


def test_moh_paper_form_and_aux_variants():
    rng = np.random.default_rng(12)
    s = moh_mod._sample(rng, "small", layout=(2, 1), renormalize=False, scale_by_count=False)
    y = mixture_of_head_attention(**s.inputs, params=s.params, **s.config)
    np.testing.assert_allclose(y, moh_mod._reference(**s.inputs, params=s.params, **s.config), rtol=1e-12, atol=1e-13)
    for variant in ("switch", "topk", "topk_normalized"):
        sv = moh_mod._sample(rng, "tiny", layout=(0, 2), aux_loss=variant)
        def fwd(x, params, rest, **cfg):
            yy, c = mixture_of_head_attention_forward(x, {**params, **rest}, **cfg)
            c["_y"] = yy
            return np.array([c["aux_loss"]]), c

        def bwd(g, c):
            gr = mixture_of_head_attention_backward(np.zeros_like(c["_y"]), c, daux_loss=float(g[0]))
            return {k: gr[k] for k in ("x", "wg.weight")}

        rest = {k: v for k, v in sv.params.items() if k != "wg.weight"}
        gradcheck(fwd, bwd, Sample(sv.inputs, {"wg.weight": sv.params["wg.weight"]}, dict(sv.config, rest=rest)))


def test_moh_errors():
    rng = np.random.default_rng(13)
    s = moh_mod._sample(rng, "tiny", layout=(1, 2))
    x, p = s.inputs["x"], s.params
    with pytest.raises(ValueError, match="routed_heads"):
        mixture_of_head_attention(x, p, num_heads=4, shared_heads=1, routed_heads=4)
    with pytest.raises(ValueError, match="shared_heads must equal num_heads"):
        mixture_of_head_attention(x, p, num_heads=4, shared_heads=1, routed_heads=0)
    with pytest.raises(ValueError, match="core"):
        mixture_of_head_attention(x, p, num_heads=4, shared_heads=1, routed_heads=2, core="multi_head_attention")
    with pytest.raises(ValueError, match="wg_0"):
        mixture_of_head_attention(x, {k: v for k, v in p.items() if k != "wg_0.weight"}, num_heads=4, shared_heads=1,
                                  routed_heads=2)


def test_headmask_shared_mask_rescale_and_cores():
    rng = np.random.default_rng(14)
    s = headmask_mod._sample(rng, "tiny")
    for rescale in (False, True):
        shared = Sample({"x": s.inputs["x"], "head_mask": np.array([1.0, 0.0, 1.0])}, s.params,
                        dict(s.config, rescale=rescale))
        gradcheck(headmask_attention_forward, headmask_attention_backward, shared)
    alibi = Sample(s.inputs, _alibi_params(s, 3), dict(s.config, core="alibi", core_config={"is_causal": False}))
    gradcheck(headmask_attention_forward, headmask_attention_backward, alibi)
    with pytest.raises(ValueError, match="head_mask"):
        headmask_attention(s.inputs["x"], np.ones(4), s.params, num_heads=3)


def test_headmask_random_masks_exact_count_and_uniform():
    rng = np.random.default_rng(15)
    m = headmask_random(rng, 5, 2, (6000,))
    assert set(np.unique(m)) == {0.0, 1.0} and np.all((m == 0).sum(-1) == 2)
    # uniform over the C(5,2) = 10 subsets: chi-square with 9 d.o.f., 99.9% quantile 27.88
    keys, counts = np.unique(m, axis=0, return_counts=True)
    assert len(keys) == 10
    chi2 = float(np.sum((counts - 600.0) ** 2 / 600.0))
    assert chi2 < 27.88, chi2
    with pytest.raises(ValueError, match="num_masked"):
        headmask_random(rng, 3, 4)


def test_headmask_important_is_best_subset():
    rng = np.random.default_rng(16)
    imp = rng.random((2, 4))
    for n in range(0, 5):
        m = headmask_important(imp, n)
        assert (m == 0).sum() == n
        best = max(itertools.combinations(range(8), n), key=lambda s: imp.reshape(-1)[list(s)].sum())
        assert set(np.nonzero(m.reshape(-1) == 0)[0]) == set(best)


def test_head_importance_is_the_mask_gradient():
    # Michel et al.: I_h = E_x |dL(x)/dxi_h|; the per-sequence mask gradient is that derivative
    # (checked by finite differences of each sequence's loss in its gate), then averaged.
    rng = np.random.default_rng(17)
    s = headmask_mod._sample(rng, "small")
    x, p = s.inputs["x"], s.params
    xi = np.ones((2, 3))
    y, c = headmask_attention_forward(x, xi, p, num_heads=3)
    target = rng.standard_normal(y.shape)

    def loss(b, mm):
        return 0.5 * np.sum((headmask_attention(x[b:b + 1], mm, p, num_heads=3) - target[b:b + 1]) ** 2)

    d = headmask_attention_backward(y - target, c)["head_mask"]
    eps = 1e-6
    for b in range(2):
        for h in range(3):
            e = np.zeros(3)
            e[h] = eps
            fd = (loss(b, (xi[b] + e)[None]) - loss(b, (xi[b] - e)[None])) / (2 * eps)
            assert abs(fd - d[b, h]) < 1e-7 * max(1.0, abs(fd))
    imp = head_importance(d)
    np.testing.assert_allclose(imp, np.abs(d).mean(0) / np.linalg.norm(np.abs(d).mean(0)), rtol=1e-14)


# --------------------------------------------------------------------------------------------
# GMU, MindSkip, DyDiT


def test_gmu_grouped_norm_and_errors():
    rng = np.random.default_rng(18)
    x, m = rng.standard_normal((2, 3, 3)), rng.standard_normal((2, 3, 6))
    p = gmu_mod._params(rng, 3, 6, True, True)
    gradcheck(gated_memory_unit_forward, gmu_mod.gated_memory_unit_backward,
              Sample({"x": x, "memory": m}, p, {"use_norm": True, "ngroups": 3}))
    np.testing.assert_allclose(gated_memory_unit_forward(x, m, p, use_norm=True, ngroups=3)[0],
                               gmu_mod._reference(x, m, p, use_norm=True, ngroups=3), rtol=1e-13)
    with pytest.raises(ValueError, match="ngroups"):
        gated_memory_unit_forward(x, m, p, use_norm=True, ngroups=4)
    with pytest.raises(ValueError, match="memory"):
        gated_memory_unit_forward(x, m[..., :5], p)


@pytest.mark.parametrize("attention", ["multi_head_attention", "diff_attention_v1"])
@pytest.mark.parametrize("level", ["sequence", "token"])
def test_mindskip_with_two_attentions(attention, level):
    rng = np.random.default_rng(19)
    s = mindskip_mod._sample(rng, "tiny", attention=attention, route_level=level)
    gradcheck(mindskip_attention_forward, mindskip_attention_backward, s)
    y, c = mindskip_attention_forward(**s.inputs, params=s.params, **s.config)
    skipped = np.broadcast_to(c["mask"] == 0, y.shape)
    np.testing.assert_array_equal(y[skipped], s.inputs["x"][skipped])
    g = mindskip_attention_backward(np.ones_like(y), c)
    assert np.all(g["router.weight"] == 0)


def test_mindskip_ste_vs_fixed_and_errors():
    rng = np.random.default_rng(20)
    s = mindskip_mod._sample(rng, "small", attention="multi_head_attention")
    y, c = mindskip_attention_forward(**s.inputs, params=s.params, **dict(s.config, estimator="ste"))
    g = mindskip_attention_backward(np.ones_like(y), c)
    assert np.abs(g["router.weight"]).max() > 0
    with pytest.raises(ValueError, match="threshold"):
        mindskip_attention_forward(**s.inputs, params=s.params, **dict(s.config, threshold=1.0))
    with pytest.raises(ValueError, match="estimator"):
        mindskip_attention_forward(**s.inputs, params=s.params, **dict(s.config, estimator="gumbel"))


@pytest.mark.parametrize("hard,training", [(False, True), (True, True)])
def test_dydit_gradient_modes(hard, training):
    rng = np.random.default_rng(21)
    s = dydit_mod._sample(rng, "tiny", hard=hard, training=training, estimator="fixed")
    gradcheck(dydit_block_forward, dydit_block_backward, s)
    y, c = dydit_block_forward(**s.inputs, params=s.params, **dict(s.config, estimator="ste"))
    g = dydit_block_backward(np.ones_like(y), c)
    assert np.abs(g["attn_rate.router.weight"]).max() > 0 and np.abs(g["mlp_rate.router.weight"]).max() > 0


def test_dydit_masks_act_and_errors():
    # Skipped tokens: the MLP leaves them unchanged (y = x'); a skipped head contributes nothing.
    rng = np.random.default_rng(22)
    while True:
        s = dydit_mod._sample(rng, "small", hard=True, training=False)
        y, c = dydit_block_forward(**s.inputs, params=s.params, **s.config)
        tok = c["masks"]["token"][..., 0] == 0
        if tok.any() and (~tok).any() and (c["masks"]["attn"] == 0).any():
            break
    np.testing.assert_allclose(y[tok], c["x1"][tok], rtol=0, atol=0)
    b, h = np.argwhere(c["masks"]["attn"] == 0)[0]
    p = dict(s.params)
    p["attn.proj.weight"] = p["attn.proj.weight"].copy()
    d = p["attn.proj.weight"].shape[0] // 2
    p["attn.proj.weight"][h * d:(h + 1) * d] += 1.0  # change only the skipped head's output rows
    y2 = dydit_block_forward(**s.inputs, params=p, **s.config)[0]
    # sample b's attention output is unchanged, so its block output is too (router inputs are t and x')
    np.testing.assert_allclose(y2[b], y[b], rtol=1e-13, atol=1e-13)
    with pytest.raises(ValueError, match="gumbel_noise"):
        dydit_block_forward(**s.inputs, params=s.params, **dict(s.config, training=True, gumbel_noise=None))
    with pytest.raises(ValueError, match="num_heads"):
        dydit_block_forward(**s.inputs, params=s.params, **dict(s.config, num_heads=3))
    with pytest.raises(ValueError, match="c must have shape"):
        dydit_block_forward(s.inputs["x"], s.inputs["c"][:1], s.inputs["t"], s.params, num_heads=2)
