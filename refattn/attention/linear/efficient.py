r"""Efficient Attention (Shen et al.): softmax over each query's features and over each key feature's
positions, so attention costs $O(Md\,d_v)$.

Shen, Zhang, Zhao, Yi, Li, "Efficient Attention: Attention with Linear Complexities", WACV 2021,
arXiv 1812.01243. Upstream: cmsflash/efficient-attention ``efficient_attention.py``.

$$E = \rho_q(Q)\,\big(\rho_k(K)^\top V\big)$$

``normalization="softmax"``: $\rho_q$ = softmax over the $d$ features of each query row, $\rho_k$ =
softmax over the $M$ positions of each key column (upstream ``keys.softmax(dim=2)`` over positions,
``queries.softmax(dim=1)`` over channels, in its ``(n, c, h*w)`` layout; scaomath/galerkin-transformer
``'linear'`` type). ``"scaling"``: $\rho_q(Y)=\rho_k(Y)=Y/\sqrt M$, i.e. exactly $(QK^\top/M)V$.
No extra normaliser, no $1/\sqrt d$; non-causal. Layouts as the linear family
(`refattn.attention.linear.core`): ``q (..., N, d)``, ``k (..., M, d)``, ``v (..., M, dv)``.

Backward
--------
With $S = \rho_k^\top V$ and upstream $G$: $dS = \rho_q^\top G$, $d\rho_q = G S^\top$,
$d\rho_k = V\,dS^\top$, $dV = \rho_k\,dS$, then two softmax VJPs
$dx = p\odot(dp - \sum p\odot dp)$ along different axes (features for $Q$, positions for $K$), or
the factor $M^{-1/2}$ for ``"scaling"``.
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, check_choice
from ...nn.softmax import softmax_lse, softmax_vjp
from ...registry import Mechanism, Sample, register
from ._samples import fd_max_rel, random_qkv
from .core import mT, validate_linear_qkv

__all__ = ["efficient_attention_forward", "efficient_attention_backward", "efficient_attention"]


def efficient_attention_forward(q, k, v, *, normalization: str = "softmax"):
    r"""Efficient Attention (Shen, Zhang, Zhao, Yi, Li, WACV 2021, arXiv 1812.01243).

    $$E = \rho_q(Q)\,\big(\rho_k(K)^\top V\big)$$

    ``normalization="softmax"``: $\rho_q$ = softmax over the $d$ features of each query row,
    $\rho_k$ = softmax over the $M$ positions of each key column (cmsflash/efficient-attention
    ``efficient_attention.py``: ``keys.softmax(dim=2)`` over positions, ``queries.softmax(dim=1)``
    over channels, in its ``(n, c, h*w)`` layout; scaomath/galerkin-transformer ``'linear'``
    type). ``"scaling"``: $\rho_q(Y)=\rho_k(Y)=Y/\sqrt M$, i.e. exactly $(QK^\top/M)V$.
    No extra normaliser, no $1/\sqrt d$. Cost $O(Md\,d_v)$; non-causal.

    Backward: $dS = \rho_q^\top G$, $d\rho_q = G S^\top$, $d\rho_k = V\,dS^\top$,
    $dV = \rho_k\,dS$ ($S = \rho_k^\top V$), then two softmax VJPs
    $dx = p\odot(dp - \sum p\odot dp)$ along different axes (features for $Q$, positions for $K$).
    """
    check_choice(normalization, "normalization", ("softmax", "scaling"))
    q, k, v = validate_linear_qkv(q, k, v)
    if normalization == "softmax":
        rq, _ = softmax_lse(q, axis=-1)
        rk, _ = softmax_lse(k, axis=-2)
    else:
        c = k.shape[-2] ** -0.5  # a Python float keeps float32
        rq, rk = q * c, k * c
    S = mT(rk) @ v
    out = rq @ S
    return out, {"rq": rq, "rk": rk, "v": v, "S": S, "norm": normalization, "out_shape": out.shape}


def efficient_attention_backward(dout, cache):
    r"""Gradients ``{"q", "k", "v"}`` of :func:`efficient_attention_forward` (see its docstring)."""
    rq, rk, v, S = cache["rq"], cache["rk"], cache["v"], cache["S"]
    g = as_dout(dout, cache["out_shape"], rq.dtype)
    drq = g @ mT(S)
    dS = mT(rq) @ g
    drk = v @ mT(dS)
    dv = rk @ dS
    if cache["norm"] == "softmax":
        dq = softmax_vjp(rq, drq, axis=-1)
        dk = softmax_vjp(rk, drk, axis=-2)
    else:
        c = rk.shape[-2] ** -0.5
        dq, dk = drq * c, drk * c
    return {"q": dq, "k": dk, "v": dv}


def efficient_attention(q, k, v, *, normalization: str = "softmax") -> np.ndarray:
    """Convenience wrapper: the output of :func:`efficient_attention_forward`."""
    return efficient_attention_forward(q, k, v, normalization=normalization)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _efficient_reference(q, k, v, *, normalization="softmax"):
    q, k, v = validate_linear_qkv(q, k, v)
    if normalization == "scaling":
        return (q @ mT(k) / k.shape[-2]) @ v
    rq = np.exp(q - q.max(-1, keepdims=True))
    rq /= rq.sum(-1, keepdims=True)
    rk = np.exp(k - k.max(-2, keepdims=True))
    rk /= rk.sum(-2, keepdims=True)
    return (rq @ mT(rk)) @ v


def _sample_efficient(rng, size):
    q, k, v = random_qkv(rng, size, same_length=False)
    return Sample(inputs={"q": q, "k": k, "v": v},
                  config={"normalization": "softmax" if rng.random() < 0.7 else "scaling"})


def _check_efficient_scaling_dense(rng):
    q, k, v = random_qkv(rng, "small", same_length=False)
    a = efficient_attention(q, k, v, normalization="scaling")
    b = (q @ mT(k) / k.shape[-2]) @ v
    err = float(np.max(np.abs(a - b)))
    assert err < 1e-12
    return err


def _check_efficient_fd_both(rng):
    errs = []
    for norm in ("softmax", "scaling"):
        q, k, v = random_qkv(rng, "tiny", same_length=False)
        s = Sample(inputs={"q": q, "k": k, "v": v}, config={"normalization": norm})
        errs.append(fd_max_rel(efficient_attention_forward, efficient_attention_backward, s))
    return max(errs)


register(
    Mechanism(
        slug="efficient_attention_shen", family="4-linear-kernel-sparse", tier="T1",
        title="Efficient Attention: softmax over query features and over key positions",
        paper="Shen, Zhang, Zhao, Yi, Li, 'Efficient Attention: Attention with Linear Complexities', "
              "WACV 2021, arXiv 1812.01243",
        forward=efficient_attention_forward, backward=efficient_attention_backward,
        sample=_sample_efficient, reference=_efficient_reference,
        checks={"scaling_variant_equals_dense_QKt_over_n": _check_efficient_scaling_dense,
                "gradcheck_both_normalizations": _check_efficient_fd_both},
        docs="linear-attention.md#efficient-attention-shen",
    ),
)
