r"""2Mamba: second-order (squared-score) linear attention with a softplus decay mask and softmax-style
normalisation; the recurrent (state-space) form equals the explicit masked $O(N^2)$ form.

Mongaras & Larson, "2Mamba2Furious: Linear in Complexity, Competitive in Accuracy", 2026,
arXiv 2602.17363. Official code read: ``gmongaras/2Mamba2Furious``
``GPT_Trainer/LlamaDecoderLayerClean.py`` (``LlamaAttention`` with the paper's configuration
``squared__sm_norm__A_mask_type_neg_softplus__in_conv_k_2``; the explicit path ``forwrd_gated``,
the recurrent inference path, and the Triton kernel ``kernel/_2Mamba2Furious_square.py`` it
calls in training) @7ad98b5dde9e729563fbabf82454b4fa3fdbc39f.

Forward (the 2Mamba layer, $x\in\mathbb R^{B\times N\times C}$, $H$ heads of width $d$)
-----------------------------------------------------------------------------------------
1. $[q, k, v] = \mathrm{cconv}(xW_{qkv} + b_{qkv})$ (``qkv_proj``, bias optional: Llama's
   ``attention_bias=False``), where $\mathrm{cconv}$ is the causal depthwise convolution of
   ``causal_conv1d_fn`` over time (``conv1d.weight (3Hd, 1, w)``, $w=2$, with bias): output $t$
   reads inputs $t-w+1..t$ (zeros before the start). No activation on $q,k$; no positional
   encoding (NoPE); no value discretisation.
2. Decay: $a_{t} = -\mathrm{softplus}(x_tW_A + b_A)\in\mathbb R^H$ (``A_mask_proj``), and per head

$$w_{ts} = \Big(\frac{q_t\cdot k_s}{\sqrt d}\Big)^2 \exp\Big(\sum_{r=s+1}^{t}a_r\Big)\,[s\le t],\qquad
y_t = \frac{\sum_s w_{ts}v_s}{\sum_s w_{ts}}\quad(\text{"sm\_norm"}).$$

3. Heads merged, $o = yW_o (+b_o)$ (``o_proj``).

Upstream's explicit form builds $\exp(A^{cum}_t - A^{cum}_s)$ with $A^{cum}$ the cumulative sum of
$a$ (masked to $-\infty$ above the diagonal); the Triton kernel computes the same with base-2
exponentials of $A^{cum}\log_2 e$ and a running max (a stability rescaling that cancels in the
ratio). A row whose denominator is exactly 0 (every $q_t\cdot k_s = 0$) outputs
$\sum_{s\le t}v_s$ upstream, with no gradient to $q,k,a$; refattn does the same.

Recurrent form (what refattn computes)
--------------------------------------
With the second-order feature map $\phi(x) = \mathrm{vec}(xx^\top)/\sqrt d\in\mathbb R^{d^2}$
(upstream's ``kron``), $(q\cdot k)^2/d = \phi(q)\cdot\phi(k)$, and with $\lambda_t = e^{a_t}$:

$$S_t = \lambda_tS_{t-1} + \phi(k_t)v_t^\top,\quad z_t = \lambda_tz_{t-1} + \phi(k_t),\quad
y_t = \frac{S_t^\top\phi(q_t)}{z_t\cdot\phi(q_t)},$$

$S_0 = 0$, $z_0 = 0$: $O(Nd^2d_v)$ time, the states of every step stored for the backward. It
equals the explicit form to round-off (registry reference; ``recurrent_equals_explicit`` check in
forward and all gradients).

Backward (reverse scan)
-----------------------
$n_t = S_t^\top\phi(q_t)$, $\delta_t = z_t\cdot\phi(q_t)$: $\bar n_t = \bar y_t/\delta_t$,
$\bar\delta_t = -\bar y_t\cdot y_t/\delta_t$, $\overline{\phi(q_t)} = S_t\bar n_t + z_t\bar\delta_t$.
State adjoints, $G_{N+1}=0$, $g_{N+1}=0$: $G_t = \phi(q_t)\bar n_t^\top + \lambda_{t+1}G_{t+1}$,
$g_t = \phi(q_t)\bar\delta_t + \lambda_{t+1}g_{t+1}$; then $\overline{\phi(k_t)} = G_tv_t + g_t$,
$\bar v_t = G_t^\top\phi(k_t)$, $\bar\lambda_t = \langle G_t, S_{t-1}\rangle + g_t\cdot z_{t-1}$,
$\bar a_t = \lambda_t\bar\lambda_t$, and through $a = -\mathrm{softplus}(h)$: $\bar h = -\bar a\,\sigma(h)$.
Feature map: $\bar x = (M + M^\top)x/\sqrt d$ with $M$ the $d\times d$ reshape of $\bar\phi$. Then
the causal conv VJP (`refattn.nn.conv.conv_vjp`) and the linear VJPs.

Measured agreement with upstream (float64 CPU): upstream ``LlamaAttention`` built with the 2Mamba
configuration and run through its own explicit path (``use_kernel=False`` -> ``forwrd_gated``;
the Triton kernel needs CUDA), with ``causal_conv1d_fn`` supplied by a torch transcription
(``F.conv1d`` after $w-1$ left zeros), the ``transformers``/Triton/``mamba_ssm`` imports stubbed
(unused on that path) and the path's two ``.float()`` casts (of $A$ and $v$) dropped for the
float64 run; $C=12$, $H=3$, $d=4$, $N=19$, batch 2, all weights copied: without projection
biases output max abs error 5.9e-14 (rel 2.0e-14), gradients of ``x`` and every parameter max
rel 3.9e-13; with biases 1.1e-14 (rel 5.4e-15) and 1.6e-14.

Conventions: ``num_heads`` is required (upstream ``num_key_value_heads == num_attention_heads``
in every 2Mamba run; grouped KV is not supported by its explicit path); the conv kernel width
is read from ``conv1d.weight``; projection biases optional (present key = used). The softplus is
exact ($\log(1+e^h)$; torch switches to $h$ above 20, a 2e-9 difference there). The other
configurations of the file (power 1, ``exp`` = 2Mamba-E, ``output_norm``, value
discretisation, RoPE, D residual, z gate) are not provided.
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_int, check_params
from ...nn.activations import sigmoid
from ...nn.conv import conv_apply, conv_vjp
from ...nn.linear import linear_prefixed, linear_prefixed_spec, linear_prefixed_vjp
from ...registry import Mechanism, Sample, register
from ._samples import fd_max_rel

__all__ = [
    "second_order_features",
    "second_order_features_vjp",
    "two_mamba_scan_forward",
    "two_mamba_scan_backward",
    "two_mamba_explicit",
    "two_mamba_forward",
    "two_mamba_backward",
    "two_mamba",
]


def second_order_features(x: np.ndarray) -> np.ndarray:
    r"""$\phi(x) = \mathrm{vec}(xx^\top)/\sqrt d$ on the last axis (``(..., d) -> (..., d*d)``)."""
    d = x.shape[-1]
    return (x[..., :, None] * x[..., None, :]).reshape(x.shape[:-1] + (d * d,)) / float(np.sqrt(d))


def second_order_features_vjp(dphi: np.ndarray, x: np.ndarray) -> np.ndarray:
    r"""$\bar x = (M + M^\top)x/\sqrt d$, $M$ = ``dphi`` reshaped to ``(..., d, d)``."""
    d = x.shape[-1]
    M = dphi.reshape(dphi.shape[:-1] + (d, d))
    return ((M + np.swapaxes(M, -1, -2)) @ x[..., None])[..., 0] / float(np.sqrt(d))


def two_mamba_scan_forward(q, k, v, a):
    r"""The recurrent 2Mamba core on ``q, k (B, H, N, d)``, ``v (B, H, N, dv)`` and log-decays
    ``a (B, H, N)`` ($\le 0$ in the layer, any real here). Returns ``(y (B, H, N, dv), cache)``."""
    q = as_float(q, "q", ndim=4)
    k = as_float(k, "k", ndim=4)
    v = as_float(v, "v", ndim=4)
    a = as_float(a, "a", ndim=3)
    if k.shape != q.shape:
        raise ValueError(f"k must have q's shape {q.shape}; got {k.shape}")
    if v.shape[:3] != q.shape[:3]:
        raise ValueError(f"v must have shape {q.shape[:3]} + (dv,); got {v.shape}")
    if a.shape != q.shape[:3]:
        raise ValueError(f"a must have shape {q.shape[:3]}; got {a.shape}")
    dt = np.result_type(q, k, v, a)
    q, k, v, a = (t.astype(dt, copy=False) for t in (q, k, v, a))
    y, cache = _scan(q, k, v, a)
    cache.update(dtype=dt, shape=y.shape)
    return y, cache


def _scan(q, k, v, a):
    B, H, N, d = q.shape
    fq, fk = second_order_features(q), second_order_features(k)
    lam = np.exp(a)
    S = np.zeros((B, H, N + 1, d * d, v.shape[-1]), dtype=q.dtype)
    z = np.zeros((B, H, N + 1, d * d), dtype=q.dtype)
    for t in range(N):
        S[:, :, t + 1] = lam[:, :, t, None, None] * S[:, :, t] + fk[:, :, t, :, None] * v[:, :, t, None, :]
        z[:, :, t + 1] = lam[:, :, t, None] * z[:, :, t] + fk[:, :, t]
    num = np.einsum("bhtf,bhtfe->bhte", fq, S[:, :, 1:])
    den = np.einsum("bhtf,bhtf->bht", fq, z[:, :, 1:])
    zero = den == 0
    safe = np.where(zero, 1.0, den)
    y = np.where(zero[..., None], np.cumsum(v, axis=2), num / safe[..., None])
    return y, {"q": q, "k": k, "v": v, "fq": fq, "fk": fk, "lam": lam, "S": S, "z": z, "den": safe, "zero": zero,
               "y": y}


def _scan_backward(dy, c):
    q, k, v, fq, fk, lam, S, z = c["q"], c["k"], c["v"], c["fq"], c["fk"], c["lam"], c["S"], c["z"]
    keep = ~c["zero"]
    dnum = np.where(keep[..., None], dy / c["den"][..., None], 0.0)
    dden = -np.sum(dnum * c["y"], axis=-1)
    dfq = np.einsum("bhtfe,bhte->bhtf", S[:, :, 1:], dnum) + z[:, :, 1:] * dden[..., None]
    N = q.shape[2]
    G = np.zeros_like(S[:, :, 0])
    g = np.zeros_like(z[:, :, 0])
    dfk, dv, da = np.zeros_like(fk), np.zeros_like(v), np.zeros_like(lam)
    # the zero-denominator rows output cumsum(v): their value gradient is a reverse cumsum of dy
    dv_zero = np.cumsum(np.where(keep[..., None], 0.0, dy)[:, :, ::-1], axis=2)[:, :, ::-1]
    for t in reversed(range(N)):
        if t + 1 < N:
            G = lam[:, :, t + 1, None, None] * G
            g = lam[:, :, t + 1, None] * g
        G = G + fq[:, :, t, :, None] * dnum[:, :, t, None, :]
        g = g + fq[:, :, t] * dden[:, :, t, None]
        dfk[:, :, t] = np.einsum("bhfe,bhe->bhf", G, v[:, :, t]) + g
        dv[:, :, t] = np.einsum("bhfe,bhf->bhe", G, fk[:, :, t])
        dlam = np.einsum("bhfe,bhfe->bh", G, S[:, :, t]) + np.einsum("bhf,bhf->bh", g, z[:, :, t])
        da[:, :, t] = lam[:, :, t] * dlam
    return second_order_features_vjp(dfq, q), second_order_features_vjp(dfk, k), dv + dv_zero, da


def two_mamba_scan_backward(dout, cache) -> dict:
    """Gradients of :func:`two_mamba_scan_forward` w.r.t. ``q, k, v, a`` (the reverse scan)."""
    dy = as_dout(dout, cache["shape"], cache["dtype"])
    dq, dk, dv, da = _scan_backward(dy, cache)
    return {"q": dq, "k": dk, "v": dv, "a": da}


def two_mamba_explicit(q, k, v, a) -> np.ndarray:
    r"""Explicit masked form (upstream ``forwrd_gated``): $W = (QK^\top/\sqrt d)^2\odot
    \exp(A^{cum}_t - A^{cum}_s)[s\le t]$, $y = WV/(W\mathbf 1)$."""
    N, d = q.shape[-2], q.shape[-1]
    w = (q @ np.swapaxes(k, -1, -2) / np.sqrt(d)) ** 2
    cum = np.cumsum(a, axis=-1)
    diff = cum[..., :, None] - cum[..., None, :]
    tri = np.tri(N, dtype=bool)
    w = w * np.exp(np.where(tri, diff, -np.inf))
    den = w.sum(-1, keepdims=True)
    return np.where(den > 0, (w @ v) / np.where(den > 0, den, 1.0), np.cumsum(v, axis=-2))


# ----------------------------------------------------------------------------------------------
# The layer
# ----------------------------------------------------------------------------------------------


def _validate_layer(x, params, num_heads):
    x = as_float(x, "x", ndim=3)
    H = check_int(num_heads, "num_heads", minimum=1)
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of arrays, got {type(params).__name__}")
    C = x.shape[-1]
    for key, nd in (("qkv_proj.weight", 2), ("conv1d.weight", 3)):
        if key not in params:
            raise ValueError(f"params is missing '{key}'")
        if np.ndim(params[key]) != nd:
            raise ValueError(f"{key} must be {nd}-D; got shape {np.shape(params[key])}")
    F = np.shape(params["qkv_proj.weight"])[1]
    if F % (3 * H):
        raise ValueError(f"qkv_proj.weight must have 3 * num_heads * head_dim = 3 * {H} * d columns; got {F}")
    d = F // (3 * H)
    w = np.shape(params["conv1d.weight"])[-1]
    spec = {**linear_prefixed_spec("qkv_proj", C, F), "conv1d.weight": (F, 1, w), "conv1d.bias": (F,),
            **linear_prefixed_spec("A_mask_proj", C, H), **linear_prefixed_spec("o_proj", H * d, C)}
    p = check_params(params, spec, optional=("qkv_proj.bias", "A_mask_proj.bias", "o_proj.bias"),
                     where="two_mamba_second_order_attention")
    return x, cast_all(x.dtype, p), H, d, w


def _heads(t, H):
    B, N, F = t.shape
    return t.reshape(B, N, H, F // H).transpose(0, 2, 1, 3)


def _layer(x, p, H, d, w, core):
    B, N, C = x.shape
    pre = linear_prefixed(p, "qkv_proj", x)
    qkv = np.swapaxes(conv_apply(np.swapaxes(pre, 1, 2), p["conv1d.weight"], p["conv1d.bias"], groups=pre.shape[-1],
                                 padding=((w - 1, 0),)), 1, 2)
    q, k, v = (_heads(qkv[..., i * H * d:(i + 1) * H * d], H) for i in range(3))
    h = linear_prefixed(p, "A_mask_proj", x)
    a = -np.logaddexp(0.0, h).transpose(0, 2, 1)
    y, cc = core(q, k, v, a)
    ym = y.transpose(0, 2, 1, 3).reshape(B, N, H * d)
    out = linear_prefixed(p, "o_proj", ym)
    return out, {"x": x, "pre": pre, "h": h, "ym": ym, "core": cc}


def two_mamba_forward(x, params, *, num_heads: int):
    r"""The 2Mamba attention layer on ``x (B, N, C)``; returns ``(out (B, N, C), cache)``.

    ``params`` (upstream names, linear weights ``(in, out)`` = torch ``weight.T``):
    ``qkv_proj.weight (C, 3Hd)`` [``qkv_proj.bias``], ``conv1d.weight (3Hd, 1, w)``,
    ``conv1d.bias (3Hd,)``, ``A_mask_proj.weight (C, H)`` [``A_mask_proj.bias``],
    ``o_proj.weight (Hd, C)`` [``o_proj.bias``]."""
    x, p, H, d, w = _validate_layer(x, params, num_heads)
    out, cache = _layer(x, p, H, d, w, _scan)
    cache.update(p=p, H=H, d=d, w=w, dtype=x.dtype, shape=out.shape)
    return out, cache


def two_mamba_backward(dout, cache) -> dict:
    """Gradients of :func:`two_mamba_forward` w.r.t. ``x`` and every parameter."""
    dt = cache["dtype"]
    dout = as_dout(dout, cache["shape"], dt)
    p, H, d, w = cache["p"], cache["H"], cache["d"], cache["w"]
    x, pre = cache["x"], cache["pre"]
    B, N, C = x.shape
    grads: dict = {}
    dym = linear_prefixed_vjp(grads, p, "o_proj", dout, cache["ym"])
    dy = dym.reshape(B, N, H, d).transpose(0, 2, 1, 3)
    dq, dk, dv, da = _scan_backward(dy, cache["core"])
    dh = (-da * sigmoid(cache["h"]).transpose(0, 2, 1)).transpose(0, 2, 1)
    dx = linear_prefixed_vjp(grads, p, "A_mask_proj", dh, x)
    dqkv = np.concatenate([t.transpose(0, 2, 1, 3).reshape(B, N, H * d) for t in (dq, dk, dv)], axis=-1)
    cg = conv_vjp(np.swapaxes(dqkv, 1, 2), np.swapaxes(pre, 1, 2), p["conv1d.weight"], groups=pre.shape[-1],
                  padding=((w - 1, 0),))
    grads["conv1d.weight"], grads["conv1d.bias"] = cg["weight"], cg["bias"]
    dx = dx + linear_prefixed_vjp(grads, p, "qkv_proj", np.swapaxes(cg["x"], 1, 2), x)
    out = {"x": dx}
    out.update({key: np.asarray(grads[key], dtype=dt) for key in p})
    return out


def two_mamba(x, params, *, num_heads: int) -> np.ndarray:
    """Convenience wrapper: the output of :func:`two_mamba_forward`."""
    return two_mamba_forward(x, params, num_heads=num_heads)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _reference_two_mamba(x, params, *, num_heads):
    """The layer with the explicit masked $N\\times N$ form in place of the recurrence."""
    x, p, H, d, w = _validate_layer(x, params, num_heads)
    return _layer(x, p, H, d, w, lambda q, k, v, a: (two_mamba_explicit(q, k, v, a), None))[0]


def _two_mamba_params(rng, C, H, d, w=2, bias=False):
    F = 3 * H * d
    p = {"qkv_proj.weight": rng.standard_normal((C, F)) / np.sqrt(C),
         "conv1d.weight": 0.7 * rng.standard_normal((F, 1, w)), "conv1d.bias": 0.3 * rng.standard_normal(F),
         "A_mask_proj.weight": rng.standard_normal((C, H)) / np.sqrt(C),
         "o_proj.weight": rng.standard_normal((H * d, C)) / np.sqrt(H * d)}
    if bias:
        p.update({"qkv_proj.bias": 0.3 * rng.standard_normal(F), "A_mask_proj.bias": rng.standard_normal(H),
                  "o_proj.bias": 0.3 * rng.standard_normal(C)})
    return p


def _sample_two_mamba(rng, size):
    C, H, d, N = (3, 2, 2, 5) if size == "tiny" else (8, 2, 4, 12)
    return Sample(inputs={"x": rng.standard_normal((2, N, C))},
                  params=_two_mamba_params(rng, C, H, d, bias=size == "tiny"), config={"num_heads": H})


def _check_recurrent_equals_explicit(rng):
    """The scan's output and its q, k, v, a gradients equal the explicit masked form's (the
    explicit gradients written out: $\\bar W = \\bar Y V^\\top$ through the row normalisation)."""
    q, k = rng.standard_normal((2, 2, 7, 3)), rng.standard_normal((2, 2, 7, 3))
    v, a = rng.standard_normal((2, 2, 7, 2)), -rng.uniform(0.05, 2.0, (2, 2, 7))
    y, cache = two_mamba_scan_forward(q, k, v, a)
    err = float(np.abs(y - two_mamba_explicit(q, k, v, a)).max())
    gy = rng.standard_normal(y.shape)
    g = two_mamba_scan_backward(gy, cache)
    d = q.shape[-1]
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(d)
    cum = np.cumsum(a, -1)
    L = np.exp(np.where(np.tri(7, dtype=bool), cum[..., :, None] - cum[..., None, :], -np.inf))
    W = s * s * L
    den = W.sum(-1, keepdims=True)
    P = W / den
    dP = gy @ np.swapaxes(v, -1, -2)
    dW = (dP - np.sum(dP * P, -1, keepdims=True)) / den
    ds = dW * 2 * s * L
    dL = dW * W  # d/d(log L) of W = W
    ref = {"v": np.swapaxes(P, -1, -2) @ gy, "q": ds @ k / np.sqrt(d), "k": np.swapaxes(ds, -1, -2) @ q / np.sqrt(d),
           # log L_ts = cum_t - cum_s, cum_t = sum_{r<=t} a_r
           "a": np.cumsum(dL.sum(-1)[..., ::-1], -1)[..., ::-1] - np.cumsum(dL.sum(-2)[..., ::-1], -1)[..., ::-1]}
    err = max(err, max(float(np.abs(g[key] - ref[key]).max()) for key in ref))
    assert err < 1e-12, err
    return err


def _check_scan_gradcheck(rng):
    """Finite-difference gradcheck of the bare recurrent core (q, k, v, a)."""
    s = Sample(inputs={"q": rng.standard_normal((2, 1, 4, 2)), "k": rng.standard_normal((2, 1, 4, 2)),
                       "v": rng.standard_normal((2, 1, 4, 2)), "a": -rng.uniform(0.1, 1.5, (2, 1, 4))})
    err = fd_max_rel(two_mamba_scan_forward, two_mamba_scan_backward, s)
    assert err < 1e-6, err
    return err


def _check_no_decay_is_squared_linear_attention(rng):
    """$a = 0$: plain causal linear attention with the squared kernel, $y_t = \\sum_{s\\le t}(q_t\\cdot k_s)^2v_s/
    \\sum_{s\\le t}(q_t\\cdot k_s)^2$, computed token by token."""
    q, k, v = rng.standard_normal((1, 1, 6, 3)), rng.standard_normal((1, 1, 6, 3)), rng.standard_normal((1, 1, 6, 2))
    y = two_mamba_scan_forward(q, k, v, np.zeros((1, 1, 6)))[0]
    err = 0.0
    for t in range(6):
        w = (k[0, 0, : t + 1] @ q[0, 0, t]) ** 2
        err = max(err, float(np.abs(y[0, 0, t] - w @ v[0, 0, : t + 1] / w.sum()).max()))
    assert err < 1e-13, err
    return err


register(
    Mechanism(
        slug="two_mamba_second_order_attention", family="4-linear-kernel-sparse", tier="T3",
        title="2Mamba: second-order masked linear attention",
        paper="Mongaras & Larson, '2Mamba2Furious: Linear in Complexity, Competitive in Accuracy', 2026, "
              "arXiv 2602.17363",
        official_code="gmongaras/2Mamba2Furious GPT_Trainer/LlamaDecoderLayerClean.py"
                      "@7ad98b5dde9e729563fbabf82454b4fa3fdbc39f",
        forward=two_mamba_forward, backward=two_mamba_backward, sample=_sample_two_mamba,
        reference=_reference_two_mamba,
        checks={"recurrent_equals_explicit_fwd_and_grads": _check_recurrent_equals_explicit,
                "gradcheck_recurrent_core": _check_scan_gradcheck,
                "no_decay_is_squared_linear_attention": _check_no_decay_is_squared_linear_attention},
        docs="linear/l6b.md#2mamba-second-order-attention",
    ),
)
