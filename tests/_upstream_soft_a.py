"""Compact PyTorch re-statements of the upstream modules of ``refattn/interop/torch_specs_soft_a.py``.

Each class is written from the upstream file named in its heading comment: parameter and buffer
names, shapes and the forward as upstream; dropout is omitted (the modules run in eval), and buffers
upstream builds in float32 are built in float64 so that a float64 check stays float64.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def _swin_relative_position_index(wh, ww):
    coords = torch.stack(torch.meshgrid(torch.arange(wh), torch.arange(ww), indexing="ij")).flatten(1)
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0).contiguous()
    rel[:, :, 0] += wh - 1
    rel[:, :, 1] += ww - 1
    rel[:, :, 0] *= 2 * ww - 1
    return rel.sum(-1)


# microsoft/Swin-Transformer@f82860b models/swin_transformer.py: WindowAttention
# (dropout omitted; trunc_normal_ init of the table replaced by the caller's draw)
class WindowAttention(nn.Module):
    def __init__(self, dim, window_size, num_heads, qkv_bias=True, qk_scale=None):
        super().__init__()
        self.dim, self.window_size, self.num_heads = dim, window_size, num_heads
        self.scale = qk_scale or (dim // num_heads) ** -0.5
        self.relative_position_bias_table = nn.Parameter(
            0.02 * torch.randn((2 * window_size[0] - 1) * (2 * window_size[1] - 1), num_heads))
        self.register_buffer("relative_position_index", _swin_relative_position_index(*window_size))
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x, mask=None):
        B_, N, C = x.shape
        qkv = self.qkv(x).reshape(B_, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = (q * self.scale) @ k.transpose(-2, -1)
        bias = self.relative_position_bias_table[self.relative_position_index.view(-1)].view(N, N, -1)
        attn = attn + bias.permute(2, 0, 1).contiguous().unsqueeze(0)
        if mask is not None:
            nW = mask.shape[0]
            attn = attn.view(B_ // nW, nW, self.num_heads, N, N) + mask.unsqueeze(1).unsqueeze(0)
            attn = attn.view(-1, self.num_heads, N, N)
        attn = self.softmax(attn)
        return self.proj((attn @ v).transpose(1, 2).reshape(B_, N, C))


# microsoft/Swin-Transformer@f82860b models/swin_transformer_v2.py: WindowAttention
# (dropout omitted; relative_coords_table built in float64, upstream float32)
class WindowAttentionV2(nn.Module):
    def __init__(self, dim, window_size, num_heads, qkv_bias=True, pretrained_window_size=(0, 0)):
        super().__init__()
        self.dim, self.window_size, self.num_heads = dim, window_size, num_heads
        self.pretrained_window_size = pretrained_window_size
        self.logit_scale = nn.Parameter(torch.log(10 * torch.ones((num_heads, 1, 1))))
        self.cpb_mlp = nn.Sequential(nn.Linear(2, 512, bias=True), nn.ReLU(inplace=True),
                                     nn.Linear(512, num_heads, bias=False))
        wh, ww = window_size
        ch = torch.arange(-(wh - 1), wh, dtype=torch.float64)
        cw = torch.arange(-(ww - 1), ww, dtype=torch.float64)
        table = torch.stack(torch.meshgrid([ch, cw], indexing="ij")).permute(1, 2, 0).contiguous().unsqueeze(0)
        ph, pw = pretrained_window_size if pretrained_window_size[0] > 0 else window_size
        table[:, :, :, 0] /= ph - 1
        table[:, :, :, 1] /= pw - 1
        table *= 8
        table = torch.sign(table) * torch.log2(torch.abs(table) + 1.0) / math.log2(8)
        self.register_buffer("relative_coords_table", table)
        self.register_buffer("relative_position_index", _swin_relative_position_index(wh, ww))
        self.qkv = nn.Linear(dim, dim * 3, bias=False)
        if qkv_bias:
            self.q_bias = nn.Parameter(torch.zeros(dim))
            self.v_bias = nn.Parameter(torch.zeros(dim))
        else:
            self.q_bias = self.v_bias = None
        self.proj = nn.Linear(dim, dim)
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x, mask=None):
        B_, N, C = x.shape
        qkv_bias = None
        if self.q_bias is not None:
            qkv_bias = torch.cat((self.q_bias, torch.zeros_like(self.v_bias, requires_grad=False), self.v_bias))
        qkv = F.linear(input=x, weight=self.qkv.weight, bias=qkv_bias)
        qkv = qkv.reshape(B_, N, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)
        attn = attn * torch.clamp(self.logit_scale, max=torch.log(torch.tensor(1. / 0.01))).exp()
        table = self.cpb_mlp(self.relative_coords_table).view(-1, self.num_heads)
        bias = table[self.relative_position_index.view(-1)].view(N, N, -1).permute(2, 0, 1).contiguous()
        attn = attn + 16 * torch.sigmoid(bias).unsqueeze(0)
        if mask is not None:
            nW = mask.shape[0]
            attn = attn.view(B_ // nW, nW, self.num_heads, N, N) + mask.unsqueeze(1).unsqueeze(0)
            attn = attn.view(-1, self.num_heads, N, N)
        attn = self.softmax(attn)
        return self.proj((attn @ v).transpose(1, 2).reshape(B_, N, C))


# XPixelGroup/HAT@1638a9a hat/archs/hat_arch.py: ChannelAttention, CAB, Mlp, WindowAttention, HAB, OCAB
# (dropout and DropPath omitted; einops.rearrange of OCAB's unfolded windows written as view/permute)
class ChannelAttention(nn.Module):
    def __init__(self, num_feat, squeeze_factor=16):
        super().__init__()
        self.attention = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(num_feat, num_feat // squeeze_factor, 1),
                                       nn.ReLU(inplace=True), nn.Conv2d(num_feat // squeeze_factor, num_feat, 1),
                                       nn.Sigmoid())

    def forward(self, x):
        return x * self.attention(x)


class CAB(nn.Module):
    def __init__(self, num_feat, compress_ratio=3, squeeze_factor=30):
        super().__init__()
        self.cab = nn.Sequential(nn.Conv2d(num_feat, num_feat // compress_ratio, 3, 1, 1), nn.GELU(),
                                 nn.Conv2d(num_feat // compress_ratio, num_feat, 3, 1, 1),
                                 ChannelAttention(num_feat, squeeze_factor))

    def forward(self, x):
        return self.cab(x)


class Mlp(nn.Module):
    def __init__(self, in_features, hidden_features=None, out_features=None):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features or in_features)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_features or in_features, out_features or in_features)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class HATWindowAttention(nn.Module):  # upstream name: WindowAttention (takes rpi)
    def __init__(self, dim, window_size, num_heads, qkv_bias=True, qk_scale=None):
        super().__init__()
        self.dim, self.window_size, self.num_heads = dim, window_size, num_heads
        self.scale = qk_scale or (dim // num_heads) ** -0.5
        self.relative_position_bias_table = nn.Parameter(
            0.02 * torch.randn((2 * window_size[0] - 1) * (2 * window_size[1] - 1), num_heads))
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x, rpi, mask=None):
        b_, n, c = x.shape
        qkv = self.qkv(x).reshape(b_, n, 3, self.num_heads, c // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = (q * self.scale) @ k.transpose(-2, -1)
        bias = self.relative_position_bias_table[rpi.view(-1)].view(n, n, -1).permute(2, 0, 1).contiguous()
        attn = attn + bias.unsqueeze(0)
        if mask is not None:
            nw = mask.shape[0]
            attn = attn.view(b_ // nw, nw, self.num_heads, n, n) + mask.unsqueeze(1).unsqueeze(0)
            attn = attn.view(-1, self.num_heads, n, n)
        attn = self.softmax(attn)
        return self.proj((attn @ v).transpose(1, 2).reshape(b_, n, c))


def _hat_partition(x, ws):
    b, h, w, c = x.shape
    return x.view(b, h // ws, ws, w // ws, ws, c).permute(0, 1, 3, 2, 4, 5).contiguous().view(-1, ws, ws, c)


def _hat_reverse(windows, ws, h, w):
    b = int(windows.shape[0] / (h * w / ws / ws))
    return windows.view(b, h // ws, w // ws, ws, ws, -1).permute(0, 1, 3, 2, 4, 5).contiguous().view(b, h, w, -1)


class HAB(nn.Module):
    def __init__(self, dim, input_resolution, num_heads, window_size=7, shift_size=0, compress_ratio=3,
                 squeeze_factor=30, conv_scale=0.01, mlp_ratio=4., qkv_bias=True, qk_scale=None):
        super().__init__()
        self.dim, self.input_resolution, self.num_heads = dim, input_resolution, num_heads
        self.window_size, self.shift_size, self.mlp_ratio = window_size, shift_size, mlp_ratio
        if min(self.input_resolution) <= self.window_size:
            self.shift_size = 0
            self.window_size = min(self.input_resolution)
        assert 0 <= self.shift_size < self.window_size
        self.norm1 = nn.LayerNorm(dim)
        self.attn = HATWindowAttention(dim, (self.window_size, self.window_size), num_heads, qkv_bias, qk_scale)
        self.conv_scale = conv_scale
        self.conv_block = CAB(dim, compress_ratio, squeeze_factor)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def forward(self, x, x_size, rpi_sa, attn_mask):
        h, w = x_size
        b, _, c = x.shape
        shortcut = x
        x = self.norm1(x).view(b, h, w, c)
        conv_x = self.conv_block(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1).contiguous().view(b, h * w, c)
        if self.shift_size > 0:
            shifted_x = torch.roll(x, shifts=(-self.shift_size, -self.shift_size), dims=(1, 2))
        else:
            shifted_x, attn_mask = x, None
        x_windows = _hat_partition(shifted_x, self.window_size).view(-1, self.window_size * self.window_size, c)
        attn_windows = self.attn(x_windows, rpi=rpi_sa, mask=attn_mask).view(-1, self.window_size, self.window_size, c)
        shifted_x = _hat_reverse(attn_windows, self.window_size, h, w)
        if self.shift_size > 0:
            attn_x = torch.roll(shifted_x, shifts=(self.shift_size, self.shift_size), dims=(1, 2))
        else:
            attn_x = shifted_x
        x = shortcut + attn_x.view(b, h * w, c) + conv_x * self.conv_scale
        return x + self.mlp(self.norm2(x))


class OCAB(nn.Module):
    def __init__(self, dim, input_resolution, window_size, overlap_ratio, num_heads, qkv_bias=True, qk_scale=None,
                 mlp_ratio=2):
        super().__init__()
        self.dim, self.input_resolution, self.window_size, self.num_heads = dim, input_resolution, window_size, num_heads
        self.scale = qk_scale or (dim // num_heads) ** -0.5
        self.overlap_win_size = int(window_size * overlap_ratio) + window_size
        self.norm1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.unfold = nn.Unfold(kernel_size=(self.overlap_win_size, self.overlap_win_size), stride=window_size,
                                padding=(self.overlap_win_size - window_size) // 2)
        self.relative_position_bias_table = nn.Parameter(
            0.02 * torch.randn((window_size + self.overlap_win_size - 1) ** 2, num_heads))
        self.softmax = nn.Softmax(dim=-1)
        self.proj = nn.Linear(dim, dim)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def forward(self, x, x_size, rpi):
        h, w = x_size
        b, _, c = x.shape
        ws, ow = self.window_size, self.overlap_win_size
        shortcut = x
        x = self.norm1(x).view(b, h, w, c)
        qkv = self.qkv(x).reshape(b, h, w, 3, c).permute(3, 0, 4, 1, 2)
        q = qkv[0].permute(0, 2, 3, 1)
        kv = torch.cat((qkv[1], qkv[2]), dim=1)
        q_windows = _hat_partition(q, ws).view(-1, ws * ws, c)
        kv_windows = self.unfold(kv)  # 'b (nc ch owh oww) nw -> nc (b nw) (owh oww) ch'
        nw = kv_windows.shape[-1]
        kv_windows = kv_windows.view(b, 2, c, ow * ow, nw).permute(1, 0, 4, 3, 2).reshape(2, b * nw, ow * ow, c)
        k_windows, v_windows = kv_windows[0], kv_windows[1]
        b_, nq, _ = q_windows.shape
        n = k_windows.shape[1]
        d = self.dim // self.num_heads
        q = q_windows.reshape(b_, nq, self.num_heads, d).permute(0, 2, 1, 3)
        k = k_windows.reshape(b_, n, self.num_heads, d).permute(0, 2, 1, 3)
        v = v_windows.reshape(b_, n, self.num_heads, d).permute(0, 2, 1, 3)
        attn = (q * self.scale) @ k.transpose(-2, -1)
        bias = self.relative_position_bias_table[rpi.view(-1)].view(ws * ws, ow * ow, -1).permute(2, 0, 1)
        attn = self.softmax(attn + bias.contiguous().unsqueeze(0))
        attn_windows = (attn @ v).transpose(1, 2).reshape(b_, nq, self.dim).view(-1, ws, ws, self.dim)
        x = self.proj(_hat_reverse(attn_windows, ws, h, w).view(b, h * w, self.dim)) + shortcut
        return x + self.mlp(self.norm2(x))


# microsoft/Cream@4a13c40 iRPE/DeiT-with-iRPE/irpe.py: piecewise_index, _rp_2d_*, get_bucket_ids_2d, iRPE,
# iRPE_Cross, get_single_rpe_config, get_rpe_config, build_rpe; rpe_vision_transformer.py: RPEAttention
# (dropout omitted; no bucket cache and no rpe_ops kernel, the pure-PyTorch path; EasyDict as SimpleNamespace;
# the buckets keep upstream's float32 arithmetic)
class METHOD:
    EUCLIDEAN, QUANT, PRODUCT, CROSS, CROSS_ROWS, CROSS_COLS = 0, 1, 3, 4, 41, 42


@torch.no_grad()
def piecewise_index(relative_position, alpha, beta, gamma, dtype):
    rp_abs = relative_position.abs()
    not_mask = ~(rp_abs <= alpha)
    rp_out, rp_abs_out = relative_position[not_mask], rp_abs[not_mask]
    y_out = (torch.sign(rp_out) * (alpha + torch.log(rp_abs_out / alpha) / math.log(gamma / alpha) * (beta - alpha))
             .round().clip(max=beta)).to(dtype)
    idx = relative_position.clone()
    if idx.dtype in [torch.float32, torch.float64]:
        idx = idx.round().to(dtype)
    idx[not_mask] = y_out
    return idx


def _rp_2d_product(diff, **kw):
    b = int(kw["beta"])
    return (piecewise_index(diff[:, :, 0], **kw) + b) * (2 * b + 1) + piecewise_index(diff[:, :, 1], **kw) + b


_METHOD_FUNC = {
    METHOD.EUCLIDEAN: lambda diff, **kw: piecewise_index(diff.square().sum(2).float().sqrt().round(), **kw),
    METHOD.QUANT: lambda diff, **kw: piecewise_index(diff.square().sum(2), **kw),
    METHOD.PRODUCT: _rp_2d_product,
    METHOD.CROSS_ROWS: lambda diff, **kw: piecewise_index(diff[:, :, 0], **kw),
    METHOD.CROSS_COLS: lambda diff, **kw: piecewise_index(diff[:, :, 1], **kw),
}


def get_num_buckets(method, alpha, beta, gamma):
    return (2 * int(beta) + 1) ** 2 if method == METHOD.PRODUCT else 2 * int(beta) + 1


@torch.no_grad()
def get_bucket_ids_2d(method, height, width, skip, alpha, beta, gamma, dtype=torch.long):
    rows = torch.arange(height, dtype=dtype).view(height, 1).repeat(1, width)
    cols = torch.arange(width, dtype=dtype).view(1, width).repeat(height, 1)
    L = height * width
    pos = torch.stack([rows, cols], 2)
    diff = pos.view((L, 1, 2)) - pos.view((1, L, 2))
    bucket_ids = _METHOD_FUNC[method](diff, alpha=alpha, beta=beta, gamma=gamma, dtype=dtype)
    if method != METHOD.PRODUCT:
        bucket_ids += int(beta)
    num_buckets = get_num_buckets(method, alpha, beta, gamma)
    if skip > 0:
        new_bids = bucket_ids.new_empty(size=(skip + L, skip + L))
        new_bids[:skip] = num_buckets
        new_bids[:, :skip] = num_buckets
        new_bids[skip:, skip:] = bucket_ids
        bucket_ids, num_buckets = new_bids, num_buckets + 1
    return bucket_ids.contiguous(), num_buckets


class iRPE(nn.Module):
    def __init__(self, head_dim, num_heads=8, mode=None, method=None, transposed=True, num_buckets=None,
                 rpe_config=None):
        super().__init__()
        self.num_heads, self.head_dim, self.mode, self.method = num_heads, head_dim, mode, method
        self.transposed, self.num_buckets, self.rpe_config = transposed, num_buckets, rpe_config
        if transposed:
            if mode == "bias":
                self.lookup_table_bias = nn.Parameter(torch.zeros(num_heads, num_buckets))
            elif mode == "contextual":
                self.lookup_table_weight = nn.Parameter(torch.zeros(num_heads, head_dim, num_buckets))
        elif mode == "bias":
            raise NotImplementedError("[Error] Bias non-transposed RPE does not exist.")
        elif mode == "contextual":
            self.lookup_table_weight = nn.Parameter(torch.zeros(num_heads, num_buckets, head_dim))

    def forward(self, x, height=None, width=None):
        B, H, L, D = x.shape
        if height is None:
            height = width = int(math.sqrt(L))
        c = self.rpe_config
        rp_bucket, num_buckets = get_bucket_ids_2d(self.method, height, width, L - height * width, c.alpha, c.beta,
                                                   c.gamma)
        assert num_buckets == self.num_buckets
        L_query, L_key = rp_bucket.shape
        if not self.transposed:
            weight = self.lookup_table_weight[:, rp_bucket.flatten()].view(self.num_heads, L_query, L_key, self.head_dim)
            return torch.matmul(x.permute(1, 2, 0, 3), weight).permute(2, 0, 1, 3)
        if self.mode == "bias":
            return self.lookup_table_bias[:, rp_bucket.flatten()].view(1, self.num_heads, L_query, L_key)
        offset = torch.arange(0, L * self.num_buckets, self.num_buckets, dtype=rp_bucket.dtype).view(-1, 1)
        flat = (rp_bucket + offset).flatten()
        lookup_table = torch.matmul(x.transpose(0, 1).reshape(-1, B * L_query, self.head_dim),
                                    self.lookup_table_weight).view(-1, B, L_query, self.num_buckets).transpose(0, 1)
        return lookup_table.flatten(2)[:, :, flat].view(B, -1, L_query, L_key)


class iRPE_Cross(nn.Module):
    def __init__(self, method, **kwargs):
        super().__init__()
        assert method == METHOD.CROSS
        self.rp_rows = iRPE(**kwargs, method=METHOD.CROSS_ROWS)
        self.rp_cols = iRPE(**kwargs, method=METHOD.CROSS_COLS)

    def forward(self, x, height=None, width=None):
        return self.rp_rows(x, height=height, width=width) + self.rp_cols(x, height=height, width=width)


def get_single_rpe_config(ratio=1.9, method=METHOD.PRODUCT, mode="contextual", shared_head=True, skip=0):
    from types import SimpleNamespace

    config = SimpleNamespace(shared_head=shared_head, mode=mode, method=method, alpha=1 * ratio, beta=2 * ratio,
                             gamma=8 * ratio)
    config.num_buckets = get_num_buckets(method, config.alpha, config.beta, config.gamma) + (1 if skip > 0 else 0)
    return config


def get_rpe_config(ratio=1.9, method=METHOD.PRODUCT, mode="contextual", shared_head=True, skip=0, rpe_on="k"):
    from types import SimpleNamespace

    if isinstance(method, str):
        method = dict(euc=METHOD.EUCLIDEAN, quant=METHOD.QUANT, cross=METHOD.CROSS, product=METHOD.PRODUCT)[method]
    kw = dict(ratio=ratio, method=method, mode="contextual" if mode == "ctx" else mode, shared_head=shared_head,
              skip=skip)
    return SimpleNamespace(**{f"rpe_{t}": get_single_rpe_config(**kw) if t in rpe_on else None for t in "qkv"})


def build_rpe(config, head_dim, num_heads):
    def single(rpe, transposed):
        if rpe is None:
            return None
        cls = iRPE if rpe.method != METHOD.CROSS else iRPE_Cross
        return cls(head_dim=head_dim, num_heads=1 if rpe.shared_head else num_heads, mode=rpe.mode, method=rpe.method,
                   transposed=transposed, num_buckets=rpe.num_buckets, rpe_config=rpe)
    return [single(rpe, t) for rpe, t in zip([config.rpe_q, config.rpe_k, config.rpe_v], [True, True, False])]


class RPEAttention(nn.Module):
    def __init__(self, dim, num_heads=8, qkv_bias=False, qk_scale=None, rpe_config=None):
        super().__init__()
        self.num_heads = num_heads
        self.scale = qk_scale or (dim // num_heads) ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.rpe_q, self.rpe_k, self.rpe_v = build_rpe(rpe_config, head_dim=dim // num_heads, num_heads=num_heads)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        q *= self.scale
        attn = q @ k.transpose(-2, -1)
        if self.rpe_k is not None:
            attn += self.rpe_k(q)
        if self.rpe_q is not None:
            attn += self.rpe_q(k * self.scale).transpose(2, 3)
        attn = attn.softmax(dim=-1)
        out = attn @ v
        if self.rpe_v is not None:
            out += self.rpe_v(attn)
        return self.proj(out.transpose(1, 2).reshape(B, N, C))


# xiuqhou/Relation-DETR@b485955 models/bricks/relation_transformer.py: box_rel_encoding, PositionRelationEmbedding,
# and the self-attention step of RelationTransformerDecoder.forward / RelationTransformerDecoderLayer.forward;
# models/bricks/position_encoding.py: get_dim_t, get_sine_pos_embed (exchange_xy=False path)
# (RelationDecoderSelfAttention is a test holder: the decoder's position_relation_embedding beside one
# layer's self_attn, their names as upstream; dropout omitted; the residual and norm2 after it left out)
def box_rel_encoding(src_boxes, tgt_boxes, eps=1e-5):
    xy1, wh1 = src_boxes.split([2, 2], -1)
    xy2, wh2 = tgt_boxes.split([2, 2], -1)
    delta_xy = torch.log(torch.abs(xy1.unsqueeze(-2) - xy2.unsqueeze(-3)) / (wh1.unsqueeze(-2) + eps) + 1.0)
    delta_wh = torch.log((wh1.unsqueeze(-2) + eps) / (wh2.unsqueeze(-3) + eps))
    return torch.cat([delta_xy, delta_wh], -1)


def get_sine_pos_embed(pos_tensor, num_pos_feats=128, temperature=10000, scale=2 * math.pi):
    dim_t = temperature ** (torch.arange(num_pos_feats // 2, dtype=torch.float32) * 2 / num_pos_feats)
    pos_res = pos_tensor.unsqueeze(-1) * scale / dim_t
    return torch.stack((pos_res.sin(), pos_res.cos()), dim=-1).flatten(-2).flatten(-2)


class PositionRelationEmbedding(nn.Module):
    def __init__(self, embed_dim=256, num_heads=8, temperature=10000.0, scale=100.0):
        super().__init__()
        # torchvision Conv2dNormActivation(embed_dim * 4, num_heads, kernel_size=1, norm_layer=None, ReLU)
        self.pos_proj = nn.Sequential(nn.Conv2d(embed_dim * 4, num_heads, 1, bias=True), nn.ReLU(inplace=True))
        self.embed_dim, self.temperature, self.scale = embed_dim, temperature, scale

    def forward(self, src_boxes, tgt_boxes=None):
        if tgt_boxes is None:
            tgt_boxes = src_boxes
        with torch.no_grad():
            pos_embed = box_rel_encoding(src_boxes, tgt_boxes)
            pos_embed = get_sine_pos_embed(pos_embed, self.embed_dim, self.temperature, self.scale).permute(0, 3, 1, 2)
        return self.pos_proj(pos_embed).clone()


class RelationDecoderSelfAttention(nn.Module):
    def __init__(self, embed_dim, n_heads):
        super().__init__()
        self.num_heads = n_heads
        self.self_attn = nn.MultiheadAttention(embed_dim, n_heads, dropout=0.0, batch_first=True)
        self.position_relation_embedding = PositionRelationEmbedding(16, n_heads)

    def forward(self, query, query_pos, src_boxes, tgt_boxes, attn_mask=None):
        pos_relation = self.position_relation_embedding(src_boxes, tgt_boxes).flatten(0, 1)
        if attn_mask is not None:
            pos_relation.masked_fill_(attn_mask, float("-inf"))
        query_with_pos = key_with_pos = query + query_pos
        return self.self_attn(query=query_with_pos, key=key_with_pos, value=query, attn_mask=pos_relation,
                              need_weights=False)[0]


# AliSerwat/duoformer_TCGA@3b207c2 models/multiscale_attn.py: MultiScaleAttention (the authors' release of
# xiaoyatang/DuoFormer), on timm 0.9's vision_transformer.Attention (qkv, q_norm/k_norm = Identity, proj;
# the unfused path). Dropout omitted; upstream hard-codes 50 tokens (49 patches + CLS) in
# forward_with_region's reshapes, here the token count is the input's.
class TimmAttention(nn.Module):  # timm 0.9.16 Attention, qk_norm=False
    def __init__(self, dim, num_heads=8, qkv_bias=False):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.q_norm = self.k_norm = nn.Identity()
        self.proj = nn.Linear(dim, dim)


class MultiScaleAttention(TimmAttention):
    def __init__(self, dim, num_heads=8, qkv_bias=False):
        super().__init__(dim, num_heads, qkv_bias)
        self.scale = 2 * dim ** -0.5
        self.qkv1 = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj1 = nn.Linear(dim, dim)

    def forward_with_scale(self, x):
        B, num_regions, num_scales, C = x.shape
        qkv = self.qkv1(x).reshape(B, num_regions, num_scales, 3, self.num_heads, self.head_dim).permute(3, 0, 1, 4, 2, 5)
        q, k, v = qkv[0], qkv[1], qkv[2]
        attn = ((q @ k.transpose(-2, -1)) * self.scale).softmax(dim=-1)
        return self.proj1((attn @ v).transpose(2, 3).reshape(B, num_regions, num_scales, C))

    def forward_with_region(self, x, cls_token=None, pos_embed=None, pos_drop=None):
        B = x.shape[0]
        scaled_x = x[:, :, 0, :] if len(x.size()) > 3 else x
        if cls_token is not None:
            scaled_x = torch.cat((cls_token.squeeze(1), scaled_x), dim=1)
        if pos_embed is not None:
            scaled_x = pos_drop(scaled_x + pos_embed)
        n_tokens = scaled_x.shape[1]
        qkv1 = self.qkv(scaled_x).reshape(B, n_tokens, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q1, k1, v1 = qkv1[0], qkv1[1], qkv1[2]
        attn1 = ((q1 @ k1.transpose(-2, -1)) * self.scale).softmax(dim=-1)
        return self.proj((attn1 @ v1).transpose(1, 2).reshape(B, n_tokens, -1))


# huggingface/pytorch-image-models@f63d2e8 timm/models/dependencyvit.py: ReversedAttention (qk_norm=False),
# with timm.layers.Mlp (fc1, act, fc2; no norm); dropout omitted
class TimmMlp(nn.Module):  # timm.layers.Mlp
    def __init__(self, in_features, hidden_features=None, out_features=None, bias=True):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features or in_features, bias=bias)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_features or in_features, out_features or in_features, bias=bias)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class ReversedAttention(nn.Module):
    def __init__(self, dim, num_heads=8, qkv_bias=False):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.head_selector_temperature = 0.1
        self.head_selector = nn.Linear(dim, num_heads, bias=False)
        self.message_controller = TimmMlp(dim, int(dim / 2), 1, bias=False)
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x, m):
        B, N, C = x.shape
        q, k, v = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        p = (self.head_selector(x) / self.head_selector_temperature).softmax(dim=-1)
        p = p.transpose(-2, -1).reshape(B, self.num_heads, 1, N)
        m = m * self.message_controller(x).sigmoid().reshape(B, 1, 1, N)
        attn = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1).transpose(-2, -1)
        attn = attn * p * m
        x = (attn @ v).transpose(1, 2).reshape(B, N, C)
        return self.proj(x), m, m.detach().reshape(B, N)


# facebookresearch/adaptive-span@27b815f persistent_memory.py: PersistentMemory; models.py: _skew, _unskew,
# SeqAttention, MultiHeadSeqAttention (adapt_span_enabled=False; dropout omitted)
class PersistentMemory(nn.Module):
    def __init__(self, size, nb_heads, head_dim):
        super().__init__()
        self.size, self.nb_heads, self.head_dim = size, nb_heads, head_dim
        self.key = nn.Parameter(torch.randn(nb_heads, head_dim, size) / math.sqrt(head_dim))
        self.val = nn.Parameter(torch.randn(nb_heads, size, head_dim) / math.sqrt(size))

    def forward(self, query, attn):
        key, val = self.key.unsqueeze(0), self.val.unsqueeze(0)
        query = query.view((-1, self.nb_heads) + query.size()[1:])
        attn_pers = torch.matmul(query, key * math.sqrt(self.head_dim))
        attn_pers = attn_pers.view((-1,) + attn_pers.size()[2:])
        attn = F.softmax(torch.cat((attn, attn_pers), dim=-1) / math.sqrt(self.head_dim), dim=-1)
        attn_pers, attn = attn[:, :, -key.size(-1):], attn[:, :, :-key.size(-1)]
        attn_pers = attn_pers.view((-1, self.nb_heads) + attn_pers.size()[1:])
        out = torch.matmul(attn_pers, val * math.sqrt(self.size))
        return attn, out.view((-1,) + out.size()[2:])


def _skew(X, pad_value):
    B, M, L = X.size()
    return F.pad(X, (0, M + 1), value=pad_value).view(B, -1)[:, :-M].view(B, M, M + L)


def _unskew(X):
    B, M, L = X.size()
    L -= M
    return F.pad(X.view(B, -1), (0, M)).view(B, M, M + L + 1)[:, :, :L]


class SeqAttention(nn.Module):
    def __init__(self, hidden_size, nb_heads, attn_span, pers_mem_size):
        super().__init__()
        self.hidden_size, self.attn_span = hidden_size, attn_span
        self.persistent_memory = PersistentMemory(pers_mem_size, nb_heads, hidden_size) if pers_mem_size > 0 else None

    def forward(self, query, key, value, key_pe):
        attn = _unskew(torch.matmul(query, key.transpose(-1, -2))) + torch.matmul(query, key_pe)
        if self.persistent_memory is not None:
            attn, pers_mem_out = self.persistent_memory(query, attn)
        else:
            attn = F.softmax(attn / math.sqrt(self.hidden_size), dim=-1)
        out = torch.matmul(_skew(attn, 0), value)
        return out + pers_mem_out if self.persistent_memory is not None else out


class MultiHeadSeqAttention(nn.Module):
    def __init__(self, hidden_size, nb_heads, attn_span, pers_mem_size):
        super().__init__()
        self.nb_heads, self.head_dim = nb_heads, hidden_size // nb_heads
        self.attn = SeqAttention(self.head_dim, nb_heads, attn_span, pers_mem_size)
        self.proj_query = nn.Linear(hidden_size, hidden_size, bias=False)
        self.proj_out = nn.Linear(hidden_size, hidden_size, bias=False)
        self.proj_val = nn.Linear(hidden_size, hidden_size, bias=False)
        self.proj_key = nn.Linear(hidden_size, hidden_size, bias=False)

    def head_reshape(self, x):
        x = x.view(x.size()[:-1] + (self.nb_heads, self.head_dim)).transpose(1, 2).contiguous()
        return x.view(-1, x.size(-2), x.size(-1))

    def forward(self, query, key, value, key_pe):
        B, M = query.size(0), query.size(1)
        query = self.head_reshape(self.proj_query(query))
        value = self.head_reshape(self.proj_val(value))
        key = self.head_reshape(self.proj_key(key))
        out = self.attn(query, key, value, key_pe).view(B, self.nb_heads, M, self.head_dim)
        return self.proj_out(out.transpose(1, 2).contiguous().view(B, M, -1))


# facebookresearch/ParlAI@a29567f parlai/agents/transformer/modules/attention.py: BasicAttention;
# parlai/agents/transformer/polyencoder.py: PolyBasicAttention, PolyEncoderModule (polyencoder_type="codes",
# basic/sqrt attentions). The float32 cast of BasicAttention's softmax is removed; the encoders
# (encoder_ctxt, encoder_cand: TransformerEncoders) are outside the record and left out: encode's code
# attention is called through attend() on the context encoder's output, as encode() does.
class BasicAttention(nn.Module):
    def __init__(self, dim=1, attn="cosine", residual=False, get_weights=True):
        super().__init__()
        if attn == "cosine":
            self.cosine = nn.CosineSimilarity(dim=dim)
        self.attn, self.dim, self.get_weights, self.residual = attn, dim, get_weights, residual

    def forward(self, xs, ys, mask_ys=None, values=None):
        bsz, y_len, x_len = xs.size(0), ys.size(1), xs.size(1)
        if self.attn == "cosine":
            l1 = self.cosine(xs, ys).unsqueeze(self.dim - 1)
        else:
            l1 = torch.bmm(xs, ys.transpose(1, 2))
            if self.attn == "sqrt":
                l1 = l1 / math.sqrt(ys.size(-1))
        if mask_ys is not None:
            attn_mask = (mask_ys == 0).view(bsz, 1, y_len).repeat(1, x_len, 1)
            l1.masked_fill_(attn_mask, -65504 if l1.dtype is torch.float16 else -1e20)
        l2 = F.softmax(l1, dim=self.dim)
        lhs_emb = torch.bmm(l2, ys if values is None else values)
        if self.residual:
            lhs_emb = lhs_emb.add(xs)
        return (lhs_emb.squeeze(self.dim - 1), l2) if self.get_weights else lhs_emb.squeeze(self.dim - 1)


class PolyBasicAttention(BasicAttention):
    def __init__(self, poly_type, n_codes, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.poly_type, self.n_codes = poly_type, n_codes

    def forward(self, *args, **kwargs):
        lhs_emb = super().forward(*args, **kwargs)
        if self.poly_type == "codes" and self.n_codes == 1 and len(lhs_emb.shape) == 2:
            lhs_emb = lhs_emb.unsqueeze(self.dim - 1)
        return lhs_emb


class PolyEncoderModule(nn.Module):
    def __init__(self, n_codes, embed_dim, codes_attention_type="basic", poly_attention_type="basic"):
        super().__init__()
        self.type, self.n_codes = "codes", n_codes
        self.attention_type, self.codes_attention_type = poly_attention_type, codes_attention_type
        self.codes = nn.Parameter(torch.nn.init.uniform_(torch.empty(n_codes, embed_dim)))
        self.code_attention = PolyBasicAttention("codes", n_codes, dim=2, attn=codes_attention_type, get_weights=False)
        self.attention = PolyBasicAttention("codes", n_codes, dim=2, attn=poly_attention_type, get_weights=False)

    def attend(self, attention_layer, queries, keys, values, mask):
        if keys is None:
            keys = values
        return attention_layer(queries, keys, mask_ys=mask, values=values)

    def score(self, ctxt_rep, ctxt_rep_mask, cand_embed):
        ctxt_final_rep = self.attend(self.attention, cand_embed, ctxt_rep, ctxt_rep, ctxt_rep_mask)
        return torch.sum(ctxt_final_rep * cand_embed, 2)


# Awni00/abstract_transformer@b7da583 attention.py: Attention (SDPA path); relational_attention.py:
# RelationalAttention (rel_activation identity); dual_attention.py: DualAttention (ra_type relational_attention);
# symbol_retrieval.py: SymbolicAttention, PositionalSymbolRetriever, PositionRelativeSymbolRetriever;
# positional_encoding.py: RelativePositionalEncoding; attention_utils.py: repeat_kv, compute_causal_mask.
# Dropout omitted, no RoPE (freqs None); einops.rearrange written as view/permute.
# DualAttentionWithRetriever is a test holder: the model's symbol_retriever beside the layer's two branches.
def repeat_kv(x, n_rep):
    bs, slen, n_kv_heads, head_dim = x.shape
    if n_rep == 1:
        return x
    return x[:, :, :, None, :].expand(bs, slen, n_kv_heads, n_rep, head_dim).reshape(bs, slen, n_kv_heads * n_rep,
                                                                                        head_dim)


class AbstractAttention(nn.Module):  # upstream name: Attention
    def __init__(self, d_model, n_heads, dropout=0.0, n_kv_heads=None, add_bias_kv=False, add_bias_out=False,
                 total_n_heads=None):
        super().__init__()
        self.n_heads = n_heads
        self.n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        self.total_n_heads = n_heads if total_n_heads is None else total_n_heads
        self.key_dim = self.head_dim = d_model // self.total_n_heads
        self.n_rep_kv = self.n_heads // self.n_kv_heads
        self.attn_scale = 1 / math.sqrt(self.head_dim)
        self.wq = nn.Linear(d_model, self.n_heads * self.key_dim, bias=False)
        self.wk = nn.Linear(d_model, self.n_kv_heads * self.key_dim, bias=add_bias_kv)
        self.wv = nn.Linear(d_model, self.n_kv_heads * self.head_dim, bias=add_bias_kv)
        self.wo = nn.Linear(self.n_heads * self.head_dim, self.n_heads * self.head_dim, bias=add_bias_out)

    def forward(self, query, key, value, attn_mask=None, is_causal=False):
        bsz, qseqlen, _ = query.shape
        xq = self.wq(query).view(bsz, qseqlen, self.n_heads, self.key_dim)
        xk = self.wk(key).view(bsz, key.shape[1], self.n_kv_heads, self.key_dim)
        xv = self.wv(value).view(bsz, value.shape[1], self.n_kv_heads, self.head_dim)
        xk, xv = repeat_kv(xk, self.n_rep_kv), repeat_kv(xv, self.n_rep_kv)
        output = F.scaled_dot_product_attention(xq.transpose(1, 2), xk.transpose(1, 2), xv.transpose(1, 2),
                                                attn_mask=attn_mask, is_causal=is_causal, scale=self.attn_scale)
        return self.wo(output.transpose(1, 2).contiguous().view(bsz, qseqlen, -1)), None


class RelationalAttention(nn.Module):
    def __init__(self, d_model, n_heads, n_relations=None, dropout=0.0, n_kv_heads=None, add_bias_kv=False,
                 add_bias_out=False, total_n_heads=None, symmetric_rels=False, use_relative_positional_symbols=False):
        super().__init__()
        self.n_heads = n_heads
        self.n_relations = n_relations if n_relations is not None else n_heads
        self.n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        self.symmetric_rels = symmetric_rels
        self.use_relative_positional_symbols = use_relative_positional_symbols
        self.total_n_heads = n_heads if total_n_heads is None else total_n_heads
        self.head_dim = d_model // self.total_n_heads
        self.n_rep_kv = self.n_heads // self.n_kv_heads
        self.key_dim = self.head_dim
        self.rel_proj_dim = self.head_dim * self.n_heads // self.n_relations
        assert self.rel_proj_dim * self.n_relations == self.head_dim * self.n_heads
        self.attn_scale, self.rel_scale = 1 / math.sqrt(self.head_dim), 1 / math.sqrt(self.rel_proj_dim)
        self.wq_attn = nn.Linear(d_model, self.n_heads * self.key_dim, bias=False)
        self.wk_attn = nn.Linear(d_model, self.n_kv_heads * self.key_dim, bias=add_bias_kv)
        self.wq_rel = nn.Linear(d_model, self.n_relations * self.rel_proj_dim, bias=False)
        self.wk_rel = self.wq_rel if symmetric_rels else nn.Linear(d_model, self.n_relations * self.rel_proj_dim,
                                                                   bias=False)
        self.wr = nn.Parameter(torch.empty(self.n_heads, self.head_dim, self.n_relations))
        torch.nn.init.kaiming_uniform_(self.wr, a=math.sqrt(5))
        self.wv = nn.Linear(d_model, self.n_kv_heads * self.head_dim, bias=add_bias_kv)
        self.wo = nn.Linear(self.n_heads * self.head_dim, self.n_heads * self.head_dim, bias=add_bias_out)

    def forward(self, x, symbols, attn_mask=None, is_causal=False):
        bsz, seqlen, _ = x.shape
        xq_attn = self.wq_attn(x).view(bsz, seqlen, self.n_heads, -1)
        xk_attn = repeat_kv(self.wk_attn(x).view(bsz, seqlen, self.n_kv_heads, -1), self.n_rep_kv)
        xq_attn, xk_attn = xq_attn.transpose(1, 2), xk_attn.transpose(1, 2)
        if is_causal and attn_mask is None:
            attn_mask = torch.tril(torch.ones(seqlen, seqlen)).bool()
        attn_scores = torch.matmul(xq_attn, xk_attn.transpose(2, 3)) * self.attn_scale
        if attn_mask is not None:
            attn_scores = attn_scores + torch.zeros(seqlen, seqlen, dtype=xq_attn.dtype).masked_fill(
                attn_mask.logical_not(), float("-inf"))
        attn_scores = nn.functional.softmax(attn_scores, dim=-1)
        xq_rel = self.wq_rel(x).view(bsz, seqlen, self.n_relations, -1).transpose(1, 2)
        xk_rel = self.wk_rel(x).view(bsz, seqlen, self.n_relations, -1).transpose(1, 2)
        sv = self.wv(symbols)
        sv = repeat_kv(sv.view(sv.shape[0], sv.shape[1], self.n_kv_heads, self.head_dim), self.n_rep_kv)
        relations = (torch.matmul(xq_rel, xk_rel.transpose(2, 3)) * self.rel_scale).permute(0, 2, 3, 1)
        if not self.use_relative_positional_symbols:
            attended_symbols = torch.einsum("bhij,bjhd->bihd", attn_scores, sv)
        else:
            attended_symbols = torch.einsum("bhij,ijhd->bihd", attn_scores, sv)
        attended_relations = torch.einsum("bhij,bijr->bihr", attn_scores, relations)
        output = attended_symbols + torch.einsum("bihr,hdr->bihd", attended_relations, self.wr)
        return self.wo(output.reshape(bsz, seqlen, -1)), attn_scores, relations


class DualAttention(nn.Module):
    def __init__(self, d_model, n_heads_sa, n_heads_ra, dropout=0.0, sa_kwargs=None, ra_kwargs=None):
        super().__init__()
        self.n_heads_sa, self.n_heads_ra = n_heads_sa, n_heads_ra
        self.use_self_attn, self.use_rel_attn = n_heads_sa > 0, n_heads_ra > 0
        total = n_heads_sa + n_heads_ra
        if self.use_self_attn:
            self.self_attention = AbstractAttention(d_model, n_heads_sa, total_n_heads=total, **(sa_kwargs or {}))
        if self.use_rel_attn:
            self.relational_attention = RelationalAttention(d_model, n_heads_ra, total_n_heads=total,
                                                            **(ra_kwargs or {}))

    def forward(self, x, symbols, attn_mask=None, is_causal=False):
        outs = []
        if self.use_self_attn:
            outs.append(self.self_attention(query=x, key=x, value=x, attn_mask=attn_mask, is_causal=is_causal)[0])
        if self.use_rel_attn:
            outs.append(self.relational_attention(x, symbols, attn_mask=attn_mask, is_causal=is_causal)[0])
        return torch.concat(outs, dim=-1), None, None


class SymbolicAttention(nn.Module):
    def __init__(self, d_model, n_heads, n_symbols, scale=None):
        super().__init__()
        self.d_model, self.n_heads, self.n_symbols, self.scale = d_model, n_heads, n_symbols, scale
        self.q_proj = nn.Linear(d_model, d_model)
        self.template_features = nn.Parameter(torch.randn(n_symbols, d_model))
        self.symbol_library = nn.Parameter(torch.randn(n_symbols, d_model))

    def forward(self, x):
        batch_size, seq_len, dim = x.size()
        query = self.q_proj(x).view(batch_size, seq_len, self.n_heads, dim // self.n_heads).transpose(1, 2)
        key = self.template_features.view(self.n_symbols, self.n_heads, -1).transpose(0, 1)
        value = self.symbol_library.view(self.n_symbols, self.n_heads, -1).transpose(0, 1)
        key, value = (t.unsqueeze(0).repeat(batch_size, 1, 1, 1) for t in (key, value))
        out = F.scaled_dot_product_attention(query, key, value, scale=self.scale)
        return out.transpose(1, 2).contiguous().view(batch_size, seq_len, dim)


class PositionalSymbolRetriever(nn.Module):
    def __init__(self, symbol_dim, max_length):
        super().__init__()
        self.symbol_library = nn.Embedding(max_length, symbol_dim)

    def forward(self, x):
        pos = torch.arange(0, x.shape[1], dtype=torch.long)
        return self.symbol_library(pos).unsqueeze(0).repeat(x.shape[0], 1, 1)


class RelativePositionalEncoding(nn.Module):
    def __init__(self, dim, max_rel_pos):
        super().__init__()
        self.max_relative_position = max_rel_pos
        self.rel_pos_embeddings = nn.Parameter(torch.empty(max_rel_pos * 2 + 1, dim))
        nn.init.xavier_uniform_(self.rel_pos_embeddings)

    def forward(self, length_q, length_k=None):
        length_k = length_q if length_k is None else length_k
        distance_mat = torch.arange(length_k)[None, :] - torch.arange(length_q)[:, None]
        clipped = torch.clamp(distance_mat, -self.max_relative_position, self.max_relative_position)
        return self.rel_pos_embeddings[clipped + self.max_relative_position]


class PositionRelativeSymbolRetriever(nn.Module):
    def __init__(self, symbol_dim, max_rel_pos):
        super().__init__()
        self.rel_pos_enc = RelativePositionalEncoding(symbol_dim, max_rel_pos)

    def forward(self, x):
        return self.rel_pos_enc(x.shape[1])


class DualAttentionWithRetriever(DualAttention):
    def __init__(self, symbol_retriever, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.symbol_retriever = symbol_retriever

    def forward(self, x, is_causal=False):
        return super().forward(x, self.symbol_retriever(x), is_causal=is_causal)[0]


# huggingface/transformers@v4.46.3 src/transformers/models/bert/modeling_bert.py: BertSelfAttention (eager,
# self-attention, no past_key_value; position_embedding_type "relative_key_query" / "relative_key"); dropout
# omitted; config fields as constructor arguments
class BertSelfAttention(nn.Module):
    def __init__(self, hidden_size, num_attention_heads, max_position_embeddings,
                 position_embedding_type="relative_key_query"):
        super().__init__()
        self.num_attention_heads = num_attention_heads
        self.attention_head_size = hidden_size // num_attention_heads
        self.all_head_size = self.num_attention_heads * self.attention_head_size
        self.query = nn.Linear(hidden_size, self.all_head_size)
        self.key = nn.Linear(hidden_size, self.all_head_size)
        self.value = nn.Linear(hidden_size, self.all_head_size)
        self.position_embedding_type = position_embedding_type
        self.max_position_embeddings = max_position_embeddings
        self.distance_embedding = nn.Embedding(2 * max_position_embeddings - 1, self.attention_head_size)

    def transpose_for_scores(self, x):
        return x.view(x.size()[:-1] + (self.num_attention_heads, self.attention_head_size)).permute(0, 2, 1, 3)

    def forward(self, hidden_states, attention_mask=None):
        query_layer = self.transpose_for_scores(self.query(hidden_states))
        key_layer = self.transpose_for_scores(self.key(hidden_states))
        value_layer = self.transpose_for_scores(self.value(hidden_states))
        attention_scores = torch.matmul(query_layer, key_layer.transpose(-1, -2))
        query_length, key_length = query_layer.shape[2], key_layer.shape[2]
        position_ids_l = torch.arange(query_length, dtype=torch.long).view(-1, 1)
        position_ids_r = torch.arange(key_length, dtype=torch.long).view(1, -1)
        distance = position_ids_l - position_ids_r
        positional_embedding = self.distance_embedding(distance + self.max_position_embeddings - 1)
        positional_embedding = positional_embedding.to(dtype=query_layer.dtype)
        if self.position_embedding_type == "relative_key":
            attention_scores = attention_scores + torch.einsum("bhld,lrd->bhlr", query_layer, positional_embedding)
        elif self.position_embedding_type == "relative_key_query":
            attention_scores = (attention_scores + torch.einsum("bhld,lrd->bhlr", query_layer, positional_embedding)
                                + torch.einsum("bhrd,lrd->bhlr", key_layer, positional_embedding))
        attention_scores = attention_scores / math.sqrt(self.attention_head_size)
        if attention_mask is not None:
            attention_scores = attention_scores + attention_mask
        context_layer = torch.matmul(nn.functional.softmax(attention_scores, dim=-1), value_layer)
        context_layer = context_layer.permute(0, 2, 1, 3).contiguous()
        return (context_layer.view(context_layer.size()[:-2] + (self.all_head_size,)),)


# Strawberry-Eat-Mango/PCT_Pytorch@471ad3a model.py: SA_Layer (q_conv's weight tied to k_conv's, as upstream)
class SA_Layer(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.q_conv = nn.Conv1d(channels, channels // 4, 1, bias=False)
        self.k_conv = nn.Conv1d(channels, channels // 4, 1, bias=False)
        self.q_conv.weight = self.k_conv.weight
        self.q_conv.bias = self.k_conv.bias
        self.v_conv = nn.Conv1d(channels, channels, 1)
        self.trans_conv = nn.Conv1d(channels, channels, 1)
        self.after_norm = nn.BatchNorm1d(channels)
        self.act = nn.ReLU()
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, x):
        x_q = self.q_conv(x).permute(0, 2, 1)
        x_k = self.k_conv(x)
        x_v = self.v_conv(x)
        attention = self.softmax(torch.bmm(x_q, x_k))
        attention = attention / (1e-9 + attention.sum(dim=1, keepdim=True))
        x_r = torch.bmm(x_v, attention)
        return x + self.act(self.after_norm(self.trans_conv(x - x_r)))


# wuw2135/ReflexSplit@268c213 models/arch/reflexsplit.py: DifferentialDualStreamAttention (forward_sa, forward_ca;
# lambda_init_fn's value is unused by both and left out; dropout omitted)
class DifferentialDualStreamAttention(nn.Module):
    def __init__(self, dim, window_size, num_heads, depth=1, qkv_bias=True, qk_scale=None):
        super().__init__()
        self.dim, self.window_size, self.num_heads = dim, window_size, num_heads
        self.head_dim = dim // num_heads
        self.scale = qk_scale or self.head_dim ** -0.5
        self.lambda_sa = nn.Parameter(torch.tensor(0.1))
        self.lambda_ca = nn.Parameter(torch.tensor(0.1))
        self.sa_qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.sa_cross_trans_proj = nn.Linear(dim, dim, bias=False)
        self.sa_cross_refl_proj = nn.Linear(dim, dim, bias=False)
        self.sa_enhance_weight = nn.Parameter(torch.tensor(0.1))
        self.ca_q = nn.Linear(dim, dim, bias=qkv_bias)
        self.ca_kv = nn.Linear(dim, dim * 2, bias=qkv_bias)
        self.ca_cross_trans_proj = nn.Linear(dim, dim, bias=False)
        self.ca_cross_refl_proj = nn.Linear(dim, dim, bias=False)
        self.ca_enhance_weight = nn.Parameter(torch.tensor(0.1))
        self.relative_position_bias_table = nn.Parameter(
            0.02 * torch.randn((2 * window_size[0] - 1) * (2 * window_size[1] - 1), num_heads))
        self.register_buffer("relative_position_index", _swin_relative_position_index(*window_size))
        self.proj_sa = nn.Linear(dim, dim)
        self.proj_ca = nn.Linear(dim, dim)
        self.softmax = nn.Softmax(dim=-1)

    def _bias(self, N):
        table = self.relative_position_bias_table[self.relative_position_index.view(-1)]
        return table.view(N, N, -1).permute(2, 0, 1).contiguous().unsqueeze(0)

    def _diff(self, q_t, k_t, v_t, q_r, k_r, v_r, lam, proj, B, N, C):
        attn_t = self.softmax((q_t * self.scale) @ k_t.transpose(-2, -1) + self._bias(N))
        attn_r = self.softmax((q_r * self.scale) @ k_r.transpose(-2, -1) + self._bias(N))
        lam = torch.clamp(torch.sigmoid(lam), 0.01, 0.99)
        out_t = ((attn_t - lam * attn_r) @ v_t).transpose(1, 2).reshape(B, N, C)
        out_r = ((attn_r - lam * attn_t) @ v_r).transpose(1, 2).reshape(B, N, C)
        return proj(out_t), proj(out_r)

    def forward_sa(self, x_concat):
        B2, N, C = x_concat.shape
        B = B2 // 2
        x_t, x_r = x_concat[:B], x_concat[B:]
        t_e = x_t + self.sa_enhance_weight * self.sa_cross_refl_proj(x_r)
        r_e = x_r + self.sa_enhance_weight * self.sa_cross_trans_proj(x_t)
        qkv_t = self.sa_qkv(t_e).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        qkv_r = self.sa_qkv(r_e).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        out_t, out_r = self._diff(qkv_t[0], qkv_t[1], qkv_t[2], qkv_r[0], qkv_r[1], qkv_r[2], self.lambda_sa,
                                  self.proj_sa, B, N, C)
        return torch.cat([out_t, out_r], dim=0)

    def forward_ca(self, x_concat):
        B, N2, C = x_concat.shape
        N = N2 // 2
        x_t, x_r = x_concat[:, :N, :], x_concat[:, N:, :]
        t_e = x_t + self.ca_enhance_weight * self.ca_cross_refl_proj(x_r)
        r_e = x_r + self.ca_enhance_weight * self.ca_cross_trans_proj(x_t)
        q_t = self.ca_q(t_e).reshape(B, N, self.num_heads, self.head_dim).permute(0, 2, 1, 3)
        q_r = self.ca_q(r_e).reshape(B, N, self.num_heads, self.head_dim).permute(0, 2, 1, 3)
        kv = self.ca_kv(torch.cat([t_e, r_e], dim=-2)).reshape(B, N2, 2, self.num_heads, self.head_dim)
        k, v = kv.permute(2, 0, 3, 1, 4)
        out_t, out_r = self._diff(q_t, k[:, :, :N], v[:, :, :N], q_r, k[:, :, N:], v[:, :, N:], self.lambda_ca,
                                  self.proj_ca, B, N, C)
        return torch.cat([out_t, out_r], dim=-2)
