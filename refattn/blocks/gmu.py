r"""Gated Memory Unit (GMU): SambaY's cross-decoder layer that gates a shared SSM memory readout.

Ren, Chen, Xu, Kim, Atkinson, Zhan, Sun, Peng, Liu, Wang, Cheng, Gao, Chen, Shen,
"Decoder-Hybrid-Decoder Architecture for Efficient Reasoning with Long Generation" (SambaY;
Phi4-mini-Flash-Reasoning), NeurIPS 2025, arXiv 2507.06607. The paper's GMU is
$y_l = (m'_l\odot\sigma(W_1x_l))W_2$ with $\sigma$ = SiLU. Upstream:
microsoft/ArchScale ``lit_gpt/gated_memory_unit.py`` (``GMU``, ``GMUWrapper``, the ``swiglu``
jiterator kernel and its hand-written backward), ``lit_gpt/ops/layernorm_gated.py``
(``RMSNorm`` with ``norm_before_gate=False``, reference ``rms_norm_ref``) and ``lit_gpt/model.py``
(where GMUs sit) @ df4e0708811ad8d034a306d185f92ad9b5c8e229 (the GMU file; repository HEAD
c2ec1d6903d248842cd1568cc76577e77c96feaa).

Forward
-------
In SambaY's cross-decoder, every other layer's token mixer is a GMU: instead of attending, it
gates the memory $m$ that the last self-decoder SSM layer saved (Mamba's scan output $y$ before its
output gate, ``gmu_save=True``; shape ``(..., N, D)``, $D$ the SSM's inner width) with the current
layer's normalised hidden state $x$ (``(..., N, C)``):

$$z = xW_{in} + b_{in},\qquad h = \mathrm{SiLU}(z)\odot m,\qquad y = hW_{out} + b_{out}$$

(``in_proj (C, D)``, ``out_proj (D, C)``; upstream's kernel ``swiglu(z, m)`` is
$z\,\sigma(z)\,m$). For Mamba-2 / Gated DeltaNet self-decoders (``use_norm=True``) the product is
normalised by a grouped RMSNorm first, $h = w\odot\mathrm{RMS}_g(m\odot\mathrm{SiLU}(z))$ with
groups of $D/G$ channels (``ngroups`` $G$), $\epsilon = 10^{-5}$, weight ``norm.weight (D,)``.

Backward
--------
$dh = dy\,W_{out}^\top$; with the norm, $du = J_{\mathrm{RMS}}^\top(w\odot dh)$ (the uncentred
`refattn.nn.norms.normalize_backward` per group) and $dw = \sum dh\odot\hat u$, else $du = dh$.
Then $dz = du\odot m\odot\mathrm{SiLU}'(z)$, $dm = du\odot\mathrm{SiLU}(z)$, $dx = dz\,W_{in}^\top$,
$dW_{in} = x^\top dz$, $dW_{out} = h^\top dy$. Because every GMU of the cross-decoder reads the
same $m$, a model sums the layers' $dm$ (the named check ``shared_memory_gradient_accumulates``);
upstream's ``swiglu_bwd`` is the same $dz = \sigma(z)(1 + z(1-\sigma(z)))\,m\,du$,
$dm = z\,\sigma(z)\,du$.

Conventions
-----------
``use_norm`` (False: Samba/Mamba-1 SambaY; True for Mamba-2/GDN self-decoders), ``ngroups`` (1),
``eps`` (1e-5), biases optional (``config.bias=False`` upstream). Keys are the ``GMU`` module's
(``in_proj``, ``out_proj``, ``norm``): strip ``"attn.gmu."`` from an ArchScale ``Block``'s
``state_dict`` keys. The layer's residual, pre-norm and the SSM that produces $m$ belong to the
surrounding model.

Agreement with upstream
-----------------------
Upstream's forward/backward are CUDA jiterator kernels; their C++ code strings (``swiglu_fwd``,
``swiglu_bwd``) were transcribed into a ``torch.autograd.Function`` and ``rms_norm_ref`` used for
the gated norm (``upcast`` to float64 instead of float32), run in float64 on CPU: output and
every gradient (``x``, ``memory``, ``in_proj``, ``out_proj``, ``norm``; with and without the norm,
1 and 4 groups, with and without biases) agree to $2.2\times10^{-15}$ relative.
"""

from __future__ import annotations

import numpy as np

from .._checks import (
    as_dout,
    as_float,
    cast_all,
    check_int,
    check_params,
    check_positive,
    check_weight_in,
    compute_dtype,
)
from ..nn.activations import silu, silu_grad
from ..nn.linear import linear_prefixed, linear_prefixed_spec, linear_prefixed_vjp
from ..nn.norms import normalize_backward, normalize_forward
from ..registry import Mechanism, Sample, register
from .core import param_dim

__all__ = ["gated_memory_unit_forward", "gated_memory_unit_backward", "gated_memory_unit"]


def gated_memory_unit_forward(x, memory, params, *, use_norm: bool = False, ngroups: int = 1, eps: float = 1e-5):
    r"""GMU $y = (\mathrm{SiLU}(xW_{in})\odot m)W_{out}$ (optionally group-RMS-normalised; module docstring).

    Parameters
    ----------
    x : array (..., N, C)
        The layer's (normalised) hidden states.
    memory : array (..., N, D)
        The shared SSM readout $m$ (same leading axes as ``x``).
    params : dict
        ``"in_proj.weight" (C, D)``, ``"out_proj.weight" (D, C)`` (PyTorch ``weight.T``),
        optional ``".bias"`` entries, ``"norm.weight" (D,)`` when ``use_norm``.
    use_norm : bool
    ngroups : int
        Groups of the RMSNorm ($D$ divisible by it).
    eps : float

    Returns
    -------
    y, cache
        ``y (..., N, C)``.
    """
    x = as_float(x, "x", min_ndim=2)
    m = as_float(memory, "memory", min_ndim=2)
    if not isinstance(use_norm, (bool, np.bool_)):
        raise TypeError(f"use_norm must be a bool; got {type(use_norm).__name__}")
    g = check_int(ngroups, "ngroups", minimum=1)
    eps = check_positive(eps, "eps", allow_zero=True)
    c = x.shape[-1]
    check_weight_in(params, "in_proj.weight", c, input_name="x")  # D is read off its output axis
    d = param_dim(params, "in_proj.weight", 1, where="gated_memory_unit", shape=("C", "D"))
    if m.shape != x.shape[:-1] + (d,):
        raise ValueError(f"memory must have shape x.shape[:-1] + (D,) = {x.shape[:-1] + (d,)} (D from "
                         f"in_proj.weight); got {m.shape}")
    if use_norm and d % g:
        raise ValueError(f"ngroups must divide the memory width D={d}; got {g}")
    spec = linear_prefixed_spec("in_proj", c, d)
    spec.update(linear_prefixed_spec("out_proj", d, c))
    if use_norm:
        spec["norm.weight"] = (d,)
    p = check_params(params, spec, optional=("in_proj.bias", "out_proj.bias"), where="gated_memory_unit")
    dt = compute_dtype(x, m, *p.values())
    x, m, p = x.astype(dt, copy=False), m.astype(dt, copy=False), cast_all(dt, p)
    z = linear_prefixed(p, "in_proj", x)
    sz = silu(z)
    u = sz * m
    cache = {"x": x, "m": m, "p": p, "z": z, "sz": sz, "norm": None, "dtype": dt}
    if use_norm:
        ug = u.reshape(u.shape[:-1] + (g, d // g))
        uhat, stats = normalize_forward(ug, (ug.ndim - 1,), eps, center=False)
        uhat = uhat.reshape(u.shape)
        cache["norm"] = (uhat, stats, g)
        h = uhat * p["norm.weight"]
    else:
        h = u
    cache["h"] = h
    return linear_prefixed(p, "out_proj", h), cache


def gated_memory_unit_backward(dout, cache):
    r"""Gradients of `gated_memory_unit_forward` for ``x``, ``memory`` and every params key."""
    x, m, p, dt = cache["x"], cache["m"], cache["p"], cache["dtype"]
    dy = as_dout(dout, x.shape, dt)
    grads: dict = {}
    dh = linear_prefixed_vjp(grads, p, "out_proj", dy, cache["h"])
    if cache["norm"] is not None:
        uhat, stats, g = cache["norm"]
        grads["norm.weight"] = np.sum(dh * uhat, axis=tuple(range(dh.ndim - 1)))
        dhw = dh * p["norm.weight"]
        du = normalize_backward(dhw.reshape(dhw.shape[:-1] + (g, -1)), uhat.reshape(dhw.shape[:-1] + (g, -1)), stats)
        du = du.reshape(dh.shape)
    else:
        du = dh
    grads["memory"] = du * cache["sz"]
    grads["x"] = linear_prefixed_vjp(grads, p, "in_proj", du * m * silu_grad(cache["z"]), x)
    return grads


def gated_memory_unit(x, memory, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of `gated_memory_unit_forward`."""
    return gated_memory_unit_forward(x, memory, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _params(rng, c, d, use_norm, bias):
    p = {"in_proj.weight": rng.standard_normal((c, d)) / np.sqrt(c),
         "out_proj.weight": rng.standard_normal((d, c)) / np.sqrt(d)}
    if bias:
        p["in_proj.bias"] = 0.2 * rng.standard_normal(d)
        p["out_proj.bias"] = 0.1 * rng.standard_normal(c)
    if use_norm:
        p["norm.weight"] = 1.0 + 0.2 * rng.standard_normal(d)
    return p


def _sample(rng, size):
    n, c, d = (3, 3, 4) if size == "tiny" else (int(rng.integers(4, 8)), 6, 8)
    use_norm = bool(rng.random() < 0.5)
    cfg = {"use_norm": use_norm, "ngroups": int(rng.choice([1, 2])) if use_norm else 1}
    return Sample(inputs={"x": rng.standard_normal((2, n, c)), "memory": rng.standard_normal((2, n, d))},
                  params=_params(rng, c, d, use_norm, bool(rng.random() < 0.5)), config=cfg)


def _reference(x, memory, params, use_norm=False, ngroups=1, eps=1e-5):
    # ArchScale's rms_norm_ref(memory, w, None, z=in_proj(x), group_size=D/G, norm_before_gate=False).
    z = x @ params["in_proj.weight"] + params.get("in_proj.bias", 0.0)
    u = memory * z / (1.0 + np.exp(-z))
    if use_norm:
        ug = u.reshape(u.shape[:-1] + (ngroups, -1))
        u = (ug / np.sqrt(np.mean(ug * ug, axis=-1, keepdims=True) + eps)).reshape(u.shape) * params["norm.weight"]
    return u @ params["out_proj.weight"] + params.get("out_proj.bias", 0.0)


def _check_unit_memory_is_silu_mlp(rng):
    # With m = 1 and no norm the GMU is the SiLU MLP out_proj(silu(in_proj(x))).
    x = rng.standard_normal((2, 5, 4))
    p = _params(rng, 4, 6, False, True)
    y = gated_memory_unit(x, np.ones((2, 5, 6)), p)
    ref = silu(x @ p["in_proj.weight"] + p["in_proj.bias"]) @ p["out_proj.weight"] + p["out_proj.bias"]
    err = float(np.abs(y - ref).max())
    assert err < 1e-14, f"unit-memory GMU differs from the SiLU MLP by {err}"
    return err


def _check_shared_memory_gradient_accumulates(rng):
    # Two cross-decoder GMU layers reading the same memory: y = h + GMU2(h, m), h = x + GMU1(x, m).
    # The chained backward (dm = dm_1 + dm_2) is FD-checked.
    from ..testing import gradcheck

    def fwd(x, memory, params, use_norm):
        p1 = {k[2:]: v for k, v in params.items() if k.startswith("1.")}
        p2 = {k[2:]: v for k, v in params.items() if k.startswith("2.")}
        a, c1 = gated_memory_unit_forward(x, memory, p1, use_norm=use_norm)
        h = x + a
        b, c2 = gated_memory_unit_forward(h, memory, p2, use_norm=use_norm)
        return h + b, (c1, c2)

    def bwd(g, cache):
        g2 = gated_memory_unit_backward(g, cache[1])
        dh = g + g2["x"]
        g1 = gated_memory_unit_backward(dh, cache[0])
        out = {"x": dh + g1["x"], "memory": g1["memory"] + g2["memory"]}
        out.update({f"1.{k}": v for k, v in g1.items() if k not in ("x", "memory")})
        out.update({f"2.{k}": v for k, v in g2.items() if k not in ("x", "memory")})
        return out

    use_norm = bool(rng.random() < 0.5)
    p = {f"{i}.{k}": v for i in (1, 2) for k, v in _params(rng, 3, 4, use_norm, False).items()}
    s = Sample({"x": rng.standard_normal((2, 3, 3)), "memory": rng.standard_normal((2, 3, 4))}, p,
               {"use_norm": use_norm})
    return gradcheck(fwd, bwd, s).max_rel


register(
    Mechanism(
        slug="gated_memory_unit", family="5-building-blocks", tier="T2",
        title="Gated Memory Unit (SambaY cross-decoder): SiLU-gated shared SSM memory, optional grouped RMSNorm",
        paper="Ren, Chen, Xu, Kim, Atkinson, Zhan, Sun, Peng, Liu, Wang, Cheng, Gao, Chen, Shen, Decoder-Hybrid-"
              "Decoder Architecture for Efficient Reasoning with Long Generation (SambaY), NeurIPS 2025, arXiv 2507.06607",
        forward=gated_memory_unit_forward, backward=gated_memory_unit_backward, sample=_sample, reference=_reference,
        docs="blocks/routing-and-gating.md#gated-memory-unit",
        checks={"unit_memory_is_silu_mlp": _check_unit_memory_is_silu_mlp,
                "shared_memory_gradient_accumulates": _check_shared_memory_gradient_accumulates},
    ),
)
