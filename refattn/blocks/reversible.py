r"""Reversible residual layers (RevNet / Reformer) and multi-split reversible networks.

Gomez, Ren, Urtasun, Grosse, "The Reversible Residual Network: Backpropagation Without Storing
Activations", NeurIPS 2017, arXiv 1707.04585; Kitaev, Kaiser, Levskaya, "Reformer: The Efficient
Transformer", ICLR 2020, arXiv 2001.04451; Zhao, Dong, Shen, Zhang, Wei, Chen, "Memory-Efficient
Differentiable Transformer Architecture Search", Findings of ACL 2021, arXiv 2105.14669
(multi-split). Upstream: google/trax ``trax/layers/reversible.py`` (``ReversibleHalfResidual``,
``ReversibleSwap``, ``ReversibleSerial.reverse_and_grad``) and ``trax/models/reformer/reformer.py``
(``DecoderBlock``) @ 7c189c2c3a37851df7fc641b322a99bbe9f8aa10.

Forward
-------
The features are split along the last axis into $n$ = ``num_splits`` parts of width $C$,
$x = [X_1\|\dots\|X_n]$ (Reformer: ``Dup`` then two halves, joined by ``Concatenate`` at the end).
One layer is

$$Y_1 = X_1 + F_1(X_n),\qquad Y_i = X_i + F_i(Y_{i-1})\quad (i = 2..n),$$

which for $n = 2$ is RevNet's $Y_1 = X_1 + F(X_2)$, $Y_2 = X_2 + G(Y_1)$ and Reformer's
``[ReversibleHalfResidual(LayerNorm, attention), ReversibleSwap, ReversibleHalfResidual(FF),
ReversibleSwap]``: $F$ = attention on a LayerNormed input, $G$ = the feed-forward block
(LayerNorm, dense, FastGelu, dense). ``num_layers`` layers are applied in sequence. It is exactly
invertible:

$$X_i = Y_i - F_i(Y_{i-1})\quad (i = n..2),\qquad X_1 = Y_1 - F_1(X_n).$$

Multi-split (reconstruction): Zhao et al. split the hidden state into $n$ parts and update each
from the others; the paper's equations are not available to us, and the simplest reading that
reduces to RevNet at $n = 2$ is the cyclic chain above (each part is updated from the most
recently updated neighbour). ``functions`` chooses each $F_i$ (``"attention"``: pre-LayerNorm
attention sublayer; ``"ffn"``: LayerNorm + MLP), default alternating, starting with attention.

Backward with reconstruction
----------------------------
Only the last layer's output is stored (``store="outputs"``). Going backwards through the layers,
each layer first reconstructs its input from its output by the inverse above — recomputing every
$F_i$ forward, which also rebuilds the caches its backward needs — and then backpropagates: with
$g_i = \partial L/\partial Y_i$, for $i = n..2$: $\partial L/\partial X_i = g_i$,
$g_{i-1} \mathrel{+}= J_{F_i}^\top g_i$ (and the $F_i$ parameter gradients); then
$\partial L/\partial X_1 = g_1$, $\partial L/\partial X_n \mathrel{+}= J_{F_1}^\top g_1$. This is
trax's ``reverse_and_grad``: activations are stored once, not once per layer, at the price of one
extra forward of every $F$. ``store="all"`` is the ordinary cached backward (every layer's caches
kept), for comparison: both give the same gradients up to the round-off of the reconstruction.
The attention's backward is the sublayer's own (any registry slug or forward/backward pair).

Conventions
-----------
``eps`` = 1e-6 (trax ``LayerNorm``), ``activation`` = ``"gelu_tanh"`` (trax ``FastGelu``, the
``ReformerLM`` default), the attention default ``"multi_head_attention"`` (pass
``{"num_heads": H, "is_causal": True}`` for the decoder). Trax's LSH attention, chunking and
dropout are not part of the reversible scheme and are not reproduced. Parameters:
``"layers.{l}.f{i}.norm.weight"``/``.bias`` (``i`` = 1..n), the attention's keys under
``"layers.{l}.f{i}.attn."``, the MLP's ``"layers.{l}.f{i}.fc1.weight" (C, F)``, ``.fc2.weight
(F, C)`` and biases (weights ``(in, out)``).

Agreement with upstream
-----------------------
trax needs JAX/TensorFlow (not installable here): the Reformer stack (``Dup``,
``[HalfResidual(LayerNorm, attention), Swap, HalfResidual(FF), Swap] x 3``, ``Concatenate``) was
transcribed to torch. Output and every gradient agree to $2.7\times10^{-12}$ with either
``store``, which is trax's truncated ``FastGelu`` constant ``0.7978845608``; with the exact
$\sqrt{2/\pi}$, $1.5\times10^{-15}$. The input is reconstructed to $8.9\times10^{-16}$. Memory
(two splits of width 64, N = 128, float64): the cached backward keeps 3.1 MiB of activations per
layer, the reconstructing one 0.25 MiB (the output copy) at any depth; see
``docs/blocks/residual-blocks.md``.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_choice, check_int, check_positive
from ..registry import Mechanism, Sample, register
from .core import (
    ACTIVATIONS,
    add_prefix,
    block_dtype,
    cache_nbytes,
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

__all__ = ["reversible_residual_block_forward", "reversible_residual_block_backward", "reversible_residual_block",
           "reversible_residual_inverse", "REVERSIBLE_FUNCTIONS"]

REVERSIBLE_FUNCTIONS = ("attention", "ffn")


def _setup(x, params, num_layers, num_splits, functions, attention, attention_config, activation, eps):
    """Validate everything; returns (x cast, context dict)."""
    x = as_float(x, "x", min_ndim=2)
    nl = check_int(num_layers, "num_layers", minimum=1)
    ns = check_int(num_splits, "num_splits", minimum=2)
    if functions is None:
        functions = tuple(REVERSIBLE_FUNCTIONS[i % 2] for i in range(ns))
    if not isinstance(functions, (tuple, list)) or len(functions) != ns:
        raise ValueError(f"functions must be a sequence of num_splits={ns} entries; got {functions!r}")
    for f in functions:
        check_choice(f, "functions", REVERSIBLE_FUNCTIONS)
    check_choice(activation, "activation", ACTIVATIONS)
    eps = check_positive(eps, "eps", allow_zero=True)
    if x.shape[-1] % ns:
        raise ValueError(f"x's last axis ({x.shape[-1]}) must split into num_splits={ns} equal parts")
    c = x.shape[-1] // ns
    attn = "multi_head_attention" if attention is None else attention
    subl, spec, hidden = {}, {}, None
    for l in range(nl):
        for i, f in enumerate(functions):
            pre = f"layers.{l}.f{i + 1}"
            spec.update(norm_spec(f"{pre}.norm", c))
            if f == "attention":
                subl[(l, i)] = resolve_sublayer(attn, prefix=f"{pre}.attn", config=attention_config)
            else:
                if hidden is None:
                    hidden = param_dim(params, f"{pre}.fc1.weight", 1, where="reversible_residual_block",
                                       shape=("C", "F"))
                spec.update(mlp_spec(f"{pre}.fc1", f"{pre}.fc2", c, hidden))
    keys = list(subl)
    optional = [k for k in spec if k.endswith(".bias") and ".fc" in k]
    own, subs = split_block_params(params, spec, [subl[k] for k in keys], optional=optional,
                                   where="reversible_residual_block")
    dt = block_dtype(x, own, subs)
    ctx = {"own": cast_all(dt, own), "subl": subl, "ap": {k: cast_all(dt, p) for k, p in zip(keys, subs)},
           "functions": tuple(functions), "layers": nl, "splits": ns, "act": activation, "eps": eps, "dtype": dt}
    return x.astype(dt, copy=False), ctx


def _f_forward(ctx, l, i, z):
    pre = f"layers.{l}.f{i + 1}"
    h, cn = norm_forward(ctx["own"], f"{pre}.norm", z, eps=ctx["eps"])
    if ctx["functions"][i] == "attention":
        out, cf = ctx["subl"][(l, i)].apply(h, ctx["ap"][(l, i)])
    else:
        out, cf = mlp_forward(ctx["own"], h, fc1=f"{pre}.fc1", fc2=f"{pre}.fc2", activation=ctx["act"])
    return out, (l, i, cn, cf)


def _f_backward(ctx, grads, g, cache):
    l, i, cn, cf = cache
    if ctx["functions"][i] == "attention":
        dh = ctx["subl"][(l, i)].vjp(g, cf, grads)
    else:
        dh = mlp_backward(grads, ctx["own"], g, cf)
    return norm_backward(grads, ctx["own"], dh, cn)


def _split(v, n):
    return list(np.split(v, n, axis=-1))


def _layer_forward(ctx, l, x, keep):
    xs = _split(x, ctx["splits"])
    ys, caches = list(xs), []
    for i in range(ctx["splits"]):
        out, c = _f_forward(ctx, l, i, xs[-1] if i == 0 else ys[i - 1])
        ys[i] = xs[i] + out
        if keep:
            caches.append(c)
    return np.concatenate(ys, axis=-1), caches


def _layer_inverse(ctx, l, y):
    """Reconstruct the layer's input from its output; also returns the F caches (in forward order)."""
    n = ctx["splits"]
    ys = _split(y, n)
    xs, caches = list(ys), [None] * n
    for i in range(n - 1, 0, -1):
        out, caches[i] = _f_forward(ctx, l, i, ys[i - 1])
        xs[i] = ys[i] - out
    out, caches[0] = _f_forward(ctx, l, 0, xs[n - 1])
    xs[0] = ys[0] - out
    return np.concatenate(xs, axis=-1), caches


def _layer_backward(ctx, grads, g, caches):
    n = ctx["splits"]
    gy = _split(g, n)
    gx = list(gy)
    for i in range(n - 1, 0, -1):
        gy[i - 1] = gy[i - 1] + _f_backward(ctx, grads, gy[i], caches[i])
    gx[0] = gy[0]
    gx[n - 1] = gx[n - 1] + _f_backward(ctx, grads, gy[0], caches[0])
    return np.concatenate(gx, axis=-1)


def reversible_residual_block_forward(x, params, *, num_layers: int = 1, num_splits: int = 2, functions=None,
                                      attention=None, attention_config=None, activation: str = "gelu_tanh",
                                      eps: float = 1e-6, store: str = "outputs"):
    r"""``num_layers`` reversible layers on ``x (..., N, n*C)`` (module docstring).

    Parameters
    ----------
    x : array (..., N, n*C)
        The concatenated parts $[X_1\|\dots\|X_n]$ (Reformer: ``concat(x, x)`` of the embedding).
    params : dict
        Per layer ``l`` and function ``i = 1..n``: ``"layers.{l}.f{i}.norm.weight"``/``.bias``
        ``(C,)``; for an attention function its keys under ``"layers.{l}.f{i}.attn."``; for an FFN
        ``"layers.{l}.f{i}.fc1.weight" (C, F)``, ``".fc2.weight" (F, C)`` and optional biases.
    num_layers, num_splits : int
    functions : sequence of {"attention", "ffn"}, optional
        $F_1..F_n$; default alternating from ``"attention"`` (Reformer for $n = 2$).
    attention, attention_config
        The attention sublayer (default ``"multi_head_attention"``) and its config.
    activation : {"relu", "gelu", "gelu_tanh", "silu"}
    eps : float
        LayerNorm epsilon (trax: 1e-6).
    store : {"outputs", "all"}
        ``"outputs"``: keep only the final output and reconstruct activations in the backward;
        ``"all"``: keep every layer's caches (ordinary backpropagation).

    Returns
    -------
    y, cache
        ``y`` of the shape of ``x``.
    """
    check_choice(store, "store", ("outputs", "all"))
    x, ctx = _setup(x, params, num_layers, num_splits, functions, attention, attention_config, activation, eps)
    y, layer_caches = x, []
    for l in range(ctx["layers"]):
        y, c = _layer_forward(ctx, l, y, store == "all")
        layer_caches.append(c)
    cache = {"ctx": ctx, "params": ctx["own"], "attn_params": ctx["ap"], "store": store, "shape": y.shape}
    if store == "all":
        cache["layers"] = layer_caches
    else:
        cache["y"] = y.copy()  # the caller may modify the returned output in place
    return y, cache


def reversible_residual_block_backward(dout, cache):
    r"""Gradients for ``x`` and every params key. With ``store="outputs"`` each layer's input is
    reconstructed from its output (recomputing its $F_i$) before its backward (module docstring)."""
    ctx = cache["ctx"]
    g = as_dout(dout, cache["shape"], ctx["dtype"])
    grads = {}
    y = cache.get("y")
    for l in range(ctx["layers"] - 1, -1, -1):
        if cache["store"] == "all":
            caches = cache["layers"][l]
        else:
            y, caches = _layer_inverse(ctx, l, y)
        g = _layer_backward(ctx, grads, g, caches)
        caches = None  # release this layer's caches before the next layer is reconstructed
    grads["x"] = g
    return grads


def reversible_residual_inverse(y, params, *, return_all: bool = False, **config):
    r"""Reconstruct the input ``x`` from the output ``y`` of `reversible_residual_block_forward`
    with the same ``params`` and config (``store`` is ignored): the inverse the backward uses.
    ``return_all=True`` returns every layer's reconstructed input, first layer first."""
    config.pop("store", None)
    names = ("num_layers", "num_splits", "functions", "attention", "attention_config", "activation", "eps")
    unknown = sorted(set(config) - set(names))
    if unknown:
        raise TypeError(f"reversible_residual_inverse got unexpected keywords {unknown}")
    defaults = {"num_layers": 1, "num_splits": 2, "functions": None, "attention": None, "attention_config": None,
                "activation": "gelu_tanh", "eps": 1e-6}
    defaults.update(config)
    y, ctx = _setup(y, params, *(defaults[k] for k in names))
    inputs = []
    for l in range(ctx["layers"] - 1, -1, -1):
        y, _ = _layer_inverse(ctx, l, y)
        inputs.insert(0, y)
    return inputs if return_all else inputs[0]


def reversible_residual_block(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of `reversible_residual_block_forward`."""
    return reversible_residual_block_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _params(rng, layers, functions, c, f, attention, heads):
    p, acfg = {}, {}
    for l in range(layers):
        for i, kind in enumerate(functions):
            pre = f"layers.{l}.f{i + 1}"
            p[f"{pre}.norm.weight"] = 1.0 + 0.2 * rng.standard_normal(c)
            p[f"{pre}.norm.bias"] = 0.1 * rng.standard_normal(c)
            if kind == "attention":
                ap, acfg = init_attention_params(rng, attention, c, heads)
                p.update(add_prefix(ap, f"{pre}.attn"))
            else:
                p.update({f"{pre}.fc1.weight": rng.standard_normal((c, f)) / np.sqrt(c),
                          f"{pre}.fc1.bias": 0.3 * rng.standard_normal(f),
                          f"{pre}.fc2.weight": rng.standard_normal((f, c)) / np.sqrt(f),
                          f"{pre}.fc2.bias": 0.1 * rng.standard_normal(c)})
    return p, acfg


def _sample(rng, size, attention="multi_head_attention", splits=None, store=None):
    tiny = size == "tiny"
    splits = splits or (2 if tiny else int(rng.integers(2, 4)))
    functions = tuple(REVERSIBLE_FUNCTIONS[i % 2] for i in range(splits))
    if not tiny and splits > 2 and rng.random() < 0.5:
        functions = tuple(rng.permutation(functions).tolist())
    n, c, f, h = (int(rng.integers(2, 4)), 3, 3, 1) if tiny else (int(rng.integers(4, 7)), 6, 8, 2)
    if attention == "diff_attention_v1":
        c, h = 4, 1
    layers = 2
    p, acfg = _params(rng, layers, functions, c, f, attention, h)
    cfg = {"num_layers": layers, "num_splits": splits, "functions": functions, "attention": attention,
           "attention_config": acfg, "store": store or str(rng.choice(["outputs", "all"]))}
    return Sample(inputs={"x": rng.standard_normal((2, n, splits * c))}, params=p, config=cfg)


def _reference(x, params, num_layers=1, num_splits=2, functions=None, attention=None, attention_config=None,
               activation="gelu_tanh", eps=1e-6, store="outputs"):
    # Y_1 = X_1 + F_1(X_n), Y_i = X_i + F_i(Y_{i-1}), written out with nn.layer_norm and the registry attention.
    from .. import registry
    from ..nn.norms import layer_norm
    from .core import activation_functions

    functions = functions or tuple(REVERSIBLE_FUNCTIONS[i % 2] for i in range(num_splits))
    act, _ = activation_functions(activation)
    p = params

    def fn(l, i, z):
        pre = f"layers.{l}.f{i + 1}"
        h = layer_norm(z, {"weight": p[f"{pre}.norm.weight"], "bias": p[f"{pre}.norm.bias"]}, eps=eps)
        if functions[i] == "attention":
            sub = {k[len(pre) + 6:]: v for k, v in p.items() if k.startswith(pre + ".attn.")}
            return registry.get(attention or "multi_head_attention").forward(h, params=sub, **(attention_config or {}))[0]
        hid = act(h @ p[f"{pre}.fc1.weight"] + p.get(f"{pre}.fc1.bias", 0.0))
        return hid @ p[f"{pre}.fc2.weight"] + p.get(f"{pre}.fc2.bias", 0.0)

    for l in range(num_layers):
        xs = np.split(x, num_splits, axis=-1)
        ys = [xs[0] + fn(l, 0, xs[-1])]
        for i in range(1, num_splits):
            ys.append(xs[i] + fn(l, i, ys[-1]))
        x = np.concatenate(ys, axis=-1)
    return x


def _check_reconstruction_float64_float32(rng):
    # Inverting 2 layers: float64 reconstructs the input to round-off, float32 to ~1e-6.
    s = _sample(rng, "small")
    errs = {}
    for dt in (np.float64, np.float32):
        x = s.inputs["x"].astype(dt)
        p = {k: v.astype(dt) for k, v in s.params.items()}
        y = reversible_residual_block(x, p, **s.config)
        rec = reversible_residual_inverse(y, p, **s.config)
        errs[dt] = float(np.abs(rec.astype(np.float64) - x).max() / np.abs(x).max())
    assert errs[np.float64] < 1e-13 and errs[np.float32] < 1e-4, f"reconstruction errors {errs}"
    return errs[np.float32]


def _check_reconstructed_gradients_equal_cached(rng):
    s = _sample(rng, "small")
    out = {}
    for store in ("outputs", "all"):
        y, cache = reversible_residual_block_forward(**s.inputs, params=s.params, **dict(s.config, store=store))
        out[store] = reversible_residual_block_backward(np.cos(y), cache)
    scale = max(float(np.abs(v).max()) for v in out["all"].values())  # key biases have ~0 gradients
    err = max(float(np.abs(out["outputs"][k] - out["all"][k]).max()) for k in out["all"]) / scale
    assert err < 1e-10, f"reconstructed and cached gradients differ by {err} (relative)"
    return err


def _check_stores_only_the_output(rng):
    s = _sample(rng, "small", store="outputs")
    y, cache = reversible_residual_block_forward(**s.inputs, params=s.params, **s.config)
    stored = cache_nbytes(cache) - cache_nbytes((cache["params"], cache["attn_params"]))
    assert stored == y.nbytes, f"the reconstructing cache holds {stored} bytes of activations, expected {y.nbytes}"
    return 0.0


register(
    Mechanism(
        slug="reversible_residual_block", family="5-building-blocks", tier="T2",
        title="Reversible residual layers (RevNet/Reformer) and multi-split reversible networks, "
              "backward by reconstruction",
        paper="Gomez, Ren, Urtasun, Grosse, The Reversible Residual Network, NeurIPS 2017, arXiv 1707.04585; "
              "Kitaev, Kaiser, Levskaya, Reformer: The Efficient Transformer, ICLR 2020, arXiv 2001.04451; "
              "Zhao et al., Memory-Efficient Differentiable Transformer Architecture Search, Findings of ACL 2021, "
              "arXiv 2105.14669",
        forward=reversible_residual_block_forward, backward=reversible_residual_block_backward, sample=_sample,
        reference=_reference, docs="blocks/residual-blocks.md#reversible-residual-block",
        checks={"reconstruction_float64_float32": _check_reconstruction_float64_float32,
                "reconstructed_gradients_equal_cached": _check_reconstructed_gradients_equal_cached,
                "stores_only_the_output": _check_stores_only_the_output},
    ),
)
