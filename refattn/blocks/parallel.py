r"""Parallel attention + MLP block: both sublayers read the same normalised input.

Zhong, Zhang, Chakraborty, Dey, "A Neural ODE Interpretation of Transformer Layers", arXiv
2212.06011 (2022, extended abstract): a transformer layer is a Lie-Trotter step of an ODE whose
right-hand side is the sum of an attention and an MLP term; evaluating both on the same state (one
explicit Euler step of the summed field) places the sublayers in parallel. The paper publishes no
code. The same block is GPT-J's (one shared LayerNorm) and GPT-NeoX's ``use_parallel_residual``
(two LayerNorms); upstream files followed: huggingface/transformers
``src/transformers/models/gptj/modeling_gptj.py`` (``GPTJBlock``, ``GPTJMLP``) @
00b676f8f0489b88652a31d70751cc540dd06305 and ``src/transformers/models/gpt_neox/modeling_gpt_neox.py``
(``GPTNeoXLayer``, ``use_parallel_residual=True``) @ 203bf6f1c524062b3c109da5ff67e61f483407e7.

Forward
-------
$$y = x + A(N_1x) + \mathrm{MLP}(N_2x),\qquad \mathrm{MLP}(h) = \mathrm{act}(hW_{in} + b_{in})W_{out} + b_{out},$$

with $N_2 = N_1$ (``shared_norm=True``, GPT-J's single ``ln_1``) or a second LayerNorm ``ln_2``
(``shared_norm=False``, GPT-NeoX's ``input_layernorm``/``post_attention_layernorm``). $A$ is any
token mixer (see `refattn.blocks.core`), default ``"multi_head_attention"``, with its parameters
under ``"attn.<key>"``. The sequential block $u = x + A(N_1x)$, $y = u + \mathrm{MLP}(N_2u)$ differs
only in feeding the MLP $u$ instead of $x$.

Backward
--------
With $G = \partial L/\partial y$: $dh_1 = J_A^\top G$ (the attention's own backward), $dh_2 =
J_{MLP}^\top G$. With a shared norm both branch gradients sum into the one normalised input,
$dx = G + J_{N_1}^\top(dh_1 + dh_2)$; with two norms $dx = G + J_{N_1}^\top dh_1 + J_{N_2}^\top
dh_2$. The norm parameter gradients are summed likewise (a shared $\gamma$ receives both
branches).

Conventions
-----------
``shared_norm`` (True: GPT-J), ``activation`` (``"gelu_tanh"``: GPT-J's ``gelu_new``; GPT-NeoX uses
exact ``"gelu"``), ``norm`` (``"layer"``; ``"rms"`` for RMSNorm-based variants), ``eps`` (1e-5).
Parameter names are GPT-J's (``ln_1``, ``attn``, ``mlp.fc_in``, ``mlp.fc_out``; ``ln_2`` for the
second norm); a GPT-NeoX checkpoint maps ``input_layernorm -> ln_1``,
``post_attention_layernorm -> ln_2``, ``mlp.dense_h_to_4h -> mlp.fc_in``, ``mlp.dense_4h_to_h ->
mlp.fc_out``. GPT-J's rotary attention is one choice of the attention sublayer, not part of the
block; the neural-ODE solver variants of the paper (adaptive integration of the summed field) are
not reproduced. Dropout is omitted (evaluation mode).

Agreement with upstream
-----------------------
``transformers`` is not installed here: ``GPTJBlock``/``GPTJMLP`` and ``GPTNeoXLayer``'s parallel
path were transcribed to torch with ``nn.MultiheadAttention`` as the attention and run in float64:
output and every gradient agree to $6.7\times10^{-16}$ (shared norm) and $5.9\times10^{-16}$
(separate norms).
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_choice, check_positive
from ..registry import Mechanism, Sample, register
from .core import (
    ACTIVATIONS,
    BlockNames,
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
    transformer_block_forward,
)

__all__ = ["parallel_attention_mlp_block_forward", "parallel_attention_mlp_block_backward",
           "parallel_attention_mlp_block"]


def parallel_attention_mlp_block_forward(x, params, *, attention=None, attention_config=None,
                                         shared_norm: bool = True, activation: str = "gelu_tanh",
                                         norm: str = "layer", eps: float = 1e-5):
    r"""Parallel block $y = x + A(N_1x) + \mathrm{MLP}(N_2x)$ (module docstring).

    Parameters
    ----------
    x : array (..., N, C)
    params : dict
        ``"ln_1.weight"``, ``"ln_1.bias"`` ``(C,)`` (and ``"ln_2.*"`` when not ``shared_norm``;
        RMSNorm has no bias), ``"mlp.fc_in.weight" (C, F)``, ``"mlp.fc_out.weight" (F, C)`` with
        optional ``".bias"`` entries (weights ``(in, out)``: PyTorch ``weight.T``), and the
        attention's parameters under ``"attn.<key>"``.
    attention : str, (forward, backward) or Sublayer, optional
        Default ``"multi_head_attention"``.
    attention_config : dict, optional
    shared_norm : bool
        One norm for both branches (GPT-J) or two (GPT-NeoX).
    activation : {"relu", "gelu", "gelu_tanh", "silu"}
    norm : {"layer", "rms"}
    eps : float

    Returns
    -------
    y, cache
    """
    x = as_float(x, "x", min_ndim=2)
    if not isinstance(shared_norm, (bool, np.bool_)):
        raise TypeError(f"shared_norm must be a bool; got {type(shared_norm).__name__}")
    check_choice(activation, "activation", ACTIVATIONS)
    check_choice(norm, "norm", ("layer", "rms"))
    eps = check_positive(eps, "eps", allow_zero=True)
    attn = resolve_sublayer("multi_head_attention" if attention is None else attention, prefix="attn",
                            config=attention_config)
    c = x.shape[-1]
    hidden = param_dim(params, "mlp.fc_in.weight", 1, where="parallel_attention_mlp_block", shape=("C", "F"))
    spec = norm_spec("ln_1", c, norm)
    if not shared_norm:
        spec.update(norm_spec("ln_2", c, norm))
    spec.update(mlp_spec("mlp.fc_in", "mlp.fc_out", c, hidden))
    optional = ("mlp.fc_in.bias", "mlp.fc_out.bias")
    own, (ap,) = split_block_params(params, spec, (attn,), optional=optional,
                                    where="parallel_attention_mlp_block")
    dt = block_dtype(x, own, (ap,))
    x, own, ap = x.astype(dt, copy=False), cast_all(dt, own), cast_all(dt, ap)
    h1, c1 = norm_forward(own, "ln_1", x, kind=norm, eps=eps)
    a, ca = attn.apply(h1, ap)
    h2, c2 = (h1, None) if shared_norm else norm_forward(own, "ln_2", x, kind=norm, eps=eps)
    m, cm = mlp_forward(own, h2, fc1="mlp.fc_in", fc2="mlp.fc_out", activation=activation)
    cache = {"c1": c1, "ca": ca, "c2": c2, "cm": cm, "attn": attn, "params": own, "shape": x.shape, "dtype": dt}
    return x + a + m, cache


def parallel_attention_mlp_block_backward(dout, cache):
    r"""Gradients of `parallel_attention_mlp_block_forward` for ``x`` and every params key: the
    two branch gradients summed into the shared norm (module docstring)."""
    g = as_dout(dout, cache["shape"], cache["dtype"])
    own, grads = cache["params"], {}
    dh1 = cache["attn"].vjp(g, cache["ca"], grads)
    dh2 = mlp_backward(grads, own, g, cache["cm"])
    if cache["c2"] is None:
        dx = g + norm_backward(grads, own, dh1 + dh2, cache["c1"])
    else:
        dx = g + norm_backward(grads, own, dh1, cache["c1"]) + norm_backward(grads, own, dh2, cache["c2"])
    grads["x"] = dx
    return grads


def parallel_attention_mlp_block(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of `parallel_attention_mlp_block_forward`."""
    return parallel_attention_mlp_block_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _params(rng, c, f, attention, heads, shared):
    p = {}
    for ln in ("ln_1",) if shared else ("ln_1", "ln_2"):
        p[f"{ln}.weight"] = 1.0 + 0.2 * rng.standard_normal(c)
        p[f"{ln}.bias"] = 0.1 * rng.standard_normal(c)
    p["mlp.fc_in.weight"] = rng.standard_normal((c, f)) / np.sqrt(c)
    p["mlp.fc_in.bias"] = 0.3 * rng.standard_normal(f)
    p["mlp.fc_out.weight"] = rng.standard_normal((f, c)) / np.sqrt(f)
    p["mlp.fc_out.bias"] = 0.1 * rng.standard_normal(c)
    ap, acfg = init_attention_params(rng, attention, c, heads)
    p.update(add_prefix(ap, "attn"))
    return p, acfg


def _sample(rng, size, attention=None):
    attention = attention or str(rng.choice(["multi_head_attention", "diff_attention_v1"]))
    shared = bool(rng.random() < 0.5)
    if size == "tiny":
        n, c, f, h = int(rng.integers(2, 4)), (3 if attention == "multi_head_attention" else 4), 4, 1
    else:
        n, c, f, h = int(rng.integers(4, 7)), 8, 16, 2
    p, acfg = _params(rng, c, f, attention, h, shared)
    cfg = {"attention": attention, "attention_config": acfg, "shared_norm": shared}
    return Sample(inputs={"x": rng.standard_normal((2, n, c))}, params=p, config=cfg)


def _attn(x, p, attention, cfg):
    from .. import registry

    sub = {k[5:]: v for k, v in p.items() if k.startswith("attn.")}
    return registry.get(attention or "multi_head_attention").forward(x, params=sub, **(cfg or {}))[0]


def _reference(x, params, attention=None, attention_config=None, shared_norm=True, activation="gelu_tanh",
               norm="layer", eps=1e-5):
    from ..nn.norms import layer_norm, rms_norm
    from .core import activation_functions

    p = params

    def nrm(key):
        if norm == "rms":
            return rms_norm(x, {"weight": p[f"{key}.weight"]}, eps=eps)
        return layer_norm(x, {"weight": p[f"{key}.weight"], "bias": p[f"{key}.bias"]}, eps=eps)

    act, _ = activation_functions(activation)
    h1 = nrm("ln_1")
    h2 = h1 if shared_norm else nrm("ln_2")
    mlp = act(h2 @ p["mlp.fc_in.weight"] + p["mlp.fc_in.bias"]) @ p["mlp.fc_out.weight"] + p["mlp.fc_out.bias"]
    return x + _attn(h1, p, attention, attention_config) + mlp


def _sequential(s, p):
    # The sequential pre-norm block u = x + A(N1 x), y = u + MLP(N2 u) of `refattn.blocks.core`.
    attn = resolve_sublayer(s.config["attention"], prefix="attn", config=s.config["attention_config"])
    own = {k: v for k, v in p.items() if not k.startswith("attn.")}
    if s.config["shared_norm"]:
        own.update({"ln_2.weight": own["ln_1.weight"], "ln_2.bias": own["ln_1.bias"]})
    ap = {k[5:]: v for k, v in p.items() if k.startswith("attn.")}
    names = BlockNames(norm1="ln_1", norm2="ln_2", fc1="mlp.fc_in", fc2="mlp.fc_out")
    return transformer_block_forward(s.inputs["x"], own, attn, ap, names=names, activation="gelu_tanh")[0]


def _check_sequential_when_a_branch_is_zero(rng):
    # MLP output zeroed: both blocks are x + A(N1 x). Attention output zeroed: both are x + MLP(N2 x).
    err = 0.0
    for attention in ("multi_head_attention", "diff_attention_v1"):
        s = _sample(rng, "small", attention)
        p = dict(s.params, **{"mlp.fc_out.weight": np.zeros_like(s.params["mlp.fc_out.weight"]),
                              "mlp.fc_out.bias": np.zeros_like(s.params["mlp.fc_out.bias"])})
        err = max(err, float(np.abs(parallel_attention_mlp_block(**s.inputs, params=p, **s.config)
                                    - _sequential(s, p)).max()))
        out = "attn.out_proj" if attention == "multi_head_attention" else "attn.out_proj.weight"
        p = dict(s.params, **{out: np.zeros_like(s.params[out])})
        p.pop("attn.out_proj_bias", None)
        err = max(err, float(np.abs(parallel_attention_mlp_block(**s.inputs, params=p, **s.config)
                                    - _sequential(s, p)).max()))
    assert err < 1e-12, f"parallel and sequential blocks differ by {err} with one branch zero"
    return err


def _check_shared_norm_gradient_is_the_sum(rng):
    # Two norms with equal parameters give the shared-norm output; the shared gamma/beta gradient is
    # the sum of the two separate ones.
    s = _sample(rng, "small")
    p = {k: v for k, v in s.params.items() if not k.startswith("ln_2.")}
    cfg = dict(s.config, shared_norm=True)
    y1, c1 = parallel_attention_mlp_block_forward(**s.inputs, params=p, **cfg)
    p2 = dict(p, **{"ln_2.weight": p["ln_1.weight"], "ln_2.bias": p["ln_1.bias"]})
    y2, c2 = parallel_attention_mlp_block_forward(**s.inputs, params=p2, **dict(cfg, shared_norm=False))
    g = rng.standard_normal(y1.shape)
    g1, g2 = parallel_attention_mlp_block_backward(g, c1), parallel_attention_mlp_block_backward(g, c2)
    err = float(np.abs(y1 - y2).max())
    for k in ("weight", "bias"):
        err = max(err, float(np.abs(g1[f"ln_1.{k}"] - g2[f"ln_1.{k}"] - g2[f"ln_2.{k}"]).max()))
    err = max(err, float(np.abs(g1["x"] - g2["x"]).max()))
    assert err < 1e-12, f"shared-norm gradients differ from the sum of the two branches by {err}"
    return err


register(
    Mechanism(
        slug="parallel_attention_mlp_block", family="5-building-blocks", tier="T2",
        official_code="huggingface/transformers src/transformers/models/gptj/modeling_gptj.py@00b676f (GPTJBlock)",
        title="Parallel attention + MLP block y = x + A(LN x) + MLP(LN x) (shared or separate norms)",
        paper="Zhong, Zhang, Chakraborty, Dey, A Neural ODE Interpretation of Transformer Layers, "
              "arXiv 2212.06011 (2022)",
        forward=parallel_attention_mlp_block_forward, backward=parallel_attention_mlp_block_backward,
        sample=_sample, reference=_reference, docs="blocks/residual-blocks.md#parallel-attention-mlp-block",
        checks={"sequential_when_a_branch_is_zero": _check_sequential_when_a_branch_is_zero,
                "shared_norm_gradient_is_the_sum": _check_shared_norm_gradient_is_the_sum},
    ),
)
