r"""Additive attention bias: a dense differentiable score bias and/or a bias table gathered through
an integer index map (the T5 / Swin relative-bias layout), with the scatter-add gradient.

$$S = s\,QK^\top + B^{\text{dense}} + B^{\text{table}},\qquad
B^{\text{table}}_{h,ij} = \beta[\iota(i,j), h],\qquad O = \mathrm{softmax}(S + M)\,V,$$

with a table $\beta$ ``(T, H)`` (T5 ``relative_attention_bias.weight`` / Swin
``relative_position_bias_table`` layout: one column per head) and an integer index map $\iota$
``(N, M)`` with entries in ``[0, T)``. The dense bias broadcasts against the scores
``(..., H, N, M)`` (graph biases, the quadrature log-weights $\log w_j$ of continuum attention,
ALiBi …); $M$ are SDPA's masks (`refattn.attention.softmax.sdpa`).

Backward
--------
The attention core (`refattn.attention.softmax.core`; derivation on the SDPA page) gives
$dB = dS$. The dense bias receives $dB^{\text{dense}} = dS$ summed over the axes it was broadcast
along (`sum_to_shape`); the table receives the scatter-add

$$d\beta[t, h] = \sum_b\sum_{(i,j):\,\iota(i,j)=t} dS_{b,h,ij}$$

(`scatter_bias_grad`, one ``bincount`` per head), the adjoint of the gather `gather_bias`.

Paper: standard (T5 / Swin relative bias tables, ALiBi, quadrature log-weights).
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_float, check_broadcastable, check_param_keys, validate_qkv
from ...registry import Mechanism, Sample, register
from ._samples import random_qkv
from .core import attention_core_backward, attention_core_forward, causal_keep, naive_attention, sum_to_shape
from .sdpa import sdpa

__all__ = ["gather_bias", "scatter_bias_grad", "biased_attention_forward", "biased_attention_backward"]


def gather_bias(table: np.ndarray, index_map: np.ndarray) -> np.ndarray:
    r"""$B_{h,ij} = \beta[\iota(i,j), h]$: table ``(T, H)`` (T5 ``relative_attention_bias.weight``,
    Swin ``relative_position_bias_table`` layout) and integer map ``(N, M)`` -> ``(H, N, M)``."""
    return np.moveaxis(table[index_map], -1, 0)


def scatter_bias_grad(dbias: np.ndarray, index_map: np.ndarray, num_entries: int) -> np.ndarray:
    r"""Adjoint of :func:`gather_bias`: $d\beta[t, h] = \sum_{(i,j):\iota(i,j)=t} dB_{h,ij}$ (summed
    over any leading batch axes of ``dbias`` (..., H, N, M)). Returns ``(T, H)``."""
    db = sum_to_shape(dbias, dbias.shape[-3:])
    h = db.shape[0]
    flat = index_map.reshape(-1)
    out = np.empty((num_entries, h), dtype=dbias.dtype)
    for hh in range(h):
        out[:, hh] = np.bincount(flat, weights=db[hh].reshape(-1), minlength=num_entries)
    return out


def _validate_index_map(index_map, n, m, t, name="index_map"):
    idx = np.asarray(index_map)
    if idx.dtype.kind not in "iu":
        raise TypeError(f"{name} must be an integer array; got dtype {idx.dtype}")
    if idx.shape != (n, m):
        raise ValueError(f"{name} must have shape (N={n}, M={m}); got {idx.shape}")
    if idx.min() < 0 or idx.max() >= t:
        raise ValueError(f"{name} entries must lie in [0, {t}) (the table's rows); got [{idx.min()}, {idx.max()}]")
    return idx.astype(np.intp, copy=False)


def biased_attention_forward(q, k, v, bias=None, params=None, *, index_map=None, attn_mask=None,
                             is_causal: bool = False, causal_alignment: str = "top_left", scale=None,
                             softcap=None, kv_group_map: str = "contiguous"):
    r"""SDPA with additive score biases: a dense ``bias`` and/or a table-generated one.

    $$S = s\,QK^\top + B^{\text{dense}} + B^{\text{table}},\qquad B^{\text{table}}_{h,ij} = \beta[\iota(i,j), h].$$

    Parameters
    ----------
    q, k, v
        As :func:`sdpa_forward`.
    bias : array broadcastable to (..., H, N, M), optional
        Dense differentiable bias (graph biases, $\log w_j$ quadrature weights …).
    params : {"table": (T, H)}, optional
        Bias table (T5 ``relative_attention_bias.weight`` / Swin ``relative_position_bias_table``
        layout: one column per head); requires ``index_map`` (N, M) of integers in ``[0, T)``.

    Backward
    --------
    $dB^{\text{dense}} = dS$ summed over broadcast axes; the table gradient is the scatter-add
    $d\beta[t,h] = \sum_{b}\sum_{(i,j):\iota(i,j)=t} dS_{b,h,ij}$ (:func:`scatter_bias_grad`).
    """
    q, k, v = validate_qkv(q, k, v)
    table, idx = None, None
    if params is not None:
        check_param_keys(params, (), ("table",), where="biased_attention (table: (T, H))")
        table = params.get("table")
    if table is not None:
        table = as_float(table, "table", ndim=2)
        if table.shape[1] != q.shape[-3]:
            raise ValueError(f"table must have shape (T, H={q.shape[-3]}); got {table.shape}")
        if index_map is None:
            raise ValueError("index_map (N, M) is required with a bias table")
        idx = _validate_index_map(index_map, q.shape[-2], k.shape[-2], table.shape[0])
    total = None
    if bias is not None:
        bias = as_float(bias, "bias", min_ndim=1)
        check_broadcastable("bias", bias.shape, q.shape[:-1] + (k.shape[-2],), "the scores (..., H, N, M) of shape")
    if table is not None:
        total = gather_bias(table, idx)
    if bias is not None:
        total = bias if total is None else bias + total
    out, cache = attention_core_forward(q, k, v, total, attn_mask=attn_mask, is_causal=is_causal,
                                        causal_alignment=causal_alignment, scale=scale, softcap=softcap,
                                        kv_group_map=kv_group_map)
    cache["bias_in_shape"] = None if bias is None else bias.shape
    cache["index_map"], cache["table_rows"] = idx, (None if table is None else table.shape[0])
    return out, cache


def biased_attention_backward(dout, cache):
    """Gradient of :func:`biased_attention_forward`: ``q, k, v`` and ``bias`` / ``table`` when given."""
    g = attention_core_backward(dout, cache)
    out = {"q": g["q"], "k": g["k"], "v": g["v"]}
    if cache["bias_in_shape"] is not None:
        out["bias"] = sum_to_shape(g["bias"], cache["bias_in_shape"])
    if cache["index_map"] is not None:
        out["table"] = scatter_bias_grad(g["bias"], cache["index_map"], cache["table_rows"])
    return out


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample_bias(rng, size):
    b, h = 2, 2
    n, m, d, t = (int(rng.integers(2, 4)), int(rng.integers(2, 4)), 2, 4) if size == "tiny" else \
        (int(rng.integers(4, 8)), int(rng.integers(4, 9)), 3, 9)
    q = rng.standard_normal((b, h, n, d))
    k = rng.standard_normal((b, h, m, d))
    v = rng.standard_normal((b, h, m, d))
    # axis 0 of every input is the batch axis; broadcasting over heads is exercised by (b, 1, n, m)
    bias = rng.standard_normal((b, h, n, m)) if rng.random() < 0.5 else rng.standard_normal((b, 1, n, m))
    idx = rng.integers(0, t, size=(n, m))
    return Sample(inputs={"q": q, "k": k, "v": v, "bias": bias}, params={"table": rng.standard_normal((t, h))},
                  config={"index_map": idx, "is_causal": bool(rng.random() < 0.5),
                          "causal_alignment": "bottom_right" if m >= n else "top_left"})


def _bias_reference(q, k, v, bias=None, params=None, *, index_map=None, is_causal=False, causal_alignment="top_left",
                    **_):
    total = np.zeros(q.shape[:-1] + (k.shape[-2],))
    if bias is not None:
        total = total + bias
    if params is not None:
        n, m = index_map.shape
        tab = np.zeros((q.shape[-3], n, m))
        for hh in range(q.shape[-3]):
            for i in range(n):
                for j in range(m):
                    tab[hh, i, j] = params["table"][index_map[i, j], hh]
        total = total + tab
    keep = causal_keep(q.shape[-2], k.shape[-2], causal_alignment) if is_causal else None
    return naive_attention(q, k, v, bias=total, keep=keep)


def _check_row_constant_bias(rng):
    q, k, v = random_qkv(rng, n=4, m=5)
    c_row = rng.standard_normal((2, 2, 4, 1)) * 3
    out, cache = biased_attention_forward(q, k, v, c_row)
    db = biased_attention_backward(rng.standard_normal(out.shape), cache)["bias"]
    err = max(float(np.abs(out - sdpa(q, k, v)).max()), float(np.abs(db).max()))
    assert err < 1e-12, err
    return err


def _check_log_uniform_weights(rng):
    q, k, v = random_qkv(rng, n=4, m=5)
    logw = np.log(np.full(5, 1 / 5))
    err = float(np.abs(biased_attention_forward(q, k, v, logw)[0] - sdpa(q, k, v)).max())
    assert err < 1e-12, err
    return err


def _check_table_equals_dense(rng):
    q, k, v = random_qkv(rng, n=4, m=5)
    table = rng.standard_normal((6, 2))
    idx = rng.integers(0, 6, (4, 5))
    o1, c1 = biased_attention_forward(q, k, v, params={"table": table}, index_map=idx)
    dense = gather_bias(table, idx)
    o2, c2 = biased_attention_forward(q, k, v, dense)
    G = rng.standard_normal(o1.shape)
    dt_, dd = biased_attention_backward(G, c1)["table"], biased_attention_backward(G, c2)["bias"]
    ref = np.zeros_like(table)
    for i in range(4):
        for j in range(5):
            ref[idx[i, j]] += dd[:, i, j]
    err = max(float(np.abs(o1 - o2).max()), float(np.abs(dt_ - ref).max()))
    assert err < 1e-12, err
    return err


register(
    Mechanism(
        slug="additive_attention_bias", family="1-softmax", tier="T1",
        title="Additive score bias: dense tensor and table + index map (scatter-add gradient)",
        paper="standard (T5 / Swin relative bias tables, ALiBi, quadrature log-weights)",
        forward=biased_attention_forward, backward=biased_attention_backward, sample=_sample_bias,
        reference=_bias_reference, docs="softmax-attention.md#additive-attention-bias",
        checks={"row_constant_bias": _check_row_constant_bias, "log_uniform_weights": _check_log_uniform_weights,
                "table_equals_dense": _check_table_equals_dense},
    ),
)
