r"""FactFormer's axial factorised kernel integral (and the full ``FABlock2D`` around it).

Paper: Li, Shu, Barati Farimani, "Scalable Transformer for PDE Surrogate Modeling" (FactFormer),
NeurIPS 2023. Upstream: BaratiLab/FactFormer @ c9801d162cb3cba4e3e29f1efd69bd003662a984 (HEAD)
``libs/factorization_module.py`` (``FABlock2D.forward``), ``libs/attention.py`` (``LowRankKernel``:
:func:`low_rank_kernel_forward`) and ``libs/basics.py`` (``GroupNorm``, the block's output norm
since c9801d1). IFactFormer-m's parallel
variant of the same axis kernels is in ``refattn.operators.ifactformer``; the kernel helpers both
use are in ``refattn.operators.common``.

Mechanism (per batch element and head)
--------------------------------------
Axis kernels from pooled features (the pooling, projections and RoPE happen before this core;
``LowRankKernel`` applies 1-D RoPE to $q, k$ and then)

$$K_x = s_x\,q_x k_x^\top\in\mathbb{R}^{n_x\times n_x},\qquad K_y = s_y\,q_y k_y^\top\in\mathbb{R}^{n_y\times n_y}$$

(no softmax: ``use_softmax = False`` in ``FABlock2D``). FactFormer chains the two axis integrals,

$$u'(i, l, c) = \sum_m K_y(l, m)\sum_j K_x(i, j)\,v(j, m, c)
\quad(\texttt{einsum('bhij,bhjmc->bhimc')}\text{ then }\texttt{einsum('bhlm,bhimc->bhilc')}),$$

a rank-factorised version of the full 4-index kernel $K_x(i,j)K_y(l,m)$ at cost
$O(n_xn_y(n_x+n_y)c)$.

Scaling: at c9801d1 ``FABlock2D`` builds both axis kernels with ``scaling = 1/sqrt(dim_head *
kernel_multiplier) if kernel_multiplier > 4 else scaling_factor`` (the early commit 134297a used 1
for the x axis), hence two keywords ``scaling_x``, ``scaling_y`` (default 1, upstream's default for
``kernel_multiplier=3``, ``scaling_factor=1``).
``LowRankKernel(residual=True)`` would add $\gamma I/n$; ``FABlock2D`` passes ``residual=False``.

Backward
--------
Chained, with $T = K_x\times_x v$ and $G = \partial L/\partial u'$:
$dT(i,m,c) = \sum_l K_y(l,m)G(i,l,c)$, $dK_y(l,m) = \sum_{i,c}G(i,l,c)T(i,m,c)$,
$dv(j,m,c) = \sum_i K_x(i,j)dT(i,m,c)$, $dK_x(i,j) = \sum_{m,c}dT(i,m,c)v(j,m,c)$;
then $dq_x = s_x\,dK_x\,k_x$, $dk_x = s_x\,dK_x^\top q_x$ (same for $y$).

Measured agreement with the real ``FABlock2D``/``LowRankKernel`` @ c9801d1 in float64 (output,
input, position and parameter gradients): ≤ 8.9e-15 / ≤ 9.6e-16 (docs: neural-operators.md).
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_choice, check_int, check_params, check_positive, compute_dtype
from ..nn.activations import gelu, gelu_grad
from ..nn.linear import linear_apply, linear_vjp, merge_heads, split_heads
from ..nn.norms import normalize_backward, normalize_forward
from ..nn.rope import apply_rope, rope_angles, rope_angles_vjp, rope_frequencies
from ..nn.softmax import softmax_lse, softmax_vjp
from ..registry import Mechanism, Sample, register
from ._samples import sample_axial
from .common import axial_kernel_grads, axial_kernels, swap_last, validate_axial_operands

__all__ = ["factformer_attention_forward", "factformer_attention_backward", "factformer_attention",
           "factformer_block_forward", "factformer_block_backward", "factformer_block_param_shapes",
           "init_factformer_block_params", "low_rank_kernel_forward", "low_rank_kernel_backward",
           "low_rank_kernel"]

_GROUPNORM_EPS = 1e-8   # libs/basics.py GroupNorm default, not passed by FABlock2D


def factformer_attention_forward(v, q_x, k_x, q_y, k_y, *, scaling_x: float = 1.0, scaling_y: float = 1.0,
                                 order: str = "xy"):
    r"""FactFormer chained axial kernel integral $u' = K_y\times_y(K_x\times_x v)$.

    Parameters
    ----------
    v : array (B, H, nx, ny, c)
        Values per head (upstream ``rearrange(to_v(u), 'b i l (h c) -> b h i l c')``).
    q_x, k_x : array (B, H, nx, d)
        Axis-x query/key features (``LowRankKernel`` ``to_q``/``to_k`` of the x-pooled features,
        after RoPE); ``q_y, k_y`` likewise (B, H, ny, d).
    scaling_x, scaling_y : float
        Kernel scales (upstream 1 and ``scaling_factor``; see the module docstring).
    order : {"xy", "yx"}
        Contraction order; upstream ``"xy"``. Mathematically identical (the ``order_independent``
        check), kept to let users match upstream rounding bit-for-bit-ish in float32.

    Returns
    -------
    out, cache
        ``out (B, H, nx, ny, c)``.
    """
    v, a, sx, sy, dt = validate_axial_operands(v, q_x, k_x, q_y, k_y, scaling_x, scaling_y)
    check_choice(order, "order", ("xy", "yx"))
    kx, ky = axial_kernels(a, sx, sy)
    if order == "xy":
        t = np.einsum("bhij,bhjmc->bhimc", kx, v)
        out = np.einsum("bhlm,bhimc->bhilc", ky, t)
    else:
        t = np.einsum("bhlm,bhimc->bhilc", ky, v)
        out = np.einsum("bhij,bhjmc->bhimc", kx, t)
    return out, {"v": v, "a": a, "kx": kx, "ky": ky, "t": t, "sx": sx, "sy": sy, "order": order, "dt": dt}


def factformer_attention_backward(dout, cache):
    """Gradients ``{"v", "q_x", "k_x", "q_y", "k_y"}`` (derivation in the module docstring)."""
    v, kx, ky, t = cache["v"], cache["kx"], cache["ky"], cache["t"]
    g = as_dout(dout, v.shape, cache["dt"])
    if cache["order"] == "xy":
        dt_ = np.einsum("bhlm,bhilc->bhimc", ky, g)
        dky = np.einsum("bhilc,bhimc->bhlm", g, t)
        dv = np.einsum("bhij,bhimc->bhjmc", kx, dt_)
        dkx = np.einsum("bhimc,bhjmc->bhij", dt_, v)
    else:
        dt_ = np.einsum("bhij,bhimc->bhjmc", kx, g)
        dkx = np.einsum("bhimc,bhjmc->bhij", g, t)
        dv = np.einsum("bhlm,bhilc->bhimc", ky, dt_)
        dky = np.einsum("bhilc,bhimc->bhlm", dt_, v)
    return {"v": dv, **axial_kernel_grads(cache["a"], dkx, dky, cache["sx"], cache["sy"])}


def factformer_attention(v, q_x, k_x, q_y, k_y, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`factformer_attention_forward`."""
    return factformer_attention_forward(v, q_x, k_x, q_y, k_y, **config)[0]


# --------------------------------------------------------------------------------------------
# The full FABlock2D around the factorised kernel


def factformer_block_param_shapes(dim: int, dim_head: int, latent_dim: int, heads: int, dim_out: int,
                                  kernel_multiplier: int = 3) -> dict:
    """``FABlock2D`` state-dict keys and shapes (``W (in, out)``: PyTorch ``weight.T``)."""
    dkh = dim_head * kernel_multiplier
    shp = {"in_norm.weight": (dim,), "in_norm.bias": (dim,), "to_v.weight": (dim, heads * dim_head),
           "to_in.weight": (dim, dim)}
    for pre in ("to_x.0.", "to_y.1."):
        shp.update({pre + "to_in.weight": (dim, dim), pre + "out_ffn.norm.weight": (dim,),
                    pre + "out_ffn.norm.bias": (dim,), pre + "out_ffn.fn.net.0.weight": (dim, 2 * dim),
                    pre + "out_ffn.fn.net.0.bias": (2 * dim,), pre + "out_ffn.fn.net.3.weight": (dim, latent_dim),
                    pre + "out_ffn.fn.net.3.bias": (latent_dim,)})
    for ax in "xy":
        shp[f"low_rank_kernel_{ax}.to_q.weight"] = (latent_dim, dkh * heads)
        shp[f"low_rank_kernel_{ax}.to_k.weight"] = (latent_dim, dkh * heads)
    shp["to_out.1.weight"] = (heads * dim_head, dim_out)
    shp["to_out.3.weight"] = (dim_out, dim_out)
    return shp


def _ln(x, w, b, eps):
    xhat, st = normalize_forward(x, (x.ndim - 1,), eps)
    return xhat * w + b, (xhat, st)


def _ln_back(dy, w, c, grads, prefix):
    xhat, st = c
    red = tuple(range(dy.ndim - 1))
    grads[prefix + "weight"] = np.sum(dy * xhat, axis=red)
    grads[prefix + "bias"] = np.sum(dy, axis=red)
    return normalize_backward(dy * w, xhat, st)


def _pool_forward(ui, p, pre, eps):
    """PoolingReducer: Linear (no bias) -> mean over the second spatial axis -> LN -> Linear -> GeGLU -> Linear."""
    a = ui @ p[pre + "to_in.weight"]
    m = a.mean(axis=2)
    n, c_n = _ln(m, p[pre + "out_ffn.norm.weight"], p[pre + "out_ffn.norm.bias"], eps)
    z = linear_apply(n, p[pre + "out_ffn.fn.net.0.weight"], p[pre + "out_ffn.fn.net.0.bias"])
    h = z.shape[-1] // 2
    g = gelu(z[..., :h]) * z[..., h:]
    out = linear_apply(g, p[pre + "out_ffn.fn.net.3.weight"], p[pre + "out_ffn.fn.net.3.bias"])
    return out, (ui, a.shape, c_n, n, z, g)


def _pool_backward(dout, p, pre, c, grads):
    ui, ashape, c_n, n, z, g = c
    l3 = linear_vjp(dout, g, p[pre + "out_ffn.fn.net.3.weight"])
    grads[pre + "out_ffn.fn.net.3.weight"], grads[pre + "out_ffn.fn.net.3.bias"] = l3["weight"], l3["bias"]
    h = z.shape[-1] // 2
    dz = np.concatenate([l3["x"] * z[..., h:] * gelu_grad(z[..., :h]), l3["x"] * gelu(z[..., :h])], axis=-1)
    l0 = linear_vjp(dz, n, p[pre + "out_ffn.fn.net.0.weight"])
    grads[pre + "out_ffn.fn.net.0.weight"], grads[pre + "out_ffn.fn.net.0.bias"] = l0["weight"], l0["bias"]
    dm = _ln_back(l0["x"], p[pre + "out_ffn.norm.weight"], c_n, grads, pre + "out_ffn.norm.")
    da = np.broadcast_to(dm[:, :, None, :] / ashape[2], ashape)
    grads[pre + "to_in.weight"] = ui.reshape(-1, ui.shape[-1]).T @ da.reshape(-1, ashape[-1])
    return da @ p[pre + "to_in.weight"].T


def _rope_tables(pos, dkh, min_freq, dt):
    ang = rope_angles(np.asarray(pos, dtype=np.float64) / min_freq, dkh)   # FactFormer scales t by 1/min_freq
    return np.cos(ang).astype(dt), np.sin(ang).astype(dt)


def factformer_block_forward(u, params, *, pos_x, pos_y, heads: int, dim_head: int, scaling_x: float = 1.0,
                             scaling_y: float = 1.0, use_rope: bool = True, rope_min_freq: float = 1 / 64,
                             out_norm: str = "groupnorm", output_layout: str = "flat", eps: float = 1e-5):
    r"""FactFormer's full ``FABlock2D`` (BaratiLab/FactFormer ``libs/factorization_module.py`` @
    c9801d162cb3cba4e3e29f1efd69bd003662a984, the repository's HEAD).

    $u\leftarrow\mathrm{LN}(u)$; $v = uW_v$; $u_{in} = uW_{in}$;
    $u_x = \mathrm{PoolingReducer}_x(u_{in})$ (Linear, mean over $y$, pre-LN GeGLU MLP), $u_y$ likewise
    over $x$; ``LowRankKernel``: $q_x = u_xW_q$, $k_x = u_xW_k$ per head, 1-D RoPE at coordinates
    ``pos_x`` (angles $p/\text{min\_freq}\cdot10000^{-2m/d}$, half-split ``rotate_half`` layout),
    $K_x = s_x q_xk_x^\top$; the chained contraction of :func:`factformer_attention_forward`;
    merge heads; ``to_out`` = norm → Linear → GELU → Linear (no biases).

    ``out_norm``: ``"groupnorm"`` (default; c9801d1, "add missing channel last normalization
    module") is ``libs/basics.py`` ``GroupNorm(heads, heads*dim_head, domain_wise=True,
    affine=False)``: each head's channels over the whole domain, ``(x - mean) / sqrt(var + 1e-8)``
    with the **unbiased** variance ($M-1$, $M = n_xn_y\,$``dim_head``), computed from the biased
    normalisation as $\hat x_u = \sqrt{(M-1)/M}\;\hat x_b(\epsilon(M-1)/M)$.
    ``"instancenorm2d"``: the version before c9801d1 (cd3e263) applied ``nn.InstanceNorm2d`` to the
    **channel-last** tensor, so PyTorch takes ``nx`` as the channel axis and normalises every x-row
    over ``(ny, channels)`` (eps ``eps``). ``"channels"``: the per-channel instance norm over
    ``(nx, ny)`` (IFactFormer-m's ``_o`` block).

    ``output_layout``: ``"flat"`` (default; c9801d1: ``GroupNorm`` returns ``x.view(b, g, -1, c)``
    rearranged to ``(B, nx*ny, C)``, row-major, so the block outputs ``(B, nx*ny, dim_out)``) or
    ``"grid"`` ``(B, nx, ny, dim_out)`` (the version before c9801d1).

    Positions are differentiable: the backward returns ``pos_x``/``pos_y`` gradients through the
    rotary angles, $\partial L/\partial p_n = \sum_{b,h,m}(y_a\,\bar y_b - y_b\,\bar y_a)_{nm}\,
    \theta_m/\text{min\_freq}$ over the rotated $q$ and $k$ (zero without RoPE).

    Parameters
    ----------
    u : array (B, nx, ny, dim)
    params : dict
        Keys/shapes of :func:`factformer_block_param_shapes`.
    pos_x, pos_y : array (nx,) or (nx, 1), (ny,) or (ny, 1)
        Grid coordinates fed to the rotary embedding (upstream ``pos_lst``, ``(n, 1)`` each);
        their gradients come back in the given shape.

    Returns
    -------
    out, cache
        ``out (B, nx*ny, dim_out)`` (``"flat"``) or ``(B, nx, ny, dim_out)`` (``"grid"``).
    """
    u = as_float(u, "u", ndim=4)
    heads = check_int(heads, "heads", minimum=1)
    dim_head = check_int(dim_head, "dim_head", minimum=1)
    check_choice(out_norm, "out_norm", ("groupnorm", "instancenorm2d", "channels"))
    check_choice(output_layout, "output_layout", ("flat", "grid"))
    sx = check_positive(scaling_x, "scaling_x")
    sy = check_positive(scaling_y, "scaling_y")
    eps = check_positive(eps, "eps")
    b, nx, ny, dim = u.shape
    if not isinstance(params, dict) or "to_out.3.weight" not in params or "low_rank_kernel_x.to_q.weight" not in params:
        raise ValueError("params must hold every key of factformer_block_param_shapes(...)")
    latent = np.shape(params["low_rank_kernel_x.to_q.weight"])[0]
    dkh_total = np.shape(params["low_rank_kernel_x.to_q.weight"])[1]
    if dkh_total % (heads * dim_head):
        raise ValueError(f"low_rank_kernel_x.to_q.weight has {dkh_total} outputs, not a multiple of "
                         f"heads*dim_head = {heads * dim_head}")
    spec = factformer_block_param_shapes(dim, dim_head, latent, heads, np.shape(params["to_out.3.weight"])[0],
                                         dkh_total // (heads * dim_head))
    p = check_params(params, spec)
    pos_shapes = {}
    for name, n in (("pos_x", nx), ("pos_y", ny)):
        pos = as_float(pos_x if name == "pos_x" else pos_y, name, min_ndim=1, max_ndim=2)
        if pos.shape not in ((n,), (n, 1)):
            raise ValueError(f"{name} must have shape ({n},) or ({n}, 1); got {pos.shape}")
        pos_shapes[name] = pos.shape
        if name == "pos_x":
            pos_x = pos.reshape(n)
        else:
            pos_y = pos.reshape(n)
    dt = compute_dtype(u, *p.values())
    u = u.astype(dt, copy=False)
    p = cast_all(dt, p)
    dkh = dkh_total // heads
    if use_rope and dkh % 2:
        raise ValueError(f"rotary embedding needs an even per-head kernel width; got {dkh}")

    un, c_in = _ln(u, p["in_norm.weight"], p["in_norm.bias"], eps)
    v = (un @ p["to_v.weight"]).reshape(b, nx, ny, heads, dim_head).transpose(0, 3, 1, 2, 4)
    ui = un @ p["to_in.weight"]
    u_x, c_px = _pool_forward(ui, p, "to_x.0.", eps)
    u_y, c_py = _pool_forward(ui.transpose(0, 2, 1, 3), p, "to_y.1.", eps)
    qk, rot = {}, {}
    for ax, ua, pos in (("x", u_x, pos_x), ("y", u_y, pos_y)):
        for t in ("q", "k"):
            z = split_heads(ua @ p[f"low_rank_kernel_{ax}.to_{t}.weight"], heads, dkh)
            if use_rope:
                cos, sin = _rope_tables(pos, dkh, rope_min_freq, dt)
                rot[ax] = (cos, sin)
                z = apply_rope(z, cos, sin)
            qk[f"{t}_{ax}"] = z
    core, c_core = factformer_attention_forward(v, qk["q_x"], qk["k_x"], qk["q_y"], qk["k_y"],
                                                scaling_x=sx, scaling_y=sy)
    m = core.transpose(0, 2, 3, 1, 4).reshape(b, nx, ny, heads * dim_head)
    if out_norm == "groupnorm":
        mg = m.reshape(b, nx, ny, heads, dim_head)
        msize = nx * ny * dim_head
        unb = np.sqrt((msize - 1) / msize) if msize > 1 else 1.0
        mh, st = normalize_forward(mg, (1, 2, 4), _GROUPNORM_EPS * (msize - 1) / msize)
        mh = (unb * mh).reshape(m.shape)
    else:
        unb = 1.0
        mh, st = normalize_forward(m, (2, 3) if out_norm == "instancenorm2d" else (1, 2), eps)
    z1 = mh @ p["to_out.1.weight"]
    out = gelu(z1) @ p["to_out.3.weight"]
    if output_layout == "flat":
        out = out.reshape(b, nx * ny, out.shape[-1])
    cache = dict(p=p, c_in=c_in, un=un, c_px=c_px, c_py=c_py, u_x=u_x, u_y=u_y, rot=rot, c_core=c_core,
                 mh=mh, st=st, unb=unb, out_norm=out_norm, z1=z1, heads=heads, dim_head=dim_head, dkh=dkh,
                 shape=u.shape, dt=dt, out_shape=out.shape, qk=qk, pos_shapes=pos_shapes,
                 rope_scale=(rope_frequencies(dkh) / rope_min_freq) if use_rope else None)
    return out, cache


def factformer_block_backward(dout, cache):
    """Gradients ``{"u", "pos_x", "pos_y", <every params key>}`` of :func:`factformer_block_forward`."""
    p, dt = cache["p"], cache["dt"]
    g = as_dout(dout, cache["out_shape"], dt)
    b, nx, ny, dim = cache["shape"]
    g = g.reshape(b, nx, ny, g.shape[-1])
    heads, dh = cache["heads"], cache["dim_head"]
    grads = {}
    gz = gelu(cache["z1"])
    grads["to_out.3.weight"] = gz.reshape(-1, gz.shape[-1]).T @ g.reshape(-1, g.shape[-1])
    dz1 = (g @ p["to_out.3.weight"].T) * gelu_grad(cache["z1"])
    mh = cache["mh"]
    grads["to_out.1.weight"] = mh.reshape(-1, mh.shape[-1]).T @ dz1.reshape(-1, dz1.shape[-1])
    dmh = dz1 @ p["to_out.1.weight"].T
    if cache["out_norm"] == "groupnorm":
        unb = cache["unb"]
        dm = normalize_backward(unb * dmh.reshape(b, nx, ny, heads, dh), mh.reshape(b, nx, ny, heads, dh) / unb,
                                cache["st"]).reshape(dmh.shape)
    else:
        dm = normalize_backward(dmh, mh, cache["st"])
    dcore = dm.reshape(b, nx, ny, heads, dh).transpose(0, 3, 1, 2, 4)
    gc = factformer_attention_backward(dcore, cache["c_core"])
    un = cache["un"]
    dui = 0.0
    for ax, ua, c_pool, pre in (("x", cache["u_x"], cache["c_px"], "to_x.0."),
                                ("y", cache["u_y"], cache["c_py"], "to_y.1.")):
        dua = 0.0
        dpos = np.zeros(ua.shape[1], dtype=dt)
        for t in ("q", "k"):
            dz = gc[f"{t}_{ax}"]
            if ax in cache["rot"]:
                dphi = rope_angles_vjp(dz, cache["qk"][f"{t}_{ax}"], cache["dkh"])
                dpos = dpos + np.einsum("bhnm,m->n", dphi, cache["rope_scale"])
                cos, sin = cache["rot"][ax]
                dz = apply_rope(dz, cos, -sin)
            dz = merge_heads(dz)
            key = f"low_rank_kernel_{ax}.to_{t}.weight"
            grads[key] = ua.reshape(-1, ua.shape[-1]).T @ dz.reshape(-1, dz.shape[-1])
            dua = dua + dz @ p[key].T
        grads[f"pos_{ax}"] = dpos.reshape(cache["pos_shapes"][f"pos_{ax}"])
        dpool = _pool_backward(dua, p, pre, c_pool, grads)
        dui = dui + (dpool if ax == "x" else dpool.transpose(0, 2, 1, 3))
    dv = gc["v"].transpose(0, 2, 3, 1, 4).reshape(b, nx, ny, heads * dh)
    grads["to_v.weight"] = un.reshape(-1, dim).T @ dv.reshape(-1, heads * dh)
    grads["to_in.weight"] = un.reshape(-1, dim).T @ dui.reshape(-1, dim)
    dun = dv @ p["to_v.weight"].T + dui @ p["to_in.weight"].T
    du = _ln_back(dun, p["in_norm.weight"], cache["c_in"], grads, "in_norm.")
    return {"u": du, **grads}


def init_factformer_block_params(rng, dim: int, dim_head: int, latent_dim: int, heads: int, dim_out: int,
                                 kernel_multiplier: int = 3) -> dict:
    """Random parameters of the right shapes (LayerNorms at weight 1, bias 0; Linear weights
    ``U(-1/sqrt(in), 1/sqrt(in))``; the q/k projections use upstream's small gain 0.02 in
    ``xavier_uniform_``)."""
    out = {}
    for k, shp in factformer_block_param_shapes(dim, dim_head, latent_dim, heads, dim_out, kernel_multiplier).items():
        if "norm" in k and len(shp) == 1:
            out[k] = np.ones(shp) if k.endswith("weight") else np.zeros(shp)
        elif "low_rank_kernel" in k:
            bound = 0.02 * np.sqrt(6.0 / (shp[0] + shp[1]))
            out[k] = rng.uniform(-bound, bound, shp)
        else:
            bound = 1.0 / np.sqrt(shp[0])
            out[k] = rng.uniform(-bound, bound, shp)
    return out



# --------------------------------------------------------------------------------------------
# LowRankKernel: the axis kernel itself (libs/attention.py @ c9801d1)

_LRK_STD_EPS = 1e-5   # normalize_wrt_domain: (x - mean) / (std + 1e-5), eps outside the root


def low_rank_kernel_forward(u_x, params, *, heads: int, u_y=None, pos_x=None, pos_y=None,
                            positional_embedding: str = "rotary", normalize: bool = False,
                            softmax: bool = False, residual: bool = True, scaling: float = 1.0,
                            rope_min_freq: float = 1 / 64):
    r"""FactFormer's ``LowRankKernel`` (``libs/attention.py`` @ c9801d1): the kernel matrix itself.

    $$q = \mathrm{heads}(u_xW_q),\ k = \mathrm{heads}(u_yW_k)\ (u_y = u_x\text{ by default}),\quad
    [q, k \leftarrow (t - \bar t)/(\mathrm{std}_{n-1}(t) + 10^{-5})\text{ over the points}],\quad
    q, k \leftarrow \mathrm{RoPE}(\cdot, p/\text{min\_freq}),$$
    $$K = s\,qk^\top\ [\to \mathrm{softmax}_j K]\ [+\,\gamma I/n].$$

    Parameters
    ----------
    u_x : array (B, n_x, dim)
    params : dict
        ``to_q.weight``, ``to_k.weight`` ``(dim, heads*d)`` (``weight.T``); ``gamma`` (scalar,
        upstream init $1/\sqrt d$) when ``residual``.
    heads : int
    u_y : array (B, n_y, dim), optional
        The second source (cross attention); keys come from it.
    pos_x, pos_y : arrays (n,) or (n, 1)
        Coordinates of the rotary embedding (``pos_dim=1``; ``pos_y`` defaults to ``pos_x``);
        differentiable. Required when ``positional_embedding="rotary"``.
    positional_embedding : {"rotary", "none"}
        Upstream default ``"rotary"`` (``RotaryEmbedding(d, min_freq=1/64)``, ``rotate_half``
        layout); its ``"rff"``/``"learnable"`` options are not reproduced.
    normalize : bool
        ``normalize_wrt_domain`` of $q$ and $k$ before the embedding: unbiased std, $+10^{-5}$
        outside the square root.
    softmax : bool
        Row softmax of $K$ (before the residual).
    residual : bool
        Adds $\gamma I/n$, $n = n_y$ (upstream default ``True``; ``FABlock2D`` passes ``False``);
        needs $n_x = n_y$.
    scaling : float

    Returns
    -------
    K (B, heads, n_x, n_y), cache
    """
    check_choice(positional_embedding, "positional_embedding", ("rotary", "none"))
    heads = check_int(heads, "heads", minimum=1)
    scaling = float(scaling)
    u_x = as_float(u_x, "u_x", ndim=3)
    cross = u_y is not None
    u_y = as_float(u_y, "u_y", ndim=3) if cross else u_x
    if u_y.shape[0] != u_x.shape[0] or u_y.shape[2] != u_x.shape[2]:
        raise ValueError(f"u_y must have shape (B={u_x.shape[0]}, n_y, dim={u_x.shape[2]}); got {u_y.shape}")
    dim, nx, ny = u_x.shape[2], u_x.shape[1], u_y.shape[1]
    if not isinstance(params, dict) or "to_q.weight" not in params:
        raise ValueError("params must hold 'to_q.weight' and 'to_k.weight' (and 'gamma' when residual)")
    hd = np.shape(params["to_q.weight"])[-1] if np.ndim(params["to_q.weight"]) == 2 else -1
    spec = {"to_q.weight": (dim, hd), "to_k.weight": (dim, hd)}
    if residual:
        spec["gamma"] = ()
        if nx != ny:
            raise ValueError(f"residual=True adds gamma*I/n and needs n_x == n_y; got {nx} and {ny}")
    p = check_params(params, spec)
    if hd % heads:
        raise ValueError(f"to_q.weight has {hd} outputs, not a multiple of heads={heads}")
    d = hd // heads
    rotary = positional_embedding == "rotary"
    pos = {}
    if rotary:
        if d % 2:
            raise ValueError(f"rotary embedding needs an even per-head width; got {d}")
        if pos_x is None:
            raise ValueError("positional_embedding='rotary' needs pos_x (upstream raises too)")
        for name, arr, n in (("pos_x", pos_x, nx), ("pos_y", pos_x if pos_y is None else pos_y, ny)):
            a = as_float(arr, name, min_ndim=1, max_ndim=2)
            if a.shape not in ((n,), (n, 1)):
                raise ValueError(f"{name} must have shape ({n},) or ({n}, 1); got {a.shape}")
            pos[name] = a
    dt = compute_dtype(u_x, u_y, *p.values(), *pos.values())
    u_x, u_y, p = u_x.astype(dt, copy=False), u_y.astype(dt, copy=False), cast_all(dt, p)
    feats, norm_c, rot = {}, {}, {}
    for t, src, pn in (("q", u_x, "pos_x"), ("k", u_y, "pos_y")):
        z = split_heads(src @ p[f"to_{t}.weight"], heads)
        if normalize:
            zc = z - z.mean(axis=-2, keepdims=True)
            sd = np.sqrt(np.sum(zc * zc, axis=-2, keepdims=True) / max(z.shape[-2] - 1, 1))
            z = zc / (sd + _LRK_STD_EPS)
            norm_c[t] = (zc, sd)
        if rotary:
            cos, sin = _rope_tables(pos[pn].reshape(-1), d, rope_min_freq, dt)
            z = apply_rope(z, cos, sin)
            rot[t] = (cos, sin)
        feats[t] = z
    s = scaling * (feats["q"] @ swap_last(feats["k"]))
    kern = softmax_lse(s, axis=-1)[0] if softmax else s
    out = kern + p["gamma"] * np.eye(ny, dtype=dt) / ny if residual else kern
    cache = dict(p=p, u_x=u_x, u_y=u_y, cross=cross, feats=feats, norm_c=norm_c, rot=rot, kern=kern,
                 softmax=softmax, residual=residual, scaling=scaling, heads=heads, dt=dt, out_shape=out.shape,
                 pos_shapes={k: v.shape for k, v in pos.items()}, pos_y_given=pos_y is not None,
                 rope_scale=rope_frequencies(d) / rope_min_freq if rotary else None)
    return out, cache


def low_rank_kernel_backward(dout, cache):
    r"""Gradients ``{"u_x"[, "u_y"], "to_q.weight", "to_k.weight"[, "gamma"][, "pos_x"[, "pos_y"]]}``.

    $\bar\gamma = \operatorname{tr}\bar K/n$ (summed over batch and heads); through the softmax
    $\bar S = \mathrm{softmax\_vjp}$; $\bar q = s\,\bar S k$, $\bar k = s\,\bar S^\top q$; RoPE
    back by the inverse rotation and $\bar p_n = \sum(y_a\bar y_b - y_b\bar y_a)\,\theta_m/
    \text{min\_freq}$; the domain normalisation $y = t_c/(\sigma + e)$, $\sigma^2 = \sum t_c^2/(n-1)$:
    $\bar t = (\bar y - \overline{\bar y})/(\sigma + e) - t_c\sum_n(\bar y\,t_c)/((\sigma+e)^2(n-1)\sigma)$;
    then the two linear maps. Without ``u_y`` the two source gradients add into ``u_x``; without
    ``pos_y`` the ``pos_x`` gradient collects both."""
    p, dt = cache["p"], cache["dt"]
    g = as_dout(dout, cache["out_shape"], dt)
    grads = {}
    n = g.shape[-1]
    if cache["residual"]:
        grads["gamma"] = np.asarray(np.trace(g, axis1=-2, axis2=-1).sum() / n, dtype=dt)
    ds = softmax_vjp(cache["kern"], g, axis=-1) if cache["softmax"] else g
    q, k = cache["feats"]["q"], cache["feats"]["k"]
    dfeat = {"q": cache["scaling"] * (ds @ k), "k": cache["scaling"] * (swap_last(ds) @ q)}
    dpos = {}
    dsrc = {}
    for t, src, pn in (("q", cache["u_x"], "pos_x"), ("k", cache["u_y"], "pos_y")):
        dz = dfeat[t]
        if t in cache["rot"]:
            dphi = rope_angles_vjp(dz, cache["feats"][t], 2 * cache["rot"][t][0].shape[-1])
            dpos[pn] = np.einsum("bhnm,m->n", dphi, cache["rope_scale"])
            cos, sin = cache["rot"][t]
            dz = apply_rope(dz, cos, -sin)
        if t in cache["norm_c"]:
            zc, sd = cache["norm_c"][t]
            den = sd + _LRK_STD_EPS
            m = zc.shape[-2]
            dz = ((dz - dz.mean(axis=-2, keepdims=True)) / den
                  - zc * np.sum(dz * zc, axis=-2, keepdims=True) / (den ** 2 * max(m - 1, 1) * sd))
        dzm = merge_heads(dz)
        grads[f"to_{t}.weight"] = src.reshape(-1, src.shape[-1]).T @ dzm.reshape(-1, dzm.shape[-1])
        dsrc[t] = dzm @ p[f"to_{t}.weight"].T
    if cache["cross"]:
        grads["u_x"], grads["u_y"] = dsrc["q"], dsrc["k"]
    else:
        grads["u_x"] = dsrc["q"] + dsrc["k"]
    if dpos:
        if cache["pos_y_given"]:
            grads["pos_x"] = dpos["pos_x"].reshape(cache["pos_shapes"]["pos_x"])
            grads["pos_y"] = dpos["pos_y"].reshape(cache["pos_shapes"]["pos_y"])
        else:
            grads["pos_x"] = (dpos["pos_x"] + dpos["pos_y"]).reshape(cache["pos_shapes"]["pos_x"])
    return grads


def low_rank_kernel(u_x, params, **config) -> np.ndarray:
    """Convenience wrapper: the kernel of :func:`low_rank_kernel_forward`."""
    return low_rank_kernel_forward(u_x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _explicit_factformer(v, q_x, k_x, q_y, k_y, *, scaling_x=1.0, scaling_y=1.0, order="xy"):
    # The full 4-index kernel K(i,l; j,m) = K_x(i,j) K_y(l,m), contracted in one go.
    kx = scaling_x * np.einsum("bhid,bhjd->bhij", q_x, k_x)
    ky = scaling_y * np.einsum("bhld,bhmd->bhlm", q_y, k_y)
    return np.einsum("bhij,bhlm,bhjmc->bhilc", kx, ky, v)


def _check_order(rng):
    s = sample_axial(rng, "small")
    a = factformer_attention(**s.inputs, **s.config)
    b = factformer_attention(**s.inputs, **{**s.config, "order": "yx"})
    err = float(np.abs(a - b).max())
    assert err < 1e-12 * max(1.0, float(np.abs(a).max())), f"xy and yx orders differ by {err:.2e}"
    from ..testing.gradcheck import gradcheck

    s2 = sample_axial(rng, "tiny", order="yx")
    gradcheck(factformer_attention_forward, factformer_attention_backward, s2)
    return err


def _check_x_permutation(rng):
    s = sample_axial(rng, "small")
    i = s.inputs
    perm = rng.permutation(i["v"].shape[2])
    base = factformer_attention(**i, **s.config)
    moved = factformer_attention(i["v"][:, :, perm], i["q_x"][:, :, perm], i["k_x"][:, :, perm],
                                 i["q_y"], i["k_y"], **s.config)
    err = float(np.abs(moved - base[:, :, perm]).max())
    assert err < 1e-12, f"permuting the x axis does not permute the output (err {err:.2e})"
    return err


def _check_block(rng):
    # The full FABlock2D by finite differences (every out_norm convention, both layouts) at a
    # small size, the grid positions included as differentiable inputs.
    from ..testing.gradcheck import gradcheck

    worst = 0.0
    for out_norm, layout in (("groupnorm", "flat"), ("instancenorm2d", "grid"), ("channels", "grid")):
        p = init_factformer_block_params(rng, 4, 2, 3, 2, 3, kernel_multiplier=1)
        p = {k: v + 0.3 * rng.standard_normal(v.shape) for k, v in p.items()}
        s = Sample(inputs={"u": rng.standard_normal((2, 3, 4, 4)), "pos_x": np.linspace(0, 1, 3) + 0.1 * rng.random(3),
                           "pos_y": np.linspace(0, 1, 4)[:, None]}, params=p,
                   config={"heads": 2, "dim_head": 2, "out_norm": out_norm, "output_layout": layout,
                           "scaling_y": 0.5, "rope_min_freq": 0.5})
        worst = max(worst, gradcheck(factformer_block_forward, factformer_block_backward, s).max_rel)
    return worst


def _check_low_rank_kernel(rng):
    # LowRankKernel by finite differences: self kernel with RoPE, domain normalisation, softmax
    # and the gamma*I/n residual; cross kernel (separate u_y, pos_y) without residual.
    from ..testing.gradcheck import gradcheck

    worst = 0.0
    for cross, softmax, normalize in ((False, True, True), (True, False, True), (False, False, False)):
        p = {"to_q.weight": rng.standard_normal((3, 4)) * 0.5, "to_k.weight": rng.standard_normal((3, 4)) * 0.5}
        inputs = {"u_x": rng.standard_normal((2, 4, 3)), "pos_x": np.sort(rng.random(4))}
        cfg = {"heads": 2, "softmax": softmax, "normalize": normalize, "residual": not cross, "scaling": 0.7,
               "rope_min_freq": 0.5}
        if cross:
            inputs.update(u_y=rng.standard_normal((2, 3, 3)), pos_y=np.sort(rng.random(3))[:, None])
        else:
            p["gamma"] = np.asarray(0.4)
        s = Sample(inputs=inputs, params=p, config=cfg)
        worst = max(worst, gradcheck(low_rank_kernel_forward, low_rank_kernel_backward, s).max_rel)
    return worst


register(
    Mechanism(
        slug="factformer_factorized_attention", family="3-operator", tier="T1",
        title="FactFormer axial factorised kernel integral K_y x_y (K_x x_x v), softmax-free",
        paper="Li, Shu, Barati Farimani, Scalable Transformer for PDE Surrogate Modeling, NeurIPS 2023",
        forward=factformer_attention_forward, backward=factformer_attention_backward, sample=sample_axial,
        reference=_explicit_factformer, docs="neural-operators.md#factformer-axial-factorised-attention",
        checks={"order_independent": _check_order, "x_permutation_equivariance": _check_x_permutation,
                "fablock2d_gradcheck": _check_block, "low_rank_kernel_gradcheck": _check_low_rank_kernel},
    ),
)
