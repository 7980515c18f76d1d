r"""Structured-mask linear attention: $(M\odot\Phi_Q\Phi_K^\top)V$ with only "multiply by $M$" needed.

Choromanski, Lin, Chen, Zhang, Sehanobish, Likhosherstov, Parker-Holder, Sarlós, Weller,
Weingarten, "From block-Toeplitz matrices to differential equations on graphs: towards a general
theory for scalable masked Transformers", ICML 2022, arXiv 2107.07999; the tree masks follow
Choromanski et al., "Fast Tree-Field Integrators: From Low Displacement Rank to Topological
Transformers", NeurIPS 2024, arXiv 2406.15881. No official code for the general mechanism is
public (``HL-hanlin/GKAT`` holds the graph-classification experiments of the first paper; its
masks are dense random-walk kernels, the ``"dense"`` kind here).

$$O = \frac{\big[M\odot(\Phi_Q\Phi_K^\top)\big]V}{\big[M\odot(\Phi_Q\Phi_K^\top)\big]\mathbf 1 + \epsilon},\qquad
\Phi = \phi(Q),\ \phi(K)\ \text{(a feature map of `refattn.attention.linear.core`)}.$$

The identity that makes it scale (Lemma 1 of the paper):
$(M\odot\Phi_Q\Phi_K^\top)V = \sum_{l}\mathrm{diag}(\Phi_Q[:,l])\,M\,\mathrm{diag}(\Phi_K[:,l])\,V$, i.e.
with $X = [\Phi_K\otimes V,\ \Phi_K]$ (one column per feature-value pair, and the features):
$Y = MX$, $\mathrm{num}_i = \sum_l\phi_{q,il}Y_{i,(l,\cdot)}$, $\mathrm{den}_i = \sum_l\phi_{q,il}Y_{i,l}+\epsilon$.
Only a product with $M$ is needed; the masks (``mask_kind``):

* ``"causal"``: $M$ = lower-triangular ones; $MX$ is a prefix sum (causal linear attention is
  this special case).
* ``"toeplitz"``: 1-D RPE $M_{ij} = e^{b_{j-i}}$ (zero above the diagonal when ``causal``), the
  log-linear RPE attention of Luo et al. as a special case; $MX$ by FFT with the Toeplitz helpers
  of `refattn.attention.linear.rpe_fft` ($O(N\log N)$). Parameter ``b`` ``(..., 2N-1)``.
* ``"grid"``: $d$-dimensional RPE on a grid of shape ``grid`` ($N = \prod g_a$, row-major):
  $M_{ij} = e^{b[r_j - r_i]}$, a $d$-level block-Toeplitz matrix, multiplied by a $d$-dimensional
  FFT (`grid_toeplitz_matvec_fft`). Parameter ``b`` ``(..., 2g_1-1, ..., 2g_d-1)``.
* ``"tree"``: $M_{ij} = e^{-\lambda\,\mathrm{dist}_T(i,j)}$ for a weighted tree (``parent``,
  ``edge_weight``), multiplied exactly in $O(N)$ by two passes (`tree_exp_matvec`): up,
  $s_u = x_u + \sum_{c}a_cs_c$; down, $y_c = s_c + a_c(y_{p(c)} - a_cs_c)$, $a_c = e^{-\lambda w_c}$.
  Parameter ``lam`` ``(1,)``.
* ``"dense"``: any given $M$ (``mask``, config), e.g. a graph-diffusion or random-walk kernel; the
  reference for the others.

Backward
--------
With $g_i = \partial L/\partial o_i$: $dn_i = g_i/\mathrm{den}_i$, $c_i = -g_i\cdot o_i/\mathrm{den}_i$;
$d\phi_{q,i} = \sum_e dn_{ie}Y_{i,(\cdot,e)} + c_iY_{i,\phi}$; $dY = [\phi_q\otimes dn,\ c\,\phi_q]$;
$dX = M^\top dY$ (the transpose product: reversed offsets for Toeplitz/grid, the reverse prefix
sum for causal, $M$ itself for the symmetric tree), then $d\phi_{k,j} = dX_{j,\phi} + \sum_e
dX_{j,(\cdot,e)}v_{je}$, $dv_{je} = \sum_l dX_{j,(l,e)}\phi_{k,jl}$ and the feature-map VJP. Mask
parameters: $dM_{ij} = dY_i\cdot X_j$, so for RPE $dc_o = \sum_i dY_i\cdot X_{i+o}$ (an FFT
cross-correlation) and $db = e^b\odot dc$; for the tree
$d\lambda = \sum_i dY_i\cdot\dot Y_i$ with $\dot Y = \partial(MX)/\partial\lambda = -(D\odot M)X$
computed by the forward-mode tangent of the two passes
($\dot a_c = -w_ca_c$, $\dot s_u = \sum_c(\dot a_cs_c + a_c\dot s_c)$,
$\dot y_c = \dot s_c + \dot a_cy_p + a_c\dot y_p - 2a_c\dot a_cs_c - a_c^2\dot s_c$).

Reconstruction and scope
------------------------
No official code: this follows the papers' definitions. The mask parameterisation $e^{b}$
(RPE) and $e^{-\lambda\,\mathrm{dist}}$ (trees; FTFI's exponential family, exact by the two
passes) keeps $M \ge 0$ so the denominator stays positive. Not implemented: RelFlexformer's NU-FFT
masks for arbitrary 3-D positions (needs a non-uniform FFT) and FTFI's general $f_\theta$
families (rational/low displacement rank integrators); both can be applied through ``"dense"``.
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_bool_or_float_mask, as_dout, as_float, check_broadcastable, check_choice, check_positive
from ...registry import Mechanism, Sample, register
from ..softmax.core import sum_to_shape
from ._samples import fd_max_rel, random_qkv
from .core import FEATURE_MAPS, feature_map_backward, feature_map_forward, mT, validate_linear_qkv
from .katharopoulos import linear_attention
from .performer import performer_features_forward, performer_projection_matrix
from .rpe_fft import kernelized_rpe, toeplitz_correlation_fft, toeplitz_dense, toeplitz_matvec_fft

__all__ = [
    "MASK_KINDS",
    "grid_toeplitz_matvec_fft",
    "grid_toeplitz_correlation_fft",
    "grid_toeplitz_dense",
    "tree_exp_matvec",
    "tree_distances",
    "masked_linear_attention_forward",
    "masked_linear_attention_backward",
    "masked_linear_attention",
]

MASK_KINDS = ("dense", "causal", "toeplitz", "grid", "tree")


# --------------------------------------------------------------------------------------------
# d-dimensional (block-)Toeplitz products on a grid


def _grid_filter(c: np.ndarray, grid: tuple) -> np.ndarray:
    """Circulant filter of size 2g per grid axis: h[(i - j) mod 2g] = c[j - i + g - 1] on every axis."""
    h = c
    for ax, g in enumerate(grid):
        axis = h.ndim - len(grid) + ax
        lo = np.take(h, np.arange(g - 1, -1, -1), axis=axis)  # offsets 0, -1, ..., -(g-1) -> t = 0..g-1
        hi = np.take(h, np.arange(2 * g - 2, g - 1, -1), axis=axis)  # offsets g-1 .. 1 -> t = g+1 .. 2g-1
        zero = np.zeros(h.shape[:axis] + (1,) + h.shape[axis + 1:], dtype=h.dtype)
        h = np.concatenate([lo, zero, hi], axis=axis)
    return h


def grid_toeplitz_matvec_fft(c: np.ndarray, x: np.ndarray, grid: tuple) -> np.ndarray:
    r"""$y_i = \sum_j c[r_j - r_i]\,x_j$ for tokens on a row-major grid (unvalidated), by a
    $d$-dimensional FFT of size $2g$ per axis (no wrap-around): $O(FN\log N)$.

    ``c (..., 2g_1-1, ..., 2g_d-1)`` (entry $o + g - 1$ per axis is offset $o = r_j - r_i$),
    ``x (..., N, F)`` with $N = \prod g_a$; ``c``'s leading axes broadcast against ``x``'s. The
    transpose product is the same call with ``c`` flipped on every grid axis.
    """
    k = len(grid)
    L = tuple(2 * g for g in grid)
    xs = x.reshape(x.shape[:-2] + tuple(grid) + (x.shape[-1],))
    caxes = tuple(range(c.ndim - k, c.ndim))
    xaxes = tuple(range(xs.ndim - k - 1, xs.ndim - 1))
    Hf = np.fft.rfftn(_grid_filter(c, grid), s=L, axes=caxes)
    Xf = np.fft.rfftn(xs, s=L, axes=xaxes)
    y = np.fft.irfftn(Hf[..., None] * Xf, s=L, axes=xaxes)
    y = y[(Ellipsis,) + tuple(slice(0, g) for g in grid) + (slice(None),)]
    return y.reshape(x.shape).astype(x.dtype, copy=False)


def grid_toeplitz_correlation_fft(dy: np.ndarray, x: np.ndarray, grid: tuple) -> np.ndarray:
    r"""Gradient of $\langle dy, Cx\rangle$ w.r.t. ``c`` for :func:`grid_toeplitz_matvec_fft`:
    $dc[o] = \sum_i dy_i\cdot x_{i+o}$ (summed over features), shape ``(..., 2g_1-1, ..., 2g_d-1)``."""
    k = len(grid)
    L = tuple(2 * g for g in grid)
    ys = dy.reshape(dy.shape[:-2] + tuple(grid) + (dy.shape[-1],))
    xs = x.reshape(x.shape[:-2] + tuple(grid) + (x.shape[-1],))
    axes = tuple(range(xs.ndim - k - 1, xs.ndim - 1))
    R = np.fft.irfftn(np.conj(np.fft.rfftn(ys, s=L, axes=axes)) * np.fft.rfftn(xs, s=L, axes=axes), s=L, axes=axes)
    R = R.sum(axis=-1)
    for ax, g in enumerate(grid):
        axis = R.ndim - k + ax
        R = np.concatenate([np.take(R, np.arange(g + 1, 2 * g), axis=axis), np.take(R, np.arange(0, g), axis=axis)],
                           axis=axis)
    return R.astype(x.dtype, copy=False)


def grid_toeplitz_dense(c: np.ndarray, grid: tuple) -> np.ndarray:
    """The dense ``(..., N, N)`` matrix $M_{ij} = c[r_j - r_i]$ of :func:`grid_toeplitz_matvec_fft`."""
    r = np.stack(np.unravel_index(np.arange(int(np.prod(grid))), grid), axis=-1)  # (N, k)
    off = r[None, :, :] - r[:, None, :] + np.asarray(grid) - 1  # (N, N, k)
    return c[(Ellipsis,) + tuple(off[..., a] for a in range(len(grid)))]


# --------------------------------------------------------------------------------------------
# Exponential tree-distance masks


def _tree_order(parent: np.ndarray) -> np.ndarray:
    """Nodes in breadth-first order from the root (parents before children)."""
    children = [[] for _ in parent]
    root = -1
    for u, p in enumerate(parent):
        if p < 0:
            root = u
        else:
            children[p].append(u)
    order, head = [root], 0
    while head < len(order):
        order.extend(children[order[head]])
        head += 1
    return np.asarray(order)


def tree_exp_matvec(x: np.ndarray, lam: float, parent: np.ndarray, edge_weight: np.ndarray, *, tangent: bool = False):
    r"""$y = Mx$ with $M_{ij} = e^{-\lambda\,\mathrm{dist}_T(i,j)}$ over axis -2 of ``x (..., N, F)``, in $O(N)$
    by the two passes of the module docstring (unvalidated; ``parent[root] = -1``). With
    ``tangent`` also returns $\dot y = \partial y/\partial\lambda = -(D\odot M)x$."""
    order = _tree_order(parent)
    a = np.exp(-lam * edge_weight)
    ad = -edge_weight * a
    s = np.array(x, copy=True)
    sd = np.zeros_like(x) if tangent else None
    for u in order[::-1]:  # children before parents
        p = parent[u]
        if p >= 0:
            s[..., p, :] += a[u] * s[..., u, :]
            if tangent:
                sd[..., p, :] += ad[u] * s[..., u, :] + a[u] * sd[..., u, :]
    y = np.empty_like(x)
    yd = np.empty_like(x) if tangent else None
    for u in order:
        p = parent[u]
        if p < 0:
            y[..., u, :] = s[..., u, :]
            if tangent:
                yd[..., u, :] = sd[..., u, :]
        else:
            y[..., u, :] = s[..., u, :] + a[u] * (y[..., p, :] - a[u] * s[..., u, :])
            if tangent:
                yd[..., u, :] = (sd[..., u, :] + ad[u] * y[..., p, :] + a[u] * yd[..., p, :]
                                 - 2 * a[u] * ad[u] * s[..., u, :] - a[u] ** 2 * sd[..., u, :])
    return (y, yd) if tangent else y


def tree_distances(parent: np.ndarray, edge_weight: np.ndarray) -> np.ndarray:
    """All-pairs weighted tree distances ``(N, N)`` (for the dense reference)."""
    n = len(parent)
    order = _tree_order(parent)
    depth = np.zeros(n)
    anc = [[u] for u in range(n)]
    for u in order:
        if parent[u] >= 0:
            depth[u] = depth[parent[u]] + edge_weight[u]
            anc[u] = [u] + anc[parent[u]]
    D = np.zeros((n, n))
    for i in range(n):
        si = set(anc[i])
        for j in range(n):
            lca = next(w for w in anc[j] if w in si)
            D[i, j] = depth[i] + depth[j] - 2 * depth[lca]
    return D


# --------------------------------------------------------------------------------------------
# Attention


def _validate_tree(parent, edge_weight, n):
    try:
        parent = np.asarray(parent)
    except Exception as exc:  # noqa: BLE001
        raise TypeError(f"parent could not be converted to an array: {exc}") from None
    if parent.shape != (n,) or parent.dtype.kind not in "iu":
        raise ValueError(f"parent must be an int array of shape (N={n},) (parent index, -1 at the root); "
                         f"got {parent.dtype} {parent.shape}")
    if np.sum(parent < 0) != 1 or np.any(parent >= n):
        raise ValueError("parent must name exactly one root (-1) and valid parent indices")
    if len(_tree_order(parent)) != n:
        raise ValueError("parent does not describe a tree (some node is unreachable from the root)")
    w = as_float(edge_weight, "edge_weight", ndim=1)
    if w.shape != (n,) or np.any(w < 0):
        raise ValueError(f"edge_weight must be a non-negative array of shape (N={n},); got {w.shape}")
    return parent, w


def _mask_params(params, kind, q, grid):
    if kind in ("dense", "causal"):
        if params:
            raise ValueError(f"mask_kind={kind!r} has no parameters; got params with keys {sorted(params)}")
        return {}
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict with {'lam' if kind == 'tree' else 'b'}; got {type(params).__name__}")
    key = "lam" if kind == "tree" else "b"
    if set(params) != {key}:
        raise ValueError(f"params for mask_kind={kind!r} must have the single key {key!r}; got {sorted(params)}")
    arr = as_float(params[key], key, min_ndim=1)
    if kind == "tree":
        if arr.shape != (1,):
            raise ValueError(f"lam must have shape (1,); got {arr.shape}")
        return {"lam": arr.astype(q.dtype, copy=False)}
    n = q.shape[-2]
    tail = (2 * n - 1,) if kind == "toeplitz" else tuple(2 * g - 1 for g in grid)
    if arr.shape[arr.ndim - len(tail):] != tail or arr.ndim < len(tail):
        raise ValueError(f"b must end with the offset axes {tail} for mask_kind={kind!r}; got shape {arr.shape}")
    check_broadcastable("b", arr.shape[: arr.ndim - len(tail)], q.shape[:-2], "q's leading axes")
    return {"b": arr.astype(q.dtype, copy=False)}


def masked_linear_attention_forward(q, k, v, params=None, *, mask_kind: str = "dense", mask=None, grid=None,
                                    parent=None, edge_weight=None, causal: bool = False,
                                    feature_map: str = "elu_plus_one", eps: float = 1e-6):
    r"""Structured-mask linear attention (Choromanski et al., ICML 2022, arXiv 2107.07999).

    $O = [M\odot\Phi_Q\Phi_K^\top]V\oslash([M\odot\Phi_Q\Phi_K^\top]\mathbf 1 + \epsilon)$ computed with
    products by $M$ only (module docstring).

    Parameters
    ----------
    q (..., N, d), k (..., M, d), v (..., M, dv)
        ``M == N`` except for ``mask_kind="dense"``.
    params : dict, optional
        ``{"b"}`` for ``toeplitz`` ``(..., 2N-1)`` / ``grid`` ``(..., 2g_1-1, ...)`` (log-mask,
        leading axes broadcast against ``q``'s); ``{"lam": (1,)}`` for ``tree``; none otherwise.
    mask_kind : {"dense", "causal", "toeplitz", "grid", "tree"}
    mask : array (..., N, M), config
        The dense mask (non-negative; boolean accepted as 0/1), broadcast against ``q``'s leading axes.
    grid : tuple of ints
        Grid shape for ``"grid"`` ($\prod$ = N, tokens row-major).
    parent, edge_weight : (N,) arrays
        The tree for ``"tree"`` (``parent[root] = -1``, ``edge_weight[u]`` the length of the
        edge to the parent).
    causal : bool
        ``toeplitz`` only: zero the positive offsets.
    feature_map : {"elu_plus_one", "identity"}
    eps : float
        Added to the denominator.
    """
    check_choice(mask_kind, "mask_kind", MASK_KINDS)
    check_choice(feature_map, "feature_map", FEATURE_MAPS)
    eps = check_positive(eps, "eps", allow_zero=True)
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be a bool; got {type(causal).__name__}")
    if causal and mask_kind != "toeplitz":
        raise ValueError("causal=True applies to mask_kind='toeplitz' (use mask_kind='causal' for the plain causal mask)")
    q, k, v = validate_linear_qkv(q, k, v, same_length=mask_kind != "dense")
    n = q.shape[-2]
    ctx = {"kind": mask_kind, "causal": bool(causal)}
    if mask_kind == "grid":
        if not isinstance(grid, (tuple, list)) or not grid or any(
                isinstance(g, (bool, np.bool_)) or not isinstance(g, (int, np.integer)) or g < 1 for g in grid):
            raise ValueError(f"grid must be a non-empty tuple of positive ints; got {grid!r}")
        if int(np.prod(grid)) != n:
            raise ValueError(f"grid {tuple(grid)} must have prod(grid) == N = {n}")
        ctx["grid"] = tuple(int(g) for g in grid)
    P = _mask_params(params if params is not None else {}, mask_kind, q, ctx.get("grid"))
    if mask_kind == "dense":
        m = as_bool_or_float_mask(mask, "mask")
        if m is None:
            raise ValueError("mask (..., N, M) is required for mask_kind='dense'")
        m = m.astype(q.dtype)
        if m.ndim < 2:
            raise ValueError(f"mask must have at least 2 dimensions (..., N, M); got shape {m.shape}")
        check_broadcastable("mask", m.shape, q.shape[:-2] + (n, k.shape[-2]), "(..., N, M)")
        if not np.all(np.isfinite(m)) or np.any(m < 0):
            raise ValueError("mask must be finite and non-negative (a negative mask can zero the denominator)")
        ctx["M"] = m
    elif mask_kind in ("toeplitz", "grid"):
        c = np.exp(P["b"])
        if mask_kind == "toeplitz" and causal:
            c = np.where(np.arange(2 * n - 1) > n - 1, 0.0, c).astype(q.dtype)
        ctx["c"] = c
    elif mask_kind == "tree":
        ctx["parent"], ctx["w"] = _validate_tree(parent, edge_weight, n)
        ctx["w"] = ctx["w"].astype(q.dtype, copy=False)
        ctx["lam"] = float(P["lam"][0])
    fq, fk = feature_map_forward(q, feature_map), feature_map_forward(k, feature_map)
    m_, dv = fk.shape[-1], v.shape[-1]
    X = np.concatenate([(fk[..., :, None] * v[..., None, :]).reshape(fk.shape[:-1] + (m_ * dv,)), fk], axis=-1)
    Y = _mask_matvec(ctx, X)
    U, u = Y[..., : m_ * dv].reshape(Y.shape[:-1] + (m_, dv)), Y[..., m_ * dv:]
    num = np.einsum("...na,...nae->...ne", fq, U)
    den = np.einsum("...na,...na->...n", fq, u) + eps
    den = np.where(den == 0, 1.0, den)
    out = num / den[..., None]
    cache = {"q": q, "k": k, "v": v, "fq": fq, "fk": fk, "X": X, "U": U, "u": u, "den": den, "out": out,
             "ctx": ctx, "feature_map": feature_map, "P": P}
    return out.copy(), cache


def _mask_matvec(ctx, X, transpose=False):
    kind = ctx["kind"]
    if kind == "dense":
        return (mT(ctx["M"]) if transpose else ctx["M"]) @ X
    if kind == "causal":
        return np.cumsum(X[..., ::-1, :], axis=-2)[..., ::-1, :] if transpose else np.cumsum(X, axis=-2)
    if kind == "toeplitz":
        return toeplitz_matvec_fft(ctx["c"][..., ::-1] if transpose else ctx["c"], X)
    if kind == "grid":
        c = ctx["c"]
        if transpose:
            c = c[(Ellipsis,) + (slice(None, None, -1),) * len(ctx["grid"])]
        return grid_toeplitz_matvec_fft(c, X, ctx["grid"])
    return tree_exp_matvec(X, ctx["lam"], ctx["parent"], ctx["w"])  # symmetric


def masked_linear_attention_backward(dout, cache):
    r"""Gradients ``{"q", "k", "v"}`` and the mask parameter of :func:`masked_linear_attention_forward`
    (transpose products by $M$ and the parameter rules of the module docstring)."""
    out = cache["out"]
    g = as_dout(dout, out.shape, out.dtype)
    fq, fk, v, X, U, u, den, ctx = (cache[key] for key in ("fq", "fk", "v", "X", "U", "u", "den", "ctx"))
    m_, dv = fk.shape[-1], v.shape[-1]
    dn = g / den[..., None]
    cc = -np.sum(g * out, axis=-1) / den
    dfq = np.einsum("...ne,...nae->...na", dn, U) + cc[..., None] * u
    dY = np.concatenate([(fq[..., :, None] * dn[..., None, :]).reshape(fq.shape[:-1] + (m_ * dv,)),
                         cc[..., None] * fq], axis=-1)
    dX = _mask_matvec(ctx, dY, transpose=True)
    dG = dX[..., : m_ * dv].reshape(dX.shape[:-1] + (m_, dv))
    dfk = dX[..., m_ * dv:] + np.einsum("...nae,...ne->...na", dG, v)
    grads = {"q": feature_map_backward(dfq, cache["q"], cache["feature_map"]),
             "k": feature_map_backward(dfk, cache["k"], cache["feature_map"]),
             "v": np.einsum("...nae,...na->...ne", dG, fk)}
    kind = ctx["kind"]
    if kind == "toeplitz":
        grads["b"] = sum_to_shape(toeplitz_correlation_fft(dY, X) * ctx["c"], cache["P"]["b"].shape)
    elif kind == "grid":
        grads["b"] = sum_to_shape(grid_toeplitz_correlation_fft(dY, X, ctx["grid"]) * ctx["c"], cache["P"]["b"].shape)
    elif kind == "tree":
        _, Yd = tree_exp_matvec(X, ctx["lam"], ctx["parent"], ctx["w"], tangent=True)
        grads["lam"] = np.array([np.sum(dY * Yd)], dtype=out.dtype)
    return grads


def masked_linear_attention(q, k, v, params=None, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`masked_linear_attention_forward`."""
    return masked_linear_attention_forward(q, k, v, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _dense_mask(params, *, mask_kind, n, mask=None, grid=None, parent=None, edge_weight=None, causal=False):
    if mask_kind == "dense":
        return np.asarray(mask, dtype=float)
    if mask_kind == "causal":
        return np.tril(np.ones((n, n)))
    if mask_kind == "toeplitz":
        M = toeplitz_dense(np.exp(params["b"]))
        return np.tril(M) if causal else M
    if mask_kind == "grid":
        return grid_toeplitz_dense(np.exp(params["b"]), tuple(grid))
    return np.exp(-params["lam"][0] * tree_distances(np.asarray(parent), np.asarray(edge_weight)))


def _reference(q, k, v, params=None, *, mask_kind="dense", mask=None, grid=None, parent=None, edge_weight=None,
               causal=False, feature_map="elu_plus_one", eps=1e-6):
    """Explicit O(N^2) form: A = M (.) phi(Q) phi(K)^T, O = AV / (A1 + eps)."""
    M = _dense_mask(params, mask_kind=mask_kind, n=q.shape[-2], mask=mask, grid=grid, parent=parent,
                    edge_weight=edge_weight, causal=causal)
    A = M * (feature_map_forward(q, feature_map) @ mT(feature_map_forward(k, feature_map)))
    return (A @ v) / (A.sum(-1, keepdims=True) + eps)


def _random_tree(rng, n):
    parent = np.array([-1] + [int(rng.integers(0, i)) for i in range(1, n)])
    perm = rng.permutation(n)  # relabel so the root is not always node 0
    new_parent = np.full(n, -1)
    for u in range(n):
        if parent[u] >= 0:
            new_parent[perm[u]] = perm[parent[u]]
    return new_parent, rng.uniform(0.3, 1.5, n)


def _sample_kind(rng, size, kind):
    grid = None
    if kind == "grid":
        grid = (2, 2) if size == "tiny" else (3, 4)
    q, k, v = random_qkv(rng, size, same_length=kind != "dense")
    if grid is not None:
        n = int(np.prod(grid))
        q, k, v = (rng.standard_normal(a.shape[:-2] + (n, a.shape[-1])) for a in (q, k, v))
    n, H = q.shape[-2], q.shape[1]
    params, config = None, {"mask_kind": kind}
    if kind == "dense":
        config["mask"] = rng.uniform(0.1, 1.0, (H, n, k.shape[-2]))
    elif kind == "toeplitz":
        params = {"b": 0.5 * rng.standard_normal((H, 2 * n - 1))}
        config["causal"] = bool(rng.integers(0, 2))
    elif kind == "grid":
        params = {"b": 0.5 * rng.standard_normal((H,) + tuple(2 * g - 1 for g in grid))}
        config["grid"] = grid
    elif kind == "tree":
        params = {"lam": np.array([rng.uniform(0.3, 1.2)])}
        config["parent"], config["edge_weight"] = _random_tree(rng, n)
    return Sample(inputs={"q": q, "k": k, "v": v}, params=params, config=config)


def _sample(rng, size):
    return _sample_kind(rng, size, MASK_KINDS[int(rng.integers(0, len(MASK_KINDS)))])


def _check_every_kind_equals_dense(rng):
    err = 0.0
    for kind in MASK_KINDS:
        for _ in range(2):
            s = _sample_kind(rng, "small", kind)
            out = masked_linear_attention(**s.inputs, params=s.params, **s.config)
            err = max(err, float(np.max(np.abs(out - _reference(**s.inputs, params=s.params, **s.config)))))
    assert err < 1e-10, err
    return err


def _check_special_cases(rng):
    """All-ones mask = unmasked linear attention; the causal mask = the causal scan; zero RPE
    logits = unmasked; a 1-D grid = the 1-D Toeplitz mask; Toeplitz on Performer features = the
    kernelized RPE attention of Luo et al.; the n-D FFT product equals its dense matrix."""
    q, k, v = random_qkv(rng, "small")
    n = q.shape[-2]
    errs = [np.max(np.abs(masked_linear_attention(q, k, v, mask_kind="dense", mask=np.ones((n, n)))
                          - linear_attention(q, k, v))),
            np.max(np.abs(masked_linear_attention(q, k, v, mask_kind="causal") - linear_attention(q, k, v, causal=True))),
            np.max(np.abs(masked_linear_attention(q, k, v, {"b": np.zeros(2 * n - 1)}, mask_kind="toeplitz")
                          - linear_attention(q, k, v)))]
    b = rng.standard_normal((q.shape[1], 2 * n - 1))
    errs.append(np.max(np.abs(masked_linear_attention(q, k, v, {"b": b}, mask_kind="toeplitz")
                              - masked_linear_attention(q, k, v, {"b": b}, mask_kind="grid", grid=(n,)))))
    proj = performer_projection_matrix(6, q.shape[-1], seed=1)  # Luo et al.'s RPE attention is a special case
    fq, _ = performer_features_forward(q, proj, is_query=True)
    fk, _ = performer_features_forward(k, proj, is_query=False)
    errs.append(np.max(np.abs(masked_linear_attention(fq, fk, v, {"b": b}, mask_kind="toeplitz", feature_map="identity",
                                                      eps=0.0) - kernelized_rpe(q, k, v, {"b": b}, projection=proj))))
    c = rng.standard_normal((2, 5, 7))
    x = rng.standard_normal((2, 12, 3))
    errs.append(np.max(np.abs(grid_toeplitz_matvec_fft(c, x, (3, 4)) - grid_toeplitz_dense(c, (3, 4)) @ x)))
    err = float(max(errs))
    assert err < 1e-10, errs
    return err


def _check_tree_passes(rng):
    """The O(N) two-pass tree product equals exp(-lam D) x, and its tangent equals -(D (.) M) x."""
    parent, w = _random_tree(rng, 9)
    x = rng.standard_normal((2, 9, 3))
    D = tree_distances(parent, w)
    y, yd = tree_exp_matvec(x, 0.7, parent, w, tangent=True)
    M = np.exp(-0.7 * D)
    err = max(float(np.max(np.abs(y - M @ x))), float(np.max(np.abs(yd + (D * M) @ x))))
    assert err < 1e-12, err
    return err


def _check_fd_every_kind(rng):
    errs = []
    for kind in MASK_KINDS:
        s = _sample_kind(rng, "tiny", kind)
        inputs = {key: val[:1, :1] for key, val in s.inputs.items()}
        params = None if s.params is None else {key: (val[:1] if key == "b" else val) for key, val in s.params.items()}
        config = dict(s.config)
        if kind == "dense":
            config["mask"] = config["mask"][:1]
        errs.append(fd_max_rel(masked_linear_attention_forward, masked_linear_attention_backward,
                               Sample(inputs, params, config)))
    return max(errs)


register(
    Mechanism(
        slug="masked_linear_attention_structured", family="4-linear-kernel-sparse", tier="T2",
        title="Structured-mask linear attention: causal, Toeplitz/d-dim RPE by FFT, exponential tree masks, dense",
        paper="Choromanski, Lin, Chen, Zhang, Sehanobish, Likhosherstov, Parker-Holder, Sarlos, Weller, Weingarten, "
              "'From block-Toeplitz matrices to differential equations on graphs: towards a general theory for "
              "scalable masked Transformers', ICML 2022, arXiv 2107.07999",
        forward=masked_linear_attention_forward, backward=masked_linear_attention_backward, sample=_sample,
        reference=_reference,
        checks={"every_kind_equals_dense": _check_every_kind_equals_dense,
                "special_cases": _check_special_cases,
                "tree_two_pass_and_tangent": _check_tree_passes,
                "gradcheck_every_kind": _check_fd_every_kind},
        docs="linear/kernel-features.md#masked-linear-attention",
    ),
)
