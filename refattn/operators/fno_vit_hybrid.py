r"""Hybrid FNO + transformer scattering operator: smooth background by an FNO, high-contrast correction by a ViT.

Paper: Balaji, Teolis, Mis, Lara Benitez, Wang, de Hoop, "Hybrid operator learning of wave
scattering maps in high-contrast media", arXiv 2602.11197 (2026). Upstream:
davidMis/hybrid-operator-learning-of-wave-scattering-maps-in-high-contrast-media
``helmholtz_hybrid/hybrid_finetuning.py`` (``FrozenFNOHybridOperator.forward``) @
86c2784b06e04a9e6df89acdd2cee4c818c978e5, and ``README.md`` @
07335b635ce03b0053fbaefdccf33f0528341273 (the three tasks and how the hybrid composes them).

Which part of the model
-----------------------
The mechanism is the **operator decomposition** $p = p_{bg} + \delta p$: the velocity model is
split as $v = v_s + v_\delta$ (a smoothed background and the high-contrast remainder), an FNO maps
$v_s \mapsto p_s$, and a transformer maps the pair $(v_\delta, p_s)$ to the scattering correction
$\delta p$; upstream's forward is exactly

$$p = F(v_s) + T\big([v_\delta,\ F(v_s)]\big)\qquad(\text{channels } [v_\delta, p_s] \text{ in that order}).$$

Upstream trains $F$ on ``smooth2smooth`` and $T$ on ``contrast`` separately (and optionally
fine-tunes $T$ end to end with $F$ frozen under ``no_grad``); training recipes stay in the docs.
This module implements the composition with both sub-networks built from refattn primitives.

Sub-networks (reconstruction)
-----------------------------
Upstream's $F$ is neuraloperator's ``FNO`` and its $T$ is Poseidon's scOT (a SwinV2 U-Net, whose
block is refattn's ``scot_layer``); neither library can be installed here and the paper describes
$T$ as a vision transformer. The layer keeps upstream's composition and attribute names
(``smooth_model``, ``contrast_model``) and uses, as the simplest reading:

* $F$ (Li et al.'s FNO stack, channel-last): lifting $h_0 = v_sW_\ell + b_\ell$, blocks
  $h_{l+1} = \sigma(\mathcal K_l h_l + h_lW_l + b_l)$ with $\mathcal K_l$ refattn's
  ``fno_spectral_conv`` (two kept corners) and $\sigma$ = GELU except after the last block, then the
  projection $p_s = h_LW_p + b_p$ ($C_p$ channels; 2 for the real and imaginary parts of the
  pressure).
* $T$ (a timm-style ViT without class token): ``vit_patch_embedding`` of the $1 + C_p$ channels
  (conv patchify, learned positions), pre-norm blocks
  $z \leftarrow z + \mathrm{MHA}(\mathrm{LN}_1 z)$, $z \leftarrow z + \mathrm{MLP}(\mathrm{LN}_2 z)$
  (GELU, LayerNorm eps 1e-6), a final LayerNorm, a linear head to $C_pP^2$ per token and
  ``unpatchify``.

Backward
--------
With $\bar p$ the output gradient: $\overline{\delta p} = \bar p$ runs back through $T$ (head,
LayerNorm, blocks via the MHA / LayerNorm / MLP VJPs, the patch embedding) to
$\overline{[v_\delta, p_s]}$; then $\bar p_s = \bar p + \overline{[\cdot]}_{p_s}$ (the background
reaches the output directly *and* through the corrector's input) runs back through $F$ (linear VJPs,
GELU, ``fno_spectral_conv_backward``), giving $\bar v_s$; $\bar v_\delta$ is the corrector-input
slice. Upstream's fine-tuning freezes $F$ (``requires_grad_(False)`` and ``no_grad``): that is a
training choice, not a property of the map; drop the ``smooth_model.*`` and ``v_smooth`` gradients
to reproduce it.

Conventions
-----------
* Input ``x (B, 2, H, W)`` with channels ``[v_smooth, v_delta]`` and output ``(B, C_p, H, W)``,
  channel-first as ``FrozenFNOHybridOperator.forward``.
* Parameter keys: ``smooth_model.lifting.{weight,bias}``, ``smooth_model.fno_blocks.{l}.weights{1,2}_{real,imag}``,
  ``smooth_model.fno_blocks.{l}.skip.{weight,bias}``, ``smooth_model.projection.{weight,bias}``;
  ``contrast_model.patch_embed.proj.{weight,bias}`` (conv layout), ``contrast_model.pos_embed
  (1, N, D)``, ``contrast_model.blocks.{l}.{norm1,norm2}.*``, ``...attn.{q,k,v,out}_proj[_bias]``,
  ``...mlp.fc{1,2}.*``, ``contrast_model.norm.*``, ``contrast_model.head.*``. Widths, depths,
  modes and the patch size are read from the shapes; ``num_heads`` is a keyword.
* FFT normalisation ``"backward"`` (the discretisation-invariant one; neuraloperator's default
  ``"forward"`` differs by a constant absorbed into the weights).

Agreement
---------
No upstream sub-network can run here (neuraloperator and Poseidon are not installed), so a
scratch script (``/tmp/scratch-o5b``, not committed) transcribes ``FrozenFNOHybridOperator.forward``
(without the ``no_grad``) with the two reconstructed sub-networks written in torch (``torch.fft``
spectral convolution, ``nn.Conv2d`` patchify, ``nn.MultiheadAttention`` pre-norm blocks);
float64, CPU, torch 2.13, $16\times12$ grid, FNO width 4 with 2 blocks and modes (3, 3),
$C_p = 2$, ViT width 8, 2 heads, 2 blocks, MLP 16, patch 4, batch 2, three seeds: output max abs
error 5.8e-15 (1.5e-15 relative to the largest entry), worst gradient over the input and every
parameter 1.6e-13 abs, 8.4e-15 relative to its array's largest entry (the key-projection biases'
gradients are structurally zero, ~1e-15 in both, and left out of the relative figure). This
checks the composition and refattn's VJPs, not upstream's sub-networks.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_int, check_params, compute_dtype
from ..attention.softmax.mha import mha_backward, mha_forward
from ..blocks.core import mlp_backward, mlp_forward, norm_backward, norm_forward
from ..blocks.patch_embed import patchify, unpatchify, vit_patch_embedding_backward, vit_patch_embedding_forward
from ..nn.activations import gelu, gelu_grad
from ..nn.linear import linear_prefixed, linear_prefixed_spec, linear_prefixed_vjp
from ..registry import Mechanism, Sample, register
from .fno import fno_spectral_conv_backward, fno_spectral_conv_forward

__all__ = ["fno_vit_hybrid_param_shapes", "fno_vit_hybrid_forward", "fno_vit_hybrid_backward", "fno_vit_hybrid",
           "init_fno_vit_hybrid_params"]

_S, _C = "smooth_model", "contrast_model"
_MHA_KEYS = ("q_proj", "k_proj", "v_proj", "out_proj")
_LN_EPS = 1e-6


def fno_vit_hybrid_param_shapes(grid, *, fno_width: int, fno_layers: int, modes, out_channels: int = 2,
                                vit_dim: int, vit_depth: int, patch_size: int, mlp_hidden: int) -> dict:
    """``{key: shape}`` of the hybrid (module docstring) for a grid ``(H, W)``."""
    h, w = grid
    m1, m2 = modes
    s = dict(linear_prefixed_spec(f"{_S}.lifting", 1, fno_width))
    for i in range(fno_layers):
        for c in ("weights1", "weights2"):
            for part in ("real", "imag"):
                s[f"{_S}.fno_blocks.{i}.{c}_{part}"] = (fno_width, fno_width, m1, m2)
        s.update(linear_prefixed_spec(f"{_S}.fno_blocks.{i}.skip", fno_width, fno_width))
    s.update(linear_prefixed_spec(f"{_S}.projection", fno_width, out_channels))
    n = (h // patch_size) * (w // patch_size)
    d = vit_dim
    s[f"{_C}.patch_embed.proj.weight"] = (d, 1 + out_channels, patch_size, patch_size)
    s[f"{_C}.patch_embed.proj.bias"] = (d,)
    s[f"{_C}.pos_embed"] = (1, n, d)
    for i in range(vit_depth):
        pre = f"{_C}.blocks.{i}"
        for nm in ("norm1", "norm2"):
            s.update({f"{pre}.{nm}.weight": (d,), f"{pre}.{nm}.bias": (d,)})
        for k in _MHA_KEYS:
            s[f"{pre}.attn.{k}"] = (d, d)
            s[f"{pre}.attn.{k}_bias"] = (d,)
        s.update(linear_prefixed_spec(f"{pre}.mlp.fc1", d, mlp_hidden))
        s.update(linear_prefixed_spec(f"{pre}.mlp.fc2", mlp_hidden, d))
    s.update({f"{_C}.norm.weight": (d,), f"{_C}.norm.bias": (d,)})
    s.update(linear_prefixed_spec(f"{_C}.head", d, out_channels * patch_size * patch_size))
    return s


def _count(params, fmt):
    n = 0
    while fmt.format(n) in params:
        n += 1
    return n


def _validate(x, params, num_heads):
    x = as_float(x, "x", ndim=4)
    if x.shape[1] != 2:
        raise ValueError(f"x must have shape (B, 2, H, W) with channels [v_smooth, v_delta]; got {x.shape}")
    heads = check_int(num_heads, "num_heads", minimum=1)
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of arrays; got {type(params).__name__}")
    need = (f"{_S}.lifting.weight", f"{_S}.fno_blocks.0.weights1_real", f"{_S}.projection.weight",
            f"{_C}.patch_embed.proj.weight", f"{_C}.blocks.0.mlp.fc1.weight")
    for k in need:
        if params.get(k) is None:
            raise ValueError(f"params is missing {k!r} (see fno_vit_hybrid_param_shapes)")
    width = as_float(params[need[0]], need[0], ndim=2).shape[1]
    modes = as_float(params[need[1]], need[1], ndim=4).shape[2:]
    c_out = as_float(params[need[2]], need[2], ndim=2).shape[1]
    pw = as_float(params[need[3]], need[3], ndim=4)
    d, patch = pw.shape[0], pw.shape[2]
    hidden = as_float(params[need[4]], need[4], ndim=2).shape[1]
    h, w = x.shape[2:]
    if h % patch or w % patch:
        raise ValueError(f"the grid ({h}, {w}) of x must be a multiple of the patch size {patch} "
                         f"(axis 2 of {need[3]})")
    if 2 * modes[0] > h or modes[1] > w // 2 + 1:
        raise ValueError(f"the FNO modes {tuple(modes)} do not fit the grid ({h}, {w}): need 2*m1 <= H and "
                         f"m2 <= W//2+1")
    if d % heads:
        raise ValueError(f"num_heads ({heads}) must divide the ViT width {d} (axis 0 of {need[3]})")
    spec = fno_vit_hybrid_param_shapes((h, w), fno_width=width, fno_layers=_count(params, _S + ".fno_blocks.{}.skip.weight"),
                                       modes=modes, out_channels=c_out, vit_dim=d,
                                       vit_depth=_count(params, _C + ".blocks.{}.mlp.fc1.weight"), patch_size=patch,
                                       mlp_hidden=hidden)
    p = check_params(params, spec, where="fno_vit_hybrid")
    dt = compute_dtype(x, *p.values())
    return x.astype(dt, copy=False), cast_all(dt, p), heads, dt


def _fno(v, p):
    # channel-last background FNO: (B, H, W, 1) -> (B, H, W, C_p)
    h = linear_prefixed(p, f"{_S}.lifting", v)
    layers = _count(p, _S + ".fno_blocks.{}.skip.weight")
    tape = []
    for i in range(layers):
        pre = f"{_S}.fno_blocks.{i}"
        k, ck = fno_spectral_conv_forward(h, {c: p[f"{pre}.{c}"] for c in _spectral_keys()})
        a = k + linear_prefixed(p, f"{pre}.skip", h)
        tape.append((h, ck, a))
        h = gelu(a) if i < layers - 1 else a
    return linear_prefixed(p, f"{_S}.projection", h), (v, tape, h)


def _spectral_keys():
    return tuple(f"weights{j}_{part}" for j in (1, 2) for part in ("real", "imag"))


def _fno_vjp(g, p, cache, grads):
    v, tape, h_last = cache
    g = linear_prefixed_vjp(grads, p, f"{_S}.projection", g, h_last)
    for i in reversed(range(len(tape))):
        pre = f"{_S}.fno_blocks.{i}"
        h, ck, a = tape[i]
        if i < len(tape) - 1:
            g = g * gelu_grad(a)
        r = fno_spectral_conv_backward(g, ck)
        for c in _spectral_keys():
            grads[f"{pre}.{c}"] = r[c]
        g = r["x"] + linear_prefixed_vjp(grads, p, f"{pre}.skip", g, h)
    return linear_prefixed_vjp(grads, p, f"{_S}.lifting", g, v)


def _vit(z_in, p, heads):
    emb = {"patch_embed.proj.weight": p[f"{_C}.patch_embed.proj.weight"],
           "patch_embed.proj.bias": p[f"{_C}.patch_embed.proj.bias"], "pos_embed": p[f"{_C}.pos_embed"]}
    z, ce = vit_patch_embedding_forward(z_in, emb, class_token=False)
    caches = []
    for i in range(_count(p, _C + ".blocks.{}.mlp.fc1.weight")):
        pre = f"{_C}.blocks.{i}"
        h1, c1 = norm_forward(p, f"{pre}.norm1", z, eps=_LN_EPS)
        mp = {k: p[f"{pre}.attn.{k}"] for k in _MHA_KEYS} | {f"{k}_bias": p[f"{pre}.attn.{k}_bias"] for k in _MHA_KEYS}
        a, ca = mha_forward(h1, None, mp, num_heads=heads)
        z = z + a
        h2, c2 = norm_forward(p, f"{pre}.norm2", z, eps=_LN_EPS)
        m, cm = mlp_forward(p, h2, fc1=f"{pre}.mlp.fc1", fc2=f"{pre}.mlp.fc2", activation="gelu")
        z = z + m
        caches.append((pre, c1, ca, c2, cm))
    zn, cn = norm_forward(p, f"{_C}.norm", z, eps=_LN_EPS)
    return linear_prefixed(p, f"{_C}.head", zn), (ce, caches, cn, zn)


def _vit_vjp(g, p, cache, grads):
    ce, caches, cn, zn = cache
    g = norm_backward(grads, p, linear_prefixed_vjp(grads, p, f"{_C}.head", g, zn), cn)
    for pre, c1, ca, c2, cm in reversed(caches):
        g = g + norm_backward(grads, p, mlp_backward(grads, p, g, cm), c2)
        r = mha_backward(g, ca)
        for k in _MHA_KEYS:
            grads[f"{pre}.attn.{k}"], grads[f"{pre}.attn.{k}_bias"] = r[k], r[f"{k}_bias"]
        g = g + norm_backward(grads, p, r["x"], c1)
    r = vit_patch_embedding_backward(g, ce)
    grads[f"{_C}.patch_embed.proj.weight"] = r["patch_embed.proj.weight"]
    grads[f"{_C}.patch_embed.proj.bias"] = r["patch_embed.proj.bias"]
    grads[f"{_C}.pos_embed"] = r["pos_embed"]
    return r["x"]


def fno_vit_hybrid_forward(x, params, *, num_heads: int):
    r"""$p = F(v_s) + T([v_\delta, F(v_s)])$ (``FrozenFNOHybridOperator.forward``; module docstring).

    Parameters
    ----------
    x : array (B, 2, H, W)
        Channels ``[v_smooth, v_delta]`` (upstream's input layout).
    params : dict
        :func:`fno_vit_hybrid_param_shapes` keys.
    num_heads : int
        Heads of the transformer corrector.

    Returns
    -------
    out, cache
        ``out (B, C_p, H, W)``: background plus scattering correction.
    """
    x, p, heads, dt = _validate(x, params, num_heads)
    v_s = x[:, 0, :, :, None]
    p_s, cf = _fno(v_s, p)                                           # (B, H, W, C_p)
    p_s_cf = np.moveaxis(p_s, -1, 1)
    z_in = np.concatenate([x[:, 1:2], p_s_cf], axis=1)               # [v_delta, p_smooth]
    t, cv = _vit(z_in, p, heads)
    patch = p[f"{_C}.patch_embed.proj.weight"].shape[2]
    h, w = x.shape[2:]
    dp = unpatchify(t, patch, p_s.shape[-1], (h // patch, w // patch))
    out = p_s_cf + dp
    return out, {"p": p, "cf": cf, "cv": cv, "patch": patch, "shape": out.shape, "x_shape": x.shape, "dt": dt}


def fno_vit_hybrid_backward(dout, cache):
    """Gradients of :func:`fno_vit_hybrid_forward`: ``x`` and every params key."""
    p, patch = cache["p"], cache["patch"]
    g = as_dout(dout, cache["shape"], cache["dt"])
    grads = {}
    dz = _vit_vjp(patchify(g, patch), p, cache["cv"], grads)         # (B, 1 + C_p, H, W)
    dps = np.moveaxis(g + dz[:, 1:], 1, -1)
    dvs = _fno_vjp(dps, p, cache["cf"], grads)
    dx = np.empty(cache["x_shape"], dtype=g.dtype)
    dx[:, 0], dx[:, 1] = dvs[..., 0], dz[:, 0]
    grads["x"] = dx
    return grads


def fno_vit_hybrid(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`fno_vit_hybrid_forward`."""
    return fno_vit_hybrid_forward(x, params, **config)[0]


def init_fno_vit_hybrid_params(rng, grid, *, fno_width: int = 32, fno_layers: int = 4, modes=(12, 12),
                               out_channels: int = 2, vit_dim: int = 64, vit_depth: int = 4, patch_size: int = 4,
                               mlp_hidden: int | None = None, dtype=np.float64) -> dict:
    """Random parameters: Linear/conv $U(\\pm1/\\sqrt{\\text{fan-in}})$, spectral weights
    ``U(0, 1) / (width^2)`` (FNO), positions $N(0, 0.02^2)$, LayerNorm 1/0."""
    shapes = fno_vit_hybrid_param_shapes(grid, fno_width=fno_width, fno_layers=fno_layers, modes=modes,
                                         out_channels=out_channels, vit_dim=vit_dim, vit_depth=vit_depth,
                                         patch_size=patch_size, mlp_hidden=mlp_hidden or 4 * vit_dim)
    p = {}
    for k, s in shapes.items():
        if "weights" in k:
            p[k] = rng.uniform(0, 1, s) / (fno_width * fno_width)
        elif k.endswith("pos_embed"):
            p[k] = 0.02 * rng.standard_normal(s)
        elif "norm" in k:
            p[k] = np.ones(s) if k.endswith("weight") else np.zeros(s)
        else:
            wk = k if not k.endswith("bias") else (k[:-5] if k.endswith("_bias") else k[:-4] + "weight")
            ws = shapes[wk]
            fan_in = ws[0] if len(ws) == 2 else int(np.prod(ws[1:]))
            p[k] = rng.uniform(-1 / np.sqrt(fan_in), 1 / np.sqrt(fan_in), s)
    return {k: np.asarray(v, dtype=dtype) for k, v in p.items()}


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size):
    if size == "tiny":
        grid, cfg = (4, 2), dict(fno_width=2, fno_layers=1, modes=(1, 1), vit_dim=4, vit_depth=1, patch_size=2,
                                 mlp_hidden=3)
    else:
        grid, cfg = (8, 6), dict(fno_width=3, fno_layers=2, modes=(2, 2), vit_dim=6, vit_depth=2, patch_size=2,
                                 mlp_hidden=5)
    p = init_fno_vit_hybrid_params(rng, grid, **cfg)
    p = {k: v + 0.3 * rng.standard_normal(v.shape) for k, v in p.items()}
    return Sample(inputs={"x": rng.standard_normal((2, 2) + grid)}, params=p, config={"num_heads": 2})


def _dft_spectral(h, p, pre):
    # the FNO spectral convolution from explicit DFT sums over the kept corners (no FFT)
    b, n1, n2, c = h.shape
    m1, m2 = p[f"{pre}.weights1_real"].shape[2:]
    t1, t2 = np.arange(n1), np.arange(n2)
    out = np.zeros((b, n1, n2, p[f"{pre}.weights1_real"].shape[1]))
    for name, rows in (("weights1", range(m1)), ("weights2", range(n1 - m1, n1))):
        w = p[f"{pre}.{name}_real"] + 1j * p[f"{pre}.{name}_imag"]
        for a, k1 in enumerate(rows):
            for k2 in range(m2):
                phase = np.exp(-2j * np.pi * (k1 * t1[:, None] / n1 + k2 * t2[None, :] / n2))
                xk = np.einsum("bxyc,xy->bc", h, phase)
                yk = xk @ w[:, :, a, k2]
                mult = 1.0 if (k2 == 0 or 2 * k2 == n2) else 2.0   # Hermitian partner of the halved axis
                out += mult * np.real(yk[:, None, None, :] * np.conj(phase)[None, :, :, None]) / (n1 * n2)
    return out


def _reference(x, params, *, num_heads):
    p = params
    h = x[:, 0, :, :, None] @ p[f"{_S}.lifting.weight"] + p[f"{_S}.lifting.bias"]
    layers = _count(p, _S + ".fno_blocks.{}.skip.weight")
    for i in range(layers):
        pre = f"{_S}.fno_blocks.{i}"
        a = _dft_spectral(h, p, pre) + h @ p[f"{pre}.skip.weight"] + p[f"{pre}.skip.bias"]
        h = gelu(a) if i < layers - 1 else a
    ps = np.moveaxis(h @ p[f"{_S}.projection.weight"] + p[f"{_S}.projection.bias"], -1, 1)
    z_in = np.concatenate([x[:, 1:2], ps], axis=1)
    w = p[f"{_C}.patch_embed.proj.weight"]
    d, _, pp, _ = w.shape
    b, _, hh, ww = x.shape
    toks = []
    for r in range(hh // pp):
        for c in range(ww // pp):
            toks.append(np.einsum("bkij,dkij->bd", z_in[:, :, r * pp:(r + 1) * pp, c * pp:(c + 1) * pp], w))
    z = np.stack(toks, 1) + p[f"{_C}.patch_embed.proj.bias"] + p[f"{_C}.pos_embed"]

    def ln(t, pre):
        mu = t.mean(-1, keepdims=True)
        return (t - mu) / np.sqrt(((t - mu) ** 2).mean(-1, keepdims=True) + _LN_EPS) * p[f"{pre}.weight"] + p[f"{pre}.bias"]

    dh = d // num_heads
    for i in range(_count(p, _C + ".blocks.{}.mlp.fc1.weight")):
        pre = f"{_C}.blocks.{i}"
        u = ln(z, f"{pre}.norm1")
        q, k, v = (u @ p[f"{pre}.attn.{n}"] + p[f"{pre}.attn.{n}_bias"] for n in _MHA_KEYS[:3])
        heads = []
        for j in range(num_heads):
            sl = slice(j * dh, (j + 1) * dh)
            s = q[..., sl] @ np.swapaxes(k[..., sl], 1, 2) / np.sqrt(dh)
            e = np.exp(s - s.max(-1, keepdims=True))
            heads.append(e / e.sum(-1, keepdims=True) @ v[..., sl])
        z = z + np.concatenate(heads, -1) @ p[f"{pre}.attn.out_proj"] + p[f"{pre}.attn.out_proj_bias"]
        u = ln(z, f"{pre}.norm2")
        z = z + gelu(u @ p[f"{pre}.mlp.fc1.weight"] + p[f"{pre}.mlp.fc1.bias"]) @ p[f"{pre}.mlp.fc2.weight"] \
            + p[f"{pre}.mlp.fc2.bias"]
    t = ln(z, f"{_C}.norm") @ p[f"{_C}.head.weight"] + p[f"{_C}.head.bias"]
    c_out = ps.shape[1]
    dp = np.zeros_like(ps)
    for r in range(hh // pp):
        for c in range(ww // pp):
            dp[:, :, r * pp:(r + 1) * pp, c * pp:(c + 1) * pp] = t[:, r * (ww // pp) + c].reshape(b, c_out, pp, pp)
    return ps + dp


def _check_zero_head_is_the_background(rng):
    # With the corrector's head zeroed the output is the FNO background alone: it ignores v_delta
    # and equals the reference with the same head; and the corrector does read the background
    # (with v_delta = 0 the correction still varies with v_smooth through p_s).
    s = _sample(rng, "small")
    p = dict(s.params)
    p[f"{_C}.head.weight"] = np.zeros_like(p[f"{_C}.head.weight"])
    p[f"{_C}.head.bias"] = np.zeros_like(p[f"{_C}.head.bias"])
    x = s.inputs["x"]
    x2 = x.copy()
    x2[:, 1] = rng.standard_normal(x2[:, 1].shape)
    err = float(np.abs(fno_vit_hybrid(x, p, **s.config) - fno_vit_hybrid(x2, p, **s.config)).max())
    assert err == 0.0, f"a zero head still depends on v_delta: {err:.2e}"
    x0 = x.copy()
    x0[:, 1] = 0.0
    x1 = x0.copy()
    x1[:, 0] += 1.0
    corr0 = fno_vit_hybrid(x0, s.params, **s.config) - fno_vit_hybrid(x0, p, **s.config)
    corr1 = fno_vit_hybrid(x1, s.params, **s.config) - fno_vit_hybrid(x1, p, **s.config)
    assert np.abs(corr0 - corr1).max() > 1e-6, "the corrector ignores the background pressure"
    return err


register(
    Mechanism(
        slug="fno_vit_scattering_hybrid", family="3-operator", tier="T3",
        official_code="davidMis/hybrid-operator-learning-of-wave-scattering-maps-in-high-contrast-media helmholtz_hybrid/hybrid_finetuning.py@86c2784",
        title="Hybrid FNO background + transformer scattering correction: p = F(v_s) + T([v_delta, F(v_s)])",
        paper="Balaji, Teolis, Mis, Lara Benitez, Wang, de Hoop, Hybrid operator learning of wave scattering maps in "
              "high-contrast media, arXiv 2602.11197 (2026)",
        forward=fno_vit_hybrid_forward, backward=fno_vit_hybrid_backward, sample=_sample, reference=_reference,
        docs="operators/o5b.md#hybrid-fno-background-and-transformer-scattering-correction",
        checks={"zero_head_is_the_background": _check_zero_head_is_the_background},
    ),
)
