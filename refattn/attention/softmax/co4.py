r"""Co4 triadic Q/K/V modulation: the CLS latent modulates the patch tokens, a per-channel top-k
pre-selects them, and attention runs over the CLS token and the $k$ selected rows only.

Paper: A. Adeel, "Beyond Attention: Toward Machines with Intrinsic Higher Mental States",
arXiv 2505.06257 (2025) (Co4: cooperative context-sensitive cognitive computation). Upstream (the
official reference implementation): ARIA-Funded-TREND/HMS
``Vision/object_recognition/attention.py@5e47a27040f003d69da93f268da718a5954db336``
(class ``ModulatedMultiHeadAttention``, used by ``transformer.py``'s ``HybridTransformerBlock`` with
``num_latents=1, num_heads=1``). The paper describes the mechanism as two-point-neuron "modulation
transfer functions" among latent Q, K, V populations under apical-drive (AD) and AD+awake states;
the code below follows what the official code computes.

Forward
-------
Token 0 of $x\in\mathbb R^{B\times N\times C}$ is the latent (CLS) token, tokens $1..P$
($P = N-1$) the patches. One fused projection $[Q, K, V] = x\,W_{qkv} + b_{qkv}$ (``qkv``), split
into $H$ heads of width $d = C/H$. Per head, with $q_0, k_0, v_0\in\mathbb R^d$ the latent row and
$q_p, k_p, v_p$ the patch rows, the three modulation laws are elementwise in the channel $j$:

$$M^Q_{pj} = q_{0j}k_{pj} + q_{pj},\qquad M^K_{pj} = k_{0j}q_{pj} + k_{pj}
\qquad\text{(apical drive: } Q_x + Q_{cls}\odot K_x\text{)},$$

$$M^V_{pj} = v_{pj}^2 + 2v_{pj} + q_{0j}k_{0j}\,(1 + |v_{0j}|)\qquad\text{(AD + awake)}.$$

**Selection** (upstream ``aggregation="max"``, ``tokens.topk(12, dim=3)``): for every channel $j$
separately, $I^Q_{rj}$ ($r = 1..k$) are the patch indices of the $k$ largest $M^Q_{\cdot j}$ in
descending order, $\hat Q_{rj} = M^Q_{I^Q_{rj}j}$, and likewise $\hat K$, $\hat V$ with their own
$I^K, I^V$. A row $r$ of $\hat Q$ therefore mixes values from different patches. Attention over
the $k+1$ rows $\tilde Q = [q_0;\hat Q]$, $\tilde K = [k_0;\hat K]$, $\tilde V = [v_0;\hat V]$:

$$O = \mathrm{softmax}\big(s\,\tilde Q\tilde K^\top\big)\tilde V\in\mathbb R^{(k+1)\times d},\qquad s = d^{-1/2}.$$

**Output** (no output projection: upstream's ``proj`` is commented out). The latent row is
$y_0 = O_0$; the selected outputs are scattered back to the positions $V$ selected them from and
added to the modulated values, which act as a skip path:

$$y_{pj} = M^V_{pj} + \sum_{r} [I^V_{rj} = p]\,O_{rj}\quad(\text{rows } r \text{ of } O \text{ after the latent row}).$$

Heads are merged back to $(B, N, C)$.

Backward (selection held fixed)
-------------------------------
The top-k is a non-differentiable selection: the gradient goes through the selected entries with
$I^Q, I^K, I^V$ held fixed (exactly torch's ``topk`` / ``scatter_`` autograd). With $G$ on $y$
(split into heads):

* $dO_0 = G_0$, $dO_{rj} = G_{I^V_{rj}j}$ (gather), $dM^V = G_{1..P}$ (the skip path);
* the attention VJP (`refattn.attention.softmax.attention_core_backward`) gives
  $d\tilde Q, d\tilde K, d\tilde V$; their latent rows go to $dq_0, dk_0, dv_0$ and the selected rows
  scatter back: $dM^Q_{I^Q_{rj}j} \mathrel{+}= d\hat Q_{rj}$, likewise $dM^K$, and $dM^V$;
* the modulation laws:
  $dq_0 \mathrel{+}= \sum_p dM^Q_p\odot k_p$, $dk_p \mathrel{+}= dM^Q_p\odot q_0$, $dq_p \mathrel{+}= dM^Q_p$;
  $dk_0 \mathrel{+}= \sum_p dM^K_p\odot q_p$, $dq_p \mathrel{+}= dM^K_p\odot k_0$, $dk_p \mathrel{+}= dM^K_p$;
  $dv_p = dM^V_p\odot(2v_p + 2)$, and with $T = \sum_p dM^V_p$:
  $dq_0 \mathrel{+}= T\odot k_0(1+|v_0|)$, $dk_0 \mathrel{+}= T\odot q_0(1+|v_0|)$,
  $dv_0 \mathrel{+}= T\odot q_0k_0\,\mathrm{sign}(v_0)$;
* then the ``qkv`` linear VJP.

$|v_0|$ is not differentiable at 0 and the selection jumps where two modulated values tie; the
registry sampler keeps $|v_{0j}|$ and the gaps between consecutive sorted values away from 0.

Conventions and reconstruction
------------------------------
* ``top_k`` (default 12, upstream's hard-coded "12 for imagenet-1k"); upstream's output reshape
  hard-codes $k+1 = 13$, here it follows ``top_k``. Requires $P\ge k$.
* ``num_heads`` (default 1, upstream's only working value: its ``squeeze(1)`` of the head axis
  fails for $H>1$). $H>1$ is **reconstruction**: the heads run independently and are merged like
  upstream's attention output ``out.transpose(1, 2).reshape(B, k+1, C)``.
* ``num_latents`` is fixed to 1 (upstream's ``squeeze(2)`` of the latent axis fails otherwise), and
  only upstream's working aggregation (``"max"``: top-k) is implemented; ``"mean"``, ``"attention"``,
  ``"learned_weight"`` and ``"gated"`` reference modules the class never builds. ``modulate_v`` is
  unused upstream (V is always modulated). Attention dropout is not modelled (eval mode).
* ``qkv.bias`` optional (upstream ``qkv_bias=True``). Weights ``(in, out)`` = torch ``weight.T``.
* The paper's recurrent latent tokens ($Q_L, K_L, V_L$ initialised randomly and evolved over
  layers) are, in the official code, the CLS row of the same projection; the RL agents of the
  same repository (``Reinforcement Learning/AttentionNeuron/solutions/torch_modules.py``) use
  task-specific variants (``k + k*context``, ``relu6(k^2 + 2k + c(1+|k|))`` with a learned
  context) that are not this layer.

Upstream parity (float64, CPU, torch 2.13; upstream class imported from the snapshot in a
/tmp scratch script): $B=2$, $N=17$, $C=8$, ``num_heads=1``, ``top_k=12``, five seeds with and
without ``qkv.bias``: output max abs error $3.6\times10^{-15}$ (relative $3.7\times10^{-16}$), gradients
max abs $7.1\times10^{-15}$ (``x``), $3.4\times10^{-14}$ (``qkv.weight``), $1.4\times10^{-14}$ (``qkv.bias``).
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_int, check_params, check_positive, compute_dtype
from ...nn.linear import init_linear_prefixed, linear_apply, linear_vjp, merge_heads, split_heads
from ...registry import Mechanism, Sample, register
from .core import attention_core_backward, attention_core_forward

__all__ = [
    "co4_param_spec",
    "init_co4_params",
    "co4_modulate",
    "co4_attention_forward",
    "co4_attention_backward",
    "co4_attention",
]


def co4_param_spec(dim: int) -> tuple[dict, tuple]:
    """``(spec, optional)`` of ``ModulatedMultiHeadAttention``: ``qkv.weight (C, 3C)``, optional ``qkv.bias``."""
    return {"qkv.weight": (dim, 3 * dim), "qkv.bias": (3 * dim,)}, ("qkv.bias",)


def init_co4_params(rng, dim: int, *, qkv_bias: bool = True) -> dict:
    """PyTorch's default ``nn.Linear`` initialisation of ``qkv`` (weight ``(in, out)``)."""
    return init_linear_prefixed(rng, dim, 3 * dim, "qkv", bias=qkv_bias)


def co4_modulate(q, k, v):
    r"""The triadic modulation laws on heads ``(..., N, d)`` (row 0 the latent):
    returns ``(M^Q, M^K, M^V)`` of shape ``(..., N-1, d)`` (see the module docstring)."""
    q0, k0, v0 = q[..., :1, :], k[..., :1, :], v[..., :1, :]
    qp, kp, vp = q[..., 1:, :], k[..., 1:, :], v[..., 1:, :]
    mq = q0 * kp + qp
    mk = k0 * qp + kp
    mv = vp * vp + 2.0 * vp + q0 * k0 * (1.0 + np.abs(v0))
    return mq, mk, mv


def _topk_index(m, k):
    # Per channel (last axis), the indices along the token axis of the k largest values, descending
    # (torch.topk's order). A stable sort of -m keeps the lower index first on exact ties.
    return np.argsort(-m, axis=-2, kind="stable")[..., :k, :]


def _scatter(src, index, n):
    # out[..., index[r, j], j] = src[..., r, j] on zeros (indices are distinct per channel).
    out = np.zeros(src.shape[:-2] + (n, src.shape[-1]), dtype=src.dtype)
    np.put_along_axis(out, index, src, axis=-2)
    return out


def co4_attention_forward(x, params, *, num_heads: int = 1, top_k: int = 12, scale=None):
    r"""Co4 modulated attention (HMS ``ModulatedMultiHeadAttention``; see the module docstring).

    Parameters
    ----------
    x : array (B, N, C)
        Token 0 is the latent (CLS) token; tokens ``1..N-1`` are the patches.
    params : dict
        ``qkv.weight (C, 3C)`` and optional ``qkv.bias (3C,)`` (torch ``weight.T``).
    num_heads : int
        Upstream fixes 1; ``H > 1`` (heads independent, then merged) is a reconstruction.
    top_k : int
        Patches kept per channel (upstream 12). Needs ``N - 1 >= top_k``.
    scale : float, optional
        Score scale; default $d^{-1/2}$, $d = C/H$.

    Returns
    -------
    out, cache
        ``out (B, N, C)``: the latent token's attention output and, for the patches, the modulated
        values plus the attention outputs scattered back to the positions V selected.
    """
    x = as_float(x, "x", ndim=3)
    b, n, c = x.shape
    nh = check_int(num_heads, "num_heads", minimum=1)
    if c % nh:
        raise ValueError(f"num_heads must divide the channels of x ({c}); got num_heads={nh}")
    kk = check_int(top_k, "top_k", minimum=1)
    if n - 1 < kk:
        raise ValueError(f"x must have at least top_k + 1 = {kk + 1} tokens (the latent token and top_k patches); "
                         f"got N={n}")
    scale = check_positive(scale, "scale", allow_none=True)
    spec, optional = co4_param_spec(c)
    p = check_params(params, spec, optional=optional, where="co4_attention (HMS ModulatedMultiHeadAttention)")
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    s = float((c // nh) ** -0.5) if scale is None else scale

    qkv = linear_apply(x, p["qkv.weight"], p.get("qkv.bias"))
    q, k, v = (split_heads(qkv[..., i * c:(i + 1) * c], nh) for i in range(3))      # (B, H, N, d)
    mq, mk, mv = co4_modulate(q, k, v)                                               # (B, H, P, d)
    iq, ik, iv = _topk_index(mq, kk), _topk_index(mk, kk), _topk_index(mv, kk)       # (B, H, k, d)
    qa = np.concatenate([q[..., :1, :], np.take_along_axis(mq, iq, axis=-2)], axis=-2)
    ka = np.concatenate([k[..., :1, :], np.take_along_axis(mk, ik, axis=-2)], axis=-2)
    va = np.concatenate([v[..., :1, :], np.take_along_axis(mv, iv, axis=-2)], axis=-2)
    o, acache = attention_core_forward(qa, ka, va, scale=s)                          # (B, H, k+1, d)
    yp = mv + _scatter(o[..., 1:, :], iv, n - 1)
    y = merge_heads(np.concatenate([o[..., :1, :], yp], axis=-2))
    cache = {"x": x, "p": p, "q": q, "k": k, "v": v, "iq": iq, "ik": ik, "iv": iv, "acache": acache,
             "nh": nh, "shape": y.shape}
    return y, cache


def co4_attention_backward(dout, cache):
    """Gradient of :func:`co4_attention_forward` with the top-k selections held fixed: ``x`` and every parameter."""
    x, p, nh = cache["x"], cache["p"], cache["nh"]
    q, k, v, iq, ik, iv = (cache[n] for n in ("q", "k", "v", "iq", "ik", "iv"))
    g = split_heads(as_dout(dout, cache["shape"], x.dtype), nh)                      # (B, H, N, d)
    npatch = q.shape[-2] - 1
    do = np.concatenate([g[..., :1, :], np.take_along_axis(g[..., 1:, :], iv, axis=-2)], axis=-2)
    ga = attention_core_backward(do, cache["acache"])
    dmq = _scatter(ga["q"][..., 1:, :], iq, npatch)
    dmk = _scatter(ga["k"][..., 1:, :], ik, npatch)
    dmv = g[..., 1:, :] + _scatter(ga["v"][..., 1:, :], iv, npatch)

    q0, k0, v0 = q[..., :1, :], k[..., :1, :], v[..., :1, :]
    qp, kp, vp = q[..., 1:, :], k[..., 1:, :], v[..., 1:, :]
    gate = 1.0 + np.abs(v0)
    t = dmv.sum(axis=-2, keepdims=True)
    dq0 = ga["q"][..., :1, :] + (dmq * kp).sum(axis=-2, keepdims=True) + t * k0 * gate
    dk0 = ga["k"][..., :1, :] + (dmk * qp).sum(axis=-2, keepdims=True) + t * q0 * gate
    dv0 = ga["v"][..., :1, :] + t * q0 * k0 * np.sign(v0)
    dqp = dmq + dmk * k0
    dkp = dmq * q0 + dmk
    dvp = dmv * (2.0 * vp + 2.0)
    dqkv = np.concatenate([merge_heads(np.concatenate(pair, axis=-2))
                           for pair in ((dq0, dqp), (dk0, dkp), (dv0, dvp))], axis=-1)
    lq = linear_vjp(dqkv, x, p["qkv.weight"], "qkv.bias" in p)
    out = {"x": lq["x"], "qkv.weight": lq["weight"]}
    if "qkv.bias" in p:
        out["qkv.bias"] = lq["bias"]
    return out


def co4_attention(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`co4_attention_forward`."""
    return co4_attention_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================

_MARGIN = 1e-3


def _well_separated(x, params, nh, kk):
    # No kink at the sample: |v0| and the gaps between consecutive sorted modulated values (down to
    # rank k+1, which decides membership) stay above _MARGIN.
    c = x.shape[-1]
    qkv = x @ params["qkv.weight"] + params.get("qkv.bias", 0.0)
    q, k, v = (split_heads(qkv[..., i * c:(i + 1) * c], nh) for i in range(3))
    if np.abs(v[..., 0, :]).min() < _MARGIN:
        return False
    for m in co4_modulate(q, k, v):
        srt = -np.sort(-m, axis=-2)[..., :kk + 1, :]
        if m.shape[-2] > 1 and (srt[..., :-1, :] - srt[..., 1:, :]).min() < _MARGIN:
            return False
    return True


def _sample(rng, size):
    b, n, c, nh, kk = (2, 5, 4, 1, 2) if size == "tiny" else (2, int(rng.integers(6, 10)), 6, 2, 3)
    while True:
        x = rng.standard_normal((b, n, c))
        p = init_co4_params(rng, c, qkv_bias=size == "tiny" or bool(rng.random() < 0.5))
        p["qkv.weight"] = p["qkv.weight"] * 2.0
        if _well_separated(x, p, nh, kk):
            return Sample(inputs={"x": x}, params=p, config={"num_heads": nh, "top_k": kk})


def _reference(x, params, *, num_heads=1, top_k=12, scale=None):
    # Loops per batch element, head and channel; the top-k by a full Python sort of (value, index).
    b, n, c = x.shape
    d = c // num_heads
    s = d ** -0.5 if scale is None else scale
    out = np.zeros((b, n, c))
    for bb in range(b):
        qkv = x[bb] @ params["qkv.weight"] + params.get("qkv.bias", 0.0)
        for h in range(num_heads):
            q, k, v = (qkv[:, i * c + h * d:i * c + (h + 1) * d] for i in range(3))
            sel = {}
            for name, m in zip("qkv", co4_modulate(q, k, v)):
                rows = np.zeros((top_k, d))
                idx = np.zeros((top_k, d), dtype=int)
                for j in range(d):
                    order = sorted(range(n - 1), key=lambda i, j=j, m=m: (-m[i, j], i))[:top_k]
                    idx[:, j] = order
                    rows[:, j] = m[order, j]
                sel[name] = (m, rows, idx)
            qa = np.vstack([q[:1], sel["q"][1]])
            ka = np.vstack([k[:1], sel["k"][1]])
            va = np.vstack([v[:1], sel["v"][1]])
            e = s * qa @ ka.T
            w = np.exp(e - e.max(axis=1, keepdims=True))
            o = (w / w.sum(axis=1, keepdims=True)) @ va
            y = np.vstack([o[:1], sel["v"][0]])
            for r in range(top_k):
                for j in range(d):
                    y[1 + sel["v"][2][r, j], j] += o[1 + r, j]
            out[bb, :, h * d:(h + 1) * d] = y
    return out


def _check_patch_permutation_equivariance(rng):
    # The per-channel top-k reads values, not positions, and the scatter writes back to the
    # positions it read from: permuting the patches (latent token fixed) permutes the patch outputs
    # and leaves the latent output unchanged.
    s = _sample(rng, "small")
    x = s.inputs["x"]
    perm = np.concatenate([[0], 1 + rng.permutation(x.shape[1] - 1)])
    y = co4_attention(x, s.params, **s.config)
    err = float(np.abs(co4_attention(x[:, perm], s.params, **s.config) - y[:, perm]).max())
    assert err < 1e-12, f"permuting the patches does not permute the output (error {err:.2e})"
    return err


def _check_unselected_patches_skip(rng):
    # A patch channel V did not select receives only the skip path M^V; selected ones receive more.
    s = _sample(rng, "small")
    x, p, cfg = s.inputs["x"], s.params, s.config
    y, cache = co4_attention_forward(x, p, **cfg)
    c, nh = x.shape[-1], cfg["num_heads"]
    mv = co4_modulate(cache["q"], cache["k"], cache["v"])[2]
    chosen = _scatter(np.ones(cache["iv"].shape), cache["iv"], x.shape[1] - 1).astype(bool)
    yp = split_heads(y, nh, c // nh)[..., 1:, :]
    err = float(np.abs(np.where(chosen, 0.0, yp - mv)).max())
    assert err == 0.0, f"an unselected patch channel differs from its modulated value by {err:.2e}"
    assert chosen.sum(axis=-2).min() == cfg["top_k"] == chosen.sum(axis=-2).max()
    return err


def _check_reduces_to_attention_with_zero_latent(rng):
    # With a zero latent row (q0 = k0 = v0 = 0, no bias) the laws reduce to M^Q = Q_x, M^K = K_x,
    # M^V = V_x^2 + 2 V_x, and the latent output is softmax(0 * ...)-weighted: O_0 = mean of [0; V-hat].
    s = _sample(rng, "small")
    x = s.inputs["x"].copy()
    x[:, 0] = 0.0
    p = {"qkv.weight": s.params["qkv.weight"]}
    cfg = s.config
    y, cache = co4_attention_forward(x, p, **cfg)
    q, k, v = cache["q"], cache["k"], cache["v"]
    mq, mk, mv = co4_modulate(q, k, v)
    err = max(float(np.abs(mq - q[..., 1:, :]).max()), float(np.abs(mk - k[..., 1:, :]).max()),
              float(np.abs(mv - (v[..., 1:, :] ** 2 + 2 * v[..., 1:, :])).max()))
    vh = np.take_along_axis(mv, cache["iv"], axis=-2)
    c, nh = x.shape[-1], cfg["num_heads"]
    y0 = split_heads(y, nh, c // nh)[..., 0, :]
    err = max(err, float(np.abs(y0 - vh.sum(axis=-2) / (cfg["top_k"] + 1)).max()))
    assert err < 1e-12, f"zero-latent reduction off by {err:.2e}"
    return err


register(
    Mechanism(
        slug="triadic_modulation_co4", family="1-softmax", tier="T3",
        official_code="ARIA-Funded-TREND/HMS Vision/object_recognition/attention.py@5e47a27 (ModulatedMultiHeadAttention)",
        title="Co4 triadic Q/K/V modulation with per-channel top-k pre-selection (HMS ModulatedMultiHeadAttention)",
        paper="Adeel, Beyond Attention: Toward Machines with Intrinsic Higher Mental States, arXiv 2505.06257",
        forward=co4_attention_forward, backward=co4_attention_backward, sample=_sample, reference=_reference,
        docs="softmax/s9.md#triadic_modulation_co4",
        checks={"patch_permutation_equivariance": _check_patch_permutation_equivariance,
                "unselected_patches_skip": _check_unselected_patches_skip,
                "reduces_with_zero_latent": _check_reduces_to_attention_with_zero_latent},
        notes="Top-k selection: the backward holds the per-channel selections fixed (torch topk/scatter autograd).",
    ),
)
