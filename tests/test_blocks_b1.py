"""Norms, activations, layer variants and initialisation (issue 16, slice b1): what the generated
registry tests cannot express.

* torch parity: every mechanism against a float64 PyTorch transcription of its upstream formula,
  forward and every gradient through autograd (skipped without torch);
* statistical tests of the Magneto initialisation (variance, kurtosis, power to detect a wrong
  gain) and the LayerScale init rule;
* finite differences over every variant/option the single registry sample does not reach;
* B-cos: the MaxOut selection and the explanation map, the conv form on unfolded patches;
* LayerScale composed with other token mixers (Diff attention, the GLU FFN of [1-44], a user pair).
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from refattn.blocks import (
    GLU_VARIANTS,
    MAGNETO_SCALED,
    bcos_backward,
    bcos_dynamic_weights,
    bcos_forward,
    dra_backward,
    dra_forward,
    dynamic_tanh_backward,
    dynamic_tanh_forward,
    equiformer_attention_weights_backward,
    equiformer_attention_weights_forward,
    glu_ffn_backward,
    glu_ffn_forward,
    layerscale_block_backward,
    layerscale_block_forward,
    magneto_gain,
    magneto_init,
    magneto_layer_backward,
    magneto_layer_forward,
    polycom_backward,
    polycom_forward,
    separable_layer_norm_backward,
    separable_layer_norm_forward,
)
from refattn.blocks import equiformer_norm as eq_mod
from refattn.blocks import layerscale as ls_mod
from refattn.blocks import magneto as mag_mod
from refattn.registry import Sample
from refattn.testing import directional_check, gradcheck

# Modules whose name is also their main function's: the package attribute is the function
# (``from refattn.blocks import bcos`` gives the function), so take the module itself.
bcos_mod = importlib.import_module("refattn.blocks.bcos")
glu_mod = importlib.import_module("refattn.blocks.glu_ffn")

# --------------------------------------------------------------------------------------------
# torch parity: our forward/backward vs autograd on a torch transcription of the upstream formula


def _torch_parity(forward, backward, torch_fn, inputs, params, config, *, rtol=1e-12):
    torch = pytest.importorskip("torch")
    tin = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in inputs.items()}
    tpar = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in params.items()}
    ty = torch_fn(**tin, params=tpar, **config)
    g = np.random.default_rng(99).standard_normal(tuple(ty.shape))
    ty.backward(torch.tensor(g))
    y, cache = forward(**inputs, params=params, **config)
    grads = backward(g, cache)
    theirs = {"out": ty.detach().numpy(), **{k: t.grad.numpy() for k, t in {**tin, **tpar}.items()}}
    ours = {"out": y, **grads}
    assert set(ours) == set(theirs), set(ours) ^ set(theirs)
    for k in theirs:
        scale = max(float(np.abs(theirs[k]).max()), 1e-300)
        err = float(np.abs(ours[k] - theirs[k]).max()) / scale
        assert err < rtol or float(np.abs(ours[k] - theirs[k]).max()) < 1e-13, f"{k}: rel err {err}"


def _t_dyt(x, params, channels_last=True):
    import torch

    t = torch.tanh(params["alpha"] * x)
    w, b = params["weight"], params["bias"]
    if not channels_last:
        w, b = w[:, None, None], b[:, None, None]
    return t * w + b


@pytest.mark.parametrize("channels_last", [True, False])
def test_dyt_matches_torch(channels_last):
    rng = np.random.default_rng(0)
    x = 2 * rng.standard_normal((2, 5, 4, 3) if channels_last else (2, 3, 5, 4))
    p = {"alpha": np.array([0.7]), "weight": rng.standard_normal(3), "bias": rng.standard_normal(3)}
    _torch_parity(dynamic_tanh_forward, dynamic_tanh_backward, _t_dyt, {"x": x}, p, {"channels_last": channels_last})


def _t_glu(x, params, variant):
    import torch
    import torch.nn.functional as F

    act = {"glu": torch.sigmoid, "bilinear": lambda a: a, "reglu": F.relu, "geglu": F.gelu, "swiglu": F.silu}[variant]
    a = x @ params["gate_proj.weight"] + params["gate_proj.bias"]
    v = x @ params["up_proj.weight"] + params["up_proj.bias"]
    return (act(a) * v) @ params["down_proj.weight"] + params["down_proj.bias"]


@pytest.mark.parametrize("variant", GLU_VARIANTS)
def test_glu_ffn_matches_torch(variant):
    rng = np.random.default_rng(1)
    p = glu_mod._params(rng, 5, 7)
    _torch_parity(glu_ffn_forward, glu_ffn_backward, _t_glu, {"x": rng.standard_normal((2, 4, 5))}, p,
                  {"variant": variant})


def _t_polycom(x, params, kind):
    import torch

    w, b = params["weight"], params["bias"]
    if kind == "polyrelu":
        r = torch.relu(x)
        return w[0] * r**3 + w[1] * r**2 + w[2] * r + b

    def n(z):
        return z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + 1e-6)

    return w[0] * n(x**3) + w[1] * n(x**2) + w[2] * n(x) + b


@pytest.mark.parametrize("kind", ["polynorm", "polyrelu"])
def test_polycom_matches_torch(kind):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 4, 6))
    p = {"weight": rng.standard_normal(3), "bias": rng.standard_normal(1)}
    _torch_parity(polycom_forward, polycom_backward, _t_polycom, {"x": x}, p, {"kind": kind})


def _t_dra(x, params):
    import torch

    a, b, c, d = (params[k] for k in "abcd")
    return x + b * torch.sin(a * x) ** 2 / a + c * torch.cos(a * x) + d * torch.tanh(b * x)


def test_dra_matches_torch():
    rng = np.random.default_rng(3)
    p = {k: rng.standard_normal(1) for k in "abcd"}
    _torch_parity(dra_forward, dra_backward, _t_dra, {"x": 2 * rng.standard_normal((3, 5))}, p, {})


def _t_bcos(x, params, max_out, b=None):

    w = params["linear.weight"]
    lin = x @ (w / w.norm(dim=0))
    lin = lin.reshape(lin.shape[:-1] + (-1, max_out)).max(dim=-1).values
    norm = ((x**2).sum(-1, keepdim=True) + 1e-6).sqrt()
    s = x.shape[-1] ** 0.5 / 100.0
    if "b" in params:
        return lin * ((lin / norm).abs() + 1e-6) ** (params["b"] - 1) / s
    return lin * lin.abs() / (norm * s)


@pytest.mark.parametrize("learn_b", [False, True])
@pytest.mark.parametrize("max_out", [1, 2])
def test_bcos_matches_torch(learn_b, max_out):
    rng = np.random.default_rng(4)
    x, w = bcos_mod._draw(rng, (2, 3), 5, 3, max_out)
    p = {"linear.weight": w, **({"b": np.array([2.4])} if learn_b else {})}
    _torch_parity(bcos_forward, bcos_backward, _t_bcos, {"x": x}, p, {"max_out": max_out})


def _t_sln(x, params):
    # layer_norm_sh with the balanced component mean (upstream defaults), written degree by degree.
    import torch
    import torch.nn.functional as F

    lmax = int(round(x.shape[-2] ** 0.5)) - 1
    out = [F.layer_norm(x[..., :1, :], (x.shape[-1],), params["norm_l0.weight"], params["norm_l0.bias"], 1e-5)]
    tot = 0
    for l in range(1, lmax + 1):
        tot = tot + x[..., l * l:(l + 1) ** 2, :].pow(2).sum(-2, keepdim=True) / ((2 * l + 1) * lmax)
    r = (tot.mean(-1, keepdim=True) + 1e-5).rsqrt()
    for l in range(1, lmax + 1):
        out.append(x[..., l * l:(l + 1) ** 2, :] * r * params["affine_weight"][l - 1])
    return torch.cat(out, dim=-2)


def test_separable_layer_norm_matches_torch():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 16, 4))
    p = eq_mod._norm_params(rng, 3, 4, "layer_norm_sh")
    _torch_parity(separable_layer_norm_forward, separable_layer_norm_backward, _t_sln, {"x": x}, p, {})


def _t_eq_attention(x_alpha, params):
    import torch
    import torch.nn.functional as F

    z = F.layer_norm(x_alpha, (x_alpha.shape[-1],), params["alpha_norm.weight"], params["alpha_norm.bias"], 1e-5)
    z = 0.6 * z + 0.4 * z * (2 * torch.sigmoid(z) - 1)
    return torch.softmax((z * params["alpha_dot"]).sum(-1), dim=-2)


def test_equiformer_attention_weights_match_torch():
    s = eq_mod._sample_attention(np.random.default_rng(6), "small")
    _torch_parity(equiformer_attention_weights_forward, equiformer_attention_weights_backward, _t_eq_attention,
                  s.inputs, s.params, {})


def _t_magneto(x, params, num_heads, is_causal):
    import torch.nn.functional as F

    def ln(z, k):
        return F.layer_norm(z, (z.shape[-1],), params[f"{k}.weight"], params[f"{k}.bias"], 1e-5)

    def lin(z, k):
        return z @ params[f"{k}.weight"] + params[f"{k}.bias"]

    b, n, c = x.shape
    h = ln(x, "self_attn_layer_norm")
    q, k, v = (lin(h, f"self_attn.{m}_proj").reshape(b, n, num_heads, -1).transpose(1, 2) for m in "qkv")
    o = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal).transpose(1, 2).reshape(b, n, c)
    u = x + lin(ln(o, "self_attn.inner_attn_ln"), "self_attn.out_proj")
    return u + lin(ln(F.gelu(lin(ln(u, "final_layer_norm"), "ffn.fc1")), "ffn.ffn_layernorm"), "ffn.fc2")


@pytest.mark.parametrize("is_causal", [False, True])
def test_magneto_layer_matches_torch(is_causal):
    rng = np.random.default_rng(7)
    p = magneto_init(rng, 8, 12, gain=magneto_gain(6), scheme="torchscale")
    p = {k: v + 0.1 * rng.standard_normal(v.shape) for k, v in p.items()}
    _torch_parity(magneto_layer_forward, magneto_layer_backward, _t_magneto, {"x": rng.standard_normal((2, 5, 8))}, p,
                  {"num_heads": 2, "is_causal": is_causal})


def _t_layerscale(x, params, num_heads):
    import torch.nn.functional as F

    def ln(z, k):
        return F.layer_norm(z, (z.shape[-1],), params[f"{k}.weight"], params[f"{k}.bias"], 1e-6)

    b, n, c = x.shape
    h = ln(x, "norm1")
    q, k, v = ((h @ params[f"attn.{m}_proj"] + params[f"attn.{m}_proj_bias"]).reshape(b, n, num_heads, -1).transpose(1, 2)
               for m in "qkv")
    o = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, n, c)
    u = x + params["gamma_1"] * (o @ params["attn.out_proj"] + params["attn.out_proj_bias"])
    m = F.gelu(ln(u, "norm2") @ params["mlp.fc1.weight"] + params["mlp.fc1.bias"])
    return u + params["gamma_2"] * (m @ params["mlp.fc2.weight"] + params["mlp.fc2.bias"])


def test_layerscale_block_matches_torch():
    rng = np.random.default_rng(8)
    p, acfg = ls_mod._params(rng, 8, 12, "multi_head_attention", 2)

    def fwd(x, params, **cfg):
        return layerscale_block_forward(x, params, attention_config=acfg, **cfg)

    _torch_parity(fwd, layerscale_block_backward, lambda x, params: _t_layerscale(x, params, 2),
                  {"x": rng.standard_normal((2, 5, 8))}, p, {})


# --------------------------------------------------------------------------------------------
# Magneto and LayerScale initialisation: statistics


def test_magneto_init_variances_at_scale():
    # Large matrices: every weight (and torchscale's biases) within 4 standard errors of the stated
    # variance, and the kurtosis separates the normal (3) from the uniform (9/5) scheme.
    c, f, depth = 256, 1024, 24
    gain = magneto_gain(depth)
    for scheme, kurt in (("paper", 3.0), ("torchscale", 1.8)):
        p = magneto_init(np.random.default_rng(2024), c, f, gain=gain, scheme=scheme)
        for name in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj", "ffn.fc1", "ffn.fc2"):
            w = p[f"{name}.weight"]
            g = gain if name in MAGNETO_SCALED else 1.0
            var = g * g * (2.0 / sum(w.shape) if scheme == "paper" else 1.0 / (3.0 * w.shape[0]))
            assert mag_mod._variance_z(w, var, kurt) < 4.0, (scheme, name)
            k4 = float(np.mean(w**4) / np.mean(w**2) ** 2)
            assert abs(k4 - kurt) < 0.1, (scheme, name, k4)
            assert abs(float(w.mean())) < 4 * np.sqrt(var / w.size), (scheme, name)
            if scheme == "torchscale":
                assert mag_mod._variance_z(p[f"{name}.bias"], var, kurt) < 4.0, (scheme, name)
            else:
                assert not np.any(p[f"{name}.bias"]), (scheme, name)
        for ln in ("self_attn_layer_norm", "self_attn.inner_attn_ln", "final_layer_norm", "ffn.ffn_layernorm"):
            assert np.all(p[f"{ln}.weight"] == 1) and not np.any(p[f"{ln}.bias"])


def test_magneto_variance_test_detects_a_wrong_gain():
    # The test has power: weights drawn with a gain 5 % too large are rejected.
    c, f = 256, 1024
    gain = magneto_gain(12)
    p = magneto_init(np.random.default_rng(5), c, f, gain=1.05 * gain)
    w = p["ffn.fc1.weight"]
    assert mag_mod._variance_z(w, gain * gain * 2.0 / (c + f), 3.0) > 5.0


def test_magneto_gain_by_architecture():
    assert magneto_gain(6) == pytest.approx(np.sqrt(np.log(12)), abs=1e-15)
    # Encoder-decoder: the encoder gain depends on both depths, the decoder gain on M only.
    assert magneto_gain(6, decoder_layers=4, part="encoder") == pytest.approx(np.sqrt(np.log(12) * np.log(12) / 3))
    assert magneto_gain(20, decoder_layers=4, part="decoder") == magneto_gain(6, decoder_layers=4, part="decoder")
    with pytest.raises(ValueError, match="num_layers"):
        magneto_gain(0)
    with pytest.raises(ValueError, match="scheme"):
        magneto_init(np.random.default_rng(0), 4, 4, gain=1.0, scheme="xavier")


def test_layerscale_init_value_rule():
    from refattn.blocks import layerscale_init_value

    assert [layerscale_init_value(d) for d in (12, 18, 24, 36)] == [0.1, 0.1, 1e-5, 1e-6]
    with pytest.raises(TypeError, match="depth"):
        layerscale_init_value(2.5)


# --------------------------------------------------------------------------------------------
# Finite differences over the options one registry sample does not reach


@pytest.mark.parametrize("variant", GLU_VARIANTS)
def test_glu_ffn_gradcheck_every_variant(variant):
    rng = np.random.default_rng(10)
    for _ in range(5):
        s = glu_mod._sample(rng, "tiny")
        if s.config["variant"] == "reglu" or variant != "reglu":
            break
    cfg = dict(s.config, variant=variant)
    if variant == "reglu" and s.config["variant"] != "reglu":
        pytest.skip("no kink-free ReGLU draw")
    assert gradcheck(glu_ffn_forward, glu_ffn_backward, Sample(s.inputs, s.params, cfg)).passed


@pytest.mark.parametrize("norm_type", eq_mod.SLN_NORM_TYPES)
@pytest.mark.parametrize("normalization,balance", [("component", True), ("component", False), ("norm", False)])
def test_separable_layer_norm_gradcheck_every_option(norm_type, normalization, balance):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((2, 9, 2))
    s = Sample({"x": x}, eq_mod._norm_params(rng, 2, 2, norm_type),
               {"norm_type": norm_type, "normalization": normalization, "std_balance_degrees": balance})
    assert gradcheck(separable_layer_norm_forward, separable_layer_norm_backward, s).passed


@pytest.mark.parametrize("learn_b", [False, True])
@pytest.mark.parametrize("max_out", [1, 2, 3])
def test_bcos_gradcheck(learn_b, max_out):
    rng = np.random.default_rng(12)
    x, w = bcos_mod._draw(rng, (2, 2), 3, 2, max_out)
    p = {"linear.weight": w, **({"b": np.array([1.7])} if learn_b else {})}
    cfg = {"max_out": max_out, **({} if learn_b else {"b": 2.5})}
    rep = gradcheck(bcos_forward, bcos_backward, Sample({"x": x}, p, cfg))
    assert rep.passed and (("b" in [r[0] for r in rep.rows]) == learn_b)


def test_dyt_without_bias_and_polyrelu_gradcheck():
    rng = np.random.default_rng(13)
    s = Sample({"x": rng.standard_normal((2, 3, 4))}, {"alpha": np.array([0.9]), "weight": rng.standard_normal(4)})
    y, cache = dynamic_tanh_forward(**s.inputs, params=s.params)
    assert set(dynamic_tanh_backward(np.ones_like(y), cache)) == {"x", "alpha", "weight"}
    assert gradcheck(dynamic_tanh_forward, dynamic_tanh_backward, s).passed
    x = rng.standard_normal((2, 3, 4))
    x = np.sign(x) * (0.1 + np.abs(x))
    s = Sample({"x": x}, {"weight": rng.standard_normal(3), "bias": rng.standard_normal(1)}, {"kind": "polyrelu"})
    assert gradcheck(polycom_forward, polycom_backward, s).passed


# --------------------------------------------------------------------------------------------
# B-cos: selection, explanation map, conv form


def test_bcos_maxout_selection_and_gradient_routing():
    # Only the selected unit of each MaxOut group receives weight gradient from that input.
    rng = np.random.default_rng(14)
    x, w = bcos_mod._draw(rng, (1, 1), 4, 3, 2)
    y, cache = bcos_forward(x, {"linear.weight": w}, max_out=2)
    g = bcos_backward(np.ones_like(y), cache)["linear.weight"]
    resp = (x @ (w / np.linalg.norm(w, axis=0)))[0, 0]
    for u in range(3):
        win = 2 * u + int(resp[2 * u + 1] > resp[2 * u])
        lose = 2 * u + 1 - (win - 2 * u)
        assert np.abs(g[:, win]).max() > 0 and np.abs(g[:, lose]).max() == 0


def test_bcos_explanation_map_and_conv_form():
    # bcos_dynamic_weights gives y = W(x)^T x; a 3x3 BcosConv2d is the transform on unfolded
    # (C, kh, kw)-ordered zero-padded patches: check one output pixel by hand.
    rng = np.random.default_rng(15)
    img = rng.standard_normal((1, 2, 5, 5))
    w_conv = rng.standard_normal((3 * 2, 2, 3, 3))
    pad = np.pad(img, ((0, 0), (0, 0), (1, 1), (1, 1)))
    patch = pad[0, :, 1:4, 2:5].reshape(1, -1)  # output pixel (1, 2)
    p = {"linear.weight": w_conv.reshape(6, -1).T}
    y = bcos_forward(patch, p, max_out=2)[0]
    wn = w_conv.reshape(6, -1) / np.linalg.norm(w_conv.reshape(6, -1), axis=1, keepdims=True)
    lin = (wn @ patch[0]).reshape(3, 2).max(axis=1)
    norm = np.sqrt((patch**2).sum() + 1e-6)
    np.testing.assert_allclose(y[0], lin * np.abs(lin) / (norm * np.sqrt(18) / 100), rtol=1e-13)
    wx = bcos_dynamic_weights(patch, p, max_out=2)
    np.testing.assert_allclose(np.einsum("nd,ndu->nu", patch, wx), y, rtol=1e-13)


def test_bcos_rejects_b_given_twice():
    x, w = bcos_mod._draw(np.random.default_rng(16), (1, 2), 3, 2, 1)
    with pytest.raises(ValueError, match="b"):
        bcos_forward(x, {"linear.weight": w, "b": np.array([2.0])}, b=2.0, max_out=1)


# --------------------------------------------------------------------------------------------
# LayerScale with other token mixers (the backward chains through whatever is given)


def _glu_mixer_params(rng, c, f):
    return {f"attn.{k}": v for k, v in glu_mod._params(rng, c, f).items()}


def _tanh_mixer_forward(x, params):
    """A user token mixer that is not attention: y = tanh(x W)."""
    y = np.tanh(x @ params["weight"])
    return y, (x, params["weight"], y)


def _tanh_mixer_backward(dy, cache):
    x, w, y = cache
    da = dy * (1.0 - y * y)
    return {"x": da @ w.T, "weight": x.reshape(-1, x.shape[-1]).T @ da.reshape(-1, da.shape[-1])}


@pytest.mark.parametrize("mixer", ["diff_attention_v1", "glu_swiglu_ffn", "pair"])
def test_layerscale_with_other_mixers(mixer):
    rng = np.random.default_rng(17)
    if mixer == "diff_attention_v1":
        s = ls_mod._sample(rng, "tiny", "diff_attention_v1")
    else:
        p, _ = ls_mod._params(rng, 3, 3)
        p = {k: v for k, v in p.items() if not k.startswith("attn.")}
        if mixer == "glu_swiglu_ffn":
            # [1-44]'s GLU-MLP in the attention slot (the channel-mixing reading).
            p.update(_glu_mixer_params(rng, 3, 2))
            cfg = {"attention": "glu_swiglu_ffn", "attention_config": {"variant": "swiglu"}}
        else:
            p["attn.weight"] = rng.standard_normal((3, 3))
            cfg = {"attention": (_tanh_mixer_forward, _tanh_mixer_backward)}
        s = Sample({"x": rng.standard_normal((2, 3, 3))}, p, cfg)
    rep = gradcheck(layerscale_block_forward, layerscale_block_backward, s)
    assert rep.passed
    assert any(r[0].startswith("attn.") for r in rep.rows)
    assert directional_check(layerscale_block_forward, layerscale_block_backward, s).passed
