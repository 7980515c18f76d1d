"""Vision attention (softmax family, slice s1): what the registry's generated tests cannot express.

Brute-force tests of the selections (which tokens a shifted window or an overlapping window lets
interact, built from coordinates), gradient checks of the configurations the records' tiny samples
do not draw, name-mapping and delegation tests, and parity with ``torch.nn.functional``
formulations through autograd. Parity with the official modules was measured in float64 in scratch
scripts (the numbers are on ``docs/softmax/vision-attention.md``); the one against Hugging Face
``transformers`` runs only where that package is installed.
"""

from __future__ import annotations

import numpy as np
import pytest

from refattn.attention.softmax import (
    class_attention_block_forward,
    duoformer_attention_backward,
    duoformer_attention_forward,
    hab_backward,
    hab_forward,
    init_swin_params,
    irpe_attention_backward,
    irpe_attention_forward,
    irpe_bucket_ids,
    irpe_coefficients,
    irpe_piecewise_index,
    oca_window_sizes,
    ocab_forward,
    relation_detr_attention_backward,
    relation_detr_attention_forward,
    swin_canonical_weights,
    swin_named_grads,
    swin_window_attention_backward,
    swin_window_attention_forward,
    transposed_channel_attention_backward,
    transposed_channel_attention_forward,
)
from refattn.registry import Sample
from refattn.testing import gradcheck


def _changed(forward, x, token, **kw):
    """Boolean (H, W) map of the output tokens that change when input ``token`` is perturbed (by a
    non-constant vector: LayerNorm ignores a shift of all channels)."""
    y0 = forward(x, **kw)
    x2 = x.copy()
    x2[(0,) + token] += np.linspace(-1.0, 2.0, x.shape[-1])
    return np.abs(forward(x2, **kw) - y0).max(axis=(0, 3)) > 0


# --------------------------------------------------------------------------------------------
# Swin


@pytest.mark.parametrize("grid,window,shift", [((8, 8), 4, 2), ((7, 9), 4, 2), ((6, 6), 3, 1), ((5, 7), 3, 0)])
def test_swin_interactions_match_coordinates(grid, window, shift):
    # With an exact (-inf) mask, token t reaches output o iff, on the padded and rolled grid, both sit
    # in one window and in one region of the unrolled image: brute force from coordinates.
    rng = np.random.default_rng(0)
    p = init_swin_params(rng, 4, 2, window)
    x = rng.standard_normal((1,) + grid + (4,))
    h, w = grid
    hp, wp = -(-h // window) * window, -(-w // window) * window

    def place(r, c):
        rr, cc = (r - shift) % hp, (c - shift) % wp            # position on the rolled grid

        def region(pos, length):
            return 0 if pos < length - window else (1 if pos < length - shift else 2)
        return (rr // window, cc // window), (region(rr, hp), region(cc, wp)) if shift else (0, 0)

    def fwd(xx):
        return swin_window_attention_forward(xx, p, num_heads=2, window_size=window, shift_size=shift,
                                             mask_value=-np.inf)[0]
    for t in [(0, 0), (h - 1, w - 1), (h // 2, 1), (1, w - 2)]:
        got = _changed(fwd, x, t)
        want = np.array([[place(r, c) == place(*t) for c in range(w)] for r in range(h)])
        assert np.array_equal(got, want), (t, got.astype(int), want.astype(int))


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_swin_parameter_names_agree(version):
    # The same weights under microsoft's fused names and HF's separate names give the same layer and
    # the same gradients (mapped back through the canonical names).
    rng = np.random.default_rng(1)
    ms = init_swin_params(rng, 6, 2, 3, version=version, param_names="microsoft", cpb_hidden=5)
    w = swin_canonical_weights(ms, version=version, param_names="microsoft")
    hf = {"self.query.weight": w["wq"], "self.query.bias": w["bq"], "self.key.weight": w["wk"],
          "self.value.weight": w["wv"], "self.value.bias": w["bv"], "output.dense.weight": w["wo"],
          "output.dense.bias": w["bo"]}
    if version == "v1":
        hf.update({"self.key.bias": w["bk"], "self.relative_position_bias_table": w["table"]})
    else:
        hf.update({"self.logit_scale": w["ls"].reshape(-1, 1, 1), "self.continuous_position_bias_mlp.0.weight": w["w0"],
                   "self.continuous_position_bias_mlp.0.bias": w["b0"],
                   "self.continuous_position_bias_mlp.2.weight": w["w2"]})
    x = rng.standard_normal((2, 5, 7, 6))
    cfg = {"num_heads": 2, "window_size": 3, "shift_size": 1, "version": version}
    y1, c1 = swin_window_attention_forward(x, ms, param_names="microsoft", **cfg)
    y2, c2 = swin_window_attention_forward(x, hf, param_names="hf", **cfg)
    np.testing.assert_array_equal(y1, y2)
    g = rng.standard_normal(y1.shape)
    g1, g2 = swin_window_attention_backward(g, c1), swin_window_attention_backward(g, c2)
    np.testing.assert_allclose(g1["x"], g2["x"], rtol=0, atol=1e-13)
    back = swin_named_grads({"wq": g2["self.query.weight"], "wk": g2["self.key.weight"], "wv": g2["self.value.weight"],
                             "bq": g2["self.query.bias"], "bk": g2.get("self.key.bias"), "bv": g2["self.value.bias"],
                             **{k: g1[n] for k, n in (("wo", "proj.weight"), ("bo", "proj.bias"))},
                             **({"table": g2["self.relative_position_bias_table"]} if version == "v1" else
                                {"ls": g2["self.logit_scale"].reshape(-1), "w0": g1["cpb_mlp.0.weight"],
                                 "b0": g1["cpb_mlp.0.bias"], "w2": g1["cpb_mlp.2.weight"]})},
                            ms, version=version, param_names="microsoft")
    for k in back:
        np.testing.assert_allclose(back[k], g1[k], rtol=0, atol=1e-13, err_msg=k)


def test_scot_attention_is_the_swin_layer():
    # scOT's attention sublayer is swin_window_attention with HF names, V2 and the mask added twice.
    from refattn.operators.scot import _sample, scot_layer_forward
    s = _sample(np.random.default_rng(2), "small")
    x, t = s.inputs["x"], s.inputs["t"]
    _, cache = scot_layer_forward(x, t, s.params, **s.config)
    sub = {k[len("attention."):]: v for k, v in s.params.items() if k.startswith("attention.")}
    want = swin_window_attention_forward(x, sub, num_heads=s.config["num_heads"], window_size=cache["ws"],
                                         shift_size=cache["shift"], version="v2", param_names="hf",
                                         mask_added_twice=True, window_rule="none")[0]
    got = cache["hh"] - x      # h = x + LN_before(attn): undo the residual and the conditional LN below
    from refattn.operators.scot import conditional_layer_norm
    ln = {k[len("layernorm_before."):]: v for k, v in s.params.items() if k.startswith("layernorm_before.")}
    np.testing.assert_allclose(got, conditional_layer_norm(want, t, ln), rtol=0, atol=1e-12)


def test_swin_matches_hf_swinv2_layer():
    hf = pytest.importorskip("transformers.models.swinv2.modeling_swinv2")
    torch = pytest.importorskip("torch")
    from transformers import Swinv2Config
    torch.manual_seed(0)
    conf = Swinv2Config(embed_dim=8, window_size=4, qkv_bias=True)
    layer = hf.Swinv2Layer(conf, dim=8, input_resolution=(5, 7), num_heads=2, shift_size=2).double().eval()
    layer.layernorm_before = torch.nn.Identity()
    layer.layernorm_after = torch.nn.Identity()
    layer.output = type("Zero", (torch.nn.Module,), {"forward": lambda self, h: torch.zeros_like(h[..., :8])})()
    x = np.random.default_rng(3).standard_normal((2, 5, 7, 8))
    xt = torch.tensor(x.reshape(2, 35, 8))
    with torch.no_grad():
        out = (layer(xt, (5, 7))[0] - xt).numpy().reshape(x.shape)
    params = {k[len("attention."):]: (v.detach().numpy().T if v.ndim == 2 else v.detach().numpy())
              for k, v in layer.named_parameters() if k.startswith("attention.")}
    ours = swin_window_attention_forward(x, params, num_heads=2, window_size=4, shift_size=2, version="v2",
                                         param_names="hf", mask_added_twice=True)[0]
    # the coordinate buffer is float32 upstream: 1e-7-level differences in the position bias
    np.testing.assert_allclose(ours, out, rtol=0, atol=1e-5)


# --------------------------------------------------------------------------------------------
# HAT


def test_hab_gradcheck():
    # The record's tiny sample draws OCAB at the seed the generated gradcheck uses; HAB is checked here.
    from refattn.attention.softmax.hat import _sample_block
    s = _sample_block(np.random.default_rng(4), "tiny", "hab")
    cfg = {k: v for k, v in s.config.items() if k != "block"}
    assert gradcheck(hab_forward, hab_backward, Sample(s.inputs, s.params, cfg)).max_rel < 1e-6


@pytest.mark.parametrize("grid,window,ratio", [((8, 12), 4, 0.5), ((6, 6), 2, 1.0)])
def test_ocab_interactions_match_coordinates(grid, window, ratio):
    # Token t reaches output o iff t lies in the overlapping key window of o's query window (or t = o).
    from refattn.attention.softmax import init_hat_params
    rng = np.random.default_rng(5)
    p = init_hat_params(rng, 4, 2, window, block="ocab", overlap_ratio=ratio)
    x = rng.standard_normal((1,) + grid + (4,))
    m, mo, pad = oca_window_sizes(window, ratio)

    def fwd(xx):
        return ocab_forward(xx, p, num_heads=2, window_size=window, overlap_ratio=ratio)[0]
    h, w = grid
    for t in [(0, 0), (h - 1, w // 2), (m, m - 1), (h // 2, w - 1)]:
        got = _changed(fwd, x, t)
        want = np.zeros(grid, bool)
        for r in range(h):
            for c in range(w):
                r0, c0 = (r // m) * m - pad, (c // m) * m - pad
                want[r, c] = (r0 <= t[0] < r0 + mo and c0 <= t[1] < c0 + mo) or (r, c) == t
        assert np.array_equal(got, want), (t, got.astype(int), want.astype(int))


# --------------------------------------------------------------------------------------------
# Transposed channel attention


def test_mdta_torch_autograd():
    # Restormer's MDTA written with torch.nn.functional; forward and every gradient through autograd.
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    from refattn.attention.softmax import init_channel_attention_params
    rng = np.random.default_rng(6)
    c, nh = 6, 3
    p = init_channel_attention_params(rng, c, nh, bias=True)
    x = rng.standard_normal((2, c, 4, 5))
    tx = torch.tensor(x, requires_grad=True)
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in p.items()}
    u = F.conv2d(tx, tp["qkv.weight"], tp.get("qkv.bias"))
    z = F.conv2d(u, tp["qkv_dwconv.weight"], tp.get("qkv_dwconv.bias"), padding=1, groups=3 * c)
    q, k, v = (t.reshape(2, nh, c // nh, -1) for t in z.chunk(3, dim=1))
    a = (F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1) * tp["temperature"]).softmax(-1)
    out = F.conv2d((a @ v).reshape(x.shape), tp["project_out.weight"], tp.get("project_out.bias"))
    g = rng.standard_normal(out.shape)
    (out * torch.tensor(g)).sum().backward()
    y, cache = transposed_channel_attention_forward(x, p, num_heads=nh)
    np.testing.assert_allclose(y, out.detach().numpy(), rtol=0, atol=1e-12)
    grads = transposed_channel_attention_backward(g, cache)
    np.testing.assert_allclose(grads["x"], tx.grad.numpy(), rtol=0, atol=1e-12)
    for k_, t in tp.items():
        np.testing.assert_allclose(grads[k_], t.grad.numpy(), rtol=0, atol=1e-12, err_msg=k_)


# --------------------------------------------------------------------------------------------
# iRPE


@pytest.mark.parametrize("method,mode,rpe_on", [("cross", "contextual", "qkv"), ("euc", "bias", "qk")])
def test_irpe_gradcheck_other_configurations(method, mode, rpe_on):
    from refattn.attention.softmax.irpe import _sample
    s = _sample(np.random.default_rng(7), "tiny", method=method, mode=mode, rpe_on=rpe_on)
    assert gradcheck(irpe_attention_forward, irpe_attention_backward, s).max_rel < 1e-6


def test_irpe_bucket_symmetries():
    # g is odd, so reversing a pair mirrors its product bucket and leaves Euclidean/quant buckets alone;
    # every bucket lies in its table.
    for ratio in (0.5, 1.9, 3.0):
        b = int(irpe_coefficients(ratio)[1])
        prod = irpe_bucket_ids("product", 6, 5, ratio=ratio)
        assert np.array_equal(prod.T, (2 * b + 1) ** 2 - 1 - prod)
        for method in ("euc", "quant"):
            ids = irpe_bucket_ids(method, 6, 5, ratio=ratio)
            assert np.array_equal(ids, ids.T) and ids.min() >= b and ids.max() <= 2 * b
        xs = np.arange(-50, 51)
        al, be, ga = irpe_coefficients(ratio)
        gx = irpe_piecewise_index(xs, al, be, ga)
        assert np.array_equal(gx, -gx[::-1]) and np.all(np.diff(gx) >= 0) and np.abs(gx).max() == b


# --------------------------------------------------------------------------------------------
# Relation-DETR


def test_relation_detr_mask_reference_and_gradients():
    from refattn.attention.softmax.relation_detr import _reference, _sample
    s = _sample(np.random.default_rng(8), "tiny")
    n = s.inputs["query"].shape[1]
    keep = np.ones((n, n), bool)
    keep[0, 1] = keep[2, 0] = False
    cfg = dict(s.config, attn_mask=keep)
    y, _ = relation_detr_attention_forward(**s.inputs, params=s.params, **cfg)
    np.testing.assert_allclose(y, _reference(**s.inputs, params=s.params, **cfg), rtol=0, atol=1e-12)
    assert gradcheck(relation_detr_attention_forward, relation_detr_attention_backward,
                     Sample(s.inputs, s.params, cfg)).max_rel < 1e-6


# --------------------------------------------------------------------------------------------
# DuoFormer


@pytest.mark.parametrize("stage,cls,pos,flat", [("scale", False, False, False), ("patch", True, True, False),
                                                ("patch", False, True, True), ("both", True, True, False),
                                                ("both", False, False, False)])
def test_duoformer_block_masked_reference(stage, cls, pos, flat):
    from refattn.attention.softmax import init_duoformer_params
    from refattn.attention.softmax.duoformer import _reference
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 4) + (() if flat else (3,)) + (6,))
    ct = rng.standard_normal((2, 1, 6)) if cls else None
    p = init_duoformer_params(rng, 6, stage=stage, num_tokens=4 + cls if pos else None)
    y = duoformer_attention_forward(x, ct, p, num_heads=2, stage=stage)[0]
    np.testing.assert_allclose(y, _reference(x, ct, p, num_heads=2, stage=stage), rtol=0, atol=1e-12)


def test_duoformer_gradcheck_both_stages_with_class_token():
    from refattn.attention.softmax import init_duoformer_params
    rng = np.random.default_rng(10)
    inputs = {"x": rng.standard_normal((2, 3, 2, 4)), "cls_token": rng.standard_normal((2, 1, 4))}
    p = init_duoformer_params(rng, 4, stage="both", num_tokens=4)
    assert gradcheck(duoformer_attention_forward, duoformer_attention_backward,
                     Sample(inputs, p, {"num_heads": 2, "stage": "both"})).max_rel < 1e-6


# --------------------------------------------------------------------------------------------
# CaiT


def test_class_attention_is_row_zero_of_self_attention():
    # The class token's attention output equals row 0 of full self-attention over [cls; patches]
    # (same q/k/v weights): class attention only drops the patch queries.
    from refattn.attention.softmax import init_class_attention_params
    from refattn.attention.softmax.mha import mha
    rng = np.random.default_rng(11)
    p = init_class_attention_params(rng, 6, qkv_bias=True, init_values=0.5)
    x, xc = rng.standard_normal((2, 5, 6)), rng.standard_normal((2, 1, 6))
    _, cache = class_attention_block_forward(x, xc, p, num_heads=3)
    zh = cache["zh"]
    mp = {"q_proj": p["attn.q.weight"], "q_proj_bias": p["attn.q.bias"], "k_proj": p["attn.k.weight"],
          "k_proj_bias": p["attn.k.bias"], "v_proj": p["attn.v.weight"], "v_proj_bias": p["attn.v.bias"],
          "out_proj": p["attn.proj.weight"], "out_proj_bias": p["attn.proj.bias"]}
    np.testing.assert_allclose(mha(zh, params=mp, num_heads=3)[:, :1], cache["ca"], rtol=0, atol=1e-12)
