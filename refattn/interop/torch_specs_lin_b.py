r"""Rows of the :mod:`refattn.interop.torch` table for group ``lin_b`` (linear-family mechanisms and
the Converter block), beside :mod:`refattn.interop.torch_specs`.

Each :class:`~refattn.interop.torch_specs.Spec` here maps a mechanism whose registry record's
forward is the upstream module's forward and whose params already carry the upstream names; it is
registered with the public :func:`~refattn.interop.torch_specs.add_specs` into the same
:data:`~refattn.interop.torch_specs.SPECS` that :mod:`refattn.interop.torch` reads (that module
imports this one). Mechanisms of the group that have no PyTorch ``state_dict`` to read are listed
with :func:`~refattn.interop.unmapped.add_unmapped`. The reference modules the tests run are in
``tests/_upstream_lin_b.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .torch_specs import Derived, Named, Rename, Spec, Split, add_specs, x_build

__all__ = ["GROUP_SLUGS"]


# ---- Deformable DETR MSDeformAttn: forward(query, reference_points, input_flatten, input_spatial_shapes,
# input_level_start_index); the level count is read from attention_weights' width (heads x levels x points)

_MSDA_SHAPES = ((3, 4), (2, 3), (2, 2), (1, 3), (2, 1))


def _msda_build(rng, p, cfg, z):
    """Levels of the shapes above (as many as the module has) unless the config gives ``spatial_shapes``;
    point references (B, Lq, L, 2), or box references (cx, cy, w, h) for the cases of 5 and 7 queries."""
    c = p["value_proj.weight"].shape[0]
    nl = p["attention_weights.weight"].shape[1] // (int(cfg["n_heads"]) * int(cfg.get("n_points", 4)))
    shapes = cfg.get("spatial_shapes") or tuple(_MSDA_SHAPES[i % len(_MSDA_SHAPES)] for i in range(nl))
    shapes = tuple((int(h), int(w)) for h, w in shapes)
    s = sum(h * w for h, w in shapes)
    box = z["n"] in (5, 7)
    ref = rng.uniform(0.1, 0.9, (z["b"], z["n"], nl, 2))
    if box:
        ref = np.concatenate([ref, rng.uniform(0.2, 0.6, (z["b"], z["n"], nl, 2))], axis=-1)
    return ({"query": rng.standard_normal((z["b"], z["n"], c)), "reference_points": ref,
             "input_flatten": rng.standard_normal((z["b"], s, c))}, {"spatial_shapes": shapes})


def _msda_call(module, inp, cfg):
    import torch

    shapes = torch.as_tensor(cfg["spatial_shapes"], dtype=torch.long)
    start = torch.cat([shapes.new_zeros(1), (shapes[:, 0] * shapes[:, 1]).cumsum(0)[:-1]])
    return module(inp["query"], inp["reference_points"], inp["input_flatten"], shapes, start)


# ---- CLEAR LocalDownsampleFlexAttnProcessor: its attention on the projected (q, k, v) of (B, heads, T + H*W, d);
# upstream's globals HEIGHT, WIDTH and the block mask's text_length, window_size are module attributes here


@dataclass(frozen=True)
class _CellWeight:
    """CLEAR's ``spatial_weight (1, 1, 1, f, 1, f, 1)`` as refattn's ``(f, f)`` (the same entries)."""

    name: str = "spatial_weight"

    def load(self, view, out):
        a = view.get(self.name)
        f = a.shape[3]
        if a.shape != (1, 1, 1, f, 1, f, 1):
            raise ValueError(f"params_from_state_dict[{view.slug}]: {view.prefix + self.name} must be "
                             f"(1, 1, 1, f, 1, f, 1), as upstream; got {tuple(a.shape)}")
        out[self.name] = a.reshape(f, f)

    def save(self, grads, out, used):
        if self.name in grads:
            used.add(self.name)
            g = np.asarray(grads[self.name])
            out[self.name] = g.reshape(1, 1, 1, g.shape[0], 1, g.shape[1], 1)


def _clear_build(rng, p, cfg, z):
    """(B, heads, T + H*W, d) with the grid of the config; heads and d vary with the case."""
    n = int(cfg.get("text_length", 0)) + int(cfg["height"]) * int(cfg["width"])
    shape = (z["b"], 1 + z["n"] % 3, n, 2 + z["m"] % 3)
    return {k: rng.standard_normal(shape) for k in ("q", "k", "v")}, {}


def _clear_call(module, inp, cfg):
    return module(inp["q"], inp["k"], inp["v"])


# ---- safari HyenaOperator: forward(u (B, L, D)), L <= l_max (the rows of filter_fn.pos_emb.z); the buffers t and
# deltas upstream computes from the config are read and dropped (refattn rebuilds them from the same config)


def _hyena_build(rng, p, cfg, z):
    n = min(z["n"], p["filter_fn.pos_emb.z"].shape[1])
    return {"u": rng.standard_normal((z["b"], n, p["in_proj.weight"].shape[0]))}, {}


# ---- stripedhyena ParallelHyenaFilter: forward(u (B, L, 3D)) -> (y, inference_params), its parallel (FFT) path


def _lh_build(rng, p, cfg, z):
    return {"u": rng.standard_normal((z["b"], z["n"], p["short_filter_weight"].shape[0]))}, {}


# ---- SeqCond SeqCondAttention: forward(x); out_expand_factor is read off W_readout (K, 2H, 2H out_expand_factor),
# since upstream keeps only the product


def _seqcond_build(rng, p, cfg, z):
    w = p["W_readout"]
    return ({"x": rng.standard_normal((z["b"], z["n"], p["in_proj.weight"].shape[0]))},
            {"out_expand_factor": w.shape[2] // w.shape[1]})


# ---- Adaptive Filter Attention MultiheadIsotropicAFA (the notebook's flags): forward(Z_q, Z_k, Z_v) on (B, 1, L, d_e),
# returning (out, output_dict); L = args.seq_len (its causal_mask buffer, read and dropped). Upstream's gate P_scale
# is a plain tensor attribute outside the state_dict: register it as a buffer ``P_scale (1, 1, H, d, 1)`` first


@dataclass(frozen=True)
class _GateScale:
    """AFA's ``P_scale (1, 1, H, d, 1)`` as refattn's ``(H, d)``."""

    name: str = "P_scale"

    def load(self, view, out):
        if not view.has(self.name):
            raise ValueError(f"params_from_state_dict[{view.slug}]: the state_dict has no {view.prefix + self.name!r}: "
                             f"MultiheadIsotropicAFA keeps its gate as a plain attribute; register it first, e.g. "
                             f"module.register_buffer('P_scale', module.P_scale) with shape (1, 1, H, d, 1)")
        a = view.get(self.name)
        if a.ndim != 5 or a.shape[:2] != (1, 1) or a.shape[4] != 1:
            raise ValueError(f"params_from_state_dict[{view.slug}]: {view.prefix + self.name} must be (1, 1, H, d, 1); "
                             f"got {tuple(a.shape)}")
        out[self.name] = a[0, 0, :, :, 0]

    def save(self, grads, out, used):
        if self.name in grads:
            used.add(self.name)
            out[self.name] = np.asarray(grads[self.name])[None, None, :, :, None]


def _afa_build(rng, p, cfg, z):
    n = int(cfg.get("seq_len") or z["n"])
    c = p["W_q.weight"].shape[0]
    return {k: rng.standard_normal((z["b"], n, c)) for k in ("z_q", "z_k", "z_v")}, {}


def _afa_call(module, inp, cfg):
    return module(inp["z_q"][:, None], inp["z_k"][:, None], inp["z_v"][:, None])[0][:, 0]


# ---- DARTS-GT NASLayer's attention sub-block (gnns_type_used=1, routing_mode 'nas', global 'Transformer', no kv norm):
# forward(x (B, N, C), adj (B, N, N)), one graph per batch entry; the adjacency is a 0/1 input that is not differentiated


def _darts_build(rng, p, cfg, z):
    n, c = z["n"] + 2, p["self_attn.q_proj"].shape[0]
    adj = (rng.random((z["b"], n, n)) < 0.4).astype(float)
    adj = np.maximum(adj, np.swapaxes(adj, 1, 2)) * (1 - np.eye(n))
    adj[:, -1, :] = adj[:, :, -1] = 0  # an isolated node (SAGE's empty max, GCN/GAT's self loop alone)
    return {"x": rng.standard_normal((z["b"], n, c)), "adj": adj}, {}


_DARTS_FF = {f"ff_linear{i}.{w}": "NASLayer's feed-forward block after the attention is not part of the record"
             for i in (1, 2) for w in ("weight", "bias")}

# ---- Converter ConverterEncoder without its embedding: forward(x (B, N, D)); cheb_coef has one row per batch slot
# (batch_size, K+1), so the draw uses that batch; N >= 2 and a multiple of permutation_dim


def _converter_build(rng, p, cfg, z):
    b = p["kernelution.seq_kernel_poly.cheb_coef"].shape[0]
    m = int(cfg.get("permutation_dim") or 1)
    n = -(-max(z["n"], 2) // m) * m
    return {"x": rng.standard_normal((b, n, p["kernelution.value_linear_real.weight"].shape[0]))}, {}


_CONVERTER_EMBED = {"embedding.token_embed.weight": "ConverterEncoder's embedding is not part of the record: map the "
                                                    "block (its keys without embedding.*), feed it embedded tokens"}
# ---- FlatFormer BasicLayer in one flattened-window order, as BasicBlock.forward applies it to its layer k:
# forward(x (B, N, C), coords (B, N, 2) (y, x)); the module under test holds the BasicLayer's parameters at its top
# level and the order's settings (axis, shifted, window_shape, sparse_shape) as attributes. The integer coords are
# the record's argument before params (not keyword-only, not a float input): the builder passes them through the
# config (build_keys)


def _flat_build(rng, p, cfg, z):
    """Distinct coordinates per batch element in the sparse grid; at least ``group_size`` tokens (upstream
    pads a short element from the one before it), so one_token becomes one full group."""
    sx, sy = tuple(cfg.get("sparse_shape", (468, 468, 1)))[:2]
    n = max(z["n"], int(cfg.get("group_size", 69)))
    flat = np.stack([rng.choice(sx * sy, n, replace=False) for _ in range(z["b"])])
    coords = np.stack([flat // sx, flat % sx], axis=-1)
    return {"x": rng.standard_normal((z["b"], n, p["fc1.weight"].shape[0]))}, {"coords": coords}


def _flat_call(module, inp, cfg):
    import torch

    return module(inp["x"], torch.as_tensor(np.asarray(cfg["coords"]), dtype=torch.long))


# ---- ConDaFormer Window_Attention: forward(x (B, N, C), coords (B, N, 3), xyz (B, N, 3)), one cloud per batch entry,
# with the repository's own spconv (libs/spconv/conv.py: grouped depthwise kernels, KRSC weights)


@dataclass(frozen=True)
class _Spconv1x1:
    """A 1x1x1 ``SubMConv3d`` weight, KRSC ``(out, 1, 1, 1, in)``, which spconv's conv1x1 path applies as
    ``features @ weight.view(in, out)`` (a reinterpretation of the storage, not a transpose): refattn's
    torch-layout ``(out, in, 1, 1, 1)`` is that matrix transposed."""

    name: str

    def load(self, view, out):
        a = view.get(self.name)
        if a.ndim != 5 or a.shape[1:4] != (1, 1, 1):
            raise ValueError(f"params_from_state_dict[{view.slug}]: {view.prefix + self.name} must be spconv's KRSC "
                             f"(out, 1, 1, 1, in); got {tuple(a.shape)}")
        o, i = a.shape[0], a.shape[4]
        out[self.name] = a.reshape(i, o).T.reshape(o, i, 1, 1, 1)

    def save(self, grads, out, used):
        if self.name in grads:
            used.add(self.name)
            g = np.asarray(grads[self.name])
            o, i = g.shape[:2]
            out[self.name] = g.reshape(o, i).T.reshape(o, 1, 1, 1, i)


@dataclass(frozen=True)
class _SpconvDepthwise:
    """A depthwise ``SubMConv3d(groups=C)`` weight, KRSC ``(C, k, k, k, 1)`` (spconv multiplies it by a diagonal
    group_mask), as torch's ``(C, 1, k, k, k)``."""

    name: str

    def load(self, view, out):
        a = view.get(self.name)
        if a.ndim != 5 or a.shape[4] != 1:
            raise ValueError(f"params_from_state_dict[{view.slug}]: {view.prefix + self.name} must be spconv's KRSC "
                             f"(C, k, k, k, 1) of a depthwise kernel; got {tuple(a.shape)}")
        out[self.name] = a.transpose(0, 4, 1, 2, 3)

    def save(self, grads, out, used):
        if self.name in grads:
            used.add(self.name)
            out[self.name] = np.asarray(grads[self.name]).transpose(0, 2, 3, 4, 1)


_CONDA_BN = r"(conv_1|conv_1_post)\.1|(conv_3|conv_3_post)\.[14]"


def _conda_build(rng, p, cfg, z):
    """Distinct voxel sites in a 3^3 grid and positions inside their voxels (refattn's sampler's cloud); they
    replace the defaults' placeholders ``coords = xyz = None``."""
    coords, xyz = [], []
    for _ in range(z["b"]):
        flat = rng.choice(27, size=z["n"], replace=False)
        c = np.stack(np.unravel_index(flat, (3, 3, 3)), axis=-1)
        coords.append(c)
        xyz.append(c + rng.uniform(0.1, 0.4, c.shape) + 0.5 * rng.integers(0, 2, c.shape))
    return ({"x": rng.standard_normal((z["b"], z["n"], p["qkv.weight"].shape[0]))},
            {"coords": np.stack(coords), "xyz": np.stack(xyz)})


def _conda_call(module, inp, cfg):
    import torch

    return module(inp["x"], torch.as_tensor(np.asarray(cfg["coords"])), torch.as_tensor(np.asarray(cfg["xyz"])))


_SPECS = [
    Spec("multiscale_deformable_attention",
         "fundamentalvision/Deformable-DETR models/ops/modules/ms_deform_attn.py@11169a6 (MSDeformAttn; "
         "forward(query, reference_points, input_flatten, input_spatial_shapes, input_level_start_index), its "
         "CUDA function replaced by models/ops/functions/ms_deform_attn_func.py ms_deform_attn_core_pytorch; "
         "point and box references)",
         rules=[Named(r"(sampling_offsets|attention_weights|value_proj|output_proj)\.weight", True),
                Named(r"(sampling_offsets|attention_weights|value_proj|output_proj)\.bias", False)],
         required=("sampling_offsets.weight", "attention_weights.weight", "value_proj.weight", "output_proj.weight"),
         call=_msda_call, build=_msda_build, attrs={"n_heads": "n_heads", "n_points": "n_points"},
         defaults={"spatial_shapes": None}),
    Spec("local_window_attention_variants",
         "Huage001/CLEAR attention_processor.py@98e9fed (LocalDownsampleFlexAttnProcessor with "
         "init_local_downsample_mask_flex: its attention on projected q, k, v (B, heads, T + H*W, d), flex_attention "
         "as SDPA under the same mask, the text length 512 as text_length; forward(q, k, v))",
         rules=[_CellWeight()], required=("spatial_weight",), call=_clear_call, build=_clear_build,
         attrs={"height": "height", "width": "width", "text_length": "text_length", "radius": "window_size",
                "down_factor": "down_factor"}),
    Spec("stack_attention",
         "bdusell/stack-attention src/stack_attention/superposition.py@244167a (SuperpositionStackAttention on "
         "stack_attention.py StackAttention and stack_rnn_models/joulin_mikolov.py JoulinMikolovStack; "
         "forward(x, include_first=False))",
         rules=[Named(r"(action_layer|input_to_pushed_vector_layer|stack_reading_to_output_layer)\.linear\.weight",
                      True)],
         required=("action_layer.linear.weight", "input_to_pushed_vector_layer.linear.weight",
                   "stack_reading_to_output_layer.linear.weight"),
         call=lambda module, inp, cfg: module(inp["x"], include_first=False),
         build=x_build("action_layer.linear.weight")),
    Spec("seqcond_attention",
         "kerighan/seqcond seqcond/torch/seqcond.py@360d9d6 (SeqCondAttention.forward(x) with seqcond/torch/norm.py "
         "GatedRMSNorm; expand_factor by config)",
         rules=[Named(r"(in_proj|gate_proj|out_proj)\.weight", True),
                Named(r"conv_weight|theta_raw|theta_d_raw|w_int_raw|decay_slopes|anchor_slopes|score_scale|score_bias"
                      r"|phase_scale|gated_norm\.weight|W_readout", False)],
         required=("in_proj.weight", "conv_weight", "w_int_raw", "gate_proj.weight", "W_readout", "out_proj.weight"),
         call=lambda module, inp, cfg: module(inp["x"]), build=_seqcond_build,
         attrs={"num_heads": "K", "num_query_heads": "K_q", "num_anchor_heads": "num_anchor_heads",
                "num_thetas": "M", "conv_kernel_size": "conv_kernel_size", "maxlen": "maxlen"}),
    Spec("adaptive_filter_attention",
         "PCR-git/Adaptive-Filter-Attention model/multihead_isotropic_AFA.py@dc4f7b7 (MultiheadIsotropicAFA with "
         "isotropic_afa/simplified_precision_utils.py, model/model_utils.py compute_lambda, utils/complex_ops.py; the "
         "flags of Main.ipynb; forward(Z_q, Z_k, Z_v)[0] on (B, 1, L, d_e), L = args.seq_len; its P_scale attribute "
         "registered as a buffer (1, 1, H, d, 1); the causal_mask buffer is read and dropped)",
         rules=[Named(r"W_[qkvo]\.weight", True), Named(r"W_[qkvo]\.bias|lambda_imag_v|(mu|sigma|eta|gamma)_v|tau|nu_sqrt",
                                                           False),
                _GateScale(), Derived(r"causal_mask")],
         required=("W_q.weight", "W_k.weight", "W_v.weight", "W_o.weight", "lambda_imag_v", "mu_v", "tau", "nu_sqrt"),
         call=_afa_call, build=_afa_build, attrs={"num_heads": "n_heads", "seq_len": "args.seq_len"}),
    Spec("two_mamba_second_order_attention",
         "gmongaras/2Mamba2Furious GPT_Trainer/LlamaDecoderLayerClean.py@7ad98b5 (LlamaAttention with attention_type "
         "squared__sm_norm__A_mask_type_neg_softplus__in_conv_k_2, the explicit path forwrd_gated (use_kernel=False; "
         "the Triton kernel computes the same); forward(x, None, None)[0]; its attn_mask buffer is read and dropped)",
         rules=[Named(r"(qkv_proj|A_mask_proj|o_proj)\.weight", True),
                Named(r"(qkv_proj|A_mask_proj|o_proj|conv1d)\.bias|conv1d\.weight", False), Derived(r"attn_mask")],
         required=("qkv_proj.weight", "conv1d.weight", "conv1d.bias", "A_mask_proj.weight", "o_proj.weight"),
         call=lambda module, inp, cfg: module(inp["x"], None, None)[0], build=x_build("qkv_proj.weight"),
         attrs={"num_heads": "num_heads"}),
    Spec("darts_gt_asymmetric_attention",
         "shrutiOx/DARTS_GT DARTS_GT_LRGB/dartsgt/layer/NAS_layer.py@41e59de (NASLayer's KV path and attention with "
         "gnns_type_used=1 (PyG GINConv, GCNConv, GATConv, SAGEConv('max')), routing_mode 'nas' (nni InputChoice "
         "alpha), global_model_type 'Transformer', batch_norm = layer_norm = False; forward(x, adj) on dense graphs; "
         "GATConv's lin_edge/att_edge (unused: the candidates run without edge features) and GINConv's eps buffer "
         "(0) are read and dropped)",
         rules=[Named(r"kv_model\.\d+\.(nn\.[02]|lin|lin_l|lin_r)\.weight", True),
                Named(r"kv_model\.\d+\.((nn\.[02]|lin_l)\.bias|bias|att_src|att_dst)|input_choice\.alpha", False),
                Split(("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), "self_attn.in_proj_weight", True),
                Split(("self_attn.q_proj_bias", "self_attn.k_proj_bias", "self_attn.v_proj_bias"),
                      "self_attn.in_proj_bias", False),
                Rename("self_attn.out_proj", "self_attn.out_proj.weight", True),
                Rename("self_attn.out_proj_bias", "self_attn.out_proj.bias", False),
                Derived(r"kv_model\.\d+\.(lin_edge\.weight|att_edge|eps)")],
         required=("input_choice.alpha", "self_attn.in_proj_weight", "self_attn.in_proj_bias",
                   "self_attn.out_proj.weight", "self_attn.out_proj.bias"),
         call=lambda module, inp, cfg: module(inp["x"], inp["adj"]), build=_darts_build,
         attrs={"num_heads": "self_attn.num_heads"}, unsupported=_DARTS_FF),
    Spec("converter_digraph_convolution",
         "hazdzz/converter model/encoder/converter.py@dccb8f2 (ConverterEncoder without its embedding: Kernelution "
         "(GenerateEigenvalue, GenerateParameters, KernelPolynomial, DHHPTransform, InverseDHHPTransform), "
         "GatedFeedForward, model/norm.py ScaleNorm/FixNorm, utils/pscan.py as its plain loop (PScan's own backward "
         "is wrong for complex inputs); forward(x); kernel_type by config)",
         rules=[Named(r"kernelution\.(seq_eigenvalue|givens_parameters)\.siren\.[04]\.weight"
                      r"|kernelution\.value_linear_(real|imag)\.weight|gffn\.linear(1_real|1_imag|2)\.weight", True),
                Named(r"kernelution\.(seq_eigenvalue|givens_parameters)\.siren\.([04]\.bias|2\.weight)"
                      r"|kernelution\.seq_kernel_poly\.cheb_coef|gffn\.linear(1_real|1_imag|2)\.bias"
                      r"|(kernelution_norm|gffn_norm)\.weight|alpha", False)],
         required=("kernelution.seq_eigenvalue.siren.0.weight", "kernelution.givens_parameters.siren.0.weight",
                   "kernelution.seq_kernel_poly.cheb_coef", "kernelution.value_linear_real.weight",
                   "gffn.linear2.weight", "kernelution_norm.weight", "gffn_norm.weight", "alpha"),
         call=lambda module, inp, cfg: module(inp["x"]), build=_converter_build, unsupported=_CONVERTER_EMBED,
         attrs={"enable_kpm": "kernelution.enable_kpm", "permutation_dim": "kernelution.dhhp_transform.M",
                "mu": "kernelution.seq_kernel_poly.mu", "xi": "kernelution.seq_kernel_poly.xi",
                "stigma": "kernelution.seq_kernel_poly.stigma", "heta": "kernelution.seq_kernel_poly.heta",
                "eps": "gffn_norm.eps"}),
    Spec("condaformer_planar_window_attention",
         "LHDuan/ConDaFormer pcr/models/condaformer/modules.py@1fa596e (Window_Attention.forward with "
         "forward_qkv_one_pass, pcr/models/condaformer/utils.py get_indices_params, the sptr tri-plane kernels' "
         "arithmetic, libs/spconv/conv.py SubMConv3d (KRSC weights; conv1x1 as weight.view(in, out); depthwise "
         "kernels times a diagonal group_mask); forward(x, coords, xyz) per cloud; the submanifold 3x3x3 conv read "
         "as the dense correlation at the sites (spconv's semantics, not run here); BN in eval form, its "
         "num_batches_tracked read and dropped; window_size, quant_size by config)",
         rules=[Named(r"(qkv|proj|(conv_3|conv_3_post)\.3)\.weight", True),
                Named(r"(qkv|proj|(conv_3|conv_3_post)\.3)\.bias|[qkv]_table"
                      r"|(" + _CONDA_BN + r")\.(weight|bias|running_mean|running_var)", False),
                _Spconv1x1("conv_1.0.weight"), _Spconv1x1("conv_1_post.0.weight"),
                _SpconvDepthwise("conv_3.0.weight"), _SpconvDepthwise("conv_3_post.0.weight"),
                Derived(r"(" + _CONDA_BN + r")\.num_batches_tracked")],
         required=("qkv.weight", "proj.weight", "q_table", "k_table", "v_table", "conv_1.0.weight",
                   "conv_3.0.weight", "conv_1_post.0.weight", "conv_3_post.0.weight"),
         call=_conda_call, build=_conda_build, attrs={"num_heads": "num_heads", "shift": "shift_win"},
         defaults={"coords": None, "xyz": None}),
    Spec("flatformer_flattened_window_attention",
         "mit-han-lab/flatformer mmdet3d/models/middle_encoders/flatformer.py@31dc5a9 (BasicLayer with GroupAttention, "
         "FlashAttention (flash-attn's packed kernel as SDPA per group), FlattenedWindowMapping, PositionalEmbedding, "
         "get_window_coors_shift, applied in one order as BasicBlock.forward does; forward(x, coords); window_shape "
         "and sparse_shape by config)",
         rules=[Named(r"attn\.attn\.(in_proj_weight|out_proj\.weight)|fc[12]\.weight", True),
                Named(r"attn\.attn\.(in_proj_bias|out_proj\.bias)|fc[12]\.bias|norm[12]\.(weight|bias)", False)],
         required=("attn.attn.in_proj_weight", "attn.attn.out_proj.weight", "fc1.weight", "fc2.weight",
                   "norm1.weight", "norm2.weight"),
         call=_flat_call, build=_flat_build,
         attrs={"num_heads": "attn.attn.num_heads", "group_size": "attn.group_size",
                "pos_temperature": "pos_temperature", "normalize_pos": "normalize_pos", "shifted": "shifted"},
         build_keys=("coords",)),
    Spec("hyena_operator",
         "HazyResearch/safari src/models/sequence/hyena.py@02220c6 (HyenaOperator with HyenaFilter, "
         "PositionalEmbedding, ExponentialModulation, Sin, fftconv_ref; forward(u); num_heads = num_blocks = "
         "inner_factor = 1, no outer_mixing / post_order_ffn; fast_decay_pct, slow_decay_pct, target by config, "
         "since upstream keeps only the deltas they give)",
         rules=[Named(r"(in_proj|out_proj|filter_fn\.implicit_filter\.\d+)\.weight", True),
                Named(r"(in_proj|out_proj|short_filter|filter_fn\.implicit_filter\.\d+)\.bias|short_filter\.weight"
                      r"|filter_fn\.bias|filter_fn\.pos_emb\.z|filter_fn\.implicit_filter\.\d+\.freq", False),
                Derived(r"filter_fn\.pos_emb\.t|filter_fn\.modulation\.deltas")],
         required=("in_proj.weight", "short_filter.weight", "filter_fn.bias", "filter_fn.pos_emb.z", "out_proj.weight"),
         call=lambda module, inp, cfg: module(inp["u"]), build=_hyena_build,
         attrs={"order": "order", "shift": "filter_fn.modulation.shift", "modulate": "filter_fn.modulation.modulate",
                "use_bias": "filter_fn.use_bias"}),
    Spec("laughing_hyena_modal_ssm",
         "togethercomputer/stripedhyena stripedhyena/model.py, stripedhyena/engine.py@7e13f61 (ParallelHyenaFilter."
         "parallel_forward with HyenaInferenceEngine.parallel_fir / parallel_iir, the FFT path; forward(u)[0]; "
         "hyena_filter_groups 1 (one system per channel) or hidden_size (one shared system), as upstream's "
         "repeat_interleave allows)",
         rules=[Named(r"D|short_filter_weight|short_filter_bias|poles|residues", False)],
         required=("D", "short_filter_weight", "short_filter_bias", "poles", "residues"),
         call=lambda module, inp, cfg: module(inp["u"])[0], build=_lh_build,
         attrs={"num_heads": "num_attention_heads", "column_split": "column_split_hyena"}),
]

add_specs(*_SPECS)

GROUP_SLUGS = tuple(s.key for s in _SPECS)
"""The keys this module adds to :data:`~refattn.interop.torch_specs.SPECS`."""
