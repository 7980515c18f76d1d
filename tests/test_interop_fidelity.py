"""Issue #20's fidelity items through ``refattn.interop.torch.check_module``, in float64.

The modules are written from the upstream files (``tests/_upstream_ops.py``,
``tests/_upstream_layers.py``; file@commit in their docstrings) or are the real neuraloperator
modules (PyPI ``neuraloperator``, an optional test dependency: those tests skip without it). The
rows they check are in ``refattn/interop/torch_specs_fidelity.py``.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import _upstream_fidelity as UF  # noqa: E402
import _upstream_layers as UL  # noqa: E402
import _upstream_ops as UO  # noqa: E402
from _interop_checks import assert_pass  # noqa: E402
from _upstream_fidelity import CodomainCore, FunctionalModule  # noqa: E402

from refattn.interop.torch import check_module, grads_to_state_dict, params_from_state_dict, supported_slugs  # noqa: E402
from refattn.interop.torch_specs_fidelity import FABLOCK_LINEAR, FIDELITY_SLUGS, IPOT_LINEAR  # noqa: E402
from refattn.operators import factformer as ff  # noqa: E402
from refattn.operators import fno, ipot, oformer  # noqa: E402


def _perturbed(rng, p, s=0.2):
    return {k: v + s * rng.standard_normal(v.shape) for k, v in p.items()}


# ---------------------------------------------------------- item 4: Galerkin SimpleAttention cross


@pytest.mark.parametrize("attention_type,pos_dim", [("galerkin", 0), ("galerkin", 2), ("fourier", 0)])
def test_simple_attention_cross(attention_type, pos_dim):
    torch.manual_seed(1)
    m = UF.SimpleAttention(2, 6, pos_dim=pos_dim, attention_type=attention_type)
    slug = "galerkin_attention" if attention_type == "galerkin" else "fourier_type_attention"
    assert_pass(check_module(m, slug, config={"cross": True}))
    if attention_type == "galerkin" and not pos_dim:  # upstream divides by the query length: not by the keys
        bad = check_module(m, slug, config={"cross": True, "galerkin_length": "key"}, cases=["small"], seeds=[0])
        assert not bad.passed


# ------------------------------------- item 1: Transolver on structured meshes, to_out of another width


@pytest.mark.parametrize("mesh,out_dim", [((4, 3), None), ((3, 2, 3), None), ((4, 3), 7), (None, 6)])
def test_transolver_structured_mesh_and_out_width(mesh, out_dim):
    from refattn.operators import transolver as tso

    rng = np.random.default_rng(9)
    p = tso.transolver_init_params(rng, 5, 2, 3, 4, out_dim=out_dim, mesh_ndim=None if mesh is None else len(mesh))
    p["temperature"] = np.array([0.7, 1.3])
    clamp = (0.1, 5) if mesh else None
    m, _ = UO.build_transolver_physics_attention(torch, p, heads=2, mesh_shape=mesh, tau_clamp=clamp)
    assert_pass(check_module(m, "transolver_physics_attention", config={"n_head": 2, "mesh_shape": mesh,
                                                                         "tau_clamp": clamp}))


# ------------------------------------------------------- item 7: OFormer masked_instance_norm


@pytest.mark.parametrize("attn_type", ["galerkin", "fourier"])
def test_oformer_padded_branch(attn_type):
    rng = np.random.default_rng(2)
    p = oformer.oformer_init_params(rng, 4, 2, 4, attn_type=attn_type, init_gain=0.5)
    m, _ = UO.build_oformer_linear_attention(torch, p, heads=2, dim_head=4, attn_type=attn_type)
    cfg = {"attn_type": attn_type, "padded": True}
    assert_pass(check_module(m, "oformer_attention", config=cfg))
    exact = check_module(m, "oformer_attention", config={**cfg, "masked_norm_grad": "exact"}, cases=["small"])
    assert not exact.passed and "x" in str(exact)  # same forward, the true derivative differs from upstream's


# ----------------------------------------------------------------------- item 6: ONO residual


@pytest.mark.parametrize("residual", [True, False])
def test_ono_orthogonal_attention(residual):
    m, _ = UO.build_ono_orth(torch, np.array([0.3, -0.2, 0.8, 0.1]), residual=residual)
    assert_pass(check_module(m, "ono_orthogonal_attention", config={"residual": residual}))
    assert not check_module(m, "ono_orthogonal_attention", config={"residual": not residual},
                            cases=["small"], seeds=[0]).passed


# ---------------------------------------------- item 9: neuraloperator SpectralConv and AKI


@pytest.mark.parametrize("n_modes,bias,norm,shift", [((6,), True, "forward", "ifftshift"),
                                                      ((5, 4), True, "forward", "ifftshift"),
                                                      ((3, 5), False, "backward", "fftshift"),
                                                      ((3, 2, 4), True, "ortho", "ifftshift")])
def test_neuralop_spectral_conv_transcription(n_modes, bias, norm, shift):
    rng = np.random.default_rng(3)
    p = fno.init_fno_centred_params(rng, 3, 2, n_modes, bias=bias)
    m, _ = UO.build_neuralop_spectral_conv(torch, p, fft_norm=norm, inverse_shift=shift)
    assert_pass(check_module(m, "fno_spectral_conv:neuralop", config={"fft_norm": norm, "inverse_shift": shift}))


def test_neuralop_spectral_conv_real_module():
    """PyPI neuraloperator 2.0.0 (``inverse_shift="fftshift"``): upstream allocates ``out_fft`` in
    complex64 whatever the input dtype, so the entry-wise bound is float32's."""
    sc = pytest.importorskip("neuralop.layers.spectral_convolution")
    torch.manual_seed(0)
    for n_modes in ((6,), (4, 6), (3, 4, 4)):
        m = sc.SpectralConv(3, 2, n_modes, bias=True)
        with torch.no_grad():
            m.bias.add_(0.3 * torch.randn_like(m.bias))
        assert_pass(check_module(m, "fno_spectral_conv:neuralop", config={"inverse_shift": "fftshift"},
                                  rtol=2e-5, atol=2e-6))


@pytest.mark.parametrize("cin,cout,heads,d,project_query,weighted", [
    (3, 5, 2, 2, True, False), (4, 4, 2, 2, True, True), (4, 3, 2, 2, False, True)])
def test_neuralop_attention_kernel_integral_real_module(cin, cout, heads, d, project_query, weighted):
    aki = pytest.importorskip("neuralop.layers.attention_kernel_integral")
    torch.manual_seed(1)
    m = aki.AttentionKernelIntegral(cin, cout, heads, d, project_query=project_query)
    assert_pass(check_module(m, "oformer_attention", config={"weighted": weighted}, rtol=1e-8, atol=1e-10))


# ---------------------------------------------------------------- item 2: IPOT whole model


def test_ipot_whole_model():
    rng = np.random.default_rng(4)
    nb, mr = [3, 3], [8, 6]
    core = ipot.ipot_init_params(rng, 2 + 14, 14, 3, num_latents=5, latent_channel=8, ff_mult=2)
    core = _perturbed(rng, core, 0.1)
    p = {("encoder." if k.startswith(("latents", "encoder")) else "processor." if k.startswith("processor")
          else "decoder.") + k: v for k, v in core.items()}

    def fn(tp, x, q):
        return UO.ipot_model_torch(torch, x, q, tp, in_channel=2, num_bands=nb, max_resolution=mr, num_layers=2,
                                   heads=2)

    m = FunctionalModule(p, fn, IPOT_LINEAR, in_channel=2, num_layers=2)
    cfg = {"num_bands": nb, "max_resolution": mr, "encoder_heads": 2, "processor_heads": 2, "decoder_heads": 2}
    assert_pass(check_module(m, "ipot_inducing_point_operator:model", config=cfg))
    sd = m.state_dict()
    assert "encoder.encoder_cross_attn.fn.to_q.weight" in sd   # the model-level prefixes are kept
    back = grads_to_state_dict("ipot_inducing_point_operator:model", params_from_state_dict(
        "ipot_inducing_point_operator:model", sd, in_channel=2, num_bands=nb, max_resolution=mr))
    assert sorted(back) == sorted(sd) and all(np.array_equal(back[k], sd[k].numpy()) for k in sd)


# -------------------------------------------------------- item 3: FactFormer at c9801d1


def test_factformer_fablock2d():
    rng = np.random.default_rng(5)
    p = _perturbed(rng, ff.init_factformer_block_params(rng, 6, 2, 5, 2, 7))
    m = FunctionalModule(p, lambda tp, u, px, py: UO.fablock2d_c9801d1_torch(torch, u, tp, px, py, heads=2,
                                                                               dim_head=2, scaling=0.7),
                         FABLOCK_LINEAR, heads=2, dim_head=2)
    assert_pass(check_module(m, "factformer_factorized_attention:layer", config={"scaling_x": 0.7, "scaling_y": 0.7}))


@pytest.mark.parametrize("cross,normalize,softmax,rotary", [
    (False, False, False, True), (False, True, True, True), (True, True, False, True), (False, False, True, False)])
def test_factformer_low_rank_kernel(cross, normalize, softmax, rotary):
    rng = np.random.default_rng(6)
    p = {"to_q.weight": rng.standard_normal((4, 12)) * 0.4, "to_k.weight": rng.standard_normal((4, 12)) * 0.4}
    if not cross:
        p["gamma"] = np.asarray(0.4)

    def fn(tp, u_x, u_y=None, pos_x=None, pos_y=None):
        return UO.low_rank_kernel_torch(torch, u_x, tp, heads=2, u_y=u_y, pos_x=pos_x, pos_y=pos_y, rotary=rotary,
                                        normalize=normalize, softmax=softmax, residual=not cross, scaling=0.8)

    m = FunctionalModule(p, fn, r"to_[qk]\.weight", heads=2)
    cfg = dict(normalize=normalize, softmax=softmax, residual=not cross, scaling=0.8, cross=cross,
               positional_embedding="rotary" if rotary else "none")
    assert_pass(check_module(m, "factformer_factorized_attention:low_rank_kernel", config=cfg))


# ------------------------------------- weightless cores: items 11 (Performer), 10 (IFactFormer-m), 8 (CODA)


@pytest.mark.parametrize("causal", [True, False])
def test_performer_pytorch_fast_attention(causal):
    m = UL.performer_fast_attention(np.random.default_rng(7), head_dim=4, nb_features=9, causal=causal).module
    proj = m.projection_matrix.numpy()
    assert_pass(check_module(m, "performer_favor_plus", config={"projection": proj}))
    if causal:  # performer-pytorch's eps on the key prefix sum is what the check sees
        assert not check_module(m, "performer_favor_plus", config={"projection": proj, "key_sum_eps": 0.0},
                                cases=["long"], seeds=[0], rtol=1e-9, atol=0).passed


def test_ifactformer_m_fablock3d_core():
    m, _ = UO.build_fablock3d_m_core(torch, scaling=0.7)
    assert_pass(check_module(m, "ifactformer_m_parallel_attention:axial", config={"scaling": 0.7}))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_coda_codomain_attention_core(temperature):
    assert_pass(check_module(CodomainCore(temperature), "coda_no_codomain_attention"))


# ------------------------------------------------------------------------------ the table


def test_fidelity_specs_are_registered():
    assert set(FIDELITY_SLUGS) <= set(supported_slugs())
    assert {"ipot_inducing_point_operator:model", "factformer_factorized_attention:layer",
            "factformer_factorized_attention:low_rank_kernel", "fno_spectral_conv:neuralop",
            "ifactformer_m_parallel_attention:axial"} <= set(FIDELITY_SLUGS)
    assert params_from_state_dict("coda_no_codomain_attention", {}) == {}
    with pytest.raises(ValueError, match="pass the slug 'ipot_inducing_point_operator:model'"):
        params_from_state_dict("ipot_inducing_point_operator", {})


# ------------------------------------------- the real modules of installable upstream packages


@pytest.mark.parametrize("is_decoder,cross", [(False, False), (True, False), (True, True)])
def test_t5_attention_real_module(is_decoder, cross):
    """HF transformers' own ``T5Attention`` (an optional test dependency): the encoder's bidirectional
    buckets, the decoder's causal ones and the decoder's cross-attention (no relative bias there)."""
    t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    from transformers import T5Config

    torch.manual_seed(2)
    cfg = T5Config(d_model=8, d_kv=3, num_heads=2, relative_attention_num_buckets=6,
                   relative_attention_max_distance=10, dropout_rate=0.0, is_decoder=is_decoder)
    m = t5.T5Attention(cfg, has_relative_attention_bias=not cross)
    config = {"is_causal": is_decoder and not cross}
    if cross:  # a cross-attention block reads the encoder's states (the build draws them when k is wider)
        m.k, m.v = torch.nn.Linear(5, 6, bias=False), torch.nn.Linear(5, 6, bias=False)
    assert_pass(check_module(m, "relative_position_encodings:layer", config=config))
