r"""Convolutional Neural Operator (CNO): the CNO block and residual block with the anti-aliased
(filtered) leaky-ReLU activation and its up/down-sampling.

Paper: Raonić, Molinaro, De Ryck, Rohner, Bartolucci, Alaifari, Mishra, de Bézenac,
"Convolutional Neural Operators for robust and accurate learning of PDEs", NeurIPS 2023,
arXiv 2302.01178. Upstream: bogdanraonic3/ConvolutionalNeuralOperator ``CNOModule.py``
(``CNOBlock``, ``ResidualBlock``), ``training/filtered_networks.py`` (``LReLu``,
``design_lowpass_filter``) and ``torch_utils/ops/filtered_lrelu.py`` / ``upfirdn2d.py``
(``_filtered_lrelu_ref``, ``_upfirdn2d_ref``, from NVIDIA's StyleGAN3)
@ 6544abb82d7cc126cdcd7927ad71cc007e9cf3ab. neuraloperator's ``cno_block.py`` (commit 238a2665)
uses bicubic/bilinear interpolation instead (``LReLu_torch``); that variant is not implemented.

Block
-----
``CNOBlock`` maps ``x (B, C_in, s, s)`` to ``(B, C_out, s', s')``: a ``k x k`` convolution with
zero padding ``(k-1)/2``, optional batch norm, then the filtered activation
$\tilde\sigma = D\circ\sigma\circ U$:

$$z = \mathrm{BN}(W\star x + \beta) + b,\qquad y = D\,\sigma\big(U z U^\top\big)D^\top,\qquad
\sigma(v) = \sqrt2\,(\max(v,0) + 0.2\min(v,0)),$$

per batch entry and channel ($U$, $D$ act on rows and columns alike: the filters are separable).
$s' > s$ is an up (U) block, $s' < s$ a down (D) block, $s' = s$ an invariant (I) block.
``ResidualBlock``: $x + \mathrm{BN}_2(W_2\star\tilde\sigma(\mathrm{BN}_1(W_1\star x)) + \beta_2)$.

Resampling (``resampling="filtered"``, upstream ``cno_lrelu``)
--------------------------------------------------------------
With $s_t = \max(s, s')\cdot$``lrelu_upsampling``, $u = s_t/s$, $d = s_t/s'$, cutoffs
$f_c = s/c_{den}$, $f_c' = s'/c_{den}$ and half-widths $f_h = m s - f_c$, $f_h' = m s' - f_c'$
(``cutoff_den`` $c_{den}$ = 2.0001, ``half_width_mult`` $m$ = 0.8): Kaiser low-pass filters
``scipy.signal.firwin(numtaps, cutoff, width=2 f_h, fs=s_t)`` with ``filter_size * u`` and
``filter_size * d`` taps. $U$ is ``upfirdn`` up-sampling (insert $u-1$ zeros after every sample,
pad by ``(pad_lo, pad_hi)``, convolve with the up filter times $u$, valid part) and $D$ the
down-sampling (convolve with the down filter, keep every $d$-th sample), with upstream's padding
$p = (s'-1)d + 1 - su + T_u + T_d - 2$, ``pad_lo = (p + u)//2``, ``pad_hi = p - pad_lo``. Each is a
fixed matrix per axis (built by applying the 1-D ``upfirdn`` to the identity).

``resampling="fft"`` (reconstruction: the paper's ideal band-limited resampling, which the FIR
filters approximate): $U$ and $D$ are periodic sinc interpolation / spectral truncation between
$s$, $s_t$ and $s'$ (:func:`fft_resample_matrix`: frequencies strictly below the smaller grid's
Nyquist, so that $D_{n\leftarrow m}U_{m\leftarrow n}$ is the identity on that band and
$D_{n\leftarrow m} = \tfrac nm U_{m\leftarrow n}^\top$: with the grid measures $1/n$, $1/m$ the two
are adjoint).

Backward
--------
$\bar v = \sqrt2\,(D^\top\bar yD)\odot[v>0\ ?\ 1 : 0.2]$, $\bar z = U^\top\bar vU$,
$\bar b = \sum_{b,i,j}\bar z$; batch norm in eval mode is a fixed affine map
($\bar a = \bar z\,\gamma/\sqrt{\sigma^2_{run}+\epsilon}$, $\bar\gamma = \sum\bar z\hat a$,
$\bar\beta_{BN} = \sum\bar z$), in train mode :func:`refattn.nn.norms.normalize_backward` over
$(B, s, s)$; the convolution VJP is :func:`refattn.nn.conv.conv_vjp`. The leaky ReLU is not
differentiable at 0; samplers keep pre-activations away from it.

Conventions
-----------
* Parameters under upstream's ``state_dict`` names: ``convolution.weight`` (PyTorch layout),
  ``convolution.bias``, ``batch_norm.weight``/``.bias``, ``activation.bias`` (residual block:
  ``convolution1/2``, ``batch_norm1/2``, ``activation.bias``).
* ``batch_norm``: ``"eval"`` (running statistics from ``buffers``, e.g.
  ``{"batch_norm.running_mean": ..., "batch_norm.running_var": ...}``, default PyTorch's initial
  0 and 1), ``"train"`` (batch statistics; couples the batch) or ``None`` (upstream
  ``batch_norm=False``, as in the lifting/projection blocks).
* Upstream stores the FIR taps in float32; refattn designs them in float64 (the same
  ``firwin`` call), which moves outputs by ~1e-8 relative (see the docs for the measured numbers).
* Square grids, as upstream (``in_size``/``out_size`` are ints there).
"""

from __future__ import annotations

import functools

import numpy as np
import scipy.signal

from .._checks import as_dout, as_float, cast_all, check_choice, check_int, check_params, check_positive, compute_dtype
from ..nn.conv import conv_apply, conv_vjp
from ..nn.norms import normalize_backward, normalize_forward
from ..registry import Mechanism, Sample, register

__all__ = ["cno_lowpass_filter", "upfirdn_matrix", "fft_resample_matrix", "cno_resample", "cno_activation_operators",
           "cno_block_forward", "cno_block_backward", "cno_block", "cno_residual_block_forward",
           "cno_residual_block_backward", "cno_residual_block", "kink_margin"]

_SLOPE, _GAIN = 0.2, float(np.sqrt(2.0))


def cno_lowpass_filter(numtaps: int, cutoff: float, width: float, fs: float):
    """Separable Kaiser low-pass taps (upstream ``design_lowpass_filter``), ``None`` for one tap."""
    if numtaps == 1:
        return None
    return scipy.signal.firwin(numtaps=numtaps, cutoff=cutoff, width=width, fs=fs)


def _upfirdn_last(x, f, up, down, p0, p1, gain):
    """StyleGAN3 ``_upfirdn2d_ref`` along the last axis (separable filter, gain per axis)."""
    n = x.shape[-1]
    z = np.zeros(x.shape[:-1] + (n * up,), dtype=x.dtype)
    z[..., ::up] = x
    z = np.pad(z, [(0, 0)] * (x.ndim - 1) + [(max(p0, 0), max(p1, 0))])
    z = z[..., max(-p0, 0):z.shape[-1] - max(-p1, 0)]
    taps = np.ones(1) if f is None else np.asarray(f, dtype=np.float64) * np.sqrt(gain)
    y = np.lib.stride_tricks.sliding_window_view(z, taps.size, axis=-1) @ taps[::-1]
    return y[..., ::down]


def upfirdn_matrix(n: int, f, up: int = 1, down: int = 1, pad=(0, 0), gain: float = 1.0) -> np.ndarray:
    """The 1-D ``upfirdn`` (up-sample by zero insertion, pad, FIR convolution, down-sample) as an
    ``(n_out, n)`` matrix; the filter is scaled by ``sqrt(gain)`` as in the separable 2-D op."""
    return _upfirdn_last(np.eye(n), f, up, down, pad[0], pad[1], gain).T


def fft_resample_matrix(n_in: int, n_out: int) -> np.ndarray:
    r"""Periodic band-limited (sinc) resampling ``(n_out, n_in)``: keep the frequencies
    $|k| < \min(n_{in}, n_{out})/2$ (the Nyquist bin of an even smaller grid is dropped, as CNO's
    cutoff $s/2.0001$ excludes it), scale by $n_{out}/n_{in}$. Exact for trigonometric polynomials
    of degree $< n/2$; $D_{n\leftarrow m}U_{m\leftarrow n}$ is the projection onto them and
    $D_{n\leftarrow m} = \tfrac nm U_{m\leftarrow n}^\top$."""
    if n_in == n_out:
        return np.eye(n_in)
    X = np.fft.fft(np.eye(n_in), axis=0)
    h = (min(n_in, n_out) - 1) // 2
    Y = np.zeros((n_out, n_in), dtype=complex)
    Y[:h + 1] = X[:h + 1]
    if h:
        Y[n_out - h:] = X[n_in - h:]
    return (np.fft.ifft(Y, axis=0) * (n_out / n_in)).real


def cno_resample(x, out_size: int) -> np.ndarray:
    """Band-limited resampling of ``x (..., s, s)`` to ``(..., out_size, out_size)`` (how a CNO
    takes inputs at another resolution: sinc interpolation onto its grid)."""
    x = as_float(x, "x", min_ndim=2)
    out_size = check_int(out_size, "out_size", minimum=1)
    r0 = fft_resample_matrix(x.shape[-2], out_size).astype(x.dtype)
    r1 = fft_resample_matrix(x.shape[-1], out_size).astype(x.dtype)
    return r0 @ x @ r1.T


@functools.lru_cache(maxsize=64)
def _operators(s_in, s_out, cutoff_den, filter_size, up_rate, half_width_mult, resampling):
    tmp = max(s_in, s_out) * up_rate
    if resampling == "fft":
        return fft_resample_matrix(s_in, tmp), fft_resample_matrix(tmp, s_out)
    up, down = int(np.rint(tmp / s_in)), int(np.rint(tmp / s_out))
    up_taps = filter_size * up if up > 1 else 1
    down_taps = filter_size * down if down > 1 else 1
    fu = cno_lowpass_filter(up_taps, s_in / cutoff_den, 2 * (half_width_mult * s_in - s_in / cutoff_den), tmp)
    fd = cno_lowpass_filter(down_taps, s_out / cutoff_den, 2 * (half_width_mult * s_out - s_out / cutoff_den), tmp)
    pad = (s_out - 1) * down + 1 - s_in * up + up_taps + down_taps - 2
    lo = (pad + up) // 2
    U = upfirdn_matrix(s_in, fu, up=up, pad=(lo, pad - lo), gain=up ** 2)
    D = upfirdn_matrix(U.shape[0], fd, down=down)
    if D.shape[0] != s_out:
        raise ValueError(f"the filtered activation cannot map size {s_in} to {s_out} with lrelu_upsampling={up_rate}: "
                         f"it gives {D.shape[0]}")
    return U, D


def cno_activation_operators(in_size: int, out_size: int, *, cutoff_den: float = 2.0001, filter_size: int = 6,
                             lrelu_upsampling: int = 2, half_width_mult: float = 0.8, resampling: str = "filtered"):
    """The fixed per-axis matrices ``(U, D)`` of the CNO activation (module docstring): ``U (m, s)``
    and ``D (s', m)`` with ``m`` the intermediate length ($s_t$ for ``"fft"``; for ``"filtered"``
    the valid part of the padded, up-sampled grid, which the down filter then shrinks). Fresh
    copies (the construction is cached)."""
    in_size, out_size = check_int(in_size, "in_size", minimum=1), check_int(out_size, "out_size", minimum=1)
    cutoff_den = check_positive(cutoff_den, "cutoff_den")
    filter_size = check_int(filter_size, "filter_size", minimum=1)
    lrelu_upsampling = check_int(lrelu_upsampling, "lrelu_upsampling", minimum=1)
    half_width_mult = check_positive(half_width_mult, "half_width_mult")
    check_choice(resampling, "resampling", ("filtered", "fft"))
    if resampling == "filtered" and half_width_mult <= 1.0 / cutoff_den:
        raise ValueError(f"half_width_mult ({half_width_mult}) must exceed 1/cutoff_den ({1 / cutoff_den:.4f}): the "
                         f"filter's transition half-width m*s - s/cutoff_den must be positive")
    U, D = _operators(in_size, out_size, float(cutoff_den), filter_size, lrelu_upsampling, float(half_width_mult),
                      resampling)
    return U.copy(), D.copy()


# --------------------------------------------------------------------------------------------
# Pieces shared by the two blocks (unvalidated)


def _conv_bn(x, p, conv, bn, mode, buffers, eps):
    a = conv_apply(x, p[f"{conv}.weight"], p.get(f"{conv}.bias"), padding=(p[f"{conv}.weight"].shape[2] - 1) // 2)
    c = {"x": x, "conv": conv, "bn": bn, "mode": mode}
    if mode is None:
        return a, c
    w, b = p[f"{bn}.weight"][:, None, None], p[f"{bn}.bias"][:, None, None]
    if mode == "train":
        ahat, stats = normalize_forward(a, (0, 2, 3), eps)
        c["stats"] = stats
    else:
        mean, var = buffers[f"{bn}.running_mean"], buffers[f"{bn}.running_var"]
        c["rstd"] = (1.0 / np.sqrt(var + eps)).astype(a.dtype)[:, None, None]
        ahat = (a - mean.astype(a.dtype)[:, None, None]) * c["rstd"]
    c["ahat"] = ahat
    return ahat * w + b, c


def _conv_bn_vjp(g, c, p, grads):
    conv, bn = c["conv"], c["bn"]
    if c["mode"] is not None:
        grads[f"{bn}.weight"] = np.sum(g * c["ahat"], axis=(0, 2, 3))
        grads[f"{bn}.bias"] = np.sum(g, axis=(0, 2, 3))
        gh = g * p[f"{bn}.weight"][:, None, None]
        g = normalize_backward(gh, c["ahat"], c["stats"]) if c["mode"] == "train" else gh * c["rstd"]
    w = p[f"{conv}.weight"]
    gr = conv_vjp(g, c["x"], w, padding=(w.shape[2] - 1) // 2, has_bias=f"{conv}.bias" in p)
    grads[f"{conv}.weight"] = gr["weight"]
    if "bias" in gr:
        grads[f"{conv}.bias"] = gr["bias"]
    return gr["x"]


def _activation(z, bias, U, D):
    zb = z + bias[:, None, None]
    v = U @ zb @ U.T
    slope = np.where(v > 0, 1.0, _SLOPE).astype(v.dtype)
    return D @ (_GAIN * slope * v) @ D.T, slope, zb


def _activation_vjp(g, slope, U, D):
    dz = U.T @ (_GAIN * slope * (D.T @ g @ D)) @ U
    return dz, dz.sum(axis=(0, 2, 3))


# --------------------------------------------------------------------------------------------
# Validation


_CFG_DEFAULTS = {"cutoff_den": 2.0001, "filter_size": 6, "lrelu_upsampling": 2, "half_width_mult": 0.8,
                 "resampling": "filtered"}


def _validate(x, params, buffers, batch_norm, eps, convs, bns, c_out_last):
    """``c_out_last``: None (read from the last weight) or ``"input"`` (x's channels: residual)."""
    x = as_float(x, "x", ndim=4)
    c_out_last = x.shape[1] if c_out_last == "input" else None
    if x.shape[2] != x.shape[3]:
        raise ValueError(f"x must be (B, C, s, s) on a square grid (upstream's int sizes); got {x.shape}")
    check_choice(batch_norm, "batch_norm", ("eval", "train", None))
    eps = check_positive(eps, "bn_eps")
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of arrays; got {type(params).__name__}")
    spec, c_in = {}, x.shape[1]
    for i, conv in enumerate(convs):
        w = params.get(f"{conv}.weight")
        if w is None:
            raise ValueError(f"params is missing '{conv}.weight' (C_out, C_in={c_in}, k, k)")
        w = as_float(w, f"{conv}.weight", ndim=4)
        if w.shape[1] != c_in or w.shape[2] != w.shape[3] or w.shape[2] % 2 == 0:
            raise ValueError(f"{conv}.weight must have shape (C_out, C_in={c_in}, k, k) with odd k; got {w.shape}")
        c_out = w.shape[0] if c_out_last is None or i < len(convs) - 1 else c_out_last
        spec.update({f"{conv}.weight": (c_out,) + w.shape[1:], f"{conv}.bias": (c_out,)})
        if batch_norm is not None:
            spec.update({f"{bns[i]}.weight": (c_out,), f"{bns[i]}.bias": (c_out,)})
        c_in = c_out
    spec["activation.bias"] = (spec[f"{convs[0]}.bias"][0],)
    p = check_params(params, spec, optional=tuple(f"{c}.bias" for c in convs))
    buf = {}
    if batch_norm == "eval":
        buffers = {} if buffers is None else buffers
        if not isinstance(buffers, dict):
            raise TypeError(f"buffers must be a dict of running statistics; got {type(buffers).__name__}")
        for bn, conv in zip(bns, convs):
            n = spec[f"{conv}.bias"][0]
            for stat, init in (("running_mean", 0.0), ("running_var", 1.0)):
                key = f"{bn}.{stat}"
                arr = np.full(n, init) if buffers.get(key) is None else as_float(buffers[key], key, ndim=1)
                if arr.shape != (n,) or (stat == "running_var" and np.any(arr < 0)):
                    raise ValueError(f"buffers[{key!r}] must have shape ({n},){' and be >= 0' * (stat == 'running_var')}; "
                                     f"got {arr.shape}")
                buf[key] = arr
    dt = compute_dtype(x, *p.values())
    return x.astype(dt, copy=False), cast_all(dt, p), buf, eps, dt


def _operators_for(s_in, s_out, cfg, dt):
    U, D = cno_activation_operators(s_in, s_out, **cfg)
    return U.astype(dt), D.astype(dt)


def cno_block_forward(x, params, *, out_size=None, batch_norm="eval", buffers=None, bn_eps: float = 1e-5,
                      cutoff_den: float = 2.0001, filter_size: int = 6, lrelu_upsampling: int = 2,
                      half_width_mult: float = 0.8, resampling: str = "filtered"):
    r"""CNO block (upstream ``CNOBlock``): conv, optional batch norm, filtered leaky ReLU.

    Parameters
    ----------
    x : array (B, C_in, s, s)
    params : dict
        ``convolution.weight (C_out, C_in, k, k)`` (odd k, PyTorch layout), optional
        ``convolution.bias``, ``batch_norm.weight``/``.bias`` (unless ``batch_norm=None``),
        ``activation.bias (C_out,)``.
    out_size : int, optional
        Output grid size $s'$ (default $s$: an invariant block; $s/2$: down; $2s$: up).
    batch_norm : {"eval", "train", None}
        Upstream default ``batch_norm=True``; ``"eval"`` uses ``buffers`` (running statistics).
    buffers : dict, optional
        ``batch_norm.running_mean`` / ``batch_norm.running_var`` (default 0 and 1).
    bn_eps : float
        ``nn.BatchNorm2d`` eps (1e-5).
    cutoff_den, filter_size, lrelu_upsampling, half_width_mult
        Filter design (upstream defaults 2.0001, 6, 2, 0.8; module docstring).
    resampling : {"filtered", "fft"}
        Upstream's Kaiser FIR ``upfirdn`` (default) or ideal band-limited resampling.

    Returns
    -------
    out, cache
        ``out (B, C_out, s', s')``.
    """
    x, p, buf, eps, dt = _validate(x, params, buffers, batch_norm, bn_eps, ("convolution",), ("batch_norm",), None)
    cfg = dict(cutoff_den=cutoff_den, filter_size=filter_size, lrelu_upsampling=lrelu_upsampling,
               half_width_mult=half_width_mult, resampling=resampling)
    s_out = x.shape[2] if out_size is None else check_int(out_size, "out_size", minimum=1)
    U, D = _operators_for(x.shape[2], s_out, cfg, dt)
    z, cb = _conv_bn(x, p, "convolution", "batch_norm", batch_norm, buf, eps)
    y, slope, zb = _activation(z, p["activation.bias"], U, D)
    return y, {"p": p, "cb": cb, "slope": slope, "zb": zb, "U": U, "D": D, "shape": y.shape, "dt": dt}


def cno_block_backward(dout, cache):
    """Gradients of :func:`cno_block_forward`: ``x`` and every parameter."""
    g = as_dout(dout, cache["shape"], cache["dt"])
    grads = {}
    dz, grads["activation.bias"] = _activation_vjp(g, cache["slope"], cache["U"], cache["D"])
    grads["x"] = _conv_bn_vjp(dz, cache["cb"], cache["p"], grads)
    return grads


def kink_margin(cache) -> float:
    """Smallest distance of the activation's inputs $UzU^\top$ from the leaky-ReLU kink, relative
    to the size of the terms summed into each (samplers and tests keep it away from 0)."""
    U, zb = cache["U"], cache["zb"]
    return float((np.abs(U @ zb @ U.T) / (np.abs(U) @ np.abs(zb) @ np.abs(U).T + 1e-300)).min())


def cno_block(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`cno_block_forward`."""
    return cno_block_forward(x, params, **config)[0]


def cno_residual_block_forward(x, params, *, batch_norm="eval", buffers=None, bn_eps: float = 1e-5,
                               cutoff_den: float = 2.0001, filter_size: int = 6, lrelu_upsampling: int = 2,
                               half_width_mult: float = 0.8, resampling: str = "filtered"):
    r"""CNO residual block (upstream ``ResidualBlock``):
    $x + \mathrm{BN}_2(W_2\star\tilde\sigma(\mathrm{BN}_1(W_1\star x)))$, grid size kept.

    Parameters: ``convolution1.*``, ``batch_norm1.*``, ``activation.bias``, ``convolution2.*``,
    ``batch_norm2.*`` (both convolutions ``(C, C, k, k)``); buffers ``batch_norm{1,2}.running_*``.
    Other keywords as :func:`cno_block_forward`.
    """
    x, p, buf, eps, dt = _validate(x, params, buffers, batch_norm, bn_eps, ("convolution1", "convolution2"),
                                   ("batch_norm1", "batch_norm2"), "input")
    cfg = dict(cutoff_den=cutoff_den, filter_size=filter_size, lrelu_upsampling=lrelu_upsampling,
               half_width_mult=half_width_mult, resampling=resampling)
    if p["convolution1.weight"].shape[0] != x.shape[1]:
        raise ValueError(f"convolution1.weight must map C={x.shape[1]} channels to C; got {p['convolution1.weight'].shape}")
    U, D = _operators_for(x.shape[2], x.shape[2], cfg, dt)
    z, c1 = _conv_bn(x, p, "convolution1", "batch_norm1", batch_norm, buf, eps)
    a, slope, zb = _activation(z, p["activation.bias"], U, D)
    r, c2 = _conv_bn(a, p, "convolution2", "batch_norm2", batch_norm, buf, eps)
    return x + r, {"p": p, "c1": c1, "c2": c2, "slope": slope, "zb": zb, "U": U, "D": D, "shape": x.shape, "dt": dt}


def cno_residual_block_backward(dout, cache):
    """Gradients of :func:`cno_residual_block_forward`: ``x`` and every parameter."""
    g = as_dout(dout, cache["shape"], cache["dt"])
    grads, p = {}, cache["p"]
    da = _conv_bn_vjp(g, cache["c2"], p, grads)
    dz, grads["activation.bias"] = _activation_vjp(da, cache["slope"], cache["U"], cache["D"])
    grads["x"] = g + _conv_bn_vjp(dz, cache["c1"], p, grads)
    return grads


def cno_residual_block(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`cno_residual_block_forward`."""
    return cno_residual_block_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _pre_activation(s):
    p = s.params
    cfg = s.config
    x = s.inputs["x"]
    a = conv_apply(x, p["convolution.weight"], p.get("convolution.bias"), padding=(p["convolution.weight"].shape[2] - 1) // 2)
    if cfg.get("batch_norm", "eval") == "eval":
        buf = cfg.get("buffers") or {}
        mean = buf.get("batch_norm.running_mean", np.zeros(a.shape[1]))
        var = buf.get("batch_norm.running_var", np.ones(a.shape[1]))
        a = (a - mean[:, None, None]) / np.sqrt(var[:, None, None] + 1e-5) * p["batch_norm.weight"][:, None, None] \
            + p["batch_norm.bias"][:, None, None]
    return a + p["activation.bias"][:, None, None]


def _sample(rng, size):
    for _ in range(100):
        if size == "tiny":
            s_in, s_out, cin, cout, bn, res = 4, 4, 2, 2, "eval", "filtered"
        else:
            s_in, cin, cout = 8, 3, 2
            s_out = (4, 8, 16)[int(rng.integers(0, 3))]
            bn, res = ("eval", None)[int(rng.integers(0, 2))], ("filtered", "fft")[int(rng.integers(0, 2))]
        params = {"convolution.weight": rng.standard_normal((cout, cin, 3, 3)) / 3.0,
                  "convolution.bias": 0.3 * rng.standard_normal(cout), "activation.bias": 0.3 * rng.standard_normal(cout)}
        cfg = {"out_size": s_out, "batch_norm": bn, "resampling": res}
        if bn == "eval":
            params.update({"batch_norm.weight": rng.uniform(0.5, 1.5, cout), "batch_norm.bias": 0.2 * rng.standard_normal(cout)})
            cfg["buffers"] = {"batch_norm.running_mean": 0.1 * rng.standard_normal(cout),
                              "batch_norm.running_var": rng.uniform(0.5, 2.0, cout)}
        s = Sample(inputs={"x": rng.standard_normal((2, cin, s_in, s_in))}, params=params, config=cfg)
        if kink_margin(cno_block_forward(**s.inputs, params=params, **cfg)[1]) > (1e-3 if size == "tiny" else 1e-5):
            return s
    raise RuntimeError("could not draw a CNO sample away from the leaky-ReLU kink")


def _upfirdn2d_literal(x, f, up, down, pad, gain):
    # StyleGAN3's reference steps on a 2-D image: zero insertion, pad, one 2-D correlation with
    # the flipped outer-product filter, decimation.
    b, c, h, w = x.shape
    z = np.zeros((b, c, h * up, w * up))
    z[:, :, ::up, ::up] = x
    z = np.pad(z, [(0, 0), (0, 0), (pad[0], pad[1]), (pad[0], pad[1])])
    k = (np.outer(f, f) * gain)[::-1, ::-1] if f is not None else np.ones((1, 1))
    out = np.zeros((b, c, z.shape[2] - k.shape[0] + 1, z.shape[3] - k.shape[1] + 1))
    for i in range(k.shape[0]):
        for j in range(k.shape[1]):
            out += k[i, j] * z[:, :, i:i + out.shape[2], j:j + out.shape[3]]
    return out[:, :, ::down, ::down]


def _reference(x, params, *, out_size=None, batch_norm="eval", buffers=None, bn_eps=1e-5, cutoff_den=2.0001,
               filter_size=6, lrelu_upsampling=2, half_width_mult=0.8, resampling="filtered"):
    s = Sample(inputs={"x": x}, params=params, config={"batch_norm": batch_norm, "buffers": buffers})
    z = _pre_activation(s)
    s_in = x.shape[2]
    s_out = s_in if out_size is None else out_size
    tmp = max(s_in, s_out) * lrelu_upsampling
    if resampling == "fft":
        U, D = fft_resample_matrix(s_in, tmp), fft_resample_matrix(tmp, s_out)
        v = U @ z @ U.T
        return D @ (np.sqrt(2) * np.where(v > 0, v, 0.2 * v)) @ D.T
    up, down = tmp // s_in, tmp // s_out
    tu, td = filter_size * up if up > 1 else 1, filter_size * down if down > 1 else 1
    fu = cno_lowpass_filter(tu, s_in / cutoff_den, 2 * (half_width_mult * s_in - s_in / cutoff_den), tmp)
    fd = cno_lowpass_filter(td, s_out / cutoff_den, 2 * (half_width_mult * s_out - s_out / cutoff_den), tmp)
    pad = (s_out - 1) * down + 1 - s_in * up + tu + td - 2
    v = _upfirdn2d_literal(z, fu, up, 1, ((pad + up) // 2, pad - (pad + up) // 2), up ** 2)
    return _upfirdn2d_literal(np.sqrt(2) * np.where(v > 0, v, 0.2 * v), fd, 1, down, (0, 0), 1.0)


def _check_band_limited_resampling(rng):
    # Sinc resampling reproduces a trigonometric polynomial of degree < n/2 on any finer or
    # coarser grid that still resolves it; D U is the projection onto that band (the identity for
    # odd n) and D = (n/m) U^T (adjoint for the grid measures 1/n, 1/m).
    def field(n):
        t = np.arange(n) / n
        X, Y = np.meshgrid(t, t, indexing="ij")
        return np.cos(2 * np.pi * (3 * X - 2 * Y)) + np.sin(2 * np.pi * X) * np.cos(4 * np.pi * Y) + 0.5
    err = max(float(np.abs(cno_resample(field(n), m) - field(m)).max()) for n, m in ((10, 16), (16, 10), (12, 25)))
    for n, m in ((8, 16), (9, 20), (10, 15)):
        up, down = fft_resample_matrix(n, m), fft_resample_matrix(m, n)
        proj = fft_resample_matrix(n + 1 - n % 2, n) @ fft_resample_matrix(n, n + 1 - n % 2)
        err = max(err, float(np.abs(down @ up - proj).max()), float(np.abs(down - n / m * up.T).max()))
    assert err < 1e-12, f"band-limited resampling is not exact: {err:.2e}"
    return err


def _check_resolution_consistent(rng):
    # The same band-limited input given at resolution 12 or 20, resampled onto the block's 16-grid,
    # gives the same block output (both resampling modes; the model's own grid is fixed).
    def field(n):
        t = np.arange(n) / n
        X, Y = np.meshgrid(t, t, indexing="ij")
        return np.stack([np.cos(2 * np.pi * (2 * X + Y)), np.sin(2 * np.pi * (X - 3 * Y))])[None]
    p = {"convolution.weight": rng.standard_normal((3, 2, 3, 3)), "activation.bias": rng.standard_normal(3)}
    err = 0.0
    for res in ("filtered", "fft"):
        a = cno_block(cno_resample(field(12), 16), p, batch_norm=None, resampling=res)
        b = cno_block(cno_resample(field(20), 16), p, batch_norm=None, resampling=res)
        err = max(err, float(np.abs(a - b).max()))
    assert err < 1e-12, f"block output depends on the input resolution by {err:.2e}"
    return err


def _check_filtered_matches_ideal(rng):
    # Upstream's Kaiser FIR activation approximates the ideal sinc one: on a smooth periodic field
    # the two invariant-block outputs agree to a few percent away from the (zero-padded) border,
    # and the identity-like regime (positive pre-activations) is reproduced far better.
    t = np.arange(32) / 32
    X, Y = np.meshgrid(t, t, indexing="ij")
    z = (np.sin(2 * np.pi * X) * np.cos(2 * np.pi * Y))[None, None]
    out = {}
    for res in ("filtered", "fft"):
        U, D = cno_activation_operators(32, 32, resampling=res)
        out[res] = _activation(z, np.zeros(1), U, D)[0]
    inner = (slice(None), slice(None), slice(8, 24), slice(8, 24))
    err = float(np.abs(out["filtered"] - out["fft"])[inner].max() / np.abs(out["fft"]).max())
    assert err < 0.05, f"filtered activation is far from the ideal one: {err:.2e}"
    return err


register(
    Mechanism(
        slug="cno_convolutional_operator", family="3-operator", tier="T2",
        title="Convolutional Neural Operator block (conv, batch norm, anti-aliased filtered leaky ReLU with up/down-sampling)",
        paper="Raonić, Molinaro, De Ryck, Rohner, Bartolucci, Alaifari, Mishra, de Bézenac, Convolutional Neural "
              "Operators for robust and accurate learning of PDEs, NeurIPS 2023, arXiv 2302.01178",
        forward=cno_block_forward, backward=cno_block_backward, sample=_sample, reference=_reference,
        docs="operators/convolutional-and-wavelet-operators.md#convolutional-neural-operator",
        checks={"band_limited_resampling": _check_band_limited_resampling,
                "resolution_consistent": _check_resolution_consistent,
                "filtered_matches_ideal": _check_filtered_matches_ideal},
    ),
)
