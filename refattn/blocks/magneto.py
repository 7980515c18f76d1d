r"""Magneto: the Sub-LayerNorm transformer layer and its DeepNet-derived initialisation.

Wang, Ma, Huang, Dong, Wang, Peng, Wu, Bajaj, Singhal, Benhaim, Patra, Liu, Chaudhary, Song, Wei,
"Magneto: A Foundation Transformer" (arXiv title "Foundation Transformers"), ICML 2023,
arXiv 2210.06423. Upstream: microsoft/torchscale (``subln`` option) @
4d1e0e82e5adf86dd424f1463192635b73fc8efc: ``torchscale/architecture/encoder.py`` (``EncoderLayer``,
and the gains in ``Encoder.__init__``), ``decoder.py`` (``Decoder.__init__``),
``component/multihead_attention.py`` (``inner_attn_ln``), ``component/feedforward_network.py``
(``ffn_layernorm``). The PyPI package ``torchscale`` 0.3.0 is the same code.

Sub-LN layer
------------
Two LayerNorms per sublayer: one at the input (pre-LN) and one before the output projection:

$$h = \mathrm{LN}_a(x),\quad O = \mathrm{Attn}(hW_Q, hW_K, hW_V),\quad u = x + \mathrm{LN}_i(O)\,W_O,$$
$$y = u + \mathrm{LN}_f\big(\phi(\mathrm{LN}_b(u)W_1)\big)W_2,$$

(biases on every projection, as torchscale). $\mathrm{LN}_a$ = ``self_attn_layer_norm``,
$\mathrm{LN}_i$ = ``self_attn.inner_attn_ln`` (over the merged heads, width $C$),
$\mathrm{LN}_b$ = ``final_layer_norm``, $\mathrm{LN}_f$ = ``ffn.ffn_layernorm`` (width $F$). The
attention is SDPA with $1/\sqrt d$ (refattn's `sdpa_forward`), ``is_causal`` for the decoder layer.

Initialisation (`magneto_gain`, `magneto_init`)
-----------------------------------------------
$W_V, W_O, W_1, W_2$ are scaled by $\gamma$, $W_Q, W_K$ are not: $\gamma = \sqrt{\log 2N}$ for an
$N$-layer encoder-only or decoder-only model; in an encoder-decoder with $N$ encoder and $M$
decoder layers, $\gamma_e = \sqrt{\log(3M)\log(2N)/3}$ and $\gamma_d = \sqrt{\log 3M}$ (torchscale
``Encoder``/``Decoder``; the decoder's cross-attention is not scaled). Two schemes:

* ``"paper"``: Xavier-normal with the gains, ``xavier_normal_(w, gain)`` as in DeepNet's published
  pseudocode from which Magneto derives its rule:
  $W\sim\mathcal N(0,\ \mathrm{gain}^2\cdot 2/(n_{in}+n_{out}))$, gain $\gamma$ for V, O, FFN and 1 for
  Q, K; biases 0. (The Magneto paper's own pseudocode could not be read from this project's stored
  sources; the distribution is that reading, the gains are verified against torchscale.)
* ``"torchscale"``: what the code does: PyTorch's default ``nn.Linear`` init
  $U(\pm1/\sqrt{n_{in}})$ for weights and biases (variance $1/(3n_{in})$), then weights *and
  biases* of ``v_proj``, ``out_proj``, ``fc1``, ``fc2`` multiplied by $\gamma$
  (``MultiheadAttention.reset_parameters``, which would use Xavier, is never called).

Every LayerNorm starts at weight 1, bias 0.

Backward
--------
The two residual steps in reverse: $du = dy + J_{\mathrm{LN}_b}^\top\big(W_1$-VJP of
$\phi'\odot J_{\mathrm{LN}_f}^\top(dy\,W_2^\top)\big)$; then $dO = J_{\mathrm{LN}_i}^\top(du\,W_O^\top)$,
the SDPA VJP (`sdpa_backward`) gives $dQ, dK, dV$, and
$dx = du + J_{\mathrm{LN}_a}^\top(dQW_Q^\top + dKW_K^\top + dVW_V^\top)$. The LayerNorm VJPs are
those of `refattn.nn.norms`.

Conventions
-----------
``activation`` (``"gelu"`` exact, torchscale's default ``activation_fn``), ``eps`` (``1e-5``,
``layernorm_eps``), ``is_causal`` / ``attn_mask`` (True = keep, refattn's convention; torchscale's
additive mask is converted by the caller). Dropout and drop-path are omitted. DeepNet's
post-LN residual scaling ($\alpha$) is not part of Magneto (torchscale turns it off with ``subln``).

Agreement with upstream
-----------------------
torchscale 0.3.0 ``EncoderLayer`` (``EncoderConfig(subln=True)``, pre-LN forced) and ``DecoderLayer``
(causal self-attention mask) run in float64 on CPU: output and the gradients of the input and all 20
parameters agree to $6.8\times10^{-7}$ relative, which is upstream computing the softmax and the FFN
activation in float32 (``F.softmax(..., dtype=torch.float32)``, ``activation_fn(x.float())``);
with those two casts patched out of the scratch copy, to $1.2\times10^{-15}$. (The key-bias
gradient is exactly zero in theory; upstream's float32 softmax leaves $6\times10^{-8}$ there.)
The gains: torchscale's ``Encoder``/``Decoder`` built twice from one seed, with and without
``subln``, scale ``v_proj``/``out_proj``/``fc1``/``fc2`` by exactly `magneto_gain` (encoder-only
$N\in\{6, 12, 24\}$; encoder-decoder $(N, M)\in\{(6, 6), (12, 4)\}$, both parts; agreement to
$10^{-12}$) and leave ``q_proj``/``k_proj`` unchanged. The statistical check draws parameters with
both schemes.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_choice, check_int, check_params, check_positive
from ..nn.linear import (
    init_linear_prefixed,
    linear_prefixed,
    linear_prefixed_spec,
    linear_prefixed_vjp,
    merge_heads,
    split_heads,
)
from ..registry import Mechanism, Sample, register
from .core import ACTIVATIONS, activation_functions, block_dtype, norm_backward, norm_forward, norm_spec, param_dim

__all__ = ["magneto_layer_forward", "magneto_layer_backward", "magneto_layer", "magneto_gain", "magneto_init",
           "MAGNETO_SCALED", "MAGNETO_INIT_SCHEMES"]

MAGNETO_SCALED = ("self_attn.v_proj", "self_attn.out_proj", "ffn.fc1", "ffn.fc2")
"""The layers whose initialisation is multiplied by the gain (torchscale's name filter)."""
MAGNETO_INIT_SCHEMES = ("paper", "torchscale")
_PROJ = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.out_proj")


def magneto_gain(num_layers: int, *, decoder_layers=None, part: str = "encoder") -> float:
    r"""The Magneto gain $\gamma$.

    ``decoder_layers=None``: an encoder-only or decoder-only stack of ``num_layers`` layers,
    $\gamma = \sqrt{\log 2N}$. Otherwise an encoder-decoder with ``num_layers`` encoder and
    ``decoder_layers`` decoder layers: ``part="encoder"`` gives $\sqrt{\log(3M)\log(2N)/3}$,
    ``part="decoder"`` $\sqrt{\log 3M}$.
    """
    n = check_int(num_layers, "num_layers", minimum=1)
    check_choice(part, "part", ("encoder", "decoder"))
    if decoder_layers is None:
        return float(np.sqrt(np.log(2.0 * n)))
    m = check_int(decoder_layers, "decoder_layers", minimum=1)
    if part == "decoder":
        return float(np.sqrt(np.log(3.0 * m)))
    return float(np.sqrt(np.log(3.0 * m) * np.log(2.0 * n) / 3.0))


def magneto_init(rng, width: int, ffn_width: int, *, gain: float, scheme: str = "paper") -> dict:
    r"""Initial parameters of one Sub-LN layer (keys of `magneto_layer_forward`), module docstring.

    Parameters
    ----------
    rng : numpy.random.Generator
    width, ffn_width : int
        $C$ and $F$.
    gain : float
        $\gamma$ (`magneto_gain`).
    scheme : {"paper", "torchscale"}
        Xavier-normal with gains (the paper) or ``nn.Linear`` defaults times $\gamma$ (the code).
    """
    c = check_int(width, "width", minimum=1)
    f = check_int(ffn_width, "ffn_width", minimum=1)
    gain = check_positive(gain, "gain")
    check_choice(scheme, "scheme", MAGNETO_INIT_SCHEMES)
    shapes = {**{n: (c, c) for n in _PROJ}, "ffn.fc1": (c, f), "ffn.fc2": (f, c)}
    p = {}
    for name, (n_in, n_out) in shapes.items():
        g = gain if name in MAGNETO_SCALED else 1.0
        if scheme == "paper":
            p[f"{name}.weight"] = rng.normal(0.0, g * np.sqrt(2.0 / (n_in + n_out)), (n_in, n_out))
            p[f"{name}.bias"] = np.zeros(n_out)
        else:
            layer = init_linear_prefixed(rng, n_in, n_out, name)
            p.update({k: g * v for k, v in layer.items()})
    for name, n in (("self_attn_layer_norm", c), ("self_attn.inner_attn_ln", c), ("final_layer_norm", c),
                    ("ffn.ffn_layernorm", f)):
        p[f"{name}.weight"], p[f"{name}.bias"] = np.ones(n), np.zeros(n)
    return p


def _spec(c, f):
    spec = {}
    for name in _PROJ:
        spec.update(linear_prefixed_spec(name, c, c))
    spec.update(linear_prefixed_spec("ffn.fc1", c, f))
    spec.update(linear_prefixed_spec("ffn.fc2", f, c))
    for name, n in (("self_attn_layer_norm", c), ("self_attn.inner_attn_ln", c), ("final_layer_norm", c),
                    ("ffn.ffn_layernorm", f)):
        spec.update(norm_spec(name, n))
    return spec


def magneto_layer_forward(x, params, *, num_heads: int, is_causal: bool = False, attn_mask=None,
                          activation: str = "gelu", eps: float = 1e-5):
    r"""One Magneto (Sub-LN) transformer layer on ``x (..., N, C)`` (module docstring).

    Parameters
    ----------
    x : array (..., N, C)
    params : dict
        torchscale's ``EncoderLayer`` keys, linear weights ``(in, out)``: ``self_attn.{q,k,v,out}_proj.weight
        (C, C)`` and ``.bias``, ``self_attn.inner_attn_ln.*``, ``self_attn_layer_norm.*``,
        ``ffn.fc1.weight (C, F)``, ``ffn.fc2.weight (F, C)`` (+ biases), ``ffn.ffn_layernorm.* (F,)``,
        ``final_layer_norm.*``. Biases are optional.
    num_heads : int
        $H$ ($C$ must be a multiple).
    is_causal, attn_mask
        Passed to SDPA (decoder layer: ``is_causal=True``).
    activation : {"relu", "gelu", "gelu_tanh", "silu"}
    eps : float
        LayerNorm epsilon.

    Returns
    -------
    y, cache
        ``y`` of the shape of ``x``.
    """
    from ..attention.softmax import sdpa_forward

    x = as_float(x, "x", min_ndim=2)
    h = check_int(num_heads, "num_heads", minimum=1)
    c = x.shape[-1]
    if c % h:
        raise ValueError(f"x's width C={c} must be a multiple of num_heads={h}")
    if not isinstance(is_causal, (bool, np.bool_)):
        raise TypeError(f"is_causal must be a bool; got {type(is_causal).__name__}")
    check_choice(activation, "activation", ACTIVATIONS)
    eps = check_positive(eps, "eps", allow_zero=True)
    f = param_dim(params, "ffn.fc1.weight", 1, where="magneto_layer", shape=("C", "F"))
    spec = _spec(c, f)
    linear_biases = [f"{n}.bias" for n in (*_PROJ, "ffn.fc1", "ffn.fc2")]
    p = check_params(params, spec, optional=linear_biases, where="magneto_layer")
    dt = block_dtype(x, p)
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    hn, c_a = norm_forward(p, "self_attn_layer_norm", x, eps=eps)
    q, k, v = (split_heads(linear_prefixed(p, f"self_attn.{n}_proj", hn), h) for n in ("q", "k", "v"))
    o, c_core = sdpa_forward(q, k, v, attn_mask=attn_mask, is_causal=bool(is_causal))
    om = merge_heads(o)
    oi, c_i = norm_forward(p, "self_attn.inner_attn_ln", om, eps=eps)
    u = x + linear_prefixed(p, "self_attn.out_proj", oi)
    hb, c_b = norm_forward(p, "final_layer_norm", u, eps=eps)
    act, dact = activation_functions(activation)
    a1 = linear_prefixed(p, "ffn.fc1", hb)
    z = act(a1)
    zf, c_f = norm_forward(p, "ffn.ffn_layernorm", z, eps=eps)
    y = u + linear_prefixed(p, "ffn.fc2", zf)
    cache = {"p": p, "h": h, "hn": hn, "c_a": c_a, "c_core": c_core, "oi": oi, "c_i": c_i, "hb": hb,
             "c_b": c_b, "a1": a1, "dact": dact, "zf": zf, "c_f": c_f, "shape": x.shape, "dtype": dt}
    return y, cache


def magneto_layer_backward(dout, cache):
    r"""Gradients of `magneto_layer_forward` for ``x`` and every params key (module docstring)."""
    from ..attention.softmax import sdpa_backward

    p, h = cache["p"], cache["h"]
    g = as_dout(dout, cache["shape"], cache["dtype"])
    grads = {}
    dzf = linear_prefixed_vjp(grads, p, "ffn.fc2", g, cache["zf"])
    dz = norm_backward(grads, p, dzf, cache["c_f"])
    dhb = linear_prefixed_vjp(grads, p, "ffn.fc1", dz * cache["dact"](cache["a1"]), cache["hb"])
    du = g + norm_backward(grads, p, dhb, cache["c_b"])
    doi = linear_prefixed_vjp(grads, p, "self_attn.out_proj", du, cache["oi"])
    dom = norm_backward(grads, p, doi, cache["c_i"])
    gc = sdpa_backward(split_heads(dom, h), cache["c_core"])
    dhn = sum(linear_prefixed_vjp(grads, p, f"self_attn.{n}_proj", merge_heads(gc[n]), cache["hn"])
              for n in ("q", "k", "v"))
    grads["x"] = du + norm_backward(grads, p, dhn, cache["c_a"])
    return grads


def magneto_layer(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of `magneto_layer_forward`."""
    return magneto_layer_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size):
    c, f, h, n = (4, 3, 2, 3) if size == "tiny" else (8, 12, 2, int(rng.integers(4, 7)))
    p = magneto_init(rng, c, f, gain=magneto_gain(6), scheme=str(rng.choice(MAGNETO_INIT_SCHEMES)))
    for k in list(p):
        # Perturb every parameter (norms at exactly 1/0 and zero biases would hide gradient errors).
        p[k] = p[k] + 0.2 * rng.standard_normal(p[k].shape)
    if size == "tiny":
        # Keep the tiny sample within the ~300-entry FD budget: no projection biases.
        for name in (*_PROJ, "ffn.fc1", "ffn.fc2"):
            p.pop(f"{name}.bias")
    return Sample(inputs={"x": rng.standard_normal((2, n, c))}, params=p,
                  config={"num_heads": h, "is_causal": bool(rng.random() < 0.5)})


def _reference(x, params, num_heads, is_causal=False, attn_mask=None, activation="gelu", eps=1e-5):
    # The layer written out with explicit per-head softmax attention and refattn.nn.layer_norm.
    from ..nn.norms import layer_norm

    p = params

    def ln(z, k):
        return layer_norm(z, {"weight": p[f"{k}.weight"], "bias": p[f"{k}.bias"]}, eps=eps)

    def lin(z, k):
        return z @ p[f"{k}.weight"] + p.get(f"{k}.bias", 0.0)

    f, _ = activation_functions(activation)
    hn = ln(x, "self_attn_layer_norm")
    n, c = x.shape[-2:]
    d = c // num_heads
    heads = []
    for i in range(num_heads):
        sl = slice(i * d, (i + 1) * d)
        q, k, v = (lin(hn, f"self_attn.{m}_proj")[..., sl] for m in ("q", "k", "v"))
        s = q @ np.swapaxes(k, -1, -2) / np.sqrt(d)
        if is_causal:
            s = np.where(np.tril(np.ones((n, n), bool)), s, -np.inf)
        e = np.exp(s - s.max(-1, keepdims=True))
        heads.append(e / e.sum(-1, keepdims=True) @ v)
    u = x + lin(ln(np.concatenate(heads, axis=-1), "self_attn.inner_attn_ln"), "self_attn.out_proj")
    return u + lin(ln(f(lin(ln(u, "final_layer_norm"), "ffn.fc1")), "ffn.ffn_layernorm"), "ffn.fc2")


def _check_gains(rng):
    # The gains of torchscale's Encoder/Decoder (subln) for a few depths, and their growth with depth.
    cases = [((12,), {}, np.sqrt(np.log(24))), ((6,), {"decoder_layers": 6, "part": "encoder"},
             np.sqrt(np.log(18) * np.log(12) / 3)), ((6,), {"decoder_layers": 6, "part": "decoder"}, np.sqrt(np.log(18))),
             ((1,), {}, np.sqrt(np.log(2))), ((100,), {}, np.sqrt(np.log(200)))]
    err = max(abs(magneto_gain(*a, **k) - v) for a, k, v in cases)
    gains = [magneto_gain(n) for n in (2, 6, 12, 24, 48, 96)]
    assert err < 1e-15 and all(a < b for a, b in zip(gains, gains[1:])), (err, gains)
    return err


def _variance_z(samples, var, kurtosis):
    """|sample variance - var| in standard errors: Var(s^2) = (mu4 - var^2)/n, mu4 = kurtosis var^2."""
    n = samples.size
    s2 = float(np.mean(samples * samples))  # the mean is 0 by construction of every scheme
    return abs(s2 - var) / (var * np.sqrt((kurtosis - 1.0) / n))


def _check_init_variances(rng):
    # Monte Carlo: the sample variance of every initialised weight matrix matches the stated
    # variance within 5 standard errors (fixed seed); kurtosis 3 (normal) or 9/5 (uniform).
    c, f, depth = 48, 96, 18
    gain = magneto_gain(depth)
    worst = 0.0
    for scheme in MAGNETO_INIT_SCHEMES:
        p = magneto_init(np.random.default_rng(1234), c, f, gain=gain, scheme=scheme)
        for name in (*_PROJ, "ffn.fc1", "ffn.fc2"):
            w = p[f"{name}.weight"]
            g = gain if name in MAGNETO_SCALED else 1.0
            n_in, n_out = w.shape
            if scheme == "paper":
                z = _variance_z(w, g * g * 2.0 / (n_in + n_out), 3.0)
            else:
                z = max(_variance_z(w, g * g / (3.0 * n_in), 1.8), _variance_z(p[f"{name}.bias"], g * g / (3.0 * n_in), 1.8))
            worst = max(worst, z)
    assert worst < 5.0, f"an initialised weight's variance is {worst:.2f} standard errors from the stated one"
    return worst


register(
    Mechanism(
        slug="magneto_subln_init", family="5-building-blocks", tier="T2",
        title="Magneto Sub-LayerNorm layer (LN before attention/FFN and before their output projections) "
              "and the DeepNet-derived gains",
        paper="Wang, Ma, Huang, Dong, Wang, Peng, Wu, Bajaj, Singhal, Benhaim, Patra, Liu, Chaudhary, Song, Wei, "
              "Magneto: A Foundation Transformer, ICML 2023, arXiv 2210.06423",
        forward=magneto_layer_forward, backward=magneto_layer_backward, sample=_sample, reference=_reference,
        docs="blocks/norms-activations-init.md#magneto-sub-ln-and-initialisation",
        checks={"gains": _check_gains, "init_variances": _check_init_variances},
    ),
)
