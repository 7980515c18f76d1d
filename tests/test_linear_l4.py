"""Local and deformable members of the linear family (issue 15, slice l4): multi-scale deformable
attention (Deformable DETR / RT-DETRv2 / DFA3D).

What the generated registry tests cannot express:

* the core's hand-derived gradients under every ``F.grid_sample`` convention (padding x
  align_corners) by finite differences, and against PyTorch autograd through ``F.grid_sample``;
* the layer's gradients for box references, a padding mask, per-level point counts and discrete
  sampling (finite differences);
* the RT-DETRv2 clamp guard and argument errors.

Upstream parity runs (official code run in float64) are quoted in the docs; they are not committed.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest

from refattn.attention.linear._samples import fd_max_rel
from refattn.nn.sampling import PADDING_MODES

msda = importlib.import_module("refattn.attention.linear.ms_deform_attn")


@pytest.mark.parametrize("padding_mode", PADDING_MODES)
@pytest.mark.parametrize("align_corners", [False, True])
def test_msda_core_fd_every_convention(padding_mode, align_corners):
    rng = np.random.default_rng(7)
    smp = msda._core_sample(rng, (1, 2), ((2, 3), (2, 2)), 2, padding_mode, align_corners, m=1, d=1)
    err = fd_max_rel(msda.ms_deform_attn_core_forward, msda.ms_deform_attn_core_backward, smp)
    assert err < 1e-6


@pytest.mark.parametrize("padding_mode", PADDING_MODES)
@pytest.mark.parametrize("align_corners", [False, True])
def test_msda_core_matches_torch_grid_sample(padding_mode, align_corners):
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    rng = np.random.default_rng(3)
    smp = msda._core_sample(rng, padding_mode=padding_mode, align=align_corners)
    out, cache = msda.ms_deform_attn_core_forward(**smp.inputs, **smp.config)
    g = rng.standard_normal(out.shape)
    grads = msda.ms_deform_attn_core_backward(g, cache)
    t = {k: torch.tensor(v, requires_grad=True) for k, v in smp.inputs.items()}
    v, loc, a = t["value"], t["sampling_locations"], t["attention_weights"]
    b, lq, m, _ = a.shape
    d = v.shape[-1]
    y, start, p0 = 0, 0, 0
    for (h, w), pl in zip(smp.config["spatial_shapes"], smp.config["points_per_level"]):
        vl = v[:, start:start + h * w].permute(0, 2, 3, 1).reshape(b * m, d, h, w)
        gl = (2 * loc[:, :, :, p0:p0 + pl] - 1).permute(0, 2, 1, 3, 4).reshape(b * m, lq, pl, 2)
        s = F.grid_sample(vl, gl, mode="bilinear", padding_mode=padding_mode, align_corners=align_corners)
        al = a[:, :, :, p0:p0 + pl].permute(0, 2, 1, 3).reshape(b * m, 1, lq, pl)
        y = y + (s * al).sum(-1)
        start, p0 = start + h * w, p0 + pl
    y = y.reshape(b, m * d, lq).transpose(1, 2)
    y.backward(torch.tensor(g))
    assert np.max(np.abs(out - y.detach().numpy())) < 1e-12
    for k in t:
        assert np.max(np.abs(grads[k] - t[k].grad.numpy())) < 1e-12, k


@pytest.mark.parametrize("variant", ["boxes", "padding_mask", "discrete", "shared_points"])
def test_msda_layer_fd_variants(variant):
    rng = np.random.default_rng(11)
    smp = msda._draw(rng, "tiny", method="discrete" if variant == "discrete" else "default",
                     ref_dim=4 if variant == "boxes" else 2,
                     shared_ref=variant == "shared_points")
    if variant == "padding_mask":
        mask = np.zeros(smp.inputs["input_flatten"].shape[:2], dtype=bool)
        mask[:, -2:] = True
        smp.config["input_padding_mask"] = mask
    err = fd_max_rel(msda.ms_deform_attn_forward, msda.ms_deform_attn_backward, smp)
    assert err < 1e-6


def test_msda_padding_mask_zeroes_padded_values():
    rng = np.random.default_rng(2)
    smp = msda._draw(rng, "tiny", method="default")
    mask = np.zeros(smp.inputs["input_flatten"].shape[:2], dtype=bool)
    mask[:, -3:] = True
    a = msda.ms_deform_attn(**smp.inputs, params=smp.params, input_padding_mask=mask, **smp.config)
    x = smp.inputs["input_flatten"].copy()
    x[:, -3:] = rng.standard_normal(x[:, -3:].shape) * 100
    b = msda.ms_deform_attn(**dict(smp.inputs, input_flatten=x), params=smp.params, input_padding_mask=mask,
                            **smp.config)
    assert np.max(np.abs(a - b)) < 1e-12
    out, cache = msda.ms_deform_attn_forward(**smp.inputs, params=smp.params, input_padding_mask=mask, **smp.config)
    gx = msda.ms_deform_attn_backward(np.ones_like(out), cache)["input_flatten"]
    assert not np.any(gx[:, -3:]) and np.any(gx[:, :-3])


def test_msda_rtdetrv2_clamp_guard():
    # Upstream clips x to H-1 on every level; on a level narrower than it is tall that indexes past the row.
    v = np.zeros((2, 6, 1, 1))
    loc = np.full((2, 1, 1, 1, 1, 2), 0.99)
    with pytest.raises(ValueError, match="per_axis"):
        msda.ms_deform_attn_core_forward(v, loc, np.ones(loc.shape[:-1]), spatial_shapes=((3, 2),),
                                         method="discrete")
    out = msda.ms_deform_attn_core_forward(v, loc, np.ones(loc.shape[:-1]), spatial_shapes=((3, 2),),
                                           method="discrete", discrete_clamp="per_axis")[0]
    assert out.shape == (2, 1, 1)


def test_msda_argument_errors():
    v = np.zeros((2, 6, 1, 2))
    loc = np.full((2, 1, 1, 1, 1, 2), 0.3)
    a = np.ones((2, 1, 1, 1, 1))
    with pytest.raises(ValueError, match="value axis 1"):
        msda.ms_deform_attn_core_forward(v, loc, a, spatial_shapes=((2, 2),))
    with pytest.raises(ValueError, match="spatial_shapes"):
        msda.ms_deform_attn_core_forward(v, loc, a, spatial_shapes=((2, 0),))
    with pytest.raises(ValueError, match="attention_weights"):
        msda.ms_deform_attn_core_forward(v, loc, np.ones((2, 1, 1, 1, 2)), spatial_shapes=((2, 3),))
    with pytest.raises(ValueError, match="method"):
        msda.ms_deform_attn_core_forward(v, loc, a, spatial_shapes=((2, 3),), method="nearest")
    with pytest.raises(TypeError, match="align_corners"):
        msda.ms_deform_attn_core_forward(v, loc, a, spatial_shapes=((2, 3),), align_corners=1)
    smp = msda._draw(np.random.default_rng(0), "tiny")
    with pytest.raises(ValueError, match="reference_points"):
        msda.ms_deform_attn_forward(**dict(smp.inputs, reference_points=np.zeros((2, 2, 2, 3))),
                                    params=smp.params, **smp.config)
    with pytest.raises(ValueError, match="n_heads"):
        msda.ms_deform_attn_forward(**smp.inputs, params=smp.params, **dict(smp.config, n_heads=3))
