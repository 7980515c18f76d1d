r"""AROMA: Perceiver encoder to latent tokens, local neural-field decoder by cross-attention.

Paper: Serrano, Wang, Naour, Vittaut, Gallinari, "AROMA: Preserving Spatial Structure for Latent
PDE Modeling with Local Neural Fields", NeurIPS 2024, arXiv 2406.02176. Upstream:
LouisSerrano/aroma @ 77ec74f27221f4ee1c2111a16800f4cfc1069414 ``aroma/encoder_decoder.py``
(``AROMAEncoderDecoderKL``, ``PerceiverEncoder``, ``PreNormCross``, ``CrossAttention``,
``PreNorm``, ``Attention``, ``MultiScaleAttention``, ``FeedForward``,
``DiagonalGaussianDistribution``, ``LocalityAwareINRDecoder``) and ``aroma/fourier_features.py``
(``NeRFEncoding``, ``MultiScaleNeRFEncoding``).

Which part of the model
-----------------------
AROMA is an encoder-decoder (this module) plus a conditional diffusion transformer that steps the
latent tokens in time (``aroma/DIT*.py``; an ordinary DiT, not implemented here). This module is the
whole encoder-decoder ``AROMAEncoderDecoderKL.forward``: the latent tokens are the mechanism.

Forward
-------
Points $x_j\in\mathbb R^d$ with values $u_j\in\mathbb R^C$ ($j\le N$), learned latents
$Z_0\in\mathbb R^{M\times D}$, query points $y_i$ ($i\le N_q$).

1. Fourier keys $\gamma(x) = [\sin(\omega\otimes x), \cos(\omega\otimes x)]$ with
   $\omega_f = \pi\,2^{fL/(F-1)}$ ($F$ = ``num_freq``, $L$ = ``max_pos_encoding_freq``; the
   product is frequency-major, coordinate-minor), values $v_j = u_jW_{lift} + b_{lift}$.
2. Cross-attention of the latents to the points (``PreNormCross``: three LayerNorms), residual and
   a GELU feed-forward:
   $Z_1 = Z_0 + \mathrm{CA}(\mathrm{LN}Z_0, \mathrm{LN}_k\gamma, \mathrm{LN}_v v)$,
   $Z_2 = Z_1 + \mathrm{FF}(\mathrm{LN}Z_1)$, with
   $\mathrm{CA}(a, k, v) = \mathrm{softmax}(aW_q(kW_k)^\top/\sqrt{d_h})\,vW_v\,W_o + b_o$ per head.
3. Processor: ``depth`` pre-norm self-attention + feed-forward blocks on the latents
   ($Z \leftarrow Z + \mathrm{SA}(\mathrm{LN}Z)$, $Z\leftarrow Z + \mathrm{FF}(\mathrm{LN}Z)$; keys
   and values from the normalised latents). Upstream builds them with ``cache_fn``, so every block
   is the **same** module: one set of weights ``encoder.layers.0.*``.
4. Bottleneck before processor block ``bottleneck_index`` (after the last when it equals ``depth``):
   $\mu = ZW_\mu + b_\mu$, $\ell = \mathrm{clamp}(ZW_\ell + b_\ell, -30, 20)$,
   $z = \mu + e^{\ell/2}\odot\varepsilon$ (``noise`` $\varepsilon$ given; ``noise=None`` is the
   posterior mode $z=\mu$), $Z \leftarrow zW_{lift\_z} + b_{lift\_z}$.
5. Decoder cross-attention (``MultiScaleAttention``): each query point gets $S$ = ``len(scales)``
   Fourier embeddings $\gamma_s(y)$ with bands $\pi\,2^{\mathrm{linspace}(s_{-}, s_+, F)}$ on the
   disjoint octave ranges $[0, s_1], [s_1, s_2], \dots$ (coordinate-major, frequency-minor); each
   of the $N_qS$ embeddings attends, after a LayerNorm, to the LayerNorm'ed latents:
   $h_{is} = \mathrm{CA}(\mathrm{LN}\gamma_s(y_i), \mathrm{LN}Z, \mathrm{LN}Z)\in\mathbb R^{F_m}$.
   The latents act as spatially anchored local fields: the frequency band of a query decides which
   latents it reads.
6. Local neural field: $[h_{i1}\|\dots\|h_{iS}]$ through a ReLU MLP (``decoder.mlp``) to $C$ outputs.

Backward
--------
Reverse mode through the chain, reusing the primitives' VJPs: the MLP (linear VJP and
$\mathbb 1[a>0]$), the softmax-attention core (``attention_core_backward``), LayerNorm
(``normalize_backward``) and the GELU feed-forward ($\bar a = \bar h\,\mathrm{GELU}'(a)$). The
residual branches add their gradients; the processor's self-attention receives the gradient of its
normalised input through the query and the key/value paths; the shared processor weights sum
their per-block gradients; the latents sum over the batch. Bottleneck:
$\bar\mu = \bar z$, $\bar\ell = \tfrac12\bar z\odot\varepsilon\odot e^{\ell/2}\odot
\mathbb 1[-30\le\ell_{raw}\le 20]$ (the clamp passes the gradient on its closed interval, as
``torch.clamp``), with the noise held fixed (the reparameterisation gradient); in mode
$\bar\ell = 0$. The Fourier features give the coordinate gradients
$\bar x_a = \sum_f\omega_f(\cos(\omega_fx_a)\bar s_{fa} - \sin(\omega_fx_a)\bar c_{fa})$.

Conventions made explicit
-------------------------
* ``mask`` (B, N), True = real point: upstream fills masked scores with ``-finfo.max``; refattn
  removes them (same result while a row keeps a real point).
* ``noise``: upstream draws ``torch.randn`` inside ``DiagonalGaussianDistribution.sample``; here it
  is an argument held fixed, so the layer is deterministic and the gradient is the
  reparameterisation gradient. The KL term of the training loss is not part of the layer.
* ``encode_geo=False``, ``include_pos_in_value=False``, ``decoder_ff=False`` (the upstream
  defaults of ``AROMAEncoderDecoderKL``) are the only variants implemented.
* Parameter names are the ``AROMAEncoderDecoderKL`` state-dict names (linear weights transposed);
  the state dict also lists ``encoder.layers.{l}.*`` for $l\ge1$ as aliases of ``layers.0``: pass
  only ``layers.0``. The encoding bands are buffers computed from the keywords, not parameters.

Measured agreement with the upstream module (float64, CPU; docs page): output <= 3.4e-16 absolute,
every gradient (parameters, values, coordinates, query coordinates) <= 5.4e-15 absolute and
<= 4.3e-15 relative to the compared array's largest entry, with and without a posterior sample,
for depth 0, 2, 3 and bottleneck positions 0, 1, last. (``norm_k.bias`` has an exactly zero
gradient: a shift shared by all keys adds a constant to each score row, which the softmax ignores;
both sides give round-off below 3e-17.)
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_int, check_params, compute_dtype
from ..attention.softmax import attention_core_backward, attention_core_forward
from ..nn.activations import gelu, gelu_grad
from ..nn.linear import init_linear_prefixed, linear_prefixed, linear_prefixed_vjp, merge_heads, split_heads
from ..nn.norms import normalize_backward, normalize_forward
from ..registry import Mechanism, Sample, register

__all__ = [
    "aroma_forward",
    "aroma_backward",
    "aroma",
    "aroma_init_params",
    "nerf_bands",
    "fourier_encode_forward",
    "fourier_encode_backward",
]

_EPS = 1e-5
_LOGVAR_CLAMP = (-30.0, 20.0)
_CA = "encoder.cross_attend_blocks"
_SA, _SF = "encoder.layers.0.0", "encoder.layers.0.1"
_DEC = "encoder.decoder_cross_attn"


def nerf_bands(num_freq: int, start: float, end: float, dtype=np.float64) -> np.ndarray:
    r"""AROMA's log-sampled bands $\pi\,2^{\mathrm{linspace}(start, end, F)}$ (``NeRFEncoding``
    with ``log_sampling=True, use_pi=True, base_freq=2``; one scale of ``MultiScaleNeRFEncoding``)."""
    return (np.pi * 2.0 ** np.linspace(start, end, num_freq)).astype(dtype)


def fourier_encode_forward(coords, bands, *, freq_major: bool = True):
    r"""$[\sin(\omega\otimes x), \cos(\omega\otimes x)]$ along the last axis.

    ``freq_major=True`` orders the products ``(F, d)`` as ``NeRFEncoding`` does
    (``coords[..., None, :] * bands[:, None]``); ``False`` orders them ``(d, F)`` as one scale of
    ``MultiScaleNeRFEncoding`` (``coords[..., None] * bands``). Returns ``(feats (..., 2 F d), cache)``.
    """
    w = coords[..., None, :] * bands[:, None] if freq_major else coords[..., :, None] * bands
    flat = w.reshape(w.shape[:-2] + (-1,))
    return np.concatenate([np.sin(flat), np.cos(flat)], axis=-1), (w, bands, freq_major)


def fourier_encode_backward(g, cache):
    """Coordinate gradient of :func:`fourier_encode_forward` (formula in the module docstring)."""
    w, bands, freq_major = cache
    n = g.shape[-1] // 2
    dw = (np.cos(w) * g[..., :n].reshape(w.shape) - np.sin(w) * g[..., n:].reshape(w.shape))
    return np.sum(dw * bands[:, None], axis=-2) if freq_major else np.sum(dw * bands, axis=-1)


def _acc(grads, key, g):
    grads[key] = grads[key] + g if key in grads else g


def _ln(p, prefix, x):
    xhat, stats = normalize_forward(x, (x.ndim - 1,), _EPS)
    return xhat * p[f"{prefix}.weight"] + p[f"{prefix}.bias"], (prefix, xhat, stats)


def _ln_back(grads, p, dy, c):
    prefix, xhat, stats = c
    ax = tuple(range(dy.ndim - 1))
    _acc(grads, f"{prefix}.weight", np.sum(dy * xhat, axis=ax))
    _acc(grads, f"{prefix}.bias", np.sum(dy, axis=ax))
    return normalize_backward(dy * p[f"{prefix}.weight"], xhat, stats)


def _mha(p, prefix, xq, xk, xv, heads, mask=None):
    """Multi-head attention on token-major (B, T, .) operands; fused ``to_kv`` when ``xk is xv``
    and the params hold it, else ``to_k``/``to_v``."""
    fused = f"{prefix}.to_kv.weight" in p
    q = xq @ p[f"{prefix}.to_q.weight"]
    inner = q.shape[-1]
    if fused:
        kv = xk @ p[f"{prefix}.to_kv.weight"]
        k, v = kv[..., :inner], kv[..., inner:]
    else:
        k, v = xk @ p[f"{prefix}.to_k.weight"], xv @ p[f"{prefix}.to_v.weight"]
    am = None if mask is None else mask[:, None, None, :]
    o, ac = attention_core_forward(split_heads(q, heads), split_heads(k, heads), split_heads(v, heads),
                                   attn_mask=am)
    om = merge_heads(o)
    return linear_prefixed(p, f"{prefix}.to_out", om), (prefix, xq, xk, xv, ac, om, heads, fused)


def _mha_back(grads, p, dy, c):
    prefix, xq, xk, xv, ac, om, heads, fused = c
    dom = linear_prefixed_vjp(grads, p, f"{prefix}.to_out", dy, om)
    g = attention_core_backward(split_heads(dom, heads), ac)
    dq, dk, dv = merge_heads(g["q"]), merge_heads(g["k"]), merge_heads(g["v"])
    _acc(grads, f"{prefix}.to_q.weight", np.einsum("bni,bno->io", xq, dq))
    dxq = dq @ p[f"{prefix}.to_q.weight"].T
    if fused:
        dkv = np.concatenate([dk, dv], -1)
        _acc(grads, f"{prefix}.to_kv.weight", np.einsum("bni,bno->io", xk, dkv))
        dctx = dkv @ p[f"{prefix}.to_kv.weight"].T
        return dxq, dctx, None
    _acc(grads, f"{prefix}.to_k.weight", np.einsum("bni,bno->io", xk, dk))
    _acc(grads, f"{prefix}.to_v.weight", np.einsum("bni,bno->io", xv, dv))
    return dxq, dk @ p[f"{prefix}.to_k.weight"].T, dv @ p[f"{prefix}.to_v.weight"].T


def _ff(p, prefix, x):
    a = linear_prefixed(p, f"{prefix}.net.0", x)
    h = gelu(a)
    return linear_prefixed(p, f"{prefix}.net.2", h), (prefix, x, a, h)


def _ff_back(grads, p, dy, c):
    prefix, x, a, h = c
    dh = linear_prefixed_vjp(grads, p, f"{prefix}.net.2", dy, h)
    return linear_prefixed_vjp(grads, p, f"{prefix}.net.0", dh * gelu_grad(a), x)


def _spec(d_coord, c, m, d, k_dim, q_dim, s, i_c, i_l, f_ff, f_sa, lat, f_m, inr):
    sp = {"encoder.latents": (m, d), "encoder.lift_values.weight": (c, d), "encoder.lift_values.bias": (d,)}
    for pre, n in ((f"{_CA}.0.norm", d), (f"{_CA}.0.norm_k", k_dim), (f"{_CA}.0.norm_v", d),
                   (f"{_CA}.1.norm", d), (f"{_DEC}.norm", q_dim), (f"{_DEC}.norm_context", d)):
        sp.update({f"{pre}.weight": (n,), f"{pre}.bias": (n,)})
    sp.update({f"{_CA}.0.fn.to_q.weight": (d, i_c), f"{_CA}.0.fn.to_k.weight": (k_dim, i_c),
               f"{_CA}.0.fn.to_v.weight": (d, i_c), f"{_CA}.0.fn.to_out.weight": (i_c, d),
               f"{_CA}.0.fn.to_out.bias": (d,),
               f"{_CA}.1.fn.net.0.weight": (d, f_ff), f"{_CA}.1.fn.net.0.bias": (f_ff,),
               f"{_CA}.1.fn.net.2.weight": (f_ff, d), f"{_CA}.1.fn.net.2.bias": (d,)})
    for pre, n_in, n_out in (("encoder.mean_fc", d, lat), ("encoder.logvar_fc", d, lat), ("encoder.lift_z", lat, d)):
        sp.update({f"{pre}.weight": (n_in, n_out), f"{pre}.bias": (n_out,)})
    if f_sa is not None:
        sp.update({f"{_SA}.norm.weight": (d,), f"{_SA}.norm.bias": (d,), f"{_SF}.norm.weight": (d,),
                   f"{_SF}.norm.bias": (d,), f"{_SA}.fn.to_q.weight": (d, i_l),
                   f"{_SA}.fn.to_kv.weight": (d, 2 * i_l), f"{_SA}.fn.to_out.weight": (i_l, d),
                   f"{_SA}.fn.to_out.bias": (d,), f"{_SF}.fn.net.0.weight": (d, f_sa),
                   f"{_SF}.fn.net.0.bias": (f_sa,), f"{_SF}.fn.net.2.weight": (f_sa, d),
                   f"{_SF}.fn.net.2.bias": (d,)})
    sp.update({f"{_DEC}.fn.to_q.weight": (q_dim, i_c), f"{_DEC}.fn.to_kv.weight": (d, 2 * i_c),
               f"{_DEC}.fn.to_out.weight": (i_c, f_m), f"{_DEC}.fn.to_out.bias": (f_m,)})
    widths = [s * f_m] + inr + [c]
    for j in range(len(widths) - 1):
        sp.update({f"decoder.mlp.{2 * j}.weight": (widths[j], widths[j + 1]),
                   f"decoder.mlp.{2 * j}.bias": (widths[j + 1],)})
    return sp


def _width(params, key, axis):
    a = params.get(key) if isinstance(params, dict) else None
    if a is None or np.ndim(a) != 2:
        raise ValueError(f"params must contain {key!r} as a 2-d weight")
    return np.shape(a)[axis]


def aroma_forward(images, coords, target_coords, params, *, depth: int = 3, bottleneck_index: int = 0,
                  num_freq: int = 12, max_pos_encoding_freq: float = 4, scales=(3, 4, 5),
                  cross_heads: int = 8, latent_heads: int = 12, noise=None, mask=None):
    r"""AROMA encoder-decoder (``AROMAEncoderDecoderKL.forward``; see the module docstring).

    Parameters
    ----------
    images : array (B, N, C)
        Function values at the input points (upstream ``images``).
    coords : array (B, N, d)
        Input point coordinates.
    target_coords : array (B, N_q, d)
        Query coordinates (upstream ``target_coords``; pass ``coords`` to reconstruct the input).
    params : dict
        ``AROMAEncoderDecoderKL`` state-dict names, linear weights ``(in, out)``: ``encoder.latents``
        (M, D); ``encoder.lift_values.*`` (C -> D); ``encoder.cross_attend_blocks.0.{norm,norm_k,
        norm_v}.*`` and ``.0.fn.{to_q,to_k,to_v}.weight``, ``.0.fn.to_out.*``;
        ``encoder.cross_attend_blocks.1.{norm.*, fn.net.0.*, fn.net.2.*}``;
        ``encoder.{mean_fc,logvar_fc,lift_z}.*``; (``depth > 0``) ``encoder.layers.0.0.{norm.*,
        fn.to_q.weight, fn.to_kv.weight, fn.to_out.*}`` and ``encoder.layers.0.1.{norm.*,
        fn.net.0.*, fn.net.2.*}``; ``encoder.decoder_cross_attn.{norm,norm_context}.*``,
        ``.fn.to_q.weight``, ``.fn.to_kv.weight``, ``.fn.to_out.*``; ``decoder.mlp.{0,2,..}.*``.
    depth, bottleneck_index : int
        Processor blocks (upstream ``num_self_attentions``, 3) and the bottleneck position (0).
    num_freq, max_pos_encoding_freq, scales
        Fourier settings (upstream 12, 4, [3, 4, 5]).
    cross_heads, latent_heads : int
        Heads of the encoder/decoder cross-attention and of the processor (upstream 8, 12).
    noise : array (B, M, latent_dim), optional
        $\varepsilon$ of the posterior sample, held fixed; ``None`` = posterior mode.
    mask : bool array (B, N), optional
        True = real input point.

    Returns
    -------
    out (B, N_q, C), cache
    """
    images = as_float(images, "images", ndim=3)
    coords = as_float(coords, "coords", ndim=3)
    target_coords = as_float(target_coords, "target_coords", ndim=3)
    b, n, c = images.shape
    if coords.shape[:2] != (b, n):
        raise ValueError(f"coords must have shape (B={b}, N={n}, d) like images; got {coords.shape}")
    dc = coords.shape[2]
    if target_coords.shape[0] != b or target_coords.shape[2] != dc:
        raise ValueError(f"target_coords must have shape (B={b}, N_q, d={dc}); got {target_coords.shape}")
    depth = check_int(depth, "depth", minimum=0)
    bottleneck_index = check_int(bottleneck_index, "bottleneck_index", minimum=0)
    if bottleneck_index > depth:
        raise ValueError(f"bottleneck_index must be in [0, depth={depth}]; got {bottleneck_index}")
    num_freq = check_int(num_freq, "num_freq", minimum=2)
    scales = [float(s) for s in np.atleast_1d(scales)]
    if not scales or any(s <= 0 for s in scales) or any(a >= b_ for a, b_ in zip(scales, scales[1:])):
        raise ValueError(f"scales must be a non-empty increasing sequence of positive numbers; got {scales}")
    heads = {"cross_heads": check_int(cross_heads, "cross_heads", minimum=1),
             "latent_heads": check_int(latent_heads, "latent_heads", minimum=1)}
    m, d = _width(params, "encoder.latents", 0), _width(params, "encoder.latents", 1)
    i_c = _width(params, f"{_CA}.0.fn.to_q.weight", 1)
    lat = _width(params, "encoder.mean_fc.weight", 1)
    f_m = _width(params, f"{_DEC}.fn.to_out.weight", 1)
    f_ff = _width(params, f"{_CA}.1.fn.net.0.weight", 1)
    i_l = _width(params, f"{_SA}.fn.to_q.weight", 1) if depth else None
    f_sa = _width(params, f"{_SF}.fn.net.0.weight", 1) if depth else None
    inr, j = [], 0
    while f"decoder.mlp.{2 * j + 2}.weight" in params:
        inr.append(_width(params, f"decoder.mlp.{2 * j}.weight", 1))
        j += 1
    k_dim, q_dim = 2 * num_freq * dc, 2 * num_freq * dc
    for key, inner, h in (("cross_heads", i_c, heads["cross_heads"]),
                          ("latent_heads", i_l, heads["latent_heads"])):
        if inner is not None and inner % h:
            raise ValueError(f"attention inner width {inner} must be divisible by {key}={h}")
    p = check_params(params, _spec(dc, c, m, d, k_dim, q_dim, len(scales), i_c, i_l, f_ff, f_sa, lat, f_m, inr))
    if noise is not None:
        noise = as_float(noise, "noise", ndim=3)
        if noise.shape != (b, m, lat):
            raise ValueError(f"noise must have shape (B={b}, M={m}, latent_dim={lat}); got {noise.shape}")
    if mask is not None:
        mask = np.asarray(mask)
        if mask.dtype != np.bool_:
            raise TypeError(f"mask must be a boolean array (True = real point); got dtype {mask.dtype}")
        if mask.shape != (b, n):
            raise ValueError(f"mask must have shape (B={b}, N={n}); got {mask.shape}")
        if not mask.any(axis=1).all():
            raise ValueError("mask must keep at least one input point per batch element")
    dt = compute_dtype(images, coords, target_coords, *p.values())
    images, coords, target_coords = (a.astype(dt, copy=False) for a in (images, coords, target_coords))
    p = cast_all(dt, p)
    noise = None if noise is None else noise.astype(dt, copy=False)

    cache = {"p": p, "dt": dt, "depth": depth, "bi": bottleneck_index, "noise": noise}
    kf, cache["kenc"] = fourier_encode_forward(coords, nerf_bands(num_freq, 0.0, max_pos_encoding_freq, dt))
    v = linear_prefixed(p, "encoder.lift_values", images)
    cache["images"] = images
    z0 = np.broadcast_to(p["encoder.latents"], (b, m, d))
    lq, cache["ln_q"] = _ln(p, f"{_CA}.0.norm", z0)
    lk, cache["ln_k"] = _ln(p, f"{_CA}.0.norm_k", kf)
    lv, cache["ln_v"] = _ln(p, f"{_CA}.0.norm_v", v)
    a, cache["ca"] = _mha(p, f"{_CA}.0.fn", lq, lk, lv, heads["cross_heads"], mask)
    z = z0 + a
    ln, cache["ln_f"] = _ln(p, f"{_CA}.1.norm", z)
    f, cache["ff"] = _ff(p, f"{_CA}.1.fn", ln)
    z = z + f
    blocks = []
    for idx in range(depth + 1):
        if idx == bottleneck_index:
            mu = linear_prefixed(p, "encoder.mean_fc", z)
            raw = linear_prefixed(p, "encoder.logvar_fc", z)
            lo, hi = _LOGVAR_CLAMP
            std = np.exp(0.5 * np.clip(raw, lo, hi))
            zz = mu if noise is None else mu + std * noise
            cache["bneck"] = (z, zz, std, (raw >= lo) & (raw <= hi))
            z = linear_prefixed(p, "encoder.lift_z", zz)
        if idx == depth:
            break
        bc = {}
        ln, bc["ln1"] = _ln(p, f"{_SA}.norm", z)
        a, bc["sa"] = _mha(p, f"{_SA}.fn", ln, ln, ln, heads["latent_heads"])
        z = z + a
        ln, bc["ln2"] = _ln(p, f"{_SF}.norm", z)
        f, bc["ff"] = _ff(p, f"{_SF}.fn", ln)
        z = z + f
        blocks.append(bc)
    cache["blocks"] = blocks
    nq = target_coords.shape[1]
    edges = [0.0] + scales
    qs, cache["qenc"] = [], []
    for lo_, hi_ in zip(edges, edges[1:]):
        qf, qc = fourier_encode_forward(target_coords, nerf_bands(num_freq, lo_, hi_, dt), freq_major=False)
        qs.append(qf)
        cache["qenc"].append(qc)
    qtok = np.stack(qs, axis=-2).reshape(b, nq * len(scales), q_dim)
    lq, cache["dln_q"] = _ln(p, f"{_DEC}.norm", qtok)
    lc, cache["dln_c"] = _ln(p, f"{_DEC}.norm_context", z)
    h, cache["dca"] = _mha(p, f"{_DEC}.fn", lq, lc, lc, heads["cross_heads"])
    x = h.reshape(b, nq, len(scales) * f_m)
    acts = []
    n_lin = len(inr) + 1
    for j in range(n_lin):
        y = linear_prefixed(p, f"decoder.mlp.{2 * j}", x)
        acts.append((x, y))
        x = np.maximum(y, 0.0) if j < n_lin - 1 else y
    cache.update(acts=acts, hshape=h.shape, S=len(scales), out_shape=x.shape)
    return x, cache


def aroma_backward(dout, cache):
    """Gradients of :func:`aroma_forward`: ``images``, ``coords``, ``target_coords`` and every params key."""
    p, dt = cache["p"], cache["dt"]
    g = as_dout(dout, cache["out_shape"], dt)
    grads = {}
    acts = cache["acts"]
    for j in reversed(range(len(acts))):
        x, y = acts[j]
        if j < len(acts) - 1:
            g = g * (y > 0)
        g = linear_prefixed_vjp(grads, p, f"decoder.mlp.{2 * j}", g, x)
    dh = g.reshape(cache["hshape"])
    dlq, dlc, _ = _mha_back(grads, p, dh, cache["dca"])
    dqtok = _ln_back(grads, p, dlq, cache["dln_q"])
    dz = _ln_back(grads, p, dlc, cache["dln_c"])
    b, nq = cache["out_shape"][:2]
    dqs = dqtok.reshape(b, nq, cache["S"], -1)
    dtarget = sum(fourier_encode_backward(dqs[:, :, s], qc) for s, qc in enumerate(cache["qenc"]))
    depth, bi = cache["depth"], cache["bi"]
    for idx in reversed(range(depth + 1)):
        if idx < depth:
            bc = cache["blocks"][idx]
            dln = _ff_back(grads, p, dz, bc["ff"])
            dz = dz + _ln_back(grads, p, dln, bc["ln2"])
            dq_in, dctx, _ = _mha_back(grads, p, dz, bc["sa"])
            dz = dz + _ln_back(grads, p, dq_in + dctx, bc["ln1"])
        if idx == bi:
            zin, zz, std, inside = cache["bneck"]
            dzz = linear_prefixed_vjp(grads, p, "encoder.lift_z", dz, zz)
            dz = linear_prefixed_vjp(grads, p, "encoder.mean_fc", dzz, zin)
            noise = cache["noise"]
            dl = np.zeros_like(dzz) if noise is None else 0.5 * dzz * noise * std * inside
            dz = dz + linear_prefixed_vjp(grads, p, "encoder.logvar_fc", dl, zin)
    dln = _ff_back(grads, p, dz, cache["ff"])
    dz = dz + _ln_back(grads, p, dln, cache["ln_f"])
    dlq, dlk, dlv = _mha_back(grads, p, dz, cache["ca"])
    dz0 = dz + _ln_back(grads, p, dlq, cache["ln_q"])
    grads["encoder.latents"] = dz0.sum(axis=0)
    dkf = _ln_back(grads, p, dlk, cache["ln_k"])
    dv = _ln_back(grads, p, dlv, cache["ln_v"])
    grads["images"] = linear_prefixed_vjp(grads, p, "encoder.lift_values", dv, cache["images"])
    grads["coords"] = fourier_encode_backward(dkf, cache["kenc"])
    grads["target_coords"] = dtarget
    return grads


def aroma(images, coords, target_coords, params, **config):
    """Convenience wrapper: the output of :func:`aroma_forward`."""
    return aroma_forward(images, coords, target_coords, params, **config)[0]


def aroma_init_params(rng, *, num_channels: int = 1, input_dim: int = 2, hidden_dim: int = 64,
                      dim: int = 64, num_latents: int = 16, latent_dim: int = 8, latent_heads: int = 12,
                      latent_dim_head: int = 64, cross_heads: int = 8, cross_dim_head: int = 64,
                      scales=(3, 4, 5), mlp_feature_dim: int = 16, depth_inr: int = 3, num_freq: int = 12,
                      depth: int = 3, ff_mult: int = 4, dtype=np.float64) -> dict:
    """Parameters under the upstream names and defaults (``AROMAEncoderDecoderKL``): latents
    $\\mathcal N(0, 1)$, PyTorch-default linears, LayerNorms weight 1 / bias 0; ``ff_mult`` is
    upstream's fixed ``FeedForward`` multiplier 4 (smaller for tests)."""
    d, kq = hidden_dim, 2 * num_freq * input_dim
    ic, il = cross_heads * cross_dim_head, latent_heads * latent_dim_head
    p = {"encoder.latents": rng.standard_normal((num_latents, d))}

    def lin(n_in, n_out, key, bias=True):
        p.update(init_linear_prefixed(rng, n_in, n_out, key, bias))

    def ln(key, n):
        p.update({f"{key}.weight": np.ones(n), f"{key}.bias": np.zeros(n)})

    lin(num_channels, d, "encoder.lift_values")
    ln(f"{_CA}.0.norm", d), ln(f"{_CA}.0.norm_k", kq), ln(f"{_CA}.0.norm_v", d), ln(f"{_CA}.1.norm", d)
    lin(d, ic, f"{_CA}.0.fn.to_q", False), lin(kq, ic, f"{_CA}.0.fn.to_k", False)
    lin(d, ic, f"{_CA}.0.fn.to_v", False), lin(ic, d, f"{_CA}.0.fn.to_out")
    lin(d, d * ff_mult, f"{_CA}.1.fn.net.0"), lin(d * ff_mult, d, f"{_CA}.1.fn.net.2")
    if depth:
        ln(f"{_SA}.norm", d), ln(f"{_SF}.norm", d)
        lin(d, il, f"{_SA}.fn.to_q", False), lin(d, 2 * il, f"{_SA}.fn.to_kv", False)
        lin(il, d, f"{_SA}.fn.to_out")
        lin(d, d * ff_mult, f"{_SF}.fn.net.0"), lin(d * ff_mult, d, f"{_SF}.fn.net.2")
    ln(f"{_DEC}.norm", kq), ln(f"{_DEC}.norm_context", d)
    lin(kq, ic, f"{_DEC}.fn.to_q", False), lin(d, 2 * ic, f"{_DEC}.fn.to_kv", False)
    lin(ic, mlp_feature_dim, f"{_DEC}.fn.to_out")
    lin(d, latent_dim, "encoder.mean_fc"), lin(d, latent_dim, "encoder.logvar_fc")
    lin(latent_dim, d, "encoder.lift_z")
    widths = [mlp_feature_dim * len(scales)] + [dim] * depth_inr + [num_channels]
    for j in range(len(widths) - 1):
        lin(widths[j], widths[j + 1], f"decoder.mlp.{2 * j}")
    return {k: np.asarray(v, dtype=dtype) for k, v in p.items()}


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _perturb(rng, p):
    return {k: v + 0.3 * rng.standard_normal(v.shape) if k.endswith(("norm.weight", "bias", "norm_k.weight",
                                                                      "norm_v.weight", "norm_context.weight"))
            else v * 1.5 for k, v in p.items()}


def _sample(rng, size, depth=1, bottleneck_index=0, with_noise=True):
    if size == "tiny":
        n, nq, c, dc, f, sc, kw = int(rng.integers(2, 4)), 2, 1, 1, 2, (1, 2), dict(
            hidden_dim=2, dim=2, num_latents=2, latent_dim=1, latent_heads=1, latent_dim_head=2,
            cross_heads=1, cross_dim_head=2, mlp_feature_dim=1, depth_inr=1, ff_mult=1)
    else:
        n, nq, c, dc, f, sc, kw = int(rng.integers(6, 10)), 5, 2, 2, 2, (1, 2, 3), dict(
            hidden_dim=4, dim=4, num_latents=3, latent_dim=2, latent_heads=2, latent_dim_head=2,
            cross_heads=2, cross_dim_head=2, mlp_feature_dim=2, depth_inr=2, ff_mult=2)
    p = _perturb(rng, aroma_init_params(rng, num_channels=c, input_dim=dc, scales=sc, num_freq=f,
                                        depth=depth, **kw))
    b, m, lat = 2, kw["num_latents"], kw["latent_dim"]
    cfg = {"depth": depth, "bottleneck_index": bottleneck_index, "num_freq": f, "max_pos_encoding_freq": 1.5,
           "scales": sc, "cross_heads": kw["cross_heads"], "latent_heads": kw["latent_heads"]}
    if with_noise:
        cfg["noise"] = rng.standard_normal((b, m, lat))
    return Sample(inputs={"images": rng.standard_normal((b, n, c)), "coords": rng.random((b, n, dc)),
                          "target_coords": rng.random((b, nq, dc))}, params=p, config=cfg)


def _check_variants_fd(rng):
    # Posterior mode (logvar_fc gets a zero gradient), two shared processor blocks with the
    # bottleneck after the last, and a masked input point, in one finite-difference run.
    from ..testing.gradcheck import gradcheck
    s = _sample(rng, "tiny", depth=2, bottleneck_index=2, with_noise=False)
    mk = np.ones(s.inputs["images"].shape[:2], bool)
    mk[1, 0] = False
    s.config["mask"] = mk
    worst = gradcheck(aroma_forward, aroma_backward, s).max_rel
    out, cache = aroma_forward(**s.inputs, params=s.params, **s.config)
    g = aroma_backward(np.ones(out.shape), cache)
    assert not np.any(g["encoder.logvar_fc.weight"]), "posterior mode must not depend on logvar_fc"
    return worst


def _check_input_permutation_invariance(rng):
    s = _sample(rng, "small")
    out = aroma(**s.inputs, params=s.params, **s.config)
    perm = rng.permutation(s.inputs["images"].shape[1])
    out_p = aroma(s.inputs["images"][:, perm], s.inputs["coords"][:, perm], s.inputs["target_coords"],
                  s.params, **s.config)
    err = float(np.abs(out_p - out).max())
    assert err < 1e-12, f"output depends on the order of the input points: {err}"
    return err


def _check_query_pointwise(rng):
    # The local neural field is evaluated pointwise: one query's output ignores the other queries.
    s = _sample(rng, "small")
    out = aroma(**s.inputs, params=s.params, **s.config)
    one = aroma(s.inputs["images"], s.inputs["coords"], s.inputs["target_coords"][:, 2:3], s.params, **s.config)
    err = float(np.abs(one - out[:, 2:3]).max())
    assert err < 1e-12, f"a query's output depends on the other queries: {err}"
    return err


def _check_mask(rng):
    s = _sample(rng, "small")
    im, co = s.inputs["images"], s.inputs["coords"]
    pad_i = np.concatenate([im, 5 * rng.standard_normal((2, 3, im.shape[2]))], axis=1)
    pad_c = np.concatenate([co, rng.random((2, 3, co.shape[2]))], axis=1)
    mk = np.ones(pad_i.shape[:2], bool)
    mk[:, -3:] = False
    a = aroma(pad_i, pad_c, s.inputs["target_coords"], s.params, **s.config, mask=mk)
    b = aroma(**s.inputs, params=s.params, **s.config)
    err = float(np.abs(a - b).max())
    assert err < 1e-12, f"masked padding changes the output: {err}"
    return err


def _check_uniform_refinement(rng):
    # The encoder reads the input function through a softmax average over points: repeating every
    # point (a uniform refinement of a piecewise-constant function) leaves the output unchanged.
    s = _sample(rng, "small")
    out = aroma(**s.inputs, params=s.params, **s.config)
    rep = {k: np.repeat(v, 3, axis=1) if k != "target_coords" else v for k, v in s.inputs.items()}
    err = float(np.abs(aroma(**rep, params=s.params, **s.config) - out).max())
    assert err < 1e-12, f"uniform refinement changes the output: {err}"
    return err


def _check_fourier_bands(rng):
    # MultiScaleNeRFEncoding's disjoint octave bands: scale s covers pi*2^[s_{j-1}, s_j]; NeRFEncoding's
    # products are frequency-major, the multi-scale ones coordinate-major.
    bands = nerf_bands(3, 0.0, 4.0)
    err = float(np.abs(bands - np.pi * np.array([1.0, 4.0, 16.0])).max())
    x = rng.random((2, 5, 2))
    fm, _ = fourier_encode_forward(x, bands)
    cm, _ = fourier_encode_forward(x, bands, freq_major=False)
    err = max(err, float(np.abs(fm[..., 1] - np.sin(np.pi * x[..., 1])).max()),
              float(np.abs(cm[..., 1] - np.sin(4 * np.pi * x[..., 0])).max()))
    assert err < 1e-12, f"Fourier band layout differs from upstream: {err}"
    return err


register(
    Mechanism(
        slug="aroma_latent_neural_field_operator", family="3-operator", tier="T3",
        title="AROMA encoder-decoder: Perceiver cross-attention to latent tokens, local neural-field decoder",
        paper="Serrano, Wang, Naour, Vittaut, Gallinari, AROMA: Preserving Spatial Structure for Latent PDE "
              "Modeling with Local Neural Fields, NeurIPS 2024, arXiv 2406.02176",
        forward=aroma_forward, backward=aroma_backward, sample=_sample,
        docs="operators/o5c.md#aroma-encoder-decoder-latent-tokens-and-local-neural-field",
        checks={"variants_gradcheck": _check_variants_fd,
                "input_permutation_invariance": _check_input_permutation_invariance,
                "query_pointwise": _check_query_pointwise, "mask_equals_unpadded": _check_mask,
                "uniform_refinement_invariance": _check_uniform_refinement,
                "fourier_band_layout": _check_fourier_bands},
    ),
)
