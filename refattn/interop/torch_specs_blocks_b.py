r"""Rows of the :mod:`refattn.interop.torch` table for blocks around attention (group ``blocks_b``):
patch embeddings, token mixers, merging and sampling layers, dense residual schemes, dynamic-width
and dynamic-depth blocks.

Each :class:`~refattn.interop.torch_specs.Spec` maps a mechanism whose registry record's forward is
the upstream module's forward; params carry the upstream names (``nn.Linear`` weights transposed to
refattn's ``(in, out)``, conv kernels and norms as they are). A record that composes a refattn
attention sublayer under refattn's own names is mapped with ``Rename``/``Split`` rules from the
upstream names. The rows register themselves with
:func:`~refattn.interop.torch_specs.add_specs`; the reference modules the tests run are in
``tests/_upstream_blocks_b.py``.
"""

from __future__ import annotations

import numpy as np

from .torch_specs import Derived, Named, Rename, Spec, Split, add_specs, call_x, x_build

__all__ = ["GROUP_SLUGS"]


# ---- timm ViT embedding: PatchEmbed (proj, optional norm) + VisionTransformer._pos_embed (cls_token, pos_embed)


def _vit_infer(keys):
    return {"class_token": "cls_token" in keys, "patch_norm": "patch_embed.norm.weight" in keys}


def _vit_build(rng, p, cfg, z):
    """An image whose patch grid has as many patches as ``pos_embed`` has rows for (any
    factorisation: timm adds the table to the flattened tokens); with ``dynamic_img_pad`` the
    image is cut short of the grid so that timm pads."""
    d, c, ph, pw = p["patch_embed.proj.weight"].shape
    n = p["pos_embed"].shape[1] - (1 if cfg.get("class_token", True) and not cfg.get("no_embed_class") else 0)
    pairs = [(g, n // g) for g in range(1, n + 1) if n % g == 0]
    gh, gw = pairs[z["n"] % len(pairs)]
    cut = (1 if ph > 1 else 0, 1 if pw > 1 else 0) if cfg.get("dynamic_img_pad") else (0, 0)
    return {"x": rng.standard_normal((z["b"], c, gh * ph - cut[0], gw * pw - cut[1]))}, {}


def _image_build(key, axis=0):
    """``x (B, C, H, W)`` with ``C = params[key].shape[axis]`` and a size-dependent ``H x W``."""
    def build(rng, p, cfg, z):
        h, w = 1 + z["n"] % 5 + z["n"] // 5, 2 + z["m"] % 4
        return {"x": rng.standard_normal((z["b"], p[key].shape[axis], h, w))}, {}
    return build


# ---- FastViT RepMixer: train form (norm, mixer MobileOneBlocks, layer_scale) or inference form (reparam_conv)


def _repmixer_infer(keys):
    return {"inference_mode": "reparam_conv.weight" in keys}


def _repmixer_build(rng, p, cfg, z):
    c = (p["reparam_conv.weight"] if "reparam_conv.weight" in p else p["mixer.rbr_skip.weight"]).shape[0]
    return {"x": rng.standard_normal((z["b"], c, 1 + z["n"] % 5 + z["n"] // 5, 2 + z["m"] % 4))}, {}


# ---- Shift-equivariant ViT PolyPatchEmbed: PolyOrder anchoring, then the stride-P conv (square grids upstream)


def _poly_build(rng, p, cfg, z):
    d, c, ph, pw = p["proj.weight"].shape
    g = 1 + z["n"] % 3  # upstream reshapes with grid_size[0] on both axes: square grids
    return {"x": rng.standard_normal((z["b"], c, g * ph, g * pw))}, {}


# ---- Spatial transformer: the PyTorch tutorial's Net.localization, Net.fc_loc and Net.stn


def _stn_build(rng, p, cfg, z):
    """An image whose localisation features (conv k1, pool 2, conv k2, pool 2) flatten to
    ``fc_loc.0``'s input width; one extra row or column (dropped by the floor of the pools) on odd sizes."""
    c, k1 = p["localization.0.weight"].shape[1:3]
    c2, k2 = p["localization.3.weight"].shape[0], p["localization.3.weight"].shape[2]
    s = p["fc_loc.0.weight"].shape[0] // c2
    pairs = [(g, s // g) for g in range(1, s + 1) if s % g == 0]
    sh, sw = pairs[z["n"] % len(pairs)]
    side = lambda t: (2 * t + k2 - 1) * 2 + k1 - 1  # noqa: E731
    return {"x": rng.standard_normal((z["b"], c, side(sh) + z["n"] % 2, side(sw) + z["m"] % 2))}, {}


def _stn_call(module, inp, cfg):
    return module.stn(inp["x"])


# ---- LIT DeformablePatchEmbed_GELU: DeformConv2dPack (conv_offset + DCN v1), BatchNorm2d, GELU; returns (x, (H, W))


def _lit_build(rng, p, cfg, z):
    c_out, c, kh, kw = p["dconv.weight"].shape
    return {"x": rng.standard_normal((z["b"], c, (1 + z["n"] % 3) * kh, (1 + z["m"] % 3) * kw))}, {}


def _lit_call(module, inp, cfg):
    return module(inp["x"])[0]


# ---- NuTime MultiBiasEncoder: unbounded scalars x (B, C) -> (B, C, D)


def _nutime_build(rng, p, cfg, z):
    """Scalars of both signs over eight decades (each scale's range is hit), away from 0."""
    shape = (z["b"], z["n"])
    return {"x": np.exp(rng.uniform(np.log(1e-4), np.log(1e4), shape)) * rng.choice([-1.0, 1.0], shape)}, {}


# ---- DeLighT DExTraUnit: input_layer, dextra_layers (GroupLinear, or Linear where a layer has one group), output_layer


def _dextra_rules(config):
    """upstream's nn_functions ``Linear`` stores ``weights (out, in)`` (transposed here); ``GroupLinear``
    stores ``weights (g, in/g, out/g)``, already refattn's layout. Which layers are ``Linear`` (one group)
    follows from ``dextra_depth`` and ``max_glt_groups`` (upstream's ``dextra_config``)."""
    from ..blocks.delight import dextra_config

    groups = dextra_config(8, 8, 8, dextra_depth=config.get("dextra_depth", 4),
                           max_glt_groups=config.get("max_glt_groups", 8))["groups"]
    lin = "|".join(["input_layer", "output_layer"] + [f"dextra_layers\\.{i}" for i, g in enumerate(groups) if g == 1])
    return [Named(rf"({lin})\.weights", True), Named(r"(input_layer|output_layer|dextra_layers\.\d+)\.(weights|bias"
                                                     r"|normalization_fn\.(weight|bias))", False)]


# ---- Rethinking-attention AttentionSubstitute(FFNetwork_*): forward(query, key, value, mask (B, 1, 1, S))


def _ffn_build(rng, p, cfg, z):
    n_max = int(cfg.get("max_len", 50))
    d = p["layers.0.weight"].shape[0] // n_max
    s = min(z["n"], n_max)
    mask = np.ones((z["b"], s), bool)
    mask[1:, s - 1 - z["b"] % 2:] = s == 1  # padded keys at the end of later sentences (never the first token)
    return {"x": rng.standard_normal((z["b"], s, d))}, {"mask": mask}


def _ffn_call(module, inp, cfg):
    """Upstream's ALR call: the substitute takes (query, key, value, mask) and returns heads
    (B, NH, S, HD), merged back to (B, S, d) here."""
    import torch

    x = inp["x"]
    mask = cfg.get("mask")
    mask = torch.ones(x.shape[:2], dtype=torch.bool) if mask is None else torch.as_tensor(np.asarray(mask))
    out = module(x, x, x, mask[:, None, None, :])
    return out.transpose(1, 2).reshape(x.shape)


# ---- DenseFormer (the README's DenseFormer stack on DWAModules) with torch.nn.MultiheadAttention blocks: refattn's
# record composes its "multi_head_attention" sublayer under its own names (blocks.{i}.q_proj ...)


def _dwa_rules(config):
    if "n_blocks" not in config:  # the per-block Split rules are spelled out, one set per block
        raise ValueError("denseformer_dwa: pass n_blocks= (the number of DenseFormer blocks, upstream's "
                         "DWAModules.n_blocks) to map the blocks' in_proj_weight / out_proj")
    rules = [Named(r"dwa_modules\.alphas\.\d+\.weight", False)]
    for i in range(int(config["n_blocks"])):
        b = f"blocks.{i}."
        rules += [Split((b + "q_proj", b + "k_proj", b + "v_proj"), b + "in_proj_weight", True),
                  Split((b + "q_proj_bias", b + "k_proj_bias", b + "v_proj_bias"), b + "in_proj_bias", False,
                        optional=True),
                  Rename(b + "out_proj", b + "out_proj.weight", True),
                  Rename(b + "out_proj_bias", b + "out_proj.bias", False, optional=True)]
    return rules


def _dwa_call(module, inp, cfg):
    return module(inp["x"])


# ---- Deep Delta Learning DeepDeltaResidualVdim1: forward(x, *, k_in, context)


def _ddl_rules(config):
    rules = [Named(r"(beta|beta_in|beta_out|v_proj)\.weight", True), Named(r"(beta|beta_out|v_proj)\.bias", False)]
    if config.get("v_constant") is not None:  # upstream keeps an unused v_proj with ddl_v_dim1_constant
        rules.insert(0, Derived(r"v_proj\.(weight|bias)"))
    return rules


def _ddl_build(rng, p, cfg, z):
    c = (p["beta.weight"] if "beta.weight" in p else p["beta_in.weight"]).shape[0]
    return {name: rng.standard_normal((z["b"], z["n"], c)) for name in ("x", "k", "context")}, {}


def _ddl_call(module, inp, cfg):
    return module(inp["x"], k_in=inp["k"], context=inp["context"])


# ---- PartialFormer EfficientPAQKMultiheadAttention: fairseq's time-major forward(query, key, value, attn_before=)


def _pf_build(rng, p, cfg, z):
    c = p["q_proj.weight"].shape[0]
    e = int(cfg.get("expand_heads") or cfg["num_heads"])
    return {"x": rng.standard_normal((z["b"], z["n"], c)),
            "attn_before": rng.standard_normal((z["b"], e, z["n"], z["n"]))}, {}


def _pf_call(module, inp, cfg):
    x = inp["x"].transpose(0, 1)  # (T, B, C), fairseq's layout
    b, e, n, _ = inp["attn_before"].shape
    return module(x, x, x, attn_before=inp["attn_before"].reshape(b * e, n, n))[0].transpose(0, 1)


# ---- 2-D SSM TwoDimensionalSSM (real parameterisation): forward(x (L, B, D)), L = S^2 row-major


def _ssm2d_build(rng, p, cfg, z):
    side = 2 + z["n"] % 3
    d = p["C_1"].shape[0] // int(cfg.get("directions", 4))  # C_1 is (D * directions, ndim)
    return {"x": rng.standard_normal((z["b"], side * side, d))}, {}


def _ssm2d_call(module, inp, cfg):
    return module(inp["x"].transpose(0, 1)).transpose(0, 1)  # upstream: Time x Batch x Channel


# ---- DyDiT DiTBlock: forward(x, c, t, complete_model) -> (x, attn_weight_mask, mlp_weight_mask, token_select)


def _dydit_build(rng, p, cfg, z):
    c = p["attn.proj.weight"].shape[0]
    return {"x": rng.standard_normal((z["b"], z["n"], c)), "c": rng.standard_normal((z["b"], c)),
            "t": rng.standard_normal((z["b"], c))}, {}


def _dydit_call(module, inp, cfg):
    return module(inp["x"], inp["c"], inp["t"], bool(cfg.get("complete_model", False)))[0]


# ---- Router-Tuning MindSkip: the attention half of the patched LLaMA decoder layer (input_layernorm, router,
# self_attn = HF LlamaAttention); refattn's record composes its "gqa_mqa" sublayer under self_attn.{q,k,v,out}_proj

_MINDSKIP_RULES = [Named(r"input_layernorm\.weight", False), Named(r"router\.weight", True)] + [
    Rename(f"self_attn.{t}_proj", f"self_attn.{t}_proj.weight", True) for t in "qkv"] + [
    Rename(f"self_attn.{t}_proj_bias", f"self_attn.{t}_proj.bias", False, optional=True) for t in "qkv"] + [
    Rename("self_attn.out_proj", "self_attn.o_proj.weight", True),
    Rename("self_attn.out_proj_bias", "self_attn.o_proj.bias", False, optional=True)]


def _mindskip_call(module, inp, cfg):
    """The patched decoder layer's attention half, as HF calls it: position_embeddings (cos, sin) of
    LlamaRotaryEmbedding (rotate-half, base from attention_config's rope) and the additive causal mask."""
    import torch

    x = inp["x"]
    b, n, _ = x.shape
    att = dict(cfg.get("attention_config") or {})
    d = module.self_attn.head_dim
    rope = att.get("rope")
    base = float((rope if isinstance(rope, dict) else {}).get("base", 10000.0))
    inv = 1.0 / base ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    emb = torch.cat([torch.arange(n, dtype=torch.float64)[:, None] * inv] * 2, dim=-1)[None].expand(b, n, d)
    cos, sin = (emb.cos(), emb.sin()) if rope else (torch.ones_like(emb), torch.zeros_like(emb))
    mask = None
    if att.get("is_causal"):
        mask = torch.full((n, n), torch.finfo(x.dtype).min, dtype=x.dtype).triu(1)[None, None].expand(b, 1, n, n)
    return module(x, attention_mask=mask, position_embeddings=(cos.to(x.dtype), sin.to(x.dtype)))


_SPECS = [
    Spec("vit_patch_embedding", "huggingface/pytorch-image-models timm/layers/patch_embed.py@aa4b585 (PatchEmbed) + "
         "timm/models/vision_transformer.py (VisionTransformer._pos_embed: cls_token, pos_embed; no pos_drop); "
         "the module's forward is _pos_embed(patch_embed(x))",
         rules=[Named(r"patch_embed\.(proj|norm)\.(weight|bias)|cls_token|pos_embed", False)],
         required=("patch_embed.proj.weight", "pos_embed"), call=call_x, build=_vit_build, infer=_vit_infer,
         attrs={"no_embed_class": "no_embed_class", "dynamic_img_pad": "patch_embed.dynamic_img_pad",
                "eps": "patch_embed.norm.eps"}),
    Spec("poolformer_pooling_mixer", "sail-sg/poolformer models/poolformer.py@a075575 (PoolFormerBlock with Pooling, "
         "GroupNorm, Mlp; forward(x) on (B, C, H, W))",
         rules=[Named(r"norm[12]\.(weight|bias)|mlp\.fc[12]\.(weight|bias)|layer_scale_[12]", False)],
         required=("norm1.weight", "mlp.fc1.weight", "mlp.fc2.weight"), call=call_x, build=_image_build("norm1.weight"),
         attrs={"pool_size": "token_mixer.pool.kernel_size", "use_layer_scale": "use_layer_scale", "eps": "norm1.eps"}),
    Spec("fastvit_repmixer", "apple/ml-fastvit models/fastvit.py@8af5928 (RepMixer on models/modules/mobileone.py "
         "MobileOneBlock; train form or inference_mode reparam_conv; eval: BatchNorm running statistics; the "
         "num_batches_tracked buffers are read and dropped)",
         rules=[Named(r"(norm|mixer)\.(rbr_skip|rbr_scale\.(conv|bn)|rbr_conv\.\d+\.(conv|bn))\."
                      r"(weight|bias|running_mean|running_var)|layer_scale|reparam_conv\.(weight|bias)", False),
                Derived(r".*num_batches_tracked")],
         call=call_x, build=_repmixer_build, infer=_repmixer_infer,
         attrs={"kernel_size": "kernel_size", "num_conv_branches": "mixer.num_conv_branches",
                "use_layer_scale": "use_layer_scale", "inference_mode": "inference_mode", "eps": "norm.rbr_skip.eps"}),
    Spec("polyphase_anchoring", "willding123/Shift-Equivariant-Vision-Transformers models/poly_utils.py@c8cd2ef "
         "(PolyPatchEmbed on PolyOrder; forward(x): its PolyOrder.apply(x, patch_size) is always equivariant, "
         "invariance=False; square patches and grids)",
         rules=[Named(r"(proj|norm)\.(weight|bias)", False)], required=("proj.weight",), call=call_x,
         build=_poly_build, infer=lambda keys: {"patch_norm": "norm.weight" in keys}, attrs={"eps": "norm.eps"}),
    Spec("spatial_transformer_bilinear_sampler", "pytorch/tutorials intermediate_source/spatial_transformer_tutorial.py"
         "@0023ff0 (Net.localization, Net.fc_loc, Net.stn; the authors' code is not public; check_module calls "
         "module.stn(x): F.affine_grid + F.grid_sample, whose mode/padding_mode/align_corners are config)",
         rules=[Named(r"fc_loc\.[02]\.weight", True), Named(r"localization\.[03]\.(weight|bias)|fc_loc\.[02]\.bias", False)],
         required=("localization.0.weight", "localization.3.weight", "fc_loc.0.weight", "fc_loc.2.weight"),
         call=_stn_call, build=_stn_build, defaults={"localization": "conv"}),
    Spec("lit_deformable_token_merging", "zhuang-group/LIT classification/code_for_lit_ti/patch_embed.py@742e961 "
         "(DeformablePatchEmbed_GELU on code_for_lit_s_m_b/mm_modules/DCN/modules/deform_conv2d.py DeformConv2dPack "
         "and the DCN v1 im2col kernel; forward(x) returns (tokens, (H, W)); eval: BatchNorm running statistics; "
         "num_batches_tracked read and dropped)",
         rules=[Named(r"dconv\.(weight|bias|conv_offset\.(weight|bias))"
                      r"|norm_layer\.(weight|bias|running_mean|running_var)", False),
                Derived(r"norm_layer\.num_batches_tracked")],
         required=("dconv.weight", "dconv.conv_offset.weight", "norm_layer.weight"), call=_lit_call, build=_lit_build,
         attrs={"eps": "norm_layer.eps"}),
    Spec("low_rank_factorized_linear", "SamuelCahyawijaya/greenformer src/py_auto_fact/lr_module.py@2f81f96 (LED: "
         "led_unit = Sequential(Linear(d_in, r, bias=False), Linear(r, d_out, bias)); forward(x))",
         rules=[Named(r"led_unit\.[01]\.weight", True), Named(r"led_unit\.1\.bias", False)],
         required=("led_unit.0.weight", "led_unit.1.weight"), call=call_x, build=x_build("led_unit.0.weight")),
    Spec("lmu_token_mixer", "zeyuliu1037/LMUFormer src/blocks/lmu.py@5debadd (LMU on src/blocks/lmu_cell.py "
         "LMUFFTCell; forward(x (B, C, N)) with N = the cell's seq_len; eval: BatchNorm running statistics; the "
         "cell's A, B, H, fft_H buffers and num_batches_tracked are read and dropped: refattn rebuilds them from theta)",
         rules=[Named(r"lmu\.W_[uh]\.weight", True),
                Named(r"lmu\.W_[uh]\.bias|proj_conv\.(weight|bias)|proj_bn\.(weight|bias|running_mean|running_var)",
                      False),
                Derived(r"lmu\.(A|B|H|fft_H)|proj_bn\.num_batches_tracked")],
         required=("lmu.W_u.weight", "lmu.W_h.weight", "proj_conv.weight", "proj_bn.weight"), call=call_x,
         build=lambda rng, p, cfg, z: ({"x": rng.standard_normal((z["b"], p["proj_conv.weight"].shape[0], z["n"]))}, {}),
         attrs={"theta": "lmu.theta", "use_all_h": "use_all_h", "eps": "proj_bn.eps"}),
    Spec("nutime_multiscale_embedding", "chenguolin/NuTime src/models/encoders/MultiBiasEncoder.py@9acdd3d "
         "(MultiBiasEncoder, released configuration: locs=None, loc_weighted_sum=False, use_loc_emb=False, "
         "multibias_trainable; forward(x (B, C)); config base = its base_bias, 10 by default; the scales and locs "
         "buffers are read and dropped)",
         rules=[Named(r"ws|bs", False), Derived(r"scales|locs")], required=("ws", "bs"), call=call_x,
         build=_nutime_build, attrs={"scale_weighted_sum": "scale_weighted_sum", "eps": "ln.eps"},
         unsupported={"loc_emb": "use_loc_emb=True (multi-location ablation) is not implemented"}),
    Spec("delight_dextra", "sacmehta/delight fairseq/delight_modules/dextra_unit.py@cc499c5 (DExTraUnit, "
         "norm_type='ln', is_iclr_version=False, eval; on nn_functions.py GroupLinear and Linear; forward(x (B, T, N)); "
         "config activation: 'silu' for act_type 'swish')",
         rules=_dextra_rules, required=("input_layer.weights", "output_layer.weights"), call=call_x,
         build=lambda rng, p, cfg, z: ({"x": rng.standard_normal((z["b"], z["n"], p["input_layer.weights"].shape[0]))},
                                      {}),
         attrs={"in_proj_features": "in_proj_features", "out_features": "out_features",
                "width_multiplier": "width_multiplier", "dextra_depth": "num_glt_layers",
                "max_glt_groups": "max_glt_groups", "shuffle": "glt_shuffle", "eps": "input_layer.normalization_fn.eps"},
         defaults={"activation": "gelu", "shuffle": False}),
    Spec("shallow_ffn_attention_replacement", "vulus98/Rethinking-attention models/definitions/ALR_FF.py@983b8c7 "
         "(FFNetwork_XS/S/M/L: layers.0 LayerNorm, .1 Linear, .2 LeakyReLU, .3 LayerNorm, .4 Linear) in "
         "utils/full_sentence_utils.py AttentionSubstitute (module prefix 'ff.'; forward(query, key, value, mask "
         "(B, 1, 1, S)) on the values; its heads (B, NH, S, HD) merged to (B, S, d))",
         rules=[Named(r"layers\.[14]\.weight", True), Named(r"layers\.[0134]\.(weight|bias)", False)],
         required=("layers.0.weight", "layers.1.weight", "layers.3.weight", "layers.4.weight"), module_prefix="ff.",
         call=_ffn_call, build=_ffn_build, attrs={"max_len": "ff.sentence_length", "eps": "ff.layers.0.eps",
                                                  "negative_slope": "ff.layers.2.negative_slope"}),
    Spec("denseformer_dwa", "epfml/DenseFormer denseformer/denseformer.py@c99a623 (DWAModules; the README's "
         "DenseFormer stack: init_accumulators(x), then x = blocks[i](x), x = dwa_modules(x, block_idx=i), without "
         "wte/ln_f/lm_head) with torch.nn.MultiheadAttention blocks (self-attention, batch_first), refattn's "
         "block='multi_head_attention'; config n_blocks, block_config={'num_heads': ...})",
         rules=_dwa_rules, required=("blocks.0.in_proj_weight", "blocks.0.out_proj.weight"), call=_dwa_call,
         build=lambda rng, p, cfg, z: ({"x": rng.standard_normal((z["b"], z["n"], p["blocks.0.q_proj"].shape[0]))}, {}),
         attrs={"n_blocks": "dwa_modules.n_blocks", "dilation": "dwa_modules.dilation", "period": "dwa_modules.period"},
         defaults={"block": "multi_head_attention"}),
    Spec("depth_attention_delta_residual", "yifanzhang-pro/deep-delta-learning model/DDL-vdim1-gpt-mha-rope.py@2b55f25 "
         "(DeepDeltaResidualVdim1; forward(x, k_in=, context=); config v_constant=ddl_v_dim1_constant_value when "
         "ddl_v_dim1_constant, then v_proj is read and dropped)",
         rules=_ddl_rules, call=_ddl_call, build=_ddl_build,
         attrs={"k_eps": "k_eps", "v_sigmoid": "v_sigmoid", "v_sigmoid_scale": "v_sigmoid_scale",
                "beta_single_linear": "beta_single_linear"}),
    Spec("dico_compact_channel_attention", "shallowdream204/DiCo dico_models.py@b596b05 (DiCoBlock's conv module: "
         "conv1, conv2 (depthwise), ca = Sequential(AdaptiveAvgPool2d, Conv2d, Sigmoid), conv3; the lines of "
         "DiCoBlock.forward between the adaLN modulation and the gated residual; forward(x (B, C, H, W)))",
         rules=[Named(r"(conv[123]|ca\.1)\.(weight|bias)", False)],
         required=("conv1.weight", "conv2.weight", "ca.1.weight", "conv3.weight"), call=call_x,
         build=_image_build("conv1.weight"),
         unsupported={k: "the rest of DiCoBlock (MLP, adaLN), outside the token mixer: strict=False ignores it"
                      for k in ("conv4.weight", "conv4.bias", "conv5.weight", "conv5.bias",
                                "adaLN_modulation.1.weight", "adaLN_modulation.1.bias")}),
    Spec("partialformer_head_ffns", "zhengkid/PartialFormer fairseq/modules/efficient_pa_attention_qk.py@d1ed959 "
         "(EfficientPAQKMultiheadAttention, self-attention, use_hdp=False, eval; forward(query, key, value, "
         "attn_before=(B E, T, T)) time-major, returns (attn, attn_weights); config activation = args.activation_fn)",
         rules=[Named(r"([qkvu]_proj|ff[12]|out_proj)\.weight", True), Named(r"([qkvu]_proj|ff[12]|out_proj)\.bias", False)],
         required=("q_proj.weight", "k_proj.weight", "v_proj.weight", "u_proj.weight", "ff1.weight", "ff2.weight",
                   "out_proj.weight"), call=_pf_call, build=_pf_build,
         attrs={"num_heads": "num_heads", "expand_heads": "expand_heads"},
         unsupported={"hdp_net.0.weight": "use_hdp (the head-mixing net) is not implemented"}),
    Spec("ssm_2d_layer", "ethanbar11/ssm_2d models/mega/two_d_ssm.py@fbdd3e3 (TwoDimensionalSSM, complex_ssm=False; "
         "kernel from models/mega/ssm_coefficient.py CoeffCalculator; forward(x (L, B, D)); omega is always a "
         "parameter upstream: mapped with use_residual, read and dropped without)",
         rules=lambda config: [Named(r"A\.A_[1-4]|[BC]_[12]|normalization\.(weight|bias)", False),
                               Named(r"omega", False) if config.get("use_residual") else Derived(r"omega")],
         required=("A.A_1", "A.A_2", "A.A_3", "A.A_4", "B_1", "B_2", "C_1", "C_2"), call=_ssm2d_call,
         build=_ssm2d_build, infer=lambda keys: {"normalize": "normalization.weight" in keys},
         attrs={"directions": "directions_amount", "use_residual": "use_residual", "eps": "normalization.eps"},
         unsupported={k: "the complex parameterisation (complex_ssm) is not implemented"
                      for k in ("A_angle.A_1", "A_radius.A_1")}),
    Spec("dydit_dynamic_width_token", "NUS-HPC-AI-Lab/Dynamic-Diffusion-Transformer-DyDiT- models.py@dd68c47 (DiTBlock with "
         "Attention, Mlp, DynaLinear at width_mult=1; dynamic_model.py DiffRate, TokenSelect, _gumbel_sigmoid; "
         "forward(x, c, t, complete_model)[0]; eval: hard masks with the straight-through gradient)",
         rules=[Named(r"(adaLN_modulation\.1|attn\.(qkv|proj)|mlp\.fc[12]|(attn_rate|mlp_rate)\.router"
                      r"|token_selection\.mlp_head\.[02])\.weight", True),
                Named(r"(adaLN_modulation\.1|attn\.(qkv|proj)|mlp\.fc[12]|(attn_rate|mlp_rate)\.router"
                      r"|token_selection\.mlp_head\.[02])\.bias", False)],
         required=("adaLN_modulation.1.weight", "attn.qkv.weight", "attn.proj.weight", "mlp.fc1.weight",
                   "attn_rate.router.weight", "mlp_rate.router.weight", "token_selection.mlp_head.0.weight"),
         call=_dydit_call, build=_dydit_build,
         attrs={"num_heads": "attn.num_heads", "tau": "attn_rate.tau", "threshold": "attn_rate.threshold",
                "eps": "norm1.eps"}),
    Spec("mindskip_attention_dynamic_depth", "CASE-Lab-UMD/Router-Tuning-Mixture-of-Depths utils/model/model_patch.py"
         "@772c160 (_patched_decoder_layer_forward's attention half with _compute_routing_state and "
         "_apply_routing_mask, granularity attn_sequence / attn_token) on huggingface/transformers "
         "models/llama/modeling_llama.py LlamaRMSNorm and LlamaAttention (refattn attention='gqa_mqa'; "
         "attention_config num_heads, num_kv_heads, is_causal, rope); eval: the hard mask, no router gradient "
         "(estimator='fixed'; upstream's STE is its training mode)",
         rules=_MINDSKIP_RULES,
         required=("input_layernorm.weight", "router.weight", "self_attn.q_proj.weight", "self_attn.o_proj.weight"),
         call=_mindskip_call, build=x_build("input_layernorm.weight"),
         attrs={"threshold": "threshold", "eps": "input_layernorm.variance_epsilon"},
         defaults={"attention": "gqa_mqa", "estimator": "fixed", "norm": "rms"}),
]

add_specs(*_SPECS)

GROUP_SLUGS = tuple(s.key for s in _SPECS)
"""The keys this module adds to :data:`~refattn.interop.torch_specs.SPECS`."""
