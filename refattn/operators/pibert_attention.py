r"""PIBERT physics-biased self-attention: softmax attention whose logits are shifted by the norm of a
PDE residual at every token.

Paper: Somyajit Chakraborty, Ming Pan, Xizhong Chen, "A Physics-Informed Fourier-Wavelet Transformer
for Multiscale Computational Fluid Dynamics Surrogate Modeling" (PIBERT), arXiv 2606.24696 (2026).
Upstream: Samsomyajit/pibert ``pibert/physics/physics_attention.py`` (``PhysicsBiasedAttention``)
@ 0b48dea18da6faa14d5bba24a1a8a43446fa3437.

Which part of the model
-----------------------
PIBERT embeds a flow field with a hybrid Fourier-wavelet spectral encoding, runs a transformer whose
self-attention is this layer, and pretrains it with masked-physics and equation-consistency tasks.
This module is the physics-biased self-attention, the paper's attention mechanism. The spectral
embedding and the pretraining objectives are left to the docs text (the repository's
``PhysicsTransformer`` in ``pibert/core/model.py`` is a placeholder that applies a single Linear layer).
The wavelet half of the embedding cannot be built from the sources: ``pibert/spectral/wavelet.py`` is
a placeholder that applies no transform, and the paper text was not reachable, so no wavelet filter
(or perfect-reconstruction property) is defined.

Forward
-------
Tokens $X\in\mathbb R^{N\times C}$, per-token PDE residual vectors $R\in\mathbb R^{N\times r}$ (the
caller computes them, e.g. by finite differences of the predicted field; upstream takes them as the
``pde_residuals`` argument), $H$ heads of width $d = C/H$ split head-major:

$$Q = XW_q + b_q,\quad K = XW_k + b_k,\quad V = XW_v + b_v,\qquad n_j = \lVert R_j\rVert_2,$$

$$S_{h,ij} = \frac{Q_{h,i}\cdot K_{h,j}}{\sqrt d} - \lambda\,(n_j - n_i),\qquad
Y = \big[\mathrm{softmax}_j(S_h)V_h\big]_{\text{heads merged}}\,W_o + b_o .$$

The same bias enters every head. The catalogue's $\beta\,g(r_j)$ reading is this formula with
$g(r) = -\lVert r\rVert_2$ and $\beta = \lambda$; the query-side term $+\lambda n_i$ is constant
along each softmax row, so it does not change the output (upstream computes the pairwise
difference; the check ``row_term_cancels`` shows the invariance). Keys with a large residual
receive less attention for $\lambda > 0$. As upstream does, the bias is applied only when
$\lambda > 0$ (a non-positive $\lambda$ or ``pde_residuals=None`` gives plain softmax attention).
``attn_mask`` ``(B, N, N)`` (True = keep; upstream: ``mask == 0`` is filled with $-\infty$) is the
same for every head.

Backward
--------
With $dS$ the score gradient of the softmax-attention VJP (``attention_core_backward``, whose
``"bias"`` output is $dS$ summed over heads), the bias $B_{ij} = -\lambda(n_j - n_i)$ gives

$$\frac{\partial L}{\partial n_m} = -\lambda\sum_i dB_{im} + \lambda\sum_j dB_{mj},\qquad
\frac{\partial L}{\partial R_m} = \frac{\partial L}{\partial n_m}\,\frac{R_m}{n_m}.$$

The second sum vanishes up to round-off (the rows of a softmax VJP sum to zero); it is kept so the
backward is the exact adjoint of the forward as written. The norm is not differentiable at
$R_m = 0$; there the gradient is taken as $0$ (the subgradient of least norm), and the sampler keeps
residuals away from zero. $Q, K, V$ and the output projection are Linear layers:
$dW = \text{input}^\top d\text{out}$, $d\,\text{input} = d\text{out}\,W^\top$, and $dX$ sums the
three input projections.

Conventions
-----------
* Parameters keep upstream names ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj`` (``.weight``
  stored ``(in, out)`` = ``nn.Linear.weight.T``, ``.bias``).
* ``lambda_param`` (upstream name, default 1.0) is a fixed hyper-parameter upstream, not learned; it
  is a config value here.
* Upstream applies dropout (0.1) to the attention weights in training; this is the eval forward.

Agreement with upstream
-----------------------
``PhysicsBiasedAttention`` run from the repository file in PyTorch float64 on CPU, eval mode
($B = 2$, $N = 7$, $C = 8$, $H = 2$, $r = 3$, $\lambda = 0.7$, parameters $\sim N(0, 0.25)$), maximum
error relative to $\max(1, \text{largest entry})$: output 4.2e-16 (6.4e-16 with a mask), gradients of
``x``, ``pde_residuals`` and every parameter <= 2.2e-15 (3.0e-15 with a mask; the largest is
``k_proj.bias``, whose exact gradient is zero because a key bias shifts a whole softmax row).
Upstream documents the mask as ``[batch, seq, seq]``, but against scores ``[B, H, S, S]`` such a
tensor broadcasts along the *head* axis; the comparison passes it as ``mask.unsqueeze(1)``
(``[B, 1, S, S]``), which is what this layer's ``(B, N, N)`` mask means.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_int, check_params, compute_dtype
from ..attention.softmax import attention_core_backward, attention_core_forward
from ..nn.linear import (
    init_linear_prefixed,
    linear_prefixed,
    linear_prefixed_spec,
    linear_prefixed_vjp,
    merge_heads,
    split_heads,
)
from ..registry import Mechanism, Sample, register

__all__ = ["pibert_attention_forward", "pibert_attention_backward", "pibert_attention",
           "init_pibert_attention_params", "residual_norm_bias"]

_PROJ = ("q_proj", "k_proj", "v_proj", "out_proj")


def residual_norm_bias(pde_residuals, lambda_param: float = 1.0) -> tuple[np.ndarray, np.ndarray]:
    r"""The physics bias $B_{ij} = -\lambda(n_j - n_i)$, $n = \lVert R\rVert_2$ over the last axis.

    ``pde_residuals`` ``(..., N, r)`` -> ``(bias (..., N, N), n (..., N))``.
    """
    r = as_float(pde_residuals, "pde_residuals", min_ndim=2)
    n = np.sqrt(np.sum(r * r, axis=-1))
    return -float(lambda_param) * (n[..., None, :] - n[..., :, None]), n


def _validate(x, pde_residuals, params, num_heads, lambda_param, attn_mask):
    x = as_float(x, "x", ndim=3)
    b, n, c = x.shape
    h = check_int(num_heads, "num_heads", minimum=1)
    if c % h:
        raise ValueError(f"the width C={c} (x's last axis) must be divisible by num_heads={h}")
    if isinstance(lambda_param, bool) or not isinstance(lambda_param, (int, float, np.floating, np.integer)) \
            or not np.isfinite(lambda_param):
        raise TypeError(f"lambda_param must be a finite real number; got {lambda_param!r}")
    spec = {}
    for name in _PROJ:
        spec.update(linear_prefixed_spec(name, c, c))
    p = check_params(params, spec)
    r = None
    if pde_residuals is not None:
        r = as_float(pde_residuals, "pde_residuals", ndim=3)
        if r.shape[:2] != (b, n):
            raise ValueError(f"pde_residuals must have shape (B={b}, N={n}, r) like x's first two axes; got {r.shape}")
    if attn_mask is not None:
        attn_mask = np.asarray(attn_mask)
        if attn_mask.dtype != np.bool_:
            raise TypeError(f"attn_mask must be a boolean array (True = keep); got dtype {attn_mask.dtype}")
        if attn_mask.shape != (b, n, n):
            raise ValueError(f"attn_mask must have shape (B={b}, N={n}, N={n}); got {attn_mask.shape}")
        attn_mask = attn_mask[:, None]
    dt = compute_dtype(x, *p.values(), *(() if r is None else (r,)))
    return (x.astype(dt, copy=False), None if r is None else r.astype(dt, copy=False), cast_all(dt, p), h,
            float(lambda_param), attn_mask)


def pibert_attention_forward(x, pde_residuals, params, *, num_heads: int, lambda_param: float = 1.0, attn_mask=None):
    r"""PIBERT's physics-biased self-attention (module docstring).

    Parameters
    ----------
    x : array (B, N, C)
        Token features.
    pde_residuals : array (B, N, r) or None
        PDE residual vector at every token (upstream ``pde_residuals``); None disables the bias.
    params : dict
        ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj``: ``.weight (C, C)`` (= ``nn.Linear.weight.T``)
        and ``.bias (C,)``.
    num_heads : int
    lambda_param : float
        Bias strength $\lambda$ (upstream default 1.0); the bias is applied only when $\lambda > 0$.
    attn_mask : bool array (B, N, N), optional
        True = keep (upstream's ``mask != 0``).

    Returns
    -------
    out, cache
        ``out (B, N, C)``.
    """
    x, r, p, h, lam, mask = _validate(x, pde_residuals, params, num_heads, lambda_param, attn_mask)
    use_bias = r is not None and lam > 0
    bias = n = None
    if use_bias:
        bias, n = residual_norm_bias(r, lam)
        bias = bias[:, None]                                   # (B, 1, N, N): every head
    q, k, v = (split_heads(linear_prefixed(p, name, x), h) for name in _PROJ[:3])
    o, core = attention_core_forward(q, k, v, bias, attn_mask=mask)
    om = merge_heads(o)
    out = linear_prefixed(p, "out_proj", om)
    return out, dict(p=p, x=x, h=h, r=r, n=n, lam=lam, use_bias=use_bias, has_r=r is not None, core=core, om=om,
                     out_shape=out.shape)


def pibert_attention_backward(dout, cache):
    """Gradients of :func:`pibert_attention_forward`: ``x``, ``pde_residuals`` (when given) and every params key."""
    p, x = cache["p"], cache["x"]
    g = as_dout(dout, cache["out_shape"], x.dtype)
    grads = {}
    dom = linear_prefixed_vjp(grads, p, "out_proj", g, cache["om"])
    gc = attention_core_backward(split_heads(dom, cache["h"]), cache["core"])
    dx = np.zeros_like(x)
    for name, key in zip(_PROJ[:3], ("q", "k", "v")):
        dx = dx + linear_prefixed_vjp(grads, p, name, merge_heads(gc[key]), x)
    grads["x"] = dx
    if cache["has_r"]:
        r = cache["r"]
        if cache["use_bias"]:
            db = gc["bias"][:, 0]                                 # (B, N, N), summed over heads
            lam, n = cache["lam"], cache["n"]
            dn = -lam * db.sum(axis=-2) + lam * db.sum(axis=-1)
            safe = np.where(n > 0, n, 1.0)
            grads["pde_residuals"] = np.where((n > 0)[..., None], (dn / safe)[..., None] * r, 0.0)
        else:
            grads["pde_residuals"] = np.zeros_like(r)
    return grads


def pibert_attention(x, pde_residuals, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`pibert_attention_forward`."""
    return pibert_attention_forward(x, pde_residuals, params, **config)[0]


def init_pibert_attention_params(rng, c: int, *, dtype=np.float64) -> dict:
    """PyTorch's default ``nn.Linear`` initialisation for the four projections (upstream's init)."""
    c = check_int(c, "c", minimum=1)
    p = {}
    for name in _PROJ:
        p.update(init_linear_prefixed(rng, c, c, name))
    return {k: np.asarray(v, dtype=dtype) for k, v in p.items()}


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _residuals(rng, b, n, r):
    # Residual vectors with norms in [0.5, 1.5] (away from the kink of the norm at 0).
    u = rng.standard_normal((b, n, r))
    u /= np.linalg.norm(u, axis=-1, keepdims=True)
    return u * rng.uniform(0.5, 1.5, (b, n, 1))


def _sample(rng, size):
    n, c, h, r = (3, 4, 2, 2) if size == "tiny" else (9, 8, 2, 3)
    p = init_pibert_attention_params(rng, c)
    return Sample(inputs={"x": rng.standard_normal((2, n, c)), "pde_residuals": _residuals(rng, 2, n, r)},
                  params=p, config={"num_heads": h, "lambda_param": 0.7})


def _softmax(s):
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _reference(x, pde_residuals, params, *, num_heads, lambda_param=1.0, attn_mask=None):
    # Per (batch, head, query) loops with the pairwise bias written out entry by entry.
    b, n, c = x.shape
    d = c // num_heads
    out = np.zeros_like(x)
    for bb in range(b):
        q, k, v = (x[bb] @ params[f"{nm}.weight"] + params[f"{nm}.bias"] for nm in _PROJ[:3])
        nr = [float(np.sqrt(np.sum(pde_residuals[bb, j] ** 2))) for j in range(n)] if pde_residuals is not None else None
        o = np.zeros((n, c))
        for hh in range(num_heads):
            sl = slice(hh * d, (hh + 1) * d)
            for i in range(n):
                s = np.array([q[i, sl] @ k[j, sl] / np.sqrt(d) for j in range(n)])
                if nr is not None and lambda_param > 0:
                    s = s - lambda_param * np.array([nr[j] - nr[i] for j in range(n)])
                if attn_mask is not None:
                    s = np.where(attn_mask[bb, i], s, -np.inf)
                o[i, sl] = _softmax(s) @ v[:, sl]
        out[bb] = o @ params["out_proj.weight"] + params["out_proj.bias"]
    return out


def _check_row_term_cancels(rng):
    # The query-side term +lambda*n_i is constant along a softmax row: the key-only bias
    # -lambda*n_j (the catalogue's beta*g(r_j)) gives the same output.
    s = _sample(rng, "small")
    x, r, p = s.inputs["x"], s.inputs["pde_residuals"], s.params
    h, lam = s.config["num_heads"], s.config["lambda_param"]
    d = x.shape[-1] // h
    q, k, v = (split_heads(x @ p[f"{nm}.weight"] + p[f"{nm}.bias"], h) for nm in _PROJ[:3])
    key_bias = -lam * np.linalg.norm(r, axis=-1)[:, None, None, :]
    o = _softmax(q @ np.swapaxes(k, -1, -2) / np.sqrt(d) + key_bias) @ v
    want = merge_heads(o) @ p["out_proj.weight"] + p["out_proj.bias"]
    err = float(np.abs(pibert_attention(x, r, p, **s.config) - want).max())
    assert err < 1e-12, f"the pairwise bias differs from the key-only bias by {err:.2e}"
    return err


def _check_no_bias_cases(rng):
    # lambda <= 0 or no residuals: plain multi-head softmax attention (upstream skips the bias).
    s = _sample(rng, "small")
    x, r, p = s.inputs["x"], s.inputs["pde_residuals"], s.params
    plain = pibert_attention(x, None, p, num_heads=2)
    errs = [float(np.abs(pibert_attention(x, r, p, num_heads=2, lambda_param=lam) - plain).max())
            for lam in (0.0, -1.0)]
    biased = pibert_attention(x, r, p, num_heads=2, lambda_param=1.0)
    assert np.abs(biased - plain).max() > 1e-3, "the bias had no effect"
    err = max(errs)
    assert err < 1e-13, f"lambda <= 0 should disable the bias: {err:.2e}"
    return err


def _check_mask(rng):
    # The boolean mask against the explicit formula.
    s = _sample(rng, "small")
    x = s.inputs["x"]
    mask = rng.random((2, x.shape[1], x.shape[1])) < 0.7
    mask[:, np.arange(x.shape[1]), np.arange(x.shape[1])] = True
    err = float(np.abs(pibert_attention(**s.inputs, params=s.params, attn_mask=mask, **s.config)
                       - _reference(**s.inputs, params=s.params, attn_mask=mask, **s.config)).max())
    assert err < 1e-12, f"masked forward differs from the explicit formula by {err:.2e}"
    return err


register(
    Mechanism(
        slug="physics_biased_fourier_wavelet_attention", family="3-operator", tier="T3",
        official_code="Samsomyajit/pibert pibert/physics/physics_attention.py@0b48dea (PhysicsBiasedAttention)",
        title="PIBERT: physics-biased self-attention (logits shifted by PDE-residual norms)",
        paper="Chakraborty, Pan, Chen, A Physics-Informed Fourier-Wavelet Transformer for Multiscale Computational "
              "Fluid Dynamics Surrogate Modeling (PIBERT), arXiv 2606.24696 (2026)",
        forward=pibert_attention_forward, backward=pibert_attention_backward, sample=_sample,
        reference=_reference, docs="operators/o5a.md#pibert-physics-biased-attention",
        checks={"row_term_cancels": _check_row_term_cancels, "no_bias_cases": _check_no_bias_cases,
                "mask": _check_mask},
    ),
)
