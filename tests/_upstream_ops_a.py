"""PyTorch modules re-stated from upstream neural-operator files, for ``tests/test_interop_ops_a.py``.

Each class is our own compact re-statement of the cited upstream module (``owner/repo@commit
path: Class`` in the comment above it): upstream parameter names, shapes and forward, only what the
tested configurations use. Deviations are listed per class; common to all: dropout omitted (eval),
float32 casts and ``dtype=torch.float32`` buffers removed so that float64 stays float64.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

# neuraloperator/neuraloperator@93d3f06 neuralop/layers/gno_block.py: GNOBlock (with
# integral_transform.py IntegralTransform, neighbor_search.py native_neighbor_search, embeddings.py
# SinusoidalEmbedding, channel_mlp.py LinearChannelMLP, segment_csr.py native segment_csr).
# Deviations: no weighting_fn / open3d / torch_scatter paths; segment_csr's float32 zeros buffer
# follows the input dtype.


class LinearChannelMLP(nn.Module):
    def __init__(self, layers, non_linearity=F.gelu):
        super().__init__()
        self.n_layers = len(layers) - 1
        self.fcs = nn.ModuleList([nn.Linear(layers[j], layers[j + 1]) for j in range(self.n_layers)])
        self.non_linearity = non_linearity

    def forward(self, x):
        for i, fc in enumerate(self.fcs):
            x = fc(x)
            if i < self.n_layers - 1:
                x = self.non_linearity(x)
        return x


class SinusoidalEmbedding(nn.Module):
    def __init__(self, in_channels, num_frequencies, embedding_type="transformer", max_positions=10000):
        super().__init__()
        self.in_channels, self.num_frequencies = in_channels, num_frequencies
        self.embedding_type, self.max_positions = embedding_type, max_positions

    @property
    def out_channels(self):
        return 2 * self.num_frequencies * self.in_channels

    def forward(self, x):
        squeeze = x.ndim == 2
        if squeeze:
            x = x.unsqueeze(0)
        k = torch.arange(0, self.num_frequencies, device=x.device, dtype=x.dtype)  # upstream: float32 freqs
        if self.embedding_type == "nerf":
            freqs = 2 ** k * torch.pi
        else:
            freqs = (1 / self.max_positions) ** (k / self.num_frequencies * 2)
        freqs = torch.einsum("bij, k -> bijk", x, freqs)
        freqs = torch.stack((freqs.sin(), freqs.cos()), dim=-1)  # (b, n, d, F, 2)
        out = freqs.view(x.shape[0], x.shape[1], -1)
        return out.squeeze(0) if squeeze else out


def native_neighbor_search(data, queries, radius):
    dists = torch.cdist(queries, data)
    dists = torch.where(dists == 0.0, 1e-7, dists)
    dists = torch.where(dists <= radius, dists, 0.0)
    idx = dists.nonzero()[:, 1:].reshape(-1)
    sizes = torch.cumsum((dists > 0).to(torch.int64).sum(dim=1), dim=0)
    return {"neighbors_index": idx, "neighbors_row_splits": torch.cat([sizes.new_zeros(1), sizes])}


def segment_csr(src, indptr, reduction):
    out = src.new_zeros(src.shape[:-2] + (indptr.shape[-1] - 1, src.shape[-1]))
    for i in range(indptr.shape[-1] - 1):
        a, b = int(indptr[i]), int(indptr[i + 1])
        if b > a:
            r = src[..., a:b, :].sum(dim=-2)
            out[..., i, :] += r / (b - a) if reduction == "mean" else r
    return out


class IntegralTransform(nn.Module):
    def __init__(self, channel_mlp, transform_type="linear", reduction="sum"):
        super().__init__()
        self.channel_mlp, self.transform_type, self.reduction = channel_mlp, transform_type, reduction

    def forward(self, y, neighbors, x=None, f_y=None):
        x = y if x is None else x
        nb = neighbors["neighbors_index"]
        splits = neighbors["neighbors_row_splits"]
        rep = y[nb]
        batched = f_y is not None and f_y.ndim == 3
        if f_y is not None:
            in_features = f_y[:, nb, :] if batched else f_y[nb]
        agg = torch.cat([rep, torch.repeat_interleave(x, splits[1:] - splits[:-1], dim=0)], dim=-1)
        if f_y is not None and self.transform_type.startswith("nonlinear"):
            if batched:
                agg = agg.repeat([f_y.shape[0]] + [1] * agg.ndim)
            agg = torch.cat([agg, in_features], dim=-1)
        rep = self.channel_mlp(agg)
        if f_y is not None and self.transform_type != "nonlinear_kernelonly":
            if rep.ndim == 2 and batched:
                rep = rep.unsqueeze(0).repeat([f_y.shape[0]] + [1] * rep.ndim)
            rep = rep * in_features
        return segment_csr(rep, splits, self.reduction)


class GNOBlock(nn.Module):
    def __init__(self, in_channels, out_channels, coord_dim, radius, transform_type="linear", reduction="sum",
                 pos_embedding_type="transformer", pos_embedding_channels=32, pos_embedding_max_positions=10000,
                 channel_mlp_layers=(128, 256, 128), channel_mlp_non_linearity=F.gelu):
        super().__init__()
        self.in_channels, self.out_channels, self.coord_dim, self.radius = in_channels, out_channels, coord_dim, radius
        self.pos_embedding_type = pos_embedding_type
        self.pos_embedding = (SinusoidalEmbedding(coord_dim, pos_embedding_channels, pos_embedding_type,
                                                  pos_embedding_max_positions)
                              if pos_embedding_type in ("nerf", "transformer") else None)
        kin = 2 * (coord_dim if self.pos_embedding is None else self.pos_embedding.out_channels)
        if transform_type.startswith("nonlinear"):
            kin += in_channels
        layers = list(channel_mlp_layers)
        if layers[0] != kin:
            layers = [kin] + layers
        if layers[-1] != out_channels:
            layers.append(out_channels)
        self.integral_transform = IntegralTransform(LinearChannelMLP(layers, channel_mlp_non_linearity),
                                                    transform_type, reduction)

    def forward(self, y, x, f_y=None):
        nbrs = native_neighbor_search(y, x, self.radius)
        if self.pos_embedding is not None:
            y, x = self.pos_embedding(y), self.pos_embedding(x)
        return self.integral_transform(y=y, x=x, neighbors=nbrs, f_y=f_y)


# bogdanraonic3/ConvolutionalNeuralOperator@6544abb CNOModule.py: CNOBlock (activation 'cno_lrelu'), with
# training/filtered_networks.py LReLu and torch_utils/ops/filtered_lrelu.py _filtered_lrelu_ref,
# upfirdn2d.py _upfirdn2d_ref (StyleGAN3). Deviations: the Kaiser taps are designed in float64 (upstream
# stores scipy's float64 taps as float32 buffers); no radial filters; the reference (not CUDA) path.


def upfirdn2d(x, f, up=1, down=1, padding=(0, 0, 0, 0), gain=1):
    b, c, h, w = x.shape
    if f is None:
        f = torch.ones(1, dtype=x.dtype)
    px0, px1, py0, py1 = padding
    x = F.pad(x.reshape(b, c, h, 1, w, 1), [0, up - 1, 0, 0, 0, up - 1]).reshape(b, c, h * up, w * up)
    x = F.pad(x, [max(px0, 0), max(px1, 0), max(py0, 0), max(py1, 0)])
    x = x[:, :, max(-py0, 0):x.shape[2] - max(-py1, 0), max(-px0, 0):x.shape[3] - max(-px1, 0)]
    f = (f * gain ** (f.ndim / 2)).to(x.dtype).flip(0)[None, None].repeat(c, 1, 1)
    x = F.conv2d(F.conv2d(x, f.unsqueeze(2), groups=c), f.unsqueeze(3), groups=c)
    return x[:, :, ::down, ::down]


class LReLu(nn.Module):
    def __init__(self, out_channels, in_size, out_size, in_cutoff, out_cutoff, in_half_width, out_half_width,
                 filter_size=6, lrelu_upsampling=2):
        import scipy.signal

        super().__init__()
        self.tmp_sampling_rate = max(in_size, out_size) * lrelu_upsampling
        self.bias = nn.Parameter(torch.zeros(out_channels))
        self.up_factor = int(round(self.tmp_sampling_rate / in_size))
        self.down_factor = int(round(self.tmp_sampling_rate / out_size))
        self.up_taps = filter_size * self.up_factor if self.up_factor > 1 else 1
        self.down_taps = filter_size * self.down_factor if self.down_factor > 1 else 1

        def design(numtaps, cutoff, width):
            if numtaps == 1:
                return None
            return torch.as_tensor(scipy.signal.firwin(numtaps=numtaps, cutoff=cutoff, width=width,
                                                       fs=self.tmp_sampling_rate), dtype=torch.float64)

        self.register_buffer("up_filter", design(self.up_taps, in_cutoff, in_half_width * 2))
        self.register_buffer("down_filter", design(self.down_taps, out_cutoff, out_half_width * 2))
        total = (out_size - 1) * self.down_factor + 1 - in_size * self.up_factor + self.up_taps + self.down_taps - 2
        lo = (total + self.up_factor) // 2
        self.padding = [lo, total - lo, lo, total - lo]

    def forward(self, x):
        x = x + self.bias.to(x.dtype)[None, :, None, None]
        x = upfirdn2d(x, self.up_filter, up=self.up_factor, padding=self.padding, gain=self.up_factor ** 2)
        x = F.leaky_relu(x, 0.2) * math.sqrt(2)
        return upfirdn2d(x, self.down_filter, down=self.down_factor)


class CNOBlock(nn.Module):
    def __init__(self, in_channels, out_channels, in_size, out_size, cutoff_den=2.0001, conv_kernel=3,
                 filter_size=6, lrelu_upsampling=2, half_width_mult=0.8, batch_norm=True):
        super().__init__()
        self.in_channels, self.out_channels, self.in_size, self.out_size = in_channels, out_channels, in_size, out_size
        self.convolution = nn.Conv2d(in_channels, out_channels, conv_kernel, padding=(conv_kernel - 1) // 2)
        self.batch_norm = nn.BatchNorm2d(out_channels) if batch_norm else False
        self.activation = LReLu(out_channels, in_size, out_size, in_size / cutoff_den, out_size / cutoff_den,
                                half_width_mult * in_size - in_size / cutoff_den,
                                half_width_mult * out_size - out_size / cutoff_den, filter_size, lrelu_upsampling)

    def forward(self, x):
        x = self.convolution(x)
        if self.batch_norm:
            x = self.batch_norm(x)
        return self.activation(x)


# AlexColagrande/HO-FNO@3fadecc models/HO_FNO.py: HO_block (HO_Conv, RMSNorm2D, _pad_2_3_rule) with
# layers/spectral_convs.py SpectralConv_2D_diag. Deviations: dropout and DropPath omitted (eval);
# einops rearrange written as permute.


class SpectralConv2dDiag(nn.Module):
    def __init__(self, in_channels, out_channels, modes1, modes2):
        super().__init__()
        self.modes1, self.modes2, self.out_channels = modes1, modes2, out_channels
        self.weights1 = nn.Parameter(torch.randn(in_channels, modes1, modes2, dtype=torch.cdouble) / in_channels)
        self.weights2 = nn.Parameter(torch.randn(in_channels, modes1, modes2, dtype=torch.cdouble) / in_channels)

    def forward(self, x):
        x_ft = torch.fft.rfft2(x)
        m1, m2 = self.modes1, self.modes2
        tmp1, tmp2 = torch.zeros_like(x_ft), torch.zeros_like(x_ft)
        tmp1[:, :, :m1, :m2] = torch.einsum("BCHW,CHW->BCHW", x_ft[:, :, :m1, :m2], self.weights1)
        tmp2[:, :, -m1:, :m2] = torch.einsum("BCHW,CHW->BCHW", x_ft[:, :, -m1:, :m2], self.weights2)
        return torch.fft.irfft2(tmp1 + tmp2, s=(x.size(-2), x.size(-1)))


class HOConv(nn.Module):
    def __init__(self, in_channels, out_channels, modes1, modes2, order=2):
        super().__init__()
        self.order = order
        self.proj = nn.Conv2d(in_channels, out_channels * order, kernel_size=1, bias=True)
        self.spec_convs = SpectralConv2dDiag(in_channels, out_channels, modes1, modes2)

    def forward(self, x):
        xs = torch.chunk(self.proj(x.permute(0, 3, 1, 2)), self.order, dim=1)
        z = xs[0]
        for t in xs[1:]:
            z = z * t
        return self.spec_convs(z).permute(0, 2, 3, 1)


class RMSNorm2D(nn.Module):
    def __init__(self, channels, eps=1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(1, 1, 1, channels)), eps

    def forward(self, x):
        return x / torch.sqrt(torch.mean(x * x, dim=-1, keepdim=True) + self.eps) * self.weight


class HOBlock(nn.Module):
    def __init__(self, width, modes1, modes2, order, expansion_MLP=2, two_thirds_zero_padding=False):
        super().__init__()
        self.HO_conv = HOConv(width, width, modes1, modes2, order)
        self.norm1, self.norm2 = RMSNorm2D(width), RMSNorm2D(width)
        self.MLP = nn.Sequential(nn.Linear(width, width * expansion_MLP), nn.GELU(), nn.Dropout(0.0),
                                 nn.Linear(width * expansion_MLP, width))
        self.two_thirds_zero_padding = two_thirds_zero_padding

    def forward(self, x):
        xc = self.norm1(x)
        if self.two_thirds_zero_padding:
            h, w = xc.shape[1], xc.shape[2]
            xc = F.pad(xc.permute(0, 3, 1, 2), (0, int(2 * w / 3), 0, int(2 * h / 3))).permute(0, 2, 3, 1)
            xc = self.HO_conv(xc)[:, :h, :w, :]
        else:
            xc = self.HO_conv(xc)
        x = x + xc
        return x + self.MLP(self.norm2(x))


# xlliu2017/MgNO@3a68a90 models.py: MgIte, MgIte_init, Restrict, MgConv_DC, and MgNO_DC's loop body
# act(conv_list[i](u) + linear_list[i](u)) as the module MgNOLayer (conv_list[i] under "conv.",
# linear_list[i] under "linear."). No deviations in the computation.


class MgIte(nn.Module):
    def __init__(self, A, S):
        super().__init__()
        self.A, self.S = A, S

    def forward(self, out):
        if isinstance(out, tuple):
            u, f = out
            return u + self.S(f - self.A(u)), f
        return self.S(out), out


class MgIteInit(nn.Module):
    def __init__(self, S):
        super().__init__()
        self.S = S

    def forward(self, f):
        return self.S(f), f


class Restrict(nn.Module):
    def __init__(self, Pi=None, R=None, A=None):
        super().__init__()
        self.Pi, self.R, self.A = Pi, R, A

    def forward(self, out):
        u, f = out
        f = self.R(f - self.A(u)) if self.A is not None else self.R(f)
        return self.Pi(u), f


class MgConvDC(nn.Module):
    def __init__(self, num_iteration, num_channel_u, num_channel_f, padding_mode="zeros", bias=False, use_res=False):
        super().__init__()
        self.num_iteration, self.padding_mode = num_iteration, padding_mode
        cu, cf = num_channel_u, num_channel_f

        def conv(i, o, stride=1, b=bias):
            return nn.Conv2d(i, o, 3, stride=stride, padding=1, bias=b, padding_mode=padding_mode)

        self.RTlayers = nn.ModuleList([nn.ConvTranspose2d(cu, cu, 4, stride=2, padding=1, bias=False)
                                       for _ in range(len(num_iteration) - 1)])
        layers = []
        for level, (pre, post) in enumerate(num_iteration):
            for i in range(pre):
                S = conv(cf, cu)
                layers.append(MgIteInit(S) if level == 0 and i == 0 else MgIte(conv(cu, cf), S))
            post_layers = [MgIte(conv(cu, cf), conv(cf, cu)) for _ in range(post)] if post else [nn.Identity()]
            setattr(self, f"layer{level}", nn.Sequential(*layers))
            setattr(self, f"post_smooth_layer{level}", nn.Sequential(*post_layers))
            if level < len(num_iteration) - 1:
                A = conv(cu, cf)
                Pi, R = conv(cu, cu, 2, False), conv(cf, cf, 2, False)
                layers = [Restrict(Pi, R, A)] if use_res else [Restrict(Pi=Pi, R=R)]

    def forward(self, f):
        n = len(self.num_iteration)
        outs, out = [None] * n, f
        for level in range(n):
            out = getattr(self, f"layer{level}")(out)
            outs[level] = out
        for j in range(n - 2, -1, -1):
            u, f = outs[j]
            outs[j] = getattr(self, f"post_smooth_layer{j}")((u + self.RTlayers[j](outs[j + 1][0]), f))
        return outs[0][0]


class MgNOLayer(nn.Module):
    def __init__(self, num_iteration, num_channel_u, num_channel_f, padding_mode="zeros", use_res=False,
                 activation="gelu"):
        super().__init__()
        self.conv = MgConvDC(num_iteration, num_channel_u, num_channel_f, padding_mode=padding_mode, use_res=use_res)
        self.linear = nn.Conv2d(num_channel_f, num_channel_u, kernel_size=1, bias=True)
        self.act = {"gelu": nn.GELU(), "relu": nn.ReLU(), "tanh": nn.Tanh(), "silu": nn.SiLU()}[activation]

    def forward(self, u):
        return self.act(self.conv(u) + self.linear(u))


# gaurav71531/mwt-operator@4b0770c models/models.py: MWT_CZ1d with sparseKernelFT1d (complex weights1).
# Deviation: the filter buffers ec_s, ec_d, rc_e, rc_o are float64 and taken from
# refattn.operators.multiwavelet.multiwavelet_filters (upstream's get_filter in models/utils.py builds the
# same filters, equal to 2e-13 for k <= 3, and stores them as float32); they are buffers the
# interop table reads and drops, so the test is about the layer's computation and the mapping.


class SparseKernelFT1d(nn.Module):
    def __init__(self, k, alpha, c=1):
        super().__init__()
        self.modes1 = alpha
        self.weights1 = nn.Parameter(torch.rand(c * k, c * k, alpha, dtype=torch.cdouble) / (c * k * c * k))

    def forward(self, x):
        B, N, c, k = x.shape
        x_fft = torch.fft.rfft(x.reshape(B, N, -1).permute(0, 2, 1))
        ell = min(self.modes1, N // 2 + 1)
        out_ft = torch.zeros(B, c * k, N // 2 + 1, dtype=torch.cdouble)
        out_ft[:, :, :ell] = torch.einsum("bix,iox->box", x_fft[:, :, :ell], self.weights1[:, :, :ell])
        return torch.fft.irfft(out_ft, n=N).permute(0, 2, 1).reshape(B, N, c, k)


class MWTCZ1d(nn.Module):
    def __init__(self, k=3, alpha=5, L=0, c=1, base="legendre"):
        from refattn.operators.multiwavelet import multiwavelet_filters

        super().__init__()
        self.k, self.L = k, L
        f = {n: torch.as_tensor(a, dtype=torch.float64) for n, a in multiwavelet_filters(k, base).items()}
        self.A, self.B, self.C = (SparseKernelFT1d(k, alpha, c) for _ in range(3))
        self.T0 = nn.Linear(k, k)
        self.register_buffer("ec_s", torch.cat((f["H0"].T, f["H1"].T), 0))
        self.register_buffer("ec_d", torch.cat((f["G0"].T, f["G1"].T), 0))
        self.register_buffer("rc_e", torch.cat((f["H0"] @ f["PHI0"], f["G0"] @ f["PHI0"]), 0))
        self.register_buffer("rc_o", torch.cat((f["H1"] @ f["PHI1"], f["G1"] @ f["PHI1"]), 0))

    def forward(self, x):
        ns = math.floor(math.log2(x.shape[1]))
        Ud, Us = [], []
        for _ in range(ns - self.L):
            xa = torch.cat([x[:, ::2], x[:, 1::2]], -1)
            d, x = xa @ self.ec_d, xa @ self.ec_s
            Ud.append(self.A(d) + self.B(x))
            Us.append(self.C(d))
        x = self.T0(x)
        for i in range(ns - 1 - self.L, -1, -1):
            x = torch.cat((x + Us[i], Ud[i]), -1)
            B, N, c, _ = x.shape
            out = x.new_zeros(B, 2 * N, c, self.k)
            out[:, ::2], out[:, 1::2] = x @ self.rc_e, x @ self.rc_o
            x = out
        return x


# emazap7/ANIE@2071ad7 IE_source/kernels.py: model_blocks (Final_block=False) with
# IE_source/Galerkin_transformer.py SimpleTransformerEncoderLayer (layer_norm=True, so no attention
# norms; pos_dim=1, so an attn.fc that is unused without pos), SimpleAttention, FeedForward,
# linear_attention, attention; IE_source/Attentional_IE_solver.py Integral_attention_solver_multbatch.solve
# (use_support=False, output_support_tensors=True, c = the free term, d = lam) as anie_solve.
# Deviations: the unconditional F.dropout(p_attn) (p=0.5, training=True) of linear_attention/attention
# and every nn.Dropout are omitted; no masks, no spline interpolation, no logging.


class ANIEAttention(nn.Module):
    def __init__(self, n_head, d_model, attention_type="galerkin", pos_dim=1):
        super().__init__()
        self.attention_type, self.d_k, self.n_head = attention_type, d_model // n_head, n_head
        self.linears = nn.ModuleList([nn.Linear(d_model, d_model) for _ in range(3)])
        self.fc = nn.Linear(d_model + n_head * pos_dim, d_model)  # used only with pos upstream

    def forward(self, x):
        b = x.size(0)
        q, k, v = (lin(x).view(b, -1, self.n_head, self.d_k).transpose(1, 2) for lin in self.linears)
        n = q.size(-2)
        if self.attention_type == "galerkin":
            out = q @ (k.transpose(-2, -1) @ v / n)
        else:
            s = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)
            out = (F.softmax(s, dim=-1) if self.attention_type == "softmax" else s / n) @ v
        return out.transpose(1, 2).contiguous().view(b, -1, self.n_head * self.d_k)


class ANIEFeedForward(nn.Module):
    def __init__(self, in_dim, dim_feedforward, activation="relu"):
        super().__init__()
        self.lr1, self.lr2 = nn.Linear(in_dim, dim_feedforward), nn.Linear(dim_feedforward, in_dim)
        self.activation = {"silu": nn.SiLU(), "gelu": nn.GELU()}.get(activation, nn.ReLU())

    def forward(self, x):
        return self.lr2(self.activation(self.lr1(x)))


class ANIEEncoderLayer(nn.Module):
    def __init__(self, d_model, n_head, dim_feedforward, attention_type, activation_type="relu", norm_eps=1e-5):
        super().__init__()
        self.attn = ANIEAttention(n_head, d_model, attention_type)
        self.layer_norm1, self.layer_norm2 = nn.LayerNorm(d_model, eps=norm_eps), nn.LayerNorm(d_model, eps=norm_eps)
        self.ff = ANIEFeedForward(d_model, dim_feedforward, activation_type)

    def forward(self, x):
        x = self.layer_norm1(x + self.attn(x))
        return self.layer_norm2(x + self.ff(x))


class ModelBlocks(nn.Module):
    def __init__(self, dimension, dim_emb, n_head, n_blocks, n_ff, attention_type, activation_type="relu"):
        super().__init__()
        self.n_head = n_head
        self.first = nn.Linear(dimension + 1, dim_emb)
        self.blocks = nn.ModuleList([ANIEEncoderLayer(dim_emb, n_head, n_ff, attention_type, activation_type)
                                     for _ in range(n_blocks)])
        self.last_block = nn.Linear(dim_emb, dimension + 1)
        self.solve = anie_solve

    def forward(self, x):
        x = self.first(x)
        for block in self.blocks:
            x = block(x)
        return self.last_block(x)


def anie_solve(encoder, times, c, lam=1.0, max_iterations=3, smoothing_factor=0.5, tol=0.0, accumulate_grads=True):
    """``Integral_attention_solver_multbatch(times, y_0, c=..., d=..., Encoder=encoder, ...).solve()``:
    times (N,), c (B, N, dim) the free term; returns y_guess (B, N, dim)."""
    dim = c.shape[-1]

    def rhs(y):
        y_in = torch.cat([y, times.view(1, -1, 1).repeat(c.shape[0], 1, 1)], -1)
        if not accumulate_grads:
            y_in = y_in.detach().requires_grad_(True)
        return c + lam * (encoder(y_in) + y_in)[:, :, :dim]

    y_cur = c
    y_guess = rhs(y_cur)
    err, it = torch.sqrt(torch.sum((y_cur - y_guess) ** 2)), 0
    while err > tol:
        y_cur = smoothing_factor * y_cur + (1 - smoothing_factor) * y_guess
        y_guess = rhs(y_cur)
        err, it = torch.sqrt(torch.sum((y_cur - y_guess) ** 2)), it + 1
        if it >= max_iterations:
            break
    return y_guess


# Math-ML-X/Mamba-Neural-Operator@d7de3b7 MambaGalerkinTransformer/libs/mamba_ops.py (K = 2:
# bi_selective_scan, CrossScan/CrossMerge over [x, flip(x)]) and mamba_ops_4.py (K = 4: cross_selective_scan
# over a square grid: row-major, column-major and both flipped): SS2D (forward_type 'v2' = forward_corev3,
# ssm_conv=0, ssm_rank_ratio >= ssm_ratio, softmax_version=False), with state-spaces/mamba
# selective_scan_ref for the CUDA SelectiveScan (upstream calls the kernel of that function).
# Deviations: the .to(torch.float) / .float() casts are dropped (float64 stays float64); dropout omitted.


def selective_scan_ref(u, delta, A, B, C, D, delta_bias, delta_softplus=True):
    """u, delta (b, d, l); A (d, n); B, C (b, g, n, l) with d = g h; D, delta_bias (d,)."""
    delta = delta + delta_bias[..., None]
    if delta_softplus:
        delta = F.softplus(delta)
    dim, g = A.shape[0], B.shape[1]
    B = B.repeat_interleave(dim // g, dim=1)
    C = C.repeat_interleave(dim // g, dim=1)
    dA = torch.exp(torch.einsum("bdl,dn->bdln", delta, A))
    dBu = torch.einsum("bdl,bdnl,bdl->bdln", delta, B, u)
    x, ys = A.new_zeros((u.shape[0], dim, A.shape[1])), []
    for i in range(u.shape[2]):
        x = dA[:, :, i] * x + dBu[:, :, i]
        ys.append(torch.einsum("bdn,bdn->bd", x, C[:, :, :, i]))
    return torch.stack(ys, dim=2) + u * D[:, None]


class SS2D(nn.Module):
    def __init__(self, d_model, d_state=16, ssm_ratio=2.0, dt_rank="auto", K=2):
        super().__init__()
        d_inner = int(ssm_ratio * d_model)
        self.dt_rank = math.ceil(d_model / 16) if dt_rank == "auto" else dt_rank
        self.d_state, self.K = d_state, K
        self.in_proj = nn.Linear(d_model, d_inner * 2, bias=False)
        self.act = nn.SiLU()
        self.out_norm = nn.LayerNorm(d_inner)
        self.x_proj_weight = nn.Parameter(torch.randn(K, self.dt_rank + 2 * d_state, d_inner) / math.sqrt(d_inner))
        std = self.dt_rank ** -0.5
        self.dt_projs_weight = nn.Parameter(torch.empty(K, d_inner, self.dt_rank).uniform_(-std, std))
        dt = torch.exp(torch.rand(K, d_inner) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3)).clamp(min=1e-4)
        self.dt_projs_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        self.A_logs = nn.Parameter(torch.log(torch.arange(1, d_state + 1, dtype=torch.float64)).repeat(K * d_inner, 1))
        self.Ds = nn.Parameter(torch.ones(K * d_inner))
        self.out_proj = nn.Linear(d_inner, d_model, bias=False)

    def _scan(self, x):  # x (B, D, L) -> xs (B, K, D, L)
        if self.K == 2:
            return torch.stack([x, x.flip(-1)], 1)
        B, D, L = x.shape
        h = int(math.sqrt(L))
        x2 = x.view(B, D, h, h)
        xs = torch.stack([x2.flatten(2, 3), x2.transpose(2, 3).flatten(2, 3)], 1)
        return torch.cat([xs, xs.flip(-1)], 1)

    def _merge(self, ys):  # ys (B, K, D, L) -> (B, D, L)
        if self.K == 2:
            return ys[:, 0] + ys[:, 1].flip(-1)
        B, _, D, L = ys.shape
        h = int(math.sqrt(L))
        ys = ys[:, 0:2] + ys[:, 2:4].flip(-1)
        return ys[:, 0] + ys[:, 1].view(B, D, h, h).transpose(2, 3).contiguous().view(B, D, L)

    def forward(self, x):
        x, z = self.act(self.in_proj(x)).chunk(2, dim=-1)
        x = x.permute(0, 2, 1).contiguous()
        B, D, L = x.shape
        N, R = self.d_state, self.dt_rank
        xs = self._scan(x)
        dts, Bs, Cs = torch.split(torch.einsum("bkdl,kcd->bkcl", xs, self.x_proj_weight), [R, N, N], dim=2)
        dts = torch.einsum("bkrl,kdr->bkdl", dts, self.dt_projs_weight)
        ys = selective_scan_ref(xs.reshape(B, -1, L), dts.reshape(B, -1, L), -torch.exp(self.A_logs), Bs, Cs,
                                self.Ds, self.dt_projs_bias.view(-1)).view(B, self.K, -1, L)
        y = self.out_norm(self._merge(ys).transpose(1, 2))
        return self.out_proj(y * z)


# tum-pbs/pde-transformer@850e09d pdetransformer/core/separate_channels/pde_transformer.py: the channel-attention
# branch of HATDiTBlock.forward (adain_2 = AdaLayerNormZero without emb_impl, norm2 = nn.LayerNorm,
# attn_channel = SelfAttention(posemb_type='none')), as the module HATDiTChannelBranch with the block's
# submodule names; forward(x (B, C, P, d), emb (B, C, d)). Deviations: one window (no carrier tokens); the
# einops rearranges written as reshape/permute.


class AdaLayerNormZero(nn.Module):
    def __init__(self, embedding_dim, bias=True):
        super().__init__()
        self.silu = nn.SiLU()
        self.linear = nn.Linear(embedding_dim, 9 * embedding_dim, bias=bias)
        self.norm = nn.LayerNorm(embedding_dim, elementwise_affine=False, eps=1e-6)  # not used by the block

    def forward(self, emb):
        return self.linear(self.silu(emb)).chunk(9, dim=1)


class PDESelfAttention(nn.Module):
    def __init__(self, dim, num_heads, bias=False, attn_type="v2"):
        super().__init__()
        self.dim, self.heads, self.scale, self.attn_type = dim, num_heads, (dim // num_heads) ** -0.5, attn_type
        self.to_qkv = nn.Linear(dim, dim * 3, bias=bias)
        if attn_type == "v2":
            self.logit_scale = nn.Parameter(torch.log(10 * torch.ones((num_heads, 1, 1))))

    def forward(self, x):
        b, p, n, c = x.size()
        q, k, v = (t.reshape(b, p, n, self.heads, c // self.heads).permute(0, 1, 3, 2, 4)
                   for t in self.to_qkv(x).chunk(3, dim=-1))
        if self.attn_type is None:
            attn = q @ k.transpose(-2, -1) * self.scale
        else:
            attn = F.normalize(q, dim=-1) @ F.normalize(k, dim=-1).transpose(-2, -1)
            attn = attn * torch.clamp(self.logit_scale, max=4.6052).exp()
        return (attn.softmax(dim=-1) @ v).permute(0, 1, 3, 2, 4).reshape(b, p, n, c)


class HATDiTChannelBranch(nn.Module):
    def __init__(self, hidden_size, num_heads, attn_type="v2"):
        super().__init__()
        self.num_heads = num_heads
        self.adain_2 = AdaLayerNormZero(hidden_size)
        self.norm2 = nn.LayerNorm(hidden_size)
        self.attn_channel = PDESelfAttention(hidden_size, num_heads, attn_type=attn_type)

    def forward(self, x, emb):
        B, C = x.shape[:2]
        _, _, _, shift, scale, gate, _, _, _ = self.adain_2(emb.reshape(-1, emb.shape[-1]))
        shift, scale, gate = (t.view(B, C, 1, -1) for t in (shift, scale, gate))
        h = self.norm2(x) * (1 + scale) + shift
        h = self.attn_channel(h.permute(0, 2, 1, 3)).permute(0, 2, 1, 3)
        return x + h * (1 + gate)


# AdityaLab/pinnsformer@00d790f model/pinnsformer.py: PINNsformer (WaveAct, FeedForward(d_ff=256),
# EncoderLayer, DecoderLayer, Encoder, Decoder; torch.nn.MultiheadAttention, batch_first). Deviations: none
# (util.get_clones written as deepcopies; FeedForward's width d_ff is a constructor argument here, 256 upstream,
# so that the tests stay small).


class WaveAct(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1, self.w2 = nn.Parameter(torch.ones(1)), nn.Parameter(torch.ones(1))

    def forward(self, x):
        return self.w1 * torch.sin(x) + self.w2 * torch.cos(x)


def _wave_mlp(d_in, d_hidden, d_out):
    return nn.Sequential(nn.Linear(d_in, d_hidden), WaveAct(), nn.Linear(d_hidden, d_hidden), WaveAct(),
                         nn.Linear(d_hidden, d_out))


class PINNsFeedForward(nn.Module):
    def __init__(self, d_model, d_ff=256):
        super().__init__()
        self.linear = _wave_mlp(d_model, d_ff, d_model)

    def forward(self, x):
        return self.linear(x)


class PINNsLayer(nn.Module):  # EncoderLayer (forward(x)) and DecoderLayer (forward(x, e_outputs))
    def __init__(self, d_model, heads, d_ff=256):
        super().__init__()
        self.attn = nn.MultiheadAttention(embed_dim=d_model, num_heads=heads, batch_first=True)
        self.ff = PINNsFeedForward(d_model, d_ff)
        self.act1, self.act2 = WaveAct(), WaveAct()

    def forward(self, x, e_outputs=None):
        x2 = self.act1(x)
        kv = x2 if e_outputs is None else e_outputs
        x = x + self.attn(x2, kv, kv)[0]
        return x + self.ff(self.act2(x))


class PINNsStack(nn.Module):  # Encoder / Decoder
    def __init__(self, d_model, N, heads, d_ff=256):
        super().__init__()
        self.layers = nn.ModuleList([PINNsLayer(d_model, heads, d_ff) for _ in range(N)])
        self.act = WaveAct()

    def forward(self, x, e_outputs=None):
        for layer in self.layers:
            x = layer(x, e_outputs)
        return self.act(x)


class PINNsformer(nn.Module):
    def __init__(self, d_out, d_model, d_hidden, N, heads, d_ff=256):
        super().__init__()
        self.heads = heads
        self.linear_emb = nn.Linear(2, d_model)
        self.encoder = PINNsStack(d_model, N, heads, d_ff)
        self.decoder = PINNsStack(d_model, N, heads, d_ff)
        self.linear_out = _wave_mlp(d_model, d_hidden, d_out)

    def forward(self, x, t):
        src = self.linear_emb(torch.cat((x, t), dim=-1))
        return self.linear_out(self.decoder(src, self.encoder(src)))


# HaoZhongkai/GNOT@5ee2e69 models/mmgpt.py: MIOECrossAttentionBlock's geometric-gated expert FFN, the lines
# gate_score = softmax(gatenet(pos)); x_moe1 = sum_e gate_score_e * moe_mlp1[e](x), as the module
# GNOTGatedMoE with the block's submodule names gatenet and moe_mlp1. No deviations in the computation.


class GNOTGatedMoE(nn.Module):
    def __init__(self, n_embd, n_inner, space_dim, n_experts, act="gelu"):
        super().__init__()
        Act = {"gelu": nn.GELU, "tanh": nn.Tanh, "relu": nn.ReLU, "sigmoid": nn.Sigmoid}[act]
        self.n_experts = n_experts
        self.moe_mlp1 = nn.ModuleList([nn.Sequential(nn.Linear(n_embd, n_inner), Act(), nn.Linear(n_inner, n_embd))
                                       for _ in range(n_experts)])
        self.gatenet = nn.Sequential(nn.Linear(space_dim, n_inner), Act(), nn.Linear(n_inner, n_inner), Act(),
                                     nn.Linear(n_inner, n_experts))

    def forward(self, x, pos):
        gate_score = F.softmax(self.gatenet(pos), dim=-1).unsqueeze(2)
        x_moe1 = torch.stack([self.moe_mlp1[i](x) for i in range(self.n_experts)], dim=-1)
        return (gate_score * x_moe1).sum(dim=-1, keepdim=False)


# xjffff/FUNCATTN@1d93f74 PDE-StandardBenchmark/model/Functional_attention.py:
# FunctionalMap_Attention_Structured_Mesh_2D (conv slice front on an H x W mesh, clamped temperature, ridge
# functional map among the slice coefficients). Deviation: dropout omitted (eval).


class FunctionalMapAttentionStructuredMesh2D(nn.Module):
    def __init__(self, embed_dim, num_heads=8, dropout=0.0, basis_num=64, H=101, W=31, kernel=3, alpha_init=0):
        super().__init__()
        dim_head = embed_dim // num_heads
        self.dim_head, self.heads, self.H, self.W = dim_head, num_heads, H, W
        self.temperature = nn.Parameter(torch.ones([1, num_heads, 1, 1]) * 0.5)
        self.in_project_x = nn.Conv2d(embed_dim, embed_dim, kernel, 1, kernel // 2)
        self.in_project_fx = nn.Conv2d(embed_dim, embed_dim, kernel, 1, kernel // 2)
        self.in_project_basis = nn.Linear(dim_head, basis_num)
        self.to_q = nn.Linear(dim_head, dim_head, bias=False)
        self.to_k = nn.Linear(dim_head, dim_head, bias=False)
        self.to_v = nn.Linear(dim_head, dim_head, bias=False)
        self.to_out = nn.Sequential(nn.Linear(embed_dim, embed_dim), nn.Dropout(dropout))
        self.alpha = nn.Parameter(torch.tensor(float(alpha_init)))
        self.register_buffer("I_d", torch.eye(dim_head).unsqueeze(0))

    def forward(self, x):
        B, N, C = x.shape
        xi = x.reshape(B, self.H, self.W, C).permute(0, 3, 1, 2)

        def heads(t):
            return t.permute(0, 2, 3, 1).reshape(B, N, self.heads, self.dim_head).permute(0, 2, 1, 3)

        fx_mid, x_mid = heads(self.in_project_fx(xi)), heads(self.in_project_x(xi))
        sw = torch.softmax(self.in_project_basis(x_mid) / torch.clamp(self.temperature, min=0.1, max=5), -1)
        st = torch.einsum("bhnc,bhng->bhgc", fx_mid, sw) / (sw.sum(2) + 1e-5)[:, :, :, None]
        q, k, v = self.to_q(st), self.to_k(st), self.to_v(st)
        a = torch.sigmoid(self.alpha)
        Z = torch.linalg.solve((1 - a) * (k.transpose(2, 3) @ k) + a * self.I_d, k.transpose(2, 3))
        ox = torch.einsum("bhgc,bhng->bhnc", (q @ Z) @ v, sw)
        return self.to_out(ox.permute(0, 2, 1, 3).reshape(B, N, -1))


# hodgeformer/hodgeformer@3d6d527 packages/mesh_opformer/src/mesh_opformer/layers/attention_hodge.py:
# MeshMultiHeadHodgeAttention (hodge_type 'diag' or 'full'; norm_type 'layer_norm' or False) with
# mesh_attention_v/e/f, hodge_diagonal_ops, hodge_full_ops; utils.py AccelerateOperator (its diffusion_time
# is created per head but never used by the forward). Deviations: the .float() casts before the incidence
# products are dropped (float64 stays float64); dropout omitted; no 'grouped'/'full-linear' Hodge types.


class AccelerateOperator(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.diffusion_time = nn.Parameter(torch.zeros(dim))


def _hodge_diag(x, q, k, inv, eps=1e-6):
    h = torch.einsum("bhmd,bhmd->bhm", q, k) / math.sqrt(q.size(-1))
    return (torch.reciprocal(h + eps) if inv else h).unsqueeze(-1) * x


def _hodge_full(x, q, k, inv):
    qk = torch.einsum("bhmd,bhnd->bhnm" if inv else "bhnd,bhmd->bhnm", q, k) / math.sqrt(q.size(-1))
    return torch.einsum("bhlk,bhkd->bhld", torch.softmax(qk, dim=-1), x)


def _bmm_heads(d, x):
    return torch.stack([torch.bmm(d, x[:, i]) for i in range(x.size(1))], dim=1)


class MeshMultiHeadHodgeAttention(nn.Module):
    LINEARS = {"v": [[1, 1, 1], [1, 1, 0], [0, 0, 0]], "e": [[1, 1, 0], [1, 1, 1], [1, 1, 0]],
               "f": [[0, 0, 0], [1, 1, 0], [1, 1, 1]]}
    LINEARS_SYM = {"v": [[1, 0, 1], [1, 0, 0], [0, 0, 0]], "e": [[1, 0, 0], [1, 0, 1], [1, 0, 0]],
                   "f": [[0, 0, 0], [1, 0, 0], [1, 0, 1]]}

    def __init__(self, h, d_v, d_e, d_f, attn_sym=True, norm_type="layer_norm", hodge_type="diag", attn_acc=True,
                 modes=("v", "e")):
        super().__init__()
        self.h, self.d_k, self.modes = h, d_v // h, modes
        self.attn_sym, self.norm_type, self.hodge_type = attn_sym, norm_type, hodge_type
        table = self.LINEARS_SYM if attn_sym else self.LINEARS
        layers = [[any(table[m][r][j] for m in modes) for j in range(3)] for r in range(3)]
        for name, row, d in zip(("v_linears", "e_linears", "f_linears"), layers, (d_v, d_e, d_f)):
            setattr(self, name, nn.ModuleList([nn.Linear(d, d, bias=False) if on else nn.Identity() for on in row]))
        for s, d in zip("vef", (d_v, d_e, d_f)):
            setattr(self, f"{s}_acc", nn.ModuleList([AccelerateOperator(d // h) if s in modes and attn_acc
                                                     else nn.Identity() for _ in range(h)]))
            setattr(self, f"{s}_linear_out", nn.Linear(d, d) if s in modes else nn.Identity())

    def _proj(self, linears, x):
        b = x.size(0)
        q, k, v = (lin(x).view(b, -1, self.h, self.d_k).transpose(1, 2) for lin in linears)
        if self.norm_type:
            q, k = (F.layer_norm(t, (self.d_k,)) for t in (q, k))  # per-head LayerNorm, no affine
        return q, (q if self.attn_sym else k), v

    def forward(self, x_v, x_e, x_f, d_0, d_1):
        op = _hodge_diag if self.hodge_type == "diag" else _hodge_full
        (vQ, vK, vV), (eQ, eK, eV), (fQ, fK, fV) = (self._proj(lin, x) for lin, x in
                                                    ((self.v_linears, x_v), (self.e_linears, x_e),
                                                     (self.f_linears, x_f)))
        b, c = x_v.size(0), self.h * self.d_k
        d0t, d1t = d_0.transpose(-2, -1), d_1.transpose(-2, -1)
        if "v" in self.modes:
            x = op(_bmm_heads(d_0, vV), eQ, eK, False)
            x_v = op(_bmm_heads(d0t, x), vQ, vK, True).transpose(1, 2).reshape(b, -1, c)
        if "e" in self.modes:
            x = op(_bmm_heads(d1t, op(_bmm_heads(d_1, eV), fQ, fK, False)), eQ, eK, True)
            y = _bmm_heads(d_0, op(_bmm_heads(d0t, op(eV, eQ, eK, False)), vQ, vK, True))
            x_e = (y + x).transpose(1, 2).reshape(b, -1, c)
        if "f" in self.modes:
            y = _bmm_heads(d_1, op(_bmm_heads(d1t, op(fV, fQ, fK, False)), eQ, eK, True))
            x_f = y.transpose(1, 2).reshape(b, -1, c)
        return self.v_linear_out(x_v), self.e_linear_out(x_e), self.f_linear_out(x_f)


# neuraloperator/neuraloperator@93d3f06 neuralop/layers/differential_conv.py: FiniteDifferenceConvolution
# ('subtract_middle'; self.weight aliases conv.weight, so both keys are in its state_dict) and
# discrete_continuous_convolution.py: EquidistantDiscreteContinuousConv2d (piecewise-linear basis; weight
# (C_out, C_in/groups, (n_r - 1) n_phi + 1), of which the basis uses the first columns); local_no_block.py
# LocalNOBlocks adds differential[i](x, grid_width) + local_convs[i](x), here the module LocalNOKernels
# (keys differential.*, local_conv.*). Deviation: the non-persistent local_filter_matrix buffer is built with
# refattn.operators.disco_conv.disco_filter_matrix in float64 (upstream's _precompute_convolution_filter_matrix
# builds the same matrix in float32); it is not in the state_dict.


class FiniteDifferenceConvolution(nn.Module):
    def __init__(self, in_channels, out_channels, n_dim, kernel_size=3, groups=1, padding="periodic"):
        super().__init__()
        self.groups, self.n_dim = groups, n_dim
        mode = {"periodic": "circular", "replicate": "replicate", "reflect": "reflect", "zeros": "zeros"}[padding]
        self.conv = getattr(nn, f"Conv{n_dim}d")(in_channels, out_channels, kernel_size=kernel_size, padding="same",
                                                 padding_mode=mode, bias=False, groups=groups)
        self.conv_function = getattr(F, f"conv{n_dim}d")
        self.weight = self.conv.weight

    def forward(self, x, grid_width):
        conv_sum = torch.sum(self.conv.weight, dim=tuple(range(2, 2 + self.n_dim)), keepdim=True)
        return (self.conv(x) - self.conv_function(x, conv_sum, groups=self.groups)) / grid_width


class EquidistantDiscreteContinuousConv2d(nn.Module):
    def __init__(self, in_channels, out_channels, in_shape, out_shape, kernel_shape, domain_length=None, groups=1,
                 bias=True, radius_cutoff=None):
        from refattn.operators.disco_conv import disco_filter_matrix

        super().__init__()
        self.kernel_shape = [kernel_shape] * 2 if isinstance(kernel_shape, int) else list(kernel_shape)
        self.kernel_size = (self.kernel_shape[0] - 1) * self.kernel_shape[1] + 1
        self.groups, self.in_shape = groups, tuple(in_shape)
        self.weight = nn.Parameter(torch.randn(out_channels, in_channels // groups, self.kernel_size)
                                   * math.sqrt(groups / in_channels))
        self.bias = nn.Parameter(torch.zeros(out_channels)) if bias else None
        L = [2, 2] if domain_length is None else domain_length
        rc = max(L[i] / float(out_shape[i]) for i in (0, 1)) if radius_cutoff is None else radius_cutoff
        self.psi_local_h = math.floor(2 * rc * in_shape[0] / L[0]) + 1
        self.psi_local_w = math.floor(2 * rc * in_shape[1] / L[1]) + 1
        self.scale_h, self.scale_w = in_shape[0] // out_shape[0], in_shape[1] // out_shape[1]
        gx, gy = torch.meshgrid(torch.linspace(-rc, rc, self.psi_local_h, dtype=torch.float64),
                                torch.linspace(-rc, rc, self.psi_local_w, dtype=torch.float64), indexing="ij")
        self.q_weight = L[0] * L[1] / in_shape[0] / in_shape[1]
        q = torch.full((gx.numel(),), self.q_weight, dtype=torch.float64)
        psi = disco_filter_matrix(torch.stack([gx.reshape(-1), gy.reshape(-1)], -1).numpy(), torch.zeros(1, 2).numpy(),
                                  self.kernel_shape, q.numpy(), rc)
        local = torch.zeros(self.kernel_size, self.psi_local_h * self.psi_local_w, dtype=torch.float64)
        local[:psi.shape[0]] = torch.as_tensor(psi[:, 0])
        self.register_buffer("local_filter_matrix", local.reshape(-1, self.psi_local_h, self.psi_local_w),
                             persistent=False)

    def forward(self, x):
        kernel = torch.einsum("kxy,ogk->ogxy", self.local_filter_matrix.permute(0, 2, 1).flip(dims=(-1, -2)),
                              self.weight)
        pad = [(self.psi_local_h + 1) // 2 - 1, (self.psi_local_w + 1) // 2 - 1]
        return F.conv2d(self.q_weight * x, kernel, self.bias, stride=[self.scale_h, self.scale_w], padding=pad,
                        groups=self.groups)


class LocalNOKernels(nn.Module):
    def __init__(self, in_channels, out_channels, default_in_shape, grid_width, disco_kernel_shape=(2, 4),
                 radius_cutoff=None, fin_diff_kernel_size=3, mix_derivatives=True, conv_padding_mode="periodic",
                 disco_groups=1, domain_length=(2, 2)):
        super().__init__()
        self.grid_width, self.default_in_shape = grid_width, tuple(default_in_shape)
        self.differential = FiniteDifferenceConvolution(in_channels, out_channels, 2, fin_diff_kernel_size,
                                                        1 if mix_derivatives else in_channels, conv_padding_mode)
        self.local_conv = EquidistantDiscreteContinuousConv2d(in_channels, out_channels, default_in_shape,
                                                              default_in_shape, disco_kernel_shape, domain_length,
                                                              disco_groups, True, radius_cutoff)

    def forward(self, x):
        return self.differential(x, self.grid_width) + self.local_conv(x)
