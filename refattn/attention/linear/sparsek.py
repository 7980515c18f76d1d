r"""SPARSEK attention: a scoring network and the differentiable top-$k$ mask operator SPARSEK.

Lou, Jia, Zheng, Tu, "Sparser is Faster and Less is More: Efficient Sparse Attention for
Long-Range Transformers", 2024, arXiv 2406.16747. No official code is public (the catalogue lists
none and a search found none); the operator is defined in the paper, how its mask enters attention
is a reconstruction (below, marked).

The SPARSEK operator
--------------------
For scores $u\in\mathbb R^n$ and a budget $k < n$, SPARSEK is the Euclidean projection onto the
capped simplex,

$$\mathrm{SPARSEK}(u, k) = \arg\min_{p\in[0,1]^n,\ \mathbf 1^\top p = k}\|p-u\|^2,\qquad
m_j = \mathrm{clip}(u_j-\tau, 0, 1),$$

with the threshold $\tau$ solving $f(\tau) = \sum_j\mathrm{clip}(u_j-\tau, 0, 1) = k$ (KKT; $f$ is
continuous, non-increasing and piecewise linear with breakpoints $u_j$ and $u_j - 1$).
`sparsek_threshold` sorts the $2n$ breakpoints, finds the two consecutive ones that bracket $k$
and interpolates linearly: exact up to round-off (the paper's sort-based solve; a bisection in
the record's reference agrees to $10^{-12}$). With $n \le k$ every entry gets $m_j = 1$.

Jacobian (derived from the KKT form). With the free set $F = \{j: 0 < m_j < 1\}$ and the capped
set $U = \{j: m_j = 1\}$, $\sum_{j\in F}(u_j - \tau) + |U| = k$ gives
$\tau = (\sum_F u_j + |U| - k)/|F|$, so $\partial\tau/\partial u_l = [l\in F]/|F|$ and

$$\frac{\partial m_j}{\partial u_l} = [j\in F]\Big(\delta_{jl} - \frac{[l\in F]}{|F|}\Big),\qquad
\text{VJP: } du_l = [l\in F]\Big(dm_l - \frac{1}{|F|}\sum_{j\in F}dm_j\Big)$$

(zero when $F$ is empty). It is exact away from the breakpoints $u_j - \tau\in\{0, 1\}$, where the
map has kinks: samplers keep every $u_j - \tau$ at least 0.02 from them.

SPARSEK attention (reconstruction of the mask's use)
----------------------------------------------------
Scores $u_j$ per key and head (the paper's scoring network $u = Xw_{\text{score}}$; here $u$ is an
input, so a network's gradient follows by the chain rule). For query $i$ with candidate keys
$C_i$ (causal: $j \le i - w$, the keys outside a sliding window of the $w$ most recent ones;
non-causal: all keys):

* the gates $m_{i\cdot} = \mathrm{SPARSEK}(u_{C_i}, k)$ (one threshold $\tau_i$ per query: a
  causal query projects only its prefix), all ones when $|C_i| \le k$;
* the kept set $S_i = \operatorname{top-}k_{j\in C_i}u_j \cup W_i$: exactly $k$ selected keys (the
  support of $m$ holds at least $k$ entries and the top-$k$ of $u$ lie in it, so every selected gate
  is positive) plus the window keys $W_i$ with gate 1;
* ``gate="value"`` (default): $o_i = \sum_{j\in S_i}P_{ij}\,m_{ij}v_j$ with
  $P_{i\cdot} = \mathrm{softmax}_{j\in S_i}(s\,q_i\cdot k_j)$ (the mask weights the selected
  KV pairs); ``gate="log"``: $o_i = \sum_{j\in S_i}\mathrm{softmax}_{j\in S_i}(s\,q_i\cdot k_j + \log m_{ij})\,v_j$.

Reconstruction choices (keywords): how $m$ enters attention (``gate``), the exact-$k$ top-$k$
selection inside the support of $m$, the window (``window``, default 0: SPARSEK alone) and that
the window keys are excluded from the projection.

Backward (selection held fixed, gates differentiated)
-----------------------------------------------------
The sets $C_i$, $S_i$, $F_i$ are constant; the gates are differentiable in $u$. Value gate, with
$W = P\odot G$ ($G$ the gates on $S$): $dV = W^\top g$, $dW = gV^\top$, $dP = dW\odot G$,
$dG = dW\odot P$; log gate: $dP = gV^\top$, $dG = dS/G$ on the selected entries. Then
$dS = P\odot(dP - \mathrm{rowsum}(P\odot dP))$, $dq = s\,dS\,K$, $dk = s\,dS^\top Q$, and per query
row the SPARSEK VJP above maps $dG$ (zero on the unselected support entries, which stay in $F_i$)
to $du$, summed over the queries.

Conventions: ``scale`` defaults to $1/\sqrt d$; causal by default (the paper's setting is
autoregressive decoding); ``q, k, v`` in SDPA layout with equal head counts and ``u (..., M)``.

Agreement: no upstream code exists; the paper's operator in PyTorch autograd (sets from a
bisection, $\tau$ as the differentiable active-piece expression) with this attention agrees to
4.4e-16 (output) and 5.8e-16 (gradients, relative).
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, check_choice, check_int, check_positive, compute_dtype
from ...nn.softmax import softmax_lse, softmax_vjp
from ...registry import Mechanism, Sample, register
from ._samples import draw_until, fd_max_rel, topk_margin
from .core import mT, topk_keep, validate_linear_qkv

__all__ = ["SPARSEK_GATES", "sparsek_threshold", "sparsek_mask", "sparsek_mask_vjp", "sparsek_mask_forward",
           "sparsek_mask_backward", "sparsek_sets", "sparsek_attention_forward", "sparsek_attention_backward",
           "sparsek_attention"]

SPARSEK_GATES = ("value", "log")


def sparsek_threshold(u: np.ndarray, k: int, valid=None) -> np.ndarray:
    r"""The threshold $\tau$ ``(...)`` with $\sum_{j\,\text{valid}}\mathrm{clip}(u_j-\tau,0,1) = k$ along the
    last axis (breakpoint sort and linear interpolation; ``-inf`` for rows with at most ``k``
    valid entries). Unvalidated."""
    n = u.shape[-1]
    valid = np.ones(u.shape, bool) if valid is None else np.broadcast_to(valid, u.shape)
    bps = np.concatenate([u, u - 1.0], axis=-1)
    bvalid = np.concatenate([valid, valid], axis=-1)
    f = np.sum(np.where(valid[..., None, :], np.clip(u[..., None, :] - bps[..., :, None], 0.0, 1.0), 0.0), axis=-1)
    order = np.argsort(np.where(bvalid, bps, np.inf), axis=-1, kind="stable")
    sb = np.take_along_axis(bps, order, axis=-1)
    sf = np.take_along_axis(np.where(bvalid, f, -np.inf), order, axis=-1)
    lo = np.clip(np.sum(sf >= k, axis=-1) - 1, 0, 2 * n - 2)
    b_lo, b_hi = (np.take_along_axis(sb, i[..., None], axis=-1)[..., 0] for i in (lo, lo + 1))
    f_lo, f_hi = (np.take_along_axis(sf, i[..., None], axis=-1)[..., 0] for i in (lo, lo + 1))
    few = np.sum(valid, axis=-1) <= k
    with np.errstate(invalid="ignore", divide="ignore"):
        tau = b_lo + (f_lo - k) * (b_hi - b_lo) / np.where(few, 1.0, f_lo - f_hi)
    return np.where(few, -np.inf, tau)


def sparsek_mask(u: np.ndarray, k: int, valid=None):
    r"""SPARSEK along the last axis: ``(m, tau)`` with $m_j = \mathrm{clip}(u_j - \tau, 0, 1)$ on the
    valid entries (0 elsewhere; all ones when at most ``k`` are valid). Unvalidated."""
    tau = sparsek_threshold(u, k, valid)
    with np.errstate(invalid="ignore"):
        m = np.clip(u - tau[..., None], 0.0, 1.0)
    m = np.where(np.isneginf(tau)[..., None], 1.0, m).astype(u.dtype, copy=False)
    if valid is not None:
        m = np.where(valid, m, 0.0)
    return m, tau


def sparsek_mask_vjp(dm: np.ndarray, m: np.ndarray, valid=None) -> np.ndarray:
    r"""$du_l = [l\in F](dm_l - \frac1{|F|}\sum_{j\in F}dm_j)$ with $F = \{0 < m < 1\}$ (valid entries)."""
    free = (m > 0) & (m < 1)
    if valid is not None:
        free &= valid
    nf = np.maximum(np.sum(free, axis=-1, keepdims=True), 1).astype(dm.dtype)
    mean = np.sum(np.where(free, dm, 0.0), axis=-1, keepdims=True) / nf
    return np.where(free, dm - mean, 0.0)


def sparsek_mask_forward(u, *, k: int):
    r"""The SPARSEK operator (capped-simplex projection) along the last axis of ``u (..., n)``:
    ``(m, cache)``; ``cache["tau"]`` is the threshold. See the module docstring."""
    u = as_float(u, "u", min_ndim=1)
    k = check_int(k, "k", minimum=1)
    m, tau = sparsek_mask(u, k)
    return m, {"m": m.copy(), "tau": tau}


def sparsek_mask_backward(dout, cache):
    """The SPARSEK Jacobian-transpose product ``{"u": du}`` (free-set centring, module docstring)."""
    m = cache["m"]
    return {"u": sparsek_mask_vjp(as_dout(dout, m.shape, m.dtype), m)}


def sparsek_sets(u: np.ndarray, n: int, top_k: int, *, is_causal: bool = True, window: int = 0):
    r"""Per query row ``(..., n, M)``: the SPARSEK gates ``m``, the selected top-$k$ keys ``sel``, the
    window keys ``local`` and the candidates ``cand`` for key scores ``u (..., M)``. Unvalidated."""
    m_keys = u.shape[-1]
    rel = np.arange(n)[:, None] - np.arange(m_keys)[None, :]  # i - j
    if is_causal:
        vis = rel >= 0
        local = vis & (rel < window)
    else:
        vis = np.ones((n, m_keys), bool)
        local = np.zeros((n, m_keys), bool)
    cand = vis & ~local
    ub = np.broadcast_to(u[..., None, :], u.shape[:-1] + (n, m_keys))
    gates, _ = sparsek_mask(ub, top_k, cand)
    sel = topk_keep(ub, top_k, cand)
    return gates, sel, local, cand


def sparsek_attention_forward(q, k, v, u, *, top_k: int, is_causal: bool = True, window: int = 0, scale=None,
                              gate: str = "value"):
    r"""SPARSEK attention: per query, the ``top_k`` keys of largest score $u$ among its candidates,
    gated by the SPARSEK mask of the candidates' scores, plus an ungated sliding window.

    Parameters
    ----------
    q : (..., N, d); k : (..., M, d); v : (..., M, d_v)
        Equal leading axes (``(B, H)``); ``is_causal`` needs ``M == N``.
    u : (..., M)
        Key importance scores (the scoring network's output).
    top_k : int >= 1
        The budget $k$ of SPARSEK and of the selection.
    is_causal : bool
        Candidates $j \le i - w$ (default) or all keys.
    window : int >= 0
        Causal sliding window of the $w$ most recent keys (gate 1, outside the projection).
    scale : float > 0, optional
        Default $1/\sqrt d$.
    gate : {"value", "log"}
        The gate multiplies the values (default) or adds $\log m$ to the scores (reconstruction).

    Returns
    -------
    out : (..., N, d_v), cache
    """
    top_k = check_int(top_k, "top_k", minimum=1)
    window = check_int(window, "window", minimum=0)
    check_choice(gate, "gate", SPARSEK_GATES)
    scale = check_positive(scale, "scale", allow_none=True)
    if not isinstance(is_causal, (bool, np.bool_)):
        raise TypeError(f"is_causal must be a bool; got {type(is_causal).__name__}")
    if window and not is_causal:
        raise ValueError(f"window={window} needs is_causal=True (the window is the most recent keys)")
    q, k, v = validate_linear_qkv(q, k, v, same_length=bool(is_causal))
    u = as_float(u, "u", min_ndim=1)
    if u.shape != k.shape[:-1]:
        raise ValueError(f"u must have k's leading axes and key count {k.shape[:-1]}; got {u.shape}")
    dt = compute_dtype(q, k, v, u)
    q, k, v, u = (a.astype(dt, copy=False) for a in (q, k, v, u))
    s = float(1.0 / np.sqrt(q.shape[-1])) if scale is None else scale
    gates, sel, local, cand = sparsek_sets(u, q.shape[-2], top_k, is_causal=bool(is_causal), window=window)
    g = np.where(sel, gates, 0.0) + local  # the gate of every kept key (1 in the window)
    kept = sel | local
    scores = s * (q @ mT(k))
    if gate == "log":
        with np.errstate(divide="ignore"):
            scores = scores + np.log(np.where(kept, g, 1.0))
    p, _ = softmax_lse(np.where(kept, scores, -np.inf), axis=-1)
    w = p * g if gate == "value" else p
    out = w @ v
    cache = {"q": q, "k": k, "v": v, "p": p, "g": g, "gates": gates, "sel": sel, "cand": cand, "scale": s,
             "gate": gate, "out_shape": out.shape}
    return out, cache


def sparsek_attention_backward(dout, cache):
    r"""Gradients ``{"q", "k", "v", "u"}`` of `sparsek_attention_forward` (selection fixed, gates
    differentiated through SPARSEK; module docstring)."""
    q, k, v, p, g = cache["q"], cache["k"], cache["v"], cache["p"], cache["g"]
    go = as_dout(dout, cache["out_shape"], p.dtype)
    dw = go @ mT(v)
    if cache["gate"] == "value":
        dv = mT(p * g) @ go
        dp, dg = dw * g, dw * p
        ds = softmax_vjp(p, dp)
    else:
        dv = mT(p) @ go
        ds = softmax_vjp(p, dw)
        dg = np.where(cache["sel"], ds / np.where(cache["sel"], g, 1.0), 0.0)
    s = cache["scale"]
    dm = np.where(cache["sel"], dg, 0.0)
    du = np.sum(sparsek_mask_vjp(dm, cache["gates"], cache["cand"]), axis=-2)
    return {"q": s * (ds @ k), "k": s * (mT(ds) @ q), "v": dv, "u": du}


def sparsek_attention(q, k, v, u, **config) -> np.ndarray:
    """Convenience wrapper: the output of `sparsek_attention_forward`."""
    return sparsek_attention_forward(q, k, v, u, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _bisect_tau(vals, k, iters=64):
    lo, hi = min(vals) - 1.0, max(vals)
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if sum(min(max(x - mid, 0.0), 1.0) for x in vals) > k:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def _reference(q, k, v, u, *, top_k, is_causal=True, window=0, scale=None, gate="value"):
    """One query at a time: candidates, a bisection for tau, a sort for the top-k, the gated softmax."""
    n, m = q.shape[-2], k.shape[-2]
    s = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    out = np.zeros(q.shape[:-1] + (v.shape[-1],))
    for idx in np.ndindex(*q.shape[:-2]):
        for i in range(n):
            vis = [j for j in range(m) if not is_causal or j <= i]
            win = [j for j in vis if is_causal and i - j < window]
            cand = [j for j in vis if j not in win]
            if len(cand) <= top_k:
                gates = {j: 1.0 for j in cand}
            else:
                tau = _bisect_tau([u[idx + (j,)] for j in cand], top_k)
                top = sorted(cand, key=lambda j: -u[idx + (j,)])[:top_k]
                gates = {j: min(max(u[idx + (j,)] - tau, 0.0), 1.0) for j in top}
            gates.update({j: 1.0 for j in win})
            js = sorted(gates)
            sc = np.array([s * float(q[idx + (i,)] @ k[idx + (j,)]) for j in js])
            gv = np.array([gates[j] for j in js])
            if gate == "log":
                sc = sc + np.log(gv)
            w = np.exp(sc - sc.max())
            w = w / w.sum()
            out[idx + (i,)] = ((w * gv) if gate == "value" else w) @ v[idx][js]
    return out


def _breakpoint_margin(u, n, top_k, is_causal, window):
    """The distance of every active candidate's $u_j - \\tau_i$ from the kinks 0 and 1."""
    gates, _, _, cand = sparsek_sets(u, n, top_k, is_causal=is_causal, window=window)
    ub = np.broadcast_to(u[..., None, :], gates.shape)
    tau = sparsek_threshold(ub, top_k, cand)
    active = np.isfinite(tau)[..., None] & cand
    if not active.any():
        return np.inf
    d = np.minimum(np.abs(ub - tau[..., None]), np.abs(ub - 1.0 - tau[..., None]))
    return float(np.min(np.where(active, d, np.inf)))


def _draw(rng, size, gate=None, window=None, is_causal=True):
    b, h = 2, 2
    n = 5 if size == "tiny" else int(rng.integers(7, 10))
    d, dv = (2, 2) if size == "tiny" else (4, 3)
    top_k = 2 if size == "tiny" else 3
    window = int(rng.integers(0, 2)) if window is None else window
    gate = SPARSEK_GATES[int(rng.integers(0, 2))] if gate is None else gate
    q, k, v = (rng.standard_normal((b, h, n, x)) for x in (d, d, dv))

    def margin(u):
        _, _, _, cand = sparsek_sets(u, n, top_k, is_causal=is_causal, window=window)
        ub = np.broadcast_to(u[..., None, :], u.shape[:-1] + (n, n))
        # the top-k sets need a clear gap (a swap changes the output); the kinks of SPARSEK only
        # need to stay beyond the finite-difference steps (the gates are continuous)
        return min(50.0 * _breakpoint_margin(u, n, top_k, is_causal, window), topk_margin(ub, top_k, cand))

    def draw(r):  # well-spaced scores in random order: the top-k sets have gaps >= 0.25
        return 0.35 * r.permuted(np.broadcast_to(np.arange(n) - n / 2, (b, h, n)), axis=-1) + 0.1 * r.random((b, h, n))

    u = draw_until(rng, draw, margin, 0.02)
    return Sample(inputs={"q": q, "k": k, "v": v, "u": u},
                  config={"top_k": top_k, "is_causal": is_causal, "window": window, "gate": gate})


def _sample(rng, size):
    return _draw(rng, size)


def _check_operator_kkt(rng):
    """sum m = k, 0 <= m <= 1, and m = clip(u - tau) with tau from an independent bisection (tau itself
    is not unique when no entry is free; m is)."""
    u = 2.0 * rng.standard_normal((20, 9))
    err = 0.0
    for kk in (1, 3, 5, 8):
        m, tau = sparsek_mask(u, kk)
        assert (m >= 0).all() and (m <= 1).all()
        err = max(err, float(np.max(np.abs(m.sum(-1) - kk))))
        for row, mrow in zip(u, m):
            err = max(err, float(np.max(np.abs(np.clip(row - _bisect_tau(list(row), kk), 0, 1) - mrow))))
    assert err < 1e-12, f"SPARSEK threshold / sum error {err}"
    return err


def _check_operator_is_projection(rng):
    """m is the nearest point of the capped simplex: no random feasible point is closer to u."""
    u = 1.5 * rng.standard_normal(7)
    m, _ = sparsek_mask(u, 3)
    best = float(np.sum((m - u) ** 2))
    for _ in range(300):
        p = np.clip(m + 0.3 * rng.standard_normal(7), 0.0, 1.0)
        p, _ = sparsek_mask(p, 3)  # a feasible point (a projection of a nearby point)
        assert np.sum((p - u) ** 2) >= best - 1e-12
    return 0.0


def _check_operator_jacobian(rng):
    """The SPARSEK VJP against central differences, away from the breakpoints."""
    def draw(r):
        return 1.5 * r.standard_normal((3, 8))

    def margin(u):
        m, tau = sparsek_mask(u, 3)
        return float(np.min(np.minimum(np.abs(u - tau[:, None]), np.abs(u - 1 - tau[:, None]))))

    u = draw_until(rng, draw, margin, 0.02)
    return fd_max_rel(sparsek_mask_forward, sparsek_mask_backward, Sample(inputs={"u": u}, config={"k": 3}))


def _check_large_k_is_attention(rng):
    """top_k >= M, non-causal: every gate is 1 and the mechanism is softmax attention."""
    q, k, v = (rng.standard_normal((2, 2, 6, 3)) for _ in range(3))
    u = rng.standard_normal((2, 2, 6))
    a = sparsek_attention(q, k, v, u, top_k=6, is_causal=False)
    s = q @ mT(k) / np.sqrt(3)
    b = softmax_lse(s)[0] @ v
    err = float(np.max(np.abs(a - b)))
    assert err < 1e-12, f"top_k = M differs from softmax attention by {err}"
    return err


def _check_causal_prefix(rng):
    """Causal: the first t outputs do not depend on the keys after t (per-query prefix projection)."""
    s = _draw(rng, "small")
    x = s.inputs
    full = sparsek_attention(x["q"], x["k"], x["v"], x["u"], **s.config)
    t = full.shape[-2] - 3
    part = sparsek_attention(x["q"][..., :t, :], x["k"][..., :t, :], x["v"][..., :t, :], x["u"][..., :t],
                             **s.config)
    err = float(np.max(np.abs(full[..., :t, :] - part)))
    assert err < 1e-12, f"causal SPARSEK attention looks ahead: {err}"
    return err


def _check_gradcheck_options(rng):
    errs = [fd_max_rel(sparsek_attention_forward, sparsek_attention_backward, _draw(rng, "tiny", gate="log",
                                                                                   window=1))]
    errs.append(fd_max_rel(sparsek_attention_forward, sparsek_attention_backward,
                           _draw(rng, "tiny", gate="value", window=0, is_causal=False)))
    return max(errs)


register(
    Mechanism(
        slug="sparsek_attention", family="4-linear-kernel-sparse", tier="T2",
        title="SPARSEK attention (differentiable top-k mask)",
        paper="Lou, Jia, Zheng, Tu, 'Sparser is Faster and Less is More: Efficient Sparse Attention for "
              "Long-Range Transformers', 2024, arXiv 2406.16747",
        forward=sparsek_attention_forward, backward=sparsek_attention_backward, sample=_sample,
        reference=_reference,
        checks={"sparsek_sum_k_and_threshold_vs_bisection": _check_operator_kkt,
                "sparsek_is_the_projection": _check_operator_is_projection,
                "sparsek_jacobian_vs_fd": _check_operator_jacobian,
                "top_k_ge_M_equals_attention": _check_large_k_is_attention,
                "causal_no_lookahead": _check_causal_prefix,
                "gradcheck_log_gate_window_noncausal": _check_gradcheck_options},
        docs="linear/sparse-attention.md#sparsek-attention",
    ),
)
