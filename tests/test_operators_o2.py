"""Operator breadth, slice o2 (issue 17): what the generated registry tests cannot express.

Finite differences of the non-default configurations (Chebyshev multiwavelets, coarse levels,
unstructured and strided DISCO, CNO up/down/residual blocks in every batch-norm mode, HO products of
every order with overlapping corners, MgNO with residual restriction), brute-force and independent
constructions (scipy's upfirdn, scalar basis loops, PyTorch's conv for the finite-difference
stencil), discretisation convergence on point clouds, and bad input. Upstream parity itself was
measured in scratch scripts (see docs/operators/convolutional-and-wavelet-operators.md).
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import scipy.signal

from refattn import registry
from refattn.operators import cno, ho_fno, multiwavelet
from refattn.operators.cno import (
    cno_activation_operators,
    cno_block_backward,
    cno_block_forward,
    cno_residual_block_backward,
    cno_residual_block_forward,
    kink_margin,
    upfirdn_matrix,
)
from refattn.operators.differential_conv import (
    finite_difference_conv,
    finite_difference_conv_backward,
    finite_difference_conv_forward,
)
from refattn.operators.disco_conv import (
    disco_basis,
    disco_conv_backward,
    disco_conv_forward,
    disco_filter_matrix,
    equidistant_disco_conv_backward,
    equidistant_disco_conv_forward,
    local_no_kernels_forward,
)
from refattn.operators.ho_fno import ho_spectral_conv_backward, ho_spectral_conv_forward
from refattn.operators.mgno import init_mgno_params, mgno_layer_backward, mgno_layer_forward
from refattn.operators.multiwavelet import multiwavelet_filters, mwt_cz1d_backward, mwt_cz1d_forward
from refattn.operators.pinnsformer import make_time_sequence, pinnsformer_backward, pinnsformer_forward
from refattn.registry import Sample
from refattn.testing import gradcheck

# Modules whose name is also their main function's: the package attribute is the function
# (``from refattn.blocks import bcos`` gives the function), so take the module itself.
disco_conv = importlib.import_module("refattn.operators.disco_conv")
pinnsformer = importlib.import_module("refattn.operators.pinnsformer")

SLUGS = ["multiwavelet_operator", "pinnsformer_wavelet_pseudosequence", "ho_fno_higher_order_spectral_conv",
         "cno_convolutional_operator", "local_differential_disco_kernels", "mgno_multigrid_operator",
         "finite_difference_conv", "wavelet_activation"]


def test_records_implemented():
    for slug in SLUGS:
        rec = registry.get(slug)
        assert rec.implemented and rec.family == "3-operator", slug


# ------------------------------------------------------------------------------ multiwavelets


@pytest.mark.parametrize("base,L", [("chebyshev", 0), ("legendre", 1), ("chebyshev", 2)])
def test_mwt_gradcheck_variants(base, L):
    rng = np.random.default_rng(1)
    s = multiwavelet._sample(rng, "tiny")
    s.config.update(base=base, L=min(L, 2))
    gradcheck(mwt_cz1d_forward, mwt_cz1d_backward, s)


def test_mwt_more_modes_than_the_coarse_levels_hold():
    # alpha beyond n//2+1 on the coarse levels: only the first n//2+1 modes get a gradient there,
    # and the finest level still uses all alpha.
    rng = np.random.default_rng(2)
    s = multiwavelet._sample(rng, "tiny")
    for key in [k for k in s.params if "weights1" in k]:
        s.params[key] = rng.standard_normal(s.params[key].shape[:2] + (5,))
    gradcheck(mwt_cz1d_forward, mwt_cz1d_backward, s)
    out, cache = mwt_cz1d_forward(**s.inputs, params=s.params, **s.config)
    g = mwt_cz1d_backward(np.ones_like(out), cache)
    assert np.all(g["A.weights1_real"][:, :, 2:] == 0)          # N = 4: levels of length 2 and 1


def test_mwt_filters_are_copies_and_chebyshev_needs_the_correction():
    f = multiwavelet_filters(3, "chebyshev")
    f["H0"][:] = 0
    g = multiwavelet_filters(3, "chebyshev")
    assert np.abs(g["H0"]).max() > 0.1
    m = np.block([[g["H0"], g["H1"]], [g["G0"], g["G1"]]])
    assert np.abs(m @ m.T - np.eye(6)).max() > 1e-2               # not orthogonal ...
    assert np.abs(g["PHI0"] - np.eye(3)).max() > 1e-2            # ... hence the Phi correction


def test_mwt_bad_input():
    s = multiwavelet._sample(np.random.default_rng(0), "tiny")
    with pytest.raises(ValueError, match="power of two"):
        mwt_cz1d_forward(np.zeros((2, 6, 1, 2)), s.params)
    with pytest.raises(ValueError, match="L"):
        mwt_cz1d_forward(s.inputs["x"], s.params, L=3)
    with pytest.raises(ValueError, match="base"):
        mwt_cz1d_forward(s.inputs["x"], s.params, base="haar")


# ---------------------------------------------------------------------- differential and DISCO


@pytest.mark.parametrize("shape,groups,padding,impl", [((7,), 2, "replicate", "subtract_all"),
                                                        ((4, 5, 4), 1, "reflect", "subtract_middle"),
                                                        ((6, 5), 2, "zeros", "subtract_all")])
def test_finite_difference_gradcheck(shape, groups, padding, impl):
    rng = np.random.default_rng(3)
    s = Sample(inputs={"x": rng.standard_normal((2, 2) + shape)},
               params={"weight": rng.standard_normal((2, 2 // groups) + (3,) * len(shape))},
               config={"grid_width": 0.4, "padding": padding, "groups": groups, "implementation": impl})
    gradcheck(finite_difference_conv_forward, finite_difference_conv_backward, s)


def test_finite_difference_matches_torch_conv():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    x, w = rng.standard_normal((2, 3, 8, 7)), rng.standard_normal((4, 3, 3, 3))
    xt, wt = torch.tensor(x), torch.tensor(w)
    xp = torch.nn.functional.pad(xt, (1, 1, 1, 1), mode="circular")
    ref = (torch.nn.functional.conv2d(xp, wt) - torch.nn.functional.conv2d(xt, wt.sum((2, 3), keepdim=True))) / 0.25
    np.testing.assert_allclose(finite_difference_conv(x, {"weight": w}, grid_width=0.25), ref.numpy(), atol=1e-12)


def test_disco_basis_against_scalar_loops():
    # the piecewise-linear hats evaluated one point at a time from the torch-harmonics formulas
    rng = np.random.default_rng(5)
    rc = 0.5
    for nr, nphi in ((3, 1), (4, 1), (3, 4), (4, 3), (5, 2)):
        dr, dphi = 2 * rc / (nr + 1), 2 * np.pi / nphi
        k = (nr // 2) * nphi + nr % 2
        pts = rng.uniform(-0.6, 0.6, (60, 2))
        r, phi = np.hypot(pts[:, 0], pts[:, 1]), np.arctan2(pts[:, 1], pts[:, 0]) + np.pi
        got = disco_basis((nr, nphi), r, phi, rc)

        def circ(a, b):
            return min(abs(a - b), abs(2 * np.pi - abs(a - b)))

        for i in range(60):
            for lidx in range(k):
                if nphi == 1:
                    ir = (lidx if nr % 2 else lidx + 0.5) * dr
                    v = 1 - abs(r[i] - ir) / dr if abs(r[i] - ir) <= dr and r[i] <= rc else 0.0
                elif nr % 2:
                    ir = ((lidx - 1) // nphi + 1) * dr
                    ip = ((lidx - 1) % nphi) * dphi - np.pi
                    ok = abs(r[i] - ir) <= dr and r[i] <= rc and (lidx == 0 or circ(phi[i], ip) <= dphi)
                    v = (1 - abs(r[i] - ir) / dr) * (1 if lidx == 0 else 1 - circ(phi[i], ip) / dphi) if ok else 0.0
                else:
                    ir, ip = (lidx // nphi + 0.5) * dr, (lidx % nphi) * dphi - np.pi
                    v = 0.0
                    for rr, pp in ((r[i], phi[i]), (-r[i], phi[i] - np.pi)):
                        if abs(rr - ir) <= dr and rr <= rc and circ(pp, ip) <= dphi:
                            v += (1 - abs(rr - ir) / dr) * (1 - circ(pp, ip) / dphi)
                assert abs(got[lidx, i] - v) < 1e-14, (nr, nphi, lidx, i)


def test_disco_unstructured_gradcheck_and_groups():
    rng = np.random.default_rng(6)
    pts = rng.uniform(0, 1, (12, 2))
    q = rng.uniform(0.5, 1.5, 12) / 12
    psi = disco_filter_matrix(pts, pts[:5], (3, 3), q, 0.6)
    s = Sample(inputs={"x": rng.standard_normal((2, 4, 12))},
               params={"weight": rng.standard_normal((2, 2, psi.shape[0])), "bias": rng.standard_normal(2)},
               config={"psi": psi, "quadrature_weights": q, "groups": 2})
    gradcheck(disco_conv_forward, disco_conv_backward, s)


def test_equidistant_disco_strided_gradcheck():
    rng = np.random.default_rng(7)
    s = Sample(inputs={"x": rng.standard_normal((2, 2, 8, 8))},
               params={"weight": rng.standard_normal((2, 1, 5)), "bias": rng.standard_normal(2)},
               config={"kernel_shape": (3, 4), "out_shape": (4, 4), "radius_cutoff": 0.5, "groups": 2})
    gradcheck(equidistant_disco_conv_forward, equidistant_disco_conv_backward, s)
    y = equidistant_disco_conv_forward(**s.inputs, params=s.params, **s.config)[0]
    assert y.shape == (2, 2, 4, 4)


def test_disco_converges_on_point_clouds():
    # Discretisation convergence on irregular clouds (jittered grids of 16^2 .. 128^2 points,
    # weights h^2) at fixed output points: the gap to the finest cloud falls at about first order.
    rng = np.random.default_rng(0)
    w = rng.standard_normal((1, 1, 4))
    out_pts = rng.uniform(0.3, 0.7, (10, 2))

    def u(p):
        return np.exp(-3 * ((p[:, 0] - .5) ** 2 + (p[:, 1] - .4) ** 2)) * np.cos(3 * p[:, 0] + p[:, 1])

    res = []
    for n in (16, 32, 64, 128):
        cells = np.stack(np.meshgrid(np.arange(n), np.arange(n), indexing="ij"), -1).reshape(-1, 2)
        g = (cells + 0.5 + rng.uniform(-0.3, 0.3, (n * n, 2))) / n
        q = np.full(n * n, 1.0 / n ** 2)
        psi = disco_filter_matrix(g, out_pts, (2, 4), q, 0.2)
        res.append(disco_conv_forward(u(g)[None, None], {"weight": w}, psi=psi, quadrature_weights=q)[0][0, 0])
    gaps = [float(np.abs(r - res[-1]).max()) for r in res[:-1]]
    assert gaps[0] > gaps[1] > gaps[2] and gaps[0] / gaps[2] > 4, gaps


def test_local_kernels_bad_input():
    s = disco_conv._sample(np.random.default_rng(0), "tiny")
    bad = dict(s.params, **{"local_conv.weight": np.zeros((2, 1, 7))})
    with pytest.raises(ValueError, match="weight"):
        local_no_kernels_forward(**s.inputs, params=bad, **s.config)
    with pytest.raises(ValueError, match="odd"):
        finite_difference_conv(s.inputs["x"], {"weight": np.zeros((2, 1, 2, 2))}, grid_width=0.1)


# ---------------------------------------------------------------------------------------- CNO


def test_upfirdn_matrix_matches_scipy():
    # zero insertion + padding (T-1, T-up) + valid convolution == scipy's full upfirdn
    rng = np.random.default_rng(8)
    for up, down, taps in ((2, 1, 12), (1, 2, 12), (4, 1, 24), (1, 3, 7)):
        f = rng.standard_normal(taps)
        x = rng.standard_normal(9)
        ours = upfirdn_matrix(9, f, up=up, down=down, pad=(taps - 1, taps - up), gain=4.0) @ x
        np.testing.assert_allclose(ours, scipy.signal.upfirdn(2.0 * f, x, up, down), atol=1e-13)


@pytest.mark.parametrize("s_out,bn,res", [(8, "train", "filtered"), (2, None, "fft"), (8, "eval", "fft")])
def test_cno_block_variants_gradcheck(s_out, bn, res):
    # up (4 -> 8) and down (4 -> 2) blocks, batch norm in train / eval / off, both resamplings
    rng = np.random.default_rng(9)
    for _ in range(100):
        p = {"convolution.weight": rng.standard_normal((2, 2, 3, 3)) / 3, "convolution.bias": rng.standard_normal(2),
             "activation.bias": rng.standard_normal(2)}
        if bn is not None:
            p.update({"batch_norm.weight": rng.uniform(0.5, 1.5, 2), "batch_norm.bias": rng.standard_normal(2)})
        s = Sample(inputs={"x": rng.standard_normal((2, 2, 4, 4))}, params=p,
                   config={"out_size": s_out, "batch_norm": bn, "resampling": res})
        out, cache = cno_block_forward(**s.inputs, params=p, **s.config)
        if kink_margin(cache) > 1e-3:
            break
    assert out.shape == (2, 2, s_out, s_out)
    gradcheck(cno_block_forward, cno_block_backward, s)


@pytest.mark.parametrize("bn", ["eval", "train", None])
def test_cno_residual_block_gradcheck(bn):
    rng = np.random.default_rng(10)
    for _ in range(100):
        p = {"convolution1.weight": rng.standard_normal((2, 2, 3, 3)) / 3, "convolution1.bias": rng.standard_normal(2),
             "convolution2.weight": rng.standard_normal((2, 2, 3, 3)) / 3, "convolution2.bias": rng.standard_normal(2),
             "activation.bias": rng.standard_normal(2)}
        if bn is not None:
            p.update({f"batch_norm{i}.{k}": rng.uniform(0.5, 1.5, 2) for i in (1, 2) for k in ("weight", "bias")})
        s = Sample(inputs={"x": rng.standard_normal((2, 2, 4, 4))}, params=p, config={"batch_norm": bn})
        if kink_margin(cno_residual_block_forward(**s.inputs, params=p, batch_norm=bn)[1]) > 1e-3:
            break
    gradcheck(cno_residual_block_forward, cno_residual_block_backward, s)


def test_cno_activation_operator_shapes_and_bad_input():
    for s_in, s_out in ((16, 16), (16, 8), (16, 32)):
        U, D = cno_activation_operators(s_in, s_out)
        assert U.shape[1] == s_in and D.shape == (s_out, U.shape[0]) and U.shape[0] > 2 * max(s_in, s_out)
        U, D = cno_activation_operators(s_in, s_out, resampling="fft")
        assert U.shape == (2 * max(s_in, s_out), s_in) and D.shape == (s_out, U.shape[0])
    with pytest.raises(ValueError, match="half_width_mult"):
        cno_activation_operators(8, 8, half_width_mult=0.4)
    s = cno._sample(np.random.default_rng(0), "tiny")
    with pytest.raises(ValueError, match="square"):
        cno_block_forward(np.zeros((2, 2, 4, 5)), s.params, **{k: v for k, v in s.config.items() if k != "out_size"})


# -------------------------------------------------------------------------------------- HO-FNO


@pytest.mark.parametrize("order,modes", [(1, (2, 3)), (3, (3, 2)), (2, (3, 3))])
def test_ho_spectral_conv_gradcheck(order, modes):
    # (3, 3) on a 5 x 4 grid: the two corners of the first axis overlap and add
    rng = np.random.default_rng(11)
    s = Sample(inputs={"x": rng.standard_normal((2, 5, 4, 2))}, params=ho_fno._core_params(rng, 2, order, *modes),
               config={"order": order})
    gradcheck(ho_spectral_conv_forward, ho_spectral_conv_backward, s)


def test_ho_two_thirds_padding_and_modes_check():
    assert ho_fno.two_thirds_padding(16, 9) == (10, 6)
    s = ho_fno._sample(np.random.default_rng(0), "tiny")
    big = dict(s.params, **{k: np.zeros((2, 2, 4)) for k in s.params if "spec_convs" in k})
    with pytest.raises(ValueError, match="modes"):
        ho_fno.ho_block_forward(**s.inputs, params=big)
    ho_fno.ho_block_forward(**s.inputs, params=big, two_thirds_zero_padding=True)   # fits once padded


# ---------------------------------------------------------------------------------------- MgNO


@pytest.mark.parametrize("mode,use_res,act", [("circular", True, "tanh"), ("reflect", False, "silu")])
def test_mgno_gradcheck_variants(mode, use_res, act):
    rng = np.random.default_rng(12)
    its = ((1, 1), (1, 0))
    s = Sample(inputs={"u": rng.standard_normal((2, 1, 4, 4))}, params=init_mgno_params(rng, 1, 1, its, use_res=use_res),
               config={"num_iteration": its, "padding_mode": mode, "use_res": use_res, "activation": act})
    gradcheck(mgno_layer_forward, mgno_layer_backward, s)


def test_mgno_optional_biases_and_bad_grid():
    rng = np.random.default_rng(13)
    its = ((2, 0), (1, 0))
    p = init_mgno_params(rng, 1, 1, its)
    p["conv.layer0.1.A.bias"] = rng.standard_normal(1)
    s = Sample(inputs={"u": rng.standard_normal((2, 1, 4, 4))}, params=p, config={"num_iteration": its})
    gradcheck(mgno_layer_forward, mgno_layer_backward, s)
    with pytest.raises(ValueError, match="divisible"):
        mgno_layer_forward(np.zeros((2, 1, 6, 6)), init_mgno_params(rng, 1, 1, ((1, 0), (1, 0), (1, 0))),
                           num_iteration=((1, 0), (1, 0), (1, 0)))


# --------------------------------------------------------------------------------- PINNsFormer


def test_pinnsformer_sequence_input_gradcheck():
    rng = np.random.default_rng(14)
    s = pinnsformer._sample(rng, "tiny")
    seq = make_time_sequence(np.concatenate([s.inputs["x"], s.inputs["t"]], -1), 3, 0.5)
    s2 = Sample(inputs={"x": seq[..., :1], "t": seq[..., 1:]}, params=s.params, config={"num_heads": 1})
    gradcheck(pinnsformer_forward, pinnsformer_backward, s2)


def test_pinnsformer_bad_input():
    s = pinnsformer._sample(np.random.default_rng(0), "tiny")
    with pytest.raises(ValueError, match="num_heads"):
        pinnsformer_forward(**s.inputs, params=s.params, num_heads=3, num_step=3)
    with pytest.raises(ValueError, match="x and t"):
        pinnsformer_forward(s.inputs["x"], s.inputs["t"][:1], s.params, num_heads=1, num_step=3)
