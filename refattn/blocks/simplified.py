r"""Simplified Transformer block (He & Hofmann): parallel, skipless, value/projection-free.

He, Hofmann, "Simplifying Transformer Blocks", ICLR 2024, arXiv 2311.01906. Upstream:
bobby-he/simplified_transformers ``simplified_transformers/model_utils.py`` (``myGPT2Block``,
``myGPT2Attention``, ``myGPT2MLP``, ``MyConv1D``) with the ``skipless-parallel`` model config
(``config/model/skipless-parallel.yaml`` over ``skipless.yaml`` and ``default.yaml``) @
8d4ea7965f61c61259123a37ff06cdef636845c0.

Forward (the SAS-P block)
-------------------------
Starting from a Pre-LN parallel block, the paper removes the attention skip connection, the value
and projection matrices (fixed to the identity), the MLP skip and the normalisation layers (except
a LayerNorm on the input of the first layer). With $h = N(x)$ ($N$ = identity, ``norm="none"``,
or the first layer's LayerNorm ``ln_1``):

$$y = \beta_A\,\mathrm{SA}(h) + \beta_M\,\mathrm{MLP}(h)\;[+\;\alpha_M\,x],\qquad
\mathrm{MLP}(h) = \mathrm{ReLU}(hW_{fc})W_{proj},$$

with the scalar gains $\beta_A$ = ``attn_block_resid_gain`` (1), $\beta_M$ =
``mlp_block_resid_gain`` (0.1, "O(1/sqrt(depth))") and the optional MLP skip $\alpha_M$ =
``mlp_block_skip_gain`` (upstream adds it only when nonzero; 0 in SAS-P). The default attention
sublayer is the shaped attention with identity values (`shaped_attention_sublayer_forward`):

$$[Q\,K] = hW_{qk} + b_{qk},\qquad A_h = \beta_h\,\mathrm{softmax}\!\big(Q_hK_h^\top/\sqrt{d} + M\big)
+ \alpha_h I - \gamma_h C,\qquad \mathrm{SA}(h) = [A_1V_1 \| \dots \| A_HV_H],\ V = h,$$

$C$ the uniform causal matrix $C_{ij} = 1/(i+1)$, $j\le i$ (``uniform_causal_attn_mat``) and per-head
gains $\beta, \alpha, \gamma$ (``attn_mat_resid_gain``, ``attn_mat_skip_gain``, ``centre_attn_gain``;
all 1 at init). The shaped core is the registry's ``shaped_attention``, whose backward the sublayer
chains through. Upstream's first layer keeps a trainable value matrix
(``first_layer_value_resid_gain = 1``): $V = h(r\,W_v + s\,I)$ with ``v_attn.weight`` (zeros at
init), ``v_attn.resid_gain`` $r$ and ``v_attn.skip_gain`` $s$ — optional keys here. Any other token
mixer can replace the shaped sublayer (``attention="multi_head_attention"`` ...).

At initialisation ($W_q = 0$ from ``query_init_std = 0``, $b_{qk} = 0$, $\beta = \gamma$) the
logits are constant, the softmax is $C$ and $A = \alpha I$: $\mathrm{SA}(h) = \alpha h$, the
"identity attention" the paper's signal-propagation argument starts from.

Backward
--------
$d\beta_A = \langle G, \mathrm{SA}(h)\rangle$, $d\beta_M = \langle G, \mathrm{MLP}(h)\rangle$,
$d\alpha_M = \langle G, x\rangle$; $dh = J_{SA}^\top(\beta_AG) + J_{MLP}^\top(\beta_MG)$, $dx = J_N^\top
dh + \alpha_M G$. In the shaped sublayer the core's backward gives $dQ, dK, dV$ and the gain
gradients; $d[Q\,K]$ goes through $W_{qk}$; $dx = d[Q\,K]\,W_{qk}^\top + dV$ (identity values) or
$dV(rW_v + sI)^\top$, with $dW_v = r\,h^\top dV$, $dr = \langle h^\top dV, W_v\rangle$,
$ds = \mathrm{tr}(h^\top dV)$.

Conventions
-----------
Causal (GPT-2) with logits divided by $\sqrt{d_v}$, $d_v$ = head width ($=d$); ``MyConv1D``
stores its weight as ``(in, out)``, so ``qk_attn.weight``, ``mlp.c_fc.weight`` and
``mlp.c_proj.weight`` load without a transpose; the MLP has no biases (upstream's are frozen at 0)
and its activation is ``leaky_relu`` with slope 0 = ReLU (``activation``). ``norm``:
``"none"`` (layers after the first) or ``"layer"`` (``ln_1``, the first layer; eps 1e-5). Upstream's
other switches (sequential sub-blocks, RMSNorm placed with eps outside the root, trainable value
/projection reparameterisation beyond the first layer, tanh logit capping) are not reproduced.
Gradients of the gains are returned whether or not upstream trains them.

Agreement with upstream
-----------------------
Upstream ``myGPT2Block`` (``skipless-parallel`` config; ``transformers.activations`` and
``.cuda()`` stubbed) run in float64 on CPU: output and every gradient (gains included) agree to
$1.2\times10^{-8}$ (layer > 0) and $6.7\times10^{-7}$ (layer 0, LayerNorm and trainable value),
which is upstream's ``uniform_causal_attn_mat`` built in float32; with that buffer rebuilt in
float64, $3.5\times10^{-16}$ and $4.3\times10^{-15}$.
"""

from __future__ import annotations

import numpy as np

from .._checks import (
    as_dout,
    as_float,
    cast_all,
    check_choice,
    check_int,
    check_params,
    check_positive,
    compute_dtype,
)
from ..nn.linear import linear_prefixed, linear_prefixed_spec, linear_prefixed_vjp, merge_heads, split_heads
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

__all__ = ["shaped_attention_sublayer_forward", "shaped_attention_sublayer_backward",
           "simplified_block_he_hofmann_forward", "simplified_block_he_hofmann_backward",
           "simplified_block_he_hofmann"]

_GAINS = ("attn_mat_resid_gain", "attn_mat_skip_gain", "centre_attn_gain")


def shaped_attention_sublayer_forward(x, params, *, num_heads: int, is_causal: bool = True,
                                      centre: str = "uniform_causal"):
    r"""He & Hofmann's attention sub-block: shaped attention with identity values and projection.

    Parameters
    ----------
    x : array (..., N, C)
    params : dict
        ``"qk_attn.weight" (C, 2C)`` (upstream ``MyConv1D`` layout, no transpose), optional
        ``"qk_attn.bias" (2C,)``, the per-head gains ``"attn_mat_resid_gain"``,
        ``"attn_mat_skip_gain"``, ``"centre_attn_gain"`` ``(H,)`` (upstream ``(1, H, 1, 1)``:
        reshape), and optionally the first layer's value reparameterisation ``"v_attn.weight"
        (C, C)`` with ``"v_attn.resid_gain"``, ``"v_attn.skip_gain"`` ``(1,)``.
    num_heads : int
    is_causal : bool
        Default True (GPT-2).
    centre : {"uniform_causal", "uniform", "none"}
        The subtracted map $C$ (see the registry's ``shaped_attention``).

    Returns
    -------
    y, cache
        ``y`` of the shape of ``x``: $[A_hV_h]_h$ with $V = x$ (or $x(rW_v + sI)$).
    """
    from .. import registry

    x = as_float(x, "x", min_ndim=2)
    h = check_int(num_heads, "num_heads", minimum=1)
    c = x.shape[-1]
    if c % h:
        raise ValueError(f"num_heads={h} must divide the width C={c} of x")
    spec = linear_prefixed_spec("qk_attn", c, 2 * c)
    spec.update({g: (h,) for g in _GAINS})
    spec.update({"v_attn.weight": (c, c), "v_attn.resid_gain": (1,), "v_attn.skip_gain": (1,)})
    value_keys = ("v_attn.weight", "v_attn.resid_gain", "v_attn.skip_gain")
    p = check_params(params, spec, optional=("qk_attn.bias",) + value_keys, where="shaped_attention_sublayer")
    has_v = [k in p for k in value_keys]
    if any(has_v) and not all(has_v):
        raise ValueError(f"params must hold all of {list(value_keys)} or none of them")
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    qk = linear_prefixed(p, "qk_attn", x)
    q, k = split_heads(qk[..., :c], h), split_heads(qk[..., c:], h)
    m = p["v_attn.resid_gain"][0] * p["v_attn.weight"] + p["v_attn.skip_gain"][0] * np.eye(c, dtype=dt) \
        if all(has_v) else None
    v = split_heads(x if m is None else x @ m, h)
    core = registry.get("shaped_attention")
    o, cc = core.forward(q, k, v, {g: p[g] for g in _GAINS}, is_causal=is_causal, centre=centre)
    cache = {"x": x, "p": p, "m": m, "core": cc, "backward": core.backward, "h": h, "shape": x.shape, "dtype": dt}
    return merge_heads(o), cache


def shaped_attention_sublayer_backward(dout, cache):
    r"""Gradients of `shaped_attention_sublayer_forward` for ``x`` and every params key (the
    shaped core's backward, then $W_{qk}$ and the value map; module docstring)."""
    x, p, m, h = cache["x"], cache["p"], cache["m"], cache["h"]
    g = as_dout(dout, cache["shape"], cache["dtype"])
    gc = cache["backward"](split_heads(g, h), cache["core"])
    grads = {k: gc[k] for k in _GAINS}
    dqk = np.concatenate([merge_heads(gc["q"]), merge_heads(gc["k"])], axis=-1)
    dx = linear_prefixed_vjp(grads, p, "qk_attn", dqk, x)
    dv = merge_heads(gc["v"])
    if m is None:
        grads["x"] = dx + dv
        return grads
    c = x.shape[-1]
    dm = x.reshape(-1, c).T @ dv.reshape(-1, c)
    grads["v_attn.weight"] = p["v_attn.resid_gain"][0] * dm
    grads["v_attn.resid_gain"] = np.array([np.sum(dm * p["v_attn.weight"])], dtype=x.dtype)
    grads["v_attn.skip_gain"] = np.array([np.trace(dm)], dtype=x.dtype)
    grads["x"] = dx + dv @ m.T
    return grads


def simplified_block_he_hofmann_forward(x, params, *, attention=None, attention_config=None, norm: str = "none",
                                        activation: str = "relu", eps: float = 1e-5):
    r"""Simplified parallel skipless block $y = \beta_A\mathrm{SA}(h) + \beta_M\mathrm{MLP}(h)
    [+ \alpha_Mx]$, $h = N(x)$ (module docstring).

    Parameters
    ----------
    x : array (..., N, C)
    params : dict
        ``"attn_block_resid_gain" (1,)``, ``"mlp_block_resid_gain" (1,)``, optional
        ``"mlp_block_skip_gain" (1,)``, ``"mlp.c_fc.weight" (C, F)``, ``"mlp.c_proj.weight" (F, C)``
        (``(in, out)`` as upstream; optional ``".bias"``), ``"ln_1.weight"``/``"ln_1.bias"`` when
        ``norm="layer"``, and the attention's parameters under ``"attn.<key>"``.
    attention : str, (forward, backward) or Sublayer, optional
        Default: the shaped-attention sublayer (`shaped_attention_sublayer_forward`), whose
        ``attention_config`` needs ``num_heads``.
    attention_config : dict, optional
    norm : {"none", "layer"}
    activation : {"relu", "gelu", "gelu_tanh", "silu"}
    eps : float
    """
    x = as_float(x, "x", min_ndim=2)
    check_choice(norm, "norm", ("none", "layer"))
    check_choice(activation, "activation", ACTIVATIONS)
    eps = check_positive(eps, "eps", allow_zero=True)
    if attention is None:
        attention = (shaped_attention_sublayer_forward, shaped_attention_sublayer_backward)
    attn = resolve_sublayer(attention, prefix="attn", config=attention_config)
    c = x.shape[-1]
    hidden = param_dim(params, "mlp.c_fc.weight", 1, where="simplified_block_he_hofmann", shape=("C", "F"))
    spec = {"attn_block_resid_gain": (1,), "mlp_block_resid_gain": (1,), "mlp_block_skip_gain": (1,)}
    spec.update(mlp_spec("mlp.c_fc", "mlp.c_proj", c, hidden))
    spec.update(norm_spec("ln_1", c, norm))
    optional = ("mlp_block_skip_gain", "mlp.c_fc.bias", "mlp.c_proj.bias")
    own, (ap,) = split_block_params(params, spec, (attn,), optional=optional, where="simplified_block_he_hofmann")
    dt = block_dtype(x, own, (ap,))
    x, own, ap = x.astype(dt, copy=False), cast_all(dt, own), cast_all(dt, ap)
    hn, cn = norm_forward(own, "ln_1", x, kind=norm, eps=eps)
    sa, ca = attn.apply(hn, ap)
    mlp, cm = mlp_forward(own, hn, fc1="mlp.c_fc", fc2="mlp.c_proj", activation=activation)
    y = own["attn_block_resid_gain"][0] * sa + own["mlp_block_resid_gain"][0] * mlp
    if "mlp_block_skip_gain" in own:
        y = y + own["mlp_block_skip_gain"][0] * x
    cache = {"x": x, "sa": sa, "mlp": mlp, "cn": cn, "ca": ca, "cm": cm, "attn": attn, "params": own,
             "shape": x.shape, "dtype": dt}
    return y, cache


def simplified_block_he_hofmann_backward(dout, cache):
    """Gradients of `simplified_block_he_hofmann_forward` for ``x`` and every params key."""
    own = cache["params"]
    g = as_dout(dout, cache["shape"], cache["dtype"])
    dt = cache["dtype"]
    grads = {"attn_block_resid_gain": np.array([np.sum(g * cache["sa"])], dtype=dt),
             "mlp_block_resid_gain": np.array([np.sum(g * cache["mlp"])], dtype=dt)}
    dh = cache["attn"].vjp(own["attn_block_resid_gain"][0] * g, cache["ca"], grads)
    dh = dh + mlp_backward(grads, own, own["mlp_block_resid_gain"][0] * g, cache["cm"])
    dx = norm_backward(grads, own, dh, cache["cn"])
    if "mlp_block_skip_gain" in own:
        grads["mlp_block_skip_gain"] = np.array([np.sum(g * cache["x"])], dtype=dt)
        dx = dx + own["mlp_block_skip_gain"][0] * g
    grads["x"] = dx
    return grads


def simplified_block_he_hofmann(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of `simplified_block_he_hofmann_forward`."""
    return simplified_block_he_hofmann_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _shaped_params(rng, c, h, value=False):
    p = {"qk_attn.weight": rng.standard_normal((c, 2 * c)) / np.sqrt(c), "qk_attn.bias": 0.2 * rng.standard_normal(2 * c)}
    for g in _GAINS:
        p[g] = 1.0 + 0.3 * rng.standard_normal(h)
    if value:
        p.update({"v_attn.weight": 0.3 * rng.standard_normal((c, c)), "v_attn.resid_gain": 1.0 + 0.2 * rng.standard_normal(1),
                  "v_attn.skip_gain": 1.0 + 0.2 * rng.standard_normal(1)})
    return p


def _sample(rng, size, attention=None):
    kind = attention or "shaped"
    first = bool(rng.random() < 0.5)  # the first layer: LayerNorm and a trainable value matrix
    if size == "tiny":
        n, c, f, h = int(rng.integers(2, 4)), 4, 4, 2
    else:
        n, c, f, h = int(rng.integers(4, 7)), 8, 16, 2
    p = {"attn_block_resid_gain": 1.0 + 0.2 * rng.standard_normal(1), "mlp_block_resid_gain": 0.1 + 0.2 * rng.random(1),
         "mlp.c_fc.weight": rng.standard_normal((c, f)) / np.sqrt(c), "mlp.c_proj.weight": rng.standard_normal((f, c)) / np.sqrt(f)}
    if rng.random() < 0.5:
        p["mlp_block_skip_gain"] = 0.5 + 0.2 * rng.standard_normal(1)
    if first:
        p.update({"ln_1.weight": 1.0 + 0.2 * rng.standard_normal(c), "ln_1.bias": 0.1 * rng.standard_normal(c)})
    cfg = {"norm": "layer" if first else "none"}
    if kind == "shaped":
        p.update(add_prefix(_shaped_params(rng, c, h, value=first), "attn"))
        cfg["attention_config"] = {"num_heads": h}
    else:
        ap, acfg = init_attention_params(rng, kind, c, h if kind == "multi_head_attention" else 1)
        p.update(add_prefix(ap, "attn"))
        cfg.update(attention=kind, attention_config=acfg)
    return Sample(inputs={"x": rng.standard_normal((2, n, c))}, params=p, config=cfg)


def _explicit_shaped(x, p, num_heads):
    # Per batch, head, query: beta softmax(q k / sqrt(d), causal) + alpha e_i - gamma C_i, times V.
    b, n, c = x.shape
    d = c // num_heads
    qk = x @ p["qk_attn.weight"] + p.get("qk_attn.bias", 0.0)
    v = x @ (p["v_attn.resid_gain"][0] * p["v_attn.weight"] + p["v_attn.skip_gain"][0] * np.eye(c)) \
        if "v_attn.weight" in p else x
    out = np.zeros_like(x)
    for bi in range(b):
        for hh in range(num_heads):
            sl = slice(hh * d, (hh + 1) * d)
            q, k, vv = qk[bi, :, sl], qk[bi, :, c + hh * d:c + (hh + 1) * d], v[bi, :, sl]
            for i in range(n):
                s = q[i] @ k[: i + 1].T / np.sqrt(d)
                w = np.exp(s - s.max())
                row = np.zeros(n)
                row[: i + 1] = p["attn_mat_resid_gain"][hh] * w / w.sum() - p["centre_attn_gain"][hh] / (i + 1)
                row[i] += p["attn_mat_skip_gain"][hh]
                out[bi, i, sl] = row @ vv
    return out


def _reference(x, params, attention=None, attention_config=None, norm="none", activation="relu", eps=1e-5):
    from .. import registry
    from ..nn.norms import layer_norm

    p = params
    h = layer_norm(x, {"weight": p["ln_1.weight"], "bias": p["ln_1.bias"]}, eps=eps) if norm == "layer" else x
    ap = {k[5:]: v for k, v in p.items() if k.startswith("attn.")}
    if attention is None:
        sa = _explicit_shaped(h, ap, attention_config["num_heads"])
    else:
        sa = registry.get(attention).forward(h, params=ap, **attention_config)[0]
    y = p["attn_block_resid_gain"][0] * sa + p["mlp_block_resid_gain"][0] * (
        np.maximum(h @ p["mlp.c_fc.weight"], 0.0) @ p["mlp.c_proj.weight"])
    return y + p["mlp_block_skip_gain"][0] * x if "mlp_block_skip_gain" in p else y


def _check_identity_attention_at_init(rng):
    # W_q = 0, b_qk = 0, beta = gamma: constant logits, softmax = C, A = alpha I, SA(x) = alpha x per head.
    x = rng.standard_normal((2, 5, 6))
    p = _shaped_params(rng, 6, 3)
    p["qk_attn.weight"][:, :6] = 0.0
    p["qk_attn.bias"] = np.zeros(12)
    p["centre_attn_gain"] = p["attn_mat_resid_gain"].copy()
    y, _ = shaped_attention_sublayer_forward(x, p, num_heads=3)
    err = float(np.abs(y - x * np.repeat(p["attn_mat_skip_gain"], 2)).max())
    assert err < 1e-12, f"the attention sub-block at initialisation is not alpha x (error {err})"
    return err


def _check_causal(rng):
    s = _sample(rng, "small", "shaped")
    x = s.inputs["x"]
    y = simplified_block_he_hofmann(x, s.params, **s.config)
    x2 = x.copy()
    x2[:, -1] = rng.standard_normal(x2[:, -1].shape)  # not a shift: LayerNorm would remove it
    y2 = simplified_block_he_hofmann(x2, s.params, **s.config)
    err = float(np.abs(y[:, :-1] - y2[:, :-1]).max())
    assert err < 1e-13 and np.abs(y[:, -1] - y2[:, -1]).max() > 1e-6, f"the last token leaks ({err})"
    return err


register(
    Mechanism(
        slug="simplified_block_he_hofmann", family="5-building-blocks", tier="T2",
        title="Simplified Transformer block (parallel, skipless, shaped attention with identity values)",
        paper="He, Hofmann, Simplifying Transformer Blocks, ICLR 2024, arXiv 2311.01906",
        forward=simplified_block_he_hofmann_forward, backward=simplified_block_he_hofmann_backward,
        sample=_sample, reference=_reference, docs="blocks/residual-blocks.md#simplified-transformer-block",
        checks={"identity_attention_at_init": _check_identity_attention_at_init, "causal": _check_causal},
    ),
)
