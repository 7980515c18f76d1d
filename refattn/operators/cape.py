r"""CAPE: channel attention guided by PDE-parameter embeddings (the parameter-embedding block of a neural PDE solver).

Paper: Takamoto, Alesiani, Niepert, "Learning Neural PDE Solvers with Parameter-Guided Channel
Attention", ICML 2023, arXiv 2304.14118. Upstream: nec-research/CAPE-ML4Sci
``CAPE/models/PrmEmbd/PrmEmbd.py`` (``PrmEmb_Block_1d``, ``PrmEmb_Block_2d``, ``SpectralConv1d``,
``SpectralConv2d_fast``, ``_wrap_model``) @ 8ae7d646d0e00a6f1f1750def1920c5eebcd5ce2.

Which part of the model
-----------------------
CAPE wraps a base solver (FNO, U-Net, MPNN): the **CAPE block** (this module) turns the current
field $u$ and the PDE parameters $\nu$ into an auxiliary field that is concatenated to $u$ as extra
input channels of the solver; a 1×1 convolution (``mix_emb``) mixes the solver output back to the
field's channels, and training uses a teacher-forcing → autoregressive curriculum. The wrapper's
convolution and the curriculum are left to this text.

Forward
-------
Field $x\in\mathbb R^{C\times n^{d}}$ (channel-first, $d\in\{1, 2\}$), parameters $\nu\in\mathbb R^P$,
widening factor $W$. Three parameter embeddings (the channel-attention weights),

$$\pi = \nu\ (d = 1),\qquad \pi = \sigma(\log\nu) = \tfrac{\nu}{1+\nu}\ (d = 2),\qquad
e_k = \mathrm{GELU}(\pi A_k + a_k)B_k + b_k\in\mathbb R^{W},\ k = 0, 1, 2,$$

gate three convolution branches of $y = \mathrm{GELU}(\mathrm{conv}_{5}(x))\in\mathbb R^{W/2\times n^d}$
channel-wise:

$$s = \mathrm{Up}_4\big(e_0\odot\mathcal K(\mathrm{Pool}_4\,y)\big) + e_1\odot\mathrm{conv}_{1\times1}(y)
+ e_2\odot\mathrm{dwconv}_{5}(y) + \mathrm{conv}_{1\times1}'(y),$$

($\mathcal K$ the FNO spectral convolution $W/2\to W$ on the 4× average-pooled grid, $\mathrm{Up}_4$
nearest upsampling, ``dwconv`` grouped with ``groups = W/2``), then
$z = \mathrm{conv}_{5}(\mathrm{GELU}(s))\in\mathbb R^{C n_p\times n^d}$ and, with $\tilde x$ the input
tiled $n_p$ times along the channels and $\mathrm{LN}$ a LayerNorm over the **spatial** axes (affine
$(n^d)$ weights, as ``nn.LayerNorm(normed_dim)``):

$$\mathrm{out} = \tilde x + \mathrm{LN}(z)\ (d = 1),\qquad \mathrm{out} = \tilde x\odot(1 + \mathrm{LN}(z))\ (d = 2).$$

Backward
--------
Reverse mode through each primitive, all reused: LayerNorm (``normalize_backward``), convolutions
(``conv_vjp``: its $x$-adjoint is the transposed convolution), average pooling (``avg_pool_vjp``),
nearest upsampling (adjoint: sum over each 4-block), the FNO spectral convolution
(the FNO's complex-linear VJP per kept mode with the shared real-FFT adjoints), GELU and the linear layers. The gates give
$de_k = \sum_{\text{space}}\bar s\odot\text{branch}_k$ and $d\,\text{branch}_k = e_k\odot\bar s$;
$d\nu = d\pi\,\sigma'(\log\nu)/\nu$ in 2-D. $dx$ sums the tiled copies (and in 2-D carries the
factor $1 + \mathrm{LN}(z)$) plus the path through the first convolution.

Conventions
-----------
* ``param_transform``: upstream uses the raw parameters in 1-D and $\sigma(\log\nu)$ in 2-D
  (default ``None`` = by dimension; needs $\nu > 0$).
* ``combine``: ``"add"`` (1-D upstream) or ``"scale"`` (2-D upstream), default by dimension.
* ``CNN_2`` is a 5-tap convolution without bias, or a 1×1 with bias (``if_11cnv``; chosen by the
  presence of ``CNN_2.bias``). Kernel size, $W$ and the modes are read from the parameter shapes
  (upstream defaults $k = 5$, $W = 16$, modes 16 in 1-D and 9 in 2-D).
* In 2-D the two kept corners of the spectral convolution (``[:m1]`` with ``weights1``, ``[-m1:]``
  with ``weights2``) may overlap: upstream's default (modes 9 on the 16-point pooled grid of a
  64×64 field) does, and the second assignment wins. refattn's FNO layer rejects overlapping
  corners, so the block carries this spectral product itself (same real-FFT adjoints,
  ``refattn.operators.common``); overwritten modes of ``weights1`` get zero gradient.
* The grid size must be a multiple of 4 (pool, then upsample by 4, as upstream).
* Convolution weights keep PyTorch's ``(C_out, C_in/groups, k...)`` layout; the spectral weights
  are ``CNN_SC.weights{1,2}_real/imag`` (upstream's complex ``weights1/2``); linear ``(in, out)``.

Agreement with upstream
-----------------------
``PrmEmb_Block_1d``/``_2d`` in PyTorch float64 on CPU (the spectral layers' ``torch.cfloat`` patched
to complex128; 1-D grid 128 with 16 modes, 2-D 32x32 with 5 modes so the corners overlap), maximum
error relative to the largest entry: output <= 8.9e-16, gradients <= 7.2e-15 in all four
configurations (the 1x1 output convolution's bias gradient is structurally zero, ~1e-17 in both).
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_choice, check_params, compute_dtype
from ..nn.activations import gelu, gelu_grad, sigmoid
from ..nn.conv import conv_apply, conv_vjp
from ..nn.linear import init_linear_prefixed, linear_prefixed, linear_prefixed_spec, linear_prefixed_vjp
from ..nn.norms import normalize_backward, normalize_forward
from ..nn.pooling import avg_pool_apply, avg_pool_vjp
from ..registry import Mechanism, Sample, register
from .common import cast_complex, irfftn_adjoint, rfftn_adjoint

__all__ = ["cape_block_forward", "cape_block_backward", "cape_block", "init_cape_params"]

_POOL = 4
_LN_EPS = 1e-5


def _validate(x, x_p, params, param_transform, combine):
    x = as_float(x, "x", min_ndim=3, max_ndim=4)
    b, c = x.shape[:2]
    sp = x.shape[2:]
    nd = len(sp)
    if any(n % _POOL for n in sp):
        raise ValueError(f"the grid {sp} of x must be a multiple of {_POOL} along every axis (pool and upsample by 4)")
    x_p = as_float(x_p, "x_p", ndim=2)
    if x_p.shape[0] != b:
        raise ValueError(f"x_p must have shape (B={b}, P): one parameter vector per sample; got {x_p.shape}")
    pt = ("identity" if nd == 1 else "sigmoid_log") if param_transform is None else param_transform
    check_choice(pt, "param_transform", ("identity", "sigmoid_log"))
    if pt == "sigmoid_log" and np.any(x_p <= 0):
        raise ValueError("x_p must be > 0 for param_transform='sigmoid_log' (sigmoid(log x_p))")
    comb = ("add" if nd == 1 else "scale") if combine is None else combine
    check_choice(comb, "combine", ("add", "scale"))
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of arrays; got {type(params).__name__}")
    w0 = params.get("CNN_0.weight")
    if w0 is None:
        raise ValueError(f"params is missing 'CNN_0.weight' (expected shape (W/2, C={c}) + (k,)*{nd})")
    w0 = as_float(w0, "CNN_0.weight", ndim=2 + nd)
    half, k = w0.shape[0], w0.shape[2]
    wide = 2 * half
    w2 = as_float(params.get("CNN_2.weight", np.zeros((1, 1) + (1,) * nd)), "CNN_2.weight", ndim=2 + nd)
    c_out = w2.shape[0]
    if c_out % c:
        raise ValueError(f"CNN_2.weight must output C * n_p channels with C={c} the channels of x (axis 1); "
                         f"got {c_out} output channels")
    k2 = w2.shape[2]
    sc = as_float(params.get("CNN_SC.weights1_real", np.zeros((1, 1) + (1,) * nd)), "CNN_SC.weights1_real", ndim=2 + nd)
    modes = sc.shape[2:]
    pooled = tuple(n // _POOL for n in sp)
    if modes[-1] > pooled[-1] // 2 + 1 or (nd == 2 and modes[0] > pooled[0]):
        raise ValueError(f"CNN_SC modes {modes} exceed the pooled grid {pooled} (last axis <= n//2+1, first <= n)")
    spec = {"CNN_0.weight": (half, c) + (k,) * nd, "CNN_AD.weight": (wide, 1) + (k,) * nd,
            "CNN_1.weight": (wide, half) + (1,) * nd, "CNN_1.bias": (wide,),
            "CNN_AC.weight": (wide, half) + (1,) * nd, "CNN_AC.bias": (wide,),
            "CNN_2.weight": (c_out, wide) + (k2,) * nd, "LN.weight": sp, "LN.bias": sp}
    if "CNN_2.bias" in params:
        spec["CNN_2.bias"] = (c_out,)
    for corner in ("weights1",) + (("weights2",) if nd == 2 else ()):
        for part in ("real", "imag"):
            spec[f"CNN_SC.{corner}_{part}"] = (half, wide) + modes
    n_par = x_p.shape[1]
    for j in range(3):
        spec.update(linear_prefixed_spec(f"fc{j}a", n_par, half))
        spec.update(linear_prefixed_spec(f"fc{j}b", half, wide))
    p = check_params(params, spec)
    dt = compute_dtype(x, x_p, *p.values())
    return x.astype(dt, copy=False), x_p.astype(dt, copy=False), cast_all(dt, p), pt, comb, c_out // c


def _up(t, nd):
    for ax in range(2, 2 + nd):
        t = np.repeat(t, _POOL, axis=ax)
    return t


def _up_vjp(g, nd):
    shape = g.shape[:2]
    for n in g.shape[2:]:
        shape += (n // _POOL, _POOL)
    return g.reshape(shape).sum(axis=tuple(3 + 2 * i for i in range(nd)))


def _corners(p, grid):
    # (weight, index) in upstream's assignment order; in 2-D the second corner overwrites the first
    # where they overlap (upstream's 2-D default: modes 9 on the 16-point pooled grid of 64).
    w1 = p["CNN_SC.weights1_real"] + 1j * p["CNN_SC.weights1_imag"]
    m = w1.shape[2:]
    if len(grid) == 1:
        return [(w1, (slice(None), slice(None), slice(0, m[0])))]
    w2 = p["CNN_SC.weights2_real"] + 1j * p["CNN_SC.weights2_imag"]
    return [(w1, (slice(None), slice(None), slice(0, m[0]), slice(0, m[1]))),
            (w2, (slice(None), slice(None), slice(grid[0] - m[0], grid[0]), slice(0, m[1])))]


def _spectral_forward(t, p):
    """Upstream ``SpectralConv{1,2}d``: channel-first ``(B, W/2, grid)`` -> ``(B, W, grid)``."""
    nd = t.ndim - 2
    axes = tuple(range(2, 2 + nd))
    grid = t.shape[2:]
    xf = cast_complex(np.fft.rfftn(t, axes=axes), t.dtype)
    wide = p["CNN_SC.weights1_real"].shape[1]
    yf = np.zeros((t.shape[0], wide) + xf.shape[2:], dtype=xf.dtype)
    owner = np.full(xf.shape[2:], -1)
    for k, (w, idx) in enumerate(_corners(p, grid)):
        yf[idx] = np.einsum("bi...,io...->bo...", xf[idx], w)
        owner[idx[2:]] = k
    return np.fft.irfftn(yf, s=grid, axes=axes).astype(t.dtype, copy=False), (xf, owner, grid)


def _spectral_backward(g, p, c, grads):
    # Per corner, the complex-linear VJP on the modes it owns (overwritten modes get nothing);
    # the real-FFT adjoints are the FNO ones (refattn.operators.common).
    xf, owner, grid = c
    nd = len(grid)
    axes = tuple(range(2, 2 + nd))
    dyf = cast_complex(irfftn_adjoint(g, axes), g.dtype)
    dxf = np.zeros_like(xf)
    for k, (w, idx) in enumerate(_corners(p, grid)):
        dk = dyf[idx] * (owner[idx[2:]] == k)
        dxf[idx] += np.einsum("bo...,io...->bi...", dk, np.conj(w))
        dw = np.einsum("bi...,bo...->io...", np.conj(xf[idx]), dk)
        name = f"CNN_SC.weights{k + 1}"
        grads[f"{name}_real"], grads[f"{name}_imag"] = dw.real.astype(g.dtype), dw.imag.astype(g.dtype)
    return rfftn_adjoint(dxf, grid, axes).astype(g.dtype, copy=False)


def cape_block_forward(x, x_p, params, *, param_transform=None, combine=None):
    r"""The CAPE parameter-embedding block (``PrmEmb_Block_1d``/``_2d``, module docstring).

    Parameters
    ----------
    x : array (B, C, n) or (B, C, n1, n2)
        The field, channel-first (upstream ``(batch, nc, nx[, ny])``); grid sizes multiples of 4.
    x_p : array (B, P)
        PDE parameters (> 0 for the 2-D ``sigmoid(log)`` transform).
    params : dict
        ``CNN_0.weight (W/2, C, k…)``, ``CNN_SC.weights1_real/imag (W/2, W, modes…)`` (and
        ``weights2_*`` in 2-D), ``CNN_AD.weight (W, 1, k…)``, ``CNN_1/CNN_AC.{weight (W, W/2, 1…), bias}``,
        ``CNN_2.weight (C n_p, W, k…)`` [+ ``CNN_2.bias`` for the 1×1 variant],
        ``fc{0,1,2}a.{weight (P, W/2), bias}``, ``fc{0,1,2}b.{weight (W/2, W), bias}``,
        ``LN.{weight, bias}`` with the grid's shape.
    param_transform : {None, "identity", "sigmoid_log"}
        None: upstream's choice for the dimension (1-D identity, 2-D sigmoid(log)).
    combine : {None, "add", "scale"}
        None: upstream's (1-D ``x + LN(z)``, 2-D ``x * (1 + LN(z))``).

    Returns
    -------
    out, cache
        ``out (B, C n_p, grid)``: the auxiliary field (upstream concatenates it to the solver input).
    """
    x, x_p, p, pt, comb, n_p = _validate(x, x_p, params, param_transform, combine)
    nd = x.ndim - 2
    sp_axes = tuple(range(2, 2 + nd))
    pi = sigmoid(np.log(x_p)) if pt == "sigmoid_log" else x_p
    hid = [linear_prefixed(p, f"fc{j}a", pi) for j in range(3)]
    emb = [linear_prefixed(p, f"fc{j}b", gelu(hid[j])) for j in range(3)]
    gate = [e.reshape(e.shape + (1,) * nd) for e in emb]
    k = p["CNN_0.weight"].shape[2]
    c0 = conv_apply(x, p["CNN_0.weight"], padding="same")
    y = gelu(c0)
    pooled = avg_pool_apply(y, (_POOL,) * nd)
    br0, sc_cache = _spectral_forward(pooled, p)
    br1 = conv_apply(y, p["CNN_AC.weight"], p["CNN_AC.bias"])
    br2 = conv_apply(y, p["CNN_AD.weight"], padding="same", groups=y.shape[1])
    s = _up(br0 * gate[0], nd) + br1 * gate[1] + br2 * gate[2] + conv_apply(y, p["CNN_1.weight"], p["CNN_1.bias"])
    a = gelu(s)
    pad2 = "same" if p["CNN_2.weight"].shape[2] > 1 else 0
    z = conv_apply(a, p["CNN_2.weight"], p.get("CNN_2.bias"), padding=pad2)
    zh, st = normalize_forward(z, sp_axes, _LN_EPS)
    ln = zh * p["LN.weight"] + p["LN.bias"]
    xt = np.concatenate([x] * n_p, axis=1)
    out = xt + ln if comb == "add" else xt * (1.0 + ln)
    cache = dict(p=p, x=x, x_p=x_p, pt=pt, comb=comb, n_p=n_p, pi=pi, hid=hid, gate=gate, c0=c0, y=y, pooled=pooled,
                 sc_cache=sc_cache, br0=br0, br1=br1, br2=br2, s=s, a=a, pad2=pad2, zh=zh, st=st, ln=ln, xt=xt, k=k,
                 out_shape=out.shape)
    return out, cache


def cape_block_backward(dout, cache):
    """Gradients of :func:`cape_block_forward`: ``x``, ``x_p`` and every params key."""
    p, x, c = cache["p"], cache["x"], cache
    nd = x.ndim - 2
    sp_axes = tuple(range(2, 2 + nd))
    g = as_dout(dout, c["out_shape"], x.dtype)
    grads = {}
    if c["comb"] == "add":
        dxt, dln = g, g
    else:
        dxt, dln = g * (1.0 + c["ln"]), g * c["xt"]
    dx = dxt.reshape((x.shape[0], c["n_p"]) + x.shape[1:]).sum(axis=1)
    grads["LN.weight"] = np.sum(dln * c["zh"], axis=(0, 1))
    grads["LN.bias"] = np.sum(dln, axis=(0, 1))
    dz = normalize_backward(dln * p["LN.weight"], c["zh"], c["st"])
    g2 = conv_vjp(dz, c["a"], p["CNN_2.weight"], padding=c["pad2"], has_bias="CNN_2.bias" in p)
    grads["CNN_2.weight"] = g2["weight"]
    if "bias" in g2:
        grads["CNN_2.bias"] = g2["bias"]
    ds = g2["x"] * gelu_grad(c["s"])
    g1 = conv_vjp(ds, c["y"], p["CNN_1.weight"])
    grads["CNN_1.weight"], grads["CNN_1.bias"] = g1["weight"], g1["bias"]
    dy = g1["x"]
    gate = c["gate"]
    gac = conv_vjp(ds * gate[1], c["y"], p["CNN_AC.weight"])
    grads["CNN_AC.weight"], grads["CNN_AC.bias"] = gac["weight"], gac["bias"]
    gad = conv_vjp(ds * gate[2], c["y"], p["CNN_AD.weight"], padding="same", groups=c["y"].shape[1], has_bias=False)
    grads["CNN_AD.weight"] = gad["weight"]
    ds0 = _up_vjp(ds, nd)
    dpool = _spectral_backward(ds0 * gate[0], p, c["sc_cache"], grads)
    dy = dy + gac["x"] + gad["x"] + avg_pool_vjp(dpool, c["y"].shape, (_POOL,) * nd)
    dgate = [np.sum(ds0 * c["br0"], axis=sp_axes), np.sum(ds * c["br1"], axis=sp_axes), np.sum(ds * c["br2"], axis=sp_axes)]
    dpi = 0.0
    for j in range(3):
        dh = linear_prefixed_vjp(grads, p, f"fc{j}b", dgate[j], gelu(c["hid"][j])) * gelu_grad(c["hid"][j])
        dpi = dpi + linear_prefixed_vjp(grads, p, f"fc{j}a", dh, c["pi"])
    grads["x_p"] = dpi * c["pi"] * (1.0 - c["pi"]) / c["x_p"] if c["pt"] == "sigmoid_log" else dpi
    g0 = conv_vjp(dy * gelu_grad(c["c0"]), x, p["CNN_0.weight"], padding="same", has_bias=False)
    grads["CNN_0.weight"] = g0["weight"]
    grads["x"] = dx + g0["x"]
    return grads


def cape_block(x, x_p, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`cape_block_forward`."""
    return cape_block_forward(x, x_p, params, **config)[0]


def init_cape_params(rng, num_channels: int, grid, *, num_params: int = 1, widening_factor: int = 16,
                     kernel_size: int = 5, modes=None, num_channels_prmemb: int = 1, if_11cnv: bool = False,
                     dtype=np.float64) -> dict:
    """Parameters as ``PrmEmb_Block_{1,2}d`` builds them: PyTorch default convolutions and linears,
    spectral weights ``scale * U(0, 1)`` (real and imaginary, ``scale = 1/(in*out)``), LayerNorm
    weight 1 / bias 0 over ``grid``."""
    grid = tuple(grid)
    nd = len(grid)
    half, wide = widening_factor // 2, widening_factor
    modes = ((16,) if nd == 1 else (9, 9)) if modes is None else tuple(modes)
    c_out = num_channels * num_channels_prmemb

    def conv_w(shape):
        fan_in = int(np.prod(shape[1:]))
        return rng.uniform(-1 / np.sqrt(fan_in), 1 / np.sqrt(fan_in), shape)

    p = {"CNN_0.weight": conv_w((half, num_channels) + (kernel_size,) * nd)}
    scale = 1.0 / (half * wide)
    for corner in ("weights1",) + (("weights2",) if nd == 2 else ()):
        for part in ("real", "imag"):
            p[f"CNN_SC.{corner}_{part}"] = scale * rng.uniform(0.0, 1.0, (half, wide) + modes)
    p["CNN_AD.weight"] = conv_w((wide, 1) + (kernel_size,) * nd)
    for name in ("CNN_1", "CNN_AC"):
        p[f"{name}.weight"] = conv_w((wide, half) + (1,) * nd)
        p[f"{name}.bias"] = conv_w((wide, half))[:, 0]
    p["CNN_2.weight"] = conv_w((c_out, wide) + ((1,) if if_11cnv else (kernel_size,)) * nd)
    if if_11cnv:
        p["CNN_2.bias"] = conv_w((c_out, wide))[:, 0]
    for j in range(3):
        p.update(init_linear_prefixed(rng, num_params, half, f"fc{j}a"))
        p.update(init_linear_prefixed(rng, half, wide, f"fc{j}b"))
    p["LN.weight"], p["LN.bias"] = np.ones(grid), np.zeros(grid)
    return {k: np.asarray(v, dtype=dtype) for k, v in p.items()}


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size, *, nd=1, if_11cnv=False):
    if nd == 1:
        grid, wf, k, modes, n_par = ((8,), 4, 3, (2,), 1) if size == "tiny" else ((16,), 6, 5, (3,), 2)
    else:
        grid, wf, k, modes, n_par = ((8, 8), 4, 3, (2, 1), 1) if size == "tiny" else ((8, 12), 4, 3, (2, 2), 2)  # overlapping corners
    c = 1 if size == "tiny" else 2
    p = init_cape_params(rng, c, grid, num_params=n_par, widening_factor=wf, kernel_size=k, modes=modes,
                         num_channels_prmemb=1 if size == "tiny" else 2, if_11cnv=if_11cnv)
    for key in p:
        if key.startswith(("LN", "CNN_SC")):
            p[key] = p[key] + 0.3 * rng.standard_normal(p[key].shape)
    x_p = rng.uniform(0.2, 2.0, (2, n_par))
    return Sample(inputs={"x": rng.standard_normal((2, c) + grid), "x_p": x_p}, params=p, config={})


def _conv_ref(x, w, b=None, groups=1):
    # Direct sum, 'same' zero padding (odd kernels), any group count.
    nd = x.ndim - 2
    k = w.shape[2:]
    xp = np.pad(x, [(0, 0), (0, 0)] + [(kk // 2, kk // 2) for kk in k])
    cin_g, cout_g = x.shape[1] // groups, w.shape[0] // groups
    out = np.zeros((x.shape[0], w.shape[0]) + x.shape[2:])
    for o in range(w.shape[0]):
        gi = o // cout_g
        for ci in range(cin_g):
            for off in np.ndindex(*k):
                sl = tuple(slice(off[a], off[a] + x.shape[2 + a]) for a in range(nd))
                out[:, o] += w[o, ci][off] * xp[(slice(None), gi * cin_g + ci) + sl]
    return out if b is None else out + b.reshape((-1,) + (1,) * nd)


def _reference(x, x_p, params, *, param_transform=None, combine=None):
    nd = x.ndim - 2
    pt = param_transform or ("identity" if nd == 1 else "sigmoid_log")
    comb = combine or ("add" if nd == 1 else "scale")
    pi = x_p / (1 + x_p) if pt == "sigmoid_log" else x_p
    e = [gelu(pi @ params[f"fc{j}a.weight"] + params[f"fc{j}a.bias"]) @ params[f"fc{j}b.weight"]
         + params[f"fc{j}b.bias"] for j in range(3)]
    e = [t.reshape(t.shape + (1,) * nd) for t in e]
    y = gelu(_conv_ref(x, params["CNN_0.weight"]))
    b, half = y.shape[:2]
    pooled = y.reshape((b, half) + sum(((n // 4, 4) for n in y.shape[2:]), ())).mean(axis=tuple(3 + 2 * i for i in range(nd)))
    axes = tuple(range(2, 2 + nd))
    xf = np.fft.rfftn(pooled, axes=axes)
    wide = params["CNN_SC.weights1_real"].shape[1]
    yf = np.zeros((b, wide) + xf.shape[2:], dtype=complex)
    w1 = params["CNN_SC.weights1_real"] + 1j * params["CNN_SC.weights1_imag"]
    if nd == 1:
        m1 = w1.shape[2]
        yf[:, :, :m1] = np.einsum("bix,iox->box", xf[:, :, :m1], w1)
    else:
        w2 = params["CNN_SC.weights2_real"] + 1j * params["CNN_SC.weights2_imag"]
        m1, m2 = w1.shape[2:]
        yf[:, :, :m1, :m2] = np.einsum("bixy,ioxy->boxy", xf[:, :, :m1, :m2], w1)
        yf[:, :, -m1:, :m2] = np.einsum("bixy,ioxy->boxy", xf[:, :, -m1:, :m2], w2)
    br0 = np.fft.irfftn(yf, s=pooled.shape[2:], axes=axes) * e[0]
    for ax in axes:
        br0 = np.repeat(br0, 4, axis=ax)
    s = (br0 + _conv_ref(y, params["CNN_AC.weight"], params["CNN_AC.bias"]) * e[1]
         + _conv_ref(y, params["CNN_AD.weight"], groups=half) * e[2] + _conv_ref(y, params["CNN_1.weight"], params["CNN_1.bias"]))
    z = _conv_ref(gelu(s), params["CNN_2.weight"], params.get("CNN_2.bias"))
    mu = z.mean(axis=axes, keepdims=True)
    ln = (z - mu) / np.sqrt(((z - mu) ** 2).mean(axis=axes, keepdims=True) + _LN_EPS) * params["LN.weight"] + params["LN.bias"]
    xt = np.concatenate([x] * (z.shape[1] // x.shape[1]), axis=1)
    return xt + ln if comb == "add" else xt * (1 + ln)


def _check_2d_and_1x1_variants(rng):
    # The 2-D block (sigmoid(log) parameters, multiplicative combine, two spectral corners) and the
    # 1x1 output convolution against the explicit formula (FD checks: tests/test_operators_o3.py).
    errs = []
    for kw in ({"nd": 2}, {"nd": 1, "if_11cnv": True}):
        s = _sample(rng, "small", **kw)
        err = float(np.abs(cape_block(**s.inputs, params=s.params) - _reference(**s.inputs, params=s.params)).max())
        assert err < 1e-11, f"{kw}: differs from the explicit formula by {err:.2e}"
        errs.append(err)
    return max(errs)


def _check_parameter_gating(rng):
    # With the embeddings' last layers zeroed the three gated branches vanish: the block no longer
    # depends on the PDE parameters, and equals the ungated path CNN_1 alone.
    s = _sample(rng, "small")
    p = dict(s.params)
    for j in range(3):
        p[f"fc{j}b.weight"] = np.zeros_like(p[f"fc{j}b.weight"])
        p[f"fc{j}b.bias"] = np.zeros_like(p[f"fc{j}b.bias"])
    out1 = cape_block(s.inputs["x"], s.inputs["x_p"], p)
    out2 = cape_block(s.inputs["x"], 3.0 * s.inputs["x_p"] + 1.0, p)
    err = float(np.abs(out1 - out2).max())
    assert err == 0.0, f"ungated block depends on the PDE parameters: {err:.2e}"
    moved = float(np.abs(cape_block(s.inputs["x"], 3.0 * s.inputs["x_p"] + 1.0, s.params)
                         - cape_block(**s.inputs, params=s.params)).max())
    assert moved > 1e-6, "the gated block ignores the PDE parameters"
    return err


register(
    Mechanism(
        slug="cape_parameter_channel_attention", family="3-operator", tier="T3",
        title="CAPE: channel attention guided by PDE-parameter embeddings (parameter-embedding block)",
        paper="Takamoto, Alesiani, Niepert, Learning Neural PDE Solvers with Parameter-Guided Channel Attention, "
              "ICML 2023, arXiv 2304.14118",
        forward=cape_block_forward, backward=cape_block_backward, sample=_sample, reference=_reference,
        docs="operators/operator-attention-t3.md#cape-parameter-embedding-block",
        checks={"variants_2d_and_1x1": _check_2d_and_1x1_variants, "parameter_gating": _check_parameter_gating},
    ),
)
