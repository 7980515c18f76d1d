r"""Kernelized attention with relative positional encoding via FFT (Luo et al.): Performer features
weighted by a Toeplitz matrix $e^{b_{j-i}}$, applied in $O(N\log N)$ by FFT.

Luo, Li, Cai, Feng, He et al., "Stable, Fast and Accurate: Kernelized Attention with Relative
Positional Encoding", NeurIPS 2021, arXiv 2106.12566. No official code is known; this follows the
paper.

$$z_i = \frac{\sum_j e^{b_{j-i}}\,\phi(q_i)^\top\phi(k_j)\,v_j}
             {\sum_j e^{b_{j-i}}\,\phi(q_i)^\top\phi(k_j) + \epsilon}$$

with the Performer positive random features $\phi$ of `refattn.attention.linear.performer`. The
matrix $C_{ij} = e^{b_{j-i}}$ is Toeplitz (zero above the diagonal when causal). With
$G_j = \phi(k_j)\otimes v_j$: $U = CG$ and $u = C\phi(K)$ by FFT Toeplitz products
(`toeplitz_matvec_fft`: $C$ embedded in a circulant of size $2N$,
$y = \mathrm{irfft}(\mathrm{rfft}(h)\,\mathrm{rfft}(x))$), then
$\mathrm{num}_i = \sum_a\phi(q_i)_aU_{i,a,:}$, $\mathrm{den}_i = \phi(q_i)\cdot u_i+\epsilon$.

Backward
--------
$dn_i = g_i/\mathrm{den}_i$, $c_i = -g_i\cdot z_i/\mathrm{den}_i$;
$d\phi(q_i)_a = dn_i\cdot U_{i,a} + c_iu_{i,a}$; $dU_i = \phi(q_i)\otimes dn_i$, $du_i = c_i\phi(q_i)$;
$dG = C^\top dU$ and $d\phi(K) \mathrel{+}= C^\top du$ (the Toeplitz matrix of the reversed
coefficients, same FFT routine); $d\phi(k_j) \mathrel{+}= dG_j v_j$, $dv_j = dG_j^\top\phi(k_j)$;
$dc_{N-1+r} = \sum_i (dU_i\cdot G_{i+r} + du_i\cdot\phi(k_{i+r}))$ (an FFT cross-correlation,
`toeplitz_correlation_fft`) and $db = e^b\odot dc$ (0 on the causally removed offsets), summed over
broadcast axes; then the Performer feature VJP.
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, check_positive
from ...registry import Mechanism, Sample, register
from ..softmax.core import sum_to_shape
from ._samples import fd_max_rel, random_qkv
from .core import mT, validate_linear_qkv
from .performer import (
    performer,
    performer_features_backward,
    performer_features_forward,
    performer_projection_matrix,
    validate_performer_config,
)

__all__ = [
    "toeplitz_matvec_fft",
    "toeplitz_correlation_fft",
    "toeplitz_dense",
    "kernelized_rpe_forward",
    "kernelized_rpe_backward",
    "kernelized_rpe",
]


def _circulant_filter(c: np.ndarray) -> np.ndarray:
    """Length-2N circulant first column h with h[(i-j) mod 2N] = c[j-i+N-1]."""
    n = (c.shape[-1] + 1) // 2
    zero = np.zeros(c.shape[:-1] + (1,), dtype=c.dtype)
    return np.concatenate([c[..., :n][..., ::-1], zero, c[..., n:][..., ::-1]], axis=-1)


def toeplitz_matvec_fft(c: np.ndarray, x: np.ndarray) -> np.ndarray:
    r"""$y_i = \sum_j C_{ij}x_j$ for the Toeplitz $C_{ij} = c_{j-i+N-1}$, by FFT (unvalidated).

    ``c (..., 2N-1)`` (entry $N-1+r$ is the coefficient of offset $r = j-i$), ``x (..., N, F)``
    (``c``'s leading axes broadcast against ``x``'s). $C$ is embedded in a circulant of size
    $2N$ (no wrap-around for $|r|\le N-1$): $y = \mathrm{irfft}(\mathrm{rfft}(h)\,\mathrm{rfft}(x))$.
    Cost $O(FN\log N)$. The transpose $C^\top$ is the Toeplitz matrix of ``c[..., ::-1]``.
    """
    n = x.shape[-2]
    L = 2 * n
    H = np.fft.rfft(_circulant_filter(c), n=L, axis=-1)
    X = np.fft.rfft(x, n=L, axis=-2)
    y = np.fft.irfft(H[..., :, None] * X, n=L, axis=-2)[..., :n, :]
    return y.astype(x.dtype, copy=False)


def toeplitz_correlation_fft(dy: np.ndarray, x: np.ndarray) -> np.ndarray:
    r"""Gradient of $\langle dy, Cx\rangle$ w.r.t. ``c``: $dc_{N-1+r} = \sum_i dy_i\cdot x_{i+r}$
    (cross-correlation over the sequence, summed over features), by FFT. Returns ``(..., 2N-1)``."""
    n = x.shape[-2]
    L = 2 * n
    R = np.fft.irfft(np.conj(np.fft.rfft(dy, n=L, axis=-2)) * np.fft.rfft(x, n=L, axis=-2), n=L, axis=-2)
    R = R.sum(axis=-1)
    return np.concatenate([R[..., n + 1:], R[..., :n]], axis=-1).astype(x.dtype, copy=False)


def toeplitz_dense(c: np.ndarray) -> np.ndarray:
    """The dense ``(..., N, N)`` Toeplitz matrix $C_{ij} = c_{j-i+N-1}$ of ``c (..., 2N-1)``."""
    n = (c.shape[-1] + 1) // 2
    idx = np.arange(n)[None, :] - np.arange(n)[:, None] + n - 1
    return c[..., idx]


def kernelized_rpe_forward(q, k, v, params, *, projection, causal: bool = False, eps: float = 0.0,
                           feature_eps: float = 1e-6, normalize_data: bool = True,
                           key_stabilizer: str = "per_head", stabilizer_grad: bool = True):
    r"""Kernelized attention with relative positional encoding via FFT (Luo, Li, Cai, Feng, He
    et al., "Stable, Fast and Accurate: Kernelized Attention with Relative Positional Encoding",
    NeurIPS 2021, arXiv 2106.12566). No official code is known; this follows the paper.

    $$z_i = \frac{\sum_j e^{b_{j-i}}\,\phi(q_i)^\top\phi(k_j)\,v_j}
                 {\sum_j e^{b_{j-i}}\,\phi(q_i)^\top\phi(k_j) + \epsilon}$$

    with Performer positive random features $\phi$ (:func:`performer_features_forward`; the same
    keywords as :func:`performer_forward`). $C_{ij} = e^{b_{j-i}}$ is Toeplitz (zero above the
    diagonal when ``causal``). With $G_j = \phi(k_j)\otimes v_j$: $U = CG$ and $u = C\phi(K)$ by
    FFT Toeplitz products (:func:`toeplitz_matvec_fft`, $O(m\,d_v N\log N)$),
    $\mathrm{num}_i = \sum_a\phi(q_i)_aU_{i,a,:}$, $\mathrm{den}_i = \phi(q_i)\cdot u_i+\epsilon$.

    Parameters
    ----------
    q, k (..., N, d), v (..., N, dv)
    params : {"b": (..., 2N-1)}
        Relative-position logits, entry $N-1+r$ for offset $r = j-i$; leading axes broadcast
        against ``q``'s (``(H, 2N-1)`` for per-head biases).
    projection, feature_eps, normalize_data, key_stabilizer, stabilizer_grad
        As in :func:`performer_forward`.
    eps : float
        Added to the denominator (default 0: positive features keep it positive).

    Notes
    -----
    Backward: $dn_i = g_i/\mathrm{den}_i$, $c_i = -g_i\cdot z_i/\mathrm{den}_i$;
    $d\phi(q_i)_a = dn_i\cdot U_{i,a} + c_iu_{i,a}$; $dU_i = \phi(q_i)\otimes dn_i$,
    $du_i = c_i\phi(q_i)$; $dG = C^\top dU$ and $d\phi(K) \mathrel{+}= C^\top du$ (Toeplitz of the
    reversed ``c``, same FFT routine); $d\phi(k_j) \mathrel{+}= dG_j v_j$, $dv_j = dG_j^\top\phi(k_j)$;
    $dc_{N-1+r} = \sum_i (dU_i\cdot G_{i+r} + du_i\cdot\phi(k_{i+r}))$ (FFT cross-correlation) and
    $db = e^b\odot dc$ (0 on the causally removed offsets), summed over broadcast axes.
    """
    q, k, v = validate_linear_qkv(q, k, v, same_length=True)
    projection, feature_eps, _ = validate_performer_config(
        projection, q.shape[-1], q.dtype, feature_eps, 0.0, key_stabilizer, causal, normalize_data,
        stabilizer_grad)
    eps = check_positive(eps, "eps", allow_zero=True)
    if not isinstance(params, dict) or set(params) != {"b"}:
        raise ValueError(f"params must be a dict with the single key 'b' (..., 2N-1); got "
                         f"{sorted(params) if isinstance(params, dict) else type(params).__name__}")
    n = q.shape[-2]
    b = as_float(params["b"], "b", min_ndim=1)
    if b.shape[-1] != 2 * n - 1:
        raise ValueError(f"b must have last axis 2N-1 = {2 * n - 1} (offsets -(N-1)..N-1); got shape {b.shape}")
    try:
        ok = np.broadcast_shapes(b.shape[:-1], q.shape[:-2]) == q.shape[:-2]
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"b's leading axes {b.shape[:-1]} must broadcast to q's {q.shape[:-2]}")
    b = b.astype(q.dtype, copy=False)
    c = np.exp(b)
    if causal:
        c = np.where(np.arange(2 * n - 1) > n - 1, 0.0, c)
    fq, cq = performer_features_forward(q, projection, is_query=True, feature_eps=feature_eps,
                                        normalize_data=bool(normalize_data), key_stabilizer=key_stabilizer)
    fk, ck = performer_features_forward(k, projection, is_query=False, feature_eps=feature_eps,
                                        normalize_data=bool(normalize_data), key_stabilizer=key_stabilizer)
    m, dv = fk.shape[-1], v.shape[-1]
    G = (fk[..., :, None] * v[..., None, :]).reshape(fk.shape[:-1] + (m * dv,))
    U = toeplitz_matvec_fft(c, G).reshape(fk.shape[:-1] + (m, dv))
    u = toeplitz_matvec_fft(c, fk)
    num = np.einsum("...na,...nae->...ne", fq, U)
    den = np.einsum("...na,...na->...n", fq, u) + eps
    out = num / den[..., None]
    return out, {"fq": fq, "fk": fk, "cq": cq, "ck": ck, "v": v, "G": G, "U": U, "u": u, "den": den,
                 "out": out.copy(), "c": c, "b_shape": b.shape, "stabilizer_grad": bool(stabilizer_grad)}


def kernelized_rpe_backward(dout, cache):
    r"""Gradients ``{"q", "k", "v", "b"}`` of :func:`kernelized_rpe_forward` (derivation in its
    docstring)."""
    out = cache["out"]
    g = as_dout(dout, out.shape, out.dtype)
    fq, fk, v, U, u, den, c = (cache[x] for x in ("fq", "fk", "v", "U", "u", "den", "c"))
    m, dv = fk.shape[-1], v.shape[-1]
    dn = g / den[..., None]
    cc = -np.sum(g * out, axis=-1) / den
    dfq = np.einsum("...ne,...nae->...na", dn, U) + cc[..., None] * u
    dU = (fq[..., :, None] * dn[..., None, :]).reshape(fq.shape[:-1] + (m * dv,))
    du = cc[..., None] * fq
    crev = c[..., ::-1]
    dG = toeplitz_matvec_fft(crev, dU).reshape(fk.shape[:-1] + (m, dv))
    dfk = toeplitz_matvec_fft(crev, du) + np.einsum("...nae,...ne->...na", dG, v)
    dvv = np.einsum("...nae,...na->...ne", dG, fk)
    dc = toeplitz_correlation_fft(dU, cache["G"]) + toeplitz_correlation_fft(du, fk)
    db = sum_to_shape(dc * c, cache["b_shape"])
    sg = cache["stabilizer_grad"]
    return {"q": performer_features_backward(dfq, cache["cq"], stabilizer_grad=sg),
            "k": performer_features_backward(dfk, cache["ck"], stabilizer_grad=sg), "v": dvv, "b": db}


def kernelized_rpe(q, k, v, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`kernelized_rpe_forward`."""
    return kernelized_rpe_forward(q, k, v, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _rpe_reference(q, k, v, params, *, projection, causal=False, eps=0.0, feature_eps=1e-6,
                   normalize_data=True, key_stabilizer="per_head", stabilizer_grad=True):
    """Dense path: $A = (\\Phi_Q\\Phi_K^\\top)\\odot C$, $z = AV/(A\\mathbf 1+\\epsilon)$."""
    fq, _ = performer_features_forward(q, projection, is_query=True, feature_eps=feature_eps,
                                       normalize_data=normalize_data, key_stabilizer=key_stabilizer)
    fk, _ = performer_features_forward(k, projection, is_query=False, feature_eps=feature_eps,
                                       normalize_data=normalize_data, key_stabilizer=key_stabilizer)
    C = toeplitz_dense(np.exp(params["b"]))
    if causal:
        C = np.tril(C)
    A = (fq @ mT(fk)) * C
    return (A @ v) / (A.sum(-1, keepdims=True) + eps)


def _sample_rpe(rng, size):
    q, k, v = random_qkv(rng, size, same_length=True)
    n = q.shape[-2]
    m = 4 if size == "tiny" else 12
    if size == "tiny":
        q, k, v = q[:, :1], k[:, :1], v[:, :1]
    proj = performer_projection_matrix(m, q.shape[-1], seed=int(rng.integers(0, 2**31)))
    b = 0.5 * rng.standard_normal((q.shape[1], 2 * n - 1))
    return Sample(inputs={"q": q * 0.7, "k": k * 0.7, "v": v}, params={"b": b},
                  config={"projection": proj, "causal": bool(rng.integers(0, 2))})


def _check_toeplitz_fft_dense_and_adjoint(rng):
    n, f = 7, 3
    c = rng.standard_normal((2, 2 * n - 1))
    x = rng.standard_normal((2, n, f))
    y = rng.standard_normal((2, n, f))
    C = toeplitz_dense(c)
    e1 = float(np.max(np.abs(toeplitz_matvec_fft(c, x) - C @ x)))
    e2 = float(np.max(np.abs(toeplitz_matvec_fft(c[..., ::-1], y) - mT(C) @ y)))
    # <y, Cx> = <C^T y, x>, and the correlation is d<y, Cx>/dc
    e3 = abs(float(np.sum(y * toeplitz_matvec_fft(c, x)) - np.sum(toeplitz_matvec_fft(c[..., ::-1], y) * x)))
    dc = toeplitz_correlation_fft(y, x)
    idx = np.arange(n)[None, :] - np.arange(n)[:, None] + n - 1
    dc_dense = np.zeros_like(c)
    for i in range(n):
        for j in range(n):
            dc_dense[..., idx[i, j]] += np.sum(y[..., i, :] * x[..., j, :], axis=-1)
    e4 = float(np.max(np.abs(dc - dc_dense)))
    err = max(e1, e2, e3, e4)
    assert err < 1e-12, (e1, e2, e3, e4)
    return err


def _check_rpe_zero_bias_is_performer(rng):
    q, k, v = random_qkv(rng, "small")
    proj = performer_projection_matrix(8, q.shape[-1], seed=2)
    b = np.zeros((q.shape[1], 2 * q.shape[-2] - 1))
    errs = []
    for causal in (False, True):
        a = kernelized_rpe(q, k, v, {"b": b}, projection=proj, causal=causal)
        p = performer(q, k, v, projection=proj, causal=causal, denominator_guard=0.0)
        errs.append(float(np.max(np.abs(a - p))))
    assert max(errs) < 1e-12, errs
    return max(errs)


def _check_rpe_fd_variants(rng):
    errs = []
    for causal in (False, True):
        q, k, v = random_qkv(rng, "tiny")
        q, k, v = q[:, :1], k[:, :1], v[:, :1]
        proj = performer_projection_matrix(3, q.shape[-1], seed=4)
        b = 0.5 * rng.standard_normal((2 * q.shape[-2] - 1,))  # shared over batch and heads
        s = Sample(inputs={"q": q, "k": k, "v": v}, params={"b": b},
                   config={"projection": proj, "causal": causal, "eps": 1e-3})
        errs.append(fd_max_rel(kernelized_rpe_forward, kernelized_rpe_backward, s))
    return max(errs)


register(
    Mechanism(
        slug="kernelized_attention_rpe_fft", family="4-linear-kernel-sparse", tier="T2",
        title="Kernelized (Performer-feature) attention with relative positional encoding via FFT",
        paper="Luo, Li, Cai, Feng, He et al., 'Stable, Fast and Accurate: Kernelized Attention with "
              "Relative Positional Encoding', NeurIPS 2021, arXiv 2106.12566",
        forward=kernelized_rpe_forward, backward=kernelized_rpe_backward, sample=_sample_rpe,
        reference=_rpe_reference,
        checks={"toeplitz_fft_equals_dense_and_adjoint": _check_toeplitz_fft_dense_and_adjoint,
                "zero_bias_is_performer": _check_rpe_zero_bias_is_performer,
                "gradcheck_variants": _check_rpe_fd_variants},
        docs="linear-attention.md#kernelized-attention-rpe-fft",
    ),
)
