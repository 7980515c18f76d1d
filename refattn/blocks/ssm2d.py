r"""2-D SSM: a two-dimensional (Roesser) state-space layer materialised as a causal 2-D convolution kernel.

Baron, Zimerman, Wolf, "A 2-Dimensional State Space Layer for Spatial Inductive Bias", ICLR 2024,
arXiv 2306.06635. Upstream: ethanbar11/ssm_2d @ fbdd3e359cd57bc58ea3702d13796e7ee1f88148:
``models/mega/two_d_ssm.py`` (``TwoDimensionalSSM``: parameters, ``_calc_coeffs``,
``compute_x_matrix``, ``_compute_kernel``, ``forward``) and ``models/mega/ssm_coefficient.py``
(``CoeffCalculator``: the symbolic impulse response ``calc_x_h``/``calc_x_v``). (The backbones at
that commit import a module ``two_d_ssm_recursive`` that the snapshot does not contain;
``two_d_ssm.py`` is the layer it names.) In the ViT the layer smooths the patch tokens (not the
CLS token) that feed the query/key projections of every attention block.

The recurrence
--------------
Per SSM channel $c$ and state index $n$ (diagonal: $A_1\ldots A_4, B_1, B_2$ are vectors over the
$N$ = ``ndim`` states), with $a_r = \sigma(A_r)$, $b_r = \sigma(B_r)$ (upstream's real
parameterisation) and the grid indexed $(i, j)$ = (row, column):

$$x^h_{i,j} = g^h_{i,j}\big(a_1x^h_{i,j-1} + a_2x^v_{i,j-1}\big) + b_1u_{i,j},\qquad
x^v_{i,j} = g^v_{i,j}\big(a_3x^h_{i-1,j} + a_4x^v_{i-1,j}\big) + b_2u_{i,j},$$

states outside the grid 0. With $g\equiv1$ this is the Roesser model of the paper. Its impulse
response ($u = \delta_{0,0}$) is the kernel; upstream builds it symbolically (sympy expands every
$x_{i,j}$ into monomials in $a_r, b_r$, cached as power tables) and halves a step whenever *both*
of its source states are (symbolically) non-zero, which is the paper's kernel normalisation. For
the impulse response that rule is the fixed mask

$$g^h_{i,j} = \tfrac12\ \text{iff}\ (i = 0, j = 1)\ \text{or}\ (i\ge1, j\ge2),\qquad
g^v_{i,j} = \tfrac12\ \text{iff}\ (j = 0, i = 1)\ \text{or}\ (j\ge1, i\ge2),$$

else 1 (the zero pattern: $x^h_{i,0} = 0$ for $i\ge1$, $x^v_{0,j} = 0$ for $j\ge1$). The output
kernel of output channel ``ch`` (of $D\cdot$``directions``) reads SSM channel
$c = \mathrm{ch} \bmod K$ ($K$ = ``directions * n_ssm``):

$$\kappa_{i,j,\mathrm{ch}} = e_{i,j}\,\tfrac{1}{\sqrt N}\sum_n\big(C_{1,\mathrm{ch},n}x^h_{i,j,c,n}
+ C_{2,\mathrm{ch},n}x^v_{i,j,c,n}\big),$$

$e_{i,j} = 2$ on the first row and column except the origin, 1 elsewhere (upstream's
"normalization fix"). ``kernel_normalization=False`` drops $g$ and $e$: the plain Roesser
impulse response.

The layer
---------
Tokens $x\in\mathbb R^{B\times L\times D}$, $L = S^2$ in row-major order (upstream takes
``(L, B, D)``; refattn keeps the batch first), viewed as images $z_{b,d}\in\mathbb R^{S\times S}$.
Each of the ``directions`` flips $F_r$ (4: none, rows, columns, both; 2: none, both) scans from
one corner; channel $d$ in direction $r$ uses kernel channel $\mathrm{ch} = rD + d$:

$$o_{b,d} = \sum_r F_r\big(\kappa_{:,:,rD+d} \ast F_r z_{b,d}\big),\qquad
(\kappa\ast z)_{p,q} = \sum_{a\le p,\,b\le q}\kappa_{a,b}\,z_{p-a,q-b},$$

then $y = \mathrm{LN}(o + \omega\odot x)$ (``use_residual``: $\omega$ = ``omega``; ``normalize``:
the LayerNorm over $D$, ``normalization.*``). The causal convolution is evaluated by FFT on a
$2S\times2S$ grid (``method="fft"``, upstream) or by the direct double sum (``"direct"``).

Backward
--------
With $G_r = F_r(\partial o)$ and $Z_r = F_r z$, the convolution's adjoints are correlations:
$\partial Z_r{}_{,s,t} = \sum_{a,b}\kappa_{a,b}G_{r,s+a,t+b}$ (flipped back by $F_r$) and
$\partial\kappa_{a,b} = \sum_{b,p,q}G_{r,p,q}Z_{r,p-a,q-b}$ — both by FFT with the conjugate
spectrum. Then $\partial\tilde\kappa = e\odot\partial\kappa$, $\partial C_1 = \tfrac1{\sqrt N}
\sum_{i,j}\partial\tilde\kappa\,x^h$, $\partial x^h_{c} = \tfrac1{\sqrt N}\sum_{\mathrm{ch}\to c}
\partial\tilde\kappa\,C_1$ (likewise $C_2$, $x^v$), and the recurrence is run backwards with adjoint
states

$$\lambda^h_{i,j} = \partial x^h_{i,j} + g^h_{i,j+1}a_1\lambda^h_{i,j+1} + g^v_{i+1,j}a_3\lambda^v_{i+1,j},\quad
\lambda^v_{i,j} = \partial x^v_{i,j} + g^h_{i,j+1}a_2\lambda^h_{i,j+1} + g^v_{i+1,j}a_4\lambda^v_{i+1,j},$$

$\partial a_1 = \sum g^h_{i,j}\lambda^h_{i,j}x^h_{i,j-1}$, $\partial a_2 = \sum g^h_{i,j}\lambda^h_{i,j}x^v_{i,j-1}$,
$\partial a_3 = \sum g^v_{i,j}\lambda^v_{i,j}x^h_{i-1,j}$, $\partial a_4 = \sum g^v_{i,j}\lambda^v_{i,j}x^v_{i-1,j}$,
$\partial b_1 = \lambda^h_{0,0}$, $\partial b_2 = \lambda^v_{0,0}$, each times $\sigma' = \sigma(1-\sigma)$.
$\partial\omega = \sum x\odot\partial(o{+}\omega x)$, $\partial x$ adds $\omega\odot\partial(\cdot)$; the
LayerNorm VJP is `refattn.blocks.core.norm_backward`.

Conventions
-----------
``directions`` (4, upstream default; 2), ``use_residual`` (False, upstream's
``--use_residual_inside_ssm`` default), ``normalize`` (False; the README's ViT runs pass
``--normalize``), ``kernel_normalization`` (True), ``method`` (``"fft"``), ``eps`` (1e-5,
``nn.LayerNorm``). ``n_ssm`` and ``ndim`` are read from the parameter shapes. The complex
parameterisation (``--complex_ssm``, polar $A$) is not reproduced. Upstream builds the kernel at
the side $\lceil\sqrt{L_{max}}\rceil$ fixed at construction and zero-pads it to smaller images;
here the kernel side is the image side, which is the same for the image size it was built for.

Agreement with upstream
-----------------------
``TwoDimensionalSSM`` (scratch copy with ``.cuda()`` removed; the sympy tables built with
``force_coeff_calc`` in float64) in float64 against `ssm_2d_forward`/`ssm_2d_backward`,
$(S, \text{directions})\in\{(3,2), (3,4), (4,2), (4,4), (6,4)\}$, $D = 4$, ``ndim`` 3, ``n_ssm`` 2,
residual and LayerNorm on: output and the gradients of the input and all eleven parameters agree
to $2.5\times10^{-7}$ relative as shipped (``forward`` casts the kernel to float32 before its
FFT, ``k.float()``) and to $3.6\times10^{-15}$ with that cast removed.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_choice, check_params, check_positive
from ..registry import Mechanism, Sample, register
from .core import norm_backward, norm_forward, norm_spec

__all__ = ["ssm_2d_forward", "ssm_2d_backward", "ssm_2d", "ssm_2d_kernel", "SSM2D_A_KEYS"]

SSM2D_A_KEYS = ("A.A_1", "A.A_2", "A.A_3", "A.A_4")
_FLIPS = {4: ((), (0,), (1,), (0, 1)), 2: ((), (0, 1))}


def _sigmoid(z):
    return 0.5 * (1.0 + np.tanh(0.5 * z))


def _gates(s: int, normalized: bool):
    """The halving masks $g^h, g^v$ and the edge factor $e$ of an $S\times S$ kernel."""
    gh, gv, e = np.ones((s, s)), np.ones((s, s)), np.ones((s, s))
    if normalized:
        i, j = np.meshgrid(np.arange(s), np.arange(s), indexing="ij")
        gh[((i == 0) & (j == 1)) | ((i >= 1) & (j >= 2))] = 0.5
        gv[((j == 0) & (i == 1)) | ((j >= 1) & (i >= 2))] = 0.5
        e[0, :] = 2.0
        e[:, 0] = 2.0
        e[0, 0] = 1.0
    return gh, gv, e


def _impulse_states(a, b1, b2, gh, gv):
    """$x^h, x^v$ of shape (S, S, K, N) for the impulse at the origin (module docstring)."""
    s = gh.shape[0]
    xh = np.zeros((s, s) + b1.shape, dtype=b1.dtype)
    xv = np.zeros_like(xh)
    xh[0, 0], xv[0, 0] = b1, b2
    for i in range(s):
        for j in range(s):
            if j >= 1:
                xh[i, j] = gh[i, j] * (a[0] * xh[i, j - 1] + a[1] * xv[i, j - 1])
            if i >= 1:
                xv[i, j] = gv[i, j] * (a[2] * xh[i - 1, j] + a[3] * xv[i - 1, j])
    return xh, xv


def ssm_2d_kernel(params, side: int, *, kernel_normalization: bool = True):
    r"""The 2-D SSM kernel $\kappa$ of shape ``(side, side, D * directions)`` and its cache
    (module docstring); ``params`` as in `ssm_2d_forward` (validated by the caller)."""
    a = [_sigmoid(params[k]) for k in SSM2D_A_KEYS]
    b1, b2 = _sigmoid(params["B_1"]), _sigmoid(params["B_2"])
    gh, gv, e = (m.astype(b1.dtype) for m in _gates(side, kernel_normalization))
    xh, xv = _impulse_states(a, b1, b2, gh, gv)
    k_ssm, n = b1.shape
    c1, c2 = params["C_1"], params["C_2"]
    src = np.arange(c1.shape[0]) % k_ssm
    scale = 1.0 / np.sqrt(n)
    raw = scale * (np.einsum("ijcn,cn->ijc", xh[:, :, src], c1) + np.einsum("ijcn,cn->ijc", xv[:, :, src], c2))
    return raw * e[:, :, None], (a, b1, b2, gh, gv, e, xh, xv, src, scale)


def _kernel_backward(grads, params, dkappa, kc):
    a, b1, b2, gh, gv, e, xh, xv, src, scale = kc
    s = gh.shape[0]
    draw = dkappa * e[:, :, None] * scale
    grads["C_1"] = np.einsum("ijc,ijcn->cn", draw, xh[:, :, src])
    grads["C_2"] = np.einsum("ijc,ijcn->cn", draw, xv[:, :, src])
    k_ssm = b1.shape[0]
    dxh = np.zeros_like(xh)
    dxv = np.zeros_like(xv)
    for ch_src in range(k_ssm):
        sel = src == ch_src
        dxh[:, :, ch_src] = np.einsum("ijc,cn->ijn", draw[:, :, sel], params["C_1"][sel])
        dxv[:, :, ch_src] = np.einsum("ijc,cn->ijn", draw[:, :, sel], params["C_2"][sel])
    lh = np.zeros_like(xh)
    lv = np.zeros_like(xv)
    da = [np.zeros_like(b1) for _ in range(4)]
    for i in range(s - 1, -1, -1):
        for j in range(s - 1, -1, -1):
            th, tv = dxh[i, j].copy(), dxv[i, j].copy()
            if j + 1 < s:
                th += gh[i, j + 1] * a[0] * lh[i, j + 1]
                tv += gh[i, j + 1] * a[1] * lh[i, j + 1]
            if i + 1 < s:
                th += gv[i + 1, j] * a[2] * lv[i + 1, j]
                tv += gv[i + 1, j] * a[3] * lv[i + 1, j]
            if j == 0 and i >= 1:
                th[...] = 0.0  # x^h_{i,0} (i >= 1) is the zero boundary, not a state
            if i == 0 and j >= 1:
                tv[...] = 0.0
            lh[i, j], lv[i, j] = th, tv
            if j >= 1:
                da[0] += gh[i, j] * th * xh[i, j - 1]
                da[1] += gh[i, j] * th * xv[i, j - 1]
            if i >= 1:
                da[2] += gv[i, j] * tv * xh[i - 1, j]
                da[3] += gv[i, j] * tv * xv[i - 1, j]
    for k, ak, d in zip(SSM2D_A_KEYS, a, da):
        grads[k] = d * ak * (1.0 - ak)
    grads["B_1"] = lh[0, 0] * b1 * (1.0 - b1)
    grads["B_2"] = lv[0, 0] * b2 * (1.0 - b2)


def _conv(z, k, method):
    """Causal 2-D convolution over the last two axes: z (..., S, S), k (..., S, S)."""
    s = z.shape[-1]
    if method == "fft":
        f = np.fft.rfft2(z, s=(2 * s, 2 * s)) * np.fft.rfft2(k, s=(2 * s, 2 * s))
        return np.fft.irfft2(f, s=(2 * s, 2 * s))[..., :s, :s]
    out = np.zeros(np.broadcast_shapes(z.shape, k.shape), dtype=z.dtype)
    for a in range(s):
        for b in range(s):
            out[..., a:, b:] += k[..., a:a + 1, b:b + 1] * z[..., : s - a, : s - b]
    return out


def _corr(g, w, method):
    """Adjoint of `_conv` in its first argument: r[s, t] = sum_{a, b} w[a, b] g[s + a, t + b]."""
    s = g.shape[-1]
    if method == "fft":
        f = np.fft.rfft2(g, s=(2 * s, 2 * s)) * np.conj(np.fft.rfft2(w, s=(2 * s, 2 * s)))
        return np.fft.irfft2(f, s=(2 * s, 2 * s))[..., :s, :s]
    out = np.zeros(np.broadcast_shapes(g.shape, w.shape), dtype=g.dtype)
    for a in range(s):
        for b in range(s):
            out[..., : s - a, : s - b] += w[..., a:a + 1, b:b + 1] * g[..., a:, b:]
    return out


def _spec(params, d, directions, use_residual, normalize):
    if not isinstance(params, dict):
        raise TypeError(f"params for ssm_2d must be a dict of arrays; got {type(params).__name__}")
    if params.get("B_1") is None:
        raise ValueError("params is missing key 'B_1' for ssm_2d (expected shape (directions * n_ssm, ndim))")
    b1 = as_float(params["B_1"], "B_1", ndim=2)
    k_ssm, n = b1.shape
    if k_ssm % directions:
        raise ValueError(f"B_1 must have directions * n_ssm = a multiple of directions={directions} rows; "
                         f"got {k_ssm}")
    if d % (k_ssm // directions):
        raise ValueError(f"x's width D={d} must be a multiple of n_ssm={k_ssm // directions} "
                         f"(B_1 has {k_ssm} = directions * n_ssm rows)")
    spec = {**{k: (k_ssm, n) for k in SSM2D_A_KEYS}, "B_1": (k_ssm, n), "B_2": (k_ssm, n),
            "C_1": (d * directions, n), "C_2": (d * directions, n)}
    if use_residual:
        spec["omega"] = (d,)
    if normalize:
        spec.update(norm_spec("normalization", d))
    return spec


def ssm_2d_forward(x, params, *, directions: int = 4, use_residual: bool = False, normalize: bool = False,
                   kernel_normalization: bool = True, method: str = "fft", eps: float = 1e-5):
    r"""The 2-D SSM layer on tokens ``x (B, L, D)``, $L = S^2$ row-major (module docstring).

    Parameters
    ----------
    x : array (B, L, D)
    params : dict
        Upstream's ``TwoDimensionalSSM`` names: ``"A.A_1"`` ... ``"A.A_4"``, ``"B_1"``, ``"B_2"``
        ``(directions * n_ssm, ndim)``, ``"C_1"``, ``"C_2"`` ``(D * directions, ndim)``; ``"omega"
        (D,)`` with ``use_residual``; ``"normalization.weight"/".bias" (D,)`` with ``normalize``.
    directions : {4, 2}
    use_residual, normalize : bool
    kernel_normalization : bool
        Upstream's halving rule and edge doubling (True) or the plain Roesser kernel.
    method : {"fft", "direct"}
    eps : float

    Returns
    -------
    y, cache
        ``y (B, L, D)``.
    """
    x = as_float(x, "x", ndim=3)
    if directions not in _FLIPS or isinstance(directions, bool):
        raise ValueError(f"directions must be 2 or 4; got {directions!r}")
    for flag, name in ((use_residual, "use_residual"), (normalize, "normalize"),
                       (kernel_normalization, "kernel_normalization")):
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"{name} must be a bool; got {type(flag).__name__}")
    check_choice(method, "method", ("fft", "direct"))
    eps = check_positive(eps, "eps", allow_zero=True)
    bsz, length, d = x.shape
    side = int(round(np.sqrt(length)))
    if side * side != length:
        raise ValueError(f"x must hold a square image of tokens: L = S^2; got L={length}")
    spec = _spec(params, d, directions, use_residual, normalize)
    p = check_params(params, spec, where="ssm_2d")
    dt = np.result_type(x.dtype, *(v.dtype for v in p.values()))
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    kappa, kc = ssm_2d_kernel(p, side, kernel_normalization=bool(kernel_normalization))
    z = np.swapaxes(x, 1, 2).reshape(bsz, d, side, side)
    flips = _FLIPS[directions]
    o = np.zeros_like(z)
    zs = []
    for r, fl in enumerate(flips):
        zr = np.flip(z, axis=tuple(2 + f for f in fl)) if fl else z
        k_r = np.moveaxis(kappa[:, :, r * d:(r + 1) * d], 2, 0)[None]
        cr = _conv(zr, k_r, method)
        o += np.flip(cr, axis=tuple(2 + f for f in fl)) if fl else cr
        zs.append(zr)
    o = np.swapaxes(o.reshape(bsz, d, length), 1, 2)
    pre = o + p["omega"] * x if use_residual else o
    y, c_ln = norm_forward(p, "normalization", pre.astype(dt, copy=False), kind="layer" if normalize else "none",
                           eps=eps)
    cache = {"p": p, "kappa": kappa, "kc": kc, "zs": zs, "x": x, "c_ln": c_ln, "d": d, "side": side,
             "flips": flips, "method": method, "use_residual": bool(use_residual), "dtype": dt}
    return y, cache


def ssm_2d_backward(dout, cache):
    r"""Gradients of `ssm_2d_forward` for ``x`` and every params key (module docstring)."""
    p, x, d, side, method = cache["p"], cache["x"], cache["d"], cache["side"], cache["method"]
    g = as_dout(dout, x.shape, cache["dtype"])
    bsz, length, _ = x.shape
    grads = {}
    dpre = norm_backward(grads, p, g, cache["c_ln"])
    dx = np.zeros_like(x)
    if cache["use_residual"]:
        grads["omega"] = np.sum(dpre * x, axis=(0, 1))
        dx = dx + p["omega"] * dpre
    go = np.swapaxes(dpre, 1, 2).reshape(bsz, d, side, side)
    kappa = cache["kappa"]
    dkappa = np.zeros_like(kappa)
    dz = np.zeros_like(go)
    for r, fl in enumerate(cache["flips"]):
        ax = tuple(2 + f for f in fl)
        gr = np.flip(go, axis=ax) if fl else go
        k_r = np.moveaxis(kappa[:, :, r * d:(r + 1) * d], 2, 0)[None]
        dzr = _corr(gr, k_r, method)
        dz += np.flip(dzr, axis=ax) if fl else dzr
        dk = _corr(gr, cache["zs"][r], method).sum(axis=0)
        dkappa[:, :, r * d:(r + 1) * d] = np.moveaxis(dk, 0, 2)
    dx = dx + np.swapaxes(dz.reshape(bsz, d, length), 1, 2)
    _kernel_backward(grads, p, dkappa, cache["kc"])
    grads["x"] = dx
    return {k: v.astype(cache["dtype"], copy=False) for k, v in grads.items()}


def ssm_2d(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of `ssm_2d_forward`."""
    return ssm_2d_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _params(rng, d, directions, n_ssm, ndim, use_residual, normalize):
    k = directions * n_ssm
    p = {key: 0.8 * rng.standard_normal((k, ndim)) for key in (*SSM2D_A_KEYS, "B_1", "B_2")}
    p["C_1"] = rng.standard_normal((d * directions, ndim))
    p["C_2"] = rng.standard_normal((d * directions, ndim))
    if use_residual:
        p["omega"] = rng.standard_normal(d)
    if normalize:
        p["normalization.weight"] = 1.0 + 0.2 * rng.standard_normal(d)
        p["normalization.bias"] = 0.1 * rng.standard_normal(d)
    return p


def _sample(rng, size):
    directions = int(rng.choice([2, 4]))
    if size == "tiny":
        side, d, n_ssm, ndim = 3, 2, 1, 2
    else:
        side, d, n_ssm, ndim = int(rng.integers(3, 6)), 4, 2, 3
    res, norm = bool(rng.random() < 0.7), bool(rng.random() < 0.7)
    p = _params(rng, d, directions, n_ssm, ndim, res, norm)
    return Sample(inputs={"x": rng.standard_normal((2, side * side, d))}, params=p,
                  config={"directions": directions, "use_residual": res, "normalize": norm})


def _reference_kernel(params, side, kernel_normalization=True):
    # Scalar loops: the recurrence on the impulse with upstream's halving rule evaluated the way
    # CoeffCalculator does (halve a step iff both source states are non-zero), then C and the edges.
    def sig(v):
        return 1.0 / (1.0 + np.exp(-v))

    a = [sig(np.asarray(params[k])) for k in SSM2D_A_KEYS]
    b1, b2 = sig(np.asarray(params["B_1"])), sig(np.asarray(params["B_2"]))
    k_ssm, n = b1.shape
    c1, c2 = np.asarray(params["C_1"]), np.asarray(params["C_2"])
    kappa = np.zeros((side, side, c1.shape[0]))
    for c in range(k_ssm):
        for m in range(n):
            xh, xv = {}, {}
            nzh, nzv = {}, {}
            for i in range(side):
                for j in range(side):
                    u = 1.0 if i == j == 0 else 0.0
                    h1, v1 = (xh[i, j - 1], xv[i, j - 1]) if j >= 1 else (0.0, 0.0)
                    nz = j >= 1 and nzh[i, j - 1] and nzv[i, j - 1]
                    hal = 0.5 if (kernel_normalization and nz) else 1.0
                    xh[i, j] = hal * (a[0][c, m] * h1 + a[1][c, m] * v1) + b1[c, m] * u
                    nzh[i, j] = u != 0.0 or (j >= 1 and (nzh[i, j - 1] or nzv[i, j - 1]))
                    h2, v2 = (xh[i - 1, j], xv[i - 1, j]) if i >= 1 else (0.0, 0.0)
                    nz = i >= 1 and nzh[i - 1, j] and nzv[i - 1, j]
                    hal = 0.5 if (kernel_normalization and nz) else 1.0
                    xv[i, j] = hal * (a[2][c, m] * h2 + a[3][c, m] * v2) + b2[c, m] * u
                    nzv[i, j] = u != 0.0 or (i >= 1 and (nzh[i - 1, j] or nzv[i - 1, j]))
            for ch in range(c1.shape[0]):
                if ch % k_ssm == c:
                    for i in range(side):
                        for j in range(side):
                            kappa[i, j, ch] += (c1[ch, m] * xh[i, j] + c2[ch, m] * xv[i, j]) / np.sqrt(n)
    if kernel_normalization:
        kappa[0, 1:] *= 2.0
        kappa[1:, 0] *= 2.0
    return kappa


def _reference(x, params, directions=4, use_residual=False, normalize=False, kernel_normalization=True,
               method="fft", eps=1e-5):
    # The explicit double sum y[p, q] = sum_{a <= p, b <= q} kappa[a, b] u[p - a, q - b] per
    # direction on the flipped image, with the loop-built kernel above.
    bsz, length, d = x.shape
    s = int(round(np.sqrt(length)))
    kappa = _reference_kernel(params, s, kernel_normalization)
    z = np.swapaxes(x, 1, 2).reshape(bsz, d, s, s)
    o = np.zeros_like(z)
    for r, fl in enumerate(_FLIPS[directions]):
        ax = tuple(2 + f for f in fl)
        zr = np.flip(z, axis=ax)
        cr = np.zeros_like(zr)
        for p_ in range(s):
            for q in range(s):
                for a in range(p_ + 1):
                    for b in range(q + 1):
                        cr[:, :, p_, q] += kappa[a, b, r * d:(r + 1) * d] * zr[:, :, p_ - a, q - b]
        o += np.flip(cr, axis=ax)
    o = np.swapaxes(o.reshape(bsz, d, length), 1, 2)
    if use_residual:
        o = o + params["omega"] * x
    if normalize:
        mu = o.mean(-1, keepdims=True)
        var = ((o - mu) ** 2).mean(-1, keepdims=True)
        o = (o - mu) / np.sqrt(var + eps) * params["normalization.weight"] + params["normalization.bias"]
    return o


def _check_roesser_recurrence(rng):
    # kernel_normalization=False: the layer equals the Roesser recurrence run on the input itself,
    # x^h_{i,j} = a1 x^h_{i,j-1} + a2 x^v_{i,j-1} + b1 u_{i,j}, x^v_{i,j} = a3 x^h_{i-1,j} + a4 x^v_{i-1,j}
    # + b2 u_{i,j}, y = (C1 x^h + C2 x^v)/sqrt(N), per direction on the flipped image.
    d, directions, n_ssm, ndim, s = 2, 4, 1, 2, 4
    p = _params(rng, d, directions, n_ssm, ndim, False, False)
    x = rng.standard_normal((2, s * s, d))
    y = ssm_2d(x, p, directions=directions, kernel_normalization=False)
    sig = _sigmoid
    a = [sig(p[k]) for k in SSM2D_A_KEYS]
    b1, b2 = sig(p["B_1"]), sig(p["B_2"])
    k_ssm = directions * n_ssm
    z = np.swapaxes(x, 1, 2).reshape(2, d, s, s)
    out = np.zeros_like(z)
    for r, fl in enumerate(_FLIPS[directions]):
        ax = tuple(2 + f for f in fl)
        u = np.flip(z, axis=ax)
        yr = np.zeros_like(u)
        for dd in range(d):
            ch = r * d + dd
            c = ch % k_ssm
            xh = np.zeros((2, s + 1, s + 1, ndim))
            xv = np.zeros_like(xh)
            for i in range(s):
                for j in range(s):
                    uu = u[:, dd, i, j][:, None]
                    xh[:, i + 1, j + 1] = a[0][c] * xh[:, i + 1, j] + a[1][c] * xv[:, i + 1, j] + b1[c] * uu
                    xv[:, i + 1, j + 1] = a[2][c] * xh[:, i, j + 1] + a[3][c] * xv[:, i, j + 1] + b2[c] * uu
                    yr[:, dd, i, j] = (xh[:, i + 1, j + 1] @ p["C_1"][ch] + xv[:, i + 1, j + 1] @ p["C_2"][ch]) / np.sqrt(ndim)
        out += np.flip(yr, axis=ax)
    ref = np.swapaxes(out.reshape(2, d, s * s), 1, 2)
    err = float(np.abs(y - ref).max())
    assert err < 1e-12, f"the plain kernel differs from the Roesser recurrence by {err}"
    return err


def _check_fft_equals_direct(rng):
    # The FFT convolution and its FFT adjoints agree with the direct double sums (forward and
    # every gradient).
    s = _sample(rng, "small")
    y1, c1 = ssm_2d_forward(s.inputs["x"], s.params, method="fft", **s.config)
    y2, c2 = ssm_2d_forward(s.inputs["x"], s.params, method="direct", **s.config)
    dy = rng.standard_normal(y1.shape)
    g1, g2 = ssm_2d_backward(dy, c1), ssm_2d_backward(dy, c2)
    err = max([float(np.abs(y1 - y2).max())] + [float(np.abs(g1[k] - g2[k]).max()) for k in g1])
    assert err < 1e-11, f"fft and direct evaluation differ by {err}"
    return err


def _check_single_direction_is_causal(rng):
    # With 4 directions the output at a pixel depends on every pixel (each corner's scan reaches
    # it); the first direction alone is causal: perturbing pixel (p, q) leaves every earlier pixel
    # (row < p or column < q) of that scan unchanged.
    d, s = 2, 4
    p = _params(rng, d, 2, 1, 2, False, False)
    p["C_1"][d:] = 0.0
    p["C_2"][d:] = 0.0  # silence the flipped direction
    x = rng.standard_normal((2, s * s, d))
    y0 = ssm_2d(x, p, directions=2, method="direct").reshape(2, s, s, d)
    x1 = x.copy()
    x1[:, 2 * s + 1] += 1.0  # pixel (2, 1)
    y1 = ssm_2d(x1, p, directions=2, method="direct").reshape(2, s, s, d)
    diff = np.abs(y1 - y0)
    before = max(float(diff[:, :2].max()), float(diff[:, :, :1].max()))
    assert before == 0.0 and float(diff[:, 2:, 1:].max()) > 1e-6, before
    return before


register(
    Mechanism(
        slug="ssm_2d_layer", family="5-building-blocks", tier="T3",
        title="2-D SSM layer: a diagonal Roesser state-space model materialised as multi-directional causal 2-D "
              "convolution kernels (upstream kernel normalisation), residual and LayerNorm",
        paper="Baron, Zimerman, Wolf, A 2-Dimensional State Space Layer for Spatial Inductive Bias, ICLR 2024, "
              "arXiv 2306.06635",
        forward=ssm_2d_forward, backward=ssm_2d_backward, sample=_sample, reference=_reference,
        docs="blocks/b7.md#ssm_2d_layer",
        checks={"roesser_recurrence": _check_roesser_recurrence, "fft_equals_direct": _check_fft_equals_direct,
                "single_direction_is_causal": _check_single_direction_is_causal},
    ),
)
