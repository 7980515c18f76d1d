"""Residual schemes and composite blocks (issue 16, slice b2): what the generated registry tests
cannot express.

* every block chains its backward through the attention it is given — shown with two different
  attentions from the registry (``multi_head_attention`` and ``diff_attention_v1``) and with a
  user-supplied ``(forward, backward)`` pair;
* the sublayer protocol of ``refattn.blocks.core`` (resolution, params split, messages);
* the reversible block: reconstruction against a cached forward, reconstructed vs cached
  gradients, float32 vs float64, and the memory it saves;
* block-specific layouts (TNT's two outputs, the looped window, nGPT's RoPE options).
"""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from refattn import registry
from refattn.blocks import (
    Sublayer,
    add_prefix,
    cache_nbytes,
    init_attention_params,
    looped_transformer,
    macaron_block_forward,
    ngpt_normalized_block,
    resolve_sublayer,
    reversible_residual_block,
    reversible_residual_block_backward,
    reversible_residual_block_forward,
    reversible_residual_inverse,
    split_block_params,
    tnt_block_backward,
    tnt_block_forward,
)
from refattn.blocks import looped as looped_mod
from refattn.blocks import macaron as macaron_mod
from refattn.blocks import ngpt as ngpt_mod
from refattn.blocks import parallel as parallel_mod
from refattn.blocks import reversible as reversible_mod
from refattn.blocks import simplified as simplified_mod
from refattn.blocks import tnt as tnt_mod
from refattn.registry import Sample
from refattn.testing import directional_check, gradcheck

ATTENTIONS = ("multi_head_attention", "diff_attention_v1")
BLOCKS = ("macaron_block", "parallel_attention_mlp_block", "simplified_block_he_hofmann", "ngpt_normalized_block",
          "looped_transformer", "reversible_residual_block", "tnt_block")


def _with_attention(slug, rng, attention):
    """A tiny sample of ``slug`` whose attention sublayer(s) are ``attention``."""
    if slug == "macaron_block":
        c = 3 if attention == "multi_head_attention" else 4
        p, acfg = macaron_mod._params(rng, c, 3, attention, 1)
        return Sample({"x": rng.standard_normal((2, 3, c))}, p,
                      {"attention": attention, "attention_config": acfg, "normalize_before": True})
    if slug == "parallel_attention_mlp_block":
        c = 3 if attention == "multi_head_attention" else 4
        p, acfg = parallel_mod._params(rng, c, 4, attention, 1, shared=False)
        return Sample({"x": rng.standard_normal((2, 3, c))}, p,
                      {"attention": attention, "attention_config": acfg, "shared_norm": False})
    if slug == "simplified_block_he_hofmann":
        return simplified_mod._sample(rng, "tiny", attention)
    if slug == "ngpt_normalized_block":
        return ngpt_mod._sample(rng, "tiny", attention)
    if slug == "looped_transformer":
        return looped_mod._sample(rng, "tiny", attention)
    if slug == "reversible_residual_block":
        return reversible_mod._sample(rng, "tiny", attention, store="outputs")
    return tnt_mod._sample(rng, "tiny", attention)


def _attention_keys(sample):
    """The params keys that belong to an attention sublayer (prefixed, or all keys the block does
    not own for nGPT)."""
    ngpt_own = {"attn_alpha", "mlp_alpha", "suv", "c_fc.weight", "mlp_c_proj.weight"}
    marks = ("attn.", "self_attn.", "inner_attn.", "outer_attn.")
    keys = [k for k in sample.params if any(m in k for m in marks)]
    if not keys:  # nGPT: the attention's keys sit at the block level
        keys = [k for k in sample.params if k not in ngpt_own]
    return keys


@pytest.mark.parametrize("attention", ATTENTIONS)
@pytest.mark.parametrize("slug", BLOCKS)
def test_backward_chains_through_the_given_attention(slug, attention):
    rec = registry.get(slug)
    s = _with_attention(slug, np.random.default_rng(7), attention)
    keys = _attention_keys(s)
    assert keys, f"{slug}: the sample has no attention parameters"
    # a diff_attention_v1 sample carries its lambda vectors, an MHA sample does not
    assert any("lambda_q1" in k for k in keys) == (attention == "diff_attention_v1")
    report = directional_check(rec.forward, rec.backward, s)
    assert report.passed, str(report)
    # the attention's parameters receive their gradient through the block (none is structurally zero)
    out, cache = rec.forward(**s.inputs, params=s.params, **s.config)
    g = rec.backward(np.cos(np.arange(out.size)).reshape(out.shape), cache)
    live = [k for k in keys if np.abs(g[k]).max() > 0]
    assert len(live) >= len(keys) - 2, f"{slug}/{attention}: attention params without gradient: {set(keys) - set(live)}"


def _mean_mixer_forward(x, params, *, scale=1.0):
    """A token mixer that is not attention: y = scale * mean_over_tokens(x) @ W."""
    m = x.mean(axis=-2, keepdims=True)
    y = scale * np.broadcast_to(m @ params["w"], x.shape).copy()
    return y, {"x": x, "m": m, "w": params["w"], "scale": scale}


def _mean_mixer_backward(dout, cache):
    x, m, w, s = cache["x"], cache["m"], cache["w"], cache["scale"]
    dm = s * dout.sum(axis=-2, keepdims=True)
    return {"x": np.broadcast_to(dm @ w.T / x.shape[-2], x.shape).copy(),
            "w": m.reshape(-1, m.shape[-1]).T @ dm.reshape(-1, dm.shape[-1])}


def test_a_user_pair_is_chained_like_a_registry_attention():
    # The macaron block with a (forward, backward) pair that is not attention at all: FD-exact, and
    # its parameter gradient appears under the block's prefix.
    rng = np.random.default_rng(0)
    p, _ = macaron_mod._params(rng, 3, 3)
    p = {k: v for k, v in p.items() if not k.startswith("self_attn.")}
    p["self_attn.w"] = rng.standard_normal((3, 3))
    s = Sample({"x": rng.standard_normal((2, 3, 3))}, p,
               {"attention": (_mean_mixer_forward, _mean_mixer_backward), "attention_config": {"scale": 0.7}})
    rec = registry.get("macaron_block")
    rep = gradcheck(rec.forward, rec.backward, s)
    assert rep.passed and "self_attn.w" in [r[0] for r in rep.rows]


def test_the_block_calls_the_sublayer_backward():
    calls = {"forward": 0, "backward": 0}

    def fwd(x, params, **cfg):
        calls["forward"] += 1
        return _mean_mixer_forward(x, params, **cfg)

    def bwd(d, c):
        calls["backward"] += 1
        return _mean_mixer_backward(d, c)

    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 4, 6))
    p = dict(reversible_mod._params(rng, 3, ("attention", "ffn"), 3, 4, "multi_head_attention", 1)[0])
    p = {k: v for k, v in p.items() if ".attn." not in k}
    for l in range(3):
        p[f"layers.{l}.f1.attn.w"] = rng.standard_normal((3, 3))
    y, cache = reversible_residual_block_forward(x, p, num_layers=3, attention=(fwd, bwd))
    assert calls == {"forward": 3, "backward": 0}
    reversible_residual_block_backward(np.ones_like(y), cache)
    # the backward reconstructs each layer (one more forward per layer), then chains its backward
    assert calls == {"forward": 6, "backward": 3}


# --------------------------------------------------------------------------------------------
# The sublayer protocol


def test_resolve_sublayer_accepts_slug_pair_and_sublayer():
    a = resolve_sublayer("multi_head_attention", prefix="attn", config={"num_heads": 2})
    assert a.forward is registry.get("multi_head_attention").forward and a.key("q_proj") == "attn.q_proj"
    b = resolve_sublayer((_mean_mixer_forward, _mean_mixer_backward), prefix="")
    assert b.key("w") == "w" and b.name == "_mean_mixer_forward"
    c = resolve_sublayer(Sublayer(_mean_mixer_forward, _mean_mixer_backward, config={"scale": 2.0}), prefix="mix")
    assert c.prefix == "mix" and c.config == {"scale": 2.0}


@pytest.mark.parametrize("spec,config,exc,match", [
    ("sdpa", None, ValueError, "not a token mixer"),
    ("no_such_attention", None, ValueError, "not a registered mechanism"),
    (42, None, TypeError, "registry slug"),
    ((_mean_mixer_forward,), None, TypeError, "registry slug"),
    ("multi_head_attention", [("num_heads", 2)], TypeError, "attention_config"),
    (Sublayer(_mean_mixer_forward, _mean_mixer_backward), {"scale": 1.0}, ValueError, "its own config"),
])
def test_resolve_sublayer_rejects(spec, config, exc, match):
    with pytest.raises(exc, match=match):
        resolve_sublayer(spec, prefix="attn", config=config)


def test_split_block_params_routes_keys_by_longest_prefix():
    subs = [Sublayer(None, None, prefix="a"), Sublayer(None, None, prefix="a.b"), Sublayer(None, None, prefix="")]
    params = {"w": np.ones(2), "a.x": np.ones(1), "a.b.y": np.ones(1), "z": np.ones(3)}
    own, (pa, pab, rest) = split_block_params(params, {"w": (2,)}, subs, where="test")
    assert set(own) == {"w"} and set(pa) == {"x"} and set(pab) == {"y"} and set(rest) == {"z"}
    with pytest.raises(ValueError, match="unknown keys"):
        split_block_params(params, {"w": (2,)}, subs[:2], where="test")


def test_messages_name_the_prefixed_key_and_the_sublayer():
    s = macaron_mod._sample(np.random.default_rng(0), "tiny")
    key = next(k for k in s.params if k.startswith("self_attn."))
    bad = dict(s.params, **{key: s.params[key].astype(np.int64)})
    with pytest.raises(TypeError, match=key.replace(".", r"\.")):
        macaron_block_forward(**s.inputs, params=bad, **s.config)
    wrong = dict(s.params, **{key: np.ones((7, 7))})
    with pytest.raises(ValueError, match="attention sublayer 'self_attn'"):
        macaron_block_forward(**s.inputs, params=wrong, **s.config)
    with pytest.raises(ValueError, match="unknown keys"):
        macaron_block_forward(**s.inputs, params=dict(s.params, stray=np.ones(1)), **s.config)


# --------------------------------------------------------------------------------------------
# Reversible residual block: reconstruction and memory


def _rev_sample(rng, layers=3, splits=2, attention="multi_head_attention", n=5, c=6, f=8):
    functions = tuple(("attention", "ffn")[i % 2] for i in range(splits))
    p, acfg = reversible_mod._params(rng, layers, functions, c, f, attention, 2 if attention == "multi_head_attention" else 1)
    cfg = {"num_layers": layers, "num_splits": splits, "attention": attention, "attention_config": acfg}
    return rng.standard_normal((2, n, splits * c)), p, cfg


def _first_layers(p, k):
    return {key: v for key, v in p.items() if int(key.split(".")[1]) < k}


@pytest.mark.parametrize("splits,attention", [(2, "multi_head_attention"), (3, "multi_head_attention"),
                                              (2, "diff_attention_v1")])
def test_reversible_reconstruction_matches_the_cached_forward(splits, attention):
    # The inverse the backward uses reproduces every layer's input of a forward that keeps them.
    x, p, cfg = _rev_sample(np.random.default_rng(0), splits=splits, attention=attention,
                            c=6 if attention == "multi_head_attention" else 4)
    y = reversible_residual_block(x, p, **cfg)
    rec = reversible_residual_inverse(y, p, return_all=True, **cfg)
    cached = [x] + [reversible_residual_block(x, _first_layers(p, k), **dict(cfg, num_layers=k))
                    for k in range(1, cfg["num_layers"])]
    for k, (a, b) in enumerate(zip(rec, cached)):
        err = np.abs(a - b).max() / np.abs(b).max()
        assert err < 1e-13, f"layer {k} input reconstructed with relative error {err}"


@pytest.mark.parametrize("splits,attention", [(2, "multi_head_attention"), (3, "diff_attention_v1")])
def test_reversible_gradients_equal_the_cached_backward(splits, attention):
    x, p, cfg = _rev_sample(np.random.default_rng(1), splits=splits, attention=attention,
                            c=6 if attention == "multi_head_attention" else 4)
    grads = {}
    for store in ("outputs", "all"):
        y, cache = reversible_residual_block_forward(x, p, store=store, **cfg)
        grads[store] = reversible_residual_block_backward(np.sin(3 * y), cache)
    scale = max(np.abs(v).max() for v in grads["all"].values())
    for k in grads["all"]:
        assert np.abs(grads["outputs"][k] - grads["all"][k]).max() <= 1e-12 * scale, k


def test_reversible_float32_reconstruction_error():
    x, p, cfg = _rev_sample(np.random.default_rng(2), layers=4)
    errs = {}
    for dt in (np.float64, np.float32):
        xd, pd = x.astype(dt), {k: v.astype(dt) for k, v in p.items()}
        y = reversible_residual_block(xd, pd, **cfg)
        assert y.dtype == dt
        errs[dt] = np.abs(reversible_residual_inverse(y, pd, **cfg).astype(np.float64) - x).max() / np.abs(x).max()
    assert errs[np.float64] < 1e-13
    assert 1e-9 < errs[np.float32] < 1e-4  # float32 round-off, visible but small after 4 layers


def _peak_bytes(fn):
    tracemalloc.start()
    tracemalloc.reset_peak()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_reversible_memory_saving():
    # Activations kept for the backward: O(1) layers with reconstruction, O(L) with the cache; the
    # peak of forward + backward grows with depth only for the cached variant (beyond the
    # parameter gradients, which both return).
    rng = np.random.default_rng(3)
    held, peak = {}, {}
    for layers in (1, 6):
        x, p, cfg = _rev_sample(rng, layers=layers, n=32, c=16, f=32)
        for store in ("outputs", "all"):
            y, cache = reversible_residual_block_forward(x, p, store=store, **cfg)
            held[store, layers] = cache_nbytes(cache) - cache_nbytes((cache["params"], cache["attn_params"]))
            del y, cache

            def run(store=store, x=x, p=p, cfg=cfg):
                y, cache = reversible_residual_block_forward(x, p, store=store, **cfg)
                reversible_residual_block_backward(np.ones_like(y), cache)

            peak[store, layers] = _peak_bytes(run)
    out_bytes = 2 * 32 * 32 * 8
    assert held["outputs", 1] == held["outputs", 6] == out_bytes
    assert held["all", 6] > 5 * held["all", 1] > 5 * out_bytes
    # reconstructing: the peak grows by the 5 extra layers' parameter gradients (and their per-layer
    # bookkeeping), bounded here by twice their size; cached: by at least 4 layers of activations
    param_grads = 5 * sum(v.nbytes for v in _rev_sample(rng, layers=1, n=32, c=16, f=32)[1].values())
    assert peak["outputs", 6] - peak["outputs", 1] < 2 * param_grads
    assert peak["all", 6] - peak["all", 1] > 4 * held["all", 1]


# --------------------------------------------------------------------------------------------
# Block-specific layouts


def test_tnt_two_outputs_and_upstream_layout():
    s = tnt_mod._sample(np.random.default_rng(4), "small", outputs="both")
    (y, z), cache = tnt_block_forward(**s.inputs, params=s.params, **s.config)
    assert y.shape == s.inputs["inner"].shape and z.shape == s.inputs["outer"].shape
    g_none = tnt_block_backward((None, np.ones_like(z)), cache)
    g_outer = tnt_block_backward(np.ones_like(z), tnt_block_forward(**s.inputs, params=s.params,
                                                                      **dict(s.config, outputs="outer"))[1])
    for k in g_outer:
        np.testing.assert_allclose(g_none[k], g_outer[k], rtol=0, atol=1e-13, err_msg=k)
    with pytest.raises(TypeError, match="pair"):
        tnt_block_backward(np.ones_like(z), cache)
    with pytest.raises(ValueError, match="outer"):
        tnt_block_forward(s.inputs["inner"], s.inputs["outer"][:, 1:], s.params, **s.config)


def test_looped_window_and_single_loop():
    s = looped_mod._sample(np.random.default_rng(5), "small", pre=0, post=0)
    cfg = dict(s.config, window=None)
    last = looped_transformer(**s.inputs, params=s.params, **cfg)
    win = looped_transformer(**s.inputs, params=s.params, **dict(cfg, window=cfg["n_loops"]))
    assert win.shape == s.inputs["x"].shape[:-2] + (cfg["n_loops"],) + s.inputs["x"].shape[-2:]
    np.testing.assert_array_equal(win[:, -1], last)
    # T iterations of injection "none" are T chained single iterations
    one = dict(cfg, n_loops=1, injection="none")
    y = s.inputs["x"]
    for _ in range(3):
        y = looped_transformer(y, s.params, **one)
    np.testing.assert_allclose(looped_transformer(**s.inputs, params=s.params, **dict(one, n_loops=3)), y,
                               rtol=0, atol=1e-13)


@pytest.mark.parametrize("rope", ngpt_mod.NGPT_ROPE)
def test_ngpt_rope_variants(rope):
    rec = registry.get("ngpt_normalized_block")
    s = ngpt_mod._sample(np.random.default_rng(6), "small", rope=rope)
    assert directional_check(rec.forward, rec.backward, s).passed
    y = ngpt_normalized_block(**s.inputs, params=s.params, **s.config)
    np.testing.assert_allclose(np.linalg.norm(y, axis=-1), 1.0, rtol=0, atol=1e-12)


def test_ngpt_interleaved_rope_is_relative():
    # With the paper's rotation the attention scores depend on positions through differences only:
    # shifting the whole sequence by prepending tokens does not change how token j attends to i.
    from refattn.blocks import ngpt_rope_tables

    rng = np.random.default_rng(8)
    q, k = rng.standard_normal((1, 1, 6, 4)), rng.standard_normal((1, 1, 6, 4))
    a, b = ngpt_rope_tables(6, 4, "interleaved")
    rq, rk = ngpt_mod._rope(q, (a, b), "interleaved"), ngpt_mod._rope(k, (a, b), "interleaved")
    s1 = np.sum(rq[..., 3, :] * rk[..., 1, :])
    qs, ks = np.roll(q, 2, axis=2), np.roll(k, 2, axis=2)
    rq, rk = ngpt_mod._rope(qs, (a, b), "interleaved"), ngpt_mod._rope(ks, (a, b), "interleaved")
    s2 = np.sum(rq[..., 5, :] * rk[..., 3, :])
    # the upstream map is not a rotation: the same shift changes the score
    uq, uk = ngpt_mod._rope(q, ngpt_rope_tables(6, 4), "upstream"), ngpt_mod._rope(k, ngpt_rope_tables(6, 4), "upstream")
    vq, vk = ngpt_mod._rope(qs, ngpt_rope_tables(6, 4), "upstream"), ngpt_mod._rope(ks, ngpt_rope_tables(6, 4), "upstream")
    assert abs(np.sum(uq[..., 3, :] * uk[..., 1, :]) - np.sum(vq[..., 5, :] * vk[..., 3, :])) > 1e-3
    np.testing.assert_allclose(s1, s2, rtol=1e-12)


@pytest.mark.slow  # importing torch takes seconds
def test_parallel_block_matches_a_torch_composition():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(9)
    c, h, f = 8, 2, 16
    p, acfg = parallel_mod._params(rng, c, f, "multi_head_attention", h, shared=False)
    x = rng.standard_normal((2, 5, c))
    y = parallel_mod.parallel_attention_mlp_block(x, p, attention_config=acfg, shared_norm=False)
    t = {k: torch.tensor(v) for k, v in p.items()}
    xt = torch.tensor(x)
    ln = lambda v, k: torch.nn.functional.layer_norm(v, (c,), t[f"{k}.weight"], t[f"{k}.bias"], 1e-5)  # noqa: E731
    h1 = ln(xt, "ln_1")
    w_in = torch.cat([t["attn.q_proj"], t["attn.k_proj"], t["attn.v_proj"]], 1).T
    b_in = torch.cat([t["attn.q_proj_bias"], t["attn.k_proj_bias"], t["attn.v_proj_bias"]])
    attn = torch.nn.functional.multi_head_attention_forward(
        h1.transpose(0, 1), h1.transpose(0, 1), h1.transpose(0, 1), c, h, w_in, b_in, None, None, False, 0.0,
        t["attn.out_proj"].T, t["attn.out_proj_bias"], need_weights=False)[0].transpose(0, 1)
    mlp = torch.nn.functional.gelu(ln(xt, "ln_2") @ t["mlp.fc_in.weight"] + t["mlp.fc_in.bias"], approximate="tanh")
    ref = xt + attn + mlp @ t["mlp.fc_out.weight"] + t["mlp.fc_out.bias"]
    np.testing.assert_allclose(y, ref.numpy(), rtol=0, atol=1e-12)


def test_init_attention_params_fit_their_layers():
    rng = np.random.default_rng(10)
    x = rng.standard_normal((2, 3, 8))
    for slug in ATTENTIONS:
        p, cfg = init_attention_params(rng, slug, 8, 2)
        y = registry.get(slug).forward(x, params=p, **cfg)[0]
        assert y.shape == x.shape
        assert set(add_prefix(p, "attn")) == {f"attn.{k}" for k in p}
    with pytest.raises(ValueError, match="init_attention_params"):
        init_attention_params(rng, "sdpa", 8, 2)
