"""Sparse members of the linear family (issue 15, slice l2): Reformer LSH, Informer ProbSparse,
top-k (IceFormer), SPARSEK, DRSformer TKSA, Routing Transformer and DMA.

What the generated registry tests cannot express: selections against brute-force references over
many draws and options, the fast (gathered / chunked) forms against their explicit forms in the
gradients too, the SPARSEK relaxation's limits, parity with PyTorch's own layers and attention, and
argument errors. Upstream parity runs (official code, or its math transcribed to torch) are in the
docs; they are not committed here.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from refattn import registry
from refattn.attention.linear import (
    drsformer_tksa_backward,
    drsformer_tksa_forward,
    dynamic_mask_attention_backward,
    dynamic_mask_attention_forward,
    informer_attention_forward,
    informer_distil_backward,
    informer_distil_forward,
    lsh_attention_core_backward,
    lsh_attention_core_forward,
    lsh_hash,
    probsparse_attention_backward,
    probsparse_attention_forward,
    probsparse_measure,
    reformer_lsh_attention_backward,
    reformer_lsh_attention_forward,
    routing_attention_backward,
    routing_attention_forward,
    routing_kmeans_ema_update,
    sparsek_attention_forward,
    sparsek_mask,
    sparsek_mask_vjp,
    topk_attention_backward,
    topk_attention_forward,
    topk_selection,
)
from refattn.attention.linear import dynamic_mask as dma_mod
from refattn.attention.linear import informer_probsparse as inf_mod
from refattn.attention.linear import reformer_lsh as lsh_mod
from refattn.attention.linear import routing_transformer as rt_mod
from refattn.attention.linear import sparsek as sk_mod
from refattn.attention.softmax.core import attention_core_backward, attention_core_forward
from refattn.testing import gradcheck

# Modules named like their main function: the package attribute is the function, so take the module.
drs_mod = importlib.import_module("refattn.attention.linear.drsformer_tksa")

SLUGS = ["reformer_lsh_attention", "informer_probsparse_attention", "topk_attention", "sparsek_attention",
         "drsformer_topk_channel_attention", "routing_transformer_kmeans", "dynamic_mask_attention"]


def _rel(a, b):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-300))


@pytest.mark.parametrize("slug", SLUGS)
def test_records_are_implemented_with_docs_anchor(slug):
    rec = registry.get(slug)
    assert rec.implemented and rec.reference is not None
    assert rec.docs.startswith("linear/sparse-attention.md#")


# ------------------------------------------------------------------------------------------------
# Top-k attention


@pytest.mark.parametrize("seed", range(3))
def test_topk_selection_is_the_brute_force_sort(seed):
    rng = np.random.default_rng(seed)
    for causal in (False, True):
        s = rng.standard_normal((2, 3, 7, 9))
        idx, real = topk_selection(s, 4, is_causal=causal)
        for b in range(2):
            for h in range(3):
                for i in range(7):
                    vis = [j for j in range(9) if not causal or j <= i]
                    want = set(sorted(vis, key=lambda j: -s[b, h, i, j])[:4])
                    got = {int(j) for j, r in zip(idx[b, h, i], real[b, h, i]) if r}
                    assert got == want


def test_topk_attention_matches_torch_sdpa_with_the_mask():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((2, 4, 6, 5)), rng.standard_normal((2, 2, 8, 5)), rng.standard_normal((2, 2, 8, 3))
    out, cache = topk_attention_forward(q, k, v, top_k=3)
    keep = np.zeros((2, 4, 6, 8), bool)
    np.put_along_axis(keep, cache["idx"], True, axis=-1)
    tq, tk, tv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(tq, tk.repeat_interleave(2, 1), tv.repeat_interleave(2, 1),
                                                           attn_mask=torch.tensor(keep))
    g = rng.standard_normal(out.shape)
    ref.backward(torch.tensor(g))
    grads = topk_attention_backward(g, cache)
    assert _rel(out, ref.detach().numpy()) < 1e-12
    for name, t in zip("qkv", (tq, tk, tv)):
        assert _rel(grads[name], t.grad.numpy()) < 1e-12, name


# ------------------------------------------------------------------------------------------------
# DMA


def test_dma_mask_brute_force_and_masked_sdpa_gradients():
    rng = np.random.default_rng(1)
    s = dma_mod._draw(rng, "small", hkv=1)
    q, k, v = (s.inputs[n] for n in "qkv")
    out, cache = dynamic_mask_attention_forward(q, k, v, s.params, **s.config)
    delta = dma_mod.dynamic_mask_bias(v, s.params)[0]
    keep = dma_mod._brute_keep(delta, q.shape[-2], s.config["window_size"], s.config["is_causal"])
    assert (cache["keep"] == keep).all()
    # the q/k/v gradients equal those of the attention core with the same bias and mask
    ref, rc = attention_core_forward(q, k, v, np.repeat(delta[..., None, :], 2, axis=-3),
                                     attn_mask=np.repeat(keep, 2, axis=-3), is_causal=s.config["is_causal"])
    g = rng.standard_normal(out.shape)
    a, b = dynamic_mask_attention_backward(g, cache), attention_core_backward(g, rc)
    assert _rel(out, ref) < 1e-12
    assert _rel(a["q"], b["q"]) < 1e-12 and _rel(a["k"], b["k"]) < 1e-12


def test_dma_rejects_bad_arguments():
    rng = np.random.default_rng(0)
    s = dma_mod._draw(rng, "tiny")
    with pytest.raises(ValueError, match="window_size"):
        dynamic_mask_attention_forward(**s.inputs, params=s.params, window_size=0)
    with pytest.raises(ValueError, match="bias_form"):
        dynamic_mask_attention_forward(**s.inputs, params=s.params, window_size=2, bias_form="softplus")
    bad = dict(s.params, **{"dt_proj.weight": s.params["dt_proj.weight"].T})
    with pytest.raises(ValueError, match="dt_proj.weight"):
        dynamic_mask_attention_forward(**s.inputs, params=bad, window_size=2)


# ------------------------------------------------------------------------------------------------
# DRSformer TKSA


def test_drsformer_gradcheck_two_heads_with_biases():
    rng = np.random.default_rng(2)
    s = drs_mod._draw(rng, "tiny", bias=True, c_all=6, num_heads=2)  # c = 3: top-k sizes 1, 2, 2, 2
    assert gradcheck(drsformer_tksa_forward, drsformer_tksa_backward, s).max_rel < 1e-6


def test_drsformer_matches_a_torch_composition():
    """The math in torch autograd (F.conv2d, F.normalize, topk masks, softmax), not upstream's file."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(3)
    s = drs_mod._draw(rng, "small", bias=True)
    x, p, heads = s.inputs["x"], s.params, s.config["num_heads"]
    out, cache = drsformer_tksa_forward(x, p, num_heads=heads)
    t = {n: torch.tensor(a, requires_grad=True) for n, a in p.items()}
    tx = torch.tensor(x, requires_grad=True)
    b, c, hh, ww = x.shape
    y = F.conv2d(F.conv2d(tx, t["qkv.weight"], t["qkv.bias"]), t["qkv_dwconv.weight"], t["qkv_dwconv.bias"],
                 padding=1, groups=3 * c)
    q, k, v = (z.reshape(b, heads, c // heads, hh * ww) for z in y.chunk(3, dim=1))
    sc = (F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-1, -2)) * t["temperature"]
    o = 0
    for i, kk in enumerate(drs_mod.drsformer_topk_sizes(c // heads)):
        idx = torch.topk(sc, kk, dim=-1).indices
        keep = torch.zeros_like(sc, dtype=torch.bool).scatter_(-1, idx, True)
        o = o + t[f"attn{i + 1}"] * (torch.softmax(sc.masked_fill(~keep, float("-inf")), -1) @ v)
    ref = F.conv2d(o.reshape(b, c, hh, ww), t["project_out.weight"], t["project_out.bias"])
    g = rng.standard_normal(out.shape)
    ref.backward(torch.tensor(g))
    grads = drsformer_tksa_backward(g, cache)
    assert _rel(out, ref.detach().numpy()) < 1e-12
    assert _rel(grads["x"], tx.grad.numpy()) < 1e-12
    for n in p:
        assert _rel(grads[n], t[n].grad.numpy()) < 1e-10, n


def test_drsformer_rejects_bad_arguments():
    rng = np.random.default_rng(0)
    s = drs_mod._draw(rng, "tiny")
    with pytest.raises(ValueError, match="num_heads"):
        drsformer_tksa_forward(s.inputs["x"], s.params, num_heads=2)  # C = 3
    with pytest.raises(ValueError, match="ratios"):
        drsformer_tksa_forward(s.inputs["x"], s.params, num_heads=1, ratios=((1, 4), (1, 2), (2, 3), (3, 4)))
    with pytest.raises(ValueError, match="attn4"):
        drsformer_tksa_forward(s.inputs["x"], {k: v for k, v in s.params.items() if k != "attn4"}, num_heads=1)


# ------------------------------------------------------------------------------------------------
# Informer


def test_informer_active_set_is_the_brute_force_measure():
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((2, 3, 20, 4)) for _ in range(3))
    idx = inf_mod.probsparse_index_sample(20, 20, factor=2, seed=7)
    _, cache = probsparse_attention_forward(q, k, v, factor=2, index_sample=idx)
    m = probsparse_measure(q, k, idx)
    u = inf_mod.probsparse_sizes(20, 20, 2)[1]
    for b in range(2):
        for h in range(3):
            meas = [max(q[b, h, i] @ k[b, h, j] for j in idx[i]) - sum(q[b, h, i] @ k[b, h, j] for j in idx[i]) / 20
                    for i in range(20)]
            assert np.allclose(meas, m[b, h], atol=1e-13)
            assert set(cache["top"][b, h]) == set(sorted(range(20), key=lambda i: -meas[i])[:u])


def test_informer_lazy_rows_get_no_query_gradient():
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((2, 2, 12, 3)) for _ in range(3))
    out, cache = probsparse_attention_forward(q, k, v, factor=1, mask_flag=False)
    dq = probsparse_attention_backward(rng.standard_normal(out.shape), cache)["q"]
    lazy = np.ones(q.shape[:-1], bool)
    np.put_along_axis(lazy, cache["top"], False, axis=-1)
    assert (dq[lazy] == 0).all() and np.abs(dq[~lazy]).min() > 0


def test_informer_distil_matches_torch_layers():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(6)
    c = 5
    for train in (True, False):
        conv = torch.nn.Conv1d(c, c, 3, padding=1, padding_mode="circular").double()
        bn = torch.nn.BatchNorm1d(c).double()
        with torch.no_grad():
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.normal_()
            bn.running_mean.normal_()
            bn.running_var.uniform_(0.5, 2.0)
        bn.train(train)
        x = rng.standard_normal((3, 11, c))
        params = {"downConv.weight": conv.weight.detach().numpy(), "downConv.bias": conv.bias.detach().numpy(),
                  "norm.weight": bn.weight.detach().numpy(), "norm.bias": bn.bias.detach().numpy()}
        cfg = {} if train else {"batch_stats": False, "running_mean": bn.running_mean.numpy().copy(),
                                "running_var": bn.running_var.numpy().copy()}
        out, cache = informer_distil_forward(x, params, **cfg)
        tx = torch.tensor(x, requires_grad=True)
        ref = torch.nn.functional.max_pool1d(torch.nn.functional.elu(bn(conv(tx.transpose(1, 2)))), 3, 2, 1).transpose(1, 2)
        g = rng.standard_normal(out.shape)
        ref.backward(torch.tensor(g))
        grads = informer_distil_backward(g, cache)
        assert _rel(out, ref.detach().numpy()) < 1e-12
        assert _rel(grads["x"], tx.grad.numpy()) < 1e-12
        for name, t in (("downConv.weight", conv.weight), ("norm.weight", bn.weight), ("norm.bias", bn.bias)):
            assert _rel(grads[name], t.grad.numpy()) < 1e-11, name


def test_informer_rejects_bad_arguments():
    rng = np.random.default_rng(0)
    s = inf_mod._draw(rng, "tiny", mask_flag=False)
    with pytest.raises(ValueError, match="index_sample"):
        informer_attention_forward(**s.inputs, params=s.params, **dict(s.config, index_sample=np.zeros((3, 2), int)))
    with pytest.raises(TypeError, match="index_sample"):
        informer_attention_forward(**s.inputs, params=s.params, **dict(s.config, index_sample=np.zeros((6, 2))))
    with pytest.raises(ValueError, match="queries"):
        x = dict(s.inputs, queries=s.inputs["queries"][:, :4])
        informer_attention_forward(**x, params=s.params, **dict(s.config, mask_flag=True, index_sample=None))


# ------------------------------------------------------------------------------------------------
# SPARSEK


def test_sparsek_jacobian_is_the_free_set_centring():
    rng = np.random.default_rng(7)
    u = 1.5 * rng.standard_normal(9)
    m, _ = sparsek_mask(u, 3)
    free = (m > 0) & (m < 1)
    jac = np.array([sparsek_mask_vjp(e, m) for e in np.eye(9)])  # rows: VJPs of unit vectors = J^T rows
    want = np.where(free[:, None] & free[None, :], np.eye(9) - 1.0 / free.sum(), 0.0)
    assert np.allclose(jac, want.T, atol=1e-15)


def test_sparsek_becomes_the_hard_top_k_for_separated_scores():
    """Scores much further apart than 1: SPARSEK is exactly the 0/1 top-k indicator."""
    rng = np.random.default_rng(8)
    u = 10.0 * rng.permutation(12).astype(float)
    m, _ = sparsek_mask(u, 4)
    assert (m == (u >= np.sort(u)[-4])).all()


def test_sparsek_attention_top_k_selection_and_gates():
    rng = np.random.default_rng(9)
    s = sk_mod._draw(rng, "small", window=1)
    x = s.inputs
    _, cache = sparsek_attention_forward(**x, **s.config)
    n, k = x["u"].shape[-1], s.config["top_k"]
    for b in range(2):
        for h in range(2):
            for i in range(n):
                cand = [j for j in range(n) if j <= i - 1]
                sel = set(np.flatnonzero(cache["sel"][b, h, i]))
                assert sel == set(sorted(cand, key=lambda j: -x["u"][b, h, j])[:k])
                if len(cand) > k:
                    assert abs(cache["gates"][b, h, i].sum() - k) < 1e-12
                    assert (cache["gates"][b, h, i][list(sel)] > 0).all()


def test_sparsek_rejects_bad_arguments():
    rng = np.random.default_rng(0)
    s = sk_mod._draw(rng, "tiny")
    with pytest.raises(ValueError, match="window"):
        sparsek_attention_forward(**s.inputs, top_k=2, is_causal=False, window=1)
    with pytest.raises(ValueError, match="u must"):
        sparsek_attention_forward(**dict(s.inputs, u=s.inputs["u"][..., :3]), top_k=2)
    with pytest.raises(ValueError, match="gate"):
        sparsek_attention_forward(**s.inputs, top_k=2, gate="mul")


# ------------------------------------------------------------------------------------------------
# Routing Transformer


def test_routing_centroids_get_no_gradient_and_ema_is_pure():
    rng = np.random.default_rng(10)
    s = rt_mod._draw(rng, "tiny")
    x, c = s.inputs, s.config
    out, cache = routing_attention_forward(**x, **c)
    grads = routing_attention_backward(np.ones_like(out), cache)
    assert set(grads) == {"q", "k", "v"}
    mu = c["centroids"].copy()
    cnt, means = np.ones((2, mu.shape[1])), mu.copy()
    new = routing_kmeans_ema_update(rt_mod._ln(x["q"]), mu, cnt, means)
    assert (mu == c["centroids"]).all() and (cnt == 1).all()
    assert new["centroids"].shape == mu.shape and new["commitment_loss"] > 0


def test_routing_tokens_picked_twice_average():
    """A token picked by two clusters gets the average of both outputs (upstream count + 1e-2)."""
    rng = np.random.default_rng(11)
    s = rt_mod._draw(rng, "small", causal=False)
    x, c = s.inputs, s.config
    out, cache = routing_attention_forward(**x, **dict(c, scatter_eps=0.0))
    counts = np.zeros(out.shape[:-1])
    for idx in np.ndindex(*cache["idx_q"].shape[:-1]):
        counts[idx[:-1]][cache["idx_q"][idx]] += 1
    assert (out[counts == 0] == 0).all()
    ref = rt_mod._reference(**x, **dict(c, scatter_eps=0.0))
    assert np.max(np.abs(out - ref)) < 1e-12


# ------------------------------------------------------------------------------------------------
# Reformer LSH


@pytest.mark.parametrize("dedup", [False, True])
@pytest.mark.parametrize("n_hashes", [1, 3])
def test_reformer_fast_form_equals_explicit_form(dedup, n_hashes):
    rng = np.random.default_rng(12 + n_hashes)
    s = lsh_mod._draw(rng, "small", dedup=dedup, n_hashes=n_hashes, causal=n_hashes == 3)
    out = reformer_lsh_attention_forward(**s.inputs, params=s.params, **s.config)[0]
    assert np.max(np.abs(out - lsh_mod._reference(**s.inputs, params=s.params, **s.config))) < 1e-12


def test_reformer_core_gradients_equal_the_dense_log_count_form():
    """The chunked core's gradients equal those of dense attention with the bias log c_ij (+ self mask)."""
    rng = np.random.default_rng(14)
    qk, v = rng.standard_normal((2, 2, 8, 3)), rng.standard_normal((2, 2, 8, 2))
    buckets = lsh_hash(qk, rng.standard_normal((2, 3, 2, 2)))
    out, cache = lsh_attention_core_forward(qk, v, buckets, chunk_len=4, eps=0.0)
    g = rng.standard_normal(out.shape)
    dqk, dv = lsh_attention_core_backward(g, cache)
    # dense form: multiplicities from the slots' chunks, rebuilt by a Python sort
    count = np.zeros((2, 2, 8, 8))
    for b in range(2):
        for h in range(2):
            slots = sorted(((r, i) for r in range(2) for i in range(8)), key=lambda t: (t[0], buckets[b, h, t[0], t[1]], t[1]))
            for t, (_, i) in enumerate(slots):
                for cc in ((t // 4 - 1) % 4, t // 4):
                    for _, j in slots[cc * 4:(cc + 1) * 4]:
                        count[b, h, i, j] += 1
    khat = qk / np.linalg.norm(qk, axis=-1, keepdims=True)
    bias = np.where(count > 0, np.log(np.maximum(count, 1)), -np.inf) - 1e5 * np.eye(8)
    ref, rc = attention_core_forward(qk, khat, v, attn_mask=bias, scale=1.0)
    gr = attention_core_backward(g, rc)
    # chain rule through khat = qk / |qk|
    nrm = np.linalg.norm(qk, axis=-1, keepdims=True)
    dk = (gr["k"] - khat * np.sum(gr["k"] * khat, -1, keepdims=True)) / nrm
    assert np.max(np.abs(out - ref)) < 1e-12
    assert np.max(np.abs(dqk - (gr["q"] + dk))) < 1e-11 and np.max(np.abs(dv - gr["v"])) < 1e-12


def test_reformer_per_example_rotations_and_errors():
    rng = np.random.default_rng(15)
    s = lsh_mod._draw(rng, "tiny")
    rot = s.config["rotations"]
    per_example = np.stack([rot, rot])
    a = reformer_lsh_attention_forward(**s.inputs, params=s.params, **s.config)[0]
    b = reformer_lsh_attention_forward(**s.inputs, params=s.params, **dict(s.config, rotations=per_example))[0]
    assert np.array_equal(a, b)
    with pytest.raises(ValueError, match="chunk_len"):
        reformer_lsh_attention_forward(**s.inputs, params=s.params, **dict(s.config, chunk_len=3))
    with pytest.raises(ValueError, match="rotations"):
        reformer_lsh_attention_forward(**s.inputs, params=s.params, **dict(s.config, rotations=rot[..., :1]))
    with pytest.raises(ValueError, match="n_buckets"):
        reformer_lsh_attention_forward(**s.inputs, params=s.params, **dict(s.config, n_buckets=5, rotations=None))
    g = reformer_lsh_attention_backward(np.ones_like(a), reformer_lsh_attention_forward(**s.inputs, params=s.params,
                                                                                        **s.config)[1])
    assert set(g) == {"x", "w_q", "w_v", "w_o"}
