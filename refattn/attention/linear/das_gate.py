r"""DAS: a deformable-convolution attention gate for CNNs — a depthwise-separable convolution,
then a deformable convolution that reads the feature map at learned, input-dependent points,
whose sigmoid gates the input: $y = x\odot\sigma(\mathrm{DeformConv}(\mathrm{DSConv}(x)))$, $O(n)$
in the number of pixels.

Salajegheh, Asadi, Saryazdi, Mudur, "DAS: A Deformable Attention to Capture Salient Information in
CNNs", arXiv 2311.12091 (2023). Sources reachable here: the abstract ("deformable convolutions
for the location of pertinent image regions and separable convolutions for efficiency … propagates
relevant information using a gating mechanism … O(n)"); no official code is published (the paper
says it "will be"). **Everything below the component list is reconstruction** (the simplest
reading, the open choices as keywords); no upstream agreement can be measured.

Forward
-------
On ``x (B, C, H, W)``:

1. $d = \mathrm{DWConv}_{k}(x)$ (``dsc.depthwise``, ``(C, 1, k, k)``, padding $k/2$, bias), then
   $a = \phi(\mathrm{PWConv}(d))$ (``dsc.pointwise``, ``(C_r, C, 1, 1)``, bias) with $\phi$ the
   ``activation`` (``"none"`` by default; ``"gelu"``, ``"relu"``).
2. Offsets $\Delta = \mathrm{Conv}_{k'}(a)$ (``deform.conv_offset``, ``(2k'^2, C_r, k', k')``,
   padding $k'/2$: the DCN "pack" convention, as in `refattn.blocks.deformable_merging`), channel
   $2t$ the row and $2t+1$ the column offset of tap $t$.
3. $g = \mathrm{DCN}(a;\Delta)$ (``deform``, ``(C_g, C_r, k', k')``, bias): tap $t$ of pixel $p$
   reads $a$ bilinearly at $p + p_t + \Delta_t$ with zeros outside (`refattn.nn.sampling`,
   ``align_corners=False``). $C_g = C$ gives a per-channel gate, $C_g = 1$ a spatial map
   broadcast over channels (read from the weight's shape).
4. $y = x\odot\sigma(g)$.

Backward
--------
$\bar x \mathrel{+}= \bar y\odot\sigma(g)$; $\bar g = \sigma'(g)\odot\sum_{\text{gate-shared}}\bar y\odot x$
(summed over channels when $C_g = 1$); the DCN VJP (`refattn.blocks.deformable_merging.deform_conv2d_vjp`:
weights, bias, the bilinear sampler's adjoint to $a$ and — through the derivative of the bilinear
weights, differences of neighbouring pixels — to the offsets); the offset conv's VJP (a second
path to $a$); $\phi'$; the pointwise and depthwise convolution VJPs (`refattn.nn.conv.conv_vjp`),
a second path to $x$. Bilinear sampling is not differentiable where a sampling coordinate is an
integer: the sampler keeps every coordinate at least $10^{-3}$ away from integers.

Reconstruction choices (keywords / shapes): reduced width $C_r$ (from ``dsc.pointwise.weight``),
activation after the separable conv (none), offsets from a $k'\times k'$ conv of the same input
(DCN v1, one deformable group, no modulation), gate width $C_g\in\{1, C\}$, sigmoid gate
multiplying the block input. Verified against a torch-autograd transcription of the same
reconstruction (``F.conv2d`` and DCN v1 as ``F.grid_sample`` taps), float64, $B=2$, $C=6$,
$C_r=3$, $16\times 16$, $k=k'=3$, GELU, both gate widths, offsets up to 11 pixels (many taps
outside the map): output max abs error 2.7e-15 (rel 1.2e-15), every gradient max rel error
4.4e-15 — a check of the hand-derived backward and of the layout, not an upstream agreement.
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_choice, check_params
from ...blocks.deformable_merging import deform_conv2d_apply, deform_conv2d_vjp
from ...nn.activations import gelu, gelu_grad, relu, relu_grad, sigmoid
from ...nn.conv import conv_apply, conv_vjp
from ...registry import Mechanism, Sample, register

__all__ = ["das_attention_gate_forward", "das_attention_gate_backward", "das_attention_gate",
           "init_das_params", "das_sampling_points"]

_ACT = {"none": (lambda t: t, lambda t: np.ones_like(t)), "gelu": (gelu, gelu_grad), "relu": (relu, relu_grad)}


def _sizes(params, C):
    shp = {k: np.shape(params.get(k)) for k in ("dsc.depthwise.weight", "dsc.pointwise.weight", "deform.weight")}
    if any(len(s) != 4 for s in shp.values()):
        raise ValueError("params needs 4-D 'dsc.depthwise.weight' (C, 1, k, k), 'dsc.pointwise.weight' (C_r, C, 1, 1) "
                         f"and 'deform.weight' (C_g, C_r, k', k'); got shapes {shp}")
    k, cr = shp["dsc.depthwise.weight"][-1], shp["dsc.pointwise.weight"][0]
    cg, kd = shp["deform.weight"][0], shp["deform.weight"][-1]
    if k % 2 == 0 or kd % 2 == 0:
        raise ValueError("dsc.depthwise.weight and deform.weight need odd kernels (padding k // 2 keeps the size); "
                         f"got dsc.depthwise.weight {shp['dsc.depthwise.weight']}, deform.weight {shp['deform.weight']}")
    if cg not in (1, C):
        raise ValueError(f"deform.weight must have C_g = 1 or C = {C} output channels; got {cg}")
    return {"dsc.depthwise.weight": (C, 1, k, k), "dsc.depthwise.bias": (C,),
            "dsc.pointwise.weight": (cr, C, 1, 1), "dsc.pointwise.bias": (cr,),
            "deform.conv_offset.weight": (2 * kd * kd, cr, kd, kd), "deform.conv_offset.bias": (2 * kd * kd,),
            "deform.weight": (cg, cr, kd, kd), "deform.bias": (cg,)}


def das_attention_gate_forward(x, params, *, activation: str = "none"):
    r"""DAS attention gate on ``x (B, C, H, W)`` (see the module docstring; sizes from the
    weights). Returns ``(y (B, C, H, W), cache)``."""
    x = as_float(x, "x", ndim=4)
    check_choice(activation, "activation", tuple(_ACT))
    C = x.shape[1]
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of arrays; got {type(params).__name__}")
    spec = _sizes(params, C)
    dt = x.dtype
    p = cast_all(dt, check_params(params, spec, where="das_attention_gate"))
    k, kd = spec["dsc.depthwise.weight"][-1], spec["deform.weight"][-1]
    d = conv_apply(x, p["dsc.depthwise.weight"], p["dsc.depthwise.bias"], padding=k // 2, groups=C)
    h = conv_apply(d, p["dsc.pointwise.weight"], p["dsc.pointwise.bias"])
    a = _ACT[activation][0](h)
    off = conv_apply(a, p["deform.conv_offset.weight"], p["deform.conv_offset.bias"], padding=kd // 2)
    g, cols = deform_conv2d_apply(a, off, p["deform.weight"], p["deform.bias"], padding=kd // 2)
    s = sigmoid(g)
    y = x * s
    cache = {"p": p, "x": x, "d": d, "h": h, "a": a, "off": off, "g": g, "s": s, "cols": cols, "k": k, "kd": kd,
             "activation": activation, "dtype": dt, "shape": y.shape}
    return y, cache


def das_attention_gate_backward(dout, cache) -> dict:
    """Gradients of :func:`das_attention_gate_forward` w.r.t. ``x`` and every parameter."""
    dt = cache["dtype"]
    dy = as_dout(dout, cache["shape"], dt)
    p, x, s, k, kd = (cache[n] for n in ("p", "x", "s", "k", "kd"))
    C = x.shape[1]
    dx = dy * s
    dxs = dy * x
    if s.shape[1] == 1 and C > 1:
        dxs = dxs.sum(axis=1, keepdims=True)
    dg = dxs * s * (1.0 - s)
    a = cache["a"]
    r = deform_conv2d_vjp(dg, a, cache["off"], p["deform.weight"], cache["cols"], padding=kd // 2)
    grads = {"deform.weight": r["weight"], "deform.bias": r["bias"]}
    ro = conv_vjp(r["offset"], a, p["deform.conv_offset.weight"], padding=kd // 2)
    grads["deform.conv_offset.weight"], grads["deform.conv_offset.bias"] = ro["weight"], ro["bias"]
    dh = (r["x"] + ro["x"]) * _ACT[cache["activation"]][1](cache["h"])
    rp = conv_vjp(dh, cache["d"], p["dsc.pointwise.weight"])
    grads["dsc.pointwise.weight"], grads["dsc.pointwise.bias"] = rp["weight"], rp["bias"]
    rd = conv_vjp(rp["x"], x, p["dsc.depthwise.weight"], padding=k // 2, groups=C)
    grads["dsc.depthwise.weight"], grads["dsc.depthwise.bias"] = rd["weight"], rd["bias"]
    out = {"x": dx + rd["x"]}
    out.update({key: np.asarray(grads[key], dtype=dt) for key in p})
    return out


def das_attention_gate(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`das_attention_gate_forward`."""
    return das_attention_gate_forward(x, params, **config)[0]


def das_sampling_points(x, params, **config):
    """The deformable conv's sampling points (row, column pixel coordinates), each
    ``(B, k'^2, H, W)``: where the gate looks (for inspection and for keeping samples off kinks)."""
    _, cache = das_attention_gate_forward(x, params, **config)
    off, kd = cache["off"], cache["kd"]
    b, _, hh, ww = off.shape
    o = off.reshape(b, kd * kd, 2, hh, ww)
    ti, tj = np.divmod(np.arange(kd * kd), kd)
    rows = np.arange(hh)[None, None, :, None] - kd // 2 + ti[None, :, None, None] + o[:, :, 0]
    cols = np.arange(ww)[None, None, None, :] - kd // 2 + tj[None, :, None, None] + o[:, :, 1]
    return rows, cols


def init_das_params(rng, C: int, *, reduced: int | None = None, kernel_size: int = 3, deform_kernel: int = 3,
                    gate_channels: int | None = None, offset_scale: float = 1.0) -> dict:
    """Random parameters with the names above; ``offset_scale`` sets the spread of the offsets."""
    cr, cg = reduced or C, C if gate_channels is None else gate_channels
    k, kd = kernel_size, deform_kernel
    p = {"dsc.depthwise.weight": rng.standard_normal((C, 1, k, k)) / k, "dsc.depthwise.bias": 0.1 * rng.standard_normal(C),
         "dsc.pointwise.weight": rng.standard_normal((cr, C, 1, 1)) / np.sqrt(C),
         "dsc.pointwise.bias": 0.1 * rng.standard_normal(cr),
         "deform.conv_offset.weight": offset_scale * rng.standard_normal((2 * kd * kd, cr, kd, kd)) / (kd * np.sqrt(cr)),
         "deform.conv_offset.bias": offset_scale * rng.uniform(-0.5, 0.5, 2 * kd * kd),
         "deform.weight": rng.standard_normal((cg, cr, kd, kd)) / (kd * np.sqrt(cr)), "deform.bias": 0.1 * rng.standard_normal(cg)}
    return p


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _kink_margin(s):
    rows, cols = das_sampling_points(**s.inputs, params=s.params, **s.config)
    frac = lambda t: np.abs(t - np.round(t))  # noqa: E731
    return float(min(frac(rows).min(), frac(cols).min()))


def _sample_das(rng, size):
    from ._samples import draw_until

    B, C, H, cr, kd, cg = (2, 2, 4, 2, 1, 2) if size == "tiny" else (2, 4, 6, 3, 3, 1)

    def draw(r):
        p = init_das_params(r, C, reduced=cr, deform_kernel=kd, gate_channels=cg)
        return Sample(inputs={"x": r.standard_normal((B, C, H, H))}, params=p,
                      config={"activation": "none" if size == "tiny" else "gelu"})

    return draw_until(rng, draw, _kink_margin, 1e-3)


def _bilinear_zero(img, r, c):
    """img (H, W) at real (r, c), zero outside; plain corner loop."""
    H, W = img.shape
    r0, c0 = int(np.floor(r)), int(np.floor(c))
    out = 0.0
    for rr, wr in ((r0, 1 - (r - r0)), (r0 + 1, r - r0)):
        for cc, wc in ((c0, 1 - (c - c0)), (c0 + 1, c - c0)):
            if 0 <= rr < H and 0 <= cc < W:
                out += wr * wc * img[rr, cc]
    return out


def _reference_das(x, params, *, activation="none"):
    """Explicit form: every convolution as loops over taps, the deformable conv as per-pixel,
    per-tap bilinear reads."""
    from scipy.special import erf

    B, C, H, W = x.shape
    act = {"none": lambda t: t, "relu": lambda t: np.maximum(t, 0),
           "gelu": lambda t: 0.5 * t * (1 + erf(t / np.sqrt(2)))}[activation]

    def conv(inp, w, b, groups=1):
        co, cig, k, _ = w.shape
        pad = k // 2
        xp = np.pad(inp, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
        out = np.zeros((inp.shape[0], co, H, W)) + b.reshape(1, -1, 1, 1)
        per = co // groups
        for o in range(co):
            g0 = (o // per) * cig
            for ci in range(cig):
                for i in range(k):
                    for j in range(k):
                        out[:, o] += w[o, ci, i, j] * xp[:, g0 + ci, i:i + H, j:j + W]
        return out

    a = act(conv(conv(x, params["dsc.depthwise.weight"], params["dsc.depthwise.bias"], groups=C),
                 params["dsc.pointwise.weight"], params["dsc.pointwise.bias"]))
    off = conv(a, params["deform.conv_offset.weight"], params["deform.conv_offset.bias"])
    w = params["deform.weight"]
    cg, cr, kd, _ = w.shape
    g = np.zeros((B, cg, H, W)) + params["deform.bias"].reshape(1, -1, 1, 1)
    for b in range(B):
        for i in range(H):
            for j in range(W):
                for t in range(kd * kd):
                    ti, tj = divmod(t, kd)
                    r = i - kd // 2 + ti + off[b, 2 * t, i, j]
                    c = j - kd // 2 + tj + off[b, 2 * t + 1, i, j]
                    vals = np.array([_bilinear_zero(a[b, ch], r, c) for ch in range(cr)])
                    g[b, :, i, j] += w[:, :, ti, tj] @ vals
    return x / (1.0 + np.exp(-g))


def _check_zero_offsets_is_plain_conv_gate(rng):
    """Offsets zero (offset conv zeroed): the gate is sigma(Conv(DSConv(x))), a plain convolution."""
    s = _sample_das(rng, "small")
    p = dict(s.params)
    p["deform.conv_offset.weight"] = np.zeros_like(p["deform.conv_offset.weight"])
    p["deform.conv_offset.bias"] = np.zeros_like(p["deform.conv_offset.bias"])
    _, c = das_attention_gate_forward(**s.inputs, params=p, **s.config)
    plain = conv_apply(c["a"], p["deform.weight"], p["deform.bias"], padding=c["kd"] // 2)
    err = float(np.max(np.abs(plain - c["g"])))
    assert err < 1e-13, err
    return err


def _check_integer_offsets_shift_reads(rng):
    """Offsets fixed to an integer shift (dr, dc) = (1, -2): every tap reads exactly the pixel
    a[i - r + t_i + 1, j - r + t_j - 2] (zero outside the map), no interpolation (brute-force gather)."""
    s = _sample_das(rng, "small")
    p = dict(s.params)
    kd = p["deform.weight"].shape[-1]
    p["deform.conv_offset.weight"] = np.zeros_like(p["deform.conv_offset.weight"])
    p["deform.conv_offset.bias"] = np.tile([1.0, -2.0], kd * kd)
    _, c = das_attention_gate_forward(**s.inputs, params=p, **s.config)
    a = c["a"]
    H, W = a.shape[2:]
    P = kd // 2 + 2
    ap = np.pad(a, ((0, 0), (0, 0), (P, P), (P, P)))
    plain = np.zeros_like(c["g"]) + p["deform.bias"].reshape(1, -1, 1, 1)
    for ti in range(kd):
        for tj in range(kd):
            r0, c0 = P - kd // 2 + ti + 1, P - kd // 2 + tj - 2
            plain += np.einsum("oc,bchw->bohw", p["deform.weight"][:, :, ti, tj], ap[:, :, r0:r0 + H, c0:c0 + W])
    err = float(np.max(np.abs(plain - c["g"])))
    assert err < 1e-13, err
    return err


def _check_gradients_equal_dense_form(rng):
    """The fast form's hand-derived gradients equal the explicit form's (central difference of
    the registry reference along a random direction over every input and parameter)."""
    from ._samples import reference_gradient_error

    err = reference_gradient_error(das_attention_gate_forward, das_attention_gate_backward, _reference_das, _sample_das(rng, "small"), rng)
    assert err < 1e-6, err
    return err


register(
    Mechanism(
        slug="das_deformable_attention_gate", family="4-linear-kernel-sparse", tier="T3",
        title="DAS: deformable-convolution attention gate for CNNs",
        paper="Salajegheh, Asadi, Saryazdi, Mudur, 'DAS: A Deformable Attention to Capture Salient Information in "
              "CNNs', arXiv 2311.12091, 2023",
        seeds=("4-60",),
        forward=das_attention_gate_forward, backward=das_attention_gate_backward, sample=_sample_das,
        reference=_reference_das,
        checks={"zero_offsets_is_plain_conv_gate": _check_zero_offsets_is_plain_conv_gate,
                "gradients_equal_dense_form": _check_gradients_equal_dense_form,
                "integer_offsets_shift_the_reads": _check_integer_offsets_shift_reads},
        docs="linear/l6a.md#das-deformable-attention-gate",
    ),
)
