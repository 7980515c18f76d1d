"""refattn.interop.torch rows of group ``ops_a`` (refattn/interop/torch_specs_ops_a.py) against the
PyTorch modules of ``tests/_upstream_ops_a.py`` (file@commit in their comments), in float64."""

import pytest

torch = pytest.importorskip("torch")

import _upstream_ops_a as U  # noqa: E402
from _interop_checks import assert_pass, assert_registered, assert_round_trip  # noqa: E402

from refattn.interop.torch import (  # noqa: E402
    check_module,
    params_from_state_dict,
)


@pytest.mark.parametrize("kind,red,emb", [("nonlinear", "mean", "nerf"), ("linear_kernelonly", "sum", None)])
def test_gno_block(kind, red, emb):
    torch.manual_seed(1)
    m = U.GNOBlock(3, 3, 2, radius=0.45, transform_type=kind, reduction=red, pos_embedding_type=emb,
                   pos_embedding_channels=2, channel_mlp_layers=[5])
    cfg = {"transform_type": kind, "reduction": red, "pos_embedding": emb}
    assert_pass(check_module(m, "gno_kernel_integral_layer", config=cfg))


@pytest.mark.parametrize("out_size,cin", [(8, 3), (4, 2), (16, 3)])
def test_cno_block(out_size, cin):
    from refattn.interop.torch_specs_ops_a import CNO_IN_SIZE

    torch.manual_seed(2)
    m = U.CNOBlock(cin, 2, CNO_IN_SIZE, out_size, batch_norm=False)
    assert_pass(check_module(m, "cno_convolutional_operator"))
    with pytest.raises(ValueError, match="running statistics"):
        params_from_state_dict("cno_convolutional_operator", U.CNOBlock(2, 2, 8, 8).state_dict())


@pytest.mark.parametrize("width,modes,order,pad", [(3, (3, 2), 3, True), (2, (2, 3), 2, False)])
def test_ho_fno_block(width, modes, order, pad):
    torch.manual_seed(3)
    m = U.HOBlock(width, *modes, order, two_thirds_zero_padding=pad)
    with torch.no_grad():
        for k, v in m.named_parameters():
            if "norm" in k:
                v.copy_(torch.rand_like(v) + 0.5)
    assert_pass(check_module(m, "ho_fno_higher_order_spectral_conv"))


@pytest.mark.parametrize("its,mode,res,act", [(((2, 1), (1, 1), (2, 1)), "circular", True, "gelu"),
                                              (((1, 0), (2, 0)), "zeros", False, "tanh")])
def test_mgno_layer(its, mode, res, act):
    torch.manual_seed(4)
    m = U.MgNOLayer(its, 3, 2, padding_mode=mode, use_res=res, activation=act)
    assert_pass(check_module(m, "mgno_multigrid_operator", config={"padding_mode": mode, "activation": act}))


@pytest.mark.parametrize("k,c,alpha,L,base", [(3, 2, 3, 0, "legendre"), (2, 1, 4, 1, "chebyshev")])
def test_multiwavelet_mwt_cz1d(k, c, alpha, L, base):
    torch.manual_seed(5)
    m = U.MWTCZ1d(k=k, alpha=alpha, L=L, c=c, base=base)
    with torch.no_grad():
        for name in "ABC":
            w = getattr(m, name).weights1
            w.copy_(torch.complex(torch.randn(w.shape), torch.randn(w.shape)) / (c * k))
        m.T0.bias.copy_(torch.randn(k))
    assert_pass(check_module(m, "multiwavelet_operator", config={"base": base}))


@pytest.mark.parametrize("att,act,grad,its", [("galerkin", "relu", "unrolled", 3), ("fourier", "gelu", "unrolled", 2)])
def test_anie_solver(att, act, grad, its):
    torch.manual_seed(6)
    m = U.ModelBlocks(2, 4, 2, 2, 6, att, activation_type=act)
    with torch.no_grad():
        for k, v in m.named_parameters():
            if "attn.linears" in k and k.endswith("weight"):
                v.mul_(3.0)  # the attention path matters
    cfg = {"attention_type": att, "activation": act, "gradient": grad, "n_iterations": its, "tol": 0.0, "lam": 0.7,
           "smoothing_factor": 0.4}
    assert_pass(check_module(m, "anie_attentional_integral_equation", config=cfg))


@pytest.mark.parametrize("K,orders,mode", [(2, "bidirectional", "recurrent"), (4, "cross2d", "chunked")])
def test_mamba_ss2d(K, orders, mode):
    torch.manual_seed(7)
    m = U.SS2D(4, d_state=3, ssm_ratio=1.5, K=K)
    with torch.no_grad():  # off the init, so that every parameter matters
        m.A_logs.add_(0.3 * torch.randn_like(m.A_logs))
        m.Ds.add_(0.3 * torch.randn_like(m.Ds))
        m.dt_projs_bias.copy_(0.5 * torch.randn_like(m.dt_projs_bias))
        m.out_norm.weight.add_(0.2 * torch.randn_like(m.out_norm.weight))
        m.out_norm.bias.add_(0.2 * torch.randn_like(m.out_norm.bias))
    cfg = {"scan_orders": orders, "mode": mode, "chunk_size": 3}
    assert_pass(check_module(m, "mamba_selective_scan_operator", config=cfg))


@pytest.mark.parametrize("attn_type,heads", [("v2", 2), (None, 1)])
def test_pde_transformer_channel_branch(attn_type, heads):
    torch.manual_seed(8)
    m = U.HATDiTChannelBranch(4, heads, attn_type=attn_type)
    with torch.no_grad():  # upstream zero-initialises adain_2.linear: off the init so the modulation matters
        m.adain_2.linear.weight.normal_(0, 0.5)
        m.adain_2.linear.bias.normal_(0, 0.3)
        m.norm2.weight.add_(0.3 * torch.randn(4))
        if attn_type == "v2":
            m.attn_channel.logit_scale.copy_(torch.tensor([[[1.2]], [[5.0]]]))  # one head above the clamp
    assert_pass(check_module(m, "pde_transformer_channel_attention"))


@pytest.mark.parametrize("d_out,d_model,d_hidden,n_layers,heads", [(1, 4, 5, 1, 2), (2, 6, 3, 2, 3)])
def test_pinnsformer(d_out, d_model, d_hidden, n_layers, heads):
    torch.manual_seed(9)
    m = U.PINNsformer(d_out, d_model, d_hidden, n_layers, heads, d_ff=5)
    with torch.no_grad():  # WaveAct's w1 = w2 = 1 at init: off it, so that each one matters
        for v in m.parameters():
            v.add_(0.2 * torch.randn_like(v))
    assert_pass(check_module(m, "pinnsformer_wavelet_pseudosequence"))


@pytest.mark.parametrize("act,experts", [("gelu", 3), ("tanh", 2)])
def test_gnot_geometric_gating(act, experts):
    torch.manual_seed(10)
    m = U.GNOTGatedMoE(4, 5, 2, experts, act=act)
    assert_pass(check_module(m, "gnot_geometric_gating_moe", config={"act": act}))


@pytest.mark.parametrize("dim,heads,g,mesh,alpha", [(6, 2, 4, (3, 4), 0.3), (2, 1, 3, (2, 3), -0.5)])
def test_funcattn_structured_mesh(dim, heads, g, mesh, alpha):
    torch.manual_seed(11)
    m = U.FunctionalMapAttentionStructuredMesh2D(dim, heads, 0.0, g, *mesh, alpha_init=alpha)
    with torch.no_grad():  # one temperature inside the clamp, one above it
        m.temperature.copy_(torch.tensor([0.7, 6.0][:heads]).reshape(1, heads, 1, 1))
    assert_pass(check_module(m, "funcattn_functional_attention", config={"mesh_shape": mesh}))


@pytest.mark.parametrize("modes,sym,norm,hodge", [(("v", "e"), True, "layer_norm", "diag"),
                                                  (("v", "e", "f"), False, None, "full"),
                                                  (("f",), True, "layer_norm", "full")])
def test_hodgeformer_mesh_hodge_attention(modes, sym, norm, hodge):
    torch.manual_seed(12)
    m = U.MeshMultiHeadHodgeAttention(2, 6, 6, 6, attn_sym=sym, norm_type=norm or False, hodge_type=hodge, modes=modes)
    cfg = {"modes": modes, "norm_type": norm, "hodge_type": hodge}
    assert_pass(check_module(m, "hodgeformer_hodge_operators", config=cfg))


@pytest.mark.parametrize("ks,rc,mix,pad", [((2, 4), 0.4, True, "periodic"), ((3, 3), 0.62, False, "zeros")])
def test_local_no_kernels(ks, rc, mix, pad):
    from refattn.interop.torch_specs_ops_a import LOCAL_NO_GRID

    torch.manual_seed(13)
    g = LOCAL_NO_GRID
    m = U.LocalNOKernels(2, 2, (g, g), 2.0 / g, disco_kernel_shape=ks, radius_cutoff=rc, mix_derivatives=mix,
                         conv_padding_mode=pad)
    with torch.no_grad():
        m.local_conv.bias.normal_()
    cfg = {"disco_kernel_shape": ks, "radius_cutoff": rc, "fd_padding": pad}
    assert_pass(check_module(m, "local_differential_disco_kernels", config=cfg))


def _local_no_kernels():  # the basis-free columns of local_conv.weight zeroed: they do not come back
    m = U.LocalNOKernels(2, 2, (10, 10), 0.2, disco_kernel_shape=(3, 3), radius_cutoff=0.62)
    with torch.no_grad():
        m.local_conv.weight[..., 4:] = 0.0
    return m


# slug -> (module factory, config, Derived keys read and dropped)
_MODULES = {
    "gno_kernel_integral_layer": (lambda: U.GNOBlock(3, 3, 2, radius=0.4, channel_mlp_layers=[5],
                                                     pos_embedding_channels=2), {}, ()),
    "cno_convolutional_operator": (lambda: U.CNOBlock(2, 3, 8, 4, batch_norm=False), {},
                                   ("activation.up_filter", "activation.down_filter")),
    "ho_fno_higher_order_spectral_conv": (lambda: U.HOBlock(3, 2, 2, 3), {}, ()),
    "mgno_multigrid_operator": (lambda: U.MgNOLayer(((2, 1), (1, 1)), 3, 2, use_res=True), {},
                                ("conv.post_smooth_layer1.0.A.weight", "conv.post_smooth_layer1.0.S.weight")),
    "anie_attentional_integral_equation": (lambda: U.ModelBlocks(2, 4, 2, 2, 6, "galerkin"), {},
                                           ("blocks.0.attn.fc.weight", "blocks.0.attn.fc.bias",
                                            "blocks.1.attn.fc.weight", "blocks.1.attn.fc.bias")),
    "mamba_selective_scan_operator": (lambda: U.SS2D(4, d_state=3, K=4), {}, ()),
    "pde_transformer_channel_attention": (lambda: U.HATDiTChannelBranch(4, 2), {}, ()),
    "pinnsformer_wavelet_pseudosequence": (lambda: U.PINNsformer(1, 4, 5, 2, 2, d_ff=5), {}, ()),
    "gnot_geometric_gating_moe": (lambda: U.GNOTGatedMoE(4, 5, 2, 3), {}, ()),
    "funcattn_functional_attention": (lambda: U.FunctionalMapAttentionStructuredMesh2D(6, 2, 0.0, 4, 3, 4), {},
                                      ("I_d",)),
    "hodgeformer_hodge_operators": (lambda: U.MeshMultiHeadHodgeAttention(2, 4, 4, 4), {},
                                    ("v_acc.0.diffusion_time", "v_acc.1.diffusion_time", "e_acc.0.diffusion_time",
                                     "e_acc.1.diffusion_time")),
    "local_differential_disco_kernels": (_local_no_kernels, {"disco_kernel_shape": (3, 3)},
                                         ("differential.conv.weight",)),
    "multiwavelet_operator": (lambda: U.MWTCZ1d(k=3, alpha=3, c=2), {}, ("ec_s", "ec_d", "rc_e", "rc_o")),
}


def test_ops_a_specs_are_registered():
    from refattn.interop.torch_specs_ops_a import GROUP_SLUGS

    assert_registered(GROUP_SLUGS, _MODULES)


@pytest.mark.parametrize("slug", sorted(_MODULES))
def test_ops_a_map_state_dict_and_grads_back(slug):
    make, cfg, derived = _MODULES[slug]
    torch.manual_seed(4)
    assert_round_trip(slug, make().double(), cfg, derived)


@pytest.mark.parametrize("kind,red,emb", [("nonlinear", "mean", "nerf"), ("linear_kernelonly", "sum", None)])
def test_gno_block_real_module(kind, red, emb):
    """neuraloperator 2.0.0's own ``GNOBlock`` (an optional test dependency, ``refattn[upstream]``)."""
    gno = pytest.importorskip("neuralop.layers.gno_block")
    torch.manual_seed(1)
    m = gno.GNOBlock(3, 3, 2, radius=0.45, transform_type=kind, reduction=red, pos_embedding_type=emb,
                     pos_embedding_channels=2, channel_mlp_layers=[5], use_open3d_neighbor_search=False,
                     use_torch_scatter_reduce=False)
    cfg = {"transform_type": kind, "reduction": red, "pos_embedding": emb}
    # upstream draws its sinusoidal frequencies in float32 (torch.arange's default dtype): with an
    # embedding the agreement is float32's, without it float64's
    tol = {"rtol": 1e-6, "atol": 1e-7} if emb else {}
    assert_pass(check_module(m, "gno_kernel_integral_layer", config=cfg, **tol))
