"""Operator slice o5b (issue 17, T3 whole-model entries): what the registry cannot express.

VICON: the encoder stack against ``torch.nn.TransformerEncoder`` with the in-context mask (torch's
own layers, not upstream code), finite differences with the encodings switched off (their keys get
zero gradients), and argument errors.

BENO: finite differences with the ELU MLPs (the record samples SiLU), a one-point boundary (the
circular convolution wraps onto itself), and argument errors.
"""

from __future__ import annotations

import numpy as np
import pytest

from refattn.operators.vicon import in_context_mask, init_vicon_params, vicon_backward, vicon_forward
from refattn.registry import Sample
from refattn.testing import gradcheck


def _vicon_sample(rng, **config):
    p = init_vicon_params(rng, 1, (1, 2), 2, 4, 1, dim_feedforward=3, demo_num=3)
    p = {k: v + 0.3 * rng.standard_normal(v.shape) for k, v in p.items()}
    shape = (2, 2, 1, 2, 4)
    return Sample(inputs={"init": rng.standard_normal(shape), "end": rng.standard_normal(shape)}, params=p,
                  config=dict({"num_heads": 2, "patch_num": 2}, **config))


def test_vicon_encodings_off_fd_and_zero_gradients():
    rng = np.random.default_rng(0)
    s = _vicon_sample(rng, use_patch_pos_encoding=False, use_func_pos_encoding=False)
    gradcheck(vicon_forward, vicon_backward, s)
    g = vicon_backward(np.ones((2, 2, 1, 2, 4)), vicon_forward(**s.inputs, params=s.params, **s.config)[1])
    assert not g["patch_pos_encoding"].any() and not g["func_pos_encoding"].any()
    # and with them on, the unused func_pos_encoding rows (demo_num 3 > 2 pairs) get zero gradient
    s_on = _vicon_sample(rng)
    g = vicon_backward(np.ones((2, 2, 1, 2, 4)), vicon_forward(**s_on.inputs, params=s_on.params, **s_on.config)[1])
    assert not g["func_pos_encoding"][4:].any() and np.abs(g["func_pos_encoding"][:4]).max() > 1e-8


def test_vicon_stack_matches_torch_transformer_encoder():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    s = _vicon_sample(rng)
    p = s.params
    d, heads, layers = 4, 2, 1
    enc = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(d, heads, 3, dropout=0.0, activation="gelu",
                                                                       batch_first=True, dtype=torch.float64),
                                      num_layers=layers, enable_nested_tensor=False)
    sd = {}
    for k, v in p.items():
        if k.startswith("transformer."):
            sd[k[len("transformer."):]] = torch.tensor(v.T.copy() if (k.endswith("weight") and v.ndim == 2) else v)
    enc.load_state_dict(sd)
    init, end = s.inputs["init"], s.inputs["end"]
    b, pairs = init.shape[:2]
    # tokens as refattn builds them: patches of (1, 2), p = 2 per side, order (pair, role, patch)
    frames = np.stack([init, end], axis=2).reshape(b * pairs * 2, 1, 2, 4)
    tok = frames.reshape(-1, 1, 2, 1, 2, 2).transpose(0, 2, 4, 1, 3, 5).reshape(b * pairs * 2, 4, 2)
    t = tok @ p["pre_proj.weight"] + p["pre_proj.bias"] + p["patch_pos_encoding"]
    t = t.reshape(b, pairs * 2, 4, d) + p["func_pos_encoding"][:2 * pairs, None]
    x = torch.tensor(t.reshape(b, -1, d))
    h = enc(x, mask=torch.tensor(~in_context_mask(pairs, 4, 4))).detach().numpy()
    y = h.reshape(b, pairs, 2, 4, d)[:, :, 0] @ p["post_proj.weight"] + p["post_proj.bias"]
    want = y.reshape(b, pairs, 2, 2, 1, 1, 2).transpose(0, 1, 4, 2, 5, 3, 6).reshape(init.shape)
    got = vicon_forward(init, end, p, num_heads=heads, patch_num=2)[0]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-13)


def test_vicon_errors():
    rng = np.random.default_rng(2)
    s = _vicon_sample(rng)
    with pytest.raises(ValueError, match="init and end"):
        vicon_forward(s.inputs["init"], s.inputs["end"][:, :1], s.params, num_heads=2, patch_num=2)
    with pytest.raises(ValueError, match="multiple of patch_num"):
        vicon_forward(s.inputs["init"], s.inputs["end"], s.params, num_heads=2, patch_num=3)
    with pytest.raises(ValueError, match="num_heads"):
        vicon_forward(s.inputs["init"], s.inputs["end"], s.params, num_heads=3, patch_num=2)
    big = np.zeros((2, 4, 1, 2, 4))
    with pytest.raises(ValueError, match="func_pos_encoding"):
        vicon_forward(big, big, s.params, num_heads=2, patch_num=2)
    with pytest.raises(ValueError, match="num_pairs"):
        in_context_mask(0, 1, 1)


# --------------------------------------------------------------------------------------------
# BENO


def test_beno_fd_with_elu_mlps():
    from refattn.operators.beno import _sample, beno_layer_backward, beno_layer_forward

    rng = np.random.default_rng(3)
    s = _sample(rng, "tiny", activation="elu")
    gradcheck(beno_layer_forward, beno_layer_backward, s)


def test_beno_single_boundary_point_wraps_the_circular_conv():
    # L = 1: all three taps of the circular token convolution read the same point (the padding
    # adjoint folds all of them back), and the max pool has one candidate. FD and the formula.
    from refattn.operators.beno import _reference, _sample, beno_layer, beno_layer_backward, beno_layer_forward

    rng = np.random.default_rng(4)
    s = _sample(rng, "tiny")
    s = Sample(inputs=dict(s.inputs, boundary=s.inputs["boundary"][:, :1]), params=s.params, config=s.config)
    gradcheck(beno_layer_forward, beno_layer_backward, s)
    np.testing.assert_allclose(beno_layer(**s.inputs, params=s.params, **s.config),
                               _reference(**s.inputs, params=s.params, **s.config), rtol=0, atol=1e-13)


def test_beno_errors():
    from refattn.operators.beno import _sample, beno_layer

    rng = np.random.default_rng(5)
    s = _sample(rng, "tiny")
    ei = s.config["edge_index"]
    with pytest.raises(ValueError, match="edge_index"):
        beno_layer(**s.inputs, params=s.params, edge_index=ei[:, :-1])
    with pytest.raises(ValueError, match="edge_index entries"):
        beno_layer(**s.inputs, params=s.params, edge_index=ei + 10)
    with pytest.raises(ValueError, match="edge_index"):
        beno_layer(**s.inputs, params=s.params, edge_index=ei.astype(float))
    with pytest.raises(ValueError, match="features per point"):
        beno_layer(**dict(s.inputs, boundary=s.inputs["boundary"][..., :2]), params=s.params, edge_index=ei)
    with pytest.raises(ValueError, match="activation"):
        beno_layer(**s.inputs, params=s.params, edge_index=ei, activation="tanh")


# --------------------------------------------------------------------------------------------
# FNO + transformer hybrid


def test_fno_vit_hybrid_errors():
    from refattn.operators.fno_vit_hybrid import _sample, fno_vit_hybrid

    rng = np.random.default_rng(6)
    s = _sample(rng, "small")
    x = s.inputs["x"]
    with pytest.raises(ValueError, match="v_smooth, v_delta"):
        fno_vit_hybrid(x[:, :1], s.params, num_heads=2)
    with pytest.raises(ValueError, match="multiple of the patch size"):
        fno_vit_hybrid(np.zeros((2, 2, 7, 6)), s.params, num_heads=2)
    with pytest.raises(ValueError, match="num_heads"):
        fno_vit_hybrid(x, s.params, num_heads=4)
    p = dict(s.params)
    del p["smooth_model.projection.weight"]
    with pytest.raises(ValueError, match="smooth_model.projection.weight"):
        fno_vit_hybrid(x, p, num_heads=2)


def test_fno_vit_hybrid_background_is_the_fno_stack():
    # The background alone (head zeroed) equals refattn's FNO spectral convolution composed by
    # hand: lifting, K + skip, projection (one block, no activation after the last).
    from refattn.operators.fno import fno_spectral_conv
    from refattn.operators.fno_vit_hybrid import fno_vit_hybrid, init_fno_vit_hybrid_params

    rng = np.random.default_rng(7)
    p = init_fno_vit_hybrid_params(rng, (8, 8), fno_width=3, fno_layers=1, modes=(2, 3), vit_dim=4, vit_depth=1,
                                   patch_size=4, mlp_hidden=4)
    p["contrast_model.head.weight"][:] = 0
    p["contrast_model.head.bias"][:] = 0
    x = rng.standard_normal((2, 2, 8, 8))
    h = x[:, 0, :, :, None] @ p["smooth_model.lifting.weight"] + p["smooth_model.lifting.bias"]
    spec = {k.split(".")[-1]: v for k, v in p.items() if k.startswith("smooth_model.fno_blocks.0.weights")}
    h = fno_spectral_conv(h, spec) + h @ p["smooth_model.fno_blocks.0.skip.weight"] + p["smooth_model.fno_blocks.0.skip.bias"]
    want = np.moveaxis(h @ p["smooth_model.projection.weight"] + p["smooth_model.projection.bias"], -1, 1)
    np.testing.assert_allclose(fno_vit_hybrid(x, p, num_heads=2), want, rtol=0, atol=1e-13)


# --------------------------------------------------------------------------------------------
# NNs-to-NOs InterpConv2d


@pytest.mark.parametrize("mode", ["bilinear", "fourier"])
def test_interp_conv_first_order_convergence_under_refinement(mode):
    # Base resolution 6, scales 1..16: the error against the finest output (averaged over the
    # blocks forming each coarse cell) decreases at every refinement and at least roughly halves
    # with each doubling from scale 2 on (first order; measured ratios 1.8-2.5 bilinear, 1.3 then
    # 2.0-2.8 Fourier, whose coarsest kernel is pre-asymptotic).
    from refattn.operators.interp_conv import _resolution_errors, _sample

    rng = np.random.default_rng(8)
    p = _sample(rng, "tiny").params
    errs = _resolution_errors(p, 6, (1, 2, 4, 8, 16), mode)
    ratios = [errs[i] / errs[i + 1] for i in range(len(errs) - 1)]
    assert min(ratios) > 1.0 and min(ratios[1:]) > 1.5, (errs, ratios)


def test_interp_conv_fd_fourier_mode_and_groups():
    from refattn.operators.interp_conv import interp_conv2d_backward, interp_conv2d_forward

    rng = np.random.default_rng(9)
    p = {"weight": rng.standard_normal((4, 2, 3, 2)), "bias": rng.standard_normal(4)}
    s = Sample(inputs={"x": rng.standard_normal((2, 4, 6, 6))}, params=p,
               config={"scale": 2.0, "padding": (1, 1), "groups": 2, "interpolation_mode": "fourier"})
    gradcheck(interp_conv2d_forward, interp_conv2d_backward, s)


def test_interp_conv_errors():
    from refattn.operators.interp_conv import interp_conv2d

    rng = np.random.default_rng(10)
    p = {"weight": rng.standard_normal((2, 3, 3, 3))}
    x = rng.standard_normal((2, 3, 8, 8))
    with pytest.raises(ValueError, match="interpolation_mode"):
        interp_conv2d(x, p, scale=2.0, interpolation_mode="cubic")
    with pytest.raises(ValueError, match="scale"):
        interp_conv2d(x, p, scale=0.0)
    with pytest.raises(ValueError, match="channels"):
        interp_conv2d(x[:, :2], p)


# --------------------------------------------------------------------------------------------
# HyPINO decoder


def test_hypino_fd_four_stages_two_latent_layers():
    # The registry's tiny sample has one stage and no latent layer; here all four stage inputs and
    # two latent (gated) layers, small widths so the full Jacobian stays cheap.
    from refattn.operators.hypino import hypino_decoder_backward, hypino_decoder_forward, init_hypino_decoder_params

    rng = np.random.default_rng(11)
    dims = (1, 1, 1, 1)
    p = init_hypino_decoder_params(rng, dims, in_dim=1, lat_dim=1, n_layers=2, num_fourier_features=1, bias_hidden=2)
    p = {k: v + 0.3 * rng.standard_normal(v.shape) for k, v in p.items()}
    inputs = {"xy": rng.uniform(-1, 1, (2, 2, 1))}
    for i, c in enumerate(dims):
        inputs[f"skip_{i}"] = rng.standard_normal((2, 2, c))
    s = Sample(inputs=inputs, params=p, config={"num_heads": (1, 1, 1, 1), "norm_groups": (1, 1, 1, 1, 1),
                                               "num_fourier_features": 1, "activation": "silu"})
    gradcheck(hypino_decoder_forward, hypino_decoder_backward, s)


def test_hypino_errors():
    from refattn.operators.hypino import _sample, hypino_decoder

    rng = np.random.default_rng(12)
    s = _sample(rng, "small")
    cfg = s.config
    with pytest.raises(ValueError, match="in order"):
        hypino_decoder(s.inputs["xy"], s.inputs["skip_0"], s.params, skip_2=s.inputs["skip_1"], **cfg)
    with pytest.raises(ValueError, match="num_heads"):
        hypino_decoder(**s.inputs, params=s.params, **dict(cfg, num_heads=(2,)))
    with pytest.raises(ValueError, match="norm_groups"):
        hypino_decoder(**s.inputs, params=s.params, **dict(cfg, norm_groups=(1, 1)))
    with pytest.raises(ValueError, match="Fourier features"):
        hypino_decoder(**dict(s.inputs, xy=np.zeros((2, 3, 5))), params=s.params, **cfg)
    with pytest.raises(ValueError, match="batch size"):
        hypino_decoder(**dict(s.inputs, skip_0=s.inputs["skip_0"][:1]), params=s.params, **cfg)
