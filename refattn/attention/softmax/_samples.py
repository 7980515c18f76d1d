"""Random inputs shared by the softmax family's registry records (test-only; no mechanism here).

A private module (so it has no API page); the names inside are public because several mechanism
modules import them.
"""

from __future__ import annotations

from ...registry import Sample
from .core import KV_GROUP_MAPS

__all__ = ["random_qkv", "random_qkv_heads", "sample_mha"]


def random_qkv_heads(rng, b, h, hkv, n, m, d, dv):
    """Standard-normal ``q (b, h, n, d)``, ``k (b, hkv, m, d)``, ``v (b, hkv, m, dv)``, drawn in that order."""
    return (rng.standard_normal((b, h, n, d)), rng.standard_normal((b, hkv, m, d)),
            rng.standard_normal((b, hkv, m, dv)))


def random_qkv(rng, b=2, h=2, n=6, m=6, d=3, dv=2):
    """Standard-normal ``q (b, h, n, d)``, ``k (b, h, m, d)``, ``v (b, h, m, dv)`` (one kv head per query head)."""
    return random_qkv_heads(rng, b, h, h, n, m, d, dv)


def sample_mha(rng, size, gqa=False):
    """Sample of the ``multi_head_attention`` record (``gqa=True``: of ``gqa_mqa``): self- or
    cross-attention, random projections from `refattn.attention.softmax.mha.init_mha_params`."""
    from .mha import init_mha_params  # lazy: mha imports this module for its record

    bsz = 2
    if size == "tiny":
        n, m, c, h, d = int(rng.integers(2, 4)), int(rng.integers(2, 4)), 3, 2, 2
    else:
        n, m, c, h, d = int(rng.integers(4, 8)), int(rng.integers(4, 9)), 8, 4, 3
    hkv = (1 if size == "tiny" else int(rng.choice([1, 2]))) if gqa else h
    cross = bool(rng.random() < 0.5)
    cc = c + 1 if cross else c
    x = rng.standard_normal((bsz, n, c))
    inputs = {"x": x}
    if cross:
        inputs["context"] = rng.standard_normal((bsz, m, cc))
    params = init_mha_params(rng, c, h, d, num_kv_heads=hkv, c_context=cc, bias=not gqa or rng.random() < 0.5)
    cfg = {"num_heads": h, "num_kv_heads": hkv}
    if gqa:
        cfg["kv_group_map"] = str(rng.choice(KV_GROUP_MAPS))
        return Sample(inputs=inputs, params=params, config=cfg)
    if not cross and rng.random() < 0.5:
        cfg["is_causal"] = True
    # the options of torch.nn.MultiheadAttention: a separate value input (vdim), add_bias_kv,
    # add_zero_attn, key_padding_mask (at least one kept key per sequence)
    if cross and rng.random() < 0.5:
        cv = c + 2
        inputs["value"] = rng.standard_normal((bsz, m, cv))
        params["v_proj"] = rng.uniform(-0.5, 0.5, (cv, params["v_proj"].shape[1]))
    if rng.random() < 0.5:
        params["bias_k"] = 0.5 * rng.standard_normal(params["k_proj"].shape[1])
        params["bias_v"] = 0.5 * rng.standard_normal(params["v_proj"].shape[1])
    if rng.random() < 0.5:
        cfg["add_zero_attn"] = True
    if rng.random() < 0.5:
        kpm = rng.random((bsz, m if cross else n)) < 0.7
        kpm[:, 0] = True
        cfg["key_padding_mask"] = kpm
    return Sample(inputs=inputs, params=params, config=cfg)
