r"""Attentionless Transformer: a shallow feed-forward network over the whole padded sentence replaces attention.

Bozic, Dordevic, Coppola, Thommes, Singh, "Rethinking Attention: Exploring Shallow Feed-Forward
Neural Networks as an Alternative to Attention Layers in Transformers", AAAI 2024 (student
abstract), arXiv 2311.10642. Upstream: vulus98/Rethinking-attention
``models/definitions/ALR_FF.py`` (``FFNetwork_*``) and ``utils/full_sentence_utils.py``
(``AttentionSubstitute``, ``SublayerZeroSubstitute``) @ 983b8c79da8d5e807cdae01a746ab9aab52cd786.

Forward
-------
A sentence $X\in\mathbb R^{S\times d}$ with key-padding mask $m\in\{0,1\}^S$ is zero-padded to the
fixed length $n_{max}$ (``max_len``, upstream ``MAX_LEN`` = 50), flattened to
$v = \mathrm{vec}(X_{pad})\in\mathbb R^{n_{max}d}$ and masked, $\tilde m = m\otimes\mathbf 1_d$:

$$h = \mathrm{LeakyReLU}\big(\mathrm{LN}_0(v\odot\tilde m)W_1 + b_1\big),\qquad
o = \big(\mathrm{LN}_3(h)W_2 + b_2\big)\odot\tilde m,$$

and the output is $o$ reshaped to $(n_{max}, d)$ with the padding rows cut off. The hidden width
is $n_{max}d/k$ ($k$ = 256, 128, 8, 2 for upstream's XS, S, M, L; XL widens to $2n_{max}d$); it is
read from the weights. Parameter names are upstream's ``nn.ModuleList`` indices: ``layers.0``
(LayerNorm), ``layers.1`` (Linear), ``layers.3`` (LayerNorm), ``layers.4`` (Linear); index 2 is
the LeakyReLU (slope 0.01). The network is trained by distillation to mimic an attention layer's
outputs (a training recipe, not part of the layer). Upstream uses it in three places: in place
of the attention operation inside multi-head attention, applied to the projected values (ALR,
``AttentionSubstitute``), with a residual (ALRR), or in place of the whole attention sublayer
(ELR, ``SublayerZeroSubstitute``); this module is the shared substitute network with its
padding and masking, a token mixer that any refattn block can take as its ``attention``.

Backward
--------
$do = \tilde m\odot dy_{pad}$ (zero on padding rows); the second Linear and LN VJPs give $dh$;
$da = dh\odot\mathrm{LeakyReLU}'(a)$ (1 or 0.01); then the first Linear and LN VJPs and
$dv = \tilde m\odot d(v\odot\tilde m)$; $dX$ is $dv$ reshaped with the padding rows dropped. The
mask is fixed (no gradient). LeakyReLU has a kink at 0: the sampler keeps pre-activations away
from it.

Conventions
-----------
``max_len`` (50), ``negative_slope`` (0.01), LayerNorm ``eps`` 1e-5; ``mask`` (``(B, S)`` bool,
True = real token; default all True). Mask-free inputs longer than ``max_len`` are an error.

Agreement with upstream
-----------------------
``FFNetwork_M`` / ``FFNetwork_L`` from ``ALR_FF.py`` (``model_dimension`` 4, ``sentence_length``
6) with upstream's pad/mask/flatten/unpad steps from ``AttentionSubstitute`` transcribed into the
scratch script (they need the CUDA device and constants of the repository), float64, a sentence
of $S=4$ with one padded key, parameters perturbed from upstream's init: output and the
gradients of $X$ and every parameter agree to $4.2\times10^{-15}$ absolute ($2.3\times10^{-15}$
relative to the largest entry).
"""

from __future__ import annotations

import numpy as np

from .._checks import (
    as_bool_or_float_mask,
    as_dout,
    as_float,
    cast_all,
    check_int,
    check_params,
    check_positive,
    compute_dtype,
)
from ..nn.linear import linear_apply, linear_vjp
from ..registry import Mechanism, Sample, register
from .core import norm_backward, norm_forward, param_dim

__all__ = ["shallow_ffn_mixer_forward", "shallow_ffn_mixer_backward", "shallow_ffn_mixer"]


def shallow_ffn_mixer_forward(x, params, *, max_len: int = 50, mask=None, negative_slope: float = 0.01,
                              eps: float = 1e-5):
    r"""The shallow FF attention substitute (module docstring).

    Parameters
    ----------
    x : array (B, S, d)
    params : dict
        ``"layers.0.weight"/".bias" (n_max d,)``, ``"layers.1.weight" (n_max d, F)``, ``"layers.1.bias" (F,)``,
        ``"layers.3.weight"/".bias" (F,)``, ``"layers.4.weight" (F, n_max d)``, ``"layers.4.bias" (n_max d,)``.
    max_len : int
        $n_{max}$, the fixed padded length.
    mask : array (B, S) of bool, optional
        Key-padding mask, True for real tokens (default all True).
    negative_slope : float
        LeakyReLU slope.
    eps : float
        LayerNorm epsilon.

    Returns
    -------
    y, cache
        ``y`` of the shape of ``x``.
    """
    x = as_float(x, "x", min_ndim=3)
    if x.ndim != 3:
        raise ValueError(f"x must have shape (B, S, d); got {x.shape}")
    nmax = check_int(max_len, "max_len", minimum=1)
    slope = check_positive(negative_slope, "negative_slope", allow_zero=True)
    eps = check_positive(eps, "eps", allow_zero=True)
    b, s, d = x.shape
    if s > nmax:
        raise ValueError(f"x has S = {s} tokens, more than max_len = {nmax}")
    if mask is None:
        m = np.ones((b, s), dtype=bool)
    else:
        m = as_bool_or_float_mask(mask, "mask")
        if m.dtype != np.bool_ or m.shape != (b, s):
            raise ValueError(f"mask must be a bool array of shape (B, S) = {(b, s)}; got {m.dtype} {m.shape}")
    width = nmax * d
    hid = param_dim(params, "layers.1.weight", 1, where="shallow_ffn_mixer", shape=("n_max d", "F"))
    spec = {"layers.0.weight": (width,), "layers.0.bias": (width,), "layers.1.weight": (width, hid),
            "layers.1.bias": (hid,), "layers.3.weight": (hid,), "layers.3.bias": (hid,),
            "layers.4.weight": (hid, width), "layers.4.bias": (width,)}
    p = check_params(params, spec, where="shallow_ffn_mixer")
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    mpad = np.zeros((b, nmax), dtype=dt)
    mpad[:, :s] = m
    mt = np.repeat(mpad, d, axis=1)
    v = np.zeros((b, nmax, d), dtype=dt)
    v[:, :s] = x
    v = v.reshape(b, width) * mt
    n0, c0 = norm_forward(p, "layers.0", v, eps=eps)
    a = linear_apply(n0, p["layers.1.weight"], p["layers.1.bias"])
    h = np.where(a > 0, a, a.dtype.type(slope) * a)
    n3, c3 = norm_forward(p, "layers.3", h, eps=eps)
    o = linear_apply(n3, p["layers.4.weight"], p["layers.4.bias"]) * mt
    y = o.reshape(b, nmax, d)[:, :s].copy()
    cache = {"p": p, "mt": mt, "c0": c0, "n0": n0, "a": a, "c3": c3, "n3": n3, "slope": slope,
             "shape": x.shape, "nmax": nmax, "dtype": dt}
    return y, cache


def shallow_ffn_mixer_backward(dout, cache):
    r"""Gradients of `shallow_ffn_mixer_forward` for ``x`` and every params key (module docstring)."""
    g = as_dout(dout, cache["shape"], cache["dtype"])
    p, mt = cache["p"], cache["mt"]
    b, s, d = cache["shape"]
    nmax = cache["nmax"]
    gp = np.zeros((b, nmax, d), dtype=cache["dtype"])
    gp[:, :s] = g
    do = gp.reshape(b, nmax * d) * mt
    grads = {}
    l4 = linear_vjp(do, cache["n3"], p["layers.4.weight"])
    grads["layers.4.weight"], grads["layers.4.bias"] = l4["weight"], l4["bias"]
    dh = norm_backward(grads, p, l4["x"], cache["c3"])
    a = cache["a"]
    da = dh * np.where(a > 0, 1.0, cache["slope"]).astype(a.dtype)
    l1 = linear_vjp(da, cache["n0"], p["layers.1.weight"])
    grads["layers.1.weight"], grads["layers.1.bias"] = l1["weight"], l1["bias"]
    dv = norm_backward(grads, p, l1["x"], cache["c0"]) * mt
    grads["x"] = dv.reshape(b, nmax, d)[:, :s].copy()
    return grads


def shallow_ffn_mixer(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of `shallow_ffn_mixer_forward`."""
    return shallow_ffn_mixer_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _random_params(rng, width, hid):
    return {"layers.0.weight": 1 + 0.2 * rng.standard_normal(width), "layers.0.bias": 0.1 * rng.standard_normal(width),
            "layers.1.weight": rng.standard_normal((width, hid)) / np.sqrt(width),
            "layers.1.bias": 0.3 * rng.standard_normal(hid),
            "layers.3.weight": 1 + 0.2 * rng.standard_normal(hid), "layers.3.bias": 0.1 * rng.standard_normal(hid),
            "layers.4.weight": rng.standard_normal((hid, width)) / np.sqrt(hid),
            "layers.4.bias": 0.1 * rng.standard_normal(width)}


def _sample(rng, size):
    # Redraw until every LeakyReLU pre-activation is at least 0.02 away from its kink.
    s, d, nmax, hid = (2, 2, 3, 2) if size == "tiny" else (4, 3, 6, 5)
    for _ in range(200):
        x = rng.standard_normal((2, s, d))
        mask = np.ones((2, s), dtype=bool)
        mask[1, -1] = False
        p = _random_params(rng, nmax * d, hid)
        _, c = shallow_ffn_mixer_forward(x, p, max_len=nmax, mask=mask)
        if np.abs(c["a"]).min() > 0.02:
            break
    return Sample(inputs={"x": x}, params=p, config={"max_len": nmax, "mask": mask})


def _reference(x, params, max_len=50, mask=None, negative_slope=0.01, eps=1e-5):
    # Sentence by sentence: pad with zeros to max_len rows, flatten, mask, two LN-Linear layers.
    b, s, d = x.shape
    mask = np.ones((b, s), bool) if mask is None else mask
    out = np.empty_like(x)
    for i in range(b):
        keep = np.concatenate([mask[i], np.zeros(max_len - s, bool)]).repeat(d).astype(float)
        v = np.concatenate([x[i], np.zeros((max_len - s, d))]).ravel() * keep

        def ln(z, k):
            return (z - z.mean()) / np.sqrt(z.var() + eps) * params[f"layers.{k}.weight"] + params[f"layers.{k}.bias"]

        a = ln(v, 0) @ params["layers.1.weight"] + params["layers.1.bias"]
        h = np.maximum(a, 0) + negative_slope * np.minimum(a, 0)
        o = (ln(h, 3) @ params["layers.4.weight"] + params["layers.4.bias"]) * keep
        out[i] = o.reshape(max_len, d)[:s]
    return out


def _check_padding_invariance(rng):
    # A masked token's content never reaches any output, and masked outputs are zero; the output
    # of a real token does not depend on how many padding rows the caller passed.
    s = _sample(rng, "small")
    x, p, cfg = s.inputs["x"], s.params, s.config
    y = shallow_ffn_mixer(x, p, **cfg)
    x2 = x.copy()
    x2[1, -1] = 100.0 * rng.standard_normal(x.shape[-1])
    y2 = shallow_ffn_mixer(x2, p, **cfg)
    err = max(float(np.abs(y - y2).max()), float(np.abs(y[1, -1]).max()))
    y3 = shallow_ffn_mixer(x[1:, :-1], p, max_len=cfg["max_len"])
    err = max(err, float(np.abs(y3[0] - y[1, :-1]).max()))
    assert err < 1e-13, f"padding leaks into the outputs: {err}"
    return err


def _check_mixes_tokens(rng):
    # Unlike a token-wise FFN, every output token depends on every real input token (the
    # teaching contrast): perturbing token 0 moves the output of the last token.
    s = _sample(rng, "small")
    x = s.inputs["x"][:1]
    y = shallow_ffn_mixer(x, s.params, max_len=s.config["max_len"])
    x2 = x.copy()
    x2[0, 0] += 0.5
    y2 = shallow_ffn_mixer(x2, s.params, max_len=s.config["max_len"])
    moved = float(np.abs(y2[0, -1] - y[0, -1]).max())
    assert moved > 1e-6, f"the last token does not see the first: {moved}"
    return 0.0


register(
    Mechanism(
        slug="shallow_ffn_attention_replacement", family="5-building-blocks", tier="T2",
        official_code="vulus98/Rethinking-attention models/definitions/ALR_FF.py@983b8c7",
        title="Attentionless Transformer: a shallow LN-Linear-LeakyReLU-LN-Linear net over the padded, "
              "flattened sentence replaces attention",
        paper="Bozic, Dordevic, Coppola, Thommes, Singh, Rethinking Attention: Exploring Shallow Feed-Forward Neural "
              "Networks as an Alternative to Attention Layers in Transformers, AAAI 2024, arXiv 2311.10642",
        forward=shallow_ffn_mixer_forward, backward=shallow_ffn_mixer_backward, sample=_sample, reference=_reference,
        docs="blocks/residual-and-linear.md#shallow-feed-forward-attention-replacement",
        checks={"padding_invariance": _check_padding_invariance, "mixes_tokens": _check_mixes_tokens},
    ),
)
