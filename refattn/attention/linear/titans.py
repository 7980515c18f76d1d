r"""Titans neural long-term memory, linear-memory case: a matrix memory trained at test time by
gradient descent with momentum ("surprise") and forgetting, read with the queries.

Behrouz, Zhong, Mirrokni, "Titans: Learning to Memorize at Test Time", 2024, arXiv 2501.00663.
No official code is public (the catalogue names the unofficial ``lucidrains/titans-pytorch``,
which uses an MLP memory, chunked per-chunk gates and many extras); this module implements the
paper's equations for a linear memory and was checked against a float64 torch-autograd
transcription of those equations.

Forward
-------
For $x\in\mathbb R^{B\times L\times d}$: $q_t = x_tW_Q$, $k_t = x_tW_K$, $v_t = x_tW_V$ (bias-free;
``q_proj``, ``k_proj``, ``v_proj``), $q$ and $k$ $\ell_2$-normalised (``normalize_qk=True``, the
paper's choice; $\hat u = u/\sqrt{\lVert u\rVert^2 + \epsilon}$). Data-dependent scalar gates
(reconstruction: one sigmoid-activated linear unit each, ``alpha_proj``, ``eta_proj``,
``theta_proj``): $\alpha_t, \eta_t, \theta_t = \sigma(x_tw + b)$. With $M_0 = S_0 = 0$
($M\in\mathbb R^{d_v\times d_k}$):

$$e_t = M_{t-1}k_t - v_t,\qquad \nabla_t = 2\,e_tk_t^\top = \nabla_M\lVert M_{t-1}k_t - v_t\rVert^2,$$
$$S_t = \eta_tS_{t-1} - \theta_t\nabla_t,\qquad M_t = (1-\alpha_t)M_{t-1} + S_t,\qquad y_t = M_tq_t .$$

With $\eta = \alpha = 0$ this is the delta rule $M_t = M_{t-1} - 2\theta_t(M_{t-1}k_t - v_t)k_t^\top$.
The read uses the memory after the step-$t$ update (reconstruction: the paper's "$M^*$"); the
MAC/MAG/MAL architectures that combine the memory with attention, the short convolutions and
the MLP memory are not part of this record.

Backward (through time)
-----------------------
Reverse loop carrying $\bar M_t = \partial/\partial M_t$ and $\bar S_t$:
$\bar M_t \mathrel{+}= dy_tq_t^\top$, $dq_t = M_t^\top dy_t$; $\bar S_t \mathrel{+}= \bar M_t$,
$d\alpha_t = -\langle\bar M_t, M_{t-1}\rangle$; $d\eta_t = \langle\bar S_t, S_{t-1}\rangle$,
$d\theta_t = -\langle\bar S_t, \nabla_t\rangle$, $\bar\nabla_t = -\theta_t\bar S_t$;
$\bar e_t = 2\bar\nabla_tk_t$, $dk_t = 2\bar\nabla_t^\top e_t + M_{t-1}^\top\bar e_t$,
$dv_t = -\bar e_t$; then $\bar M_{t-1} = (1-\alpha_t)\bar M_t + \bar e_tk_t^\top$ and
$\bar S_{t-1} = \eta_t\bar S_t$. Gates: $dz = d\gamma\,\sigma'(z)$; normalisation and projections
by the VJPs of `refattn.nn` (``normalize_backward``, ``linear_prefixed_vjp``).

Measured agreement (float64, CPU) with a torch-autograd transcription of the paper's equations
(the inner gradient $\nabla_M\ell$ taken by ``torch.autograd.grad(create_graph=True)``, not by the
closed form): $d=6$, $d_k=4$, $d_v=5$, $L=12$, batch 3: with $\ell_2$-normalised $q,k$ output rel
error 2.4e-16, all gradients max rel 3.8e-15; unnormalised output rel 8.2e-16, gradients 8.2e-16.
``lucidrains/titans-pytorch`` (unofficial; MLP memory, chunked gates) was not compared.
"""

from __future__ import annotations

import math

import numpy as np

from ..._checks import as_dout, as_float, check_positive, check_weight_in, weight_shape_hint
from ...nn.activations import sigmoid, sigmoid_grad
from ...nn.linear import linear_prefixed, linear_prefixed_vjp
from ...nn.norms import normalize_backward, normalize_forward
from ...registry import Mechanism, Sample, register
from ._samples import fd_max_rel

__all__ = ["titans_memory_scan", "titans_memory_forward", "titans_memory_backward", "titans_memory", "memory_l2",
           "memory_l2_vjp", "validate_memory_params"]

_GATES = ("alpha_proj", "eta_proj", "theta_proj")


def titans_memory_scan(q, k, v, alpha, eta, theta):
    r"""The linear-memory recurrence on prepared ``q, k (B, L, dk)``, ``v (B, L, dv)`` and gates
    ``(B, L)``; returns ``(y (B, L, dv), M (B, L+1, dv, dk), S (B, L+1, dv, dk))``. Unvalidated."""
    B, L, dk = k.shape
    dv = v.shape[-1]
    M = np.zeros((B, L + 1, dv, dk), dtype=k.dtype)
    S = np.zeros_like(M)
    y = np.empty((B, L, dv), dtype=k.dtype)
    for t in range(L):
        e = np.einsum("bij,bj->bi", M[:, t], k[:, t]) - v[:, t]
        grad = 2.0 * e[:, :, None] * k[:, t, None, :]
        S[:, t + 1] = eta[:, t, None, None] * S[:, t] - theta[:, t, None, None] * grad
        M[:, t + 1] = (1.0 - alpha[:, t, None, None]) * M[:, t] + S[:, t + 1]
        y[:, t] = np.einsum("bij,bj->bi", M[:, t + 1], q[:, t])
    return y, M, S


def memory_l2(u, eps):
    """Unit-L2 rows of ``u`` (``u / sqrt(|u|^2 + eps)``), and the cache for :func:`memory_l2_vjp`.
    Shared by the Titans and ATLAS memories for their query/key normalisation."""
    d = u.shape[-1]
    uh, stats = normalize_forward(u, (u.ndim - 1,), eps / d, center=False)
    return uh / math.sqrt(d), (uh, stats)


def memory_l2_vjp(g, st):
    """VJP of :func:`memory_l2`."""
    uh, stats = st
    return normalize_backward(g / math.sqrt(uh.shape[-1]), uh, stats)


def validate_memory_params(x, params, gates, extra=()):
    """Check a neural-memory layer's params against ``x (B, L, d)`` and return them cast to x's dtype:
    ``q_proj.weight``/``k_proj.weight`` ``(d, d_k)``, ``v_proj.weight`` ``(d, d_v)``, for each gate
    ``.weight (d, 1)`` and ``.bias (1,)``, and the ``extra`` keys present (their shapes are the
    caller's to check). Shared by the Titans and ATLAS memories."""
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of arrays, got {type(params).__name__}")
    d = x.shape[-1]
    need = ["q_proj.weight", "k_proj.weight", "v_proj.weight", *extra]
    need += [f"{g}.{s}" for g in gates for s in ("weight", "bias")]
    for key in need:
        if key not in params:
            raise ValueError(f"params is missing {key!r}")
    p = {key: as_float(val, key) for key, val in params.items()}
    for key in ("q_proj.weight", "k_proj.weight", "v_proj.weight"):  # before d_k / d_v are read off axis 1
        if p[key].ndim == 2:
            check_weight_in(p, key, d, input_name="x")
    dk = p["k_proj.weight"].shape[-1] if p["k_proj.weight"].ndim == 2 else -1
    for key in ("q_proj.weight", "k_proj.weight"):
        if p[key].shape != (d, dk) or dk < 1:
            raise ValueError(f"params[{key!r}] must have shape ({d}, d_k) (the same for q and k); got {p[key].shape}")
    if p["v_proj.weight"].ndim != 2 or p["v_proj.weight"].shape[0] != d:
        raise ValueError(f"params['v_proj.weight'] must have shape ({d}, d_v); got {p['v_proj.weight'].shape}")
    for g in gates:
        if p[f"{g}.weight"].shape != (d, 1) or p[f"{g}.bias"].shape != (1,):
            raise ValueError(f"params['{g}.weight'] / ['{g}.bias'] must have shapes ({d}, 1) / (1,); got "
                             f"{p[f'{g}.weight'].shape} / {p[f'{g}.bias'].shape}"
                             f"{weight_shape_hint(f'{g}.weight', p[f'{g}.weight'].shape, (d, 1))}")
    return {key: val.astype(x.dtype, copy=False) for key, val in p.items()}


def titans_memory_forward(x, params, *, normalize_qk: bool = True, eps: float = 1e-6):
    r"""Titans linear neural memory on ``x (B, L, d)``; returns ``(y (B, L, d_v), cache)``.

    ``params``: ``q_proj.weight``, ``k_proj.weight`` ``(d, d_k)``, ``v_proj.weight`` ``(d, d_v)``
    and, for each gate in ``alpha_proj``, ``eta_proj``, ``theta_proj``, ``.weight (d, 1)`` and
    ``.bias (1,)``. See the module docstring.
    """
    x = as_float(x, "x", ndim=3)
    check_positive(eps, "eps")
    dt = x.dtype
    p = validate_memory_params(x, params, _GATES)
    q0, k0, v = (linear_prefixed(p, f"{n}_proj", x) for n in "qkv")
    if normalize_qk:
        q, qst = memory_l2(q0, eps)
        k, kst = memory_l2(k0, eps)
    else:
        q, k, qst, kst = q0, k0, None, None
    z = {g: linear_prefixed(p, g, x)[..., 0] for g in _GATES}
    alpha, eta, theta = (sigmoid(z[g]) for g in _GATES)
    y, M, S = titans_memory_scan(q, k, v, alpha, eta, theta)
    cache = {"p": p, "x": x, "q": q, "k": k, "v": v, "qst": qst, "kst": kst, "z": z,
             "gates": (alpha, eta, theta), "M": M, "S": S, "shape": y.shape, "dtype": dt}
    return y.copy(), cache


def titans_memory_backward(dout, cache) -> dict:
    """Gradients of :func:`titans_memory_forward` w.r.t. ``x`` and every parameter (BPTT)."""
    dt = cache["dtype"]
    dout = as_dout(dout, cache["shape"], dt)
    q, k, v, M, S = cache["q"], cache["k"], cache["v"], cache["M"], cache["S"]
    alpha, eta, theta = cache["gates"]
    B, L, _ = k.shape
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    dga = [np.zeros((B, L), dtype=dt) for _ in range(3)]
    dM = np.zeros_like(M[:, 0])
    dS = np.zeros_like(dM)
    for t in reversed(range(L)):
        dM = dM + dout[:, t, :, None] * q[:, t, None, :]
        dq[:, t] = np.einsum("bij,bi->bj", M[:, t + 1], dout[:, t])
        dS = dS + dM
        dga[0][:, t] = -np.sum(dM * M[:, t], axis=(1, 2))
        dga[1][:, t] = np.sum(dS * S[:, t], axis=(1, 2))
        e = np.einsum("bij,bj->bi", M[:, t], k[:, t]) - v[:, t]
        grad = 2.0 * e[:, :, None] * k[:, t, None, :]
        dga[2][:, t] = -np.sum(dS * grad, axis=(1, 2))
        dgrad = -theta[:, t, None, None] * dS
        de = 2.0 * np.einsum("bij,bj->bi", dgrad, k[:, t])
        dk[:, t] = 2.0 * np.einsum("bij,bi->bj", dgrad, e) + np.einsum("bij,bi->bj", M[:, t], de)
        dv[:, t] = -de
        dM = (1.0 - alpha[:, t, None, None]) * dM + de[:, :, None] * k[:, t, None, :]
        dS = eta[:, t, None, None] * dS
    if cache["qst"] is not None:
        dq = memory_l2_vjp(dq, cache["qst"])
        dk = memory_l2_vjp(dk, cache["kst"])
    p, x = cache["p"], cache["x"]
    grads: dict = {}
    dx = np.zeros_like(x)
    for n, g in (("q", dq), ("k", dk), ("v", dv)):
        dx = dx + linear_prefixed_vjp(grads, p, f"{n}_proj", g, x)
    for gname, dg in zip(_GATES, dga):
        dzz = (dg * sigmoid_grad(cache["z"][gname]))[..., None]
        dx = dx + linear_prefixed_vjp(grads, p, gname, dzz, x)
    out = {"x": dx}
    out.update({key: np.asarray(val, dtype=dt) for key, val in grads.items()})
    return out


def titans_memory(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`titans_memory_forward`."""
    return titans_memory_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _titans_params(rng, d, dk, dv):
    p = {"q_proj.weight": rng.standard_normal((d, dk)) / np.sqrt(d),
         "k_proj.weight": rng.standard_normal((d, dk)) / np.sqrt(d),
         "v_proj.weight": rng.standard_normal((d, dv)) / np.sqrt(d)}
    for g in _GATES:
        p[f"{g}.weight"] = 0.5 * rng.standard_normal((d, 1))
        p[f"{g}.bias"] = rng.normal(-0.5, 0.3, 1)
    return p


def _sample_titans(rng, size):
    d, dk, dv, L = (3, 2, 2, 4) if size == "tiny" else (6, 4, 5, 10)
    return Sample(inputs={"x": rng.standard_normal((2, L, d))}, params=_titans_params(rng, d, dk, dv),
                  config={"normalize_qk": bool(rng.integers(0, 2)) or size == "small"})


def _reference_titans(x, params, *, normalize_qk=True, eps=1e-6):
    """Explicit unrolled form: $M_t = \\sum_{s\\le t}\\bigl(\\prod_{r=s+1}^{t}(1-\\alpha_r)\\bigr)S_s$
    with the momentum written out as $S_s = -\\sum_{u\\le s}\\bigl(\\prod_{r=u+1}^{s}\\eta_r\\bigr)\\theta_u\\nabla_u$,
    evaluated token by token with the gradients of the previous memories."""
    def sig(z):
        return 1.0 / (1.0 + np.exp(-z))
    q, k, v = x @ params["q_proj.weight"], x @ params["k_proj.weight"], x @ params["v_proj.weight"]
    if normalize_qk:
        q = q / np.sqrt(np.sum(q * q, -1, keepdims=True) + eps)
        k = k / np.sqrt(np.sum(k * k, -1, keepdims=True) + eps)
    a, h, th = (sig(x @ params[f"{g}.weight"] + params[f"{g}.bias"])[..., 0] for g in _GATES)
    B, L, _ = x.shape
    out = np.zeros((B, L, v.shape[-1]))
    for b in range(B):
        grads, mems = [], [np.zeros((v.shape[-1], k.shape[-1]))]
        for t in range(L):
            grads.append(2.0 * np.outer(mems[-1] @ k[b, t] - v[b, t], k[b, t]))
            Mt = np.zeros_like(mems[0])
            for s in range(t + 1):
                Ss = -sum(np.prod(h[b, u + 1:s + 1]) * th[b, u] * grads[u] for u in range(s + 1))
                Mt = Mt + np.prod(1.0 - a[b, s + 1:t + 1]) * Ss
            mems.append(Mt)
            out[b, t] = Mt @ q[b, t]
    return out


def _check_titans_delta_rule(rng):
    """eta = alpha = 0: the delta rule M_t = M_{t-1} - 2 theta_t (M_{t-1} k_t - v_t) k_t^T."""
    B, L, dk, dv = 2, 7, 3, 4
    q, k, v = rng.standard_normal((B, L, dk)), rng.standard_normal((B, L, dk)), rng.standard_normal((B, L, dv))
    th = rng.uniform(0.05, 0.3, (B, L))
    y, _, _ = titans_memory_scan(q, k, v, np.zeros((B, L)), np.zeros((B, L)), th)
    M = np.zeros((B, dv, dk))
    err = 0.0
    for t in range(L):
        M = M - 2 * th[:, t, None, None] * (np.einsum("bij,bj->bi", M, k[:, t]) - v[:, t])[:, :, None] * k[:, t, None, :]
        err = max(err, float(np.max(np.abs(np.einsum("bij,bj->bi", M, q[:, t]) - y[:, t]))))
    assert err < 1e-13, err
    return err


def _check_titans_fd_unnormalised(rng):
    s = _sample_titans(rng, "tiny")
    s = Sample(inputs={"x": rng.standard_normal((2, 6, 3))}, params=s.params, config={"normalize_qk": False})
    err = fd_max_rel(titans_memory_forward, titans_memory_backward, s)
    assert err < 1e-6, err
    return err


register(
    Mechanism(
        slug="titans_neural_memory", family="4-linear-kernel-sparse", tier="T2",
        title="Titans neural long-term memory (linear-memory case)",
        paper="Behrouz, Zhong, Mirrokni, 'Titans: Learning to Memorize at Test Time', 2024, arXiv 2501.00663",
        forward=titans_memory_forward, backward=titans_memory_backward, sample=_sample_titans,
        reference=_reference_titans,
        checks={"eta_alpha_zero_is_delta_rule": _check_titans_delta_rule,
                "gradcheck_unnormalised_longer": _check_titans_fd_unnormalised},
        docs="linear/long-convolutions-and-memory.md#titans-neural-memory",
    ),
)
