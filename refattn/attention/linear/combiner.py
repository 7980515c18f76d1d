r"""Combiner: full (causal) attention through a structured factorisation of the attention distribution.

Ren, Dai, Dai, Yang, Leskovec, Schuurmans, Dai, "Combiner: Full Attention Transformer with Sparse
Computation Cost", NeurIPS 2021, arXiv 2107.05768. Follows google-research/google-research
``combiner/combiner/jax/model/layer.py@4c4299485319ed72ef782020c81784be5468924e`` (``_SelfAttSqrtn``:
Combiner-Fixed; ``_AxialMixtureAtt``: Combiner-Axial and its mixture) and, for the pooling options,
``combiner/combiner/tf/approx_attention.py@5b09c22d73a9d35eb6c5d2a99b95677a45053466``.

The factorisation
-----------------
Attention is $o_i = \mathbb E_{p(j|i)}[v_j]$. Combiner writes $p(j|i)$ as a *direct* part on a support
$\Omega_i^0$ and, for every *region* $\Omega_r$ that query $i$ attends, the region's probability times a
local distribution inside it:

$$p(j|i) = p_{ij}\,[j\in\Omega_i^0] + \sum_{r\in R_i} p_{ir}\,q(j|\Omega_r)\,[j\in\Omega_r],\qquad
[p_{i\cdot}, p_{ir}] = \mathrm{softmax}\big([s\,q_i\cdot k_j]_{j\in\Omega_i^0},
[s\,q_i\cdot\bar k_r]_{r\in R_i}\big),$$

$q(j|\Omega_r) = \mathrm{softmax}_{j\in\Omega_r}(s\,\bar q_r\cdot k_j)$ with pooled region keys and
queries $\bar k_r = \mathrm{pool}_{j\in\Omega_r}k_j$, $\bar q_r = \mathrm{pool}_{j\in\Omega_r}q_j$
(``pooling="max"`` as the JAX code, element-wise; ``"sum"`` as the TF ``approx_cummax``). So
$o_i = \sum_{j\in\Omega_i^0}p_{ij}v_j + \sum_{r}p_{ir}\bar v_r$ with region values
$\bar v_r = \sum_{j\in\Omega_r}q(j|\Omega_r)v_j$, and $p(\cdot|i)$ sums to one. With $N = SL$ positions
laid out as $S$ rows of $L$ (``seg_len``), $n = sL + u$, the variants (all causal) are:

* ``"fixed"`` (Combiner-Fixed, ``_SelfAttSqrtn``): $\Omega^0$ = own row up to $u$; regions = every
  earlier row $r < s$ (pooled over the whole row). Cost $O(N(L + S))$.
* ``"axial"`` (Combiner-Axial): $\Omega^0$ = own row up to $u$ and own column above ($r < s$);
  regions = the other columns $t\ne u$ above row $s$ (pooled over the column prefix). Cost
  $O(N(L + S))$.
* ``"mixture"`` (``_AxialMixtureAtt``, default): the axial terms plus, for every earlier row
  $r < s$, the part left of column $u$ and the part right of it as two more regions. Every earlier
  token is then reachable through two regions: a mixture of two factorisations.

Prefix regions share their pooling and local softmax: the JAX code computes all column prefixes at
once (cumulative max of $q$ and $k$ down the column, a causal attention along the column, a shift by
one), likewise along rows in both directions; this module does the same (`combiner_region_summaries`).
The **explicit factorised dense form** is the $N\times N$ matrix $A_{ij} = p(j|i)$ built entry by entry
from the sets $\Omega$ (the record's reference), $O = AV$; it is lower triangular with rows summing
to one and *every* $A_{ij}$, $j \le i$, positive: full attention (named check).

Backward
--------
The joint softmax VJP gives $dz$ for every direct and region logit; a group with logits
$z = s\,q\cdot K$ and values $W$ contributes $dq \mathrel{+}= s\,dz\,K$, $dK = s\,dz^\top q$,
$dW = P^\top g$. Region keys and values flow back through the summaries: the shift (its adjoint
shifts back), the local causal attention (`refattn.attention.softmax.core.attention_core_backward`:
$d\bar q$, $dk$, $dv$), and the pooling — a cumulative max routes each gradient to the element that
holds the running maximum (held fixed: ties are measure zero), a cumulative sum's adjoint is the
reverse cumulative sum.

The layer and conventions
-------------------------
$Q = XW_Q$, $K = XW_K$, $V = XW_V$ (no biases, flax ``DenseGeneral(use_bias=False)``), $H$ heads,
output $W_O$; ``scale`` $s = d^{-1/2}$ (upstream divides $Q$ by $\sqrt d$ before pooling; max and sum
pooling commute with that). Parameter names ``query.kernel``, ``key.kernel``, ``value.kernel``
``(C, H d)`` and ``out.kernel`` ``(H d, C)`` — flax's ``(C, H, d)`` and ``(H, d, C)`` kernels reshaped.
Masks are exact ($-\infty$; upstream adds $-10^{10}$, identical after the exponential). Not implemented:
Combiner-Logsparse, the axial "row-major" variant with learned row summaries, the bidirectional TF
``axial_mixture_bidir``, dropout.

Agreement with upstream: JAX/flax are not installed; ``_SelfAttSqrtn`` and ``_AxialMixtureAtt``
(``cummax``, ``shift_right``/``shift_left``, the five logit groups and their masks) were transcribed
to PyTorch line by line (float64; ``torch.cummax`` for ``jax.lax.cummax``), 12 configurations
(fixed and mixture, max pooling, $S\times L$ grids 3x3, 3x4, 4x3, 2x5, two heads): output 1.3e-15,
every gradient (input and the four kernels) <= 1.1e-15 relative. The ``"axial"`` variant is the
first three of the mixture's five groups and ``"sum"`` pooling is the TF code's ``approx_cummax``
(both checked against the dense form only).
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_choice, check_int, check_params, check_positive, compute_dtype
from ...nn.linear import merge_heads, split_heads
from ...nn.softmax import softmax_lse, softmax_vjp
from ...registry import Mechanism, Sample, register
from ..softmax.core import attention_core_backward, attention_core_forward

__all__ = ["COMBINER_VARIANTS", "COMBINER_POOLING", "combiner_region_summaries", "combiner_core_forward",
           "combiner_core_backward", "combiner_attention_forward", "combiner_attention_backward",
           "combiner_attention", "combiner_dense_matrix"]

COMBINER_VARIANTS = ("mixture", "axial", "fixed")
COMBINER_POOLING = ("max", "sum")
_Q = "bhsud"  # query grid index: batch, head, row s, column u, feature d


# --------------------------------------------------------------------------------------------
# Pooling along one grid axis (inclusive prefix, exclusive prefix, or whole axis)


def _flip(x, axis, reverse):
    return np.flip(x, axis) if reverse else x


def _shift(x, axis, k):
    """Shift by ``k`` (+1 right, -1 left) along ``axis``, zero fill (upstream ``shift_right``/``shift_left``)."""
    out = np.zeros_like(x)
    n = x.shape[axis]
    src = [slice(None)] * x.ndim
    dst = [slice(None)] * x.ndim
    src[axis], dst[axis] = (slice(0, n - 1), slice(1, n)) if k > 0 else (slice(1, n), slice(0, n - 1))
    out[tuple(dst)] = x[tuple(src)]
    return out


def _prefix_pool(x, axis, reverse, pooling):
    """Inclusive cumulative pool along ``axis`` (from the end when ``reverse``); returns ``(y, route)``."""
    xf = _flip(x, axis, reverse)
    if pooling == "sum":
        return _flip(np.cumsum(xf, axis=axis), axis, reverse), None
    y = np.maximum.accumulate(xf, axis=axis)
    n = x.shape[axis]
    shape = [1] * x.ndim
    shape[axis] = n
    pos = np.arange(n).reshape(shape)
    # the arg-max of every prefix is the most recent position that set a new running maximum
    arg = np.maximum.accumulate(np.where(xf == y, pos, 0), axis=axis)
    return _flip(y, axis, reverse), arg


def _prefix_pool_vjp(g, axis, reverse, pooling, route):
    gf = _flip(g, axis, reverse)
    if pooling == "sum":
        return _flip(np.flip(np.cumsum(np.flip(gf, axis), axis=axis), axis), axis, reverse)
    n = g.shape[axis]
    gm, am = np.moveaxis(gf, axis, -1), np.moveaxis(route, axis, -1)
    onehot = am[..., None] == np.arange(n)  # (..., out, in)
    dx = np.einsum("...o,...oi->...i", gm, onehot.astype(g.dtype))
    return _flip(np.moveaxis(dx, -1, axis), axis, reverse)


def _whole_pool(x, axis, pooling):
    if pooling == "sum":
        return np.sum(x, axis=axis), None
    return np.max(x, axis=axis), np.argmax(x, axis=axis)


def _whole_pool_vjp(g, x_shape, axis, pooling, route):
    n = x_shape[axis]
    if pooling == "sum":
        return np.repeat(np.expand_dims(g, axis), n, axis=axis)
    onehot = np.moveaxis(route[..., None] == np.arange(n), -1, axis)
    return np.expand_dims(g, axis) * onehot


# --------------------------------------------------------------------------------------------
# Region summaries


def combiner_region_summaries(q, k, v, axis: int, reverse: bool, pooling: str, scale: float):
    r"""Exclusive prefix-region summaries along a grid axis of ``q, k, v (B, H, S, L, d)``: at position
    $p$ the region is $\{t < p\}$ (``reverse``: $t > p$) along ``axis`` (``-3`` down a column, ``-2``
    along a row). Returns ``(keys, values, state)``: pooled keys $\bar k$ and local-softmax values
    $\bar v$ of those regions (zero where the region is empty)."""
    qp, qroute = _prefix_pool(q, axis, reverse, pooling)
    kp, kroute = _prefix_pool(k, axis, reverse, pooling)
    keys = _shift(kp, axis, -1 if reverse else 1)
    qa, ka, va = (_flip(np.moveaxis(a, axis, -2), -2, reverse) for a in (qp, k, v))
    summ, core = attention_core_forward(qa, ka, va, is_causal=True, scale=scale)
    summ = np.moveaxis(_flip(summ, -2, reverse), -2, axis)
    values = _shift(summ, axis, -1 if reverse else 1)
    return keys, values, (axis, reverse, pooling, qroute, kroute, core)


def _region_summaries_vjp(dkeys, dvalues, state):
    """Gradients ``(dq, dk, dv)`` of `combiner_region_summaries`."""
    axis, reverse, pooling, qroute, kroute, core = state
    back = 1 if reverse else -1  # the adjoint of a shift is the opposite shift
    dk = _prefix_pool_vjp(_shift(dkeys, axis, back), axis, reverse, pooling, kroute)
    dsumm = _flip(np.moveaxis(_shift(dvalues, axis, back), axis, -2), -2, reverse)
    dc = attention_core_backward(dsumm, core)
    dq, dk2, dv = (np.moveaxis(_flip(dc[n], -2, reverse), -2, axis) for n in ("q", "k", "v"))
    dq = _prefix_pool_vjp(dq, axis, reverse, pooling, qroute)
    return dq, dk + dk2, dv


# --------------------------------------------------------------------------------------------
# The core: joint softmax over direct and region logit groups


def _groups(q, k, v, variant, pooling, scale):
    """The logit groups of a variant: ``(index pattern of K, K, W, mask over the group's logits)``."""
    s_rows, l_cols = q.shape[-3], q.shape[-2]
    rs, ru = np.arange(s_rows), np.arange(l_cols)
    groups, states = [], []
    # own row, columns t <= u (every variant)
    groups.append(("bhstd", k, v, (ru[None, :, None] >= ru[None, None, :])))  # (s, u, t)
    if variant == "fixed":
        qbar, qroute = _whole_pool(q, -2, pooling)
        kbar, kroute = _whole_pool(k, -2, pooling)
        vbar, core = attention_core_forward(qbar[..., None, :], k, v, scale=scale)
        groups.append(("bhrd", kbar, vbar[..., 0, :], (rs[:, None, None] > rs[None, None, :])))  # (s, u, r)
        states.append(("fixed", qroute, kroute, core, q.shape))
        return groups, states
    # own column, rows r < s
    groups.append(("bhrud", k, v, (rs[:, None, None] > rs[None, None, :])))
    # other columns t != u above row s: exclusive column-prefix regions at (s, t)
    kc, vc, st = combiner_region_summaries(q, k, v, -3, False, pooling, scale)
    groups.append(("bhstd", kc, vc, (ru[None, :, None] != ru[None, None, :]) & (rs[:, None, None] >= 1)))
    states.append(("col", st))
    if variant == "mixture":
        for reverse, ok in ((False, ru >= 1), (True, ru <= l_cols - 2)):
            kr, vr, st = combiner_region_summaries(q, k, v, -2, reverse, pooling, scale)
            groups.append(("bhrud", kr, vr, (rs[:, None, None] > rs[None, None, :]) & ok[None, :, None]))
            states.append(("row", st))
    return groups, states


def combiner_core_forward(q, k, v, *, seg_len: int, variant: str = "mixture", pooling: str = "max", scale=None):
    r"""Combiner attention on ``q, k, v (..., N, d)`` (equal leading axes, $N$ a multiple of ``seg_len``):
    one joint softmax over the variant's direct and region logits (module docstring). Unvalidated
    keywords are validated here; returns ``(out (..., N, d_v), cache)``."""
    q = as_float(q, "q", min_ndim=3)
    k = as_float(k, "k", min_ndim=3)
    v = as_float(v, "v", min_ndim=3)
    if k.shape != q.shape or v.shape[:-1] != q.shape[:-1]:
        raise ValueError(f"q and k (..., N, d) must have one shape and v (..., N, d_v) their leading axes; got "
                         f"q {q.shape}, k {k.shape}, v {v.shape}")
    seg = check_int(seg_len, "seg_len", minimum=1)
    check_choice(variant, "variant", COMBINER_VARIANTS)
    check_choice(pooling, "pooling", COMBINER_POOLING)
    n, d = q.shape[-2], q.shape[-1]
    if n % seg:
        raise ValueError(f"the sequence length of q (axis -2, {n}) must be a multiple of seg_len={seg}")
    scale = check_positive(scale, "scale", allow_none=True)
    dt = compute_dtype(q, k, v)
    q, k, v = (a.astype(dt, copy=False) for a in (q, k, v))
    s = float(d ** -0.5) if scale is None else scale
    lead = q.shape[:-2]
    grid = (-1, 1, n // seg, seg)
    qg, kg = q.reshape(grid + (d,)), k.reshape(grid + (d,))
    vg = v.reshape(grid + (v.shape[-1],))
    groups, states = _groups(qg, kg, vg, variant, pooling, s)
    zs = []
    for kidx, kk, _, mask in groups:
        z = s * np.einsum(f"{_Q},{kidx}->{_zidx(kidx)}", qg, kk)
        zs.append(np.where(mask, z, -np.inf))
    sizes = [z.shape[-1] for z in zs]
    p, _ = softmax_lse(np.concatenate(zs, axis=-1), axis=-1)
    ps = np.split(p, np.cumsum(sizes)[:-1], axis=-1)
    out = sum(np.einsum(f"{_zidx(kidx)},{kidx}->{_Q}", pp, w) for (kidx, _, w, _), pp in zip(groups, ps))
    cache = {"qg": qg, "groups": groups, "states": states, "p": p, "sizes": sizes, "scale": s,
             "out_grid": out.shape, "shapes": (q.shape, k.shape, v.shape)}
    return out.reshape(lead + (n, v.shape[-1])), cache


def _zidx(kidx):
    """The logit index pattern of a group: the query's ``bhsu`` plus the key's own position letter."""
    return "bhsu" + ("r" if "r" in kidx else "t")


def combiner_core_backward(dout, cache):
    r"""Gradients ``{"q", "k", "v"}`` of `combiner_core_forward` (joint softmax VJP, group chain rules,
    summary VJPs: shift, local attention, pooling)."""
    qg, groups, p, s = cache["qg"], cache["groups"], cache["p"], cache["scale"]
    grid = cache["out_grid"]
    g = as_dout(dout, cache["shapes"][0][:-1] + (grid[-1],), p.dtype).reshape(grid)
    ps = np.split(p, np.cumsum(cache["sizes"])[:-1], axis=-1)
    dps = [np.einsum(f"{_Q},{kidx}->{_zidx(kidx)}", g, w) for kidx, _, w, _ in groups]
    dz = softmax_vjp(p, np.concatenate(dps, axis=-1))
    dzs = np.split(dz, np.cumsum(cache["sizes"])[:-1], axis=-1)
    dq = np.zeros_like(qg)
    dks, dws = [], []
    for (kidx, kk, _, _), pp, dzz in zip(groups, ps, dzs):
        zi = _zidx(kidx)
        dq += s * np.einsum(f"{zi},{kidx}->{_Q}", dzz, kk)
        dks.append(s * np.einsum(f"{zi},{_Q}->{kidx}", dzz, qg))
        dws.append(np.einsum(f"{zi},{_Q}->{kidx}", pp, g))
    # direct groups: own row (and own column) are k, v themselves
    dk, dv = dks[0].copy(), dws[0].copy()
    first_region = 1
    if cache["states"][0][0] != "fixed":
        dk += dks[1]
        dv += dws[1]
        first_region = 2
    for (kind, *st), dkr, dwr in zip(cache["states"], dks[first_region:], dws[first_region:]):
        if kind == "fixed":
            qroute, kroute, core, shape = st
            dc = attention_core_backward(dwr[..., None, :], core)
            dq += _whole_pool_vjp(dc["q"][..., 0, :], shape, -2, _pooling_of(qroute), qroute)
            dk += dc["k"] + _whole_pool_vjp(dkr, shape, -2, _pooling_of(kroute), kroute)
            dv += dc["v"]
        else:
            a, b, c = _region_summaries_vjp(dkr, dwr, st[0])
            dq += a
            dk += b
            dv += c
    qs, ks, vs = cache["shapes"]
    return {"q": dq.reshape(qs), "k": dk.reshape(ks), "v": dv.reshape(vs)}


def _pooling_of(route):
    return "sum" if route is None else "max"


# --------------------------------------------------------------------------------------------
# The layer


def _validate(x, params, num_heads):
    x = as_float(x, "x", ndim=3)
    num_heads = check_int(num_heads, "num_heads", minimum=1)
    c = x.shape[-1]
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of arrays; got {type(params).__name__}")
    qk = np.shape(params.get("query.kernel", ()))
    if len(qk) != 2 or qk[1] % num_heads:
        raise ValueError(f"params['query.kernel'] must be (C, num_heads * head_dim) with num_heads={num_heads}; "
                         f"got {qk}")
    hd = qk[1]
    spec = {"query.kernel": (c, hd), "key.kernel": (c, hd), "value.kernel": (c, hd), "out.kernel": (hd, c)}
    p = check_params(params, spec, where="combiner_attention")
    dt = compute_dtype(x, *p.values())
    return x.astype(dt, copy=False), cast_all(dt, p), num_heads


def combiner_attention_forward(x, params, *, num_heads: int, seg_len: int, variant: str = "mixture",
                               pooling: str = "max"):
    r"""Combiner self-attention layer (causal): projections, `combiner_core_forward` per head, output
    projection (upstream ``_AxialMixtureAtt`` / ``_SelfAttSqrtn``).

    Parameters
    ----------
    x : (B, N, C)
        ``N`` a multiple of ``seg_len``.
    params : dict
        ``query.kernel``, ``key.kernel``, ``value.kernel`` ``(C, H d)``, ``out.kernel`` ``(H d, C)``.
    num_heads : int
    seg_len : int
        $L$ (upstream ``max_seg_len``): the row length of the $S\times L$ grid.
    variant : {"mixture", "axial", "fixed"}
        The factorisation (module docstring).
    pooling : {"max", "sum"}
        Region pooling of keys and queries (JAX cummax / TF cumsum).

    Returns
    -------
    out : (B, N, C), cache
    """
    x, p, h = _validate(x, params, num_heads)
    q, k, v = (split_heads(x @ p[f"{nm}.kernel"], h) for nm in ("query", "key", "value"))
    ctx, core = combiner_core_forward(q, k, v, seg_len=seg_len, variant=variant, pooling=pooling)
    merged = merge_heads(ctx)
    out = merged @ p["out.kernel"]
    return out, {"x": x, "p": p, "h": h, "core": core, "merged": merged, "out_shape": out.shape}


def combiner_attention_backward(dout, cache):
    r"""Gradients ``{"x"}`` and of every params key of `combiner_attention_forward`."""
    x, p, h, merged = cache["x"], cache["p"], cache["h"], cache["merged"]
    g = as_dout(dout, cache["out_shape"], x.dtype)
    c = x.shape[-1]
    grads = {"out.kernel": merged.reshape(-1, merged.shape[-1]).T @ g.reshape(-1, c)}
    dc = combiner_core_backward(split_heads(g @ p["out.kernel"].T, h), cache["core"])
    dx = np.zeros_like(x)
    for nm, key in (("query", "q"), ("key", "k"), ("value", "v")):
        dm = merge_heads(dc[key])
        grads[f"{nm}.kernel"] = x.reshape(-1, c).T @ dm.reshape(-1, dm.shape[-1])
        dx += dm @ p[f"{nm}.kernel"].T
    grads["x"] = dx
    return grads


def combiner_attention(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of `combiner_attention_forward`."""
    return combiner_attention_forward(x, params, **config)[0]


def _partition(n, seg, variant):
    """Per query i: the direct support and the list of regions (sets of positions), from the definitions."""
    out = []
    for i in range(n):
        s, u = divmod(i, seg)
        direct = [s * seg + t for t in range(u + 1)]
        regions = []
        if variant == "fixed":
            regions = [[r * seg + t for t in range(seg)] for r in range(s)]
        else:
            direct += [r * seg + u for r in range(s)]
            regions = [[r * seg + t for r in range(s)] for t in range(seg) if t != u and s >= 1]
            if variant == "mixture":
                for r in range(s):
                    if u >= 1:
                        regions.append([r * seg + t for t in range(u)])
                    if u <= seg - 2:
                        regions.append([r * seg + t for t in range(u + 1, seg)])
        out.append((direct, regions))
    return out


def combiner_dense_matrix(q, k, *, seg_len, variant="mixture", pooling="max", scale=None):
    r"""The explicit factorised form: $A$ ``(..., N, N)`` with $A_{ij} = p(j|i)$ for ``q, k (..., N, d)``,
    built entry by entry from the region sets (loops over queries, regions and keys; $O = AV$ is the
    layer's attention output). For verification and study, not speed."""
    n, d = q.shape[-2], q.shape[-1]
    s = d ** -0.5 if scale is None else scale
    pool = (lambda a: np.max(a, axis=0)) if pooling == "max" else (lambda a: np.sum(a, axis=0))
    part = _partition(n, seg_len, variant)
    a = np.zeros(q.shape[:-1] + (n,))
    for idx in np.ndindex(*q.shape[:-2]):
        qq, kk = q[idx], k[idx]
        for i, (direct, regions) in enumerate(part):
            logits = [s * qq[i] @ kk[j] for j in direct] + [s * qq[i] @ pool(kk[r]) for r in regions]
            w = np.exp(np.array(logits) - max(logits))
            w /= w.sum()
            for j, pij in zip(direct, w):
                a[idx + (i, j)] += pij
            for r, pir in zip(regions, w[len(direct):]):
                loc = np.array([s * pool(qq[r]) @ kk[j] for j in r])
                loc = np.exp(loc - loc.max())
                a[idx + (i,)][r] += pir * loc / loc.sum()
    return a


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _reference(x, params, *, num_heads, seg_len, variant="mixture", pooling="max"):
    q, k, v = (split_heads(x @ params[f"{nm}.kernel"], num_heads) for nm in ("query", "key", "value"))
    a = combiner_dense_matrix(q, k, seg_len=seg_len, variant=variant, pooling=pooling)
    return merge_heads(a @ v) @ params["out.kernel"]


def _draw(rng, size, variant=None, pooling=None):
    s_rows, seg = (3, 3) if size == "tiny" else ((3, 4), (4, 3), (2, 5))[int(rng.integers(0, 3))]
    c, h = (4, 2) if size == "tiny" else (6, 2)
    variant = COMBINER_VARIANTS[int(rng.integers(0, 3))] if variant is None else variant
    pooling = COMBINER_POOLING[int(rng.integers(0, 2))] if pooling is None else pooling
    scale = 0.5 if pooling == "sum" else 1.0  # sums of up to L keys: keep the logits O(1)
    params = {f"{nm}.kernel": scale * rng.standard_normal((c, c)) / np.sqrt(c) for nm in ("query", "key", "value")}
    params["out.kernel"] = rng.standard_normal((c, c)) / np.sqrt(c)
    return Sample(inputs={"x": rng.standard_normal((2, s_rows * seg, c))}, params=params,
                  config={"num_heads": h, "seg_len": seg, "variant": variant, "pooling": pooling})


def _sample(rng, size):
    return _draw(rng, size)


def _check_full_attention_support(rng):
    """A = p(j|i) is a causal probability matrix with every entry j <= i positive (full attention)."""
    err = 0.0
    for variant in COMBINER_VARIANTS:
        s = _draw(rng, "small", variant=variant)
        x, p, cfg = s.inputs["x"], s.params, s.config
        q, k = (split_heads(x @ p[f"{nm}.kernel"], cfg["num_heads"]) for nm in ("query", "key"))
        a = combiner_dense_matrix(q, k, seg_len=cfg["seg_len"], variant=variant, pooling=cfg["pooling"])
        n = a.shape[-1]
        lower = np.tril(np.ones((n, n), bool))
        assert np.all(a[..., lower] > 0) and np.all(a[..., ~lower] == 0), f"{variant}: not full causal support"
        err = max(err, float(np.max(np.abs(a.sum(-1) - 1.0))))
    assert err < 1e-12, f"rows of p(j|i) do not sum to 1: {err}"
    return err


def _check_single_token_regions(rng):
    """Single-token regions reduce Combiner to full causal softmax attention: 'fixed' with seg_len = 1 and
    'axial'/'mixture' with one row (seg_len = N)."""
    q, k, v = (rng.standard_normal((2, 2, 6, 3)) for _ in range(3))
    exact = attention_core_forward(q, k, v, is_causal=True)[0]
    err = 0.0
    for variant, seg in (("fixed", 1), ("axial", 6), ("mixture", 6)):
        for pooling in COMBINER_POOLING:
            out = combiner_core_forward(q, k, v, seg_len=seg, variant=variant, pooling=pooling)[0]
            err = max(err, float(np.max(np.abs(out - exact))))
    assert err < 1e-12, f"single-token regions differ from causal attention: {err}"
    return err


def _check_core_gradients(rng):
    """Random-direction gradient checks of every variant and pooling (the generated test runs the full
    finite-difference Jacobian on one drawn combination)."""
    from ...testing import directional_check  # lazy: testing imports the registry

    err = 0.0
    for variant in COMBINER_VARIANTS:
        for pooling in COMBINER_POOLING:
            err = max(err, directional_check(combiner_attention_forward, combiner_attention_backward,
                                             _draw(rng, "small", variant, pooling)).max_rel)
    return err


register(
    Mechanism(
        slug="combiner_attention", family="4-linear-kernel-sparse", tier="T2",
        title="Combiner: full attention via structured factorisation of the conditional distribution",
        paper="Ren, Dai, Dai, Yang, Leskovec, Schuurmans, Dai, 'Combiner: Full Attention Transformer with Sparse "
              "Computation Cost', NeurIPS 2021, arXiv 2107.05768",
        forward=combiner_attention_forward, backward=combiner_attention_backward, sample=_sample,
        reference=_reference,
        checks={"full_causal_support_rows_sum_to_one": _check_full_attention_support,
                "single_token_regions_are_full_attention": _check_single_token_regions,
                "directional_gradcheck_variants": _check_core_gradients},
        docs="linear/low-rank-and-structured.md#combiner-attention",
    ),
)
