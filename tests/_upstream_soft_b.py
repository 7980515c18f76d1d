"""PyTorch modules restated from upstream files, for the ``soft_b`` rows of refattn.interop.torch.

Each class restates the cited upstream module's computation in plain PyTorch (the math of
``owner/repo path@commit``, written here, not copied; only what the tested configurations use),
with the upstream parameter names and shapes, so that ``module.state_dict()`` has the upstream
keys. Deviations from upstream are listed in each class's header comment (dropout omitted: the
checks run in eval mode; float32 casts removed so float64 stays float64).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

# ----------------------------------------------------------------------------------------------
# codefuse-ai/Collinear-Constrained-Attention@79bee172680e8ac8894fb73445eaea2fdf64f1d7
# model/llama/modeling_llama.py: LlamaAttention (with LlamaRotaryEmbedding, rotate_half, apply_rotary_pos_emb,
# repeat_kv). Deviations: pretraining_tp=1 and no KV cache only; inv_freq built in the default dtype
# (upstream: float32) and the softmax without dtype=torch.float32, so float64 stays float64; the cos/sin
# tables are computed per call instead of cached to max_position_embeddings.


class CocaLlamaAttention(nn.Module):
    def __init__(self, hidden_size: int, num_heads: int, num_key_value_heads: int, base: float = 10000.0,
                 bias: bool = False):
        super().__init__()
        self.hidden_size, self.num_heads = hidden_size, num_heads
        self.head_dim = hidden_size // num_heads
        self.num_key_value_heads = num_key_value_heads
        self.num_key_value_groups = num_heads // num_key_value_heads
        self.q_proj = nn.Linear(hidden_size, num_heads * self.head_dim, bias=bias)
        self.t_proj = nn.Linear(hidden_size, num_key_value_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden_size, num_key_value_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(num_heads * self.head_dim, hidden_size, bias=bias)
        self.rotary_emb = nn.Module()
        self.rotary_emb.base = base

    @staticmethod
    def _rotate_half(x):
        h = x.shape[-1] // 2
        return torch.cat((-x[..., h:], x[..., :h]), dim=-1)

    def _repeat_kv(self, t):
        b, hk, n, d = t.shape
        g = self.num_key_value_groups
        return t if g == 1 else t[:, :, None].expand(b, hk, g, n, d).reshape(b, hk * g, n, d)

    def forward(self, hidden_states, attention_mask=None, position_ids=None):
        b, n, _ = hidden_states.shape
        d = self.head_dim
        q = self.q_proj(hidden_states).view(b, n, self.num_heads, d).transpose(1, 2)
        t = self.t_proj(hidden_states).view(b, n, self.num_key_value_heads, d).transpose(1, 2)
        t = F.relu((t[..., : d // 2] + t[..., d // 2:]) / 2)
        t = torch.cat((t, t), dim=-1)
        v = self.v_proj(hidden_states).view(b, n, self.num_key_value_heads, d).transpose(1, 2)
        inv_freq = 1.0 / (self.rotary_emb.base ** (torch.arange(0, d, 2, dtype=hidden_states.dtype) / d))
        freqs = torch.arange(n, dtype=hidden_states.dtype)[:, None] * inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[position_ids].unsqueeze(1), emb.sin()[position_ids].unsqueeze(1)
        q_rot = q * cos + self._rotate_half(q) * sin
        t = t * cos + self._rotate_half(t) * sin
        t, v = self._repeat_kv(t), self._repeat_kv(v)
        w = torch.einsum("bpnd,bpsd,bpnd->bpns", q, t, q_rot) / math.sqrt(d)
        if attention_mask is not None:
            w = w + attention_mask
        out = torch.matmul(F.softmax(w, dim=-1), v).transpose(1, 2).reshape(b, n, self.hidden_size)
        return self.o_proj(out), None, None
