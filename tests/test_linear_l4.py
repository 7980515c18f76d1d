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
from refattn.registry import Sample

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


# --------------------------------------------------------------------------------------------
# local_window_attention_variants (CLEAR circular windows, MASFormer band layers)

lw = importlib.import_module("refattn.attention.linear.local_window")


def test_clear_without_pooling_fd_and_mask():
    rng = np.random.default_rng(5)
    h, w, t = 2, 3, 2
    inputs = {x: rng.standard_normal((2, 1, t + h * w, 2)) for x in ("q", "k", "v")}
    smp = Sample(inputs=inputs, config={"height": h, "width": w, "text_length": t, "radius": 1.2})
    assert fd_max_rel(lw.clear_attention_forward, lw.clear_attention_backward, smp) < 1e-6
    out = lw.clear_attention(**inputs, **smp.config)
    ref = lw._reference(**inputs, **smp.config)
    assert np.max(np.abs(out - ref)) < 1e-12


def test_clear_image_query_ignores_far_image_keys():
    rng = np.random.default_rng(6)
    h, w, t = 3, 5, 1
    q, k, v = (rng.standard_normal((2, 1, t + h * w, 3)) for _ in range(3))
    a = lw.clear_attention(q, k, v, height=h, width=w, text_length=t, radius=1.5)
    v2 = v.copy()
    v2[:, :, t + 4] += 10.0          # pixel (0, 4): farther than 1.5 from pixel (2, 0) = token t + 10
    b = lw.clear_attention(q, k, v2, height=h, width=w, text_length=t, radius=1.5)
    assert np.max(np.abs(a[:, :, t + 10] - b[:, :, t + 10])) < 1e-12
    assert np.max(np.abs(a[:, :, 0] - b[:, :, 0])) > 1e-3      # the text query sees every token


@pytest.mark.parametrize("causal", [True, False])
def test_band_attention_fd(causal):
    rng = np.random.default_rng(8)
    smp = Sample(inputs={x: rng.standard_normal((2, 1, 5, 2)) for x in ("q", "k", "v")},
                      config={"window": 2, "causal": causal})
    assert fd_max_rel(lw.band_attention_forward, lw.band_attention_backward, smp) < 1e-6
    keep = lw.band_keep_mask(5, 2, causal)
    assert keep.sum() == (9 if causal else 13)


def test_clear_proportional_scale():
    assert abs(lw.clear_proportional_scale(4608, 64) - np.sqrt(np.log(46080) / np.log(4608) / 64)) < 1e-15


def test_local_window_argument_errors():
    q = np.zeros((2, 1, 7, 2))
    with pytest.raises(ValueError, match="text_length"):
        lw.clear_attention(q, q, q, height=2, width=2, radius=1.0, text_length=1)
    with pytest.raises(ValueError, match="down_factor"):
        lw.clear_attention(q, q, q, {"spatial_weight": np.ones((2, 2))}, height=2, width=3, radius=1.0,
                           text_length=1, down_factor=2)
    with pytest.raises(ValueError, match="spatial_weight"):
        lw.clear_attention(np.zeros((2, 1, 9, 2)), np.zeros((2, 1, 9, 2)), np.zeros((2, 1, 9, 2)), {},
                           height=2, width=4, radius=1.0, text_length=1, down_factor=2)
    with pytest.raises(ValueError, match="radius"):
        lw.clear_keep_mask(2, 2, 0, -1.0)
    with pytest.raises(ValueError, match="window"):
        lw.band_keep_mask(4, 0)
