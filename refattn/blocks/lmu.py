r"""LMUFormer's Legendre Memory Unit token mixer (the non-spiking ``LMU`` block, parallel form).

Liu, Datta, Li, Beerel, "LMUFormer: Low Complexity Yet Powerful Spiking Model With Legendre Memory
Units", ICLR 2024, arXiv 2402.04882; the LMU of Voelker, Kajić, Eliasmith, "Legendre Memory
Units: Continuous-Time Representation in Recurrent Neural Networks", NeurIPS 2019, and its
parallel (FFT) training form of Chilkuri, Eliasmith, "Parallelizing Legendre Memory Unit
Training", ICML 2021. Upstream: zeyuliu1037/LMUFormer ``src/blocks/lmu.py`` (``LMU``) and
``src/blocks/lmu_cell.py`` (``LMUFFTCell``) @ 5debaddf65a0d39cd09aa17a2e4c34b364e9040e.

Forward
-------
Input $x\in\mathbb R^{B\times C\times N}$ (upstream's channels-first layout), $x_t\in\mathbb R^C$
the token $t$. The memory of order $q$ (``memory_size``) is the Legendre delay system
$\dot m = Am + Bu$ with $A_{ij} = \frac{2i+1}{\theta}\,(-1)^{i-j+1}$ for $i\ge j$,
$-\frac{2i+1}{\theta}$ for $i<j$, $B_i = \frac{2i+1}{\theta}(-1)^i$, discretised by zero-order hold
with $\Delta t = 1$: $\bar A = e^{A}$, $\bar B = A^{-1}(e^{A}-I)B$ (``scipy.linalg.expm`` of the
augmented matrix, as ``scipy.signal.cont2discrete(method="zoh")``). Then

$$u_t = \mathrm{ReLU}(x_tW_u + b_u),\qquad m_t = \sum_{s\le t}\bar A^{\,t-s}\bar B\,u_s
\;(\Leftrightarrow m_t = \bar Am_{t-1} + \bar Bu_t,\ m_{-1} = 0),$$
$$h_t = \mathrm{ReLU}([m_t; x_t]W_h + b_h),\qquad y = \mathrm{BN}(\mathrm{Conv}_{1\times1}(h)).$$

The memory is computed in the convolution form with the impulse response $H_k = \bar A^k\bar B$
(upstream multiplies FFTs; same values). ``use_all_h=False`` keeps only $h_{N-1}$ (output
$(B, C, 1)$). Parameter names are upstream's: ``lmu.W_u``, ``lmu.W_h`` (linear, stored
``(in, out)``), ``proj_conv.weight`` ``(C, H, 1)`` (torch conv layout), ``proj_conv.bias``,
``proj_bn.*``; the hidden size $H$ and $q$ are read from ``lmu.W_h.weight`` of shape
$(q + C, H)$ (upstream: $q = H = C$).

Backward
--------
BN and the $1\times1$ conv: `refattn.blocks.core.batch_norm_backward` and a linear VJP.
$da_h = dh\odot[a_h>0]$, $dW_h = \sum [m;x]^\top da_h$, $d[m;x] = da_h W_h^\top$. The memory is
linear in $u$: $du_s = \sum_{t\ge s}\langle H_{t-s}, dm_t\rangle$ (the adjoint, an anti-causal
correlation). $da_u = du\odot[a_u>0]$, then $dW_u$, $db_u$ and $dx_t \mathrel{+}= da_{u,t}W_u^\top$
on top of the direct $dx$ from $[m;x]$. $\bar A$, $\bar B$ are fixed buffers (no gradient), as
upstream registers them.

Conventions and not reproduced
------------------------------
``theta`` (128, upstream's ``LMU``), ``training`` (False: BatchNorm with running statistics;
True: batch statistics, so batch entries are coupled), ``eps`` 1e-5. Upstream builds $H$ for a
fixed ``seq_len`` = 128 and so requires $N = 128$; here $H$ has length $N$, which is the same for
$N = 128$ and extends it to any $N$. The spiking variants (``SLMU``, ``SLMUMs``) and the conv
patch embedding / channel MLP of the full LMUFormer are not reproduced (spiking neurons are out
of scope for the catalogue entry).

Agreement with upstream
-----------------------
``LMU(dim=4)`` with its ``LMUFFTCell`` buffers ``A``, ``B``, ``H``, ``fft_H`` rebuilt in float64
(upstream casts them to float32), eval-mode BatchNorm with random statistics, $x$ of shape
$(2, 4, 128)$, ``theta`` 128, both ``use_all_h``; and an ``LMUFFTCell(seq_len=16, theta=5)`` swapped in on
$(2, 4, 16)$: the discretised $\bar A, \bar B$ equal ``cont2discrete``'s exactly (difference 0),
output and the gradients of $x$ and every parameter agree to $7.1\times10^{-15}$ absolute
($2.1\times10^{-15}$ relative to the largest entry).
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_params, check_positive
from ..nn.linear import linear_apply, linear_vjp
from ..registry import Mechanism, Sample, register
from .core import add_grad, batch_norm_backward, batch_norm_forward, batch_norm_spec, block_dtype, param_dim

__all__ = ["lmu_token_mixer_forward", "lmu_token_mixer_backward", "lmu_token_mixer", "legendre_state_space",
           "lmu_impulse_response"]


def legendre_state_space(memory_size: int, theta: float, *, discrete: bool = True):
    r"""$(A, B)$ of the order-$q$ Legendre delay system (module docstring), zero-order-hold
    discretised with $\Delta t = 1$ when ``discrete`` (float64; ``B`` of shape $(q, 1)$)."""
    from scipy.linalg import expm

    q = int(memory_size)
    if q < 1:
        raise ValueError(f"memory_size must be >= 1; got {memory_size}")
    theta = check_positive(theta, "theta")
    i = np.arange(q, dtype=np.float64)[:, None]
    r = (2 * i + 1) / theta
    ii, jj = np.meshgrid(np.arange(q), np.arange(q), indexing="ij")
    a = r * np.where(ii < jj, -1.0, (-1.0) ** (ii - jj + 1))
    b = r * (-1.0) ** i
    if not discrete:
        return a, b
    aug = np.zeros((q + 1, q + 1))
    aug[:q, :q], aug[:q, q:] = a, b
    e = expm(aug)
    return e[:q, :q], e[:q, q:]


def lmu_impulse_response(memory_size: int, theta: float, length: int) -> np.ndarray:
    r"""$H_k = \bar A^k\bar B$ for $k = 0..\text{length}-1$, shape ``(length, q)``."""
    a, b = legendre_state_space(memory_size, theta)
    out = np.empty((int(length), a.shape[0]))
    v = b[:, 0]
    for k in range(int(length)):
        out[k] = v
        v = a @ v
    return out


def _toeplitz(h, n):
    # K[t, s] = H[t - s] for s <= t, else 0: the causal convolution as one array (N, N, q).
    idx = np.arange(n)[:, None] - np.arange(n)[None, :]
    k = h[np.clip(idx, 0, None)]
    k[idx < 0] = 0.0
    return k


def lmu_token_mixer_forward(x, params, *, theta: float = 128.0, use_all_h: bool = True, training: bool = False,
                            eps: float = 1e-5):
    r"""The LMUFormer ``LMU`` token mixer (module docstring).

    Parameters
    ----------
    x : array (B, C, N)
        Channels-first tokens (upstream's layout).
    params : dict
        ``"lmu.W_u.weight" (C, 1)``, ``"lmu.W_u.bias" (1,)``, ``"lmu.W_h.weight" (q + C, H)``,
        ``"lmu.W_h.bias" (H,)``, ``"proj_conv.weight" (C, H, 1)``, ``"proj_conv.bias" (C,)``,
        ``"proj_bn.weight"/"bias"/"running_mean"/"running_var" (C,)``.
    theta : float
        The delay window $\theta$ of the Legendre system (upstream 128).
    use_all_h : bool
        Return every token (True) or only the last hidden state (False, output ``(B, C, 1)``).
    training : bool
        BatchNorm with batch statistics (True) or running statistics (False).
    eps : float
        BatchNorm epsilon.

    Returns
    -------
    y, cache
        ``y`` of shape ``(B, C, N)`` (or ``(B, C, 1)``).
    """
    x = as_float(x, "x", min_ndim=3)
    if x.ndim != 3:
        raise ValueError(f"x must have shape (B, C, N); got {x.shape}")
    for name, v in (("use_all_h", use_all_h), ("training", training)):
        if not isinstance(v, (bool, np.bool_)):
            raise TypeError(f"{name} must be a bool; got {type(v).__name__}")
    theta = check_positive(theta, "theta")
    eps = check_positive(eps, "eps", allow_zero=True)
    bsz, c, n = x.shape
    rows = param_dim(params, "lmu.W_h.weight", 0, where="lmu_token_mixer", shape=("q + C", "H"))
    hid = param_dim(params, "lmu.W_h.weight", 1, where="lmu_token_mixer", shape=("q + C", "H"))
    q = rows - c
    if q < 1:
        pc = np.shape(params.get("proj_conv.weight"))  # (C, H, 1): H confirms a transposed (H, q + C)
        hint = (f" (PyTorch's nn.Linear.weight is (out, in): pass its transpose, of shape ({hid}, {rows}))"
                if hid > c and (len(pc) != 3 or pc[1] == rows) else "")
        raise ValueError(f"lmu.W_h.weight must have shape (q + C, H) with q >= 1 and C = {c}; got ({rows}, {hid})"
                         f"{hint}")
    spec = {"lmu.W_u.weight": (c, 1), "lmu.W_u.bias": (1,), "lmu.W_h.weight": (q + c, hid), "lmu.W_h.bias": (hid,),
            "proj_conv.weight": (c, hid, 1), "proj_conv.bias": (c,)}
    spec.update(batch_norm_spec("proj_bn", c))
    p = check_params(params, spec, where="lmu_token_mixer")
    dt = block_dtype(x, p)
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    xt = np.swapaxes(x, 1, 2)
    a_u = linear_apply(xt, p["lmu.W_u.weight"], p["lmu.W_u.bias"])[..., 0]
    u = np.maximum(a_u, 0.0)
    kern = _toeplitz(lmu_impulse_response(q, theta, n), n).astype(dt)
    m = np.einsum("tsk,bs->btk", kern, u)
    z = np.concatenate([m, xt], axis=-1)
    a_h = linear_apply(z, p["lmu.W_h.weight"], p["lmu.W_h.bias"])
    h = np.maximum(a_h, 0.0)
    hc = np.swapaxes(h, 1, 2) if use_all_h else h[:, -1, :, None]
    w2 = p["proj_conv.weight"][:, :, 0]
    pc = np.einsum("oi,bin->bon", w2, hc) + p["proj_conv.bias"][:, None]
    y, cb = batch_norm_forward(p, "proj_bn", pc, training=bool(training), eps=eps)
    cache = {"p": p, "xt": xt, "a_u": a_u, "kern": kern, "z": z, "a_h": a_h, "hc": hc, "cb": cb,
             "use_all_h": bool(use_all_h), "shape": y.shape, "dtype": dt, "n": n}
    return y, cache


def lmu_token_mixer_backward(dout, cache):
    r"""Gradients of `lmu_token_mixer_forward` for ``x`` and every params key (module docstring)."""
    g = as_dout(dout, cache["shape"], cache["dtype"])
    p = cache["p"]
    grads = {}
    dpc = batch_norm_backward(grads, p, g, cache["cb"])
    w2 = p["proj_conv.weight"][:, :, 0]
    add_grad(grads, "proj_conv.weight", np.einsum("bon,bin->oi", dpc, cache["hc"])[:, :, None])
    add_grad(grads, "proj_conv.bias", dpc.sum(axis=(0, 2)))
    dhc = np.einsum("oi,bon->bin", w2, dpc)
    a_h = cache["a_h"]
    dh = np.zeros_like(a_h)
    if cache["use_all_h"]:
        dh += np.swapaxes(dhc, 1, 2)
    else:
        dh[:, -1, :] = dhc[:, :, 0]
    da_h = dh * (a_h > 0)
    gl = linear_vjp(da_h, cache["z"], p["lmu.W_h.weight"])
    add_grad(grads, "lmu.W_h.weight", gl["weight"])
    add_grad(grads, "lmu.W_h.bias", gl["bias"])
    q = p["lmu.W_h.weight"].shape[0] - cache["xt"].shape[-1]
    dm, dxt = gl["x"][..., :q], gl["x"][..., q:]
    du = np.einsum("tsk,btk->bs", cache["kern"], dm)
    da_u = (du * (cache["a_u"] > 0))[..., None]
    gu = linear_vjp(da_u, cache["xt"], p["lmu.W_u.weight"])
    add_grad(grads, "lmu.W_u.weight", gu["weight"])
    add_grad(grads, "lmu.W_u.bias", gu["bias"])
    grads["x"] = np.swapaxes(dxt + gu["x"], 1, 2)
    return grads


def lmu_token_mixer(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of `lmu_token_mixer_forward`."""
    return lmu_token_mixer_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _random_params(rng, c, q, hid):
    p = {"lmu.W_u.weight": rng.standard_normal((c, 1)) / np.sqrt(c), "lmu.W_u.bias": np.array([0.8]),
         "lmu.W_h.weight": rng.standard_normal((q + c, hid)) / np.sqrt(q + c), "lmu.W_h.bias": 0.3 * rng.standard_normal(hid),
         "proj_conv.weight": rng.standard_normal((c, hid, 1)) / np.sqrt(hid), "proj_conv.bias": 0.1 * rng.standard_normal(c),
         "proj_bn.weight": 1.0 + 0.2 * rng.standard_normal(c), "proj_bn.bias": 0.1 * rng.standard_normal(c),
         "proj_bn.running_mean": 0.1 * rng.standard_normal(c), "proj_bn.running_var": 0.5 + rng.random(c)}
    return p


def _sample(rng, size):
    # ReLU kinks: redraw until every pre-activation is at least 0.02 away from 0.
    c, q, hid, n = (2, 2, 2, 3) if size == "tiny" else (4, 4, 4, 6)
    cfg = {"theta": float(rng.uniform(2.0, 6.0)), "use_all_h": bool(rng.random() < 0.7)}
    for _ in range(200):
        p = _random_params(rng, c, q, hid)
        x = rng.standard_normal((2, c, n))
        _, cache = lmu_token_mixer_forward(x, p, **cfg)
        if min(np.abs(cache["a_u"]).min(), np.abs(cache["a_h"]).min()) > 0.02:
            break
    return Sample(inputs={"x": x}, params=p, config=cfg)


def _reference(x, params, theta=128.0, use_all_h=True, training=False, eps=1e-5):
    # The recurrent form m_t = A m_{t-1} + B u_t, token by token (upstream's forward_recurrent).
    p = params
    a, b = legendre_state_space(p["lmu.W_h.weight"].shape[0] - x.shape[1], theta)
    m = np.zeros((x.shape[0], a.shape[0]))
    hs = []
    for t in range(x.shape[2]):
        xt = x[:, :, t]
        u = np.maximum(xt @ p["lmu.W_u.weight"] + p["lmu.W_u.bias"], 0.0)
        m = m @ a.T + u @ b.T
        hs.append(np.maximum(np.concatenate([m, xt], -1) @ p["lmu.W_h.weight"] + p["lmu.W_h.bias"], 0.0))
    h = np.stack(hs, axis=-1) if use_all_h else hs[-1][:, :, None]
    pc = np.einsum("oi,bin->bon", p["proj_conv.weight"][:, :, 0], h) + p["proj_conv.bias"][:, None]
    if training:
        mu, var = pc.mean(axis=(0, 2), keepdims=True), pc.var(axis=(0, 2), keepdims=True)
    else:
        mu, var = p["proj_bn.running_mean"][:, None], p["proj_bn.running_var"][:, None]
    return (pc - mu) / np.sqrt(var + eps) * p["proj_bn.weight"][:, None] + p["proj_bn.bias"][:, None]


def _check_continuous_system(rng):
    # The continuous Legendre system: A is lower Hessenberg-type with the stated signs; the ZOH
    # discretisation satisfies A_bar = expm(A) and B_bar = A^{-1}(A_bar - I) B.
    from scipy.linalg import expm

    a, b = legendre_state_space(5, 3.0, discrete=False)
    ad, bd = legendre_state_space(5, 3.0)
    err = max(float(np.abs(ad - expm(a)).max()), float(np.abs(bd - np.linalg.solve(a, (ad - np.eye(5)) @ b)).max()))
    assert a[0, 0] == -1.0 / 3.0 and a[0, 1] == -1.0 / 3.0 and a[1, 0] == 1.0 and b[1, 0] == -1.0, (a, b)
    assert err < 1e-12, f"ZOH discretisation off by {err}"
    return err


def _check_memory_reads_delay(rng):
    # The LMU's purpose: m_t encodes the window [t - theta, t] of u in shifted Legendre
    # polynomials; the decoder C = P_i(1) = 1 for all i reads u(t - theta) approximately, so
    # sum_i m_t[i] tracks a delayed smooth input. Check it on a slow sine with q = 12.
    q, theta, n = 12, 20.0, 120
    h = lmu_impulse_response(q, theta, n)
    t = np.arange(n)
    u = np.sin(2 * np.pi * t / 80.0)
    m = np.array([sum(h[tt - s] * u[s] for s in range(tt + 1)) for tt in range(n)])
    decoded = m.sum(axis=1)
    err = float(np.abs(decoded[60:] - u[60 - 20:n - 20]).max())
    assert err < 0.1, f"Legendre memory does not read u(t - theta): {err}"
    return err


register(
    Mechanism(
        slug="lmu_token_mixer", family="5-building-blocks", tier="T2",
        title="LMUFormer Legendre Memory Unit token mixer: u = ReLU(xW_u), m = LegT memory (causal conv), "
              "h = ReLU([m; x]W_h), 1x1 conv + BN",
        paper="Liu, Datta, Li, Beerel, LMUFormer: Low Complexity Yet Powerful Spiking Model With Legendre Memory Units, "
              "ICLR 2024, arXiv 2402.04882",
        forward=lmu_token_mixer_forward, backward=lmu_token_mixer_backward, sample=_sample, reference=_reference,
        docs="blocks/residual-and-linear.md#lmu-token-mixer",
        checks={"continuous_system": _check_continuous_system, "memory_reads_delay": _check_memory_reads_delay},
    ),
)
