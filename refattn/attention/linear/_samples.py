"""Random inputs and verification helpers shared by the linear family's registry records (test-only).

A private module (so it has no API page); the names inside are public because several mechanism
modules import them.
"""

from __future__ import annotations

import numpy as np

from ...nn.softmax import softmax_lse
from .core import mT

__all__ = ["random_qkv", "fd_max_rel", "softmax_attention_reference", "topk_margin", "draw_until",
           "reference_gradient_error"]


def random_qkv(rng, size, *, same_length=True, d=None, dv=None):
    """Standard-normal ``q (B, H, N, d)``, ``k (B, H, M, d)``, ``v (B, H, M, dv)``: ``size="tiny"`` has
    ``(B, H) = (2, 2)``, ``N`` in 3..5, ``d = 3``, ``dv = 2``; ``"small"`` has ``(2, 3)``, ``N`` in
    9..16, ``d = 5``, ``dv = 4``. ``M = N`` unless ``same_length=False``."""
    if size == "tiny":
        n = int(rng.integers(3, 6))
        m = n if same_length else int(rng.integers(3, 6))
        d = d or 3
        dv = dv or 2
        shape = (2, 2)
    else:
        n = int(rng.integers(9, 17))
        m = n if same_length else int(rng.integers(7, 15))
        d = d or 5
        dv = dv or 4
        shape = (2, 3)
    q = rng.standard_normal(shape + (n, d))
    k = rng.standard_normal(shape + (m, d))
    v = rng.standard_normal(shape + (m, dv))
    return q, k, v


def fd_max_rel(forward, backward, sample):
    """Max relative error of `refattn.testing.gradcheck` (central differences) on one sample."""
    from ...testing import gradcheck  # lazy: testing imports the registry

    return gradcheck(forward, backward, sample).max_rel


def softmax_attention_reference(q, k, v):
    """Plain softmax attention $\\mathrm{softmax}(QK^\\top/\\sqrt d)\\,V$ (what Performer estimates)."""
    s = q @ mT(k) / np.sqrt(q.shape[-1])
    p, _ = softmax_lse(s, axis=-1)
    return p @ v


def topk_margin(scores, k, valid=None, axis=-1):
    """The smallest gap, over all rows, between the ``k``-th and the ``(k+1)``-th largest valid
    entry along ``axis`` (``inf`` when no row has more than ``k`` valid entries): a selection made
    with `refattn.attention.linear.core.topk_keep` is constant under perturbations below half of it."""
    s = np.moveaxis(np.asarray(scores, dtype=np.float64), axis, -1)
    if valid is not None:
        s = np.where(np.moveaxis(np.broadcast_to(valid, np.shape(scores)), axis, -1), s, -np.inf)
    if k >= s.shape[-1]:
        return np.inf
    srt = -np.sort(-s, axis=-1)
    a, b = srt[..., k - 1], srt[..., k]
    with np.errstate(invalid="ignore"):
        gap = np.where(np.isfinite(b), a - b, np.inf)
    return float(np.min(gap))


def draw_until(rng, draw, margin, minimum, tries=2000):
    """Call ``draw(rng)`` until ``margin(result) >= minimum`` (a sampler that keeps selections
    away from ties and breakpoints); raises ``RuntimeError`` after ``tries`` draws."""
    for _ in range(tries):
        out = draw(rng)
        if margin(out) >= minimum:
            return out
    raise RuntimeError(f"no draw with margin >= {minimum} in {tries} tries")


def reference_gradient_error(forward, backward, reference, sample, rng, eps=1e-5):
    """Relative error between the fast form's analytic directional derivative
    $\\sum_a\\langle\bar a, u_a\rangle$ (``backward`` at upstream gradient ``G``) and the central
    difference of the explicit form, $\\partial_t\\langle G, \\mathrm{ref}(a + tu)\rangle$, along one
    random direction ``u`` over every input and parameter: "the fast form's gradients equal the
    explicit form's" (the explicit form is differentiated numerically, so agreement is ~1e-8)."""
    arrays = sample.arrays()
    out, cache = forward(**sample.inputs, params=sample.params, **sample.config)
    G = rng.standard_normal(np.shape(out))
    g = backward(G, cache)
    u = {k: rng.standard_normal(np.shape(v)) for k, v in arrays.items()}

    def f(t):
        a = {k: v + t * u[k] for k, v in arrays.items()}
        inputs = {k: a[k] for k in sample.inputs}
        params = {k: a[k] for k in (sample.params or {})}
        return float(np.sum(G * reference(**inputs, params=params, **sample.config)))

    fd = (f(eps) - f(-eps)) / (2 * eps)
    an = sum(float(np.sum(g[k] * u[k])) for k in arrays)
    return abs(fd - an) / max(abs(an), 1e-12)
