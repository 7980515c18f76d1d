"""Mechanism-specific tests of the relatives of differential attention (refattn/attention/differential/:
shaped, momentum, pct, reflexsplit, mala, mta).

Generic checks (FD gradcheck, directional, dtype, bad input, inputs-never-modified, properties)
are generated from the registry; here: every record's own checks, PyTorch-autograd parity with
transcriptions of the upstream forwards, and edge cases.
"""

from __future__ import annotations

import numpy as np
import pytest

from refattn import registry
from refattn.attention import differential as D
from refattn.attention.differential import mta as MTA
from refattn.attention.differential import pct as PCT
from refattn.attention.differential import reflexsplit as REFLEX
from refattn.testing import run_record_checks

SLUGS = ["shaped_attention", "momentum_attention", "pct_offset_attention", "reflexsplit_dual_stream_attention",
         "mala_linear_attention", "multi_token_attention"]


@pytest.mark.parametrize("slug", SLUGS)
def test_record_checks_pass(slug):
    rec = registry.get(slug)
    assert rec.implemented and rec.family == "2-differential" and rec.tier == "T1"
    res = run_record_checks(rec)
    bad = [(r.check, r.message) for r in res.results if not r.passed]
    assert not bad, bad


def test_dydila_is_not_registered_as_implemented():
    # OpAmp is implemented (attention/differential/opamp.py); DyDiLA's method section and code were
    # not reachable, so its record stays unimplemented until they are.
    assert registry.get("opamp_attention").implemented
    assert not registry.get("dydila_differential_linear_attention").implemented


# ------------------------------------------------------------------------------ torch parity


def _torch():
    return pytest.importorskip("torch")


def _grads_vs_torch(fwd_np, bwd_np, torch_fn, arrays, config, rng, atol=1e-9):
    torch = _torch()
    out, cache = fwd_np(**arrays["inputs"], params=arrays["params"], **config) if arrays.get("params") is not None \
        else fwd_np(**arrays["inputs"], **config)
    g = rng.standard_normal(out.shape)
    grads = bwd_np(g, cache)
    tens = {k: torch.tensor(v, requires_grad=True) for k, v in
            {**arrays["inputs"], **(arrays.get("params") or {})}.items()}
    out_t = torch_fn(tens)
    assert np.allclose(out_t.detach().numpy(), out, atol=atol, rtol=1e-9)
    (out_t * torch.tensor(g)).sum().backward()
    for k, t in tens.items():
        assert np.allclose(t.grad.numpy(), grads[k], atol=atol, rtol=1e-7), k


def test_shaped_attention_matches_torch_transcription():
    torch = _torch()
    rng = np.random.default_rng(0)
    b, h, n, d = 2, 3, 5, 4
    inputs = {x: rng.standard_normal((b, h, n, d)) for x in "qkv"}
    params = {k: rng.standard_normal(h) for k in ("attn_mat_resid_gain", "attn_mat_skip_gain", "centre_attn_gain")}

    def tfn(t):
        # myGPT2Attention._attn: divide by sqrt(dv), finfo.min causal mask, resid*softmax + skip*I - centre*C
        w = t["q"] @ t["k"].transpose(-1, -2) / d**0.5
        causal = torch.tril(torch.ones(n, n, dtype=torch.bool))
        w = torch.where(causal, w, torch.tensor(torch.finfo(w.dtype).min, dtype=w.dtype))
        w = torch.softmax(w, -1)
        uni = torch.tril(torch.ones(n, n, dtype=w.dtype) / torch.arange(1, n + 1, dtype=w.dtype).view(-1, 1))
        g = lambda x: x.view(1, h, 1, 1)  # noqa: E731
        a = g(t["attn_mat_resid_gain"]) * w + g(t["attn_mat_skip_gain"]) * torch.eye(n, dtype=w.dtype) \
            - g(t["centre_attn_gain"]) * uni
        return a @ t["v"]

    _grads_vs_torch(D.shaped_attention_forward, D.shaped_attention_backward, tfn,
                    {"inputs": inputs, "params": params}, {}, rng)


def test_momentum_attention_matches_torch():
    torch = _torch()
    rng = np.random.default_rng(1)
    b, h, n, d = 2, 2, 6, 3
    inputs = {x: rng.standard_normal((b, h, n, d)) for x in "qkv"}
    for boundary in ("zero_velocity", "zero"):
        params = {"gamma": rng.standard_normal(h)}

        def tfn(t, boundary=boundary):
            def shear(x):
                first = x[..., :1, :] if boundary == "zero_velocity" else torch.zeros_like(x[..., :1, :])
                prev = torch.cat([first, x[..., :-1, :]], -2)
                return x + t["gamma"].view(1, h, 1, 1) * (x - prev)
            return torch.nn.functional.scaled_dot_product_attention(shear(t["q"]), shear(t["k"]), t["v"],
                                                                    is_causal=True)

        _grads_vs_torch(D.momentum_attention_forward, D.momentum_attention_backward, tfn,
                        {"inputs": inputs, "params": params}, {"boundary": boundary}, rng)


def test_pct_offset_attention_matches_torch_port_in_train_mode():
    torch = _torch()
    rng = np.random.default_rng(2)
    b, n, c = 3, 7, 8
    inputs = {"x": rng.standard_normal((b, n, c))}
    params = PCT._pct_params(rng, c, c // 4)

    def tfn(t):
        # PCT_Pytorch SA_Layer, channels-first, tied q/k conv, BatchNorm1d in training mode
        x = t["x"].transpose(1, 2)
        conv = lambda w, y: torch.einsum("io,bin->bon", w, y)  # noqa: E731  (weights are (in, out))
        x_q = conv(t["k_conv.weight"], x).permute(0, 2, 1)
        x_k = conv(t["k_conv.weight"], x)
        x_v = conv(t["v_conv.weight"], x) + t["v_conv.bias"].view(1, -1, 1)
        att = torch.softmax(torch.bmm(x_q, x_k), -1)
        att = att / (1e-9 + att.sum(dim=1, keepdim=True))
        x_r = torch.bmm(x_v, att)
        tr = conv(t["trans_conv.weight"], x - x_r) + t["trans_conv.bias"].view(1, -1, 1)
        bn = torch.nn.functional.batch_norm(tr, None, None, t["after_norm.weight"], t["after_norm.bias"],
                                            training=True, eps=1e-5)
        return (x + torch.relu(bn)).transpose(1, 2)

    _grads_vs_torch(D.pct_offset_attention_forward, D.pct_offset_attention_backward, tfn,
                    {"inputs": inputs, "params": params}, {"bn_mode": "train"}, rng)


@pytest.mark.parametrize("branch", ["sa", "ca"])
def test_reflexsplit_matches_torch_transcription(branch):
    torch = _torch()
    rng = np.random.default_rng(3)
    wh, ww, c, nh = 2, 3, 8, 2
    n, hd = wh * ww, c // nh
    inputs = {"x": rng.standard_normal((2, 2, n, c))}
    params = REFLEX._reflex_params(rng, c, nh, wh, ww, branch)
    idx = torch.tensor(D.swin_relative_position_index((wh, ww)))

    def tfn(t):
        x_t, x_r = t["x"][:, 0], t["x"][:, 1]
        beta = t[f"{branch}_enhance_weight"]
        te = x_t + beta * (x_r @ t[f"{branch}_cross_refl_proj.weight"])
        re = x_r + beta * (x_t @ t[f"{branch}_cross_trans_proj.weight"])
        heads = lambda y: y.reshape(2, n, nh, hd).permute(0, 2, 1, 3)  # noqa: E731
        if branch == "sa":
            qkv = [y @ t["sa_qkv.weight"] + t["sa_qkv.bias"] for y in (te, re)]
            q = [heads(y[..., :c]) for y in qkv]
            k = [heads(y[..., c:2 * c]) for y in qkv]
            v = [heads(y[..., 2 * c:]) for y in qkv]
        else:
            q = [heads(y @ t["ca_q.weight"] + t["ca_q.bias"]) for y in (te, re)]
            kv = torch.cat([te, re], -2) @ t["ca_kv.weight"] + t["ca_kv.bias"]
            k = [heads(kv[:, :n, :c]), heads(kv[:, n:, :c])]
            v = [heads(kv[:, :n, c:]), heads(kv[:, n:, c:])]
        bias = t["relative_position_bias_table"][idx.view(-1)].view(n, n, -1).permute(2, 0, 1)
        a = [torch.softmax((qq * hd**-0.5) @ kk.transpose(-2, -1) + bias, -1) for qq, kk in zip(q, k)]
        lam = torch.clamp(torch.sigmoid(t[f"lambda_{branch}"]), 0.01, 0.99)
        outs = []
        for me, other in ((0, 1), (1, 0)):
            o = ((a[me] - lam * a[other]) @ v[me]).transpose(1, 2).reshape(2, n, c)
            outs.append(o @ t[f"proj_{branch}.weight"] + t[f"proj_{branch}.bias"])
        return torch.stack(outs, 1)

    _grads_vs_torch(D.reflexsplit_dual_stream_attention_forward, D.reflexsplit_dual_stream_attention_backward, tfn,
                    {"inputs": inputs, "params": params},
                    {"num_heads": nh, "window_size": (wh, ww), "branch": branch}, rng)


def test_mala_matches_torch_transcription_with_rope():
    torch = _torch()
    rng = np.random.default_rng(4)
    hgt, wid, d = 2, 3, 8
    inputs = {x: rng.standard_normal((2, 2, hgt * wid, d)) for x in "qkv"}
    sin, cos = D.mala_rope_tables(hgt, wid, d)
    st, ct = torch.tensor(sin), torch.tensor(cos)

    def tfn(t):
        # AddLinearAttention.forward between the qkv split and the LePE / gate / projection
        def rot(x):
            return torch.stack([-x[..., 1::2], x[..., ::2]], -1).flatten(-2)
        scale = d**-0.5
        q = torch.nn.functional.elu(t["q"]) + 1
        k = torch.nn.functional.elu(t["k"]) + 1
        v = t["v"]
        z = q @ k.mean(dim=-2, keepdim=True).transpose(-2, -1) * scale
        q = q * ct + rot(q) * st
        k = k * ct + rot(k) * st
        nn_ = hgt * wid
        kv = (k.transpose(-2, -1) * (scale / nn_) ** 0.5) @ (v * (scale / nn_) ** 0.5)
        return q @ kv * (1 + 1 / (z + 1e-6)) - z * v.mean(dim=2, keepdim=True)

    _grads_vs_torch(D.mala_linear_attention_forward, D.mala_linear_attention_backward, tfn,
                    {"inputs": inputs}, {"sin": sin, "cos": cos}, rng)


def test_mala_rope_tables_follow_upstream_layout():
    sin, cos = D.mala_rope_tables(2, 3, 8)
    angle = np.repeat(1 / 10000 ** np.linspace(0, 1, 2), 2)
    # token (row 1, col 2): first half rotates with the row index, second with the column index
    assert np.allclose(sin[1 * 3 + 2], np.sin(np.concatenate([1 * angle, 2 * angle])))
    assert np.allclose(cos[0], 1.0)


@pytest.mark.parametrize("pad_key", ["both", "left", "right"])
def test_multi_token_attention_matches_torch_transcription(pad_key):
    torch = _torch()
    rng = np.random.default_rng(5)
    b, h, n, d = 2, 4, 6, 3
    inputs = {x: rng.standard_normal((b, h, n, d)) for x in "qkv"}
    cq, ck = 2, 3
    params = {"mta_kernel": 0.5 * rng.standard_normal((h, 1, cq, ck)),
              "wpsm": np.eye(h) + 0.3 * rng.standard_normal((h, h)),
              "mta_kernel_after_sm": 0.5 * rng.standard_normal((h, 1, cq, ck)),
              "head_kernel": np.eye(2)[None].repeat(2, 0) + 0.3 * rng.standard_normal((2, 2, 2)),
              "subln.weight": 1 + 0.1 * rng.standard_normal(d),
              "gate.weight": rng.standard_normal((d, 1)), "gate.bias": rng.standard_normal(1)}
    pads = {"both": (1, 1), "left": (2, 0), "right": (0, 2)}[pad_key]
    lid = 2

    def tfn(t):
        # Attention.forward (use_mta, not triton) with _mta_convolution and _head_convolution
        mask = torch.triu(torch.full((n, n), float("-inf"), dtype=torch.float64), diagonal=1)

        def conv(s, kern):
            s = torch.where(mask == float("-inf"), torch.zeros_like(s), s)
            sp = torch.nn.functional.pad(s, (pads[0], pads[1], cq - 1, 0))
            return torch.nn.functional.conv2d(sp, kern, groups=h)

        s = t["q"] @ t["k"].transpose(2, 3) / d**0.5
        s = conv(s, t["mta_kernel"])
        s = (s.transpose(1, -1) @ t["wpsm"]).transpose(1, -1)
        a = torch.softmax(s + mask, -1)
        a = conv(a, t["mta_kernel_after_sm"])
        a = torch.where(mask == float("-inf"), torch.zeros_like(a), a)
        a5 = a.reshape(b, 2, 2, n, n)
        a = torch.stack([(a5[:, i].transpose(1, -1) @ t["head_kernel"][i]).transpose(1, -1) for i in range(2)], 1)
        o = a.reshape(b, h, n, n) @ t["v"]
        o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + 1e-5) * t["subln.weight"]
        o = o * (1 - (0.8 - 0.6 * np.exp(-0.3 * lid)))
        return o * torch.sigmoid(o @ t["gate.weight"] + t["gate.bias"])

    _grads_vs_torch(D.multi_token_attention_forward, D.multi_token_attention_backward, tfn,
                    {"inputs": inputs, "params": params},
                    {"pad_key": pad_key, "layer_norm_rescale": True, "layer_id": lid}, rng)


# ------------------------------------------------------------------------------ edge cases


def test_mta_without_params_is_causal_sdpa_and_masks_work():
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((2, 2, 5, 3)) for _ in range(3))
    keep = np.ones((5, 5), bool)
    keep[:, 1] = False
    out = D.multi_token_attention(q, k, v, None, attn_mask=keep, is_causal=False)
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(3)
    s = np.where(keep, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    assert np.allclose(out, (p / p.sum(-1, keepdims=True)) @ v, atol=1e-14)
    # a fully masked row is 0 with 0 gradient (upstream gives NaN there)
    keep2 = np.ones((5, 5), bool)
    keep2[2] = False
    params = {"mta_kernel": rng.standard_normal((2, 1, 2, 3))}
    out, cache = D.multi_token_attention_forward(q, k, v, params, attn_mask=keep2, is_causal=False)
    g = D.multi_token_attention_backward(np.ones_like(out), cache)
    assert np.all(out[..., 2, :] == 0) and all(np.isfinite(x).all() for x in g.values())


def test_bad_arguments_name_the_argument():
    rng = np.random.default_rng(7)
    q, k, v = (rng.standard_normal((2, 2, 4, 3)) for _ in range(3))
    with pytest.raises(ValueError, match="pad_key='both' needs an odd"):
        D.multi_token_attention(q, k, v, {"mta_kernel": np.zeros((2, 1, 2, 2))})
    with pytest.raises(ValueError, match="mta_kernel must have the Conv2d shape"):
        D.multi_token_attention(q, k, v, {"mta_kernel": np.zeros((3, 1, 2, 3))})
    with pytest.raises(ValueError, match="head_kernel' or 'wposm'"):
        D.multi_token_attention(q, k, v, {"head_kernel": np.zeros((1, 2, 2)), "wposm": np.eye(2)})
    with pytest.raises(ValueError, match="gamma must have shape"):
        D.momentum_attention(q, k, v, {"gamma": np.zeros(3)})
    with pytest.raises(ValueError, match="same length"):
        D.momentum_attention(q, k[..., :3, :], v[..., :3, :], {"gamma": np.asarray(0.1)})
    with pytest.raises(ValueError, match="M >= N"):
        D.shaped_attention(q, k[..., :3, :], v[..., :3, :],
                           {n: np.ones(2) for n in ("attn_mat_resid_gain", "attn_mat_skip_gain", "centre_attn_gain")})
    with pytest.raises(TypeError, match="q must be a floating-point"):
        D.mala_linear_attention(q.astype(int), k, v)
    with pytest.raises(ValueError, match="sin and cos must be given together"):
        D.mala_linear_attention(q, k, v, sin=np.zeros((4, 3)))
    x = rng.standard_normal((2, 2, 4, 4))
    s = REFLEX._sample_reflex(rng, "small")
    with pytest.raises(ValueError, match="window_size"):
        D.reflexsplit_dual_stream_attention(x, s.params, num_heads=2, window_size=(2, 3))
    with pytest.raises(ValueError, match="running_mean"):
        sp = PCT._sample_pct(rng, "tiny")
        D.pct_offset_attention(sp.inputs["x"], sp.params, bn_mode="eval")
    with pytest.raises(ValueError, match="transpose"):
        sp = PCT._sample_pct(rng, "tiny")
        bad = dict(sp.params, **{"v_conv.weight": np.zeros((4, 5))})
        D.pct_offset_attention(sp.inputs["x"], bad)


def test_reflexsplit_clamp_can_be_disabled_and_lambda_grad_flows():
    rng = np.random.default_rng(8)
    s = REFLEX._sample_reflex(rng, "tiny")
    p = dict(s.params, lambda_sa=np.asarray(6.0))  # sigmoid(6) = 0.9975 > 0.99: clamp active
    out, cache = D.reflexsplit_dual_stream_attention_forward(**s.inputs, params=p, **s.config)
    assert D.reflexsplit_dual_stream_attention_backward(np.ones_like(out), cache)["lambda_sa"] == 0
    out, cache = D.reflexsplit_dual_stream_attention_forward(**s.inputs, params=p, lambda_clip=None, **s.config)
    assert D.reflexsplit_dual_stream_attention_backward(rng.standard_normal(out.shape), cache)["lambda_sa"] != 0


def test_float32_inputs_compute_in_float32():
    rng = np.random.default_rng(9)
    q, k, v = (rng.standard_normal((2, 2, 4, 4)).astype(np.float32) for _ in range(3))
    assert D.mala_linear_attention(q, k, v).dtype == np.float32
    assert D.momentum_attention(q, k, v, {"gamma": np.float32(0.3)}).dtype == np.float32
    assert D.multi_token_attention(q, k, v, {"mta_kernel": np.ones((2, 1, 1, 1), np.float32)}).dtype == np.float32
    s = PCT._sample_pct(rng, "tiny")
    p32 = {k_: v_.astype(np.float32) for k_, v_ in s.params.items()}
    assert D.pct_offset_attention(s.inputs["x"].astype(np.float32), p32).dtype == np.float32
    s = REFLEX._sample_reflex(rng, "tiny")
    p32 = {k_: np.asarray(v_, np.float32) for k_, v_ in s.params.items()}
    assert D.reflexsplit_dual_stream_attention(s.inputs["x"].astype(np.float32), p32, **s.config).dtype == np.float32
    g = {n: np.ones(2, np.float32) for n in ("attn_mat_resid_gain", "attn_mat_skip_gain", "centre_attn_gain")}
    assert D.shaped_attention(q, k, v, g).dtype == np.float32
    s = MTA._sample_mta(rng, "small")
    p32 = {k_: np.asarray(v_, np.float32) for k_, v_ in s.params.items()}
    i32 = {k_: v_.astype(np.float32) for k_, v_ in s.inputs.items()}
    out, cache = D.multi_token_attention_forward(**i32, params=p32, **s.config)
    assert out.dtype == np.float32
    assert all(x.dtype == np.float32 for x in D.multi_token_attention_backward(np.ones_like(out), cache).values())
