r"""MANO multipole attention: windowed attention on a hierarchy of coarsened grids, summed back up.

Paper: Colagrande, Caillon, Feillet, Allauzen, "Linear Attention with Global Context: A Multipole
Attention Mechanism for Vision and Physics" (Multipole Attention Neural Operator, MANO), arXiv
2507.02748. Upstream: AlexColagrande/MANO (the paper's code link; the repository could not be
retrieved here). The classes ``MultipoleAttention``, ``LocalAttention2D`` and ``AttentionBlock``
were read in third-party copies of that code in the code index (identical in three copies,
one pinning ``levels = 2``); see ``docs/operators/operator-attention-t3.md#mano-multipole-attention``.

Which part of the model
-----------------------
MANO is a ViT/Swin-like transformer whose token mixer is this multipole attention (blocks of
``x + MultipoleAttention(x)``, ``x + FeedForward(x)``, a final LayerNorm); the feed-forward, patch
embedding and heads are ordinary layers left to this text.

Forward
-------
Grid tokens $x^{(0)} = x\in\mathbb R^{H\times W\times C}$, sampling rate $s$, $L$ levels:

$$x^{(\ell)} = \mathrm{Down}(x^{(\ell-1)}),\qquad o^{(\ell)} = \mathcal A(x^{(\ell)}),\qquad \ell = 0..L-1,$$

with one local-attention operator $\mathcal A$ shared by all levels: unfold $k\times k$ windows
with stride $t$ (``nn.Unfold``), $\mathrm{LN}_1$ then the attention block
($\mathrm{LN}_2$, $[Q|K|V] = zW_{qkv}$ without bias, heads of width $d_h$, $\mathrm{softmax}(QK^\top
d_h^{-1/2})V$, output projection $W_o, b_o$ unless one head of width $C$) inside every window,
fold back and divide by the number of windows covering each pixel. Then, from the coarsest level,

$$r^{(L-1)} = o^{(L-1)},\qquad r^{(\ell)} = o^{(\ell)} + \frac{1}{L-1-\ell}\,\mathrm{Up}\big(r^{(\ell+1)}\big),
\qquad \mathrm{out} = r^{(0)},$$

(upstream's ``res = out_down + 1/(l+1) * up(res)`` with ``l`` counting the combinations). ``Down``
is a stride-$s$ $s\times s$ convolution without bias (``"conv"``) or average pooling
(``"avg_pool"``); ``Up`` the stride-$s$ transposed convolution (``"conv"``) or nearest upsampling
(``"avg_pool"``, upstream's name for it). A pixel's output sees its own window at full
resolution and ever coarser windows around it: the receptive field is global at linear cost.

Backward
--------
Reverse the combination ($dr^{(\ell+1)} \mathrel{+}= \frac{1}{L-1-\ell}\mathrm{Up}^{*}dr^{(\ell)}$,
$do^{(\ell)} = dr^{(\ell)}$), then from the coarsest level down: $dx^{(\ell)} = \mathcal A^{*}do^{(\ell)} +
\mathrm{Down}^{*}dx^{(\ell+1)}$. $\mathcal A^{*}$: divide by the coverage, unfold (the adjoint of
fold), the attention VJP per window (``attention_core_backward``), the two LayerNorm VJPs, fold (the
adjoint of unfold). ``Down``/``Up`` adjoints: ``conv_vjp``/``conv_transpose_vjp`` (each the
other's transpose) or the pooling/upsampling adjoints. The shared parameters accumulate over the
levels.

Conventions
-----------
* ``levels``: upstream ``int(math.log(image_size, sampling_rate))`` (grid sizes $H, H/s, \dots$
  down to $\ge s^{0}$; it relies on float ``log``); default here the same count computed in integers
  from ``min(H, W)``. Every level's grid must be covered by the windows (upstream otherwise divides
  0 by 0).
* ``kernel_size``/``stride`` of the windows: upstream ``local_attention_kernel_size`` and
  ``local_attention_stride`` (equal in the released configurations: non-overlapping windows).
* Dropout (attention and output) is the training-time identity here.
* Token-major ``(B, H, W, C)`` as upstream; ``down.1.weight``/``up.1.weight`` keep PyTorch's conv
  layouts ``(C, C, s, s)``; linear weights ``(in, out)``.

Agreement with the upstream code
--------------------------------
The copied ``MultipoleAttention`` classes in PyTorch float64 on CPU (16x16 grid, $C = 8$), maximum
error relative to the largest entry: conv samplers, 4 heads of 4, 4 levels: output 4.5e-16,
gradients <= 1.3e-15; pool samplers, 2 heads of 8: 3.9e-16 / 1.1e-15; overlapping 4x4 windows with
stride 2, one head of width $C$, 3 levels: 3.8e-16 / 2.3e-15.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_choice, check_int, check_params, compute_dtype
from ..attention.softmax import attention_core_backward, attention_core_forward
from ..nn.conv import conv_apply, conv_transpose_apply, conv_transpose_vjp, conv_vjp
from ..nn.linear import linear_prefixed, linear_prefixed_vjp, merge_heads, split_heads
from ..nn.norms import normalize_backward, normalize_forward
from ..nn.pooling import avg_pool_apply, avg_pool_vjp
from ..nn.windows import fold_apply, unfold_apply
from ..registry import Mechanism, Sample, register

__all__ = ["mano_attention_forward", "mano_attention_backward", "mano_attention", "mano_levels",
           "init_mano_params"]

_A = "Attention"
_LN_EPS = 1e-5


def mano_levels(size: int, sampling_rate: int) -> int:
    """Upstream's level count ``int(log_s(size))``, in integers: the largest L with ``s**L <= size``."""
    n, s = 0, 1
    while s * sampling_rate <= size:
        s *= sampling_rate
        n += 1
    return n


def _validate(x, params, num_heads, kernel_size, stride, sampling_rate, levels, downsampling, upsampling):
    x = as_float(x, "x", ndim=4)
    b, hh, ww, c = x.shape
    heads = check_int(num_heads, "num_heads", minimum=1)
    k = check_int(kernel_size, "kernel_size", minimum=1)
    t = check_int(stride, "stride", minimum=1)
    s = check_int(sampling_rate, "sampling_rate", minimum=2)
    check_choice(downsampling, "downsampling", ("conv", "avg_pool"))
    check_choice(upsampling, "upsampling", ("conv", "avg_pool"))
    lv = mano_levels(min(hh, ww), s) if levels is None else check_int(levels, "levels", minimum=1)
    sizes = [(hh, ww)]
    for _ in range(lv - 1):
        if sizes[-1][0] % s or sizes[-1][1] % s:
            raise ValueError(f"the grid {sizes[-1]} at level {len(sizes) - 1} is not divisible by sampling_rate={s} "
                             f"(x of shape {x.shape}, levels={lv})")
        sizes.append((sizes[-1][0] // s, sizes[-1][1] // s))
    for lvl, (h, w) in enumerate(sizes):
        if h < k or w < k or (h - k) % t or (w - k) % t:
            raise ValueError(f"windows of kernel_size={k}, stride={t} do not tile the {h}x{w} grid of level {lvl} "
                             f"(x of shape {x.shape}, levels={lv})")
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of arrays; got {type(params).__name__}")
    w = params.get(f"{_A}.Attention.to_qkv.weight")
    if w is None:
        raise ValueError(f"params is missing '{_A}.Attention.to_qkv.weight' (expected shape (C={c}, 3 * heads * dim_head))")
    w = as_float(w, f"{_A}.Attention.to_qkv.weight", ndim=2)
    if w.shape[1] % (3 * heads):
        raise ValueError(f"{_A}.Attention.to_qkv.weight must have 3 * num_heads * dim_head columns; got {w.shape}")
    dh = w.shape[1] // (3 * heads)
    spec = {f"{_A}.norm.weight": (c,), f"{_A}.norm.bias": (c,), f"{_A}.Attention.norm.weight": (c,),
            f"{_A}.Attention.norm.bias": (c,), f"{_A}.Attention.to_qkv.weight": (c, 3 * heads * dh)}
    project_out = not (heads == 1 and dh == c)
    if project_out:
        spec.update({f"{_A}.Attention.to_out.0.weight": (heads * dh, c), f"{_A}.Attention.to_out.0.bias": (c,)})
    if downsampling == "conv":                       # upstream builds the samplers for any level count
        spec["down.1.weight"] = (c, c, s, s)
    if upsampling == "conv":
        spec["up.1.weight"] = (c, c, s, s)
    p = check_params(params, spec)
    dt = compute_dtype(x, *p.values())
    return x.astype(dt, copy=False), cast_all(dt, p), heads, dh, k, t, s, lv, project_out


def _ln(p, prefix, z):
    zh, st = normalize_forward(z, (z.ndim - 1,), _LN_EPS)
    return zh * p[f"{prefix}.weight"] + p[f"{prefix}.bias"], (zh, st)


def _ln_vjp(grads, p, prefix, dy, c):
    zh, st = c
    grads[f"{prefix}.weight"] = grads.get(f"{prefix}.weight", 0.0) + np.sum(dy * zh, axis=tuple(range(dy.ndim - 1)))
    grads[f"{prefix}.bias"] = grads.get(f"{prefix}.bias", 0.0) + np.sum(dy, axis=tuple(range(dy.ndim - 1)))
    return normalize_backward(dy * p[f"{prefix}.weight"], zh, st)


def _local_attention(xl, p, heads, k, t, project_out):
    # LocalAttention2D on (B, H, W, C): unfold -> LN -> AttentionBlock -> fold / coverage.
    b, h, w, c = xl.shape
    cols = unfold_apply(np.moveaxis(xl, -1, 1), (k, k), stride=(t, t))        # (B, C*k*k, nW)
    nwin = cols.shape[-1]
    patches = np.moveaxis(cols.reshape(b, c, k * k, nwin), (1, 3), (3, 1))   # (B, nW, k*k, C)
    z1, c1 = _ln(p, f"{_A}.norm", patches)
    z2, c2 = _ln(p, f"{_A}.Attention.norm", z1)
    qkv = linear_prefixed(p, f"{_A}.Attention.to_qkv", z2)
    inner = qkv.shape[-1] // 3
    q, kk, v = (split_heads(qkv[..., j * inner:(j + 1) * inner], heads) for j in range(3))
    o, ca = attention_core_forward(q, kk, v)
    om = merge_heads(o)
    y = linear_prefixed(p, f"{_A}.Attention.to_out.0", om) if project_out else om
    ycols = np.moveaxis(y, (1, 3), (3, 1)).reshape(b, c * k * k, nwin)
    cover = fold_apply(unfold_apply(np.ones((1, 1, h, w), dtype=xl.dtype), (k, k), stride=(t, t)), (h, w), (k, k),
                       stride=(t, t))
    out = np.moveaxis(fold_apply(ycols, (h, w), (k, k), stride=(t, t)) / cover, 1, -1)
    return out, dict(shape=xl.shape, c1=c1, c2=c2, z1=z1, z2=z2, ca=ca, om=om, cover=cover, nwin=nwin)


def _local_attention_vjp(g, c, p, grads, heads, k, t, project_out):
    b, h, w, ch = c["shape"]
    nwin = c["nwin"]
    gc = np.moveaxis(g, -1, 1) / c["cover"]
    dy = unfold_apply(gc, (k, k), stride=(t, t))                              # fold's adjoint
    dy = np.moveaxis(dy.reshape(b, ch, k * k, nwin), (1, 3), (3, 1))
    dom = linear_prefixed_vjp(grads, p, f"{_A}.Attention.to_out.0", dy, c["om"]) if project_out else dy
    ga = attention_core_backward(split_heads(dom, heads), c["ca"])
    dqkv = np.concatenate([merge_heads(ga[n]) for n in ("q", "k", "v")], axis=-1)
    dz2 = linear_prefixed_vjp(grads, p, f"{_A}.Attention.to_qkv", dqkv, c["z2"])
    dz1 = _ln_vjp(grads, p, f"{_A}.Attention.norm", dz2, c["c2"])
    dpatch = _ln_vjp(grads, p, f"{_A}.norm", dz1, c["c1"])
    dcols = np.moveaxis(dpatch, (1, 3), (3, 1)).reshape(b, ch * k * k, nwin)
    return np.moveaxis(fold_apply(dcols, (h, w), (k, k), stride=(t, t)), 1, -1)   # unfold's adjoint


def mano_attention_forward(x, params, *, num_heads: int, kernel_size: int = 2, stride: int = 2,
                           sampling_rate: int = 2, levels=None, downsampling: str = "conv", upsampling: str = "conv"):
    r"""MANO multipole attention on a grid (module docstring).

    Parameters
    ----------
    x : array (B, H, W, C)
        Grid tokens (channels last, as upstream).
    params : dict
        ``Attention.norm.{weight, bias}`` (C,), ``Attention.Attention.norm.{weight, bias}`` (C,),
        ``Attention.Attention.to_qkv.weight`` (C, 3 * heads * dim_head) (no bias),
        ``Attention.Attention.to_out.0.{weight (heads*dim_head, C), bias}`` (absent for one head of
        width C), ``down.1.weight`` (C, C, s, s) and ``up.1.weight`` (C, C, s, s) for the ``"conv"``
        samplers (PyTorch conv layouts). The level-shared local attention.
    num_heads : int
    kernel_size, stride : int
        Window size and stride of the local attention (upstream 2 and 2 in the released configs).
    sampling_rate : int
        Coarsening factor $s$ between levels.
    levels : int or None
        Number of levels $L$ (default ``mano_levels(min(H, W), s)``, upstream's count).
    downsampling, upsampling : {"conv", "avg_pool"}

    Returns
    -------
    out, cache
        ``out (B, H, W, C)``.
    """
    x, p, heads, dh, k, t, s, lv, proj = _validate(x, params, num_heads, kernel_size, stride, sampling_rate, levels,
                                                   downsampling, upsampling)
    xs, outs, acs = [x], [], []
    for lvl in range(lv):
        if lvl > 0:
            xc = np.moveaxis(xs[-1], -1, 1)
            down = conv_apply(xc, p["down.1.weight"], stride=s) if downsampling == "conv" else avg_pool_apply(xc, (s, s))
            xs.append(np.moveaxis(down, 1, -1))
        o, ac = _local_attention(xs[-1], p, heads, k, t, proj)
        outs.append(o)
        acs.append(ac)
    res, rs = outs[-1], []
    for j, lvl in enumerate(range(lv - 2, -1, -1)):
        rs.append(res)
        rc = np.moveaxis(res, -1, 1)
        up = conv_transpose_apply(rc, p["up.1.weight"], stride=s) if upsampling == "conv" else \
            np.repeat(np.repeat(rc, s, axis=2), s, axis=3)
        res = outs[lvl] + np.moveaxis(up, 1, -1) / (j + 1)
    cache = dict(p=p, xs=xs, acs=acs, rs=rs, heads=heads, k=k, t=t, s=s, lv=lv, proj=proj, down=downsampling,
                 up=upsampling, out_shape=res.shape)
    return res, cache


def mano_attention_backward(dout, cache):
    """Gradients of :func:`mano_attention_forward`: ``x`` and every params key (shared over levels)."""
    p, xs, lv, s = cache["p"], cache["xs"], cache["lv"], cache["s"]
    g = as_dout(dout, cache["out_shape"], xs[0].dtype)
    grads = {}
    douts = [None] * lv
    dres = g
    # undo the combination from the finest level up: r_l = o_l + Up(r_{l+1}) / (j + 1)
    order = list(enumerate(range(lv - 2, -1, -1)))          # (j, level) in forward order
    for j, lvl in reversed(order):
        douts[lvl] = dres
        du = np.moveaxis(dres / (j + 1), -1, 1)
        prev = np.moveaxis(cache["rs"][j], -1, 1)
        if cache["up"] == "conv":
            gu = conv_transpose_vjp(du, prev, p["up.1.weight"], stride=s, has_bias=False)
            grads["up.1.weight"] = grads.get("up.1.weight", 0.0) + gu["weight"]
            dres = np.moveaxis(gu["x"], 1, -1)
        else:
            b, c, hh, ww = du.shape
            dres = np.moveaxis(du.reshape(b, c, hh // s, s, ww // s, s).sum(axis=(3, 5)), 1, -1)
    douts[lv - 1] = dres
    dx_next = None
    for lvl in range(lv - 1, -1, -1):
        dx = _local_attention_vjp(douts[lvl], cache["acs"][lvl], p, grads, cache["heads"], cache["k"], cache["t"],
                                  cache["proj"])
        if dx_next is not None:
            dn = np.moveaxis(dx_next, -1, 1)
            xin = np.moveaxis(xs[lvl], -1, 1)
            if cache["down"] == "conv":
                gd = conv_vjp(dn, xin, p["down.1.weight"], stride=s, has_bias=False)
                grads["down.1.weight"] = grads.get("down.1.weight", 0.0) + gd["weight"]
                dx = dx + np.moveaxis(gd["x"], 1, -1)
            else:
                dx = dx + np.moveaxis(avg_pool_vjp(dn, xin.shape, (s, s)), 1, -1)
        dx_next = dx
    grads["x"] = dx_next
    for key in ("down.1.weight", "up.1.weight"):         # unused by a single level
        if key in p and key not in grads:
            grads[key] = np.zeros_like(p[key])
    return grads


def mano_attention(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`mano_attention_forward`."""
    return mano_attention_forward(x, params, **config)[0]


def init_mano_params(rng, c: int, num_heads: int, dim_head: int, *, sampling_rate: int = 2, downsampling="conv",
                     upsampling="conv", dtype=np.float64) -> dict:
    """Parameters as upstream initialises them (PyTorch defaults: LayerNorms 1/0, ``nn.Linear`` and
    ``nn.Conv2d``/``nn.ConvTranspose2d`` uniform with bound ``1/sqrt(fan_in)``)."""
    inner = num_heads * dim_head
    p = {f"{_A}.norm.weight": np.ones(c), f"{_A}.norm.bias": np.zeros(c),
         f"{_A}.Attention.norm.weight": np.ones(c), f"{_A}.Attention.norm.bias": np.zeros(c),
         f"{_A}.Attention.to_qkv.weight": rng.uniform(-1, 1, (c, 3 * inner)) / np.sqrt(c)}
    if not (num_heads == 1 and dim_head == c):
        p[f"{_A}.Attention.to_out.0.weight"] = rng.uniform(-1, 1, (inner, c)) / np.sqrt(inner)
        p[f"{_A}.Attention.to_out.0.bias"] = rng.uniform(-1, 1, c) / np.sqrt(inner)
    s = sampling_rate
    if downsampling == "conv":
        p["down.1.weight"] = rng.uniform(-1, 1, (c, c, s, s)) / np.sqrt(c * s * s)
    if upsampling == "conv":
        p["up.1.weight"] = rng.uniform(-1, 1, (c, c, s, s)) / np.sqrt(c * s * s)
    return {k: np.asarray(v, dtype=dtype) for k, v in p.items()}


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size, *, downsampling="conv", upsampling="conv", kernel_size=2, stride=2, levels=None):
    if size == "tiny":
        hw, c, heads, dh = (4, 4), 3, 1, 2      # C = 3: a LayerNorm over 2 channels is ill-conditioned
    else:
        hw, c, heads, dh = (8, 8), 4, 2, 2
    p = init_mano_params(rng, c, heads, dh, downsampling=downsampling, upsampling=upsampling)
    for k in p:
        if "norm" in k:
            p[k] = p[k] + 0.3 * rng.standard_normal(p[k].shape)
    return Sample(inputs={"x": rng.standard_normal((2,) + hw + (c,))}, params=p,
                  config={"num_heads": heads, "kernel_size": kernel_size, "stride": stride, "downsampling": downsampling,
                          "upsampling": upsampling, "levels": levels})


def _reference(x, params, *, num_heads, kernel_size=2, stride=2, sampling_rate=2, levels=None, downsampling="conv",
               upsampling="conv"):
    # Explicit loops: every window attends within itself; coverage counted pixel by pixel; the
    # samplers written as sums over the s x s cells.
    s, k, t = sampling_rate, kernel_size, stride
    b, hh, ww, c = x.shape
    lv = mano_levels(min(hh, ww), s) if levels is None else levels

    def ln(prefix, z):
        mu = z.mean(-1, keepdims=True)
        return (z - mu) / np.sqrt(((z - mu) ** 2).mean(-1, keepdims=True) + _LN_EPS) * params[f"{prefix}.weight"] \
            + params[f"{prefix}.bias"]

    def local(z):
        out = np.zeros_like(z)
        cnt = np.zeros(z.shape[1:3])
        wq = params[f"{_A}.Attention.to_qkv.weight"]
        inner = wq.shape[1] // 3
        dh = inner // num_heads
        for i0 in range(0, z.shape[1] - k + 1, t):
            for j0 in range(0, z.shape[2] - k + 1, t):
                win = z[:, i0:i0 + k, j0:j0 + k].reshape(b, k * k, c)
                qkv = ln(f"{_A}.Attention.norm", ln(f"{_A}.norm", win)) @ wq
                heads = []
                for hd in range(num_heads):
                    sl = slice(hd * dh, (hd + 1) * dh)
                    a = qkv[..., :inner][..., sl] @ np.swapaxes(qkv[..., inner:2 * inner][..., sl], -1, -2) / np.sqrt(dh)
                    a = np.exp(a - a.max(-1, keepdims=True))
                    heads.append(a / a.sum(-1, keepdims=True) @ qkv[..., 2 * inner:][..., sl])
                y = np.concatenate(heads, axis=-1)
                if f"{_A}.Attention.to_out.0.weight" in params:
                    y = y @ params[f"{_A}.Attention.to_out.0.weight"] + params[f"{_A}.Attention.to_out.0.bias"]
                out[:, i0:i0 + k, j0:j0 + k] += y.reshape(b, k, k, c)
                cnt[i0:i0 + k, j0:j0 + k] += 1
        return out / cnt[None, :, :, None]

    def down(z):
        zz = z.reshape(b, z.shape[1] // s, s, z.shape[2] // s, s, c)
        if downsampling == "avg_pool":
            return zz.mean(axis=(2, 4))
        return np.einsum("bipjqc,ocpq->bijo", zz, params["down.1.weight"])

    def up(z):
        if upsampling == "avg_pool":
            return np.repeat(np.repeat(z, s, axis=1), s, axis=2)
        u = np.einsum("bijc,copq->bipjqo", z, params["up.1.weight"])
        return u.reshape(b, z.shape[1] * s, z.shape[2] * s, c)

    xs, outs = [x], []
    for lvl in range(lv):
        if lvl:
            xs.append(down(xs[-1]))
        outs.append(local(xs[-1]))
    res = outs[-1]
    for j, lvl in enumerate(range(lv - 2, -1, -1)):
        res = outs[lvl] + up(res) / (j + 1)
    return res


def _check_samplers_and_overlap(rng):
    # Average-pool/nearest samplers and overlapping windows (stride < kernel_size) against the
    # explicit loops (FD checks: tests/test_operators_o3.py).
    errs = []
    for kw in ({"downsampling": "avg_pool", "upsampling": "avg_pool"}, {"kernel_size": 4, "stride": 2, "levels": 2}):
        s = _sample(rng, "small", **kw)
        err = float(np.abs(mano_attention(**s.inputs, params=s.params, **s.config)
                           - _reference(**s.inputs, params=s.params, **s.config)).max())
        assert err < 1e-12, f"{kw}: differs from the explicit loops by {err:.2e}"
        errs.append(err)
    return max(errs)


def _check_global_receptive_field(rng):
    # With all levels, the output at one corner depends on the opposite corner (the coarsest
    # window covers the grid); with one level (plain windowed attention) it does not.
    s = _sample(rng, "small")
    x = s.inputs["x"]
    x2 = x.copy()
    x2[:, -1, -1] += 1.0
    far = float(np.abs(mano_attention(x2, s.params, **s.config) - mano_attention(x, s.params, **s.config))[:, 0, 0].max())
    one = dict(s.config, levels=1)
    local = float(np.abs(mano_attention(x2, s.params, **one) - mano_attention(x, s.params, **one))[:, 0, 0].max())
    assert far > 1e-8 and local == 0.0, f"receptive field: multipole {far:.2e}, one level {local:.2e}"
    return local


register(
    Mechanism(
        slug="mano_multipole_attention", family="3-operator", tier="T3",
        title="MANO: multipole attention (shared windowed attention on coarsened grids, summed back up)",
        paper="Colagrande, Caillon, Feillet, Allauzen, Linear Attention with Global Context: A Multipole Attention "
              "Mechanism for Vision and Physics, arXiv 2507.02748",
        forward=mano_attention_forward, backward=mano_attention_backward, sample=_sample, reference=_reference,
        docs="operators/operator-attention-t3.md#mano-multipole-attention",
        checks={"samplers_and_overlapping_windows": _check_samplers_and_overlap,
                "global_receptive_field": _check_global_receptive_field},
    ),
)
