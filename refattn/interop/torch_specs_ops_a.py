r"""Rows of the :mod:`refattn.interop.torch` table for neural-operator layers (group ``ops_a``).

Each :class:`~refattn.interop.torch_specs.Spec` here maps a neural-operator mechanism whose registry
record's forward is the upstream module's forward and whose params carry the upstream names (minus
the module path refattn does not keep, e.g. GNOBlock's ``integral_transform.``); it is registered
with :func:`~refattn.interop.torch_specs.add_specs` into the same
:data:`~refattn.interop.torch_specs.SPECS` that :mod:`refattn.interop.torch` reads (that module
imports this one). Grid operators map the battery's ``n`` to their grid (see each builder). The
reference modules the tests run are in ``tests/_upstream_ops_a.py``.

Where a record is one part of a bigger upstream module, the table reads that part's keys under the
block's submodule names: HATDiTBlock's ``adain_2.``, ``norm2.``, ``attn_channel.`` and GNOT's
``gatenet.``, ``moe_mlp1.`` (``params_from_state_dict(..., strict=False)`` takes them from the whole
block's ``state_dict``); MgNO_DC's layer ``i`` is ``conv_list.{i}.`` / ``linear_list.{i}.`` upstream
and ``conv.`` / ``linear.`` here, LocalNOBlocks' ``differential.{i}.`` / ``local_convs.{i}.`` are
``differential.`` / ``local_conv.`` here (rename the prefixes). Three rules beyond the shared ones live here: ``_Experts`` (per-expert
``nn.Linear`` stacked along a leading axis), ``_LinearOrConv`` (transposed only when 2-D) and
``_BasisColumns`` (the basis' columns of a DISCO weight).
"""

from __future__ import annotations

import re

import numpy as np

from .torch_specs import Complex, Derived, Named, Rename, Reshape, Spec, Strip, add_specs
from .unmapped import add_unmapped

__all__ = ["GROUP_SLUGS", "CNO_IN_SIZE", "LOCAL_NO_GRID"]


# ---- neuraloperator GNOBlock: forward(y, x, f_y); one point cloud shared by the batch upstream, one
# per batch element in refattn, so the module runs once per batch element


def _gno_build(rng, p, cfg, z):
    n_fc = sum(1 for k in p if k.endswith(".weight"))
    c_out = p[f"channel_mlp.fcs.{n_fc - 1}.weight"].shape[1]
    width = p["channel_mlp.fcs.0.weight"].shape[0]
    kind = cfg.get("transform_type", "linear")
    per = 1 if cfg.get("pos_embedding", "transformer") is None else 2 * int(cfg.get("pos_embedding_channels", 32))
    c_in = c_out if kind in ("linear", "nonlinear") else 0
    if kind == "nonlinear_kernelonly":  # the widths do not say d: 2-D points
        c_in = width - 2 * per * 2
    d = (width - (c_in if kind.startswith("nonlinear") else 0)) // (2 * per)
    inp = {"y": rng.uniform(0, 1, (z["b"], z["m"], d)), "x": rng.uniform(0, 1, (z["b"], z["n"], d))}
    # the first output point near the first input point: never an empty graph (no autograd path upstream)
    inp["x"][:, 0] = inp["y"][:, 0] + rng.uniform(-0.2, 0.2, (z["b"], d)) * float(cfg["radius"]) / np.sqrt(d)
    if kind != "linear_kernelonly":
        inp["f_y"] = rng.standard_normal((z["b"], z["m"], c_in))
    return inp, {}


def _gno_call(module, inp, cfg):
    import torch

    outs = []
    for i in range(inp["y"].shape[0]):
        f = inp["f_y"][i:i + 1] if "f_y" in inp else None
        o = module(inp["y"][i], inp["x"][i], f)
        outs.append(o if f is None else o[0])
    return torch.stack(outs)


# ---- CNO CNOBlock (cno_lrelu): forward(x (B, C, s, s)); the grid side s is the module's in_size, which
# refattn reads from x: check_module draws CNO_IN_SIZE

CNO_IN_SIZE = 8
"""Grid side of the inputs ``check_module`` draws for ``cno_convolutional_operator``: build the
``CNOBlock`` under test with ``in_size=8`` (any ``out_size``)."""


def _cno_infer(keys):
    return {"batch_norm": "eval" if "batch_norm.weight" in keys else None}


def _cno_build(rng, p, cfg, z):
    return {"x": rng.standard_normal((z["b"], p["convolution.weight"].shape[1], CNO_IN_SIZE, CNO_IN_SIZE))}, {}


def _cno_call(module, inp, cfg):
    s = inp["x"].shape[-1]
    if getattr(module, "in_size", s) != s:
        raise ValueError(f"cno_convolutional_operator: check_module draws grids of side {s}; build "
                         f"CNOBlock(..., in_size={s}, ...) (got in_size={module.in_size})")
    return module(inp["x"])


# ---- HO-FNO HO_block: forward(x (B, H, W, C)), channel-last; a grid of at least 2 m1 x 2 (m2 - 1) points


def _hofno_build(rng, p, cfg, z):
    c, m1, m2 = p["HO_conv.spec_convs.weights1_real"].shape
    h, w = 2 * m1 + z["n"] % 3, 2 * m2 + z["n"] % 2
    return {"x": rng.standard_normal((z["b"], h, w, c))}, {}


# ---- MgNO: MgNO_DC's loop body act(conv_list[i](u) + linear_list[i](u)), conv_list[i]'s keys under conv.,
# linear_list[i]'s under linear.; the V-cycle's shape is read from the keys


def _mgno_levels(keys) -> int:
    return 1 + max(int(m.group(1)) for k in keys if (m := re.match(r"conv\.layer(\d+)\.", k)))


def _mgno_infer(keys):
    levels, its = _mgno_levels(keys), []
    for lv in range(levels):
        pre = {int(m.group(1)) for k in keys if (m := re.match(rf"conv\.layer{lv}\.(\d+)\.S\.", k))}
        post = {int(m.group(1)) for k in keys if (m := re.match(rf"conv\.post_smooth_layer{lv}\.(\d+)\.S\.", k))}
        its.append((len(pre), len(post)))
    return {"num_iteration": tuple(its), "use_res": "conv.layer1.0.A.weight" in keys}


_MGNO_RULES = [Named(r"conv\..*\.(weight|bias)|linear\.(weight|bias)", False)]


def _mgno_load(keys):
    """The coarsest level's post-smoothing convolutions exist upstream but are never called: dropped."""
    return [Derived(rf"conv\.post_smooth_layer{_mgno_levels(keys) - 1}\..*")] + _MGNO_RULES


def _mgno_build(rng, p, cfg, z):
    levels = 1 + sum(1 for k in p if k.startswith("conv.RTlayers."))
    s = 2 ** (levels - 1) * (2 + z["n"] % 2)
    return {"u": rng.standard_normal((z["b"], p["linear.weight"].shape[1], s, s))}, {}


# ---- Multiwavelet MWT_CZ1d: forward(x (B, N, c, k)), N a power of two with at least L + 1 levels


def _mwt_build(rng, p, cfg, z):
    k = p["T0.weight"].shape[0]
    c = p["A.weights1_real"].shape[0] // k
    n = 2 ** (int(cfg.get("L", 0)) + 2 + z["n"] % 2)
    return {"x": rng.standard_normal((z["b"], n, c, k))}, {}


# ---- ANIE: the Encoder (model_blocks) solved by Integral_attention_solver_multbatch; the module under test is
# the Encoder, check_module runs the solver around it once per batch element (upstream shares the times)


def _anie_build(rng, p, cfg, z):
    m = p["first.weight"].shape[0] - 1
    times = np.sort(rng.uniform(0, 1, (z["b"], z["n"], 1)), axis=1)
    return {"f": rng.standard_normal((z["b"], z["n"], m)), "coords": times}, {}


def _anie_call(module, inp, cfg):
    """``Integral_attention_solver_multbatch(times, y_0, c=lambda x: f, d=lambda x: lam, Encoder=module,
    max_iterations=n_iterations, smoothing_factor=, global_error_tolerance=tol, output_support_tensors=True,
    accumulate_grads=(gradient == "unrolled")).solve()``, with the solver passed as ``module.solve``."""
    import torch

    grad = cfg.get("gradient", "unrolled")
    if grad != "unrolled" or not cfg.get("residual", True):  # accumulate_grads=False also detaches the times
        raise ValueError("anie_attentional_integral_equation: check_module runs upstream's solver with "
                         "accumulate_grads=True (gradient='unrolled') and its residual operator; upstream's "
                         "accumulate_grads=False detaches the coordinates too, so no coordinate gradient compares")
    outs = [module.solve(module, inp["coords"][i, :, 0], inp["f"][i:i + 1], lam=float(cfg.get("lam", 1.0)),
                         max_iterations=int(cfg.get("n_iterations", 3)),
                         smoothing_factor=float(cfg.get("smoothing_factor", 0.5)), tol=float(cfg.get("tol", 1e-6)),
                         accumulate_grads=True) for i in range(inp["f"].shape[0])]
    return torch.cat(outs)


# ---- Mamba Neural Operator SS2D: forward(x (B, L, d_model)); K = 2 orders (mamba_ops.py) or 4 over a
# square grid (mamba_ops_4.py, config scan_orders='cross2d')


def _mno_build(rng, p, cfg, z):
    d = p["in_proj.weight"].shape[0]
    n = (2 + z["n"] % 3) ** 2 if p["x_proj_weight"].shape[0] == 4 else z["n"]
    return {"x": rng.standard_normal((z["b"], n, d))}, {}


# ---- PDE-Transformer: HATDiTBlock's channel branch (adain_2, norm2, attn_channel); forward(x, emb)


def _pdet_build(rng, p, cfg, z):
    d = p["norm2.weight"].shape[0]
    c = 1 + z["n"] % 4  # physical channels: the attention's sequence
    return {"x": rng.standard_normal((z["b"], c, z["m"], d)), "emb": rng.standard_normal((z["b"], c, d))}, {}


# ---- PINNsFormer: forward(x, t), the pseudo-sequences (N, K, 1) each (refattn's num_step=None form)


def _pinns_build(rng, p, cfg, z):
    return {"x": rng.uniform(0, 1, (z["b"], z["n"], 1)), "t": rng.uniform(0, 1, (z["b"], z["n"], 1))}, {}


_PINNS_LINEAR = r"(linear_emb|linear_out\.[024]|(en|de)coder\.layers\.\d+\.(attn\.out_proj|ff\.linear\.[024]))\.weight"

# ---- GNOT geometric gating: MIOECrossAttentionBlock's gatenet + moe_mlp1 experts, stacked along a leading axis


class _Experts:
    """``{up}.{e}.{j}.weight`` / ``.bias`` (``nn.Linear`` of expert ``e``) stacked into refattn's
    ``{ref}.{j}.weight (E, in, out)`` (each transposed) and ``{ref}.{j}.bias (E, out)``."""

    def __init__(self, up: str, ref: str, layers=(0, 2)):
        self.up, self.ref, self.layers = up, ref, tuple(layers)

    def load(self, view, out):
        n = 0
        while view.has(f"{self.up}.{n}.{self.layers[0]}.weight"):
            n += 1
        for j in self.layers:
            for leaf in ("weight", "bias"):
                if view.has(f"{self.up}.0.{j}.{leaf}"):
                    arrs = [view.get(f"{self.up}.{e}.{j}.{leaf}") for e in range(n)]
                    out[f"{self.ref}.{j}.{leaf}"] = np.stack([a.T if leaf == "weight" else a for a in arrs])

    def save(self, grads, out, used):
        for j in self.layers:
            for leaf in ("weight", "bias"):
                key = f"{self.ref}.{j}.{leaf}"
                if key in grads:
                    used.add(key)
                    for e, g in enumerate(np.asarray(grads[key])):
                        out[f"{self.up}.{e}.{j}.{leaf}"] = g.T if leaf == "weight" else g


def _gnot_moe_build(rng, p, cfg, z):
    c, space = p["moe_mlp.0.weight"].shape[1], p["gatenet.0.weight"].shape[0]
    return {"x": rng.standard_normal((z["b"], z["n"], c)), "pos": rng.uniform(0, 1, (z["b"], z["n"], space))}, {}


# ---- FUNCATTN FunctionalMap_Attention_Structured_Mesh_2D: forward(x (B, H W, C)); config mesh_shape (H, W)


class _LinearOrConv:
    """``{name}.weight`` of an ``nn.Linear`` (2-D: transposed) or an ``nn.Conv2d`` (4-D: PyTorch's
    layout kept), whichever the module holds; its bias copied."""

    def __init__(self, pattern: str):
        self.pattern = pattern

    def load(self, view, out):
        for name in sorted(view.items):
            if name not in view.used and re.fullmatch(self.pattern, name):
                a = view.get(name)
                out[name] = a.T if a.ndim == 2 else a

    def save(self, grads, out, used):
        for name in list(grads):
            if name not in used and re.fullmatch(self.pattern, name):
                used.add(name)
                g = np.asarray(grads[name])
                out[name] = g.T if g.ndim == 2 else g


def _funcattn_build(rng, p, cfg, z):
    mesh = cfg.get("mesh_shape")
    n = z["n"] if mesh is None else int(np.prod(mesh))
    w = p["in_project_x.weight"]
    return {"x": rng.standard_normal((z["b"], n, w.shape[1] if w.ndim == 4 else w.shape[0]))}, {}


def _funcattn_call(module, inp, cfg):
    mesh = tuple(cfg.get("mesh_shape") or ())
    if mesh != (getattr(module, "H", None), getattr(module, "W", None)):
        raise ValueError(f"funcattn_functional_attention: config mesh_shape={mesh or None} must be the module's "
                         f"(H, W) = ({getattr(module, 'H', None)}, {getattr(module, 'W', None)})")
    return module(inp["x"])


# ---- HodgeFormer MeshMultiHeadHodgeAttention: forward(x_v, x_e, x_f, d_0, d_1) -> (x_v, x_e, x_f); refattn
# concatenates the three along the token axis; check_module draws features on a tetrahedron's surface


def _tetra_incidence():
    """Signed incidence of a tetrahedron's surface: d0 (6 edges, 4 vertices), d1 (4 faces, 6 edges)."""
    edges = [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]
    d0 = np.zeros((6, 4))
    for e, (i, j) in enumerate(edges):
        d0[e, i], d0[e, j] = -1.0, 1.0
    d1 = np.zeros((4, 6))
    for f, (i, j, k) in enumerate([(0, 1, 2), (0, 1, 3), (0, 2, 3), (1, 2, 3)]):
        for (a, b), sign in (((i, j), 1.0), ((j, k), 1.0), ((i, k), -1.0)):
            d1[f, edges.index((a, b))] = sign
    return d0, d1


def _hodge_build(rng, p, cfg, z):
    d0, d1 = _tetra_incidence()
    key = next(k for k in sorted(p) if k.endswith("_linear_out.weight") or k.endswith("_linears.0.weight"))
    c, b = p[key].shape[0], z["b"]
    inp = {f"x_{s}": rng.standard_normal((b, n, c)) for s, n in zip("vef", (4, 6, 4))}
    return inp, {"d0": np.stack([d0] * b), "d1": np.stack([d1] * b)}


def _hodge_call(module, inp, cfg):
    import torch

    x = inp["x_v"]
    d0, d1 = (torch.as_tensor(np.asarray(cfg[k]), dtype=x.dtype) for k in ("d0", "d1"))
    return torch.cat(module(inp["x_v"], inp["x_e"], inp["x_f"], d0, d1), dim=1)


# ---- LocalNOBlocks' local kernels: differential[i](x, grid_width) + local_convs[i](x) under the keys
# differential.* and local_conv.*; the DISCO kernel is fixed for the module's grid: LOCAL_NO_GRID

LOCAL_NO_GRID = 10
"""Grid side of the inputs ``check_module`` draws for ``local_differential_disco_kernels``: build the
DISCO convolution under test with ``in_shape=(10, 10)``."""


class _BasisColumns:
    """``local_conv.weight``: upstream allocates ``(n_r - 1) n_phi + 1`` basis columns, of which the
    piecewise-linear basis uses the first ``(n_r // 2) n_phi + n_r % 2`` (refattn's width); the rest never
    enter the forward. Loading keeps the used columns; saving pads the unused ones with zeros (their
    gradient, as torch computes it)."""

    def __init__(self, name: str, config: dict):
        ks = config.get("disco_kernel_shape", (2, 4))
        nr, nphi = (ks, ks) if isinstance(ks, (int, np.integer)) else (tuple(ks) + (1,))[:2]
        self.name, self.used, self.total = name, (nr // 2) * nphi + nr % 2, (nr - 1) * nphi + 1

    def load(self, view, out):
        w = view.get(self.name)
        if w.shape[-1] != self.total:
            raise ValueError(f"params_from_state_dict[{view.slug}]: {view.prefix + self.name} has {w.shape[-1]} basis "
                             f"columns; disco_kernel_shape gives {self.total}: pass the module's disco_kernel_shape")
        out[self.name] = w[..., :self.used].copy()

    def save(self, grads, out, used):
        if self.name in grads:
            used.add(self.name)
            g = np.asarray(grads[self.name])
            out[self.name] = np.concatenate([g, np.zeros(g.shape[:-1] + (self.total - g.shape[-1],), g.dtype)], -1)


def _local_rules(config):
    return [Named(r"differential\.weight|local_conv\.bias", False), Derived(r"differential\.conv\.weight"),
            _BasisColumns("local_conv.weight", config)]


def _local_build(rng, p, cfg, z):
    c = p["differential.weight"].shape[1] * int(cfg.get("fd_groups", 1))
    return {"x": rng.standard_normal((z["b"], c, LOCAL_NO_GRID, LOCAL_NO_GRID))}, {}


def _local_call(module, inp, cfg):
    s = tuple(inp["x"].shape[-2:])
    if tuple(getattr(module, "default_in_shape", s)) != s:
        raise ValueError(f"local_differential_disco_kernels: check_module draws grids {s}; build the module with "
                         f"default_in_shape={s} (got {module.default_in_shape})")
    return module(inp["x"])


_BN_STATS = "BatchNorm running statistics are refattn's buffers= config, not params"

_SPECS = [
    Spec("gno_kernel_integral_layer",
         "neuraloperator/neuraloperator neuralop/layers/gno_block.py@93d3f06 (GNOBlock with IntegralTransform, "
         "native_neighbor_search, SinusoidalEmbedding, LinearChannelMLP; forward(y, x, f_y) once per batch "
         "element, upstream sharing one point cloud over the batch; config transform_type, reduction, "
         "pos_embedding as the module's)",
         rules=[Strip("integral_transform.", r"channel_mlp\.fcs\.\d+\.weight", True),
                Strip("integral_transform.", r"channel_mlp\.fcs\.\d+\.bias", False)],
         required=("integral_transform.channel_mlp.fcs.0.weight",), call=_gno_call, build=_gno_build,
         attrs={"radius": "radius", "pos_embedding_channels": "pos_embedding.num_frequencies",
                "max_positions": "pos_embedding.max_positions"}),
    Spec("cno_convolutional_operator",
         "bogdanraonic3/ConvolutionalNeuralOperator CNOModule.py@6544abb (CNOBlock, activation 'cno_lrelu': "
         "training/filtered_networks.py LReLu on StyleGAN3's filtered_lrelu; batch_norm=False as in the "
         "lifting/projection blocks; forward(x) with in_size = CNO_IN_SIZE = 8; the FIR tap buffers are read "
         "and dropped, refattn designs them in float64)",
         rules=[Named(r"convolution\.(weight|bias)|activation\.bias", False),
                Derived(r"activation\.(up|down)_filter")],
         required=("convolution.weight", "activation.bias"), call=_cno_call, build=_cno_build, infer=_cno_infer,
         attrs={"out_size": "out_size"},
         unsupported={f"batch_norm.{k}": _BN_STATS if k.startswith(("running", "num")) else
                      "batch_norm=True blocks need their running statistics, which are not params"
                      for k in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")}),
    Spec("ho_fno_higher_order_spectral_conv",
         "AlexColagrande/HO-FNO models/HO_FNO.py@3fadecc (HO_block: HO_Conv, RMSNorm2D, MLP, _pad_2_3_rule; "
         "layers/spectral_convs.py SpectralConv_2D_diag, complex weights1/weights2; eval mode)",
         rules=[Named(r"HO_conv\.proj\.(weight|bias)|MLP\.[03]\.bias", False), Named(r"MLP\.[03]\.weight", True),
                Complex("HO_conv.spec_convs.weights1"), Complex("HO_conv.spec_convs.weights2"),
                Reshape("norm1.weight", lambda n: (1, 1, 1, n)), Reshape("norm2.weight", lambda n: (1, 1, 1, n))],
         required=("HO_conv.proj.weight", "HO_conv.spec_convs.weights1", "HO_conv.spec_convs.weights2",
                   "norm1.weight", "norm2.weight", "MLP.0.weight", "MLP.3.weight"),
         call=lambda module, inp, cfg: module(inp["x"]), build=_hofno_build,
         attrs={"order": "HO_conv.order", "two_thirds_zero_padding": "two_thirds_zero_padding", "eps": "norm1.eps"}),
    Spec("mgno_multigrid_operator",
         "xlliu2017/MgNO models.py@3a68a90 (MgNO_DC's layer act(conv_list[i](u) + linear_list[i](u)): MgConv_DC "
         "with MgIte, MgIte_init, Restrict; conv_list[i]'s keys under conv., linear_list[i]'s under linear.; "
         "num_iteration and use_res read from the keys, config padding_mode and activation as the module's)",
         rules=_MGNO_RULES, load_pick=_mgno_load, required=("conv.layer0.0.S.weight", "linear.weight"),
         call=lambda module, inp, cfg: module(inp["u"]), build=_mgno_build, infer=_mgno_infer),
    Spec("anie_attentional_integral_equation",
         "emazap7/ANIE IE_source/kernels.py@2071ad7 (model_blocks, Final_block=False, on Galerkin_transformer.py "
         "SimpleTransformerEncoderLayer/SimpleAttention/FeedForward) solved by IE_source/Attentional_IE_solver.py "
         "Integral_attention_solver_multbatch.solve (c = f, d = lam, output_support_tensors=True; the module "
         "carries the solver as module.solve), once per batch element; SimpleAttention's fc, unused without pos, "
         "is read and dropped; config attention_type, activation, n_iterations, smoothing_factor, tol, lam; "
         "gradient='unrolled' = accumulate_grads=True)",
         rules=[Named(r"(first|last_block|blocks\.\d+\.(attn\.linears\.\d+|ff\.lr[12]))\.weight", True),
                Named(r"(first|last_block|blocks\.\d+\.(attn\.linears\.\d+|ff\.lr[12]))\.bias"
                      r"|blocks\.\d+\.layer_norm[12]\.(weight|bias)", False),
                Derived(r"blocks\.\d+\.attn\.fc\.(weight|bias)")],
         required=("first.weight", "last_block.weight"), call=_anie_call, build=_anie_build,
         attrs={"n_head": "n_head", "eps": "blocks.0.layer_norm1.eps"}),
    Spec("mamba_selective_scan_operator",
         "Math-ML-X/Mamba-Neural-Operator MambaGalerkinTransformer/libs/mamba_ops.py@d7de3b7 (SS2D, forward_type "
         "'v2', K = 2 bidirectional orders) and mamba_ops_4.py (SS2D, K = 4 orders over a square grid: config "
         "scan_orders='cross2d'); ssm_conv=0, no low-rank in_rank/out_rank; state-spaces/mamba selective_scan_ref",
         rules=[Named(r"(in|out)_proj\.weight", True),
                Named(r"x_proj_weight|dt_projs_(weight|bias)|A_logs|Ds|out_norm\.(weight|bias)", False)],
         required=("in_proj.weight", "x_proj_weight", "dt_projs_weight", "dt_projs_bias", "A_logs", "Ds",
                   "out_proj.weight"),
         call=lambda module, inp, cfg: module(inp["x"]), build=_mno_build, attrs={"eps": "out_norm.eps"},
         unsupported={"conv2d.weight": "ssm_conv > 1 (a depthwise conv before the scan) is not implemented",
                      "in_rank.weight": "the low-rank ssm_rank_ratio < ssm_ratio variant is not implemented"}),
    Spec("pde_transformer_channel_attention",
         "tum-pbs/pde-transformer pdetransformer/core/separate_channels/pde_transformer.py@850e09d (the channel-"
         "attention branch of HATDiTBlock: adain_2 (AdaLayerNormZero), norm2, attn_channel (SelfAttention, "
         "posemb 'none'; attn_type 'v2' when logit_scale is present, else None = 'v1'), gate 1 + msa2_gate; from a "
         "whole block's state_dict read these keys with strict=False)",
         rules=[Named(r"adain_2\.linear\.weight|attn_channel\.to_qkv\.weight", True),
                Named(r"adain_2\.linear\.bias|norm2\.(weight|bias)|attn_channel\.logit_scale", False)],
         required=("adain_2.linear.weight", "norm2.weight", "attn_channel.to_qkv.weight"),
         call=lambda module, inp, cfg: module(inp["x"], inp["emb"]), build=_pdet_build,
         infer=lambda keys: {"attn_type": "v2" if "attn_channel.logit_scale" in keys else "v1"},
         attrs={"num_heads": "attn_channel.heads", "eps": "norm2.eps"},
         unsupported={"attn_channel.to_qkv.bias": "SelfAttention(bias=True) is not implemented"}),
    Spec("pinnsformer_wavelet_pseudosequence",
         "AdityaLab/pinnsformer model/pinnsformer.py@00d790f (PINNsformer: WaveAct, FeedForward, EncoderLayer, "
         "DecoderLayer on torch.nn.MultiheadAttention; forward(x, t) on the pseudo-sequences, refattn's "
         "num_step=None; MultiheadAttention's in_proj_weight keeps its name, transposed to (E, 3E))",
         rules=[Named(_PINNS_LINEAR + r"|(en|de)coder\.layers\.\d+\.attn\.in_proj_weight", True),
                Named(r".*\.bias|.*\.w[12]|(en|de)coder\.layers\.\d+\.attn\.in_proj_bias", False)],
         required=("linear_emb.weight", "encoder.layers.0.attn.in_proj_weight", "linear_out.4.weight"),
         call=lambda module, inp, cfg: module(inp["x"], inp["t"]), build=_pinns_build,
         attrs={"num_heads": ("heads", "encoder.layers.0.attn.num_heads")}),
    Spec("gnot_geometric_gating_moe",
         "HaoZhongkai/GNOT models/mmgpt.py@5ee2e69 (MIOECrossAttentionBlock: gate_score = softmax(gatenet(pos)), "
         "sum_e gate_score_e moe_mlp1[e](x); the block's keys gatenet.* and moe_mlp1.{e}.{0,2}.*, the experts "
         "stacked (E, in, out); config act as the block's config.act)",
         rules=[Named(r"gatenet\.[024]\.weight", True), Named(r"gatenet\.[024]\.bias", False),
                _Experts("moe_mlp1", "moe_mlp")],
         required=("gatenet.0.weight", "gatenet.4.weight", "moe_mlp1.0.0.weight", "moe_mlp1.0.2.weight"),
         call=lambda module, inp, cfg: module(inp["x"], inp["pos"]), build=_gnot_moe_build),
    Spec("funcattn_functional_attention",
         "xjffff/FUNCATTN PDE-StandardBenchmark/model/Functional_attention.py@1d93f74 "
         "(FunctionalMap_Attention_Structured_Mesh_2D: conv in_project_x/fx, in_project_basis = refattn's "
         "in_project_slice, temperature (1, H, 1, 1) clamped to [0.1, 5], 0-d alpha; its I_d buffer is read and "
         "dropped; config mesh_shape = the module's (H, W))",
         rules=[_LinearOrConv(r"in_project_(x|fx)\.weight"), Named(r"in_project_(x|fx)\.bias|to_out\.0\.bias", False),
                Rename("in_project_slice.weight", "in_project_basis.weight", True),
                Rename("in_project_slice.bias", "in_project_basis.bias", False),
                Named(r"to_[qkv]\.weight|to_out\.0\.weight", True),
                Reshape("temperature", lambda n: (1, n, 1, 1)), Reshape("alpha", lambda n: ()), Derived(r"I_d")],
         required=("in_project_x.weight", "in_project_fx.weight", "in_project_basis.weight", "temperature",
                   "to_q.weight", "to_k.weight", "to_v.weight", "to_out.0.weight", "alpha"),
         call=_funcattn_call, build=_funcattn_build, attrs={"n_head": "heads"}),
    Spec("hodgeformer_hodge_operators",
         "hodgeformer/hodgeformer packages/mesh_opformer/src/mesh_opformer/layers/attention_hodge.py@3d6d527 "
         "(MeshMultiHeadHodgeAttention, hodge_type 'diag' or 'full'; forward(x_v, x_e, x_f, d_0, d_1), its three "
         "outputs concatenated on the token axis; the unused AccelerateOperator diffusion_time parameters are read "
         "and dropped; config modes, hodge_type, norm_type as the module's)",
         rules=[Named(r"[vef]_linears\.[012]\.weight|[vef]_linear_out\.weight", True),
                Named(r"[vef]_linear_out\.bias", False), Derived(r"[vef]_acc\.\d+\.diffusion_time")],
         call=_hodge_call, build=_hodge_build, attrs={"n_head": "h", "attn_sym": "attn_sym"},
         defaults={"d0": None, "d1": None}),  # placeholders: each case's mesh comes from the builder
    Spec("local_differential_disco_kernels",
         "neuraloperator/neuraloperator neuralop/layers/local_no_block.py@93d3f06 (LocalNOBlocks' local kernels "
         "differential[i](x, grid_width) + local_convs[i](x) under the keys differential.*, local_conv.*: "
         "differential_conv.py FiniteDifferenceConvolution (its conv.weight alias is read and dropped), "
         "discrete_continuous_convolution.py EquidistantDiscreteContinuousConv2d (the basis' columns of weight); "
         "x on the module's grid, LOCAL_NO_GRID = 10; config disco_kernel_shape, radius_cutoff, fd_padding, "
         "domain_length as the module's)",
         rules=_local_rules, required=("differential.weight", "local_conv.weight"),
         call=_local_call, build=_local_build,
         attrs={"grid_width": "grid_width", "fd_groups": "differential.groups", "disco_groups": "local_conv.groups"}),
    Spec("multiwavelet_operator",
         "gaurav71531/mwt-operator models/models.py@4b0770c (MWT_CZ1d with sparseKernelFT1d A, B, C (complex "
         "weights1) and T0; the filter buffers ec_s, ec_d, rc_e, rc_o are read and dropped: refattn builds them "
         "from config base and k; config base as the module's)",
         rules=[Complex("A.weights1"), Complex("B.weights1"), Complex("C.weights1"), Named(r"T0\.weight", True),
                Named(r"T0\.bias", False), Derived(r"ec_[sd]|rc_[eo]")],
         required=("A.weights1", "B.weights1", "C.weights1", "T0.weight"),
         call=lambda module, inp, cfg: module(inp["x"]), build=_mwt_build, attrs={"L": "L"}),
]

add_specs(*_SPECS)

add_unmapped("pinto_cross_attention_kernel_integral", "no PyTorch module",
             "quest-lab-iisc/PINTO is TensorFlow/Keras (its Dense and EinsumDense kernels are already (in, out) "
             "in refattn's params)")

GROUP_SLUGS = tuple(s.key for s in _SPECS)
"""The keys this module adds to :data:`~refattn.interop.torch_specs.SPECS`."""
