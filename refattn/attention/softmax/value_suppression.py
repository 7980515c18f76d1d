r"""Value-space parallel-component suppression (XSA family): edit each head's attention output along its own value.

Causal multi-head self-attention (nanoGPT layout) in which, per head and token, the attention
output $y_i = \sum_j a_{ij}v_j$ is decomposed relative to the token's *own* value $v_i$ before the
output projection,

$$c_i = \frac{\langle y_i, v_i\rangle}{\max(\|v_i\|^2, 10^{-6})},\qquad y_i = c_iv_i + y_i^{\perp},$$

and the parallel component is edited (``op``, with scalars $\alpha$ and $\sigma$ = ``subtract_scale``):

| ``op`` | $y_i'$ | $(\lambda_y, \lambda_v)$ |
|---|---|---|
| ``"remove_parallel"`` (default) | $y_i - \sigma\alpha\,c_iv_i$ | $(1, -\sigma\alpha)$ |
| ``"keep_parallel"`` | $\alpha\,c_iv_i$ | $(0, \alpha)$ |
| ``"add_parallel"`` | $y_i + \alpha\,c_iv_i$ | $(1, \alpha)$ |
| ``"negate_parallel"`` | $y_i - \sigma(1+\alpha)\,c_iv_i$ | $(1, -\sigma(1+\alpha))$ |

so $y_i' = \gamma(\lambda_y y_i + \lambda_v c_iv_i)$ ($\gamma$ an optional output scale), and
$Y = [y'_1\|\dots]W_{proj} + b_{proj}$. With the defaults ($\alpha = \sigma = 1$) the attention update
of every head is perpendicular to the token's own value: "full-aggregate parallel suppression",
the paper's training-time intervention (the strict "pre-``o_proj`` self-value" variant).

Backward
--------
With $g = \partial L/\partial y'_i$ (after $\gamma$) and $r = \|v_i\|^2$ (unclamped; the sampler
keeps $r > 10^{-6}$), $\partial c/\partial y = v/r$ and $\partial c/\partial v = y/r - 2c\,v/r$:

$$dy_i = \lambda_y g + \lambda_v\frac{\langle g, v_i\rangle}{r}v_i,\qquad
dv_i^{\text{direct}} = \lambda_v\Big(c_i\,g + \frac{\langle g, v_i\rangle}{r}\,y_i - 2c_i\frac{\langle g, v_i\rangle}{r}v_i\Big)$$

(where the clamp is active the $r$-terms drop: $dv_i^{\text{direct}} = \lambda_v(c_ig + \langle g,v_i\rangle
y_i/r)$). $dy$ goes through the attention VJP (`attention_core_backward`), which adds its own $dV$;
then RoPE's transpose rotation, the fused ``c_attn`` projection and ``c_proj`` (`linear_vjp`).

Conventions (keyword, default = upstream)
-----------------------------------------
``op`` ("remove_parallel"), ``alpha`` (1.0), ``subtract_scale`` (1.0), ``gamma`` (1.0; upstream's learnable
$\gamma$, $\alpha$ and gate are training extras and off by default: fixed floats here), ``use_rope``
(True, ``GPTConfig.use_rope``; interleaved pairs $(2m, 2m+1)$ as upstream ``rotate_half``),
``rope_base`` (10000), causal. Parameter names: ``c_attn.weight`` $(C, 3E)$ (torch ``weight.T``, columns
$[q|k|v]$, head-major inside each), ``c_proj.weight`` $(E, C)$, optional biases (``config.bias``). Left out:
the residual-reference variant (edit relative to the hidden state), the legacy post-``o_proj`` variant,
and the inference-time exclude-self edit of the evaluation hooks.

Paper: S. He et al., "Demystifying Transformers through Representation Geometries" (functional
geometry of transformer updates, parallel/perpendicular decomposition), 2026, project repository
Shwai-He/Transformer-Geometry. Upstream: Shwai-He/Transformer-Geometry
``_imports/from_MMEBarch_research_snapshot_2026-05-09/neurips_supplement_anonymous_code/pretraining_nanogpt/core/model.py``
(``CausalSelfAttention.forward`` with ``pre_proj_self_value_op``, ``_apply_parallel_op_per_head``;
``Block.forward``, ``xsa_forward_ref="self_value"``, ``xsa_forward_space="pre_o_proj"``) @
ed6af0b633c1ef0e1a944cbef4721397fbfea7f1.

Measured agreement (float64, CPU, torch 2.13): the repository snapshot could not be fetched, so the
file was read through the code index and the functions that matter (``rotate_half``,
``apply_rotary_pos_emb``, ``_apply_parallel_op_per_head`` and the manual-softmax path of
``CausalSelfAttention.forward`` with ``pre_proj_self_value_op``) were transcribed into a torch scratch
script (RoPE tables rebuilt in float64) and run with autograd: all four ops with
$(\alpha, \sigma, \gamma)\in\{(1, 1, 1), (0.5, 0.7, 1.3)\}$, RoPE on and off, $C=8$, $h=2$, $d=4$, $N=6$,
batch 2 (16 runs): output max abs error 1.3e-15; gradients of $x$ and of every parameter max abs
error 1.1e-14.
"""

from __future__ import annotations

import numpy as np

from ..._checks import (
    as_dout,
    as_float,
    cast_all,
    check_choice,
    check_params,
    check_positive,
    check_weight_in,
    compute_dtype,
)
from ...nn.linear import linear_apply, linear_vjp, merge_heads, split_heads
from ...nn.rope import apply_rope, rope_angles
from ...registry import Mechanism, Sample, register
from .core import attention_core_backward, attention_core_forward, check_size

__all__ = ["PARALLEL_OPS", "parallel_edit_coefficients", "value_parallel_suppression_forward",
           "value_parallel_suppression_backward", "value_parallel_suppression", "init_value_suppression_params"]

PARALLEL_OPS = ("remove_parallel", "keep_parallel", "add_parallel", "negate_parallel")
_R_MIN = 1e-6


def parallel_edit_coefficients(op: str, alpha: float, subtract_scale: float) -> tuple[float, float]:
    r"""$(\lambda_y, \lambda_v)$ with $y' = \lambda_y y + \lambda_v c\,v$ for each ``op`` (module table)."""
    check_choice(op, "op", PARALLEL_OPS)
    return {"remove_parallel": (1.0, -subtract_scale * alpha), "keep_parallel": (0.0, alpha),
            "add_parallel": (1.0, alpha), "negate_parallel": (1.0, -subtract_scale * (1.0 + alpha))}[op]


def _validate(x, params, h):
    c = x.shape[-1]
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict with c_attn.weight and c_proj.weight; got {type(params).__name__}")
    check_weight_in(params, "c_attn.weight", c, input_name="x")
    wa = as_float(params.get("c_attn.weight"), "c_attn.weight", ndim=2) if "c_attn.weight" in params else None
    if wa is None or wa.shape[0] != c or wa.shape[1] % (3 * h):
        raise ValueError(f"c_attn.weight must have shape (C={c}, 3*E) with 3*num_heads={3 * h} dividing its second "
                         f"axis; got {None if wa is None else wa.shape}")
    e = wa.shape[1] // 3
    wp = as_float(params.get("c_proj.weight", np.zeros((e, 1))), "c_proj.weight", ndim=2)
    spec = {"c_attn.weight": (c, 3 * e), "c_attn.bias": (3 * e,), "c_proj.weight": (e, wp.shape[1]),
            "c_proj.bias": (wp.shape[1],)}
    return check_params(params, spec, optional=("c_attn.bias", "c_proj.bias"), where="value_parallel_suppression"), e // h


def value_parallel_suppression_forward(x, params, *, num_heads: int, op: str = "remove_parallel", alpha: float = 1.0,
                                       subtract_scale: float = 1.0, gamma: float = 1.0, use_rope: bool = True,
                                       rope_base: float = 10000.0):
    r"""Causal self-attention whose per-head output is edited along the token's own value (module docstring).

    Parameters
    ----------
    x : array (B, N, C)
    params : dict
        ``"c_attn.weight" (C, 3E)``, ``"c_proj.weight" (E, C_out)`` (torch ``weight.T``), optional biases.
    num_heads : int
    op : {"remove_parallel", "keep_parallel", "add_parallel", "negate_parallel"}
    alpha, subtract_scale, gamma : float
        Edit strength $\alpha$, subtraction scale $\sigma$, output scale $\gamma$ (all 1.0 upstream).
    use_rope : bool
        Interleaved RoPE on queries and keys (upstream default True).
    rope_base : float

    Returns
    -------
    out, cache
        ``out (B, N, C_out)``.
    """
    x = as_float(x, "x", ndim=3)
    h = check_size(num_heads, "num_heads")
    lam_y, lam_v = parallel_edit_coefficients(op, float(alpha), float(subtract_scale))
    for val, name in ((alpha, "alpha"), (subtract_scale, "subtract_scale"), (gamma, "gamma")):
        if isinstance(val, bool) or not isinstance(val, (int, float, np.floating, np.integer)) or not np.isfinite(val):
            raise TypeError(f"{name} must be a finite real number; got {val!r}")
    if not isinstance(use_rope, (bool, np.bool_)):
        raise TypeError(f"use_rope must be a bool; got {type(use_rope).__name__}")
    rope_base = check_positive(rope_base, "rope_base")
    p, d = _validate(x, params, h)
    if use_rope and d % 2:
        raise ValueError(f"use_rope=True needs an even head width; got d={d}")
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    n, e = x.shape[1], h * d
    qkv = linear_apply(x, p["c_attn.weight"], p.get("c_attn.bias"))
    q, k, v = (split_heads(qkv[..., i * e:(i + 1) * e], h) for i in range(3))
    cos = sin = None
    if use_rope:
        ang = rope_angles(np.arange(n), d, base=rope_base)
        cos, sin = np.cos(ang).astype(dt), np.sin(ang).astype(dt)
        q, k = apply_rope(q, cos, sin, True), apply_rope(k, cos, sin, True)
    y, core = attention_core_forward(q, k, v, is_causal=True)
    r_raw = np.sum(v * v, axis=-1, keepdims=True)
    r = np.maximum(r_raw, _R_MIN)
    coef = np.sum(y * v, axis=-1, keepdims=True) / r
    yp = float(gamma) * (lam_y * y + lam_v * coef * v)
    ym = merge_heads(yp)
    out = linear_apply(ym, p["c_proj.weight"], p.get("c_proj.bias"))
    cache = {"x": x, "p": p, "v": v, "y": y, "r": r, "active": r_raw > _R_MIN, "coef": coef, "core": core, "ym": ym,
             "lam": (lam_y, lam_v), "gamma": float(gamma), "rope": (cos, sin), "h": h, "shape": out.shape}
    return out, cache


def value_parallel_suppression_backward(dout, cache):
    r"""Gradient of :func:`value_parallel_suppression_forward` for ``x`` and every params key: the edit's
    $dy$ and direct $dv$ (module docstring), the attention VJP, RoPE transposed, the two projections."""
    p, x = cache["p"], cache["x"]
    g_out = as_dout(dout, cache["shape"], x.dtype)
    grads = {}
    gp = linear_vjp(g_out, cache["ym"], p["c_proj.weight"], "c_proj.bias" in p)
    grads["c_proj.weight"] = gp["weight"]
    if "c_proj.bias" in p:
        grads["c_proj.bias"] = gp["bias"]
    g = cache["gamma"] * split_heads(gp["x"], cache["h"])
    lam_y, lam_v = cache["lam"]
    v, y, r, coef = cache["v"], cache["y"], cache["r"], cache["coef"]
    gv = np.sum(g * v, axis=-1, keepdims=True) / r
    dy = lam_y * g + lam_v * gv * v
    dv_direct = lam_v * (coef * g + gv * y - 2.0 * coef * gv * v * cache["active"])
    gc = attention_core_backward(dy, cache["core"])
    dq, dk, dv = gc["q"], gc["k"], gc["v"] + dv_direct
    cos, sin = cache["rope"]
    if cos is not None:
        dq, dk = apply_rope(dq, cos, -sin, True), apply_rope(dk, cos, -sin, True)
    dqkv = np.concatenate([merge_heads(dq), merge_heads(dk), merge_heads(dv)], axis=-1)
    ga = linear_vjp(dqkv, x, p["c_attn.weight"], "c_attn.bias" in p)
    grads["x"], grads["c_attn.weight"] = ga["x"], ga["weight"]
    if "c_attn.bias" in p:
        grads["c_attn.bias"] = ga["bias"]
    return grads


def value_parallel_suppression(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`value_parallel_suppression_forward`."""
    return value_parallel_suppression_forward(x, params, **config)[0]


def init_value_suppression_params(rng, c: int, num_heads: int, head_dim: int, *, c_out=None, bias: bool = True) -> dict:
    """Random parameters (normal, fan-in scaled; small biases) for tests and demos."""
    e = num_heads * head_dim
    co = c if c_out is None else c_out
    p = {"c_attn.weight": rng.standard_normal((c, 3 * e)) / np.sqrt(c),
         "c_proj.weight": rng.standard_normal((e, co)) / np.sqrt(e)}
    if bias:
        p["c_attn.bias"] = 0.1 * rng.standard_normal(3 * e)
        p["c_proj.bias"] = 0.1 * rng.standard_normal(co)
    return p


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size):
    n, c, h, d = (3, 4, 2, 2) if size == "tiny" else (6, 8, 2, 4)
    op = PARALLEL_OPS[int(rng.integers(0, 4))]
    cfg = {"num_heads": h, "op": op, "alpha": float(rng.choice([0.5, 1.0])), "use_rope": bool(rng.random() < 0.7)}
    if rng.random() < 0.5:
        cfg.update(subtract_scale=0.7, gamma=1.3)
    x = rng.standard_normal((2, n, c))
    params = init_value_suppression_params(rng, c, h, d, c_out=2 if size == "tiny" else None,
                                           bias=bool(rng.random() < 0.75))
    return Sample(inputs={"x": x}, params=params, config=cfg)


def _reference(x, params, *, num_heads, op="remove_parallel", alpha=1.0, subtract_scale=1.0, gamma=1.0, use_rope=True,
               rope_base=10000.0):
    # per (batch, head, token) loop: causal softmax attention, then the op written out as in the table
    b, n, _ = x.shape
    e = params["c_attn.weight"].shape[1] // 3
    d = e // num_heads
    qkv = x @ params["c_attn.weight"] + params.get("c_attn.bias", 0.0)
    out = np.zeros((b, n, e))
    for bb in range(b):
        for hh in range(num_heads):
            q, k, v = (qkv[bb, :, i * e + hh * d: i * e + (hh + 1) * d].copy() for i in range(3))
            if use_rope:
                for t in range(n):
                    for m in range(d // 2):
                        th = t * rope_base ** (-2 * m / d)
                        for z in (q, k):
                            a0, a1 = z[t, 2 * m], z[t, 2 * m + 1]
                            z[t, 2 * m], z[t, 2 * m + 1] = a0 * np.cos(th) - a1 * np.sin(th), a1 * np.cos(th) + a0 * np.sin(th)
            for i in range(n):
                s = q[i] @ k[: i + 1].T / np.sqrt(d)
                w = np.exp(s - s.max())
                y = (w / w.sum()) @ v[: i + 1]
                cpar = (y @ v[i]) / max(v[i] @ v[i], 1e-6) * v[i]
                new = {"remove_parallel": y - subtract_scale * alpha * cpar, "keep_parallel": alpha * cpar,
                       "add_parallel": y + alpha * cpar, "negate_parallel": y - subtract_scale * (1 + alpha) * cpar}[op]
                out[bb, i, hh * d:(hh + 1) * d] = gamma * new
    return out @ params["c_proj.weight"] + params.get("c_proj.bias", 0.0)


def _check_full_removal_is_perpendicular(rng):
    # alpha = sigma = 1: every head's edited output is orthogonal to its own value; alpha = 0: plain attention
    x = rng.standard_normal((2, 5, 6))
    p = init_value_suppression_params(rng, 6, 3, 2)
    _, c = value_parallel_suppression_forward(x, p, num_heads=3)
    yp = split_heads(c["ym"], 3)
    cos = float(np.abs(np.sum(yp * c["v"], -1)).max())
    _, c0 = value_parallel_suppression_forward(x, p, num_heads=3, alpha=0.0)
    same = float(np.abs(c0["ym"] - merge_heads(c0["y"])).max())
    assert cos < 1e-13 and same == 0.0, (cos, same)
    return cos


def _check_keep_plus_remove_is_identity(rng):
    # keep_parallel(alpha=1) + remove_parallel(alpha=1) = plain attention output, per head (before c_proj)
    x = rng.standard_normal((2, 4, 4))
    p = init_value_suppression_params(rng, 4, 2, 2, bias=False)
    _, ck = value_parallel_suppression_forward(x, p, num_heads=2, op="keep_parallel")
    _, cr = value_parallel_suppression_forward(x, p, num_heads=2, op="remove_parallel")
    err = float(np.abs(ck["ym"] + cr["ym"] - merge_heads(ck["y"])).max())
    assert err < 1e-14, err
    return err


register(
    Mechanism(
        slug="value_parallel_suppression", family="1-softmax", tier="T2",
        title="Value-space parallel suppression (XSA): attention output edited along the token's own value",
        paper="S. He et al., Demystifying Transformers through Representation Geometries, 2026 "
              "(Shwai-He/Transformer-Geometry)",
        official_code="Shwai-He/Transformer-Geometry",
        forward=value_parallel_suppression_forward, backward=value_parallel_suppression_backward, sample=_sample,
        reference=_reference, docs="softmax/masks-and-selection.md#value-space-parallel-suppression",
        checks={"full_removal_is_perpendicular": _check_full_removal_is_perpendicular,
                "keep_plus_remove_is_identity": _check_keep_plus_remove_is_identity},
    ),
)
