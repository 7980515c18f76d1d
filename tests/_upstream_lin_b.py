"""PyTorch modules restating upstream modules, for ``tests/test_interop_lin_b.py`` (group ``lin_b`` of
``refattn.interop.torch``): parameter names, shapes and forward as upstream, written compactly from the
cited file (not copied). Deviations are listed per module; dropout is omitted (eval mode) throughout.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["MSDeformAttn"]


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
