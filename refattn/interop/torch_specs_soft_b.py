r"""Rows of the :mod:`refattn.interop.torch` table for a group of softmax-family mechanisms (group ``soft_b``).

Each :class:`~refattn.interop.torch_specs.Spec` here maps a mechanism whose registry record's
forward is the upstream module's forward and whose params carry the upstream names (``nn.Linear``
weights transposed to ``(in, out)``); it is registered with
:func:`~refattn.interop.torch_specs.add_specs` into the same
:data:`~refattn.interop.torch_specs.SPECS` that :mod:`refattn.interop.torch` reads (that module
imports this one). The reference modules the tests run are in ``tests/_upstream_soft_b.py``.
"""

from __future__ import annotations

import numpy as np

from .torch_specs import Derived, Named, Rename, Spec, add_specs, x_build
from .unmapped import add_unmapped

__all__ = ["GROUP_SLUGS"]


# ---- CoCA LlamaAttention (t_proj instead of k_proj): forward(hidden_states, attention_mask, position_ids)


def _coca_call(module, inp, cfg):
    """Upstream ``LlamaAttention.forward`` with ``position_ids = arange(N)`` and, when causal, the
    additive ``(B, 1, N, N)`` mask at ``finfo.min`` that ``LlamaModel`` builds; returns the output."""
    import torch

    x = inp["x"]
    b, n, _ = x.shape
    mask = None
    if cfg.get("is_causal", True):
        mask = torch.full((n, n), torch.finfo(x.dtype).min, dtype=x.dtype).triu(1)[None, None].expand(b, 1, n, n)
    return module(x, attention_mask=mask, position_ids=torch.arange(n)[None].expand(b, n))[0]


# ---- URPE: fairseq MultiheadAttention with the encoder's rp_bias / ur_rp_bias tables; forward(x, padding_mask)


def _urpe_build(rng, p, cfg, z):
    """Token-major ``x``; when a row has more than one key, the last key of the last row is padding
    (fairseq's ``key_padding_mask``, True = pad), given to both sides."""
    b, n = z["b"], z["n"]
    inp = {"x": rng.standard_normal((b, n, p["q_proj.weight"].shape[0]))}
    if n < 2:
        return inp, {}
    pad = np.zeros((b, n), dtype=bool)
    pad[-1, -1] = True
    return inp, {"key_padding_mask": pad}


def _urpe_call(module, inp, cfg):
    import torch

    pad = cfg.get("key_padding_mask")
    return module(inp["x"], None if pad is None else torch.from_numpy(np.asarray(pad, dtype=bool)))


# ---- Position coupling: CustomGPT2Model's abs_learned embedding, forward(inputs_embeds, position_ids)


def _pc_build(rng, p, cfg, z):
    """Token embeddings and coupled IDs: few distinct IDs, so tokens share rows (the scatter-add)."""
    num, d = p["wpe.weight"].shape
    ids = rng.integers(0, min(num, max(2, z["n"] // 2)), (z["b"], z["n"]))
    return {"x": rng.standard_normal((z["b"], z["n"], d))}, {"position_ids": ids}


def _pc_call(module, inp, cfg):
    import torch

    return module(inp["x"], torch.from_numpy(np.asarray(cfg["position_ids"], dtype=np.int64)))


# ---- Location-relative attention: bshall's DynamicConvolutionAttention or LeoniusChen's GMMAttention,
# one decoder step per call; check_module runs the decoder loop over the queries


_DCA_RULES = [Named(r"(W|V|U|T|v)\.weight", True), Named(r"(W|T)\.bias|F\.weight", False), Derived(r"P")]
_GMM_RULES = [Named(r"mlp\.[02]\.weight", True), Named(r"mlp\.[02]\.bias", False),
              Derived(r"query_layer\.weight|v\.weight")]  # BahdanauAttention's layers, unused by GMMAttention


def _loc_pick(keys):
    return _GMM_RULES if "mlp.0.weight" in keys else _DCA_RULES


def _loc_infer(keys):
    return {"kind": "gmm" if "mlp.0.weight" in keys else "dca"}


def _loc_build(rng, p, cfg, z):
    """Decoder queries ``(B, T = n, D_q)`` and a memory ``(B, m, 3)`` (its width is free)."""
    dq = (p["mlp.0.weight"] if "mlp.0.weight" in p else p["W.weight"]).shape[0]
    return {"query": rng.standard_normal((z["b"], z["n"], dq)), "memory": rng.standard_normal((z["b"], z["m"], 3))}, {}


def _loc_call(module, inp, cfg):
    """The decoder loop: DCA from the one-hot alignment at position 0 (``alpha = module(s_t, alpha)``),
    GMM after ``init_attention(memory)`` (``alpha = module(s_t, memory)``); contexts ``alpha @ memory``."""
    import torch

    q, mem = inp["query"], inp["memory"]
    gmm = hasattr(module, "mlp")
    if gmm:
        module.init_attention(mem)
    else:
        alpha = torch.zeros(mem.shape[:2], dtype=mem.dtype)
        alpha[:, 0] = 1.0
    out = []
    for t in range(q.shape[1]):
        alpha = module(q[:, t], mem) if gmm else module(q[:, t], alpha)
        out.append(torch.bmm(alpha.unsqueeze(1), mem))
    return torch.cat(out, dim=1)


# ---- var-attn VariationalAttention + Generator.proj: forward(h, memory, mode, memory_lengths, q_scores)


def _latent_infer(keys):
    return {"attn_type": "general" if "linear_in.weight" in keys else "mlp"}


def _latent_build(rng, p, cfg, z):
    """Decoder states ``h (B, n, D_t)``, a memory ``(B, m, 4)`` (its width is what ``linear_out`` reads
    beside ``D_t``), q scores in ``"enum"`` mode, and a memory mask (the last row one shorter)."""
    dt = p["proj.weight"].shape[0]
    b, n, m = z["b"], z["n"], z["m"]
    inp = {"h": rng.standard_normal((b, n, dt)), "memory": rng.standard_normal((b, m, p["linear_out.weight"].shape[0] - dt))}
    if cfg.get("mode", "exact") == "enum":
        inp["q_scores"] = rng.standard_normal((b, n, m))
    lengths = np.full(b, m)
    lengths[-1] -= 1 if m > 1 else 0
    return inp, {"memory_mask": np.arange(m)[None, :] < lengths[:, None]}


def _latent_call(module, inp, cfg):
    import torch

    mm = cfg.get("memory_mask")
    lengths = None if mm is None else torch.from_numpy(np.asarray(mm).sum(-1).astype(np.int64))
    return module(inp["h"], inp["memory"], cfg.get("mode", "exact"), memory_lengths=lengths,
                  q_scores=inp.get("q_scores"), kl_weight=float(cfg.get("kl_weight", 1.0)))


# ---- Monotonic location attention: GRUEncoderDecoder's attention path (dir_gater, value_transform,
# attention_layer = Multiheaded_Monotonic_Attention); forward(query, memory, memory_mask)


def _mono_infer(keys):
    return {"mix_attention": "attention_layer.query_linear.weight" in keys}


def _mono_build(rng, p, cfg, z):
    """Decoder states ``(B, n, D_q)``, a memory ``(B, m, D_m)`` and a memory mask (the last row one shorter)."""
    b, n, m = z["b"], z["n"], z["m"]
    inp = {"query": rng.standard_normal((b, n, p["dir_gater.weight"].shape[0])),
           "memory": rng.standard_normal((b, m, p["value_transform.weight"].shape[0]))}
    lengths = np.full(b, m)
    lengths[-1] -= 1 if m > 1 else 0
    return inp, {"memory_mask": np.arange(m)[None, :] < lengths[:, None]}


def _mono_call(module, inp, cfg):
    import torch

    mm = cfg.get("memory_mask")
    mm = np.ones(inp["memory"].shape[:2], dtype=bool) if mm is None else np.asarray(mm, dtype=bool)
    return module(inp["query"], inp["memory"], torch.from_numpy(mm))


# ---- MHN HighDivModule: forward(x (B, C, H, W)); 1x1 conv kernels keep torch's layout


def _hoa_build(rng, p, cfg, z):
    c = next(v for k, v in p.items() if k.startswith("convb")).shape[0]
    return {"x": rng.standard_normal((z["b"], c, 2 + z["n"] % 3, 1 + z["n"] % 4))}, {}


def _hoa_infer(keys):
    return {"order": max(int(k[len("convb"):].split("_")[0]) for k in keys if k.startswith("convb"))}


# ---- Co4 ModulatedMultiHeadAttention: forward(x); token 0 is the latent, top_k patches per channel


def _co4_build(rng, p, cfg, z):
    """``N = 1 + top_k + (n mod 4)`` tokens (at least ``top_k`` patches)."""
    n = 1 + int(cfg.get("top_k", 12)) + z["n"] % 4
    return {"x": rng.standard_normal((z["b"], n, p["qkv.weight"].shape[0]))}, {}


# ---- Super attention (oelin's port, single head): forward(x (B, L, C)); L is fixed by project_value


def _super_build(rng, p, cfg, z):
    return {"x": rng.standard_normal((z["b"], p["w_a"].shape[0], p["q_proj.weight"].shape[0]))}, {}


def _arange(n):
    import torch

    return torch.arange(n)


_SPECS = [
    Spec("coca_collinear_attention", "codefuse-ai/Collinear-Constrained-Attention model/llama/modeling_llama.py@79bee17 "
         "(LlamaAttention with t_proj; forward(x, attention_mask=causal finfo.min mask or None, "
         "position_ids=arange(N)); coca_mode='code', the released einsum)",
         rules=[Named(r"(q|t|v|o)_proj\.weight", True), Named(r"(q|t|v|o)_proj\.bias", False)],
         required=("q_proj.weight", "t_proj.weight", "v_proj.weight", "o_proj.weight"),
         call=_coca_call, build=x_build("q_proj.weight"),
         attrs={"num_heads": "num_heads", "num_key_value_heads": "num_key_value_heads", "rope_theta": "rotary_emb.base"},
         defaults={"coca_mode": "code", "is_causal": True}),
    Spec("urpe_toeplitz_modulated_attention", "lsj2408/URPE fairseq/modules/multihead_attention.py@47b711f "
         "(MultiheadAttention, self_attention=True, with rel_pos_bias / ur_rel_pos_bias) and "
         "fairseq/modules/transformer_sentence_encoder.py (TransformerSentenceEncoder's rp_bias / ur_rp_bias "
         "tables and buckets; in the encoder they sit at the top level and the projections at "
         "layers.{i}.self_attn.: give one dict with both); key_padding_mask drawn on the last key",
         rules=[Named(r"(q|k|v|out)_proj\.weight", True),
                Named(r"(q|k|v|out)_proj\.bias|(rp_bias|ur_rp_bias)\.weight", False)],
         required=("q_proj.weight", "k_proj.weight", "v_proj.weight", "out_proj.weight"),
         call=_urpe_call, build=_urpe_build,
         attrs={k: k for k in ("max_seq_len", "rel_pos", "rel_pos_unique", "rp_bucket", "max_rp", "ur_attn",
                               "ur_attn_unique", "ur_rp_bucket", "ur_max_rp")} | {"num_heads": "num_attention_heads"}),
    Spec("position_coupling", "HanseulJo/position-coupling src/model/modeling/custom_gpt2.py@b9cad94 (CustomGPT2Model, "
         "position_encoding_type='abs_learned': inputs_embeds + wpe(position_ids); the coupled IDs of "
         "src/data/addition.py are the config position_ids)",
         rules=[Named(r"wpe\.weight", False)], required=("wpe.weight",), call=_pc_call, build=_pc_build,
         defaults={"position_ids": None}),  # None: the builder draws the IDs for each case
    Spec("gmm_dca_location_attention", "bshall/Tacotron tacotron/model.py@6fee34a (DynamicConvolutionAttention; its "
         "prior buffer P is read and dropped, prior_alpha/prior_beta are config) or LeoniusChen/Attentions-in-"
         "Tacotron gmm.py@8215012 (GMMAttention; version is config; BahdanauAttention's unused query_layer/v are "
         "read and dropped); one module call per decoder step, run over the queries from the one-hot alpha_0",
         rules=_DCA_RULES, load_pick=_loc_pick, save_pick=_loc_pick, call=_loc_call, build=_loc_build,
         attrs={"prior_length": "prior_length", "eps": "eps"}, infer=_loc_infer),
    Spec("latent_alignment_attention", "harvardnlp/var-attn onmt/modules/VariationalAttention.py@ce2ac9a "
         "(VariationalAttention, mode 'exact'/'enum', attn_type 'mlp'/'general'; at decoder.attn. upstream) with "
         "onmt/Models.py Generator (proj; at generator. upstream: give one dict with both) and onmt/Loss.py's "
         "kl_divergence(q, p); the module under test takes (h, memory, mode, memory_lengths, q_scores)",
         rules=[Named(r"(linear_(context|query|in|out)|v|proj)\.weight", True), Named(r"(linear_out|proj)\.bias", False)],
         required=("linear_out.weight", "proj.weight", "proj.bias"),
         call=_latent_call, build=_latent_build, infer=_latent_infer),
    Spec("monotonic_location_attention", "JRC1995/MonotonicLocationAttention models/attentions/"
         "Multiheaded_Monotonic_Attention.py@234f5b5 (Multiheaded_Monotonic_Attention at attention_layer., "
         "location_attention_only = not mix_attention) with models/layers/GRUEncoderDecoder.py's dir_gater, "
         "value_transform and decoder loop; the module under test takes (query, memory, memory_mask)",
         rules=[Named(r"(dir_gater|value_transform)\.weight|attention_layer\.(position_state_linear|value_linear|"
                      r"head_compose_linear|query_linear|key_linear|mix_scorer)\.weight", True),
                Named(r"(dir_gater|value_transform)\.bias|attention_layer\.(position_state_linear\.bias|"
                      r"mix_scorer\.bias|Wsigma|Wrho|step_bias)", False)],
         required=("dir_gater.weight", "value_transform.weight", "attention_layer.position_state_linear.weight",
                   "attention_layer.Wsigma", "attention_layer.Wrho", "attention_layer.value_linear.weight",
                   "attention_layer.head_compose_linear.weight"),
         call=_mono_call, build=_mono_build, infer=_mono_infer,
         attrs={"heads": "attention_layer.heads", "position_past": "attention_layer.position_past",
                "softstair_temp": "attention_layer.softstair_temp"}),
    Spec("neural_attention_mlp_scores", "awayfromzel/neural-attention-research nlp_neural_attention/Models/"
         "NeuralAttention.py@f6572f5 (NeuralAttention; forward(x); vision_neural_attention's copy with causal=False)",
         rules=[Named(r"(to_qkv|W_out|q_proj|k_proj|linear[123])\.weight", True),
                Named(r"(q_proj|k_proj|linear[123])\.bias", False)],
         required=("to_qkv.weight", "W_out.weight", "q_proj.weight", "k_proj.weight", "linear1.weight",
                   "linear2.weight", "linear3.weight"),
         call=lambda module, inp, cfg: module(inp["x"]), build=x_build("to_qkv.weight"),
         attrs={"heads": "heads", "causal": "causal"}),
    Spec("high_order_attention_hoa", "chenbinghui1/MHN model.py@4375c1a (HighDivModule(in_channels, order); "
         "forward(x (B, C, H, W)))",
         rules=[Named(r"(order\d+_\d+_\d+|convb\d+_\d+)\.0\.weight", False)],
         required=(), call=lambda module, inp, cfg: module(inp["x"]), build=_hoa_build, infer=_hoa_infer,
         attrs={"order": "order"}),
    Spec("all_or_here_attention", "wesleytruong/vllm-aha vllm/model_executor/models/olmo2_aha.py@aedfaa1 "
         "(Olmo2AHAAttention, tp_size 1: q_proj with the gate columns, k_proj, v_proj, q_norm, k_norm, o_proj; "
         "forward(positions=arange(N), hidden_states); the hard route carries no gradient: gate_grad='fixed')",
         rules=[Named(r"(q|k|v|o)_proj\.weight", True), Named(r"(q|k|v|o)_proj\.bias|(q|k)_norm\.weight", False)],
         required=("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight"),
         call=lambda module, inp, cfg: module(_arange(inp["x"].shape[1]), inp["x"]), build=x_build("q_proj.weight"),
         attrs={"num_heads": "num_heads", "num_kv_heads": "num_kv_heads", "window": "local_window",
                "rope_base": "rope_theta", "rms_norm_eps": "eps"},
         defaults={"window": 128, "router": "hard", "gate_grad": "fixed"}),
    Spec("triadic_modulation_co4", "ARIA-Funded-TREND/HMS Vision/object_recognition/attention.py@5e47a27 "
         "(ModulatedMultiHeadAttention, num_latents=1, num_heads=1, aggregation='max'; forward(x); upstream "
         "hard-codes topk(12): top_k is read from a module attribute top_k when it has one)",
         rules=[Named(r"qkv\.weight", True), Named(r"qkv\.bias", False)], required=("qkv.weight",),
         call=lambda module, inp, cfg: module(inp["x"]), build=_co4_build,
         attrs={"num_heads": "num_heads", "top_k": "top_k"}, defaults={"top_k": 12}),
    Spec("optimised_efficient_super_attention", "oelin/super-attention super_attention/__init__.py@3781367 "
         "(SuperAttention: variant='super', one head, not causal, the port's only layer; it computes "
         "x @ project_query.weight, so that weight is already (in, out) and is not transposed; "
         "project_value.weight (L, L) is the alignment kernel w_a; forward(x) with N = L)",
         rules=[Rename("q_proj.weight", "project_query.weight", False), Rename("w_a", "project_value.weight", False),
                Rename("o_proj.weight", "project_output.weight", True)],
         required=("project_query.weight", "project_value.weight", "project_output.weight"),
         call=lambda module, inp, cfg: module(inp["x"]), build=_super_build,
         defaults={"num_heads": 1, "variant": "super", "is_causal": False}),
    Spec("diff_mamba", "NadavSc/Diff-Mamba language_modeling/src/models/sequence/modules/diffmambablock.py@60c141e "
         "(DiffMamba: Mamba-1 blocks m1/m2, lambda_q1..lambda_k2, subln; forward(x)[0]; depth = m1.i_layer)",
         rules=[Named(r"m[12]\.(in_proj|x_proj|dt_proj|out_proj)\.weight", True),
                Named(r"m[12]\.((in_proj|dt_proj|out_proj|conv1d)\.bias|conv1d\.weight|A_log|D)"
                      r"|lambda_[qk][12]|subln\.weight", False)],
         required=("m1.in_proj.weight", "m2.in_proj.weight", "lambda_q1", "subln.weight"),
         call=lambda module, inp, cfg: module(inp["x"])[0], build=x_build("m1.in_proj.weight"),
         attrs={"depth": "m1.i_layer", "eps": "subln.eps"}),
]

add_specs(*_SPECS)

add_unmapped("tucker_attention", "code not readable",
             "the official ScSteffen/Tucker-Attention (a Triton kernel on the latent q, k, v and per-head cores) "
             "is neither in the code index nor fetchable, so refattn follows the paper's factor names and no "
             "module's state_dict can be checked")

GROUP_SLUGS = tuple(s.key for s in _SPECS)
"""The keys this module adds to :data:`~refattn.interop.torch_specs.SPECS`."""
