r"""Stable softmax, masked softmax, log-softmax and logsumexp, with hand-derived backwards.

Masks
-----
``mask`` is either boolean (``True`` = keep, PyTorch's ``attn_mask`` convention) or additive
floating (``0`` keeps, ``-inf`` removes, any finite value is a bias). It must broadcast to ``x``.

**Fully masked rows.** A row whose every entry is masked has no softmax. refattn defines its
output as all zeros and its gradient as zero (no NaN, no warning). PyTorch 2.13's
``scaled_dot_product_attention`` also returns 0 there (checked on CPU); an explicit
``softmax`` of an all ``-inf`` row gives NaN, which unilm's Diff Transformer removes with
``nan_to_num``. Zero keeps a padded batch finite. ``logsumexp`` of such a row is ``-inf`` and its
gradient 0; ``log_softmax`` is ``-inf`` on masked entries (log 0).

Derivation
----------
Softmax: $p_j = e^{x_j - m}/\sum_k e^{x_k - m}$ with $m = \max_k x_k$ (the shift
cancels exactly and keeps every exponent $\le 0$). With upstream $g = \partial L/\partial p$,

$$\frac{\partial L}{\partial x_j} = \sum_i g_i\, p_i(\delta_{ij} - p_j) = p_j\,(g_j - \textstyle\sum_i g_i p_i).$$

Masked entries have $p_j = 0$ and receive 0. An additive bias has the same gradient as
$x$ (summed over broadcast axes by the caller that owns the bias).

Logsumexp: $\ell = m + \log\sum_k e^{x_k-m}$, $\partial\ell/\partial x_j = p_j$.
Log-softmax: $y_j = x_j - \ell$, so $\partial L/\partial x_j = g_j - p_j\sum_i g_i$
(sum over unmasked entries).
"""

from __future__ import annotations

import numpy as np

from .._checks import as_bool_or_float_mask, as_dout, as_float, check_broadcastable, check_int
from ..registry import Mechanism, Sample, register

__all__ = [
    "softmax_lse",
    "softmax_forward",
    "softmax_backward",
    "softmax",
    "softmax_vjp",
    "log_softmax_forward",
    "log_softmax_backward",
    "logsumexp_forward",
    "logsumexp_backward",
    "apply_mask",
]


def apply_mask(x: np.ndarray, mask) -> np.ndarray:
    """Return ``x`` with a validated mask applied: ``-inf`` where a boolean mask is False, plus an
    additive mask. Never writes into ``x``."""
    if mask is None:
        return x
    if mask.dtype == np.bool_:
        return np.where(mask, x, -np.inf)
    return x + mask.astype(x.dtype, copy=False)


def softmax_lse(s: np.ndarray, axis: int = -1) -> tuple[np.ndarray, np.ndarray]:
    r"""Softmax of already-masked scores ``s`` (``-inf`` entries allowed) and its log-sum-exp.

    Fully ``-inf`` rows give ``p = 0`` and ``lse = -inf`` without NaN or warnings. This is the
    shared numerical core; public callers should use :func:`softmax_forward`.
    """
    m = np.max(s, axis=axis, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)
    e = np.exp(s - m)
    z = np.sum(e, axis=axis, keepdims=True)
    empty = z == 0
    p = e / np.where(empty, 1.0, z)
    with np.errstate(divide="ignore"):
        lse = np.where(empty, -np.inf, m + np.log(np.where(empty, 1.0, z)))
    return p, np.squeeze(lse, axis=axis)


def softmax_vjp(p: np.ndarray, dp: np.ndarray, axis: int = -1) -> np.ndarray:
    r"""$dx = p \odot (dp - \sum p \odot dp)$ along ``axis`` (0 where ``p`` is 0)."""
    return p * (dp - np.sum(p * dp, axis=axis, keepdims=True))


def _validate(x, mask, axis, name="x"):
    x = as_float(x, name, min_ndim=1)
    axis = check_int(axis, "axis")
    if not -x.ndim <= axis < x.ndim:
        raise ValueError(f"axis must be in [{-x.ndim}, {x.ndim}) for x of shape {x.shape}; got {axis}")
    mask = as_bool_or_float_mask(mask, "mask")
    if mask is not None:
        check_broadcastable("mask", mask.shape, x.shape, "x of shape")
    return x, mask, axis


def softmax_forward(x, *, mask=None, axis: int = -1):
    """Numerically stable (masked) softmax along ``axis``.

    Parameters
    ----------
    x : array (..., n)
        Logits, float16/32/64 (float16 is computed in float32).
    mask : bool or float array broadcastable to ``x``, optional
        Boolean ``True`` = keep, or additive (``-inf`` removes).
    axis : int
        The normalised axis.

    Returns
    -------
    p, cache
        ``p`` has ``x``'s shape and compute dtype; fully masked rows are 0.
    """
    x, mask, axis = _validate(x, mask, axis)
    p, _ = softmax_lse(apply_mask(x, mask), axis)
    return p, {"p": p.copy(), "axis": axis}  # a private copy: the caller may update p in place


def softmax_backward(dout, cache):
    """Gradient of :func:`softmax_forward`: ``{"x": p * (dout - sum(p * dout))}``."""
    p = cache["p"]
    return {"x": softmax_vjp(p, as_dout(dout, p.shape, p.dtype), cache["axis"])}


def softmax(x, *, mask=None, axis: int = -1) -> np.ndarray:
    """Convenience wrapper: the output of :func:`softmax_forward`."""
    return softmax_forward(x, mask=mask, axis=axis)[0]


def log_softmax_forward(x, *, mask=None, axis: int = -1):
    """``x - logsumexp(x)`` along ``axis``; masked entries are ``-inf``, fully masked rows ``-inf``."""
    x, mask, axis = _validate(x, mask, axis)
    s = apply_mask(x, mask)
    p, lse = softmax_lse(s, axis)
    lse_k = np.expand_dims(lse, axis)
    with np.errstate(invalid="ignore"):
        y = np.where(np.isfinite(lse_k) & np.isfinite(s), s - lse_k, -np.inf)
    return y, {"p": p, "axis": axis, "keep": p > 0}


def log_softmax_backward(dout, cache):
    r"""``dx = g - p * sum(g)`` over unmasked entries; 0 on masked entries and masked rows."""
    p, axis = cache["p"], cache["axis"]
    g = np.where(cache["keep"], as_dout(dout, p.shape, p.dtype), 0.0)
    return {"x": g - p * np.sum(g, axis=axis, keepdims=True)}


def logsumexp_forward(x, *, mask=None, axis: int = -1, keepdims: bool = False):
    """``log(sum(exp(x)))`` along ``axis``, stable; ``-inf`` for fully masked rows."""
    x, mask, axis = _validate(x, mask, axis)
    p, lse = softmax_lse(apply_mask(x, mask), axis)
    if keepdims:
        lse = np.expand_dims(lse, axis)
    return lse, {"p": p, "axis": axis, "keepdims": keepdims}


def logsumexp_backward(dout, cache):
    """``dx = dout * softmax(x)`` (0 for masked entries and fully masked rows)."""
    p, axis = cache["p"], cache["axis"]
    out_shape = p.shape[:axis % p.ndim] + ((1,) if cache["keepdims"] else ()) + p.shape[axis % p.ndim + 1:]
    g = as_dout(dout, out_shape, p.dtype)
    return {"x": p * (g if cache["keepdims"] else np.expand_dims(g, axis))}


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample_x(rng, size):
    shape = (2, 3, 5) if size == "tiny" else (3, 4, 17)
    return rng.standard_normal(shape) * 2.0


def _sample_softmax(rng, size):
    x = _sample_x(rng, size)
    mask = rng.random(x.shape[-1:]) > 0.3
    mask[0] = True
    return Sample(inputs={"x": x}, config={"mask": mask, "axis": -1})


def _check_rows_sum_to_one(rng):
    x = rng.standard_normal((4, 7)) * 50
    p = softmax(x)
    assert np.allclose(p.sum(-1), 1.0, rtol=0, atol=1e-14), "rows do not sum to 1"
    return float(np.abs(p.sum(-1) - 1).max())


def _check_fully_masked(rng):
    x = rng.standard_normal((3, 5))
    mask = np.ones((3, 5), bool)
    mask[1] = False
    p, cache = softmax_forward(x, mask=mask)
    dx = softmax_backward(rng.standard_normal(p.shape), cache)["x"]
    assert np.all(p[1] == 0) and np.all(dx[1] == 0), "fully masked row is not 0 with 0 gradient"
    assert np.isfinite(p).all() and np.isfinite(dx).all()
    return 0.0


def _check_huge_logits(rng):
    x = np.array([[1e4, -1e4, 0.0], [-1e4, -1e4, -1e4]])
    p = softmax(x)
    assert np.isfinite(p).all()
    assert np.allclose(p, [[1, 0, 0], [1 / 3, 1 / 3, 1 / 3]], atol=1e-15)
    return 0.0


def _check_bool_equals_additive(rng):
    x = rng.standard_normal((4, 6))
    keep = rng.random((4, 6)) > 0.4
    keep[:, 0] = True
    a = softmax(x, mask=keep)
    b = softmax(x, mask=np.where(keep, 0.0, -np.inf))
    assert np.array_equal(a, b)
    return 0.0


def _check_lsm_is_log_softmax(rng):
    x = rng.standard_normal((3, 6))
    y, _ = log_softmax_forward(x)
    err = float(np.abs(np.exp(y) - softmax(x)).max())
    assert err < 1e-15
    return err


def _sample_lse(rng, size):
    return Sample(inputs={"x": _sample_x(rng, size)}, config={"axis": 1})


register(
    Mechanism(
        slug="softmax", family="5-building-blocks", tier="primitive",
        title="Stable (masked) softmax; fully masked rows give 0 with 0 gradient",
        paper="standard", forward=softmax_forward, backward=softmax_backward,
        sample=_sample_softmax, docs="building-blocks.md#softmax",
        checks={"rows_sum_to_one": _check_rows_sum_to_one, "fully_masked_row": _check_fully_masked,
                "huge_logits": _check_huge_logits, "bool_equals_additive": _check_bool_equals_additive},
    ),
    Mechanism(
        slug="log_softmax", family="5-building-blocks", tier="primitive",
        title="Log-softmax", paper="standard", forward=log_softmax_forward,
        backward=log_softmax_backward, sample=lambda rng, size: Sample({"x": _sample_x(rng, size)}),
        docs="building-blocks.md#softmax", checks={"exp_is_softmax": _check_lsm_is_log_softmax},
    ),
    Mechanism(
        slug="logsumexp", family="5-building-blocks", tier="primitive",
        title="Log-sum-exp", paper="standard", forward=logsumexp_forward,
        backward=logsumexp_backward, sample=_sample_lse, docs="building-blocks.md#softmax",
    ),
)
