"""refattn.interop.torch for the ``blocks_b`` group (``refattn/interop/torch_specs_blocks_b.py``):
``check_module`` in float64 against the modules of ``tests/_upstream_blocks_b.py`` (upstream
file@commit in their comments), the state_dict round trip, and the registration."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import _upstream_blocks_b as U  # noqa: E402
from _interop_checks import assert_pass, assert_registered, assert_round_trip  # noqa: E402

from refattn.interop.torch import (  # noqa: E402
    check_module,
    params_from_state_dict,
)


def _jitter(m, scale=0.3):
    """Nonzero biases, norms off the identity: every parameter matters."""
    torch.manual_seed(11)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(scale * torch.randn_like(p))
    return m


@pytest.mark.parametrize("kw", [
    dict(class_token=True, no_embed_class=False, patch_norm=False),
    dict(class_token=True, no_embed_class=True, patch_norm=True, dynamic_img_pad=True),
    dict(class_token=False, patch_norm=True, bias=False)])
def test_vit_patch_embedding(kw):
    torch.manual_seed(1)
    m = _jitter(U.ViTEmbedding(12, **kw))
    assert_pass(check_module(m, "vit_patch_embedding"))


@pytest.mark.parametrize("pool_size,ls", [(3, True), (5, False)])
def test_poolformer_block(pool_size, ls):
    torch.manual_seed(2)
    m = _jitter(U.PoolFormerBlock(4, pool_size=pool_size, mlp_ratio=2., use_layer_scale=ls))
    assert_pass(check_module(m, "poolformer_pooling_mixer"))


def _bn_stats(m):
    """BatchNorm running statistics off (0, 1): eval mode normalises with them."""
    torch.manual_seed(12)
    for mod in m.modules():
        if isinstance(mod, (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d)):
            mod.running_mean.normal_()
            mod.running_var.uniform_(0.5, 2.0)
    return m


@pytest.mark.parametrize("kw", [dict(kernel_size=3), dict(kernel_size=5, use_layer_scale=False, num_conv_branches=2),
                                dict(kernel_size=3, inference_mode=True)])
def test_fastvit_repmixer(kw):
    torch.manual_seed(3)
    m = _bn_stats(_jitter(U.RepMixer(4, **kw)))
    assert_pass(check_module(m, "fastvit_repmixer"))


@pytest.mark.parametrize("patch,norm", [(2, None), (3, torch.nn.LayerNorm)])
def test_polyphase_anchoring_poly_patch_embed(patch, norm):
    torch.manual_seed(4)
    assert_pass(check_module(_jitter(U.PolyPatchEmbed(patch, 3, 5, norm_layer=norm)), "polyphase_anchoring"))


@pytest.mark.parametrize("kw", [dict(), dict(padding_mode="border", align_corners=True),
                                dict(padding_mode="reflection")])
def test_spatial_transformer_tutorial_net(kw):
    torch.manual_seed(5)
    m = U.SpatialTransformerNet(2, 3, 4, 3, 2, 4 * 2 * 2, 6, **kw)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.2 * torch.randn_like(p))  # a theta off the identity
    assert_pass(check_module(m, "spatial_transformer_bilinear_sampler", config=kw))


@pytest.mark.parametrize("patch,c_out", [(2, 4), (3, 3)])
def test_lit_deformable_patch_embed(patch, c_out):
    torch.manual_seed(6)
    m = _bn_stats(_jitter(U.DeformablePatchEmbed_GELU(patch, 3, c_out), scale=0.4))  # offsets off zero
    assert_pass(check_module(m, "lit_deformable_token_merging"))


@pytest.mark.parametrize("d_in,d_out,r,bias", [(7, 6, 3, True), (5, 5, 2, False)])
def test_greenformer_led(d_in, d_out, r, bias):
    torch.manual_seed(7)
    assert_pass(check_module(_jitter(U.LED(d_in, d_out, r, bias=bias)), "low_rank_factorized_linear"))


@pytest.mark.parametrize("dim,use_all_h,theta", [(4, True, 5.0), (3, False, 16.0)])
def test_lmuformer_lmu(dim, use_all_h, theta):
    torch.manual_seed(8)
    m = _bn_stats(_jitter(U.LMU(dim, use_all_h=use_all_h, seq_len=16, theta=theta)))
    with torch.no_grad():
        m.lmu.W_u.bias.fill_(0.5)  # most u > 0: the memory carries signal
    assert_pass(check_module(m, "lmu_token_mixer"))


@pytest.mark.parametrize("k,base,sws", [(9, 10, True), (4, 3, True), (5, 10, False)])
def test_nutime_multi_bias_encoder(k, base, sws):
    torch.manual_seed(9)
    m = U.MultiBiasEncoder(num_bias=k, mb_emb_dim=5, base_bias=base, scale_weighted_sum=sws)
    assert_pass(check_module(m, "nutime_multiscale_embedding", config={"base": float(base)}))


@pytest.mark.parametrize("depth,wm,gmax,shuffle,act", [(4, 2.0, 4, True, "swish"), (5, 2.0, 8, False, "gelu"),
                                                       (3, 1.5, 2, True, "relu")])
def test_delight_dextra_unit(depth, wm, gmax, shuffle, act):
    torch.manual_seed(10)
    p = max(4, gmax)  # upstream: widths divisible by max_glt_groups
    m = _jitter(U.DExTraUnit(8, p, p, width_multiplier=wm, dextra_depth=depth, max_glt_groups=gmax, act_type=act,
                             glt_shuffle=shuffle))
    cfg = {"activation": {"swish": "silu"}.get(act, act)}
    assert_pass(check_module(m, "delight_dextra", config=cfg))


@pytest.mark.parametrize("d,n_max,divisor,head_dim", [(4, 6, 8, 2), (3, 16, 2, 3)])
def test_rethinking_attention_substitute(d, n_max, divisor, head_dim):
    torch.manual_seed(11)
    m = U.AttentionSubstitute(_jitter(U.FFNetwork(d, n_max, divisor), scale=0.1), head_dim)
    assert_pass(check_module(m, "shallow_ffn_attention_replacement"))


@pytest.mark.parametrize("n_blocks,dilation,period,heads,bias", [(3, 1, 1, 2, True), (5, 2, 2, 1, False),
                                                               (4, 3, 1, 2, True)])
def test_denseformer_dwa_mha_blocks(n_blocks, dilation, period, heads, bias):
    torch.manual_seed(12)
    m = _jitter(U.DenseFormerMHA(4, heads, n_blocks, dilation, period, bias=bias))  # DWA weights off the identity
    assert_pass(check_module(m, "denseformer_dwa", config={"block_config": {"num_heads": heads}}))


@pytest.mark.parametrize("kw,cfg", [(dict(), {}), (dict(beta_single_linear=False, beta_hidden_size=5, v_sigmoid=False), {}),
                                    (dict(v_constant=True, v_constant_value=1.5), {"v_constant": 1.5})])
def test_deep_delta_residual_vdim1(kw, cfg):
    torch.manual_seed(13)
    m = U.DeepDeltaResidualVdim1(6, beta_init=1.0, **kw)
    with torch.no_grad():
        for p in m.parameters():
            torch.nn.init.normal_(p, std=0.5)
    assert_pass(check_module(m, "depth_attention_delta_residual", config=cfg))


@pytest.mark.parametrize("c,k", [(4, 3), (3, 5)])  # k = 3 upstream; 5: the kernel is read from conv2.weight
def test_dico_conv_module(c, k):
    torch.manual_seed(14)
    assert_pass(check_module(_jitter(U.DiCoConvModule(c, k)), "dico_compact_channel_attention"))


@pytest.mark.parametrize("c,h,e,r,act", [(8, 2, 3, 2, "relu"), (6, 3, 3, 1, "gelu")])
def test_partialformer_attention(c, h, e, r, act):
    torch.manual_seed(15)
    m = _jitter(U.EfficientPAQKMultiheadAttention(c, h, e, hidden_ratio=r, activation_fn=act))
    assert_pass(check_module(m, "partialformer_head_ffns", config={"activation": act}))


@pytest.mark.parametrize("kw", [dict(directions_amount=4, use_residual=True, normalize=True),
                                dict(directions_amount=2), dict(directions_amount=4, ndim=2, n_ssm=1)])
def test_ssm_2d_layer(kw):
    torch.manual_seed(16)
    m = _jitter(U.TwoDimensionalSSM(4, **kw), scale=0.2)
    assert_pass(check_module(m, "ssm_2d_layer"))


@pytest.mark.parametrize("heads,ratio", [(4, 1.0), (2, 2.0)])  # complete_model=True leaves t unused: torch reports
def test_dydit_block(heads, ratio):                              # no gradient for it, so check_module cannot compare
    torch.manual_seed(17)
    m = U.DiTBlock(16, heads, mlp_ratio=ratio)
    with torch.no_grad():
        for p in m.parameters():
            torch.nn.init.normal_(p, std=0.4)  # routers near 0: heads, groups and tokens mixed kept / skipped
        m.token_selection.mlp_head[0].weight.normal_(std=1.0)
        m.token_selection.mlp_head[2].weight.fill_(1.0)
        m.token_selection.mlp_head[2].bias.fill_(-0.2)  # token kept iff its (single) hidden unit exceeds 0.2
    assert_pass(check_module(m, "dydit_dynamic_width_token"))


@pytest.mark.parametrize("granularity,heads,kv_heads,rope", [("attn_sequence", 2, 1, True), ("attn_token", 2, 2, False)])
def test_mindskip_llama_attention_half(granularity, heads, kv_heads, rope):
    torch.manual_seed(18)
    m = _jitter(U.MindSkipAttentionHalf(8, heads, kv_heads, granularity=granularity))
    with torch.no_grad():
        m.router.weight.mul_(4.0)  # routing scores away from 1/2: sequences / tokens both kept and skipped
    cfg = {"route_level": m.route_level, "attention_config": {"num_heads": heads, "num_kv_heads": kv_heads,
                                                              "is_causal": True, "rope": {"base": 100.0} if rope else None}}
    assert_pass(check_module(m, "mindskip_attention_dynamic_depth", config=cfg))


# (make, config, derived keys) per slug: the round trip state_dict -> params -> state_dict
_MODULES = {
    "vit_patch_embedding": (lambda: U.ViTEmbedding(12, patch_norm=True), {}, ()),
    "poolformer_pooling_mixer": (lambda: U.PoolFormerBlock(4), {}, ()),
    "fastvit_repmixer": (lambda: U.RepMixer(4), {},
                         tuple(f"{b}.num_batches_tracked" for b in ("norm.rbr_skip", "mixer.rbr_skip",
                                                                    "mixer.rbr_conv.0.bn", "mixer.rbr_scale.bn"))),
    "polyphase_anchoring": (lambda: U.PolyPatchEmbed(2, 3, 5, norm_layer=torch.nn.LayerNorm), {}, ()),
    "spatial_transformer_bilinear_sampler": (lambda: U.SpatialTransformerNet(2, 3, 4, 3, 2, 16, 6), {}, ()),
    "lit_deformable_token_merging": (lambda: U.DeformablePatchEmbed_GELU(2, 3, 4), {},
                                     ("norm_layer.num_batches_tracked",)),
    "low_rank_factorized_linear": (lambda: U.LED(5, 5, 2), {}, ()),
    "lmu_token_mixer": (lambda: U.LMU(4, seq_len=8, theta=5.0), {},
                        ("lmu.A", "lmu.B", "lmu.H", "lmu.fft_H", "proj_bn.num_batches_tracked")),
    "nutime_multiscale_embedding": (lambda: U.MultiBiasEncoder(num_bias=5, mb_emb_dim=4), {}, ("scales", "locs")),
    "delight_dextra": (lambda: U.DExTraUnit(8, 4, 4, dextra_depth=3, max_glt_groups=2),
                       {"dextra_depth": 3, "max_glt_groups": 2, "in_proj_features": 4, "out_features": 4}, ()),
    "shallow_ffn_attention_replacement": (lambda: U.FFNetwork(4, 6), {}, ()),
    "denseformer_dwa": (lambda: U.DenseFormerMHA(4, 2, 3, 2, 1), {"n_blocks": 3}, ()),
    "depth_attention_delta_residual": (lambda: U.DeepDeltaResidualVdim1(6, beta_single_linear=False, beta_hidden_size=3),
                                       {"beta_single_linear": False}, ()),
    "dico_compact_channel_attention": (lambda: U.DiCoConvModule(4), {}, ()),
    "partialformer_head_ffns": (lambda: U.EfficientPAQKMultiheadAttention(8, 2, 3), {}, ()),
    "ssm_2d_layer": (lambda: U.TwoDimensionalSSM(4, use_residual=True, normalize=True), {"use_residual": True}, ()),
    "dydit_dynamic_width_token": (lambda: U.DiTBlock(16, 4, mlp_ratio=1.0), {}, ()),
    "mindskip_attention_dynamic_depth": (lambda: U.MindSkipAttentionHalf(8, 2, 1), {}, ()),
}


def test_blocks_b_specs_are_registered():
    from refattn.interop.torch_specs_blocks_b import GROUP_SLUGS

    assert_registered(GROUP_SLUGS, _MODULES)


@pytest.mark.parametrize("slug", sorted(_MODULES))
def test_blocks_b_specs_map_state_dict_and_grads_back(slug):
    make, cfg, derived = _MODULES[slug]
    torch.manual_seed(4)
    assert_round_trip(slug, make().double(), cfg, derived)


def test_denseformer_without_n_blocks_says_what_to_pass():

    with pytest.raises(ValueError, match=r"pass n_blocks="):
        params_from_state_dict("denseformer_dwa", {"blocks.0.in_proj_weight": np.zeros((6, 2)),
                                                   "blocks.0.out_proj.weight": np.zeros((2, 2))})
