"""Convolution, sampling, pooling and window primitives (refattn/nn/{conv,sampling,pooling,windows}.py).

Generic checks (FD gradcheck of one sample, dtype, bad input, inputs never modified ...) are
generated from the registry. Here: PyTorch parity (float64 forward and every gradient) over grids
of options, finite differences over the option grids that the single registry sample cannot
cover, the unvalidated helpers, and targeted bad-input messages.
"""

from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest

from refattn import registry
from refattn.nn.conv import (
    PADDING_MODES,
    conv,
    conv_apply,
    conv_backward,
    conv_forward,
    conv_transpose,
    conv_transpose_backward,
    conv_transpose_forward,
    conv_vjp,
)
from refattn.nn.pooling import (
    adaptive_avg_pool_backward,
    adaptive_avg_pool_forward,
    avg_pool,
    avg_pool_backward,
    avg_pool_forward,
    max_pool,
    max_pool_backward,
    max_pool_forward,
)
from refattn.nn.sampling import (
    affine_grid,
    affine_grid_backward,
    affine_grid_forward,
    grid_sample,
    grid_sample_backward,
    grid_sample_forward,
)
from refattn.nn.windows import (
    fold,
    fold_backward,
    fold_forward,
    relative_position_bias,
    relative_position_index,
    shifted_window_mask,
    unfold,
    unfold_backward,
    unfold_forward,
    window_partition,
    window_partition_forward,
    window_reverse,
)
from refattn.registry import Sample
from refattn.testing import gradcheck, run_record_checks

SLUGS = ["conv", "conv_transpose", "grid_sample", "affine_grid", "avg_pool", "max_pool", "adaptive_avg_pool",
         "window_partition", "window_reverse", "unfold", "fold"]
TOL = 1e-11


@pytest.mark.parametrize("slug", SLUGS)
def test_record_checks_pass(slug):
    res = run_record_checks(registry.get(slug))
    bad = [(r.check, r.message) for r in res.results if not r.passed]
    assert not bad, bad


def _torch():
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)  # tiny tensors: threads only add contention
    return torch, torch.nn.functional


def _autograd(fn, arrays, g, *args, **kwargs):
    """Forward and float64 autograd gradients of ``fn(*tensors, *args, **kwargs)`` (NumPy in and out)."""
    torch, _ = _torch()
    ts = [torch.from_numpy(np.ascontiguousarray(a)).requires_grad_() for a in arrays]
    out = fn(*ts, *args, **kwargs)
    out.backward(torch.from_numpy(g))
    return out.detach().numpy(), [t.grad.numpy() for t in ts]


def _subset(combos, n):
    """All option combinations in 1-D and 2-D; every third one in 3-D (PyTorch's float64 3-D
    kernels are slow and the code path is the same)."""
    combos = list(combos)
    return combos if n < 3 else combos[::3]


def _assert_all_close(ours: dict, theirs: dict, what):
    for k, v in theirs.items():
        err = float(np.max(np.abs(ours[k] - v))) if np.size(v) else 0.0
        assert np.shape(ours[k]) == np.shape(v) and err < TOL, f"{what}: {k} differs from PyTorch by {err}"


# --------------------------------------------------------------------------------------- conv


@pytest.mark.parametrize("n", [1, 2, 3])
@pytest.mark.parametrize("mode", PADDING_MODES)
@pytest.mark.filterwarnings("ignore:Using padding='same'")  # PyTorch's note that it pads a copy
def test_conv_torch_parity(n, mode):
    torch, _ = _torch()
    rng = np.random.default_rng(n)
    count = 0
    for padding, stride, dil, groups in _subset(itertools.product([0, 1, (2, 0, 1)[:n], "same", "valid"], [1, 2],
                                                                  [1, 2], [1, 2]), n):
        if padding == "same" and stride != 1:
            continue
        spatial, k = (7, 6, 5)[:n], (3, 2, 3)[:n]
        x = rng.standard_normal((2, 2 * groups) + spatial)
        w = rng.standard_normal((3 * groups, 2) + k)
        b = rng.standard_normal(3 * groups)
        y, cache = conv_forward(x, {"weight": w, "bias": b}, stride=stride, padding=padding, dilation=dil,
                                groups=groups, padding_mode=mode)
        layer = getattr(torch.nn, f"Conv{n}d")(2 * groups, 3 * groups, k, stride=stride, padding=padding,
                                               dilation=dil, groups=groups, padding_mode=mode).double()
        g = rng.standard_normal(y.shape)
        ty, (gx, gw, gb) = _autograd(layer._conv_forward, [x, w, b], g)
        assert float(np.abs(y - ty).max()) < TOL
        _assert_all_close(conv_backward(g, cache), {"x": gx, "weight": gw, "bias": gb},
                          f"conv{n}d {mode} padding={padding} stride={stride} dilation={dil} groups={groups}")
        count += 1
    assert count >= 10


def test_conv_depthwise_and_no_bias_torch_parity():
    torch, F = _torch()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 4, 6, 5))
    w = rng.standard_normal((8, 1, 3, 3))  # depthwise with channel multiplier 2
    y, cache = conv_forward(x, {"weight": w}, padding=1, groups=4)
    g = rng.standard_normal(y.shape)
    ty, (gx, gw) = _autograd(F.conv2d, [x, w], g, padding=1, groups=4)
    assert float(np.abs(y - ty).max()) < TOL
    grads = conv_backward(g, cache)
    assert set(grads) == {"x", "weight"}
    _assert_all_close(grads, {"x": gx, "weight": gw}, "depthwise conv2d")


@pytest.mark.parametrize("n", [1, 2, 3])
def test_conv_transpose_torch_parity(n):
    _, F = _torch()
    rng = np.random.default_rng(10 + n)
    count = 0
    for p, s, d, groups, op in _subset(itertools.product([0, 1, 2], [1, 2, 3], [1, 2], [1, 2], [0, 1, 2]), n):
        if op >= max(s, d):
            continue
        spatial, k = (5, 4, 3)[:n], (3, 2, 3)[:n]
        x = rng.standard_normal((2, 2 * groups) + spatial)
        w = rng.standard_normal((2 * groups, 3) + k)
        b = rng.standard_normal(3 * groups)
        try:
            y, cache = conv_transpose_forward(x, {"weight": w, "bias": b}, stride=s, padding=p, dilation=d,
                                              groups=groups, output_padding=op)
        except ValueError as exc:
            assert "crops more than" in str(exc)
            continue
        g = rng.standard_normal(y.shape)
        ty, (gx, gw, gb) = _autograd(getattr(F, f"conv_transpose{n}d"), [x, w, b], g, stride=s, padding=p,
                                     output_padding=op, groups=groups, dilation=d)
        assert float(np.abs(y - ty).max()) < TOL
        _assert_all_close(conv_transpose_backward(g, cache), {"x": gx, "weight": gw, "bias": gb},
                          f"conv_transpose{n}d p={p} s={s} d={d} g={groups} op={op}")
        count += 1
    assert count >= 15


@pytest.mark.parametrize("mode", PADDING_MODES)
def test_conv_gradcheck_every_padding_mode(mode):
    rng = np.random.default_rng(4)
    s = Sample(inputs={"x": rng.standard_normal((2, 2, 7))},
               params={"weight": rng.standard_normal((2, 1, 3)), "bias": rng.standard_normal(2)},
               config={"stride": 2, "padding": 2, "dilation": 2, "groups": 2, "padding_mode": mode})
    gradcheck(conv_forward, conv_backward, s)


def test_conv_apply_asymmetric_padding_and_vjp():
    # (before, after) pairs are an extension for causal / asymmetric padding: equal to an explicit
    # np.pad followed by a valid convolution; conv_vjp equals the validated backward.
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 6, 5))
    w = rng.standard_normal((4, 3, 3, 2))
    pads = ((2, 0), (0, 1))
    y = conv_apply(x, w, padding=pads)
    want = conv(np.pad(x, [(0, 0), (0, 0), (2, 0), (0, 1)]), {"weight": w})
    assert np.abs(y - want).max() < 1e-13
    yv, cache = conv_forward(x, {"weight": w}, padding=1, padding_mode="circular")
    g = rng.standard_normal(yv.shape)
    a = conv_vjp(g, x, w, padding=1, padding_mode="circular", has_bias=False)
    b = conv_backward(g, cache)
    assert set(a) == set(b) and all(np.array_equal(a[k], b[k]) for k in b)


def test_conv_bad_inputs_name_the_argument():
    x = np.zeros((2, 4, 5, 5))
    w = np.zeros((6, 2, 3, 3))
    with pytest.raises(ValueError, match="groups"):
        conv(x, {"weight": w}, groups=3)
    with pytest.raises(ValueError, match="weight must have shape"):
        conv(x, {"weight": np.zeros((6, 4, 3, 3))}, groups=2)
    with pytest.raises(ValueError, match="reflect"):
        conv(x, {"weight": np.zeros((6, 4, 3, 3))}, padding=5, padding_mode="reflect")
    with pytest.raises(ValueError, match="same"):
        conv(x, {"weight": np.zeros((6, 4, 3, 3))}, padding="same", stride=2)
    with pytest.raises(ValueError, match="padding_mode"):
        conv(x, {"weight": np.zeros((6, 4, 3, 3))}, padding_mode="mirror")
    with pytest.raises(ValueError, match="smaller than the dilated kernel"):
        conv(x, {"weight": np.zeros((6, 4, 3, 3))}, dilation=3)
    with pytest.raises(TypeError, match="stride"):
        conv(x, {"weight": np.zeros((6, 4, 3, 3))}, stride=(1,))
    with pytest.raises(ValueError, match="output_padding"):
        conv_transpose(x, {"weight": np.zeros((4, 3, 3, 3))}, stride=2, output_padding=2)


def test_conv_dtypes():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 2, 5)).astype(np.float16)
    y = conv(x, {"weight": rng.standard_normal((3, 2, 2)).astype(np.float32)}, padding_mode="replicate", padding=1)
    assert y.dtype == np.float32
    y64 = conv(x, {"weight": rng.standard_normal((3, 2, 2))})
    assert y64.dtype == np.float64


# ----------------------------------------------------------------------------------- sampling


def _grid_with(rng, shape, spatial, align, *, kinks):
    """Pixel coordinates either kink-free (as the registry sampler) or exactly on integers,
    half-integers and the borders (PyTorch's one-sided values there must be reproduced too)."""
    n = len(spatial)
    grid = np.empty(shape + (n,))
    for a in range(n):
        L = spatial[n - 1 - a]
        if kinks:
            u = rng.integers(-3, 2 * L + 3, shape) / 2.0
        else:
            u = rng.integers(-2, L + 1, shape) + rng.uniform(0.1, 0.4, shape) + 0.5 * rng.integers(0, 2, shape)
        grid[..., a] = 2 * u / (L - 1) - 1 if align else (2 * u + 1) / L - 1
    return grid


@pytest.mark.parametrize("n", [2, 3])
@pytest.mark.parametrize("kinks", [False, True], ids=["smooth", "on-kinks"])
def test_grid_sample_torch_parity(n, kinks):
    _, F = _torch()
    rng = np.random.default_rng(20 + n)
    for mode, pad, align in itertools.product(["bilinear", "nearest"], ["zeros", "border", "reflection"],
                                              [False, True]):
        spatial, out = ((4, 5), (3, 4)) if n == 2 else ((3, 4, 5), (2, 3, 2))
        x = rng.standard_normal((2, 3) + spatial)
        grid = _grid_with(rng, (2,) + out, spatial, align, kinks=kinks)
        y, cache = grid_sample_forward(x, grid, mode=mode, padding_mode=pad, align_corners=align)
        g = rng.standard_normal(y.shape)
        ty, (gx, gg) = _autograd(F.grid_sample, [x, grid], g, mode=mode, padding_mode=pad, align_corners=align)
        assert float(np.abs(y - ty).max()) < TOL, (mode, pad, align)
        _assert_all_close(grid_sample_backward(g, cache), {"x": gx, "grid": gg}, f"grid_sample {mode} {pad} {align}")


def test_grid_sample_far_outside_and_unit_size():
    _, F = _torch()
    rng = np.random.default_rng(3)
    for shape in [(2, 2, 1, 4), (2, 2, 3, 1)]:
        x = rng.standard_normal(shape)
        grid = rng.uniform(-7.3, 7.3, (2, 3, 3, 2))
        for pad, align in itertools.product(["zeros", "border", "reflection"], [False, True]):
            y, cache = grid_sample_forward(x, grid, padding_mode=pad, align_corners=align)
            g = rng.standard_normal(y.shape)
            ty, (gx, gg) = _autograd(F.grid_sample, [x, grid], g, padding_mode=pad, align_corners=align)
            assert float(np.abs(y - ty).max()) < TOL
            _assert_all_close(grid_sample_backward(g, cache), {"x": gx, "grid": gg}, f"grid_sample {shape} {pad}")


@pytest.mark.parametrize("align", [False, True])
def test_grid_sample_gradcheck_every_option(align):
    rng = np.random.default_rng(5)
    for mode, pad in itertools.product(["bilinear", "nearest"], ["zeros", "border", "reflection"]):
        s = Sample(inputs={"x": rng.standard_normal((2, 1, 3, 3)),
                           "grid": _grid_with(rng, (2, 2, 2), (3, 3), align, kinks=False)},
                   config={"mode": mode, "padding_mode": pad, "align_corners": align})
        gradcheck(grid_sample_forward, grid_sample_backward, s)


def test_affine_grid_torch_parity():
    _, F = _torch()
    rng = np.random.default_rng(6)
    for n, align, spatial in itertools.product([2, 3], [False, True], [(1, 1, 1), (4, 1, 3), (2, 5, 3)]):
        size = (2, 3) + spatial[:n]
        theta = rng.standard_normal((2, n, n + 1))
        grid, cache = affine_grid_forward(theta, size=size, align_corners=align)
        g = rng.standard_normal(grid.shape)
        with warnings.catch_warnings():  # PyTorch warns about unit-size grids with align_corners=True
            warnings.simplefilter("ignore", UserWarning)
            ty, (gt,) = _autograd(F.affine_grid, [theta], g, size, align_corners=align)
        assert float(np.abs(grid - ty).max()) < TOL
        _assert_all_close(affine_grid_backward(g, cache), {"theta": gt}, f"affine_grid {size} {align}")


def test_spatial_transformer_composition_torch_parity():
    # affine_grid then grid_sample, gradients w.r.t. the input and theta (chain of the two VJPs).
    _, F = _torch()
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3, 5, 6))
    theta = np.array([[0.9, 0.2, 0.1], [-0.15, 1.1, -0.05]]) + 0.05 * rng.standard_normal((2, 2, 3))
    grid, cg = affine_grid_forward(theta, size=(2, 3, 4, 4))
    y, cs = grid_sample_forward(x, grid, padding_mode="border")
    g = rng.standard_normal(y.shape)
    gs = grid_sample_backward(g, cs)
    dtheta = affine_grid_backward(gs["grid"], cg)["theta"]
    ty, (gx, gt) = _autograd(lambda a, t: F.grid_sample(a, F.affine_grid(t, (2, 3, 4, 4), align_corners=False),
                                                        padding_mode="border", align_corners=False), [x, theta], g)
    assert float(np.abs(y - ty).max()) < TOL
    _assert_all_close({"x": gs["x"], "theta": dtheta}, {"x": gx, "theta": gt}, "affine_grid + grid_sample")


def test_sampling_bad_inputs():
    x = np.zeros((2, 3, 4, 5))
    with pytest.raises(ValueError, match="grid must have shape"):
        grid_sample(x, np.zeros((2, 3, 3, 3)))
    with pytest.raises(ValueError, match="batch"):
        grid_sample(x, np.zeros((3, 3, 3, 2)))
    with pytest.raises(ValueError, match="mode"):
        grid_sample(x, np.zeros((2, 3, 3, 2)), mode="bicubic")
    with pytest.raises(ValueError, match="size"):
        affine_grid(np.zeros((2, 2, 3)), size=(2, 3, 4))
    with pytest.raises(ValueError, match="theta"):
        affine_grid(np.zeros((2, 3, 3)), size=(2, 3, 4, 4))


# ------------------------------------------------------------------------------------ pooling


@pytest.mark.parametrize("n", [1, 2, 3])
def test_avg_pool_torch_parity(n):
    _, F = _torch()
    rng = np.random.default_rng(30 + n)
    fn = getattr(F, f"avg_pool{n}d")
    for k, s, p, ceil, cip, div in _subset(itertools.product([2, 3], [None, 1, 2], [0, 1], [False, True],
                                                             [False, True], [None, 3]), n):
        if n == 1 and div is not None:
            continue  # F.avg_pool1d has no divisor_override
        x = rng.standard_normal((2, 3) + (7, 6, 5)[:n])
        y, cache = avg_pool_forward(x, kernel_size=(k,) * n, stride=s, padding=p, ceil_mode=ceil,
                                    count_include_pad=cip, divisor_override=div)
        kw = {"kernel_size": k, "stride": s, "padding": p, "ceil_mode": ceil, "count_include_pad": cip}
        if n > 1:
            kw["divisor_override"] = div
        g = rng.standard_normal(y.shape)
        ty, (gx,) = _autograd(fn, [x], g, **kw)
        assert float(np.abs(y - ty).max()) < TOL, kw
        _assert_all_close(avg_pool_backward(g, cache), {"x": gx}, f"avg_pool{n}d {kw}")


@pytest.mark.parametrize("n", [1, 2, 3])
def test_max_pool_torch_parity(n):
    _, F = _torch()
    rng = np.random.default_rng(40 + n)
    fn = getattr(F, f"max_pool{n}d")
    shape = (2, 3) + (7, 6, 5)[:n]
    for k, s, p, d, ceil in _subset(itertools.product([2, 3], [None, 1, 2], [0, 1], [1, 2], [False, True]), n):
        x = rng.permutation(int(np.prod(shape))).reshape(shape) * 0.1
        y, cache = max_pool_forward(x, kernel_size=k, stride=s, padding=p, dilation=d, ceil_mode=ceil)
        g = rng.standard_normal(y.shape)
        ty, (gx,) = _autograd(fn, [x], g, k, s, p, d, ceil_mode=ceil)
        assert float(np.abs(y - ty).max()) < TOL
        _assert_all_close(max_pool_backward(g, cache), {"x": gx}, f"max_pool{n}d k={k} s={s} p={p} d={d} {ceil}")


def test_max_pool_ties_follow_torch():
    # Ties (e.g. a constant input) go to the first maximum in window order, as PyTorch's CPU kernel.
    _, F = _torch()
    x = np.zeros((1, 2, 5, 4))
    x[0, 1, :2] = 1.0
    y, cache = max_pool_forward(x, kernel_size=2, stride=1, padding=1)
    g = np.arange(y.size, dtype=float).reshape(y.shape)
    _, (gx,) = _autograd(lambda a: F.max_pool2d(a, 2, 1, 1), [x], g)
    assert np.array_equal(max_pool_backward(g, cache)["x"], gx)


@pytest.mark.parametrize("n", [1, 2, 3])
def test_adaptive_avg_pool_torch_parity(n):
    _, F = _torch()
    rng = np.random.default_rng(50 + n)
    fn = getattr(F, f"adaptive_avg_pool{n}d")
    sizes = [1, 2, 3, 5, 9] + ([None] if n > 1 else [])
    for out in _subset(itertools.product(sizes, repeat=n), n)[:: 1 if n < 3 else 4]:
        x = rng.standard_normal((2, 3) + (7, 6, 5)[:n])
        y, cache = adaptive_avg_pool_forward(x, output_size=out)
        g = rng.standard_normal(y.shape)
        ty, (gx,) = _autograd(fn, [x], g, out if n > 1 else out[0])
        assert float(np.abs(y - ty).max()) < TOL
        _assert_all_close(adaptive_avg_pool_backward(g, cache), {"x": gx}, f"adaptive_avg_pool{n}d {out}")


def test_pooling_bad_inputs():
    x = np.zeros((2, 3, 6, 6))
    with pytest.raises(ValueError, match="padding"):
        avg_pool(x, kernel_size=2, padding=2)
    with pytest.raises(ValueError, match="x must be"):
        max_pool(x, kernel_size=(2, 2, 2))
    with pytest.raises(ValueError, match="divisor_override"):
        avg_pool(x, kernel_size=2, divisor_override=0)
    with pytest.raises(ValueError, match="smaller than"):
        max_pool(x, kernel_size=4, dilation=3)


# ------------------------------------------------------------------------------------ windows


def test_window_partition_matches_swin_torch():
    # microsoft/Swin-Transformer SwinTransformerBlock.forward: F.pad at the end, torch.roll(-s),
    # window_partition -> (B*nW, M, M, C); and the reverse path back.
    torch, F = _torch()
    rng = np.random.default_rng(8)
    for (H, W), M, s in [((8, 8), 4, 2), ((7, 10), 3, 1), ((5, 5), 5, 0), ((9, 6), 4, 0)]:
        x = rng.standard_normal((2, H, W, 3))
        t = F.pad(torch.from_numpy(x), (0, 0, 0, (-W) % M, 0, (-H) % M))
        Hp, Wp = t.shape[1:3]
        if s:
            t = torch.roll(t, shifts=(-s, -s), dims=(1, 2))
        win = t.view(2, Hp // M, M, Wp // M, M, 3).permute(0, 1, 3, 2, 4, 5).reshape(-1, M, M, 3)
        ours = window_partition(x, window_size=M, shift_size=s)
        assert np.array_equal(ours.reshape(-1, M, M, 3), win.numpy())
        back = window_reverse(ours, window_size=M, spatial_shape=(H, W), shift_size=s)
        assert np.array_equal(back, x)


def test_shift_mask_and_bias_in_attention_layout():
    # The (B, nW, heads, N, N) scores take the bias (heads, N, N) and the mask (nW, N, N)[:, None].
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 8, 8, 4))
    w, _ = window_partition_forward(x, window_size=4, shift_size=2)
    q = w.reshape(2, 4, 16, 2, 2).transpose(0, 1, 3, 2, 4)  # (B, nW, heads, N, d)
    scores = q @ np.swapaxes(q, -1, -2)
    bias = relative_position_bias(rng.standard_normal((49, 2)), relative_position_index(4))
    mask = shifted_window_mask((8, 8), 4, 2)
    full = scores + bias + mask[:, None]
    assert full.shape == (2, 4, 2, 16, 16)
    # the last (bottom-right) window mixes four regions; the first window is one region
    assert not mask[0].any() and len(np.unique(mask[3])) == 2


def test_unfold_fold_torch_parity():
    _, F = _torch()
    rng = np.random.default_rng(11)
    for k, d, p, s in itertools.product([(2, 3), 3, 1], [1, (2, 1)], [0, 1, (1, 0)], [1, 2, (2, 1)]):
        x = rng.standard_normal((2, 3, 7, 6))
        cols, cu = unfold_forward(x, kernel_size=k, dilation=d, padding=p, stride=s)
        g = rng.standard_normal(cols.shape)
        tc, (gx,) = _autograd(F.unfold, [x], g, k, d, p, s)
        assert float(np.abs(cols - tc).max()) < TOL
        _assert_all_close(unfold_backward(g, cu), {"x": gx}, f"unfold k={k} d={d} p={p} s={s}")
        v = rng.standard_normal(cols.shape)
        y, cf = fold_forward(v, output_size=(7, 6), kernel_size=k, dilation=d, padding=p, stride=s)
        gy = rng.standard_normal(y.shape)
        ty, (gv,) = _autograd(F.fold, [v], gy, (7, 6), k, d, p, s)
        assert float(np.abs(y - ty).max()) < TOL
        _assert_all_close(fold_backward(gy, cf), {"x": gv}, f"fold k={k} d={d} p={p} s={s}")


def test_window_and_fold_bad_inputs():
    with pytest.raises(ValueError, match="shift_size"):
        window_partition(np.zeros((2, 8, 8, 3)), window_size=4, shift_size=4)
    with pytest.raises(ValueError, match="windows must have shape"):
        window_reverse(np.zeros((2, 3, 16, 3)), window_size=4, spatial_shape=(8, 8))
    with pytest.raises(ValueError, match="number of blocks"):
        fold(np.zeros((2, 12, 5)), output_size=(4, 4), kernel_size=2)
    with pytest.raises(ValueError, match="prod"):
        fold(np.zeros((2, 7, 9)), output_size=(4, 4), kernel_size=2)
    with pytest.raises(ValueError, match="no block fits"):
        unfold(np.zeros((2, 3, 3, 3)), kernel_size=4)
