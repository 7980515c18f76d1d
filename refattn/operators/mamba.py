r"""Mamba's selective state-space scan (S6): a recurrent reference, a chunked parallel form and
the backward through time.

This module is the reusable scan. The Mamba Neural Operator layer built on it is
:mod:`refattn.operators.mamba_neural_operator`; other families (``diff_mamba``) import
:func:`selective_scan_forward` / :func:`selective_scan_backward` from here.

Upstream: state-spaces/mamba ``mamba_ssm/ops/selective_scan_interface.py``
(``selective_scan_ref``) @ e9594ce1c732d97440f0332fdc43170a2294dbfa — the PyTorch reference
against which upstream tests its CUDA kernel. Paper: Gu & Dao, "Mamba: Linear-Time Sequence
Modeling with Selective State Spaces", COLM 2024, arXiv 2312.00752.

Forward
-------
Shapes as upstream: ``u, delta (Bt, Dm, L)``, ``A (Dm, N)`` (real), ``B`` and ``C`` either
time-invariant ``(Dm, N)``, input-dependent ``(Bt, N, L)`` or grouped ``(Bt, G, N, L)`` (channel
$d$ uses group $\lfloor d/(D_m/G)\rfloor$, upstream's ``repeat("B G N L -> B (G H) N L")``),
``D, delta_bias (Dm,)``, ``z (Bt, Dm, L)``. For every batch $b$, channel $d$, state $n$, time $t$:

$$\Delta_t = \mathrm{softplus}(\delta_t + \beta)\ \text{(or } \delta_t+\beta\text{)},\qquad
\bar a_t = e^{\Delta_t A_{dn}},\qquad \bar b_t = w_t\,B_{tn}\,u_t,$$

$$h_t = \bar a_t\,h_{t-1} + \bar b_t\quad(h_{-1} = 0),\qquad
y_t = \textstyle\sum_n C_{tn} h_{tn} + D_d u_t,\qquad \mathrm{out}_t = y_t\,\mathrm{SiLU}(z_t).$$

$A$ is discretised by zero-order hold (ZOH), $\bar A = e^{\Delta A}$. For $B$, upstream's code
uses the simplified (Euler) rule $w_t = \Delta_t$ (``discretization="euler"``, the default); the
paper's exact ZOH rule is $w_t = (e^{\Delta_t A}-1)/A = \Delta_t\,\varphi(\Delta_t A)$ with
$\varphi(x) = (e^x-1)/x$ (``discretization="zoh"``). D skip and z gating are optional as
upstream. Complex $A$ (S4D-Lin) is not supported: Mamba and the Mamba Neural Operator use real $A$.

Chunked form (``mode="chunked"``)
---------------------------------
With $S_t = \sum_{i\le t}\Delta_iA$ the running log-decay inside a chunk starting at $s$,

$$h_t = e^{S_t} h_{s-1} + \sum_{s\le j\le t} e^{S_t - S_j}\,\bar b_j ,$$

i.e. a masked $T\times T$ decay matrix per (batch, channel, state) applied to the chunk's inputs
in parallel, plus the carried state; only the chunk boundaries are sequential. ``mode="recurrent"``
is the plain loop of ``selective_scan_ref``. The two agree to round-off (checked).

Backward (through time)
-----------------------
With $g = \partial L/\partial\mathrm{out}$: $g^y = g\,\mathrm{SiLU}(z)$,
$dz = g\,y\,\mathrm{SiLU}'(z)$, $dC_{tn} = g^y_t h_{tn}$, $dD = \sum g^y u$, and the adjoint state
$\lambda_t = \partial L/\partial h_t$ solves the *reverse* recurrence

$$\lambda_t = g^y_t C_t + \bar a_{t+1}\lambda_{t+1},\qquad \lambda_{L-1} = g^y_{L-1}C_{L-1},$$

the same linear scan run backwards in time (so both modes serve the backward too). Then
$\partial L/\partial \bar b_t = \lambda_t$ and $\partial L/\partial(\Delta_tA) = \lambda_t\,\bar a_t\,h_{t-1}$, so

$$dA_{dn} = \sum_{b,t}\lambda_t\bar a_t h_{t-1}\Delta_t,\qquad
d\Delta_t \mathrel{+}= \sum_n \lambda_t\bar a_t h_{t-1}A_{dn} + \sum_n \lambda_t\,\tfrac{\partial w_t}{\partial\Delta_t}B_{tn}u_t,$$

$$dB_{tn} = \sum_{d} \lambda_{tdn}\,w_t\,u_t,\qquad du_t = \sum_n\lambda_t w_t B_{tn} + g^y_t D .$$

Euler: $\partial w/\partial\Delta = 1$. ZOH (with $x=\Delta A$): $\partial w/\partial\Delta = e^x$
and $\partial w/\partial A = \Delta^2\varphi'(x)$, $\varphi'(x) = (e^x-\varphi(x))/x$ (series near
0). The softplus gives $d\delta = d\Delta\,\sigma(\delta+\beta)$ and $d\beta = \sum_{b,t}d\delta$.
$dB, dC$ are summed back onto their layout (over $b, t$ for time-invariant, over the channels of
a group for grouped).

Conventions made explicit
-------------------------
* ``discretization``: ``"euler"`` (upstream ``selective_scan_ref`` and the CUDA kernel) or
  ``"zoh"`` (the paper's eq. 4).
* ``delta_softplus`` defaults to False as in ``selective_scan_ref`` (Mamba layers pass True).
* Upstream computes in float32 whatever the input; refattn computes in the input dtype
  (float64 stays float64).
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_choice, check_int, compute_dtype
from ..nn.activations import sigmoid, silu, silu_grad
from ..registry import Mechanism, Sample, register

__all__ = [
    "selective_scan_forward",
    "selective_scan_backward",
    "selective_scan",
    "linear_scan",
    "softplus",
]

_SERIES_CUT = 1e-3  # |x| below which phi and phi' use their Taylor series (next terms < 1e-14)


def softplus(x: np.ndarray) -> np.ndarray:
    r"""$\log(1+e^x)$, overflow-free (its derivative is :func:`refattn.nn.activations.sigmoid`)."""
    return np.logaddexp(0.0, x)


def linear_scan(log_a: np.ndarray, b: np.ndarray, *, mode: str = "chunked", chunk_size: int = 64) -> np.ndarray:
    r"""All states of $h_t = e^{\ell_t} h_{t-1} + b_t$, $h_{-1} = 0$, along axis -2 (time).

    ``log_a`` and ``b`` have shape ``(..., L, N)`` (``log_a`` may broadcast over leading axes).
    ``mode="recurrent"`` loops over time; ``mode="chunked"`` solves chunks of ``chunk_size`` steps
    in parallel with the masked decay matrix $e^{S_t - S_j}$ (module docstring) and carries the
    state across chunk boundaries. Unvalidated: callers validate first.
    """
    log_a = np.broadcast_to(log_a, b.shape)
    n_t = b.shape[-2]
    h = np.empty_like(b)
    if mode == "recurrent":
        state = np.zeros(b.shape[:-2] + b.shape[-1:], dtype=b.dtype)
        a = np.exp(log_a)
        for t in range(n_t):
            state = a[..., t, :] * state + b[..., t, :]
            h[..., t, :] = state
        return h
    state = None
    for s in range(0, n_t, chunk_size):
        e = min(s + chunk_size, n_t)
        cum = np.cumsum(log_a[..., s:e, :], axis=-2)                    # S_t inside the chunk
        diff = cum[..., :, None, :] - cum[..., None, :, :]                # S_t - S_j  (.., T, T, N)
        keep = np.tril(np.ones((e - s, e - s), dtype=bool))[:, :, None]
        decay = np.exp(np.where(keep, diff, -np.inf))
        hc = np.einsum("...tjn,...jn->...tn", decay, b[..., s:e, :])
        if state is not None:
            hc = hc + np.exp(cum) * state[..., None, :]
        h[..., s:e, :] = hc
        state = hc[..., -1, :]
    return h


def _phi(x):
    """(e^x - 1)/x and its derivative, with the Taylor series near 0."""
    small = np.abs(x) < _SERIES_CUT
    xs = np.where(small, 1.0, x)
    phi = np.where(small, 1.0 + x * (1 / 2 + x * (1 / 6 + x / 24)), np.expm1(xs) / xs)
    dphi = np.where(small, 1 / 2 + x * (1 / 3 + x * (1 / 8 + x / 30)), (np.exp(xs) - phi) / xs)
    return phi, dphi


def _validate(u, delta, A, B, C, D, z, delta_bias, discretization, mode, chunk_size):
    u = as_float(u, "u", ndim=3)
    delta = as_float(delta, "delta", ndim=3)
    if delta.shape != u.shape:
        raise ValueError(f"delta must have u's shape (Bt, Dm, L) = {u.shape}; got {delta.shape}")
    bt, dm, n_t = u.shape
    A = as_float(A, "A", ndim=2)
    if A.shape[0] != dm:
        raise ValueError(f"A must have shape (Dm={dm}, N); got {A.shape}")
    n = A.shape[1]
    mats = {}
    for name, m in (("B", B), ("C", C)):
        m = as_float(m, name, min_ndim=2, max_ndim=4)
        ok = {2: (dm, n), 3: (bt, n, n_t)}
        if m.ndim in ok and m.shape != ok[m.ndim]:
            raise ValueError(f"{name} must have shape (Dm, N) = {(dm, n)}, (Bt, N, L) = {(bt, n, n_t)} or "
                             f"(Bt, G, N, L); got {m.shape}")
        if m.ndim == 4 and (m.shape[0] != bt or m.shape[2:] != (n, n_t) or dm % m.shape[1]):
            raise ValueError(f"{name} of shape (Bt, G, N, L) must be ({bt}, G, {n}, {n_t}) with G dividing "
                             f"Dm={dm}; got {m.shape}")
        mats[name] = m
    opt = {}
    for name, arr, shape in (("D", D, (dm,)), ("delta_bias", delta_bias, (dm,)), ("z", z, u.shape)):
        if arr is not None:
            arr = as_float(arr, name)
            if arr.shape != shape:
                raise ValueError(f"{name} must have shape {shape}; got {arr.shape}")
        opt[name] = arr
    check_choice(discretization, "discretization", ("euler", "zoh"))
    check_choice(mode, "mode", ("chunked", "recurrent"))
    check_int(chunk_size, "chunk_size", minimum=1)
    dt = compute_dtype(u, delta, A, *mats.values(), *(a for a in opt.values() if a is not None))
    arrays = cast_all(dt, {"u": u, "delta": delta, "A": A, **mats,
                           **{k: v for k, v in opt.items() if v is not None}})
    return arrays


def _per_channel(m: np.ndarray, dm: int) -> np.ndarray:
    """B or C as (Bt|1, Dm, L|1, N) for broadcasting against (Bt, Dm, L, N)."""
    if m.ndim == 2:
        return m[None, :, None, :]
    if m.ndim == 3:
        return np.swapaxes(m, 1, 2)[:, None]
    return np.repeat(np.swapaxes(m, 2, 3), dm // m.shape[1], axis=1)


def _to_layout(g: np.ndarray, m: np.ndarray) -> np.ndarray:
    """Sum a (Bt, Dm, L, N) gradient back onto the layout of B or C."""
    if m.ndim == 2:
        return g.sum(axis=(0, 2))
    if m.ndim == 3:
        return np.swapaxes(g.sum(axis=1), 1, 2)
    bt, dm, n_t, n = g.shape
    groups = m.shape[1]
    return np.swapaxes(g.reshape(bt, groups, dm // groups, n_t, n).sum(axis=2), 2, 3)


def selective_scan_forward(u, delta, A, B, C, D=None, z=None, delta_bias=None, *,
                           delta_softplus: bool = False, discretization: str = "euler",
                           mode: str = "chunked", chunk_size: int = 64):
    r"""Selective scan $\mathrm{out} = (y)\,\mathrm{SiLU}(z)$, $y_t = C_th_t + Du_t$ (module docstring).

    Parameters
    ----------
    u, delta : arrays (Bt, Dm, L)
        Input sequence and the raw step sizes (before ``delta_bias`` and softplus).
    A : array (Dm, N)
        Real state matrix (diagonal per channel); Mamba uses $A = -e^{A_{\log}}$.
    B, C : arrays (Dm, N), (Bt, N, L) or (Bt, G, N, L)
        Time-invariant, input-dependent or grouped input/output projections.
    D : array (Dm,), optional
        Skip connection $D u$.
    z : array (Bt, Dm, L), optional
        Gate: the output is multiplied by $\mathrm{SiLU}(z)$.
    delta_bias : array (Dm,), optional
        Added to ``delta`` before the softplus.
    delta_softplus : bool
        Apply softplus to ``delta + delta_bias`` (upstream default False; Mamba layers use True).
    discretization : {"euler", "zoh"}
        $\bar B = \Delta B$ (upstream) or the exact ZOH $(e^{\Delta A}-1)A^{-1}B$.
    mode : {"chunked", "recurrent"}
        Parallel chunked scan or the step-by-step loop of ``selective_scan_ref``.
    chunk_size : int
        Steps per chunk in ``mode="chunked"``.

    Returns
    -------
    out, cache
        ``out (Bt, Dm, L)``; ``cache["h"]`` holds every state ``(Bt, Dm, L, N)``.
    """
    a = _validate(u, delta, A, B, C, D, z, delta_bias, discretization, mode, chunk_size)
    u, A = a["u"], a["A"]
    dm = u.shape[1]
    pre = a["delta"] + (a["delta_bias"][:, None] if "delta_bias" in a else 0.0)
    dlt = softplus(pre) if delta_softplus else pre
    x = dlt[..., None] * A[None, :, None, :]                           # Delta A  (Bt, Dm, L, N)
    if discretization == "euler":
        w, dphi = dlt[..., None], None
    else:
        phi, dphi = _phi(x)
        w = dlt[..., None] * phi
    bc, cc = _per_channel(a["B"], dm), _per_channel(a["C"], dm)
    bbar = w * bc * u[..., None]
    h = linear_scan(x, bbar, mode=mode, chunk_size=chunk_size)
    y = np.einsum("bdln,bdln->bdl", np.broadcast_to(cc, h.shape), h)
    if "D" in a:
        y = y + a["D"][:, None] * u
    out = y * silu(a["z"]) if "z" in a else y
    # y is kept only for dz; without a gate it is the returned array itself.
    cache = dict(a, pre=pre, dlt=dlt, x=x, w=w, dphi=dphi, h=h, y=y if "z" in a else None,
                 softplus=delta_softplus, disc=discretization, mode=mode, chunk=chunk_size,
                 out_shape=out.shape)
    return out, cache


def selective_scan_backward(dout, cache):
    r"""Gradients of :func:`selective_scan_forward` through time: ``u, delta, A, B, C`` and, when
    given, ``D``, ``z``, ``delta_bias`` (derivation in the module docstring)."""
    u, A, h, x, w, dlt = cache["u"], cache["A"], cache["h"], cache["x"], cache["w"], cache["dlt"]
    g = as_dout(dout, cache["out_shape"], u.dtype)
    dm = u.shape[1]
    grads = {}
    if "z" in cache:
        grads["z"] = g * cache["y"] * silu_grad(cache["z"])
        g = g * silu(cache["z"])
    cc, bc = _per_channel(cache["C"], dm), _per_channel(cache["B"], dm)
    grads["C"] = _to_layout(g[..., None] * h, cache["C"])
    dh = g[..., None] * cc
    # Reverse-time adjoint: lambda_t = dh_t + a_{t+1} lambda_{t+1}, as a forward scan on reversed time.
    x_next = np.concatenate([x[:, :, 1:], np.zeros_like(x[:, :, :1])], axis=2)
    lam = linear_scan(x_next[:, :, ::-1], dh[:, :, ::-1], mode=cache["mode"], chunk_size=cache["chunk"])[:, :, ::-1]
    h_prev = np.concatenate([np.zeros_like(h[:, :, :1]), h[:, :, :-1]], axis=2)
    dx = lam * np.exp(x) * h_prev                                        # dL/d(Delta A)
    bu = bc * u[..., None]
    dw = lam * bu
    grads["B"] = _to_layout(lam * w * u[..., None], cache["B"])
    du = np.einsum("bdln,bdln->bdl", lam * w, np.broadcast_to(bc, lam.shape))
    if "D" in cache:
        grads["D"] = np.sum(g * u, axis=(0, 2))
        du = du + g * cache["D"][:, None]
    grads["u"] = du
    ddlt = np.sum(dx * A[None, :, None, :], axis=-1)
    dA = np.sum(dx * dlt[..., None], axis=(0, 2))
    if cache["disc"] == "euler":
        ddlt = ddlt + dw.sum(axis=-1)
    else:
        ddlt = ddlt + np.sum(dw * np.exp(x), axis=-1)
        dA = dA + np.sum(dw * dlt[..., None] ** 2 * cache["dphi"], axis=(0, 2))
    grads["A"] = dA
    dpre = ddlt * sigmoid(cache["pre"]) if cache["softplus"] else ddlt
    grads["delta"] = dpre
    if "delta_bias" in cache:
        grads["delta_bias"] = dpre.sum(axis=(0, 2))
    return grads


def selective_scan(u, delta, A, B, C, D=None, z=None, delta_bias=None, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`selective_scan_forward`."""
    return selective_scan_forward(u, delta, A, B, C, D, z, delta_bias, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size, *, layout="variable", discretization="euler"):
    if size == "tiny":
        bt, dm, n_t, n, chunk = 2, 2, 3, 2, 2
    else:
        bt, dm, n_t, n, chunk = 2, 4, int(rng.integers(6, 10)), 3, 4
    shape_bc = {"invariant": (dm, n), "variable": (bt, n, n_t), "grouped": (bt, 2, n, n_t)}[layout]
    inputs = {
        "u": rng.standard_normal((bt, dm, n_t)),
        "delta": rng.standard_normal((bt, dm, n_t)) - 1.0,
        "A": -np.exp(0.5 * rng.standard_normal((dm, n))),
        "B": rng.standard_normal(shape_bc),
        "C": rng.standard_normal(shape_bc),
        "D": rng.standard_normal(dm),
        "z": rng.standard_normal((bt, dm, n_t)),
        "delta_bias": 0.3 * rng.standard_normal(dm),
    }
    return Sample(inputs=inputs, config={"delta_softplus": True, "discretization": discretization,
                                         "mode": "chunked", "chunk_size": chunk})


def _reference(u, delta, A, B, C, D=None, z=None, delta_bias=None, *, delta_softplus=False,
               discretization="euler", mode="chunked", chunk_size=64):
    # selective_scan_ref's loop, written out per time step with explicit per-channel B and C.
    dm = u.shape[1]
    dlt = delta + (0.0 if delta_bias is None else delta_bias[:, None])
    if delta_softplus:
        dlt = np.log1p(np.exp(dlt))
    bc, cc = _per_channel(B, dm), _per_channel(C, dm)
    state = np.zeros(u.shape[:2] + (A.shape[1],))
    ys = []
    for t in range(u.shape[2]):
        dA = dlt[:, :, t, None] * A
        w = dlt[:, :, t, None] if discretization == "euler" else np.expm1(dA) / A
        b_t = bc[:, :, min(t, bc.shape[2] - 1)]
        c_t = cc[:, :, min(t, cc.shape[2] - 1)]
        state = np.exp(dA) * state + w * b_t * u[:, :, t, None]
        ys.append(np.sum(state * c_t, axis=-1))
    y = np.stack(ys, axis=2)
    if D is not None:
        y = y + D[:, None] * u
    return y if z is None else y * z / (1.0 + np.exp(-z))


def _check_recurrent_equals_chunked(rng):
    # Forward and every gradient: the chunked form equals the loop to round-off, for every B/C
    # layout, both discretisations and chunk sizes that do and do not divide L.
    err = 0.0
    for layout in ("invariant", "variable", "grouped"):
        for disc in ("euler", "zoh"):
            s = _sample(rng, "small", layout=layout, discretization=disc)
            n_t = s.inputs["u"].shape[2]
            cfg = dict(s.config, mode="recurrent")
            ref, cr = selective_scan_forward(**s.inputs, **cfg)
            g = rng.standard_normal(ref.shape)
            gr = selective_scan_backward(g, cr)
            for chunk in (1, 3, n_t, n_t + 5):
                out, cc = selective_scan_forward(**s.inputs, **dict(cfg, mode="chunked", chunk_size=chunk))
                gc = selective_scan_backward(g, cc)
                err = max(err, float(np.abs(out - ref).max() / np.abs(ref).max()))
                err = max(err, max(float(np.abs(gc[k] - gr[k]).max() / max(np.abs(gr[k]).max(), 1e-300))
                                   for k in gr))
    assert err < 1e-12, f"chunked and recurrent scans differ by {err:.2e} (relative)"
    return err


def _check_lti_convolution(rng):
    # Input-independent parameters (time-invariant B, C; Delta constant in time): the scan is the
    # causal convolution y = K * u + D u with kernel K_k = sum_n C_n e^{k Delta A_n} Delta B_n.
    bt, dm, n_t, n = 2, 3, 9, 4
    u = rng.standard_normal((bt, dm, n_t))
    dlt = rng.uniform(0.1, 0.6, (bt, dm, 1)) * np.ones((1, 1, n_t))
    A = -np.exp(rng.standard_normal((dm, n)))
    B, C, D = rng.standard_normal((dm, n)), rng.standard_normal((dm, n)), rng.standard_normal(dm)
    y = selective_scan(u, dlt, A, B, C, D)
    k = np.arange(n_t)
    kern = np.einsum("dn,bdkn->bdk", C * B, dlt[:, :, :1, None] * np.exp(k[None, None, :, None]
                                                                        * dlt[:, :, :1, None] * A[None, :, None, :]))
    conv = np.stack([np.sum(kern[:, :, :t + 1][:, :, ::-1] * u[:, :, :t + 1], axis=2) for t in range(n_t)], axis=2)
    err = float(np.abs(y - conv - D[:, None] * u).max())
    assert err < 1e-12, f"LTI scan differs from the convolution form by {err:.2e}"
    return err


def _check_zoh_exact_for_held_input(rng):
    # ZOH is exact for an input held constant over each step: with u = 1, B = 1 the scan samples
    # the ODE solution h(t) = (e^{tA} - 1)/A at t = sum of the steps; Euler-B does not.
    dm, n, n_t = 2, 3, 7
    A = -np.exp(rng.standard_normal((dm, n)))
    dlt = rng.uniform(0.05, 0.4, (1, dm, n_t))
    u = np.ones((1, dm, n_t))
    ones = np.ones((dm, n))
    t_end = dlt.sum(axis=2)[0]
    exact = np.sum(np.expm1(t_end[:, None] * A) / A, axis=-1)
    zoh = selective_scan(u, dlt, A, ones, ones, discretization="zoh")[0, :, -1]
    euler = selective_scan(u, dlt, A, ones, ones, discretization="euler")[0, :, -1]
    err = float(np.abs(zoh - exact).max())
    assert err < 1e-12, f"ZOH scan misses the exact held-input solution by {err:.2e}"
    assert np.abs(euler - exact).max() > 1e-4, "Euler-B unexpectedly exact"
    return err


register(
    Mechanism(
        slug="selective_scan", family="3-operator", tier="primitive",
        title="Mamba selective scan (S6): recurrent and chunked forms, backward through time",
        paper="Gu & Dao, Mamba: Linear-Time Sequence Modeling with Selective State Spaces, COLM 2024, "
              "arXiv 2312.00752",
        official_code="state-spaces/mamba",
        forward=selective_scan_forward, backward=selective_scan_backward, sample=_sample,
        reference=_reference, batched=False,
        docs="operators/kernel-integrals-and-scans.md#selective-scan",
        checks={"recurrent_equals_chunked": _check_recurrent_equals_chunked,
                "lti_convolution": _check_lti_convolution,
                "zoh_exact_for_held_input": _check_zoh_exact_for_held_input},
    ),
)
