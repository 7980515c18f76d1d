"""Operator breadth, slice o1 (issue 17): what the generated registry tests cannot express.

Selective scan (recurrent == chunked with the backward through time, every B/C layout and
discretisation), the radius graph against brute force, finite differences of the non-default
configurations, discretisation convergence, and PyTorch-autograd parity with re-stated formulas
(skipped without torch). Upstream parity itself was measured in scratch scripts (see the docs page).
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from refattn import registry
from refattn.operators import anie, mamba, mamba_neural_operator
from refattn.operators import pde_transformer_channel_attention as pdet
from refattn.operators.anie import anie_backward, anie_forward
from refattn.operators.anisotropic_rbf import anisotropic_rbf_backward, anisotropic_rbf_forward
from refattn.operators.gno_kernel_integral import (
    gno_kernel_integral_backward,
    gno_kernel_integral_forward,
    radius_neighbors,
)
from refattn.operators.mamba import linear_scan, selective_scan_backward, selective_scan_forward
from refattn.operators.mamba_neural_operator import mno_ss2d_backward, mno_ss2d_forward
from refattn.operators.pinto import init_pinto_params, pinto_backward, pinto_forward
from refattn.operators.schwarz_attention import overlapping_subdomains, partition_of_unity, schwarz_attention
from refattn.registry import Sample
from refattn.testing import gradcheck

# Modules whose name is also their main function's: the package attribute is the function
# (``from refattn.blocks import bcos`` gives the function), so take the module itself.
gno_kernel_integral = importlib.import_module("refattn.operators.gno_kernel_integral")
pinto = importlib.import_module("refattn.operators.pinto")

# The records' samplers (module attributes) build the variants below.
anie_sample, gno_sample, mno_sample, pinto_sample = anie._sample, gno_kernel_integral._sample, \
    mamba_neural_operator._sample, pinto._sample

SLUGS = ["selective_scan", "mamba_selective_scan_operator", "gno_kernel_integral_layer",
         "pinto_cross_attention_kernel_integral", "anie_attentional_integral_equation",
         "anisotropic_rbf_field_decoder", "schwarz_domain_decomposition_attention",
         "pde_transformer_channel_attention"]


def test_records_implemented():
    # (their gradchecks, references and named checks run in the generated tests/test_registry.py)
    for slug in SLUGS:
        rec = registry.get(slug)
        assert rec.implemented and rec.family == "3-operator", slug


# ------------------------------------------------------------------------------ selective scan


@pytest.mark.parametrize("layout", ["invariant", "variable", "grouped"])
@pytest.mark.parametrize("disc", ["euler", "zoh"])
def test_scan_gradcheck_every_layout(layout, disc):
    # chunked mode (equal to the loop to round-off, forward and backward: the test below)
    mode = "chunked"
    s = mamba._sample(np.random.default_rng(4), "tiny", layout=layout, discretization=disc)
    if layout == "grouped":                      # G = 2 groups need Dm divisible by 2: Dm = 4
        rng = np.random.default_rng(5)
        s.inputs.update(u=rng.standard_normal((2, 4, 3)), delta=rng.standard_normal((2, 4, 3)) - 1,
                        z=rng.standard_normal((2, 4, 3)), A=-np.exp(rng.standard_normal((4, 2))),
                        D=rng.standard_normal(4), delta_bias=rng.standard_normal(4))
    gradcheck(selective_scan_forward, selective_scan_backward, Sample(s.inputs, None, dict(s.config, mode=mode)))


def test_scan_long_sequence_chunked_equals_recurrent():
    # Many chunks (L = 300, chunk 16), strong decay and growth-free: forward and backward to round-off.
    rng = np.random.default_rng(0)
    u, dlt = rng.standard_normal((2, 3, 300)), rng.standard_normal((2, 3, 300))
    a = -np.exp(rng.standard_normal((3, 4)))
    b, c = rng.standard_normal((2, 4, 300)), rng.standard_normal((2, 4, 300))
    outs, grads = [], []
    g = rng.standard_normal((2, 3, 300))
    for mode in ("recurrent", "chunked"):
        out, cache = selective_scan_forward(u, dlt, a, b, c, delta_softplus=True, mode=mode, chunk_size=16)
        outs.append(out)
        grads.append(selective_scan_backward(g, cache))
    assert np.abs(outs[0] - outs[1]).max() < 1e-12 * np.abs(outs[0]).max()
    for k in grads[0]:
        assert np.abs(grads[0][k] - grads[1][k]).max() < 1e-11 * np.abs(grads[0][k]).max(), k


def test_linear_scan_matches_loop():
    rng = np.random.default_rng(1)
    la, b = -rng.uniform(0, 2, (3, 17, 2)), rng.standard_normal((3, 17, 2))
    h, ref = np.zeros((3, 2)), []
    for t in range(17):
        h = np.exp(la[:, t]) * h + b[:, t]
        ref.append(h)
    for chunk in (1, 4, 17, 40):
        assert np.abs(linear_scan(la, b, chunk_size=chunk) - np.stack(ref, 1)).max() < 1e-14


def test_scan_rejects_bad_group_count():
    rng = np.random.default_rng(0)
    u = rng.standard_normal((2, 3, 4))
    with pytest.raises(ValueError, match="B of shape"):
        selective_scan_forward(u, u, -np.ones((3, 2)), np.ones((2, 2, 2, 4)), np.ones((2, 2, 2, 4)))


def test_mno_unidirectional_and_explicit_orders_gradcheck():
    s = mno_sample(np.random.default_rng(2), "tiny")
    perms = np.stack([np.arange(4), np.array([2, 0, 3, 1])])
    gradcheck(mno_ss2d_forward, mno_ss2d_backward, Sample(s.inputs, s.params, dict(s.config, scan_orders=perms)))


# --------------------------------------------------------------------------------------------- GNO


@pytest.mark.parametrize("seed", range(6))
def test_radius_graph_against_brute_force(seed):
    rng = np.random.default_rng(seed)
    d = 1 + seed % 3
    data = rng.uniform(0, 1, (int(rng.integers(1, 60)), d))
    queries = rng.uniform(0, 1, (int(rng.integers(1, 30)), d))
    r = float(rng.uniform(0.01, 0.8))
    idx, splits = radius_neighbors(data, queries, r)
    dist = np.linalg.norm(queries[:, None] - data[None], axis=-1)
    brute = [np.flatnonzero(row <= r) for row in dist]
    assert splits[0] == 0 and np.array_equal(np.diff(splits), [len(b) for b in brute])
    assert np.array_equal(idx, np.concatenate(brute).astype(np.int64))


def test_radius_graph_boundary_inclusive():
    data = np.array([[0.0], [0.5], [1.0]])
    idx, splits = radius_neighbors(data, np.array([[0.0]]), 0.5)
    assert idx.tolist() == [0, 1] and splits.tolist() == [0, 2]


@pytest.mark.parametrize("ttype,reduction,emb", [
    ("linear", "sum", "transformer"), ("linear", "mean", None), ("linear_kernelonly", "sum", None),
    ("linear_kernelonly", "mean", "transformer"), ("nonlinear_kernelonly", "sum", "transformer"),
    ("nonlinear_kernelonly", "mean", None)])
def test_gno_gradcheck_configurations(ttype, reduction, emb):
    s = gno_sample(np.random.default_rng(3), "tiny", transform_type=ttype)
    p = {k: v for k, v in s.params.items()}
    if emb is None:                         # kernel input is the raw coordinates: rebuild the first layer
        rng = np.random.default_rng(4)
        extra = 2 if ttype.startswith("nonlinear") else 0
        p["channel_mlp.fcs.0.weight"] = rng.standard_normal((4 + extra, p["channel_mlp.fcs.0.weight"].shape[1]))
    inputs = dict(s.inputs, weights=None) if reduction == "mean" else s.inputs
    inputs = {k: v for k, v in inputs.items() if v is not None}
    cfg = dict(s.config, transform_type=ttype, reduction=reduction, pos_embedding=emb,
               pos_embedding_channels=1)
    gradcheck(gno_kernel_integral_forward, gno_kernel_integral_backward, Sample(inputs, p, cfg))


def test_gno_self_graph_without_x():
    # x = y: both kernel arguments move with y; the gradient sums both contributions.
    s = gno_sample(np.random.default_rng(6), "tiny")
    inputs = {k: v for k, v in s.inputs.items() if k != "x"}
    y = inputs["y"]
    d = np.sort(np.linalg.norm(y[:, :, None] - y[:, None], axis=-1).ravel())
    d = d[d > 0]
    k = int(np.argmax(np.diff(d)))
    cfg = dict(s.config, radius=float(0.5 * (d[k] + d[k + 1])))
    gradcheck(gno_kernel_integral_forward, gno_kernel_integral_backward, Sample(inputs, s.params, cfg))


def test_gno_empty_neighbourhood_is_zero():
    s = gno_sample(np.random.default_rng(0), "tiny")
    x = s.inputs["x"] + 10.0
    out = gno_kernel_integral_forward(**dict(s.inputs, x=x), params=s.params, **s.config)[0]
    assert np.all(out == 0.0)


# ------------------------------------------------------------------------------ PINTO / ANIE / RBF


@pytest.mark.parametrize("activation", ["tanh", "swish"])
@pytest.mark.parametrize("residual", [False, True])
def test_pinto_gradcheck_configurations(activation, residual):
    s = pinto_sample(np.random.default_rng(1), "tiny", activation=activation, residual=residual)
    if residual:   # the skip needs three projection layers
        rng = np.random.default_rng(2)
        p = init_pinto_params(rng, 2, 1, 1, d_model=2, num_heads=2, key_dim=1, n_units=1, projection=(2, 2))
        s = Sample(s.inputs, {k: v + 0.2 * rng.standard_normal(v.shape) for k, v in p.items()}, s.config)
    gradcheck(pinto_forward, pinto_backward, s)


@pytest.mark.parametrize("att", ["fourier", "softmax"])
def test_anie_gradcheck_attention_types(att):
    s = anie_sample(np.random.default_rng(2), "tiny", attention_type=att)
    gradcheck(anie_forward, anie_backward, s)


def test_anie_implicit_gradient_matches_finite_differences_of_the_fixed_point():
    # The implicit gradient is the derivative of the exact fixed point: FD on f of a converged solve.
    s = anie_sample(np.random.default_rng(4), "small")
    p = {k: (0.3 * v if k.endswith("weight") and "layer_norm" not in k else v) for k, v in s.params.items()}
    cfg = dict(s.config, residual=False, lam=0.4, smoothing_factor=0.0, n_iterations=80, tol=1e-14)
    out, cache = anie_forward(**s.inputs, params=p, **dict(cfg, gradient="implicit"))
    g = np.random.default_rng(0).standard_normal(out.shape)
    df = anie_backward(g, cache)["f"]
    eps, i = 1e-6, (1, 2, 0)
    fp, fm = s.inputs["f"].copy(), s.inputs["f"].copy()
    fp[i] += eps
    fm[i] -= eps
    fd = np.sum((anie_forward(fp, s.inputs["coords"], p, **cfg)[0] - anie_forward(fm, s.inputs["coords"], p, **cfg)[0])
                * g) / (2 * eps)
    assert abs(fd - df[i]) < 1e-7 * max(abs(fd), 1e-3)


def test_rbf_gradcheck_axis_aligned():
    rng = np.random.default_rng(0)
    s = registry.get("anisotropic_rbf_field_decoder").sample(rng, "tiny")
    inputs = {k: v for k, v in s.inputs.items() if k != "frames"}
    gradcheck(anisotropic_rbf_forward, anisotropic_rbf_backward, Sample(inputs))


# --------------------------------------------------------------------------- Schwarz / PDE-Transformer


def test_schwarz_global_low_rank_baseline():
    # One subdomain covering the grid, no coarse level: the global QK^T attention baseline.
    rng = np.random.default_rng(0)
    n, r = 10, 3
    q, k, f = rng.standard_normal((n, r)), rng.standard_normal((n, r)), rng.standard_normal((2, n))
    out = schwarz_attention(f, {"local.0.Q": q, "local.0.K": k}, subdomains=[np.arange(n)], pu_weights=[np.ones(n)])
    assert np.abs(out - f @ (q @ k.T).T).max() < 1e-13


def test_schwarz_rejects_non_partition_of_unity():
    subs = overlapping_subdomains(8, 2, 1)
    bad = [w * 1.1 for w in partition_of_unity(subs, 8)]
    params = {f"local.{i}.{m}": np.ones((s.size, 1)) for i, s in enumerate(subs) for m in "QK"}
    with pytest.raises(ValueError, match="partition of unity"):
        schwarz_attention(np.ones((1, 8)), params, subdomains=subs, pu_weights=bad)


@pytest.mark.parametrize("attn_type,gate", [("v1", "one_plus"), ("v2", "zero")])
def test_pde_channel_attention_gradcheck(attn_type, gate):
    s = pdet._sample(np.random.default_rng(7), "tiny", attn_type=attn_type)
    gradcheck(pdet.pde_channel_attention_forward, pdet.pde_channel_attention_backward,
              Sample(s.inputs, s.params, dict(s.config, gate=gate)))


# ------------------------------------------------------------------- PyTorch autograd (re-stated math)


def test_scan_matches_torch_autograd_of_the_recurrence():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    arr = dict(u=rng.standard_normal((2, 3, 9)), delta=rng.standard_normal((2, 3, 9)),
               A=-np.exp(rng.standard_normal((3, 4))), B=rng.standard_normal((2, 4, 9)),
               C=rng.standard_normal((2, 4, 9)), D=rng.standard_normal(3), z=rng.standard_normal((2, 3, 9)),
               delta_bias=rng.standard_normal(3))
    t = {k: torch.tensor(v, requires_grad=True) for k, v in arr.items()}
    dlt = torch.nn.functional.softplus(t["delta"] + t["delta_bias"][:, None])
    h, ys = torch.zeros(2, 3, 4, dtype=torch.float64), []
    for i in range(9):
        h = torch.exp(dlt[:, :, i, None] * t["A"]) * h + dlt[:, :, i, None] * t["B"][:, None, :, i] * t["u"][:, :, i, None]
        ys.append((h * t["C"][:, None, :, i]).sum(-1))
    out_t = (torch.stack(ys, -1) + t["D"][:, None] * t["u"]) * torch.nn.functional.silu(t["z"])
    g = rng.standard_normal(out_t.shape)
    (out_t * torch.tensor(g)).sum().backward()
    out, cache = selective_scan_forward(**arr, delta_softplus=True, chunk_size=4)
    grads = selective_scan_backward(g, cache)
    assert np.abs(out - out_t.detach().numpy()).max() < 1e-13
    for k in arr:
        assert np.abs(grads[k] - t[k].grad.numpy()).max() < 1e-12 * np.abs(t[k].grad.numpy()).max(), k


def test_pde_channel_attention_matches_torch_sdpa():
    # v1 channel attention is scaled-dot-product attention over the channel axis.
    torch = pytest.importorskip("torch")
    s = pdet._sample(np.random.default_rng(1), "small", attn_type="v1")
    p, x, emb = s.params, s.inputs["x"], s.inputs["emb"]
    d, h = x.shape[-1], s.config["num_heads"]
    tx = torch.tensor(x)
    mod = torch.nn.functional.silu(torch.tensor(emb)) @ torch.tensor(p["adain_2.linear.weight"]) \
        + torch.tensor(p["adain_2.linear.bias"])
    shift, scale, gate = (mod[..., j * d:(j + 1) * d][:, :, None] for j in (3, 4, 5))
    y = torch.nn.functional.layer_norm(tx, (d,), torch.tensor(p["norm2.weight"]), torch.tensor(p["norm2.bias"]))
    y = (y * (1 + scale) + shift).transpose(1, 2)
    q, k, v = (y @ torch.tensor(p["attn_channel.to_qkv.weight"])).split(d, -1)
    heads = [t.reshape(t.shape[:-1] + (h, d // h)).transpose(-2, -3) for t in (q, k, v)]
    o = torch.nn.functional.scaled_dot_product_attention(*heads).transpose(-2, -3).reshape(y.shape)
    ref = tx + o.transpose(1, 2) * (1 + gate)
    got = pdet.pde_channel_attention(x, emb, p, **s.config)
    assert np.abs(got - ref.numpy()).max() < 1e-13
