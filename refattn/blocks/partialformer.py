r"""PartialFormer attention with per-head small FFNs (PG-FFNs), gating and residual-like attention.

Zheng, Li, Bao, Wang, Shan, Xiao, Zhu, "PartialFormer: Modeling Part Instead of Whole for Machine
Translation", Findings of ACL 2024, arXiv 2310.14921. Upstream: zhengkid/PartialFormer
``fairseq/modules/efficient_pa_attention_qk.py`` (``EfficientPAQKMultiheadAttention``, used by
``PATransformerEncoderLayer`` in ``fairseq/modules/pa_transformer_layer.py``) @
d1ed9598300d2557347f6a6f7769240f14dde08c.

Forward
-------
PartialFormer drops the block's large FFN and puts a small FFN inside every attention head. With
$x\in\mathbb R^{N\times C}$, head width $d = C/h$ (``num_heads`` $h$), $E$ heads (``expand_heads``,
upstream default $E = h$; head scaling raises $E$), projections $W_q, W_k, W_v, W_u\in\mathbb
R^{C\times Ed}$ and one small FFN shared by the heads, $\mathrm{FFN}(a) = \phi(aW_1+b_1)W_2+b_2$
($W_1\in\mathbb R^{d\times rd}$):

$$S_e = \frac{Q_eK_e^\top}{\sqrt d} + B_e,\qquad A_e = \mathrm{softmax}(S_e)V_e,\qquad
F_e = \mathrm{FFN}(A_e) + A_e,$$
$$y = \big([F_1,\dots,F_E]\odot\mathrm{ReLU}(xW_u + b_u)\big)W_o + b_o .$$

$B$ (``attn_before``, shape ``(..., E, N, N)``) is the "residual-like attention" term: upstream
adds a score tensor handed in from outside (``attn_before``) to the current logits before the
softmax; refattn takes it as an input and returns its gradient, so a caller can feed the previous
layer's logits or any structure bias. Parameter names are upstream's (``q_proj``, ``k_proj``,
``v_proj``, ``u_proj``, ``ff1``, ``ff2``, ``out_proj``), weights ``(in, out)``.

Backward
--------
$dO = dy\,W_o^\top$; $dF = dO\odot\mathrm{ReLU}(U)$, $dU = dO\odot F\odot\mathbb 1[U>0]$;
$dA = dF + J_{\mathrm{FFN}}^\top dF$ (the MLP VJP of `refattn.blocks.core`, weight gradients summed
over heads since the FFN is shared); then the attention VJP
(`refattn.attention.softmax.attention_core_backward`) gives $dQ, dK, dV$ and $dB$; the four
projection VJPs sum into $dx$.

Conventions
-----------
``activation`` of the head FFN (``"relu"``, fairseq's ``activation_fn`` default; ``"gelu"`` ...).
The gate is always ReLU as upstream. Evaluation mode (no dropout). Upstream's optional
``use_hdp`` head-mixing net (scores of ``global_heads`` mixed into $E$ heads by an MLP) is off by
default and not reproduced; upstream's Post-LN encoder layer around the module is
``LayerNorm(x + y)`` (see `refattn.blocks.core` for the norm).

Agreement with upstream
-----------------------
Upstream needs fairseq (not installable here), so ``EfficientPAQKMultiheadAttention.forward`` for
self-attention (eval mode, ``use_hdp=False``, no masks) was transcribed line by line into a
float64 torch scratch script (fairseq's time-major layout, ``view``/``transpose`` head split, ff1
and ff2 applied in upstream's order): output and the gradients of $x$, ``attn_before`` and every
parameter agree to $\le 8.9\times10^{-16}$ max relative error (B=2, N=5, C=8, h=2, E=3, r=2).
The key-bias gradient is zero in theory (softmax is invariant to a per-query constant); both
sides give rounding noise of order $10^{-16}$.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_choice, check_int, check_params
from ..attention.softmax.core import attention_core_backward, attention_core_forward
from ..nn.linear import linear_prefixed, linear_prefixed_spec, linear_prefixed_vjp, merge_heads, split_heads
from ..registry import Mechanism, Sample, register
from .core import ACTIVATIONS, add_grad, block_dtype, mlp_backward, mlp_forward, mlp_spec

__all__ = ["partialformer_attention_forward", "partialformer_attention_backward", "partialformer_attention"]

_WHERE = "partialformer_attention"
_PROJ = ("q_proj", "k_proj", "v_proj", "u_proj")


def partialformer_attention_forward(x, params, attn_before=None, *, num_heads: int, expand_heads=None,
                                    activation: str = "relu"):
    r"""PartialFormer attention $y = ([\mathrm{FFN}(A_e)+A_e]_e\odot\mathrm{ReLU}(xW_u+b_u))W_o + b_o$.

    Parameters
    ----------
    x : array (..., N, C)
    params : dict
        ``"q_proj"``, ``"k_proj"``, ``"v_proj"``, ``"u_proj"`` ``.weight (C, E*d)``, ``"ff1.weight"
        (d, r*d)``, ``"ff2.weight" (r*d, d)``, ``"out_proj.weight" (E*d, C)``, each with ``.bias``.
    attn_before : array (..., E, N, N), optional
        Residual-like attention scores added to the logits (differentiable).
    num_heads : int
        $h$; the head width is $d = C/h$.
    expand_heads : int, optional
        $E$, the number of heads actually computed (default $h$).
    activation : {"relu", "gelu", "gelu_tanh", "silu"}
        The head FFN's activation.

    Returns
    -------
    y, cache
    """
    x = as_float(x, "x", min_ndim=2)
    num_heads = check_int(num_heads, "num_heads", minimum=1)
    e = num_heads if expand_heads is None else check_int(expand_heads, "expand_heads", minimum=1)
    check_choice(activation, "activation", ACTIVATIONS)
    c, n = x.shape[-1], x.shape[-2]
    if c % num_heads:
        raise ValueError(f"x's last axis ({c}) must be divisible by num_heads ({num_heads})")
    d = c // num_heads
    if not isinstance(params, dict):
        raise TypeError(f"params for {_WHERE} must be a dict of arrays; got {type(params).__name__}")
    if params.get("ff1.weight") is None:
        raise ValueError(f"params is missing key 'ff1.weight' for {_WHERE} (expected shape (d, r*d))")
    hid = as_float(params["ff1.weight"], "ff1.weight", ndim=2).shape[1]
    spec = {}
    for pr in _PROJ:
        spec.update(linear_prefixed_spec(pr, c, e * d))
    spec.update(mlp_spec("ff1", "ff2", d, hid))
    spec.update(linear_prefixed_spec("out_proj", e * d, c))
    p = check_params(params, spec, where=_WHERE)
    subs = ()
    if attn_before is not None:
        attn_before = as_float(attn_before, "attn_before")
        want = x.shape[:-2] + (e, n, n)
        if attn_before.shape != want:
            raise ValueError(f"attn_before must have shape {want}; got {attn_before.shape}")
        subs = ({"attn_before": attn_before},)
    dt = block_dtype(x, p, subs)
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    bias = None if attn_before is None else attn_before.astype(dt, copy=False)
    q, k, v = (split_heads(linear_prefixed(p, pr, x), e, d) for pr in _PROJ[:3])
    u = linear_prefixed(p, "u_proj", x)
    a, catt = attention_core_forward(q, k, v, bias, scale=d ** -0.5)
    m, cm = mlp_forward(p, a, fc1="ff1", fc2="ff2", activation=activation)
    f = merge_heads(m + a)
    gate = np.maximum(u, 0.0)
    o = f * gate
    y = linear_prefixed(p, "out_proj", o)
    cache = {"x": x, "p": p, "catt": catt, "cm": cm, "f": f, "u": u, "gate": gate, "o": o, "e": e, "d": d,
             "has_bias": attn_before is not None, "dtype": dt}
    return y, cache


def partialformer_attention_backward(dout, cache):
    """Gradients of `partialformer_attention_forward`: ``"x"``, every params key and
    ``"attn_before"`` when it was given (module docstring)."""
    x, p, e, d = cache["x"], cache["p"], cache["e"], cache["d"]
    dy = as_dout(dout, x.shape, cache["dtype"])
    grads = {}
    do = linear_prefixed_vjp(grads, p, "out_proj", dy, cache["o"])
    du = do * cache["f"] * (cache["u"] > 0)
    df = split_heads(do * cache["gate"], e, d)
    da = df + mlp_backward(grads, p, df, cache["cm"])
    g = attention_core_backward(da, cache["catt"])
    dx = linear_prefixed_vjp(grads, p, "u_proj", du, x)
    for pr, key in zip(_PROJ[:3], ("q", "k", "v")):
        dx = dx + linear_prefixed_vjp(grads, p, pr, merge_heads(g[key]), x)
    add_grad(grads, "x", dx)
    if cache["has_bias"]:
        grads["attn_before"] = g["bias"]
    return grads


def partialformer_attention(x, params, attn_before=None, **config) -> np.ndarray:
    """Convenience wrapper: the output of `partialformer_attention_forward`."""
    return partialformer_attention_forward(x, params, attn_before, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _params(rng, c, h, e, r):
    d = c // h
    p = {}
    for pr in _PROJ:
        p[f"{pr}.weight"] = rng.standard_normal((c, e * d)) / np.sqrt(c)
        p[f"{pr}.bias"] = 0.2 * rng.standard_normal(e * d)
    p["u_proj.bias"] = p["u_proj.bias"] + 0.5
    p["ff1.weight"], p["ff1.bias"] = rng.standard_normal((d, r * d)) / np.sqrt(d), 0.2 * rng.standard_normal(r * d)
    p["ff2.weight"], p["ff2.bias"] = rng.standard_normal((r * d, d)) / np.sqrt(r * d), 0.2 * rng.standard_normal(d)
    p["out_proj.weight"] = rng.standard_normal((e * d, c)) / np.sqrt(e * d)
    p["out_proj.bias"] = 0.1 * rng.standard_normal(c)
    return p


def _sample(rng, size):
    if size == "tiny":
        n, c, h, e, r = 2, 2, 1, 2, 1
    else:
        n, c, h, e, r = 5, 8, 2, 3, 2
    act = str(rng.choice(["relu", "gelu"]))
    inputs = {"x": rng.standard_normal((2, n, c))}
    if rng.integers(2) or size == "tiny":
        inputs["attn_before"] = 0.5 * rng.standard_normal((2, e, n, n))
    return Sample(inputs=inputs, params=_params(rng, c, h, e, r),
                  config={"num_heads": h, "expand_heads": e, "activation": act})


def _reference(x, params, attn_before=None, num_heads=1, expand_heads=None, activation="relu"):
    # Head by head with explicit loops over heads, the softmax written out.
    from .core import activation_functions

    p = params
    phi, _ = activation_functions(activation)
    e = num_heads if expand_heads is None else expand_heads
    d = x.shape[-1] // num_heads
    proj = {pr: x @ p[f"{pr}.weight"] + p[f"{pr}.bias"] for pr in _PROJ}
    outs = []
    for j in range(e):
        sl = slice(j * d, (j + 1) * d)
        s = proj["q_proj"][..., sl] @ np.swapaxes(proj["k_proj"][..., sl], -1, -2) / np.sqrt(d)
        if attn_before is not None:
            s = s + attn_before[..., j, :, :]
        w = np.exp(s - s.max(axis=-1, keepdims=True))
        a = (w / w.sum(axis=-1, keepdims=True)) @ proj["v_proj"][..., sl]
        outs.append(phi(a @ p["ff1.weight"] + p["ff1.bias"]) @ p["ff2.weight"] + p["ff2.bias"] + a)
    o = np.concatenate(outs, axis=-1) * np.maximum(proj["u_proj"], 0.0)
    return o @ p["out_proj.weight"] + p["out_proj.bias"]


def _check_zero_ffn_is_gated_mha(rng):
    # ff2 = 0 (weight and bias): each head's FFN output vanishes and the module is gated MHA,
    # out_proj((softmax(QK^T/sqrt d)V) * relu(U)).
    s = _sample(rng, "small")
    p = dict(s.params, **{"ff2.weight": np.zeros_like(s.params["ff2.weight"]),
                          "ff2.bias": np.zeros_like(s.params["ff2.bias"])})
    x, e, d = s.inputs["x"], s.config["expand_heads"], 4
    y = partialformer_attention(x, p, s.inputs.get("attn_before"), **s.config)
    q, k, v = (split_heads(x @ p[f"{pr}.weight"] + p[f"{pr}.bias"], e, d) for pr in _PROJ[:3])
    a, _ = attention_core_forward(q, k, v, s.inputs.get("attn_before"), scale=d ** -0.5)
    ref = (merge_heads(a) * np.maximum(x @ p["u_proj.weight"] + p["u_proj.bias"], 0)) @ p["out_proj.weight"] \
        + p["out_proj.bias"]
    err = float(np.abs(y - ref).max())
    assert err < 1e-13, f"ff2 = 0 is not gated MHA: {err}"
    return err


def _check_uniform_bias_shift_invariant(rng):
    # A per-query constant in attn_before leaves the softmax, hence y, unchanged.
    s = _sample(rng, "small")
    b = s.inputs.get("attn_before")
    if b is None:
        b = np.zeros((2, s.config["expand_heads"], 5, 5))
    y0 = partialformer_attention(s.inputs["x"], s.params, b, **s.config)
    y1 = partialformer_attention(s.inputs["x"], s.params, b + rng.standard_normal(b.shape[:-1] + (1,)), **s.config)
    err = float(np.abs(y0 - y1).max())
    assert err < 1e-12, f"per-query shift of attn_before changed y by {err}"
    return err


register(
    Mechanism(
        slug="partialformer_head_ffns", family="5-building-blocks", tier="T3",
        title="PartialFormer attention: per-head small FFNs (PG-FFN), ReLU gate, head expansion, residual-like scores",
        paper="Zheng, Li, Bao, Wang, Shan, Xiao, Zhu, PartialFormer: Modeling Part Instead of Whole for Machine "
              "Translation, Findings of ACL 2024, arXiv 2310.14921",
        official_code="zhengkid/PartialFormer",
        forward=partialformer_attention_forward, backward=partialformer_attention_backward, sample=_sample,
        reference=_reference, docs="blocks/t3-blocks.md#partialformer_head_ffns",
        checks={"zero_ffn_is_gated_mha": _check_zero_ffn_is_gated_mha,
                "uniform_bias_shift_invariant": _check_uniform_bias_shift_invariant},
    ),
)
