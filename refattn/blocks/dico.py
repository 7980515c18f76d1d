r"""DiCo compact channel attention (CCA) and the DiCo convolutional token mixer.

Ai, Fan, Hu, Yang, He, Huang, "DiCo: Revitalizing ConvNets for Scalable and Efficient Diffusion
Modeling", NeurIPS 2025, arXiv 2505.11196. Upstream: shallowdream204/DiCo ``dico_models.py``
(``DiCoBlock``: ``conv1``, ``conv2``, ``ca``, ``conv3``) @ b596b056de0e42b0962282b551aca748d3ab3e4b.

Forward
-------
For a feature map $x\in\mathbb R^{B\times C\times H\times W}$ the DiCo token mixer (the "conv
module" of ``DiCoBlock``, which replaces self-attention) is

$$a = W_1 * x + b_1\ (1\times1),\quad u = W_2 \circledast a + b_2\ (k\times k\ \text{depthwise},\ \text{pad } k/2),
\quad g = \mathrm{GELU}(u),$$

followed by the compact channel attention (CCA) and the output projection,

$$s = \tfrac1{HW}\textstyle\sum_{h,w} g_{:, :, h, w},\quad z = s W_a^\top + b_a,\quad
\omega = \sigma(z),\quad c = g\odot\omega,\quad y = W_3 * c + b_3 .$$

CCA is ``nn.Sequential(AdaptiveAvgPool2d(1), Conv2d(C, C, 1), Sigmoid())`` in upstream: one
full $C\times C$ 1×1 conv (no bottleneck, unlike squeeze-and-excitation), which is what the
paper calls "compact". Parameter names follow upstream: ``conv1``, ``conv2`` (weight
``(C, 1, k, k)``), ``ca.1`` (the Sequential's conv, weight ``(C, C, 1, 1)``), ``conv3``; conv
weights keep torch's layout.

Backward
--------
With $dc = J_{W_3}^\top dy$ (conv VJP of `refattn.nn.conv`):

$$dg = dc\odot\omega + \tfrac1{HW}\,\mathrm{bcast}(ds),\qquad d\omega = \textstyle\sum_{h,w} dc\odot g,\qquad
dz = d\omega\odot\omega(1-\omega),$$
$$dW_a = dz^\top s,\quad db_a = \textstyle\sum_b dz,\quad ds = dz\,W_a,$$

then $du = dg\odot\mathrm{GELU}'(u)$ and the depthwise and 1×1 conv VJPs give $da$, $dx$ and the
conv weight/bias gradients.

Conventions
-----------
``approximate`` (GELU, ``"none"`` as upstream ``F.gelu``). The depthwise kernel size is read from
``conv2.weight`` (odd, "same" padding $k//2$; upstream ``k = 3``). The full ``DiCoBlock`` also wraps
this mixer in an affine-free LayerNorm2d with adaLN modulation (shift/scale/gate from the timestep
and class embedding) and follows it with a 1×1-conv MLP; those are DiT's conditioning and MLP, not
the paper's new component, and are not reproduced here.

Agreement with upstream
-----------------------
``DiCoBlock``'s ``conv1``/``conv2``/``ca``/``conv3`` path (the lines of ``DiCoBlock.forward``
between the modulation and the gated residual) run in float64 on CPU with the module's own
submodules: output and the gradients of ``x`` and all eight parameters agree to
$4.0\times10^{-16}$ max relative error (output $3.7\times10^{-16}$, $dx$ $4.0\times10^{-16}$, parameters $\le 3.2\times10^{-16}$; B=2, C=6, 5×4 map).
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_choice, check_params
from ..nn.activations import gelu, gelu_grad, sigmoid
from ..nn.conv import conv_apply, conv_vjp
from ..registry import Mechanism, Sample, register
from .core import add_prefix, block_dtype

__all__ = [
    "compact_channel_attention_forward",
    "compact_channel_attention_backward",
    "dico_conv_module_forward",
    "dico_conv_module_backward",
    "dico_conv_module",
]

_WHERE = "dico_conv_module"


def compact_channel_attention_forward(g, params, *, prefix: str = "ca.1"):
    r"""CCA $c = g\odot\sigma(W_a\,\mathrm{GAP}(g) + b_a)$ for ``g`` of shape ``(B, C, H, W)``;
    ``params`` holds ``"<prefix>.weight" (C, C, 1, 1)`` and ``"<prefix>.bias" (C,)``."""
    g = as_float(g, "g", ndim=4)
    c = g.shape[1]
    p = check_params(params, {f"{prefix}.weight": (c, c, 1, 1), f"{prefix}.bias": (c,)}, where="compact_channel_attention")
    dt = block_dtype(g, p)
    g, p = g.astype(dt, copy=False), cast_all(dt, p)
    wa = p[f"{prefix}.weight"][:, :, 0, 0]
    s = g.mean(axis=(2, 3))
    om = sigmoid(s @ wa.T + p[f"{prefix}.bias"])
    out = g * om[:, :, None, None]
    return out, {"g": g, "s": s, "om": om, "wa": wa, "prefix": prefix, "dtype": dt}


def compact_channel_attention_backward(dout, cache):
    """Gradients of `compact_channel_attention_forward`: ``{"g", "<prefix>.weight", "<prefix>.bias"}``."""
    g = cache["g"]
    dc = as_dout(dout, g.shape, cache["dtype"])
    return _cca_vjp(dc, cache)


def _cca_vjp(dc, cache):
    g, s, om, wa, pre = cache["g"], cache["s"], cache["om"], cache["wa"], cache["prefix"]
    dz = np.sum(dc * g, axis=(2, 3)) * om * (1.0 - om)
    ds = dz @ wa
    dg = dc * om[:, :, None, None] + ds[:, :, None, None] / (g.shape[2] * g.shape[3])
    return {"g": dg, f"{pre}.weight": (dz.T @ s)[:, :, None, None], f"{pre}.bias": dz.sum(axis=0)}


def dico_conv_module_forward(x, params, *, approximate: str = "none"):
    r"""DiCo's conv token mixer $y = W_3 * \mathrm{CCA}(\mathrm{GELU}(W_2\circledast(W_1 * x)))$.

    Parameters
    ----------
    x : array (B, C, H, W)
    params : dict
        ``"conv1.weight" (C, C, 1, 1)``, ``"conv2.weight" (C, 1, k, k)`` (k odd),
        ``"ca.1.weight" (C, C, 1, 1)``, ``"conv3.weight" (C, C, 1, 1)``, each with ``".bias" (C,)``.
    approximate : {"none", "tanh"}
        GELU form (upstream ``F.gelu``: ``"none"``).

    Returns
    -------
    y, cache
        ``y`` of the shape of ``x``.
    """
    x = as_float(x, "x", ndim=4)
    check_choice(approximate, "approximate", ("none", "tanh"))
    c = x.shape[1]
    if not isinstance(params, dict):
        raise TypeError(f"params for {_WHERE} must be a dict of arrays; got {type(params).__name__}")
    k2 = params.get("conv2.weight")
    k = as_float(k2, "conv2.weight", ndim=4).shape[-1] if k2 is not None else 3
    if k % 2 == 0:
        raise ValueError(f"conv2.weight must have an odd kernel size (same padding); got {k}")
    spec = {"conv1.weight": (c, c, 1, 1), "conv1.bias": (c,), "conv2.weight": (c, 1, k, k), "conv2.bias": (c,),
            "ca.1.weight": (c, c, 1, 1), "ca.1.bias": (c,), "conv3.weight": (c, c, 1, 1), "conv3.bias": (c,)}
    p = check_params(params, spec, where=_WHERE)
    dt = block_dtype(x, p)
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    a = conv_apply(x, p["conv1.weight"], p["conv1.bias"])
    u = conv_apply(a, p["conv2.weight"], p["conv2.bias"], padding=k // 2, groups=c)
    g = gelu(u, approximate)
    ch, cca = compact_channel_attention_forward(g, {"ca.1.weight": p["ca.1.weight"], "ca.1.bias": p["ca.1.bias"]})
    y = conv_apply(ch, p["conv3.weight"], p["conv3.bias"])
    cache = {"x": x, "a": a, "u": u, "ch": ch, "cca": cca, "p": p, "k": k, "approximate": approximate, "dtype": dt}
    return y, cache


def dico_conv_module_backward(dout, cache):
    """Gradients of `dico_conv_module_forward` for ``x`` and every params key (module docstring)."""
    x, p, k = cache["x"], cache["p"], cache["k"]
    dy = as_dout(dout, x.shape, cache["dtype"])
    c = x.shape[1]
    g3 = conv_vjp(dy, cache["ch"], p["conv3.weight"])
    gca = _cca_vjp(g3["x"], cache["cca"])
    du = gca["g"] * gelu_grad(cache["u"], cache["approximate"])
    g2 = conv_vjp(du, cache["a"], p["conv2.weight"], padding=k // 2, groups=c)
    g1 = conv_vjp(g2["x"], x, p["conv1.weight"])
    grads = {"x": g1["x"]}
    for name, gg in (("conv1", g1), ("conv2", g2), ("conv3", g3)):
        grads[f"{name}.weight"] = gg["weight"]
        grads[f"{name}.bias"] = gg["bias"]
    grads["ca.1.weight"], grads["ca.1.bias"] = gca["ca.1.weight"], gca["ca.1.bias"]
    return grads


def dico_conv_module(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of `dico_conv_module_forward`."""
    return dico_conv_module_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _params(rng, c, k=3):
    p = {}
    for n in ("conv1", "ca.1", "conv3"):
        p[f"{n}.weight"] = rng.standard_normal((c, c, 1, 1)) / np.sqrt(c)
        p[f"{n}.bias"] = 0.2 * rng.standard_normal(c)
    p["conv2.weight"] = rng.standard_normal((c, 1, k, k)) / k
    p["conv2.bias"] = 0.2 * rng.standard_normal(c)
    return p


def _sample(rng, size):
    if size == "tiny":
        c, h, w = 2, 3, 3
    else:
        c, h, w = 4, 5, 4
    return Sample(inputs={"x": rng.standard_normal((2, c, h, w))}, params=_params(rng, c),
                  config={"approximate": str(rng.choice(["none", "tanh"]))})


def _reference(x, params, approximate="none"):
    # Loops written out: 1x1 convs as channel einsums, the depthwise conv by explicit shifts.
    p = params
    c, k = x.shape[1], p["conv2.weight"].shape[-1]
    r = k // 2
    a = np.einsum("oi,bihw->bohw", p["conv1.weight"][:, :, 0, 0], x) + p["conv1.bias"][:, None, None]
    ap = np.pad(a, ((0, 0), (0, 0), (r, r), (r, r)))
    u = np.zeros_like(a) + p["conv2.bias"][:, None, None]
    for i in range(k):
        for j in range(k):
            u = u + p["conv2.weight"][None, :, 0, i, j, None, None] * ap[:, :, i:i + a.shape[2], j:j + a.shape[3]]
    g = gelu(u, approximate)
    z = np.einsum("oi,bi->bo", p["ca.1.weight"][:, :, 0, 0], g.mean(axis=(2, 3))) + p["ca.1.bias"]
    ch = g / (1.0 + np.exp(-z))[:, :, None, None]
    del c
    return np.einsum("oi,bihw->bohw", p["conv3.weight"][:, :, 0, 0], ch) + p["conv3.bias"][:, None, None]


def _check_cca_constant_gate(rng):
    # W_a = 0: the gate is sigma(b_a) for every sample (no dependence on the content), and the
    # pooled-path gradient vanishes: dg = dc * sigma(b_a).
    g = rng.standard_normal((2, 3, 4, 5))
    b = rng.standard_normal(3)
    out, cache = compact_channel_attention_forward(g, {"ca.1.weight": np.zeros((3, 3, 1, 1)), "ca.1.bias": b})
    om = 1.0 / (1.0 + np.exp(-b))
    err = float(np.abs(out - g * om[None, :, None, None]).max())
    dc = rng.standard_normal(g.shape)
    err = max(err, float(np.abs(compact_channel_attention_backward(dc, cache)["g"] - dc * om[None, :, None, None]).max()))
    assert err < 1e-14, f"constant CCA gate wrong by {err}"
    return err


def _check_cca_gate_per_channel(rng):
    # CCA rescales each channel by one scalar in (0, 1): out / g is constant over space.
    g = rng.standard_normal((2, 4, 3, 3)) + 3.0
    p = add_prefix({"weight": rng.standard_normal((4, 4, 1, 1)), "bias": rng.standard_normal(4)}, "ca.1")
    out, _ = compact_channel_attention_forward(g, p)
    ratio = out / g
    err = float(np.abs(ratio - ratio[:, :, :1, :1]).max())
    assert err < 1e-13 and np.all((ratio > 0) & (ratio < 1)), f"CCA gate not per-channel in (0,1): {err}"
    return err


register(
    Mechanism(
        slug="dico_compact_channel_attention", family="5-building-blocks", tier="T3",
        title="DiCo conv token mixer: 1x1 conv, 3x3 depthwise conv, GELU, compact channel attention, 1x1 conv",
        paper="Ai, Fan, Hu, Yang, He, Huang, DiCo: Revitalizing ConvNets for Scalable and Efficient Diffusion "
              "Modeling, NeurIPS 2025, arXiv 2505.11196",
        official_code="shallowdream204/DiCo",
        forward=dico_conv_module_forward, backward=dico_conv_module_backward, sample=_sample, reference=_reference,
        docs="blocks/t3-blocks.md#dico_compact_channel_attention",
        checks={"cca_constant_gate": _check_cca_constant_gate, "cca_gate_per_channel": _check_cca_gate_per_channel},
    ),
)
