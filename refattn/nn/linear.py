r"""Affine (fully connected) layer $y = xW + b$ over the last axis, with a hand-derived backward.

Convention
----------
``W`` has shape ``(in, out)`` so that the forward is a plain ``x @ W``. PyTorch's
``nn.Linear`` stores ``weight`` as ``(out, in)`` and computes ``x @ weight.T + bias``; load a
PyTorch layer with::

    params = {"weight": linear.weight.detach().numpy().T, "bias": linear.bias.detach().numpy()}

(omit ``"bias"`` for ``nn.Linear(..., bias=False)``). JAX/Flax ``Dense`` already stores
``kernel`` as ``(in, out)``.

Derivation
----------
Flatten every leading axis of ``x`` into rows: $X \in \mathbb{R}^{R\times n}$,
$Y = XW + \mathbf 1 b^\top \in \mathbb{R}^{R\times m}$. With $G = \partial L/\partial Y$,

$$dX = G W^\top,\qquad dW = X^\top G,\qquad db = \textstyle\sum_r G_{r,:}.$$

(From $dL = \operatorname{tr}(G^\top dY)$ and $dY = dX\,W + X\,dW + \mathbf 1\,db^\top$.)
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, check_param_keys, compute_dtype
from ..registry import Mechanism, Sample, register

__all__ = ["linear_forward", "linear_backward", "linear", "linear_apply", "linear_vjp", "check_linear_params",
           "linear_prefixed", "linear_prefixed_vjp", "linear_prefixed_spec", "init_linear_prefixed",
           "init_torch_default", "split_heads", "merge_heads"]


def linear_apply(x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None = None) -> np.ndarray:
    """Unvalidated ``x @ weight (+ bias)`` for callers that have already validated their inputs."""
    y = x @ weight
    if bias is not None:
        y = y + bias
    return y


def linear_vjp(dy: np.ndarray, x: np.ndarray, weight: np.ndarray, has_bias: bool = True) -> dict:
    r"""Unvalidated gradients of :func:`linear_apply`: ``{"x", "weight"[, "bias"]}``.

    $dx = dy\,W^\top$, $dW = \sum_{\text{rows}} x^\top dy$, $db = \sum_{\text{rows}} dy$.
    """
    n_in, n_out = weight.shape
    x2 = x.reshape(-1, n_in)
    g2 = dy.reshape(-1, n_out)
    grads = {"x": dy @ weight.T, "weight": x2.T @ g2}
    if has_bias:
        grads["bias"] = g2.sum(axis=0)
    return grads


# --------------------------------------------------------------------------------------------
# Layers stored in a flat params dict under a prefix ("q_proj.weight", "q_proj.bias"), as in a
# PyTorch state_dict (weights transposed to (in, out)). Unvalidated: callers validate the dict
# first (``refattn._checks.check_params`` with :func:`linear_prefixed_spec`).


def linear_prefixed_spec(prefix: str, n_in: int, n_out: int, bias: bool = True) -> dict:
    """The ``check_params`` spec of one prefixed layer: ``{prefix.weight: (n_in, n_out)[, prefix.bias: (n_out,)]}``."""
    spec = {f"{prefix}.weight": (n_in, n_out)}
    if bias:
        spec[f"{prefix}.bias"] = (n_out,)
    return spec


def init_linear_prefixed(rng, n_in: int, n_out: int, prefix: str, bias: bool = True) -> dict:
    r"""PyTorch's default ``nn.Linear`` initialisation as a prefixed dict: weight ``(n_in, n_out)``
    then bias ``(n_out,)``, both $U(-1/\sqrt{n_{in}}, 1/\sqrt{n_{in}})$ (drawn from ``rng`` in that order)."""
    bound = 1.0 / np.sqrt(n_in)
    out = {f"{prefix}.weight": rng.uniform(-bound, bound, (n_in, n_out))}
    if bias:
        out[f"{prefix}.bias"] = rng.uniform(-bound, bound, n_out)
    return out


def init_torch_default(rng, shapes: dict, *, normal=(), ones=(), norm=()) -> dict:
    r"""PyTorch's default initialisation of a flat ``{key: shape}`` dict, drawn from ``rng`` in key order:

    * keys ending in one of ``normal``: $\mathcal N(0, 1)$ (learned queries, position encodings);
    * keys ending in one of ``ones``: 1;
    * keys containing one of ``norm``: a norm layer, weight 1 and bias 0;
    * ``...in_proj_weight`` (``nn.MultiheadAttention``): xavier-uniform; ``...in_proj_bias`` and
      ``...out_proj.bias``: 0;
    * every other ``...weight (in, out)`` and its ``...bias``: $U(\pm 1/\sqrt{\text{in}})$ (``nn.Linear``).

    Returns float64 arrays (cast them as needed)."""
    p = {}
    for k, s in shapes.items():
        if normal and k.endswith(tuple(normal)):
            p[k] = rng.standard_normal(s)
        elif ones and k.endswith(tuple(ones)):
            p[k] = np.ones(s)
        elif k.endswith("in_proj_weight"):
            lim = np.sqrt(6.0 / (s[0] + s[1]))
            p[k] = rng.uniform(-lim, lim, s)
        elif k.endswith(("in_proj_bias", "out_proj.bias")):
            p[k] = np.zeros(s)
        elif any(m in k for m in norm):
            p[k] = np.ones(s) if k.endswith("weight") else np.zeros(s)
        else:
            fan_in = shapes[k[:-len("bias")] + "weight"][0] if k.endswith("bias") else s[0]
            p[k] = rng.uniform(-1 / np.sqrt(fan_in), 1 / np.sqrt(fan_in), s)
    return p


def linear_prefixed(params: dict, prefix: str, x: np.ndarray) -> np.ndarray:
    """``x @ params[prefix.weight] (+ params[prefix.bias])``; the bias is optional (absent or None)."""
    return linear_apply(x, params[f"{prefix}.weight"], params.get(f"{prefix}.bias"))


def linear_prefixed_vjp(grads: dict, params: dict, prefix: str, dy: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Backward of :func:`linear_prefixed` for upstream gradient ``dy`` at input ``x``: returns ``dx``.

    The gradients of ``prefix.weight`` (and ``prefix.bias`` when ``params`` has that key) are
    *added* into ``grads`` (set if absent), so a layer applied several times accumulates.
    """
    g = linear_vjp(dy, x, params[f"{prefix}.weight"], f"{prefix}.bias" in params)
    for k in ("weight", "bias"):
        if k in g:
            key = f"{prefix}.{k}"
            grads[key] = grads[key] + g[k] if key in grads else g[k]
    return g["x"]


def split_heads(t: np.ndarray, n_heads: int, width: int | None = None) -> np.ndarray:
    """``(..., N, n_heads * width) -> (..., n_heads, N, width)`` (a view; PyTorch ``view`` +
    ``transpose(1, 2)``). ``width`` defaults to ``t.shape[-1] // n_heads``."""
    if width is None:
        width = t.shape[-1] // n_heads
    return np.swapaxes(t.reshape(t.shape[:-1] + (n_heads, width)), -2, -3)


def merge_heads(t: np.ndarray) -> np.ndarray:
    """``(..., H, N, w) -> (..., N, H * w)``: the inverse of :func:`split_heads`."""
    t = np.swapaxes(t, -2, -3)
    return t.reshape(t.shape[:-2] + (t.shape[-2] * t.shape[-1],))


def check_linear_params(params, x_features: int, name: str = "params", *, prefix: str = ""):
    """Validate a ``{"weight": (in, out), "bias": (out,)}`` dict against ``x_features`` inputs.

    Returns ``(weight, bias_or_None)`` as float arrays. ``prefix`` names the parameter in
    messages when the dict is nested inside a larger module (e.g. ``"q_proj."``).
    """
    if not isinstance(params, dict):
        raise TypeError(f"{name} must be a dict with 'weight' (in, out) and optional 'bias' (out,); "
                        f"got {type(params).__name__}")
    check_param_keys(params, ("weight",), ("bias",), name=name)
    w = as_float(params["weight"], f"{prefix}weight", ndim=2)
    if w.shape[0] != x_features:
        hint = ("PyTorch's nn.Linear.weight is (out, in): pass its transpose" if w.shape[1] == x_features
                else f"x has {x_features} features on its last axis, this weight takes {w.shape[0]}")
        raise ValueError(f"{prefix}weight must have shape (in={x_features}, out); got {w.shape} ({hint})")
    b = params.get("bias")
    if b is not None:
        b = as_float(b, f"{prefix}bias", ndim=1)
        if b.shape[0] != w.shape[1]:
            raise ValueError(f"{prefix}bias must have shape (out={w.shape[1]},); got {b.shape}")
    return w, b


def linear_forward(x, params):
    r"""$y = xW + b$ over the last axis of ``x``; any leading axes.

    Parameters
    ----------
    x : array (..., in)
    params : dict
        ``"weight"`` of shape ``(in, out)`` (PyTorch: ``linear.weight.T``) and optional
        ``"bias"`` of shape ``(out,)``.

    Returns
    -------
    y, cache
        ``y`` of shape ``(..., out)`` in the compute dtype of ``x``, ``weight``, ``bias``.
    """
    x = as_float(x, "x", min_ndim=1)
    w, b = check_linear_params(params, x.shape[-1])
    dt = compute_dtype(x, w, b)
    x, w = x.astype(dt, copy=False), w.astype(dt, copy=False)
    b = None if b is None else b.astype(dt, copy=False)
    y = linear_apply(x, w, b)
    return y, {"x": x, "weight": w, "has_bias": b is not None}


def linear_backward(dout, cache):
    """Gradient of :func:`linear_forward`: ``{"x", "weight"[, "bias"]}`` (see the module docstring)."""
    x, w = cache["x"], cache["weight"]
    dout = as_dout(dout, x.shape[:-1] + (w.shape[1],), x.dtype)
    return linear_vjp(dout, x, w, cache["has_bias"])


def linear(x, params) -> np.ndarray:
    """Convenience wrapper: the output of :func:`linear_forward`."""
    return linear_forward(x, params)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size):
    if size == "tiny":
        n, c_in, c_out = int(rng.integers(2, 4)), int(rng.integers(2, 5)), int(rng.integers(2, 5))
    else:
        n, c_in, c_out = int(rng.integers(5, 9)), int(rng.integers(6, 12)), int(rng.integers(6, 12))
    x = rng.standard_normal((2, n, c_in))
    params = {"weight": rng.standard_normal((c_in, c_out)) / np.sqrt(c_in),
              "bias": rng.standard_normal(c_out)}
    return Sample(inputs={"x": x}, params=params)


def _reference(x, params):
    # The explicit sum y[..., o] = sum_i x[..., i] W[i, o] + b[o].
    return np.einsum("...i,io->...o", x, params["weight"]) + params["bias"]


def _check_no_bias(rng):
    x = rng.standard_normal((2, 3, 4))
    w = rng.standard_normal((4, 5))
    y, cache = linear_forward(x, {"weight": w})
    g = linear_backward(np.ones_like(y), cache)
    assert set(g) == {"x", "weight"}, f"no-bias layer returned gradients {sorted(g)}"
    err = float(np.abs(y - x @ w).max())
    assert err < 1e-12
    return err


def _check_pytorch_layout(rng):
    # A PyTorch weight (out, in) must be transposed; passing it untransposed must fail loudly.
    x = rng.standard_normal((2, 3))
    w_torch = rng.standard_normal((4, 3))
    try:
        linear_forward(x, {"weight": w_torch})
    except ValueError as exc:
        assert "transpose" in str(exc)
    else:
        raise AssertionError("an (out, in) weight was accepted for x with in=3")
    y = linear(x, {"weight": w_torch.T})
    err = float(np.abs(y - np.einsum("bi,oi->bo", x, w_torch)).max())
    assert err < 1e-12
    return err


register(
    Mechanism(
        slug="linear", family="5-building-blocks", tier="primitive",
        title="Affine layer y = x W + b (W is (in, out); PyTorch: weight.T)",
        paper="standard", forward=linear_forward, backward=linear_backward, sample=_sample,
        reference=_reference, docs="building-blocks.md#linear",
        checks={"no_bias": _check_no_bias, "pytorch_layout": _check_pytorch_layout},
    ),
)
