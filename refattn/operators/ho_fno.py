r"""HO-FNO: the higher-order (n-linear) spectral convolution and the HO-FNO block.

Paper: Colagrande, Caillon, Feillet, Allauzen, "Higher-Order Fourier Neural Operator: Explicit
Mode Mixer for Nonlinear PDEs", arXiv 2606.28122 (2026). Upstream: AlexColagrande/HO-FNO
``models/HO_FNO.py`` (``HO_Conv``, ``RMSNorm2D``, ``HO_block``, ``_pad_2_3_rule``) and
``layers/spectral_convs.py`` (``SpectralConv_2D_diag``) @ 3fadeccf875e974e038338bea02c0d6761cb170a.

Higher-order spectral convolution (``HO_Conv``)
-----------------------------------------------
For ``x (B, H, W, C)`` (channel-last, as upstream's ``HO_Conv`` input) and order $n$: a 1x1
convolution $P$ maps $C\to nC$ (``proj``), split into $n$ chunks $a_1..a_n$ of $C$ channels, and

$$z = \prod_{m=1}^n a_m,\qquad y = \mathrm{irfft2}\big(R^{(1)}\odot\hat z_{[:m_1,:m_2]} +
R^{(2)}\odot\hat z_{[-m_1:,:m_2]}\big),\qquad \hat z = \mathrm{rfft2}(z),$$

with channel-diagonal complex weights $R^{(1)}, R^{(2)}\in\mathbb C^{C\times m_1\times m_2}$ on
the two corners of the full first axis (``SpectralConv_2D_diag``; the corners are placed in two
zero buffers and *added*, so overlapping corners sum). The pointwise product is an explicit mode
mixer: $\hat z_k = N^{-(n-1)}\sum_{k_1+\dots+k_n\equiv k}\hat a_{1,k_1}\cdots\hat a_{n,k_n}$, so the
retained output modes see $n$-linear interactions of *all* input modes (check
``explicit_mode_mixer``). $n = 1$ is a channel-diagonal FNO layer on $P x$.

Block (``HO_block``, inference mode)
------------------------------------
$$x \leftarrow x + \mathrm{crop}\big(\mathrm{HO}(\mathrm{pad}(\mathrm{RMSNorm}_1 x))\big),\qquad
x \leftarrow x + W_2\,\mathrm{GELU}(W_1\,\mathrm{RMSNorm}_2x + b_1) + b_2,$$

``RMSNorm2D``: $x/\sqrt{\mathrm{mean}_c x^2 + 10^{-6}}\odot g$ over channels. With
``two_thirds_zero_padding`` the normalised field is zero-padded at the end of each spatial axis
by $\lfloor 2H/3\rfloor$, $\lfloor 2W/3\rfloor$ before ``HO_Conv`` and cropped after — upstream's
"2/3 rule" is this *spatial* padding (like FNO's domain padding for non-periodic data), not the
spectral 2/3-rule truncation of pseudo-spectral de-aliasing. DropPath and Dropout are the
identity at inference (upstream's ``eval()``); training-time stochastic depth is not implemented.

Backward
--------
Spectral part: $\bar{\hat y} = $ ``irfftn_adjoint``$(\bar y)$;
$\bar{\hat z}_{\text{corner}} \mathrel{+}= \overline{R}\odot\bar{\hat y}_{\text{corner}}$,
$\bar R = \sum_b\overline{\hat z}\odot\bar{\hat y}$ (real and imaginary parts to the ``_real`` /
``_imag`` keys); $\bar z = $ ``rfftn_adjoint``$(\bar{\hat z})$. Product rule:
$\bar a_m = \bar z\prod_{m'\ne m}a_{m'}$ (prefix/suffix products, no division). Projection:
$\bar W_P = \sum\bar a^\top x$, $\bar b_P = \sum\bar a$, $\bar x = \bar aW_P$. Crop/pad are an
adjoint pair. The norms, GELU and linear layers use :mod:`refattn.nn`'s VJPs.

Conventions
-----------
* Parameters (upstream ``state_dict`` names, ``HO_block`` prefixes): ``HO_conv.proj.weight``
  ``(nC, C, 1, 1)`` (PyTorch conv layout, as is), ``HO_conv.proj.bias``,
  ``HO_conv.spec_convs.weights{1,2}_{real,imag}`` ``(C, m1, m2)`` (upstream's complex
  ``weights1``/``weights2``), ``norm1.weight``/``norm2.weight`` ``(C,)`` (upstream
  ``(1, 1, 1, C)``: ``.reshape(-1)``), ``MLP.0.weight`` ``(C, eC)`` (= ``MLP.0.weight.T``),
  ``MLP.0.bias``, ``MLP.3.weight`` ``(eC, C)``, ``MLP.3.bias``.
* FFT normalisation ``"backward"`` (torch default); upstream casts to float32 before the FFT,
  refattn computes in the input dtype.
* ``HO_SpectralConv_2D`` in ``layers/spectral_convs.py`` (spatial-RMS-normalised projections,
  one corner, channel-mixing weights) is not used by any upstream model and not implemented.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_choice, check_int, check_params, check_positive, compute_dtype
from ..nn.activations import gelu, gelu_grad
from ..nn.linear import linear_apply, linear_vjp
from ..nn.norms import rms_norm_backward, rms_norm_forward
from ..registry import Mechanism, Sample, register
from .common import irfftn_adjoint, rfftn_adjoint
from .fno import fno_spectral_conv

__all__ = ["ho_spectral_conv_forward", "ho_spectral_conv_backward", "ho_spectral_conv", "ho_block_forward",
           "ho_block_backward", "ho_block", "two_thirds_padding"]

_SPEC = ("weights1_real", "weights1_imag", "weights2_real", "weights2_imag")


def two_thirds_padding(h: int, w: int) -> tuple[int, int]:
    """Upstream ``_pad_2_3_rule``'s end padding: ``(int(2h/3), int(2w/3))``."""
    return int((2 * h) / 3), int((2 * w) / 3)


def _corners(h, m1, m2):
    return (("weights1", (slice(None), slice(0, m1), slice(0, m2))),
            ("weights2", (slice(None), slice(h - m1, h), slice(0, m2))))


def _ho_core(x, p, order, prefix):
    """Unvalidated ``HO_Conv`` on channel-last ``x (B, H, W, C)``; returns ``(y, cache)``."""
    wp = p[f"{prefix}proj.weight"][:, :, 0, 0]
    a = linear_apply(x, wp.T, p[f"{prefix}proj.bias"])
    c = a.shape[-1] // order
    chunks = [a[..., m * c:(m + 1) * c] for m in range(order)]
    z = chunks[0]
    for ch in chunks[1:]:
        z = z * ch
    h, w = z.shape[1:3]
    m1, m2 = p[f"{prefix}spec_convs.weights1_real"].shape[1:]
    Z = np.fft.rfft2(z, axes=(1, 2))
    Y = np.zeros_like(Z)
    for name, idx in _corners(h, m1, m2):
        R = p[f"{prefix}spec_convs.{name}_real"] + 1j * p[f"{prefix}spec_convs.{name}_imag"]
        Y[(slice(None),) + idx[1:] + (slice(None),)] += Z[(slice(None),) + idx[1:] + (slice(None),)] * \
            np.moveaxis(R, 0, -1)
    y = np.fft.irfft2(Y, s=(h, w), axes=(1, 2)).astype(x.dtype, copy=False)
    return y, {"x": x, "chunks": chunks, "Z": Z, "wp": wp, "order": order, "prefix": prefix, "hw": (h, w),
               "modes": (m1, m2)}


def _ho_core_vjp(g, c, p, grads):
    prefix, (h, w), (m1, m2) = c["prefix"], c["hw"], c["modes"]
    dt = c["x"].dtype
    dY = irfftn_adjoint(g, (1, 2))
    dZ = np.zeros_like(c["Z"])
    for name, idx in _corners(h, m1, m2):
        sl = (slice(None),) + idx[1:] + (slice(None),)
        R = np.moveaxis(p[f"{prefix}spec_convs.{name}_real"] + 1j * p[f"{prefix}spec_convs.{name}_imag"], 0, -1)
        dZ[sl] += np.conj(R) * dY[sl]
        dR = np.moveaxis(np.sum(np.conj(c["Z"][sl]) * dY[sl], axis=0), -1, 0)
        grads[f"{prefix}spec_convs.{name}_real"] = dR.real.astype(dt)
        grads[f"{prefix}spec_convs.{name}_imag"] = dR.imag.astype(dt)
    dz = rfftn_adjoint(dZ, (h, w), (1, 2)).astype(dt, copy=False)
    chunks, n = c["chunks"], c["order"]
    prefix_prod = [np.ones_like(dz)]
    for ch in chunks[:-1]:
        prefix_prod.append(prefix_prod[-1] * ch)
    suffix = np.ones_like(dz)
    da = [None] * n
    for m in range(n - 1, -1, -1):
        da[m] = dz * prefix_prod[m] * suffix
        suffix = suffix * chunks[m]
    da = np.concatenate(da, axis=-1)
    gl = linear_vjp(da, c["x"], c["wp"].T)
    grads[f"{prefix}proj.weight"] = gl["weight"].T[:, :, None, None]
    grads[f"{prefix}proj.bias"] = gl["bias"]
    return gl["x"]


def _validate_core(x, params, order, prefix, extra_spec=None):
    x = as_float(x, "x", ndim=4)
    order = check_int(order, "order", minimum=1)
    b, h, w, c = x.shape
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of arrays; got {type(params).__name__}")
    w1 = params.get(f"{prefix}spec_convs.weights1_real")
    modes = as_float(w1, f"{prefix}spec_convs.weights1_real", ndim=3).shape[1:] if w1 is not None else (1, 1)
    spec = {f"{prefix}proj.weight": (order * c, c, 1, 1), f"{prefix}proj.bias": (order * c,)}
    spec.update({f"{prefix}spec_convs.{k}": (c,) + tuple(modes) for k in _SPEC})
    spec.update(extra_spec or {})
    p = check_params(params, spec)
    return x, p, order, modes


def _check_modes(modes, h, w, prefix):
    if modes[0] > h or modes[1] > w // 2 + 1:
        raise ValueError(f"{prefix}spec_convs weights keep modes {tuple(modes)}: need m1 <= H = {h} and "
                         f"m2 <= W//2+1 = {w // 2 + 1} on the (padded) grid")


def ho_spectral_conv_forward(x, params, *, order: int = 2):
    r"""Higher-order spectral convolution (upstream ``HO_Conv``; module docstring).

    Parameters
    ----------
    x : array (B, H, W, C)
        Channel-last grid function (upstream ``HO_Conv`` input layout).
    params : dict
        ``proj.weight (order*C, C, 1, 1)``, ``proj.bias (order*C,)``,
        ``spec_convs.weights{1,2}_{real,imag} (C, m1, m2)``.
    order : int
        $n$, the number of projected chunks multiplied (upstream default 2).

    Returns
    -------
    out, cache
        ``out (B, H, W, C)``.
    """
    x, p, order, modes = _validate_core(x, params, order, "")
    _check_modes(modes, x.shape[1], x.shape[2], "")
    dt = compute_dtype(x, *p.values())
    y, c = _ho_core(x.astype(dt, copy=False), cast_all(dt, p), order, "")
    return y, {"core": c, "p": cast_all(dt, p), "shape": y.shape, "dt": dt}


def ho_spectral_conv_backward(dout, cache):
    """Gradients ``{"x", "proj.weight", "proj.bias", "spec_convs.weights{1,2}_{real,imag}"}``."""
    g = as_dout(dout, cache["shape"], cache["dt"])
    grads = {}
    grads["x"] = _ho_core_vjp(g, cache["core"], cache["p"], grads)
    return grads


def ho_spectral_conv(x, params, *, order: int = 2) -> np.ndarray:
    """Convenience wrapper: the output of :func:`ho_spectral_conv_forward`."""
    return ho_spectral_conv_forward(x, params, order=order)[0]


def ho_block_forward(x, params, *, order: int = 2, two_thirds_zero_padding: bool = False, eps: float = 1e-6,
                     approximate: str = "none"):
    r"""HO-FNO block (upstream ``HO_block`` in eval mode; module docstring).

    Parameters
    ----------
    x : array (B, H, W, C)
    params : dict
        ``HO_conv.*`` (as :func:`ho_spectral_conv_forward` with that prefix), ``norm1.weight``,
        ``norm2.weight`` ``(C,)``, ``MLP.0.weight (C, eC)``, ``MLP.0.bias``, ``MLP.3.weight (eC, C)``,
        ``MLP.3.bias``.
    order : int
        Order of the spectral product (upstream's ``order``).
    two_thirds_zero_padding : bool
        Upstream's spatial end padding by ``int(2n/3)`` around ``HO_conv`` (default False).
    eps : float
        ``RMSNorm2D`` eps (1e-6).
    approximate : {"none", "tanh"}
        GELU form (``nn.GELU()`` default ``"none"``).
    """
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of arrays; got {type(params).__name__}")
    xa = as_float(x, "x", ndim=4)
    c = xa.shape[3]
    w0 = params.get("MLP.0.weight")
    hidden = as_float(w0, "MLP.0.weight", ndim=2).shape[1] if w0 is not None else c
    extra = {"norm1.weight": (c,), "norm2.weight": (c,), "MLP.0.weight": (c, hidden), "MLP.0.bias": (hidden,),
             "MLP.3.weight": (hidden, c), "MLP.3.bias": (c,)}
    x, p, order, modes = _validate_core(xa, params, order, "HO_conv.", extra)
    if not isinstance(two_thirds_zero_padding, (bool, np.bool_)):
        raise TypeError(f"two_thirds_zero_padding must be a bool; got {type(two_thirds_zero_padding).__name__}")
    eps = check_positive(eps, "eps")
    check_choice(approximate, "approximate", ("none", "tanh"))
    b, h, w, _ = x.shape
    ph, pw = two_thirds_padding(h, w) if two_thirds_zero_padding else (0, 0)
    _check_modes(modes, h + ph, w + pw, "HO_conv.")
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    n1, cn1 = rms_norm_forward(x, {"weight": p["norm1.weight"]}, eps=eps)
    y, cc = _ho_core(np.pad(n1, [(0, 0), (0, ph), (0, pw), (0, 0)]), p, order, "HO_conv.")
    x1 = x + y[:, :h, :w]
    n2, cn2 = rms_norm_forward(x1, {"weight": p["norm2.weight"]}, eps=eps)
    pre = linear_apply(n2, p["MLP.0.weight"], p["MLP.0.bias"])
    act = gelu(pre, approximate)
    out = x1 + linear_apply(act, p["MLP.3.weight"], p["MLP.3.bias"])
    return out, {"p": p, "cn1": cn1, "cc": cc, "cn2": cn2, "n2": n2, "pre": pre, "act": act, "approx": approximate,
                 "shape": out.shape, "dt": dt}


def ho_block_backward(dout, cache):
    """Gradients of :func:`ho_block_forward`: ``x`` and every parameter."""
    g = as_dout(dout, cache["shape"], cache["dt"])
    p, grads = cache["p"], {}
    g3 = linear_vjp(g, cache["act"], p["MLP.3.weight"])
    grads["MLP.3.weight"], grads["MLP.3.bias"] = g3["weight"], g3["bias"]
    g0 = linear_vjp(g3["x"] * gelu_grad(cache["pre"], cache["approx"]), cache["n2"], p["MLP.0.weight"])
    grads["MLP.0.weight"], grads["MLP.0.bias"] = g0["weight"], g0["bias"]
    gn2 = rms_norm_backward(g0["x"], cache["cn2"])
    grads["norm2.weight"] = gn2["weight"]
    gx1 = g + gn2["x"]
    h, w = gx1.shape[1:3]
    gy = np.pad(gx1, [(0, 0), (0, cache["cc"]["hw"][0] - h), (0, cache["cc"]["hw"][1] - w), (0, 0)])
    dn1 = _ho_core_vjp(gy, cache["cc"], p, grads)[:, :h, :w]
    gn1 = rms_norm_backward(dn1, cache["cn1"])
    grads["norm1.weight"] = gn1["weight"]
    grads["x"] = gx1 + gn1["x"]
    return grads


def ho_block(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`ho_block_forward`."""
    return ho_block_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _core_params(rng, c, order, m1, m2, prefix=""):
    p = {f"{prefix}proj.weight": rng.standard_normal((order * c, c, 1, 1)) / np.sqrt(c),
         f"{prefix}proj.bias": 0.5 * rng.standard_normal(order * c)}
    p.update({f"{prefix}spec_convs.{k}": rng.standard_normal((c, m1, m2)) for k in _SPEC})
    return p


def _sample(rng, size):
    if size == "tiny":
        h, w, c, order, m1, m2, hid, pad = 4, 4, 2, 2, 2, 2, 3, False
    else:
        h, w, c, order, hid = 6, 8, 3, int(rng.integers(1, 4)), 5
        pad = bool(rng.integers(0, 2))
        m1, m2 = 3, 4
    p = _core_params(rng, c, order, m1, m2, "HO_conv.")
    p.update({"norm1.weight": rng.uniform(0.5, 1.5, c), "norm2.weight": rng.uniform(0.5, 1.5, c),
              "MLP.0.weight": rng.standard_normal((c, hid)) / np.sqrt(c), "MLP.0.bias": 0.1 * rng.standard_normal(hid),
              "MLP.3.weight": rng.standard_normal((hid, c)) / np.sqrt(hid), "MLP.3.bias": 0.1 * rng.standard_normal(c)})
    return Sample(inputs={"x": rng.standard_normal((2, h, w, c))}, params=p,
                  config={"order": order, "two_thirds_zero_padding": pad})


def _dft_mats(n, freqs):
    return np.exp(-2j * np.pi * np.outer(freqs, np.arange(n)) / n)


def _ho_reference(x, p, order, prefix=""):
    # Explicit DFT sums over the kept corner modes, the inverse written with the Hermitian
    # weights c_k of the halved axis.
    b, h, w, c = x.shape
    a = np.einsum("bhwi,oi->bhwo", x, p[f"{prefix}proj.weight"][:, :, 0, 0]) + p[f"{prefix}proj.bias"]
    z = np.prod(np.stack(np.split(a, order, axis=-1)), axis=0)
    m1, m2 = p[f"{prefix}spec_convs.weights1_real"].shape[1:]
    cw = np.where((np.arange(m2) == 0) | ((w % 2 == 0) & (np.arange(m2) == w // 2)), 1.0, 2.0)
    out = 0.0
    for name, rows in (("weights1", np.arange(m1)), ("weights2", np.arange(h - m1, h))):
        A, B = _dft_mats(h, rows), _dft_mats(w, np.arange(m2))
        Zk = np.einsum("ks,lt,bstc->bklc", A, B, z)
        R = p[f"{prefix}spec_convs.{name}_real"] + 1j * p[f"{prefix}spec_convs.{name}_imag"]
        Yk = Zk * np.moveaxis(R, 0, -1)
        out = out + np.einsum("l,bklc,ks,lt->bstc", cw, Yk, np.conj(A), np.conj(B)).real / (h * w)
    return out


def _reference(x, params, *, order=2, two_thirds_zero_padding=False, eps=1e-6, approximate="none"):
    def rms(t, g):
        return t / np.sqrt(np.mean(t * t, axis=-1, keepdims=True) + eps) * g
    h, w = x.shape[1:3]
    ph, pw = two_thirds_padding(h, w) if two_thirds_zero_padding else (0, 0)
    n1 = np.pad(rms(x, params["norm1.weight"]), [(0, 0), (0, ph), (0, pw), (0, 0)])
    x1 = x + _ho_reference(n1, params, order, "HO_conv.")[:, :h, :w]
    hid = gelu(rms(x1, params["norm2.weight"]) @ params["MLP.0.weight"] + params["MLP.0.bias"], approximate)
    return x1 + hid @ params["MLP.3.weight"] + params["MLP.3.bias"]


def _check_order_one_is_diagonal_fno(rng):
    # n = 1: the layer is refattn's FNO spectral convolution (two corners) with diagonal channel
    # weights, applied to the 1x1 projection.
    c, m1, m2 = 3, 2, 3
    x = rng.standard_normal((2, 6, 7, c))
    p = _core_params(rng, c, 1, m1, m2)
    fno = {k.replace("spec_convs.", ""): np.einsum("ij,ikl->ijkl", np.eye(c), p[k]) for k in p if "spec_convs" in k}
    proj = x @ p["proj.weight"][:, :, 0, 0].T + p["proj.bias"]
    err = float(np.abs(ho_spectral_conv(x, p, order=1) - fno_spectral_conv(proj, fno)).max())
    assert err < 1e-13, f"order-1 HO conv differs from the diagonal FNO layer by {err:.2e}"
    return err


def _check_explicit_mode_mixer(rng):
    # order 2 and 3: every kept output mode is W(k) times the n-fold circular convolution of the
    # chunk spectra, divided by N^(n-1) — the explicit mode mixer of the paper.
    h, w, c, m1, m2 = 5, 6, 2, 2, 3
    worst = 0.0
    for order in (2, 3):
        x = rng.standard_normal((1, h, w, c))
        p = _core_params(rng, c, order, m1, m2)
        a = x @ p["proj.weight"][:, :, 0, 0].T + p["proj.bias"]
        spec = np.fft.fft2(np.stack(np.split(a, order, axis=-1)), axes=(2, 3))      # (n, 1, h, w, c)
        mixed = spec[0]
        for s in spec[1:]:
            conv = np.zeros_like(mixed)
            for k1 in range(h):
                for k2 in range(w):
                    conv += mixed[:, k1, k2][:, None, None] * np.roll(s, (k1, k2), axis=(1, 2))
            mixed = conv / (h * w)
        Zk = np.fft.rfft2(np.prod(np.stack(np.split(a, order, axis=-1)), axis=0), axes=(1, 2))
        worst = max(worst, float(np.abs(mixed[:, :, : w // 2 + 1] - Zk).max() / np.abs(Zk).max()))
        worst = max(worst, float(np.abs(ho_spectral_conv(x, p, order=order) - _ho_reference(x, p, order)).max()))
    assert worst < 1e-12, f"the HO product is not the explicit n-linear mode mixer: {worst:.2e}"
    return worst


register(
    Mechanism(
        slug="ho_fno_higher_order_spectral_conv", family="3-operator", tier="T2",
        title="HO-FNO: higher-order (n-linear) spectral convolution and the HO-FNO block",
        paper="Colagrande, Caillon, Feillet, Allauzen, Higher-Order Fourier Neural Operator: Explicit Mode Mixer for "
              "Nonlinear PDEs, arXiv 2606.28122 (2026)",
        forward=ho_block_forward, backward=ho_block_backward, sample=_sample, reference=_reference,
        docs="operators/convolutional-and-wavelet-operators.md#higher-order-fourier-neural-operator",
        checks={"order_one_is_diagonal_fno": _check_order_one_is_diagonal_fno,
                "explicit_mode_mixer": _check_explicit_mode_mixer},
    ),
)
