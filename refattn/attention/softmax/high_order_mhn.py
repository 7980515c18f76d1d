r"""High-Order Attention (HOA) module of MHN: a channel-and-position gate built from elementwise
products of $1\times1$ convolutions (polynomial terms of order $1..R$ of the features).

Paper: Chen, Deng, Hu, "Mixed High-Order Attention Network for Person Re-Identification", ICCV 2019,
arXiv 1908.05819. Upstream: chenbinghui1/MHN ``model.py`` @4375c1aa973e9a998c6839a0e0b5bf9518402f40
(``HighDivModule``; ``PCBHighDivModule`` is the same layer). MHN places $R = 1..P$ of them (one per
branch, ``HIGH{i} = HighDivModule(512, i + 1)``) after ResNet-50's ``layer2``; the mixing of the
branches is a model/training matter and not part of the layer.

Forward
-------
Features $x\in\mathbb R^{C\times H\times W}$ (``(B, C, H, W)``), $C'$ = ``inter_channels``
(upstream ``C // 8 * 2``):

$$y_{r,s} = W_{r,s}\,x\ \ (1\times1\text{ conv } C\to C',\ s = 1..r),\qquad
z_r = \mathrm{ReLU}\Big(\prod_{s=1}^{r}y_{r,s}\Big),\qquad
a = \sum_{r=1}^{R}\sigma(V_rz_r),\qquad \mathrm{HOA}(x) = \frac{x\odot a}{R},$$

products elementwise over channels and positions, $V_r$ a $1\times1$ conv $C'\to C$; no bias
anywhere, no softmax. Parameters as upstream's ``state_dict`` (conv weights in PyTorch's
``(C_out, C_in, 1, 1)`` layout): ``order{R}_{r}_{s}.0.weight`` $= W_{r,s}$ ``(C', C, 1, 1)`` and
``convb{R}_{r}.0.weight`` $= V_r$ ``(C, C', 1, 1)`` (the module's order $R$ is part of every name).
The division by $R$ is upstream's (the paper's sum has no $1/R$).

Backward
--------
With $G = \partial\mathcal L/\partial\,\mathrm{HOA}$: $dx = G\odot a/R$ plus the gate's path;
$da = G\odot x/R$; per order $d\,\mathrm{pre}_r = da\odot\sigma_r(1-\sigma_r)$, $dV_r = \sum_{b,h,w}
d\,\mathrm{pre}_r\,z_r^\top$, $dz_r = V_r^\top d\,\mathrm{pre}_r$; the ReLU passes $dP_r = dz_r\odot[P_r>0]$
(0 at the kink, as PyTorch; samplers keep $|P_r|$ away from 0); the product rule gives
$dy_{r,s} = dP_r\odot\prod_{s'\neq s}y_{r,s'}$, then $dW_{r,s} = \sum dy_{r,s}x^\top$ and
$dx \mathrel{+}= W_{r,s}^\top dy_{r,s}$.

Agreement with upstream (measured)
---------------------------------
Upstream ``HighDivModule(64, R)`` run in float64 torch (CPU) against `hoa_forward`/`hoa_backward`
with its own ``state_dict``, output and the gradients of $x$ and every weight: worst abs
$2.2\cdot10^{-15}$ / rel $3.9\cdot10^{-16}$ ($R=1$), $1.0\cdot10^{-15}$ / $6.0\cdot10^{-16}$ ($R=2$),
$5.6\cdot10^{-16}$ / $7.1\cdot10^{-16}$ ($R=3$), $7.8\cdot10^{-16}$ / $9.8\cdot10^{-16}$ ($R=4$).
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_params, compute_dtype
from ...nn.activations import sigmoid
from ...registry import Mechanism, Sample, register
from .core import check_size

__all__ = [
    "hoa_param_spec",
    "init_hoa_params",
    "hoa_forward",
    "hoa_backward",
    "hoa",
]


def hoa_param_spec(channels: int, order: int, inter_channels: int | None = None) -> dict:
    """``check_params`` spec of ``HighDivModule(channels, order)``; ``inter_channels`` defaults to
    upstream's ``channels // 8 * 2``."""
    ci = channels // 8 * 2 if inter_channels is None else inter_channels
    spec = {}
    for j in range(1, order + 1):
        for i in range(1, j + 1):
            spec[f"order{order}_{j}_{i}.0.weight"] = (ci, channels, 1, 1)
    for i in range(1, order + 1):
        spec[f"convb{order}_{i}.0.weight"] = (channels, ci, 1, 1)
    return spec


def init_hoa_params(rng, channels: int, order: int, inter_channels: int | None = None, *, scale: float = 1.0) -> dict:
    """Random parameters in spec order (normal, std ``scale / sqrt(fan_in)``)."""
    return {k: (scale / np.sqrt(s[1])) * rng.standard_normal(s)
            for k, s in hoa_param_spec(channels, order, inter_channels).items()}


def _conv1x1(w, x):
    # (C_out, C_in, 1, 1) applied to (B, C_in, H, W)
    return np.einsum("oc,bchw->bohw", w[:, :, 0, 0], x)


def hoa_forward(x, params, *, order: int):
    r"""MHN's High-Order Attention module (``HighDivModule``; see the module docstring).

    Parameters
    ----------
    x : array (B, C, H, W)
    params : dict
        ``hoa_param_spec(C, order)`` keys (``inter_channels`` read from the shapes).
    order : int
        $R \ge 1$.

    Returns
    -------
    out, cache
        ``(B, C, H, W)``: $x\odot a/R$.
    """
    x = as_float(x, "x", ndim=4)
    r_max = check_size(order, "order")
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict (see hoa_param_spec); got {type(params).__name__}")
    w11 = params.get(f"order{r_max}_1_1.0.weight")
    ci = np.shape(w11)[0] if np.ndim(w11) == 4 else None
    p = check_params(params, hoa_param_spec(x.shape[1], r_max, ci), where=f"hoa (MHN HighDivModule, order={r_max})")
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    ys, prods, zs, sigs = [], [], [], []
    a = np.zeros_like(x)
    for r in range(1, r_max + 1):
        y = [_conv1x1(p[f"order{r_max}_{r}_{s}.0.weight"], x) for s in range(1, r + 1)]
        prod = y[0]
        for t in y[1:]:
            prod = prod * t
        z = np.maximum(prod, 0.0)
        sg = sigmoid(_conv1x1(p[f"convb{r_max}_{r}.0.weight"], z))
        a = a + sg
        ys.append(y)
        prods.append(prod)
        zs.append(z)
        sigs.append(sg)
    out = x * a / r_max
    return out, {"x": x, "p": p, "ys": ys, "prods": prods, "zs": zs, "sigs": sigs, "a": a, "order": r_max}


def hoa_backward(dout, cache):
    """Gradient of :func:`hoa_forward`: ``x`` and every convolution weight."""
    x, p, r_max = cache["x"], cache["p"], cache["order"]
    g = as_dout(dout, x.shape, x.dtype)
    dx = g * cache["a"] / r_max
    da = g * x / r_max
    grads = {}
    for r in range(1, r_max + 1):
        sg, z, prod, y = cache["sigs"][r - 1], cache["zs"][r - 1], cache["prods"][r - 1], cache["ys"][r - 1]
        dpre = da * sg * (1.0 - sg)
        vk = f"convb{r_max}_{r}.0.weight"
        grads[vk] = np.einsum("bohw,bchw->oc", dpre, z)[:, :, None, None]
        dprod = np.einsum("oc,bohw->bchw", p[vk][:, :, 0, 0], dpre) * (prod > 0)
        for s in range(1, r + 1):
            others = dprod
            for s2 in range(1, r + 1):
                if s2 != s:
                    others = others * y[s2 - 1]
            wk = f"order{r_max}_{r}_{s}.0.weight"
            grads[wk] = np.einsum("bohw,bchw->oc", others, x)[:, :, None, None]
            dx = dx + np.einsum("oc,bohw->bchw", p[wk][:, :, 0, 0], others)
    return {"x": dx, **{k: grads[k] for k in p}}


def hoa(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`hoa_forward`."""
    return hoa_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample_order(rng, size, order):
    # Nonnegative features (as after ResNet's layer2) and 1x1 filters whose rows have one sign keep
    # every factor y_{r,s}, hence every product P_r, well away from the ReLU kink at 0.
    c, (hh, ww) = (8, (1, 2)) if size == "tiny" else (16, (3, 3))
    p = init_hoa_params(rng, c, order, scale=1.5)
    for k in p:
        if k.startswith("order"):
            p[k] = np.abs(p[k]) * rng.choice([-1.0, 1.0], size=(p[k].shape[0], 1, 1, 1))
    x = rng.uniform(0.5, 1.5, (2, c, hh, ww))
    _, cache = hoa_forward(x, p, order=order)
    assert min(float(np.abs(pr).min()) for pr in cache["prods"]) > 1e-3, "HOA sample too close to the ReLU kink"
    return Sample(inputs={"x": x}, params=p, config={"order": order})


def _sample(rng, size):
    return _sample_order(rng, size, int(rng.integers(1, 4)) if size == "tiny" else int(rng.integers(1, 5)))


def _reference(x, params, *, order):
    # Per pixel: the explicit polynomial terms and the gates, written as loops over orders and factors.
    b, c, h, w = x.shape
    out = np.zeros_like(x)
    for bb in range(b):
        for i in range(h):
            for j in range(w):
                v = x[bb, :, i, j]
                gate = np.zeros(c)
                for r in range(1, order + 1):
                    prod = np.ones(params[f"order{order}_1_1.0.weight"].shape[0])
                    for s in range(1, r + 1):
                        prod = prod * (params[f"order{order}_{r}_{s}.0.weight"][:, :, 0, 0] @ v)
                    pre = params[f"convb{order}_{r}.0.weight"][:, :, 0, 0] @ np.maximum(prod, 0.0)
                    gate += 0.5 * (1.0 + np.tanh(0.5 * pre))  # the logistic, without overflow
                out[bb, :, i, j] = v * gate / order
    return out


def _check_order_one_is_a_sigmoid_gate(rng):
    # R = 1: x * sigmoid(V ReLU(W x)), a first-order (SE-like, per position) gate.
    s = _sample_order(rng, "small", 1)
    x, p = s.inputs["x"], s.params
    w, v = p["order1_1_1.0.weight"][:, :, 0, 0], p["convb1_1.0.weight"][:, :, 0, 0]
    pre = np.einsum("oc,bchw->bohw", v, np.maximum(np.einsum("oc,bchw->bohw", w, x), 0.0))
    err = float(np.abs(hoa(x, p, order=1) - x / (1.0 + np.exp(-pre))).max())
    assert err < 1e-12, err
    return err


def _check_order_r_term_is_homogeneous(rng):
    # Before the ReLU the order-r term is a homogeneous polynomial of degree r: P_r(lx) = l^r P_r(x).
    s = _sample_order(rng, "small", 4)
    x = s.inputs["x"] * rng.choice([-1.0, 1.0], size=s.inputs["x"].shape)
    _, c1 = hoa_forward(x, s.params, order=4)
    _, c2 = hoa_forward(1.7 * x, s.params, order=4)
    err = max(float(np.abs(c2["prods"][r] - 1.7 ** (r + 1) * c1["prods"][r]).max() /
                    np.abs(c2["prods"][r]).max()) for r in range(4))
    assert err < 1e-12, err
    return err


register(
    Mechanism(
        slug="high_order_attention_hoa", family="1-softmax", tier="T2",
        title="High-Order Attention module (MHN): products of 1x1 convolutions, sigmoid gates",
        paper="Chen, Deng, Hu, Mixed High-Order Attention Network for Person Re-Identification, ICCV 2019, "
              "arXiv 1908.05819",
        forward=hoa_forward, backward=hoa_backward, sample=_sample, reference=_reference,
        docs="softmax/additive-and-alignment-attention.md#high-order-attention-mhn",
        checks={"order_one_is_a_sigmoid_gate": _check_order_one_is_a_sigmoid_gate,
                "order_r_term_is_homogeneous": _check_order_r_term_is_homogeneous},
    ),
)
