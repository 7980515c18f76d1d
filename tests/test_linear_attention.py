"""Mechanism-specific tests for linear/kernel/set attention (the modules of refattn/attention/linear/:
katharopoulos, efficient, performer, transnormer, rpe_fft, set_transformer, sinkformer).

Generic checks (FD gradcheck, dtype, bad input, inputs-never-modified, batch independence) are
generated from the registry elsewhere; these cover the identities, PyTorch-autograd parity with
independent re-statements of the upstream formulas, the memory-light causal scan and edge cases.
"""

from __future__ import annotations

import numpy as np
import pytest

from refattn import registry
from refattn.attention.linear import (
    causal_linear_attention_backward,
    causal_linear_attention_forward,
    diag_attention_forward,
    efficient_attention_backward,
    efficient_attention_forward,
    kernelized_rpe,
    kernelized_rpe_backward,
    kernelized_rpe_forward,
    linear_attention,
    linear_attention_backward,
    linear_attention_explicit,
    linear_attention_forward,
    performer,
    performer_backward,
    performer_forward,
    performer_projection_matrix,
    set_transformer,
    set_transformer_backward,
    set_transformer_forward,
    sinkformer_attention,
    sinkformer_backward,
    sinkformer_forward,
    toeplitz_dense,
    toeplitz_matvec_fft,
    transnormer_backward,
    transnormer_forward,
)
from refattn.testing import run_record_checks

SLUGS = ["linear_attention_katharopoulos", "efficient_attention_shen", "performer_favor_plus",
         "transnormer_norm_attention", "set_transformer_blocks", "sinkformer_attention",
         "kernelized_attention_rpe_fft"]


@pytest.mark.parametrize("slug", SLUGS)
def test_record_checks_pass(slug):
    rec = registry.get(slug)
    assert rec.implemented
    res = run_record_checks(rec)
    bad = [(r.check, r.message) for r in res.results if not r.passed]
    assert not bad, bad


def _qkv(rng, b=2, h=2, n=6, m=None, d=3, dv=2):
    m = n if m is None else m
    return (rng.standard_normal((b, h, n, d)), rng.standard_normal((b, h, m, d)),
            rng.standard_normal((b, h, m, dv)))


def _torch_grads(torch, fn, arrays: dict, g: np.ndarray):
    ts = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in arrays.items()}
    out = fn(**ts)
    out.backward(torch.tensor(g))
    return out.detach().numpy(), {k: t.grad.numpy() for k, t in ts.items()}


def _assert_grads(ours: dict, theirs: dict, tol=1e-10):
    for k, v in theirs.items():
        np.testing.assert_allclose(ours[k], v, rtol=tol, atol=tol, err_msg=k)


# ------------------------------------------------------------------- Katharopoulos


@pytest.mark.parametrize("causal", [False, True])
def test_katharopoulos_torch_parity(causal):
    """fast-transformers' formulas (elu+1, einsum numerator, Z = 1/(Q.Ksum + eps)) under autograd."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    q, k, v = _qkv(rng, n=7)

    def ref(q, k, v):
        Q, K = torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1
        if causal:
            A = torch.tril(Q @ K.transpose(-1, -2))
            return (A @ v) / (A.sum(-1, keepdim=True) + 1e-6)
        KV = torch.einsum("bhnd,bhne->bhde", K, v)
        Z = 1 / (torch.einsum("bhnd,bhd->bhn", Q, K.sum(2)) + 1e-6)
        return torch.einsum("bhnd,bhde,bhn->bhne", Q, KV, Z)

    out, cache = linear_attention_forward(q, k, v, causal=causal)
    g = rng.standard_normal(out.shape)
    tout, tg = _torch_grads(torch, ref, {"q": q, "k": k, "v": v}, g)
    np.testing.assert_allclose(out, tout, rtol=1e-12, atol=1e-12)
    _assert_grads(linear_attention_backward(g, cache), tg)


def test_causal_scan_cache_is_memory_light():
    """The causal cache holds O(N d) arrays only: nothing of size N x N."""
    rng = np.random.default_rng(1)
    q, k, v = _qkv(rng, b=1, h=1, n=64, d=2, dv=2)
    out, cache = causal_linear_attention_forward(q, k, v, eps=1e-6, feature_map="elu_plus_one")

    def sizes(obj):
        if isinstance(obj, np.ndarray):
            yield obj.size
        elif isinstance(obj, dict):
            for x in obj.values():
                yield from sizes(x)

    assert max(sizes(cache)) <= 64 * 2
    np.testing.assert_allclose(out, linear_attention_explicit(q, k, v, causal=True), rtol=1e-12, atol=1e-13)
    g = causal_linear_attention_backward(np.ones_like(out), cache)
    assert set(g) == {"q", "k", "v"}


def test_causal_first_row_and_edge_sizes():
    rng = np.random.default_rng(2)
    q, k, v = _qkv(rng, n=5, d=1, dv=1)
    out = linear_attention(q, k, v, causal=True, eps=0.0)
    # the first query sees only the first key: its output is v_0 exactly
    np.testing.assert_allclose(out[..., 0, :], v[..., 0, :], rtol=1e-14)
    q1, k1, v1 = _qkv(rng, n=1)
    for causal in (False, True):
        o, c = linear_attention_forward(q1, k1, v1, causal=causal)
        assert o.shape == v1.shape and np.isfinite(o).all()
        np.testing.assert_allclose(o, v1, rtol=1e-5)  # one key: o = v * s / (s + eps)
    big = 1e4 * rng.standard_normal(q.shape)
    assert np.isfinite(linear_attention(big, big, v, causal=True)).all()


@pytest.mark.parametrize("causal", [False, True])
def test_key_padding_mask_removes_keys(causal):
    """Padded keys change nothing (values at padded positions are free) and get zero gradient;
    a query without any key outputs 0, also with eps = 0."""
    rng = np.random.default_rng(18)
    q, k, v = _qkv(rng, n=6)
    keep = np.ones(k.shape[:-1], dtype=bool)
    keep[0, :, 4:] = False
    out, cache = linear_attention_forward(q, k, v, causal=causal, key_padding_mask=keep)
    k2, v2 = k.copy(), v.copy()
    k2[0, :, 4:] += 3.0
    v2[0, :, 4:] -= 7.0
    np.testing.assert_allclose(linear_attention(q, k2, v2, causal=causal, key_padding_mask=keep), out,
                               rtol=1e-13, atol=1e-14)
    ref = linear_attention(q[:1, :, :], k[:1, :, :4], v[:1, :, :4]) if not causal else None
    if ref is not None:
        np.testing.assert_allclose(out[:1], ref, rtol=1e-12, atol=1e-13)
    g = linear_attention_backward(np.ones_like(out), cache)
    assert np.all(g["k"][0, :, 4:] == 0) and np.all(g["v"][0, :, 4:] == 0)
    none = np.zeros(k.shape[:-1], dtype=bool)
    o0, c0 = linear_attention_forward(q, k, v, causal=causal, eps=0.0, key_padding_mask=none)
    assert np.all(o0 == 0)
    assert all(np.isfinite(x).all() for x in linear_attention_backward(np.ones_like(o0), c0).values())
    with pytest.raises(TypeError, match="key_padding_mask"):
        linear_attention(q, k, v, key_padding_mask=keep.astype(float))
    with pytest.raises(ValueError, match="key_padding_mask"):
        linear_attention(q, k, v, key_padding_mask=keep[..., :5])


def test_linear_attention_bad_input_names_argument():
    rng = np.random.default_rng(3)
    q, k, v = _qkv(rng, n=4, m=5)
    with pytest.raises(ValueError, match="sequence length"):
        linear_attention(q, k, v, causal=True)
    with pytest.raises(ValueError, match="q.*k"):
        linear_attention(q, k[..., :2], v)
    with pytest.raises(ValueError, match="eps"):
        linear_attention(q, k, v, eps=-1.0)
    with pytest.raises(ValueError, match="feature_map"):
        linear_attention(q, k, v, feature_map="relu")
    with pytest.raises(ValueError, match="k must have q's leading"):
        linear_attention(q, k[:, :1], v[:, :1])


# ------------------------------------------------------------------- Efficient attention


@pytest.mark.parametrize("normalization", ["softmax", "scaling"])
def test_efficient_attention_torch_parity(normalization):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    q, k, v = _qkv(rng, n=5, m=7, d=4, dv=3)

    def ref(q, k, v):
        if normalization == "softmax":
            return q.softmax(-1) @ (k.softmax(-2).transpose(-1, -2) @ v)
        return (q @ k.transpose(-1, -2) / k.shape[-2]) @ v

    out, cache = efficient_attention_forward(q, k, v, normalization=normalization)
    g = rng.standard_normal(out.shape)
    tout, tg = _torch_grads(torch, ref, {"q": q, "k": k, "v": v}, g)
    np.testing.assert_allclose(out, tout, rtol=1e-12, atol=1e-12)
    _assert_grads(efficient_attention_backward(g, cache), tg)


# ------------------------------------------------------------------- Performer


def _torch_performer(torch, proj, *, causal, feps, guard, detach):
    W = torch.tensor(proj)

    def feats(x, is_query):
        a = x.shape[-1] ** -0.25
        dd = (a * x) @ W.T
        diag = (x * x).sum(-1, keepdim=True) / 2 * a * a
        stab = dd.amax(-1, keepdim=True) if is_query else dd.amax((-2, -1), keepdim=True)
        if detach:
            stab = stab.detach()
        return W.shape[0] ** -0.5 * (torch.exp(dd - diag - stab) + feps)

    def f(q, k, v):
        Q, K = feats(q, True), feats(k, False)
        A = Q @ K.transpose(-1, -2)
        if causal:
            A = torch.tril(A)
        R = A.sum(-1, keepdim=True)
        R = R + 2 * guard * (R.abs() <= guard)
        return (A @ v) / R

    return f


@pytest.mark.parametrize("causal,detach", [(False, False), (True, False), (False, True)])
def test_performer_torch_parity(causal, detach):
    """The JAX feature creator (no stop_gradient through the max) or performer-pytorch's detached
    stabilisers, re-stated in torch with autograd."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    q, k, v = _qkv(rng, n=6, d=4, dv=3)
    proj = performer_projection_matrix(7, 4, seed=11)
    kw = {"causal": causal, "feature_eps": 1e-3, "denominator_guard": 1e-6}
    out, cache = performer_forward(q, k, v, projection=proj, stabilizer_grad=not detach, **kw)
    g = rng.standard_normal(out.shape)
    fn = _torch_performer(torch, proj, causal=causal, feps=1e-3, guard=1e-6, detach=detach)
    tout, tg = _torch_grads(torch, fn, {"q": q, "k": k, "v": v}, g)
    np.testing.assert_allclose(out, tout, rtol=1e-11, atol=1e-12)
    _assert_grads(performer_backward(g, cache), tg)


def test_performer_stop_gradient_differs_with_eps():
    """With feature_eps > 0 the stabiliser no longer cancels: the stop-gradient backward is then a
    different (biased) gradient — the keyword matters."""
    rng = np.random.default_rng(6)
    q, k, v = _qkv(rng, n=6, d=4)
    proj = performer_projection_matrix(8, 4, seed=1)
    o, c1 = performer_forward(q, k, v, projection=proj, feature_eps=0.1)
    _, c2 = performer_forward(q, k, v, projection=proj, feature_eps=0.1, stabilizer_grad=False)
    g = np.ones_like(o)
    assert np.abs(performer_backward(g, c1)["q"] - performer_backward(g, c2)["q"]).max() > 1e-6


def test_performer_bad_projection():
    rng = np.random.default_rng(7)
    q, k, v = _qkv(rng)
    with pytest.raises(ValueError, match="projection"):
        performer(q, k, v, projection=np.ones((4, 5)))
    with pytest.raises(TypeError, match="projection"):
        performer(q, k, v, projection=np.ones((4, 3), dtype=int))
    with pytest.raises(ValueError, match="key_stabilizer"):
        performer(q, k, v, projection=np.ones((4, 3)), key_stabilizer="batch")


# ------------------------------------------------------------------- TransNormer


@pytest.mark.parametrize("causal", [False, True])
def test_transnormer_torch_parity(causal):
    """NormLinearAttention core: act(q) (act(k)^T v) (masked product when causal), heads
    concatenated, LayerNorm over embed_dim."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(8)
    q, k, v = _qkv(rng, n=5, d=3, dv=4)
    B, H, N, dv = v.shape
    params = {"layer_norm.weight": 1 + 0.3 * rng.standard_normal(H * dv),
              "layer_norm.bias": 0.3 * rng.standard_normal(H * dv)}

    def ref(q, k, v, w, b):
        Q, K = torch.nn.functional.elu(q) + 1, torch.nn.functional.elu(k) + 1
        W = Q @ K.transpose(-1, -2)
        if causal:
            W = torch.tril(W)
        o = (W @ v).permute(0, 2, 1, 3).reshape(B, N, H * dv)
        o = torch.nn.functional.layer_norm(o, (H * dv,), w, b, eps=1e-5)
        return o.reshape(B, N, H, dv).permute(0, 2, 1, 3)

    out, cache = transnormer_forward(q, k, v, params, causal=causal)
    g = rng.standard_normal(out.shape)
    arrays = {"q": q, "k": k, "v": v, "w": params["layer_norm.weight"], "b": params["layer_norm.bias"]}
    tout, tg = _torch_grads(torch, ref, arrays, g)
    np.testing.assert_allclose(out, tout, rtol=1e-11, atol=1e-12)
    ours = transnormer_backward(g, cache)
    ours["w"], ours["b"] = ours.pop("layer_norm.weight"), ours.pop("layer_norm.bias")
    _assert_grads(ours, tg)


def test_transnormer_params_validation():
    rng = np.random.default_rng(9)
    q, k, v = _qkv(rng)
    with pytest.raises(ValueError, match="layer_norm.weight"):
        transnormer_forward(q, k, v, {"layer_norm.weight": np.ones(3)})
    with pytest.raises(ValueError, match="keys"):
        transnormer_forward(q, k, v, {"weight": np.ones(4)})
    with pytest.raises(ValueError, match="norm_over"):
        transnormer_forward(q[0], k[0], v[0])


def test_diag_attention_is_block_local():
    rng = np.random.default_rng(10)
    q, k, v = _qkv(rng, n=6)
    out, _ = diag_attention_forward(q, k, v, block_size=3)
    v2 = v.copy()
    v2[..., 3:, :] += 5.0  # the second block must not affect the first
    out2, _ = diag_attention_forward(q, k, v2, block_size=3)
    np.testing.assert_allclose(out2[..., :3, :], out[..., :3, :], rtol=1e-14)
    assert np.abs(out2[..., 3:, :] - out[..., 3:, :]).min() > 1.0


# ------------------------------------------------------------------- Sinkformer


@pytest.mark.parametrize("n_iter,m", [(1, 5), (3, 5), (4, 7)])
def test_sinkformer_torch_parity(n_iter, m):
    """Upstream SinkhornDistance (dual potentials u, v; M = (-C + u + v)/eps; attn * shape[-1])
    re-stated in torch and differentiated by autograd."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(11)
    q, k, v = _qkv(rng, n=5, m=m, d=3, dv=2)
    eps = 0.8

    def ref(q, k, v):
        C = -(q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
        n_, m_ = C.shape[-2:]
        u = torch.zeros(C.shape[:-1], dtype=C.dtype)
        w = torch.zeros(C.shape[:-2] + (m_,), dtype=C.dtype)

        def M(u, w):
            return (-C + u.unsqueeze(-1) + w.unsqueeze(-2)) / eps

        for i in range(n_iter):
            if i % 2 == 0:
                u = eps * (np.log(1.0 / n_) - torch.logsumexp(M(u, w), dim=-1)) + u
            else:
                w = eps * (np.log(1.0 / m_) - torch.logsumexp(M(u, w).transpose(-2, -1), dim=-1)) + w
        return (torch.exp(M(u, w)) * m_) @ v

    out, cache = sinkformer_forward(q, k, v, n_iter=n_iter, eps=eps)
    g = rng.standard_normal(out.shape)
    tout, tg = _torch_grads(torch, ref, {"q": q, "k": k, "v": v}, g)
    np.testing.assert_allclose(out, tout, rtol=1e-11, atol=1e-12)
    _assert_grads(sinkformer_backward(g, cache), tg)


def test_sinkformer_stays_finite_for_large_scores():
    """Log domain: scores of a few hundred (Gibbs kernel underflow) stay finite."""
    rng = np.random.default_rng(12)
    q, k, v = _qkv(rng, n=6, d=3)
    out, cache = sinkformer_forward(30 * q, 30 * k, v, n_iter=5)
    assert np.isfinite(out).all()
    assert all(np.isfinite(x).all() for x in sinkformer_backward(np.ones_like(out), cache).values())


def test_sinkformer_bad_n_iter():
    q, k, v = _qkv(np.random.default_rng(0))
    with pytest.raises(ValueError, match="n_iter"):
        sinkformer_attention(q, k, v, n_iter=0)
    with pytest.raises(TypeError, match="n_iter"):
        sinkformer_attention(q, k, v, n_iter=2.0)


# ------------------------------------------------------------------- Set Transformer


def _torch_mab(torch, p, prefix, H, ln, full):
    def lin(x, name):
        return x @ p[f"{prefix}{name}.weight"] + p[f"{prefix}{name}.bias"]

    def mab(X, Y):
        Q, K, V = lin(X, "fc_q"), lin(Y, "fc_k"), lin(Y, "fc_v")
        D = Q.shape[-1]
        ds = D // H
        Q_, K_, V_ = (torch.cat(t.split(ds, 2), 0) for t in (Q, K, V))
        A = torch.softmax(Q_ @ K_.transpose(1, 2) / np.sqrt(D if full else ds), 2)
        O = torch.cat((Q_ + A @ V_).split(Q.shape[0], 0), 2)
        if ln:
            O = torch.nn.functional.layer_norm(O, (D,), p[f"{prefix}ln0.weight"], p[f"{prefix}ln0.bias"])
        O = O + torch.relu(lin(O, "fc_o"))
        if ln:
            O = torch.nn.functional.layer_norm(O, (D,), p[f"{prefix}ln1.weight"], p[f"{prefix}ln1.bias"])
        return O

    return mab


@pytest.mark.parametrize("block", ["mab", "sab", "isab", "pma"])
@pytest.mark.parametrize("ln,scale_dim", [(False, "full"), (True, "head")])
def test_set_transformer_torch_parity(block, ln, scale_dim):
    """Upstream modules.py semantics (head split by torch.cat(split), projected-query residual,
    1/sqrt(dim_V), O + relu(fc_o(O)), optional ln0/ln1) re-stated in torch with autograd."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(13)
    s = registry.get("set_transformer_blocks").sample(rng, "small", block=block, ln=ln, scale_dim=scale_dim)
    H = s.config["num_heads"]
    full = scale_dim == "full"
    out, cache = set_transformer_forward(**s.inputs, params=s.params, **s.config)
    g = rng.standard_normal(out.shape)
    tp = {kk: torch.tensor(vv, requires_grad=True) for kk, vv in s.params.items()}
    tx = {kk: torch.tensor(vv, requires_grad=True) for kk, vv in s.inputs.items()}
    B = s.inputs["x"].shape[0]
    if block == "mab":
        tout = _torch_mab(torch, tp, "", H, ln, full)(tx["x"], tx["y"])
    elif block == "sab":
        tout = _torch_mab(torch, tp, "", H, ln, full)(tx["x"], tx["x"])
    elif block == "isab":
        h = _torch_mab(torch, tp, "mab0.", H, ln, full)(tp["I"].repeat(B, 1, 1), tx["x"])
        tout = _torch_mab(torch, tp, "mab1.", H, ln, full)(tx["x"], h)
    else:
        tout = _torch_mab(torch, tp, "mab.", H, ln, full)(tp["S"].repeat(B, 1, 1), tx["x"])
    tout.backward(torch.tensor(g))
    np.testing.assert_allclose(out, tout.detach().numpy(), rtol=1e-11, atol=1e-12)
    ours = set_transformer_backward(g, cache)
    theirs = {kk: t.grad.numpy() for kk, t in {**tx, **tp}.items()}
    assert set(ours) == set(theirs)
    _assert_grads(ours, theirs)


def test_set_transformer_bad_config():
    s = registry.get("set_transformer_blocks").sample(np.random.default_rng(14), "tiny", block="sab", ln=False)
    with pytest.raises(ValueError, match="num_heads"):
        set_transformer(s.inputs["x"], params=s.params, block="sab", num_heads=3)
    with pytest.raises(ValueError, match="y"):
        set_transformer(s.inputs["x"], s.inputs["x"], params=s.params, block="sab")
    p = dict(s.params)
    p["fc_k.weight"] = p["fc_k.weight"][:2]
    with pytest.raises(ValueError, match="fc_k.weight"):
        set_transformer(s.inputs["x"], params=p, block="sab", num_heads=2)


# ------------------------------------------------------------------- RPE via FFT


@pytest.mark.parametrize("causal", [False, True])
def test_kernelized_rpe_torch_parity(causal):
    """Dense formula z = (A o C) V / (A o C) 1, C_ij = exp(b_{j-i}), under autograd (per-head b)."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(15)
    q, k, v = _qkv(rng, n=6, d=4, dv=3)
    n = q.shape[-2]
    proj = performer_projection_matrix(5, 4, seed=2)
    b = 0.5 * rng.standard_normal((q.shape[1], 2 * n - 1))
    W = torch.tensor(proj)
    idx = torch.tensor(np.arange(n)[None, :] - np.arange(n)[:, None] + n - 1)

    def feats(x, is_query):
        a = x.shape[-1] ** -0.25
        dd = (a * x) @ W.T
        diag = (x * x).sum(-1, keepdim=True) / 2 * a * a
        stab = dd.amax(-1, keepdim=True) if is_query else dd.amax((-2, -1), keepdim=True)
        return W.shape[0] ** -0.5 * (torch.exp(dd - diag - stab) + 1e-6)

    def ref(q, k, v, b):
        C = torch.exp(b)[:, idx]  # (H, N, N)
        if causal:
            C = torch.tril(C)
        A = (feats(q, True) @ feats(k, False).transpose(-1, -2)) * C
        return (A @ v) / A.sum(-1, keepdim=True)

    out, cache = kernelized_rpe_forward(q, k, v, {"b": b}, projection=proj, causal=causal)
    g = rng.standard_normal(out.shape)
    tout, tg = _torch_grads(torch, ref, {"q": q, "k": k, "v": v, "b": b}, g)
    np.testing.assert_allclose(out, tout, rtol=1e-11, atol=1e-12)
    _assert_grads(kernelized_rpe_backward(g, cache), tg)


def test_toeplitz_fft_long_sequence_matches_dense():
    rng = np.random.default_rng(16)
    n = 97  # odd, not a power of two
    c = rng.standard_normal(2 * n - 1)
    x = rng.standard_normal((n, 4))
    np.testing.assert_allclose(toeplitz_matvec_fft(c, x), toeplitz_dense(c) @ x, rtol=1e-10, atol=1e-11)


def test_kernelized_rpe_bad_b():
    rng = np.random.default_rng(17)
    q, k, v = _qkv(rng, n=4, d=3)
    proj = performer_projection_matrix(4, 3)
    with pytest.raises(ValueError, match="2N-1"):
        kernelized_rpe(q, k, v, {"b": np.zeros((2, 6))}, projection=proj)
    with pytest.raises(ValueError, match="broadcast"):
        kernelized_rpe(q, k, v, {"b": np.zeros((3, 7))}, projection=proj)
    with pytest.raises(ValueError, match="'b'"):
        kernelized_rpe(q, k, v, {"bias": np.zeros(7)}, projection=proj)


def test_linear_no_is_efficient_attention_on_learned_features():
    """Catalogue cross-entry identity: LinearNO (operators/linear_no.py) is Efficient Attention
    (softmax over features for Q, over positions for K) on the learned M-wide features."""
    from refattn.operators.linear_no import linear_no_attention, linear_no_init_params

    rng = np.random.default_rng(19)
    B, N, C, H, D, M = 2, 9, 5, 2, 3, 4
    p = linear_no_init_params(rng, C, n_head=H, dim_head=D, key_ratio=M)
    x = rng.standard_normal((B, N, C))
    xm = (x @ p["in_project_x.weight"] + p["in_project_x.bias"]).reshape(B, N, H, D).transpose(0, 2, 1, 3)
    y = efficient_attention_forward(xm @ p["to_q.weight"], xm @ p["to_k.weight"], xm @ p["to_v.weight"])[0]
    out = y.transpose(0, 2, 1, 3).reshape(B, N, H * D) @ p["to_out.0.weight"] + p["to_out.0.bias"]
    np.testing.assert_allclose(linear_no_attention(x, p, n_head=H), out, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("causal", [False, True])
def test_float32_stays_float32_in_every_mode(causal):
    """Regression: the Performer denominator guard promoted float32 to float64 (bool * Python
    float is float64) in the non-causal path."""
    rng = np.random.default_rng(20)
    q, k, v = (a.astype(np.float32) for a in _qkv(rng, n=5, d=3))
    proj = performer_projection_matrix(4, 3)
    outs = [performer_forward(q, k, v, projection=proj, causal=causal),
            linear_attention_forward(q, k, v, causal=causal),
            kernelized_rpe_forward(q, k, v, {"b": np.zeros(9, np.float32)}, projection=proj, causal=causal),
            transnormer_forward(q, k, v, causal=causal)]
    for (out, cache), bwd in zip(outs, (performer_backward, linear_attention_backward, kernelized_rpe_backward,
                                        transnormer_backward)):
        assert out.dtype == np.float32
        assert all(g.dtype == np.float32 for g in bwd(np.ones_like(out), cache).values())
