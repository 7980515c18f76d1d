r"""Rows of the :mod:`refattn.interop.torch` table for vision and softmax-variant mechanisms (group
``soft_a``), beside :mod:`refattn.interop.torch_specs` and :mod:`refattn.interop.torch_specs_extra`.

Each :class:`~refattn.interop.torch_specs.Spec` here maps a mechanism whose registry record's
forward is the upstream module's forward (or the upstream block's use of it, spelled out in the
spec's ``call``) and whose params carry the upstream names; it is registered with the public
:func:`~refattn.interop.torch_specs.add_specs` into the same
:data:`~refattn.interop.torch_specs.SPECS` that :mod:`refattn.interop.torch` reads (that module
imports this one). The reference modules the tests run are in ``tests/_upstream_soft_a.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .torch_specs import Derived, Named, Spec, Strip, add_specs, call_x, x_build

__all__ = ["GROUP_SLUGS"]


# ---- Swin WindowAttention (microsoft, V1 and V2): the module runs on windows; the call is the
# attention half of SwinTransformerBlock.forward (cyclic shift, window_partition, the -100 shift mask
# of the block's __init__, window_reverse, reverse shift) on a grid of at least two windows a side


def _swin_infer(keys):
    return {"version": "v2" if "logit_scale" in keys else "v1"}


def _swin_build(rng, p, cfg, z):
    m = int(cfg.get("window_size", 7))
    c = p["qkv.weight"].shape[0]
    h, w = m * (2 + z["b"] % 2), m * (2 + z["n"] % 2)  # microsoft asserts divisibility; min(H, W) > M
    return {"x": rng.standard_normal((z["b"], h, w, c))}, {}


def _swin_shift_mask(torch, h, w, m, s, dtype):
    """The attention mask of microsoft's ``SwinTransformerBlock.__init__`` for a shift ``s > 0``."""
    img = torch.zeros((h, w), dtype=dtype)
    cnt = 0
    for hs in (slice(0, -m), slice(-m, -s), slice(-s, None)):
        for ws in (slice(0, -m), slice(-m, -s), slice(-s, None)):
            img[hs, ws] = cnt
            cnt += 1
    win = img.view(h // m, m, w // m, m).permute(0, 2, 1, 3).reshape(-1, m * m)
    diff = win.unsqueeze(1) - win.unsqueeze(2)
    return diff.masked_fill(diff != 0, -100.0).masked_fill(diff == 0, 0.0)


def _swin_call(module, inp, cfg):
    import torch

    x = inp["x"]
    b, h, w, c = x.shape
    m, s = int(cfg.get("window_size", 7)), int(cfg.get("shift_size", 0))
    if tuple(module.window_size) != (m, m):
        raise ValueError(f"swin_window_attention: the module's window_size is {tuple(module.window_size)}; pass "
                         f"config={{'window_size': {module.window_size[0]}}} (refattn's default is 7)")
    if s:
        x = torch.roll(x, shifts=(-s, -s), dims=(1, 2))
    win = x.view(b, h // m, m, w // m, m, c).permute(0, 1, 3, 2, 4, 5).reshape(-1, m * m, c)
    y = module(win, mask=_swin_shift_mask(torch, h, w, m, s, x.dtype) if s else None)
    y = y.view(b, h // m, w // m, m, m, -1).permute(0, 1, 3, 2, 4, 5).reshape(b, h, w, -1)
    return torch.roll(y, shifts=(s, s), dims=(1, 2)) if s else y


# ---- HAT (XPixelGroup) HAB or OCAB, by the keys: forward(x (b, h*w, c), x_size, rpi[, attn_mask]); the
# call builds rpi_sa / rpi_oca and the shift mask as HAT.calculate_rpi_sa / calculate_rpi_oca /
# calculate_mask do (the OCA index's negative entries wrap, as torch indexing does upstream)


def _hat_infer(keys):
    return {"block": "hab" if "conv_block.cab.0.weight" in keys else "ocab"}


def _hat_build(rng, p, cfg, z):
    m = int(cfg.get("window_size", 16))
    c = p["norm1.weight"].shape[0]
    extra = {}
    if cfg.get("block") == "ocab" and "overlap_ratio" not in cfg:
        mo = int(round(np.sqrt(p["relative_position_bias_table"].shape[0]))) - m + 1
        extra["overlap_ratio"] = (mo - m + 0.5) / m  # int(m * ratio) + m == mo, as OCAB's overlap_win_size
    h, w = m * (2 + z["b"] % 2), m * (2 + z["n"] % 2)  # multiples of the window, min(H, W) > M
    return {"x": rng.standard_normal((z["b"], h, w, c))}, extra


def _hat_rpi_sa(torch, m):
    coords = torch.stack(torch.meshgrid(torch.arange(m), torch.arange(m), indexing="ij")).flatten(1)
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0).contiguous() + (m - 1)
    return rel[:, :, 0] * (2 * m - 1) + rel[:, :, 1]


def _hat_rpi_oca(torch, m, mo):
    ori = torch.stack(torch.meshgrid(torch.arange(m), torch.arange(m), indexing="ij")).flatten(1)
    ext = torch.stack(torch.meshgrid(torch.arange(mo), torch.arange(mo), indexing="ij")).flatten(1)
    rel = (ext[:, None, :] - ori[:, :, None]).permute(1, 2, 0).contiguous() + (m - mo + 1)
    return rel[:, :, 0] * (m + mo - 1) + rel[:, :, 1]


def _hat_call(module, inp, cfg):
    import torch

    x = inp["x"]
    b, h, w, c = x.shape
    m = int(module.window_size)
    if hasattr(module, "conv_block"):  # HAB
        s = int(module.shift_size)
        mask = _swin_shift_mask(torch, h, w, m, s, x.dtype) if s else None
        y = module(x.reshape(b, h * w, c), (h, w), _hat_rpi_sa(torch, m), mask)
    else:
        y = module(x.reshape(b, h * w, c), (h, w), _hat_rpi_oca(torch, m, int(module.overlap_win_size)))
    return y.view(b, h, w, -1)


# ---- iRPE (microsoft/Cream) RPEAttention: forward(x (B, skip + E*E, C)); upstream reads the grid as
# E = floor(sqrt(N)), and the skip (class) tokens show in the tables as one extra bucket


def _irpe_infer(keys):
    return {"rpe_on": "".join(t for t in "qkv" if any(k.startswith(f"rpe_{t}.") for k in keys)),
            "mode": "bias" if any(k.endswith("lookup_table_bias") for k in keys) else "contextual",
            "method": "cross" if any(".rp_rows." in k for k in keys) else "product"}  # get_rpe_config's default


def _irpe_build(rng, p, cfg, z):
    beta = int(2 * float(cfg.get("ratio", 1.9)))
    base = (2 * beta + 1) ** 2 if cfg.get("method", "product") == "product" else 2 * beta + 1
    name = next(k for k in sorted(p) if "lookup_table" in k)
    nb = p[name].shape[1] if name.startswith("rpe_v.") else p[name].shape[-1]
    e = 2 + z["n"] % 2
    return {"x": rng.standard_normal((z["b"], (nb != base) + e * e, p["qkv.weight"].shape[0]))}, {}


# ---- Relation-DETR: the decoder's PositionRelationEmbedding (boxes under no_grad, hence detach_boxes) as the
# float attn_mask of a decoder layer's self_attn (nn.MultiheadAttention, batch_first; q, k = query + query_pos)


def _relation_build(rng, p, cfg, z):
    b, n, c = z["b"], z["n"], p["self_attn.in_proj_weight"].shape[0]

    def boxes():
        return np.concatenate([rng.uniform(0.05, 0.95, (b, n, 2)), rng.uniform(0.05, 0.5, (b, n, 2))], -1)

    inp = {"query": rng.standard_normal((b, n, c)), "query_pos": rng.standard_normal((b, n, c)),
           "src_boxes": boxes(), "tgt_boxes": boxes()}
    return inp, {"num_pos_feats": p["position_relation_embedding.pos_proj.0.weight"].shape[1] // 4}


def _relation_call(module, inp, cfg):
    return module(inp["query"], inp["query_pos"], inp["src_boxes"], inp["tgt_boxes"])


# ---- DuoFormer MultiScaleAttention: forward_with_scale(x (B, P, S, C)) and/or forward_with_region(x, cls_token)
# (cls_token (B, 1, 1, C) upstream, (B, 1, C) in refattn); the projections of a stage not run are read and dropped

_DUO_STAGE = {"scale": r"(qkv1|proj1)\.(weight|bias)", "patch": r"(qkv|proj)\.(weight|bias)"}


def _duo_rules(config):
    stage = config.get("stage", "both")
    used = {"scale": r"(qkv1|proj1)", "patch": r"(qkv|proj)", "both": r"(qkv1?|proj1?)"}[stage]
    rules = [Named(used + r"\.weight", True), Named(used + r"\.bias", False)]
    return rules + ([Derived(_DUO_STAGE["patch" if stage == "scale" else "scale"])] if stage != "both" else [])


def _duo_build(rng, p, cfg, z):
    c = p["qkv1.weight" if "qkv1.weight" in p else "qkv.weight"].shape[0]
    inp = {"x": rng.standard_normal((z["b"], z["n"], 2 + z["n"] % 3, c))}
    if cfg.get("stage", "both") != "scale":
        inp["cls_token"] = rng.standard_normal((z["b"], 1, c))
    return inp, {}


def _duo_call(module, inp, cfg):
    stage, x = cfg.get("stage", "both"), inp["x"]
    if stage != "patch":
        x = module.forward_with_scale(x)
    return x if stage == "scale" else module.forward_with_region(x, inp["cls_token"].unsqueeze(1))


# ---- DependencyViT ReversedAttention (timm side branch): forward(x, m (B, 1, 1, N)) -> (x, m, prune_mask);
# refattn's m is (B, N) and its output is the first of the three


def _dvit_build(rng, p, cfg, z):
    b, n = z["b"], z["n"]
    return {"x": rng.standard_normal((b, n, p["qkv.weight"].shape[0])), "m": rng.uniform(0.3, 1.0, (b, n))}, {}


def _dvit_call(module, inp, cfg):
    m = inp["m"]
    return module(inp["x"], m.reshape(m.shape[0], 1, 1, m.shape[1]))[0]


# ---- adaptive-span MultiHeadSeqAttention with PersistentMemory: forward(h, [cache; h], [cache; h], key_pe);
# its span (query i sees the L cached positions before it, not itself) is refattn's attn_mask over the
# context; key_pe (TransformerSeq's parameter, not the layer's) is zero in the call


def _pm_build(rng, p, cfg, z):
    b, n, span, c = z["b"], z["n"], z["m"], p["proj_query.weight"].shape[0]
    keep = np.zeros((n, span + n), bool)
    for i in range(n):
        keep[i, i:i + span] = True
    inp = {"x": rng.standard_normal((b, n, c)), "context": rng.standard_normal((b, span + n, c))}
    return inp, {"attn_mask": keep}


def _pm_call(module, inp, cfg):
    import torch

    x, ctx = inp["x"], inp["context"]
    key_pe = torch.zeros((1, module.head_dim, ctx.shape[1] - x.shape[1]), dtype=x.dtype)
    return module(x, ctx, ctx, key_pe)


# ---- ParlAI PolyEncoderModule (polyencoder_type "codes", basic/sqrt attentions): encode()'s code attention
# attend(code_attention, codes.repeat(bsz, 1, 1), ctxt_out, ctxt_out, ctxt_mask) on the context encoder's
# output, then score(ctxt_rep, ones, cand_embed); the two TransformerEncoders are outside the record


def _poly_build(rng, p, cfg, z):
    b, n, d = z["b"], z["n"] + 1, p["codes"].shape[1]
    mask = np.ones((b, n), bool)
    mask[0, n - 1:] = False  # one padded context token
    return ({"ctxt": rng.standard_normal((b, n, d)), "cand": rng.standard_normal((b, 1 + z["m"] % 4, d))},
            {"ctxt_mask": mask})


def _poly_call(module, inp, cfg):
    import torch

    for name, layer in (("codes_attention_type", module.code_attention), ("poly_attention_type", module.attention)):
        if getattr(layer, "attn", None) != cfg.get(name, "basic"):
            raise ValueError(f"poly_encoder_attention: the module's {name} is {getattr(layer, 'attn', layer)!r}; "
                             f"pass config={{{name!r}: ...}} (refattn's default is 'basic')")
    ctxt, cand = inp["ctxt"], inp["cand"]
    mask = torch.from_numpy(np.asarray(cfg["ctxt_mask"]))
    rep = module.attend(module.code_attention, queries=module.codes.repeat(ctxt.shape[0], 1, 1), keys=ctxt,
                        values=ctxt, mask=mask)
    return module.score(rep, rep.new_ones(ctxt.shape[0], module.n_codes).byte(), cand)


# ---- Abstract Transformer DualAttention (self_attention + relational_attention) with the model's symbol
# retriever (symbol_retriever.*, the kind read from its keys); with symmetric_rels upstream ties wk_rel to
# wq_rel (both keys in the state_dict): wk_rel is read and dropped

_DUAL_W = Named(r"(self_attention\.w[qkvo]|relational_attention\.(w[qk]_(attn|rel)|w[vo])|symbol_retriever\.q_proj)"
                r"\.weight", True)
_DUAL_B = Named(r"(self_attention\.w[kvo]|relational_attention\.(wk_attn|w[vo]))\.bias|relational_attention\.wr"
                r"|symbol_retriever\.(q_proj\.bias|template_features|symbol_library(\.weight)?"
                r"|rel_pos_enc\.rel_pos_embeddings)", False)


def _dual_rules(config):
    tied = [Derived(r"relational_attention\.wk_rel\.weight")] if config.get("symmetric_rels", False) else []
    return tied + [_DUAL_W, _DUAL_B]


def _dual_infer(keys):
    kind = ("positional_symbols" if "symbol_retriever.symbol_library.weight" in keys else
            "position_relative" if "symbol_retriever.rel_pos_enc.rel_pos_embeddings" in keys else "symbolic_attention")
    return {"symbol_retrieval": kind}


def _dual_build(rng, p, cfg, z):
    w = p["self_attention.wq.weight" if "self_attention.wq.weight" in p else "relational_attention.wq_attn.weight"]
    return {"x": rng.standard_normal((z["b"], z["n"], w.shape[0]))}, {}


# ---- BERT BertSelfAttention with relative distance embeddings (transformers 4.x): forward(hidden_states)[0]


def _bert_call(module, inp, cfg):
    kind = getattr(module, "position_embedding_type", None)
    if kind != cfg.get("position_embedding_type", "relative_key_query"):
        raise ValueError(f"rpe_key_query_huang: the module's position_embedding_type is {kind!r}; pass "
                         f"config={{'position_embedding_type': {kind!r}}} (refattn's default is 'relative_key_query')")
    return module(inp["x"])[0]


# ---- PCT_Pytorch SA_Layer: forward(x (B, C, N)); 1x1 Conv1d weights (C_out, C_in, 1) are refattn's (C_in, C_out);
# q_conv.weight IS k_conv.weight upstream (named_parameters lists it as q_conv.weight): refattn's k_conv.weight
# is read from q_conv.weight and the k_conv.weight alias is dropped; BatchNorm1d's running statistics are
# refattn's config (bn_mode="eval", running_mean=, running_var=), and the call runs after_norm in the mode
# bn_mode names (refattn's default "train": batch statistics, as upstream in training)


@dataclass(frozen=True)
class _Conv1x1:
    """A kernel-1 ``Conv1d`` weight ``up (C_out, C_in, 1)`` as refattn's ``ref (C_in, C_out)``."""

    ref: str
    up: str

    def load(self, view, out):
        a = view.get(self.up)
        if a.ndim != 3 or a.shape[2] != 1:
            raise ValueError(f"params_from_state_dict[{view.slug}]: {view.prefix + self.up} must be a kernel-1 Conv1d "
                             f"weight (C_out, C_in, 1); got shape {a.shape}")
        out[self.ref] = a[:, :, 0].T.copy()

    def save(self, grads, out, used):
        if self.ref in grads:
            used.add(self.ref)
            out[self.up] = np.asarray(grads[self.ref]).T[:, :, None].copy()


def _pct_build(rng, p, cfg, z):
    """At least two points: BatchNorm1d in train mode needs more than one value per channel (torch raises)."""
    return {"x": rng.standard_normal((z["b"], max(z["n"], 2), p["v_conv.weight"].shape[0]))}, {}


def _pct_call(module, inp, cfg):
    module.after_norm.train(cfg.get("bn_mode", "train") == "train")
    return module(inp["x"].transpose(1, 2)).transpose(1, 2)


# ---- ReflexSplit DifferentialDualStreamAttention: forward_sa(cat([x_T, x_R], 0)) or forward_ca(cat([x_T, x_R], -2))
# by config branch (refattn's x (B, 2, N, C)); the other branch's parameters are read and dropped

_REFLEX = {"sa": r"sa_qkv\.(weight|bias)|sa_cross_(trans|refl)_proj\.weight|sa_enhance_weight|lambda_sa|proj_sa\.(weight|bias)",
           "ca": r"ca_(q|kv)\.(weight|bias)|ca_cross_(trans|refl)_proj\.weight|ca_enhance_weight|lambda_ca"
                 r"|proj_ca\.(weight|bias)"}


def _reflex_rules(config):
    br = config.get("branch", "sa")
    return [Named(rf"({br}_qkv|{br}_q|{br}_kv|{br}_cross_(trans|refl)_proj|proj_{br})\.weight", True),
            Named(rf"({br}_qkv|{br}_q|{br}_kv|proj_{br})\.bias|{br}_enhance_weight|lambda_{br}"
                  r"|relative_position_bias_table", False),
            Derived(_REFLEX["ca" if br == "sa" else "sa"] + r"|relative_position_index")]


def _reflex_infer(keys):
    return {"qkv_bias": "sa_qkv.bias" in keys or "ca_q.bias" in keys}


def _reflex_build(rng, p, cfg, z):
    wh, ww = cfg["window_size"]
    c = p[f"proj_{cfg.get('branch', 'sa')}.weight"].shape[0]
    return {"x": rng.standard_normal((z["b"], 2, wh * ww, c))}, {}


def _reflex_call(module, inp, cfg):
    import torch

    if tuple(module.window_size) != tuple(cfg["window_size"]):
        raise ValueError(f"reflexsplit_dual_stream_attention: config window_size {cfg['window_size']} is not the "
                         f"module's {tuple(module.window_size)}")
    x = inp["x"]
    if cfg.get("branch", "sa") == "sa":
        y = module.forward_sa(torch.cat([x[:, 0], x[:, 1]], dim=0)).chunk(2, dim=0)
    else:
        y = module.forward_ca(torch.cat([x[:, 0], x[:, 1]], dim=-2)).chunk(2, dim=-2)
    return torch.stack(y, dim=1)


_SPECS = [
    Spec("swin_window_attention",
         "microsoft/Swin-Transformer models/swin_transformer.py, models/swin_transformer_v2.py@f82860b "
         "(WindowAttention, V1 or V2 by its keys; called as SwinTransformerBlock does: roll, window_partition, "
         "the block's -100 shift mask, window_reverse; config window_size and shift_size as the block's)",
         rules=[Named(r"(qkv|proj|cpb_mlp\.0|cpb_mlp\.2)\.weight", True),
                Named(r"(qkv|proj|cpb_mlp\.0)\.bias|q_bias|v_bias|relative_position_bias_table|logit_scale", False),
                Derived(r"relative_position_index|relative_coords_table")],
         required=("qkv.weight", "proj.weight"), call=_swin_call, build=_swin_build, infer=_swin_infer,
         attrs={"num_heads": "num_heads", "scale": "scale"}, defaults={"param_names": "microsoft"}),
    Spec("irpe_image_relative_position",
         "microsoft/Cream iRPE/DeiT-with-iRPE/rpe_vision_transformer.py, irpe.py@4a13c40 (RPEAttention with "
         "iRPE/iRPE_Cross from get_rpe_config; rpe_on, mode and cross read from the keys, method 'product' "
         "(upstream's default) unless config says 'euc' or 'quant'; pure-PyTorch path, no rpe_ops)",
         rules=[Named(r"(qkv|proj)\.weight", True),
                Named(r"(qkv|proj)\.bias|rpe_[qkv]\.(rp_rows\.|rp_cols\.)?lookup_table_(weight|bias)", False)],
         required=("qkv.weight", "proj.weight"), call=call_x, build=_irpe_build, infer=_irpe_infer,
         attrs={"num_heads": "num_heads", "scale": "scale",
                "ratio": tuple(f"rpe_{t}.{r}rpe_config.alpha" for t in "kqv" for r in ("", "rp_rows.")),
                "shared_head": tuple(f"rpe_{t}.{r}rpe_config.shared_head" for t in "kqv" for r in ("", "rp_rows."))}),
    Spec("relation_detr_position_bias",
         "xiuqhou/Relation-DETR models/bricks/relation_transformer.py@b485955 (PositionRelationEmbedding of "
         "RelationTransformerDecoder, its relation the float attn_mask of RelationTransformerDecoderLayer.self_attn "
         "(nn.MultiheadAttention, batch_first); keys position_relation_embedding.* and self_attn.* as upstream; "
         "upstream computes the relation under no_grad: detach_boxes=True)",
         rules=[Named(r"self_attn\.(in_proj_weight|out_proj\.weight)", True),
                Named(r"self_attn\.(in_proj_bias|out_proj\.bias)|position_relation_embedding\.pos_proj\.0\.(weight|bias)",
                      False)],
         required=("self_attn.in_proj_weight", "self_attn.out_proj.weight",
                   "position_relation_embedding.pos_proj.0.weight"),
         call=_relation_call, build=_relation_build,
         attrs={"num_heads": "self_attn.num_heads"}, defaults={"detach_boxes": True}),
    Spec("duoformer_scale_wise_attention",
         "AliSerwat/duoformer_TCGA models/multiscale_attn.py@3b207c2 (MultiScaleAttention on timm 0.9 Attention, "
         "the authors' release of xiaoyatang/DuoFormer; forward_with_scale and/or forward_with_region(x, cls_token) "
         "by config stage; pos_embed is the model's parameter, not the layer's)",
         rules=_duo_rules, required=(), call=_duo_call, build=_duo_build, attrs={"num_heads": "num_heads",
                                                                                 "scale": "scale"}),
    Spec("reversed_attention_dependencyvit",
         "huggingface/pytorch-image-models timm/models/dependencyvit.py@f63d2e8 (ReversedAttention, qk_norm=False, "
         "with timm.layers.Mlp as message_controller; forward(x, m (B, 1, 1, N))[0]; the official "
         "dingmyu/DependencyViT holds no code)",
         rules=[Named(r"(qkv|proj|head_selector|message_controller\.fc[12])\.weight", True),
                Named(r"(qkv|proj)\.bias", False)],
         required=("qkv.weight", "proj.weight", "head_selector.weight", "message_controller.fc1.weight",
                   "message_controller.fc2.weight"),
         call=_dvit_call, build=_dvit_build,
         attrs={"num_heads": "num_heads", "scale": "scale", "head_selector_temperature": "head_selector_temperature"}),
    Spec("persistent_memory_attention",
         "facebookresearch/adaptive-span models.py, persistent_memory.py@27b815f (MultiHeadSeqAttention with "
         "SeqAttention and PersistentMemory, adapt_span_enabled=False; forward(h, [cache; h], [cache; h], key_pe=0), "
         "its span as refattn's attn_mask over the context)",
         rules=[Named(r"proj_(query|key|val|out)\.weight", True),
                Strip("attn.", r"persistent_memory\.(key|val)", False)],
         required=("proj_query.weight", "proj_key.weight", "proj_val.weight", "proj_out.weight"),
         call=_pm_call, build=_pm_build, attrs={"num_heads": "nb_heads"}),
    Spec("poly_encoder_attention",
         "facebookresearch/ParlAI parlai/agents/transformer/polyencoder.py, modules/attention.py@a29567f "
         "(PolyEncoderModule, polyencoder_type 'codes', PolyBasicAttention 'basic'/'sqrt': encode()'s attend on the "
         "context encoder's output, then score(); its encoder_ctxt/encoder_cand weights are not the record's: "
         "pass prefix or strict=False)",
         rules=[Named(r"codes", False)], required=("codes",), call=_poly_call, build=_poly_build),
    Spec("relational_attention",
         "Awni00/abstract_transformer dual_attention.py, relational_attention.py, attention.py, symbol_retrieval.py@"
         "b7da583 (DualAttention with RelationalAttention, rel_activation identity, no RoPE; symbols from the "
         "model's symbol_retriever (SymbolicAttention, PositionalSymbolRetriever or PositionRelativeSymbolRetriever) "
         "on the layer input: module(x, is_causal=) of a holder with the three)",
         rules=_dual_rules, required=(), call=lambda module, inp, cfg: module(inp["x"],
                                                                              is_causal=cfg.get("is_causal", False)),
         build=_dual_build, infer=_dual_infer,
         attrs={"n_heads_sa": "n_heads_sa", "n_heads_ra": "n_heads_ra", "symbolic_n_heads": "symbol_retriever.n_heads",
                "n_relations": "relational_attention.n_relations", "n_kv_heads": "relational_attention.n_kv_heads",
                "symmetric_rels": "relational_attention.symmetric_rels"}),
    Spec("rpe_key_query_huang",
         "huggingface/transformers src/transformers/models/bert/modeling_bert.py@v4.46.3 (BertSelfAttention, eager, "
         "position_embedding_type 'relative_key_query' or 'relative_key' as config; forward(hidden_states)[0], "
         "the context layer; N <= max_position_embeddings as upstream)",
         rules=[Named(r"(query|key|value)\.weight", True),
                Named(r"(query|key|value)\.bias|distance_embedding\.weight", False)],
         required=("query.weight", "key.weight", "value.weight", "distance_embedding.weight"),
         call=_bert_call, build=x_build("query.weight"),
         attrs={"num_attention_heads": "num_attention_heads", "max_position_embeddings": "max_position_embeddings"}),
    Spec("pct_offset_attention",
         "Strawberry-Eat-Mango/PCT_Pytorch model.py@471ad3a (SA_Layer, the PyTorch port of the Jittor MenghaoGuo/PCT; "
         "forward(x (B, C, N)); q_conv.weight is k_conv.weight; after_norm run in bn_mode, its running statistics "
         "passed as config running_mean/running_var for bn_mode='eval')",
         rules=[_Conv1x1("k_conv.weight", "q_conv.weight"), _Conv1x1("v_conv.weight", "v_conv.weight"),
                _Conv1x1("trans_conv.weight", "trans_conv.weight"),
                Named(r"(v_conv|trans_conv)\.bias|after_norm\.(weight|bias)", False),
                Derived(r"k_conv\.weight|after_norm\.(running_mean|running_var|num_batches_tracked)")],
         required=("q_conv.weight", "v_conv.weight", "trans_conv.weight", "after_norm.weight"),
         call=_pct_call, build=_pct_build, attrs={"bn_eps": "after_norm.eps"}),
    Spec("reflexsplit_dual_stream_attention",
         "wuw2135/ReflexSplit models/arch/reflexsplit.py@268c213 (DifferentialDualStreamAttention; forward_sa or "
         "forward_ca by config branch, on the two streams' windows concatenated as DifferentialDualAttention"
         "InteractiveBlock does; config window_size = the module's)",
         rules=_reflex_rules, required=("relative_position_bias_table",), call=_reflex_call, build=_reflex_build,
         infer=_reflex_infer, attrs={"num_heads": "num_heads", "scale": "scale"}),
    Spec("hat_hybrid_attention",
         "XPixelGroup/HAT hat/archs/hat_arch.py@1638a9a (HAB with CAB/ChannelAttention/WindowAttention, or OCAB, "
         "by the keys; forward(x, x_size, rpi[, attn_mask]) with HAT.calculate_rpi_sa/_rpi_oca/calculate_mask)",
         rules=[Named(r"(attn\.)?(qkv|proj)\.weight|mlp\.fc[12]\.weight", True),
                Named(r"(attn\.)?(qkv|proj)\.bias|mlp\.fc[12]\.bias|norm[12]\.(weight|bias)"
                      r"|(attn\.)?relative_position_bias_table|conv_block\.cab\.(0|2|3\.attention\.1|3\.attention\.3)"
                      r"\.(weight|bias)", False)],
         required=("norm1.weight", "norm2.weight", "mlp.fc1.weight"), call=_hat_call, build=_hat_build,
         infer=_hat_infer,
         attrs={"num_heads": "num_heads", "window_size": "window_size", "shift_size": "shift_size",
                "conv_scale": "conv_scale", "scale": ("attn.scale", "scale"), "eps": "norm1.eps"}),
]

add_specs(*_SPECS)

GROUP_SLUGS = tuple(s.key for s in _SPECS)
"""The keys this module adds to :data:`~refattn.interop.torch_specs.SPECS`."""
