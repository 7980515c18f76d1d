r"""PoolFormer block: average pooling as the token mixer of a MetaFormer.

Yu, Luo, Zhou, Si, Zhou, Wang, Feng, Yan, "MetaFormer Is Actually What You Need for Vision",
CVPR 2022, arXiv 2111.11418. Upstream: sail-sg/poolformer ``models/poolformer.py``
(``Pooling``, ``GroupNorm``, ``Mlp``, ``PoolFormerBlock``) @ a075575b8b3dc3c76ecc5c49985d156167372bfa.

Forward
-------
On a channels-first feature map ``x (B, C, H, W)``, with $\mathrm{GN}$ = ``nn.GroupNorm(1, C)``
(one group: LayerNorm over $(C, H, W)$ per sample, per-channel affine), the pooling mixer

$$\mathrm{Pool}(T) = \mathrm{AvgPool}_{k\times k,\ \mathrm{stride}\ 1,\ \mathrm{pad}\ \lfloor k/2\rfloor,
\ \texttt{count\_include\_pad=False}}(T) - T$$

(the subtraction of $T$ because the block adds the residual itself), the 1x1-conv MLP
$\mathrm{MLP}(T) = W_2 * \mathrm{GELU}(W_1 * T + b_1) + b_2$ (hidden width ``mlp_ratio`` $\cdot C$) and
the layer scales $\ell_1, \ell_2\in\mathbb R^C$ (per channel):

$$Y = X + \ell_1\odot\mathrm{Pool}(\mathrm{GN}_1(X)),\qquad Z = Y + \ell_2\odot\mathrm{MLP}(\mathrm{GN}_2(Y)).$$

With ``count_include_pad=False`` a border window averages only its real entries: position
$(i, j)$ divides by $D_{ij} = |\{i-1,i,i+1\}\cap[0,H)|\cdot|\{j-1,j,j+1\}\cap[0,W)|$ (4 in a corner, 6 on
an edge, 9 inside for $k=3$), so a constant map has $\mathrm{Pool} = 0$ everywhere.

Backward
--------
$\mathrm{Pool}$ is linear; its adjoint spreads $\bar y_o/D_o$ over window $o$ (col2im,
`refattn.nn.pooling.avg_pool_vjp`) and subtracts $\bar y$: $\mathrm{Pool}^\top\bar y =
\mathrm{AvgPool}^\top\bar y - \bar y$. The block is undone in reverse:
$dY = dZ + \mathrm{GN}_2^\top\mathrm{MLP}^\top(\ell_2\odot dZ)$,
$d\ell_2 = \sum_{b,h,w} dZ\odot\mathrm{MLP}(\cdot)$;
$dX = dY + \mathrm{GN}_1^\top\mathrm{Pool}^\top(\ell_1\odot dY)$,
$d\ell_1 = \sum_{b,h,w} dY\odot\mathrm{Pool}(\cdot)$; $\mathrm{GN}^\top$ is the GroupNorm VJP of
`refattn.nn.norms.group_norm_backward`, $\mathrm{MLP}^\top$ the 1x1-conv VJPs
(`refattn.nn.conv.conv_vjp`) around $\mathrm{GELU}'$.

Conventions
-----------
``pool_size`` (3; odd, so the map keeps its size), ``use_layer_scale`` (True; False drops
$\ell_1, \ell_2$), ``eps`` (GroupNorm, 1e-5), ``activation`` (exact GELU, ``nn.GELU``). Dropout
and DropPath are omitted (evaluation mode). The MLP width is read from ``mlp.fc1.weight``.
`pooling_mixer_forward`/`pooling_mixer_backward` expose the ``Pooling`` module alone.

Agreement with upstream
-----------------------
Upstream's ``PoolFormerBlock`` (with ``Pooling``, ``GroupNorm``, ``Mlp`` copied into a scratch
script; ``timm``'s ``DropPath``/``trunc_normal_`` stubbed, drop rates 0), float64 CPU, with and
without layer scale, ``pool_size`` 3 and 5: output and every gradient agree to
$2.3\times10^{-14}$ max abs ($1.1\times10^{-15}$ relative to each array's largest entry). The
gradient of ``norm1.bias`` is identically zero (the mixer annihilates a per-channel constant);
both implementations return round-off ($\sim10^{-15}$) there.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_choice, check_int, check_params, check_positive
from ..nn.conv import conv_apply, conv_vjp
from ..nn.norms import group_norm_backward, group_norm_forward
from ..nn.pooling import avg_pool_apply, avg_pool_vjp
from ..registry import Mechanism, Sample, register
from .core import ACTIVATIONS, activation_functions, block_dtype, param_dim

__all__ = ["poolformer_pooling_mixer_forward", "poolformer_pooling_mixer_backward", "poolformer_pooling_mixer",
           "pooling_mixer_forward", "pooling_mixer_backward"]


def _pool_cfg(pool_size):
    return {"kernel_size": (pool_size, pool_size), "stride": 1, "padding": pool_size // 2, "count_include_pad": False}


def _check_pool_size(pool_size):
    k = check_int(pool_size, "pool_size", minimum=1)
    if k % 2 == 0:
        raise ValueError(f"pool_size must be odd (stride 1, padding pool_size // 2 keep the map's size); got {k}")
    return k


def pooling_mixer_forward(x, *, pool_size: int = 3):
    r"""PoolFormer's ``Pooling`` alone: $\mathrm{AvgPool}_{k,1,\lfloor k/2\rfloor,\ \mathrm{no\ pad\ count}}(x) - x$.

    ``x (B, C, H, W)``; returns ``(y, cache)`` with ``y`` of the shape of ``x``."""
    x = as_float(x, "x", ndim=4)
    k = _check_pool_size(pool_size)
    return avg_pool_apply(x, **_pool_cfg(k)) - x, {"shape": x.shape, "dtype": x.dtype, "pool_size": k}


def pooling_mixer_backward(dout, cache):
    r"""Gradient of `pooling_mixer_forward`: ``{"x": AvgPool^T dout - dout}``."""
    g = as_dout(dout, cache["shape"], cache["dtype"])
    return {"x": avg_pool_vjp(g, cache["shape"], **_pool_cfg(cache["pool_size"])) - g}


def poolformer_pooling_mixer_forward(x, params, *, pool_size: int = 3, use_layer_scale: bool = True,
                                     eps: float = 1e-5, activation: str = "gelu"):
    r"""One PoolFormer block (module docstring) on ``x (B, C, H, W)``.

    Parameters
    ----------
    x : array (B, C, H, W)
    params : dict
        Upstream names: ``"norm1.weight"``, ``"norm1.bias"``, ``"norm2.weight"``, ``"norm2.bias"``
        ``(C,)``; ``"mlp.fc1.weight"`` ``(F, C, 1, 1)``, ``"mlp.fc1.bias"`` ``(F,)``,
        ``"mlp.fc2.weight"`` ``(C, F, 1, 1)``, ``"mlp.fc2.bias"`` ``(C,)`` (``nn.Conv2d`` layout, as
        is); ``"layer_scale_1"``, ``"layer_scale_2"`` ``(C,)`` when ``use_layer_scale``.
    pool_size : int
        Odd pooling window (3).
    use_layer_scale : bool
    eps : float
        GroupNorm epsilon.
    activation : {"gelu", "gelu_tanh", "relu", "silu"}
        The MLP activation (upstream ``nn.GELU``: exact).

    Returns
    -------
    z, cache
        ``z`` of the shape of ``x``.
    """
    x = as_float(x, "x", ndim=4)
    k = _check_pool_size(pool_size)
    if not isinstance(use_layer_scale, (bool, np.bool_)):
        raise TypeError(f"use_layer_scale must be a bool; got {type(use_layer_scale).__name__}")
    eps = check_positive(eps, "eps", allow_zero=True)
    check_choice(activation, "activation", ACTIVATIONS)
    c = x.shape[1]
    hidden = param_dim(params, "mlp.fc1.weight", 0, where="poolformer_pooling_mixer", shape=("F", "C", 1, 1))
    spec = {"norm1.weight": (c,), "norm1.bias": (c,), "norm2.weight": (c,), "norm2.bias": (c,),
            "mlp.fc1.weight": (hidden, c, 1, 1), "mlp.fc1.bias": (hidden,), "mlp.fc2.weight": (c, hidden, 1, 1),
            "mlp.fc2.bias": (c,)}
    if use_layer_scale:
        spec.update({"layer_scale_1": (c,), "layer_scale_2": (c,)})
    own = check_params(params, spec, where="poolformer_pooling_mixer")
    dt = block_dtype(x, own)
    x, own = x.astype(dt, copy=False), cast_all(dt, own)
    f, _ = activation_functions(activation)
    n1, c1 = group_norm_forward(x, {"weight": own["norm1.weight"], "bias": own["norm1.bias"]}, num_groups=1,
                                channel_axis=1, eps=eps)
    mix = avg_pool_apply(n1, **_pool_cfg(k)) - n1
    ls1 = own["layer_scale_1"].reshape(-1, 1, 1) if use_layer_scale else 1.0
    y = x + ls1 * mix
    n2, c2 = group_norm_forward(y, {"weight": own["norm2.weight"], "bias": own["norm2.bias"]}, num_groups=1,
                                channel_axis=1, eps=eps)
    a = conv_apply(n2, own["mlp.fc1.weight"], own["mlp.fc1.bias"])
    h = f(a)
    m = conv_apply(h, own["mlp.fc2.weight"], own["mlp.fc2.bias"])
    ls2 = own["layer_scale_2"].reshape(-1, 1, 1) if use_layer_scale else 1.0
    z = y + ls2 * m
    cache = {"params": own, "c1": c1, "c2": c2, "mix": mix, "n2": n2, "a": a, "h": h, "m": m, "k": k,
             "layer_scale": bool(use_layer_scale), "activation": activation, "shape": x.shape, "dtype": dt}
    return z, cache


def poolformer_pooling_mixer_backward(dout, cache):
    r"""Gradients of `poolformer_pooling_mixer_forward` for ``x`` and every params key (the block
    undone in reverse; module docstring)."""
    dz = as_dout(dout, cache["shape"], cache["dtype"])
    own = cache["params"]
    _, fp = activation_functions(cache["activation"])
    grads = {}
    axes = (0, 2, 3)
    ls = cache["layer_scale"]
    if ls:
        grads["layer_scale_2"] = (dz * cache["m"]).sum(axis=axes)
        dm = dz * own["layer_scale_2"].reshape(-1, 1, 1)
    else:
        dm = dz
    g2 = conv_vjp(dm, cache["h"], own["mlp.fc2.weight"])
    g1 = conv_vjp(g2["x"] * fp(cache["a"]), cache["n2"], own["mlp.fc1.weight"])
    grads.update({"mlp.fc2.weight": g2["weight"], "mlp.fc2.bias": g2["bias"], "mlp.fc1.weight": g1["weight"],
                  "mlp.fc1.bias": g1["bias"]})
    gn2 = group_norm_backward(g1["x"], cache["c2"])
    dy = dz + gn2["x"]
    if ls:
        grads["layer_scale_1"] = (dy * cache["mix"]).sum(axis=axes)
        dmix = dy * own["layer_scale_1"].reshape(-1, 1, 1)
    else:
        dmix = dy
    dn1 = avg_pool_vjp(dmix, cache["shape"], **_pool_cfg(cache["k"])) - dmix
    gn1 = group_norm_backward(dn1, cache["c1"])
    grads["x"] = dy + gn1["x"]
    for i, g in ((1, gn1), (2, gn2)):
        grads[f"norm{i}.weight"], grads[f"norm{i}.bias"] = g["weight"], g["bias"]
    return grads


def poolformer_pooling_mixer(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of `poolformer_pooling_mixer_forward`."""
    return poolformer_pooling_mixer_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _params(rng, c, hidden, layer_scale=True):
    p = {}
    for i in (1, 2):
        p[f"norm{i}.weight"] = 1.0 + 0.2 * rng.standard_normal(c)
        p[f"norm{i}.bias"] = 0.2 * rng.standard_normal(c)
    p["mlp.fc1.weight"] = rng.standard_normal((hidden, c, 1, 1)) / np.sqrt(c)
    p["mlp.fc1.bias"] = 0.2 * rng.standard_normal(hidden)
    p["mlp.fc2.weight"] = rng.standard_normal((c, hidden, 1, 1)) / np.sqrt(hidden)
    p["mlp.fc2.bias"] = 0.2 * rng.standard_normal(c)
    if layer_scale:
        # upstream initialises 1e-5; O(1) values exercise the gradients
        p["layer_scale_1"] = 0.5 + rng.random(c)
        p["layer_scale_2"] = 0.5 + rng.random(c)
    return p


def _sample(rng, size):
    ls = bool(rng.random() < 0.75)
    if size == "tiny":
        c, h, w, hidden, k = 2, 3, 4, 4, 3
    else:
        c, h, w, hidden, k = 4, 5, 6, 16, int(rng.choice([3, 5]))
    return Sample(inputs={"x": rng.standard_normal((2, c, h, w))}, params=_params(rng, c, hidden, ls),
                  config={"pool_size": k, "use_layer_scale": ls})


def _gn1(x, w, b, eps):
    mu = x.mean(axis=(1, 2, 3), keepdims=True)
    var = ((x - mu) ** 2).mean(axis=(1, 2, 3), keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w.reshape(-1, 1, 1) + b.reshape(-1, 1, 1)


def _window_mean(t, k):
    # count_include_pad=False average, one window at a time (real entries only).
    out = np.empty_like(t)
    r = k // 2
    for i in range(t.shape[2]):
        for j in range(t.shape[3]):
            win = t[:, :, max(i - r, 0):i + r + 1, max(j - r, 0):j + r + 1]
            out[:, :, i, j] = win.mean(axis=(2, 3))
    return out


def _reference(x, params, pool_size=3, use_layer_scale=True, eps=1e-5, activation="gelu"):
    # The upstream block written out with explicit window means and einsum 1x1 convs.
    f, _ = activation_functions(activation)
    p = params
    ls1 = p["layer_scale_1"].reshape(-1, 1, 1) if use_layer_scale else 1.0
    ls2 = p["layer_scale_2"].reshape(-1, 1, 1) if use_layer_scale else 1.0
    t = _gn1(x, p["norm1.weight"], p["norm1.bias"], eps)
    y = x + ls1 * (_window_mean(t, pool_size) - t)
    t = _gn1(y, p["norm2.weight"], p["norm2.bias"], eps)
    a = np.einsum("fc,bchw->bfhw", p["mlp.fc1.weight"][:, :, 0, 0], t) + p["mlp.fc1.bias"].reshape(-1, 1, 1)
    m = np.einsum("cf,bfhw->bchw", p["mlp.fc2.weight"][:, :, 0, 0], f(a)) + p["mlp.fc2.bias"].reshape(-1, 1, 1)
    return y + ls2 * m


def _check_constant_input_zero_mixer(rng):
    # A constant map: every window averages equal values (padding not counted), so Pool = 0.
    x = np.full((2, 3, 5, 4), -1.7)
    err = float(np.abs(pooling_mixer_forward(x)[0]).max())
    x = np.broadcast_to(rng.standard_normal((2, 3, 1, 1)), (2, 3, 5, 4))
    err = max(err, float(np.abs(pooling_mixer_forward(x, pool_size=5)[0]).max()))
    assert err < 1e-15, f"pooling mixer of a per-channel constant map is not zero (err {err})"
    return err


def _check_pool_adjoint(rng):
    # <Pool x, g> = <x, Pool^T g>, and the border divisors are the counts of real entries.
    x = rng.standard_normal((2, 3, 5, 4))
    g = rng.standard_normal(x.shape)
    y, cache = pooling_mixer_forward(x)
    lhs, rhs = float(np.sum(y * g)), float(np.sum(x * pooling_mixer_backward(g, cache)["x"]))
    err = abs(lhs - rhs) / max(abs(lhs), 1.0)
    one = np.zeros((1, 1, 5, 4))
    one[0, 0, 0, 0] = 1.0
    corner = pooling_mixer_forward(one)[0] + one  # AvgPool of a unit impulse at the corner
    assert abs(corner[0, 0, 0, 0] - 1 / 4) < 1e-15 and abs(corner[0, 0, 1, 1] - 1 / 9) < 1e-15
    assert abs(corner[0, 0, 0, 1] - 1 / 6) < 1e-15, "edge/corner divisors must count real entries only"
    assert err < 1e-13, f"pooling mixer backward is not its adjoint (rel err {err})"
    return err


def _check_no_layer_scale_is_unit_scale(rng):
    s = _sample(rng, "small")
    p = dict(s.params)
    c = s.inputs["x"].shape[1]
    p["layer_scale_1"], p["layer_scale_2"] = np.ones(c), np.ones(c)
    a = poolformer_pooling_mixer(**s.inputs, params=p, pool_size=s.config["pool_size"])
    q = {k: v for k, v in p.items() if not k.startswith("layer_scale")}
    b = poolformer_pooling_mixer(**s.inputs, params=q, pool_size=s.config["pool_size"], use_layer_scale=False)
    err = float(np.abs(a - b).max())
    assert err < 1e-14, f"use_layer_scale=False differs from unit layer scales (err {err})"
    return err


def _check_norm1_bias_gradient_is_zero(rng):
    # GN1's bias adds a per-channel constant, which the pooling mixer maps to 0: dL/d(norm1.bias) = 0.
    s = _sample(rng, "small")
    z, cache = poolformer_pooling_mixer_forward(**s.inputs, params=s.params, **s.config)
    g = poolformer_pooling_mixer_backward(rng.standard_normal(z.shape), cache)
    err = float(np.abs(g["norm1.bias"]).max())
    assert err < 1e-12 * max(float(np.abs(g["norm1.weight"]).max()), 1.0), f"d norm1.bias = {err}, expected 0"
    return err


register(
    Mechanism(
        slug="poolformer_pooling_mixer", family="5-building-blocks", tier="T2",
        title="PoolFormer block: AvgPool(3, stride 1, count_include_pad=False) - x as token mixer, GN, 1x1-conv MLP",
        paper="Yu, Luo, Zhou, Si, Zhou, Wang, Feng, Yan, MetaFormer Is Actually What You Need for Vision, "
              "CVPR 2022, arXiv 2111.11418",
        forward=poolformer_pooling_mixer_forward, backward=poolformer_pooling_mixer_backward, sample=_sample,
        reference=_reference, docs="blocks/vision-token-mixers.md#poolformer-pooling-mixer",
        checks={"constant_input_zero_mixer": _check_constant_input_zero_mixer, "pool_adjoint": _check_pool_adjoint,
                "no_layer_scale_is_unit_scale": _check_no_layer_scale_is_unit_scale,
                "norm1_bias_gradient_is_zero": _check_norm1_bias_gradient_is_zero},
    ),
)
