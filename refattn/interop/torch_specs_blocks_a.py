r"""Rows of the :mod:`refattn.interop.torch` table for building blocks (group ``blocks_a``): norms,
activations and whole transformer blocks whose registry record's forward is the upstream module's
forward, with the upstream parameter names.

Each :class:`~refattn.interop.torch_specs.Spec` here is registered with the public
:func:`~refattn.interop.torch_specs.add_specs` into the same
:data:`~refattn.interop.torch_specs.SPECS` that :mod:`refattn.interop.torch` reads (that module
imports every ``torch_specs_<group>`` module). The reference modules the tests run are in
``tests/_upstream_blocks_a.py``.
"""

from __future__ import annotations

import numpy as np

from ..testing.compare import to_numpy
from .torch_specs import Derived, Named, Rename, Reshape, Spec, Split, View, add_specs, call_x

__all__ = ["GROUP_SLUGS"]


def _x_last(key, axis=0):
    """x ``(b, n, C)``, C the size of params[key] along ``axis``."""
    def build(rng, p, cfg, z):
        return {"x": rng.standard_normal((z["b"], z["n"], p[key].shape[axis]))}, {}
    return build


# ---- DyT DynamicTanh: channels_last (b, n, C) or channel-first images (B, C, H, W)


def _dyt_build(rng, p, cfg, z):
    c = p["weight"].shape[0]
    if cfg.get("channels_last", True):
        return {"x": 2 * rng.standard_normal((z["b"], z["n"], c))}, {}
    return {"x": 2 * rng.standard_normal((z["b"], c, 2 + z["n"] % 3, 1 + z["n"] % 4))}, {}


# ---- B-cos BcosConv2d with a 1x1 kernel: per-pixel tokens; NormedConv2d's weight (U m, C, 1, 1) is
# refattn's linear.weight (C, U m) transposed


class _Conv1x1:
    """A 1x1 ``Conv2d`` weight ``(out, in, 1, 1)`` as a Linear weight ``(in, out)``, same name."""

    def __init__(self, name):
        self.name = name

    def load(self, view: View, out: dict) -> None:
        a = view.get(self.name)
        if a.ndim != 4 or a.shape[2:] != (1, 1):
            raise ValueError(f"params_from_state_dict[{view.slug}]: {view.prefix + self.name} has shape "
                             f"{a.shape}; the table maps a 1x1 kernel (out, in, 1, 1). For a k x k kernel "
                             f"pass weight.reshape(out, -1).T and F.unfold patches (C, kh, kw order) yourself")
        out[self.name] = a[:, :, 0, 0].T

    def save(self, grads, out, used):
        if self.name in grads:
            used.add(self.name)
            out[self.name] = to_numpy(grads[self.name]).T[:, :, None, None]


def _bcos_build(rng, p, cfg, z):
    return {"x": rng.standard_normal((z["b"], z["n"], p["linear.weight"].shape[0]))}, {}


def _bcos_call(module, inp, cfg):
    x = inp["x"]  # tokens (b, n, C) as the pixels of a (b, C, n, 1) image; the output back to (b, n, U)
    y = module(x.transpose(1, 2)[..., None])
    return y[..., 0].transpose(1, 2)


# ---- EquiformerV2 layer_norm.py: the norm class shows in the keys (norm_l0: the SH layer norm;
# expand_index: the RMS norm V2); the std-balance weights are a buffer derived from lmax


def _eq_infer(keys):
    kind = ("layer_norm_sh" if "norm_l0.weight" in keys else "rms_norm_sh" if "expand_index" in keys
            else "layer_norm")
    return {"norm_type": kind, **({} if kind == "layer_norm" else
                                  {"std_balance_degrees": "balance_degree_weight" in keys})}


def _eq_build(rng, p, cfg, z):
    lmax, c = p["affine_weight"].shape[0] - (1 if "affine_bias" in p else 0), p["affine_weight"].shape[1]
    return {"x": rng.standard_normal((z["b"] * z["n"], (lmax + 1) ** 2, c))}, {}


# ---- torchscale EncoderLayer with subln (Magneto): forward(x, encoder_padding_mask, attn_mask=) -> (x, l_aux);
# is_causal as torchscale's attn_mask (nonzero = masked, filled with -1e8)


def _magneto_call(module, inp, cfg):
    import torch

    x = inp["x"]
    mask = None
    if cfg.get("is_causal"):
        n = x.shape[1]
        mask = torch.ones(n, n, dtype=x.dtype).triu(1)
    return module(x, None, attn_mask=mask)[0]


# ---- blocks around a multi-head attention sublayer: refattn's multi_head_attention keys under a prefix


def _fused_mha(up: str, ref: str) -> list:
    """timm's ``Attention`` (fused ``qkv`` with optional bias, ``proj``) at ``up`` as refattn's
    ``multi_head_attention`` params at ``ref`` (``q_proj`` ... ``out_proj_bias``)."""
    qkv = tuple(f"{ref}{n}_proj" for n in "qkv")
    return [Split(qkv, f"{up}qkv.weight", True), Split(tuple(f"{k}_bias" for k in qkv), f"{up}qkv.bias", False, True),
            Rename(f"{ref}out_proj", f"{up}proj.weight", True),
            Rename(f"{ref}out_proj_bias", f"{up}proj.bias", False, True)]


def _heads_call(path: str, cfg_key: str = "attention_config", run=None):
    """Call ``module(x)`` (or ``run(module, x)``), first checking that ``config[cfg_key]`` gives the
    module's head count and scale (refattn's block config carries them; the module holds them at
    ``path``)."""
    def call(module, inp, cfg):
        attn = module
        for name in path.split("."):
            attn = getattr(attn, name)
        sub = dict(cfg.get(cfg_key) or {})
        heads = getattr(attn, "num_heads", None)
        if heads is not None and sub.get("num_heads") != heads:
            raise ValueError(f"check_module: pass config={{{cfg_key!r}: {{'num_heads': {heads}}}}} (the module's "
                             f"{path}.num_heads); got {cfg.get(cfg_key)!r}")
        scale = getattr(attn, "scale", None)
        d = None if heads is None else inp["x"].shape[-1] // heads
        if scale is not None and d and abs(float(scale) - d ** -0.5) > 1e-12 * d ** -0.5 \
                and sub.get("scale") != float(scale):
            raise ValueError(f"check_module: the module's {path}.scale is {scale} (qk_scale); pass it as "
                             f"{cfg_key}['scale']")
        return module(inp["x"]) if run is None else run(module, inp["x"])
    return call


def _in_proj_mha(up: str, ref: str) -> list:
    """fairseq's (and torch's) packed ``in_proj_weight``/``in_proj_bias`` and ``out_proj`` at ``up``
    as refattn's ``multi_head_attention`` params at ``ref``."""
    qkv = tuple(f"{ref}{n}_proj" for n in "qkv")
    return [Split(qkv, f"{up}in_proj_weight", True),
            Split(tuple(f"{k}_bias" for k in qkv), f"{up}in_proj_bias", False, True),
            Rename(f"{ref}out_proj", f"{up}out_proj.weight", True),
            Rename(f"{ref}out_proj_bias", f"{up}out_proj.bias", False, True)]


def _time_major(module, x):  # fairseq layers take (T, B, C) and a padding mask
    return module(x.transpose(0, 1), None).transpose(0, 1)


# ---- GPT-J GPTJBlock: forward(hidden_states, attention_mask=, position_ids=) -> (hidden_states, weights); its
# GPTJAttention is refattn's multi_head_attention with is_causal and rope={'interleaved': True, 'rotary_dim': r}


def _gptj_call(module, inp, cfg):
    import torch

    x = inp["x"]
    b, n, _ = x.shape
    att = module.attn
    want = {"num_heads": att.num_attention_heads, "is_causal": True,
            "rope": {"interleaved": True, "rotary_dim": att.rotary_dim or att.head_dim}}
    got = dict(cfg.get("attention_config") or {})
    rope = got.get("rope") if isinstance(got.get("rope"), dict) else {}
    if (got.get("num_heads"), bool(got.get("is_causal")), bool(rope.get("interleaved")),
            rope.get("rotary_dim", att.head_dim)) != (want["num_heads"], True, True, want["rope"]["rotary_dim"]) \
            or set(got) - {"num_heads", "is_causal", "rope"} or set(rope) - {"interleaved", "rotary_dim", "base"} \
            or float(rope.get("base", 10000.0)) != 10000.0:
        raise ValueError(f"check_module[parallel_attention_mlp_block]: GPT-J's attention is causal with interleaved "
                         f"RoPE (base 10000) on the first rotary_dim channels of each head: pass "
                         f"config={{'attention_config': {want}}}; got {cfg.get('attention_config')!r}")
    mask = torch.full((n, n), torch.finfo(x.dtype).min, dtype=x.dtype).triu(1)[None, None].expand(b, 1, n, n)
    return module(x, attention_mask=mask, position_ids=torch.arange(n)[None])[0]


# ---- nGPT Block (use_nGPT=1): forward(h); heads from config.n_head


def _ngpt_call(module, inp, cfg):
    heads = module.config.n_head
    if dict(cfg.get("attention_config") or {}).get("num_heads") != heads:
        raise ValueError(f"check_module[ngpt_normalized_block]: pass config={{'attention_config': {{'num_heads': "
                         f"{heads}}}}} (the module's config.n_head); got {cfg.get('attention_config')!r}")
    return module(inp["x"])


# ---- simplified_transformers myGPT2Block, skipless-parallel (SAS-P): MyConv1D weights are already (in, out);
# the frozen zero biases (MyConv1D(bias=False)) are checked to be zero and dropped


class _ZeroDropped:
    """Frozen parameters that must be zero (upstream ``requires_grad=False`` zeros): read, checked, dropped."""

    def __init__(self, pattern, why):
        self.pattern, self.why = pattern, why

    def load(self, view: View, out: dict) -> None:
        import re

        for name in sorted(view.items):
            if name not in view.used and re.fullmatch(self.pattern, name):
                a = view.get(name)
                if np.any(a[~np.isnan(a)]):  # NaN: check_module's probe for frozen parameters
                    raise ValueError(f"params_from_state_dict[{view.slug}]: {view.prefix + name} is not zero; "
                                     f"{self.why}")

    def save(self, grads, out, used):
        pass


def _sas_call(module, inp, cfg):
    heads = module.attn.num_heads
    if dict(cfg.get("attention_config") or {}).get("num_heads") != heads or not module.parallel_layers \
            or module.norm_position != "pre":
        raise ValueError(f"check_module[simplified_block_he_hofmann]: the table maps the skipless-parallel block "
                         f"(parallel_layers=True, norm_position='pre') with config={{'attention_config': "
                         f"{{'num_heads': {heads}}}}}; got {cfg.get('attention_config')!r}")
    return module(inp["x"])[0]


# ---- TNT Block: forward(inner (B n, m, c), outer (B, 1 + n, C)) -> (inner, outer); Attention with a fused qk


def _tnt_attn(side: str) -> list:
    a = f"{side}_attn."
    return [Split((f"{a}q_proj", f"{a}k_proj"), f"{a}qk.weight", True),
            Split((f"{a}q_proj_bias", f"{a}k_proj_bias"), f"{a}qk.bias", False, True),
            Rename(f"{a}v_proj", f"{a}v.weight", True), Rename(f"{a}v_proj_bias", f"{a}v.bias", False, True),
            Rename(f"{a}out_proj", f"{a}proj.weight", True), Rename(f"{a}out_proj_bias", f"{a}proj.bias", False, True)]


def _tnt_build(rng, p, cfg, z):
    c, big = p["inner_norm1.weight"].shape[0], p["outer_norm1.weight"].shape[0]
    m = p["proj_norm1.weight"].shape[0] // c
    return {"inner": rng.standard_normal((z["b"], z["n"], m, c)),
            "outer": rng.standard_normal((z["b"], int(cfg.get("cls_tokens", 1)) + z["n"], big))}, {}


def _tnt_call(module, inp, cfg):
    for side in ("inner", "outer"):
        att, sub = getattr(module, f"{side}_attn"), dict(cfg.get(f"{side}_attention_config") or {})
        if sub.get("num_heads") != att.num_heads or abs(sub.get("scale", att.head_dim ** -0.5) - att.scale) > 1e-15:
            raise ValueError(f"check_module[tnt_block]: pass config {side}_attention_config={{'num_heads': "
                             f"{att.num_heads}}} (and 'scale': {att.scale} for a qk_scale); got {sub!r}")
    inner, outer = inp["inner"], inp["outer"]
    b, n, m, c = inner.shape
    out = module(inner.reshape(b * n, m, c), outer.clone())  # upstream writes outer_tokens[:, 1:] in place
    return out[1] if cfg.get("outputs", "both") == "outer" else (out[0].reshape(b, n, m, c), out[1])


# ---- Looped transformer: TransformerModelLooped's loop (its f method, the GPT2Model backbone) on the embedded
# prompt; the read-in / read-out Linears lie outside the record (module_prefix '_backbone.transformer.')

_LOOP_FUNCS = {"add": "z=f(x+z)", "mul": "z=f(x*z)"}


def _looped_rules(config):
    rules = [Named(r"wpe\.weight|ln_f\.(weight|bias)", False)]
    for i in range(int(config.get("num_layers", 1))):
        h = f"h.{i}."
        rules += [Split(tuple(f"{h}attn.{n}_proj" for n in "qkv"), f"{h}attn.c_attn.weight", True),
                  Split(tuple(f"{h}attn.{n}_proj_bias" for n in "qkv"), f"{h}attn.c_attn.bias", False, True),
                  Rename(f"{h}attn.out_proj", f"{h}attn.c_proj.weight", True),
                  Rename(f"{h}attn.out_proj_bias", f"{h}attn.c_proj.bias", False, True),
                  Named(rf"h\.{i}\.mlp\.c_(fc|proj)\.weight", True),
                  Named(rf"h\.{i}\.(ln_[12]\.(weight|bias)|mlp\.c_(fc|proj)\.bias)", False)]
    return rules


def _looped_call(module, inp, cfg):
    import torch

    inj, heads = cfg.get("injection", "add"), module._backbone.config.n_head
    sub = dict(cfg.get("attention_config") or {})
    if _LOOP_FUNCS.get(inj) != module.loop_func or sub != {"num_heads": heads, "is_causal": True} \
            or cfg.get("pre_layers", 0) or cfg.get("post_layers", 0):
        raise ValueError(f"check_module[looped_transformer]: the module (loop_func={module.loop_func!r}) is config "
                         f"injection={[k for k, v in _LOOP_FUNCS.items() if v == module.loop_func]}, "
                         f"attention_config={{'num_heads': {heads}, 'is_causal': True}}, no pre/post layers; "
                         f"got injection={inj!r}, attention_config={sub!r}")
    x = inp["x"]
    out = torch.zeros_like(x) if inj == "add" else torch.ones_like(x)
    iterates = []
    for _ in range(int(cfg["n_loops"])):  # TransformerModelLooped.forward with n_loop_start = 0
        out = module.f(out, x)
        iterates.append(out)
    w = cfg.get("window")
    return out if w is None else torch.stack(iterates[-int(w):], dim=1)


# ---- ArchScale GMU: forward(hidden_states, memory); the gated RMSNorm's groups from norm.group_size


def _gmu_build(rng, p, cfg, z):
    c, d = p["in_proj.weight"].shape
    return {"x": rng.standard_normal((z["b"], z["n"], c)), "memory": rng.standard_normal((z["b"], z["n"], d))}, {}


def _gmu_call(module, inp, cfg):
    if getattr(module, "use_norm", False):
        groups = module.in_proj.weight.shape[0] // module.norm.group_size
        if int(cfg.get("ngroups", 1)) != groups:
            raise ValueError(f"check_module[gated_memory_unit]: the module's norm has {groups} groups "
                             f"(group_size {module.norm.group_size}); pass config={{'ngroups': {groups}}}")
    return module(inp["x"], inp["memory"])


_SPECS = [
    Spec("rms_norm", "microsoft/unilm Diff-Transformer/diff/rms_norm.py@45d438e (RMSNorm, elementwise_affine=True; "
         "normalises the last axis)",
         rules=[Named(r"weight", False)], required=("weight",), call=call_x, build=_x_last("weight"),
         attrs={"eps": "eps"}, defaults={"eps": 1e-6}),
    Spec("dyt_dynamic_tanh", "jiachenzhu/DyT dynamic_tanh.py@aab5dde (DynamicTanh; channels_last=False takes "
         "(B, C, H, W))",
         rules=[Named(r"alpha|weight|bias", False)], required=("alpha", "weight"), call=call_x, build=_dyt_build,
         attrs={"channels_last": "channels_last"}),
    Spec("dynamic_range_activator", "Baran-phys/DynamicFormer dra/activations.py@28139ba (DRA)",
         rules=[Named(r"[abcd]", False)], required=("a", "b", "c", "d"), call=call_x,
         build=lambda rng, p, cfg, z: ({"x": 2 * rng.standard_normal((z["b"], z["n"], 3 + z["m"] % 4))}, {})),
    Spec("polynorm_polycom", "BryceZhuo/PolyCom dense_model/megatron_patch/model/llama2/transformer.py@0ed8ad4 "
         "(PolyNorm with polynorm: kind='polynorm'; PolyReLU with poly: kind='polyrelu'; README.md PolyNorm)",
         rules=[Named(r"weight|bias", False)], required=("weight", "bias"), call=call_x,
         build=lambda rng, p, cfg, z: ({"x": 1.5 * rng.standard_normal((z["b"], z["n"], 3 + z["m"] % 5))}, {}),
         attrs={"eps": "eps"}),
    Spec("bcos_transform", "moboehle/B-cos modules/bcosconv2d.py@19c7ea4 (BcosConv2d with kernel_size=1 on "
         "(B, C, n, 1) images, fwd_2 for b=2 and fwd_b otherwise; NormedConv2d weight (U max_out, C, 1, 1))",
         rules=[_Conv1x1("linear.weight")], required=("linear.weight",), call=_bcos_call, build=_bcos_build,
         attrs={"b": "b", "max_out": "max_out", "scale": "scale"}),
    Spec("equiformerv2_separable_layernorm", "atomicarchitects/equiformer_v2 nets/equiformer_v2/layer_norm.py@cf45ee2 "
         "(EquivariantLayerNormArraySphericalHarmonics: norm_l0 keys; EquivariantRMSNormArraySphericalHarmonicsV2 "
         "with centering: expand_index buffer; EquivariantLayerNormArray; affine=True; input (N, (lmax+1)^2, C); "
         "config normalization='norm' when the module has it)",
         rules=[Named(r"affine_(weight|bias)|norm_l0\.(weight|bias)", False),
                Derived(r"balance_degree_weight|expand_index")],
         required=("affine_weight",), call=call_x, build=_eq_build, infer=_eq_infer,
         attrs={"eps": "eps", "std_balance_degrees": "std_balance_degrees"}),
    Spec("magneto_subln_init", "microsoft/torchscale torchscale/architecture/encoder.py@4d1e0e8 (EncoderLayer with "
         "subln=True, encoder_normalize_before=True; component/multihead_attention.py inner_attn_ln, "
         "component/feedforward_network.py ffn_layernorm; is_causal as EncoderLayer's attn_mask)",
         rules=[Named(r"(self_attn\.(q|k|v|out)_proj|ffn\.fc[12])\.weight", True),
                Named(r"(self_attn\.(q|k|v|out)_proj|ffn\.fc[12])\.bias"
                      r"|(self_attn_layer_norm|self_attn\.inner_attn_ln|final_layer_norm|ffn\.ffn_layernorm)"
                      r"\.(weight|bias)", False)],
         required=("self_attn.q_proj.weight", "self_attn.inner_attn_ln.weight", "ffn.fc1.weight",
                   "ffn.ffn_layernorm.weight"),
         call=_magneto_call, build=_x_last("self_attn.q_proj.weight"),
         attrs={"num_heads": "self_attn.num_heads", "eps": "self_attn_layer_norm.eps"}),
    Spec("layerscale", "facebookresearch/deit cait_models.py@7e160fe (LayerScale_Block with Attention_block="
         "models_v2.Attention, timm's Mlp; models_v2.py Layer_scale_init_Block is the same block; config "
         "attention_config={'num_heads': H} (and 'scale' for a qk_scale); Attention_talking_head has no "
         "refattn attention)",
         rules=_fused_mha("attn.", "attn.") + [Named(r"mlp\.fc[12]\.weight", True),
                                              Named(r"norm[12]\.(weight|bias)|mlp\.fc[12]\.bias|gamma_[12]", False)],
         required=("attn.qkv.weight", "attn.proj.weight", "mlp.fc1.weight", "gamma_1", "gamma_2"),
         call=_heads_call("attn"), build=_x_last("gamma_1"), attrs={"eps": "norm1.eps"}),
    Spec("macaron_block", "zhuohan123/macaron-net translation/fairseq/models/transformer.py@3a84e7a "
         "(TransformerEncoderLayer with args.macaron; fairseq/modules/multihead_attention.py MultiheadAttention, "
         "packed in_proj_weight; called on (T, B, C); config attention_config={'num_heads': H})",
         rules=_in_proj_mha("self_attn.", "self_attn.")
         + [Named(r"(macaron_)?fc[12]\.weight", True),
            Named(r"(macaron_)?fc[12]\.bias|layer_norms\.[012]\.(weight|bias)", False)],
         required=("self_attn.in_proj_weight", "macaron_fc1.weight", "fc1.weight", "layer_norms.2.weight"),
         call=_heads_call("self_attn", run=_time_major), build=_x_last("fc1.weight"),
         attrs={"ffn_scale": "fc_factor", "normalize_before": "normalize_before", "eps": "layer_norms.0.eps"}),
    Spec("parallel_attention_mlp_block", "huggingface/transformers src/transformers/models/gptj/modeling_gptj.py@00b676f "
         "(GPTJBlock: ln_1, GPTJAttention q/k/v/out_proj without bias, GPTJMLP fc_in/fc_out; called with HF's "
         "causal mask and position_ids; config attention_config={'num_heads': H, 'is_causal': True, "
         "'rope': {'interleaved': True, 'rotary_dim': r}}, activation='gelu_tanh' for gelu_new)",
         rules=[Rename(f"attn.{n}_proj", f"attn.{n}_proj.weight", True) for n in ("q", "k", "v", "out")]
         + [Named(r"mlp\.fc_(in|out)\.weight", True), Named(r"ln_1\.(weight|bias)|mlp\.fc_(in|out)\.bias", False)],
         required=("ln_1.weight", "attn.q_proj.weight", "mlp.fc_in.weight"),
         call=_gptj_call, build=_x_last("ln_1.weight"), attrs={"eps": "ln_1.eps"},
         defaults={"shared_norm": True, "activation": "gelu_tanh"}),
    Spec("ngpt_normalized_block", "NVIDIA/ngpt model.py@ed19eb2 (Block with use_nGPT=1: query/key/value/att_c_proj, "
         "c_fc/mlp_c_proj, sqk, suv, attn_alpha, mlp_alpha; upstream's RoPE; config attention_config="
         "{'num_heads': H}, base_scale read from config.base_scale)",
         rules=[Named(r"(query|key|value|att_c_proj|c_fc|mlp_c_proj)\.weight", True),
                Named(r"(query|key|value|att_c_proj|c_fc|mlp_c_proj)\.bias|sqk|suv|attn_alpha|mlp_alpha", False)],
         required=("query.weight", "key.weight", "value.weight", "att_c_proj.weight", "c_fc.weight",
                   "mlp_c_proj.weight", "sqk", "suv", "attn_alpha", "mlp_alpha"),
         call=_ngpt_call, build=_x_last("attn_alpha"), attrs={"base_scale": "config.base_scale"}),
    Spec("simplified_block_he_hofmann", "bobby-he/simplified_transformers simplified_transformers/model_utils.py@8d4ea79 "
         "(myGPT2Block with the skipless-parallel config: parallel_layers, norm_type='none' (ln_1 in layer 0 only), "
         "myGPT2Attention with identity values (a MyConv1D v_attn in layer 0) and projection, myGPT2MLP; "
         "config attention_config={'num_heads': H}; norm='layer' is inferred from ln_1)",
         rules=[Named(r"ln_1\.(weight|bias)|(attn|mlp)_block_resid_gain|mlp_block_skip_gain|attn\.qk_attn\.(weight|bias)"
                      r"|mlp\.c_(fc|proj)\.weight|attn\.v_attn\.(weight|resid_gain|skip_gain)", False),
                *[Reshape(f"attn.{g}", lambda n: (1, n, 1, 1)) for g in ("attn_mat_resid_gain", "attn_mat_skip_gain",
                                                                         "centre_attn_gain")],
                Derived(r"attn_block_skip_gain"),
                _ZeroDropped(r"mlp\.c_(fc|proj)\.bias|attn\.v_attn\.bias",
                             "refattn's SAS-P MLP and value map have no biases (upstream: MyConv1D(bias=False))")],
         required=("attn.qk_attn.weight", "attn.attn_mat_resid_gain", "mlp.c_fc.weight", "attn_block_resid_gain"),
         call=_sas_call, build=_x_last("mlp.c_fc.weight"),
         infer=lambda keys: {"norm": "layer" if "ln_1.weight" in keys else "none"}, attrs={"eps": "ln_1.eps"},
         unsupported={"attn.c_proj.weight": "a trainable projection is not part of SAS-P (proj_resid_gain = 0)",
                      "attn.q_norm.scale": "qk_norm_type='rmsnorm' is not reproduced"}),
    Spec("tnt_block", "huawei-noah/CV-Backbones tnt_pytorch/tnt.py@25531f7 (Block with se=0: Attention with a fused qk "
         "projection, Mlp; one class token; check_module compares the outer tokens (outputs='outer'), through "
         "which every parameter gets its gradient; config inner_attention_config / outer_attention_config = "
         "{'num_heads': H})",
         rules=_tnt_attn("inner") + _tnt_attn("outer")
         + [Named(r"(inner|outer)_mlp\.fc[12]\.weight|proj\.weight", True),
            Named(r"(inner|outer)_norm[12]\.(weight|bias)|proj_norm[12]\.(weight|bias)|(inner|outer)_mlp\.fc[12]\.bias",
                  False)],
         required=("inner_attn.qk.weight", "outer_attn.qk.weight", "proj.weight", "proj_norm1.weight"),
         call=_tnt_call, build=_tnt_build, attrs={"eps": "outer_norm1.eps"}, defaults={"outputs": "outer"},
         unsupported={"se_layer.fc.1.weight": "the SE module (se > 0) is not reproduced"}),
    Spec("looped_transformer", "Leiay/looped_transformer scripts/models.py@6b3bdb2 (TransformerModelLooped: its loop "
         "of f on the embedded prompt, loop_func 'z=f(x+z)' = injection 'add', 'z=f(x*z)' = 'mul'; "
         "scripts/nano_gpt.py GPT2Model backbone with fused c_attn; module_prefix '_backbone.transformer.', "
         "read_in/read_out are outside; config n_loops, attention_config={'num_heads': H, 'is_causal': True})",
         rules=_looped_rules, required=("wpe.weight", "h.0.attn.c_attn.weight", "ln_f.weight"),
         call=_looped_call, build=_x_last("wpe.weight", axis=1), module_prefix="_backbone.transformer.",
         attrs={"num_layers": "_backbone.config.n_layer"}),
    Spec("moe_topk_gating", "huggingface/transformers src/transformers/models/mixtral/modeling_mixtral.py@00d4b3d "
         "(MixtralSparseMoeBlock with MixtralBlockSparseTop2MLP experts w1/w3/w2, eval mode: no jitter; "
         "forward returns (hidden_states, router_logits), the first is compared)",
         rules=[Named(r"gate\.weight|experts\.\d+\.w[123]\.weight", True)],
         required=("gate.weight", "experts.0.w1.weight", "experts.0.w2.weight", "experts.0.w3.weight"),
         call=lambda module, inp, cfg: module(inp["x"])[0], build=_x_last("gate.weight"),
         attrs={"num_experts_per_tok": "top_k"}),
    Spec("mixture_of_head_attention", "SkyworkAI/MoH MoH-DiT/models.py@66bb340 (MoHAttention with timm's "
         "non-fused attention path, qk_norm off: qkv, proj, gates wg, wg_0, wg_1; its load-balancing loss, "
         "kept in refattn's cache, is not compared)",
         rules=[Named(r"(qkv|proj|wg|wg_0|wg_1)\.weight", True), Named(r"(qkv|proj)\.bias", False)],
         required=("qkv.weight", "proj.weight"), call=call_x, build=_x_last("proj.bias"),
         attrs={"num_heads": "num_heads", "shared_heads": "shared_head", "routed_heads": "routed_head"}),
    Spec("gated_memory_unit", "microsoft/ArchScale lit_gpt/gated_memory_unit.py@df4e070 (GMU: in_proj, out_proj, the "
         "swiglu kernel; use_norm: lit_gpt/ops/layernorm_gated.py RMSNorm with norm_before_gate=False, inferred "
         "from norm.weight; config ngroups = d_mem / norm.group_size; an ArchScale Block's keys under 'attn.gmu.')",
         rules=[Named(r"(in|out)_proj\.weight", True), Named(r"(in|out)_proj\.bias|norm\.weight", False)],
         required=("in_proj.weight", "out_proj.weight"), call=_gmu_call, build=_gmu_build,
         infer=lambda keys: {"use_norm": "norm.weight" in keys}, attrs={"eps": "norm.eps"}),
]

add_specs(*_SPECS)

GROUP_SLUGS = tuple(s.key for s in _SPECS)
"""The keys this module adds to :data:`~refattn.interop.torch_specs.SPECS`."""
