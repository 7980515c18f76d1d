"""refattn.interop.torch rows of refattn/interop/torch_specs_lin_a.py against the PyTorch modules of
tests/_upstream_lin_a.py (each written from the upstream file@commit named in its comment), in float64."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import _upstream_lin_a as U  # noqa: E402
from _interop_checks import assert_pass, assert_registered, assert_round_trip  # noqa: E402

from refattn.interop.torch import check_module  # noqa: E402


@pytest.mark.parametrize("mask_flag,mix,factor,heads,d_keys", [(True, True, 1, 2, None), (False, False, 1, 3, None),
                                                               (True, False, 2, 2, 3)])
def test_informer_probsparse_attention(mask_flag, mix, factor, heads, d_keys):
    torch.manual_seed(1)
    m = U.AttentionLayer(U.ProbAttention(mask_flag, factor), 6, heads, d_keys=d_keys, mix=mix)
    assert_pass(check_module(m, "informer_probsparse_attention"))


@pytest.mark.parametrize("heads,bias,compressed,shared_kv", [(2, True, 4, 0), (3, False, 2, 1), (1, True, 8, 1)])
def test_linformer_multihead_linear_attention(heads, bias, compressed, shared_kv):
    torch.manual_seed(2)
    m = U.MultiheadLinearAttention(6, heads, bias=bias, compressed=compressed, max_seq_len=16,
                                   shared_kv_compressed=shared_kv)
    assert_pass(check_module(m, "linformer_low_rank_attention"))


def _ecoformer(dim, heads, qkv_bias, nbits, m):
    mod = U.EcoformerSelfAttention(dim, heads, qkv_bias=qkv_bias, nbits=nbits, m=m)
    ksh, dh = mod.fast_attention.ksh, dim // heads
    with torch.no_grad():  # fitted buffers as upstream's KSH leaves them: unit anchors, centred kernel means
        ksh.A.normal_(0.0, 2.0)
        ksh.anchor.copy_(torch.nn.functional.normalize(torch.randn(1, heads, m, dh), dim=-1))
        ksh.mvec.uniform_(0.2, 0.6)
    mod.fast_attention.is_trained = True
    return mod


@pytest.mark.parametrize("heads,qkv_bias,nbits,m", [(2, False, 4, 5), (3, True, 3, 4), (1, False, 6, 3)])
def test_ecoformer_self_attention(heads, qkv_bias, nbits, m):
    from refattn.interop.torch_specs_lin_a import ecoformer_ksh_config

    torch.manual_seed(3)
    mod = _ecoformer(6, heads, qkv_bias, nbits, m)
    assert_pass(check_module(mod, "ecoformer_hash_attention", config=ecoformer_ksh_config(mod.state_dict())))


def _hypformer(c, heads, kappa, power_k, concat):
    mod = U.TransConvLayer(U.Lorentz(kappa), c, c, heads, power_k=power_k, trans_heads_concat=concat)
    with torch.no_grad():  # off the init (norm_scale 1, zero biases) so that every parameter matters
        mod.norm_scale.fill_(0.8)
        for lin in list(mod.Wq) + list(mod.Wk) + list(mod.Wv):
            lin.linear.bias.normal_(0.2, 0.2)
    return mod


@pytest.mark.parametrize("heads,kappa,power_k,concat", [(2, 1.0, 2.0, False), (3, 0.7, 3.0, True), (1, 1.3, 2.0, True)])
def test_hypformer_trans_conv_layer(heads, kappa, power_k, concat):
    torch.manual_seed(4)
    mod = _hypformer(4, heads, kappa, power_k, concat)
    k = float(mod.manifold.k)  # geoopt keeps k in the default dtype (float32): 0.7 is 0.699999988...
    assert_pass(check_module(mod, "hypformer_lorentz_linear_attention", config={"curvature": k}))


@pytest.mark.parametrize("kw", [dict(num_heads=2, variant="pure_infsa", rho_init=0.8),
                                dict(num_heads=3, variant="linear_infsa", bias=False, batch_first=False),
                                dict(num_heads=2, variant="pure_infsa", rho_trainable=False, kdim=4, vdim=5)])
def test_infsa_attention(kw):
    torch.manual_seed(5)
    mod = U.InfSAAttention(6, **kw)
    with torch.no_grad():
        for lin in (mod.q_proj, mod.k_proj, mod.v_proj, mod.out_proj):
            if lin.bias is not None:
                lin.bias.normal_(0.0, 0.3)
    variant = kw["variant"].split("_")[0]
    assert_pass(check_module(mod, "linear_infsa_neumann", config={"variant": variant}))


def _dma(hkv, d, window, causal, bias=True, exp_bias=False):
    mod = U.DynamicMaskAttention(hkv, d, window, is_causal=causal, attention_bias=bias, exp_bias=exp_bias)
    with torch.no_grad():
        mod.A.normal_(0.0, 2.0)  # upstream initialises A = 0: no bias, no mask preference
    return mod


@pytest.mark.parametrize("hkv,d,window,causal,bias,exp_bias", [(2, 3, 3, True, True, False), (1, 4, 4, False, False, False),
                                                               (2, 2, 2, True, True, True)])
def test_dynamic_mask_attention(hkv, d, window, causal, bias, exp_bias):
    torch.manual_seed(6)
    mod = _dma(hkv, d, window, causal, bias, exp_bias)
    cfg = {"bias_form": "exp" if exp_bias else "linear"}
    assert_pass(check_module(mod, "dynamic_mask_attention", config=cfg))


def _drs(dim, heads, bias):
    mod = U.DRSAttention(dim, heads, bias)
    with torch.no_grad():  # off the init (temperature 1, every attn_i 0.2) so that each parameter matters
        mod.temperature.uniform_(0.5, 2.0)
        for i in range(1, 5):
            getattr(mod, f"attn{i}").uniform_(-1.0, 1.0)
    return mod


@pytest.mark.parametrize("dim,heads,bias", [(8, 2, False), (12, 3, True), (6, 1, False)])
def test_drsformer_tksa(dim, heads, bias):
    torch.manual_seed(7)
    assert_pass(check_module(_drs(dim, heads, bias), "drsformer_topk_channel_attention"))


def _fourier(dim, heads, head_dim, pct, mode):
    return U.FourierAttention({"transformer_dim": dim, "head_dim": head_dim, "num_head": heads, "attn_type": "dct",
                               "max_seq_len": 32, "attention_dropout": 0.0, "dct_percentage": pct, "pooling_mode": mode})


@pytest.mark.parametrize("heads,head_dim,pct,mode,residual", [(2, 3, 0.5, "CLS", True), (3, 2, 0.3, "MEAN", True),
                                                              (1, 4, 1.0, "MEAN", False)])
def test_fourier_transformer_dct_attention(heads, head_dim, pct, mode, residual):
    torch.manual_seed(8)
    cfg = {"pooling_mode": mode, "residual": residual}
    assert_pass(check_module(_fourier(6, heads, head_dim, pct, mode), "fourier_transformer_dct", config=cfg))


def _udit(dim, heads, attn_type, posemb, shortcut, bias=True, ker="dwconv5"):
    mod = U.DownSample_Attn(dim, 8, 2, heads, bias=bias, posemb_type=posemb, attn_type=attn_type, downsampler=ker,
                            down_shortcut=shortcut)
    if attn_type == "v2":
        with torch.no_grad():  # below the clamp at log(100), and per head
            mod.logit_scale.uniform_(1.0, 3.0)
    return mod


@pytest.mark.parametrize("heads,attn_type,posemb,shortcut,bias", [(2, "v2", "rope2d", True, True),
                                                                  (2, None, None, False, False),
                                                                  (1, None, "rope2d", True, True)])
def test_udit_downsample_attn(heads, attn_type, posemb, shortcut, bias):
    torch.manual_seed(9)
    mod = _udit(8, heads, attn_type, posemb, shortcut, bias, "dwconv5" if heads == 2 else "dwconv3")
    assert_pass(check_module(mod, "udit_downsampled_token_attention", config={"posemb": posemb}))


def _kl(feature, d, heads, m, smoothing=1.0):
    if feature == "gmm_rks":  # text/model.py 'mix-gauss-fourier': n_dims = 4M + 1 (M frequencies, the smoothing column)
        fm = U.SmoothedGaussianMixtureFourierFeatures(d, heads, n_dims=4 * m + 1, smoothing=smoothing)
    else:  # 'mix-gauss-positive'
        fm = U.GaussianMixturePositive(d, heads, n_dims=m)
    with torch.no_grad():
        fm.sigma.mul_(0.5)
    return U.LinearAttention(d, fm)


@pytest.mark.parametrize("feature,d,heads,m,smoothing", [("gmm_rks", 4, 2, 3, 1.0), ("gmm_rks", 3, 1, 5, 0.36),
                                                         ("gmm_prf", 4, 3, 6, None)])
def test_kl_transformer_gmm_linear_attention(feature, d, heads, m, smoothing):
    torch.manual_seed(10)
    mod = _kl(feature, d, heads, m, smoothing)
    omega = np.random.default_rng(3).standard_normal(tuple(mod.feature_map.omega.shape))
    cfg = {"feature": feature, "omega": omega}
    assert_pass(check_module(mod, "kl_transformer_learned_spectral_kernel", config=cfg))


@pytest.mark.parametrize("head_dim,rp_dim,feat", [(4, 6, "orf"), (3, 8, "gaus"), (5, 5, "orf")])
def test_spectraformer_performer_posrf(head_dim, rp_dim, feat):
    torch.manual_seed(11)
    mod = U.PerformerAttention({"head_dim": head_dim, "rp_dim": rp_dim, "kernel_type": "posrf", "feat": feat})
    cfg = {"projection": mod.attn_fn.projection_matrix.double().numpy()}
    assert_pass(check_module(mod, "spectraformer_random_features", config=cfg))


def _vcc(hidden, heads, inter, r, block, nf, scale_correction):
    from types import SimpleNamespace

    cfg = SimpleNamespace(hidden_size=hidden, num_attention_heads=heads, intermediate_size=inter, layer_norm_eps=1e-5,
                          scale_correction=scale_correction, num_important_tokens=r, block_size=block,
                          num_fine_blocks=nf)
    mod = U.VccEncoderLayer(cfg)
    mod.formatter = U.Formatter(cfg)
    with torch.no_grad():  # LayerNorm affine parameters off (1, 0)
        for ln in (mod.attention.LayerNorm, mod.FFN[0]):
            ln.weight.uniform_(0.5, 1.5)
            ln.bias.normal_(0.0, 0.2)
    return mod


@pytest.mark.parametrize("hidden,heads,inter,r,block,nf,scale_correction", [(8, 2, 12, 3, 3, 2, True),
                                                                            (6, 3, 5, 2, 2, 1, False),
                                                                            (4, 1, 8, 4, 2, 3, True)])
def test_vcc_encoder_layer(hidden, heads, inter, r, block, nf, scale_correction):
    torch.manual_seed(12)
    assert_pass(check_module(_vcc(hidden, heads, inter, r, block, nf, scale_correction), "vcc_vip_token_compression"))


_MODULES = {
    "informer_probsparse_attention": (lambda: U.AttentionLayer(U.ProbAttention(True, 1), 6, 2, mix=True), {}, ()),
    "linformer_low_rank_attention": (lambda: U.MultiheadLinearAttention(6, 2, compressed=4, max_seq_len=16), {}, ()),
    "ecoformer_hash_attention": (lambda: _ecoformer(6, 2, True, 4, 5), {},
                                 ("fast_attention.projection_matrix", "fast_attention.ksh.A", "fast_attention.ksh.anchor",
                                  "fast_attention.ksh.mvec")),
    "hypformer_lorentz_linear_attention": (lambda: _hypformer(4, 2, 0.7, 2.0, True), {},
                                           ("manifold.k", "scale", "bias", "Wq.0.manifold.k", "Wq.1.manifold.k",
                                            "Wk.0.manifold.k", "Wk.1.manifold.k", "Wv.0.manifold.k", "Wv.1.manifold.k")),
    "linear_infsa_neumann": (lambda: U.InfSAAttention(6, 2, rho_init=0.8), {}, ()),
    "dynamic_mask_attention": (lambda: _dma(2, 3, 3, True), {}, ()),
    "drsformer_topk_channel_attention": (lambda: _drs(8, 2, True), {}, ()),
    "fourier_transformer_dct": (lambda: _fourier(6, 2, 3, 0.5, "CLS"), {}, ()),
    "udit_downsampled_token_attention": (lambda: _udit(8, 2, "v2", "rope2d", True), {}, ()),
    "kl_transformer_learned_spectral_kernel": (lambda: _kl("gmm_rks", 4, 2, 3), {}, ("feature_map.omega",
                                                                                       "feature_map._calls")),
    "spectraformer_random_features": (lambda: U.PerformerAttention({"head_dim": 4, "rp_dim": 6, "kernel_type": "posrf",
                                                                     "feat": "orf"}), {}, ("attn_fn.projection_matrix",)),
    "vcc_vip_token_compression": (lambda: _vcc(8, 2, 12, 3, 3, 2, True), {}, ()),
}


def test_lin_a_specs_are_registered():
    from refattn.interop.torch_specs_lin_a import GROUP_SLUGS

    assert_registered(GROUP_SLUGS, _MODULES)


@pytest.mark.parametrize("slug", sorted(_MODULES))
def test_lin_a_specs_map_state_dict_and_grads_back(slug):
    make, cfg, derived = _MODULES[slug]
    torch.manual_seed(4)
    assert_round_trip(slug, make().double(), cfg, derived)
