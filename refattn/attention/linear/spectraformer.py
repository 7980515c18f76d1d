r"""Spectraformer: random-feature linear attention as a weight matrix $W$ times a component function $f$.

Nguyen, Joshi, Salim, "Spectraformer: A Unified Random Feature Framework for Transformer",
ACM TIST 2025, arXiv 2405.15310. Upstream: ``cruiseresearchgroup/spectraformer``
``src/models/attention_performer.py`` (``FastAttention``), ``src/models/component_functions.py``
(``get_rfs_torch``, ``optimize_opt_pos_params_torch``), ``src/models/weight_matrices_approx.py`` and
``src/models/weight_matrices_learner.py`` @ ``ff37d34c443e7c2f3c3cade82d4749f080e58d1c``.

$$O = \frac{\Phi_Q(\Phi_K^\top V)}{\Phi_Q(\Phi_K^\top\mathbf 1)}\quad(\text{prefix sums when causal}),\qquad
\phi(x) = f(Wx)\in\mathbb R^{m'},$$

with $x$ pre-scaled by $a = d^{-1/4}$ (``normalize_data``; upstream ``PerformerAttention`` divides
$Q, K$ by $d^{1/4}$). Any weight matrix combines with any component function.

Weight matrices (`spectraformer_weight_matrix`; rows $w_l\in\mathbb R^d$, $l<m$)
--------------------------------------------------------------------------------
``gaus`` i.i.d. $\mathcal N(0, I_d)$ rows; ``orf`` Gaussian orthogonal blocks (the Performer
generator `performer_projection_matrix`, Haar-corrected QR, $\chi_d$ row norms); ``scrf`` signed
circulant blocks $\mathrm{diag}(\sigma)\,\mathrm{circ}(g)$, $g\sim\mathcal N(0,I_d)$, $\sigma\in\{\pm1\}^d$;
``sorf`` $\sqrt d\,HD_1HD_2HD_3$ ($d$ a power of 2, $H$ the normalised Hadamard matrix, $D_i$
random signs; blocks of $d$ rows); ``qmc`` scrambled Sobol points mapped through
$\Phi^{-1}$; ``mm`` moment matching (Gaussian rows centred and whitened by their sample covariance);
``fastfood_fixed`` FastFood $V = d^{-1/2}\,SHG\Pi HB$ (Le, Sarlós, Smola 2013; $B$ signs, $\Pi$ a
permutation, $G$ Gaussian, $S_i\sim\chi_d/\|G\|$), stacked in blocks of $d$ rows. Every row of
``gaus``, ``orf``, ``scrf``, ``qmc`` and ``fastfood_fixed`` is marginally $\mathcal N(0, I_d)$, so every
component function below is an unbiased kernel estimator with them (``sorf`` and ``mm`` are
structured/corrected and only approximately so). ``fastfood_learnable`` makes $S, G, B$ parameters
(``projection_matrix_learner.S/G/B``, upstream ``SmoothedFastFoodRandomFeatures(learn_S=True,
learn_G_B=True)``) with the fixed permutation ``fastfood_permutation`` and
$W = c\,\mathrm{diag}(S)H\mathrm{diag}(G)\Pi H\mathrm{diag}(B)$, $c$ = ``fastfood_scale`` (upstream
$d^{-3/4}$: its $\sqrt{\texttt{softmax\_temp}} = d^{-1/4}$ times $d^{-1/2}$).

Component functions (the GERF family of Likhosherstov et al., s = +1)
----------------------------------------------------------------------
With $p_l = w_l^\top u$, $u = a x$ and $\kappa = 0$ (``kernel="gaussian"``, upstream) or
$\kappa = \tfrac12$ (``kernel="softmax"``):

$$\log f_l(u) = \tfrac d4\log(1-4A) + A\|w_l\|^2 + \sqrt{1-4A}\,p_l + (\kappa - 1)\|u\|^2 - \tfrac12\log m,$$

so that $\mathbb E_{w\sim\mathcal N(0,I)}[f(u)^\top f(u')] = e^{-\|u-u'\|^2/2}$ (Gaussian kernel) or
$e^{u^\top u'}$ (softmax kernel, $\kappa = \tfrac12$) for every $A<\tfrac14$. ``posrf``: $A = 0$.
``gerf``: $A$ the parameter ``gerf_A`` (shape ``(H, 1)`` or ``(H, N)``, upstream per (head,
position); upstream clamps it at 0.124999). ``oprf``: $A^* = (1 - 1/\rho^*)/8$ with
$\rho^* = (\sqrt{(2\varphi+d)^2 + 8d\varphi} - 2\varphi - d)/(4\varphi)$ and
$\varphi = \overline{\|u_q\|^2} + \overline{\|u_k\|^2} + 2\bar u_q^\top\bar u_k$ per (batch, head)
(the variance-optimal positive features of Chefs' Random Tables; differentiated through).
``saderf``: ``gerf`` on $(\Psi u_q, \Psi^{-1}u_k)$ with $\Psi = \mathrm{diag}\big((\sum_n u_{k,n}^2 /
\sum_n u_{q,n}^2)^{1/4}\big)$ per (batch, head), so $u_q^\top u_k$ is unchanged. ``trigrf``:
$f(u) = m^{-1/2}e^{\kappa\|u\|^2}[\cos p;\ \sin p]$ (random kitchen sinks).

Backward
--------
The feature-space core of `refattn.attention.linear.core`, then per feature map, with
$\gamma_l = \partial L/\partial f_l\cdot f_l$ (exponential family): $du = \sqrt{1-4A}\,\gamma W +
2(\kappa-1)\,u\sum_l\gamma_l$, $dW_l = \sum_n\big(\sqrt{1-4A}\,\gamma_{nl}u_n + 2A\gamma_{nl}w_l\big)$,
$dA = \sum_l\gamma_l\big(-\tfrac{d}{1-4A} + \|w_l\|^2 - 2p_l/\sqrt{1-4A}\big)$. Trigonometric:
$dp_l = e_l(-g^{c}_l\sin p_l + g^{s}_l\cos p_l)$, $du = dp\,W + 2\kappa u\sum_l g_l f_l$. ``oprf``
chains $dA$ through $\rho^*(\varphi)$: $dA/d\rho = 1/(8\rho^2)$,
$d\rho/d\varphi = ((S'-2)\varphi - (S - 2\varphi - d))/(4\varphi^2)$ with
$S = \sqrt{(2\varphi+d)^2+8d\varphi}$, $S' = (2(2\varphi+d)+4d)/S$, and
$\partial\varphi/\partial u_{q,n} = 2(u_{q,n} + \bar u_k)/N$. ``saderf`` chains $\Psi$:
$d\Psi = \sum_n(du'_{q,n}u_{q,n} - du'_{k,n}u_{k,n}/\Psi^2)$, $\Psi = (S_k/S_q)^{1/4}$. FastFood:
$W = c\,\mathrm{diag}(S)\,H\,\mathrm{diag}(G)\,R$, $R = H_{\pi}\mathrm{diag}(B)$:
$dS = c\sum_j dW\odot (HGR)$, $dG = \sum_j (H\,dW')\odot R$, $dB = \sum_k (G\odot H dW')\odot H_\pi$
with $dW' = c\,\mathrm{diag}(S)\,dW$ ($H$ symmetric).

Stabilisers: queries subtract their row maximum, keys the maximum over each (batch, head); both
cancel exactly in the ratio (no epsilon enters the features), so they carry no gradient.

Deviations from upstream (documented, each a keyword or a correction)
--------------------------------------------------------------------
Upstream stabilises *keys* per row too (``torch.max(data_prime1, dim=-1)``), which changes the
attention weights; its ``trigrf`` multiplies by $e^{\|x\|}$ instead of $e^{\|x\|^2/2}$; it adds
``eps=1e-4`` to every feature after the stabiliser; ``oprf`` statistics are taken per position over
the batch (coupling batch elements) instead of per sequence as in Chefs' Random Tables;
``saderf`` keeps the unscaled $\|x\|^2$ in $C\|x\|^2$; ``scrf`` returns a zero matrix when
$m > 2d$; ``qmc`` returns $2^{\lceil\log_2 m\rceil}$ rows; ``rom`` (complex) and ``sgq`` (chaospy)
are not implemented here. Agreement with the upstream code, measured in float64 on the terms
that agree, is in ``docs/linear/kernel-features.md``.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from ..._checks import as_dout, as_float, check_choice, check_int, check_param_keys, check_positive
from ...registry import Mechanism, Sample, register
from ..softmax.core import sum_to_shape
from ._samples import fd_max_rel, random_qkv
from .core import linear_core_backward, linear_core_forward, mT, validate_linear_qkv
from .performer import performer, performer_projection_matrix

__all__ = [
    "SPECTRA_WEIGHTS",
    "SPECTRA_COMPONENTS",
    "walsh_hadamard",
    "fastfood_matrix",
    "fastfood_matrix_vjp",
    "fastfood_draw",
    "spectraformer_weight_matrix",
    "spectraformer_features_forward",
    "spectraformer_features_backward",
    "spectraformer_forward",
    "spectraformer_backward",
    "spectraformer_attention",
]

SPECTRA_WEIGHTS = ("gaus", "orf", "scrf", "sorf", "qmc", "mm", "fastfood_fixed")
SPECTRA_COMPONENTS = ("posrf", "trigrf", "oprf", "gerf", "saderf")
_KERNELS = ("gaussian", "softmax")
_FF_KEYS = ("projection_matrix_learner.S", "projection_matrix_learner.G", "projection_matrix_learner.B")


# --------------------------------------------------------------------------------------------
# Structured weight matrices


def walsh_hadamard(x: np.ndarray) -> np.ndarray:
    r"""Unnormalised fast Walsh-Hadamard transform over the last axis (length a power of 2):
    $y = H_n x$ with the Sylvester matrix $H_{2n} = [[H_n, H_n], [H_n, -H_n]]$ (symmetric,
    $H_n^2 = nI$), in $O(n\log n)$."""
    n = x.shape[-1]
    if n & (n - 1):
        raise ValueError(f"walsh_hadamard needs a power-of-2 length on the last axis; got {n}")
    y = np.array(x, copy=True)
    h = 1
    while h < n:
        y = y.reshape(y.shape[:-1] + (n // (2 * h), 2, h))
        y = np.concatenate([y[..., 0:1, :] + y[..., 1:2, :], y[..., 0:1, :] - y[..., 1:2, :]], axis=-2)
        y = y.reshape(x.shape)
        h *= 2
    return y


def fastfood_matrix(S, G, B, perm, scale: float) -> np.ndarray:
    r"""FastFood $W = c\,\mathrm{diag}(S)\,H\,\mathrm{diag}(G)\,\Pi\,H\,\mathrm{diag}(B)$ ``(..., d, d)``
    (unvalidated; ``S, G, B, perm`` of shape ``(..., d)`` for a stack of draws; $(\Pi y)_k = y_{\pi_k}$
    as upstream ``HBx[:, P]``). Rows are the features: $p = uW^\top$."""
    d = S.shape[-1]
    H = walsh_hadamard(np.eye(d, dtype=S.dtype))
    R = H[perm] * B[..., None, :]
    U = H @ (G[..., :, None] * R)
    return scale * S[..., :, None] * U


def fastfood_matrix_vjp(dW, S, G, B, perm, scale: float):
    """Gradients ``(dS, dG, dB)`` of :func:`fastfood_matrix` for the upstream gradient ``dW``."""
    d = S.shape[0]
    H = walsh_hadamard(np.eye(d, dtype=S.dtype))
    R = H[perm] * B[None, :]
    U = H @ (G[:, None] * R)
    dS = scale * np.sum(dW * U, axis=1)
    dT = H @ (scale * S[:, None] * dW)  # H symmetric
    dG = np.sum(dT * R, axis=1)
    dB = np.sum((G[:, None] * dT) * H[perm], axis=0)
    return dS, dG, dB


def fastfood_draw(d: int, rng: np.random.Generator) -> dict:
    r"""One FastFood draw as upstream ``new_feature_map``: $B\in\{\pm1\}^d$, $G\sim\mathcal N(0, I_d)$,
    $S_i\sim\chi_d/\|G\|$, a random permutation. With scale $d^{-1/2}$ each row of
    :func:`fastfood_matrix` is exactly $\mathcal N(0, I_d)$: given $B, \Pi$ the row
    $\sqrt d\,O_iG$ ($O_i$ orthogonal) has norm $\sqrt d\|G\|$ and a uniform direction, so
    $S_i\|G\|$ gives it a $\chi_d$ norm."""
    G = rng.standard_normal(d)
    B = rng.choice(np.array([-1.0, 1.0]), size=d)
    S = np.sqrt(rng.chisquare(d, size=d)) / np.linalg.norm(G)
    return {"S": S, "G": G, "B": B, "perm": rng.permutation(d)}


def spectraformer_weight_matrix(kind: str, nb_features: int, dim: int, *, seed: int = 0) -> np.ndarray:
    r"""A random weight matrix $W\in\mathbb R^{m\times d}$ of Spectraformer (deterministic given ``seed``).

    ``kind`` in ``SPECTRA_WEIGHTS``; the generators are described in the module docstring
    (``sorf`` and ``fastfood_fixed`` need ``dim`` a power of 2 for the Hadamard transform,
    ``mm`` needs ``nb_features > dim``). Learnable FastFood is not drawn here: pass its
    parameters ``projection_matrix_learner.S/G/B`` to :func:`spectraformer_forward`.
    """
    check_choice(kind, "kind", SPECTRA_WEIGHTS)
    m = check_int(nb_features, "nb_features", minimum=1)
    d = check_int(dim, "dim", minimum=1)
    rng = np.random.default_rng(check_int(seed, "seed"))
    if kind == "gaus":
        return rng.standard_normal((m, d))
    if kind == "orf":
        return performer_projection_matrix(m, d, seed=int(rng.integers(0, 2**31)))
    if kind == "scrf":
        blocks = []
        for _ in range(-(-m // d)):
            g = rng.standard_normal(d)
            circ = np.stack([np.roll(g, i) for i in range(d)])
            blocks.append(rng.choice(np.array([-1.0, 1.0]), size=d)[:, None] * circ)
        return np.vstack(blocks)[:m]
    if kind in ("sorf", "fastfood_fixed") and d & (d - 1):
        raise ValueError(f"{kind} needs dim a power of 2 (Hadamard transform); got dim={d}")
    if kind == "sorf":
        H = walsh_hadamard(np.eye(d)) / np.sqrt(d)
        blocks = []
        for _ in range(-(-m // d)):
            M = np.sqrt(d) * np.eye(d)
            for _ in range(3):
                M = M @ (H * rng.choice(np.array([-1.0, 1.0]), size=d)[None, :])
            blocks.append(M)
        return np.vstack(blocks)[:m]
    if kind == "qmc":
        from scipy.stats import norm, qmc

        with warnings.catch_warnings():  # Sobol' balance warning for m not a power of 2
            warnings.simplefilter("ignore")
            pts = qmc.Sobol(d, scramble=True, seed=rng).random(m)
        return norm.ppf(np.clip(pts, 1e-12, 1 - 1e-12))
    if kind == "mm":
        if m <= d:
            raise ValueError(f"mm (moment matching) needs nb_features > dim to whiten; got {m} <= {d}")
        w = rng.standard_normal((m, d))
        wc = w - w.mean(axis=0)
        L = np.linalg.cholesky(wc.T @ wc / m)
        return np.linalg.solve(L, wc.T).T
    blocks = []
    for _ in range(-(-m // d)):
        f = fastfood_draw(d, rng)
        blocks.append(fastfood_matrix(f["S"], f["G"], f["B"], f["perm"], d ** -0.5))
    return np.vstack(blocks)[:m]


# --------------------------------------------------------------------------------------------
# Component functions


def spectraformer_features_forward(u, W, *, component: str, kernel: str = "gaussian", A=None,
                                   stabilizer: str = "row", feature_eps: float = 0.0):
    r"""Features $f(Wu)$ of one component function (unvalidated): ``u (..., N, d)`` (already scaled),
    ``W (m, d)``, ``A`` broadcastable to ``(..., N, 1)`` (``gerf``/``oprf``/``saderf``; None = 0).

    ``trigrf`` returns $2m$ features, the others $m$. ``stabilizer`` subtracts the log-maximum
    over each ``"row"`` (queries; upstream also keys), each leading index ``"per_head"`` (keys)
    or nothing (``"none"``: the exact features of the module docstring); ``feature_eps`` is added
    after it (upstream ``eps``). The backward differentiates through the maximum. Returns
    ``(phi, cache)``; ``cache["shift"]`` is the subtracted log-constant.
    """
    m, d = W.shape
    p = u @ W.T
    sq = np.sum(u * u, axis=-1, keepdims=True)
    kappa = 0.5 if kernel == "softmax" else 0.0
    c = {"component": component, "u": u, "W": W, "p": p, "A": A, "kappa": kappa, "stabilizer": stabilizer}
    if component == "trigrf":
        L = kappa * sq - 0.5 * math.log(m)  # the log-amplitude (..., N, 1)
    elif A is None:
        c["Bc"], L = 1.0, p + (kappa - 1.0) * sq - 0.5 * math.log(m)
    else:
        one4 = 1.0 - 4.0 * A
        c["Bc"] = np.sqrt(one4)
        L = 0.25 * d * np.log(one4) + A * np.sum(W * W, axis=1) + c["Bc"] * p + (kappa - 1.0) * sq - 0.5 * math.log(m)
    if stabilizer == "none":
        shift = np.zeros(L.shape[:-2] + (1, 1), L.dtype)
    else:
        axes = (-1,) if stabilizer == "row" else (-2, -1)
        shift = np.max(L, axis=axes, keepdims=True)
        flat = L.reshape(L.shape[: L.ndim - len(axes)] + (-1,))
        onehot = np.zeros_like(flat)
        np.put_along_axis(onehot, np.argmax(flat, axis=-1)[..., None], 1.0, axis=-1)
        c["onehot"], c["axes"] = onehot.reshape(L.shape), axes
    e = np.exp(L - shift)
    if component == "trigrf":
        e = np.concatenate([np.cos(p), np.sin(p)], axis=-1) * e
    c.update(e=e, shift=shift)
    return e + feature_eps, c


def spectraformer_features_backward(dphi, fc):
    r"""VJP of :func:`spectraformer_features_forward`: returns ``(du, dW, dA)`` (``dA`` of shape
    ``(..., N, 1)`` before any broadcast reduction, None without ``A``); formulas in the module
    docstring, plus the (sub)gradient of the stabiliser, $-\sum_{\text{group}}\partial L/\partial
    \log f$ placed at the arg-max."""
    u, W, p, e, kappa, A = fc["u"], fc["W"], fc["p"], fc["e"], fc["kappa"], fc["A"]
    m = W.shape[0]
    gam = dphi * e  # dL/d(log-feature) before the stabiliser
    if fc["component"] == "trigrf":
        gL = np.sum(gam, axis=-1, keepdims=True)
    else:
        gL = gam
    if fc["stabilizer"] != "none":
        gL = gL - fc["onehot"] * np.sum(gL, axis=fc["axes"], keepdims=True)
    if fc["component"] == "trigrf":
        amp = np.exp(kappa * np.sum(u * u, axis=-1, keepdims=True) - 0.5 * math.log(m) - fc["shift"])
        dp = amp * (-dphi[..., :m] * np.sin(p) + dphi[..., m:] * np.cos(p))
        du = dp @ W + 2.0 * kappa * u * gL
        return du, _rows_outer(dp, u), None
    Bc = fc["Bc"]
    du = Bc * (gL @ W) + 2.0 * (kappa - 1.0) * u * np.sum(gL, axis=-1, keepdims=True)
    dW = _rows_outer(Bc * gL, u)
    if A is None:
        return du, dW, None
    dW = dW + 2.0 * np.sum(A * gL, axis=tuple(range(gL.ndim - 1)))[:, None] * W
    d = u.shape[-1]
    dA = np.sum(gL * (np.sum(W * W, axis=1) - 2.0 * p / Bc), axis=-1, keepdims=True) \
        - d / (1.0 - 4.0 * A) * np.sum(gL, axis=-1, keepdims=True)
    return du, dW, dA


def _rows_outer(a, b):
    """``sum over every leading row of a[..., :, None] * b[..., None, :]`` -> ``(a.shape[-1], b.shape[-1])``."""
    a = np.broadcast_to(a, b.shape[:-1] + a.shape[-1:])
    return a.reshape(-1, a.shape[-1]).T @ b.reshape(-1, b.shape[-1])


def _oprf_A(uq, uk):
    """Chefs' Random Tables optimum A* per leading index, with the pieces its VJP needs."""
    d = uq.shape[-1]
    mq, mk = uq.mean(axis=-2, keepdims=True), uk.mean(axis=-2, keepdims=True)
    phi = (np.mean(np.sum(uq * uq, -1), -1)[..., None, None] + np.mean(np.sum(uk * uk, -1), -1)[..., None, None]
           + 2.0 * np.sum(mq * mk, axis=-1, keepdims=True))
    phi = np.maximum(phi, 1e-30)  # 0 only for all-zero inputs; then rho -> 1, A -> 0
    S = np.sqrt((2 * phi + d) ** 2 + 8 * d * phi)
    rho = (S - 2 * phi - d) / (4 * phi)
    A = (1.0 - 1.0 / rho) / 8.0
    return A, {"phi": phi, "S": S, "rho": rho, "mq": mq, "mk": mk, "d": d}


def _oprf_A_vjp(dA, uq, uk, st):
    dA = np.sum(dA, axis=-2, keepdims=True)  # (..., 1, 1)
    phi, S, rho, d = st["phi"], st["S"], st["rho"], st["d"]
    dS = (2 * (2 * phi + d) + 4 * d) / S
    drho = ((dS - 2) * phi - (S - 2 * phi - d)) / (4 * phi * phi)
    dphi = dA / (8 * rho * rho) * drho
    duq = dphi * 2.0 * (uq + st["mk"]) / uq.shape[-2]
    duk = dphi * 2.0 * (uk + st["mq"]) / uk.shape[-2]
    return duq, duk


# --------------------------------------------------------------------------------------------
# Attention


def _validate(q, k, v, params, projection, component, kernel, causal, normalize_data, perm, ff_scale):
    check_choice(component, "component", SPECTRA_COMPONENTS)
    check_choice(kernel, "kernel", _KERNELS)
    for name, val in (("causal", causal), ("normalize_data", normalize_data)):
        if not isinstance(val, (bool, np.bool_)):
            raise TypeError(f"{name} must be a bool; got {type(val).__name__}")
    q, k, v = validate_linear_qkv(q, k, v, same_length=bool(causal))
    dt, d = q.dtype, q.shape[-1]
    params = {} if params is None else params
    need_a = component in ("gerf", "saderf")
    learn_ff = isinstance(params, dict) and any(key in params for key in _FF_KEYS)
    check_param_keys(params, (("gerf_A",) if need_a else ()) + (_FF_KEYS if learn_ff else ()),
                     where=f"spectraformer component={component!r}")
    P = {}
    if need_a:
        A = as_float(params["gerf_A"], "gerf_A", ndim=2)
        if A.shape[0] != q.shape[-3] or A.shape[1] not in (1, q.shape[-2]):
            raise ValueError(f"gerf_A must have shape (H={q.shape[-3]}, 1) or (H, N={q.shape[-2]}); got {A.shape}")
        if np.any(A >= 0.25):
            raise ValueError("gerf_A must be < 1/4 (GERF needs 1 - 4A > 0)")
        P["gerf_A"] = A.astype(dt, copy=False)
    if learn_ff:
        if projection is not None:
            raise ValueError("pass either projection (a fixed weight matrix) or the learnable FastFood "
                             "parameters projection_matrix_learner.S/G/B, not both")
        if d & (d - 1):
            raise ValueError(f"learnable FastFood needs q's feature size d a power of 2; got d={d}")
        for key in _FF_KEYS:
            arr = as_float(params[key], key, ndim=1)
            if arr.shape != (d,):
                raise ValueError(f"{key} must have shape (d={d},); got {arr.shape}")
            P[key] = arr.astype(dt, copy=False)
        perm = np.asarray(perm) if perm is not None else None
        if perm is None or perm.shape != (d,) or perm.dtype.kind not in "iu" or sorted(perm.tolist()) != list(range(d)):
            raise ValueError(f"fastfood_permutation must be a permutation of range(d={d}) (an int array); got {perm!r}")
        ff_scale = d ** -0.75 if ff_scale is None else check_positive(ff_scale, "fastfood_scale")
    else:
        if projection is None:
            raise ValueError("projection (m, d) is required unless the learnable FastFood parameters are given")
        projection = as_float(projection, "projection", ndim=2)
        if projection.shape[1] != d:
            raise ValueError(f"projection must have shape (nb_features, d={d}); got {projection.shape}")
        projection = projection.astype(dt, copy=False)
    return q, k, v, P, projection, perm, ff_scale


def spectraformer_forward(q, k, v, params=None, *, projection=None, component: str = "posrf",
                          kernel: str = "gaussian", causal: bool = False, normalize_data: bool = True,
                          key_stabilizer: str = "per_head", feature_eps: float = 0.0,
                          fastfood_permutation=None, fastfood_scale=None):
    r"""Spectraformer random-feature attention (Nguyen, Joshi, Salim, ACM TIST 2025, arXiv 2405.15310).

    $O = \Phi_Q(\Phi_K^\top V)\oslash\Phi_Q(\Phi_K^\top\mathbf 1)$ (prefix sums when ``causal``),
    $\phi(x) = f(W\,ax)$; see the module docstring for the weight matrices and the component
    functions.

    Parameters
    ----------
    q (..., N, d), k (..., M, d), v (..., M, dv)
    params : dict, optional
        ``gerf_A`` ``(H, 1)`` or ``(H, N)`` for ``component`` ``gerf``/``saderf``; the learnable
        FastFood diagonals ``projection_matrix_learner.S``, ``.G``, ``.B`` (each ``(d,)``) instead
        of ``projection``.
    projection : (m, d) array, config
        A fixed weight matrix (:func:`spectraformer_weight_matrix`).
    component : {"posrf", "trigrf", "oprf", "gerf", "saderf"}
    kernel : {"gaussian", "softmax"}
        The kernel the features estimate: upstream's GERF family ($C = -(s+1)/2$) estimates the
        Gaussian kernel $e^{-\|u-u'\|^2/2}$; ``"softmax"`` adds $\|u\|^2/2$ (Performer,
        $e^{u^\top u'}$).
    causal, normalize_data : bool
        Prefix sums; pre-scale by $d^{-1/4}$.
    key_stabilizer : {"per_head", "row"}
        Log-max subtracted from the key features: per (batch, head) (cancels exactly, default) or
        per key row as upstream (``torch.max(data_prime1, dim=-1)``), which reweights the keys.
        Queries always use their row maximum. Both are differentiated through.
    feature_eps : float
        Added to every feature after the stabiliser (upstream ``eps=1e-4``; default 0, which keeps
        the output an exact kernel-weighted average).
    fastfood_permutation : int array (d,), fastfood_scale : float
        The fixed permutation and the scale $c$ of learnable FastFood (default $d^{-3/4}$).
    """
    q, k, v, P, projection, perm, ff_scale = _validate(
        q, k, v, params, projection, component, kernel, causal, normalize_data, fastfood_permutation, fastfood_scale)
    check_choice(key_stabilizer, "key_stabilizer", ("per_head", "row"))
    feature_eps = check_positive(feature_eps, "feature_eps", allow_zero=True)
    d = q.shape[-1]
    a = d ** -0.25 if normalize_data else 1.0
    uq, uk = a * q, a * k
    if projection is None:
        W = fastfood_matrix(*(P[key] for key in _FF_KEYS), perm, ff_scale)
    else:
        W = projection
    st = {}
    if component == "saderf":
        sq_, sk_ = np.sum(uq * uq, axis=-2, keepdims=True), np.sum(uk * uk, axis=-2, keepdims=True)
        psi = (sk_ / sq_) ** 0.25
        st.update(psi=psi, sq=sq_, sk=sk_)
        uq2, uk2 = uq * psi, uk / psi
    else:
        uq2, uk2 = uq, uk
    A = None
    if component == "oprf":
        A, st["oprf"] = _oprf_A(uq, uk)
    elif component in ("gerf", "saderf"):
        A = P["gerf_A"][..., None]
    fq, cq = spectraformer_features_forward(uq2, W, component=component, kernel=kernel, A=A, stabilizer="row",
                                            feature_eps=feature_eps)
    fk, ck = spectraformer_features_forward(uk2, W, component=component, kernel=kernel, A=A,
                                            stabilizer=key_stabilizer, feature_eps=feature_eps)
    out, state = linear_core_forward(fq, fk, v, causal=bool(causal), eps=0.0, normalise=True)
    cache = {"fq": fq, "fk": fk, "cq": cq, "ck": ck, "v": v, "out": out, "state": state, "causal": bool(causal),
             "a": a, "uq": uq, "uk": uk, "component": component, "st": st, "P": P, "perm": perm,
             "ff_scale": ff_scale, "learn_ff": projection is None}
    return out.copy(), cache


def spectraformer_backward(dout, cache):
    r"""Gradients ``{"q", "k", "v"}`` plus every parameter of :func:`spectraformer_forward` (the
    chain of the module docstring)."""
    out = cache["out"]
    g = as_dout(dout, out.shape, out.dtype)
    dfq, dfk, dv = linear_core_backward(g, cache["fq"], cache["fk"], cache["v"], out, cache["state"],
                                        causal=cache["causal"], normalise=True)
    duq, dWq, dAq = spectraformer_features_backward(dfq, cache["cq"])
    duk, dWk, dAk = spectraformer_features_backward(dfk, cache["ck"])
    comp, st, P, uq, uk = cache["component"], cache["st"], cache["P"], cache["uq"], cache["uk"]
    grads = {}
    if comp == "saderf":
        psi = st["psi"]
        dpsi = np.sum(duq * uq - duk * uk / (psi * psi), axis=-2, keepdims=True)
        duq, duk = duq * psi, duk / psi
        duk = duk + 2.0 * uk * dpsi * psi / (4.0 * st["sk"])
        duq = duq - 2.0 * uq * dpsi * psi / (4.0 * st["sq"])
    if comp == "oprf":
        eq, ek = _oprf_A_vjp(dAq + dAk, uq, uk, st["oprf"])
        duq, duk = duq + eq, duk + ek
    if comp in ("gerf", "saderf"):
        A = P["gerf_A"]
        grads["gerf_A"] = sum_to_shape(dAq + dAk, A.shape + (1,))[..., 0]
    if cache["learn_ff"]:
        dS, dG, dB = fastfood_matrix_vjp(dWq + dWk, *(P[key] for key in _FF_KEYS), cache["perm"], cache["ff_scale"])
        grads.update(dict(zip(_FF_KEYS, (dS, dG, dB))))
    a = cache["a"]
    return {"q": a * duq, "k": a * duk, "v": dv, **grads}


def spectraformer_attention(q, k, v, params=None, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`spectraformer_forward`."""
    return spectraformer_forward(q, k, v, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _reference(q, k, v, params=None, *, projection=None, component="posrf", kernel="gaussian", causal=False,
               normalize_data=True, key_stabilizer="per_head", feature_eps=0.0, fastfood_permutation=None,
               fastfood_scale=None):
    """Explicit O(N^2) form: A = Phi_Q Phi_K^T (tril if causal), O = AV / A1."""
    params = params or {}
    d = q.shape[-1]
    a = d ** -0.25 if normalize_data else 1.0
    uq, uk = a * q, a * k
    if projection is None:
        W = fastfood_matrix(*(params[key] for key in _FF_KEYS), np.asarray(fastfood_permutation),
                            d ** -0.75 if fastfood_scale is None else fastfood_scale)
    else:
        W = projection
    if component == "saderf":
        psi = (np.sum(uk ** 2, -2, keepdims=True) / np.sum(uq ** 2, -2, keepdims=True)) ** 0.25
        uq, uk = uq * psi, uk / psi
    A = None
    if component == "oprf":
        A = _oprf_A(a * q, a * k)[0]
    elif component in ("gerf", "saderf"):
        A = params["gerf_A"][..., None]
    fq, _ = spectraformer_features_forward(uq, W, component=component, kernel=kernel, A=A, stabilizer="row",
                                           feature_eps=feature_eps)
    fk, _ = spectraformer_features_forward(uk, W, component=component, kernel=kernel, A=A,
                                           stabilizer=key_stabilizer, feature_eps=feature_eps)
    M = fq @ mT(fk)
    if causal:
        M = np.tril(M)
    return (M @ v) / M.sum(-1, keepdims=True)


def _sample_combo(rng, size, component, weight, causal):
    q, k, v = random_qkv(rng, size, same_length=True, d=4)
    q, k, v = 0.6 * q, 0.6 * k, v
    m = 5 if size == "tiny" else 12
    params, config = {}, {"component": component, "causal": causal,
                          "kernel": "softmax" if rng.random() < 0.5 else "gaussian",
                          "key_stabilizer": "row" if rng.random() < 0.5 else "per_head",
                          "feature_eps": 1e-3 if rng.random() < 0.5 else 0.0}
    if component in ("gerf", "saderf"):
        params["gerf_A"] = rng.uniform(-0.1, 0.1, (q.shape[1], 1))
    if weight == "fastfood_learnable":
        for key in _FF_KEYS:
            params[key] = rng.normal(0.0, 0.5, 4) + np.where(key.endswith("S"), 1.0, 0.0)
        config["fastfood_permutation"] = rng.permutation(4)
        config["fastfood_scale"] = 0.5
    else:
        config["projection"] = spectraformer_weight_matrix(weight, m, 4, seed=int(rng.integers(0, 2**31)))
    if component == "trigrf":
        config["kernel"] = "gaussian"  # keeps the (signed) denominator well away from 0
    return Sample(inputs={"q": q, "k": k, "v": v}, params=params or None, config=config)


def _sample(rng, size):
    comp = SPECTRA_COMPONENTS[int(rng.integers(0, len(SPECTRA_COMPONENTS)))]
    weight = ("gaus", "orf", "qmc", "fastfood_learnable")[int(rng.integers(0, 4))]
    return _sample_combo(rng, size, comp, weight, bool(rng.integers(0, 2)))


def _check_performer_special_case(rng):
    """posrf + orf + softmax kernel is Performer FAVOR+ without feature epsilon or guard."""
    q, k, v = random_qkv(rng, "small", d=4)
    proj = spectraformer_weight_matrix("orf", 12, 4, seed=3)
    err = 0.0
    for causal in (False, True):
        a = spectraformer_attention(q, k, v, projection=proj, component="posrf", kernel="softmax", causal=causal)
        b = performer(q, k, v, projection=proj, causal=causal, feature_eps=0.0, denominator_guard=0.0)
        err = max(err, float(np.max(np.abs(a - b))))
    assert err < 1e-12, err
    return err


def _check_every_combination_equals_explicit(rng):
    """Every component x weight matrix (and causal): linear form == explicit O(N^2) form."""
    err = 0.0
    for comp in SPECTRA_COMPONENTS:
        for weight in SPECTRA_WEIGHTS[:-1] + ("fastfood_learnable",):
            if weight == "mm":
                continue  # needs m > d; covered below
            s = _sample_combo(rng, "small", comp, weight, bool(rng.integers(0, 2)))
            out = spectraformer_attention(**s.inputs, params=s.params, **s.config)
            ref = _reference(**s.inputs, params=s.params, **s.config)
            err = max(err, float(np.max(np.abs(out - ref))))
    assert err < 1e-10, err
    return err


def _check_fd_every_component(rng):
    """Finite differences for the data-dependent components oprf (A* from the statistics) and saderf
    (Psi scaling, learnable A) on one head, N = 3 (tests/test_linear_l1.py covers all five)."""
    errs = []
    for i, comp in enumerate(("oprf", "saderf")):
        s = _sample_combo(rng, "tiny", comp, ("gaus", "orf", "fastfood_learnable")[i % 3], bool(i % 2))
        inputs = {key: val[:, :1, :3] for key, val in s.inputs.items()}
        params = None if s.params is None else {key: (val[:1] if key == "gerf_A" else val)
                                                 for key, val in s.params.items()}
        errs.append(fd_max_rel(spectraformer_forward, spectraformer_backward, Sample(inputs, params, s.config)))
    return max(errs)


def _kernel_exact(x, y, kernel):
    return np.exp(x @ y) if kernel == "softmax" else np.exp(-0.5 * np.sum((x - y) ** 2))


def _check_unbiased(rng):
    """Monte-Carlo mean (fixed seeds): with i.i.d. Gaussian rows, f(x).f(y) is an unbiased
    estimate of the named kernel for every component; the mean of m = 40000 terms must lie within
    4 standard errors (the standard error estimated from the same terms)."""
    rng = np.random.default_rng(11)
    d, m = 4, 40_000
    x, y = 0.5 * rng.standard_normal(d), 0.5 * rng.standard_normal(d)
    W = spectraformer_weight_matrix("gaus", m, d, seed=5)
    worst = 0.0
    for comp, A in (("posrf", None), ("trigrf", None), ("gerf", np.array([[[-0.15]]])), ("gerf", np.array([[[0.05]]]))):
        for kernel in _KERNELS:
            fx, cx = spectraformer_features_forward(x[None, None], W, component=comp, kernel=kernel, A=A,
                                                    stabilizer="none")
            fy, _ = spectraformer_features_forward(y[None, None], W, component=comp, kernel=kernel, A=A,
                                                   stabilizer="none")
            terms = m * (fx * fy)[0, 0]
            if comp == "trigrf":
                terms = terms[:m] + terms[m:]
            est, se = terms.mean(), terms.std() / np.sqrt(m)
            exact = _kernel_exact(x, y, kernel)
            assert abs(est - exact) < 4 * se and se < 0.05 * exact, (comp, kernel, est, exact, se)
            worst = max(worst, abs(est - exact) / exact)
    return worst


def _check_weight_generators(rng):
    """Documented generator properties: FWHT == Sylvester Hadamard; FastFood == its dense product;
    orf blocks orthogonal; scrf rows are signed cyclic shifts; sorf rows have norm sqrt(d); mm rows
    have zero mean and identity sample covariance; qmc/gaus/fastfood rows have E||w||^2 = d."""
    from scipy.linalg import hadamard

    err = float(np.max(np.abs(walsh_hadamard(np.eye(8)) - hadamard(8))))
    f = fastfood_draw(8, np.random.default_rng(1))
    H = hadamard(8).astype(float)
    dense = 8 ** -0.5 * np.diag(f["S"]) @ H @ np.diag(f["G"]) @ H[f["perm"]] @ np.diag(f["B"])
    err = max(err, float(np.max(np.abs(fastfood_matrix(f["S"], f["G"], f["B"], f["perm"], 8 ** -0.5) - dense))))
    w = spectraformer_weight_matrix("scrf", 8, 8, seed=2)
    g = np.abs(w[0])
    err = max(err, max(float(np.max(np.abs(np.abs(w[i]) - np.roll(g, i)))) for i in range(8)))
    s = spectraformer_weight_matrix("sorf", 16, 8, seed=2)
    err = max(err, float(np.max(np.abs(np.linalg.norm(s, axis=1) - np.sqrt(8)))))
    mm = spectraformer_weight_matrix("mm", 64, 4, seed=2)
    err = max(err, float(np.max(np.abs(mm.mean(0)))), float(np.max(np.abs(mm.T @ mm / 64 - np.eye(4)))))
    assert err < 1e-10, err
    for kind in ("gaus", "qmc", "fastfood_fixed", "scrf", "orf"):
        sq = np.sum(spectraformer_weight_matrix(kind, 1024, 4, seed=7) ** 2, axis=1)
        assert abs(sq.mean() - 4) < 5 * sq.std() / np.sqrt(1024), (kind, sq.mean())
    return err


def _check_oprf_variance_reduction(rng):
    """OPRF (the optimal A* of Chefs' Random Tables for the sets X, Y) has a lower Monte-Carlo
    variance than PosRF averaged over all pairs (relative to the kernel), and stays unbiased
    (every pair's mean within 4 standard errors)."""
    rng = np.random.default_rng(3)
    d, m = 4, 20_000
    X = 0.35 * rng.standard_normal((1, 5, d))
    Y = 0.35 * rng.standard_normal((1, 5, d))
    A, _ = _oprf_A(X, Y)
    W = spectraformer_weight_matrix("gaus", m, d, seed=8)
    exact = np.exp(-0.5 * np.sum((X[0, :, None] - Y[0, None]) ** 2, axis=-1))
    rel = {}
    for comp, AA in (("posrf", None), ("oprf", A)):
        fx, _ = spectraformer_features_forward(X, W, component=comp, A=AA, stabilizer="none")
        fy, _ = spectraformer_features_forward(Y, W, component=comp, A=AA, stabilizer="none")
        terms = m * fx[0, :, None, :] * fy[0, None, :, :]  # (5, 5, m)
        se = terms.std(-1) / np.sqrt(m)
        assert np.all(np.abs(terms.mean(-1) - exact) < 4 * se), (comp, terms.mean(-1), exact)
        rel[comp] = float(np.mean(terms.var(-1) / exact ** 2))
    assert rel["oprf"] < rel["posrf"], rel
    return rel["oprf"] / rel["posrf"]


register(
    Mechanism(
        slug="spectraformer_random_features", family="4-linear-kernel-sparse", tier="T2",
        title="Spectraformer: weight matrix x component function random-feature attention",
        paper="Nguyen, Joshi, Salim, 'Spectraformer: A Unified Random Feature Framework for Transformer', "
              "ACM Transactions on Intelligent Systems and Technology 2025, arXiv 2405.15310",
        forward=spectraformer_forward, backward=spectraformer_backward, sample=_sample, reference=_reference,
        checks={"posrf_orf_softmax_is_performer": _check_performer_special_case,
                "every_combination_equals_explicit": _check_every_combination_equals_explicit,
                "gradcheck_every_component": _check_fd_every_component,
                "kernel_estimates_unbiased": _check_unbiased,
                "weight_generators_documented_properties": _check_weight_generators,
                "oprf_reduces_variance": _check_oprf_variance_reduction},
        docs="linear/kernel-features.md#spectraformer",
    ),
)
