r"""LayerScale: a pre-norm block whose two residual branches are scaled per channel (CaiT).

Touvron, Cord, Sablayrolles, Synnaeve, Jégou, "Going deeper with Image Transformers", ICCV 2021,
arXiv 2103.17239. Upstream: facebookresearch/deit ``cait_models.py`` (``LayerScale_Block``) and
``models_v2.py`` (``Layer_scale_init_Block``, the DeiT III block) @
7e160fe43f0252d17191b71cbb5826254114ea5b.

Forward
-------
With learnable per-channel $\gamma_1, \gamma_2\in\mathbb R^C$ (``gamma_1``, ``gamma_2``), the
LayerNorms $N_1, N_2$ (``norm1``, ``norm2``), an attention sublayer $A$ and the MLP
$M(h) = \mathrm{GELU}(hW_1 + b_1)W_2 + b_2$ (``mlp.fc1``, ``mlp.fc2``, timm's ``Mlp``):

$$u = x + \gamma_1\odot A(N_1x),\qquad y = u + \gamma_2\odot M(N_2u).$$

The attention is any token mixer (`refattn.blocks.core`): a registry slug (default
``"multi_head_attention"``) or a ``(forward, backward)`` pair, parameters under ``"attn.<key>"``.
CaiT's own blocks use talking-heads attention; DeiT III's ``Layer_scale_init_Block`` uses plain
multi-head attention (its fused ``qkv`` weight maps to ``attn.q_proj = qkv.weight[:C].T`` ...).

Initialisation
--------------
$\gamma$ starts at a small constant $\epsilon$: the paper sets $\epsilon = 0.1$ up to depth 18,
$10^{-5}$ at depth 24 and $10^{-6}$ beyond (`layerscale_init_value`). The released models differ
in places (``cait_XXS36``/``XS36`` use $10^{-5}$ at depth 36); the module default
``init_values=1e-4`` is ``LayerScale_Block``'s.

Backward
--------
$$d\gamma_2 = \textstyle\sum_{\text{tokens}} dy\odot M,\quad du = dy + J_{N_2}^\top J_M^\top(\gamma_2\odot dy),$$
$$d\gamma_1 = \textstyle\sum_{\text{tokens}} du\odot A,\quad dx = du + J_{N_1}^\top J_A^\top(\gamma_1\odot du),$$

$J_A^\top$ the attention's own backward (``Sublayer.vjp``), $J_M^\top$ and $J_N^\top$ the MLP and
LayerNorm VJPs of `refattn.blocks.core`.

Conventions
-----------
``eps`` (LayerNorm, ``1e-6`` as every CaiT model's ``partial(nn.LayerNorm, eps=1e-6)``),
``activation`` (``"gelu"`` exact, timm's ``nn.GELU``). Dropout and drop-path are omitted
(evaluation mode). CaiT's class-attention stage (``LayerScale_Block_CA``) is not reproduced.

Agreement with upstream
-----------------------
``cait_models.LayerScale_Block`` with ``Attention_block=models_v2.Attention`` (timm's MHA), run in
float64 on CPU (timm's ``Mlp`` transcribed: fc1, GELU, fc2): output and the gradients of ``x`` and
every parameter (norms, fused ``qkv`` split into ``attn.q_proj``/``k_proj``/``v_proj``,
``attn.proj`` = ``attn.out_proj``, MLP, ``gamma_1``, ``gamma_2``) agree to
$6.7\times10^{-16}$ relative. (The key-bias gradient is exactly zero in theory, softmax being
invariant to a per-query constant; both sides give rounding noise below $10^{-16}$.)
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_choice, check_positive
from ..registry import Mechanism, Sample, register
from .core import (
    ACTIVATIONS,
    add_grad,
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

__all__ = ["layerscale_block_forward", "layerscale_block_backward", "layerscale_block", "layerscale_init_value"]


def layerscale_init_value(depth: int) -> float:
    r"""The paper's initial $\epsilon$ of $\gamma$ for a network of ``depth`` blocks: 0.1 up to
    depth 18, $10^{-5}$ up to depth 24, $10^{-6}$ beyond (Touvron et al. 2021, Sec. 3)."""
    if isinstance(depth, (bool, np.bool_)) or not isinstance(depth, (int, np.integer)):
        raise TypeError(f"depth must be an integer; got {type(depth).__name__}")
    if depth < 1:
        raise ValueError(f"depth must be >= 1; got {depth}")
    if depth <= 18:
        return 0.1
    return 1e-5 if depth <= 24 else 1e-6


def layerscale_block_forward(x, params, *, attention=None, attention_config=None, eps: float = 1e-6,
                             activation: str = "gelu"):
    r"""CaiT's LayerScale block $u = x + \gamma_1\odot A(N_1x)$, $y = u + \gamma_2\odot M(N_2u)$.

    Parameters
    ----------
    x : array (..., N, C)
    params : dict
        ``"gamma_1" (C,)``, ``"gamma_2" (C,)``, ``"norm1.weight"/".bias" (C,)``,
        ``"norm2.weight"/".bias" (C,)``, ``"mlp.fc1.weight" (C, F)``, ``"mlp.fc2.weight" (F, C)``
        with optional ``".bias"``; the attention's parameters under ``"attn.<key>"``.
    attention : str, (forward, backward) or Sublayer, optional
        The attention sublayer; default ``"multi_head_attention"``.
    attention_config : dict, optional
        Its keyword configuration (``{"num_heads": 4}`` ...).
    eps : float
        LayerNorm epsilon.
    activation : {"relu", "gelu", "gelu_tanh", "silu"}
        MLP activation.

    Returns
    -------
    y, cache
        ``y`` of the shape of ``x``.
    """
    x = as_float(x, "x", min_ndim=2)
    eps = check_positive(eps, "eps", allow_zero=True)
    check_choice(activation, "activation", ACTIVATIONS)
    attn = resolve_sublayer("multi_head_attention" if attention is None else attention, prefix="attn",
                            config=attention_config)
    c = x.shape[-1]
    hidden = param_dim(params, "mlp.fc1.weight", 1, where="layerscale_block", shape=("C", "F"))
    spec = {"gamma_1": (c,), "gamma_2": (c,)}
    spec.update(norm_spec("norm1", c))
    spec.update(norm_spec("norm2", c))
    spec.update(mlp_spec("mlp.fc1", "mlp.fc2", c, hidden))
    optional = ["mlp.fc1.bias", "mlp.fc2.bias"]
    own, (ap,) = split_block_params(params, spec, (attn,), optional=optional, where="layerscale_block")
    dt = block_dtype(x, own, (ap,))
    x, own, ap = x.astype(dt, copy=False), cast_all(dt, own), cast_all(dt, ap)
    h1, c1 = norm_forward(own, "norm1", x, eps=eps)
    a, ca = attn.apply(h1, ap)
    u = x + own["gamma_1"] * a
    h2, c2 = norm_forward(own, "norm2", u, eps=eps)
    m, cm = mlp_forward(own, h2, fc1="mlp.fc1", fc2="mlp.fc2", activation=activation)
    y = u + own["gamma_2"] * m
    cache = {"params": own, "attn": attn, "c1": c1, "ca": ca, "a": a, "c2": c2, "cm": cm, "m": m,
             "shape": x.shape, "dtype": dt}
    return y, cache


def layerscale_block_backward(dout, cache):
    r"""Gradients of `layerscale_block_forward` for ``x`` and every params key (the attention's
    under ``"attn.<key>"``), module docstring."""
    g = as_dout(dout, cache["shape"], cache["dtype"])
    own, attn = cache["params"], cache["attn"]
    lead = tuple(range(g.ndim - 1))
    grads = {}
    add_grad(grads, "gamma_2", np.sum(g * cache["m"], axis=lead))
    du = g + norm_backward(grads, own, mlp_backward(grads, own, own["gamma_2"] * g, cache["cm"]), cache["c2"])
    add_grad(grads, "gamma_1", np.sum(du * cache["a"], axis=lead))
    grads["x"] = du + norm_backward(grads, own, attn.vjp(own["gamma_1"] * du, cache["ca"], grads), cache["c1"])
    return grads


def layerscale_block(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of `layerscale_block_forward`."""
    return layerscale_block_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _params(rng, c, f, attention="multi_head_attention", heads=1, gamma=None):
    p = {"gamma_1": 0.5 + 0.3 * rng.standard_normal(c) if gamma is None else np.full(c, gamma),
         "gamma_2": 0.5 + 0.3 * rng.standard_normal(c) if gamma is None else np.full(c, gamma)}
    for n in ("norm1", "norm2"):
        p[f"{n}.weight"] = 1.0 + 0.2 * rng.standard_normal(c)
        p[f"{n}.bias"] = 0.1 * rng.standard_normal(c)
    p["mlp.fc1.weight"] = rng.standard_normal((c, f)) / np.sqrt(c)
    p["mlp.fc1.bias"] = 0.3 * rng.standard_normal(f)
    p["mlp.fc2.weight"] = rng.standard_normal((f, c)) / np.sqrt(f)
    p["mlp.fc2.bias"] = 0.1 * rng.standard_normal(c)
    ap, acfg = init_attention_params(rng, attention, c, heads)
    p.update(add_prefix(ap, "attn"))
    return p, acfg


def _sample(rng, size, attention=None):
    attention = attention or str(rng.choice(["multi_head_attention", "diff_attention_v1"]))
    if size == "tiny":
        n, c, f, h = int(rng.integers(2, 4)), (3 if attention == "multi_head_attention" else 4), 3, 1
    else:
        n, c, f, h = int(rng.integers(4, 7)), 8, 12, 2
    p, acfg = _params(rng, c, f, attention, h)
    return Sample(inputs={"x": rng.standard_normal((2, n, c))}, params=p,
                  config={"attention": attention, "attention_config": acfg})


def _reference(x, params, attention=None, attention_config=None, eps=1e-6, activation="gelu"):
    # The two residual steps written out with refattn.nn.layer_norm and the registry attention.
    from .. import registry
    from ..nn.norms import layer_norm
    from .core import activation_functions

    p = params
    f, _ = activation_functions(activation)

    def ln(z, k):
        return layer_norm(z, {"weight": p[f"{k}.weight"], "bias": p[f"{k}.bias"]}, eps=eps)

    sub = {k[len("attn."):]: v for k, v in p.items() if k.startswith("attn.")}
    attn = registry.get(attention or "multi_head_attention").forward
    u = x + p["gamma_1"] * attn(ln(x, "norm1"), params=sub, **(attention_config or {}))[0]
    hid = f(ln(u, "norm2") @ p["mlp.fc1.weight"] + p["mlp.fc1.bias"])
    return u + p["gamma_2"] * (hid @ p["mlp.fc2.weight"] + p["mlp.fc2.bias"])


def _check_zero_gamma_is_identity(rng):
    # The catalogue identity: gamma = 0 makes the block the identity map, with dx = dy and the
    # gamma gradients the token sums of dy * branch.
    s = _sample(rng, "small")
    p = dict(s.params, gamma_1=np.zeros_like(s.params["gamma_1"]), gamma_2=np.zeros_like(s.params["gamma_2"]))
    y, cache = layerscale_block_forward(s.inputs["x"], p, **s.config)
    dy = rng.standard_normal(y.shape)
    g = layerscale_block_backward(dy, cache)
    err = max(float(np.abs(y - s.inputs["x"]).max()), float(np.abs(g["x"] - dy).max()))
    zero_keys = [k for k in g if k not in ("x", "gamma_1", "gamma_2")]
    err = max(err, max(float(np.abs(g[k]).max()) for k in zero_keys))
    assert err == 0.0, f"gamma = 0 is not the identity block: {err}"
    return err


def _check_unit_gamma_is_prenorm_block(rng):
    # gamma = 1 is the plain pre-norm block of refattn.blocks.core (ViT/DeiT Block).
    from .core import BlockNames, transformer_block_forward

    s = _sample(rng, "small")
    p = dict(s.params, gamma_1=np.ones_like(s.params["gamma_1"]), gamma_2=np.ones_like(s.params["gamma_2"]))
    y = layerscale_block(s.inputs["x"], p, **s.config)
    attn = resolve_sublayer(s.config["attention"], prefix="attn", config=s.config["attention_config"])
    own = {k: v for k, v in p.items() if not k.startswith("attn.") and not k.startswith("gamma")}
    sub = {k[5:]: v for k, v in p.items() if k.startswith("attn.")}
    ref, _ = transformer_block_forward(s.inputs["x"], own, attn, sub, eps=1e-6,
                                       names=BlockNames("norm1", "norm2", "mlp.fc1", "mlp.fc2"))
    err = float(np.abs(y - ref).max())
    assert err < 1e-13, f"gamma = 1 differs from the pre-norm block by {err}"
    return err


def _check_init_values(rng):
    vals = [layerscale_init_value(d) for d in (1, 12, 18, 19, 24, 25, 36, 48)]
    assert vals == [0.1, 0.1, 0.1, 1e-5, 1e-5, 1e-6, 1e-6, 1e-6], vals
    return 0.0


register(
    Mechanism(
        slug="layerscale", family="5-building-blocks", tier="T2",
        title="LayerScale block: x + diag(gamma_1) Attn(LN x), + diag(gamma_2) MLP(LN x) (CaiT), pluggable attention",
        paper="Touvron, Cord, Sablayrolles, Synnaeve, Jegou, Going deeper with Image Transformers, ICCV 2021, "
              "arXiv 2103.17239",
        forward=layerscale_block_forward, backward=layerscale_block_backward, sample=_sample, reference=_reference,
        docs="blocks/norms-activations-init.md#layerscale",
        checks={"zero_gamma_is_identity": _check_zero_gamma_is_identity,
                "unit_gamma_is_prenorm_block": _check_unit_gamma_is_prenorm_block,
                "init_values": _check_init_values},
    ),
)
