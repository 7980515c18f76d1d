r"""Laughing Hyena: a Hyena long convolution in modal (diagonal SSM) form, computed either by FFT
convolution with the filter the modes generate or by the $O(1)$-per-token modal recurrence.

Massaroli, Poli, Fu, Kumbong, Parnichkun, Timalsina, Romero, McIntyre, Chen, Rudra, Zhang, Ré,
Ermon, Bengio, "Laughing Hyena Distillery: Extracting Compact Recurrences From Convolutions",
NeurIPS 2023, arXiv 2310.18780. The catalogue lists no official code; the modal Hyena filter the
same authors ship is ``ParallelHyenaFilter`` (with ``HyenaInferenceEngine.parallel_iir`` /
``step_iir`` / ``prefill_via_direct_recurrence``) in
``togethercomputer/stripedhyena stripedhyena/model.py`` and ``stripedhyena/engine.py``
@7e13f618027fea9625be1f2d2d94f9a361f6bd02, which this module follows (and was run against in
float64). The distillation procedure itself (fitting poles/residues to a trained filter) is a
training recipe, not a layer, and is not provided.

Forward
-------
Input $u\in\mathbb R^{B\times L\times 3D}$. A causal depthwise FIR of length $k$
(``short_filter_weight`` $(3D,1,k)$, ``short_filter_bias``) gives $z$; $z$ is split into
$x^2, x^1, v$ (``column_split=True``: per head of size $d_h = D/H$ the channels
$[x^2_h, x^1_h, v_h]$, upstream's ``column_split_hyena``; ``False``: three contiguous blocks).
The modal filter of system $g$ with poles $\lambda_{g,n} = a + ib$ and residues
$R_{g,n}$ (``poles``/``residues`` $(G, S, 1, 2)$, last axis real/imag) is

$$h_{g,t} = \mathrm{Re}\sum_{n=1}^{S} R_{g,n}\,\lambda_{g,n}^{\,t},\qquad t = 0,\dots,L-1,$$

channel $d$ using system $\lfloor d\,G/D\rfloor$ ($G = D$: one system per channel; $G = 1$: one
shared). With $w = x^1\odot v$:

$$y = \bigl(h * w + D\odot w\bigr)\odot x^2,\qquad (h*w)_t = \sum_{s\le t}h_{t-s}w_s$$

(FFT convolution with padding to $2L$, ``causal_fft_conv`` of `refattn.attention.linear.hyena`).
Equivalently, the modal recurrence (``step_iir``): $s_t = \lambda\odot s_{t-1} + w_t$,
$y_t = x^2_t\,(\mathrm{Re}(R^\top s_t) + D\,w_t)$ (:func:`modal_ssm_recurrent`), which is the
"distilled" $O(S)$-per-token generation form.

Backward
--------
$dq = dy\odot x^2$ for $q = h*w + Dw$; $dx^2 = dy\odot q$; $dw = T(h)^\top dq + D\,dq$,
$dh_{g,m} = \sum_{b,t,d\in g} dq_t w_{t-m}$ (the FFT correlation of ``causal_fft_conv_vjp``),
$dD = \sum_{b,t}dq\odot w$; $dx^1 = dw\odot v$, $dv = dw\odot x^1$. Modes (real parameters,
written as complex numbers $d(\cdot) = d\mathrm{Re} + i\,d\mathrm{Im}$):
$dR_n = \sum_t dh_t\,\overline{\lambda_n^{t}}$ and $d\lambda_n = \sum_t dh_t\,\overline{R_n\,t\,\lambda_n^{t-1}}$
(since $\partial_a\mathrm{Re}(R\lambda^t) = \mathrm{Re}(Rt\lambda^{t-1})$ and
$\partial_b\mathrm{Re}(R\lambda^t) = -\mathrm{Im}(Rt\lambda^{t-1})$). Then the FIR's conv VJP.

Conventions
-----------
Upstream's: poles and residues are free complex numbers stored as real pairs (no
$\sigma(\rho)e^{i\theta}$ reparameterisation), $h$ starts at $t=0$ with $\lambda^0 = 1$ and the
skip weight $D$ is separate (the paper's $\hat h_0 = D$, $\hat h_t = \sum R\lambda^{t-1}$ is the same
family: $R_{code} = R_{paper}/\lambda$, $D_{code} = D_{paper} - \mathrm{Re}\sum R_{code}$). The FIR bias
is added after the convolution, as upstream. Keywords: ``num_heads`` (upstream
``num_attention_heads``; default 1), ``column_split`` (default True). Upstream computes the
filter and FFT in float32 (complex64); here the input dtype is kept.

Measured agreement with upstream (float64, CPU: stripedhyena's ``ParallelHyenaFilter`` run
with its ``float32``/``complex64`` casts textually replaced by ``float64``/``complex128``,
parameters copied, stable random poles): $D=8$, $L=24$, 3 modes, batch 2. Per-channel systems
($G=D$, 2 heads, column split): output max abs 8.2e-14 (rel 8.7e-16), all six gradients max rel
1.2e-15. One shared system ($G=1$, 1 head): output rel 3.8e-16, gradients max rel 7.6e-16.
The recurrence (:func:`modal_ssm_recurrent`) agrees with upstream's FFT output to 7.6e-14 abs.
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, check_int
from ...nn.conv import conv_apply, conv_vjp
from ...registry import Mechanism, Sample, register
from ._samples import fd_max_rel
from .hyena import causal_fft_conv, causal_fft_conv_vjp
from .rpe_fft import toeplitz_dense

__all__ = [
    "modal_filter",
    "modal_filter_vjp",
    "modal_ssm_recurrent",
    "laughing_hyena_forward",
    "laughing_hyena_backward",
    "laughing_hyena",
]


def _complex(pair: np.ndarray) -> np.ndarray:
    return pair[..., 0, 0] + 1j * pair[..., 0, 1]


def modal_filter(poles: np.ndarray, residues: np.ndarray, L: int) -> np.ndarray:
    r"""$h_{g,t} = \mathrm{Re}\sum_n R_{g,n}\lambda_{g,n}^t$ ``(G, L)`` from ``(G, S, 1, 2)`` pairs."""
    lam, R = _complex(poles), _complex(residues)
    powers = lam[..., None] ** np.arange(L)
    return np.real(np.sum(R[..., None] * powers, axis=1))


def modal_filter_vjp(dh: np.ndarray, poles: np.ndarray, residues: np.ndarray):
    """Gradients ``(dpoles, dresidues)`` (shape ``(G, S, 1, 2)``) of :func:`modal_filter`."""
    L = dh.shape[-1]
    lam, R = _complex(poles), _complex(residues)
    t = np.arange(L)
    powers = lam[..., None] ** t
    dR = np.sum(dh[:, None, :] * np.conj(powers), axis=-1)
    deriv = np.zeros_like(powers)
    deriv[..., 1:] = t[1:] * powers[..., :-1]
    dlam = np.sum(dh[:, None, :] * np.conj(R[..., None] * deriv), axis=-1)

    def pair(c):
        return np.stack([c.real, c.imag], axis=-1)[:, :, None, :]

    return pair(dlam), pair(dR)


def _split(z, D, num_heads, column_split):
    B, _, L = z.shape
    if column_split:
        hd = D // num_heads
        zz = z.reshape(B, num_heads, 3 * hd, L)
        return [zz[:, :, i * hd:(i + 1) * hd].reshape(B, D, L) for i in range(3)]
    return [z[:, i * D:(i + 1) * D] for i in range(3)]


def _merge(parts, num_heads, column_split):
    B, D, L = parts[0].shape
    if column_split:
        hd = D // num_heads
        return np.concatenate([p.reshape(B, num_heads, hd, L) for p in parts], axis=2).reshape(B, 3 * D, L)
    return np.concatenate(parts, axis=1)


def _validate(u, params, num_heads, column_split):
    u = as_float(u, "u", ndim=3)
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of arrays, got {type(params).__name__}")
    num_heads = check_int(num_heads, "num_heads", minimum=1)
    if not isinstance(column_split, (bool, np.bool_)):
        raise TypeError(f"column_split must be a bool, got {type(column_split).__name__}")
    C = u.shape[-1]
    if C % 3:
        raise ValueError(f"u must have 3*hidden_size features (x2, x1, v), got {C}")
    D = C // 3
    if D % num_heads:
        raise ValueError(f"hidden_size={D} (u features / 3) must be divisible by num_heads={num_heads}")
    for key in ("short_filter_weight", "short_filter_bias", "D", "poles", "residues"):
        if key not in params:
            raise ValueError(f"params is missing {key!r}")
    p = {key: as_float(val, key) for key, val in params.items()}
    sw = p["short_filter_weight"].shape
    if len(sw) != 3 or sw[:2] != (C, 1):
        raise ValueError(f"params['short_filter_weight'] must have shape ({C}, 1, k); got {sw}")
    for key, shape in (("short_filter_bias", (C,)), ("D", (D,))):
        if p[key].shape != shape:
            raise ValueError(f"params[{key!r}] must have shape {shape}; got {p[key].shape}")
    ps = p["poles"].shape
    if len(ps) != 4 or ps[2:] != (1, 2) or ps[0] not in (1, D):
        raise ValueError(f"params['poles'] must have shape (G, state_size, 1, 2) with G in (1, {D}); got {ps}")
    if p["residues"].shape != ps:
        raise ValueError(f"params['residues'] must have the shape of params['poles'] {ps}; got {p['residues'].shape}")
    return u, p, D


def laughing_hyena_forward(u, params, *, num_heads: int = 1, column_split: bool = True):
    r"""Modal Hyena filter (stripedhyena ``ParallelHyenaFilter.parallel_forward``) on
    ``u (B, L, 3D)``; returns ``(y (B, L, D), cache)``. See the module docstring."""
    u, p, D = _validate(u, params, num_heads, column_split)
    dt = u.dtype
    p = {key: val.astype(dt, copy=False) for key, val in p.items()}
    B, L, C = u.shape
    k = p["short_filter_weight"].shape[-1]
    uT = np.swapaxes(u, 1, 2)
    z = conv_apply(uT, p["short_filter_weight"], None, padding=k - 1, groups=C)[..., :L]
    z = z + p["short_filter_bias"][None, :, None]
    x2, x1, v = _split(z, D, num_heads, column_split)
    w = x1 * v
    hg = modal_filter(p["poles"], p["residues"], L).astype(dt, copy=False)
    h = np.repeat(hg, D // hg.shape[0], axis=0)
    q = causal_fft_conv(h, w) + p["D"][None, :, None] * w
    y = np.swapaxes(q * x2, 1, 2)
    cache = {"p": p, "uT": uT, "x2": x2, "x1": x1, "v": v, "w": w, "h": h, "q": q, "D": D,
             "num_heads": num_heads, "column_split": column_split, "shape": y.shape, "dtype": dt}
    return y.copy(), cache


def laughing_hyena_backward(dout, cache) -> dict:
    """Gradients of :func:`laughing_hyena_forward` w.r.t. ``u`` and every parameter."""
    dt = cache["dtype"]
    dout = as_dout(dout, cache["shape"], dt)
    p, D = cache["p"], cache["D"]
    dy = np.swapaxes(dout, 1, 2)
    dx2 = dy * cache["q"]
    dq = dy * cache["x2"]
    w = cache["w"]
    dh, dw = causal_fft_conv_vjp(dq, cache["h"], w)
    dw = dw + p["D"][None, :, None] * dq
    dD = np.sum(dq * w, axis=(0, 2))
    G = p["poles"].shape[0]
    dhg = dh.reshape(G, D // G, -1).sum(axis=1)
    dpoles, dres = modal_filter_vjp(dhg, p["poles"], p["residues"])
    dz = _merge([dx2, dw * cache["v"], dw * cache["x1"]], cache["num_heads"], cache["column_split"])
    k = p["short_filter_weight"].shape[-1]
    dfull = np.concatenate([dz, np.zeros(dz.shape[:2] + (k - 1,), dtype=dz.dtype)], axis=-1)
    cg = conv_vjp(dfull, cache["uT"], p["short_filter_weight"], padding=k - 1, groups=dz.shape[1],
                  has_bias=False)
    grads = {"u": np.swapaxes(cg["x"], 1, 2), "short_filter_weight": cg["weight"],
             "short_filter_bias": dz.sum(axis=(0, 2)), "D": dD, "poles": dpoles, "residues": dres}
    return {key: np.asarray(val, dtype=dt) for key, val in grads.items()}


def laughing_hyena(u, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`laughing_hyena_forward`."""
    return laughing_hyena_forward(u, params, **config)[0]


def modal_ssm_recurrent(u, params, *, num_heads: int = 1, column_split: bool = True) -> np.ndarray:
    r"""The same layer by the modal recurrence, one token at a time (upstream ``step_fir`` +
    ``step_iir``): $s_t = \lambda\odot s_{t-1} + w_t$, $y_t = x^2_t(\mathrm{Re}(R^\top s_t) + Dw_t)$.
    Forward only (the generation path); it equals :func:`laughing_hyena_forward`."""
    u, p, D = _validate(u, params, num_heads, column_split)
    B, L, C = u.shape
    wgt, k = p["short_filter_weight"][:, 0], p["short_filter_weight"].shape[-1]
    lam = np.repeat(_complex(p["poles"]), D // p["poles"].shape[0], axis=0)
    R = np.repeat(_complex(p["residues"]), D // p["poles"].shape[0], axis=0)
    fir = np.zeros((B, C, k - 1), dtype=u.dtype)
    s = np.zeros((B, D, lam.shape[-1]), dtype=np.result_type(u.dtype, np.complex64))
    out = np.empty((B, L, D), dtype=u.dtype)
    for t in range(L):
        zt = wgt[:, -1] * u[:, t] + np.sum(fir * wgt[:, :-1], axis=-1) + p["short_filter_bias"]
        fir = np.concatenate([fir[..., 1:], u[:, t, :, None]], axis=-1)
        x2, x1, v = (a[..., 0] for a in _split(zt[..., None], D, num_heads, column_split))
        w = x1 * v
        s = lam * s + w[..., None]
        out[:, t] = x2 * (np.real(np.sum(R * s, axis=-1)) + p["D"] * w)
    return out


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _lh_reference(u, params, *, num_heads=1, column_split=True):
    """Explicit form: the modal filter by an explicit double sum over modes and times, the long
    convolution as a dense lower-triangular Toeplitz matrix, the FIR as a direct sum."""
    B, L, C = u.shape
    D = C // 3
    wgt, k = params["short_filter_weight"][:, 0], params["short_filter_weight"].shape[-1]
    z = np.zeros((B, C, L)) + params["short_filter_bias"][None, :, None]
    for t in range(L):
        for j in range(k):
            s = t - k + 1 + j
            if s >= 0:
                z[:, :, t] += wgt[:, j] * u[:, s]
    x2, x1, v = _split(z, D, num_heads, column_split)
    P, Rs = params["poles"], params["residues"]
    G, S = P.shape[:2]
    hg = np.zeros((G, L))
    for g in range(G):
        for n in range(S):
            lam = complex(P[g, n, 0, 0], P[g, n, 0, 1])
            r = complex(Rs[g, n, 0, 0], Rs[g, n, 0, 1])
            for t in range(L):
                hg[g, t] += (r * lam ** t).real
    h = np.repeat(hg, D // G, axis=0)
    T = np.tril(toeplitz_dense(np.concatenate([h[:, ::-1], np.zeros((D, L - 1))], axis=-1)))
    w = x1 * v
    q = np.einsum("dts,bds->bdt", T, w) + params["D"][None, :, None] * w
    return np.swapaxes(q * x2, 1, 2)


def _lh_params(rng, D, S, G, k=3):
    ang = rng.uniform(0.2, 2.5, (G, S))
    rad = rng.uniform(0.5, 0.95, (G, S))
    poles = np.stack([rad * np.cos(ang), rad * np.sin(ang)], axis=-1)[:, :, None, :]
    return {"short_filter_weight": rng.standard_normal((3 * D, 1, k)) / np.sqrt(k),
            "short_filter_bias": 0.3 * rng.standard_normal(3 * D),
            "D": rng.standard_normal(D), "poles": poles,
            "residues": rng.standard_normal((G, S, 1, 2))}


def _sample_lh(rng, size):
    if size == "tiny":
        D, S, L, H = 2, 2, 5, 1
    else:
        D, S, L, H = 4, 3, 11, 2
    G = D if rng.integers(0, 2) else 1
    u = rng.standard_normal((2, L, 3 * D))
    return Sample(inputs={"u": u}, params=_lh_params(rng, D, S, G),
                  config={"num_heads": H, "column_split": bool(rng.integers(0, 2))})


def _check_lh_recurrence_equals_fft(rng):
    errs = []
    for H, cs, G in ((1, True, 4), (2, True, 1), (2, False, 4)):
        p = _lh_params(rng, 4, 3, G)
        u = rng.standard_normal((2, 13, 12))
        a = laughing_hyena(u, p, num_heads=H, column_split=cs)
        b = modal_ssm_recurrent(u, p, num_heads=H, column_split=cs)
        errs.append(float(np.max(np.abs(a - b))))
    assert max(errs) < 1e-12, errs
    return max(errs)


def _check_lh_modal_filter_grad(rng):
    """FD on the modal filter alone, including poles outside the unit disc (growing modes)."""
    poles = rng.standard_normal((3, 2, 1, 2)) * 0.8
    res = rng.standard_normal((3, 2, 1, 2))
    g = rng.standard_normal((3, 7))
    dp, dr = modal_filter_vjp(g, poles, res)
    eps, errs = 1e-6, []
    for arr, dgrad in ((poles, dp), (res, dr)):
        for idx in np.ndindex(arr.shape):
            a1, a2 = arr.copy(), arr.copy()
            a1[idx] += eps
            a2[idx] -= eps
            args1 = (a1, res) if arr is poles else (poles, a1)
            args2 = (a2, res) if arr is poles else (poles, a2)
            fd = np.sum(g * (modal_filter(*args1, 7) - modal_filter(*args2, 7))) / (2 * eps)
            errs.append(abs(fd - dgrad[idx]) / max(1.0, abs(fd)))
    assert max(errs) < 1e-7, max(errs)
    return max(errs)


def _check_lh_fd_variants(rng):
    errs = []
    for cs, G in ((False, 1), (True, 2)):
        p = _lh_params(rng, 2, 2, G)
        s = Sample(inputs={"u": rng.standard_normal((2, 4, 6))}, params=p,
                   config={"num_heads": 2, "column_split": cs})
        errs.append(fd_max_rel(laughing_hyena_forward, laughing_hyena_backward, s))
    assert max(errs) < 1e-6, errs
    return max(errs)


register(
    Mechanism(
        slug="laughing_hyena_modal_ssm", family="4-linear-kernel-sparse", tier="T2",
        title="Laughing Hyena: distilling long convolutions into modal SSMs",
        paper="Massaroli, Poli, Fu, Kumbong, Parnichkun, Timalsina, Romero, McIntyre, Chen, Rudra, Zhang, Ré, "
              "Ermon, Bengio, 'Laughing Hyena Distillery: Extracting Compact Recurrences From Convolutions', "
              "NeurIPS 2023, arXiv 2310.18780",
        official_code="togethercomputer/stripedhyena stripedhyena/model.py, stripedhyena/engine.py"
                      "@7e13f618027fea9625be1f2d2d94f9a361f6bd02",
        forward=laughing_hyena_forward, backward=laughing_hyena_backward, sample=_sample_lh,
        reference=_lh_reference,
        checks={"recurrence_equals_fft_convolution": _check_lh_recurrence_equals_fft,
                "modal_filter_gradcheck": _check_lh_modal_filter_grad,
                "gradcheck_variants": _check_lh_fd_variants},
        docs="linear/long-convolutions-and-memory.md#laughing-hyena-modal-ssm",
    ),
)
