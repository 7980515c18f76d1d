"""Random inputs and verification helpers shared by the linear family's registry records (test-only).

A private module (so it has no API page); the names inside are public because several mechanism
modules import them.
"""

from __future__ import annotations

import numpy as np

from ...nn.softmax import softmax_lse
from .core import mT

__all__ = ["random_qkv", "fd_max_rel", "softmax_attention_reference"]


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
