r"""ONO orthogonal attention: Cholesky-whitened eigenfunction features and a Mercer-type kernel.

Paper: Xiao et al., "Improved Operator Learning by Orthogonal Attention", ICML 2024.
Upstream: xzppp/ONO ``ONOmodel2.py`` @ 8e4eee8d0156c3907c1dffb0accaa23225b721f0 (the repository's
HEAD; ``ONOBlock.forward`` with ``orth=True``; ``psd_safe_cholesky``). The previous commit
86e1bfe differs only in the residual (below).

Forward (the orthogonal-attention core of an ``ONOBlock``)
----------------------------------------------------------
Features $\psi\in\mathbb{R}^{B\times N\times k}$ (upstream ``x_ = self.proj(x)``), function values
$f\in\mathbb{R}^{B\times N\times d_f}$, learnable "eigenvalues" $\mu\in\mathbb{R}^k$:

$$C = \frac{1}{BN}\sum_{b,n}\psi_{bn}\psi_{bn}^\top,\qquad C = LL^\top\ (\text{Cholesky}),\qquad
\tilde\psi = \psi L^{-\top},$$
$$\mathrm{out}_b = \big(\tilde\psi_b\odot\operatorname{softplus}(\mu)\big)\big(\tilde\psi_b^\top f_b\big)
\;\big[+\,f_b\big],$$

so $\tilde\psi^\top\tilde\psi/(BN) = I$ and, per sample, $\mathrm{out} = \mathcal K f$ with the
symmetric PSD kernel $\mathcal K = \tilde\psi\operatorname{diag}(\operatorname{softplus}\mu)\tilde\psi^\top$
(a truncated Mercer expansion $k(x,y)\approx\sum_i\mu_i\tilde\psi_i(x)\tilde\psi_i(y)$).
No $1/N$. The residual $+f$ is a keyword (``residual``): at 8e4eee8 (HEAD) the line reads
``fx = (x_ * softplus(mu)) @ (x_.T @ fx) + fx`` (``residual=True``, the default); at 86e1bfe the
``+ fx`` is commented out (``residual=False``: the pure kernel operator). The block then applies
``mlp2(ln_3(.))``.

Training uses the batch covariance **with** gradient (it couples the batch, like BatchNorm); in
eval mode upstream uses an EMA buffer ``feature_cov`` ($\bar C\leftarrow0.9\bar C + 0.1C$, no
gradient): pass it as ``feature_cov`` here.

Backward
--------
With $P = \tilde\psi\odot s$, $s = \operatorname{softplus}\mu$, $A_b = \tilde\psi_b^\top f_b$ and
$G = \partial L/\partial\,\mathrm{out}$:
$dA_b = P_b^\top G_b$, $df_b = \tilde\psi_b\,dA_b$,
$d\tilde\psi_b = (G_bA_b^\top)\odot s + f_b\,dA_b^\top$,
$d\mu = \sigma(\mu)\odot\sum_{b,n}(G_bA_b^\top)\odot\tilde\psi_b$; the residual adds $G$ to $df$.

Whitening $\tilde\psi = \psi M$, $M = L^{-\top}$: $d\psi = d\tilde\psi\,L^{-1}$ and
$dM = \sum_{b,n}\psi^\top d\tilde\psi$. From $\delta(L^{-1}) = -L^{-1}\delta L\,L^{-1}$,
$\bar L = -\operatorname{tril}(L^{-\top}dM^\top L^{-\top})$.
Cholesky VJP (Murray 2016; PyTorch ``cholesky_backward``): with $\Phi$ = lower triangle with the
diagonal halved, $S = L^{-\top}\Phi(L^\top\bar L)L^{-1}$ and $\bar C = \tfrac12(S+S^\top)$.
Finally $C = \psi^\top\psi/(BN)$ adds $d\psi \mathrel{+}= 2\psi\bar C/(BN)$.
In eval mode ($C$ given) only the first whitening term remains.
"""

from __future__ import annotations

import warnings

import numpy as np
from scipy.linalg import solve_triangular

from .._checks import as_dout, as_float, check_positive, compute_dtype
from ..nn.activations import sigmoid
from ..registry import Mechanism, Sample, register
from ..testing.gradcheck import gradcheck

__all__ = ["ono_attention_forward", "ono_attention_backward", "ono_attention", "psd_safe_cholesky",
           "cholesky_vjp"]


def psd_safe_cholesky(c: np.ndarray, jitter: float | None = None) -> tuple[np.ndarray, float]:
    """Lower Cholesky factor of ``c`` and the diagonal jitter that was added.

    ``jitter=None`` reproduces upstream ``psd_safe_cholesky`` (GPyTorch's): try without jitter,
    then add ``1e-8`` (float64) / ``1e-6`` (float32) times ``10**i``, ``i = 0..9``, with a
    ``RuntimeWarning``. A float adds exactly that jitter. Raises ``ValueError`` if it never succeeds.
    """
    if jitter is not None:
        try:
            return np.linalg.cholesky(c + jitter * np.eye(c.shape[0], dtype=c.dtype)), float(jitter)
        except np.linalg.LinAlgError:
            raise ValueError(f"the feature covariance plus jitter {jitter} is not positive definite") from None
    try:
        return np.linalg.cholesky(c), 0.0
    except np.linalg.LinAlgError:
        pass
    base = 1e-8 if c.dtype == np.float64 else 1e-6
    for i in range(10):
        j = base * 10**i
        try:
            L = np.linalg.cholesky(c + j * np.eye(c.shape[0], dtype=c.dtype))
        except np.linalg.LinAlgError:
            continue
        warnings.warn(f"feature covariance not p.d., added jitter of {j} to the diagonal", RuntimeWarning,
                      stacklevel=3)
        return L, j
    raise ValueError("the feature covariance is not positive semi-definite (Cholesky failed with jitter up to "
                     f"{base * 1e9:g}); psi has rank < psi_dim or contains huge values")


def cholesky_vjp(L: np.ndarray, dL: np.ndarray) -> np.ndarray:
    r"""$\bar C = \mathrm{sym}\big(L^{-\top}\Phi(L^\top\bar L)L^{-1}\big)$ for $C = LL^\top$ (lower $\bar L$)."""
    phi = np.tril(L.T @ np.tril(dL))
    phi[np.diag_indices_from(phi)] *= 0.5
    # phi L^{-1} = (L^{-T} phi^T)^T, then L^{-T} (phi L^{-1})
    s = solve_triangular(L, solve_triangular(L, phi.T, lower=True, trans="T").T, lower=True, trans="T")
    return 0.5 * (s + s.T)


def _validate(psi, fx, params, feature_cov, jitter):
    psi = as_float(psi, "psi", ndim=3)
    fx = as_float(fx, "fx", ndim=3)
    if fx.shape[:2] != psi.shape[:2]:
        raise ValueError(f"fx must have the (B, N) of psi {psi.shape[:2]}; got {fx.shape[:2]}")
    k = psi.shape[-1]
    if not isinstance(params, dict) or set(params) != {"mu"}:
        got = sorted(params) if isinstance(params, dict) else type(params).__name__
        raise ValueError(f"params must be {{'mu': array of shape (psi_dim={k},)}}; got {got}")
    mu = as_float(params["mu"], "mu", ndim=1)
    if mu.shape != (k,):
        raise ValueError(f"mu must have shape (psi_dim={k},); got {mu.shape}")
    if feature_cov is not None:
        feature_cov = as_float(feature_cov, "feature_cov", ndim=2)
        if feature_cov.shape != (k, k):
            raise ValueError(f"feature_cov must have shape ({k}, {k}); got {feature_cov.shape}")
        if not np.allclose(feature_cov, feature_cov.T, rtol=1e-6, atol=1e-12):
            raise ValueError("feature_cov must be symmetric")
    if jitter is not None:
        jitter = check_positive(jitter, "jitter", allow_zero=True)
    dt = compute_dtype(psi, fx, mu, feature_cov)
    cov = None if feature_cov is None else feature_cov.astype(dt, copy=False)
    return psi.astype(dt, copy=False), fx.astype(dt, copy=False), mu.astype(dt, copy=False), cov, jitter, dt


def ono_attention_forward(psi, fx, params, *, feature_cov=None, jitter: float | None = None,
                          residual: bool = True):
    r"""ONO orthogonal attention $\mathrm{out}_b = (\tilde\psi_b\odot\mathrm{softplus}\,\mu)(\tilde\psi_b^\top f_b)\,[+f_b]$.

    Parameters
    ----------
    psi : array (B, N, k)
        Eigenfunction features (upstream ``self.proj(x)``), ``k = psi_dim``.
    fx : array (B, N, d_f)
        Function values.
    params : dict
        ``{"mu": (k,)}`` (upstream parameter ``mu``, init 0).
    feature_cov : array (k, k), optional
        ``None`` = training mode: the batch covariance $\psi^\top\psi/(BN)$ *with* gradient (the
        batch elements are coupled). An array = eval mode: upstream's EMA buffer, no gradient.
    jitter : float, optional
        ``None`` = upstream ``psd_safe_cholesky`` fallback; a float is always added to the diagonal.
    residual : bool
        Add $f$ to the output (``+ fx``), as upstream HEAD 8e4eee8 (default ``True``); ``False``
        is commit 86e1bfe (``#+ fx``), the kernel operator alone.

    Returns
    -------
    out, cache
        ``out (B, N, d_f)``; ``cache["psi_t"]`` holds the whitened features.
    """
    psi, fx, mu, cov, jitter, dt = _validate(psi, fx, params, feature_cov, jitter)
    if not isinstance(residual, (bool, np.bool_)):
        raise TypeError(f"residual must be a bool; got {type(residual).__name__}")
    b, n, k = psi.shape
    train = cov is None
    c = np.einsum("bnc,bnd->cd", psi, psi) / (b * n) if train else cov
    L, used = psd_safe_cholesky(c, jitter)
    psi_t = solve_triangular(L, psi.reshape(-1, k).T, lower=True).T.reshape(b, n, k)  # psi L^{-T}
    s = np.logaddexp(0.0, mu).astype(dt, copy=False)
    a = np.einsum("bnc,bnd->bcd", psi_t, fx)
    out = np.einsum("bnc,bcd->bnd", psi_t * s, a)
    if residual:
        out = out + fx
    cache = {"psi": psi, "fx": fx, "mu": mu, "L": L, "psi_t": psi_t, "s": s, "a": a, "train": train,
             "jitter": used, "dt": dt, "residual": bool(residual)}
    return out, cache


def ono_attention_backward(dout, cache):
    """Gradients ``{"psi", "fx", "mu"}`` (derivation in the module docstring)."""
    psi, fx, psi_t, s, a, L, dt = (cache[k] for k in ("psi", "fx", "psi_t", "s", "a", "L", "dt"))
    g = as_dout(dout, fx.shape, dt)
    b, n, k = psi.shape
    ga = np.einsum("bnd,bcd->bnc", g, a)                  # G A^T
    da = np.einsum("bnc,bnd->bcd", psi_t * s, g)
    dfx = np.einsum("bnc,bcd->bnd", psi_t, da)
    if cache["residual"]:
        dfx = dfx + g
    dpsi_t = ga * s + np.einsum("bnd,bcd->bnc", fx, da)
    dmu = np.einsum("bnc,bnc->c", ga, psi_t) * sigmoid(cache["mu"])
    flat = dpsi_t.reshape(-1, k)
    dpsi = solve_triangular(L, flat.T, lower=True, trans="T").T.reshape(b, n, k)   # dpsi_t L^{-1}
    if cache["train"]:
        dm = psi.reshape(-1, k).T @ flat                  # dM for M = L^{-T}
        # dL = -L^{-T} dM^T L^{-T}
        x = solve_triangular(L, dm.T, lower=True, trans="T")
        dL = -solve_triangular(L, x.T, lower=True).T
        dc = cholesky_vjp(L, np.tril(dL))
        dpsi = dpsi + (2.0 / (b * n)) * (psi @ dc)
    return {"psi": dpsi.astype(dt, copy=False), "fx": dfx, "mu": dmu.astype(dt, copy=False)}


def ono_attention(psi, fx, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`ono_attention_forward`."""
    return ono_attention_forward(psi, fx, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size, eval_mode=False):
    if size == "tiny":
        b, n, k, df = 2, int(rng.integers(4, 6)), 2, 2
    else:
        b, n, k, df = 2, int(rng.integers(8, 13)), 4, 3
    psi = rng.standard_normal((b, n, k)) + 0.3
    cfg = {}
    if eval_mode:
        r = rng.standard_normal((k, k))
        cfg["feature_cov"] = r @ r.T / k + np.eye(k)
    return Sample(inputs={"psi": psi, "fx": rng.standard_normal((b, n, df))},
                  params={"mu": rng.standard_normal(k)}, config=cfg)


def _explicit(psi, fx, params, *, feature_cov=None, jitter=None, residual=True):
    b, n, k = psi.shape
    c = np.einsum("bnc,bnd->cd", psi, psi) / (b * n) if feature_cov is None else feature_cov
    if jitter:
        c = c + jitter * np.eye(k)
    L = np.linalg.cholesky(c)
    psi_t = psi @ np.linalg.inv(L).T
    kern = np.einsum("bnc,c,bmc->bnm", psi_t, np.log1p(np.exp(params["mu"])), psi_t)   # Mercer kernel
    return kern @ fx + (fx if residual else 0.0)


def _check_whitened(rng):
    s = _sample(rng, "small")
    _, c = ono_attention_forward(**s.inputs, params=s.params)
    pt = c["psi_t"]
    b, n, k = pt.shape
    err = float(np.abs(np.einsum("bnc,bnd->cd", pt, pt) / (b * n) - np.eye(k)).max())
    assert err < 1e-12, f"whitened features are not orthonormal: max |psi_t^T psi_t/(BN) - I| = {err:.2e}"
    return err


def _check_symmetric_psd(rng):
    s = _sample(rng, "small")
    psi = s.inputs["psi"]
    b, n, _ = psi.shape
    # The operator on f: build its matrix column by column from the forward.
    basis = np.broadcast_to(np.eye(n)[None], (b, n, n)).copy()
    K = ono_attention(psi, basis, s.params, residual=False)   # (B, N, N): column j = K e_j
    asym = float(np.abs(K - np.swapaxes(K, 1, 2)).max())
    assert asym < 1e-12, f"kernel operator is not symmetric ({asym:.2e})"
    ev = np.linalg.eigvalsh(0.5 * (K + np.swapaxes(K, 1, 2)))
    assert ev.min() > -1e-10, f"kernel operator is not PSD (min eigenvalue {ev.min():.2e})"
    return asym


def _check_eval_mode(rng):
    # Eval mode (EMA covariance, no gradient through it) by FD; with the batch covariance passed
    # as the buffer the forward equals the training forward.
    s = _sample(rng, "tiny", eval_mode=True)
    rel = gradcheck(ono_attention_forward, ono_attention_backward, s).max_rel
    s = _sample(rng, "tiny")
    s.config["residual"] = False          # commit 86e1bfe: no "+ fx"
    rel = max(rel, gradcheck(ono_attention_forward, ono_attention_backward, s).max_rel)
    t = _sample(rng, "small")
    psi = t.inputs["psi"]
    b, n, _ = psi.shape
    cov = np.einsum("bnc,bnd->cd", psi, psi) / (b * n)
    err = float(np.abs(ono_attention(**t.inputs, params=t.params)
                       - ono_attention(**t.inputs, params=t.params, feature_cov=cov)).max())
    assert err < 1e-12, f"train and eval forward differ for the same covariance by {err:.2e}"
    return max(rel, err)


def _check_jitter_fallback(rng):
    # Rank-deficient features (k > N*B): upstream adds growing jitter with a warning.
    psi = rng.standard_normal((1, 2, 3))
    fx = rng.standard_normal((1, 2, 1))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        _, c = ono_attention_forward(psi, fx, {"mu": np.zeros(3)})
    assert c["jitter"] > 0 and any(issubclass(x.category, RuntimeWarning) for x in w), "no jitter fallback"
    return 0.0


register(
    Mechanism(
        slug="ono_orthogonal_attention", family="3-operator", tier="T1",
        title="ONO orthogonal attention: Cholesky-whitened features, softplus eigenvalues, Mercer kernel",
        paper="Xiao et al., Improved Operator Learning by Orthogonal Attention, ICML 2024",
        forward=ono_attention_forward, backward=ono_attention_backward, sample=_sample,
        reference=_explicit, docs="neural-operators.md#ono-orthogonal-attention", batched=False,
        checks={"whitened_orthonormal": _check_whitened, "kernel_symmetric_psd": _check_symmetric_psd,
                "eval_mode_and_no_residual": _check_eval_mode, "jitter_fallback": _check_jitter_fallback},
        notes="Training mode couples the batch through the covariance (batched=False).",
    ),
)
