"""Numba CPU kernels (refattn/kernels/cpu) against the NumPy references.

* float64: kernel == reference to 1e-10 (outputs, LSE, every gradient);
* float32: kernel error vs the float64 reference <= 2x the error of the naive float32 NumPy
  reference (the FlashAttention acceptance rule; RMS error, see ``_f32_rule``);
* tiles that do not divide the sizes, N = 1, fully masked rows, causal with N != M in both
  alignments, GQA maps, masks, softcap, huge logits;
* bad input raises TypeError/ValueError in Python, before any kernel runs;
* determinism: repeated calls and different thread counts give bit-identical results.

Sizes are tiny; every kernel compiles once per dtype (all flags are runtime arguments, cache=True).
Every test runs with both BLAS choices of the tile products (the ``blas`` fixture).
"""

from __future__ import annotations

import subprocess
import sys

import numba
import numpy as np
import pytest

from refattn import registry
from refattn.attention.differential import diff_attention_core_backward, diff_attention_core_forward
from refattn.attention.linear import causal_linear_attention_backward, causal_linear_attention_forward
from refattn.attention.softmax import sdpa_backward, sdpa_forward
from refattn.kernels.cpu import differential as kd
from refattn.kernels.cpu import flash as kf
from refattn.kernels.cpu import linear as kl


@pytest.fixture(autouse=True, params=["builtin", "scipy", "mkl"])
def blas(request):
    """Every test of this module runs with each choice of tile products (``runtime.set_blas``):
    refattn's micro-kernels, SciPy's BLAS (``np.dot``) and oneMKL's CBLAS, the last skipped where
    oneMKL cannot be loaded."""
    from refattn.kernels.cpu import runtime

    before = runtime.get_blas()
    try:
        runtime.set_blas(request.param)
    except ValueError as exc:
        pytest.skip(str(exc))
    yield request.param
    runtime.set_blas(before)


def _maxerr(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    fin = np.isfinite(b)
    assert np.array_equal(fin, np.isfinite(a)), "non-finite pattern differs"
    return float(np.abs(a[fin] - b[fin]).max(initial=0.0))


def _f32_rule(kernel, naive, ref, name="output"):
    """The FlashAttention acceptance rule, float32 kernel vs naive float32 NumPy, both against the
    float64 reference: RMS error <= 2x the naive RMS error, and max error <= 4x the naive max.

    RMS is the statistic the 2x rule is applied to: a max over ~10^3 entries moves by tens of
    percent with the summation order of the naive reference's BLAS and vector sums, which is not
    fixed (a kernel at 1.9x the naive max error in one run was over 2x in another)."""
    a, n, r = (np.asarray(x, np.float64) for x in (kernel, naive, ref))
    fin = np.isfinite(r)
    rms_k = float(np.sqrt(np.mean((a[fin] - r[fin]) ** 2)))
    rms_n = float(np.sqrt(np.mean((n[fin] - r[fin]) ** 2)))
    assert rms_k <= 2 * rms_n, f"{name}: RMS error {rms_k:.3g} > 2 x naive {rms_n:.3g}"
    assert _maxerr(a, r) <= 4 * _maxerr(n, r), f"{name}: max error {_maxerr(a, r):.3g} > 4 x naive {_maxerr(n, r):.3g}"


def _qkv(rng, b, h, hkv, n, m, d, dv, dtype=np.float64):
    return (rng.standard_normal((b, h, n, d)).astype(dtype), rng.standard_normal((b, hkv, m, d)).astype(dtype),
            rng.standard_normal((b, hkv, m, dv)).astype(dtype))


# ------------------------------------------------------------------------------------ SDPA

SDPA_CASES = [
    # (b, h, hkv, n, m, d, dv, config, blocks)
    (2, 2, 2, 7, 9, 5, 3, {}, (4, 3)),
    (1, 4, 2, 1, 1, 3, 2, {}, (64, 64)),  # N = M = 1
    (1, 2, 1, 1, 6, 4, 4, {"is_causal": True, "causal_alignment": "bottom_right"}, (4, 4)),  # decode step
    (2, 4, 2, 13, 6, 4, 3, {"is_causal": True, "causal_alignment": "bottom_right"}, (4, 5)),  # N > M: masked rows
    (2, 4, 2, 6, 13, 4, 3, {"is_causal": True, "causal_alignment": "top_left"}, (4, 5)),  # N < M
    (2, 4, 2, 9, 9, 4, 3, {"is_causal": True, "kv_group_map": "strided", "softcap": 1.5}, (2, 3)),
    (2, 4, 1, 11, 17, 8, 5, {"scale": 0.3}, (64, 64)),  # MQA, one tile
    (3, 2, 2, 10, 7, 3, 2, {"attn_mask": "bool"}, (3, 4)),
    (2, 2, 2, 10, 7, 3, 2, {"attn_mask": "additive", "is_causal": True}, (3, 4)),
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
    b, h, hkv, n, m, d, dv, cfg, (bq, bk) = SDPA_CASES[case]
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
    dlse = rng.standard_normal(c["lse"].shape)
    for kw in ({}, {"dlse": dlse}):
        gk, gr = kf.flash_attention_backward(g, c, **kw), sdpa_backward(g, c_r, **kw)
        for name in ("q", "k", "v"):
            assert gk[name].shape == gr[name].shape
            assert _maxerr(gk[name], gr[name]) <= 1e-10, name


@pytest.mark.parametrize("cfg", [{}, {"is_causal": True, "causal_alignment": "bottom_right"},
                                 {"attn_mask": "bool"}])
def test_flash_backward_with_its_own_key_tiles(cfg, blas):
    """With the built-in products the backward uses key tiles of at most ``BWD_BLOCK_K`` (512)
    where the forward used 1024: every recomputed logit is still the forward's (float64 parity
    and the float32 rule, default tiles, lengths across several backward tiles)."""
    from refattn.kernels.cpu._common import BWD_BLOCK_K, DEFAULT_BLOCK_K, bwd_block_k

    assert bwd_block_k(-1, DEFAULT_BLOCK_K) == BWD_BLOCK_K < DEFAULT_BLOCK_K
    assert bwd_block_k(0, DEFAULT_BLOCK_K) == DEFAULT_BLOCK_K == bwd_block_k(1, DEFAULT_BLOCK_K)
    rng = np.random.default_rng(5)
    n, m = 700, 1100
    q, k, v = _qkv(rng, 1, 2, 1, n, m, 8, 8)
    cfg = dict(cfg)
    if "attn_mask" in cfg:
        cfg["attn_mask"] = _make_mask(rng, "bool", 1, 2, n, m)
    g = rng.standard_normal((1, 2, n, 8))
    out_r, c_r = sdpa_forward(q, k, v, **cfg)
    gr = sdpa_backward(g, c_r)
    out, c = kf.flash_attention_forward(q, k, v, **cfg)
    gk = kf.flash_attention_backward(g, c)
    assert _maxerr(out, out_r) <= 1e-10
    for name in ("q", "k", "v"):
        assert _maxerr(gk[name], gr[name]) <= 1e-10, name
    f32 = [x.astype(np.float32) for x in (q, k, v, g)]
    out32, c32 = kf.flash_attention_forward(*f32[:3], **cfg)
    g32 = kf.flash_attention_backward(f32[3], c32)
    naive_o, naive_c = sdpa_forward(*f32[:3], **cfg)
    naive_g = sdpa_backward(f32[3], naive_c)
    _f32_rule(out32, naive_o, out_r)
    for name in ("q", "k", "v"):
        _f32_rule(g32[name], naive_g[name], gr[name], name)


def test_flash_fully_masked_rows_are_zero():
    rng = np.random.default_rng(3)
    q, k, v = _qkv(rng, 2, 2, 2, 5, 4, 3, 2)
    keep = np.ones((2, 2, 5, 4), bool)
    keep[1, 0, 3] = False
    with np.errstate(all="raise"):
        out, c = kf.flash_attention_forward(q, k, v, attn_mask=keep, block_q=2, block_k=3)
        g = kf.flash_attention_backward(rng.standard_normal(out.shape), c)
    assert np.all(out[1, 0, 3] == 0) and np.all(g["q"][1, 0, 3] == 0)
    assert np.isneginf(c["lse"][1, 0, 3])
    assert all(np.isfinite(a).all() for a in (out, *g.values()))
    # bottom-right causal with N > M: the first N - M rows see no key
    q2 = rng.standard_normal((1, 1, 6, 3))
    out2, c2 = kf.flash_attention_forward(q2, k[:1, :1], v[:1, :1], is_causal=True,
                                          causal_alignment="bottom_right")
    assert np.all(out2[0, 0, :2] == 0) and np.isneginf(c2["lse"][0, 0, :2]).all()


def test_flash_huge_logits_and_leading_axes():
    rng = np.random.default_rng(4)
    q = rng.standard_normal((2, 3, 2, 5, 4)) * 100.0  # two leading axes; logits ~1e4
    k = rng.standard_normal((2, 3, 2, 6, 4)) * 100.0
    v = rng.standard_normal((2, 3, 2, 6, 3))
    mask = rng.random((3, 1, 5, 6)) > 0.3  # broadcast over the first leading axis and the heads
    out, c = kf.flash_attention_forward(q, k, v, attn_mask=mask, block_q=2, block_k=4)
    out_r, c_r = sdpa_forward(q, k, v, attn_mask=mask)
    assert np.isfinite(out).all()
    assert _maxerr(out, out_r) <= 1e-10
    g = rng.standard_normal(out.shape)
    gk, gr = kf.flash_attention_backward(g, c), sdpa_backward(g, c_r)
    for name in ("q", "k", "v"):
        assert _maxerr(gk[name], gr[name]) <= 1e-6 * max(1.0, np.abs(gr[name]).max()), name


@pytest.mark.parametrize("is_causal", [False, True])
def test_flash_float32_error_rule(is_causal):
    rng = np.random.default_rng(5)
    q, k, v = _qkv(rng, 1, 2, 2, 70, 70, 16, 16)
    q, k = q * 2.0, k * 2.0
    q32, k32, v32 = (a.astype(np.float32) for a in (q, k, v))
    out64, c64 = sdpa_forward(q, k, v, is_causal=is_causal)
    out_n, c_n = sdpa_forward(q32, k32, v32, is_causal=is_causal)  # naive float32 NumPy reference
    out_k, c_k = kf.flash_attention_forward(q32, k32, v32, is_causal=is_causal, block_q=32, block_k=24)
    assert out_k.dtype == np.float32
    _f32_rule(out_k, out_n, out64)
    g = rng.standard_normal(out64.shape)
    g64, gn, gk = sdpa_backward(g, c64), sdpa_backward(g.astype(np.float32), c_n), \
        kf.flash_attention_backward(g.astype(np.float32), c_k)
    for name in ("q", "k", "v"):
        assert gk[name].dtype == np.float32
        _f32_rule(gk[name], gn[name], g64[name], name)


def test_flash_float32_wide_logit_range_and_minus_inf_mask():
    """The float32 exp over its whole input range: logits spread over ~±150 (so exp(s - max) runs
    from 1 down past the clamp at 2^-127 into exact zeros) and an additive mask with -inf entries
    (exp(-inf) must be exactly 0, so a removed key whose value is huge changes nothing)."""
    rng = np.random.default_rng(15)
    q, k, v = _qkv(rng, 1, 2, 2, 40, 48, 8, 8)
    q, k = q * 5.0, k * 5.0
    add = np.where(rng.random((1, 2, 40, 48)) < 0.25, -np.inf, rng.standard_normal((1, 2, 40, 48)))
    v_far = v.copy()
    v_far[..., 5, :] = 1e30  # key 5: removed from every row below
    add[..., 5] = -np.inf
    q32, k32, v32 = (a.astype(np.float32) for a in (q, k, v_far))
    out64, c64 = sdpa_forward(q, k, v, attn_mask=add, scale=1.0)
    out_n, c_n = sdpa_forward(q32, k32, v.astype(np.float32), attn_mask=add.astype(np.float32), scale=1.0)
    out_k, c_k = kf.flash_attention_forward(q32, k32, v32, attn_mask=add.astype(np.float32), scale=1.0,
                                            block_q=16, block_k=16)
    assert np.isfinite(out_k).all()
    _f32_rule(out_k, out_n, out64)
    g = rng.standard_normal(out64.shape)
    gk, gn, g64 = kf.flash_attention_backward(g.astype(np.float32), c_k), \
        sdpa_backward(g.astype(np.float32), c_n), sdpa_backward(g, c64)
    assert np.all(gk["v"][..., 5, :] == 0)  # P = 0 exactly on the removed key
    for name in ("q", "k"):
        _f32_rule(gk[name], gn[name], g64[name], name)


def _assert_causal_bit_identical_across_threads(seed, block_q, block_k):
    """Causal forward and backward, twice at the current thread count and once on one thread: every
    output bit-identical."""
    rng = np.random.default_rng(seed)
    q, k, v = _qkv(rng, 1, 3, 1, 45, 50, 8, 8, np.float32)
    g = rng.standard_normal((1, 3, 45, 8)).astype(np.float32)
    before = numba.get_num_threads()
    results = []
    try:
        for threads in (before, before, 1):
            numba.set_num_threads(threads)
            out, c = kf.flash_attention_forward(q, k, v, is_causal=True, block_q=block_q, block_k=block_k)
            results.append((out, c["lse"], *kf.flash_attention_backward(g, c).values()))
    finally:
        numba.set_num_threads(before)
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert np.array_equal(a, b)


def test_flash_deterministic_across_calls_and_threads():
    _assert_causal_bit_identical_across_threads(6, 8, 8)


# Causal tiles that cross the diagonal are computed in row groups (``_common.DIAG_ROWS`` rows, each
# product trimmed to the group's last visible key); the backward must make the same products.
DIAG_CASES = [  # n, m, cfg, (bq, bk), rows
    (70, 70, {}, (32, 24), 8),
    (13, 6, {"causal_alignment": "bottom_right"}, (4, 5), 1),
    (6, 13, {"causal_alignment": "top_left"}, (4, 5), 3),
    (45, 50, {"causal_alignment": "bottom_right", "softcap": 1.5}, (16, 12), 5),
    (40, 40, {"attn_mask": "additive"}, (16, 16), 6),
]


@pytest.mark.parametrize("case", range(len(DIAG_CASES)))
def test_flash_causal_row_groups_float64(case, monkeypatch):
    from refattn.kernels.cpu import _common

    n, m, cfg, (bq, bk), rows = DIAG_CASES[case]
    monkeypatch.setattr(_common, "DIAG_ROWS", rows)
    rng = np.random.default_rng(40 + case)
    q, k, v = _qkv(rng, 1, 2, 2, n, m, 8, 5)
    cfg = dict(cfg, is_causal=True)
    if "attn_mask" in cfg:
        cfg["attn_mask"] = _make_mask(rng, cfg["attn_mask"], 1, 2, n, m)
    out, c = kf.flash_attention_forward(q, k, v, block_q=bq, block_k=bk, **cfg)
    assert c["block_g"] == min(bq, rows)
    out_r, c_r = sdpa_forward(q, k, v, **cfg)
    assert _maxerr(out, out_r) <= 1e-10 and _maxerr(c["lse"], c_r["lse"]) <= 1e-10
    g = rng.standard_normal(out.shape)
    gk, gr = kf.flash_attention_backward(g, c), sdpa_backward(g, c_r)
    for name in ("q", "k", "v"):
        assert _maxerr(gk[name], gr[name]) <= 1e-10, name


@pytest.mark.parametrize("n, bq, bk, rows", [(70, 32, 24, 8), (600, 512, 256, 128), (1100, 512, 512, 128)])
def test_flash_causal_row_groups_float32_error_rule(n, bq, bk, rows, monkeypatch):
    from refattn.kernels.cpu import _common

    monkeypatch.setattr(_common, "DIAG_ROWS", rows)
    rng = np.random.default_rng(7)
    d = 64 if n > 100 else 16
    q, k, v = _qkv(rng, 1, 2, 2, n, n, d, d)
    q, k = q * 2.0, k * 2.0
    q32, k32, v32 = (a.astype(np.float32) for a in (q, k, v))
    out64, c64 = sdpa_forward(q, k, v, is_causal=True)
    out_n, c_n = sdpa_forward(q32, k32, v32, is_causal=True)
    out_k, c_k = kf.flash_attention_forward(q32, k32, v32, is_causal=True, block_q=bq, block_k=bk)
    _f32_rule(out_k, out_n, out64)
    g = rng.standard_normal(out64.shape)
    g64, gn, gk = sdpa_backward(g, c64), sdpa_backward(g.astype(np.float32), c_n), \
        kf.flash_attention_backward(g.astype(np.float32), c_k)
    for name in ("q", "k", "v"):
        _f32_rule(gk[name], gn[name], g64[name], name)


def test_flash_causal_row_groups_deterministic_across_threads(monkeypatch):
    from refattn.kernels.cpu import _common

    monkeypatch.setattr(_common, "DIAG_ROWS", 3)
    _assert_causal_bit_identical_across_threads(8, 16, 8)


def test_flash_dtype_and_inputs_untouched():
    rng = np.random.default_rng(7)
    q, k, v = _qkv(rng, 1, 2, 2, 4, 5, 3, 2)
    copies = [a.copy() for a in (q, k, v)]
    out16, _ = kf.flash_attention_forward(*(a.astype(np.float16) for a in (q, k, v)))
    assert out16.dtype == np.float32
    outm, _ = kf.flash_attention_forward(q.astype(np.float32), k, v)  # mixed -> float64
    assert outm.dtype == np.float64
    qf = np.asfortranarray(q)
    qf.flags.writeable = False
    out, c = kf.flash_attention_forward(qf, k[:, :, ::-1], v[:, :, ::-1])
    kf.flash_attention_backward(np.ones_like(out), c)
    for a, b in zip((q, k, v), copies):
        assert np.array_equal(a, b)


def test_flash_returned_output_is_not_the_caches():
    """The backward reads the forward's output from the cache: a caller's in-place update of the
    returned array must not reach it (the kernel writes the two copies itself)."""
    rng = np.random.default_rng(22)
    q, k, v = _qkv(rng, 1, 2, 2, 12, 12, 4, 4, np.float32)
    g = rng.standard_normal((1, 2, 12, 4)).astype(np.float32)
    out, c = kf.flash_attention_forward(q, k, v)
    ref = kf.flash_attention_backward(g, c)
    assert np.array_equal(out, c["out"]) and not np.shares_memory(out, c["out4"])
    out *= 0.0
    again = kf.flash_attention_backward(g, c)
    for name in ref:
        assert np.array_equal(ref[name], again[name]), name


BAD_SDPA = [
    (lambda q, k, v: ((q.astype(int), k, v), {}), TypeError),
    (lambda q, k, v: ((q, k, v.astype(complex)), {}), TypeError),
    (lambda q, k, v: ((q[0, 0], k, v), {}), ValueError),
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
    (lambda q, k, v: ((q * np.nan, k, v), {}), ValueError),
]


@pytest.mark.parametrize("i", range(len(BAD_SDPA)))
def test_flash_bad_input_raises_before_kernel(i, monkeypatch):
    rng = np.random.default_rng(8)
    q, k, v = _qkv(rng, 1, 2, 2, 4, 5, 3, 2)
    make, exc = BAD_SDPA[i]
    args, kw = make(q, k, v)

    def boom(*a, **k):
        raise AssertionError("the kernel was entered")

    monkeypatch.setattr(kf._k, "attention_fwd", boom)
    with pytest.raises(exc):
        kf.flash_attention_forward(*args, **kw)


def test_flash_backward_bad_input():
    rng = np.random.default_rng(9)
    q, k, v = _qkv(rng, 1, 2, 2, 4, 5, 3, 2)
    out, c = kf.flash_attention_forward(q, k, v)
    with pytest.raises(ValueError):
        kf.flash_attention_backward(np.ones((1, 2, 4, 3)), c)
    with pytest.raises(TypeError):
        kf.flash_attention_backward(np.ones(out.shape, int), c)
    with pytest.raises(TypeError):
        kf.flash_attention_backward(np.ones(out.shape), {"lse": 0})


def test_sdpa_backend_dispatch():
    rng = np.random.default_rng(10)
    q, k, v = _qkv(rng, 1, 2, 2, 4, 5, 3, 2)
    g = rng.standard_normal((1, 2, 4, 2))
    res = {}
    for backend in ("numba", "numpy"):
        out, c = sdpa_forward(q, k, v, backend=backend, is_causal=True)
        res[backend] = (out, sdpa_backward(g, c))
    assert _maxerr(res["numba"][0], res["numpy"][0]) <= 1e-10
    for name in "qkv":
        assert _maxerr(res["numba"][1][name], res["numpy"][1][name]) <= 1e-10
    with pytest.raises(ValueError, match="backend"):
        sdpa_forward(q, k, v, backend="torch")



def test_diff_and_linear_backend_dispatch():
    """The reference functions reach the kernels with backend="numba"; backward follows the cache."""
    rng = np.random.default_rng(11)
    q1, k1, v = _qkv(rng, 1, 2, 1, 4, 5, 3, 4)
    q2, k2, _ = _qkv(rng, 1, 2, 1, 4, 5, 3, 4)
    lam = np.array([0.4])
    res = {}
    for backend in ("numba", "numpy"):
        out, c = diff_attention_core_forward(q1, k1, q2, k2, v, lam, is_causal=True, backend=backend)
        res[backend] = (out, diff_attention_core_backward(np.ones_like(out), c))
    assert _maxerr(res["numba"][0], res["numpy"][0]) <= 1e-10
    for name in ("q1", "k1", "q2", "k2", "v", "lam"):
        assert _maxerr(res["numba"][1][name], res["numpy"][1][name]) <= 1e-10
    q, k, v = (rng.standard_normal((2, 2, 6, 3)) for _ in range(3))
    res = {}
    for backend in ("numba", "numpy"):
        out, c = causal_linear_attention_forward(q, k, v, backend=backend)
        res[backend] = (out, causal_linear_attention_backward(np.ones_like(out), c))
    assert _maxerr(res["numba"][0], res["numpy"][0]) <= 1e-10
    for name in "qkv":
        assert _maxerr(res["numba"][1][name], res["numpy"][1][name]) <= 1e-10

# ------------------------------------------------------------------------------ differential

DIFF_CASES = [
    (2, 2, 2, 7, 9, 4, 8, (1,), {}),
    (2, 4, 2, 9, 5, 4, 6, (4, 1), {"is_causal": True}),  # bottom-right, N > M: masked rows
    (2, 4, 1, 5, 9, 4, 6, (2, 4, 5), {"is_causal": True, "causal_alignment": "top_left",
                                      "kv_group_map": "strided"}),
    (1, 2, 2, 1, 1, 3, 2, (1,), {}),
    (2, 2, 2, 6, 7, 3, 4, (2, 1), {"attn_mask": "bool", "scale": 0.4}),
]


@pytest.mark.parametrize("case", range(len(DIFF_CASES)))
def test_diff_matches_reference_float64(case):
    b, h, hkv, n, m, d, dv, lam_shape, cfg = DIFF_CASES[case]
    rng = np.random.default_rng(100 + case)
    q1, q2 = rng.standard_normal((2, b, h, n, d))
    k1, k2 = rng.standard_normal((2, b, hkv, m, d))
    v = rng.standard_normal((b, hkv, m, dv))
    lam = rng.uniform(0.1, 0.9, lam_shape)
    cfg = dict(cfg)
    if "attn_mask" in cfg:
        cfg["attn_mask"] = _make_mask(rng, "bool", b, h, n, m)
    out, c = kd.diff_attention_forward(q1, k1, q2, k2, v, lam, block_q=4, block_k=3, **cfg)
    out_r, c_r = diff_attention_core_forward(q1, k1, q2, k2, v, lam, **cfg)
    assert _maxerr(out, out_r) <= 1e-10
    g = rng.standard_normal(out.shape)
    gk, gr = kd.diff_attention_backward(g, c), diff_attention_core_backward(g, c_r)
    assert set(gk) == set(gr)
    for name in gr:
        assert gk[name].shape == gr[name].shape, name
        assert _maxerr(gk[name], gr[name]) <= 1e-10, name


def test_diff_float32_error_rule():
    rng = np.random.default_rng(11)
    q1, q2 = rng.standard_normal((2, 1, 2, 60, 16)) * 2
    k1, k2 = rng.standard_normal((2, 1, 2, 60, 16)) * 2
    v = rng.standard_normal((1, 2, 60, 32))
    # per-(head, token) lambda: the 2x rule compares RMS errors, which needs more than one value.
    # With one scalar lambda, d(lambda) is a single sum of ~4000 rounding errors of either
    # implementation: a comparison of two random draws, which any correct kernel loses at times.
    lam = rng.uniform(0.3, 0.8, (2, 60))
    args64 = (q1, k1, q2, k2, v, lam)
    args32 = tuple(a.astype(np.float32) for a in args64)
    o64, c64 = diff_attention_core_forward(*args64, is_causal=True)
    on, cn = diff_attention_core_forward(*args32, is_causal=True)
    ok, ck = kd.diff_attention_forward(*args32, is_causal=True, block_q=16, block_k=24)
    assert ok.dtype == np.float32
    _f32_rule(ok, on, o64)
    g = rng.standard_normal(o64.shape)
    g64 = diff_attention_core_backward(g, c64)
    gn = diff_attention_core_backward(g.astype(np.float32), cn)
    gk = kd.diff_attention_backward(g.astype(np.float32), ck)
    for name in g64:
        _f32_rule(gk[name], gn[name], g64[name], name)


def test_diff_lambda_zero_is_sdpa():
    rng = np.random.default_rng(12)
    q1, q2 = rng.standard_normal((2, 1, 2, 6, 4))
    k1, k2 = rng.standard_normal((2, 1, 2, 7, 4))
    v = rng.standard_normal((1, 2, 7, 3))
    out, _ = kd.diff_attention_forward(q1, k1, q2, k2, v, np.zeros(1), is_causal=True)
    ref = kf.flash_attention(q1, k1, v, is_causal=True, causal_alignment="bottom_right")
    assert np.array_equal(out, ref)


@pytest.mark.parametrize("bad,exc", [
    ({"lam": np.zeros(())}, ValueError),
    ({"lam": np.zeros((3, 1))}, ValueError),
    ({"q2": np.zeros((1, 2, 5, 4))}, ValueError),
    ({"v": np.zeros((1, 2, 6, 3), dtype=int)}, TypeError),
    ({"kv_group_map": "interleaved"}, ValueError),
])
def test_diff_bad_input_raises_before_kernel(bad, exc, monkeypatch):
    rng = np.random.default_rng(13)
    args = {"q1": rng.standard_normal((1, 2, 4, 4)), "k1": rng.standard_normal((1, 2, 6, 4)),
            "q2": rng.standard_normal((1, 2, 4, 4)), "k2": rng.standard_normal((1, 2, 6, 4)),
            "v": rng.standard_normal((1, 2, 6, 3)), "lam": np.array([0.5])}
    cfg = {}
    for key, val in bad.items():
        (args if key in args else cfg)[key] = val

    def boom(*a, **k):
        raise AssertionError("the kernel was entered")

    monkeypatch.setattr(kd._k, "attention_fwd", boom)
    with pytest.raises(exc):
        kd.diff_attention_forward(**args, **cfg)


# ------------------------------------------------------------------------- causal linear


@pytest.mark.parametrize("shape,fm", [((2, 3, 11, 4), "elu_plus_one"), ((1, 1, 1, 2), "elu_plus_one"),
                                      ((3, 7, 5), "identity")])
def test_causal_linear_matches_reference_float64(shape, fm):
    rng = np.random.default_rng(14)
    q, k = rng.standard_normal((2,) + shape)
    v = rng.standard_normal(shape[:-1] + (3,))
    if fm == "identity":
        q, k = np.abs(q), np.abs(k)
    out, c = kl.causal_linear_attention_forward(q, k, v, feature_map=fm)
    out_r, c_r = causal_linear_attention_forward(q, k, v, feature_map=fm)
    assert _maxerr(out, out_r) <= 1e-10
    g = rng.standard_normal(out.shape)
    gk, gr = kl.causal_linear_attention_backward(g, c), causal_linear_attention_backward(g, c_r)
    for name in "qkv":
        assert _maxerr(gk[name], gr[name]) <= 1e-10, name


def test_causal_linear_float32_error_rule():
    rng = np.random.default_rng(15)
    q, k = rng.standard_normal((2, 1, 2, 80, 16))
    v = rng.standard_normal((1, 2, 80, 16))
    o64, c64 = causal_linear_attention_forward(q, k, v)
    a32 = [a.astype(np.float32) for a in (q, k, v)]
    on, cn = causal_linear_attention_forward(*a32)
    ok, ck = kl.causal_linear_attention_forward(*a32)
    assert ok.dtype == np.float32
    _f32_rule(ok, on, o64)
    g = rng.standard_normal(o64.shape)
    g64, gn = causal_linear_attention_backward(g, c64), causal_linear_attention_backward(g.astype(np.float32), cn)
    gk = kl.causal_linear_attention_backward(g.astype(np.float32), ck)
    for name in "qkv":
        _f32_rule(gk[name], gn[name], g64[name], name)


@pytest.mark.parametrize("bad,exc", [
    ({"k": np.zeros((1, 2, 5, 4))}, ValueError),
    ({"v": np.zeros((1, 2, 4, 3), dtype=np.int32)}, TypeError),
    ({"eps": -1.0}, ValueError),
    ({"feature_map": "relu"}, ValueError),
])
def test_causal_linear_bad_input_raises_before_kernel(bad, exc, monkeypatch):
    rng = np.random.default_rng(16)
    args = {"q": rng.standard_normal((1, 2, 4, 4)), "k": rng.standard_normal((1, 2, 4, 4)),
            "v": rng.standard_normal((1, 2, 4, 3))}
    cfg = {}
    for key, val in bad.items():
        (args if key in args else cfg)[key] = val

    def boom(*a, **k):
        raise AssertionError("the kernel was entered")

    monkeypatch.setattr(kl, "scan_fwd", boom)
    with pytest.raises(exc):
        kl.causal_linear_attention_forward(**args, **cfg)


# ---------------------------------------------------------------------------------- registry


@pytest.mark.parametrize("slug", ["sdpa", "diff_attention_core", "linear_attention_katharopoulos"])
def test_registry_kernel_parity_checks(slug):
    rec = registry.get(slug)
    assert "numba_cpu" in rec.kernels
    err = rec.checks["kernel:numba_cpu"](np.random.default_rng(17))
    assert err <= 1e-10


# ------------------------------------------------------------------- compiled signatures, runtime


def test_non_writeable_inputs_do_not_compile_again(tmp_path):
    """Read-only arrays, ``np.broadcast_to`` views and read-only memmaps are other Numba types than
    writeable arrays; the wrappers pass every input as a read-only C-contiguous view, so they reuse
    the one compiled signature per dtype (a new one would cost tens of seconds per call site)."""
    from refattn.kernels.cpu import _attention

    rng = np.random.default_rng(20)
    q, k, v = _qkv(rng, 1, 2, 2, 9, 9, 4, 4, np.float32)
    g = rng.standard_normal(q.shape).astype(np.float32)
    mask = rng.random((9, 9)) > 0.2
    out_w, c_w = kf.flash_attention_forward(q, k, v, attn_mask=mask, is_causal=True)
    grads_w = kf.flash_attention_backward(g, c_w)
    n_sigs = (len(_attention.attention_fwd.signatures), len(_attention.attention_bwd.signatures))
    lin_w = kl.causal_linear_attention_forward(q, k, v)[0]
    n_lin = len(kl.scan_fwd.signatures)

    path = tmp_path / "v.f32"
    v.tofile(path)
    v_mm = np.memmap(path, dtype=np.float32, mode="r", shape=v.shape)
    q_ro = q.copy()
    q_ro.flags.writeable = False
    k_bc = np.broadcast_to(k[:, :1], k.shape)  # read-only, stride 0 on the head axis
    mask_ro = np.broadcast_to(mask, (1, 2, 9, 9))
    g_ro = g.copy()
    g_ro.flags.writeable = False
    out_r, c_r = kf.flash_attention_forward(q_ro, k_bc, v_mm, attn_mask=mask_ro, is_causal=True)
    grads_r = kf.flash_attention_backward(g_ro, c_r)
    lin_r = kl.causal_linear_attention_forward(q_ro, k_bc, v_mm)[0]
    assert (len(_attention.attention_fwd.signatures), len(_attention.attention_bwd.signatures)) == n_sigs
    assert len(kl.scan_fwd.signatures) == n_lin
    out_ref = kf.flash_attention_forward(q, np.ascontiguousarray(k_bc), v, attn_mask=mask, is_causal=True)[0]
    assert np.array_equal(out_r, out_ref)
    assert np.array_equal(out_w, kf.flash_attention_forward(q, k, v, attn_mask=mask, is_causal=True)[0])
    assert all(np.isfinite(x).all() for x in (*grads_w.values(), *grads_r.values(), lin_w, lin_r))


def test_compile_notice_on_stderr(capfd):
    """A compile of a registered entry point prints one line on stderr (not a silent stall)."""
    from numba import njit

    from refattn.kernels.cpu import runtime

    @njit(cache=False)
    def tiny(x):
        return x + 1.0

    runtime.register_entry_point(tiny, "tiny_kernel")
    tiny(1.0)
    err = capfd.readouterr().err
    assert "refattn: compiling Numba kernel tiny_kernel for" in err and "one time, up to about" in err
    tiny(2.0)  # compiled: nothing more
    assert "compiling" not in capfd.readouterr().err


def test_cache_folder_falls_back_when_package_folder_is_read_only(tmp_path, monkeypatch):
    """Read-only package folder and user cache: Numba is pointed at $REFATTN_CACHE_DIR/numba."""
    from numba.core import config

    from refattn.kernels.cpu import runtime

    writeable = tmp_path / "cache"
    monkeypatch.setenv("REFATTN_CACHE_DIR", str(writeable))
    monkeypatch.setattr(config, "CACHE_DIR", "")
    monkeypatch.setattr(runtime, "_writeable_dir", lambda p: str(p).startswith(str(writeable)))
    assert runtime._setup_cache_dir() == str(writeable / "numba")
    assert config.CACHE_DIR == str(writeable / "numba")
    monkeypatch.setattr(config, "CACHE_DIR", "/some/user/choice")
    assert runtime._setup_cache_dir() == "/some/user/choice"  # NUMBA_CACHE_DIR always wins


def test_blas_pinned_to_one_thread_inside_kernels_and_restored():
    pytest.importorskip("threadpoolctl")
    from threadpoolctl import threadpool_info, threadpool_limits

    from refattn.kernels.cpu import runtime

    assert runtime.blas_libraries(), "no BLAS library found to pin"
    with threadpool_limits(2, user_api="blas"):
        with runtime.single_blas_thread():
            assert all(lib["num_threads"] == 1 for lib in threadpool_info() if lib["user_api"] == "blas")
        # (oneMKL, once loaded for set_blas("mkl"), is on its sequential layer: always one thread)
        assert all(lib["num_threads"] == 2 for lib in threadpool_info()
                   if lib["user_api"] == "blas" and lib.get("threading_layer") != "sequential")


def test_set_blas_choices_and_errors(monkeypatch):
    from refattn.kernels.cpu import runtime

    with pytest.raises(ValueError, match="blas must be one of"):
        runtime.set_blas("openblas64")
    assert runtime.set_blas("auto") == "builtin" and runtime.gemm_pointer(np.float32) == -1
    assert "micro-kernels" in runtime.blas_description()
    assert runtime.set_blas("SciPy") == "scipy" and runtime.gemm_pointer(np.float32) == 0
    assert "cython_blas" in runtime.blas_description()
    # the environment variable is read once, at the first use: a fresh process
    code = "from refattn.kernels.cpu import runtime; print(runtime.get_blas())"
    for env, expect in (("fastest", "REFATTN_BLAS='fastest'"), ("SCIPY", "scipy"),
                        (None, "builtin")):  # default: "auto"
        if env is None:
            monkeypatch.delenv("REFATTN_BLAS", raising=False)
        else:
            monkeypatch.setenv("REFATTN_BLAS", env)
        res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        assert expect in res.stdout + res.stderr, res.stderr


def test_backward_repeats_the_forwards_blas(blas):
    """A backward after ``set_blas`` changed uses the BLAS of its forward (kept in the cache): its
    gradients are bit-identical to a backward under the forward's BLAS."""
    from refattn.kernels.cpu import runtime

    rng = np.random.default_rng(21)
    q, k, v = _qkv(rng, 1, 2, 2, 40, 40, 8, 8, np.float32)
    g = rng.standard_normal((1, 2, 40, 8)).astype(np.float32)
    out, c = kf.flash_attention_forward(q, k, v, is_causal=True, block_q=16, block_k=16)
    same = kf.flash_attention_backward(g, c)
    runtime.set_blas("builtin" if blas != "builtin" else "scipy")
    other = kf.flash_attention_backward(g, c)
    for name in same:
        assert np.array_equal(same[name], other[name]), name
