r"""Neural Attention Search (NAtS): causal attention under the mask defined by per-token types.

Every token $j$ (per kv head) carries a type: **Global** (0), **Local** (1) or **Sliding window**
(2). Let $f_j$ be the position of the first Global token at or after $j$ ($f_j = j$ when there is
none). Query $i$ sees key $j$ iff $j\le i$ and

$$\underbrace{f_j = j}_{\text{Global}}\ \ \lor\ \ \big(\text{type}_j = \text{Local}\ \land\ i\le f_j\big)\ \ \lor\ \
\big(\text{type}_j = \text{Sliding}\ \land\ i\le j + w\big),$$

so a Global token stays visible to all later queries, a Local token until (and including) the next
Global token, a Sliding token to the $w$ = ``local_seq_max_length`` following queries. The output is
softmax attention under that keep-mask, $O = \mathrm{softmax}(sQK^\top + M_{\text{types}})V$; the
mask is shared by the query heads of a kv head (GQA).

Types are searched: the layer predicts them from the hidden state with ``proj_layer`` (logits of
the three options per kv head), `nats_token_types` gives the inference rule (argmax after adding
``global_token_enhanced_value`` to the Global logit; token 0 always Global; in training upstream
also forces the last token to Global).

Backward (types held fixed)
---------------------------
The types are discrete: the gradient here is the masked-attention VJP with the mask held fixed
(`attention_core_backward`) for $q, k, v$. Upstream trains the type logits through hard
Gumbel-softmax samples and a custom gradient of the attention output with respect to the one-hot
samples, accumulated inside its Triton backward kernel (``_attn_bwd_dkdv``, the
``d_end_seq_values*`` sums of $P^{\text{unmasked}}\odot(dP - \delta)$ over mask regions); that
estimator is not reproduced here, so ``proj_layer`` gets no gradient from this module.

Conventions (keyword, default)
------------------------------
``local_seq_max_length`` $w$ = 4 (upstream ``BaseNAtSAttentionLayer``), ``scale`` $1/\sqrt d$,
``kv_group_map`` ``"contiguous"`` (upstream ``off_h // N_REP``). The catalogue's "Local: visible
until the next Global token appears" reads in the code as "up to and including the next Global
token's position" ($i\le f_j$), which is what is implemented.

Paper: D. Deng, M. Lindauer, "Neural Attention Search", 2025 (official repository
automl/NeuralAttentionSearch, not in the code index here). Upstream read: codingmonkey2077/nats (the
same ``nats`` package) ``nats/models/transformer/attention/nats_attention.py``
(``BaseNAtSAttentionLayer``: ``get_end_seq_indices``, ``_sample_for_token_info_values[_inference]``)
and ``nats/models/transformer/triton/flashattention_mask_on_chip.py`` (``_attn_fwd_inner``: the mask
rule) @ 25d933d133e4080a5318f82c19796109c66d25f2.

Measured agreement (float64, CPU, torch 2.13): the Triton kernel needs a GPU, so its forward mask
rule and ``get_end_seq_indices`` were transcribed into torch (``cummax`` index semantics kept) and run
as masked softmax attention with autograd: random types (and all-Global, all-Local, all-Sliding),
$w\in\{1, 2, 4\}$, $H=4$ with $H_{kv}\in\{2, 4\}$, $N=10$, batch 2: masks identical, output max abs
error 8.9e-16, gradients of $q, k, v$ max abs error 1.8e-15; the inference type rule identical on
random logits.
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, check_choice, compute_dtype, validate_qkv
from ...registry import Mechanism, Sample, register
from .core import KV_GROUP_MAPS, attention_core_backward, attention_core_forward, check_size, expand_kv

__all__ = ["NATS_GLOBAL", "NATS_LOCAL", "NATS_SLIDING", "nats_token_types", "nats_next_global", "nats_keep_mask",
           "nats_attention_forward", "nats_attention_backward", "nats_attention"]

NATS_GLOBAL, NATS_LOCAL, NATS_SLIDING = 0, 1, 2


def nats_token_types(type_logits, *, global_token_enhanced_value: float = 0.1, force_first_global: bool = True,
                     force_last_global: bool = False) -> np.ndarray:
    r"""Inference type rule: ``argmax`` over the 3 options after adding the Global bonus.

    ``type_logits`` ``(B, N, H_m, 3)`` (upstream ``proj_layer(x).unflatten(-1, (n_msks, 3))``) ->
    types ``(B, H_m, N)`` int (0 Global, 1 Local, 2 Sliding). Token 0 is Global (upstream
    ``start_pos < sink_token_end``); ``force_last_global`` is upstream's training-time rule.
    """
    lg = as_float(type_logits, "type_logits", ndim=4)
    if lg.shape[-1] != 3:
        raise ValueError(f"type_logits must have 3 options on its last axis; got {lg.shape}")
    lg = lg.copy()
    lg[..., 0] += float(global_token_enhanced_value)
    types = np.swapaxes(np.argmax(lg, axis=-1), 1, 2)
    if force_first_global:
        types[..., 0] = NATS_GLOBAL
    if force_last_global:
        types[..., -1] = NATS_GLOBAL
    return types


def nats_next_global(types) -> np.ndarray:
    r"""$f_j$: the position of the first Global token at or after $j$, or $j$ when none follows
    (upstream ``get_end_seq_indices``)."""
    types = np.asarray(types)
    n = types.shape[-1]
    idx = np.where(types == NATS_GLOBAL, np.arange(n), n)
    nxt = np.flip(np.minimum.accumulate(np.flip(idx, -1), axis=-1), -1)
    return np.where(nxt == n, np.arange(n), nxt)


def _check_types(types, b, hkv, n):
    t = np.asarray(types)
    if t.shape != (b, hkv, n):
        raise ValueError(f"token_types must have shape (B, H_kv, N) = {(b, hkv, n)}; got {t.shape}")
    if not np.issubdtype(t.dtype, np.integer) or t.size and (t.min() < 0 or t.max() > 2):
        raise ValueError("token_types must be integers in {0: Global, 1: Local, 2: Sliding window}")
    return t


def nats_keep_mask(token_types, *, local_seq_max_length: int = 4) -> np.ndarray:
    r"""Boolean keep-mask ``(B, H_kv, N, N)`` of the type rule (module docstring), causal included."""
    t = np.asarray(token_types)
    w = check_size(local_seq_max_length, "local_seq_max_length", minimum=0)
    n = t.shape[-1]
    f = nats_next_global(t)[..., None, :]
    i = np.arange(n)[:, None]
    j = np.arange(n)[None, :]
    local = np.where(t[..., None, :] == NATS_SLIDING, i <= j + w, f >= i)
    return (local | (f == j)) & (j <= i)


def nats_attention_forward(q, k, v, *, token_types, local_seq_max_length: int = 4, scale=None,
                           kv_group_map: str = "contiguous"):
    r"""Causal attention under the NAtS type mask (module docstring).

    Parameters
    ----------
    q : array (B, H, N, d)
    k : array (B, H_kv, N, d)
    v : array (B, H_kv, N, dv)
    token_types : int array (B, H_kv, N)
        0 Global, 1 Local, 2 Sliding window (e.g. from `nats_token_types`). Held fixed.
    local_seq_max_length : int
        Sliding-window reach $w$ (upstream 4).
    scale : float > 0, optional
    kv_group_map : {"contiguous", "strided"}

    Returns
    -------
    out, cache
        ``out (B, H, N, dv)``; ``cache["keep"]`` the mask (B, H_kv, N, N).
    """
    q, k, v = validate_qkv(q, k, v)
    if q.ndim != 4 or k.shape[-2] != q.shape[-2]:
        raise ValueError(f"q must be (B, H, N, d) and k (B, H_kv, N, d) with the same N; got {q.shape}, {k.shape}")
    check_choice(kv_group_map, "kv_group_map", KV_GROUP_MAPS)
    t = _check_types(token_types, q.shape[0], k.shape[1], q.shape[2])
    keep = nats_keep_mask(t, local_seq_max_length=local_seq_max_length)
    dt = compute_dtype(q, k, v)
    q, k, v = (a.astype(dt, copy=False) for a in (q, k, v))
    mask = expand_kv(keep, q.shape[1] // k.shape[1], kv_group_map)
    out, core = attention_core_forward(q, k, v, attn_mask=mask, scale=scale, kv_group_map=kv_group_map)
    return out.copy(), {"core": core, "keep": keep, "shape": out.shape, "dtype": dt}


def nats_attention_backward(dout, cache):
    r"""Gradient of :func:`nats_attention_forward` for ``q``, ``k``, ``v`` with the token types held fixed."""
    return attention_core_backward(as_dout(dout, cache["shape"], cache["dtype"]), cache["core"])


def nats_attention(q, k, v, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`nats_attention_forward`."""
    return nats_attention_forward(q, k, v, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size):
    n, hkv, group, d = (4, 1, 2, 2) if size == "tiny" else (8, 2, 2, 3)
    types = rng.integers(0, 3, size=(2, hkv, n))
    types[..., 0] = NATS_GLOBAL
    cfg = {"token_types": types, "local_seq_max_length": int(rng.integers(1, 3))}
    q = rng.standard_normal((2, hkv * group, n, d))
    k = rng.standard_normal((2, hkv, n, d))
    v = rng.standard_normal((2, hkv, n, d))
    return Sample(inputs={"q": q, "k": k, "v": v}, config=cfg)


def _visible(types, i, j, w):
    # the rule written per pair, with the next Global token found by a scan
    if j > i:
        return False
    f = next((m for m in range(j, len(types)) if types[m] == NATS_GLOBAL), j)
    if f == j:
        return True
    return i <= j + w if types[j] == NATS_SLIDING else i <= f


def _reference(q, k, v, *, token_types, local_seq_max_length=4, scale=None, kv_group_map="contiguous"):
    b, h, n, d = q.shape
    g = h // k.shape[1]
    s = d ** -0.5 if scale is None else scale
    out = np.zeros(q.shape[:-1] + (v.shape[-1],))
    for bb in range(b):
        for hh in range(h):
            kv = hh // g if kv_group_map == "contiguous" else hh % k.shape[1]
            for i in range(n):
                vis = [j for j in range(n) if _visible(list(token_types[bb, kv]), i, j, local_seq_max_length)]
                sc = np.array([s * q[bb, hh, i] @ k[bb, kv, j] for j in vis])
                w = np.exp(sc - sc.max())
                out[bb, hh, i] = (w / w.sum()) @ v[bb, kv, vis]
    return out


def _check_all_global_is_causal(rng):
    from .core import sdpa_reference

    q, k, v = (rng.standard_normal((2, 2, 6, 3)) for _ in range(3))
    y = nats_attention(q, k, v, token_types=np.zeros((2, 2, 6), dtype=int))
    err = float(np.abs(y - sdpa_reference(q, k, v, is_causal=True)).max())
    assert err < 1e-12, err
    return err


def _check_mask_rule_brute_force(rng):
    t = rng.integers(0, 3, size=(3, 2, 9))
    bad = 0
    for w in (0, 1, 3):
        keep = nats_keep_mask(t, local_seq_max_length=w)
        for idx in np.ndindex(3, 2):
            for i in range(9):
                for j in range(9):
                    bad += keep[idx][i, j] != _visible(list(t[idx]), i, j, w)
    assert bad == 0, bad
    return 0.0


register(
    Mechanism(
        slug="neural_attention_search_mask", family="1-softmax", tier="T2",
        title="Neural Attention Search: Global / Local / Sliding token types defining the attention mask",
        paper="D. Deng, M. Lindauer, Neural Attention Search, 2025 (automl/NeuralAttentionSearch)",
        official_code="automl/NeuralAttentionSearch (read: codingmonkey2077/nats)",
        forward=nats_attention_forward, backward=nats_attention_backward, sample=_sample, reference=_reference,
        docs="softmax/masks-and-selection.md#neural-attention-search-mask",
        checks={"all_global_is_causal": _check_all_global_is_causal,
                "mask_rule_brute_force": _check_mask_rule_brute_force},
    ),
)
