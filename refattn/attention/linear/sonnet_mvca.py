r"""Sonnet's Multivariable Coherence Attention (MVCA, ``CoherenceAttention``): attention weights over
time from the spectral coherence of each token's query and key.

Shu & Lampos, "Sonnet: Spectral Operator Neural Network for Multivariable Time Series
Forecasting", 2025, arXiv 2505.15312. Official code read (and run against this module in
float64): ``ClaudiaShu/Sonnet`` ``sonnet/mts_model/models/Sonnet.py`` (``CoherenceAttention``;
``SonetBlock`` feeds it the wavelet coefficients of ``AdaptiveWavelet`` and passes its output to
``KoopmanLayer``) @0288de47db8692e82a951d72c9bff54526970afb. This module is the attention
(``CoherenceAttention``); the learnable wavelets, the Koopman layer and the forecasting model
around them are not provided.

Forward (what the code computes; input ``coeffs`` $c\in\mathbb R^{B\times N\times T\times D}$, $N$
wavelet atoms, $T$ time steps, $D$ = ``d_model``, hidden width $h$)
---------------------------------------------------------------------------------------------
$P = cW_p + b_p\in\mathbb R^{\dots\times 3h}$, split *interleaved* (``reshape(..., h, 3)``):
$q = P[..., 0::3]$, $k = P[..., 1::3]$, $v = P[..., 2::3]$. For every atom $n$ and time $t$ the
"spectra" are the real FFTs over the **hidden** axis, $\hat q = \mathrm{rfft}(q_{nt})$,
$\hat k = \mathrm{rfft}(k_{nt})$ ($F = \lfloor h/2\rfloor + 1$ bins), and

$$P_{xy} = \tfrac1F\sum_f\hat q_f\overline{\hat k_f},\quad P_{xx} = \tfrac1F\sum_f|\hat q_f|^2,\quad
P_{yy} = \tfrac1F\sum_f|\hat k_f|^2,\quad \mathrm{coh}_{nt} = \frac{|P_{xy}|^2}{\max(P_{xx}P_{yy}, 10^{-6})},$$

$a_{n\cdot} = \mathrm{softmax}_t(\sqrt N\,\mathrm{coh}_{n\cdot})$ (upstream divides by
``scale`` $= d_k^{-1/2}$ with $d_k = N$), $o_{nt} = a_{nt}v_{nt}$ (each time step's value is
*scaled* by its weight: the code does not sum over time), then
$\tilde o = \mathrm{tr}(\mathrm{softmax}_{\text{rows}}(V_a))\,o$ — upstream's
``einsum("b l d, c c -> b l d", out_time, softmax(var_attn))`` contracts the repeated index, i.e.
multiplies by the trace —, $m = \tilde o + \mathrm{MLP}(\tilde o)$
(``Linear``–``GELU``–``Linear`` on $h$), $y = mW_o + b_o$, returned as ``(B, N, T, D)``.

Quadratic-form (explicit) form: with the $F\times h$ real-FFT matrix $R_{fi} = e^{-2\pi\mathrm ifi/h}$
and the Hermitian $G = R^\top\overline R/F$, $P_{xy} = q^\top Gk$, $P_{xx} = q^\top\mathrm{Re}(G)q$,
$P_{yy} = k^\top\mathrm{Re}(G)k$; the FFT form equals it to round-off (check
``fft_equals_quadratic_form``), and the backward uses it.

Backward
--------
$\bar m = \bar yW_o^\top$; MLP VJP (GELU exact, `refattn.nn.activations.gelu_grad`); $\bar{\tilde o}$;
$\bar\tau = \langle\bar{\tilde o}, o\rangle$ for the trace $\tau$, $\bar V_a = \mathrm{softmax\_vjp}(S, \bar\tau I)$;
$\bar o = \tau\bar{\tilde o}$; $\bar a_{nt} = \langle\bar o_{nt}, v_{nt}\rangle$, $\bar v = a\bar o$; softmax VJP over
$t$ and the factor $\sqrt N$ give $\overline{\mathrm{coh}}$; where the clamp is inactive,
$\bar P_{xy} = \overline{\mathrm{coh}}\,2P_{xy}/(P_{xx}P_{yy})$ (complex gradient
$\partial/\partial\mathrm{Re} + i\,\partial/\partial\mathrm{Im}$), $\bar P_{xx} = -\overline{\mathrm{coh}}\,\mathrm{coh}/P_{xx}$,
$\bar P_{yy} = -\overline{\mathrm{coh}}\,\mathrm{coh}/P_{yy}$; then
$\bar q = \mathrm{Re}(\overline{\bar P_{xy}}\,Gk) + 2\bar P_{xx}\mathrm{Re}(G)q$,
$\bar k = \mathrm{Re}(\overline{\bar P_{xy}}\,G^\top q) + 2\bar P_{yy}\mathrm{Re}(G)k$, interleaved back
into $\bar P$, and the projection's VJP.

Measured agreement with upstream (float64 CPU, upstream ``CoherenceAttention(d_model=5, d_k=3,
hidden_dim=6)`` in eval mode, all weights perturbed and copied, ``coeffs (2, 3, 8, 5)``): output
max abs error 4.4e-16 (rel 3.5e-16); gradients of ``coeffs`` and the nine parameters max rel
5.3e-15.

Where the code and the catalogue differ: the catalogue's reading (attention between *variables*
from $|S_{uv}(\omega)|^2/(S_{uu}S_{vv})$ over temporal frequencies) is not what the official code
does; refattn follows the code (coherence over the hidden axis per token, softmax over time,
elementwise reweighting, the trace factor). Dropout (0.1 upstream) is off (eval mode).
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_params
from ...nn.activations import gelu, gelu_grad
from ...nn.linear import linear_prefixed, linear_prefixed_spec, linear_prefixed_vjp
from ...nn.softmax import softmax_lse, softmax_vjp
from ...registry import Mechanism, Sample, register
from ._samples import fd_max_rel

__all__ = ["coherence_quadratic_form", "sonnet_mvca_forward", "sonnet_mvca_backward", "sonnet_mvca"]

_CLAMP = 1e-6


def coherence_quadratic_form(h: int) -> np.ndarray:
    r"""$G = R^\top\overline R/F$ (``(h, h)`` complex Hermitian) with $R$ the ``rfft`` matrix of length
    ``h``: ``mean_f(rfft(q) * conj(rfft(k))) == q @ G @ k``."""
    R = np.fft.rfft(np.eye(h), axis=0)  # (F, h)
    return R.T @ np.conj(R) / R.shape[0]


def _validate(coeffs, params):
    c = as_float(coeffs, "coeffs", ndim=4)
    D = c.shape[-1]
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of arrays, got {type(params).__name__}")
    if "proj.weight" not in params or np.ndim(params["proj.weight"]) != 2:
        raise ValueError("params needs a 2-D 'proj.weight' of shape (d_model, 3 * hidden_dim)")
    w3 = np.shape(params["proj.weight"])[1]
    if w3 % 3:
        raise ValueError(f"proj.weight must have 3 * hidden_dim columns; got {w3}")
    h = w3 // 3
    spec = {**linear_prefixed_spec("proj", D, 3 * h), "var_attn": (D, D),
            **linear_prefixed_spec("var_mlp.0", h, h), **linear_prefixed_spec("var_mlp.2", h, h),
            **linear_prefixed_spec("out_proj", h, D)}
    p = check_params(params, spec, where="sonnet_mvca")
    return c, cast_all(c.dtype, p), h


def sonnet_mvca_forward(coeffs, params):
    r"""``CoherenceAttention`` on wavelet coefficients ``coeffs (B, n_atoms, T, d_model)``.

    ``params`` (upstream names; linear weights ``(in, out)`` = torch ``weight.T``):
    ``proj (d_model -> 3h)``, ``var_attn (d_model, d_model)`` (only its row-softmax's trace is used,
    as upstream), ``var_mlp.0``, ``var_mlp.2`` ``(h -> h)``, ``out_proj (h -> d_model)``, each with
    ``.weight``/``.bias``. Returns ``(y (B, n_atoms, T, d_model), cache)``."""
    c, p, h = _validate(coeffs, params)
    B, N, T, D = c.shape
    P = linear_prefixed(p, "proj", c)
    q, k, v = P[..., 0::3], P[..., 1::3], P[..., 2::3]
    qf, kf = np.fft.rfft(q, axis=-1), np.fft.rfft(k, axis=-1)
    pxy = np.mean(qf * np.conj(kf), axis=-1)
    pxx = np.mean(np.abs(qf) ** 2, axis=-1)
    pyy = np.mean(np.abs(kf) ** 2, axis=-1)
    den = pxx * pyy
    coh = np.abs(pxy) ** 2 / np.maximum(den, _CLAMP)
    a, _ = softmax_lse(coh * float(np.sqrt(N)), axis=-1)  # over time
    o = a[..., None] * v  # (B, N, T, h)
    S, _ = softmax_lse(p["var_attn"], axis=-1)
    tau = np.trace(S)
    ot = tau * np.swapaxes(o, 1, 2)  # (B, T, N, h)
    u = linear_prefixed(p, "var_mlp.0", ot)
    m = ot + linear_prefixed(p, "var_mlp.2", gelu(u))
    y = np.swapaxes(linear_prefixed(p, "out_proj", m), 1, 2)
    cache = {"c": c, "p": p, "h": h, "q": q, "k": k, "v": v, "pxy": pxy, "pxx": pxx, "pyy": pyy, "den": den, "coh": coh,
             "a": a, "o": o, "S": S, "tau": tau, "ot": ot, "u": u, "m": m, "shape": y.shape, "dtype": c.dtype}
    return y, cache


def sonnet_mvca_backward(dout, cache) -> dict:
    """Gradients of :func:`sonnet_mvca_forward` w.r.t. ``coeffs`` and every parameter."""
    dt = cache["dtype"]
    g = np.swapaxes(as_dout(dout, cache["shape"], dt), 1, 2)  # (B, T, N, D)
    p, h = cache["p"], cache["h"]
    grads: dict = {}
    dm = linear_prefixed_vjp(grads, p, "out_proj", g, cache["m"])
    dgu = linear_prefixed_vjp(grads, p, "var_mlp.2", dm, gelu(cache["u"]))
    dot = dm + linear_prefixed_vjp(grads, p, "var_mlp.0", dgu * gelu_grad(cache["u"]), cache["ot"])
    o, tau, S = cache["o"], cache["tau"], cache["S"]
    dtau = np.sum(dot * np.swapaxes(o, 1, 2))
    grads["var_attn"] = softmax_vjp(S, dtau * np.eye(S.shape[0], dtype=dt), axis=-1)
    do = tau * np.swapaxes(dot, 1, 2)  # (B, N, T, h)
    a, v = cache["a"], cache["v"]
    da = np.sum(do * v, axis=-1)
    dv = a[..., None] * do
    N = a.shape[1]
    dcoh = softmax_vjp(a, da, axis=-1) * float(np.sqrt(N))
    live = cache["den"] > _CLAMP
    pxy, pxx, pyy, coh = cache["pxy"], cache["pxx"], cache["pyy"], cache["coh"]
    safe = np.where(live, cache["den"], 1.0)
    gxy = np.where(live, dcoh * 2 * pxy / safe, 0.0)
    gxx = np.where(live, -dcoh * coh / np.where(live, pxx, 1.0), 0.0)
    gyy = np.where(live, -dcoh * coh / np.where(live, pyy, 1.0), 0.0)
    G = coherence_quadratic_form(h)
    Gr = G.real
    q, k = cache["q"], cache["k"]
    dq = np.real(np.conj(gxy)[..., None] * (k @ G.T)) + 2 * gxx[..., None] * (q @ Gr.T)
    dk = np.real(np.conj(gxy)[..., None] * (q @ G)) + 2 * gyy[..., None] * (k @ Gr.T)
    dP = np.empty(q.shape[:-1] + (3 * h,), dtype=dt)
    dP[..., 0::3], dP[..., 1::3], dP[..., 2::3] = dq, dk, dv
    dc = linear_prefixed_vjp(grads, p, "proj", dP, cache["c"])
    out = {"coeffs": dc}
    out.update({key: np.asarray(grads[key], dtype=dt) for key in p})
    return out


def sonnet_mvca(coeffs, params) -> np.ndarray:
    """Convenience wrapper: the output of :func:`sonnet_mvca_forward`."""
    return sonnet_mvca_forward(coeffs, params)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _reference_mvca(coeffs, params):
    """Explicit form: coherence from the quadratic forms $q^\\top Gk$ (no FFT), token by token."""
    c, p, h = _validate(coeffs, params)
    B, N, T, D = c.shape
    G = coherence_quadratic_form(h)
    P = c @ p["proj.weight"] + p["proj.bias"]
    y = np.zeros((B, N, T, D))
    S = np.exp(p["var_attn"] - p["var_attn"].max(-1, keepdims=True))
    tau = np.trace(S / S.sum(-1, keepdims=True))
    for b in range(B):
        for n in range(N):
            coh = np.zeros(T)
            for t in range(T):
                q, k = P[b, n, t, 0::3], P[b, n, t, 1::3]
                pxy, pxx, pyy = q @ G @ k, (q @ G @ q).real, (k @ G @ k).real
                coh[t] = abs(pxy) ** 2 / max(pxx * pyy, _CLAMP)
            e = np.exp(np.sqrt(N) * (coh - coh.max()))
            a = e / e.sum()
            for t in range(T):
                ot = tau * a[t] * P[b, n, t, 2::3]
                m = ot + gelu(ot @ p["var_mlp.0.weight"] + p["var_mlp.0.bias"]) @ p["var_mlp.2.weight"] \
                    + p["var_mlp.2.bias"]
                y[b, n, t] = m @ p["out_proj.weight"] + p["out_proj.bias"]
    return y


def _mvca_params(rng, D, h):
    p = {"proj.weight": rng.standard_normal((D, 3 * h)) / np.sqrt(D), "proj.bias": 0.3 * rng.standard_normal(3 * h),
         "var_attn": np.eye(D) + 0.5 * rng.standard_normal((D, D))}
    for pre, i, o in (("var_mlp.0", h, h), ("var_mlp.2", h, h), ("out_proj", h, D)):
        p[f"{pre}.weight"] = rng.standard_normal((i, o)) / np.sqrt(i)
        p[f"{pre}.bias"] = 0.3 * rng.standard_normal(o)
    return p


def _sample_mvca(rng, size):
    B, N, T, D, h = (2, 2, 3, 2, 3) if size == "tiny" else (2, 3, 8, 5, 6)
    return Sample(inputs={"coeffs": rng.standard_normal((B, N, T, D))}, params=_mvca_params(rng, D, h))


def _check_fft_equals_quadratic_form(rng):
    """``mean_f(rfft(q) conj(rfft(k)))`` equals $q^\\top Gk$ for even and odd widths, and
    $P_{xx}$ is real."""
    err = 0.0
    for h in (1, 4, 5, 8):
        q, k = rng.standard_normal((6, h)), rng.standard_normal((6, h))
        G = coherence_quadratic_form(h)
        fft = np.mean(np.fft.rfft(q) * np.conj(np.fft.rfft(k)), axis=-1)
        quad = np.einsum("ni,ij,nj->n", q, G, k)
        err = max(err, float(np.abs(fft - quad).max()), float(np.abs(np.einsum("ni,ij,nj->n", q, G, q).imag).max()))
    assert err < 1e-13, err
    return err


def _check_coherence_bounds(rng):
    """$0\\le\\mathrm{coh}\\le 1$ (Cauchy–Schwarz for the positive semi-definite form $\\mathrm{Re}\\,G$ on
    $[q, k]$ via the complex $G$), and coh = 1 when $k$ is a multiple of $q$."""
    s = _sample_mvca(rng, "small")
    _, cache = sonnet_mvca_forward(s.inputs["coeffs"], s.params)
    coh = cache["coh"]
    assert coh.min() >= 0 and coh.max() <= 1 + 1e-12, (coh.min(), coh.max())
    h = 6
    G = coherence_quadratic_form(h)
    q = rng.standard_normal(h)
    one = abs(q @ G @ (-2.5 * q)) ** 2 / ((q @ G @ q).real * ((2.5 * q) @ G @ (2.5 * q)).real)
    err = abs(one - 1.0)
    assert err < 1e-12, err
    return err


def _check_mvca_gradcheck_wider(rng):
    """Finite-difference gradcheck with an even hidden width (h = 4: Nyquist bin) and three atoms."""
    s = Sample(inputs={"coeffs": rng.standard_normal((2, 3, 3, 2))}, params=_mvca_params(rng, 2, 4))
    err = fd_max_rel(sonnet_mvca_forward, sonnet_mvca_backward, s)
    assert err < 1e-6, err
    return err


register(
    Mechanism(
        slug="sonnet_mvca", family="4-linear-kernel-sparse", tier="T3",
        title="Sonnet: multivariable coherence attention",
        paper="Shu & Lampos, 'Sonnet: Spectral Operator Neural Network for Multivariable Time Series Forecasting', "
              "2025, arXiv 2505.15312",
        official_code="ClaudiaShu/Sonnet sonnet/mts_model/models/Sonnet.py@0288de47db8692e82a951d72c9bff54526970afb",
        forward=sonnet_mvca_forward, backward=sonnet_mvca_backward, sample=_sample_mvca, reference=_reference_mvca,
        checks={"fft_equals_quadratic_form": _check_fft_equals_quadratic_form,
                "coherence_bounds": _check_coherence_bounds,
                "gradcheck_even_hidden_width": _check_mvca_gradcheck_wider},
        docs="linear/l6b.md#sonnet-multivariable-coherence-attention",
    ),
)
