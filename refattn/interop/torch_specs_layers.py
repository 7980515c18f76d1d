r"""Full-layer rows of the :mod:`refattn.interop.torch` table, keyed ``"slug:layer"``.

Where a record's forward is a core on ``q, k, v`` but the upstream module is the whole layer
(projections, positions, norms, gates) that refattn implements as a separate function pair, the
spec names that pair (``layer=``) and is registered under ``"slug:layer"`` with the public
:func:`~refattn.interop.torch_specs.add_specs` into the table :mod:`refattn.interop.torch` reads
(that module imports this one). The reference modules the tests run are in
``tests/_upstream_layers.py``.
"""

from __future__ import annotations

from .torch_specs import Named, Reshape, Spec, add_specs, call_x, x_build

__all__ = ["LAYER_SLUGS"]


# --------------------------------------------------------------------------------------------
# Full layers ("slug:layer"): the upstream module is the whole layer refattn implements beside
# the record's (q, k, v) core; each spec names the layer pair (layer=) and is keyed "slug:layer".
# The reference modules the tests run are in tests/_upstream_layers.py.


def _layer(module: str, name: str) -> tuple:
    import importlib

    mod = importlib.import_module(f"refattn.attention.{module}")
    return getattr(mod, f"{name}_forward"), getattr(mod, f"{name}_backward")



def _grid(key):  # x (B, C, H, W), C the input channels of conv kernel ``key`` (C_out, C_in, 1, 1)
    def build(rng, p, cfg, z):
        return {"x": rng.standard_normal((z["b"], p[key].shape[1], 2 + z["n"] % 4, 3 + z["n"] % 3))}, {}
    return build


def _alibi_call(module, inp, cfg):  # fairseq's (T, B, C) layout
    out = module(inp["x"].transpose(0, 1))
    return (out[0] if isinstance(out, tuple) else out).transpose(0, 1)


def _t5_build(rng, p, cfg, z):
    inp = {"x": rng.standard_normal((z["b"], z["n"], p["q.weight"].shape[0]))}
    if p["k.weight"].shape[0] != p["q.weight"].shape[0]:  # cross-attention from a wider/narrower encoder
        inp["key_value_states"] = rng.standard_normal((z["b"], z["m"], p["k.weight"].shape[0]))
    return inp, {}


def _t5_call(module, inp, cfg):
    """HF ``T5Attention.forward(hidden_states, mask=, key_value_states=)``; with ``is_causal`` the
    additive causal mask at ``finfo.min`` that T5's models build."""
    import torch

    x, kv = inp["x"], inp.get("key_value_states")
    n, m = x.shape[1], (x if kv is None else kv).shape[1]
    mask = None
    if cfg.get("is_causal"):
        mask = torch.zeros(n, m, dtype=x.dtype).masked_fill(torch.ones(n, m, dtype=torch.bool).triu(1),
                                                            torch.finfo(x.dtype).min)
    out = module(x, mask=mask, key_value_states=kv)
    return out[0] if isinstance(out, tuple) else out


add_specs(
    Spec("multi_token_attention", "facebookresearch/RAM projects/mta/mta_transformer.py@e6f051f (Attention with "
         "use_mta; lingua's RoPE and repeat_kv)", layer=_layer("differential.mta", "multi_token_attention_layer"),
         rules=[Named(r"(wq|wk|wv|wo|wpsm|wposm|gate)\.weight", True),
                Named(r"wo\.bias|mta_kernel(_after_sm)?|head_kernel|subln\.weight|gate\.bias", False)],
         required=("wq.weight", "wk.weight", "wv.weight", "wo.weight"), call=call_x, build=x_build("wq.weight")),
    Spec("mala_linear_attention", "qhfan/MALA classfication_release/model.py@7114e63 (AddLinearAttention with its "
         "RoPE; conv kernels keep torch's layout)", layer=_layer("differential.mala", "mala_layer"),
         rules=[Named(r"(qkvo|lepe|proj)\.(weight|bias)", False)], required=("qkvo.weight", "lepe.weight"),
         call=call_x, build=_grid("qkvo.weight"), attrs={"num_heads": "num_heads"}),
    Spec("sinkformer_attention", "michaelsdr/sinkformers vit-pytorch/vit_pytorch/vit.py@045d933 (Attention with "
         "SinkhornDistance)", layer=_layer("linear.sinkformer", "sinkformer_layer"),
         rules=[Named(r"to_qkv\.weight|to_out\.0\.weight", True), Named(r"to_out\.0\.bias", False)],
         required=("to_qkv.weight",), call=call_x, build=x_build("to_qkv.weight"), attrs={"heads": "heads"}),
    Spec("alibi", "ofirpress/attention_with_linear_biases fairseq/models/transformer.py@4b92f28 (decoder "
         "self-attention: fairseq MultiheadAttention with buffered_future_mask's ALiBi bias; called on (T, B, C))",
         layer=_layer("softmax.alibi", "alibi_layer"),
         rules=[Named(r"(q|k|v|out)_proj\.weight", True), Named(r"(q|k|v|out)_proj\.bias|alibi_slopes", False)],
         required=("q_proj.weight", "k_proj.weight", "v_proj.weight", "out_proj.weight"), call=_alibi_call,
         build=x_build("q_proj.weight"), attrs={"num_heads": "num_heads"}),
    Spec("relative_position_encodings", "huggingface/transformers src/transformers/models/t5/modeling_t5.py@6b8b757 "
         "(T5Attention: q/k/v/o, relative_attention_bias; no scaling)",
         layer=_layer("softmax.relative", "t5_attention_layer"),
         rules=[Named(r"[qkvo]\.weight", True), Named(r"relative_attention_bias\.weight", False)],
         required=("q.weight", "k.weight", "v.weight", "o.weight"), call=_t5_call, build=_t5_build,
         attrs={"num_heads": "n_heads", "is_decoder": "is_decoder",
                "num_buckets": "relative_attention_num_buckets",
                "max_distance": "relative_attention_max_distance"}),
    Spec("efficient_attention_shen", "cmsflash/efficient-attention efficient_attention.py@46a5f9e "
         "(EfficientAttention; 1x1 conv kernels keep torch's layout)",
         layer=_layer("linear.efficient", "efficient_attention_layer"),
         rules=[Named(r"(keys|queries|values|reprojection)\.(weight|bias)", False)],
         required=("keys.weight", "queries.weight", "values.weight", "reprojection.weight"),
         call=call_x, build=_grid("keys.weight"), attrs={"head_count": "head_count"}),
    Spec("transnormer_norm_attention", "OpenNLPLab/fairseq-evo fairseq/modules/x_attention/"
         "norm_linear_attention.py@38fa81f (NormLinearAttention; Urpe; arch transnormer_t1)",
         layer=_layer("linear.transnormer", "transnormer_layer"),
         rules=[Named(r"(q|k|v|out)_proj\.weight", True), Named(r"(q|k|v|out)_proj\.bias|layer_norm\.(weight|bias)"
                                                                   r"|urpe\.v", False),
                Reshape("urpe.theta", lambda n: (1, 1, n), optional=True)],
         required=("q_proj.weight", "k_proj.weight", "v_proj.weight", "out_proj.weight"), call=call_x,
         build=x_build("q_proj.weight"), attrs={"num_heads": "num_heads"}),
    Spec("shaped_attention", "bobby-he/simplified_transformers simplified_transformers/model_utils.py@8d4ea79 "
         "(myGPT2Attention; MyConv1D weights are already (in, out); a reparameterised MyConv1D's `id` "
         "matrix is config v_attn_id / c_proj_id)", layer=_layer("differential.shaped", "shaped_attention_layer"),
         rules=[Named(r"(qk_attn|v_attn|c_proj)\.(weight|bias|resid_gain|skip_gain)|[qk]_norm\.scale", False)]
         + [Reshape(g, lambda n: (1, n, 1, 1)) for g in ("attn_mat_resid_gain", "attn_mat_skip_gain",
                                                          "centre_attn_gain")],
         required=("qk_attn.weight",), call=call_x, build=x_build("qk_attn.weight")),
)


LAYER_SLUGS = ("multi_token_attention", "mala_linear_attention", "sinkformer_attention", "alibi",
               "relative_position_encodings", "efficient_attention_shen", "transnormer_norm_attention",
               "shaped_attention")
"""The records mapped here under ``"slug:layer"``."""
