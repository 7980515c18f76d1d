r"""Relatives of differential attention: signed or re-normalised combinations of attention maps.

Six catalogue entries of family 2 ("Differential attention") that are not DIFF Transformer itself
but share its idea of combining attention maps (or their inputs) with signed weights:

* :func:`shaped_attention_forward` — $A = \beta\,\mathrm{softmax}(S) + \alpha I - \gamma C$
  (He & Hofmann; Noci et al.): a softmax map centred by subtracting a fixed "common-mode" map.
* :func:`momentum_attention_forward` — a high-pass shear $(1+\gamma)q_t - \gamma q_{t-1}$ of
  queries and keys before causal softmax attention (a signed combination of four score maps).
* :func:`pct_offset_attention_forward` — PCT offset-attention $x + \mathrm{ReLU}(\mathrm{BN}((x - x_r)W_t + b_t))$,
  with a column-renormalised softmax map.
* :func:`reflexsplit_dual_stream_attention_forward` — ReflexSplit's two streams that subtract each
  other's attention map, $A_T - \lambda A_R$ and $A_R - \lambda A_T$.
* :func:`mala_linear_attention_forward` — MALA's magnitude-aware linear attention: signed token
  weights $(1 + 1/z_i)a_{ij} - z_i/N$ that sum to one.
* :func:`multi_token_attention_forward` — Multi-Token Attention: key–query convolution over the
  score map, head mixing (DIFF is a special case), RMS "group norm" and gating.

Every forward returns ``(out, cache)`` and every backward ``dict`` of gradients for all inputs and
parameters; the derivations are in each function's docstring and in
``docs/differential-relatives.md``. Layouts follow PyTorch SDPA (``q (B, H, N, d)``) for the
attention cores and token-major ``x (B, N, C)`` for the layers; weights are ``(in, out)``
(PyTorch: ``linear.weight.T``; a 1x1 ``Conv1d``/``Conv2d`` weight ``w[:, :, 0].T``). Parameter
keys are the upstream modules' ``state_dict`` names (``"sa_qkv.weight"``, ``"lambda_sa"`` …) so a
checkpoint maps over key by key.
"""

from __future__ import annotations

import math

import numpy as np

from .._checks import (
    as_bool_or_float_mask,
    as_dout,
    as_float,
    check_broadcastable,
    check_choice,
    check_int,
    check_param_keys,
    check_positive,
    compute_dtype,
)
from ..nn.activations import elu_plus_one, elu_plus_one_grad, sigmoid, sigmoid_grad
from ..nn.norms import rms_norm_backward, rms_norm_forward
from ..nn.softmax import apply_mask, softmax_lse, softmax_vjp
from ..registry import Mechanism, Sample, register

__all__ = [
    "shaped_attention_forward",
    "shaped_attention_backward",
    "shaped_attention",
    "momentum_attention_forward",
    "momentum_attention_backward",
    "momentum_attention",
    "momentum_shear",
    "pct_offset_attention_forward",
    "pct_offset_attention_backward",
    "pct_offset_attention",
    "reflexsplit_dual_stream_attention_forward",
    "reflexsplit_dual_stream_attention_backward",
    "reflexsplit_dual_stream_attention",
    "swin_relative_position_index",
    "mala_linear_attention_forward",
    "mala_linear_attention_backward",
    "mala_linear_attention",
    "mala_rope_tables",
    "multi_token_attention_forward",
    "multi_token_attention_backward",
    "multi_token_attention",
]


# ============================================================================================
# Shared validation and the plain softmax-attention core


def _qkv(q, k, v, *, same_heads=True, self_attention=False):
    """Validate SDPA-layout ``q (..., H, N, d)``, ``k (..., H, M, d)``, ``v (..., H, M, dv)``."""
    q = as_float(q, "q", min_ndim=3)
    k = as_float(k, "k", ndim=q.ndim)
    v = as_float(v, "v", ndim=q.ndim)
    if k.shape[:-3] != q.shape[:-3] or v.shape[:-3] != q.shape[:-3]:
        raise ValueError(f"q, k and v must share their batch axes; got q {q.shape}, k {k.shape}, v {v.shape}")
    if same_heads and (k.shape[-3] != q.shape[-3] or v.shape[-3] != q.shape[-3]):
        raise ValueError(f"q, k and v must have the same number of heads (axis -3); got q {q.shape}, "
                         f"k {k.shape}, v {v.shape}")
    if k.shape[-1] != q.shape[-1]:
        raise ValueError(f"the head width (last axis) of q ({q.shape[-1]}) and k ({k.shape[-1]}) must agree")
    if v.shape[-2] != k.shape[-2]:
        raise ValueError(f"k and v must have the same number of keys (axis -2); got k {k.shape}, v {v.shape}")
    if self_attention and k.shape[-2] != q.shape[-2]:
        raise ValueError(f"this mechanism is self-attention: q and k must have the same length (axis -2); "
                         f"got q {q.shape}, k {k.shape}")
    dt = compute_dtype(q, k, v)
    return q.astype(dt, copy=False), k.astype(dt, copy=False), v.astype(dt, copy=False), dt


def _scale(scale, d):
    # a Python float (not np.float64) so that float32 inputs stay float32 (NEP 50 weak scalars)
    return 1.0 / math.sqrt(d) if scale is None else check_positive(scale, "scale")


def _mask(attn_mask, is_causal, s_shape, *, align="top_left"):
    r"""Combine a user mask and the causal mask into one additive float mask (or None).

    ``align="top_left"`` keeps $j \le i$ (PyTorch SDPA ``is_causal``); ``"bottom_right"`` keeps
    $j \le i + M - N$ (HF GPT-2, used by He & Hofmann's code).
    """
    if not isinstance(is_causal, (bool, np.bool_)):
        raise TypeError(f"is_causal must be a bool; got {type(is_causal).__name__}")
    mask = as_bool_or_float_mask(attn_mask, "attn_mask")
    if mask is not None:
        check_broadcastable("attn_mask", mask.shape, s_shape, "the score map of shape")
        if mask.dtype == np.bool_:
            mask = np.where(mask, 0.0, -np.inf)
    if is_causal:
        n, m = s_shape[-2], s_shape[-1]
        off = 0 if align == "top_left" else m - n
        keep = np.arange(m)[None, :] <= np.arange(n)[:, None] + off
        causal = np.where(keep, 0.0, -np.inf)
        mask = causal if mask is None else mask + causal
    return mask


def _attn_fwd(q, k, mask, scale):
    r"""$P = \mathrm{softmax}(s\,QK^\top + M)$ (fully masked rows are 0)."""
    s = scale * (q @ np.swapaxes(k, -1, -2))
    p, _ = softmax_lse(apply_mask(s, mask), -1)
    return p


def _attn_bwd(dp, p, q, k, scale):
    r"""Given $dP$: $dS = P\odot(dP - \mathrm{rowsum}(P\odot dP))$, $dQ = s\,dS K$, $dK = s\,dS^\top Q$."""
    ds = softmax_vjp(p, dp, -1)
    return scale * (ds @ k), scale * (np.swapaxes(ds, -1, -2) @ q), ds


def _head_param(params, name, h, dt, *, allow_scalar=False):
    x = as_float(params[name], name, max_ndim=1)
    if x.ndim == 0 and allow_scalar:
        return x.astype(dt, copy=False)
    if x.shape != (h,):
        shape = "() or " if allow_scalar else ""
        raise ValueError(f"{name} must have shape {shape}(H,) = ({h},); got {x.shape}")
    return x.astype(dt, copy=False)


def _sum_to(g, shape):
    """Sum a broadcast gradient back to ``shape`` (leading axes and size-1 axes)."""
    while g.ndim > len(shape):
        g = g.sum(axis=0)
    for i, s in enumerate(shape):
        if s == 1 and g.shape[i] != 1:
            g = g.sum(axis=i, keepdims=True)
    return g


# ============================================================================================
# Shaped attention


def _shaped_centre(centre, n, m, dt):
    if centre == "uniform_causal":
        # softmax of all-equal logits under the bottom-right causal mask: C_ij = 1/(i+1+M-N), j <= i+M-N
        off = m - n
        keep = np.arange(m)[None, :] <= np.arange(n)[:, None] + off
        return np.where(keep, 1.0 / (np.arange(n)[:, None] + 1.0 + off), 0.0).astype(dt)
    if centre == "uniform":
        return np.full((n, m), 1.0 / m, dtype=dt)
    return np.zeros((n, m), dtype=dt)


def shaped_attention_forward(q, k, v, params, *, attn_mask=None, is_causal=True, scale=None,
                             centre="uniform_causal"):
    r"""Shaped attention: an identity-centred softmax map (He & Hofmann 2024; Noci et al. 2023).

    $$A_h = \beta_h\,\mathrm{softmax}(s\,Q_hK_h^\top + M) + \alpha_h I - \gamma_h C,\qquad O_h = A_h V_h$$

    with per-head gains $\beta$ = ``attn_mat_resid_gain``, $\alpha$ = ``attn_mat_skip_gain``,
    $\gamma$ = ``centre_attn_gain`` (the upstream parameter names, shape ``(H,)``; upstream stores
    them as ``(1, H, 1, 1)``: pass ``p.reshape(-1)``). $C$ is the softmax of all-equal logits
    under the causal mask, $C_{ij} = 1/(i+1)$ for $j\le i$ (``centre="uniform_causal"``, the
    upstream buffer ``uniform_causal_attn_mat``), or $\frac1M\mathbf 1\mathbf 1^\top$
    (``centre="uniform"``, Noci et al.), or 0 (``"none"``).

    Upstream: bobby-he/simplified_transformers ``simplified_transformers/model_utils.py``
    (``myGPT2Attention._attn``). Conventions there: causal (GPT-2), logits divided by
    $\sqrt{d_v}$ (``value.size(-1)``; equal to $d$ in GPT-2 — refattn's ``scale`` defaults to
    $d^{-1/2}$), causal mask and $I$, $C$ aligned bottom-right ($j \le i + M - N$; upstream
    slices ``diag[:M, :M]``, which only broadcasts when $N = M$ — refattn uses the identity shifted
    by $M-N$ so that $I$ marks each query's own key). A padding ``attn_mask`` does not change $C$
    (as upstream). Noci et al.'s shaped attention is ``alpha = beta = gamma = 1``,
    ``centre="uniform"``, ``is_causal=False`` and ``scale`` $=1/\tau$ with a width-dependent
    temperature $\tau$.

    Parameters
    ----------
    q : (..., H, N, d); k : (..., H, M, d); v : (..., H, M, dv)
    params : dict with ``attn_mat_resid_gain``, ``attn_mat_skip_gain``, ``centre_attn_gain``, each ``(H,)``.
    attn_mask : bool (True keeps) or additive float, broadcastable to ``(..., H, N, M)``.
    is_causal : bool, default True (upstream is a causal LM).
    scale : float, default $d^{-1/2}$.
    centre : {"uniform_causal", "uniform", "none"}.

    Backward
    --------
    With $dA = G V^\top$: $dV = A^\top G$; $d\beta_h = \langle dA_h, P_h\rangle$,
    $d\alpha_h = \langle dA_h, I\rangle$, $d\gamma_h = -\langle dA_h, C\rangle$ (summed over the
    batch); $dP = \beta\,dA$ then the softmax VJP, $dQ = s\,dS K$, $dK = s\,dS^\top Q$. The
    constant maps $I$, $C$ carry no input gradient.
    """
    q, k, v, dt = _qkv(q, k, v, self_attention=False)
    h, n, m = q.shape[-3], q.shape[-2], k.shape[-2]
    check_param_keys(params, ("attn_mat_resid_gain", "attn_mat_skip_gain", "centre_attn_gain"))
    beta = _head_param(params, "attn_mat_resid_gain", h, dt)
    alpha = _head_param(params, "attn_mat_skip_gain", h, dt)
    gamma = _head_param(params, "centre_attn_gain", h, dt)
    check_choice(centre, "centre", ("uniform_causal", "uniform", "none"))
    if m < n:
        raise ValueError(f"shaped attention needs at least as many keys as queries (M >= N) to place the "
                         f"identity; got N={n}, M={m}")
    sc = _scale(scale, q.shape[-1])
    mask = _mask(attn_mask, is_causal, q.shape[:-1] + (m,), align="bottom_right")
    p = _attn_fwd(q, k, mask, sc)
    eye = np.eye(n, m, k=m - n, dtype=dt)
    c = _shaped_centre(centre, n, m, dt)
    a = beta[:, None, None] * p + alpha[:, None, None] * eye - gamma[:, None, None] * c
    out = a @ v
    cache = {"q": q, "k": k, "v": v, "p": p, "a": a, "eye": eye, "c": c, "beta": beta, "scale": sc}
    return out, cache


def shaped_attention_backward(dout, cache):
    """Gradients of :func:`shaped_attention_forward` (derivation in its docstring)."""
    q, k, v, p, a = cache["q"], cache["k"], cache["v"], cache["p"], cache["a"]
    g = as_dout(dout, q.shape[:-1] + (v.shape[-1],), q.dtype)
    da = g @ np.swapaxes(v, -1, -2)
    dv = np.swapaxes(a, -1, -2) @ g
    axes = tuple(range(da.ndim - 3)) + (da.ndim - 2, da.ndim - 1)
    dbeta = np.sum(da * p, axis=axes)
    dalpha = np.sum(da * cache["eye"], axis=axes)
    dgamma = -np.sum(da * cache["c"], axis=axes)
    dq, dk, _ = _attn_bwd(cache["beta"][:, None, None] * da, p, q, k, cache["scale"])
    return {"q": dq, "k": dk, "v": dv, "attn_mat_resid_gain": dbeta, "attn_mat_skip_gain": dalpha,
            "centre_attn_gain": dgamma}


def shaped_attention(q, k, v, params, **config):
    """Convenience wrapper: the output of :func:`shaped_attention_forward`."""
    return shaped_attention_forward(q, k, v, params, **config)[0]


# ============================================================================================
# Momentum attention


def _shift(x, boundary):
    """Lag-1 shift along the token axis (-2): $(Sx)_t = x_{t-1}$; $(Sx)_0 = x_0$ or 0."""
    first = x[..., :1, :] if boundary == "zero_velocity" else np.zeros_like(x[..., :1, :])
    return np.concatenate([first, x[..., :-1, :]], axis=-2)


def _shift_t(y, boundary):
    r"""Adjoint of :func:`_shift`: $(S^\top y)_t = y_{t+1}$ (plus $y_0$ at $t=0$ for "zero_velocity")."""
    out = np.concatenate([y[..., 1:, :], np.zeros_like(y[..., :1, :])], axis=-2)
    if boundary == "zero_velocity":
        out[..., :1, :] += y[..., :1, :]
    return out


def momentum_shear(x, gamma, *, boundary="zero_velocity"):
    r"""$\tilde x_t = x_t + \gamma(x_t - x_{t-1}) = (1+\gamma)x_t - \gamma x_{t-1}$ along the token
    axis -2 of ``x (..., N, d)``; ``gamma`` is a scalar or broadcasts to ``x`` (per head:
    ``(H, 1, 1)``). ``boundary`` as in :func:`momentum_attention_forward`."""
    x = as_float(x, "x", min_ndim=2)
    check_choice(boundary, "boundary", ("zero_velocity", "zero"))
    gamma = as_float(gamma, "gamma")
    check_broadcastable("gamma", gamma.shape, x.shape, "x of shape")
    return x + gamma * (x - _shift(x, boundary))


def momentum_attention_forward(q, k, v, params, *, attn_mask=None, is_causal=True, scale=None,
                               boundary="zero_velocity"):
    r"""Momentum attention (Maitra 2026): a high-pass shear of queries and keys, then softmax attention.

    $$p_t = q_t - q_{t-1},\quad \tilde q_t = q_t + \gamma p_t = (1+\gamma)q_t - \gamma q_{t-1}$$

    and the same for keys (values unchanged); $O = \mathrm{softmax}(s\,\tilde Q\tilde K^\top + M)V$,
    causal by default. Expanding the scores,
    $\tilde q_t\cdot\tilde k_u = (1+\gamma)^2 q_t\cdot k_u - \gamma(1+\gamma)(q_{t-1}\cdot k_u +
    q_t\cdot k_{u-1}) + \gamma^2 q_{t-1}\cdot k_{u-1}$: a signed combination of four shifted score
    maps before the softmax — the differential-family connection.

    Paper: K. Maitra, "Momentum Attention: The Physics of In-Context Learning and Spectral
    Forensics for Mechanistic Interpretability", arXiv 2602.04902 (no public code). Not fixed
    by the paper's abstract/introduction and therefore explicit here (refattn's defaults):

    * ``boundary``: the predecessor of the first token. ``"zero_velocity"`` (default)
      takes $q_{-1} = q_0$, so $p_0 = 0$ and the first token is unchanged; ``"zero"`` takes
      $q_{-1} = 0$, so $\tilde q_0 = (1+\gamma)q_0$.
    * ``gamma``: ``params["gamma"]`` of shape ``()`` (one per layer) or ``(H,)`` (per head).
    * order relative to RoPE: the shear acts on the ``q``, ``k`` passed in; pass rotated
      vectors for "RoPE then shear"; for "shear then RoPE" compose :func:`momentum_shear`,
      RoPE and SDPA (the paper discusses the RoPE/momentum interplay but, in the parts read,
      does not fix the order).

    The paper's γ is a hyper-parameter (scaling law $\gamma^* = 4.17 N^{-0.74}$); refattn returns
    its gradient so that it can also be trained.

    Backward
    --------
    With $dS$ from the standard attention VJP, $d\tilde Q = s\,dS\tilde K$, $d\tilde K =
    s\,dS^\top\tilde Q$, $dV = P^\top G$. The shear is linear: $\tilde q = (1+\gamma)q - \gamma Sq$
    with the lag matrix $S$, so $dq = (1+\gamma)d\tilde q - \gamma S^\top d\tilde q$ (and keys alike),
    and $d\gamma = \langle d\tilde q, q - Sq\rangle + \langle d\tilde k, k - Sk\rangle$ (per head
    or summed over heads).
    """
    q, k, v, dt = _qkv(q, k, v, self_attention=True)
    h = q.shape[-3]
    check_param_keys(params, ("gamma",))
    gamma = _head_param(params, "gamma", h, dt, allow_scalar=True)
    check_choice(boundary, "boundary", ("zero_velocity", "zero"))
    sc = _scale(scale, q.shape[-1])
    mask = _mask(attn_mask, is_causal, q.shape[:-1] + (k.shape[-2],))
    gb = gamma if gamma.ndim == 0 else gamma[:, None, None]
    qd, kd = q - _shift(q, boundary), k - _shift(k, boundary)
    qt, kt = q + gb * qd, k + gb * kd
    p = _attn_fwd(qt, kt, mask, sc)
    out = p @ v
    cache = {"qt": qt, "kt": kt, "qd": qd, "kd": kd, "v": v, "p": p, "gb": gb, "gamma_shape": gamma.shape,
             "scale": sc, "boundary": boundary}
    return out, cache


def momentum_attention_backward(dout, cache):
    """Gradients of :func:`momentum_attention_forward` (derivation in its docstring)."""
    qt, kt, v, p, gb = cache["qt"], cache["kt"], cache["v"], cache["p"], cache["gb"]
    g = as_dout(dout, qt.shape[:-1] + (v.shape[-1],), qt.dtype)
    dv = np.swapaxes(p, -1, -2) @ g
    dqt, dkt, _ = _attn_bwd(g @ np.swapaxes(v, -1, -2), p, qt, kt, cache["scale"])
    b = cache["boundary"]
    dq = (1 + gb) * dqt - gb * _shift_t(dqt, b)
    dk = (1 + gb) * dkt - gb * _shift_t(dkt, b)
    dgam = np.sum(dqt * cache["qd"], axis=(-2, -1)) + np.sum(dkt * cache["kd"], axis=(-2, -1))
    dgam = dgam.sum() if cache["gamma_shape"] == () else dgam.reshape(-1, dgam.shape[-1]).sum(0)
    return {"q": dq, "k": dk, "v": dv, "gamma": np.asarray(dgam, dtype=qt.dtype)}


def momentum_attention(q, k, v, params, **config):
    """Convenience wrapper: the output of :func:`momentum_attention_forward`."""
    return momentum_attention_forward(q, k, v, params, **config)[0]


# ============================================================================================
# PCT offset-attention


def _weight(params, name, n_in, dt, *, n_out=None):
    w = as_float(params[name], name, ndim=2)
    if w.shape[0] != n_in or (n_out is not None and w.shape[1] != n_out):
        want = f"({n_in}, {n_out if n_out is not None else 'out'})"
        raise ValueError(f"{name} must have shape (in, out) = {want}; got {w.shape} "
                         f"(PyTorch stores (out, in): pass its transpose)")
    return w.astype(dt, copy=False)


def _bias(params, name, n, dt):
    b = as_float(params[name], name, ndim=1)
    if b.shape != (n,):
        raise ValueError(f"{name} must have shape ({n},); got {b.shape}")
    return b.astype(dt, copy=False)


def _scalar(params, name, dt):
    x = as_float(params[name], name)
    if x.size != 1 or x.ndim > 1:
        raise ValueError(f"{name} must be a scalar (shape () or (1,)); got shape {x.shape}")
    return x.astype(dt, copy=False)


_PCT_KEYS = ("k_conv.weight", "v_conv.weight", "v_conv.bias", "trans_conv.weight", "trans_conv.bias",
             "after_norm.weight", "after_norm.bias")


def pct_offset_attention_forward(x, params, *, shared_qk=True, scale=1.0, col_eps=1e-9, bn_mode="train",
                                 running_mean=None, running_var=None, bn_eps=1e-5):
    r"""PCT offset-attention layer (Guo et al. 2021), token-major ``x (B, N, C)``.

    $$q = xW_q,\; k = xW_k,\; v = xW_v + b_v,\quad \tilde A = \mathrm{softmax}_j(s\,q k^\top),\quad
    A_{ij} = \frac{\tilde A_{ij}}{\epsilon + \sum_{i'}\tilde A_{i'j}},$$
    $$x_r = A^\top v,\qquad y = x + \mathrm{ReLU}\big(\mathrm{BN}((x - x_r)W_t + b_t)\big).$$

    $x - x_r$ is the "offset" (a discrete-Laplacian-like difference of a token and its
    attention-weighted average): point $j$ receives $\sum_i A_{ij}v_i$ with columns of $A$ summing
    to ~1.

    Upstream: the official PCT is Jittor (MenghaoGuo/PCT); refattn follows the widely used
    PyTorch port Strawberry-Eat-Mango/PCT_Pytorch ``model.py`` ``SA_Layer``: ``q_conv`` and
    ``k_conv`` are bias-free 1x1 convolutions $C\to C/4$ with **tied weights**
    (``shared_qk=True``; then ``params`` has only ``"k_conv.weight"``; ``shared_qk=False`` adds
    ``"q_conv.weight"``), **no** $1/\sqrt d$ (``scale=1.0``), column re-normalisation with
    ``col_eps=1e-9``, BatchNorm1d over channels with statistics over batch and points
    (``bn_mode="train"``, eps 1e-5; ``"eval"`` uses ``running_mean``/``running_var``).
    Weights are ``(in, out)``: a PyTorch ``Conv1d`` weight ``w`` maps as ``w[:, :, 0].T``; input
    ``x_torch (B, C, N)`` is ``x.transpose(0, 2, 1)``.

    ``bn_mode="train"`` couples the batch elements (batch statistics), as upstream in training.

    Backward
    --------
    With $u = \mathrm{BN}(t)$, $t = (x-x_r)W_t + b_t$ and $G = \partial L/\partial y$:
    $dx \mathrel{+}= G$; $du = G\odot[u>0]$; BN (train):
    $dt = \frac{1}{\sqrt{\sigma^2+\epsilon}}(d\hat t - \overline{d\hat t} - \hat t\,\overline{d\hat t\odot\hat t})$
    with $d\hat t = w\odot du$ and means over batch and points; $dw = \sum du\odot\hat t$,
    $db = \sum du$. Then $dz = dt\,W_t^\top$ for $z = x - x_r$: $dx \mathrel{+}= dz$, $dx_r = -dz$.
    $x_r = A^\top v$: $dA = v\,dx_r^\top$, $dv = A\,dx_r$. Column normalisation:
    $d\tilde A_{ij} = (dA_{ij} - \sum_{i'}A_{i'j}dA_{i'j})/(\epsilon + \sum_{i'}\tilde A_{i'j})$; then the
    row-softmax VJP gives $dE$, $dq = s\,dE\,k$, $dk = s\,dE^\top q$, and the projections
    $dW = x^\top d(\cdot)$, $dx \mathrel{+}= dq W_q^\top + dk W_k^\top + dv W_v^\top$ (tied weights
    receive $dW_q + dW_k$).
    """
    x = as_float(x, "x", ndim=3)
    c = x.shape[-1]
    keys = _PCT_KEYS if shared_qk else _PCT_KEYS + ("q_conv.weight",)
    if not isinstance(shared_qk, (bool, np.bool_)):
        raise TypeError(f"shared_qk must be a bool; got {type(shared_qk).__name__}")
    check_param_keys(params, keys)
    dt = compute_dtype(x, *[np.asarray(params[k]) for k in keys if np.asarray(params[k]).dtype.kind == "f"])
    x = x.astype(dt, copy=False)
    wk = _weight(params, "k_conv.weight", c, dt)
    wq = wk if shared_qk else _weight(params, "q_conv.weight", c, dt, n_out=wk.shape[1])
    wv = _weight(params, "v_conv.weight", c, dt, n_out=c)
    bv = _bias(params, "v_conv.bias", c, dt)
    wt = _weight(params, "trans_conv.weight", c, dt, n_out=c)
    bt = _bias(params, "trans_conv.bias", c, dt)
    gw = _bias(params, "after_norm.weight", c, dt)
    gb = _bias(params, "after_norm.bias", c, dt)
    sc = check_positive(scale, "scale")
    col_eps = check_positive(col_eps, "col_eps", allow_zero=True)
    bn_eps = check_positive(bn_eps, "bn_eps")
    check_choice(bn_mode, "bn_mode", ("train", "eval"))
    if bn_mode == "eval":
        if running_mean is None or running_var is None:
            raise ValueError("bn_mode='eval' needs running_mean and running_var of shape (C,)")
        rm = as_float(running_mean, "running_mean", ndim=1)
        rv = as_float(running_var, "running_var", ndim=1)
        if rm.shape != (c,) or rv.shape != (c,):
            raise ValueError(f"running_mean and running_var must have shape ({c},); got {rm.shape}, {rv.shape}")
        if (rv < 0).any():
            raise ValueError("running_var must be >= 0")

    xq, xk = x @ wq, x @ wk
    xv = x @ wv + bv
    at, _ = softmax_lse(sc * (xq @ np.swapaxes(xk, -1, -2)), -1)
    den = col_eps + at.sum(axis=-2, keepdims=True)
    a = at / den
    xr = np.swapaxes(a, -1, -2) @ xv
    z = x - xr
    t = z @ wt + bt
    if bn_mode == "train":
        mu = t.mean(axis=(0, 1))
        var = t.var(axis=(0, 1))
    else:
        mu, var = rm.astype(dt), rv.astype(dt)
    rstd = 1.0 / np.sqrt(var + bn_eps)
    that = (t - mu) * rstd
    u = gw * that + gb
    y = x + np.maximum(u, 0.0)
    cache = {"x": x, "wq": wq, "wk": wk, "wv": wv, "wt": wt, "gw": gw, "xq": xq, "xk": xk, "xv": xv,
             "at": at, "a": a, "den": den, "z": z, "that": that, "rstd": rstd, "u": u, "scale": sc,
             "shared_qk": shared_qk, "bn_mode": bn_mode}
    return y, cache


def pct_offset_attention_backward(dout, cache):
    """Gradients of :func:`pct_offset_attention_forward` (derivation in its docstring)."""
    x = cache["x"]
    g = as_dout(dout, x.shape, x.dtype)
    du = g * (cache["u"] > 0)
    that, rstd = cache["that"], cache["rstd"]
    dgw = np.sum(du * that, axis=(0, 1))
    dgb = np.sum(du, axis=(0, 1))
    dth = du * cache["gw"]
    if cache["bn_mode"] == "train":
        dtt = rstd * (dth - dth.mean(axis=(0, 1)) - that * np.mean(dth * that, axis=(0, 1)))
    else:
        dtt = rstd * dth
    z = cache["z"]
    dwt = z.reshape(-1, z.shape[-1]).T @ dtt.reshape(-1, dtt.shape[-1])
    dbt = dtt.sum(axis=(0, 1))
    dz = dtt @ cache["wt"].T
    dx = g + dz
    dxr = -dz
    a, xv = cache["a"], cache["xv"]
    da = xv @ np.swapaxes(dxr, -1, -2)
    dxv = a @ dxr
    dat = (da - np.sum(a * da, axis=-2, keepdims=True)) / cache["den"]
    de = softmax_vjp(cache["at"], dat, -1) * cache["scale"]
    dxq = de @ cache["xk"]
    dxk = np.swapaxes(de, -1, -2) @ cache["xq"]
    x2 = x.reshape(-1, x.shape[-1])
    dwq = x2.T @ dxq.reshape(-1, dxq.shape[-1])
    dwk = x2.T @ dxk.reshape(-1, dxk.shape[-1])
    dwv = x2.T @ dxv.reshape(-1, dxv.shape[-1])
    dx = dx + dxq @ cache["wq"].T + dxk @ cache["wk"].T + dxv @ cache["wv"].T
    grads = {"x": dx, "v_conv.weight": dwv, "v_conv.bias": dxv.sum(axis=(0, 1)), "trans_conv.weight": dwt,
             "trans_conv.bias": dbt, "after_norm.weight": dgw, "after_norm.bias": dgb}
    if cache["shared_qk"]:
        grads["k_conv.weight"] = dwq + dwk
    else:
        grads["q_conv.weight"], grads["k_conv.weight"] = dwq, dwk
    return grads


def pct_offset_attention(x, params, **config):
    """Convenience wrapper: the output of :func:`pct_offset_attention_forward`."""
    return pct_offset_attention_forward(x, params, **config)[0]


# ============================================================================================
# ReflexSplit cross-stream differential attention


def swin_relative_position_index(window_size) -> np.ndarray:
    r"""Swin's relative-position index ``(N, N)`` into a ``((2w_h-1)(2w_w-1), H)`` bias table,
    $N = w_hw_w$: $\mathrm{idx}_{ij} = (\Delta h + w_h - 1)(2w_w - 1) + \Delta w + w_w - 1$."""
    wh, ww = window_size
    coords = np.stack(np.meshgrid(np.arange(wh), np.arange(ww), indexing="ij")).reshape(2, -1)
    rel = coords[:, :, None] - coords[:, None, :]
    return (rel[0] + wh - 1) * (2 * ww - 1) + rel[1] + ww - 1


def _rs_keys(branch):
    if branch == "sa":
        proj = ("sa_qkv.weight", "sa_qkv.bias")
    else:
        proj = ("ca_q.weight", "ca_q.bias", "ca_kv.weight", "ca_kv.bias")
    return proj + (f"{branch}_cross_trans_proj.weight", f"{branch}_cross_refl_proj.weight",
                   f"{branch}_enhance_weight", f"lambda_{branch}", "relative_position_bias_table",
                   f"proj_{branch}.weight", f"proj_{branch}.bias")


def reflexsplit_dual_stream_attention_forward(x, params, *, num_heads, window_size, branch="sa",
                                               scale=None, lambda_clip=(0.01, 0.99), qkv_bias=True):
    r"""ReflexSplit's cross-stream differential window attention (``DifferentialDualStreamAttention``).

    ``x (B, 2, N, C)`` holds the window tokens of the two streams, transmission
    ($X_T$ = ``x[:, 0]``) and reflection ($X_R$ = ``x[:, 1]``), $N = w_hw_w$. The output has the
    same layout. With $\beta$ = ``{branch}_enhance_weight``:

    $$\tilde X_T = X_T + \beta\,X_R W_{rp},\qquad \tilde X_R = X_R + \beta\,X_T W_{tp}$$
    $$[Q_s, K_s, V_s] = \tilde X_s W_{qkv} + b,\quad A_s = \mathrm{softmax}(s\,Q_sK_s^\top + B_{rel}),\quad
    \lambda = \mathrm{clip}(\sigma(\lambda_{raw}), 0.01, 0.99)$$
    $$O_T = (A_T - \lambda A_R)V_T,\qquad O_R = (A_R - \lambda A_T)V_R,\qquad \mathrm{out}_s = O_sW_p + b_p$$

    — each stream subtracts the *other* stream's map (mutual, antisymmetric differential
    attention). $B_{rel}$ is Swin's relative-position bias (``relative_position_bias_table``
    ``((2w_h-1)(2w_w-1), H)``, shared by both streams and both branches upstream).

    ``branch="sa"`` (``forward_sa``): one ``sa_qkv`` projection ``(C, 3C)`` (columns q | k | v,
    head-major). ``branch="ca"`` (``forward_ca``): Q from ``ca_q`` ``(C, C)`` and K/V from
    ``ca_kv`` ``(C, 2C)`` applied to $[\tilde X_T; \tilde X_R]$ and split back into the two halves —
    since the projection is per token, this is the same map with separate Q and KV weights.
    Upstream's block adds the two branches: ``x_out = sa(x) + ca(x)`` per stream.

    Upstream: wuw2135/ReflexSplit ``models/arch/reflexsplit.py``. Conventions there: no
    GroupNorm/RMSNorm and no $(1-\lambda_{init})$ factor (``lambda_init_fn`` is defined but unused
    in these forwards), ``lambda_clip=(0.01, 0.99)`` (``None`` disables the clamp; the gradient of
    $\lambda_{raw}$ is 0 where the clamp is active), $\lambda_{raw}$ and $\beta$ initialised to 0.1,
    ``qkv_bias=True``, ``scale`` $=d^{-1/2}$ with $d = C/H$. Parameter keys are the upstream names;
    ``*.weight`` are ``(in, out)`` (``linear.weight.T``).

    Backward
    --------
    With $dO_s$ from $dO_s = d\mathrm{out}_sW_p^\top$ (and $dW_p = \sum_s O_s^\top d\mathrm{out}_s$):
    $dV_s = D_s^\top dO_s$ for $D_T = A_T - \lambda A_R$ (and $D_R$); $dD_s = dO_sV_s^\top$;
    $dA_T = dD_T - \lambda\,dD_R$, $dA_R = dD_R - \lambda\,dD_T$;
    $d\lambda = -\langle dD_T, A_R\rangle - \langle dD_R, A_T\rangle$, then
    $d\lambda_{raw} = d\lambda\,\sigma(1-\sigma)$ inside the clamp (0 outside). Softmax VJPs give
    $dS_s$, $dQ_s = s\,dS_sK_s$, $dK_s = s\,dS_s^\top Q_s$; the bias table gathers
    $\sum_{b,s} dS_s$ by scatter-add over the index. Cross paths: $dX_T = d\tilde X_T + \beta\,d\tilde X_R W_{tp}^\top$,
    $dX_R = d\tilde X_R + \beta\,d\tilde X_T W_{rp}^\top$, $dW_{rp} = \beta X_R^\top d\tilde X_T$,
    $dW_{tp} = \beta X_T^\top d\tilde X_R$, $d\beta = \langle d\tilde X_T, X_RW_{rp}\rangle + \langle d\tilde X_R, X_TW_{tp}\rangle$.
    """
    check_choice(branch, "branch", ("sa", "ca"))
    x = as_float(x, "x", ndim=4)
    if x.shape[1] != 2:
        raise ValueError(f"x must have shape (B, 2, N, C) with the two streams on axis 1; got {x.shape}")
    nh = check_int(num_heads, "num_heads", minimum=1)
    if not (isinstance(window_size, (tuple, list)) and len(window_size) == 2):
        raise TypeError(f"window_size must be a pair (w_h, w_w); got {window_size!r}")
    wh, ww = (check_int(w, "window_size", minimum=1) for w in window_size)
    b_, _, n, c = x.shape
    if n != wh * ww:
        raise ValueError(f"x has N={n} tokens per window but window_size {tuple(window_size)} has {wh * ww}")
    if c % nh:
        raise ValueError(f"the channel count C={c} must be divisible by num_heads={nh}")
    if not isinstance(qkv_bias, (bool, np.bool_)):
        raise TypeError(f"qkv_bias must be a bool; got {type(qkv_bias).__name__}")
    keys = _rs_keys(branch)
    bias_keys = {k for k in keys if k.endswith(".bias") and k.startswith(("sa_qkv", "ca_q", "ca_kv"))}
    need = tuple(k for k in keys if qkv_bias or k not in bias_keys)
    check_param_keys(params, need)
    dt = compute_dtype(x, *[np.asarray(params[k]) for k in need if np.asarray(params[k]).dtype.kind == "f"])
    x = x.astype(dt, copy=False)
    P = {}
    if branch == "sa":
        P["w_qkv"] = _weight(params, "sa_qkv.weight", c, dt, n_out=3 * c)
        P["b_qkv"] = _bias(params, "sa_qkv.bias", 3 * c, dt) if qkv_bias else None
    else:
        wq = _weight(params, "ca_q.weight", c, dt, n_out=c)
        wkv = _weight(params, "ca_kv.weight", c, dt, n_out=2 * c)
        P["w_qkv"] = np.concatenate([wq, wkv], axis=1)
        P["b_qkv"] = (np.concatenate([_bias(params, "ca_q.bias", c, dt), _bias(params, "ca_kv.bias", 2 * c, dt)])
                      if qkv_bias else None)
    w_tp = _weight(params, f"{branch}_cross_trans_proj.weight", c, dt, n_out=c)
    w_rp = _weight(params, f"{branch}_cross_refl_proj.weight", c, dt, n_out=c)
    beta = _scalar(params, f"{branch}_enhance_weight", dt)
    lam_raw = _scalar(params, f"lambda_{branch}", dt)
    nt = (2 * wh - 1) * (2 * ww - 1)
    table = as_float(params["relative_position_bias_table"], "relative_position_bias_table", ndim=2)
    if table.shape != (nt, nh):
        raise ValueError(f"relative_position_bias_table must have shape ((2w_h-1)(2w_w-1), H) = ({nt}, {nh}); "
                         f"got {table.shape}")
    table = table.astype(dt, copy=False)
    wp = _weight(params, f"proj_{branch}.weight", c, dt, n_out=c)
    bp = _bias(params, f"proj_{branch}.bias", c, dt)
    hd = c // nh
    sc = _scale(scale, hd)
    if lambda_clip is not None:
        lo, hi = (float(t) for t in lambda_clip)
        if not 0.0 <= lo < hi <= 1.0:
            raise ValueError(f"lambda_clip must be (lo, hi) with 0 <= lo < hi <= 1; got {lambda_clip!r}")

    xt, xr = x[:, 0], x[:, 1]
    e_r = xr @ w_rp
    e_t = xt @ w_tp
    xe = np.stack([xt + beta * e_r, xr + beta * e_t], axis=1)  # (B, 2, N, C)
    qkv = xe @ P["w_qkv"]
    if P["b_qkv"] is not None:
        qkv = qkv + P["b_qkv"]
    qkv = qkv.reshape(b_, 2, n, 3, nh, hd).transpose(3, 0, 1, 4, 2, 5)  # (3, B, 2, H, N, hd)
    q, k, v = qkv[0], qkv[1], qkv[2]
    idx = swin_relative_position_index((wh, ww))
    brel = table[idx.reshape(-1)].reshape(n, n, nh).transpose(2, 0, 1)  # (H, N, N)
    s = sc * (q @ np.swapaxes(k, -1, -2)) + brel
    a, _ = softmax_lse(s, -1)  # (B, 2, H, N, N)
    sig = sigmoid(lam_raw)
    if lambda_clip is None:
        lam, dlam_draw = sig, sig * (1 - sig)
    else:
        lam = np.clip(sig, lo, hi)
        sv = float(sig.reshape(-1)[0])
        dlam_draw = sig * (1 - sig) * float(lo < sv < hi)
    d = a - lam * a[:, ::-1]
    o = d @ v  # (B, 2, H, N, hd)
    om = o.transpose(0, 1, 3, 2, 4).reshape(b_, 2, n, c)
    out = om @ wp + bp
    cache = {"x": x, "xe": xe, "e_r": e_r, "e_t": e_t, "w_tp": w_tp, "w_rp": w_rp, "beta": beta,
             "w_qkv": P["w_qkv"], "has_bias": P["b_qkv"] is not None, "q": q, "k": k, "v": v, "a": a, "d": d,
             "lam": lam, "dlam_draw": dlam_draw, "om": om, "wp": wp, "idx": idx, "nt": nt, "scale": sc,
             "branch": branch, "lam_shape": np.shape(params[f"lambda_{branch}"]),
             "beta_shape": np.shape(params[f"{branch}_enhance_weight"])}
    return out, cache


def reflexsplit_dual_stream_attention_backward(dout, cache):
    """Gradients of :func:`reflexsplit_dual_stream_attention_forward` (derivation in its docstring)."""
    x, br = cache["x"], cache["branch"]
    g = as_dout(dout, x.shape, x.dtype)
    b_, _, n, c = x.shape
    q, k, v, a, d, lam = cache["q"], cache["k"], cache["v"], cache["a"], cache["d"], cache["lam"]
    nh, hd = q.shape[2], q.shape[-1]
    om = cache["om"]
    dwp = om.reshape(-1, c).T @ g.reshape(-1, c)
    dbp = g.sum(axis=(0, 1, 2))
    do = (g @ cache["wp"].T).reshape(b_, 2, n, nh, hd).transpose(0, 1, 3, 2, 4)
    dv = np.swapaxes(d, -1, -2) @ do
    dd = do @ np.swapaxes(v, -1, -2)
    da = dd - lam * dd[:, ::-1]
    dlam = -np.sum(dd * a[:, ::-1])
    dq, dk, ds = _attn_bwd(da, a, q, k, cache["scale"])
    dbrel = ds.sum(axis=(0, 1))  # (H, N, N)
    dtable = np.zeros((cache["nt"], nh), dtype=x.dtype)
    np.add.at(dtable, cache["idx"].reshape(-1), dbrel.transpose(1, 2, 0).reshape(n * n, nh))
    dqkv = np.stack([dq, dk, dv]).transpose(1, 2, 4, 0, 3, 5).reshape(b_, 2, n, 3 * c)
    xe = cache["xe"]
    dw_qkv = xe.reshape(-1, c).T @ dqkv.reshape(-1, 3 * c)
    dxe = dqkv @ cache["w_qkv"].T
    beta = cache["beta"]
    dxe_t, dxe_r = dxe[:, 0], dxe[:, 1]
    dx = np.stack([dxe_t + beta * (dxe_r @ cache["w_tp"].T), dxe_r + beta * (dxe_t @ cache["w_rp"].T)], axis=1)
    dw_rp = beta * (x[:, 1].reshape(-1, c).T @ dxe_t.reshape(-1, c))
    dw_tp = beta * (x[:, 0].reshape(-1, c).T @ dxe_r.reshape(-1, c))
    dbeta = np.sum(dxe_t * cache["e_r"]) + np.sum(dxe_r * cache["e_t"])
    grads = {"x": dx, f"{br}_cross_trans_proj.weight": dw_tp, f"{br}_cross_refl_proj.weight": dw_rp,
             f"{br}_enhance_weight": np.reshape(dbeta, cache["beta_shape"]).astype(x.dtype),
             f"lambda_{br}": np.reshape(dlam * cache["dlam_draw"], cache["lam_shape"]).astype(x.dtype),
             "relative_position_bias_table": dtable, f"proj_{br}.weight": dwp, f"proj_{br}.bias": dbp}
    db_qkv = dqkv.sum(axis=(0, 1, 2))
    if br == "sa":
        grads["sa_qkv.weight"] = dw_qkv
        if cache["has_bias"]:
            grads["sa_qkv.bias"] = db_qkv
    else:
        grads["ca_q.weight"], grads["ca_kv.weight"] = dw_qkv[:, :c], dw_qkv[:, c:]
        if cache["has_bias"]:
            grads["ca_q.bias"], grads["ca_kv.bias"] = db_qkv[:c], db_qkv[c:]
    return grads


def reflexsplit_dual_stream_attention(x, params, **config):
    """Convenience wrapper: the output of :func:`reflexsplit_dual_stream_attention_forward`."""
    return reflexsplit_dual_stream_attention_forward(x, params, **config)[0]


# ============================================================================================
# MALA: magnitude-aware linear attention


def mala_rope_tables(height: int, width: int, head_dim: int, dtype=np.float64):
    r"""MALA's 2-D RoPE tables ``(sin, cos)``, each ``(height*width, head_dim)``.

    As upstream ``RoPE`` (qhfan/MALA ``classfication_release/model.py``): angles
    $\theta_m = 10000^{-m/(d/4-1)}$, $m = 0..d/4-1$ (``linspace(0, 1, d//4)``), each repeated twice;
    the first $d/2$ features rotate with the row index, the last $d/2$ with the column index.
    ``head_dim`` must be a multiple of 4.
    """
    height = check_int(height, "height", minimum=1)
    width = check_int(width, "width", minimum=1)
    head_dim = check_int(head_dim, "head_dim", minimum=4)
    if head_dim % 4:
        raise ValueError(f"head_dim must be a multiple of 4 for MALA's 2-D RoPE; got {head_dim}")
    angle = 1.0 / (10000.0 ** np.linspace(0, 1, head_dim // 4))
    angle = np.repeat(angle, 2)
    ih = np.arange(height, dtype=np.float64)[:, None] * angle[None, :]
    iw = np.arange(width, dtype=np.float64)[:, None] * angle[None, :]
    ang = np.concatenate([np.repeat(ih[:, None, :], width, axis=1), np.repeat(iw[None, :, :], height, axis=0)], -1)
    ang = ang.reshape(height * width, head_dim)
    return np.sin(ang).astype(dtype), np.cos(ang).astype(dtype)


def _rot2(x):
    r"""``rotate_every_two``: pairs $(x_{2i}, x_{2i+1}) \mapsto (-x_{2i+1}, x_{2i})$; its adjoint is $-$itself."""
    out = np.empty_like(x)
    out[..., 0::2] = -x[..., 1::2]
    out[..., 1::2] = x[..., 0::2]
    return out


def _theta(x, sin, cos):
    return x if sin is None else x * cos + _rot2(x) * sin


def _theta_t(y, sin, cos):
    return y if sin is None else y * cos - _rot2(y * sin)


def mala_linear_attention_forward(q, k, v, *, sin=None, cos=None, scale=None, eps=1e-6):
    r"""MALA magnitude-aware linear attention core (Fan et al., ICCV 2025), per head.

    With $\phi(x) = \mathrm{elu}(x)+1$, $s = d^{-1/2}$, $N$ tokens, RoPE $\theta(\cdot)$ (optional):

    $$z_i = s\,\phi(q_i)\cdot\bar k,\quad \bar k = \tfrac1N\textstyle\sum_j\phi(k_j)\qquad(\text{before RoPE})$$
    $$M = \tfrac sN\textstyle\sum_j\theta(\phi(k_j))\,v_j^\top,\qquad
    y_i = \big(1 + \tfrac{1}{z_i+\epsilon}\big)\,\theta(\phi(q_i))^\top M - z_i\,\bar v,\quad \bar v = \tfrac1N\textstyle\sum_jv_j.$$

    Without RoPE this is $y_i = \sum_j w_{ij}v_j$ with $a_{ij} = \frac sN\phi(q_i)\cdot\phi(k_j)$,
    $z_i = \sum_ja_{ij}$ and signed weights $w_{ij} = (1 + 1/(z_i+\epsilon))a_{ij} - z_i/N$ with
    $\sum_j w_{ij} = z_i/(z_i+\epsilon)$ (exactly 1 for $\epsilon = 0$): the query's magnitude now
    changes how peaked the weights are (it cancels in plain linear attention), and weights of keys
    with below-average $a_{ij}$ can become negative.

    Upstream: qhfan/MALA ``classfication_release/model.py`` (``AddLinearAttention.forward``):
    ``z`` uses the pre-RoPE features, RoPE (``theta_shift`` with ``rotate_every_two``, interleaved
    pairs) only in the numerator, the $s/N$ factor split as $\sqrt{s/N}$ on $K$ and $V$, ``eps=1e-6``.
    This function is the attention core: the surrounding layer adds LePE (a depthwise 5x5 conv of
    $V$), multiplies by a fourth 1x1-conv branch $o$ and projects, ``proj((res + lepe) * o)``.
    ``sin``/``cos`` are ``(N, d)`` tables (:func:`mala_rope_tables`) or ``None`` (no RoPE).

    Backward
    --------
    $G = \partial L/\partial y$, $\beta_i = 1 + 1/(z_i+\epsilon)$, $\nu_i = \theta(\phi(q_i))^\top M$:
    $d\nu_i = \beta_iG_i$, $dz_i = -\frac{\nu_i\cdot G_i}{(z_i+\epsilon)^2} - \bar v\cdot G_i$,
    $d\bar v = -\sum_i z_iG_i$; $d\theta(\phi(q)) = d\nu\,M^\top$, $dM = \theta(\phi(Q))^\top d\nu$,
    $d\theta(\phi(k_j)) = \frac sN M'$ with $M' = V\,dM^\top$, $dV = \frac sN\theta(\phi(K))\,dM + \frac1N d\bar v$;
    RoPE adjoint $\theta^\top(y) = y\cos - \mathrm{rot}(y\sin)$; $d\phi(q_i) \mathrel{+}= s\,dz_i\,\bar k$,
    $d\bar k = s\sum_i dz_i\phi(q_i)$, $d\phi(k_j) \mathrel{+}= d\bar k/N$; finally $\phi'$.
    """
    q, k, v, dt = _qkv(q, k, v, self_attention=True)
    n, d = q.shape[-2], q.shape[-1]
    if (sin is None) != (cos is None):
        raise ValueError("sin and cos must be given together (or both None for no RoPE)")
    if sin is not None:
        sin = as_float(sin, "sin", ndim=2)
        cos = as_float(cos, "cos", ndim=2)
        if sin.shape != (n, d) or cos.shape != (n, d):
            raise ValueError(f"sin and cos must have shape (N, d) = ({n}, {d}); got {sin.shape}, {cos.shape}")
        if d % 2:
            raise ValueError(f"RoPE rotates feature pairs: the head width d must be even; got {d}")
        sin, cos = sin.astype(dt, copy=False), cos.astype(dt, copy=False)
    sc = _scale(scale, d)
    eps = check_positive(eps, "eps", allow_zero=True)
    fq, dfq = elu_plus_one(q), elu_plus_one_grad(q)
    fk, dfk = elu_plus_one(k), elu_plus_one_grad(k)
    kbar = fk.mean(axis=-2, keepdims=True)  # (..., 1, d)
    z = sc * (fq @ np.swapaxes(kbar, -1, -2))  # (..., N, 1)
    tq, tk = _theta(fq, sin, cos), _theta(fk, sin, cos)
    m = (sc / n) * (np.swapaxes(tk, -1, -2) @ v)  # (..., d, dv)
    nu = tq @ m
    beta = 1.0 + 1.0 / (z + eps)
    vbar = v.mean(axis=-2, keepdims=True)
    y = nu * beta - z * vbar
    cache = {"v": v, "fq": fq, "dfq": dfq, "dfk": dfk, "kbar": kbar, "z": z, "tq": tq, "tk": tk, "m": m,
             "nu": nu, "beta": beta, "vbar": vbar, "sin": sin, "cos": cos, "scale": sc, "eps": eps}
    return y, cache


def mala_linear_attention_backward(dout, cache):
    """Gradients of :func:`mala_linear_attention_forward` (derivation in its docstring)."""
    v, z, m = cache["v"], cache["z"], cache["m"]
    g = as_dout(dout, cache["nu"].shape, v.dtype)
    n = v.shape[-2]
    sc, sin, cos = cache["scale"], cache["sin"], cache["cos"]
    dnu = g * cache["beta"]
    dz = -np.sum(cache["nu"] * g, axis=-1, keepdims=True) / (z + cache["eps"]) ** 2 \
        - np.sum(cache["vbar"] * g, axis=-1, keepdims=True)
    dvbar = -np.sum(z * g, axis=-2, keepdims=True)
    dtq = dnu @ np.swapaxes(m, -1, -2)
    dm = np.swapaxes(cache["tq"], -1, -2) @ dnu
    dtk = (sc / n) * (v @ np.swapaxes(dm, -1, -2))
    dv = (sc / n) * (cache["tk"] @ dm) + dvbar / n
    dfq = _theta_t(dtq, sin, cos) + sc * dz * cache["kbar"]
    dkbar = sc * np.sum(dz * cache["fq"], axis=-2, keepdims=True)
    dfk = _theta_t(dtk, sin, cos) + dkbar / n
    return {"q": dfq * cache["dfq"], "k": dfk * cache["dfk"], "v": dv}


def mala_linear_attention(q, k, v, **config):
    """Convenience wrapper: the output of :func:`mala_linear_attention_forward`."""
    return mala_linear_attention_forward(q, k, v, **config)[0]


# ============================================================================================
# Multi-Token Attention


def _pad_widths(pad_key, ck, name):
    if pad_key == "both":
        if (ck - 1) % 2:
            raise ValueError(f"{name}: pad_key='both' needs an odd key kernel size; got {ck}")
        return (ck - 1) // 2, (ck - 1) // 2
    return (ck - 1, 0) if pad_key == "left" else (0, ck - 1)


def _kq_conv(x, kern, pad_key):
    r"""Per-head 2-D cross-correlation of score maps ``x (..., H, N, M)`` with ``kern (H, cq, ck)``:
    $y_{h,i,j} = \sum_{a,b}\theta_{h,a,b}\,\tilde x_{h,\,i+a-(c_q-1),\,j+b-p_l}$, zero outside
    (left-only padding of the query axis: causal along queries)."""
    cq, ck = kern.shape[-2:]
    pl, pr = _pad_widths(pad_key, ck, "kernel")
    n, m = x.shape[-2:]
    widths = [(0, 0)] * (x.ndim - 2) + [(cq - 1, 0), (pl, pr)]
    xp = np.pad(x, widths)
    y = np.zeros_like(x)
    for a in range(cq):
        for b in range(ck):
            y += kern[:, a, b][:, None, None] * xp[..., a:a + n, b:b + m]
    return y, xp


def _kq_conv_bwd(dy, xp, kern, pad_key):
    """Adjoint of :func:`_kq_conv`: the input gradient (a transposed convolution) and the kernel gradient."""
    cq, ck = kern.shape[-2:]
    pl, _ = _pad_widths(pad_key, ck, "kernel")
    n, m = dy.shape[-2:]
    dxp = np.zeros_like(xp)
    dk = np.zeros_like(kern)
    red = tuple(range(dy.ndim - 3)) + (dy.ndim - 2, dy.ndim - 1)
    for a in range(cq):
        for b in range(ck):
            dxp[..., a:a + n, b:b + m] += kern[:, a, b][:, None, None] * dy
            dk[:, a, b] = np.sum(dy * xp[..., a:a + n, b:b + m], axis=red)
    return dxp[..., cq - 1:, pl:pl + m], dk


def _head_mix(x, w):
    """$y_{h'} = \\sum_h W_{h,h'} x_h$ over the head axis -3 (``W`` is ``(in, out)``)."""
    return np.einsum("...hij,hg->...gij", x, w)


def _head_mix_bwd(dy, x, w):
    red = np.einsum("bhij,bgij->hg", x.reshape((-1,) + x.shape[-3:]), dy.reshape((-1,) + dy.shape[-3:]))
    return np.einsum("...gij,hg->...hij", dy, w), red


def _head_conv(x, kern):
    """Grouped head convolution: heads split into ``G`` groups of ``c``; $y_{g,h'} = \\sum_h x_{g,h}K_{g,h,h'}$."""
    g, c, _ = kern.shape
    xs = x.reshape(x.shape[:-3] + (g, c) + x.shape[-2:])
    return np.einsum("...ghij,ghk->...gkij", xs, kern).reshape(x.shape)


def _head_conv_bwd(dy, x, kern):
    g, c, _ = kern.shape
    xs = x.reshape((-1, g, c) + x.shape[-2:])
    dys = dy.reshape((-1, g, c) + dy.shape[-2:])
    dk = np.einsum("bghij,bgkij->ghk", xs, dys)
    dx = np.einsum("...gkij,ghk->...ghij", dy.reshape(dy.shape[:-3] + (g, c) + dy.shape[-2:]), kern)
    return dx.reshape(dy.shape), dk


_MTA_KEYS = ("mta_kernel", "wpsm", "mta_kernel_after_sm", "head_kernel", "wposm", "subln.weight", "gate.weight",
             "gate.bias")


def multi_token_attention_forward(q, k, v, params=None, *, attn_mask=None, is_causal=True, scale=None,
                                  pad_key="both", layer_norm_rescale=False, layer_id=0, subln_eps=1e-5):
    r"""Multi-Token Attention core (Golovneva, Wang, Weston, Sukhbaatar 2025), per layer.

    $S_h = s\,Q_hK_h^\top$; every stage below is switched on by the presence of its parameter:

    1. ``mta_kernel`` ``(H, 1, c_q, c_k)``: pre-softmax key–query convolution. Masked entries of
       $S$ are set to 0, the query axis is zero-padded by $(c_q-1, 0)$ (causal), the key axis by
       ``pad_key``: ``"both"`` $((c_k-1)/2, (c_k-1)/2)$ (upstream default; needs odd $c_k$),
       ``"left"`` $(c_k-1, 0)$ or ``"right"`` $(0, c_k-1)$, then per head
       $\hat S_{h,i,j} = \sum_{a,b}\theta_{h,a,b}\,\tilde S_{h,i+a-(c_q-1),j+b-p_l}$.
    2. ``wpsm`` ``(H, H)``: pre-softmax head mixing $\hat S_{h'} = \sum_h W_{h,h'}\hat S_h$.
    3. $A = \mathrm{softmax}(\hat S + M)$ (masked entries removed again).
    4. ``mta_kernel_after_sm``: the same convolution on $A$, then masked entries re-zeroed.
    5. ``head_kernel`` ``(H/c_h, c_h, c_h)``: grouped head convolution
       $A'_{g,h'} = \sum_{h\in g}A_{g,h}K_{g,h,h'}$; or ``wposm`` ``(H, H)``: a full head mix.
    6. $O_h = A'_hV_h$.
    7. ``subln.weight`` ``(d_v,)``: the "group norm", RMSNorm over the head width (eps
       ``subln_eps=1e-5``, affine), times $(1-\lambda_{init})$,
       $\lambda_{init} = 0.8 - 0.6e^{-0.3\,\ell}$ with $\ell$ = ``layer_id``, if ``layer_norm_rescale``.
    8. ``gate.weight`` ``(d_v, 1)`` or ``(d_v, d_v)`` and ``gate.bias``: $O \leftarrow O\odot\sigma(OW_g + b_g)$.

    The output ``(..., H, N, d_v)`` is what upstream feeds to ``wo`` (after merging heads).

    DIFF attention is a special case: $c_h = 2$ with $K = \begin{pmatrix}1 & \cdot\\ -\lambda & \cdot\end{pmatrix}$
    gives $A'_1 = A_1 - \lambda A_2$.

    Upstream: facebookresearch/RAM ``projects/mta/mta_transformer.py`` (``Attention.forward``,
    ``_mta_convolution``, ``_head_convolution``, ``RMSNorm``). Conventions there: causal LM mask
    (top-left, ``triu(-inf, 1)``; ``is_causal=True``), ``pad_key="both"``, softmax in float32,
    ``scale`` $=d^{-1/2}$, K/V already repeated for GQA (pass repeated ``k``, ``v``), parameter
    layouts as upstream (``mta_kernel`` is the ``Conv2d`` weight ``(H, 1, c_q, c_k)``,
    ``head_kernel`` ``(H/c_h, c_h, c_h)`` used as ``A^T @ K``); the ``nn.Linear`` weights are
    ``(in, out)``: ``wpsm = wpsm.weight.T``, ``wposm = wposm.weight.T``, ``gate.weight =
    gate.weight.T``. Upstream's identity init is $\theta_{h,-1,c_k//2} = 1$ (requires ``"both"``),
    identity head mixes. refattn defines fully masked rows as 0 (upstream gives NaN there).

    Backward
    --------
    Reverse order. Gate: $u = OW_g + b_g$, $dO = G\odot\sigma(u) + du\,W_g^\top$ with
    $du = \sum_{\text{gate width}} G\odot O\,\sigma'(u)$, $dW_g = O^\top du$, $db_g = \sum du$.
    RMSNorm VJP (``refattn.nn.norms``). $dA' = dO\,V^\top$, $dV = A'^\top dO$. Head mix:
    $dA_h = \sum_{h'}W_{h,h'}dA'_{h'}$, $dW_{h,h'} = \langle A_h, dA'_{h'}\rangle$ (per group for
    the head convolution). Re-zeroing and the input zeroing pass the gradient only at unmasked
    entries. Convolution: $dx_{i',j'} = \sum_{a,b}\theta_{a,b}\,dy_{i'-a+(c_q-1),\,j'-b+p_l}$ (a
    transposed convolution, computed as the adjoint of the padded correlation),
    $d\theta_{a,b} = \sum_{i,j}dy_{i,j}\tilde x_{i+a-(c_q-1),j+b-p_l}$. Softmax VJP, then
    $dQ = s\,dS K$, $dK = s\,dS^\top Q$.
    """
    q, k, v, dt = _qkv(q, k, v)
    h, m, d = q.shape[-3], k.shape[-2], q.shape[-1]
    dv_ = v.shape[-1]
    params = {} if params is None else params
    check_param_keys(params, (), _MTA_KEYS)
    check_choice(pad_key, "pad_key", ("both", "left", "right"))
    if "head_kernel" in params and "wposm" in params:
        raise ValueError("params may hold 'head_kernel' or 'wposm' (post-softmax head mixing), not both "
                         "(upstream: 'linear head can not be combined with head conv')")
    P = {}
    for name in ("mta_kernel", "mta_kernel_after_sm"):
        if name in params:
            kern = as_float(params[name], name, ndim=4)
            if kern.shape[0] != h or kern.shape[1] != 1:
                raise ValueError(f"{name} must have the Conv2d shape (H, 1, c_q, c_k) with H={h}; got {kern.shape}")
            _pad_widths(pad_key, kern.shape[-1], name)
            P[name] = kern[:, 0].astype(dt, copy=False)
    for name in ("wpsm", "wposm"):
        if name in params:
            P[name] = _weight(params, name, h, dt, n_out=h)
    if "head_kernel" in params:
        hk = as_float(params["head_kernel"], "head_kernel", ndim=3)
        if hk.shape[1] != hk.shape[2] or hk.shape[0] * hk.shape[1] != h:
            raise ValueError(f"head_kernel must have shape (H/c_h, c_h, c_h) with H={h}; got {hk.shape}")
        P["head_kernel"] = hk.astype(dt, copy=False)
    if "subln.weight" in params:
        P["subln.weight"] = _bias(params, "subln.weight", dv_, dt)
    if ("gate.weight" in params) != ("gate.bias" in params):
        raise ValueError("params must hold both 'gate.weight' and 'gate.bias' (nn.Linear(head_dim, 1 or head_dim)) "
                         "or neither")
    if "gate.weight" in params:
        gw = as_float(params["gate.weight"], "gate.weight", ndim=2)
        if gw.shape not in ((dv_, 1), (dv_, dv_)):
            raise ValueError(f"gate.weight must have shape (d_v, 1) or (d_v, d_v) = ({dv_}, 1) or ({dv_}, {dv_}); "
                             f"got {gw.shape}")
        P["gate.weight"] = gw.astype(dt, copy=False)
        P["gate.bias"] = _bias(params, "gate.bias", gw.shape[1], dt)
    if not isinstance(layer_norm_rescale, (bool, np.bool_)):
        raise TypeError(f"layer_norm_rescale must be a bool; got {type(layer_norm_rescale).__name__}")
    layer_id = check_int(layer_id, "layer_id", minimum=0)
    subln_eps = check_positive(subln_eps, "subln_eps")
    sc = _scale(scale, d)
    mask = _mask(attn_mask, is_causal, q.shape[:-1] + (m,))
    removed = None if mask is None else np.broadcast_to(np.isneginf(mask), q.shape[:-1] + (m,))

    c = {"q": q, "k": k, "v": v, "P": P, "scale": sc, "pad_key": pad_key, "removed": removed}
    s = sc * (q @ np.swapaxes(k, -1, -2))
    if "mta_kernel" in P:
        s0 = s if removed is None else np.where(removed, 0.0, s)
        s, c["xp_pre"] = _kq_conv(s0, P["mta_kernel"], pad_key)
    if "wpsm" in P:
        c["s_premix"] = s
        s = _head_mix(s, P["wpsm"])
    a, _ = softmax_lse(apply_mask(s, mask), -1)
    c["a_sm"] = a
    if "mta_kernel_after_sm" in P:
        a, c["xp_post"] = _kq_conv(a, P["mta_kernel_after_sm"], pad_key)
        if removed is not None:
            a = np.where(removed, 0.0, a)
    if "head_kernel" in P or "wposm" in P:
        c["a_premix"] = a
        a = _head_conv(a, P["head_kernel"]) if "head_kernel" in P else _head_mix(a, P["wposm"])
    c["a"] = a
    o = a @ v
    if "subln.weight" in P:
        o, c["rms"] = rms_norm_forward(o, {"weight": P["subln.weight"]}, eps=subln_eps)
        c["rescale"] = 1.0 - (0.8 - 0.6 * math.exp(-0.3 * layer_id)) if layer_norm_rescale else 1.0
        o = o * c["rescale"]
    if "gate.weight" in P:
        c["o_pregate"] = o
        u = o @ P["gate.weight"] + P["gate.bias"]
        c["u"] = u
        o = o * sigmoid(u)
    return o, c


def multi_token_attention_backward(dout, cache):
    """Gradients of :func:`multi_token_attention_forward` (derivation in its docstring)."""
    q, k, v, P, rem = cache["q"], cache["k"], cache["v"], cache["P"], cache["removed"]
    g = as_dout(dout, q.shape[:-1] + (v.shape[-1],), q.dtype)
    grads = {}
    if "gate.weight" in P:
        o, u = cache["o_pregate"], cache["u"]
        gate = sigmoid(u)
        du = g * o * sigmoid_grad(u) if u.shape[-1] > 1 else np.sum(g * o, -1, keepdims=True) * sigmoid_grad(u)
        grads["gate.weight"] = o.reshape(-1, o.shape[-1]).T @ du.reshape(-1, du.shape[-1])
        grads["gate.bias"] = du.reshape(-1, du.shape[-1]).sum(0)
        g = g * gate + du @ P["gate.weight"].T
    if "subln.weight" in P:
        gr = rms_norm_backward(g * cache["rescale"], cache["rms"])
        grads["subln.weight"], g = gr["weight"], gr["x"]
    a = cache["a"]
    dv = np.swapaxes(a, -1, -2) @ g
    da = g @ np.swapaxes(v, -1, -2)
    if "head_kernel" in P:
        da, grads["head_kernel"] = _head_conv_bwd(da, cache["a_premix"], P["head_kernel"])
    elif "wposm" in P:
        da, grads["wposm"] = _head_mix_bwd(da, cache["a_premix"], P["wposm"])
    if "mta_kernel_after_sm" in P:
        if rem is not None:
            da = np.where(rem, 0.0, da)
        da, dker = _kq_conv_bwd(da, cache["xp_post"], P["mta_kernel_after_sm"], cache["pad_key"])
        grads["mta_kernel_after_sm"] = dker[:, None]
    ds = softmax_vjp(cache["a_sm"], da, -1)
    if "wpsm" in P:
        ds, grads["wpsm"] = _head_mix_bwd(ds, cache["s_premix"], P["wpsm"])
    if "mta_kernel" in P:
        ds, dker = _kq_conv_bwd(ds, cache["xp_pre"], P["mta_kernel"], cache["pad_key"])
        grads["mta_kernel"] = dker[:, None]
        if rem is not None:
            ds = np.where(rem, 0.0, ds)
    sc = cache["scale"]
    grads["q"] = sc * (ds @ k)
    grads["k"] = sc * (np.swapaxes(ds, -1, -2) @ q)
    grads["v"] = dv
    return grads


def multi_token_attention(q, k, v, params=None, **config):
    """Convenience wrapper: the output of :func:`multi_token_attention_forward`."""
    return multi_token_attention_forward(q, k, v, params, **config)[0]


# ============================================================================================
# Registry records: samplers, explicit references and identity checks

_PAPER_SHAPED = ("B. He, T. Hofmann, 'Simplifying Transformer Blocks', ICLR 2024, arXiv 2311.01906; "
                 "L. Noci et al., 'The Shaped Transformer', NeurIPS 2023, arXiv 2306.17759")
_PAPER_MOMENTUM = ("K. Maitra, 'Momentum Attention: The Physics of In-Context Learning and Spectral Forensics "
                   "for Mechanistic Interpretability', 2026, arXiv 2602.04902")
_PAPER_PCT = "M.-H. Guo et al., 'PCT: Point Cloud Transformer', Computational Visual Media 2021, arXiv 2012.09688"
_PAPER_REFLEX = "ReflexSplit: dual-stream single-image reflection separation (seed 4-3); code wuw2135/ReflexSplit"
_PAPER_MALA = "Q. Fan et al., 'Rectifying Magnitude Neglect in Linear Attention', ICCV 2025 (MALA)"
_PAPER_MTA = "O. Golovneva, T. Wang, J. Weston, S. Sukhbaatar, 'Multi-Token Attention', 2025, arXiv 2504.00927"


def _rand_qkv(rng, size, *, h=None, same_len=True):
    if size == "tiny":
        b, h, n, d, dv = 2, h or 2, int(rng.integers(2, 5)), int(rng.integers(2, 4)), 2
    else:
        b, h, n, d, dv = 2, h or 3, int(rng.integers(5, 9)), 4, 3
    m = n if same_len else n + int(rng.integers(0, 3))
    return (rng.standard_normal((b, h, n, d)), rng.standard_normal((b, h, m, d)),
            rng.standard_normal((b, h, m, dv)))


def _explicit_softmax(s):
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


# ---- shaped


def _sample_shaped(rng, size):
    q, k, v = _rand_qkv(rng, size, same_len=False)
    h = q.shape[1]
    params = {"attn_mat_resid_gain": 1.0 + 0.3 * rng.standard_normal(h),
              "attn_mat_skip_gain": 1.0 + 0.3 * rng.standard_normal(h),
              "centre_attn_gain": 1.0 + 0.3 * rng.standard_normal(h)}
    return Sample(inputs={"q": q, "k": k, "v": v}, params=params,
                  config={"is_causal": True, "centre": "uniform_causal"})


def _reference_shaped(q, k, v, params, *, attn_mask=None, is_causal=True, scale=None, centre="uniform_causal"):
    # Row by row with explicit loops over the causal prefix (independent of the vectorised path).
    assert attn_mask is None
    n, m, d = q.shape[-2], k.shape[-2], q.shape[-1]
    sc = 1 / np.sqrt(d) if scale is None else scale
    out = np.zeros(q.shape[:-1] + (v.shape[-1],))
    for idx in np.ndindex(q.shape[:-2]):
        hh = idx[-1]
        for i in range(n):
            last = i + m - n if is_causal else m - 1
            logits = np.array([sc * q[idx][i] @ k[idx][j] for j in range(last + 1)])
            p = _explicit_softmax(logits)
            row = np.zeros(m)
            row[: last + 1] = params["attn_mat_resid_gain"][hh] * p
            row[i + m - n] += params["attn_mat_skip_gain"][hh]
            if centre == "uniform_causal":
                row[: i + m - n + 1] -= params["centre_attn_gain"][hh] / (i + m - n + 1)
            elif centre == "uniform":
                row -= params["centre_attn_gain"][hh] / m
            out[idx][i] = row @ v[idx]
    return out


def _check_shaped_identity_at_init(rng):
    # beta = gamma and Q = 0 (upstream's zero-query init): the causal softmax equals C, so A = alpha I.
    _, k, v = _rand_qkv(rng, "small")
    q = np.zeros_like(k)
    h = q.shape[1]
    g = rng.random(h) + 0.5
    params = {"attn_mat_resid_gain": g, "attn_mat_skip_gain": rng.random(h) + 0.5, "centre_attn_gain": g.copy()}
    out = shaped_attention(q, k, v, params)
    err = float(np.abs(out - params["attn_mat_skip_gain"][:, None, None] * v).max())
    assert err < 1e-12, f"A != alpha I at init: {err}"
    return err


def _check_shaped_row_sums(rng):
    q, k, v = _rand_qkv(rng, "small")
    h = q.shape[1]
    params = {n_: rng.standard_normal(h) for n_ in ("attn_mat_resid_gain", "attn_mat_skip_gain", "centre_attn_gain")}
    _, cache = shaped_attention_forward(q, k, v, params)
    want = params["attn_mat_resid_gain"] + params["attn_mat_skip_gain"] - params["centre_attn_gain"]
    err = float(np.abs(cache["a"].sum(-1) - want[:, None]).max())
    assert err < 1e-12, f"rows do not sum to alpha + beta - gamma: {err}"
    return err


def _check_shaped_noci_temperature(rng):
    # Noci et al.: alpha = beta = gamma = 1, uniform centre; tau -> infinity (scale -> 0) gives A -> I.
    q, k, v = _rand_qkv(rng, "small")
    h = q.shape[1]
    ones = {n_: np.ones(h) for n_ in ("attn_mat_resid_gain", "attn_mat_skip_gain", "centre_attn_gain")}
    out = shaped_attention(q, k, v, ones, is_causal=False, centre="uniform", scale=1e-9)
    err = float(np.abs(out - v).max())
    assert err < 1e-7, f"A does not tend to I as tau -> infinity: {err}"
    return err


# ---- momentum


def _sample_momentum(rng, size):
    q, k, v = _rand_qkv(rng, size)
    h = q.shape[1]
    gamma = 0.5 + 0.3 * rng.standard_normal(h) if size == "small" else np.asarray(0.4 + 0.2 * rng.random())
    return Sample(inputs={"q": q, "k": k, "v": v}, params={"gamma": gamma},
                  config={"is_causal": True, "boundary": "zero_velocity" if size == "tiny" else "zero"})


def _reference_momentum(q, k, v, params, *, attn_mask=None, is_causal=True, scale=None, boundary="zero_velocity"):
    # The four-map expansion of the sheared scores, then a causal softmax.
    assert attn_mask is None
    g = np.asarray(params["gamma"])
    g = g if g.ndim == 0 else g[:, None, None]
    n, d = q.shape[-2], q.shape[-1]
    sc = 1 / np.sqrt(d) if scale is None else scale

    def lag(x):
        first = x[..., :1, :] if boundary == "zero_velocity" else 0 * x[..., :1, :]
        return np.concatenate([first, x[..., :-1, :]], axis=-2)

    qq, ql, kk, kl = q, lag(q), k, lag(k)
    dot = lambda a, b: a @ np.swapaxes(b, -1, -2)  # noqa: E731
    s = (1 + g) ** 2 * dot(qq, kk) - g * (1 + g) * (dot(ql, kk) + dot(qq, kl)) + g**2 * dot(ql, kl)
    s = sc * s
    if is_causal:
        s = np.where(np.tril(np.ones((n, n), bool)), s, -np.inf)
    return _explicit_softmax(s) @ v


def _check_momentum_gamma_zero(rng):
    q, k, v = _rand_qkv(rng, "small")
    out = momentum_attention(q, k, v, {"gamma": np.asarray(0.0)})
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    err = float(np.abs(out - _explicit_softmax(s) @ v).max())
    assert err < 1e-12, f"gamma = 0 is not causal SDPA: {err}"
    return err


def _check_momentum_causal(rng):
    q, k, v = _rand_qkv(rng, "small")
    n = q.shape[-2]
    t = n // 2
    params = {"gamma": np.asarray(0.7)}
    out = momentum_attention(q, k, v, params)
    q2, k2, v2 = q.copy(), k.copy(), v.copy()
    for a in (q2, k2, v2):
        a[..., t + 1:, :] += rng.standard_normal(a[..., t + 1:, :].shape)
    out2 = momentum_attention(q2, k2, v2, params)
    err = float(np.abs(out[..., : t + 1, :] - out2[..., : t + 1, :]).max())
    assert err < 1e-14, f"future tokens leak into the past: {err}"
    return err


# ---- PCT


def _pct_params(rng, c, cq, shared=True):
    p = {"k_conv.weight": rng.standard_normal((c, cq)) / np.sqrt(c),
         "v_conv.weight": rng.standard_normal((c, c)) / np.sqrt(c), "v_conv.bias": 0.1 * rng.standard_normal(c),
         "trans_conv.weight": rng.standard_normal((c, c)) / np.sqrt(c),
         "trans_conv.bias": 0.1 * rng.standard_normal(c),
         "after_norm.weight": 1.0 + 0.2 * rng.standard_normal(c), "after_norm.bias": 0.5 * rng.standard_normal(c)}
    if not shared:
        p["q_conv.weight"] = rng.standard_normal((c, cq)) / np.sqrt(c)
    return p


def _sample_pct(rng, size):
    if size == "tiny":
        b, n, c, cq = 2, int(rng.integers(3, 5)), 4, 2
    else:
        b, n, c, cq = 2, int(rng.integers(6, 10)), 8, 2
    x = rng.standard_normal((b, n, c))
    cfg = {"bn_mode": "eval", "running_mean": 0.1 * rng.standard_normal(c),
           "running_var": 0.5 + rng.random(c)}
    return Sample(inputs={"x": x}, params=_pct_params(rng, c, cq), config=cfg)


def _reference_pct(x, params, *, shared_qk=True, scale=1.0, col_eps=1e-9, bn_mode="train", running_mean=None,
                   running_var=None, bn_eps=1e-5):
    # Channels-first as in the PyTorch port: x (B, C, N), weights (out, in).
    assert bn_mode == "eval"
    xc = np.swapaxes(x, 1, 2)
    wk = params["k_conv.weight"].T
    wq = wk if shared_qk else params["q_conv.weight"].T
    x_q = np.swapaxes(np.einsum("oc,bcn->bon", wq, xc), 1, 2)
    x_k = np.einsum("oc,bcn->bon", wk, xc)
    x_v = np.einsum("oc,bcn->bon", params["v_conv.weight"].T, xc) + params["v_conv.bias"][:, None]
    att = _explicit_softmax(scale * np.einsum("bnc,bcm->bnm", x_q, x_k))
    att = att / (col_eps + att.sum(axis=1, keepdims=True))
    x_r = np.einsum("bcn,bnm->bcm", x_v, att)
    t = np.einsum("oc,bcn->bon", params["trans_conv.weight"].T, xc - x_r) + params["trans_conv.bias"][:, None]
    bn = (t - running_mean[:, None]) / np.sqrt(running_var[:, None] + bn_eps)
    bn = params["after_norm.weight"][:, None] * bn + params["after_norm.bias"][:, None]
    return np.swapaxes(xc + np.maximum(bn, 0), 1, 2)


def _check_pct_train_bn_gradcheck(rng):
    from ..testing.gradcheck import gradcheck

    s = _sample_pct(rng, "tiny")
    s = Sample(inputs=s.inputs, params=s.params, config={"bn_mode": "train"})
    return gradcheck(pct_offset_attention_forward, pct_offset_attention_backward, s).max_rel


def _check_pct_columns_and_untied(rng):
    s = _sample_pct(rng, "small")
    _, cache = pct_offset_attention_forward(**s.inputs, params=s.params, **s.config)
    err_col = float(np.abs(cache["a"].sum(axis=-2) - 1).max())
    assert err_col < 1e-8, f"columns of A do not sum to 1: {err_col}"
    p2 = dict(s.params)
    p2["q_conv.weight"] = p2["k_conv.weight"].copy()
    y1 = pct_offset_attention(**s.inputs, params=s.params, **s.config)
    y2, c2 = pct_offset_attention_forward(**s.inputs, params=p2, shared_qk=False, **s.config)
    g = rng.standard_normal(y2.shape)
    gr1 = pct_offset_attention_backward(g, pct_offset_attention_forward(**s.inputs, params=s.params,
                                                                         **s.config)[1])
    gr2 = pct_offset_attention_backward(g, c2)
    err = max(float(np.abs(y1 - y2).max()),
              float(np.abs(gr1["k_conv.weight"] - gr2["k_conv.weight"] - gr2["q_conv.weight"]).max()))
    assert err < 1e-12, f"tied weights != untied with equal weights: {err}"
    return max(err, err_col)


# ---- ReflexSplit


def _reflex_params(rng, c, nh, wh, ww, branch="sa"):
    nt = (2 * wh - 1) * (2 * ww - 1)
    w = lambda i, o: rng.standard_normal((i, o)) / np.sqrt(i)  # noqa: E731
    p = {f"{branch}_cross_trans_proj.weight": w(c, c), f"{branch}_cross_refl_proj.weight": w(c, c),
         f"{branch}_enhance_weight": np.asarray(0.1 + 0.3 * rng.random()),
         f"lambda_{branch}": np.asarray(0.1 + 0.5 * rng.standard_normal()),
         "relative_position_bias_table": 0.3 * rng.standard_normal((nt, nh)),
         f"proj_{branch}.weight": w(c, c), f"proj_{branch}.bias": 0.1 * rng.standard_normal(c)}
    if branch == "sa":
        p["sa_qkv.weight"], p["sa_qkv.bias"] = w(c, 3 * c), 0.1 * rng.standard_normal(3 * c)
    else:
        p["ca_q.weight"], p["ca_q.bias"] = w(c, c), 0.1 * rng.standard_normal(c)
        p["ca_kv.weight"], p["ca_kv.bias"] = w(c, 2 * c), 0.1 * rng.standard_normal(2 * c)
    return p


def _sample_reflex(rng, size, branch="sa"):
    if size == "tiny":
        wh, ww, c, nh = 1, int(rng.integers(2, 4)), 4, 2
    else:
        wh, ww, c, nh = 2, int(rng.integers(2, 4)), 8, 2
    x = rng.standard_normal((2, 2, wh * ww, c))
    return Sample(inputs={"x": x}, params=_reflex_params(rng, c, nh, wh, ww, branch),
                  config={"num_heads": nh, "window_size": (wh, ww), "branch": branch})


def _reference_reflex(x, params, *, num_heads, window_size, branch="sa", scale=None, lambda_clip=(0.01, 0.99),
                      qkv_bias=True):
    # Transcribes the two upstream forwards stream by stream with per-head loops.
    b_, _, n, c = x.shape
    hd = c // num_heads
    sc = hd ** -0.5 if scale is None else scale
    br = branch
    beta = float(params[f"{br}_enhance_weight"])
    xt = x[:, 0] + beta * x[:, 1] @ params[f"{br}_cross_refl_proj.weight"]
    xr = x[:, 1] + beta * x[:, 0] @ params[f"{br}_cross_trans_proj.weight"]
    if br == "sa":
        proj = lambda y: y @ params["sa_qkv.weight"] + params["sa_qkv.bias"]  # noqa: E731
    else:
        proj = lambda y: np.concatenate([y @ params["ca_q.weight"] + params["ca_q.bias"],  # noqa: E731
                                         y @ params["ca_kv.weight"] + params["ca_kv.bias"]], -1)
    idx = swin_relative_position_index(window_size)
    lam = 1 / (1 + np.exp(-float(params[f"lambda_{br}"])))
    if lambda_clip is not None:
        lam = min(max(lam, lambda_clip[0]), lambda_clip[1])
    maps, vals = {}, {}
    for name, xs in (("t", xt), ("r", xr)):
        qkv = proj(xs)
        for hh in range(num_heads):
            qh = qkv[..., hh * hd:(hh + 1) * hd]
            kh = qkv[..., c + hh * hd:c + (hh + 1) * hd]
            vh = qkv[..., 2 * c + hh * hd:2 * c + (hh + 1) * hd]
            bias = params["relative_position_bias_table"][idx, hh]
            maps[name, hh] = _explicit_softmax(sc * np.einsum("bnd,bmd->bnm", qh, kh) + bias)
            vals[name, hh] = vh
    outs = []
    for me, other in (("t", "r"), ("r", "t")):
        o = np.concatenate([(maps[me, hh] - lam * maps[other, hh]) @ vals[me, hh] for hh in range(num_heads)], -1)
        outs.append(o @ params[f"proj_{br}.weight"] + params[f"proj_{br}.bias"])
    return np.stack(outs, axis=1)


def _check_reflex_ca_gradcheck(rng):
    from ..testing.gradcheck import gradcheck

    s = _sample_reflex(rng, "tiny", "ca")
    return gradcheck(reflexsplit_dual_stream_attention_forward, reflexsplit_dual_stream_attention_backward,
                     s).max_rel


def _check_reflex_ca_reference(rng):
    s = _sample_reflex(rng, "small", "ca")
    out = reflexsplit_dual_stream_attention(**s.inputs, params=s.params, **s.config)
    err = float(np.abs(out - _reference_reflex(**s.inputs, params=s.params, **s.config)).max())
    assert err < 1e-12, f"ca branch differs from the transcribed upstream forward: {err}"
    return err


def _check_reflex_swap_symmetry(rng):
    # Swapping the streams and the two cross projections swaps the outputs.
    s = _sample_reflex(rng, "small")
    out = reflexsplit_dual_stream_attention(**s.inputs, params=s.params, **s.config)
    p2 = dict(s.params)
    p2["sa_cross_trans_proj.weight"], p2["sa_cross_refl_proj.weight"] = (s.params["sa_cross_refl_proj.weight"],
                                                                         s.params["sa_cross_trans_proj.weight"])
    out2 = reflexsplit_dual_stream_attention(s.inputs["x"][:, ::-1], params=p2, **s.config)
    err = float(np.abs(out2 - out[:, ::-1]).max())
    assert err < 1e-12, f"stream swap does not swap outputs: {err}"
    return err


def _check_reflex_lambda_zero_and_rows(rng):
    s = _sample_reflex(rng, "small")
    _, cache = reflexsplit_dual_stream_attention_forward(**s.inputs, params=s.params, **s.config)
    err_rows = float(np.abs(cache["d"].sum(-1) - (1 - cache["lam"])).max())
    assert err_rows < 1e-12, f"rows of A_s - lambda A_s' do not sum to 1 - lambda: {err_rows}"
    # lambda -> 0 (clamp off): two independent window attentions (changing stream R leaves out_T).
    p0 = dict(s.params, lambda_sa=np.asarray(-80.0), sa_enhance_weight=np.asarray(0.0))
    x = s.inputs["x"]
    x2 = x.copy()
    x2[:, 1] += rng.standard_normal(x2[:, 1].shape)
    o1 = reflexsplit_dual_stream_attention(x, params=p0, lambda_clip=None, **s.config)
    o2 = reflexsplit_dual_stream_attention(x2, params=p0, lambda_clip=None, **s.config)
    err = float(np.abs(o1[:, 0] - o2[:, 0]).max())
    assert err < 1e-12, f"lambda = 0, beta = 0 still couples the streams: {err}"
    # With the clamp active (sigmoid(-80) < 0.01) lambda_raw receives no gradient.
    out, cache = reflexsplit_dual_stream_attention_forward(x, params=p0, **s.config)
    gr = reflexsplit_dual_stream_attention_backward(np.ones_like(out), cache)
    assert gr["lambda_sa"] == 0 and abs(cache["lam"] - 0.01) < 1e-15, "clamp does not stop the gradient"
    return max(err, err_rows)


# ---- MALA


def _sample_mala(rng, size):
    q, k, v = _rand_qkv(rng, size)
    if size == "tiny":
        return Sample(inputs={"q": q, "k": k, "v": v})
    n = q.shape[-2]
    hgt = 2 if n % 2 == 0 else 1
    sin, cos = mala_rope_tables(hgt, n // hgt, q.shape[-1])
    return Sample(inputs={"q": q, "k": k, "v": v}, config={"sin": sin, "cos": cos})


def _reference_mala(q, k, v, *, sin=None, cos=None, scale=None, eps=1e-6):
    # The explicit N x N signed-weight form: y_i = sum_j [(1 + 1/(z_i+eps)) a~_ij - z_i/N] v_j,
    # a~ with RoPE'd features (numerator), z without.
    n, d = q.shape[-2], q.shape[-1]
    sc = d**-0.5 if scale is None else scale
    phi = lambda x: np.where(x > 0, x + 1, np.exp(np.minimum(x, 0)))  # noqa: E731
    fq, fk = phi(q), phi(k)
    a = (sc / n) * np.einsum("...id,...jd->...ij", fq, fk)
    z = a.sum(-1, keepdims=True)
    if sin is not None:
        def rope(x):
            r = np.stack([-x[..., 1::2], x[..., 0::2]], -1).reshape(x.shape)
            return x * cos + r * sin
        a = (sc / n) * np.einsum("...id,...jd->...ij", rope(fq), rope(fk))
    w = (1 + 1 / (z + eps)) * a - z / n
    return w @ v


def _check_mala_weights_sum(rng):
    q, k, v = _rand_qkv(rng, "small")
    n = q.shape[-2]
    eye = np.broadcast_to(np.eye(n), q.shape[:-2] + (n, n))
    # Feeding V = I reads the weight matrix W itself.
    w = mala_linear_attention(q, k, np.ascontiguousarray(eye), eps=0.0)
    err = float(np.abs(w.sum(-1) - 1).max())
    assert err < 1e-12, f"MALA weights do not sum to 1 (eps = 0): {err}"
    assert (w < 0).any(), "expected some negative weights"
    return err


register(
    Mechanism(
        slug="shaped_attention", family="2-differential", tier="T1",
        title="Shaped attention: beta softmax + alpha I - gamma C (He & Hofmann; Noci et al.)",
        paper=_PAPER_SHAPED, forward=shaped_attention_forward, backward=shaped_attention_backward,
        sample=_sample_shaped, reference=_reference_shaped, docs="differential-relatives.md#shaped-attention",
        checks={"identity_at_init": _check_shaped_identity_at_init, "row_sums": _check_shaped_row_sums,
                "noci_tau_to_infinity": _check_shaped_noci_temperature},
    ),
    Mechanism(
        slug="momentum_attention", family="2-differential", tier="T1",
        title="Momentum attention: high-pass shear (1+g) x_t - g x_{t-1} of queries and keys",
        paper=_PAPER_MOMENTUM, forward=momentum_attention_forward, backward=momentum_attention_backward,
        sample=_sample_momentum, reference=_reference_momentum,
        docs="differential-relatives.md#momentum-attention",
        checks={"gamma_zero_is_sdpa": _check_momentum_gamma_zero, "causal_leakage": _check_momentum_causal},
    ),
    Mechanism(
        slug="pct_offset_attention", family="2-differential", tier="T1",
        title="PCT offset-attention x + ReLU(BN((x - x_r) W_t + b_t)), column-renormalised map",
        paper=_PAPER_PCT, forward=pct_offset_attention_forward, backward=pct_offset_attention_backward,
        sample=_sample_pct, reference=_reference_pct, docs="differential-relatives.md#pct-offset-attention",
        checks={"train_mode_bn_gradcheck": _check_pct_train_bn_gradcheck,
                "columns_sum_to_one_and_tied_weights": _check_pct_columns_and_untied},
    ),
    Mechanism(
        slug="reflexsplit_dual_stream_attention", family="2-differential", tier="T1",
        title="ReflexSplit cross-stream differential window attention (A_T - lambda A_R, A_R - lambda A_T)",
        paper=_PAPER_REFLEX, forward=reflexsplit_dual_stream_attention_forward,
        backward=reflexsplit_dual_stream_attention_backward, sample=_sample_reflex, reference=_reference_reflex,
        docs="differential-relatives.md#reflexsplit-dual-stream-attention",
        checks={"ca_branch_gradcheck": _check_reflex_ca_gradcheck, "ca_branch_reference": _check_reflex_ca_reference,
                "stream_swap_symmetry": _check_reflex_swap_symmetry,
                "lambda_zero_row_sums_clamp": _check_reflex_lambda_zero_and_rows},
    ),
    Mechanism(
        slug="mala_linear_attention", family="2-differential", tier="T1",
        title="MALA magnitude-aware linear attention (signed weights summing to 1)",
        paper=_PAPER_MALA, forward=mala_linear_attention_forward, backward=mala_linear_attention_backward,
        sample=_sample_mala, reference=_reference_mala, docs="differential-relatives.md#mala-linear-attention",
        checks={"weights_sum_to_one": _check_mala_weights_sum},
    ),
)


# ---- Multi-Token Attention


def _sample_mta(rng, size):
    if size == "tiny":
        b, h, n, d = 2, 2, int(rng.integers(3, 5)), 2
        ker = (2, 3)
    else:
        b, h, n, d = 2, 4, int(rng.integers(6, 9)), 3
        ker = (3, 3)
    pad = "both" if size == "tiny" else "left"
    q, k = (rng.standard_normal((b, h, n, d)) for _ in range(2))
    # larger values keep A'V away from 0, where the RMS "group norm" is sharply curved and
    # central differences lose digits (curvature, not a kink)
    v = 3.0 * rng.standard_normal((b, h, n, d))
    params = {"mta_kernel": 0.5 * rng.standard_normal((h, 1) + ker),
              "wpsm": np.eye(h) + 0.3 * rng.standard_normal((h, h)),
              "mta_kernel_after_sm": _identity_mta_params(h, *ker, pad_key=pad)["mta_kernel"]
              + 0.2 * rng.standard_normal((h, 1) + ker),
              "subln.weight": 1.0 + 0.2 * rng.standard_normal(d)}
    if size == "tiny":
        params["head_kernel"] = np.eye(2)[None] + 0.3 * rng.standard_normal((1, 2, 2))
        params["gate.weight"], params["gate.bias"] = rng.standard_normal((d, 1)), 0.1 * rng.standard_normal(1)
        cfg = {"is_causal": True, "pad_key": "both"}
    else:
        params["wposm"] = np.eye(h) + 0.2 * rng.standard_normal((h, h))
        params["gate.weight"], params["gate.bias"] = rng.standard_normal((d, d)), 0.1 * rng.standard_normal(d)
        cfg = {"is_causal": True, "pad_key": pad, "layer_norm_rescale": True, "layer_id": 3}
    return Sample(inputs={"q": q, "k": k, "v": v}, params=params, config=cfg)


def _reference_mta(q, k, v, params=None, *, attn_mask=None, is_causal=True, scale=None, pad_key="both",
                   layer_norm_rescale=False, layer_id=0, subln_eps=1e-5):
    # Element-wise index arithmetic for the convolutions (independent of the padded-slice path).
    assert attn_mask is None and is_causal
    params = params or {}
    b_, h, n, d = q.shape
    m = k.shape[-2]
    sc = d**-0.5 if scale is None else scale
    keep = np.arange(m)[None, :] <= np.arange(n)[:, None]

    def conv(x, kern):
        cq, ck = kern.shape[-2:]
        pl = {"both": (ck - 1) // 2, "left": ck - 1, "right": 0}[pad_key]
        y = np.zeros_like(x)
        for bb, hh, i, j in np.ndindex(x.shape):
            acc = 0.0
            for a in range(cq):
                for c_ in range(ck):
                    ii, jj = i + a - (cq - 1), j + c_ - pl
                    if 0 <= ii < n and 0 <= jj < m:
                        acc += kern[hh, 0, a, c_] * x[bb, hh, ii, jj]
            y[bb, hh, i, j] = acc
        return y

    s = sc * np.einsum("bhnd,bhmd->bhnm", q, k)
    if "mta_kernel" in params:
        s = conv(np.where(keep, s, 0.0), params["mta_kernel"])
    if "wpsm" in params:
        s = np.einsum("bhnm,hg->bgnm", s, params["wpsm"])
    a = _explicit_softmax(np.where(keep, s, -np.inf))
    if "mta_kernel_after_sm" in params:
        a = np.where(keep, conv(a, params["mta_kernel_after_sm"]), 0.0)
    if "head_kernel" in params:
        hk = params["head_kernel"]
        c_h = hk.shape[1]
        a2 = np.zeros_like(a)
        for hp in range(h):
            grp, j = divmod(hp, c_h)
            for i in range(c_h):
                a2[:, hp] += a[:, grp * c_h + i] * hk[grp, i, j]
        a = a2
    elif "wposm" in params:
        a = np.einsum("bhnm,hg->bgnm", a, params["wposm"])
    o = a @ v
    if "subln.weight" in params:
        o = o / np.sqrt(np.mean(o**2, -1, keepdims=True) + subln_eps) * params["subln.weight"]
        if layer_norm_rescale:
            o = o * (1 - (0.8 - 0.6 * np.exp(-0.3 * layer_id)))
    if "gate.weight" in params:
        o = o / (1 + np.exp(-(o @ params["gate.weight"] + params["gate.bias"])))
    return o


def _identity_mta_params(h, cq, ck, c_h=None, pad_key="both"):
    # The tap that reads entry (i, j) itself: upstream's identity init for "both" is [-1, ck // 2].
    kern = np.zeros((h, 1, cq, ck))
    kern[:, 0, -1, {"both": ck // 2, "left": ck - 1, "right": 0}[pad_key]] = 1.0
    p = {"mta_kernel": kern, "wpsm": np.eye(h), "mta_kernel_after_sm": kern.copy()}
    if c_h is not None:
        p["head_kernel"] = np.repeat(np.eye(c_h)[None], h // c_h, axis=0)
    return p


def _check_mta_identity_is_sdpa(rng):
    q, k, v = (rng.standard_normal((2, 4, 7, 3)) for _ in range(3))
    out = multi_token_attention(q, k, v, _identity_mta_params(4, 3, 5, c_h=2))
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(3)
    s = np.where(np.tril(np.ones((7, 7), bool)), s, -np.inf)
    err = float(np.abs(out - _explicit_softmax(s) @ v).max())
    assert err < 1e-12, f"identity kernels do not reproduce causal SDPA: {err}"
    return err


def _check_mta_diff_special_case(rng):
    # c_h = 2 post-softmax head convolution with K = [[1, 0], [-lambda, 1]]: head 0 is DIFF attention.
    from .differential import diff_attention_core

    q, k, v = (rng.standard_normal((2, 2, 6, 3)) for _ in range(3))
    lam = 0.63
    out = multi_token_attention(q, k, v, {"head_kernel": np.array([[[1.0, 0.0], [-lam, 1.0]]])})
    ref = diff_attention_core(q[:, :1], k[:, :1], q[:, 1:], k[:, 1:], v[:, :1], np.array([lam]), is_causal=True)
    err = float(np.abs(out[:, :1] - ref).max())
    assert err < 1e-12, f"MTA head mixing does not reproduce diff_attention_core: {err}"
    return err


def _check_mta_causal(rng):
    s = _sample_mta(rng, "small")
    q, k, v = (s.inputs[x] for x in "qkv")
    for pad in ("both", "left", "right"):
        cfg = dict(s.config, pad_key=pad)
        out = multi_token_attention(q, k, v, s.params, **cfg)
        t = q.shape[-2] // 2
        q2, k2, v2 = q.copy(), k.copy(), v.copy()
        for a in (q2, k2, v2):
            a[..., t + 1:, :] += rng.standard_normal(a[..., t + 1:, :].shape)
        out2 = multi_token_attention(q2, k2, v2, s.params, **cfg)
        err = float(np.abs(out[..., : t + 1, :] - out2[..., : t + 1, :]).max())
        assert err < 1e-14, f"pad_key={pad}: future tokens leak into the past: {err}"
    return 0.0


def _check_mta_conv_adjoint(rng):
    x = rng.standard_normal((2, 3, 5, 6))
    kern = rng.standard_normal((3, 3, 5))
    y, xp = _kq_conv(x, kern, "both")
    g = rng.standard_normal(y.shape)
    dx, dk = _kq_conv_bwd(g, xp, kern, "both")
    err = abs(float(np.sum(y * g)) - float(np.sum(x * dx))) / abs(float(np.sum(y * g)))
    err_k = abs(float(np.sum(y * g)) - float(np.sum(kern * dk))) / abs(float(np.sum(y * g)))
    assert max(err, err_k) < 1e-12, f"<conv x, g> != <x, conv^T g>: {err}, {err_k}"
    return max(err, err_k)


register(
    Mechanism(
        slug="multi_token_attention", family="2-differential", tier="T1",
        title="Multi-Token Attention: key-query convolution, head mixing, RMS group norm, gating",
        paper=_PAPER_MTA, forward=multi_token_attention_forward, backward=multi_token_attention_backward,
        sample=_sample_mta, reference=_reference_mta, docs="differential-relatives.md#multi-token-attention",
        checks={"identity_kernels_are_sdpa": _check_mta_identity_is_sdpa,
                "diff_special_case": _check_mta_diff_special_case, "causal_leakage": _check_mta_causal,
                "conv_adjoint": _check_mta_conv_adjoint},
    ),
)
