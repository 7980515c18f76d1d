r"""WavSpA: attention in a (learnable) wavelet coefficient space.

Zhuang, Wang, Tao, Shang, "WavSpA: Wavelet Space Attention for Boosting Transformers' Long Sequence
Learning Ability", 2022, arXiv 2210.01989. Follows EvanZhuang/wavspa
@``0610f76b458b57f4e00549f40fd4d9d251fc27b7``: ``lra_benchmarks/models/wavspa/wavspa_learn.py``
(``WavspaBlock``, ``db_init``, ``daubcqf``) and ``wavspa/conv_fwt_learn.py`` (``wavedec``,
``waverec``, ``CQF_expansion``, ``_fwt_pad``, ``_fwt_unpad``).

The wavelet transform
---------------------
Per channel $c$ a low-pass analysis filter $h = $ ``adawave[:, c]`` of even length $L$ (learnable;
initialised as Daubechies ``db{L/2}``, `daubechies_filter`) and its quadrature mirror
$g_m = (-1)^{m+1}h_{L-1-m}$ (``CQF_expansion``). One level maps $a\in\mathbb R^n$ to

$$\tilde a = \mathrm{pad}(a)\in\mathbb R^P,\qquad
\mathrm{lo}_j = \sum_{m<L}\tilde a_{(2j+m)\bmod P}\,h_{L-1-m},\qquad
\mathrm{hi}_j = \sum_{m<L}\tilde a_{(2j+m)\bmod P}\,g_{L-1-m},\quad j < P/2,$$

a periodic (circular) filter bank on the padded signal, as upstream's FFT convolution. The padding
(``boundary``): ``"reflect"`` (upstream: $p = \lfloor(2L-3)/2\rfloor$ mirrored samples on each
side, one more on the right when $n$ is odd), ``"zero"`` (same widths, zeros) or ``"periodic"`` (no
padding; $n$ must be even at every level). ``level`` levels give
$[\mathrm{lo}_J, \mathrm{hi}_J, \dots, \mathrm{hi}_1]$ (pywt order, `wavedec`). Writing one level
as $W\tilde a$ with $W\in\mathbb R^{P\times P}$, the synthesis filters of ``waverec``
($\mathrm{rec\_lo} = \mathrm{flip}(h)$, $\mathrm{rec\_hi} = (-1)^m h_m$) apply exactly $W^\top$,
followed by the crop $[p, p+n)$ (``_fwt_unpad``) — `waverec`. For an orthonormal filter
($\sum_m h_mh_{m+2k} = \delta_k$, e.g. Daubechies) $W$ is orthogonal, so

$$\mathrm{waverec}(\mathrm{wavedec}(x)) = x\qquad\text{(perfect reconstruction, every boundary mode)},$$

and with ``"periodic"`` the synthesis is also the adjoint of the analysis. With padding it is not:
the adjoint of `wavedec` folds the padded entries back (`wavedec_vjp`), while `waverec` crops them.
A learned filter leaves the orthonormal set, and then neither identity holds (as upstream, which
does not constrain it).

The layer (``WavspaBlock``'s attention part)
--------------------------------------------
$$Y = \mathrm{waverec}\big([\mathrm{MHA}_0(\mathrm{lo}_J), \mathrm{MHA}_1(\mathrm{hi}_J), \dots,
\mathrm{MHA}_J(\mathrm{hi}_1)]\big)[:n],$$

one multi-head self-attention per coefficient band (flax ``nn.SelfAttention`` with
``use_bias=False``: $\mathrm{softmax}(QK^\top/\sqrt d)V$, output projection). ``WavspaBlock`` wraps it
as ``inputs + Y(LayerNorm(inputs))`` followed by the MLP (not part of this function).

Backward
--------
Everything is linear except the attentions. With band gradients $G_b$ from the reconstruction
($\partial\,\mathrm{waverec}/\partial\,\mathrm{band} = $ crop-adjoint (zero pad) then $W$, i.e. the
periodic analysis) the attention VJPs (`refattn.attention.softmax.core.attention_core_backward`) give
the band-input gradients, which flow back through the analysis: $W^\top$ (the periodic synthesis),
then the padding's adjoint (`refattn.nn.conv.pad_nd_vjp`). The filter gradient collects both uses:
$\partial\mathrm{lo}_j/\partial h_{L-1-m} = \tilde a_{(2j+m)\bmod P}$ in the analysis and
$\partial y_{(2j+m)\bmod P}/\partial h_{L-1-m} = \mathrm{lo}_j$ in the synthesis (likewise for $g$,
mapped back to $h$ by $g_m = (-1)^{m+1}h_{L-1-m}$), summed over levels.

Conventions and what is not implemented
---------------------------------------
Defaults as the LRA configs (``level=1``, ``boundary="reflect"``, a learnable ``db`` filter);
``wlen`` is the filter's length (upstream ``wlen=16`` initialises ``db8``). Parameter names:
``adawave (L, C)`` and ``SelfAttention_{i}.{query,key,value}.kernel (C, H d)``,
``SelfAttention_{i}.out.kernel (H d, C)`` for band ``i`` (flax's ``(C, H, d)`` / ``(H, d, C)``
kernels reshaped). Upstream's other wavelet families — the lifting scheme (``"lift"``,
``"adalift"``), the rotation-parametrised orthogonal filters (``"ortho"``) and the sine
initialisation — and the non-attention mixers of its ``model_type`` (performer, linformer, ...) are
not implemented; nor are dropout and the padding mask.

Agreement with upstream: JAX is not installed; ``wavedec``/``waverec`` (FFT route, ``_fwt_pad``,
``_fwt_unpad``, ``CQF_expansion(_flip)``) and ``WavspaBlock``'s band loop with flax's
``SelfAttention`` were transcribed to PyTorch (float64; the FFT circular convolutions kept as
upstream), 8 configurations (``"reflect"`` and ``"zero"`` padding, 1 and 2 levels, $L = 4, 8$,
learned non-orthonormal filters): output 1.6e-15, every gradient (input, filter, all kernels)
<= 2.8e-15 relative. ``"periodic"`` is refattn's addition (upstream always pads; its ``wavedec``
hard-codes ``mode = "reflect"``, ``_fwt_pad`` also offers ``"zero"``).
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_choice, check_int, check_params, compute_dtype
from ...nn.conv import pad_nd, pad_nd_vjp
from ...nn.linear import merge_heads, split_heads
from ...registry import Mechanism, Sample, register
from ..softmax.core import attention_core_backward, attention_core_forward

__all__ = ["WAVELET_BOUNDARIES", "daubechies_filter", "wavelet_qmf", "wavedec", "wavedec_vjp", "waverec",
           "waverec_vjp", "wavspa_attention_forward", "wavspa_attention_backward", "wavspa_attention"]

WAVELET_BOUNDARIES = ("reflect", "zero", "periodic")
_BANDS = ("query", "key", "value", "out")


def daubechies_filter(p: int) -> np.ndarray:
    r"""The Daubechies ``db{p}`` low-pass decomposition filter (length $2p$, $\sum h = \sqrt2$,
    $\sum h^2 = 1$) in pywt's orientation (``pywt.Wavelet('db{p}').dec_lo``), by spectral
    factorisation: $H(z) = \big(\tfrac{1+z^{-1}}{2}\big)^p Q(z)$ with the minimum-phase root choice
    of $\sum_{k<p}\binom{p-1+k}{k}y^k$, $y = (2 - z - z^{-1})/4$."""
    p = check_int(p, "p", minimum=1)
    poly = np.array([1.0])
    if p > 1:
        coeff = np.array([float(_comb(p - 1 + k, k)) for k in range(p)])
        yroots = np.roots(coeff[::-1])  # roots in y
        zr = []
        for y in yroots:  # y = (2 - z - 1/z)/4  ->  z^2 - (2 - 4y) z + 1 = 0; keep |z| < 1
            r = np.roots([1.0, -(2.0 - 4.0 * y), 1.0])
            zr.append(r[np.argmin(np.abs(r))])
        poly = np.real(np.poly(zr))
    h = poly
    for _ in range(p):
        h = np.convolve(h, [1.0, 1.0])
    h = np.sqrt(2.0) * h / np.sum(h)
    return h[::-1].copy()


def _comb(n, k):
    out = 1
    for i in range(k):
        out = out * (n - i) // (i + 1)
    return out


def wavelet_qmf(h: np.ndarray):
    r"""``(h, g)`` with $g_m = (-1)^{m+1}h_{L-1-m}$ (``CQF_expansion``'s ``dec_hi``); ``h (L, ...)``."""
    sign = np.where(np.arange(h.shape[0]) % 2 == 0, -1.0, 1.0).astype(h.dtype).reshape((-1,) + (1,) * (h.ndim - 1))
    return h, sign * h[::-1]


def _pads(n, L, boundary):
    if boundary == "periodic":
        return 0, 0
    p = (2 * L - 3) // 2
    return p, p + (n % 2)


def _pad(a, lo, hi, boundary):
    if lo == 0 and hi == 0:
        return a
    mode = "reflect" if boundary == "reflect" else "zeros"
    return np.moveaxis(pad_nd(np.moveaxis(a, 1, -1), [(lo, hi)], mode), -1, 1)


def _pad_vjp(g, lo, hi, boundary):
    if lo == 0 and hi == 0:
        return g
    mode = "reflect" if boundary == "reflect" else "zeros"
    return np.moveaxis(pad_nd_vjp(np.moveaxis(g, 1, -1), [(lo, hi)], mode), -1, 1)


def _analysis(ap, f):
    """Periodic filter bank on ``ap (B, P, C)`` with correlation filter ``f (L, C)``: ``(B, P/2, C)``."""
    big_p, L = ap.shape[1], f.shape[0]
    idx = (2 * np.arange(big_p // 2)[:, None] + np.arange(L)[None, :]) % big_p  # (P/2, L)
    return np.einsum("bjmc,mc->bjc", ap[:, idx, :], f)


def _synthesis(c, f, big_p):
    """The transpose of `_analysis`: ``c (B, P/2, C) -> (B, P, C)``."""
    y = np.zeros((c.shape[0], big_p, c.shape[2]), dtype=np.result_type(c, f))
    j = np.arange(big_p // 2)
    for m in range(f.shape[0]):  # for fixed m the positions (2j + m) mod P are distinct
        y[:, (2 * j + m) % big_p, :] += c * f[m]
    return y


def _filter_grad(ap, c_grad, L):
    """``d f[m] = sum_{b,j} c_grad[b, j] ap[b, (2j+m) mod P]``: the filter gradient of `_analysis`
    (and, with the roles of signal and coefficients swapped, of `_synthesis`)."""
    big_p = ap.shape[1]
    idx = (2 * np.arange(big_p // 2)[:, None] + np.arange(L)[None, :]) % big_p
    return np.einsum("bjc,bjmc->mc", c_grad, ap[:, idx, :])


def wavedec(x: np.ndarray, h: np.ndarray, level: int, boundary: str = "reflect"):
    r"""Multi-level analysis of ``x (B, n, C)`` with per-channel low-pass filters ``h (L, C)``.
    Returns ``(bands, state)``: ``bands = [lo_J, hi_J, ..., hi_1]`` (each ``(B, n_i, C)``) and what
    `wavedec_vjp` needs. Unvalidated."""
    h, g = wavelet_qmf(h)
    fl, fh = h[::-1], g[::-1]  # correlation filters
    a, his, st = x, [], []
    for _ in range(level):
        lo_pad, hi_pad = _pads(a.shape[1], h.shape[0], boundary)
        ap = _pad(a, lo_pad, hi_pad, boundary)
        st.append((ap, lo_pad, hi_pad, a.shape[1]))
        his.append(_analysis(ap, fh))
        a = _analysis(ap, fl)
    return [a] + his[::-1], st


def wavedec_vjp(dbands, h: np.ndarray, state, boundary: str = "reflect"):
    """Adjoint of `wavedec`: band gradients ``[d lo_J, d hi_J, ..., d hi_1]`` -> ``(dx, dh)``."""
    hh, g = wavelet_qmf(h)
    fl, fh = hh[::-1], g[::-1]
    L = hh.shape[0]
    dfl = np.zeros_like(fl)
    dfh = np.zeros_like(fh)
    da = dbands[0]
    dhis = dbands[1:][::-1]  # d hi_1 ... d hi_J
    for lev in range(len(state) - 1, -1, -1):
        ap, lo_pad, hi_pad, _ = state[lev]
        big_p = ap.shape[1]
        dfl += _filter_grad(ap, da, L)
        dfh += _filter_grad(ap, dhis[lev], L)
        dap = _synthesis(da, fl, big_p) + _synthesis(dhis[lev], fh, big_p)
        da = _pad_vjp(dap, lo_pad, hi_pad, boundary)
    return da, _qmf_grad(dfl, dfh)


def _qmf_grad(dfl, dfh):
    """Map gradients of the correlation filters (flip(h), flip(g)) back to h."""
    dg = dfh[::-1]
    sign = np.where(np.arange(dg.shape[0]) % 2 == 0, -1.0, 1.0).astype(dg.dtype).reshape((-1,) + (1,) * (dg.ndim - 1))
    return dfl[::-1] + (sign * dg)[::-1]


def _rec_lengths(bands, n, h, level, boundary):
    """Per level (finest first) the pads and the length n_{l-1} the reconstruction crops to."""
    out, m = [], n
    for _ in range(level):
        lo_pad, hi_pad = _pads(m, h.shape[0], boundary)
        out.append((lo_pad, hi_pad, m))
        m = (m + lo_pad + hi_pad) // 2
    return out


def waverec(bands, h: np.ndarray, n: int, boundary: str = "reflect"):
    r"""Synthesis (upstream ``waverec`` and the final ``[:n]`` crop): ``bands -> (y (B, n, C), state)``."""
    hh, g = wavelet_qmf(h)
    fl, fh = hh[::-1], g[::-1]
    level = len(bands) - 1
    lens = _rec_lengths(bands, n, hh, level, boundary)
    a, st = bands[0], []
    for lev in range(level - 1, -1, -1):
        lo_pad, hi_pad, m = lens[lev]
        big_p = m + lo_pad + hi_pad
        hi = bands[level - lev]
        st.append((a, hi, lo_pad, m, big_p))
        a = (_synthesis(a, fl, big_p) + _synthesis(hi, fh, big_p))[:, lo_pad:lo_pad + m]
    return a, st


def waverec_vjp(dy, h: np.ndarray, state):
    """Adjoint of `waverec`: ``dy (B, n, C)`` -> ``(band gradients, dh)``."""
    hh, g = wavelet_qmf(h)
    fl, fh = hh[::-1], g[::-1]
    L = hh.shape[0]
    dfl = np.zeros_like(fl)
    dfh = np.zeros_like(fh)
    dbands_hi = []
    da = dy
    for a, hi, lo_pad, m, big_p in state[::-1]:  # finest level first
        dyp = np.zeros((da.shape[0], big_p, da.shape[2]), dtype=da.dtype)
        dyp[:, lo_pad:lo_pad + m] = da
        dfl += _filter_grad(dyp, a, L)  # y = synthesis(a, fl): dfl[m] = sum_j a[j] dy[(2j+m) mod P]
        dfh += _filter_grad(dyp, hi, L)
        dbands_hi.append(_analysis(dyp, fh))
        da = _analysis(dyp, fl)
    return [da] + dbands_hi[::-1], _qmf_grad(dfl, dfh)


def _validate(x, params, num_heads, level, boundary):
    x = as_float(x, "x", ndim=3)
    num_heads = check_int(num_heads, "num_heads", minimum=1)
    level = check_int(level, "level", minimum=1)
    check_choice(boundary, "boundary", WAVELET_BOUNDARIES)
    b, n, c = x.shape
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of arrays; got {type(params).__name__}")
    wl = np.shape(params.get("adawave", ()))
    if len(wl) != 2 or wl[0] % 2 or wl[0] < 2:
        raise ValueError(f"params['adawave'] must be (L, C) with an even filter length L >= 2; got {wl}")
    qk = np.shape(params.get("SelfAttention_0.query.kernel", ()))
    if len(qk) != 2 or qk[1] % num_heads:
        raise ValueError(f"params['SelfAttention_0.query.kernel'] must be (C, num_heads * head_dim) with "
                         f"num_heads={num_heads}; got {qk}")
    hd = qk[1]
    spec = {"adawave": (wl[0], c)}
    for i in range(level + 1):
        for nm in ("query", "key", "value"):
            spec[f"SelfAttention_{i}.{nm}.kernel"] = (c, hd)
        spec[f"SelfAttention_{i}.out.kernel"] = (hd, c)
    p = check_params(params, spec, where="wavspa_attention")
    m = n
    for lev in range(level):
        if boundary == "periodic" and m % 2:
            raise ValueError(f"boundary='periodic' needs an even length at every level; x has n={n} tokens (axis 1), "
                             f"level {lev + 1} sees {m}")
        if boundary == "reflect" and m <= (2 * wl[0] - 3) // 2 + m % 2:
            raise ValueError(f"boundary='reflect' needs more samples than the padding at every level; x has n={n} "
                             f"tokens (axis 1), level {lev + 1} sees {m} for a filter of length {wl[0]}")
        lo, hi = _pads(m, wl[0], boundary)
        m = (m + lo + hi) // 2
    dt = compute_dtype(x, *p.values())
    return x.astype(dt, copy=False), cast_all(dt, p), num_heads, level


def wavspa_attention_forward(x, params, *, num_heads: int, level: int = 1, boundary: str = "reflect"):
    r"""WavSpA attention: wavelet analysis along the sequence, one multi-head self-attention per
    coefficient band, wavelet synthesis (``WavspaBlock``'s attention part).

    Parameters
    ----------
    x : (B, n, C)
    params : dict
        ``adawave (L, C)`` (per-channel low-pass filter, even ``L``), and for every band
        ``i = 0..level``: ``SelfAttention_{i}.{query,key,value}.kernel (C, H d)``,
        ``SelfAttention_{i}.out.kernel (H d, C)``.
    num_heads : int
    level : int >= 1
        Decomposition levels $J$ ($J + 1$ bands).
    boundary : {"reflect", "zero", "periodic"}
        Signal extension before each level (module docstring).

    Returns
    -------
    out : (B, n, C), cache
    """
    x, p, h, level = _validate(x, params, num_heads, level, boundary)
    filt = p["adawave"]
    bands, dst = wavedec(x, filt, level, boundary)
    outs, cores = [], []
    for i, band in enumerate(bands):
        pre = f"SelfAttention_{i}"
        q, k, v = (split_heads(band @ p[f"{pre}.{nm}.kernel"], h) for nm in ("query", "key", "value"))
        ctx, core = attention_core_forward(q, k, v)
        merged = merge_heads(ctx)
        outs.append(merged @ p[f"{pre}.out.kernel"])
        cores.append((band, core, merged))
    y, rst = waverec(outs, filt, x.shape[1], boundary)
    cache = {"p": p, "h": h, "boundary": boundary, "dst": dst, "rst": rst, "cores": cores, "out_shape": y.shape,
             "dtype": x.dtype}
    return y, cache


def wavspa_attention_backward(dout, cache):
    r"""Gradients ``{"x"}`` and of every params key of `wavspa_attention_forward` (synthesis adjoint,
    attention VJPs per band, analysis adjoint; the filter gradient sums both transforms)."""
    p, h, boundary = cache["p"], cache["h"], cache["boundary"]
    g = as_dout(dout, cache["out_shape"], cache["dtype"])
    filt = p["adawave"]
    dbands_out, dh = waverec_vjp(g, filt, cache["rst"])
    grads = {}
    dbands = []
    for i, (band, core, merged) in enumerate(cache["cores"]):
        pre = f"SelfAttention_{i}"
        go = dbands_out[i]
        grads[f"{pre}.out.kernel"] = merged.reshape(-1, merged.shape[-1]).T @ go.reshape(-1, go.shape[-1])
        dcore = attention_core_backward(split_heads(go @ p[f"{pre}.out.kernel"].T, h), core)
        db = np.zeros_like(band)
        for nm, key in (("query", "q"), ("key", "k"), ("value", "v")):
            dm = merge_heads(dcore[key])
            grads[f"{pre}.{nm}.kernel"] = band.reshape(-1, band.shape[-1]).T @ dm.reshape(-1, dm.shape[-1])
            db = db + dm @ p[f"{pre}.{nm}.kernel"].T
        dbands.append(db)
    dx, dh2 = wavedec_vjp(dbands, filt, cache["dst"], boundary)
    grads["adawave"] = dh + dh2
    grads["x"] = dx
    return grads


def wavspa_attention(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of `wavspa_attention_forward`."""
    return wavspa_attention_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _level_matrices(n, hcol, boundary):
    """Explicit matrices of one level for one channel: pad (P x n), analysis lo/hi (P/2 x P) from the
    filter definitions, and the crop (n x P)."""
    L = hcol.shape[0]
    lo_pad, hi_pad = _pads(n, L, boundary)
    big_p = n + lo_pad + hi_pad
    pad = np.zeros((big_p, n))
    for t in range(big_p):
        s = t - lo_pad
        if 0 <= s < n:
            pad[t, s] = 1.0
        elif boundary == "reflect":
            pad[t, -s if s < 0 else 2 * (n - 1) - s] = 1.0
    g = np.array([(-1.0) ** (m + 1) * hcol[L - 1 - m] for m in range(L)])
    wl, wh = np.zeros((big_p // 2, big_p)), np.zeros((big_p // 2, big_p))
    for j in range(big_p // 2):
        for m in range(L):
            wl[j, (2 * j + m) % big_p] += hcol[L - 1 - m]
            wh[j, (2 * j + m) % big_p] += g[L - 1 - m]
    crop = np.zeros((n, big_p))
    crop[np.arange(n), lo_pad + np.arange(n)] = 1.0
    return pad, wl, wh, crop


def _reference(x, params, *, num_heads, level=1, boundary="reflect"):
    """Dense per-channel analysis/synthesis matrices (synthesis = crop . W^T) and per-band attention loops."""
    b, n, c = x.shape
    filt = params["adawave"]
    mats = []
    for ch in range(c):
        m, per = n, []
        for _ in range(level):
            per.append(_level_matrices(m, filt[:, ch], boundary))
            m = per[-1][1].shape[0]
        mats.append(per)

    def band_vectors(sig, ch):  # analysis of one channel's signal (B, n)
        a, his = sig, []
        for pad, wl, wh, _ in mats[ch]:
            ap = a @ pad.T
            his.append(ap @ wh.T)
            a = ap @ wl.T
        return [a] + his[::-1]

    bands = [np.stack(z, axis=-1) for z in zip(*[band_vectors(x[..., ch], ch) for ch in range(c)])]
    outs = []
    for i, band in enumerate(bands):
        pre = f"SelfAttention_{i}"
        q, k, v = (band @ params[f"{pre}.{nm}.kernel"] for nm in ("query", "key", "value"))
        d = q.shape[-1] // num_heads
        heads = []
        for hh in range(num_heads):
            sl = slice(hh * d, (hh + 1) * d)
            sc = q[..., sl] @ np.swapaxes(k[..., sl], 1, 2) / np.sqrt(d)
            w = np.exp(sc - sc.max(-1, keepdims=True))
            heads.append((w / w.sum(-1, keepdims=True)) @ v[..., sl])
        outs.append(np.concatenate(heads, -1) @ params[f"{pre}.out.kernel"])
    y = np.zeros((b, n, c))
    for ch in range(c):
        a = outs[0][..., ch]
        for lev in range(level - 1, -1, -1):
            _, wl, wh, crop = mats[ch][lev]
            a = (a @ wl + outs[level - lev][..., ch] @ wh) @ crop.T
        y[..., ch] = a
    return y


def _draw(rng, size, boundary=None, level=None, wlen=None):
    c, h = (4, 2) if size == "tiny" else (6, 2)
    boundary = WAVELET_BOUNDARIES[int(rng.integers(0, 3))] if boundary is None else boundary
    level = int(rng.integers(1, 3)) if level is None else level
    wlen = (4 if size == "tiny" else int((4, 6, 8)[rng.integers(0, 3)])) if wlen is None else wlen
    if boundary == "periodic":
        n = 4 if size == "tiny" else 4 * int(rng.integers(3, 5))
    else:
        n = int(rng.integers(5, 7)) if size == "tiny" else int(rng.integers(11, 17))
    filt = np.repeat(daubechies_filter(wlen // 2)[:, None], c, axis=1)
    params = {"adawave": filt + 0.05 * rng.standard_normal(filt.shape)}  # a learned (non-orthonormal) filter
    for i in range(level + 1):
        for nm in ("query", "key", "value"):
            params[f"SelfAttention_{i}.{nm}.kernel"] = rng.standard_normal((c, c)) / np.sqrt(c)
        params[f"SelfAttention_{i}.out.kernel"] = rng.standard_normal((c, c)) / np.sqrt(c)
    return Sample(inputs={"x": rng.standard_normal((2, n, c))}, params=params,
                  config={"num_heads": h, "level": level, "boundary": boundary})


def _sample(rng, size):
    return _draw(rng, size)


def _check_daubechies(rng):
    """db filters: sum sqrt 2, orthonormal under double shifts, p vanishing moments of g, and db2 equal to
    its closed form ((1+sqrt3), (3+sqrt3), (3-sqrt3), (1-sqrt3)) / (4 sqrt2) in pywt's (reversed) order."""
    s3 = np.sqrt(3.0)
    db2 = np.array([1 - s3, 3 - s3, 3 + s3, 1 + s3]) / (4 * np.sqrt(2.0))
    err = float(np.max(np.abs(daubechies_filter(2) - db2)))
    for p in range(1, 9):
        hh = daubechies_filter(p)
        _, g = wavelet_qmf(hh)
        err = max(err, abs(hh.sum() - np.sqrt(2.0)))
        for k in range(p):
            err = max(err, abs(float(np.sum(hh[2 * k:] * hh[:len(hh) - 2 * k]))) - (k == 0))
            err = max(err, abs(float(np.sum(g * np.arange(len(g)) ** k))) / len(g) ** k)
    assert err < 1e-9, f"Daubechies filter error {err}"
    return err


def _check_perfect_reconstruction(rng):
    """waverec(wavedec(x)) = x for orthonormal db filters, every boundary mode, 1-3 levels, odd and even n."""
    err = 0.0
    for p in (1, 2, 3):
        filt = np.repeat(daubechies_filter(p)[:, None], 3, axis=1)
        for boundary in WAVELET_BOUNDARIES:
            for level in (1, 2, 3):
                for n in ((24, 32) if boundary == "periodic" else (13, 16, 21)):
                    x = rng.standard_normal((2, n, 3))
                    bands, _ = wavedec(x, filt, level, boundary)
                    err = max(err, float(np.max(np.abs(waverec(bands, filt, n, boundary)[0] - x))))
    assert err < 1e-12, f"perfect reconstruction error {err}"
    return err


def _check_adjoints(rng):
    """<wavedec x, c> = <x, wavedec_vjp c> and <waverec c, y> = <c, waverec_vjp y> for every boundary mode
    (learned, non-orthonormal filter); with 'periodic' and an orthonormal filter waverec IS wavedec_vjp."""
    err = 0.0
    filt = daubechies_filter(3)[:, None] * np.ones((1, 2)) + 0.1 * rng.standard_normal((6, 2))
    for boundary in WAVELET_BOUNDARIES:
        n = 16 if boundary == "periodic" else 13
        x = rng.standard_normal((2, n, 2))
        bands, st = wavedec(x, filt, 2, boundary)
        cs = [rng.standard_normal(bnd.shape) for bnd in bands]
        lhs = sum(np.sum(bnd * cc) for bnd, cc in zip(bands, cs))
        rhs = np.sum(x * wavedec_vjp(cs, filt, st, boundary)[0])
        err = max(err, abs(lhs - rhs) / abs(lhs))
        y, rst = waverec(cs, filt, n, boundary)
        gy = rng.standard_normal(y.shape)
        lhs = np.sum(y * gy)
        rhs = sum(np.sum(cc * dd) for cc, dd in zip(cs, waverec_vjp(gy, filt, rst)[0]))
        err = max(err, abs(lhs - rhs) / abs(lhs))
    orth = np.repeat(daubechies_filter(2)[:, None], 2, axis=1)
    x = rng.standard_normal((2, 16, 2))
    bands, st = wavedec(x, orth, 2, "periodic")
    cs = [rng.standard_normal(bnd.shape) for bnd in bands]
    err = max(err, float(np.max(np.abs(waverec(cs, orth, 16, "periodic")[0] - wavedec_vjp(cs, orth, st, "periodic")[0]))))
    assert err < 1e-12, f"adjoint error {err}"
    return err


def _check_filter_gradients(rng):
    """The filter VJPs of wavedec and waverec against central differences (the learnable wavelet)."""
    filt = daubechies_filter(2)[:, None] * np.ones((1, 2)) + 0.1 * rng.standard_normal((4, 2))
    x = rng.standard_normal((2, 9, 2))
    bands, st = wavedec(x, filt, 2, "reflect")
    cs = [rng.standard_normal(bnd.shape) for bnd in bands]
    gy = rng.standard_normal(x.shape)
    dh_dec = wavedec_vjp(cs, filt, st, "reflect")[1]
    dh_rec = waverec_vjp(gy, filt, waverec(cs, filt, 9, "reflect")[1])[1]
    err, eps = 0.0, 1e-6
    for idx in np.ndindex(*filt.shape):
        fp, fm = filt.copy(), filt.copy()
        fp[idx] += eps
        fm[idx] -= eps
        fd_dec = sum(np.sum((a - b) * cc) for a, b, cc in zip(wavedec(x, fp, 2, "reflect")[0],
                                                             wavedec(x, fm, 2, "reflect")[0], cs)) / (2 * eps)
        fd_rec = np.sum((waverec(cs, fp, 9, "reflect")[0] - waverec(cs, fm, 9, "reflect")[0]) * gy) / (2 * eps)
        err = max(err, abs(fd_dec - dh_dec[idx]) / max(abs(fd_dec), 1.0), abs(fd_rec - dh_rec[idx]) / max(abs(fd_rec), 1.0))
    assert err < 1e-7, f"filter gradient error {err}"
    return err


register(
    Mechanism(
        slug="wavelet_space_attention", family="4-linear-kernel-sparse", tier="T2",
        title="WavSpA: attention in wavelet coefficient space",
        paper="Zhuang, Wang, Tao, Shang, 'WavSpA: Wavelet Space Attention for Boosting Transformers' Long "
              "Sequence Learning Ability', 2022, arXiv 2210.01989",
        official_code="EvanZhuang/wavspa",
        forward=wavspa_attention_forward, backward=wavspa_attention_backward, sample=_sample, reference=_reference,
        checks={"daubechies_filters": _check_daubechies,
                "perfect_reconstruction_every_boundary": _check_perfect_reconstruction,
                "analysis_and_synthesis_adjoints": _check_adjoints,
                "filter_gradients_vs_fd": _check_filter_gradients},
        docs="linear/low-rank-and-structured.md#wavspa-wavelet-space-attention",
    ),
)
