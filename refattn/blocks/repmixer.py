r"""FastViT RepMixer: a depthwise-conv token mixer trained with parallel branches and
structurally re-parameterised into one depthwise conv for inference.

Vasu, Gabriel, Zhu, Tuzel, Ranjan, "FastViT: A Fast Hybrid Vision Transformer using Structural
Reparameterization", ICCV 2023, arXiv 2303.14189. Upstream: apple/ml-fastvit ``models/fastvit.py``
(``RepMixer``) and ``models/modules/mobileone.py`` (``MobileOneBlock``: ``_conv_bn``,
``_fuse_bn_tensor``, ``_get_kernel_bias``) @ 8af5928238cab99c45f64fc3e4e7b1516b8224ba.

Forward (train-time form)
-------------------------
On ``x (B, C, H, W)``, with $\mathrm{BN}$ = ``BatchNorm2d`` and $\mathrm{DW}_k$ a depthwise
(``groups=C``) $k\times k$ conv with zero padding $\lfloor k/2\rfloor$ and no bias, RepMixer is

$$Y = X + \ell\odot\big(\mathrm{Mixer}(X) - \mathrm{Norm}(X)\big),$$

$$\mathrm{Norm}(X) = \mathrm{BN}_{n}(X),\qquad
\mathrm{Mixer}(X) = \mathrm{BN}_{m}(X) + \mathrm{BN}_{s}(\mathrm{DW}_1 X) + \textstyle\sum_{i}\mathrm{BN}_{c,i}(\mathrm{DW}_k^{(i)} X),$$

two ``MobileOneBlock``s without activation: ``norm`` keeps only its BN skip branch
(``num_conv_branches=0``, ``use_scale_branch=False``); ``mixer`` has the skip BN, the 1x1 "scale"
conv-BN and ``num_conv_branches`` (1) $k\times k$ conv-BN branches. $\ell$ = ``layer_scale``
``(C, 1, 1)`` (init $10^{-5}$); without layer scale $Y = X + \mathrm{Mixer}(X) - \mathrm{Norm}(X)$.
The catalogue's shorthand $Y = X + \mathrm{DWConv}(\mathrm{BN}(X))$ is this with the branches merged.

Re-parameterisation (inference form)
------------------------------------
In evaluation mode each branch is a per-channel affine map of a depthwise conv: BN after a conv
$K$ is the conv $K\,\gamma/\sigma$ with bias $\beta - \mu\gamma/\sigma$ ($\sigma = \sqrt{\sigma^2_r+\epsilon}$);
a BN skip branch is that with $K = I_k$, the depthwise identity kernel (1 at the centre); the 1x1
kernel is zero-padded to $k\times k$. Summing, $\mathrm{Mixer} = K_m * X + b_m$,
$\mathrm{Norm} = K_n * X + b_n$ and

$$Y = K' * X + b',\qquad K' = I_k + \ell\,(K_m - K_n),\qquad b' = \ell\,(b_m - b_n),$$

one depthwise conv (``reparam_conv``), exactly equal to the train-time form with BN in
evaluation mode (`fastvit_repmixer_reparameterize`; the check ``reparameterised_equals_train_form``).

Backward
--------
Train form: $dX = dY + \sum_{\text{branches}} J^\top(\ell\odot dY)$ with each branch's VJP — BN
(`refattn.blocks.core.batch_norm_backward`) and, for conv branches, then the depthwise conv VJP
(`refattn.nn.conv.conv_vjp`); $d\ell = \sum_{b,h,w} dY\odot(\mathrm{Mixer}-\mathrm{Norm})$; the
``norm`` branch enters with a minus sign. Inference form: the conv VJP.

Conventions
-----------
``inference_mode`` (False: train-time params; True: ``reparam_conv`` params, upstream's
``RepMixer(inference_mode=True)``), ``use_layer_scale`` (True), ``num_conv_branches`` (1, as
RepMixer builds it), ``kernel_size`` (3), ``training`` (False: BN with running statistics, as
``model.eval()``; True: batch statistics, and the re-parameterisation no longer applies), ``eps``
(BN, 1e-5).

Agreement with upstream
-----------------------
Upstream's ``RepMixer`` with its ``MobileOneBlock`` (copied into a scratch script at run time),
float64 CPU, with and without layer scale, ``kernel_size`` 3 and 5. ``model.eval()``: output and
the gradients of ``x`` and every parameter agree to $1.1\times10^{-14}$ max abs
($8.1\times10^{-16}$ relative); the running statistics' gradients have no torch counterpart
(buffers) and are checked by finite differences. ``model.train()`` (batch statistics): $5.7\times
10^{-14}$ max abs; the relative error peaks at $2\times10^{-13}$ on the 1x1 scale-branch conv
weight, whose gradient is a near-cancellation (train-mode BN removes a per-channel scale up to
$\epsilon$). Upstream's ``reparameterize()`` and `fastvit_repmixer_reparameterize` give kernels and
biases equal to $2.2\times10^{-16}$, and upstream's re-parameterised module reproduces our
train-time form to $3.6\times10^{-15}$.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_int, check_params, check_positive
from ..nn.conv import conv_apply, conv_vjp
from ..registry import Mechanism, Sample, register
from .core import BATCH_NORM_KEYS, batch_norm_backward, batch_norm_forward, batch_norm_spec, block_dtype

__all__ = ["fastvit_repmixer_forward", "fastvit_repmixer_backward", "fastvit_repmixer",
           "fastvit_repmixer_reparameterize", "repmixer_branches"]


def repmixer_branches(kernel_size: int = 3, num_conv_branches: int = 1):
    """The train-time branches as ``(sign, conv prefix or None, BN prefix, kernel)``: the ``norm``
    skip BN (sign -1), the ``mixer`` skip BN, the 1x1 scale conv-BN (when ``kernel_size > 1``) and
    the ``kernel_size`` conv-BN branches (upstream's module names)."""
    out = [(-1.0, None, "norm.rbr_skip", 1), (1.0, None, "mixer.rbr_skip", 1)]
    if kernel_size > 1:
        out.append((1.0, "mixer.rbr_scale.conv", "mixer.rbr_scale.bn", 1))
    out += [(1.0, f"mixer.rbr_conv.{i}.conv", f"mixer.rbr_conv.{i}.bn", kernel_size) for i in range(num_conv_branches)]
    return out


def _spec(c, k, inference_mode, use_layer_scale, branches):
    if inference_mode:
        return {"reparam_conv.weight": (c, 1, k, k), "reparam_conv.bias": (c,)}
    spec = {}
    for _, conv, bn, kk in branches:
        if conv is not None:
            spec[f"{conv}.weight"] = (c, 1, kk, kk)
        spec.update(batch_norm_spec(bn, c))
    if use_layer_scale:
        spec["layer_scale"] = (c, 1, 1)
    return spec


def _config(x, kernel_size, num_conv_branches, use_layer_scale, inference_mode, training, eps):
    k = check_int(kernel_size, "kernel_size", minimum=1)
    if k % 2 == 0:
        raise ValueError(f"kernel_size must be odd (padding kernel_size // 2 keeps the map's size); got {k}")
    nb = check_int(num_conv_branches, "num_conv_branches", minimum=0)
    for name, v in (("use_layer_scale", use_layer_scale), ("inference_mode", inference_mode), ("training", training)):
        if not isinstance(v, (bool, np.bool_)):
            raise TypeError(f"{name} must be a bool; got {type(v).__name__}")
    if inference_mode and training:
        raise ValueError("training=True needs the train-time form (inference_mode=False): the re-parameterised "
                         "conv has no batch-norm statistics")
    return k, nb, check_positive(eps, "eps", allow_zero=True)


def _check_running_var(own):
    for key, v in own.items():
        if key.endswith("running_var") and np.any(v < 0):
            raise ValueError(f"{key} must be >= 0 (a variance); got min {float(v.min())}")


def fastvit_repmixer_forward(x, params, *, kernel_size: int = 3, num_conv_branches: int = 1,
                             use_layer_scale: bool = True, inference_mode: bool = False, training: bool = False,
                             eps: float = 1e-5):
    r"""RepMixer on ``x (B, C, H, W)``: the train-time branches or the re-parameterised conv (module docstring).

    Parameters
    ----------
    x : array (B, C, H, W)
    params : dict
        Upstream ``state_dict`` names (conv weights in ``nn.Conv2d`` layout, as is; drop the
        ``num_batches_tracked`` buffers). Train form: ``"norm.rbr_skip.{weight,bias,running_mean,
        running_var}"``, ``"mixer.rbr_skip.{...}"``, ``"mixer.rbr_scale.conv.weight"`` ``(C,1,1,1)``
        and ``"mixer.rbr_scale.bn.{...}"``, ``"mixer.rbr_conv.{i}.conv.weight"`` ``(C,1,k,k)`` and
        ``"mixer.rbr_conv.{i}.bn.{...}"``, ``"layer_scale"`` ``(C,1,1)``. Inference form:
        ``"reparam_conv.weight"`` ``(C,1,k,k)``, ``"reparam_conv.bias"`` ``(C,)``.
    kernel_size, num_conv_branches : int
    use_layer_scale, inference_mode, training : bool
    eps : float
        Batch-norm epsilon.

    Returns
    -------
    y, cache
        ``y`` of the shape of ``x``.
    """
    x = as_float(x, "x", ndim=4)
    k, nb, eps = _config(x, kernel_size, num_conv_branches, use_layer_scale, inference_mode, training, eps)
    c = x.shape[1]
    branches = repmixer_branches(k, nb)
    own = check_params(params, _spec(c, k, inference_mode, use_layer_scale, branches), where="fastvit_repmixer")
    _check_running_var(own)
    dt = block_dtype(x, own)
    x, own = x.astype(dt, copy=False), cast_all(dt, own)
    pad = k // 2
    cache = {"x": x, "params": own, "inference": bool(inference_mode), "shape": x.shape, "dtype": dt, "pad": pad}
    if inference_mode:
        return conv_apply(x, own["reparam_conv.weight"], own["reparam_conv.bias"], padding=pad, groups=c), cache
    mix = np.zeros_like(x)
    caches = []
    for sign, conv, bn, kk in branches:
        h = x if conv is None else conv_apply(x, own[f"{conv}.weight"], padding=kk // 2, groups=c)
        o, cb = batch_norm_forward(own, bn, h, training=bool(training), eps=eps)
        mix = mix + sign * o
        caches.append((sign, conv, kk, cb))
    ls = own["layer_scale"] if use_layer_scale else None
    cache.update({"branches": caches, "mix": mix, "ls": ls})
    return x + (mix if ls is None else ls * mix), cache


def fastvit_repmixer_backward(dout, cache):
    r"""Gradients of `fastvit_repmixer_forward` for ``x`` and every params key (module docstring)."""
    g = as_dout(dout, cache["shape"], cache["dtype"])
    own, x = cache["params"], cache["x"]
    c = x.shape[1]
    if cache["inference"]:
        r = conv_vjp(g, x, own["reparam_conv.weight"], padding=cache["pad"], groups=c)
        return {"x": r["x"], "reparam_conv.weight": r["weight"], "reparam_conv.bias": r["bias"]}
    grads = {}
    ls = cache["ls"]
    if ls is not None:
        grads["layer_scale"] = (g * cache["mix"]).sum(axis=(0, 2, 3)).reshape(c, 1, 1)
        gm = g * ls
    else:
        gm = g
    dx = g.copy()
    for sign, conv, kk, cb in cache["branches"]:
        dh = batch_norm_backward(grads, own, sign * gm, cb)
        if conv is None:
            dx += dh
        else:
            r = conv_vjp(dh, x, own[f"{conv}.weight"], padding=kk // 2, groups=c, has_bias=False)
            grads[f"{conv}.weight"] = r["weight"]
            dx += r["x"]
    grads["x"] = dx
    return grads


def fastvit_repmixer(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of `fastvit_repmixer_forward`."""
    return fastvit_repmixer_forward(x, params, **config)[0]


def fastvit_repmixer_reparameterize(params, *, kernel_size: int = 3, num_conv_branches: int = 1,
                                    use_layer_scale: bool = True, eps: float = 1e-5) -> dict:
    r"""Fold the train-time branches (BN in evaluation mode) into one depthwise conv: returns
    ``{"reparam_conv.weight": K' (C, 1, k, k), "reparam_conv.bias": b' (C,)}`` with
    $K' = I_k + \ell(K_m - K_n)$, $b' = \ell(b_m - b_n)$ (upstream ``RepMixer.reparameterize``)."""
    k, nb, eps = _config(None, kernel_size, num_conv_branches, use_layer_scale, False, False, eps)
    w0 = params.get("norm.rbr_skip.weight") if isinstance(params, dict) else None
    if w0 is None:
        raise ValueError("params is missing key 'norm.rbr_skip.weight' (the train-time form is needed)")
    c = as_float(w0, "norm.rbr_skip.weight", ndim=1).shape[0]
    branches = repmixer_branches(k, nb)
    own = check_params(params, _spec(c, k, False, use_layer_scale, branches), where="fastvit_repmixer_reparameterize")
    _check_running_var(own)
    dt = block_dtype(own["norm.rbr_skip.weight"], own)
    own = cast_all(dt, own)
    ident = np.zeros((c, 1, k, k), dtype=dt)
    ident[:, 0, k // 2, k // 2] = 1.0
    kern, bias = np.zeros((c, 1, k, k), dtype=dt), np.zeros(c, dtype=dt)
    for sign, conv, bn, kk in branches:
        gamma, beta, mean, var = (own[f"{bn}.{n}"] for n in BATCH_NORM_KEYS)
        t = gamma / np.sqrt(var + eps)
        if conv is None:
            kb = ident
        else:
            p = (k - kk) // 2
            kb = np.pad(own[f"{conv}.weight"], ((0, 0), (0, 0), (p, p), (p, p)))
        kern += sign * kb * t.reshape(-1, 1, 1, 1)
        bias += sign * (beta - mean * t)
    ls = own["layer_scale"].reshape(-1) if use_layer_scale else np.ones(c, dtype=dt)
    return {"reparam_conv.weight": ident + ls.reshape(-1, 1, 1, 1) * kern, "reparam_conv.bias": ls * bias}


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _train_params(rng, c, k, nb=1, layer_scale=True):
    p = {}
    for _, conv, bn, kk in repmixer_branches(k, nb):
        if conv is not None:
            p[f"{conv}.weight"] = rng.standard_normal((c, 1, kk, kk)) / kk
        p[f"{bn}.weight"] = 1.0 + 0.3 * rng.standard_normal(c)
        p[f"{bn}.bias"] = 0.3 * rng.standard_normal(c)
        p[f"{bn}.running_mean"] = 0.3 * rng.standard_normal(c)
        p[f"{bn}.running_var"] = 0.5 + rng.random(c)
    if layer_scale:
        # upstream initialises 1e-5; O(1) values exercise the gradients
        p["layer_scale"] = (0.5 + rng.random(c)).reshape(c, 1, 1)
    return p


def _sample(rng, size):
    inference = bool(rng.random() < 0.25)
    ls = bool(rng.random() < 0.75)
    c, h, w, k, nb = (2, 3, 3, 3, 1) if size == "tiny" else (4, 6, 5, int(rng.choice([3, 5])), int(rng.integers(1, 3)))
    cfg = {"kernel_size": k, "num_conv_branches": nb, "use_layer_scale": ls, "inference_mode": inference}
    p = _train_params(rng, c, k, nb, ls)
    if inference:
        p = fastvit_repmixer_reparameterize(p, kernel_size=k, num_conv_branches=nb, use_layer_scale=ls)
    return Sample(inputs={"x": rng.standard_normal((2, c, h, w))}, params=p, config=cfg)


def _dwconv(x, w, pad):
    # Depthwise correlation written as explicit shifted sums.
    k = w.shape[-1]
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    h, wd = x.shape[2:]
    out = np.zeros_like(x)
    for i in range(k):
        for j in range(k):
            out += w[None, :, 0, i, j, None, None] * xp[:, :, i:i + h, j:j + wd]
    return out


def _bn_eval(x, p, pre, eps):
    r = lambda n: p[f"{pre}.{n}"].reshape(1, -1, 1, 1)  # noqa: E731
    return (x - r("running_mean")) / np.sqrt(r("running_var") + eps) * r("weight") + r("bias")


def _reference(x, params, kernel_size=3, num_conv_branches=1, use_layer_scale=True, inference_mode=False,
               training=False, eps=1e-5):
    # Upstream's forward, branch by branch, with explicit shifted-sum depthwise convs.
    p = params
    if inference_mode:
        return _dwconv(x, p["reparam_conv.weight"], kernel_size // 2) + p["reparam_conv.bias"].reshape(1, -1, 1, 1)
    mix = _bn_eval(x, p, "mixer.rbr_skip", eps) - _bn_eval(x, p, "norm.rbr_skip", eps)
    if kernel_size > 1:
        mix = mix + _bn_eval(_dwconv(x, p["mixer.rbr_scale.conv.weight"], 0), p, "mixer.rbr_scale.bn", eps)
    for i in range(num_conv_branches):
        mix = mix + _bn_eval(_dwconv(x, p[f"mixer.rbr_conv.{i}.conv.weight"], kernel_size // 2), p,
                             f"mixer.rbr_conv.{i}.bn", eps)
    return x + (p["layer_scale"] * mix if use_layer_scale else mix)


def _check_reparameterised_equals_train_form(rng):
    # The structural re-parameterisation is exact in evaluation mode (the catalogue's test).
    err = 0.0
    for k, nb, ls in [(3, 1, True), (3, 1, False), (5, 2, True), (1, 0, True)]:
        x = rng.standard_normal((2, 3, 6, 5))
        p = _train_params(rng, 3, k, nb, ls)
        cfg = {"kernel_size": k, "num_conv_branches": nb, "use_layer_scale": ls}
        y = fastvit_repmixer(x, p, **cfg)
        q = fastvit_repmixer_reparameterize(p, **cfg)
        yi = fastvit_repmixer(x, q, inference_mode=True, **cfg)
        err = max(err, float(np.abs(y - yi).max()))
    assert err < 1e-13, f"re-parameterised RepMixer differs from the train-time form (err {err})"
    return err


def _check_identity_at_zero_layer_scale(rng):
    # layer_scale = 0 (and a zero mixer-minus-norm) gives the identity; the identity kernel is I_k.
    x = rng.standard_normal((2, 3, 4, 5))
    p = _train_params(rng, 3, 3)
    p["layer_scale"] = np.zeros((3, 1, 1))
    err = float(np.abs(fastvit_repmixer(x, p) - x).max())
    q = fastvit_repmixer_reparameterize(p)
    err = max(err, float(np.abs(fastvit_repmixer(x, q, inference_mode=True) - x).max()))
    assert err == 0.0, f"layer_scale = 0 is not the identity (err {err})"
    return err


register(
    Mechanism(
        slug="fastvit_repmixer", family="5-building-blocks", tier="T2",
        title="FastViT RepMixer: X + ls*(Mixer(X) - Norm(X)) with MobileOne branches; re-parameterised depthwise conv",
        paper="Vasu, Gabriel, Zhu, Tuzel, Ranjan, FastViT: A Fast Hybrid Vision Transformer using Structural "
              "Reparameterization, ICCV 2023, arXiv 2303.14189",
        forward=fastvit_repmixer_forward, backward=fastvit_repmixer_backward, sample=_sample, reference=_reference,
        docs="blocks/vision-token-mixers.md#fastvit-repmixer",
        checks={"reparameterised_equals_train_form": _check_reparameterised_equals_train_form,
                "identity_at_zero_layer_scale": _check_identity_at_zero_layer_scale},
    ),
)
