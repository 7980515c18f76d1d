r"""Register-blocked tile products for the Numba attention kernels (no BLAS).

The attention kernels multiply small tiles: ``S = Q K^T`` with an inner dimension of ``d`` (64),
``P V`` with ``d``-wide outputs, and the backward's transposed forms. A BLAS call on such tiles
pays for packing both operands on every call and, with OpenBLAS, for a separate pass that zeroes
``C`` (``beta = 0``). On one Xeon core (AVX-512, ``256 x 1024 x 64``, float32, same rounds)
OpenBLAS 0.3.30 ran them at 108-128 GFLOP/s, oneMKL at 131-170 and the micro-kernels here at
145-172 (docs/kernels.md).

**Micro-kernel.** :func:`_make_micro` emits LLVM IR with explicit vector types: an ``MR x NV*W``
block of ``C`` lives in ``MR*NV`` vector registers (``W`` lanes: 16 float32 / 8 float64 with
AVX-512, 8 / 4 with AVX2) while the loop over the inner index ``p`` broadcasts ``A[r, p]`` and
multiplies it with the ``NV`` vectors of row ``p`` of ``B`` (one ``llvm.fma`` each). ``A`` is
addressed with two element strides (``A[r, p] = a[r*ar + p*ap]``), so ``A`` and ``A^T`` of a
row-major array are the same kernel; ``B`` rows are contiguous.

**Products.**

* :func:`gemm_nt` ``C = A B^T`` (``S = Q K^T``, the backward's ``dP = dO V^T``): ``B`` is read
  from *panels* made by :func:`pack_panels`, ``NR`` of its rows transposed into ``(k, NR)``
  contiguous blocks and zero-padded, so that every load of the loop is one aligned-size vector.
* :func:`gemm_nn` ``C = op(A) B`` with ``op(A) = A`` or ``A^T`` (``P V``, ``dS K``, ``P^T dO``,
  ``dS^T Q``): ``B`` rows are read in place; a last column block narrower than ``NR`` goes through
  a zero-padded copy. The inner dimension runs in chunks of :data:`KC` so that the ``B`` rows of
  a chunk stay in L1 across the row blocks.

**Order and determinism.** Every entry of ``C`` is a chain of FMAs over ``p`` in increasing order
(in chunks of ``KC``, or ``KC_T`` for ``A^T``, each chunk's chain started at 0 and added to
``C``), the same whichever micro-kernel (full, half or one-row) computed it and whatever rows or
columns surround it. The result therefore depends on the inner dimension only: a recomputed score
tile is bit-identical to the forward's, for any tile or group shape, and results do not depend on
the thread count.

**Shapes by instruction set.** Chosen when the module is imported, from the CPU features Numba
compiles for (its cache is keyed by that CPU): with AVX-512 (32 vector registers of 512 bits) every
product uses blocks of ``6 x 4`` vectors, else (AVX2 or narrower: 16 registers, 256 bits assumed)
``6 x 2``; ``MR*NV`` accumulators plus the ``B`` vectors and one broadcast must fit in the register
file. On a narrower CPU LLVM splits the vectors, which is correct, only slower.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic


def _target_features() -> str:
    """The CPU features Numba compiles for (``NUMBA_CPU_FEATURES`` when set, else the host's)."""
    try:
        from numba.core import config

        if config.CPU_FEATURES is not None:
            return config.CPU_FEATURES
        import llvmlite.binding as ll

        return ll.get_host_cpu_features().flatten()
    except Exception:  # pragma: no cover - an llvmlite without the query: assume AVX2
        return "+avx2"


_FEATURES = _target_features()
AVX512 = "+avx512f" in _FEATURES
# Bytes per vector register and the register file the shapes are fitted to.
VECTOR_BYTES = 64 if AVX512 else 32
# Rows x vectors of the C block held in registers, for every product: 6 x 4 needs 24 accumulators,
# 4 B vectors and a broadcast (of 32 AVX-512 registers); 6 x 2 fits AVX2's 16. Measured on a Xeon
# (AVX-512, float32, one thread, same rounds): Q K^T at 256 x 1024 x 64 ran at 168 GFLOP/s with
# 6 x 4, 164 with 14 x 2, 161 with 12 x 2, 156 with 8 x 2, 147 with 4 x 4; P V 168 with 6 x 4,
# 163 with 5 x 4, 154 with 4 x 4; P^T dO 154 with 6 x 4, 125-149 with the others.
MR = 6
NV = 4 if AVX512 else 2
# Inner-dimension chunk of gemm_nn: 128 rows of a 64-wide float32 B are 32 KiB, which stays in a
# 48 KiB L1 (P V at 256 x 1024 x 64 on a Xeon: 194 GFLOP/s with 128, 181 with 1024, 182 with 64).
KC = 128
# ... and of op(A) = A^T (the backward's P^T dO, dS^T Q): each step of the inner loop reads a new
# row of the score tile (one cache line per row, shared by neighbouring register blocks), so a
# shorter chunk keeps those lines in L1 with the B rows (measured: the backward's five products of
# a 256 x 1024 tile took 1.13-1.15 ms with 64, 1.19-1.23 with 128, same rounds; 32 was no better).
KC_T = 64
_WIDE_ATTRS = ('"prefer-vector-width"="512"', '"min-legal-vector-width"="512"')


def lanes(itemsize: int) -> int:
    """Vector lanes ``W`` for elements of ``itemsize`` bytes."""
    return VECTOR_BYTES // itemsize


def panel_width(dtype) -> int:
    """Columns ``NR`` of one :func:`pack_panels` panel for ``dtype`` (64 float32 with AVX-512)."""
    return NV * lanes(np.dtype(dtype).itemsize)


def _make_micro(MR: int, NV: int):
    """An intrinsic ``micro(a, ia, ar, ap, b, ib, ldb, c, ic, ldc, kdim, mode, mx, im)``:
    ``C[r, :NV*W] (+)= sum_p a[ia + r*ar + p*ap] * b[ib + p*ldb : ... + NV*W]`` for ``r < MR``,
    with ``C[r, :]`` at ``c[ic + r*ldc]``: ``mode`` 0 stores the block, 1 adds it to ``C``, 2
    stores it and raises ``mx[im + r]`` to the maximum of row ``r`` of the block (``maxnum``,
    exact in any order). ``a``, ``b``, ``c``, ``mx`` are arrays of one float dtype; offsets and
    strides are in elements."""

    @intrinsic
    def micro(typingctx, a, ia, ar, ap, b, ib, ldb, c, ic, ldc, kdim, mode, mx, im):
        arrs = (a, b, c, mx)
        if not all(isinstance(x, types.Array) and isinstance(x.dtype, types.Float) for x in arrs):
            return None
        if len({x.dtype for x in arrs}) != 1:
            return None

        def codegen(context, builder, sig, args):
            a_, ia_, ar_, ap_, b_, ib_, ldb_, c_, ic_, ldc_, k_, mode_, mx_, im_ = args
            attrs = builder.function.attributes
            try:  # 512-bit vectors must stay legal in this function (see _attention._wide_vectors)
                for at in _WIDE_ATTRS:
                    set.add(attrs, at)
            except TypeError:  # pragma: no cover
                pass
            bits = sig.args[0].dtype.bitwidth
            ft = ir.FloatType() if bits == 32 else ir.DoubleType()
            W = VECTOR_BYTES * 8 // bits
            vt = ir.VectorType(ft, W)
            i32, i64 = ir.IntType(32), ir.IntType(64)

            def base(ty, val, off):
                ptr = builder.bitcast(context.make_array(ty)(context, builder, val).data, ft.as_pointer())
                return builder.gep(ptr, [off])

            pa = base(sig.args[0], a_, ia_)
            pb = base(sig.args[4], b_, ib_)
            pc = base(sig.args[7], c_, ic_)
            fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vt, [vt, vt, vt]),
                                                 f"llvm.fma.v{W}f{bits}")
            acc = [[cgutils.alloca_once(builder, vt) for _ in range(NV)] for _ in range(MR)]
            zero = ir.Constant(vt, [0.0] * W)
            for row in acc:
                for slot in row:
                    builder.store(zero, slot)
            arow = [builder.gep(pa, [builder.mul(ir.Constant(i64, r), ar_)]) for r in range(MR)]
            lane0 = ir.Constant(i32, 0)
            bcast = ir.Constant(ir.VectorType(i32, W), [0] * W)
            with cgutils.for_range(builder, k_) as loop:
                p = loop.index
                brow = builder.gep(pb, [builder.mul(p, ldb_)])
                bv = [builder.load(builder.bitcast(builder.gep(brow, [ir.Constant(i64, t * W)]), vt.as_pointer()),
                                   align=bits // 8) for t in range(NV)]
                pap = builder.mul(p, ap_)
                for r in range(MR):
                    x = builder.load(builder.gep(arow[r], [pap]))
                    xs = builder.shuffle_vector(builder.insert_element(ir.Constant(vt, ir.Undefined), x, lane0),
                                                ir.Constant(vt, ir.Undefined), bcast)
                    for t in range(NV):
                        builder.store(builder.call(fma, [xs, bv[t], builder.load(acc[r][t])]), acc[r][t])
            add = builder.icmp_signed("==", mode_, ir.Constant(mode_.type, 1))
            with builder.if_then(builder.icmp_signed("==", mode_, ir.Constant(mode_.type, 2))):
                pm = base(sig.args[12], mx_, im_)
                vmax = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vt, [vt, vt]),
                                                      f"llvm.maxnum.v{W}f{bits}")
                hmax = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ft, [vt]),
                                                      f"llvm.vector.reduce.fmax.v{W}f{bits}")
                smax = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ft, [ft, ft]),
                                                      f"llvm.maxnum.f{bits}")
                for r in range(MR):
                    v = builder.load(acc[r][0])
                    for t in range(1, NV):
                        v = builder.call(vmax, [v, builder.load(acc[r][t])], fastmath=("nnan",))
                    h = builder.call(hmax, [v], fastmath=("nnan",))
                    pr = builder.gep(pm, [ir.Constant(i64, r)])
                    builder.store(builder.call(smax, [builder.load(pr), h], fastmath=("nnan",)), pr)
            for r in range(MR):
                crow = builder.gep(pc, [builder.mul(ir.Constant(i64, r), ldc_)])
                for t in range(NV):
                    cp = builder.bitcast(builder.gep(crow, [ir.Constant(i64, t * W)]), vt.as_pointer())
                    val = builder.load(acc[r][t])
                    with builder.if_then(add):
                        builder.store(builder.fadd(builder.load(cp, align=bits // 8), val), cp, align=bits // 8)
                    with builder.if_then(builder.not_(add)):
                        builder.store(val, cp, align=bits // 8)
            return context.get_dummy_value()

        i = types.intp
        return types.void(a, i, i, i, b, i, i, c, i, i, i, i, mx, i), codegen

    return micro


# The full block, and for the last rows of a product a half block and single rows (m % 6 of them).
_full = _make_micro(MR, NV)
_half = _make_micro(MR // 2, NV)
_row = _make_micro(1, NV)


@njit(cache=True)
def _block_column(a, ia, ar, ap, b, ib, ldb, c, ic, ldc, kdim, mode, mx, m):
    """One ``NR``-wide column block of ``C`` for rows ``0 .. m``: blocks of ``MR`` rows, then a
    half block and single rows (every entry is the same FMA chain whichever kernel computes it);
    ``mode`` and ``mx`` (row ``i``'s maximum at ``mx[i]``) as in :func:`_make_micro`."""
    mfull = m - m % MR
    for i0 in range(0, mfull, MR):
        _full(a, ia + i0 * ar, ar, ap, b, ib, ldb, c, ic + i0 * ldc, ldc, kdim, mode, mx, i0)
    i = mfull
    if m - i >= MR // 2:
        _half(a, ia + i * ar, ar, ap, b, ib, ldb, c, ic + i * ldc, ldc, kdim, mode, mx, i)
        i += MR // 2
    for ii in range(i, m):
        _row(a, ia + ii * ar, ar, ap, b, ib, ldb, c, ic + ii * ldc, ldc, kdim, mode, mx, ii)


@njit(cache=True, inline="always")
def panel_width_of(itemsize):
    """``NR`` (:func:`panel_width`) for elements of ``itemsize`` bytes, inside compiled code."""
    return NV * (VECTOR_BYTES // itemsize)


@njit(cache=True, inline="always")
def work_len(m, itemsize):
    """Elements of the ``work`` buffer that :func:`gemm_nt` and :func:`gemm_nn` need for products
    of at most ``m`` rows: a narrow last column block is computed into an ``m x NR`` block, from a
    zero-padded ``KC x NR`` copy of its ``B`` columns. The callers carve it out of their scratch,
    so no product allocates."""
    return (m + KC) * panel_width_of(itemsize)


@njit(cache=True)
def pack_panels(src, dst):
    """``dst[g, p, t] = src[g*NR + t, p]`` (0 past the last row of ``src``): the rows of ``src``
    (``n x k``, contiguous rows) as ``ceil(n / NR)`` transposed, zero-padded panels ``(k, NR)``
    (``dst`` has shape ``(ceil(n / NR), k, NR)``, ``NR`` = :func:`panel_width`)."""
    n, k = src.shape
    nr = dst.shape[2]
    for g in range(dst.shape[0]):
        for t in range(nr):
            j = g * nr + t
            if j < n:
                for p in range(k):
                    dst[g, p, t] = src[j, p]
            else:
                for p in range(k):
                    dst[g, p, t] = 0.0


@njit(cache=True)
def gemm_nt(a, bp, c, m, n, mx, nmax, work):
    """``c[:m, :n] = a[:m] @ B^T`` with ``B`` (``n x k``) given as its panels ``bp`` (from
    :func:`pack_panels`; ``k = a.shape[1]``). ``a`` and ``c`` are 2-D with contiguous rows. A
    last panel narrower than ``NR`` is computed into a block of ``work`` (1-D, ``c``'s dtype, at
    least :func:`work_len` ``(m)`` elements) and copied.

    Row maxima: with ``nmax > 0``, also ``mx[i] = max(mx[i], max(c[i, :w]))`` for the first
    ``w = nmax`` columns rounded down to whole panels, or all ``n`` columns when ``nmax >= n``
    (``mx`` of ``c``'s dtype, set by the caller), formed from the registers as the blocks are
    stored: the forward's row maxima without a pass over the score tile. Returns ``w``, the
    columns covered (0 when ``nmax <= 0``)."""
    if m <= 0 or n <= 0:
        return 0
    k = a.shape[1]
    nr = bp.shape[2]
    sa = a.strides[0] // a.itemsize
    sc = c.strides[0] // c.itemsize
    nfull = n - n % nr
    w = 0 if nmax <= 0 else (n if nmax >= n else nmax - nmax % nr)
    for j0 in range(0, nfull, nr):
        mode = 2 if j0 + nr <= w else 0
        _block_column(a, 0, sa, 1, bp, (j0 // nr) * k * nr, nr, c, j0, sc, k, mode, mx, m)
    if nfull < n:
        tmp = work[:m * nr].reshape(m, nr)
        _block_column(a, 0, sa, 1, bp, (nfull // nr) * k * nr, nr, tmp, 0, nr, k, 0, mx, m)
        for i in range(m):
            mt = mx[i]
            for t in range(n - nfull):
                c[i, nfull + t] = tmp[i, t]
                mt = max(mt, tmp[i, t])
            if w == n:
                mx[i] = mt
    return w


@njit(cache=True)
def gemm_nn(a, ta, b, c, m, n, k, work):
    """``c[:m, :n] = op(a) @ b[:k, :n]`` with ``op(a) = a[:m, :k]`` or, when ``ta``, ``a[:k, :m].T``.
    Every array is 2-D with contiguous rows. The inner dimension runs in chunks of :data:`KC`
    (:data:`KC_T` for ``a.T``; each chunk's FMA chain added to ``c``); a last column block
    narrower than ``NR`` multiplies a zero-padded copy of its ``B`` columns into a small block
    that is then added to ``c``, both in ``work`` (1-D, ``c``'s dtype, at least :func:`work_len`
    ``(m)`` elements). ``k = 0`` gives zeros."""
    if m <= 0 or n <= 0:
        return
    if k <= 0:
        for i in range(m):
            for j in range(n):
                c[i, j] = 0.0
        return
    nr = panel_width_of(c.itemsize)
    sa = a.strides[0] // a.itemsize
    ar, ap = (1, sa) if ta else (sa, 1)
    sb = b.strides[0] // b.itemsize
    sc = c.strides[0] // c.itemsize
    nfull = n - n % nr
    tail = n - nfull
    kcap = KC_T if ta else KC
    tmp = work[:m * nr].reshape(m, nr)
    bt = work[m * nr:(m + kcap) * nr].reshape(kcap, nr)
    if tail:
        bt[:, tail:] = 0.0  # the padding columns (the tail columns are copied in per chunk)
    for k0 in range(0, k, kcap):
        kc = min(kcap, k - k0)
        add = 1 if k0 > 0 else 0
        for j0 in range(0, nfull, nr):
            _block_column(a, k0 * ap, ar, ap, b, k0 * sb + j0, sb, c, j0, sc, kc, add, c[0], m)
        if tail:
            for p in range(kc):
                for t in range(tail):
                    bt[p, t] = b[k0 + p, nfull + t]
            _block_column(a, k0 * ap, ar, ap, bt, 0, nr, tmp, 0, nr, kc, 0, c[0], m)
            for i in range(m):
                for t in range(tail):
                    if add:
                        c[i, nfull + t] += tmp[i, t]
                    else:
                        c[i, nfull + t] = tmp[i, t]
