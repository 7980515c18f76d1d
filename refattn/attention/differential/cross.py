r"""Differential cross-attention with masked or external keys: generic / GSRA and FDA.

Two combinations of two attentions over (possibly different) memories:

* ``combine="output"``: $O = \mathrm{softmax}(sQ_1K_1^\top + M_1)V_1 - \lambda\odot\mathrm{softmax}(sQ_2K_2^\top + M_2)V_2$,
  the differential term of PhaSR's GSRA (``ming053l/PhaSR`` ``model.py``, commit c2686d7);
* ``combine="fda"``: Function-word De-Attention (Tian, Lin, Zhao, Shen, 2025, arXiv 2512.07222;
  code ``michaeltian108/FDA`` ``finetune/models/xbert_FDA.py``, commit 3346ed8),
  $A = \min\bigl(\mathrm{ReLU}(P^{q}_1 - \lambda P^{q}_2),\ \mathrm{ReLU}(P^{k}_1 - \lambda P^{k}_2)\bigr)$,
  $O = AV_1$, with maps normalised over the keys and over the queries.

A scene-text-recognition decoder form (no code found) is the differential core on $N \ne M$.
Backward (derivation in `differential_cross_attention_forward`): two SDPA backwards with
$dO_1 = G$, $dO_2 = -\lambda G$ for ``"output"``; for ``"fda"`` the minimum and the ReLUs route
$dA$, then softmax VJPs along the keys and along the queries.
"""

from __future__ import annotations

import numpy as np

from ..._checks import (
    as_bool_or_float_mask,
    as_dout,
    as_float,
    check_broadcastable,
    check_choice,
    check_positive,
    compute_dtype,
)
from ...nn.softmax import apply_mask, softmax_lse, softmax_vjp
from ...registry import Mechanism, Sample, register
from ..softmax import sdpa_backward, sdpa_forward, sum_to_shape
from .core import diff_attention_core, gather_heads, kv_head_index, scatter_heads

__all__ = [
    "differential_cross_attention_forward",
    "differential_cross_attention_backward",
    "differential_cross_attention",
]


def _fda_forward(q1, k1, v1, q2, k2, v2, lam, m1, m2, scale, kv_group_map):
    H, Hkv = q1.shape[-3], k1.shape[-3]
    s = q1.shape[-1] ** -0.5 if scale is None else check_positive(scale, "scale")
    idx = kv_head_index(H, Hkv, kv_group_map)
    K1, K2, V = gather_heads(k1, idx), gather_heads(k2, idx), gather_heads(v1, idx)
    S1 = apply_mask(s * (q1 @ np.swapaxes(K1, -1, -2)), m1)
    S2 = apply_mask(s * (q2 @ np.swapaxes(K2, -1, -2)), m2)
    pk1, pq1 = softmax_lse(S1, -1)[0], softmax_lse(S1, -2)[0]
    pk2, pq2 = softmax_lse(S2, -1)[0], softmax_lse(S2, -2)[0]
    lam_b = np.broadcast_to(lam, q1.shape[:-1])[..., None]
    xq, xk = pq1 - lam_b * pq2, pk1 - lam_b * pk2
    aq, ak = np.maximum(xq, 0.0), np.maximum(xk, 0.0)
    sel_q = aq <= ak                      # torch.clamp_max(hor, ver): the gradient goes to hor where hor <= ver
    A = np.where(sel_q, aq, ak)
    out = A @ V
    cache = {"combine": "fda", "q1": q1, "q2": q2, "K1": K1, "K2": K2, "V": V, "A": A, "sel_q": sel_q,
             "xq": xq, "xk": xk, "pk1": pk1, "pq1": pq1, "pk2": pk2, "pq2": pq2, "lam_b": lam_b, "s": s,
             "idx": idx, "Hkv": Hkv, "v2_shape": v2.shape, "lam_shape": lam.shape, "out_shape": out.shape}
    return out, cache


def _fda_backward(g, c):
    A, V, s, lam_b = c["A"], c["V"], c["s"], c["lam_b"]
    dA = g @ np.swapaxes(V, -1, -2)
    dV = np.swapaxes(A, -1, -2) @ g
    dxq = np.where(c["sel_q"], dA, 0.0) * (c["xq"] > 0)
    dxk = np.where(c["sel_q"], 0.0, dA) * (c["xk"] > 0)
    dlam = -(np.sum(dxq * c["pq2"], axis=-1) + np.sum(dxk * c["pk2"], axis=-1))
    dS1 = softmax_vjp(c["pk1"], dxk, -1) + softmax_vjp(c["pq1"], dxq, -2)
    dS2 = softmax_vjp(c["pk2"], -lam_b * dxk, -1) + softmax_vjp(c["pq2"], -lam_b * dxq, -2)
    idx, Hkv = c["idx"], c["Hkv"]
    return {"q1": s * (dS1 @ c["K1"]), "q2": s * (dS2 @ c["K2"]),
            "k1": scatter_heads(s * (np.swapaxes(dS1, -1, -2) @ c["q1"]), idx, Hkv),
            "k2": scatter_heads(s * (np.swapaxes(dS2, -1, -2) @ c["q2"]), idx, Hkv),
            "v1": scatter_heads(dV, idx, Hkv), "v2": np.zeros(c["v2_shape"], dtype=g.dtype),
            "lam": sum_to_shape(dlam, c["lam_shape"])}


def differential_cross_attention_forward(q1, k1, v1, q2, k2, v2, lam, *, attn_mask=None, attn_mask2=None,
                                         scale=None, kv_group_map: str = "contiguous", combine: str = "output"):
    r"""Differential cross-attention with masked or external keys (FDA, STR decoders, GSRA).

    Papers: Tian, Lin, Zhao, Shen, "Function-word De-Attention" (FDA), 2025, arXiv 2512.07222;
    a scene-text-recognition decoder with differential cross-attention (no code found);
    PhaSR's GSRA (geometric–semantic rectification attention). Two combinations:

    ``combine="output"`` (default; the generic difference of two attentions):

    $$O = \mathrm{softmax}(sQ_1K_1^\top + M_1)V_1 - \lambda\odot\mathrm{softmax}(sQ_2K_2^\top + M_2)V_2 .$$

    [code] It is the differential term of PhaSR's GSRA, ``ming053l/PhaSR`` ``model.py`` (commit c2686d7,
    ``DifferentialWindowAttention.forward``): one query, ``attn_diff = attn_sem - lambda_val * attn_geo``,
    ``x_diff = attn_diff @ v_sem`` — i.e. ``q2 = q1``, ``k1 = k_sem``, ``k2 = k_geo``, ``v2 = v1 = v_sem``,
    the shared relative-position bias as ``attn_mask = attn_mask2``; that layer then adds
    ``attn_geo @ v_geo``, applies ``LayerNorm(dim)`` over all heads, ``* (1 - lambda_init)`` and a
    projection, with ``lambda_val = sigmoid(lambda_q1 * lambda_k1) + lambda_init`` (compose those
    around this op). The V1-style STR form (two query projections, $K_1, K_2$ over one memory,
    shared $V$) is :func:`refattn.attention.differential.diff_attention_core_forward` with $N \ne M$
    [recon, unverified: no STR code was found]. A second memory of its own length $M_2$ (and kv heads)
    is allowed.

    ``combine="fda"`` [code] FDA's released code, ``michaeltian108/FDA``
    ``finetune/models/xbert_FDA.py`` (commit 3346ed8, ``BertSelfAttention.forward``, the branch "Apply
    Function-word De-Attention (FDA) at the selected fusion layers"): the function-word branch has its
    own *queries* (``fda_query_layer = query(fda_hidden_states)``) against the same keys; both score
    matrices are normalised over the keys (``ver``, ``Softmax(dim=-1)``) *and* over the queries
    (``hor``, ``Softmax(dim=-2)``); the subtraction is on the maps with a ReLU, and the two are
    combined by an elementwise minimum (``torch.clamp_max(attention_probs_hor, attention_probs_ver)``):

    $$A = \min\bigl(\mathrm{ReLU}(P^{q}_1 - \lambda P^{q}_2),\ \mathrm{ReLU}(P^{k}_1 - \lambda P^{k}_2)\bigr),\qquad O = AV_1,$$

    $P^{k}_a = \mathrm{softmax}_{\text{keys}}(S_a)$, $P^{q}_a = \mathrm{softmax}_{\text{queries}}(S_a)$,
    $S_a = sQ_aK_a^\top + M_a$. Upstream λ is ``self.gate`` (a scalar initialised to ``config.lbd``)
    times a head mask (FDA on the first 6 of 12 heads, ``mask[:, 6:] = 0``): pass ``lam`` of shape
    ``(H, 1)`` with zeros on the other heads (those heads still get $\min(P^q_1, P^k_1)$, as upstream).
    ``k2`` must have ``k1``'s shape (upstream ``k2 = k1``); ``v2`` is unused (its gradient is 0).
    Fully masked rows/columns give 0 (upstream's additive ``-10000`` key-padding mask leaves
    $P^q$ of a padded column unchanged, but $P^k = 0$ there makes $A = 0$ either way).

    Parameters
    ----------
    q1, q2 : array (B.., H, N, d)
    k1, v1 : arrays (B.., Hkv, M1, d) and (B.., Hkv, M1, dv)
    k2, v2 : arrays (B.., Hkv2, M2, d) and (B.., Hkv2, M2, dv)
    lam : array broadcastable to (B.., H, N), at least 1-d
    attn_mask, attn_mask2 : bool (True = keep) or additive masks of branch 1 / branch 2,
        broadcastable to ``(B.., H, N, M1)`` / ``(B.., H, N, M2)``. A query whose branch-2 row is
        fully masked (an empty subset) gets 0 from that branch, i.e. plain cross-attention.
    scale : float, optional
        Default $d^{-1/2}$.
    kv_group_map : {"contiguous", "strided"}
        GQA map of both branches (as :func:`refattn.attention.softmax.sdpa_forward`).
    combine : {"output", "fda"}

    Notes
    -----
    Backward (``"output"``): two independent SDPA backwards with $dO_1 = G$, $dO_2 = -\lambda G$, and
    $d\lambda = -\sum_c G_{\cdot c}O_{2,\cdot c}$ summed to λ's shape. (``"fda"``): $dA = GV_1^\top$,
    $dV_1 = A^\top G$; the minimum routes $dA$ to the query-normalised term where
    $A^q \le A^k$ (``clamp_max``'s rule) and to the key-normalised one elsewhere; the ReLUs pass it where
    their argument is $> 0$, giving $dX^q, dX^k$; $dP^{q}_1 = dX^q$, $dP^q_2 = -\lambda dX^q$ (same for $k$),
    $d\lambda = -\sum_m (dX^q P^q_2 + dX^k P^k_2)$; softmax VJPs along the keys for $P^k$ and along the
    queries for $P^q$ add up to $dS_a$; $dQ_a = s\,dS_aK_a$, $dK_a = s\,dS_a^\top Q_a$ (summed over each
    kv group).
    """
    check_choice(combine, "combine", ("output", "fda"))
    q1 = as_float(q1, "q1", min_ndim=4)
    q2 = as_float(q2, "q2", min_ndim=4)
    k1, v1 = as_float(k1, "k1", min_ndim=4), as_float(v1, "v1", min_ndim=4)
    k2, v2 = as_float(k2, "k2", min_ndim=4), as_float(v2, "v2", min_ndim=4)
    if q2.shape != q1.shape:
        raise ValueError(f"q2 must have q1's shape {q1.shape}; got {q2.shape}")
    for name, k, v in (("1", k1, v1), ("2", k2, v2)):
        if k.ndim != q1.ndim or v.ndim != q1.ndim:
            raise ValueError(f"k{name} and v{name} must have q1's number of dimensions {q1.ndim}; got "
                             f"{k.shape} and {v.shape}")
        if k.shape[:-3] != q1.shape[:-3] or v.shape[:-3] != q1.shape[:-3]:
            raise ValueError(f"batch axes of k{name} {k.shape[:-3]} and v{name} {v.shape[:-3]} must equal q1's "
                             f"{q1.shape[:-3]}")
        if k.shape[-1] != q1.shape[-1]:
            raise ValueError(f"k{name} must have q1's head width d = {q1.shape[-1]}; got {k.shape[-1]}")
        if v.shape[-3:-1] != k.shape[-3:-1]:
            raise ValueError(f"v{name} must have k{name}'s heads and length {k.shape[-3:-1]}; got {v.shape[-3:-1]}")
        if q1.shape[-3] % k.shape[-3]:
            raise ValueError(f"the query heads H = {q1.shape[-3]} must be a multiple of k{name}'s heads {k.shape[-3]}")
    if v2.shape[-1] != v1.shape[-1]:
        raise ValueError(f"v2 must have v1's value width {v1.shape[-1]}; got {v2.shape[-1]}")
    if combine == "fda" and k2.shape != k1.shape:
        raise ValueError(f"combine='fda' subtracts the maps entrywise: k2 must have k1's shape {k1.shape}; "
                         f"got {k2.shape}")
    lam = as_float(lam, "lam", min_ndim=1, max_ndim=q1.ndim - 1)
    check_broadcastable("lam", lam.shape, q1.shape[:-1], "the (..., H, N) output rows of shape")
    m1 = as_bool_or_float_mask(attn_mask, "attn_mask")
    m2 = as_bool_or_float_mask(attn_mask2, "attn_mask2")
    if m1 is not None:
        check_broadcastable("attn_mask", m1.shape, q1.shape[:-1] + (k1.shape[-2],), "the scores (..., H, N, M1) of shape")
    if m2 is not None:
        check_broadcastable("attn_mask2", m2.shape, q1.shape[:-1] + (k2.shape[-2],), "the scores (..., H, N, M2) of shape")
    dt = compute_dtype(q1, q2, k1, v1, k2, v2, lam)
    q1, q2, k1, v1, k2, v2, lam = (a.astype(dt, copy=False) for a in (q1, q2, k1, v1, k2, v2, lam))
    if combine == "fda":
        return _fda_forward(q1, k1, v1, q2, k2, v2, lam, m1, m2, scale, kv_group_map)
    o1, c1 = sdpa_forward(q1, k1, v1, attn_mask=m1, scale=scale, kv_group_map=kv_group_map)
    o2, c2 = sdpa_forward(q2, k2, v2, attn_mask=m2, scale=scale, kv_group_map=kv_group_map)
    lam_b = np.broadcast_to(lam, o1.shape[:-1])[..., None]
    out = o1 - lam_b * o2
    return out, {"combine": "output", "c1": c1, "c2": c2, "o2": o2, "lam_b": lam_b, "lam_shape": lam.shape,
                 "out_shape": out.shape}


def differential_cross_attention_backward(dout, cache):
    """Gradient of :func:`differential_cross_attention_forward`: ``q1, k1, v1, q2, k2, v2, lam``."""
    fda = cache["combine"] == "fda"
    g = as_dout(dout, cache["out_shape"], (cache["A"] if fda else cache["o2"]).dtype)
    if fda:
        return _fda_backward(g, cache)
    g1 = sdpa_backward(g, cache["c1"])
    g2 = sdpa_backward(-cache["lam_b"] * g, cache["c2"])
    return {"q1": g1["q"], "k1": g1["k"], "v1": g1["v"], "q2": g2["q"], "k2": g2["k"], "v2": g2["v"],
            "lam": sum_to_shape(-np.sum(g * cache["o2"], axis=-1), cache["lam_shape"])}


def differential_cross_attention(q1, k1, v1, q2, k2, v2, lam, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`differential_cross_attention_forward`."""
    return differential_cross_attention_forward(q1, k1, v1, q2, k2, v2, lam, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample_cross(rng, size):
    if size == "tiny":
        B, H, Hkv, n, m1, m2, d, dv = 2, 2, 1, int(rng.integers(2, 4)), int(rng.integers(2, 4)), 2, 2, 2
    else:
        B, H, Hkv, n, m1, m2, d, dv = 2, 4, 2, int(rng.integers(3, 6)), int(rng.integers(4, 8)), 3, 3, 4
    combine = str(rng.choice(["output", "fda"]))
    if combine == "fda":
        m2 = m1
    q1, q2 = rng.standard_normal((2, B, H, n, d))
    keep1 = rng.random((B, 1, n, m1)) > 0.3
    keep1[..., 0] = True
    keep2 = rng.random((B, 1, n, m2)) > 0.3
    cfg = {"attn_mask": keep1, "attn_mask2": keep2}
    if combine == "fda":
        cfg["combine"] = "fda"
    return Sample(inputs={"q1": q1, "k1": rng.standard_normal((B, Hkv, m1, d)),
                          "v1": rng.standard_normal((B, Hkv, m1, dv)), "q2": q2,
                          "k2": rng.standard_normal((B, Hkv, m2, d)), "v2": rng.standard_normal((B, Hkv, m2, dv)),
                          "lam": 0.5 + 0.3 * rng.standard_normal((B, H, 1))},
                  config=cfg)


def _check_cross_identities(rng):
    s = _sample_cross(rng, "small")
    i = s.inputs
    plain = sdpa_forward(i["q1"], i["k1"], i["v1"], attn_mask=s.config["attn_mask"])[0]
    # empty branch-2 subset: branch 2 contributes 0, the result is plain cross-attention
    fda = differential_cross_attention(i["q1"], i["k1"], i["v1"], i["q2"], i["k1"], i["v1"], i["lam"],
                                       attn_mask=s.config["attn_mask"],
                                       attn_mask2=np.zeros(i["k1"].shape[-2], bool))
    err = float(np.abs(fda - plain).max())
    # identical branches with lambda = 1 cancel exactly
    same = differential_cross_attention(i["q1"], i["k1"], i["v1"], i["q1"], i["k1"], i["v1"], np.ones(1),
                                        attn_mask=s.config["attn_mask"], attn_mask2=s.config["attn_mask"])
    err = max(err, float(np.abs(same).max()))
    # shared memory and values: the V1 core on cross-attention lengths
    core = diff_attention_core(i["q1"], i["k1"], i["q2"], i["k1"] * 0.5, i["v1"], i["lam"])
    cross = differential_cross_attention(i["q1"], i["k1"], i["v1"], i["q2"], i["k1"] * 0.5, i["v1"], i["lam"])
    err = max(err, float(np.abs(core - cross).max()))
    # FDA: identical branches with lambda = 1 give A = 0; lambda = 0 gives min(P^q, P^k) (upstream's non-FDA heads)
    m = s.config["attn_mask"]
    zero = differential_cross_attention(i["q1"], i["k1"], i["v1"], i["q1"], i["k1"], i["v1"], np.ones(1),
                                        attn_mask=m, attn_mask2=m, combine="fda")
    err = max(err, float(np.abs(zero).max()))
    H, Hkv = i["q1"].shape[-3], i["k1"].shape[-3]
    K = np.repeat(i["k1"], H // Hkv, axis=-3)
    V = np.repeat(i["v1"], H // Hkv, axis=-3)
    S = apply_mask(i["q1"] @ np.swapaxes(K, -1, -2) * i["q1"].shape[-1] ** -0.5, m)
    ref = np.minimum(softmax_lse(S, -1)[0], softmax_lse(S, -2)[0]) @ V
    got = differential_cross_attention(i["q1"], i["k1"], i["v1"], i["q2"], i["k1"], i["v1"], np.zeros(1),
                                       attn_mask=m, combine="fda")
    err = max(err, float(np.abs(got - ref).max()))
    assert err < 1e-12, f"differential cross-attention identities fail ({err})"
    return err


register(
    Mechanism(
        slug="differential_cross_attention", family="2-differential", tier="T1",
        title="Differential cross-attention with masked or external keys (FDA, STR decoder, GSRA)",
        paper="Tian, Lin, Zhao, Shen, 'Function-word De-Attention', 2025, arXiv 2512.07222; STR decoder "
              "and PhaSR GSRA (see the docs)",
        forward=differential_cross_attention_forward, backward=differential_cross_attention_backward,
        sample=_sample_cross, docs="differential.md#differential_cross_attention",
        checks={"empty_subset_cancel_and_core": _check_cross_identities},
    ),
)
