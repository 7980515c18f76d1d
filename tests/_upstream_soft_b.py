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


# ----------------------------------------------------------------------------------------------
# lsj2408/URPE@47b711f85be5de010deeafa9d8788d399912c3a2 fairseq/modules/transformer_sentence_encoder.py:
# relative_position_bucket and TransformerSentenceEncoder (the rp_bias / ur_rp_bias tables, their buckets and
# padding fills), around fairseq/modules/multihead_attention.py: MultiheadAttention (self_attention=True) with
# rel_pos_bias added before and ur_rel_pos_bias multiplied after the softmax. One attention layer only: the
# encoder's tables and one layer's self_attn.{q,k,v,out}_proj under one module; token-major (B, N, C) in and
# out. Deviations: dropout omitted (eval); the softmax without fairseq's float32 upcast.


def _relative_position_bucket(relative_position, num_buckets=32, max_distance=128):
    sign = torch.sign(relative_position)
    num_buckets //= 2
    n = torch.abs(relative_position)
    max_exact = num_buckets // 2
    large = max_exact + (torch.log(n.float() / max_exact) / math.log(max_distance / max_exact)
                         * (num_buckets - max_exact)).to(torch.long)
    large = torch.min(large, torch.full_like(large, num_buckets - 1))
    return torch.where(n < max_exact, n, large) * sign


def _urpe_bucket(max_seq_len, unique, num_buckets, max_distance):
    rel = torch.arange(max_seq_len)[None, :] - torch.arange(max_seq_len)[:, None]
    if unique:
        return rel - rel.min()
    b = _relative_position_bucket(rel, num_buckets=num_buckets, max_distance=max_distance)
    b[b >= 0] += 2
    return b - b.min()


class UrpeSelfAttention(nn.Module):
    def __init__(self, embed_dim, num_attention_heads, max_seq_len, rel_pos=True, rel_pos_unique=False, rp_bucket=64,
                 max_rp=128, ur_attn=True, ur_attn_unique=False, ur_rp_bucket=64, ur_max_rp=128):
        super().__init__()
        self.num_attention_heads, self.max_seq_len = num_attention_heads, max_seq_len
        self.head_dim = embed_dim // num_attention_heads
        self.scaling = self.head_dim ** -0.5
        self.q_proj, self.k_proj = nn.Linear(embed_dim, embed_dim), nn.Linear(embed_dim, embed_dim)
        self.v_proj, self.out_proj = nn.Linear(embed_dim, embed_dim), nn.Linear(embed_dim, embed_dim)
        self.rel_pos, self.rel_pos_unique, self.rp_bucket, self.max_rp = rel_pos, rel_pos_unique, rp_bucket, max_rp
        self.ur_attn, self.ur_attn_unique = ur_attn, ur_attn_unique
        self.ur_rp_bucket, self.ur_max_rp = ur_rp_bucket, ur_max_rp
        if rel_pos:
            self.bucket = _urpe_bucket(max_seq_len, rel_pos_unique, rp_bucket, max_rp)
            self.rp_bias = nn.Embedding(rp_bucket + 1 if not rel_pos_unique else self.bucket.max() + 1,
                                        num_attention_heads)
        if ur_attn:
            self.ur_bucket = _urpe_bucket(max_seq_len, ur_attn_unique, ur_rp_bucket, ur_max_rp)
            self.ur_rp_bias = nn.Embedding(ur_rp_bucket + 1 if not ur_attn_unique else self.ur_bucket.max() + 1,
                                           num_attention_heads)
            with torch.no_grad():  # upstream's tables are trained; off the N(0, 1) init so both signs occur
                self.ur_rp_bias.weight.add_(1.0)

    def _table(self, bucket, emb, b, n, padding_mask, fill):
        t = F.embedding(bucket[:n, :n], emb.weight).permute(2, 0, 1)[None].expand(b, -1, -1, -1)
        if padding_mask is not None:
            t = t.masked_fill(padding_mask[:, None, None, :], fill)
        return t.reshape(b * self.num_attention_heads, n, n)

    def forward(self, x, padding_mask=None):
        b, n, c = x.shape
        h, d = self.num_attention_heads, self.head_dim
        x = x.transpose(0, 1)  # fairseq is time-major
        q = self.q_proj(x) * self.scaling
        k, v = self.k_proj(x), self.v_proj(x)
        q, k, v = (t.reshape(n, b * h, d).transpose(0, 1) for t in (q, k, v))
        w = torch.bmm(q, k.transpose(1, 2))
        if padding_mask is not None:
            w = w.view(b, h, n, n).masked_fill(padding_mask[:, None, None, :], float("-inf")).view(b * h, n, n)
        if self.rel_pos:
            w = w + self._table(self.bucket, self.rp_bias, b, n, padding_mask, float("-inf"))
        w = F.softmax(w, dim=-1)
        if self.ur_attn:
            w = w * self._table(self.ur_bucket, self.ur_rp_bias, b, n, padding_mask, 0.0)
        out = torch.bmm(w, v).transpose(0, 1).reshape(n, b, c)
        return self.out_proj(out).transpose(0, 1)


# ----------------------------------------------------------------------------------------------
# HanseulJo/position-coupling@b9cad9476b1044a4232b2410ccfb7c6f758b6b36 src/model/modeling/custom_gpt2.py:
# CustomGPT2Model's embedding step with position_encoding_type='abs_learned' (hidden_states = inputs_embeds +
# wpe(position_ids)), called with inputs_embeds. Deviations: only the embedding step (no blocks, no token
# types); dropout omitted (eval).


class CoupledPositionEmbedding(nn.Module):
    def __init__(self, max_position_embeddings: int, embed_dim: int):
        super().__init__()
        self.wpe = nn.Embedding(max_position_embeddings, embed_dim)

    def forward(self, inputs_embeds, position_ids):
        return inputs_embeds + self.wpe(position_ids)


# ----------------------------------------------------------------------------------------------
# bshall/Tacotron@6fee34a7c3a9d4ceb9215ed3063771a9287010e1 tacotron/model.py: DynamicConvolutionAttention
# (forward(s, alpha) -> the next alignment; one decoder step). Deviation: the prior taps P are kept in
# float64 (upstream: torch.FloatTensor, float32-rounded taps).


class DynamicConvolutionAttention(nn.Module):
    def __init__(self, attn_rnn_size, hidden_size, static_channels, static_kernel_size, dynamic_channels,
                 dynamic_kernel_size, prior_length, alpha, beta):
        super().__init__()
        from scipy.stats import betabinom

        self.prior_length, self.dynamic_channels = prior_length, dynamic_channels
        self.dynamic_kernel_size = dynamic_kernel_size
        taps = betabinom.pmf(range(prior_length), prior_length - 1, alpha, beta)
        self.register_buffer("P", torch.from_numpy(taps.copy()).flip(0))
        self.W = nn.Linear(attn_rnn_size, hidden_size)
        self.V = nn.Linear(hidden_size, dynamic_channels * dynamic_kernel_size, bias=False)
        self.F = nn.Conv1d(1, static_channels, static_kernel_size, padding=(static_kernel_size - 1) // 2, bias=False)
        self.U = nn.Linear(static_channels, hidden_size, bias=False)
        self.T = nn.Linear(dynamic_channels, hidden_size)
        self.v = nn.Linear(hidden_size, 1, bias=False)

    def forward(self, s, alpha):
        b = s.size(0)
        p = F.conv1d(F.pad(alpha.unsqueeze(1), (self.prior_length - 1, 0)), self.P.view(1, 1, -1))
        p = torch.log(p.clamp_min(1e-6)).squeeze(1)
        G = self.V(torch.tanh(self.W(s)))
        g = F.conv1d(alpha.unsqueeze(0), G.view(-1, 1, self.dynamic_kernel_size),
                     padding=(self.dynamic_kernel_size - 1) // 2, groups=b)
        g = g.view(b, self.dynamic_channels, -1).transpose(1, 2)
        f = self.F(alpha.unsqueeze(1)).transpose(1, 2)
        e = self.v(torch.tanh(self.U(f) + self.T(g))).squeeze(-1) + p
        return F.softmax(e, dim=-1)


# ----------------------------------------------------------------------------------------------
# LeoniusChen/Attentions-in-Tacotron@82150125da901caf38c91647b9710b04bd572e8c gmm.py: GMMAttention on
# attention_base.py: BahdanauAttention (whose query_layer and v are in the state_dict but unused by GMM);
# init_attention(memory) then forward(query, memory, mask=None) per decoder step. Deviation: no mask.


class GMMAttention(nn.Module):
    def __init__(self, query_dim, attn_dim, K, version, score_mask_value=1e-8):
        super().__init__()
        self.query_layer = nn.Linear(query_dim, attn_dim, bias=False)  # BahdanauAttention's, unused here
        self.v = nn.Linear(attn_dim, 1, bias=False)
        self.score_mask_value, self.gmm_version, self.K, self.eps = score_mask_value, version, K, 1e-5
        self.mlp = nn.Sequential(nn.Linear(query_dim, attn_dim, bias=True), nn.Tanh(), nn.Linear(attn_dim, 3 * K))

    def init_attention(self, processed_memory):
        b, t, _ = processed_memory.shape
        self.mu_prev = processed_memory.new_zeros(b, self.K, 1)
        self.j = torch.arange(t).view(1, 1, t)

    def forward(self, query, processed_memory, mask=None):
        w_hat, d_hat, s_hat = (t.squeeze(1) for t in self.mlp(query).view(query.size(0), -1, self.K).chunk(3, dim=1))
        if self.gmm_version == "0":
            sigma = (torch.sqrt(torch.exp(-s_hat) / 2) + self.eps).unsqueeze(-1)
            delta, omega, Z = torch.exp(d_hat).unsqueeze(-1), torch.exp(w_hat).unsqueeze(-1), 1.0
        else:
            if self.gmm_version == "1":
                sigma = (torch.sqrt(torch.exp(s_hat)) + self.eps).unsqueeze(-1)
                delta = torch.exp(d_hat).unsqueeze(-1)
            else:
                sigma = (F.softplus(s_hat) + self.eps).unsqueeze(-1)
                delta = F.softplus(d_hat).unsqueeze(-1)
            omega, Z = F.softmax(w_hat, dim=-1).unsqueeze(-1), torch.sqrt(2 * math.pi * sigma ** 2)
        mu = self.mu_prev + delta
        self.mu_prev = mu
        return torch.sum(omega / Z * torch.exp(-(self.j - mu) ** 2 / sigma ** 2 / 2), 1)


# ----------------------------------------------------------------------------------------------
# harvardnlp/var-attn@ce2ac9ae9e9ad1374ce252bec6bfe9dfa5f00165 onmt/modules/VariationalAttention.py:
# VariationalAttention (score, forward for mode 'exact'/'enum': h_c and h_y of every source position) and
# onmt/Models.py: Generator (proj; 'exact' log-sum-exp over log_pa, 'enum' expectation over pa) with the ELBO's
# kl_divergence(q, p) of onmt/Loss.py. One module holding the attention's layers and the generator's proj at
# its top level; all decoder steps at once (upstream: one step per call, the same per-step math); the
# inference network's q scores are an input, masked like upstream's. Deviations: the sampled modes are left out.


class VarAttnGenerator(nn.Module):
    def __init__(self, src_dim, tgt_dim, attn_dim, vocab, attn_type="mlp"):
        super().__init__()
        self.attn_type, self.tgt_dim, self.src_dim = attn_type, tgt_dim, src_dim
        if attn_type == "general":
            self.linear_in = nn.Linear(tgt_dim, src_dim, bias=False)
        else:
            self.linear_context = nn.Linear(src_dim, attn_dim, bias=False)
            self.linear_query = nn.Linear(tgt_dim, attn_dim, bias=False)
            self.v = nn.Linear(attn_dim, 1, bias=False)
        self.linear_out = nn.Linear(src_dim + tgt_dim, tgt_dim, bias=attn_type == "mlp")
        self.proj = nn.Linear(tgt_dim, vocab)

    def score(self, h_t, h_s):
        if self.attn_type == "general":
            return torch.bmm(self.linear_in(h_t), h_s.transpose(1, 2))
        return self.v(torch.tanh(self.linear_query(h_t)[:, :, None] + self.linear_context(h_s)[:, None])).squeeze(-1)

    def forward(self, h, memory_bank, mode, memory_lengths=None, q_scores=None, kl_weight=1.0):
        b, t, _ = h.shape
        s = memory_bank.shape[1]
        scores = self.score(h, memory_bank)
        mask = None
        if memory_lengths is not None:
            mask = (torch.arange(s)[None] < memory_lengths[:, None])[:, None]
            scores = scores.masked_fill(~mask, -float("inf"))
        log_alpha = F.log_softmax(scores, dim=-1)
        if mode == "soft":
            h_c = torch.tanh(self.linear_out(torch.cat([h, torch.bmm(log_alpha.exp(), memory_bank)], -1)))
            return F.log_softmax(self.proj(h_c), dim=-1)
        concat_y = torch.cat([h[:, :, None].expand(b, t, s, -1), memory_bank[:, None].expand(b, t, s, -1)], -1)
        logp = F.log_softmax(self.proj(torch.tanh(self.linear_out(concat_y))), dim=-1)  # (B, T, S, V)
        if mode == "exact":
            return torch.logsumexp(logp + log_alpha[..., None], dim=2)
        if mask is not None:
            q_scores = q_scores.masked_fill(~mask, -float("inf"))
        qa = F.softmax(q_scores, dim=-1)
        kl = torch.distributions.kl.kl_divergence(torch.distributions.Categorical(probs=qa),
                                                  torch.distributions.Categorical(probs=log_alpha.exp()))
        return (logp * qa[..., None]).sum(2) - kl_weight * kl[..., None]


# ----------------------------------------------------------------------------------------------
# JRC1995/MonotonicLocationAttention@234f5b5561859c80cd647a0a9b4e97dce2c00dc9
# models/attentions/Multiheaded_Monotonic_Attention.py: Multiheaded_Monotonic_Attention (attention_only=False;
# location_attention_only = not mix_attention), driven as models/layers/GRUEncoderDecoder.py drives it:
# dir_gater on the first decoder state (mix_forward_reverse), the flip-and-shift reversal of the valid memory,
# value_transform + leaky_relu, one step per decoder state with past_attention carried. Only the attention
# path of GRUEncoderDecoder (its GRU cells and embeddings are left out: the decoder states are the input).
# Deviations: attention dropout omitted (eval); T.ones(...).float() casts dropped (the default dtype).


class MonotonicAttentionLayer(nn.Module):
    def __init__(self, heads, qk_head_dim, v_head_dim, query_dim, key_dim, value_dim, out_dim, step_act,
                 mix_attention=False, position_past=False, softstair_temp=20.0):
        super().__init__()
        self.heads, self.d, self.vd, self.scaling = heads, qk_head_dim, v_head_dim, qk_head_dim ** -0.5
        self.mix_attention, self.location_attention_only = mix_attention, not mix_attention
        self.step_act, self.position_past, self.softstair_temp = step_act, position_past, softstair_temp
        self.step_bias = nn.Parameter(torch.ones(1) * 20)
        if not self.location_attention_only:
            self.query_linear = nn.Linear(query_dim, heads * qk_head_dim, bias=False)
            self.key_linear = nn.Linear(key_dim, heads * qk_head_dim, bias=False)
        self.value_linear = nn.Linear(value_dim, heads * v_head_dim, bias=False)
        self.head_compose_linear = nn.Linear(heads * v_head_dim, out_dim, bias=False)
        self.position_state_linear = nn.Linear(query_dim, heads * qk_head_dim)
        self.Wsigma = nn.Parameter(torch.randn(heads, qk_head_dim, 1))
        self.Wrho = nn.Parameter(torch.randn(heads, qk_head_dim, 1))
        if mix_attention:
            self.mix_scorer = nn.Linear(query_dim, 1)

    def _steps(self, rho):
        if self.step_act == "relu":
            return F.relu(rho)
        if self.step_act == "sigmoid":
            return torch.sigmoid(5 * rho)
        if self.step_act == "controlled_relu":
            sb = torch.sigmoid(self.step_bias)
            return sb * F.relu(rho) + (1 - sb) * torch.sigmoid(5 * rho)
        if self.step_act == "softstair":
            return torch.floor(rho) + torch.sigmoid(self.softstair_temp * (rho - torch.floor(rho) - 0.5))
        return rho  # "free"

    def forward(self, Q, K, V, past_attention, attention_mask, value_positions):
        n, qs, _ = Q.shape
        vs = K.shape[1]
        h, d = self.heads, self.d
        lengths = attention_mask.sum(-1)
        step_size = torch.ones(n, h, qs, 1) / torch.clamp(lengths.view(n, 1, qs, 1) - 1, min=1)
        pos = value_positions.view(1, 1, 1, vs) * step_size
        mask = attention_mask.unsqueeze(1).bool()
        qpos = self.position_state_linear(Q).view(n, qs, h, d).transpose(1, 2)
        if past_attention is None:
            past_attention = torch.zeros(n, h, qs, 1)
        sigma = (F.relu(qpos @ self.Wsigma.view(1, h, d, 1)) + 0.27) / lengths.view(n, 1, qs, 1)
        mu = self._steps(qpos @ self.Wrho.view(1, h, d, 1)) * step_size + past_attention
        e = torch.exp(-(pos - mu) * (pos - mu) / (2 * sigma * sigma)) * mask
        position_scores = e / torch.sum(e + 1e-20, keepdim=True, dim=-1)
        scores = position_scores
        if not self.location_attention_only:
            q = self.query_linear(Q).view(n, qs, h, d).transpose(1, 2)
            k = self.key_linear(K).view(n, vs, h, d).transpose(1, 2)
            content = F.softmax((q @ k.transpose(2, 3) * self.scaling).masked_fill(~mask, float("-inf")), dim=-1)
            lam = torch.sigmoid(self.mix_scorer(Q)).unsqueeze(1)
            scores = lam * position_scores + (1 - lam) * content
        v = self.value_linear(V).view(n, vs, h, self.vd).transpose(1, 2)
        past = position_scores if (self.position_past or self.location_attention_only) else scores
        past_attention = torch.sum(past * pos, dim=-1, keepdim=True)
        out = (scores @ v).transpose(1, 2).reshape(n, qs, h * self.vd)
        return {"attended_values": self.head_compose_linear(out), "past_attention": past_attention}


class MonotonicEncoderDecoderAttention(nn.Module):
    def __init__(self, query_dim, memory_dim, value_dim, out_dim, heads, qk_head_dim, v_head_dim, step_act,
                 mix_attention=False, position_past=False):
        super().__init__()
        self.dir_gater = nn.Linear(query_dim, 1)
        self.value_transform = nn.Linear(memory_dim, value_dim)
        self.attention_layer = MonotonicAttentionLayer(heads, qk_head_dim, v_head_dim, query_dim, memory_dim,
                                                       value_dim, out_dim, step_act, mix_attention, position_past)

    def forward(self, query, memory, memory_mask):
        b, s, _ = memory.shape
        im = memory_mask.to(memory.dtype)
        cz = (1 - im).sum(-1)
        rev = torch.cat([torch.flip(memory, dims=[1]), torch.zeros_like(memory)], 1)
        rev = torch.stack([rev[i, int(cz[i]):int(cz[i]) + s] for i in range(b)], 0)
        g = torch.sigmoid(5 * self.dir_gater(query[:, 0])).view(b, 1, 1)
        key = g * memory + (1 - g) * rev
        value = F.leaky_relu(self.value_transform(key))
        past, outs = None, []
        for t in range(query.shape[1]):
            o = self.attention_layer(query[:, t:t + 1], key, value, past, im.unsqueeze(1), torch.arange(s))
            past = o["past_attention"]
            outs.append(o["attended_values"])
        return torch.cat(outs, 1)


# ----------------------------------------------------------------------------------------------
# awayfromzel/neural-attention-research@f6572f573ec43ddf26b01d468557b1b6e5649cb7
# nlp_neural_attention/Models/NeuralAttention.py: NeuralAttention (to_qkv split 'b n (d k h)', q_proj/k_proj,
# the linear1-3 ReLU MLP on every (query, key) pair, causal mask, W_out). No deviations (einops replaced by
# view/permute).


class NeuralAttention(nn.Module):
    def __init__(self, dim, heads=8, dim_head=None, causal=True, projection_dim=None):
        super().__init__()
        self.dim_head = int(dim / heads) if dim_head is None else dim_head
        inner = self.dim_head * heads
        self.heads, self.causal = heads, causal
        self.to_qkv = nn.Linear(dim, inner * 3, bias=False)
        self.W_out = nn.Linear(inner, dim, bias=False)
        self.projection_dim = projection_dim if projection_dim is not None else self.dim_head // 32
        self.q_proj = nn.Linear(self.dim_head, self.projection_dim)
        self.k_proj = nn.Linear(self.dim_head, self.projection_dim)
        self.linear1 = nn.Linear(self.projection_dim * 2, self.projection_dim)
        self.linear2 = nn.Linear(self.projection_dim, self.projection_dim // 2)
        self.linear3 = nn.Linear(self.projection_dim // 2, 1)

    def forward(self, x):
        b, n, _ = x.shape
        qkv = self.to_qkv(x).view(b, n, self.dim_head, 3, self.heads).permute(3, 0, 4, 1, 2)  # k b h n d
        q, k, v = qkv[0], qkv[1], qkv[2]
        q, k = self.q_proj(q), self.k_proj(k)
        pair = torch.cat((q[:, :, :, None].expand(-1, -1, -1, n, -1), k[:, :, None].expand(-1, -1, n, -1, -1)), -1)
        score = self.linear3(torch.relu(self.linear2(torch.relu(self.linear1(pair))))).squeeze(-1)
        if self.causal:
            score = score.masked_fill(torch.ones_like(score).triu(1).bool(), float("-inf"))
        out = torch.softmax(score, dim=-1) @ v
        return self.W_out(out.transpose(1, 2).reshape(b, n, -1))


# ----------------------------------------------------------------------------------------------
# chenbinghui1/MHN@4375c1aa973e9a998c6839a0e0b5bf9518402f40 model.py: HighDivModule (order-R attention:
# 1x1 convs order{R}_{j}_{i}, products, ReLU, convb{R}_{i} + Sigmoid, x * sum / R). No deviations.


class HighDivModule(nn.Module):
    def __init__(self, in_channels, order=1):
        super().__init__()
        self.order, self.inter_channels = order, in_channels // 8 * 2
        for j in range(order):
            for i in range(j + 1):
                setattr(self, f"order{order}_{j + 1}_{i + 1}",
                        nn.Sequential(nn.Conv2d(in_channels, self.inter_channels, 1, bias=False)))
        for i in range(order):
            setattr(self, f"convb{order}_{i + 1}",
                    nn.Sequential(nn.Conv2d(self.inter_channels, in_channels, 1, bias=False), nn.Sigmoid()))

    def forward(self, x):
        r, total = self.order, 0
        for j in range(r):
            prod = 1
            for i in range(j + 1):
                prod = prod * getattr(self, f"order{r}_{j + 1}_{i + 1}")(x)
            total = total + getattr(self, f"convb{r}_{j + 1}")(F.relu(prod))
        return x * total / r


# ----------------------------------------------------------------------------------------------
# wesleytruong/vllm-aha@aedfaa151ded7983c805284dfb80b555e757f2d4 vllm/model_executor/models/olmo2_aha.py:
# Olmo2AHAAttention (q_proj with the per-head gate columns, k_proj, v_proj, q_norm/k_norm RMSNorm over the full
# width, neox RoPE, global and sliding-window causal attention, hard gate sigmoid > 0.5, o_proj). Deviations:
# tp_size 1 (plain nn.Linear for the parallel linears, no all-gather); vLLM's Attention kernels written as
# masked softmax attention and batched (B, N, C) instead of flattened tokens; the window is a constructor
# argument (upstream's module constant LOCAL_WINDOW_SIZE = 128); RMSNorm and RoPE without float32 casts.


class Olmo2AHAAttention(nn.Module):
    def __init__(self, hidden_size, num_heads, num_kv_heads, local_window=128, rope_theta=500000.0, eps=1e-6):
        super().__init__()
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_dim = hidden_size // num_heads
        self.local_window, self.rope_theta, self.eps = local_window, rope_theta, eps
        self.q_proj = nn.Linear(hidden_size, num_heads * self.head_dim + num_heads, bias=False)
        self.k_proj = nn.Linear(hidden_size, num_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden_size, num_kv_heads * self.head_dim, bias=False)
        self.q_norm = nn.Module()
        self.q_norm.weight = nn.Parameter(torch.ones(hidden_size))
        self.k_norm = nn.Module()
        self.k_norm.weight = nn.Parameter(torch.ones(num_kv_heads * self.head_dim))
        self.o_proj = nn.Linear(num_heads * self.head_dim, hidden_size, bias=False)

    def _rms(self, x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * w

    def _rope(self, x, positions):  # neox style: rotate halves
        d = x.shape[-1]
        inv = 1.0 / self.rope_theta ** (torch.arange(0, d, 2, dtype=x.dtype) / d)
        f = positions.to(x.dtype)[:, None] * inv
        c, s = f.cos()[:, None], f.sin()[:, None]
        x1, x2 = x[..., : d // 2], x[..., d // 2:]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], -1)

    def _attend(self, q, k, v, allowed):
        w = (q @ k.transpose(-1, -2)) * self.head_dim ** -0.5
        return F.softmax(w.masked_fill(~allowed, float("-inf")), dim=-1) @ v

    def forward(self, positions, hidden_states):
        b, n, _ = hidden_states.shape
        h, hk, d = self.num_heads, self.num_kv_heads, self.head_dim
        q, gate = self.q_proj(hidden_states).split([h * d, h], dim=-1)
        k, v = self.k_proj(hidden_states), self.v_proj(hidden_states)
        q, k = self._rms(q, self.q_norm.weight), self._rms(k, self.k_norm.weight)
        q = self._rope(q.view(b, n, h, d), positions).transpose(1, 2)
        k = self._rope(k.view(b, n, hk, d), positions).transpose(1, 2).repeat_interleave(h // hk, 1)
        v = v.view(b, n, hk, d).transpose(1, 2).repeat_interleave(h // hk, 1)
        i, j = positions[:, None], positions[None, :]
        glob = self._attend(q, k, v, j <= i)
        loc = self._attend(q, k, v, (j <= i) & (i - j < self.local_window))
        g = (torch.sigmoid(gate) > 0.5).to(hidden_states.dtype).transpose(1, 2)[..., None]
        return self.o_proj((glob * g + loc * (1.0 - g)).transpose(1, 2).reshape(b, n, h * d))


# ----------------------------------------------------------------------------------------------
# ARIA-Funded-TREND/HMS@5e47a27040f003d69da93f268da718a5954db336 Vision/object_recognition/attention.py:
# ModulatedMultiHeadAttention (num_latents=1, num_heads=1, aggregation='max': modulate_cls_token for Q and K,
# modulate_v_cls, per-channel topk, attention over the latent and the selected rows, scatter back onto the
# modulated values). Deviations: top_k is a constructor argument (upstream hard-codes topk(12) and the
# reshape to 13 rows); dropout omitted (eval); the duplicated qkv line computed once.


class ModulatedMultiHeadAttention(nn.Module):
    def __init__(self, dim, num_latents=1, num_heads=1, qkv_bias=True, top_k=12):
        super().__init__()
        self.num_heads, self.num_latents, self.top_k = num_heads, num_latents, top_k
        self.head_dim = dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)

    def _topk(self, tokens):  # (B, H, 1, P, D) -> values, indices over the patch axis
        return tokens.topk(self.top_k, dim=3)

    def _modulate(self, cls, other, same):
        vals, idx = self._topk(cls.unsqueeze(3) * other.unsqueeze(2) + same.unsqueeze(2))
        return vals.squeeze(2), idx.squeeze(2)

    def forward(self, x):
        b, n, c = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        L = self.num_latents
        q_cls, q_p, k_cls, k_p, v_cls, v_p = q[:, :, :L], q[:, :, L:], k[:, :, :L], k[:, :, L:], v[:, :, :L], v[:, :, L:]
        q_mod, _ = self._modulate(q_cls, k_p, q_p)
        k_mod, _ = self._modulate(k_cls, q_p, k_p)
        modulated_v = (v_p ** 2).unsqueeze(2) + (2 * v_p).unsqueeze(2) + ((q_cls * k_cls) * (1 + v_cls.abs())).unsqueeze(3)
        v_mod, v_idx = self._topk(modulated_v)
        v_mod, v_idx, modulated_v = v_mod.squeeze(2), v_idx.squeeze(2), modulated_v.squeeze(2)
        qq, kk, vv = torch.cat([q_cls, q_mod], 2), torch.cat([k_cls, k_mod], 2), torch.cat([v_cls, v_mod], 2)
        out = (F.softmax((qq @ kk.transpose(-2, -1)) * self.scale, dim=-1) @ vv).transpose(1, 2)
        out = out.reshape(b, self.top_k + 1, c)
        mv = modulated_v.squeeze(1)
        skip = torch.zeros_like(mv).scatter(1, v_idx.squeeze(1), out[:, 1:])
        return torch.cat([out[:, :1], mv + skip], dim=1)


# ----------------------------------------------------------------------------------------------
# oelin/super-attention@3781367c690a34cb93ead6702b9efe8b9a7f04a8 super_attention/__init__.py: SuperAttention
# (single head; query = x @ project_query.weight, untransposed; value = project_value.weight @ x along the
# sequence; project_output). No deviations.


class SuperAttention(nn.Module):
    def __init__(self, embedding_dimension, sequence_length):
        super().__init__()
        self.project_query = nn.Linear(embedding_dimension, embedding_dimension, bias=False)
        self.project_value = nn.Linear(sequence_length, sequence_length, bias=False)
        self.project_output = nn.Linear(embedding_dimension, embedding_dimension, bias=False)

    def forward(self, x):
        query = x @ self.project_query.weight
        value = self.project_value.weight @ x
        score = torch.softmax(torch.einsum("bxe,bye->bxy", query, x) / math.sqrt(x.size(-1)), dim=-1)
        return self.project_output(score @ value)


# ----------------------------------------------------------------------------------------------
# NadavSc/Diff-Mamba@c83e7750d59f638aff297557d27020b31e8249eb (refattn follows 60c141e)
# language_modeling/src/models/sequence/modules/diffmambablock.py: DiffMamba (two Mamba-1 blocks m1, m2,
# lambda_q1..lambda_k2 of width d_state, lambda_init a 0-dim tensor from i_layer, subln RMSNorm of
# src/models/functional/rms_norm.py, the (1 - lambda_init) scale; returns (out, 0)) and its Mamba (slow path:
# causal_conv1d_fn and the fast path absent; mamba_ssm's selective_scan_ref for selective_scan_fn; returns
# (out, ssm_state)). Deviations: no .float() casts and lambda_init built in float64, so float64 stays float64;
# dt_proj keeps nn.Linear's default init (upstream's dt init only sets initial values).


def _selective_scan_ref(u, delta, A, B, C, D, z, delta_bias):
    delta = F.softplus(delta + delta_bias[..., None])
    state = A.new_zeros((u.shape[0], A.shape[0], A.shape[1]))
    dA = torch.exp(torch.einsum("bdl,dn->bdln", delta, A))
    dBu = torch.einsum("bdl,bnl,bdl->bdln", delta, B, u)
    ys = []
    for i in range(u.shape[2]):
        state = dA[:, :, i] * state + dBu[:, :, i]
        ys.append(torch.einsum("bdn,bn->bd", state, C[:, :, i]))
    return (torch.stack(ys, dim=2) + u * D[..., None]) * F.silu(z)


class Mamba(nn.Module):
    def __init__(self, d_model, d_state=16, d_conv=4, expand=2, conv_bias=True, bias=False, i_layer=None):
        super().__init__()
        self.d_inner, self.dt_rank, self.d_state = int(expand * d_model), math.ceil(d_model / 16), d_state
        self.i_layer = i_layer
        self.in_proj = nn.Linear(d_model, self.d_inner * 2, bias=bias)
        self.conv1d = nn.Conv1d(self.d_inner, self.d_inner, d_conv, bias=conv_bias, groups=self.d_inner,
                                padding=d_conv - 1)
        self.x_proj = nn.Linear(self.d_inner, self.dt_rank + 2 * d_state, bias=False)
        self.dt_proj = nn.Linear(self.dt_rank, self.d_inner, bias=True)
        self.A_log = nn.Parameter(torch.log(torch.arange(1, d_state + 1.0).repeat(self.d_inner, 1)))
        self.D = nn.Parameter(torch.ones(self.d_inner))
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=bias)

    def forward(self, hidden_states):
        L = hidden_states.shape[1]
        xz = (self.in_proj.weight @ hidden_states.reshape(-1, hidden_states.shape[-1]).T)
        xz = xz.reshape(xz.shape[0], -1, L).transpose(0, 1)
        if self.in_proj.bias is not None:
            xz = xz + self.in_proj.bias[:, None]
        x, z = xz.chunk(2, dim=1)
        x = F.silu(self.conv1d(x)[..., :L])
        dt, B, C = torch.split(self.x_proj(x.transpose(1, 2)), [self.dt_rank, self.d_state, self.d_state], dim=-1)
        dt = (dt @ self.dt_proj.weight.T).transpose(1, 2)
        y = _selective_scan_ref(x, dt, -torch.exp(self.A_log), B.transpose(1, 2), C.transpose(1, 2), self.D, z,
                                self.dt_proj.bias)
        return self.out_proj(y.transpose(1, 2)), None


class DiffMamba(nn.Module):
    def __init__(self, d_model, i_layer, d_state=16, d_conv=4, expand=1, conv_bias=True, bias=False):
        super().__init__()
        self.d_model = d_model
        self.m1 = Mamba(d_model, d_state, d_conv, expand, conv_bias, bias, i_layer)
        self.m2 = Mamba(d_model, d_state, d_conv, expand, conv_bias, bias, i_layer)
        self.lambda_init = 0.8 - 0.6 * torch.exp(torch.tensor(-0.3 * (i_layer - 1), dtype=torch.float64))
        for k in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            setattr(self, k, nn.Parameter(torch.randn(d_state)))
        self.subln = nn.Module()
        self.subln.eps, self.subln.weight = 1e-5, nn.Parameter(torch.ones(d_model))

    def forward(self, hidden_states):
        lam = (torch.exp(torch.sum(self.lambda_q1 * self.lambda_k1, dim=-1))
               - torch.exp(torch.sum(self.lambda_q2 * self.lambda_k2, dim=-1)) + self.lambda_init)
        a = self.m1(hidden_states)[0] - lam * self.m2(hidden_states)[0]
        a = a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + self.subln.eps) * self.subln.weight
        return a * (1 - self.lambda_init), 0
