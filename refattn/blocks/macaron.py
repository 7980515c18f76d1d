r"""Macaron block: half-step FFN, attention, half-step FFN (Strang-Marchuk splitting).

Lu, Li, He, Sun, Dong, Qin, Wang, Liu, "Understanding and Improving Transformer From a
Multi-Particle Dynamic System Point of View", arXiv 1906.02762 (2019). Upstream:
zhuohan123/macaron-net ``translation/fairseq/models/transformer.py`` (``TransformerEncoderLayer``
with ``--macaron``) @ 3a84e7a3323bd1a3a9a303194ba336d670a1fb2c.

Forward
-------
A Transformer layer is one Lie-Trotter step of the convection-diffusion ODE (attention = diffusion,
FFN = convection). The Strang-Marchuk splitting gives half a convection step, a full diffusion
step and another half convection step. With $\phi$ = ``ffn_scale`` (upstream ``fc_factor = 0.5``),
$F'$ the Macaron FFN (``macaron_fc1``/``macaron_fc2``), $F$ the second FFN (``fc1``/``fc2``),
$A$ the attention sublayer and the three LayerNorms $N_2, N_0, N_1$ (``layer_norms.2``, ``.0``,
``.1``, upstream's indices), the pre-norm form (``normalize_before=True``) is

$$x_1 = x + \phi\,F'(N_2x),\qquad x_2 = x_1 + A(N_0x_1),\qquad y = x_2 + \phi\,F(N_1x_2),$$

and the post-norm form (``normalize_before=False``, fairseq's default and the paper's ``base``):

$$x_1 = N_2(x + \phi\,F'(x)),\qquad x_2 = N_0(x_1 + A(x_1)),\qquad y = N_1(x_2 + \phi\,F(x_2)).$$

Each FFN is $F(h) = \mathrm{act}(hW_1 + b_1)W_2 + b_2$ (ReLU upstream). The attention is any token
mixer (see `refattn.blocks.core`): a registry slug, default ``"multi_head_attention"``, or a
``(forward, backward)`` pair, with its parameters under ``"self_attn.<key>"``.

Backward
--------
One step $u = x + s\,G(N x)$ (pre-norm) has $dh = J_G^\top(s\,du)$, $dx = du + J_N^\top dh$; the
post-norm step $u = N(x + s\,G(x))$ has $dr = J_N^\top du$, $dx = dr + J_G^\top(s\,dr)$. The three
steps are undone in reverse order; $J_G^\top$ is the FFN's VJP ($dW_2 = h^\top dy$, $da = dy
W_2^\top\odot\mathrm{act}'(a)$, $dW_1 = x^\top da$) or the attention's own backward (chained through
``Sublayer.vjp``, never a hard-coded SDPA); $J_N^\top$ is the LayerNorm VJP of `refattn.nn.norms`.

Conventions
-----------
``normalize_before`` (fairseq ``encoder_normalize_before``; False in ``base_architecture``, True in
the ``*_macaron_v2`` architectures), ``ffn_scale`` (0.5; 1 gives the standard layer with an extra
FFN), ``activation`` (``"relu"`` as the translation code), ``eps`` (1e-5, ``nn.LayerNorm``). The
decoder layer (self-attention, cross-attention, FFNs) is not reproduced; dropout is omitted
(evaluation mode).

Agreement with upstream
-----------------------
The upstream ``TransformerEncoderLayer`` with its fairseq-0.6 ``MultiheadAttention`` (packed
``in_proj_weight``: ``q_proj = in_proj_weight[:C].T`` ...; one in-place ``q *= scaling`` made
out-of-place for torch 2), run in float64 on CPU: output and every gradient agree to
$1.9\times10^{-7}$ relative, which is upstream's softmax computed in float32
(``F.softmax(attn_weights.float())``); with that cast removed, $2.1\times10^{-15}$ (post-norm)
and $8.9\times10^{-16}$ (pre-norm).
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_choice, check_positive, check_weight_in
from ..registry import Mechanism, Sample, register
from .core import (
    ACTIVATIONS,
    add_prefix,
    block_dtype,
    init_attention_params,
    mlp_backward,
    mlp_forward,
    mlp_spec,
    norm_backward,
    norm_forward,
    norm_spec,
    param_dim,
    resolve_sublayer,
    split_block_params,
)

__all__ = ["macaron_block_forward", "macaron_block_backward", "macaron_block", "MACARON_STEPS"]

MACARON_STEPS = (("layer_norms.2", ("macaron_fc1", "macaron_fc2")), ("layer_norms.0", None),
                 ("layer_norms.1", ("fc1", "fc2")))
"""The three residual steps in order: (norm prefix, FFN prefixes or None for the attention)."""


def macaron_block_forward(x, params, *, attention=None, attention_config=None, normalize_before: bool = False,
                          ffn_scale: float = 0.5, activation: str = "relu", eps: float = 1e-5):
    r"""Macaron layer FFN/2 -> attention -> FFN/2 (module docstring), token-major ``x (..., N, C)``.

    Parameters
    ----------
    x : array (..., N, C)
    params : dict
        Upstream names, linear weights ``(in, out)`` (PyTorch ``weight.T``):
        ``"macaron_fc1.weight" (C, F)``, ``"macaron_fc2.weight" (F, C)``, ``"fc1.weight" (C, F)``,
        ``"fc2.weight" (F, C)`` with optional ``".bias"`` entries; ``"layer_norms.{0,1,2}.weight"``
        and ``".bias"`` ``(C,)`` (0 attention, 1 FFN, 2 Macaron FFN); the attention's parameters
        under ``"self_attn.<key>"``.
    attention : str, (forward, backward) or Sublayer, optional
        The attention sublayer; default ``"multi_head_attention"``.
    attention_config : dict, optional
        Its keyword configuration (``{"num_heads": 4}``, masks ...).
    normalize_before : bool
        Pre-norm (True) or post-norm (False, fairseq's default).
    ffn_scale : float
        $\phi$, the weight of both FFN steps (0.5).
    activation : {"relu", "gelu", "gelu_tanh", "silu"}
    eps : float
        LayerNorm epsilon.

    Returns
    -------
    y, cache
        ``y`` of the shape of ``x``.
    """
    x = as_float(x, "x", min_ndim=2)
    if not isinstance(normalize_before, (bool, np.bool_)):
        raise TypeError(f"normalize_before must be a bool; got {type(normalize_before).__name__}")
    scale = check_positive(ffn_scale, "ffn_scale", allow_zero=True)
    eps = check_positive(eps, "eps", allow_zero=True)
    check_choice(activation, "activation", ACTIVATIONS)
    attn = resolve_sublayer("multi_head_attention" if attention is None else attention, prefix="self_attn",
                            config=attention_config)
    c = x.shape[-1]
    check_weight_in(params, "fc1.weight", c, input_name="x")  # F is read off its output axis
    hidden = param_dim(params, "fc1.weight", 1, where="macaron_block", shape=("C", "F"))
    spec = mlp_spec("macaron_fc1", "macaron_fc2", c, hidden)
    spec.update(mlp_spec("fc1", "fc2", c, hidden))
    for i in range(3):
        spec.update(norm_spec(f"layer_norms.{i}", c))
    optional = [k for k in spec if k.endswith(".bias") and not k.startswith("layer_norms")]
    own, (ap,) = split_block_params(params, spec, (attn,), optional=optional, where="macaron_block")
    dt = block_dtype(x, own, (ap,))
    x, own, ap = x.astype(dt, copy=False), cast_all(dt, own), cast_all(dt, ap)
    steps = []
    h = x
    for norm, ffn in MACARON_STEPS:
        s = 1.0 if ffn is None else scale
        z, cn = norm_forward(own, norm, h, eps=eps) if normalize_before else (h, None)
        if ffn is None:
            g, cg = attn.apply(z, ap)
        else:
            g, cg = mlp_forward(own, z, fc1=ffn[0], fc2=ffn[1], activation=activation)
        r = h + s * g
        if not normalize_before:
            r, cn = norm_forward(own, norm, r, eps=eps)
        steps.append((ffn, s, cn, cg))
        h = r
    cache = {"steps": steps, "attn": attn, "params": own, "pre": bool(normalize_before), "shape": x.shape,
             "dtype": dt}
    return h, cache


def macaron_block_backward(dout, cache):
    r"""Gradients of `macaron_block_forward` for ``x`` and every params key (the attention's under
    ``"self_attn.<key>"``): the three steps undone in reverse (module docstring)."""
    g = as_dout(dout, cache["shape"], cache["dtype"])
    own, attn = cache["params"], cache["attn"]
    grads = {}
    for ffn, s, cn, cg in reversed(cache["steps"]):
        if not cache["pre"]:
            g = norm_backward(grads, own, g, cn)
        dz = attn.vjp(g, cg, grads) if ffn is None else mlp_backward(grads, own, s * g, cg)
        if cache["pre"]:
            dz = norm_backward(grads, own, dz, cn)
        g = g + dz
    grads["x"] = g
    return grads


def macaron_block(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of `macaron_block_forward`."""
    return macaron_block_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _params(rng, c, f, attention="multi_head_attention", heads=1):
    p = {}
    for a, b in (("macaron_fc1", "macaron_fc2"), ("fc1", "fc2")):
        p[f"{a}.weight"] = rng.standard_normal((c, f)) / np.sqrt(c)
        p[f"{a}.bias"] = 0.5 * rng.standard_normal(f)
        p[f"{b}.weight"] = rng.standard_normal((f, c)) / np.sqrt(f)
        p[f"{b}.bias"] = 0.1 * rng.standard_normal(c)
    for i in range(3):
        p[f"layer_norms.{i}.weight"] = 1.0 + 0.2 * rng.standard_normal(c)
        p[f"layer_norms.{i}.bias"] = 0.1 * rng.standard_normal(c)
    ap, acfg = init_attention_params(rng, attention, c, heads)
    p.update(add_prefix(ap, "self_attn"))
    return p, acfg


def _sample(rng, size):
    attention = str(rng.choice(["multi_head_attention", "diff_attention_v1"]))
    if size == "tiny":
        n, c, f, h = int(rng.integers(2, 4)), (3 if attention == "multi_head_attention" else 4), 3, 1
    else:
        n, c, f, h = int(rng.integers(4, 7)), 8, 12, 2
    p, acfg = _params(rng, c, f, attention, h)
    cfg = {"attention": attention, "attention_config": acfg, "normalize_before": bool(rng.random() < 0.5)}
    return Sample(inputs={"x": rng.standard_normal((2, n, c))}, params=p, config=cfg)


def _ln(x, p, key, eps):
    from ..nn.norms import layer_norm

    return layer_norm(x, {"weight": p[f"{key}.weight"], "bias": p[f"{key}.bias"]}, eps=eps)


def _ffn(x, p, a, b, act="relu"):
    from .core import activation_functions

    f, _ = activation_functions(act)
    return f(x @ p[f"{a}.weight"] + p.get(f"{a}.bias", 0.0)) @ p[f"{b}.weight"] + p.get(f"{b}.bias", 0.0)


def _attn(x, p, attention, cfg):
    from .. import registry

    sub = {k[len("self_attn."):]: v for k, v in p.items() if k.startswith("self_attn.")}
    return registry.get(attention or "multi_head_attention").forward(x, params=sub, **(cfg or {}))[0]


def _reference(x, params, attention=None, attention_config=None, normalize_before=False, ffn_scale=0.5,
               activation="relu", eps=1e-5):
    # The fairseq layer written out step by step with refattn.nn.layer_norm and the registry attention.
    p = params
    if normalize_before:
        x1 = x + ffn_scale * _ffn(_ln(x, p, "layer_norms.2", eps), p, "macaron_fc1", "macaron_fc2", activation)
        x2 = x1 + _attn(_ln(x1, p, "layer_norms.0", eps), p, attention, attention_config)
        return x2 + ffn_scale * _ffn(_ln(x2, p, "layer_norms.1", eps), p, "fc1", "fc2", activation)
    x1 = _ln(x + ffn_scale * _ffn(x, p, "macaron_fc1", "macaron_fc2", activation), p, "layer_norms.2", eps)
    x2 = _ln(x1 + _attn(x1, p, attention, attention_config), p, "layer_norms.0", eps)
    return _ln(x2 + ffn_scale * _ffn(x2, p, "fc1", "fc2", activation), p, "layer_norms.1", eps)


def _check_half_step_weights(rng):
    # ffn_scale = 1/2 is the same layer as ffn_scale = 1 with both output projections halved.
    s = _sample(rng, "small")
    err = 0.0
    for pre in (False, True):
        cfg = dict(s.config, normalize_before=pre)
        half = macaron_block(**s.inputs, params=s.params, **cfg)
        p = dict(s.params)
        for k in ("macaron_fc2.weight", "macaron_fc2.bias", "fc2.weight", "fc2.bias"):
            p[k] = 0.5 * p[k]
        full = macaron_block(**s.inputs, params=p, **dict(cfg, ffn_scale=1.0))
        err = max(err, float(np.abs(half - full).max()))
    assert err < 1e-12, f"half-step FFN weights differ from halved projections by {err}"
    return err


def _check_zero_macaron_is_standard_layer(rng):
    # With the Macaron FFN zeroed and ffn_scale = 1 the layer is fairseq's standard post-norm layer
    # LN1(u + FFN(u)), u = LN0(x' + Attn(x')), x' = LN2(x).
    s = _sample(rng, "small")
    p = dict(s.params)
    p["macaron_fc2.weight"] = np.zeros_like(p["macaron_fc2.weight"])
    p["macaron_fc2.bias"] = np.zeros_like(p["macaron_fc2.bias"])
    cfg = dict(s.config, normalize_before=False, ffn_scale=1.0)
    y = macaron_block(**s.inputs, params=p, **cfg)
    x0 = _ln(s.inputs["x"], p, "layer_norms.2", 1e-5)
    u = _ln(x0 + _attn(x0, p, cfg["attention"], cfg["attention_config"]), p, "layer_norms.0", 1e-5)
    ref = _ln(u + _ffn(u, p, "fc1", "fc2"), p, "layer_norms.1", 1e-5)
    err = float(np.abs(y - ref).max())
    assert err < 1e-12, f"zero Macaron FFN differs from the standard layer by {err}"
    return err


register(
    Mechanism(
        slug="macaron_block", family="5-building-blocks", tier="T2",
        title="Macaron block: FFN/2 - attention - FFN/2 (Strang-Marchuk splitting), pluggable attention",
        paper="Lu, Li, He, Sun, Dong, Qin, Wang, Liu, Understanding and Improving Transformer From a "
              "Multi-Particle Dynamic System Point of View, arXiv 1906.02762 (2019)",
        forward=macaron_block_forward, backward=macaron_block_backward, sample=_sample, reference=_reference,
        docs="blocks/residual-blocks.md#macaron-block",
        checks={"half_step_weights": _check_half_step_weights,
                "zero_macaron_ffn_is_standard_layer": _check_zero_macaron_is_standard_layer},
    ),
)
