r"""Hyena operator: implicit long convolutions (FFT) with data-controlled gating, the full
`HyenaOperator` layer with its implicit `HyenaFilter`.

Poli, Massaroli, Nguyen, Fu, Dao, Baccus, Bengio, Ermon, Ré, "Hyena Hierarchy: Towards Larger
Convolutional Language Models", ICML 2023, arXiv 2302.10866. Upstream read (and run against this
module in float64): ``HazyResearch/safari src/models/sequence/hyena.py@02220c69d247e5473616cd053a443ad99fd2559b``
(``HyenaOperator``, ``HyenaFilter``, ``PositionalEmbedding``, ``ExponentialModulation``, ``Sin``,
``fftconv_ref``).

Forward
-------
For $u\in\mathbb R^{B\times L\times D}$ and order $N\ge 2$ (channels $C = (N+1)D$):

1. $p = uW_{in} + b_{in}$ (``in_proj``), then a causal depthwise short convolution of length $k$
   (``short_filter``, torch ``Conv1d(C, C, k, groups=C, padding=k-1)`` cut to the first $L$ steps):
   $\tilde p_{c,t} = b_c + \sum_{j=0}^{k-1} w_{c,j}\,p_{c,t-k+1+j}$.
2. Split the channels into $x^0,\dots,x^{N-1},v$ (blocks of $D$, in that order).
3. Implicit filters. Positional embedding ``z`` $(1, L_{max}, E)$ (trainable upstream, kept as a
   parameter), $t = \mathrm{linspace}(0,1,L_{max})$. The filter MLP with one shared sine frequency
   $f$ (upstream's single ``Sin`` module is reused after every inner layer):
   $a^0 = z W_0 + b_0$, $s^\ell = \sin(f\odot a^\ell)$, $a^{\ell+1} = s^\ell W_{\ell+1} + b_{\ell+1}$,
   $h = s^{last} W_{out}$ ($L\times D(N-1)$), then the exponential modulation
   $\hat h_{t,c} = h_{t,c}\,(e^{-t\,|\delta_c|} + \text{shift})$ with
   $\delta = \mathrm{linspace}(\log(\text{target})/\text{slow}, \log(\text{target})/\text{fast}, D(N-1))$.
   Filter channel $c = d\,(N-1) + o$ belongs to recurrence step $o$ and channel $d$ (upstream's
   ``'(v o)'`` layout); so does the filter bias (the skip weight) $D_{c}$.
4. Recurrence ($z^0 = v$; for $o = 0..N-2$ with gate $g_o = x^{N-1-o}$):
   $w^o = z^o\odot g_o$, $z^{o+1} = \hat h^o * w^o + D^o\odot w^o$, where $*$ is the causal
   convolution $(h*w)_t = \sum_{s=0}^{t} h_s w_{t-s}$ computed by FFT with zero padding to $2L$
   (``toeplitz_matvec_fft`` of `refattn.attention.linear.rpe_fft`, the lower-triangular Toeplitz
   matrix $T(h)$).
5. $y = (z^{N-1}\odot x^0) W_{out} + b_{out}$ (``out_proj``).

Backward
--------
Reverse order. ``out_proj``: linear VJP gives $dq$ for $q = z^{N-1}\odot x^0$, so
$dx^0 = dq\odot z^{N-1}$, $dz^{N-1} = dq\odot x^0$. Each step $z^{o+1} = T(h^o)w^o + D^o w^o$:
$dw^o = T(h^o)^\top dz^{o+1} + D^o dz^{o+1}$ ($T^\top$ is the Toeplitz matrix of the reversed
coefficients, the same FFT routine); $dh^o_m = \sum_{b,t} dz^{o+1}_{t}\,w^o_{t-m}$ (an FFT
cross-correlation, ``toeplitz_correlation_fft``); $dD^o = \sum_{b,t} dz^{o+1}\odot w^o$; then
$dz^o = dw^o\odot g_o$, $dg_o = dw^o\odot z^o$. Filter: $dh = d\hat h\odot(e^{-t|\delta|}+\text{shift})$;
$dW_{out} = s^\top dh$, $ds = dh\,W_{out}^\top$; through each sine,
$da = ds\odot f\cos(f\odot a)$ and $df \mathrel{+}= \sum_t ds\odot a\cos(f\odot a)$ (summed over every
use of the shared frequency); linear VJPs down to $dz_{[0,:L]} = da^0W_0^\top$ (zero for the
positions $L..L_{max}-1$ the forward does not use). Short convolution and ``in_proj``: the conv
and linear VJPs of `refattn.nn` (the gradient of the dropped last $k-1$ conv outputs is zero).

Conventions and scope
---------------------
Upstream defaults: ``order=2``, short filter length 3, ``modulate=True``, ``fast_decay_pct=0.3``,
``slow_decay_pct=1.5``, ``target=1e-2``, ``shift=0``, ``use_bias=True`` (``bias=False`` upstream
multiplies the skip weight by 0), activation identity, no dropout. Options upstream implements
only partly or not at all in this path are not offered: ``num_heads>1`` (the channel split breaks
for ``num_heads>1`` upstream), ``num_blocks>1``, ``inner_factor>1``, ``outer_mixing``,
``post_order_ffn``, ``normalized``, the fused FFT kernel (numerically the same convolution).
The sequence length must be at most ``L_max`` (the rows of ``z``). The positional embedding
(:func:`hyena_positional_embedding`) is $[t, \cos(f_b w), -\sin(f_b w)]$ with
$w = 2\pi\,\mathrm{arange}(L)/L$ and $f = \mathrm{linspace}(10^{-4}, \text{bands}-1, \text{bands})$.

Measured agreement with upstream (float64, CPU, safari's ``HyenaOperator`` run with its
training-framework imports stubbed, parameters copied across, ``t``/``deltas`` buffers set to the
float64 values, ``shift=0.05``, perturbed ``z`` and sine frequency): $D=4$, $L=L_{max}=16$,
filter width 8, batch 3. Order 2: output max abs error 5.6e-17 (rel 1.3e-16), all 17 gradients
(``u`` and every parameter) max rel error 1.0e-15. Order 3: output 2.8e-17 (rel 5.7e-17),
gradients max rel 5.0e-16. $L=11 < L_{max}=16$ (order 2): output rel 1.2e-16, gradients 8.5e-16.
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, check_int, check_positive, weight_shape_hint
from ...nn.conv import conv_apply, conv_vjp
from ...nn.linear import linear_prefixed, linear_prefixed_vjp
from ...registry import Mechanism, Sample, register
from ._samples import fd_max_rel
from .rpe_fft import toeplitz_correlation_fft, toeplitz_dense, toeplitz_matvec_fft

__all__ = [
    "hyena_positional_embedding",
    "hyena_modulation_deltas",
    "hyena_filter_forward",
    "hyena_filter_backward",
    "causal_fft_conv",
    "causal_fft_conv_vjp",
    "init_hyena_operator_params",
    "hyena_operator_forward",
    "hyena_operator_backward",
    "hyena_operator",
]

_FILTER = "filter_fn.implicit_filter"
_FREQ = f"{_FILTER}.1.freq"


def hyena_positional_embedding(l_max: int, emb_dim: int = 3) -> np.ndarray:
    r"""Upstream's initial ``filter_fn.pos_emb.z`` ``(1, l_max, emb_dim)``: $[t, \cos(f_bw), -\sin(f_bw)]$."""
    l_max = check_int(l_max, "l_max", minimum=1)
    emb_dim = check_int(emb_dim, "emb_dim", minimum=3)
    if emb_dim % 2 == 0:
        raise ValueError(f"emb_dim must be odd (time, cosines, sines), got {emb_dim}")
    bands = (emb_dim - 1) // 2
    t = np.linspace(0.0, 1.0, l_max)[:, None]
    w = 2 * np.pi * np.arange(l_max)[:, None] / l_max
    f = np.linspace(1e-4, bands - 1, bands)[None, :]
    return np.concatenate([t, np.cos(f * w), -np.sin(f * w)], axis=-1)[None]


def hyena_modulation_deltas(channels: int, *, fast_decay_pct: float = 0.3, slow_decay_pct: float = 1.5,
                            target: float = 1e-2) -> np.ndarray:
    r"""The decay rates $\delta$ of ``ExponentialModulation`` (``(channels,)``, float64)."""
    return np.linspace(np.log(target) / slow_decay_pct, np.log(target) / fast_decay_pct, channels)


def _mlp_layers(params) -> list[int]:
    """Indices of the implicit-filter linear layers with a bias (0, 2, 4, ...), in order."""
    idx, i = [], 0
    while f"{_FILTER}.{i}.weight" in params and f"{_FILTER}.{i}.bias" in params:
        idx.append(i)
        i += 2
    return idx


def hyena_filter_forward(params, L: int, *, modulate: bool = True, fast_decay_pct: float = 0.3,
                         slow_decay_pct: float = 1.5, target: float = 1e-2, shift: float = 0.0):
    r"""The modulated implicit filter $\hat h$ ``(L, C_f)`` of ``HyenaFilter.filter`` and a cache."""
    z = params["filter_fn.pos_emb.z"][0, :L]
    f = params[_FREQ]
    acts, x = [], z
    for i in _mlp_layers(params):
        a = linear_prefixed(params, f"{_FILTER}.{i}", x)
        acts.append((i, x, a))
        x = np.sin(f * a)
    last = 2 * len(acts)
    h = x @ params[f"{_FILTER}.{last}.weight"]
    t = np.linspace(0.0, 1.0, params["filter_fn.pos_emb.z"].shape[1])[:L, None]
    if modulate:
        deltas = hyena_modulation_deltas(h.shape[-1], fast_decay_pct=fast_decay_pct,
                                         slow_decay_pct=slow_decay_pct, target=target)
        scale = np.exp(-t * np.abs(deltas)) + shift
    else:
        scale = np.ones_like(h)
    return h * scale, {"acts": acts, "s_last": x, "last": last, "scale": scale, "L": L}


def hyena_filter_backward(dh_mod, params, cache) -> dict:
    """Gradients of :func:`hyena_filter_forward` w.r.t. every filter parameter (and ``pos_emb.z``)."""
    grads: dict = {}
    f = params[_FREQ]
    dh = dh_mod * cache["scale"]
    last = cache["last"]
    grads[f"{_FILTER}.{last}.weight"] = cache["s_last"].T @ dh
    ds = dh @ params[f"{_FILTER}.{last}.weight"].T
    dfreq = np.zeros_like(f)
    for i, x_in, a in reversed(cache["acts"]):
        c = np.cos(f * a)
        dfreq = dfreq + np.sum(ds * a * c, axis=0, keepdims=True)
        da = ds * f * c
        ds = linear_prefixed_vjp(grads, params, f"{_FILTER}.{i}", da, x_in)
    grads[_FREQ] = dfreq
    z = params["filter_fn.pos_emb.z"]
    dz = np.zeros_like(z)
    dz[0, :cache["L"]] = ds
    grads["filter_fn.pos_emb.z"] = dz
    return grads


def _causal_coeffs(h):
    """Toeplitz coefficients (..., 2L-1) of the lower-triangular $T(h)$, $T_{ij} = h_{i-j}$."""
    return np.concatenate([h[..., ::-1], np.zeros(h.shape[:-1] + (h.shape[-1] - 1,), h.dtype)], axis=-1)


def causal_fft_conv(h: np.ndarray, w: np.ndarray) -> np.ndarray:
    r"""Causal convolution $(h*w)_t = \sum_{s\le t}h_s w_{t-s}$ along the last axis, by FFT (zero
    padding to $2L$). ``h (C, L)`` per channel, ``w (B, C, L)``. Unvalidated."""
    return toeplitz_matvec_fft(_causal_coeffs(h), w[..., None])[..., 0]


def causal_fft_conv_vjp(dy: np.ndarray, h: np.ndarray, w: np.ndarray):
    """Gradients ``(dh (C, L), dw (B, C, L))`` of :func:`causal_fft_conv` for upstream ``dy``."""
    L = h.shape[-1]
    dw = toeplitz_matvec_fft(_causal_coeffs(h)[..., ::-1], dy[..., None])[..., 0]
    dc = toeplitz_correlation_fft(dy[..., None], w[..., None]).sum(axis=0)
    return dc[..., :L][..., ::-1], dw


def init_hyena_operator_params(rng, d_model: int, l_max: int, *, order: int = 2, filter_order: int = 64,
                               emb_dim: int = 3, num_inner_mlps: int = 2, short_filter_order: int = 3,
                               w: float = 1.0) -> dict:
    """Parameters with upstream's initialisation (PyTorch default Linear/Conv1d, ``randn`` filter
    bias, ``Sin`` frequency ``w``, the positional embedding of :func:`hyena_positional_embedding`)."""
    from ...nn.linear import init_linear_prefixed

    D, C, Cf = d_model, (order + 1) * d_model, d_model * (order - 1)
    p = {}
    p.update(init_linear_prefixed(rng, D, C, "in_proj"))
    b = 1.0 / np.sqrt(short_filter_order)
    p["short_filter.weight"] = rng.uniform(-b, b, (C, 1, short_filter_order))
    p["short_filter.bias"] = rng.uniform(-b, b, C)
    p["filter_fn.bias"] = rng.standard_normal(Cf)
    p["filter_fn.pos_emb.z"] = hyena_positional_embedding(l_max, emb_dim)
    p.update(init_linear_prefixed(rng, emb_dim, filter_order, f"{_FILTER}.0"))
    p[_FREQ] = w * np.ones((1, filter_order))
    for i in range(num_inner_mlps):
        p.update(init_linear_prefixed(rng, filter_order, filter_order, f"{_FILTER}.{2 * i + 2}"))
    p.update(init_linear_prefixed(rng, filter_order, Cf, f"{_FILTER}.{2 * num_inner_mlps + 2}", bias=False))
    p.update(init_linear_prefixed(rng, D, D, "out_proj"))
    return p


def _check_hyena_params(u, params, order):
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of arrays, got {type(params).__name__}")
    params = {key: as_float(val, key) for key, val in params.items()}
    D = u.shape[-1]
    C, Cf = (order + 1) * D, D * (order - 1)
    need = {"in_proj.weight": (D, C), "in_proj.bias": (C,), "short_filter.bias": (C,),
            "filter_fn.bias": (Cf,), "out_proj.weight": (D, D), "out_proj.bias": (D,)}
    for key in ("short_filter.weight", "filter_fn.pos_emb.z", _FREQ, f"{_FILTER}.0.weight"):
        if key not in params:
            raise ValueError(f"params is missing {key!r}")
    for key, shape in need.items():
        if key not in params:
            raise ValueError(f"params is missing {key!r} (expected shape {shape})")
        if tuple(np.shape(params[key])) != shape:
            raise ValueError(f"params[{key!r}] must have shape {shape} for d_model={D}, order={order}; "
                             f"got {tuple(np.shape(params[key]))}{weight_shape_hint(key, np.shape(params[key]), shape)}")
    sw = np.shape(params["short_filter.weight"])
    if len(sw) != 3 or sw[:2] != (C, 1):
        raise ValueError(f"params['short_filter.weight'] must have shape ({C}, 1, k); got {sw}")
    zs = np.shape(params["filter_fn.pos_emb.z"])
    if len(zs) != 3 or zs[0] != 1:
        raise ValueError(f"params['filter_fn.pos_emb.z'] must have shape (1, L_max, emb_dim); got {zs}")
    if u.shape[-2] > zs[1]:
        raise ValueError(f"u has sequence length {u.shape[-2]} > L_max={zs[1]} (rows of filter_fn.pos_emb.z)")
    layers = _mlp_layers(params)
    fs = np.shape(params[_FREQ])
    if len(fs) != 2 or fs[0] != 1:
        raise ValueError(f"params[{_FREQ!r}] must have shape (1, filter_order); got {fs}")
    width = fs[1]
    prev = zs[2]
    for i in layers:
        ws = np.shape(params[f"{_FILTER}.{i}.weight"])
        if ws != (prev, width) or np.shape(params[f"{_FILTER}.{i}.bias"]) != (width,):
            raise ValueError(f"params['{_FILTER}.{i}.weight'] must have shape ({prev}, {width}) (and its bias "
                             f"({width},)); got {ws}{weight_shape_hint('weight', ws, (prev, width))}")
        prev = width
    if np.shape(params[_FREQ]) != (1, width):
        raise ValueError(f"params[{_FREQ!r}] must have shape (1, filter_order); got {np.shape(params[_FREQ])}")
    last = f"{_FILTER}.{2 * len(layers)}.weight"
    if last not in params or np.shape(params[last]) != (width, Cf):
        raise ValueError(f"params[{last!r}] (the last filter layer, no bias) must have shape ({width}, {Cf}); "
                         f"got {np.shape(params.get(last))}{weight_shape_hint(last, np.shape(params.get(last)), (width, Cf))}")
    return params


def hyena_operator_forward(u, params, *, order: int = 2, modulate: bool = True, fast_decay_pct: float = 0.3,
                           slow_decay_pct: float = 1.5, target: float = 1e-2, shift: float = 0.0,
                           use_bias: bool = True):
    r"""Hyena operator (``HyenaOperator.forward`` of safari) on ``u (B, L, D)``; returns ``(y, cache)``.

    ``params``: ``in_proj.*``, ``short_filter.*`` (torch Conv1d layout ``(C, 1, k)``),
    ``filter_fn.bias``, ``filter_fn.pos_emb.z``, ``filter_fn.implicit_filter.{0,2,..}.weight/bias``,
    ``filter_fn.implicit_filter.1.freq`` (the one shared sine frequency) and the last bias-free
    filter layer, ``out_proj.*``; linear weights ``(in, out)`` (torch ``weight.T``). See
    :func:`init_hyena_operator_params`. Config as in the module docstring.
    """
    order = check_int(order, "order", minimum=2)
    check_positive(fast_decay_pct, "fast_decay_pct")
    check_positive(slow_decay_pct, "slow_decay_pct")
    check_positive(target, "target")
    u = as_float(u, "u", ndim=3)
    params = _check_hyena_params(u, params, order)
    dt = u.dtype
    p = {k: np.asarray(v, dtype=dt) for k, v in params.items()}
    B, L, D = u.shape
    pin = linear_prefixed(p, "in_proj", u)
    pT = np.swapaxes(pin, 1, 2)
    k = p["short_filter.weight"].shape[-1]
    C = pT.shape[1]
    uc = conv_apply(pT, p["short_filter.weight"], p["short_filter.bias"], padding=k - 1, groups=C)[..., :L]
    xs = [uc[:, i * D:(i + 1) * D] for i in range(order)]
    v = uc[:, order * D:]
    hm, fcache = hyena_filter_forward(p, L, modulate=modulate, fast_decay_pct=fast_decay_pct,
                                      slow_decay_pct=slow_decay_pct, target=target, shift=shift)
    hm = hm.astype(dt, copy=False)
    n1 = order - 1
    fb = p["filter_fn.bias"] if use_bias else np.zeros_like(p["filter_fn.bias"])
    steps = []
    zcur = v
    for o in range(n1):
        g = xs[order - 1 - o]
        w = zcur * g
        ho = hm[:, o::n1].T
        do = fb[o::n1][None, :, None]
        znext = causal_fft_conv(ho, w) + do * w
        steps.append((zcur, g, w, ho))
        zcur = znext
    q = np.swapaxes(zcur * xs[0], 1, 2)
    y = linear_prefixed(p, "out_proj", q)
    cache = {"p": p, "u": u, "pin": pin, "pT": pT, "uc": uc, "xs": xs, "steps": steps, "zlast": zcur, "q": q,
             "fcache": fcache, "fb": fb, "order": order, "use_bias": use_bias, "dtype": dt,
             "shape": y.shape}
    return y.astype(dt, copy=False), cache


def hyena_operator_backward(dout, cache) -> dict:
    """Gradients of :func:`hyena_operator_forward` w.r.t. ``u`` and every parameter."""
    dt = cache["dtype"]
    dout = as_dout(dout, cache["shape"], dt)
    p, order = cache["p"], cache["order"]
    n1 = order - 1
    D = cache["u"].shape[-1]
    grads: dict = {}
    dq = linear_prefixed_vjp(grads, p, "out_proj", dout, cache["q"])
    dq = np.swapaxes(dq, 1, 2)
    xs = cache["xs"]
    dxs = [None] * order
    dxs[0] = dq * cache["zlast"]
    dz = dq * xs[0]
    dh_mod = np.zeros(cache["fcache"]["scale"].shape, dtype=dt)
    dfb = np.zeros_like(p["filter_fn.bias"])
    fb = cache["fb"]
    for o in reversed(range(n1)):
        zcur, g, w, ho = cache["steps"][o]
        dho, dw = causal_fft_conv_vjp(dz, ho, w)
        dw = dw + fb[o::n1][None, :, None] * dz
        dh_mod[:, o::n1] = dho.T
        dfb[o::n1] = np.sum(dz * w, axis=(0, 2))
        dxs[order - 1 - o] = dw * zcur
        dz = dw * g
    if not cache["use_bias"]:
        dfb = np.zeros_like(dfb)
    grads.update(hyena_filter_backward(dh_mod, p, cache["fcache"]))
    grads["filter_fn.bias"] = dfb
    duc = np.concatenate(dxs + [dz], axis=1)
    k = p["short_filter.weight"].shape[-1]
    C = duc.shape[1]
    dfull = np.concatenate([duc, np.zeros(duc.shape[:2] + (k - 1,), dtype=dt)], axis=-1)
    cg = conv_vjp(dfull, cache["pT"], p["short_filter.weight"], padding=k - 1, groups=C)
    grads["short_filter.weight"] = cg["weight"]
    grads["short_filter.bias"] = cg["bias"]
    du = linear_prefixed_vjp(grads, p, "in_proj", np.swapaxes(cg["x"], 1, 2), cache["u"])
    del D
    out = {"u": du}
    out.update({key: np.asarray(val, dtype=dt) for key, val in grads.items()})
    return out


def hyena_operator(u, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`hyena_operator_forward`."""
    return hyena_operator_forward(u, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _hyena_reference(u, params, *, order=2, modulate=True, fast_decay_pct=0.3, slow_decay_pct=1.5,
                     target=1e-2, shift=0.0, use_bias=True):
    """Explicit form: the long convolutions as dense lower-triangular Toeplitz matrices, the short
    convolution as an explicit sum over taps, the filter MLP written out."""
    B, L, D = u.shape
    pin = u @ params["in_proj.weight"] + params["in_proj.bias"]
    w, kk = params["short_filter.weight"][:, 0], params["short_filter.weight"].shape[-1]
    uc = np.zeros_like(pin) + params["short_filter.bias"]
    for t in range(L):
        for j in range(kk):
            s = t - kk + 1 + j
            if s >= 0:
                uc[:, t] += w[:, j] * pin[:, s]
    uc = np.swapaxes(uc, 1, 2)
    x = params["filter_fn.pos_emb.z"][0, :L]
    f = params[_FREQ]
    for i in _mlp_layers(params):
        x = np.sin(f * (x @ params[f"{_FILTER}.{i}.weight"] + params[f"{_FILTER}.{i}.bias"]))
    h = x @ params[f"{_FILTER}.{2 * len(_mlp_layers(params))}.weight"]
    if modulate:
        t = np.linspace(0, 1, params["filter_fn.pos_emb.z"].shape[1])[:L, None]
        h = h * (np.exp(-t * np.abs(hyena_modulation_deltas(h.shape[1], fast_decay_pct=fast_decay_pct,
                                                             slow_decay_pct=slow_decay_pct, target=target))) + shift)
    n1 = order - 1
    zc = uc[:, order * D:]
    for o in range(n1):
        wv = zc * uc[:, (order - 1 - o) * D:(order - o) * D]
        T = np.tril(toeplitz_dense(_causal_coeffs(h[:, o::n1].T)))
        db = params["filter_fn.bias"][o::n1] if use_bias else 0 * params["filter_fn.bias"][o::n1]
        zc = np.einsum("dts,bds->bdt", T, wv) + db[None, :, None] * wv
    q = np.swapaxes(zc * uc[:, :D], 1, 2)
    return q @ params["out_proj.weight"] + params["out_proj.bias"]


def _sample_hyena(rng, size):
    D, L, width, order = (2, 5, 3, 2) if size == "tiny" else (4, 12, 8, int(rng.integers(2, 4)))
    l_max = L + int(rng.integers(0, 3))
    p = init_hyena_operator_params(rng, D, l_max, order=order, filter_order=width,
                                   num_inner_mlps=1 if size == "tiny" else 2)
    p["filter_fn.pos_emb.z"] = p["filter_fn.pos_emb.z"] + 0.1 * rng.standard_normal(p["filter_fn.pos_emb.z"].shape)
    p[_FREQ] = p[_FREQ] * rng.uniform(0.7, 1.3, p[_FREQ].shape)
    u = rng.standard_normal((2, L, D))
    return Sample(inputs={"u": u}, params=p, config={"order": order, "shift": float(rng.uniform(0.0, 0.2))})


def _check_causal_fft_conv_equals_direct(rng):
    B, C, L = 2, 3, 9
    h, w, dy = rng.standard_normal((C, L)), rng.standard_normal((B, C, L)), rng.standard_normal((B, C, L))
    direct = np.zeros((B, C, L))
    for t in range(L):
        for s in range(t + 1):
            direct[..., t] += h[:, s] * w[..., t - s]
    e1 = float(np.max(np.abs(causal_fft_conv(h, w) - direct)))
    dh, dw = causal_fft_conv_vjp(dy, h, w)
    dh_d = np.array([[np.sum(dy[:, c, m:] * w[:, c, :L - m]) for m in range(L)] for c in range(C)])
    dw_d = np.zeros_like(w)
    for s in range(L):
        dw_d[..., s] = np.sum(dy[..., s:] * h[None, :, :L - s], axis=-1)
    e2 = float(np.max(np.abs(dh - dh_d)))
    e3 = float(np.max(np.abs(dw - dw_d)))
    err = max(e1, e2, e3)
    assert err < 1e-12, (e1, e2, e3)
    return err


def _check_hyena_causality(rng):
    s = _sample_hyena(rng, "small")
    u = s.inputs["u"]
    y = hyena_operator(u, s.params, **s.config)
    u2 = u.copy()
    t0 = u.shape[1] // 2
    u2[:, t0:] += rng.standard_normal(u2[:, t0:].shape)
    y2 = hyena_operator(u2, s.params, **s.config)
    err = float(np.max(np.abs(y[:, :t0] - y2[:, :t0])))
    assert err < 1e-12 and np.max(np.abs(y[:, t0:] - y2[:, t0:])) > 1e-6, err
    return err


def _check_hyena_fd_variants(rng):
    errs = []
    for cfg in ({"order": 3, "modulate": False}, {"order": 2, "use_bias": False}):
        s = _sample_hyena(rng, "tiny")
        D, L = s.inputs["u"].shape[-1], s.inputs["u"].shape[1]
        p = init_hyena_operator_params(rng, D, L, order=cfg["order"], filter_order=2, num_inner_mlps=0)
        s = Sample(inputs={"u": s.inputs["u"][:, :4]}, params=p, config=cfg)
        errs.append(fd_max_rel(hyena_operator_forward, hyena_operator_backward, s))
    assert max(errs) < 1e-6, errs
    return max(errs)


register(
    Mechanism(
        slug="hyena_operator", family="4-linear-kernel-sparse", tier="T2",
        title="Hyena: implicit long convolutions with data-controlled gating",
        paper="Poli, Massaroli, Nguyen, Fu, Dao, Baccus, Bengio, Ermon, Ré, 'Hyena Hierarchy: Towards "
              "Larger Convolutional Language Models', ICML 2023, arXiv 2302.10866",
        official_code="HazyResearch/safari src/models/sequence/hyena.py@02220c69d247e5473616cd053a443ad99fd2559b",
        forward=hyena_operator_forward, backward=hyena_operator_backward, sample=_sample_hyena,
        reference=_hyena_reference,
        checks={"fft_conv_equals_direct_conv_and_grads": _check_causal_fft_conv_equals_direct,
                "causal_no_future_leakage": _check_hyena_causality,
                "gradcheck_variants": _check_hyena_fd_variants},
        docs="linear/long-convolutions-and-memory.md#hyena-operator",
    ),
)
