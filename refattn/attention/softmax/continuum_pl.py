r"""Continuum Attention over a piecewise-linear key/value curve (exact exponential moments).

Reconstruction from the catalogue's description of "Continuum Attention (CA)" (2025/26): the
sequence of tokens is read as a continuous memory curve. Along the segment between tokens $j$ and
$j+1$ the score and the value are interpolated linearly, $s(t) = s_j + t\,\delta_j$,
$v(t) = (1-t)v_j + t\,v_{j+1}$ ($\delta_j = s_{j+1} - s_j$, $t\in[0,1]$), and the curve is extended
by half a token with constant score and value past its first and last token. The output of query
$i$ is the normalised integral of $e^{s(t)}v(t)$ over the whole curve:

$$y_i = \frac{\int e^{s_i(t)}v(t)\,dt}{\int e^{s_i(t)}\,dt} = \frac{\sum_j w_{ij}v_j}{\sum_j w_{ij}},\qquad
s_{ij} = \sigma\,q_i\cdot k_j .$$

The segment integrals have closed forms in $F(x) = (e^x - 1 - x)/x^2 = \sum_{n\ge0}x^n/(n+2)!$
($F(0) = \tfrac12$): $\int_0^1(1-t)e^{s_j+t\delta_j}dt = e^{s_j}F(\delta_j)$ and
$\int_0^1 t\,e^{s_j+t\delta_j}dt = e^{s_{j+1}}F(-\delta_j)$, so token $j$ of a curve over keys
$1..L_i$ gets the weight

$$w_{ij} = e^{s_{ij}}\Big[F(s_{i,j+1}-s_{ij})\,\mathbb 1\{j<L_i\} + F(s_{i,j-1}-s_{ij})\,\mathbb 1\{j>1\}
+ \tfrac12\mathbb 1\{j=1\} + \tfrac12\mathbb 1\{j=L_i\}\Big],$$

with $L_i = i$ under the causal mask (the paper's setting, default) and $L_i = M$ otherwise. When
neighbouring scores are equal the bracket is 1 and $w$ is exactly the softmax numerator.

Backward
--------
With $Z_i = \sum_j w_{ij}$ and upstream $g_i$: $dv_j = \sum_i (w_{ij}/Z_i)\,g_i$ and
$a_{ij} = \partial L/\partial w_{ij} = g_i\cdot(v_j - y_i)/Z_i$. Writing $e_{ij} = e^{s_{ij}}$,
$r_{ij} = a_{ij}e_{ij}F'(s_{i,j+1}-s_{ij})\mathbb 1\{j<L_i\}$ and
$l_{ij} = a_{ij}e_{ij}F'(s_{i,j-1}-s_{ij})\mathbb 1\{j>1\}$,

$$\frac{\partial L}{\partial s_{ij}} = a_{ij}w_{ij} - r_{ij} - l_{ij} + r_{i,j-1} + l_{i,j+1},$$

(the weight of token $j$ depends on its own score and on its two neighbours' scores), and
$dq_i = \sigma\sum_j ds_{ij}k_j$, $dk_j = \sigma\sum_i ds_{ij}q_i$. $F'(x) = (e^x(x-2) + x + 2)/x^3
= \sum_{n\ge1}n\,x^{n-1}/(n+2)!$ (the difference of the first and second exponential moments of
the segment). Both $F$ and $F'$ switch to their Taylor series for $|x| < 1/2$ (the closed forms
cancel catastrophically near 0). Scores are shifted by the row maximum of the valid keys, which
cancels in the ratio.

Sources and reconstruction
--------------------------
Paper: "Continuum Attention (CA)", 2025/26 (catalogue seed 2-48); neither the paper's text nor
code could be retrieved here, so the closed form is the catalogue's reconstruction, re-derived
above from the integral it describes, and checked against Gauss-Legendre quadrature of that
integral (the registry reference). Keywords: ``is_causal`` (True: the paper's causal attention;
False: one curve over all $M$ keys), ``scale`` $\sigma$ (default $1/\sqrt d$). Reconstruction: the
half-token constant extension at both ends of the curve, and the linear interpolation of values
(the catalogue's "piecewise-linear memory curve through the keys/values").
"""

from __future__ import annotations

import math

import numpy as np

from ..._checks import as_dout, as_float, check_positive, compute_dtype
from ...registry import Mechanism, Sample, register

__all__ = ["exp_moment_f", "exp_moment_f_prime", "continuum_pl_attention_forward",
           "continuum_pl_attention_backward", "continuum_pl_attention"]

_TAYLOR = 0.5
_NTERMS = 18
_INV_FACT = [1.0]
for _n in range(1, _NTERMS + 4):
    _INV_FACT.append(_INV_FACT[-1] / _n)


def exp_moment_f(x):
    r"""$F(x) = (e^x - 1 - x)/x^2$, $F(0) = 1/2$ (Taylor series for $|x| < 1/2$)."""
    x = np.asarray(x)
    small = np.abs(x) < _TAYLOR
    xs = np.where(small, x, 0.0)
    ser = np.zeros_like(xs)
    for n in range(_NTERMS, -1, -1):
        ser = ser * xs + _INV_FACT[n + 2]
    xl = np.where(small, 1.0, x)
    return np.where(small, ser, (np.expm1(xl) - xl) / (xl * xl))


def exp_moment_f_prime(x):
    r"""$F'(x) = (e^x(x-2) + x + 2)/x^3$, $F'(0) = 1/6$ (Taylor series for $|x| < 1/2$)."""
    x = np.asarray(x)
    small = np.abs(x) < _TAYLOR
    xs = np.where(small, x, 0.0)
    ser = np.zeros_like(xs)
    for n in range(_NTERMS, 0, -1):
        ser = ser * xs + n * _INV_FACT[n + 2]
    xl = np.where(small, 1.0, x)
    return np.where(small, ser, (np.exp(xl) * (xl - 2.0) + xl + 2.0) / xl ** 3)


def _exp_times_f(s, d):
    r"""$e^{s}F(d)$ without overflow where $s \le 0$ and $s + d \le 0$ (max-shifted logits of two
    neighbouring keys): $(e^{s+d} - e^{s}(1+d))/d^2$ for $|d| \ge 1/2$, the series otherwise. The
    plain product overflows in $e^{d}$ once a neighbour's logit exceeds the key's by ~710."""
    small = np.abs(d) < _TAYLOR
    dl = np.where(small, 1.0, d)
    big = (np.exp(s + dl) - np.exp(s) * (1.0 + dl)) / (dl * dl)
    return np.where(small, np.exp(s) * exp_moment_f(np.where(small, d, 0.0)), big)


def _exp_times_f_prime(s, d):
    r"""$e^{s}F'(d) = (e^{s+d}(d-2) + e^{s}(d+2))/d^3$, stable as :func:`_exp_times_f`."""
    small = np.abs(d) < _TAYLOR
    dl = np.where(small, 1.0, d)
    big = (np.exp(s + dl) * (dl - 2.0) + np.exp(s) * (dl + 2.0)) / dl ** 3
    return np.where(small, np.exp(s) * exp_moment_f_prime(np.where(small, d, 0.0)), big)


def _validate(q, k, v):
    q = as_float(q, "q", min_ndim=2)
    k = as_float(k, "k", min_ndim=2)
    v = as_float(v, "v", min_ndim=2)
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must share the feature axis; got q {q.shape}, k {k.shape}")
    if k.shape[:-1] != v.shape[:-1]:
        raise ValueError(f"k and v must share every axis but the last; got k {k.shape}, v {v.shape}")
    try:
        np.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    except ValueError:
        raise ValueError(f"the leading axes of q {q.shape} and k {k.shape} must broadcast") from None
    return q, k, v


def continuum_pl_attention_forward(q, k, v, *, is_causal: bool = True, scale=None):
    r"""Continuum attention over the piecewise-linear key/value curve (module docstring).

    Parameters
    ----------
    q : array (..., N, d)
    k : array (..., M, d)
    v : array (..., M, dv)
    is_causal : bool
        True (default, the paper's setting): query $i$ reads the curve through keys $1..i$
        (top-left aligned; needs ``N <= M``). False: every query reads the curve through all keys.
    scale : float > 0, optional
        $\sigma$; default $1/\sqrt d$.

    Returns
    -------
    out, cache
        ``out (..., N, dv)``.
    """
    q, k, v = _validate(q, k, v)
    if not isinstance(is_causal, (bool, np.bool_)):
        raise TypeError(f"is_causal must be a bool; got {type(is_causal).__name__}")
    n, m = q.shape[-2], k.shape[-2]
    if is_causal and n > m:
        raise ValueError(f"is_causal=True needs N <= M (query i reads keys 1..i); got N={n}, M={m}")
    sc = float(1.0 / np.sqrt(q.shape[-1])) if scale is None else float(check_positive(scale, "scale"))
    dt = compute_dtype(q, k, v)
    q, k, v = (a.astype(dt, copy=False) for a in (q, k, v))
    j = np.arange(m)
    last = np.arange(n)[:, None] if is_causal else np.full((n, 1), m - 1)
    valid = j[None, :] <= last                                  # (N, M)
    has_r, has_l = j[None, :] < last, (j[None, :] > 0) & valid
    ends = 0.5 * (j[None, :] == 0) + 0.5 * (j[None, :] == last)
    s = sc * (q @ np.swapaxes(k, -1, -2))
    s = s - np.max(np.where(valid, s, -np.inf), axis=-1, keepdims=True)
    s = np.where(valid, s, 0.0)
    dr = np.where(has_r, np.concatenate([s[..., 1:], s[..., -1:]], axis=-1) - s, 0.0)
    dl = np.where(has_l, np.concatenate([s[..., :1], s[..., :-1]], axis=-1) - s, 0.0)
    e = np.where(valid, np.exp(s), 0.0)
    # w_j = e^{s_j} (F(dr_j) [j has a right neighbour] + F(dl_j) [left] + ends_j), each product taken
    # in the overflow-free form (a neighbour's logit may exceed s_j by far more than 710)
    w = (np.where(has_r, _exp_times_f(s, dr), 0.0) + np.where(has_l, _exp_times_f(s, dl), 0.0)
         + e * ends).astype(dt, copy=False)
    z = w.sum(axis=-1, keepdims=True)
    out = (w @ v) / z
    cache = {"q": q, "k": k, "v": v, "w": w, "z": z, "y": out.copy(),
             "s": s, "dr": dr, "dl": dl, "has_r": has_r, "has_l": has_l, "scale": sc}
    return out, cache


def continuum_pl_attention_backward(dout, cache):
    r"""Gradient of :func:`continuum_pl_attention_forward`: ``{"q", "k", "v"}`` (module docstring)."""
    q, k, v, w, z, y = (cache[n] for n in ("q", "k", "v", "w", "z", "y"))
    dt = w.dtype
    g = as_dout(dout, y.shape, dt)
    a = (g @ np.swapaxes(v, -1, -2) - np.sum(g * y, axis=-1, keepdims=True)) / z
    s = cache["s"]
    r = np.where(cache["has_r"], a * _exp_times_f_prime(s, cache["dr"]), 0.0)
    ll = np.where(cache["has_l"], a * _exp_times_f_prime(s, cache["dl"]), 0.0)
    zero = np.zeros_like(r[..., :1])
    ds = (a * w - r - ll + np.concatenate([zero, r[..., :-1]], axis=-1)
          + np.concatenate([ll[..., 1:], zero], axis=-1)).astype(dt, copy=False)
    sc = cache["scale"]
    dq = sc * (ds @ k)
    dk = sc * (np.swapaxes(ds, -1, -2) @ q)
    dv = np.swapaxes(w / z, -1, -2) @ g
    return {"q": _sum_to(dq, q.shape), "k": _sum_to(dk, k.shape), "v": _sum_to(dv, v.shape)}


def continuum_pl_attention(q, k, v, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`continuum_pl_attention_forward`."""
    return continuum_pl_attention_forward(q, k, v, **config)[0]


def _sum_to(x, shape):
    lead = x.ndim - len(shape)
    x = x.sum(axis=tuple(range(lead))) if lead else x
    axes = tuple(i for i, (a, b) in enumerate(zip(x.shape, shape)) if b == 1 and a != 1)
    return x.sum(axis=axes, keepdims=True) if axes else x


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size):
    if size == "tiny":
        shape, n, d = (2,), 4, 2
    else:
        shape, n, d = (2, 2), int(rng.integers(5, 9)), 4
    causal = bool(rng.random() < 0.7)
    m = n if causal else n + int(rng.integers(0, 2))
    return Sample(inputs={"q": rng.standard_normal(shape + (n, d)), "k": rng.standard_normal(shape + (m, d)),
                          "v": rng.standard_normal(shape + (m, d))}, params=None, config={"is_causal": causal})


def _reference(q, k, v, *, is_causal=True, scale=None):
    # the integral itself: 24-point Gauss-Legendre on every unit segment of the piecewise-linear
    # curve, plus the two constant half-token ends; no closed form involved
    tg, wg = np.polynomial.legendre.leggauss(24)
    tg, wg = 0.5 * (tg + 1.0), 0.5 * wg
    sc = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    lead = np.broadcast_shapes(q.shape[:-2], k.shape[:-2])
    qa = np.broadcast_to(q, lead + q.shape[-2:])
    ka, va = np.broadcast_to(k, lead + k.shape[-2:]), np.broadcast_to(v, lead + v.shape[-2:])
    out = np.zeros(lead + (q.shape[-2], v.shape[-1]))
    for idx in np.ndindex(lead):
        qi, ki, vi = qa[idx], ka[idx], va[idx]
        for i in range(qi.shape[0]):
            last = i if is_causal else ki.shape[0] - 1
            s = sc * ki[:last + 1] @ qi[i]
            mx = s.max()
            num = 0.5 * (np.exp(s[0] - mx) * vi[0] + np.exp(s[last] - mx) * vi[last])
            den = 0.5 * (np.exp(s[0] - mx) + np.exp(s[last] - mx))
            for j in range(last):
                st = s[j] + tg * (s[j + 1] - s[j]) - mx
                vt = (1 - tg)[:, None] * vi[j] + tg[:, None] * vi[j + 1]
                num = num + (wg * np.exp(st)) @ vt
                den = den + wg @ np.exp(st)
            out[idx + (i,)] = num / den
    return out


def _check_softmax_when_scores_flat(rng):
    # keys that give every query one score per row (k_j all equal) -> the plain average, and
    # q = 0 likewise; a single key -> that key's value
    q = rng.standard_normal((2, 5, 3))
    k = np.repeat(rng.standard_normal((2, 1, 3)), 5, axis=1)
    v = rng.standard_normal((2, 5, 4))
    y = continuum_pl_attention(q, k, v)
    mean = np.cumsum(v, axis=1) / np.arange(1, 6)[None, :, None]
    err = float(np.abs(y - mean).max())
    y0 = continuum_pl_attention(np.zeros_like(q), rng.standard_normal(k.shape), v, is_causal=False)
    err = max(err, float(np.abs(y0 - v.mean(axis=1, keepdims=True)).max()))
    assert err < 1e-12, err
    return err


def _check_taylor_branch_continuous(rng):
    # F and F' from the series and from the closed form agree at the switch point |x| = 1/2
    err = 0.0
    for x in (0.5, -0.5, 0.4999999, -0.4999999):
        xl = np.float64(x)
        f_direct = (np.expm1(xl) - xl) / xl ** 2
        fp_direct = (np.exp(xl) * (xl - 2) + xl + 2) / xl ** 3
        ser = sum(xl ** n / math.factorial(n + 2) for n in range(30))
        serp = sum(n * xl ** (n - 1) / math.factorial(n + 2) for n in range(1, 30))
        err = max(err, abs(exp_moment_f(xl) - f_direct), abs(exp_moment_f(xl) - ser),
                  abs(exp_moment_f_prime(xl) - fp_direct), abs(exp_moment_f_prime(xl) - serp))
    assert err < 1e-12 and abs(exp_moment_f(0.0) - 0.5) < 1e-16 and abs(exp_moment_f_prime(0.0) - 1 / 6) < 1e-16, err
    return float(err)


def _check_causal_no_future_leak(rng):
    q, k, v = (rng.standard_normal((2, 6, 3)) for _ in range(3))
    y = continuum_pl_attention(q, k, v)
    k2, v2 = k.copy(), v.copy()
    k2[:, 4:] += 1.0
    v2[:, 4:] -= 2.0
    err = float(np.abs(continuum_pl_attention(q, k2, v2)[:, :4] - y[:, :4]).max())
    assert err < 1e-12, err
    return err


def _check_convex_combination(rng):
    # weights are positive (F > 0 everywhere), so each output lies in the values' convex hull
    q, k = rng.standard_normal((2, 6, 3)) * 3, rng.standard_normal((2, 6, 3)) * 3
    _, c = continuum_pl_attention_forward(q, k, rng.standard_normal((2, 6, 2)), is_causal=False)
    assert np.all(c["w"] > 0)
    return 0.0


register(
    Mechanism(
        slug="continuum_attention_piecewise_linear", family="1-softmax", tier="T3",
        title="Continuum Attention over a piecewise-linear key/value curve",
        paper="Continuum Attention (CA), 2025/26 (catalogue seed 2-48; closed form reconstructed)",
        forward=continuum_pl_attention_forward, backward=continuum_pl_attention_backward, sample=_sample,
        reference=_reference, docs="softmax/t3-attention.md#continuum-attention-over-a-piecewise-linear-curve",
        checks={"softmax_when_scores_flat": _check_softmax_when_scores_flat,
                "taylor_branch_continuous": _check_taylor_branch_continuous,
                "causal_no_future_leak": _check_causal_no_future_leak,
                "convex_combination": _check_convex_combination},
    ),
)
