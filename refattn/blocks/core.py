r"""Shared helpers of family 5: the sublayer protocol, prefixed norms and MLPs, a pre-norm block.

The sublayer protocol
---------------------
A block that wraps attention (Macaron, parallel, simplified, nGPT, looped, reversible, TNT) does
not hard-code an attention. It takes a *token mixer*: any pair

$$\texttt{forward}(x,\ \texttt{params}=p,\ **\texttt{config}) \to (y, \texttt{cache}),\qquad
\texttt{backward}(dy, \texttt{cache}) \to \{\texttt{"x"}: dx,\ k: \partial L/\partial p_k\ \forall k\in p\},$$

with $x, y$ of shape ``(..., N, C)`` — the contract of every registered layer whose first input is
``x`` (``multi_head_attention``, ``diff_attention_v1``, ...). `resolve_sublayer` turns what a user
passes into a `Sublayer`:

* a registry slug (``"multi_head_attention"``): ``refattn.registry.get(slug).forward/.backward``;
* a ``(forward, backward)`` pair of callables;
* a `Sublayer` (its forward, backward, config and name are kept; the block sets the prefix).

A `Sublayer` is bound to a params *prefix*: the block's flat params dict holds the mixer's
parameters under ``"<prefix>.<key>"`` (``"self_attn.q_proj"``, ``"attn.q_proj.weight"``), as a
PyTorch ``state_dict`` nests a submodule's parameters, so an upstream checkpoint maps over key by
key. `split_block_params` validates the block's own keys and hands each sublayer its sub-dict
(prefix stripped); ``Sublayer.apply`` runs the mixer on it and ``Sublayer.vjp`` chains the
block's backward through the mixer's backward, adding the mixer's parameter gradients into the
block's gradient dict under the prefixed keys. A sublayer with the empty prefix receives every key
the block does not claim (nGPT keeps its attention weights at the block level, as upstream).

Errors raised inside a mixer are re-raised with the sublayer named (``attention sublayer 'attn'
(multi_head_attention): q_proj must have shape ...``); every sublayer array is validated first
under its full prefixed key, so a wrong dtype names ``"attn.q_proj"`` itself.

Chain rule through a sublayer
-----------------------------
If a block computes $u = x + s\,F_\theta(h(x))$, the backward is
$dh = J_F^\top(s\,du)$ (the mixer's own backward), $d\theta \mathrel{+}= J_{F,\theta}^\top(s\,du)$,
$dx = du + J_h^\top dh$: the block never needs to know what $F$ is.

Attention cores and head-gated attention
----------------------------------------
A block that reweights the *heads* of an attention (MoH, HeadMask, DyDiT's dynamic width) needs
the per-head outputs, so it takes an attention *core* instead of a token mixer: any pair
``forward(q, k, v, [params=p,] **config) -> (o, cache)`` with ``q, k, v (..., H, N, d)`` and
``o (..., H, N, dv)``, ``backward(do, cache) -> {"q", "k", "v"[, key: ...]}`` — the contract of
``"sdpa"`` and of every registered core whose forward starts ``(q, k, v, ...)`` (``"alibi"``,
``"linear_attention_katharopoulos"`` ...). `resolve_attention_core` resolves a slug or pair into a
`Sublayer` (default ``"sdpa"``; a core's own parameters sit under ``"<prefix>.<key>"``);
`core_apply`/`core_vjp` run it and chain through its backward.
`head_gated_attention_forward` is then

$$y = \Big[\,g_{t,h}\;\mathrm{core}(q_h, k_h, v_h)_t\,\Big]_{h}\,W_O + b_O,\qquad
dg_{t,h} = \langle dO_{t,h}, o_{t,h}\rangle,\quad do_{t,h} = g_{t,h}\,dO_{t,h},$$

with the projections either fused (timm ``qkv``/``proj``: ``qkv.weight (C, 3Hd)`` holding
$[W_Q\,W_K\,W_V]$) or separate (fairseq ``q_proj``/``k_proj``/``v_proj``/``out_proj``).

Other helpers
-------------
`norm_forward`/`norm_backward` (LayerNorm / RMSNorm / none over the last axis, with prefixed
affine ``"<prefix>.weight"``/``"<prefix>.bias"``, built on `refattn.nn.norms.normalize_forward`),
`mlp_forward`/`mlp_backward` (``fc2(act(fc1(x)))`` with prefixed linear layers, built on
`refattn.nn.linear.linear_prefixed`), `batch_norm_forward`/`batch_norm_backward` (PyTorch's
``BatchNorm{1,2,3}d`` on a channels-first ``(B, C, *spatial)`` array, evaluation mode with the
running statistics or training mode with the batch statistics; see below),
`transformer_block_forward`/`transformer_block_backward` (the pre-norm block
$x \leftarrow x + \mathrm{Attn}(\mathrm{LN}_1x)$, $x \leftarrow x + \mathrm{MLP}(\mathrm{LN}_2x)$ of
GPT-2, ViT and TNT), `init_attention_params` (random parameters
for the attentions the samplers and tests use) and `cache_nbytes` (the memory a cache holds).
All are unvalidated: the blocks validate their arguments first.

Batch normalisation (the convolutional blocks: FastViT's MobileOne branches, LIT's deformable
merging)
----------------------------------------------------------------------------------------------
With per-channel $\gamma, \beta$ (``"<prefix>.weight"``, ``"<prefix>.bias"``) and the running
statistics $\mu_r, \sigma^2_r$ (``"<prefix>.running_mean"``, ``"<prefix>.running_var"``, the
buffers of PyTorch's ``state_dict``; ``num_batches_tracked`` is not used),

* evaluation mode (``training=False``, PyTorch's ``model.eval()``; the default, as
  ``F.batch_norm``): $y = \gamma\,(x - \mu_r)\,r + \beta$, $r = (\sigma^2_r + \epsilon)^{-1/2}$,
  a per-channel affine map. With $g = \gamma\,dy$: $dx = r\,g$,
  $d\mu_r = -r\sum g$, $d\sigma^2_r = -\tfrac12 r^2\sum g\,\hat x$ (sums over the batch and
  spatial axes). The running statistics are buffers, not trained; their derivatives are returned
  because the block's backward returns one gradient per params key;
* training mode (``training=True``): the batch statistics over ``(B, *spatial)`` (biased
  variance, as PyTorch normalises) replace the running ones — the LayerNorm VJP of
  `refattn.nn.norms.normalize_backward` over those axes; the running statistics get zero gradient
  and are **not updated** (the functions are pure; PyTorch's momentum update is a side effect).
  Batch elements then depend on each other.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from .._checks import as_float, check_choice, check_params, compute_dtype
from ..nn.activations import gelu, gelu_grad, relu, relu_grad, silu, silu_grad
from ..nn.linear import linear_prefixed, linear_prefixed_spec, linear_prefixed_vjp, merge_heads, split_heads
from ..nn.norms import normalize_backward, normalize_forward

__all__ = [
    "Sublayer", "resolve_sublayer", "split_block_params", "param_dim", "block_dtype", "add_grad", "add_prefix",
    "ACTIVATIONS", "activation_functions", "NORMS", "norm_spec", "norm_forward", "norm_backward",
    "mlp_spec", "mlp_forward", "mlp_backward", "BlockNames", "transformer_block_spec",
    "transformer_block_forward", "transformer_block_backward", "init_attention_params", "cache_nbytes",
    "BATCH_NORM_KEYS", "batch_norm_spec", "batch_norm_forward", "batch_norm_backward",
    "FUSED_QKV_NAMES", "SPLIT_QKV_NAMES", "resolve_attention_core", "core_apply", "core_vjp",
    "head_gated_attention_spec", "head_gated_attention_forward", "head_gated_attention_backward",
]

ACTIVATIONS = ("relu", "gelu", "gelu_tanh", "silu")
FUSED_QKV_NAMES = ("qkv", "proj")
SPLIT_QKV_NAMES = ("q_proj", "k_proj", "v_proj", "out_proj")
NORMS = ("layer", "rms", "none")


# --------------------------------------------------------------------------------------------
# The sublayer protocol


@dataclass(frozen=True)
class Sublayer:
    """A token mixer resolved for use inside a block (see the module docstring).

    Attributes
    ----------
    forward, backward
        ``forward(x, params=p, **config) -> (y, cache)`` with ``y.shape == x.shape`` and
        ``backward(dy, cache) -> {"x": dx, key: grad for key in p}``.
    prefix
        Where the mixer's parameters live in the block's params dict (``"attn"`` for
        ``"attn.q_proj"``); ``""`` for keys at the block level.
    config
        Keyword arguments passed to every ``forward`` call (``num_heads``, masks ...).
    name
        For messages: the registry slug or the forward's name.
    """

    forward: Callable
    backward: Callable
    prefix: str = ""
    config: Mapping[str, Any] = field(default_factory=dict)
    name: str = ""

    def key(self, name: str) -> str:
        """The block-level key of the mixer's parameter ``name``."""
        return f"{self.prefix}.{name}" if self.prefix else name

    def describe(self) -> str:
        where = f"'{self.prefix}'" if self.prefix else "at the block level"
        return f"attention sublayer {where} ({self.name})"

    def apply(self, x: np.ndarray, params: dict):
        """Run the mixer on ``x`` with its own (unprefixed) ``params``: returns ``(y, cache)``."""
        try:
            y, cache = self.forward(x, params=params, **self.config)
        except (ValueError, TypeError) as exc:
            raise type(exc)(f"{self.describe()}: {exc}") from exc
        if np.shape(y) != x.shape:
            raise ValueError(f"{self.describe()} must map x of shape {x.shape} to the same shape; "
                             f"got {np.shape(y)} (a token mixer keeps the width)")
        return y, cache

    def vjp(self, dy: np.ndarray, cache, grads: dict) -> np.ndarray:
        """Chain ``dy`` through the mixer's backward: adds its parameter gradients into
        ``grads`` under the prefixed keys and returns ``dx``."""
        g = self.backward(dy, cache)
        for k, v in g.items():
            if k != "x":
                add_grad(grads, self.key(k), v)
        return g["x"]


def resolve_sublayer(spec, *, prefix: str, config=None, name: str = "attention") -> Sublayer:
    """A `Sublayer` from a registry slug, a ``(forward, backward)`` pair or a `Sublayer`.

    ``config`` (a dict, or None for none) is the mixer's keyword configuration; ``name`` names
    the argument in messages (``"attention"``, with ``config`` passed as ``"<name>_config"``).
    A `Sublayer` passed in keeps its own config (``config`` must then be None) and gets
    ``prefix``. Raises ``TypeError``/``ValueError`` naming ``name``.
    """
    if config is not None and not isinstance(config, Mapping):
        raise TypeError(f"{name}_config must be a dict of keyword arguments for the {name}; "
                        f"got {type(config).__name__}")
    if isinstance(spec, Sublayer):
        if config is not None:
            raise ValueError(f"{name} is a Sublayer with its own config; pass {name}_config=None")
        return replace(spec, prefix=prefix)
    cfg = dict(config or {})
    if isinstance(spec, str):
        from .. import registry

        try:
            rec = registry.get(spec)
        except KeyError as exc:
            raise ValueError(f"{name}={spec!r} is not a registered mechanism ({exc.args[0]})") from None
        if not rec.implemented or rec.backward is None:
            raise ValueError(f"{name}={spec!r} has no implemented forward/backward pair")
        sig = _parameter_names(rec.forward)
        if "x" not in sig or "params" not in sig:
            raise ValueError(f"{name}={spec!r} is not a token mixer: its forward takes "
                             f"({', '.join(list(sig)[:4])}, ...), not (x, params, **config); pass a layer "
                             f"such as 'multi_head_attention' or 'diff_attention_v1', or a (forward, backward) pair")
        return Sublayer(rec.forward, rec.backward, prefix, cfg, spec)
    if isinstance(spec, (tuple, list)) and len(spec) == 2 and all(callable(f) for f in spec):
        return Sublayer(spec[0], spec[1], prefix, cfg, getattr(spec[0], "__name__", "custom"))
    raise TypeError(f"{name} must be a registry slug, a (forward, backward) pair of callables or a "
                    f"Sublayer; got {type(spec).__name__}")


@functools.lru_cache(maxsize=256)
def _parameter_names(fn) -> tuple:
    return tuple(inspect.signature(fn).parameters)


def split_block_params(params, spec: dict, sublayers=(), *, optional=(), where: str):
    """Validate a block's flat params dict and split it between the block and its sublayers.

    ``spec`` maps the block's own keys to their shapes (``optional`` keys may be absent or
    None). A key ``"<prefix>.<k>"`` goes to the sublayer with the longest matching prefix (as
    ``k``); a key nobody claims goes to the sublayer with the empty prefix if there is one, else
    it is unknown (``ValueError`` listing it). Every sublayer array is checked with
    `refattn._checks.as_float` under its full key. Returns ``(own, [sub_params, ...])`` in the
    order of ``sublayers``; ``own`` holds the block's arrays (absent optional keys left out).
    """
    if not isinstance(params, dict):
        raise TypeError(f"params for {where} must be a dict of arrays; got {type(params).__name__}")
    order = sorted((i for i, s in enumerate(sublayers) if s.prefix), key=lambda i: -len(sublayers[i].prefix))
    catch_all = [i for i, s in enumerate(sublayers) if not s.prefix]
    subs = [{} for _ in sublayers]
    own, unknown = {}, []
    for key, value in params.items():
        if key in spec:
            own[key] = value
            continue
        for i in order:
            p = sublayers[i].prefix + "."
            if key.startswith(p):
                subs[i][key[len(p):]] = as_float(value, key)
                break
        else:
            if catch_all:
                subs[catch_all[0]][key] = as_float(value, key)
            else:
                unknown.append(key)
    if unknown:
        prefixes = ", ".join(f"'{sublayers[i].prefix}.*'" for i in order) or "none"
        raise ValueError(f"params has unknown keys {sorted(unknown)} for {where}; expected {sorted(spec)} "
                         f"and the sublayers' keys ({prefixes})")
    own = check_params(own, spec, optional=optional, where=where)
    return own, subs


def param_dim(params, key: str, axis: int, *, where: str, shape: tuple) -> int:
    """Size of axis ``axis`` of ``params[key]`` (read before the full validation, to build the
    spec of a block whose widths come from its weights). ``shape`` (e.g. ``("C", "hidden")``)
    describes the expected shape in messages. Raises ``TypeError``/``ValueError`` naming ``key``."""
    if not isinstance(params, dict):
        raise TypeError(f"params for {where} must be a dict of arrays; got {type(params).__name__}")
    if params.get(key) is None:
        raise ValueError(f"params is missing key {key!r} for {where} (expected shape {tuple(shape)})")
    a = as_float(params[key], key)
    if a.ndim != len(shape):
        raise ValueError(f"{key} must have shape {tuple(shape)}; got {a.shape}")
    return int(a.shape[axis])


def block_dtype(x: np.ndarray, own: dict, subs=()) -> np.dtype:
    """The compute dtype of a block: float64 if any array (input or parameter) is float64."""
    return compute_dtype(x, *own.values(), *(v for s in subs for v in s.values()))


def add_grad(grads: dict, key: str, value: np.ndarray) -> None:
    """``grads[key] += value`` without writing into an existing array (sets the key if absent)."""
    grads[key] = grads[key] + value if key in grads else value


def add_prefix(params: dict, prefix: str) -> dict:
    """``{"<prefix>.<k>": v}``: a mixer's own params placed under a block prefix (``""``: as is)."""
    return {(f"{prefix}.{k}" if prefix else k): v for k, v in params.items()}


# --------------------------------------------------------------------------------------------
# Activations, norms and MLPs with prefixed parameters


def activation_functions(name: str):
    """``(f, f')`` for ``name`` in `ACTIVATIONS`: ReLU, exact GELU, tanh GELU, SiLU (from `refattn.nn`)."""
    check_choice(name, "activation", ACTIVATIONS)
    if name == "relu":
        return relu, relu_grad
    if name == "silu":
        return silu, silu_grad
    approx = "tanh" if name == "gelu_tanh" else "none"
    return (lambda x: gelu(x, approx)), (lambda x: gelu_grad(x, approx))


def norm_spec(prefix: str, width: int, kind: str = "layer", bias: bool = True) -> dict:
    """The ``check_params`` spec of a prefixed norm: LayerNorm ``weight`` (and ``bias``), RMSNorm
    ``weight``, none ``{}``."""
    if kind == "none":
        return {}
    spec = {f"{prefix}.weight": (width,)}
    if kind == "layer" and bias:
        spec[f"{prefix}.bias"] = (width,)
    return spec


def norm_forward(params: dict, prefix: str, x: np.ndarray, *, kind: str = "layer", eps: float = 1e-5):
    r"""LayerNorm (``kind="layer"``), RMSNorm (``"rms"``) or identity (``"none"``) over the last
    axis, $y = \gamma\odot\hat x + \beta$ with ``"<prefix>.weight"``/``"<prefix>.bias"`` when
    present. Returns ``(y, cache)``; for ``"none"`` ``y`` is ``x`` itself."""
    if kind == "none":
        return x, None
    xhat, stats = normalize_forward(x, (x.ndim - 1,), eps, center=(kind == "layer"))
    w, b = params.get(f"{prefix}.weight"), params.get(f"{prefix}.bias")
    y = xhat if w is None else xhat * w
    if b is not None:
        y = y + b
    return y, (xhat, stats, prefix)


def norm_backward(grads: dict, params: dict, dy: np.ndarray, cache) -> np.ndarray:
    r"""Backward of `norm_forward`: adds $d\gamma = \sum dy\odot\hat x$, $d\beta = \sum dy$ into
    ``grads`` and returns $dx$ (`refattn.nn.norms.normalize_backward`)."""
    if cache is None:
        return dy
    xhat, stats, prefix = cache
    lead = tuple(range(dy.ndim - 1))
    if f"{prefix}.bias" in params:
        add_grad(grads, f"{prefix}.bias", dy.sum(axis=lead))
    w = params.get(f"{prefix}.weight")
    if w is not None:
        add_grad(grads, f"{prefix}.weight", (dy * xhat).sum(axis=lead))
        dy = dy * w
    return normalize_backward(dy, xhat, stats)


def mlp_spec(fc1: str, fc2: str, width: int, hidden: int, *, bias: bool = True, out: int | None = None) -> dict:
    """The spec of ``fc2(act(fc1(x)))``: ``fc1.weight (width, hidden)``, ``fc2.weight (hidden, out)``
    and the biases when ``bias`` (callers list them as optional)."""
    spec = linear_prefixed_spec(fc1, width, hidden, bias)
    spec.update(linear_prefixed_spec(fc2, hidden, width if out is None else out, bias))
    return spec


def mlp_forward(params: dict, x: np.ndarray, *, fc1: str, fc2: str, activation: str):
    r"""$y = \phi(xW_1 + b_1)W_2 + b_2$ with the prefixed layers ``fc1``, ``fc2`` (biases optional)."""
    f, fp = activation_functions(activation)
    a = linear_prefixed(params, fc1, x)
    h = f(a)
    return linear_prefixed(params, fc2, h), (x, a, h, fc1, fc2, fp)


def mlp_backward(grads: dict, params: dict, dy: np.ndarray, cache) -> np.ndarray:
    r"""Backward of `mlp_forward`: $dh = dy\,W_2^\top$, $da = dh\odot\phi'(a)$, $dx = da\,W_1^\top$
    (weight and bias gradients added into ``grads``)."""
    x, a, h, fc1, fc2, fp = cache
    dh = linear_prefixed_vjp(grads, params, fc2, dy, h)
    return linear_prefixed_vjp(grads, params, fc1, dh * fp(a), x)


BATCH_NORM_KEYS = ("weight", "bias", "running_mean", "running_var")


def batch_norm_spec(prefix: str, channels: int) -> dict:
    """The ``check_params`` spec of a prefixed ``BatchNorm*d(channels)``: weight, bias and the two
    running statistics, each ``(channels,)``."""
    return {f"{prefix}.{k}": (channels,) for k in BATCH_NORM_KEYS}


def batch_norm_forward(params: dict, prefix: str, x: np.ndarray, *, training: bool = False, eps: float = 1e-5):
    r"""Batch normalisation of a channels-first ``x (B, C, *spatial)`` (module docstring):
    running statistics (``training=False``) or batch statistics (``training=True``), then
    $\gamma\odot\hat x + \beta$. Returns ``(y, cache)``."""
    shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    w, b = (params[f"{prefix}.{k}"].reshape(shape) for k in ("weight", "bias"))
    if training:
        xhat, stats = normalize_forward(x, (0,) + tuple(range(2, x.ndim)), eps)
        rstd = None
    else:
        rstd = 1.0 / np.sqrt(params[f"{prefix}.running_var"].reshape(shape) + eps)
        xhat, stats = (x - params[f"{prefix}.running_mean"].reshape(shape)) * rstd, None
    return xhat * w + b, (xhat, stats, rstd, prefix)


def batch_norm_backward(grads: dict, params: dict, dy: np.ndarray, cache) -> np.ndarray:
    r"""VJP of `batch_norm_forward`: adds the weight, bias and running-statistics gradients into
    ``grads`` (zeros for the running statistics in training mode) and returns $dx$."""
    xhat, stats, rstd, prefix = cache
    axes = (0,) + tuple(range(2, dy.ndim))
    w = params[f"{prefix}.weight"]
    add_grad(grads, f"{prefix}.weight", (dy * xhat).sum(axis=axes))
    add_grad(grads, f"{prefix}.bias", dy.sum(axis=axes))
    g = dy * w.reshape((1, -1) + (1,) * (dy.ndim - 2))
    if stats is not None:
        add_grad(grads, f"{prefix}.running_mean", np.zeros_like(w))
        add_grad(grads, f"{prefix}.running_var", np.zeros_like(w))
        return normalize_backward(g, xhat, stats)
    gr = g * rstd
    add_grad(grads, f"{prefix}.running_mean", -gr.sum(axis=axes))
    add_grad(grads, f"{prefix}.running_var", -0.5 * (gr * xhat * rstd).sum(axis=axes))
    return gr


# --------------------------------------------------------------------------------------------
# The pre-norm transformer block x + Attn(LN1 x), then + MLP(LN2 x)


@dataclass(frozen=True)
class BlockNames:
    """Param prefixes of a pre-norm block; the attention's prefix is its `Sublayer`'s. Defaults
    are GPT-2's (``ln_1``, ``ln_2``, ``mlp.c_fc``, ``mlp.c_proj``)."""

    norm1: str = "ln_1"
    norm2: str = "ln_2"
    fc1: str = "mlp.c_fc"
    fc2: str = "mlp.c_proj"


def transformer_block_spec(names: BlockNames, width: int, hidden: int, *, norm: str = "layer") -> dict:
    """The block's own keys (norms and MLP; biases included: list them as optional)."""
    spec = norm_spec(names.norm1, width, norm)
    spec.update(norm_spec(names.norm2, width, norm))
    spec.update(mlp_spec(names.fc1, names.fc2, width, hidden))
    return spec


def transformer_block_forward(x: np.ndarray, params: dict, attention: Sublayer, attn_params: dict, *,
                              names: BlockNames = BlockNames(), norm: str = "layer", eps: float = 1e-5,
                              activation: str = "gelu"):
    r"""$u = x + \mathrm{Attn}(\mathrm{N}_1x)$, $y = u + \mathrm{MLP}(\mathrm{N}_2u)$ (pre-norm block).

    ``params`` holds the block's own (cast) arrays, ``attn_params`` the attention's sub-dict.
    Returns ``(y, cache)``; `transformer_block_backward` is its VJP.
    """
    h1, c1 = norm_forward(params, names.norm1, x, kind=norm, eps=eps)
    a, ca = attention.apply(h1, attn_params)
    u = x + a
    h2, c2 = norm_forward(params, names.norm2, u, kind=norm, eps=eps)
    m, cm = mlp_forward(params, h2, fc1=names.fc1, fc2=names.fc2, activation=activation)
    return u + m, (c1, ca, c2, cm, attention)


def transformer_block_backward(grads: dict, params: dict, dy: np.ndarray, cache) -> np.ndarray:
    r"""VJP of `transformer_block_forward`: $du = dy + J_{N_2}^\top J_{MLP}^\top dy$,
    $dx = du + J_{N_1}^\top J_{Attn}^\top du$; parameter gradients are added into ``grads``."""
    c1, ca, c2, cm, attention = cache
    du = dy + norm_backward(grads, params, mlp_backward(grads, params, dy, cm), c2)
    return du + norm_backward(grads, params, attention.vjp(du, ca, grads), c1)


# --------------------------------------------------------------------------------------------
# Attention cores (q, k, v) -> o and head-gated multi-head attention


def resolve_attention_core(spec, *, prefix: str = "core", config=None, name: str = "core") -> Sublayer:
    """A per-head attention core as a `Sublayer` (module docstring): ``None`` (``"sdpa"``), a
    registry slug whose forward starts ``(q, k, v, ...)`` or a ``(forward, backward)`` pair.
    Raises ``TypeError``/``ValueError`` naming ``name``."""
    if config is not None and not isinstance(config, Mapping):
        raise TypeError(f"{name}_config must be a dict of keyword arguments for the {name}; got {type(config).__name__}")
    cfg = dict(config or {})
    spec = "sdpa" if spec is None else spec
    if isinstance(spec, str):
        from .. import registry

        try:
            rec = registry.get(spec)
        except KeyError as exc:
            raise ValueError(f"{name}={spec!r} is not a registered mechanism ({exc.args[0]})") from None
        if not rec.implemented or rec.backward is None or _parameter_names(rec.forward)[:3] != ("q", "k", "v"):
            raise ValueError(f"{name}={spec!r} is not an attention core forward(q, k, v, ...) with a backward; pass "
                             f"e.g. 'sdpa' or 'alibi', or a (forward, backward) pair")
        return Sublayer(rec.forward, rec.backward, prefix, cfg, spec)
    if isinstance(spec, (tuple, list)) and len(spec) == 2 and all(callable(f) for f in spec):
        return Sublayer(spec[0], spec[1], prefix, cfg, getattr(spec[0], "__name__", "custom"))
    raise TypeError(f"{name} must be a registry slug or a (forward, backward) pair of callables; got {type(spec).__name__}")


def core_apply(core: Sublayer, q, k, v, params: dict):
    """``core.forward(q, k, v[, params=params], **core.config)``; errors re-raised naming the core."""
    kwargs = dict(core.config)
    if params:
        kwargs["params"] = params
    try:
        o, cache = core.forward(q, k, v, **kwargs)
    except (ValueError, TypeError) as exc:
        raise type(exc)(f"attention core '{core.prefix}' ({core.name}): {exc}") from exc
    if np.shape(o)[:-1] != q.shape[:-1]:
        raise ValueError(f"attention core '{core.prefix}' ({core.name}) must map q of shape {q.shape} to "
                         f"(..., H, N, dv); got {np.shape(o)}")
    return o, cache


def core_vjp(core: Sublayer, do, cache, grads: dict):
    """Chain ``do`` through the core's backward: returns ``(dq, dk, dv)`` and adds the core's own
    parameter gradients into ``grads`` under ``"<prefix>.<key>"``."""
    g = core.backward(do, cache)
    for key, val in g.items():
        if key not in ("q", "k", "v"):
            add_grad(grads, core.key(key), val)
    return g["q"], g["k"], g["v"]


def head_gated_attention_spec(names, width: int, num_heads: int, head_dim: int) -> dict:
    """Spec of the projections (biases included: list them as optional): fused ``qkv (C, 3Hd)``,
    ``proj (Hd, C)`` or separate ``q_proj``/``k_proj``/``v_proj (C, Hd)``, ``out_proj (Hd, C)``."""
    inner = num_heads * head_dim
    if len(names) == 2:
        spec = linear_prefixed_spec(names[0], width, 3 * inner)
    else:
        spec = {}
        for n in names[:3]:
            spec.update(linear_prefixed_spec(n, width, inner))
    spec.update(linear_prefixed_spec(names[-1], inner, width))
    return spec


def head_gated_attention_forward(params: dict, x: np.ndarray, gates: np.ndarray, *, num_heads: int, core: Sublayer,
                                 core_params: dict, names=FUSED_QKV_NAMES):
    r"""$y = [g_{t,h}\,\mathrm{core}(q_h, k_h, v_h)_t]_h W_O + b_O$ for ``gates (..., N, H)``
    (module docstring). Unvalidated; returns ``(y, cache)``."""
    if len(names) == 2:
        qkv = linear_prefixed(params, names[0], x)
        q, k, v = (split_heads(a, num_heads) for a in np.split(qkv, 3, axis=-1))
    else:
        q, k, v = (split_heads(linear_prefixed(params, n, x), num_heads) for n in names[:3])
    o, c_core = core_apply(core, q, k, v, core_params)
    gt = np.swapaxes(gates, -1, -2)[..., None]
    m = merge_heads(o * gt)
    return linear_prefixed(params, names[-1], m), (x, o, gt, m, c_core, core, tuple(names), num_heads)


def head_gated_attention_backward(grads: dict, params: dict, dy: np.ndarray, cache):
    r"""VJP of `head_gated_attention_forward`: adds the projection (and core) gradients into
    ``grads`` and returns ``(dx, dgates)`` with ``dgates (..., N, H)``."""
    x, o, gt, m, c_core, core, names, h = cache
    dog = split_heads(linear_prefixed_vjp(grads, params, names[-1], dy, m), h)
    dgates = np.swapaxes(np.sum(dog * o, axis=-1), -1, -2)
    dq, dk, dv = core_vjp(core, dog * gt, c_core, grads)
    if len(names) == 2:
        dqkv = np.concatenate([merge_heads(dq), merge_heads(dk), merge_heads(dv)], axis=-1)
        return linear_prefixed_vjp(grads, params, names[0], dqkv, x), dgates
    dx = sum(linear_prefixed_vjp(grads, params, n, merge_heads(d), x) for n, d in zip(names[:3], (dq, dk, dv)))
    return dx, dgates


# --------------------------------------------------------------------------------------------
# Parameters for tests and demos, and memory accounting


def init_attention_params(rng, mechanism: str, width: int, num_heads: int, *, head_dim: int | None = None,
                          bias: bool = True):
    r"""Random ``(params, config)`` for an attention layer of width ``width`` (unprefixed keys).

    Supports ``"multi_head_attention"`` (keys ``q_proj``, ``k_proj``, ``v_proj``, ``out_proj`` and
    their ``*_bias``; Xavier-uniform weights; config ``{"num_heads": H}``) and
    ``"diff_attention_v1"`` (keys ``q_proj.weight`` ... ``out_proj.weight``, ``lambda_q1`` ...,
    ``subln.weight``; $d$ = ``head_dim`` or ``width // (2H)``; config ``{"num_heads": H,
    "depth": 0}``, causal by unilm's rule). For other mechanisms build the params yourself; place
    them under a block prefix with `add_prefix`.
    """
    h = int(num_heads)
    if mechanism == "multi_head_attention":
        d = head_dim or max(width // h, 1)
        shapes = {"q_proj": (width, h * d), "k_proj": (width, h * d), "v_proj": (width, h * d),
                  "out_proj": (h * d, width)}
        p = {}
        for n, (i, o) in shapes.items():
            lim = np.sqrt(6.0 / (i + o))
            p[n] = rng.uniform(-lim, lim, (i, o))
            if bias:
                p[n + "_bias"] = 0.1 * rng.standard_normal(o)
        return p, {"num_heads": h}
    if mechanism == "diff_attention_v1":
        d = head_dim or max(width // (2 * h), 1)
        p = {"q_proj.weight": rng.standard_normal((width, 2 * h * d)) / np.sqrt(width),
             "k_proj.weight": rng.standard_normal((width, 2 * h * d)) / np.sqrt(width),
             "v_proj.weight": rng.standard_normal((width, 2 * h * d)) / np.sqrt(width),
             "out_proj.weight": rng.standard_normal((2 * h * d, width)) / np.sqrt(2 * h * d)}
        for k in ("lambda_q1", "lambda_k1", "lambda_q2", "lambda_k2"):
            p[k] = 0.1 * rng.standard_normal(d)
        p["subln.weight"] = 1.0 + 0.2 * rng.standard_normal(2 * d)
        return p, {"num_heads": h, "depth": 0}
    raise ValueError(f"init_attention_params knows 'multi_head_attention' and 'diff_attention_v1'; got {mechanism!r}")


def cache_nbytes(cache) -> int:
    """Bytes of the distinct NumPy buffers reachable from ``cache`` (dicts, lists, tuples).

    Views count their base buffer once: this is the memory a cache keeps alive. Functions,
    `Sublayer` objects and scalars count 0.
    """
    seen: dict[int, int] = {}

    def walk(obj):
        if isinstance(obj, np.ndarray):
            base = obj
            while isinstance(base.base, np.ndarray):
                base = base.base
            seen[id(base)] = base.nbytes
        elif isinstance(obj, dict):
            for v in obj.values():
                walk(v)
        elif isinstance(obj, (list, tuple)):
            for v in obj:
                walk(v)

    walk(cache)
    return int(sum(seen.values()))
