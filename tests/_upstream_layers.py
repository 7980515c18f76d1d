"""PyTorch modules written from official upstream files, for float64 parity tests of refattn layers.

Each builder returns an `UpstreamLayer`: a ``torch.nn.Module`` whose forward restates the cited
upstream module's computation in plain PyTorch (a transcription of the math of
``owner/repo path@commit``, not a copy of its code; only what the compared configuration uses),
and the map from its ``state_dict`` to refattn's params. ``params_from_state_dict`` only
transposes, slices and reshapes, so it also maps a dict of parameter *gradients* (same keys) to
refattn's gradient keys. ``call(module, **inputs)`` runs the module on torch tensors given in
refattn's input layouts (it adapts layouts and mask conventions), and ``config`` holds the refattn
keywords equivalent to the module's construction (buffers such as a random projection go there).

``refattn.interop.torch.check_module`` is meant to be built on these builders; the tests in
``tests/test_fidelity_layers.py`` use `compare_layer` below.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["UpstreamLayer", "compare_layer", "torch_multihead_attention", "performer_fast_attention",
           "transnormer_norm_linear_attention", "mta_attention", "mala_attention", "t5_attention",
           "alibi_self_attention", "efficient_attention_shen",
           "sinkformer_attention_layer", "shaped_gpt2_attention", "PhysicsBiasedAttention",
           "CoherenceAttention", "NanoGPTSelfValueAttention",
           "MultiheadAttentionKV", "IconUncropped", "MossFormerBlock"]


@dataclass
class UpstreamLayer:
    """A PyTorch module and how it maps onto a refattn forward/backward pair."""

    module: nn.Module
    params_from_state_dict: Callable[[dict], dict]
    call: Callable
    forward: Callable
    backward: Callable
    config: dict = field(default_factory=dict)
    source: str = ""


def _np(t):
    return t.detach().cpu().numpy()


def compare_layer(layer: UpstreamLayer, inputs: dict, rng) -> dict:
    """Run the torch module and the refattn pair on the same float64 inputs and parameters.

    Returns ``{name: max relative error}`` for the output, every input and every trainable
    parameter: the max abs difference over the larger of the torch value's max abs and 1e-3 of the
    largest magnitude compared (a gradient that is zero in exact arithmetic, such as a key bias's,
    is compared against that floor instead of against its round-off). Frozen torch parameters and
    buffers are not compared.
    """
    mod = layer.module.double()
    sd = {k: _np(v) for k, v in mod.state_dict().items()}
    params = layer.params_from_state_dict(sd)
    args = dict(inputs)
    if params is not None:
        args["params"] = params
    out, cache = layer.forward(**args, **layer.config)
    g = rng.standard_normal(out.shape)
    grads = layer.backward(g, cache)
    t_in = {k: torch.tensor(np.asarray(v), dtype=torch.float64, requires_grad=True) for k, v in inputs.items()}
    mod.zero_grad()
    t_out = layer.call(mod, **t_in)
    (t_out * torch.tensor(g)).sum().backward()

    pairs = {"out": (out, _np(t_out))}
    for k, t in t_in.items():
        pairs[k] = (grads[k], _np(t.grad))
    # gradients of trainable parameters, NaN for frozen ones and buffers (then skipped)
    pg = {k: np.full(v.shape, np.nan) for k, v in sd.items()}
    for name, prm in mod.named_parameters():
        if prm.requires_grad:
            pg[name] = _np(prm.grad) if prm.grad is not None else np.zeros(tuple(prm.shape))
    for k, v in (layer.params_from_state_dict(pg) or {}).items():
        if not np.isnan(v).any():
            pairs[k] = (grads[k], v)
    missing = set(params or {}) - set(grads)
    assert not missing, f"refattn returned no gradient for {sorted(missing)}"
    floor = 1e-3 * max(float(np.abs(b).max()) for _, b in pairs.values())
    return {k: float(np.abs(np.asarray(a) - b).max() / max(float(np.abs(b).max()), floor, 1e-300))
            for k, (a, b) in pairs.items()}


# ----------------------------------------------------------------------------------------------
# torch.nn.MultiheadAttention itself (no transcription)


def torch_multihead_attention(rng, *, embed_dim: int, num_heads: int, kdim=None, vdim=None, bias: bool = True,
                              add_bias_kv: bool = False, add_zero_attn: bool = False, attn_mask=None,
                              key_padding_mask=None) -> UpstreamLayer:
    """``torch.nn.MultiheadAttention(batch_first=True)`` in float64 with random parameters.

    ``attn_mask`` / ``key_padding_mask`` are given in refattn's convention (boolean True = keep, or
    additive float; ``attn_mask`` ``(N, M)`` or ``(B, H, N, M)``); ``call`` hands PyTorch its own
    (boolean True = masked, a per-head mask as ``(B*H, N, M)``). Inputs: ``x`` (query),
    optional ``context`` (key) and ``value``.
    """
    from refattn.attention.softmax import mha_backward, mha_forward

    torch.manual_seed(int(rng.integers(0, 2**31)))
    mod = nn.MultiheadAttention(embed_dim, num_heads, bias=bias, add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn,
                                kdim=kdim, vdim=vdim, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        for prm in mod.parameters():
            prm.add_(0.1 * torch.randn_like(prm))  # nonzero biases (PyTorch initialises them to 0)
    e = embed_dim

    def to_params(sd):
        if "in_proj_weight" in sd:
            w = sd["in_proj_weight"]
            out = {"q_proj": w[:e].T, "k_proj": w[e:2 * e].T, "v_proj": w[2 * e:].T}
        else:
            out = {n: sd[f"{n}_weight"].T for n in ("q_proj", "k_proj", "v_proj")}
        if "in_proj_bias" in sd:
            b = sd["in_proj_bias"]
            out.update(q_proj_bias=b[:e], k_proj_bias=b[e:2 * e], v_proj_bias=b[2 * e:])
        out["out_proj"] = sd["out_proj.weight"].T
        if "out_proj.bias" in sd:
            out["out_proj_bias"] = sd["out_proj.bias"]
        if "bias_k" in sd:
            out.update(bias_k=sd["bias_k"].reshape(-1), bias_v=sd["bias_v"].reshape(-1))
        return out

    def torch_mask(mk):
        if mk is None:
            return None
        mk = np.asarray(mk)
        t = torch.tensor(~mk) if mk.dtype == np.bool_ else torch.tensor(mk, dtype=torch.float64)
        return t.reshape(-1, *t.shape[-2:]) if t.dim() == 4 else t

    am, kpm = torch_mask(attn_mask), torch_mask(key_padding_mask)

    def call(m, x, context=None, value=None):
        key = x if context is None else context
        val = key if value is None else value
        return m(x, key, val, key_padding_mask=kpm, attn_mask=am, need_weights=False)[0]

    config = {"num_heads": num_heads, "add_zero_attn": add_zero_attn, "attn_mask": attn_mask,
              "key_padding_mask": key_padding_mask}
    return UpstreamLayer(mod, to_params, call, mha_forward, mha_backward, config, "torch.nn.MultiheadAttention")


# ----------------------------------------------------------------------------------------------
# Performer (lucidrains/performer-pytorch performer_pytorch/performer_pytorch.py
# @ fc8b78441b1e27eb5d9b01fc738a8772cee07127: softmax_kernel, linear_attention,
# causal_linear_attention_noncuda, FastAttention)


class _PerformerFastAttention(nn.Module):
    def __init__(self, projection: np.ndarray, causal: bool):
        super().__init__()
        self.register_buffer("projection_matrix", torch.tensor(projection))
        self.causal = causal

    @staticmethod
    def _features(x, w, is_query, eps=1e-4):
        # positive softmax-kernel features; the stabilising max is detached (per row for
        # queries, per (batch, head) over positions and features for keys)
        a = x.shape[-1] ** -0.25
        proj = torch.einsum("...nd,md->...nm", a * x, w)
        sq = (x ** 2).sum(-1, keepdim=True) * (a * a / 2.0)
        stab = proj.amax(dim=-1, keepdim=True) if is_query else proj.amax(dim=(-1, -2), keepdim=True)
        return (torch.exp(proj - sq - stab.detach()) + eps) * w.shape[0] ** -0.5

    def forward(self, q, k, v):
        w = self.projection_matrix
        fq, fk = self._features(q, w, True), self._features(k, w, False)
        if not self.causal:
            den = torch.einsum("...nm,...m->...n", fq, fk.sum(-2))
            return torch.einsum("...nm,...me->...ne", fq, torch.einsum("...nm,...ne->...me", fk, v)) / den[..., None]
        ksum = fk.cumsum(-2) + 1e-6  # eps on every entry of the key prefix sum
        ctx = torch.einsum("...nm,...ne->...nme", fk, v).cumsum(-3)
        return torch.einsum("...nme,...nm->...ne", ctx, fq) / torch.einsum("...nm,...nm->...n", fq, ksum)[..., None]


def performer_fast_attention(rng, *, head_dim: int, nb_features: int, causal: bool) -> UpstreamLayer:
    """performer-pytorch ``FastAttention`` (softmax kernel) with a fixed projection draw."""
    from refattn.attention.linear import performer_backward, performer_forward, performer_projection_matrix

    proj = performer_projection_matrix(nb_features, head_dim, seed=int(rng.integers(0, 2**31)))
    mod = _PerformerFastAttention(proj, causal)
    config = {"projection": proj, "causal": causal, "feature_eps": 1e-4, "denominator_guard": 0.0,
              "key_sum_eps": 1e-6 if causal else 0.0, "stabilizer_grad": False, "key_stabilizer": "per_head"}
    return UpstreamLayer(mod, lambda sd: None, lambda m, q, k, v: m(q, k, v), performer_forward, performer_backward,
                         config, "lucidrains/performer-pytorch performer_pytorch/performer_pytorch.py@fc8b784")


# ----------------------------------------------------------------------------------------------
# TransNormer (OpenNLPLab/fairseq-evo @ 38fa81f233c4e5b4376fb52d86eaa1a80d42bf6a:
# fairseq/modules/x_attention/norm_linear_attention.py NormLinearAttention, urpe.py Urpe
# (core_matrix=1, p_matrix=3), norm/rms_norm.py SimpleRMSNorm; arch transnormer_t1 in
# fairseq/models/lm_x_attention/norm_transformer_lm.py)


class _Urpe(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.theta = nn.Parameter(10000 ** (-2 / d * torch.arange(d // 2, dtype=torch.float64)).reshape(1, 1, -1))
        v = torch.randn(d, dtype=torch.float64)
        self.v = nn.Parameter(v / torch.norm(v), requires_grad=False)

    def forward(self, x):
        x = x - 2 * (x @ self.v)[..., None] * self.v  # Householder reflection
        ang = (self.theta * torch.arange(x.shape[-2], dtype=x.dtype)[:, None]).repeat_interleave(2, -1)
        rot = torch.stack([-x[..., 1::2], x[..., 0::2]], -1).reshape(x.shape)
        return x * torch.cos(ang) + rot * torch.sin(ang)


class _NormLinearAttention(nn.Module):
    def __init__(self, embed_dim, num_heads, *, act, norm, causal, urpe):
        super().__init__()
        self.h, self.causal = num_heads, causal
        for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
            setattr(self, name, nn.Linear(embed_dim, embed_dim))
        self.act = {"elu": F.elu, "gelu": F.gelu, "1+elu": lambda t: 1 + F.elu(t)}[act]
        self.norm_type = norm
        if norm == "layernorm":
            self.layer_norm = nn.LayerNorm(embed_dim)
        self.urpe = _Urpe(embed_dim // num_heads) if urpe else None

    def forward(self, x):  # x (B, L, E)
        b, n, e = x.shape

        def heads(t):
            return t.reshape(b, n, self.h, e // self.h).transpose(1, 2)

        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        q, k = self.act(q), self.act(k)
        if self.urpe is not None:
            q, k = self.urpe(q), self.urpe(k)
        if self.causal:
            out = torch.tril(q @ k.transpose(-1, -2)) @ v
        else:
            out = q @ (k.transpose(-1, -2) @ v)
        out = out.transpose(1, 2).reshape(b, n, e)
        if self.norm_type == "simplermsnorm":
            out = out / (out.norm(2, dim=-1, keepdim=True) * e ** -0.5 + 1e-8)
        else:
            out = self.layer_norm(out)
        return self.out_proj(out)


def transnormer_norm_linear_attention(rng, *, embed_dim: int, num_heads: int, act: str = "elu",
                                      norm: str = "simplermsnorm", causal: bool = True,
                                      urpe: bool = True) -> UpstreamLayer:
    """fairseq-evo ``NormLinearAttention`` (defaults: the ``transnormer_t1`` arch), parameters
    perturbed from their initialisation by ``rng``."""
    from refattn.attention.linear import transnormer_layer_backward, transnormer_layer_forward

    torch.manual_seed(int(rng.integers(0, 2**31)))
    mod = _NormLinearAttention(embed_dim, num_heads, act=act, norm=norm, causal=causal, urpe=urpe).double()
    with torch.no_grad():
        for prm in mod.parameters():
            if prm.requires_grad:
                prm.add_(0.2 * torch.randn_like(prm))

    def to_params(sd):
        out = {}
        for key, val in sd.items():
            if key.endswith("proj.weight"):
                out[key] = val.T
            elif key.startswith("urpe."):
                out[key] = val.reshape(-1)
            else:
                out[key] = val
        return out

    config = {"num_heads": num_heads, "causal": causal, "norm": norm,
              "feature_map": {"1+elu": "elu_plus_one"}.get(act, act)}
    return UpstreamLayer(mod, to_params, lambda m, x: m(x), transnormer_layer_forward, transnormer_layer_backward,
                         config, "OpenNLPLab/fairseq-evo fairseq/modules/x_attention/norm_linear_attention.py@38fa81f")


# ----------------------------------------------------------------------------------------------
# Multi-Token Attention (facebookresearch/RAM @ e6f051fbcfaef4cab69bf2ea1b25f500f94c0c64
# projects/mta/mta_transformer.py: Attention with use_mta, _mta_convolution, _head_convolution,
# RMSNorm; facebookresearch/lingua @ 437d680e521873bb5971067148a69587790da853 lingua/transformer.py:
# precompute_freqs_cis, apply_rotary_emb, repeat_kv). Computed in float64 throughout.


def _rope_interleaved(x, theta):  # x (B, N, H, d); pairs (2j, 2j+1) rotated by t * theta^(-2j/d)
    n, d = x.shape[1], x.shape[-1]
    freqs = theta ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = torch.arange(n, dtype=torch.float64)[:, None] * freqs  # (N, d/2)
    cos, sin = torch.cos(ang)[None, :, None], torch.sin(ang)[None, :, None]
    a, b = x[..., 0::2], x[..., 1::2]
    return torch.stack([a * cos - b * sin, a * sin + b * cos], -1).flatten(-2)


class _MTAAttention(nn.Module):
    def __init__(self, dim, head_dim, n_heads, n_kv_heads, *, rope_theta, q_kernel, k_kernel, pad_key,
                 head_kernel_size, gate_1d, layer_norm_rescale, layer_id):
        super().__init__()
        self.h, self.hkv, self.d, self.theta, self.pad_key = n_heads, n_kv_heads, head_dim, rope_theta, pad_key
        self.wq = nn.Linear(dim, n_heads * head_dim, bias=False)
        self.wk = nn.Linear(dim, n_kv_heads * head_dim, bias=False)
        self.wv = nn.Linear(dim, n_kv_heads * head_dim, bias=False)
        self.wo = nn.Linear(n_heads * head_dim, dim, bias=False)
        self.mta_kernel = nn.Parameter(torch.randn(n_heads, 1, q_kernel, k_kernel) * 0.4)
        self.wpsm = nn.Linear(n_heads, n_heads, bias=False)
        self.mta_kernel_after_sm = nn.Parameter(torch.randn(n_heads, 1, q_kernel, k_kernel) * 0.4)
        if head_kernel_size:
            self.head_kernel = nn.Parameter(torch.randn(n_heads // head_kernel_size, head_kernel_size,
                                                        head_kernel_size))
        else:
            self.head_kernel = None
            self.wposm = nn.Linear(n_heads, n_heads, bias=False)
        self.subln = nn.Module()
        self.subln.weight = nn.Parameter(1 + 0.3 * torch.randn(head_dim))
        self.rescale = 1 - (0.8 - 0.6 * math.exp(-0.3 * layer_id)) if layer_norm_rescale else 1.0
        self.gate = nn.Linear(head_dim, 1 if gate_1d else head_dim)

    def _conv(self, s, kernel, removed):
        cq, ck = kernel.shape[-2:]
        s = s.masked_fill(removed, 0.0)
        pl, pr = {"left": (ck - 1, 0), "right": (0, ck - 1), "both": ((ck - 1) // 2, (ck - 1) // 2)}[self.pad_key]
        return F.conv2d(F.pad(s, (pl, pr, cq - 1, 0)), kernel, groups=self.h)

    @staticmethod
    def _mix(s, lin):  # mixes the head axis 1
        return lin(s.transpose(1, -1)).transpose(1, -1)

    def forward(self, x):
        b, n, _ = x.shape
        q = _rope_interleaved(self.wq(x).view(b, n, self.h, self.d), self.theta)
        k = _rope_interleaved(self.wk(x).view(b, n, self.hkv, self.d), self.theta)
        v = self.wv(x).view(b, n, self.hkv, self.d)
        rep = self.h // self.hkv
        k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        removed = torch.ones(n, n, dtype=torch.bool).triu(1)
        s = self._conv(q @ k.transpose(-1, -2) / math.sqrt(self.d), self.mta_kernel, removed)
        s = self._mix(s, self.wpsm)
        a = torch.softmax(s.masked_fill(removed, float("-inf")), dim=-1)
        a = self._conv(a, self.mta_kernel_after_sm, removed).masked_fill(removed, 0.0)
        if self.head_kernel is not None:
            g, c = self.head_kernel.shape[:2]
            a = torch.einsum("bgcnm,gck->bgknm", a.reshape(b, g, c, n, n), self.head_kernel).reshape(b, self.h, n, n)
        else:
            a = self._mix(a, self.wposm)
        o = (a @ v).transpose(1, 2)  # (B, N, H, d)
        o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + 1e-5) * self.subln.weight * self.rescale
        o = o * torch.sigmoid(self.gate(o))
        return self.wo(o.reshape(b, n, self.h * self.d))


def mta_attention(rng, *, dim: int, head_dim: int, n_heads: int, n_kv_heads: int, rope_theta: float = 10000.0,
                  q_kernel: int = 2, k_kernel: int = 3, pad_key: str = "both", head_kernel_size=2,
                  gate_1d: bool = True, layer_norm_rescale: bool = False, layer_id: int = 0) -> UpstreamLayer:
    """RAM ``Attention`` with ``use_mta`` and every stage on (pre-/post-softmax kernels, ``wpsm``,
    ``head_kernel`` or ``wposm``, group norm, gate), random parameters."""
    from refattn.attention.differential import multi_token_attention_layer_backward, multi_token_attention_layer_forward

    torch.manual_seed(int(rng.integers(0, 2**31)))
    mod = _MTAAttention(dim, head_dim, n_heads, n_kv_heads, rope_theta=rope_theta, q_kernel=q_kernel,
                        k_kernel=k_kernel, pad_key=pad_key, head_kernel_size=head_kernel_size, gate_1d=gate_1d,
                        layer_norm_rescale=layer_norm_rescale, layer_id=layer_id).double()

    def to_params(sd):
        return {key: (val.T if val.ndim == 2 else val) for key, val in sd.items()}

    config = {"num_heads": n_heads, "num_kv_heads": n_kv_heads, "rope_theta": rope_theta, "pad_key": pad_key,
              "layer_norm_rescale": layer_norm_rescale, "layer_id": layer_id}
    return UpstreamLayer(mod, to_params, lambda m, x: m(x), multi_token_attention_layer_forward,
                         multi_token_attention_layer_backward, config,
                         "facebookresearch/RAM projects/mta/mta_transformer.py@e6f051f")


# ----------------------------------------------------------------------------------------------
# MALA (qhfan/MALA @ 7114e6391e16a79e52382cbbcaa7f035705f3449 classfication_release/model.py:
# AddLinearAttention, RoPE, theta_shift, rotate_every_two). RoPE's tables are built per call from
# the feature-map size, as upstream's stages do.


def _mala_rope(hh, ww, head_dim):
    angle = 1.0 / (10000 ** torch.linspace(0, 1, head_dim // 4, dtype=torch.float64))
    angle = angle.unsqueeze(-1).repeat(1, 2).flatten()
    ih, iw = torch.arange(hh, dtype=torch.float64), torch.arange(ww, dtype=torch.float64)
    tabs = []
    for fn in (torch.sin, torch.cos):
        th = fn(ih[:, None] * angle[None]).unsqueeze(1).repeat(1, ww, 1)
        tw = fn(iw[:, None] * angle[None]).unsqueeze(0).repeat(hh, 1, 1)
        tabs.append(torch.cat([th, tw], -1).flatten(0, 1))
    return tabs  # sin, cos ((h w), d)


def _theta_shift(x, sin, cos):
    rot = torch.stack([-x[..., 1::2], x[..., 0::2]], -1).flatten(-2)
    return x * cos + rot * sin


class _MALAAttention(nn.Module):
    def __init__(self, dim, num_heads):
        super().__init__()
        self.dim, self.h, self.d = dim, num_heads, dim // num_heads
        self.scale = self.d ** -0.5
        self.qkvo = nn.Conv2d(dim, 4 * dim, 1)
        self.lepe = nn.Conv2d(dim, dim, 5, 1, 2, groups=dim)
        self.proj = nn.Conv2d(dim, dim, 1)

    def forward(self, x):
        b, c, hh, ww = x.shape
        sin, cos = _mala_rope(hh, ww, self.d)
        u = self.qkvo(x)
        o = u[:, 3 * c:]
        lepe = self.lepe(u[:, 2 * c:3 * c])
        q, k, v = u[:, :3 * c].reshape(b, 3, self.h, self.d, hh * ww).permute(1, 0, 2, 4, 3)
        q, k = F.elu(q) + 1, F.elu(k) + 1
        z = q @ k.mean(dim=-2, keepdim=True).transpose(-2, -1) * self.scale
        q, k = _theta_shift(q, sin, cos), _theta_shift(k, sin, cos)
        s = (self.scale / (hh * ww)) ** 0.5
        kv = (k.transpose(-2, -1) * s) @ (v * s)
        res = q @ kv * (1 + 1 / (z + 1e-6)) - z * v.mean(dim=2, keepdim=True)
        res = res.permute(0, 1, 3, 2).reshape(b, c, hh, ww)
        return self.proj((res + lepe) * o)


def mala_attention(rng, *, dim: int, num_heads: int) -> UpstreamLayer:
    """MALA ``AddLinearAttention`` with its RoPE, random parameters (PyTorch's default init)."""
    from refattn.attention.differential.mala import mala_layer_backward, mala_layer_forward

    torch.manual_seed(int(rng.integers(0, 2**31)))
    mod = _MALAAttention(dim, num_heads).double()
    return UpstreamLayer(mod, dict, lambda m, x: m(x), mala_layer_forward, mala_layer_backward,
                         {"num_heads": num_heads}, "qhfan/MALA classfication_release/model.py@7114e63")


# ----------------------------------------------------------------------------------------------
# T5 (huggingface/transformers @ 6b8b757dfcb582379a64f013cdce46c43629f2b0
# src/transformers/models/t5/modeling_t5.py: T5Attention with _relative_position_bucket and
# compute_bias; no cache, no head pruning, eval mode). The causal decoder mask is added to the
# position bias with finfo.min, as T5's models build it.


def _t5_bucket(rp, bidirectional, num_buckets, max_distance):
    out = torch.zeros_like(rp)
    if bidirectional:
        num_buckets //= 2
        out = out + (rp > 0).long() * num_buckets
        rp = rp.abs()
    else:
        rp = -torch.min(rp, torch.zeros_like(rp))
    max_exact = num_buckets // 2
    large = max_exact + (torch.log(rp.float() / max_exact) / math.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).long()
    large = torch.min(large, torch.full_like(large, num_buckets - 1))
    return out + torch.where(rp < max_exact, rp, large)


class _T5Attention(nn.Module):
    def __init__(self, d_model, d_kv, n_heads, *, is_decoder, has_bias, num_buckets, max_distance, d_kv_in=None):
        super().__init__()
        self.h, self.d, self.is_decoder = n_heads, d_kv, is_decoder
        self.nb, self.md = num_buckets, max_distance
        inner, kv_in = n_heads * d_kv, d_kv_in or d_model
        self.q = nn.Linear(d_model, inner, bias=False)
        self.k = nn.Linear(kv_in, inner, bias=False)
        self.v = nn.Linear(kv_in, inner, bias=False)
        self.o = nn.Linear(inner, d_model, bias=False)
        if has_bias:
            self.relative_attention_bias = nn.Embedding(num_buckets, n_heads)
        self.has_bias = has_bias

    def forward(self, x, mask=None, key_value_states=None):  # HF's argument names and order
        b, n = x.shape[:2]
        kv = x if key_value_states is None else key_value_states
        q = self.q(x).view(b, -1, self.h, self.d).transpose(1, 2)
        k = self.k(kv).view(b, -1, self.h, self.d).transpose(1, 2)
        v = self.v(kv).view(b, -1, self.h, self.d).transpose(1, 2)
        m = k.shape[-2]
        scores = q @ k.transpose(3, 2)
        if self.has_bias:
            rp = torch.arange(m)[None, :] - torch.arange(n)[:, None]
            bk = _t5_bucket(rp, not self.is_decoder, self.nb, self.md)
            pb = self.relative_attention_bias(bk).permute(2, 0, 1).unsqueeze(0)
        else:
            pb = torch.zeros((1, self.h, n, m), dtype=scores.dtype)
        if mask is not None:
            pb = pb + mask
        w = torch.softmax(scores + pb, dim=-1)  # upstream casts to float32 here; kept float64 for parity
        return self.o((w @ v).transpose(1, 2).reshape(b, -1, self.h * self.d))


def t5_attention(rng, *, d_model: int, d_kv: int, n_heads: int, is_decoder: bool = False, has_bias: bool = True,
                 num_buckets: int = 8, max_distance: int = 16, cross_dim=None, causal: bool = False) -> UpstreamLayer:
    """HF ``T5Attention`` (self-attention, or cross-attention when ``cross_dim`` is given), random parameters."""
    from refattn.attention.softmax.relative import t5_attention_layer_backward, t5_attention_layer_forward

    torch.manual_seed(int(rng.integers(0, 2**31)))
    mod = _T5Attention(d_model, d_kv, n_heads, is_decoder=is_decoder, has_bias=has_bias, num_buckets=num_buckets,
                       max_distance=max_distance, d_kv_in=cross_dim).double()
    with torch.no_grad():  # Mesh-TF-like scales so that the unscaled scores stay O(1)
        for lin in (mod.q, mod.k, mod.v, mod.o):
            lin.weight.mul_(0.7)

    def to_params(sd):
        return {key: (val.T if key != "relative_attention_bias.weight" else val) for key, val in sd.items()}

    def call(m, x, key_value_states=None):
        n = x.shape[1]
        mk = key_value_states.shape[1] if key_value_states is not None else n
        mask = None
        if causal:
            mask = torch.zeros(n, mk, dtype=torch.float64).masked_fill(
                torch.ones(n, mk, dtype=torch.bool).triu(1), torch.finfo(torch.float64).min)
        return m(x, mask=mask, key_value_states=key_value_states)

    config = {"num_heads": n_heads, "is_decoder": is_decoder, "is_causal": causal, "num_buckets": num_buckets,
              "max_distance": max_distance}
    return UpstreamLayer(mod, to_params, call, t5_attention_layer_forward, t5_attention_layer_backward, config,
                         "huggingface/transformers src/transformers/models/t5/modeling_t5.py@6b8b757")


# ----------------------------------------------------------------------------------------------
# ALiBi (ofirpress/attention_with_linear_biases @ 4b92f28a005ead2567abe2359f633e73e08f3833:
# fairseq/models/transformer.py TransformerDecoder get_slopes, self.alibi, buffered_future_mask;
# fairseq/modules/multihead_attention.py MultiheadAttention with self_attention=True, which
# dispatches to F.multi_head_attention_forward with separate projection weights). The alibi buffer
# is built in float64 here (upstream: a float32 torch.Tensor cast to the input dtype).


def _alibi_get_slopes(n):
    def power_of_2(n):
        start = 2 ** (-2 ** -(math.log2(n) - 3))
        return [start * start ** i for i in range(n)]
    if math.log2(n).is_integer():
        return power_of_2(n)
    c = 2 ** math.floor(math.log2(n))
    return power_of_2(c) + _alibi_get_slopes(2 * c)[0::2][:n - c]


class _FairseqAlibiSelfAttention(nn.Module):
    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.e, self.h = embed_dim, num_heads
        self.k_proj = nn.Linear(embed_dim, embed_dim)
        self.v_proj = nn.Linear(embed_dim, embed_dim)
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)
        self.slopes = torch.tensor(_alibi_get_slopes(num_heads), dtype=torch.float64)

    def future_mask(self, bsz, t):
        alibi = (self.slopes[:, None, None] * torch.arange(t, dtype=torch.float64)[None, None]).repeat(bsz, 1, 1)
        causal = torch.triu(torch.full((t, t), float("-inf"), dtype=torch.float64), 1)
        return causal[None] + alibi  # (bsz * H, t, t), batch-major like F.multi_head_attention_forward

    def forward(self, x_tbc):
        t, bsz, _ = x_tbc.shape
        return F.multi_head_attention_forward(
            x_tbc, x_tbc, x_tbc, self.e, self.h, torch.empty([0]),
            torch.cat((self.q_proj.bias, self.k_proj.bias, self.v_proj.bias)), None, None, False, 0.0,
            self.out_proj.weight, self.out_proj.bias, False, None, False, self.future_mask(bsz, t),
            use_separate_proj_weight=True, q_proj_weight=self.q_proj.weight, k_proj_weight=self.k_proj.weight,
            v_proj_weight=self.v_proj.weight)[0]


def alibi_self_attention(rng, *, embed_dim: int, num_heads: int) -> UpstreamLayer:
    """The official ALiBi decoder self-attention (causal, fixed slopes), random parameters."""
    from refattn.attention.softmax.alibi import alibi_layer_backward, alibi_layer_forward

    torch.manual_seed(int(rng.integers(0, 2**31)))
    mod = _FairseqAlibiSelfAttention(embed_dim, num_heads).double()

    def to_params(sd):
        return {key: (val.T if val.ndim == 2 else val) for key, val in sd.items()}

    return UpstreamLayer(mod, to_params, lambda m, x: m(x.transpose(0, 1)).transpose(0, 1), alibi_layer_forward,
                         alibi_layer_backward, {"num_heads": num_heads},
                         "ofirpress/attention_with_linear_biases fairseq/models/transformer.py@4b92f28")


# ----------------------------------------------------------------------------------------------
# Efficient attention, Shen et al. (cmsflash/efficient-attention @ 46a5f9eaf09470affb0ab30932b7748cc3c871ef
# efficient_attention.py: EfficientAttention).


class _EfficientAttention(nn.Module):
    def __init__(self, in_channels, key_channels, head_count, value_channels):
        super().__init__()
        self.ck, self.cv, self.nh = key_channels, value_channels, head_count
        self.keys = nn.Conv2d(in_channels, key_channels, 1)
        self.queries = nn.Conv2d(in_channels, key_channels, 1)
        self.values = nn.Conv2d(in_channels, value_channels, 1)
        self.reprojection = nn.Conv2d(value_channels, in_channels, 1)

    def forward(self, x):
        n, _, h, w = x.shape
        keys = self.keys(x).reshape(n, self.ck, h * w)
        queries = self.queries(x).reshape(n, self.ck, h * w)
        values = self.values(x).reshape(n, self.cv, h * w)
        hk, hv = self.ck // self.nh, self.cv // self.nh
        outs = []
        for i in range(self.nh):
            key = F.softmax(keys[:, i * hk:(i + 1) * hk], dim=2)
            query = F.softmax(queries[:, i * hk:(i + 1) * hk], dim=1)
            context = key @ values[:, i * hv:(i + 1) * hv].transpose(1, 2)
            outs.append((context.transpose(1, 2) @ query).reshape(n, hv, h, w))
        return self.reprojection(torch.cat(outs, dim=1)) + x


def efficient_attention_shen(rng, *, in_channels: int, key_channels: int, head_count: int,
                             value_channels: int) -> UpstreamLayer:
    """Upstream ``EfficientAttention``, PyTorch's default init."""
    from refattn.attention.linear.efficient import efficient_attention_layer_backward, efficient_attention_layer_forward

    torch.manual_seed(int(rng.integers(0, 2**31)))
    mod = _EfficientAttention(in_channels, key_channels, head_count, value_channels).double()
    return UpstreamLayer(mod, dict, lambda m, x: m(x), efficient_attention_layer_forward,
                         efficient_attention_layer_backward, {"head_count": head_count},
                         "cmsflash/efficient-attention efficient_attention.py@46a5f9e")


# ----------------------------------------------------------------------------------------------
# Sinkformer (michaelsdr/sinkformers @ 045d933490f396c068cba6d7668bb1707a94c7aa
# vit-pytorch/vit_pytorch/vit.py Attention, vit-pytorch/vit_pytorch/sinkhorn.py SinkhornDistance).
# The marginals mu, nu are built in float64 (upstream: float32 tensors, so log(1/N) is rounded
# to float32 before it meets the float64 scores). The early stop (a row update below 1e-12) is
# kept; random inputs never reach it in 3 steps.


class _SinkhornDistance(nn.Module):
    def __init__(self, eps, max_iter):
        super().__init__()
        self.eps, self.max_iter = eps, max_iter

    def _m(self, c, u, v):
        return (-c + u.unsqueeze(-1) + v.unsqueeze(-2)) / self.eps

    def forward(self, c_):
        c = -c_
        bsz, nx, ny = c.shape
        mu = torch.full((bsz, nx), 1.0 / nx, dtype=torch.float64)
        nu = torch.full((bsz, ny), 1.0 / ny, dtype=torch.float64)
        u, v = torch.zeros_like(mu), torch.zeros_like(nu)
        for i in range(self.max_iter):
            if i % 2 == 0:
                u1 = u
                u = self.eps * (torch.log(mu) - torch.logsumexp(self._m(c, u, v), dim=-1)) + u
                err = (u - u1).abs().sum(-1).mean()
            else:
                v = self.eps * (torch.log(nu) - torch.logsumexp(self._m(c, u, v).transpose(-2, -1), dim=-1)) + v
            if err.item() < 1e-12:
                break
        return torch.exp(self._m(c, u, v))


class _SinkformerAttention(nn.Module):
    def __init__(self, dim, heads, dim_head, max_iter, eps):
        super().__init__()
        inner = dim_head * heads
        self.heads, self.scale = heads, dim_head ** -0.5
        self.sink = _SinkhornDistance(eps, max_iter)
        self.to_qkv = nn.Linear(dim, inner * 3, bias=False)
        self.to_out = nn.Sequential(nn.Linear(inner, dim)) if not (heads == 1 and dim_head == dim) else nn.Identity()

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = (t.reshape(b, n, self.heads, -1).transpose(1, 2) for t in self.to_qkv(x).chunk(3, dim=-1))
        dots = q @ k.transpose(-1, -2) * self.scale
        shape = dots.shape
        attn = self.sink(dots.reshape(-1, shape[2], shape[3]))
        attn = (attn * attn.shape[-1]).view(shape)
        return self.to_out((attn @ v).transpose(1, 2).reshape(b, n, -1))


def sinkformer_attention_layer(rng, *, dim: int, heads: int, dim_head: int, max_iter: int = 3,
                               eps: float = 1.0) -> UpstreamLayer:
    """Upstream Sinkformer ``Attention`` (PyTorch's default init)."""
    from refattn.attention.linear.sinkformer import sinkformer_layer_backward, sinkformer_layer_forward

    torch.manual_seed(int(rng.integers(0, 2**31)))
    mod = _SinkformerAttention(dim, heads, dim_head, max_iter, eps).double()

    def to_params(sd):
        return {key: (val.T if val.ndim == 2 else val) for key, val in sd.items()}

    return UpstreamLayer(mod, to_params, lambda m, x: m(x), sinkformer_layer_forward, sinkformer_layer_backward,
                         {"heads": heads, "n_iter": max_iter, "eps": eps},
                         "michaelsdr/sinkformers vit-pytorch/vit_pytorch/vit.py@045d933")


# ----------------------------------------------------------------------------------------------
# Shaped attention (bobby-he/simplified_transformers @ 8d4ea7965f61c61259123a37ff06cdef636845c0
# simplified_transformers/model_utils.py: myGPT2Attention, MyConv1D, RMSNorm). MyConv1D's
# non-persistent ``id`` is built on the CPU (upstream: ``.cuda()``) and handed to refattn as config;
# dot_norm "none" (its "tanh" computes in float32); no cache, no dropout.


class _MyConv1D(nn.Module):
    def __init__(self, nf, nx, resid_gain=None, skip_gain=None, init_type="normal", bias=True):
        super().__init__()
        self.nf = nf
        self.bias = nn.Parameter(torch.zeros(nf), requires_grad=bias)
        self.skip = skip_gain is not None
        if not self.skip:
            self.weight = nn.Parameter(torch.randn(nx, nf) * 0.3)
        else:
            self.resid_gain = nn.Parameter(torch.tensor([float(resid_gain)]))
            self.skip_gain = nn.Parameter(torch.tensor([float(skip_gain)]))
            self.weight = nn.Parameter(torch.randn(nx, nx) * 0.3)  # upstream zeros; random to test the gradient
            self.id = torch.eye(nx) if init_type == "id" else torch.randn(nx, nx) / math.sqrt(nx)
            self.init_type = init_type

    def forward(self, x):
        out = x.size()[:-1] + (self.nf,)
        if self.skip:
            if self.resid_gain == 0 and self.init_type == "id":
                return torch.add(self.bias, x * self.skip_gain).view(out)
            w = self.resid_gain * self.weight + self.skip_gain * self.id.to(x.dtype)
            return torch.addmm(self.bias, x.reshape(-1, x.size(-1)), w).view(out)
        return torch.addmm(self.bias, x.reshape(-1, x.size(-1)), self.weight).view(out)


class _BzRMSNorm(nn.Module):
    def __init__(self, d, eps):
        super().__init__()
        self.eps, self.d = eps, d
        self.scale = nn.Parameter(1 + 0.3 * torch.randn(d))

    def forward(self, x):
        return self.scale * (x / (x.norm(2, dim=-1, keepdim=True) * self.d ** -0.5 + self.eps))


class _ShapedGPT2Attention(nn.Module):
    def __init__(self, dim, heads, *, centre_attn, value, proj, qk_norm, eps, max_positions=16):
        super().__init__()
        self.c, self.h, self.d, self.centre = dim, heads, dim // heads, centre_attn
        self.qk_attn = _MyConv1D(2 * dim, dim)
        with torch.no_grad():
            self.qk_attn.bias.normal_(0, 0.2)
        self.v_attn = _MyConv1D(dim, dim, **value) if value is not None else nn.Identity()
        self.c_proj = _MyConv1D(dim, dim, **proj) if proj is not None else nn.Identity()
        self.q_norm = _BzRMSNorm(self.d, eps) if qk_norm else nn.Identity()
        self.k_norm = _BzRMSNorm(self.d, eps) if qk_norm else nn.Identity()
        for name in ("attn_mat_resid_gain", "attn_mat_skip_gain", "centre_attn_gain"):
            setattr(self, name, nn.Parameter(1 + 0.3 * torch.randn(1, heads, 1, 1)))
        mp = max_positions
        self.uniform_causal_attn_mat = torch.tril(torch.ones(mp, mp, dtype=torch.float64)
                                                  / torch.arange(1, mp + 1).view(-1, 1)).view(1, 1, mp, mp)
        self.diag = torch.eye(mp, dtype=torch.float64).view(1, 1, mp, mp)
        self.causal = torch.tril(torch.ones(mp, mp, dtype=torch.bool)).view(1, 1, mp, mp)

    def forward(self, x):
        b, n, _ = x.shape
        query, key = self.qk_attn(x).split(self.c, dim=2)
        value = self.v_attn(x)
        q, k, v = (t.view(b, n, self.h, self.d).permute(0, 2, 1, 3) for t in (query, key, value))
        q, k = self.q_norm(q), self.k_norm(k)
        w = (q @ k.transpose(-1, -2)) / v.size(-1) ** 0.5
        w = torch.where(self.causal[:, :, :n, :n], w, torch.tensor(torch.finfo(w.dtype).min, dtype=w.dtype))
        w = self.attn_mat_resid_gain * torch.softmax(w, dim=-1)
        if self.centre:
            w = w + self.attn_mat_skip_gain * self.diag[:, :, :n, :n] - self.centre_attn_gain * \
                self.uniform_causal_attn_mat[:, :, :n, :n]
        o = (w @ v).permute(0, 2, 1, 3).reshape(b, n, self.c)
        return self.c_proj(o)


def shaped_gpt2_attention(rng, *, dim: int, heads: int, centre_attn: bool = True, value=None, proj=None,
                          qk_norm: bool = False, eps: float = 1e-5) -> UpstreamLayer:
    """``myGPT2Attention``; ``value`` / ``proj``: None (nn.Identity) or MyConv1D kwargs
    (``{}`` a plain weight; ``resid_gain``, ``skip_gain``, ``init_type`` the reparameterised one)."""
    from refattn.attention.differential.shaped import shaped_attention_layer_backward, shaped_attention_layer_forward

    torch.manual_seed(int(rng.integers(0, 2**31)))
    mod = _ShapedGPT2Attention(dim, heads, centre_attn=centre_attn, value=value, proj=proj, qk_norm=qk_norm,
                               eps=eps).double()

    def to_params(sd):
        out = {}
        for key, val in sd.items():
            if key.endswith("_gain") and val.ndim == 4:
                val = val.reshape(-1)
            if key in ("v_attn.bias", "c_proj.bias") and not getattr(mod, key.split(".")[0]).bias.requires_grad:
                continue  # upstream bias=False: a frozen zero vector, left out of refattn's params
            out[key] = val
        return out

    config = {"num_heads": heads, "centre_attn": centre_attn, "qk_norm_eps": eps}
    for name in ("v_attn", "c_proj"):
        sub = getattr(mod, name)
        if getattr(sub, "skip", False):
            config[f"{name}_id"] = sub.id.double().numpy()
    return UpstreamLayer(mod, to_params, lambda m, x: m(x), shaped_attention_layer_forward,
                         shaped_attention_layer_backward, config,
                         "bobby-he/simplified_transformers simplified_transformers/model_utils.py@8d4ea79")


# ----------------------------------------------------------------------------------------------
# PIBERT (Samsomyajit/pibert @ 0b48dea18da6faa14d5bba24a1a8a43446fa3437
# pibert/physics/physics_attention.py: PhysicsBiasedAttention). Dropout omitted (eval mode).


class PhysicsBiasedAttention(nn.Module):
    """Softmax self-attention with logits shifted by ``-lambda (|r_j| - |r_i|)``, as upstream."""

    def __init__(self, hidden_dim: int, num_heads: int, lambda_param: float = 1.0):
        super().__init__()
        self.hidden_dim, self.num_heads, self.head_dim = hidden_dim, num_heads, hidden_dim // num_heads
        self.lambda_param = lambda_param
        self.q_proj, self.k_proj = nn.Linear(hidden_dim, hidden_dim), nn.Linear(hidden_dim, hidden_dim)
        self.v_proj, self.out_proj = nn.Linear(hidden_dim, hidden_dim), nn.Linear(hidden_dim, hidden_dim)

    def forward(self, x, coords=None, pde_residuals=None, mask=None):
        b, s, _ = x.shape
        q, k, v = (p(x).view(b, s, self.num_heads, self.head_dim).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        scores = q @ k.transpose(-2, -1) / self.head_dim ** 0.5
        if pde_residuals is not None and self.lambda_param > 0:
            n = torch.norm(pde_residuals, dim=-1)
            scores = scores - self.lambda_param * (n.unsqueeze(1) - n.unsqueeze(2)).unsqueeze(1)
        if mask is not None:
            scores = scores.masked_fill(mask == 0, float("-inf"))
        out = (F.softmax(scores, dim=-1) @ v).transpose(1, 2).contiguous().view(b, s, self.hidden_dim)
        return self.out_proj(out)


# ----------------------------------------------------------------------------------------------
# Sonnet (ClaudiaShu/Sonnet @ 0288de47db8692e82a951d72c9bff54526970afb
# sonnet/mts_model/models/Sonnet.py: CoherenceAttention). Dropout omitted (eval mode).


class CoherenceAttention(nn.Module):
    """Time weights from the query/key coherence over the hidden axis; returns (B, N, T, d_model)."""

    def __init__(self, d_model: int, d_k: int, hidden_dim: int):
        super().__init__()
        self.d_k, self.hidden_dim, self.scale = d_k, hidden_dim, d_k ** -0.5
        self.proj = nn.Linear(d_model, hidden_dim * 3)
        self.var_attn = nn.Parameter(torch.eye(d_model))
        self.var_mlp = nn.Sequential(nn.Linear(hidden_dim, hidden_dim), nn.GELU(), nn.Linear(hidden_dim, hidden_dim))
        self.out_proj = nn.Linear(hidden_dim, d_model)

    def forward(self, coeffs):
        b, n, t, _ = coeffs.shape
        qkv = self.proj(coeffs).reshape(b, n, t, self.hidden_dim, 3)
        q, k, v = (qkv[..., i].transpose(2, 3) for i in range(3))  # (B, N, hidden, T)
        qf, kf = torch.fft.rfft(q, dim=2), torch.fft.rfft(k, dim=2)
        pxy, pxx, pyy = ((a * c.conj()).mean(dim=-2) for a, c in ((qf, kf), (qf, qf), (kf, kf)))
        coh = pxy.abs().pow(2) / (pxx.abs() * pyy.abs()).clamp(min=1e-6)
        out = F.softmax(coh / self.scale, dim=-1).unsqueeze(2) * v  # (B, N, hidden, T)
        out = out.permute(0, 3, 1, 2).reshape(b, t, n * self.hidden_dim)  # b nh hd l -> b l (nh hd)
        out = torch.einsum("bld,cc->bld", out, F.softmax(self.var_attn, dim=-1)).reshape(b, t, n, self.hidden_dim)
        return self.out_proj(out + self.var_mlp(out)).permute(0, 2, 1, 3)


# ----------------------------------------------------------------------------------------------
# Value-space parallel suppression (Shwai-He/Transformer-Geometry @ ed6af0b633c1ef0e1a944cbef4721397fbfea7f1
# _imports/from_MMEBarch_research_snapshot_2026-05-09/neurips_supplement_anonymous_code/pretraining_nanogpt/
# core/model.py: rotate_half, apply_rotary_pos_emb, CausalSelfAttention manual-softmax path with
# pre_proj_self_value_op). RoPE tables built in float64 (upstream: float32, then cast); no diagonal mode.


class NanoGPTSelfValueAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, *, bias: bool = True, use_rope: bool = True,
                 rope_base: float = 10000.0, block_size: int = 32):
        super().__init__()
        self.n_head, self.head_dim, self.attn_dim = n_head, n_embd // n_head, n_embd
        self.use_rope, self.rope_base = use_rope, rope_base
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)
        inv = 1.0 / rope_base ** (torch.arange(0, self.head_dim, 2, dtype=torch.float64) / self.head_dim)
        emb = torch.repeat_interleave(torch.outer(torch.arange(block_size, dtype=torch.float64), inv), 2, dim=-1)
        self.register_buffer("rope_cos_cached", emb.cos()[None, None], persistent=False)
        self.register_buffer("rope_sin_cached", emb.sin()[None, None], persistent=False)
        keep = torch.tril(torch.ones(block_size, block_size, dtype=torch.bool))
        self.register_buffer("bias", keep[None, None])
        self.register_buffer("attn_additive_mask",
                             torch.zeros(block_size, block_size).masked_fill(~keep, float("-inf"))[None, None])

    @staticmethod
    def _rotate_half(x):
        return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(start_dim=-2)

    def forward(self, x, pre_proj_self_value_op=None, pre_proj_self_value_alpha=1.0, pre_proj_gamma=None,
                pre_proj_subtract_scale=1.0):
        b, t, _ = x.shape
        q, k, v = (a.view(b, t, self.n_head, self.head_dim).transpose(1, 2)
                   for a in self.c_attn(x).split(self.attn_dim, dim=2))
        if self.use_rope:
            cos, sin = self.rope_cos_cached[:, :, :t].to(x.dtype), self.rope_sin_cached[:, :, :t].to(x.dtype)
            q, k = q * cos + self._rotate_half(q) * sin, k * cos + self._rotate_half(k) * sin
        att = q @ k.transpose(-2, -1) / math.sqrt(k.size(-1)) + self.attn_additive_mask[:, :, :t, :t].to(x.dtype)
        y = F.softmax(att, dim=-1) @ v
        if pre_proj_self_value_op is not None:
            a, s = pre_proj_self_value_alpha, pre_proj_subtract_scale
            coeff = (y * v).sum(-1, keepdim=True) / v.square().sum(-1, keepdim=True).clamp_min(1e-6)
            y = {"remove_parallel": y - s * a * coeff * v, "keep_parallel": a * coeff * v,
                 "add_parallel": y + a * coeff * v, "negate_parallel": y - s * (1 + a) * coeff * v}[pre_proj_self_value_op]
        if pre_proj_gamma is not None:
            y = y * pre_proj_gamma
        return self.c_proj(y.transpose(1, 2).contiguous().view(b, t, self.attn_dim))


# ----------------------------------------------------------------------------------------------
# Key-Value attention (aliborji/kv-transformer @ d9eafa5761ab7070d1b9838d216bd611cf9dd6b0
# Reverse_sort_pos.py: MultiheadAttention_KV; the script-level attn_type and pos_embeddings become
# constructor arguments; tatp22/multidim-positional-encoding @ efeb8d9d70e8184da50eae9fddd1bbda10896529
# positional_encodings/torch_encodings.py: get_emb, PositionalEncoding2D, built in float64).


def _positional_encoding_2d(n: int, channels: int):
    half = int(np.ceil(channels / 4) * 2)
    inv = 1.0 / 10000 ** (torch.arange(0, half, 2, dtype=torch.float64) / half)
    emb = torch.stack((torch.outer(torch.arange(n, dtype=torch.float64), inv).sin(),
                       torch.outer(torch.arange(n, dtype=torch.float64), inv).cos()), dim=-1).flatten(-2, -1)
    out = torch.zeros(n, n, 2 * half, dtype=torch.float64)
    out[:, :, :half], out[:, :, half:] = emb.unsqueeze(1), emb
    return out[None, :, :, :channels]


class MultiheadAttentionKV(nn.Module):
    def __init__(self, input_dim: int, embed_dim: int, num_heads: int, *, attn_type: str = "kv", pos_dim: int = 10,
                 max_len: int = 32):
        super().__init__()
        self.embed_dim, self.num_heads, self.head_dim, self.attn_type = embed_dim, num_heads, embed_dim // num_heads, attn_type
        self.kv_proj = nn.Linear(input_dim, 2 * embed_dim)
        self.o_proj = nn.Linear(embed_dim, embed_dim)
        self.map_pos = nn.Linear(pos_dim, 1, bias=True)
        self.register_buffer("pos_embeddings", _positional_encoding_2d(max_len, pos_dim), persistent=False)

    def forward(self, x):
        b, n, _ = x.shape
        kv = self.kv_proj(x).reshape(b, n, self.num_heads, 2 * self.head_dim).permute(0, 2, 1, 3)
        k, v = kv.chunk(2, dim=-1)
        att = k @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        if self.attn_type == "kv":
            att = self.map_pos(att.unsqueeze(-1) + self.pos_embeddings[:, :n, :n].unsqueeze(0).to(x.dtype)).squeeze(-1)
        out = (att.softmax(dim=-1) @ v).permute(0, 2, 1, 3).reshape(b, n, self.embed_dim)
        return self.o_proj(out)


# ----------------------------------------------------------------------------------------------
# VICON (Eydcao/VICON @ be2e2dc6b327259c55b110340c3b55e30a427317 src/models.py ICON_UNCROPPED;
# src/model_utils.py patchify, depatchify, build_alternating_block_lowtri_mask). The cfg dict becomes
# a namespace with the same keys (upstream's config object reads both ways); dropout 0.


def _vicon_patchify(x, p):
    bs, c, hp, wp = x.shape
    return x.view(bs, c, p, hp // p, p, wp // p).permute(0, 2, 4, 1, 3, 5).reshape(bs, p * p, -1)


def _vicon_depatchify(x, p, c, h, w):
    return x.view(x.shape[0], p, p, c, h, w).permute(0, 3, 1, 4, 2, 5).reshape(x.shape[0], c, p * h, p * w)


def _vicon_mask(n, s1, s2):  # build_alternating_block_lowtri_mask: 1 = attend
    inner = torch.ones(s1 + s2, s1 + s2)
    tail = inner.clone()
    tail[:s1, s1:] = 0
    out = torch.kron(torch.tril(torch.ones(n, n)), inner)
    for i in range(n):
        out[i * (s1 + s2):(i + 1) * (s1 + s2), i * (s1 + s2):(i + 1) * (s1 + s2)] = tail
    return out


class IconUncropped(nn.Module):
    def __init__(self, *, dim_channel: int, patch_resolution: int, dim_token: int, nhead: int, dim_feedforward: int,
                 num_layers: int, patch_num: int, demo_num: int, use_patch_pos_encoding: bool = True,
                 use_func_pos_encoding: bool = True):
        super().__init__()
        import types

        self.cfg = types.SimpleNamespace(patch_num_in=patch_num, dim_token=dim_token,
                                         use_patch_pos_encoding=use_patch_pos_encoding,
                                         use_func_pos_encoding=use_func_pos_encoding)
        self.pre_proj = nn.Linear(dim_channel * patch_resolution ** 2, dim_token)
        self.post_proj = nn.Linear(dim_token, dim_channel * patch_resolution ** 2)
        self.patch_pos_encoding = nn.Parameter(torch.randn(patch_num * patch_num, dim_token))
        self.func_pos_encoding = nn.Parameter(torch.randn(demo_num * 2, dim_token))
        layer = nn.TransformerEncoderLayer(dim_token, nhead, dim_feedforward, dropout=0.0, activation="gelu",
                                           batch_first=True)
        self.transformer = nn.TransformerEncoder(layer, num_layers=num_layers, enable_nested_tensor=False)
        self.register_buffer("mask", (1 - _vicon_mask(demo_num, patch_num ** 2, patch_num ** 2)).bool())

    def forward(self, x_tuple):
        init, end, _ = x_tuple
        x = torch.cat((init[:, :, None], end[:, :, None]), dim=2)
        p, d = self.cfg.patch_num_in, self.cfg.dim_token
        bs, pairs, _, c, ph, pw = x.shape
        f = self.pre_proj(_vicon_patchify(x.reshape(-1, c, ph, pw), p))
        if self.cfg.use_patch_pos_encoding:
            f = f + self.patch_pos_encoding
        f = f.view(bs, -1, p * p, d)
        if self.cfg.use_func_pos_encoding:
            f = f + self.func_pos_encoding.view(1, -1, 1, d)[:, :pairs * 2]
        n = pairs * 2 * p * p
        f = self.transformer(f.reshape(bs, -1, d), mask=self.mask[:n, :n])
        f = self.post_proj(f.view(bs, pairs, 2, p * p, d)[:, :, 0])
        return _vicon_depatchify(f.reshape(bs * pairs, p * p, -1), p, c, ph // p, pw // p).view(bs, pairs, c, ph, pw)


# ----------------------------------------------------------------------------------------------
# MossFormer (modelscope/modelscope @ 2905da12205410de83f2fcdaabb4b505430890d5
# modelscope/models/audio/separation/mossformer_block.py: ScaleNorm, OffsetScale, FFConvM, MossFormerBlock;
# mossformer_conv_module.py: MossFormerConvModule; rotary_embedding_torch 0.9.1 RotaryEmbedding
# rotate_queries_or_keys, interleaved, frozen ``freqs``). Dropout omitted (eval mode).


class _ScaleNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.scale, self.eps, self.g = dim ** -0.5, eps, nn.Parameter(torch.ones(1))

    def forward(self, x):
        return x / (torch.norm(x, dim=-1, keepdim=True) * self.scale).clamp(min=self.eps) * self.g


class _MossConv(nn.Module):  # MossFormerConvModule: x + depthwise conv over time
    def __init__(self, c, k=17):
        super().__init__()
        self.sequential = nn.Sequential(nn.Identity(), nn.Module())  # index 0: Transpose (no params)
        self.sequential[1].conv = nn.Conv1d(c, c, k, groups=c, padding=(k - 1) // 2, bias=False)

    def forward(self, x):
        return x + self.sequential[1].conv(x.transpose(1, 2)).transpose(1, 2)


class _FFConvM(nn.Module):
    def __init__(self, dim_in, dim_out, norm_klass, k):
        super().__init__()
        self.mdl = nn.Sequential(norm_klass(dim_in), nn.Linear(dim_in, dim_out), nn.SiLU(), _MossConv(dim_out, k))

    def forward(self, x):
        return self.mdl(x)


class _Rotary(nn.Module):
    def __init__(self, dim, theta=10000.0):
        super().__init__()
        f = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64)[: dim // 2] / dim)
        self.freqs = nn.Parameter(f, requires_grad=False)

    def rotate_queries_or_keys(self, t):
        ang = torch.repeat_interleave(torch.arange(t.shape[-2], dtype=t.dtype)[:, None] * self.freqs.to(t.dtype),
                                      2, dim=-1)
        r = ang.shape[-1]
        x = t[..., :r]
        rot = torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)
        return torch.cat((x * ang.cos() + rot * ang.sin(), t[..., r:]), dim=-1)


class MossFormerBlock(nn.Module):
    def __init__(self, dim, *, group_size=256, query_key_dim=128, causal=False, norm="scalenorm",
                 shift_tokens=True, rotary=True, kernel_size=17):
        super().__init__()
        norm_klass = _ScaleNorm if norm == "scalenorm" else nn.LayerNorm
        self.group_size, self.causal, self.shift_tokens = group_size, causal, shift_tokens
        self.rotary_pos_emb = _Rotary(min(32, query_key_dim)) if rotary else None
        self.to_hidden = _FFConvM(dim, 4 * dim, norm_klass, kernel_size)  # expansion_factor 4 (MossFormerModule)
        self.to_qk = _FFConvM(dim, query_key_dim, norm_klass, kernel_size)
        self.qk_offset_scale = nn.Module()
        self.qk_offset_scale.gamma = nn.Parameter(0.02 * torch.randn(4, query_key_dim) + 1.0)  # init off upstream's,
        self.qk_offset_scale.beta = nn.Parameter(0.1 * torch.randn(4, query_key_dim))  # so every term shows
        self.to_out = _FFConvM(dim * 2, dim, norm_klass, kernel_size)

    def forward(self, x):
        nx = x
        if self.shift_tokens:
            xs, xp = nx.chunk(2, dim=-1)
            nx = torch.cat((F.pad(xs, (0, 0, 1, -1), value=0.0), xp), dim=-1)
        v, u = self.to_hidden(nx).chunk(2, dim=-1)
        qk = self.to_qk(nx)
        quads = (torch.einsum("...d,hd->...hd", qk, self.qk_offset_scale.gamma) + self.qk_offset_scale.beta).unbind(-2)
        att_v, att_u = self._attention(x, *quads, v, u)
        return x + self.to_out((att_u * v) * torch.sigmoid(att_v * u))

    def _attention(self, x, quad_q, lin_q, quad_k, lin_k, v, u):
        b, n, g = x.shape[0], x.shape[-2], self.group_size
        if self.rotary_pos_emb is not None:
            quad_q, lin_q, quad_k, lin_k = map(self.rotary_pos_emb.rotate_queries_or_keys, (quad_q, lin_q, quad_k, lin_k))
        pad = (g - n % g) % g
        mask = F.pad(torch.ones(b, n, dtype=torch.bool), (0, pad), value=False).view(b, -1, 1, g)
        quad_q, quad_k, lin_q, lin_k, v, u = (F.pad(t, (0, 0, 0, pad)).view(b, -1, g, t.shape[-1])
                                              for t in (quad_q, quad_k, lin_q, lin_k, v, u))
        attn = F.relu(quad_q @ quad_k.transpose(-1, -2) / g) ** 2
        attn = attn.masked_fill(~mask, 0.0)
        if self.causal:
            attn = attn.masked_fill(torch.ones(g, g, dtype=torch.bool).triu(1), 0.0)
        outs = []
        for w in (v, u):
            quad = attn @ w
            if self.causal:
                kv = F.pad(torch.einsum("bgnd,bgne->bgde", lin_k, w).div(g).cumsum(1), (0, 0, 0, 0, 1, -1))
                lin = torch.einsum("bgde,bgnd->bgne", kv, lin_q)
            else:
                lin = torch.einsum("bgnd,bde->bgne", lin_q, torch.einsum("bgnd,bgne->bde", lin_k, w) / n)
            outs.append((quad + lin).reshape(b, -1, w.shape[-1])[:, :n])
        return outs
