r"""DeepScaleLM: a transformer layer with moment-preserving residual scaling, and its initialisation.

Kedia, Zaidi, Khyalia, Jung, Goka, Lee, "Transformers Get Stable: An End-to-End Signal Propagation
Theory for Language Models", ICML 2024 (PMLR 235), arXiv 2403.09635. No code is public (no
repository under the authors' or the paper's name was found); this module is written from the
paper's stated scheme.

What the sources define
-----------------------
The paper derives the moments of every transformer component and proposes DeepScaleLM (DSLM):
every residual step mixes the skip and the block output with weights whose squares sum to one,

$$x_{out} = \lambda\,x_{skip} + \beta\,F(x_{in}),\qquad \lambda^2 + \beta^2 = 1,\qquad
\beta^2 = k/N,$$

for a model of $N$ layers and a constant $k$ (``k = 2`` by default, as in the paper's scheme and
the only public port we could read), together with an initialisation under which every block $F$
outputs unit variance. If the skip has unit variance and $F(x)$ has unit variance and is
uncorrelated with the skip at initialisation, $\mathrm{Var}(x_{out}) = \lambda^2 + \beta^2 = 1$:
the residual stream keeps unit variance at every depth instead of growing as $\Theta(N)$ (Pre-LN),
and the gradient is scaled by $\lambda$ per step instead of accumulating.

The layer (`deepscalelm_block_forward`)
---------------------------------------
Pre-LN (``norm_position="pre"``, default), with LayerNorms $N_1, N_2$ (``norm1``, ``norm2``), an
attention sublayer $A$ (any token mixer: a registry slug, default ``"multi_head_attention"``, or a
``(forward, backward)`` pair, parameters under ``"attn.<key>"``) and the MLP
$M(h) = \phi(hW_1+b_1)W_2+b_2$ (``mlp.fc1``, ``mlp.fc2``; ReLU as the paper's BERT models):

$$u = \lambda x + \beta A(N_1x),\qquad y = \lambda u + \beta M(N_2u).$$

Post-LN (``norm_position="post"``): $u = N_1(\lambda x + \beta A(x))$, $y = N_2(\lambda u + \beta M(u))$.
$\lambda, \beta$ are fixed numbers, not parameters: ``num_layers`` and ``k`` give them
(`deepscalelm_gains`), or ``beta`` is passed directly ($\lambda = \sqrt{1-\beta^2}$).

Initialisation (`deepscalelm_init`) — reconstruction
----------------------------------------------------
The paper's per-component variance table could not be read here (the stored copies of the paper
hold its abstract and introduction only), so the initialisation is derived from the principle it
states — every block outputs unit variance at initialisation — with the standard moment rules
(a linear map of fan-in $n$ multiplies the second moment by $n\sigma_w^2$; ReLU halves it;
inverted dropout of rate $p$ multiplies it by $1/(1-p)$). The MLP input is LayerNorm output (unit
second moment), so its output variance is $C\sigma_1^2\cdot\tfrac12\cdot F\sigma_2^2/(1-p)$, and unit
output variance fixes the product $\sigma_1^2\sigma_2^2 = 2(1-p)/(CF)$. ``ffn_split="equal"``
(default) takes equal variances, $\sigma_1^2 = \sigma_2^2 = \sqrt{2(1-p)/(CF)}$ (for $F = 4C$:
$\sqrt{(1-p)/2}/C$; a third-party port of the scheme also uses equal FFN variances), and
``"he"`` puts the ReLU factor on the first layer, $\sigma_1^2 = 2/C$, $\sigma_2^2 = (1-p)/F$. The
attention's $W_Q, W_K, W_V, W_O$
take $\mathcal N(0, 1/C)$; biases 0, norms 1/0.
The attention output's variance then depends on the inter-token correlation (the paper's
correlation analysis), so only the MLP block is exactly unit-variance; this is a documented
reconstruction, and the statistical check tests the MLP's unit output moment and the
unit-variance residual stream through a deep stack.

Backward
--------
With $dy$ given, Pre-LN:

$$du = \lambda\,dy + J_{N_2}^\top J_M^\top(\beta\,dy),\qquad
dx = \lambda\,du + J_{N_1}^\top J_A^\top(\beta\,du);$$

Post-LN: $dv_2 = J_{N_2}^\top dy$, $du = \lambda dv_2 + J_M^\top(\beta dv_2)$,
$dv_1 = J_{N_1}^\top du$, $dx = \lambda dv_1 + J_A^\top(\beta dv_1)$. $J_A^\top$ is the attention's
own backward, $J_M^\top$ and $J_N^\top$ the MLP and LayerNorm VJPs of `refattn.blocks.core`.

Conventions
-----------
``norm_position`` (``"pre"``/``"post"``: the paper applies DSLM to both), ``k`` (2), ``beta``
(overrides ``k``/``num_layers``), ``num_layers`` counts transformer layers (the paper's $N$; each
layer's two residual steps share one $(\lambda, \beta)$ — reconstruction: whether $N$ counts
layers or sublayers is not visible in the available text), ``eps`` (1e-5), ``activation``
(``"relu"``). Dropout is omitted (evaluation mode); the initialisation takes the training
dropout rate.

Agreement with upstream
-----------------------
No upstream code exists. A float64 torch scratch transcription of the two residual steps
(``nn.LayerNorm``, ``nn.MultiheadAttention``-style per-head softmax attention, ``nn.Linear``,
autograd, ``scaled_dot_product_attention``) agrees with the forward and every gradient to
$1.4\times10^{-15}$ relative (Pre-LN $8.8\times10^{-16}$, Post-LN $1.4\times10^{-15}$; $N = 24$,
$k = 2$); the key-bias gradient, zero in theory, is rounding noise below $1.2\times10^{-15}$ on both
sides.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_choice, check_int, check_positive
from ..registry import Mechanism, Sample, register
from .core import (
    ACTIVATIONS,
    block_dtype,
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

__all__ = ["deepscalelm_gains", "deepscalelm_init", "deepscalelm_block_forward", "deepscalelm_block_backward",
           "deepscalelm_block", "DSLM_NORM_POSITIONS", "DSLM_FFN_SPLITS"]

DSLM_NORM_POSITIONS = ("pre", "post")
DSLM_FFN_SPLITS = ("equal", "he")


def deepscalelm_gains(num_layers: int, *, k: float = 2.0) -> tuple[float, float]:
    r"""$(\lambda, \beta)$ with $\beta^2 = k/N$ and $\lambda^2 = 1 - \beta^2$ (requires $k \le N$)."""
    n = check_int(num_layers, "num_layers", minimum=1)
    k = check_positive(k, "k")
    if k > n:
        raise ValueError(f"k must be <= num_layers so that beta^2 = k/N <= 1; got k={k}, num_layers={n}")
    b2 = k / n
    return float(np.sqrt(1.0 - b2)), float(np.sqrt(b2))


def deepscalelm_init(rng, width: int, hidden: int, *, num_heads: int = 1, dropout: float = 0.0,
                     ffn_split: str = "equal") -> tuple[dict, dict]:
    r"""Initial ``(params, attention_config)`` of one DSLM layer (module docstring, reconstruction).

    MLP weights with $\sigma_1^2\sigma_2^2 = 2(1-p)/(CF)$ (unit output variance): equal variances
    (``ffn_split="equal"``) or $\sigma_1^2 = 2/C$, $\sigma_2^2 = (1-p)/F$ (``"he"``); attention
    ``attn.{q,k,v,out}_proj`` $\sim\mathcal N(0, 1/C)$; biases 0; norms 1 and 0.
    """
    c = check_int(width, "width", minimum=1)
    f = check_int(hidden, "hidden", minimum=1)
    h = check_int(num_heads, "num_heads", minimum=1)
    p_drop = float(dropout)
    if not 0.0 <= p_drop < 1.0:
        raise ValueError(f"dropout must be in [0, 1); got {dropout}")
    if c % h:
        raise ValueError(f"width={c} must be a multiple of num_heads={h}")
    check_choice(ffn_split, "ffn_split", DSLM_FFN_SPLITS)
    if ffn_split == "equal":
        v1 = v2 = float(np.sqrt(2.0 * (1.0 - p_drop) / (c * f)))
    else:
        v1, v2 = 2.0 / c, (1.0 - p_drop) / f
    p = {"mlp.fc1.weight": rng.normal(0.0, np.sqrt(v1), (c, f)), "mlp.fc1.bias": np.zeros(f),
         "mlp.fc2.weight": rng.normal(0.0, np.sqrt(v2), (f, c)), "mlp.fc2.bias": np.zeros(c)}
    for n in ("norm1", "norm2"):
        p[f"{n}.weight"], p[f"{n}.bias"] = np.ones(c), np.zeros(c)
    for n in ("q_proj", "k_proj", "v_proj", "out_proj"):
        p[f"attn.{n}"] = rng.normal(0.0, np.sqrt(1.0 / c), (c, c))
        p[f"attn.{n}_bias"] = np.zeros(c)
    return p, {"num_heads": h}


def _gains(num_layers, k, beta):
    if beta is None:
        if num_layers is None:
            raise ValueError("pass num_layers (with k) or beta to fix the DeepScaleLM residual weights")
        return deepscalelm_gains(num_layers, k=k)
    if num_layers is not None:
        raise ValueError("pass either num_layers (with k) or beta, not both")
    b = check_positive(beta, "beta")
    if b > 1.0:
        raise ValueError(f"beta must be in (0, 1] so that lambda = sqrt(1 - beta^2) is real; got {beta}")
    return float(np.sqrt(1.0 - b * b)), float(b)


def deepscalelm_block_forward(x, params, *, num_layers=None, k: float = 2.0, beta=None, norm_position: str = "pre",
                              attention=None, attention_config=None, eps: float = 1e-5, activation: str = "relu"):
    r"""One DSLM transformer layer: $u = \lambda x + \beta A(N_1x)$, $y = \lambda u + \beta M(N_2u)$
    (Pre-LN), or the Post-LN form (module docstring).

    Parameters
    ----------
    x : array (..., N, C)
    params : dict
        ``"norm1.weight"/".bias" (C,)``, ``"norm2.weight"/".bias" (C,)``, ``"mlp.fc1.weight" (C, F)``,
        ``"mlp.fc2.weight" (F, C)`` with optional ``".bias"``; the attention's under ``"attn.<key>"``.
    num_layers, k : int, float
        The model depth $N$ and the constant $k$: $\beta^2 = k/N$.
    beta : float, optional
        $\beta$ directly (instead of ``num_layers``).
    norm_position : {"pre", "post"}
    attention, attention_config
        The attention sublayer (registry slug, ``(forward, backward)`` or Sublayer; default
        ``"multi_head_attention"``) and its keyword configuration.
    eps : float
        LayerNorm epsilon.
    activation : {"relu", "gelu", "gelu_tanh", "silu"}

    Returns
    -------
    y, cache
    """
    x = as_float(x, "x", min_ndim=2)
    lam, bet = _gains(num_layers, k, beta)
    check_choice(norm_position, "norm_position", DSLM_NORM_POSITIONS)
    eps = check_positive(eps, "eps", allow_zero=True)
    check_choice(activation, "activation", ACTIVATIONS)
    attn = resolve_sublayer("multi_head_attention" if attention is None else attention, prefix="attn",
                            config=attention_config)
    c = x.shape[-1]
    hidden = param_dim(params, "mlp.fc1.weight", 1, where="deepscalelm_block", shape=("C", "F"))
    spec = {**norm_spec("norm1", c), **norm_spec("norm2", c), **mlp_spec("mlp.fc1", "mlp.fc2", c, hidden)}
    own, (ap,) = split_block_params(params, spec, (attn,), optional=["mlp.fc1.bias", "mlp.fc2.bias"],
                                    where="deepscalelm_block")
    dt = block_dtype(x, own, (ap,))
    x, own, ap = x.astype(dt, copy=False), cast_all(dt, own), cast_all(dt, ap)
    if norm_position == "pre":
        h1, c1 = norm_forward(own, "norm1", x, eps=eps)
        a, ca = attn.apply(h1, ap)
        u = lam * x + bet * a
        h2, c2 = norm_forward(own, "norm2", u, eps=eps)
        m, cm = mlp_forward(own, h2, fc1="mlp.fc1", fc2="mlp.fc2", activation=activation)
        y = lam * u + bet * m
    else:
        a, ca = attn.apply(x, ap)
        u, c1 = norm_forward(own, "norm1", lam * x + bet * a, eps=eps)
        m, cm = mlp_forward(own, u, fc1="mlp.fc1", fc2="mlp.fc2", activation=activation)
        y, c2 = norm_forward(own, "norm2", lam * u + bet * m, eps=eps)
    cache = {"params": own, "attn": attn, "c1": c1, "ca": ca, "c2": c2, "cm": cm, "lam": lam, "beta": bet,
             "pos": norm_position, "shape": x.shape, "dtype": dt}
    return y, cache


def deepscalelm_block_backward(dout, cache):
    r"""Gradients of `deepscalelm_block_forward` for ``x`` and every params key (module docstring)."""
    g = as_dout(dout, cache["shape"], cache["dtype"])
    own, attn, lam, bet = cache["params"], cache["attn"], cache["lam"], cache["beta"]
    grads = {}
    if cache["pos"] == "pre":
        du = lam * g + norm_backward(grads, own, mlp_backward(grads, own, bet * g, cache["cm"]), cache["c2"])
        grads["x"] = lam * du + norm_backward(grads, own, attn.vjp(bet * du, cache["ca"], grads), cache["c1"])
    else:
        dv2 = norm_backward(grads, own, g, cache["c2"])
        du = lam * dv2 + mlp_backward(grads, own, bet * dv2, cache["cm"])
        dv1 = norm_backward(grads, own, du, cache["c1"])
        grads["x"] = lam * dv1 + attn.vjp(bet * dv1, cache["ca"], grads)
    return grads


def deepscalelm_block(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of `deepscalelm_block_forward`."""
    return deepscalelm_block_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size):
    if size == "tiny":
        n, c, f, h = 2, 3, 3, 1
    else:
        n, c, f, h = int(rng.integers(4, 7)), 8, 12, 2
    p, acfg = deepscalelm_init(rng, c, f, num_heads=h, dropout=0.1)
    for key in list(p):
        # Perturb every parameter (zero biases and unit norms would hide gradient errors).
        p[key] = p[key] + 0.2 * rng.standard_normal(p[key].shape)
    if size == "tiny":
        for key in [k for k in p if k.startswith("attn.") and k.endswith("_bias")] + ["mlp.fc1.bias"]:
            p.pop(key)  # the ~300-entry FD budget
    cfg = {"num_layers": int(rng.integers(4, 48)), "norm_position": str(rng.choice(DSLM_NORM_POSITIONS)),
           "attention_config": acfg}
    return Sample(inputs={"x": rng.standard_normal((2, n, c))}, params=p, config=cfg)


def _reference(x, params, num_layers=None, k=2.0, beta=None, norm_position="pre", attention=None,
               attention_config=None, eps=1e-5, activation="relu"):
    # The residual steps written out: refattn.nn.layer_norm, the registry attention, the MLP by hand.
    from .. import registry
    from ..nn.norms import layer_norm
    from .core import activation_functions

    p = params
    b = np.sqrt(k / num_layers) if beta is None else beta
    lam = np.sqrt(1.0 - b * b)
    f, _ = activation_functions(activation)

    def ln(z, key):
        return layer_norm(z, {"weight": p[f"{key}.weight"], "bias": p[f"{key}.bias"]}, eps=eps)

    def mlp(z):
        return f(z @ p["mlp.fc1.weight"] + p.get("mlp.fc1.bias", 0.0)) @ p["mlp.fc2.weight"] + p.get("mlp.fc2.bias", 0.0)

    sub = {key[5:]: v for key, v in p.items() if key.startswith("attn.")}
    fwd = registry.get(attention or "multi_head_attention").forward

    def att(z):
        return fwd(z, params=sub, **(attention_config or {}))[0]

    if norm_position == "pre":
        u = lam * x + b * att(ln(x, "norm1"))
        return lam * u + b * mlp(ln(u, "norm2"))
    u = ln(lam * x + b * att(x), "norm1")
    return ln(lam * u + b * mlp(u), "norm2")


def _check_gains(rng):
    # lambda^2 + beta^2 = 1 and beta^2 = k/N for several depths; beta= gives the same layer.
    err = 0.0
    for n, k in ((2, 2.0), (12, 2.0), (192, 2.0), (1000, 1.0)):
        lam, b = deepscalelm_gains(n, k=k)
        err = max(err, abs(lam * lam + b * b - 1.0), abs(b * b - k / n))
    s = _sample(rng, "small")
    cfg = dict(s.config)
    lam, b = deepscalelm_gains(cfg.pop("num_layers"))
    y1 = deepscalelm_block(s.inputs["x"], s.params, num_layers=int(round(2.0 / b**2)), **cfg)
    y2 = deepscalelm_block(s.inputs["x"], s.params, beta=b, **cfg)
    err = max(err, float(np.abs(y1 - y2).max()))
    assert err < 1e-12, f"DSLM gains: lambda^2 + beta^2 = 1 / beta^2 = k/N off by {err}"
    return err


def _check_mlp_unit_output_variance(rng):
    # The initialised MLP maps a LayerNorm output (unit second moment) to unit variance (Monte Carlo
    # over 48 weight draws, 32 tokens, C = 16, F = 64): within 0.1 of 1, for dropout 0 and 0.2
    # (inverted dropout applied to the hidden layer, as in training), both FFN variance splits.
    r = np.random.default_rng(7)
    worst = 0.0
    for p_drop, split in ((0.0, "equal"), (0.2, "equal"), (0.2, "he")):
        acc = []
        for _ in range(48):
            p, _ = deepscalelm_init(r, 16, 64, dropout=p_drop, ffn_split=split)
            z = r.standard_normal((32, 16))
            z = (z - z.mean(-1, keepdims=True)) / z.std(-1, keepdims=True)
            hid = np.maximum(z @ p["mlp.fc1.weight"], 0.0)
            hid = hid * (r.random(hid.shape) >= p_drop) / (1.0 - p_drop)
            acc.append(np.mean((hid @ p["mlp.fc2.weight"]) ** 2))
        worst = max(worst, abs(float(np.mean(acc)) - 1.0))
    assert worst < 0.1, f"the DSLM-initialised MLP's output variance is {worst:.3f} from 1"
    return worst


def _check_stream_variance_is_preserved(rng):
    # Through 24 Pre-LN MLP residual steps x <- lambda x + beta M(LN x) at DSLM init the stream's
    # variance stays within 0.25 of 1, while the unscaled x <- x + M(LN x) grows past 10.
    r = np.random.default_rng(11)
    depth = 24
    lam, b = deepscalelm_gains(depth)
    x = r.standard_normal((64, 32))
    xs, xu = x.copy(), x.copy()
    for _ in range(depth):
        p, _ = deepscalelm_init(r, 32, 128)

        def mlp(z, p=p):
            z = (z - z.mean(-1, keepdims=True)) / z.std(-1, keepdims=True)
            return np.maximum(z @ p["mlp.fc1.weight"], 0.0) @ p["mlp.fc2.weight"]

        xs, xu = lam * xs + b * mlp(xs), xu + mlp(xu)
    dev = abs(float(np.var(xs)) - 1.0)
    assert dev < 0.25 and float(np.var(xu)) > 10.0, (dev, float(np.var(xu)))
    return dev


register(
    Mechanism(
        slug="deepscalelm_residual_scaling", family="5-building-blocks", tier="T3",
        title="DeepScaleLM layer: lambda x + beta F(x) with lambda^2 + beta^2 = 1, beta^2 = k/N (Pre-/Post-LN), "
              "pluggable attention, unit-variance initialisation",
        paper="Kedia, Zaidi, Khyalia, Jung, Goka, Lee, Transformers Get Stable: An End-to-End Signal Propagation "
              "Theory for Language Models, ICML 2024, arXiv 2403.09635",
        forward=deepscalelm_block_forward, backward=deepscalelm_block_backward, sample=_sample,
        reference=_reference, docs="blocks/b7.md#deepscalelm_residual_scaling",
        checks={"gains": _check_gains, "mlp_unit_output_variance": _check_mlp_unit_output_variance,
                "stream_variance_is_preserved": _check_stream_variance_is_preserved},
    ),
)
