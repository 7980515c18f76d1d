"""numba.cuda kernels (refattn/kernels/cuda) against the NumPy references.

Same rules as the CPU kernels (tests/test_kernels_cpu.py):

* float64: kernel == reference to 1e-10 (outputs, LSE, every gradient);
* float32: kernel error vs the float64 reference <= 2x the error of the naive float32 NumPy
  reference (FlashAttention's acceptance rule). At toy sizes the maximum of a few dozen rounding
  errors is too noisy for a ratio (the CPU kernels measure 1-3x there too: the FA2 backward's
  $dP - D$ cancels), so the bound is at least 32 ulps of the largest reference value; at real
  sizes the plain 2x rule applies;
* tiles that do not divide the sizes, N = 1, fully masked rows, causal with N != M in both
  alignments, GQA maps, masks, softcap, huge logits, dlse;
* bad input raises TypeError/ValueError in Python before any kernel launch;
* determinism (bit-identical repeated calls) and device-array inputs.

Sizes: REFATTN_CUDA_TEST_SIZE=toy (default, for the simulator) or real (on a GPU).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from refattn.attention.differential import diff_attention_core_backward, diff_attention_core_forward
from refattn.attention.linear import causal_linear_attention_backward, causal_linear_attention_forward
from refattn.attention.softmax import sdpa_backward, sdpa_forward
from refattn.kernels.cuda import _common as kc
from refattn.kernels.cuda import cuda_available
from refattn.kernels.cuda import differential as kd
from refattn.kernels.cuda import flash as kf
from refattn.kernels.cuda import linear as kl

pytestmark = pytest.mark.cuda

SIZE = os.environ.get("REFATTN_CUDA_TEST_SIZE", "toy")
REAL = SIZE == "real"
EPS32 = float(np.finfo(np.float32).eps)


def test_size_setting_is_known():
    assert SIZE in ("toy", "real"), f"REFATTN_CUDA_TEST_SIZE must be toy or real; got {SIZE!r}"
    assert cuda_available()


def _n(n):
    """A toy sequence length, scaled up at real size (1 stays 1)."""
    return n if not REAL or n == 1 else 37 * n + 3


def _d(d):
    return d if not REAL else 64


def _dv(dv):
    # one value at real size: every distinct (d, dv, tiles, dtype) is a separate compilation on a GPU
    return dv if not REAL else 64


def _tiles(t):
    """Toy tiles as given; real: automatic (None) or a small explicit pair (fits every kernel even for
    float64 differential attention at d = 64)."""
    if not REAL:
        return t
    return (None, None) if t[0] >= 4 else (8, 8)


def _maxerr(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    fin = np.isfinite(b)
    assert np.array_equal(fin, np.isfinite(a)), "non-finite pattern differs"
    return float(np.abs(a[fin] - b[fin]).max(initial=0.0))


def _rule32(err_k, err_n, ref):
    """float32 acceptance: <= 2x naive; at toy sizes at least 32 ulps of max|ref| (see the docstring)."""
    bound = 2 * err_n
    if not REAL:
        bound = max(bound, 32 * EPS32 * max(1.0, float(np.abs(ref).max())))
    return err_k <= bound, (err_k, err_n, bound)


def _qkv(rng, b, h, hkv, n, m, d, dv, dtype=np.float64):
    return (rng.standard_normal((b, h, n, d)).astype(dtype), rng.standard_normal((b, hkv, m, d)).astype(dtype),
            rng.standard_normal((b, hkv, m, dv)).astype(dtype))


# ------------------------------------------------------------------------------------ SDPA

SDPA_CASES = [
    # (b, h, hkv, n, m, d, dv, config, tiles)
    (2, 2, 2, 7, 9, 5, 3, {}, (4, 3)),
    (1, 2, 1, 1, 1, 3, 2, {}, (4, 4)),  # N = M = 1
    (1, 2, 1, 1, 6, 4, 4, {"is_causal": True, "causal_alignment": "bottom_right"}, (4, 4)),  # decode step
    (1, 4, 2, 11, 6, 4, 3, {"is_causal": True, "causal_alignment": "bottom_right"}, (4, 5)),  # N > M
    (1, 4, 2, 6, 11, 4, 3, {"is_causal": True, "causal_alignment": "top_left"}, (4, 5)),  # N < M
    (1, 4, 2, 9, 9, 4, 3, {"is_causal": True, "kv_group_map": "strided", "softcap": 1.5}, (2, 3)),
    (1, 3, 1, 10, 13, 8, 5, {"scale": 0.3}, (8, 8)),  # MQA
    (2, 2, 2, 10, 7, 3, 2, {"attn_mask": "bool"}, (3, 4)),
    (1, 2, 2, 10, 7, 3, 2, {"attn_mask": "additive", "is_causal": True}, (3, 4)),
    (1, 2, 1, 9, 9, 4, 4, {"is_causal": True}, (None, None)),  # automatic tiles
    (1, 2, 1, 5, 4, 1, 1, {"is_causal": True, "causal_alignment": "bottom_right"}, (4, 3)),  # d = dv = 1
]


def _make_mask(rng, kind, b, h, n, m):
    if kind == "bool":
        keep = rng.random((b, 1, n, m)) > 0.35
        keep[0, 0, min(2, n - 1)] = False  # one fully masked row
        return keep
    add = np.where(rng.random((n, m)) > 0.3, rng.standard_normal((n, m)), -np.inf)
    add[min(1, n - 1)] = -np.inf
    return add


@pytest.mark.parametrize("case", range(len(SDPA_CASES)))
def test_flash_matches_reference_float64(case):
    b, h, hkv, n, m, d, dv, cfg, tiles = SDPA_CASES[case]
    n, m, d, dv = _n(n), _n(m), _d(d), _dv(dv)
    bq, bk = _tiles(tiles) if tiles[0] is not None else tiles
    rng = np.random.default_rng(case)
    q, k, v = _qkv(rng, b, h, hkv, n, m, d, dv)
    cfg = dict(cfg)
    if "attn_mask" in cfg:
        cfg["attn_mask"] = _make_mask(rng, cfg["attn_mask"], b, h, n, m)
    out, c = kf.flash_attention_forward(q, k, v, block_q=bq, block_k=bk, **cfg)
    out_r, c_r = sdpa_forward(q, k, v, **cfg)
    assert out.dtype == np.float64 and out.shape == out_r.shape
    assert _maxerr(out, out_r) <= 1e-10
    assert _maxerr(c["lse"], c_r["lse"]) <= 1e-10
    g = rng.standard_normal(out.shape)
    gk, gr = kf.flash_attention_backward(g, c), sdpa_backward(g, c_r)
    for name in ("q", "k", "v"):
        assert gk[name].shape == gr[name].shape and gk[name].dtype == np.float64
        assert _maxerr(gk[name], gr[name]) <= 1e-10, name
    if "attn_mask" in cfg:  # fully masked rows: output 0, LSE -inf, no gradient through them
        dead = ~np.isfinite(c_r["lse"])
        assert dead.any()
        assert np.all(out[dead] == 0.0) and np.all(np.isneginf(c["lse"][dead]))
        assert np.all(gk["q"][dead] == 0.0)


def test_flash_dlse_and_leading_axes():
    rng = np.random.default_rng(11)
    n, m, d, dv = _n(5), _n(8), _d(3), _dv(2)
    q = rng.standard_normal((2, 1, 2, n, d))
    k = rng.standard_normal((2, 1, 2, m, d))
    v = rng.standard_normal((2, 1, 2, m, dv))
    bq, bk = _tiles((4, 3))
    out, c = kf.flash_attention_forward(q, k, v, is_causal=True, causal_alignment="bottom_right",
                                        block_q=bq, block_k=bk)
    out_r, c_r = sdpa_forward(q, k, v, is_causal=True, causal_alignment="bottom_right")
    assert out.shape == out_r.shape and c["lse"].shape == c_r["lse"].shape
    g, dl = rng.standard_normal(out.shape), rng.standard_normal(c_r["lse"].shape)
    gk, gr = kf.flash_attention_backward(g, c, dlse=dl), sdpa_backward(g, c_r, dlse=dl)
    assert _maxerr(out, out_r) <= 1e-10
    for name in ("q", "k", "v"):
        assert _maxerr(gk[name], gr[name]) <= 1e-10, name


def test_flash_huge_logits():
    rng = np.random.default_rng(12)
    q, k, v = _qkv(rng, 1, 2, 2, _n(6), _n(7), _d(4), _dv(3))
    q = q * 100.0  # logits around +-1e4
    bq, bk = _tiles((4, 3))
    out, c = kf.flash_attention_forward(q, k, v, block_q=bq, block_k=bk)
    out_r, c_r = sdpa_forward(q, k, v)
    assert np.isfinite(out).all()
    assert _maxerr(out, out_r) <= 1e-10
    assert _maxerr(c["lse"], c_r["lse"]) <= 1e-10 * max(1.0, float(np.abs(c_r["lse"]).max()))
    g = rng.standard_normal(out.shape)
    gk, gr = kf.flash_attention_backward(g, c), sdpa_backward(g, c_r)
    for name in ("q", "k", "v"):
        assert _maxerr(gk[name], gr[name]) <= 1e-8 * max(1.0, float(np.abs(gr[name]).max())), name


@pytest.mark.parametrize("is_causal", [False, True])
def test_flash_float32_error_rule(is_causal):
    rng = np.random.default_rng(5)
    n = 12 if not REAL else 300
    d = 8 if not REAL else 64
    h = 2 if not REAL else 4
    q, k, v = _qkv(rng, 1, h, h, n, n, d, d)
    q, k = q * 2.0, k * 2.0
    q32, k32, v32 = (a.astype(np.float32) for a in (q, k, v))
    out64, c64 = sdpa_forward(q, k, v, is_causal=is_causal)
    out_n, c_n = sdpa_forward(q32, k32, v32, is_causal=is_causal)  # naive float32 NumPy reference
    bq, bk = (4, 3) if not REAL else (None, None)
    out_k, c_k = kf.flash_attention_forward(q32, k32, v32, is_causal=is_causal, block_q=bq, block_k=bk)
    assert out_k.dtype == np.float32
    ok, info = _rule32(_maxerr(out_k, out64), _maxerr(out_n, out64), out64)
    assert ok, info
    g = rng.standard_normal(out64.shape)
    g64, gn, gk = sdpa_backward(g, c64), sdpa_backward(g.astype(np.float32), c_n), \
        kf.flash_attention_backward(g.astype(np.float32), c_k)
    for name in ("q", "k", "v"):
        assert gk[name].dtype == np.float32
        ok, info = _rule32(_maxerr(gk[name], g64[name]), _maxerr(gn[name], g64[name]), g64[name])
        assert ok, (name, info)


def test_flash_float16_promotes_and_inputs_untouched():
    rng = np.random.default_rng(6)
    q, k, v = _qkv(rng, 1, 2, 2, _n(4), _n(5), _d(3), _dv(2), dtype=np.float16)
    copies = [a.copy() for a in (q, k, v)]
    bq, bk = (4, 4) if not REAL else (None, None)
    out, c = kf.flash_attention_forward(q, k, v, block_q=bq, block_k=bk)
    assert out.dtype == np.float32 and c["lse"].dtype == np.float32
    for a, b in zip((q, k, v), copies):
        assert np.array_equal(a, b)
    # Fortran-order, read-only, non-contiguous float64 inputs are accepted and never modified
    q64, k64, v64 = (np.asfortranarray(a.astype(np.float64)) for a in (q, k, v))
    v64 = np.concatenate([v64, v64], axis=-1)[..., ::2]
    for a in (q64, k64, v64):
        a.flags.writeable = False
    out64, _ = kf.flash_attention_forward(q64, k64, v64, block_q=bq, block_k=bk)
    assert _maxerr(out64, sdpa_forward(q64, k64, v64)[0]) <= 1e-10


def test_flash_deterministic_and_device_arrays():
    from refattn.kernels.cuda._device import cuda

    rng = np.random.default_rng(7)
    q, k, v = _qkv(rng, 1, 4, 2, _n(6), _n(7), _d(4), _dv(3))
    bq, bk = _tiles((4, 3))
    kw = dict(is_causal=True, block_q=bq, block_k=bk)
    out1, c1 = kf.flash_attention_forward(q, k, v, **kw)
    out2, c2 = kf.flash_attention_forward(q, k, v, **kw)
    g = rng.standard_normal(out1.shape)
    g1, g2 = kf.flash_attention_backward(g, c1), kf.flash_attention_backward(g, c2)
    assert np.array_equal(out1, out2) and np.array_equal(c1["lse"], c2["lse"])
    for name in g1:
        assert np.array_equal(g1[name], g2[name]), name
    # device arrays in -> device arrays out, same numbers
    qd, kd_, vd = (cuda.to_device(a) for a in (q, k, v))
    outd, cd = kf.flash_attention_forward(qd, kd_, vd, **kw)
    assert not isinstance(outd, np.ndarray)
    assert np.array_equal(outd.copy_to_host(), out1)
    gd = kf.flash_attention_backward(cuda.to_device(g), cd)
    for name in g1:
        assert np.array_equal(gd[name].copy_to_host(), g1[name]), name
    # the returned device array is the caller's: updating it in place leaves the backward unchanged
    outd.copy_to_device(np.zeros(outd.shape, dtype=outd.dtype))
    gd = kf.flash_attention_backward(cuda.to_device(g), cd)
    for name in g1:
        assert np.array_equal(gd[name].copy_to_host(), g1[name]), f"{name} after out was overwritten"


BAD_SDPA = [
    (lambda q, k, v: ((q.astype(int), k, v), {}), TypeError),
    (lambda q, k, v: ((q, k, v[0]), {}), ValueError),
    (lambda q, k, v: ((q, k[..., :2], v), {}), ValueError),
    (lambda q, k, v: ((q, k[:, :, :3], v), {}), ValueError),
    (lambda q, k, v: ((q, k[:, :1].repeat(3, 1), v[:, :1].repeat(3, 1)), {}), ValueError),  # 2 % 3
    (lambda q, k, v: ((q, k, v), {"attn_mask": np.ones((3, 3), bool)}), ValueError),
    (lambda q, k, v: ((q, k, v), {"attn_mask": np.ones((4, 5), int)}), TypeError),
    (lambda q, k, v: ((q, k, v), {"is_causal": 1}), TypeError),
    (lambda q, k, v: ((q, k, v), {"causal_alignment": "left"}), ValueError),
    (lambda q, k, v: ((q, k, v), {"kv_group_map": "interleaved"}), ValueError),
    (lambda q, k, v: ((q, k, v), {"scale": -1.0}), ValueError),
    (lambda q, k, v: ((q, k, v), {"softcap": 0.0}), ValueError),
    (lambda q, k, v: ((q, k, v), {"block_q": 0}), ValueError),
    (lambda q, k, v: ((q, k, v), {"block_q": 4096, "block_k": 64}), ValueError),  # does not fit
    (lambda q, k, v: ((q, k, v), {"return_lse": "yes"}), TypeError),
    (lambda q, k, v: ((q * np.nan, k, v), {}), ValueError),
]


def _boom(*a, **k):
    raise AssertionError("a kernel was launched")


@pytest.mark.parametrize("i", range(len(BAD_SDPA)))
def test_flash_bad_input_raises_before_launch(i, monkeypatch):
    rng = np.random.default_rng(8)
    q, k, v = _qkv(rng, 1, 2, 2, 4, 5, 3, 2)
    make, exc = BAD_SDPA[i]
    args, kw = make(q, k, v)
    monkeypatch.setattr(kc, "launch_forward", _boom)
    with pytest.raises(exc):
        kf.flash_attention_forward(*args, **kw)


def test_flash_backward_bad_input(monkeypatch):
    rng = np.random.default_rng(9)
    q, k, v = _qkv(rng, 1, 2, 2, 4, 5, 3, 2)
    out, c = kf.flash_attention_forward(q, k, v, block_q=4, block_k=4)
    monkeypatch.setattr(kc, "launch_backward", _boom)
    monkeypatch.setattr(kc, "launch_delta", _boom)
    with pytest.raises(ValueError):
        kf.flash_attention_backward(np.ones((1, 2, 4, 3)), c)
    with pytest.raises(TypeError):
        kf.flash_attention_backward(np.ones(out.shape, int), c)
    with pytest.raises(ValueError):
        kf.flash_attention_backward(np.ones(out.shape), c, dlse=np.ones((1, 2, 5)))
    with pytest.raises(TypeError):
        kf.flash_attention_backward(np.ones(out.shape), {"lse": 0})


def test_sdpa_backend_dispatch():
    rng = np.random.default_rng(10)
    q, k, v = _qkv(rng, 1, 2, 2, 3, 4, 2, 2)
    out_c, c_c = sdpa_forward(q, k, v, backend="cuda")
    out_n, c_n = sdpa_forward(q, k, v, backend="numpy")
    assert _maxerr(out_c, out_n) <= 1e-10
    g = np.ones_like(out_n)
    for name, a in sdpa_backward(g, c_c).items():
        assert _maxerr(a, sdpa_backward(g, c_n)[name]) <= 1e-10
    with pytest.raises(ValueError, match="backend"):
        sdpa_forward(q, k, v, backend="triton")


# ------------------------------------------------------------------------------------ differential

DIFF_CASES = [
    # (b, h, hkv, n, m, d, dv, lam shape, config, tiles)
    (1, 2, 2, 7, 7, 4, 6, (1,), {}, (4, 3)),
    (1, 4, 2, 5, 8, 3, 4, (4, 1), {"is_causal": True}, (4, 3)),  # bottom_right, N < M
    (2, 4, 1, 8, 5, 3, 4, "rows", {"is_causal": True, "causal_alignment": "top_left",
                                   "kv_group_map": "strided"}, (3, 4)),
    (1, 2, 2, 6, 7, 3, 2, (1,), {"attn_mask": "bool"}, (4, 4)),
    (1, 2, 1, 1, 1, 3, 2, (1,), {}, (None, None)),  # N = M = 1, automatic tiles
]


def _diff_inputs(rng, b, h, hkv, n, m, d, dv, lam_shape, dtype=np.float64):
    q1, q2 = rng.standard_normal((2, b, h, n, d)).astype(dtype)
    k1, k2 = rng.standard_normal((2, b, hkv, m, d)).astype(dtype)
    v = rng.standard_normal((b, hkv, m, dv)).astype(dtype)
    lam_shape = (b, h, n) if lam_shape == "rows" else lam_shape
    lam = rng.uniform(0.1, 0.9, lam_shape).astype(dtype)
    return q1, k1, q2, k2, v, lam


@pytest.mark.parametrize("case", range(len(DIFF_CASES)))
def test_diff_matches_reference_float64(case):
    b, h, hkv, n, m, d, dv, lam_shape, cfg, tiles = DIFF_CASES[case]
    n, m, d, dv = _n(n), _n(m), _d(d), _dv(dv)
    bq, bk = _tiles(tiles) if tiles[0] is not None else tiles
    rng = np.random.default_rng(100 + case)
    args = _diff_inputs(rng, b, h, hkv, n, m, d, dv, lam_shape)
    cfg = dict(cfg)
    if cfg.get("attn_mask") == "bool":
        cfg["attn_mask"] = _make_mask(rng, "bool", b, h, n, m)
    out, c = kd.diff_attention_forward(*args, block_q=bq, block_k=bk, **cfg)
    out_r, c_r = diff_attention_core_forward(*args, **cfg)
    assert out.dtype == np.float64 and out.shape == out_r.shape
    assert _maxerr(out, out_r) <= 1e-10
    g = rng.standard_normal(out.shape)
    gk, gr = kd.diff_attention_backward(g, c), diff_attention_core_backward(g, c_r)
    assert set(gk) == set(gr)
    for name in gr:
        assert gk[name].shape == gr[name].shape, name
        assert _maxerr(gk[name], gr[name]) <= 1e-10 * max(1.0, float(np.abs(gr[name]).max())), name


def test_diff_float32_error_rule():
    rng = np.random.default_rng(21)
    n = 12 if not REAL else 300
    d = 4 if not REAL else 64
    args = _diff_inputs(rng, 1, 2, 2, n, n, d, 2 * d, (2, 1))
    args32 = tuple(a.astype(np.float32) for a in args)
    out64, c64 = diff_attention_core_forward(*args, is_causal=True)
    out_n, c_n = diff_attention_core_forward(*args32, is_causal=True)
    bq, bk = (4, 3) if not REAL else (None, None)
    out_k, c_k = kd.diff_attention_forward(*args32, is_causal=True, block_q=bq, block_k=bk)
    assert out_k.dtype == np.float32
    ok, info = _rule32(_maxerr(out_k, out64), _maxerr(out_n, out64), out64)
    assert ok, info
    g = rng.standard_normal(out64.shape)
    g64, gn = diff_attention_core_backward(g, c64), diff_attention_core_backward(g.astype(np.float32), c_n)
    gk = kd.diff_attention_backward(g.astype(np.float32), c_k)
    for name in g64:
        ok, info = _rule32(_maxerr(gk[name], g64[name]), _maxerr(gn[name], g64[name]), g64[name])
        assert ok, (name, info)


def test_diff_lambda_zero_is_sdpa():
    rng = np.random.default_rng(22)
    q1, k1, q2, k2, v, _ = _diff_inputs(rng, 1, 2, 2, _n(5), _n(6), _d(3), _dv(2), (1,))
    bq, bk = _tiles((4, 3))
    out, _ = kd.diff_attention_forward(q1, k1, q2, k2, v, np.zeros(1), block_q=bq, block_k=bk, is_causal=True,
                                       causal_alignment="top_left")
    out_s, _ = sdpa_forward(q1, k1, v, is_causal=True)
    assert _maxerr(out, out_s) <= 1e-10


BAD_DIFF = [
    (lambda a: (a[:5] + (a[5].reshape(()),), {}), ValueError),  # 0-d lam (the reference wants >= 1-d)
    (lambda a: ((a[0], a[1], a[2][..., :2], a[3], a[4], a[5]), {}), ValueError),
    (lambda a: (a[:5] + (np.ones((3, 1)),), {}), ValueError),  # lam does not broadcast
    (lambda a: ((a[0].astype(np.int64),) + a[1:], {}), TypeError),
    (lambda a: (a, {"kv_group_map": "blocked"}), ValueError),
    (lambda a: (a, {"causal_alignment": "center"}), ValueError),
    (lambda a: (a, {"is_causal": "yes"}), TypeError),
]


@pytest.mark.parametrize("i", range(len(BAD_DIFF)))
def test_diff_bad_input_raises_before_launch(i, monkeypatch):
    rng = np.random.default_rng(23)
    args = _diff_inputs(rng, 1, 2, 2, 4, 5, 3, 2, (1,))
    make, exc = BAD_DIFF[i]
    a, kw = make(args)
    monkeypatch.setattr(kc, "launch_forward", _boom)
    with pytest.raises(exc):
        kd.diff_attention_forward(*a, **kw)
    with pytest.raises(TypeError):
        kd.diff_attention_backward(np.ones((1, 2, 4, 2)), {"backend": "numba_cuda"})


# ------------------------------------------------------------------------------------ causal linear


@pytest.mark.parametrize("shape,fm,tile", [((2, 2, 9, 3, 4), "elu_plus_one", 4), ((1, 2, 1, 3, 2), "identity", 4),
                                           ((1, 1, 13, 5, 3), "elu_plus_one", None),
                                           ((1, 1, 6, 1, 1), "elu_plus_one", 4)])  # d = dv = 1
def test_causal_linear_matches_reference_float64(shape, fm, tile, monkeypatch):
    b, h, n, d, dv = shape
    n, d, dv = _n(n), _d(d), _dv(dv)
    if tile is not None and not REAL:
        monkeypatch.setattr(kl, "MAX_TILE", tile)  # several token tiles at toy sizes
    rng = np.random.default_rng(n * 7 + d)
    q, k = rng.standard_normal((2, b, h, n, d))
    v = rng.standard_normal((b, h, n, dv))
    if fm == "identity":
        q, k = np.abs(q), np.abs(k)
    out, c = kl.causal_linear_attention_forward(q, k, v, feature_map=fm)
    out_r, c_r = causal_linear_attention_forward(q, k, v, feature_map=fm)
    assert out.dtype == np.float64 and _maxerr(out, out_r) <= 1e-10
    g = rng.standard_normal(out.shape)
    gk, gr = kl.causal_linear_attention_backward(g, c), causal_linear_attention_backward(g, c_r)
    for name in "qkv":
        assert gk[name].shape == gr[name].shape
        assert _maxerr(gk[name], gr[name]) <= 1e-10 * max(1.0, float(np.abs(gr[name]).max())), name


def test_causal_linear_float32_error_rule():
    rng = np.random.default_rng(31)
    n = 16 if not REAL else 512
    d = 4 if not REAL else 64
    q, k = rng.standard_normal((2, 1, 2, n, d))
    v = rng.standard_normal((1, 2, n, d))
    q32, k32, v32 = (a.astype(np.float32) for a in (q, k, v))
    out64, c64 = causal_linear_attention_forward(q, k, v)
    out_n, c_n = causal_linear_attention_forward(q32, k32, v32)
    out_k, c_k = kl.causal_linear_attention_forward(q32, k32, v32)
    assert out_k.dtype == np.float32
    ok, info = _rule32(_maxerr(out_k, out64), _maxerr(out_n, out64), out64)
    assert ok, info
    g = rng.standard_normal(out64.shape)
    g64, gn = causal_linear_attention_backward(g, c64), causal_linear_attention_backward(g.astype(np.float32), c_n)
    gk = kl.causal_linear_attention_backward(g.astype(np.float32), c_k)
    for name in "qkv":
        ok, info = _rule32(_maxerr(gk[name], g64[name]), _maxerr(gn[name], g64[name]), g64[name])
        assert ok, (name, info)


BAD_LIN = [
    (lambda q, k, v: ((q, k[..., :2, :], v), {}), ValueError),  # unequal lengths
    (lambda q, k, v: ((q, k[..., :2], v), {}), ValueError),
    (lambda q, k, v: ((q, k, v[0]), {}), ValueError),
    (lambda q, k, v: ((q.astype(np.complex128), k, v), {}), TypeError),
    (lambda q, k, v: ((q, k, v), {"eps": -1.0}), ValueError),
    (lambda q, k, v: ((q, k, v), {"feature_map": "relu"}), ValueError),
]


@pytest.mark.parametrize("i", range(len(BAD_LIN)))
def test_causal_linear_bad_input_raises_before_launch(i, monkeypatch):
    rng = np.random.default_rng(32)
    q, k = rng.standard_normal((2, 1, 2, 4, 3))
    v = rng.standard_normal((1, 2, 4, 2))
    make, exc = BAD_LIN[i]
    args, kw = make(q, k, v)
    monkeypatch.setattr(kl, "_launch_fwd", _boom)
    with pytest.raises(exc):
        kl.causal_linear_attention_forward(*args, **kw)


# ------------------------------------------------------------------------------------ registry


@pytest.mark.skipif(REAL, reason="the registry checks use toy sizes; run once under the simulator")
@pytest.mark.parametrize("slug", ["sdpa", "diff_attention_core", "linear_attention_katharopoulos"])
def test_registry_cuda_parity_checks(slug):
    from refattn import registry

    rec = registry.get(slug)
    assert "numba_cuda" in rec.kernels
    assert rec.checks["kernel:numba_cuda"](np.random.default_rng(3)) <= 1e-10


def test_diff_and_linear_device_arrays():
    from refattn.kernels.cuda._device import cuda

    rng = np.random.default_rng(40)
    args = _diff_inputs(rng, 1, 2, 1, _n(5), _n(6), _d(3), _dv(2), (2, 1))
    bq, bk = _tiles((4, 3))
    out, c = kd.diff_attention_forward(*args, is_causal=True, block_q=bq, block_k=bk)
    g = rng.standard_normal(out.shape)
    gh = kd.diff_attention_backward(g, c)
    dev = [cuda.to_device(a) for a in args[:5]]
    outd, cd = kd.diff_attention_forward(*dev, cuda.to_device(args[5]), is_causal=True, block_q=bq, block_k=bk)
    assert np.array_equal(outd.copy_to_host(), out)
    gd = kd.diff_attention_backward(cuda.to_device(g), cd)
    for name in gh:
        assert np.array_equal(gd[name].copy_to_host(), gh[name]), name

    q, k = rng.standard_normal((2, 1, 2, _n(6), _d(3)))
    v = rng.standard_normal((1, 2, _n(6), _dv(2)))
    out, c = kl.causal_linear_attention_forward(q, k, v)
    g = rng.standard_normal(out.shape)
    gh = kl.causal_linear_attention_backward(g, c)
    outd, cd = kl.causal_linear_attention_forward(*(cuda.to_device(a) for a in (q, k, v)))
    assert np.array_equal(outd.copy_to_host(), out)
    gd = kl.causal_linear_attention_backward(cuda.to_device(g), cd)
    for name in gh:
        assert np.array_equal(gd[name].copy_to_host(), gh[name]), name
    # both returned device arrays are the caller's: overwriting them leaves the backward unchanged
    outd.copy_to_device(np.zeros(outd.shape, dtype=outd.dtype))
    gd = kl.causal_linear_attention_backward(cuda.to_device(g), cd)
    for name in gh:
        assert np.array_equal(gd[name].copy_to_host(), gh[name]), f"{name} after out was overwritten"


# ------------------------------------------------------------------------------------ GPU check script


@pytest.mark.skipif(REAL, reason="scripts/gpu_check.sh runs the benchmark itself on a GPU")
def test_gpu_bench_runs_end_to_end_at_toy_sizes(tmp_path):
    """scripts/gpu_bench.py (what gpu_check.sh runs on a GPU) at toy sizes, with the torch side on
    the CPU, so its code is known to run before GPU time is spent on it."""
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "gpu_bench.py"
    spec = importlib.util.spec_from_file_location("gpu_bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["--toy", "--torch-cpu", "--reps", "1", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "bench.json").read_text())
    assert not report["errors"], report["errors"]
    impls = {(r["bench"], r["impl"]) for r in report["results"]}
    assert {("sdpa", "refattn.cuda"), ("diff", "refattn.cuda fused"), ("linear", "refattn.cuda scan")} <= impls
    if importlib.util.find_spec("torch") is not None:
        assert {("sdpa", "torch.sdpa"), ("diff", "torch 2x sdpa")} <= impls
        assert report["ratios"] and report["agreement"]
    for a in report["agreement"]:
        assert max(a["max_abs_diff"].values()) < 1e-4, a
    assert (tmp_path / "bench.md").read_text().startswith("# refattn CUDA kernels")
