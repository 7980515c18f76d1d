r"""B-cos transform: a unit-norm linear map rescaled by the input-weight cosine to the power B-1.

Böhle, Fritz, Schiele, "B-cos Networks: Alignment is All We Need for Interpretability", CVPR
2022, arXiv 2205.10268. Upstream: moboehle/B-cos ``modules/bcosconv2d.py`` (``NormedConv2d``,
``BcosConv2d``) @ 19c7ea4dce9a4d049533b0955236b85d5f336b12.

Forward
-------
For an input vector $x\in\mathbb R^D$ (a token, or an unfolded convolution patch: a
$k\times k$ ``BcosConv2d`` is this map on ``F.unfold`` patches, $D = C k^2$ in ``(C, kh, kw)``
order) and weight columns $w_j$ (``linear.weight``, ``(D, U\cdot m)``: PyTorch's conv weight
``(U m, C, kh, kw)`` reshaped to ``(U m, D)`` and transposed):

$$\hat w_j = w_j/\|w_j\|,\qquad l_j = \hat w_j^\top x,\qquad
l_u = \max_{i<m} l_{u m + i}\ \ (\text{MaxOut over } m = \texttt{max\_out} \text{ consecutive units}),$$
$$n = \sqrt{\|x\|^2 + \epsilon},\qquad c_u = l_u/n,\qquad
y_u = l_u\,(|c_u| + \epsilon_c)^{B-1}/s .$$

$|c_u|$ is the cosine between $x$ and the selected weight, so $y_u = \|x\|\,|c_u|^{B}\,
\mathrm{sgn}(c_u)/s$ (for $\epsilon = \epsilon_c = 0$): the output is large only where input and
weight align. $s$ = ``scale`` (upstream default $\sqrt D/100$: ``ks * sqrt(C) / scale_fact``).

Backward
--------
With $q = |c| + \epsilon_c$, $g = \partial L/\partial y$ and using $l\,\mathrm{sgn}(c)/n = |c|$:

$$\frac{\partial y}{\partial l} = \frac{q^{B-1} + (B-1)q^{B-2}|c|}{s},\quad
\frac{\partial y}{\partial n} = -\frac{(B-1)q^{B-2}|c|\,c}{s},\quad
\frac{\partial y}{\partial B} = y\ln q,$$

$dl = g\,\partial_l y$ is routed to the selected unit of each MaxOut group (the selection is held
fixed; samplers avoid ties), $dx = \sum_j dl_j\hat w_j + (\sum_u g_u\partial_n y_u)\,x/n$,
$d\hat w_j = \sum x\,dl_j$ and, through the normalisation, $dw_j = (d\hat w_j - \hat w_j(\hat
w_j^\top d\hat w_j))/\|w_j\|$. For $B < 2$ the map is not differentiable where $c = 0$ (samplers
keep $|c|$ away from 0).

Conventions
-----------
* ``b``: the exponent $B$ (upstream ``b=2``), a fixed keyword; or a learnable ``params["b"]``
  of shape ``(1,)``, which then gets a gradient (the paper treats $B$ as a hyperparameter).
* ``cos_eps`` $\epsilon_c$: upstream's ``fwd_b`` adds ``1e-6`` to $|c|$, its $B = 2$ fast path
  ``fwd_2`` does not; ``None`` reproduces that (0 for a fixed $B = 2$, ``1e-6`` otherwise,
  including a learnable $B$, so the function stays smooth in $B$).
* ``eps`` $\epsilon$ = ``1e-6`` inside the input norm (upstream's stabiliser); ``max_out`` = 2.
* The explanation mode of upstream (``explanation_mode``, detaching the dynamic factor) is
  `bcos_dynamic_weights`: the input-dependent linear map $W(x)$ with $y = W(x)^\top x$ exactly,
  whose columns times $x$ are the paper's contribution maps.

Agreement with upstream
-----------------------
``BcosConv2d`` run in float64 on CPU, for $B\in\{2, 1.5, 2.5\}$, ``max_out`` $\in\{1, 2\}$ and
kernel sizes 1 and 3 (padding 1, compared on ``F.unfold`` patches): output and the gradients of the
input and the weight agree to $1.1\times10^{-15}$ relative. With upstream's ``b`` replaced by a
tensor that requires grad (its ``fwd_b`` path, B = 2.3), the gradient of $B$ agrees to rounding
($<10^{-15}$ relative).
"""

from __future__ import annotations

import numpy as np

from .._checks import (
    as_dout,
    as_float,
    cast_all,
    check_int,
    check_params,
    check_positive,
    check_weight_in,
    compute_dtype,
)
from ..registry import Mechanism, Sample, register

__all__ = ["bcos_forward", "bcos_backward", "bcos", "bcos_dynamic_weights"]


def _resolve(x, params, b, max_out, scale, scale_fact, eps, cos_eps):
    x = as_float(x, "x", min_ndim=1)
    max_out = check_int(max_out, "max_out", minimum=1)
    eps = check_positive(eps, "eps", allow_zero=True)
    scale_fact = check_positive(scale_fact, "scale_fact")
    scale = check_positive(scale, "scale", allow_none=True)
    if not isinstance(params, dict):
        raise TypeError(f"params for bcos must be a dict with 'linear.weight'; got {type(params).__name__}")
    w0 = params.get("linear.weight")
    if w0 is None:
        raise ValueError(f"params is missing key 'linear.weight' (expected shape ({x.shape[-1]}, units * max_out))")
    w0 = as_float(w0, "linear.weight")
    check_weight_in(params, "linear.weight", x.shape[-1], input_name="x")  # units * max_out is read off axis 1
    if w0.ndim != 2 or w0.shape[1] % max_out:
        raise ValueError(f"linear.weight must have shape ({x.shape[-1]}, units * max_out={max_out}); got {w0.shape}")
    spec = {"linear.weight": (x.shape[-1], w0.shape[1]), "b": (1,)}
    p = check_params(params, spec, optional=("b",), where="bcos")
    learn_b = "b" in p
    if learn_b and b is not None:
        raise ValueError("b is given both as the keyword b and as params['b']; pass one (params['b'] is learnable)")
    b_val = None if learn_b else check_positive(2.0 if b is None else b, "b")
    if cos_eps is None:
        cos_eps = 0.0 if (not learn_b and b_val == 2.0) else 1e-6
    cos_eps = check_positive(cos_eps, "cos_eps", allow_zero=True)
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    s = float(np.sqrt(x.shape[-1]) / scale_fact) if scale is None else scale
    return x, p, (p["b"][0] if learn_b else b_val), learn_b, max_out, s, eps, cos_eps


def bcos_forward(x, params, *, b=None, max_out: int = 2, scale=None, scale_fact: float = 100.0,
                 eps: float = 1e-6, cos_eps=None):
    r"""B-cos transform over the last axis of ``x`` (module docstring).

    Parameters
    ----------
    x : array (..., D)
        Input vectors (tokens, or unfolded conv patches in ``(C, kh, kw)`` order).
    params : dict
        ``"linear.weight" (D, U * max_out)`` (upstream ``linear.weight`` reshaped to
        ``(U*max_out, D)`` and transposed; need not be normalised) and optional learnable
        ``"b" (1,)``.
    b : float, optional
        Fixed exponent $B$ (default 2); must be None when ``params`` holds ``"b"``.
    max_out : int
        MaxOut group size $m$ (2 upstream; 1 disables MaxOut).
    scale, scale_fact : float
        Output divisor $s$; None gives upstream's $\sqrt D$ / ``scale_fact``.
    eps, cos_eps : float
        Stabilisers of the input norm and of $|c|$ (``cos_eps=None``: upstream's rule, see the
        module docstring).

    Returns
    -------
    y, cache
        ``y`` of shape ``(..., U)``.
    """
    x, p, bv, learn_b, m, s, eps, ce = _resolve(x, params, b, max_out, scale, scale_fact, eps, cos_eps)
    w = p["linear.weight"]
    wn = np.sqrt(np.sum(w * w, axis=0))
    what = w / wn
    lall = x @ what
    grouped = lall.reshape(lall.shape[:-1] + (lall.shape[-1] // m, m))
    sel = np.argmax(grouped, axis=-1)
    l = np.take_along_axis(grouped, sel[..., None], axis=-1)[..., 0]
    n = np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)
    c = l / n
    q = np.abs(c) + ce
    f = q ** (bv - 1.0)
    y = l * f / s
    cache = {"x": x, "w": w, "wn": wn, "what": what, "sel": sel, "l": l, "n": n, "c": c, "q": q, "f": f,
             "y": y.copy(), "b": bv, "learn_b": learn_b, "m": m, "s": s}
    return y, cache


def bcos_backward(dout, cache):
    r"""Gradients of `bcos_forward` for ``x``, ``linear.weight`` (and a learnable ``b``)."""
    x, what, sel, c, q, f, n = (cache[k] for k in ("x", "what", "sel", "c", "q", "f", "n"))
    bv, m, s = cache["b"], cache["m"], cache["s"]
    g = as_dout(dout, cache["y"].shape, x.dtype)
    ac = np.abs(c)
    qb2 = q ** (bv - 2.0) if bv != 2.0 else np.ones_like(q)
    dl = g * (f + (bv - 1.0) * qb2 * ac) / s
    dn = np.sum(g * (-(bv - 1.0) * qb2 * ac * c / s), axis=-1, keepdims=True)
    dl_all = np.zeros(dl.shape + (m,), dtype=x.dtype)
    np.put_along_axis(dl_all, sel[..., None], dl[..., None], axis=-1)
    dl_all = dl_all.reshape(dl.shape[:-1] + (dl.shape[-1] * m,))
    grads = {"x": dl_all @ what.T + dn * x / n}
    dwhat = x.reshape(-1, x.shape[-1]).T @ dl_all.reshape(-1, dl_all.shape[-1])
    grads["linear.weight"] = (dwhat - what * np.sum(what * dwhat, axis=0)) / cache["wn"]
    if cache["learn_b"]:
        grads["b"] = np.sum(g * cache["y"] * np.log(q), dtype=x.dtype).reshape(1)
    return grads


def bcos(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of `bcos_forward`."""
    return bcos_forward(x, params, **config)[0]


def bcos_dynamic_weights(x, params, **config) -> np.ndarray:
    r"""The input-dependent linear map of the B-cos transform: ``W (..., D, U)`` with
    $y_u = \sum_d W_{du}\,x_d$ exactly, $W_{:,u} = \hat w_{j(u)}\,(|c_u|+\epsilon_c)^{B-1}/s$.

    This is what upstream's ``explanation_mode`` differentiates (the dynamic factor detached);
    ``x[..., :, None] * W`` are the per-input contributions of the paper's explanations.
    Forward only (same arguments as `bcos_forward`).
    """
    _, cache = bcos_forward(x, params, **config)
    what, sel, f, s = cache["what"], cache["sel"], cache["f"], cache["s"]
    units = sel.shape[-1]
    cols = np.arange(units) * cache["m"] + sel  # (..., U) indices into the columns of what
    return np.moveaxis(what[:, cols], 0, -2) * (f / s)[..., None, :]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _draw(rng, shape, d, units, m):
    # Inputs whose MaxOut groups have no near-ties and whose cosines stay away from 0 (B < 2 has a
    # kink there): redraw until the gaps exceed 1e-3 (FD steps are 1e-6).
    while True:
        x = rng.standard_normal(shape + (d,))
        w = rng.standard_normal((d, units * m))
        lall = (x @ (w / np.linalg.norm(w, axis=0))).reshape(shape + (units, m))
        srt = np.sort(lall, axis=-1)
        gap = np.inf if m == 1 else float((srt[..., -1] - srt[..., -2]).min())
        cos = np.abs(srt[..., -1]) / np.linalg.norm(x, axis=-1, keepdims=True)
        if gap > 1e-3 and float(cos.min()) > 1e-2:
            return x, w


def _sample(rng, size):
    m = int(rng.integers(1, 3))
    if size == "tiny":
        shape, d, units = (2, 2), 3, 2
    else:
        shape, d, units = (2, 5), 6, 4
    x, w = _draw(rng, shape, d, units, m)
    params = {"linear.weight": w}
    cfg = {"max_out": m}
    if rng.random() < 0.5:
        params["b"] = np.array([1.5 + rng.random()])
    return Sample(inputs={"x": x}, params=params, config=cfg)


def _reference(x, params, b=None, max_out=2, scale=None, scale_fact=100.0, eps=1e-6, cos_eps=None):
    # Upstream's two code paths written out per unit: fwd_2 for a fixed B = 2, fwd_b otherwise.
    bv = params["b"][0] if "b" in params else (2.0 if b is None else b)
    w = params["linear.weight"]
    out = np.einsum("...d,dj->...j", x, w / np.linalg.norm(w, axis=0))
    out = out.reshape(out.shape[:-1] + (-1, max_out)).max(axis=-1)
    norm = np.sqrt((x**2).sum(-1, keepdims=True) + eps)
    s = np.sqrt(x.shape[-1]) / scale_fact if scale is None else scale
    if "b" not in params and bv == 2.0 and cos_eps is None:
        return out * np.abs(out) / (norm * s)
    ce = 1e-6 if cos_eps is None else cos_eps
    return out * (np.abs(out / norm) + ce) ** (bv - 1) / s


def _check_dynamic_linear(rng):
    # y = W(x)^T x exactly (the explanation map), for a fixed and a learnable B.
    x, w = _draw(rng, (2, 3), 5, 3, 2)
    err = 0.0
    for p in ({"linear.weight": w}, {"linear.weight": w, "b": np.array([2.5])}):
        y = bcos(x, p)
        wx = bcos_dynamic_weights(x, p)
        err = max(err, float(np.abs(np.einsum("...d,...du->...u", x, wx) - y).max()))
    assert err < 1e-13, f"B-cos output differs from its dynamic linear form by {err}"
    return err


def _check_b1_is_normed_linear(rng):
    # B = 1 is the (MaxOut of the) unit-norm linear layer divided by the scale.
    x, w = _draw(rng, (2, 4), 6, 3, 1)
    y = bcos(x, {"linear.weight": w}, b=1.0, max_out=1, scale=1.0)
    err = float(np.abs(y - x @ (w / np.linalg.norm(w, axis=0))).max())
    assert err < 1e-14, f"B = 1 differs from the normalised linear layer by {err}"
    return err


def _check_alignment_bound(rng):
    # |y_u| <= ||x|| / s for every B >= 1 (|c| <= 1), with equality when x is parallel to w_u.
    x, w = _draw(rng, (2, 6), 4, 3, 1)
    x = x.copy()
    x[0, 0] = 3.0 * w[:, 0]
    err = 0.0
    for b in (1.0, 2.0, 3.0):
        y = bcos(x, {"linear.weight": w}, b=b, max_out=1, scale=1.0, eps=0.0, cos_eps=0.0)
        nx = np.linalg.norm(x, axis=-1)
        assert np.all(np.abs(y) <= nx[..., None] * (1 + 1e-12)), f"B={b}: |y| exceeds ||x||"
        err = max(err, abs(float(y[0, 0, 0]) - float(nx[0, 0])) / float(nx[0, 0]))
    assert err < 1e-14, f"aligned input does not reach ||x||: {err}"
    return err


def _check_maxout_selection(rng):
    # The selected unit of each MaxOut group is the brute-force argmax of the normalised responses.
    x, w = _draw(rng, (2, 5), 4, 3, 2)
    _, cache = bcos_forward(x, {"linear.weight": w}, max_out=2)
    resp = x @ (w / np.linalg.norm(w, axis=0))
    for idx in np.ndindex(*x.shape[:-1]):
        for u in range(3):
            pair = resp[idx][2 * u:2 * u + 2]
            assert cache["sel"][idx][u] == int(pair[1] > pair[0]), (idx, u)
    return 0.0


register(
    Mechanism(
        slug="bcos_transform", family="5-building-blocks", tier="T2",
        title="B-cos transform: unit-norm linear map times |cos(x, w)|^(B-1), MaxOut, learnable or fixed B",
        paper="Boehle, Fritz, Schiele, B-cos Networks: Alignment is All We Need for Interpretability, CVPR 2022, "
              "arXiv 2205.10268",
        forward=bcos_forward, backward=bcos_backward, sample=_sample, reference=_reference,
        docs="blocks/norms-activations-init.md#b-cos-transform",
        checks={"dynamic_linear": _check_dynamic_linear, "b1_is_normed_linear": _check_b1_is_normed_linear,
                "alignment_bound": _check_alignment_bound, "maxout_selection": _check_maxout_selection},
    ),
)
