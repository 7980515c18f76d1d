r"""LIT deformable token merging: a deformable convolution with kernel = stride = patch, then
BatchNorm and GELU, merges each patch of tokens at learned, input-dependent sampling points.

Pan, Zhuang, He, Liu, Cai, "Less is More: Pay Less Attention in Vision Transformers", AAAI
2022, arXiv 2105.14217. Upstream: zhuang-group/LIT ``classification/code_for_lit_ti/patch_embed.py``
(``DeformablePatchEmbed_GELU``) and ``classification/code_for_lit_s_m_b/models/patch_embed.py``
(``DeformablePatchMerging``), with ``mm_modules/DCN/modules/deform_conv2d.py``
(``DeformConv2dPack``) and the CUDA kernel ``mm_modules/DCN/src/cuda/deform_2d_im2col_cuda.cuh``
(``dmcn_2d_im2col_bilinear``) @ 742e961bfc3fcda1d11608dd5a943af1d7554325.

Forward
-------
On a channels-first map ``x (B, C, H, W)`` (LIT-S/M/B first reshape their tokens ``(B, HW, C)``
to it), with kernel $k_h\times k_w$ = stride = the merge size (2 in LIT), padding $p$ (0):

1. offsets $\Delta = \mathrm{Conv}_{off}(x)$, a plain conv with the same kernel/stride/padding and
   $2k_hk_w$ output channels (``dconv.conv_offset``; LIT initialises it to zero, i.e. a regular
   patch merge); channel $2t$ is the row offset $\Delta h_t$ and $2t+1$ the column offset
   $\Delta w_t$ of tap $t = i\,k_w + j$;
2. deformable convolution (DCN v1): tap $t$ of output pixel $(o_h, o_w)$ reads $x$ at
   $(h, w) = (o_hs - p + i + \Delta h_t,\ o_ws - p + j + \Delta w_t)$ by bilinear interpolation with
   zeros outside the image (a corner outside contributes 0; a point with $h\le-1$ or $h\ge H$ reads
   0),

   $$y_{o} = \beta + \sum_{c,t} W_{o,c,t}\,\mathrm{bilinear}(x_c;\ p_o + p_t + \Delta p_t),$$

   the sampling being exactly ``F.grid_sample(padding_mode="zeros")`` at those pixel coordinates
   (`refattn.nn.sampling.grid_sample_apply`, ``align_corners=False``: $g = (2u+1)/L - 1$);
3. $z = \mathrm{GELU}(\mathrm{BN}(y))$, flattened to tokens ``(B, H_o W_o, C_{out})``.

Backward
--------
$dz\to$ GELU' $\to$ BN VJP (`refattn.blocks.core.batch_norm_backward`) $\to dy$. Then
$dW_{o,c,t} = \sum dy_o\,\mathrm{col}_{c,t,o}$, $d\beta = \sum dy$; $d\mathrm{col} = W^\top dy$ goes
through the sampler VJP (`refattn.nn.sampling.grid_sample_vjp`): to $x$ (the bilinear weights,
scattered) and to the sampling points — $\partial/\partial h$ of the bilinear form is the
difference of the two row-neighbour interpolations (DCN's ``get_coordinate_weight``) — hence to
$\Delta$ (the grid derivative times $du/dg = L/2$), and through the offset conv's VJP to its
weights and, a second path, to $x$. The sample is not differentiable where a sampling coordinate
is an integer (the corner set changes): the sampler keeps every coordinate away from integers.

Conventions
-----------
``padding`` (0, as LIT), ``training`` (False: BN with running statistics; True: batch
statistics), ``eps`` (BN, 1e-5), ``activation`` (exact GELU, ``nn.GELU``). One deformable group,
``groups=1`` and dilation 1, as ``DeformConv2dPack`` is used in LIT. ``DeformConv2dPack`` sets
``lr_mult=0.1`` on the offset conv (a training-recipe detail, not part of the function).

Agreement with upstream
-----------------------
LIT's DCN is a CUDA extension, so its math was transcribed into a float64 torch script (the
``deformable_2d_im2col`` gather with ``dmcn_2d_im2col_bilinear``'s corner rules, autograd for the
backward) and wired as ``DeformablePatchEmbed_GELU`` (offset conv, DCN, ``BatchNorm2d``,
``nn.GELU``), patch 2 and 3, offsets up to $\pm7$ pixels (many taps leave the image): output and
the gradients of ``x`` and every parameter agree to $1.3\times10^{-14}$ max abs
($1.8\times10^{-15}$ relative) in evaluation mode, $4.6\times10^{-14}$ ($5.6\times10^{-15}$) in
training mode, where the ``dconv.bias`` gradient is identically zero (batch statistics remove a
per-channel constant) and both return round-off. (LIT's pure-PyTorch ``deform_conv2d_naive`` is not a reference:
it calls ``F.grid_sample`` with the default ``align_corners=False`` on a grid built for
``True``, which no longer matches the CUDA kernel.)
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_choice, check_int, check_params, check_positive
from ..nn.conv import conv_apply, conv_vjp
from ..nn.sampling import grid_sample_apply, grid_sample_vjp
from ..registry import Mechanism, Sample, register
from .core import (
    ACTIVATIONS,
    activation_functions,
    batch_norm_backward,
    batch_norm_forward,
    batch_norm_spec,
    block_dtype,
    param_dim,
)

__all__ = ["deformable_token_merging_forward", "deformable_token_merging_backward", "deformable_token_merging",
           "deform_conv2d_apply", "deform_conv2d_vjp"]

_D, _OFF, _BN = "dconv", "dconv.conv_offset", "norm_layer"


def _sampling_grid(offset, in_hw, kernel, stride, padding):
    """Normalised ``grid_sample`` grid ``(B, K*H_o, W_o, 2)`` of every tap's sampling point, and the
    pixel coordinates ``(h, w)`` each ``(B, K, H_o, W_o)``."""
    b, _, ho, wo = offset.shape
    kh, kw = kernel
    off = offset.reshape(b, kh * kw, 2, ho, wo)
    dt = offset.dtype
    ti, tj = (t.astype(dt) for t in np.divmod(np.arange(kh * kw), kw))
    h = (np.arange(ho, dtype=dt) * stride[0] - padding[0])[None, None, :, None] + ti[None, :, None, None] + off[:, :, 0]
    w = (np.arange(wo, dtype=dt) * stride[1] - padding[1])[None, None, None, :] + tj[None, :, None, None] + off[:, :, 1]
    gx, gy = (2 * w + 1) / dt.type(in_hw[1]) - 1, (2 * h + 1) / dt.type(in_hw[0]) - 1   # align_corners=False
    return np.stack([gx, gy], axis=-1).reshape(b, kh * kw * ho, wo, 2), (h, w)


def deform_conv2d_apply(x, offset, weight, bias=None, *, stride=1, padding=0):
    r"""Unvalidated DCN v1 (one deformable group, ``groups=1``, dilation 1): ``x (B, C, H, W)``,
    ``offset (B, 2 k_h k_w, H_o, W_o)`` (row/column offset pairs per tap), ``weight
    (C_out, C, k_h, k_w)``. Returns ``(y (B, C_out, H_o, W_o), cols (B, C, K, H_o, W_o))``."""
    s, p = (stride, stride) if np.isscalar(stride) else stride, (padding, padding) if np.isscalar(padding) else padding
    kh, kw = weight.shape[2:]
    grid, _ = _sampling_grid(offset, x.shape[2:], (kh, kw), s, p)
    b, c = x.shape[:2]
    ho, wo = offset.shape[2:]
    cols = grid_sample_apply(x, grid, "bilinear", "zeros", False).reshape(b, c, kh * kw, ho, wo)
    y = np.einsum("ock,bckhw->bohw", weight.reshape(weight.shape[0], c, -1), cols)
    if bias is not None:
        y = y + bias.reshape(1, -1, 1, 1)
    return y, cols


def deform_conv2d_vjp(dy, x, offset, weight, cols, *, stride=1, padding=0, has_bias=True) -> dict:
    """Unvalidated gradients of `deform_conv2d_apply`: ``{"x", "offset", "weight"[, "bias"]}``."""
    s, p = (stride, stride) if np.isscalar(stride) else stride, (padding, padding) if np.isscalar(padding) else padding
    kh, kw = weight.shape[2:]
    b, c, hgt, wid = x.shape
    ho, wo = offset.shape[2:]
    wm = weight.reshape(weight.shape[0], c, -1)
    grads = {"weight": np.einsum("bohw,bckhw->ock", dy, cols).reshape(weight.shape)}
    if has_bias:
        grads["bias"] = dy.sum(axis=(0, 2, 3))
    dcols = np.einsum("ock,bohw->bckhw", wm, dy).reshape(b, c, kh * kw * ho, wo)
    grid, _ = _sampling_grid(offset, (hgt, wid), (kh, kw), s, p)
    r = grid_sample_vjp(dcols, x, grid, "bilinear", "zeros", False)
    dg = r["grid"].reshape(b, kh * kw, ho, wo, 2)
    # g = (2u + 1) / L - 1: du -> dg is 2 / L; offset channel 2t is the row (y) and 2t+1 the column (x)
    doff = np.stack([dg[..., 1] * (2.0 / hgt), dg[..., 0] * (2.0 / wid)], axis=2)
    grads["offset"] = doff.reshape(offset.shape)
    grads["x"] = r["x"]
    return grads


def deformable_token_merging_forward(x, params, *, padding: int = 0, training: bool = False, eps: float = 1e-5,
                                     activation: str = "gelu"):
    r"""LIT's deformable patch merging (module docstring): ``x (B, C, H, W) -> tokens (B, H_o W_o, C_out)``.

    Parameters
    ----------
    x : array (B, C, H, W)
    params : dict
        Upstream names (conv weights in ``nn.Conv2d`` layout, as is): ``"dconv.weight"``
        ``(C_out, C, k_h, k_w)`` (kernel = stride = the merge size), ``"dconv.bias"`` ``(C_out,)``,
        ``"dconv.conv_offset.weight"`` ``(2 k_h k_w, C, k_h, k_w)``, ``"dconv.conv_offset.bias"``
        ``(2 k_h k_w,)``, ``"norm_layer.{weight,bias,running_mean,running_var}"`` ``(C_out,)``.
    padding : int
        Zero padding of both convolutions (0).
    training : bool
        BatchNorm with batch statistics (True) or running statistics (False).
    eps : float
        BatchNorm epsilon.
    activation : {"gelu", "gelu_tanh", "relu", "silu"}

    Returns
    -------
    tokens, cache
        ``tokens (B, H_o W_o, C_out)``; ``cache["offset"]`` holds the offsets (for visualisation).
    """
    x = as_float(x, "x", ndim=4)
    pad = check_int(padding, "padding", minimum=0)
    if not isinstance(training, (bool, np.bool_)):
        raise TypeError(f"training must be a bool; got {type(training).__name__}")
    eps = check_positive(eps, "eps", allow_zero=True)
    check_choice(activation, "activation", ACTIVATIONS)
    shape = ("C_out", "C", "k_h", "k_w")
    co = param_dim(params, f"{_D}.weight", 0, where="lit_deformable_token_merging", shape=shape)
    kh = param_dim(params, f"{_D}.weight", 2, where="lit_deformable_token_merging", shape=shape)
    kw = param_dim(params, f"{_D}.weight", 3, where="lit_deformable_token_merging", shape=shape)
    c, k = x.shape[1], kh * kw
    spec = {f"{_D}.weight": (co, c, kh, kw), f"{_D}.bias": (co,), f"{_OFF}.weight": (2 * k, c, kh, kw),
            f"{_OFF}.bias": (2 * k,)}
    spec.update(batch_norm_spec(_BN, co))
    own = check_params(params, spec, where="lit_deformable_token_merging")
    if np.any(own[f"{_BN}.running_var"] < 0):
        raise ValueError(f"{_BN}.running_var must be >= 0 (a variance)")
    ho, wo = ((x.shape[2] + 2 * pad - kh) // kh + 1, (x.shape[3] + 2 * pad - kw) // kw + 1)
    if min(ho, wo) < 1:
        raise ValueError(f"x spatial size {x.shape[2:]} is smaller than the merge kernel {(kh, kw)} (padding {pad})")
    dt = block_dtype(x, own)
    x, own = x.astype(dt, copy=False), cast_all(dt, own)
    stride, pads = (kh, kw), (pad, pad)
    offset = conv_apply(x, own[f"{_OFF}.weight"], own[f"{_OFF}.bias"], stride=stride, padding=pad)
    y, cols = deform_conv2d_apply(x, offset, own[f"{_D}.weight"], own[f"{_D}.bias"], stride=stride, padding=pads)
    n, cb = batch_norm_forward(own, _BN, y, training=bool(training), eps=eps)
    f, _ = activation_functions(activation)
    z = f(n)
    tokens = z.reshape(z.shape[0], co, -1).transpose(0, 2, 1)
    cache = {"x": x, "offset": offset, "cols": cols, "n": n, "cb": cb, "params": own, "stride": stride,
             "pad": pad, "activation": activation, "grid": (ho, wo), "out_shape": tokens.shape, "dtype": dt}
    return tokens, cache


def deformable_token_merging_backward(dout, cache):
    r"""Gradients of `deformable_token_merging_forward` for ``x`` (sampler and offset-conv paths) and
    every params key (module docstring)."""
    g = as_dout(dout, cache["out_shape"], cache["dtype"])
    own, x = cache["params"], cache["x"]
    _, fp = activation_functions(cache["activation"])
    b, n, co = g.shape
    dz = g.transpose(0, 2, 1).reshape((b, co) + cache["grid"]) * fp(cache["n"])
    grads = {}
    dy = batch_norm_backward(grads, own, dz, cache["cb"])
    r = deform_conv2d_vjp(dy, x, cache["offset"], own[f"{_D}.weight"], cache["cols"], stride=cache["stride"],
                          padding=(cache["pad"], cache["pad"]))
    ro = conv_vjp(r["offset"], x, own[f"{_OFF}.weight"], stride=cache["stride"], padding=cache["pad"])
    grads.update({f"{_D}.weight": r["weight"], f"{_D}.bias": r["bias"], f"{_OFF}.weight": ro["weight"],
                  f"{_OFF}.bias": ro["bias"], "x": r["x"] + ro["x"]})
    return grads


def deformable_token_merging(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of `deformable_token_merging_forward`."""
    return deformable_token_merging_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _bn_params(rng, co):
    return {f"{_BN}.weight": 1.0 + 0.2 * rng.standard_normal(co), f"{_BN}.bias": 0.2 * rng.standard_normal(co),
            f"{_BN}.running_mean": 0.2 * rng.standard_normal(co), f"{_BN}.running_var": 0.5 + rng.random(co)}


def _sample(rng, size):
    c, co, kk, hw = (1, 2, 2, (4, 4)) if size == "tiny" else (3, 4, 2, (6, 8))
    if size == "small" and rng.random() < 0.5:
        kk, hw = 3, (6, 9)
    x = rng.standard_normal((2, c) + hw)
    for _ in range(100):
        # offsets = small input-dependent part + a fractional bias in +-[0.2, 0.8] (some taps leave
        # the image); every sampling coordinate stays >= 0.05 from an integer
        p = {f"{_D}.weight": rng.standard_normal((co, c, kk, kk)) / np.sqrt(c * kk * kk),
             f"{_D}.bias": 0.2 * rng.standard_normal(co),
             f"{_OFF}.weight": 0.01 * rng.standard_normal((2 * kk * kk, c, kk, kk)),
             f"{_OFF}.bias": rng.uniform(0.2, 0.8, 2 * kk * kk) * rng.choice([-1.0, 1.0], 2 * kk * kk)}
        p.update(_bn_params(rng, co))
        off = conv_apply(x, p[f"{_OFF}.weight"], p[f"{_OFF}.bias"], stride=kk)
        _, (h, w) = _sampling_grid(off, hw, (kk, kk), (kk, kk), (0, 0))
        frac = np.abs(np.concatenate([h.ravel(), w.ravel()]) - np.round(np.concatenate([h.ravel(), w.ravel()])))
        if frac.min() > 0.05:
            break
    else:  # pragma: no cover
        raise RuntimeError("lit_deformable_token_merging sampler found no kink-free draw")
    return Sample(inputs={"x": x}, params=p, config={"training": False})


def _bilinear_zero(img, h, w):
    # DCN's dmcn_2d_im2col_bilinear for one channel image and one point (corners outside read 0).
    hh, ww = img.shape
    if not (h > -1 and w > -1 and h < hh and w < ww):
        return 0.0
    h0, w0 = int(np.floor(h)), int(np.floor(w))
    lh, lw = h - h0, w - w0
    val = 0.0
    for dh, wh in ((0, 1 - lh), (1, lh)):
        for dw, wwt in ((0, 1 - lw), (1, lw)):
            r, c = h0 + dh, w0 + dw
            if 0 <= r < hh and 0 <= c < ww:
                val += wh * wwt * img[r, c]
    return val


def _reference(x, params, padding=0, training=False, eps=1e-5, activation="gelu"):
    # The DCN v1 CUDA kernel's gather written as loops, then eval-mode BN and the activation.
    w, off_w = params[f"{_D}.weight"], params[f"{_OFF}.weight"]
    co, c, kh, kw = w.shape
    offset = conv_apply(x, off_w, params[f"{_OFF}.bias"], stride=(kh, kw), padding=padding)
    b, _, ho, wo = offset.shape
    y = np.zeros((b, co, ho, wo)) + params[f"{_D}.bias"].reshape(1, -1, 1, 1)
    for bi in range(b):
        for oh in range(ho):
            for ow in range(wo):
                for i in range(kh):
                    for j in range(kw):
                        t = i * kw + j
                        hh = oh * kh - padding + i + offset[bi, 2 * t, oh, ow]
                        ww = ow * kw - padding + j + offset[bi, 2 * t + 1, oh, ow]
                        vals = np.array([_bilinear_zero(x[bi, ci], hh, ww) for ci in range(c)])
                        y[bi, :, oh, ow] += w[:, :, i, j] @ vals
    r = lambda k: params[f"{_BN}.{k}"].reshape(1, -1, 1, 1)  # noqa: E731
    n = (y - r("running_mean")) / np.sqrt(r("running_var") + eps) * r("weight") + r("bias")
    f, _ = activation_functions(activation)
    return f(n).reshape(b, co, -1).transpose(0, 2, 1)


def _check_zero_offsets_is_strided_conv(rng):
    # LIT's initialisation (offset conv = 0): the deformable merge is the plain patch-merging conv.
    x = rng.standard_normal((2, 3, 6, 4))
    w, bias = rng.standard_normal((5, 3, 2, 2)), rng.standard_normal(5)
    y, _ = deform_conv2d_apply(x, np.zeros((2, 8, 3, 2)), w, bias, stride=2)
    err = float(np.abs(y - conv_apply(x, w, bias, stride=2)).max())
    assert err < 1e-13, f"zero offsets differ from the strided conv (err {err})"
    return err


def _check_integer_offsets_shift_reads(rng):
    # An integer offset (1, -1) on every tap reads x shifted by one pixel (zeros past the border).
    x = rng.standard_normal((2, 2, 6, 6))
    w = rng.standard_normal((3, 2, 2, 2))
    off = np.zeros((2, 8, 3, 3))
    off[:, 0::2], off[:, 1::2] = 1.0, -1.0
    y, _ = deform_conv2d_apply(x, off, w, stride=2)
    xs = np.zeros_like(x)
    xs[:, :, :-1, 1:] = x[:, :, 1:, :-1]
    err = float(np.abs(y - conv_apply(xs, w, stride=2)).max())
    assert err < 1e-13, f"integer offsets do not shift the reads (err {err})"
    return err


register(
    Mechanism(
        slug="lit_deformable_token_merging", family="5-building-blocks", tier="T3",
        title="LIT deformable token merging: offset conv -> DCN v1 (kernel = stride) -> BatchNorm -> GELU",
        paper="Pan, Zhuang, He, Liu, Cai, Less is More: Pay Less Attention in Vision Transformers, AAAI 2022, "
              "arXiv 2105.14217",
        forward=deformable_token_merging_forward, backward=deformable_token_merging_backward, sample=_sample,
        reference=_reference, docs="blocks/vision-token-mixers.md#lit-deformable-token-merging",
        checks={"zero_offsets_is_strided_conv": _check_zero_offsets_is_strided_conv,
                "integer_offsets_shift_reads": _check_integer_offsets_shift_reads},
        notes="not differentiable where a sampling coordinate is an integer (bilinear corner change): the sampler "
              "keeps every coordinate >= 0.05 from the integers",
    ),
)
