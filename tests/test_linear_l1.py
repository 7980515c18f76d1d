"""Kernel features, polynomial, structured-mask, hyperbolic, hashed and Neumann attention (issue 15,
slice l1): what the generated registry tests cannot express.

* finite differences over every variant the single registry sample does not reach (every
  Spectraformer component x weight matrix x stabiliser, every KL-Transformer spectral
  distribution, every Fastmax option, a 3-D grid mask, Hypformer head concatenation, the EcoFormer
  attention on codes with the codes as an input);
* Monte-Carlo tests of the random-feature estimators: the m^(-1/2) rate of the kernel estimate
  (fixed seeds, tolerance propagated from the sample of repeats) for Spectraformer and the
  learned spectral kernels, and Fastmax's Taylor rate against softmax attention;
* brute-force references: EcoFormer's codes, the tree distances, the grid masks;
* torch autograd parity against float64 transcriptions of the formulas (skipped without torch),
  and parity with the ``infsa`` package where it is installed.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest

from refattn.attention.linear import (
    FASTMAX_NORMALIZE,
    KL_FEATURES,
    SPECTRA_COMPONENTS,
    binary_linear_attention_backward,
    binary_linear_attention_forward,
    ecoformer_attention_backward,
    ecoformer_attention_forward,
    fastmax_attention,
    fastmax_backward,
    fastmax_forward,
    grid_toeplitz_dense,
    grid_toeplitz_matvec_fft,
    hypformer_attention_backward,
    hypformer_attention_forward,
    infsa_attention_forward,
    kl_spectral_samples_forward,
    kl_transformer_backward,
    kl_transformer_forward,
    masked_linear_attention,
    masked_linear_attention_backward,
    masked_linear_attention_forward,
    spectraformer_backward,
    spectraformer_features_forward,
    spectraformer_forward,
    spectraformer_weight_matrix,
    tree_distances,
    tree_exp_matvec,
)
from refattn.attention.linear import ecoformer as eco_mod
from refattn.attention.linear import hypformer as hyp_mod
from refattn.attention.linear import infsa as infsa_mod
from refattn.attention.linear import kl_transformer as kl_mod
from refattn.attention.linear import masked_linear as ml_mod
from refattn.attention.linear import spectraformer as sp_mod
from refattn.attention.linear._samples import random_qkv, softmax_attention_reference
from refattn.registry import Sample
from refattn.testing import directional_check, gradcheck

# --------------------------------------------------------------------------------------------
# finite differences over every variant


@pytest.mark.parametrize("component", SPECTRA_COMPONENTS)
@pytest.mark.parametrize("weight", ["gaus", "sorf", "fastfood_learnable"])
def test_spectraformer_fd_every_component_and_weight(component, weight):
    # a seed that is the same in every process (str hashes are salted per process: PYTHONHASHSEED)
    rng = np.random.default_rng(zlib.crc32(f"{component}/{weight}".encode()))
    s = sp_mod._sample_combo(rng, "tiny", component, weight, weight == "sorf")
    s = Sample({k: v[:, :1, :3] for k, v in s.inputs.items()},
               None if s.params is None else {k: (v[:1] if k == "gerf_A" else v) for k, v in s.params.items()},
               dict(s.config, key_stabilizer="row" if weight == "gaus" else "per_head",
                    feature_eps=1e-3 if weight != "sorf" else 0.0))
    gradcheck(spectraformer_forward, spectraformer_backward, s)


@pytest.mark.parametrize("feature", KL_FEATURES)
def test_kl_fd_every_feature(feature):
    rng = np.random.default_rng(KL_FEATURES.index(feature))
    s = kl_mod._sample_feature(rng, "tiny", feature, feature.endswith("prf"))
    inputs = {k: v[:, :1, :3] for k, v in s.inputs.items()}
    params = {k: (v[:1] if k in ("feature_map.mean", "feature_map.sigma") else v) for k, v in s.params.items()}
    gradcheck(kl_transformer_forward, kl_transformer_backward, Sample(inputs, params, s.config))


@pytest.mark.parametrize("normalize", FASTMAX_NORMALIZE)
@pytest.mark.parametrize("p", [1, 2])
def test_fastmax_fd_every_option(normalize, p):
    causal = (p + FASTMAX_NORMALIZE.index(normalize)) % 2 == 1  # both scan directions over the grid
    rng = np.random.default_rng(7)
    q, k, v = random_qkv(rng, "tiny")
    s = Sample({"q": 0.4 * q[:, :1], "k": 0.4 * k[:, :1], "v": v[:, :1]},
               config={"p": p, "causal": causal, "normalize": normalize, "temperature": 0.8, "a0": 0.9,
                       "a1": 1.1, "a2": 0.4, "lim": 0.7})
    gradcheck(fastmax_forward, fastmax_backward, s)


def test_masked_3d_grid_fft_equals_dense_and_fd():
    rng = np.random.default_rng(1)
    grid = (2, 3, 2)
    c = rng.standard_normal((2, 3, 5, 3))
    x = rng.standard_normal((2, 12, 4))
    np.testing.assert_allclose(grid_toeplitz_matvec_fft(c, x, grid), grid_toeplitz_dense(c, grid) @ x, atol=1e-12)
    q, k, v = (rng.standard_normal((2, 1, 12, d)) for d in (3, 3, 2))
    s = Sample({"q": q, "k": k, "v": v}, {"b": 0.4 * rng.standard_normal((3, 5, 3))},
               {"mask_kind": "grid", "grid": grid})
    gradcheck(masked_linear_attention_forward, masked_linear_attention_backward, s)
    ref = ml_mod._reference(**s.inputs, params=s.params, **s.config)
    np.testing.assert_allclose(masked_linear_attention(**s.inputs, params=s.params, **s.config), ref, atol=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_tree_distances_bruteforce_and_passes(seed):
    """Tree distances by Floyd-Warshall on the adjacency; the O(N) passes against exp(-lam D) x."""
    rng = np.random.default_rng(seed)
    n = 11
    parent, w = ml_mod._random_tree(rng, n)
    Dfw = np.full((n, n), np.inf)
    np.fill_diagonal(Dfw, 0.0)
    for u in range(n):
        if parent[u] >= 0:
            Dfw[u, parent[u]] = Dfw[parent[u], u] = w[u]
    for m in range(n):
        Dfw = np.minimum(Dfw, Dfw[:, m:m + 1] + Dfw[m:m + 1, :])
    D = tree_distances(parent, w)
    np.testing.assert_allclose(D, Dfw, atol=1e-12)
    x = rng.standard_normal((3, n, 2))
    np.testing.assert_allclose(tree_exp_matvec(x, 0.9, parent, w), np.exp(-0.9 * D) @ x, atol=1e-12)


@pytest.mark.parametrize("concat", [False, True])
def test_hypformer_fd_concat_and_power(concat):
    rng = np.random.default_rng(3 + concat)
    x = hyp_mod._points(rng, (2, 3, 3), 0.8)
    s = Sample({"x": x}, hyp_mod._hyp_params(rng, 2, 3, concat),
               {"num_heads": 2, "curvature": 0.8, "power_k": 3.0, "heads_concat": concat})
    gradcheck(hypformer_attention_forward, hypformer_attention_backward, s)


@pytest.mark.parametrize("numerator_bias", ["self", "sum"])
def test_ecoformer_attention_on_codes_fd(numerator_bias):
    """The attention on codes is smooth in the codes: its VJP (used by the straight-through
    estimator) is checked by finite differences with the codes as a continuous input."""
    rng = np.random.default_rng(5)
    h = rng.choice([-1.0, 1.0], size=(2, 2, 5, 3)) + 0.1 * rng.standard_normal((2, 2, 5, 3))
    v = rng.standard_normal((2, 2, 5, 2))

    def fwd(h, v):
        return binary_linear_attention_forward(h, v, bias=4.0, numerator_bias=numerator_bias)

    def bwd(g, c):
        dh, dv = binary_linear_attention_backward(g, c)
        return {"h": dh, "v": dv}

    gradcheck(fwd, bwd, Sample({"h": h, "v": v}))


@pytest.mark.parametrize("numerator_bias", ["self", "sum"])
def test_ecoformer_ste_chain_and_fixed_hash(numerator_bias):
    rng = np.random.default_rng(8)
    s = eco_mod._sample(rng, "small")
    cfg = dict(s.config, numerator_bias=numerator_bias)
    assert eco_mod._check_ste_chain(np.random.default_rng(9)) < 1e-6
    out, cache = ecoformer_attention_forward(s.inputs["x"], s.params, **dict(cfg, hash_grad="none"))
    g = ecoformer_attention_backward(np.ones_like(out), cache)
    assert np.all(g["to_qk.weight"] == 0)  # the codes are held fixed: no gradient into the hash
    out2, cache2 = ecoformer_attention_forward(s.inputs["x"], s.params, **dict(cfg, hash_grad="ste"))
    g2 = ecoformer_attention_backward(np.ones_like(out), cache2)
    np.testing.assert_array_equal(out, out2)
    assert np.any(g2["to_qk.weight"] != 0)
    np.testing.assert_allclose(g["to_v.weight"], g2["to_v.weight"], rtol=0, atol=0)


def test_ecoformer_sum_bias_is_kernel_form():
    """numerator_bias='sum' is the linear attention of the similarity h_i.h_j + c (>= 1)."""
    rng = np.random.default_rng(2)
    h = rng.choice([-1.0, 1.0], size=(2, 6, 3))
    v = rng.standard_normal((2, 6, 2))
    out, _ = binary_linear_attention_forward(h, v, bias=4.0, numerator_bias="sum")
    Wm = h @ np.swapaxes(h, -1, -2) + 4.0
    assert np.all(Wm >= 1)
    np.testing.assert_allclose(out, Wm @ v / Wm.sum(-1, keepdims=True), atol=1e-12)


# --------------------------------------------------------------------------------------------
# Monte-Carlo rates


def _rate_ratio(errors_small, errors_large):
    """RMS(small m) / RMS(large m) and its standard error from the R repeats (delta method)."""
    a, b = errors_small ** 2, errors_large ** 2
    ma, mb = a.mean(), b.mean()
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    ratio = np.sqrt(ma / mb)
    se = 0.5 * ratio * np.sqrt(va / ma ** 2 + vb / mb ** 2)
    return ratio, se


@pytest.mark.parametrize("component,kernel", [("posrf", "gaussian"), ("posrf", "softmax"), ("trigrf", "gaussian"),
                                              ("gerf", "gaussian")])
def test_spectraformer_kernel_error_rate(component, kernel):
    """The kernel estimate's RMS error over R = 300 independent i.i.d.-Gaussian projections falls as
    m^(-1/2): RMS(16)/RMS(256) = 4 within 4 propagated standard errors."""
    rng = np.random.default_rng(17)
    d = 4
    x, y = 0.4 * rng.standard_normal(d), 0.4 * rng.standard_normal(d)
    exact = np.exp(x @ y) if kernel == "softmax" else np.exp(-0.5 * np.sum((x - y) ** 2))
    A = np.array([[[-0.1]]]) if component == "gerf" else None
    errs = {}
    for m in (16, 256):
        e = []
        for r in range(300):
            W = spectraformer_weight_matrix("gaus", m, d, seed=1000 * m + r)
            fx, _ = spectraformer_features_forward(x[None, None], W, component=component, kernel=kernel, A=A,
                                                   stabilizer="none")
            fy, _ = spectraformer_features_forward(y[None, None], W, component=component, kernel=kernel, A=A,
                                                   stabilizer="none")
            e.append(float(np.sum(fx * fy)) - exact)
        errs[m] = np.array(e)
        assert abs(errs[m].mean()) < 4 * errs[m].std() / np.sqrt(len(e))  # unbiased at every m
    ratio, se = _rate_ratio(errs[16], errs[256])
    assert abs(ratio - 4.0) < 4 * se, (ratio, se)


@pytest.mark.parametrize("feature", ["gmm_rks", "gmm_prf"])
def test_kl_kernel_error_rate(feature):
    """Learned spectral kernels: the same m^(-1/2) rate over R = 300 noise draws (GMM parameters fixed)."""
    rng = np.random.default_rng(23)
    d = 4
    params, _ = kl_mod._kl_params(rng, feature, 1, d, 2)
    x, y = 0.4 * rng.standard_normal(d), 0.4 * rng.standard_normal(d)
    errs = {}
    for m in (16, 256):
        big = kl_mod._mc_terms(feature, params, rng.standard_normal((d, 300 * m)), None, x, y)
        errs[m] = big.reshape(300, m).mean(axis=1)
    exact_est = np.concatenate([errs[16], errs[256]]).mean()  # only differences matter for the rate
    ratio, se = _rate_ratio(errs[16] - exact_est, errs[256] - exact_est)
    assert abs(ratio - 4.0) < 4 * se, (ratio, se)


def test_kl_gmm_rks_feature_inner_product_is_the_estimate():
    """phi(x).phi(y) - s^2 is exactly the Monte-Carlo kernel estimate the unbiasedness check uses."""
    rng = np.random.default_rng(4)
    params, cfg = kl_mod._kl_params(rng, "gmm_rks", 2, 4, 6)
    q, k = rng.standard_normal((1, 2, 1, 4)), rng.standard_normal((1, 2, 1, 4))
    Om, _ = kl_spectral_samples_forward("gmm_rks", params, cfg["omega"])
    fq, _ = kl_mod.kl_features_forward(q, Om, kind="rks", scale=6 ** -0.5, smoothing=0.7)
    fk, _ = kl_mod.kl_features_forward(k, Om, kind="rks", scale=6 ** -0.5, smoothing=0.7)
    for hh in range(2):
        p_h = {kk: vv[hh:hh + 1] for kk, vv in params.items()}
        est = kl_mod._mc_terms("gmm_rks", p_h, cfg["omega"], None, q[0, hh, 0], k[0, hh, 0]).sum() / 6
        assert abs(float(fq[0, hh, 0] @ fk[0, hh, 0]) - 0.49 - est) < 1e-12


def test_fastmax_taylor_rate_p1():
    q, k, v = random_qkv(np.random.default_rng(4), "small")
    errs = []
    for s in (0.02, 0.01):
        ref = softmax_attention_reference(s * np.sqrt(q.shape[-1]) * q, k, v)
        errs.append(np.max(np.abs(fastmax_attention(s * q, k, v, p=1) - ref)))
    assert 0.7 * 4 < errs[0] / errs[1] < 1.4 * 4


# --------------------------------------------------------------------------------------------
# torch autograd parity against float64 transcriptions of the formulas


def _torch_parity(forward, backward, torch_fn, arrays, config, *, rtol=1e-11):
    torch = pytest.importorskip("torch")
    t = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in arrays.items()}
    ty = torch_fn(torch, **t)
    g = np.random.default_rng(99).standard_normal(tuple(ty.shape))
    ty.backward(torch.tensor(g))
    out, cache = forward(**arrays, **config)
    np.testing.assert_allclose(out, ty.detach().numpy(), rtol=rtol, atol=1e-13)
    grads = backward(g, cache)
    for k, tv in t.items():
        np.testing.assert_allclose(grads[k], tv.grad.numpy(), rtol=rtol, atol=1e-12, err_msg=k)


def test_torch_parity_fastmax_explicit():
    rng = np.random.default_rng(0)
    q, k, v = random_qkv(rng, "small")

    def fn(torch, q, k, v):
        x = q @ k.transpose(-1, -2) / 1.3
        A = torch.tril(0.9 + 1.1 * x + 0.4 * x * x)
        return A @ v / A.sum(-1, keepdim=True)

    _torch_parity(fastmax_forward, fastmax_backward, fn, {"q": 0.5 * q, "k": 0.5 * k, "v": v},
                  {"causal": True, "temperature": 1.3, "a0": 0.9, "a1": 1.1, "a2": 0.4})


def test_torch_parity_spectraformer_oprf():
    rng = np.random.default_rng(1)
    q, k, v = random_qkv(rng, "small", d=4)
    W = spectraformer_weight_matrix("orf", 10, 4, seed=2)

    def fn(torch, q, k, v):
        a = 4 ** -0.25
        uq, uk = a * q, a * k
        Wt = torch.tensor(W)
        phi = (uq.pow(2).sum(-1).mean(-1) + uk.pow(2).sum(-1).mean(-1)
               + 2 * (uq.mean(-2) * uk.mean(-2)).sum(-1))[..., None, None]
        S = torch.sqrt((2 * phi + 4) ** 2 + 32 * phi)
        rho = (S - 2 * phi - 4) / (4 * phi)
        A = (1 - 1 / rho) / 8

        def feat(u):
            return torch.exp(A * Wt.pow(2).sum(1) + torch.sqrt(1 - 4 * A) * (u @ Wt.T) - u.pow(2).sum(-1, keepdim=True)
                             + torch.log(1 - 4 * A))  # D = (1-4A)^(d/4) with d = 4
        M = feat(uq) @ feat(uk).transpose(-1, -2)
        return M @ v / M.sum(-1, keepdim=True)

    _torch_parity(spectraformer_forward, spectraformer_backward, fn, {"q": q, "k": k, "v": v},
                  {"projection": W, "component": "oprf"})


def test_torch_parity_hypformer():
    rng = np.random.default_rng(2)
    x = hyp_mod._points(rng, (2, 6, 3), 1.0)
    params = hyp_mod._hyp_params(rng, 2, 3)
    torch = pytest.importorskip("torch")

    def fn(torch, x):
        outs = []
        for h in range(2):
            lin = {n: torch.tensor(params[f"{n}.{h}.linear.weight"]) for n in ("Wq", "Wk", "Wv")}
            bias = {n: torch.tensor(params[f"{n}.{h}.linear.bias"]) for n in ("Wq", "Wk", "Wv")}
            qs, ks, vs = (x @ lin[n] + bias[n] for n in ("Wq", "Wk", "Wv"))
            sc = abs(float(params["norm_scale"][0])) + 1e-6

            def fp(u, sc=sc):
                r = (torch.relu(u) + 1e-6) / sc
                return r.norm(dim=-1, keepdim=True) / (r ** 2).norm(dim=-1, keepdim=True) * r ** 2

            A = fp(qs) @ fp(ks).transpose(-1, -2)
            outs.append(A @ vs / (A.sum(-1, keepdim=True) + 1e-6) + vs @ torch.tensor(params["v_map_mlp.weight"])
                        + torch.tensor(params["v_map_mlp.bias"]))
        z = sum(outs) / 2
        return torch.cat([torch.sqrt((z * z).sum(-1, keepdim=True) + 1.0), z], -1)

    _torch_parity(lambda x: hypformer_attention_forward(x, None, params, num_heads=2),
                  lambda g, c: {"x": hypformer_attention_backward(g, c)["x"]}, fn, {"x": x}, {})
    assert torch is not None


def test_infsa_package_parity():
    """Against the authors' PyPI package ``infsa`` when it is installed (optional)."""
    infsa_pkg = pytest.importorskip("infsa")
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 7, 8))
    for variant in ("pure_infsa", "linear_infsa"):
        layer = infsa_pkg.InfSAAttention(8, 2, variant=variant).double()
        o, _ = layer(torch.tensor(x), torch.tensor(x), torch.tensor(x))
        params = {n: (p.detach().numpy().T.copy() if p.ndim == 2 else p.detach().numpy().reshape(-1).copy())
                  for n, p in layer.named_parameters()}
        out = infsa_attention_forward(x, None, None, params, num_heads=2, variant=variant.split("_")[0])[0]
        np.testing.assert_allclose(out, o.detach().numpy(), rtol=1e-12, atol=1e-13)


def test_infsa_directional_both_variants_with_rho():
    """Random-direction check at a larger size; the sample keeps every pre-ReLU score at least 1e-3
    from the kink (the directional step is 1e-5)."""
    rng = np.random.default_rng(6)
    for variant in ("pure", "linear"):
        while True:
            s = Sample({"query": rng.standard_normal((2, 9, 6))}, infsa_mod._infsa_params(rng, 6),
                       {"num_heads": 3, "variant": variant, "rho_grad": "full"})
            _, c = infsa_attention_forward(s.inputs["query"], None, None, s.params, num_heads=3, variant=variant)
            if np.min(np.abs(c["sc"]["S" if variant == "pure" else "sraw"])) > 1e-3:
                break
        directional_check(infsa_attention_forward, infsa_mod.infsa_attention_backward, s)
