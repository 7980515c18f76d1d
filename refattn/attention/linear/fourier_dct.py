r"""Fourier Transformer: DCT-based sequence truncation before softmax attention.

He, Yang, Feng, Yin, Wang, Leng, Lin, "Fourier Transformer: Fast Long Range Modeling by
Removing Sequence Redundancy with FFT Operator", Findings of ACL 2023, arXiv 2305.15099. Follows
LUMIA-Group/FourierTransformer ``LRA/code/attention_dct.py`` (``dct``, ``idct``, ``DCTAttention``),
``LRA/code/attention.py`` (``Attention``) and ``LRA/code/model.py`` (``Transformer``: the residual)
@``cba1dc229b2faa0f24e5d22cea85f13eb4990097``.

The orthonormal DCT
-------------------
$\mathrm{DCT}_L(x)_k = w_k\sum_{n<L}x_n\cos\frac{\pi(2n+1)k}{2L}$, $w_0 = \sqrt{1/L}$,
$w_{k>0} = \sqrt{2/L}$ (DCT-II, ``norm='ortho'``). `dct_ortho` computes it with one length-$L$ FFT
(Makhoul's reordering $v = [x_0, x_2, x_4, \dots, x_5, x_3, x_1]$,
$C_k = \mathrm{Re}(e^{-i\pi k/2L}\,\mathrm{FFT}(v)_k)$), as the upstream ``dct``; `idct_ortho`
inverts it (DCT-III) with one inverse FFT of $V_k = e^{i\pi k/2L}(C_k - iC_{L-k})$ and the inverse
reordering, as the upstream ``idct``. The matrix $D_L$ of the orthonormal DCT is orthogonal, so

$$D_L^{-1} = D_L^\top:\qquad \text{VJP of } \mathrm{DCT}_L = \mathrm{IDCT}_L,\qquad
\text{VJP of } \mathrm{IDCT}_L = \mathrm{DCT}_L.$$

Forward (one layer)
-------------------
For $X\in\mathbb R^{T\times C}$ (``pooling_mode="CLS"`` sets the first token aside; its $L = T-1$
others are transformed) and a keep ratio $r$ (``dct_percentage``), $L' = \min(\lceil rT\rceil, L)$
($T$ counts the CLS token, as upstream):

$$X_s = \mathrm{IDCT}_{L'}\big(\mathrm{DCT}_L(X)[:L']\big)\quad\text{(along the sequence axis)},\qquad
X_s \leftarrow [X_{\rm CLS}; X_s],$$
$$Y = X_s + \mathrm{MHA}(X_s)\quad(\texttt{residual=True}),$$

with $\mathrm{MHA}$ the ``Attention`` layer (``W_q``, ``W_k``, ``W_v``, ``ff``; softmax scaled by
$d^{-1/2}$). The output has $L'$ (+1) tokens: the sequence shrinks layer by layer. The truncated
transform keeps the $L'$ lowest-frequency coefficients and re-synthesises them on a grid of $L'$
points: for a smooth signal $f$ sampled at the $L$ cell centres, $X_s \approx \sqrt{L/L'}\,f$ at
the $L'$ coarse cell centres (named check).

Backward
--------
Let $G_s$ be the gradient reaching $X_s$ (residual plus the attention layer's input gradients). Then
$dX = \mathrm{IDCT}_L\big(\mathrm{pad}_L(\mathrm{DCT}_{L'}(G_s))\big)$ (zero-pad the $L'$
coefficients to $L$) on the transformed tokens and $dX_{\rm CLS} = G_{s,0}$. The attention layer's
VJP is `refattn.attention.softmax.core.attention_core_backward` and the projections' VJPs.

Approximation rate
------------------
The truncation is exact for signals in the span of the first $L'$ cosines and drops the rest. For a
smooth signal whose even extension is only $C^0$ at the ends ($f'(0)\ne 0$ or $f'(1)\ne0$) the
coefficients decay as $k^{-2}$, so the reconstruction error at full length,
$\|x - \mathrm{IDCT}_L(\mathrm{pad}(\mathrm{DCT}_L(x)[:L']))\|$, falls like $L'^{-3/2}$ (named check;
a periodic-smooth signal decays faster) — the "sequence redundancy" the paper removes.

Conventions
-----------
``dct_percentage`` default 0.2 (the LRA configs' ``dct-0.2``); ``pooling_mode`` ``"CLS"`` (LRA
default; any other value transforms every token); ``residual`` (the block adds $X_s$, the
truncated input, not $X$); attention dropout and the padding mask (upstream: "not applicable
anymore") are not used. Parameter names as ``Attention``: ``W_q.weight (C, H d)`` (torch
``weight.T``) and ``.bias``, likewise ``W_k``, ``W_v``, and ``ff.weight (H d, C)``, ``ff.bias``.

Agreement with upstream: ``Attention`` (with ``DCTAttention``, ``dct``, ``idct``) run from the
repository files in float64 on CPU (upstream casts the input to float32 with ``X.float()``; that cast
was removed for the comparison), plus ``Transformer``'s residual, 12 configurations (CLS and mean
pooling, $r\in\{0.2, 0.5, 1\}$, two sizes): output 2.2e-15, every gradient <= 2.2e-15 relative
(the ``W_k.bias`` gradient is analytically zero: round-off on both sides); the upstream
``dct``/``idct`` equal ``scipy.fft.dct``/``idct(norm='ortho')`` to 5.6e-16.
"""

from __future__ import annotations

import math

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_int, check_params, check_positive, compute_dtype
from ...nn.linear import linear_prefixed, linear_prefixed_spec, linear_prefixed_vjp, merge_heads, split_heads
from ...registry import Mechanism, Sample, register
from ..softmax.core import attention_core_backward, attention_core_forward

__all__ = ["dct_ortho", "idct_ortho", "dct_truncate", "dct_truncate_vjp", "fourier_dct_attention_forward",
           "fourier_dct_attention_backward", "fourier_dct_attention"]

_PROJ = ("W_q", "W_k", "W_v", "ff")


def dct_ortho(x: np.ndarray, axis: int = -1) -> np.ndarray:
    r"""Orthonormal DCT-II along ``axis`` with one FFT (Makhoul; module docstring). Unvalidated."""
    x = np.moveaxis(x, axis, -1)
    n = x.shape[-1]
    v = np.concatenate([x[..., ::2], x[..., 1::2][..., ::-1]], axis=-1)
    c = np.real(np.fft.fft(v, axis=-1) * np.exp(-1j * np.pi * np.arange(n) / (2 * n)))
    w = np.full(n, np.sqrt(2.0 / n))
    w[0] = np.sqrt(1.0 / n)
    return np.moveaxis((c * w).astype(x.dtype, copy=False), -1, axis)


def idct_ortho(y: np.ndarray, axis: int = -1) -> np.ndarray:
    r"""Inverse of `dct_ortho` (orthonormal DCT-III) along ``axis`` with one inverse FFT. Unvalidated."""
    y = np.moveaxis(y, axis, -1)
    n = y.shape[-1]
    w = np.full(n, np.sqrt(n / 2.0))
    w[0] = np.sqrt(float(n))
    c = y * w  # unnormalised C_k
    c_rev = np.concatenate([np.zeros_like(c[..., :1]), c[..., :0:-1]], axis=-1)  # C_{n-k}, C_n = 0
    vk = (c - 1j * c_rev) * np.exp(1j * np.pi * np.arange(n) / (2 * n))
    v = np.real(np.fft.ifft(vk, axis=-1))
    x = np.empty_like(y)
    half = n - n // 2
    x[..., ::2] = v[..., :half]
    x[..., 1::2] = v[..., half:][..., ::-1]
    return np.moveaxis(x.astype(y.dtype, copy=False), -1, axis)


def dct_truncate(x: np.ndarray, keep: int, axis: int = -2) -> np.ndarray:
    r"""$\mathrm{IDCT}_{L'}(\mathrm{DCT}_L(x)[:L'])$ along ``axis`` with $L'$ = ``keep`` (at most $L$)."""
    c = dct_ortho(x, axis)
    return idct_ortho(np.take(c, np.arange(keep), axis=axis), axis)


def dct_truncate_vjp(g: np.ndarray, length: int, axis: int = -2) -> np.ndarray:
    r"""VJP of `dct_truncate` back to ``length`` $= L$: $\mathrm{IDCT}_L(\mathrm{pad}_L(\mathrm{DCT}_{L'}(g)))$."""
    c = dct_ortho(g, axis)
    pad = [(0, 0)] * g.ndim
    pad[axis] = (0, length - g.shape[axis])
    return idct_ortho(np.pad(c, pad), axis)


def _validate(x, params, num_heads, dct_percentage, pooling_mode, residual):
    x = as_float(x, "x", ndim=3)
    num_heads = check_int(num_heads, "num_heads", minimum=1)
    r = check_positive(dct_percentage, "dct_percentage")
    if r > 1:
        raise ValueError(f"dct_percentage must be in (0, 1]; got {dct_percentage!r}")
    if not isinstance(pooling_mode, str):
        raise TypeError(f"pooling_mode must be a string ('CLS' or another pooling name); got {type(pooling_mode).__name__}")
    if not isinstance(residual, (bool, np.bool_)):
        raise TypeError(f"residual must be a bool; got {type(residual).__name__}")
    cls = pooling_mode == "CLS"
    if x.shape[1] < (2 if cls else 1):
        raise ValueError(f"x needs at least {2 if cls else 1} tokens (axis 1) with pooling_mode={pooling_mode!r}; "
                         f"got {x.shape[1]}")
    c = x.shape[-1]
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of arrays; got {type(params).__name__}")
    wq = np.shape(params.get("W_q.weight", ()))
    if len(wq) != 2 or wq[1] % num_heads:
        raise ValueError(f"params['W_q.weight'] must be (C, num_heads * head_dim) with num_heads={num_heads}; got {wq}")
    hd = wq[1]
    spec = {**linear_prefixed_spec("W_q", c, hd), **linear_prefixed_spec("W_k", c, hd),
            **linear_prefixed_spec("W_v", c, hd), **linear_prefixed_spec("ff", hd, c)}
    p = check_params(params, spec, optional=[f"{n}.bias" for n in _PROJ], where="fourier_dct_attention")
    dt = compute_dtype(x, *p.values())
    return x.astype(dt, copy=False), cast_all(dt, p), num_heads, r, cls


def fourier_dct_attention_forward(x, params, *, num_heads: int, dct_percentage: float = 0.2,
                                  pooling_mode: str = "CLS", residual: bool = True):
    r"""One Fourier Transformer attention layer: DCT truncation of the sequence, then softmax
    multi-head attention on the shortened sequence (upstream ``DCTAttention`` + ``Attention``), plus
    the truncated input (``Transformer``'s residual).

    Parameters
    ----------
    x : (B, T, C)
        The (layer-normalised) tokens; with ``pooling_mode="CLS"`` token 0 is the CLS token.
    params : dict
        ``W_q/W_k/W_v.weight (C, H d)`` (torch ``weight.T``), ``ff.weight (H d, C)``, optional
        ``.bias`` for each.
    num_heads : int
    dct_percentage : float in (0, 1]
        $r$: keep $L' = \min(\lceil rT\rceil, L)$ coefficients.
    pooling_mode : str
        ``"CLS"`` keeps token 0 out of the transform; anything else transforms all tokens.
    residual : bool
        Return $X_s + \mathrm{MHA}(X_s)$ (default) or $\mathrm{MHA}(X_s)$.

    Returns
    -------
    out : (B, L' (+1), C), cache
    """
    x, p, h, r, cls = _validate(x, params, num_heads, dct_percentage, pooling_mode, residual)
    t = x.shape[1]
    body = x[:, 1:] if cls else x
    length = body.shape[1]
    keep = min(math.ceil(t * r), length)
    xs = dct_truncate(body, keep, axis=1)
    if cls:
        xs = np.concatenate([x[:, :1], xs], axis=1)
    q, k, v = (split_heads(linear_prefixed(p, nm, xs), h) for nm in ("W_q", "W_k", "W_v"))
    ctx, core = attention_core_forward(q, k, v)
    merged = merge_heads(ctx)
    out = linear_prefixed(p, "ff", merged)
    if residual:
        out = out + xs
    cache = {"p": p, "h": h, "xs": xs, "core": core, "merged": merged, "cls": cls, "length": length,
             "residual": bool(residual), "out_shape": out.shape, "x_shape": x.shape, "dtype": x.dtype}
    return out, cache


def fourier_dct_attention_backward(dout, cache):
    r"""Gradients ``{"x"}`` and of every params key of `fourier_dct_attention_forward`: attention and
    projection VJPs, then the truncation's adjoint $\mathrm{IDCT}_L\,\mathrm{pad}\,\mathrm{DCT}_{L'}$."""
    p, h, xs = cache["p"], cache["h"], cache["xs"]
    g = as_dout(dout, cache["out_shape"], cache["dtype"])
    grads: dict = {}
    dmerged = linear_prefixed_vjp(grads, p, "ff", g, cache["merged"])
    dcore = attention_core_backward(split_heads(dmerged, h), cache["core"])
    dxs = g.copy() if cache["residual"] else np.zeros_like(g)
    for nm, key in (("W_q", "q"), ("W_k", "k"), ("W_v", "v")):
        dxs = dxs + linear_prefixed_vjp(grads, p, nm, merge_heads(dcore[key]), xs)
    dx = np.zeros(cache["x_shape"], dtype=cache["dtype"])
    if cache["cls"]:
        dx[:, :1] = dxs[:, :1]
        dx[:, 1:] = dct_truncate_vjp(dxs[:, 1:], cache["length"], axis=1)
    else:
        dx[:] = dct_truncate_vjp(dxs, cache["length"], axis=1)
    grads["x"] = dx
    return grads


def fourier_dct_attention(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of `fourier_dct_attention_forward`."""
    return fourier_dct_attention_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _dct_matrix(n):
    """The explicit orthonormal DCT-II matrix (rows k, columns n)."""
    k, m = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    d = np.sqrt(2.0 / n) * np.cos(np.pi * (2 * m + 1) * k / (2 * n))
    d[0] /= np.sqrt(2.0)
    return d


def _reference(x, params, *, num_heads, dct_percentage=0.2, pooling_mode="CLS", residual=True):
    """Explicit $L'\\times L$ truncation matrix $D_{L'}^\\top[I_{L'}\\,0]D_L$ and per-head loops."""
    b, t, c = x.shape
    cls = pooling_mode == "CLS"
    body = x[:, 1:] if cls else x
    length = body.shape[1]
    keep = min(math.ceil(t * dct_percentage), length)
    m = _dct_matrix(keep).T @ _dct_matrix(length)[:keep]
    xs = np.einsum("kn,bnc->bkc", m, body)
    if cls:
        xs = np.concatenate([x[:, :1], xs], axis=1)

    def lin(nm, a):
        out = a @ params[f"{nm}.weight"]
        return out + params[f"{nm}.bias"] if f"{nm}.bias" in params else out

    q, k, v = lin("W_q", xs), lin("W_k", xs), lin("W_v", xs)
    d = q.shape[-1] // num_heads
    heads = []
    for hh in range(num_heads):
        sl = slice(hh * d, (hh + 1) * d)
        sc = q[..., sl] @ np.swapaxes(k[..., sl], 1, 2) / np.sqrt(d)
        w = np.exp(sc - sc.max(-1, keepdims=True))
        heads.append((w / w.sum(-1, keepdims=True)) @ v[..., sl])
    out = lin("ff", np.concatenate(heads, axis=-1))
    return out + xs if residual else out


def _draw(rng, size, pooling_mode=None, ratio=None, residual=None):
    t = int(rng.integers(5, 8)) if size == "tiny" else int(rng.integers(12, 20))
    c, h = (4, 2) if size == "tiny" else (8, 2)
    pooling_mode = ("CLS", "MEAN")[int(rng.integers(0, 2))] if pooling_mode is None else pooling_mode
    ratio = float((0.2, 0.5, 1.0)[int(rng.integers(0, 3))]) if ratio is None else ratio
    residual = bool(rng.integers(0, 2)) if residual is None else residual
    params = {}
    for nm, (a, bdim) in {"W_q": (c, c), "W_k": (c, c), "W_v": (c, c), "ff": (c, c)}.items():
        params[f"{nm}.weight"] = rng.standard_normal((a, bdim)) / np.sqrt(a)
        params[f"{nm}.bias"] = 0.1 * rng.standard_normal(bdim)
    return Sample(inputs={"x": rng.standard_normal((2, t, c))}, params=params,
                  config={"num_heads": h, "dct_percentage": ratio, "pooling_mode": pooling_mode, "residual": residual})


def _sample(rng, size):
    return _draw(rng, size)


def _check_dct_vs_scipy(rng):
    """`dct_ortho`/`idct_ortho` equal scipy.fft.dct/idct(type 2, norm='ortho') for odd and even lengths,
    along any axis, and invert each other."""
    import scipy.fft

    err = 0.0
    for n in (1, 2, 5, 8, 13):
        x = rng.standard_normal((3, n, 2))
        err = max(err, float(np.max(np.abs(dct_ortho(x, 1) - scipy.fft.dct(x, type=2, norm="ortho", axis=1)))))
        err = max(err, float(np.max(np.abs(idct_ortho(x, 1) - scipy.fft.idct(x, type=2, norm="ortho", axis=1)))))
        err = max(err, float(np.max(np.abs(idct_ortho(dct_ortho(x, 1), 1) - x))))
    assert err < 1e-13, f"DCT differs from scipy: {err}"
    return err


def _check_adjoint(rng):
    """<T x, y> = <x, T* y> for the truncation T and its VJP (an exact adjoint, not the inverse)."""
    err = 0.0
    for n, keep in ((9, 3), (8, 8), (7, 1)):
        x, y = rng.standard_normal((2, n, 3)), rng.standard_normal((2, keep, 3))
        lhs = np.sum(dct_truncate(x, keep, axis=1) * y)
        rhs = np.sum(x * dct_truncate_vjp(y, n, axis=1))
        err = max(err, abs(lhs - rhs) / max(abs(lhs), 1.0))
    assert err < 1e-13, f"truncation adjoint error {err}"
    return err


def _check_full_ratio_identity(rng):
    """r = 1 keeps every coefficient: the sequence is unchanged and the layer is plain attention + x."""
    s = _draw(rng, "small", ratio=1.0, residual=True)
    x = s.inputs["x"]
    a = fourier_dct_attention(x, s.params, **s.config)
    b = fourier_dct_attention_forward(x, s.params, **s.config)[1]["xs"]
    err = float(np.max(np.abs(b - x)))
    assert a.shape == x.shape and err < 1e-13, f"r = 1 changes the sequence by {err}"
    return err


def _check_truncation_rate(rng):
    """Smooth non-periodic input f(t) = exp(t) + t^2 (f'(1) != 0): the reconstruction error at full
    length after keeping L' of L = 512 coefficients falls like L'^{-3/2} (log-log slope in [-1.7, -1.3]),
    and the truncated sequence is sqrt(L/L') f at the coarse cell centres (error -> 0 as L' grows)."""
    n = 512
    tt = (np.arange(n) + 0.5) / n
    f = np.exp(tt) + tt ** 2
    keeps = np.array([8, 16, 32, 64, 128])
    errs = [np.linalg.norm(f - idct_ortho(np.pad(dct_ortho(f)[:kk], (0, n - kk)))) for kk in keeps]
    slope = float(np.polyfit(np.log(keeps), np.log(errs), 1)[0])
    resample = []
    for kk in keeps:
        tc = (np.arange(kk) + 0.5) / kk
        xs = dct_truncate(f[:, None], int(kk), axis=0)[:, 0]
        resample.append(np.max(np.abs(xs / np.sqrt(n / kk) - (np.exp(tc) + tc ** 2))))
    assert -1.7 <= slope <= -1.3, f"truncation error slope {slope} (errors {errs}); expected about -3/2"
    assert all(b < a for a, b in zip(resample, resample[1:])) and resample[-1] < 2e-2, resample
    return abs(slope + 1.5)


register(
    Mechanism(
        slug="fourier_transformer_dct", family="4-linear-kernel-sparse", tier="T2",
        title="Fourier Transformer: DCT-based sequence truncation before attention",
        paper="He, Yang, Feng, Yin, Wang, Leng, Lin, 'Fourier Transformer: Fast Long Range Modeling by "
              "Removing Sequence Redundancy with FFT Operator', Findings of ACL 2023, arXiv 2305.15099",
        forward=fourier_dct_attention_forward, backward=fourier_dct_attention_backward, sample=_sample,
        reference=_reference,
        checks={"dct_equals_scipy_ortho": _check_dct_vs_scipy,
                "truncation_adjoint": _check_adjoint,
                "ratio_one_keeps_sequence": _check_full_ratio_identity,
                "truncation_error_rate_and_resampling": _check_truncation_rate},
        docs="linear/low-rank-and-structured.md#fourier-transformer-dct",
    ),
)
