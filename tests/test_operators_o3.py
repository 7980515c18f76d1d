"""Operator slice o3 (issue 17, T3): what the registry cannot express.

Radius graphs against brute force at the inclusive boundary, finite differences for the variants
the generated tests do not sample, the fast forms against the explicit references for
configurations no registry check draws, discretisation convergence of the graph-kernel encoders on
refined point sets, exact point-duplication invariance, the Sinkhorn backward choices, a torch
autograd transcription of the AOT-POT formula, and argument errors per layer.
"""

from __future__ import annotations

import numpy as np
import pytest

from refattn import registry
from refattn.operators import (
    aot_pot_stream_mixing,
    aot_pot_stream_mixing_backward,
    aot_pot_stream_mixing_forward,
    cape_block,
    cotap,
    cotap_backward,
    cotap_forward,
    magno,
    magno_forward,
    mano_attention,
    mano_levels,
    mino_encoder,
    mino_encoder_forward,
)
from refattn.operators.physgto_attention import physgto_attention
from refattn.testing import gradcheck

SLUGS = ["mano_multipole_attention", "gaot_magno", "cape_parameter_channel_attention", "mino_gno_cross_attention",
         "physgto_projection_attention", "mono_cotap_ot_projection", "aot_pot_multistream_sinkhorn"]


def _module(slug):
    import importlib

    return importlib.import_module(registry.get(slug).module)


# --------------------------------------------------------------------------------------------
# Records


def test_slice_records():
    for slug in SLUGS:
        assert registry.get(slug).implemented, slug
    cato = registry.get("cato_charted_axial_attention")
    assert not cato.implemented and cato.forward is None and len(cato.notes) > 200


# --------------------------------------------------------------------------------------------
# Radius graphs: the layers' neighbourhoods equal the brute-force distance matrix, boundary included


def _grid_points(n):
    t = np.arange(n) / 4.0                         # exact binary fractions: distances hit r exactly
    return np.stack(np.meshgrid(t, t, indexing="ij"), -1).reshape(-1, 2)


def test_magno_graph_inclusive_boundary_matches_brute_force():
    mod = _module("gaot_magno")
    s = mod._sample(np.random.default_rng(0), "small")
    src = _grid_points(5)
    dst = np.array([[0.5, 0.5], [0.25, 0.75], [1.0, 0.0]])
    f = np.random.default_rng(1).standard_normal((2, len(src), s.inputs["f"].shape[2]))
    cfg = dict(s.config, src_coord=src, dst_coord=dst, radius=0.25, scales=(1.0, 2.0))
    _, cache = magno_forward(f, s.params, **cfg)
    for fac, (eb, ei, ej) in zip(cfg["scales"], cache["graphs"]):
        brute = np.argwhere(np.linalg.norm(dst[:, None] - src[None], axis=-1) <= 0.25 * fac)
        assert np.array_equal(np.stack([ei[eb == 1], ej[eb == 1]], 1), brute)
    # exactly-at-radius neighbours are inside: (0.5, 0.5) has its 4 grid neighbours at distance r
    eb, ei, ej = cache["graphs"][0]
    assert np.sum((eb == 0) & (ei == 0)) == 5


def test_mino_graph_inclusive_boundary_matches_brute_force():
    mod = _module("mino_gno_cross_attention")
    s = mod._sample(np.random.default_rng(0), "small")
    src = _grid_points(5)
    dst = np.array([[0.5, 0.5], [0.0, 0.0], [0.6, 0.1]])
    f = np.random.default_rng(1).standard_normal((2, len(src), s.inputs["f"].shape[2]))
    _, cache = mino_encoder_forward(f, s.params, input_pos=src, query_pos=dst, radius=0.25,
                                    num_heads=s.config["num_heads"])
    ei, ej = cache["graph"]
    brute = np.argwhere(np.linalg.norm(dst[:, None] - src[None], axis=-1) <= 0.25)
    assert np.array_equal(np.stack([ei, ej], 1), brute)
    assert np.sum(ei == 1) == 3                     # the corner: itself and two neighbours at exactly r


# --------------------------------------------------------------------------------------------
# Finite differences for the variants the generated tests do not sample


@pytest.mark.parametrize("kw", [{"role": "decoder", "use_scale_weights": True},
                                {"attention_type": "dot_product", "transform_type": "nonlinear", "node_embedding": True},
                                {"shared": False, "use_geoembed": False}])
def test_magno_variants_gradcheck(kw):
    mod = _module("gaot_magno")
    s = mod._sample(np.random.default_rng(2), "tiny", **kw)
    assert gradcheck(mod.magno_forward, mod.magno_backward, s).passed


@pytest.mark.parametrize("variant", ["task2", "task3"])
def test_physgto_variants_gradcheck(variant):
    mod = _module("physgto_projection_attention")
    s = mod._sample(np.random.default_rng(3), "tiny", variant=variant)
    if variant == "task3":                          # one head of width 2 keeps the three MHAs small
        p = mod.init_physgto_attention_params(np.random.default_rng(4), 2, 1, 2, variant="task3")
        for k in p:
            if k.endswith("bias"):
                p[k] = 0.3 * np.random.default_rng(5).standard_normal(p[k].shape)
        s = type(s)(inputs={"x": np.random.default_rng(6).standard_normal((2, 3, 2))}, params=p,
                    config={"num_heads": 1, "variant": "task3"})
    assert gradcheck(mod.physgto_attention_forward, mod.physgto_attention_backward, s).passed


@pytest.mark.parametrize("kw", [{"nd": 2}, {"nd": 1, "if_11cnv": True}])
def test_cape_variants_gradcheck(kw):
    mod = _module("cape_parameter_channel_attention")
    rng = np.random.default_rng(7)
    s = mod._sample(rng, "tiny", **kw)
    if kw["nd"] == 2:                               # a 4x4 field keeps the 2-D Jacobian small
        p = mod.init_cape_params(rng, 1, (4, 4), widening_factor=2, kernel_size=3, modes=(1, 1))
        p["LN.weight"] = p["LN.weight"] + 0.3 * rng.standard_normal((4, 4))
        s = type(s)(inputs={"x": rng.standard_normal((2, 1, 4, 4)), "x_p": rng.uniform(0.2, 2.0, (2, 1))}, params=p)
    assert gradcheck(mod.cape_block_forward, mod.cape_block_backward, s).passed


@pytest.mark.parametrize("kw", [{"downsampling": "avg_pool", "upsampling": "avg_pool"},
                                {"kernel_size": 4, "stride": 2, "levels": 1}])
def test_mano_variants_gradcheck(kw):
    mod = _module("mano_multipole_attention")
    s = mod._sample(np.random.default_rng(8), "tiny", **kw)
    assert gradcheck(mod.mano_attention_forward, mod.mano_attention_backward, s).passed


def test_mino_depth_three_gradcheck():
    # two rest blocks: the key/value gradients of every cross-attention accumulate on the GNO tokens
    mod = _module("mino_gno_cross_attention")
    rng = np.random.default_rng(9)
    s = mod._sample(rng, "tiny")
    p = mod.init_mino_encoder_params(rng, 2, 3, depth=3, mlp_hidden=2)
    for k in p:
        p[k] = p[k] + 0.3 * rng.standard_normal(p[k].shape)
    s = type(s)(inputs=s.inputs, params=p, config=s.config)
    assert gradcheck(mod.mino_encoder_forward, mod.mino_encoder_backward, s).passed


@pytest.mark.parametrize("iters", [1, 6])
def test_aot_pot_three_streams_gradcheck(iters):
    # The sampler's tiny case has n = 2 streams, where every doubly stochastic matrix is symmetric;
    # three streams exercise a general Sinkhorn plan, at one round and at several.
    mod = _module("aot_pot_multistream_sinkhorn")
    rng = np.random.default_rng(17)
    p = mod.init_aot_pot_params(rng, 3, 2, hidden=2, alpha=0.7)
    for k in p:
        if k.startswith(("phi_", "b_")):
            p[k] = 0.5 * rng.standard_normal(p[k].shape)
    s = registry.Sample(inputs={"x": rng.standard_normal((2, 1, 3, 2))}, params=p, config={"sinkhorn_iters": iters})
    assert gradcheck(mod.aot_pot_stream_mixing_forward, mod.aot_pot_stream_mixing_backward, s).passed


@pytest.mark.parametrize("kw", [{"param_transform": "sigmoid_log", "combine": "scale"},
                                {"param_transform": "identity", "combine": "add"}])
def test_cape_transform_and_combine_swapped_gradcheck(kw):
    # 1-D with the 2-D defaults and the reverse (identity parameters are drawn positive for both)
    mod = _module("cape_parameter_channel_attention")
    rng = np.random.default_rng(18)
    if kw["combine"] == "scale":
        s = mod._sample(rng, "tiny")
    else:
        p = mod.init_cape_params(rng, 1, (4, 4), widening_factor=2, kernel_size=3, modes=(1, 1))
        p["LN.weight"] = p["LN.weight"] + 0.3 * rng.standard_normal((4, 4))
        s = registry.Sample(inputs={"x": rng.standard_normal((2, 1, 4, 4)), "x_p": rng.uniform(0.2, 2.0, (2, 1))},
                            params=p)
    s = type(s)(inputs=s.inputs, params=s.params, config=kw)
    assert gradcheck(mod.cape_block_forward, mod.cape_block_backward, s).passed


# --------------------------------------------------------------------------------------------
# Fast forms against the explicit references, for configurations no registry check draws


def test_cotap_row_normalized_and_implicit_forward_match_reference():
    mod = _module("mono_cotap_ot_projection")
    s = mod._sample(np.random.default_rng(19), "small", row_normalized=True)
    ref = mod._reference(**s.inputs, params=s.params, **s.config)
    for grad in ("unrolled", "implicit"):           # the backward choice never changes the forward
        out = cotap(**s.inputs, params=s.params, **dict(s.config, grad=grad))
        np.testing.assert_allclose(out, ref, rtol=0, atol=1e-12)


def test_mino_depth_three_matches_reference():
    mod = _module("mino_gno_cross_attention")
    rng = np.random.default_rng(20)
    s = mod._sample(rng, "small")
    p = mod.init_mino_encoder_params(rng, 3, 8, depth=3, mlp_hidden=6)
    for k in p:
        p[k] = p[k] + 0.2 * rng.standard_normal(p[k].shape)
    np.testing.assert_allclose(mino_encoder(**s.inputs, params=p, **s.config),
                               mod._reference(**s.inputs, params=p, **s.config), rtol=0, atol=1e-11)


@pytest.mark.parametrize("kw", [{"levels": 1}, {"kernel_size": 4, "stride": 4, "levels": 2},
                                {"downsampling": "avg_pool", "upsampling": "conv"}])
def test_mano_undrawn_configurations_match_reference(kw):
    mod = _module("mano_multipole_attention")
    s = mod._sample(np.random.default_rng(21), "small", **kw)
    np.testing.assert_allclose(mano_attention(**s.inputs, params=s.params, **s.config),
                               mod._reference(**s.inputs, params=s.params, **s.config), rtol=0, atol=1e-12)


def test_aot_pot_one_round_matches_reference():
    mod = _module("aot_pot_multistream_sinkhorn")
    s = mod._sample(np.random.default_rng(22), "small")
    cfg = dict(s.config, sinkhorn_iters=1)
    np.testing.assert_allclose(aot_pot_stream_mixing(**s.inputs, params=s.params, **cfg),
                               mod._reference(**s.inputs, params=s.params, **cfg), rtol=0, atol=1e-12)


def test_magno_all_options_at_once_match_reference():
    mod = _module("gaot_magno")
    s = mod._sample(np.random.default_rng(23), "small", role="decoder", attention_type="dot_product",
                    transform_type="nonlinear", node_embedding=True, use_scale_weights=True, shared=False)
    np.testing.assert_allclose(magno(**s.inputs, params=s.params, **s.config),
                               mod._reference(**s.inputs, params=s.params, **s.config), rtol=0, atol=1e-11)


@pytest.mark.parametrize("kw", [{"param_transform": "sigmoid_log", "combine": "scale"},
                                {"nd": 2, "param_transform": "identity", "combine": "add"}])
def test_cape_swapped_options_match_reference(kw):
    mod = _module("cape_parameter_channel_attention")
    kw = dict(kw)
    s = mod._sample(np.random.default_rng(24), "small", nd=kw.pop("nd", 1))
    np.testing.assert_allclose(cape_block(**s.inputs, params=s.params, **kw),
                               mod._reference(**s.inputs, params=s.params, **kw), rtol=0, atol=1e-11)


# --------------------------------------------------------------------------------------------
# Discretisation: the same function on refined point sets


def _grid(n):
    return ((np.arange(n) + 0.5) / n)[:, None]


def _field(p):
    return np.stack([np.sin(2 * np.pi * p[:, 0]), np.exp(-p[:, 0])], -1)[None]


@pytest.mark.parametrize("slug", ["gaot_magno", "mino_gno_cross_attention"])
def test_graph_encoders_converge_under_refinement(slug):
    # Nested midpoint grids of n, 3n, 9n cells of [0, 1] sample one smooth field; the outputs at
    # fixed latent points converge (the neighbourhood averages are Riemann-sum ratios; the cut of
    # the ball boundary makes the rate first order): each gap shrinks by more than 2 and the finest
    # is small compared with the output. 1-D, so that MINO's sin-cos embedding (frequencies up to
    # 128 rad per unit length) is resolved by the finer grids.
    rng = np.random.default_rng(10)
    lat = np.array([[0.37], [0.62], [0.5], [0.81]])
    if slug == "gaot_magno":
        mod = _module(slug)
        p = mod.init_magno_params(rng, 2, 4, 1, hidden=8, mlp_layers=2, geo_hidden=8)

        def run(n):
            return magno(_field(_grid(n)), p, src_coord=_grid(n), dst_coord=lat, radius=0.23, scales=(1.0, 1.5))
    else:
        mod = _module(slug)
        p = mod.init_mino_encoder_params(rng, 2, 8, depth=2)

        def run(n):
            return mino_encoder(_field(_grid(n)), p, input_pos=_grid(n), query_pos=lat, radius=0.23, num_heads=2)

    outs = [run(n) for n in (150, 450, 1350)]
    gaps = [float(np.abs(outs[i] - outs[i + 1]).max()) for i in range(2)]
    assert gaps[1] < gaps[0] / 2, f"{slug}: gaps {gaps} do not shrink under refinement"
    assert gaps[1] < 0.05 * float(np.abs(outs[-1]).max()), f"{slug}: finest gap {gaps[1]:.2e} too large"


@pytest.mark.parametrize("slug", SLUGS[:2] + ["mino_gno_cross_attention", "physgto_projection_attention"])
def test_point_duplication_invariance_checks_pass(slug):
    rec = registry.get(slug)
    name = [k for k in rec.checks if "duplication" in k or "receptive" in k][0]
    rec.checks[name](np.random.default_rng(11))


def test_cotap_point_duplication_invariance():
    # Duplicating every source point halves its row of the plan after every round: the down
    # projection is unchanged and each copy receives the original up projection.
    mod = _module("mono_cotap_ot_projection")
    s = mod._sample(np.random.default_rng(12), "small")
    m = s.inputs["z"].shape[1]
    base = cotap(**s.inputs, params=s.params, **s.config)
    dup = cotap(np.repeat(s.inputs["anchor"], 2, 1), np.repeat(s.inputs["x"], 2, 1), s.inputs["z"], s.params, **s.config)
    np.testing.assert_allclose(dup[:, :m], base[:, :m], atol=1e-12)
    np.testing.assert_allclose(dup[:, m:][:, ::2], base[:, m:], atol=1e-12)


# --------------------------------------------------------------------------------------------
# Sinkhorn backward choices


def test_cotap_implicit_gradient_is_not_the_finite_difference_at_few_rounds():
    # The unrolled backward is the exact gradient of what was computed (FD-checked by the
    # registry); the implicit one is the gradient of the limit and differs after few rounds.
    mod = _module("mono_cotap_ot_projection")
    s = mod._sample(np.random.default_rng(13), "tiny")
    cfg = dict(s.config, n_iter=1, grad="implicit")
    report = gradcheck(cotap_forward, cotap_backward, type(s)(s.inputs, s.params, cfg), raise_on_failure=False)
    assert not report.passed
    cfg["grad"] = "unrolled"
    assert gradcheck(cotap_forward, cotap_backward, type(s)(s.inputs, s.params, cfg)).passed


def test_aot_pot_matches_torch_transcription():
    torch = pytest.importorskip("torch")
    mod = _module("aot_pot_multistream_sinkhorn")
    s = mod._sample(np.random.default_rng(14), "small")
    x, p = s.inputs["x"], s.params
    b, t, n, c = x.shape
    tp = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in p.items()}
    tx = torch.tensor(x, requires_grad=True)
    u = tx.reshape(b, t, n * c)
    uh = u / torch.sqrt((u * u).mean(-1, keepdim=True) + 1e-6)
    hpre = torch.sigmoid(tp["alpha_pre"] * uh @ tp["phi_pre"] + tp["b_pre"])
    hpost = 2 * torch.sigmoid(tp["alpha_post"] * uh @ tp["phi_post"] + tp["b_post"])
    k = torch.exp(tp["alpha_res"] * (uh @ tp["phi_res"]).reshape(b, t, n, n) + tp["b_res"])
    for _ in range(s.config["sinkhorn_iters"]):
        k = k / k.sum(-1, keepdim=True)
        k = k / k.sum(-2, keepdim=True)
    h = torch.einsum("btk,btkc->btc", hpre, tx)
    y = torch.nn.functional.gelu(h @ tp["sublayer.fc1.weight"] + tp["sublayer.fc1.bias"]) @ tp["sublayer.fc2.weight"] \
        + tp["sublayer.fc2.bias"]
    out_t = k @ tx + hpost[..., None] * y[:, :, None, :]
    g = torch.randn(out_t.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    out_t.backward(g)
    out, cache = aot_pot_stream_mixing_forward(x, p, **s.config)
    grads = aot_pot_stream_mixing_backward(g.numpy(), cache)
    np.testing.assert_allclose(out, out_t.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(grads["x"], tx.grad.numpy(), rtol=1e-10, atol=1e-12)
    for key, v in tp.items():
        np.testing.assert_allclose(grads[key], v.grad.numpy(), rtol=1e-9, atol=1e-12, err_msg=key)


# --------------------------------------------------------------------------------------------
# Conventions and bad input


def test_mano_levels_match_upstream_log_count():
    import math

    for size, s in ((16, 2), (32, 2), (27, 3), (64, 4), (20, 2)):
        assert mano_levels(size, s) == int(math.log(size, s) + 1e-9)


def _bad_cases(slug):
    """(label, thunk, error type, message pattern) for argument errors specific to each layer."""
    rng = np.random.default_rng(15)
    s = _module(slug)._sample(rng, "tiny")
    inp, p, cfg = s.inputs, s.params, s.config
    if slug == "mono_cotap_ot_projection":
        return [("z width", lambda: cotap(inp["anchor"], inp["x"], inp["z"][..., :1], p), ValueError, "z must have"),
                ("x rows", lambda: cotap(inp["anchor"], inp["x"][:, :-1], inp["z"], p), ValueError, "x must have"),
                ("grad", lambda: cotap(**inp, params=p, grad="adjoint"), ValueError, "grad"),
                ("n_iter", lambda: cotap(**inp, params=p, n_iter=0), ValueError, "n_iter"),
                ("temperature", lambda: cotap(**inp, params=p, temperature=0.0), ValueError, "temperature"),
                ("params", lambda: cotap(**inp, params=[]), TypeError, "params")]
    if slug == "physgto_projection_attention":
        return [("variant", lambda: physgto_attention(**inp, params=p, **dict(cfg, variant="task4")), ValueError,
                 "variant"),
                ("heads", lambda: physgto_attention(**inp, params=p, **dict(cfg, num_heads=3)), ValueError,
                 "divisible by num_heads=3"),
                ("Q", lambda: physgto_attention(**inp, params={k: v for k, v in p.items() if k != "Q"}, **cfg),
                 ValueError, "Q")]
    if slug == "gaot_magno":
        return [("scales", lambda: magno(**inp, params=p, **dict(cfg, scales=())), ValueError, "scales"),
                ("src_coord", lambda: magno(**inp, params=p, **dict(cfg, src_coord=cfg["src_coord"][:-1])),
                 ValueError, "src_coord"),
                ("dst_coord", lambda: magno(**inp, params=p, **dict(cfg, dst_coord=cfg["dst_coord"][:, :1])),
                 ValueError, "dst_coord"),
                ("radius", lambda: magno(**inp, params=p, **dict(cfg, radius=-1.0)), ValueError, "radius"),
                ("role", lambda: magno(**inp, params=p, **dict(cfg, role="processor")), ValueError, "role"),
                ("bool", lambda: magno(**inp, params=p, **dict(cfg, use_geoembed="yes")), TypeError, "use_geoembed")]
    if slug == "mino_gno_cross_attention":
        return [("input_pos", lambda: mino_encoder(**inp, params=p, **dict(cfg, input_pos=cfg["input_pos"][:-1])),
                 ValueError, "input_pos"),
                ("query_pos", lambda: mino_encoder(**inp, params=p, **dict(cfg, query_pos=np.zeros((3, 2)))),
                 ValueError, "query_pos"),
                ("radius", lambda: mino_encoder(**inp, params=p, **dict(cfg, radius=0.0)), ValueError, "radius"),
                ("heads", lambda: mino_encoder(**inp, params=p, **dict(cfg, num_heads=2)), ValueError,
                 "divisible by num_heads=2"),
                ("first_block", lambda: mino_encoder(**inp, params={k: v for k, v in p.items()
                                                                    if not k.startswith("first_block")}, **cfg),
                 ValueError, "first_block"),
                ("embedding width", lambda: mino_encoder(
                    inp["f"], _module(slug).init_mino_encoder_params(rng, 2, 3, depth=1),
                    **dict(cfg, input_pos=np.zeros((5, 2)), query_pos=np.zeros((3, 2)))), ValueError, "too small")]
    if slug == "cape_parameter_channel_attention":
        p2 = _module(slug)._sample(rng, "tiny", nd=2).params
        return [("grid", lambda: cape_block(inp["x"][..., :6], inp["x_p"], p), ValueError, "x must be a multiple"),
                ("x_p rows", lambda: cape_block(inp["x"], inp["x_p"][:1], p), ValueError, "x_p must have"),
                ("x_p > 0", lambda: cape_block(np.zeros((2, 1, 8, 8)), -np.ones((2, 1)), p2), ValueError, "x_p"),
                ("combine", lambda: cape_block(**inp, params=p, combine="mul"), ValueError, "combine"),
                ("param_transform", lambda: cape_block(**inp, params=p, param_transform="log"), ValueError,
                 "param_transform")]
    if slug == "mano_multipole_attention":
        return [("tile", lambda: mano_attention(**inp, params=p, **dict(cfg, kernel_size=3)), ValueError, "tile"),
                ("levels", lambda: mano_attention(**inp, params=p, **dict(cfg, levels=4)), ValueError,
                 "not divisible by sampling_rate"),
                ("downsampling", lambda: mano_attention(**inp, params=p, **dict(cfg, downsampling="max")), ValueError,
                 "downsampling"),
                ("sampling_rate", lambda: mano_attention(**inp, params=p, **dict(cfg, sampling_rate=1)), ValueError,
                 "sampling_rate")]
    assert slug == "aot_pot_multistream_sinkhorn"
    return [("phi_res", lambda: aot_pot_stream_mixing(inp["x"], dict(p, phi_res=p["phi_res"][:, :1])), ValueError,
             "phi_res"),
            ("alpha", lambda: aot_pot_stream_mixing(inp["x"], dict(p, alpha_res=np.asarray(0.5))), ValueError,
             "alpha_res"),
            ("sinkhorn_iters", lambda: aot_pot_stream_mixing(inp["x"], p, sinkhorn_iters=0), ValueError,
             "sinkhorn_iters"),
            ("x rank", lambda: aot_pot_stream_mixing(inp["x"][0], p), ValueError, "x")]


@pytest.mark.parametrize("slug", SLUGS)
def test_argument_errors_name_the_argument(slug):
    for label, thunk, exc, pattern in _bad_cases(slug):
        try:
            with pytest.raises(exc, match=pattern):
                thunk()
        except BaseException as e:                   # name the case that failed
            raise AssertionError(f"{slug} [{label}]: expected {exc.__name__} matching {pattern!r}; {e!r}") from e
