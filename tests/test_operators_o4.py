"""Operator slice o4 (issue 17, T3): what the registry cannot express.

HodgeFormer: finite differences for the variants the registry sample does not draw (full/softmax
stars, non-symmetric Q/K, no norm, single modes), the explicit-matrix reference for them, the
exterior identities of the sample complex, and argument errors.

FUNCATTN: first-order convergence of the output under grid refinement (the paper's
resolution-invariance claim), exact point-duplication invariance with the upstream clamp and
structured mesh, the dual (solve) form against the primal inverse for G < D (rank-deficient
k^T k, where only the ridge keeps A invertible), finite differences of the irregular-mesh
default, and argument errors.
"""

from __future__ import annotations

import numpy as np
import pytest

from refattn import registry
from refattn.operators import funcattn_init_params, hodgeformer_init_params
from refattn.operators.funcattn import funcattn_backward, funcattn_forward, funcattn_functional_attention
from refattn.operators.hodgeformer import (
    _reference_hodge,
    _sample_hodge,
    _tetra_boundary,
    hodgeformer_backward,
    hodgeformer_forward,
)
from refattn.registry import Sample
from refattn.testing import gradcheck

SLUGS_IMPLEMENTED = ["funcattn_functional_attention", "hodgeformer_hodge_operators"]


def _fields(t):
    return np.stack([np.sin(2 * np.pi * t), np.cos(3 * np.pi * t), t ** 2 - 0.5], axis=-1)


def _layer(rng):
    p = funcattn_init_params(rng, 3, n_head=2, dim_head=3, basis_num=4, alpha_init=0.2)
    for k in p:
        if k not in ("temperature", "alpha"):
            p[k] = p[k] + 0.3 * rng.standard_normal(p[k].shape)
    return p


def test_funcattn_grid_refinement_converges_first_order():
    # Same smooth fields sampled on nested grids of [0, 1]: outputs at the shared points converge to
    # the finest grid's at O(h) (the slice coefficients are Riemann-sum averages).
    rng = np.random.default_rng(0)
    p = _layer(rng)

    def out(n):
        t = np.linspace(0.0, 1.0, n)
        x = np.stack([_fields(t), _fields(t)[::-1]])
        return funcattn_functional_attention(x, p, n_head=2, tau_clamp=None, slice_eps=0.0)

    ref = out(1025)
    errs = []
    for n in (17, 33, 65, 129):
        stride = (1025 - 1) // (n - 1)
        errs.append(float(np.abs(out(n) - ref[:, ::stride]).max()))
    ratios = [errs[i] / errs[i + 1] for i in range(len(errs) - 1)]
    assert errs[-1] < 2e-2, errs
    assert all(1.6 < r < 2.6 for r in ratios), (errs, ratios)


def test_funcattn_duplication_invariance_structured():
    # Structured mesh: doubling each row of a constant-in-row field is not a pointwise duplication, so
    # use the irregular form with the upstream structured clamp: exact when slice_eps = 0.
    rng = np.random.default_rng(1)
    p = _layer(rng)
    x = rng.standard_normal((2, 7, 3))
    o = funcattn_functional_attention(x, p, n_head=2, slice_eps=0.0)
    o2 = funcattn_functional_attention(np.repeat(x, 4, axis=1), p, n_head=2, slice_eps=0.0)
    assert np.abs(o2[:, ::4] - o).max() < 1e-12


def test_funcattn_ridge_keeps_rank_deficient_keys_solvable():
    # G = 2 < D = 3: k^T k has rank 2; A = (1-a) k^T k + a I is still SPD and the dual solve equals the
    # explicit inverse; at a -> 0 the solve would be singular.
    rng = np.random.default_rng(2)
    p = funcattn_init_params(rng, 4, n_head=1, dim_head=3, basis_num=2, alpha_init=-1.0)
    x = rng.standard_normal((2, 6, 4))
    _, c = funcattn_forward(x, p, n_head=1)
    assert np.linalg.matrix_rank(c["ktk"][0, 0]) == 2
    a = c["a"]
    inv = np.linalg.inv((1 - a) * c["ktk"] + a * np.eye(3))
    cm = c["q"] @ inv @ np.swapaxes(c["k"], -1, -2)
    assert np.abs(cm - c["cmap"]).max() < 1e-12
    s = Sample(inputs={"x": x}, params=p, config={"n_head": 1})
    assert gradcheck(funcattn_forward, funcattn_backward, s).max_rel < 1e-6


def test_funcattn_fd_irregular_default_clamp_and_alpha():
    # The registry samples tau_clamp=None; check the default clamp (0.1, 5) with one temperature
    # clamped (its gradient is zero) and a large |alpha|.
    rng = np.random.default_rng(3)
    p = _layer(rng)
    p["temperature"] = np.array([0.05, 0.8])
    p["alpha"] = np.full(1, 2.5)
    s = Sample(inputs={"x": rng.standard_normal((2, 4, 3))}, params=p, config={"n_head": 2})
    r = gradcheck(funcattn_forward, funcattn_backward, s)
    assert r.max_rel < 1e-6
    _, c = funcattn_forward(**s.inputs, params=p, n_head=2)
    g = funcattn_backward(np.ones((2, 4, 3)), c)
    assert g["temperature"][0] == 0.0 and g["temperature"][1] != 0.0


def test_funcattn_bad_input():
    rng = np.random.default_rng(4)
    p = _layer(rng)
    x = rng.standard_normal((2, 6, 3))
    with pytest.raises(ValueError, match="mesh_shape"):
        funcattn_forward(x, p, n_head=2, mesh_shape=(2, 3))   # Linear weights, not conv
    q = dict(p)
    q.pop("alpha")
    with pytest.raises(ValueError, match="alpha"):
        funcattn_forward(x, q, n_head=2)
    with pytest.raises(ValueError, match="alpha"):
        funcattn_forward(x, dict(p, alpha=np.zeros(())), n_head=2)
    pc = funcattn_init_params(rng, 3, n_head=2, dim_head=3, basis_num=4, mesh_ndim=2)
    with pytest.raises(ValueError, match="mesh_shape"):
        funcattn_forward(x, pc, n_head=2, mesh_shape=(2, 2))
    _, c = funcattn_forward(x, p, n_head=2)
    with pytest.raises(ValueError):
        funcattn_backward(np.ones((2, 6, 4)), c)


@pytest.mark.parametrize("slug", SLUGS_IMPLEMENTED)
def test_records_implemented(slug):
    m = registry.get(slug)
    assert m.implemented and m.tier == "T3" and m.family == "3-operator"


@pytest.mark.parametrize("modes,sym,norm,ht", [
    (("v", "e"), True, "layer_norm", "full"),
    (("v", "e", "f"), False, "layer_norm", "diag"),
    (("v", "e", "f"), False, None, "full"),
    (("f",), True, None, "diag"),
    (("e",), False, "layer_norm", "full"),
])
def test_hodgeformer_variants_fd_and_reference(modes, sym, norm, ht):
    rng = np.random.default_rng(5)
    s = _sample_hodge(modes, sym, ht)(rng, "tiny")
    s.config["norm_type"] = norm
    if ht == "diag" and not sym:
        # sigma = q.k / sqrt(d) may cross -eps: keep it away from the pole of the inverse star
        s.inputs["x_v"] = np.abs(s.inputs["x_v"])
        s.inputs["x_e"] = np.abs(s.inputs["x_e"])
        for k in s.params:
            if k.endswith("linears.0.weight") or k.endswith("linears.1.weight"):
                s.params[k] = np.abs(s.params[k]) + 0.3
        s.config["norm_type"] = None
    out, _ = hodgeformer_forward(**s.inputs, params=s.params, **s.config)
    ref = _reference_hodge(**s.inputs, params=s.params, **s.config)
    assert np.abs(out - ref).max() < 1e-10 * max(1.0, np.abs(ref).max())
    assert gradcheck(hodgeformer_forward, hodgeformer_backward, s).max_rel < 1e-6


def test_hodgeformer_incidence_identities_and_passthrough():
    d0, d1 = _tetra_boundary()
    assert np.abs(d1 @ d0).max() == 0.0          # d d = 0 on the sample complex
    rng = np.random.default_rng(6)
    s = _sample_hodge(("v",), True, "full")(rng, "small")
    out, c = hodgeformer_forward(**s.inputs, params=s.params, **s.config)
    assert np.array_equal(out[:, 4:10], s.inputs["x_e"]) and np.array_equal(out[:, 10:], s.inputs["x_f"])
    g = hodgeformer_backward(np.ones_like(out), c)
    assert np.array_equal(g["x_f"], np.ones_like(s.inputs["x_f"]))


def test_hodgeformer_bad_input():
    rng = np.random.default_rng(7)
    s = _sample_hodge(("v", "e"), True, "diag")(rng, "small")
    cfg = dict(s.config)
    with pytest.raises(ValueError, match="modes"):
        hodgeformer_forward(**s.inputs, params=s.params, **dict(cfg, modes=("x",)))
    with pytest.raises(ValueError, match="hodge_type"):
        hodgeformer_forward(**s.inputs, params=s.params, **dict(cfg, hodge_type="grouped"))
    with pytest.raises(ValueError, match="d0"):
        hodgeformer_forward(**s.inputs, params=s.params, **dict(cfg, d0=cfg["d0"][:, :5]))
    with pytest.raises(ValueError, match="x_e"):
        hodgeformer_forward(s.inputs["x_v"], s.inputs["x_e"][..., :4], s.inputs["x_f"], s.params, **cfg)
    with pytest.raises(ValueError, match="n_head"):
        hodgeformer_forward(**s.inputs, params=s.params, **dict(cfg, n_head=4))
    with pytest.raises(ValueError, match="f_linears.0.weight"):
        hodgeformer_forward(**s.inputs, params={k: v for k, v in s.params.items() if k != "f_linears.0.weight"}, **cfg)
    assert set(hodgeformer_init_params(rng, 6)) == set(s.params)
