r"""Shaped attention: $A = \beta\,\mathrm{softmax}(S) + \alpha I - \gamma C$ (He & Hofmann; Noci et al.).

A relative of differential attention: a softmax map centred by subtracting a fixed
"common-mode" map $C$ (the softmax of all-equal logits under the causal mask, or uniform), plus
a scaled identity, per head:

$$A_h = \beta_h\,\mathrm{softmax}(s\,Q_hK_h^\top + M) + \alpha_h I - \gamma_h C,\qquad O_h = A_h V_h .$$

Backward: $dA = GV^\top$, $dV = A^\top G$, $d\beta_h = \langle dA_h, P_h\rangle$,
$d\alpha_h = \langle dA_h, I\rangle$, $d\gamma_h = -\langle dA_h, C\rangle$, then the softmax VJP
of $\beta\,dA$ (details in `shaped_attention_forward`).

Papers: B. He, T. Hofmann, "Simplifying Transformer Blocks", ICLR 2024, arXiv 2311.01906;
L. Noci et al., "The Shaped Transformer", NeurIPS 2023, arXiv 2306.17759. Upstream:
bobby-he/simplified_transformers ``simplified_transformers/model_utils.py``
(``myGPT2Attention._attn``).

Layouts: PyTorch SDPA for attention cores (``q (B, H, N, d)``), token-major ``x (B, N, C)`` for
layers; weights ``(in, out)`` (PyTorch: ``linear.weight.T``; a 1x1 ``Conv1d``/``Conv2d`` weight
``w[:, :, 0].T``); parameter keys are the upstream modules' ``state_dict`` names so a checkpoint
maps over key by key. Every forward returns ``(out, cache)`` and every backward a ``dict`` of
gradients for all inputs and parameters; see also ``docs/differential-relatives.md``.
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, check_choice, check_param_keys
from ...registry import Mechanism, Sample, register
from ._samples import explicit_softmax, rand_qkv
from .core import additive_mask, per_head_param, resolve_scale, softmax_map_backward, softmax_map_forward, validate_qkv

__all__ = [
    "shaped_attention_forward",
    "shaped_attention_backward",
    "shaped_attention",
]


_PAPER_SHAPED = ("B. He, T. Hofmann, 'Simplifying Transformer Blocks', ICLR 2024, arXiv 2311.01906; "
                 "L. Noci et al., 'The Shaped Transformer', NeurIPS 2023, arXiv 2306.17759")


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
    q, k, v, dt = validate_qkv(q, k, v, self_attention=False)
    h, n, m = q.shape[-3], q.shape[-2], k.shape[-2]
    check_param_keys(params, ("attn_mat_resid_gain", "attn_mat_skip_gain", "centre_attn_gain"))
    beta = per_head_param(params, "attn_mat_resid_gain", h, dt)
    alpha = per_head_param(params, "attn_mat_skip_gain", h, dt)
    gamma = per_head_param(params, "centre_attn_gain", h, dt)
    check_choice(centre, "centre", ("uniform_causal", "uniform", "none"))
    if m < n:
        raise ValueError(f"shaped attention needs at least as many keys as queries (M >= N) to place the "
                         f"identity; got N={n}, M={m}")
    sc = resolve_scale(scale, q.shape[-1])
    mask = additive_mask(attn_mask, is_causal, q.shape[:-1] + (m,), align="bottom_right")
    p = softmax_map_forward(q, k, mask, sc)
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
    dq, dk, _ = softmax_map_backward(cache["beta"][:, None, None] * da, p, q, k, cache["scale"])
    return {"q": dq, "k": dk, "v": dv, "attn_mat_resid_gain": dbeta, "attn_mat_skip_gain": dalpha,
            "centre_attn_gain": dgamma}


def shaped_attention(q, k, v, params, **config):
    """Convenience wrapper: the output of :func:`shaped_attention_forward`."""
    return shaped_attention_forward(q, k, v, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample_shaped(rng, size):
    q, k, v = rand_qkv(rng, size, same_len=False)
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
            p = explicit_softmax(logits)
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
    _, k, v = rand_qkv(rng, "small")
    q = np.zeros_like(k)
    h = q.shape[1]
    g = rng.random(h) + 0.5
    params = {"attn_mat_resid_gain": g, "attn_mat_skip_gain": rng.random(h) + 0.5, "centre_attn_gain": g.copy()}
    out = shaped_attention(q, k, v, params)
    err = float(np.abs(out - params["attn_mat_skip_gain"][:, None, None] * v).max())
    assert err < 1e-12, f"A != alpha I at init: {err}"
    return err


def _check_shaped_row_sums(rng):
    q, k, v = rand_qkv(rng, "small")
    h = q.shape[1]
    params = {n_: rng.standard_normal(h) for n_ in ("attn_mat_resid_gain", "attn_mat_skip_gain", "centre_attn_gain")}
    _, cache = shaped_attention_forward(q, k, v, params)
    want = params["attn_mat_resid_gain"] + params["attn_mat_skip_gain"] - params["centre_attn_gain"]
    err = float(np.abs(cache["a"].sum(-1) - want[:, None]).max())
    assert err < 1e-12, f"rows do not sum to alpha + beta - gamma: {err}"
    return err


def _check_shaped_noci_temperature(rng):
    # Noci et al.: alpha = beta = gamma = 1, uniform centre; tau -> infinity (scale -> 0) gives A -> I.
    q, k, v = rand_qkv(rng, "small")
    h = q.shape[1]
    ones = {n_: np.ones(h) for n_ in ("attn_mat_resid_gain", "attn_mat_skip_gain", "centre_attn_gain")}
    out = shaped_attention(q, k, v, ones, is_causal=False, centre="uniform", scale=1e-9)
    err = float(np.abs(out - v).max())
    assert err < 1e-7, f"A does not tend to I as tau -> infinity: {err}"
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
)
