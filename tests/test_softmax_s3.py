"""Position mechanisms (softmax family, slice s3): what the registry's generated tests cannot express.

Autograd parity with float64 ``torch`` transcriptions of each mechanism's *formula* (written here,
explicit per-pair forms, not the fast paths refattn uses), causal/padding locality tested by
perturbing tokens, gradient checks of configurations the records' samples do not draw, and an
analytic spectrum of the magnetic Laplacian. Parity with the official modules was measured in
scratch scripts (numbers on ``docs/softmax/positional-encodings.md``).
"""

from __future__ import annotations

import numpy as np
import pytest

from refattn.attention.softmax import (
    chiral_rope_attention_backward,
    chiral_rope_attention_forward,
    coca_attention_forward,
    init_coca_params,
    init_maglap_pe_params,
    init_rpe_key_query_params,
    init_urpe_params,
    maglap_pe_backward,
    maglap_pe_forward,
    maglap_stack,
    magnetic_laplacian_eigenpairs,
    magnetic_laplacian_matrix,
    rpe_key_query_backward,
    rpe_key_query_forward,
    urpe_attention_backward,
    urpe_attention_forward,
    urpe_bucket_ids,
)
from refattn.registry import Sample
from refattn.testing import gradcheck

torch = pytest.importorskip("torch")


def _t(a):
    return torch.tensor(np.asarray(a, dtype=np.float64), requires_grad=True)


def _grads_agree(ours, tensors, tol=1e-12):
    for name, t in tensors.items():
        want = t.grad.numpy() if t.grad is not None else np.zeros(t.shape)
        np.testing.assert_allclose(ours[name], want, atol=tol, rtol=0, err_msg=name)


# ------------------------------------------------------------------------------------------ CoCA


@pytest.mark.parametrize("mode", ["code", "closed_form"])
def test_coca_is_causal(mode):
    # With the causal mask, output token i must not change when a later token changes.
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 6, 8))
    p = init_coca_params(rng, 8, 2, 1)
    y0 = coca_attention_forward(x, p, num_heads=2, num_key_value_heads=1, coca_mode=mode)[0]
    x2 = x.copy()
    x2[:, 3] += 1.0
    y1 = coca_attention_forward(x2, p, num_heads=2, num_key_value_heads=1, coca_mode=mode)[0]
    assert np.abs(y1[:, :3] - y0[:, :3]).max() == 0.0
    assert np.abs(y1[:, 3:] - y0[:, 3:]).max() > 1e-6


def test_coca_code_mode_matches_torch_einsum():
    # The released model's three-operand product, S_ij = s * sum_c q_ic (R_i q_i)_c (R_j t_j)_c, in torch.
    rng = np.random.default_rng(1)
    b, n, c, h = 2, 5, 8, 2
    d, hd = c // h, c // h // 2
    x = rng.standard_normal((b, n, c))
    p = init_coca_params(rng, c, h, h)
    y = coca_attention_forward(x, p, num_heads=h, coca_mode="code", is_causal=False)[0]
    xt = torch.tensor(x)
    pt = {k: torch.tensor(v) for k, v in p.items()}
    q = (xt @ pt["q_proj.weight"]).view(b, n, h, d).transpose(1, 2)
    t = (xt @ pt["t_proj.weight"]).view(b, n, h, d).transpose(1, 2)
    v = (xt @ pt["v_proj.weight"]).view(b, n, h, d).transpose(1, 2)
    tau = torch.relu(0.5 * (t[..., :hd] + t[..., hd:]))
    tbar = torch.cat([tau, tau], -1)
    theta = 10000.0 ** (-2.0 * torch.arange(hd, dtype=torch.float64) / d)
    ang = torch.arange(n, dtype=torch.float64)[:, None] * theta
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)

    def rot(z):
        return z * cos + torch.cat([-z[..., hd:], z[..., :hd]], -1) * sin

    s = torch.einsum("bhid,bhjd,bhid->bhij", q, rot(tbar), rot(q)) / d ** 0.5
    o = torch.softmax(s, -1) @ v
    want = o.transpose(1, 2).reshape(b, n, c) @ pt["o_proj.weight"]
    np.testing.assert_allclose(y, want.numpy(), atol=1e-12, rtol=0)


# ------------------------------------------------------------------------------------ Chiral-RoPE


@pytest.mark.parametrize("interleaved", [False, True])
def test_chiral_rope_torch_autograd(interleaved):
    # S_ij = s q_i^T R(chi (theta_j - theta_i)) k_j, built per plane from the relative angle.
    rng = np.random.default_rng(2)
    b, h, n, d = 2, 2, 4, 6
    q, k, v = (rng.standard_normal((b, h, n, d)) for _ in range(3))
    th = rng.uniform(-np.pi, np.pi, (b, n, d // 2))
    chi = np.array([1.0, -1.0])
    y, cache = chiral_rope_attention_forward(q, k, v, th, chirality=chi, interleaved=interleaved)
    dy = rng.standard_normal(y.shape)
    g = chiral_rope_attention_backward(dy, cache)
    T = {"q": _t(q), "k": _t(k), "v": _t(v), "phases": _t(th)}
    ia, ib = (np.arange(0, d, 2), np.arange(1, d, 2)) if interleaved else (np.arange(d // 2), np.arange(d // 2, d))
    qa, qb, ka, kb = T["q"][..., ia], T["q"][..., ib], T["k"][..., ia], T["k"][..., ib]
    rel = torch.tensor(chi)[:, None, None, None, None] * (T["phases"][:, None, None, :, :] - T["phases"][:, None, :, None, :])
    c, s = rel.cos(), rel.sin()   # (b, 1, i, j, m)
    # q^T R(phi) k per plane: qa (c ka - s kb) + qb (s ka + c kb)
    sc = (qa[:, :, :, None] * (c * ka[:, :, None] - s * kb[:, :, None])
          + qb[:, :, :, None] * (s * ka[:, :, None] + c * kb[:, :, None])).sum(-1) / d ** 0.5
    out = torch.softmax(sc, -1) @ T["v"]
    np.testing.assert_allclose(y, out.detach().numpy(), atol=1e-12, rtol=0)
    out.backward(torch.tensor(dy))
    _grads_agree(g, T)


# ------------------------------------------------------------------------ BERT relative_key_query


def _rkq_torch(x, p, heads, P, kind, clip):
    b, n, c = x.shape
    d = c // heads

    def lin(name):
        return (x @ p[f"{name}.weight"] + p[f"{name}.bias"]).view(b, n, heads, d).transpose(1, 2)

    q, k, v = lin("query"), lin("key"), lin("value")
    dist = torch.arange(n)[:, None] - torch.arange(n)[None, :]
    if clip:
        dist = dist.clamp(-(P - 1), P - 1)
    a = p["distance_embedding.weight"][dist + P - 1]            # (i, j, d)
    s = q @ k.transpose(-1, -2) + torch.einsum("bhid,ijd->bhij", q, a)
    if kind == "relative_key_query":
        s = s + torch.einsum("bhjd,ijd->bhij", k, a)
    o = torch.softmax(s / d ** 0.5, -1) @ v
    return o.transpose(1, 2).reshape(b, n, c)


@pytest.mark.parametrize("kind,clip", [("relative_key_query", False), ("relative_key", False),
                                       ("relative_key_query", True)])
def test_rpe_key_query_torch_autograd(kind, clip):
    rng = np.random.default_rng(3)
    b, n, c, heads = 2, 6, 8, 2
    P = 3 if clip else 6
    x = rng.standard_normal((b, n, c))
    p = init_rpe_key_query_params(rng, c, heads, P)
    cfg = {"num_attention_heads": heads, "max_position_embeddings": P, "position_embedding_type": kind,
           "clip_distance": clip}
    y, cache = rpe_key_query_forward(x, p, **cfg)
    dy = rng.standard_normal(y.shape)
    g = rpe_key_query_backward(dy, cache)
    T = {"x": _t(x), **{key: _t(val) for key, val in p.items()}}
    out = _rkq_torch(T["x"], T, heads, P, kind, clip)
    np.testing.assert_allclose(y, out.detach().numpy(), atol=1e-12, rtol=0)
    out.backward(torch.tensor(dy))
    _grads_agree(g, T)


def test_rpe_key_query_rejects_unclipped_long_input():
    rng = np.random.default_rng(4)
    p = init_rpe_key_query_params(rng, 4, 1, 3)
    with pytest.raises(ValueError, match="max_position_embeddings|clip_distance"):
        rpe_key_query_forward(rng.standard_normal((2, 5, 4)), p, num_attention_heads=1, max_position_embeddings=3)


# ------------------------------------------------------------------------------------------ URPE


def test_urpe_torch_autograd_and_padding():
    # (softmax(q k^T + B) * C) v with B, C gathered from the tables through the bucket map, no renormalisation.
    rng = np.random.default_rng(5)
    b, n, c, heads, L = 2, 5, 8, 2, 7
    x = rng.standard_normal((b, n, c))
    cfg = {"num_heads": heads, "max_seq_len": L, "rp_bucket": 8, "max_rp": 16, "ur_rp_bucket": 8, "ur_max_rp": 16}
    p = init_urpe_params(rng, c, heads, max_seq_len=L, rp_bucket=8, ur_rp_bucket=8)
    pad = np.zeros((b, n), dtype=bool)
    pad[1, -2:] = True
    y, cache = urpe_attention_forward(x, p, key_padding_mask=pad, **cfg)
    dy = rng.standard_normal(y.shape)
    g = urpe_attention_backward(dy, cache)
    T = {"x": _t(x), **{key: _t(val) for key, val in p.items()}}
    ib = torch.tensor(urpe_bucket_ids(n, max_seq_len=L, num_buckets=8, max_distance=16))
    d = c // heads

    def lin(name):
        return (T["x"] @ T[f"{name}.weight"] + T[f"{name}.bias"]).view(b, n, heads, d).transpose(1, 2)

    q, k, v = lin("q_proj") / d ** 0.5, lin("k_proj"), lin("v_proj")
    bias = T["rp_bias.weight"][ib].permute(2, 0, 1)
    cmat = T["ur_rp_bias.weight"][ib].permute(2, 0, 1)
    padt = torch.tensor(pad)[:, None, None, :]
    s = (q @ k.transpose(-1, -2) + bias).masked_fill(padt, float("-inf"))
    o = (torch.softmax(s, -1) * cmat.masked_fill(padt, 0.0)) @ v
    out = o.transpose(1, 2).reshape(b, n, c) @ T["out_proj.weight"] + T["out_proj.bias"]
    np.testing.assert_allclose(y, out.detach().numpy(), atol=1e-12, rtol=0)
    out.backward(torch.tensor(dy))
    _grads_agree(g, T)
    # a padded key does not influence any output
    x2 = x.copy()
    x2[1, -1] += 3.0
    y2 = urpe_attention_forward(x2, p, key_padding_mask=pad, **cfg)[0]
    assert np.abs(y2[1, :-1] - y[1, :-1]).max() < 1e-13


# ------------------------------------------------------------------------------- magnetic Laplacian


@pytest.mark.parametrize("q", [0.0, 0.1, 0.25])
def test_magnetic_laplacian_directed_cycle_spectrum(q):
    # Directed n-cycle: L = 2I - e^{i 2 pi q} S - e^{-i 2 pi q} S^T, eigenvalues 2 - 2 cos(2 pi (k/n + q)).
    n = 7
    a = np.zeros((n, n))
    a[np.arange(n), (np.arange(n) + 1) % n] = 1.0
    lam = np.linalg.eigvalsh(magnetic_laplacian_matrix(a, q=q))
    want = np.sort(2 - 2 * np.cos(2 * np.pi * (np.arange(n) / n + q)))
    np.testing.assert_allclose(lam, want, atol=1e-12)
    lam_k, vec = magnetic_laplacian_eigenpairs(a, k=3, k_excl=1, q=q)
    np.testing.assert_allclose(lam_k, want[1:4], atol=1e-12)
    np.testing.assert_allclose(np.linalg.norm(vec, axis=0), 1.0, atol=1e-12)


def _maglap_sample(rng, im, concat):
    from refattn.attention.softmax.magnetic_laplacian import _random_digraph

    lams, vecs = [], []
    for _ in range(2):
        lam, vec = magnetic_laplacian_eigenpairs(_random_digraph(rng, 4), k=2, q=0.25)
        lams.append(lam)
        vecs.append(maglap_stack(vec))
    x = rng.standard_normal((2, 4, 3))
    p = init_maglap_pe_params(rng, 3, 2, d_model_elem=2, consider_im_part=im, concatenate_eigenvalues=concat)
    cfg = {"consider_im_part": im, "concatenate_eigenvalues": concat, "activation": "gelu"}
    return Sample({"x": x, "eigenvalues": np.array(lams), "eigenvectors": np.array(vecs)}, p, cfg)


@pytest.mark.parametrize("im,concat", [(False, True), (False, False)])
def test_maglap_gradcheck_real_part_only(im, concat):
    # The record's samples always use the imaginary part; consider_im_part=False (upstream when q = 0) here.
    s = _maglap_sample(np.random.default_rng(6), im, concat)
    assert gradcheck(maglap_pe_forward, maglap_pe_backward, s).max_rel < 1e-6
    assert not np.any(maglap_pe_backward(np.ones((2, 4, 3)), maglap_pe_forward(**{
        **s.inputs, "params": s.params, **s.config})[1])["eigenvectors"][..., 1])


def test_maglap_signnet_is_invariant_per_eigenvector():
    # SignNet acts on each eigenvector separately: flipping the sign of one of them changes nothing.
    rng = np.random.default_rng(7)
    s = _maglap_sample(rng, True, False)
    vec = s.inputs["eigenvectors"].copy()
    vec[0, :, 1] *= -1
    y0 = maglap_pe_forward(**s.inputs, params=s.params, **s.config)[0]
    y1 = maglap_pe_forward(s.inputs["x"], s.inputs["eigenvalues"], vec, s.params, **s.config)[0]
    assert np.abs(y1 - y0).max() < 1e-14
    y2 = maglap_pe_forward(s.inputs["x"], s.inputs["eigenvalues"], vec, s.params, use_signnet=False, **s.config)[0]
    y3 = maglap_pe_forward(**s.inputs, params=s.params, use_signnet=False, **s.config)[0]
    assert np.abs(y2 - y3).max() > 1e-8


# ----------------------------------------------------------------------------------- position coupling


def test_position_coupling_decoder_layout_and_errors():
    from refattn.attention.softmax import (
        coupled_addition_position_ids,
        init_position_coupling_params,
        pad_position_ids,
        position_coupling_embed_forward,
    )

    # "12+345=753" reversed answer, start 1: a = [3, 2], + = 1, b = [4, 3, 2], = = 1, c = [2, 3, 4, 5].
    ids = coupled_addition_position_ids(2, 3, 4, start=1, reverse_output=True)
    np.testing.assert_array_equal(ids, [3, 2, 1, 4, 3, 2, 1, 2, 3, 4, 5])
    pos = pad_position_ids([ids, ids[:5]], 13)
    assert pos[0, 0] == 0 and pos[0, -1] == 0 and np.array_equal(pos[0, 1:12], ids)
    assert np.all(pos[1, 6:] == 0)
    p = init_position_coupling_params(np.random.default_rng(0), 5, 2)  # IDs reach 5: one row short
    x = np.zeros((2, 13, 2))
    with pytest.raises(ValueError, match="position_ids must lie in"):
        position_coupling_embed_forward(x, p, position_ids=pos)
    with pytest.raises(TypeError, match="position_ids must be an integer"):
        position_coupling_embed_forward(x, p, position_ids=pos.astype(float))


# ------------------------------------------------------------------------------- Legendre positions


@pytest.mark.parametrize("normalization,shared", [("none", True), ("orthonormal", False)])
def test_legendre_pe_torch_autograd(normalization, shared):
    # Explicit closed forms of P_0..P_4 in torch; shared (N,) positions sum their gradient over the batch.
    from refattn.attention.softmax import legendre_pe_backward, legendre_pe_forward

    rng = np.random.default_rng(8)
    x = rng.standard_normal((3, 6, 5))
    pos = rng.uniform(-1.0, 8.0, (6,) if shared else (3, 6))     # also outside [0, L-1]: extrapolation
    y, cache = legendre_pe_forward(x, pos, length=7, normalization=normalization)
    dy = rng.standard_normal(y.shape)
    g = legendre_pe_backward(dy, cache)
    T = {"x": _t(x), "positions": _t(pos)}
    u = 2 * T["positions"] / 6 - 1
    polys = [torch.ones_like(u), u, (3 * u ** 2 - 1) / 2, (5 * u ** 3 - 3 * u) / 2, (35 * u ** 4 - 30 * u ** 2 + 3) / 8]
    pe = torch.stack(polys, -1)
    if normalization == "orthonormal":
        pe = pe * torch.sqrt((2 * torch.arange(5, dtype=torch.float64) + 1) / 2)
    out = T["x"] + pe
    np.testing.assert_allclose(y, out.detach().numpy(), atol=1e-12, rtol=0)
    out.backward(torch.tensor(dy))
    _grads_agree(g, T, tol=1e-11)
