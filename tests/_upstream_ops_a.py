"""PyTorch modules re-stated from upstream neural-operator files, for ``tests/test_interop_ops_a.py``.

Each class is our own compact re-statement of the cited upstream module (``owner/repo@commit
path: Class`` in the comment above it): upstream parameter names, shapes and forward, only what the
tested configurations use. Deviations are listed per class; common to all: dropout omitted (eval),
float32 casts and ``dtype=torch.float32`` buffers removed so that float64 stays float64.
"""

from __future__ import annotations

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
