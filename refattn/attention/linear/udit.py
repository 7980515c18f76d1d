r"""U-DiT downsampled-token self-attention: attention within the four polyphase sub-maps of a feature map.

Tian, Tu, Chen, Hu, Xu, Wang, "U-DiTs: Downsample Tokens in U-Shaped Diffusion
Transformers", NeurIPS 2024, arXiv 2405.02730. Follows YuchuanTian/U-DiT
``udit_models.py@7fcce5eb2b7fb3888cea13dea619c4ef2efeb569`` (``DownSampler``, ``DownSample_Attn``,
``precompute_freqs_cis_2d``, ``apply_rotary_emb``).

Forward
-------
For a feature map $X\in\mathbb R^{C\times H\times W}$ and a down factor $f$ (2 in U-DiT):

1. **Downsampler.** $X' = \mathrm{DWConv}_k(X) + X$ (depthwise $k\times k$ convolution, padding
   $(k-1)/2$, with bias; the shortcut ``down_shortcut``), then the ``rearrange``
   ``b d (h dh) (w dw) -> b (dh dw) (h w) d``: $f^2$ sub-maps $T_{a,c} = X'[:, a::f, c::f]$, each
   a sequence of $M = HW/f^2$ tokens (row-major over the sub-map).
2. **Shared attention per sub-map.** One ``to_qkv`` ($C\to 3C$, with bias) for every sub-map, $h$
   heads of width $d = C/h$. Optional 2-D RoPE (``posemb="rope2d"``, below). Scores
   ``attn_type="v2"`` (cosine): $S = \tau_h\,\hat q\hat k^\top$ with $\hat q = q/\max(\|q\|,
   10^{-12})$ (``F.normalize``) and $\tau_h = \exp(\min(\lambda_h, 4.6052))$ ($\lambda$ =
   ``logit_scale``, clamp at $\ln 100$); ``"v1"``: $S = d^{-1/2}qk^\top$. Softmax over the
   $M$ keys of the *same* sub-map, $O = PV$.
3. **Upsampler.** The inverse ``rearrange`` puts every token back at its pixel and a $1\times 1$
   convolution ``to_out`` (with bias) mixes the channels.

Attention costs $f^2\,M^2 = N^2/f^2$ ($N = HW$). Equivalently (the record's explicit reference) it
is global attention over all $N$ pixels with the block mask "same polyphase component":
$(i \bmod f, j \bmod f)$ of query and key pixel agree.

2-D RoPE (``precompute_freqs_cis_2d``): within a sub-map of $M$ tokens, $G = \lfloor\sqrt M\rfloor$,
token $n$ has $x = n \bmod G$, $y = \lfloor n/G\rfloor$ (the column and row of a square sub-map), and
channel pair $(2m, 2m+1)$ (interleaved) rotates by $x\,\theta_l$ for $m = 2l$ and by $y\,\theta_l$
for $m = 2l+1$, $\theta_l = 10000^{-4l/d}$ ($d$ a multiple of 4). Applied to $q$ and $k$ before
the normalisation (norm preserving).

Backward
--------
The rearranges are permutations (their adjoints are the inverse permutations); the shared
``to_qkv`` sums its gradient over the $f^2$ sub-maps (it is one matmul over all tokens); RoPE's VJP
rotates back ($R(-\phi)$, `refattn.nn.rope.apply_rope` with $-\sin$). The attention VJP is the
softmax-attention core's (`refattn.attention.softmax.core`) with $q' = \tau_h\hat q$ and scale 1;
then $d\hat q = \tau_h\,dq'$, $d\tau_h = \sum dq'\cdot\hat q$,
$d\lambda_h = \tau_h\,d\tau_h\,[\lambda_h < \ln 100]$ (the clamp passes no gradient above its bound,
as ``torch.clamp``), and the normalisation VJP $dq = (d\hat q - \hat q(\hat q\cdot d\hat q))/\|q\|$
(`refattn.attention.linear.core.l2_normalize_vjp`). The depthwise convolution and the $1\times1$
convolution use `refattn.nn.conv` (``conv_apply``/``conv_vjp``).

Conventions
-----------
Parameter names and layouts as ``DownSample_Attn``: ``downsampler.layer.weight (C, 1, k, k)`` and
``.bias`` (conv layout), ``to_qkv.weight (C, 3C)`` (torch ``weight.T``) and ``.bias``,
``to_out.weight (C, C, 1, 1)`` and ``.bias``, ``logit_scale (h, 1, 1)`` (``"v2"`` only). Defaults
are those of every released U-DiT (``U_DiT_S/B/L``: ``attn_type='v2'``, ``posemb_type='rope2d'``,
``downsampler='dwconv5'``, ``down_shortcut=1``); the class's own defaults are ``"v1"``, no position
embedding, no shortcut. Upstream computes RoPE in float32 (``.float()``); here in the input's
dtype. Attention dropout is not used upstream.

Agreement with upstream: einops is not installed, so ``DownSampler``/``DownSample_Attn.forward``
were transcribed to PyTorch (``rearrange`` as reshape/permute, RoPE in float64), 12 configurations
(v1/v2, RoPE on/off, shortcut on/off, $k = 3, 5$, one and two heads): output 5.8e-15, every
gradient <= 1.8e-14 relative (to the largest entry of each gradient).
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_choice, check_int, check_params, compute_dtype
from ...nn.conv import conv_apply, conv_vjp
from ...nn.linear import linear_prefixed, linear_prefixed_vjp, merge_heads, split_heads
from ...nn.rope import apply_rope
from ...registry import Mechanism, Sample, register
from ..softmax.core import attention_core_backward, attention_core_forward
from .core import l2_normalize, l2_normalize_vjp

__all__ = ["UDIT_ATTN_TYPES", "UDIT_POSEMB", "udit_polyphase_split", "udit_polyphase_merge", "udit_rope2d_angles",
           "udit_attention_forward", "udit_attention_backward", "udit_attention"]

UDIT_ATTN_TYPES = ("v2", "v1")
UDIT_POSEMB = ("rope2d", None)
_LOGIT_CAP = 4.6052  # upstream clamp(max=4.6052) ~ ln 100


def udit_polyphase_split(x: np.ndarray, f: int) -> np.ndarray:
    """``rearrange(x, 'b d (h dh) (w dw) -> b (dh dw) (h w) d')``: ``(B, C, H, W) -> (B, f*f, HW/f^2, C)``."""
    b, c, hh, ww = x.shape
    t = x.reshape(b, c, hh // f, f, ww // f, f)  # b d h dh w dw
    return t.transpose(0, 3, 5, 2, 4, 1).reshape(b, f * f, (hh // f) * (ww // f), c)


def udit_polyphase_merge(t: np.ndarray, f: int, hh: int, ww: int) -> np.ndarray:
    """The inverse (and adjoint) of `udit_polyphase_split`: ``(B, f*f, HW/f^2, C) -> (B, C, H, W)``."""
    b, _, _, c = t.shape
    u = t.reshape(b, f, f, hh // f, ww // f, c)  # b dh dw h w d
    return u.transpose(0, 5, 3, 1, 4, 2).reshape(b, c, hh, ww)


def udit_rope2d_angles(m_tokens: int, head_dim: int, theta: float = 10000.0) -> np.ndarray:
    r"""RoPE angles ``(M, d/2)`` of ``precompute_freqs_cis_2d`` (interleaved channel pairs; module
    docstring): pair $2l$ rotates by $x\,\theta_l$, pair $2l+1$ by $y\,\theta_l$."""
    g = int(np.sqrt(m_tokens))
    n = np.arange(m_tokens)
    xpos, ypos = (n % g).astype(np.float64), (n // g).astype(np.float64)
    freqs = 1.0 / theta ** (np.arange(0, head_dim, 4)[: head_dim // 4] / head_dim)
    ang = np.stack([np.outer(xpos, freqs), np.outer(ypos, freqs)], axis=-1)  # (M, d/4, 2)
    return ang.reshape(m_tokens, -1)


def _validate(x, params, num_heads, down_factor, attn_type, posemb, down_shortcut):
    x = as_float(x, "x", ndim=4)
    num_heads = check_int(num_heads, "num_heads", minimum=1)
    f = check_int(down_factor, "down_factor", minimum=1)
    check_choice(attn_type, "attn_type", UDIT_ATTN_TYPES)
    check_choice(posemb, "posemb", UDIT_POSEMB)
    if not isinstance(down_shortcut, (bool, np.bool_)):
        raise TypeError(f"down_shortcut must be a bool; got {type(down_shortcut).__name__}")
    b, c, hh, ww = x.shape
    if hh % f or ww % f:
        raise ValueError(f"the spatial size of x (H={hh}, W={ww}; axes 2, 3) must be a multiple of down_factor={f}")
    if c % num_heads:
        raise ValueError(f"the channels of x ({c}, axis 1) must be a multiple of num_heads={num_heads}")
    d = c // num_heads
    if posemb == "rope2d" and d % 4:
        raise ValueError(f"posemb='rope2d' needs a head width C/num_heads divisible by 4; got {d} (x axis 1 = {c})")
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of arrays; got {type(params).__name__}")
    kw = np.shape(params.get("downsampler.layer.weight", np.zeros(0)))
    k = kw[-1] if len(kw) == 4 else 0
    if k % 2 == 0:
        raise ValueError(f"params['downsampler.layer.weight'] must be (C, 1, k, k) with an odd k; got {kw}")
    spec = {"downsampler.layer.weight": (c, 1, k, k), "downsampler.layer.bias": (c,),
            "to_qkv.weight": (c, 3 * c), "to_qkv.bias": (3 * c,),
            "to_out.weight": (c, c, 1, 1), "to_out.bias": (c,)}
    if attn_type == "v2":
        spec["logit_scale"] = (num_heads, 1, 1)
    p = check_params(params, spec, where="udit_attention", optional=("to_qkv.bias",))  # upstream bias=False
    dt = compute_dtype(x, *p.values())
    return x.astype(dt, copy=False), cast_all(dt, p), num_heads, f, k


def udit_attention_forward(x, params, *, num_heads: int, down_factor: int = 2, attn_type: str = "v2",
                           posemb: str | None = "rope2d", down_shortcut: bool = True):
    r"""U-DiT's ``DownSample_Attn``: depthwise-conv downsampler, self-attention within each of the
    $f^2$ polyphase sub-maps (shared ``to_qkv``), re-interleave, $1\times1$ ``to_out``.

    Parameters
    ----------
    x : (B, C, H, W)
        ``H``, ``W`` multiples of ``down_factor``.
    params : dict
        ``downsampler.layer.weight (C, 1, k, k)`` (odd ``k``), ``downsampler.layer.bias (C,)``,
        ``to_qkv.weight (C, 3C)`` (torch ``weight.T``), ``to_qkv.bias (3C,)`` (optional: upstream ``bias=False``),
        ``to_out.weight (C, C, 1, 1)``, ``to_out.bias (C,)``; ``logit_scale (h, 1, 1)`` for ``"v2"``.
    num_heads : int
    down_factor : int
        $f$ (U-DiT: 2).
    attn_type : {"v2", "v1"}
        Cosine attention with a learned clamped logit scale (released models) or scaled dot product.
    posemb : {"rope2d", None}
        2-D RoPE within each sub-map (released models) or none.
    down_shortcut : bool
        Add the input to the depthwise convolution's output (released models).

    Returns
    -------
    out : (B, C, H, W), cache
    """
    x, p, h, f, k = _validate(x, params, num_heads, down_factor, attn_type, posemb, down_shortcut)
    b, c, hh, ww = x.shape
    pad = (k - 1) // 2
    xc = conv_apply(x, p["downsampler.layer.weight"], p["downsampler.layer.bias"], padding=pad, groups=c)
    if down_shortcut:
        xc = xc + x
    t = udit_polyphase_split(xc, f)  # (B, P, M, C)
    qkv = linear_prefixed(p, "to_qkv", t)
    q, kk, v = (split_heads(a, h) for a in np.split(qkv, 3, axis=-1))  # (B, P, h, M, d)
    m_tok, d = t.shape[2], c // h
    rope = None
    if posemb == "rope2d":
        ang = udit_rope2d_angles(m_tok, d)
        rope = (np.cos(ang).astype(x.dtype), np.sin(ang).astype(x.dtype))
        q, kk = (apply_rope(a, *rope, interleaved=True) for a in (q, kk))
    st = {}
    if attn_type == "v2":
        qn, st["qs"] = l2_normalize(q)
        kn, st["ks"] = l2_normalize(kk)
        lam = p["logit_scale"]
        tau = np.exp(np.minimum(lam, _LOGIT_CAP))  # (h, 1, 1)
        ctx, core = attention_core_forward(tau * qn, kn, v, scale=1.0)
        st.update(qn=qn, kn=kn, tau=tau, lam=lam)
    else:
        ctx, core = attention_core_forward(q, kk, v)
    merged = merge_heads(ctx)  # (B, P, M, C)
    y = udit_polyphase_merge(merged, f, hh, ww)
    out = conv_apply(y, p["to_out.weight"], p["to_out.bias"])
    cache = {"x": x, "p": p, "h": h, "f": f, "pad": pad, "xc": xc, "t": t, "rope": rope, "core": core, "st": st,
             "y": y, "attn_type": attn_type, "shortcut": bool(down_shortcut), "out_shape": out.shape}
    return out, cache


def udit_attention_backward(dout, cache):
    r"""Gradients ``{"x"}`` and of every params key of `udit_attention_forward` (permutation adjoints,
    attention core, cosine-scale and RoPE VJPs, convolution VJPs; module docstring)."""
    x, p, h, f = cache["x"], cache["p"], cache["h"], cache["f"]
    b, c, hh, ww = x.shape
    g = as_dout(dout, cache["out_shape"], x.dtype)
    grads = {}
    go = conv_vjp(g, cache["y"], p["to_out.weight"])
    grads["to_out.weight"], grads["to_out.bias"] = go["weight"], go["bias"]
    dctx = split_heads(udit_polyphase_split(go["x"], f), h)
    dcore = attention_core_backward(dctx, cache["core"])
    dv = dcore["v"]
    st = cache["st"]
    if cache["attn_type"] == "v2":
        tau, qn = st["tau"], st["qn"]
        dqp = dcore["q"]
        dtau = np.sum(dqp * qn, axis=(0, 1, 3, 4)).reshape(tau.shape)
        grads["logit_scale"] = np.where(st["lam"] < _LOGIT_CAP, tau * dtau, 0.0)
        dq = l2_normalize_vjp(tau * dqp, qn, st["qs"])
        dk = l2_normalize_vjp(dcore["k"], st["kn"], st["ks"])
    else:
        dq, dk = dcore["q"], dcore["k"]
    if cache["rope"] is not None:
        cos, sin = cache["rope"]
        dq, dk = (apply_rope(a, cos, -sin, interleaved=True) for a in (dq, dk))
    dqkv = np.concatenate([merge_heads(a) for a in (dq, dk, dv)], axis=-1)
    dt = linear_prefixed_vjp(grads, p, "to_qkv", dqkv, cache["t"])
    dxc = udit_polyphase_merge(dt, f, hh, ww)
    gd = conv_vjp(dxc, x, p["downsampler.layer.weight"], padding=cache["pad"], groups=c)
    grads["downsampler.layer.weight"], grads["downsampler.layer.bias"] = gd["weight"], gd["bias"]
    grads["x"] = gd["x"] + dxc if cache["shortcut"] else gd["x"]
    return grads


def udit_attention(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of `udit_attention_forward`."""
    return udit_attention_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _reference(x, params, *, num_heads, down_factor=2, attn_type="v2", posemb="rope2d", down_shortcut=True):
    """Global attention over all H*W pixels with the polyphase block mask, pixel loops, explicit
    depthwise convolution and per-pixel RoPE position (its index within its sub-map)."""
    b, c, hh, ww = x.shape
    f, h = down_factor, num_heads
    d = c // h
    wd, bd = params["downsampler.layer.weight"], params["downsampler.layer.bias"]
    k = wd.shape[-1]
    r = (k - 1) // 2
    xp = np.pad(x, ((0, 0), (0, 0), (r, r), (r, r)))
    xc = np.empty_like(x)
    for i in range(hh):
        for j in range(ww):
            xc[:, :, i, j] = np.einsum("bcuv,cuv->bc", xp[:, :, i:i + k, j:j + k], wd[:, 0]) + bd
    if down_shortcut:
        xc = xc + x
    tok = xc.reshape(b, c, hh * ww).transpose(0, 2, 1)  # pixels in row-major order
    qkv = tok @ params["to_qkv.weight"] + params["to_qkv.bias"]
    q, kk, v = qkv[..., :c], qkv[..., c:2 * c], qkv[..., 2 * c:]
    ii, jj = np.divmod(np.arange(hh * ww), ww)
    phase = (ii % f) * f + (jj % f)
    mloc = (ii // f) * (ww // f) + (jj // f)  # index within the sub-map
    out = np.zeros((b, hh * ww, c))
    for head in range(h):
        sl = slice(head * d, (head + 1) * d)
        qh, kh = q[..., sl].copy(), kk[..., sl].copy()
        if posemb == "rope2d":
            ang = udit_rope2d_angles((hh // f) * (ww // f), d)[mloc]  # (N, d/2)
            for a in (qh, kh):
                ev, od = a[..., 0::2].copy(), a[..., 1::2].copy()
                a[..., 0::2] = ev * np.cos(ang) - od * np.sin(ang)
                a[..., 1::2] = ev * np.sin(ang) + od * np.cos(ang)
        if attn_type == "v2":
            qh = qh / np.linalg.norm(qh, axis=-1, keepdims=True)
            kh = kh / np.linalg.norm(kh, axis=-1, keepdims=True)
            sc = np.exp(min(float(params["logit_scale"][head, 0, 0]), _LOGIT_CAP)) * qh @ np.swapaxes(kh, 1, 2)
        else:
            sc = qh @ np.swapaxes(kh, 1, 2) / np.sqrt(d)
        sc = np.where(phase[:, None] == phase[None, :], sc, -np.inf)
        w = np.exp(sc - sc.max(-1, keepdims=True))
        out[..., sl] = (w / w.sum(-1, keepdims=True)) @ v[..., sl]
    y = out.transpose(0, 2, 1).reshape(b, c, hh, ww)
    return np.einsum("oc,bchw->bohw", params["to_out.weight"][:, :, 0, 0], y) + params["to_out.bias"][:, None, None]


def _draw(rng, size, attn_type=None, posemb="draw", shortcut=None):
    c, h = (4, 1) if size == "tiny" else (8, 2)
    hh, ww = (4, 4) if size == "tiny" else (6, 8)
    k = 3 if size == "tiny" else 5
    attn_type = UDIT_ATTN_TYPES[int(rng.integers(0, 2))] if attn_type is None else attn_type
    posemb = UDIT_POSEMB[int(rng.integers(0, 2))] if posemb == "draw" else posemb
    shortcut = bool(rng.integers(0, 2)) if shortcut is None else shortcut
    params = {"downsampler.layer.weight": rng.standard_normal((c, 1, k, k)) / k,
              "downsampler.layer.bias": 0.1 * rng.standard_normal(c),
              "to_qkv.weight": rng.standard_normal((c, 3 * c)) / np.sqrt(c),
              "to_qkv.bias": 0.1 * rng.standard_normal(3 * c),
              "to_out.weight": rng.standard_normal((c, c, 1, 1)) / np.sqrt(c),
              "to_out.bias": 0.1 * rng.standard_normal(c)}
    if attn_type == "v2":
        params["logit_scale"] = np.log(10.0) + 0.3 * rng.standard_normal((h, 1, 1))  # upstream init log 10
    return Sample(inputs={"x": rng.standard_normal((2, c, hh, ww))}, params=params,
                  config={"num_heads": h, "attn_type": attn_type, "posemb": posemb, "down_shortcut": shortcut})


def _sample(rng, size):
    return _draw(rng, size)


def _check_polyphase_permutation(rng):
    """split/merge are inverse permutations and split matches the einops pattern index by index."""
    x = rng.standard_normal((2, 3, 6, 4))
    t = udit_polyphase_split(x, 2)
    err = float(np.max(np.abs(udit_polyphase_merge(t, 2, 6, 4) - x)))
    for a in range(2):
        for cc in range(2):
            sub = x[:, :, a::2, cc::2].reshape(2, 3, -1).transpose(0, 2, 1)
            err = max(err, float(np.max(np.abs(t[:, a * 2 + cc] - sub))))
    assert err == 0.0, f"polyphase split/merge error {err}"
    return err


def _check_submaps_independent(rng):
    """Perturbing one polyphase component of the downsampled map changes no output token of another
    (before to_out), i.e. attention never crosses sub-maps."""
    s = _draw(rng, "small", attn_type="v1", posemb=None, shortcut=True)
    p = dict(s.params)
    c = p["to_out.weight"].shape[0]
    p["to_out.weight"] = np.eye(c).reshape(c, c, 1, 1)
    p["to_out.bias"] = np.zeros(c)
    p["downsampler.layer.weight"] = np.zeros_like(p["downsampler.layer.weight"])
    p["downsampler.layer.bias"] = np.zeros(c)
    x = s.inputs["x"]
    x2 = x.copy()
    x2[:, :, 0::2, 0::2] += rng.standard_normal(x2[:, :, 0::2, 0::2].shape)
    a, b = (udit_attention(z, p, **s.config) for z in (x, x2))
    diff = np.abs(a - b)
    other = float(np.max(diff[:, :, 1::2, :])) + float(np.max(diff[:, :, :, 1::2]))
    assert other == 0.0 and np.max(diff[:, :, 0::2, 0::2]) > 1e-3, "sub-maps interact"
    return other


def _check_logit_clamp(rng):
    """Above the clamp (logit_scale > ln 100) the output is constant and logit_scale gets no gradient."""
    s = _draw(rng, "tiny", attn_type="v2")
    p = dict(s.params, logit_scale=np.full_like(s.params["logit_scale"], 5.0))
    o1, cache = udit_attention_forward(s.inputs["x"], p, **s.config)
    o2 = udit_attention(s.inputs["x"], dict(p, logit_scale=p["logit_scale"] + 1.0), **s.config)
    g = udit_attention_backward(np.ones_like(o1), cache)["logit_scale"]
    err = max(float(np.max(np.abs(o1 - o2))), float(np.max(np.abs(g))))
    assert err == 0.0, f"clamped logit scale leaks: {err}"
    return err


def _check_gradcheck_options(rng):
    """Random-direction gradient checks for all 8 option combinations (the generated test runs the full
    finite-difference Jacobian on one drawn combination)."""
    from ...testing import directional_check  # lazy: testing imports the registry

    err = 0.0
    for at in UDIT_ATTN_TYPES:
        for pe in UDIT_POSEMB:
            for sc in (True, False):
                err = max(err, directional_check(udit_attention_forward, udit_attention_backward,
                                                 _draw(rng, "small", at, pe, sc)).max_rel)
    return err


register(
    Mechanism(
        slug="udit_downsampled_token_attention", family="4-linear-kernel-sparse", tier="T2",
        title="U-DiT downsampled-token self-attention",
        paper="Tian, Tu, Chen, Hu, Xu, Wang, 'U-DiTs: Downsample Tokens in U-Shaped Diffusion "
              "Transformers', NeurIPS 2024, arXiv 2405.02730",
        forward=udit_attention_forward, backward=udit_attention_backward, sample=_sample, reference=_reference,
        checks={"polyphase_split_is_einops_permutation": _check_polyphase_permutation,
                "submaps_do_not_interact": _check_submaps_independent,
                "logit_scale_clamp": _check_logit_clamp,
                "directional_gradcheck_all_options": _check_gradcheck_options},
        docs="linear/low-rank-and-structured.md#u-dit-downsampled-token-attention",
    ),
)
