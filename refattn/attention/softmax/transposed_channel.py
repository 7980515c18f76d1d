r"""Transposed ("channel") attention: Restormer's MDTA, and the linear-projection form of XCiT / DAT.

Attention runs across *channels* instead of pixels: per head, the $c_h\times c_h$ map between the
L2-normalised channel rows of $Q$ and $K$ (each row a whole feature map) mixes the channel rows of
$V$. The cost is $O(HW c^2)$, linear in the number of pixels.

Papers: Zamir, Arora, Khan, Hayat, Khan, Yang, "Restormer: Efficient Transformer for
High-Resolution Image Restoration", CVPR 2022, arXiv 2111.09881 (MDTA); Chen, Zhang, Gu, Kong,
Yang, Yu, "Dual Aggregation Transformer for Image Super-Resolution", ICCV 2023, arXiv 2308.03364
(channel self-attention). Upstream: swz30/Restormer ``basicsr/models/archs/restormer_arch.py``
@df766d5521afd21cce56e24159f300b30ebf3fb0 (``Attention``); zhengchen1999/DAT
``basicsr/archs/dat_arch.py`` @1645c64fad7c94d94abd090bd1319eec1f26f7cc
(``Adaptive_Channel_Attention``, which builds on XCiT's ``XCA``).

Forward
-------
``projection="conv"`` (Restormer MDTA, default), ``x (B, C, H, W)``:

$$[Q; K; V] = \mathrm{DWConv}_{3\times3}\big(\mathrm{Conv}_{1\times1}(x)\big),\qquad
\hat Q_{h,i} = \frac{Q_{h,i}}{\max(\lVert Q_{h,i}\rVert_2, 10^{-12})},\ \hat K\ \text{likewise},$$
$$A_h = \mathrm{softmax}_j\big(\tau_h\,\hat Q_h\hat K_h^\top\big)\in\mathbb R^{c_h\times c_h},\qquad
O_h = A_hV_h,\qquad y = \mathrm{Conv}_{1\times1}(O),$$

with $Q_h, K_h, V_h\in\mathbb R^{c_h\times HW}$ (head-major channel split, ``'b (head c) h w -> b head c
(h w)'``), norms over the $HW$ axis (``F.normalize(dim=-1)``), the learned per-head temperature
$\tau$ (``temperature (H_a, 1, 1)``, init 1). Parameters: ``qkv.weight (3C, C, 1, 1)``,
``qkv_dwconv.weight (3C, 1, 3, 3)`` (groups $3C$, padding 1), ``project_out.weight (C, C, 1, 1)``
(torch layout), each with an optional ``.bias`` (Restormer's ``bias=False`` default omits them).
The block around it ($x + \mathrm{MDTA}(\mathrm{LN}(x))$, then the GDFN) is not part of this record.

``projection="linear"`` (XCiT ``XCA``; DAT's channel self-attention), ``x (B, N, C)``:
$[Q; K; V] = xW_{qkv} (+b)$ (``qkv.weight (C, 3C)``, torch ``weight.T``), the same normalised
channel attention over the $N$ tokens, and $y = O^\top W_p + b_p$ (``proj``). DAT's
``Adaptive_Channel_Attention`` adds an *adaptive interaction module* on top (a depthwise-conv
branch with BatchNorm and two sigmoid gates between the attention output and ``proj``); that
branch is **not** included here, so ``"linear"`` is DAT's channel attention with the AIM removed
(equivalently XCiT's XCA with ``qk_scale`` unused: neither scales by $d^{-1/2}$).

Backward (derivation)
---------------------
With $G = \partial L/\partial O_h$: $dV_h = A_h^\top G$, $dA_h = GV_h^\top$,
$dS = A\odot(dA - \mathrm{rowsum}(A\odot dA))$ (`refattn.nn.softmax.softmax_vjp`),
$d\tau_h = \sum dS\odot\hat Q_h\hat K_h^\top$, $d\hat Q = \tau\,dS\,\hat K$, $d\hat K = \tau\,dS^\top\hat Q$,
and the normalisation VJP per channel row,
$dQ = (d\hat Q - \hat Q\,\langle\hat Q, d\hat Q\rangle)/\lVert Q\rVert$. The projections' VJPs are
`refattn.nn.conv.conv_vjp` (the depthwise conv's is the per-channel transposed correlation) or
`refattn.nn.linear.linear_vjp`.

Measured agreement with upstream (float64, CPU, torch 2.13, scratch script, not committed): see
``docs/softmax/vision-attention.md``.
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_choice, check_params, compute_dtype
from ...nn.conv import conv_apply, conv_vjp
from ...nn.linear import linear_apply, linear_vjp
from ...nn.softmax import softmax_lse, softmax_vjp
from ...registry import Mechanism, Sample, register
from .core import check_size

__all__ = [
    "CHANNEL_PROJECTIONS",
    "channel_attention_param_spec",
    "init_channel_attention_params",
    "channel_attention_apply",
    "channel_attention_vjp",
    "transposed_channel_attention_forward",
    "transposed_channel_attention_backward",
    "transposed_channel_attention",
]

CHANNEL_PROJECTIONS = ("conv", "linear")


def channel_attention_param_spec(dim: int, num_heads: int, *, projection: str = "conv") -> tuple[dict, tuple]:
    """``(spec, optional)``: upstream names and shapes for MDTA (``"conv"``) or XCA/DAT (``"linear"``)."""
    check_choice(projection, "projection", CHANNEL_PROJECTIONS)
    c = dim
    if projection == "conv":
        spec = {"qkv.weight": (3 * c, c, 1, 1), "qkv.bias": (3 * c,), "qkv_dwconv.weight": (3 * c, 1, 3, 3),
                "qkv_dwconv.bias": (3 * c,), "project_out.weight": (c, c, 1, 1), "project_out.bias": (c,),
                "temperature": (num_heads, 1, 1)}
        return spec, ("qkv.bias", "qkv_dwconv.bias", "project_out.bias")
    spec = {"qkv.weight": (c, 3 * c), "qkv.bias": (3 * c,), "proj.weight": (c, c), "proj.bias": (c,),
            "temperature": (num_heads, 1, 1)}
    return spec, ("qkv.bias", "proj.bias")


def init_channel_attention_params(rng, dim: int, num_heads: int, *, projection: str = "conv",
                                  bias: bool = False) -> dict:
    """Random parameters (weights $U(\\pm1/\\sqrt{fan_{in}})$, biases $0.1\\mathcal N$ when ``bias``,
    ``temperature`` $1 + 0.3\\,\\mathcal N$, kept positive)."""
    spec, optional = channel_attention_param_spec(dim, num_heads, projection=projection)
    p = {}
    for k, shp in spec.items():
        if k in optional and not bias:
            continue
        if k == "temperature":
            p[k] = np.abs(1.0 + 0.3 * rng.standard_normal(shp)) + 0.1
        elif len(shp) >= 2:
            fan_in = shp[0] if len(shp) == 2 else int(np.prod(shp[1:]))
            p[k] = rng.uniform(-1.0, 1.0, shp) / np.sqrt(fan_in)
        else:
            p[k] = 0.1 * rng.standard_normal(shp)
    return p


# --------------------------------------------------------------------------------------------
# The channel-attention core on (B, H_a, c_h, L) rows, unvalidated


def channel_attention_apply(q, k, v, temperature):
    r"""$O = \mathrm{softmax}(\tau\,\hat Q\hat K^\top)V$ on channel rows ``q, k, v (..., H_a, c_h, L)``
    normalised over ``L``; ``temperature (H_a,)``. Returns ``(O, cache)``."""
    qn = np.maximum(np.linalg.norm(q, axis=-1, keepdims=True), 1e-12)
    kn = np.maximum(np.linalg.norm(k, axis=-1, keepdims=True), 1e-12)
    qh, kh = q / qn, k / kn
    cos = qh @ np.swapaxes(kh, -1, -2)                                   # (..., H_a, c_h, c_h)
    a, _ = softmax_lse(cos * temperature[:, None, None], axis=-1)
    return a @ v, {"qh": qh, "kh": kh, "qn": qn, "kn": kn, "cos": cos, "a": a, "v": v, "tau": temperature}


def channel_attention_vjp(do, cache) -> dict:
    """VJP of `channel_attention_apply`: ``{"q", "k", "v", "temperature"}``."""
    a, v, qh, kh, tau = cache["a"], cache["v"], cache["qh"], cache["kh"], cache["tau"]
    dv = np.swapaxes(a, -1, -2) @ do
    ds = softmax_vjp(a, do @ np.swapaxes(v, -1, -2))
    dtau = np.sum(ds * cache["cos"], axis=tuple(i for i in range(ds.ndim) if i != ds.ndim - 3))
    dcos = ds * tau[:, None, None]
    dqh, dkh = dcos @ kh, np.swapaxes(dcos, -1, -2) @ qh
    dq = (dqh - qh * np.sum(qh * dqh, -1, keepdims=True)) / cache["qn"]
    dk = (dkh - kh * np.sum(kh * dkh, -1, keepdims=True)) / cache["kn"]
    return {"q": dq, "k": dk, "v": dv, "temperature": dtau}


# --------------------------------------------------------------------------------------------
# The layer


def transposed_channel_attention_forward(x, params, *, num_heads: int, projection: str = "conv"):
    r"""Transposed (channel) self-attention (see the module docstring).

    Parameters
    ----------
    x : array
        ``(B, C, H, W)`` for ``projection="conv"`` (Restormer MDTA), ``(B, N, C)`` for ``"linear"``
        (XCiT XCA / DAT channel attention without its AIM branch).
    params : dict
        Keys of `channel_attention_param_spec`: conv weights in torch's layout, linear weights
        ``(in, out)``; ``temperature (H_a, 1, 1)``; biases optional.
    num_heads : int
        $H_a$; divides $C$.

    Returns
    -------
    out, cache
        ``out`` of ``x``'s shape.
    """
    check_choice(projection, "projection", CHANNEL_PROJECTIONS)
    x = as_float(x, "x", ndim=4 if projection == "conv" else 3)
    nh = check_size(num_heads, "num_heads")
    c = x.shape[1] if projection == "conv" else x.shape[-1]
    if c % nh:
        raise ValueError(f"the channels of x ({c}) must be divisible by num_heads ({nh})")
    spec, optional = channel_attention_param_spec(c, nh, projection=projection)
    p = check_params(params, spec, optional=optional, where=f"transposed_channel_attention ({projection})")
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    b = x.shape[0]
    if projection == "conv":
        u = conv_apply(x, p["qkv.weight"], p.get("qkv.bias"))
        z = conv_apply(u, p["qkv_dwconv.weight"], p.get("qkv_dwconv.bias"), padding=1, groups=3 * c)
        rows = z.reshape(b, 3, nh, c // nh, -1)                          # (B, 3, H_a, c_h, HW)
    else:
        z = linear_apply(x, p["qkv.weight"], p.get("qkv.bias"))          # (B, N, 3C)
        rows = np.moveaxis(z.reshape(b, -1, 3, nh, c // nh), 1, -1)       # (B, 3, H_a, c_h, N)
        u = None
    o, core = channel_attention_apply(rows[:, 0], rows[:, 1], rows[:, 2], p["temperature"].reshape(-1))
    if projection == "conv":
        om = o.reshape(x.shape)
        y = conv_apply(om, p["project_out.weight"], p.get("project_out.bias"))
    else:
        om = np.moveaxis(o, -1, 1).reshape(x.shape)                      # (B, N, C), head-major channels
        y = linear_apply(om, p["proj.weight"], p.get("proj.bias"))
    return y, {"x": x, "p": p, "u": u, "core": core, "om": om, "proj": projection, "nh": nh, "shape": y.shape}


def transposed_channel_attention_backward(dout, cache):
    """Gradient of :func:`transposed_channel_attention_forward`: ``x`` and every given parameter."""
    p, x, nh, proj = cache["p"], cache["x"], cache["nh"], cache["proj"]
    g = as_dout(dout, cache["shape"], x.dtype)
    grads = {}
    b = x.shape[0]
    if proj == "conv":
        c = x.shape[1]
        lo = conv_vjp(g, cache["om"], p["project_out.weight"], has_bias="project_out.bias" in p)
        do = lo["x"].reshape(b, nh, c // nh, -1)
        grads["project_out.weight"] = lo["weight"]
        if "project_out.bias" in p:
            grads["project_out.bias"] = lo["bias"]
    else:
        c = x.shape[-1]
        lo = linear_vjp(g, cache["om"], p["proj.weight"], "proj.bias" in p)
        do = np.moveaxis(lo["x"].reshape(b, -1, nh, c // nh), 1, -1)
        grads["proj.weight"] = lo["weight"]
        if "proj.bias" in p:
            grads["proj.bias"] = lo["bias"]
    gc = channel_attention_vjp(do, cache["core"])
    grads["temperature"] = gc["temperature"].reshape(-1, 1, 1)
    drows = np.stack([gc["q"], gc["k"], gc["v"]], axis=1)                # (B, 3, H_a, c_h, L)
    if proj == "conv":
        dz = drows.reshape(b, 3 * c, *x.shape[2:])
        ld = conv_vjp(dz, cache["u"], p["qkv_dwconv.weight"], padding=1, groups=3 * c,
                      has_bias="qkv_dwconv.bias" in p)
        lq = conv_vjp(ld["x"], x, p["qkv.weight"], has_bias="qkv.bias" in p)
        grads["qkv_dwconv.weight"] = ld["weight"]
        if "qkv_dwconv.bias" in p:
            grads["qkv_dwconv.bias"] = ld["bias"]
    else:
        dz = np.moveaxis(drows, -1, 1).reshape(b, -1, 3 * c)
        lq = linear_vjp(dz, x, p["qkv.weight"], "qkv.bias" in p)
    grads["qkv.weight"] = lq["weight"]
    if "qkv.bias" in p:
        grads["qkv.bias"] = lq["bias"]
    return {"x": lq["x"], **{k: grads[k] for k in p}}


def transposed_channel_attention(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`transposed_channel_attention_forward`."""
    return transposed_channel_attention_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample_proj(rng, size, projection):
    c, nh = (4, 2) if size == "tiny" else (6, 2)
    if projection == "conv":
        hw = (3, 3) if size == "tiny" else (int(rng.integers(4, 7)), int(rng.integers(4, 7)))
        x = rng.standard_normal((2, c) + hw)
    else:
        x = rng.standard_normal((2, 5 if size == "tiny" else int(rng.integers(6, 12)), c))
    p = init_channel_attention_params(rng, c, nh, projection=projection, bias=bool(rng.random() < 0.5))
    return Sample(inputs={"x": x}, params=p, config={"num_heads": nh, "projection": projection})


def _sample(rng, size):
    return _sample_proj(rng, size, str(rng.choice(CHANNEL_PROJECTIONS)))


def _reference(x, params, *, num_heads, projection="conv"):
    # Per head and channel pair, explicitly: cosine of two channel rows times tau, softmax over channels.
    p = params
    b = x.shape[0]
    if projection == "conv":
        c = x.shape[1]
        u = np.einsum("oc,bchw->bohw", p["qkv.weight"][:, :, 0, 0], x)
        if "qkv.bias" in p:
            u = u + p["qkv.bias"][:, None, None]
        up = np.pad(u, ((0, 0), (0, 0), (1, 1), (1, 1)))
        z = np.zeros_like(u)
        for i in range(3):
            for j in range(3):
                z += p["qkv_dwconv.weight"][None, :, 0, i, j, None, None] * up[:, :, i:i + u.shape[2], j:j + u.shape[3]]
        if "qkv_dwconv.bias" in p:
            z = z + p["qkv_dwconv.bias"][:, None, None]
        rows = z.reshape(b, 3 * c, -1)
    else:
        c = x.shape[-1]
        z = x @ p["qkv.weight"] + (p["qkv.bias"] if "qkv.bias" in p else 0.0)
        rows = np.swapaxes(z, 1, 2)                                     # (B, 3C, N)
    ch = c // num_heads
    out = np.zeros((b, c, rows.shape[-1]))
    for bb in range(b):
        for h in range(num_heads):
            for i in range(ch):
                qi = rows[bb, h * ch + i]
                logits = np.array([p["temperature"][h, 0, 0] * qi @ rows[bb, c + h * ch + j]
                                   / (np.linalg.norm(qi) * np.linalg.norm(rows[bb, c + h * ch + j])) for j in range(ch)])
                w = np.exp(logits - logits.max())
                out[bb, h * ch + i] = (w / w.sum()) @ rows[bb, 2 * c + h * ch:2 * c + (h + 1) * ch]
    if projection == "conv":
        y = np.einsum("oc,bcl->bol", p["project_out.weight"][:, :, 0, 0], out).reshape(x.shape)
        return y + (p["project_out.bias"][:, None, None] if "project_out.bias" in p else 0.0)
    return np.swapaxes(out, 1, 2) @ p["proj.weight"] + (p["proj.bias"] if "proj.bias" in p else 0.0)


def _check_channel_rescaling_invariance(rng):
    # Scaling one channel of Q (or K) by c > 0 -- here through its depthwise filter and bias -- leaves the
    # output unchanged: only the normalised rows enter the map. Rows of the map sum to 1.
    s = _sample_proj(rng, "small", "conv")
    p = dict(s.params, **{"qkv_dwconv.bias": 0.1 * rng.standard_normal(18)})
    y, cache = transposed_channel_attention_forward(s.inputs["x"], p, **s.config)
    err = float(np.abs(cache["core"]["a"].sum(-1) - 1.0).max())
    for ch in (1, 6 + 4):                                               # a q channel and a k channel
        p2 = dict(p)
        p2["qkv_dwconv.weight"] = p["qkv_dwconv.weight"].copy()
        p2["qkv_dwconv.bias"] = p["qkv_dwconv.bias"].copy()
        p2["qkv_dwconv.weight"][ch] *= 3.7
        p2["qkv_dwconv.bias"][ch] *= 3.7
        err = max(err, float(np.abs(transposed_channel_attention(s.inputs["x"], p2, **s.config) - y).max()))
    assert err < 1e-12, f"channel attention is not invariant to rescaling a q/k channel (err {err:.2e})"
    return err


def _check_token_permutation_equivariance(rng):
    # With linear projections, permuting the tokens permutes the output rows the same way (the channel
    # map sums over all tokens); Restormer's 3x3 depthwise conv makes the conv form local instead.
    s = _sample_proj(rng, "small", "linear")
    x = s.inputs["x"]
    perm = rng.permutation(x.shape[1])
    y = transposed_channel_attention(x, s.params, **s.config)
    err = float(np.abs(transposed_channel_attention(x[:, perm], s.params, **s.config) - y[:, perm]).max())
    assert err < 1e-12, f"token permutation equivariance fails (err {err:.2e})"
    return err


register(
    Mechanism(
        slug="transposed_channel_attention", family="1-softmax", tier="T2",
        title="Channel (\"transposed\") attention: Restormer MDTA, DAT channel SA",
        paper="Zamir et al., Restormer: Efficient Transformer for High-Resolution Image Restoration, CVPR 2022, "
              "arXiv 2111.09881; Chen et al., Dual Aggregation Transformer for Image Super-Resolution, ICCV 2023, "
              "arXiv 2308.03364",
        forward=transposed_channel_attention_forward, backward=transposed_channel_attention_backward,
        sample=_sample, reference=_reference, docs="softmax/vision-attention.md#transposed-channel-attention",
        checks={"channel_rescaling_invariance": _check_channel_rescaling_invariance,
                "token_permutation_equivariance": _check_token_permutation_equivariance},
    ),
)
