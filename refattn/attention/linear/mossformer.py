r"""MossFormer block: gated single-head transformer with joint local (quadratic) and global
(linear) attention and convolution-augmented projections.

Zhao & Ma, "MossFormer: Pushing the Performance Limit of Monaural Speech Separation using Gated
Single-Head Transformer with Convolution-Augmented Joint Self-Attentions", ICASSP 2023,
arXiv 2302.11824. ``alibabasglab/MossFormer`` holds only a README that points to ModelScope; the
official code read (and run against this module in float64) is ``modelscope/modelscope``
``modelscope/models/audio/separation/mossformer_block.py`` (``MossFormerBlock``,
``FFConvM``, ``OffsetScale``, ``ScaleNorm``) and ``mossformer_conv_module.py``
(``MossFormerConvModule``) @2905da12205410de83f2fcdaabb4b505430890d5, with ``rotary_embedding_torch`` 0.9.1 for the rotary
embedding that ``MossFormerModule`` passes to every block. (ClearerVoice-Studio's
``FLASH_ShareA_FFConvM`` in MossFormer2 is the same block.)

Forward (one block, input $x\in\mathbb R^{B\times N\times C}$, dropout off)
-----------------------------------------------------------------------------
*Token shift* (``shift_tokens=True``): the first $\lceil C/2\rceil$ channels (``x.chunk(2, -1)``)
move one step later in time, $\tilde x_t[:h] = x_{t-1}[:h]$, $\tilde x_0[:h] = 0$.

*FFConvM* (``to_hidden``, ``to_qk``, ``to_out``): $F(z) = s + \mathrm{dwconv}(s)$,
$s = \mathrm{SiLU}(\mathrm{norm}(z)W + b)$, where $\mathrm{dwconv}$ is a bias-free depthwise
``Conv1d`` over time (kernel $k$, upstream 17, zero "same" padding $(k-1)/2$) and the norm is
``ScaleNorm`` $g\,z/\max(\lVert z\rVert C^{-1/2}, \epsilon)$, $\epsilon = 10^{-5}$
(``MossFormerModule``'s default ``norm_type='scalenorm'``) or ``LayerNorm``.

$[V, U] = F_{hid}(\tilde x)$ (each $N\times e$), $Z = F_{qk}(\tilde x)$ ($N\times d$), and the
four per-dimension affine maps of ``OffsetScale``: $Q^{q} = Z\gamma_0+\beta_0$,
$Q^{l} = Z\gamma_1+\beta_1$, $K^{q} = Z\gamma_2+\beta_2$, $K^{l} = Z\gamma_3+\beta_3$, each then
rotated by interleaved RoPE on its first $\min(32, d)$ channels (base $10^4$, positions $0..N-1$).

*Joint attention* with group (chunk) size $g$: the sequence is zero-padded to $Gg$ and cut into
$G$ chunks. For values $W\in\{V, U\}$,

$$\mathrm{Att}(W)_i = \sum_{j:\,c(j)=c(i)} M^{q}_{ij}\,\mathrm{relu}\!\big(Q^q_i\cdot K^q_j/g\big)^2 W_j
\;+\;\frac{1}{\kappa}\sum_j M^{l}_{ij}\,(Q^l_i\cdot K^l_j)\,W_j,$$

with $c(\cdot)$ the chunk index. Non-causal: $M^q = 1$ on valid keys, $M^l = 1$, $\kappa = N$
(the linear part is computed as $Q^l\,(K^{l\top}W)/N$). Causal: $M^q_{ij} = [j\le i]$,
$M^l_{ij} = [c(j) < c(i)]$, $\kappa = g$ (the linear part is an exclusive cumulative sum of the
chunk states $K^{l\top}_cW_c/g$ over chunks). Note the scale $1/g$ inside the relu even in a
partly padded chunk.

*Gating and output*: $O = (\mathrm{Att}(U)\odot V)\odot\sigma(\mathrm{Att}(V)\odot U)$, and
$y = x + F_{out}(O)$.

The explicit form builds the $N\times N$ matrix $A = M^q\odot\mathrm{relu}^2(Q^qK^{q\top}/g) +
M^l\odot Q^lK^{l\top}/\kappa$ and takes $AV$, $AU$; the chunked form equals it to round-off in the
output and every gradient (registry reference and the ``chunked_equals_explicit_*`` checks).

Backward
--------
Attention, per chunk, with $W = [V, U]$ and output gradient $\bar O$: $\bar A = \bar O W^\top$,
$\bar W \mathrel{+}= A^\top\bar O$; quadratic part, $S = Q^qK^{q\top}/g$:
$\bar S = M^q\odot\bar A\odot 2\,\mathrm{relu}(S)$, $\bar Q^q = \bar SK^q/g$, $\bar K^q = \bar S^\top Q^q/g$.
Linear part, states $T = K^{l\top}W/\kappa$ read as $Q^l\tilde T$ (non-causal: $\tilde T = \sum_c T_c$;
causal: $\tilde T_c = \sum_{c'<c}T_{c'}$): $\bar Q^l = \bar O\tilde T^\top$,
$\bar{\tilde T} = Q^{l\top}\bar O$, $\bar T_c = \sum_{c'}\bar{\tilde T}_{c'}$ (non-causal) or
$\sum_{c'>c}\bar{\tilde T}_{c'}$ (causal, a reverse exclusive cumsum), then $\bar K^l = W\bar T^\top/\kappa$,
$\bar W \mathrel{+}= K^l\bar T/\kappa$.
Gate, $z = \mathrm{Att}(V)\odot U$, $s=\sigma(z)$, $a = \mathrm{Att}(U)\odot V$: $\bar a = \bar O s$,
$\bar z = \bar O\,a\,s(1-s)$, so $\overline{\mathrm{Att}(U)} = \bar a\odot V$, $\bar V \mathrel{+}= \bar a\odot\mathrm{Att}(U)$,
$\overline{\mathrm{Att}(V)} = \bar z\odot U$, $\bar U \mathrel{+}= \bar z\odot\mathrm{Att}(V)$.
RoPE: the inverse rotation (`refattn.nn.rope.apply_rope` with $-\sin$). OffsetScale:
$\bar\gamma_h = \sum\bar T_h\odot Z$, $\bar\beta_h = \sum\bar T_h$, $\bar Z = \sum_h\bar T_h\gamma_h$.
FFConvM: $\bar s = \bar F + \mathrm{dwconv}^\top(\bar F)$, then SiLU', the linear VJP and the norm:
ScaleNorm with $r = \lVert z\rVert/\sqrt C$, $\rho = \max(r,\epsilon)$:
$\bar z = (g/\rho)\bar y - [r>\epsilon]\,g\,(z\cdot\bar y)\,z/(\rho^2 rC)$, $\bar g = \sum\bar y\odot z/\rho$.
Token shift: $\bar x_t[:h] \mathrel{+}= \bar{\tilde x}_{t+1}[:h]$. Residual: $\bar x \mathrel{+}= \bar y$.

Measured agreement with upstream (float64 CPU, upstream ``MossFormerBlock`` with
``RotaryEmbedding(dim=min(32, d))``, dropout 0, all weights perturbed and copied): $C=8$,
$e=16$ (expansion 4), $d=12$, $k=17$, $N=37$, $g=8$ (last chunk padded), batch 2, causal and
non-causal, ScaleNorm and LayerNorm: output max abs error 5.3e-15 (rel 8.5e-16); gradients of
``x`` and every parameter max rel 3.4e-14, except the scalar ScaleNorm gain of ``to_hidden`` in
the causal run, 1.1e-12 (a sum of large terms that cancel). ``rotary_embedding_torch`` builds its
frequencies with ``.float()``; for the run they were given their float64 values (with the float32
frequencies the output differs by ~2e-7 relative, the float32 rounding of the angles).

Conventions (keywords, upstream defaults): ``group_size=256``; ``causal=False``;
``norm="scalenorm"`` (``"layernorm"``: ``nn.LayerNorm``, eps 1e-5, params ``.weight/.bias``);
``shift_tokens=True``; ``rotary=True`` with ``rotary_dim=min(32, d)``; the depthwise kernel size
is read from the conv weight (must be odd, as upstream asserts). Dropout (upstream 0.1) is a
training-time op and is not applied.
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_choice, check_int, check_params
from ...nn.activations import sigmoid, silu, silu_grad
from ...nn.conv import conv_apply, conv_vjp
from ...nn.linear import linear_prefixed, linear_prefixed_vjp
from ...nn.norms import layer_norm_backward, layer_norm_forward
from ...nn.rope import apply_rope, rope_angles
from ...registry import Mechanism, Sample, register
from ._samples import fd_max_rel

__all__ = [
    "mossformer_joint_attention_forward",
    "mossformer_joint_attention_backward",
    "mossformer_joint_attention_explicit",
    "mossformer_gated_joint_attention_forward",
    "mossformer_gated_joint_attention_backward",
    "mossformer_gated_joint_attention",
]

_FF = ("to_hidden", "to_qk", "to_out")
_SCALENORM_EPS = 1e-5


# ----------------------------------------------------------------------------------------------
# Joint local-quadratic + global-linear attention (the chunked fast form)
# ----------------------------------------------------------------------------------------------


def _chunk(t, G, g):
    B, n = t.shape[:2]
    t = np.pad(t, ((0, 0), (0, G * g - n), (0, 0)))
    return t.reshape(B, G, g, t.shape[-1])


def _quad_mask(n, G, g, causal):
    pos = np.arange(G * g).reshape(G, g)
    mask = np.broadcast_to((pos < n)[:, None, :], (G, g, g))
    if causal:
        mask = mask & np.tri(g, dtype=bool)
    return mask


def mossformer_joint_attention_forward(quad_q, lin_q, quad_k, lin_k, v, u, *, group_size: int, causal: bool = False):
    r"""Joint attention of ``MossFormerBlock.cal_attention`` in its chunked form.

    ``quad_q, lin_q, quad_k, lin_k (B, N, d)`` (already offset/scaled and rotated), ``v, u (B, N, e)``.
    Returns ``((att_v, att_u), cache)``, each ``(B, N, e)``: ``att_w = A @ w`` with the joint matrix
    $A$ of the module docstring, computed chunk by chunk in $O(Ngd + Nde)$."""
    arrs = [as_float(a, name, ndim=3) for a, name in
            zip((quad_q, lin_q, quad_k, lin_k, v, u), ("quad_q", "lin_q", "quad_k", "lin_k", "v", "u"))]
    g = check_int(group_size, "group_size", minimum=1)
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be a bool; got {type(causal).__name__}")
    B, n, d = arrs[0].shape
    for a, name in zip(arrs[1:4], ("lin_q", "quad_k", "lin_k")):
        if a.shape != (B, n, d):
            raise ValueError(f"{name} must have shape {(B, n, d)} like quad_q; got {a.shape}")
    if arrs[4].shape[:2] != (B, n) or arrs[5].shape != arrs[4].shape:
        raise ValueError(f"v and u must have the same shape ({B}, {n}, e); got {arrs[4].shape} and {arrs[5].shape}")
    dt = np.result_type(*arrs)
    qq, lq, qk, lk, v, u = (a.astype(dt, copy=False) for a in arrs)
    att, cache = _joint_forward(qq, lq, qk, lk, np.concatenate([v, u], axis=-1), g, bool(causal))
    e = v.shape[-1]
    cache.update(shape=(B, n, e), dtype=dt)
    return (att[..., :e], att[..., e:]), cache


def _joint_forward(qq, lq, qk, lk, w, g, causal):
    B, n, _ = qq.shape
    G = -(-n // g)
    Qq, Ql, Kq, Kl, W = (_chunk(t, G, g) for t in (qq, lq, qk, lk, w))
    S = Qq @ np.swapaxes(Kq, -1, -2) / g
    mask = _quad_mask(n, G, g, causal)
    R = np.where(mask, np.maximum(S, 0.0), 0.0)
    out = (R * R) @ W
    kappa = g if causal else n
    T = np.swapaxes(Kl, -1, -2) @ W / kappa  # (B, G, d, 2e) chunk states
    if causal:  # exclusive prefix sum over chunks (written so that chunk c never touches T_c)
        Tt = np.concatenate([np.zeros_like(T[:, :1]), np.cumsum(T[:, :-1], axis=1)], axis=1)
    else:
        Tt = np.broadcast_to(T.sum(axis=1, keepdims=True), T.shape)
    out = out + Ql @ Tt
    att = out.reshape(B, G * g, -1)[:, :n]
    return att, {"Qq": Qq, "Ql": Ql, "Kq": Kq, "Kl": Kl, "W": W, "R": R, "Tt": Tt, "g": g, "n": n,
                 "kappa": kappa, "causal": causal}


def _joint_backward(datt, c):
    B, n = datt.shape[:2]
    g, kappa = c["g"], c["kappa"]
    G = c["W"].shape[1]
    dO = _chunk(datt, G, g)
    W, R, Qq, Kq, Ql, Kl = c["W"], c["R"], c["Qq"], c["Kq"], c["Ql"], c["Kl"]
    dA = dO @ np.swapaxes(W, -1, -2)
    dW = np.swapaxes(R * R, -1, -2) @ dO
    dS = dA * 2.0 * R
    dQq = dS @ Kq / g
    dKq = np.swapaxes(dS, -1, -2) @ Qq / g
    dQl = dO @ np.swapaxes(c["Tt"], -1, -2)
    dTt = np.swapaxes(Ql, -1, -2) @ dO
    if c["causal"]:
        rev = np.cumsum(dTt[:, :0:-1], axis=1)[:, ::-1]  # sum over chunks c' > c
        dT = np.concatenate([rev, np.zeros_like(dTt[:, :1])], axis=1)
    else:
        dT = np.broadcast_to(dTt.sum(axis=1, keepdims=True), dTt.shape)
    dKl = W @ np.swapaxes(dT, -1, -2) / kappa
    dW = dW + Kl @ dT / kappa

    def unchunk(t):
        return t.reshape(B, G * g, -1)[:, :n]

    return tuple(unchunk(t) for t in (dQq, dQl, dKq, dKl, dW))


def mossformer_joint_attention_backward(dout, cache) -> dict:
    """Gradients of :func:`mossformer_joint_attention_forward`; ``dout = (datt_v, datt_u)``."""
    if not isinstance(dout, (tuple, list)) or len(dout) != 2:
        raise TypeError("dout must be a pair (datt_v, datt_u)")
    dt, shape = cache["dtype"], cache["shape"]
    dv_, du_ = (as_dout(t, shape, dt, name=nm) for t, nm in zip(dout, ("dout[0]", "dout[1]")))
    dQq, dQl, dKq, dKl, dW = _joint_backward(np.concatenate([dv_, du_], axis=-1), cache)
    e = shape[-1]
    return {"quad_q": dQq, "lin_q": dQl, "quad_k": dKq, "lin_k": dKl, "v": dW[..., :e], "u": dW[..., e:]}


def mossformer_joint_attention_explicit(quad_q, lin_q, quad_k, lin_k, *, group_size: int, causal: bool = False):
    r"""The dense joint matrix $A\in\mathbb R^{B\times N\times N}$ (explicit $O(N^2)$ form):
    $A = M^q\odot\mathrm{relu}(Q^qK^{q\top}/g)^2 + M^l\odot Q^lK^{l\top}/\kappa$."""
    qq, lq, qk, lk = (np.asarray(t) for t in (quad_q, lin_q, quad_k, lin_k))
    n = qq.shape[1]
    g = group_size
    c = np.arange(n) // g
    same = c[:, None] == c[None, :]
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    mq = same & (j <= i) if causal else same
    ml = (c[None, :] < c[:, None]) if causal else np.ones((n, n), dtype=bool)
    kappa = g if causal else n
    S = qq @ np.swapaxes(qk, -1, -2) / g
    return np.where(mq, np.maximum(S, 0.0) ** 2, 0.0) + np.where(ml, lq @ np.swapaxes(lk, -1, -2) / kappa, 0.0)


# ----------------------------------------------------------------------------------------------
# The full block
# ----------------------------------------------------------------------------------------------


def _validate_block(x, params, norm, group_size, causal, shift_tokens, rotary):
    x = as_float(x, "x", ndim=3)
    check_choice(norm, "norm", ("scalenorm", "layernorm"))
    g = check_int(group_size, "group_size", minimum=1)
    for name, flag in (("causal", causal), ("shift_tokens", shift_tokens), ("rotary", rotary)):
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"{name} must be a bool; got {type(flag).__name__}")
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of arrays, got {type(params).__name__}")
    C = x.shape[-1]
    for key, nd in (("to_hidden.mdl.1.weight", 2), ("to_qk.mdl.1.weight", 2),
                    ("to_hidden.mdl.3.sequential.1.conv.weight", 3)):
        if key not in params:
            raise ValueError(f"params is missing '{key}'")
        if np.ndim(params[key]) != nd:
            raise ValueError(f"{key} must be {nd}-D; got shape {np.shape(params[key])}")
    hid = np.shape(params["to_hidden.mdl.1.weight"])
    if len(hid) != 2 or hid[1] % 2:
        raise ValueError(f"to_hidden.mdl.1.weight must have shape ({C}, 2e); got {hid}")
    d = np.shape(params["to_qk.mdl.1.weight"])[-1]
    ks = np.shape(params["to_hidden.mdl.3.sequential.1.conv.weight"])
    k = ks[-1]
    if k % 2 == 0:
        raise ValueError(f"to_hidden.mdl.3.sequential.1.conv.weight must be (2e, 1, k) with an odd kernel size k ('same' "
                         f"padding); got shape {ks}")
    e = hid[1] // 2
    spec = {}
    for pre, n_in, n_out in (("to_hidden", C, 2 * e), ("to_qk", C, d), ("to_out", e, C)):
        if norm == "scalenorm":
            spec[f"{pre}.mdl.0.g"] = (1,)
        else:
            spec[f"{pre}.mdl.0.weight"] = (n_in,)
            spec[f"{pre}.mdl.0.bias"] = (n_in,)
        spec[f"{pre}.mdl.1.weight"] = (n_in, n_out)
        spec[f"{pre}.mdl.1.bias"] = (n_out,)
        spec[f"{pre}.mdl.3.sequential.1.conv.weight"] = (n_out, 1, k)
    spec["qk_offset_scale.gamma"] = (4, d)
    spec["qk_offset_scale.beta"] = (4, d)
    p = check_params(params, spec, where="mossformer_gated_joint_attention")
    if rotary and min(32, d) % 2:
        raise ValueError(f"rotary needs an even rotary dim min(32, d); got d = {d} (pass rotary=False)")
    dt = x.dtype
    return x, cast_all(dt, p), g, e, d, k


def _ffconvm_forward(z, p, pre, norm):
    if norm == "scalenorm":
        C = z.shape[-1]
        r = np.linalg.norm(z, axis=-1, keepdims=True) / float(np.sqrt(C))
        rho = np.maximum(r, _SCALENORM_EPS)
        nz = z / rho * p[f"{pre}.mdl.0.g"]
        ncache = (r, rho)
    else:
        nz, ncache = layer_norm_forward(z, {"weight": p[f"{pre}.mdl.0.weight"], "bias": p[f"{pre}.mdl.0.bias"]})
    h = linear_prefixed(p, f"{pre}.mdl.1", nz)
    s = silu(h)
    w = p[f"{pre}.mdl.3.sequential.1.conv.weight"]
    k = w.shape[-1]
    conv = conv_apply(np.swapaxes(s, 1, 2), w, groups=w.shape[0], padding=(k - 1) // 2)
    return s + np.swapaxes(conv, 1, 2), (z, nz, ncache, h, s)


def _ffconvm_backward(dF, fc, p, pre, norm, grads):
    z, nz, ncache, h, s = fc
    w = p[f"{pre}.mdl.3.sequential.1.conv.weight"]
    k = w.shape[-1]
    cg = conv_vjp(np.swapaxes(dF, 1, 2), np.swapaxes(s, 1, 2), w, groups=w.shape[0], padding=(k - 1) // 2,
                  has_bias=False)
    grads[f"{pre}.mdl.3.sequential.1.conv.weight"] = cg["weight"]
    ds = dF + np.swapaxes(cg["x"], 1, 2)
    dn = linear_prefixed_vjp(grads, p, f"{pre}.mdl.1", ds * silu_grad(h), nz)
    if norm == "scalenorm":
        r, rho = ncache
        gsc = p[f"{pre}.mdl.0.g"]
        C = z.shape[-1]
        grads[f"{pre}.mdl.0.g"] = np.sum(dn * z / rho).reshape(1)
        zdy = np.sum(z * dn, axis=-1, keepdims=True)
        return gsc / rho * dn - np.where(r > _SCALENORM_EPS, gsc * zdy / (rho ** 3 * C), 0.0) * z
    lg = layer_norm_backward(dn, ncache)
    grads[f"{pre}.mdl.0.weight"] = lg["weight"]
    grads[f"{pre}.mdl.0.bias"] = lg["bias"]
    return lg["x"]


def _block(x, p, cfg, attend):
    """The block with a pluggable joint-attention function ``attend(qq, lq, qk, lk, w) -> (att, cache)``."""
    norm, e = cfg["norm"], cfg["e"]
    h = -(-x.shape[-1] // 2)
    xs = x.copy()
    if cfg["shift_tokens"]:
        xs[:, 1:, :h] = x[:, :-1, :h]
        xs[:, 0, :h] = 0.0
    hid, fc_h = _ffconvm_forward(xs, p, "to_hidden", norm)
    zq, fc_q = _ffconvm_forward(xs, p, "to_qk", norm)
    gam, bet = p["qk_offset_scale.gamma"], p["qk_offset_scale.beta"]
    heads = [zq * gam[i] + bet[i] for i in range(4)]
    cos = sin = None
    if cfg["rotary"]:
        ang = rope_angles(np.arange(x.shape[1], dtype=np.float64), min(32, zq.shape[-1]))
        cos, sin = np.cos(ang).astype(x.dtype), np.sin(ang).astype(x.dtype)
        heads = [apply_rope(t, cos, sin, interleaved=True) for t in heads]
    qq, lq, qk, lk = heads
    v, u = hid[..., :e], hid[..., e:]
    att, ac = attend(qq, lq, qk, lk, hid)
    att_v, att_u = att[..., :e], att[..., e:]
    sg = sigmoid(att_v * u)
    o = att_u * v * sg
    F, fc_o = _ffconvm_forward(o, p, "to_out", norm)
    y = x + F
    cache = {"fc": (fc_h, fc_q, fc_o), "zq": zq, "cos": cos, "sin": sin, "ac": ac, "att": att, "v": v, "u": u,
             "sg": sg, "h": h}
    return y, cache


def mossformer_gated_joint_attention_forward(x, params, *, group_size: int = 256, causal: bool = False,
                                             norm: str = "scalenorm", shift_tokens: bool = True, rotary: bool = True):
    r"""One ``MossFormerBlock`` (eval mode) on ``x (B, N, C)``; returns ``(y (B, N, C), cache)``.

    ``params`` (upstream names; linear weights ``(in, out)`` = torch ``weight.T``, conv weights in
    torch's ``(C_out, 1, k)`` layout), for ``pre`` in ``to_hidden`` ``(C -> 2e)``, ``to_qk``
    ``(C -> d)``, ``to_out`` ``(e -> C)``: ``pre.mdl.0.g (1,)`` (ScaleNorm; LayerNorm:
    ``pre.mdl.0.weight/bias``), ``pre.mdl.1.weight/bias``, ``pre.mdl.3.sequential.1.conv.weight``;
    and ``qk_offset_scale.gamma/beta (4, d)``. See the module docstring for the math and keywords."""
    x, p, g, e, d, k = _validate_block(x, params, norm, group_size, causal, shift_tokens, rotary)
    cfg = {"norm": norm, "e": e, "shift_tokens": bool(shift_tokens), "rotary": bool(rotary)}
    y, cache = _block(x, p, cfg, lambda qq, lq, qk, lk, w: _joint_forward(qq, lq, qk, lk, w, g, bool(causal)))
    cache.update(p=p, cfg=cfg, shape=y.shape, dtype=x.dtype)
    return y, cache


def mossformer_gated_joint_attention_backward(dout, cache) -> dict:
    """Gradients of :func:`mossformer_gated_joint_attention_forward` w.r.t. ``x`` and every parameter."""
    dt = cache["dtype"]
    dy = as_dout(dout, cache["shape"], dt)
    p, cfg = cache["p"], cache["cfg"]
    norm, e = cfg["norm"], cfg["e"]
    fc_h, fc_q, fc_o = cache["fc"]
    grads: dict = {}
    do = _ffconvm_backward(dy, fc_o, p, "to_out", norm, grads)
    att, v, u, sg = cache["att"], cache["v"], cache["u"], cache["sg"]
    att_v, att_u = att[..., :e], att[..., e:]
    da = do * sg
    dz = do * att_u * v * sg * (1.0 - sg)
    datt = np.concatenate([dz * u, da * v], axis=-1)
    dqq, dlq, dqk, dlk, dhid = _joint_backward(datt, cache["ac"])
    dhid = dhid + np.concatenate([da * att_u, dz * att_v], axis=-1)
    dheads = [dqq, dlq, dqk, dlk]
    if cfg["rotary"]:
        dheads = [apply_rope(t, cache["cos"], -cache["sin"], interleaved=True) for t in dheads]
    zq, gam = cache["zq"], p["qk_offset_scale.gamma"]
    grads["qk_offset_scale.gamma"] = np.stack([np.sum(t * zq, axis=(0, 1)) for t in dheads])
    grads["qk_offset_scale.beta"] = np.stack([np.sum(t, axis=(0, 1)) for t in dheads])
    dzq = sum(t * gam[i] for i, t in enumerate(dheads))
    dxs = _ffconvm_backward(dhid, fc_h, p, "to_hidden", norm, grads) + _ffconvm_backward(dzq, fc_q, p, "to_qk",
                                                                                         norm, grads)
    dx = dy + dxs
    if cfg["shift_tokens"]:
        h = cache["h"]
        dx[:, :, :h] -= dxs[:, :, :h]
        dx[:, :-1, :h] += dxs[:, 1:, :h]
    out = {"x": dx}
    out.update({key: np.asarray(grads[key], dtype=dt) for key in p})
    return out


def mossformer_gated_joint_attention(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`mossformer_gated_joint_attention_forward`."""
    return mossformer_gated_joint_attention_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _explicit_attend(g, causal):
    def attend(qq, lq, qk, lk, w):
        A = mossformer_joint_attention_explicit(qq, lq, qk, lk, group_size=g, causal=causal)
        return A @ w, None
    return attend


def _reference_mossformer(x, params, *, group_size=256, causal=False, norm="scalenorm", shift_tokens=True,
                          rotary=True):
    """The block with the dense $N\\times N$ joint matrix in place of the chunked attention."""
    x, p, g, e, d, k = _validate_block(x, params, norm, group_size, causal, shift_tokens, rotary)
    cfg = {"norm": norm, "e": e, "shift_tokens": shift_tokens, "rotary": rotary}
    return _block(x, p, cfg, _explicit_attend(g, causal))[0]


def _mossformer_params(rng, C, e, d, k, norm="scalenorm"):
    p = {}
    for pre, n_in, n_out in (("to_hidden", C, 2 * e), ("to_qk", C, d), ("to_out", e, C)):
        if norm == "scalenorm":
            p[f"{pre}.mdl.0.g"] = 1.0 + 0.3 * rng.standard_normal(1)
        else:
            p[f"{pre}.mdl.0.weight"] = 1.0 + 0.3 * rng.standard_normal(n_in)
            p[f"{pre}.mdl.0.bias"] = 0.3 * rng.standard_normal(n_in)
        p[f"{pre}.mdl.1.weight"] = rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)
        p[f"{pre}.mdl.1.bias"] = 0.3 * rng.standard_normal(n_out)
        p[f"{pre}.mdl.3.sequential.1.conv.weight"] = 0.5 * rng.standard_normal((n_out, 1, k)) / np.sqrt(k)
    p["qk_offset_scale.gamma"] = 0.7 + 0.3 * rng.standard_normal((4, d))
    p["qk_offset_scale.beta"] = 0.5 * rng.standard_normal((4, d))
    return p


def _sample_mossformer(rng, size):
    C, e, d, k, N, g = (2, 2, 2, 3, 5, 2) if size == "tiny" else (4, 4, 4, 5, 11, 4)
    causal = size == "tiny"  # tiny: causal scan, padded last chunk; the layernorm check runs non-causal
    return Sample(inputs={"x": rng.standard_normal((2, N, C))}, params=_mossformer_params(rng, C, e, d, k),
                  config={"group_size": g, "causal": causal})


def _random_core(rng, B=2, n=7, d=3, e=2):
    return [rng.standard_normal((B, n, d)) for _ in range(4)] + [rng.standard_normal((B, n, e)) for _ in range(2)]


def _check_chunked_equals_explicit(rng):
    """Forward and all six input gradients of the chunked form equal the dense form (padded
    last chunk, causal and not)."""
    err = 0.0
    for causal in (False, True):
        for g in (1, 3, 7, 10):
            qq, lq, qk, lk, v, u = _random_core(rng)
            (av, au), cache = mossformer_joint_attention_forward(qq, lq, qk, lk, v, u, group_size=g, causal=causal)
            A = mossformer_joint_attention_explicit(qq, lq, qk, lk, group_size=g, causal=causal)
            err = max(err, np.abs(av - A @ v).max(), np.abs(au - A @ u).max())
            gv, gu = rng.standard_normal(av.shape), rng.standard_normal(au.shape)
            grads = mossformer_joint_attention_backward((gv, gu), cache)
            dA = gv @ np.swapaxes(v, 1, 2) + gu @ np.swapaxes(u, 1, 2)
            n = qq.shape[1]
            c, i = np.arange(n) // g, np.arange(n)
            mq = (c[:, None] == c[None, :]) & ((i[None, :] <= i[:, None]) | (not causal))
            ml = (c[None, :] < c[:, None]) | (not causal)
            S = qq @ np.swapaxes(qk, 1, 2) / g
            dS = np.where(mq, dA * 2.0 * np.maximum(S, 0.0), 0.0)
            dL = np.where(ml, dA, 0.0) / (g if causal else n)
            ref = {"v": np.swapaxes(A, 1, 2) @ gv, "u": np.swapaxes(A, 1, 2) @ gu,
                   "quad_q": dS @ qk / g, "quad_k": np.swapaxes(dS, 1, 2) @ qq / g,
                   "lin_q": dL @ lk, "lin_k": np.swapaxes(dL, 1, 2) @ lq}
            err = max(err, max(np.abs(grads[key] - ref[key]).max() for key in ref))
    assert err < 1e-12, err
    return err


def _check_layernorm_variant(rng):
    """``norm="layernorm"``, non-causal, padded last chunk: finite-difference gradcheck of the block."""
    p = _mossformer_params(rng, 2, 2, 2, 3, norm="layernorm")
    s = Sample(inputs={"x": rng.standard_normal((2, 4, 2))}, params=p,
               config={"group_size": 3, "norm": "layernorm"})
    err = fd_max_rel(mossformer_gated_joint_attention_forward, mossformer_gated_joint_attention_backward, s)
    assert err < 1e-6, err
    return err


def _check_single_chunk_is_quadratic_plus_global(rng):
    """With one chunk covering the sequence (non-causal) the layer's attention is
    $\\mathrm{relu}^2(Q^qK^{q\\top}/g) + Q^lK^{l\\top}/N$ with no mask at all."""
    qq, lq, qk, lk, v, u = _random_core(rng, n=6)
    (av, _), _ = mossformer_joint_attention_forward(qq, lq, qk, lk, v, u, group_size=6)
    A = np.maximum(qq @ np.swapaxes(qk, 1, 2) / 6, 0) ** 2 + lq @ np.swapaxes(lk, 1, 2) / 6
    err = float(np.abs(av - A @ v).max())
    assert err < 1e-13, err
    return err


register(
    Mechanism(
        slug="mossformer_gated_joint_attention", family="4-linear-kernel-sparse", tier="T3",
        title="MossFormer: gated single-head joint local/global attention",
        paper="Zhao & Ma, 'MossFormer: Pushing the Performance Limit of Monaural Speech Separation using Gated "
              "Single-Head Transformer with Convolution-Augmented Joint Self-Attentions', ICASSP 2023, arXiv 2302.11824",
        official_code="modelscope/modelscope modelscope/models/audio/separation/mossformer_block.py"
                      "@2905da12205410de83f2fcdaabb4b505430890d5",
        forward=mossformer_gated_joint_attention_forward, backward=mossformer_gated_joint_attention_backward,
        sample=_sample_mossformer, reference=_reference_mossformer,
        checks={"chunked_equals_explicit_fwd_and_grads": _check_chunked_equals_explicit,
                "gradcheck_layernorm_variant": _check_layernorm_variant,
                "single_chunk_is_quadratic_plus_global": _check_single_chunk_is_quadratic_plus_global},
        docs="linear/l6b.md#mossformer-gated-joint-attention",
    ),
)
