r"""More rows of the :mod:`refattn.interop.torch` table, beside :mod:`refattn.interop.torch_specs`
(one module per group of rows keeps each under the line cap).

Each :class:`~refattn.interop.torch_specs.Spec` here maps a mechanism whose registry record's
forward is the upstream module's forward and whose params already carry the upstream names; it is
registered with the public :func:`~refattn.interop.torch_specs.add_specs` into the same
:data:`~refattn.interop.torch_specs.SPECS` that :mod:`refattn.interop.torch` reads (that module
imports this one). The reference modules the tests run are in ``tests/_upstream_layers.py``.
"""

from __future__ import annotations

import numpy as np

from .torch_specs import Derived, Named, Spec, add_specs

__all__ = ["EXTRA_SLUGS", "SONNET_N_ATOMS"]


# ---- PIBERT PhysicsBiasedAttention: forward(x, coords=None, pde_residuals=None, mask=None)


def _pibert_build(rng, p, cfg, z):
    c = p["q_proj.weight"].shape[0]
    r = rng.standard_normal((z["b"], z["n"], 3))
    r += 0.5 * np.where(r >= 0, 1.0, -1.0)  # the norm is not differentiable at 0: keep residuals away from it
    return {"x": rng.standard_normal((z["b"], z["n"], c)), "pde_residuals": r}, {}


def _pibert_call(module, inp, cfg):
    return module(inp["x"], pde_residuals=inp["pde_residuals"])


# ---- Sonnet CoherenceAttention: forward(coeffs (B, n_atoms, T, d_model)); scale = d_k ** -0.5 with
# d_k = n_atoms, which refattn reads from the coefficients' shape, so the draw uses n_atoms = 2

SONNET_N_ATOMS = 2
"""``n_atoms`` of the coefficients ``check_module`` draws for ``sonnet_mvca``: build the
``CoherenceAttention`` under test with ``d_k=2``."""


def _sonnet_build(rng, p, cfg, z):
    d = p["proj.weight"].shape[0]
    return {"coeffs": rng.standard_normal((z["b"], SONNET_N_ATOMS, z["n"], d))}, {}


def _sonnet_call(module, inp, cfg):
    c = inp["coeffs"]
    if getattr(module, "d_k", c.shape[1]) != c.shape[1]:
        raise ValueError(f"sonnet_mvca: refattn scales by sqrt(n_atoms) of the coefficients, and check_module "
                         f"draws n_atoms = {c.shape[1]}; build CoherenceAttention(d_model, d_k={c.shape[1]}, ...) "
                         f"(got d_k={module.d_k})")
    return module(c)


# ---- Transformer-Geometry CausalSelfAttention (nanoGPT): forward(x, pre_proj_self_value_op=, ...)


def _xsa_build(rng, p, cfg, z):
    return {"x": rng.standard_normal((z["b"], z["n"], p["c_attn.weight"].shape[0]))}, {}


def _xsa_call(module, inp, cfg):
    """Upstream ``CausalSelfAttention.forward`` with the pre-``c_proj`` self-value edit, as
    ``Block.forward`` calls it for ``xsa_forward_ref="self_value"``, ``xsa_forward_space="pre_o_proj"``."""
    return module(inp["x"], pre_proj_self_value_op=cfg.get("op", "remove_parallel"),
                  pre_proj_self_value_alpha=float(cfg.get("alpha", 1.0)),
                  pre_proj_subtract_scale=float(cfg.get("subtract_scale", 1.0)),
                  pre_proj_gamma=float(cfg.get("gamma", 1.0)))


# ---- Borji's KV Transformer MultiheadAttention_KV: forward(x); upstream picks the variant with the
# script-level attn_type ('kv' = positional=True, 'kv-nopos' = False), refattn with ``positional``

_KV_BASE = [Named(r"(kv|o)_proj\.weight", True), Named(r"(kv|o)_proj\.bias", False)]


def _kv_rules(config):
    """``map_pos`` is in every upstream state_dict; it is used (and mapped) only when positional."""
    if config.get("positional", False):
        return _KV_BASE + [Named(r"map_pos\.weight", True), Named(r"map_pos\.bias", False)]
    return _KV_BASE + [Derived(r"map_pos\.(weight|bias)")]


def _kv_build(rng, p, cfg, z):
    return {"x": rng.standard_normal((z["b"], z["n"], p["kv_proj.weight"].shape[0]))}, {}


def _kv_call(module, inp, cfg):
    return module(inp["x"])


# ---- VICON ICON_UNCROPPED: forward((init, end, c_mask)); frames (B, pairs, C, pH, pW)


def _vicon_build(rng, p, cfg, z):
    """Frames whose patches (C, h, w) multiply to ``pre_proj``'s input width (any factorisation
    is the same computation upstream: ``patchify`` reads C, h, w from the frames)."""
    width, pn = p["pre_proj.weight"].shape[0], int(cfg["patch_num"])
    h, w = next((h, w) for h, w in ((2, 3), (3, 2), (2, 2), (1, 2), (2, 1), (1, 1)) if width % (h * w) == 0)
    pairs = 1 + z["n"] % (p["func_pos_encoding"].shape[0] // 2)
    shape = (z["b"], pairs, width // (h * w), pn * h, pn * w)
    return {"init": rng.standard_normal(shape), "end": rng.standard_normal(shape)}, {}


def _vicon_call(module, inp, cfg):
    return module((inp["init"], inp["end"], None))


# ---- MossFormer MossFormerBlock (modelscope): forward(x); the shared RotaryEmbedding's frequencies
# (rotary_embedding_torch, a frozen parameter) are read and dropped: refattn rebuilds them


def _moss_infer(keys):
    return {"norm": "scalenorm" if "to_hidden.mdl.0.g" in keys else "layernorm",
            "rotary": any(k.startswith("rotary_pos_emb.") for k in keys)}


def _moss_build(rng, p, cfg, z):
    return {"x": rng.standard_normal((z["b"], z["n"], p["to_hidden.mdl.1.weight"].shape[0]))}, {}


_SPECS = [
    Spec("physics_biased_fourier_wavelet_attention",
         "Samsomyajit/pibert pibert/physics/physics_attention.py@0b48dea (PhysicsBiasedAttention; "
         "forward(x, pde_residuals=); lambda_param > 0, as check_module draws residuals)",
         rules=[Named(r"(q|k|v|out)_proj\.weight", True), Named(r"(q|k|v|out)_proj\.bias", False)],
         required=("q_proj.weight", "k_proj.weight", "v_proj.weight", "out_proj.weight"),
         call=_pibert_call, build=_pibert_build,
         attrs={"num_heads": "num_heads", "lambda_param": "lambda_param"}),
    Spec("sonnet_mvca", "ClaudiaShu/Sonnet sonnet/mts_model/models/Sonnet.py@0288de4 (CoherenceAttention; "
         "forward(coeffs); d_k = n_atoms = 2 in check_module's draw)",
         rules=[Named(r"(proj|var_mlp\.0|var_mlp\.2|out_proj)\.weight", True),
                Named(r"(proj|var_mlp\.0|var_mlp\.2|out_proj)\.bias|var_attn", False)],
         required=("proj.weight", "var_attn", "var_mlp.0.weight", "var_mlp.2.weight", "out_proj.weight"),
         call=_sonnet_call, build=_sonnet_build),
    Spec("value_parallel_suppression", "Shwai-He/Transformer-Geometry _imports/from_MMEBarch_research_snapshot_"
         "2026-05-09/neurips_supplement_anonymous_code/pretraining_nanogpt/core/model.py@ed6af0b "
         "(CausalSelfAttention with pre_proj_self_value_op; its causal-mask buffers are read and dropped)",
         rules=[Named(r"c_(attn|proj)\.weight", True), Named(r"c_(attn|proj)\.bias", False),
                Derived(r"bias|attn_additive_mask")],
         required=("c_attn.weight", "c_proj.weight"), call=_xsa_call, build=_xsa_build,
         attrs={"num_heads": "n_head", "use_rope": "use_rope", "rope_base": "rope_base"}),
    Spec("key_value_attention", "aliborji/kv-transformer Reverse_sort_pos.py@d9eafa5 (MultiheadAttention_KV; "
         "PositionalEncoding2D of tatp22/multidim-positional-encoding@efeb8d9; config positional=True for "
         "attn_type 'kv', False for 'kv-nopos')",
         rules=_kv_rules, required=("kv_proj.weight", "o_proj.weight"), call=_kv_call, build=_kv_build,
         attrs={"num_heads": "num_heads", "pos_dim": "map_pos.in_features"}),
    Spec("vicon_in_context_operator", "Eydcao/VICON src/models.py@be2e2dc (ICON_UNCROPPED, forward((init, end, "
         "c_mask)); src/model_utils.py patchify, depatchify, build_alternating_block_lowtri_mask; its mask "
         "buffer is read and dropped)",
         rules=[Named(r"(pre_proj|post_proj|transformer\.layers\.\d+\.(linear1|linear2))\.weight", True),
                Named(r"(pre_proj|post_proj|transformer\.layers\.\d+\.(linear1|linear2))\.bias"
                      r"|(patch|func)_pos_encoding|transformer\.layers\.\d+\.(norm1|norm2)\.(weight|bias)"
                      r"|transformer\.layers\.\d+\.self_attn\.in_proj_bias", False),
                Named(r"transformer\.layers\.\d+\.self_attn\.(in_proj_weight|out_proj\.weight)", True),
                Named(r"transformer\.layers\.\d+\.self_attn\.out_proj\.bias", False), Derived(r"mask")],
         required=("pre_proj.weight", "post_proj.weight", "patch_pos_encoding", "func_pos_encoding"),
         call=_vicon_call, build=_vicon_build,
         attrs={"num_heads": "transformer.layers.0.self_attn.num_heads", "patch_num": "cfg.patch_num_in",
                "use_patch_pos_encoding": "cfg.use_patch_pos_encoding",
                "use_func_pos_encoding": "cfg.use_func_pos_encoding",
                "layer_norm_eps": "transformer.layers.0.norm1.eps"}),
    Spec("mossformer_gated_joint_attention", "modelscope/modelscope modelscope/models/audio/separation/"
         "mossformer_block.py@2905da1 (MossFormerBlock with FFConvM, OffsetScale, ScaleNorm or LayerNorm; "
         "mossformer_conv_module.py MossFormerConvModule; rotary_embedding_torch RotaryEmbedding)",
         rules=[Named(r"to_(hidden|qk|out)\.mdl\.1\.weight", True),
                Named(r"to_(hidden|qk|out)\.mdl\.(0\.(g|weight|bias)|1\.bias|3\.sequential\.1\.conv\.weight)"
                      r"|qk_offset_scale\.(gamma|beta)", False), Derived(r"rotary_pos_emb\..*")],
         required=("to_hidden.mdl.1.weight", "to_qk.mdl.1.weight", "to_out.mdl.1.weight", "qk_offset_scale.gamma"),
         call=lambda module, inp, cfg: module(inp["x"]), build=_moss_build, infer=_moss_infer,
         attrs={"group_size": "group_size", "causal": "causal", "shift_tokens": "shift_tokens"}),
]

add_specs(*_SPECS)

EXTRA_SLUGS = tuple(s.key for s in _SPECS)
"""The keys this module adds to :data:`~refattn.interop.torch_specs.SPECS`."""
