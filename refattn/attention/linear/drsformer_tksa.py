r"""DRSformer TKSA: top-k sparse channel ("transposed") attention with mixed sparsity ratios.

Chen, Li, Li, Pan, "Learning a Sparse Transformer Network for Effective Image Deraining",
CVPR 2023, arXiv 2303.11950. Official code: cschenxiang/DRSformer
``basicsr/models/archs/DRSformer_arch.py@e77bbb4ecc59aaa2cd170a0f8f65b188a9dd77c6`` (class
``Attention``, "Top-K Sparse Attention (TKSA)").

Forward
-------
On an image $x\in\mathbb R^{B\times C\times H\times W}$: $[Q;K;V] = \mathrm{DWConv}_{3\times3}(\mathrm{Conv}_{1\times1}(x))$
(``qkv``, ``qkv_dwconv``), split into heads of $c = C/h$ channels, each a $c\times HW$ matrix, and
L2-normalised along $HW$ (``F.normalize``: $\hat q = q/\max(\|q\|, \epsilon)$, $\epsilon = 10^{-12}$).
The channel-by-channel scores $S = \tau_h\hat Q\hat K^\top\in\mathbb R^{c\times c}$ ($\tau$ =
``temperature``, one per head) are sparsified four times: for each ratio
$r\in\{\tfrac12,\tfrac23,\tfrac34,\tfrac45\}$ keep the $k_r = \lfloor rc\rfloor$ largest entries of
every row (upstream ``int(C*2/3)``: the floor of an exact quotient), the others $-\infty$, and

$$A_r = \mathrm{softmax}(S\ \text{masked to the row top-}k_r),\qquad
O = \sum_r w_r\,A_rV,\qquad y = \mathrm{Conv}_{1\times1}(O)\ (\texttt{project\_out}),$$

with learnable scalars $w_r$ (``attn1..attn4``, initialised to 0.2).

Backward (the top-$k$ sets held fixed)
-------------------------------------
With $G = \partial L/\partial O$ (per head, $c\times HW$): $dw_r = \langle G, A_rV\rangle$,
$dV = \sum_r w_rA_r^\top G$, $dA_r = w_rGV^\top$, and the four masked-softmax VJPs share $S$:
$dS = \sum_r A_r\odot(dA_r - \mathrm{rowsum}(A_r\odot dA_r))$ (masked entries have $A_r = 0$ and
receive nothing). Then $d\tau_h = \sum dS\odot\hat Q\hat K^\top$, $d\hat Q = \tau\,dS\,\hat K$,
$d\hat K = \tau\,dS^\top\hat Q$, the L2-normalisation VJP
$dq = (d\hat q - \hat q\langle d\hat q,\hat q\rangle)/\|q\|$ (or $d\hat q/\epsilon$ when
$\|q\|<\epsilon$), and the depthwise and $1\times1$ convolution VJPs (`refattn.nn.conv`). The
top-$k$ sets change only where two scores of a row tie; the sampler keeps them apart.

Conventions
-----------
Parameters under the upstream names with torch's conv layout (``qkv.weight (3C, C, 1, 1)``,
``qkv_dwconv.weight (3C, 1, 3, 3)``, ``project_out.weight (C, C, 1, 1)``, optional ``.bias``
entries: DRSformer builds them with ``bias=False``), ``temperature (h, 1, 1)`` and ``attn1`` ...
``attnR`` of shape ``(1,)``, one per ratio. ``ratios`` is a keyword of integer pairs
$(p, q)$ meaning $k = \lfloor cp/q\rfloor$ (exact integer arithmetic), default upstream's four.
With every ratio 1 the mechanism is Restormer-style channel attention scaled by $\sum_r w_r$.

Agreement with upstream (the upstream ``Attention`` module run in float64): output 4.4e-16
relative, gradients <= 1e-15 relative except the four mixing weights (<= 2e-13, sums over every
entry).
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_int, check_params, compute_dtype
from ...nn.conv import conv_apply, conv_vjp
from ...nn.softmax import softmax_lse, softmax_vjp
from ...registry import Mechanism, Sample, register
from ._samples import draw_until, topk_margin
from .core import mT, topk_keep

__all__ = ["DRSFORMER_RATIOS", "drsformer_tksa_forward", "drsformer_tksa_backward", "drsformer_tksa",
           "drsformer_topk_sizes"]

DRSFORMER_RATIOS = ((1, 2), (2, 3), (3, 4), (4, 5))
_EPS = 1e-12  # F.normalize default


def drsformer_topk_sizes(c: int, ratios=DRSFORMER_RATIOS) -> tuple[int, ...]:
    """$k_r = \\lfloor c\\,p/q\\rfloor$ for every ratio $(p, q)$ (upstream ``int(C*p/q)``)."""
    return tuple((c * p) // q for p, q in ratios)


def _check_ratios(ratios, c):
    if not isinstance(ratios, (tuple, list)) or not ratios:
        raise TypeError(f"ratios must be a non-empty tuple of (p, q) integer pairs; got {ratios!r}")
    out = []
    for r in ratios:
        if not isinstance(r, (tuple, list)) or len(r) != 2:
            raise TypeError(f"ratios must hold (p, q) integer pairs; got {r!r}")
        p, q = check_int(r[0], "ratios p", minimum=1), check_int(r[1], "ratios q", minimum=1)
        if p > q:
            raise ValueError(f"ratios must be <= 1 (p <= q); got {r!r}")
        if (c * p) // q < 1:
            raise ValueError(f"ratios {r!r} keeps no channel of a head of c={c} channels (floor(c p / q) = 0)")
        out.append((p, q))
    return tuple(out)


def _l2n(x, eps):
    n = np.linalg.norm(x, axis=-1, keepdims=True)
    r = np.maximum(n, eps)
    return x / r, (n, r)


def _l2n_vjp(dn, xn, stats, eps):
    n, r = stats
    return np.where(n > eps, (dn - xn * np.sum(dn * xn, axis=-1, keepdims=True)) / r, dn / eps)


def drsformer_tksa_forward(x, params, *, num_heads: int, ratios=DRSFORMER_RATIOS):
    r"""DRSformer's top-k sparse channel attention (TKSA) on an image ``x (B, C, H, W)``.

    Parameters
    ----------
    x : (B, C, H, W)
    params : dict
        ``temperature (num_heads, 1, 1)``, ``qkv.weight (3C, C, 1, 1)``,
        ``qkv_dwconv.weight (3C, 1, 3, 3)``, ``project_out.weight (C, C, 1, 1)`` (optional
        ``qkv.bias``, ``qkv_dwconv.bias``, ``project_out.bias``) and ``attn1`` ... ``attnR``
        ``(1,)``, one per ratio.
    num_heads : int
        ``C`` must be a multiple of it.
    ratios : tuple of (p, q)
        Row top-$k$ sizes $\lfloor cp/q\rfloor$ ($c = C/h$); default $(1/2, 2/3, 3/4, 4/5)$.

    Returns
    -------
    y : (B, C, H, W), cache
    """
    x = as_float(x, "x", ndim=4)
    num_heads = check_int(num_heads, "num_heads", minimum=1)
    b, c_all, hh, ww = x.shape
    if c_all % num_heads:
        raise ValueError(f"x's channel count C={c_all} (axis 1) must be a multiple of num_heads={num_heads}")
    c = c_all // num_heads
    ratios = _check_ratios(ratios, c)
    spec = {"temperature": (num_heads, 1, 1), "qkv.weight": (3 * c_all, c_all, 1, 1), "qkv.bias": (3 * c_all,),
            "qkv_dwconv.weight": (3 * c_all, 1, 3, 3), "qkv_dwconv.bias": (3 * c_all,),
            "project_out.weight": (c_all, c_all, 1, 1), "project_out.bias": (c_all,)}
    spec.update({f"attn{i + 1}": (1,) for i in range(len(ratios))})
    p = check_params(params, spec, optional=("qkv.bias", "qkv_dwconv.bias", "project_out.bias"),
                     where="drsformer_tksa")
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    y1 = conv_apply(x, p["qkv.weight"], p.get("qkv.bias"))
    y2 = conv_apply(y1, p["qkv_dwconv.weight"], p.get("qkv_dwconv.bias"), padding=1, groups=3 * c_all)
    q, k, v = (t.reshape(b, num_heads, c, hh * ww) for t in np.split(y2, 3, axis=1))
    qn, qs = _l2n(q, _EPS)
    kn, ks = _l2n(k, _EPS)
    gram = qn @ mT(kn)
    s = gram * p["temperature"]
    attn, out = [], np.zeros_like(v)
    for i, kk in enumerate(drsformer_topk_sizes(c, ratios)):
        a, _ = softmax_lse(np.where(topk_keep(s, kk), s, -np.inf), axis=-1)
        attn.append(a)
        out = out + p[f"attn{i + 1}"] * (a @ v)
    o = out.reshape(b, c_all, hh, ww)
    y = conv_apply(o, p["project_out.weight"], p.get("project_out.bias"))
    cache = {"x": x, "p": p, "y1": y1, "y2": y2, "qn": qn, "kn": kn, "qs": qs, "ks": ks, "gram": gram, "v": v,
             "attn": attn, "o": o, "y_shape": y.shape}
    return y, cache


def drsformer_tksa_backward(dout, cache):
    r"""Gradients of `drsformer_tksa_forward` for ``x`` and every parameter, the row top-$k$ sets
    held fixed (see the module docstring)."""
    p, x = cache["p"], cache["x"]
    g = as_dout(dout, cache["y_shape"], x.dtype)
    c_all = x.shape[1]
    grads = {}
    proj = conv_vjp(g, cache["o"], p["project_out.weight"], has_bias="project_out.bias" in p)
    grads["project_out.weight"] = proj["weight"]
    if "project_out.bias" in p:
        grads["project_out.bias"] = proj["bias"]
    v, qn, kn, gram = cache["v"], cache["qn"], cache["kn"], cache["gram"]
    go = proj["x"].reshape(v.shape)
    dv = np.zeros_like(v)
    ds = np.zeros_like(gram)
    for i, a in enumerate(cache["attn"]):
        w = p[f"attn{i + 1}"]
        grads[f"attn{i + 1}"] = np.array([np.sum(go * (a @ v))], dtype=x.dtype)
        dv = dv + w * (mT(a) @ go)
        ds = ds + softmax_vjp(a, w * (go @ mT(v)))
    temp = p["temperature"]
    grads["temperature"] = np.sum(ds * gram, axis=(0, 2, 3))[:, None, None]
    dgram = ds * temp
    dq = _l2n_vjp(dgram @ kn, qn, cache["qs"], _EPS)
    dk = _l2n_vjp(mT(dgram) @ qn, kn, cache["ks"], _EPS)
    shape = (x.shape[0], c_all) + x.shape[2:]
    dy2 = np.concatenate([t.reshape(shape) for t in (dq, dk, dv)], axis=1)
    dw = conv_vjp(dy2, cache["y1"], p["qkv_dwconv.weight"], padding=1, groups=3 * c_all,
                  has_bias="qkv_dwconv.bias" in p)
    grads["qkv_dwconv.weight"] = dw["weight"]
    if "qkv_dwconv.bias" in p:
        grads["qkv_dwconv.bias"] = dw["bias"]
    d1 = conv_vjp(dw["x"], x, p["qkv.weight"], has_bias="qkv.bias" in p)
    grads["qkv.weight"] = d1["weight"]
    if "qkv.bias" in p:
        grads["qkv.bias"] = d1["bias"]
    grads["x"] = d1["x"]
    return grads


def drsformer_tksa(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of `drsformer_tksa_forward`."""
    return drsformer_tksa_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _scores(x, params, num_heads, ratios):
    """The sparsified scores $S$ of every head (for the sampler's margin)."""
    return drsformer_tksa_forward(x, params, num_heads=num_heads, ratios=ratios)[1]["gram"] * params["temperature"]


def _draw(rng, size, bias=False, c_all=None, num_heads=None, ratios=DRSFORMER_RATIOS):
    if size == "tiny":
        c_all, num_heads, hw = c_all or 3, num_heads or 1, (2, 2)
    else:
        c_all, num_heads, hw = c_all or 8, num_heads or 2, (3, 3)
    params = {"temperature": rng.uniform(1.0, 2.0, (num_heads, 1, 1)),
              "qkv.weight": rng.standard_normal((3 * c_all, c_all, 1, 1)) / np.sqrt(c_all),
              "qkv_dwconv.weight": rng.standard_normal((3 * c_all, 1, 3, 3)) / 3.0,
              "project_out.weight": rng.standard_normal((c_all, c_all, 1, 1)) / np.sqrt(c_all)}
    if bias:
        for key, n in (("qkv.bias", 3 * c_all), ("qkv_dwconv.bias", 3 * c_all), ("project_out.bias", c_all)):
            params[key] = 0.2 * rng.standard_normal(n)
    params.update({f"attn{i + 1}": np.array([0.2 + 0.1 * rng.standard_normal()]) for i in range(len(ratios))})
    sizes = sorted(set(drsformer_topk_sizes(c_all // num_heads, ratios)))

    def margin(x):
        s = _scores(x, params, num_heads, ratios)
        return min(topk_margin(s, kk) for kk in sizes)

    x = draw_until(rng, lambda r: r.standard_normal((2, c_all) + hw), margin, 0.02)
    return Sample(inputs={"x": x}, params=params, config={"num_heads": num_heads, "ratios": ratios})


def _sample(rng, size):
    return _draw(rng, size)


def _reference(x, params, *, num_heads, ratios=DRSFORMER_RATIOS):
    """Explicit loops: per (batch, head, row) a full sort for each ratio's kept set."""
    b, c_all, hh, ww = x.shape
    c = c_all // num_heads

    def conv1(t, w, bias):
        y = np.einsum("oc,bchw->bohw", w[:, :, 0, 0], t)
        return y if bias is None else y + bias[None, :, None, None]

    y1 = conv1(x, params["qkv.weight"], params.get("qkv.bias"))
    pad = np.pad(y1, ((0, 0), (0, 0), (1, 1), (1, 1)))
    y2 = np.zeros_like(y1)
    for i in range(3):
        for j in range(3):
            y2 += params["qkv_dwconv.weight"][None, :, 0, i, j, None, None] * pad[:, :, i:i + hh, j:j + ww]
    if params.get("qkv_dwconv.bias") is not None:
        y2 += params["qkv_dwconv.bias"][None, :, None, None]
    q, k, v = (t.reshape(b, num_heads, c, hh * ww) for t in np.split(y2, 3, axis=1))
    out = np.zeros_like(v)
    for bi in range(b):
        for h in range(num_heads):
            qn = q[bi, h] / np.linalg.norm(q[bi, h], axis=-1, keepdims=True)
            kn = k[bi, h] / np.linalg.norm(k[bi, h], axis=-1, keepdims=True)
            s = params["temperature"][h, 0, 0] * (qn @ kn.T)
            for r, kk in enumerate(drsformer_topk_sizes(c, ratios)):
                for i in range(c):
                    order = sorted(range(c), key=lambda j: -s[i, j])[:kk]
                    e = np.exp(s[i, order] - s[i, order].max())
                    out[bi, h, i] += params[f"attn{r + 1}"][0] * (e / e.sum()) @ v[bi, h, order]
    return conv1(out.reshape(b, c_all, hh, ww), params["project_out.weight"], params.get("project_out.bias"))


def _check_full_ratios_channel_attention(rng):
    """All ratios 1: plain (Restormer MDTA) channel attention times the sum of the weights."""
    s = _draw(rng, "small", ratios=((1, 1), (1, 1)))
    x, p = s.inputs["x"], s.params
    y, cache = drsformer_tksa_forward(x, p, **s.config)
    a, _ = softmax_lse(cache["gram"] * p["temperature"], axis=-1)
    o = (p["attn1"] + p["attn2"]) * (a @ cache["v"])
    ref = conv_apply(o.reshape(x.shape), p["project_out.weight"])
    err = float(np.max(np.abs(y - ref)))
    assert err < 1e-12, f"ratios = 1 differs from channel attention x sum(w) by {err}"
    return err


def _check_topk_sizes(rng):
    """Upstream's int(C/2), int(C*2/3), int(C*3/4), int(C*4/5) for every head width up to 64."""
    for c in range(2, 65):
        assert drsformer_topk_sizes(c) == (int(c / 2), int(c * 2 / 3), int(c * 3 / 4), int(c * 4 / 5)), c
    return 0.0


register(
    Mechanism(
        slug="drsformer_topk_channel_attention", family="4-linear-kernel-sparse", tier="T2",
        title="DRSformer TKSA: top-k sparse channel attention with mixed sparsity ratios",
        paper="Chen, Li, Li, Pan, 'Learning a Sparse Transformer Network for Effective Image Deraining', "
              "CVPR 2023, arXiv 2303.11950",
        forward=drsformer_tksa_forward, backward=drsformer_tksa_backward, sample=_sample, reference=_reference,
        checks={"ratios_one_is_channel_attention_times_sum_w": _check_full_ratios_channel_attention,
                "topk_sizes_equal_upstream_int": _check_topk_sizes},
        docs="linear/sparse-attention.md#drsformer-tksa",
    ),
)
