r"""Numba CPU core of the fused softmax-attention kernels (shared by ``flash`` and ``differential``).

One forward and one backward kernel serve both plain softmax attention (SDPA) and differential
attention. They compute a weighted sum of ``R`` softmax-attention maps that share the values:

$$O = \sum_{r<R} w_{r,h}\,\mathrm{softmax}\big(T(s\,Q_r K_r^\top) + M\big)\,V,$$

``R = 1, w = 1`` for SDPA and ``R = 2, w = (1, -\lambda)`` for differential attention ($\lambda$
broadcast to every output row). These functions are unvalidated: the public wrappers
(:mod:`.flash`, :mod:`.differential`) check every argument in Python and pass C-contiguous arrays
of one floating dtype (inputs as read-only views, so that one compiled signature serves every
caller). All flags are *runtime* arguments, so each kernel compiles once per dtype.

Array layout (``B`` = all leading batch axes flattened):

* ``q`` (R, B, H, N, d), ``k`` (R, B, Hkv, M, d), ``v`` (B, Hkv, M, dv)
* ``kvmap`` (H,) int64: the kv head of each query head (GQA ``contiguous`` / ``strided``)
* ``w`` (R, B, H, N): map weights per output row
* mask: ``mask_mode`` 0 none, 1 boolean keep, 2 additive; ``maskb`` / ``maskf`` are flat
  C-contiguous buffers indexed by ``b*ms[0] + h*ms[1] + i*ms[2] + j*ms[3]`` (``ms`` int64 element
  strides, 0 on broadcast axes) so a broadcast mask is never materialised;
* causal: key ``j`` is visible from query ``i`` iff ``j <= i + offset``
  (``offset = 0`` top-left, ``M - N`` bottom-right);
* ``softcap > 0`` enables $T(x) = c\tanh(x/c)$.

**Tile products.** The runtime argument ``fp`` says what multiplies the tiles
(:func:`.runtime.gemm_pointer`): ``-1`` refattn's register-blocked micro-kernels (:mod:`._gemm`,
the default), whose ``C = A B^T`` products read the K (and in the backward V) tiles from panels
packed once per call (:func:`_pack_tiles`); ``0`` ``np.dot``, i.e. the BLAS ``gemm`` of SciPy's
``cython_blas`` (the wrappers pin it to one thread per Numba worker, see :mod:`.runtime`); else the
address of oneMKL's CBLAS gemm (:func:`_mm`). Tiles are contiguous views (no copies). Score tiles
are query-major, ``S = Q K^T`` (``nq, nk``), in the forward and in the backward. With BLAS products
the backward recomputes each score tile with *the same call on the same tile* as the forward (under
a causal mask the same row groups and trimmed widths, :func:`_diag_rows` / :func:`_diag_width`):
OpenBLAS rounds differently for other shapes or layouts, and logits that differ from the ones the
LSE was built from made the float32 gradients fail the 2x rule. The built-in products give every
entry the same value whatever the shape, so there the backward uses its own key tiles
(:func:`._common.bwd_block_k`).

**Causal diagonal.** A causal tile that crosses the diagonal is computed in row groups of ``bg``
rows (a runtime argument; ``bg = bq`` is one product per tile), each product ending at the last key
its group's last row sees, so the fully masked corner of a tall tile is not multiplied; within a
row, the ``max`` and ``exp`` loops stop at the row's own last visible key.

**Vector loops, fixed orders.** ``fastmath=False``; everything else is an elementwise loop over a
contiguous axis, which LLVM vectorises; the row loops over the score tile (max, exp, the backward's
``dS``) are small functions of their own compiled with 512-bit vectors on AVX-512 CPUs
(:func:`_wide_vectors`). Row maxima use ``llvm.maxnum`` with ``nnan`` (exact in any
order, :func:`_fmax`); the float32 row sums of ``P`` use one ``reassoc`` add (:func:`_radd`), whose
order is fixed by the compiled code. Each work item owns its outputs and the BLAS runs
single-threaded on tiles whose shapes depend on the problem only, so results are bit-identical
from call to call and for any thread count.

**exp.** float32 uses an elementwise ``2^t`` (:func:`_exp2f`: exponent bits plus a degree-6
polynomial), which vectorises; float64 uses ``math.exp``.

**Scratch.** Each work item allocates one buffer per dtype and carves its tiles out of it (the
``tanh`` tile only under a softcap). Separate buffers of ~1 MiB each made glibc return the freed
heap top to the system after every work item (it trims above twice the largest freed chunk) and
fault the pages in again for the next one: ~4,000 page faults, ~4 ms, per float32 backward at
N = 1024 (measured); one buffer per dtype is reused from the heap. Buffers are sized for the largest
tile that occurs, ``min(bq, N) x min(bk, M)``, and include the built-in products' work buffer
(:func:`._gemm.work_len`), so no tile product allocates.

**Schedule.** Forward work item = (batch, head, slot); a slot is one query tile, or under a causal
mask the pair of query tiles ``(p, nqt-1-p)``, so that every work item has the same number of key
tiles and Numba's static split of the items over its threads is balanced. Backward work item =
(batch, head, key split); split ``sp`` takes key tiles in a zig-zag (``sp``, ``2S-1-sp``,
``2S+sp``, ...), balanced for causal masks too. Both depend on the shapes only.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from . import runtime  # (cache folder, before the kernels are defined)
from ._gemm import gemm_nn, gemm_nt, pack_panels, panel_width_of, work_len


@njit(cache=True, inline="always")
def _mask_logit(x, b, h, i, j, mask_mode, maskb, maskf, ms):
    if mask_mode == 1:
        if not maskb[b * ms[0] + h * ms[1] + i * ms[2] + j * ms[3]]:
            return -np.inf
        return x
    if mask_mode == 2:
        return x + maskf[b * ms[0] + h * ms[1] + i * ms[2] + j * ms[3]]
    return x


@intrinsic
def _f32_from_bits(typingctx, x):
    """The float32 whose IEEE bits are the low 32 bits of the integer ``x`` (a bitcast; vectorises)."""
    if not isinstance(x, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        bits = args[0]
        if x.bitwidth > 32:
            bits = builder.trunc(bits, ir.IntType(32))
        return builder.bitcast(bits, ir.FloatType())

    return types.float32(x), codegen


@intrinsic
def _bits_of_f32(typingctx, x):
    """The IEEE bits of the float32 ``x`` as an int32 (a bitcast; vectorises). A float64 is rounded
    to float32 first: that only happens in the float32 branch of a kernel's float64 compile, which
    never runs (the branch is chosen by the dtype at run time)."""
    if not isinstance(x, types.Float):
        return None

    def codegen(context, builder, signature, args):
        v = args[0]
        if x.bitwidth != 32:
            v = builder.fptrunc(v, ir.FloatType())
        return builder.bitcast(v, ir.IntType(32))

    return types.int32(x), codegen


@intrinsic
def _fma(typingctx, a, b, c):
    """``a * b + c`` rounded once (``llvm.fma``), for three floats of one type.

    An explicit, correctly rounded IEEE operation: deterministic and allowed with
    ``fastmath=False`` (which forbids the compiler from *contracting* ``a * b + c`` on its own).
    """
    if not all(isinstance(x, types.Float) for x in (a, b, c)):
        return None
    res = max(a, b, c, key=lambda x: x.bitwidth)  # mixed only in the float64 compile of float32 code

    def codegen(context, builder, signature, args):
        args = [context.cast(builder, x, t, res) for x, t in zip(args, signature.args)]
        return builder.fma(*args)

    return res(a, b, c), codegen


@intrinsic
def _fmax(typingctx, a, b):
    """``max(a, b)`` as ``llvm.maxnum`` (operands are never NaN here: inputs are validated).

    A plain ``t[i] = max(t[i], x)`` in a loop is turned by LLVM into a *conditional* store, which
    it vectorises with ``vmaskmovps``, microcoded and ~7x slower on AMD Zen; ``maxnum`` becomes
    ``vmaxps`` and an unconditional store."""
    if not (isinstance(a, types.Float) and isinstance(b, types.Float)):
        return None
    res = max(a, b, key=lambda x: x.bitwidth)

    def codegen(context, builder, signature, args):
        args = [context.cast(builder, x, t, res) for x, t in zip(args, signature.args)]
        t = args[0].type
        name = "llvm.maxnum.f32" if isinstance(t, ir.FloatType) else "llvm.maxnum.f64"
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(t, [t, t]), name)
        # nnan (true: the operands are never NaN) lets LLVM vectorise a max *reduction*; max is
        # exact, so the order of that reduction cannot change the result.
        return builder.call(fn, args, fastmath=("nnan",))

    return res(a, b), codegen


@intrinsic
def _radd(typingctx, a, b):
    """``a + b`` with LLVM's ``reassoc`` flag, used only to accumulate a row sum: it lets LLVM
    vectorise that one reduction (8 or 16 partial sums, combined at the end). The order is fixed
    by the compiled code, so results stay bit-identical from call to call and for any thread
    count; it is the one place where the compiler, not the source, picks a summation order."""
    if not (isinstance(a, types.Float) and isinstance(b, types.Float)):
        return None
    res = max(a, b, key=lambda x: x.bitwidth)

    def codegen(context, builder, signature, args):
        x, y = (context.cast(builder, v, t, res) for v, t in zip(args, signature.args))
        return builder.fadd(x, y, flags=("reassoc",))

    return res(a, b), codegen


@intrinsic
def _cblas_gemm(typingctx, fp, ta, tb, m, n, k, a, lda, b, ldb, c, ldc):
    """``C = op(A) op(B)`` through the CBLAS ``?gemm`` at address ``fp`` (row-major; ``ta`` /
    ``tb`` nonzero: transposed). ``a``, ``b``, ``c`` are arrays of one float dtype whose rows are
    ``lda`` / ``ldb`` / ``ldc`` elements apart and whose elements are contiguous within a row.

    The address is a runtime argument (see :func:`.runtime.gemm_pointer`), so the compiled kernels
    stay cacheable: nothing process-specific is baked into them."""
    arrs = (a, b, c)
    if not all(isinstance(x, types.Array) and isinstance(x.dtype, types.Float) for x in arrs):
        return None
    if len({x.dtype for x in arrs}) != 1:
        return None

    def codegen(context, builder, sig, args):
        fp_, ta_, tb_, m_, n_, k_, a_, lda_, b_, ldb_, c_, ldc_ = args
        i32 = ir.IntType(32)
        ft = ir.FloatType() if sig.args[6].dtype.bitwidth == 32 else ir.DoubleType()
        ptr = ft.as_pointer()
        fnty = ir.FunctionType(ir.VoidType(), [i32, i32, i32, i32, i32, i32, ft, ptr, i32, ptr, i32, ft, ptr, i32])
        fn = builder.inttoptr(fp_, fnty.as_pointer())

        def data(ty, val):
            return builder.bitcast(context.make_array(ty)(context, builder, val).data, ptr)

        def i32_(v):
            return builder.trunc(v, i32) if v.type.width > 32 else v

        def trans(flag):  # CblasNoTrans 111, CblasTrans 112
            return builder.select(builder.icmp_signed("!=", flag, ir.Constant(flag.type, 0)),
                                  ir.Constant(i32, 112), ir.Constant(i32, 111))

        builder.call(fn, [ir.Constant(i32, 101), trans(ta_), trans(tb_), i32_(m_), i32_(n_), i32_(k_),
                          ir.Constant(ft, 1.0), data(sig.args[6], a_), i32_(lda_), data(sig.args[8], b_),
                          i32_(ldb_), ir.Constant(ft, 0.0), data(sig.args[10], c_), i32_(ldc_)])
        return context.get_dummy_value()

    return types.void(fp, ta, tb, m, n, k, a, lda, b, ldb, c, ldc), codegen


# The string attributes clang sets for -mprefer-vector-width=512.
_WIDE_VECTOR_ATTRS = ('"prefer-vector-width"="512"', '"min-legal-vector-width"="512"')


@intrinsic
def _wide_vectors(typingctx):
    """Let LLVM vectorise the loops of the function it is compiled into with 512-bit vectors where
    the CPU has them (AVX-512); no effect on other CPUs.

    LLVM's tuning for Intel's AVX-512 cores ("prefer-256-bit") stops its loop vectoriser at 256
    bits, and Numba has no per-function option for it (only the process-wide CPU name and
    features, which would change every other Numba function in the user's process too). This marks
    the one LLVM function, as clang's ``-mprefer-vector-width=512`` does. Used only by the small
    row functions below (:func:`_max_row`, :func:`_exp_row`, :func:`_bwd_row`), not by whole tile
    functions: marking all of ``_fwd_rows`` made the forward ~5 % slower, the row loops alone made it
    2-5 % faster (Xeon, Sapphire Rapids class, one thread, interleaved A/B). llvmlite accepts only
    keyword attributes through ``FunctionAttributes.add``, so the strings go into the underlying
    set; if that ever fails, the function compiles without them (256-bit vectors)."""

    def codegen(context, builder, sig, args):
        attrs = builder.function.attributes
        try:
            for a in _WIDE_VECTOR_ATTRS:
                set.add(attrs, a)
        except TypeError:  # a future llvmlite whose attribute set is not a set
            pass
        return context.get_dummy_value()

    return types.void(), codegen


@njit(cache=True, inline="always")
def _mm(fp, a, ta, b, tb, c):
    """``c = op(a) @ op(b)`` with ``op(x) = x.T`` where the flag is set; every array 2-D with
    contiguous rows. ``fp == 0``: ``np.dot`` (SciPy's BLAS, through Numba); else the CBLAS gemm at
    address ``fp`` (:func:`.runtime.gemm_pointer`, e.g. oneMKL). The forward and the backward of
    one call always use the same ``fp``, so recomputed score tiles stay bit-identical."""
    if fp == 0:
        if ta:
            if tb:
                np.dot(a.T, b.T, c)
            else:
                np.dot(a.T, b, c)
        elif tb:
            np.dot(a, b.T, c)
        else:
            np.dot(a, b, c)
        return
    sz = a.itemsize
    kk = a.shape[0] if ta else a.shape[1]
    _cblas_gemm(fp, ta, tb, c.shape[0], c.shape[1], kk, a, a.strides[0] // sz, b, b.strides[0] // sz,
                c, c.strides[0] // sz)


@njit(cache=True, inline="always")
def _mm_nt(fp, a, b, bp, c, wk):
    """``c = a @ b.T``: with the built-in products (``fp == -1``) from ``bp``, the panels of ``b``
    (:func:`._gemm.pack_panels`; ``wk`` their work buffer), else through :func:`_mm`."""
    if fp == -1:
        gemm_nt(a, bp, c, c.shape[0], c.shape[1], c[0], 0, wk)
    else:
        _mm(fp, a, False, b, True, c)


@njit(cache=True, inline="always")
def _mm_n(fp, a, ta, b, c, wk):
    """``c = op(a) @ b`` (``op(a) = a.T`` when ``ta``): the built-in products (``fp == -1``,
    :func:`._gemm.gemm_nn`, ``wk`` their work buffer) or :func:`_mm`."""
    if fp == -1:
        gemm_nn(a, ta, b, c, c.shape[0], c.shape[1], b.shape[0], wk)
    else:
        _mm(fp, a, ta, b, False, c)


@njit(cache=True)
def _pack_tiles(x, bk, fp):
    """The built-in products' panels of every ``bk``-row tile of ``x`` (``(..., M, e)``, the
    leading axes flattened to ``G``): ``(G, ntiles, npan, e, NR)``, tile ``t`` of group ``g`` at
    ``[g, t]`` (:func:`._gemm.pack_panels`). Packed once per call, before the parallel loop (~1 %
    of a call; a parallel loop here cost compile time for no measurable gain); an empty array (one
    group, one tile, no panel) when ``fp != -1``: BLAS products read the tiles in place."""
    M, e = x.shape[-2], x.shape[-1]
    xs = x.reshape(-1, M, e)
    G = xs.shape[0]
    nr = panel_width_of(x.itemsize)
    tk = min(bk, M)
    nkt = (M + bk - 1) // bk
    npan = (tk + nr - 1) // nr
    if fp != -1:
        return np.empty((1, 1, 0, e, nr), dtype=x.dtype)
    out = np.empty((G, nkt, npan, e, nr), dtype=x.dtype)
    for t in range(G * nkt):
        g = t // nkt
        kt = t % nkt
        j0 = kt * bk
        nk = min(bk, M - j0)
        pack_panels(xs[g, j0:j0 + nk], out[g, kt, :(nk + nr - 1) // nr])
    return out


@njit(cache=True, inline="always")
def _tile_panels(xp, g, kt):
    """The panels of tile ``kt`` of group ``g`` from :func:`_pack_tiles` (the empty placeholder's
    only entry when the products are BLAS calls)."""
    return xp[min(g, xp.shape[0] - 1), min(kt, xp.shape[1] - 1)]


LOG2E = 1.4426950408889634


# 1.5 * 2^23: adding it to a float32 |t| < 2^22 rounds t to the nearest integer n (ties to even,
# the default rounding mode) and leaves n in the low bits of the sum.
_ROUND_MAGIC = 12582912.0


@njit(cache=True, inline="always")
def _exp2f(t):
    r"""float32 $2^t$, elementwise so that it vectorises (libm ``expf`` does not).

    $2^t = 2^n\,2^f$ with $n$ the integer nearest $t$ and $f = t - n \in [-1/2, 1/2]$ (exact), a
    degree-6 polynomial for $2^f$ (least-squares fit on Chebyshev nodes, relative error
    $1.9\times10^{-9}$, ~1e-7 = 1.3 ulp evaluated in float32 with FMAs) and $2^n$ assembled in the
    exponent bits. $n$ comes from the round-to-integer trick: $y = t + 1.5\cdot2^{23}$ is rounded to
    an integer by the addition itself, $n = y - 1.5\cdot2^{23}$ exactly, and the low bits of $y$ are
    $n$, so ``(bits(y) << 23) + (127 << 23)`` are the bits of $2^n$ (the high bits of $y$ shift
    out). That is two additions and one shift instead of a ``floor`` (two micro-ops on the vector
    ports that also do the FMAs), a float-to-int conversion and a compare-and-select; the loops
    that call it are bound by those ports (measured: the exp pass went from 0.29 to 0.23 ns per
    entry on a Xeon, AVX2 width).

    $t$ is clamped below at $-127$, whose $2^n$ has all bits 0: exactly 0 for $t < -126.5$ and for
    ``-inf`` (masked entries), a subnormal for $-126.5 \le t < -126$. The kernels call it with
    $t \le 0$ (logits minus their running maximum, in units of $\log 2$), ~15 vector operations
    per vector of entries.
    """
    tc = max(t, np.float32(-127.0))
    y = tc + np.float32(_ROUND_MAGIC)
    n = y - np.float32(_ROUND_MAGIC)
    f = tc - n
    p = _fma(np.float32(0.00015337577497120947), f, np.float32(0.0013399859890341759))
    p = _fma(p, f, np.float32(0.009618519805371761))
    p = _fma(p, f, np.float32(0.05550329014658928))
    p = _fma(p, f, np.float32(0.24022646248340607))
    p = _fma(p, f, np.float32(0.6931471824645996))
    p = _fma(p, f, np.float32(1.0))
    return p * _f32_from_bits((_bits_of_f32(y) << np.int32(23)) + np.int32(127 << 23))


@njit(cache=True, inline="always")
def _expf(x):
    """float32 ``exp(x)`` as :func:`_exp2f` of ``x * log2(e)``.

    The callers form ``x = s*S - m`` with one FMA, so its rounding error is relative to ``x``,
    which is small for the entries that matter (``P`` near 1); scaling by ``log2(e)`` afterwards
    keeps that. (Folding ``log2(e)`` into ``s`` and ``m`` instead saves the multiply but adds an
    absolute error of ~|m| ulp to every exponent: the float32 gradients then failed the 2x rule.)
    """
    return _exp2f(x * np.float32(LOG2E))


# Row loops of the score tile, each its own (not inlined) function so that it alone is compiled
# with 512-bit vectors (:func:`_wide_vectors`).


@njit(cache=True)
def _max_row(row, nv):
    """``max(row[:nv])`` (``nv >= 1``) as a ``maxnum`` reduction (exact in any order). The loop runs
    over all ``nv`` entries, ``row[0]`` twice: a trip count of ``nv - 1`` left a scalar remainder of
    up to 31 serial ``maxss`` per row, which cost more than the vector part (measured)."""
    _wide_vectors()
    mt = row[0]
    for jj in range(nv):
        mt = _fmax(mt, row[jj])
    return mt


@njit(cache=True)
def _exp_row(row, nv, sc, neg, zero):
    """float32 forward: ``row[j] = exp(sc * row[j] - m)`` for ``j < nv`` (``neg = -m``, one FMA), and
    their sum, accumulated with :func:`_radd` from ``zero``."""
    _wide_vectors()
    t = zero
    for jj in range(nv):
        e = _expf(_fma(sc, row[jj], neg))
        row[jj] = e
        t = _radd(t, e)
    return t


@njit(cache=True)
def _bwd_row(srow, dprow, dsrow, nv, sc, lh, lo, wr, D):
    """float32 backward of one row: ``P = exp(sc * S - L)`` with ``L = lh + lo`` (the float64 LSE as
    a rounded part and the rest), ``dS = P (w dP - D)`` into ``dsrow`` and ``w P`` (the ``dV``
    weight) over ``srow``."""
    _wide_vectors()
    for jj in range(nv):
        pw = _expf(_fma(sc, srow[jj], -lh) - lo)
        dsrow[jj] = pw * (wr * dprow[jj] - D)
        srow[jj] = wr * pw


@njit(cache=True, inline="always")
def _as_dtype(x, like):
    """The Python float ``x`` in the dtype of the array ``like`` (float32 arithmetic stays float32)."""
    one = np.empty(1, dtype=like.dtype)
    one[0] = x
    return one[0]


@njit(cache=True, inline="always")
def _final_logits(s, nq, nk, b, h, i0, j0, scale, softcap, mask_mode, maskb, maskf, ms, th):
    """Raw products ``s[ii, jj] = q_i . k_j`` -> final logits (scale, softcap, mask) in place;
    ``th`` keeps ``tanh`` for the softcap backward. Only used when a softcap or a mask is set."""
    for ii in range(nq):
        for jj in range(nk):
            x = s[ii, jj] * scale
            if softcap > 0.0:
                t = math.tanh(x / softcap)
                th[ii, jj] = t
                x = softcap * t
            s[ii, jj] = _mask_logit(x, b, h, i0 + ii, j0 + jj, mask_mode, maskb, maskf, ms)


@njit(cache=True, inline="always")
def _diag_rows(causal, i0, nq, j0, nk, offset, bg):
    """Row group of the score products of query tile ``i0 .. i0+nq`` x key tile ``j0 .. j0+nk``:
    ``nq`` (one product) unless the tile is causal and crosses the diagonal, then ``bg``; the
    forward and the backward both call this, so they form the same products."""
    if causal and j0 + nk - 1 > i0 + offset:
        return bg
    return nq


@njit(cache=True, inline="always")
def _diag_width(causal, i0, g0, ng, j0, nk, M, offset):
    """Width of the score product of query rows ``i0+g0 .. i0+g0+ng`` with key tile ``j0 .. j0+nk``:
    under a causal mask it stops at the last key the group's last row sees (<= 0: none)."""
    if causal:
        return min(nk, min(M, i0 + g0 + ng + offset) - j0)
    return nk


@njit(cache=True)
def _fwd_rows(fp, q, k, kp, v, b, h, hk, i0, g0, ng, j0, kt, nk, mask_mode, maskb, maskf, ms, scale, softcap,
              causal, offset, sbuf, pbuf, th, acc, mrow, lrow, alpha, rsum, rmax, wk):
    """Online-softmax update of query rows ``i0+g0 .. i0+g0+ng`` (tile rows ``g0 .. g0+ng``) with
    keys ``j0 .. j0+nk`` (all ``R`` maps): one score product ``S = Q K^T`` of shape ``(ng, nk)``.

    The score tile is query-major, because the ``P V`` product is ~15 % faster from a row-major
    ``P`` than from a transposed one (measured). Row maxima are vectorised ``maxnum`` reductions
    (exact in any order; with the built-in products, on a tile whose keys every row sees and whose
    logits are the raw products, they come from the product's registers, :func:`._gemm.gemm_nt`);
    the float32 row sums are accumulated in the ``exp`` loop with :func:`_radd`. Under a causal
    mask the max and exp loops of a row stop at its last visible key (the rest of the row is set to
    0)."""
    R = q.shape[0]
    dv = v.shape[3]
    fast = q.itemsize == 4
    plain = softcap == 0.0 and mask_mode == 0
    sc = _as_dtype(scale if plain else 1.0, mrow)  # plain: the scale is applied inside exp
    zero = _as_dtype(0.0, mrow)
    vt = v[b, hk, j0:j0 + nk]
    s = sbuf[:ng * nk].reshape(ng, nk)
    pv = pbuf[:ng * dv].reshape(ng, dv)
    for r in range(R):
        kpan = _tile_panels(kp, (r * k.shape[1] + b) * k.shape[2] + hk, kt)
        qrows = q[r, b, h, i0 + g0:i0 + g0 + ng]
        # Row maxima from the product's registers (built-in products, raw logits) over the first
        # ``nf`` columns, which every row of the group sees (all of them off the causal diagonal).
        nf = 0
        if fp == -1 and plain:
            for gi in range(ng):
                rmax[gi] = -np.inf
            nf = gemm_nt(qrows, kpan, s, ng, nk, rmax, i0 + g0 + offset + 1 - j0 if causal else nk, wk)
        else:
            _mm_nt(fp, qrows, k[r, b, hk, j0:j0 + nk], kpan, s, wk)  # S = Q K^T
        if not plain:
            _final_logits(s, ng, nk, b, h, i0 + g0, j0, scale, softcap, mask_mode, maskb, maskf, ms, th)
        for gi in range(ng):
            ii = g0 + gi
            nv = nk
            if causal:
                nv = min(nk, max(0, i0 + ii + offset + 1 - j0))  # keys j <= i + offset
                for jj in range(nv, nk):
                    s[gi, jj] = 0.0
            m_old = mrow[r, ii]
            m_new = m_old
            if nv > 0:
                if nf == 0:
                    mt = _max_row(s[gi], nv)
                elif nv > nf:  # the fused maximum of the first nf columns, then the rest
                    mt = max(rmax[gi], _max_row(s[gi, nf:], nv - nf))
                else:
                    mt = rmax[gi]
                m_new = max(m_old, sc * mt)
            if m_new == -np.inf:  # nothing visible in this row yet: P = 0, state unchanged
                alpha[gi] = 1.0
                rsum[gi] = 0.0
                for jj in range(nv):
                    s[gi, jj] = 0.0
                continue
            mrow[r, ii] = m_new
            alpha[gi] = math.exp(np.float64(m_old) - np.float64(m_new))  # 0 when m_old = -inf
            neg = -m_new
            if fast:
                rsum[gi] = _exp_row(s[gi], nv, sc, neg, zero)
            else:
                t = zero
                for jj in range(nv):
                    e = math.exp(sc * s[gi, jj] + neg)
                    s[gi, jj] = e
                    t += e
                rsum[gi] = t
        _mm_n(fp, s, False, vt, pv, wk)  # P V_tile
        for gi in range(ng):
            ii = g0 + gi
            lrow[r, ii] = lrow[r, ii] * alpha[gi] + rsum[gi]  # float64
            a = _as_dtype(alpha[gi], rsum)
            for c in range(dv):
                acc[r, ii, c] = acc[r, ii, c] * a + pv[gi, c]


@njit(cache=True)
def _fwd_query_tile(fp, q, k, kp, v, w, b, h, hk, i0, nq, mask_mode, maskb, maskf, ms, scale, softcap, causal,
                    offset, bk, bg, sbuf, pbuf, th, acc, mrow, lrow, alpha, rsum, rmax, wk, out, omap, lse):
    """Online-softmax forward of query rows ``i0 .. i0+nq`` of head ``h`` (all ``R`` maps).

    Key tiles ``j0 .. j0+bk``; a causal tile that crosses the diagonal is done in row groups of
    ``bg`` rows, each product stopping at the group's last visible key (:func:`_diag_rows`,
    :func:`_diag_width`), so the fully masked corner is not multiplied."""
    R = q.shape[0]
    M = k.shape[3]
    dv = v.shape[3]
    for r in range(R):
        for ii in range(nq):
            mrow[r, ii] = -np.inf
            lrow[r, ii] = 0.0
            for c in range(dv):
                acc[r, ii, c] = 0.0
    jend = M
    if causal:
        jend = min(M, i0 + nq + offset)  # the last visible key of the tile is (i0 + nq - 1) + offset
    for j0 in range(0, max(jend, 0), bk):
        nk = min(bk, M - j0)
        rows = _diag_rows(causal, i0, nq, j0, nk, offset, bg)
        for g0 in range(0, nq, rows):
            ng = min(rows, nq - g0)
            nkg = _diag_width(causal, i0, g0, ng, j0, nk, M, offset)
            if nkg <= 0:  # no row of the group sees key j0
                continue
            _fwd_rows(fp, q, k, kp, v, b, h, hk, i0, g0, ng, j0, j0 // bk, nkg, mask_mode, maskb, maskf, ms, scale,
                      softcap, causal, offset, sbuf, pbuf, th, acc, mrow, lrow, alpha, rsum, rmax, wk)
    for ii in range(nq):
        i = i0 + ii
        for r in range(R):
            l_ = lrow[r, ii]
            if l_ > 0.0:
                lse[r, b, h, i] = np.float64(mrow[r, ii]) + math.log(l_)
                inv = 1.0 / l_
                for c in range(dv):
                    omap[r, b, h, i, c] = acc[r, ii, c] * inv
            else:
                lse[r, b, h, i] = -np.inf
                for c in range(dv):
                    omap[r, b, h, i, c] = 0.0
        # out may alias omap when R = 1 (w = 1): read every map before writing out.
        for c in range(dv):
            o = w[0, b, h, i] * omap[0, b, h, i, c]
            for r in range(1, R):
                o += w[r, b, h, i] * omap[r, b, h, i, c]
            out[b, h, i, c] = o


@njit(cache=True, parallel=True)
def attention_fwd(q, k, v, w, kvmap, mask_mode, maskb, maskf, ms, scale, softcap, causal, offset,
                  bq, bk, bg, out, omap, lse, fp):
    """Forward: fills ``out`` (B,H,N,dv), per-map normalised outputs ``omap`` (R,B,H,N,dv) and
    ``lse`` (R,B,H,N), float64 whatever the dtype (``-inf`` on fully masked rows, whose outputs
    are 0): the backward recomputes ``P = exp(sS - L)`` from it, and a float32 LSE of a row with
    logits ~10 carries a rounding error of ~5e-7, which alone made float32 ``dV`` fail the 2x rule
    (the naive reference keeps ``P`` itself). The running sums ``l`` are float64 for the same reason."""
    R, B, H, N, d = q.shape
    M = k.shape[3]
    dv = v.shape[3]
    nqt = (N + bq - 1) // bq
    nslot = (nqt + 1) // 2 if causal else nqt  # causal: query tiles p and nqt-1-p share a slot
    kp = _pack_tiles(k, bk, fp)  # the K tiles' panels for the built-in products (empty otherwise)
    for t in prange(B * H * nslot):
        b = t // (H * nslot)
        h = (t // nslot) % H
        p = t % nslot
        # Scratch: one buffer per dtype, carved into views (see the module docstring, "Scratch"),
        # sized for the largest tile that occurs (a short sequence needs less than bq x bk).
        tq, tk = min(bq, N), min(bk, M)
        nth = tq * tk if softcap > 0.0 else 0  # tanh of the logits: kept only under a softcap
        nwk = work_len(tq, q.itemsize) if fp == -1 else 0  # the built-in products' work buffer
        fl = np.empty(tq * tk + tq * dv + R * tq * dv + R * tq + 2 * tq + nwk + nth, dtype=q.dtype)
        o = tq * tk
        sbuf = fl[:o]
        pbuf = fl[o:o + tq * dv]
        o += tq * dv
        acc = fl[o:o + R * tq * dv].reshape(R, tq, dv)
        o += R * tq * dv
        mrow = fl[o:o + R * tq].reshape(R, tq)
        o += R * tq
        rsum = fl[o:o + tq]
        o += tq
        rmax = fl[o:o + tq]
        o += tq
        wk = fl[o:o + nwk]
        o += nwk
        th = fl[o:o + nth].reshape(tq if nth else 0, tk if nth else 0)
        f8 = np.empty(R * tq + tq, dtype=np.float64)
        lrow = f8[:R * tq].reshape(R, tq)
        alpha = f8[R * tq:]
        tiles = 2 if causal and nqt - 1 - p != p else 1
        for sub in range(tiles):
            it = p if sub == 0 else nqt - 1 - p
            i0 = it * bq
            _fwd_query_tile(fp, q, k, kp, v, w, b, h, kvmap[h], i0, min(bq, N - i0), mask_mode, maskb, maskf, ms,
                            scale, softcap, causal, offset, bk, bg, sbuf, pbuf, th, acc, mrow, lrow, alpha,
                            rsum, rmax, wk, out, omap, lse)


@njit(cache=True, inline="always")
def _add_into(acc, t):
    """``acc[:m, :n] += t`` for a tile product ``t`` of shape ``(m, n)`` (``acc`` float64, possibly
    larger: the accumulators are sized for the largest tile)."""
    for i in range(t.shape[0]):
        for j in range(t.shape[1]):
            acc[i, j] += t[i, j]


@njit(cache=True)
def _bwd_rows(fp, q, k, kp, v, vp, w, dout, lse, delta, b, h, hk, i0, nq, j0, kt, nkq, sp, mask_mode, maskb,
              maskf, ms, scale, softcap, causal, offset, sbuf, dpbuf, dsbuf, tbuf, th, wk, lrow, llo, dka, dva,
              dkat, dvat, dq_part):
    """Backward contribution of query rows ``i0 .. i0+nq`` and keys ``j0 .. j0+nkq``: one recomputed
    score product (the forward's), then ``dP``, ``dV``, ``dK`` and ``dQ`` products.

    ``dV`` and ``dK`` of the key tile accumulate in ``dva`` / ``dka`` (key-major) with SciPy's BLAS
    and the built-in products, and in ``dvat`` / ``dkat`` (the same memory, feature-major) with
    oneMKL (``fp > 0``): oneMKL runs ``(w P)^T dO`` and ``dS^T Q``, whose large operand is
    transposed, at ~130 GFLOP/s on these shapes but their transposes ``dO^T (w P)`` and ``Q^T dS``
    at ~150 (measured, Xeon, one thread); OpenBLAS runs the first form ~3 % faster, and so do the
    built-in products (~150 against 123-136), so each gets its faster form."""
    R = q.shape[0]
    d = q.shape[4]
    dv = v.shape[3]
    fast = q.itemsize == 4
    plain = softcap == 0.0 and mask_mode == 0
    sc = _as_dtype(scale if plain else 1.0, lrow)
    dot = dout[b, h, i0:i0 + nq]
    s = sbuf[:nq * nkq].reshape(nq, nkq)
    dp = dpbuf[:nq * nkq].reshape(nq, nkq)
    ds = dsbuf[:nq * nkq].reshape(nq, nkq)
    _mm_nt(fp, dot, v[b, hk, j0:j0 + nkq], _tile_panels(vp, b * v.shape[1] + hk, kt), dp, wk)  # dP = dO V^T (all maps)
    for r in range(R):
        qt = q[r, b, h, i0:i0 + nq]
        ktile = k[r, b, hk, j0:j0 + nkq]
        _mm_nt(fp, qt, ktile, _tile_panels(kp, (r * k.shape[1] + b) * k.shape[2] + hk, kt), s, wk)  # the forward's call
        if not plain:
            _final_logits(s, nq, nkq, b, h, i0, j0, scale, softcap, mask_mode, maskb, maskf, ms, th)
        for ii in range(nq):
            i = i0 + ii
            L = lse[r, b, h, i]  # float64
            if L == -np.inf:  # a fully masked row: P = 0, dS = 0
                for jj in range(nkq):
                    s[ii, jj] = 0.0
                    ds[ii, jj] = 0.0
                continue
            nv = nkq
            if causal:
                nv = min(nkq, max(0, i + offset + 1 - j0))  # keys j <= i + offset
                for jj in range(nv, nkq):
                    s[ii, jj] = 0.0
                    ds[ii, jj] = 0.0
            lrow[ii] = L  # L rounded to the dtype ...
            llo[ii] = L - np.float64(lrow[ii])  # ... and the rest
            lh = lrow[ii]
            lo = llo[ii]
            D = delta[r, b, h, i]
            wr = w[r, b, h, i]
            if fast:
                _bwd_row(s[ii], dp[ii], ds[ii], nv, sc, lh, lo, wr, D)
            else:
                for jj in range(nv):
                    pw = math.exp(sc * s[ii, jj] - lh - lo)
                    ds[ii, jj] = pw * (wr * dp[ii, jj] - D)
                    s[ii, jj] = wr * pw
            if softcap > 0.0:
                for jj in range(nv):
                    tt = th[ii, jj]
                    ds[ii, jj] = ds[ii, jj] * (1.0 - tt * tt)
        if fp > 0:  # oneMKL: the transposed products (see the docstring)
            tvt = tbuf[:dv * nkq].reshape(dv, nkq)
            _mm(fp, dot, True, s, False, tvt)  # dO^T (w P)
            _add_into(dvat, tvt)
            tkt = tbuf[:d * nkq].reshape(d, nkq)
            _mm(fp, qt, True, ds, False, tkt)  # Q^T dS
            _add_into(dkat[r], tkt)
        else:
            tv = tbuf[:nkq * dv].reshape(nkq, dv)
            _mm_n(fp, s, True, dot, tv, wk)  # (w P)^T dO
            _add_into(dva, tv)
            tk = tbuf[:nkq * d].reshape(nkq, d)
            _mm_n(fp, ds, True, qt, tk, wk)  # dS^T Q
            _add_into(dka[r], tk)
        tq = tbuf[:nq * d].reshape(nq, d)
        _mm_n(fp, ds, False, ktile, tq, wk)  # dS K
        _add_into(dq_part[sp, r, b, h, i0:i0 + nq], tq)


@njit(cache=True)
def _bwd_key_tile(fp, q, k, kp, v, vp, w, dout, lse, delta, b, h, hk, j0, kt, nk, sp, mask_mode, maskb, maskf, ms,
                  scale, softcap, causal, offset, bq, bg, sbuf, dpbuf, dsbuf, tbuf, th, wk, lrow, llo, dka, dva,
                  dkat, dvat, dq_part, dk_part, dv_part):
    """FlashAttention-2 backward of key rows ``j0 .. j0+nk`` of query head ``h`` over all query tiles.
    ``dka`` / ``dva`` and ``dkat`` / ``dvat`` are two layouts of the same accumulators
    (:func:`_bwd_rows`)."""
    R, B, H, N, d = q.shape
    dv = v.shape[3]
    dka[:] = 0.0  # all of the accumulators' memory, whichever layout is used
    dva[:] = 0.0
    M = k.shape[3]
    i_start = 0
    if causal:
        i_start = max(0, j0 - offset)  # the first query that sees key j0
    for i0 in range(i_start - i_start % bq, N, bq):
        nq = min(bq, N - i0)
        # The forward's products of tile (i0, j0) (same row groups, same widths), so the
        # recomputed logits are bit-identical to the ones the LSE was built from (OpenBLAS rounds
        # differently for other shapes/layouts).
        rows = _diag_rows(causal, i0, nq, j0, nk, offset, bg)
        for g0 in range(0, nq, rows):
            ng = min(rows, nq - g0)
            nkq = _diag_width(causal, i0, g0, ng, j0, nk, M, offset)
            if nkq <= 0:  # no query of this group sees key j0
                continue
            _bwd_rows(fp, q, k, kp, v, vp, w, dout, lse, delta, b, h, hk, i0 + g0, ng, j0, kt, nkq, sp, mask_mode,
                      maskb, maskf, ms, scale, softcap, causal, offset, sbuf, dpbuf, dsbuf, tbuf, th, wk, lrow,
                      llo, dka, dva, dkat, dvat, dq_part)
    for jj in range(nk):
        for r in range(R):
            for c in range(d):
                dk_part[r, b, h, j0 + jj, c] = dkat[r, c, jj] if fp > 0 else dka[r, jj, c]
        for c in range(dv):
            dv_part[b, h, j0 + jj, c] = dvat[c, jj] if fp > 0 else dva[jj, c]


@njit(cache=True, parallel=True)
def attention_bwd(q, k, v, w, kvmap, mask_mode, maskb, maskf, ms, scale, softcap, causal, offset,
                  bq, bk, bg, nsplit, dout, lse, delta, dq_part, dk_part, dv_part, fp):
    r"""FlashAttention-2 backward, recomputing $P$ from the stored LSE.

    ``delta`` (R,B,H,N) is $D_r = w_r\,\mathrm{rowsum}(dO \odot O_r) - dL_r$ (``dL`` the upstream
    LSE gradient), so $dS_r = P_r \odot (w_r\,dO\,V^\top - D_r)$.
    ``lse`` (R,B,H,N) is float64 (the forward's); it enters the float32 exponent as a rounded part
    plus a remainder, ``fma(s, S, -L_hi) - L_lo``.
    Work item = (b, query head h, key split). Outputs, all *unscaled by s* and per query head:
    ``dq_part`` (nsplit,R,B,H,N,d) $\sum_j dS K$ (float64, zero-initialised: it accumulates over
    the split's key tiles), ``dk_part`` (R,B,H,M,d) $dS^\top Q$, ``dv_part`` (B,H,M,dv)
    $\sum_r w_r P_r^\top dO$; the tile partials are summed in float64. The caller sums the splits
    and the heads of each kv group in a fixed order and multiplies by ``s``.
    """
    R, B, H, N, d = q.shape
    M = k.shape[3]
    dv = v.shape[3]
    nkt = (M + bk - 1) // bk
    kp = _pack_tiles(k, bk, fp)  # the K and V tiles' panels for the built-in products (empty otherwise)
    vp = _pack_tiles(v, bk, fp)
    for t in prange(B * H * nsplit):
        b = t // (H * nsplit)
        h = (t // nsplit) % H
        sp = t % nsplit
        # Scratch: one buffer per dtype, carved into views (see the module docstring, "Scratch"),
        # sized for the largest tile that occurs (a short sequence needs less than bq x bk).
        tq, tk = min(bq, N), min(bk, M)
        nt = tq * tk
        nth = nt if softcap > 0.0 else 0
        ntb = max(tk, tq) * max(d, dv)
        nwk = work_len(max(tk, tq), q.itemsize) if fp == -1 else 0  # the built-in products' work buffer
        fl = np.empty(3 * nt + ntb + 2 * tq + nwk + nth, dtype=q.dtype)
        sbuf = fl[:nt]
        dpbuf = fl[nt:2 * nt]
        dsbuf = fl[2 * nt:3 * nt]
        tbuf = fl[3 * nt:3 * nt + ntb]
        vec = fl[3 * nt + ntb:3 * nt + ntb + 2 * tq].reshape(2, tq)
        wk = fl[3 * nt + ntb + 2 * tq:3 * nt + ntb + 2 * tq + nwk]
        th = fl[3 * nt + ntb + 2 * tq + nwk:].reshape(tq if nth else 0, tk if nth else 0)
        f8 = np.empty(R * tk * d + tk * dv, dtype=np.float64)
        dka = f8[:R * tk * d].reshape(R, tk, d)  # key-major (SciPy's BLAS) ...
        dva = f8[R * tk * d:].reshape(tk, dv)
        dkat = f8[:R * tk * d].reshape(R, d, tk)  # ... or feature-major (oneMKL), see _bwd_rows
        dvat = f8[R * tk * d:].reshape(dv, tk)
        for kt_i in range(nkt):
            pos = kt_i % (2 * nsplit)  # zig-zag: split sp owns positions sp and 2*nsplit-1-sp
            if pos != sp and pos != 2 * nsplit - 1 - sp:
                continue
            j0 = kt_i * bk
            _bwd_key_tile(fp, q, k, kp, v, vp, w, dout, lse, delta, b, h, kvmap[h], j0, kt_i, min(bk, M - j0), sp,
                          mask_mode, maskb, maskf, ms, scale, softcap, causal, offset, bq, bg, sbuf, dpbuf, dsbuf,
                          tbuf, th, wk, vec[0], vec[1], dka, dva, dkat, dvat, dq_part, dk_part, dv_part)


runtime.register_entry_point(attention_fwd, "attention_fwd")
runtime.register_entry_point(attention_bwd, "attention_bwd")
