r"""Rows of the :mod:`refattn.interop.torch` table for the linear / sparse attention group "lin_a".

Each :class:`~refattn.interop.torch_specs.Spec` here maps a mechanism whose registry record's
forward is the upstream module's forward and whose params carry the upstream names; it is
registered with :func:`~refattn.interop.torch_specs.add_specs` into the same
:data:`~refattn.interop.torch_specs.SPECS` that :mod:`refattn.interop.torch` reads (that module
imports this one). Mechanisms of the group without a table are listed with
:func:`~refattn.interop.unmapped.add_unmapped`. The reference modules the tests run are in
``tests/_upstream_lin_a.py``.
"""

from __future__ import annotations

import numpy as np

from .torch_specs import Derived, Named, Reshape, Spec, add_specs, call_x, x_build

__all__ = ["GROUP_SLUGS", "ecoformer_ksh_config"]


# ---- Informer AttentionLayer(ProbAttention): forward(queries, keys, values, attn_mask); upstream draws
# the key sample with torch.randint(L_K, (L_Q, U)), which the call replaces by the builder's draw


def _informer_build(rng, p, cfg, z):
    from ..attention.linear.informer_probsparse import probsparse_sizes

    c = p["query_projection.weight"].shape[0]
    n = max(z["n"], 2)  # upstream samples c*ceil(ln 1) = 0 keys for one token and fails: two tokens at least
    big_u, _ = probsparse_sizes(n, n, int(cfg.get("factor", 5)))
    inp = {k: rng.standard_normal((z["b"], n, c)) for k in ("queries", "keys", "values")}
    return inp, {"index_sample": rng.integers(0, n, (n, big_u))}


def _informer_call(module, inp, cfg):
    import torch

    idx = torch.as_tensor(np.asarray(cfg["index_sample"]))
    randint = torch.randint
    torch.randint = lambda *a, **k: idx  # ProbAttention._prob_QK's sample: the one refattn is given
    try:
        return module(inp["queries"], inp["keys"], inp["values"], None)[0]
    finally:
        torch.randint = randint


# ---- fairseq Linformer MultiheadLinearAttention(self_attention=True): forward(query, key, value) time-major
# (T, B, C); compress_k / compress_v are nn.Linear(max_seq_len, k): refattn's (max_seq_len, k) is weight.T


def _linformer_infer(keys):
    return {"sharing": "headwise" if "compress_v.weight" in keys else "key_value"}


def _linformer_call(module, inp, cfg):
    x = inp["x"].transpose(0, 1)
    return module(x, x, x, need_weights=False)[0].transpose(0, 1)


# ---- EcoFormer EcoformerSelfAttention: forward(x); the KSH buffers (fast_attention.ksh.A, .anchor, .mvec), fitted
# once by upstream outside backpropagation, are refattn's config A, anchor, mvec: ecoformer_ksh_config reads them


def ecoformer_ksh_config(state_dict, prefix: str = "") -> dict:
    """refattn's ``A (H, b, m)``, ``anchor (H, m, d_h)``, ``mvec (H, m)`` config of ``ecoformer_hash_attention``
    from an upstream ``EcoformerSelfAttention`` state_dict (``fast_attention.ksh.A (H, b, m)``, ``.anchor
    (1, H, m, d_h)``, ``.mvec (1, H, 1, m)``), for ``params_from_state_dict`` / ``check_module``'s config."""
    from ..testing.compare import to_numpy

    ksh = prefix + "fast_attention.ksh."
    a, anchor, mvec = (np.array(to_numpy(state_dict[ksh + k])) for k in ("A", "anchor", "mvec"))
    return {"A": a, "anchor": anchor.reshape(anchor.shape[-3:]), "mvec": mvec.reshape(mvec.shape[1], -1)}


# ---- Hypformer TransConvLayer (attention_type "linear_focused"): forward(query_input, source_input) on one graph's
# nodes (N, 1 + C), no batch axis: the call runs it per batch element. The geoopt manifold's curvature k (a frozen
# parameter under manifold.k and every HypLinear's manifold.k) is refattn's config curvature; scale and bias are
# parameters of the full-attention branch only, unused by the linear focused attention: both are read and dropped


def _hypformer_build(rng, p, cfg, z):
    from ..attention.linear.hypformer import lorentz_lift

    c = p["Wq.0.linear.weight"].shape[0] - 1
    return {"x": lorentz_lift(rng.standard_normal((z["b"], z["n"], c)), float(cfg.get("curvature", 1.0)))}, {}


def _hypformer_call(module, inp, cfg):
    import torch

    x = inp["x"]
    return torch.stack([module(x[i], x[i]) for i in range(x.shape[0])])


# ---- InfSA InfSAAttention: forward(query, key, value) -> (output, weights); rho = sigmoid(rho_logit).item() (no
# gradient: refattn's rho_grad="detached"); its variant "pure_infsa" / "linear_infsa" is refattn's "pure" / "linear"


def _infsa_build(rng, p, cfg, z):
    e = p["q_proj.weight"].shape[0]
    m = z["m"] if cfg.get("variant", "pure") == "pure" else z["n"]  # upstream's linear variant needs S = N
    return {"query": rng.standard_normal((z["b"], z["n"], e)),
            "key": rng.standard_normal((z["b"], m, p["k_proj.weight"].shape[0])),
            "value": rng.standard_normal((z["b"], m, p["v_proj.weight"].shape[0]))}, {}


def _infsa_call(module, inp, cfg):
    want = f"{cfg.get('variant', 'pure')}_infsa"
    if getattr(module, "variant", want) != want:
        raise ValueError(f"linear_infsa_neumann: the module's variant is {module.variant!r}: pass "
                         f"config variant={module.variant.split('_')[0]!r}")
    q, k, v = inp["query"], inp["key"], inp["value"]
    if not getattr(module, "batch_first", True):
        q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)
    out = module(q, k, v)[0]
    return out if getattr(module, "batch_first", True) else out.transpose(0, 1)


# ---- DMA: the dynamic-mask core of DogeAttention (A, dt_proj) on projected q, k, v: forward(q, k, v) -> (B, N, H, d)


def _dma_build(rng, p, cfg, z):
    hkv = p["A"].shape[0]
    d = p["dt_proj.weight"].shape[0] // hkv
    n = z["n"]
    return {"q": rng.standard_normal((z["b"], 2 * hkv, n, d)), "k": rng.standard_normal((z["b"], hkv, n, d)),
            "v": rng.standard_normal((z["b"], hkv, n, d))}, {}


def _dma_call(module, inp, cfg):
    return module(inp["q"], inp["k"], inp["v"]).transpose(1, 2)


# ---- DRSformer Attention (TKSA): forward(x (B, C, H, W)); conv kernels keep torch's layout


def _drs_build(rng, p, cfg, z):
    return {"x": rng.standard_normal((z["b"], p["qkv.weight"].shape[1], z["n"], 2))}, {}


# ---- Fourier Transformer Attention (attn_type "dct"): forward(X, mask) -> (shortX, out); model.py's Transformer adds
# them (refattn's residual=True); its config["pooling_mode"] is refattn's pooling_mode


def _ft_build(rng, p, cfg, z):
    n = max(z["n"], 2) if cfg.get("pooling_mode", "CLS") == "CLS" else z["n"]  # CLS needs one token besides it
    return {"x": rng.standard_normal((z["b"], n, p["W_q.weight"].shape[0]))}, {}


def _ft_call(module, inp, cfg):
    mode = getattr(module, "config", {}).get("pooling_mode", cfg.get("pooling_mode", "CLS"))
    if (mode == "CLS") != (cfg.get("pooling_mode", "CLS") == "CLS"):
        raise ValueError(f"fourier_transformer_dct: the module's pooling_mode is {mode!r}: pass it in config")
    short, out = module(inp["x"], None)
    return out + short if cfg.get("residual", True) else out


# ---- U-DiT DownSample_Attn: forward(x (B, C, H, W)); attn_type None / "v2" (the keys show which), posemb_type None /
# "rope2d" (refattn's posemb, checked against the module's); the 2-D RoPE table is recomputed, not a buffer


def _udit_infer(keys):
    return {"attn_type": "v2" if "logit_scale" in keys else "v1"}


def _udit_build(rng, p, cfg, z):
    f = int(cfg.get("down_factor", 2))
    return {"x": rng.standard_normal((z["b"], p["to_out.weight"].shape[0], 2 * f, f * (1 + z["n"] % 3)))}, {}


def _udit_call(module, inp, cfg):
    mine = getattr(module, "posemb_type", cfg.get("posemb", "rope2d"))
    if mine != cfg.get("posemb", "rope2d"):
        raise ValueError(f"udit_downsampled_token_attention: the module's posemb_type is {mine!r}: pass config "
                         f"posemb={mine!r}")
    return module(inp["x"])


# ---- KL-Transformer: fast-transformers LinearAttention(feature_map=GMM features) of cs1160701/OnLearningTheKernel:
# forward(queries, keys, values, ...) in (N, L, H, D); it redraws the noise omega on every call (new_feature_map):
# the call pins it to config omega (the feature map's buffer shape), as refattn takes it


def _kl_build(rng, p, cfg, z):
    if cfg.get("omega") is None:
        raise ValueError("kl_transformer_learned_spectral_kernel: pass config omega (the feature map's noise, of the "
                         "shape of its omega buffer): upstream redraws it on every call")
    h, d = p["feature_map.mean"].shape
    return {k: rng.standard_normal((z["b"], h, z["m"] if k != "q" else z["n"], d)) for k in ("q", "k", "v")}, {}


def _kl_call(module, inp, cfg):
    import torch

    fm = module.feature_map
    positive = "Positive" in type(fm).__name__
    if positive != cfg.get("feature", "gmm_rks").endswith("_prf"):
        raise ValueError(f"kl_transformer_learned_spectral_kernel: the feature map is {type(fm).__name__}: pass "
                         f"config feature={'gmm_prf' if positive else 'gmm_rks'!r}")
    q, k, v = (inp[n].transpose(1, 2) for n in ("q", "k", "v"))
    fm.omega = torch.as_tensor(np.asarray(cfg["omega"]), dtype=q.dtype)
    fm.new_feature_map = lambda *a, **kw: None  # keep the pinned noise
    try:
        return module(q, k, v).transpose(1, 2)
    finally:
        del fm.new_feature_map


# ---- Spectraformer PerformerAttention (kernel_type "posrf", a fixed weight matrix): forward(Q, K, V, mask) in
# (B, H, N, d). The weight matrix is a buffer, refattn's config projection; upstream's posrf has no trainable weight
# (its gerf / saderf A is an unregistered nn.Parameter, absent from the state_dict, and its learnable FastFood map
# appends a smoothing column refattn's fastfood weights do not have), so the table maps the state_dict to {}


def _spectra_build(rng, p, cfg, z):
    w = cfg.get("projection")
    if w is None:
        raise ValueError("spectraformer_random_features: pass config projection (the module's "
                         "attn_fn.projection_matrix buffer)")
    d, h = np.shape(w)[1], 2
    return {"q": rng.standard_normal((z["b"], h, z["n"], d)), "k": rng.standard_normal((z["b"], h, z["n"], d)),
            "v": rng.standard_normal((z["b"], h, z["n"], d))}, {}


def _spectra_call(module, inp, cfg):
    import torch

    kind = getattr(module, "kernel_type", "posrf")
    if kind != cfg.get("component", "posrf"):
        raise ValueError(f"spectraformer_random_features: the module's kernel_type is {kind!r}: pass config "
                         f"component={kind!r}")
    q = inp["q"]
    return module(q, inp["k"], inp["v"], torch.ones(q.shape[0], inp["k"].shape[2], dtype=q.dtype))


# ---- VCC VccEncoderLayer between Formatter.to_vcc_input and .from_vcc_input (as VccEncoder runs a lone VCC layer):
# the module is the VccEncoderLayer with the Formatter of its config as attribute formatter (it has no weights);
# the VIP tokens are refattn's config importance_mask, drawn by the builder unless the config gives one. The Selector gets
# its attention as a lambda closing over the layer, which copy.deepcopy (check_module runs a copy) does not rebind:
# the call binds the same lambda to the layer it runs


def _vcc_build(rng, p, cfg, z):
    imp = cfg.get("importance_mask")
    if imp is None:  # drawn per case (the default None is this placeholder): VIP tokens at random
        r, bs, nf = (int(cfg.get(k, 1)) for k in ("num_important_tokens", "block_size", "num_fine_blocks"))
        n = r + bs * (nf + 1 + z["n"] % 3)  # upstream needs N - r a multiple of block_size, num_fine_blocks <= blocks
        imp = rng.random((z["b"], n)) < 0.3
    b, n = np.shape(imp)
    return {"x": rng.standard_normal((b, n, p["attention.query.weight"].shape[0]))}, {"importance_mask": imp}


def _vcc_call(module, inp, cfg):
    import torch

    x = inp["x"]
    fmt = getattr(module, "formatter", None)
    if fmt is None:
        raise ValueError("vcc_vip_token_compression: set the layer's attribute formatter to the Formatter of its "
                         "config (upstream VccEncoder.formatter), which check_module runs around it")
    att = module.attention  # VccEncoderLayer.__init__'s selector attention, on this (copied) layer's weights
    module.selector.attention = lambda q, k, kmask: att.compute_attention_matrix(att.LayerNorm(q), att.LayerNorm(k), kmask)
    b, n, _ = x.shape
    mixed = {"hidden_states": x, "mask": torch.ones(b, n, dtype=x.dtype),
             "importance_mask": torch.as_tensor(np.asarray(cfg["importance_mask"]), dtype=x.dtype),
             "positions": torch.arange(n)[None].repeat(b, 1)}
    return fmt.from_vcc_input(module(fmt.to_vcc_input(mixed)))["hidden_states"]


_SPECS = [
    Spec("informer_probsparse_attention",
         "zhouhaoyi/Informer2020 models/attn.py@29f2a73 (AttentionLayer(ProbAttention); forward(queries, keys, "
         "values, None); torch.randint's key sample replaced by the drawn index_sample; utils/masking.py ProbMask)",
         rules=[Named(r"(query|key|value|out)_projection\.weight", True),
                Named(r"(query|key|value|out)_projection\.bias", False)],
         required=("query_projection.weight", "key_projection.weight", "value_projection.weight",
                   "out_projection.weight"),
         call=_informer_call, build=_informer_build,
         attrs={"n_heads": "n_heads", "mix": "mix", "factor": "inner_attention.factor",
                "mask_flag": "inner_attention.mask_flag", "scale": "inner_attention.scale"}),
    Spec("linformer_low_rank_attention",
         "facebookresearch/fairseq examples/linformer/linformer_src/modules/multihead_linear_attention.py@3d262bb "
         "(MultiheadLinearAttention, self_attention=True; forward(x, x, x) time-major; shared_kv_compressed 0 "
         "('headwise') or 1 ('key_value'), read from the keys)",
         rules=[Named(r"(q|k|v|out)_proj\.weight|compress_[kv]\.weight", True), Named(r"(q|k|v|out)_proj\.bias", False)],
         required=("q_proj.weight", "k_proj.weight", "v_proj.weight", "out_proj.weight", "compress_k.weight"),
         unsupported={"bias_k": "add_bias_kv is not implemented", "bias_v": "add_bias_kv is not implemented"},
         call=_linformer_call, build=x_build("q_proj.weight"), infer=_linformer_infer,
         attrs={"num_heads": "num_heads"}),
    Spec("ecoformer_hash_attention",
         "ziplab/EcoFormer pvt/performer.py@a277f9e (EcoformerSelfAttention with is_trained=True, forward(x); "
         "pvt/hashing/ksh.py KernelSH, pvt/hashing/utils.py BinaryQuantizer (STE); the KSH buffers are config: "
         "ecoformer_ksh_config(state_dict); the unused ORF projection_matrix is read and dropped)",
         rules=[Named(r"(to_qk|to_v|proj)\.weight", True), Named(r"(to_qk|to_v|proj)\.bias", False),
                Derived(r"fast_attention\.(projection_matrix|ksh\.(A|anchor|mvec))")],
         required=("to_qk.weight", "to_v.weight", "proj.weight"), call=call_x, build=x_build("to_qk.weight"),
         attrs={"num_heads": "num_heads"}, defaults={"hash_grad": "ste", "numerator_bias": "self"}),
    Spec("hypformer_lorentz_linear_attention",
         "Graph-and-Geometric-Learning/hyperbolic-transformer large/hypformer.py@768fcec (TransConvLayer, "
         "attention_type='linear_focused', use_weight=True; forward(x, x) per batch element; Hypformer/manifolds/"
         "layer.py HypLinear; the manifold's k is config curvature, read and dropped like the full-attention-only "
         "scale and bias)",
         rules=[Named(r"(W[qkv]\.\d+\.linear|v_map_mlp|final_linear)\.weight", True),
                Named(r"(W[qkv]\.\d+\.linear|v_map_mlp|final_linear)\.bias", False),
                Reshape("norm_scale", lambda n: ()), Derived(r"(W[qkv]\.\d+\.)?manifold\.k|scale|bias")],
         required=("Wq.0.linear.weight", "Wk.0.linear.weight", "Wv.0.linear.weight", "norm_scale", "v_map_mlp.weight"),
         call=_hypformer_call, build=_hypformer_build,
         attrs={"num_heads": "num_heads", "power_k": "power_k", "heads_concat": "trans_heads_concat"}),
    Spec("linear_infsa_neumann",
         "giorgioroffo/infinite-self-attention infsa/attention.py@4a37fc0 (InfSAAttention, forward(query, key, "
         "value)[0]; infsa/core.py infsa_attention; config variant 'pure' / 'linear' for 'pure_infsa' / "
         "'linear_infsa'; rho detached by .item(), as rho_grad='detached')",
         rules=[Named(r"(q|k|v|out)_proj\.weight", True), Named(r"(q|k|v|out)_proj\.bias", False),
                Reshape("rho_logit", lambda n: ())],
         required=("q_proj.weight", "k_proj.weight", "v_proj.weight", "out_proj.weight", "rho_logit"),
         call=_infsa_call, build=_infsa_build, attrs={"num_heads": "num_heads"}, defaults={"rho_grad": "detached"}),
    Spec("dynamic_mask_attention",
         "SmallDoges/flash-dmattn benchmarks/forward_equivalence.py@f024c28 (dynamic_mask_attention_python with "
         "flash_sparse_attn/utils/mask.py create_mask) on the bias of DogeAttention's A and dt_proj (huggingface/"
         "transformers models/doge/modeling_doge.py@00ca1ab: the exp form); a module forward(q, k, v) with "
         "DogeAttention's parameter names: map a DogeAttention with its prefix, the projections around it apart)",
         rules=[Named(r"dt_proj\.weight", True), Named(r"dt_proj\.bias|A", False)],
         required=("A", "dt_proj.weight"), call=_dma_call, build=_dma_build,
         attrs={"window_size": "keep_window_size", "is_causal": "is_causal"}),
    Spec("drsformer_topk_channel_attention",
         "cschenxiang/DRSformer basicsr/models/archs/DRSformer_arch.py@e77bbb4 (Attention, forward(x); its four "
         "top-k masks are ratios 1/2, 2/3, 3/4, 4/5, refattn's default)",
         rules=[Named(r"temperature|qkv\.(weight|bias)|qkv_dwconv\.(weight|bias)|project_out\.(weight|bias)"
                      r"|attn[1-4]", False)],
         required=("temperature", "qkv.weight", "qkv_dwconv.weight", "project_out.weight", "attn1", "attn2", "attn3",
                   "attn4"),
         call=call_x, build=_drs_build, attrs={"num_heads": "num_heads"}),
    Spec("fourier_transformer_dct",
         "LUMIA-Group/FourierTransformer LRA/code/attention.py@cba1dc2 (Attention with attn_type 'dct', "
         "forward(X, None) -> (shortX, out), summed as model.py's Transformer does for residual=True; "
         "attention_dct.py DCTAttention, dct, idct; config pooling_mode as the module's config['pooling_mode'])",
         rules=[Named(r"(W_q|W_k|W_v|ff)\.weight", True), Named(r"(W_q|W_k|W_v|ff)\.bias", False)],
         required=("W_q.weight", "W_k.weight", "W_v.weight", "ff.weight"), call=_ft_call, build=_ft_build,
         attrs={"num_heads": "num_head", "dct_percentage": "attn.dct_percentage"}),
    Spec("udit_downsampled_token_attention",
         "YuchuanTian/U-DiT udit_models.py@7fcce5e (DownSample_Attn with DownSampler, forward(x); attn_type None is "
         "'v1', read from the keys; config posemb as the module's posemb_type; precompute_freqs_cis_2d, "
         "apply_rotary_emb)",
         rules=[Named(r"to_qkv\.weight", True),
                Named(r"to_qkv\.bias|to_out\.(weight|bias)|downsampler\.layer\.(weight|bias)|logit_scale", False)],
         required=("to_qkv.weight", "to_out.weight", "downsampler.layer.weight"), call=_udit_call, build=_udit_build,
         infer=_udit_infer, attrs={"num_heads": "heads", "down_factor": "dh", "down_shortcut": "downsampler.down_shortcut"}),
    Spec("kl_transformer_learned_spectral_kernel",
         "cs1160701/OnLearningTheKernel fast_transformers/attention/linear_attention.py@a8e3d3b (LinearAttention, "
         "forward(q, k, v) in (N, L, H, D), all-ones masks) with fast_transformers/feature_maps/fourier_features.py "
         "SmoothedGaussianMixtureFourierFeatures (feature 'gmm_rks') or GaussianMixturePositive ('gmm_prf'); the "
         "noise omega is config (pinned in the call), its buffer and the _calls counter are read and dropped",
         rules=[Named(r"feature_map\.(mean|sigma)", False), Derived(r"feature_map\.(omega|_calls)")],
         required=("feature_map.mean", "feature_map.sigma"), call=_kl_call, build=_kl_build,
         attrs={"eps": "eps", "smoothing": "feature_map.smoothing", "softmax_temp": "feature_map.softmax_temp"}),
    Spec("spectraformer_random_features",
         "cruiseresearchgroup/spectraformer src/models/attention_performer.py@ff37d34 (PerformerAttention, "
         "forward(Q, K, V, mask) with an all-ones mask; FastAttention with kernel_type 'posrf' and a fixed "
         "weight matrix (feat 'gaus', 'orf', ...); component_functions.py get_rfs_torch: refattn's "
         "key_stabilizer='row', feature_eps=1e-4, kernel='gaussian'; the projection_matrix buffer is config "
         "projection, read and dropped: the state_dict maps to {})",
         rules=[Derived(r"attn_fn\.projection_matrix")], required=("attn_fn.projection_matrix",),
         call=_spectra_call, build=_spectra_build,
         defaults={"component": "posrf", "kernel": "gaussian", "key_stabilizer": "row", "feature_eps": 1e-4,
                   "normalize_data": True, "causal": False}),
    Spec("vcc_vip_token_compression",
         "mlpen/VCC src/roberta/models/vcc.py@356f806 (VccEncoderLayer, attention_based_selector, coarser_type "
         "'mean', run as Formatter.from_vcc_input(layer(Formatter.to_vcc_input(...))) with the Formatter as the "
         "layer's attribute formatter; mra_projection/{formatter,coarser,finer,selector}.py; the straight-through "
         "block scores are refattn's score_gradient='straight_through')",
         rules=[Named(r"attention\.(query|key|value|dense)\.weight|FFN\.[13]\.weight", True),
                Named(r"attention\.(query|key|value|dense)\.bias|FFN\.[13]\.bias|attention\.LayerNorm\.(weight|bias)"
                      r"|FFN\.0\.(weight|bias)", False)],
         required=("attention.query.weight", "attention.key.weight", "attention.value.weight", "attention.dense.weight",
                   "FFN.1.weight", "FFN.3.weight"),
         call=_vcc_call, build=_vcc_build, defaults={"score_gradient": "straight_through", "importance_mask": None},
         attrs={"num_heads": "attention.num_attention_heads", "scale_correction": "attention.scale_correction",
                "layer_norm_eps": "attention.LayerNorm.eps", "num_important_tokens": "formatter.num_important_tokens",
                "block_size": "formatter.block_size", "num_fine_blocks": "selector.num_fine_blocks"}),
]

add_specs(*_SPECS)

GROUP_SLUGS = tuple(s.key for s in _SPECS)
"""The keys this module adds to :data:`~refattn.interop.torch_specs.SPECS`."""
