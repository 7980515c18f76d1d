"""Mechanism-specific tests of the operator-learning attention layers (catalogue family 3, part A).

Generic checks (FD gradcheck, dtype, bad input, inputs-never-modified …) are generated from the
registry elsewhere; these tests cover identities, PyTorch-autograd parity of the upstream
formulas and conventions.
"""

from __future__ import annotations

import numpy as np
import pytest

from refattn import registry
from refattn.nn.linear import merge_heads, split_heads
from refattn.operators import galerkin as gk
from refattn.testing import run_record_checks

SLUGS = ["galerkin_attention", "fourier_type_attention", "transolver_physics_attention",
         "linear_no_attention", "geotransolver_gale", "gnot_hna_attention", "gnot_geometric_gating_moe",
         "oformer_attention", "ipot_inducing_point_operator"]


@pytest.mark.parametrize("slug", SLUGS)
def test_record_checks_pass(slug):
    res = run_record_checks(registry.get(slug))
    bad = [(r.check, r.message) for r in res.results if not r.passed]
    assert not bad, bad


# ------------------------------------------------------------------------------- Galerkin / Fourier


def _torch_simple_attention(torch, x, pos, params, n_head, attention_type, norm_type, eps=1e-5):
    """The upstream SimpleAttention formula (eval mode, no dropout), written with torch ops."""
    b, n, c = x.shape
    d = c // n_head
    qkv = []
    for i in range(3):
        t = x @ params[f"linears.{i}.weight"] + params[f"linears.{i}.bias"]
        qkv.append(t.view(b, n, n_head, d).transpose(1, 2))
    q, k, v = qkv
    names = {"galerkin": ("k", "v"), "fourier": ("q", "k")}[attention_type]
    ops = {"q": q, "k": k, "v": v}
    for t in names:
        key = {"q": "norm_Q", "k": "norm_K", "v": "norm_V"}[t]
        if norm_type == "layer":
            ops[t] = torch.stack([torch.nn.functional.layer_norm(
                ops[t][:, h], (d,), params[f"{key}.weight"][h], params[f"{key}.bias"][h], eps)
                for h in range(n_head)], 1)
        else:
            ops[t] = torch.nn.functional.instance_norm(
                ops[t].reshape(b * n_head, n, d).transpose(1, 2), eps=eps
            ).transpose(1, 2).reshape(b, n_head, n, d)
            if f"{key}.weight" in params:   # upstream InstanceNorm1d(affine=True), one per head
                ops[t] = ops[t] * params[f"{key}.weight"][:, None] + params[f"{key}.bias"][:, None]
    pr = pos.unsqueeze(1).repeat(1, n_head, 1, 1)
    q, k, v = (torch.cat([pr, ops[t]], -1) for t in "qkv")
    if attention_type == "galerkin":
        z = q @ (k.transpose(-2, -1) @ v) / n
    else:
        z = (q @ k.transpose(-2, -1) / np.sqrt(q.shape[-1])) / n @ v
    z = z.transpose(1, 2).reshape(b, n, -1)
    return z @ params["fc.weight"] + params["fc.bias"]


@pytest.mark.parametrize("attention_type", ["galerkin", "fourier"])
@pytest.mark.parametrize("norm_type", ["layer", "instance"])
def test_simple_attention_torch_parity(attention_type, norm_type):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    x, pos = rng.standard_normal((2, 7, 6)), rng.random((2, 7, 2))
    params = gk.init_params(rng, 6, 3, pos_dim=2, attention_type=attention_type,
                            norm_type=norm_type, xavier_init=1.0, diagonal_weight=0.3)
    for k in params:
        params[k] = params[k] + 0.2 * rng.standard_normal(params[k].shape)
    fwd, bwd = {"galerkin": (gk.galerkin_attention_forward, gk.galerkin_attention_backward),
                "fourier": (gk.fourier_type_attention_forward, gk.fourier_type_attention_backward)}[attention_type]
    out, cache = fwd(x, params, pos, n_head=3, norm_type=norm_type)
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    tx, tpos = torch.tensor(x, requires_grad=True), torch.tensor(pos, requires_grad=True)
    tout = _torch_simple_attention(torch, tx, tpos, tp, 3, attention_type, norm_type)
    np.testing.assert_allclose(out, tout.detach().numpy(), rtol=1e-11, atol=1e-12)
    g = rng.standard_normal(out.shape)
    tout.backward(torch.tensor(g))
    grads = bwd(g, cache)
    np.testing.assert_allclose(grads["x"], tx.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(grads["pos"], tpos.grad.numpy(), rtol=1e-10, atol=1e-12)
    for k in params:
        np.testing.assert_allclose(grads[k], tp[k].grad.numpy(), rtol=1e-10, atol=1e-12, err_msg=k)


def test_galerkin_without_pos_has_no_fc_and_returns_heads():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 5, 4))
    params = gk.init_params(rng, 4, 2)
    assert "fc.weight" not in params
    out, cache = gk.galerkin_attention_forward(x, params, n_head=2)
    g = gk.galerkin_attention_backward(np.ones_like(out), cache)
    assert "pos" not in g and out.shape == x.shape
    with pytest.raises(ValueError, match="unknown keys"):
        gk.galerkin_attention_forward(x, gk.init_params(rng, 4, 2, pos_dim=1), n_head=2)


def test_galerkin_norm_types_differ_and_none_is_plain():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 6, 4))
    pl = gk.init_params(rng, 4, 2, xavier_init=1.0)
    pn = {k: v for k, v in pl.items() if k.startswith("linears")}
    a = gk.galerkin_attention(x, pl, n_head=2, norm_type="layer")
    b = gk.galerkin_attention(x, pn, n_head=2, norm_type="instance")
    c = gk.galerkin_attention(x, pn, n_head=2, norm_type=None)
    assert np.abs(a - b).max() > 1e-3
    q, k, v = (split_heads(x @ pn[f"linears.{i}.weight"], 2) for i in range(3))
    np.testing.assert_allclose(c, merge_heads(q @ (k.swapaxes(-1, -2) @ v) / 6), atol=1e-14)


def test_fourier_scale_keyword():
    rng = np.random.default_rng(4)
    x, pos = rng.standard_normal((2, 5, 4)), rng.random((2, 5, 1))
    params = gk.init_params(rng, 4, 2, pos_dim=1, attention_type="fourier", xavier_init=1.0)
    _, c1 = gk.fourier_type_attention_forward(x, params, pos, n_head=2)
    _, c2 = gk.fourier_type_attention_forward(x, params, pos, n_head=2, scale=1.0)
    assert c1["s"] == pytest.approx(1 / np.sqrt(3)) and c2["s"] == 1.0
    np.testing.assert_allclose(c1["zm"] * np.sqrt(3), c2["zm"], rtol=1e-12)


def test_galerkin_bad_inputs():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 5, 4))
    params = gk.init_params(rng, 4, 2, pos_dim=1)
    with pytest.raises(ValueError, match="divisible"):
        gk.galerkin_attention(x, params, rng.random((2, 5, 1)), n_head=3)
    with pytest.raises(ValueError, match="pos"):
        gk.galerkin_attention(x, params, rng.random((2, 4, 1)), n_head=2)
    with pytest.raises(ValueError, match="norm_type"):
        gk.galerkin_attention(x, params, rng.random((2, 5, 1)), n_head=2, norm_type="batch")
    bad = dict(params, **{"norm_K.weight": np.ones((2, 3))})
    with pytest.raises(ValueError, match="norm_K.weight"):
        gk.galerkin_attention(x, bad, rng.random((2, 5, 1)), n_head=2)


# ------------------------------------------------------------------------ Transolver family

from refattn.operators import gale, linear_no  # noqa: E402
from refattn.operators import transolver as ts  # noqa: E402


def _t(torch, params):
    return {k: torch.tensor(np.asarray(v), requires_grad=True) for k, v in params.items()}


def _torch_front(torch, x, tp, h, clamp, eps):
    """Transolver's slice step with torch ops (thuml Physics_Attention_1D / PhysicsNeMo)."""
    b, n, _ = x.shape
    d = tp["in_project_slice.weight"].shape[0]
    fx = (x @ tp["in_project_fx.weight"] + tp["in_project_fx.bias"]).reshape(b, n, h, d).permute(0, 2, 1, 3)
    xm = (x @ tp["in_project_x.weight"] + tp["in_project_x.bias"]).reshape(b, n, h, d).permute(0, 2, 1, 3)
    tau = tp["temperature"].reshape(1, h, 1, 1)
    if clamp is not None:
        tau = torch.clamp(tau, *clamp)
    w = torch.softmax((xm @ tp["in_project_slice.weight"] + tp["in_project_slice.bias"]) / tau, -1)
    tok = torch.einsum("bhnc,bhng->bhgc", fx, w) / (w.sum(2) + eps)[..., None]
    return w, tok


def _grad_parity(torch, out, tout, cache, backward, tensors, rng):
    np.testing.assert_allclose(out, tout.detach().numpy(), rtol=1e-11, atol=1e-12)
    g = rng.standard_normal(out.shape)
    tout.backward(torch.tensor(g))
    grads = backward(g, cache)
    assert set(grads) == set(tensors)
    for k, t in tensors.items():
        np.testing.assert_allclose(grads[k], t.grad.numpy(), rtol=1e-9, atol=1e-11, err_msg=k)


@pytest.mark.parametrize("clamp", [None, (0.1, 5.0)])
def test_transolver_torch_parity(clamp):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(10)
    params = ts.transolver_init_params(rng, 6, 2, 3, 4)
    params["temperature"] = np.array([0.05, 0.7])   # head 0 clamped when clamp is set
    x = rng.standard_normal((2, 9, 6))
    out, cache = ts.transolver_physics_attention_forward(x, params, n_head=2, tau_clamp=clamp)
    tp = _t(torch, params)
    tx = torch.tensor(x, requires_grad=True)
    w, tok = _torch_front(torch, tx, tp, 2, clamp, 1e-5)
    q, k, v = tok @ tp["to_q.weight"], tok @ tp["to_k.weight"], tok @ tp["to_v.weight"]
    z = torch.softmax(q @ k.transpose(-1, -2) * 3 ** -0.5, -1) @ v
    y = torch.einsum("bhgc,bhng->bhnc", z, w).permute(0, 2, 1, 3).reshape(2, 9, 6)
    tout = y @ tp["to_out.0.weight"] + tp["to_out.0.bias"]
    _grad_parity(torch, out, tout, cache, ts.transolver_physics_attention_backward,
                 dict(tp, x=tx), rng)
    if clamp is not None:
        assert cache["front"]["sm"]["t"][0] == 0.1


@pytest.mark.parametrize("use_temperature", [False, True])
def test_linear_no_torch_parity(use_temperature):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(11)
    params = linear_no.linear_no_init_params(rng, 6, 2, 3, 4, use_temperature=use_temperature)
    if use_temperature:
        params["temperature_q"] = np.array([0.3, 2.0])   # head 1 clamped to 1
    x = rng.standard_normal((2, 8, 6))
    out, cache = linear_no.linear_no_attention_forward(x, params, n_head=2, use_temperature=use_temperature)
    tp = _t(torch, params)
    tx = torch.tensor(x, requires_grad=True)
    xm = (tx @ tp["in_project_x.weight"] + tp["in_project_x.bias"]).reshape(2, 8, 2, 3).permute(0, 2, 1, 3)
    q, k, v = xm @ tp["to_q.weight"], xm @ tp["to_k.weight"], xm @ tp["to_v.weight"]
    if use_temperature:
        q = q / torch.clamp(tp["temperature_q"].reshape(1, 2, 1, 1), 0.01, 1)
        k = k / torch.clamp(tp["temperature_k"].reshape(1, 2, 1, 1), 0.01, 1)
    q, k = torch.softmax(q, -1), torch.softmax(k, -2)
    y = torch.einsum("bhnd,bhdc->bhnc", q, torch.einsum("bhnd,bhnc->bhdc", k, v))
    tout = y.permute(0, 2, 1, 3).reshape(2, 8, 6) @ tp["to_out.0.weight"] + tp["to_out.0.bias"]
    _grad_parity(torch, out, tout, cache, linear_no.linear_no_attention_backward, dict(tp, x=tx), rng)


@pytest.mark.parametrize("mode", ["weighted", "concat_project"])
def test_gale_torch_parity(mode):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(12)
    params = gale.gale_init_params(rng, 6, 2, 3, 4, context_dim=5, state_mixing_mode=mode)
    if mode == "weighted":
        params["state_mixing"] = np.array(0.4)
    params["temperature"] = np.array([0.8, 1.3])
    x, ctx = rng.standard_normal((2, 7, 6)), rng.standard_normal((2, 2, 3, 5))
    out, cache = gale.geotransolver_gale_forward(x, params, ctx, n_head=2, state_mixing_mode=mode)
    tp = _t(torch, params)
    tx, tc = torch.tensor(x, requires_grad=True), torch.tensor(ctx, requires_grad=True)
    w, tok = _torch_front(torch, tx, tp, 2, (0.5, 5.0), 1e-2)
    q, k, v = (tok @ tp["qkv_project.weight"]).split(3, -1)
    zs = F.scaled_dot_product_attention(q, k, v)
    zc = F.scaled_dot_product_attention(tok @ tp["cross_q.weight"] + tp["cross_q.bias"],
                                        tc @ tp["cross_k.weight"] + tp["cross_k.bias"],
                                        tc @ tp["cross_v.weight"] + tp["cross_v.bias"])
    if mode == "weighted":
        s = torch.sigmoid(tp["state_mixing"])
        z = s * zs + (1 - s) * zc
    else:
        z = F.gelu(torch.cat([zs, zc], -1) @ tp["concat_project.0.weight"] + tp["concat_project.0.bias"])
    y = torch.einsum("bhgc,bhng->bhnc", z, w).permute(0, 2, 1, 3).reshape(2, 7, 6)
    tout = y @ tp["out_linear.weight"] + tp["out_linear.bias"]
    _grad_parity(torch, out, tout, cache, gale.geotransolver_gale_backward,
                 dict(tp, x=tx, context=tc), rng)


def test_gale_without_context_zero_cross_grads():
    rng = np.random.default_rng(13)
    params = gale.gale_init_params(rng, 6, 2, 3, 4, context_dim=5)
    params["temperature"] = np.array([0.8, 1.3])
    x = rng.standard_normal((2, 7, 6))
    out, cache = gale.geotransolver_gale_forward(x, params, n_head=2)
    g = gale.geotransolver_gale_backward(np.ones_like(out), cache)
    assert np.all(g["cross_q.weight"] == 0) and g["state_mixing"] == 0 and "context" not in g
    core = {k: v for k, v in params.items() if not k.startswith(("cross", "state"))}
    np.testing.assert_array_equal(gale.geotransolver_gale(x, core, n_head=2), out)
    with pytest.raises(ValueError, match="context"):
        gale.geotransolver_gale(x, params, rng.standard_normal((2, 3, 3, 5)), n_head=2)


def test_transolver_bad_inputs():
    rng = np.random.default_rng(14)
    params = ts.transolver_init_params(rng, 6, 2, 3, 4)
    x = rng.standard_normal((2, 5, 6))
    with pytest.raises(ValueError, match="in_project_x.weight"):
        ts.transolver_physics_attention(x, params, n_head=3)
    with pytest.raises(ValueError, match="tau_clamp"):
        ts.transolver_physics_attention(x, params, n_head=2, tau_clamp=(5.0, 0.1))
    with pytest.raises(ValueError, match="temperature"):
        ts.transolver_physics_attention(x, dict(params, temperature=np.array([0.5, -1.0])), n_head=2)
    with pytest.raises(ValueError, match="slice_attention"):
        ts.transolver_physics_attention(x, params, n_head=2, slice_attention="none")


# ------------------------------------------------------------------------------------- GNOT

from refattn.operators import gnot, gnot_moe  # noqa: E402


@pytest.mark.parametrize("cross", [False, True])
@pytest.mark.parametrize("query_residual", [True, False])
def test_gnot_hna_torch_parity(cross, query_residual):
    """Upstream LinearAttention / LinearCrossAttention ('l1') restated with torch ops."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(20)
    c, h = 6, 2
    params = gnot.gnot_hna_init_params(rng, c, n_inputs=2 if cross else None)
    x = rng.standard_normal((2, 5, c))
    ys = [rng.standard_normal((2, 4, c)), rng.standard_normal((2, 7, c))] if cross else None
    out, cache = gnot.gnot_hna_attention_forward(x, params, ys, n_head=h, query_residual=query_residual)
    tp = _t(torch, params)
    tx = torch.tensor(x, requires_grad=True)
    tys = [torch.tensor(t, requires_grad=True) for t in ys] if cross else [tx]

    def heads(t):
        return t.view(2, t.shape[1], h, c // h).transpose(1, 2)

    q = heads(tx @ tp["query.weight"] + tp["query.bias"]).softmax(-1)
    z = q if query_residual else 0
    names = [("keys.0", "values.0"), ("keys.1", "values.1")] if cross else [("key", "value")]
    for (kn, vn), ty in zip(names, tys):
        k = heads(ty @ tp[f"{kn}.weight"] + tp[f"{kn}.bias"]).softmax(-1)
        v = heads(ty @ tp[f"{vn}.weight"] + tp[f"{vn}.bias"])
        d_inv = 1.0 / (q * k.sum(-2, keepdim=True)).sum(-1, keepdim=True)
        z = z + (q @ (k.transpose(-2, -1) @ v)) * d_inv
    tout = z.transpose(1, 2).reshape(2, 5, c) @ tp["proj.weight"] + tp["proj.bias"]
    tensors = dict(tp, x=tx)
    np.testing.assert_allclose(out, tout.detach().numpy(), rtol=1e-11, atol=1e-12)
    g = rng.standard_normal(out.shape)
    tout.backward(torch.tensor(g))
    grads = gnot.gnot_hna_attention_backward(g, cache)
    for k, t in tensors.items():
        np.testing.assert_allclose(grads[k], t.grad.numpy(), rtol=1e-9, atol=1e-11, err_msg=k)
    if cross:
        for gy, ty in zip(grads["y"], tys):
            np.testing.assert_allclose(gy, ty.grad.numpy(), rtol=1e-9, atol=1e-11)


def test_gnot_moe_torch_parity():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(21)
    params = gnot_moe.gnot_moe_init_params(rng, 4, 2, n_experts=3, n_inner=2)
    x, pos = rng.standard_normal((2, 6, 4)), rng.uniform(-1, 1, (2, 6, 2))
    out, cache = gnot_moe.gnot_geometric_gating_moe_forward(x, pos, params)
    tp = _t(torch, params)
    tx, tpos = torch.tensor(x, requires_grad=True), torch.tensor(pos, requires_grad=True)
    hgate = F.gelu(F.gelu(tpos @ tp["gatenet.0.weight"] + tp["gatenet.0.bias"]) @ tp["gatenet.2.weight"]
                   + tp["gatenet.2.bias"])
    gate = F.softmax(hgate @ tp["gatenet.4.weight"] + tp["gatenet.4.bias"], -1).unsqueeze(2)
    experts = torch.stack([F.gelu(tx @ tp["moe_mlp.0.weight"][k] + tp["moe_mlp.0.bias"][k])
                           @ tp["moe_mlp.2.weight"][k] + tp["moe_mlp.2.bias"][k] for k in range(3)], -1)
    tout = (gate * experts).sum(-1)
    _grad_parity(torch, out, tout, cache, gnot_moe.gnot_geometric_gating_moe_backward,
                 dict(tp, x=tx, pos=tpos), rng)


def test_gnot_hna_bad_inputs():
    rng = np.random.default_rng(22)
    x = rng.standard_normal((2, 5, 4))
    pc = gnot.gnot_hna_init_params(rng, 4, n_inputs=2)
    with pytest.raises(ValueError, match="need the input functions"):
        gnot.gnot_hna_attention(x, pc, n_head=2)
    with pytest.raises(ValueError, match="keys.1"):
        gnot.gnot_hna_attention(x, pc, [x], n_head=2)
    with pytest.raises(ValueError, match=r"y\[1\]"):
        gnot.gnot_hna_attention(x, pc, [x, rng.standard_normal((2, 3, 6))], n_head=2)
    with pytest.raises(ValueError, match="normaliser"):
        gnot.gnot_hna_attention(x, gnot.gnot_hna_init_params(rng, 4), n_head=2, normaliser="sum")


# ------------------------------------------------------------------------------------ OFormer

from refattn.operators import oformer  # noqa: E402


def _torch_rotate_half(torch, t):
    t1, t2 = t.chunk(2, -1)
    return torch.cat((-t2, t1), -1)


def _torch_rope2d(torch, t, pos, min_freq, scale):
    """OFormer's RotaryEmbedding + apply_2d_rotary_pos_emb restated with torch ops."""
    d = t.shape[-1]
    sub = d // 2
    inv = 1.0 / (10000 ** (torch.arange(0, sub, 2, dtype=torch.float64) / sub))
    parts = []
    for a, ta in enumerate((t[..., :sub], t[..., sub:])):
        f = torch.einsum("bn,j->bnj", pos[..., a] * (scale / min_freq), inv)
        f = torch.cat((f, f), -1)[:, None]
        parts.append(ta * f.cos() + _torch_rotate_half(torch, ta) * f.sin())
    return torch.cat(parts, -1)


@pytest.mark.parametrize("cross", [False, True])
@pytest.mark.parametrize("attn_type", ["galerkin", "fourier"])
def test_oformer_torch_parity_upstream_instance_norm(cross, attn_type):
    """norm_axis="channels" reproduces upstream's InstanceNorm1d on a (b h) n d tensor exactly."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(30)
    c, h, d = 8, 2, 4
    params = oformer.oformer_init_params(rng, c, h, d, cross=cross, attn_type=attn_type, init_gain=0.5)
    x, z = rng.standard_normal((2, 6, c)), rng.standard_normal((2, 9, c))
    xp, zp = rng.random((2, 6, 2)), rng.random((2, 9, 2))
    cfg = dict(n_head=h, attn_type=attn_type, norm_axis="channels", pos_mode="rope", x_pos=xp,
               z_pos=zp if cross else None, min_freq=1 / 64, rope_scale=1.0)
    out, cache = oformer.oformer_attention_forward(x, params, z if cross else None, **cfg)
    tp = _t(torch, params)
    tx, tz = torch.tensor(x, requires_grad=True), torch.tensor(z, requires_grad=True)

    def heads(t):
        return t.reshape(2, t.shape[1], h, d).transpose(1, 2)

    if cross:
        q = heads(tx @ tp["to_q.weight"])
        k, v = (heads(t) for t in (tz @ tp["to_kv.weight"]).chunk(2, -1))
        kpos = torch.tensor(zp)
    else:
        q, k, v = (heads(t) for t in (tx @ tp["to_qkv.weight"]).chunk(3, -1))
        kpos = torch.tensor(xp)
    ops = {"q": q, "k": k, "v": v}
    for t in ("k", "v") if attn_type == "galerkin" else ("q", "k"):
        ops[t] = torch.nn.functional.instance_norm(ops[t].reshape(2 * h, -1, d)).reshape(ops[t].shape)
    q = _torch_rope2d(torch, ops["q"], torch.tensor(xp), 1 / 64, 1.0)
    k = _torch_rope2d(torch, ops["k"], kpos, 1 / 64, 1.0)
    m = k.shape[2]
    if attn_type == "galerkin":
        zz = q @ (k.transpose(-1, -2) @ ops["v"]) / m
    else:
        zz = (q @ k.transpose(-1, -2)) @ ops["v"] / m
    tout = zz.transpose(1, 2).reshape(2, 6, h * d) @ tp["to_out.0.weight"] + tp["to_out.0.bias"]
    tensors = dict(tp, x=tx, z=tz) if cross else dict(tp, x=tx)
    _grad_parity(torch, out, tout, cache, oformer.oformer_attention_backward, tensors, rng)


def test_oformer_bad_inputs():
    rng = np.random.default_rng(31)
    params = oformer.oformer_init_params(rng, 4, 2, 2)
    x = rng.standard_normal((2, 5, 4))
    with pytest.raises(ValueError, match="norm_axis"):
        oformer.oformer_attention(x, params, n_head=2, norm_axis="both")
    with pytest.raises(ValueError, match="padding_mask"):
        oformer.oformer_attention(x, params, n_head=2, padding_mask=np.zeros((2, 5), bool))
    with pytest.raises(TypeError, match="padding_mask"):
        oformer.oformer_attention(x, params, n_head=2, padding_mask=np.ones((2, 5)))
    with pytest.raises(ValueError, match="N == M"):
        oformer.oformer_attention(x, oformer.oformer_init_params(rng, 4, 2, 2, cross=True),
                             rng.standard_normal((2, 7, 4)), n_head=2, weights=np.ones((2, 7)),
                             weights_placement="output")
    with pytest.raises(ValueError, match="rope"):
        oformer.oformer_attention(x, params, n_head=2, pos_mode="rope", x_pos=rng.random((2, 5, 2)))


# --------------------------------------------------------------------------------------- IPOT

from refattn.operators import ipot  # noqa: E402


@pytest.mark.parametrize("shared", [True, False])
def test_ipot_torch_parity(shared):
    """The upstream IPOT encoder/processor/decoder chain restated with torch ops."""
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(40)
    L, h = 2, 2
    params = ipot._perturbed(rng, ipot.ipot_init_params(rng, 3, 4, 2, num_latents=5, latent_channel=6,
                                                        num_layers=L, share_processor_weights=shared,
                                                        ff_mult=2))
    xin, xq = rng.standard_normal((2, 7, 3)), rng.standard_normal((2, 4, 4))
    cfg = dict(num_layers=L, encoder_heads=h, processor_heads=h, decoder_heads=h,
               share_processor_weights=shared)
    out, cache = ipot.ipot_inducing_point_operator_forward(xin, xq, params, **cfg)
    tp = _t(torch, params)
    ti, tq = torch.tensor(xin, requires_grad=True), torch.tensor(xq, requires_grad=True)

    def ln(t, key):
        return F.layer_norm(t, t.shape[-1:], tp[f"{key}.weight"], tp[f"{key}.bias"], 1e-5)

    def attn(prefix, a, c):
        inner = tp[f"{prefix}.to_q.weight"].shape[1]
        q = a @ tp[f"{prefix}.to_q.weight"]
        k, v = (c @ tp[f"{prefix}.to_kv.weight"]).split(inner, -1)
        q, k, v = (t.reshape(2, t.shape[1], h, inner // h).transpose(1, 2) for t in (q, k, v))
        o = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(2, a.shape[1], inner)
        return o @ tp[f"{prefix}.to_out.weight"] + tp[f"{prefix}.to_out.bias"]

    def ff(prefix, t):
        u, g = (t @ tp[f"{prefix}.net.0.weight"] + tp[f"{prefix}.net.0.bias"]).chunk(2, -1)
        return (u * F.gelu(g)) @ tp[f"{prefix}.net.3.weight"] + tp[f"{prefix}.net.3.bias"]

    z = tp["latents"].expand(2, -1, -1)
    z = attn("encoder_cross_attn.fn", ln(z, "encoder_cross_attn.norm"),
             ln(ti, "encoder_cross_attn.norm_context")) + z
    for layer in range(L):
        sa, fk = ("processor_self_attn", "processor_ff") if shared else (f"layers.{layer}.0", f"layers.{layer}.1")
        z = attn(f"{sa}.fn", ln(z, f"{sa}.norm"), z) + z
        z = ff(f"{fk}.fn", ln(z, f"{fk}.norm")) + z
    o = attn("decoder_cross_attn.fn", ln(tq, "decoder_cross_attn.norm"), ln(z, "decoder_cross_attn.norm_context"))
    tout = (ff("decoder_ff.fn", ln(o, "decoder_ff.norm")) + o) * 0.1
    _grad_parity(torch, out, tout, cache, ipot.ipot_inducing_point_operator_backward,
                 dict(tp, inputs=ti, query=tq), rng)


def test_ipot_bad_inputs():
    rng = np.random.default_rng(41)
    params = ipot.ipot_init_params(rng, 3, 4, 2, num_latents=5, latent_channel=6)
    xin, xq = rng.standard_normal((2, 7, 3)), rng.standard_normal((2, 4, 4))
    with pytest.raises(ValueError, match="encoder_heads"):
        ipot.ipot_inducing_point_operator(xin, xq, params, encoder_heads=4, processor_heads=2, decoder_heads=2)
    with pytest.raises(ValueError, match="query"):
        ipot.ipot_inducing_point_operator(xin, xq[:1], params, encoder_heads=2, processor_heads=2, decoder_heads=2)
    with pytest.raises(ValueError, match="mask"):
        ipot.ipot_inducing_point_operator(xin, xq, params, encoder_heads=2, processor_heads=2, decoder_heads=2,
                                          mask=np.zeros((2, 7), bool))
    with pytest.raises(ValueError, match="C_q == C_out"):
        ipot.ipot_inducing_point_operator(xin, xq, params, encoder_heads=2, processor_heads=2, decoder_heads=2,
                                          decoder_query_residual=True)
