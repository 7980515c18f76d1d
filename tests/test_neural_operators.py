"""Mechanism-specific tests of the neural-operator layers (FNO, AFNO/DPOT, FactFormer, IFactFormer-m,
ONO, continuum attention): PyTorch-autograd parity with re-stated upstream formulas, FFT-adjoint
pitfalls, conventions and bad input. Generic checks are generated from the registry elsewhere."""

from __future__ import annotations

import numpy as np
import pytest

from refattn import registry
from refattn.operators.afno import afno_mixer, afno_mixer_backward, afno_mixer_forward
from refattn.operators.common import irfftn_adjoint, rfftn_adjoint
from refattn.operators.continuum import continuum_attention, continuum_attention_forward
from refattn.operators.factformer import factformer_attention_backward, factformer_attention_forward
from refattn.operators.fno import fno_spectral_conv, fno_spectral_conv_backward, fno_spectral_conv_forward
from refattn.operators.ifactformer import ifactformer_m_attention
from refattn.operators.ono import ono_attention_backward, ono_attention_forward
from refattn.testing import run_record_checks

SLUGS = ["fno_spectral_conv", "afno_dpot_fourier_mixer", "factformer_factorized_attention",
         "ifactformer_m_parallel_attention", "ono_orthogonal_attention", "continuum_attention_quadrature",
         "scot_poseidon_block", "coda_no_codomain_attention"]


@pytest.mark.parametrize("slug", SLUGS)
def test_record_checks_pass(slug):
    rec = registry.get(slug)
    assert rec.implemented and rec.family == "3-operator"
    res = run_record_checks(rec)
    bad = [(r.check, r.message) for r in res.results if not r.passed]
    assert not bad, bad


# ----------------------------------------------------------------------------------- FFT adjoints


@pytest.mark.parametrize("n", [6, 7])
def test_hermitian_weighting_is_needed(n):
    """The adjoint without the factor-2 weighting of interior bins fails the adjoint identity."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, n, 1))
    Z = rng.standard_normal((1, n // 2 + 1, 1)) + 1j * rng.standard_normal((1, n // 2 + 1, 1))
    lhs = np.sum((np.fft.rfft(x, axis=1) * np.conj(Z)).real)
    right = np.sum(x * rfftn_adjoint(Z, (n,), (1,)))
    naive = np.sum(x * n * np.fft.irfft(Z, n=n, axis=1))      # forgets w = (1, 1/2, ..., 1/2, 1)
    assert abs(lhs - right) < 1e-12 * (1 + abs(lhs))
    assert abs(lhs - naive) > 1e-3
    g = rng.standard_normal((1, n, 1))
    y = np.fft.irfft(Z, n=n, axis=1)
    lhs2 = np.sum(y * g)
    ok = np.sum((Z * np.conj(irfftn_adjoint(g, (1,)))).real)
    naive2 = np.sum((Z * np.conj(np.fft.rfft(g, axis=1) / n)).real)   # forgets c = (1, 2, ..., 2, 1)
    assert abs(lhs2 - ok) < 1e-12 * (1 + abs(lhs2))
    assert abs(lhs2 - naive2) > 1e-3


# ----------------------------------------------------------------------------------------- FNO


def _fno_torch(torch, x, w, norm):
    # zongyi-li fourier_2d.py SpectralConv2d, channel-last in/out.
    xc = x.permute(0, 3, 1, 2)
    x_ft = torch.fft.rfft2(xc, norm=norm)
    m1, m2 = w["weights1"].shape[2:]
    out_ft = torch.zeros(xc.shape[0], w["weights1"].shape[1], xc.shape[2], xc.shape[3] // 2 + 1,
                         dtype=torch.complex128)
    out_ft[:, :, :m1, :m2] = torch.einsum("bixy,ioxy->boxy", x_ft[:, :, :m1, :m2], w["weights1"])
    out_ft[:, :, -m1:, :m2] = torch.einsum("bixy,ioxy->boxy", x_ft[:, :, -m1:, :m2], w["weights2"])
    return torch.fft.irfft2(out_ft, s=(xc.shape[2], xc.shape[3]), norm=norm).permute(0, 2, 3, 1)


@pytest.mark.parametrize("norm", ["backward", "ortho"])
@pytest.mark.parametrize("grid", [(8, 6), (7, 9)])
def test_fno_torch_parity(norm, grid):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, *grid, 3))
    m1, m2 = 3, 3
    params = {f"weights{i}_{p}": rng.standard_normal((3, 4, m1, m2)) for i in (1, 2) for p in ("real", "imag")}
    out, cache = fno_spectral_conv_forward(x, params, norm=norm)
    xt = torch.from_numpy(x).requires_grad_()
    wt = {f"weights{i}": torch.complex(torch.from_numpy(params[f"weights{i}_real"]),
                                        torch.from_numpy(params[f"weights{i}_imag"])).requires_grad_()
          for i in (1, 2)}
    ot = _fno_torch(torch, xt, wt, norm)
    np.testing.assert_allclose(out, ot.detach().numpy(), rtol=1e-10, atol=1e-12)
    g = rng.standard_normal(out.shape)
    ot.backward(torch.from_numpy(g))
    grads = fno_spectral_conv_backward(g, cache)
    np.testing.assert_allclose(grads["x"], xt.grad.numpy(), rtol=1e-10, atol=1e-12)
    for i in (1, 2):
        tg = wt[f"weights{i}"].grad.numpy()   # torch: dL/dRe + i dL/dIm for real L
        np.testing.assert_allclose(grads[f"weights{i}_real"], tg.real, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(grads[f"weights{i}_imag"], tg.imag, rtol=1e-10, atol=1e-12)


def test_fno_1d_is_fourier_1d():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 10, 2))
    w = rng.standard_normal((2, 3, 4)) + 1j * rng.standard_normal((2, 3, 4))
    y = fno_spectral_conv(x, {"weights1_real": w.real, "weights1_imag": w.imag})
    X = np.fft.rfft(x, axis=1)
    Y = np.zeros((2, 6, 3), complex)
    Y[:, :4] = np.einsum("bki,iok->bko", X[:, :4], w)
    np.testing.assert_allclose(y, np.fft.irfft(Y, n=10, axis=1), atol=1e-12)


def test_fno_bad_input():
    x = np.ones((2, 8, 6, 3))
    p = {f"weights{i}_{q}": np.ones((3, 2, 3, 3)) for i in (1, 2) for q in ("real", "imag")}
    with pytest.raises(ValueError, match="in_channels"):
        fno_spectral_conv(np.ones((2, 8, 6, 4)), p)
    with pytest.raises(ValueError, match="modes1"):
        fno_spectral_conv(np.ones((2, 4, 6, 3)), p)
    with pytest.raises(ValueError, match="n//2"):
        fno_spectral_conv(np.ones((2, 8, 3, 3)), p)
    with pytest.raises(ValueError, match="keys"):
        fno_spectral_conv(x, {"weights1_real": p["weights1_real"]})
    with pytest.raises(ValueError, match="norm"):
        fno_spectral_conv(x, p, norm="none")
    with pytest.raises(TypeError, match="weights1_imag"):
        fno_spectral_conv(x, {**p, "weights1_imag": np.ones((3, 2, 3, 3), complex)})


# ---------------------------------------------------------------------------------------- AFNO


def _afno_torch(torch, x, w1, b1, w2, b2, lam, kept_from_n=True):
    # NVlabs/AFNO-transformer afno/afno2d.py AFNO2D.forward (commit c3271a2), re-stated.
    F = torch.nn.functional
    B, H, W, C = x.shape
    nb, bs = w1.shape[1], w1.shape[2]
    X = torch.fft.rfft2(x, dim=(1, 2), norm="ortho").reshape(B, H, W // 2 + 1, nb, bs)
    kept = int(((H * W if kept_from_n else W) // 2 + 1) * 1.0)
    z1 = torch.zeros(B, H, W // 2 + 1, nb, w1.shape[3], dtype=torch.float64)
    o1r, o1i = z1.clone(), z1.clone()
    o2r = torch.zeros(X.shape, dtype=torch.float64)
    o2i = torch.zeros(X.shape, dtype=torch.float64)
    e = "...bi,bio->...bo"
    Xk = X[:, :, :kept]
    o1r[:, :, :kept] = F.relu(torch.einsum(e, Xk.real, w1[0]) - torch.einsum(e, Xk.imag, w1[1]) + b1[0])
    o1i[:, :, :kept] = F.relu(torch.einsum(e, Xk.imag, w1[0]) + torch.einsum(e, Xk.real, w1[1]) + b1[1])
    o2r[:, :, :kept] = torch.einsum(e, o1r[:, :, :kept], w2[0]) - torch.einsum(e, o1i[:, :, :kept], w2[1]) + b2[0]
    o2i[:, :, :kept] = torch.einsum(e, o1i[:, :, :kept], w2[0]) + torch.einsum(e, o1r[:, :, :kept], w2[1]) + b2[1]
    z = F.softshrink(torch.stack([o2r, o2i], dim=-1), lambd=lam)
    z = torch.view_as_complex(z).reshape(B, H, W // 2 + 1, C)
    return torch.fft.irfft2(z, s=(H, W), dim=(1, 2), norm="ortho") + x


def test_afno_torch_parity():
    torch = pytest.importorskip("torch")
    s = registry.get("afno_dpot_fourier_mixer").sample(np.random.default_rng(3), "small")
    x, p = s.inputs["x"], s.params
    out, cache = afno_mixer_forward(x, p)
    xt = torch.from_numpy(x).requires_grad_()
    pt = {k: torch.from_numpy(v).requires_grad_() for k, v in p.items()}
    ot = _afno_torch(torch, xt, pt["w1"], pt["b1"], pt["w2"], pt["b2"], 0.01)
    np.testing.assert_allclose(out, ot.detach().numpy(), rtol=1e-10, atol=1e-12)
    g = np.random.default_rng(4).standard_normal(out.shape)
    ot.backward(torch.from_numpy(g))
    grads = afno_mixer_backward(g, cache)
    np.testing.assert_allclose(grads["x"], xt.grad.numpy(), rtol=1e-9, atol=1e-11)
    for k in p:
        np.testing.assert_allclose(grads[k], pt[k].grad.numpy(), rtol=1e-9, atol=1e-11)


def test_afno_softshrink_zeroes_small_modes():
    rng = np.random.default_rng(5)
    x = 1e-4 * rng.standard_normal((1, 4, 4, 2))
    p = {"w1": 0.1 * rng.standard_normal((2, 1, 2, 2)), "b1": np.zeros((2, 1, 2)),
         "w2": 0.1 * rng.standard_normal((2, 1, 2, 2)), "b2": np.zeros((2, 1, 2))}
    # Every |O2| is far below lambda = 0.01: the mixer is exactly the residual.
    np.testing.assert_array_equal(afno_mixer(x, p), x)
    assert np.abs(afno_mixer(x, p, softshrink=None) - x).max() > 0


def test_afno_dpot_selection_drops_negative_frequencies():
    # A pure negative-frequency mode on axis 1 passes the FNO two-corner selection but not DPOT's.
    H, W = 8, 8
    t = np.arange(H)[:, None] / H
    s = np.arange(W)[None, :] / W
    x = np.cos(2 * np.pi * (-1 * t + 1 * s) + np.pi / 4)[None, ..., None].repeat(2, -1)
    eye = np.eye(2)
    p = {"w1": np.stack([eye, 0 * eye])[:, None], "b1": np.zeros((2, 1, 2)),
         "w2": np.stack([eye, 0 * eye])[:, None], "b2": np.zeros((2, 1, 2))}
    kw = dict(softshrink=None, inner_residual=False, activation="relu", modes=2)
    fno = afno_mixer(x, p, mode_selection="fno_two_corners", **kw)
    dpot = afno_mixer(x, p, mode_selection="dpot_low_corner", **kw)
    np.testing.assert_allclose(fno, x, atol=1e-12)
    np.testing.assert_allclose(dpot, 0 * x, atol=1e-12)


def test_afno_bad_input():
    x = np.ones((2, 4, 4, 4))
    p = {"w1": np.ones((2, 2, 2, 2)), "b1": np.ones((2, 2, 2)), "w2": np.ones((2, 2, 2, 2)), "b2": np.ones((2, 2, 2))}
    with pytest.raises(ValueError, match="channels"):
        afno_mixer(np.ones((2, 4, 4, 6)), p)
    with pytest.raises(ValueError, match="b2"):
        afno_mixer(x, {**p, "b2": np.ones((2, 2, 3))})
    with pytest.raises(ValueError, match="modes"):
        afno_mixer(x, p, mode_selection="dpot_low_corner")
    with pytest.raises(ValueError, match="num_blocks"):
        afno_mixer(x, p, num_blocks=4)
    with pytest.raises(ValueError, match="activation"):
        afno_mixer(x, p, activation="tanh")


# ---------------------------------------------------------------------------------- FactFormer


def test_factformer_torch_parity():
    torch = pytest.importorskip("torch")
    s = registry.get("factformer_factorized_attention").sample(np.random.default_rng(6), "small")
    out, cache = factformer_attention_forward(**s.inputs, **s.config)
    t = {k: torch.from_numpy(v).requires_grad_() for k, v in s.inputs.items()}
    # libs/factorization_module.py FABlock2D.forward after LowRankKernel (K = einsum * scaling).
    kx = torch.einsum("bhid,bhjd->bhij", t["q_x"], t["k_x"]) * s.config["scaling_x"]
    ky = torch.einsum("bhid,bhjd->bhij", t["q_y"], t["k_y"]) * s.config["scaling_y"]
    u = torch.einsum("bhij,bhjmc->bhimc", kx, t["v"])
    u = torch.einsum("bhlm,bhimc->bhilc", ky, u)
    np.testing.assert_allclose(out, u.detach().numpy(), rtol=1e-11, atol=1e-12)
    g = np.random.default_rng(7).standard_normal(out.shape)
    u.backward(torch.from_numpy(g))
    grads = factformer_attention_backward(g, cache)
    for k in t:
        np.testing.assert_allclose(grads[k], t[k].grad.numpy(), rtol=1e-10, atol=1e-11)


def test_ifactformer_concat_layout():
    s = registry.get("ifactformer_m_parallel_attention").sample(np.random.default_rng(8), "small")
    out = ifactformer_m_attention(**s.inputs, **s.config)
    b, h, nx, ny, c = s.inputs["v"].shape
    assert out.shape == (b, h, nx, ny, 2 * c)


def test_factformer_bad_input():
    rng = np.random.default_rng(9)
    v = rng.standard_normal((2, 1, 3, 4, 2))
    qx, qy = rng.standard_normal((2, 1, 3, 2)), rng.standard_normal((2, 1, 4, 2))
    with pytest.raises(ValueError, match="q_y"):
        factformer_attention_forward(v, qx, qx, qx, qy)
    with pytest.raises(ValueError, match="k_x"):
        factformer_attention_forward(v, qx, rng.standard_normal((2, 1, 3, 5)), qy, qy)
    with pytest.raises(ValueError, match="scaling_x"):
        factformer_attention_forward(v, qx, qx, qy, qy, scaling_x=-1.0)


# ----------------------------------------------------------------------------------------- ONO


def test_ono_torch_parity():
    torch = pytest.importorskip("torch")
    s = registry.get("ono_orthogonal_attention").sample(np.random.default_rng(10), "small")
    out, cache = ono_attention_forward(**s.inputs, params=s.params, residual=False)   # commit 86e1bfe
    psi = torch.from_numpy(s.inputs["psi"]).requires_grad_()
    fx = torch.from_numpy(s.inputs["fx"]).requires_grad_()
    mu = torch.from_numpy(s.params["mu"]).requires_grad_()
    # ONOmodel2.py ONOBlock.forward (training, orth=True), re-stated.
    cov = torch.einsum("blc, bld->cd", psi, psi) / psi.shape[0] / psi.shape[1]
    L = torch.linalg.cholesky(cov)
    x_ = psi @ L.inverse().transpose(-2, -1)
    ot = (x_ * torch.nn.functional.softplus(mu)) @ (x_.transpose(-2, -1) @ fx)
    np.testing.assert_allclose(out, ot.detach().numpy(), rtol=1e-10, atol=1e-12)
    g = np.random.default_rng(11).standard_normal(out.shape)
    ot.backward(torch.from_numpy(g))
    grads = ono_attention_backward(g, cache)
    np.testing.assert_allclose(grads["psi"], psi.grad.numpy(), rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(grads["fx"], fx.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(grads["mu"], mu.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_ono_bad_input():
    psi = np.ones((2, 3, 2))
    with pytest.raises(ValueError, match="mu"):
        ono_attention_forward(psi, np.ones((2, 3, 1)), {"mu": np.ones(3)})
    with pytest.raises(ValueError, match="fx"):
        ono_attention_forward(psi, np.ones((2, 4, 1)), {"mu": np.ones(2)})
    with pytest.raises(ValueError, match="feature_cov"):
        ono_attention_forward(psi, np.ones((2, 3, 1)), {"mu": np.ones(2)}, feature_cov=np.ones((3, 3)))


# ---------------------------------------------------------------------------------- continuum


def test_continuum_torch_sdpa_parity():
    torch = pytest.importorskip("torch")
    s = registry.get("continuum_attention_quadrature").sample(np.random.default_rng(12), "small")
    q, k, v = (s.inputs[n] for n in "qkv")
    w = s.config["quad_weights"]
    out = continuum_attention(q, k, v, quad_weights=w)
    mask = torch.from_numpy(np.log(w))[:, None, None, :]
    ref = torch.nn.functional.scaled_dot_product_attention(*(torch.from_numpy(a) for a in (q, k, v)), attn_mask=mask)
    np.testing.assert_allclose(out, ref.numpy(), rtol=1e-10, atol=1e-12)


def test_continuum_weight_scale_invariance_and_bad_weights():
    rng = np.random.default_rng(13)
    q, k, v = rng.standard_normal((1, 1, 3, 2)), rng.standard_normal((1, 1, 5, 2)), rng.standard_normal((1, 1, 5, 2))
    w = rng.uniform(0.1, 1, 5)
    np.testing.assert_allclose(continuum_attention(q, k, v, quad_weights=w),
                               continuum_attention(q, k, v, quad_weights=1e3 * w), atol=1e-13)
    # Non-uniform weights do change the result (the test would fail if weights were ignored).
    assert np.abs(continuum_attention(q, k, v, quad_weights=w)
                  - continuum_attention(q, k, v, quad_weights=np.ones(5))).max() > 1e-3
    with pytest.raises(ValueError, match="quad_weights"):
        continuum_attention_forward(q, k, v, quad_weights=np.ones(4))
    with pytest.raises(ValueError, match="quad_weights"):
        continuum_attention_forward(q, k, v, quad_weights=-w)


# ------------------------------------------------------------------------------------- scOT


def _scot_torch(torch, x, t, p, nh, ws, shift):
    # poseidon scOT/model.py ScOTLayer.forward + transformers Swinv2SelfAttention, re-stated.
    F = torch.nn.functional
    a = "attention.self."
    B, H, W, C = x.shape

    def cln(z, pre):
        mean = z.mean(-1, keepdim=True)
        var = (z**2).mean(-1, keepdim=True) - mean**2
        z = (z - mean) / (var + 1e-5).sqrt()
        wgt = (t.reshape(-1, 1) @ p[pre + "weight.weight"] + p[pre + "weight.bias"])[:, None, None]
        bia = (t.reshape(-1, 1) @ p[pre + "bias.weight"] + p[pre + "bias.bias"])[:, None, None]
        return wgt * z + bia

    hp, wp = -(-H // ws) * ws, -(-W // ws) * ws
    xp = F.pad(x, (0, 0, 0, wp - W, 0, hp - H))
    xs = torch.roll(xp, shifts=(-shift, -shift), dims=(1, 2)) if shift else xp
    win = xs.view(B, hp // ws, ws, wp // ws, ws, C).permute(0, 1, 3, 2, 4, 5).reshape(-1, ws * ws, C)
    d = C // nh

    def heads(z):
        return z.view(z.shape[0], z.shape[1], nh, d).permute(0, 2, 1, 3)

    q = heads(win @ p[a + "query.weight"] + p[a + "query.bias"])
    k = heads(win @ p[a + "key.weight"])
    v = heads(win @ p[a + "value.weight"] + p[a + "value.bias"])
    sc = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)
    sc = sc * torch.clamp(p[a + "logit_scale"], max=np.log(100.0)).exp()
    rh = torch.arange(-(ws - 1), ws, dtype=torch.float64)
    table = torch.stack(torch.meshgrid([rh, rh], indexing="ij")).permute(1, 2, 0).unsqueeze(0) / (ws - 1) * 8
    table = torch.sign(table) * torch.log2(table.abs() + 1.0) / np.log2(8)
    cpb = F.relu(table @ p[a + "continuous_position_bias_mlp.0.weight"]
                 + p[a + "continuous_position_bias_mlp.0.bias"]) @ p[a + "continuous_position_bias_mlp.2.weight"]
    coords = torch.flatten(torch.stack(torch.meshgrid([torch.arange(ws), torch.arange(ws)], indexing="ij")), 1)
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0).contiguous()
    rel[:, :, 0] += ws - 1
    rel[:, :, 1] += ws - 1
    rel[:, :, 0] *= 2 * ws - 1
    idx = rel.sum(-1)
    rpb = cpb.view(-1, nh)[idx.view(-1)].view(ws * ws, ws * ws, -1).permute(2, 0, 1)
    sc = sc + 16 * torch.sigmoid(rpb).unsqueeze(0)
    if shift:
        img = torch.zeros((1, hp, wp, 1), dtype=torch.float64)
        cnt = 0
        for hs in (slice(0, -ws), slice(-ws, -shift), slice(-shift, None)):
            for wsl in (slice(0, -ws), slice(-ws, -shift), slice(-shift, None)):
                img[:, hs, wsl, :] = cnt
                cnt += 1
        mw = img.view(1, hp // ws, ws, wp // ws, ws, 1).permute(0, 1, 3, 2, 4, 5).reshape(-1, ws * ws)
        mask = (mw.unsqueeze(1) - mw.unsqueeze(2))
        mask = mask.masked_fill(mask != 0, -100.0).masked_fill(mask == 0, 0.0)
        nw = mask.shape[0]
        sc = sc.view(-1, nw, nh, ws * ws, ws * ws) + mask.unsqueeze(1).unsqueeze(0)
        sc = (sc + mask.unsqueeze(1).unsqueeze(0)).view(-1, nh, ws * ws, ws * ws)
    ctx = (torch.softmax(sc, -1) @ v).permute(0, 2, 1, 3).reshape(-1, ws * ws, C)
    att = ctx @ p["attention.output.dense.weight"] + p["attention.output.dense.bias"]
    att = att.view(B, hp // ws, wp // ws, ws, ws, C).permute(0, 1, 3, 2, 4, 5).reshape(B, hp, wp, C)
    if shift:
        att = torch.roll(att, shifts=(shift, shift), dims=(1, 2))
    att = att[:, :H, :W]
    h = x + cln(att, "layernorm_before.")
    m = F.gelu(h @ p["intermediate.dense.weight"] + p["intermediate.dense.bias"])
    m = m @ p["output.dense.weight"] + p["output.dense.bias"]
    return h + cln(m, "layernorm_after.")


@pytest.mark.parametrize("shift", [True, False])
def test_scot_torch_parity(shift):
    torch = pytest.importorskip("torch")
    from refattn.operators.scot import scot_layer_backward, scot_layer_forward

    s = registry.get("scot_poseidon_block").sample(np.random.default_rng(14), "small", shift=shift)
    x, t = s.inputs["x"], s.inputs["t"]
    out, cache = scot_layer_forward(x, t, s.params, **s.config)
    xt, tt = torch.from_numpy(x).requires_grad_(), torch.from_numpy(t).requires_grad_()
    pt = {k: torch.from_numpy(v).requires_grad_() for k, v in s.params.items()}
    ot = _scot_torch(torch, xt, tt, pt, s.config["num_heads"], cache["ws"], cache["shift"])
    assert cache["shift"] == (2 if shift else 0)
    np.testing.assert_allclose(out, ot.detach().numpy(), rtol=1e-10, atol=1e-11)
    g = np.random.default_rng(15).standard_normal(out.shape)
    ot.backward(torch.from_numpy(g))
    grads = scot_layer_backward(g, cache)
    np.testing.assert_allclose(grads["x"], xt.grad.numpy(), rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(grads["t"], tt.grad.numpy(), rtol=1e-8, atol=1e-10)
    for k in pt:
        np.testing.assert_allclose(grads[k], pt[k].grad.numpy(), rtol=1e-8, atol=1e-10, err_msg=k)


def test_scot_bad_input():
    from refattn.operators.scot import scot_layer

    s = registry.get("scot_poseidon_block").sample(np.random.default_rng(16), "tiny")
    x, t = s.inputs["x"], s.inputs["t"]
    with pytest.raises(ValueError, match="t must"):
        scot_layer(x, np.ones(3), s.params, **s.config)
    with pytest.raises(ValueError, match="num_heads"):
        scot_layer(x, t, s.params, **{**s.config, "num_heads": 3})
    with pytest.raises(ValueError, match="query.weight"):
        scot_layer(x, t, {**s.params, "attention.self.query.weight": np.ones((4, 3))}, **s.config)
    with pytest.raises(ValueError, match="missing"):
        scot_layer(x, t, {k: v for k, v in s.params.items() if k != "output.dense.bias"}, **s.config)


# ------------------------------------------------------------------------------------- CoDA-NO


def test_coda_no_torch_parity_with_upstream_layout():
    torch = pytest.importorskip("torch")
    from refattn.operators.coda_no import codomain_attention_backward, codomain_attention_forward

    rng = np.random.default_rng(17)
    b, a, nv, d, g1, g2 = 2, 2, 3, 2, 4, 5
    # Upstream layout: K/Q/V blocks output (b*k, a*d, g1, g2); compute_attention rearranges to
    # 'b a k (d g1 g2)'. refattn takes (b, a, k, d, g1, g2).
    up = {n: rng.standard_normal((b * nv, a * d, g1, g2)) for n in "qkv"}
    ours = {n: up[n].reshape(b, nv, a, d, g1, g2).transpose(0, 2, 1, 3, 4, 5) for n in "qkv"}
    out, cache = codomain_attention_forward(**ours, temperature=0.7)
    t = {n: torch.from_numpy(up[n]).requires_grad_() for n in "qkv"}
    r = {n: t[n].reshape(b, nv, a, d * g1 * g2).permute(0, 2, 1, 3) for n in "qkv"}
    dprod = torch.softmax(r["q"] @ r["k"].transpose(-1, -2) / (0.7 * np.sqrt(r["k"].shape[-1])), -1)
    att = (dprod @ r["v"]).reshape(b, a, nv, d, g1, g2).permute(0, 2, 1, 3, 4, 5).reshape(b * nv, a * d, g1, g2)
    np.testing.assert_allclose(out.transpose(0, 2, 1, 3, 4, 5).reshape(b * nv, a * d, g1, g2),
                               att.detach().numpy(), rtol=1e-11, atol=1e-12)
    g = rng.standard_normal(out.shape)
    att.backward(torch.from_numpy(g.transpose(0, 2, 1, 3, 4, 5).reshape(b * nv, a * d, g1, g2)))
    grads = codomain_attention_backward(g, cache)
    for n in "qkv":
        tg = t[n].grad.numpy().reshape(b, nv, a, d, g1, g2).transpose(0, 2, 1, 3, 4, 5)
        np.testing.assert_allclose(grads[n], tg, rtol=1e-10, atol=1e-12)


def test_coda_no_bad_input():
    from refattn.operators.coda_no import codomain_attention

    q = np.ones((2, 1, 3, 2, 4))
    with pytest.raises(ValueError, match="k must"):
        codomain_attention(q, np.ones((2, 1, 3, 2, 5)), q)
    with pytest.raises(ValueError, match="quad_weights"):
        codomain_attention(q, q, q, quad_weights=np.ones(4))
    with pytest.raises(ValueError, match="quad_weights"):
        codomain_attention(q, q, q, score_scaling="quadrature", quad_weights=np.ones(5))
    with pytest.raises(ValueError, match="temperature"):
        codomain_attention(q, q, q, temperature=0.0)


def test_init_helpers_match_upstream_shapes_and_ranges():
    from refattn.operators.afno import init_afno_params
    from refattn.operators.fno import init_fno_params

    rng = np.random.default_rng(18)
    p = init_fno_params(rng, 4, 5, (3, 2))
    assert set(p) == {f"weights{i}_{q}" for i in (1, 2) for q in ("real", "imag")}
    assert all(v.shape == (4, 5, 3, 2) and v.min() >= 0 and v.max() < 1 / 20 for v in p.values())
    assert fno_spectral_conv(rng.standard_normal((2, 8, 6, 4)), p).shape == (2, 8, 6, 5)
    a = init_afno_params(rng, 8, num_blocks=2, hidden_size_factor=2)
    assert a["w1"].shape == (2, 2, 4, 8) and a["b2"].shape == (2, 2, 4) and a["w1"].std() < 0.05
    d = init_afno_params(rng, 8, num_blocks=2, init="dpot")
    assert d["w1"].min() >= 0 and d["w1"].max() < 1 / 16
    assert afno_mixer(rng.standard_normal((1, 4, 4, 8)), d, mode_selection="dpot_low_corner", modes=2,
                      activation="gelu", softshrink=None).shape == (1, 4, 4, 8)
    with pytest.raises(ValueError, match="divisible"):
        init_afno_params(rng, 7, num_blocks=2)


def _fablock_torch(torch, u, p, pos_x, pos_y, heads, dim_head, sy):
    # BaratiLab/FactFormer FABlock2D.forward (use_rope=True, kernel_multiplier<=4: scaling_x = 1,
    # scaling_y = scaling_factor), re-stated with the upstream modules where they are plain torch.
    F = torch.nn.functional

    def ln(x, pre):
        return F.layer_norm(x, (x.shape[-1],), p[pre + "weight"], p[pre + "bias"], 1e-5)

    def pool(x, pre):
        x = (x @ p[pre + "to_in.weight"]).mean(dim=tuple(range(2, x.ndim - 1)))
        x = ln(x, pre + "out_ffn.norm.")
        x = x @ p[pre + "out_ffn.fn.net.0.weight"] + p[pre + "out_ffn.fn.net.0.bias"]
        c = x.shape[-1]
        x = F.gelu(x[..., : c // 2]) * x[..., c // 2:]
        return x @ p[pre + "out_ffn.fn.net.3.weight"] + p[pre + "out_ffn.fn.net.3.bias"]

    def kernel(ua, pos, ax, scaling):
        q = ua @ p[f"low_rank_kernel_{ax}.to_q.weight"]
        k = ua @ p[f"low_rank_kernel_{ax}.to_k.weight"]
        b, n, hd = q.shape
        q = q.view(b, n, heads, hd // heads).permute(0, 2, 1, 3)
        k = k.view(b, n, heads, hd // heads).permute(0, 2, 1, 3)
        d = hd // heads
        inv_freq = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
        freqs = torch.einsum("i,j->ij", pos * 64.0, inv_freq)
        freqs = torch.cat((freqs, freqs), -1)

        def rot(t):
            t1, t2 = t[..., : d // 2], t[..., d // 2:]
            return t * freqs.cos() + torch.cat((-t2, t1), -1) * freqs.sin()

        return torch.einsum("bhid,bhjd->bhij", rot(q), rot(k)) * scaling

    u = ln(u, "in_norm.")
    v = u @ p["to_v.weight"]
    u = u @ p["to_in.weight"]
    kx = kernel(pool(u, "to_x.0."), pos_x, "x", 1.0)
    ky = kernel(pool(u.permute(0, 2, 1, 3), "to_y.1."), pos_y, "y", sy)
    b, nx, ny, _ = v.shape
    u_phi = v.view(b, nx, ny, heads, dim_head).permute(0, 3, 1, 2, 4)
    u_phi = torch.einsum("bhij,bhjmc->bhimc", kx, u_phi)
    u_phi = torch.einsum("bhlm,bhimc->bhilc", ky, u_phi)
    u_phi = u_phi.permute(0, 2, 3, 1, 4).reshape(b, nx, ny, heads * dim_head)
    with pytest.warns(UserWarning) if nx != heads * dim_head else _nullcontext():
        u_phi = torch.nn.InstanceNorm2d(heads * dim_head)(u_phi)      # channel-last input: the upstream quirk
    return F.gelu(u_phi @ p["to_out.1.weight"]) @ p["to_out.3.weight"]


class _nullcontext:
    def __enter__(self):
        return None

    def __exit__(self, *a):
        return False


def test_factformer_block_torch_parity():
    torch = pytest.importorskip("torch")
    from refattn.operators.factformer import (
        factformer_block_backward,
        factformer_block_forward,
        init_factformer_block_params,
    )

    rng = np.random.default_rng(19)
    p = init_factformer_block_params(rng, 6, 2, 4, 2, 5)   # kernel_multiplier 3: per-head kernel width 6
    p = {k: v + 0.2 * rng.standard_normal(v.shape) for k, v in p.items()}
    u = rng.standard_normal((2, 5, 4, 6))
    pos_x, pos_y = np.linspace(0, 1, 5), np.linspace(0, 1, 4)
    out, cache = factformer_block_forward(u, p, pos_x=pos_x, pos_y=pos_y, heads=2, dim_head=2, scaling_y=0.7,
                                          out_norm="instancenorm2d", output_layout="grid")   # before c9801d1
    ut = torch.from_numpy(u).requires_grad_()
    pt = {k: torch.from_numpy(v).requires_grad_() for k, v in p.items()}
    ot = _fablock_torch(torch, ut, pt, torch.from_numpy(pos_x), torch.from_numpy(pos_y), 2, 2, 0.7)
    np.testing.assert_allclose(out, ot.detach().numpy(), rtol=1e-9, atol=1e-11)
    g = rng.standard_normal(out.shape)
    ot.backward(torch.from_numpy(g))
    grads = factformer_block_backward(g, cache)
    np.testing.assert_allclose(grads["u"], ut.grad.numpy(), rtol=1e-8, atol=1e-10)
    for k in pt:
        np.testing.assert_allclose(grads[k], pt[k].grad.numpy(), rtol=1e-8, atol=1e-10, err_msg=k)


def test_dpot_variant_torch_parity():
    # thu-ml/DPOT models/dpot.py AFNO2D.forward (commit dcd2f9a), channel-last, re-stated.
    torch = pytest.importorskip("torch")
    from refattn.operators.afno import init_afno_params

    rng = np.random.default_rng(20)
    p = init_afno_params(rng, 6, num_blocks=2, hidden_size_factor=2, init="dpot")
    x = rng.standard_normal((2, 6, 7, 6))
    m = 3
    out, cache = afno_mixer_forward(x, p, mode_selection="dpot_low_corner", modes=m, activation="gelu",
                                    softshrink=None)
    xt = torch.from_numpy(x).requires_grad_()
    pt = {k: torch.from_numpy(v).requires_grad_() for k, v in p.items()}
    F = torch.nn.functional
    B, H, W, C = x.shape
    X = torch.fft.rfft2(xt, dim=(1, 2), norm="ortho").reshape(B, H, W // 2 + 1, 2, 3)
    o1r = torch.zeros(B, H, W // 2 + 1, 2, 6, dtype=torch.float64)
    o1i, o2r, o2i = o1r.clone(), torch.zeros(X.shape, dtype=torch.float64), torch.zeros(X.shape, dtype=torch.float64)
    e = "...bi,bio->...bo"
    Xk = X[:, :m, :m]
    o1r[:, :m, :m] = F.gelu(torch.einsum(e, Xk.real, pt["w1"][0]) - torch.einsum(e, Xk.imag, pt["w1"][1]) + pt["b1"][0])
    o1i[:, :m, :m] = F.gelu(torch.einsum(e, Xk.imag, pt["w1"][0]) + torch.einsum(e, Xk.real, pt["w1"][1]) + pt["b1"][1])
    o2r[:, :m, :m] = (torch.einsum(e, o1r[:, :m, :m], pt["w2"][0]) - torch.einsum(e, o1i[:, :m, :m], pt["w2"][1])
                      + pt["b2"][0])
    o2i[:, :m, :m] = (torch.einsum(e, o1i[:, :m, :m], pt["w2"][0]) + torch.einsum(e, o1r[:, :m, :m], pt["w2"][1])
                      + pt["b2"][1])
    z = torch.view_as_complex(torch.stack([o2r, o2i], dim=-1)).reshape(B, H, W // 2 + 1, C)
    ot = torch.fft.irfft2(z, s=(H, W), dim=(1, 2), norm="ortho") + xt
    np.testing.assert_allclose(out, ot.detach().numpy(), rtol=1e-10, atol=1e-12)
    g = rng.standard_normal(out.shape)
    ot.backward(torch.from_numpy(g))
    grads = afno_mixer_backward(g, cache)
    np.testing.assert_allclose(grads["x"], xt.grad.numpy(), rtol=1e-9, atol=1e-11)
    for k in p:
        np.testing.assert_allclose(grads[k], pt[k].grad.numpy(), rtol=1e-9, atol=1e-11, err_msg=k)
