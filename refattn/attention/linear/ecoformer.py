r"""EcoFormer: linear attention on binary codes from kernelised hashing of the shared query/key.

Liu, Pan, He, Cai, Zhuang, "EcoFormer: Energy-Saving Attention with Linear Complexity", NeurIPS 2022,
arXiv 2209.09004. Upstream: ``ziplab/EcoFormer`` ``pvt/performer.py`` (``EcoformerSelfAttention``,
``EcoformerFastAttention``, ``linear_attention_bias``) and ``pvt/hashing/ksh.py`` (``KernelSH``),
``pvt/hashing/utils.py`` (``BinaryQuantizer``) @ ``a277f9e8c75655814d25016f61ffba290bad68cf``.

Per head, with the shared projection ``to_qk`` and $u_n = x_nW_{qk}/\|x_nW_{qk}\|$:

$$D_{na} = \|u_n - a_a\|^2,\quad \sigma = \tfrac1{Nm}\textstyle\sum_{n,a}D_{na},\quad
\phi_{na} = e^{-D_{na}/(2\sigma)} - \bar\phi_a,\quad y_n = A\,\phi_n\in\mathbb R^b,\quad h_n = \mathrm{sign}(y_n),$$

the kernelised hash of Kernel-Based Supervised Hashing (RBF features against $m$ anchors
$a_a$, centred by $\bar\phi$ = ``mvec``, projected by the learned $A\in\mathbb R^{b\times m}$), then
linear attention on the codes, with $c = b + 1$:

$$o_i = \frac{h_i^\top\big(\sum_jh_jv_j^\top\big) + c\,v_i}{h_i^\top\sum_jh_j + Nc}\quad
(\texttt{numerator\_bias="self"}, \text{upstream}),\qquad
o_i = \frac{\sum_j(h_i^\top h_j + c)\,v_j}{\sum_j(h_i^\top h_j + c)}\quad(\texttt{"sum"}),$$

followed by ``proj``. ``"sum"`` is the consistent kernel form (similarity $h_i^\top h_j + c\ge 1$);
upstream's ``linear_attention_bias`` adds $c\,v_i$ instead of $c\sum_jv_j$ (weights
$h_i^\top h_j + c\,\delta_{ij}$ over the same denominator; the catalogue's conflict, a keyword here).
$A$, the anchors and $\bar\phi$ are buffers that upstream fits once, outside backpropagation, by
KSH on the first batch (``train_hashing_weight_woeig``: anchors sampled from the batch, $A$ by SGD on
a sigmoid relaxation of the code-similarity loss against the top-k/bottom-k attention graph); here
they are the configs ``A`` ``(H, b, m)``, ``anchor`` ``(H, m, d_h)``, ``mvec`` ``(H, m)``.

Backward and the non-differentiable hash
----------------------------------------
The sign is piecewise constant, so its true derivative is 0: with ``hash_grad="none"`` the codes
are held fixed, ``to_qk`` gets a zero gradient and $x$ is reached only through ``to_v``. Upstream uses the straight-through
estimator ``BinaryQuantizer`` (``hash_grad="ste"``, the upstream default):
$\partial h/\partial y := \mathbf 1[|y| < 1]$. Through the codes, with $g_h = \partial L/\partial h$
from the attention: $g_y = g_h\odot\mathbf 1[|y|<1]$, $g_\phi = A^\top g_y$, with $E = e^{-D/(2\sigma)}$:
$g_D = -g_\phi E/(2\sigma) + \tfrac1{Nm}\sum g_\phi ED/(2\sigma^2)$ (the data-dependent bandwidth is
differentiated, as upstream), $g_u = 2\sum_ag_{D,na}(u_n - a_a)$,
$g_{qk} = (g_u - u\,(u^\top g_u))/\|x W_{qk}\|$. The attention on codes (``"self"``), with
$S = \sum_jh_jv_j^\top$, $z = \sum_jh_j$, $dn_i = g_i/\mathrm{den}_i$, $c_i = -g_i\cdot o_i/\mathrm{den}_i$:
$g_{h_i} = S\,dn_i + c_iz + \big(\sum_i h_idn_i^\top\big)v_i + \sum_ic_ih_i$,
$dv_i = \big(\sum_{i'}h_{i'}dn_{i'}^\top\big)^\top h_i + c\,dn_i$; ``"sum"`` is the linear core of
`refattn.attention.linear.core` on the features $[h;\sqrt c]$. The finite-difference check uses
``hash_grad="none"`` (the exact derivative); ``hash_grad="ste"`` is checked against the chain above
by finite differences of its smooth pieces and against upstream's autograd.
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, check_choice, check_param_keys, compute_dtype
from ...nn.linear import linear_prefixed, linear_prefixed_vjp, merge_heads, split_heads
from ...registry import Mechanism, Sample, register
from .core import linear_core_backward, linear_core_forward, mT

__all__ = [
    "ecoformer_hash_forward",
    "ecoformer_hash_backward",
    "binary_linear_attention_forward",
    "binary_linear_attention_backward",
    "ecoformer_attention_forward",
    "ecoformer_attention_backward",
    "ecoformer_attention",
]

_HASH_GRAD = ("ste", "none")
_NUM_BIAS = ("self", "sum")


def ecoformer_hash_forward(qk, A, anchor, mvec):
    r"""Pre-sign hash values $y$ ``(..., H, N, b)`` of ``qk (..., H, N, d_h)`` (unvalidated; module
    docstring). The codes are ``np.sign(y)``. Returns ``(y, cache)``."""
    nrm = np.sqrt(np.sum(qk * qk, axis=-1, keepdims=True))
    u = qk / nrm
    diff = u[..., :, None, :] - anchor[:, None, :, :]  # (..., H, N, m, dh)
    D = np.sum(diff * diff, axis=-1)
    sig = np.mean(D, axis=(-2, -1), keepdims=True)
    E = np.exp(-D / (2.0 * sig))
    phi = E - mvec[:, None, :]
    y = np.einsum("...hnm,hkm->...hnk", phi, A)
    return y, {"u": u, "nrm": nrm, "diff": diff, "D": D, "sig": sig, "E": E, "A": A}


def ecoformer_hash_backward(gy, c):
    """VJP of :func:`ecoformer_hash_forward` with respect to ``qk`` (the buffers get none)."""
    gphi = np.einsum("...hnk,hkm->...hnm", gy, c["A"])
    E, D, sig = c["E"], c["D"], c["sig"]
    gD = -gphi * E / (2.0 * sig)
    gsig = np.sum(gphi * E * D, axis=(-2, -1), keepdims=True) / (2.0 * sig * sig)
    gD = gD + gsig / (D.shape[-2] * D.shape[-1])
    gu = 2.0 * np.einsum("...nm,...nmd->...nd", gD, c["diff"])
    u = c["u"]
    return (gu - u * np.sum(u * gu, axis=-1, keepdims=True)) / c["nrm"]


def binary_linear_attention_forward(h, v, *, bias: float, numerator_bias: str = "self"):
    r"""Linear attention on codes ``h (..., N, b)`` with the EcoFormer bias ``c`` (unvalidated; module
    docstring). Returns ``(out, cache)``."""
    if numerator_bias == "sum":
        f = np.concatenate([h, np.full(h.shape[:-1] + (1,), np.sqrt(bias), dtype=h.dtype)], axis=-1)
        out, state = linear_core_forward(f, f, v, causal=False, eps=0.0, normalise=True)
        return out, {"mode": "sum", "f": f, "v": v, "out": out, "state": state}
    S = mT(h) @ v
    z = np.sum(h, axis=-2)
    den = np.einsum("...nb,...b->...n", h, z) + h.shape[-2] * bias
    out = (h @ S + bias * v) / den[..., None]
    return out, {"mode": "self", "h": h, "v": v, "S": S, "z": z, "den": den, "out": out, "bias": bias}


def binary_linear_attention_backward(g, c):
    """VJP of :func:`binary_linear_attention_forward`: ``(dh, dv)``."""
    if c["mode"] == "sum":
        df1, df2, dv = linear_core_backward(g, c["f"], c["f"], c["v"], c["out"], c["state"], causal=False,
                                            normalise=True)
        return (df1 + df2)[..., :-1], dv
    h, v, S, z, den, out = c["h"], c["v"], c["S"], c["z"], c["den"], c["out"]
    dn = g / den[..., None]
    cc = -np.sum(g * out, axis=-1) / den
    dS = mT(h) @ dn
    dz = np.einsum("...n,...nb->...b", cc, h)
    dh = dn @ mT(S) + cc[..., None] * z[..., None, :] + v @ mT(dS) + dz[..., None, :]
    dv = h @ dS + c["bias"] * dn
    return dh, dv


def _validate(x, params, A, anchor, mvec, num_heads, hash_grad, numerator_bias):
    check_choice(hash_grad, "hash_grad", _HASH_GRAD)
    check_choice(numerator_bias, "numerator_bias", _NUM_BIAS)
    x = as_float(x, "x", min_ndim=2)
    C = x.shape[-1]
    if isinstance(num_heads, (bool, np.bool_)) or not isinstance(num_heads, (int, np.integer)) or num_heads < 1 \
            or C % num_heads:
        raise ValueError(f"num_heads must be a positive int dividing x's width {C}; got {num_heads!r}")
    H, dh = num_heads, C // num_heads
    spec = {"to_qk.weight": (C, C), "to_qk.bias": (C,), "to_v.weight": (C, C), "to_v.bias": (C,),
            "proj.weight": (C, C), "proj.bias": (C,)}
    check_param_keys(params, ("to_qk.weight", "to_v.weight", "proj.weight"), ("to_qk.bias", "to_v.bias", "proj.bias"),
                     where="ecoformer_attention", shapes=spec)
    P = {}
    for key, shape in spec.items():
        if params.get(key) is None:
            continue
        arr = as_float(params[key], key)
        if arr.shape != shape:
            raise ValueError(f"{key} must have shape {shape}; got {arr.shape}")
        P[key] = arr
    A = as_float(A, "A", ndim=3)
    if A.shape[0] != H:
        raise ValueError(f"A must have shape (H={H}, nbits, m); got {A.shape}")
    m = A.shape[2]
    anchor = as_float(anchor, "anchor", ndim=3)
    if anchor.shape != (H, m, dh):
        raise ValueError(f"anchor must have shape (H={H}, m={m}, d_h={dh}); got {anchor.shape}")
    mvec = as_float(mvec, "mvec", ndim=2)
    if mvec.shape != (H, m):
        raise ValueError(f"mvec must have shape (H={H}, m={m}); got {mvec.shape}")
    dt = compute_dtype(x, *P.values())
    return x.astype(dt, copy=False), {k: v.astype(dt, copy=False) for k, v in P.items()}, A.astype(dt), \
        anchor.astype(dt), mvec.astype(dt)


def ecoformer_attention_forward(x, params, *, A, anchor, mvec, num_heads: int = 1, hash_grad: str = "ste",
                                numerator_bias: str = "self"):
    r"""EcoFormer self-attention (Liu, Pan, He, Cai, Zhuang, NeurIPS 2022, arXiv 2209.09004).

    Parameters
    ----------
    x : (..., N, C)
    params : dict
        ``to_qk.weight``, ``to_v.weight`` ``(C, C)`` (optional biases: upstream ``qkv_bias=False``),
        ``proj.weight`` ``(C, C)`` and ``proj.bias``.
    A, anchor, mvec : arrays, config
        The KSH buffers ``(H, b, m)``, ``(H, m, C/H)``, ``(H, m)`` (module docstring).
    num_heads : int
    hash_grad : {"ste", "none"}
        Straight-through estimator of upstream's ``BinaryQuantizer`` or codes held fixed.
    numerator_bias : {"self", "sum"}
        Upstream's $c\,v_i$ or the consistent kernel form $c\sum_jv_j$.
    """
    x, P, A, anchor, mvec = _validate(x, params, A, anchor, mvec, num_heads, hash_grad, numerator_bias)
    H = num_heads
    qk = split_heads(linear_prefixed(P, "to_qk", x), H)
    v = split_heads(linear_prefixed(P, "to_v", x), H)
    y, hc = ecoformer_hash_forward(qk, A, anchor, mvec)
    h = np.sign(y)
    att, ac = binary_linear_attention_forward(h, v, bias=float(A.shape[1] + 1), numerator_bias=numerator_bias)
    merged = merge_heads(att)
    out = linear_prefixed(P, "proj", merged)
    cache = {"x": x, "P": P, "H": H, "qk": qk, "v": v, "y": y, "hc": hc, "ac": ac, "merged": merged, "out": out,
             "hash_grad": hash_grad}
    return out.copy(), cache


def ecoformer_attention_backward(dout, cache):
    r"""Gradients ``{"x"}`` and every parameter of :func:`ecoformer_attention_forward` (the hash
    held fixed, or the straight-through chain; module docstring)."""
    out = cache["out"]
    g = as_dout(dout, out.shape, out.dtype)
    P, H = cache["P"], cache["H"]
    grads = {}
    dmerged = linear_prefixed_vjp(grads, P, "proj", g, cache["merged"])
    dh, dv = binary_linear_attention_backward(split_heads(dmerged, H), cache["ac"])
    dx = linear_prefixed_vjp(grads, P, "to_v", merge_heads(dv), cache["x"])
    if cache["hash_grad"] == "ste":
        y = cache["y"]
        dqk = ecoformer_hash_backward(dh * (np.abs(y) < 1), cache["hc"])
    else:
        dqk = np.zeros_like(cache["qk"])
    dx = dx + linear_prefixed_vjp(grads, P, "to_qk", merge_heads(dqk), cache["x"])
    grads["x"] = dx
    return grads


def ecoformer_attention(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`ecoformer_attention_forward`."""
    return ecoformer_attention_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _codes_bruteforce(qk, A, anchor, mvec):
    """The hash codes by explicit loops over (batch, head, token, bit) (the brute-force reference)."""
    h = np.zeros(qk.shape[:-1] + (A.shape[1],))
    for idx in np.ndindex(qk.shape[:-2]):
        hd = idx[-1]
        U = qk[idx] / np.linalg.norm(qk[idx], axis=-1, keepdims=True)
        D = np.array([[np.sum((U[n] - anchor[hd, a]) ** 2) for a in range(anchor.shape[1])] for n in range(len(U))])
        phi = np.exp(-D / (2 * D.mean())) - mvec[hd]
        for n in range(len(U)):
            for kb in range(A.shape[1]):
                h[idx + (n, kb)] = np.sign(np.dot(A[hd, kb], phi[n]))
    return h


def _reference(x, params, *, A, anchor, mvec, num_heads=1, hash_grad="ste", numerator_bias="self"):
    """Explicit O(N^2) form: weights W_ij = h_i.h_j + c [i == j] ("self") or + c ("sum"), codes by brute force."""
    H = num_heads
    qk = split_heads(x @ params["to_qk.weight"] + params.get("to_qk.bias", 0.0), H)
    v = split_heads(x @ params["to_v.weight"] + params.get("to_v.bias", 0.0), H)
    h = _codes_bruteforce(qk, A, anchor, mvec)
    c = A.shape[1] + 1
    Wm = h @ mT(h) + (c * np.eye(h.shape[-2]) if numerator_bias == "self" else c)
    den = h @ np.sum(h, axis=-2)[..., :, None] + h.shape[-2] * c if numerator_bias == "self" else Wm.sum(-1, keepdims=True)
    att = (Wm @ v) / den
    return merge_heads(att) @ params["proj.weight"] + params["proj.bias"]


def _eco_buffers(rng, H, dh, nbits, m):
    anchor = rng.standard_normal((H, m, dh))
    anchor /= np.linalg.norm(anchor, axis=-1, keepdims=True)
    return {"A": rng.standard_normal((H, nbits, m)) * 2.0, "anchor": anchor, "mvec": rng.uniform(0.2, 0.6, (H, m))}


def _sample(rng, size):
    C, H, nbits, m = (4, 2, 3, 3) if size == "tiny" else (6, 2, 4, 5)
    n = int(rng.integers(3, 6)) if size == "tiny" else int(rng.integers(8, 14))
    x = rng.standard_normal((2, n, C))
    params = {"to_qk.weight": rng.standard_normal((C, C)) / np.sqrt(C),
              "to_v.weight": rng.standard_normal((C, C)) / np.sqrt(C),
              "proj.weight": rng.standard_normal((C, C)) / np.sqrt(C), "proj.bias": 0.1 * rng.standard_normal(C)}
    config = {"num_heads": H, "hash_grad": "none", "numerator_bias": _NUM_BIAS[int(rng.integers(0, 2))],
              **_eco_buffers(rng, H, C // H, nbits, m)}
    return Sample(inputs={"x": x}, params=params, config=config)


def _check_codes_bruteforce(rng):
    """The vectorised hash equals the loop reference, and the codes are +-1 bits."""
    s = _sample(rng, "small")
    cfg = s.config
    qk = split_heads(s.inputs["x"] @ s.params["to_qk.weight"], cfg["num_heads"])
    y, _ = ecoformer_hash_forward(qk, cfg["A"], cfg["anchor"], cfg["mvec"])
    h = _codes_bruteforce(qk, cfg["A"], cfg["anchor"], cfg["mvec"])
    mism = int(np.sum(np.sign(y) != h))
    assert mism == 0 and set(np.unique(h)) <= {-1.0, 1.0}, mism
    return 0.0


def _check_ste_chain(rng):
    """The straight-through backward equals its chain: for a random direction w in x, <STE grad, w> =
    d/de F(x + e w, h) + d/de F(x, h + e mask(.)dy) where F is the layer with the codes h given, dy the
    directional derivative of the pre-sign values and mask = 1[|y| < 1] (all by central differences)."""
    s = _sample(rng, "small")
    cfg = dict(s.config, hash_grad="ste")
    x, P, H = s.inputs["x"], s.params, cfg["num_heads"]
    out, cache = ecoformer_attention_forward(x, P, **cfg)
    G = rng.standard_normal(out.shape)
    w = rng.standard_normal(x.shape)
    ste = float(np.sum(ecoformer_attention_backward(G, cache)["x"] * w))
    bias = float(cfg["A"].shape[1] + 1)

    def F(xx, hh):
        vv = split_heads(xx @ P["to_v.weight"], H)
        att, _ = binary_linear_attention_forward(hh, vv, bias=bias, numerator_bias=cfg["numerator_bias"])
        return float(np.sum(G * (merge_heads(att) @ P["proj.weight"] + P["proj.bias"])))

    def Y(xx):
        return ecoformer_hash_forward(split_heads(xx @ P["to_qk.weight"], H), cfg["A"], cfg["anchor"], cfg["mvec"])[0]

    e = 1e-6
    y, h = cache["y"], np.sign(cache["y"])
    dy = (Y(x + e * w) - Y(x - e * w)) / (2 * e)
    wh = dy * (np.abs(y) < 1)
    chain = (F(x + e * w, h) - F(x - e * w, h)) / (2 * e) + (F(x, h + e * wh) - F(x, h - e * wh)) / (2 * e)
    err = abs(ste - chain) / max(abs(chain), 1e-12)
    assert err < 1e-6, (ste, chain)
    return err


register(
    Mechanism(
        slug="ecoformer_hash_attention", family="4-linear-kernel-sparse", tier="T2",
        title="EcoFormer: kernelised-hashing binary linear attention (KSH codes, straight-through or fixed)",
        paper="Liu, Pan, He, Cai, Zhuang, 'EcoFormer: Energy-Saving Attention with Linear Complexity', "
              "NeurIPS 2022, arXiv 2209.09004",
        forward=ecoformer_attention_forward, backward=ecoformer_attention_backward, sample=_sample,
        reference=_reference,
        checks={"hash_codes_equal_bruteforce": _check_codes_bruteforce,
                "straight_through_equals_its_chain": _check_ste_chain},
        docs="linear/kernel-features.md#ecoformer",
    ),
)
