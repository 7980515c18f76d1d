r"""Optimised, Efficient and Super Attention (Hosseini & Hosseini, "You Need to Pay Better Attention").

Three reduced multi-head layers. $X\in\mathbb R^{N\times C}$ is cut into $H$ column slices
$X_h\in\mathbb R^{N\times d}$, $d = C/H$ (a reshape, no weights), and every variant keeps the query
projection and the output projection $W^O$ of standard multi-head attention:

$$Q_h = (XW^Q + b^Q)_h,\qquad
H_h = \mathrm{softmax}\!\big(s\,Q_hK_h^\top + M\big)\,V_h,\qquad
Y = [H_1\|\dots\|H_H]\,W^O + b^O,$$

with

* ``variant="optimised"``: $K_h = (XW^K + b^K)_h$, $V_h = X_h$ (no value projection: 3/4 of the
  parameters of MHA, one matmul fewer per head);
* ``variant="efficient"``: $K_h = X_h$, $V_h = X_h$ (no key or value projection: 1/2 of the
  parameters, two matmuls fewer);
* ``variant="super"``: $K_h = X_h$, $V_h = W^A X_h$ with one learned "alignment kernel"
  $W^A\in\mathbb R^{\ell\times\ell}$ shared by all heads that mixes *along the sequence* (it ties
  the layer to the sequence length $\ell = N$ and breaks permutation equivariance). With the
  causal mask, $W^A$ is used lower-triangular ($\mathrm{tril}(W^A)$), so no token reads a later one.

$s = 1/\sqrt{E/H}$ by default (the query head width, $= 1/\sqrt d$ for efficient/super; $E$ the width of
$W^Q$) and $M$ is the optional causal mask.

Backward
--------
The attention core (`refattn.attention.softmax.core`) returns $dQ_h, dK_h, dV_h$ for the upstream
gradient $dH = \mathrm{split}(dY\,W^{O\top})$. Because keys and values are slices of $X$ itself, the
input gradient collects every path:

$$dX = dQW^{Q\top} + \underbrace{[dK]}_{\text{eff./super}}\ \text{or}\ \underbrace{dK\,W^{K\top}}_{\text{optimised}}
 + \underbrace{[dV]}_{\text{opt./eff.}}\ \text{or}\ \underbrace{W^{A\top}[dV]}_{\text{super}},$$

where $[\cdot]$ merges the heads back into $N\times C$ (the inverse of the slicing), and

$$dW^A = \textstyle\sum_{\text{batch}} [dV]\,X^\top\quad(\text{lower triangle only when causal}),$$

$dW^Q = X^\top dQ$, $dW^K = X^\top dK$, $dW^O = [H]^\top dY$ (`linear_prefixed_vjp`), summed over the
batch axes.

Paper and code
--------------
M. Hosseini and P. Hosseini, "You Need to Pay Better Attention: Rethinking the Mathematics of
Attention Mechanism", arXiv 2403.01643 (2024). The authors published no code. The only public
PyTorch port found, oelin/super-attention ``super_attention/__init__.py``
@ 3781367c690a34cb93ead6702b9efe8b9a7f04a8 (class ``SuperAttention``), is the single-head Super
layer ($H = 1$, $s = 1/\sqrt C$, no biases, ``project_value.weight`` = $W^A$ applied from the left);
it is what the float64 parity below was measured against.

Conventions (keyword, default) and reconstruction
-------------------------------------------------
``variant`` ("super"), ``num_heads``, ``scale`` ($1/\sqrt{d}$ with $d = C/H$ the head width;
reconstruction: the paper writes $\sqrt{d_K}$), ``is_causal`` (False; with True $W^A$ is used
lower-triangular, the paper's masked variant). Biases are optional keys (the paper has none).
Parameter names follow MHA: ``q_proj``, ``k_proj`` (optimised only), ``o_proj`` (weights stored
``(in, out)`` = torch ``weight.T``) and ``w_a`` $(N, N)$ stored as applied, $V = W^AX$ (= the port's
``project_value.weight`` as is). Reconstruction: the paper does not state biases or whether
$W^A$ is cropped for shorter sequences; here $W^A$ must be $(N, N)$.
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_choice, check_param_keys, check_params, compute_dtype
from ...nn.linear import linear_prefixed, linear_prefixed_vjp, merge_heads, split_heads
from ...registry import Mechanism, Sample, register
from .core import attention_core_backward, attention_core_forward, check_size

__all__ = ["better_attention_forward", "better_attention_backward", "better_attention",
           "init_better_attention_params"]

VARIANTS = ("optimised", "efficient", "super")


def _validate(x, params, h, variant):
    if params is None:
        raise TypeError("params is required: a dict with q_proj.weight and o_proj.weight")
    req = ["q_proj.weight", "o_proj.weight"] + (["k_proj.weight"] if variant == "optimised" else []) \
        + (["w_a"] if variant == "super" else [])
    opt = ["q_proj.bias", "o_proj.bias"] + (["k_proj.bias"] if variant == "optimised" else [])
    check_param_keys(params, req, opt, where=f"better_attention(variant={variant!r}) (weights (in, out); "
                                             "PyTorch: weight.T)")
    n, c = x.shape[-2], x.shape[-1]
    if c % h:
        raise ValueError(f"x's last axis C={c} must be divisible by num_heads={h} (the heads slice X)")
    wq = as_float(params["q_proj.weight"], "q_proj.weight", ndim=2)
    e = wq.shape[1]
    if variant != "optimised" and e != c:
        raise ValueError(f"q_proj.weight must have shape (C, C) = ({c}, {c}) for variant={variant!r} "
                         f"(queries meet the slices of X); got {wq.shape}")
    if e % h:
        raise ValueError(f"q_proj.weight's second axis {e} must be divisible by num_heads={h}")
    co = as_float(params["o_proj.weight"], "o_proj.weight", ndim=2).shape[1]
    spec = {"q_proj.weight": (c, e), "q_proj.bias": (e,), "k_proj.weight": (c, e), "k_proj.bias": (e,),
            "o_proj.weight": (c, co), "o_proj.bias": (co,), "w_a": (n, n)}
    spec = {k: v for k, v in spec.items() if k in req or k in opt}
    return check_params(params, spec, optional=opt, where="better_attention")


def better_attention_forward(x, params, *, num_heads: int, variant: str = "super", is_causal: bool = False,
                             scale=None):
    r"""Optimised / Efficient / Super attention layer, token-major (module docstring).

    Parameters
    ----------
    x : array (B.., N, C)
    params : dict
        ``"q_proj.weight" (C, E)`` (``E = C`` for efficient/super), ``"o_proj.weight" (C, C_out)``,
        ``"k_proj.weight" (C, E)`` (optimised only), ``"w_a" (N, N)`` (super only); optional
        ``"q_proj.bias"``, ``"k_proj.bias"``, ``"o_proj.bias"``. PyTorch weights transposed.
    num_heads : int
        $H$; must divide ``C`` (and ``E``).
    variant : {"optimised", "efficient", "super"}
    is_causal : bool
        Causal mask on the scores; the super variant also uses $\mathrm{tril}(W^A)$.
    scale : float > 0, optional
        Default $1/\sqrt{E/H}$.

    Returns
    -------
    out, cache
        ``out (B.., N, C_out)``.
    """
    check_choice(variant, "variant", VARIANTS)
    x = as_float(x, "x", min_ndim=2)
    h = check_size(num_heads, "num_heads")
    if not isinstance(is_causal, (bool, np.bool_)):
        raise TypeError(f"is_causal must be a bool; got {type(is_causal).__name__}")
    p = _validate(x, params, h, variant)
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    q = split_heads(linear_prefixed(p, "q_proj", x), h)
    xs = split_heads(x, h)
    k = split_heads(linear_prefixed(p, "k_proj", x), h) if variant == "optimised" else xs
    wa = None
    if variant == "super":
        wa = np.tril(p["w_a"]) if is_causal else p["w_a"]
        v = split_heads(wa @ x, h)
    else:
        v = xs
    o, core = attention_core_forward(q, k, v, is_causal=bool(is_causal), scale=scale)
    oc = merge_heads(o)
    y = linear_prefixed(p, "o_proj", oc)
    cache = {"x": x, "p": p, "wa": wa, "core": core, "oc": oc, "h": h, "variant": variant,
             "is_causal": bool(is_causal), "y_shape": y.shape}
    return y, cache


def better_attention_backward(dout, cache):
    r"""Gradient of :func:`better_attention_forward`: ``x`` and every params key (module docstring)."""
    p, x, h, variant = cache["p"], cache["x"], cache["h"], cache["variant"]
    g = as_dout(dout, cache["y_shape"], x.dtype)
    grads = {}
    doc = linear_prefixed_vjp(grads, p, "o_proj", g, cache["oc"])
    gc = attention_core_backward(split_heads(doc, h), cache["core"])
    dx = linear_prefixed_vjp(grads, p, "q_proj", merge_heads(gc["q"]), x)
    dk = merge_heads(gc["k"])
    dx = dx + (linear_prefixed_vjp(grads, p, "k_proj", dk, x) if variant == "optimised" else dk)
    dv = merge_heads(gc["v"])
    if variant == "super":
        dx = dx + np.swapaxes(cache["wa"], -1, -2) @ dv
        dwa = (dv @ np.swapaxes(x, -1, -2)).reshape((-1,) + cache["wa"].shape).sum(axis=0)
        grads["w_a"] = np.tril(dwa) if cache["is_causal"] else dwa
    else:
        dx = dx + dv
    grads["x"] = dx
    return grads


def better_attention(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`better_attention_forward`."""
    return better_attention_forward(x, params, **config)[0]


def init_better_attention_params(rng, c: int, seq_len: int | None = None, *, variant: str = "super",
                                 qk_dim: int | None = None, c_out: int | None = None, bias: bool = False) -> dict:
    """Random parameters (xavier-like weights; ``w_a`` near the identity) for tests and demos."""
    check_choice(variant, "variant", VARIANTS)
    e = c if (qk_dim is None or variant != "optimised") else qk_dim
    co = c if c_out is None else c_out
    p = {"q_proj.weight": rng.uniform(-1, 1, (c, e)) * np.sqrt(6.0 / (c + e)),
         "o_proj.weight": rng.uniform(-1, 1, (c, co)) * np.sqrt(6.0 / (c + co))}
    if variant == "optimised":
        p["k_proj.weight"] = rng.uniform(-1, 1, (c, e)) * np.sqrt(6.0 / (c + e))
    if variant == "super":
        if seq_len is None:
            raise ValueError("seq_len is required for variant='super' (W^A is (seq_len, seq_len))")
        p["w_a"] = np.eye(seq_len) + 0.3 * rng.standard_normal((seq_len, seq_len))
    if bias:
        p["q_proj.bias"] = 0.1 * rng.standard_normal(e)
        p["o_proj.bias"] = 0.1 * rng.standard_normal(co)
        if variant == "optimised":
            p["k_proj.bias"] = 0.1 * rng.standard_normal(e)
    return p


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size):
    if size == "tiny":
        n, c, h = 3, 4, 2
    else:
        n, c, h = int(rng.integers(4, 8)), 6, 2
    variant = VARIANTS[int(rng.integers(0, 3))]
    x = rng.standard_normal((2, n, c))
    params = init_better_attention_params(rng, c, n, variant=variant, qk_dim=2 * h, bias=bool(rng.random() < 0.5))
    cfg = {"num_heads": h, "variant": variant}
    if rng.random() < 0.5:
        cfg["is_causal"] = True
    return Sample(inputs={"x": x}, params=params, config=cfg)


def _reference(x, params, *, num_heads, variant="super", is_causal=False, scale=None):
    # per-batch, per-head loop of the paper's formula
    b, n, c = x.shape
    d = c // num_heads
    q = x @ params["q_proj.weight"] + params.get("q_proj.bias", 0.0)
    dq = q.shape[-1] // num_heads
    kf = x @ params["k_proj.weight"] + params.get("k_proj.bias", 0.0) if variant == "optimised" else x
    wa = params.get("w_a")
    if wa is not None and is_causal:
        wa = np.tril(wa)
    out = np.zeros((b, n, c))
    s = dq ** -0.5 if scale is None else scale
    for bb in range(b):
        vf = wa @ x[bb] if variant == "super" else x[bb]
        for hh in range(num_heads):
            qh, kh = q[bb, :, hh * dq:(hh + 1) * dq], kf[bb, :, hh * dq:(hh + 1) * dq]
            a = s * qh @ kh.T
            if is_causal:
                a = np.where(np.tri(n, dtype=bool), a, -np.inf)
            w = np.exp(a - a.max(-1, keepdims=True))
            out[bb, :, hh * d:(hh + 1) * d] = (w / w.sum(-1, keepdims=True)) @ vf[:, hh * d:(hh + 1) * d]
    return out @ params["o_proj.weight"] + params.get("o_proj.bias", 0.0)


def _check_optimised_is_mha_with_identity_value(rng):
    # Optimised attention == MHA whose value projection is the identity (the paper's derivation)
    from .mha import mha_forward

    x = rng.standard_normal((2, 5, 4))
    p = init_better_attention_params(rng, 4, variant="optimised")
    y = better_attention(x, p, num_heads=2, variant="optimised")
    pm = {"q_proj": p["q_proj.weight"], "k_proj": p["k_proj.weight"], "v_proj": np.eye(4),
          "out_proj": p["o_proj.weight"]}
    err = float(np.abs(y - mha_forward(x, params=pm, num_heads=2)[0]).max())
    assert err < 1e-12, err
    return err


def _check_super_identity_is_efficient(rng):
    # W^A = I turns Super into Efficient attention (forward and the shared gradients)
    x = rng.standard_normal((2, 5, 4))
    p = init_better_attention_params(rng, 4, 5, variant="super")
    p["w_a"] = np.eye(5)
    pe = {k: v for k, v in p.items() if k != "w_a"}
    y, c = better_attention_forward(x, p, num_heads=2, variant="super")
    y2, c2 = better_attention_forward(x, pe, num_heads=2, variant="efficient")
    G = rng.standard_normal(y.shape)
    g, g2 = better_attention_backward(G, c), better_attention_backward(G, c2)
    err = max(float(np.abs(y - y2).max()), *(float(np.abs(g[k] - g2[k]).max()) for k in g2))
    assert err < 1e-12, err
    return err


def _check_parameter_counts(rng):
    # the paper's counts: MHA 4C^2, Optimised 3C^2, Efficient 2C^2, Super 2C^2 + l^2 (no biases)
    c, n = 8, 5
    counts = {v: sum(a.size for a in init_better_attention_params(rng, c, n, variant=v).values()) for v in VARIANTS}
    want = {"optimised": 3 * c * c, "efficient": 2 * c * c, "super": 2 * c * c + n * n}
    assert counts == want, (counts, want)
    return 0.0


def _check_causal_no_future_leak(rng):
    # with is_causal, perturbing later tokens leaves earlier outputs unchanged (Super's tril(W^A) too)
    x = rng.standard_normal((2, 6, 4))
    p = init_better_attention_params(rng, 4, 6, variant="super")
    y = better_attention(x, p, num_heads=2, is_causal=True)
    x2 = x.copy()
    x2[:, 4:] += rng.standard_normal((2, 2, 4))
    err = float(np.abs(better_attention(x2, p, num_heads=2, is_causal=True)[:, :4] - y[:, :4]).max())
    assert err < 1e-12, err
    return err


register(
    Mechanism(
        slug="optimised_efficient_super_attention", family="1-softmax", tier="T3",
        official_code="none by the authors; port followed: oelin/super-attention super_attention/__init__.py@3781367",
        title="Optimised / Efficient / Super Attention (Hosseini & Hosseini)",
        paper="M. Hosseini, P. Hosseini, You Need to Pay Better Attention, arXiv 2403.01643 (2024)",
        forward=better_attention_forward, backward=better_attention_backward, sample=_sample,
        reference=_reference, docs="softmax/t3-attention.md#optimised-efficient-super-attention",
        checks={"optimised_is_mha_with_identity_value": _check_optimised_is_mha_with_identity_value,
                "super_identity_is_efficient": _check_super_identity_is_efficient,
                "parameter_counts": _check_parameter_counts,
                "causal_no_future_leak": _check_causal_no_future_leak},
    ),
)
