r"""Rotary position embedding (RoPE), both channel layouts, partial rotary, hand-derived backward.

Su, Lu, Pan, Murtadha, Wen, Liu, "RoFormer: Enhanced Transformer with Rotary Position
Embedding", arXiv 2104.09864 (official code ZhuiyiTechnology/roformer).

Forward
-------
For a token at position $p$ and frequency index $m = 0,\dots,r/2-1$ ($r$ = ``rotary_dim``,
default the head dimension $d$), $\theta_m = \text{base}^{-2m/r}$ and each channel pair
$(x_{a(m)}, x_{b(m)})$ is rotated by the angle $\phi = p\,\theta_m$:

$$x'_a = x_a\cos\phi - x_b\sin\phi,\qquad x'_b = x_a\sin\phi + x_b\cos\phi.$$

Channels $r,\dots,d-1$ pass through unchanged (partial rotary: GPT-NeoX ``rotary_pct``,
flash-attn ``rotary_dim < headdim``; the frequencies use $r$ in the exponent, as they do).
Applied to $q$ and $k$, $\langle R_{p_i}q, R_{p_j}k\rangle = \langle q, R_{p_j-p_i}k\rangle$:
scores depend on positions only through $p_j - p_i$.

Layout (``interleaved``)
------------------------
* ``interleaved=True``: pairs $(2m, 2m+1)$ — GPT-J, RoFormer, and microsoft/unilm
  Diff-Transformer, whose ``multihead_flashdiff_*.py`` call ``apply_rotary_emb(...,
  interleaved=True)`` from ``Diff-Transformer/diff/kernel/rotary.py``@45d438e (Tri Dao's flash-attn rotary kernel).
* ``interleaved=False`` (default, as flash-attn's ``apply_rotary_emb`` and HF Llama/GPT-NeoX
  ``rotate_half``): pairs $(m, m + r/2)$.

The two are related by a fixed permutation of the channels: with
$P = [0, 2, 4, \dots, r-2, 1, 3, \dots, r-1]$,
``rope(x, interleaved=True) == rope(x[..., P], interleaved=False)[..., argsort(P)]``. A checkpoint
trained with one layout needs that permutation of its q/k projection columns to run with the
other; mixing them up silently produces wrong scores, not an error.

Backward
--------
The map is linear and orthogonal per pair, $x' = R(\phi)x$, so $dx = R(\phi)^\top dx' =
R(-\phi)\,dx'$: the backward is the same rotation with $\sin\phi \to -\sin\phi$ (flash-attn's
``conjugate=True``). For learned or data-dependent angles, $\partial x'/\partial\phi = J x'$ with
$J$ the 90° generator, i.e. $\partial x'_a/\partial\phi = -x'_b$, $\partial x'_b/\partial\phi = x'_a$,
so $\partial L/\partial\phi_m = x'_a\,dx'_b - x'_b\,dx'_a$ (:func:`rope_angles_vjp`).
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, check_broadcastable, check_int, check_positive
from ..registry import Mechanism, Sample, register

__all__ = [
    "rope_frequencies",
    "rope_angles",
    "apply_rope",
    "rope_angles_vjp",
    "rope_forward",
    "rope_backward",
    "rope",
    "interleave_permutation",
]


def rope_frequencies(rotary_dim: int, base: float = 10000.0) -> np.ndarray:
    r"""$\theta_m = \text{base}^{-2m/r}$, $m = 0..r/2-1$, in float64 (``rotary_dim`` even)."""
    return base ** (-np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim)


def rope_angles(positions, rotary_dim: int, *, base: float = 10000.0) -> np.ndarray:
    r"""Angles $\phi = p\,\theta_m$ of shape ``positions.shape + (rotary_dim // 2,)``, float64.

    Unvalidated helper; ``np.cos``/``np.sin`` of the result are the ``cos, sin`` tables of
    :func:`apply_rope` (flash-attn's ``cos, sin`` of shape ``(seqlen, rotary_dim / 2)``).
    """
    return np.asarray(positions, dtype=np.float64)[..., None] * rope_frequencies(rotary_dim, base)


def _pair_slices(r: int, interleaved: bool):
    if interleaved:
        return slice(0, r, 2), slice(1, r, 2)
    return slice(0, r // 2), slice(r // 2, r)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, interleaved: bool = False) -> np.ndarray:
    r"""Rotate the first ``r = 2 * cos.shape[-1]`` channels of ``x`` (unvalidated helper).

    ``cos, sin`` broadcast to ``x[..., :r/2]`` (shape ``(..., N, r/2)``); the remaining channels are
    copied. The backward of this map is ``apply_rope(dy, cos, -sin, interleaved)``.
    """
    r = 2 * cos.shape[-1]
    ia, ib = _pair_slices(r, interleaved)
    xa, xb = x[..., ia], x[..., ib]
    out = np.empty(np.broadcast_shapes(x.shape, cos.shape[:-1] + (x.shape[-1],)), dtype=np.result_type(x, cos))
    out[..., ia] = xa * cos - xb * sin
    out[..., ib] = xa * sin + xb * cos
    out[..., r:] = x[..., r:]
    return out


def rope_angles_vjp(dy: np.ndarray, y: np.ndarray, rotary_dim: int, interleaved: bool = False) -> np.ndarray:
    r"""$\partial L/\partial\phi_m = y_a\,dy_b - y_b\,dy_a$ per pair, shape ``(..., N, r/2)``.

    ``y`` is the rotated output and ``dy`` its upstream gradient; sum the result over any axis
    along which the angles were broadcast (heads, batch).
    """
    ia, ib = _pair_slices(rotary_dim, interleaved)
    return y[..., ia] * dy[..., ib] - y[..., ib] * dy[..., ia]


def interleave_permutation(rotary_dim: int) -> np.ndarray:
    """``P = [0, 2, ..., r-2, 1, 3, ..., r-1]``: ``rope_interleaved(x) == rope_half(x[..., P])[..., argsort(P)]``."""
    return np.concatenate([np.arange(0, rotary_dim, 2), np.arange(1, rotary_dim, 2)])


def _validate(x, positions, base, interleaved, offset, rotary_dim):
    x = as_float(x, "x", min_ndim=2)
    n, d = x.shape[-2], x.shape[-1]
    if not isinstance(interleaved, (bool, np.bool_)):
        raise TypeError(f"interleaved must be a bool; got {type(interleaved).__name__}")
    base = check_positive(base, "base")
    offset = check_int(offset, "offset")
    if rotary_dim is None:
        if d % 2:
            raise ValueError(f"x's last axis (head dim) must be even for RoPE; got shape {x.shape} "
                             f"(or pass an even rotary_dim <= {d})")
        rotary_dim = d
    else:
        rotary_dim = check_int(rotary_dim, "rotary_dim", minimum=2)
        if rotary_dim % 2 or rotary_dim > d:
            raise ValueError(f"rotary_dim must be even and <= the head dim {d}; got {rotary_dim}")
    if positions is None:
        pos = np.arange(n, dtype=np.float64) + offset
    else:
        try:
            pos = np.asarray(positions)
        except Exception as exc:
            raise TypeError(f"positions could not be converted to an array: {exc}") from None
        if pos.dtype.kind not in "iuf":
            raise TypeError(f"positions must be an integer or real array; got dtype {pos.dtype}")
        if pos.ndim == 0:
            raise ValueError(f"positions must have shape (N,) = ({n},) or broadcast to x.shape[:-1]; got a scalar")
        pos = pos.astype(np.float64)
        if not np.isfinite(pos).all():
            raise ValueError("positions contains NaN or infinite values")
        check_broadcastable("positions", pos.shape, x.shape[:-1], "x.shape[:-1] =")
        pos = pos + offset
    return x, pos, base, bool(interleaved), rotary_dim


def rope_forward(x, *, positions=None, base: float = 10000.0, interleaved: bool = False, offset: int = 0,
                 rotary_dim: int | None = None):
    r"""Apply rotary position embedding to ``x`` (see the module docstring for the math).

    Parameters
    ----------
    x : array (..., N, d)
        Queries or keys, the sequence on axis -2 (SDPA layout ``(B, H, N, d)``). For a
        ``(B, N, H, d)`` layout (unilm, flash-attn) pass ``positions=np.arange(N)[:, None]``.
    positions : array broadcastable to ``x.shape[:-1]``, optional
        Token positions, integer or real (e.g. ``(N,)``, or ``(B, 1, N)`` per sample). Default
        ``arange(N)``. Not differentiated here; learned angles use :func:`rope_angles_vjp`.
    base : float
        Frequency base, default 10000 (RoFormer, Llama 2; Llama 3 uses 500000).
    interleaved : bool
        ``True`` pairs channels ``(2m, 2m+1)`` (GPT-J, unilm Diff Transformer);
        ``False`` (default, flash-attn/HF Llama/NeoX ``rotate_half``) pairs ``(m, m + r/2)``.
    offset : int
        Added to the positions (flash-attn ``seqlen_offsets``: decoding with a KV cache).
    rotary_dim : int, optional
        Rotate only the first ``rotary_dim`` (even) channels; default all ``d`` (which must be
        even then).

    Returns
    -------
    y, cache
        ``y`` has ``x``'s shape and compute dtype. The angles are computed in float64 and their
        ``cos``/``sin`` rounded to the compute dtype.
    """
    x, pos, base, interleaved, r = _validate(x, positions, base, interleaved, offset, rotary_dim)
    ang = rope_angles(pos, r, base=base)
    cos, sin = np.cos(ang).astype(x.dtype), np.sin(ang).astype(x.dtype)
    y = apply_rope(x, cos, sin, interleaved)
    return y, {"cos": cos, "sin": sin, "interleaved": interleaved, "shape": x.shape, "dtype": x.dtype}


def rope_backward(dout, cache):
    r"""$dx = R(-\phi)\,dy$: the same rotation with the sine negated (RoPE is orthogonal)."""
    dout = as_dout(dout, cache["shape"], cache["dtype"])
    dx = apply_rope(dout, cache["cos"], -cache["sin"], cache["interleaved"])
    return {"x": dx}


def rope(x, *, positions=None, base: float = 10000.0, interleaved: bool = False, offset: int = 0,
         rotary_dim: int | None = None) -> np.ndarray:
    """Convenience wrapper: the output of :func:`rope_forward`."""
    return rope_forward(x, positions=positions, base=base, interleaved=interleaved, offset=offset,
                        rotary_dim=rotary_dim)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size):
    if size == "tiny":
        h, n, half = int(rng.integers(1, 3)), int(rng.integers(2, 5)), int(rng.integers(1, 4))
    else:
        h, n, half = int(rng.integers(2, 4)), int(rng.integers(5, 10)), int(rng.integers(3, 7))
    d = 2 * half
    config = {"interleaved": bool(rng.random() < 0.5), "base": 10000.0 if rng.random() < 0.5 else 100.0}
    if rng.random() < 0.5:
        config["positions"] = np.sort(rng.uniform(0, 3 * n, size=n))  # real-valued positions
    else:
        config["offset"] = int(rng.integers(0, 5))
    if half > 1 and rng.random() < 0.5:
        config["rotary_dim"] = 2 * int(rng.integers(1, half))  # partial rotary
    return Sample(inputs={"x": rng.standard_normal((2, h, n, d))}, config=config)


def _reference(x, positions=None, base=10000.0, interleaved=False, offset=0, rotary_dim=None):
    # Explicit complex form: each pair is a complex number multiplied by e^{i p theta_m}.
    n, d = x.shape[-2:]
    r = d if rotary_dim is None else rotary_dim
    p = (np.arange(n, dtype=np.float64) if positions is None else np.asarray(positions, np.float64)) + offset
    theta = np.array([base ** (-2.0 * m / r) for m in range(r // 2)])
    a, b = (x[..., 0:r:2], x[..., 1:r:2]) if interleaved else (x[..., : r // 2], x[..., r // 2: r])
    z = (a + 1j * b) * np.exp(1j * p[..., None] * theta)
    out = x.copy()
    if interleaved:
        out[..., 0:r:2], out[..., 1:r:2] = z.real, z.imag
    else:
        out[..., : r // 2], out[..., r // 2: r] = z.real, z.imag
    return out


def _check_norm(rng):
    x = rng.standard_normal((2, 3, 7, 8))
    errs = []
    for inter in (False, True):
        y = rope(x, interleaved=inter, positions=rng.uniform(0, 100, 7))
        errs.append(float(np.abs(np.linalg.norm(y, axis=-1) - np.linalg.norm(x, axis=-1)).max()))
    err = max(errs)
    assert err < 1e-12, f"RoPE does not preserve norms (err {err})"
    return err


def _check_relative(rng):
    q, k = rng.standard_normal((2, 5, 8)), rng.standard_normal((2, 6, 8))
    pq, pk = rng.uniform(0, 50, 5), rng.uniform(0, 50, 6)
    errs = []
    for inter in (False, True):
        s0 = rope(q, positions=pq, interleaved=inter) @ np.swapaxes(rope(k, positions=pk, interleaved=inter), -1, -2)
        s1 = (rope(q, positions=pq + 13.7, interleaved=inter)
              @ np.swapaxes(rope(k, positions=pk + 13.7, interleaved=inter), -1, -2))
        # <R_i q, R_j k> = <q, R_{j-i} k>, entry by entry
        s2 = np.empty_like(s0)
        for i in range(5):
            s2[:, i, :] = np.einsum("bd,bjd->bj", q[:, i], rope(k, positions=pk - pq[i], interleaved=inter))
        errs += [float(np.abs(s0 - s1).max()), float(np.abs(s0 - s2).max())]
    err = max(errs)
    assert err < 1e-11, f"RoPE scores are not a function of p_j - p_i (err {err})"
    return err


def _check_permutation(rng):
    x = rng.standard_normal((2, 4, 10))
    errs = []
    for r in (10, 6):
        perm = interleave_permutation(r)
        full = np.concatenate([perm, np.arange(r, 10)])
        a = rope(x, interleaved=True, rotary_dim=r)
        b = rope(x[..., full], interleaved=False, rotary_dim=r)[..., np.argsort(full)]
        errs.append(float(np.abs(a - b).max()))
        assert np.abs(a - rope(x, interleaved=False, rotary_dim=r)).max() > 1e-3, "layouts should differ"
    err = max(errs)
    assert err < 1e-14, f"interleaved != permuted rotate-half (err {err})"
    return err


def _check_inverse(rng):
    x = rng.standard_normal((2, 3, 5, 6))
    y, cache = rope_forward(x, interleaved=True, offset=3)
    err = float(np.abs(rope_backward(y, cache)["x"] - x).max())
    assert err < 1e-14, f"the backward is not the inverse rotation (err {err})"
    return err


def _check_partial_passthrough(rng):
    x = rng.standard_normal((2, 4, 9))
    y = rope(x, rotary_dim=4, positions=np.arange(4) + 0.5)
    assert np.array_equal(y[..., 4:], x[..., 4:]), "channels beyond rotary_dim must pass through"
    assert np.array_equal(rope(x, rotary_dim=4, positions=np.zeros(4)), x), "position 0 must be the identity"
    return 0.0


register(
    Mechanism(
        slug="rope", family="1-softmax", tier="T1",
        title="Rotary position embedding (interleaved or rotate-half, partial rotary)",
        paper="Su, Lu, Pan, Murtadha, Wen, Liu, RoFormer: Enhanced Transformer with Rotary Position Embedding, "
              "arXiv 2104.09864",
        forward=rope_forward, backward=rope_backward, sample=_sample, reference=_reference,
        docs="building-blocks.md#rope",
        checks={"norm_preserved": _check_norm, "relative_positions": _check_relative,
                "layout_permutation": _check_permutation, "backward_is_inverse": _check_inverse,
                "partial_rotary": _check_partial_passthrough},
    ),
)
