"""Compact PyTorch re-statements of the upstream modules that tests/test_interop_lin_a.py checks
refattn against (refattn.interop.torch_specs_lin_a). Upstream names, shapes and forward as upstream;
each is headed by its repository@commit, file and class, and its deviations. Common deviations:
dropout omitted (eval mode), float32 casts removed so that float64 stays float64.
"""

import math

import numpy as np
import torch
import torch.nn as nn

# ---------------------------------------------------------------------------------------------------
# zhouhaoyi/Informer2020@29f2a73 models/attn.py: ProbAttention, AttentionLayer; utils/masking.py: ProbMask
# Deviations: dropout omitted; output_attention omitted (attn returned as None).


class ProbAttention(nn.Module):
    def __init__(self, mask_flag=True, factor=5, scale=None, attention_dropout=0.1, output_attention=False):
        super().__init__()
        self.factor, self.scale, self.mask_flag = factor, scale, mask_flag

    def _prob_QK(self, Q, K, sample_k, n_top):
        B, H, L_K, E = K.shape
        L_Q = Q.shape[2]
        K_expand = K.unsqueeze(-3).expand(B, H, L_Q, L_K, E)
        index_sample = torch.randint(L_K, (L_Q, sample_k))
        K_sample = K_expand[:, :, torch.arange(L_Q).unsqueeze(1), index_sample, :]
        Q_K_sample = torch.matmul(Q.unsqueeze(-2), K_sample.transpose(-2, -1)).squeeze(-2)
        M = Q_K_sample.max(-1)[0] - torch.div(Q_K_sample.sum(-1), L_K)
        M_top = M.topk(n_top, sorted=False)[1]
        Q_reduce = Q[torch.arange(B)[:, None, None], torch.arange(H)[None, :, None], M_top, :]
        return torch.matmul(Q_reduce, K.transpose(-2, -1)), M_top

    def _get_initial_context(self, V, L_Q):
        B, H, L_V, D = V.shape
        if not self.mask_flag:
            return V.mean(dim=-2).unsqueeze(-2).expand(B, H, L_Q, D).clone()
        return V.cumsum(dim=-2)

    def _update_context(self, context_in, V, scores, index, L_Q):
        B, H, L_V, D = V.shape
        if self.mask_flag:  # ProbMask
            mask = torch.ones(L_Q, scores.shape[-1], dtype=torch.bool).triu(1)
            mask = mask[None, None].expand(B, H, L_Q, scores.shape[-1])
            mask = mask[torch.arange(B)[:, None, None], torch.arange(H)[None, :, None], index, :].view(scores.shape)
            scores.masked_fill_(mask, -np.inf)
        attn = torch.softmax(scores, dim=-1)
        context_in[torch.arange(B)[:, None, None], torch.arange(H)[None, :, None], index, :] = \
            torch.matmul(attn, V).type_as(context_in)
        return context_in

    def forward(self, queries, keys, values, attn_mask):
        B, L_Q, H, D = queries.shape
        L_K = keys.shape[1]
        queries, keys, values = queries.transpose(2, 1), keys.transpose(2, 1), values.transpose(2, 1)
        U_part = min(self.factor * np.ceil(np.log(L_K)).astype("int").item(), L_K)
        u = min(self.factor * np.ceil(np.log(L_Q)).astype("int").item(), L_Q)
        scores_top, index = self._prob_QK(queries, keys, sample_k=U_part, n_top=u)
        scores_top = scores_top * (self.scale or 1.0 / math.sqrt(D))
        context = self._get_initial_context(values, L_Q)
        context = self._update_context(context, values, scores_top, index, L_Q)
        return context.transpose(2, 1).contiguous(), None


class AttentionLayer(nn.Module):
    def __init__(self, attention, d_model, n_heads, d_keys=None, d_values=None, mix=False):
        super().__init__()
        d_keys = d_keys or (d_model // n_heads)
        d_values = d_values or (d_model // n_heads)
        self.inner_attention = attention
        self.query_projection = nn.Linear(d_model, d_keys * n_heads)
        self.key_projection = nn.Linear(d_model, d_keys * n_heads)
        self.value_projection = nn.Linear(d_model, d_values * n_heads)
        self.out_projection = nn.Linear(d_values * n_heads, d_model)
        self.n_heads, self.mix = n_heads, mix

    def forward(self, queries, keys, values, attn_mask):
        B, L, _ = queries.shape
        S, H = keys.shape[1], self.n_heads
        queries = self.query_projection(queries).view(B, L, H, -1)
        keys = self.key_projection(keys).view(B, S, H, -1)
        values = self.value_projection(values).view(B, S, H, -1)
        out, attn = self.inner_attention(queries, keys, values, attn_mask)
        if self.mix:
            out = out.transpose(2, 1).contiguous()
        return self.out_projection(out.view(B, L, -1)), attn


# ---------------------------------------------------------------------------------------------------
# facebookresearch/fairseq@3d262bb examples/linformer/linformer_src/modules/multihead_linear_attention.py:
# MultiheadLinearAttention. Deviations: only the self-attention path (what the Linformer encoder uses);
# quant_noise, dropout, masks, add_bias_kv, add_zero_attn, incremental state and shared_compress_layer omitted;
# fairseq's utils.softmax (float32 upcast) is torch.softmax.


class MultiheadLinearAttention(nn.Module):
    def __init__(self, embed_dim, num_heads, bias=True, self_attention=True, compressed=1, max_seq_len=256,
                 shared_kv_compressed=0):
        super().__init__()
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.head_dim = embed_dim // num_heads
        self.scaling = self.head_dim ** -0.5
        self.self_attention = self_attention
        self.k_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.compress_seq_len = max_seq_len // compressed
        self.compress_k = nn.Linear(max_seq_len, self.compress_seq_len, bias=False)
        if shared_kv_compressed == 0:
            self.compress_v = nn.Linear(max_seq_len, self.compress_seq_len, bias=False)
        self.shared_kv_compressed = shared_kv_compressed
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)

    def forward(self, query, key, value, need_weights=True):
        tgt_len, bsz, embed_dim = query.size()
        q = self.q_proj(query)
        k_input = query.permute(1, 2, 0).contiguous()
        k_input = nn.functional.linear(k_input, self.compress_k.weight[:, 0:tgt_len]).permute(2, 0, 1).contiguous()
        k = self.k_proj(k_input)
        v_input = query.permute(1, 2, 0).contiguous()
        comp = self.compress_v if self.shared_kv_compressed == 0 else self.compress_k
        v_input = nn.functional.linear(v_input, comp.weight[:, 0:tgt_len]).permute(2, 0, 1).contiguous()
        v = self.v_proj(v_input)
        q = q * self.scaling
        q = q.contiguous().view(tgt_len, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        k = k.contiguous().view(-1, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        v = v.contiguous().view(-1, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        attn_weights = torch.softmax(torch.bmm(q, k.transpose(1, 2)), dim=-1)
        attn = torch.bmm(attn_weights, v)
        attn = attn.transpose(0, 1).contiguous().view(tgt_len, bsz, embed_dim)
        return self.out_proj(attn), None


# ---------------------------------------------------------------------------------------------------
# ziplab/EcoFormer@a277f9e pvt/performer.py: EcoformerSelfAttention, EcoformerFastAttention, linear_attention_bias;
# pvt/hashing/ksh.py: KernelSH (forward); pvt/hashing/utils.py: BinaryQuantizer, square_dist.
# Deviations: the script-level args (nbits, m) are constructor arguments; KernelSH's fitting on the first batch
# (train_hashing_weight_woeig) is omitted: build with is_trained=True and set the buffers; the unused ORF buffer is
# drawn Gaussian; the AMP .float() casts are removed; dropout omitted.


class BinaryQuantizer(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input):
        ctx.save_for_backward(input)
        return torch.sign(input)

    @staticmethod
    def backward(ctx, grad_output):
        (input,) = ctx.saved_tensors
        grad_input = grad_output.clone()
        grad_input[input.ge(1)] = 0
        grad_input[input.le(-1)] = 0
        return grad_input


class KernelSH(nn.Module):
    def __init__(self, head_num=3, head_dim=64, nbits=16, m=20):
        super().__init__()
        self.nbits, self.m, self.head_dim = nbits, m, head_dim
        self.register_buffer("A", torch.randn(head_num, self.nbits, self.m))
        self.register_buffer("mvec", torch.zeros(1, head_num, 1, self.m))
        self.register_buffer("anchor", torch.zeros(1, head_num, self.m, self.head_dim))

    def forward(self, X):
        ktest = torch.sum((X.unsqueeze(-2) - self.anchor.unsqueeze(-3)) ** 2, -1)  # square_dist
        sigma = ktest.mean(-1).mean(-1)
        ktest = torch.exp(-ktest / (2 * sigma.unsqueeze(-1).unsqueeze(-1)))
        ktest = ktest - self.mvec
        y = torch.einsum("bhnm,hkm->bhnk", ktest, self.A.detach())
        return BinaryQuantizer.apply(y)


def linear_attention_bias(q, k, v, nbits):
    N = q.shape[2]
    bias = nbits + 1
    top_bias, bottom_bias = v * bias, N * bias
    k_cumsum = k.sum(dim=-2)
    D_inv = 1.0 / (torch.einsum("...nd,...d->...n", q, k_cumsum) + bottom_bias)
    context = torch.einsum("...nd,...ne->...de", k, v)
    out = torch.einsum("...de,...nd->...ne", context, q) + top_bias
    return torch.einsum("...ne,...n->...ne", out, D_inv)


class EcoformerFastAttention(nn.Module):
    def __init__(self, num_heads, dim_heads, nbits, m, nb_features=None):
        super().__init__()
        nb_features = nb_features or int(dim_heads * math.log(dim_heads))
        self.register_buffer("projection_matrix", torch.randn(nb_features, dim_heads))
        self.is_trained = False
        self.ksh = KernelSH(num_heads, dim_heads, nbits, m)

    def forward(self, qk, v):
        qk = qk / torch.norm(qk, 2, dim=-1, keepdim=True)
        assert self.is_trained, "KSH fitting is not re-stated: set the buffers and is_trained=True"
        qk = self.ksh(qk)
        return linear_attention_bias(qk, qk, v, self.ksh.nbits)


class EcoformerSelfAttention(nn.Module):
    def __init__(self, dim, num_heads=8, qkv_bias=False, nbits=16, m=20):
        super().__init__()
        head_dim = dim // num_heads
        self.fast_attention = EcoformerFastAttention(num_heads, head_dim, nbits, m)
        self.num_heads = num_heads
        self.to_qk = nn.Linear(dim, dim, bias=qkv_bias)
        self.to_v = nn.Linear(dim, dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        qk = self.to_qk(x).reshape(B, N, self.num_heads, C // self.num_heads).permute(0, 2, 1, 3)
        v = self.to_v(x).reshape(B, N, self.num_heads, C // self.num_heads).permute(0, 2, 1, 3)
        x = self.fast_attention(qk, v)
        return self.proj(x.permute(0, 2, 1, 3).reshape(B, N, C))  # rearrange "b h n d -> b n (h d)"


# ---------------------------------------------------------------------------------------------------
# Graph-and-Geometric-Learning/hyperbolic-transformer@768fcec large/hypformer.py: TransConvLayer
# (linear_focus_attention, forward); Hypformer/manifolds/layer.py: HypLinear; Hypformer/manifolds/lorentz.py: Lorentz
# (on geoopt's Lorentz, which holds k as a frozen nn.Parameter). Deviations: only what the linear focused attention
# uses: the manifold keeps k and nothing else; full_attention (which alone uses scale and bias), output_attn, the
# use_weight=False branch and HypLinear's x_manifold / manifold_out / dropout options are omitted.


class Lorentz(nn.Module):
    def __init__(self, k=1.0, learnable=False):
        super().__init__()
        self.k = nn.Parameter(torch.as_tensor(float(k)), requires_grad=learnable)


class HypLinear(nn.Module):
    def __init__(self, manifold, in_features, out_features, bias=True):
        super().__init__()
        self.in_features, self.out_features = in_features + 1, out_features
        self.manifold = manifold
        self.linear = nn.Linear(self.in_features, self.out_features, bias=bias)

    def forward(self, x):
        x_space = self.linear(x)
        x_time = ((x_space ** 2).sum(dim=-1, keepdims=True) + self.manifold.k).sqrt()
        return torch.cat([x_time, x_space], dim=-1)


class TransConvLayer(nn.Module):
    def __init__(self, manifold, in_channels, out_channels, num_heads, power_k=2.0, trans_heads_concat=False):
        super().__init__()
        self.manifold, self.num_heads, self.out_channels = manifold, num_heads, out_channels
        self.Wk = nn.ModuleList([HypLinear(manifold, in_channels, out_channels) for _ in range(num_heads)])
        self.Wq = nn.ModuleList([HypLinear(manifold, in_channels, out_channels) for _ in range(num_heads)])
        self.Wv = nn.ModuleList([HypLinear(manifold, in_channels, out_channels) for _ in range(num_heads)])
        self.scale = nn.Parameter(torch.tensor([math.sqrt(out_channels)]))
        self.bias = nn.Parameter(torch.zeros(()))
        self.norm_scale = nn.Parameter(torch.ones(()))
        self.v_map_mlp = nn.Linear(in_channels, out_channels, bias=True)
        self.power_k, self.trans_heads_concat = power_k, trans_heads_concat
        if trans_heads_concat:
            self.final_linear = nn.Linear(out_channels * num_heads, out_channels, bias=True)

    @staticmethod
    def fp(x, p=2):
        norm_x = torch.norm(x, p=2, dim=-1, keepdim=True)
        norm_x_p = torch.norm(x ** p, p=2, dim=-1, keepdim=True)
        return (norm_x / norm_x_p) * x ** p

    def linear_focus_attention(self, hyp_qs, hyp_ks, hyp_vs):
        qs, ks, v = hyp_qs[..., 1:], hyp_ks[..., 1:], hyp_vs[..., 1:]
        phi_qs = self.fp((torch.relu(qs) + 1e-6) / (self.norm_scale.abs() + 1e-6), p=self.power_k)
        phi_ks = self.fp((torch.relu(ks) + 1e-6) / (self.norm_scale.abs() + 1e-6), p=self.power_k)
        k_transpose_v = torch.einsum("nhm,nhd->hmd", phi_ks, v)
        numerator = torch.einsum("nhm,hmd->nhd", phi_qs, k_transpose_v)
        denominator = torch.einsum("nhd,hd->nh", phi_qs, torch.einsum("nhd->hd", phi_ks)).unsqueeze(-1)
        attn_output = numerator / (denominator + 1e-6) + self.v_map_mlp(v)
        if self.trans_heads_concat:
            attn_output = self.final_linear(attn_output.reshape(-1, self.num_heads * self.out_channels))
        else:
            attn_output = attn_output.mean(dim=1)
        attn_output_time = ((attn_output ** 2).sum(dim=-1, keepdims=True) + self.manifold.k) ** 0.5
        return torch.cat([attn_output_time, attn_output], dim=-1)

    def forward(self, query_input, source_input):
        query = torch.stack([self.Wq[i](query_input) for i in range(self.num_heads)], dim=1)
        key = torch.stack([self.Wk[i](source_input) for i in range(self.num_heads)], dim=1)
        value = torch.stack([self.Wv[i](source_input) for i in range(self.num_heads)], dim=1)
        return self.linear_focus_attention(query, key, value)


# ---------------------------------------------------------------------------------------------------
# giorgioroffo/infinite-self-attention@4a37fc0 infsa/attention.py: InfSAAttention; infsa/core.py: pure_infsa_scores,
# linear_infsa_scores, infsa_attention. Deviations: dropout omitted; need_weights and the hidden_states keyword omitted.


def pure_infsa_scores(q, k, rho=0.95, eps=1e-6):
    scale = math.sqrt(1.0 / q.shape[-1])
    A = torch.relu(torch.matmul(q * scale, (k * scale).transpose(-2, -1)))
    A_flat = A.flatten(-2)
    A_flat = A_flat / (torch.norm(A_flat, p=2, dim=-1, keepdim=True) + eps)
    return rho * A_flat.view(A.shape)


def linear_infsa_scores(q, k, rho=0.95, eps=1e-6):
    scale = math.sqrt(1.0 / q.shape[-1])
    q_scaled, k_scaled = q * scale, k * scale
    energy = torch.relu(q_scaled.norm(p=2, dim=-1))
    weights = energy / (energy.sum(dim=-1, keepdim=True) + eps)
    q_bar = torch.einsum("...n,...nd->...d", weights, q_scaled)
    a = torch.relu(torch.einsum("...d,...nd->...n", q_bar, k_scaled))
    a = a / (a.sum(dim=-1, keepdim=True) + eps)
    return (rho * a).unsqueeze(-1)


def infsa_attention(q, k, v, variant="pure_infsa", rho=0.95, eps=1e-6):
    if variant == "pure_infsa":
        return torch.matmul(pure_infsa_scores(q, k, rho=rho, eps=eps), v)
    scores = linear_infsa_scores(q, k, rho=rho, eps=eps)
    return (scores * v).sum(dim=-2, keepdim=True).expand_as(v)


class InfSAAttention(nn.Module):
    def __init__(self, embed_dim, num_heads, variant="pure_infsa", bias=True, batch_first=True, rho_init=0.95,
                 rho_trainable=True, kdim=None, vdim=None):
        super().__init__()
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.variant, self.batch_first = variant, batch_first
        self.kdim = kdim if kdim is not None else embed_dim
        self.vdim = vdim if vdim is not None else embed_dim
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.k_proj = nn.Linear(self.kdim, embed_dim, bias=bias)
        self.v_proj = nn.Linear(self.vdim, embed_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        rho_logit = math.log(rho_init / (1.0 - rho_init))
        if rho_trainable:
            self.rho_logit = nn.Parameter(torch.tensor(rho_logit))
        else:
            self.register_buffer("rho_logit", torch.tensor(rho_logit))

    def forward(self, query, key, value, need_weights=False):
        if not self.batch_first:
            query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
        B, N, _ = query.shape
        S, H, D = key.shape[1], self.num_heads, self.head_dim
        q = self.q_proj(query).view(B, N, H, D).transpose(1, 2)
        k = self.k_proj(key).view(B, S, H, D).transpose(1, 2)
        v = self.v_proj(value).view(B, S, H, D).transpose(1, 2)
        rho_val = torch.sigmoid(self.rho_logit).item()
        output = infsa_attention(q, k, v, variant=self.variant, rho=rho_val)
        output = self.out_proj(output.transpose(1, 2).contiguous().view(B, N, self.embed_dim))
        if not self.batch_first:
            output = output.transpose(0, 1)
        return output, None


# ---------------------------------------------------------------------------------------------------
# SmallDoges/flash-dmattn@f024c28 benchmarks/forward_equivalence.py: dynamic_mask_attention_python, repeat_kv;
# flash_sparse_attn/utils/mask.py: create_mask, topk_mask; the dynamic bias from DogeAttention's A and dt_proj
# (huggingface/transformers@00ca1ab src/transformers/models/doge/modeling_doge.py DogeAttention.forward:
# dt_states = dt_proj(values as (B, M, H_kv d)); exp(A * softplus(dt_states)); flash-dmattn's example layer: without
# the exp). Deviations: one module holding DogeAttention's A and dt_proj around the reference; the top-k keeps
# min(window_size, key_len) keys (all of them below the window, as DogeAttention.prepare_dynamic_mask; the reference's
# topk fails there); the
# causal mask is built here (top-left), create_mask's 2-D mask padding and block smoothing are omitted.


def repeat_kv(hidden_states, n_rep):
    batch, num_key_value_heads, slen, head_dim = hidden_states.shape
    if n_rep == 1:
        return hidden_states
    hidden_states = hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)
    return hidden_states.reshape(batch, num_key_value_heads * n_rep, slen, head_dim)


def topk_mask(attention_bias, attention_mask, window_size, min_dtype):
    attention_bias = attention_bias.detach()
    if attention_mask is not None:
        attention_bias = attention_bias.masked_fill(~attention_mask, min_dtype)
    topk_values, topk_indices = torch.topk(attention_bias, window_size, dim=-1, largest=True, sorted=False)
    return torch.zeros_like(attention_bias, dtype=torch.bool).scatter_(-1, topk_indices, topk_values != min_dtype)


def dynamic_mask_attention_python(query_states, key_states, value_states, attn_bias, causal_mask, scaling,
                                  window_size, is_causal):
    num_heads, key_len = query_states.shape[1], key_states.shape[2]
    num_queries_per_kv = num_heads // key_states.shape[1]
    attn_mask = topk_mask(attn_bias, causal_mask if is_causal else None, min(window_size, key_len),
                          torch.finfo(query_states.dtype).min)
    key_states = repeat_kv(key_states, num_queries_per_kv)
    value_states = repeat_kv(value_states, num_queries_per_kv)
    attn_bias = repeat_kv(attn_bias, num_queries_per_kv)
    attn_mask = repeat_kv(attn_mask, num_queries_per_kv) if attn_mask is not None else None
    attn_weights = torch.matmul(query_states, key_states.transpose(-2, -1)) * scaling + attn_bias
    if attn_mask is not None:
        attn_weights = attn_weights.masked_fill(~attn_mask, float("-inf"))
    attn_weights = torch.softmax(attn_weights, dim=-1)
    return torch.matmul(attn_weights, value_states).transpose(1, 2).contiguous()


class DynamicMaskAttention(nn.Module):
    def __init__(self, num_key_value_heads, head_dim, keep_window_size, is_causal=True, attention_bias=True,
                 exp_bias=False):
        super().__init__()
        self.A = nn.Parameter(torch.zeros(num_key_value_heads))
        self.dt_proj = nn.Linear(num_key_value_heads * head_dim, num_key_value_heads, bias=attention_bias)
        self.keep_window_size, self.is_causal, self.exp_bias = keep_window_size, is_causal, exp_bias

    def forward(self, query_states, key_states, value_states):
        B, _, L, D = query_states.shape
        M = key_states.shape[2]
        dt_states = self.dt_proj(value_states.transpose(1, 2).reshape(B, M, -1))
        dt_states = self.A * nn.functional.softplus(dt_states)
        if self.exp_bias:
            dt_states = torch.exp(dt_states)
        attn_bias = dt_states.transpose(-1, -2).unsqueeze(-2).expand(-1, -1, L, -1)
        causal_mask = torch.ones(B, 1, L, M, dtype=torch.bool).tril()
        return dynamic_mask_attention_python(query_states, key_states, value_states, attn_bias, causal_mask,
                                             D ** -0.5, self.keep_window_size, self.is_causal)


# ---------------------------------------------------------------------------------------------------
# cschenxiang/DRSformer@e77bbb4 basicsr/models/archs/DRSformer_arch.py: Attention (TKSA). Deviations: attn_drop
# (Dropout(0.)) omitted; einops rearrange written as reshape; the mask buffers are made in the input's dtype.


class DRSAttention(nn.Module):
    def __init__(self, dim, num_heads, bias):
        super().__init__()
        self.num_heads = num_heads
        self.temperature = nn.Parameter(torch.ones(num_heads, 1, 1))
        self.qkv = nn.Conv2d(dim, dim * 3, kernel_size=1, bias=bias)
        self.qkv_dwconv = nn.Conv2d(dim * 3, dim * 3, kernel_size=3, stride=1, padding=1, groups=dim * 3, bias=bias)
        self.project_out = nn.Conv2d(dim, dim, kernel_size=1, bias=bias)
        self.attn1 = nn.Parameter(torch.tensor([0.2]))
        self.attn2 = nn.Parameter(torch.tensor([0.2]))
        self.attn3 = nn.Parameter(torch.tensor([0.2]))
        self.attn4 = nn.Parameter(torch.tensor([0.2]))

    def forward(self, x):
        b, c, h, w = x.shape
        q, k, v = self.qkv_dwconv(self.qkv(x)).chunk(3, dim=1)
        q, k, v = (t.reshape(b, self.num_heads, c // self.num_heads, h * w) for t in (q, k, v))  # b (head c) h w
        q = nn.functional.normalize(q, dim=-1)
        k = nn.functional.normalize(k, dim=-1)
        C = q.shape[2]
        attn = (q @ k.transpose(-2, -1)) * self.temperature
        out = 0
        for kk, weight in ((int(C / 2), self.attn1), (int(C * 2 / 3), self.attn2), (int(C * 3 / 4), self.attn3),
                           (int(C * 4 / 5), self.attn4)):
            mask = torch.zeros(b, self.num_heads, C, C, dtype=x.dtype)
            mask.scatter_(-1, torch.topk(attn, k=kk, dim=-1, largest=True)[1], 1.0)
            a = torch.where(mask > 0, attn, torch.full_like(attn, float("-inf"))).softmax(dim=-1)
            out = out + (a @ v) * weight
        return self.project_out(out.reshape(b, c, h, w))


# ---------------------------------------------------------------------------------------------------
# LUMIA-Group/FourierTransformer@cba1dc2 LRA/code/attention.py: Attention (attn_type "dct" path);
# LRA/code/attention_dct.py: dct, idct, DCTAttention. Deviations: attention dropout omitted; the amp autocast
# contexts removed; the softmax / none attention types and gradient checkpointing omitted.


def dct(x, norm=None):
    x_shape = x.shape
    N = x_shape[-1]
    x = x.contiguous().view(-1, N)
    v = torch.cat([x[:, ::2], x[:, 1::2].flip([1])], dim=1)
    Vc = torch.fft.fft(v, dim=1)
    k = -torch.arange(N, dtype=x.dtype, device=x.device)[None, :] * np.pi / (2 * N)
    V = Vc.real * torch.cos(k) - Vc.imag * torch.sin(k)
    if norm == "ortho":
        V[:, 0] /= np.sqrt(N) * 2
        V[:, 1:] /= np.sqrt(N / 2) * 2
    return 2 * V.view(*x_shape)


def idct(X, norm=None):
    x_shape = X.shape
    N = x_shape[-1]
    X_v = X.contiguous().view(-1, x_shape[-1]) / 2
    if norm == "ortho":
        X_v[:, 0] *= np.sqrt(N) * 2
        X_v[:, 1:] *= np.sqrt(N / 2) * 2
    k = torch.arange(x_shape[-1], dtype=X.dtype, device=X.device)[None, :] * np.pi / (2 * N)
    W_r, W_i = torch.cos(k), torch.sin(k)
    V_t_r = X_v
    V_t_i = torch.cat([X_v[:, :1] * 0, -X_v.flip([1])[:, :-1]], dim=1)
    V_r = V_t_r * W_r - V_t_i * W_i
    V_i = V_t_r * W_i + V_t_i * W_r
    V = torch.view_as_complex(torch.cat([V_r.unsqueeze(2), V_i.unsqueeze(2)], dim=2))
    v = torch.fft.ifft(V, dim=1).real
    x = v.new_zeros(v.shape)
    x[:, ::2] += v[:, :N - (N // 2)]
    x[:, 1::2] += v.flip([1])[:, :N // 2]
    return x.view(*x_shape)


class DCTAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.num_head, self.head_dim = config["num_head"], config["head_dim"]
        self.seq_len, self.dct_percentage = config["max_seq_len"], config["dct_percentage"]

    def split_heads(self, X):
        return X.reshape(X.size(0), X.size(1), self.num_head, self.head_dim).transpose(1, 2)

    def forward(self, X, W_q, W_k, W_v, pooling_mode):
        B, T, C = X.shape
        if pooling_mode == "CLS":
            CLS = X[:, 0, :].unsqueeze(1)
            X = X[:, 1:, :]
        X = dct(X.transpose(1, 2), norm="ortho")[:, :, :math.ceil(T * self.dct_percentage)].transpose(1, 2)
        X = idct(X.transpose(1, 2), norm="ortho").transpose(1, 2)
        if pooling_mode == "CLS":
            X = torch.cat([CLS, X], dim=1)
        short_X = X
        Q, K, V = self.split_heads(W_q(X)), self.split_heads(W_k(X)), self.split_heads(W_v(X))
        attn = torch.softmax(torch.matmul(Q, K.transpose(-2, -1)) / math.sqrt(self.head_dim), dim=-1)
        return short_X, torch.matmul(attn, V)


class FourierAttention(nn.Module):  # attention.py: Attention
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.dim, self.head_dim, self.num_head = config["transformer_dim"], config["head_dim"], config["num_head"]
        self.attn_type = config["attn_type"]
        self.W_q = nn.Linear(self.dim, self.num_head * self.head_dim)
        self.W_k = nn.Linear(self.dim, self.num_head * self.head_dim)
        self.W_v = nn.Linear(self.dim, self.num_head * self.head_dim)
        self.attn = DCTAttention(config)
        self.ff = nn.Linear(self.num_head * self.head_dim, self.dim)

    def forward(self, X, mask):
        shortX, attn_out = self.attn(X, self.W_q, self.W_k, self.W_v, self.config["pooling_mode"])
        attn_out = attn_out.transpose(1, 2).reshape(attn_out.size(0), attn_out.size(2), self.num_head * self.head_dim)
        return shortX, self.ff(attn_out)


# ---------------------------------------------------------------------------------------------------
# YuchuanTian/U-DiT@7fcce5e udit_models.py: precompute_freqs_cis_2d, reshape_for_broadcast, apply_rotary_emb,
# DownSampler, DownSample_Attn. Deviations: the .float() casts of the RoPE tables and of q, k removed (float64 stays
# float64); einops rearrange written as reshape / permute; use_cls omitted.


def precompute_freqs_cis_2d(dim, end, theta=10000.0, dtype=torch.float64):
    H = int(end ** 0.5)
    flat_patch_pos = torch.arange(0, end)
    x_pos, y_pos = flat_patch_pos % H, flat_patch_pos // H
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 4)[: (dim // 4)].to(dtype) / dim))
    x_freqs, y_freqs = torch.outer(x_pos, freqs).to(dtype), torch.outer(y_pos, freqs).to(dtype)
    x_cis = torch.polar(torch.ones_like(x_freqs), x_freqs)
    y_cis = torch.polar(torch.ones_like(y_freqs), y_freqs)
    return torch.cat([x_cis.unsqueeze(dim=-1), y_cis.unsqueeze(dim=-1)], dim=-1).reshape(end, -1)


def apply_rotary_emb(xq, xk, freqs_cis):
    xq_ = torch.view_as_complex(xq.reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.reshape(*xk.shape[:-1], -1, 2))
    if freqs_cis.shape[-1] == xq_.shape[-1]:  # reshape_for_broadcast
        shape = [1 if i == 2 or i == 0 else d for i, d in enumerate(xq_.shape)]
    else:
        shape = [d if i != 0 else 1 for i, d in enumerate(xq_.shape)]
    freqs_cis = freqs_cis.view(*shape)
    return torch.view_as_real(xq_ * freqs_cis).flatten(3), torch.view_as_real(xk_ * freqs_cis).flatten(3)


class DownSampler(nn.Module):
    def __init__(self, *args, **kwargs):
        super().__init__()
        self.down_factor = kwargs.pop("down_factor")
        self.downsampler = kwargs.pop("downsampler")
        self.down_shortcut = kwargs.pop("down_shortcut")
        self.layer = nn.Conv2d(*args, **kwargs)

    def forward(self, x):
        x = self.layer(x) + (x if self.down_shortcut else 0)
        b, d, H, W = x.shape  # 'b d (h dh) (w dw) -> b (dh dw) (h w) d'
        f = self.down_factor
        return x.reshape(b, d, H // f, f, W // f, f).permute(0, 3, 5, 2, 4, 1).reshape(b, f * f, -1, d)


class DownSample_Attn(nn.Module):
    def __init__(self, dim, input_size, down_factor, num_heads, bias=False, posemb_type=None, attn_type=None,
                 downsampler=None, down_shortcut=False):
        super().__init__()
        self.dim, self.heads = dim, num_heads
        self.scale = (dim // num_heads) ** -0.5
        self.dh, self.dw = down_factor, down_factor
        self.to_qkv = nn.Linear(dim, dim * 3, bias=bias)
        self.to_out = nn.Conv2d(dim, dim, 1)
        self.attn_type = attn_type
        if attn_type == "v2":
            self.logit_scale = nn.Parameter(torch.log(10 * torch.ones((num_heads, 1, 1))), requires_grad=True)
        self.posemb_type = posemb_type
        self.freqs_cis = None
        k = int(downsampler[-1])
        self.downsampler = DownSampler(dim, dim, kernel_size=k, stride=1, padding=(k - 1) // 2, groups=dim,
                                       down_factor=down_factor, downsampler=downsampler, down_shortcut=down_shortcut)

    def forward(self, x):
        b, _, h, w = x.size()
        x = self.downsampler(x)
        qkv = self.to_qkv(x).chunk(3, dim=-1)
        P, He = self.dh * self.dw, self.heads

        def bphnd(t):  # 'b p n (h d) -> b p h n d'
            return t.reshape(b, P, t.shape[2], He, -1).permute(0, 1, 3, 2, 4)

        if self.posemb_type == "rope2d":
            N = h * w // self.dh // self.dw
            if self.freqs_cis is None or self.freqs_cis.shape[0] != N:
                self.freqs_cis = precompute_freqs_cis_2d(self.dim // self.heads, N, dtype=x.dtype)
            q, k = (t.reshape(b * P, N, He, -1) for t in qkv[:-1])  # '(b p) n h d'
            q, k = apply_rotary_emb(q, k, freqs_cis=self.freqs_cis)
            q, k = (t.reshape(b, P, N, He, -1).permute(0, 1, 3, 2, 4) for t in (q, k))
            v = bphnd(qkv[2])
        else:
            q, k, v = (bphnd(t) for t in qkv)
        if self.attn_type is None:
            attn = (q @ k.transpose(-2, -1)) * self.scale
        else:
            attn = nn.functional.normalize(q, dim=-1) @ nn.functional.normalize(k, dim=-1).transpose(-2, -1)
            attn = attn * torch.clamp(self.logit_scale, max=4.6052).exp()
        x = attn.softmax(dim=-1) @ v
        f, d = self.dh, x.shape[-1]  # 'b (dh dw) he (h w) d -> b (he d) (h dh) (w dw)'
        x = x.reshape(b, f, f, He, h // f, w // f, d).permute(0, 3, 6, 4, 1, 5, 2).reshape(b, He * d, h, w)
        return self.to_out(x)


# ---------------------------------------------------------------------------------------------------
# cs1160701/OnLearningTheKernel@a8e3d3b fast_transformers/attention/linear_attention.py: LinearAttention;
# fast_transformers/feature_maps/fourier_features.py: GaussianFeatureMap, GaussianMixtureFourierFeatures,
# SmoothedGaussianMixtureFourierFeatures, GaussianMixturePositive; feature_maps/base.py FeatureMap.
# Deviations: the attention takes the feature-map instance (upstream: a factory called with query_dimensions); the
# masks / lengths arguments (all ones here) and the event dispatcher are omitted; orthogonal noise and stabilize
# are omitted; omega is drawn in the buffer's dtype.


class GaussianFeatureMap(nn.Module):
    def __init__(self, query_dimensions, n_dims, softmax_temp=None, redraw=1, deterministic_eval=False):
        super().__init__()
        self.query_dims = query_dimensions
        self.n_dims = n_dims or query_dimensions
        self.softmax_temp = softmax_temp or 1 / math.sqrt(query_dimensions)
        self.redraw, self.deterministic_eval = redraw, deterministic_eval
        self.register_buffer("omega", torch.zeros(self.query_dims, self.n_dims // 4))
        self.register_buffer("_calls", torch.tensor(-1, dtype=torch.int))

    def new_feature_map(self, device, dtype):
        if self.deterministic_eval and not self.training:
            return
        self._calls += 1
        if (self._calls % self.redraw) != 0:
            return
        self.register_buffer("omega", torch.zeros(self.omega.shape, dtype=dtype, device=device).normal_())

    def forward_queries(self, x):
        return self(x)

    def forward_keys(self, x):
        return self(x)


class GaussianMixtureFourierFeatures(GaussianFeatureMap):
    def __init__(self, query_dimensions, n_heads, n_dims=None, softmax_temp=None):
        super().__init__(query_dimensions, n_dims=n_dims, softmax_temp=softmax_temp)
        self.mean = nn.Parameter(torch.Tensor(n_heads, query_dimensions))
        self.sigma = nn.Parameter(torch.Tensor(n_heads, query_dimensions, query_dimensions))
        nn.init.xavier_uniform_(self.sigma)
        bound = 1 / math.sqrt(nn.init._calculate_fan_in_and_fan_out(self.sigma)[0])
        nn.init.uniform_(self.mean, -bound, bound)

    def forward(self, x):
        x = x * math.sqrt(self.softmax_temp)
        omega_gauss = torch.einsum("sm,hsd->hdm", self.omega, self.sigma)
        omega_p = omega_gauss + self.mean.unsqueeze(-1)
        omega_m = omega_gauss - self.mean.unsqueeze(-1)
        u_p = torch.einsum("nlhd,hdm->nlhm", x, omega_p)
        u_m = torch.einsum("nlhd,hdm->nlhm", x, omega_m)
        phi = torch.cat([torch.cos(u_p), torch.sin(u_p), torch.cos(u_m), torch.sin(u_m)], dim=-1)
        return phi * math.sqrt(4 / self.n_dims)


class SmoothedGaussianMixtureFourierFeatures(GaussianMixtureFourierFeatures):
    def __init__(self, query_dimensions, n_heads, n_dims=None, softmax_temp=None, smoothing=1.0):
        super().__init__(query_dimensions, n_heads=n_heads,
                         n_dims=query_dimensions - 1 if n_dims is None else n_dims - 1, softmax_temp=softmax_temp)
        self.smoothing = smoothing

    def forward(self, x):
        y = super().forward(x)
        return torch.cat([y, torch.full(y.shape[:-1] + (1,), self.smoothing, dtype=y.dtype)], dim=-1)


class GaussianMixturePositive(GaussianFeatureMap):
    def __init__(self, query_dimensions, n_heads, n_dims=None, softmax_temp=None):
        super().__init__(query_dimensions, n_dims=n_dims, softmax_temp=softmax_temp)
        self.register_buffer("omega", torch.zeros(self.query_dims, self.n_dims))
        self.mean = nn.Parameter(torch.Tensor(n_heads, query_dimensions))
        self.sigma = nn.Parameter(torch.Tensor(n_heads, query_dimensions))
        nn.init.xavier_uniform_(self.sigma)
        bound = 1 / math.sqrt(nn.init._calculate_fan_in_and_fan_out(self.sigma)[0])
        nn.init.uniform_(self.mean, -bound, bound)

    def forward(self, x):
        x = x * math.sqrt(self.softmax_temp)
        norm_x_squared = torch.einsum("...d,...d->...", x, x).unsqueeze(-1)
        omega = self.omega * torch.exp(self.sigma / 2).unsqueeze(-1) + self.mean.unsqueeze(-1)
        u = torch.einsum("nlhd,hdm->nlhm", x, omega)
        return torch.exp(u - (norm_x_squared + 0.5 * math.log(self.n_dims)))


class LinearAttention(nn.Module):
    def __init__(self, query_dimensions, feature_map, eps=1e-6):
        super().__init__()
        self.feature_map, self.eps = feature_map, eps

    def forward(self, queries, keys, values):
        self.feature_map.new_feature_map(queries.device, queries.dtype)
        Q = self.feature_map.forward_queries(queries)
        K = self.feature_map.forward_keys(keys)
        KV = torch.einsum("nshd,nshm->nhmd", K, values)
        Z = 1 / (torch.einsum("nlhd,nhd->nlh", Q, K.sum(dim=1)) + self.eps)
        return torch.einsum("nlhd,nhmd,nlh->nlhm", Q, KV, Z).contiguous()


# ---------------------------------------------------------------------------------------------------
# cruiseresearchgroup/spectraformer@ff37d34 src/models/attention_performer.py: PerformerAttention, FastAttention,
# linear_attention; src/models/component_functions.py: get_params_posrf, get_rfs_torch (its exponential branch);
# src/models/weight_matrices_approx.py: gaussian_matrix, gaussian_orthogonal_random_matrix (scaling 0).
# Deviations: only the posrf component with a fixed weight matrix (feat "gaus" / "orf") and the non-causal path;
# gaussian_matrix draws torch.randn (its MultivariateNormal(0, I) rows), the QR is torch.linalg.qr; the complex
# branch (A > 1/4), saderf's psi and the FastFood learner are omitted.


def gaussian_orthogonal_random_matrix(nb_rows, nb_columns):
    blocks = [torch.linalg.qr(torch.randn(nb_columns, nb_columns))[0].t() for _ in range(-(-nb_rows // nb_columns))]
    return torch.cat(blocks)[:nb_rows] * torch.randn((nb_rows, nb_columns)).norm(dim=1)[:, None]


def get_rfs_posrf(data, d, rf_params, projection_matrix, is_query, eps=1e-4):
    b, h, j, _ = data.shape
    norms = torch.norm(data, p=2, dim=-1, keepdim=True)
    A, s = rf_params
    C = -(s + 1) / 2
    D_dir = torch.pow(torch.pow(1 - 4 * A, 1 / 4) / torch.abs(torch.pow(1 - 4 * A, 1 / 4)), d)
    B = torch.sqrt(1 - 4 * A)
    data_dash = torch.einsum("...id,...jd->...ij", data, projection_matrix.expand(b, h, *projection_matrix.shape))
    omega_norms = torch.norm(projection_matrix, p=2, dim=1, keepdim=True).transpose(0, 1)
    sB = B if is_query else s * B
    eq_a = (torch.unsqueeze(A, -1) @ (omega_norms ** 2)).expand(b, -1, -1, -1)
    data_prime1 = eq_a + sB[None, :, :, None] * data_dash + C * norms ** 2
    data_prime1 = data_prime1 - torch.max(data_prime1, dim=-1, keepdim=True).values
    return D_dir[None, :, :, None] * torch.exp(data_prime1) + eps


class FastAttention(nn.Module):
    def __init__(self, dim_heads, nb_features=None, feat="orf"):
        super().__init__()
        nb_features = nb_features or int(dim_heads * math.log(dim_heads))
        self.dim_heads = dim_heads
        proj = torch.randn(nb_features, dim_heads) if feat == "gaus" else \
            gaussian_orthogonal_random_matrix(nb_features, dim_heads)
        self.register_buffer("projection_matrix", proj)

    def forward(self, q, k, v):
        rf_params = (torch.zeros(q.shape[1], q.shape[2], dtype=q.dtype), 1)  # get_params_posrf
        q = get_rfs_posrf(q, self.dim_heads, rf_params, self.projection_matrix, is_query=True)
        k = get_rfs_posrf(k, self.dim_heads, rf_params, self.projection_matrix, is_query=False)
        k_cumsum = k.sum(dim=-2)  # linear_attention
        D_inv = 1.0 / torch.einsum("...nd,...d->...n", q, k_cumsum.type_as(q))
        context = torch.einsum("...nd,...ne->...de", k, v.type_as(k))
        return torch.einsum("...de,...nd,...n->...ne", context, q, D_inv)


class PerformerAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.head_dim, self.rp_dim, self.kernel_type = config["head_dim"], config["rp_dim"], config["kernel_type"]
        assert self.kernel_type == "posrf", "only the posrf component is re-stated"
        self.attn_fn = FastAttention(dim_heads=self.head_dim, nb_features=self.rp_dim, feat=config["feat"])

    def forward(self, Q, K, V, mask):
        return self.attn_fn(Q / math.sqrt(math.sqrt(self.head_dim)),
                            K / math.sqrt(math.sqrt(self.head_dim)) * mask[:, None, :, None],
                            V * mask[:, None, :, None])


# ---------------------------------------------------------------------------------------------------
# mlpen/VCC@356f806 src/roberta/models/vcc.py: WeightedAttention, VccEncoderLayer; src/roberta/models/mra_projection/
# formatter.py: Formatter; coarser.py: Coarser, cache_update; finer.py: Finer, cache_select; selector.py: Selector.
# Deviations: dropout omitted; checkpointing, the "random" selector, positions in the mixed states
# (include_positions_in_mixed_states=False) and the explore branch of training mode are omitted (eval: argsort);
# the config is a SimpleNamespace; the layer holds its Formatter as attribute formatter (VccEncoder holds it).


def cache_update(cache, update, update_indices):
    if "bank" not in cache:
        cache["indice_table"], cache["bank"] = update_indices, update
    else:
        batch_size, update_size = update.shape[:2]
        cache_offset = cache["bank"].shape[1]
        batch_indices = torch.arange(batch_size)[:, None]
        cache["indice_table"][batch_indices, update_indices] = torch.arange(cache_offset, cache_offset + update_size)[None]
        cache["bank"] = torch.cat([cache["bank"], update], dim=1)


def cache_select(cache, select_indices):
    batch_indices = torch.arange(select_indices.shape[0])[:, None]
    return cache["bank"][batch_indices, cache["indice_table"][batch_indices, select_indices], :, :]


class Coarser(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.block_size = config.block_size

    def to_coarse(self, fine_token_states, fine_token_mask):
        batch_size, size, dim = fine_token_states.shape
        nb = size // self.block_size
        fine_token_states = (fine_token_states * fine_token_mask[:, :, None]).reshape(batch_size, nb, self.block_size, dim)
        count = fine_token_mask.reshape(batch_size, nb, self.block_size).double().sum(dim=2).to(fine_token_states.dtype)
        coarse = (fine_token_states.double().sum(dim=2) / (count[:, :, None] + 1e-4)).to(fine_token_states.dtype)
        return coarse, (count > 0).to(fine_token_states.dtype), coarse[:, :, None, :] - fine_token_states

    def forward(self, ms):
        if "fine_token_states" in ms:
            coarse, coarse_mask, difference = self.to_coarse(ms.pop("fine_token_states"), ms["fine_token_mask"])
            batch_size, num_blocks = difference.shape[:2]
            ms["coarse_token_states"], ms["coarse_token_mask"] = coarse, coarse_mask
            ms["difference_cache"] = {"version": 0}
            cache_update(ms["difference_cache"], difference, torch.arange(num_blocks)[None, :].repeat(batch_size, 1))
        else:
            fine_idx, coarse_idx = ms.pop("fine_block_indices"), ms.pop("coarse_block_indices")
            pf_states, pf_mask = ms.pop("partial_fine_token_states"), ms.pop("partial_fine_token_mask")
            pc_states, pc_mask = ms.pop("partial_coarse_token_states"), ms.pop("partial_coarse_token_mask")
            reorder = torch.argsort(torch.cat([fine_idx, coarse_idx], dim=1), dim=1)
            batch_indices = torch.arange(fine_idx.shape[0])[:, None]
            coarse, coarse_mask, difference = self.to_coarse(pf_states, pf_mask)
            ms["coarse_token_states"] = torch.cat([coarse, pc_states], dim=1)[batch_indices, reorder, :]
            assert torch.allclose(ms["coarse_token_mask"], torch.cat([coarse_mask, pc_mask], dim=1)[batch_indices, reorder])
            cache_update(ms["difference_cache"], difference, fine_idx)
        return ms


class Finer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.block_size = config.block_size

    def forward(self, ms):
        bs = self.block_size
        if "fine_block_indices" in ms:
            coarse, coarse_mask = ms.pop("coarse_token_states"), ms["coarse_token_mask"]
            fine_idx, coarse_idx = ms["fine_block_indices"], ms["coarse_block_indices"]
            fine_scores, coarse_scores = ms.pop("fine_block_scores"), ms.pop("coarse_block_scores")
            batch_size, num_blocks, dim = coarse.shape
            nf = fine_idx.shape[1]
            batch_indices = torch.arange(batch_size)[:, None]
            pf_scores = fine_scores[:, :, None].repeat(1, 1, bs).reshape(batch_size, nf * bs)
            difference = cache_select(ms["difference_cache"], fine_idx)
            pf_states = (coarse[batch_indices, fine_idx, :][:, :, None, :] - difference).reshape(batch_size, nf * bs, dim)
            pf_mask = ms["fine_token_mask"].reshape(batch_size, num_blocks, bs)[batch_indices, fine_idx, :]
            ms.update(partial_fine_token_states=pf_states, partial_fine_token_mask=pf_mask.reshape(batch_size, nf * bs),
                      partial_fine_token_scores=pf_scores, partial_fine_token_num_dups=torch.ones_like(pf_scores),
                      partial_coarse_token_states=coarse[batch_indices, coarse_idx, :],
                      partial_coarse_token_mask=coarse_mask[batch_indices, coarse_idx],
                      partial_coarse_token_scores=coarse_scores,
                      partial_coarse_token_num_dups=bs * torch.ones_like(coarse_scores))
        else:
            coarse = ms.pop("coarse_token_states")
            del ms["coarse_token_mask"]
            batch_size, num_blocks, dim = coarse.shape
            difference = cache_select(ms.pop("difference_cache"), torch.arange(num_blocks)[None, :].repeat(batch_size, 1))
            fine = (coarse[:, :, None, :] - difference).reshape(batch_size, num_blocks * bs, dim)
            ms["fine_token_states"] = fine * ms["fine_token_mask"][:, :, None]
        return ms


class Selector(nn.Module):
    def __init__(self, config, attention):
        super().__init__()
        self.num_fine_blocks = config.num_fine_blocks
        self.attention = attention

    def forward(self, ms):
        probs = self.attention(ms["important_token_states"], ms["coarse_token_states"], ms["coarse_token_mask"])
        probs = probs.mean(dim=1) * ms["importance_mask"][:, :, None].to(probs.dtype)
        average_prob_logits = torch.log(probs.mean(dim=1) + 1e-5)
        block_indices = torch.argsort(average_prob_logits, dim=1, descending=True)
        probs = torch.softmax(average_prob_logits, dim=-1)[torch.arange(block_indices.shape[0])[:, None], block_indices]
        ms["fine_block_indices"] = block_indices[:, :self.num_fine_blocks]
        ms["coarse_block_indices"] = block_indices[:, self.num_fine_blocks:]
        fine_block_scores = probs[:, :self.num_fine_blocks]
        coarse_block_scores = 1 - probs[:, self.num_fine_blocks:]
        ms["fine_block_scores"] = 1 + fine_block_scores - fine_block_scores.detach()
        ms["coarse_block_scores"] = 1 + coarse_block_scores - coarse_block_scores.detach()
        return ms


class Formatter(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.num_important_tokens, self.block_size = config.num_important_tokens, config.block_size
        self.coarser, self.finer = Coarser(config), Finer(config)

    def to_vcc_input(self, ms):
        hidden_states, mask, importance_mask = ms["hidden_states"], ms["mask"], ms["importance_mask"]
        cached = {"mask": mask, "importance_mask": importance_mask, "positions": ms["positions"]}
        hidden_states = hidden_states * mask[:, :, None]
        sorted_order = torch.sort(importance_mask, descending=True, stable=True).indices
        batch_indices = torch.arange(hidden_states.shape[0])[:, None]
        hidden_states = hidden_states[batch_indices, sorted_order, :]
        importance_mask, mask = importance_mask[batch_indices, sorted_order], mask[batch_indices, sorted_order]
        r = self.num_important_tokens
        return {"sorted_order": sorted_order, "important_token_states": hidden_states[:, :r, :],
                "important_token_mask": mask[:, :r], "importance_mask": importance_mask[:, :r],
                "fine_token_states": hidden_states[:, r:, :], "fine_token_mask": mask[:, r:], "extra_cached": cached}

    def from_vcc_input(self, ms):
        ms = self.finer(self.coarser(ms))
        hidden_states = torch.cat([ms["important_token_states"], ms["fine_token_states"]], dim=1)
        reverse_order = torch.argsort(ms["sorted_order"], dim=-1)
        hidden_states = hidden_states[torch.arange(hidden_states.shape[0])[:, None], reverse_order, :]
        return {"hidden_states": hidden_states, **ms["extra_cached"]}


class WeightedAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.scale_correction = config.scale_correction
        self.num_attention_heads = config.num_attention_heads
        self.attention_head_size = config.hidden_size // config.num_attention_heads
        self.all_head_size = config.hidden_size
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.query = nn.Linear(config.hidden_size, config.hidden_size)
        self.key = nn.Linear(config.hidden_size, config.hidden_size)
        self.value = nn.Linear(config.hidden_size, config.hidden_size)
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)

    def transpose_for_scores(self, x):
        return x.view(x.size()[:-1] + (self.num_attention_heads, self.attention_head_size)).permute(0, 2, 1, 3)

    def forward(self, hidden_states, attention_mask, state_scores, num_dups):
        hidden_states = self.LayerNorm(hidden_states)
        probs = self.compute_attention_matrix(hidden_states, hidden_states, attention_mask, state_scores, num_dups)
        context = torch.matmul(probs, self.transpose_for_scores(self.value(hidden_states)).double())
        context = context.to(hidden_states.dtype).permute(0, 2, 1, 3).contiguous()
        return self.dense(context.view(context.size()[:-2] + (self.all_head_size,)))

    def compute_attention_matrix(self, query_states, key_states, attention_mask, state_scores=None, num_dups=None):
        scale = math.sqrt(math.sqrt(self.attention_head_size))
        query_layer = self.transpose_for_scores(self.query(query_states)).double() / scale
        key_layer = self.transpose_for_scores(self.key(key_states)).double() / scale
        bias = -1000.0 * (1.0 - attention_mask[:, None, None, :].double())
        if state_scores is not None:
            bias = bias + torch.log(state_scores[:, None, None, :].double() + 1e-4)
        if num_dups is not None and self.scale_correction:
            bias = bias + torch.log(num_dups[:, None, None, :].double() + 1e-4)
        return torch.softmax(torch.matmul(query_layer, key_layer.transpose(-1, -2)) + bias, dim=-1)


class VccEncoderLayer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.attention = WeightedAttention(config)
        self.FFN = nn.Sequential(nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps),
                                 nn.Linear(config.hidden_size, config.intermediate_size), nn.GELU(),
                                 nn.Linear(config.intermediate_size, config.hidden_size))
        self.coarser, self.finer = Coarser(config), Finer(config)
        self.selector = Selector(config, attention=lambda Q, K, Kmask: self.attention.compute_attention_matrix(
            self.attention.LayerNorm(Q), self.attention.LayerNorm(K), Kmask))

    def encode(self, hidden_states, mask, state_scores, num_dups):
        attention_output = self.attention(hidden_states, mask, state_scores, num_dups)
        ffn_output = self.FFN(attention_output + hidden_states)
        return (ffn_output + attention_output) * state_scores[:, :, None].to(hidden_states.dtype) + hidden_states

    def forward(self, ms):
        ms = self.finer(self.selector(self.coarser(ms)))
        shape = ms["important_token_mask"].shape
        ones = torch.ones(shape, dtype=ms["partial_coarse_token_scores"].dtype)
        parts = ("partial_fine_token", "partial_coarse_token")
        hidden_states = torch.cat([ms[f"{p}_states"] for p in parts] + [ms["important_token_states"]], dim=1)
        mask = torch.cat([ms[f"{p}_mask"] for p in parts] + [ms["important_token_mask"]], dim=1)
        state_scores = torch.cat([ms[f"{p}_scores"] for p in parts] + [ones], dim=1)
        num_dups = torch.cat([ms[f"{p}_num_dups"] for p in parts] + [ones], dim=1)
        hidden_states = self.encode(hidden_states, mask, state_scores, num_dups)
        a = ms["partial_fine_token_states"].shape[1]
        c = a + ms["partial_coarse_token_states"].shape[1]
        ms["partial_fine_token_states"] = hidden_states[:, :a, :]
        ms["partial_coarse_token_states"] = hidden_states[:, a:c, :]
        ms["important_token_states"] = hidden_states[:, c:, :]
        return ms
