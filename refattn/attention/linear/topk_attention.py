r"""Top-$k$ (k-NN retrieved) softmax attention: the exact reference of IceFormer's retrieval attention.

Mao, Ester, Li, "IceFormer: Accelerated Inference with Long-Sequence Transformers on CPUs",
ICLR 2024, arXiv 2405.02842. IceFormer keeps a pretrained model and replaces each attention row
by a softmax over the $k$ keys with the largest inner product with the query, found by a
k-nearest-neighbour index (Prioritized / multi-level DCI) instead of by a scan. Official code:
yuzhenmao/IceFormer ``MDCI/src/dci.c@cf00ac4f156fd5562bdd9c4f8dbb4004baae7f50`` (``dci_query``:
the retrieved candidates' weights are ``exp(-(key_i - key_0)/sqrt(dim) * scale)`` normalised over
the retrieved set, with ``key = -q.k``: a softmax of the scaled dot products over the retrieved
keys). This module is the *exact* computation the index approximates:

$$S_i = \operatorname{top-}k_{j\in\mathcal V_i}\; q_i\cdot k_j,\qquad
o_i = \sum_{j\in S_i}\frac{e^{s\,q_i\cdot k_j}}{\sum_{l\in S_i}e^{s\,q_i\cdot k_l}}\,v_j,
\qquad s = 1/\sqrt d,$$

with $\mathcal V_i$ all keys, or $j \le i$ (+ offset) when causal (IceFormer's ``causal=True``
builds one index per prefix); a row with fewer than $k$ visible keys uses all of them.

Fast form and explicit form
---------------------------
`topk_attention_forward` gathers the $k$ selected keys and values of every query,
``(..., N, k, d)``, and runs the softmax over that axis: $O(Nk\,d)$ after the selection. It equals
dense SDPA with the boolean keep-mask $[j\in S_i]$ (the explicit $O(NM)$ form,
`refattn.attention.softmax.core.naive_attention` with a brute-force per-row sort in the record's
reference) to round-off, in the forward and in every gradient.

Backward (selection held fixed)
-------------------------------
The selection $S_i$ is piecewise constant in $q, k$ (it changes only where two scores tie), so
the gradient is that of the selected computation: with $P_{it}$ the weights over the gathered slots
$t$ (key $j_t$), $g_i = \partial L/\partial o_i$,

$$dP_{it} = g_i\cdot v_{j_t},\quad dS_{it} = P_{it}(dP_{it} - \textstyle\sum_u P_{iu}dP_{iu}),\quad
dq_i = s\sum_t dS_{it}k_{j_t},$$
$$dk_j = s\sum_{(i,t):\,j_t=j} dS_{it}\,q_i,\qquad dv_j = \sum_{(i,t):\,j_t = j} P_{it}\,g_i$$

(the sums over $(i,t)$ are the scatter-add adjoint of the gather; GQA sums over the query heads
that share a kv head). This is IceFormer's training-time reading ("for training use", the catalogue);
IceFormer itself is inference-only.

Conventions
-----------
``scale`` defaults to $1/\sqrt d$ (IceFormer multiplies by a ``scale`` after dividing by
$\sqrt{\text{dim}}$). The selection uses the unscaled inner products (any positive scale gives the
same order). GQA/MQA heads as SDPA (``kv_group_map``). IceFormer's index turns maximum inner
product search into nearest-neighbour search with $\tilde k = [k/c, \sqrt{1-\|k\|^2/c^2}]$,
$\tilde q = [q/\|q\|, 0]$, $c = \max_j\|k_j\|$ (`mips_to_nns`): then
$\|\tilde q - \tilde k_j\|^2 = 2 - 2\,q\cdot k_j/(c\|q\|)$, so the $k$ nearest neighbours are
exactly the top-$k$ inner products (checked by the record).

Agreement with upstream: the DCI C extension (``numpy.distutils`` build, system BLAS) was not
built; ``dci_query``'s weighting transcribed to PyTorch with exact retrieval agrees to 6.7e-16
(output) and 4.6e-16 (gradients, relative).
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, check_choice, check_int, check_positive, compute_dtype, validate_qkv
from ...nn.softmax import softmax_lse, softmax_vjp
from ...registry import Mechanism, Sample, register
from ..softmax.core import CAUSAL_ALIGNMENTS, KV_GROUP_MAPS, causal_keep, expand_kv, naive_attention, reduce_kv
from ._samples import draw_until, fd_max_rel, topk_margin
from .core import gather_rows, mT, scatter_add_rows, topk_keep

__all__ = ["topk_attention_forward", "topk_attention_backward", "topk_attention", "topk_selection", "mips_to_nns"]


def _config(top_k, scale, is_causal, causal_alignment, kv_group_map):
    top_k = check_int(top_k, "top_k", minimum=1)
    scale = check_positive(scale, "scale", allow_none=True)
    if not isinstance(is_causal, (bool, np.bool_)):
        raise TypeError(f"is_causal must be a bool; got {type(is_causal).__name__}")
    check_choice(causal_alignment, "causal_alignment", CAUSAL_ALIGNMENTS)
    check_choice(kv_group_map, "kv_group_map", KV_GROUP_MAPS)
    return top_k, scale, bool(is_causal)


def topk_selection(scores: np.ndarray, top_k: int, *, is_causal: bool = False,
                   causal_alignment: str = "top_left"):
    """Indices ``(..., N, min(top_k, M))`` of the ``top_k`` largest ``scores (..., N, M)`` of every
    row among its visible keys, and a boolean ``(..., N, min(top_k, M))`` that marks real slots (a
    causal row with fewer visible keys than ``top_k`` has padding slots). Unvalidated."""
    n, m = scores.shape[-2:]
    valid = causal_keep(n, m, causal_alignment) if is_causal else None
    s = scores if valid is None else np.where(valid, scores, -np.inf)
    kk = min(top_k, m)
    if kk < m:
        idx = np.argpartition(-s, kk - 1, axis=-1)[..., :kk]
    else:
        idx = np.broadcast_to(np.arange(m), s.shape).copy()
    real = np.ones(idx.shape, bool) if valid is None else np.take_along_axis(
        np.broadcast_to(valid, s.shape), idx, axis=-1)
    return idx, real


def topk_attention_forward(q, k, v, *, top_k: int, scale=None, is_causal: bool = False,
                           causal_alignment: str = "top_left", kv_group_map: str = "contiguous"):
    r"""Softmax attention over the ``top_k`` keys of largest $q_i\cdot k_j$ per query (gathered form).

    Parameters
    ----------
    q : (..., H, N, d); k : (..., Hkv, M, d); v : (..., Hkv, M, dv)
        SDPA layout; ``H`` a multiple of ``Hkv`` (GQA).
    top_k : int >= 1
        Keys kept per query ($k$; ``top_k >= M`` is full attention).
    scale : float > 0, optional
        Score scale, default $1/\sqrt d$.
    is_causal, causal_alignment
        Restrict each query to keys $j \le i$ (``"top_left"``) or $j \le i + M - N$.
    kv_group_map : {"contiguous", "strided"}
        The kv head of each query head (as SDPA).

    Returns
    -------
    out : (..., H, N, dv), cache
        ``cache["idx"]`` holds the selected key indices ``(..., H, N, min(top_k, M))``.
    """
    q, k, v = validate_qkv(q, k, v)
    top_k, scale, is_causal = _config(top_k, scale, is_causal, causal_alignment, kv_group_map)
    dt = compute_dtype(q, k, v)
    q, k, v = (a.astype(dt, copy=False) for a in (q, k, v))
    s = float(1.0 / np.sqrt(q.shape[-1])) if scale is None else scale
    group = q.shape[-3] // k.shape[-3]
    ke, ve = expand_kv(k, group, kv_group_map), expand_kv(v, group, kv_group_map)
    n, m = q.shape[-2], k.shape[-2]
    idx, real = topk_selection(q @ mT(ke), top_k, is_causal=is_causal, causal_alignment=causal_alignment)
    kk = idx.shape[-1]
    flat = idx.reshape(idx.shape[:-2] + (n * kk,))
    kg = gather_rows(ke, flat).reshape(idx.shape + (ke.shape[-1],))
    vg = gather_rows(ve, flat).reshape(idx.shape + (ve.shape[-1],))
    logits = s * np.einsum("...nd,...ntd->...nt", q, kg)
    logits = np.where(real, logits, -np.inf)
    p, lse = softmax_lse(logits, axis=-1)
    out = np.einsum("...nt,...nte->...ne", p, vg)
    cache = {"q": q, "kg": kg, "vg": vg, "p": p, "idx": idx, "scale": s, "m": m, "group": group,
             "kv_group_map": kv_group_map, "out_shape": out.shape, "lse": lse}
    return out, cache


def topk_attention_backward(dout, cache):
    r"""Gradients ``{"q", "k", "v"}`` of `topk_attention_forward`, selection held fixed (the
    gathered softmax VJP, then the scatter-add adjoint of the gather; see the module docstring)."""
    p, kg, vg, q = cache["p"], cache["kg"], cache["vg"], cache["q"]
    g = as_dout(dout, cache["out_shape"], p.dtype)
    s, m, idx = cache["scale"], cache["m"], cache["idx"]
    ds = softmax_vjp(p, np.einsum("...ne,...nte->...nt", g, vg))
    dq = s * np.einsum("...nt,...ntd->...nd", ds, kg)
    dkg = s * ds[..., None] * q[..., None, :]
    dvg = p[..., None] * g[..., None, :]
    n, kk = idx.shape[-2:]
    flat = idx.reshape(idx.shape[:-2] + (n * kk,))
    dke = scatter_add_rows(dkg.reshape(flat.shape + (dkg.shape[-1],)), flat, m)
    dve = scatter_add_rows(dvg.reshape(flat.shape + (dvg.shape[-1],)), flat, m)
    group, gm = cache["group"], cache["kv_group_map"]
    return {"q": dq, "k": reduce_kv(dke, group, gm), "v": reduce_kv(dve, group, gm)}


def topk_attention(q, k, v, **config) -> np.ndarray:
    """Convenience wrapper: the output of `topk_attention_forward`."""
    return topk_attention_forward(q, k, v, **config)[0]


def mips_to_nns(q, k):
    r"""IceFormer's maximum-inner-product to nearest-neighbour transform (its DCI index searches the
    transformed keys): $\tilde k_j = [k_j/c,\ \sqrt{1 - \|k_j\|^2/c^2}]$ with $c = \max_j\|k_j\|$ over
    the key axis, $\tilde q_i = [q_i/\|q_i\|,\ 0]$. Then $\|\tilde q_i - \tilde k_j\|^2 =
    2 - 2\,q_i\cdot k_j/(c\,\|q_i\|)$: ascending distance is descending inner product.
    ``q (..., N, d)``, ``k (..., M, d)`` -> ``(q_t (..., N, d+1), k_t (..., M, d+1))``."""
    q = as_float(q, "q", min_ndim=1)
    k = as_float(k, "k", min_ndim=1)
    sq = np.sum(k * k, axis=-1, keepdims=True)
    c2 = np.max(sq, axis=-2, keepdims=True)
    kt = np.concatenate([k / np.sqrt(c2), np.sqrt(np.maximum(1.0 - sq / c2, 0.0))], axis=-1)
    qt = np.concatenate([q / np.linalg.norm(q, axis=-1, keepdims=True), np.zeros(q.shape[:-1] + (1,), q.dtype)],
                        axis=-1)
    return qt, kt


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _brute_force_keep(q, k, top_k, is_causal=False, causal_alignment="top_left", group=1):
    """The selection by a full sort of every row, one query at a time (the slow, obvious form)."""
    ke = expand_kv(np.asarray(k), group)
    n, m = q.shape[-2], ke.shape[-2]
    vis = causal_keep(n, m, causal_alignment) if is_causal else np.ones((n, m), bool)
    keep = np.zeros(q.shape[:-1] + (m,), bool)
    for idx in np.ndindex(*q.shape[:-2]):
        for i in range(n):
            cand = [j for j in range(m) if vis[i, j]]
            cand.sort(key=lambda j: -float(np.dot(q[idx + (i,)], ke[idx + (j,)])))
            keep[idx + (i, cand[:top_k])] = True
    return keep


def _reference(q, k, v, *, top_k, scale=None, is_causal=False, causal_alignment="top_left",
               kv_group_map="contiguous"):
    keep = _brute_force_keep(q, k, top_k, is_causal, causal_alignment, q.shape[-3] // k.shape[-3])
    return naive_attention(q, k, v, keep=keep, scale=scale, kv_group_map=kv_group_map)


def _draw(rng, size, hkv=2):
    b, h = 2, 2
    n = int(rng.integers(3, 6)) if size == "tiny" else int(rng.integers(7, 11))
    m = n + int(rng.integers(0, 2))
    d, dv = (3, 2) if size == "tiny" else (5, 4)
    causal = bool(rng.integers(0, 2))
    top_k = int(rng.integers(2, 4))

    def draw(r):
        return (r.standard_normal((b, h, n, d)), r.standard_normal((b, hkv, m, d)),
                r.standard_normal((b, hkv, m, dv)))

    def margin(t):
        q, k, _ = t
        sc = q @ mT(expand_kv(k, h // hkv))
        vis = causal_keep(n, m, "top_left") if causal else None
        return topk_margin(sc, top_k, vis)

    q, k, v = draw_until(rng, draw, margin, 0.05)
    return Sample(inputs={"q": q, "k": k, "v": v}, config={"top_k": top_k, "is_causal": causal})


def _sample(rng, size):
    return _draw(rng, size)


def _check_full_k_is_sdpa(rng):
    from ..softmax.core import attention_core_forward

    q, k, v = (rng.standard_normal((2, 2, 6, 3)) for _ in range(3))
    err = 0.0
    for causal in (False, True):
        a = topk_attention(q, k, v, top_k=6, is_causal=causal)
        b = attention_core_forward(q, k, v, is_causal=causal)[0]
        err = max(err, float(np.max(np.abs(a - b))))
    assert err < 1e-12, f"top_k = M differs from SDPA by {err}"
    return err


def _check_selection_brute_force(rng):
    s = _draw(rng, "small")
    q, k = s.inputs["q"], s.inputs["k"]
    top_k, causal = s.config["top_k"], s.config["is_causal"]
    idx, real = topk_selection(q @ mT(k), top_k, is_causal=causal)
    keep = np.zeros(q.shape[:-1] + (k.shape[-2],), bool)
    np.put_along_axis(keep, idx, real, axis=-1)
    bf = _brute_force_keep(q, k, top_k, causal)
    assert (keep == bf).all(), "top-k selection differs from the brute-force sort"
    assert (keep == topk_keep(q @ mT(k), top_k, None if not causal else causal_keep(*keep.shape[-2:]))).all()
    return 0.0


def _check_gradient_equals_masked_sdpa(rng):
    """The selection-fixed gradient equals the gradient of dense SDPA with the top-k keep-mask."""
    from ..softmax.core import attention_core_backward, attention_core_forward

    s = _draw(rng, "small", hkv=1)  # GQA: one kv head for two query heads
    q, k, v = (s.inputs[n] for n in "qkv")
    out, cache = topk_attention_forward(q, k, v, **s.config)
    keep = _brute_force_keep(q, k, s.config["top_k"], s.config["is_causal"], group=2)
    ref, rc = attention_core_forward(q, k, v, attn_mask=keep)
    g = rng.standard_normal(out.shape)
    a, b = topk_attention_backward(g, cache), attention_core_backward(g, rc)
    err = max(float(np.max(np.abs(out - ref))), *(float(np.max(np.abs(a[n] - b[n]))) for n in "qkv"))
    assert err < 1e-12, f"gathered top-k attention differs from masked SDPA by {err}"
    return err


def _check_gqa_gradcheck(rng):
    s = _draw(rng, "tiny", hkv=1)
    return fd_max_rel(topk_attention_forward, topk_attention_backward, s)


def _check_mips_transform(rng):
    q, k = rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 9, 4)) * rng.uniform(0.5, 2, (2, 9, 1))
    qt, kt = mips_to_nns(q, k)
    dist = np.sum((qt[:, :, None, :] - kt[:, None, :, :]) ** 2, axis=-1)
    ip = q @ mT(k)
    err = float(np.max(np.abs(dist - (2 - 2 * ip / (np.linalg.norm(q, axis=-1, keepdims=True)
                                                    * np.sqrt(np.max(np.sum(k * k, -1), -1))[:, None, None])))))
    assert (np.argsort(dist, -1) == np.argsort(-ip, -1)).all(), "kNN order differs from the inner-product order"
    assert err < 1e-12, f"transformed distance differs from 2 - 2 q.k/(c|q|) by {err}"
    return err


register(
    Mechanism(
        slug="topk_attention", family="4-linear-kernel-sparse", tier="T2",
        title="Top-k (k-NN retrieved) softmax attention (IceFormer reference)",
        paper="Mao, Ester, Li, 'IceFormer: Accelerated Inference with Long-Sequence Transformers on CPUs', "
              "ICLR 2024, arXiv 2405.02842",
        forward=topk_attention_forward, backward=topk_attention_backward, sample=_sample,
        reference=_reference,
        checks={"full_k_equals_sdpa": _check_full_k_is_sdpa,
                "selection_equals_brute_force_sort": _check_selection_brute_force,
                "gathered_equals_masked_sdpa_grads": _check_gradient_equals_masked_sdpa,
                "gradcheck_gqa": _check_gqa_gradcheck,
                "mips_to_nns_preserves_order": _check_mips_transform},
        docs="linear/sparse-attention.md#topk-attention",
    ),
)
