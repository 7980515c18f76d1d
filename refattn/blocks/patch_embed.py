r"""ViT patch embedding: patchify + linear projection (a conv with kernel = stride = patch), class
token and learned absolute positions.

Dosovitskiy, Beyer, Kolesnikov, Weissenborn, Zhai, Unterthiner, Dehghani, Minderer, Heigold,
Gelly, Uszkoreit, Houlsby, "An Image is Worth 16x16 Words: Transformers for Image Recognition at
Scale", ICLR 2021, arXiv 2010.11929. Upstream: google-research/vision_transformer
``vit_jax/models_vit.py`` (``VisionTransformer``: the ``embedding`` conv, the ``cls`` token;
``AddPositionEmbs`` in ``Encoder``) @ c6de1e5378c9831a8477feb30994971bdc409e46, and its PyTorch
form, huggingface/pytorch-image-models ``timm/layers/patch_embed.py`` (``PatchEmbed``) and
``timm/models/vision_transformer.py`` (``VisionTransformer._pos_embed``) @
aa4b5850c1543fa488abf260f18390eda46cf85d, whose parameter names and layouts refattn uses.

Forward
-------
An image ``x (B, C, H, W)`` is cut into $N = (H/P_h)(W/P_w)$ non-overlapping patches, row-major
over the patch grid; each flattened patch $x_p\in\mathbb R^{C P_h P_w}$ (channel-major, then the
pixel row and column: the order of ``weight.reshape(D, -1)``) is projected,

$$t_p = W x_p + b,\qquad W = \texttt{proj.weight}.\mathrm{reshape}(D, C P_h P_w),$$

which is exactly ``nn.Conv2d(C, D, kernel_size=P, stride=P)`` (timm) or flax
``nn.Conv(D, P, strides=P, padding="VALID")`` (the JAX original, kernel stored HWIO). Then, with
the class token $x_{cls}$ and learned positions $E_{pos}$:

$$z_0 = [x_{cls};\ t_1; \dots; t_N] + E_{pos}\quad(E_{pos}\in\mathbb R^{(N+1)\times D};
\text{JAX original, timm default}),$$

$$z_0 = [x_{cls};\ t_1 + E_{pos,1}; \dots; t_N + E_{pos,N}]\quad(\texttt{no\_embed\_class=True}:
E_{pos}\in\mathbb R^{N\times D}, \text{DeiT-III, big\_vision}).$$

Backward
--------
Every step is linear: $dE_{pos} = \sum_b dz_{0,b}$ (over the rows it was added to),
$dx_{cls} = \sum_b dz_{0,b,0}$, $dt = dz_0[:, 1:]$; $dt$ back through the optional patch LayerNorm
(`refattn.blocks.core.norm_backward`), then through the conv: $dW = \sum_{b,p} dt_{b,p}\,x_{b,p}^\top$,
$db = \sum_{b,p} dt_{b,p}$, and $dx$ = each patch's $W^\top dt_p$ put back at its pixels (the
transposed strided conv of `refattn.nn.conv.conv_vjp`; patches do not overlap, so it is the
inverse permutation of patchify applied to $dt\,W$).

Conventions
-----------
``class_token`` (True; ViT ``classifier="token"``; False for ``"gap"``), ``no_embed_class``
(False: the position table covers the class token, as the JAX original), ``patch_norm`` (False;
timm's ``PatchEmbed(norm_layer=...)``, LayerNorm with ``eps`` 1e-6 as timm's ViT),
``dynamic_img_pad`` (False: ``H`` and ``W`` must be multiples of the patch, as timm's
``strict_img_size``; True pads zeros at the bottom/right as timm). Dropout (``pos_drop``) is
omitted (evaluation mode). The patch size is the conv kernel ``weight.shape[2:]``.

Agreement with upstream
-----------------------
timm's ``PatchEmbed`` + ``VisionTransformer._pos_embed`` (transcribed into a float64 torch script;
timm is not installed here), float64 CPU, all four combinations of ``class_token`` and
``no_embed_class``, with and without patch norm and dynamic padding: output and the gradients of
``x``, ``proj.weight``, ``proj.bias``, ``cls_token``, ``pos_embed`` (and the patch norm's) agree
to $5.3\times10^{-15}$ max abs, $7.7\times10^{-16}$ relative to each array's largest entry. The JAX original (flax) cannot run here; its
``embedding`` conv with the kernel transposed HWIO -> OIHW is the same map.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_params, check_positive, compute_dtype
from ..nn.conv import conv_apply, conv_vjp
from ..registry import Mechanism, Sample, register
from .core import norm_backward, norm_forward, norm_spec, param_dim

__all__ = ["vit_patch_embedding_forward", "vit_patch_embedding_backward", "vit_patch_embedding", "patchify",
           "unpatchify"]

_PROJ, _NORM = "patch_embed.proj", "patch_embed.norm"


def patchify(x: np.ndarray, patch_size) -> np.ndarray:
    r"""``(B, C, H, W) -> (B, N, C P_h P_w)``: patches row-major over the grid, each flattened
    channel-major (the order of a conv weight ``(D, C, P_h, P_w)`` reshaped to ``(D, -1)``).
    ``H``, ``W`` must be multiples of ``patch_size`` (an int or ``(P_h, P_w)``)."""
    ph, pw = (patch_size, patch_size) if np.isscalar(patch_size) else patch_size
    b, c, h, w = x.shape
    t = x.reshape(b, c, h // ph, ph, w // pw, pw).transpose(0, 2, 4, 1, 3, 5)
    return t.reshape(b, (h // ph) * (w // pw), c * ph * pw)


def unpatchify(patches: np.ndarray, patch_size, channels: int, grid) -> np.ndarray:
    """Inverse of :func:`patchify`: ``(B, N, C P_h P_w) -> (B, C, G_h P_h, G_w P_w)`` for a patch
    grid ``grid = (G_h, G_w)``."""
    ph, pw = (patch_size, patch_size) if np.isscalar(patch_size) else patch_size
    gh, gw = grid
    t = patches.reshape(patches.shape[0], gh, gw, channels, ph, pw).transpose(0, 3, 1, 4, 2, 5)
    return t.reshape(patches.shape[0], channels, gh * ph, gw * pw)


def _flag(value, name):
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool; got {type(value).__name__}")
    return bool(value)


def vit_patch_embedding_forward(x, params, *, class_token: bool = True, no_embed_class: bool = False,
                                patch_norm: bool = False, dynamic_img_pad: bool = False, eps: float = 1e-6):
    r"""ViT input embedding: conv patchify-projection, class token, learned positions (module docstring).

    Parameters
    ----------
    x : array (B, C, H, W)
        Images, channels first (PyTorch).
    params : dict
        timm's names: ``"patch_embed.proj.weight"`` ``(D, C, P_h, P_w)`` (``nn.Conv2d`` layout, as
        is), optional ``"patch_embed.proj.bias"`` ``(D,)``; ``"cls_token"`` ``(1, 1, D)`` when
        ``class_token``; ``"pos_embed"`` ``(1, L, D)`` with ``L = N + 1`` (class token and
        ``no_embed_class=False``) or ``L = N``; ``"patch_embed.norm.weight"``/``".bias"`` ``(D,)``
        when ``patch_norm``.
    class_token, no_embed_class, patch_norm, dynamic_img_pad : bool
        See the module docstring (defaults: the JAX original / timm's ViT-B/16).
    eps : float
        Patch LayerNorm epsilon (timm ViT: 1e-6).

    Returns
    -------
    z0, cache
        ``z0 (B, L_out, D)``, ``L_out = N + 1`` with a class token, else ``N``.
    """
    x = as_float(x, "x", ndim=4)
    class_token = _flag(class_token, "class_token")
    no_embed_class = _flag(no_embed_class, "no_embed_class")
    patch_norm = _flag(patch_norm, "patch_norm")
    dynamic_img_pad = _flag(dynamic_img_pad, "dynamic_img_pad")
    eps = check_positive(eps, "eps", allow_zero=True)
    param_dim(params, f"{_PROJ}.weight", 0, where="vit_patch_embedding", shape=("D", "C", "P_h", "P_w"))
    w = as_float(params[f"{_PROJ}.weight"], f"{_PROJ}.weight")
    d, c = w.shape[:2]
    if c != x.shape[1]:
        raise ValueError(f"{_PROJ}.weight must have x's {x.shape[1]} input channels on axis 1 ((D, C, P_h, P_w)); "
                         f"got {w.shape}")
    ph, pw = w.shape[2:]
    h, wd = x.shape[2:]
    if not dynamic_img_pad and (h % ph or wd % pw):
        raise ValueError(f"x spatial size {(h, wd)} must be a multiple of the patch size {(ph, pw)} "
                         f"(from {_PROJ}.weight); pass dynamic_img_pad=True to pad as timm")
    pad = (-h % ph, -wd % pw)
    grid = ((h + pad[0]) // ph, (wd + pad[1]) // pw)
    n = grid[0] * grid[1]
    length = n + 1 if class_token and not no_embed_class else n
    spec = {f"{_PROJ}.weight": w.shape, f"{_PROJ}.bias": (d,), "pos_embed": (1, length, d)}
    if class_token:
        spec["cls_token"] = (1, 1, d)
    if patch_norm:
        spec.update(norm_spec(_NORM, d))
    own = check_params(params, spec, optional=(f"{_PROJ}.bias",), where="vit_patch_embedding")
    dt = compute_dtype(x, *own.values())
    x, own = x.astype(dt, copy=False), cast_all(dt, own)
    xp = np.pad(x, ((0, 0), (0, 0), (0, pad[0]), (0, pad[1]))) if any(pad) else x
    y = conv_apply(xp, own[f"{_PROJ}.weight"], own.get(f"{_PROJ}.bias"), stride=(ph, pw))
    t = y.reshape(y.shape[0], d, n).transpose(0, 2, 1)
    t, cn = norm_forward(own, _NORM, t, eps=eps) if patch_norm else (t, None)
    b = x.shape[0]
    pos = own["pos_embed"]
    if class_token and no_embed_class:
        z = np.concatenate([np.broadcast_to(own["cls_token"], (b, 1, d)), t + pos], axis=1)
    elif class_token:
        z = np.concatenate([np.broadcast_to(own["cls_token"], (b, 1, d)), t], axis=1) + pos
    else:
        z = t + pos
    cache = {"xp": xp, "x_shape": x.shape, "params": own, "cn": cn, "grid": grid, "class_token": class_token,
             "no_embed_class": no_embed_class, "out_shape": z.shape, "dtype": dt}
    return z, cache


def vit_patch_embedding_backward(dout, cache):
    r"""Gradients of `vit_patch_embedding_forward` for ``x`` and every params key: sums over the
    batch for the class token and positions, the LayerNorm VJP, the conv VJP (module docstring)."""
    g = as_dout(dout, cache["out_shape"], cache["dtype"])
    own = cache["params"]
    grads = {}
    cls, nec = cache["class_token"], cache["no_embed_class"]
    if cls:
        grads["cls_token"] = g[:, :1].sum(axis=0, keepdims=True)
    dt = g[:, 1:] if cls else g
    grads["pos_embed"] = (dt if nec else g).sum(axis=0, keepdims=True)
    if cache["cn"] is not None:
        dt = norm_backward(grads, own, dt, cache["cn"])
    b, n, d = dt.shape
    dy = dt.transpose(0, 2, 1).reshape((b, d) + cache["grid"])
    w = own[f"{_PROJ}.weight"]
    cg = conv_vjp(dy, cache["xp"], w, stride=w.shape[2:], has_bias=f"{_PROJ}.bias" in own)
    h, wd = cache["x_shape"][2:]
    grads["x"] = cg["x"][:, :, :h, :wd]
    grads[f"{_PROJ}.weight"] = cg["weight"]
    if "bias" in cg:
        grads[f"{_PROJ}.bias"] = cg["bias"]
    return grads


def vit_patch_embedding(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of `vit_patch_embedding_forward`."""
    return vit_patch_embedding_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _params(rng, c, d, ph, pw, length, class_token=True, patch_norm=False, bias=True):
    p = {f"{_PROJ}.weight": rng.standard_normal((d, c, ph, pw)) / np.sqrt(c * ph * pw),
         "pos_embed": 0.5 * rng.standard_normal((1, length, d))}
    if bias:
        p[f"{_PROJ}.bias"] = 0.3 * rng.standard_normal(d)
    if class_token:
        p["cls_token"] = rng.standard_normal((1, 1, d))
    if patch_norm:
        p[f"{_NORM}.weight"] = 1.0 + 0.2 * rng.standard_normal(d)
        p[f"{_NORM}.bias"] = 0.1 * rng.standard_normal(d)
    return p


def _sample(rng, size):
    class_token = bool(rng.random() < 0.75)
    no_embed_class = bool(rng.random() < 0.5)
    patch_norm = bool(rng.random() < 0.3)
    dynamic = bool(rng.random() < 0.3)
    if size == "tiny":
        c, d, (ph, pw), (h, w) = 2, 3, ((2, 2) if rng.random() < 0.5 else (2, 1)), (4, 3 if dynamic else 4)
    else:
        c, d, (ph, pw), (h, w) = 3, 8, (3, 2), (7 if dynamic else 6, 8)
    n = -(-h // ph) * -(-w // pw)
    length = n + 1 if class_token and not no_embed_class else n
    p = _params(rng, c, d, ph, pw, length, class_token, patch_norm, bias=bool(rng.random() < 0.8))
    cfg = {"class_token": class_token, "no_embed_class": no_embed_class, "patch_norm": patch_norm,
           "dynamic_img_pad": dynamic}
    return Sample(inputs={"x": rng.standard_normal((2, c, h, w))}, params=p, config=cfg)


def _reference(x, params, class_token=True, no_embed_class=False, patch_norm=False, dynamic_img_pad=False, eps=1e-6):
    # Patchify (a reshape) and one matmul per token: the paper's x_p E, no convolution.
    w = params[f"{_PROJ}.weight"]
    d, c, ph, pw = w.shape
    h, wd = x.shape[2:]
    xp = np.pad(x, ((0, 0), (0, 0), (0, -h % ph), (0, -wd % pw)))
    t = patchify(xp, (ph, pw)) @ w.reshape(d, -1).T + params.get(f"{_PROJ}.bias", 0.0)
    if patch_norm:
        mu = t.mean(-1, keepdims=True)
        var = ((t - mu) ** 2).mean(-1, keepdims=True)
        t = (t - mu) / np.sqrt(var + eps) * params[f"{_NORM}.weight"] + params[f"{_NORM}.bias"]
    pos = params["pos_embed"]
    if not class_token:
        return t + pos
    cls = np.repeat(params["cls_token"], x.shape[0], axis=0)
    if no_embed_class:
        return np.concatenate([cls, t + pos], axis=1)
    return np.concatenate([cls, t], axis=1) + pos


def _check_patchify_inverse(rng):
    # patchify / unpatchify are inverse permutations of the entries (the catalogue's test).
    x = rng.standard_normal((2, 3, 6, 8))
    p = patchify(x, (3, 2))
    assert p.shape == (2, 8, 18)
    back = unpatchify(p, (3, 2), 3, (2, 4))
    assert np.array_equal(back, x), "unpatchify(patchify(x)) != x"
    perm = patchify(np.arange(x.size, dtype=float).reshape(x.shape), (3, 2))
    assert np.array_equal(np.sort(perm.reshape(-1)), np.arange(x.size)), "patchify is not a permutation"
    q = rng.standard_normal(p.shape)
    assert np.array_equal(patchify(unpatchify(q, (3, 2), 3, (2, 4)), (3, 2)), q)
    return 0.0


def _check_conv_is_patch_matmul(rng):
    # The strided conv equals patchify @ W^T + b (kernel = stride: no overlap, no padding).
    x = rng.standard_normal((2, 3, 8, 6))
    p = _params(rng, 3, 5, 4, 3, 4, class_token=False)
    z = vit_patch_embedding(x, p, class_token=False)
    ref = patchify(x, (4, 3)) @ p[f"{_PROJ}.weight"].reshape(5, -1).T + p[f"{_PROJ}.bias"] + p["pos_embed"]
    err = float(np.abs(z - ref).max())
    assert err < 1e-13, f"conv patch embedding != patchify matmul (err {err})"
    return err


def _check_pixel_gradient_is_unpatchify(rng):
    # dx is the inverse permutation of patchify applied to dt W (patches do not overlap).
    x = rng.standard_normal((2, 2, 4, 6))
    p = _params(rng, 2, 3, 2, 3, 5)
    z, cache = vit_patch_embedding_forward(x, p)
    g = rng.standard_normal(z.shape)
    dx = vit_patch_embedding_backward(g, cache)["x"]
    ref = unpatchify(g[:, 1:] @ p[f"{_PROJ}.weight"].reshape(3, -1), (2, 3), 2, (2, 2))
    err = float(np.abs(dx - ref).max())
    assert err < 1e-13, f"pixel gradient != unpatchify(dt W) (err {err})"
    return err


register(
    Mechanism(
        slug="vit_patch_embedding", family="5-building-blocks", tier="T2",
        title="ViT patch embedding (conv kernel = stride = patch) + CLS token and learned positions",
        paper="Dosovitskiy et al., An Image is Worth 16x16 Words: Transformers for Image Recognition at Scale, "
              "ICLR 2021, arXiv 2010.11929",
        forward=vit_patch_embedding_forward, backward=vit_patch_embedding_backward, sample=_sample,
        reference=_reference, docs="blocks/vision-token-mixers.md#vit-patch-embedding",
        checks={"patchify_unpatchify_inverse": _check_patchify_inverse,
                "conv_is_patch_matmul": _check_conv_is_patch_matmul,
                "pixel_gradient_is_unpatchify": _check_pixel_gradient_is_unpatchify},
    ),
)
