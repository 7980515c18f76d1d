"""PyTorch re-statements of the upstream modules that ``tests/test_interop_blocks_a.py`` checks
``refattn.interop.torch`` against (group ``blocks_a``): compact, written from each upstream file
(``owner/repo@commit path: Class`` above each), with upstream's parameter names and shapes.

Deviations common to all: dropout is omitted (eval mode); ``.float()`` / ``.type_as`` casts are
dropped so that float64 stays float64.
"""

import torch
import torch.nn.functional as F
from torch import nn


# microsoft/unilm@45d438e Diff-Transformer/diff/rms_norm.py: RMSNorm (x.float() cast dropped)
class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6, elementwise_affine=True):
        super().__init__()
        self.dim, self.eps, self.elementwise_affine = dim, eps, elementwise_affine
        if elementwise_affine:
            self.weight = nn.Parameter(torch.ones(dim))
        else:
            self.register_parameter("weight", None)

    def forward(self, x):
        out = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return out * self.weight if self.weight is not None else out


# jiachenzhu/DyT@aab5dde dynamic_tanh.py: DynamicTanh
class DynamicTanh(nn.Module):
    def __init__(self, normalized_shape, channels_last, alpha_init_value=0.5):
        super().__init__()
        self.normalized_shape, self.channels_last = normalized_shape, channels_last
        self.alpha = nn.Parameter(torch.ones(1) * alpha_init_value)
        self.weight = nn.Parameter(torch.ones(normalized_shape))
        self.bias = nn.Parameter(torch.zeros(normalized_shape))

    def forward(self, x):
        x = torch.tanh(self.alpha * x)
        if self.channels_last:
            return x * self.weight + self.bias
        return x * self.weight[:, None, None] + self.bias[:, None, None]


# Baran-phys/DynamicFormer@28139ba dra/activations.py: DRA
class DRA(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c, self.d = (nn.Parameter(torch.randn(1)) for _ in range(4))

    def forward(self, x):
        t1 = x + self.b * torch.sin(self.a * x) ** 2 / self.a
        return t1 + self.c * torch.cos(self.a * x) + self.d * torch.tanh(self.b * x)


# BryceZhuo/PolyCom@0ed8ad4 dense_model/megatron_patch/model/llama2/transformer.py: norm, polynorm, poly,
# PolyNorm, PolyReLU (torch.utils.checkpoint omitted: the same values and gradients)
def _poly_norm(x, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class PolyNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(3) / 3)
        self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, x):
        w = self.weight
        return w[0] * _poly_norm(x ** 3) + w[1] * _poly_norm(x ** 2) + w[2] * _poly_norm(x) + self.bias


class PolyReLU(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(3) / 3)
        self.bias = nn.Parameter(torch.zeros(1))

    def forward(self, x):
        x, w = F.relu(x), self.weight
        return w[0] * x ** 3 + w[1] * x ** 2 + w[2] * x + self.bias


# moboehle/B-cos@19c7ea4 modules/bcosconv2d.py: NormedConv2d, BcosConv2d (forward, fwd_b, fwd_2; no
# explanation mode)
class NormedConv2d(nn.Conv2d):
    def forward(self, x):
        w = self.weight.view(self.weight.shape[0], -1)
        w = w / w.norm(p=2, dim=1, keepdim=True)
        return F.conv2d(x, w.view(self.weight.shape), self.bias, self.stride, self.padding, self.dilation, self.groups)


class BcosConv2d(nn.Module):
    def __init__(self, inc, outc, kernel_size=1, stride=1, padding=0, max_out=2, b=2, scale=None, scale_fact=100):
        super().__init__()
        self.linear = NormedConv2d(inc, outc * max_out, kernel_size, stride, padding, 1, 1, bias=False)
        self.outc, self.b, self.max_out, self.inc = outc * max_out, b, max_out, inc
        self.kernel_size, self.stride, self.padding, self.kssq = kernel_size, stride, padding, kernel_size ** 2
        self.scale = kernel_size * self.inc ** 0.5 / scale_fact if scale is None else scale

    def _maxout_norm(self, x):
        out = self.linear(x)
        if self.max_out > 1:
            bs, _, h, w = out.shape
            out = out.view(bs, -1, self.max_out, h, w).max(dim=2, keepdim=False)[0]
        norm = (F.avg_pool2d((x ** 2).sum(1, keepdim=True), self.kernel_size, padding=self.padding,
                             stride=self.stride) * self.kssq + 1e-6).sqrt()
        return out, norm

    def forward(self, x):
        out, norm = self._maxout_norm(x)
        if self.b == 2:  # fwd_2
            return out * out.abs() / (norm * self.scale)
        if self.b == 1:
            return out / self.scale
        abs_cos = (out / norm).abs() + 1e-6  # fwd_b
        return out * abs_cos.pow(self.b - 1) / self.scale


# atomicarchitects/equiformer_v2@cf45ee2 nets/equiformer_v2/layer_norm.py: get_l_to_all_m_expand_index,
# EquivariantLayerNormArray, EquivariantLayerNormArraySphericalHarmonics,
# EquivariantRMSNormArraySphericalHarmonicsV2 (affine=True; autocast decorator dropped; the
# balance_degree_weight buffer is built in float64, not the default float32, so 1/3 is not rounded)
def _norm_sq(f, normalization, balance=None):
    if normalization == "norm":
        return f.pow(2).sum(dim=1, keepdim=True)
    if balance is not None:
        return torch.einsum("nic, ia -> nac", f.pow(2), balance)
    return f.pow(2).mean(dim=1, keepdim=True)


class EquivariantLayerNormArray(nn.Module):
    def __init__(self, lmax, num_channels, eps=1e-5, normalization="component"):
        super().__init__()
        self.lmax, self.num_channels, self.eps, self.normalization = lmax, num_channels, eps, normalization
        self.affine_weight = nn.Parameter(torch.ones(lmax + 1, num_channels))
        self.affine_bias = nn.Parameter(torch.zeros(num_channels))

    def forward(self, x):
        out = []
        for l in range(self.lmax + 1):  # noqa: E741 (upstream's name)
            f = x.narrow(1, l ** 2, 2 * l + 1)
            if l == 0:
                f = f - f.mean(dim=2, keepdim=True)
            r = (_norm_sq(f, self.normalization).mean(dim=2, keepdim=True) + self.eps).pow(-0.5)
            f = f * (r * self.affine_weight.narrow(0, l, 1).view(1, 1, -1))
            out.append(f + self.affine_bias.view(1, 1, -1) if l == 0 else f)
        return torch.cat(out, dim=1)


class EquivariantLayerNormArraySphericalHarmonics(nn.Module):
    def __init__(self, lmax, num_channels, eps=1e-5, normalization="component", std_balance_degrees=True):
        super().__init__()
        self.lmax, self.num_channels, self.eps, self.normalization = lmax, num_channels, eps, normalization
        self.std_balance_degrees = std_balance_degrees
        self.norm_l0 = nn.LayerNorm(num_channels, eps=eps)
        self.affine_weight = nn.Parameter(torch.ones(lmax, num_channels))
        if std_balance_degrees:
            w = torch.zeros((lmax + 1) ** 2 - 1, 1, dtype=torch.float64)
            for l in range(1, lmax + 1):  # noqa: E741
                w[l ** 2 - 1: l ** 2 - 1 + 2 * l + 1, :] = 1.0 / (2 * l + 1)
            self.register_buffer("balance_degree_weight", w / lmax)
        else:
            self.balance_degree_weight = None

    def forward(self, x):
        out = [self.norm_l0(x.narrow(1, 0, 1))]
        if self.lmax > 0:
            f = x.narrow(1, 1, (self.lmax + 1) ** 2 - 1)
            bal = self.balance_degree_weight if self.normalization == "component" else None
            r = (_norm_sq(f, self.normalization, bal).mean(dim=2, keepdim=True) + self.eps).pow(-0.5)
            for l in range(1, self.lmax + 1):  # noqa: E741
                out.append(x.narrow(1, l ** 2, 2 * l + 1) * (r * self.affine_weight.narrow(0, l - 1, 1).view(1, 1, -1)))
        return torch.cat(out, dim=1)


class EquivariantRMSNormArraySphericalHarmonicsV2(nn.Module):
    def __init__(self, lmax, num_channels, eps=1e-5, normalization="component", std_balance_degrees=True):
        super().__init__()
        self.lmax, self.num_channels, self.eps, self.normalization = lmax, num_channels, eps, normalization
        self.std_balance_degrees = std_balance_degrees
        self.affine_weight = nn.Parameter(torch.ones(lmax + 1, num_channels))
        self.affine_bias = nn.Parameter(torch.zeros(num_channels))  # centering=True
        self.register_buffer("expand_index", torch.tensor([l for l in range(lmax + 1) for _ in range(2 * l + 1)]))
        if std_balance_degrees:
            w = torch.zeros((lmax + 1) ** 2, 1, dtype=torch.float64)
            for l in range(lmax + 1):  # noqa: E741
                w[l ** 2: l ** 2 + 2 * l + 1, :] = 1.0 / (2 * l + 1)
            self.register_buffer("balance_degree_weight", w / (lmax + 1))
        else:
            self.balance_degree_weight = None

    def forward(self, x):
        f0 = x.narrow(1, 0, 1)
        f = torch.cat((f0 - f0.mean(dim=2, keepdim=True), x.narrow(1, 1, x.shape[1] - 1)), dim=1)
        bal = self.balance_degree_weight if self.normalization == "component" else None
        r = (_norm_sq(f, self.normalization, bal).mean(dim=2, keepdim=True) + self.eps).pow(-0.5)
        w = torch.index_select(self.affine_weight.view(1, self.lmax + 1, self.num_channels), 1, self.expand_index)
        out = f * (r * w)
        out[:, 0:1, :] = out.narrow(1, 0, 1) + self.affine_bias.view(1, 1, self.num_channels)
        return out


# microsoft/torchscale@4d1e0e8 torchscale/architecture/encoder.py: EncoderLayer (no MoE, no drop path, no
# multiway: MultiwayWrapper returns the module); component/multihead_attention.py: MultiheadAttention
# (self-attention, no xpos, no incremental state); component/feedforward_network.py: FeedForwardNetwork,
# get_activation_fn. Deviations: the softmax's dtype=torch.float32 and the activation's x.float() dropped.
# args: a namespace with torchscale's EncoderConfig field names.
def get_activation_fn(activation):
    return {"relu": F.relu, "gelu": F.gelu, "swish": F.silu}[activation]


class TorchscaleMultiheadAttention(nn.Module):
    def __init__(self, args, embed_dim, num_heads, subln=False):
        super().__init__()
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.head_dim = embed_dim // num_heads
        self.scaling = self.head_dim ** -0.5
        self.k_proj = nn.Linear(embed_dim, embed_dim, bias=True)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=True)
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=True)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=True)
        self.inner_attn_ln = nn.LayerNorm(embed_dim, eps=args.layernorm_eps) if subln else None

    def forward(self, query, key, value, key_padding_mask=None, attn_mask=None):
        bsz, tgt_len, embed_dim = query.size()
        src_len = key.size(1)
        q = self.q_proj(query) * self.scaling
        k, v = self.k_proj(key), self.v_proj(value)
        q = q.view(bsz, tgt_len, self.num_heads, self.head_dim).transpose(1, 2).reshape(-1, tgt_len, self.head_dim)
        k = k.view(bsz, src_len, self.num_heads, self.head_dim).transpose(1, 2).reshape(-1, src_len, self.head_dim)
        v = v.view(bsz, src_len, self.num_heads, self.head_dim).transpose(1, 2).reshape(-1, src_len, self.head_dim)
        w = torch.bmm(q, k.transpose(1, 2))
        if attn_mask is not None:
            w = torch.nan_to_num(w) + attn_mask.unsqueeze(0)
        w = F.softmax(w, dim=-1)
        attn = torch.bmm(w, v).transpose(0, 1).reshape(tgt_len, bsz, embed_dim).transpose(0, 1)
        if self.inner_attn_ln is not None:
            attn = self.inner_attn_ln(attn)
        return self.out_proj(attn), w.view(bsz, self.num_heads, tgt_len, src_len).transpose(1, 0)


class FeedForwardNetwork(nn.Module):
    def __init__(self, embed_dim, ffn_dim, activation_fn, layernorm_eps, subln=False):
        super().__init__()
        self.activation_fn = get_activation_fn(str(activation_fn))
        self.fc1, self.fc2 = nn.Linear(embed_dim, ffn_dim), nn.Linear(ffn_dim, embed_dim)
        self.ffn_layernorm = nn.LayerNorm(ffn_dim, eps=layernorm_eps) if subln else None

    def forward(self, x):
        shape = x.shape
        x = self.activation_fn(self.fc1(x.reshape(-1, x.size(-1))))
        if self.ffn_layernorm is not None:
            x = self.ffn_layernorm(x)
        return self.fc2(x).view(shape)


class EncoderLayer(nn.Module):
    def __init__(self, args, depth=0):
        super().__init__()
        self.embed_dim = args.encoder_embed_dim
        self.self_attn = TorchscaleMultiheadAttention(args, self.embed_dim, args.encoder_attention_heads,
                                                      subln=args.subln)
        self.self_attn_layer_norm = nn.LayerNorm(self.embed_dim, eps=args.layernorm_eps)
        self.normalize_before = args.encoder_normalize_before
        self.ffn = FeedForwardNetwork(self.embed_dim, args.encoder_ffn_embed_dim, args.activation_fn,
                                      args.layernorm_eps, args.subln)
        self.final_layer_norm = nn.LayerNorm(self.embed_dim, eps=args.layernorm_eps)
        self.alpha = 1.0  # deepnorm=False

    def forward(self, x, encoder_padding_mask, attn_mask=None):
        if attn_mask is not None:
            attn_mask = attn_mask.masked_fill(attn_mask.to(torch.bool), -1e8)
        residual = x
        if self.normalize_before:
            x = self.self_attn_layer_norm(x)
        x, _ = self.self_attn(x, x, x, key_padding_mask=encoder_padding_mask, attn_mask=attn_mask)
        x = residual * self.alpha + x
        if not self.normalize_before:
            x = self.self_attn_layer_norm(x)
        residual = x
        if self.normalize_before:
            x = self.final_layer_norm(x)
        x = residual * self.alpha + self.ffn(x)
        if not self.normalize_before:
            x = self.final_layer_norm(x)
        return x, None


# facebookresearch/deit@7e160fe models_v2.py: Attention (timm's); cait_models.py: LayerScale_Block with
# Attention_block=Attention; timm layers/mlp.py: Mlp (fc1, act, fc2). Dropout and drop path omitted.
class Attention(nn.Module):
    def __init__(self, dim, num_heads=8, qkv_bias=False, qk_scale=None):
        super().__init__()
        self.num_heads = num_heads
        self.scale = qk_scale or (dim // num_heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        attn = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(B, N, C))


class Mlp(nn.Module):
    def __init__(self, in_features, hidden_features=None, out_features=None, act_layer=nn.GELU):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features or in_features)
        self.act = act_layer()
        self.fc2 = nn.Linear(hidden_features or in_features, out_features or in_features)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class LayerScale_Block(nn.Module):
    def __init__(self, dim, num_heads, mlp_ratio=4., qkv_bias=False, qk_scale=None, act_layer=nn.GELU,
                 norm_layer=nn.LayerNorm, Attention_block=Attention, Mlp_block=Mlp, init_values=1e-4):
        super().__init__()
        self.norm1 = norm_layer(dim)
        self.attn = Attention_block(dim, num_heads=num_heads, qkv_bias=qkv_bias, qk_scale=qk_scale)
        self.norm2 = norm_layer(dim)
        self.mlp = Mlp_block(in_features=dim, hidden_features=int(dim * mlp_ratio), act_layer=act_layer)
        self.gamma_1 = nn.Parameter(init_values * torch.ones(dim))
        self.gamma_2 = nn.Parameter(init_values * torch.ones(dim))

    def forward(self, x):
        x = x + self.gamma_1 * self.attn(self.norm1(x))
        return x + self.gamma_2 * self.mlp(self.norm2(x))


# zhuohan123/macaron-net@3a84e7a translation/fairseq/modules/multihead_attention.py: MultiheadAttention (self-
# attention path, no incremental state, no bias_k/v; q *= scaling made out-of-place; the softmax's
# attn_weights.float() cast dropped); translation/fairseq/models/transformer.py: TransformerEncoderLayer with
# args.macaron, maybe_layer_norm, LayerNorm/Linear helpers (dropout omitted). Input (T, B, C).
class FairseqMultiheadAttention(nn.Module):
    def __init__(self, embed_dim, num_heads, bias=True):
        super().__init__()
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.head_dim = embed_dim // num_heads
        self.scaling = self.head_dim ** -0.5
        self.in_proj_weight = nn.Parameter(torch.empty(3 * embed_dim, embed_dim))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * embed_dim)) if bias else None
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        nn.init.xavier_uniform_(self.in_proj_weight)

    def forward(self, query, key, value, key_padding_mask=None):
        tgt_len, bsz, embed_dim = query.size()
        q, k, v = F.linear(query, self.in_proj_weight, self.in_proj_bias).chunk(3, dim=-1)
        q = q * self.scaling
        q = q.contiguous().view(tgt_len, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        k = k.contiguous().view(-1, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        v = v.contiguous().view(-1, bsz * self.num_heads, self.head_dim).transpose(0, 1)
        w = F.softmax(torch.bmm(q, k.transpose(1, 2)), dim=-1)
        attn = torch.bmm(w, v).transpose(0, 1).contiguous().view(tgt_len, bsz, embed_dim)
        return self.out_proj(attn), w


class MacaronEncoderLayer(nn.Module):  # upstream's TransformerEncoderLayer
    def __init__(self, args):
        super().__init__()
        self.embed_dim = args.encoder_embed_dim
        self.self_attn = FairseqMultiheadAttention(self.embed_dim, args.encoder_attention_heads)
        self.normalize_before = args.encoder_normalize_before
        self.fc1 = nn.Linear(self.embed_dim, args.encoder_ffn_embed_dim)
        self.fc2 = nn.Linear(args.encoder_ffn_embed_dim, self.embed_dim)
        n_layernorm, self.fc_factor = 2, 1.0
        self.macaron = getattr(args, "macaron", False)
        if self.macaron:
            self.macaron_fc1 = nn.Linear(self.embed_dim, args.encoder_ffn_embed_dim)
            self.macaron_fc2 = nn.Linear(args.encoder_ffn_embed_dim, self.embed_dim)
            self.fc_factor = 0.5
            n_layernorm += 1
        self.layer_norms = nn.ModuleList([nn.LayerNorm(self.embed_dim) for _ in range(n_layernorm)])

    def forward(self, x, encoder_padding_mask):
        if self.macaron:
            residual = x
            x = self.maybe_layer_norm(2, x, before=True)
            x = residual + self.fc_factor * self.macaron_fc2(F.relu(self.macaron_fc1(x)))
            x = self.maybe_layer_norm(2, x, after=True)
        residual = x
        x = self.maybe_layer_norm(0, x, before=True)
        x, _ = self.self_attn(query=x, key=x, value=x, key_padding_mask=encoder_padding_mask)
        x = self.maybe_layer_norm(0, residual + x, after=True)
        residual = x
        x = self.maybe_layer_norm(1, x, before=True)
        x = residual + self.fc_factor * self.fc2(F.relu(self.fc1(x)))
        return self.maybe_layer_norm(1, x, after=True)

    def maybe_layer_norm(self, i, x, before=False, after=False):
        return self.layer_norms[i](x) if after ^ self.normalize_before else x


# huggingface/transformers@00b676f src/transformers/models/gptj/modeling_gptj.py: create_sinusoidal_positions,
# rotate_every_two, apply_rotary_pos_emb, GPTJAttention (eager, no cache, no head mask), GPTJMLP, GPTJBlock;
# activations.py NewGELUActivation (gelu_new). Deviations (float64 stays float64): the sin/cos table is built
# in float64 (upstream .float()), scale_attn = sqrt(head_dim) in float64 (upstream float32), and _attn's
# query/key .to(torch.float32) is dropped. config: a namespace with GPTJConfig's field names.
def create_sinusoidal_positions(num_pos, dim):
    inv_freq = 1.0 / (10000 ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    sinusoid_inp = torch.einsum("i , j -> i j", torch.arange(num_pos, dtype=torch.float64), inv_freq)
    return torch.cat((torch.sin(sinusoid_inp), torch.cos(sinusoid_inp)), dim=1)


def rotate_every_two(x):
    return torch.stack((-x[:, :, :, 1::2], x[:, :, :, ::2]), dim=-1).flatten(-2)


def apply_rotary_pos_emb(tensor, sin, cos):
    sin = torch.repeat_interleave(sin[:, :, None, :], 2, 3)
    cos = torch.repeat_interleave(cos[:, :, None, :], 2, 3)
    return tensor * cos + rotate_every_two(tensor) * sin


def gelu_new(x):
    return 0.5 * x * (1.0 + torch.tanh((2.0 / torch.pi) ** 0.5 * (x + 0.044715 * torch.pow(x, 3.0))))


class GPTJAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.embed_dim, self.num_attention_heads = config.hidden_size, config.num_attention_heads
        self.head_dim = self.embed_dim // self.num_attention_heads
        self.scale_attn = torch.sqrt(torch.tensor(self.head_dim, dtype=torch.float64))
        self.k_proj = nn.Linear(self.embed_dim, self.embed_dim, bias=False)
        self.v_proj = nn.Linear(self.embed_dim, self.embed_dim, bias=False)
        self.q_proj = nn.Linear(self.embed_dim, self.embed_dim, bias=False)
        self.out_proj = nn.Linear(self.embed_dim, self.embed_dim, bias=False)
        self.rotary_dim = config.rotary_dim
        self.embed_positions = create_sinusoidal_positions(config.max_position_embeddings,
                                                           self.rotary_dim or self.embed_dim)

    def forward(self, hidden_states, attention_mask=None, position_ids=None):
        b, n, _ = hidden_states.shape
        shape = (b, n, self.num_attention_heads, self.head_dim)
        query, key = self.q_proj(hidden_states).view(shape), self.k_proj(hidden_states).view(shape)
        value = self.v_proj(hidden_states).view(shape).permute(0, 2, 1, 3)
        embed_positions = self.embed_positions.repeat(position_ids.shape[0], 1, 1)
        sincos = torch.gather(embed_positions, 1, position_ids.unsqueeze(-1).repeat(1, 1, embed_positions.shape[-1]))
        sin, cos = torch.split(sincos, sincos.shape[-1] // 2, dim=-1)
        if self.rotary_dim is not None:
            r = self.rotary_dim
            key = torch.cat([apply_rotary_pos_emb(key[..., :r], sin, cos), key[..., r:]], dim=-1)
            query = torch.cat([apply_rotary_pos_emb(query[..., :r], sin, cos), query[..., r:]], dim=-1)
        else:
            key, query = apply_rotary_pos_emb(key, sin, cos), apply_rotary_pos_emb(query, sin, cos)
        key, query = key.permute(0, 2, 1, 3), query.permute(0, 2, 1, 3)
        w = torch.matmul(query, key.transpose(-1, -2)) / self.scale_attn
        if attention_mask is not None:
            w = w + attention_mask[:, :, :, : key.shape[-2]]
        out = torch.matmul(nn.functional.softmax(w, dim=-1), value)
        out = out.permute(0, 2, 1, 3).contiguous().view(b, n, self.embed_dim)
        return self.out_proj(out), w


class GPTJMLP(nn.Module):
    def __init__(self, intermediate_size, config):
        super().__init__()
        self.fc_in = nn.Linear(config.n_embd, intermediate_size)
        self.fc_out = nn.Linear(intermediate_size, config.n_embd)
        self.act = gelu_new  # ACT2FN["gelu_new"]

    def forward(self, hidden_states):
        return self.fc_out(self.act(self.fc_in(hidden_states)))


class GPTJBlock(nn.Module):
    def __init__(self, config):
        super().__init__()
        inner_dim = config.n_inner if config.n_inner is not None else 4 * config.n_embd
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.attn = GPTJAttention(config)
        self.mlp = GPTJMLP(inner_dim, config)

    def forward(self, hidden_states, attention_mask=None, position_ids=None):
        residual = hidden_states
        hidden_states = self.ln_1(hidden_states)
        attn_outputs, attn_weights = self.attn(hidden_states, attention_mask=attention_mask, position_ids=position_ids)
        return attn_outputs + self.mlp(hidden_states) + residual, attn_weights


# NVIDIA/ngpt@ed19eb2 model.py: apply_rotary_position_embeddings, get_sinusoidal_embeddings, Block (use_nGPT=1;
# GPTConfig field names). Deviations: the bfloat16 dtype of the Linears and casts removed, flash_attn_func
# (causal, softmax_scale) replaced by torch's scaled_dot_product_attention, the sinusoidal table built in float64.
def apply_rotary_position_embeddings(sinusoidal_pos, q, k):
    sin, cos = sinusoidal_pos.chunk(2, dim=-1)
    q_rot = torch.stack((-q[..., 1::2], q[..., ::2]), dim=-1)
    k_rot = torch.stack((-k[..., 1::2], k[..., ::2]), dim=-1)
    q_rot = torch.reshape(q_rot, q.shape[:-1] + (q.shape[-1] // 2, 2)) * torch.stack((cos, sin), dim=-1)
    k_rot = torch.reshape(k_rot, k.shape[:-1] + (k.shape[-1] // 2, 2)) * torch.stack((cos, sin), dim=-1)
    return torch.reshape(q_rot, q.shape), torch.reshape(k_rot, k.shape)


def get_sinusoidal_embeddings(n_positions, dim):
    position = torch.arange(n_positions, dtype=torch.float64).unsqueeze(1)
    div_term = torch.exp(torch.arange(0, dim, 2, dtype=torch.float64) * (-torch.log(torch.tensor(10000.0,
                                                                                                  dtype=torch.float64)) / dim))
    emb = torch.zeros((n_positions, dim), dtype=torch.float64)
    emb[:, 0::2] = torch.sin(position * div_term)
    emb[:, 1::2] = torch.cos(position * div_term)
    return emb


class NGPTBlock(nn.Module):  # upstream's Block with config.use_nGPT == 1
    def __init__(self, config):
        super().__init__()
        self.config = config
        c = config.n_embd
        self.key, self.query, self.value, self.att_c_proj = (nn.Linear(c, c, bias=config.bias) for _ in range(4))
        self.c_fc = nn.Linear(c, 2 * 4 * c, bias=config.bias)
        self.silu = nn.SiLU()
        self.mlp_c_proj = nn.Linear(4 * c, c, bias=config.bias)
        self.attn_alpha_init_value, self.attn_alpha_init_scaling = 0.05, config.base_scale
        self.attn_alpha = nn.Parameter(self.attn_alpha_init_scaling * torch.ones(c))
        self.mlp_alpha_init_value, self.mlp_alpha_init_scaling = 0.05, config.base_scale
        self.mlp_alpha = nn.Parameter(self.mlp_alpha_init_scaling * torch.ones(c))
        self.sqk_init_value, self.sqk_init_scaling = 1.0, config.base_scale
        self.sqk = nn.Parameter(self.sqk_init_scaling * torch.ones(c))
        self.suv_init_value, self.suv_init_scaling = 1.0, 1.0
        self.suv = nn.Parameter(self.suv_init_scaling * torch.ones(2 * 4 * c))

    def justnorm(self, x):
        return x / x.norm(p=2, dim=-1, keepdim=True)

    def forward(self, h):
        B, T, C = h.size()
        nh, hd = self.config.n_head, self.config.n_embd // self.config.n_head
        q, k, v = (f(h).view(B, T, nh, hd) for f in (self.query, self.key, self.value))
        q, k = apply_rotary_position_embeddings(get_sinusoidal_embeddings(T, hd), q.transpose(1, 2), k.transpose(1, 2))
        q, k = q.transpose(2, 1), k.transpose(2, 1)
        sqk = (self.sqk * (self.sqk_init_value / self.sqk_init_scaling)).view(1, 1, nh, hd)
        q, k = sqk * self.justnorm(q), sqk * self.justnorm(k)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True,
                                           scale=(self.config.n_embd / nh) ** 0.5).transpose(1, 2)
        h_att = self.att_c_proj(y.contiguous().view(B, T, C))
        lr = torch.abs(self.attn_alpha * (self.attn_alpha_init_value / self.attn_alpha_init_scaling))
        A_norm, B_norm = self.justnorm(h), self.justnorm(h_att)
        h = self.justnorm(A_norm + lr * (B_norm - A_norm))
        uv = self.c_fc(h) * (self.suv * ((self.suv_init_value / self.suv_init_scaling) * (self.config.n_embd ** 0.5)))
        u, v = torch.chunk(uv, 2, dim=-1)
        h_mlp = self.mlp_c_proj(u * self.silu(v))
        lr = torch.abs(self.mlp_alpha * (self.mlp_alpha_init_value / self.mlp_alpha_init_scaling))
        A_norm, B_norm = self.justnorm(h), self.justnorm(h_mlp)
        return self.justnorm(A_norm + lr * (B_norm - A_norm))


# bobby-he/simplified_transformers@8d4ea79 simplified_transformers/model_utils.py: myGPT2Block, myGPT2Attention
# (no cache, no head mask; qk_norm_type / dot_norm_type "none"), myGPT2MLP, MyConv1D, LeakyReLU. Deviations:
# MyConv1D's id matrix is built on the CPU (upstream .cuda()); the uniform_causal_attn_mat buffer in float64.
# config: a namespace with the upstream config field names.
class MyConv1D(nn.Module):
    def __init__(self, nf, nx, resid_gain=None, skip_gain=None, trainable_gains=False, init_type="normal", bias=True):
        super().__init__()
        self.nf = nf
        self.bias = nn.Parameter(torch.zeros(nf), requires_grad=bias)
        self.skip = skip_gain is not None
        if not self.skip:
            self.weight = nn.Parameter(torch.empty(nx, nf))
            nn.init.normal_(self.weight, std=0.02)
        else:
            self.resid_gain = nn.Parameter(torch.Tensor([resid_gain]), requires_grad=trainable_gains)
            self.skip_gain = nn.Parameter(torch.Tensor([skip_gain]), requires_grad=trainable_gains)
            self.weight = nn.Parameter(torch.zeros(nx, nx))
            self.id = torch.eye(nx)  # init_type "id"
            self.init_type = init_type

    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        if self.skip:
            if self.resid_gain == 0 and self.init_type == "id":
                return torch.add(self.bias, x * self.skip_gain).view(size_out)
            w = self.resid_gain * self.weight + self.skip_gain * self.id.to(x.dtype)
            return torch.addmm(self.bias, x.view(-1, x.size(-1)), w).view(size_out)
        return torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight).view(size_out)


class myGPT2Attention(nn.Module):
    def __init__(self, config, layer_idx=None):
        super().__init__()
        mp = config.max_position_embeddings
        self.embed_dim, self.num_heads = config.hidden_size, config.num_attention_heads
        self.head_dim = self.embed_dim // self.num_heads
        self.qk_attn = MyConv1D(2 * self.embed_dim, self.embed_dim)
        vr = config.first_layer_value_resid_gain if layer_idx == 0 else config.value_resid_gain
        self.v_attn = (MyConv1D(self.embed_dim, self.embed_dim, resid_gain=vr, skip_gain=config.value_skip_gain,
                                trainable_gains=config.trainable_value_gains, init_type="id", bias=False)
                       if config.value_skip_gain != 1 or vr != 0 else nn.Identity())
        self.c_proj = nn.Identity()  # proj_skip_gain 1, proj_resid_gain 0, proj_init_type "id"
        self.qk_attn.weight.data.split(self.embed_dim, dim=1)[0].normal_(mean=0.0, std=config.query_init_std)
        g = config.trainable_attn_mat_gains
        self.attn_mat_resid_gain = nn.Parameter(config.attn_mat_resid_gain * torch.ones((1, self.num_heads, 1, 1)),
                                                requires_grad=g)
        self.attn_mat_skip_gain = nn.Parameter(config.attn_mat_skip_gain * torch.ones((1, self.num_heads, 1, 1)),
                                               requires_grad=g)
        self.centre_attn = config.centre_attn
        u = torch.ones((mp, mp), dtype=torch.float64) / torch.arange(1, mp + 1).view(-1, 1)
        self.register_buffer("uniform_causal_attn_mat", torch.tril(u).view(1, 1, mp, mp), persistent=False)
        self.centre_attn_gain = nn.Parameter(config.centre_attn_gain * torch.ones((1, self.num_heads, 1, 1)),
                                             requires_grad=g and config.centre_attn_gain != 0)
        self.register_buffer("diag", torch.eye(mp).view(1, 1, mp, mp), persistent=False)
        self.register_buffer("bias", torch.tril(torch.ones((mp, mp), dtype=torch.bool)).view(1, 1, mp, mp),
                             persistent=False)

    def _attn(self, query, key, value):
        w = torch.matmul(query, key.transpose(-1, -2)) / value.size(-1) ** 0.5
        q_len, k_len = query.size(-2), key.size(-2)
        w = torch.where(self.bias[:, :, k_len - q_len: k_len, :k_len], w, torch.finfo(w.dtype).min)
        w = self.attn_mat_resid_gain * nn.functional.softmax(w, dim=-1)
        if self.centre_attn:
            w = w + (self.attn_mat_skip_gain * self.diag[:, :, :k_len, :k_len]
                     - self.centre_attn_gain * self.uniform_causal_attn_mat[:, :, k_len - q_len: k_len, :k_len])
        return torch.matmul(w, value)

    def forward(self, hidden_states):
        query, key = self.qk_attn(hidden_states).split(self.embed_dim, dim=2)
        value = self.v_attn(hidden_states)
        b, n, _ = hidden_states.shape
        q, k, v = (t.view(b, n, self.num_heads, self.head_dim).permute(0, 2, 1, 3) for t in (query, key, value))
        out = self._attn(q, k, v).permute(0, 2, 1, 3).contiguous().view(b, n, self.embed_dim)
        return self.c_proj(out), None


class myGPT2MLP(nn.Module):
    def __init__(self, intermediate_size, config):
        super().__init__()
        self.c_fc = MyConv1D(intermediate_size, config.hidden_size, bias=False)
        self.c_proj = MyConv1D(config.hidden_size, intermediate_size, bias=False)
        self.negative_slope = config.lrelu_neg_slope  # LeakyReLU

    def forward(self, h):
        h = self.c_fc(h)
        return self.c_proj(torch.where(h >= 0.0, h, h * self.negative_slope))


class myGPT2Block(nn.Module):
    def __init__(self, config, layer_idx=None):
        super().__init__()
        hidden_size = config.hidden_size
        inner_dim = config.n_inner if config.n_inner is not None else 4 * hidden_size
        self.parallel_layers, self.layer_idx = config.parallel_layers, layer_idx
        self.ln_1 = nn.Identity() if layer_idx > 0 else nn.LayerNorm(hidden_size, eps=config.layer_norm_epsilon)
        self.ln_2 = nn.Identity()  # norm_type "none"
        self.norm_position = config.norm_position
        self.attn = myGPT2Attention(config, layer_idx=layer_idx)
        self.mlp = myGPT2MLP(inner_dim, config)
        ta, tm = config.trainable_attn_block_gains, config.trainable_mlp_block_gains
        self.attn_block_resid_gain = nn.Parameter(torch.Tensor([config.attn_block_resid_gain]), requires_grad=ta)
        self.attn_block_skip_gain = nn.Parameter(torch.Tensor([config.attn_block_skip_gain]),
                                                 requires_grad=ta and not self.parallel_layers)
        self.mlp_block_resid_gain = nn.Parameter(torch.Tensor([config.mlp_block_resid_gain]), requires_grad=tm)
        self.mlp_block_skip_gain = nn.Parameter(torch.Tensor([config.mlp_block_skip_gain]),
                                                requires_grad=tm and not self.parallel_layers)
        self.add_mlp_skip = config.mlp_block_skip_gain != 0

    def forward(self, hidden_states):
        skip_branch = hidden_states
        hidden_states = self.ln_1(hidden_states)
        attn_output = self.attn(hidden_states)[0]
        out = self.mlp_block_resid_gain * self.mlp(hidden_states) + self.attn_block_resid_gain * attn_output
        if self.add_mlp_skip:
            out = out + self.mlp_block_skip_gain * skip_branch
        return (out,)


# huawei-noah/CV-Backbones@25531f7 tnt_pytorch/tnt.py: Attention, Block (se=0; timm's Mlp as in layerscale above).
# Dropout and drop path omitted.
class TNTAttention(nn.Module):  # upstream's Attention
    def __init__(self, dim, hidden_dim, num_heads=8, qkv_bias=False, qk_scale=None):
        super().__init__()
        self.hidden_dim, self.num_heads = hidden_dim, num_heads
        self.head_dim = hidden_dim // num_heads
        self.scale = qk_scale or self.head_dim ** -0.5
        self.qk = nn.Linear(dim, hidden_dim * 2, bias=qkv_bias)
        self.v = nn.Linear(dim, dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        q, k = self.qk(x).reshape(B, N, 2, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        v = self.v(x).reshape(B, N, self.num_heads, -1).permute(0, 2, 1, 3)
        attn = ((q @ k.transpose(-2, -1)) * self.scale).softmax(dim=-1)
        return self.proj((attn @ v).transpose(1, 2).reshape(B, N, -1))


class TNTBlock(nn.Module):  # upstream's Block
    def __init__(self, outer_dim, inner_dim, outer_num_heads, inner_num_heads, num_words, mlp_ratio=4.,
                 qkv_bias=False, qk_scale=None, act_layer=nn.GELU, norm_layer=nn.LayerNorm):
        super().__init__()
        self.inner_norm1 = norm_layer(inner_dim)
        self.inner_attn = TNTAttention(inner_dim, inner_dim, num_heads=inner_num_heads, qkv_bias=qkv_bias,
                                       qk_scale=qk_scale)
        self.inner_norm2 = norm_layer(inner_dim)
        self.inner_mlp = Mlp(inner_dim, int(inner_dim * mlp_ratio), inner_dim, act_layer=act_layer)
        self.proj_norm1 = norm_layer(num_words * inner_dim)
        self.proj = nn.Linear(num_words * inner_dim, outer_dim, bias=False)
        self.proj_norm2 = norm_layer(outer_dim)
        self.outer_norm1 = norm_layer(outer_dim)
        self.outer_attn = TNTAttention(outer_dim, outer_dim, num_heads=outer_num_heads, qkv_bias=qkv_bias,
                                       qk_scale=qk_scale)
        self.outer_norm2 = norm_layer(outer_dim)
        self.outer_mlp = Mlp(outer_dim, int(outer_dim * mlp_ratio), outer_dim, act_layer=act_layer)

    def forward(self, inner_tokens, outer_tokens):
        inner_tokens = inner_tokens + self.inner_attn(self.inner_norm1(inner_tokens))
        inner_tokens = inner_tokens + self.inner_mlp(self.inner_norm2(inner_tokens))
        B, N, C = outer_tokens.size()
        outer_tokens[:, 1:] = outer_tokens[:, 1:] + self.proj_norm2(self.proj(self.proj_norm1(
            inner_tokens.reshape(B, N - 1, -1))))
        outer_tokens = outer_tokens + self.outer_attn(self.outer_norm1(outer_tokens))
        outer_tokens = outer_tokens + self.outer_mlp(self.outer_norm2(outer_tokens))
        return inner_tokens, outer_tokens


# Leiay/looped_transformer@6b3bdb2 scripts/nano_gpt.py: new_gelu, LayerNorm, CausalSelfAttention (the flash path:
# torch's SDPA, is_causal), MLP, Block, GPT2Config, GPT2Model (forward(inputs_embeds) with learned positions);
# scripts/models.py: TransformerModel.__init__ (regression), TransformerModelLooped (f, forward). Dropout 0.
class NanoLayerNorm(nn.Module):
    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, 1e-5)


class NanoCausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=config.bias)
        self.n_head, self.n_embd = config.n_head, config.n_embd

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
                   for t in self.c_attn(x).split(self.n_embd, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=None, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class NanoMLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=config.bias)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=config.bias)

    def forward(self, x):
        return self.c_proj(gelu_new(self.c_fc(x)))  # nano_gpt's new_gelu is gelu_new


class NanoBlock(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1, self.attn = NanoLayerNorm(config.n_embd, config.bias), NanoCausalSelfAttention(config)
        self.ln_2, self.mlp = NanoLayerNorm(config.n_embd, config.bias), NanoMLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT2Model(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wpe=nn.Embedding(config.block_size, config.n_embd),
            h=nn.ModuleList([NanoBlock(config) for _ in range(config.n_layer)]),
            ln_f=NanoLayerNorm(config.n_embd, config.bias)))

    def forward(self, inputs_embeds):
        t = inputs_embeds.size(1)
        x = inputs_embeds + self.transformer.wpe(torch.arange(0, t, dtype=torch.long).unsqueeze(0))
        for block in self.transformer.h:
            x = block(x)
        return self.transformer.ln_f(x)


class TransformerModelLooped(nn.Module):
    def __init__(self, n_dims, n_positions, n_embd=128, n_layer=12, n_head=4, loop_func="z=f(x+z)"):
        super().__init__()
        from types import SimpleNamespace

        self.freq, self.ind = 2, 0
        config = SimpleNamespace(block_size=self.freq * n_positions + 1, n_layer=n_layer, n_head=n_head,
                                 n_embd=n_embd, dropout=0.0, bias=True)
        self._read_in = nn.Linear(n_dims, n_embd)
        self._backbone = GPT2Model(config)
        self._read_out = nn.Linear(n_embd, 1)
        self.loop_func = loop_func

    def f(self, output, embeds):
        if self.loop_func == "z=f(x+z)":
            return self._backbone(inputs_embeds=output + embeds)
        return self._backbone(inputs_embeds=output * embeds)  # "z=f(x*z)"


# huggingface/transformers@00d4b3d src/transformers/models/mixtral/modeling_mixtral.py: MixtralBlockSparseTop2MLP,
# MixtralSparseMoeBlock (eval: no jitter noise). Deviation: the softmax's dtype=torch.float dropped.
# config: a namespace with MixtralConfig's field names.
class MixtralBlockSparseTop2MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ffn_dim, self.hidden_dim = config.intermediate_size, config.hidden_size
        self.w1 = nn.Linear(self.hidden_dim, self.ffn_dim, bias=False)
        self.w2 = nn.Linear(self.ffn_dim, self.hidden_dim, bias=False)
        self.w3 = nn.Linear(self.hidden_dim, self.ffn_dim, bias=False)
        self.act_fn = nn.SiLU()

    def forward(self, hidden_states):
        return self.w2(self.act_fn(self.w1(hidden_states)) * self.w3(hidden_states))


class MixtralSparseMoeBlock(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.hidden_dim, self.ffn_dim = config.hidden_size, config.intermediate_size
        self.num_experts, self.top_k = config.num_local_experts, config.num_experts_per_tok
        self.gate = nn.Linear(self.hidden_dim, self.num_experts, bias=False)
        self.experts = nn.ModuleList([MixtralBlockSparseTop2MLP(config) for _ in range(self.num_experts)])

    def forward(self, hidden_states):
        batch_size, sequence_length, hidden_dim = hidden_states.shape
        hidden_states = hidden_states.view(-1, hidden_dim)
        router_logits = self.gate(hidden_states)
        routing_weights = F.softmax(router_logits, dim=1)
        routing_weights, selected_experts = torch.topk(routing_weights, self.top_k, dim=-1)
        routing_weights = routing_weights / routing_weights.sum(dim=-1, keepdim=True)
        final = torch.zeros((batch_size * sequence_length, hidden_dim), dtype=hidden_states.dtype)
        expert_mask = F.one_hot(selected_experts, num_classes=self.num_experts).permute(2, 1, 0)
        for expert_idx in torch.greater(expert_mask.sum(dim=(-1, -2)), 0).nonzero():
            idx, top_x = torch.where(expert_mask[expert_idx].squeeze(0))
            current = self.experts[expert_idx](hidden_states[None, top_x].reshape(-1, hidden_dim))
            final.index_add_(0, top_x, current * routing_weights[top_x, idx, None])
        return final.reshape(batch_size, sequence_length, hidden_dim), router_logits


# SkyworkAI/MoH@66bb340 MoH-DiT/models.py: MoHAttention (timm's use_fused_attn False path, q_norm/k_norm
# Identity, no dropout; the training-mode l_aux bookkeeping omitted: it does not change the output).
class MoHAttention(nn.Module):
    def __init__(self, dim, num_heads=8, qkv_bias=False, shared_head=0, routed_head=0, head_dim=None):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads if head_dim is None else head_dim
        self.scale = self.head_dim ** -0.5
        self.qkv = nn.Linear(dim, self.head_dim * self.num_heads * 3, bias=qkv_bias)
        self.proj = nn.Linear(self.head_dim * self.num_heads, dim)
        self.shared_head, self.routed_head = shared_head, routed_head
        if self.routed_head > 0:
            self.wg = nn.Linear(dim, num_heads - shared_head, bias=False)
            if self.shared_head > 0:
                self.wg_0 = nn.Linear(dim, 2, bias=False)
        if self.shared_head > 1:
            self.wg_1 = nn.Linear(dim, shared_head, bias=False)

    def forward(self, x):
        B, N, C = x.shape
        _x = x.reshape(B * N, C)
        if self.routed_head > 0:
            gates = F.softmax(self.wg(_x), dim=1)
            _, indices = torch.topk(gates, k=self.routed_head, dim=1)
            mask = F.one_hot(indices, num_classes=gates.shape[1]).sum(dim=1)
            routed = gates * mask
            denom = torch.clamp(torch.sum(routed, dim=1, keepdim=True), min=torch.finfo(routed.dtype).eps)
            routed = (routed / denom).reshape(B, N, -1) * self.routed_head
        q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        x = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1) @ v
        x = x.transpose(1, 2)
        if self.routed_head > 0:
            if self.shared_head > 0:
                shared = F.softmax(self.wg_1(_x), dim=1).reshape(B, N, -1) * self.shared_head
                w0 = F.softmax(self.wg_0(_x), dim=1).reshape(B, N, 2) * 2
                gates = torch.cat([torch.einsum("bn,bne->bne", w0[:, :, 0], shared),
                                   torch.einsum("bn,bne->bne", w0[:, :, 1], routed)], dim=2)
            else:
                gates = routed
        else:
            gates = F.softmax(self.wg_1(_x), dim=1).reshape(B, N, -1) * self.shared_head
        x = torch.einsum("bne,bned->bned", gates, x).reshape(B, N, self.head_dim * self.num_heads)
        return self.proj(x)


# microsoft/ArchScale@df4e070 lit_gpt/gated_memory_unit.py: GMU (swiglu's jiterator kernel swiglu_fwd,
# x * y / (1 + exp(-x)), with torch autograd for its hand-written swiglu_bwd); lit_gpt/ops/layernorm_gated.py:
# RMSNorm (norm_before_gate=False) computed by its reference rms_norm_ref (the triton kernel's reference),
# without the float32 upcast.
class GatedRMSNorm(nn.Module):  # layernorm_gated.RMSNorm
    def __init__(self, hidden_size, eps=1e-5, group_size=None, norm_before_gate=True):
        super().__init__()
        self.eps, self.group_size, self.norm_before_gate = eps, group_size, norm_before_gate
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.register_parameter("bias", None)

    def forward(self, x, z=None):
        if z is not None and not self.norm_before_gate:
            x = x * F.silu(z)
        g = self.group_size or x.shape[-1]
        xg = x.reshape(x.shape[:-1] + (-1, g))
        out = (xg / torch.sqrt(xg.square().mean(dim=-1, keepdim=True) + self.eps)).reshape(x.shape) * self.weight
        return out * F.silu(z) if z is not None and self.norm_before_gate else out


class GMU(nn.Module):
    def __init__(self, d_model, d_mem, bias=False, use_norm=False, ngroups=1):
        super().__init__()
        self.in_proj = nn.Linear(d_model, d_mem, bias=bias)
        self.out_proj = nn.Linear(d_mem, d_model, bias=bias)
        if use_norm:
            self.norm = GatedRMSNorm(d_mem, eps=1e-5, norm_before_gate=False, group_size=d_mem // ngroups)
        self.use_norm = use_norm

    def forward(self, hidden_states, memory):
        out = self.in_proj(hidden_states)
        out = self.norm(memory, out) if self.use_norm else out * memory / (1.0 + torch.exp(-out))
        return self.out_proj(out)
