"""PyTorch modules written from the upstream files that ``refattn/interop/torch_specs_blocks_b.py`` maps,
for ``tests/test_interop_blocks_b.py``: compact re-statements (not copies), upstream parameter names and
shapes, float64-clean. Each is headed by its ``owner/repo@commit path: Class`` and its deviations; dropout
is omitted everywhere (eval mode).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

# huggingface/pytorch-image-models@aa4b585 timm/layers/patch_embed.py: PatchEmbed, and
# timm/models/vision_transformer.py: VisionTransformer._pos_embed (the embedding part of the ViT only:
# patch_embed, cls_token, pos_embed; pos_drop omitted, no dynamic_img_size)


class PatchEmbed(nn.Module):
    def __init__(self, patch_size, in_chans, embed_dim, norm=False, bias=True, dynamic_img_pad=False):
        super().__init__()
        self.patch_size = tuple(patch_size)
        self.dynamic_img_pad = dynamic_img_pad
        self.proj = nn.Conv2d(in_chans, embed_dim, kernel_size=self.patch_size, stride=self.patch_size, bias=bias)
        self.norm = nn.LayerNorm(embed_dim, eps=1e-6) if norm else nn.Identity()

    def forward(self, x):
        h, w = x.shape[-2:]
        if self.dynamic_img_pad:
            x = F.pad(x, (0, (self.patch_size[1] - w % self.patch_size[1]) % self.patch_size[1],
                          0, (self.patch_size[0] - h % self.patch_size[0]) % self.patch_size[0]))
        x = self.proj(x).flatten(2).transpose(1, 2)  # NCHW -> NLC
        return self.norm(x)


class ViTEmbedding(nn.Module):
    def __init__(self, num_patches, patch_size=(2, 3), in_chans=3, embed_dim=6, class_token=True,
                 no_embed_class=False, patch_norm=False, dynamic_img_pad=False, bias=True):
        super().__init__()
        self.patch_embed = PatchEmbed(patch_size, in_chans, embed_dim, patch_norm, bias, dynamic_img_pad)
        self.has_class_token = class_token
        self.no_embed_class = no_embed_class
        self.num_prefix_tokens = 1 if class_token else 0
        self.cls_token = nn.Parameter(torch.zeros(1, 1, embed_dim)) if class_token else None
        length = num_patches if no_embed_class else num_patches + self.num_prefix_tokens
        self.pos_embed = nn.Parameter(torch.randn(1, length, embed_dim) * .02)
        if class_token:
            nn.init.normal_(self.cls_token, std=1e-6)

    def _pos_embed(self, x):
        to_cat = [self.cls_token.expand(x.shape[0], -1, -1)] if self.cls_token is not None else []
        if self.no_embed_class:
            x = x + self.pos_embed
            if to_cat:
                x = torch.cat(to_cat + [x], dim=1)
        else:
            if to_cat:
                x = torch.cat(to_cat + [x], dim=1)
            x = x + self.pos_embed
        return x

    def forward(self, x):
        return self._pos_embed(self.patch_embed(x))


# sail-sg/poolformer@a075575 models/poolformer.py: PoolFormerBlock (with Pooling, GroupNorm, Mlp; DropPath and
# dropout omitted)


class PoolFormerBlock(nn.Module):
    def __init__(self, dim, pool_size=3, mlp_ratio=4., use_layer_scale=True, layer_scale_init_value=1e-5):
        super().__init__()
        self.norm1 = nn.GroupNorm(1, dim)
        self.token_mixer = nn.Module()
        self.token_mixer.pool = nn.AvgPool2d(pool_size, stride=1, padding=pool_size // 2, count_include_pad=False)
        self.norm2 = nn.GroupNorm(1, dim)
        self.mlp = nn.Module()
        self.mlp.fc1 = nn.Conv2d(dim, int(dim * mlp_ratio), 1)
        self.mlp.fc2 = nn.Conv2d(int(dim * mlp_ratio), dim, 1)
        self.use_layer_scale = use_layer_scale
        if use_layer_scale:
            self.layer_scale_1 = nn.Parameter(layer_scale_init_value * torch.ones(dim))
            self.layer_scale_2 = nn.Parameter(layer_scale_init_value * torch.ones(dim))

    def forward(self, x):
        t = self.norm1(x)
        mix = self.token_mixer.pool(t) - t
        mlp = lambda u: self.mlp.fc2(F.gelu(self.mlp.fc1(u)))  # noqa: E731
        if self.use_layer_scale:
            x = x + self.layer_scale_1[:, None, None] * mix
            return x + self.layer_scale_2[:, None, None] * mlp(self.norm2(x))
        x = x + mix
        return x + mlp(self.norm2(x))


# apple/ml-fastvit@8af5928 models/fastvit.py: RepMixer, on models/modules/mobileone.py: MobileOneBlock (the branches
# RepMixer builds: groups=dim, no SE, no activation; reparameterize() not restated: inference_mode builds
# reparam_conv directly)


class MobileOneBlock(nn.Module):
    def __init__(self, dim, kernel_size, use_scale_branch=True, num_conv_branches=1):
        super().__init__()
        self.num_conv_branches = num_conv_branches
        self.rbr_skip = nn.BatchNorm2d(dim)
        self.rbr_conv = nn.ModuleList([self._conv_bn(dim, kernel_size) for _ in range(num_conv_branches)]) \
            if num_conv_branches > 0 else None
        self.rbr_scale = self._conv_bn(dim, 1) if kernel_size > 1 and use_scale_branch else None

    @staticmethod
    def _conv_bn(dim, k):
        mod = nn.Sequential()
        mod.add_module("conv", nn.Conv2d(dim, dim, k, padding=k // 2, groups=dim, bias=False))
        mod.add_module("bn", nn.BatchNorm2d(dim))
        return mod

    def forward(self, x):
        out = self.rbr_skip(x) + (self.rbr_scale(x) if self.rbr_scale is not None else 0)
        for i in range(self.num_conv_branches):
            out = out + self.rbr_conv[i](x)
        return out


class RepMixer(nn.Module):
    def __init__(self, dim, kernel_size=3, use_layer_scale=True, layer_scale_init_value=1e-5, inference_mode=False,
                 num_conv_branches=1):  # num_conv_branches: MobileOneBlock's (RepMixer leaves it at 1)
        super().__init__()
        self.dim, self.kernel_size, self.inference_mode = dim, kernel_size, inference_mode
        if inference_mode:
            self.reparam_conv = nn.Conv2d(dim, dim, kernel_size, padding=kernel_size // 2, groups=dim, bias=True)
        else:
            self.norm = MobileOneBlock(dim, kernel_size, use_scale_branch=False, num_conv_branches=0)
            self.mixer = MobileOneBlock(dim, kernel_size, num_conv_branches=num_conv_branches)
            self.use_layer_scale = use_layer_scale
            if use_layer_scale:
                self.layer_scale = nn.Parameter(layer_scale_init_value * torch.ones((dim, 1, 1)))

    def forward(self, x):
        if hasattr(self, "reparam_conv"):
            return self.reparam_conv(x)
        if self.use_layer_scale:
            return x + self.layer_scale * (self.mixer(x) - self.norm(x))
        return x + self.mixer(x) - self.norm(x)


# willding123/Shift-Equivariant-Vision-Transformers@c8cd2ef models/poly_utils.py: PolyPatchEmbed on PolyOrder.
# Deviations: PolyOrder's float32 casts are dropped, and its circular pad + nearest grid_sample + crop (an integer
# translation) is written as the torch.roll it equals, whose autograd is upstream's backward (the opposite roll).


def poly_order(x, patch_size):
    """PolyOrder.forward, invariance=False: roll the polyphase component of largest l2 norm to the origin."""
    b, c, h, w = x.shape
    p0, p1 = patch_size
    g = h // p0
    with torch.no_grad():
        tmp = x.reshape(b, c, g, p0, g, p1).permute(0, 1, 2, 4, 3, 5).reshape(b, c, g * g, p0 * p1)
        idx = torch.linalg.vector_norm(tmp.permute(0, 3, 1, 2), dim=(2, 3)).argmax(dim=1)
    px, py = idx // p0, idx % p1
    return torch.stack([torch.roll(x[i], (-int(px[i]), -int(py[i])), dims=(1, 2)) for i in range(b)])


class PolyPatchEmbed(nn.Module):
    def __init__(self, patch_size, in_chans, out_chans, norm_layer=None):
        super().__init__()
        self.patch_size = (patch_size, patch_size)
        self.proj = nn.Conv2d(in_chans, out_chans, kernel_size=patch_size, stride=patch_size, padding_mode="circular")
        self.norm = norm_layer(out_chans) if norm_layer else nn.Identity()

    def forward(self, x):
        x = poly_order(x, self.patch_size)
        return self.norm(self.proj(x).flatten(2).transpose(1, 2))


# pytorch/tutorials@0023ff0 intermediate_source/spatial_transformer_tutorial.py: Net.localization, Net.fc_loc,
# Net.stn (the classifier head omitted; layer sizes are arguments, the tutorial's are 1, 8, 10, 7, 5, 10*3*3, 32
# for 28x28 MNIST; stn's xs.view(-1, 10 * 3 * 3) is a flatten; grid_sample's options are arguments, the
# tutorial's are F.affine_grid/F.grid_sample defaults)


class SpatialTransformerNet(nn.Module):
    def __init__(self, c=1, c1=8, c2=10, k1=7, k2=5, features=10 * 3 * 3, hidden=32, padding_mode="zeros",
                 align_corners=False):
        super().__init__()
        self.localization = nn.Sequential(nn.Conv2d(c, c1, kernel_size=k1), nn.MaxPool2d(2, stride=2), nn.ReLU(True),
                                          nn.Conv2d(c1, c2, kernel_size=k2), nn.MaxPool2d(2, stride=2), nn.ReLU(True))
        self.fc_loc = nn.Sequential(nn.Linear(features, hidden), nn.ReLU(True), nn.Linear(hidden, 3 * 2))
        self.fc_loc[2].weight.data.zero_()
        self.fc_loc[2].bias.data.copy_(torch.tensor([1, 0, 0, 0, 1, 0], dtype=torch.float))
        self.padding_mode, self.align_corners = padding_mode, align_corners

    def stn(self, x):
        xs = self.localization(x)
        theta = self.fc_loc(xs.flatten(1)).view(-1, 2, 3)
        grid = F.affine_grid(theta, x.size(), align_corners=self.align_corners)
        return F.grid_sample(x, grid, padding_mode=self.padding_mode, align_corners=self.align_corners)


# zhuang-group/LIT@742e961 classification/code_for_lit_ti/patch_embed.py: DeformablePatchEmbed_GELU, with
# classification/code_for_lit_s_m_b/mm_modules/DCN/modules/deform_conv2d.py: DeformConv2dPack. Deviation: the DCN
# is a CUDA/C++ extension (deform_conv2d_func.py over src/cuda/deform_2d_im2col_cuda.cuh); its forward, the
# deformable im2col with dmcn_2d_im2col_bilinear's corner rules, is restated in torch and differentiated by autograd
# (the extension's backward is the same math's VJP). One deformable group, groups=1, dilation 1, as LIT uses it.
# The BatchNorm output's gradient is made contiguous (a hook): torch's CPU batch_norm backward misreads a
# transposed gradient at batch 1 (gradcheck of BatchNorm2d(...)(x).flatten(2).transpose(1, 2) fails).


def _dmcn_bilinear(img, h, w):
    """img (B, C, H, W), h, w (B, P) -> (B, C, P): zero when h <= -1 or h >= H (likewise w), a corner
    outside the image contributes 0 (dmcn_2d_im2col_bilinear and its caller's test)."""
    b, c, hh, ww = img.shape
    valid = (h > -1) & (w > -1) & (h < hh) & (w < ww)
    h0, w0 = torch.floor(h).long(), torch.floor(w).long()
    lh, lw = h - h0, w - w0
    flat = img.reshape(b, c, hh * ww)

    def corner(r, q):
        ok = (r >= 0) & (r <= hh - 1) & (q >= 0) & (q <= ww - 1)
        idx = r.clamp(0, hh - 1) * ww + q.clamp(0, ww - 1)
        return torch.gather(flat, 2, idx[:, None, :].expand(b, c, -1)) * ok[:, None, :]

    val = ((1 - lh) * (1 - lw))[:, None] * corner(h0, w0) + ((1 - lh) * lw)[:, None] * corner(h0, w0 + 1) \
        + (lh * (1 - lw))[:, None] * corner(h0 + 1, w0) + (lh * lw)[:, None] * corner(h0 + 1, w0 + 1)
    return val * valid[:, None, :]


def deform_conv2d_v1(x, offset, weight, bias, stride, padding):
    b, c, _, _ = x.shape
    co, _, kh, kw = weight.shape
    ho, wo = offset.shape[2:]
    cols = []
    for i in range(kh):
        for j in range(kw):
            t = i * kw + j  # offset channels 2t, 2t+1: row and column offsets of tap t
            h = (torch.arange(ho) * stride[0] - padding[0])[:, None] + i + offset[:, 2 * t]
            w = (torch.arange(wo) * stride[1] - padding[1])[None, :] + j + offset[:, 2 * t + 1]
            cols.append(_dmcn_bilinear(x, h.reshape(b, -1), w.reshape(b, -1)))
    y = torch.einsum("ock,bckp->bop", weight.reshape(co, c, -1), torch.stack(cols, 2)) + bias[None, :, None]
    return y.reshape(b, co, ho, wo)


class DeformConv2dPack(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride, padding):
        super().__init__()
        self.kernel_size, self.stride, self.padding = (kernel_size,) * 2, (stride,) * 2, (padding,) * 2
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels, *self.kernel_size))
        self.bias = nn.Parameter(torch.empty(out_channels))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        nn.init.uniform_(self.bias, -1 / math.sqrt(in_channels * kernel_size ** 2), 1 / math.sqrt(in_channels * kernel_size ** 2))
        self.conv_offset = nn.Conv2d(in_channels, 2 * kernel_size ** 2, kernel_size=kernel_size, stride=stride,
                                     padding=padding, bias=True)
        self.conv_offset.weight.data.zero_()
        self.conv_offset.bias.data.zero_()

    def forward(self, x):
        offset = self.conv_offset(x)
        return deform_conv2d_v1(x, offset, self.weight, self.bias, self.stride, self.padding), None


class DeformablePatchEmbed_GELU(nn.Module):  # noqa: N801 (upstream's name)
    def __init__(self, patch_size, in_chans, embed_dim):
        super().__init__()
        self.patch_size = (patch_size, patch_size)
        self.dconv = DeformConv2dPack(in_chans, embed_dim, kernel_size=patch_size, stride=patch_size, padding=0)
        self.norm_layer = nn.BatchNorm2d(embed_dim)
        self.act_layer = nn.GELU()

    def forward(self, x):
        _, _, h, w = x.shape
        x, _ = self.dconv(x)
        x = self.norm_layer(x)
        if x.requires_grad:  # torch 2.x CPU batch_norm backward is wrong for a transposed (non-contiguous)
            x.register_hook(lambda g: g.contiguous())  # incoming gradient at batch 1; upstream runs on CUDA
        x = self.act_layer(x).flatten(2).transpose(1, 2)
        return x, (h // self.patch_size[0], w // self.patch_size[1])


# SamuelCahyawijaya/greenformer@2f81f96 src/py_auto_fact/lr_module.py: LED (no deviation)


class LED(nn.Module):
    def __init__(self, in_features, out_features, r, bias=True):
        super().__init__()
        self.led_unit = nn.Sequential(nn.Linear(in_features, r, bias=False), nn.Linear(r, out_features, bias=bias))

    def forward(self, inputs):
        return self.led_unit(inputs)


# zeyuliu1037/LMUFormer@5debadd src/blocks/lmu.py: LMU, on src/blocks/lmu_cell.py: LMUFFTCell. Deviations: the
# discretised A, B stay float64 (upstream casts them to float32); upstream needs N == seq_len (fft_H has
# seq_len + 1 bins), here the cell takes N <= seq_len by using the first N columns of its impulse response H (for
# N == seq_len exactly upstream's fft_H); LMU's cell sizes (dim, seq_len=128, theta=128) are arguments.


class LMUFFTCell(nn.Module):
    def __init__(self, input_size, hidden_size, memory_size, seq_len, theta):
        super().__init__()
        from scipy.signal import cont2discrete

        self.hidden_size, self.memory_size, self.seq_len, self.theta = hidden_size, memory_size, seq_len, theta
        self.W_u = nn.Linear(input_size, 1)
        self.W_h = nn.Linear(memory_size + input_size, hidden_size)
        q = torch.arange(memory_size, dtype=torch.float64).reshape(-1, 1).numpy()
        r = (2 * q + 1) / theta
        i, j = torch.meshgrid(torch.arange(memory_size), torch.arange(memory_size), indexing="ij")
        a = r * torch.where(i < j, -1.0, (-1.0) ** (i - j + 1).double()).numpy()
        a, b, *_ = cont2discrete((a, r * (-1.0) ** q, torch.ones(1, memory_size).numpy(), torch.zeros(1).numpy()),
                                 dt=1.0, method="zoh")
        self.register_buffer("A", torch.from_numpy(a))
        self.register_buffer("B", torch.from_numpy(b))
        hs, a_i = [], torch.eye(memory_size, dtype=torch.float64)
        for _ in range(seq_len):
            hs.append(a_i @ self.B)
            a_i = self.A @ a_i
        self.register_buffer("H", torch.cat(hs, dim=-1))
        self.register_buffer("fft_H", torch.fft.rfft(self.H, n=2 * seq_len, dim=-1))

    def forward(self, x):
        n = x.shape[1]
        u = F.relu(self.W_u(x))
        fft_h = self.fft_H if n == self.seq_len else torch.fft.rfft(self.H[:, :n], n=2 * n, dim=-1)
        m = torch.fft.irfft(torch.fft.rfft(u.permute(0, 2, 1), n=2 * n, dim=-1) * fft_h.unsqueeze(0), n=2 * n, dim=-1)
        m = m[:, :, :n].permute(0, 2, 1)
        h = F.relu(self.W_h(torch.cat((m, x), dim=-1)))
        return h, h[:, -1, :]


class LMU(nn.Module):
    def __init__(self, dim, use_all_h=True, seq_len=128, theta=128):
        super().__init__()
        self.use_all_h = use_all_h
        self.lmu = LMUFFTCell(dim, dim, dim, seq_len=seq_len, theta=theta)
        self.proj_conv = nn.Conv1d(dim, dim, kernel_size=1, stride=1)
        self.proj_bn = nn.BatchNorm1d(dim)

    def forward(self, x):
        h, h_n = self.lmu(x.transpose(-1, -2).contiguous())
        x = h.transpose(-1, -2).contiguous() if self.use_all_h else h_n.unsqueeze(-1)
        return self.proj_bn(self.proj_conv(x))


# chenguolin/NuTime@9acdd3d src/models/encoders/MultiBiasEncoder.py: MultiBiasEncoder with the released options
# (locs=None, loc_weighted_sum=False, use_loc_emb=False, multibias_trainable=True). Deviation: the scales buffer is
# float64 (upstream's torch.tensor(scales) is float32, so 10**-4 would be rounded); config fields are arguments.


class MultiBiasEncoder(nn.Module):
    def __init__(self, num_bias=9, mb_emb_dim=6, base_bias=10, scale_weighted_sum=True):
        super().__init__()
        self.scale_weighted_sum = scale_weighted_sum
        self.ws = nn.Parameter(torch.empty(num_bias, mb_emb_dim).uniform_(-1, 1))
        self.bs = nn.Parameter(torch.empty(num_bias, mb_emb_dim).uniform_(-1, 1))
        self.register_buffer("scales", torch.tensor([float(base_bias) ** i for i in range(-(num_bias - 1) // 2,
                                                                                          (num_bias + 1) // 2)],
                                                    dtype=torch.float64))
        self.register_buffer("locs", torch.tensor([0]))
        self.ln = nn.LayerNorm(mb_emb_dim, elementwise_affine=False)

    def forward(self, x):
        if x.ndim > 2:
            x = x.view(x.shape[0], -1)
        eps = 1e-6
        loc_dis = x[..., None] - self.locs  # (B, C, 1)
        if self.scale_weighted_sum:
            scale_w = 1 / (torch.abs(torch.log(torch.abs(loc_dis[..., None]) / self.scales + eps)) + eps)
            scale_w = scale_w / scale_w.sum(dim=-1, keepdim=True)
        e = self.ln(loc_dis[..., None, None] * self.ws + self.bs * self.scales.unsqueeze(dim=-1))  # (B, C, 1, K, D)
        if self.scale_weighted_sum:
            e = e * scale_w[..., None]
        return e.sum(dim=-2).sum(dim=-2)


# sacmehta/delight@cc499c5 fairseq/delight_modules/dextra_unit.py: DExTraUnit (norm_type='ln', is_iclr_version=False)
# on nn_functions.py: GroupLinear, Linear, get_weight_layer, and activation_layers.py ('swish' = x sigmoid(x)).
# Dropout omitted (eval); the layer sizes are upstream's dextra_config (restated).

_DELIGHT_ACT = {"gelu": F.gelu, "relu": F.relu, "swish": F.silu}


class DLinear(nn.Module):  # nn_functions.Linear: weights (out, in), LayerNorm, activation
    def __init__(self, in_features, out_features, act_type):
        super().__init__()
        self.weights = nn.Parameter(nn.init.xavier_uniform_(torch.empty(out_features, in_features)))
        self.bias = nn.Parameter(torch.zeros(out_features))
        self.normalization_fn = nn.LayerNorm(out_features)
        self.act_type = act_type

    def forward(self, x):
        return _DELIGHT_ACT[self.act_type](self.normalization_fn(F.linear(x, self.weights, self.bias)))


class GroupLinear(nn.Module):
    def __init__(self, in_features, out_features, n_groups, use_shuffle, act_type):
        super().__init__()
        self.n_groups, self.feature_shuffle, self.act_type = n_groups, use_shuffle, act_type
        self.weights = nn.Parameter(nn.init.xavier_uniform_(torch.empty(n_groups, in_features // n_groups,
                                                                         out_features // n_groups)))
        self.bias = nn.Parameter(torch.zeros(n_groups, 1, out_features // n_groups))
        self.normalization_fn = nn.LayerNorm(out_features // n_groups)

    def process_input_bmm(self, x):
        bsz = x.size(0)
        x = torch.bmm(x.contiguous().view(bsz, self.n_groups, -1).transpose(0, 1), self.weights) + self.bias
        if self.feature_shuffle:
            x = x.permute(1, 2, 0).contiguous().view(bsz, self.n_groups, -1)
        else:
            x = x.transpose(0, 1)
        return _DELIGHT_ACT[self.act_type](self.normalization_fn(x))

    def forward(self, x):
        t, b, _ = x.size()
        return self.process_input_bmm(x.contiguous().view(b * t, -1)).contiguous().view(t, b, -1)


def _dextra_config(in_features, out_features, max_features, n_layers, max_groups):
    mid = int(math.ceil(n_layers / 2.0))
    groups = [min(2 ** (i + 1), max_groups) for i in range(mid)]
    sizes = [int(v) for v in torch.linspace(in_features, max_features, mid, dtype=torch.float64).floor().tolist()]
    if n_layers % 2 == 0:
        groups, sizes = groups + groups[::-1], sizes + sizes[::-1]
    else:
        groups, sizes = groups + groups[::-1][1:], sizes + sizes[::-1][1:]
    sizes = sizes[:-1]
    ins = [in_features] + [1] * (n_layers - 1)
    for i in range(n_layers - 1):
        g = max(groups[i + 1], groups[i], 8)
        sizes[i] = int(math.ceil(sizes[i] / g)) * g
        ins[i + 1] = sizes[i] + in_features
    return {"in": ins, "out": sizes + [out_features], "groups": groups}


class DExTraUnit(nn.Module):
    def __init__(self, in_features, in_proj_features, out_features, width_multiplier=2.0, dextra_depth=4,
                 max_glt_groups=8, act_type="gelu", glt_shuffle=False):
        super().__init__()
        self.in_proj_features, self.out_features, self.width_multiplier = in_proj_features, out_features, width_multiplier
        self.num_glt_layers, self.max_glt_groups, self.glt_shuffle = dextra_depth, max_glt_groups, glt_shuffle
        self.input_layer = DLinear(in_features, in_proj_features, act_type)
        cfg = _dextra_config(in_proj_features, out_features, in_features * width_multiplier, dextra_depth,
                             max_glt_groups)
        self.dextra_layers = nn.ModuleList([
            DLinear(n_in, n_out, act_type) if g == 1 else GroupLinear(n_in, n_out, g, glt_shuffle, act_type)
            for n_in, n_out, g in zip(cfg["in"], cfg["out"], cfg["groups"])])
        self.output_layer = DLinear(out_features + in_proj_features, out_features, act_type)
        self.groups_per_layer = cfg["groups"]

    def forward(self, x):
        x = self.input_layer(x)
        b, t = x.size(0), x.size(1)
        out = x
        for i, layer in enumerate(self.dextra_layers):
            out = layer(out)
            g = self.groups_per_layer[i + 1] if i < self.num_glt_layers - 1 else 1
            if g == 1:
                out = torch.cat([x, out], dim=-1)
            else:
                out = torch.cat([x.contiguous().view(b, t, g, -1), out.contiguous().view(b, t, g, -1)], dim=-1)
                out = out.contiguous().view(b, t, -1)
        return self.output_layer(out)


# vulus98/Rethinking-attention@983b8c7 models/definitions/ALR_FF.py: FFNetwork_XS/S/M/L (one class, the hidden
# divisor an argument: 256, 128, 8, 2), and utils/full_sentence_utils.py: AttentionSubstitute. Deviations: MAX_LEN
# and the head dimension (repository constants) are arguments; the zero padding takes value's dtype and device.


class FFNetwork(nn.Module):
    def __init__(self, model_dimension, sentence_length, divisor=8):
        super().__init__()
        self.sentence_length, self.model_dimension = sentence_length, model_dimension
        self.width = sentence_length * model_dimension
        widths = [1, divisor, 1]
        self.layers = nn.ModuleList()
        for i in range(2):
            self.layers.extend([nn.LayerNorm(self.width // widths[i]), nn.Linear(self.width // widths[i],
                                                                                  self.width // widths[i + 1])])
            if i < 1:
                self.layers.append(nn.LeakyReLU())

    def forward(self, data, mask):
        for layer in self.layers:
            data = layer(data)
        return data * mask


class AttentionSubstitute(nn.Module):
    def __init__(self, ff, head_dim):
        super().__init__()
        self.ff, self.head_dim, self.max_len = ff, head_dim, ff.sentence_length

    def forward(self, query, key, value, mask):
        b, s, _ = value.shape
        inputs = torch.cat([value, value.new_zeros(b, self.max_len - s, value.shape[2])], dim=1)
        shape = inputs.shape
        mask = torch.squeeze(torch.squeeze(mask, dim=1), dim=1)
        mask = torch.cat([mask, torch.zeros(b, self.max_len - s, dtype=torch.bool)], dim=1)
        mask = torch.repeat_interleave(mask, inputs.shape[-1], dim=1)
        inputs = inputs.reshape((shape[0], shape[1] * shape[2])) * mask
        outputs = self.ff(inputs, mask)
        outputs = outputs.reshape((outputs.shape[0], self.max_len, -1, self.head_dim)).transpose(1, 2)
        outputs, _ = torch.split(outputs, [s, self.max_len - s], dim=2)
        return outputs


# epfml/DenseFormer@c99a623 denseformer/denseformer.py: DWAModules, in the README's DenseFormer stack (blocks and
# dwa_modules; wte, ln_f and lm_head left out) with torch.nn.MultiheadAttention self-attention blocks. Deviation: the
# accumulators are Python lists of the past outputs stacked at each average, not InPlaceSetSlice's preallocated
# buffers (the same tensors: x_acc[r][:j + 1] is the list of outputs of depth r, r + k, ..., read by tensordot).


class DWAModules(nn.Module):
    def __init__(self, n_blocks, dilation=1, period=1):
        super().__init__()
        self.n_blocks, self.dilation, self.period = n_blocks, dilation, period
        self.alphas = nn.ModuleList([nn.Linear((i + 1 + dilation) // dilation, 1, bias=False) if (i + 1) % period == 0
                                     else None for i in range(n_blocks)])
        for module in self.alphas:
            if module is not None:
                module.weight.data.zero_()
                module.weight.data[0, -1] = 1.
        self.accumulators = None

    def init_accumulators(self, x):
        self.accumulators = [[] for _ in range(self.dilation)]
        self.accumulators[0].append(x)

    def forward(self, x, block_idx):
        acc = self.accumulators[(block_idx + 1) % self.dilation]
        acc.append(x)
        if (block_idx + 1) % self.period == 0:
            x = torch.tensordot(self.alphas[block_idx].weight.view(-1), torch.stack(acc), dims=1)
        return x


class DenseFormerMHA(nn.Module):
    def __init__(self, n_embd, n_head, n_blocks, dilation=1, period=1, bias=True):
        super().__init__()
        self.dwa_modules = DWAModules(n_blocks, dilation, period)
        self.blocks = nn.ModuleList([nn.MultiheadAttention(n_embd, n_head, bias=bias, batch_first=True)
                                     for _ in range(n_blocks)])

    def forward(self, x):
        self.dwa_modules.init_accumulators(x)
        for i, block in enumerate(self.blocks):
            x = block(x, x, x, need_weights=False)[0]
            x = self.dwa_modules(x, block_idx=i)
        return x


# yifanzhang-pro/deep-delta-learning@2b55f25 model/DDL-vdim1-gpt-mha-rope.py: DeepDeltaResidualVdim1 (and _logit).
# Deviation: its float32 up-casts (.float() on the gate logits, dtype=torch.float32 in the projection sum) are dropped;
# the config fields are arguments.


class DeepDeltaResidualVdim1(nn.Module):
    def __init__(self, hidden_size, beta_single_linear=True, beta_hidden_size=128, v_sigmoid=True, v_sigmoid_scale=4.0,
                 v_constant=False, v_constant_value=2.0, k_eps=1e-5, beta_init=0.0):
        super().__init__()
        self.k_eps, self.v_sigmoid, self.v_sigmoid_scale = k_eps, v_sigmoid, v_sigmoid_scale
        self.v_constant, self.v_constant_value = v_constant, v_constant_value
        self.beta_single_linear = beta_single_linear
        if beta_single_linear:
            self.beta = nn.Linear(hidden_size, 1, bias=True)
        else:
            self.beta_in = nn.Linear(hidden_size, beta_hidden_size, bias=False)
            self.beta_out = nn.Linear(beta_hidden_size, 1, bias=True)
        self.v_proj = nn.Linear(hidden_size, 1, bias=True)
        p = min(max(min(max(beta_init, 0.0), 2.0) / 2.0, 1e-6), 1.0 - 1e-6)
        with torch.no_grad():
            (self.beta if beta_single_linear else self.beta_out).bias.fill_(math.log(p) - math.log(1.0 - p))

    def forward(self, x, *, k_in, context):
        k_dim = int(k_in.size(-1))
        k_rms = F.rms_norm(k_in, [k_dim], eps=(self.k_eps * self.k_eps) / float(k_dim))
        k_scale = 1.0 / math.sqrt(k_dim)
        logits = self.beta(context) if self.beta_single_linear else self.beta_out(torch.tanh(self.beta_in(context)))
        beta = 2.0 * torch.sigmoid(logits)
        proj = torch.sum(k_rms * x, dim=-1, keepdim=True) * k_scale
        if self.v_constant:
            v = torch.full_like(proj, self.v_constant_value)
        else:
            v = self.v_proj(x)
            if self.v_sigmoid:
                v = torch.sigmoid(v) * self.v_sigmoid_scale
        return x + ((beta * (v - proj)) * k_scale) * k_rms


# shallowdream204/DiCo@b596b05 dico_models.py: DiCoBlock, its conv module only (conv1, conv2, ca, conv3 as DiCoBlock
# builds them; forward = the lines of DiCoBlock.forward between modulate(norm1(inp)) and the gated residual). The
# LayerNorm2d, adaLN modulation and 1x1-conv MLP (conv4, conv5) are not restated.


class DiCoConvModule(nn.Module):
    def __init__(self, hidden_size, kernel_size=3):
        super().__init__()
        self.conv1 = nn.Conv2d(hidden_size, hidden_size, kernel_size=1, bias=True)
        self.conv2 = nn.Conv2d(hidden_size, hidden_size, kernel_size=kernel_size, padding=kernel_size // 2,
                               groups=hidden_size, bias=True)
        self.conv3 = nn.Conv2d(hidden_size, hidden_size, kernel_size=1, bias=True)
        self.ca = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Conv2d(hidden_size, hidden_size, kernel_size=1, bias=True),
                                nn.Sigmoid())

    def forward(self, x):
        x = F.gelu(self.conv2(self.conv1(x)))
        x = x * self.ca(x)
        return self.conv3(x)


# zhengkid/PartialFormer@d1ed959 fairseq/modules/efficient_pa_attention_qk.py: EfficientPAQKMultiheadAttention,
# self-attention path with use_hdp=False, no masks, no incremental state, eval (dropouts omitted); fairseq's
# quant_noise (off) and utils.get_activation_fn are plain nn.Linear and F.relu/F.gelu; args fields are arguments.


class EfficientPAQKMultiheadAttention(nn.Module):
    def __init__(self, embed_dim, num_heads, expand_heads, hidden_ratio=2, activation_fn="relu", bias=True):
        super().__init__()
        self.embed_dim, self.num_heads, self.expand_heads = embed_dim, num_heads, expand_heads
        self.head_dim = embed_dim // num_heads
        self.scaling = self.head_dim ** -0.5
        self.self_attention = True
        width = expand_heads * self.head_dim
        self.k_proj = nn.Linear(embed_dim, width, bias=bias)
        self.q_proj = nn.Linear(embed_dim, width, bias=bias)
        self.v_proj = nn.Linear(embed_dim, width, bias=bias)
        self.u_proj = nn.Linear(embed_dim, width, bias=bias)
        self.ff1 = nn.Linear(self.head_dim, hidden_ratio * self.head_dim, bias=bias)
        self.ff2 = nn.Linear(hidden_ratio * self.head_dim, self.head_dim, bias=bias)
        self.out_proj = nn.Linear(width, embed_dim, bias=bias)
        self.activation_fn = {"relu": F.relu, "gelu": F.gelu}[activation_fn]

    def forward(self, query, key, value, attn_before=None):
        tgt_len, bsz, _ = query.size()
        q, k, v, u = self.q_proj(query), self.k_proj(query), self.v_proj(query), self.u_proj(query)
        q = q * self.scaling
        q = q.contiguous().view(tgt_len, bsz * self.expand_heads, self.head_dim).transpose(0, 1)
        k = k.contiguous().view(-1, bsz * self.expand_heads, self.head_dim).transpose(0, 1)
        v = v.contiguous().view(-1, bsz * self.expand_heads, self.head_dim).transpose(0, 1)
        attn_weights = torch.bmm(q, k.transpose(1, 2))
        if attn_before is not None:
            attn_weights = attn_weights + attn_before
        attn_weights_float = F.softmax(attn_weights, dim=-1)
        attn = torch.bmm(attn_weights_float, v)
        res = attn
        attn = self.activation_fn(self.ff1(attn))
        attn = attn.transpose(0, 1).contiguous().view(tgt_len, bsz, -1).view(tgt_len, bsz * self.expand_heads, -1)
        attn = self.ff2(attn)
        attn = attn.view(tgt_len, -1, self.head_dim).transpose(0, 1).contiguous() + res
        attn = attn.transpose(0, 1).contiguous().view(tgt_len, bsz, self.expand_heads * self.head_dim)
        attn = self.out_proj(attn * F.relu(u))
        return attn, attn_weights_float.view(bsz, self.expand_heads, tgt_len, -1).transpose(1, 0)


# ethanbar11/ssm_2d@fbdd3e3 models/mega/two_d_ssm.py: TwoDimensionalSSM (real parameterisation), with the impulse
# response of models/mega/ssm_coefficient.py: CoeffCalculator. Deviations: the kernel is evaluated by running
# CoeffCalculator's recurrence (calc_x_h / calc_x_v: a step is halved when both of its source states are non-zero)
# on the parameter values instead of expanding it symbolically with sympy into power tables (the same numbers), and
# at the input's side instead of ceil(sqrt(L)) fixed at construction (the same for that side); forward's
# k.float() is dropped; args fields are arguments.


class TwoDimensionalSSM(nn.Module):
    def __init__(self, embed_dim, ndim=3, n_ssm=2, directions_amount=4, use_residual=False, normalize=False):
        super().__init__()
        self.embed_dim, self.ndim, self.n_ssm = embed_dim, ndim, n_ssm
        self.normalization = nn.LayerNorm(embed_dim) if normalize else nn.Identity()
        self.directions_amount, self.use_residual = directions_amount, use_residual
        self.scale = math.sqrt(1.0 / ndim)
        self.kernel_dim = directions_amount * n_ssm
        self.C_dimensions = embed_dim * directions_amount
        self.A = nn.ParameterDict({f"A_{r}": nn.Parameter(torch.randn(self.kernel_dim, ndim) * 0.2) for r in range(1, 5)})
        self.B_1 = nn.Parameter(torch.randn(self.kernel_dim, ndim) * 0.2)
        self.B_2 = nn.Parameter(torch.randn(self.kernel_dim, ndim) * 0.2)
        self.C_1 = nn.Parameter(torch.randn(self.C_dimensions, ndim))
        self.C_2 = nn.Parameter(torch.randn(self.C_dimensions, ndim))
        self.omega = nn.Parameter(torch.randn(embed_dim))

    def _x_matrices(self, side):
        """x_h, x_v (side, side, kernel_dim, ndim): the impulse response at u_0_0 = 1."""
        a = {k: torch.sigmoid(v) for k, v in self.A.items()}
        b1, b2 = torch.sigmoid(self.B_1), torch.sigmoid(self.B_2)
        zero = torch.zeros_like(b1)
        xh = [[None] * side for _ in range(side)]
        xv = [[None] * side for _ in range(side)]
        for i in range(side):
            for j in range(side):
                h_src = (xh[i][j - 1], xv[i][j - 1]) if j >= 1 else (None, None)
                v_src = (xh[i - 1][j], xv[i - 1][j]) if i >= 1 else (None, None)
                u = 1.0 if i == 0 and j == 0 else 0.0
                for src, (ka, kb), bb, out in ((h_src, ("A_1", "A_2"), b1, xh), (v_src, ("A_3", "A_4"), b2, xv)):
                    sh, sv = src
                    val = (zero if sh is None else a[ka] * sh) + (zero if sv is None else a[kb] * sv)
                    if sh is not None and sv is not None and sh.abs().sum() > 0 and sv.abs().sum() > 0:
                        val = val / 2
                    out[i][j] = val + bb * u
        return (torch.stack([torch.stack(r) for r in xh]), torch.stack([torch.stack(r) for r in xv]))

    def kernel(self, side):
        xh, xv = self._x_matrices(side)
        k = self.n_ssm * self.directions_amount
        c1 = (self.C_1 * self.scale).view(-1, k, self.ndim)
        c2 = (self.C_2 * self.scale).view(-1, k, self.ndim)
        out = torch.einsum("ijcn,hcn->ijhc", xh, c1) + torch.einsum("ijcn,hcn->ijhc", xv, c2)
        out = out.reshape(side, side, self.C_dimensions).clone()
        out[0, :, :] *= 2
        out[:, 0, :] *= 2
        out[0, 0] /= 4
        return out

    def forward(self, x):
        seq_len, bsz, embed_dim = x.size()
        residual = x * self.omega
        n = int(math.sqrt(seq_len))
        x = x.permute(1, 2, 0).reshape(bsz, embed_dim, n, n)
        k = self.kernel(n).permute(2, 0, 1)
        k_f = torch.fft.rfft2(k, s=(2 * n, 2 * n))
        flips = [[], [-2], [-1], [-2, -1]] if self.directions_amount == 4 else [[], [-2, -1]]
        x_f = torch.fft.rfft2(torch.cat([torch.flip(x, dims=f) for f in flips], dim=1), s=(2 * n, 2 * n))
        curr_all = torch.fft.irfft2(x_f * k_f, s=(2 * n, 2 * n))[..., :n, :n]
        out = sum(torch.flip(curr_all[:, i * embed_dim:(i + 1) * embed_dim], dims=f) for i, f in enumerate(flips))
        out = out.reshape(bsz, embed_dim, seq_len).permute(2, 0, 1)
        if self.use_residual:
            out = out + residual
        return self.normalization(out)


# NUS-HPC-AI-Lab/Dynamic-Diffusion-Transformer-DyDiT-@dd68c47 models.py: DiTBlock, Attention, Mlp (DynaQKVLinear and
# DynaLinear at width_mult=1 are the full nn.Linear), modulate; dynamic_model.py: DiffRate, TokenSelect,
# _gumbel_sigmoid (evaluation branch: y_soft = sigmoid(logits); the training branch's Gumbel draws are not restated).
# Dropout omitted.


def _gumbel_sigmoid_eval(logits, hard=True, threshold=0.5):
    y_soft = logits.sigmoid()
    if not hard:
        return y_soft
    y_hard = torch.zeros_like(logits).masked_fill(y_soft > threshold, 1.0)
    return y_hard - y_soft.detach() + y_soft


class DiffRate(nn.Module):
    def __init__(self, dim, channel_number, tau=5, is_hard=True, threshold=0.5):
        super().__init__()
        self.router = nn.Linear(dim, channel_number)
        self.is_hard, self.tau, self.threshold = is_hard, tau, threshold

    def forward(self, x):
        return _gumbel_sigmoid_eval(self.router(x), self.is_hard, self.threshold)


class TokenSelect(nn.Module):
    def __init__(self, dim_in, tau=5, is_hard=True, threshold=0.5, bias=True):
        super().__init__()
        self.mlp_head = nn.Sequential(nn.Linear(dim_in, dim_in // 16, bias=bias), nn.ReLU(),
                                      nn.Linear(dim_in // 16, 1, bias=bias))
        self.is_hard, self.tau, self.threshold = is_hard, tau, threshold

    def forward(self, x):
        logits = self.mlp_head(x)
        return _gumbel_sigmoid_eval(logits, self.is_hard, self.threshold), logits


class DyDiTAttention(nn.Module):
    def __init__(self, dim, num_heads=8, qkv_bias=False):
        super().__init__()
        self.num_heads, self.head_dim = num_heads, dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x, channel_mask=None):
        b, n, _ = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        attn = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
        x = (attn @ v).transpose(1, 2).reshape(b, n, -1)
        if channel_mask is not None:
            x = channel_mask.unsqueeze(dim=2).repeat(1, 1, self.head_dim).flatten(1).unsqueeze(1) * x
        return self.proj(x)


class DyDiTMlp(nn.Module):
    def __init__(self, in_features, hidden_features, num_heads):
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = nn.GELU(approximate="tanh")
        self.fc2 = nn.Linear(hidden_features, in_features)
        self.head_dim = hidden_features // num_heads

    def forward(self, x, channel_mask=None):
        x = self.fc1(x)
        if channel_mask is not None:
            x = channel_mask.unsqueeze(dim=2).repeat(1, 1, self.head_dim).flatten(1).unsqueeze(1) * x
        return self.fc2(self.act(x))


def _modulate(x, shift, scale):
    return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)


class DiTBlock(nn.Module):
    def __init__(self, hidden_size, num_heads, mlp_ratio=4.0):
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.attn = DyDiTAttention(hidden_size, num_heads=num_heads, qkv_bias=True)
        self.norm2 = nn.LayerNorm(hidden_size, elementwise_affine=False, eps=1e-6)
        self.mlp = DyDiTMlp(hidden_size, int(hidden_size * mlp_ratio), num_heads)
        self.adaLN_modulation = nn.Sequential(nn.SiLU(), nn.Linear(hidden_size, 6 * hidden_size, bias=True))
        self.attn_rate = DiffRate(hidden_size, num_heads)
        self.mlp_rate = DiffRate(hidden_size, num_heads)
        self.token_selection = TokenSelect(hidden_size)

    def forward(self, x, c, t, complete_model):
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.adaLN_modulation(c).chunk(6, dim=1)
        attn_weight_mask = self.attn_rate(t) if not complete_model else None
        x = x + gate_msa.unsqueeze(1) * self.attn(_modulate(self.norm1(x), shift_msa, scale_msa), attn_weight_mask)
        if not complete_model:
            token_select, _ = self.token_selection(x)
            mlp_weight_mask = self.mlp_rate(t)
            mlp_x = gate_mlp.unsqueeze(1) * self.mlp(_modulate(self.norm2(x), shift_mlp, scale_mlp), mlp_weight_mask)
            x = x + token_select * mlp_x
        else:
            token_select = mlp_weight_mask = None
            x = x + gate_mlp.unsqueeze(1) * self.mlp(_modulate(self.norm2(x), shift_mlp, scale_mlp))
        return x, attn_weight_mask, mlp_weight_mask, token_select


# CASE-Lab-UMD/Router-Tuning-Mixture-of-Depths@772c160 utils/model/model_patch.py: _patched_decoder_layer_forward up
# to the attention residual (the MLP half is outside the mechanism), _compute_routing_state, _apply_routing_mask, with
# the patch's router nn.Linear(hidden, 1, bias=False); on huggingface/transformers@5dd4a63
# src/transformers/models/llama/modeling_llama.py: LlamaRMSNorm, LlamaAttention (eager, rotate_half, repeat_kv).
# Deviations: the float32 casts of LlamaRMSNorm and of the eager softmax are dropped; the capacity bookkeeping
# (mod_capacity, mod_loss) is not restated; eval mode only (STEFunction is the training branch).


class LlamaRMSNorm(nn.Module):
    def __init__(self, hidden_size, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.variance_epsilon = eps

    def forward(self, h):
        return self.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


def _rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class LlamaAttention(nn.Module):
    def __init__(self, hidden_size, num_heads, num_key_value_heads, bias=False):
        super().__init__()
        self.head_dim = hidden_size // num_heads
        self.num_key_value_groups = num_heads // num_key_value_heads
        self.scaling = self.head_dim ** -0.5
        self.q_proj = nn.Linear(hidden_size, num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(hidden_size, num_key_value_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(hidden_size, num_key_value_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(num_heads * self.head_dim, hidden_size, bias=bias)

    def forward(self, hidden_states, position_embeddings, attention_mask=None):
        shape = (*hidden_states.shape[:-1], -1, self.head_dim)
        q = self.q_proj(hidden_states).view(shape).transpose(1, 2)
        k = self.k_proj(hidden_states).view(shape).transpose(1, 2)
        v = self.v_proj(hidden_states).view(shape).transpose(1, 2)
        cos, sin = (t.unsqueeze(1) for t in position_embeddings)
        q, k = q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
        k = k.repeat_interleave(self.num_key_value_groups, dim=1)  # repeat_kv
        v = v.repeat_interleave(self.num_key_value_groups, dim=1)
        w = torch.matmul(q, k.transpose(2, 3)) * self.scaling
        if attention_mask is not None:
            w = w + attention_mask[:, :, :, : k.shape[-2]]
        out = torch.matmul(w.softmax(dim=-1), v).transpose(1, 2).contiguous()
        return self.o_proj(out.reshape(*hidden_states.shape[:-1], -1)), w


class MindSkipAttentionHalf(nn.Module):
    def __init__(self, hidden_size, num_heads, num_key_value_heads, granularity="attn_sequence", threshold=0.5,
                 rms_norm_eps=1e-5):
        super().__init__()
        self.input_layernorm = LlamaRMSNorm(hidden_size, eps=rms_norm_eps)
        self.self_attn = LlamaAttention(hidden_size, num_heads, num_key_value_heads)
        self.router = nn.Linear(hidden_size, 1, bias=False)
        self.route_level = "token" if "token" in granularity else "sequence"
        self.threshold = threshold

    def forward(self, hidden_states, attention_mask=None, position_embeddings=None):
        residual = hidden_states
        attn_inputs = self.input_layernorm(hidden_states)
        pooled = attn_inputs if self.route_level == "token" else attn_inputs.mean(dim=1, keepdim=True)
        routing_mask = (torch.sigmoid(self.router(pooled)) - self.threshold >= 0).to(attn_inputs.dtype)  # eval
        update, _ = self.self_attn(attn_inputs, position_embeddings, attention_mask)
        if routing_mask.dim() == 2:
            routing_mask = routing_mask.unsqueeze(-1)
        return residual + update * routing_mask.to(update.dtype)
