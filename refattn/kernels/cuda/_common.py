"""Python side of the CUDA attention kernels: tile planning, device buffers and the launches.

Argument validation is the CPU kernels' own (:mod:`refattn.kernels.cpu._common` and the CPU
wrappers' validators), so both backends accept and reject exactly the same arguments with the same
messages. Device arrays are validated through zero-stride shape proxies (no copy to the host).
"""

from __future__ import annotations

import numpy as np

from ..._checks import check_int
from . import _attention as _k
from ._device import cuda, is_device_array, shape_proxy, to_device

SMEM_LIMIT = 48 * 1024  # static shared memory per block
MAX_THREADS = 256  # threads per block: 255 registers x 256 threads fit any SM's 64K registers
# Preference order of the automatic (block_q, block_k) choice.
_AUTO_TILES = ((64, 64), (64, 32), (32, 32), (32, 16), (16, 16), (16, 8), (8, 8), (8, 4), (4, 4), (2, 2), (1, 1))


def threads_per_row() -> int:
    """Threads sharing one query/key row (``TX``): fewer under the simulator, where every thread is a
    Python thread."""
    from ._device import simulator_enabled

    return 2 if simulator_enabled() else 4


def proxy(x):
    """``x`` itself for host input, a shape/dtype proxy for a device array."""
    return shape_proxy(x) if is_device_array(x) else x


def check_block(value, name):
    if value is None:
        return None
    return check_int(value, name, minimum=1)


def plan_tiles(R, d, dv, dtype, block_q, block_k, tx, n=None, m=None):
    """Tile sizes ``{"fwd": (BQ, BK), "bwd_kv": ..., "bwd_q": ...}`` that fit the shared memory.

    Explicit ``block_q``/``block_k`` are used for every kernel (``ValueError`` if they do not fit);
    ``None`` picks the largest power-of-two tiles from 64 down that fit, per kernel.
    """
    from ._device import simulator_enabled

    # Under the simulator every thread is a Python thread: tiles larger than the problem only cost
    # time. On a GPU the tiles do not depend on N, M, so fewer kernel variants are compiled.
    clamp = simulator_enabled()
    isz = np.dtype(dtype).itemsize
    kernels = {"fwd": (_k.smem_fwd, "q"), "bwd_kv": (_k.smem_bwd_kv, "k"), "bwd_q": (_k.smem_bwd_q, "q")}
    plan = {}
    for name, (smem, rows) in kernels.items():
        if block_q is not None or block_k is not None:
            bq = block_q if block_q is not None else 32
            bk = block_k if block_k is not None else 32
            need = smem(R, bq, bk, d, dv, isz)
            nthreads = (bq if rows == "q" else bk) * tx
            if need > SMEM_LIMIT or nthreads > MAX_THREADS:
                raise ValueError(
                    f"block_q={bq}, block_k={bk} do not fit the CUDA {name} kernel for d={d}, dv={dv}, "
                    f"{np.dtype(dtype).name}: {need} bytes of shared memory (limit {SMEM_LIMIT}) and "
                    f"{nthreads} threads (limit {MAX_THREADS}); use smaller tiles or block_q=block_k=None")
            plan[name] = (bq, bk)
            continue
        best = None
        for bq, bk in _AUTO_TILES:
            if clamp:  # simulator: never larger than the problem (rounded up to a power of two)
                bq = min(bq, _pow2(n)) if n else bq
                bk = min(bk, _pow2(m)) if m else bk
            rows_n = bq if rows == "q" else bk
            if smem(R, bq, bk, d, dv, isz) <= SMEM_LIMIT and rows_n * tx <= MAX_THREADS:
                best = (bq, bk)
                break
        if best is None:
            raise ValueError(f"head widths d={d}, dv={dv} are too large for the CUDA kernels' shared-memory tiles")
        plan[name] = best
    return plan


def _pow2(x: int) -> int:
    return 1 << max(0, int(x) - 1).bit_length()


_CONST: dict = {}


def const_device(key, build):
    """A small read-only device array, built once per ``key`` (GQA tables, unit weights, the dummy
    mask buffers): saves a host-to-device copy per call."""
    arr = _CONST.get(key)
    if arr is None:
        if len(_CONST) > 64:
            _CONST.clear()
        arr = _CONST[key] = cuda.to_device(np.ascontiguousarray(build()))
    return arr


def mask_device(mask_tuple, dt):
    """CPU-style mask buffers -> device buffers (bool as uint8)."""
    mode, mb, mf, ms = mask_tuple
    dt = np.dtype(dt)
    if mode == 0:
        return (0, const_device(("mb0",), lambda: np.ones(1, np.uint8)),
                const_device(("mf0", dt.name), lambda: np.zeros(1, dt)),
                const_device(("ms0",), lambda: np.zeros(4, np.int64)))
    return (mode, cuda.to_device(np.ascontiguousarray(mb, dtype=np.uint8)),
            cuda.to_device(np.ascontiguousarray(mf, dtype=dt)), cuda.to_device(np.ascontiguousarray(ms, dtype=np.int64)))


def as4(x, dt):
    """``(..., H, N, e)`` host or device -> C-contiguous device ``(B, H, N, e)`` of dtype ``dt``."""
    shape4 = (int(np.prod(x.shape[:-3], dtype=np.int64)),) + tuple(x.shape[-3:])
    if is_device_array(x):
        return to_device(x, dt).reshape(shape4)
    return cuda.to_device(np.ascontiguousarray(np.asarray(x).reshape(shape4), dtype=dt))


def stack_device(arrs, dt):
    """Stack ``R`` device ``(B, H, N, e)`` arrays into one device ``(R, B, H, N, e)`` array."""
    if len(arrs) == 1:
        return arrs[0].reshape((1,) + tuple(arrs[0].shape))
    outd = cuda.device_array((len(arrs),) + tuple(arrs[0].shape), dtype=dt)
    for r, a in enumerate(arrs):
        outd[r].copy_to_device(a)
    return outd


def head_groups(h, hkv, kv_group_map):
    """``(Hkv, H/Hkv)`` int64: the query heads of each kv head, ascending."""
    g = h // hkv
    if kv_group_map == "contiguous":
        return np.arange(h, dtype=np.int64).reshape(hkv, g)
    return np.arange(h, dtype=np.int64).reshape(g, hkv).T.copy()


def launch_forward(q, k, v, w, kvm, maskd, scale, softcap, causal, offset, plan, tx, omap_needed):
    """Run the forward kernel. ``q``/``k`` (R,B,H,N,d) device; returns device out, omap, lse."""
    R, b, h, n, d = q.shape
    m = k.shape[3]
    dv = v.shape[3]
    dt = np.dtype(q.dtype)
    bq, bk = plan["fwd"]
    out = cuda.device_array((b, h, n, dv), dtype=dt)
    omap = cuda.device_array((R, b, h, n, dv), dtype=dt) if omap_needed else out.reshape((1, b, h, n, dv))
    lse = cuda.device_array((R, b, h, n), dtype=dt)
    mode, mb, mf, ms = maskd
    kern = _k.get_fwd(dt.name, R, bq, bk, d, dv, tx)
    grid = (b * h, -(-n // bq))  # (batch x head) on x: up to 2**31 - 1 blocks
    kern[grid, (tx, bq)](q, k, v, w, kvm, mode, mb, mf, ms, dt.type(scale), dt.type(softcap), int(causal),
                         int(offset), out, omap, lse)
    del m
    return out, omap, lse


def launch_delta(g4, omap, w, dlse):
    """``rs = rowsum(G * O_r)`` and ``delta = w * rs - dlse``, both device (R, B, H, N)."""
    R, b, h, n, dv = omap.shape
    dt = np.dtype(omap.dtype)
    P = b * h * n
    rs = cuda.device_array((R, P), dtype=dt)
    delta = cuda.device_array((R, P), dtype=dt)
    has = dlse is not None
    dl = dlse.reshape((P,)) if has else cuda.device_array((1,), dtype=dt)
    tpb = 128
    kern = _k.get_delta(dt.name)
    kern[(-(-(R * P) // tpb),), (tpb,)](g4.reshape((P, dv)), omap.reshape((R, P, dv)), w.reshape((R, P)), dl,
                                        int(has), rs, delta)
    return rs.reshape((R, b, h, n)), delta.reshape((R, b, h, n))


def launch_backward(q, k, v, w, kvm, heads, maskd, scale, softcap, causal, offset, plan, tx, g4, lse, delta):
    """dQ (R,B,H,N,d), dK (R,B,Hkv,M,d) (both scaled) and dV (B,Hkv,M,dv), device arrays."""
    R, b, h, n, d = q.shape
    hkv, m = k.shape[2], k.shape[3]
    dv = v.shape[3]
    dt = np.dtype(q.dtype)
    mode, mb, mf, ms = maskd
    dq = cuda.device_array((R, b, h, n, d), dtype=dt)
    dk = cuda.device_array((R, b, hkv, m, d), dtype=dt)
    dvv = cuda.device_array((b, hkv, m, dv), dtype=dt)
    sc, cap = dt.type(scale), dt.type(softcap)
    bq, bk = plan["bwd_kv"]
    kern = _k.get_bwd_kv(dt.name, R, bq, bk, d, dv, tx)
    kern[(b * hkv, -(-m // bk)), (tx, bk)](q, k, v, w, heads, mode, mb, mf, ms, sc, cap, int(causal), int(offset),
                                           g4, lse, delta, dk, dvv)
    bq, bk = plan["bwd_q"]
    kern = _k.get_bwd_q(dt.name, R, bq, bk, d, dv, tx)
    kern[(b * h, -(-n // bq)), (tx, bq)](q, k, v, w, kvm, mode, mb, mf, ms, sc, cap, int(causal), int(offset),
                                         g4, lse, delta, dq)
    return dq, dk, dvv


def synchronize() -> None:
    if cuda is not None:
        cuda.synchronize()


def attach_kernel(slug: str, reference_module: str, fn, check) -> None:
    """Attach ``fn`` and its parity ``check`` to the registry record ``slug`` as ``"numba_cuda"``,
    only when the kernels can run here (GPU or simulator); otherwise, or when the record is
    missing, do nothing."""
    import importlib

    from ._device import cuda_available

    if not cuda_available():
        return
    try:
        from ...registry import add_kernel

        importlib.import_module(reference_module)
        add_kernel(slug, "numba_cuda", fn, check)
    except (ImportError, ValueError):
        return
