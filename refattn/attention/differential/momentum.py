r"""Momentum attention: a high-pass shear $(1+\gamma)q_t - \gamma q_{t-1}$ of queries and keys.

The shear is applied to queries and keys before causal softmax attention; expanding the scores
gives a signed combination of four shifted score maps before the softmax — the connection to the
differential family:

$$\tilde q_t\cdot\tilde k_u = (1+\gamma)^2 q_t\cdot k_u - \gamma(1+\gamma)(q_{t-1}\cdot k_u +
  q_t\cdot k_{u-1}) + \gamma^2 q_{t-1}\cdot k_{u-1}.$$

Backward: the attention VJP gives $d\tilde Q$, $d\tilde K$; the shear is linear,
$dq = (1+\gamma)d\tilde q - \gamma S^\top d\tilde q$ with the lag matrix $S$, and
$d\gamma = \langle d\tilde q, q - Sq\rangle + \langle d\tilde k, k - Sk\rangle$.

Paper: K. Maitra, "Momentum Attention: The Physics of In-Context Learning and Spectral Forensics
for Mechanistic Interpretability", 2026, arXiv 2602.04902 (no public code); the boundary, γ's
shape and the order relative to RoPE are explicit choices of `momentum_attention_forward`.

Layouts: PyTorch SDPA for attention cores (``q (B, H, N, d)``), token-major ``x (B, N, C)`` for
layers; weights ``(in, out)`` (PyTorch: ``linear.weight.T``; a 1x1 ``Conv1d``/``Conv2d`` weight
``w[:, :, 0].T``); parameter keys are the upstream modules' ``state_dict`` names so a checkpoint
maps over key by key. Every forward returns ``(out, cache)`` and every backward a ``dict`` of
gradients for all inputs and parameters; see also ``docs/differential-relatives.md``.
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, check_broadcastable, check_choice, check_param_keys
from ...registry import Mechanism, Sample, register
from ._samples import explicit_softmax, rand_qkv
from .core import additive_mask, per_head_param, resolve_scale, softmax_map_backward, softmax_map_forward, validate_qkv

__all__ = [
    "momentum_shear",
    "momentum_attention_forward",
    "momentum_attention_backward",
    "momentum_attention",
]


_PAPER_MOMENTUM = ("K. Maitra, 'Momentum Attention: The Physics of In-Context Learning and Spectral Forensics "
                   "for Mechanistic Interpretability', 2026, arXiv 2602.04902")


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
    q, k, v, dt = validate_qkv(q, k, v, self_attention=True)
    h = q.shape[-3]
    check_param_keys(params, ("gamma",))
    gamma = per_head_param(params, "gamma", h, dt, allow_scalar=True)
    check_choice(boundary, "boundary", ("zero_velocity", "zero"))
    sc = resolve_scale(scale, q.shape[-1])
    mask = additive_mask(attn_mask, is_causal, q.shape[:-1] + (k.shape[-2],))
    gb = gamma if gamma.ndim == 0 else gamma[:, None, None]
    qd, kd = q - _shift(q, boundary), k - _shift(k, boundary)
    qt, kt = q + gb * qd, k + gb * kd
    p = softmax_map_forward(qt, kt, mask, sc)
    out = p @ v
    cache = {"qt": qt, "kt": kt, "qd": qd, "kd": kd, "v": v, "p": p, "gb": gb, "gamma_shape": gamma.shape,
             "scale": sc, "boundary": boundary}
    return out, cache


def momentum_attention_backward(dout, cache):
    """Gradients of :func:`momentum_attention_forward` (derivation in its docstring)."""
    qt, kt, v, p, gb = cache["qt"], cache["kt"], cache["v"], cache["p"], cache["gb"]
    g = as_dout(dout, qt.shape[:-1] + (v.shape[-1],), qt.dtype)
    dv = np.swapaxes(p, -1, -2) @ g
    dqt, dkt, _ = softmax_map_backward(g @ np.swapaxes(v, -1, -2), p, qt, kt, cache["scale"])
    b = cache["boundary"]
    dq = (1 + gb) * dqt - gb * _shift_t(dqt, b)
    dk = (1 + gb) * dkt - gb * _shift_t(dkt, b)
    dgam = np.sum(dqt * cache["qd"], axis=(-2, -1)) + np.sum(dkt * cache["kd"], axis=(-2, -1))
    dgam = dgam.sum() if cache["gamma_shape"] == () else dgam.reshape(-1, dgam.shape[-1]).sum(0)
    return {"q": dq, "k": dk, "v": dv, "gamma": np.asarray(dgam, dtype=qt.dtype)}


def momentum_attention(q, k, v, params, **config):
    """Convenience wrapper: the output of :func:`momentum_attention_forward`."""
    return momentum_attention_forward(q, k, v, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample_momentum(rng, size):
    q, k, v = rand_qkv(rng, size)
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
    return explicit_softmax(s) @ v


def _check_momentum_gamma_zero(rng):
    q, k, v = rand_qkv(rng, "small")
    out = momentum_attention(q, k, v, {"gamma": np.asarray(0.0)})
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    err = float(np.abs(out - explicit_softmax(s) @ v).max())
    assert err < 1e-12, f"gamma = 0 is not causal SDPA: {err}"
    return err


def _check_momentum_causal(rng):
    q, k, v = rand_qkv(rng, "small")
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


register(
    Mechanism(
        slug="momentum_attention", family="2-differential", tier="T1",
        title="Momentum attention: high-pass shear (1+g) x_t - g x_{t-1} of queries and keys",
        paper=_PAPER_MOMENTUM, forward=momentum_attention_forward, backward=momentum_attention_backward,
        sample=_sample_momentum, reference=_reference_momentum,
        docs="differential-relatives.md#momentum-attention",
        checks={"gamma_zero_is_sdpa": _check_momentum_gamma_zero, "causal_leakage": _check_momentum_causal},
    ),
)
