r"""PDE-Transformer (separate channels): channel-wise self-attention between the tokens of the
physical channels, with adaptive-LayerNorm conditioning.

Paper: Holzschuh, Liu, Kohl, Thuerey, "PDE-Transformer: Efficient and Versatile Transformers for
Physics Simulations", ICML 2025, arXiv 2505.24717. Upstream: tum-pbs/pde-transformer
``pdetransformer/core/separate_channels/pde_transformer.py`` (``HATDiTBlock`` channel-attention
branch, ``SelfAttention``, ``AdaLayerNormZero``) @ 850e09d352487922e4a853ee90a2624717769cc7.

In the separate-channel (SC) model every physical channel (velocity components, density, ...)
is embedded as its own set of spatio-temporal tokens, $x\in\mathbb R^{B\times C\times P\times d}$
($C$ physical channels, $P$ token positions, width $d$). Each ``HATDiTBlock`` has three residual
branches — windowed spatial attention, **channel attention**, MLP — modulated by an adaptive
LayerNorm whose shift/scale/gate come from the per-channel conditioning $e\in\mathbb R^{B\times C\times d_e}$
(time, channel type, PDE type and parameters embedded). This module is the channel branch, the
SC model's mechanism; the window attention is a Swin-style attention and the MLP a plain FFN.

Branch
------
$$[\ldots,\ \beta,\ \gamma,\ \alpha,\ \ldots] = \mathrm{SiLU}(e)\,W_{ada} + b_{ada}\quad(9\ \text{chunks of}\ d;\
\text{the channel branch uses chunks 3, 4, 5: msa2 shift, scale, gate}),$$

$$y = \mathrm{LN}_2(x)\odot(1+\gamma) + \beta,\qquad
[q|k|v] = yW_{qkv}\ (\text{no bias; heads of width } d_h),$$

$$a_{p} = \mathrm{softmax}_{C}\big(\tau_h\,\hat q_{p}\hat k_{p}^\top\big)v_{p},\qquad
\hat q = q/\max(\lVert q\rVert, 10^{-12}),\ \tau_h = e^{\min(\ell_h,\ 4.6052)},$$

attention over the $C$ channels at every position $p$ (cosine attention ``attn_type="v2"``,
upstream default; ``"v1"``: $q k^\top/\sqrt{d_h}$), heads merged without an output projection
(``to_out`` is commented out upstream), and

$$x' = x + a\odot(1+\alpha)\quad(\text{upstream, } \texttt{gate="one\_plus"}),\qquad
x' = x + a\odot\alpha\quad(\text{DiT adaLN-Zero}, \texttt{gate="zero"}).$$

Upstream zero-initialises ``adain_2.linear`` but gates with $1+\alpha$, so at initialisation the
branch is $x + a$, **not** the identity that adaLN-Zero (and the catalogue's description) would
give; ``gate="zero"`` is the DiT form for comparison. $\mathrm{LN}_2$ is ``nn.LayerNorm(d)``
(affine, eps 1e-5); the modulation's own ``AdaLayerNormZero.norm`` is not used by this block.

Backward
--------
$dx = g + \mathrm{LN\ VJP}$; $da = g\odot(1+\alpha)$, $d\alpha = \sum_p g\odot a$; the attention VJP
(:func:`refattn.attention.softmax.attention_core_backward` with $q' = \tau\hat q$, scale 1) gives
$d\hat q = \tau\,dq'$, $d\tau_h = \sum dq'\cdot\hat q$, $d\ell_h = d\tau_h\,\tau_h$ below the clamp (0
above); the normalisation VJP is $dq = (d\hat q - \hat q\,(\hat q\cdot d\hat q))/\lVert q\rVert$;
$dW_{qkv} = \sum y^\top[dq|dk|dv]$; the modulation: $d\beta = \sum_p dy$,
$d\gamma = \sum_p dy\odot\mathrm{LN}_2(x)$, then $dW_{ada} = \mathrm{SiLU}(e)^\top dm$,
$de = (dm\,W_{ada}^\top)\odot\mathrm{SiLU}'(e)$ with $dm$ zero outside chunks 3–5.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_choice, check_int, check_params, check_positive, compute_dtype
from ..attention.softmax import attention_core_backward, attention_core_forward
from ..nn.activations import silu, silu_grad
from ..nn.linear import merge_heads, split_heads
from ..nn.norms import normalize_backward, normalize_forward
from ..registry import Mechanism, Sample, register

__all__ = ["pde_channel_attention_forward", "pde_channel_attention_backward", "pde_channel_attention",
           "init_pde_channel_attention_params"]

LOGIT_MAX = 4.6052          # upstream clamp: log(100)
_NORM_EPS = 1e-12           # F.normalize default
_CHUNK = 1                  # msa2 = the second (shift, scale, gate) triple of the nine chunks


def _validate(x, emb, params, num_heads, attn_type, gate, eps):
    x = as_float(x, "x", ndim=4)
    b, c, _, d = x.shape
    emb = as_float(emb, "emb", ndim=3)
    if emb.shape[:2] != (b, c):
        raise ValueError(f"emb must have shape (B={b}, C={c}, d_emb): one conditioning vector per channel; "
                         f"got {emb.shape}")
    num_heads = check_int(num_heads, "num_heads", minimum=1)
    if d % num_heads:
        raise ValueError(f"the token width d={d} (x's last axis) must be divisible by num_heads={num_heads}")
    check_choice(attn_type, "attn_type", ("v2", "v1"))
    check_choice(gate, "gate", ("one_plus", "zero"))
    eps = check_positive(eps, "eps")
    spec = {"adain_2.linear.weight": (emb.shape[2], 9 * d), "adain_2.linear.bias": (9 * d,),
            "norm2.weight": (d,), "norm2.bias": (d,), "attn_channel.to_qkv.weight": (d, 3 * d)}
    if attn_type == "v2":
        spec["attn_channel.logit_scale"] = (num_heads, 1, 1)
    p = check_params(params, spec)
    dt = compute_dtype(x, emb, *p.values())
    return x.astype(dt, copy=False), emb.astype(dt, copy=False), cast_all(dt, p), num_heads, eps


def pde_channel_attention_forward(x, emb, params, *, num_heads: int, attn_type: str = "v2", gate: str = "one_plus",
                                  eps: float = 1e-5):
    r"""Channel-attention branch of a PDE-Transformer SC block (module docstring).

    Parameters
    ----------
    x : array (B, C, P, d)
        Tokens of the C physical channels at P positions (a window's tokens, or all patches).
    emb : array (B, C, d_emb)
        Per-channel conditioning embedding (upstream ``emb``, before the SiLU).
    params : dict
        ``adain_2.linear.weight`` (d_emb, 9 d) and ``.bias`` (9 d) (``nn.Linear`` transposed; all
        nine chunks, as upstream stores them), ``norm2.weight``/``.bias`` (d,),
        ``attn_channel.to_qkv.weight`` (d, 3 d) and, for ``attn_type="v2"``,
        ``attn_channel.logit_scale`` (H, 1, 1).
    num_heads : int
    attn_type : {"v2", "v1"}
        Cosine attention with the learned, clamped temperature (upstream default) or scaled dot product.
    gate : {"one_plus", "zero"}
        Residual gate $1+\alpha$ (upstream) or $\alpha$ (DiT adaLN-Zero).
    eps : float
        ``norm2`` epsilon (1e-5).

    Returns
    -------
    out, cache
        ``out (B, C, P, d)``.
    """
    x, emb, p, heads, eps = _validate(x, emb, params, num_heads, attn_type, gate, eps)
    d = x.shape[-1]
    se = silu(emb)
    mod = se @ p["adain_2.linear.weight"] + p["adain_2.linear.bias"]
    shift, scale, gte = (mod[..., (3 * _CHUNK + j) * d:(3 * _CHUNK + j + 1) * d][:, :, None] for j in range(3))
    xhat, stats = normalize_forward(x, (3,), eps)
    ln = xhat * p["norm2.weight"] + p["norm2.bias"]
    y = ln * (1.0 + scale) + shift
    yt = np.swapaxes(y, 1, 2)                                             # (B, P, C, d): attend over C
    qkv = yt @ p["attn_channel.to_qkv.weight"]
    q, k, v = (split_heads(qkv[..., j * d:(j + 1) * d], heads) for j in range(3))   # (B, P, H, C, dh)
    cache_n = {}
    if attn_type == "v2":
        qn, kn = (np.maximum(np.linalg.norm(t, axis=-1, keepdims=True), _NORM_EPS) for t in (q, k))
        qh, kh = q / qn, k / kn
        logit = p["attn_channel.logit_scale"]
        tau = np.exp(np.minimum(logit, LOGIT_MAX))                         # (H, 1, 1)
        o, acache = attention_core_forward(qh * tau, kh, v, scale=1.0)
        cache_n = dict(qn=qn, kn=kn, qh=qh, kh=kh, tau=tau, clamped=logit >= LOGIT_MAX)
    else:
        o, acache = attention_core_forward(q, k, v)
    a = np.swapaxes(merge_heads(o), 1, 2)                                 # (B, C, P, d)
    g = (1.0 + gte) if gate == "one_plus" else gte
    out = x + a * g
    cache = dict(x=x, emb=emb, se=se, p=p, heads=heads, attn_type=attn_type, gate=gate, xhat=xhat, stats=stats,
                 ln=ln, scale=scale, yt=yt, acache=acache, a=a, g=g, out_shape=out.shape, **cache_n)
    return out, cache


def pde_channel_attention_backward(dout, cache):
    """Gradients of :func:`pde_channel_attention_forward`: ``x``, ``emb`` and every params key."""
    p, x, d, heads = cache["p"], cache["x"], cache["x"].shape[-1], cache["heads"]
    g = as_dout(dout, cache["out_shape"], x.dtype)
    grads = {}
    dmod = np.zeros(x.shape[:2] + (9 * d,), dtype=x.dtype)
    dgate = np.sum(g * cache["a"], axis=2)
    dmod[..., (3 * _CHUNK + 2) * d:(3 * _CHUNK + 3) * d] = dgate
    da = g * cache["g"]
    do = split_heads(np.swapaxes(da, 1, 2), heads)
    ga = attention_core_backward(do, cache["acache"])
    if cache["attn_type"] == "v2":
        tau, qh, kh = cache["tau"], cache["qh"], cache["kh"]
        dqh = ga["q"] * tau
        dtau = np.sum(ga["q"] * qh, axis=(0, 1, 3, 4))[:, None, None]
        grads["attn_channel.logit_scale"] = np.where(cache["clamped"], 0.0, dtau * tau)
        dq = (dqh - qh * np.sum(qh * dqh, axis=-1, keepdims=True)) / cache["qn"]
        dk = (ga["k"] - kh * np.sum(kh * ga["k"], axis=-1, keepdims=True)) / cache["kn"]
    else:
        dq, dk = ga["q"], ga["k"]
    dqkv = np.concatenate([merge_heads(t) for t in (dq, dk, ga["v"])], axis=-1)   # (B, P, C, 3d)
    yt = cache["yt"]
    grads["attn_channel.to_qkv.weight"] = yt.reshape(-1, d).T @ dqkv.reshape(-1, 3 * d)
    dy = np.swapaxes(dqkv @ p["attn_channel.to_qkv.weight"].T, 1, 2)       # (B, C, P, d)
    dmod[..., 3 * _CHUNK * d:(3 * _CHUNK + 1) * d] = dy.sum(axis=2)
    dmod[..., (3 * _CHUNK + 1) * d:(3 * _CHUNK + 2) * d] = np.sum(dy * cache["ln"], axis=2)
    dln = dy * (1.0 + cache["scale"])
    grads["norm2.weight"] = np.sum(dln * cache["xhat"], axis=(0, 1, 2))
    grads["norm2.bias"] = np.sum(dln, axis=(0, 1, 2))
    grads["x"] = g + normalize_backward(dln * p["norm2.weight"], cache["xhat"], cache["stats"])
    se = cache["se"]
    grads["adain_2.linear.weight"] = se.reshape(-1, se.shape[-1]).T @ dmod.reshape(-1, 9 * d)
    grads["adain_2.linear.bias"] = dmod.sum(axis=(0, 1))
    grads["emb"] = (dmod @ p["adain_2.linear.weight"].T) * silu_grad(cache["emb"])
    return grads


def pde_channel_attention(x, emb, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`pde_channel_attention_forward`."""
    return pde_channel_attention_forward(x, emb, params, **config)[0]


def init_pde_channel_attention_params(rng, d: int, num_heads: int, *, d_emb=None, attn_type: str = "v2",
                                      dtype=np.float64) -> dict:
    """Parameters as upstream initialises them: ``adain_2.linear`` zero (``initialize_weights``),
    ``norm2`` weight 1 / bias 0, ``to_qkv`` Xavier-uniform (``_basic_init``), ``logit_scale`` = log 10."""
    d_emb = d if d_emb is None else check_int(d_emb, "d_emb", minimum=1)
    bound = np.sqrt(6.0 / (d + 3 * d))
    p = {"adain_2.linear.weight": np.zeros((d_emb, 9 * d)), "adain_2.linear.bias": np.zeros(9 * d),
         "norm2.weight": np.ones(d), "norm2.bias": np.zeros(d),
         "attn_channel.to_qkv.weight": rng.uniform(-bound, bound, (d, 3 * d))}
    if attn_type == "v2":
        p["attn_channel.logit_scale"] = np.full((num_heads, 1, 1), np.log(10.0))
    return {k: v.astype(dtype) for k, v in p.items()}


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size, *, attn_type="v2"):
    c, pos, d, heads = (3, 2, 3, 1) if size == "tiny" else (int(rng.integers(3, 6)), int(rng.integers(3, 6)), 4, 2)
    p = init_pde_channel_attention_params(rng, d, heads, attn_type=attn_type)
    p["adain_2.linear.weight"] = 0.5 * rng.standard_normal(p["adain_2.linear.weight"].shape)
    p["adain_2.linear.bias"] = 0.3 * rng.standard_normal(9 * d)
    p["norm2.weight"] = 1.0 + 0.3 * rng.standard_normal(d)
    p["norm2.bias"] = 0.3 * rng.standard_normal(d)
    if attn_type == "v2":                                  # upstream builds logit_scale for v2 only
        p["attn_channel.logit_scale"] = np.log(10.0) - 1.0 + 0.3 * rng.standard_normal((heads, 1, 1))
    inputs = {"x": rng.standard_normal((2, c, pos, d)), "emb": rng.standard_normal((2, c, d))}
    return Sample(inputs=inputs, params=p, config={"num_heads": heads, "attn_type": attn_type})


def _reference(x, emb, params, *, num_heads, attn_type="v2", gate="one_plus", eps=1e-5):
    # HATDiTBlock's channel branch written out per (batch, position, head), explicit softmax.
    d = x.shape[-1]
    dh = d // num_heads
    mod = (emb / (1 + np.exp(-emb))) @ params["adain_2.linear.weight"] + params["adain_2.linear.bias"]
    shift, scale, gte = mod[..., 3 * d:4 * d], mod[..., 4 * d:5 * d], mod[..., 5 * d:6 * d]
    mu, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    ln = (x - mu) / np.sqrt(var + eps) * params["norm2.weight"] + params["norm2.bias"]
    y = ln * (1 + scale[:, :, None]) + shift[:, :, None]
    a = np.zeros_like(x)
    w = params["attn_channel.to_qkv.weight"]
    for b in range(x.shape[0]):
        for pp in range(x.shape[2]):
            t = y[b, :, pp] @ w
            for h in range(num_heads):
                sl = slice(h * dh, (h + 1) * dh)
                q, k, v = t[:, sl], t[:, d:][:, sl], t[:, 2 * d:][:, sl]
                if attn_type == "v2":
                    q = q / np.linalg.norm(q, axis=-1, keepdims=True)
                    k = k / np.linalg.norm(k, axis=-1, keepdims=True)
                    s = q @ k.T * np.exp(min(params["attn_channel.logit_scale"][h, 0, 0], LOGIT_MAX))
                else:
                    s = q @ k.T / np.sqrt(dh)
                e = np.exp(s - s.max(-1, keepdims=True))
                a[b, :, pp, sl] = (e / e.sum(-1, keepdims=True)) @ v
    return x + a * ((1 + gte) if gate == "one_plus" else gte)[:, :, None]


def _check_channel_permutation_equivariance(rng):
    s = _sample(rng, "small")
    perm = rng.permutation(s.inputs["x"].shape[1])
    base = pde_channel_attention(**s.inputs, params=s.params, **s.config)
    out = pde_channel_attention(s.inputs["x"][:, perm], s.inputs["emb"][:, perm], s.params, **s.config)
    err = float(np.abs(out - base[:, perm]).max())
    assert err < 1e-13, f"channel attention is not channel-permutation equivariant: {err:.2e}"
    return err


def _check_gate_at_init(rng):
    # Zero-initialised modulation: the DiT adaLN-Zero gate gives the identity; upstream's (1 + gate)
    # gives x + Attn(LN(x)), i.e. not the identity.
    s = _sample(rng, "small")
    p = dict(s.params, **{"adain_2.linear.weight": np.zeros_like(s.params["adain_2.linear.weight"]),
                          "adain_2.linear.bias": np.zeros_like(s.params["adain_2.linear.bias"])})
    x = s.inputs["x"]
    ident = pde_channel_attention(x, s.inputs["emb"], p, **dict(s.config, gate="zero"))
    upstream = pde_channel_attention(x, s.inputs["emb"], p, **s.config)
    err = float(np.abs(ident - x).max())
    assert err == 0.0 and np.abs(upstream - x).max() > 1e-3, "adaLN gating at initialisation is wrong"
    return err


def _check_logit_clamp(rng):
    # Above log(100) the temperature is clamped: same output, zero gradient for logit_scale.
    s = _sample(rng, "small")
    hi = dict(s.params, **{"attn_channel.logit_scale": np.full_like(s.params["attn_channel.logit_scale"], 6.0)})
    at = dict(s.params, **{"attn_channel.logit_scale": np.full_like(s.params["attn_channel.logit_scale"], LOGIT_MAX)})
    out, cache = pde_channel_attention_forward(**s.inputs, params=hi, **s.config)
    err = float(np.abs(out - pde_channel_attention(**s.inputs, params=at, **s.config)).max())
    g = pde_channel_attention_backward(np.ones_like(out), cache)["attn_channel.logit_scale"]
    assert err == 0.0 and not g.any(), f"logit clamp: output differs by {err:.2e} or gradient {g.ravel()}"
    return err


register(
    Mechanism(
        slug="pde_transformer_channel_attention", family="3-operator", tier="T2",
        title="PDE-Transformer: per-channel tokens with channel-wise attention, adaLN-Zero",
        paper="Holzschuh, Liu, Kohl, Thuerey, PDE-Transformer: Efficient and Versatile Transformers for Physics "
              "Simulations, ICML 2025, arXiv 2505.24717",
        forward=pde_channel_attention_forward, backward=pde_channel_attention_backward, sample=_sample,
        reference=_reference, docs="operators/kernel-integrals-and-scans.md#pde-transformer-channel-attention",
        checks={"channel_permutation_equivariance": _check_channel_permutation_equivariance,
                "gate_at_init": _check_gate_at_init, "logit_clamp": _check_logit_clamp},
    ),
)
