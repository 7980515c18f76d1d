"""Operator slice o5a (issue 17, T3 whole-model entries): what the registry cannot express.

PIBERT physics-biased attention: finite differences with a mask and with lambda <= 0 (the
residual gradient is then exactly zero), the physics of the bias (a key with a large residual is
suppressed), and argument errors. DiTTO: finite differences with the identity skip, d/dt at
extrapolated times, argument errors. PDEformer: the table gradients against a brute-force
scatter, argument errors; the INR decoder's finite differences on kink-free samples, explicit
loops with and without an active clamp, mesh-freeness, argument errors. PROSE: finite differences
of the learnable-time and post-norm variants, table rows past output_len, argument errors. ViTO and
ECHO: unimplemented records carry precise notes.
"""

from __future__ import annotations

import numpy as np
import pytest

from refattn.operators import init_pibert_attention_params
from refattn.operators.pibert_attention import pibert_attention_backward, pibert_attention_forward
from refattn.registry import Sample
from refattn.testing import gradcheck


def _pibert_sample(rng, lam=0.7, mask=False):
    n, c = 4, 4
    r = rng.standard_normal((2, n, 2))
    r *= rng.uniform(0.5, 1.5, (2, n, 1)) / np.linalg.norm(r, axis=-1, keepdims=True)
    cfg = {"num_heads": 2, "lambda_param": lam}
    if mask:
        m = rng.random((2, n, n)) < 0.6
        m[:, np.arange(n), np.arange(n)] = True
        cfg["attn_mask"] = m
    return Sample(inputs={"x": rng.standard_normal((2, n, c)), "pde_residuals": r},
                  params=init_pibert_attention_params(rng, c), config=cfg)


def test_pibert_gradcheck_masked():
    s = _pibert_sample(np.random.default_rng(1), mask=True)
    assert gradcheck(pibert_attention_forward, pibert_attention_backward, s).max_rel < 1e-6


def test_pibert_lambda_nonpositive_zero_residual_grad():
    s = _pibert_sample(np.random.default_rng(2), lam=-0.5)
    out, cache = pibert_attention_forward(**s.inputs, params=s.params, **s.config)
    g = pibert_attention_backward(np.ones_like(out), cache)
    assert np.array_equal(g["pde_residuals"], np.zeros_like(s.inputs["pde_residuals"]))
    assert gradcheck(pibert_attention_forward, pibert_attention_backward, s).max_rel < 1e-6


def test_pibert_large_residual_key_is_suppressed():
    # One key with a residual norm 40 larger than the rest gets weight ~exp(-40 * lambda).
    rng = np.random.default_rng(3)
    s = _pibert_sample(rng, lam=1.0)
    r = s.inputs["pde_residuals"].copy()
    r[:, 2] *= 40.0 / np.linalg.norm(r[:, 2], axis=-1, keepdims=True)
    _, cache = pibert_attention_forward(s.inputs["x"], r, s.params, num_heads=2, lambda_param=1.0)
    p = cache["core"]["p"]
    assert p[..., 2].max() < 1e-12
    _, cache0 = pibert_attention_forward(s.inputs["x"], None, s.params, num_heads=2)
    assert cache0["core"]["p"][..., 2].min() > 1e-6


def test_pibert_zero_residual_row_has_zero_gradient():
    s = _pibert_sample(np.random.default_rng(4))
    r = s.inputs["pde_residuals"].copy()
    r[0, 1] = 0.0
    out, cache = pibert_attention_forward(s.inputs["x"], r, s.params, **s.config)
    g = pibert_attention_backward(np.ones_like(out), cache)
    assert np.all(np.isfinite(g["pde_residuals"])) and np.all(g["pde_residuals"][0, 1] == 0.0)


def test_pibert_bad_input():
    s = _pibert_sample(np.random.default_rng(5))
    x, r, p = s.inputs["x"], s.inputs["pde_residuals"], s.params
    with pytest.raises(ValueError, match="pde_residuals"):
        pibert_attention_forward(x, r[:, :2], p, num_heads=2)
    with pytest.raises(ValueError, match="num_heads"):
        pibert_attention_forward(x, r, p, num_heads=3)
    with pytest.raises(TypeError, match="lambda_param"):
        pibert_attention_forward(x, r, p, num_heads=2, lambda_param="1")
    with pytest.raises(TypeError, match="attn_mask"):
        pibert_attention_forward(x, r, p, num_heads=2, attn_mask=np.ones((2, 4, 4)))
    with pytest.raises(ValueError, match="attn_mask"):
        pibert_attention_forward(x, r, p, num_heads=2, attn_mask=np.ones((2, 4, 3), bool))
    bad = dict(p)
    bad["q_proj.weight"] = bad["q_proj.weight"][:, :3]
    with pytest.raises(ValueError, match="q_proj.weight"):
        pibert_attention_forward(x, r, bad, num_heads=2)


# --------------------------------------------------------------------------------------------
# DiTTO time-conditioned block


def test_ditto_gradcheck_identity_residual():
    from refattn.operators.ditto import ditto_block_backward, ditto_block_forward, init_ditto_block_params
    rng = np.random.default_rng(6)
    p = init_ditto_block_params(rng, 2, 2, 4, time_dim=4)
    p["block1.norm.bias"] = 0.3 * rng.standard_normal(2)
    s = Sample(inputs={"x": rng.standard_normal((2, 2, 3, 3)), "t": rng.uniform(0.2, 2.0, 2)}, params=p,
               config={"groups": 1})
    assert gradcheck(ditto_block_forward, ditto_block_backward, s).max_rel < 1e-6


def test_ditto_time_continuity_and_extrapolation():
    # The output is a smooth function of t: a finite difference in t at an unseen (extrapolated)
    # time matches the backward's dt.
    from refattn.operators.ditto import ditto_block_backward, ditto_block_forward, init_ditto_block_params
    rng = np.random.default_rng(7)
    p = init_ditto_block_params(rng, 3, 4, 8)
    x = rng.standard_normal((2, 3, 4, 4))
    t = np.array([7.5, 11.0])
    w = rng.standard_normal((2, 4, 4, 4))
    out, cache = ditto_block_forward(x, t, p, groups=2)
    dt = ditto_block_backward(w, cache)["t"]
    eps = 1e-6
    fd = np.array([(np.sum(w * ditto_block_forward(x, t + eps * np.eye(2)[i], p, groups=2)[0])
                    - np.sum(w * ditto_block_forward(x, t - eps * np.eye(2)[i], p, groups=2)[0])) / (2 * eps)
                   for i in range(2)])
    assert np.allclose(dt, fd, rtol=1e-6, atol=1e-9)


def test_ditto_bad_input():
    from refattn.operators.ditto import ditto_block_forward, init_ditto_block_params
    rng = np.random.default_rng(8)
    p = init_ditto_block_params(rng, 3, 4, 8)
    x, t = rng.standard_normal((2, 3, 4, 4)), np.ones(2)
    with pytest.raises(ValueError, match="t must have shape"):
        ditto_block_forward(x, np.ones(3), p, groups=2)
    with pytest.raises(ValueError, match="groups"):
        ditto_block_forward(x, t, p, groups=3)
    with pytest.raises(ValueError, match="C_in"):
        ditto_block_forward(x[:, :2], t, p, groups=2)
    bad = dict(p)
    del bad["res_conv.weight"]
    with pytest.raises(ValueError, match="res_conv"):
        ditto_block_forward(x, t, bad, groups=2)
    with pytest.raises(ValueError, match="time_mlp.1.weight"):
        ditto_block_forward(x, t, {k: v for k, v in p.items() if k != "time_mlp.1.weight"}, groups=2)


# --------------------------------------------------------------------------------------------
# PDEformer graph attention


def test_pdeformer_table_gradient_is_scatter_against_brute_force():
    # The table gradients equal a brute-force sum over the pairs that selected each row.
    from refattn.attention.softmax import attention_core_backward
    from refattn.operators.pdeformer import _sample, pdeformer_attention_backward, pdeformer_attention_forward
    rng = np.random.default_rng(9)
    s = _sample(rng, "small")
    out, cache = pdeformer_attention_forward(**s.inputs, params=s.params, **s.config)
    g = rng.standard_normal(out.shape)
    grads = pdeformer_attention_backward(g, cache)
    from refattn.nn.linear import split_heads
    dom = g @ s.params["out_proj.weight"].T
    ds = attention_core_backward(split_heads(dom, 2), cache["core"])["bias"]
    sp = s.config["spatial_pos"]
    want_f = np.zeros_like(grads["spatial_pos_encoder.embedding_table"])
    want_r = np.zeros_like(want_f)
    for b in range(sp.shape[0]):
        for i in range(sp.shape[1]):
            for j in range(sp.shape[2]):
                want_f[sp[b, i, j]] += ds[b, :, i, j]
                want_r[sp[b, j, i]] += ds[b, :, i, j]
    assert np.allclose(grads["spatial_pos_encoder.embedding_table"], want_f, atol=1e-13)
    assert np.allclose(grads["spatial_pos_encoder_rev.embedding_table"], want_r, atol=1e-13)


def test_pdeformer_no_attn_bias_and_bad_input():
    from refattn.operators.pdeformer import _sample, pdeformer_attention_backward, pdeformer_attention_forward
    rng = np.random.default_rng(10)
    s = _sample(rng, "tiny")
    out, cache = pdeformer_attention_forward(s.inputs["x"], None, s.params, **s.config)
    assert "attn_bias" not in pdeformer_attention_backward(np.ones_like(out), cache)
    x, cfg = s.inputs["x"], dict(s.config)
    with pytest.raises(ValueError, match=r"spatial_pos entries"):
        pdeformer_attention_forward(x, None, s.params, **dict(cfg, spatial_pos=cfg["spatial_pos"] + 10))
    with pytest.raises(TypeError, match="spatial_pos"):
        pdeformer_attention_forward(x, None, s.params, **dict(cfg, spatial_pos=cfg["spatial_pos"] * 1.0))
    with pytest.raises(ValueError, match="key_padding_mask pads every node"):
        pdeformer_attention_forward(x, None, s.params, **dict(cfg, key_padding_mask=np.ones((2, 3), bool)))
    with pytest.raises(ValueError, match="attn_bias"):
        pdeformer_attention_forward(x, np.zeros((2, 3, 2)), s.params, **cfg)


# --------------------------------------------------------------------------------------------
# PROSE fusion and operator decoder


@pytest.mark.parametrize("time_embed,norm_first", [("learnable", True), ("continuous", False)])
def test_prose_gradcheck_variants(time_embed, norm_first):
    from refattn.operators.prose import _sample, prose_decoder_backward, prose_decoder_forward
    s = _sample(np.random.default_rng(11), "tiny", time_embed=time_embed, norm_first=norm_first)
    if s.inputs["times"] is None:
        s = Sample(inputs={k: v for k, v in s.inputs.items() if v is not None}, params=s.params,
                   config=dict(s.config, times=None))
    assert gradcheck(prose_decoder_forward, prose_decoder_backward, s).max_rel < 1e-6


def test_prose_learnable_table_rows_beyond_output_len_get_zero_grad():
    from refattn.operators.prose import _sample, prose_decoder_backward, prose_decoder_forward
    s = _sample(np.random.default_rng(12), "small", time_embed="learnable")
    out, cache = prose_decoder_forward(**s.inputs, params=s.params, **s.config)
    g = prose_decoder_backward(np.ones_like(out), cache)["time_embed"]
    nl = s.config["output_len"]
    assert np.all(g[:, nl:] == 0.0) and np.abs(g[:, :nl]).max() > 0


def test_prose_bad_input():
    from refattn.operators.prose import _sample, prose_decoder_forward
    s = _sample(np.random.default_rng(13), "small")
    t, x0, x1 = s.inputs["times"], s.inputs["x0"], s.inputs["x1"]
    with pytest.raises(ValueError, match="continuous"):
        prose_decoder_forward(None, x0, x1, s.params, **s.config)
    with pytest.raises(ValueError, match="x1"):
        prose_decoder_forward(t, x0, x1[:, :, :4], s.params, **s.config)
    with pytest.raises(ValueError, match="key padding masks pad every"):
        prose_decoder_forward(t, x0[:, :0 + 1], x1, s.params, **dict(s.config, key_padding_mask0=np.ones((2, 1), bool),
                                                                      key_padding_mask1=np.ones((2, 3), bool)))
    with pytest.raises(TypeError, match="key_padding_mask1"):
        prose_decoder_forward(t, x0, x1, s.params, **dict(s.config, key_padding_mask1=np.ones((2, 3))))
    with pytest.raises(ValueError, match="time_embed"):
        prose_decoder_forward(t, x0, x1, s.params, **dict(s.config, time_embed="fourier"))


# --------------------------------------------------------------------------------------------
# Records left unimplemented (rule: a precise note, never a stub)


@pytest.mark.parametrize("slug", ["vito_unet_vit_operator", "echo_generative_trajectory_operator"])
def test_unimplemented_records_have_precise_notes(slug):
    from refattn import registry
    rec = registry.get(slug)
    assert not rec.implemented and rec.forward is None and rec.backward is None
    assert rec.notes.startswith("Not implemented:") and len(rec.notes) > 300


# --------------------------------------------------------------------------------------------
# PDEformer INR decoder (Poly-INR with scale/shift hypernetworks)


def _inr_sample(seed, hyper_num_layers=2):
    # Redraw until every LeakyReLU / ReLU pre-activation is at least 1e-3 away from its kink, so the
    # central differences (step 1e-6) never cross one.
    from refattn.operators.pdeformer import init_pdeformer_inr_params, pdeformer_inr_forward
    rng = np.random.default_rng(seed)
    for _ in range(200):
        p = init_pdeformer_inr_params(rng, 2, 2, 3, 3, 3, 3, hyper_num_layers)
        x, z = rng.standard_normal((2, 3, 2)), rng.standard_normal((2, 2, 3))
        _, c = pdeformer_inr_forward(x, z, p, num_layers=3, hyper_num_layers=hyper_num_layers)
        pre = [lay["m"] for lay in c["layers"]] + [a for lay in c["layers"] for a in lay["sc_pre"] + lay["sh_pre"]]
        if min(float(np.abs(a).min()) for a in pre) > 1e-3:
            return Sample(inputs={"coordinate": x, "hyper_in": z}, params=p,
                          config={"num_layers": 3, "hyper_num_layers": hyper_num_layers})
    raise AssertionError("no kink-free sample found")


@pytest.mark.parametrize("hyper_num_layers", [1, 2])
def test_pdeformer_inr_gradcheck(hyper_num_layers):
    from refattn.operators.pdeformer import pdeformer_inr_backward, pdeformer_inr_forward
    s = _inr_sample(14, hyper_num_layers)
    assert gradcheck(pdeformer_inr_forward, pdeformer_inr_backward, s).max_rel < 1e-6


def test_pdeformer_inr_against_explicit_loops_and_clamp():
    from refattn.operators.pdeformer import pdeformer_inr_backward, pdeformer_inr_forward
    s = _inr_sample(15)
    p, x, z = s.params, s.inputs["coordinate"], s.inputs["hyper_in"]

    def mlp(kind, lyr, v):
        h = np.maximum(v @ p[f"{kind}_hypernets.{lyr}.net.0.weight"] + p[f"{kind}_hypernets.{lyr}.net.0.bias"], 0)
        return h @ p[f"{kind}_hypernets.{lyr}.net.2.weight"] + p[f"{kind}_hypernets.{lyr}.net.2.bias"]

    for scale_x, cl in ((1.0, 256.0), (50.0, 3.0)):
        want = np.zeros((2, 3, 2))
        for b in range(2):
            for n in range(3):
                h = 1.0
                for lyr in range(2):
                    a = x[b, n] * scale_x @ p[f"inr.affines.{lyr}.weight"] + p[f"inr.affines.{lyr}.bias"]
                    m = (1 + mlp("scale", lyr, z[lyr, b])) * ((h * a) @ p[f"inr.dense_layers.{lyr}.weight"]
                                                             + p[f"inr.dense_layers.{lyr}.bias"]) + mlp("shift", lyr, z[lyr, b])
                    h = np.clip(np.where(m > 0, m, 0.2 * m), -cl, cl)
                want[b, n] = h @ p["inr.last_layer.weight"] + p["inr.last_layer.bias"]
        out, c = pdeformer_inr_forward(x * scale_x, z, p, num_layers=3, hyper_num_layers=2, clamp=cl)
        assert np.allclose(out, want, atol=1e-12)
    # with the clamp active, clamped units pass no gradient
    assert not c["layers"][1]["live"].all()
    g = pdeformer_inr_backward(np.ones_like(out), c)
    assert np.all(np.isfinite(g["coordinate"]))


def test_pdeformer_inr_bad_input():
    from refattn.operators.pdeformer import pdeformer_inr_forward
    s = _inr_sample(16)
    x, z, p = s.inputs["coordinate"], s.inputs["hyper_in"], s.params
    with pytest.raises(ValueError, match="hyper_in"):
        pdeformer_inr_forward(x, z[:1], p, num_layers=3, hyper_num_layers=2)
    with pytest.raises(ValueError, match="num_layers"):
        pdeformer_inr_forward(x, z, p, num_layers=1, hyper_num_layers=2)
    with pytest.raises(ValueError, match="inr.affines.0.weight"):
        pdeformer_inr_forward(x[..., :1], z, p, num_layers=3, hyper_num_layers=2)
    with pytest.raises(ValueError, match="negative_slope"):
        pdeformer_inr_forward(x, z, p, num_layers=3, hyper_num_layers=2, negative_slope=1.5)
    with pytest.raises(ValueError, match="scale_hypernets"):
        pdeformer_inr_forward(x, z, {k: v for k, v in p.items() if k != "scale_hypernets.1.net.2.bias"},
                              num_layers=3, hyper_num_layers=2)


def test_pdeformer_inr_is_mesh_free():
    # The decoder is a field: the value at a query point does not depend on which other points are
    # queried with it, so two different point clouds agree (to round-off) at their shared points.
    from refattn.operators.pdeformer import pdeformer_inr_forward
    s = _inr_sample(17)
    rng = np.random.default_rng(18)
    x, z, p = s.inputs["coordinate"], s.inputs["hyper_in"], s.params
    cloud = np.concatenate([x, rng.standard_normal((2, 40, 2))], axis=1)[:, rng.permutation(43)]
    out_small = pdeformer_inr_forward(x, z, p, num_layers=3, hyper_num_layers=2)[0]
    out_big = pdeformer_inr_forward(cloud, z, p, num_layers=3, hyper_num_layers=2)[0]
    for b in range(2):
        for n in range(3):
            j = int(np.flatnonzero((cloud[b] == x[b, n]).all(axis=1))[0])
            assert np.allclose(out_big[b, j], out_small[b, n], rtol=0, atol=1e-13)
