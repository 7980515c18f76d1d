"""Fidelity of the operator mechanisms to their upstream modules (issue #20, operator items).

Every test runs a float64 PyTorch module next to refattn and compares the output and every input
and parameter gradient. Where the upstream installs from PyPI (neuraloperator) the real module is
used (skipped when it is not installed); otherwise the module is re-stated from the cited upstream
file in ``tests/_upstream_ops.py``. The measured agreement is recorded in the docs.
"""

from __future__ import annotations

import numpy as np
import pytest
from _upstream_ops import build_ono_orth, compare_module, rel_err

from refattn.operators.ono import ono_attention_backward, ono_attention_forward

TOL = 1e-9


def _assert_close(errs, tol=TOL):
    bad = {k: v for k, v in errs.items() if not v < tol}
    assert not bad, f"upstream mismatch {bad} (all: {errs})"


# ------------------------------------------------------------------------ ONO (item 6)


@pytest.mark.parametrize("residual", [True, False])
def test_ono_matches_upstream_head_and_86e1bfe(residual):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    mu = rng.standard_normal(4)
    mod, mapping = build_ono_orth(torch, mu, residual=residual)
    inputs = {"psi": rng.standard_normal((2, 9, 4)) + 0.3, "fx": rng.standard_normal((2, 9, 3))}
    errs = compare_module(torch, mod, mapping, ono_attention_forward, ono_attention_backward, inputs,
                          config={"residual": residual})
    _assert_close(errs)


def test_ono_residual_keyword_rejects_non_bool():
    with pytest.raises(TypeError, match="residual"):
        ono_attention_forward(np.ones((2, 3, 1)), np.ones((2, 3, 1)), {"mu": np.ones(1)}, residual=1)


# -------------------------------------------------------------------- OFormer (item 7)

from _upstream_ops import build_oformer_linear_attention  # noqa: E402

from refattn.operators import oformer  # noqa: E402


@pytest.mark.parametrize("attn_type", ["galerkin", "fourier"])
@pytest.mark.parametrize("padded", [False, True])
def test_oformer_both_upstream_branches(attn_type, padded):
    """Unpadded: InstanceNorm over channels (norm_axis="channels"); padded: masked instance norm
    over the real points with detached statistics (norm_axis="points", masked_norm_grad="detached")."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    params = oformer.oformer_init_params(rng, 4, 2, 4, attn_type=attn_type, init_gain=0.5)
    mod, mapping = build_oformer_linear_attention(torch, params, heads=2, dim_head=4, attn_type=attn_type)
    x = rng.standard_normal((2, 7, 4))
    cfg = {"n_head": 2, "attn_type": attn_type}
    if padded:
        mask = np.ones((2, 7), bool)
        mask[1, -2:] = False
        cfg.update(padding_mask=mask, norm_axis="points", masked_norm_grad="detached")
        call = lambda m, t: m(t["x"], torch.tensor(mask))  # noqa: E731
    else:
        cfg.update(norm_axis="channels")
        call = None
    errs = compare_module(torch, mod, mapping, oformer.oformer_attention_forward, oformer.oformer_attention_backward,
                          {"x": x}, config=cfg, call=call)
    _assert_close(errs)
    if padded:   # the exact derivative is a different gradient (same forward)
        cfg["masked_norm_grad"] = "exact"
        errs = compare_module(torch, mod, mapping, oformer.oformer_attention_forward,
                              oformer.oformer_attention_backward, {"x": x}, config=cfg, call=call)
        assert errs["out"] < TOL and errs["x"] > 1e-3


def test_oformer_masked_norm_grad_choice_is_validated():
    rng = np.random.default_rng(2)
    with pytest.raises(ValueError, match="masked_norm_grad"):
        oformer.oformer_attention(rng.standard_normal((2, 3, 4)), oformer.oformer_init_params(rng, 4, 2, 2),
                                  n_head=2, masked_norm_grad="frozen")


# ------------------------------------------ neuraloperator AttentionKernelIntegral (item 9)


@pytest.mark.parametrize("cin,cout,heads,d,project_query,weighted", [
    (3, 5, 2, 2, True, False),    # out_channels != in_channels: to_out is a Linear
    (4, 4, 2, 2, True, True),     # heads * d == out_channels: to_out is nn.Identity
    (4, 3, 2, 2, False, True),    # project_query=False, quadrature weights on the output rows
])
def test_attention_kernel_integral_real_module(cin, cout, heads, d, project_query, weighted):
    """neuraloperator ``neuralop/layers/attention_kernel_integral.py`` (PyPI neuraloperator 2.0.0,
    same file as GitHub @ 93d3f06): norm over each point's channels, output-row weights."""
    torch = pytest.importorskip("torch")
    aki = pytest.importorskip("neuralop.layers.attention_kernel_integral")
    from _upstream_ops import neuralop_linear_mapping

    torch.manual_seed(0)
    rng = np.random.default_rng(3)
    m = aki.AttentionKernelIntegral(cin, cout, heads, d, project_query=project_query).double()
    assert isinstance(m.to_out, torch.nn.Identity) == (heads * d == cout)
    mapping = neuralop_linear_mapping(m, ["to_q", "to_k", "to_v", "to_out"])
    x, pos = rng.standard_normal((2, 7, cin)), rng.random((2, 7, 2))
    w = rng.uniform(0.1, 0.3, (2, 7)) if weighted else None
    cfg = {"n_head": heads, "norm_axis": "channels", "weights_placement": "output", "weights": w,
           "out_channels": cout}
    call = lambda mod, t: mod(t["x"], torch.tensor(pos), weights=None if w is None else torch.tensor(w))  # noqa: E731
    errs = compare_module(torch, m, mapping, oformer.oformer_attention_forward, oformer.oformer_attention_backward,
                          {"x": x}, config=cfg, call=call)
    _assert_close(errs, 1e-8)   # the norm over d = 2 channels amplifies round-off (measured <= 2e-12)


def test_attention_kernel_integral_identity_rule_is_enforced():
    rng = np.random.default_rng(4)
    p = {t: rng.standard_normal((4, 4)) for t in ("to_q.weight", "to_k.weight", "to_v.weight")}
    x = rng.standard_normal((2, 5, 4))
    assert oformer.oformer_attention(x, p, n_head=2, out_channels=4).shape == (2, 5, 4)
    with pytest.raises(ValueError, match="to_out"):
        oformer.oformer_attention(x, p, n_head=2, out_channels=3)          # needs a projection
    with pytest.raises(ValueError, match="unknown keys"):
        oformer.oformer_attention(x, dict(p, **{"to_out.weight": np.ones((4, 4)), "to_out.bias": np.ones(4)}),
                                  n_head=2, out_channels=4)                   # Identity when H*d == out
    with pytest.raises(ValueError, match="project_query"):
        oformer.oformer_attention(rng.standard_normal((2, 5, 3)), {k: v[:3] for k, v in p.items() if k != "to_q.weight"},
                                  n_head=2)


# ------------------------------------------------ Galerkin-transformer cross-attention (item 4)

from _upstream_ops import build_simple_attention  # noqa: E402

from refattn.operators import galerkin as gk  # noqa: E402


@pytest.mark.parametrize("attention_type,norm_type", [("galerkin", "layer"), ("galerkin", "instance"),
                                                      ("fourier", "layer")])
@pytest.mark.parametrize("n_q,with_pos", [(5, False), (9, True)])
def test_simple_attention_cross_matches_upstream(attention_type, norm_type, n_q, with_pos):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(5)
    params = gk.init_params(rng, 6, 2, pos_dim=2 if with_pos else 0, attention_type=attention_type,
                            norm_type=norm_type, xavier_init=1.0, diagonal_weight=0.3)
    params = {k: v + 0.2 * rng.standard_normal(v.shape) for k, v in params.items()}
    mod, mapping = build_simple_attention(torch, params, n_head=2, attention_type=attention_type, norm_type=norm_type)
    inputs = {"x": rng.standard_normal((2, 9, 6)), "query": rng.standard_normal((2, n_q, 6))}
    if with_pos:
        inputs["pos"] = rng.random((2, 9, 2))
    fwd, bwd = {"galerkin": (gk.galerkin_attention_forward, gk.galerkin_attention_backward),
                "fourier": (gk.fourier_type_attention_forward, gk.fourier_type_attention_backward)}[attention_type]
    call = lambda m, t: m(t["query"], t["x"], t.get("pos"))  # noqa: E731
    errs = compare_module(torch, mod, mapping, fwd, bwd, inputs, config={"n_head": 2, "norm_type": norm_type},
                          call=call)
    _assert_close(errs)


def test_galerkin_cross_divides_by_query_length_unless_asked():
    rng = np.random.default_rng(6)
    p = gk.init_params(rng, 4, 2, xavier_init=1.0, diagonal_weight=0.3)
    x, q = rng.standard_normal((2, 6, 4)), rng.standard_normal((2, 3, 4))
    a = gk.galerkin_attention(x, p, query=q, n_head=2)
    b = gk.galerkin_attention(x, p, query=q, n_head=2, galerkin_length="key")
    np.testing.assert_allclose(a * 3, b * 6, rtol=1e-12)     # 1/N_q versus 1/N
    same_len = gk.galerkin_attention(x, p, query=x, n_head=2)
    np.testing.assert_allclose(same_len, gk.galerkin_attention(x, p, n_head=2), rtol=1e-13)
    with pytest.raises(ValueError, match="query"):
        gk.galerkin_attention(x, p, query=rng.standard_normal((2, 3, 5)), n_head=2)
    with pytest.raises(ValueError, match="galerkin_length"):
        gk.galerkin_attention(x, p, query=q, n_head=2, galerkin_length="both")


# ------------------------------------------------- neuraloperator CODALayer defaults (item 8)

from refattn.operators.coda_no import codomain_attention_backward, codomain_attention_forward  # noqa: E402


@pytest.mark.parametrize("n_heads,temperature", [(1, 1.0), (2, 0.7)])
def test_coda_layer_defaults_real_module(n_heads, temperature):
    """neuraloperator ``neuralop/layers/coda_layer.py`` (PyPI 2.0.0 = GitHub @ 93d3f06) ``CODALayer``
    defaults: per_channel_attention with scale 0.5, so K and Q live on a half-resolution grid and V
    on the full one. ``compute_attention`` against refattn on the captured K/Q/V, with gradients."""
    torch = pytest.importorskip("torch")
    coda = pytest.importorskip("neuralop.layers.coda_layer")
    torch.manual_seed(1)
    layer = coda.CODALayer(n_modes=(4, 4), n_heads=n_heads, temperature=temperature).double()
    b, t = 2, 3
    acts = {}

    def hook(name):
        def f(mod, inp, out):
            out.retain_grad()
            acts[name] = out
        return f

    for nm in ("Key", "Query", "Value"):
        getattr(layer, nm).register_forward_hook(hook(nm))
    att = layer.compute_attention(torch.randn(b * t, 1, 8, 8, dtype=torch.float64), b)
    g = torch.randn_like(att)
    (att * g).sum().backward()

    def to_ref(x):   # (b t, heads d, *grid) -> (b, heads, t, d, *grid)
        x = x.detach().numpy()
        return np.moveaxis(x.reshape(b, t, n_heads, x.shape[1] // n_heads, *x.shape[2:]), 2, 1)

    q, k, v = to_ref(acts["Query"]), to_ref(acts["Key"]), to_ref(acts["Value"])
    assert q.shape[4:] == (4, 4) and v.shape[4:] == (8, 8)
    out, cache = codomain_attention_forward(q, k, v, temperature=temperature)
    grads = codomain_attention_backward(to_ref(g), cache)
    errs = {"out": rel_err(out, to_ref(att))}
    errs.update({n: rel_err(grads[n], to_ref(acts[m].grad)) for n, m in (("q", "Query"), ("k", "Key"), ("v", "Value"))})
    _assert_close(errs)


def test_codomain_attention_v_grid_may_differ_but_not_its_rank():
    rng = np.random.default_rng(7)
    q = rng.standard_normal((1, 1, 3, 1, 2, 2))
    assert codomain_attention_forward(q, q, rng.standard_normal((1, 1, 3, 2, 4, 4)))[0].shape == (1, 1, 3, 2, 4, 4)
    with pytest.raises(ValueError, match="grid"):
        codomain_attention_forward(q, q, rng.standard_normal((1, 1, 3, 2, 16)))


# -------------------------------------------------------- IFactFormer-m FABlock3D_m (item 10)

from _upstream_ops import build_fablock3d_m_core  # noqa: E402

from refattn.operators.ifactformer import ifactformer_m_axial_backward, ifactformer_m_axial_forward  # noqa: E402


def test_ifactformer_m_official_3d_block_core():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(8)
    grid, h, c, d = (4, 3, 5), 2, 2, 3
    inputs = {"v": rng.standard_normal((2, h, *grid, c))}
    for a, n in zip("xyz", grid):
        inputs[f"q_{a}"] = rng.standard_normal((2, h, n, d))
        inputs[f"k_{a}"] = rng.standard_normal((2, h, n, d))
    mod, _ = build_fablock3d_m_core(torch, scaling=0.7)

    def fwd(v, q_x, k_x, q_y, k_y, q_z, k_z, params):
        return ifactformer_m_axial_forward(v, [q_x, q_y, q_z], [k_x, k_y, k_z], scalings=(0.7,) * 3)

    def bwd(g, cache):
        gr = ifactformer_m_axial_backward(g, cache)
        return {"v": gr["v"], **{f"{t}_{a}": gr[f"{t}s"][i] for i, a in enumerate("xyz") for t in "qk"}}

    _assert_close(compare_module(torch, mod, {}, fwd, bwd, inputs))


def test_ifactformer_m_axial_validation():
    rng = np.random.default_rng(9)
    v = rng.standard_normal((1, 1, 3, 2, 2, 1))
    q = [rng.standard_normal((1, 1, n, 2)) for n in (3, 2, 2)]
    with pytest.raises(ValueError, match="3 entries"):
        ifactformer_m_axial_forward(v, q[:2], q[:2])
    with pytest.raises(ValueError, match=r"qs\[1\]"):
        ifactformer_m_axial_forward(v, [q[0], q[0], q[2]], q)
    with pytest.raises(ValueError, match="scalings"):
        ifactformer_m_axial_forward(v, q, q, scalings=(1.0,))


# ------------------------------------------------- neuraloperator SpectralConv (item 9)

from _upstream_ops import build_neuralop_spectral_conv  # noqa: E402

from refattn.operators import fno  # noqa: E402


def _channel_first(fwd, bwd):
    """refattn's channel-last spectral conv seen through upstream's channel-first layout."""
    def f(x, params, **cfg):
        out, cache = fwd(np.moveaxis(x, 1, -1), params, **cfg)
        return np.moveaxis(out, -1, 1), cache

    def b(g, cache):
        grads = bwd(np.moveaxis(g, 1, -1), cache)
        return {**grads, "x": np.moveaxis(grads["x"], -1, 1)}
    return f, b


@pytest.mark.parametrize("grid,n_modes,bias,norm,shift", [
    ((8,), (6,), True, "forward", "ifftshift"),            # 1-D
    ((7, 6), (5, 4), True, "forward", "ifftshift"),        # odd n_modes[0] on an odd axis
    ((6, 7), (3, 5), False, "backward", "ifftshift"),
    ((5, 6, 7), (3, 4, 6), True, "ortho", "ifftshift"),    # 3-D FNO
    ((5, 6, 7), (3, 4, 6), True, "forward", "fftshift"),   # PyPI 2.0.0's second fftshift
])
def test_neuralop_spectral_conv_centred_layout(grid, n_modes, bias, norm, shift):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(11)
    p = fno.init_fno_centred_params(rng, 3, 2, n_modes, bias=bias)
    mod, mapping = build_neuralop_spectral_conv(torch, p, fft_norm=norm, inverse_shift=shift)
    f, b = _channel_first(fno.fno_spectral_conv_centred_forward, fno.fno_spectral_conv_centred_backward)
    errs = compare_module(torch, mod, mapping, f, b, {"x": rng.standard_normal((2, 3, *grid))},
                          config={"fft_norm": norm, "inverse_shift": shift})
    _assert_close(errs)


def test_neuralop_spectral_conv_real_module():
    """The installed neuraloperator release (PyPI 2.0.0: ``inverse_shift="fftshift"``; identical to
    HEAD on even grids). Upstream computes ``out_fft`` in complex64, so the bound is float32's."""
    torch = pytest.importorskip("torch")
    sc = pytest.importorskip("neuralop.layers.spectral_convolution")
    torch.manual_seed(0)
    rng = np.random.default_rng(12)
    m = sc.SpectralConv(3, 2, (4, 6), bias=True)   # module.to(float64) would drop the complex weight's imag
    w = m.weight.tensor if hasattr(m.weight, "tensor") else m.weight
    w.data = w.data.to(torch.complex128)
    m.bias.data = m.bias.data.double()
    p = {"weight_real": w.detach().real.numpy(), "weight_imag": w.detach().imag.numpy(),
         "bias": m.bias.detach().numpy()}
    x = rng.standard_normal((2, 3, 6, 8))
    out = m(torch.tensor(x)).detach().numpy()
    ref = np.moveaxis(fno.fno_spectral_conv_centred(np.moveaxis(x, 1, -1), p, inverse_shift="fftshift"), -1, 1)
    assert rel_err(ref, out) < 1e-5


def test_centred_spectral_conv_validation():
    p = fno.init_fno_centred_params(np.random.default_rng(0), 2, 2, (5, 8))
    with pytest.raises(ValueError, match="modes along spatial axis 1"):
        fno.fno_spectral_conv_centred_forward(np.ones((1, 6, 6, 2)), p)
    with pytest.raises(ValueError, match="bias"):
        fno.fno_spectral_conv_centred_forward(np.ones((1, 6, 8, 2)), {**p, "bias": np.ones(3)})
    with pytest.raises(ValueError, match="inverse_shift"):
        fno.fno_spectral_conv_centred_forward(np.ones((1, 6, 8, 2)), p, inverse_shift="roll")


# ------------------------------------- Transolver structured meshes and to_out width (item 1)

from _upstream_ops import build_transolver_physics_attention  # noqa: E402

from refattn.operators import transolver as tso  # noqa: E402


@pytest.mark.parametrize("mesh,out_dim", [((4, 3), None), ((3, 2, 3), None), ((4, 3), 7), (None, 6)])
def test_transolver_structured_mesh_and_out_width(mesh, out_dim):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(13)
    p = tso.transolver_init_params(rng, 5, 2, 3, 4, out_dim=out_dim, mesh_ndim=None if mesh is None else len(mesh))
    p["temperature"] = np.array([0.7, 1.3])
    clamp = (0.1, 5) if mesh else None
    mod, mapping = build_transolver_physics_attention(torch, p, heads=2, mesh_shape=mesh, tau_clamp=clamp)
    n = int(np.prod(mesh)) if mesh else 9
    errs = compare_module(torch, mod, mapping, tso.transolver_physics_attention_forward,
                          tso.transolver_physics_attention_backward, {"x": rng.standard_normal((2, n, 5))},
                          config={"n_head": 2, "mesh_shape": mesh, "tau_clamp": clamp},
                          call=lambda m, t: m(t["x"]))
    _assert_close(errs)


def test_transolver_mesh_validation():
    rng = np.random.default_rng(14)
    p = tso.transolver_init_params(rng, 3, 2, 2, 3, mesh_ndim=2)
    x = rng.standard_normal((2, 12, 3))
    with pytest.raises(ValueError, match="holds 6 points"):
        tso.transolver_physics_attention_forward(x, p, n_head=2, mesh_shape=(2, 3))
    with pytest.raises(ValueError, match="conv weight"):
        tso.transolver_physics_attention_forward(x, p, n_head=2, mesh_shape=(2, 3, 2))
    with pytest.raises(ValueError, match="odd"):
        tso.transolver_physics_attention_forward(
            x, {**p, **{f"in_project_{t}.weight": np.ones((4, 3, 2, 2)) for t in ("x", "fx")}}, n_head=2,
            mesh_shape=(3, 4))


# ------------------------------------------------ FactFormer at c9801d1 (item 3)

from _upstream_ops import fablock2d_c9801d1_torch, low_rank_kernel_torch  # noqa: E402

from refattn.operators import factformer as ff  # noqa: E402


def _torch_grads(torch, fn, arrays, g):
    tens = {k: torch.tensor(v, requires_grad=True) for k, v in arrays.items()}
    out = fn(tens)
    out.backward(torch.tensor(g))
    return out.detach().numpy(), {k: t.grad.numpy() for k, t in tens.items()}


def test_fablock2d_c9801d1_groupnorm_flat_output_and_position_grads():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(15)
    p = ff.init_factformer_block_params(rng, 6, 2, 5, 2, 7)
    p = {k: v + 0.2 * rng.standard_normal(v.shape) for k, v in p.items()}
    u = rng.standard_normal((2, 5, 4, 6))
    pos_x, pos_y = np.linspace(0, 1, 5)[:, None] + 0.01 * rng.random((5, 1)), np.linspace(0, 1, 4)[:, None]
    out, cache = ff.factformer_block_forward(u, p, pos_x=pos_x, pos_y=pos_y, heads=2, dim_head=2,
                                             scaling_x=0.7, scaling_y=0.7)
    assert out.shape == (2, 20, 7)
    g = rng.standard_normal(out.shape)
    grads = ff.factformer_block_backward(g, cache)
    ref, tg = _torch_grads(torch, lambda t: fablock2d_c9801d1_torch(
        torch, t["u"], t, t["pos_x"], t["pos_y"], heads=2, dim_head=2, scaling=0.7),
        {"u": u, "pos_x": pos_x, "pos_y": pos_y, **p}, g)
    errs = {"out": rel_err(out, ref), **{k: rel_err(grads[k], tg[k]) for k in tg}}
    _assert_close(errs)


@pytest.mark.parametrize("cross,normalize,softmax,rotary", [
    (False, False, False, True), (False, True, True, True), (True, True, False, True), (False, False, True, False)])
def test_low_rank_kernel_matches_upstream(cross, normalize, softmax, rotary):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(16)
    p = {"to_q.weight": rng.standard_normal((4, 12)) * 0.4, "to_k.weight": rng.standard_normal((4, 12)) * 0.4}
    arrays = {"u_x": rng.standard_normal((2, 5, 4)), "pos_x": np.sort(rng.random(5))[:, None]}
    if cross:
        arrays.update(u_y=rng.standard_normal((2, 3, 4)), pos_y=np.sort(rng.random(3))[:, None])
    else:
        p["gamma"] = np.asarray(0.4)
    if not rotary:
        del arrays["pos_x"]
    cfg = dict(heads=2, normalize=normalize, softmax=softmax, residual=not cross, scaling=0.8,
               positional_embedding="rotary" if rotary else "none")
    k, cache = ff.low_rank_kernel_forward(arrays["u_x"], p, u_y=arrays.get("u_y"), pos_x=arrays.get("pos_x"),
                                          pos_y=arrays.get("pos_y"), **cfg)
    g = rng.standard_normal(k.shape)
    grads = ff.low_rank_kernel_backward(g, cache)
    ref, tg = _torch_grads(torch, lambda t: low_rank_kernel_torch(
        torch, t["u_x"], t, heads=2, u_y=t.get("u_y"), pos_x=t.get("pos_x"), pos_y=t.get("pos_y"), rotary=rotary,
        normalize=normalize, softmax=softmax, residual=not cross, scaling=0.8), {**arrays, **p}, g)
    errs = {"K": rel_err(k, ref), **{n: rel_err(grads[n], tg[n]) for n in tg}}
    _assert_close(errs)


def test_low_rank_kernel_validation():
    p = {"to_q.weight": np.ones((4, 8)), "to_k.weight": np.ones((4, 8)), "gamma": np.asarray(1.0)}
    with pytest.raises(ValueError, match="pos_x"):
        ff.low_rank_kernel_forward(np.ones((1, 3, 4)), p, heads=2)
    with pytest.raises(ValueError, match="n_x == n_y"):
        ff.low_rank_kernel_forward(np.ones((1, 3, 4)), p, heads=2, u_y=np.ones((1, 2, 4)), positional_embedding="none")
    with pytest.raises(ValueError, match="output_layout"):
        ff.factformer_block_forward(np.ones((1, 2, 2, 4)), {}, pos_x=np.zeros(2), pos_y=np.zeros(2), heads=1,
                                    dim_head=2, output_layout="channels_first")


# ------------------------------------------------ IPOT whole model with pos2fourier (item 2)

from _upstream_ops import ipot_model_torch  # noqa: E402

from refattn.operators import ipot  # noqa: E402


def test_ipot_whole_model_full_state_dict_names_and_position_grads():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(17)
    nb, mr = [3, 3], [8, 6]
    core = ipot._perturbed(rng, ipot.ipot_init_params(rng, 2 + 14, 14, 3, num_latents=5, latent_channel=8,
                                                      ff_mult=2))
    params = {("encoder." if k.startswith(("latents", "encoder")) else "processor." if k.startswith("processor")
               else "decoder.") + k: v for k, v in core.items()}
    # model.state_dict() also lists the shared processor under processor.layers.{l}.* and the unused encoder_ff
    full = dict(params)
    for layer in range(2):
        for i, mod in enumerate(("processor_self_attn", "processor_ff")):
            full.update({k.replace(f"processor.{mod}.", f"processor.layers.{layer}.{i}."): v
                         for k, v in params.items() if k.startswith(f"processor.{mod}.")})
    full["encoder.encoder_ff.norm.weight"] = np.ones(8)
    x = np.concatenate([rng.standard_normal((2, 4, 3, 2)), rng.random((2, 4, 3, 2))], -1)
    q = rng.random((7, 2))
    out, cache = ipot.ipot_model_forward(x, q, full, in_channel=2, num_bands=nb, max_resolution=mr, num_layers=2,
                                         encoder_heads=2, processor_heads=2, decoder_heads=2)
    g = rng.standard_normal(out.shape)
    grads = ipot.ipot_model_backward(g, cache)
    assert not any(k.startswith("processor.layers.") for k in grads)
    assert np.all(grads["encoder.encoder_ff.norm.weight"] == 0)
    ref, tg = _torch_grads(torch, lambda t: ipot_model_torch(
        torch, t["x"], t["q"], t, in_channel=2, num_bands=nb, max_resolution=mr, num_layers=2, heads=2),
        {"x": x, "q": q, **params}, g)
    errs = {"out": rel_err(out, ref), "inputs": rel_err(grads["inputs"], tg["x"]),
            "decoder_query": rel_err(grads["decoder_query"], tg["q"]),
            **{k: rel_err(grads[k], tg[k]) for k in params}}
    _assert_close(errs)


def test_ipot_model_rejects_short_names_and_mismatched_aliases():
    rng = np.random.default_rng(18)
    core = ipot.ipot_init_params(rng, 1 + 6, 6, 1, num_latents=2, latent_channel=2, ff_mult=1)
    x, q = rng.random((2, 3, 3)), rng.random((2, 2))
    cfg = dict(in_channel=1, num_bands=1, max_resolution=4, encoder_heads=1, processor_heads=1, decoder_heads=1)
    with pytest.raises(ValueError, match="full state-dict names"):
        ipot.ipot_model_forward(x, q, core, **cfg)
    full = {("encoder." if k.startswith(("latents", "encoder")) else "processor." if k.startswith("processor")
             else "decoder.") + k: v for k, v in core.items()}
    bad = dict(full, **{"processor.layers.0.0.norm.weight": full["processor.processor_self_attn.norm.weight"] + 1})
    with pytest.raises(ValueError, match="alias"):
        ipot.ipot_model_forward(x, q, bad, **cfg)
