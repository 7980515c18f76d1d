r"""Rows of the :mod:`refattn.interop.torch` table for the linear / sparse attention group "lin_a".

Each :class:`~refattn.interop.torch_specs.Spec` here maps a mechanism whose registry record's
forward is the upstream module's forward and whose params carry the upstream names; it is
registered with :func:`~refattn.interop.torch_specs.add_specs` into the same
:data:`~refattn.interop.torch_specs.SPECS` that :mod:`refattn.interop.torch` reads (that module
imports this one). Mechanisms of the group without a table are listed with
:func:`~refattn.interop.unmapped.add_unmapped`. The reference modules the tests run are in
``tests/_upstream_lin_a.py``.
"""

from __future__ import annotations

import numpy as np

from .torch_specs import Named, Spec, add_specs

__all__ = ["GROUP_SLUGS"]


# ---- Informer AttentionLayer(ProbAttention): forward(queries, keys, values, attn_mask); upstream draws
# the key sample with torch.randint(L_K, (L_Q, U)), which the call replaces by the builder's draw


def _informer_build(rng, p, cfg, z):
    from ..attention.linear.informer_probsparse import probsparse_sizes

    c = p["query_projection.weight"].shape[0]
    n = max(z["n"], 2)  # upstream samples c*ceil(ln 1) = 0 keys for one token and fails: two tokens at least
    big_u, _ = probsparse_sizes(n, n, int(cfg.get("factor", 5)))
    inp = {k: rng.standard_normal((z["b"], n, c)) for k in ("queries", "keys", "values")}
    return inp, {"index_sample": rng.integers(0, n, (n, big_u))}


def _informer_call(module, inp, cfg):
    import torch

    idx = torch.as_tensor(np.asarray(cfg["index_sample"]))
    randint = torch.randint
    torch.randint = lambda *a, **k: idx  # ProbAttention._prob_QK's sample: the one refattn is given
    try:
        return module(inp["queries"], inp["keys"], inp["values"], None)[0]
    finally:
        torch.randint = randint


_SPECS = [
    Spec("informer_probsparse_attention",
         "zhouhaoyi/Informer2020 models/attn.py@29f2a73 (AttentionLayer(ProbAttention); forward(queries, keys, "
         "values, None); torch.randint's key sample replaced by the drawn index_sample; utils/masking.py ProbMask)",
         rules=[Named(r"(query|key|value|out)_projection\.weight", True),
                Named(r"(query|key|value|out)_projection\.bias", False)],
         required=("query_projection.weight", "key_projection.weight", "value_projection.weight",
                   "out_projection.weight"),
         call=_informer_call, build=_informer_build,
         attrs={"n_heads": "n_heads", "mix": "mix", "factor": "inner_attention.factor",
                "mask_flag": "inner_attention.mask_flag", "scale": "inner_attention.scale"}),
]

add_specs(*_SPECS)

GROUP_SLUGS = tuple(s.key for s in _SPECS)
"""The keys this module adds to :data:`~refattn.interop.torch_specs.SPECS`."""
