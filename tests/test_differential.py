"""Mechanism-specific tests of the differential-attention family (refattn/attention/differential/:
core, v1, v2, diffclip, gda, dint, dex, difflora, shared_diff, cross).

The generic checks (FD gradcheck, directional, dtype, bad input, inputs never modified …) are
generated from the registry elsewhere; here: PyTorch transcriptions of the upstream modules with
autograd gradients, the identities of the catalogue and the convention keywords.
"""

from __future__ import annotations

import importlib
import math

import numpy as np
import pytest

from refattn import registry
from refattn.attention import differential as D
from refattn.attention.differential import _samples as S
from refattn.attention.differential import dex as DEX
from refattn.attention.differential import diffclip as CLIP
from refattn.attention.differential import gda as GDA
from refattn.attention.differential import shared_diff as SHARED
from refattn.attention.differential import v2 as V2
from refattn.testing import run_record_checks
from refattn.testing.runner import record_check_names

# Modules whose name is also their main function's: the package attribute is the function
# (``from refattn.blocks import bcos`` gives the function), so take the module itself.
LORA = importlib.import_module("refattn.attention.differential.difflora")

SLUGS = ["diff_attention_core", "diff_attention_v1", "diff_attention_v2", "diffclip_attention",
         "grouped_differential_attention", "dint_attention", "dex_differential_adaptation", "difflora",
         "shared_diff_attention", "differential_cross_attention"]


@pytest.mark.parametrize("slug", SLUGS)
@pytest.mark.parametrize("seed", [0, 1])
def test_record_checks_pass(slug, seed):
    rec = registry.get(slug)
    # kernel parity checks attached by refattn/kernels are tested with the kernels
    names = [n for n in record_check_names(rec) if not n.startswith("check:kernel:")]
    results = [r for n in names for r in run_record_checks(rec, seed=seed, only=n).results]
    assert len(results) == len(names)
    bad = [(r.check, r.message) for r in results if not r.passed]
    assert not bad, bad


# ------------------------------------------------------------------------------ torch helpers


def _torch_rope_interleaved(torch, x, cos, sin):
    # x (B, N, heads, d) as unilm's apply_rotary_emb(..., interleaved=True); cos/sin (N, r/2)
    r = 2 * cos.shape[1]
    c = cos[: x.shape[1], None, :]
    s = sin[: x.shape[1], None, :]
    a, b = x[..., 0:r:2], x[..., 1:r:2]
    rot = torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(-2)
    return torch.cat([rot, x[..., r:]], dim=-1)


def _torch_unilm_v1(torch, x, P, *, H, Hkv, lambda_init, rel_pos, flash, attn_mask=None):
    """unilm multihead_diffattn.py (flash=False) / multihead_flashdiff_1.py (flash=True) in torch."""
    F = torch.nn.functional
    B, n, C = x.shape
    d = P["q_proj.weight"].shape[1] // (2 * H)
    n_rep = H // Hkv
    q = (x @ P["q_proj.weight"]).view(B, n, 2 * H, d)
    k = (x @ P["k_proj.weight"]).view(B, n, 2 * Hkv, d)
    v = (x @ P["v_proj.weight"]).view(B, n, Hkv, 2 * d)
    if rel_pos is not None:
        cos, sin = (torch.from_numpy(t) for t in rel_pos)
        q = _torch_rope_interleaved(torch, q, cos, sin)
        k = _torch_rope_interleaved(torch, k, cos, sin)
    lam1 = torch.exp(torch.sum(P["lambda_q1"] * P["lambda_k1"]))
    lam2 = torch.exp(torch.sum(P["lambda_q2"] * P["lambda_k2"]))
    lam = lam1 - lam2 + lambda_init
    if attn_mask is None:
        mask = torch.triu(torch.full((n, n), float("-inf"), dtype=x.dtype), 1)
    else:
        mask = torch.where(torch.from_numpy(attn_mask), 0.0, float("-inf")).to(x.dtype)
    if not flash:
        q = q.transpose(1, 2) * d ** -0.5
        k = k.transpose(1, 2).repeat_interleave(n_rep, dim=1)
        vv = v.transpose(1, 2).repeat_interleave(n_rep, dim=1)
        w = F.softmax(q @ k.transpose(-1, -2) + mask, dim=-1)
        w = w.view(B, H, 2, n, n)
        attn = (w[:, :, 0] - lam * w[:, :, 1]) @ vv
    else:
        q = q.reshape(B, n, H, 2, d)
        k = k.reshape(B, n, Hkv, 2, d)
        outs = []
        for a in (0, 1):
            qa = q[:, :, :, a].transpose(1, 2)
            ka = k[:, :, :, a].transpose(1, 2).repeat_interleave(n_rep, dim=1)
            va = v.transpose(1, 2).repeat_interleave(n_rep, dim=1)
            outs.append(F.scaled_dot_product_attention(qa, ka, va, attn_mask=mask))
        attn = outs[0] - lam * outs[1]
    attn = attn * torch.rsqrt(attn.pow(2).mean(-1, keepdim=True) + 1e-5) * P["subln.weight"]
    attn = attn * (1 - lambda_init)
    attn = attn.transpose(1, 2).reshape(B, n, H * 2 * d)
    return attn @ P["out_proj.weight"]


@pytest.mark.parametrize("Hkv,pairing", [(2, "naive"), (1, "naive"), (1, "flash"), (2, "flash")])
def test_v1_matches_torch_transcription_with_autograd(Hkv, pairing):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    B, n, C, H, d = 2, 5, 6, 2, 4
    x = rng.standard_normal((B, n, C))
    P = S.v1_params(rng, C, H, Hkv, d, lambda_init=D.lambda_init_fn(3))
    rel = D.rope_tables(n, d)
    cfg = dict(num_heads=H, num_kv_heads=Hkv, depth=3, rel_pos=rel, gqa_pairing=pairing)
    out, cache = D.diff_attention_v1_forward(x, P, **cfg)
    xt = torch.from_numpy(x).requires_grad_()
    Pt = {k: torch.from_numpy(v).requires_grad_() for k, v in P.items()}
    yt = _torch_unilm_v1(torch, xt, Pt, H=H, Hkv=Hkv, lambda_init=D.lambda_init_fn(3), rel_pos=rel,
                         flash=(pairing == "flash"))
    np.testing.assert_allclose(out, yt.detach().numpy(), rtol=1e-11, atol=1e-12)
    g = rng.standard_normal(out.shape)
    yt.backward(torch.from_numpy(g))
    grads = D.diff_attention_v1_backward(g, cache)
    np.testing.assert_allclose(grads["x"], xt.grad.numpy(), rtol=1e-10, atol=1e-12)
    for k, t in Pt.items():
        np.testing.assert_allclose(grads[k], t.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=k)


def test_v1_explicit_mask_replaces_causal_like_unilm():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    B, n, C, H, d = 2, 4, 6, 2, 2
    x = rng.standard_normal((B, n, C))
    P = S.v1_params(rng, C, H, H, d)
    keep = rng.random((n, n)) > 0.4
    keep[:, 0] = True
    out = D.diff_attention_v1(x, P, num_heads=H, depth=1, attn_mask=keep)
    ref = _torch_unilm_v1(torch, torch.from_numpy(x), {k: torch.from_numpy(v) for k, v in P.items()},
                          H=H, Hkv=H, lambda_init=D.lambda_init_fn(1), rel_pos=None, flash=False,
                          attn_mask=keep)
    np.testing.assert_allclose(out, ref.numpy(), rtol=1e-11, atol=1e-12)
    # is_causal=True adds the causal mask on top of attn_mask: a different result
    both = D.diff_attention_v1(x, P, num_heads=H, depth=1, attn_mask=keep, is_causal=True)
    assert np.abs(both - out).max() > 1e-6


def test_gqa_pairing_difference_is_exactly_the_key_choice():
    # n_rep = 2, naive: both maps of head i use key half-head i; flash: head i uses half-heads of kv 0.
    qp1, qp2, kp1, kp2, vp = D.v1_pairing_index(2, 1, "adjacent", "naive")
    assert list(kp1) == [0, 1] and list(kp2) == [0, 1]
    qp1, qp2, kp1, kp2, vp = D.v1_pairing_index(2, 1, "adjacent", "flash")
    assert list(kp1) == [0, 0] and list(kp2) == [1, 1] and list(vp) == [0, 0]
    # with n_rep = 1 they coincide
    a = D.v1_pairing_index(4, 4, "adjacent", "naive")
    b = D.v1_pairing_index(4, 4, "adjacent", "flash")
    assert all(np.array_equal(u, w) for u, w in zip(a, b))


def test_core_flashdiff2_split_values_equal_flashdiff1():
    # multihead_flashdiff_2.py: cat(FA(q1,k1,v1), FA(q1,k1,v2)) - lam cat(FA(q2,k2,v1), FA(q2,k2,v2))
    rng = np.random.default_rng(5)
    q1, q2, k1, k2 = rng.standard_normal((4, 2, 3, 5, 4))
    v = rng.standard_normal((2, 3, 5, 8))
    lam = np.array([0.37])
    full = D.diff_attention_core(q1, k1, q2, k2, v, lam, is_causal=True)
    zero = np.array([0.0])
    parts = []
    for vh in (v[..., :4], v[..., 4:]):
        parts.append(D.diff_attention_core(q1, k1, q2, k2, vh, zero, is_causal=True)
                     - lam * D.diff_attention_core(q2, k2, q1, k1, vh, zero, is_causal=True))
    np.testing.assert_allclose(full, np.concatenate(parts, -1), rtol=1e-13, atol=1e-14)


def test_core_against_torch_sdpa_gqa_and_lambda_per_token():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(6)
    q1, q2 = rng.standard_normal((2, 2, 4, 5, 3))
    k1, k2 = rng.standard_normal((2, 2, 2, 5, 3))
    v = rng.standard_normal((2, 2, 5, 6))
    lam = rng.standard_normal((2, 4, 5))
    out, cache = D.diff_attention_core_forward(q1, k1, q2, k2, v, lam, is_causal=True)
    T = {k: torch.from_numpy(a).requires_grad_() for k, a in
         dict(q1=q1, k1=k1, q2=q2, k2=k2, v=v, lam=lam).items()}
    o1 = F.scaled_dot_product_attention(T["q1"], T["k1"], T["v"], is_causal=True, enable_gqa=True)
    o2 = F.scaled_dot_product_attention(T["q2"], T["k2"], T["v"], is_causal=True, enable_gqa=True)
    ot = o1 - T["lam"][..., None] * o2
    np.testing.assert_allclose(out, ot.detach().numpy(), rtol=1e-12, atol=1e-13)
    g = rng.standard_normal(out.shape)
    ot.backward(torch.from_numpy(g))
    grads = D.diff_attention_core_backward(g, cache)
    for k, t in T.items():
        np.testing.assert_allclose(grads[k], t.grad.numpy(), rtol=1e-11, atol=1e-12, err_msg=k)


def test_lambda_init_conventions():
    assert D.lambda_init_fn(0) == pytest.approx(0.2)
    assert D.lambda_init_fn(1, "paper") == pytest.approx(0.2)
    assert D.lambda_init_fn(4, "paper") == pytest.approx(D.lambda_init_fn(3, "unilm"))
    assert D.lambda_init_fn(0, "motif") == pytest.approx(0.8 - 0.6 * math.exp(0.3))
    assert D.lambda_init_fn(0, "motif") < 0
    with pytest.raises(ValueError, match="1-based"):
        D.lambda_init_fn(0, "paper")
    with pytest.raises(ValueError, match="lambda_init_convention"):
        D.lambda_init_fn(1, "timm")


def test_v1_lambda_init_changes_only_lambda_and_rescale():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3, 4))
    P = S.v1_params(rng, 4, 1, 1, 2)
    a = D.diff_attention_v1(x, P, num_heads=1, lambda_init=0.3)
    b = D.diff_attention_v1(x, P, num_heads=1, depth=2, lambda_init_convention="unilm")
    assert np.abs(a - b).max() > 1e-6
    c = D.diff_attention_v1(x, P, num_heads=1, lambda_init=D.lambda_init_fn(2))
    np.testing.assert_array_equal(b, c)


def test_v1_norm_options():
    rng = np.random.default_rng(8)
    x = rng.standard_normal((2, 3, 4))
    P = S.v1_params(rng, 4, 2, 2, 2)
    base = D.diff_attention_v1(x, P, num_heads=2, depth=0)
    # subln weight of ones == no affine
    P1 = dict(P, **{"subln.weight": np.ones(4)})
    P0 = {k: v for k, v in P.items() if k != "subln.weight"}
    np.testing.assert_allclose(D.diff_attention_v1(x, P1, num_heads=2, depth=0),
                               D.diff_attention_v1(x, P0, num_heads=2, depth=0, subln_affine=False),
                               rtol=1e-14, atol=1e-15)
    # the affine weight scales each channel of every head (per-head norm placement)
    none = D.diff_attention_v1(x, P0, num_heads=2, depth=0, subln="none", rescale=False)
    assert np.abs(none - base).max() > 1e-6
    with pytest.raises(ValueError, match="unknown keys"):
        D.diff_attention_v1(x, P, num_heads=2, depth=0, subln_affine=False)
    with pytest.raises(ValueError, match="missing"):
        D.diff_attention_v1(x, P0, num_heads=2, depth=0)


def test_v1_tied_maps_output_independent_of_lambda_magnitude():
    # Q1 = Q2, K1 = K2: pre-norm output (1 - lam) A V; with eps -> 0, RMSNorm removes |1 - lam|.
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 4, 4))
    P = S.v1_params(rng, 4, 1, 1, 2)
    wq, wk = P["q_proj.weight"], P["k_proj.weight"]
    P["q_proj.weight"] = np.concatenate([wq[:, :2], wq[:, :2]], 1)
    P["k_proj.weight"] = np.concatenate([wk[:, :2], wk[:, :2]], 1)
    outs = []
    for lam0 in (0.1, 0.5):  # lambda = e1 - e2 + lam0 < 1 for both when the vectors are zero
        P2 = dict(P, lambda_q1=np.zeros(2), lambda_k1=np.zeros(2), lambda_q2=np.zeros(2), lambda_k2=np.zeros(2))
        outs.append(D.diff_attention_v1(x, P2, num_heads=1, lambda_init=lam0, subln_eps=1e-300,
                                        rescale=False))
    np.testing.assert_allclose(outs[0], outs[1], rtol=1e-12, atol=1e-13)


def test_v1_bad_inputs():
    rng = np.random.default_rng(10)
    x = rng.standard_normal((2, 3, 4))
    P = S.v1_params(rng, 4, 2, 1, 2)
    with pytest.raises(ValueError, match="transpose"):
        D.diff_attention_v1(x, dict(P, **{"out_proj.weight": P["out_proj.weight"].T}), num_heads=2,
                            num_kv_heads=1, depth=0)
    with pytest.raises(ValueError, match="not both"):
        D.diff_attention_v1(x, P, num_heads=2, num_kv_heads=1, depth=0, lambda_init=0.5)
    with pytest.raises(ValueError, match="depth"):
        D.diff_attention_v1(x, P, num_heads=2, num_kv_heads=1)
    with pytest.raises(ValueError, match="multiple"):
        D.diff_attention_v1(x, P, num_heads=3, num_kv_heads=2, depth=0)
    with pytest.raises(ValueError, match="rotary_dim"):
        D.diff_attention_v1(x, P, num_heads=2, num_kv_heads=1, depth=0, rel_pos=D.rope_tables(3, 4))
    with pytest.raises(ValueError, match="cover"):
        D.diff_attention_v1(x, P, num_heads=2, num_kv_heads=1, depth=0, rel_pos=D.rope_tables(2, 2))
    with pytest.raises(ValueError, match="attn_mask"):
        D.diff_attention_v1(x, P, num_heads=2, num_kv_heads=1, depth=0, attn_mask=np.ones((3, 4), bool))
    with pytest.raises(TypeError, match="x"):
        D.diff_attention_v1(x.astype(int), P, num_heads=2, num_kv_heads=1, depth=0)
    with pytest.raises(ValueError, match="gqa_pairing"):
        D.diff_attention_v1(x, P, num_heads=2, num_kv_heads=1, depth=0, gqa_pairing="repeat")


def test_core_bad_inputs():
    rng = np.random.default_rng(11)
    q = rng.standard_normal((2, 4, 3, 2))
    k = rng.standard_normal((2, 3, 3, 2))
    with pytest.raises(ValueError, match="multiple"):
        D.diff_attention_core(q, k, q, k, k, np.array([0.5]))
    k = rng.standard_normal((2, 2, 3, 2))
    with pytest.raises(ValueError, match="lam"):
        D.diff_attention_core(q, k, q, k, k, np.ones(5))
    with pytest.raises(ValueError, match="q2"):
        D.diff_attention_core(q, k, q[..., :1], k, k, np.array([0.5]))
    with pytest.raises(ValueError, match="scale"):
        D.diff_attention_core(q, k, q, k, k, np.array([0.5]), scale=0.0)
    with pytest.raises(ValueError, match="lam"):
        D.diff_attention_core(q, k, q, k, k, np.array(0.5))


def test_core_float32_and_fully_masked():
    rng = np.random.default_rng(12)
    q = rng.standard_normal((2, 2, 3, 2)).astype(np.float32)
    out = D.diff_attention_core(q, q, q, q, q, np.float32(0.5) * np.ones(1, np.float32))
    assert out.dtype == np.float32
    keep = np.zeros((3, 3), bool)
    out = D.diff_attention_core(q, q, q, q, q, np.array([0.5]), attn_mask=keep)
    assert np.all(out == 0)


# ------------------------------------------------------------------------------ DIFF V2


@pytest.mark.parametrize("Hkv", [1, 2])
def test_v2_matches_torch_transcription_with_autograd(Hkv):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(13)
    B, n, C, H, d = 2, 5, 6, 2, 4
    x = rng.standard_normal((B, n, C))
    P = V2._v2_params(rng, C, H, Hkv, d)
    rel = D.rope_tables(n, d)
    out, cache = D.diff_attention_v2_forward(x, P, num_heads=H, num_kv_heads=Hkv, rel_pos=rel)
    xt = torch.from_numpy(x).requires_grad_()
    T = {k: torch.from_numpy(v).requires_grad_() for k, v in P.items()}
    cos, sin = (torch.from_numpy(t) for t in rel)
    q = _torch_rope_interleaved(torch, (xt @ T["q_proj.weight"]).view(B, n, 2 * H, d), cos, sin)
    k = _torch_rope_interleaved(torch, (xt @ T["k_proj.weight"]).view(B, n, Hkv, d), cos, sin)
    v = (xt @ T["v_proj.weight"]).view(B, n, Hkv, d)
    attn = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                          is_causal=True, enable_gqa=True).transpose(1, 2)
    lam = xt @ T["lambda_proj.weight"]
    attn = attn[:, :, 0::2] - torch.sigmoid(lam).unsqueeze(-1) * attn[:, :, 1::2]
    yt = attn.reshape(B, n, H * d) @ T["o_proj.weight"]
    np.testing.assert_allclose(out, yt.detach().numpy(), rtol=1e-11, atol=1e-12)
    g = rng.standard_normal(out.shape)
    yt.backward(torch.from_numpy(g))
    grads = D.diff_attention_v2_backward(g, cache)
    np.testing.assert_allclose(grads["x"], xt.grad.numpy(), rtol=1e-10, atol=1e-12)
    for key, t in T.items():
        np.testing.assert_allclose(grads[key], t.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=key)


def test_v2_shared_kv_requirement():
    rng = np.random.default_rng(14)
    x = rng.standard_normal((2, 3, 4))
    P = V2._v2_params(rng, 4, 2, 4, 2)  # 2H = 4 query heads, 4 kv heads: pairs do not share K/V
    with pytest.raises(ValueError, match="share"):
        D.diff_attention_v2(x, P, num_heads=2, num_kv_heads=4)
    out = D.diff_attention_v2(x, P, num_heads=2, num_kv_heads=4, require_shared_kv=False)
    ref = V2._v2_reference(x, P, num_heads=2, num_kv_heads=4)
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-13)


# ------------------------------------------------------------------------------ DiffCLIP, GDA


def test_diffclip_matches_torch_transcription_with_autograd():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(15)
    B, n, C, heads = 2, 5, 8, 4
    x = rng.standard_normal((B, n, C))
    P = CLIP._diffclip_params(rng, C, heads)
    out, cache = D.diffclip_attention_forward(x, P, num_heads=heads)
    xt = torch.from_numpy(x).requires_grad_()
    T = {k: torch.from_numpy(v).requires_grad_() for k, v in P.items()}
    h, d = heads // 2, C // heads
    lin = lambda name, a: a @ T[f"{name}.weight"] + T[f"{name}.bias"]  # noqa: E731
    q = lin("q_proj", xt).view(B, n, 2 * h, d).transpose(1, 2) * d ** -0.5
    k = lin("k_proj", xt).view(B, n, 2 * h, d).transpose(1, 2)
    v = lin("v_proj", xt).view(B, n, h, 2 * d).transpose(1, 2)
    p = F.softmax(q @ k.transpose(-1, -2), dim=-1).view(B, h, 2, n, n)
    lam = (torch.exp(torch.sum(T["lambda_q1"] * T["lambda_k1"])) - torch.exp(torch.sum(T["lambda_q2"] * T["lambda_k2"]))
           + 0.8)
    o = (p[:, :, 0] - lam * p[:, :, 1]) @ v
    o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + 1e-5) * T["diff_norm.weight"] * (1 - 0.8)
    yt = lin("out_proj", o.transpose(1, 2).reshape(B, n, C))
    np.testing.assert_allclose(out, yt.detach().numpy(), rtol=1e-11, atol=1e-12)
    g = rng.standard_normal(out.shape)
    yt.backward(torch.from_numpy(g))
    grads = D.diffclip_attention_backward(g, cache)
    np.testing.assert_allclose(grads["x"], xt.grad.numpy(), rtol=1e-10, atol=1e-12)
    for key, t in T.items():
        np.testing.assert_allclose(grads[key], t.grad.numpy(), rtol=1e-9, atol=1e-12, err_msg=key)


def test_diffclip_bias_and_head_rules():
    rng = np.random.default_rng(16)
    x = rng.standard_normal((2, 3, 4))
    P = CLIP._diffclip_params(rng, 4, 2)
    with pytest.raises(ValueError, match="even"):
        D.diffclip_attention(x, P, num_heads=3)
    with pytest.raises(ValueError, match="qkv_bias=False"):
        D.diffclip_attention(x, P, num_heads=2, qkv_bias=False)
    with pytest.raises(ValueError, match="out_proj.bias"):
        D.diffclip_attention(x, {k: v for k, v in P.items() if k != "out_proj.bias"}, num_heads=2)


def test_gda_ratio_one_equals_v1_and_layouts():
    rng = np.random.default_rng(17)
    x = rng.standard_normal((2, 4, 5))
    P = GDA._gda_params(rng, 5, 3, 1, 2)
    for layout, pairing in (("grouped", "adjacent"), ("split", "halves")):
        a = D.grouped_differential_attention(x, P, num_signal_heads=3, head_layout=layout, depth=1)
        # GDA's defaults are the Motif code's (lambda_init_convention="motif", rotate-half RoPE)
        b = D.diff_attention_v1(x, P, num_heads=3, depth=1, pairing=pairing, **GDA._GDA_V1_DEFAULTS)
        np.testing.assert_array_equal(a, b)
        c = D.grouped_differential_attention(x, P, num_signal_heads=3, head_layout=layout, depth=1,
                                              lambda_init_convention="unilm", rope_interleaved=True)
        np.testing.assert_array_equal(c, D.diff_attention_v1(x, P, num_heads=3, depth=1, pairing=pairing))
    sig, noise = D.gda_head_index(6, 3, "grouped")
    assert list(sig) == [0, 1, 2, 4, 5, 6] and list(noise) == [3, 3, 3, 7, 7, 7]
    sig, noise = D.gda_head_index(6, 3, "split")
    assert list(sig) == [0, 1, 2, 3, 4, 5] and list(noise) == [6, 6, 6, 7, 7, 7]


def test_gda_ratio_changes_output_and_validates():
    rng = np.random.default_rng(18)
    x = rng.standard_normal((2, 4, 5))
    P = GDA._gda_params(rng, 5, 4, 2, 2)
    out = D.grouped_differential_attention(x, P, num_signal_heads=4, noise_group_ratio=2, depth=0)
    assert out.shape == (2, 4, 5) and np.isfinite(out).all()
    with pytest.raises(ValueError, match="q_proj.weight"):
        D.grouped_differential_attention(x, P, num_signal_heads=4, noise_group_ratio=4, depth=0)
    with pytest.raises(ValueError, match="multiple"):
        D.grouped_differential_attention(x, P, num_signal_heads=4, noise_group_ratio=3, depth=0)



def _vllm_gda_reference(x, P, *, Hs, r, G, d, lam0, cos, sin):
    """Transcription of vllm-project/vllm vllm/v1/attention/backends/grouped_diff_attn.py
    (GroupedDifferentialAttentionImpl.forward, commit 49902a1) fed by MotifTechnologies/vllm
    vllm/model_executor/models/motif.py (MotifAttention: qkv split, neox RoPE, subln, out_proj)."""
    B, n, _ = x.shape
    Hq, Hkv = Hs + Hs // r, 2 * G                      # num_heads, num_kv_heads upstream
    num_groups = Hs // r                                # num_q_head_groups = num_q2_heads

    def rope(t):                                        # get_rope(..., is_neox_style=True)
        half = t.shape[-1] // 2
        a, b = t[..., :half], t[..., half:]
        c, s_ = cos[:n, None, :], sin[:n, None, :]
        return np.concatenate([a * c - b * s_, a * s_ + b * c], axis=-1)

    q = rope((x @ P["q_proj.weight"]).reshape(B, n, Hq, d))
    k = rope((x @ P["k_proj.weight"]).reshape(B, n, Hkv, d))
    v = (x @ P["v_proj.weight"]).reshape(B, n, Hkv, d)
    qg = q.reshape(B, n, num_groups, r + 1, d)         # split_q_heads
    q1 = qg[:, :, :, :r].reshape(B, n, Hs, d)
    q2 = qg[:, :, :, r:].reshape(B, n, num_groups, d)
    k1, k2 = k.reshape(B, n, G, 2, d)[:, :, :, 0], k.reshape(B, n, G, 2, d)[:, :, :, 1]   # split_heads
    v1, v2 = v.reshape(B, n, G, 2, d)[:, :, :, 0], v.reshape(B, n, G, 2, d)[:, :, :, 1]

    def flash_attn(qq, kk, vv):                         # causal=True, GQA: q head h -> kv head h // (Hq/Hkv)
        kk = np.repeat(kk, qq.shape[2] // kk.shape[2], axis=2)
        vv = np.repeat(vv, qq.shape[2] // vv.shape[2], axis=2)
        sc = np.einsum("bihd,bjhd->bhij", qq, kk) * d ** -0.5
        sc = np.where(np.tril(np.ones((n, n), bool)), sc, -np.inf)
        p = np.exp(sc - sc.max(-1, keepdims=True))
        return np.einsum("bhij,bjhd->bihd", p / p.sum(-1, keepdims=True), vv)

    attn1 = np.concatenate([flash_attn(q1, k1, v1), flash_attn(q1, k1, v2)], axis=-1)
    attn2 = np.concatenate([flash_attn(q2, k2, v1), flash_attn(q2, k2, v2)], axis=-1)
    attn2 = np.repeat(attn2, r, axis=2)                 # repeat(attn2, "... H D -> ... (H r) D")
    lam = np.exp(P["lambda_q1"] @ P["lambda_k1"]) - np.exp(P["lambda_q2"] @ P["lambda_k2"]) + lam0
    a = attn1 - lam * attn2
    a = a / np.sqrt(np.mean(a * a, axis=-1, keepdims=True) + 1e-5) * P["subln.weight"]   # RMSNorm(2d)
    return (a * (1 - lam0)).reshape(B, n, -1) @ P["out_proj.weight"]


@pytest.mark.parametrize("Hs,r,G", [(8, 4, 2), (8, 4, 1), (6, 3, 2), (4, 2, 1), (3, 1, 3)])
def test_gda_matches_vllm_grouped_diff_attn(Hs, r, G):
    # Motif-2-12.7B's layout (num_attention_heads = Hs + Hs/r, num_key_value_heads = 2G), scaled down.
    rng = np.random.default_rng(23)
    B, n, C, d, depth = 2, 5, 6, 4, 3
    x = rng.standard_normal((B, n, C))
    P = GDA._gda_params(rng, C, Hs, r, d, G=G)
    cos, sin = D.rope_tables(n, d)
    out = D.grouped_differential_attention(x, P, num_signal_heads=Hs, noise_group_ratio=r, num_kv_heads=G,
                                            depth=depth, rel_pos=(cos, sin))
    lam0 = 0.8 - 0.6 * math.exp(-0.3 * (depth - 1))    # MotifAttention.lambda_init_fn(layer_idx)
    ref = _vllm_gda_reference(x, P, Hs=Hs, r=r, G=G, d=d, lam0=lam0, cos=cos, sin=sin)
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-13)


def test_gda_per_head_layout_and_kv_validation():
    rng = np.random.default_rng(24)
    x = rng.standard_normal((2, 4, 5))
    P = GDA._gda_params(rng, 5, 4, 2, 2, kv_layout="per_head")
    out = D.grouped_differential_attention(x, P, num_signal_heads=4, noise_group_ratio=2, kv_layout="per_head",
                                            depth=1)
    assert out.shape == (2, 4, 5) and np.isfinite(out).all()
    with pytest.raises(ValueError, match="k_proj.weight"):   # per-head keys are not the grouped layout
        D.grouped_differential_attention(x, P, num_signal_heads=4, noise_group_ratio=2, depth=1)
    with pytest.raises(ValueError, match="num_kv_heads"):
        D.grouped_differential_attention(x, P, num_signal_heads=4, noise_group_ratio=2, kv_layout="per_head",
                                          num_kv_heads=2, depth=1)
    Pg = GDA._gda_params(rng, 5, 4, 2, 2)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        D.grouped_differential_attention(x, Pg, num_signal_heads=4, noise_group_ratio=2, num_kv_heads=4, depth=1)
    with pytest.raises(ValueError, match="kv_layout"):
        D.grouped_differential_attention(x, Pg, num_signal_heads=4, noise_group_ratio=2, kv_layout="mqa", depth=1)

# ------------------------------------------------------------------------------ DINT


@pytest.mark.parametrize("kind", ["causal", "all"])
@pytest.mark.parametrize("src", ["A1", "A2"])
def test_dint_against_explicit_maps(kind, src):
    # A = A1 - lam A2 + lam G with G = C A_src built as an N x N matrix, then V1's norm and projection.
    rng = np.random.default_rng(19)
    B, n, C, H, d = 2, 5, 4, 2, 2
    x = rng.standard_normal((B, n, C))
    P = S.v1_params(rng, C, H, H, d)
    P.pop("subln.weight")
    out = D.dint_attention(x, P, num_heads=H, depth=2, integral=kind, integral_source=src, subln="none",
                            rescale=False)
    q = np.swapaxes((x @ P["q_proj.weight"]).reshape(B, n, 2 * H, d), 1, 2)
    k = np.swapaxes((x @ P["k_proj.weight"]).reshape(B, n, 2 * H, d), 1, 2)
    v = np.swapaxes((x @ P["v_proj.weight"]).reshape(B, n, H, 2 * d), 1, 2)
    keep = np.tril(np.ones((n, n), bool))
    lam = (np.exp(P["lambda_q1"] @ P["lambda_k1"]) - np.exp(P["lambda_q2"] @ P["lambda_k2"])
           + D.lambda_init_fn(2))
    if kind == "causal":
        Cm = np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]
    else:
        Cm = np.ones((n, n)) / n
    heads = []
    for h in range(H):
        maps = []
        for a in (0, 1):
            s = q[:, 2 * h + a] @ np.swapaxes(k[:, 2 * h + a], -1, -2) * d ** -0.5
            s = np.where(keep, s, -np.inf)
            e = np.exp(s - s.max(-1, keepdims=True))
            maps.append(e / e.sum(-1, keepdims=True))
        G = Cm @ maps[0 if src == "A1" else 1]
        A = maps[0] - lam * maps[1] + lam * G
        np.testing.assert_allclose(A.sum(-1), 1.0, atol=1e-13)
        heads.append(A @ v[:, h])
    ref = np.swapaxes(np.stack(heads, 1), 1, 2).reshape(B, n, -1) @ P["out_proj.weight"]
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-13)


def test_dint_matches_third_party_multihead_dint_attention():
    # jwliao1209/Differential-FT-Transformer src/models/layers.py (commit 5e94ec8), MultiheadDintAttention:
    #   attn_weights = attn_weights.view(B, H, 2, tgt, src)
    #   a1, a2 = attn_weights[:, :, 0], attn_weights[:, :, 1]
    #   a3 = attn_weights[:, :, 0].mean(dim=2)[:, :, None]
    #   attn_weights = lam * a3 + a1 - lam * a2 ; attn_output = attn_weights @ v   (use_rms_norm=False)
    # (its scores are divided by head_dim**-0.5; the paper's/refattn's scale d**-0.5 is used here)
    rng = np.random.default_rng(31)
    B, n, C, H, d = 2, 6, 5, 3, 2
    x = rng.standard_normal((B, n, C))
    P = S.v1_params(rng, C, H, H, d)
    P.pop("subln.weight")
    out = D.dint_attention(x, P, num_heads=H, lambda_init=0.3, is_causal=False, subln="none", rescale=False)
    q = (x @ P["q_proj.weight"]).reshape(B, n, 2 * H, d).transpose(0, 2, 1, 3)
    k = (x @ P["k_proj.weight"]).reshape(B, n, 2 * H, d).transpose(0, 2, 1, 3)
    v = (x @ P["v_proj.weight"]).reshape(B, n, H, 2 * d).transpose(0, 2, 1, 3)
    lam = np.exp(P["lambda_q1"] @ P["lambda_k1"]) - np.exp(P["lambda_q2"] @ P["lambda_k2"]) + 0.3
    s = q @ k.transpose(0, 1, 3, 2) * d ** -0.5
    w = np.exp(s - s.max(-1, keepdims=True))
    w = (w / w.sum(-1, keepdims=True)).reshape(B, H, 2, n, n)
    a1, a2 = w[:, :, 0], w[:, :, 1]
    a3 = w[:, :, 0].mean(axis=2)[:, :, None]
    attn = lam * a3 + a1 - lam * a2
    ref = (attn @ v).transpose(0, 2, 1, 3).reshape(B, n, -1) @ P["out_proj.weight"]
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-13)
    # the default integral ("auto") picks the column mean when the layer is not causal
    np.testing.assert_array_equal(out, D.dint_attention(x, P, num_heads=H, lambda_init=0.3, is_causal=False,
                                                         subln="none", rescale=False, integral="all"))

def test_dint_auto_picks_the_causal_average():
    rng = np.random.default_rng(20)
    x = rng.standard_normal((2, 4, 4))
    P = S.v1_params(rng, 4, 2, 2, 2)
    auto = D.dint_attention(x, P, num_heads=2, depth=0)
    np.testing.assert_array_equal(auto, D.dint_attention(x, P, num_heads=2, depth=0, integral="causal"))
    assert np.abs(auto - D.dint_attention(x, P, num_heads=2, depth=0, integral="all")).max() > 1e-6
    with pytest.raises(ValueError, match="integral"):
        D.dint_attention(x, P, num_heads=2, depth=0, integral="mean")


# ------------------------------------------------------------------------------ DEX


def test_dex_matches_fig9_pseudocode():
    # Kong, Jang, Kwak (NeurIPS 2025) Fig. 9, transcribed line by line:
    #   def Attn(X, W_q, W_k, W_v, f_D, lam, do):
    #       Q, K, V = X @ W_q, X @ W_k, X @ W_v ; s = 1 / sqrt(d) ; A = Q @ K.transpose(-1, -2) * s
    #       O = softmax(A) @ V ; O = O - lam * f_D(O) if do else O ; return O
    #   def MHA(X, ..., f_D, W_o, lam, hs):
    #       O = [Attn(X, ..., lam, do=(i in hs)) for i in range(h)] ; return Concat(O) @ W_o
    rng = np.random.default_rng(32)
    B, n, C, H, d, dv = 2, 5, 6, 3, 2, 3
    x = rng.standard_normal((B, n, C))
    P = DEX._dex_params(rng, C, H, H, d, dv, bias=False)
    hs = [0, 2]
    out = D.dex_differential_adaptation(x, P, num_heads=H, heads=hs, is_causal=False)
    lam = P["lambda"][0]

    def f_D(o):
        return o @ P["f_D.weight"]

    def attn(i, do):
        Q = x @ P["q_proj.weight"][:, i * d:(i + 1) * d]
        K = x @ P["k_proj.weight"][:, i * d:(i + 1) * d]
        V = x @ P["v_proj.weight"][:, i * dv:(i + 1) * dv]
        A = Q @ np.swapaxes(K, -1, -2) * (1 / math.sqrt(d))
        e = np.exp(A - A.max(-1, keepdims=True))
        O = (e / e.sum(-1, keepdims=True)) @ V
        return O - lam * f_D(O) if do else O

    ref = np.concatenate([attn(i, do=(i in hs)) for i in range(H)], axis=-1) @ P["o_proj.weight"]
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-13)

@pytest.mark.parametrize("per_head", [False, True])
def test_dex_matches_torch_autograd(per_head):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(21)
    B, n, C, H, Hkv, d, dv = 2, 5, 6, 4, 2, 2, 3
    x = rng.standard_normal((B, n, C))
    P = DEX._dex_params(rng, C, H, Hkv, d, dv, per_head=per_head)
    rel = D.rope_tables(n, d)
    cfg = dict(num_heads=H, num_kv_heads=Hkv, heads=[1, 3], rel_pos=rel)
    out, cache = D.dex_differential_adaptation_forward(x, P, **cfg)
    xt = torch.from_numpy(x).requires_grad_()
    T = {k: torch.from_numpy(v).requires_grad_() for k, v in P.items()}
    cos, sin = (torch.from_numpy(t)[:, None, :] for t in rel)

    def rope_half(t):  # rotate-half (GPT-NeoX / HF Llama), t (B, N, heads, d)
        a, b = t[..., : d // 2], t[..., d // 2:]
        return torch.cat([a * cos - b * sin, a * sin + b * cos], -1)

    q = rope_half((xt @ T["q_proj.weight"]).view(B, n, H, d)).transpose(1, 2)
    k = rope_half((xt @ T["k_proj.weight"]).view(B, n, Hkv, d)).transpose(1, 2)
    v = (xt @ T["v_proj.weight"]).view(B, n, Hkv, dv).transpose(1, 2)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    f = torch.einsum("bhnd,hde->bhne", o, T["f_D.weight"]) if per_head else o @ T["f_D.weight"]
    f = f + T["f_D.bias"]
    sel = torch.tensor([0.0, 1.0, 0.0, 1.0], dtype=torch.float64)[:, None, None]
    o = o - T["lambda"][0] * sel * f
    yt = o.transpose(1, 2).reshape(B, n, H * dv) @ T["o_proj.weight"]
    np.testing.assert_allclose(out, yt.detach().numpy(), rtol=1e-11, atol=1e-12)
    g = rng.standard_normal(out.shape)
    yt.backward(torch.from_numpy(g))
    grads = D.dex_differential_adaptation_backward(g, cache)
    np.testing.assert_allclose(grads["x"], xt.grad.numpy(), rtol=1e-10, atol=1e-12)
    for key, t in T.items():
        np.testing.assert_allclose(grads[key], t.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=key)


def test_dex_bad_heads():
    rng = np.random.default_rng(22)
    x = rng.standard_normal((2, 3, 3))
    P = DEX._dex_params(rng, 3, 2, 2, 2, 2)
    with pytest.raises(ValueError, match="heads"):
        D.dex_differential_adaptation(x, P, num_heads=2, heads=[2])
    with pytest.raises(ValueError, match="lambda"):
        D.dex_differential_adaptation(x, dict(P, **{"lambda": np.ones(2)}), num_heads=2)


# ------------------------------------------------------------------------------ DiffLoRA, Shared DIFF


@pytest.mark.parametrize("mode", ["base_lora", "lora_only", "full"])
def test_difflora_matches_torch_autograd(mode):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(23)
    B, n, C, H, Hkv, d, r = 2, 5, 6, 4, 2, 2, 2
    x = rng.standard_normal((B, n, C))
    P = S.two_branch_params(rng, C, H, Hkv, d, d, r, LORA._LLAMA_NAMES, negative_term=mode, reparam=True,
                             norm=True, lambda_init=0.3)
    cfg = dict(num_heads=H, num_kv_heads=Hkv, lambda_init=0.3, lambda_mode="reparam", negative_term=mode,
               lora_scale=0.5, subln="rms")
    out, cache = D.difflora_forward(x, P, **cfg)
    xt = torch.from_numpy(x).requires_grad_()
    T = {k: torch.from_numpy(v).requires_grad_() for k, v in P.items()}

    def branch(t, a):
        if a == "2" and mode == "full":
            return xt @ T[f"{t[0]}2_proj.weight"]
        lora = 0.5 * (xt @ T[f"{t}.lora_A{a}"]) @ T[f"{t}.lora_B{a}"]
        return lora if (a == "2" and mode == "lora_only") else xt @ T[f"{t}.weight"] + lora

    heads = lambda y, h: y.view(B, n, h, d).transpose(1, 2)  # noqa: E731
    v = heads(xt @ T["v_proj.weight"], Hkv)
    o = []
    for a in ("1", "2"):
        o.append(F.scaled_dot_product_attention(heads(branch("q_proj", a), H), heads(branch("k_proj", a), Hkv), v,
                                                is_causal=True, enable_gqa=True))
    lam = (torch.exp(torch.sum(T["lambda_q1"] * T["lambda_k1"])) - torch.exp(torch.sum(T["lambda_q2"] * T["lambda_k2"]))
           + 0.3)
    z = o[0] - lam * o[1]
    z = z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + 1e-5) * T["subln.weight"] * (1 - 0.3)
    yt = z.transpose(1, 2).reshape(B, n, H * d) @ T["o_proj.weight"]
    np.testing.assert_allclose(out, yt.detach().numpy(), rtol=1e-11, atol=1e-12)
    g = rng.standard_normal(out.shape)
    yt.backward(torch.from_numpy(g))
    grads = D.difflora_backward(g, cache)
    np.testing.assert_allclose(grads["x"], xt.grad.numpy(), rtol=1e-10, atol=1e-12)
    for key, t in T.items():
        np.testing.assert_allclose(grads[key], t.grad.numpy(), rtol=1e-9, atol=1e-12, err_msg=key)


def test_difflora_requires_lambda_init_and_mode_params():
    rng = np.random.default_rng(24)
    x = rng.standard_normal((2, 3, 3))
    P = S.two_branch_params(rng, 3, 2, 2, 2, 2, 1, LORA._LLAMA_NAMES)
    with pytest.raises(TypeError):
        LORA.difflora(x, P, num_heads=2)
    with pytest.raises(ValueError, match="missing"):
        LORA.difflora(x, P, num_heads=2, lambda_init=0.5, lambda_mode="reparam")
    with pytest.raises(ValueError, match="negative_term"):
        LORA.difflora(x, P, num_heads=2, lambda_init=0.5, negative_term="both")


def _bergen_difflora_reference(x, P, *, H, Hkv, d, s, lam_init, learn_lambda, lora_negative_term_only,
                               negative_term_lora_only, negative_term_full_dim, groupnorm, rescale_version, cos, sin):
    """Transcription of AlexandreMisrahi2005/bergen models/generators/DiffTransformer/
    llama_lora_diff_transformer_model.py, LlamaLoraDiffAttention.forward (eager path, dropout off);
    rescale_version "85450b0" multiplies by (1 - self.lambda_init) always, "26c5a58" by
    (1 - lambda_full) inside `if self.subln is not None` only."""
    B, n, _ = x.shape
    lin = lambda W: x @ W                                                   # noqa: E731
    lora = lambda t, a: lin(P[f"{t}.lora_A{a}"]) @ P[f"{t}.lora_B{a}"] * s  # noqa: E731
    query_states, key_states, value_states = lin(P["q_proj.weight"]), lin(P["k_proj.weight"]), lin(P["v_proj.weight"])
    if not lora_negative_term_only:
        q1, k1 = query_states + lora("q_proj", "1"), key_states + lora("k_proj", "1")
    else:
        q1, k1 = query_states, key_states
    if negative_term_full_dim:
        q2, k2 = lin(P["q2_proj.weight"]), lin(P["k2_proj.weight"])
    elif negative_term_lora_only:
        q2, k2 = lora("q_proj", "2"), lora("k_proj", "2")
    else:
        q2, k2 = query_states + lora("q_proj", "2"), key_states + lora("k_proj", "2")
    heads = lambda y, h: y.reshape(B, n, h, d).transpose(0, 2, 1, 3)      # noqa: E731

    def rope(t):                                                            # apply_rotary_pos_emb (rotate_half)
        c = np.concatenate([cos, cos], -1)[:n]
        sn = np.concatenate([sin, sin], -1)[:n]
        rot = np.concatenate([-t[..., d // 2:], t[..., : d // 2]], -1)
        return t * c + rot * sn

    q1, q2 = rope(heads(q1, H)), rope(heads(q2, H))
    k1, k2 = rope(heads(k1, Hkv)), rope(heads(k2, Hkv))
    rep = H // Hkv                                                          # repeat_kv
    k1, k2, v = (np.repeat(t, rep, axis=1) for t in (k1, k2, heads(value_states, Hkv)))
    causal = np.where(np.tril(np.ones((n, n), bool)), 0.0, -np.inf)

    def softmax(a):
        e = np.exp(a - a.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    w1 = softmax(q1 @ k1.transpose(0, 1, 3, 2) / math.sqrt(d) + causal)
    w2 = softmax(q2 @ k2.transpose(0, 1, 3, 2) / math.sqrt(d) + causal)
    if learn_lambda:
        lambda_full = (np.exp(np.sum(P["lambda_q1"] * P["lambda_k1"])) - np.exp(np.sum(P["lambda_q2"] * P["lambda_k2"]))
                       + lam_init)
    else:
        lambda_full = lam_init
    o = (w1 - lambda_full * w2) @ v
    if rescale_version == "85450b0":
        if groupnorm:
            o = o / np.sqrt(np.mean(o * o, -1, keepdims=True) + 1e-5) * P["subln.weight"]
        o = o * (1 - lam_init)
    elif groupnorm:
        o = o / np.sqrt(np.mean(o * o, -1, keepdims=True) + 1e-5) * P["subln.weight"]
        o = o * (1 - lambda_full)
    return o.transpose(0, 2, 1, 3).reshape(B, n, -1) @ P["o_proj.weight"]


@pytest.mark.parametrize("negative,positive", [("base_lora", "base_lora"), ("lora_only", "base_lora"),
                                               ("full", "base_lora"), ("base_lora", "base"), ("full", "base")])
@pytest.mark.parametrize("learn_lambda", [False, True])
@pytest.mark.parametrize("rescale,groupnorm", [("lambda_init", True), ("lambda_init", False),
                                               ("lambda_with_norm", True), ("lambda_with_norm", False)])
def test_difflora_matches_bergen_eager(negative, positive, learn_lambda, rescale, groupnorm):
    rng = np.random.default_rng(41)
    B, n, C, H, Hkv, d, r = 2, 5, 8, 4, 2, 4, 3
    x = rng.standard_normal((B, n, C))
    P = S.two_branch_params(rng, C, H, Hkv, d, d, r, LORA._LLAMA_NAMES, negative_term=negative,
                             positive_term=positive, reparam=learn_lambda, norm=groupnorm, lambda_init=0.35)
    cos, sin = D.rope_tables(n, d)
    out = LORA.difflora(x, P, num_heads=H, num_kv_heads=Hkv, lambda_init=0.35,
                      lambda_mode="reparam" if learn_lambda else "fixed", negative_term=negative,
                      positive_term=positive, rel_pos=(cos, sin), subln="rms" if groupnorm else "none",
                      rescale=rescale)   # lora_scale default 2.0 = attention_lora_alpha / attention_lora_r = 64 / 32
    ref = _bergen_difflora_reference(
        x, P, H=H, Hkv=Hkv, d=d, s=2.0, lam_init=0.35, learn_lambda=learn_lambda,
        lora_negative_term_only=positive == "base", negative_term_lora_only=negative == "lora_only",
        negative_term_full_dim=negative == "full", groupnorm=groupnorm,
        rescale_version="85450b0" if rescale == "lambda_init" else "26c5a58", cos=cos, sin=sin)
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-13)


def test_difflora_lambda_with_norm_gradcheck():
    # (1 - lambda) after the norm makes lambda's gradient pick up -<dN, N>: FD check of every input.
    from refattn.registry import Sample
    from refattn.testing import gradcheck

    rng = np.random.default_rng(42)
    B, n, C, H, Hkv, d, r = 2, 3, 3, 2, 1, 2, 1
    P = S.two_branch_params(rng, C, H, Hkv, d, d, r, LORA._LLAMA_NAMES, reparam=True, norm=True, lambda_init=0.3)
    s = Sample(inputs={"x": rng.standard_normal((B, n, C))}, params=P,
               config={"num_heads": H, "num_kv_heads": Hkv, "lambda_init": 0.3, "lambda_mode": "reparam",
                       "rescale": "lambda_with_norm", "rel_pos": D.rope_tables(n, d)})
    gradcheck(D.difflora_forward, D.difflora_backward, s, rtol=1e-6)


def test_difflora_rescale_aliases_and_validation():
    rng = np.random.default_rng(43)
    x = rng.standard_normal((2, 3, 4))
    P = S.two_branch_params(rng, 4, 2, 2, 2, 2, 1, LORA._LLAMA_NAMES, norm=True)
    a = LORA.difflora(x, P, num_heads=2, lambda_init=0.4)
    np.testing.assert_array_equal(a, LORA.difflora(x, P, num_heads=2, lambda_init=0.4, rescale=True))
    np.testing.assert_array_equal(LORA.difflora(x, P, num_heads=2, lambda_init=0.4, rescale="none"),
                                  LORA.difflora(x, P, num_heads=2, lambda_init=0.4, rescale=False))
    # fixed lambda with a norm: (1 - lambda) and (1 - lambda_init) coincide
    np.testing.assert_allclose(a, LORA.difflora(x, P, num_heads=2, lambda_init=0.4, rescale="lambda_with_norm"),
                               rtol=1e-14, atol=1e-15)
    with pytest.raises(ValueError, match="rescale"):
        LORA.difflora(x, P, num_heads=2, lambda_init=0.4, rescale="lambda")
    with pytest.raises(ValueError, match="positive_term"):
        LORA.difflora(x, P, num_heads=2, lambda_init=0.4, positive_term="lora_only")
    with pytest.raises(ValueError, match="unknown keys"):   # positive_term="base" takes no *_A1/_B1 adapters
        LORA.difflora(x, P, num_heads=2, lambda_init=0.4, positive_term="base")

def test_shared_diff_zero_updates_tie_the_maps():
    # zero low-rank updates: Q1 = Q2, K1 = K2, so the pre-norm output is (1 - lambda) A V
    rng = np.random.default_rng(25)
    B, n, C, H, d = 2, 4, 4, 2, 2
    x = rng.standard_normal((B, n, C))
    P = S.two_branch_params(rng, C, H, H, d, 2 * d, 1, SHARED._SHARED_NAMES, reparam=True, zero_B=True,
                             lambda_init=0.2)
    out, cache = D.shared_diff_attention_forward(x, P, num_heads=H, depth=0, subln="none", rescale=False)
    lam = float(cache["hc"]["core"]["lam_b"].reshape(-1)[0])
    q = _split(x @ P["q_proj.weight"], H, d)
    k = _split(x @ P["k_proj.weight"], H, d)
    v = _split(x @ P["v_proj.weight"], H, 2 * d)
    from refattn.attention.softmax import sdpa

    ref = np.swapaxes((1 - lam) * sdpa(q, k, v, is_causal=True), 1, 2).reshape(B, n, -1) @ P["out_proj.weight"]
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-13)


def _split(y, h, w):
    return np.swapaxes(y.reshape(y.shape[:-1] + (h, w)), 1, 2)


# ------------------------------------------------------------------------------ differential cross-attention


def test_cross_attention_matches_torch_autograd():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(26)
    B, H, Hkv, n, m1, m2, d, dv = 2, 4, 2, 3, 6, 4, 3, 5
    arrs = dict(q1=rng.standard_normal((B, H, n, d)), k1=rng.standard_normal((B, Hkv, m1, d)),
                v1=rng.standard_normal((B, Hkv, m1, dv)), q2=rng.standard_normal((B, H, n, d)),
                k2=rng.standard_normal((B, Hkv, m2, d)), v2=rng.standard_normal((B, Hkv, m2, dv)),
                lam=rng.standard_normal((B, H, n)))
    keep2 = rng.random((n, m2)) > 0.5
    keep2[0, 0] = True
    keep2[1] = False  # an empty subset for query 1: branch 2 contributes 0 there
    out, cache = D.differential_cross_attention_forward(**arrs, attn_mask2=keep2)
    T = {k: torch.from_numpy(v).requires_grad_() for k, v in arrs.items()}
    o1 = F.scaled_dot_product_attention(T["q1"], T["k1"], T["v1"], enable_gqa=True)
    add = torch.from_numpy(np.where(keep2, 0.0, -1e300))  # finite stand-in for -inf (torch gives NaN rows)
    o2 = F.scaled_dot_product_attention(T["q2"], T["k2"], T["v2"], attn_mask=add, enable_gqa=True)
    o2 = o2 * torch.from_numpy(keep2.any(-1)[:, None].astype(float))
    yt = o1 - T["lam"][..., None] * o2
    np.testing.assert_allclose(out, yt.detach().numpy(), rtol=1e-11, atol=1e-12)
    g = rng.standard_normal(out.shape)
    yt.backward(torch.from_numpy(g))
    grads = D.differential_cross_attention_backward(g, cache)
    for key, t in T.items():
        np.testing.assert_allclose(grads[key], t.grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=key)


def test_cross_attention_validation():
    rng = np.random.default_rng(27)
    q = rng.standard_normal((2, 2, 3, 2))
    k = rng.standard_normal((2, 1, 4, 2))
    with pytest.raises(ValueError, match="v2"):
        D.differential_cross_attention(q, k, k, q, k, k[..., :1], np.ones(1))
    with pytest.raises(ValueError, match="attn_mask2"):
        D.differential_cross_attention(q, k, k, q, k, k, np.ones(1), attn_mask2=np.ones((3, 5), bool))


def test_v1_halves_pairing_is_a_column_permutation_of_adjacent():
    # pairing="halves" reads Q1/Q2 (and flash K1/K2) from the two halves of q_proj; permuting the
    # columns into adjacent order must give the adjacent layout's output exactly.
    rng = np.random.default_rng(28)
    B, n, C, H, Hkv, d = 2, 4, 5, 2, 1, 2
    x = rng.standard_normal((B, n, C))
    P = S.v1_params(rng, C, H, Hkv, d)
    halves = D.diff_attention_v1(x, P, num_heads=H, num_kv_heads=Hkv, depth=1, pairing="halves",
                                 gqa_pairing="flash")

    def to_adjacent(w, heads):
        cols = w.reshape(w.shape[0], 2, heads, d)  # (C, branch, head, d)
        return np.swapaxes(cols, 1, 2).reshape(w.shape[0], -1)

    Q = dict(P, **{"q_proj.weight": to_adjacent(P["q_proj.weight"], H),
                   "k_proj.weight": to_adjacent(P["k_proj.weight"], Hkv)})
    adjacent = D.diff_attention_v1(x, Q, num_heads=H, num_kv_heads=Hkv, depth=1, gqa_pairing="flash")
    np.testing.assert_array_equal(halves, adjacent)
    assert np.abs(halves - D.diff_attention_v1(x, P, num_heads=H, num_kv_heads=Hkv, depth=1,
                                               gqa_pairing="flash")).max() > 1e-6


def _softmax(a, axis):
    e = np.exp(a - a.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def test_fda_matches_xbert_fda():
    # michaeltian108/FDA finetune/models/xbert_FDA.py (commit 3346ed8), BertSelfAttention.forward, FDA branch:
    #   attention_scores = q @ k^T / sqrt(d) + mask ; fda_attention_scores = q(fda_hidden) @ k^T / sqrt(d) + mask
    #   probs_ver = Softmax(-1)(scores) ; probs_hor = Softmax(-2)(scores) ; same for fda
    #   mask[:, 6:] = 0 (FDA on the first half of the heads)
    #   hor = (probs_hor - gate * fda_hor * mask).relu() ; ver = (probs_ver - gate * fda_ver * mask).relu()
    #   attention_probs = torch.clamp_max(hor, ver) ; context = attention_probs @ v
    rng = np.random.default_rng(51)
    B, H, N, M, d = 2, 4, 5, 6, 3
    q, q_fda = rng.standard_normal((2, B, H, N, d))
    k, v = rng.standard_normal((2, B, H, M, d))
    pad = np.zeros((B, 1, 1, M))
    pad[0, ..., -2:] = -10000.0                      # HF extended key-padding mask
    gate = 0.7
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d) + pad
    fda_scores = q_fda @ k.transpose(0, 1, 3, 2) / math.sqrt(d) + pad
    head_mask = np.ones((1, H, 1, 1))
    head_mask[:, H // 2:] = 0.0
    hor = np.maximum(_softmax(scores, -2) - gate * _softmax(fda_scores, -2) * head_mask, 0.0)
    ver = np.maximum(_softmax(scores, -1) - gate * _softmax(fda_scores, -1) * head_mask, 0.0)
    ref = np.minimum(hor, ver) @ v
    lam = gate * head_mask[0, :, :, 0]               # (H, 1): the gate on the FDA heads, 0 elsewhere
    out = D.differential_cross_attention(q, k, v, q_fda, k, v, lam, attn_mask=pad, attn_mask2=pad, combine="fda")
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-13)
    # a boolean key-padding mask gives the same output (P^k = 0 on padded keys makes A = 0 there)
    keep = pad == 0
    out_b = D.differential_cross_attention(q, k, v, q_fda, k, v, lam, attn_mask=keep, attn_mask2=keep,
                                            combine="fda")
    np.testing.assert_allclose(out_b, ref, rtol=1e-12, atol=1e-13)


def test_fda_matches_torch_autograd():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(52)
    B, H, Hkv, N, M, d, dv = 2, 4, 2, 4, 5, 3, 2
    q1, q2 = rng.standard_normal((2, B, H, N, d))
    k1, k2 = rng.standard_normal((2, B, Hkv, M, d))
    v1, v2 = rng.standard_normal((2, B, Hkv, M, dv))
    lam = 0.4 + 0.3 * rng.standard_normal((H, 1))
    keep = rng.random((B, 1, N, M)) > 0.25
    keep[..., 0] = True
    arrs = dict(q1=q1, k1=k1, v1=v1, q2=q2, k2=k2, v2=v2, lam=lam)
    out, cache = D.differential_cross_attention_forward(**arrs, attn_mask=keep, attn_mask2=keep, combine="fda")
    T = {n_: torch.from_numpy(a).requires_grad_() for n_, a in arrs.items()}
    rep = lambda t: t.repeat_interleave(H // Hkv, dim=1)  # noqa: E731
    mask = torch.from_numpy(np.where(keep, 0.0, -np.inf))

    def probs(q, k):
        sc = q @ rep(k).transpose(-1, -2) / math.sqrt(d) + mask
        return torch.nan_to_num(torch.softmax(sc, -2)), torch.softmax(sc, -1)

    hor1, ver1 = probs(T["q1"], T["k1"])
    hor2, ver2 = probs(T["q2"], T["k2"])
    lam_t = T["lam"][..., None]
    hor = torch.relu(hor1 - lam_t * hor2)
    ver = torch.relu(ver1 - lam_t * ver2)
    yt = torch.clamp_max(hor, ver) @ rep(T["v1"])
    np.testing.assert_allclose(out, yt.detach().numpy(), rtol=1e-12, atol=1e-13)
    g = rng.standard_normal(out.shape)
    yt.backward(torch.from_numpy(g))
    grads = D.differential_cross_attention_backward(g, cache)
    for name_, t in T.items():
        tg = np.zeros_like(arrs[name_]) if t.grad is None else t.grad.numpy()
        np.testing.assert_allclose(grads[name_], tg, rtol=1e-10, atol=1e-12, err_msg=name_)


def test_gsra_differential_term_is_the_output_combination():
    # ming053l/PhaSR model.py (commit c2686d7), DifferentialWindowAttention.forward:
    #   attn_geo = softmax(q*scale @ k_geo^T + bias) ; attn_sem = softmax(q*scale @ k_sem^T + bias)
    #   lambda_val = sigmoid(lambda_q1 * lambda_k1) + lambda_init ; attn_diff = attn_sem - lambda_val * attn_geo
    #   x = attn_geo @ v_geo + attn_diff @ v_sem
    rng = np.random.default_rng(53)
    B, H, N, d = 2, 3, 4, 2
    q, k_geo, k_sem, v_geo, v_sem = rng.standard_normal((5, B, H, N, d))
    bias = 0.3 * rng.standard_normal((H, N, N))
    lq1, lk1 = 0.5 + 0.1 * rng.standard_normal(2)
    lambda_val = 1 / (1 + np.exp(-lq1 * lk1)) + D.lambda_init_fn(2)
    scale = d ** -0.5
    attn_geo = _softmax(q * scale @ k_geo.transpose(0, 1, 3, 2) + bias, -1)
    attn_sem = _softmax(q * scale @ k_sem.transpose(0, 1, 3, 2) + bias, -1)
    ref = attn_geo @ v_geo + (attn_sem - lambda_val * attn_geo) @ v_sem
    diff = D.differential_cross_attention(q, k_sem, v_sem, q, k_geo, v_sem, np.array([lambda_val]),
                                           attn_mask=bias, attn_mask2=bias)
    from refattn.attention.softmax import sdpa_forward

    np.testing.assert_allclose(diff + sdpa_forward(q, k_geo, v_geo, attn_mask=bias)[0], ref, rtol=1e-12, atol=1e-13)


def test_fda_validation():
    rng = np.random.default_rng(54)
    q = rng.standard_normal((1, 2, 3, 2))
    k = rng.standard_normal((1, 2, 4, 2))
    with pytest.raises(ValueError, match="k2 must have k1's shape"):
        D.differential_cross_attention(q, k, k, q, k[..., :3, :], k[..., :3, :], np.ones(1), combine="fda")
    with pytest.raises(ValueError, match="combine"):
        D.differential_cross_attention(q, k, k, q, k, k, np.ones(1), combine="map")
