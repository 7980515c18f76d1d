"""PyTorch re-statements of upstream neural-operator modules, for ``tests/test_interop_ops_b.py``.

Each class restates the cited upstream module (upstream parameter names and shapes, the forward's
math) compactly in plain PyTorch; it is not a copy of the upstream code. Deviations common to all:
dropout is omitted (eval mode) and hard-coded float32 / complex64 (or complex128) dtypes follow the
input's dtype instead, so that float64 stays float64.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

# ----------------------------------------------------------------------------------------------
# nec-research/CAPE-ML4Sci@8ae7d64 CAPE/models/PrmEmbd/PrmEmbd.py: PrmEmb_Block_1d, PrmEmb_Block_2d
# (SpectralConv1d, SpectralConv2d_fast). Deviation: upstream allocates the spectral weights and the
# output spectrum as torch.cdouble; here the spectrum follows the input's dtype.


class _CapeSpectral(nn.Module):
    def __init__(self, cin, cout, modes, nd):
        super().__init__()
        self.nd, self.cout, self.modes = nd, cout, modes
        scale = 1 / (cin * cout)
        shape = (cin, cout) + (modes,) * nd
        self.weights1 = nn.Parameter(scale * torch.rand(shape, dtype=torch.cdouble))
        if nd == 2:
            self.weights2 = nn.Parameter(scale * torch.rand(shape, dtype=torch.cdouble))

    def forward(self, x):
        m = self.modes
        if self.nd == 1:
            xf = torch.fft.rfft(x)
            out = torch.zeros(x.shape[0], self.cout, x.size(-1) // 2 + 1, dtype=xf.dtype)
            out[:, :, :m] = torch.einsum("bix,iox->box", xf[:, :, :m], self.weights1)
            return torch.fft.irfft(out, n=x.size(-1))
        xf = torch.fft.rfft2(x)
        out = torch.zeros(x.shape[0], self.cout, x.size(-2), x.size(-1) // 2 + 1, dtype=xf.dtype)
        out[:, :, :m, :m] = torch.einsum("bixy,ioxy->boxy", xf[:, :, :m, :m], self.weights1)
        out[:, :, -m:, :m] = torch.einsum("bixy,ioxy->boxy", xf[:, :, -m:, :m], self.weights2)
        return torch.fft.irfft2(out, s=(x.size(-2), x.size(-1)))


class PrmEmbBlock(nn.Module):
    """``PrmEmb_Block_1d`` (nd=1) / ``PrmEmb_Block_2d`` (nd=2); forward([x, x_p]) -> [out, x_p]."""

    def __init__(self, widening_factor=16, kernel_size=5, num_params=1, if_11cnv=False, num_channels=1,
                 num_channels_PrmEmb=1, modes=16, normed_dim=(128,), nd=1):
        super().__init__()
        conv = nn.Conv1d if nd == 1 else nn.Conv2d
        w, h = widening_factor, widening_factor // 2
        self.nd, self.num_channels_PrmEmb = nd, num_channels_PrmEmb
        self.CNN_0 = conv(num_channels, h, kernel_size=kernel_size, bias=False, padding="same")
        self.avpool = (nn.AvgPool1d if nd == 1 else nn.AvgPool2d)(4, 4)
        self.CNN_SC = _CapeSpectral(h, w, modes, nd)
        self.CNN_AD = conv(h, w, kernel_size=kernel_size, bias=False, padding="same", groups=h)
        self.CNN_1 = conv(h, w, kernel_size=1)
        self.CNN_AC = conv(h, w, kernel_size=1)
        if if_11cnv:
            self.CNN_2 = conv(w, num_channels * num_channels_PrmEmb, kernel_size=1)
        else:
            self.CNN_2 = conv(w, num_channels * num_channels_PrmEmb, kernel_size=kernel_size, bias=False,
                              padding="same")
        for i in range(3):
            setattr(self, f"fc{i}a", nn.Linear(num_params, h))
            setattr(self, f"fc{i}b", nn.Linear(h, w))
        self.LN = nn.LayerNorm(list(normed_dim))

    def forward(self, inputs):
        x, x_p = inputs
        pi = x_p if self.nd == 1 else torch.sigmoid(torch.log(x_p))
        tail = (None,) * self.nd
        e = [getattr(self, f"fc{i}b")(F.gelu(getattr(self, f"fc{i}a")(pi)))[(slice(None), slice(None)) + tail]
             for i in range(3)]
        y = F.gelu(self.CNN_0(x))
        y0 = F.interpolate(self.CNN_SC(self.avpool(y)) * e[0], scale_factor=4)
        y = F.gelu(y0 + self.CNN_AC(y) * e[1] + self.CNN_AD(y) * e[2] + self.CNN_1(y))
        y = self.CNN_2(y)
        xt = x.repeat((1, self.num_channels_PrmEmb) + (1,) * self.nd)
        return [xt + self.LN(y) if self.nd == 1 else xt * (1.0 + self.LN(y)), x_p]


# ----------------------------------------------------------------------------------------------
# camlab-ethz/GAOT@aec18bb src/model/layers/magno.py: MAGNOEncoder, MAGNODecoder (fixed-coordinate "fx"
# mode, use_attention=True, statistical geometry embedding, no edge drop), on agno.py: AGNO,
# gemb.py: GeometricEmbedding, node_pos_encode, mlp.py: ChannelMLP, LinearChannelMLP, and the "native"
# neighbour search (dists <= radius). Deviations: the CSR gather / segment_csr sums are written as dense
# (targets x sources) masked sums (same values; an empty ball sums to 0); torch_scatter is not used.


def _node_pos_encode(x, freq=4):
    phi = math.pi * (x + 1)
    a = torch.arange(1, freq + 1, dtype=x.dtype)[None, :, None] * phi[:, None, :]
    return torch.cat([a.sin(), a.cos()], dim=2).reshape(x.shape[0], -1)


class _ChannelMLP(nn.Module):  # mlp.py ChannelMLP with n_layers=1: one Conv1d(k=1)
    def __init__(self, cin, cout):
        super().__init__()
        self.fcs = nn.ModuleList([nn.Conv1d(cin, cout, 1)])

    def forward(self, x):  # (B, C, N)
        return self.fcs[0](x)


class _LinearChannelMLP(nn.Module):  # mlp.py LinearChannelMLP(layers), GELU between
    def __init__(self, layers):
        super().__init__()
        self.fcs = nn.ModuleList([nn.Linear(a, b) for a, b in zip(layers[:-1], layers[1:])])

    def forward(self, x):
        for i, fc in enumerate(self.fcs):
            x = fc(x)
            if i < len(self.fcs) - 1:
                x = F.gelu(x)
        return x


class _AGNO(nn.Module):
    def __init__(self, layers, transform_type, attention_type, coord_dim):
        super().__init__()
        self.transform_type, self.attention_type = transform_type, attention_type
        self.channel_mlp = _LinearChannelMLP(layers)
        if attention_type == "dot_product":
            self.query_proj = nn.Linear(coord_dim, 64)
            self.key_proj = nn.Linear(coord_dim, 64)
            self.scaling_factor = 1.0 / 64 ** 0.5

    def forward(self, y, mask, x, f_y):
        # y (N, kd) sources, x (M, kd) targets, mask (M, N) the radius graph, f_y (B, N, C)
        m, n = mask.shape
        rep, slf = y[None].expand(m, n, -1), x[:, None].expand(m, n, -1)
        if self.attention_type == "dot_product":
            s = (self.query_proj(slf) * self.key_proj(rep)).sum(-1) * self.scaling_factor
        else:
            s = (F.normalize(slf, p=2, dim=-1) * F.normalize(rep, p=2, dim=-1)).sum(-1)
        s = s.masked_fill(~mask, float("-inf"))
        alpha = torch.nan_to_num(torch.softmax(s, dim=-1) * mask, nan=0.0)  # segment softmax; empty rows 0
        agg = torch.cat([rep, slf], dim=-1)[None].expand(f_y.shape[0], m, n, -1)
        fin = f_y[:, None].expand(-1, m, n, -1)
        if self.transform_type == "nonlinear":
            agg = torch.cat([agg, fin], dim=-1)
        k = self.channel_mlp(agg) * fin * alpha[None, :, :, None]
        return k.sum(2)


class _GeometricEmbedding(nn.Module):  # gemb.py, method="statistical"
    def __init__(self, input_dim, output_dim):
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(3 + 2 * input_dim, 64), nn.ReLU(), nn.Linear(64, output_dim), nn.ReLU())

    @staticmethod
    def features(src, dst, mask):
        w = mask.to(src.dtype)
        cnt = w.sum(1)
        has = cnt > 0
        cc = cnt.clamp(min=1.0)
        dist = torch.cdist(dst, src)
        d_avg = (w * dist).sum(1) / cc
        d_var = ((w * dist ** 2).sum(1) / cc - d_avg ** 2).clamp(min=0.0)
        cen = (w @ src) / cc[:, None]
        cent = src[None] - cen[:, None]  # (M, N, d)
        cov = torch.einsum("mn,mni,mnj->mij", w, cent, cent) / cc[:, None, None]
        pca = torch.zeros_like(cen)
        if has.any():
            pca[has] = torch.linalg.eigvalsh(cov[has]).flip(dims=[1])
        g = torch.cat([cnt[:, None], d_avg[:, None], d_var[:, None], cen - dst, pca], dim=1)
        g[~has] = 0.0
        sd = g.std(dim=0, keepdim=True)
        sd[sd < 1e-6] = 1.0
        return (g - g.mean(dim=0, keepdim=True)) / sd

    def forward(self, src, dst, mask):
        return self.mlp(self.features(src, dst, mask))


class MAGNO(nn.Module):
    """``MAGNOEncoder(in_channels, out_channels, config)`` (role="encoder") or ``MAGNODecoder`` (role=
    "decoder"), with MAGNOConfig's fields as keywords; forward(src_coord, f, dst_coord) as upstream's
    ``(x_coord, pndata, latent_tokens_coord)`` / ``(latent_tokens_coord, rndata, query_coord)``."""

    def __init__(self, in_channels, out_channels, role="encoder", coord_dim=2, radius=0.033, hidden_size=64,
                 mlp_layers=3, scales=(1.0,), use_scale_weights=False, attention_type="cosine", use_geoembed=True,
                 transform_type="linear", node_embedding=False):
        super().__init__()
        self.role, self.radius, self.scales = role, radius, list(scales)
        self.use_scale_weights, self.use_geoembed, self.node_embedding = use_scale_weights, use_geoembed, node_embedding
        kd = coord_dim * 8 if node_embedding else coord_dim
        ch = out_channels if role == "encoder" else in_channels  # the AGNO width
        kin = 2 * kd + (in_channels if transform_type == "nonlinear" else 0)
        self.agno = _AGNO([kin] + [hidden_size] * mlp_layers + [ch], transform_type, attention_type, kd)
        if role == "encoder":
            self.lifting = _ChannelMLP(in_channels, out_channels)
        else:
            self.projection = _ChannelMLP(in_channels, out_channels)
        if use_geoembed:
            self.geoembed = _GeometricEmbedding(coord_dim, ch)
            self.recovery = _ChannelMLP(2 * ch, ch)
        if use_scale_weights:
            self.scale_weighting = nn.Sequential(nn.Linear(kd, hidden_size // 4), nn.ReLU(),
                                                 nn.Linear(hidden_size // 4, len(self.scales)))

    def forward(self, src, f, dst):
        if self.role == "encoder":
            f = self.lifting(f.permute(0, 2, 1)).permute(0, 2, 1)
        es, ed = (_node_pos_encode(src), _node_pos_encode(dst)) if self.node_embedding else (src, dst)
        dist = torch.cdist(dst, src)
        outs = []
        for s in self.scales:
            mask = dist <= self.radius * s
            enc = self.agno(es, mask, ed, f)
            if self.use_geoembed:
                g = self.geoembed(src, dst, mask)[None].expand(f.shape[0], -1, -1)
                enc = self.recovery(torch.cat([enc, g], dim=-1).permute(0, 2, 1)).permute(0, 2, 1)
            outs.append(enc)
        if len(outs) == 1:
            out = outs[0]
        elif self.use_scale_weights:
            w = torch.softmax(self.scale_weighting(dst), dim=-1)
            out = sum(w[None, :, i:i + 1] * o for i, o in enumerate(outs))
        else:
            out = torch.stack(outs, 0).mean(0)
        if self.role == "decoder":
            out = self.projection(out.permute(0, 2, 1)).permute(0, 2, 1)
        return out


# ----------------------------------------------------------------------------------------------
# AlexColagrande/MANO (no snapshot retrievable; the classes as read in identical third-party copies in the
# code index, as refattn/operators/mano.py says): MultipoleAttention, LocalAttention2D, AttentionBlock.
# Deviations: einops rearranges written as permute/reshape; dropout omitted.


class _ManoAttentionBlock(nn.Module):
    def __init__(self, dim, heads=8, dim_head=64):
        super().__init__()
        inner = dim_head * heads
        self.heads, self.scale = heads, dim_head ** -0.5
        self.norm = nn.LayerNorm(dim)
        self.to_qkv = nn.Linear(dim, inner * 3, bias=False)
        self.to_out = nn.Sequential(nn.Linear(inner, dim)) if not (heads == 1 and dim_head == dim) else nn.Identity()

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = (t.reshape(b, n, self.heads, -1).transpose(1, 2) for t in self.to_qkv(self.norm(x)).chunk(3, -1))
        out = torch.softmax(q @ k.transpose(-1, -2) * self.scale, dim=-1) @ v
        return self.to_out(out.transpose(1, 2).reshape(b, n, -1))


class _ManoLocalAttention2D(nn.Module):
    def __init__(self, kernel_size, stride, dim, heads, dim_head):
        super().__init__()
        self.kernel_size, self.stride = kernel_size, stride
        self.norm = nn.LayerNorm(dim)
        self.Attention = _ManoAttentionBlock(dim, heads, dim_head)
        self.unfold = nn.Unfold(kernel_size=kernel_size, stride=stride)

    def forward(self, x):
        b, h, w, c = x.shape
        kk = self.kernel_size
        patches = self.unfold(x.permute(0, 3, 1, 2))  # (B, C K K, L)
        nl = patches.shape[-1]
        patches = patches.reshape(b, c, kk * kk, nl).permute(0, 3, 2, 1).reshape(b * nl, kk * kk, c)
        out = self.Attention(self.norm(patches))
        out = out.reshape(b, nl, kk * kk, c).permute(0, 3, 2, 1).reshape(b, c * kk * kk, nl)
        fold = nn.Fold(output_size=(h, w), kernel_size=kk, stride=self.stride)
        norm = fold(self.unfold(torch.ones((b, 1, h, w), dtype=x.dtype)))
        return (fold(out) / norm).permute(0, 2, 3, 1)


class _Perm(nn.Module):  # einops Rearrange between channels-last and channels-first
    def __init__(self, *dims):
        super().__init__()
        self.dims = dims

    def forward(self, x):
        return x.permute(*self.dims)


class MultipoleAttention(nn.Module):
    def __init__(self, image_size, in_channels, local_attention_kernel_size, local_attention_stride, downsampling,
                 upsampling, sampling_rate, heads, dim_head, dropout=0.0, channel_scale=1):
        super().__init__()
        self.levels = int(math.log(image_size, sampling_rate))
        c = in_channels
        self.Attention = _ManoLocalAttention2D(local_attention_kernel_size, local_attention_stride, c, heads, dim_head)
        to_cf, to_cl = _Perm(0, 3, 1, 2), _Perm(0, 2, 3, 1)
        if downsampling == "avg_pool":
            self.down = nn.Sequential(to_cf, nn.AvgPool2d(sampling_rate, sampling_rate), to_cl)
        else:
            self.down = nn.Sequential(to_cf, nn.Conv2d(c, c, sampling_rate, sampling_rate, bias=False), to_cl)
        if upsampling == "avg_pool":
            self.up = nn.Sequential(to_cf, nn.Upsample(scale_factor=sampling_rate, mode="nearest"), to_cl)
        else:
            self.up = nn.Sequential(to_cf, nn.ConvTranspose2d(c, c, sampling_rate, sampling_rate, bias=False), to_cl)

    def forward(self, x):
        outs = [self.Attention(x)]
        for _ in range(1, self.levels):
            x = self.down(x)
            outs.append(self.Attention(x))
        res = outs.pop()
        for j, o in enumerate(outs[::-1]):
            res = o + (1 / (j + 1)) * self.up(res)
        return res


# ----------------------------------------------------------------------------------------------
# yzshi5/MINO@143e4b4 models/mino_modules/encoder_supernodes_gno_cross_attention.py: EncoderSupernodes
# (cond_dim=None), on modules/supernode_pooling_gno.py SupernodePooling, modules/gno_block.py GNOBlock
# (transform_type="nonlinear_kernelonly", native neighbour search dists <= radius), modules/integral_transform.py
# IntegralTransform (mean over the ball), conditioner_timestep.py ContinuousSincosEmbed, and the blocks of
# BenediktAlkin/KappaModules@748c370 kappamodules/transformer/perceiver_block.py PerceiverBlock,
# attention/perceiver_attention.py PerceiverAttention, transformer/mlp.py Mlp. Deviations: the embedding's
# omega buffer is built in float64 (upstream float32), the CSR gather/segment mean is a dense masked mean.


class _SincosEmbed(nn.Module):
    def __init__(self, dim, ndim, max_wavelength=10000, scale=128):
        super().__init__()
        ndim_pad = dim % ndim
        per = (dim - ndim_pad) // ndim
        self.padding = ndim_pad + (per % 2) * ndim
        eff = (dim - self.padding) // ndim
        self.register_buffer("omega", 1.0 / max_wavelength ** (torch.arange(0, eff, 2, dtype=torch.float64) / eff))
        self.scale = scale

    def forward(self, coords):
        out = self.scale * coords.unsqueeze(-1) @ self.omega.unsqueeze(0)
        emb = torch.cat([torch.sin(out), torch.cos(out)], dim=-1).reshape(coords.shape[0], -1)
        return torch.cat([emb, emb.new_zeros(emb.shape[0], self.padding)], dim=-1) if self.padding else emb


class _GNOBlock(nn.Module):
    def __init__(self, in_channels, out_channels, coord_dim, radius):
        super().__init__()
        h = out_channels
        self.radius = radius
        self.lift_ffn = nn.Linear(in_channels, h)
        self.pos_embedding = _SincosEmbed(h, coord_dim)
        self.channel_mlp = _LinearChannelMLP([3 * h, 2 * h, h])

    def forward(self, y, x, f_y):
        f = self.lift_ffn(f_y)
        ye, xe = self.pos_embedding(y), self.pos_embedding(x)
        mask = (torch.cdist(x, y) <= self.radius).to(f.dtype)  # (M, N)
        m, n = mask.shape
        agg = torch.cat([ye[None].expand(m, n, -1), xe[:, None].expand(m, n, -1)], dim=-1)
        agg = torch.cat([agg[None].expand(f.shape[0], -1, -1, -1), f[:, None].expand(-1, m, -1, -1)], dim=-1)
        k = self.channel_mlp(agg) * mask[None, :, :, None]
        return k.sum(2) / mask.sum(1).clamp(min=1.0)[None, :, None]


class _SupernodePooling(nn.Module):
    def __init__(self, radius, input_dim, hidden_dim, ndim):
        super().__init__()
        self.message = _GNOBlock(input_dim, hidden_dim, ndim, radius)

    def forward(self, input_feat, input_pos, query_pos):
        return self.message(input_pos[0], query_pos[0], input_feat)


class _Mlp(nn.Module):
    def __init__(self, in_dim, hidden_dim):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(in_dim, hidden_dim), nn.Linear(hidden_dim, in_dim)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class _PerceiverAttention(nn.Module):
    def __init__(self, dim, num_heads, kv_dim=None):
        super().__init__()
        self.num_heads = num_heads
        self.kv = nn.Linear(kv_dim or dim, 2 * dim)
        self.q = nn.Linear(dim, dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, q, kv):
        b, nq, d = q.shape
        hh = self.num_heads
        q = self.q(q).reshape(b, nq, hh, -1).transpose(1, 2)
        k, v = self.kv(kv).reshape(b, kv.shape[1], 2, hh, -1).permute(2, 0, 3, 1, 4).unbind(0)
        x = F.scaled_dot_product_attention(q, k, v)
        return self.proj(x.transpose(1, 2).reshape(b, nq, d))


class _PerceiverBlock(nn.Module):
    def __init__(self, dim, num_heads, kv_dim=None, mlp_hidden_dim=None, eps=1e-6):
        super().__init__()
        self.norm1q, self.norm1kv = nn.LayerNorm(dim, eps=eps), nn.LayerNorm(kv_dim or dim, eps=eps)
        self.attn = _PerceiverAttention(dim, num_heads, kv_dim)
        self.norm2 = nn.LayerNorm(dim, eps=eps)
        self.mlp = _Mlp(dim, mlp_hidden_dim or 4 * dim)

    def forward(self, q, kv):
        q = q + self.attn(self.norm1q(q), self.norm1kv(kv))
        return q + self.mlp(self.norm2(q))


class EncoderSupernodes(nn.Module):
    def __init__(self, input_dim, ndim, radius, enc_dim, enc_depth, enc_num_heads):
        super().__init__()
        self.radius, self.enc_num_heads = radius, enc_num_heads
        self.supernode_pooling = _SupernodePooling(radius, input_dim, enc_dim, ndim)
        self.enc_proj = nn.Identity()  # LinearProjection(enc_dim, enc_dim, optional=True)
        self.first_block = _PerceiverBlock(enc_dim, enc_num_heads, kv_dim=enc_dim)
        self.rest_block = nn.ModuleList(_PerceiverBlock(enc_dim, enc_num_heads, kv_dim=enc_dim)
                                        for _ in range(enc_depth - 1))

    def forward(self, input_feat, input_pos, query_pos):
        x = self.enc_proj(self.supernode_pooling(input_feat, input_pos, query_pos))
        h = self.first_block(q=x, kv=x)
        for blk in self.rest_block:
            h = blk(q=h, kv=x)
        return h


# ----------------------------------------------------------------------------------------------
# ZijiangY1116/MoNo@60d086a utils/models/mono.py: CoTAP (MONOMLP, MONORowNormalizedLinear, FasterSinkhornRouter)
# with utils/models/op.py sinkhorn_reference (the CPU path of faster_sinkhorn). Upstream calls
# build_mapping(anchor), encode(build_encode_mapping(.), x), decode(build_decode_mapping(.), z) separately;
# ``cotap_pair`` below runs the three and stacks the outputs along the tokens, as refattn's record returns them.


class _RowNormalizedLinear(nn.Module):
    def __init__(self, in_features, out_features, scale_init=3.0, eps=1e-12):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.global_scale = nn.Parameter(torch.tensor(float(scale_init)))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))

    def forward(self, x):
        return F.linear(x, F.normalize(self.weight, p=2, dim=1, eps=self.eps) * self.global_scale)


class _MonoMLP(nn.Module):
    def __init__(self, input_dim, hidden_dim, output_dim, n_layer, act, row_normalized_output=False):
        super().__init__()
        self.input = nn.Linear(input_dim, hidden_dim)
        self.hidden = nn.ModuleList([nn.Linear(hidden_dim, hidden_dim) for _ in range(n_layer)])
        self.output = (_RowNormalizedLinear(hidden_dim, output_dim) if row_normalized_output
                       else nn.Linear(hidden_dim, output_dim))
        self.act = act

    def forward(self, x):
        h = self.act(self.input(x))
        for layer in self.hidden:
            h = h + self.act(layer(h))
        return self.output(h)


class _SinkhornRouter(nn.Module):
    def __init__(self, n_iter=8, temperature=1.0):
        super().__init__()
        self.n_iter, self.temperature = n_iter, temperature

    def forward(self, logits):
        _, n, m = logits.shape
        s = logits / self.temperature
        log_mu, log_nu = -math.log(n), -math.log(m)
        u, v = s.new_zeros(s.shape[:2]), s.new_zeros((s.shape[0], m))
        for _ in range(self.n_iter):
            u = log_mu - torch.logsumexp(s + v.unsqueeze(1), dim=-1)
            v = log_nu - torch.logsumexp(s + u.unsqueeze(-1), dim=1)
        t = torch.exp(s + u.unsqueeze(-1) + v.unsqueeze(1))
        return {"score_encode": t * m, "score_decode": t * n}


class CoTAP(nn.Module):
    def __init__(self, n_dim, n_mode, n_layer, act, mlp_rownorm=False):
        super().__init__()
        self.attention_projector = _MonoMLP(n_dim, n_dim, n_mode, n_layer, act, row_normalized_output=mlp_rownorm)
        self.router = _SinkhornRouter(n_iter=8, temperature=1.0)

    def build_mapping(self, score_source):
        score = self.attention_projector(score_source)
        return {"score": score, **self.router(score)}

    def build_encode_mapping(self, mapping):
        return mapping["score_encode"]

    def build_decode_mapping(self, mapping):
        return mapping["score_decode"]

    def encode(self, score_encode, source_feature):
        return torch.einsum("bij,bic->bjc", score_encode, source_feature)

    def decode(self, score_decode, latent_feature):
        return torch.einsum("bij,bjc->bic", score_decode, latent_feature)


# ----------------------------------------------------------------------------------------------
# pengwei07/PhysGTO@198d88f code/task1/src/atten.py: Atten (PhysGTOAtten1), code/task2/src/model/atten.py:
# GTO_Atten, code/task3/src/model/atten.py: Atten (PhysGTOAtten3). Deviations: einops rearranges as
# reshapes; dropout omitted (eval).


def _heads(t, h):  # 'b n (h c) -> b h n c'
    b, n, _ = t.shape
    return t.reshape(b, n, h, -1).transpose(1, 2)


def _merge(t):  # 'b h n c -> b n (h c)'
    b, h, n, c = t.shape
    return t.transpose(1, 2).reshape(b, n, h * c)


class PhysGTOAtten1(nn.Module):
    def __init__(self, c_dim=128, n_token=128, n_heads=4):
        super().__init__()
        self.n_heads, self.token_dim = n_heads, c_dim // n_heads
        self.Q = nn.Parameter(torch.randn(n_heads, n_token, self.token_dim) / self.token_dim ** 0.5)
        self.kv_1 = nn.Linear(c_dim, 2 * c_dim)
        self.kv_2 = nn.Linear(self.token_dim, 2 * self.token_dim)
        self.q_3 = nn.Linear(c_dim, c_dim)
        self.out_proj = nn.Linear(c_dim, c_dim)

    def forward(self, x):
        k1, v1 = (_heads(t, self.n_heads) for t in self.kv_1(x).chunk(2, dim=-1))
        a1 = F.softmax(torch.einsum("hmc,bhnc->bhmn", self.Q, k1) / self.token_dim ** 0.5, dim=-1)
        k2, v2 = self.kv_2(a1 @ v1).chunk(2, dim=-1)
        q3 = _heads(self.q_3(x), self.n_heads)
        a2 = F.softmax(q3 @ k2.transpose(-1, -2) / self.token_dim ** 0.5, dim=-1)
        return self.out_proj(_merge(a2 @ v2))


class GTO_Atten(nn.Module):
    def __init__(self, c_dim=128, n_token=128, n_heads=4):
        super().__init__()
        self.n_heads = n_heads
        d = c_dim // n_heads
        self.Q = nn.Parameter(torch.randn(n_heads, n_token, d))
        self.kv_1 = nn.Linear(c_dim, c_dim)
        self.qkv_2 = nn.Linear(d, d * 2, bias=False)
        self.q_3 = nn.Linear(c_dim, c_dim)
        self.proj = nn.Linear(c_dim, c_dim)
        nn.init.xavier_uniform_(self.Q)

    def forward(self, W0):
        kv = _heads(self.kv_1(W0), self.n_heads)
        w = F.softmax(torch.einsum("hmc,bhnc->bhmn", self.Q, kv) / kv.shape[-1] ** 0.5, dim=-1)
        k, v = self.qkv_2(w @ kv).chunk(2, dim=-1)
        q3 = _heads(self.q_3(W0), self.n_heads)
        return self.proj(_merge(F.softmax(q3 @ k.transpose(-2, -1) / q3.shape[-1] ** 0.5, dim=-1) @ v))


class PhysGTOAtten3(nn.Module):
    def __init__(self, n_token=128, c_dim=128, n_heads=4):
        super().__init__()
        self.n_heads = n_heads
        self.Q = nn.Parameter(torch.randn(n_token, c_dim))
        for i in (1, 2, 3):
            setattr(self, f"attention{i}", nn.MultiheadAttention(c_dim, n_heads, batch_first=True))

    def forward(self, W0):
        q = self.Q.unsqueeze(0).repeat(W0.shape[0], 1, 1)
        w, _ = self.attention1(q, W0, W0)
        w, _ = self.attention2(w, w, w)
        w, _ = self.attention3(W0, w, w)
        return w


# ----------------------------------------------------------------------------------------------
# lucidrains/denoising-diffusion-pytorch@ff6cbb4 denoising_diffusion_pytorch/denoising_diffusion_pytorch.py:
# SinusoidalPosEmb, Unet.time_mlp, Block, ResnetBlock (the block DiTTO builds on; its authors' code is not
# public). ``DittoResnetBlock`` holds Unet's ``time_mlp`` next to one ResnetBlock's children (mlp, block1,
# block2, res_conv) and runs ResnetBlock.forward(x, time_mlp(t)), the names refattn's record uses.


class _SinusoidalPosEmb(nn.Module):
    def __init__(self, dim, theta=10000):
        super().__init__()
        self.dim, self.theta = dim, theta

    def forward(self, x):
        half = self.dim // 2
        emb = torch.exp(torch.arange(half, dtype=x.dtype) * -(math.log(self.theta) / (half - 1)))
        emb = x[:, None] * emb[None, :]
        return torch.cat((emb.sin(), emb.cos()), dim=-1)


class _DdpmBlock(nn.Module):
    def __init__(self, dim, dim_out, groups=8):
        super().__init__()
        self.proj = nn.Conv2d(dim, dim_out, 3, padding=1)
        self.norm = nn.GroupNorm(groups, dim_out)
        self.act = nn.SiLU()

    def forward(self, x, scale_shift=None):
        x = self.norm(self.proj(x))
        if scale_shift is not None:
            scale, shift = scale_shift
            x = x * (scale + 1) + shift
        return self.act(x)


class DittoResnetBlock(nn.Module):
    def __init__(self, dim, dim_out, *, emb_dim, time_dim, groups=8, theta=10000):
        super().__init__()
        self.time_mlp = nn.Sequential(_SinusoidalPosEmb(emb_dim, theta), nn.Linear(emb_dim, time_dim), nn.GELU(),
                                      nn.Linear(time_dim, time_dim))
        self.mlp = nn.Sequential(nn.SiLU(), nn.Linear(time_dim, dim_out * 2))
        self.block1 = _DdpmBlock(dim, dim_out, groups=groups)
        self.block2 = _DdpmBlock(dim_out, dim_out, groups=groups)
        self.res_conv = nn.Conv2d(dim, dim_out, 1) if dim != dim_out else nn.Identity()

    def forward(self, x, t):
        scale_shift = self.mlp(self.time_mlp(t))[:, :, None, None].chunk(2, dim=1)
        h = self.block2(self.block1(x, scale_shift=scale_shift))
        return h + self.res_conv(x)


# ----------------------------------------------------------------------------------------------
# felix-lyx/prose@eaf598d prose_fd/models/attention_utils.py: OperatorDecoderLayer (nn.MultiheadAttention
# cross-attention, no self-attention, activation="gelu"), with prose_fd/models/transformer.py:
# TransformerFusion's type embeddings + concatenation + joint key padding, and DataOperatorDecoder's
# get_query_emb (time_proj or time_embed, plus patch_position_embeddings). ``ProseOperatorDecoding`` holds
# those parameters under refattn's (upstream's leaf) names, around one decoder layer, with fusion n_layer = 0.


class ProseOperatorDecoding(nn.Module):
    def __init__(self, d_model, nhead, dim_feedforward, patch_num, *, time_embed="learnable", query_dim=1,
                 max_time_len=10, norm_first=True, layer_norm_eps=1e-5):
        super().__init__()
        self.norm_first = norm_first
        self.type_embeddings = nn.Embedding(2, d_model)
        if time_embed == "continuous":
            self.time_proj = nn.Sequential(nn.Linear(query_dim, d_model), nn.GELU(), nn.Linear(d_model, d_model))
        else:
            self.time_embed = nn.Parameter(torch.randn(1, max_time_len, 1, d_model))
        self.patch_position_embeddings = nn.Parameter(torch.randn(1, 1, patch_num, d_model))
        self.multihead_attn = nn.MultiheadAttention(d_model, nhead, batch_first=True)
        self.linear1 = nn.Linear(d_model, dim_feedforward)
        self.linear2 = nn.Linear(dim_feedforward, d_model)
        self.norm1 = nn.LayerNorm(d_model, eps=layer_norm_eps)
        self.norm2 = nn.LayerNorm(d_model, eps=layer_norm_eps)

    def _mha(self, x, mem, kpm):
        return self.multihead_attn(x, mem, mem, key_padding_mask=kpm, need_weights=False)[0]

    def _ff(self, x):
        return self.linear2(F.gelu(self.linear1(x)))

    def forward(self, times, x0, x1, key_padding_mask0=None, key_padding_mask1=None, output_len=None):
        b = x0.shape[0]
        mem = torch.cat([x0 + self.type_embeddings.weight[0], x1 + self.type_embeddings.weight[1]], dim=1)
        kpm = None
        if key_padding_mask0 is not None or key_padding_mask1 is not None:
            k0 = key_padding_mask0 if key_padding_mask0 is not None else torch.zeros(x0.shape[:2], dtype=torch.bool)
            k1 = key_padding_mask1 if key_padding_mask1 is not None else torch.zeros(x1.shape[:2], dtype=torch.bool)
            kpm = torch.cat([k0, k1], dim=1)
        tau = self.time_proj(times)[:, :, None] if hasattr(self, "time_proj") else self.time_embed[:, :output_len]
        x = (tau + self.patch_position_embeddings).reshape(tau.shape[0], -1, mem.shape[-1]).expand(b, -1, -1)
        if self.norm_first:
            x = x + self._mha(self.norm1(x), mem, kpm)
            return x + self._ff(self.norm2(x))
        x = self.norm1(x + self._mha(x, mem, kpm))
        return self.norm2(x + self._ff(x))


# ----------------------------------------------------------------------------------------------
# AI4Science-WestlakeU/beno@6ac99f3 BE_MPNN.py: InteractionNetwork (build_mlp; a torch_geometric MessagePassing
# with aggr="mean") on transformer.py: Transformer (DataEmbedding_wo_temp: TokenEmbedding, PositionalEmbedding,
# and the unused TemporalEmbedding of FixedEmbedding tables; Encoder of EncoderLayer / AttentionLayer /
# FullAttention(mask_flag=False); AdaptiveMaxPool1d). Deviations: PyG's propagate is written out (message on
# [x_i, x_j, e], scatter mean over targets, update); the positional table is built in float64 (upstream
# float32) and the boundary's ``.float()`` cast is dropped.


def _build_mlp(i, hidden, o, act):
    sizes = [i] + hidden + [o]
    m = nn.Sequential()
    for k in range(len(sizes) - 1):
        m.add_module(f"NN-{k}", nn.Linear(sizes[k], sizes[k + 1]))
        m.add_module(f"Act-{k}", act() if k < len(sizes) - 2 else nn.Identity())
    return m


def _sin_table(n, d):
    pos = torch.arange(n, dtype=torch.float64)[:, None]
    div = torch.exp(torch.arange(0, d, 2, dtype=torch.float64) * -(math.log(10000.0) / d))
    t = torch.zeros(n, d, dtype=torch.float64)
    t[:, 0::2], t[:, 1::2] = torch.sin(pos * div), torch.cos(pos * div)
    return t


class _FixedEmbedding(nn.Module):
    def __init__(self, c_in, d_model):
        super().__init__()
        self.emb = nn.Embedding(c_in, d_model)
        self.emb.weight = nn.Parameter(_sin_table(c_in, d_model), requires_grad=False)


class _TemporalEmbedding(nn.Module):  # never used by DataEmbedding_wo_temp, but in the state_dict
    def __init__(self, d_model):
        super().__init__()
        for name, n in (("hour", 24), ("weekday", 7), ("day", 32), ("month", 13)):
            setattr(self, f"{name}_embed", _FixedEmbedding(n, d_model))


class _PositionalEmbedding(nn.Module):
    def __init__(self, d_model, max_len=5000):
        super().__init__()
        self.register_buffer("pe", _sin_table(max_len, d_model)[None])


class _TokenEmbedding(nn.Module):
    def __init__(self, c_in, d_model):
        super().__init__()
        self.tokenConv = nn.Conv1d(c_in, d_model, kernel_size=3, padding=1, padding_mode="circular", bias=False)


class _DataEmbeddingWoTemp(nn.Module):
    def __init__(self, c_in, d_model):
        super().__init__()
        self.value_embedding = _TokenEmbedding(c_in, d_model)
        self.position_embedding = _PositionalEmbedding(d_model)
        self.temporal_embedding = _TemporalEmbedding(d_model)

    def forward(self, x):
        v = self.value_embedding.tokenConv(x.permute(0, 2, 1)).transpose(1, 2)
        return v + self.position_embedding.pe[:, :x.size(1)]


class _AttentionLayer(nn.Module):  # with FullAttention(mask_flag=False), scale 1/sqrt(E)
    def __init__(self, d_model, n_heads):
        super().__init__()
        d = d_model // n_heads
        self.query_projection, self.key_projection = nn.Linear(d_model, d * n_heads), nn.Linear(d_model, d * n_heads)
        self.value_projection, self.out_projection = nn.Linear(d_model, d * n_heads), nn.Linear(d * n_heads, d_model)
        self.n_heads = n_heads

    def forward(self, x):
        b, n, _ = x.shape
        q, k, v = (p(x).view(b, n, self.n_heads, -1) for p in (self.query_projection, self.key_projection,
                                                                self.value_projection))
        a = torch.softmax(torch.einsum("blhe,bshe->bhls", q, k) / math.sqrt(q.shape[-1]), dim=-1)
        return self.out_projection(torch.einsum("bhls,bshd->blhd", a, v).reshape(b, n, -1))


class _BenoEncoderLayer(nn.Module):
    def __init__(self, d_model, n_heads, d_ff):
        super().__init__()
        self.attention = _AttentionLayer(d_model, n_heads)
        self.conv1, self.conv2 = nn.Conv1d(d_model, d_ff, 1), nn.Conv1d(d_ff, d_model, 1)
        self.norm1, self.norm2 = nn.LayerNorm(d_model), nn.LayerNorm(d_model)

    def forward(self, x):
        x = self.norm1(x + self.attention(x))
        y = self.conv2(F.gelu(self.conv1(x.transpose(-1, 1)))).transpose(-1, 1)
        return self.norm2(x + y)


class _BenoEncoder(nn.Module):
    def __init__(self, layers, d_model):
        super().__init__()
        self.attn_layers = nn.ModuleList(layers)
        self.norm = nn.LayerNorm(d_model)

    def forward(self, x):
        for layer in self.attn_layers:
            x = layer(x)
        return self.norm(x)


class _BenoTransformer(nn.Module):
    def __init__(self, enc_in=2, d_model=16, n_heads=2, d_ff=16, enc_layers=2):
        super().__init__()
        self.enc_embedding = _DataEmbeddingWoTemp(enc_in, d_model)
        self.encoder = _BenoEncoder([_BenoEncoderLayer(d_model, n_heads, d_ff) for _ in range(enc_layers)], d_model)

    def forward(self, x_enc):
        return self.encoder(self.enc_embedding(x_enc)).permute(0, 2, 1).amax(-1)  # AdaptiveMaxPool1d(1)


class InteractionNetwork(nn.Module):
    """forward(x (N, D), edge_index (2, E), edge_features (E, De), boundary (L, 3)) -> (x', e'), as upstream."""

    def __init__(self, nnode_in, nnode_out, nedge_in, nedge_out, nmlp_layers, mlp_hidden_dim, boundary_dim,
                 trans_layer, activation=nn.ReLU):
        super().__init__()
        hidden = [mlp_hidden_dim] * nmlp_layers
        self.node_fn = nn.Sequential(_build_mlp(nnode_in + nedge_out + boundary_dim, hidden, nnode_out, activation),
                                     nn.LayerNorm(nnode_out))
        self.edge_fn = nn.Sequential(_build_mlp(nnode_in + nnode_in + nedge_in, hidden, nedge_out, activation),
                                     nn.LayerNorm(nedge_out))
        self.boundary_fn = _BenoTransformer(enc_in=3, d_model=boundary_dim, n_heads=2, enc_layers=trans_layer)

    def forward(self, x, edge_index, edge_features, boundary):
        z = self.boundary_fn(boundary.unsqueeze(0))
        src, dst = edge_index  # flow source_to_target: x_j = x[src], x_i = x[dst]
        m = self.edge_fn(torch.cat([x[dst], x[src], edge_features], dim=-1))
        agg = torch.zeros(x.shape[0], m.shape[1], dtype=m.dtype).index_add(0, dst, m)
        cnt = torch.zeros(x.shape[0], dtype=m.dtype).index_add(0, dst, torch.ones(len(dst), dtype=m.dtype))
        u = self.node_fn(torch.cat([agg / cnt.clamp(min=1)[:, None], x, z.repeat(x.shape[0], 1)], dim=-1))
        return u + x, edge_features + edge_features


# ----------------------------------------------------------------------------------------------
# rbischof/hypino@28d7308 src/models/hypino.py: HyperNetDecoder (forward(skip_connections, xy)), ModulationMFNN;
# src/models/utils.py: AttentionPooling, FourierMapping. Four stages with upstream's heads (4, 8, 8, 16) and
# GroupNorm groups; ``target_net``'s in_map / out_map are built but unused, as upstream. Deviation: the
# Fourier frequencies 0.1 * 2^j are built in float64 (upstream in the default float32).


class _FourierMapping(nn.Module):
    def __init__(self, input_dim, num_features, scale=0.1):
        super().__init__()
        self.output_dim = input_dim * (2 * num_features + 1)
        bands = 2.0 ** torch.linspace(0, num_features - 1, steps=num_features, dtype=torch.float64) * scale
        self.frequencies = nn.Parameter(bands.unsqueeze(0).repeat(input_dim, 1), requires_grad=False)

    def forward(self, x):
        a = 2 * torch.pi * x.unsqueeze(-1) * self.frequencies
        return torch.cat([torch.sin(a).flatten(-2, -1), torch.cos(a).flatten(-2, -1), x], dim=-1)


class _ModulationMFNN(nn.Module):
    def __init__(self, input_dim, output_dim, lat_dim, num_latent_layers, activation="tanh"):
        super().__init__()
        self.activation, self.num_latent_layers = getattr(F, activation), num_latent_layers
        self.fourier_transform = _FourierMapping(input_dim, 5, 0.1)
        self.in_map = nn.Linear(self.fourier_transform.output_dim, lat_dim)
        self.out_map = nn.Linear(lat_dim, output_dim)

    def forward(self, inputs, weights, biases):
        x = self.fourier_transform(inputs)
        u = torch.tanh(torch.bmm(x, weights[0]) + biases[0].unsqueeze(1))
        v = torch.tanh(torch.bmm(x, weights[1]) + biases[1].unsqueeze(1))
        x = self.activation(torch.bmm(x, weights[2]) + biases[2].unsqueeze(1))
        for i in range(3, 3 + self.num_latent_layers):
            x = self.activation(torch.bmm(u * x + v * (1 - x), weights[i]) + biases[i].unsqueeze(1))
        return torch.bmm(x, weights[-1]) + biases[-1].unsqueeze(1)


class _AttentionPooling(nn.Module):
    def __init__(self, embed_dim, num_heads, num_queries):
        super().__init__()
        self.queries = nn.Parameter(torch.randn(num_queries, embed_dim))
        self.attention = nn.MultiheadAttention(embed_dim, num_heads, batch_first=True)

    def forward(self, x):
        return self.attention(self.queries.unsqueeze(0).expand(x.size(0), -1, -1), x, x)[0]


class HyperNetDecoder(nn.Module):
    def __init__(self, num_features, target_input_dim, target_output_dim, target_lat_dim, target_num_latent,
                 target_activation="tanh"):
        super().__init__()
        tl, to, tn = target_lat_dim, target_output_dim, target_num_latent
        self.tlat, self.tout, self.tn = tl, to, tn
        self.target_net = _ModulationMFNN(target_input_dim, to, tl, tn, target_activation)
        self.attention_pooling = nn.ModuleList(_AttentionPooling(c, h, 2 * (tn + 4))
                                               for c, h in zip(num_features, (4, 8, 8, 16)))
        p, f = sum(num_features), self.target_net.fourier_transform.output_dim
        self.weight_maps = nn.ModuleList([self._ffn(p, f * tl * 2, f * tl, 4) for _ in range(3)]
                                         + [self._ffn(p, p, tl * tl, 16) for _ in range(tn)]
                                         + [self._ffn(p, tl * to * 2, tl * to, 1)])
        self.bias_maps = nn.ModuleList([self._ffn(p, tl * 2, tl, 4) for _ in range(tn + 3)] + [self._ffn(p, 32, to, 1)])

    @staticmethod
    def _ffn(i, hidden, o, groups):
        return nn.Sequential(nn.Linear(i, hidden), nn.GELU(), nn.GroupNorm(groups, hidden), nn.Linear(hidden, o),
                             nn.Identity())

    def forward(self, skip_connections, xy):
        c = torch.cat([att(s.flatten(1, 2)) for att, s in zip(self.attention_pooling, skip_connections)], dim=-1)
        f, tn = self.target_net.fourier_transform.output_dim, self.tn
        w = ([self.weight_maps[i](c[:, i]).reshape(-1, f, self.tlat) for i in range(3)]
             + [self.weight_maps[i](c[:, i]).reshape(-1, self.tlat, self.tlat) for i in range(3, tn + 3)]
             + [self.weight_maps[-1](c[:, tn + 3]).reshape(-1, self.tlat, self.tout)])
        b = ([self.bias_maps[i](c[:, tn + 4 + i]).reshape(-1, self.tlat) for i in range(tn + 3)]
             + [self.bias_maps[-1](c[:, -1]).reshape(-1, self.tout)])
        return self.target_net(xy, weights=w, biases=b)


# ----------------------------------------------------------------------------------------------
# neuraloperator/NNs-to-NOs@892ba1c models/unet_kernel_interp.py: InterpConv2d (scale from the shared
# scale_dict), utilities.py: bilinear_interpolate, resize. Deviation: none beyond the compact form.


def _nn2no_resize(x, out_size):
    f = torch.fft.rfft2(x, norm="backward")
    fz = torch.zeros((*x.shape[:-2], out_size[0], out_size[1] // 2 + 1), dtype=f.dtype)
    t1, t2 = min((f.shape[-2] + 1) // 2, (out_size[0] + 1) // 2), min(f.shape[-1], out_size[1] // 2 + 1)
    b1, b2 = min(f.shape[-2] // 2, out_size[0] // 2), min(f.shape[-1], out_size[1] // 2 + 1)
    fz[..., :t1, :t2] = f[..., :t1, :t2]
    fz[..., -b1:, :b2] = f[..., -b1:, :b2]
    return torch.fft.irfft2(fz, s=out_size).real * (out_size[0] / x.shape[-2]) * (out_size[1] / x.shape[-1])


class InterpConv2d(nn.Conv2d):
    def __init__(self, scale_dict, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                 bias=True, interpolation_mode="bilinear"):
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias)
        self.scale_dict, self.interpolation_mode, self.base_padding = scale_dict, interpolation_mode, padding
        self.interpolate = ((lambda w, s: F.interpolate(w, size=s, mode="bilinear")) if interpolation_mode == "bilinear"
                            else _nn2no_resize)

    def interpolate_kernel(self, scale, weight):
        if scale == 1.0:
            return weight, self.base_padding
        ks = tuple(int(scale * i - scale + 1) for i in self.kernel_size)
        k = self.interpolate(weight, ks) / ((ks[0] * ks[1]) / (weight.shape[2] * weight.shape[3]))
        bp = self.base_padding
        pad = tuple(int(i * scale) for i in bp) if isinstance(bp, tuple) else bp if isinstance(bp, str) else int(bp * scale)
        return k, pad

    def forward(self, input):
        k, self.padding = self.interpolate_kernel(self.scale_dict["scale"], self.weight)
        return self._conv_forward(input, k, self.bias)


# ----------------------------------------------------------------------------------------------
# LouisSerrano/aroma@77ec74f aroma/encoder_decoder.py: AROMAEncoderDecoderKL (PerceiverEncoder with
# encode_geo=False, include_pos_in_value=False, decoder_ff=False; PreNormCross, CrossAttention, PreNorm,
# Attention, MultiScaleAttention, FeedForward, DiagonalGaussianDistribution, LocalityAwareINRDecoder) and
# aroma/fourier_features.py: NeRFEncoding, MultiScaleNeRFEncoding. As upstream (cache_fn), the processor's
# attention and feed-forward modules are ONE pair shared by every layer. Deviations: the frequency bands are
# built in float64 (upstream float32); the model returns (output, kl) as upstream.


def _aroma_heads(t, h):  # 'b n (h d) -> (b h) n d'
    b, n, _ = t.shape
    return t.reshape(b, n, h, -1).permute(0, 2, 1, 3).reshape(b * h, n, -1)


def _aroma_merge(t, h):  # '(b h) n d -> b n (h d)'
    bh, n, d = t.shape
    return t.reshape(bh // h, h, n, d).permute(0, 2, 1, 3).reshape(bh // h, n, h * d)


class _AromaPreNorm(nn.Module):
    def __init__(self, dim, fn, context_dim=None):
        super().__init__()
        self.fn, self.norm = fn, nn.LayerNorm(dim)
        self.norm_context = nn.LayerNorm(context_dim) if context_dim is not None else None

    def forward(self, x, **kw):
        if self.norm_context is not None:
            kw["context"] = self.norm_context(kw["context"])
        return self.fn(self.norm(x), **kw)


class _AromaPreNormCross(nn.Module):
    def __init__(self, dim, fn, k_dim, v_dim):
        super().__init__()
        self.fn, self.norm = fn, nn.LayerNorm(dim)
        self.norm_k, self.norm_v = nn.LayerNorm(k_dim), nn.LayerNorm(v_dim)

    def forward(self, x, k, v):
        return self.fn(self.norm(x), k=self.norm_k(k), v=self.norm_v(v))


class _AromaFeedForward(nn.Module):
    def __init__(self, dim, mult=4):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, dim * mult), nn.GELU(), nn.Linear(dim * mult, dim))

    def forward(self, x):
        return self.net(x)


class _AromaCrossAttention(nn.Module):
    def __init__(self, query_dim, key_dim, value_dim, heads, dim_head):
        super().__init__()
        inner = heads * dim_head
        self.scale, self.heads = dim_head ** -0.5, heads
        self.to_q, self.to_k = nn.Linear(query_dim, inner, bias=False), nn.Linear(key_dim, inner, bias=False)
        self.to_v, self.to_out = nn.Linear(value_dim, inner, bias=False), nn.Linear(inner, query_dim)

    def forward(self, x, k, v):
        h = self.heads
        q, k, v = (_aroma_heads(t, h) for t in (self.to_q(x), self.to_k(k), self.to_v(v)))
        return self.to_out(_aroma_merge((q @ k.transpose(1, 2) * self.scale).softmax(-1) @ v, h))


class _AromaAttention(nn.Module):
    def __init__(self, query_dim, heads, dim_head, context_dim=None, out_dim=None):
        super().__init__()
        inner = heads * dim_head
        self.scale, self.heads = dim_head ** -0.5, heads
        self.to_q = nn.Linear(query_dim, inner, bias=False)
        self.to_kv = nn.Linear(context_dim or query_dim, inner * 2, bias=False)
        self.to_out = nn.Linear(inner, out_dim or query_dim)

    def forward(self, x, context=None):
        h = self.heads
        k, v = (_aroma_heads(t, h) for t in self.to_kv(x if context is None else context).chunk(2, dim=-1))
        q = _aroma_heads(self.to_q(x), h)
        return self.to_out(_aroma_merge((q @ k.transpose(1, 2) * self.scale).softmax(-1) @ v, h))


class _AromaMultiScaleAttention(_AromaAttention):
    def forward(self, x, context=None):  # x (b, n, s, query_dim)
        h = self.heads
        k, v = (_aroma_heads(t, h) for t in self.to_kv(context).chunk(2, dim=-1))
        b, n, s, _ = x.shape
        q = self.to_q(x).reshape(b, n, s, h, -1).permute(0, 3, 2, 1, 4).reshape(b * h, s, n, -1)
        out = (q @ k.transpose(1, 2)[:, None] * self.scale).softmax(-1) @ v[:, None]  # (b h) s n d
        out = out.reshape(b, h, s, n, -1).permute(0, 3, 2, 1, 4).reshape(b, n, s, -1)
        return self.to_out(out)


class _AromaMultiScaleNeRF(nn.Module):
    def __init__(self, num_freq, input_dim, scales, base_freq=2):
        super().__init__()
        s = [0] + list(scales)
        self.bands = nn.ParameterDict({
            f"{s[j + 1]}": nn.Parameter(base_freq ** torch.linspace(s[j], s[j + 1], num_freq, dtype=torch.float64)
                                        * math.pi, requires_grad=False) for j in range(len(s) - 1)})
        self.out_dim_per_scale = num_freq * input_dim * 2

    def forward(self, coords):
        b, n = coords.shape[:2]
        enc = []
        for bands in self.bands.values():
            w = (coords[..., None] * bands[None, :]).reshape(b, n, -1)
            enc.append(torch.cat([torch.sin(w), torch.cos(w)], dim=-1))
        return torch.stack(enc, dim=-2)


class _AromaNeRF(nn.Module):
    def __init__(self, num_freq, max_freq_log2, base_freq=2):
        super().__init__()
        self.num_freq, self.max_freq_log2 = num_freq, max_freq_log2
        self.bands = base_freq ** torch.linspace(0.0, max_freq_log2, num_freq, dtype=torch.float64) * math.pi

    def forward(self, coords):
        b, n, d = coords.shape
        w = (coords[..., None, :] * self.bands[None, None, :, None]).reshape(b, n, d * self.num_freq)
        return torch.cat([torch.sin(w), torch.cos(w)], dim=-1)


class _AromaPerceiverEncoder(nn.Module):
    def __init__(self, num_channels, input_dim, depth, num_latents, hidden_dim, latent_dim, mlp_feature_dim,
                 cross_heads, latent_heads, cross_dim_head, latent_dim_head, max_pos_encoding_freq, num_freq, scales,
                 bottleneck_index):
        super().__init__()
        self.depth, self.bottleneck_index = depth, bottleneck_index
        self.pos_encoding = _AromaNeRF(num_freq, max_pos_encoding_freq)
        self.pos_query = _AromaMultiScaleNeRF(num_freq, input_dim, scales)
        self.latents = nn.Parameter(torch.randn(num_latents, hidden_dim))
        key_dim, qd = 2 * num_freq * input_dim, self.pos_query.out_dim_per_scale
        self.lift_values = nn.Linear(num_channels, hidden_dim)
        self.cross_attend_blocks = nn.ModuleList([
            _AromaPreNormCross(hidden_dim, _AromaCrossAttention(hidden_dim, key_dim, hidden_dim, cross_heads,
                                                                cross_dim_head), key_dim, hidden_dim),
            _AromaPreNorm(hidden_dim, _AromaFeedForward(hidden_dim))])
        attn = _AromaPreNorm(hidden_dim, _AromaAttention(hidden_dim, latent_heads, latent_dim_head))
        ff = _AromaPreNorm(hidden_dim, _AromaFeedForward(hidden_dim))
        self.layers = nn.ModuleList(nn.ModuleList([attn, ff]) for _ in range(depth))  # shared, as cache_fn
        self.decoder_cross_attn = _AromaPreNorm(
            qd, _AromaMultiScaleAttention(qd, cross_heads, cross_dim_head, context_dim=hidden_dim,
                                          out_dim=mlp_feature_dim), context_dim=hidden_dim)
        self.mean_fc, self.logvar_fc = nn.Linear(hidden_dim, latent_dim), nn.Linear(hidden_dim, latent_dim)
        self.lift_z = nn.Linear(latent_dim, hidden_dim)

    def _bottleneck(self, x, sample_posterior):
        mu, logvar = self.mean_fc(x), self.logvar_fc(x).clamp(-30.0, 20.0)
        z = mu + torch.exp(0.5 * logvar) * torch.randn(mu.shape, dtype=mu.dtype) if sample_posterior else mu
        kl = 0.5 * torch.mean(mu ** 2 + torch.exp(logvar) - 1.0 - logvar, dim=[1, 2])
        return self.lift_z(z), kl.sum() / kl.shape[0]

    def forward(self, images, coords, target_coords, sample_posterior=True):
        queries = self.pos_query(target_coords)
        x = self.latents[None].expand(images.shape[0], -1, -1)
        k, v = self.pos_encoding(coords), self.lift_values(images)
        cross_attn, cross_ff = self.cross_attend_blocks
        x = cross_attn(x, k=k, v=v) + x
        x = cross_ff(x) + x
        kl = None
        for i, (sa, ff) in enumerate(self.layers):
            if i == self.bottleneck_index:
                x, kl = self._bottleneck(x, sample_posterior)
            x = sa(x) + x
            x = ff(x) + x
        if self.bottleneck_index == len(self.layers):
            x, kl = self._bottleneck(x, sample_posterior)
        return self.decoder_cross_attn(queries, context=x), kl


class _AromaINRDecoder(nn.Module):
    def __init__(self, output_dim, embed_dim, num_scales, dim, depth):
        super().__init__()
        layers = [nn.Linear(embed_dim * num_scales, dim), nn.ReLU()]
        for _ in range(depth - 1):
            layers += [nn.Linear(dim, dim), nn.ReLU()]
        self.mlp = nn.Sequential(*layers, nn.Linear(dim, output_dim))

    def forward(self, z):
        return self.mlp(z.reshape(z.shape[0], z.shape[1], -1))


class AROMAEncoderDecoderKL(nn.Module):
    def __init__(self, input_dim=2, num_channels=1, hidden_dim=64, dim=64, num_self_attentions=3, num_latents=16,
                 latent_dim=8, latent_heads=12, latent_dim_head=64, cross_heads=8, cross_dim_head=64, scales=(3, 4, 5),
                 mlp_feature_dim=16, depth_inr=3, bottleneck_index=0, max_pos_encoding_freq=4, num_freq=12):
        super().__init__()
        self.encoder = _AromaPerceiverEncoder(num_channels, input_dim, num_self_attentions, num_latents, hidden_dim,
                                              latent_dim, mlp_feature_dim, cross_heads, latent_heads, cross_dim_head,
                                              latent_dim_head, max_pos_encoding_freq, num_freq, scales,
                                              bottleneck_index)
        self.decoder = _AromaINRDecoder(num_channels, mlp_feature_dim, len(scales), dim, depth_inr)

    def forward(self, images, coords, target_coords=None, sample_posterior=True):
        z, kl = self.encoder(images, coords, coords if target_coords is None else target_coords, sample_posterior)
        return self.decoder(z), kl


# ----------------------------------------------------------------------------------------------
# atzberg/geo_neural_op@6473561 gnp/models/gnp.py: BlockGNP (forward(data) with data.x, data.edge_index,
# data.edge_attr), gnp/models/layers.py: BlockKernel, BlockConv (a torch_geometric MessagePassing with
# aggr="mean"). Deviations: PyG's propagate written out (x_j = x[edge_index[0]], mean over edge_index[1]).


class _BlockKernel(nn.Module):
    def __init__(self, edge_dim, d_in, d_out, num_channels, neurons, nonlinearity="ReLU"):
        super().__init__()
        self.channels, self.head_in, self.head_out = num_channels, d_in // num_channels, d_out // num_channels
        self.layers = nn.ModuleList([nn.Linear(edge_dim, neurons),
                                     nn.Linear(neurons, num_channels * self.head_in * self.head_out)])
        self.activ = getattr(nn, nonlinearity)()

    def forward(self, x):
        return self.layers[1](self.activ(self.layers[0](x))).view(-1, self.channels, self.head_in, self.head_out)


class _BlockConv(nn.Module):
    def __init__(self, edge_dim, d_in, d_out, num_channels, neurons, nonlinearity="ReLU"):
        super().__init__()
        self.d_out, self.head_in, self.channels = d_out, d_in // num_channels, num_channels
        self.nn = _BlockKernel(edge_dim, d_in, d_out, num_channels, neurons, nonlinearity)

    def forward(self, x, edge_index, edge_attr):
        src, dst = edge_index
        m = torch.matmul(x[src].view(-1, self.channels, 1, self.head_in), self.nn(edge_attr)).view(-1, self.d_out)
        agg = torch.zeros(x.shape[0], self.d_out, dtype=m.dtype).index_add(0, dst, m)
        cnt = torch.zeros(x.shape[0], dtype=m.dtype).index_add(0, dst, torch.ones(len(dst), dtype=m.dtype))
        return agg / cnt.clamp(min=1)[:, None]


class BlockGNP(nn.Module):
    def __init__(self, node_dim, edge_dim, out_dim, layers, num_channels, neurons, nonlinearity, device="cpu"):
        super().__init__()
        self.depth, self.channels, self.nonlinearity = len(layers) - 1, num_channels, nonlinearity
        self.lift, self.proj = nn.Linear(node_dim, layers[0]), nn.Linear(layers[-1], out_dim)
        self.W = nn.ModuleList([nn.Linear(a, b) if a != b else nn.Identity() for a, b in zip(layers[:-1], layers[1:])])
        self.mixes = nn.ModuleList([nn.Linear(b, b) for b in layers[1:]])
        self.convs = nn.ModuleList([_BlockConv(edge_dim, a, b, num_channels, neurons, nonlinearity)
                                    for a, b in zip(layers[:-1], layers[1:])])
        self.activ = getattr(nn, nonlinearity)()

    def forward(self, data):
        x, edge_index, edge_attr = data.x, data.edge_index, data.edge_attr
        x = self.lift(x)
        for i in range(self.depth):
            x = self.W[i](x) + self.mixes[i](self.convs[i](x, edge_index, edge_attr))
            if i < self.depth - 1:
                x = self.activ(x)
        return self.proj(x)


# ----------------------------------------------------------------------------------------------
# mroberto166/nio@c2defcc NIOModules.py: NIOHelmPermInv (eval mode), DeepONetModules.py: FeedForwardNN,
# DeepOnetNoBiasOrg, activation; FNOModules.py: FNO_WOR, SpectralConv2d. Deviations: the branch encoder
# (EncoderHelm2) is replaced by the identity, as refattn's record starts at the branch coefficients; the
# spectral weights are complex128. As upstream, fc0 enters through ``fc0.weight.data`` (no gradient) and
# ``deeponet.trunk`` is the same module as ``trunk``.


class _NioFeedForwardNN(nn.Module):
    def __init__(self, input_dimension, output_dimension, arch):
        super().__init__()
        self.output_dimension, self.act_string = output_dimension, arch["act_string"]
        n = arch["neurons"]
        self.input_layer = nn.Linear(input_dimension, n)
        self.hidden_layers = nn.ModuleList([nn.Linear(n, n) for _ in range(arch["n_hidden_layers"] - 1)])
        self.batch_layers = nn.ModuleList([nn.BatchNorm1d(n) for _ in range(arch["n_hidden_layers"] - 1)])
        self.output_layer = nn.Linear(n, output_dimension)
        self.activation = nn.Tanh() if self.act_string == "tanh" else nn.LeakyReLU()

    def forward(self, x):
        x = self.activation(self.input_layer(x))
        for lin, bn in zip(self.hidden_layers, self.batch_layers):
            x = bn(self.activation(lin(x)))
        return self.output_layer(x)


class _DeepOnetNoBiasOrg(nn.Module):
    def __init__(self, branch, trunk):
        super().__init__()
        self.branch, self.trunk = branch, trunk
        self.b0 = nn.Parameter(torch.tensor(0.0))
        self.p = trunk.output_dimension

    def forward(self, u_, x_):
        return (torch.matmul(self.branch(u_), self.trunk(x_).T) + self.b0) / self.p ** 0.5


class _NioSpectralConv2d(nn.Module):
    def __init__(self, cin, cout, m1, m2):
        super().__init__()
        self.cout, self.m1, self.m2 = cout, m1, m2
        scale = 1 / (cin * cout)
        self.weights1 = nn.Parameter(scale * torch.rand(cin, cout, m1, m2, dtype=torch.cdouble))
        self.weights2 = nn.Parameter(scale * torch.rand(cin, cout, m1, m2, dtype=torch.cdouble))

    def forward(self, x):
        xf = torch.fft.rfft2(x)
        out = torch.zeros(x.shape[0], self.cout, x.size(-2), x.size(-1) // 2 + 1, dtype=xf.dtype)
        out[:, :, :self.m1, :self.m2] = torch.einsum("bixy,ioxy->boxy", xf[:, :, :self.m1, :self.m2], self.weights1)
        out[:, :, -self.m1:, :self.m2] = torch.einsum("bixy,ioxy->boxy", xf[:, :, -self.m1:, :self.m2], self.weights2)
        return torch.fft.irfft2(out, s=(x.size(-2), x.size(-1)))


class _FnoWor(nn.Module):
    def __init__(self, arch, padding_frac=1 / 4):
        super().__init__()
        m1 = arch["modes"]
        m2 = int(m1 / 2) if m1 > 35 else m1
        w, self.n_layers, self.padding_frac = arch["width"], arch["n_layers"], padding_frac
        self.conv_list = nn.ModuleList([nn.Conv2d(w, w, 1) for _ in range(self.n_layers)])
        self.spectral_list = nn.ModuleList([_NioSpectralConv2d(w, w, m1, m2) for _ in range(self.n_layers)])
        self.fc1, self.fc2 = nn.Linear(w, 128), nn.Linear(128, 1)

    def forward(self, x):
        x = x.permute(0, 3, 1, 2)
        p1, p2 = int(round(x.shape[-1] * self.padding_frac)), int(round(x.shape[-2] * self.padding_frac))
        x = F.pad(x, [0, p1, 0, p2])
        for k, (s, c) in enumerate(zip(self.spectral_list, self.conv_list)):
            x = s(x) + c(x)
            if k != self.n_layers - 1:
                x = F.gelu(x)
        x = x[..., :-p1, :-p2].permute(0, 2, 3, 1)
        return self.fc2(F.gelu(self.fc1(x)))


class NIOHelmPermInv(nn.Module):
    def __init__(self, input_dimensions_trunk, network_properties_trunk, fno_architecture, padding_frac=1 / 4):
        super().__init__()
        self.trunk = _NioFeedForwardNN(input_dimensions_trunk, network_properties_trunk["n_basis"],
                                       network_properties_trunk)
        self.branch = nn.Identity()
        self.deeponet = _DeepOnetNoBiasOrg(self.branch, self.trunk)
        self.fc0 = nn.Linear(3, fno_architecture["width"])
        self.fno = _FnoWor(fno_architecture, padding_frac=padding_frac)

    def forward(self, x, grid):
        L = x.shape[1]
        nx, ny = grid.shape[0], grid.shape[1]
        x = self.deeponet(x, grid.view(-1, 2)).view(x.shape[0], x.shape[1], nx, ny)
        g = grid.unsqueeze(0).expand(x.shape[0], nx, ny, 2).permute(0, 3, 1, 2)
        x = torch.cat((g, x), 1).permute(0, 2, 3, 1)
        w, b = self.fc0.weight.data, self.fc0.bias.data
        w = torch.cat([w[:, :2], w[:, 2].view(-1, 1).repeat(1, L) / L], dim=1)
        return self.fno(torch.matmul(x, w.T) + b)[:, :, :, 0]
