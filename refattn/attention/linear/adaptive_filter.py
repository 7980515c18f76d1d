r"""Adaptive Filter Attention (isotropic AFA): attention weights from a linear SDE's propagated
precisions, robustly reweighted by the query-key residual.

Racioppo, "Attention as an Adaptive Filter", 2025, arXiv 2509.04154. Official code read (and run
against this module in float64): ``PCR-git/Adaptive-Filter-Attention``
``model/multihead_isotropic_AFA.py`` (``MultiheadIsotropicAFA``),
``isotropic_afa/simplified_precision_utils.py`` (``compute_exp_kernel_isotropic``,
``compute_covariance_matrix_safe``, ``compute_residual_norm_isotropic``),
``model/model_utils.py`` (``compute_lambda``) and ``utils/complex_ops.py``
(``apply_interleaved_rope``) @dc4f7b7a6a1d269599e991df27051f29f1fdfbee, with the ablation flags
of the repository's ``Main.ipynb`` (full residual norm, robust rational weight, DLE additive and
multiplicative biases, learned rotations, value rotation, inner residual with learned gate,
next-step prediction, no complex norms, shared key/value dynamics).

Forward (per head $h$; complex vectors of width $d$ stored as real and imaginary halves)
------------------------------------------------------------------------------------------
Projections $Q = Z_qW_q + b_q$ (first $Hd$ columns the real parts, the next $Hd$ the imaginary
parts), likewise $K$, $V$. Dynamics: $\mu = (\sigma(\mu_v) - 1)\,\tfrac{10}{2L_s} - 10^{-5} < 0$
(``compute_lambda``, $L_s$ = ``seq_len``), rotation rates $\omega\in\mathbb R^{d}$ = the pairs
$(\lambda, -\lambda)$ of ``lambda_imag_v`` interleaved, times $10\cdot2\pi/(2L_s)$; noises
$\sigma^2 = \mathrm{softplus}(\sigma_v)$, $\eta^2 = \mathrm{softplus}(\eta_v)+\epsilon$,
$\gamma^2 = \mathrm{softplus}(\gamma_v)+\epsilon$, $\nu = \mathrm{softplus}(\nu_{\sqrt{}})+\epsilon$,
$\epsilon = 10^{-5}$. With times $t_i = i$, $\Delta_{ij} = |t_i - t_j|$, $E_{ij} = e^{\mu\Delta_{ij}}$
(exponent clamped to $[-10, 10]$) and the differential-Lyapunov covariance

$$V_{ij} = \sigma^2\frac{e^{2\mu\Delta_{ij}} - 1}{2\mu} + \eta^2E_{ij}^2 + \gamma^2,$$

the rotated (pulled-back) vectors $\tilde Q_i = Q_i\odot e^{-i\omega t_i}$, $\tilde K_j$, $\tilde V_j$
alike, the squared residual $R_{ij} = \lVert\tilde Q_i - E_{ij}\tilde K_j\rVert^2 =
\lVert\tilde Q_i\rVert^2 + E_{ij}^2\lVert\tilde K_j\rVert^2 - 2E_{ij}\,\mathrm{Re}\langle\tilde Q_i,\tilde K_j\rangle$,

$$s_{ij} = \tau^2\Big(-\log V_{ij} - \log\big(1 + \tfrac{R_{ij}}{\nu dV_{ij}}\big)\Big),\qquad
A = \mathrm{softmax}_j(s)\ \text{(causal)},\qquad \hat A = A\odot E,$$

i.e. $\hat A_{ij}\propto E_{ij}P_{ij}/(1 + P_{ij}R_{ij}/(\nu d))$ with precision $P = 1/V$ when
$\tau = 1$. Estimate $\hat x_i = e^{i\omega t_i}\sum_j\hat A_{ij}\tilde V_j$, latent
$\ell_i = g\odot\hat x_i + (1-g)\odot V_i$ with $g = \sigma(P_{scale})$, prediction
$p_i = e^{\mu}\,e^{i\omega}\odot\ell_i$, output $o = [\mathrm{Re}\,p, \mathrm{Im}\,p]W_o + b_o$.

Backward (hand-derived; complex gradients $\bar z = \partial L/\partial\mathrm{Re}z + i\,\partial L/\partial\mathrm{Im}z$)
----------------------------------------------------------------------------------------------------
A unit-modulus factor $y = ce^{i\phi}x$ gives $\bar x = c\,e^{-i\phi}\bar y$ and
$\bar\phi = \mathrm{Re}(\bar y^*\,iy)$. Then $\bar g$-gate: $\bar{\hat x} = g\bar\ell$,
$\bar V \mathrel{+}= (1-g)\bar\ell$, $\bar P_{scale} = \sum\mathrm{Re}(\bar\ell^*(\hat x - V))\,g(1-g)$;
$\bar\mu \mathrel{+}= \sum\mathrm{Re}(\bar p^*p)$. Aggregation, $U_i = \sum_j\hat A_{ij}\tilde V_j$:
$\bar{\hat A}_{ij} = \mathrm{Re}\langle\bar U_i, \tilde V_j\rangle$, $\bar{\tilde V}_j = \sum_i\hat A_{ij}\bar U_i$;
$\bar A = \bar{\hat A}\odot E$, $\bar E \mathrel{+}= \bar{\hat A}\odot A$; softmax VJP
(`refattn.nn.softmax.softmax_vjp`) gives $\bar s$; $\bar\tau = \sum 2\tau\,\bar s\,b$ with
$b = s/\tau^2$, $\bar b = \tau^2\bar s$; with $w = 1 + RS$, $S = 1/(\nu dV)$:
$\bar V \mathrel{+}= -\bar b/V - \bar SS/V$, $\bar w = -\bar b/w$, $\bar R = \bar wS$,
$\bar S = \bar wR$, $\bar\nu = -\sum\bar SS/\nu$. Residual: $\overline{\lVert\tilde Q_i\rVert^2} = \sum_j\bar R_{ij}$,
$\overline{\lVert\tilde K_j\rVert^2} = \sum_i\bar R_{ij}E_{ij}^2$, $\bar E \mathrel{+}= \bar R(2E\lVert\tilde K\rVert^2 - 2D)$,
$\bar D = -2E\bar R$ ($D = \mathrm{Re}\langle\tilde Q_i,\tilde K_j\rangle$), so
$\bar{\tilde Q}_i = 2\tilde Q_i\sum_j\bar R_{ij} + \sum_j\bar D_{ij}\tilde K_j$ and
$\bar{\tilde K}_j = 2\tilde K_j\sum_i\bar R_{ij}E^2_{ij} + \sum_i\bar D_{ij}\tilde Q_i$.
Covariance: $\bar\sigma^2 = \sum\bar VF$, $\bar\eta^2 = \sum\bar VE^2$, $\bar\gamma^2 = \sum\bar V$,
$\bar E \mathrel{+}= 2\eta^2E\bar V$, $\bar\mu \mathrel{+}= \sum\sigma^2\bar V(\Delta E^2 - F)/\mu + \sum\bar E E\Delta$
($F = (e^{2\mu\Delta}-1)/(2\mu)$). Angles $\theta_{t} = \omega t$: $\bar\omega = \sum_t t\,\bar\theta_t$ (plus
the one-step rotation). Finally the softplus/sigmoid chains and the linear VJPs.

Measured agreement with upstream (float64 CPU, ``MultiheadIsotropicAFA`` with the notebook's
flags, its ``P_scale`` buffer replaced by one of shape ``(1, 1, H, d, 1)``, weights copied,
$Z_q = Z_k = Z_v$ passed with upstream's singleton axis): $d_e=6$, $H=2$, $d=4$, $L=9$, batch 2:
output max abs error 1.3e-15 (rel 3.5e-16); gradients of the input and all 16 parameters
(``P_scale`` made a leaf tensor for the comparison) max rel 3.5e-15.

Reconstruction / conventions: upstream's gate ``P_scale`` is a fixed random buffer hard-coded to
shape ``(1, 1, 2, 64, 1)`` (two heads of width 64) and not a parameter; here it is the
``(H, d)`` array ``P_scale`` and gets a gradient. Upstream inputs are ``(B, 1, L, d_e)``; here
``(B, L, d_e)``. ``seq_len`` (upstream ``args.seq_len``, which also sizes its causal mask and so
must equal $L$ there) defaults to $L$. Only the causal, shared-dynamics, regular-time
configuration of the notebook is provided (no ``sep_params``, complex RMS norms, additive
Gaussian noise, other bias types, or irregular ``t_measure``). The exponent clamp at $\pm10$ never
binds at $|\mu|\Delta \le 5$.
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_int, check_params
from ...nn.activations import sigmoid
from ...nn.linear import linear_prefixed, linear_prefixed_spec, linear_prefixed_vjp
from ...nn.softmax import softmax_lse, softmax_vjp
from ...registry import Mechanism, Sample, register
from ._samples import fd_max_rel

__all__ = ["adaptive_filter_attention_forward", "adaptive_filter_attention_backward", "adaptive_filter_attention"]

_EPS = 1e-5
_EXP_MIN, _EXP_MAX = -10.0, 10.0
_SCALAR_PARAMS = ("mu_v", "sigma_v", "eta_v", "gamma_v", "tau", "nu_sqrt")


def _softplus(x):
    return np.logaddexp(0.0, x)


def _validate(z_q, z_k, z_v, params, num_heads, seq_len):
    z_q = as_float(z_q, "z_q", ndim=3)
    z_k = as_float(z_k, "z_k", ndim=3)
    z_v = as_float(z_v, "z_v", ndim=3)
    if z_k.shape != z_q.shape or z_v.shape != z_q.shape:
        raise ValueError(f"z_k and z_v must have z_q's shape {z_q.shape}; got {z_k.shape} and {z_v.shape}")
    H = check_int(num_heads, "num_heads", minimum=1)
    B, L, C = z_q.shape
    Ls = L if seq_len is None else check_int(seq_len, "seq_len", minimum=1)
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of arrays, got {type(params).__name__}")
    if "W_q.weight" not in params:
        raise ValueError("params is missing 'W_q.weight'")
    cols = np.shape(params["W_q.weight"])
    if len(cols) != 2 or cols[-1] % (4 * H):
        raise ValueError(f"W_q.weight must have shape ({C}, 2 * num_heads * d) with d even; got {cols}")
    d = cols[-1] // (2 * H)
    spec = {**linear_prefixed_spec("W_q", C, 2 * H * d), **linear_prefixed_spec("W_k", C, 2 * H * d),
            **linear_prefixed_spec("W_v", C, 2 * H * d), **linear_prefixed_spec("W_o", 2 * H * d, C),
            "lambda_imag_v": (H, d // 2), "P_scale": (H, d)}
    spec.update({k: (H,) for k in _SCALAR_PARAMS})
    p = check_params(params, spec, optional=("W_q.bias", "W_k.bias", "W_v.bias", "W_o.bias"),
                     where="adaptive_filter_attention")
    return (z_q, z_k, z_v), cast_all(z_q.dtype, p), H, d, Ls


def _complex(P, H, d):
    B, L, _ = P.shape
    return (P[..., : H * d] + 1j * P[..., H * d:]).reshape(B, L, H, d)


def _real(g):
    B, L, H, d = g.shape
    g = g.reshape(B, L, H * d)
    return np.concatenate([g.real, g.imag], axis=-1)


def adaptive_filter_attention_forward(z_q, z_k, z_v, params, *, num_heads: int, seq_len: int | None = None):
    r"""Isotropic AFA layer (``MultiheadIsotropicAFA``, notebook flags) on ``z_q, z_k, z_v (B, L, d_e)``.

    ``params`` (upstream names; linear weights ``(in, out)`` = torch ``weight.T``):
    ``W_q/W_k/W_v.weight (d_e, 2Hd)`` and biases, ``W_o.weight (2Hd, d_e)`` and bias,
    ``mu_v, sigma_v, eta_v, gamma_v, tau, nu_sqrt (H,)``, ``lambda_imag_v (H, d/2)``,
    ``P_scale (H, d)`` (the gate; see the module docstring). Returns ``(out (B, L, d_e), cache)``."""
    zs, p, H, d, Ls = _validate(z_q, z_k, z_v, params, num_heads, seq_len)
    z_q, z_k, z_v = zs
    dt = z_q.dtype
    B, L, C = z_q.shape
    Q, K, V = (_complex(linear_prefixed(p, f"W_{n}", z), H, d) for n, z in (("q", z_q), ("k", z_k), ("v", z_v)))
    s_r, s_i = 10.0 / (2 * Ls), 10.0 * 2 * np.pi / (2 * Ls)
    mu = (sigmoid(p["mu_v"]) - 1.0) * s_r - _EPS  # (H,)
    lam = p["lambda_imag_v"]
    omega = np.stack([lam, -lam], axis=-1).reshape(H, d) * s_i
    sig2, eta2, gam2 = _softplus(p["sigma_v"]), _softplus(p["eta_v"]) + _EPS, _softplus(p["gamma_v"]) + _EPS
    nu = _softplus(p["nu_sqrt"]) + _EPS
    t = np.arange(L, dtype=dt)
    delta = np.abs(t[:, None] - t[None, :])[:, :, None]  # (L, L, 1)
    e_raw = mu * delta
    e = np.clip(e_raw, _EXP_MIN, _EXP_MAX)
    E = np.exp(e)  # (L, L, H)
    small = np.abs(mu) < _EPS
    F = np.where(small, delta, np.expm1(2 * e) / np.where(small, 1.0, 2 * mu))
    Vc = sig2 * F + eta2 * E * E + gam2
    rot = np.exp(-1j * omega[None] * t[:, None, None])  # (L, H, d): e^{-i w t}
    Qt, Kt, Vt = Q * rot, K * rot, V * rot
    qn = np.sum(np.abs(Qt) ** 2, -1)  # (B, L, H)
    kn = np.sum(np.abs(Kt) ** 2, -1)
    D = np.einsum("bihd,bjhd->bijh", Qt.real, Kt.real) + np.einsum("bihd,bjhd->bijh", Qt.imag, Kt.imag)
    R = qn[:, :, None] + E * E * kn[:, None] - 2 * E * D
    S = 1.0 / (nu * d * Vc)
    w = 1.0 + R * S
    b = -np.log(Vc) - np.log(w)
    tau = p["tau"]
    causal = np.tri(L, dtype=bool)[:, :, None]
    s = np.where(causal, tau**2 * b, -np.inf)
    A, _ = softmax_lse(s, axis=2)
    Ah = A * E
    U = np.einsum("bijh,bjhd->bihd", Ah, Vt)
    xh = U / rot
    g = sigmoid(p["P_scale"])
    ell = g * xh + (1 - g) * V
    step = np.exp(mu)[:, None] * np.exp(1j * omega)  # (H, d)
    pr = step * ell
    out = linear_prefixed(p, "W_o", _real(pr))
    loc = locals()
    cache = {k: loc[k] for k in (
        "z_q", "z_k", "z_v", "p", "H", "d", "Ls", "Q", "K", "V", "mu", "omega", "sig2", "eta2", "gam2", "nu", "t", "delta",
        "e_raw", "E", "small", "F", "Vc", "rot", "Qt", "Kt", "Vt", "qn", "kn", "D", "R", "S", "w", "b", "A", "Ah", "U",
        "xh", "g", "ell", "step", "pr", "s_r", "s_i")}
    cache.update(dtype=dt, shape=out.shape)
    return out, cache


def adaptive_filter_attention_backward(dout, cache) -> dict:
    """Gradients of :func:`adaptive_filter_attention_forward` w.r.t. ``z_q, z_k, z_v`` and every parameter."""
    c = cache
    dt = c["dtype"]
    dout = as_dout(dout, c["shape"], dt)
    p, H, d = c["p"], c["H"], c["d"]
    B, L, _ = dout.shape
    grads: dict = {}
    dpr_r = linear_prefixed_vjp(grads, p, "W_o", dout, _real(c["pr"]))
    dpr = _complex(dpr_r, H, d)
    pr, step, mu = c["pr"], c["step"], c["mu"]
    dmu = np.sum(np.real(np.conj(dpr) * pr), axis=(0, 1, 3))
    domega = np.sum(np.real(np.conj(dpr) * 1j * pr), axis=(0, 1))  # (H, d), angle omega * 1
    dell = np.conj(step) * dpr
    g, xh, V = c["g"], c["xh"], c["V"]
    dxh = g * dell
    dV = (1 - g) * dell
    grads["P_scale"] = np.sum(np.real(np.conj(dell) * (xh - V)), axis=(0, 1)) * g * (1 - g)
    rot, t = c["rot"], c["t"]
    dU = rot * dxh  # xh = U e^{+i theta} with rot = e^{-i theta}
    dtheta = np.sum(np.real(np.conj(dxh) * 1j * xh), axis=0)  # angle +theta
    A, Ah, E, Vt = c["A"], c["Ah"], c["E"], c["Vt"]
    dAh = np.einsum("bihd,bjhd->bijh", dU.real, Vt.real) + np.einsum("bihd,bjhd->bijh", dU.imag, Vt.imag)
    dVt = np.einsum("bijh,bihd->bjhd", Ah, dU)
    dA = dAh * E
    dE = np.sum(dAh * A, axis=0)
    ds = softmax_vjp(A, dA, axis=2)
    ds = np.where(np.tri(L, dtype=bool)[:, :, None], ds, 0.0)
    tau, b = p["tau"], c["b"]
    grads["tau"] = np.sum(ds * 2 * tau * b, axis=(0, 1, 2))
    db = tau**2 * ds
    Vc, S, w, R, nu = c["Vc"], c["S"], c["w"], c["R"], c["nu"]
    dw = -db / w
    dR = dw * S
    dS = dw * R
    dVc = np.sum(-db / Vc - dS * S / Vc, axis=0)
    dnu = -np.sum(dS * S, axis=(0, 1, 2)) / nu
    Qt, Kt, kn, D = c["Qt"], c["Kt"], c["kn"], c["D"]
    dqn = dR.sum(axis=2)
    dkn = np.sum(dR * E * E, axis=1)
    dE = dE + np.sum(dR * (2 * E * kn[:, None] - 2 * D), axis=0)
    dD = -2 * E * dR
    dQt = 2 * Qt * dqn[..., None] + np.einsum("bijh,bjhd->bihd", dD, Kt)
    dKt = 2 * Kt * dkn[..., None] + np.einsum("bijh,bihd->bjhd", dD, Qt)
    # covariance V = sig2 F + eta2 E^2 + gam2
    F, delta, small = c["F"], c["delta"], c["small"]
    dsig2 = np.sum(dVc * F, axis=(0, 1))
    deta2 = np.sum(dVc * E * E, axis=(0, 1))
    dgam2 = np.sum(dVc, axis=(0, 1))
    dE = dE + 2 * c["eta2"] * E * dVc
    safe_mu = np.where(small, 1.0, mu)
    inside = (c["e_raw"] >= _EXP_MIN) & (c["e_raw"] <= _EXP_MAX)  # the clamp of the exponent mu * delta
    dF = np.where(inside, delta * E * E, 0.0) - F
    dmu = dmu + np.where(small, 0.0, np.sum(c["sig2"] * dVc * dF, axis=(0, 1)) / safe_mu)
    dmu = dmu + np.sum(np.where(inside, dE * E * delta, 0.0), axis=(0, 1))
    # rotations by e^{-i w t}: x~ = x rot  ->  dx = conj(rot) dx~, dtheta(-) = -Re(conj(dx~) i x~)
    dQ, dK = dQt * np.conj(rot), dKt * np.conj(rot)
    dV = dV + dVt * np.conj(rot)
    for xt, dxt in ((Qt, dQt), (Kt, dKt), (Vt, dVt)):
        dtheta = dtheta - np.sum(np.real(np.conj(dxt) * 1j * xt), axis=0)
    domega = domega + np.einsum("t,thd->hd", t, dtheta)
    s_r, s_i = c["s_r"], c["s_i"]
    sm = sigmoid(p["mu_v"])
    grads["mu_v"] = dmu * sm * (1 - sm) * s_r
    dw2 = domega.reshape(H, d // 2, 2)
    grads["lambda_imag_v"] = (dw2[..., 0] - dw2[..., 1]) * s_i
    for name, dval in (("sigma_v", dsig2), ("eta_v", deta2), ("gamma_v", dgam2), ("nu_sqrt", dnu)):
        grads[name] = dval * sigmoid(p[name])
    out = {}
    for n, dc in (("q", dQ), ("k", dK), ("v", dV)):
        out[f"z_{n}"] = linear_prefixed_vjp(grads, p, f"W_{n}", _real(dc), c[f"z_{n}"])
    out.update({key: np.asarray(grads[key], dtype=dt) for key in p})
    return out


def adaptive_filter_attention(z_q, z_k, z_v, params, *, num_heads: int, seq_len: int | None = None) -> np.ndarray:
    """Convenience wrapper: the output of :func:`adaptive_filter_attention_forward`."""
    return adaptive_filter_attention_forward(z_q, z_k, z_v, params, num_heads=num_heads, seq_len=seq_len)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _afa_params(rng, C, H, d, bias=True):
    p = {}
    for n, (i, o) in (("q", (C, 2 * H * d)), ("k", (C, 2 * H * d)), ("v", (C, 2 * H * d)), ("o", (2 * H * d, C))):
        p[f"W_{n}.weight"] = rng.standard_normal((i, o)) / np.sqrt(i)
        if bias:
            p[f"W_{n}.bias"] = 0.2 * rng.standard_normal(o)
    p["lambda_imag_v"] = rng.standard_normal((H, d // 2))
    p["P_scale"] = rng.standard_normal((H, d))
    for k in _SCALAR_PARAMS:
        p[k] = rng.standard_normal(H)
    p["tau"] = 1.0 + 0.3 * rng.standard_normal(H)
    return p


def _sample_afa(rng, size):
    C, H, d, L = (2, 1, 2, 4) if size == "tiny" else (5, 2, 4, 9)
    z = {f"z_{n}": rng.standard_normal((2, L, C)) for n in "qkv"}
    return Sample(inputs=z, params=_afa_params(rng, C, H, d, bias=size == "small"), config={"num_heads": H})


def _check_rational_weights_explicit(rng):
    """Attention weights written out per pair from the paper's formula,
    $\\hat A_{ij} = E_{ij}P_{ij}^{\\tau^2}(1 + R_{ij}P_{ij}/(\\nu d))^{-\\tau^2}/\\sum_{j'\\le i}(\\cdot)$, with
    $R_{ij} = \\lVert e^{-i\\omega t_i}Q_i - E_{ij}e^{-i\\omega t_j}K_j\\rVert^2$ computed directly."""
    s = _sample_afa(rng, "small")
    _, cache = adaptive_filter_attention_forward(**s.inputs, params=s.params, **s.config)
    Qt, Kt, E, Vc, nu, tau, d = cache["Qt"], cache["Kt"], cache["E"], cache["Vc"], cache["nu"], s.params["tau"], cache["d"]
    B, L, H, _ = Qt.shape
    err = 0.0
    for bb in range(B):
        for h in range(H):
            for i in range(L):
                r = np.array([np.sum(np.abs(Qt[bb, i, h] - E[i, j, h] * Kt[bb, j, h]) ** 2) for j in range(i + 1)])
                P = 1.0 / Vc[i, : i + 1, h]
                wgt = (P / (1 + r * P / (nu[h] * d))) ** (tau[h] ** 2)
                ah = wgt / wgt.sum() * E[i, : i + 1, h]
                err = max(err, float(np.abs(ah - cache["Ah"][bb, i, : i + 1, h]).max()))
    assert err < 1e-13, err
    return err


def _check_covariance_solves_lyapunov(rng):
    """$V(\\Delta)$ solves the scalar differential Lyapunov equation $dV/d\\Delta = 2\\mu V + \\sigma^2 -
    2\\mu\\gamma^2$ with $V(0) = \\eta^2 + \\gamma^2$ (central differences in $\\Delta$)."""
    mu, sig2, eta2, gam2 = -0.37, 0.8, 0.5, 0.2

    def V(dl):
        return sig2 * np.expm1(2 * mu * dl) / (2 * mu) + eta2 * np.exp(2 * mu * dl) + gam2

    dl = np.linspace(0.1, 5, 7)
    h = 1e-5
    lhs = (V(dl + h) - V(dl - h)) / (2 * h)
    err = float(np.abs(lhs - (2 * mu * V(dl) + sig2 - 2 * mu * gam2)).max()) + abs(V(0.0) - eta2 - gam2)
    assert err < 1e-8, err
    return err


def _check_afa_gradcheck_with_bias(rng):
    """Finite-difference gradcheck with projection biases, two heads and seq_len (5) != L (3)."""
    C, H, d, L = 2, 2, 2, 3
    s = Sample(inputs={f"z_{n}": rng.standard_normal((2, L, C)) for n in "qkv"}, params=_afa_params(rng, C, H, d),
               config={"num_heads": H, "seq_len": 5})
    err = fd_max_rel(adaptive_filter_attention_forward, adaptive_filter_attention_backward, s)
    assert err < 1e-6, err
    return err


register(
    Mechanism(
        slug="adaptive_filter_attention", family="4-linear-kernel-sparse", tier="T3",
        title="Adaptive Filter Attention (linear-SDE / Kalman view)",
        paper="Racioppo, 'Attention as an Adaptive Filter', 2025, arXiv 2509.04154",
        official_code="PCR-git/Adaptive-Filter-Attention model/multihead_isotropic_AFA.py"
                      "@dc4f7b7a6a1d269599e991df27051f29f1fdfbee",
        forward=adaptive_filter_attention_forward, backward=adaptive_filter_attention_backward, sample=_sample_afa,
        checks={"rational_weights_explicit": _check_rational_weights_explicit,
                "covariance_solves_lyapunov": _check_covariance_solves_lyapunov,
                "gradcheck_bias_two_heads": _check_afa_gradcheck_with_bias},
        docs="linear/l6b.md#adaptive-filter-attention",
    ),
)
