"""Python-side validation and array preparation shared by the Numba CPU attention kernels.

Everything here runs *before* a kernel is entered: it checks arguments with :mod:`refattn._checks`
(so bad input raises ``TypeError``/``ValueError`` naming the argument, never a crash inside a
kernel), flattens the leading batch axes, and converts masks to the flat buffer + element-stride
form the kernels read (a broadcast mask is never materialised).
"""

from __future__ import annotations

import math

import numpy as np

from ..._checks import (
    as_dout,
    as_float,
    check_int,
    compute_dtype,
    validate_qkv,
)

# Default tile sizes of both attention kernels (SDPA: :func:`sdpa_blocks`, where the measurements
# are). For the differential kernel, measured at d = 64, dv = 128, float32, one thread, N = 2048 on
# a Xeon (AVX-512): 256 x 1024 ran the forward 8 % faster than its earlier 256 x 256 with oneMKL
# and 5 % with OpenBLAS (forward+backward the same within 2 %).
DEFAULT_BLOCK_Q = 256
DEFAULT_BLOCK_K = 1024


def sdpa_blocks(n: int, is_causal: bool, block_q=None, block_k=None) -> tuple:
    """Tile sizes of the SDPA kernels (``flash``) for ``n`` queries; a size given stays as given.

    Chosen by measurement (d = 64, float32, one thread, interleaved with torch SDPA, issue 19):
    ``256 x 1024`` for every ``n``, causal or not. Wide key tiles halve the passes over the output
    accumulator and the number of ``P V`` products against ``512 x 512`` (the same 1 MiB score
    tile, which stays in a 2 MiB L2); taller query tiles than 256 gained nothing once the keys were
    1024 wide. On a Xeon (AVX-512) with oneMKL the forward went from 0.94 / 0.96x torch
    (``512 x 512``) to 0.96-0.99x non-causal (N = 1024 / 4096) and 1.13x / 0.99x causal;
    forward+backward stayed the same (0.92 / 0.96x); with OpenBLAS both shapes measured the same.
    Earlier, on an AMD EPYC core with OpenBLAS, ``512 x 512`` had beaten ``512 x 256``, ``256 x 256``
    and ``128 x 512``. Under a causal mask the tiles that cross the diagonal are computed in row
    groups of :data:`DIAG_ROWS` rows whose products stop at the group's last visible key
    (:func:`sdpa_row_group`), so the masked corner of a tile is not multiplied. The choice depends
    on the shapes only, so results stay bit-identical for any thread count. With BLAS products the
    backward uses the forward's sizes (it must recompute every score tile with the same call); with
    the built-in ones its key tiles are :func:`bwd_block_k`."""
    return (DEFAULT_BLOCK_Q if block_q is None else block_q), (DEFAULT_BLOCK_K if block_k is None else block_k)


# Rows per score product in a causal tile that crosses the diagonal (None: the whole query tile, one
# product). Measured with 256 x 1024 tiles (oneMKL, one thread, interleaved with torch): forward 64 >
# 32 > 128 > 256 at N = 1024 (1.18x / 1.13x / 1.10x / 1.02x torch), within 1-2 % at 2048-4096;
# forward+backward 64 best too. (At 512-row tiles on the AMD VM, 128 and 64 had measured the same.)
DIAG_ROWS = 64


def sdpa_row_group(bq: int, is_causal: bool) -> int:
    """Rows per score product in a causal tile that crosses the diagonal (see ``_attention``):
    ``min(bq, DIAG_ROWS)``, so tiles of at most 64 rows keep one product per tile."""
    if not is_causal or DIAG_ROWS is None:
        return bq
    return max(1, min(bq, DIAG_ROWS))


# Key tiles of the backward with the built-in tile products (``fp == -1``). Those give every score
# entry the same value whatever the tile shape, so the backward need not repeat the forward's
# tiles. Measured (SDPA, 256-row query tiles, d = 64, float32, one thread, Xeon, same rounds):
# backward at N = 4096 332 ms with 512-key tiles, 356 ms with 1024 (128 x 512: 336, 64 x 512: 346);
# at N = 1024 23.9 vs 24.9 ms. The three score-sized tiles of the backward (S, dP, dS) then take
# 1.5 MiB instead of 3 MiB and stay in a 2 MiB L2.
BWD_BLOCK_K = 512


def bwd_block_k(fp: int, block_k: int) -> int:
    """Key tile of the backward: the forward's ``block_k`` for BLAS products (which must repeat the
    forward's products exactly), at most :data:`BWD_BLOCK_K` with the built-in ones."""
    return min(block_k, BWD_BLOCK_K) if fp == -1 else block_k


# Work items the backward aims for: with fewer (batch x head) pairs than this, the keys are split
# into ``nsplit`` ranges whose dQ partials are summed afterwards. It depends on the shapes only, never
# on the thread count, so results are bit-identical whatever ``numba.set_num_threads`` says.
_TARGET_BWD_TASKS = 16


def validate_config(q_shape, m, attn_mask, is_causal, causal_alignment, scale, softcap, kv_group_map,
                    block_q, block_k):
    """The reference's keyword validation (same messages) plus the tile sizes."""
    from ...attention.softmax.core import validate_attention_config

    attn_mask, is_causal, scale, softcap = validate_attention_config(
        tuple(q_shape[:-1]) + (m,), attn_mask, is_causal, causal_alignment, scale, softcap, kv_group_map)
    block_q = check_int(block_q, "block_q", minimum=1)
    block_k = check_int(block_k, "block_k", minimum=1)
    return attn_mask, is_causal, scale, softcap, block_q, block_k


def check_dout(dout, shape, dt, name="dout"):
    """:func:`refattn._checks.as_dout`, C-contiguous for the kernels."""
    return np.ascontiguousarray(as_dout(dout, shape, dt, name=name))


def readonly(x) -> np.ndarray:
    """A C-contiguous, read-only base-class view of ``x`` (a copy only when ``x`` is not C-contiguous).

    Numba compiles one specialisation per argument *type*, and a read-only array (``np.broadcast_to``,
    a read-only ``np.memmap``, ``flags.writeable = False``) is a different type from a writeable
    one: mixing them would compile the kernels again (tens of seconds) for each new combination.
    Every array a kernel only reads is passed through this function, so one signature per dtype
    serves all callers; the views cost nothing and the kernels never write their inputs."""
    a = np.ascontiguousarray(x)
    view = a.view(np.ndarray)
    view.flags.writeable = False
    return view


def run_kernel(kernel, *args, blas=True):
    """Call a Numba kernel with the BLAS it calls pinned to one thread (see :mod:`.runtime`);
    ``blas=False``: a kernel that calls no BLAS (the built-in tile products), called as it is."""
    from .runtime import single_blas_thread

    if not blas:
        return kernel(*args)
    with single_blas_thread():
        return kernel(*args)


def flat4(x: np.ndarray) -> np.ndarray:
    """``(..., H, N, e) -> (B, H, N, e)`` C-contiguous (a view when already contiguous)."""
    return np.ascontiguousarray(x.reshape((-1,) + x.shape[-3:]))


def kv_map(h: int, hkv: int, kv_group_map: str) -> np.ndarray:
    """The kv head of each query head: ``h // r`` (contiguous) or ``h % Hkv`` (strided)."""
    idx = np.arange(h, dtype=np.int64)
    return readonly(idx // (h // hkv) if kv_group_map == "contiguous" else idx % hkv)


def mask_buffers(attn_mask, lead: tuple, h: int, n: int, m: int, dt):
    """``(mode, bool buffer, float buffer, element strides)`` of a validated mask for the kernels.

    The mask is reduced to 4-D ``(B', H', N', M')`` with every axis either 1 (broadcast, stride 0)
    or full size. Leading axes that are partly broadcast are materialised (the only copy made).
    """
    dummy_b = readonly(np.ones(1, dtype=np.bool_))
    dummy_f = readonly(np.zeros(1, dtype=dt))
    if attn_mask is None:
        return 0, dummy_b, dummy_f, readonly(np.zeros(4, dtype=np.int64))
    target = tuple(lead) + (h, n, m)
    a = attn_mask.reshape((1,) * (len(target) - attn_mask.ndim) + attn_mask.shape)
    lead_a = a.shape[: len(lead)]
    if all(s == 1 for s in lead_a):
        a4 = a.reshape((1,) + a.shape[len(lead):])
    elif lead_a == tuple(lead):
        a4 = a.reshape((-1,) + a.shape[len(lead):])
    else:
        a4 = np.broadcast_to(a, tuple(lead) + a.shape[len(lead):]).reshape((-1,) + a.shape[len(lead):])
    if a4.dtype == np.bool_:
        buf = np.ascontiguousarray(a4)
        mode, bb, fb = 1, readonly(buf.ravel()), dummy_f
    else:
        buf = np.ascontiguousarray(a4, dtype=dt)
        mode, bb, fb = 2, dummy_b, readonly(buf.ravel())
    full = (math.prod(target[:-3]) if len(target) > 3 else 1, h, n, m)
    cstr = [buf.shape[1] * buf.shape[2] * buf.shape[3], buf.shape[2] * buf.shape[3], buf.shape[3], 1]
    ms = np.array([0 if buf.shape[i] == 1 and full[i] != 1 else cstr[i] for i in range(4)], dtype=np.int64)
    return mode, bb, fb, readonly(ms)


# Memory the float64 dQ partials of the key splits may take per (batch, head).
_DQ_SPLIT_BYTES = 16 << 20


def bwd_splits(b: int, h: int, m: int, block_k: int, n: int = 1, d: int = 1) -> int:
    """Number of key splits of the backward: enough work items (``_TARGET_BWD_TASKS``) when
    ``B*H`` is small, at most ``nkt`` and at most ``_DQ_SPLIT_BYTES / (8 N d)`` (each split holds a
    float64 ``N x d`` dQ partial per head). Split ``sp`` takes the key tiles in zig-zag order
    (``sp, 2S-1-sp, 2S+sp, ...``) so that causal splits do equal work. Depends on the shapes only,
    never on the thread count."""
    nkt = -(-m // block_k)
    by_memory = max(1, _DQ_SPLIT_BYTES // (8 * n * d))
    return max(1, min(nkt, -(-_TARGET_BWD_TASKS // (b * h)), by_memory))


__all__ = [
    "validate_qkv",
    "validate_config",
    "check_dout",
    "flat4",
    "kv_map",
    "mask_buffers",
    "bwd_splits",
    "bwd_block_k",
    "sdpa_blocks",
    "sdpa_row_group",
    "readonly",
    "run_kernel",
    "compute_dtype",
    "as_float",
    "DEFAULT_BLOCK_Q",
    "DEFAULT_BLOCK_K",
]


def attach_kernel(slug: str, reference_module: str, fn, check) -> None:
    """Attach ``fn`` and its parity ``check`` to the registry record ``slug`` as ``"numba_cpu"``.

    The reference module is imported first so the record exists even when a kernel module is
    imported on its own; a missing or unimplemented record is skipped (the kernel stays usable).
    """
    import importlib

    from ...registry import add_kernel

    try:
        importlib.import_module(reference_module)
        add_kernel(slug, "numba_cpu", fn, check)
    except (ImportError, ValueError):
        return
