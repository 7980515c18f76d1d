"""refattn.interop.torch: state_dict mapping and check_module against PyTorch modules, in float64.

Each module below is written from the upstream file (parameter names, shapes and forward as
upstream), kept compact:

* GQA / MQA — huggingface/transformers ``src/transformers/models/llama/modeling_llama.py``@5dd4a63
  (``LlamaAttention``);
* DIFF V1 — microsoft/unilm ``Diff-Transformer/multihead_diffattn.py``@637157e (``MultiheadDiffAttn``)
  and ``multihead_flashdiff_1.py`` (per-half SDPA: the "flash" GQA pairing);
* DIFF V2 — microsoft/unilm ``Diff-Transformer/Diff-Transformer-V2/multihead_flashdiffv2.py``;
* DiffCLIP — hammoudhasan/DiffCLIP ``diff_attention.py`` (``DiffAttention``);
* CaiT class-attention — facebookresearch/deit ``cait_models.py``@0176669 (``LayerScale_Block_CA``);
* CRATE — Ma-Lab-Berkeley/CRATE ``model/crate.py``@0227249 (``Transformer`` with depth 1);
* OFormer — BaratiLab/OFormer ``airfoil/nn_module/attention_module.py``@f1111b3 (``LinearAttention``;
  the module of ``tests/_upstream_ops.py``);
* Galerkin / Fourier — scaomath/galerkin-transformer ``libs/layers.py``@2c9d23e (``SimpleAttention``);
* Transolver — thuml/Transolver ``PDE-Solving-StandardBenchmark/model/Physics_Attention.py``@1f53c15
  (``Physics_Attention_Irregular_Mesh``);
* GALE — NVIDIA/physicsnemo ``physicsnemo/nn/module/gale.py``@17505d6 (``GALE``) on
  ``physics_attention.py``@105afde;
* GNOT — HaoZhongkai/GNOT ``models/cgpt.py``@5df0390 (``LinearCrossAttention``);
* LinearNO — HiPRL/LinearNO ``Standard_PDE_Benchmark/model/LinearAttnNeuralOperator.py``@3f2b80d
  (``LinearNO``, ``LinearNO_temp``);
* Set Transformer — juho-lee/set_transformer ``modules.py`` (``MAB``, ``SAB``, ``ISAB``, ``PMA``);
* Restormer MDTA — swz30/Restormer ``basicsr/models/archs/restormer_arch.py``@861974a (``Attention``);
* XCiT XCA — facebookresearch/xcit ``xcit.py``@9a7df94 (``XCA``);
* scOT — camlab-ethz/poseidon ``scOT/model.py``@b8fa28f (``ScOTLayer``; forward of
  ``tests/test_neural_operators.py``);
* FNO — zongyi-li/fourier_neural_operator ``fourier_2d.py``@4ed7737 (``SpectralConv2d``);
* AFNO — NVlabs/AFNO-transformer ``afno/afno2d.py``@c3271a2 (``AFNO2D``).

Deviations, all dtype plumbing so that float64 means float64: unilm's softmax in float32
(``dtype=torch.float32``), AFNO's ``x.float()`` and FNO's ``dtype=torch.cfloat`` buffer are
dropped (they follow the input's dtype here). Dropout is omitted (eval mode).
"""

import functools
import math
import subprocess
import sys
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import _upstream_fidelity as UF  # noqa: E402
from _interop_checks import assert_round_trip  # noqa: E402

from refattn.interop.torch import (  # noqa: E402
    check_module,
    grads_to_state_dict,
    params_from_state_dict,
    supported_slugs,
)


def _assert_pass(report):
    assert report.passed, "\n" + str(report)
    return report


# ------------------------------------------------------------------------------ upstream modules


class RMSNorm(nn.Module):  # unilm diff/rms_norm.py
    def __init__(self, dim, eps=1e-5, elementwise_affine=True):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim)) if elementwise_affine else None

    def forward(self, x):
        out = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return out * self.weight if self.weight is not None else out


def apply_rotary_emb(x, cos, sin):  # flash-attn's, interleaved=True, as unilm calls it
    r = 2 * cos.shape[1]
    c, s = cos[: x.shape[1], None, :], sin[: x.shape[1], None, :]
    a, b = x[..., 0:r:2], x[..., 1:r:2]
    return torch.cat([torch.stack([a * c - b * s, a * s + b * c], dim=-1).flatten(-2), x[..., r:]], dim=-1)


class LlamaAttention(nn.Module):
    """huggingface/transformers ``src/transformers/models/llama/modeling_llama.py``@5dd4a63
    (``LlamaAttention`` with ``eager_attention_forward``, ``apply_rotary_pos_emb``, ``repeat_kv``);
    the config is a namespace with HF's field names. No cache, no dropout; the softmax runs in the
    input's dtype (upstream: ``dtype=torch.float32``, which would round a float64 check)."""

    def __init__(self, hidden_size, num_attention_heads, num_key_value_heads, head_dim=None, attention_bias=False):
        super().__init__()
        self.config = types.SimpleNamespace(hidden_size=hidden_size, num_attention_heads=num_attention_heads,
                                            num_key_value_heads=num_key_value_heads)
        self.head_dim = head_dim or hidden_size // num_attention_heads
        self.num_key_value_groups = num_attention_heads // num_key_value_heads
        self.scaling = self.head_dim ** -0.5
        h, hkv, d = num_attention_heads, num_key_value_heads, self.head_dim
        self.q_proj = nn.Linear(hidden_size, h * d, bias=attention_bias)
        self.k_proj = nn.Linear(hidden_size, hkv * d, bias=attention_bias)
        self.v_proj = nn.Linear(hidden_size, hkv * d, bias=attention_bias)
        self.o_proj = nn.Linear(h * d, hidden_size, bias=attention_bias)

    def forward(self, hidden_states, position_embeddings, attention_mask=None):
        shape = (*hidden_states.shape[:-1], -1, self.head_dim)
        q, k, v = (p(hidden_states).view(shape).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        cos, sin = (t.unsqueeze(1) for t in position_embeddings)

        def rotate_half(t):
            return torch.cat((-t[..., t.shape[-1] // 2:], t[..., : t.shape[-1] // 2]), dim=-1)

        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        b, hkv, n, d = k.shape
        k, v = (t[:, :, None].expand(b, hkv, self.num_key_value_groups, n, d).reshape(b, -1, n, d) for t in (k, v))
        w = q @ k.transpose(2, 3) * self.scaling
        if attention_mask is not None:
            w = w + attention_mask[:, :, :, : k.shape[-2]]
        o = (F.softmax(w, dim=-1) @ v).transpose(1, 2)
        return self.o_proj(o.reshape(*hidden_states.shape[:-1], -1)), None


class GALE(nn.Module):
    """NVIDIA/physicsnemo ``physicsnemo/nn/module/gale.py``@17505d6 (``GALE``, ``_gale_cross_init``,
    ``_gale_forward_impl``, ``_mix_self_and_cross``; ``use_te=False``, ``plus=False``) on
    ``physicsnemo/nn/module/physics_attention.py``@105afde (``PhysicsAttentionBase``,
    ``PhysicsAttentionIrregularMesh``, ``_compute_slices_from_projections``): tokens laid out
    ``(B, N, H, D)``, temperature ``(1, 1, H, 1)`` clamped to [0.5, 5], slice mass + 1e-2, SDPA."""

    def __init__(self, dim, heads=2, dim_head=4, slice_num=3, context_dim=5, state_mixing_mode="weighted"):
        super().__init__()
        inner = heads * dim_head
        self.heads, self.dim_head, self.state_mixing_mode = heads, dim_head, state_mixing_mode
        self.temperature = nn.Parameter(torch.ones([1, 1, heads, 1]) * 0.5)
        self.in_project_slice = nn.Linear(dim_head, slice_num)
        self.qkv_project = nn.Linear(dim_head, 3 * dim_head, bias=False)
        self.out_linear = nn.Linear(inner, dim)
        self.in_project_x, self.in_project_fx = nn.Linear(dim, inner), nn.Linear(dim, inner)
        self.cross_q = nn.Linear(dim_head, dim_head)
        self.cross_k, self.cross_v = nn.Linear(context_dim, dim_head), nn.Linear(context_dim, dim_head)
        if state_mixing_mode == "weighted":
            self.state_mixing = nn.Parameter(torch.tensor(0.3))  # upstream inits 0.0; 0.3 tests the gate
        else:
            self.concat_project = nn.Sequential(nn.Linear(2 * dim_head, dim_head), nn.GELU())

    def forward(self, x, context=None):
        outs = []
        for t in x:
            b, n, _ = t.shape
            x_mid, fx_mid = (p(t).view(b, n, self.heads, self.dim_head) for p in (self.in_project_x, self.in_project_fx))
            sw = F.softmax(self.in_project_slice(x_mid) / torch.clamp(self.temperature, min=0.5, max=5), dim=-1)
            norm = sw.sum(dim=1) + 1e-2                                               # (B, H, S)
            tok = torch.einsum("bnhs,bnhd->bhsd", sw, fx_mid) / norm.unsqueeze(-1)
            q, k, v = self.qkv_project(tok).view(*tok.shape[:3], 3, self.dim_head).unbind(3)
            z = F.scaled_dot_product_attention(q, k, v)
            if context is not None:
                zc = F.scaled_dot_product_attention(self.cross_q(tok), self.cross_k(context), self.cross_v(context))
                if self.state_mixing_mode == "weighted":
                    w = torch.sigmoid(self.state_mixing)
                    z = w * z + (1 - w) * zc
                else:
                    z = self.concat_project(torch.cat([z, zc], dim=-1))
            y = torch.einsum("bths,bhsd->bthd", sw, z).reshape(b, n, -1)
            outs.append(self.out_linear(y))
        return outs


class ScOTLayer(nn.Module):
    """camlab-ethz/poseidon ``scOT/model.py``@b8fa28f ``ScOTLayer`` (``ConditionalLayerNorm``: Linear(1, C)
    weight and bias; transformers' ``Swinv2Attention`` under ``attention.self`` / ``attention.output``):
    the parameters under upstream's names, the forward is ``tests/test_neural_operators.py``'s
    ``_scot_torch`` (written from the same files), after upstream's ``set_shift_and_window_size``."""

    def __init__(self, dim, num_heads, window_size, shift_size, mlp_ratio=2):
        super().__init__()
        self.window_size, self.shift_size = window_size, shift_size
        self.attention = nn.Module()
        att = self.attention.self = nn.Module()
        att.num_attention_heads = num_heads
        att.query, att.key, att.value = nn.Linear(dim, dim), nn.Linear(dim, dim, bias=False), nn.Linear(dim, dim)
        att.logit_scale = nn.Parameter(torch.log(10 * torch.ones(num_heads, 1, 1)) + 0.2 * torch.randn(num_heads, 1, 1))
        att.continuous_position_bias_mlp = nn.Sequential(nn.Linear(2, 6), nn.ReLU(), nn.Linear(6, num_heads, bias=False))
        self.attention.output = nn.Module()
        self.attention.output.dense = nn.Linear(dim, dim)
        self.intermediate, self.output = nn.Module(), nn.Module()
        self.intermediate.dense, self.output.dense = nn.Linear(dim, mlp_ratio * dim), nn.Linear(mlp_ratio * dim, dim)
        for name in ("layernorm_before", "layernorm_after"):
            norm = nn.Module()
            norm.weight, norm.bias = nn.Linear(1, dim), nn.Linear(1, dim)
            setattr(self, name, norm)

    def forward(self, hidden_states, input_dimensions, time):
        from test_neural_operators import _scot_torch

        h, w = input_dimensions
        ws = h if h <= self.window_size else self.window_size
        shift = 0 if (h, w) <= (ws, ws) else self.shift_size
        p = {k: (v.T if k.endswith(".weight") else v) for k, v in self.named_parameters()}
        b, _, c = hidden_states.shape
        y = _scot_torch(torch, hidden_states.view(b, h, w, c), time, p, self.attention.self.num_attention_heads, ws, shift)
        return (y.reshape(b, h * w, c),)


class Class_Attention(nn.Module):  # CaiT
    def __init__(self, dim, num_heads=8, qkv_bias=False):
        super().__init__()
        self.num_heads = num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.q, self.k, self.v = (nn.Linear(dim, dim, bias=qkv_bias) for _ in range(3))
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        h = self.num_heads
        q = self.q(x[:, 0]).unsqueeze(1).reshape(B, 1, h, C // h).permute(0, 2, 1, 3) * self.scale
        k, v = (f(x).reshape(B, N, h, C // h).permute(0, 2, 1, 3) for f in (self.k, self.v))
        attn = (q @ k.transpose(-2, -1)).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(B, 1, C))


class LayerScale_Block_CA(nn.Module):
    """facebookresearch/deit ``cait_models.py``@0176669 (``LayerScale_Block_CA``, ``Class_Attention``;
    timm's ``Mlp``: fc1, GELU, fc2), CaiT's ``partial(nn.LayerNorm, eps=1e-6)``. Dropout omitted."""

    def __init__(self, dim, num_heads, mlp_ratio=4.0, qkv_bias=False, init_values=1e-4):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim, eps=1e-6), nn.LayerNorm(dim, eps=1e-6)
        self.attn = Class_Attention(dim, num_heads=num_heads, qkv_bias=qkv_bias)
        self.mlp = nn.Module()
        self.mlp.fc1, self.mlp.fc2 = nn.Linear(dim, int(dim * mlp_ratio)), nn.Linear(int(dim * mlp_ratio), dim)
        self.gamma_1 = nn.Parameter(init_values * torch.ones(dim))
        self.gamma_2 = nn.Parameter(init_values * torch.ones(dim))

    def forward(self, x, x_cls):
        u = torch.cat((x_cls, x), dim=1)
        x_cls = x_cls + self.gamma_1 * self.attn(self.norm1(u))
        return x_cls + self.gamma_2 * self.mlp.fc2(F.gelu(self.mlp.fc1(self.norm2(x_cls))))


class CratePreNorm(nn.Module):  # CRATE PreNorm
    def __init__(self, dim, fn):
        super().__init__()
        self.norm, self.fn = nn.LayerNorm(dim), fn

    def forward(self, x):
        return self.fn(self.norm(x))


class CrateAttention(nn.Module):  # CRATE Attention (MSSA: one projection for q, k and v)
    def __init__(self, dim, heads, dim_head):
        super().__init__()
        self.heads, self.scale = heads, dim_head ** -0.5
        self.qkv = nn.Linear(dim, heads * dim_head, bias=False)
        self.to_out = nn.Sequential(nn.Linear(heads * dim_head, dim)) if not (heads == 1 and dim_head == dim) \
            else nn.Identity()

    def forward(self, x):
        b, n, _ = x.shape
        w = self.qkv(x).view(b, n, self.heads, -1).transpose(1, 2)
        attn = F.softmax(w @ w.transpose(-1, -2) * self.scale, dim=-1)
        return self.to_out((attn @ w).transpose(1, 2).reshape(b, n, -1))


class CrateFeedForward(nn.Module):  # CRATE FeedForward (one ISTA step)
    def __init__(self, dim, step_size=0.1):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim, dim))
        nn.init.kaiming_uniform_(self.weight)
        self.step_size, self.lambd = step_size, 0.1

    def forward(self, x):
        grad_1 = F.linear(F.linear(x, self.weight), self.weight.t())
        grad_2 = F.linear(x, self.weight.t())
        return F.relu(x + self.step_size * (grad_2 - grad_1) - self.step_size * self.lambd)


class CrateTransformer(nn.Module):
    """Ma-Lab-Berkeley/CRATE ``model/crate.py``@0227249 (``Transformer``, ``PreNorm``, ``Attention``,
    ``FeedForward``; einops replaced by view/transpose, dropout omitted)."""

    def __init__(self, dim, depth, heads, dim_head, ista=0.1):
        super().__init__()
        self.heads = heads
        self.layers = nn.ModuleList([nn.ModuleList([CratePreNorm(dim, CrateAttention(dim, heads, dim_head)),
                                                    CratePreNorm(dim, CrateFeedForward(dim, step_size=ista))])
                                     for _ in range(depth)])

    def forward(self, x):
        for attn, ff in self.layers:
            x = ff(attn(x) + x)
        return x


class RestormerAttention(nn.Module):
    """swz30/Restormer ``basicsr/models/archs/restormer_arch.py``@861974a ``Attention`` (MDTA); einops
    replaced by reshape."""

    def __init__(self, dim, num_heads, bias):
        super().__init__()
        self.num_heads = num_heads
        self.temperature = nn.Parameter(torch.ones(num_heads, 1, 1))
        self.qkv = nn.Conv2d(dim, dim * 3, kernel_size=1, bias=bias)
        self.qkv_dwconv = nn.Conv2d(dim * 3, dim * 3, kernel_size=3, stride=1, padding=1, groups=dim * 3, bias=bias)
        self.project_out = nn.Conv2d(dim, dim, kernel_size=1, bias=bias)

    def forward(self, x):
        b, c, h, w = x.shape
        q, k, v = (t.reshape(b, self.num_heads, c // self.num_heads, h * w)
                   for t in self.qkv_dwconv(self.qkv(x)).chunk(3, dim=1))
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        attn = ((q @ k.transpose(-2, -1)) * self.temperature).softmax(dim=-1)
        return self.project_out((attn @ v).reshape(b, c, h, w))


class XCA(nn.Module):
    """facebookresearch/xcit ``xcit.py``@9a7df94 ``XCA`` (cross-covariance attention; dropout omitted)."""

    def __init__(self, dim, num_heads=8, qkv_bias=False):
        super().__init__()
        self.num_heads = num_heads
        self.temperature = nn.Parameter(torch.ones(num_heads, 1, 1))
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = (t.transpose(-2, -1) for t in (qkv[0], qkv[1], qkv[2]))
        q, k = F.normalize(q, dim=-1), F.normalize(k, dim=-1)
        attn = ((q @ k.transpose(-2, -1)) * self.temperature).softmax(dim=-1)
        return self.proj((attn @ v).permute(0, 3, 1, 2).reshape(B, N, C))


class MultiheadDiffAttn(nn.Module):
    def __init__(self, embed_dim, depth, num_heads, num_kv_heads=None, flash=False):
        super().__init__()
        self.num_heads = num_heads
        self.num_kv_heads = num_kv_heads or num_heads
        self.n_rep = self.num_heads // self.num_kv_heads
        self.head_dim = embed_dim // num_heads // 2
        self.scaling = self.head_dim ** -0.5
        self.flash = flash
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=False)
        self.k_proj = nn.Linear(embed_dim, embed_dim // self.n_rep, bias=False)
        self.v_proj = nn.Linear(embed_dim, embed_dim // self.n_rep, bias=False)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=False)
        self.lambda_init = 0.8 - 0.6 * math.exp(-0.3 * depth)
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            setattr(self, name, nn.Parameter(torch.zeros(self.head_dim).normal_(mean=0, std=0.1)))
        self.subln = RMSNorm(2 * self.head_dim, eps=1e-5, elementwise_affine=True)

    def forward(self, x, rel_pos, attn_mask=None):
        bsz, n, _ = x.size()
        q = self.q_proj(x).view(bsz, n, 2 * self.num_heads, self.head_dim)
        k = self.k_proj(x).view(bsz, n, 2 * self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(bsz, n, self.num_kv_heads, 2 * self.head_dim)
        q, k = apply_rotary_emb(q, *rel_pos), apply_rotary_emb(k, *rel_pos)
        mask = torch.triu(torch.full((n, n), float("-inf"), dtype=x.dtype), 1)
        lam = (torch.exp(torch.sum(self.lambda_q1 * self.lambda_k1)) - torch.exp(torch.sum(self.lambda_q2 * self.lambda_k2))
               + self.lambda_init)
        if not self.flash:  # multihead_diffattn.py: repeat_kv over 2*Hkv half-heads
            q = q.transpose(1, 2) * self.scaling
            k = k.transpose(1, 2).repeat_interleave(self.n_rep, dim=1)
            vv = v.transpose(1, 2).repeat_interleave(self.n_rep, dim=1)
            w = torch.nan_to_num(q @ k.transpose(-1, -2)) + mask
            w = F.softmax(w, dim=-1).view(bsz, self.num_heads, 2, n, n)
            attn = (w[:, :, 0] - lam * w[:, :, 1]) @ vv
        else:  # multihead_flashdiff_1.py: one attention per half, kv heads per half
            q, k = q.reshape(bsz, n, self.num_heads, 2, -1), k.reshape(bsz, n, self.num_kv_heads, 2, -1)
            va = v.transpose(1, 2).repeat_interleave(self.n_rep, dim=1)
            a1, a2 = (F.scaled_dot_product_attention(q[:, :, :, i].transpose(1, 2),
                                                     k[:, :, :, i].transpose(1, 2).repeat_interleave(self.n_rep, 1),
                                                     va, attn_mask=mask) for i in (0, 1))
            attn = a1 - lam * a2
        attn = self.subln(attn) * (1 - self.lambda_init)
        return self.out_proj(attn.transpose(1, 2).reshape(bsz, n, -1))


class DiffV2Attn(nn.Module):
    def __init__(self, embed_dim, num_heads, num_kv_heads, head_dim):
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.q_proj = nn.Linear(embed_dim, 2 * num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(embed_dim, num_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(embed_dim, num_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * head_dim, embed_dim, bias=False)
        self.lambda_proj = nn.Linear(embed_dim, num_heads, bias=False)

    def forward(self, x, rel_pos):
        b, n, _ = x.shape
        q = apply_rotary_emb(self.q_proj(x).view(b, n, 2 * self.num_heads, self.head_dim), *rel_pos)
        k = apply_rotary_emb(self.k_proj(x).view(b, n, self.num_kv_heads, self.head_dim), *rel_pos)
        v = self.v_proj(x).view(b, n, self.num_kv_heads, self.head_dim)
        attn = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                              is_causal=True, enable_gqa=True).transpose(1, 2)
        lam = torch.sigmoid(self.lambda_proj(x)).unsqueeze(-1)
        attn = attn[:, :, 0::2] - lam * attn[:, :, 1::2]
        return self.o_proj(attn.reshape(b, n, -1))


class DiffAttention(nn.Module):  # DiffCLIP
    def __init__(self, dim, num_heads, lambda_init=0.8):
        super().__init__()
        self.num_heads, self.h, self.d = num_heads, num_heads // 2, dim // num_heads
        self.lambda_init = lambda_init
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(dim, dim) for _ in range(4))
        for name in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            setattr(self, name, nn.Parameter(torch.randn(self.d) * 0.1))
        self.diff_norm = RMSNorm(2 * self.d, eps=1e-5)

    def forward(self, x):
        b, n, c = x.shape
        q = self.q_proj(x).view(b, n, 2 * self.h, self.d).transpose(1, 2) * self.d ** -0.5
        k = self.k_proj(x).view(b, n, 2 * self.h, self.d).transpose(1, 2)
        v = self.v_proj(x).view(b, n, self.h, 2 * self.d).transpose(1, 2)
        p = F.softmax(q @ k.transpose(-1, -2), dim=-1).view(b, self.h, 2, n, n)
        lam = (torch.exp(torch.sum(self.lambda_q1 * self.lambda_k1)) - torch.exp(torch.sum(self.lambda_q2 * self.lambda_k2))
               + self.lambda_init)
        o = self.diff_norm((p[:, :, 0] - lam * p[:, :, 1]) @ v) * (1 - self.lambda_init)
        return self.out_proj(o.transpose(1, 2).reshape(b, n, c))


class Physics_Attention_Irregular_Mesh(nn.Module):
    def __init__(self, dim, heads=2, dim_head=4, slice_num=5):
        super().__init__()
        inner = dim_head * heads
        self.dim_head, self.heads, self.scale = dim_head, heads, dim_head ** -0.5
        self.temperature = nn.Parameter(torch.ones([1, heads, 1, 1]) * 0.5 + 0.1 * torch.rand([1, heads, 1, 1]))
        self.in_project_x = nn.Linear(dim, inner)
        self.in_project_fx = nn.Linear(dim, inner)
        self.in_project_slice = nn.Linear(dim_head, slice_num)
        self.to_q = nn.Linear(dim_head, dim_head, bias=False)
        self.to_k = nn.Linear(dim_head, dim_head, bias=False)
        self.to_v = nn.Linear(dim_head, dim_head, bias=False)
        self.to_out = nn.Sequential(nn.Linear(inner, dim), nn.Dropout(0.0))

    def forward(self, x):
        B, N, C = x.shape
        fx = self.in_project_fx(x).reshape(B, N, self.heads, self.dim_head).permute(0, 2, 1, 3)
        xm = self.in_project_x(x).reshape(B, N, self.heads, self.dim_head).permute(0, 2, 1, 3)
        w = F.softmax(self.in_project_slice(xm) / self.temperature, dim=-1)
        token = torch.einsum("bhnc,bhng->bhgc", fx, w) / (w.sum(2) + 1e-5)[..., None]
        q, k, v = self.to_q(token), self.to_k(token), self.to_v(token)
        out = F.softmax(q @ k.transpose(-1, -2) * self.scale, dim=-1) @ v
        out = torch.einsum("bhgc,bhng->bhnc", out, w).permute(0, 2, 1, 3).reshape(B, N, -1)
        return self.to_out(out)


class LinearCrossAttention(nn.Module):  # GNOT, attn_type 'l1', one input function
    def __init__(self, n_embd, n_head, n_inputs=1):
        super().__init__()
        self.n_head, self.n_inputs = n_head, n_inputs
        self.query = nn.Linear(n_embd, n_embd)
        self.keys = nn.ModuleList([nn.Linear(n_embd, n_embd) for _ in range(n_inputs)])
        self.values = nn.ModuleList([nn.Linear(n_embd, n_embd) for _ in range(n_inputs)])
        self.proj = nn.Linear(n_embd, n_embd)

    def forward(self, x, y):
        B, T1, C = x.size()
        q = self.query(x).view(B, T1, self.n_head, C // self.n_head).transpose(1, 2).softmax(dim=-1)
        out = q
        for i in range(self.n_inputs):
            T2 = y[i].size(1)
            k = self.keys[i](y[i]).view(B, T2, self.n_head, C // self.n_head).transpose(1, 2).softmax(dim=-1)
            v = self.values[i](y[i]).view(B, T2, self.n_head, C // self.n_head).transpose(1, 2)
            d_inv = 1.0 / (q * k.sum(dim=-2, keepdim=True)).sum(dim=-1, keepdim=True)
            out = out + (q @ (k.transpose(-2, -1) @ v)) * d_inv
        return self.proj(out.transpose(1, 2).reshape(B, T1, C))


class Physics_Attention_Structured_Mesh_2D(Physics_Attention_Irregular_Mesh):
    def __init__(self, dim, heads=2, dim_head=4, slice_num=5, H=3, W=4, kernel=3):
        super().__init__(dim, heads, dim_head, slice_num)
        self.H, self.W = H, W
        self.in_project_x = nn.Conv2d(dim, dim_head * heads, kernel, 1, kernel // 2)
        self.in_project_fx = nn.Conv2d(dim, dim_head * heads, kernel, 1, kernel // 2)

    def forward(self, x):
        B, N, C = x.shape
        x = x.reshape(B, self.H, self.W, C).permute(0, 3, 1, 2)
        heads = lambda t: t.permute(0, 2, 3, 1).reshape(B, N, self.heads, self.dim_head).permute(0, 2, 1, 3)  # noqa: E731
        fx, xm = heads(self.in_project_fx(x)), heads(self.in_project_x(x))
        w = F.softmax(self.in_project_slice(xm) / self.temperature, dim=-1)
        token = torch.einsum("bhnc,bhng->bhgc", fx, w) / (w.sum(2) + 1e-5)[..., None]
        q, k, v = self.to_q(token), self.to_k(token), self.to_v(token)
        out = F.softmax(q @ k.transpose(-1, -2) * self.scale, dim=-1) @ v
        out = torch.einsum("bhgc,bhng->bhnc", out, w).permute(0, 2, 1, 3).reshape(B, N, -1)
        return self.to_out(out)


class LinearNO(nn.Module):
    def __init__(self, dim, heads=2, dim_head=4, key_ratio=3, temp=False):
        super().__init__()
        self.heads, self.dim_head, self.temp = heads, dim_head, temp
        self.in_project_x = nn.Linear(dim, heads * dim_head)
        self.to_q = nn.Linear(dim_head, key_ratio, bias=False)
        self.to_k = nn.Linear(dim_head, key_ratio, bias=False)
        self.to_v = nn.Linear(dim_head, dim_head, bias=False)
        self.to_out = nn.Sequential(nn.Linear(heads * dim_head, dim), nn.Dropout(0.0))
        if temp:
            self.temperature_q = nn.Parameter(0.5 + 0.2 * torch.rand([1, heads, 1, 1]))
            self.temperature_k = nn.Parameter(0.5 + 0.2 * torch.rand([1, heads, 1, 1]))

    def forward(self, x):
        B, N, _ = x.shape
        xm = self.in_project_x(x).reshape(B, N, self.heads, self.dim_head).permute(0, 2, 1, 3)
        lq, lk = self.to_q(xm), self.to_k(xm)
        if self.temp:
            lq, lk = lq / self.temperature_q.clamp(0.01, 1), lk / self.temperature_k.clamp(0.01, 1)
        q, k = lq.softmax(dim=-1), lk.softmax(dim=-2)
        out = q @ (k.transpose(-1, -2) @ self.to_v(xm))
        return self.to_out(out.permute(0, 2, 1, 3).reshape(B, N, -1))


class MAB(nn.Module):
    def __init__(self, dim_Q, dim_K, dim_V, num_heads, ln=False):
        super().__init__()
        self.dim_V, self.num_heads = dim_V, num_heads
        self.fc_q, self.fc_k, self.fc_v = nn.Linear(dim_Q, dim_V), nn.Linear(dim_K, dim_V), nn.Linear(dim_K, dim_V)
        if ln:
            self.ln0, self.ln1 = nn.LayerNorm(dim_V), nn.LayerNorm(dim_V)
        self.fc_o = nn.Linear(dim_V, dim_V)

    def forward(self, Q, K):
        Q = self.fc_q(Q)
        K, V = self.fc_k(K), self.fc_v(K)
        split = self.dim_V // self.num_heads
        Q_, K_, V_ = (torch.cat(t.split(split, 2), 0) for t in (Q, K, V))
        A = torch.softmax(Q_.bmm(K_.transpose(1, 2)) / math.sqrt(self.dim_V), 2)
        O = torch.cat((Q_ + A.bmm(V_)).split(Q.size(0), 0), 2)
        O = O if getattr(self, "ln0", None) is None else self.ln0(O)
        O = O + F.relu(self.fc_o(O))
        return O if getattr(self, "ln1", None) is None else self.ln1(O)


class SAB(nn.Module):
    def __init__(self, dim_in, dim_out, num_heads, ln=False):
        super().__init__()
        self.mab = MAB(dim_in, dim_in, dim_out, num_heads, ln=ln)

    def forward(self, X):
        return self.mab(X, X)


class ISAB(nn.Module):
    def __init__(self, dim_in, dim_out, num_heads, num_inds, ln=False):
        super().__init__()
        self.I = nn.Parameter(torch.randn(1, num_inds, dim_out))
        self.mab0 = MAB(dim_out, dim_in, dim_out, num_heads, ln=ln)
        self.mab1 = MAB(dim_in, dim_out, dim_out, num_heads, ln=ln)

    def forward(self, X):
        return self.mab1(X, self.mab0(self.I.repeat(X.size(0), 1, 1), X))


class PMA(nn.Module):
    def __init__(self, dim, num_heads, num_seeds, ln=False):
        super().__init__()
        self.S = nn.Parameter(torch.randn(1, num_seeds, dim))
        self.mab = MAB(dim, dim, dim, num_heads, ln=ln)

    def forward(self, X):
        return self.mab(self.S.repeat(X.size(0), 1, 1), X)


class SpectralConv2d(nn.Module):
    def __init__(self, in_channels, out_channels, modes1, modes2):
        super().__init__()
        self.out_channels, self.modes1, self.modes2 = out_channels, modes1, modes2
        scale = 1 / (in_channels * out_channels)
        shape = (in_channels, out_channels, modes1, modes2)
        self.weights1 = nn.Parameter(scale * torch.rand(*shape, dtype=torch.cdouble))
        self.weights2 = nn.Parameter(scale * torch.rand(*shape, dtype=torch.cdouble))

    def forward(self, x):
        m1, m2 = self.modes1, self.modes2
        x_ft = torch.fft.rfft2(x)
        out_ft = torch.zeros(x.shape[0], self.out_channels, x.size(-2), x.size(-1) // 2 + 1, dtype=x_ft.dtype)
        out_ft[:, :, :m1, :m2] = torch.einsum("bixy,ioxy->boxy", x_ft[:, :, :m1, :m2], self.weights1)
        out_ft[:, :, -m1:, :m2] = torch.einsum("bixy,ioxy->boxy", x_ft[:, :, -m1:, :m2], self.weights2)
        return torch.fft.irfft2(out_ft, s=(x.size(-2), x.size(-1)))


class AFNO2D(nn.Module):
    def __init__(self, hidden_size, num_blocks=2, sparsity_threshold=0.01, hidden_size_factor=1):
        super().__init__()
        self.num_blocks, self.block_size = num_blocks, hidden_size // num_blocks
        self.sparsity_threshold = sparsity_threshold
        bs, h = self.block_size, self.block_size * hidden_size_factor
        self.w1 = nn.Parameter(0.5 * torch.randn(2, num_blocks, bs, h))
        self.b1 = nn.Parameter(0.5 * torch.randn(2, num_blocks, h))
        self.w2 = nn.Parameter(0.5 * torch.randn(2, num_blocks, h, bs))
        self.b2 = nn.Parameter(0.5 * torch.randn(2, num_blocks, bs))

    def forward(self, x):
        bias = x
        B, H, W, C = x.shape
        x = torch.fft.rfft2(x, dim=(1, 2), norm="ortho").reshape(B, H, W // 2 + 1, self.num_blocks, self.block_size)
        e = "...bi,bio->...bo"
        o1r = F.relu(torch.einsum(e, x.real, self.w1[0]) - torch.einsum(e, x.imag, self.w1[1]) + self.b1[0])
        o1i = F.relu(torch.einsum(e, x.imag, self.w1[0]) + torch.einsum(e, x.real, self.w1[1]) + self.b1[1])
        o2r = torch.einsum(e, o1r, self.w2[0]) - torch.einsum(e, o1i, self.w2[1]) + self.b2[0]
        o2i = torch.einsum(e, o1i, self.w2[0]) + torch.einsum(e, o1r, self.w2[1]) + self.b2[1]
        x = F.softshrink(torch.stack([o2r, o2i], dim=-1), lambd=self.sparsity_threshold)
        x = torch.view_as_complex(x).reshape(B, H, W // 2 + 1, C)
        return torch.fft.irfft2(x, s=(H, W), dim=(1, 2), norm="ortho") + bias


# ------------------------------------------------------------------------------ check_module per slug


def test_nn_multihead_attention_self_and_cross():
    torch.manual_seed(0)
    for kw in (dict(batch_first=True), dict(batch_first=False), dict(batch_first=True, bias=False)):
        _assert_pass(check_module(nn.MultiheadAttention(8, 2, **kw), "multi_head_attention", seeds=[0]))


def test_float32_module_is_judged_by_the_float32_rule():
    torch.manual_seed(15)
    report = _assert_pass(check_module(nn.MultiheadAttention(8, 2, batch_first=True), "multi_head_attention",
                                       dtype=torch.float32, cases=["small", "cross"], seeds=[0]))
    assert list(report.rules) == ["float32"]


def test_nn_multihead_attention_kdim_vdim_separate_weights():
    torch.manual_seed(1)
    m = nn.MultiheadAttention(8, 4, kdim=5, vdim=5, batch_first=True)
    assert "q_proj_weight" in m.state_dict()
    _assert_pass(check_module(m, "multi_head_attention", cases=["small", "cross"]))


@pytest.mark.parametrize("kw", [dict(add_bias_kv=True), dict(add_zero_attn=True),
                                dict(kdim=5, vdim=3, add_bias_kv=True, add_zero_attn=True)])
def test_nn_multihead_attention_full_options(kw):
    torch.manual_seed(16)
    m = nn.MultiheadAttention(8, 2, batch_first=True, **kw)
    if m.bias_k is not None:
        nn.init.normal_(m.bias_k)
        nn.init.normal_(m.bias_v)
    p = params_from_state_dict("multi_head_attention", m.state_dict())
    if "add_bias_kv" in kw:
        assert p["bias_k"].shape == (8,)
    _assert_pass(check_module(m, "multi_head_attention", seeds=[0]))


@pytest.mark.parametrize("hkv,flash", [(4, False), (2, False), (2, True), (1, True)])
def test_diff_v1(hkv, flash):
    torch.manual_seed(2)
    m = MultiheadDiffAttn(16, depth=3, num_heads=4, num_kv_heads=hkv, flash=flash)
    _assert_pass(check_module(m, "diff_attention_v1", config={"gqa_pairing": "flash" if flash else "naive"},
                              seeds=[0]))


def test_diff_v1_naive_pairing_is_not_flash_pairing():
    # the check can fail: unilm's naive file under GQA differs from the flash file
    torch.manual_seed(3)
    m = MultiheadDiffAttn(16, depth=3, num_heads=4, num_kv_heads=2, flash=True)
    assert not check_module(m, "diff_attention_v1", config={"gqa_pairing": "naive"}, cases=["small"]).passed


@pytest.mark.parametrize("hkv", [1, 2])
def test_diff_v2(hkv):
    torch.manual_seed(4)
    _assert_pass(check_module(DiffV2Attn(12, num_heads=2, num_kv_heads=hkv, head_dim=4), "diff_attention_v2"))


def test_diffclip():
    torch.manual_seed(5)
    _assert_pass(check_module(DiffAttention(16, num_heads=4), "diffclip_attention"))


@pytest.mark.parametrize("h,hkv,bias,cfg", [
    (4, 4, False, {}),
    (4, 2, False, {"is_causal": True, "rope": {"base": 500000.0}}),
    (4, 1, True, {"is_causal": True, "rope": True}),
    (6, 2, False, {"is_causal": True, "rope": {"base": 100.0, "offset": 3}}),
])
def test_gqa_mqa_hf_llama_attention(h, hkv, bias, cfg):
    torch.manual_seed(h + hkv)
    m = LlamaAttention(16, h, hkv, head_dim=6 if h == 6 else None, attention_bias=bias)
    r = _assert_pass(check_module(m, "gqa_mqa", config=cfg))
    assert {"x", "q_proj", "k_proj", "v_proj", "out_proj"} <= set(r.grads_compared)
    assert bias == ("out_proj_bias" in r.grads_compared)


def test_gqa_mqa_wrong_rope_base_or_mask_is_caught():
    from refattn.interop.torch_specs import SPECS

    torch.manual_seed(0)
    m = LlamaAttention(8, 2, 1)
    ok = {"is_causal": True, "rope": {"base": 10000.0}}
    assert check_module(m, "gqa_mqa", config=ok, cases="small").passed
    for wrong in ({"rope": {"base": 100.0}}, {"is_causal": False}):  # the module runs with these, refattn with ok
        def call(module, inp, cfg, wrong=wrong):
            return SPECS["gqa_mqa"].call(module, inp, {**cfg, **wrong})
        assert not check_module(m, "gqa_mqa", config=ok, call=call, cases="small").passed
    r = check_module(m, "gqa_mqa", config={"rope": {"base": 1e4, "interleaved": True}}, cases="small")
    assert not r.passed and "need your own call=" in str(r)  # HF's tables are rotate-half only


@pytest.mark.parametrize("qkv_bias", [False, True])
def test_cait_class_attention_block(qkv_bias):
    torch.manual_seed(11)
    m = LayerScale_Block_CA(8, num_heads=2, mlp_ratio=2.0, qkv_bias=qkv_bias, init_values=0.5)
    with torch.no_grad():
        for p in (m.norm1.weight, m.norm1.bias, m.norm2.weight, m.norm2.bias, m.gamma_2):
            p.add_(0.3 * torch.randn_like(p))
    r = _assert_pass(check_module(m, "class_attention"))
    assert {"x", "x_cls", "gamma_1", "gamma_2", "attn.q.weight", "norm1.bias"} <= set(r.grads_compared)
    assert ("attn.k.bias" in r.grads_compared) == qkv_bias


@pytest.mark.parametrize("heads,dim_head,ista", [(2, 4, 0.1), (1, 8, 0.3)])  # (1, 8): to_out is Identity
def test_crate_transformer_layer(heads, dim_head, ista):
    torch.manual_seed(heads)
    m = CrateTransformer(8, 1, heads, dim_head, ista=ista)
    with torch.no_grad():
        m.layers[0][1].fn.weight.mul_(0.5)
        m.layers[0][0].norm.bias.add_(0.5)  # ISTA's ReLU active on most entries
    r = _assert_pass(check_module(m, "crate_mssa_ista"))
    assert {"z", "attn.fn.qkv.weight", "ff.fn.weight", "ff.norm.bias"} <= set(r.grads_compared)
    deep = CrateTransformer(8, 3, heads, dim_head)  # any layer of a deeper model, by prefix
    p = params_from_state_dict("crate_mssa_ista", deep.state_dict(), prefix="layers.2.")
    assert np.array_equal(p["ff.fn.weight"], deep.layers[2][1].fn.weight.detach().numpy())
    back = grads_to_state_dict("crate_mssa_ista", p, prefix="layers.2.")
    assert sorted(back) == sorted(k for k in deep.state_dict() if k.startswith("layers.2."))


@pytest.mark.parametrize("attn_type", ["galerkin", "fourier"])
def test_oformer_linear_attention(attn_type):
    """BaratiLab/OFormer LinearAttention (tests/_upstream_ops.py), unpadded: check_module's default
    norm_axis="channels" is upstream's; refattn's own default ("points") is caught."""
    from _upstream_ops import build_oformer_linear_attention

    from refattn.operators.oformer import oformer_init_params

    params = oformer_init_params(np.random.default_rng(5), 6, 2, 4, attn_type=attn_type, init_gain=0.7)
    m, _ = build_oformer_linear_attention(torch, params, heads=2, dim_head=4, attn_type=attn_type)
    assert sorted(m.state_dict()) == ["to_out.0.bias", "to_out.0.weight", "to_qkv.weight"]
    _assert_pass(check_module(m, "oformer_attention", config={"attn_type": attn_type}))
    assert not check_module(m, "oformer_attention", config={"attn_type": attn_type, "norm_axis": "points"},
                            cases="small").passed


@pytest.mark.parametrize("kind,slug", [("galerkin", "galerkin_attention"), ("fourier", "fourier_type_attention")])
def test_galerkin_fourier(kind, slug):
    torch.manual_seed(6)
    m = UF.SimpleAttention(3, 12, pos_dim=2, attention_type=kind)
    _assert_pass(check_module(m, slug))


def test_transolver():
    torch.manual_seed(7)
    _assert_pass(check_module(Physics_Attention_Irregular_Mesh(6, heads=2, dim_head=4, slice_num=5),
                              "transolver_physics_attention"))


def test_transolver_structured_mesh_conv_kernels_keep_torch_layout():
    torch.manual_seed(17)
    m = Physics_Attention_Structured_Mesh_2D(5, heads=2, dim_head=4, H=3, W=4)
    p = params_from_state_dict("transolver_physics_attention", m.state_dict(), mesh_shape=(3, 4))
    assert p["in_project_x.weight"].shape == (8, 5, 3, 3)
    _assert_pass(check_module(m, "transolver_physics_attention", config={"mesh_shape": (3, 4)}))


@pytest.mark.parametrize("mode", ["weighted", "concat_project"])
def test_geotransolver_gale(mode):
    torch.manual_seed(3)
    m = GALE(6, heads=2, dim_head=4, slice_num=3, context_dim=5, state_mixing_mode=mode)
    with torch.no_grad():
        m.temperature.copy_(torch.tensor([0.3, 1.7]).view(1, 1, 2, 1))  # one head inside the clamp, one below
    r = _assert_pass(check_module(m, "geotransolver_gale"))
    assert {"x", "context", "temperature", "cross_k.weight", "qkv_project.weight"} <= set(r.grads_compared)
    assert ("state_mixing" in r.grads_compared) == (mode == "weighted")


def test_gnot():
    torch.manual_seed(8)
    _assert_pass(check_module(LinearCrossAttention(8, 2), "gnot_hna_attention"))


@pytest.mark.parametrize("temp", [False, True])
def test_linear_no(temp):
    torch.manual_seed(13)
    _assert_pass(check_module(LinearNO(6, temp=temp), "linear_no_attention", config={"use_temperature": temp}))


@pytest.mark.parametrize("block,make", [
    ("sab", lambda: SAB(5, 6, 2, ln=True)),
    ("isab", lambda: ISAB(5, 6, 3, num_inds=4, ln=False)),
    ("pma", lambda: PMA(6, 2, num_seeds=3, ln=True)),
])
def test_set_transformer(block, make):
    torch.manual_seed(14)
    # block, ln and num_heads are read from the module (its keys and its MAB's num_heads)
    _assert_pass(check_module(make(), "set_transformer_blocks"))


@pytest.mark.parametrize("bias", [False, True])
def test_restormer_mdta(bias):
    torch.manual_seed(5)
    m = RestormerAttention(6, 3, bias)
    with torch.no_grad():
        m.temperature.copy_(torch.tensor([0.5, 1.5, 3.0]).view(3, 1, 1))
    r = _assert_pass(check_module(m, "transposed_channel_attention"))
    assert {"x", "temperature", "qkv.weight", "qkv_dwconv.weight", "project_out.weight"} <= set(r.grads_compared)
    assert ("qkv_dwconv.bias" in r.grads_compared) == bias


@pytest.mark.parametrize("qkv_bias", [False, True])
def test_xcit_xca(qkv_bias):
    torch.manual_seed(6)
    m = XCA(8, num_heads=2, qkv_bias=qkv_bias)
    with torch.no_grad():
        m.temperature.copy_(torch.tensor([0.7, 2.0]).view(2, 1, 1))
    r = _assert_pass(check_module(m, "transposed_channel_attention"))
    assert {"x", "temperature", "qkv.weight", "proj.weight", "proj.bias"} <= set(r.grads_compared)
    assert ("qkv.bias" in r.grads_compared) == qkv_bias


@pytest.mark.parametrize("shift", [0, 1])
def test_scot_poseidon_layer(shift):
    torch.manual_seed(7 + shift)
    m = ScOTLayer(4, num_heads=2, window_size=2, shift_size=shift)
    r = _assert_pass(check_module(m, "scot_poseidon_block"))
    assert {"x", "t", "attention.self.logit_scale", "layernorm_before.weight.weight",
            "attention.self.continuous_position_bias_mlp.2.weight"} <= set(r.grads_compared)
    if shift:  # the shifted-window mask matters: refattn without the shift is caught
        assert not check_module(m, "scot_poseidon_block", config={"shift_size": 0}, cases="small").passed


def test_fno_spectral_conv_complex_weights():
    torch.manual_seed(9)
    m = SpectralConv2d(3, 4, 2, 3)
    p = params_from_state_dict("fno_spectral_conv", m.state_dict())
    assert sorted(p) == ["weights1_imag", "weights1_real", "weights2_imag", "weights2_real"]
    _assert_pass(check_module(m, "fno_spectral_conv"))


def test_afno():
    torch.manual_seed(10)
    _assert_pass(check_module(AFNO2D(8, num_blocks=2), "afno_dpot_fourier_mixer"))


# ------------------------------------------------------------------------------ the mapping itself


def test_square_matrix_transpose_trap_is_caught():
    """Untransposed weights pass every shape check when square, and check_module catches it."""
    torch.manual_seed(11)
    m = MultiheadDiffAttn(8, depth=1, num_heads=2).double()
    from refattn.attention.differential import diff_attention_v1
    from refattn.attention.differential.layer import rope_tables

    x = np.random.default_rng(0).standard_normal((2, 5, 8))
    rel = rope_tables(5, 2)
    with torch.no_grad():
        ref = m(torch.from_numpy(x), tuple(map(torch.from_numpy, rel))).numpy()
    naive = {k: v.numpy() for k, v in m.state_dict().items()}  # q_proj.weight (8, 8): no shape error
    wrong = diff_attention_v1(x, naive, num_heads=2, lambda_init=m.lambda_init, rel_pos=rel)
    assert np.max(np.abs(wrong - ref)) > 1e-2 * np.max(np.abs(ref))
    right = diff_attention_v1(x, params_from_state_dict("diff_attention_v1", m.state_dict()), num_heads=2,
                              lambda_init=m.lambda_init, rel_pos=rel)
    np.testing.assert_allclose(right, ref, rtol=1e-10, atol=1e-12)

    # a module whose Linear weights refattn would read untransposed: check_module fails it
    class Transposed(MultiheadDiffAttn):
        def forward(self, x, rel_pos, attn_mask=None):
            saved = {}
            for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
                lin = getattr(self, name)
                saved[name] = lin.weight
                lin.weight = nn.Parameter(lin.weight.T)  # the trap, on purpose
            try:
                return super().forward(x, rel_pos, attn_mask)
            finally:
                for name, w in saved.items():
                    getattr(self, name).weight = w

    torch.manual_seed(11)
    bad = Transposed(8, depth=1, num_heads=2)
    assert not check_module(bad, "diff_attention_v1", cases=["small"], seeds=[0]).passed


def test_prefix_strict_and_missing_key_messages():
    torch.manual_seed(12)
    model = nn.Sequential(nn.Linear(8, 8), MultiheadDiffAttn(8, depth=1, num_heads=2))
    sd = model.state_dict()
    p = params_from_state_dict("diff_attention_v1", sd, prefix="1.")
    np.testing.assert_array_equal(p["k_proj.weight"], sd["1.k_proj.weight"].numpy().T)
    broken = {k: v for k, v in sd.items() if k != "1.lambda_k2"}
    with pytest.raises(ValueError, match=r"no key '1\.lambda_k2'"):
        params_from_state_dict("diff_attention_v1", broken, prefix="1.")
    with pytest.raises(ValueError, match="no counterpart.*extra"):
        params_from_state_dict("diff_attention_v1", {**sd, "1.extra": torch.zeros(2)}, prefix="1.")
    assert "extra" not in params_from_state_dict("diff_attention_v1", {**sd, "1.extra": torch.zeros(2)},
                                                 prefix="1.", strict=False)
    with pytest.raises(ValueError, match="no key starts with prefix"):
        params_from_state_dict("diff_attention_v1", sd, prefix="2.")


def test_check_module_names_missing_config():
    class Bare(nn.Module):  # a DIFF V1 module without a num_heads attribute
        def __init__(self):
            super().__init__()
            self.inner = MultiheadDiffAttn(8, 1, 2)

    with pytest.raises(ValueError, match="num_heads.*attributes"):
        check_module(Bare(), "diff_attention_v1")
    with pytest.raises(TypeError, match="torch.nn.Module"):
        check_module(object(), "diff_attention_v1")


def test_unknown_and_unmapped_slugs(monkeypatch):
    with pytest.raises(ValueError, match="no mechanism"):
        params_from_state_dict("no_such_attention", {})
    assert params_from_state_dict("sdpa", {}) == {} and grads_to_state_dict("sdpa", {"q": 1.0}) == {}
    with pytest.raises(ValueError, match=r"params_from_state_dict\[sdpa\]: the mechanism has no weights"):
        params_from_state_dict("sdpa", {"q_proj.weight": np.zeros((2, 2))})
    with pytest.raises(ValueError, match=r"no state_dict table for 'sdpa' \(no weights\)"):
        check_module(nn.Identity(), "sdpa")
    with pytest.raises(ValueError, match=r"'combiner_attention' \(no PyTorch module\): google-research combiner is JAX"):
        params_from_state_dict("combiner_attention", {"key.kernel": np.zeros((2, 2))})
    with pytest.raises(TypeError, match="unknown config keywords"):
        params_from_state_dict("diff_attention_v1", MultiheadDiffAttn(8, 1, 2).state_dict(), n_head=2)
    assert "diff_attention_v1" in supported_slugs() and "sdpa" not in supported_slugs()
    with pytest.raises(ValueError, match="'grouped_differential_attention': the catalogue names no official PyTorch"):
        params_from_state_dict("grouped_differential_attention", {})
    from refattn.interop.torch_specs import SPECS

    monkeypatch.delitem(SPECS, "sonnet_mvca")  # a mechanism whose table is not written: the message quotes its code
    with pytest.raises(ValueError, match=r"'sonnet_mvca': its official code \(ClaudiaShu/Sonnet"):
        params_from_state_dict("sonnet_mvca", {})


def test_coverage_sorts_every_catalogue_mechanism():
    """Issue #20: say clearly which mechanisms are mapped, which have no official code, which wait."""
    from refattn import registry
    from refattn.interop.coverage import STATUSES, torch_coverage
    from refattn.interop.unmapped import UNMAPPED

    cov = torch_coverage()
    implemented = {r.slug for r in registry.all(implemented=True)} & set(registry.catalog_rows())
    assert set(cov) == implemented
    assert {s for s, _ in cov.values()} <= set(STATUSES)
    assert {k for k, (s, _) in cov.items() if s == "mapped"} == {k.split(":")[0] for k in supported_slugs()}
    mta = cov["multi_token_attention"]
    assert mta[0] == "mapped" and mta[1].startswith("multi_token_attention:layer: ")
    assert cov["grouped_differential_attention"][0] == "no official code"
    assert cov["gqa_mqa"][0] == "mapped" and "LlamaAttention" in cov["gqa_mqa"][1]
    assert cov["sdpa"] == ("no weights", UNMAPPED["sdpa"][1]) and "scaled_dot_product_attention" in cov["sdpa"][1]
    assert cov["combiner_attention"][0] == "no PyTorch module"
    assert not set(UNMAPPED) & {k.split(":")[0] for k in supported_slugs()}  # one status each
    assert "softmax" not in cov  # a primitive, not a catalogue entry
    # issue #20: every implemented mechanism with an upstream PyTorch module has a table, or a reason
    waiting = sorted(k for k, (s, _) in cov.items() if s == "not mapped yet")
    assert not waiting, f"map these in a torch_specs_<group> module, or add_unmapped with a reason: {waiting}"


def test_add_unmapped_validates():
    from refattn.interop.unmapped import add_unmapped

    with pytest.raises(ValueError, match="status must be one of"):
        add_unmapped("x", "unmapped", "because it is not mapped")
    with pytest.raises(ValueError, match="already listed"):
        add_unmapped("sdpa", "no weights", "it has no weights at all")
    with pytest.raises(ValueError, match="reason must be a sentence"):
        add_unmapped("x", "no weights", "none")


@pytest.mark.parametrize("make,slug", [
    (lambda: nn.MultiheadAttention(8, 2, batch_first=True), "multi_head_attention"),
    (lambda: nn.MultiheadAttention(8, 2, kdim=5, vdim=5), "multi_head_attention"),
    (lambda: UF.SimpleAttention(2, 8, pos_dim=1), "galerkin_attention"),
    (lambda: Physics_Attention_Irregular_Mesh(6), "transolver_physics_attention"),
    (lambda: SpectralConv2d(2, 3, 2, 2), "fno_spectral_conv"),
    (lambda: LinearCrossAttention(8, 2), "gnot_hna_attention"),
    (lambda: LinearNO(6, temp=True), "linear_no_attention"),
    (lambda: SAB(5, 6, 2, ln=True), "set_transformer_blocks"),
    (lambda: LlamaAttention(8, 4, 2, attention_bias=True), "gqa_mqa"),
    (lambda: GALE(6, state_mixing_mode="concat_project"), "geotransolver_gale"),
    (lambda: ScOTLayer(4, 2, 2, 1), "scot_poseidon_block"),
    (lambda: LayerScale_Block_CA(8, 2, qkv_bias=True), "class_attention"),
    (lambda: RestormerAttention(6, 3, True), "transposed_channel_attention"),
    (lambda: XCA(8, 2, qkv_bias=True), "transposed_channel_attention"),
])
def test_grads_to_state_dict_inverts_the_map(make, slug):
    m = make()
    sd = m.state_dict()
    cfg = {"block": "sab"} if slug == "set_transformer_blocks" else {}
    back = grads_to_state_dict(slug, params_from_state_dict(slug, sd, **cfg), prefix="layer.", **cfg)
    assert sorted(back) == sorted("layer." + k for k in sd)
    for k, v in sd.items():
        np.testing.assert_array_equal(back["layer." + k], v.numpy())


def test_import_refattn_does_not_import_torch():
    code = ("import sys, refattn, refattn.interop, refattn.interop.torch as t; "
            "t.supported_slugs(); assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_docs_page_examples_run():
    """docs/port-an-official-module.md: every python block runs (one namespace per block)."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "port-an-official-module.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert len(blocks) == 3
    for block in blocks:
        exec(compile(block, "port-an-official-module.md", "exec"), {"__name__": "__docs__"})


# ------------------------------------------------------------------------------ full layers ("slug:layer")
# The modules are those of tests/test_fidelity_layers.py, written from the upstream files cited in
# tests/_upstream_layers.py (file@commit); check_module maps their state_dicts by the "slug:layer"
# specs (the layer function, not the record's core) and compares forward and every gradient.

import _upstream_layers as U  # noqa: E402

_SHAPED = {"sas": dict(centre_attn=True),
           "plain": dict(centre_attn=False, value={"bias": False}, proj={"bias": False}),
           "reparam": dict(centre_attn=True, value={"resid_gain": 0.7, "skip_gain": 1.2, "init_type": "id"},
                           proj={"resid_gain": 0.4, "skip_gain": 0.9, "init_type": "normal", "bias": False},
                           qk_norm=True)}

_LAYER_CASES = {
    "multi_token_attention": {
        "gqa_both_gate1d": lambda r: U.mta_attention(r, dim=6, head_dim=2, n_heads=4, n_kv_heads=2, rope_theta=100.0,
                                                     pad_key="both", layer_norm_rescale=True, layer_id=2),
        "mqa_left_wposm": lambda r: U.mta_attention(r, dim=6, head_dim=2, n_heads=4, n_kv_heads=1, pad_key="left",
                                                    head_kernel_size=None, gate_1d=False),
        "mha_right": lambda r: U.mta_attention(r, dim=6, head_dim=2, n_heads=4, n_kv_heads=4, pad_key="right")},
    "mala_linear_attention": {"d8": lambda r: U.mala_attention(r, dim=16, num_heads=2)},
    "sinkformer_attention": {
        "h2": lambda r: U.sinkformer_attention_layer(r, dim=6, heads=2, dim_head=3, max_iter=3, eps=1.0),
        "h3_eps07": lambda r: U.sinkformer_attention_layer(r, dim=6, heads=3, dim_head=2, max_iter=4, eps=0.7),
        "identity_out": lambda r: U.sinkformer_attention_layer(r, dim=6, heads=1, dim_head=6, max_iter=1)},
    "alibi": {"h4": lambda r: U.alibi_self_attention(r, embed_dim=12, num_heads=4),
              "h6": lambda r: U.alibi_self_attention(r, embed_dim=12, num_heads=6)},
    "relative_position_encodings": {
        "encoder": lambda r: U.t5_attention(r, d_model=6, d_kv=3, n_heads=2),
        "decoder_causal": lambda r: U.t5_attention(r, d_model=6, d_kv=3, n_heads=2, is_decoder=True, causal=True),
        "cross_no_bias": lambda r: U.t5_attention(r, d_model=6, d_kv=3, n_heads=2, is_decoder=True, has_bias=False,
                                                  cross_dim=5)},
    "efficient_attention_shen": {
        "ck8_cv6": lambda r: U.efficient_attention_shen(r, in_channels=5, key_channels=8, head_count=2, value_channels=6),
        "ck6_cv12": lambda r: U.efficient_attention_shen(r, in_channels=5, key_channels=6, head_count=3,
                                                         value_channels=12)},
    "transnormer_norm_attention": {
        "t1_causal": lambda r: U.transnormer_norm_linear_attention(r, embed_dim=12, num_heads=3),
        "t1_bidirectional": lambda r: U.transnormer_norm_linear_attention(r, embed_dim=12, num_heads=3, causal=False),
        "gelu_layernorm": lambda r: U.transnormer_norm_linear_attention(r, embed_dim=12, num_heads=3, act="gelu",
                                                                        norm="layernorm", urpe=False)},
    "shaped_attention": {name: functools.partial(U.shaped_gpt2_attention, dim=6, heads=2, **kw)
                         for name, kw in _SHAPED.items()},
}


def _layer_params():
    return [pytest.param(slug, name, id=f"{slug}-{name}") for slug, cases in _LAYER_CASES.items() for name in cases]


@pytest.mark.parametrize("slug,case", _layer_params())
def test_full_layer_check_module(slug, case):
    layer = _LAYER_CASES[slug][case](np.random.default_rng(20))
    _assert_pass(check_module(layer.module, f"{slug}:layer", config=layer.config, seeds=(0,)))


@pytest.mark.parametrize("slug", sorted(_LAYER_CASES))
def test_full_layer_maps_state_dict_and_grads_back(slug):
    layer = next(iter(_LAYER_CASES[slug].values()))(np.random.default_rng(21))
    sd = layer.module.double().state_dict()
    p = params_from_state_dict(f"{slug}:layer", sd)
    ref = layer.params_from_state_dict({k: v.numpy() for k, v in sd.items()})
    assert set(ref) <= set(p)
    for k in ref:
        np.testing.assert_array_equal(p[k], ref[k])
    back = grads_to_state_dict(f"{slug}:layer", p, prefix="attn.")
    assert sorted(back) == sorted("attn." + k for k in sd)
    for k, v in sd.items():
        np.testing.assert_array_equal(back["attn." + k], v.numpy())


def test_full_layer_slugs_are_named_explicitly():
    assert "multi_token_attention:layer" in supported_slugs() and "multi_token_attention" not in supported_slugs()
    with pytest.raises(ValueError, match="pass the slug 'multi_token_attention:layer'"):
        params_from_state_dict("multi_token_attention", {})
    with pytest.raises(ValueError, match="no mapping 'sdpa:layer'; the suffixed names are .*alibi:layer"):
        params_from_state_dict("sdpa:layer", {})


# ----------------------------------------------------------------------------------------------
# refattn/interop/torch_specs_extra.py: record forwards that are the upstream module's forward;
# the modules are in tests/_upstream_layers.py (file@commit in their comments)


@pytest.mark.parametrize("heads,lam", [(2, 0.7), (3, 1.0), (1, 2.5)])
def test_pibert_physics_biased_attention(heads, lam):
    torch.manual_seed(3)
    m = U.PhysicsBiasedAttention(6, heads, lambda_param=lam)
    _assert_pass(check_module(m, "physics_biased_fourier_wavelet_attention"))


@pytest.mark.parametrize("d_model,hidden", [(3, 4), (5, 6), (2, 5)])
def test_sonnet_coherence_attention(d_model, hidden):
    from refattn.interop.torch_specs_extra import SONNET_N_ATOMS

    torch.manual_seed(5)
    m = U.CoherenceAttention(d_model, SONNET_N_ATOMS, hidden)
    with torch.no_grad():
        m.var_attn.add_(0.5 * torch.randn_like(m.var_attn))  # off the identity init: the trace matters
    _assert_pass(check_module(m, "sonnet_mvca"))
    bad = check_module(U.CoherenceAttention(d_model, 3, hidden), "sonnet_mvca", cases=["small"], seeds=[0])
    assert not bad.passed and "d_k=2" in str(bad)


@pytest.mark.parametrize("op,alpha,scale,gamma,rope,bias", [
    ("remove_parallel", 1.0, 1.0, 1.0, True, True), ("keep_parallel", 0.5, 0.7, 1.3, True, False),
    ("add_parallel", 0.5, 0.7, 1.0, False, True), ("negate_parallel", 0.5, 0.7, 1.3, True, True)])
def test_value_parallel_suppression(op, alpha, scale, gamma, rope, bias):
    torch.manual_seed(6)
    m = U.NanoGPTSelfValueAttention(8, 2, bias=bias, use_rope=rope, rope_base=100.0)
    cfg = {"op": op, "alpha": alpha, "subtract_scale": scale, "gamma": gamma}
    _assert_pass(check_module(m, "value_parallel_suppression", config=cfg))


@pytest.mark.parametrize("attn_type,heads,pos_dim", [("kv", 2, 10), ("kv", 3, 7), ("kv-nopos", 2, 10)])
def test_key_value_attention(attn_type, heads, pos_dim):
    torch.manual_seed(7)
    m = U.MultiheadAttentionKV(6, 6, heads, attn_type=attn_type, pos_dim=pos_dim)
    _assert_pass(check_module(m, "key_value_attention", config={"positional": attn_type == "kv"}))
    if attn_type == "kv-nopos":  # map_pos is read and dropped, and not written back
        sd = m.state_dict()
        assert "map_pos.weight" not in params_from_state_dict("key_value_attention", sd)
        p = params_from_state_dict("key_value_attention", sd, positional=True)
        assert sorted(grads_to_state_dict("key_value_attention", p, positional=True)) == sorted(sd)


@pytest.mark.parametrize("kw", [
    dict(dim_channel=2, patch_resolution=2, dim_token=6, nhead=2, dim_feedforward=5, num_layers=2, patch_num=2,
         demo_num=3),
    dict(dim_channel=3, patch_resolution=1, dim_token=4, nhead=1, dim_feedforward=3, num_layers=1, patch_num=3,
         demo_num=2, use_patch_pos_encoding=False)])
def test_vicon_icon_uncropped(kw):
    torch.manual_seed(8)
    _assert_pass(check_module(U.IconUncropped(**kw), "vicon_in_context_operator"))


@pytest.mark.parametrize("kw", [
    dict(group_size=4, query_key_dim=6, causal=False), dict(group_size=3, query_key_dim=40, causal=True),
    dict(group_size=5, query_key_dim=4, causal=True, norm="layernorm", shift_tokens=False, rotary=False)])
def test_mossformer_block(kw):
    torch.manual_seed(9)
    _assert_pass(check_module(U.MossFormerBlock(3, kernel_size=3, **kw), "mossformer_gated_joint_attention"))


_EXTRA_MODULES = {
    "physics_biased_fourier_wavelet_attention": (lambda: U.PhysicsBiasedAttention(6, 2), {}, ()),
    "sonnet_mvca": (lambda: U.CoherenceAttention(3, 2, 4), {}, ()),
    "value_parallel_suppression": (lambda: U.NanoGPTSelfValueAttention(8, 2), {}, ("bias", "attn_additive_mask")),
    "key_value_attention": (lambda: U.MultiheadAttentionKV(6, 6, 2), {"positional": True}, ()),
    "vicon_in_context_operator": (lambda: U.IconUncropped(dim_channel=2, patch_resolution=2, dim_token=6, nhead=2,
                                                          dim_feedforward=5, num_layers=2, patch_num=2, demo_num=3),
                                  {}, ("mask",)),
    "mossformer_gated_joint_attention": (lambda: U.MossFormerBlock(3, group_size=4, query_key_dim=6, kernel_size=3),
                                         {}, ("rotary_pos_emb.freqs",)),
}


def test_extra_specs_are_registered():
    from refattn.interop.torch_specs_extra import EXTRA_SLUGS

    assert set(EXTRA_SLUGS) <= set(supported_slugs())
    assert sorted(EXTRA_SLUGS) == sorted(_EXTRA_MODULES)


@pytest.mark.parametrize("slug", sorted(_EXTRA_MODULES))
def test_extra_specs_map_state_dict_and_grads_back(slug):
    make, cfg, derived = _EXTRA_MODULES[slug]
    torch.manual_seed(4)
    m = make().double()
    assert_round_trip(slug, m, cfg, derived)
    if slug == "physics_biased_fourier_wavelet_attention":  # nn.Linear weights arrive as (in, out)
        sd = m.state_dict()
        np.testing.assert_array_equal(params_from_state_dict(slug, sd)["q_proj.weight"], sd["q_proj.weight"].numpy().T)
