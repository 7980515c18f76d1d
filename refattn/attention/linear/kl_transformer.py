r"""KL-Transformer: linear attention on spectral random features whose distribution is learned.

Chowdhury, Solomou, Dubey, Sachan, "Learning the Transformer Kernel", TMLR 2022, arXiv 2110.08323.
Upstream: ``cs1160701/OnLearningTheKernel`` ``fast_transformers/feature_maps/fourier_features.py``
(``SmoothedGaussianMixtureFourierFeatures``, ``GaussianMixturePositive``,
``SmoothedGenerativeRandomFourierFeatures``, ``GenerativePositiveRandomFeatures``,
``GeneratorBlock``), ``fast_transformers/feature_maps/fastfood.py``
(``SmoothedFastFoodRandomFeatures``, ``FastFoodPositiveFeatures``) and
``fast_transformers/attention/linear_attention.py`` @ ``a8e3d3bb80bd866c52a9d9ef5e4f8f5a771c65e6``
(the ``text/model.py`` attention types ``mix-gauss-fourier``, ``mix-gauss-positive``,
``fsgb-fastfood``, ``fsgb-positive-fastfood``, ``generative-fourier``, ``generative-positive``).

The Transformer kernel is a shift-invariant (RKS) or positive (PRF) kernel whose spectral
distribution $p(\omega)$ is learned; a set of $M$ samples $\Omega = [\omega_1\dots\omega_M]$ is a
differentiable function of fixed noise $\varepsilon$ and the parameters. With
$\tilde x = \sqrt{\tau}\,x$ ($\tau$ = ``softmax_temp``, default $1/\sqrt d$) and $U = \tilde x\Omega$:

$$\phi_{\text{RKS}}(x) = \big[M^{-1/2}\cos U;\ M^{-1/2}\sin U;\ s\big],\qquad
\phi_{\text{PRF}}(x) = \exp\big(U - \|\tilde x\|^2 - \tfrac12\log M\big),$$

$$O = \frac{\Phi_Q(\Phi_K^\top V)}{\Phi_Q(\Phi_K^\top\mathbf 1) + \epsilon}\quad(\text{prefix sums when causal}),$$

$s$ = ``smoothing`` (RKS features can be negative; the constant keeps the denominator positive).
$\mathbb E_\omega[\phi_{\text{RKS}}(x)\cdot\phi_{\text{RKS}}(y)] = \mathbb E[\cos\omega^\top(\tilde x-\tilde y)]\cdot c + s^2$
and $\mathbb E[\phi_{\text{PRF}}(x)\cdot\phi_{\text{PRF}}(y)] = \mathbb E[e^{\omega^\top(\tilde x+\tilde y)}]e^{-\|\tilde x\|^2-\|\tilde y\|^2}$.

Spectral distributions (``feature``)
------------------------------------
* ``gmm_rks``: per head $h$ a Gaussian $\mathcal N(\pm\mu_h, \Sigma_h^\top\Sigma_h)$, symmetrised (a
  real kernel needs $p(\omega) = p(-\omega)$): $\Omega_h = [\Sigma_h^\top\varepsilon + \mu_h,\
  \Sigma_h^\top\varepsilon - \mu_h]$, $\varepsilon\in\mathbb R^{d\times M}$; the kernel is
  $2\cos(\mu_h^\top\delta)e^{-\|\Sigma_h\delta\|^2/2}$ ($M$ counts the $\varepsilon$ columns, so
  there are $4M$ trigonometric features). Parameters ``feature_map.mean`` $(H, d)$,
  ``feature_map.sigma`` $(H, d, d)$.
* ``gmm_prf``: $\Omega_h = \varepsilon\odot e^{\sigma_h/2} + \mu_h$ (diagonal covariance, log-variance
  $\sigma_h$); kernel $e^{\mu_h^\top(\tilde x+\tilde y) + \|e^{\sigma_h/2}\odot(\tilde x+\tilde y)\|^2/2
  - \|\tilde x\|^2-\|\tilde y\|^2}$. Parameters ``feature_map.mean``, ``feature_map.sigma`` $(H, d)$.
* ``fastfood_rks`` / ``fastfood_prf``: $\Omega^\top = V = d^{-1/2}\,\mathrm{diag}(S)H\mathrm{diag}(G)\Pi H
  \mathrm{diag}(B)$ shared by all heads ($M = d$, $d$ a power of 2), $S, G, B$ learned
  (``feature_map.S/G/B``), $\Pi$ the fixed ``fastfood_permutation``
  (`refattn.attention.linear.spectraformer.fastfood_matrix`).
* ``generator_rks`` / ``generator_prf``: $\Omega^\top = g(\varepsilon)$, $\varepsilon\in\mathbb R^{M\times d_0}$,
  $g$ the upstream ``GeneratorBlock``: hidden layers Linear → BatchNorm1d (training mode, batch
  statistics over the $M$ samples, eps 1e-5) → leaky ReLU (slope 0.01), last layer Linear →
  tanh. Parameters ``feature_map.generator.generator_layers.{i}.linear.weight`` (stored
  ``(in, out)``) / ``.bias`` and ``.batch_norm.weight`` / ``.bias``.

Backward
--------
The feature-space core of `refattn.attention.linear.core`, then the feature VJP with
$G = \partial L/\partial\phi$: RKS $dU = M^{-1/2}(-G^{c}\odot\sin U + G^{s}\odot\cos U)$; PRF
$\gamma = G\odot\phi$, $dU = \gamma$, plus $-2\tilde x\sum_m\gamma_m$ on $d\tilde x$. Then
$d\tilde x = dU\,\Omega^\top$ and $d\Omega_h = \sum_{b,n}\tilde x^\top dU$ (summed over heads when
shared), and through each builder: ``gmm_rks`` $d\Sigma_h = \varepsilon\,(d\Omega^+ + d\Omega^-)^\top$,
$d\mu_h = \sum_m(d\Omega^+ - d\Omega^-)$; ``gmm_prf`` $d\mu_h = \sum_m d\Omega$,
$d\sigma_h = \tfrac12\sum_m d\Omega\odot\varepsilon\odot e^{\sigma_h/2}$; FastFood
`fastfood_matrix_vjp`; the generator by reverse-mode through tanh, the linear layers
(`refattn.nn.linear`), leaky ReLU and the batch norm (`refattn.nn.norms.normalize_backward`).

Conventions and upstream notes
------------------------------
``smoothing`` default 1.0 (the feature-map classes; ``text/model.py`` uses 0.36 for
``mix-gauss-fourier``); ``eps`` 1e-6 (fast-transformers ``LinearAttention``). The order of the
trigonometric features is $[\cos U^+, \cos U^-, \sin U^+, \sin U^-]$ where upstream interleaves
$[\cos U^+, \sin U^+, \cos U^-, \sin U^-]$ (inner products, hence outputs, are identical).
Upstream ``FastFoodPositiveFeatures.__init__`` calls ``super(SmoothedFastFoodRandomFeatures,
self)`` and cannot be constructed; ``fastfood_prf`` implements its evident ``forward``.
``generator_prf`` divides by $\sqrt M$ where upstream uses $\sqrt{n_{dims}}$, $n_{dims}\approx 2M$
(a constant that only meets the tiny ``eps``). Upstream redraws $\varepsilon$ every call in
training; here it is the config ``omega`` (draw it with ``rng.standard_normal``).
"""

from __future__ import annotations

import math
import re

import numpy as np

from ..._checks import as_dout, as_float, check_choice, check_param_keys, check_positive
from ...nn.linear import linear_prefixed, linear_prefixed_vjp
from ...nn.norms import normalize_backward, normalize_forward
from ...registry import Mechanism, Sample, register
from ._samples import fd_max_rel, random_qkv
from .core import linear_core_backward, linear_core_forward, mT, validate_linear_qkv
from .spectraformer import fastfood_draw, fastfood_matrix, fastfood_matrix_vjp

__all__ = [
    "KL_FEATURES",
    "kl_spectral_samples_forward",
    "kl_spectral_samples_backward",
    "kl_features_forward",
    "kl_features_backward",
    "kl_transformer_forward",
    "kl_transformer_backward",
    "kl_transformer_attention",
]

KL_FEATURES = ("gmm_rks", "gmm_prf", "fastfood_rks", "fastfood_prf", "generator_rks", "generator_prf")
_GEN = "feature_map.generator.generator_layers"
_LEAK = 0.01
_BN_EPS = 1e-5
_GEN_RE = re.compile(re.escape(_GEN) + r"\.(\d+)\.linear\.weight")


def _generator_depth(params) -> int:
    idx = {int(m.group(1)) for key in params if isinstance(key, str) and (m := _GEN_RE.fullmatch(key))}
    if not idx or idx != set(range(len(idx))):
        raise ValueError(f"params must hold {_GEN}.0.linear.weight ... {_GEN}.L-1.linear.weight (consecutive); "
                         f"got keys {sorted(params)}")
    return len(idx)


# --------------------------------------------------------------------------------------------
# Spectral samples Omega (Hh, d, M') from the parameters and the fixed noise


def kl_spectral_samples_forward(feature: str, params: dict, omega, perm=None):
    r"""The spectral samples $\Omega$ ``(Hh, d, M')`` of ``feature`` (unvalidated; ``Hh`` = H for
    the per-head GMMs, 1 for the shared FastFood and generator). Returns ``(Omega, cache)``."""
    if feature == "gmm_rks":
        mu, sig = params["feature_map.mean"], params["feature_map.sigma"]
        og = np.einsum("sm,hsd->hdm", omega, sig)
        return np.concatenate([og + mu[..., None], og - mu[..., None]], axis=-1), {}
    if feature == "gmm_prf":
        e = np.exp(0.5 * params["feature_map.sigma"])
        return omega[None] * e[..., None] + params["feature_map.mean"][..., None], {"e": e}
    if feature.startswith("fastfood"):
        S, G, B = (params[f"feature_map.{c}"] for c in "SGB")
        return mT(fastfood_matrix(S, G, B, perm, S.shape[0] ** -0.5))[None], {}
    h, acts = omega, []
    depth = _generator_depth(params)
    for i in range(depth):
        z = linear_prefixed(params, f"{_GEN}.{i}.linear", h)
        if i < depth - 1:
            zh, st = normalize_forward(z, (0,), _BN_EPS)
            y = zh * params[f"{_GEN}.{i}.batch_norm.weight"] + params[f"{_GEN}.{i}.batch_norm.bias"]
            acts.append((h, zh, st, y))
            h = np.where(y > 0, y, _LEAK * y)
        else:
            acts.append((h, None, None, z))
            h = np.tanh(z)
    return mT(h)[None], {"acts": acts, "out": h, "depth": depth}


def kl_spectral_samples_backward(dOmega, feature: str, params: dict, omega, cache, perm=None) -> dict:
    """Parameter gradients of :func:`kl_spectral_samples_forward` for ``dOmega`` (same shape as Omega)."""
    if feature == "gmm_rks":
        M = omega.shape[1]
        dp, dm = dOmega[..., :M], dOmega[..., M:]
        return {"feature_map.mean": np.sum(dp - dm, axis=-1),
                "feature_map.sigma": np.einsum("sm,hdm->hsd", omega, dp + dm)}
    if feature == "gmm_prf":
        return {"feature_map.mean": np.sum(dOmega, axis=-1),
                "feature_map.sigma": 0.5 * np.sum(dOmega * omega[None], axis=-1) * cache["e"]}
    if feature.startswith("fastfood"):
        S, G, B = (params[f"feature_map.{c}"] for c in "SGB")
        dS, dG, dB = fastfood_matrix_vjp(mT(dOmega[0]), S, G, B, perm, S.shape[0] ** -0.5)
        return {"feature_map.S": dS, "feature_map.G": dG, "feature_map.B": dB}
    grads: dict = {}
    dh = mT(dOmega[0])
    for i in range(cache["depth"] - 1, -1, -1):
        h_in, zh, st, y = cache["acts"][i]
        if i == cache["depth"] - 1:
            dz = dh * (1.0 - cache["out"] ** 2)
        else:
            dy = np.where(y > 0, dh, _LEAK * dh)
            gam = params[f"{_GEN}.{i}.batch_norm.weight"]
            grads[f"{_GEN}.{i}.batch_norm.weight"] = np.sum(dy * zh, axis=0)
            grads[f"{_GEN}.{i}.batch_norm.bias"] = np.sum(dy, axis=0)
            dz = normalize_backward(dy * gam, zh, st)
        dh = linear_prefixed_vjp(grads, params, f"{_GEN}.{i}.linear", dz, h_in)
    return grads


# --------------------------------------------------------------------------------------------
# Features


def kl_features_forward(xt, Omega, *, kind: str, scale: float = 1.0, smoothing: float = 1.0):
    r"""RKS (``kind="rks"``: $[cU_{\cos}; cU_{\sin}; s]$ with $c$ = ``scale``) or PRF (``"prf"``) features
    of the scaled input ``xt (..., H, N, d)`` for ``Omega (Hh, d, M')`` (formulas in the module
    docstring). Returns ``(phi, cache)``."""
    U = np.einsum("...hnd,hdm->...hnm", xt, Omega) if Omega.shape[0] > 1 else xt @ Omega[0]
    if kind == "rks":
        cs, sn = np.cos(U), np.sin(U)
        sm = np.full(U.shape[:-1] + (1,), smoothing, dtype=U.dtype)
        return np.concatenate([scale * cs, scale * sn, sm], axis=-1), {"kind": kind, "c": scale, "cs": cs, "sn": sn,
                                                                      "xt": xt, "Omega": Omega}
    phi = np.exp(U - np.sum(xt * xt, axis=-1, keepdims=True) - 0.5 * math.log(Omega.shape[-1]))
    return phi, {"kind": kind, "phi": phi, "xt": xt, "Omega": Omega}


def kl_features_backward(dphi, fc):
    """VJP of :func:`kl_features_forward`: ``(dxt, dOmega)``."""
    xt, Omega = fc["xt"], fc["Omega"]
    if fc["kind"] == "rks":
        M = Omega.shape[-1]
        dU = fc["c"] * (-dphi[..., :M] * fc["sn"] + dphi[..., M:2 * M] * fc["cs"])
        dxt = np.zeros_like(xt)
    else:
        dU = dphi * fc["phi"]
        dxt = -2.0 * xt * np.sum(dU, axis=-1, keepdims=True)
    if Omega.shape[0] > 1:
        dxt = dxt + np.einsum("...hnm,hdm->...hnd", dU, Omega)
        lead = tuple(range(xt.ndim - 3))
        dOmega = np.einsum("...hnd,...hnm->...hdm", xt, dU)
        dOmega = dOmega.sum(axis=lead) if lead else dOmega
    else:
        dxt = dxt + dU @ mT(Omega[0])
        dOmega = (xt.reshape(-1, xt.shape[-1]).T @ dU.reshape(-1, dU.shape[-1]))[None]
    return dxt, dOmega


# --------------------------------------------------------------------------------------------
# Attention


def _validate(q, k, v, params, feature, omega, perm, causal, smoothing, eps, softmax_temp):
    check_choice(feature, "feature", KL_FEATURES)
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be a bool; got {type(causal).__name__}")
    smoothing = check_positive(smoothing, "smoothing", allow_zero=True)
    eps = check_positive(eps, "eps", allow_zero=True)
    q, k, v = validate_linear_qkv(q, k, v, same_length=bool(causal))
    dt, H, d = q.dtype, q.shape[-3], q.shape[-1]
    temp = d ** -0.5 if softmax_temp is None else check_positive(softmax_temp, "softmax_temp")
    where = f"kl_transformer feature={feature!r}"
    if not isinstance(params, dict):
        raise TypeError(f"params for {where} must be a dict of arrays; got {type(params).__name__}")
    if feature.startswith("gmm"):
        spec = {"feature_map.mean": (H, d), "feature_map.sigma": (H, d, d) if feature == "gmm_rks" else (H, d)}
    elif feature.startswith("fastfood"):
        if d & (d - 1):
            raise ValueError(f"{feature} needs q's feature size d a power of 2 (Hadamard transform); got d={d}")
        spec = {f"feature_map.{c}": (d,) for c in "SGB"}
    else:
        depth = _generator_depth(params) if isinstance(params, dict) else 0
        spec = {}
        for i in range(depth):
            w = as_float(params[f"{_GEN}.{i}.linear.weight"], f"{_GEN}.{i}.linear.weight", ndim=2)
            spec[f"{_GEN}.{i}.linear.weight"] = w.shape
            spec[f"{_GEN}.{i}.linear.bias"] = (w.shape[1],)
            if i < depth - 1:
                spec[f"{_GEN}.{i}.batch_norm.weight"] = (w.shape[1],)
                spec[f"{_GEN}.{i}.batch_norm.bias"] = (w.shape[1],)
        for i in range(1, depth):
            (a0, a1), (b0, b1) = spec[f"{_GEN}.{i - 1}.linear.weight"], spec[f"{_GEN}.{i}.linear.weight"]
            if b0 != a1:
                # PyTorch's (out, in) layout on either side of the link: name the one whose transpose fits
                fix = (f"{_GEN}.{i}.linear.weight", (b0, b1)) if b1 == a1 else (
                    (f"{_GEN}.{i - 1}.linear.weight", (a0, a1)) if a0 == b0 else None)
                hint = (f" (PyTorch's nn.Linear.weight is (out, in): pass the transpose of {fix[0]}, of shape "
                        f"{fix[1][::-1]})" if fix else "")
                raise ValueError(f"{_GEN}.{i}.linear.weight must have {a1} input rows ({_GEN}.{i - 1}.linear.weight "
                                 f"has shape {(a0, a1)}, read as (in, out)); got {(b0, b1)}{hint}")
        if spec[f"{_GEN}.{depth - 1}.linear.weight"][1] != d:
            last = spec[f"{_GEN}.{depth - 1}.linear.weight"]
            hint = (f" (PyTorch's nn.Linear.weight is (out, in): pass its transpose, of shape {last[::-1]})"
                    if last[0] == d and depth == 1 else "")
            raise ValueError(f"{_GEN}.{depth - 1}.linear.weight must output d={d} features on axis 1 (refattn "
                             f"weights are (in, out)); got {last}{hint}")
    check_param_keys(params, tuple(spec), where=where, shapes=spec)
    P = {}
    for key, shape in spec.items():
        arr = as_float(params[key], key)
        if arr.shape != tuple(shape):
            raise ValueError(f"{key} must have shape {tuple(shape)}; got {arr.shape}")
        P[key] = arr.astype(dt, copy=False)
    if feature.startswith("fastfood"):
        perm = np.asarray(perm) if perm is not None else None
        if perm is None or perm.shape != (d,) or perm.dtype.kind not in "iu" or sorted(perm.tolist()) != list(range(d)):
            raise ValueError(f"fastfood_permutation must be a permutation of range(d={d}) (an int array); got {perm!r}")
        if omega is not None:
            raise ValueError(f"omega must be None for {feature} (FastFood has no noise buffer)")
        return q, k, v, P, None, perm, smoothing, eps, temp
    omega = as_float(omega, "omega", ndim=2)
    if feature.startswith("gmm") and omega.shape[0] != d:
        raise ValueError(f"omega must have shape (d={d}, M) for {feature}; got {omega.shape}")
    if feature.startswith("generator"):
        d0 = P[f"{_GEN}.0.linear.weight"].shape[0]
        if omega.shape[1] != d0 or omega.shape[0] < 2:
            raise ValueError(f"omega must have shape (M >= 2, {d0}) (the generator's noise input); got {omega.shape}")
    return q, k, v, P, omega.astype(dt, copy=False), perm, smoothing, eps, temp


def kl_transformer_forward(q, k, v, params, *, feature: str = "gmm_rks", omega=None, fastfood_permutation=None,
                           causal: bool = False, smoothing: float = 1.0, eps: float = 1e-6, softmax_temp=None):
    r"""KL-Transformer linear attention with a learned spectral kernel (Chowdhury, Solomou, Dubey,
    Sachan, "Learning the Transformer Kernel", TMLR 2022, arXiv 2110.08323).

    $O = \Phi_Q(\Phi_K^\top V)\oslash(\Phi_Q(\Phi_K^\top\mathbf 1)+\epsilon)$ with the RKS or PRF
    features of the learned spectral samples $\Omega$ (module docstring).

    Parameters
    ----------
    q (..., H, N, d), k (..., H, M, d), v (..., H, M, dv)
    params : dict
        The spectral-distribution parameters of ``feature`` (module docstring).
    feature : {"gmm_rks", "gmm_prf", "fastfood_rks", "fastfood_prf", "generator_rks", "generator_prf"}
    omega : array, config
        The fixed noise: ``(d, M)`` for the GMMs, ``(M, d0)`` for the generator, None for FastFood.
    fastfood_permutation : int array (d,)
        FastFood's permutation $\Pi$.
    causal : bool
        Prefix sums (fast-transformers ``CausalLinearAttention``).
    smoothing : float
        The constant feature $s$ appended to RKS features (default 1.0).
    eps : float
        Added to the denominator (fast-transformers 1e-6).
    softmax_temp : float, optional
        Inputs are scaled by $\sqrt\tau$ (default $\tau = 1/\sqrt d$).
    """
    q, k, v, P, omega, perm, smoothing, eps, temp = _validate(
        q, k, v, params, feature, omega, fastfood_permutation, causal, smoothing, eps, softmax_temp)
    Omega, oc = kl_spectral_samples_forward(feature, P, omega, perm)
    if Omega.shape[0] == 1:
        Omega = Omega.astype(q.dtype, copy=False)
    a = math.sqrt(temp)
    kind = feature.rsplit("_", 1)[1]
    scale = (omega.shape[1] if feature == "gmm_rks" else Omega.shape[-1]) ** -0.5
    fq, cq = kl_features_forward(a * q, Omega, kind=kind, scale=scale, smoothing=smoothing)
    fk, ck = kl_features_forward(a * k, Omega, kind=kind, scale=scale, smoothing=smoothing)
    out, state = linear_core_forward(fq, fk, v, causal=bool(causal), eps=eps, normalise=True)
    cache = {"fq": fq, "fk": fk, "cq": cq, "ck": ck, "v": v, "out": out, "state": state, "causal": bool(causal),
             "a": a, "feature": feature, "P": P, "omega": omega, "oc": oc, "perm": perm}
    return out.copy(), cache


def kl_transformer_backward(dout, cache):
    r"""Gradients ``{"q", "k", "v"}`` and every parameter of :func:`kl_transformer_forward`: the core
    VJP, the feature VJP, then the spectral-sample builder (module docstring)."""
    out = cache["out"]
    g = as_dout(dout, out.shape, out.dtype)
    dfq, dfk, dv = linear_core_backward(g, cache["fq"], cache["fk"], cache["v"], out, cache["state"],
                                        causal=cache["causal"], normalise=True)
    dxq, dOq = kl_features_backward(dfq, cache["cq"])
    dxk, dOk = kl_features_backward(dfk, cache["ck"])
    grads = kl_spectral_samples_backward(dOq + dOk, cache["feature"], cache["P"], cache["omega"], cache["oc"],
                                         cache["perm"])
    a = cache["a"]
    return {"q": a * dxq, "k": a * dxk, "v": dv, **grads}


def kl_transformer_attention(q, k, v, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`kl_transformer_forward`."""
    return kl_transformer_forward(q, k, v, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _reference(q, k, v, params, *, feature="gmm_rks", omega=None, fastfood_permutation=None, causal=False,
               smoothing=1.0, eps=1e-6, softmax_temp=None):
    """Explicit form: A = phi(Q) phi(K)^T built feature by feature (tril if causal), O = AV/(A1 + eps)."""
    d = q.shape[-1]
    a = math.sqrt(d ** -0.5 if softmax_temp is None else softmax_temp)
    Omega, _ = kl_spectral_samples_forward(feature, params, omega, None if fastfood_permutation is None
                                           else np.asarray(fastfood_permutation))
    Om = np.broadcast_to(Omega, (q.shape[-3],) + Omega.shape[1:])
    Uq = np.einsum("...hnd,hdm->...hnm", a * q, Om)
    Uk = np.einsum("...hnd,hdm->...hnm", a * k, Om)
    if feature.endswith("rks"):
        c2 = 1.0 / (omega.shape[1] if feature == "gmm_rks" else Omega.shape[-1])
        A = c2 * np.sum(np.cos(Uq[..., :, None, :] - Uk[..., None, :, :]), axis=-1) + smoothing ** 2
    else:
        lq = Uq - np.sum((a * q) ** 2, -1, keepdims=True)
        lk = Uk - np.sum((a * k) ** 2, -1, keepdims=True)
        A = np.sum(np.exp(lq[..., :, None, :] + lk[..., None, :, :]), axis=-1) / Omega.shape[-1]
    if causal:
        A = np.tril(A)
    return (A @ v) / (A.sum(-1, keepdims=True) + eps)


def _kl_params(rng, feature, H, d, m, small=False):
    """Parameters, noise and permutation of ``feature`` at a moderate scale."""
    config = {}
    if feature.startswith("gmm"):
        params = {"feature_map.mean": 0.3 * rng.standard_normal((H, d)),
                  "feature_map.sigma": (0.4 * rng.standard_normal((H, d, d)) + 0.6 * np.eye(d)
                                        if feature == "gmm_rks" else 0.3 * rng.standard_normal((H, d)))}
        config["omega"] = rng.standard_normal((d, m))
    elif feature.startswith("fastfood"):
        f = fastfood_draw(d, rng)
        params = {"feature_map.S": f["S"] + 0.1 * rng.standard_normal(d), "feature_map.G": f["G"],
                  "feature_map.B": f["B"] + 0.1 * rng.standard_normal(d)}
        config["fastfood_permutation"] = f["perm"]
    else:
        dims = (2, 5, 3) if small else (2, 3)
        params = {}
        for i, (n_in, n_out) in enumerate(zip(dims, dims[1:] + (d,))):
            params[f"{_GEN}.{i}.linear.weight"] = rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)
            params[f"{_GEN}.{i}.linear.bias"] = 0.1 * rng.standard_normal(n_out)
            if i < len(dims) - 1:
                params[f"{_GEN}.{i}.batch_norm.weight"] = 1.0 + 0.1 * rng.standard_normal(n_out)
                params[f"{_GEN}.{i}.batch_norm.bias"] = 0.1 * rng.standard_normal(n_out)
        config["omega"] = rng.standard_normal((m, dims[0]))
    return params, config


def _sample_feature(rng, size, feature, causal):
    q, k, v = random_qkv(rng, size, d=4)
    if size == "tiny" and feature.startswith(("gmm_rks", "generator")):
        q, k, v = q[..., :3, :], k[..., :3, :], v[..., :3, :]
    m = 3 if size == "tiny" else 8
    params, config = _kl_params(rng, feature, q.shape[1], 4, m, small=size != "tiny")
    config.update(feature=feature, causal=causal)
    return Sample(inputs={"q": q, "k": k, "v": v}, params=params, config=config)


def _sample(rng, size):
    return _sample_feature(rng, size, KL_FEATURES[int(rng.integers(0, len(KL_FEATURES)))], bool(rng.integers(0, 2)))


def _check_every_feature_equals_explicit(rng):
    err = 0.0
    for feature in KL_FEATURES:
        for causal in (False, True):
            s = _sample_feature(rng, "small", feature, causal)
            out = kl_transformer_attention(**s.inputs, params=s.params, **s.config)
            err = max(err, float(np.max(np.abs(out - _reference(**s.inputs, params=s.params, **s.config)))))
    assert err < 1e-10, err
    return err


def _check_fd_generator_and_gmm(rng):
    """Finite differences through the two deepest builders (generator MLP with batch norm, full-covariance
    GMM) on one head (tests/test_linear_l1.py covers all six features)."""
    errs = []
    for feature in ("generator_prf", "gmm_rks"):
        s = _sample_feature(rng, "tiny", feature, feature == "gmm_rks")
        inputs = {key: val[:1, :1] for key, val in s.inputs.items()}
        params = {key: (val[:1] if key.startswith("feature_map.mean") or key.startswith("feature_map.sigma") else val)
                  for key, val in s.params.items()}
        errs.append(fd_max_rel(kl_transformer_forward, kl_transformer_backward, Sample(inputs, params, s.config)))
    return max(errs)


def _mc_terms(feature, params, omega, perm, x, y):
    """Per-sample kernel terms of phi(x).phi(y) (smoothing removed), for the Monte-Carlo checks."""
    Omega, _ = kl_spectral_samples_forward(feature, params, omega, perm)
    ux, uy = x @ Omega[0], y @ Omega[0]
    if feature.endswith("rks"):
        t = np.cos(ux - uy)
        return t[: t.size // 2] + t[t.size // 2:] if feature == "gmm_rks" else t
    return np.exp(ux + uy - x @ x - y @ y)


def _check_unbiased(rng):
    """Monte-Carlo mean (fixed seeds) of the learned-kernel estimators against their closed forms:
    GMM-RKS 2 cos(mu.delta) exp(-|Sigma delta|^2/2), GMM-PRF exp(mu.s + |e (.) s|^2/2 - |x|^2 - |y|^2)
    (s = x + y), FastFood-RKS exp(-|delta|^2/2) over FastFood draws; each within 4 standard errors of
    M = 40000 samples, with the standard error below 3% of max(|kernel|, 0.5)."""
    rng = np.random.default_rng(21)
    d, M = 4, 40_000
    x, y = 0.4 * rng.standard_normal(d), 0.4 * rng.standard_normal(d)
    p, _ = _kl_params(rng, "gmm_rks", 1, d, 2)
    delta = x - y
    t = _mc_terms("gmm_rks", p, rng.standard_normal((d, M)), None, x, y)
    exact = {"gmm_rks": 2 * np.cos(p["feature_map.mean"][0] @ delta)
             * np.exp(-0.5 * np.sum((p["feature_map.sigma"][0] @ delta) ** 2))}
    terms = {"gmm_rks": t}
    p2, _ = _kl_params(rng, "gmm_prf", 1, d, 2)
    s = x + y
    exact["gmm_prf"] = np.exp(p2["feature_map.mean"][0] @ s + 0.5 * np.sum((np.exp(0.5 * p2["feature_map.sigma"][0])
                                                                            * s) ** 2) - x @ x - y @ y)
    terms["gmm_prf"] = _mc_terms("gmm_prf", p2, rng.standard_normal((d, M)), None, x, y)
    R = M // d  # independent FastFood draws, stacked (the batched form of fastfood_matrix)
    G = rng.standard_normal((R, d))
    Bs = rng.choice(np.array([-1.0, 1.0]), size=(R, d))
    S = np.sqrt(rng.chisquare(d, size=(R, d))) / np.linalg.norm(G, axis=1, keepdims=True)
    V = fastfood_matrix(S, G, Bs, np.argsort(rng.random((R, d)), axis=1), d ** -0.5)  # the fastfood_draw law
    terms["fastfood_rks"] = np.cos((V @ delta).ravel())
    exact["fastfood_rks"] = np.exp(-0.5 * delta @ delta)
    worst = 0.0
    for name, tt in terms.items():
        se = tt.std() / np.sqrt(tt.size)
        assert abs(tt.mean() - exact[name]) < 4 * se and se < 0.03 * max(abs(exact[name]), 0.5), (name, tt.mean(), exact[name], se)
        worst = max(worst, abs(tt.mean() - exact[name]) / abs(exact[name]))
    return worst


register(
    Mechanism(
        slug="kl_transformer_learned_spectral_kernel", family="4-linear-kernel-sparse", tier="T2",
        title="KL-Transformer: learned spectral-kernel random-feature attention (GMM, FastFood, generator)",
        paper="Chowdhury, Solomou, Dubey, Sachan, 'Learning the Transformer Kernel', Transactions on Machine "
              "Learning Research 2022, arXiv 2110.08323",
        official_code="cs1160701/OnLearningTheKernel",
        forward=kl_transformer_forward, backward=kl_transformer_backward, sample=_sample, reference=_reference,
        checks={"every_feature_equals_explicit": _check_every_feature_equals_explicit,
                "gradcheck_generator_and_gmm": _check_fd_generator_and_gmm,
                "kernel_estimates_unbiased": _check_unbiased},
        docs="linear/kernel-features.md#kl-transformer",
    ),
)
