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
    as_bool_or_float_mask,
    as_float,
    check_broadcastable,
    check_choice,
    check_int,
    check_positive,
    compute_dtype,
)

KV_GROUP_MAPS = ("contiguous", "strided")
CAUSAL_ALIGNMENTS = ("top_left", "bottom_right")

DEFAULT_BLOCK_Q = 64
DEFAULT_BLOCK_K = 128  # measured best of {32, 64, 128} x {32, 64, 128} at d = 64 (float32)
# Work items the backward aims for: with fewer (batch x head) pairs than this, the keys are split
# into ``nsplit`` ranges whose dQ partials are summed afterwards. It depends on the shapes only, never
# on the thread count, so results are bit-identical whatever ``numba.set_num_threads`` says.
_TARGET_BWD_TASKS = 16


def validate_qkv(q, k, v, *, qname="q", kname="k", vname="v"):
    """``q (..., H, N, d)``, ``k (..., Hkv, M, d)``, ``v (..., Hkv, M, dv)`` with equal leading axes."""
    q = as_float(q, qname, min_ndim=3)
    k = as_float(k, kname, min_ndim=3)
    v = as_float(v, vname, min_ndim=3)
    if k.ndim != q.ndim or v.ndim != q.ndim:
        raise ValueError(
            f"{qname}, {kname} and {vname} must have the same number of dimensions (..., heads, tokens, "
            f"features); got {qname} {q.shape}, {kname} {k.shape}, {vname} {v.shape}"
        )
    if k.shape[:-3] != q.shape[:-3] or v.shape[:-3] != q.shape[:-3]:
        raise ValueError(
            f"the leading (batch) axes of {qname}, {kname} and {vname} must be equal; got "
            f"{qname} {q.shape}, {kname} {k.shape}, {vname} {v.shape}"
        )
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"{kname} must have {qname}'s head width d={q.shape[-1]} on its last axis; got {k.shape}")
    if v.shape[-3] != k.shape[-3]:
        raise ValueError(f"{vname} must have {kname}'s number of kv heads {k.shape[-3]} on axis -3; got {v.shape}")
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(f"{vname} must have {kname}'s number of keys M={k.shape[-2]} on axis -2; got {v.shape}")
    h, hkv = q.shape[-3], k.shape[-3]
    if h % hkv:
        raise ValueError(
            f"the number of query heads H={h} ({qname} axis -3) must be a multiple of the number of kv "
            f"heads Hkv={hkv} ({kname} axis -3)"
        )
    return q, k, v


def validate_config(q_shape, m, attn_mask, is_causal, causal_alignment, scale, softcap, kv_group_map,
                    block_q, block_k):
    if not isinstance(is_causal, (bool, np.bool_)):
        raise TypeError(f"is_causal must be a bool; got {type(is_causal).__name__}")
    check_choice(causal_alignment, "causal_alignment", CAUSAL_ALIGNMENTS)
    check_choice(kv_group_map, "kv_group_map", KV_GROUP_MAPS)
    scale = check_positive(scale, "scale", allow_none=True)
    softcap = check_positive(softcap, "softcap", allow_none=True)
    block_q = check_int(block_q, "block_q", minimum=1)
    block_k = check_int(block_k, "block_k", minimum=1)
    attn_mask = as_bool_or_float_mask(attn_mask, "attn_mask")
    if attn_mask is not None:
        target = tuple(q_shape[:-1]) + (m,)
        check_broadcastable("attn_mask", attn_mask.shape, target, "the scores (..., H, N, M) of shape")
    return attn_mask, bool(is_causal), scale, softcap, block_q, block_k


def check_dout(dout, shape, dt, name="dout"):
    dout = as_float(dout, name, finite=False)
    if dout.shape != tuple(shape):
        raise ValueError(f"{name} must have the output's shape {tuple(shape)}; got {dout.shape}")
    return np.ascontiguousarray(dout, dtype=dt)


def flat4(x: np.ndarray) -> np.ndarray:
    """``(..., H, N, e) -> (B, H, N, e)`` C-contiguous (a view when already contiguous)."""
    return np.ascontiguousarray(x.reshape((-1,) + x.shape[-3:]))


def kv_map(h: int, hkv: int, kv_group_map: str) -> np.ndarray:
    """The kv head of each query head: ``h // r`` (contiguous) or ``h % Hkv`` (strided)."""
    idx = np.arange(h, dtype=np.int64)
    return idx // (h // hkv) if kv_group_map == "contiguous" else idx % hkv


def mask_buffers(attn_mask, lead: tuple, h: int, n: int, m: int, dt):
    """``(mode, bool buffer, float buffer, element strides)`` of a validated mask for the kernels.

    The mask is reduced to 4-D ``(B', H', N', M')`` with every axis either 1 (broadcast, stride 0)
    or full size. Leading axes that are partly broadcast are materialised (the only copy made).
    """
    dummy_b = np.ones(1, dtype=np.bool_)
    dummy_f = np.zeros(1, dtype=dt)
    if attn_mask is None:
        return 0, dummy_b, dummy_f, np.zeros(4, dtype=np.int64)
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
        mode, bb, fb = 1, buf.ravel(), dummy_f
    else:
        buf = np.ascontiguousarray(a4, dtype=dt)
        mode, bb, fb = 2, dummy_b, buf.ravel()
    full = (math.prod(target[:-3]) if len(target) > 3 else 1, h, n, m)
    cstr = [buf.shape[1] * buf.shape[2] * buf.shape[3], buf.shape[2] * buf.shape[3], buf.shape[3], 1]
    ms = np.array([0 if buf.shape[i] == 1 and full[i] != 1 else cstr[i] for i in range(4)], dtype=np.int64)
    return mode, bb, fb, ms


# Memory the float64 dQ partials of the key splits may take per (batch, head).
_DQ_SPLIT_BYTES = 16 << 20


def bwd_splits(b: int, h: int, m: int, block_k: int, n: int = 1, d: int = 1) -> int:
    """Number of key ranges of the backward: enough work items (``_TARGET_BWD_TASKS``) when
    ``B*H`` is small, at most ``nkt`` and at most ``_DQ_SPLIT_BYTES / (8 N d)`` (each split holds a
    float64 ``N x d`` dQ partial per head). Depends on the shapes only, never on the thread count."""
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
