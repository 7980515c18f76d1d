"""refattn.interop.torch rows of ``refattn/interop/torch_specs_soft_a.py``: check_module in float64 against
the upstream modules re-stated in ``tests/_upstream_soft_a.py`` (file@commit in their comments)."""

import pytest

torch = pytest.importorskip("torch")

import _upstream_soft_a as U  # noqa: E402
from _interop_checks import assert_pass, assert_registered, assert_round_trip  # noqa: E402

from refattn.interop.torch import check_module  # noqa: E402


def _jitter(m, scale=0.3):
    """Move zero-initialised parameters (biases, gates) off their init so that every gradient matters."""
    with torch.no_grad():
        for p in m.parameters():
            p.add_(scale * torch.randn_like(p))
    return m


@pytest.mark.parametrize("version,window,shift,heads,bias", [
    ("v1", 2, 0, 2, True), ("v1", 3, 1, 3, False), ("v2", 2, 1, 2, True), ("v2", 3, 0, 1, False)])
def test_swin_window_attention(version, window, shift, heads, bias):
    torch.manual_seed(1)
    cls = U.WindowAttention if version == "v1" else U.WindowAttentionV2
    m = _jitter(cls(6, (window, window), heads, qkv_bias=bias))
    assert_pass(check_module(m, "swin_window_attention", config={"window_size": window, "shift_size": shift}))
    if version == "v1":
        with pytest.raises(ValueError, match="relative_position_bias_table"):  # refattn's default window is 7
            check_module(m, "swin_window_attention", cases=["small"], seeds=[0])


@pytest.mark.parametrize("block,window,shift,heads", [("hab", 2, 0, 2), ("hab", 2, 1, 3), ("ocab", 2, 0, 2)])
def test_hat_hybrid_attention(block, window, shift, heads):
    torch.manual_seed(2)
    if block == "hab":
        m = U.HAB(6, (6, 6), heads, window_size=window, shift_size=shift, compress_ratio=3, squeeze_factor=3,
                  mlp_ratio=2.)
    else:
        m = U.OCAB(6, (6, 6), window, 1.0, heads)
    assert_pass(check_module(_jitter(m), "hat_hybrid_attention"))


@pytest.mark.parametrize("method,mode,rpe_on,shared,skip", [
    ("product", "contextual", "k", True, 1), ("euc", "bias", "qk", False, 0), ("cross", "contextual", "qkv", False, 1)])
def test_irpe_rpe_attention(method, mode, rpe_on, shared, skip):
    torch.manual_seed(3)
    conf = U.get_rpe_config(ratio=1.3, method=method, mode=mode, shared_head=shared, skip=skip, rpe_on=rpe_on)
    m = _jitter(U.RPEAttention(6, num_heads=2, qkv_bias=True, rpe_config=conf))
    cfg = {"method": method} if method in ("euc", "quant") else {}
    assert_pass(check_module(m, "irpe_image_relative_position", config=cfg))


@pytest.mark.parametrize("c,heads", [(6, 2), (4, 1)])
def test_relation_detr_position_bias(c, heads):
    torch.manual_seed(5)
    m = _jitter(U.RelationDecoderSelfAttention(c, heads), 0.1)
    assert_pass(check_module(m, "relation_detr_position_bias"))


@pytest.mark.parametrize("stage,heads,bias", [("both", 2, True), ("scale", 3, False), ("patch", 1, True)])
def test_duoformer_multiscale_attention(stage, heads, bias):
    torch.manual_seed(6)
    m = _jitter(U.MultiScaleAttention(6, heads, qkv_bias=bias))
    assert_pass(check_module(m, "duoformer_scale_wise_attention", config={"stage": stage}))


@pytest.mark.parametrize("dim,heads,bias", [(8, 2, False), (6, 3, True)])
def test_dependencyvit_reversed_attention(dim, heads, bias):
    torch.manual_seed(7)
    m = _jitter(U.ReversedAttention(dim, heads, qkv_bias=bias))
    assert_pass(check_module(m, "reversed_attention_dependencyvit"))


@pytest.mark.parametrize("hidden,heads,mem", [(6, 2, 3), (4, 1, 2)])
def test_adaptive_span_persistent_memory(hidden, heads, mem):
    torch.manual_seed(8)
    m = U.MultiHeadSeqAttention(hidden, heads, attn_span=4, pers_mem_size=mem)
    assert_pass(check_module(m, "persistent_memory_attention"))


@pytest.mark.parametrize("n_codes,codes_type,poly_type", [(4, "basic", "basic"), (3, "sqrt", "sqrt"),
                                                        (1, "basic", "sqrt")])
def test_parlai_poly_encoder(n_codes, codes_type, poly_type):
    torch.manual_seed(9)
    m = U.PolyEncoderModule(n_codes, 5, codes_type, poly_type)
    cfg = {"codes_attention_type": codes_type, "poly_attention_type": poly_type}
    assert_pass(check_module(m, "poly_encoder_attention", config=cfg))
    if codes_type == "sqrt":
        bad = check_module(m, "poly_encoder_attention", cases=["small"], seeds=[0])
        assert not bad.passed and "codes_attention_type" in str(bad)


@pytest.mark.parametrize("retriever,sym,causal,nkv,bias", [
    ("symbolic", False, False, None, True), ("positional", True, True, 1, False), ("relative", False, True, None, False)])
def test_abstract_transformer_dual_attention(retriever, sym, causal, nkv, bias):
    torch.manual_seed(10)
    ra = {"symmetric_rels": sym, "use_relative_positional_symbols": retriever == "relative", "add_bias_kv": bias,
          "add_bias_out": bias}
    if nkv:
        ra["n_kv_heads"] = nkv
    sr = {"symbolic": lambda: U.SymbolicAttention(8, 2, 3), "positional": lambda: U.PositionalSymbolRetriever(8, 20),
          "relative": lambda: U.PositionRelativeSymbolRetriever(8, 2)}[retriever]()
    m = U.DualAttentionWithRetriever(sr, 8, 2, 2, sa_kwargs={"add_bias_kv": bias}, ra_kwargs=ra)
    with torch.no_grad():
        for prm in m.parameters():
            prm.mul_(2.0)
    assert_pass(check_module(m, "relational_attention", config={"is_causal": causal}))


@pytest.mark.parametrize("kind,heads", [("relative_key_query", 2), ("relative_key", 3)])
def test_bert_relative_key_query(kind, heads):
    torch.manual_seed(11)
    m = U.BertSelfAttention(6, heads, 16, position_embedding_type=kind)
    assert_pass(check_module(m, "rpe_key_query_huang", config={"position_embedding_type": kind}))
    if kind == "relative_key":
        bad = check_module(m, "rpe_key_query_huang", cases=["small"], seeds=[0])
        assert not bad.passed and "position_embedding_type" in str(bad)


@pytest.mark.parametrize("channels,bn_mode", [(8, "train"), (8, "eval"), (4, "train")])
def test_pct_sa_layer(channels, bn_mode):
    torch.manual_seed(12)
    m = _jitter(U.SA_Layer(channels))
    cfg = {}
    if bn_mode == "eval":
        with torch.no_grad():
            m.after_norm.running_mean.normal_()
            m.after_norm.running_var.uniform_(0.5, 1.5)
        cfg = {"bn_mode": "eval", "running_mean": m.after_norm.running_mean.numpy().copy(),
               "running_var": m.after_norm.running_var.numpy().copy()}
    assert_pass(check_module(m, "pct_offset_attention", config=cfg))


@pytest.mark.parametrize("branch,window,heads,bias", [("sa", (2, 3), 2, True), ("ca", (2, 2), 2, True),
                                                     ("ca", (3, 2), 1, False)])
def test_reflexsplit_dual_stream_attention(branch, window, heads, bias):
    torch.manual_seed(13)
    m = _jitter(U.DifferentialDualStreamAttention(8, window, heads, qkv_bias=bias))
    assert_pass(check_module(m, "reflexsplit_dual_stream_attention", config={"branch": branch, "window_size": window}))


_MODULES = {
    "swin_window_attention": (lambda: U.WindowAttentionV2(6, (2, 2), 2), {},
                              ("relative_position_index", "relative_coords_table")),
    "irpe_image_relative_position": (
        lambda: U.RPEAttention(6, 2, True, rpe_config=U.get_rpe_config(method="cross", rpe_on="qkv", skip=1)), {}, ()),
    "relation_detr_position_bias": (lambda: U.RelationDecoderSelfAttention(6, 2), {}, ()),
    "duoformer_scale_wise_attention": (lambda: U.MultiScaleAttention(6, 2, qkv_bias=True), {}, ()),
    "reversed_attention_dependencyvit": (lambda: U.ReversedAttention(8, 2, qkv_bias=True), {}, ()),
    "persistent_memory_attention": (lambda: U.MultiHeadSeqAttention(6, 2, 4, 3), {}, ()),
    "poly_encoder_attention": (lambda: U.PolyEncoderModule(4, 5), {}, ()),
    "relational_attention": (lambda: U.DualAttentionWithRetriever(U.SymbolicAttention(8, 2, 3), 8, 2, 2, ra_kwargs={
        "add_bias_kv": True, "add_bias_out": True}), {}, ()),
    "rpe_key_query_huang": (lambda: U.BertSelfAttention(6, 2, 16), {}, ()),
    "pct_offset_attention": (lambda: U.SA_Layer(8), {},  # k_conv.weight: the alias of q_conv.weight
                             ("k_conv.weight", "after_norm.running_mean", "after_norm.running_var",
                              "after_norm.num_batches_tracked")),
    "reflexsplit_dual_stream_attention": (lambda: U.DifferentialDualStreamAttention(8, (2, 3), 2), {"branch": "ca"},
                                          ("relative_position_index", "sa_qkv.weight", "sa_qkv.bias", "lambda_sa",
                                           "sa_cross_trans_proj.weight", "sa_cross_refl_proj.weight",
                                           "sa_enhance_weight", "proj_sa.weight", "proj_sa.bias")),
    "hat_hybrid_attention": (lambda: U.HAB(6, (6, 6), 2, window_size=2, squeeze_factor=3), {}, ()),
}


def test_soft_a_specs_are_registered():
    from refattn.interop.torch_specs_soft_a import GROUP_SLUGS

    assert_registered(GROUP_SLUGS, _MODULES)


@pytest.mark.parametrize("slug", sorted(_MODULES))
def test_soft_a_specs_map_state_dict_and_grads_back(slug):
    make, cfg, derived = _MODULES[slug]
    torch.manual_seed(4)
    assert_round_trip(slug, make().double(), cfg, derived, derived_unread=False)
