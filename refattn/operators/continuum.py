r"""Continuum (function-space) attention discretised with quadrature weights.

Paper: Calvello, Kovachki, Levine, Stuart, "Continuum Attention for Neural Operators", 2024.
No official code is named in the catalogue; the formula below is the paper's
operator and its standard quadrature discretisation.

Operator
--------
For functions $u$ on a domain $D$ with (pointwise) query/key/value maps $Q, K, V$,

$$(\mathcal A u)(x) = \int_D \frac{\exp\big(\langle Qu(x), Ku(y)\rangle s\big)}
{\int_D \exp\big(\langle Qu(x), Ku(z)\rangle s\big)\,dz}\; Vu(y)\,dy,\qquad s = 1/\sqrt d .$$

With nodes $y_j$ and quadrature weights $w_j > 0$ ($\int_D f \approx \sum_j w_j f(y_j)$) both
integrals are discretised by the same rule:

$$\mathrm{out}_i = \frac{\sum_j w_j e^{S_{ij}} v_j}{\sum_j w_j e^{S_{ij}}}
= \sum_j \mathrm{softmax}_j\big(S_{ij} + \log w_j\big)\,v_j,\qquad S_{ij} = s\,q_i\cdot k_j .$$

Uniform weights cancel (standard attention); the output is invariant to a common scale of the
weights, so only *relative* cell sizes matter. On a non-uniform mesh the weights are what makes the
discrete layer converge to the operator under refinement — unweighted attention over-counts dense
regions (the ``two_resolutions`` check measures both).

Backward
--------
This is SDPA with the constant additive bias $B_{ij} = \log w_j$, so the VJP is
:func:`refattn.attention.softmax.attention_core_backward` (with $P$ the weighted attention
matrix): $dV = P^\top G$, $dS = P\odot(GV^\top - \mathrm{rowsum}(P\odot GV^\top))$,
$dQ = s\,dS\,K$, $dK = s\,dS^\top Q$. The weights are configuration (a mesh property), not a
differentiable input; were they learned, $\partial L/\partial w_j = \sum_i dS_{ij}/w_j$.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_float, check_positive
from ..attention.softmax import attention_core_backward, attention_core_forward
from ..registry import Mechanism, Sample, register

__all__ = ["continuum_attention_forward", "continuum_attention_backward", "continuum_attention",
           "trapezoid_weights"]


def _validate_weights(quad_weights, q, k):
    w = as_float(quad_weights, "quad_weights", min_ndim=1, max_ndim=2)
    m = k.shape[-2]
    if w.shape[-1] != m:
        raise ValueError(f"quad_weights must have M={m} entries on its last axis (one per key node); "
                         f"got shape {w.shape}")
    if w.ndim == 2 and w.shape[0] != q.shape[0]:
        raise ValueError(f"quad_weights of shape (B, M) must have B={q.shape[0]}; got {w.shape}")
    if not np.all(w > 0):
        raise ValueError("quad_weights must be > 0 (quadrature weights of the key nodes)")
    return w


def continuum_attention_forward(q, k, v, *, quad_weights, scale=None):
    r"""$\mathrm{out}_i = \sum_j \mathrm{softmax}_j(s\,q_i\cdot k_j + \log w_j)\,v_j$.

    Parameters
    ----------
    q : array (B, H, N, d)
        Queries at the N output points.
    k : array (B, H, M, d), v : array (B, H, M, dv)
        Keys and values at the M quadrature nodes.
    quad_weights : array (M,) or (B, M), > 0
        Quadrature weight of every key node (a cell size, a trapezoid weight, a Monte-Carlo
        $1/(M p(y_j))$). Any positive common factor is irrelevant.
    scale : float, optional
        Score scale; default $1/\sqrt d$.

    Returns
    -------
    out, cache
        ``out (B, H, N, dv)``.
    """
    q = as_float(q, "q", ndim=4)
    k = as_float(k, "k", ndim=4)
    v = as_float(v, "v", ndim=4)
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"batch of q ({q.shape[0]}) and k ({k.shape[0]}) must agree")
    w = _validate_weights(quad_weights, q, k)
    check_positive(scale, "scale", allow_none=True)
    logw = np.log(w.astype(np.float64))
    logw = logw[None, None, None, :] if logw.ndim == 1 else logw[:, None, None, :]
    # log w enters as a constant additive score term (an additive attn_mask of the core).
    return attention_core_forward(q, k, v, attn_mask=logw, scale=scale)


def continuum_attention_backward(dout, cache):
    """Gradients ``{"q", "k", "v"}`` (the weights are constant, see the module docstring)."""
    return attention_core_backward(dout, cache)


def continuum_attention(q, k, v, *, quad_weights, scale=None) -> np.ndarray:
    """Convenience wrapper: the output of :func:`continuum_attention_forward`."""
    return continuum_attention_forward(q, k, v, quad_weights=quad_weights, scale=scale)[0]


def trapezoid_weights(nodes: np.ndarray, *, periodic_length: float | None = None) -> np.ndarray:
    """Trapezoid-rule weights of sorted 1-D nodes (``periodic_length`` closes the interval)."""
    y = np.asarray(nodes, dtype=np.float64)
    if y.ndim != 1 or y.size < 2 or np.any(np.diff(y) <= 0):
        raise ValueError("nodes must be a strictly increasing 1-D array of at least 2 points")
    if periodic_length is not None:
        gaps = np.diff(np.concatenate([y, [y[0] + periodic_length]]))
        return 0.5 * (gaps + np.roll(gaps, 1))
    h = np.diff(y)
    w = np.zeros_like(y)
    w[:-1] += h / 2
    w[1:] += h / 2
    return w


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _explicit(q, k, v, *, quad_weights, scale=None):
    s = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    w = np.asarray(quad_weights, dtype=np.float64)
    w = w[None, None, None, :] if w.ndim == 1 else w[:, None, None, :]
    sc = s * np.einsum("bhnd,bhmd->bhnm", q, k)
    e = w * np.exp(sc - sc.max(axis=-1, keepdims=True))
    return np.einsum("bhnm,bhme->bhne", e / e.sum(-1, keepdims=True), v)


def _sample(rng, size):
    if size == "tiny":
        b, h, n, m, d, dv = 2, 1, int(rng.integers(2, 4)), int(rng.integers(3, 6)), 3, 2
    else:
        b, h, n, m, d, dv = 2, 2, int(rng.integers(5, 9)), int(rng.integers(7, 13)), 4, 3
    w = rng.uniform(0.05, 1.0, (b, m))     # strongly non-uniform, per batch element
    return Sample(inputs={"q": rng.standard_normal((b, h, n, d)), "k": rng.standard_normal((b, h, m, d)),
                          "v": rng.standard_normal((b, h, m, dv))},
                  config={"quad_weights": w})


def _check_uniform_is_sdpa(rng):
    q, k, v = rng.standard_normal((2, 2, 4, 3)), rng.standard_normal((2, 2, 6, 3)), rng.standard_normal((2, 2, 6, 2))
    s = 1 / np.sqrt(3)
    sc = s * q @ np.swapaxes(k, -1, -2)
    p = np.exp(sc - sc.max(-1, keepdims=True))
    ref = (p / p.sum(-1, keepdims=True)) @ v
    err = max(float(np.abs(continuum_attention(q, k, v, quad_weights=np.full(6, c)) - ref).max())
              for c in (1.0, 1 / 6, 37.0))
    assert err < 1e-13, f"uniform weights differ from plain softmax attention by {err:.2e}"
    return err


def _check_node_splitting(rng):
    # Replacing node j by two identical copies of weight w_j/2 each is the same quadrature rule.
    q, k, v = rng.standard_normal((1, 2, 3, 4)), rng.standard_normal((1, 2, 5, 4)), rng.standard_normal((1, 2, 5, 3))
    w = rng.uniform(0.1, 1.0, 5)
    j = 2
    k2 = np.concatenate([k, k[:, :, j:j + 1]], axis=2)
    v2 = np.concatenate([v, v[:, :, j:j + 1]], axis=2)
    w2 = np.concatenate([w, [w[j] / 2]])
    w2[j] = w[j] / 2
    err = float(np.abs(continuum_attention(q, k, v, quad_weights=w)
                       - continuum_attention(q, k2, v2, quad_weights=w2)).max())
    assert err < 1e-13, f"node splitting changed the output by {err:.2e}"
    return err


def _fields(y):
    """Smooth key/value functions on [0, 1] (d = 2, dv = 2), shaped (1, 1, M, .)."""
    k = np.stack([np.sin(2 * np.pi * y), np.cos(2 * np.pi * y)], -1)
    v = np.stack([y**2, np.cos(3 * y)], -1)
    return k[None, None], v[None, None]


def _check_two_resolutions(rng):
    # Two non-uniform meshes (nodes clustered at 0) of different resolution approximate the same
    # integral operator; with trapezoid weights both are within O(h^2) of a fine uniform reference,
    # while unweighted attention converges to a different (density-biased) operator.
    q = rng.standard_normal((1, 1, 5, 2)) * 1.5
    yr = np.linspace(0, 1, 20001)
    kr, vr = _fields(yr)
    ref = continuum_attention(q, kr, vr, quad_weights=trapezoid_weights(yr))
    errs, biased = [], []
    for m in (200, 400):
        y = np.linspace(0, 1, m) ** 2
        k, v = _fields(y)
        errs.append(float(np.abs(continuum_attention(q, k, v, quad_weights=trapezoid_weights(y)) - ref).max()))
        biased.append(float(np.abs(continuum_attention(q, k, v, quad_weights=np.ones(m)) - ref).max()))
    assert errs[1] < 1e-4 and errs[1] < errs[0] / 3, f"weighted errors {errs} do not converge at O(h^2)"
    assert min(biased) > 1e-2, f"unweighted attention unexpectedly accurate on a non-uniform mesh: {biased}"
    return errs[1]


def _check_permutation(rng):
    s = _sample(rng, "small")
    q, k, v = (s.inputs[n] for n in "qkv")
    w = s.config["quad_weights"]
    pk, pq = rng.permutation(k.shape[2]), rng.permutation(q.shape[2])
    base = continuum_attention(q, k, v, quad_weights=w)
    perm = continuum_attention(q[:, :, pq], k[:, :, pk], v[:, :, pk], quad_weights=w[:, pk])
    err = float(np.abs(perm - base[:, :, pq]).max())
    assert err < 1e-13, f"permuting nodes (with their weights) changed the output by {err:.2e}"
    return err


register(
    Mechanism(
        slug="continuum_attention_quadrature", family="3-operator", tier="T1",
        title="Continuum attention: softmax attention with quadrature weights log w_j on the key side",
        paper="Calvello, Kovachki, Levine, Stuart, Continuum Attention for Neural Operators, 2024",
        forward=continuum_attention_forward, backward=continuum_attention_backward, sample=_sample,
        reference=_explicit, docs="neural-operators.md#continuum-attention-with-quadrature-weights",
        checks={"uniform_weights_is_sdpa": _check_uniform_is_sdpa, "node_splitting": _check_node_splitting,
                "two_resolutions": _check_two_resolutions, "permutation_equivariance": _check_permutation},
    ),
)
