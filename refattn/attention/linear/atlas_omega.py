r"""ATLAS Omega rule, linear-memory case (OmegaNet with gradient descent): a matrix memory
updated at test time on a sliding window of the last $c$ tokens, with polynomial feature maps.

Behrouz, Li, Kacham, Daliri, Deng, Zhong, Razaviyayn, Mirrokni, "ATLAS: Learning to Optimally
Memorize the Context at Test Time", 2025, arXiv 2505.23735. No code is public; this follows the
paper's Omega rule and was checked against a float64 torch-autograd transcription of the
equations below. Catalogue tier T3: the choices the sources leave open are keywords, marked
"reconstruction".

Forward
-------
$q_t = x_tW_Q$, $k_t = x_tW_K$, $v_t = x_tW_V$ (bias-free ``q_proj``/``k_proj``/``v_proj``),
$q, k$ $\ell_2$-normalised (``normalize_qk``), then the polynomial feature map applied to keys
and queries, $\phi(u) = \sum_{j=1}^{p} a_j\,u^{\odot j}$ element-wise with learnable coefficients
``poly_coeffs`` $a\in\mathbb R^p$ (reconstruction of the paper's polynomial mapping with
learnable coefficients; $p = 1$, $a = 1$ is the identity). Scalar gates (reconstruction: one
sigmoid unit each): retention $\alpha_t$ (``alpha_proj``), step size $\eta_t$ (``eta_proj``) and
per-token weights $\gamma_i$ (``gamma_proj``; the paper's $\gamma^{(t)}_i$ taken independent of
$t$). With $M_0 = 0$ and window $c$ (``window``):

$$G_t = \sum_{i=\max(1,t-c+1)}^{t}\gamma_i\,\nabla_M\lVert M_{t-1}\phi(k_i) - v_i\rVert^2
      = \sum_i 2\gamma_i\,(M_{t-1}\phi(k_i) - v_i)\,\phi(k_i)^\top,$$
$$M_t = \alpha_tM_{t-1} - \eta_tG_t,\qquad y_t = M_t\,\phi(q_t).$$

$c = 1$ is the gated delta rule; ATLAS proper replaces the gradient step by Muon
(Newton–Schulz orthogonalised momentum), which is not provided here.

Backward (through time)
-----------------------
Reverse loop with adjoint $\bar M_t$: $\bar M_t \mathrel{+}= dy_t\phi(q_t)^\top$,
$d\phi(q_t) = M_t^\top dy_t$; $d\alpha_t = \langle\bar M_t, M_{t-1}\rangle$,
$d\eta_t = -\langle\bar M_t, G_t\rangle$, $\bar G_t = -\eta_t\bar M_t$; for every $i$ in the window
with $e_i = M_{t-1}\phi(k_i) - v_i$: $d\gamma_i \mathrel{+}= 2e_i^\top\bar G_t\phi(k_i)$,
$\bar e_i = 2\gamma_i\bar G_t\phi(k_i)$, $d\phi(k_i) \mathrel{+}= 2\gamma_i\bar G_t^\top e_i + M_{t-1}^\top\bar e_i$,
$dv_i \mathrel{-}= \bar e_i$, $\bar M_{t-1} \mathrel{+}= \bar e_i\phi(k_i)^\top$; and
$\bar M_{t-1} \mathrel{+}= \alpha_t\bar M_t$. Feature map: $du = g\odot\sum_j j a_j u^{\odot(j-1)}$,
$da_j = \sum g\odot u^{\odot j}$; then the normalisation, sigmoid and linear VJPs of `refattn.nn`.
Cost $O(Lc\,d_kd_v)$.

Measured agreement (float64, CPU) with a torch-autograd transcription of the equations (the
windowed loss's gradient by ``torch.autograd.grad(create_graph=True)``): $d=6$, $d_k=4$,
$d_v=5$, $L=12$, batch 3, cubic features: $c=3$ normalised, $c=1$ unnormalised and $c=12$: output
rel error $\le$ 1.4e-15, gradients of ``x`` and all twelve parameters max rel $\le$ 2.9e-15.
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, check_int, check_positive
from ...nn.activations import sigmoid, sigmoid_grad
from ...nn.linear import linear_prefixed, linear_prefixed_vjp
from ...registry import Mechanism, Sample, register
from ._samples import fd_max_rel
from .titans import memory_l2, memory_l2_vjp, validate_memory_params

__all__ = ["omega_rule_scan", "atlas_omega_forward", "atlas_omega_backward", "atlas_omega"]

_GATES = ("alpha_proj", "eta_proj", "gamma_proj")


def omega_rule_scan(q, k, v, alpha, eta, gamma, window: int):
    r"""The Omega-rule recurrence on featurised ``q, k (B, L, dk)``, ``v (B, L, dv)`` and gates
    ``(B, L)``; returns ``(y (B, L, dv), M (B, L+1, dv, dk))``. Unvalidated."""
    B, L, dk = k.shape
    M = np.zeros((B, L + 1, v.shape[-1], dk), dtype=k.dtype)
    y = np.empty(v.shape, dtype=k.dtype)
    for t in range(L):
        lo = max(0, t - window + 1)
        kw, vw, gw = k[:, lo:t + 1], v[:, lo:t + 1], gamma[:, lo:t + 1]
        e = np.einsum("bij,bnj->bni", M[:, t], kw) - vw
        G = 2.0 * np.einsum("bn,bni,bnj->bij", gw, e, kw)
        M[:, t + 1] = alpha[:, t, None, None] * M[:, t] - eta[:, t, None, None] * G
        y[:, t] = np.einsum("bij,bj->bi", M[:, t + 1], q[:, t])
    return y, M


def _poly(u, a):
    return sum(a[j] * u ** (j + 1) for j in range(a.shape[0]))


def _poly_vjp(g, u, a):
    du = sum((j + 1) * a[j] * g * u ** j for j in range(a.shape[0]))
    da = np.array([np.sum(g * u ** (j + 1)) for j in range(a.shape[0])], dtype=u.dtype)
    return du, da


def atlas_omega_forward(x, params, *, window: int = 4, normalize_qk: bool = True, eps: float = 1e-6):
    r"""Omega-rule linear memory (OmegaNet) on ``x (B, L, d)``; returns ``(y (B, L, d_v), cache)``.

    ``params``: ``q_proj.weight``, ``k_proj.weight`` ``(d, d_k)``, ``v_proj.weight`` ``(d, d_v)``,
    ``poly_coeffs`` ``(p,)`` and, for ``alpha_proj``, ``eta_proj``, ``gamma_proj``,
    ``.weight (d, 1)`` and ``.bias (1,)``. ``window`` is the Omega-rule context length $c$.
    """
    x = as_float(x, "x", ndim=3)
    window = check_int(window, "window", minimum=1)
    check_positive(eps, "eps")
    dt = x.dtype
    p = validate_memory_params(x, params, _GATES, extra=("poly_coeffs",))
    if p["poly_coeffs"].ndim != 1:
        raise ValueError(f"params['poly_coeffs'] must have shape (p,); got {p['poly_coeffs'].shape}")
    q0, k0, v = (linear_prefixed(p, f"{n}_proj", x) for n in "qkv")
    if normalize_qk:
        qn, qst = memory_l2(q0, eps)
        kn, kst = memory_l2(k0, eps)
    else:
        qn, kn, qst, kst = q0, k0, None, None
    a = p["poly_coeffs"]
    q, k = _poly(qn, a), _poly(kn, a)
    z = {g: linear_prefixed(p, g, x)[..., 0] for g in _GATES}
    alpha, eta, gamma = (sigmoid(z[g]) for g in _GATES)
    y, M = omega_rule_scan(q, k, v, alpha, eta, gamma, window)
    cache = {"p": p, "x": x, "qn": qn, "kn": kn, "q": q, "k": k, "v": v, "qst": qst, "kst": kst, "z": z,
             "gates": (alpha, eta, gamma), "M": M, "window": window, "shape": y.shape, "dtype": dt}
    return y.copy(), cache


def atlas_omega_backward(dout, cache) -> dict:
    """Gradients of :func:`atlas_omega_forward` w.r.t. ``x`` and every parameter (BPTT)."""
    dt = cache["dtype"]
    dout = as_dout(dout, cache["shape"], dt)
    q, k, v, M, c = cache["q"], cache["k"], cache["v"], cache["M"], cache["window"]
    alpha, eta, gamma = cache["gates"]
    B, L, _ = k.shape
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    dal, det, dga = (np.zeros((B, L), dtype=dt) for _ in range(3))
    dM = np.zeros_like(M[:, 0])
    for t in reversed(range(L)):
        dM = dM + dout[:, t, :, None] * q[:, t, None, :]
        dq[:, t] = np.einsum("bij,bi->bj", M[:, t + 1], dout[:, t])
        lo = max(0, t - c + 1)
        kw, vw, gw = k[:, lo:t + 1], v[:, lo:t + 1], gamma[:, lo:t + 1]
        e = np.einsum("bij,bnj->bni", M[:, t], kw) - vw
        G = 2.0 * np.einsum("bn,bni,bnj->bij", gw, e, kw)
        dal[:, t] = np.sum(dM * M[:, t], axis=(1, 2))
        det[:, t] = -np.sum(dM * G, axis=(1, 2))
        dG = -eta[:, t, None, None] * dM
        Gk = np.einsum("bij,bnj->bni", dG, kw)
        dga[:, lo:t + 1] += 2.0 * np.sum(e * Gk, axis=-1)
        de = 2.0 * gw[..., None] * Gk
        dk[:, lo:t + 1] += 2.0 * gw[..., None] * np.einsum("bij,bni->bnj", dG, e) + np.einsum("bij,bni->bnj", M[:, t], de)
        dv[:, lo:t + 1] -= de
        dM = alpha[:, t, None, None] * dM + np.einsum("bni,bnj->bij", de, kw)
    p, x = cache["p"], cache["x"]
    a = p["poly_coeffs"]
    dqn, da_q = _poly_vjp(dq, cache["qn"], a)
    dkn, da_k = _poly_vjp(dk, cache["kn"], a)
    if cache["qst"] is not None:
        dqn = memory_l2_vjp(dqn, cache["qst"])
        dkn = memory_l2_vjp(dkn, cache["kst"])
    grads: dict = {"poly_coeffs": da_q + da_k}
    dx = np.zeros_like(x)
    for n, g in (("q", dqn), ("k", dkn), ("v", dv)):
        dx = dx + linear_prefixed_vjp(grads, p, f"{n}_proj", g, x)
    for gname, dg in zip(_GATES, (dal, det, dga)):
        dx = dx + linear_prefixed_vjp(grads, p, gname, (dg * sigmoid_grad(cache["z"][gname]))[..., None], x)
    out = {"x": dx}
    out.update({key: np.asarray(val, dtype=dt) for key, val in grads.items()})
    return out


def atlas_omega(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`atlas_omega_forward`."""
    return atlas_omega_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _omega_params(rng, d, dk, dv, p=2):
    out = {"q_proj.weight": rng.standard_normal((d, dk)) / np.sqrt(d),
           "k_proj.weight": rng.standard_normal((d, dk)) / np.sqrt(d),
           "v_proj.weight": rng.standard_normal((d, dv)) / np.sqrt(d),
           "poly_coeffs": np.concatenate([[1.0], 0.5 * rng.standard_normal(p - 1)])}
    for g in _GATES:
        out[f"{g}.weight"] = 0.5 * rng.standard_normal((d, 1))
        out[f"{g}.bias"] = rng.normal(0.0, 0.3, 1)
    return out


def _sample_omega(rng, size):
    d, dk, dv, L, c = (3, 2, 2, 4, 2) if size == "tiny" else (6, 4, 5, 10, 3)
    return Sample(inputs={"x": rng.standard_normal((2, L, d))}, params=_omega_params(rng, d, dk, dv),
                  config={"window": c, "normalize_qk": bool(rng.integers(0, 2)) or size == "small"})


def _reference_omega(x, params, *, window=4, normalize_qk=True, eps=1e-6):
    """Explicit form: the windowed loss written out and its gradient taken by central differences
    in every memory entry (exact for a quadratic loss), token by token."""
    def sig(z):
        return 1.0 / (1.0 + np.exp(-z))
    q, k, v = x @ params["q_proj.weight"], x @ params["k_proj.weight"], x @ params["v_proj.weight"]
    if normalize_qk:
        q = q / np.sqrt(np.sum(q * q, -1, keepdims=True) + eps)
        k = k / np.sqrt(np.sum(k * k, -1, keepdims=True) + eps)
    a = params["poly_coeffs"]
    q = sum(a[j] * q ** (j + 1) for j in range(len(a)))
    k = sum(a[j] * k ** (j + 1) for j in range(len(a)))
    al, et, ga = (sig(x @ params[f"{g}.weight"] + params[f"{g}.bias"])[..., 0] for g in _GATES)
    B, L, _ = x.shape
    out = np.zeros((B, L, v.shape[-1]))
    for b in range(B):
        M = np.zeros((v.shape[-1], k.shape[-1]))
        for t in range(L):
            def loss(Mx, b=b, t=t):
                return sum(ga[b, i] * np.sum((Mx @ k[b, i] - v[b, i]) ** 2) for i in range(max(0, t - window + 1), t + 1))
            G = np.zeros_like(M)
            for idx in np.ndindex(M.shape):
                Mp, Mm = M.copy(), M.copy()
                Mp[idx] += 0.5
                Mm[idx] -= 0.5
                G[idx] = loss(Mp) - loss(Mm)
            M = al[b, t] * M - et[b, t] * G
            out[b, t] = M @ q[b, t]
    return out


def _check_omega_window_one_is_gated_delta_rule(rng):
    B, L, dk, dv = 2, 6, 3, 2
    q, k, v = rng.standard_normal((B, L, dk)), rng.standard_normal((B, L, dk)), rng.standard_normal((B, L, dv))
    al, et, ga = (rng.uniform(0.2, 0.9, (B, L)) for _ in range(3))
    y, _ = omega_rule_scan(q, k, v, al, et, ga, 1)
    M = np.zeros((B, dv, dk))
    err = 0.0
    for t in range(L):
        e = np.einsum("bij,bj->bi", M, k[:, t]) - v[:, t]
        M = al[:, t, None, None] * M - 2 * (et[:, t] * ga[:, t])[:, None, None] * e[:, :, None] * k[:, t, None, :]
        err = max(err, float(np.max(np.abs(np.einsum("bij,bj->bi", M, q[:, t]) - y[:, t]))))
    assert err < 1e-13, err
    return err


def _check_omega_fd_long_window(rng):
    s = _sample_omega(rng, "tiny")
    p = _omega_params(rng, 3, 2, 2, p=3)
    s = Sample(inputs={"x": rng.standard_normal((2, 6, 3))}, params=p, config={"window": 6, "normalize_qk": False})
    err = fd_max_rel(atlas_omega_forward, atlas_omega_backward, s)
    assert err < 1e-6, err
    return err


register(
    Mechanism(
        slug="atlas_omega_rule_memory", family="4-linear-kernel-sparse", tier="T3",
        title="ATLAS / OmegaNet: Omega-rule (sliding-window) memory, linear case",
        paper="Behrouz, Li, Kacham, Daliri, Deng, Zhong, Razaviyayn, Mirrokni, 'ATLAS: Learning to Optimally "
              "Memorize the Context at Test Time', 2025, arXiv 2505.23735",
        forward=atlas_omega_forward, backward=atlas_omega_backward, sample=_sample_omega,
        reference=_reference_omega,
        checks={"window_one_is_gated_delta_rule": _check_omega_window_one_is_gated_delta_rule,
                "gradcheck_long_window_cubic_features": _check_omega_fd_long_window},
        docs="linear/long-convolutions-and-memory.md#atlas-omega-rule-memory",
    ),
)
