r"""Informer: ProbSparse self-attention (with its attention layer) and the self-attention distilling layer.

Zhou, Zhang, Peng, Zhang, Li, Xiong, Zhang, "Informer: Beyond Efficient Transformer for Long
Sequence Time-Series Forecasting", AAAI 2021, arXiv 2012.07436. Official code:
zhouhaoyi/Informer2020 at ``29f2a739226a509202a092b464163da81fa74960``: ``models/attn.py``
(``ProbAttention``, ``AttentionLayer``), ``utils/masking.py`` (``ProbMask``) and
``models/encoder.py`` (``ConvLayer``, the distilling layer).

ProbSparse attention (per batch element and head)
-------------------------------------------------
With $U = c\lceil\ln L_K\rceil$ sampled keys per query (indices $\mathcal S_i$, drawn uniformly
with replacement, shared by every batch element and head: upstream ``torch.randint(L_K, (L_Q, U))``)
and $u = c\lceil\ln L_Q\rceil$ (both capped at the lengths; $c$ = ``factor``, default 5):

$$\bar M_i = \max_{t}\,q_i\cdot k_{\mathcal S_{it}} - \frac{1}{L_K}\sum_t q_i\cdot k_{\mathcal S_{it}}$$

(the code divides by $L_K$ although it sums over the $U$ samples; raw dot products, no scale). The
$u$ queries of largest $\bar M$ (the "active" set $T$) get a full softmax row,
$o_i = \mathrm{softmax}_j(s\,q_i\cdot k_j)\,V$ for $i\in T$ (with ``mask_flag``: only $j\le i$,
``ProbMask``); every other ("lazy") query gets $\mathrm{mean}_j(v_j)$, or with ``mask_flag`` the
prefix *sum* $\sum_{j\le i}v_j$ (``V.cumsum``, not divided, as the code does). $s = 1/\sqrt D$ by
default.

Backward (the index sets held fixed). The sample $\mathcal S$ and the active set $T$ are constant
($T$ changes only where two $\bar M$ tie; $\bar M$ itself receives no gradient). Active rows: the
softmax-attention VJP (`refattn.attention.softmax.core`), scattered back to the rows $T$ of $dQ$.
Lazy rows $R$: $dv_j \mathrel{+}= \frac{1}{L_V}\sum_{i\in R} g_i$ (mean) or
$dv_j \mathrel{+}= \sum_{i\in R,\,i\ge j} g_i$ (prefix sum: a reverse cumulative sum); lazy queries get
$dq_i = 0$.

The layer (``AttentionLayer``): $Q = X_qW_Q + b_Q$, $K = X_kW_K + b_K$, $V = X_vW_V + b_V$ split into
``n_heads`` heads, ProbSparse attention, heads merged, ``out_projection``. ``mix=True`` (the decoder's
self-attention) merges with upstream's ``out.transpose(2,1).contiguous().view(B, L, -1)``, i.e.
it reads the ``(B, H, L, D)`` array in memory order as ``(B, L, H D)``.

Distilling (``ConvLayer``)
--------------------------
$X_{j+1} = \mathrm{MaxPool}_{k=3,s=2,p=1}\big(\mathrm{ELU}(\mathrm{BN}(\mathrm{Conv1d}_{k=3}(X_j)))\big)$
with circular padding 1, `informer_distil_forward` / `informer_distil_backward`. BatchNorm uses the
batch statistics over (batch, length) per channel (training mode; its VJP is the normalisation VJP of
`refattn.nn.norms`) or given running statistics (``batch_stats=False``, evaluation mode); max pooling
routes the gradient to each window's arg-max (held fixed). With batch statistics the batch elements
are coupled, so the distilling layer is verified by its own named checks.

Conventions
-----------
Parameter names as ``AttentionLayer`` (``query_projection.weight`` is torch's ``weight.T``) and
``ConvLayer`` (``downConv.weight (C, C, 3)`` in torch's conv layout, ``norm.weight``,
``norm.bias``). ``index_sample`` (``(L_Q, U)`` integers) fixes the sample; without it the sample is
drawn from ``numpy.random.default_rng(seed)`` (upstream draws from torch's global generator, whose
stream cannot be reproduced here: pass upstream's indices for bit-level comparisons). ``factor``,
``scale`` and ``mask_flag`` as ``ProbAttention`` (``mask_flag=True`` is its constructor default;
Informer's encoder uses ``False``). Upstream fails for a length of 1 ($\lceil\ln 1\rceil = 0$
samples); here $U$ and $u$ are at least 1.

Agreement with upstream (the upstream modules run with the same index sample): attention layer
output 3.1e-15, every gradient <= 1e-15 relative; ``ConvLayer`` (train and eval BatchNorm) output
1.8e-15, gradients <= 5e-16 relative.
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_int, check_params, check_positive, compute_dtype
from ...nn.activations import elu_plus_one, elu_plus_one_grad
from ...nn.conv import conv_apply, conv_vjp
from ...nn.linear import linear_prefixed, linear_prefixed_vjp, merge_heads, split_heads
from ...nn.norms import normalize_backward, normalize_forward
from ...nn.pooling import max_pool_apply, max_pool_vjp
from ...registry import Mechanism, Sample, register
from ..softmax.core import attention_core_backward, attention_core_forward
from ._samples import draw_until, fd_max_rel, topk_margin
from .core import gather_rows, scatter_add_rows, validate_linear_qkv

__all__ = [
    "probsparse_sizes",
    "probsparse_index_sample",
    "probsparse_measure",
    "probsparse_attention_forward",
    "probsparse_attention_backward",
    "informer_attention_forward",
    "informer_attention_backward",
    "informer_attention",
    "informer_distil_forward",
    "informer_distil_backward",
]

_PROJ = ("query_projection", "key_projection", "value_projection")


def probsparse_sizes(l_q: int, l_k: int, factor: int = 5) -> tuple[int, int]:
    r"""``(U, u)``: sampled keys per query $c\lceil\ln L_K\rceil$ and active queries $c\lceil\ln L_Q\rceil$,
    capped at the lengths (and at least 1)."""
    big_u = factor * int(np.ceil(np.log(l_k)))
    u = factor * int(np.ceil(np.log(l_q)))
    return max(1, min(big_u, l_k)), max(1, min(u, l_q))


def probsparse_index_sample(l_q: int, l_k: int, factor: int = 5, seed: int = 0) -> np.ndarray:
    """The sampled key indices ``(L_Q, U)``: uniform on ``[0, L_K)`` with replacement, from
    ``numpy.random.default_rng(seed)``."""
    big_u, _ = probsparse_sizes(l_q, l_k, factor)
    return np.random.default_rng(seed).integers(0, l_k, size=(l_q, big_u))


def probsparse_measure(q, k, index_sample):
    r"""The sparsity measure $\bar M$ ``(..., L_Q)`` of queries ``q (..., L_Q, D)`` against the
    sampled keys ``k[..., index_sample[i], :]`` (max minus sum over $L_K$, raw dot products). Unvalidated."""
    ks = np.take(k, index_sample, axis=-2)  # (..., L_Q, U, D)
    s = np.einsum("...id,...iud->...iu", q, ks)
    return np.max(s, axis=-1) - np.sum(s, axis=-1) / k.shape[-2]


def _check_index_sample(index_sample, l_q, l_k, factor, seed):
    if index_sample is None:
        return probsparse_index_sample(l_q, l_k, factor, seed)
    idx = np.asarray(index_sample)
    if idx.dtype.kind not in "iu":
        raise TypeError(f"index_sample must be an integer array; got dtype {idx.dtype}")
    big_u, _ = probsparse_sizes(l_q, l_k, factor)
    if idx.shape != (l_q, big_u):
        raise ValueError(f"index_sample must have shape (L_Q, U) = {(l_q, big_u)}; got {idx.shape}")
    if idx.size and (idx.min() < 0 or idx.max() >= l_k):
        raise ValueError(f"index_sample entries must lie in [0, L_K={l_k}); got [{idx.min()}, {idx.max()}]")
    return idx


def probsparse_attention_forward(q, k, v, *, factor: int = 5, scale=None, mask_flag: bool = True,
                                 index_sample=None, seed: int = 0):
    r"""ProbSparse attention (``ProbAttention``) on ``q (..., L_Q, D)``, ``k (..., L_K, D)``,
    ``v (..., L_K, D_v)`` (SDPA layout, equal leading axes; ``mask_flag`` needs $L_Q = L_K$).

    Returns ``(context (..., L_Q, D_v), cache)``; ``cache["top"]`` holds the active queries
    ``(..., u)`` and ``cache["index_sample"]`` the sampled keys. See the module docstring.
    """
    factor = check_int(factor, "factor", minimum=1)
    seed = check_int(seed, "seed", minimum=0)
    scale = check_positive(scale, "scale", allow_none=True)
    if not isinstance(mask_flag, (bool, np.bool_)):
        raise TypeError(f"mask_flag must be a bool; got {type(mask_flag).__name__}")
    q, k, v = validate_linear_qkv(q, k, v, same_length=bool(mask_flag))
    l_q, l_k = q.shape[-2], k.shape[-2]
    idx = _check_index_sample(index_sample, l_q, l_k, factor, seed)
    _, u = probsparse_sizes(l_q, l_k, factor)
    m = probsparse_measure(q, k, idx)
    top = np.argpartition(-m, u - 1, axis=-1)[..., :u] if u < l_q else np.broadcast_to(np.arange(l_q), m.shape)
    q_top = gather_rows(q, top)
    keep = top[..., :, None] >= np.arange(l_k) if mask_flag else None  # ProbMask: keep j <= i
    s = float(1.0 / np.sqrt(q.shape[-1])) if scale is None else scale
    # the attention core wants (..., heads, rows, d): one "head" axis of size 1
    o_top, core = attention_core_forward(q_top[..., None, :, :], k[..., None, :, :], v[..., None, :, :],
                                         attn_mask=None if keep is None else keep[..., None, :, :], scale=s)
    if mask_flag:
        context = np.cumsum(v, axis=-2)
    else:
        context = np.broadcast_to(np.mean(v, axis=-2, keepdims=True), q.shape[:-1] + (v.shape[-1],)).copy()
    np.put_along_axis(context, top[..., None], o_top[..., 0, :, :], axis=-2)
    cache = {"core": core, "top": top, "index_sample": idx, "mask_flag": bool(mask_flag),
             "q_shape": q.shape, "v_shape": v.shape, "out_shape": context.shape}
    return context, cache


def probsparse_attention_backward(dout, cache):
    r"""Gradients ``{"q", "k", "v"}`` of `probsparse_attention_forward` with the sample and the
    active set held fixed (module docstring)."""
    core, top = cache["core"], cache["top"]
    g = as_dout(dout, cache["out_shape"], core["p"].dtype)
    grads = attention_core_backward(gather_rows(g, top)[..., None, :, :], core)
    l_q = cache["q_shape"][-2]
    dq = scatter_add_rows(grads["q"][..., 0, :, :], top, l_q)
    dk, dv = grads["k"][..., 0, :, :], grads["v"][..., 0, :, :]
    lazy = g.copy()
    np.put_along_axis(lazy, top[..., None], 0.0, axis=-2)
    if cache["mask_flag"]:
        dv = dv + np.flip(np.cumsum(np.flip(lazy, axis=-2), axis=-2), axis=-2)
    else:
        dv = dv + np.sum(lazy, axis=-2, keepdims=True) / cache["v_shape"][-2]
    return {"q": dq, "k": dk, "v": dv}


def _layer_spec(d_model, n_heads, d_keys, d_values):
    spec = {}
    for name, width in zip(_PROJ, (d_keys, d_keys, d_values)):
        spec[f"{name}.weight"] = (d_model, n_heads * width)
        spec[f"{name}.bias"] = (n_heads * width,)
    spec["out_projection.weight"] = (n_heads * d_values, d_model)
    spec["out_projection.bias"] = (d_model,)
    return spec


def informer_attention_forward(queries, keys, values, params, *, n_heads: int, factor: int = 5, scale=None,
                               mask_flag: bool = True, mix: bool = False, index_sample=None, seed: int = 0):
    r"""Informer's ``AttentionLayer`` with ``ProbAttention``: projections, ProbSparse attention per
    head, head merge (``mix`` as upstream), ``out_projection``.

    Parameters
    ----------
    queries : (B, L_Q, d_model); keys, values : (B, L_K, d_model)
    params : dict
        ``{query,key,value}_projection.weight`` ``(d_model, H d_k)`` / ``(d_model, H d_v)`` (torch
        ``weight.T``) and ``.bias``; ``out_projection.weight (H d_v, d_model)`` and ``.bias``.
        ``d_k``, ``d_v`` are read from the shapes (upstream default ``d_model // n_heads``).
    n_heads, factor, scale, mask_flag, mix, index_sample, seed
        As ``AttentionLayer`` / ``ProbAttention`` (module docstring).

    Returns
    -------
    out : (B, L_Q, d_model), cache
    """
    n_heads = check_int(n_heads, "n_heads", minimum=1)
    queries = as_float(queries, "queries", ndim=3)
    keys = as_float(keys, "keys", ndim=3)
    values = as_float(values, "values", ndim=3)
    if keys.shape != values.shape or keys.shape[0] != queries.shape[0] or keys.shape[-1] != queries.shape[-1]:
        raise ValueError(f"queries (B, L_Q, d_model), keys and values (B, L_K, d_model) must agree; got queries "
                         f"{queries.shape}, keys {keys.shape}, values {values.shape}")
    if not isinstance(mix, (bool, np.bool_)):
        raise TypeError(f"mix must be a bool; got {type(mix).__name__}")
    if not isinstance(mask_flag, (bool, np.bool_)):
        raise TypeError(f"mask_flag must be a bool; got {type(mask_flag).__name__}")
    if mask_flag and queries.shape[1] != keys.shape[1]:
        raise ValueError(f"mask_flag=True (self-attention) needs queries and keys of one length; got L_Q = "
                         f"{queries.shape[1]} (queries axis 1) and L_K = {keys.shape[1]} (keys axis 1)")
    d_model = queries.shape[-1]
    if not isinstance(params, dict) or "query_projection.weight" not in params or \
            "value_projection.weight" not in params:
        raise ValueError("params must hold query/key/value_projection and out_projection weights and biases")
    wq, wv = np.shape(params["query_projection.weight"]), np.shape(params["value_projection.weight"])
    if len(wq) != 2 or len(wv) != 2 or wq[-1] % n_heads or wv[-1] % n_heads:
        raise ValueError(f"query_projection.weight {wq} and value_projection.weight {wv} must be (d_model, "
                         f"n_heads * width) with n_heads={n_heads}")
    d_keys, d_values = wq[-1] // n_heads, wv[-1] // n_heads
    p = check_params(params, _layer_spec(d_model, n_heads, d_keys, d_values), where="informer_attention")
    dt = compute_dtype(queries, keys, values, *p.values())
    queries, keys, values = (a.astype(dt, copy=False) for a in (queries, keys, values))
    p = cast_all(dt, p)
    qh = split_heads(linear_prefixed(p, "query_projection", queries), n_heads)
    kh = split_heads(linear_prefixed(p, "key_projection", keys), n_heads)
    vh = split_heads(linear_prefixed(p, "value_projection", values), n_heads)
    ctx, core = probsparse_attention_forward(qh, kh, vh, factor=factor, scale=scale, mask_flag=mask_flag,
                                             index_sample=index_sample, seed=seed)
    b, h, l_q, dv = ctx.shape
    merged = np.ascontiguousarray(ctx).reshape(b, l_q, h * dv) if mix else merge_heads(ctx)
    out = linear_prefixed(p, "out_projection", merged)
    cache = {"p": p, "core": core, "inputs": (queries, keys, values), "merged": merged, "mix": bool(mix),
             "ctx_shape": ctx.shape, "n_heads": n_heads, "out_shape": out.shape}
    return out, cache


def informer_attention_backward(dout, cache):
    """Gradients ``{"queries", "keys", "values"}`` and of every projection parameter of
    `informer_attention_forward` (the ProbSparse index sets held fixed)."""
    p = cache["p"]
    queries, keys, values = cache["inputs"]
    g = as_dout(dout, cache["out_shape"], queries.dtype)
    grads = {}
    dmerged = linear_prefixed_vjp(grads, p, "out_projection", g, cache["merged"])
    b, h, l_q, dv = cache["ctx_shape"]
    dctx = dmerged.reshape(b, h, l_q, dv) if cache["mix"] else split_heads(dmerged, h)
    dh = probsparse_attention_backward(dctx, cache["core"])
    out = {}
    for name, x, key in zip(_PROJ, (queries, keys, values), ("q", "k", "v")):
        out[{"q": "queries", "k": "keys", "v": "values"}[key]] = linear_prefixed_vjp(
            grads, p, name, merge_heads(dh[key]), x)
    out.update(grads)
    return out


def informer_attention(queries, keys, values, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of `informer_attention_forward`."""
    return informer_attention_forward(queries, keys, values, params, **config)[0]


def informer_distil_forward(x, params, *, eps: float = 1e-5, batch_stats: bool = True, running_mean=None,
                            running_var=None):
    r"""Informer's self-attention distilling layer (``ConvLayer``) on ``x (B, L, C)``:
    circular Conv1d ($k=3$), BatchNorm1d, ELU, MaxPool1d(3, 2, 1); returns ``(B, L_out, C)``.

    ``params``: ``downConv.weight (C, C, 3)``, ``downConv.bias (C,)``, ``norm.weight (C,)``,
    ``norm.bias (C,)``. ``batch_stats=True`` normalises with the batch statistics (torch training
    mode); ``False`` with ``running_mean``/``running_var`` ``(C,)`` (evaluation mode).
    """
    x = as_float(x, "x", ndim=3)
    c = x.shape[-1]
    eps = check_positive(eps, "eps")
    p = check_params(params, {"downConv.weight": (c, c, 3), "downConv.bias": (c,), "norm.weight": (c,),
                              "norm.bias": (c,)}, where="informer_distil")
    stats_in = None
    if not batch_stats:
        if running_mean is None or running_var is None:
            raise ValueError("batch_stats=False needs running_mean and running_var of shape (C,)")
        stats_in = tuple(as_float(a, n, ndim=1) for a, n in ((running_mean, "running_mean"),
                                                               (running_var, "running_var")))
        if any(a.shape != (c,) for a in stats_in):
            raise ValueError(f"running_mean and running_var must have shape (C,) = ({c},)")
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    xc = np.swapaxes(x, 1, 2)
    y = conv_apply(xc, p["downConv.weight"], p["downConv.bias"], padding=1, padding_mode="circular")
    if batch_stats:
        xhat, stats = normalize_forward(y, (0, 2), eps)
    else:
        rstd = (1.0 / np.sqrt(stats_in[1] + eps)).astype(dt)
        xhat, stats = (y - stats_in[0].astype(dt)[:, None]) * rstd[:, None], rstd
    z = xhat * p["norm.weight"][:, None] + p["norm.bias"][:, None]
    e = elu_plus_one(z) - 1.0
    pooled, arg = max_pool_apply(e, 3, 2, 1)
    out = np.swapaxes(pooled, 1, 2).copy()
    cache = {"x": x, "xc": xc, "p": p, "xhat": xhat, "stats": stats, "batch_stats": bool(batch_stats), "z": z,
             "arg": arg, "e_shape": e.shape, "out_shape": out.shape}
    return out, cache


def informer_distil_backward(dout, cache):
    r"""Gradients ``{"x", "downConv.weight", "downConv.bias", "norm.weight", "norm.bias"}`` of
    `informer_distil_forward` (max-pool arg-max held fixed; BatchNorm's normalisation VJP)."""
    p, x = cache["p"], cache["x"]
    g = np.swapaxes(as_dout(dout, cache["out_shape"], x.dtype), 1, 2)
    de = max_pool_vjp(g, cache["arg"], cache["e_shape"], 3, 2, 1)
    dz = de * elu_plus_one_grad(cache["z"])
    xhat = cache["xhat"]
    grads = {"norm.weight": np.sum(dz * xhat, axis=(0, 2)), "norm.bias": np.sum(dz, axis=(0, 2))}
    dxhat = dz * p["norm.weight"][:, None]
    dy = normalize_backward(dxhat, xhat, cache["stats"]) if cache["batch_stats"] else dxhat * cache["stats"][:, None]
    cg = conv_vjp(dy, cache["xc"], p["downConv.weight"], padding=1, padding_mode="circular")
    grads.update({"x": np.swapaxes(cg["x"], 1, 2), "downConv.weight": cg["weight"], "downConv.bias": cg["bias"]})
    return grads


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _layer_params(rng, d_model, n_heads, d_keys):
    params = {}
    for name, shape in _layer_spec(d_model, n_heads, d_keys, d_keys).items():
        if name.endswith("weight"):
            params[name] = rng.standard_normal(shape) / np.sqrt(shape[0])
        else:
            params[name] = 0.1 * rng.standard_normal(shape)
    return params


def _draw(rng, size, mask_flag=None, mix=None):
    d_model, n_heads = (4, 2) if size == "tiny" else (8, 2)
    length = 6 if size == "tiny" else int(rng.integers(9, 13))
    factor = 1
    mask_flag = bool(rng.integers(0, 2)) if mask_flag is None else mask_flag
    mix = bool(rng.integers(0, 2)) if mix is None else mix
    params = _layer_params(rng, d_model, n_heads, d_model // n_heads)
    idx = rng.integers(0, length, size=(length, probsparse_sizes(length, length, factor)[0]))
    _, u = probsparse_sizes(length, length, factor)

    def draw(r):
        return tuple(r.standard_normal((2, length, d_model)) for _ in range(3))

    def margin(t):
        qh = split_heads(linear_prefixed(params, "query_projection", t[0]), n_heads)
        kh = split_heads(linear_prefixed(params, "key_projection", t[1]), n_heads)
        return topk_margin(probsparse_measure(qh, kh, idx), u)

    xq, xk, xv = draw_until(rng, draw, margin, 0.02)
    return Sample(inputs={"queries": xq, "keys": xk, "values": xv}, params=params,
                  config={"n_heads": n_heads, "factor": factor, "mask_flag": mask_flag, "mix": mix,
                          "index_sample": idx})


def _sample(rng, size):
    return _draw(rng, size)


def _reference(queries, keys, values, params, *, n_heads, factor=5, scale=None, mask_flag=True, mix=False,
               index_sample=None, seed=0):
    """Loops: the measure, a full sort of it, then one query row at a time."""
    b, l_q, _ = queries.shape
    l_k = keys.shape[1]
    idx = probsparse_index_sample(l_q, l_k, factor, seed) if index_sample is None else index_sample
    _, u = probsparse_sizes(l_q, l_k, factor)
    q = split_heads(queries @ params["query_projection.weight"] + params["query_projection.bias"], n_heads)
    k = split_heads(keys @ params["key_projection.weight"] + params["key_projection.bias"], n_heads)
    v = split_heads(values @ params["value_projection.weight"] + params["value_projection.bias"], n_heads)
    s = 1.0 / np.sqrt(q.shape[-1]) if scale is None else scale
    ctx = np.zeros(q.shape[:-1] + (v.shape[-1],))
    for bi in range(b):
        for h in range(n_heads):
            meas = []
            for i in range(l_q):
                dots = [float(q[bi, h, i] @ k[bi, h, j]) for j in idx[i]]
                meas.append(max(dots) - sum(dots) / l_k)
            active = sorted(range(l_q), key=lambda i: -meas[i])[:u]
            for i in range(l_q):
                if i in active:
                    js = [j for j in range(l_k) if not mask_flag or j <= i]
                    sc = np.array([s * float(q[bi, h, i] @ k[bi, h, j]) for j in js])
                    w = np.exp(sc - sc.max())
                    ctx[bi, h, i] = (w / w.sum()) @ v[bi, h, js]
                else:
                    ctx[bi, h, i] = v[bi, h, : i + 1].sum(0) if mask_flag else v[bi, h].mean(0)
    merged = ctx.reshape(b, l_q, -1) if mix else merge_heads(ctx)
    return merged @ params["out_projection.weight"] + params["out_projection.bias"]


def _check_full_u_is_attention(rng):
    """u = L_Q (every query active): plain softmax attention (causal with mask_flag)."""
    q, k, v = (rng.standard_normal((2, 2, 5, 3)) for _ in range(3))
    err = 0.0
    for mask_flag in (False, True):
        a = probsparse_attention_forward(q, k, v, factor=5, mask_flag=mask_flag)[0]
        b = attention_core_forward(q, k, v, is_causal=mask_flag)[0]
        err = max(err, float(np.max(np.abs(a - b))))
    assert err < 1e-12, f"u = L_Q differs from softmax attention by {err}"
    return err


def _check_lazy_rows(rng):
    """Lazy queries: mean(V) without the mask, the prefix sum of V with it."""
    q, k, v = (rng.standard_normal((2, 3, 9, 4)) for _ in range(3))
    err = 0.0
    for mask_flag in (False, True):
        out, cache = probsparse_attention_forward(q, k, v, factor=1, mask_flag=mask_flag)
        lazy = np.ones(q.shape[:-1], bool)
        np.put_along_axis(lazy, cache["top"], False, axis=-1)
        ref = np.cumsum(v, -2) if mask_flag else np.broadcast_to(v.mean(-2, keepdims=True), out.shape)
        err = max(err, float(np.max(np.abs(np.where(lazy[..., None], out - ref, 0.0)))))
    assert err < 1e-12, f"lazy rows differ from mean/cumsum(V) by {err}"
    return err


def _distil_sample(rng, batch_stats=True):
    c, length = 3, 6
    params = {"downConv.weight": rng.standard_normal((c, c, 3)) / 3.0, "downConv.bias": 0.1 * rng.standard_normal(c),
              "norm.weight": rng.uniform(0.5, 1.5, c), "norm.bias": 0.1 * rng.standard_normal(c)}
    config = {"batch_stats": batch_stats}
    if not batch_stats:
        config.update(running_mean=0.1 * rng.standard_normal(c), running_var=rng.uniform(0.5, 2.0, c))

    def margin(x):  # keep max-pool windows away from ties
        _, cache = informer_distil_forward(x, params, **config)
        e = elu_plus_one(cache["z"]) - 1.0
        ep = np.pad(e, ((0, 0), (0, 0), (1, 1)), constant_values=-np.inf)
        win = np.stack([ep[..., j:j + e.shape[-1]:2] for j in range(3)], -1)
        return topk_margin(win, 1)

    x = draw_until(rng, lambda r: r.standard_normal((2, length, c)), margin, 0.02)
    return Sample(inputs={"x": x}, params=params, config=config)


def _check_distil_gradcheck(rng):
    return max(fd_max_rel(informer_distil_forward, informer_distil_backward, _distil_sample(rng, bs))
               for bs in (True, False))


def _check_distil_shape(rng):
    """L_out = floor((L - 1) / 2) + 1 (MaxPool1d(3, 2, 1)) and the output is ELU-bounded below by -1."""
    s = _distil_sample(rng)
    for length in (5, 6, 7, 96):
        x = rng.standard_normal((2, length, 3))
        out = informer_distil_forward(x, s.params)[0]
        assert out.shape == (2, (length - 1) // 2 + 1, 3), out.shape
        assert out.min() > -1.0
    return 0.0


register(
    Mechanism(
        slug="informer_probsparse_attention", family="4-linear-kernel-sparse", tier="T2",
        title="Informer ProbSparse self-attention and distilling",
        paper="Zhou, Zhang, Peng, Zhang, Li, Xiong, Zhang, 'Informer: Beyond Efficient Transformer for Long "
              "Sequence Time-Series Forecasting', AAAI 2021, arXiv 2012.07436",
        forward=informer_attention_forward, backward=informer_attention_backward, sample=_sample,
        reference=_reference,
        checks={"full_u_equals_softmax_attention": _check_full_u_is_attention,
                "lazy_rows_mean_or_cumsum": _check_lazy_rows,
                "distil_gradcheck_train_and_eval_bn": _check_distil_gradcheck,
                "distil_output_length": _check_distil_shape},
        docs="linear/sparse-attention.md#informer-probsparse",
    ),
)
