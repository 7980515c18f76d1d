"""refattn.interop.torch rows of group ``soft_b`` (refattn/interop/torch_specs_soft_b.py) against the
upstream modules restated in tests/_upstream_soft_b.py (file@commit in their comments), in float64."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import _upstream_soft_b as U  # noqa: E402
from _interop_checks import assert_pass, assert_registered, assert_round_trip  # noqa: E402

from refattn.interop.torch import check_module, params_from_state_dict  # noqa: E402


@pytest.mark.parametrize("hidden,heads,kv_heads,causal,bias", [
    (8, 2, 2, True, False), (8, 4, 1, True, False), (12, 3, 1, False, True)])
def test_coca_llama_attention(hidden, heads, kv_heads, causal, bias):
    torch.manual_seed(1)
    m = U.CocaLlamaAttention(hidden, heads, kv_heads, base=100.0, bias=bias)
    assert_pass(check_module(m, "coca_collinear_attention", config={"is_causal": causal}))


@pytest.mark.parametrize("kw", [
    dict(rp_bucket=8, max_rp=16, ur_rp_bucket=8, ur_max_rp=16),
    dict(rel_pos_unique=True, ur_attn_unique=True),
    dict(rp_bucket=6, max_rp=12, ur_attn=False)])
def test_urpe_self_attention(kw):
    torch.manual_seed(2)
    m = U.UrpeSelfAttention(6, 3, max_seq_len=20, **kw)
    assert_pass(check_module(m, "urpe_toeplitz_modulated_attention"))


@pytest.mark.parametrize("positions,width", [(13, 4), (8, 3)])
def test_position_coupling_wpe(positions, width):
    torch.manual_seed(3)
    assert_pass(check_module(U.CoupledPositionEmbedding(positions, width), "position_coupling"))


@pytest.mark.parametrize("kw", [dict(static_channels=2, static_kernel_size=5, dynamic_channels=3, dynamic_kernel_size=3,
                                     prior_length=11, alpha=0.1, beta=0.9),
                                dict(static_channels=3, static_kernel_size=3, dynamic_channels=2, dynamic_kernel_size=5,
                                     prior_length=4, alpha=0.3, beta=0.7)])
def test_dca_location_attention(kw):
    torch.manual_seed(5)
    m = U.DynamicConvolutionAttention(4, 5, **kw)
    with torch.no_grad():  # larger weights so the alignment moves
        for t in m.parameters():
            t.mul_(3.0)
    cfg = {"prior_alpha": kw["alpha"], "prior_beta": kw["beta"]}
    assert_pass(check_module(m, "gmm_dca_location_attention", config=cfg))


@pytest.mark.parametrize("version", ["0", "1", "2"])
def test_gmm_location_attention(version):
    torch.manual_seed(6)
    m = U.GMMAttention(4, 5, 3, version)
    assert_pass(check_module(m, "gmm_dca_location_attention", config={"version": version}))


@pytest.mark.parametrize("mode,attn_type", [("exact", "mlp"), ("enum", "mlp"), ("soft", "mlp"), ("enum", "general")])
def test_latent_alignment_var_attn(mode, attn_type):
    torch.manual_seed(7)
    m = U.VarAttnGenerator(4, 3, 5, 6, attn_type=attn_type)
    assert_pass(check_module(m, "latent_alignment_attention", config={"mode": mode, "kl_weight": 0.7}))


@pytest.mark.parametrize("step_act,mix,past", [("controlled_relu", False, False), ("sigmoid", False, False),
                                                ("relu", True, False), ("softstair", True, True)])
def test_monotonic_location_attention(step_act, mix, past):
    torch.manual_seed(8)
    m = U.MonotonicEncoderDecoderAttention(4, 3, 5, 4, 2, 3, 2, step_act, mix_attention=mix, position_past=past)
    with torch.no_grad():
        m.attention_layer.step_bias.fill_(0.3)
        for t in m.parameters():
            t.mul_(1.5)
    assert_pass(check_module(m, "monotonic_location_attention", config={"step_act": step_act}))


@pytest.mark.parametrize("dim,heads,dim_head,causal,proj", [(8, 2, 4, True, 4), (6, 3, None, False, 6)])
def test_neural_attention(dim, heads, dim_head, causal, proj):
    torch.manual_seed(9)
    m = U.NeuralAttention(dim, heads, dim_head, causal=causal, projection_dim=proj)
    assert_pass(check_module(m, "neural_attention_mlp_scores"))


@pytest.mark.parametrize("channels,order", [(8, 1), (8, 2), (12, 4)])
def test_mhn_high_div_module(channels, order):
    torch.manual_seed(10)
    assert_pass(check_module(U.HighDivModule(channels, order), "high_order_attention_hoa"))


@pytest.mark.parametrize("hidden,heads,kv_heads,window", [(8, 2, 2, 3), (8, 4, 1, 2), (12, 3, 1, 128)])
def test_olmo2_aha_attention(hidden, heads, kv_heads, window):
    torch.manual_seed(11)
    m = U.Olmo2AHAAttention(hidden, heads, kv_heads, local_window=window, rope_theta=10.0)
    with torch.no_grad():
        m.q_norm.weight.add_(0.2 * torch.randn_like(m.q_norm.weight))
        m.k_norm.weight.add_(0.2 * torch.randn_like(m.k_norm.weight))
    assert_pass(check_module(m, "all_or_here_attention"))


@pytest.mark.parametrize("dim,bias,top_k", [(6, True, 3), (4, False, 2), (4, True, 12)])
def test_co4_modulated_attention(dim, bias, top_k):
    torch.manual_seed(12)
    m = U.ModulatedMultiHeadAttention(dim, qkv_bias=bias, top_k=top_k)
    assert_pass(check_module(m, "triadic_modulation_co4"))


@pytest.mark.parametrize("dim,length", [(6, 5), (4, 9)])
def test_super_attention_port(dim, length):
    torch.manual_seed(13)
    assert_pass(check_module(U.SuperAttention(dim, length), "optimised_efficient_super_attention"))


@pytest.mark.parametrize("layer,d_state,d_conv,expand,conv_bias,bias", [(3, 4, 4, 2, True, False),
                                                                       (1, 3, 2, 1, False, True)])
def test_diff_mamba(layer, d_state, d_conv, expand, conv_bias, bias):
    torch.manual_seed(14)
    m = U.DiffMamba(4, layer, d_state, d_conv, expand, conv_bias=conv_bias, bias=bias)
    with torch.no_grad():
        m.subln.weight.add_(0.2 * torch.randn_like(m.subln.weight))
        for mm in (m.m1, m.m2):
            mm.D.add_(0.3 * torch.randn_like(mm.D))
            mm.A_log.add_(0.1 * torch.randn_like(mm.A_log))
    assert_pass(check_module(m, "diff_mamba"))


# ------------------------------------------------------------------------------ every row of the group

_MODULES = {
    "all_or_here_attention": (lambda: U.Olmo2AHAAttention(8, 4, 2, local_window=3), {}, ()),
    "coca_collinear_attention": (lambda: U.CocaLlamaAttention(8, 4, 2, bias=True), {}, ()),
    "diff_mamba": (lambda: U.DiffMamba(4, 2, 3, 2, 2, bias=True), {}, ()),
    "gmm_dca_location_attention": (lambda: U.DynamicConvolutionAttention(4, 5, 2, 5, 3, 3, 11, 0.1, 0.9), {}, ("P",)),
    "high_order_attention_hoa": (lambda: U.HighDivModule(8, 3), {}, ()),
    "latent_alignment_attention": (lambda: U.VarAttnGenerator(4, 3, 5, 6), {}, ()),
    "monotonic_location_attention": (lambda: U.MonotonicEncoderDecoderAttention(4, 3, 5, 4, 2, 3, 2, "relu", True),
                                     {}, ()),
    "neural_attention_mlp_scores": (lambda: U.NeuralAttention(8, 2, 4, projection_dim=4), {}, ()),
    "optimised_efficient_super_attention": (lambda: U.SuperAttention(6, 5), {}, ()),
    "position_coupling": (lambda: U.CoupledPositionEmbedding(13, 4), {}, ()),
    "triadic_modulation_co4": (lambda: U.ModulatedMultiHeadAttention(6, top_k=3), {}, ()),
    "urpe_toeplitz_modulated_attention": (lambda: U.UrpeSelfAttention(6, 3, 20, rp_bucket=8, max_rp=16), {}, ()),
}


def test_soft_b_specs_are_registered():
    from refattn.interop.torch_specs_soft_b import GROUP_SLUGS

    assert_registered(GROUP_SLUGS, _MODULES)
    from refattn.interop.unmapped import UNMAPPED

    assert UNMAPPED["tucker_attention"][0] == "code not readable"
    with pytest.raises(ValueError, match="code not readable"):
        params_from_state_dict("tucker_attention", {})


@pytest.mark.parametrize("slug", sorted(_MODULES))
def test_soft_b_specs_map_state_dict_and_grads_back(slug):
    make, cfg, derived = _MODULES[slug]
    torch.manual_seed(4)
    assert_round_trip(slug, make().double(), cfg, derived)
