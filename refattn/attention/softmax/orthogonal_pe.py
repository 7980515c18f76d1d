r"""Orthogonal-basis (Legendre) absolute positional encoding, added to the token embeddings.

Paper: Li, "Theoretical Analysis of Positional Encodings in Transformer Models: Impact on
Expressiveness and Generalization", arXiv 2506.06398 (2025). It proposes positional encodings built
from orthogonal function families (Legendre polynomials, wavelets). No code is public, and refattn
could read only the abstract and introduction: the encodings' exact construction and normalisation
are not in what it could read. **This module is a reconstruction** (catalogue entry
``orthogonal_basis_positional_encoding``, T3): the Legendre encoding in its simplest reading, with the
open choices as keywords. The wavelet variant is not implemented (which wavelet, scales and
translations per channel is not defined in the readable sources).

Forward (reconstruction)
------------------------
Positions $p$ (real, so a learned or continuous time stamp works too; integer token indices
$0, \dots, N-1$ are the usual case) are mapped to $[-1, 1]$ by $u = 2p/(L - 1) - 1$ with the
reference length $L$ (``length``; default the sequence length $N$ of the call; positions beyond
$L - 1$ extrapolate outside $[-1, 1]$). Channel $j = 0, \dots, D-1$ of the encoding is the Legendre
polynomial of degree $j$, scaled by $c_j$:

$$\mathrm{PE}(p)_j = c_j\,P_j(u),\qquad c_j = 1\ (\texttt{normalization="none"})\ \text{or}\ \sqrt{(2j+1)/2}\ (\texttt{"orthonormal"}),$$

evaluated by Bonnet's recurrence $P_0 = 1$, $P_1 = u$, $(j+1)P_{j+1} = (2j+1)uP_j - jP_{j-1}$, and
$y = x + \mathrm{PE}(p)$ (the catalogue's "added to embeddings"). With ``"orthonormal"`` the channels
are orthonormal in $L^2[-1, 1]$ (checked with Gauss–Legendre quadrature).

Backward (derivation)
---------------------
$dx = dy$. The positions receive $dp = \frac{2}{L-1}\sum_j dy_j\,c_j\,P_j'(u)$, with the derivatives
from the recurrence $P'_{j+1} = P'_{j-1} + (2j+1)P_j$ ($P'_0 = 0$, $P'_1 = 1$), which, unlike
$(1-u^2)P_j' = j(P_{j-1} - uP_j)$, has no singularity at $u = \pm1$. $L$ is a configuration constant
(when it defaults to $N$ it does not depend on $p$).
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, check_choice, compute_dtype
from ...registry import Mechanism, Sample, register
from .core import check_size

__all__ = [
    "LEGENDRE_NORMALIZATIONS",
    "legendre_basis",
    "legendre_pe",
    "legendre_pe_forward",
    "legendre_pe_backward",
]

LEGENDRE_NORMALIZATIONS = ("none", "orthonormal")


def legendre_basis(u, degree_count: int, *, derivative: bool = False):
    """Legendre polynomials $P_0, \\dots, P_{D-1}$ at ``u`` (``(..., D)``), and their derivatives if asked."""
    d = check_size(degree_count, "degree_count")
    u = np.asarray(u)
    vals = np.empty(u.shape + (d,), dtype=np.result_type(u.dtype, np.float32))
    ders = np.zeros_like(vals) if derivative else None
    vals[..., 0] = 1.0
    if d > 1:
        vals[..., 1] = u
        if derivative:
            ders[..., 1] = 1.0
    for j in range(1, d - 1):
        vals[..., j + 1] = ((2 * j + 1) * u * vals[..., j] - j * vals[..., j - 1]) / (j + 1)
        if derivative:
            ders[..., j + 1] = ders[..., j - 1] + (2 * j + 1) * vals[..., j]
    return (vals, ders) if derivative else vals


def _scale(d, normalization, dt):
    if normalization == "orthonormal":
        return np.sqrt((2 * np.arange(d) + 1) / 2.0).astype(dt)
    return np.ones(d, dtype=dt)


def legendre_pe_forward(x, positions, *, length=None, normalization: str = "none"):
    r"""Token embeddings plus the Legendre positional encoding of ``positions`` (reconstruction).

    Parameters
    ----------
    x : array (B, N, D)
        Token embeddings.
    positions : array (N,) or (B, N)
        Real positions (e.g. ``np.arange(N)``); differentiated.
    length : int, optional
        Reference length $L \ge 2$ of the map $u = 2p/(L-1) - 1$; default $N$ (then $N \ge 2$).
    normalization : {"none", "orthonormal"}
        $c_j = 1$ or $\sqrt{(2j+1)/2}$.

    Returns
    -------
    y, cache
        ``y`` of shape (B, N, D).
    """
    x = as_float(x, "x", ndim=3)
    b, n, d = x.shape
    p = as_float(positions, "positions", min_ndim=1, max_ndim=2)
    if p.shape not in ((n,), (b, n)):
        raise ValueError(f"positions must have shape (N,) = ({n},) or (B, N) = ({b}, {n}); got {p.shape}")
    check_choice(normalization, "normalization", LEGENDRE_NORMALIZATIONS)
    big_l = n if length is None else length
    big_l = check_size(big_l, "length" if length is not None else "length (default: the sequence length N)", 2)
    dt = compute_dtype(x, p)
    x, p = x.astype(dt, copy=False), p.astype(dt, copy=False)
    u = 2.0 * p / (big_l - 1) - 1.0
    vals, ders = legendre_basis(u, d, derivative=True)
    c = _scale(d, normalization, dt)
    y = x + np.broadcast_to(vals * c, (b, n, d))
    cache = {"ders": ders * c, "l": big_l, "p_shape": p.shape, "shape": y.shape, "dt": dt}
    return y, cache


def legendre_pe_backward(dout, cache):
    """Gradient of :func:`legendre_pe_forward`: ``x`` (identity) and ``positions`` (derivative recurrence)."""
    g = as_dout(dout, cache["shape"], cache["dt"])
    dp = (g * cache["ders"]).sum(-1) * (2.0 / (cache["l"] - 1))
    if cache["p_shape"] != dp.shape:
        dp = dp.sum(0)
    return {"x": g.copy(), "positions": dp}


def legendre_pe(x, positions, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`legendre_pe_forward`."""
    return legendre_pe_forward(x, positions, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size):
    n, d = (int(rng.integers(3, 6)), 4) if size == "tiny" else (int(rng.integers(6, 12)), 9)
    cfg = {"normalization": str(rng.choice(LEGENDRE_NORMALIZATIONS))}
    if rng.random() < 0.5:
        cfg["length"] = int(n + rng.integers(0, 4))
    big_l = cfg.get("length", n)
    shape = (2, n)                                     # axis 0 is the batch axis ((N,) is tested separately)
    pos = rng.uniform(0, big_l - 1, shape) if rng.random() < 0.7 else np.broadcast_to(np.arange(n, dtype=float), shape).copy()
    return Sample(inputs={"x": rng.standard_normal((2, n, d)), "positions": pos}, config=cfg)


def _reference(x, positions, *, length=None, normalization="none"):
    # numpy's Legendre Vandermonde matrix (a different evaluation) and the explicit scale per channel.
    b, n, d = x.shape
    big_l = n if length is None else length
    u = 2.0 * np.broadcast_to(positions, (b, n)) / (big_l - 1) - 1.0
    v = np.polynomial.legendre.legvander(u, d - 1)
    if normalization == "orthonormal":
        v = v * np.sqrt((2 * np.arange(d) + 1) / 2.0)
    return x + v


def _check_orthonormal_on_interval(rng):
    # Gauss-Legendre quadrature: int_{-1}^{1} PE_i PE_j du = delta_ij for the orthonormal scaling.
    d = int(rng.integers(4, 12))
    nodes, weights = np.polynomial.legendre.leggauss(d + 2)
    vals = legendre_basis(nodes, d) * np.sqrt((2 * np.arange(d) + 1) / 2.0)
    gram = (vals * weights[:, None]).T @ vals
    err = float(np.abs(gram - np.eye(d)).max())
    assert err < 1e-12, err
    return err


def _check_endpoints_and_derivative(rng):
    # P_j(1) = 1, P_j(-1) = (-1)^j, P_j'(1) = j(j+1)/2: the derivative recurrence is exact at the endpoints.
    d = 10
    vals, ders = legendre_basis(np.array([1.0, -1.0]), d, derivative=True)
    j = np.arange(d)
    errs = [np.abs(vals[0] - 1).max(), np.abs(vals[1] - (-1.0) ** j).max(), np.abs(ders[0] - j * (j + 1) / 2).max()]
    err = float(max(errs))
    assert err < 1e-12, errs
    return err


register(
    Mechanism(
        slug="orthogonal_basis_positional_encoding", family="1-softmax", tier="T3",
        title="Orthogonal-function positional encodings (Legendre, wavelets)",
        paper="Li, Theoretical Analysis of Positional Encodings in Transformer Models: Impact on Expressiveness and "
              "Generalization, arXiv 2506.06398 (2025)",
        forward=legendre_pe_forward, backward=legendre_pe_backward, sample=_sample, reference=_reference,
        docs="softmax/positional-encodings.md#orthogonal-basis-legendre-positional-encoding",
        checks={"orthonormal_on_interval": _check_orthonormal_on_interval,
                "endpoints_and_derivative": _check_endpoints_and_derivative},
    ),
)
