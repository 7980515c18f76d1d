r"""Two-level overlapping Schwarz (domain-decomposition) attention.

Paper: Köhler & Rheinbach, "Hierarchical Attention via Domain Decomposition", arXiv 2606.18525
(2026). No code is public; the abstract (and the catalogue) state the operator exactly:

$$M_\theta^{-1} = \Phi\,Q_0K_0^\top\Phi^\top + \sum_{i=1}^{N} R_i^\top D_i^{1/2}\,Q_iK_i^\top\,D_i^{1/2}R_i,
\qquad u = M_\theta^{-1} f,$$

a softmax-free, low-rank attention per overlapping subdomain (restriction $R_i\in\{0,1\}^{n_i\times n}$,
partition-of-unity weights $D_i$ with $\sum_i R_i^\top D_iR_i = I$, ranks $r$) plus a coarse
block through the prolongation $\Phi\in\mathbb R^{n\times n_c}$ (rank $r_0$). The baseline global
attention $u = QK^\top f$ is the case of one subdomain covering everything and no coarse level.
The setting is finite-dimensional operator learning: the layer learns the inverse of an SPD
matrix (1-D $-u''=f$, homogeneous Dirichlet), so the map is linear in $f$ and $Q_i, K_i, Q_0, K_0$
are free parameters (reconstruction: the paper's text beyond the abstract was not available; a
linear solution operator admits no feature-dependent $Q, K$).

Construction helpers (the classical choices, all configurable): :func:`overlapping_subdomains`
(intervals of a 1-D grid extended by ``overlap`` nodes), :func:`partition_of_unity` (multiplicity
weights $1/\#\{i : j\in\Omega_i\}$, the usual restricted/additive-Schwarz scaling) and
:func:`coarse_hat_basis` (piecewise-linear hats on a coarse grid, zero at the Dirichlet
boundary). With $Q_iK_i^\top = (R_iAR_i^\top)^{-1}$ and $Q_0K_0^\top = (\Phi^\top A\Phi)^{-1}$ the
layer is the (scaled) two-level additive Schwarz preconditioner of $A$, whose condition number
$\kappa(M^{-1}A)$ stays bounded as subdomains are added while the one-level method's grows — the
structure the attention inherits (checked).

Backward
--------
Everything is linear. For subdomain $i$ with $f_i = D_i^{1/2}R_if$, $t_i = K_i^\top f_i$,
$u \mathrel{+}= R_i^\top D_i^{1/2}Q_it_i$ and $g_i = D_i^{1/2}R_i\,\partial L/\partial u$:

$$dQ_i = \textstyle\sum g_i t_i^\top,\quad dt_i = Q_i^\top g_i,\quad dK_i = \sum f_i\,dt_i^\top,\quad
df \mathrel{+}= R_i^\top D_i^{1/2}K_i\,dt_i,$$

summed over the batch and channels; the coarse block is the same with $R_i^\top D_i^{1/2}$ replaced
by $\Phi$.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_int, check_params, compute_dtype
from ..registry import Mechanism, Sample, register

__all__ = ["schwarz_attention_forward", "schwarz_attention_backward", "schwarz_attention",
           "overlapping_subdomains", "partition_of_unity", "coarse_hat_basis"]


def overlapping_subdomains(n: int, n_sub: int, overlap: int = 1) -> list:
    """Index sets of ``n_sub`` contiguous intervals of ``range(n)`` (as equal as possible), each
    extended by ``overlap`` nodes on both sides (clipped at the boundary)."""
    n = check_int(n, "n", minimum=1)
    n_sub = check_int(n_sub, "n_sub", minimum=1)
    overlap = check_int(overlap, "overlap", minimum=0)
    if n_sub > n:
        raise ValueError(f"n_sub ({n_sub}) must not exceed n ({n})")
    b = np.linspace(0, n, n_sub + 1).round().astype(int)
    return [np.arange(max(b[i] - overlap, 0), min(b[i + 1] + overlap, n)) for i in range(n_sub)]


def partition_of_unity(subdomains, n: int) -> list:
    r"""Multiplicity weights $D_i = \mathrm{diag}(1/m_j)_{j\in\Omega_i}$, $m_j$ the number of
    subdomains containing node $j$, so that $\sum_i R_i^\top D_iR_i = I$."""
    mult = np.zeros(check_int(n, "n", minimum=1))
    for s in subdomains:
        mult[np.asarray(s)] += 1
    if np.any(mult == 0):
        raise ValueError(f"subdomains do not cover nodes {np.flatnonzero(mult == 0).tolist()}")
    return [1.0 / mult[np.asarray(s)] for s in subdomains]


def coarse_hat_basis(n: int, n_coarse: int) -> np.ndarray:
    r"""Prolongation $\Phi$ $(n, n_c)$: piecewise-linear hats of the coarse nodes
    $X_k = k/(n_c+1)$ evaluated at the fine nodes $x_j = j/(n+1)$ (interior nodes of $[0,1]$,
    homogeneous Dirichlet)."""
    n = check_int(n, "n", minimum=1)
    n_coarse = check_int(n_coarse, "n_coarse", minimum=1)
    x = np.arange(1, n + 1) / (n + 1)
    xc = np.arange(1, n_coarse + 1) / (n_coarse + 1)
    return np.maximum(0.0, 1.0 - np.abs(x[:, None] - xc[None]) * (n_coarse + 1))


def _validate(f, params, subdomains, pu_weights, coarse_basis):
    f = as_float(f, "f", min_ndim=2, max_ndim=3)
    n = f.shape[1]
    if not isinstance(subdomains, (list, tuple)):
        raise TypeError(f"subdomains must be a list of index arrays; got {type(subdomains).__name__}")
    if not isinstance(pu_weights, (list, tuple)) or len(pu_weights) != len(subdomains):
        raise ValueError(f"pu_weights must be a list with one weight vector per subdomain ({len(subdomains)})")
    subs, weights = [], []
    cover = np.zeros(n)
    for i, (s, w) in enumerate(zip(subdomains, pu_weights)):
        s = np.asarray(s)
        if s.dtype.kind not in "iu" or s.ndim != 1 or s.size == 0 or s.min() < 0 or s.max() >= n \
                or np.unique(s).size != s.size:
            raise ValueError(f"subdomains[{i}] must be distinct integer node indices in [0, {n}); got {s!r}")
        w = as_float(w, f"pu_weights[{i}]", ndim=1)
        if w.shape != s.shape or np.any(w < 0):
            raise ValueError(f"pu_weights[{i}] must be {s.size} non-negative weights; got shape {w.shape}")
        np.add.at(cover, s, w)
        subs.append(s)
        weights.append(w)
    if subs and not np.allclose(cover, 1.0, rtol=0, atol=1e-10):
        raise ValueError("pu_weights must be a partition of unity: sum_i R_i^T D_i R_i = I "
                         f"(max defect {np.abs(cover - 1).max():.2e})")
    spec = {}
    for i, s in enumerate(subs):
        q = as_float(params.get(f"local.{i}.Q", np.zeros((1, 1))) if isinstance(params, dict) else params,
                     f"local.{i}.Q", ndim=2)
        spec[f"local.{i}.Q"] = spec[f"local.{i}.K"] = (s.size, q.shape[1])
    phi = None
    if coarse_basis is not None:
        phi = as_float(coarse_basis, "coarse_basis", ndim=2)
        if phi.shape[0] != n:
            raise ValueError(f"coarse_basis must have shape (n={n}, n_coarse); got {phi.shape}")
        q0 = as_float(params.get("coarse.Q", np.zeros((1, 1))) if isinstance(params, dict) else params,
                      "coarse.Q", ndim=2)
        spec["coarse.Q"] = spec["coarse.K"] = (phi.shape[1], q0.shape[1])
    if not spec:
        raise ValueError("give at least one subdomain or a coarse_basis")
    p = check_params(params, spec)
    dt = compute_dtype(f, *p.values())          # structure (weights, basis) follows the data dtype
    return f.astype(dt, copy=False), cast_all(dt, p), subs, [np.sqrt(w).astype(dt) for w in weights], \
        None if phi is None else phi.astype(dt)


def _blocks(subs, sqrt_w, phi):
    """(key, gather, scale) of every block: subdomain i acts on f[:, idx] scaled by sqrt(D_i)."""
    out = [(f"local.{i}", s, w[:, None]) for i, (s, w) in enumerate(zip(subs, sqrt_w))]
    if phi is not None:
        out.append(("coarse", None, phi))
    return out


def schwarz_attention_forward(f, params, *, subdomains, pu_weights, coarse_basis=None):
    r"""$u = \Phi Q_0K_0^\top\Phi^\top f + \sum_i R_i^\top D_i^{1/2}Q_iK_i^\top D_i^{1/2}R_if$.

    Parameters
    ----------
    f : array (B, n) or (B, n, c)
        Right-hand sides on the $n$ nodes (``c`` channels are independent right-hand sides).
    params : dict
        ``local.{i}.Q``, ``local.{i}.K`` $(n_i, r)$ per subdomain and, with a coarse level,
        ``coarse.Q``, ``coarse.K`` $(n_c, r_0)$.
    subdomains : list of int arrays
        Node indices of every overlapping subdomain ($R_i$).
    pu_weights : list of arrays
        Diagonal of $D_i$ per subdomain; must satisfy $\sum_iR_i^\top D_iR_i = I$.
    coarse_basis : array (n, n_c), optional
        The coarse prolongation $\Phi$ (:func:`coarse_hat_basis`); None: one-level.

    Returns
    -------
    out, cache
        ``out`` with ``f``'s shape.
    """
    f, p, subs, sqrt_w, phi = _validate(f, params, subdomains, pu_weights, coarse_basis)
    f3 = f if f.ndim == 3 else f[..., None]
    out = np.zeros_like(f3)
    cache_blocks = []
    for key, idx, scale in _blocks(subs, sqrt_w, phi):
        fi = scale * f3[:, idx] if idx is not None else np.einsum("jk,bjc->bkc", scale, f3)
        t = np.einsum("kr,bkc->brc", p[f"{key}.K"], fi)
        ui = np.einsum("kr,brc->bkc", p[f"{key}.Q"], t)
        if idx is not None:
            out[:, idx] += scale * ui
        else:
            out += np.einsum("jk,bkc->bjc", scale, ui)
        cache_blocks.append((key, idx, scale, fi, t))
    cache = dict(p=p, blocks=cache_blocks, shape=f.shape, dtype=f.dtype)
    return out.reshape(f.shape), cache


def schwarz_attention_backward(dout, cache):
    """Gradients of :func:`schwarz_attention_forward`: ``f`` and every ``Q``/``K`` (all linear)."""
    p = cache["p"]
    g = as_dout(dout, cache["shape"], cache["dtype"])
    g3 = g if g.ndim == 3 else g[..., None]
    df = np.zeros_like(g3)
    grads = {}
    for key, idx, scale, fi, t in cache["blocks"]:
        gi = scale * g3[:, idx] if idx is not None else np.einsum("jk,bjc->bkc", scale, g3)
        grads[f"{key}.Q"] = np.einsum("bkc,brc->kr", gi, t)
        dt = np.einsum("kr,bkc->brc", p[f"{key}.Q"], gi)
        grads[f"{key}.K"] = np.einsum("bkc,brc->kr", fi, dt)
        dfi = np.einsum("kr,brc->bkc", p[f"{key}.K"], dt)
        if idx is not None:
            df[:, idx] += scale * dfi
        else:
            df += np.einsum("jk,bkc->bjc", scale, dfi)
    grads["f"] = df.reshape(cache["shape"])
    return grads


def schwarz_attention(f, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`schwarz_attention_forward`."""
    return schwarz_attention_forward(f, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size):
    n, n_sub, ov, r, nc, r0 = (6, 2, 1, 2, 2, 1) if size == "tiny" else (int(rng.integers(12, 18)), 3, 2, 2, 3, 2)
    subs = overlapping_subdomains(n, n_sub, ov)
    params = {}
    for i, s in enumerate(subs):
        params[f"local.{i}.Q"] = rng.standard_normal((s.size, r)) / np.sqrt(s.size)
        params[f"local.{i}.K"] = rng.standard_normal((s.size, r)) / np.sqrt(s.size)
    params["coarse.Q"] = rng.standard_normal((nc, r0))
    params["coarse.K"] = rng.standard_normal((nc, r0))
    f = rng.standard_normal((2, n, 1)) if size == "tiny" else rng.standard_normal((2, n))
    return Sample(inputs={"f": f}, params=params,
                  config={"subdomains": subs, "pu_weights": partition_of_unity(subs, n),
                          "coarse_basis": coarse_hat_basis(n, nc)})


def _dense(params, n, subdomains, pu_weights, coarse_basis=None):
    m = np.zeros((n, n))
    for i, (s, w) in enumerate(zip(subdomains, pu_weights)):
        r = np.zeros((len(s), n))
        r[np.arange(len(s)), s] = 1.0
        dh = np.diag(np.sqrt(w))
        m += r.T @ dh @ params[f"local.{i}.Q"] @ params[f"local.{i}.K"].T @ dh @ r
    if coarse_basis is not None:
        m += coarse_basis @ params["coarse.Q"] @ params["coarse.K"].T @ coarse_basis.T
    return m


def _reference(f, params, *, subdomains, pu_weights, coarse_basis=None):
    # The assembled n x n operator M^{-1} (restriction matrices built explicitly) applied to f.
    return np.einsum("ij,bj...->bi...", _dense(params, f.shape[1], subdomains, pu_weights, coarse_basis), f)


def _laplacian(n):
    return (2 * np.eye(n) - np.eye(n, k=1) - np.eye(n, k=-1)) * (n + 1) ** 2


def _check_poisson_exact_inverse(rng):
    # One subdomain = the whole grid, D = I, Q K^T = A^{-1} (full rank): the layer solves the
    # discrete -u'' = f, u(0) = u(1) = 0 exactly; for f = sin(k pi x) the solution is
    # f / lambda_k with lambda_k = 4 (n+1)^2 sin^2(k pi / (2 (n+1))).
    n, k = 15, 3
    x = np.arange(1, n + 1) / (n + 1)
    f = np.sin(k * np.pi * x)[None]
    params = {"local.0.Q": np.linalg.inv(_laplacian(n)), "local.0.K": np.eye(n)}
    u = schwarz_attention(f, params, subdomains=[np.arange(n)], pu_weights=[np.ones(n)])
    lam = 4 * (n + 1) ** 2 * np.sin(k * np.pi / (2 * (n + 1))) ** 2
    err = float(np.abs(u - f / lam).max() / np.abs(f / lam).max())
    assert err < 1e-12, f"exact-inverse layer misses the discrete Poisson solution by {err:.2e}"
    return err


def _check_two_level_condition_number(rng):
    # Q_i K_i^T = (R_i A R_i^T)^{-1}, Q_0 K_0^T = (Phi^T A Phi)^{-1}: the layer is the two-level
    # additive Schwarz preconditioner; kappa(M^{-1} A) stays bounded as subdomains are added while
    # the one-level operator's grows (M^{-1} read off by applying the layer to the identity).
    n = 63
    a = _laplacian(n)
    kap = {}
    for n_sub in (4, 8):
        subs = overlapping_subdomains(n, n_sub, 2)
        params = {}
        for i, s in enumerate(subs):
            params[f"local.{i}.Q"], params[f"local.{i}.K"] = np.linalg.inv(a[np.ix_(s, s)]), np.eye(s.size)
        phi = coarse_hat_basis(n, n_sub - 1)
        params["coarse.Q"], params["coarse.K"] = np.linalg.inv(phi.T @ a @ phi), np.eye(n_sub - 1)
        cfg = dict(subdomains=subs, pu_weights=partition_of_unity(subs, n))
        one = {k: v for k, v in params.items() if k.startswith("local")}
        for label, prm, c in (("one", one, cfg), ("two", params, dict(cfg, coarse_basis=phi))):
            minv = schwarz_attention(np.eye(n)[None], prm, **c)[0]
            ev = np.sort(np.linalg.eigvals(minv @ a).real)
            kap[(label, n_sub)] = ev[-1] / ev[0]
    assert kap[("two", 8)] < 5 and kap[("two", 8)] < 1.2 * kap[("two", 4)], f"two-level kappa grows: {kap}"
    assert kap[("one", 8)] > 1.5 * kap[("one", 4)], f"one-level kappa does not grow: {kap}"
    return float(kap[("two", 8)])


def _check_symmetric_when_q_equals_k(rng):
    s = _sample(rng, "small")
    p = {k: s.params[k.replace(".K", ".Q")] if k.endswith(".K") else v for k, v in s.params.items()}
    n = s.inputs["f"].shape[1]
    m = schwarz_attention(np.eye(n)[None], p, **s.config)[0]
    err = float(np.abs(m - m.T).max())
    assert err < 1e-13, f"Q_i = K_i does not give a symmetric operator: {err:.2e}"
    return err


def _check_partition_of_unity(rng):
    n = int(rng.integers(10, 30))
    subs = overlapping_subdomains(n, int(rng.integers(2, 5)), int(rng.integers(0, 3)))
    acc = np.zeros((n, n))
    for s, w in zip(subs, partition_of_unity(subs, n)):
        r = np.zeros((len(s), n))
        r[np.arange(len(s)), s] = 1.0
        acc += r.T @ np.diag(w) @ r
    err = float(np.abs(acc - np.eye(n)).max())
    assert err < 1e-15, f"sum_i R_i^T D_i R_i differs from I by {err:.2e}"
    return err


register(
    Mechanism(
        slug="schwarz_domain_decomposition_attention", family="3-operator", tier="T2",
        title="Two-level overlapping Schwarz (domain-decomposition) attention",
        paper="Köhler & Rheinbach, Hierarchical Attention via Domain Decomposition, arXiv 2606.18525 (2026)",
        forward=schwarz_attention_forward, backward=schwarz_attention_backward, sample=_sample, reference=_reference,
        docs="operators/kernel-integrals-and-scans.md#two-level-schwarz-domain-decomposition-attention",
        checks={"poisson_exact_inverse": _check_poisson_exact_inverse,
                "two_level_condition_number": _check_two_level_condition_number,
                "symmetric_when_q_equals_k": _check_symmetric_when_q_equals_k,
                "partition_of_unity": _check_partition_of_unity},
    ),
)
