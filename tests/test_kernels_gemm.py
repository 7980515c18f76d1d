"""The built-in tile products of the attention kernels (``refattn.kernels.cpu._gemm``).

Each product is checked against NumPy on shapes with remainders in every direction (rows that
are not a multiple of the register block, a last column block narrower than a panel, inner
dimensions across the ``KC`` chunks), for both dtypes, ``A`` and ``A^T``, strided row views, and
for the property the backward relies on: an entry's value depends on the inner dimension only,
not on the block shape around it.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("numba")

from refattn.kernels.cpu import _gemm as G  # noqa: E402


def _panels(b):
    nr = G.panel_width(b.dtype)
    bp = np.full((-(-b.shape[0] // nr), b.shape[1], nr), np.nan, dtype=b.dtype)
    G.pack_panels(b, bp)
    return bp


def _work(m, dt):
    """The products' work buffer, filled with NaN: no NaN may reach a result."""
    return np.full(G.work_len(m, np.dtype(dt).itemsize), np.nan, dtype=dt)


def _nt(a, b):
    """``a @ b.T``, checking the fused row maxima on the way (exact: a maximum has one value)."""
    c = np.full((a.shape[0], b.shape[0]), np.nan, dtype=a.dtype)
    mx = np.full(a.shape[0] + 1, -np.inf, dtype=a.dtype)
    mx[-1] = 123.0  # past the rows: must stay as it is
    assert G.gemm_nt(a, _panels(b), c, a.shape[0], b.shape[0], mx, b.shape[0], _work(len(a), a.dtype)) == b.shape[0]
    assert np.array_equal(mx[:-1], c.max(axis=1)) and mx[-1] == 123.0
    c2 = np.full_like(c, np.nan)
    assert G.gemm_nt(a, _panels(b), c2, a.shape[0], b.shape[0], mx, 0, _work(len(a), a.dtype)) == 0
    assert np.array_equal(c, c2)
    # the maximum of the leading columns only, rounded down to whole panels
    nr = G.panel_width(a.dtype)
    for nmax in (1, nr, nr + 5, 2 * nr + 1):
        if nmax >= b.shape[0]:
            continue
        mx2 = np.full(a.shape[0], -np.inf, dtype=a.dtype)
        w = G.gemm_nt(a, _panels(b), c2, a.shape[0], b.shape[0], mx2, nmax, _work(len(a), a.dtype))
        assert w == nmax - nmax % nr and np.array_equal(c, c2)
        assert np.array_equal(mx2, c[:, :w].max(axis=1) if w else mx2) and (w or np.all(mx2 == -np.inf))
    return c


def _nn(a, ta, b):
    m = a.shape[1] if ta else a.shape[0]
    c = np.full((m, b.shape[1]), np.nan, dtype=a.dtype)
    G.gemm_nn(a, ta, b, c, m, b.shape[1], b.shape[0], _work(m, a.dtype))
    return c


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_products_match_numpy_with_remainders(dt):
    rng = np.random.default_rng(0)
    tol = 2e-6 if dt == np.float32 else 1e-14
    nr = G.panel_width(dt)
    for m, n, k in itertools.product([1, 2, G.MR // 2, G.MR + 1, 4 * G.MR + 5], [1, 7, nr, nr + 9, 2 * nr + 3],
                                     [1, 5, G.KC, G.KC + 3]):
        a = rng.standard_normal((m, k)).astype(dt)
        b = rng.standard_normal((n, k)).astype(dt)
        bt = rng.standard_normal((k, n)).astype(dt)
        for got, ref in ((_nt(a, b), a.astype(float) @ b.T.astype(float)),
                         (_nn(a, False, bt), a.astype(float) @ bt.astype(float)),
                         (_nn(np.ascontiguousarray(a.T), True, bt), a.astype(float) @ bt.astype(float))):
            assert got.dtype == dt and np.all(np.isfinite(got)), (m, n, k)
            err = np.abs(got - ref).max() / max(1.0, np.abs(ref).max())
            assert err < tol * np.sqrt(k), (m, n, k, err)


def test_empty_inner_dimension_gives_zeros():
    a = np.ones((7, 0), dtype=np.float32)
    c = np.full((7, 5), np.nan, dtype=np.float32)
    G.gemm_nn(np.ones((0, 7), dtype=np.float32), True, np.ones((0, 5), dtype=np.float32), c, 7, 5, 0,
              _work(7, np.float32))
    assert np.all(c == 0.0)
    c2 = np.full((7, 5), np.nan, dtype=np.float32)
    G.gemm_nn(a, False, np.ones((0, 5), dtype=np.float32), c2, 7, 5, 0, _work(7, np.float32))
    assert np.all(c2 == 0.0)


def test_products_read_strided_row_views_and_write_only_their_block():
    rng = np.random.default_rng(1)
    big = rng.standard_normal((30, 90)).astype(np.float32)
    a = big[3:20, 5:69]  # 17 rows of 64, rows 90 apart
    b = rng.standard_normal((70, 64)).astype(np.float32)
    c = np.full((20, 80), 7.0, dtype=np.float32)
    G.gemm_nt(a, _panels(b), c, 17, 70, c[0], 0, _work(17, np.float32))
    np.testing.assert_allclose(c[:17, :70], a.astype(float) @ b.T.astype(float), rtol=0, atol=1e-4)
    assert np.all(c[17:] == 7.0) and np.all(c[:, 70:] == 7.0)
    v = rng.standard_normal((64, 100)).astype(np.float32)[:, 10:90]  # 80 columns, rows 100 apart
    c2 = np.full((17, 85), 7.0, dtype=np.float32)
    G.gemm_nn(a, False, v, c2, 17, 80, 64, _work(17, np.float32))
    np.testing.assert_allclose(c2[:, :80], a.astype(float) @ v.astype(float), rtol=0, atol=1e-4)
    assert np.all(c2[:, 80:] == 7.0)


@pytest.mark.parametrize("dt", [np.float32, np.float64])
def test_an_entry_does_not_depend_on_the_block_around_it(dt):
    """The backward recomputes score tiles in other row groups and widths than some forward
    shapes; with the built-in products the values must still be bit-identical."""
    rng = np.random.default_rng(2)
    a = rng.standard_normal((50, 64)).astype(dt)
    b = rng.standard_normal((150, 64)).astype(dt)
    full = _nt(a, b)
    for r0, r1, n in ((0, 1, 150), (7, 19, 33), (13, 50, 97), (44, 50, 1)):
        part = np.full((r1 - r0, n), np.nan, dtype=dt)
        G.gemm_nt(a[r0:r1], _panels(b[:n]), part, r1 - r0, n, part[0], 0, _work(r1 - r0, dt))
        assert np.array_equal(part, full[r0:r1, :n]), (r0, r1, n)
    bt = rng.standard_normal((300, 70)).astype(dt)
    for ta in (False, True):  # rows 10..30 of op(A) B, alone or among others: the same entries
        full = _nn(np.ascontiguousarray(b[:, :50] if ta else b[:50]), ta, bt[:64] if ta else bt[:150, :64])
        part = _nn(np.ascontiguousarray(b[:, 10:30] if ta else b[10:30]), ta, bt[:64] if ta else bt[:150, :64])
        assert np.array_equal(part, full[10:30]), ta


def test_avx2_shapes_compile_and_match(tmp_path):
    """On a CPU without AVX-512 the micro-kernels use 256-bit vectors and fewer registers: compile
    that variant here (Numba told to target Haswell) and check it against NumPy."""
    code = (
        "import numpy as np\n"
        "from refattn.kernels.cpu import _gemm as G\n"
        "assert not G.AVX512 and G.VECTOR_BYTES == 32, G._FEATURES\n"
        "rng = np.random.default_rng(0)\n"
        "a = rng.standard_normal((29, 70)).astype(np.float32); b = rng.standard_normal((45, 70)).astype(np.float32)\n"
        "nr = G.panel_width(np.float32); bp = np.empty((-(-45 // nr), 70, nr), np.float32); G.pack_panels(b, bp)\n"
        "c = np.empty((29, 45), np.float32); mx = np.full(29, -np.inf, np.float32)\n"
        "wk = np.full(G.work_len(70, 4), np.nan, np.float32)\n"
        "G.gemm_nt(a, bp, c, 29, 45, mx, 45, wk); assert np.array_equal(mx, c.max(axis=1))\n"
        "assert np.abs(c - a @ b.T).max() < 1e-4\n"
        "c2 = np.empty((70, 70), np.float32); G.gemm_nn(a, True, b[:29], c2, 70, 70, 29, wk)\n"
        "assert np.abs(c2 - a.T @ b[:29]).max() < 1e-4\n"
        "print('ok', G.MR, G.NV)\n")
    env = dict(os.environ, NUMBA_CPU_NAME="haswell", NUMBA_CPU_FEATURES="+avx,+avx2,+fma,+sse4.2,+popcnt",
               NUMBA_CACHE_DIR=str(tmp_path))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600, env=env)
    assert res.returncode == 0 and "ok 6 2" in res.stdout, res.stdout + res.stderr
