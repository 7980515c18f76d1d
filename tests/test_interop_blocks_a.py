"""refattn.interop.torch for the group ``blocks_a`` (refattn/interop/torch_specs_blocks_a.py): each
slug's ``check_module`` against the upstream module in float64, and the state_dict round trip.

The modules are in ``tests/_upstream_blocks_a.py`` (file@commit in their comments).
"""

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import _upstream_blocks_a as U  # noqa: E402
from _interop_checks import assert_pass, assert_registered, assert_round_trip  # noqa: E402

from refattn.interop.torch import check_module, params_from_state_dict  # noqa: E402


def _perturb(m, scale=0.3, seed=0):
    """Move every trainable parameter off its init (ones, zeros, 1/3): the check then sees each one."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in m.parameters():
            if p.requires_grad:
                p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return m


@pytest.mark.parametrize("dim,eps", [(6, 1e-6), (4, 1e-5)])
def test_rms_norm(dim, eps):
    assert_pass(check_module(_perturb(U.RMSNorm(dim, eps=eps)), "rms_norm"))


@pytest.mark.parametrize("channels_last,alpha", [(True, 0.5), (False, 0.8)])
def test_dyt_dynamic_tanh(channels_last, alpha):
    assert_pass(check_module(_perturb(U.DynamicTanh(5, channels_last, alpha)), "dyt_dynamic_tanh"))


def test_dynamic_range_activator():
    torch.manual_seed(0)
    for _ in range(2):
        assert_pass(check_module(U.DRA(), "dynamic_range_activator"))


@pytest.mark.parametrize("cls,kind", [("PolyNorm", "polynorm"), ("PolyReLU", "polyrelu")])
def test_polynorm_polycom(cls, kind):
    assert_pass(check_module(_perturb(getattr(U, cls)()), "polynorm_polycom", config={"kind": kind}))


@pytest.mark.parametrize("b,max_out,scale", [(2, 2, None), (1.5, 1, None), (2.5, 2, 0.7)])
def test_bcos_transform(b, max_out, scale):
    torch.manual_seed(1)
    assert_pass(check_module(U.BcosConv2d(5, 3, max_out=max_out, b=b, scale=scale), "bcos_transform"))


def test_bcos_transform_refuses_a_kxk_kernel():
    with pytest.raises(ValueError, match="1x1 kernel"):
        params_from_state_dict("bcos_transform", U.BcosConv2d(3, 2, kernel_size=3).state_dict())


@pytest.mark.parametrize("cls,lmax,normalization,bal", [
    ("EquivariantLayerNormArraySphericalHarmonics", 2, "component", True),
    ("EquivariantLayerNormArraySphericalHarmonics", 1, "norm", False),
    ("EquivariantRMSNormArraySphericalHarmonicsV2", 2, "component", True),
    ("EquivariantRMSNormArraySphericalHarmonicsV2", 1, "component", False),
    ("EquivariantLayerNormArray", 2, "component", True), ("EquivariantLayerNormArray", 1, "norm", True)])
def test_equiformerv2_separable_layernorm(cls, lmax, normalization, bal):
    kw = {} if cls == "EquivariantLayerNormArray" else {"std_balance_degrees": bal}
    m = _perturb(getattr(U, cls)(lmax, 4, normalization=normalization, **kw))
    cfg = {"normalization": normalization} if normalization != "component" else {}
    assert_pass(check_module(m, "equiformerv2_separable_layernorm", config=cfg))


def _magneto_args(**kw):
    from types import SimpleNamespace

    base = dict(encoder_embed_dim=6, encoder_attention_heads=2, encoder_ffn_embed_dim=7, layernorm_eps=1e-5,
                activation_fn="gelu", subln=True, encoder_normalize_before=True)
    return SimpleNamespace(**{**base, **kw})


@pytest.mark.parametrize("kw,cfg", [({}, {}), ({"encoder_attention_heads": 3, "activation_fn": "relu"},
                                                  {"is_causal": True, "activation": "relu"}),
                                    ({"activation_fn": "swish", "layernorm_eps": 1e-6}, {"activation": "silu"})])
def test_magneto_subln_init(kw, cfg):
    torch.manual_seed(2)
    assert_pass(check_module(_perturb(U.EncoderLayer(_magneto_args(**kw))), "magneto_subln_init", config=cfg))


@pytest.mark.parametrize("heads,qkv_bias,qk_scale,eps", [(2, False, None, 1e-6), (3, True, 0.3, 1e-5)])
def test_layerscale(heads, qkv_bias, qk_scale, eps):
    from functools import partial

    torch.manual_seed(3)
    m = U.LayerScale_Block(6, heads, mlp_ratio=1.5, qkv_bias=qkv_bias, qk_scale=qk_scale, init_values=0.5,
                           norm_layer=partial(nn.LayerNorm, eps=eps))
    acfg = {"num_heads": heads, **({"scale": qk_scale} if qk_scale else {})}
    assert_pass(check_module(_perturb(m), "layerscale", config={"attention_config": acfg}))
    bad = check_module(m, "layerscale", config={"attention_config": {"num_heads": 1}}, cases=["small"], seeds=[0])
    assert not bad.passed and "num_heads" in str(bad)  # a head count that is not the module's is named


def _macaron(heads=2, normalize_before=False, c=6):
    from types import SimpleNamespace

    return U.MacaronEncoderLayer(SimpleNamespace(encoder_embed_dim=c, encoder_attention_heads=heads, macaron=True,
                                                 encoder_ffn_embed_dim=7, encoder_normalize_before=normalize_before))


@pytest.mark.parametrize("heads,normalize_before", [(2, False), (3, True)])
def test_macaron_block(heads, normalize_before):
    torch.manual_seed(5)
    m = _perturb(_macaron(heads, normalize_before))
    assert_pass(check_module(m, "macaron_block", config={"attention_config": {"num_heads": heads}}))


def _gptj(heads=2, rotary_dim=2, c=8, eps=1e-5):
    from types import SimpleNamespace

    return U.GPTJBlock(SimpleNamespace(hidden_size=c, n_embd=c, num_attention_heads=heads, rotary_dim=rotary_dim,
                                       n_inner=6, layer_norm_epsilon=eps, max_position_embeddings=32))


@pytest.mark.parametrize("heads,rotary_dim,eps", [(2, 2, 1e-5), (2, 4, 1e-6), (4, 2, 1e-5)])
def test_parallel_attention_mlp_block_gptj(heads, rotary_dim, eps):
    torch.manual_seed(6)
    m = _perturb(_gptj(heads, rotary_dim, eps=eps))
    acfg = {"num_heads": heads, "is_causal": True, "rope": {"interleaved": True, "rotary_dim": rotary_dim}}
    assert_pass(check_module(m, "parallel_attention_mlp_block", config={"attention_config": acfg}))
    bad = check_module(m, "parallel_attention_mlp_block", config={"attention_config": {"num_heads": heads}},
                       cases=["small"], seeds=[0])
    assert not bad.passed and "interleaved" in str(bad)


def _ngpt(c=8, heads=2, base_scale=None):
    from types import SimpleNamespace

    return U.NGPTBlock(SimpleNamespace(n_embd=c, n_head=heads, bias=False, use_nGPT=1,
                                       base_scale=c ** -0.5 if base_scale is None else base_scale))


@pytest.mark.parametrize("c,heads,base_scale", [(8, 2, None), (12, 3, 0.2)])
def test_ngpt_normalized_block(c, heads, base_scale):
    torch.manual_seed(7)
    m = _perturb(_ngpt(c, heads, base_scale), scale=0.05)
    assert_pass(check_module(m, "ngpt_normalized_block", config={"attention_config": {"num_heads": heads}}))


def _sas_p(layer_idx=1, heads=2, c=8, mlp_skip=0.0):
    """myGPT2Block under simplified_transformers' skipless-parallel config (the yaml values)."""
    from types import SimpleNamespace

    cfg = SimpleNamespace(hidden_size=c, n_inner=None, parallel_layers=True, norm_type="none", layer_norm_epsilon=1e-5,
                          norm_position="pre", attn_block_resid_gain=1.0, attn_block_skip_gain=0.0,
                          mlp_block_resid_gain=0.1, mlp_block_skip_gain=mlp_skip, trainable_attn_block_gains=True,
                          trainable_mlp_block_gains=True, max_position_embeddings=32, num_attention_heads=heads,
                          first_layer_value_resid_gain=1.0, value_resid_gain=0.0, value_skip_gain=1.0,
                          trainable_value_gains=True, query_init_std=0.0, attn_mat_resid_gain=1.0,
                          attn_mat_skip_gain=1.0, trainable_attn_mat_gains=True, centre_attn=True,
                          centre_attn_gain=1.0, lrelu_neg_slope=0.0)
    m = U.myGPT2Block(cfg, layer_idx=layer_idx)
    with torch.no_grad():  # off the init (zero query weights, unit gains); the frozen zero biases stay zero
        for name, p in m.named_parameters():
            if p.requires_grad and not name.endswith("skip_gain") or name.startswith("attn.attn_mat"):
                p.add_(0.3 * torch.randn_like(p))
    return m


@pytest.mark.parametrize("layer_idx,heads,mlp_skip", [(1, 2, 0.0), (0, 2, 0.0), (3, 4, 0.5)])
def test_simplified_block_he_hofmann(layer_idx, heads, mlp_skip):
    torch.manual_seed(8)
    m = _sas_p(layer_idx, heads, mlp_skip=mlp_skip)
    assert_pass(check_module(m, "simplified_block_he_hofmann", config={"attention_config": {"num_heads": heads}}))


def test_simplified_block_refuses_nonzero_frozen_biases():
    sd = _sas_p().state_dict()
    sd["mlp.c_fc.bias"] = sd["mlp.c_fc.bias"] + 1.0
    with pytest.raises(ValueError, match="no biases"):
        params_from_state_dict("simplified_block_he_hofmann", sd)


@pytest.mark.parametrize("hi,ho,qkv_bias,qk_scale", [(1, 2, False, None), (2, 3, True, 0.4)])
def test_tnt_block(hi, ho, qkv_bias, qk_scale):
    torch.manual_seed(9)
    m = _perturb(U.TNTBlock(6, 4, ho, hi, num_words=3, mlp_ratio=1.5, qkv_bias=qkv_bias, qk_scale=qk_scale))
    icfg, ocfg = {"num_heads": hi}, {"num_heads": ho}
    if qk_scale:
        icfg["scale"] = ocfg["scale"] = qk_scale
    assert_pass(check_module(m, "tnt_block", config={"inner_attention_config": icfg, "outer_attention_config": ocfg}))


@pytest.mark.parametrize("loop_func,n_layer,n_loops,window", [("z=f(x+z)", 1, 3, None), ("z=f(x*z)", 1, 2, 2),
                                                             ("z=f(x+z)", 2, 2, 1)])
def test_looped_transformer(loop_func, n_layer, n_loops, window):
    torch.manual_seed(10)
    m = _perturb(U.TransformerModelLooped(3, 8, n_embd=6, n_layer=n_layer, n_head=2, loop_func=loop_func), 0.2)
    cfg = {"n_loops": n_loops, "window": window, "injection": "add" if loop_func == "z=f(x+z)" else "mul",
           "attention_config": {"num_heads": 2, "is_causal": True}}
    assert_pass(check_module(m, "looped_transformer", config=cfg))


def _mixtral(experts=4, k=2, c=6, f=5):
    from types import SimpleNamespace

    return U.MixtralSparseMoeBlock(SimpleNamespace(hidden_size=c, intermediate_size=f, num_local_experts=experts,
                                                   num_experts_per_tok=k))


@pytest.mark.parametrize("experts,k", [(4, 2), (3, 1), (5, 3)])
def test_moe_topk_gating_mixtral(experts, k):
    torch.manual_seed(11)
    m = _mixtral(experts, k)
    with torch.no_grad():
        for p in m.parameters():
            nn.init.normal_(p, std=0.5)
    assert_pass(check_module(m, "moe_topk_gating"))


@pytest.mark.parametrize("heads,shared,routed,head_dim", [(4, 2, 1, None), (4, 0, 2, None), (2, 2, 0, None),
                                                         (4, 2, 2, 3)])
def test_mixture_of_head_attention(heads, shared, routed, head_dim):
    torch.manual_seed(12)
    m = U.MoHAttention(8, heads, qkv_bias=True, shared_head=shared, routed_head=routed, head_dim=head_dim)
    with torch.no_grad():
        for p in m.parameters():
            nn.init.normal_(p, std=0.4)
    assert_pass(check_module(m, "mixture_of_head_attention"))


@pytest.mark.parametrize("bias,use_norm,ngroups", [(False, False, 1), (True, True, 1), (True, True, 4)])
def test_gated_memory_unit(bias, use_norm, ngroups):
    torch.manual_seed(13)
    m = U.GMU(6, 8, bias=bias, use_norm=use_norm, ngroups=ngroups)
    with torch.no_grad():
        for p in m.parameters():
            nn.init.normal_(p, std=0.5)
    assert_pass(check_module(m, "gated_memory_unit", config={"ngroups": ngroups}))


# ---- the round trip over every slug of the group: (module factory, config, Derived buffers)

_MODULES = {
    "gated_memory_unit": (lambda: U.GMU(6, 8, bias=True, use_norm=True, ngroups=2), {}, ()),
    "mixture_of_head_attention": (lambda: U.MoHAttention(8, 4, qkv_bias=True, shared_head=2, routed_head=1), {}, ()),
    "moe_topk_gating": (_mixtral, {}, ()),
    "looped_transformer": (lambda: U.TransformerModelLooped(3, 4, n_embd=6, n_layer=2, n_head=2)._backbone.transformer,
                           {"n_loops": 2, "num_layers": 2}, ()),
    "tnt_block": (lambda: U.TNTBlock(6, 4, 2, 1, num_words=3, qkv_bias=True), {}, ()),
    "simplified_block_he_hofmann": (lambda: _sas_p(0), {}, ("attn_block_skip_gain", "mlp.c_fc.bias", "mlp.c_proj.bias",
                                                            "attn.v_attn.bias")),
    "ngpt_normalized_block": (_ngpt, {}, ()),
    "parallel_attention_mlp_block": (_gptj, {}, ()),
    "macaron_block": (_macaron, {}, ()),
    "layerscale": (lambda: U.LayerScale_Block(6, 2, qkv_bias=True), {}, ()),
    "magneto_subln_init": (lambda: U.EncoderLayer(_magneto_args()), {}, ()),
    "rms_norm": (lambda: U.RMSNorm(6), {}, ()),
    "dyt_dynamic_tanh": (lambda: U.DynamicTanh(5, True), {}, ()),
    "dynamic_range_activator": (U.DRA, {}, ()),
    "polynorm_polycom": (U.PolyNorm, {}, ()),
    "bcos_transform": (lambda: U.BcosConv2d(4, 3), {}, ()),
    "equiformerv2_separable_layernorm": (lambda: U.EquivariantRMSNormArraySphericalHarmonicsV2(2, 3), {},
                                         ("expand_index", "balance_degree_weight")),
}


def test_blocks_a_specs_are_registered():
    from refattn.interop.torch_specs_blocks_a import GROUP_SLUGS

    assert_registered(GROUP_SLUGS, _MODULES)


@pytest.mark.parametrize("slug", sorted(_MODULES))
def test_blocks_a_map_state_dict_and_grads_back(slug):
    make, cfg, derived = _MODULES[slug]
    torch.manual_seed(4)
    assert_round_trip(slug, _perturb(make()).double(), cfg, derived)
