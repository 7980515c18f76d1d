"""PyTorch modules restating upstream modules, for ``tests/test_interop_lin_b.py`` (group ``lin_b`` of
``refattn.interop.torch``): parameter names, shapes and forward as upstream, written compactly from the
cited file (not copied). Deviations are listed per module; dropout is omitted (eval mode) throughout.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["MSDeformAttn", "LocalDownsampleAttention"]


# ----------------------------------------------------------------------------------------------
# fundamentalvision/Deformable-DETR@11169a60c33333af00a4849f1808023eba96a931
# models/ops/modules/ms_deform_attn.py: MSDeformAttn, with the CUDA MSDeformAttnFunction replaced by
# models/ops/functions/ms_deform_attn_func.py: ms_deform_attn_core_pytorch (the repository's own reference).
# Deviations: none (the level start index is accepted and unused, as by the PyTorch core).


def ms_deform_attn_core_pytorch(value, shapes, locations, weights):
    n, _, m, d = value.shape
    _, lq, _, nl, npt, _ = locations.shape
    levels = value.split([int(h) * int(w) for h, w in shapes], dim=1)
    grids = 2 * locations - 1
    sampled = []
    for lid, (h, w) in enumerate(shapes):
        v = levels[lid].flatten(2).transpose(1, 2).reshape(n * m, d, int(h), int(w))
        g = grids[:, :, :, lid].transpose(1, 2).flatten(0, 1)
        sampled.append(F.grid_sample(v, g, mode="bilinear", padding_mode="zeros", align_corners=False))
    weights = weights.transpose(1, 2).reshape(n * m, 1, lq, nl * npt)
    out = (torch.stack(sampled, dim=-2).flatten(-2) * weights).sum(-1).view(n, m * d, lq)
    return out.transpose(1, 2).contiguous()


class MSDeformAttn(nn.Module):
    def __init__(self, d_model=256, n_levels=4, n_heads=8, n_points=4):
        super().__init__()
        self.d_model, self.n_levels, self.n_heads, self.n_points = d_model, n_levels, n_heads, n_points
        self.sampling_offsets = nn.Linear(d_model, n_heads * n_levels * n_points * 2)
        self.attention_weights = nn.Linear(d_model, n_heads * n_levels * n_points)
        self.value_proj = nn.Linear(d_model, d_model)
        self.output_proj = nn.Linear(d_model, d_model)

    def forward(self, query, reference_points, input_flatten, input_spatial_shapes, input_level_start_index,
                input_padding_mask=None):
        n, lq, _ = query.shape
        _, lin, _ = input_flatten.shape
        value = self.value_proj(input_flatten)
        if input_padding_mask is not None:
            value = value.masked_fill(input_padding_mask[..., None], 0.0)
        value = value.view(n, lin, self.n_heads, self.d_model // self.n_heads)
        offsets = self.sampling_offsets(query).view(n, lq, self.n_heads, self.n_levels, self.n_points, 2)
        attn = self.attention_weights(query).view(n, lq, self.n_heads, self.n_levels * self.n_points)
        attn = F.softmax(attn, -1).view(n, lq, self.n_heads, self.n_levels, self.n_points)
        if reference_points.shape[-1] == 2:
            norm = torch.stack([input_spatial_shapes[..., 1], input_spatial_shapes[..., 0]], -1)
            loc = reference_points[:, :, None, :, None, :] + offsets / norm[None, None, None, :, None, :]
        else:
            loc = (reference_points[:, :, None, :, None, :2]
                   + offsets / self.n_points * reference_points[:, :, None, :, None, 2:] * 0.5)
        out = ms_deform_attn_core_pytorch(value, input_spatial_shapes, loc, attn)
        return self.output_proj(out)


# ----------------------------------------------------------------------------------------------
# Huage001/CLEAR@98e9fed2b8a776a043a0421100db9831879de784 attention_processor.py:
# LocalDownsampleFlexAttnProcessor (its attention on projected q, k, v) and init_local_downsample_mask_flex.
# Deviations: the diffusers Attention projections, norms and rotary embedding around it are left out (the
# record is the core on q, k, v); flex_attention under the block mask is SDPA under the same boolean mask;
# the globals HEIGHT, WIDTH and the mask's text_length, window_size are attributes; the text length 512 of
# `key[:, :, 512:]` is text_length.


def local_downsample_mask(height, width, text_length, window_size, down_factor):
    q_idx = torch.arange(text_length + height * width)[:, None]
    kv_idx = torch.arange(text_length + height * width + (height // down_factor) * (width // down_factor))[None, :]
    q_y, q_x = (q_idx - text_length) // width, (q_idx - text_length) % width
    kv_y, kv_x = (kv_idx - text_length) // width, (kv_idx - text_length) % width
    image = (kv_idx < text_length) | (kv_idx >= text_length + height * width) | (
        (q_y - kv_y) ** 2 + (q_x - kv_x) ** 2 < window_size ** 2)
    return ((q_idx < text_length) & (kv_idx < text_length + height * width)) | ((q_idx >= text_length) & image)


class LocalDownsampleAttention(nn.Module):
    def __init__(self, height, width, text_length, window_size, down_factor=4):
        super().__init__()
        self.height, self.width, self.text_length = height, width, text_length
        self.window_size, self.down_factor = window_size, down_factor
        self.spatial_weight = nn.Parameter(torch.ones(1, 1, 1, down_factor, 1, down_factor, 1) / down_factor ** 2)

    def forward(self, query, key, value):
        f, t, h, w = self.down_factor, self.text_length, self.height, self.width
        scale = math.sqrt(1 / query.shape[-1])
        key_down = (key[:, :, t:].unflatten(2, (h // f, f, w // f, f)) * self.spatial_weight).sum(dim=(3, 5)).flatten(2, 3)
        value_down = (value[:, :, t:].unflatten(2, (h // f, f, w // f, f)) * self.spatial_weight).sum(
            dim=(3, 5)).flatten(2, 3)
        mask = local_downsample_mask(h, w, t, self.window_size, f)
        return F.scaled_dot_product_attention(query, torch.cat([key, key_down], 2), torch.cat([value, value_down], 2),
                                              attn_mask=mask, scale=scale)
