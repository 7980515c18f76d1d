r"""numba.cuda kernels of the fused softmax attention (shared by ``flash`` and ``differential``).

The CUDA twin of :mod:`refattn.kernels.cpu._attention`: one forward and a two-kernel backward that
compute a weighted sum of ``R`` softmax-attention maps sharing the values,

$$O = \sum_{r<R} w_{r}\,\mathrm{softmax}\big(T(s\,Q_r K_r^\top) + M\big)\,V,$$

``R = 1, w = 1`` for SDPA and ``R = 2, w = (1, -\lambda)`` for differential attention.

Only shared memory and ``cuda.syncthreads()`` are used (no warp shuffles, no atomics), so the
kernels run under the CUDA simulator and every sum has a fixed order: results are bit-identical
from run to run.

Thread layout. A block of ``(TX, BQ)`` threads owns a tile of ``BQ`` query rows (forward, dQ) or
of ``BK`` key rows (dK/dV); the ``TX`` threads of a row split the output columns (column
``c = t + u*TX``) and the score columns of a tile (``jj = t + u*TX``). Row statistics (max, sum)
are computed redundantly by the ``TX`` threads of a row from shared memory, which needs no
reduction between threads.

* forward: grid ``(B*H, ceil(N/BQ))``; online softmax over key tiles, writes ``out``, the per-map
  normalised outputs ``omap`` (R > 1 only) and ``lse``;
* backward dK/dV: grid ``(B*Hkv, ceil(M/BK))``; a block holds one key tile and loops over the
  query heads of its kv group (fixed order, so GQA needs no reduction afterwards) and over the
  query tiles, recomputing $P$ from the LSE (FlashAttention-2);
* backward dQ: grid ``(B*H, ceil(N/BQ))``; recomputes $P$ and $dS$ per key tile. Splitting dQ
  from dK/dV replaces FlashAttention-2's atomic dQ accumulation by recomputation (deterministic,
  $O(Nd)$ memory);
* precision (as the CPU kernels): each query tile's (key tile's) contribution to dK, dV (dQ) is
  summed in the input dtype and added to float64 accumulators, so the long sums over N are float64;
  the recomputed P, dP, dS stay in the input dtype.

Kernels are built per (dtype, R, tile sizes, d, dv, TX) because shared and local array shapes must
be compile-time constants; they are cached. Shared 2-D tiles have one padding column against bank
conflicts.
"""

from __future__ import annotations

import math
from functools import cache

import numpy as np

from ._device import cuda

__all__ = ["smem_fwd", "smem_bwd_kv", "smem_bwd_q", "get_fwd", "get_bwd_kv", "get_bwd_q", "get_delta",
           "get_lin_fwd", "get_lin_bwd", "smem_lin"]


def _nbt(dtype):
    import numba

    return numba.float64 if np.dtype(dtype) == np.float64 else numba.float32


# ------------------------------------------------------------------------------ shared-memory sizes


def smem_fwd(R, BQ, BK, D, DV, isz):
    return isz * (R * BQ * (D + 1) + R * BK * (D + 1) + BK * (DV + 1) + R * BQ * (BK + 1))


def smem_bwd_kv(R, BQ, BK, D, DV, isz):
    return isz * (R * BK * (D + 1) + BK * (DV + 1) + R * BQ * (D + 1) + BQ * (DV + 1) + 3 * R * BQ
                  + 2 * R * BQ * (BK + 1))


def smem_bwd_q(R, BQ, BK, D, DV, isz):
    return isz * (R * BQ * (D + 1) + BQ * (DV + 1) + R * BK * (D + 1) + BK * (DV + 1) + R * BQ * (BK + 1))


def smem_lin(T, D, DV, isz):
    return isz * (2 * T * (D + 1) + 3 * T * (DV + 1) + T)


# ------------------------------------------------------------------------------ device functions


@cache
def _logit_fn(dtype_name):
    nbt = _nbt(dtype_name)

    @cuda.jit(device=True)
    def logit(x, b, h, i, j, scale, softcap, causal, offset, mask_mode, maskb, maskf, ms):
        """Raw dot product -> final logit: scale, softcap (tanh returned), mask, causal."""
        th = nbt(0.0)
        x = x * scale
        if softcap > 0:
            th = math.tanh(x / softcap)
            x = softcap * th
        if mask_mode == 1:
            if maskb[b * ms[0] + h * ms[1] + i * ms[2] + j * ms[3]] == 0:
                x = nbt(-math.inf)
        elif mask_mode == 2:
            x = x + maskf[b * ms[0] + h * ms[1] + i * ms[2] + j * ms[3]]
        if causal != 0 and j > i + offset:
            x = nbt(-math.inf)
        return x, th

    return logit


# ------------------------------------------------------------------------------ forward


@cache
def get_fwd(dtype_name, R, BQ, BK, D, DV, TX):
    nbt = _nbt(dtype_name)
    f64 = _nbt("float64")
    logit = _logit_fn(dtype_name)
    DVP = -(-DV // TX)
    KP = -(-BK // TX)
    NT = BQ * TX
    D1, DV1, BK1 = D + 1, DV + 1, BK + 1

    @cuda.jit
    def fwd(q, k, v, w, kvmap, mask_mode, maskb, maskf, ms, scale, softcap, causal, offset, out, omap, lse):
        # q (R,B,H,N,D), k (R,B,Hkv,M,D), v (B,Hkv,M,DV), w (R,B,H,N), out (B,H,N,DV),
        # omap (R,B,H,N,DV) (written when R > 1), lse (R,B,H,N)
        Qs = cuda.shared.array((R, BQ, D1), nbt)
        Ks = cuda.shared.array((R, BK, D1), nbt)
        Vs = cuda.shared.array((BK, DV1), nbt)
        Ss = cuda.shared.array((R, BQ, BK1), nbt)
        acc = cuda.local.array((R, DVP), nbt)
        xs = cuda.local.array(KP, nbt)
        mrow = cuda.local.array(R, nbt)
        lrow = cuda.local.array(R, f64)  # softmax denominators in float64 (as the CPU kernels)
        zero = nbt(0.0)
        ninf = nbt(-math.inf)
        t = cuda.threadIdx.x
        ii = cuda.threadIdx.y
        tid = ii * TX + t
        H = q.shape[2]
        N = q.shape[3]
        M = k.shape[3]
        bh = cuda.blockIdx.x
        b = bh // H
        h = bh - b * H
        hk = kvmap[h]
        i0 = cuda.blockIdx.y * BQ
        nq = min(BQ, N - i0)
        i = i0 + ii
        for r in range(R):
            mrow[r] = ninf
            lrow[r] = 0.0
            for u in range(DVP):
                acc[r, u] = zero
        for e in range(tid, R * BQ * D, NT):
            r = e // (BQ * D)
            a = (e // D) % BQ
            c = e % D
            if a < nq:
                Qs[r, a, c] = q[r, b, h, i0 + a, c]
            else:
                Qs[r, a, c] = zero
        jend = M
        if causal != 0:
            jend = min(M, i0 + nq + offset)
        ntile = 0
        if jend > 0:
            ntile = (jend + BK - 1) // BK
        for kt in range(ntile):
            j0 = kt * BK
            nk = min(BK, jend - j0)
            cuda.syncthreads()
            for e in range(tid, R * BK * D, NT):
                r = e // (BK * D)
                a = (e // D) % BK
                c = e % D
                if a < nk:
                    Ks[r, a, c] = k[r, b, hk, j0 + a, c]
            for e in range(tid, BK * DV, NT):
                a = e // DV
                c = e % DV
                if a < nk:
                    Vs[a, c] = v[b, hk, j0 + a, c]
            cuda.syncthreads()
            for r in range(R):
                # register tile: this thread's KP scores share each load of Q[ii, c]
                for u in range(KP):
                    xs[u] = zero
                for c in range(D):
                    qc = Qs[r, ii, c]
                    for u in range(KP):
                        jj = t + u * TX
                        if jj < nk:
                            xs[u] += qc * Ks[r, jj, c]
                for u in range(KP):
                    jj = t + u * TX
                    if jj < nk:
                        x = xs[u]
                        if ii < nq:
                            x, th = logit(x, b, h, i, j0 + jj, scale, softcap, causal, offset,
                                          mask_mode, maskb, maskf, ms)
                        else:
                            x = ninf
                        Ss[r, ii, jj] = x
            cuda.syncthreads()
            if ii < nq:
                for r in range(R):
                    mt = ninf
                    for jj in range(nk):
                        mt = max(mt, Ss[r, ii, jj])
                    m_old = mrow[r]
                    m_new = max(m_old, mt)
                    if m_new > ninf:
                        alpha = math.exp(m_old - m_new)  # 0 while nothing was visible
                        mrow[r] = m_new
                        for u in range(DVP):
                            acc[r, u] *= alpha
                        ls = f64(0.0)
                        for jj in range(nk):
                            p = math.exp(Ss[r, ii, jj] - m_new)
                            ls += f64(p)
                            for u in range(DVP):
                                c = t + u * TX
                                if c < DV:
                                    acc[r, u] += p * Vs[jj, c]
                        lrow[r] = lrow[r] * f64(alpha) + ls
        if ii < nq:
            for r in range(R):
                l_ = lrow[r]
                inv = f64(0.0)
                if l_ > 0.0:
                    inv = 1.0 / l_
                    if t == 0:
                        lse[r, b, h, i] = nbt(f64(mrow[r]) + math.log(l_))
                elif t == 0:
                    lse[r, b, h, i] = ninf
                for u in range(DVP):
                    c = t + u * TX
                    o = nbt(f64(acc[r, u]) * inv)
                    acc[r, u] = o
                    if R > 1 and c < DV:
                        omap[r, b, h, i, c] = o
            for u in range(DVP):
                c = t + u * TX
                if c < DV:
                    o = w[0, b, h, i] * acc[0, u]
                    for r in range(1, R):
                        o += w[r, b, h, i] * acc[r, u]
                    out[b, h, i, c] = o

    return fwd


# ------------------------------------------------------------------------------ backward dK, dV


@cache
def get_bwd_kv(dtype_name, R, BQ, BK, D, DV, TX):
    nbt = _nbt(dtype_name)
    f64 = _nbt("float64")
    logit = _logit_fn(dtype_name)
    DP = -(-D // TX)
    DVP = -(-DV // TX)
    IP = -(-BQ // TX)
    NT = BK * TX
    D1, DV1, BK1 = D + 1, DV + 1, BK + 1

    @cuda.jit
    def bwd_kv(q, k, v, w, heads, mask_mode, maskb, maskf, ms, scale, softcap, causal, offset,
               dout, lse, delta, dk, dv):
        # heads (Hkv, G): the query heads of each kv head in a fixed order.
        # dk (R,B,Hkv,M,D) (scaled by s), dv (B,Hkv,M,DV); delta (R,B,H,N) = w*rowsum(dO*O_r) - dL
        Ks = cuda.shared.array((R, BK, D1), nbt)
        Vs = cuda.shared.array((BK, DV1), nbt)
        Qs = cuda.shared.array((R, BQ, D1), nbt)
        Gs = cuda.shared.array((BQ, DV1), nbt)
        Ls = cuda.shared.array((R, BQ), nbt)
        Dls = cuda.shared.array((R, BQ), nbt)
        Ws = cuda.shared.array((R, BQ), nbt)
        Ps = cuda.shared.array((R, BQ, BK1), nbt)
        dSs = cuda.shared.array((R, BQ, BK1), nbt)
        dka = cuda.local.array((R, DP), f64)  # long sums over all queries: float64
        dva = cuda.local.array(DVP, f64)
        dkt = cuda.local.array((R, DP), nbt)  # one query tile's contribution, input dtype
        dvt = cuda.local.array(DVP, nbt)
        xs = cuda.local.array(IP, nbt)
        dps = cuda.local.array(IP, nbt)
        zero = nbt(0.0)
        one = nbt(1.0)
        ninf = nbt(-math.inf)
        t = cuda.threadIdx.x
        jj = cuda.threadIdx.y
        tid = jj * TX + t
        Hkv = k.shape[2]
        N = q.shape[3]
        M = k.shape[3]
        G = heads.shape[1]
        bh = cuda.blockIdx.x
        b = bh // Hkv
        hk = bh - b * Hkv
        j0 = cuda.blockIdx.y * BK
        nk = min(BK, M - j0)
        j = j0 + jj
        for e in range(tid, R * BK * D, NT):
            r = e // (BK * D)
            a = (e // D) % BK
            c = e % D
            if a < nk:
                Ks[r, a, c] = k[r, b, hk, j0 + a, c]
            else:
                Ks[r, a, c] = zero
        for e in range(tid, BK * DV, NT):
            a = e // DV
            c = e % DV
            if a < nk:
                Vs[a, c] = v[b, hk, j0 + a, c]
            else:
                Vs[a, c] = zero
        for r in range(R):
            for u in range(DP):
                dka[r, u] = 0.0
        for u in range(DVP):
            dva[u] = 0.0
        i_start = 0
        if causal != 0:
            i_start = max(0, j0 - offset)  # first query that sees key j0
        i_first = (i_start // BQ) * BQ
        for g in range(G):
            h = heads[hk, g]
            for i0 in range(i_first, N, BQ):
                nq = min(BQ, N - i0)
                cuda.syncthreads()
                for e in range(tid, R * BQ * D, NT):
                    r = e // (BQ * D)
                    a = (e // D) % BQ
                    c = e % D
                    if a < nq:
                        Qs[r, a, c] = q[r, b, h, i0 + a, c]
                    else:
                        Qs[r, a, c] = zero
                for e in range(tid, BQ * DV, NT):
                    a = e // DV
                    c = e % DV
                    if a < nq:
                        Gs[a, c] = dout[b, h, i0 + a, c]
                    else:
                        Gs[a, c] = zero
                for e in range(tid, R * BQ, NT):
                    r = e // BQ
                    a = e % BQ
                    if a < nq:
                        Ls[r, a] = lse[r, b, h, i0 + a]
                        Dls[r, a] = delta[r, b, h, i0 + a]
                        Ws[r, a] = w[r, b, h, i0 + a]
                    else:
                        Ls[r, a] = ninf
                        Dls[r, a] = zero
                        Ws[r, a] = zero
                cuda.syncthreads()
                # register tiles over this thread's IP query rows ii = t + u*TX: each load of
                # V[jj, c] / K[jj, c] serves IP products
                for u in range(IP):
                    dps[u] = zero
                if jj < nk:
                    for c in range(DV):
                        vc = Vs[jj, c]
                        for u in range(IP):
                            ii = t + u * TX
                            if ii < nq:
                                dps[u] += Gs[ii, c] * vc
                for r in range(R):
                    for u in range(IP):
                        xs[u] = zero
                    if jj < nk:
                        for c in range(D):
                            kc = Ks[r, jj, c]
                            for u in range(IP):
                                ii = t + u * TX
                                if ii < nq:
                                    xs[u] += Qs[r, ii, c] * kc
                    for u in range(IP):
                        ii = t + u * TX
                        if ii < BQ:
                            p = zero
                            ds = zero
                            L = Ls[r, ii]
                            if jj < nk and L > ninf:
                                x, th = logit(xs[u], b, h, i0 + ii, j, scale, softcap, causal, offset,
                                              mask_mode, maskb, maskf, ms)
                                p = math.exp(x - L)
                                ds = p * (Ws[r, ii] * dps[u] - Dls[r, ii])
                                if softcap > 0:
                                    ds = ds * (one - th * th)
                            Ps[r, ii, jj] = p
                            dSs[r, ii, jj] = ds
                cuda.syncthreads()
                if jj < nk:
                    for r in range(R):
                        for u in range(DP):
                            dkt[r, u] = zero
                    for u in range(DVP):
                        dvt[u] = zero
                    for ii in range(nq):
                        for r in range(R):
                            a = Ws[r, ii] * Ps[r, ii, jj]
                            gs = dSs[r, ii, jj]
                            for u in range(DVP):
                                c = t + u * TX
                                if c < DV:
                                    dvt[u] += a * Gs[ii, c]
                            for u in range(DP):
                                c = t + u * TX
                                if c < D:
                                    dkt[r, u] += gs * Qs[r, ii, c]
                    for r in range(R):
                        for u in range(DP):
                            dka[r, u] += f64(dkt[r, u])
                    for u in range(DVP):
                        dva[u] += f64(dvt[u])
        if jj < nk:
            for r in range(R):
                for u in range(DP):
                    c = t + u * TX
                    if c < D:
                        dk[r, b, hk, j, c] = nbt(dka[r, u] * f64(scale))
            for u in range(DVP):
                c = t + u * TX
                if c < DV:
                    dv[b, hk, j, c] = nbt(dva[u])

    return bwd_kv


# ------------------------------------------------------------------------------ backward dQ


@cache
def get_bwd_q(dtype_name, R, BQ, BK, D, DV, TX):
    nbt = _nbt(dtype_name)
    f64 = _nbt("float64")
    logit = _logit_fn(dtype_name)
    DP = -(-D // TX)
    KP = -(-BK // TX)
    NT = BQ * TX
    D1, DV1, BK1 = D + 1, DV + 1, BK + 1

    @cuda.jit
    def bwd_q(q, k, v, w, kvmap, mask_mode, maskb, maskf, ms, scale, softcap, causal, offset,
              dout, lse, delta, dq):
        # dq (R,B,H,N,D), scaled by s
        Qs = cuda.shared.array((R, BQ, D1), nbt)
        Gs = cuda.shared.array((BQ, DV1), nbt)
        Ks = cuda.shared.array((R, BK, D1), nbt)
        Vs = cuda.shared.array((BK, DV1), nbt)
        dSs = cuda.shared.array((R, BQ, BK1), nbt)
        dqa = cuda.local.array((R, DP), f64)  # long sum over all keys: float64
        dqt = cuda.local.array((R, DP), nbt)  # one key tile's contribution, input dtype
        xs = cuda.local.array(KP, nbt)
        dps = cuda.local.array(KP, nbt)
        Lr = cuda.local.array(R, nbt)
        Dr = cuda.local.array(R, nbt)
        Wr = cuda.local.array(R, nbt)
        zero = nbt(0.0)
        one = nbt(1.0)
        ninf = nbt(-math.inf)
        t = cuda.threadIdx.x
        ii = cuda.threadIdx.y
        tid = ii * TX + t
        H = q.shape[2]
        N = q.shape[3]
        M = k.shape[3]
        bh = cuda.blockIdx.x
        b = bh // H
        h = bh - b * H
        hk = kvmap[h]
        i0 = cuda.blockIdx.y * BQ
        nq = min(BQ, N - i0)
        i = i0 + ii
        for e in range(tid, R * BQ * D, NT):
            r = e // (BQ * D)
            a = (e // D) % BQ
            c = e % D
            if a < nq:
                Qs[r, a, c] = q[r, b, h, i0 + a, c]
            else:
                Qs[r, a, c] = zero
        for e in range(tid, BQ * DV, NT):
            a = e // DV
            c = e % DV
            if a < nq:
                Gs[a, c] = dout[b, h, i0 + a, c]
            else:
                Gs[a, c] = zero
        for r in range(R):
            for u in range(DP):
                dqa[r, u] = 0.0
            if ii < nq:
                Lr[r] = lse[r, b, h, i]
                Dr[r] = delta[r, b, h, i]
                Wr[r] = w[r, b, h, i]
            else:
                Lr[r] = ninf
                Dr[r] = zero
                Wr[r] = zero
        jend = M
        if causal != 0:
            jend = min(M, i0 + nq + offset)
        ntile = 0
        if jend > 0:
            ntile = (jend + BK - 1) // BK
        for kt in range(ntile):
            j0 = kt * BK
            nk = min(BK, jend - j0)
            cuda.syncthreads()
            for e in range(tid, R * BK * D, NT):
                r = e // (BK * D)
                a = (e // D) % BK
                c = e % D
                if a < nk:
                    Ks[r, a, c] = k[r, b, hk, j0 + a, c]
            for e in range(tid, BK * DV, NT):
                a = e // DV
                c = e % DV
                if a < nk:
                    Vs[a, c] = v[b, hk, j0 + a, c]
            cuda.syncthreads()
            # register tiles over this thread's KP keys jj = t + u*TX: each load of dO[ii, c] /
            # Q[ii, c] serves KP products
            for u in range(KP):
                dps[u] = zero
            if ii < nq:
                for c in range(DV):
                    gc = Gs[ii, c]
                    for u in range(KP):
                        jj = t + u * TX
                        if jj < nk:
                            dps[u] += gc * Vs[jj, c]
            for r in range(R):
                L = Lr[r]
                for u in range(KP):
                    xs[u] = zero
                if L > ninf:
                    for c in range(D):
                        qc = Qs[r, ii, c]
                        for u in range(KP):
                            jj = t + u * TX
                            if jj < nk:
                                xs[u] += qc * Ks[r, jj, c]
                for u in range(KP):
                    jj = t + u * TX
                    if jj < nk:
                        ds = zero
                        if L > ninf:
                            x, th = logit(xs[u], b, h, i, j0 + jj, scale, softcap, causal, offset,
                                          mask_mode, maskb, maskf, ms)
                            p = math.exp(x - L)
                            ds = p * (Wr[r] * dps[u] - Dr[r])
                            if softcap > 0:
                                ds = ds * (one - th * th)
                        dSs[r, ii, jj] = ds
            cuda.syncthreads()
            if ii < nq:
                for r in range(R):
                    for u in range(DP):
                        dqt[r, u] = zero
                for jj in range(nk):
                    for r in range(R):
                        gs = dSs[r, ii, jj]
                        for u in range(DP):
                            c = t + u * TX
                            if c < D:
                                dqt[r, u] += gs * Ks[r, jj, c]
                for r in range(R):
                    for u in range(DP):
                        dqa[r, u] += f64(dqt[r, u])
        if ii < nq:
            for r in range(R):
                for u in range(DP):
                    c = t + u * TX
                    if c < D:
                        dq[r, b, h, i, c] = nbt(dqa[r, u] * f64(scale))

    return bwd_q


# ------------------------------------------------------------------------------ D = w*rowsum(dO*O) - dL


@cache
def get_delta(dtype_name):
    nbt = _nbt(dtype_name)
    f64 = _nbt("float64")

    @cuda.jit
    def delta_kernel(g, omap, w, dlse, has_dlse, rs, delta):
        # g (P, DV), omap (R, P, DV), w (R, P), dlse (P,), rs (R, P) = rowsum(g*O_r),
        # delta (R, P) = w*rs - dlse
        x = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
        R = omap.shape[0]
        P = omap.shape[1]
        DV = omap.shape[2]
        if x < R * P:
            r = x // P
            p = x - r * P
            s = 0.0  # float64 row sum
            for c in range(DV):
                s += f64(g[p, c]) * f64(omap[r, p, c])
            rs[r, p] = nbt(s)
            dd = f64(w[r, p]) * s
            if has_dlse != 0:
                dd = dd - f64(dlse[p])
            delta[r, p] = nbt(dd)

    return delta_kernel


# ------------------------------------------------------------------------------ causal linear attention


@cache
def _phi_fns(dtype_name):
    nbt = _nbt(dtype_name)

    @cuda.jit(device=True)
    def phi(x, fm):
        if fm == 0:
            return x
        if x > 0:
            return x + nbt(1.0)
        return math.exp(x)

    @cuda.jit(device=True)
    def dphi(x, fm):
        if fm == 0 or x > 0:
            return nbt(1.0)
        return math.exp(x)

    return phi, dphi


@cache
def get_lin_fwd(dtype_name, T, D, DV):
    nbt = _nbt(dtype_name)
    f64 = _nbt("float64")
    phi, _ = _phi_fns(dtype_name)
    NT = max(D, DV)
    D1, DV1 = D + 1, DV + 1

    @cuda.jit
    def lin_fwd(q, k, v, fm, eps, out, den):
        # q, k (B,N,D), v (B,N,DV); out (B,N,DV), den (B,N). Thread e owns column S[:, e].
        FQ = cuda.shared.array((T, D1), nbt)
        FK = cuda.shared.array((T, D1), nbt)
        Vt = cuda.shared.array((T, DV1), nbt)
        Scol = cuda.local.array(D, nbt)
        z = cuda.local.array(D, nbt)
        zero = nbt(0.0)
        e = cuda.threadIdx.x
        b = cuda.blockIdx.x
        N = q.shape[1]
        for c in range(D):
            Scol[c] = zero
            z[c] = zero
        for i0 in range(0, N, T):
            nt = min(T, N - i0)
            cuda.syncthreads()
            for x in range(e, T * D, NT):
                a = x // D
                c = x % D
                if a < nt:
                    FQ[a, c] = phi(q[b, i0 + a, c], fm)
                    FK[a, c] = phi(k[b, i0 + a, c], fm)
            for x in range(e, T * DV, NT):
                a = x // DV
                c = x % DV
                if a < nt:
                    Vt[a, c] = v[b, i0 + a, c]
            cuda.syncthreads()
            for a in range(nt):
                ve = zero
                if e < DV:
                    ve = Vt[a, e]
                num = zero
                dd = f64(0.0)  # denominators in float64, as the CPU scan
                for c in range(D):
                    fk = FK[a, c]
                    z[c] += fk
                    Scol[c] += fk * ve
                    fq = FQ[a, c]
                    num += fq * Scol[c]
                    dd += f64(fq * z[c])
                dd += f64(eps)
                if e < DV:
                    out[b, i0 + a, e] = nbt(f64(num) / dd)
                if e == 0:
                    den[b, i0 + a] = nbt(dd)

    return lin_fwd


@cache
def get_lin_bwd(dtype_name, T, D, DV):
    nbt = _nbt(dtype_name)
    f64 = _nbt("float64")
    phi, dphi = _phi_fns(dtype_name)
    NT = max(D, DV)
    D1, DV1 = D + 1, DV + 1

    @cuda.jit
    def lin_bwd(q, k, v, fm, g, out, den, dq, dk, dv):
        # Pass 1 (forward, thread c < D owns row S[c, :] and z[c]): dphi(q_i)[c].
        # Pass 2 (reverse): thread c < D owns R[c, :], r[c] -> dphi(k_j)[c];
        #                   thread e < DV owns R[:, e]        -> dv_j[e].
        FQ = cuda.shared.array((T, D1), nbt)
        FK = cuda.shared.array((T, D1), nbt)
        Vt = cuda.shared.array((T, DV1), nbt)
        Gt = cuda.shared.array((T, DV1), nbt)
        Ot = cuda.shared.array((T, DV1), nbt)
        Dn = cuda.shared.array(T, nbt)
        Srow = cuda.local.array(DV, nbt)
        Rcol = cuda.local.array(D, nbt)
        zero = nbt(0.0)
        t = cuda.threadIdx.x
        b = cuda.blockIdx.x
        N = q.shape[1]
        for e in range(DV):
            Srow[e] = zero
        for c in range(D):
            Rcol[c] = zero
        zc = zero
        ntile = (N + T - 1) // T
        for it in range(ntile):
            i0 = it * T
            nt = min(T, N - i0)
            cuda.syncthreads()
            for x in range(t, T * D, NT):
                a = x // D
                c = x % D
                if a < nt:
                    FK[a, c] = phi(k[b, i0 + a, c], fm)
            for x in range(t, T * DV, NT):
                a = x // DV
                c = x % DV
                if a < nt:
                    Vt[a, c] = v[b, i0 + a, c]
                    Gt[a, c] = g[b, i0 + a, c]
                    Ot[a, c] = out[b, i0 + a, c]
            for a in range(t, nt, NT):
                Dn[a] = den[b, i0 + a]
            cuda.syncthreads()
            for a in range(nt):
                di = Dn[a]
                go = f64(0.0)
                for e in range(DV):
                    go += f64(Gt[a, e] * Ot[a, e])
                ci = -go / f64(di)
                if t < D:
                    fk = FK[a, t]
                    zc += fk
                    acc = f64(0.0)
                    for e in range(DV):
                        Srow[e] += fk * Vt[a, e]
                        acc += f64(Srow[e] * (Gt[a, e] / di))
                    xq = q[b, i0 + a, t]
                    dq[b, i0 + a, t] = nbt(acc + ci * f64(zc)) * dphi(xq, fm)
        for e in range(DV):
            Srow[e] = zero  # reused as R[c, :]
        rc = zero
        for it in range(ntile - 1, -1, -1):
            i0 = it * T
            nt = min(T, N - i0)
            cuda.syncthreads()
            for x in range(t, T * D, NT):
                a = x // D
                c = x % D
                if a < nt:
                    FQ[a, c] = phi(q[b, i0 + a, c], fm)
                    FK[a, c] = phi(k[b, i0 + a, c], fm)
            for x in range(t, T * DV, NT):
                a = x // DV
                c = x % DV
                if a < nt:
                    Vt[a, c] = v[b, i0 + a, c]
                    Gt[a, c] = g[b, i0 + a, c]
                    Ot[a, c] = out[b, i0 + a, c]
            for a in range(t, nt, NT):
                Dn[a] = den[b, i0 + a]
            cuda.syncthreads()
            for a in range(nt - 1, -1, -1):
                dj = Dn[a]
                if t < D:
                    go = f64(0.0)
                    for e in range(DV):
                        go += f64(Gt[a, e] * Ot[a, e])
                    cj = -go / f64(dj)
                    fq = FQ[a, t]
                    acc = f64(0.0)
                    for e in range(DV):
                        Srow[e] += fq * (Gt[a, e] / dj)
                        acc += f64(Srow[e] * Vt[a, e])
                    rc = nbt(f64(rc) + cj * f64(fq))
                    xk = k[b, i0 + a, t]
                    dk[b, i0 + a, t] = nbt(acc + f64(rc)) * dphi(xk, fm)
                if t < DV:
                    ue = Gt[a, t] / dj
                    acc2 = zero
                    for c in range(D):
                        Rcol[c] += FQ[a, c] * ue
                        acc2 += FK[a, c] * Rcol[c]
                    dv[b, i0 + a, t] = acc2

    return lin_bwd
