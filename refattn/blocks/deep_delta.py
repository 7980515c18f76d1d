r"""Deep Delta Learning residual (DDL) and the depth-wise residual attention read (ShortSWA over depth).

The catalogue entry ``depth_attention_delta_residual`` comes from the "Transformer²" position
paper on residual-stream duality (seed 3-3; its abstract is the only text the catalogue holds):
fixing a token position, a causal depth-wise residual attention read is causal short
sliding-window attention (ShortSWA) over the layer index, and to change the shortcut itself the
paper recommends Deep Delta Learning. Both are given here.

Deep Delta Learning: Zhang, Liu, Wang, Gu, "Deep Delta Learning", arXiv 2601.00417 (2026).
Upstream: yifanzhang-pro/deep-delta-learning ``model/DDL-vdim1-gpt-mha-rope.py``
(``DeepDeltaResidualVdim1``, the scalar-value $d_v = 1$ limit) @
2b55f2511502ac91df5e595b94de9cfb8528bc23.

DDL residual update
-------------------
Per token, with residual state $x\in\mathbb R^C$, the sublayer output $k_{in}$ (upstream: the
attention or MLP output on the pre-normed state) and a context $c$ (upstream: the pre-normed
state $\mathrm{RMSNorm}(x)$):

$$\hat k = \frac{k_{in}}{r},\quad r = \sqrt{\|k_{in}\|^2 + \epsilon^2},\qquad
\beta = 2\sigma(\ell),\quad \ell = c\,w_\beta + b_\beta,$$
$$v = s\,\sigma(x\,w_v + b_v),\qquad p = \hat k^\top x,\qquad
y = x + \beta\,(v - p)\,\hat k = (I - \beta\hat k\hat k^\top)x + \beta v\hat k .$$

($\hat k$ is upstream's ``F.rms_norm(k, eps=eps^2/C) / sqrt(C)``, which is exactly
$k/\sqrt{\|k\|^2+\epsilon^2}$.) $\beta\in(0,2)$: $\beta\to0$ is the identity shortcut, $\beta = 1$
with $v = 0$ the projection onto $\hat k^\perp$, $\beta = 2$ with $v = 0$ the Householder
reflection. Parameters (upstream names, weights ``(in, out)``): ``"beta.weight" (C, 1)``,
``"beta.bias" (1,)``, ``"v_proj.weight" (C, 1)``, ``"v_proj.bias" (1,)``; with
``beta_single_linear=False`` the gate is ``beta_out(tanh(beta_in(c)))``: ``"beta_in.weight"
(C, H_b)`` (no bias), ``"beta_out.weight" (H_b, 1)``, ``"beta_out.bias" (1,)``.

Backward (per token, $g = dy$): $d\delta = g^\top\hat k$ with $\delta = \beta(v-p)$;
$d\beta = (v-p)\,d\delta$, $d\ell = d\beta\,\beta(1-\beta/2)$; $dv = \beta\,d\delta$,
$dp = -\beta\,d\delta$; $d\hat k = \delta g + dp\,x$;
$$dx = g + dp\,\hat k + da\,w_v^\top,\quad da = dv\,s\,\sigma'(a),\qquad
dk_{in} = \frac{d\hat k - \hat k(\hat k^\top d\hat k)}{r},$$
$dc = d\ell\,w_\beta^\top$ (MLP gate: $du = (d\ell\,w_{out}^\top)\odot(1-t^2)$, $dc = du\,W_{in}^\top$),
and the weight gradients are the token sums of the outer products. The sublayer that produced
$k_{in}$ and the norm that produced $c$ are the caller's: their backward takes ``dk`` and
``context``'s gradient, so any attention or MLP chains through.

Depth-wise residual attention read
----------------------------------
Stack the per-layer states of one token along a layer axis $L$; with per-layer query/key/value
$q^{(l)}, k^{(j)}, v^{(j)}$ and window $w$:

$$h^{(l)} = \sum_{j=\max(0, l-w+1)}^{l}\mathrm{softmax}_j\!\left(q^{(l)}\cdot k^{(j)}/\sqrt d\right)v^{(j)} .$$

This is causal sliding-window softmax attention with the layer axis in the sequence position,
so `depth_window_attention_forward` builds the band mask and calls
`refattn.attention.softmax.sdpa.sdpa_forward`; its backward is ``sdpa_backward``'s. How $q, k, v$
are produced from the layer states is not fixed by the position paper ("reconstruction": they
are inputs); $w = 1$ returns $v^{(l)}$, the plain residual read.

Conventions
-----------
``k_eps`` ($10^{-5}$), ``v_sigmoid`` (True) with ``v_sigmoid_scale`` ($s = 4$), ``v_constant``
(None; a float replaces $v$ by that constant, upstream ``ddl_v_dim1_constant``; then no
``v_proj`` parameters), ``beta_single_linear`` (True). Upstream computes $\beta$ and $p$ in
float32 under mixed precision; refattn computes in the input dtype (float64 stays float64).
The expanded-state variant ($d_v > 1$, a $C\times d_v$ matrix state with a short-conv read) is
not reproduced.

Agreement with upstream
-----------------------
Upstream's ``DeepDeltaResidualVdim1`` class (its source executed as is, with ``torch``, ``nn``,
``F``, ``math`` and ``_logit`` in scope, except that its two float32 up-casts, ``.float()`` on the
gate logits and ``dtype=torch.float32`` in the projection sum, are made float64; the rest of the
file needs ``transformers``), float64 on CPU, B=2, T=3, C=8, both gate forms and ``v_sigmoid``
on/off: output and the gradients of $x$, $k_{in}$, the context and every parameter agree to
$\le 1.6\times10^{-15}$ max relative error (with upstream's float32 casts left in: $3.5\times10^{-7}$,
the float32 rounding).
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_params, check_positive
from ..attention.softmax.sdpa import sdpa_backward, sdpa_forward
from ..nn.activations import sigmoid
from ..registry import Mechanism, Sample, register
from .core import block_dtype

__all__ = [
    "deep_delta_residual_forward",
    "deep_delta_residual_backward",
    "deep_delta_residual",
    "depth_window_attention_forward",
    "depth_window_attention_backward",
]

_WHERE = "deep_delta_residual"


def _check_bool(value, name):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool; got {type(value).__name__}")
    return bool(value)


def deep_delta_residual_forward(x, k, context, params, *, k_eps: float = 1e-5, v_sigmoid: bool = True,
                                v_sigmoid_scale: float = 4.0, v_constant=None, beta_single_linear: bool = True):
    r"""DDL update $y = x + \beta(c)\,(v(x) - \hat k^\top x)\,\hat k$, $\hat k = k/\sqrt{\|k\|^2+\epsilon^2}$.

    Parameters
    ----------
    x, k, context : arrays (..., C)
        Residual state, sublayer output (the direction) and the gate's context (upstream: the
        pre-normed state).
    params : dict
        ``"beta.weight" (C, 1)``, ``"beta.bias" (1,)`` (or, with ``beta_single_linear=False``,
        ``"beta_in.weight" (C, H_b)``, ``"beta_out.weight" (H_b, 1)``, ``"beta_out.bias" (1,)``)
        and, unless ``v_constant`` is set, ``"v_proj.weight" (C, 1)``, ``"v_proj.bias" (1,)``.
    k_eps, v_sigmoid, v_sigmoid_scale, v_constant, beta_single_linear
        Module docstring (upstream defaults).

    Returns
    -------
    y, cache
        ``y`` of the shape of ``x``.
    """
    x = as_float(x, "x", min_ndim=1)
    k = as_float(k, "k", min_ndim=1)
    context = as_float(context, "context", min_ndim=1)
    for name, a in (("k", k), ("context", context)):
        if a.shape != x.shape:
            raise ValueError(f"{name} must have the shape of x {x.shape}; got {a.shape}")
    k_eps = check_positive(k_eps, "k_eps", allow_zero=True)
    v_sigmoid = _check_bool(v_sigmoid, "v_sigmoid")
    beta_single_linear = _check_bool(beta_single_linear, "beta_single_linear")
    v_sigmoid_scale = check_positive(v_sigmoid_scale, "v_sigmoid_scale")
    if v_constant is not None:
        if isinstance(v_constant, (bool, np.bool_)) or not isinstance(v_constant, (int, float, np.integer, np.floating)) \
                or not np.isfinite(v_constant):
            raise TypeError(f"v_constant must be None or a finite real number; got {v_constant!r}")
        v_constant = float(v_constant)
    c = x.shape[-1]
    if not isinstance(params, dict):
        raise TypeError(f"params for {_WHERE} must be a dict of arrays; got {type(params).__name__}")
    if beta_single_linear:
        spec = {"beta.weight": (c, 1), "beta.bias": (1,)}
    else:
        if params.get("beta_in.weight") is None:
            raise ValueError(f"params is missing key 'beta_in.weight' for {_WHERE} (expected shape (C, H_b))")
        hb = as_float(params["beta_in.weight"], "beta_in.weight", ndim=2).shape[1]
        spec = {"beta_in.weight": (c, hb), "beta_out.weight": (hb, 1), "beta_out.bias": (1,)}
    if v_constant is None:
        spec.update({"v_proj.weight": (c, 1), "v_proj.bias": (1,)})
    p = check_params(params, spec, where=_WHERE)
    dt = block_dtype(x, p, ({"k": k, "context": context},))
    x, k, context = (a.astype(dt, copy=False) for a in (x, k, context))
    p = cast_all(dt, p)
    r = np.sqrt(np.sum(k * k, axis=-1, keepdims=True) + k_eps * k_eps)
    kh = k / r
    if beta_single_linear:
        t = None
        logit = context @ p["beta.weight"] + p["beta.bias"]
    else:
        t = np.tanh(context @ p["beta_in.weight"])
        logit = t @ p["beta_out.weight"] + p["beta_out.bias"]
    beta = 2.0 * sigmoid(logit)
    proj = np.sum(kh * x, axis=-1, keepdims=True)
    a = sv = None
    if v_constant is not None:
        v = np.full_like(proj, v_constant)
    else:
        a = x @ p["v_proj.weight"] + p["v_proj.bias"]
        if v_sigmoid:
            sv = sigmoid(a)
            v = v_sigmoid_scale * sv
        else:
            v = a
    delta = beta * (v - proj)
    y = x + delta * kh
    cache = {"x": x, "context": context, "p": p, "r": r, "kh": kh, "t": t, "beta": beta, "proj": proj, "v": v,
             "sv": sv, "delta": delta, "v_sigmoid": v_sigmoid, "scale": v_sigmoid_scale,
             "const": v_constant is not None, "single": beta_single_linear, "dtype": dt}
    return y, cache


def deep_delta_residual_backward(dout, cache):
    """Gradients of `deep_delta_residual_forward`: ``{"x", "k", "context"}`` and every params key
    (module docstring)."""
    x, ctx, p, kh, beta = cache["x"], cache["context"], cache["p"], cache["kh"], cache["beta"]
    g = as_dout(dout, x.shape, cache["dtype"])
    lead = tuple(range(x.ndim - 1))
    ddelta = np.sum(g * kh, axis=-1, keepdims=True)
    dbeta = (cache["v"] - cache["proj"]) * ddelta
    dlogit = dbeta * beta * (1.0 - 0.5 * beta)
    dp = -beta * ddelta
    dkh = cache["delta"] * g + dp * x
    grads = {"x": g + dp * kh}
    grads["k"] = (dkh - kh * np.sum(kh * dkh, axis=-1, keepdims=True)) / cache["r"]
    if not cache["const"]:
        da = beta * ddelta
        if cache["v_sigmoid"]:
            da = da * cache["scale"] * cache["sv"] * (1.0 - cache["sv"])
        grads["x"] = grads["x"] + da @ p["v_proj.weight"].T
        grads["v_proj.weight"] = np.tensordot(x, da, axes=(lead, lead))
        grads["v_proj.bias"] = da.sum(axis=lead)
    if cache["single"]:
        grads["context"] = dlogit @ p["beta.weight"].T
        grads["beta.weight"] = np.tensordot(ctx, dlogit, axes=(lead, lead))
        grads["beta.bias"] = dlogit.sum(axis=lead)
    else:
        t = cache["t"]
        grads["beta_out.weight"] = np.tensordot(t, dlogit, axes=(lead, lead))
        grads["beta_out.bias"] = dlogit.sum(axis=lead)
        du = (dlogit @ p["beta_out.weight"].T) * (1.0 - t * t)
        grads["beta_in.weight"] = np.tensordot(ctx, du, axes=(lead, lead))
        grads["context"] = du @ p["beta_in.weight"].T
    return grads


def deep_delta_residual(x, k, context, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of `deep_delta_residual_forward`."""
    return deep_delta_residual_forward(x, k, context, params, **config)[0]


def depth_window_attention_forward(q, k, v, *, window: int, scale=None):
    r"""Causal depth-wise residual attention read: ShortSWA over the layer axis.

    ``q, k`` (..., L, d), ``v`` (..., L, dv) with the layer index on axis -2 (one token's
    per-layer states; put tokens/heads on the leading axes). Layer $l$ attends to layers
    $\max(0, l-w+1)..l$. Returns ``(h, cache)``, ``h`` (..., L, dv)."""
    if isinstance(window, (bool, np.bool_)) or not isinstance(window, (int, np.integer)):
        raise TypeError(f"window must be an integer; got {type(window).__name__}")
    if window < 1:
        raise ValueError(f"window must be >= 1; got {window}")
    q = as_float(q, "q", min_ndim=2)
    n = q.shape[-2]
    i = np.arange(n)
    keep = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - int(window))
    return sdpa_forward(q, k, v, attn_mask=keep, scale=scale)


def depth_window_attention_backward(dout, cache):
    """Gradients ``{"q", "k", "v"}`` of `depth_window_attention_forward` (SDPA's backward)."""
    return sdpa_backward(dout, cache)


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _params(rng, c, single=True, hb=3, const=False):
    if single:
        p = {"beta.weight": rng.standard_normal((c, 1)) / np.sqrt(c), "beta.bias": 0.3 * rng.standard_normal(1)}
    else:
        p = {"beta_in.weight": rng.standard_normal((c, hb)) / np.sqrt(c),
             "beta_out.weight": rng.standard_normal((hb, 1)), "beta_out.bias": 0.3 * rng.standard_normal(1)}
    if not const:
        p.update({"v_proj.weight": rng.standard_normal((c, 1)) / np.sqrt(c), "v_proj.bias": 0.3 * rng.standard_normal(1)})
    return p


def _sample(rng, size):
    single = bool(rng.integers(2))
    vs = bool(rng.integers(2))
    n, c = (2, 4) if size == "tiny" else (5, 8)
    inputs = {name: rng.standard_normal((2, n, c)) for name in ("x", "k", "context")}
    return Sample(inputs=inputs, params=_params(rng, c, single),
                  config={"beta_single_linear": single, "v_sigmoid": vs})


def _reference(x, k, context, params, k_eps=1e-5, v_sigmoid=True, v_sigmoid_scale=4.0, v_constant=None,
               beta_single_linear=True):
    # The matrix form (I - beta k k^T) x + beta v k, token by token.
    p = params
    out = np.empty_like(x)
    for idx in np.ndindex(x.shape[:-1]):
        xi, ki, ci = x[idx], k[idx], context[idx]
        kh = ki / np.sqrt(ki @ ki + k_eps ** 2)
        if beta_single_linear:
            lg = ci @ p["beta.weight"][:, 0] + p["beta.bias"][0]
        else:
            lg = np.tanh(ci @ p["beta_in.weight"]) @ p["beta_out.weight"][:, 0] + p["beta_out.bias"][0]
        b = 2.0 / (1.0 + np.exp(-lg))
        if v_constant is not None:
            v = v_constant
        else:
            a = xi @ p["v_proj.weight"][:, 0] + p["v_proj.bias"][0]
            v = v_sigmoid_scale / (1.0 + np.exp(-a)) if v_sigmoid else a
        out[idx] = (np.eye(x.shape[-1]) - b * np.outer(kh, kh)) @ xi + b * v * kh
    return out


def _beta_at(rng, target):
    # params whose gate is exactly `target` (beta.weight = 0, bias = logit(target/2)) and v = 0.
    c = 5
    x, k, ctx = (rng.standard_normal((2, 3, c)) for _ in range(3))
    q = target / 2.0
    p = {"beta.weight": np.zeros((c, 1)), "beta.bias": np.array([np.log(q) - np.log1p(-q)])}
    y = deep_delta_residual(x, k, ctx, p, v_constant=0.0, k_eps=0.0)
    return x, k / np.linalg.norm(k, axis=-1, keepdims=True), y


def _check_beta_identity_projection_reflection(rng):
    # beta -> 0: identity; beta = 1, v = 0: projection onto k-perp (idempotent, kh . y = 0);
    # beta -> 2 (1 - 1e-12 off), v = 0: Householder reflection (norm kept, kh . y = -kh . x).
    x, kh, y0 = _beta_at(rng, 1e-13)
    err = float(np.abs(y0 - x).max())
    x, kh, y1 = _beta_at(rng, 1.0)
    err = max(err, float(np.abs(np.sum(kh * y1, -1)).max()))
    x, kh, y2 = _beta_at(rng, 2.0 - 1e-13)
    err = max(err, float(np.abs(np.linalg.norm(y2, axis=-1) - np.linalg.norm(x, axis=-1)).max()),
              float(np.abs(np.sum(kh * y2, -1) + np.sum(kh * x, -1)).max()))
    assert err < 1e-11, f"DDL beta limits wrong by {err}"
    return err


def _check_window_one_is_plain_read(rng):
    # w = 1: each layer reads only its own value (the plain residual read); w >= L: causal SDPA.
    q, k, v = (rng.standard_normal((2, 3, 5, 4)) for _ in range(3))
    h1, _ = depth_window_attention_forward(q, k, v, window=1)
    err = float(np.abs(h1 - v).max())
    hl, _ = depth_window_attention_forward(q, k, v, window=5)
    err = max(err, float(np.abs(hl - sdpa_forward(q, k, v, is_causal=True)[0]).max()))
    assert err < 1e-13, f"depth window attention limits wrong by {err}"
    return err


register(
    Mechanism(
        slug="depth_attention_delta_residual", family="5-building-blocks", tier="T2",
        title="Deep Delta Learning residual x + beta (v - k^T x) k (DDL, d_v = 1) and the depth-wise ShortSWA read",
        paper="Zhang, Liu, Wang, Gu, Deep Delta Learning, arXiv 2601.00417, 2026; Transformer^2 "
              "residual-stream duality position paper (catalogue seed 3-3)",
        official_code="yifanzhang-pro/deep-delta-learning",
        forward=deep_delta_residual_forward, backward=deep_delta_residual_backward, sample=_sample,
        reference=_reference, docs="blocks/t3-blocks.md#depth_attention_delta_residual",
        checks={"beta_identity_projection_reflection": _check_beta_identity_projection_reflection,
                "window_one_is_plain_read": _check_window_one_is_plain_read},
    ),
)
