r"""Local-window attention schedules: CLEAR's circular image windows (with its optional pooled-key
branch) and MASFormer's band (sliding-window) layers.

Shared derivation: both are softmax attention under a fixed boolean keep-mask (plus, for CLEAR's
downsample variant, extra keys and values that are a learned weighted pooling of the image keys and
values), so the backward is the masked-softmax attention VJP of
`refattn.attention.softmax.attention_core_backward` followed by the pooling's adjoint. The masks are
selections held fixed (not differentiated); they are tested against brute-force loops.

CLEAR (``clear_attention_*``)
-----------------------------
Paper: Liu, Tan, Yu, Wang, "CLEAR: Conv-Like Linearization Revs Pre-Trained Diffusion Transformers
Up", 2024, arXiv 2412.16112. Upstream: Huage001/CLEAR ``attention_processor.py``
(``init_local_mask_flex`` / ``LocalFlexAttnProcessor`` and ``init_local_downsample_mask_flex`` /
``LocalDownsampleFlexAttnProcessor``) @98e9fed2b8a776a043a0421100db9831879de784.

Tokens are ``[text (T), image (H*W row-major)]`` (MM-DiT: the text stream is concatenated first).
Query $i$ may read key $j$ iff

$$\mathrm{keep}_{ij} = [i < T] \lor [j < T] \lor \big[(y_i - y_j)^2 + (x_i - x_j)^2 < r^2\big],$$

with $(y, x)$ the pixel of an image token (a strict inequality, as upstream): text attends
everything, everything attends text, image tokens attend a disc of radius $r$. With
``down_factor`` $f$ (``H``, ``W`` multiples of $f$) the keys and values get $(H/f)(W/f)$ extra
entries, a weighted pooling of each $f\times f$ cell of the image keys/values with one learned
$f\times f$ weight ``params["spatial_weight"]`` (upstream shape ``(1, 1, 1, f, 1, f, 1)``, here
``(f, f)``; initialised $1/f^2$):

$$\tilde K_{c} = \sum_{a,b<f} w_{ab}\,K_{(c_y f + a,\ c_x f + b)},\qquad \tilde V_c \text{ likewise};$$

image queries attend all pooled entries, text queries none. Upstream slices the image part as
``key[:, :, 512:]`` (FLUX's 512 text tokens); here it starts at ``text_length``.
Scores are scaled by $1/\sqrt d$, or by upstream's "proportional attention" scale
$\sqrt{\log_{L_{\text{train}}}(10 M)/d}$ (`clear_proportional_scale`, $L_{\text{train}} = 64^2 +
512$, $M$ the number of image-and-text keys) passed as ``scale``.

Backward: with $G_K, G_V$ the attention VJP's key/value gradients, split into the token part and
the pooled part $G_{\tilde K}, G_{\tilde V}$:
$\bar K_{(c_yf+a, c_xf+b)} \mathrel{+}= w_{ab}\,G_{\tilde K,c}$ (the pooling's adjoint) and
$\bar w_{ab} = \sum_c \langle G_{\tilde K,c}, K_{(c_yf+a,c_xf+b)}\rangle + \langle G_{\tilde V,c},
V_{(c_yf+a,c_xf+b)}\rangle$.

MASFormer (``band_attention_*``)
--------------------------------
Paper: Zhang, Ram, Hawkins, Zha, Zhao, "Efficient Long-Range Transformers: You Need to Attend More,
but Not Necessarily at Every Layer", Findings of EMNLP 2023, arXiv 2310.12442 (no public code).
A small set of layers use full causal attention, the rest sliding-window (band) attention of
window $w$. The layer schedule is the caller's (a list of layers); the band layer is
(**reconstruction**: the paper's sparse layers are a causal sliding window; the exact window
convention is ours) $\mathrm{keep}_{ij} = [0 \le i - j < w]$ (causal) or $[|i - j| < w]$
(``causal=False``). ``window=None`` is the full causal layer.

Measured agreement with upstream: see ``docs/linear/local-and-deformable.md#local-window-attention-variants``.
"""

from __future__ import annotations

import math

import numpy as np

from ..._checks import as_float, check_int, check_params, check_positive, compute_dtype
from ...registry import Mechanism, Sample, register
from ..softmax.core import attention_core_backward, attention_core_forward

__all__ = ["clear_keep_mask", "clear_proportional_scale", "clear_attention_forward", "clear_attention_backward",
           "clear_attention", "band_keep_mask", "band_attention_forward", "band_attention_backward"]

CLEAR_TRAIN_SEQ_LEN = 64 ** 2 + 512


def clear_keep_mask(height: int, width: int, text_length: int, radius: float, down_factor=None) -> np.ndarray:
    """CLEAR's boolean keep-mask ``(N, N + n_pooled)``, N = text_length + height*width (module docstring)."""
    h, w = check_int(height, "height", minimum=1), check_int(width, "width", minimum=1)
    t = check_int(text_length, "text_length", minimum=0)
    r = check_positive(radius, "radius")
    yy, xx = np.divmod(np.arange(h * w), w)
    near = (yy[:, None] - yy[None, :]) ** 2 + (xx[:, None] - xx[None, :]) ** 2 < r * r
    n = t + h * w
    keep = np.ones((n, n), dtype=bool)
    keep[t:, t:] = near
    if down_factor is None:
        return keep
    f = _check_factor(down_factor, h, w)
    pooled = np.zeros((n, (h // f) * (w // f)), dtype=bool)
    pooled[t:] = True
    return np.concatenate([keep, pooled], axis=1)


def clear_proportional_scale(n_keys: int, head_dim: int, train_seq_len: int = CLEAR_TRAIN_SEQ_LEN) -> float:
    r"""Upstream's ``proportional_attention`` scale $\sqrt{\log_{L}(10 M) / d}$."""
    m = check_int(n_keys, "n_keys", minimum=1)
    d = check_int(head_dim, "head_dim", minimum=1)
    lt = check_int(train_seq_len, "train_seq_len", minimum=2)
    return math.sqrt(math.log(10 * m, lt) / d)


def _check_factor(down_factor, h, w):
    f = check_int(down_factor, "down_factor", minimum=1)
    if h % f or w % f:
        raise ValueError(f"down_factor={f} must divide height={h} and width={w}")
    return f


def _pool(x, wgt, t, h, w, f):
    """Weighted f x f cell pooling of the image rows of ``x (B, Hd, N, d)`` -> (B, Hd, (h/f)(w/f), d)."""
    b, hd, _, d = x.shape
    x6 = x[:, :, t:].reshape(b, hd, h // f, f, w // f, f, d)
    return np.einsum("bhyaxcd,ac->bhyxd", x6, wgt).reshape(b, hd, -1, d)


def _pool_vjp(g, x, wgt, t, h, w, f):
    """Adjoint of `_pool`: (gradient into x's image rows (B, Hd, h*w, d), gradient of the weight)."""
    b, hd, _, d = x.shape
    g5 = g.reshape(b, hd, h // f, w // f, d)
    x6 = x[:, :, t:].reshape(b, hd, h // f, f, w // f, f, d)
    dx = np.einsum("bhyxd,ac->bhyaxcd", g5, wgt).reshape(b, hd, h * w, d)
    return dx, np.einsum("bhyaxcd,bhyxd->ac", x6, g5)


def clear_attention_forward(q, k, v, params=None, *, height: int, width: int, radius: float, text_length: int = 0,
                            down_factor=None, scale=None):
    r"""CLEAR local attention (``LocalFlexAttnProcessor``; with ``down_factor`` the
    ``LocalDownsampleFlexAttnProcessor`` pooled branch).

    Parameters
    ----------
    q, k, v : (B, heads, N, d), N = text_length + height*width, text tokens first
    params : dict, optional
        ``{"spatial_weight": (f, f)}``, required with ``down_factor``.
    height, width : image token grid
    radius : float > 0
        Image tokens attend image tokens at Euclidean pixel distance $< r$.
    text_length : int
    down_factor : int, optional
        Pooled-key branch cell size $f$.
    scale : float, optional
        Default $1/\sqrt d$; `clear_proportional_scale` gives upstream's proportional scale.

    Returns
    -------
    out (B, heads, N, d), cache
    """
    q = as_float(q, "q", ndim=4)
    k = as_float(k, "k", ndim=4)
    v = as_float(v, "v", ndim=4)
    h, w = check_int(height, "height", minimum=1), check_int(width, "width", minimum=1)
    t = check_int(text_length, "text_length", minimum=0)
    if q.shape[2] != t + h * w or k.shape != q.shape or v.shape[:3] != q.shape[:3]:
        raise ValueError(f"q, k, v must be (B, heads, text_length + height*width = {t + h * w}, d) with equal "
                         f"shapes; got {q.shape}, {k.shape}, {v.shape}")
    keep = clear_keep_mask(h, w, t, radius, down_factor)
    if scale is not None:
        scale = check_positive(scale, "scale")
    f = None
    if down_factor is None:
        if params:
            raise ValueError(f"params must be None or empty without down_factor; got keys {sorted(params)}")
        dt = compute_dtype(q, k, v)
        wgt = None
    else:
        f = _check_factor(down_factor, h, w)
        p = check_params(params, {"spatial_weight": (f, f)}, where="clear_attention")
        dt = compute_dtype(q, k, v, p["spatial_weight"])
        wgt = p["spatial_weight"].astype(dt, copy=False)
    q, k, v = (a.astype(dt, copy=False) for a in (q, k, v))
    ke, ve = k, v
    if f is not None:
        ke = np.concatenate([k, _pool(k, wgt, t, h, w, f)], axis=2)
        ve = np.concatenate([v, _pool(v, wgt, t, h, w, f)], axis=2)
    out, core = attention_core_forward(q, ke, ve, attn_mask=keep, scale=scale)
    cache = {"core": core, "k": k, "v": v, "w": wgt, "geom": (t, h, w, f)}
    return out.copy(), cache


def clear_attention_backward(dout, cache):
    """Gradients ``{"q", "k", "v"}`` (and ``"spatial_weight"``) of `clear_attention_forward`."""
    g = attention_core_backward(dout, cache["core"])
    t, h, w, f = cache["geom"]
    n = cache["k"].shape[2]
    dq, dk, dv = g["q"], g["k"][:, :, :n].copy(), g["v"][:, :, :n].copy()
    if f is None:
        return {"q": dq, "k": dk, "v": dv}
    dk_img, dwk = _pool_vjp(g["k"][:, :, n:], cache["k"], cache["w"], t, h, w, f)
    dv_img, dwv = _pool_vjp(g["v"][:, :, n:], cache["v"], cache["w"], t, h, w, f)
    dk[:, :, t:] += dk_img
    dv[:, :, t:] += dv_img
    return {"q": dq, "k": dk, "v": dv, "spatial_weight": dwk + dwv}


def clear_attention(q, k, v, params=None, **config) -> np.ndarray:
    """Convenience wrapper: the output of `clear_attention_forward`."""
    return clear_attention_forward(q, k, v, params, **config)[0]


def band_keep_mask(n: int, window=None, causal: bool = True) -> np.ndarray:
    """MASFormer band keep-mask ``(n, n)``: ``0 <= i - j < window`` (causal) or ``|i - j| < window``;
    ``window=None`` is full (causal) attention."""
    n = check_int(n, "n", minimum=1)
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be a bool; got {type(causal).__name__}")
    d = np.arange(n)[:, None] - np.arange(n)[None, :]
    keep = d >= 0 if causal else np.ones((n, n), dtype=bool)
    if window is not None:
        wnd = check_int(window, "window", minimum=1)
        keep = keep & (np.abs(d) < wnd)
    return keep


def band_attention_forward(q, k, v, *, window=None, causal: bool = True, scale=None):
    r"""MASFormer's band (sliding-window) attention layer; ``window=None`` is its full causal layer.
    ``q, k, v (B, heads, N, d)``. Returns ``out``, cache."""
    q = as_float(q, "q", ndim=4)
    keep = band_keep_mask(q.shape[2], window, causal)
    if scale is not None:
        scale = check_positive(scale, "scale")
    out, core = attention_core_forward(q, k, v, attn_mask=keep, scale=scale)
    return out.copy(), {"core": core}


def band_attention_backward(dout, cache):
    """Gradients ``{"q", "k", "v"}`` of `band_attention_forward`."""
    return attention_core_backward(dout, cache["core"])


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size):
    if size == "tiny":
        h, w, t, f, d, r = 2, 4, 1, 2, 2, 1.5
    else:
        h, w, t, f, d, r = 4, 6, 3, 2, 4, 2.3
    n = t + h * w
    heads = 1 if size == "tiny" else 2
    inputs = {x: rng.standard_normal((2, heads, n, d)) for x in ("q", "k", "v")}
    params = {"spatial_weight": 1.0 / f ** 2 + 0.2 * rng.standard_normal((f, f))}
    return Sample(inputs=inputs, params=params, config={"height": h, "width": w, "text_length": t, "radius": r,
                                                        "down_factor": f})


def _reference(q, k, v, params=None, *, height, width, radius, text_length=0, down_factor=None, scale=None):
    # Every query on its own: the allowed keys by explicit loops, pooled cells by explicit sums.
    t, h, w, f = text_length, height, width, down_factor
    b, hd, n, d = q.shape
    s = 1 / np.sqrt(d) if scale is None else scale
    out = np.zeros_like(q)
    for bi in range(b):
        for hi in range(hd):
            keys, vals, pos = [], [], []
            for j in range(n):
                keys.append(k[bi, hi, j])
                vals.append(v[bi, hi, j])
                pos.append(("tok", j))
            if f is not None:
                for cy in range(h // f):
                    for cx in range(w // f):
                        kk, vv = np.zeros(d), np.zeros(d)
                        for a in range(f):
                            for c in range(f):
                                j = t + (cy * f + a) * w + cx * f + c
                                kk += params["spatial_weight"][a, c] * k[bi, hi, j]
                                vv += params["spatial_weight"][a, c] * v[bi, hi, j]
                        keys.append(kk)
                        vals.append(vv)
                        pos.append(("pool", None))
            for i in range(n):
                allowed = []
                for idx, (kind, j) in enumerate(pos):
                    if kind == "pool":
                        ok = i >= t
                    elif i < t or j < t:
                        ok = True
                    else:
                        (yi, xi), (yj, xj) = divmod(i - t, w), divmod(j - t, w)
                        ok = (yi - yj) ** 2 + (xi - xj) ** 2 < radius ** 2
                    if ok:
                        allowed.append(idx)
                sc = np.array([s * q[bi, hi, i] @ keys[a] for a in allowed])
                wts = np.exp(sc - sc.max())
                out[bi, hi, i] = sum(wt * vals[a] for wt, a in zip(wts / wts.sum(), allowed))
    return out


def _check_clear_mask_brute_force(rng):
    h, w, t, r = int(rng.integers(2, 6)), int(rng.integers(2, 6)), int(rng.integers(0, 3)), float(rng.uniform(1, 3))
    keep = clear_keep_mask(h, w, t, r)
    for i in range(t + h * w):
        for j in range(t + h * w):
            near = i < t or j < t or math.hypot((i - t) // w - (j - t) // w, (i - t) % w - (j - t) % w) < r
            assert keep[i, j] == near, f"CLEAR mask wrong at ({i}, {j})"
    return 0.0


def _check_clear_flop_fraction(rng):
    # Kept image pairs = sum over lattice offsets in the disc of (H - |dy|)(W - |dx|) exactly; the kept
    # fraction is ~ pi r^2 / N (CLEAR's cost claim) up to the lattice and border corrections.
    h = w = 40
    r = float(rng.uniform(3, 5))
    keep = clear_keep_mask(h, w, 0, r)
    exact = sum((h - abs(dy)) * (w - abs(dx)) for dy in range(-5, 6) for dx in range(-5, 6) if dy * dy + dx * dx < r * r)
    assert keep.sum() == exact, f"kept pairs {keep.sum()} != lattice count {exact}"
    rel = abs(keep.mean() / (math.pi * r * r / (h * w)) - 1)
    assert rel < 0.35, f"kept fraction {keep.mean():.4f} far from pi r^2 / N"
    return rel


def _check_band_mask_and_fd(rng):
    from ._samples import fd_max_rel
    n, wnd = 6, int(rng.integers(1, 4))
    keep = band_keep_mask(n, wnd)
    for i in range(n):
        for j in range(n):
            assert keep[i, j] == (j <= i and i - j < wnd), "band mask wrong"
    smp = Sample(inputs={x: rng.standard_normal((2, 1, n, 2)) for x in ("q", "k", "v")},
                 config={"window": wnd})
    return fd_max_rel(band_attention_forward, band_attention_backward, smp)


def _check_band_wide_window_is_causal(rng):
    q, k, v = (rng.standard_normal((2, 2, 5, 3)) for _ in range(3))
    a = band_attention_forward(q, k, v, window=5)[0]
    b = band_attention_forward(q, k, v, window=None)[0]
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(3) + np.where(np.tril(np.ones((5, 5))) > 0, 0.0, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    ref = (p / p.sum(-1, keepdims=True)) @ v
    err = float(max(np.max(np.abs(a - ref)), np.max(np.abs(b - ref))))
    assert err < 1e-12, f"band(window >= N) differs from causal attention by {err:.2e}"
    return err


def _check_uniform_pool_is_average(rng):
    # With the initial weight 1/f^2 the pooled keys are f x f average pools of the image keys.
    k = rng.standard_normal((2, 1, 1 + 16, 3))
    pooled = _pool(k, np.full((2, 2), 0.25), 1, 4, 4, 2)
    img = k[:, :, 1:].reshape(2, 1, 4, 4, 3)
    ref = 0.25 * (img[:, :, ::2, ::2] + img[:, :, 1::2, ::2] + img[:, :, ::2, 1::2] + img[:, :, 1::2, 1::2])
    err = float(np.max(np.abs(pooled - ref.reshape(2, 1, 4, 3))))
    assert err < 1e-14, f"uniform pooling is not the average pool ({err:.2e})"
    return err


register(
    Mechanism(
        slug="local_window_attention_variants", family="4-linear-kernel-sparse", tier="T2",
        title="Local/sliding-window attention schedules: MASFormer mixed spans, CLEAR circular windows",
        paper="Liu, Tan, Yu, Wang, 'CLEAR: Conv-Like Linearization Revs Pre-Trained Diffusion Transformers Up', "
              "2024, arXiv 2412.16112; Zhang, Ram, Hawkins, Zha, Zhao, 'Efficient Long-Range Transformers: You "
              "Need to Attend More, but Not Necessarily at Every Layer' (MASFormer), Findings of EMNLP 2023, "
              "arXiv 2310.12442",
        forward=clear_attention_forward, backward=clear_attention_backward, sample=_sample, reference=_reference,
        checks={"clear_mask_brute_force": _check_clear_mask_brute_force,
                "clear_kept_fraction_pi_r2_over_n": _check_clear_flop_fraction,
                "band_mask_brute_force_and_fd": _check_band_mask_and_fd,
                "band_wide_window_is_causal": _check_band_wide_window_is_causal,
                "uniform_spatial_weight_is_average_pool": _check_uniform_pool_is_average},
        docs="linear/local-and-deformable.md#local-window-attention-variants",
        notes="the masks are fixed selections (not differentiated); MASFormer's band window convention is a "
              "reconstruction (no public code)",
    ),
)
