r"""More rows of the :mod:`refattn.interop.torch` table (group ``ops_b``): neural-operator layers.

Each :class:`~refattn.interop.torch_specs.Spec` here maps a mechanism whose registry record's
forward is the upstream module's forward and whose params already carry the upstream names; it is
registered with the public :func:`~refattn.interop.torch_specs.add_specs` into the same
:data:`~refattn.interop.torch_specs.SPECS` that :mod:`refattn.interop.torch` reads (that module
imports this one). The reference modules the tests run are in ``tests/_upstream_ops_b.py``.

What these operators need beyond a plain ``x``:

* geometry held fixed (not differentiated) is drawn by the builder and passed as config:
  coordinates (``gaot_magno``, ``mino_gno_cross_attention``), graphs (``beno_boundary_embedded_operator``,
  ``gnp_geometric_neural_operator``), the output grid (``nio_neural_inverse_operator``); their
  keywords have ``None`` placeholders in ``defaults`` so that ``check_module`` does not ask for them;
* configuration the module keeps as strings, lists or dicts (not numbers ``attrs`` can read) comes
  from ``config`` or the keys (``infer``); where a wrong value would only show as a mismatch, the
  call checks it against the module and names the keyword (``nns_to_nos_recipe``'s ``scale``,
  ``gnp``'s ``nonlinearity``, ``nio``'s ``activation`` and ``trunk_running_stats``);
* buffers and aliases are read and dropped (``Derived``): fixed frequency tables, BatchNorm
  running statistics (NIO: config), modules registered twice (AROMA's shared processor layers,
  NIO's ``deeponet.trunk``), BENO's unused temporal tables.

``schwarz_neural_inference`` is listed as having no weights (:func:`~refattn.interop.unmapped.add_unmapped`):
the Schwarz iteration has none, its local operator is a separate network.
"""

from __future__ import annotations

import numpy as np

from .torch_specs import Complex, Derived, Named, Reshape, Spec, add_specs, call_x
from .unmapped import add_unmapped

__all__ = ["GROUP_SLUGS"]


# ---- CAPE PrmEmb_Block_1d / _2d: forward([x (B, C, n...), x_p (B, P)]) -> [out, x_p]; the grid is
# LayerNorm(normed_dim)'s shape, the spatial dimension its length


def _cape_build(rng, p, cfg, z):
    grid = p["LN.weight"].shape
    c = p["CNN_0.weight"].shape[1]
    x_p = rng.uniform(0.2, 2.0, (z["b"], p["fc0a.weight"].shape[0]))  # positive: sigmoid(log x_p) in 2-D
    return {"x": rng.standard_normal((z["b"], c) + grid), "x_p": x_p}, {}


def _cape_call(module, inp, cfg):
    return module([inp["x"], inp["x_p"]])[0]


# ---- GAOT MAGNOEncoder / MAGNODecoder: forward(src_coord, f, dst_coord); coordinates are config (not
# differentiated), drawn here in the coordinate dimension the weights imply


def _magno_infer(keys):
    return {"role": "encoder" if "lifting.fcs.0.weight" in keys else "decoder",
            "attention_type": "dot_product" if "agno.query_proj.weight" in keys else "cosine",
            "use_geoembed": "geoembed.mlp.0.weight" in keys,
            "use_scale_weights": "scale_weighting.0.weight" in keys}


def _magno_coord_dim(p, cfg):
    if "geoembed.mlp.0.weight" in p:  # 3 + 2 d statistics
        return (p["geoembed.mlp.0.weight"].shape[0] - 3) // 2
    if "scale_weighting.0.weight" in p:
        kd = p["scale_weighting.0.weight"].shape[0]
    else:
        fcs = sorted(k for k in p if k.startswith("agno.channel_mlp.fcs.") and k.endswith(".weight"))
        w = p[fcs[0]].shape[0] - (p[fcs[-1]].shape[1] if cfg.get("transform_type") == "nonlinear" else 0)
        kd = w // 2
    return kd // 8 if cfg.get("node_embedding") else kd


def _magno_build(rng, p, cfg, z):
    d = _magno_coord_dim(p, cfg)
    n_src, n_dst = z["n"] + z["m"], z["n"] + 2  # >= 2 targets: the geometry statistics are standardised over them
    c = p["lifting.fcs.0.weight" if "lifting.fcs.0.weight" in p else "projection.fcs.0.weight"].shape[1]
    return ({"f": rng.standard_normal((z["b"], n_src, c))},
            {"src_coord": rng.uniform(-1.0, 1.0, (n_src, d)), "dst_coord": rng.uniform(-0.8, 0.8, (n_dst, d))})


def _magno_call(module, inp, cfg):
    import torch

    f = inp["f"]
    src, dst = (torch.as_tensor(cfg[k], dtype=f.dtype) for k in ("src_coord", "dst_coord"))
    return module(src, f, dst)


# ---- MANO MultipoleAttention: forward(x (B, H, W, C)); a grid every level's windows tile, for the module's
# level count; the samplers' kind shows in the keys, the sampling rate in the conv kernels (else config)


def _mano_infer(keys):
    return {"downsampling": "conv" if "down.1.weight" in keys else "avg_pool",
            "upsampling": "conv" if "up.1.weight" in keys else "avg_pool"}


def _mano_build(rng, p, cfg, z):
    conv = next((p[k] for k in ("down.1.weight", "up.1.weight") if k in p), None)
    s = int(conv.shape[-1]) if conv is not None else int(cfg.get("sampling_rate", 2))
    k, t, lv = int(cfg.get("kernel_size", 2)), int(cfg.get("stride", 2)), int(cfg["levels"])

    def tiles(n):
        return all(n // s ** i >= k and (n // s ** i - k) % t == 0 for i in range(lv))

    sizes = [n for n in range(s ** (lv - 1), 64 * s ** lv, s ** (lv - 1)) if tiles(n)][:2]
    h, w = sizes[0], sizes[z["n"] % 2]
    return {"x": rng.standard_normal((z["b"], h, w, p["Attention.norm.weight"].shape[0]))}, {"sampling_rate": s}


# ---- MINO EncoderSupernodes: forward(input_feat, input_pos (B, n, d), query_pos (B, m, d)); one point cloud
# shared over the batch (upstream reads input_pos[0]); 2-D points unless config gives input_pos


def _mino_build(rng, p, cfg, z):
    d = np.shape(cfg["input_pos"])[-1] if cfg.get("input_pos") is not None else 2
    n_in = z["n"] + z["m"]
    f = rng.standard_normal((z["b"], n_in, p["supernode_pooling.message.lift_ffn.weight"].shape[0]))
    return {"f": f}, {"input_pos": rng.uniform(0.0, 1.0, (n_in, d)),
                      "query_pos": rng.uniform(0.1, 0.9, (z["n"] + 1, d))}


def _mino_call(module, inp, cfg):
    import torch

    f = inp["f"]
    y, x = (torch.as_tensor(cfg[k], dtype=f.dtype) for k in ("input_pos", "query_pos"))
    return module(f, y[None].expand(f.shape[0], -1, -1), x[None].expand(f.shape[0], -1, -1))


# ---- MoNo CoTAP: build_mapping(anchor), then encode(x) and decode(z), stacked along the tokens as the record


def _cotap_build(rng, p, cfg, z):
    d = p["attention_projector.input.weight"].shape[0]
    m, n = p["attention_projector.output.weight"].shape[1], z["n"] + z["m"]
    return {"anchor": rng.standard_normal((z["b"], n, d)), "x": rng.standard_normal((z["b"], n, d)),
            "z": rng.standard_normal((z["b"], m, d))}, {}


def _cotap_call(module, inp, cfg):
    import torch

    mp = module.build_mapping(inp["anchor"])
    return torch.cat([module.encode(module.build_encode_mapping(mp), inp["x"]),
                      module.decode(module.build_decode_mapping(mp), inp["z"])], dim=1)


# ---- PhysGTO attention (three upstream implementations; the variant shows in the keys)


def _physgto_infer(keys):
    return {"variant": "task1" if "kv_2.weight" in keys else "task2" if "qkv_2.weight" in keys else "task3"}


def _physgto_build(rng, p, cfg, z):
    c = p["Q"].shape[-1] if p["Q"].ndim == 2 else p["q_3.weight"].shape[0]
    return {"x": rng.standard_normal((z["b"], z["n"] + 2, c))}, {}


# ---- DiTTO: Unet.time_mlp and one ResnetBlock (lucidrains' names at top level), forward(x, t)


def _ditto_build(rng, p, cfg, z):
    c = p["block1.proj.weight"].shape[1]
    h, w = 3 + z["n"] % 3, 2 + z["n"] % 4
    return {"x": rng.standard_normal((z["b"], c, h, w)), "t": rng.uniform(0.0, 3.0, z["b"])}, {}


# ---- PROSE: fusion type embeddings, the decoder's query embedding, one OperatorDecoderLayer; the last data
# token of batch element 0 and the last symbol token of the last element are padded (upstream: True = pad);
# check_module runs time_embed="continuous" (the learnable table has no times input to draw)


def _prose_infer(keys):
    return {"time_embed": "continuous" if "time_proj.0.weight" in keys else "learnable"}


def _prose_build(rng, p, cfg, z):
    c, b = p["type_embeddings.weight"].shape[1], z["b"]
    s0, s1 = 1 + z["n"] % 4, 2 + z["m"] % 3
    k0, k1 = np.zeros((b, s0), dtype=bool), np.zeros((b, s1), dtype=bool)
    if s0 > 1:
        k0[0, -1] = True
    k1[-1, -1] = True
    inp = {"x0": rng.standard_normal((b, s0, c)), "x1": rng.standard_normal((b, s1, c))}
    extra = {"key_padding_mask0": k0, "key_padding_mask1": k1}
    if "time_proj.0.weight" not in p:
        raise ValueError("check_module[prose_multimodal_operator] runs the continuous time embedding (time_proj): "
                         "with time_embed='learnable' the record takes no times input to draw; "
                         "params_from_state_dict maps time_embed all the same")
    inp["times"] = rng.uniform(0.0, 1.0, (b, 1 + z["n"] % 3, p["time_proj.0.weight"].shape[0]))
    return inp, extra


def _prose_call(module, inp, cfg):
    import torch

    k0, k1 = (None if cfg.get(k) is None else torch.as_tensor(cfg[k]) for k in ("key_padding_mask0", "key_padding_mask1"))
    return module(inp["times"], inp["x0"], inp["x1"], k0, k1)


# ---- BENO InteractionNetwork: forward(x, edge_index, edge_features, boundary) per graph; the record batches
# graphs sharing one edge_index, check_module runs the module on each and stacks the node outputs


def _beno_build(rng, p, cfg, z):
    d = p["node_fn.1.weight"].shape[0]
    de = p["edge_fn.0.NN-0.weight"].shape[0] - 2 * d
    n = z["n"] + 2
    e = 2 * n + z["m"]
    ei = np.stack([rng.integers(0, n, e), rng.integers(0, n - 1, e)])  # the last node has no incoming edge
    return ({"x": rng.standard_normal((z["b"], n, d)), "edge_features": rng.standard_normal((z["b"], e, de)),
             "boundary": rng.standard_normal((z["b"], 3 + z["m"] % 5, 3))}, {"edge_index": ei})


def _beno_call(module, inp, cfg):
    import torch

    ei = torch.as_tensor(cfg["edge_index"])
    return torch.stack([module(inp["x"][b], ei, inp["edge_features"][b], inp["boundary"][b])[0]
                        for b in range(inp["x"].shape[0])])


# ---- HyPINO HyperNetDecoder: forward([skip_0, ...] as (B, N_s, 1, C_s), xy); the target net's unused
# in_map / out_map and its fixed Fourier frequencies are read and dropped


def _hypino_build(rng, p, cfg, z):
    lat = p["bias_maps.0.3.weight"].shape[1]
    d = p["weight_maps.0.3.weight"].shape[1] // lat // (2 * int(cfg.get("num_fourier_features", 5)) + 1)
    inp = {"xy": rng.uniform(-1.0, 1.0, (z["b"], z["n"] + 2, d))}
    s = 0
    while f"attention_pooling.{s}.queries" in p:
        inp[f"skip_{s}"] = rng.standard_normal((z["b"], 1 + (z["m"] + s) % 5, p[f"attention_pooling.{s}.queries"].shape[1]))
        s += 1
    return inp, {}


def _hypino_call(module, inp, cfg):
    skips = [inp[f"skip_{s}"][:, :, None] for s in range(4) if f"skip_{s}" in inp]
    return module(skips, inp["xy"])


# ---- NNs-to-NOs InterpConv2d: forward(x); scale (upstream's scale_dict["scale"]) and the base padding
# are config (not numbers the table can read off the module): the call checks them against the module


def _interp_build(rng, p, cfg, z):
    s = float(cfg.get("scale", 1.0))
    c = p["weight"].shape[1] * int(cfg.get("groups", 1))
    h, w = int(np.ceil(s * (8 + z["n"] % 3))), int(np.ceil(s * (9 + z["n"] % 2)))
    return {"x": rng.standard_normal((z["b"], c, h, w))}, {}


def _interp_call(module, inp, cfg):
    want = {"scale": module.scale_dict["scale"], "padding": module.base_padding,
            "interpolation_mode": module.interpolation_mode}
    got = {"scale": cfg.get("scale", 1.0), "padding": cfg.get("padding", 0),
           "interpolation_mode": cfg.get("interpolation_mode", "bilinear")}
    def norm(v):
        return tuple(v) if isinstance(v, (list, tuple)) else v

    if any(norm(got[k]) != norm(want[k]) for k in want):
        raise ValueError(f"nns_to_nos_recipe: pass config={want} (the module's scale_dict['scale'], base_padding "
                         f"and interpolation_mode); got {got}")
    return module(inp["x"])


# ---- AROMA AROMAEncoderDecoderKL: forward(images, coords, target_coords=, sample_posterior=False)[0] (the
# posterior mode: refattn's noise=None); the scales are the keys of pos_query.bands; the processor's modules
# are one pair shared by every layer (upstream's cache_fn), so layers.{i > 0}.* alias layers.0.* (dropped)


def _aroma_infer(keys):
    pre = "encoder.pos_query.bands."
    return {"scales": tuple(float(k[len(pre):]) if "." in k[len(pre):] else int(k[len(pre):])
                            for k in keys if k.startswith(pre))}


def _aroma_build(rng, p, cfg, z):
    d = p["encoder.cross_attend_blocks.0.fn.to_k.weight"].shape[0] // (2 * int(cfg.get("num_freq", 12)))
    c, n = p["encoder.lift_values.weight"].shape[0], z["n"] + z["m"]
    return {"images": rng.standard_normal((z["b"], n, c)), "coords": rng.uniform(0.0, 1.0, (z["b"], n, d)),
            "target_coords": rng.uniform(0.0, 1.0, (z["b"], z["n"] + 1, d))}, {}


def _aroma_call(module, inp, cfg):
    if cfg.get("noise") is not None:
        raise ValueError("check_module[aroma_latent_neural_field_operator] runs the posterior mode (noise=None): "
                         "upstream draws the posterior noise with torch.randn inside the forward")
    return module(inp["images"], inp["coords"], target_coords=inp["target_coords"], sample_posterior=False)[0]


# ---- GNP BlockGNP: forward(Data(x, edge_index, edge_attr = [p_src, p_tgt])) per point cloud; a radius graph
# with self-loops drawn on the points; nonlinearity is config (the module's is a string)


def _gnp_build(rng, p, cfg, z):
    from ..operators.gnp import gnp_radius_graph

    n, c = z["n"] + 3, p["lift.weight"].shape[0]
    q = p["convs.0.nn.layers.0.weight"].shape[0] // 2
    pts = rng.uniform(0.0, 1.0, (n, max(q, 1)))
    return ({"x": rng.standard_normal((z["b"], n, c)), "edge_data": rng.standard_normal((z["b"], n, q))},
            {"edge_index": gnp_radius_graph(pts, 0.6)})


def _gnp_call(module, inp, cfg):
    import types

    import torch

    if getattr(module, "nonlinearity", cfg.get("nonlinearity", "ReLU")) != cfg.get("nonlinearity", "ReLU"):
        raise ValueError(f"gnp_geometric_neural_operator: pass config={{'nonlinearity': {module.nonlinearity!r}}} "
                         f"(the module's); got {cfg.get('nonlinearity', 'ReLU')!r}")
    ei = torch.as_tensor(cfg["edge_index"])
    outs = []
    for b in range(inp["x"].shape[0]):
        e = inp["edge_data"][b]
        attr = torch.cat([e[ei[0]], e[ei[1]]], dim=-1)
        outs.append(module(types.SimpleNamespace(x=inp["x"][b], edge_index=ei, edge_attr=attr)))
    return torch.stack(outs)


# ---- NIO NIOHelmPermInv (eval, branch = identity): forward(beta, grid); the trunk's BatchNorm running
# statistics are config (trunk_running_stats), read and dropped here; deeponet.trunk aliases trunk (dropped);
# fc0 enters upstream through .data (no torch gradient): check_module needs it frozen


_NIO_BASE = [Named(r"trunk\.(input_layer|hidden_layers\.\d+|output_layer)\.weight|fc0\.weight|fno\.fc[12]\.weight", True),
             Named(r"trunk\.(input_layer|hidden_layers\.\d+|output_layer)\.bias|trunk\.batch_layers\.\d+\.(weight|bias)"
                   r"|fc0\.bias|fno\.fc[12]\.bias|fno\.conv_list\.\d+\.(weight|bias)", False),
             Reshape("deeponet.b0", lambda n: ()),
             Derived(r"trunk\.batch_layers\.\d+\.(running_mean|running_var|num_batches_tracked)|deeponet\.trunk\..*")]


def _nio_rules(names):
    n = len({k.split(".")[2] for k in names if k.startswith("fno.spectral_list.")})
    return _NIO_BASE + [Complex(f"fno.spectral_list.{k}.weights{j}") for k in range(n) for j in (1, 2)]


def _nio_build(rng, p, cfg, z):
    nx = 4 + z["n"] % 3
    gx, gy = np.meshgrid(np.linspace(0, 1, nx), np.linspace(0, 1, nx), indexing="ij")
    beta = rng.standard_normal((z["b"], 1 + z["m"] % 4, p["trunk.output_layer.weight"].shape[1]))
    return {"beta": beta}, {"grid": np.stack([gx, gy], -1)}


def _nio_call(module, inp, cfg):
    import torch

    if module.fc0.weight.requires_grad:
        raise ValueError("nio_neural_inverse_operator: upstream reads fc0.weight.data, so torch gives fc0 no gradient "
                         "while refattn returns its true one; freeze it (module.fc0.requires_grad_(False))")
    stats = {k: v for k, v in module.state_dict().items() if k.startswith("trunk.") and "running_" in k}
    given = cfg.get("trunk_running_stats") or {}
    if any(not np.allclose(np.asarray(given.get(k, 0.0 if k.endswith("mean") else 1.0)), v.detach().cpu().numpy())
           for k, v in stats.items()):
        raise ValueError("nio_neural_inverse_operator: pass config trunk_running_stats = the module's trunk.batch_layers"
                         ".*.running_mean / running_var buffers")
    act = getattr(module.trunk, "act_string", cfg.get("activation", "leaky_relu"))
    if act != cfg.get("activation", "leaky_relu"):
        raise ValueError(f"nio_neural_inverse_operator: pass config activation={act!r} (the trunk's act_string)")
    return module(inp["beta"], torch.as_tensor(cfg["grid"], dtype=inp["beta"].dtype))


_SPECS = [
    Spec("cape_parameter_channel_attention", "nec-research/CAPE-ML4Sci CAPE/models/PrmEmbd/PrmEmbd.py@8ae7d64 "
         "(PrmEmb_Block_1d, PrmEmb_Block_2d; forward([x, x_p])[0]; the grid is LN's normed_dim)",
         rules=[Named(r"fc[012][ab]\.weight", True), Complex("CNN_SC.weights1"), Complex("CNN_SC.weights2", optional=True),
                Named(r"(CNN_(0|AD|1|AC|2))\.(weight|bias)|LN\.(weight|bias)|fc[012][ab]\.bias", False)],
         required=("CNN_0.weight", "CNN_SC.weights1", "CNN_AD.weight", "CNN_1.weight", "CNN_AC.weight",
                   "CNN_2.weight", "fc0a.weight", "LN.weight"),
         call=_cape_call, build=_cape_build),
    Spec("gaot_magno", "camlab-ethz/GAOT src/model/layers/magno.py@aec18bb (MAGNOEncoder, MAGNODecoder in the fixed-"
         "coordinate mode, forward(src_coord, f, dst_coord); agno.py AGNO, gemb.py GeometricEmbedding 'statistical', "
         "mlp.py; scales= and transform_type= in config, as they do not show in the keys)",
         rules=[Named(r"agno\.(channel_mlp\.fcs\.\d+|query_proj|key_proj)\.weight|(geoembed\.mlp|scale_weighting)\.[02]"
                      r"\.weight", True),
                Named(r"(lifting|projection|recovery)\.fcs\.0\.(weight|bias)|agno\.(channel_mlp\.fcs\.\d+|query_proj"
                      r"|key_proj)\.bias|(geoembed\.mlp|scale_weighting)\.[02]\.bias", False)],
         required=("agno.channel_mlp.fcs.0.weight",), call=_magno_call, build=_magno_build, infer=_magno_infer,
         attrs={"radius": ("radius", "config.radius"), "node_embedding": "node_embedding"},
         defaults={"src_coord": None, "dst_coord": None}),  # placeholders: the builder draws the coordinates
    Spec("mano_multipole_attention", "AlexColagrande/MANO (no snapshot retrievable, no commit pinned: MultipoleAttention, "
         "LocalAttention2D, AttentionBlock as read in identical third-party copies; forward(x (B, H, W, C)))",
         rules=[Named(r"Attention\.Attention\.(to_qkv|to_out\.0)\.weight", True),
                Named(r"Attention\.(Attention\.)?norm\.(weight|bias)|Attention\.Attention\.to_out\.0\.bias"
                      r"|(down|up)\.1\.weight", False)],
         required=("Attention.norm.weight", "Attention.Attention.to_qkv.weight"), call=call_x, build=_mano_build,
         infer=_mano_infer,
         attrs={"num_heads": "Attention.Attention.heads", "kernel_size": "Attention.kernel_size",
                "stride": "Attention.stride", "levels": "levels",
                "sampling_rate": ("down.1.kernel_size", "up.1.scale_factor")}),
    Spec("mino_gno_cross_attention", "yzshi5/MINO models/mino_modules/encoder_supernodes_gno_cross_attention.py@143e4b4 "
         "(EncoderSupernodes, cond_dim=None: SupernodePooling/GNOBlock, then kappamodules PerceiverBlock@748c370; "
         "forward(f, input_pos, query_pos); the embedding's omega buffer is read and dropped)",
         rules=[Named(r"supernode_pooling\.message\.(lift_ffn|channel_mlp\.fcs\.\d+)\.weight"
                      r"|(first_block|rest_block\.\d+)\.(attn\.(q|kv|proj)|mlp\.fc[12])\.weight", True),
                Named(r"supernode_pooling\.message\.(lift_ffn|channel_mlp\.fcs\.\d+)\.bias"
                      r"|(first_block|rest_block\.\d+)\.((attn\.(q|kv|proj)|mlp\.fc[12])\.bias"
                      r"|norm(1q|1kv|2)\.(weight|bias))", False),
                Derived(r"supernode_pooling\.message\.pos_embedding\.omega")],
         required=("supernode_pooling.message.lift_ffn.weight", "first_block.attn.q.weight"),
         call=_mino_call, build=_mino_build,
         attrs={"radius": "radius", "num_heads": ("enc_num_heads", "first_block.attn.num_heads")},
         defaults={"input_pos": None, "query_pos": None}),  # placeholders: the builder draws the points
    Spec("mono_cotap_ot_projection", "ZijiangY1116/MoNo utils/models/mono.py@60d086a (CoTAP with MONOMLP, "
         "MONORowNormalizedLinear, FasterSinkhornRouter on op.py sinkhorn_reference; build_mapping(anchor), "
         "encode(x), decode(z), stacked along the tokens)",
         rules=[Named(r"attention_projector\.(input|hidden\.\d+|output)\.weight", True),
                Named(r"attention_projector\.(input|hidden\.\d+|output)\.bias|attention_projector\.output"
                      r"\.global_scale", False)],
         required=("attention_projector.input.weight", "attention_projector.output.weight"),
         call=_cotap_call, build=_cotap_build, attrs={"n_iter": "router.n_iter", "temperature": "router.temperature"}),
    Spec("physgto_projection_attention", "pengwei07/PhysGTO code/task1/src/atten.py (Atten: variant 'task1'), "
         "code/task2/src/model/atten.py (GTO_Atten: 'task2'), code/task3/src/model/atten.py (Atten with three "
         "nn.MultiheadAttention: 'task3') @198d88f; forward(x)",
         rules=[Named(r"(kv_1|kv_2|qkv_2|q_3|out_proj|proj)\.weight|attention[123]\.(in_proj_weight|out_proj\.weight)",
                      True),
                Named(r"Q|(kv_1|kv_2|q_3|out_proj|proj)\.bias|attention[123]\.(in_proj_bias|out_proj\.bias)", False)],
         required=("Q",), call=call_x, build=_physgto_build, infer=_physgto_infer,
         attrs={"num_heads": ("n_heads", "attention1.num_heads")}),
    Spec("ditto_time_conditioned_operator", "lucidrains/denoising-diffusion-pytorch denoising_diffusion_pytorch/"
         "denoising_diffusion_pytorch.py@ff6cbb4 (the block DiTTO builds on, its authors' code not public: "
         "Unet.time_mlp with SinusoidalPosEmb beside one ResnetBlock's mlp, block1, block2, res_conv; "
         "forward(x, t) = ResnetBlock(x, time_mlp(t)))",
         rules=[Named(r"(time_mlp\.[13]|mlp\.1)\.weight", True),
                Named(r"(time_mlp\.[13]|mlp\.1)\.bias|(block[12]\.(proj|norm)|res_conv)\.(weight|bias)", False)],
         required=("time_mlp.1.weight", "mlp.1.weight", "block1.proj.weight", "block2.proj.weight"),
         call=lambda module, inp, cfg: module(inp["x"], inp["t"]), build=_ditto_build,
         attrs={"groups": "block1.norm.num_groups", "theta": "time_mlp.0.theta"}),
    Spec("prose_multimodal_operator", "felix-lyx/prose prose_fd/models/attention_utils.py@eaf598d (OperatorDecoderLayer, "
         "under the names of one layer) with prose_fd/models/transformer.py TransformerFusion's type_embeddings "
         "and DataOperatorDecoder's time_proj/time_embed and patch_position_embeddings (fusion n_layer = 0); "
         "forward(times, x0, x1, key_padding_mask0, key_padding_mask1, output_len)",
         rules=[Named(r"multihead_attn\.(in_proj_weight|out_proj\.weight)|linear[12]\.weight|time_proj\.[02]\.weight",
                      True),
                Named(r"type_embeddings\.weight|patch_position_embeddings|time_embed|multihead_attn\.(in_proj_bias"
                      r"|out_proj\.bias)|linear[12]\.bias|norm[12]\.(weight|bias)|time_proj\.[02]\.bias", False)],
         required=("type_embeddings.weight", "patch_position_embeddings", "multihead_attn.in_proj_weight"),
         call=_prose_call, build=_prose_build, infer=_prose_infer,
         attrs={"num_heads": "multihead_attn.num_heads", "norm_first": "norm_first"}),
    Spec("beno_boundary_embedded_operator", "AI4Science-WestlakeU/beno BE_MPNN.py@6ac99f3 (InteractionNetwork, "
         "forward(x, edge_index, edge_features, boundary)[0] per graph) on transformer.py (Transformer; its "
         "positional table and unused temporal tables are read and dropped); activation= in config (default silu)",
         rules=[Named(r"(node_fn|edge_fn)\.0\.NN-\d+\.weight|boundary_fn\.encoder\.attn_layers\.\d+\.attention\."
                      r"(query|key|value|out)_projection\.weight", True),
                Named(r"(node_fn|edge_fn)\.(0\.NN-\d+\.bias|1\.(weight|bias))|boundary_fn\.enc_embedding\."
                      r"value_embedding\.tokenConv\.weight|boundary_fn\.encoder\.(norm\.(weight|bias)|attn_layers\.\d+"
                      r"\.(attention\.(query|key|value|out)_projection\.bias|conv[12]\.(weight|bias)|norm[12]\."
                      r"(weight|bias)))", False),
                Derived(r"boundary_fn\.enc_embedding\.(position_embedding\.pe|temporal_embedding\..*)")],
         required=("node_fn.0.NN-0.weight", "edge_fn.0.NN-0.weight",
                   "boundary_fn.enc_embedding.value_embedding.tokenConv.weight"),
         call=_beno_call, build=_beno_build,
         attrs={"n_heads": "boundary_fn.encoder.attn_layers.0.attention.n_heads"},
         defaults={"edge_index": None}),  # a placeholder: the builder draws the graph
    Spec("hypino_hypernetwork_pinn", "rbischof/hypino src/models/hypino.py@28d7308 (HyperNetDecoder, ModulationMFNN; "
         "src/models/utils.py AttentionPooling, FourierMapping; forward(skip_connections, xy); num_heads and "
         "norm_groups as upstream unless config says; target_net.* read and dropped)",
         rules=[Named(r"attention_pooling\.\d+\.attention\.(in_proj_weight|out_proj\.weight)"
                      r"|(weight|bias)_maps\.\d+\.[03]\.weight", True),
                Named(r"attention_pooling\.\d+\.(queries|attention\.(in_proj_bias|out_proj\.bias))"
                      r"|(weight|bias)_maps\.\d+\.(0\.bias|2\.(weight|bias)|3\.bias)", False),
                Derived(r"target_net\..*")],
         required=("attention_pooling.0.queries", "weight_maps.0.0.weight", "bias_maps.0.0.weight"),
         call=_hypino_call, build=_hypino_build),
    Spec("nns_to_nos_recipe", "neuraloperator/NNs-to-NOs models/unet_kernel_interp.py@892ba1c (InterpConv2d; "
         "utilities.py bilinear_interpolate, resize; forward(x); config scale, padding, interpolation_mode as "
         "the module's scale_dict['scale'], base_padding, interpolation_mode)",
         rules=[Named(r"weight|bias", False)], required=("weight",), call=_interp_call, build=_interp_build,
         attrs={"groups": "groups"}),
    Spec("aroma_latent_neural_field_operator", "LouisSerrano/aroma aroma/encoder_decoder.py@77ec74f "
         "(AROMAEncoderDecoderKL, PerceiverEncoder with encode_geo=False, include_pos_in_value=False; "
         "aroma/fourier_features.py NeRFEncoding, MultiScaleNeRFEncoding; forward(images, coords, target_coords, "
         "sample_posterior=False)[0]; the bands and the shared processor's aliases layers.{i>0} are dropped)",
         rules=[Named(r"encoder\.(lift_values|mean_fc|logvar_fc|lift_z)\.weight|decoder\.mlp\.\d+\.weight"
                      r"|encoder\.(cross_attend_blocks\.[01]|layers\.0\.[01]|decoder_cross_attn)\.fn\."
                      r"(to_q|to_k|to_v|to_kv|to_out|net\.[02])\.weight", True),
                Named(r"encoder\.latents|encoder\.(lift_values|mean_fc|logvar_fc|lift_z)\.bias|decoder\.mlp\.\d+"
                      r"\.bias|encoder\.(cross_attend_blocks\.[01]|layers\.0\.[01]|decoder_cross_attn)\.(norm|norm_k"
                      r"|norm_v|norm_context)\.(weight|bias)|encoder\.(cross_attend_blocks\.[01]|layers\.0\.[01]"
                      r"|decoder_cross_attn)\.fn\.(to_out|net\.[02])\.bias", False),
                Derived(r"encoder\.pos_query\.bands\..*|encoder\.layers\.[1-9]\d*\..*")],
         required=("encoder.latents", "encoder.lift_values.weight", "encoder.mean_fc.weight", "decoder.mlp.0.weight"),
         call=_aroma_call, build=_aroma_build, infer=_aroma_infer,
         attrs={"depth": "encoder.depth", "bottleneck_index": "encoder.bottleneck_index",
                "num_freq": "encoder.pos_encoding.num_freq",
                "max_pos_encoding_freq": "encoder.pos_encoding.max_freq_log2",
                "cross_heads": "encoder.cross_attend_blocks.0.fn.heads", "latent_heads": "encoder.layers.0.0.fn.heads"}),
    Spec("gnp_geometric_neural_operator", "atzberg/geo_neural_op gnp/models/gnp.py@6473561 (BlockGNP, forward(data) "
         "per point cloud with edge_attr = [edge_data[src], edge_data[dst]]; gnp/models/layers.py BlockKernel, "
         "BlockConv; nonlinearity= in config)",
         rules=[Named(r"(lift|proj|W\.\d+|mixes\.\d+|convs\.\d+\.nn\.layers\.[01])\.weight", True),
                Named(r"(lift|proj|W\.\d+|mixes\.\d+|convs\.\d+\.nn\.layers\.[01])\.bias", False)],
         required=("lift.weight", "proj.weight", "convs.0.nn.layers.0.weight"),
         call=_gnp_call, build=_gnp_build, attrs={"num_channels": "channels"},
         defaults={"edge_index": None}),  # a placeholder: the builder draws the graph
    Spec("nio_neural_inverse_operator", "mroberto166/nio NIOModules.py@c2defcc (NIOHelmPermInv in eval mode with the "
         "branch replaced by the identity: forward(beta, grid); DeepONetModules.py FeedForwardNN, DeepOnetNoBiasOrg; "
         "FNOModules.py FNO_WOR, SpectralConv2d; fc0 frozen, trunk_running_stats= and activation= in config)",
         rules=_NIO_BASE, load_pick=_nio_rules, save_pick=lambda grads: _nio_rules(
             [k[:-len("_real")] for k in grads if k.endswith("_real")]),
         required=("trunk.input_layer.weight", "trunk.output_layer.weight", "deeponet.b0", "fc0.weight", "fno.fc1.weight"),
         call=_nio_call, build=_nio_build, attrs={"padding_frac": "fno.padding_frac"},
         defaults={"grid": None}),  # a placeholder: the builder draws the grid
]

add_specs(*_SPECS)

add_unmapped("schwarz_neural_inference", "no weights",
             "the Schwarz iteration has no trainable parameters of its own (upstream questionstorer/sni "
             "models/ddno.py DDNO freezes everything and holds only restriction matrices and masks); the weights "
             "are the pluggable local operator's (upstream GNOT or GeoFNO, refattn's record plugs a small pointwise "
             "MLP of its own), mapped by that operator's table")

GROUP_SLUGS = tuple(s.key for s in _SPECS)
"""The keys this module adds to :data:`~refattn.interop.torch_specs.SPECS`."""
