"""refattn.interop.torch_specs_ops_b: check_module against the upstream neural-operator modules of
``tests/_upstream_ops_b.py`` (file@commit in their comments), in float64."""

import pytest

torch = pytest.importorskip("torch")

import _upstream_ops_b as U  # noqa: E402
from _interop_checks import assert_pass, assert_registered, assert_round_trip  # noqa: E402

from refattn.interop.torch import (  # noqa: E402
    check_module,
)


@pytest.mark.parametrize("nd,if_11cnv,ncp", [(1, False, 1), (1, True, 2), (2, False, 1), (2, True, 2)])
def test_cape_prm_emb_block(nd, if_11cnv, ncp):
    torch.manual_seed(1)
    grid = (16,) if nd == 1 else (8, 12)
    m = U.PrmEmbBlock(6, 3, 2, if_11cnv, 2, ncp, modes=3 if nd == 1 else 2, normed_dim=grid, nd=nd)
    with torch.no_grad():
        m.LN.weight.normal_(1, 0.3)
        m.LN.bias.normal_(0, 0.3)
    assert_pass(check_module(m, "cape_parameter_channel_attention"))


@pytest.mark.parametrize("kw,cfg", [
    (dict(in_channels=3, out_channels=4, role="encoder", radius=0.8, hidden_size=8, mlp_layers=2), {}),
    (dict(in_channels=4, out_channels=4, role="encoder", radius=0.8, hidden_size=8, mlp_layers=2,
          attention_type="dot_product", transform_type="nonlinear", node_embedding=True), {"transform_type": "nonlinear"}),
    (dict(in_channels=4, out_channels=3, role="decoder", radius=0.7, hidden_size=8, mlp_layers=1, scales=(1.0, 1.6),
          use_scale_weights=True), {"scales": (1.0, 1.6)})])
def test_gaot_magno(kw, cfg):
    torch.manual_seed(2)
    assert_pass(check_module(U.MAGNO(**kw), "gaot_magno", config=cfg))


@pytest.mark.parametrize("args", [(8, 4, 2, 2, "conv", "conv", 2, 2, 3),  # 3 levels, conv samplers
                                  (4, 4, 2, 2, "avg_pool", "avg_pool", 2, 1, 4)])  # one head of width C: no to_out
def test_mano_multipole_attention(args):
    torch.manual_seed(2)
    m = U.MultipoleAttention(*args)
    with torch.no_grad():
        for n, v in m.named_parameters():
            if "norm" in n:
                v.add_(0.3 * torch.randn_like(v))
    assert_pass(check_module(m, "mano_multipole_attention"))


@pytest.mark.parametrize("args", [(3, 2, 0.45, 8, 2, 2), (2, 2, 0.6, 6, 1, 3)])  # depth 2 / depth 1, 3 heads
def test_mino_encoder_supernodes(args):
    torch.manual_seed(2)
    m = U.EncoderSupernodes(*args)
    with torch.no_grad():  # off kappamodules' non-affine norms and zero biases
        for v in m.parameters():
            v.add_(0.2 * torch.randn_like(v))
    assert_pass(check_module(m, "mino_gno_cross_attention"))


@pytest.mark.parametrize("rownorm,n_iter,tau", [(False, 8, 1.0), (True, 5, 0.7)])
def test_mono_cotap(rownorm, n_iter, tau):
    torch.manual_seed(2)
    m = U.CoTAP(5, 4, 2, torch.nn.GELU(), mlp_rownorm=rownorm)
    m.router.n_iter, m.router.temperature = n_iter, tau
    assert_pass(check_module(m, "mono_cotap_ot_projection"))


@pytest.mark.parametrize("make", [lambda: U.PhysGTOAtten1(6, 4, 2), lambda: U.GTO_Atten(6, 3, 3),
                                  lambda: U.PhysGTOAtten3(4, 6, 2)], ids=["task1", "task2", "task3"])
def test_physgto_attention(make):
    torch.manual_seed(2)
    m = make()
    with torch.no_grad():
        for k, v in m.named_parameters():
            if "bias" in k:
                v.normal_(0, 0.3)
    assert_pass(check_module(m, "physgto_projection_attention"))


@pytest.mark.parametrize("cin,cout,groups,theta", [(3, 4, 2, 10000), (4, 4, 4, 100)])  # res_conv / identity
def test_ditto_resnet_block(cin, cout, groups, theta):
    torch.manual_seed(2)
    m = U.DittoResnetBlock(cin, cout, emb_dim=6, time_dim=5, groups=groups, theta=theta)
    for prm in m.parameters():
        torch.nn.init.normal_(prm, std=0.5)
    assert_pass(check_module(m, "ditto_time_conditioned_operator"))


@pytest.mark.parametrize("kw", [dict(), dict(norm_first=False, query_dim=2)])
def test_prose_operator_decoding(kw):
    torch.manual_seed(2)
    m = U.ProseOperatorDecoding(8, 2, 12, 3, time_embed="continuous", **kw)
    for prm in m.parameters():
        torch.nn.init.normal_(prm, std=0.5)
    assert_pass(check_module(m, "prose_multimodal_operator"))
    learnable = U.ProseOperatorDecoding(8, 2, 12, 3, time_embed="learnable", max_time_len=4)
    with pytest.raises(ValueError, match="continuous time embedding"):
        check_module(learnable, "prose_multimodal_operator")


@pytest.mark.parametrize("act,name,layers", [(torch.nn.SiLU, "silu", 2), (torch.nn.ELU, "elu", 1)])
def test_beno_interaction_network(act, name, layers):
    torch.manual_seed(2)
    m = U.InteractionNetwork(4, 4, 3, 3, 2, 5, 6, layers, activation=act)
    with torch.no_grad():
        for prm in m.parameters():
            if prm.requires_grad:
                prm.add_(0.3 * torch.randn_like(prm))
    assert_pass(check_module(m, "beno_boundary_embedded_operator", config={"activation": name}))


@pytest.mark.parametrize("args,cfg", [(((8, 8, 16, 32), 2, 1, 4, 1), {}),
                                      (((8, 8, 16, 32), 1, 2, 4, 2, "gelu"), {"activation": "gelu"})])
def test_hypino_hypernet_decoder(args, cfg):  # four stages with upstream's heads (4, 8, 8, 16) and GroupNorm groups
    torch.manual_seed(2)
    m = U.HyperNetDecoder(*args)
    with torch.no_grad():
        for prm in m.parameters():
            if prm.requires_grad:
                prm.add_(0.3 * torch.randn_like(prm))
    assert_pass(check_module(m, "hypino_hypernetwork_pinn", config=cfg))


@pytest.mark.parametrize("mode,args,kw,scale", [
    ("bilinear", (3, 4, (5, 3)), dict(padding=(2, 1)), 2.0), ("fourier", (4, 4, 3), dict(padding=(1, 1), groups=2), 3.0),
    ("bilinear", (3, 4, 3), dict(padding=(1, 1)), 0.5)])
def test_nns_to_nos_interp_conv2d(mode, args, kw, scale):
    torch.manual_seed(2)
    m = U.InterpConv2d({"scale": scale}, *args, interpolation_mode=mode, **kw)
    cfg = {"scale": scale, "padding": kw["padding"], "interpolation_mode": mode}
    assert_pass(check_module(m, "nns_to_nos_recipe", config=cfg))
    if scale != 1.0:  # the scale lives in the module's scale_dict: a config that omits it is named
        bad = check_module(m, "nns_to_nos_recipe", config={"padding": kw["padding"]}, cases=["small"], seeds=[0])
        assert not bad.passed and "scale_dict" in str(bad)


def _aroma(depth, bottleneck_index):
    return U.AROMAEncoderDecoderKL(input_dim=2, num_channels=2, hidden_dim=8, dim=6, num_self_attentions=depth,
                                   num_latents=5, latent_dim=3, latent_heads=2, latent_dim_head=4, cross_heads=2,
                                   cross_dim_head=3, scales=[2, 3, 4], mlp_feature_dim=4, depth_inr=2,
                                   bottleneck_index=bottleneck_index, max_pos_encoding_freq=3, num_freq=4)


@pytest.mark.parametrize("depth,bottleneck_index", [(2, 1), (0, 0)])
def test_aroma_encoder_decoder(depth, bottleneck_index):
    torch.manual_seed(2)
    m = _aroma(depth, bottleneck_index)
    with torch.no_grad():
        for prm in m.parameters():
            if prm.requires_grad:
                prm.add_(0.2 * torch.randn_like(prm))
    assert_pass(check_module(m, "aroma_latent_neural_field_operator"))


@pytest.mark.parametrize("act,layers", [("ReLU", [4, 4, 6]), ("GELU", [6, 4, 4]), ("Tanh", [4, 8])])
def test_gnp_block_gnp(act, layers):
    torch.manual_seed(2)
    m = U.BlockGNP(3, 4, 5, layers, 2, 7, act)
    assert_pass(check_module(m, "gnp_geometric_neural_operator", config={"nonlinearity": act}))


def _nio(hidden, layers, act):
    return U.NIOHelmPermInv(2, {"n_hidden_layers": hidden, "neurons": 6, "act_string": act, "n_basis": 5},
                            {"width": 4, "modes": 2, "n_layers": layers})


@pytest.mark.parametrize("hidden,layers,act", [(3, 2, "leaky_relu"), (1, 1, "tanh")])
def test_nio_helm_perm_inv(hidden, layers, act):
    torch.manual_seed(2)
    m = _nio(hidden, layers, act)
    with torch.no_grad():
        for prm in m.parameters():
            prm.add_(0.3 * torch.randn_like(prm))
        for bn in m.trunk.batch_layers:
            bn.running_mean.copy_(0.1 * torch.randn(6))
            bn.running_var.copy_(0.5 + torch.rand(6))
    stats = {k: v.numpy() for k, v in m.state_dict().items() if k.startswith("trunk.") and "running_" in k}
    cfg = {"activation": act, "trunk_running_stats": stats}
    bad = check_module(m, "nio_neural_inverse_operator", config=cfg, cases=["small"], seeds=[0])
    assert not bad.passed and "freeze it" in str(bad)  # upstream's fc0.weight.data: torch has no fc0 gradient
    m.fc0.requires_grad_(False)
    assert_pass(check_module(m, "nio_neural_inverse_operator", config=cfg))


# ----------------------------------------------------------------------------------------------
# every spec of the group: the state_dict maps to params and the params map back to it

_MODULES = {
    "cape_parameter_channel_attention": (lambda: U.PrmEmbBlock(6, 3, 2, False, 2, 1, modes=2, normed_dim=(8, 8),
                                                               nd=2), {}, ()),
    "gaot_magno": (lambda: U.MAGNO(3, 4, attention_type="dot_product", hidden_size=8, mlp_layers=2,
                                   scales=(1.0, 2.0), use_scale_weights=True), {}, ()),
    "mano_multipole_attention": (lambda: U.MultipoleAttention(8, 4, 2, 2, "conv", "conv", 2, 2, 3), {}, ()),
    "mino_gno_cross_attention": (lambda: U.EncoderSupernodes(3, 2, 0.45, 8, 2, 2), {},
                                 ("supernode_pooling.message.pos_embedding.omega",)),
    "mono_cotap_ot_projection": (lambda: U.CoTAP(5, 4, 2, torch.nn.GELU(), mlp_rownorm=True), {}, ()),
    "physgto_projection_attention": (lambda: U.PhysGTOAtten3(4, 6, 2), {}, ()),
    "ditto_time_conditioned_operator": (lambda: U.DittoResnetBlock(3, 4, emb_dim=6, time_dim=5, groups=2), {}, ()),
    "prose_multimodal_operator": (lambda: U.ProseOperatorDecoding(8, 2, 12, 3, time_embed="learnable"), {}, ()),
    "beno_boundary_embedded_operator": (lambda: U.InteractionNetwork(4, 4, 3, 3, 2, 5, 6, 2), {},
                                        ("boundary_fn.enc_embedding.position_embedding.pe",)
                                        + tuple(f"boundary_fn.enc_embedding.temporal_embedding.{t}_embed.emb.weight"
                                                for t in ("hour", "weekday", "day", "month"))),
    "hypino_hypernetwork_pinn": (lambda: U.HyperNetDecoder((8, 8, 16, 32), 2, 1, 4, 1), {},
                                 ("target_net.fourier_transform.frequencies", "target_net.in_map.weight",
                                  "target_net.in_map.bias", "target_net.out_map.weight", "target_net.out_map.bias")),
    "nns_to_nos_recipe": (lambda: U.InterpConv2d({"scale": 2.0}, 3, 4, 3, padding=1), {}, ()),
    "aroma_latent_neural_field_operator": (lambda: _aroma(3, 1), {}, (  # the shared processor's aliases, the bands
        tuple(f"encoder.pos_query.bands.{s}" for s in (2, 3, 4))
        + tuple(k for k in _aroma(3, 1).state_dict() if k.startswith(("encoder.layers.1.", "encoder.layers.2."))))),
    "gnp_geometric_neural_operator": (lambda: U.BlockGNP(3, 4, 5, [4, 4, 6], 2, 7, "ReLU"), {}, ()),
    "nio_neural_inverse_operator": (lambda: _nio(3, 2, "leaky_relu"), {}, tuple(  # BatchNorm buffers, the alias
        k for k in _nio(3, 2, "leaky_relu").state_dict() if "running_" in k or "num_batches" in k
        or k.startswith("deeponet.trunk."))),
}


def test_ops_b_specs_are_registered():
    from refattn.interop.torch_specs_ops_b import GROUP_SLUGS

    assert_registered(GROUP_SLUGS, _MODULES)


@pytest.mark.parametrize("slug", sorted(_MODULES))
def test_ops_b_specs_map_state_dict_and_grads_back(slug):
    make, cfg, derived = _MODULES[slug]
    torch.manual_seed(4)
    assert_round_trip(slug, make().double(), cfg, derived)
