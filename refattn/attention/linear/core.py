r"""Helpers shared by the linear / kernel attention family, under public names: feature maps, the
linear-attention core (non-causal form and causal prefix-state scan) and input validation.

Katharopoulos linear attention (`refattn.attention.linear.katharopoulos`), Performer FAVOR+
(`refattn.attention.linear.performer`) and TransNormer (`refattn.attention.linear.transnormer`)
are one computation on non-negative *features* $\Phi_Q = \phi(Q)$, $\Phi_K = \phi(K)$:

$$O = \frac{\Phi_Q(\Phi_K^\top V)}{\Phi_Q(\Phi_K^\top\mathbf 1) + \epsilon}\qquad
\text{(row-wise division; causal: prefix sums over } j\le i\text{)},$$

which equals the explicit $O(N^2)$ form $O = \mathrm{diag}(A\mathbf 1+\epsilon)^{-1}AV$ with
$A = \Phi_Q\Phi_K^\top$ (masked lower-triangular when causal). The mechanisms differ only in
$\phi$, the normaliser and what happens after; `linear_core_forward` / `linear_core_backward`
below are that computation. (Kernelized attention with RPE, `refattn.attention.linear.rpe_fft`,
weights the same feature products by a Toeplitz matrix and has its own FFT core.)

Layouts (PyTorch SDPA): ``q (..., N, d)``, ``k (..., M, d)``, ``v (..., M, dv)`` with equal leading
axes (``(B, H)`` typically; no GQA broadcasting: repeat K/V heads first). Causal forms need
``M == N``.

Shared feature-space core (derivation)
--------------------------------------
Non-causal: $S = \Phi_K^\top V\in\mathbb R^{d\times d_v}$, $z = \Phi_K^\top\mathbf 1$,
$\mathrm{num}_i = S^\top\phi_i$, $\mathrm{den}_i = \phi_i\cdot z + \epsilon$,
$o_i = \mathrm{num}_i/\mathrm{den}_i$ ($\phi_i$ = row $i$ of $\Phi_Q$). With $g_i=\partial L/\partial o_i$:
$u_i = g_i/\mathrm{den}_i$ (gradient of $\mathrm{num}_i$) and
$c_i = -g_i\cdot o_i/\mathrm{den}_i$ (gradient of $\mathrm{den}_i$), so

$$d\Phi_Q = U S^\top + c\,z^\top,\quad dS = \Phi_Q^\top U,\quad dz = \Phi_Q^\top c,\quad
d\Phi_K = V\,dS^\top + \mathbf 1\,dz^\top,\quad dV = \Phi_K\,dS.$$

Causal: $S_i = \sum_{j\le i}\phi(k_j)v_j^\top$, $z_i = \sum_{j\le i}\phi(k_j)$. The same local
rules give $d\phi(q_i) = S_iu_i + c_iz_i$ (a forward scan that rebuilds $S_i$) and, since
$S_i$ feeds every $i\ge j$, with the reverse prefix sums $R_j = \sum_{i\ge j}\phi(q_i)u_i^\top$,
$r_j = \sum_{i\ge j}c_i\phi(q_i)$:

$$d\phi(k_j) = R_jv_j + r_j,\qquad dv_j = R_j^\top\phi(k_j)$$

(a reverse scan). Both scans hold one $d\times d_v$ state per head: $O(Nd\,d_v)$ time and
$O(d\,d_v)$ extra memory, as in fast-transformers' ``causal_product`` kernels. Without the
normaliser (TransNormer) $c=0$ and $\mathrm{den}=1$.

Selections (sparse members of the family)
----------------------------------------
Top-k, hashing and clustering members (`reformer_lsh`, `informer_probsparse`, `topk_attention`,
`sparsek`, `drsformer_tksa`, `routing_transformer`, `dynamic_mask`) select entries with
`topk_keep` and move rows with `gather_rows` / `scatter_add_rows` (its adjoint). A selection is
piecewise constant in its inputs: every backward of the family differentiates the selected
computation with the selection held fixed.

This module registers no mechanism.
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_float, check_dim, compute_dtype
from ...nn.activations import elu_plus_one, elu_plus_one_grad

__all__ = [
    "FEATURE_MAPS",
    "feature_map_forward",
    "feature_map_backward",
    "validate_linear_qkv",
    "mT",
    "linear_core_forward",
    "linear_core_backward",
    "topk_keep",
    "gather_rows",
    "scatter_add_rows",
    "l2_normalize",
    "l2_normalize_vjp",
]

FEATURE_MAPS = ("elu_plus_one", "identity")


# --------------------------------------------------------------------------------------------
# Feature maps


def feature_map_forward(x: np.ndarray, feature_map: str) -> np.ndarray:
    r"""Apply a named feature map elementwise (unvalidated).

    ``"elu_plus_one"``: $\phi(x) = \mathrm{elu}(x)+1$ ($x+1$ for $x>0$, $e^x$ otherwise; the
    Katharopoulos map, fast-transformers ``elu_feature_map``). ``"identity"``: $q,k$ are already
    features (they must then be non-negative for a well-defined normaliser).
    """
    if feature_map == "identity":
        return x
    return elu_plus_one(x)


def feature_map_backward(dphi: np.ndarray, x: np.ndarray, feature_map: str) -> np.ndarray:
    r"""VJP of :func:`feature_map_forward`: $\phi'(x) = 1$ for $x>0$, $e^x$ otherwise (ELU+1 is
    $C^1$ at 0, so FD checks are valid everywhere)."""
    if feature_map == "identity":
        return dphi
    return dphi * elu_plus_one_grad(x)


# --------------------------------------------------------------------------------------------
# Validation


def validate_linear_qkv(q, k, v, *, same_length: bool = False):
    """Validate ``q (..., N, d)``, ``k (..., M, d)``, ``v (..., M, dv)`` with equal leading axes (no GQA
    broadcasting) and cast them to the common compute dtype; ``same_length`` also requires
    ``M == N`` (causal forms). Errors name the argument and the expected vs given shape."""
    q = as_float(q, "q", min_ndim=3)
    k = as_float(k, "k", min_ndim=3)
    v = as_float(v, "v", min_ndim=3)
    for name, a in (("k", k), ("v", v)):
        if a.shape[:-2] != q.shape[:-2]:
            raise ValueError(
                f"{name} must have q's leading (batch, head) axes {q.shape[:-2]}; got {name} of shape "
                f"{a.shape} (q {q.shape}); repeat K/V heads for GQA first"
            )
    check_dim("q", q.shape[-1], "k", k.shape[-1], "the feature size (last axis)")
    check_dim("k", k.shape[-2], "v", v.shape[-2], "the sequence length (axis -2)")
    if same_length:
        check_dim("q", q.shape[-2], "k", k.shape[-2], "the sequence length (axis -2, causal)")
    dt = compute_dtype(q, k, v)
    return q.astype(dt, copy=False), k.astype(dt, copy=False), v.astype(dt, copy=False)


def mT(a):
    """The matrix transpose of the last two axes (``np.swapaxes(a, -1, -2)``, PyTorch's ``.mT``)."""
    return np.swapaxes(a, -1, -2)


# --------------------------------------------------------------------------------------------
# Feature-space core


def linear_core_forward(fq, fk, v, *, causal: bool, eps: float, normalise: bool, den_guard: float = 0.0,
                        key_sum_eps: float = 0.0):
    r"""Linear attention on features (unvalidated): ``fq (..., N, m)``, ``fk (..., M, m)``, ``v (..., M, dv)``.

    ``causal`` runs the prefix-state scan ($M = N$); ``normalise=False`` drops the denominator
    (TransNormer); ``eps`` is added to it; ``den_guard > 0`` applies google-research performer's
    guard $R + 2s\,[|R| \le s]$; ``key_sum_eps`` $=\delta$ is added to every entry of the key
    sum (performer-pytorch ``causal_linear_attention_noncuda``: $\mathrm{den}_i = \phi_i\cdot(z_i +
    \delta\mathbf 1)$, so $\partial\,\mathrm{den}_i/\partial\phi_i = z_i + \delta\mathbf 1$ and the
    keys' gradient is unchanged). A denominator that is exactly 0 (no key at all) gives output 0.
    Returns ``(out, state)``; ``state`` feeds `linear_core_backward`.
    """
    if not causal:
        S = mT(fk) @ v  # (..., d, dv)
        num = fq @ S
        if normalise:
            z = np.sum(fk, axis=-2) + key_sum_eps  # (..., d)
            den = np.einsum("...nd,...d->...n", fq, z) + eps
            if den_guard > 0:  # google-research performer: R + 2 s (|R| <= s); locally constant
                den = np.where(np.abs(den) <= den_guard, den + 2.0 * den_guard, den)  # keeps the dtype
            den = np.where(den == 0, 1.0, den)  # no key at all (padding, eps = 0): num = 0, out = 0
            out = num / den[..., None]
        else:
            den, out = None, num
        return out, {"S": S, "den": den, "key_sum_eps": key_sum_eps}
    n = fq.shape[-2]
    S = np.zeros(fq.shape[:-2] + (fq.shape[-1], v.shape[-1]), dtype=fq.dtype)
    z = np.zeros(fq.shape[:-2] + (fq.shape[-1],), dtype=fq.dtype)
    out = np.empty(fq.shape[:-1] + (v.shape[-1],), dtype=fq.dtype)
    den = np.empty(fq.shape[:-1], dtype=fq.dtype) if normalise else None
    for i in range(n):
        S = S + fk[..., i, :, None] * v[..., i, None, :]
        num = np.einsum("...d,...de->...e", fq[..., i, :], S)
        if normalise:
            z = z + fk[..., i, :]
            di = np.einsum("...d,...d->...", fq[..., i, :], z + key_sum_eps) + eps
            if den_guard > 0:
                di = np.where(np.abs(di) <= den_guard, di + 2.0 * den_guard, di)
            di = np.where(di == 0, 1.0, di)
            den[..., i] = di
            out[..., i, :] = num / di[..., None]
        else:
            out[..., i, :] = num
    return out, {"den": den, "key_sum_eps": key_sum_eps}


def linear_core_backward(g, fq, fk, v, out, state, *, causal: bool, normalise: bool):
    """Gradients ``(dfq, dfk, dv)`` of `linear_core_forward` for the upstream gradient ``g`` (the
    derivation in the module docstring; a forward and a reverse scan when ``causal``). ``out`` and
    ``state`` are the forward's output and state."""
    den = state["den"]
    if normalise:
        u = g / den[..., None]
        c = -np.sum(g * out, axis=-1) / den
    else:
        u, c = g, None
    if not causal:
        S = state["S"]
        dfq = u @ mT(S)
        dS = mT(fq) @ u
        dfk = v @ mT(dS)
        if normalise:
            z = np.sum(fk, axis=-2)
            dfq = dfq + c[..., None] * (z + state.get("key_sum_eps", 0.0))[..., None, :]
            dz = np.einsum("...n,...nd->...d", c, fq)
            dfk = dfk + dz[..., None, :]
        dv = fk @ dS
        return dfq, dfk, dv
    n = fq.shape[-2]
    dfq = np.empty_like(fq)
    dfk = np.empty_like(fk)
    dv = np.empty_like(v)
    # forward scan: d phi(q_i) = S_i u_i + c_i z_i
    S = np.zeros(fq.shape[:-2] + (fq.shape[-1], v.shape[-1]), dtype=fq.dtype)
    z = np.zeros(fq.shape[:-2] + (fq.shape[-1],), dtype=fq.dtype)
    for i in range(n):
        S = S + fk[..., i, :, None] * v[..., i, None, :]
        dq_i = np.einsum("...de,...e->...d", S, u[..., i, :])
        if normalise:
            z = z + fk[..., i, :]
            dq_i = dq_i + c[..., i, None] * (z + state.get("key_sum_eps", 0.0))
        dfq[..., i, :] = dq_i
    # reverse scan: R_j = sum_{i>=j} phi(q_i) u_i^T, r_j = sum_{i>=j} c_i phi(q_i)
    R = np.zeros_like(S)
    r = np.zeros_like(z)
    for j in range(n - 1, -1, -1):
        R = R + fq[..., j, :, None] * u[..., j, None, :]
        dk_j = np.einsum("...de,...e->...d", R, v[..., j, :])
        if normalise:
            r = r + c[..., j, None] * fq[..., j, :]
            dk_j = dk_j + r
        dfk[..., j, :] = dk_j
        dv[..., j, :] = np.einsum("...de,...d->...e", R, fk[..., j, :])
    return dfq, dfk, dv


# --------------------------------------------------------------------------------------------
# L2 normalisation (PyTorch ``F.normalize``), for cosine-similarity attention


def l2_normalize(x: np.ndarray, eps: float = 1e-12):
    r"""``F.normalize(x, dim=-1)``: $\hat x = x/\max(\|x\|, \epsilon)$ (unvalidated). Returns
    ``(xhat, stats)``; ``stats`` feeds `l2_normalize_vjp`."""
    n = np.linalg.norm(x, axis=-1, keepdims=True)
    r = np.maximum(n, eps)
    return x / r, (n, r)


def l2_normalize_vjp(dxhat: np.ndarray, xhat: np.ndarray, stats, eps: float = 1e-12) -> np.ndarray:
    r"""VJP of `l2_normalize`: $dx = (d\hat x - \hat x\,(\hat x\cdot d\hat x))/\|x\|$ where
    $\|x\| > \epsilon$, $d\hat x/\epsilon$ where the clamp is active."""
    n, r = stats
    return np.where(n > eps, (dxhat - xhat * np.sum(dxhat * xhat, axis=-1, keepdims=True)) / r, dxhat / eps)


# --------------------------------------------------------------------------------------------
# Selections: top-k keep-masks and row gather / scatter (unvalidated)


def topk_keep(scores: np.ndarray, k: int, valid=None, axis: int = -1) -> np.ndarray:
    """Boolean mask of the ``k`` largest entries of ``scores`` along ``axis`` among the ``valid``
    ones (all of them when fewer than ``k`` are valid). Ties at the ``k``-th value are broken
    arbitrarily (``np.argpartition``), as ``torch.topk`` does: callers' samplers avoid them."""
    s = scores if valid is None else np.where(valid, scores, -np.inf)
    n = s.shape[axis]
    if k >= n:
        keep = np.ones(s.shape, dtype=bool)
    else:
        idx = np.take(np.argpartition(-s, k - 1, axis=axis), np.arange(k), axis=axis)
        keep = np.zeros(s.shape, dtype=bool)
        np.put_along_axis(keep, idx, True, axis=axis)
    if valid is not None:
        keep &= np.broadcast_to(valid, keep.shape)
    return keep


def gather_rows(x: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """``x (..., N, e)``, integer ``idx (..., S)`` (leading axes broadcast) -> ``x[..., idx, :]``
    of shape ``(..., S, e)``."""
    return np.take_along_axis(x, idx[..., None], axis=-2)


def scatter_add_rows(g: np.ndarray, idx: np.ndarray, n: int) -> np.ndarray:
    """The adjoint of `gather_rows`: ``g (..., S, e)`` added into rows ``idx (..., S)`` of a zero
    ``(..., n, e)`` array (repeated indices accumulate)."""
    lead, (s, e) = g.shape[:-2], g.shape[-2:]
    b = int(np.prod(lead, dtype=np.int64))
    flat = np.broadcast_to(idx, lead + (s,)).reshape(b, s) + (np.arange(b) * n)[:, None]
    out = np.zeros((b * n, e), dtype=g.dtype)
    np.add.at(out, flat.reshape(-1), g.reshape(b * s, e))
    return out.reshape(lead + (n, e))
