"""refattn.interop.torch, group ``lin_b`` (``refattn/interop/torch_specs_lin_b.py``): ``check_module`` in
float64 against the PyTorch modules of ``tests/_upstream_lin_b.py`` (upstream file@commit in their
comments), and the state_dict round trip of every spec of the group."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import _upstream_lin_b as U  # noqa: E402
from _interop_checks import assert_pass, assert_registered, assert_round_trip  # noqa: E402

from refattn.interop.torch import (  # noqa: E402
    check_module,
    params_from_state_dict,
)


def _jitter(module, scale=0.3, seed=0):
    """Replace the upstream initialisation (zeros, identities) by random weights: every path matters."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            if p.is_floating_point():
                p.copy_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return module


@pytest.mark.parametrize("d_model,n_levels,n_heads,n_points", [(4, 2, 2, 2), (6, 3, 3, 1), (2, 1, 1, 3)])
def test_multiscale_deformable_attention(d_model, n_levels, n_heads, n_points):
    m = _jitter(U.MSDeformAttn(d_model, n_levels, n_heads, n_points), seed=n_levels)
    assert_pass(check_module(m, "multiscale_deformable_attention"))


@pytest.mark.parametrize("height,width,text_length,window_size,down_factor", [
    (4, 6, 3, 2.3, 2), (3, 6, 0, 1.5, 3), (4, 4, 2, 1.1, 4)])
def test_clear_local_downsample_attention(height, width, text_length, window_size, down_factor):
    m = U.LocalDownsampleAttention(height, width, text_length, window_size, down_factor)
    with torch.no_grad():
        m.spatial_weight.add_(0.2 * torch.randn(m.spatial_weight.shape, generator=torch.Generator().manual_seed(1)))
    assert_pass(check_module(m, "local_window_attention_variants"))


@pytest.mark.parametrize("order,kw", [(2, {}), (3, dict(shift=0.05, num_inner_mlps=1)),
                                      (2, dict(fast_decay_pct=0.5, modulate=False, bias=False))])
def test_hyena_operator(order, kw):
    torch.manual_seed(order)
    m = U.HyenaOperator(3, 16, order=order, filter_order=4, **kw)
    with torch.no_grad():
        m.filter_fn.pos_emb.z.add_(0.1 * torch.randn_like(m.filter_fn.pos_emb.z))
        m.filter_fn.implicit_filter[1].freq.mul_(1 + 0.3 * torch.rand_like(m.filter_fn.implicit_filter[1].freq))
    cfg = {"fast_decay_pct": 0.5} if "fast_decay_pct" in kw else {}
    assert_pass(check_module(m, "hyena_operator", config=cfg))


def _stable_poles(m, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        shape = m.poles.shape[:-1]
        ang, rad = 2.5 * torch.rand(shape, generator=g), 0.5 + 0.45 * torch.rand(shape, generator=g)
        m.poles.copy_(torch.stack([rad * ang.cos(), rad * ang.sin()], -1))
        m.D.copy_(torch.randn(m.D.shape, generator=g))
    return m


@pytest.mark.parametrize("hidden,heads,groups,split", [(4, 2, 1, True), (4, 1, 4, True), (6, 3, 1, False)])
def test_laughing_hyena_parallel_filter(hidden, heads, groups, split):
    torch.manual_seed(hidden + heads)
    m = _stable_poles(U.ParallelHyenaFilter(hidden, 3, heads, hyena_filter_groups=groups, column_split_hyena=split),
                      seed=groups)
    assert_pass(check_module(m, "laughing_hyena_modal_ssm"))


@pytest.mark.parametrize("d_model,size", [(6, 4), (3, 5), (4, 1)])
def test_superposition_stack_attention(d_model, size):
    torch.manual_seed(d_model)
    assert_pass(check_module(U.SuperpositionStackAttention(d_model, size), "stack_attention"))


def _seqcond_jitter(m, seed):
    """Off upstream's initialisation (unit scales, zero biases, tiny slopes), as in the parity script."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, t in m.named_parameters():
            r = torch.randn(t.shape, generator=g, dtype=t.dtype)
            if n in ("score_scale", "phase_scale"):
                t.copy_(1 + 0.3 * r)
            elif n in ("score_bias", "w_int_raw"):
                t.copy_(0.5 * r)
            elif n in ("decay_slopes", "anchor_slopes"):
                t.add_(2 + torch.rand(t.shape, generator=g, dtype=t.dtype))
            elif n == "gated_norm.weight":
                t.add_(0.2 * r)
    return m


@pytest.mark.parametrize("kw", [
    dict(num_heads=4, num_query_heads=2, num_anchor_heads=1, num_thetas=2, conv_kernel_size=3, out_expand_factor=2,
         maxlen=20),
    dict(num_heads=2, num_query_heads=1, num_thetas=1, conv_kernel_size=4, out_expand_factor=3),
    dict(num_heads=4, num_query_heads=4, num_anchor_heads=2, num_thetas=1, conv_kernel_size=2, out_expand_factor=1)])
def test_seqcond_attention(kw):
    torch.manual_seed(kw["num_heads"])
    m = _seqcond_jitter(U.SeqCondAttention(8, **kw), seed=kw["conv_kernel_size"])
    assert_pass(check_module(m, "seqcond_attention"))


@pytest.mark.parametrize("d_e,heads,head_dim,seq_len", [(5, 2, 4, 9), (4, 1, 2, 5), (3, 3, 2, 12)])
def test_adaptive_filter_attention(d_e, heads, head_dim, seq_len):
    torch.manual_seed(seq_len)
    m = U.MultiheadIsotropicAFA(d_e, heads, head_dim, seq_len)
    with torch.no_grad():
        for n, t in m.named_parameters():
            t.copy_(torch.randn_like(t) * (0.5 if n.startswith("W_") else 1.0))
        m.P_scale.copy_(torch.randn_like(m.P_scale))
    assert_pass(check_module(m, "adaptive_filter_attention"))
    sd = {k: v for k, v in m.state_dict().items() if k != "P_scale"}  # upstream's state_dict: no gate
    with pytest.raises(ValueError, match="register_buffer"):
        params_from_state_dict("adaptive_filter_attention", sd)


@pytest.mark.parametrize("hidden,heads,bias,conv", [(8, 2, False, 2), (6, 3, True, 2), (4, 1, True, 3)])
def test_two_mamba_attention(hidden, heads, bias, conv):
    # sm_norm divides by sum_s (q_t k_s)^2 e^{...}: a draw with q_0 . k_0 ~ 0 makes the first row ill-conditioned
    # (its gradients are noise over a tiny denominator in both implementations); seed 1 has none in these cases
    torch.manual_seed(1)
    m = U.TwoMambaAttention(hidden, heads, attention_bias=bias, in_conv_dim=conv, max_position_embeddings=24)
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(torch.randn_like(p) / max(1, p.shape[-1]) ** 0.5)
    assert_pass(check_module(m, "two_mamba_second_order_attention"))


@pytest.mark.parametrize("dim,heads", [(6, 2), (4, 1), (6, 3)])
def test_darts_gt_nas_attention(dim, heads):
    m = _jitter(U.NASAttention(dim, heads), scale=0.5, seed=dim + heads)
    assert_pass(check_module(m, "darts_gt_asymmetric_attention"))
    sd = dict(m.state_dict(), **{"ff_linear1.weight": torch.zeros(2 * dim, dim)})
    with pytest.raises(ValueError, match="feed-forward block"):
        params_from_state_dict("darts_gt_asymmetric_attention", sd)


@pytest.mark.parametrize("batch,kw", [(2, dict(kernel_type="none")), (2, dict(kernel_type="jackson", permutation_dim=2)),
                                      (1, dict(kernel_type="lanczos", max_order=3)),
                                      (3, dict(kernel_type="wang", enable_kpm=False))])
def test_converter_block(batch, kw):
    torch.manual_seed(batch)
    m = U.ConverterBlock(batch, 6, 10, **kw)
    with torch.no_grad():
        for p in m.parameters():
            p.add_(0.2 * torch.randn_like(p))
        m.alpha.fill_(0.4)
    assert_pass(check_module(m, "converter_digraph_convolution", config={"kernel_type": kw["kernel_type"]}))
# upstream separates batch elements by adding 10 S_x S_y to the sort keys: the grids below keep every key's span
# under that offset (on small grids with big windows upstream's y order interleaves batch elements)
@pytest.mark.parametrize("kw", [
    dict(in_channels=8, num_heads=2, group_size=3, window_shape=(3, 3, 1), sparse_shape=(5, 5, 1), axis="x"),
    dict(in_channels=6, num_heads=3, group_size=4, window_shape=(3, 3, 1), sparse_shape=(15, 15, 1), axis="y",
         shifted=True, activation="relu", normalize_pos=True),
    dict(in_channels=4, num_heads=1, group_size=5, window_shape=(3, 4, 1), sparse_shape=(20, 20, 1), axis="y",
         pos_temperature=100)])
def test_flatformer_basic_layer(kw):
    torch.manual_seed(kw["group_size"])
    m = _jitter(U.FlatFormerLayer(**kw), seed=kw["group_size"])
    with torch.no_grad():
        m.norm1.weight.add_(1.0), m.norm2.weight.add_(1.0)
    cfg = {k: kw[k] for k in ("window_shape", "sparse_shape", "axis", "activation") if k in kw}
    assert_pass(check_module(m, "flatformer_flattened_window_attention", config=cfg))


def _conda_stats(m, seed):
    """Batch-norm running statistics off their init (eval form reads them)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, nn.BatchNorm1d):
                mod.running_mean.copy_(0.3 * torch.randn(mod.running_mean.shape, generator=g))
                mod.running_var.copy_(0.5 + torch.rand(mod.running_var.shape, generator=g))
                mod.weight.add_(0.1 * torch.randn(mod.weight.shape, generator=g))
                mod.bias.add_(0.1 * torch.randn(mod.bias.shape, generator=g))
    return m


@pytest.mark.parametrize("dim,heads,window,quant,shift", [(12, 6, 2.0, 0.5, False), (6, 3, 2.0, 0.5, True),
                                                          (12, 3, 1.5, 0.5, True)])
def test_condaformer_window_attention(dim, heads, window, quant, shift):
    torch.manual_seed(dim + heads)
    m = _conda_stats(U.ConDaWindowAttention(dim, heads, window, quant, shift_win=shift), seed=heads)
    assert_pass(check_module(m, "condaformer_planar_window_attention",
                              config={"window_size": window, "quant_size": quant}))


def test_condaformer_1x1_weight_is_spconv_view_not_permute():
    """spconv's conv1x1 path multiplies by weight.view(in, out), not by the KRSC kernel's (out, in) slice transposed."""
    sd = U.ConDaWindowAttention(6, 3, 2.0, 0.5).state_dict()
    w = sd["conv_1.0.weight"].numpy()  # (out, 1, 1, 1, in) = (3, 1, 1, 1, 6)
    p = params_from_state_dict("condaformer_planar_window_attention", sd)
    np.testing.assert_array_equal(p["conv_1.0.weight"][:, :, 0, 0, 0], w.reshape(6, 3).T)
    assert not np.array_equal(p["conv_1.0.weight"][:, :, 0, 0, 0], w[:, 0, 0, 0, :])


# ---------------------------------------------------------------------------------------------- the group

_MODULES = {
    "multiscale_deformable_attention": (lambda: U.MSDeformAttn(4, 2, 2, 2), {}, ()),
    "local_window_attention_variants": (lambda: U.LocalDownsampleAttention(4, 6, 3, 2.3, 2), {}, ()),
    "laughing_hyena_modal_ssm": (lambda: U.ParallelHyenaFilter(4, 3, 2, hyena_filter_groups=1), {}, ()),
    "stack_attention": (lambda: U.SuperpositionStackAttention(4, 3), {}, ()),
    "seqcond_attention": (lambda: U.SeqCondAttention(8, 4, 2, 1, 2, 3, out_expand_factor=2), {}, ()),
    "adaptive_filter_attention": (lambda: U.MultiheadIsotropicAFA(5, 2, 4, 9), {}, ("causal_mask",)),
    "two_mamba_second_order_attention": (lambda: U.TwoMambaAttention(6, 3, attention_bias=True), {}, ("attn_mask",)),
    "darts_gt_asymmetric_attention": (lambda: U.NASAttention(6, 2), {},
                                      ("kv_model.0.eps", "kv_model.2.lin_edge.weight", "kv_model.2.att_edge")),
    "converter_digraph_convolution": (lambda: U.ConverterBlock(2, 6, 10), {}, ()),
    "flatformer_flattened_window_attention": (lambda: U.FlatFormerLayer(8, 2, group_size=3), {}, ()),
    "condaformer_planar_window_attention": (lambda: U.ConDaWindowAttention(6, 3, 2.0, 0.5), {},
                                            tuple(f"{k}.num_batches_tracked" for k in (
                                                "conv_1.1", "conv_3.1", "conv_3.4", "conv_1_post.1", "conv_3_post.1",
                                                "conv_3_post.4"))),
    "hyena_operator": (lambda: U.HyenaOperator(3, 8, order=3, filter_order=4), {},
                       ("filter_fn.pos_emb.t", "filter_fn.modulation.deltas")),
}


def test_lin_b_specs_are_registered():
    from refattn.interop.torch_specs_lin_b import GROUP_SLUGS

    assert_registered(GROUP_SLUGS, _MODULES)


@pytest.mark.parametrize("slug", sorted(_MODULES))
def test_lin_b_specs_map_state_dict_and_grads_back(slug):
    make, cfg, derived = _MODULES[slug]
    torch.manual_seed(4)
    assert_round_trip(slug, _jitter(make().double()), cfg, derived)
