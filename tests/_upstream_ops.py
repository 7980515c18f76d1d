"""PyTorch modules written from the upstream operator files, for the fidelity tests.

Each ``build_*`` helper returns ``(module, mapping)``: a float64 ``torch.nn.Module`` re-stated
from the cited upstream file (our own code, not a copy: the formulas carry over, the code does
not), and ``mapping``, a dict ``refattn_param_key -> (torch_parameter, to_refattn)`` where
``to_refattn`` turns the torch tensor (or its ``.grad``) into refattn's layout (e.g. the
``nn.Linear`` transpose). :func:`compare_module` runs the module and the refattn forward/backward
side by side and returns the largest relative errors of the output and of every gradient; it is
written so that ``refattn.interop.torch.check_module`` can take it over.

Where the upstream installs from PyPI (neuraloperator), the tests use the real module instead.
"""

from __future__ import annotations

import numpy as np


def linear_t(t):
    """``nn.Linear.weight`` (out, in) -> refattn ``(in, out)``."""
    return t.detach().numpy().T.copy()


def same(t):
    return t.detach().numpy().copy()


def rel_err(a, b) -> float:
    a, b = np.asarray(a), np.asarray(b)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-300))


def compare_module(torch, module, mapping, forward, backward, inputs, *, config=None, call=None,
                   input_grads=None, seed=0):
    """Run ``module`` and refattn's ``forward``/``backward`` on the same float64 ``inputs``.

    ``inputs`` maps refattn input names to arrays; ``call(module, tensors)`` runs the module
    (default ``module(**tensors)``); ``input_grads`` names the inputs whose gradients are compared
    (default: all). Returns ``{"out": err, "<name>": err, ...}`` (relative max errors)."""
    config = config or {}
    tens = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in inputs.items()}
    out_t = call(module, tens) if call is not None else module(**tens)
    params = {k: f(p) for k, (p, f) in mapping.items()}
    out, cache = forward(**inputs, params=params, **config)
    g = np.random.default_rng(seed).standard_normal(out.shape)
    out_t.backward(torch.tensor(g))
    grads = backward(g, cache)
    errs = {"out": rel_err(out, out_t.detach().numpy())}
    for k in input_grads if input_grads is not None else inputs:
        errs[k] = rel_err(grads[k], tens[k].grad.numpy())
    for k, (p, f) in mapping.items():
        ref = f(p.grad) if p.grad is not None else np.zeros_like(params[k])
        errs[k] = rel_err(grads[k], ref) if np.abs(ref).max() > 0 else float(np.abs(grads[k]).max())
    return errs


# ------------------------------------------------------------------------------------------ ONO


def build_ono_orth(torch, mu, residual=True):
    """xzppp/ONO ``ONOmodel2.py`` @ 8e4eee8 ``ONOBlock.forward`` (``orth=True``, training): the
    orthogonal-attention line with ``psi = proj(x)`` and ``fx`` as inputs; ``residual=False`` is
    commit 86e1bfe (``#+ fx``)."""
    nn = torch.nn

    class OrthCore(nn.Module):
        def __init__(self):
            super().__init__()
            self.mu = nn.Parameter(torch.tensor(mu, dtype=torch.float64))

        def forward(self, psi, fx):
            cov = torch.einsum("blc,bld->cd", psi, psi) / psi.shape[0] / psi.shape[1]
            lt = torch.linalg.cholesky(cov)
            w = psi @ lt.inverse().transpose(-2, -1)
            out = (w * torch.nn.functional.softplus(self.mu)) @ (w.transpose(-2, -1) @ fx)
            return out + fx if residual else out

    m = OrthCore()
    return m, {"mu": (m.mu, same)}
