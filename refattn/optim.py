"""A small NumPy Adam optimiser for the demonstrations (training with refattn's own backwards)."""

from __future__ import annotations

import numpy as np

__all__ = ["Adam"]


class Adam:
    r"""Adam (Kingma & Ba, 2015) over a dict of NumPy parameters, updated in place.

    $m \leftarrow \beta_1 m + (1-\beta_1) g$, $v \leftarrow \beta_2 v + (1-\beta_2) g^2$,
    $\theta \leftarrow \theta - \eta\,\hat m/(\sqrt{\hat v}+\epsilon)$ with bias-corrected
    $\hat m = m/(1-\beta_1^t)$, $\hat v = v/(1-\beta_2^t)$; optional decoupled weight decay (AdamW).

    The optimiser owns its parameter arrays: ``step`` writes into the arrays of ``params``.
    """

    def __init__(self, params: dict[str, np.ndarray], lr: float = 1e-3, betas=(0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0):
        if lr <= 0:
            raise ValueError(f"lr must be > 0; got {lr}")
        self.params = params
        self.lr, (self.b1, self.b2), self.eps, self.wd = lr, betas, eps, weight_decay
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}
        self.t = 0

    def step(self, grads: dict[str, np.ndarray]) -> None:
        """One update from ``grads`` (same keys as ``params``; missing keys are skipped)."""
        self.t += 1
        c1 = 1 - self.b1**self.t
        c2 = 1 - self.b2**self.t
        for k, p in self.params.items():
            g = grads.get(k)
            if g is None:
                continue
            if g.shape != p.shape:
                raise ValueError(f"gradient for {k!r} has shape {g.shape}; parameter has {p.shape}")
            self.m[k] = self.b1 * self.m[k] + (1 - self.b1) * g
            self.v[k] = self.b2 * self.v[k] + (1 - self.b2) * g * g
            if self.wd:
                p *= 1 - self.lr * self.wd
            p -= self.lr * (self.m[k] / c1) / (np.sqrt(self.v[k] / c2) + self.eps)
