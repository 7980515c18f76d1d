r"""Numba CPU core of the fused softmax-attention kernels (shared by ``flash`` and ``differential``).

One forward and one backward kernel serve both plain softmax attention (SDPA) and differential
attention. They compute a weighted sum of ``R`` softmax-attention maps that share the values:

$$O = \sum_{r<R} w_{r,h}\,\mathrm{softmax}\big(T(s\,Q_r K_r^\top) + M\big)\,V,$$

``R = 1, w = 1`` for SDPA and ``R = 2, w = (1, -\lambda)`` for differential attention ($\lambda$
broadcast to every output row). These
functions are unvalidated: the public wrappers (:mod:`.flash`, :mod:`.differential`) check every
argument in Python and pass C-contiguous arrays of one floating dtype. All flags are *runtime*
arguments, so each kernel compiles once per dtype (float32, float64).

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

Loop structure: every dot product is written as an outer-product update whose innermost loop runs
over a contiguous axis (``S[i, :] += q_ic * K^T[c, :]``, ``acc[i, :] += p_ij * V[j, :]``). That
loop carries no reduction, so LLVM vectorises it without ``fastmath`` and the summation order (over
``c`` and over key tiles) is fixed: results are bit-identical from call to call and thread count
to thread count. The backward sums each query tile's (key tile's) contribution to dK, dV (dQ) in
the input dtype and adds it to float64 accumulators, so the long sums over N are float64; the
recomputed P, dP, dS tiles stay in the input dtype.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange, types
from numba.extending import intrinsic


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
def _fma(typingctx, a, b, c):
    """``a * b + c`` rounded once (``llvm.fma``), for three floats of one type.

    An explicit, correctly rounded IEEE operation: deterministic and allowed with
    ``fastmath=False`` (which forbids the compiler from *contracting* ``a * b + c`` on its own).
    LLVM vectorises it to FMA instructions.
    """
    if not (isinstance(a, types.Float) and a == b and b == c):
        return None

    def codegen(context, builder, signature, args):
        return builder.fma(*args)

    return a(a, b, c), codegen


@njit(cache=True, inline="always")
def _mm_abt(S, A, a0, nx, Bt, b0, ny, e):
    """``S[x, y] = sum_c A[a0 + x, c] * Bt[c, b0 + y]`` for ``x < nx``, ``y < ny``, ``c < e``.

    The innermost loop runs over ``y`` (contiguous in ``S`` and ``Bt``); ``c`` is unrolled by 4 and
    four rows share every load of ``Bt`` (register blocking). Each ``S`` entry accumulates over ``c``
    in increasing order with one FMA per term, so the result does not depend on the blocking.
    """
    e4 = e - e % 4
    nx4 = nx - nx % 4
    for x in range(0, nx4, 4):
        for y in range(ny):
            S[x, y] = 0.0
            S[x + 1, y] = 0.0
            S[x + 2, y] = 0.0
            S[x + 3, y] = 0.0
        for c in range(0, e4, 4):
            p0 = A[a0 + x, c]
            p1 = A[a0 + x, c + 1]
            p2 = A[a0 + x, c + 2]
            p3 = A[a0 + x, c + 3]
            r0 = A[a0 + x + 1, c]
            r1 = A[a0 + x + 1, c + 1]
            r2 = A[a0 + x + 1, c + 2]
            r3 = A[a0 + x + 1, c + 3]
            t0 = A[a0 + x + 2, c]
            t1 = A[a0 + x + 2, c + 1]
            t2 = A[a0 + x + 2, c + 2]
            t3 = A[a0 + x + 2, c + 3]
            u0 = A[a0 + x + 3, c]
            u1 = A[a0 + x + 3, c + 1]
            u2 = A[a0 + x + 3, c + 2]
            u3 = A[a0 + x + 3, c + 3]
            for y in range(ny):
                k0 = Bt[c, b0 + y]
                k1 = Bt[c + 1, b0 + y]
                k2 = Bt[c + 2, b0 + y]
                k3 = Bt[c + 3, b0 + y]
                S[x, y] = _fma(p3, k3, _fma(p2, k2, _fma(p1, k1, _fma(p0, k0, S[x, y]))))
                S[x + 1, y] = _fma(r3, k3, _fma(r2, k2, _fma(r1, k1, _fma(r0, k0, S[x + 1, y]))))
                S[x + 2, y] = _fma(t3, k3, _fma(t2, k2, _fma(t1, k1, _fma(t0, k0, S[x + 2, y]))))
                S[x + 3, y] = _fma(u3, k3, _fma(u2, k2, _fma(u1, k1, _fma(u0, k0, S[x + 3, y]))))
        for c in range(e4, e):
            for xx in range(x, x + 4):
                p0 = A[a0 + xx, c]
                for y in range(ny):
                    S[xx, y] = _fma(p0, Bt[c, b0 + y], S[xx, y])
    for x in range(nx4, nx):
        for y in range(ny):
            S[x, y] = 0.0
        for c in range(e):
            p0 = A[a0 + x, c]
            for y in range(ny):
                S[x, y] = _fma(p0, Bt[c, b0 + y], S[x, y])


@njit(cache=True, inline="always")
def _acc_pb(C, c0, P, nx, ny, B, b0, e):
    """``C[c0 + x, :e] += sum_y P[x, y] * B[b0 + y, :e]``: y unrolled by 4, two rows of ``C`` share
    every load of ``B``, one FMA per term in increasing ``y`` (the result does not depend on the
    blocking)."""
    ny4 = ny - ny % 4
    nx2 = nx - nx % 2
    for x in range(0, nx2, 2):
        for y in range(0, ny4, 4):
            p0 = P[x, y]
            p1 = P[x, y + 1]
            p2 = P[x, y + 2]
            p3 = P[x, y + 3]
            r0 = P[x + 1, y]
            r1 = P[x + 1, y + 1]
            r2 = P[x + 1, y + 2]
            r3 = P[x + 1, y + 3]
            for c in range(e):
                v0 = B[b0 + y, c]
                v1 = B[b0 + y + 1, c]
                v2 = B[b0 + y + 2, c]
                v3 = B[b0 + y + 3, c]
                C[c0 + x, c] = _fma(p3, v3, _fma(p2, v2, _fma(p1, v1, _fma(p0, v0, C[c0 + x, c]))))
                C[c0 + x + 1, c] = _fma(r3, v3, _fma(r2, v2, _fma(r1, v1, _fma(r0, v0, C[c0 + x + 1, c]))))
        for y in range(ny4, ny):
            p0 = P[x, y]
            r0 = P[x + 1, y]
            for c in range(e):
                C[c0 + x, c] = _fma(p0, B[b0 + y, c], C[c0 + x, c])
                C[c0 + x + 1, c] = _fma(r0, B[b0 + y, c], C[c0 + x + 1, c])
    for x in range(nx2, nx):
        for y in range(ny):
            p0 = P[x, y]
            for c in range(e):
                C[c0 + x, c] = _fma(p0, B[b0 + y, c], C[c0 + x, c])


@njit(cache=True, inline="always")
def _acc_ptb(C, P, nx, ny, B, b0, e):
    """``C[x, :e] += sum_y P[y, x] * B[b0 + y, :e]`` (``P`` transposed), blocked as :func:`_acc_pb`."""
    ny4 = ny - ny % 4
    nx2 = nx - nx % 2
    for x in range(0, nx2, 2):
        for y in range(0, ny4, 4):
            p0 = P[y, x]
            p1 = P[y + 1, x]
            p2 = P[y + 2, x]
            p3 = P[y + 3, x]
            r0 = P[y, x + 1]
            r1 = P[y + 1, x + 1]
            r2 = P[y + 2, x + 1]
            r3 = P[y + 3, x + 1]
            for c in range(e):
                v0 = B[b0 + y, c]
                v1 = B[b0 + y + 1, c]
                v2 = B[b0 + y + 2, c]
                v3 = B[b0 + y + 3, c]
                C[x, c] = _fma(p3, v3, _fma(p2, v2, _fma(p1, v1, _fma(p0, v0, C[x, c]))))
                C[x + 1, c] = _fma(r3, v3, _fma(r2, v2, _fma(r1, v1, _fma(r0, v0, C[x + 1, c]))))
        for y in range(ny4, ny):
            p0 = P[y, x]
            r0 = P[y, x + 1]
            for c in range(e):
                C[x, c] = _fma(p0, B[b0 + y, c], C[x, c])
                C[x + 1, c] = _fma(r0, B[b0 + y, c], C[x + 1, c])
    for x in range(nx2, nx):
        for y in range(ny):
            p0 = P[y, x]
            for c in range(e):
                C[x, c] = _fma(p0, B[b0 + y, c], C[x, c])


@njit(cache=True, inline="always")
def _logits_row(s, th, ii, b, h, i, j0, nk, scale, softcap, causal, offset, mask_mode, maskb, maskf, ms):
    """Row ``ii`` of a tile of raw dot products -> final logits in place: scale, softcap (tanh kept
    in ``th``), mask, causal. The common case (no softcap, no mask) is a plain vectorised scale."""
    if softcap == 0.0 and mask_mode == 0:
        for jj in range(nk):
            s[ii, jj] = s[ii, jj] * scale
    else:
        for jj in range(nk):
            x = s[ii, jj] * scale
            if softcap > 0.0:
                t = math.tanh(x / softcap)
                th[ii, jj] = t
                x = softcap * t
            s[ii, jj] = _mask_logit(x, b, h, i, j0 + jj, mask_mode, maskb, maskf, ms)
    if causal:
        for jj in range(max(i + offset - j0 + 1, 0), nk):  # keys j > i + offset are hidden
            s[ii, jj] = -np.inf


@njit(cache=True, inline="always")
def _exp_row(s, ii, nk, shift, e2, e2i, fast):
    r"""``s[ii, :nk] = exp(s[ii, :nk] - shift)`` in place (``-inf`` -> 0).

    ``fast`` (float32 only): Cephes ``expf`` — $2^n e^r$ with $n = \lfloor x\log_2 e + 1/2\rceil$,
    $r = x - n\ln 2$ (two-constant Cody–Waite) and a degree-7 polynomial for $e^r$, $2^n$ built from
    its exponent bits through the int32 view ``e2i`` of ``e2``. Every step is elementwise, so the
    loops vectorise (libm ``expf`` does not); accuracy ~1 ulp like libm, and exactly 0 below
    $x = -87$ where ``expf`` would return a denormal $< 2^{-125}$. float64 uses ``math.exp``.
    """
    if fast:
        lo = np.float32(-87.0)
        for jj in range(nk):
            x = s[ii, jj] - shift
            xc = max(x, lo)
            nf = math.floor(xc * np.float32(1.44269504088896341) + np.float32(0.5))
            r = xc - nf * np.float32(0.693359375) - nf * np.float32(-2.12194440e-4)
            p = ((((np.float32(1.9875691500e-4) * r + np.float32(1.3981999507e-3)) * r
                   + np.float32(8.3334519073e-3)) * r + np.float32(4.1665795894e-2)) * r
                 + np.float32(1.6666665459e-1)) * r + np.float32(5.0000001201e-1)
            p = p * r * r + r + np.float32(1.0)
            e2i[jj] = (np.int32(nf) + np.int32(127)) << 23
            s[ii, jj] = p if x >= lo else np.float32(0.0)
        for jj in range(nk):
            s[ii, jj] = s[ii, jj] * e2[jj]
    else:
        for jj in range(nk):
            s[ii, jj] = math.exp(s[ii, jj] - shift)


@njit(cache=True, inline="always")
def _row_max(s, ii, nk):
    """Max of ``s[ii, :nk]`` with four interleaved partial maxima (exact, order-free)."""
    a0 = -np.inf
    a1 = -np.inf
    a2 = -np.inf
    a3 = -np.inf
    n4 = nk - nk % 4
    for jj in range(0, n4, 4):
        a0 = max(a0, s[ii, jj])
        a1 = max(a1, s[ii, jj + 1])
        a2 = max(a2, s[ii, jj + 2])
        a3 = max(a3, s[ii, jj + 3])
    for jj in range(n4, nk):
        a0 = max(a0, s[ii, jj])
    return max(max(a0, a1), max(a2, a3))


@njit(cache=True, inline="always")
def _row_sum(s, ii, nk):
    """Sum of ``s[ii, :nk]`` in float64 with four interleaved partial sums (a fixed order, so it is
    deterministic, and four independent add chains instead of one latency-bound chain)."""
    a0 = 0.0
    a1 = 0.0
    a2 = 0.0
    a3 = 0.0
    n4 = nk - nk % 4
    for jj in range(0, n4, 4):
        a0 += s[ii, jj]
        a1 += s[ii, jj + 1]
        a2 += s[ii, jj + 2]
        a3 += s[ii, jj + 3]
    for jj in range(n4, nk):
        a0 += s[ii, jj]
    return (a0 + a1) + (a2 + a3)


@njit(cache=True, parallel=True, fastmath=False)
def attention_fwd(q, k, v, w, kvmap, mask_mode, maskb, maskf, ms, scale, softcap, causal, offset,
                  bq, bk, out, omap, lse):
    """Forward: fills ``out`` (B,H,N,dv), per-map normalised outputs ``omap`` (R,B,H,N,dv) and
    ``lse`` (R,B,H,N) (``-inf`` on fully masked rows, whose outputs are 0).

    Each key tile is transposed into a small ``d x bk`` scratch (contiguous rows of ``bk``): reading
    a pre-transposed ``(d, M)`` K instead strides by ``4M`` bytes between rows, which aliases in
    L1 for power-of-two ``M`` and was measured ~1.8x slower."""
    R, B, H, N, d = q.shape
    M = k.shape[3]
    dv = v.shape[3]
    nqt = (N + bq - 1) // bq
    ntask = B * H * nqt
    fast = q.itemsize == 4  # float32: vectorised exp
    for t in prange(ntask):
        b = t // (H * nqt)
        h = (t // nqt) % H
        it = t % nqt
        hk = kvmap[h]
        i0 = it * bq
        nq = min(bq, N - i0)
        s = np.empty((bq, bk), dtype=q.dtype)
        th = np.empty((bq, bk), dtype=q.dtype)
        kt = np.empty((d, bk), dtype=q.dtype)
        e2 = np.empty(bk, dtype=q.dtype)
        e2i = e2.view(np.int32)
        acc = np.zeros((R, bq, dv), dtype=q.dtype)
        mrow = np.full((R, bq), -np.inf, dtype=q.dtype)
        lrow = np.zeros((R, bq), dtype=q.dtype)
        jend = M
        if causal:
            jend = min(M, i0 + nq + offset)  # last visible key of the tile is (i0+nq-1)+offset
        for j0 in range(0, max(jend, 0), bk):
            nk = min(bk, jend - j0)
            vbh = v[b, hk]
            for r in range(R):
                for jj in range(nk):
                    for c in range(d):
                        kt[c, jj] = k[r, b, hk, j0 + jj, c]
                _mm_abt(s, q[r, b, h], i0, nq, kt, 0, nk, d)
                for ii in range(nq):
                    _logits_row(s, th, ii, b, h, i0 + ii, j0, nk, scale, softcap, causal, offset,
                                mask_mode, maskb, maskf, ms)
                    mt = _row_max(s, ii, nk)
                    m_old = mrow[r, ii]
                    m_new = max(m_old, mt)
                    if m_new == -np.inf:
                        for jj in range(nk):
                            s[ii, jj] = 0.0  # nothing visible yet in this row: P = 0
                        continue
                    alpha = math.exp(m_old - m_new)  # 0 when m_old = -inf
                    mrow[r, ii] = m_new
                    _exp_row(s, ii, nk, m_new, e2, e2i, fast)
                    rs = _row_sum(s, ii, nk)
                    lrow[r, ii] = lrow[r, ii] * alpha + rs
                    if alpha != 1.0:
                        for c in range(dv):
                            acc[r, ii, c] *= alpha
                _acc_pb(acc[r], 0, s, nq, nk, vbh, j0, dv)  # acc += P V_tile
        for ii in range(nq):
            i = i0 + ii
            for r in range(R):
                l_ = lrow[r, ii]
                if l_ > 0.0:
                    lse[r, b, h, i] = mrow[r, ii] + math.log(l_)
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


@njit(cache=True, parallel=True, fastmath=False)
def attention_bwd(q, k, v, w, kvmap, mask_mode, maskb, maskf, ms, scale, softcap, causal, offset,
                  bq, bk, nsplit, dout, lse, delta, dq_part, dk_part, dv_part):
    r"""FlashAttention-2 backward, recomputing $P$ from the stored LSE.

    ``delta`` (R,B,H,N) is $D_r = w_r\,\mathrm{rowsum}(dO \odot O_r) - dL_r$ (``dL`` the upstream
    LSE gradient), so $dS_r = P_r \odot (w_r\,dO\,V^\top - D_r)$.
    Work item = (b, query head h, key split). Outputs, all *unscaled by s* and per query head:
    ``dq_part`` (nsplit,R,B,H,N,d) $\sum_j dS^0 K$ (float64: it accumulates over all key tiles),
    ``dk_part`` (R,B,H,M,d) $dS^{0\top} Q$,
    ``dv_part`` (B,H,M,dv) $\sum_r w_r P_r^\top dO$. The caller sums the splits and the heads of
    each kv group in a fixed order and multiplies by ``s``.
    """
    R, B, H, N, d = q.shape
    M = k.shape[3]
    dv = v.shape[3]
    nkt = (M + bk - 1) // bk
    tiles_per_split = (nkt + nsplit - 1) // nsplit
    ntask = B * H * nsplit
    fast = q.itemsize == 4  # float32: vectorised exp
    for t in prange(ntask):
        b = t // (H * nsplit)
        h = (t // nsplit) % H
        sp = t % nsplit
        hk = kvmap[h]
        s = np.empty((bq, bk), dtype=q.dtype)
        th = np.empty((bq, bk), dtype=q.dtype)
        dp = np.empty((bq, bk), dtype=q.dtype)
        e2 = np.empty(bk, dtype=q.dtype)
        e2i = e2.view(np.int32)
        kt = np.empty((d, bk), dtype=q.dtype)
        vt = np.empty((dv, bk), dtype=q.dtype)
        dka = np.empty((bk, d), dtype=np.float64)
        dva = np.empty((bk, dv), dtype=np.float64)
        # per-query-tile partials in the input dtype (full SIMD width), added to the float64
        # accumulators once per tile: short sums in float32, the long sums over N in float64
        dkt = np.empty((bk, d), dtype=q.dtype)
        dvt = np.empty((bk, dv), dtype=q.dtype)
        dqt = np.empty((bq, d), dtype=q.dtype)
        dobh = dout[b, h]
        for kt_i in range(sp * tiles_per_split, min(nkt, (sp + 1) * tiles_per_split)):
            j0 = kt_i * bk
            nk = min(bk, M - j0)
            for jj in range(nk):
                for c in range(dv):
                    vt[c, jj] = v[b, hk, j0 + jj, c]
                    dva[jj, c] = 0.0
            i_start = 0
            if causal:
                i_start = max(0, j0 - offset)  # first query that sees key j0
            for r in range(R):
                qbh = q[r, b, h]
                kbh = k[r, b, hk]
                dqbh = dq_part[sp, r, b, h]
                for jj in range(nk):
                    for c in range(d):
                        kt[c, jj] = kbh[j0 + jj, c]
                        dka[jj, c] = 0.0
                for i0 in range(i_start - i_start % bq, N, bq):
                    nq = min(bq, N - i0)
                    _mm_abt(s, qbh, i0, nq, kt, 0, nk, d)  # S = Q K^T
                    _mm_abt(dp, dobh, i0, nq, vt, 0, nk, dv)  # dP = dO V^T
                    for ii in range(nq):
                        i = i0 + ii
                        L = lse[r, b, h, i]
                        if L == -np.inf:
                            for jj in range(nk):
                                s[ii, jj] = 0.0
                                dp[ii, jj] = 0.0
                            continue
                        D = delta[r, b, h, i]
                        wr = w[r, b, h, i]
                        _logits_row(s, th, ii, b, h, i, j0, nk, scale, softcap, causal, offset,
                                    mask_mode, maskb, maskf, ms)
                        _exp_row(s, ii, nk, L, e2, e2i, fast)
                        for jj in range(nk):
                            pw = s[ii, jj]
                            dp[ii, jj] = pw * (wr * dp[ii, jj] - D)
                            s[ii, jj] = wr * pw  # w P, the dV weight
                        if softcap > 0.0:
                            for jj in range(nk):
                                tt = th[ii, jj]
                                dp[ii, jj] = dp[ii, jj] * (1.0 - tt * tt)
                    dvt[:nk, :] = 0.0
                    dkt[:nk, :] = 0.0
                    dqt[:nq, :] = 0.0
                    _acc_ptb(dvt, s, nk, nq, dobh, i0, dv)  # dV += (w P)^T dO
                    _acc_ptb(dkt, dp, nk, nq, qbh, i0, d)  # dK += dS^T Q
                    _acc_pb(dqt, 0, dp, nq, nk, kbh, j0, d)  # dQ += dS K
                    for jj in range(nk):
                        for c in range(dv):
                            dva[jj, c] += dvt[jj, c]
                        for c in range(d):
                            dka[jj, c] += dkt[jj, c]
                    for ii in range(nq):
                        for c in range(d):
                            dqbh[i0 + ii, c] += dqt[ii, c]
                for jj in range(nk):
                    for c in range(d):
                        dk_part[r, b, h, j0 + jj, c] = dka[jj, c]
            for jj in range(nk):
                for c in range(dv):
                    dv_part[b, h, j0 + jj, c] = dva[jj, c]
