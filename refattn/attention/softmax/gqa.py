r"""Grouped-query and multi-query attention (GQA / MQA): the multi-head layer with fewer key/value
heads than query heads.

With $H$ query heads and $H_{kv}$ kv heads ($H_{kv}$ divides $H$, $r = H/H_{kv}$; MQA is
$H_{kv} = 1$), query head $h$ reads kv head

$$g(h) = \lfloor h/r\rfloor\ \ (\texttt{kv\_group\_map="contiguous"}),\qquad
g(h) = h \bmod H_{kv}\ \ (\texttt{"strided"}).$$

``"contiguous"`` is HF/unilm ``repeat_kv``, flash-attn, PyTorch ``enable_gqa=True`` and
``repeat_interleave``; ``"strided"`` tiles the kv heads, as ``k.repeat(1, r, 1, 1)`` does. The
forward expands K and V to $H$ heads (`expand_kv` in `refattn.attention.softmax.core`) and runs
SDPA per head. The layer is `mha_forward` of `refattn.attention.softmax.mha` with
``num_kv_heads < num_heads`` (projections ``k_proj (Cc, Hkv*d)``, ``v_proj (Cc, Hkv*dv)``); this
module holds its page and its record, not a second implementation.

Backward
--------
Expanding copies each kv head to its $r$ query heads, so the adjoint is the reduce-sum over each
group (`reduce_kv`):

$$dK_g = \sum_{h:\,g(h)=g} dK^{(h)},\qquad dV_g = \sum_{h:\,g(h)=g} dV^{(h)};$$

everything else is the MHA backward.

The ``gqa_mqa`` record checks that the layer equals MHA with explicitly duplicated K/V weights and
that the shared weights' gradient is the sum of the duplicated model's gradients, for both maps and
for MQA.

Papers: Shazeer, "Fast Transformer Decoding: One Write-Head is All You Need", arXiv 1911.02150
(MQA); Ainslie et al., "GQA: Training Generalized Multi-Query Transformer Models from Multi-Head
Checkpoints", EMNLP 2023, arXiv 2305.13245.
"""

from __future__ import annotations

import numpy as np

from ...registry import Mechanism, register
from ._samples import sample_mha
from .mha import init_mha_params, mha_backward, mha_forward

__all__: list[str] = []


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _duplicate_kv(p, h, hkv, kv_group_map):
    r = h // hkv
    out = dict(p)
    for n in ("k_proj", "v_proj"):
        w = p[n]
        e = w.shape[1] // hkv
        w3 = w.reshape(w.shape[0], hkv, e)
        out[n] = (np.repeat(w3, r, axis=1) if kv_group_map == "contiguous"
                  else np.concatenate([w3] * r, axis=1)).reshape(w.shape[0], h * e)
        if n + "_bias" in p:
            b2 = p[n + "_bias"].reshape(hkv, e)
            out[n + "_bias"] = (np.repeat(b2, r, axis=0) if kv_group_map == "contiguous"
                                else np.concatenate([b2] * r, axis=0)).reshape(-1)
    return out


def _check_gqa_equals_duplicated_mha(rng):
    err = 0.0
    for hkv, gm in ((2, "contiguous"), (2, "strided"), (1, "contiguous")):
        h = 4
        x = rng.standard_normal((2, 5, 6))
        p = init_mha_params(rng, 6, h, 2, num_kv_heads=hkv)
        y, c = mha_forward(x, params=p, num_heads=h, num_kv_heads=hkv, kv_group_map=gm)
        pd = _duplicate_kv(p, h, hkv, gm)
        y2, c2 = mha_forward(x, params=pd, num_heads=h)
        G = rng.standard_normal(y.shape)
        g, g2 = mha_backward(G, c), mha_backward(G, c2)
        err = max(err, float(np.abs(y - y2).max()), float(np.abs(g["x"] - g2["x"]).max()))
        r = h // hkv
        for n in ("k_proj", "v_proj"):
            w = g2[n].reshape(g2[n].shape[0], *((hkv, r) if gm == "contiguous" else (r, hkv)), -1)
            red = w.sum(axis=2 if gm == "contiguous" else 1).reshape(g[n].shape)
            err = max(err, float(np.abs(g[n] - red).max()))
    assert err < 1e-12, err
    return err


register(
    Mechanism(
        slug="gqa_mqa", family="1-softmax", tier="T1",
        title="Grouped-query / multi-query attention layer (contiguous or strided kv grouping)",
        paper="Shazeer, arXiv 1911.02150 (MQA); Ainslie et al., GQA, EMNLP 2023, arXiv 2305.13245",
        forward=mha_forward, backward=mha_backward, sample=lambda rng, size: sample_mha(rng, size, gqa=True),
        docs="softmax-attention.md#gqa-mqa", module=__name__,
        checks={"equals_duplicated_mha": _check_gqa_equals_duplicated_mha},
    ),
)
