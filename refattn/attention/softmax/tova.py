r"""TOVA (Token Omission Via Attention): KV-cache eviction by the current query's head-averaged attention.

A decoder with a KV cache of at most $k$ entries (the "multi-state RNN" of the paper, $k$ states).
At step $t$ the cache $\mathcal C_{t-1}$ receives the new key/value, the query attends to
$\mathcal C_{t-1}\cup\{t\}$ with ordinary softmax attention, and then, if the cache holds more than
$k$ entries, it keeps the $k$ with the largest head-averaged weight of the current query,

$$a_j = \frac1H\sum_{h=1}^{H}\mathrm{softmax}_{j\in\mathcal C_{t-1}\cup\{t\}}\big(s\,q^h_t\cdot k^h_j\big),
\qquad \mathcal C_t = \mathrm{top}_k(a),$$

one decision for every head of the layer (the mean runs over the *query* heads; with GQA the
kept indices gather every kv head). Token by token the cache grows by one and TOVA evicts
$\arg\min_j a_j$; a prompt processed as one block (``prefill`` tokens, causal attention inside
the block) is cut to the top $k$ of its last query's weights at once, as upstream's ``generate``.

So the whole run is softmax attention under a boolean visibility mask $M_{tj} = [j\in\mathcal
C_{t-1}\cup\{t\}]$ (rows of the prefill block: $M_{tj} = [j\le t]$): `tova_keep_mask` computes
$M$ by simulating the cache, and the forward is `attention_core_forward` with ``attn_mask`` $= M$.

Backward (selection held fixed)
-------------------------------
The top-$k$ choice is piecewise constant in $q, k$: almost everywhere its derivative is zero, and
the gradient is the masked-attention VJP with $M$ held fixed (`attention_core_backward`;
upstream's ``.detach()`` of the mean weights and integer ``gather`` give the same gradient under
autograd). Finite differences agree wherever no perturbation changes the selection: the sampler
keeps a gap between the $k$-th and $(k+1)$-th largest $a_j$ at every eviction.

Conventions (keyword, default)
------------------------------
``cache_size`` $k$ (upstream ``TOVACache(cache_size)``; ``>= N`` gives plain causal attention),
``prefill`` (1: token by token, the paper's RNN view; $P$: a $P$-token prompt in one block, as
upstream ``model.generate(prompt)``), ``scale`` ($1/\sqrt d$, upstream ``/ math.sqrt(head_dim)``),
``kv_group_map`` (``"contiguous"``: HF ``repeat_kv``). Ties in the top-$k$ (upstream
``torch.topk``, order unspecified) are broken toward the earlier token here.

Paper: M. Oren, M. Hassid, N. Yarden, Y. Adi, R. Schwartz, "Transformers are Multi-State RNNs",
EMNLP 2024, arXiv 2401.06104. Upstream: schwartz-lab-NLP/TOVA ``src/tova_cache.py``
(``TOVACache.reduce``) and ``src/convert_models/llama_custom.py`` (``tova_llama_attention_forward``:
attention over the grown cache, then ``reduce``) @ 9c7d09bfff64cfc92cfb5f9d7e138cb04866e5a7.

Measured agreement (float64, CPU, torch 2.13): upstream's ``TOVACache.reduce`` run as-is (its
``DynamicCache`` base replaced by a two-list stand-in, as ``transformers`` is not installed),
driven by the attention lines of ``tova_llama_attention_forward`` transcribed in torch, prompt +
token-by-token decode, $B=2$, $H=4$ (also GQA $H_{kv}=2$), $N=12$, $k\in\{3,5\}$, prefill
$\in\{1,4,7\}$ (12 runs): final caches identical and every step's output agrees, output max abs
error 6.7e-16; gradients of $q, k, v$ (torch autograd through upstream's gather) max abs error
1.1e-15.
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, check_choice, compute_dtype, validate_qkv
from ...nn.softmax import softmax_lse
from ...registry import Mechanism, Sample, register
from .core import KV_GROUP_MAPS, attention_core_backward, attention_core_forward, check_size, expand_kv

__all__ = ["tova_keep_mask", "tova_attention_forward", "tova_attention_backward", "tova_attention"]


def _validate(q, k, v, cache_size, prefill, kv_group_map):
    q, k, v = validate_qkv(q, k, v)
    if q.ndim != 4:
        raise ValueError(f"q must have shape (B, H, N, d) (one batch axis); got {q.shape}")
    if k.shape[-2] != q.shape[-2]:
        raise ValueError(f"k must have q's number of tokens N={q.shape[-2]} (self-attention decode); got {k.shape}")
    cache_size = check_size(cache_size, "cache_size")
    prefill = check_size(prefill, "prefill")
    if prefill > q.shape[-2]:
        raise ValueError(f"prefill must be at most the number of tokens N={q.shape[-2]}; got {prefill}")
    check_choice(kv_group_map, "kv_group_map", KV_GROUP_MAPS)
    return q, k, v, cache_size, prefill


def _top_k_sorted(a, k):
    # indices of the k largest entries, ties toward the earlier index, returned in increasing order
    order = np.argsort(-a, kind="stable")
    return np.sort(order[:k])


def tova_keep_mask(q, k, *, cache_size: int, prefill: int = 1, scale=None, kv_group_map: str = "contiguous"):
    r"""The visibility mask ``(B, N, N)`` bool of a TOVA run: row $t$ marks the cache (plus token $t$)
    that query $t$ attends to (module docstring). Also returns the kept indices after each step.

    Parameters
    ----------
    q : array (B, H, N, d)
    k : array (B, Hkv, N, d)
    cache_size : int
        $k$, the number of key/value states kept after each step.
    prefill : int
        Leading tokens processed as one causal block before the first eviction.

    Returns
    -------
    keep, history
        ``keep (B, N, N)`` bool; ``history[b][t]`` the sorted cache indices after step $t$
        (``t >= prefill - 1``).
    """
    q, k, _, cache_size, prefill = _validate(q, k, k, cache_size, prefill, kv_group_map)
    b, h, n, d = q.shape
    s = float(1.0 / np.sqrt(d)) if scale is None else scale
    ke = expand_kv(k, h // k.shape[1], kv_group_map)
    keep = np.zeros((b, n, n), dtype=bool)
    history = [dict() for _ in range(b)]
    for bb in range(b):
        keep[bb, :prefill, :prefill] = np.tri(prefill, dtype=bool)
        cache = np.arange(prefill)
        for t in range(prefill - 1, n):
            if t >= prefill:
                cache = np.append(cache, t)
                keep[bb, t, cache] = True
            if cache.size > cache_size:
                w, _ = softmax_lse(s * np.einsum("hd,hjd->hj", q[bb, :, t], ke[bb][:, cache]), axis=-1)
                cache = cache[_top_k_sorted(w.mean(0), cache_size)]
            history[bb][t] = cache.copy()
    return keep, history


def tova_attention_forward(q, k, v, *, cache_size: int, prefill: int = 1, scale=None,
                           kv_group_map: str = "contiguous"):
    r"""Causal decoding with a TOVA-evicted KV cache of ``cache_size`` entries.

    Parameters
    ----------
    q : array (B, H, N, d)
    k : array (B, Hkv, N, d)
    v : array (B, Hkv, N, dv)
        Projected (and, for RoPE models, rotated) queries, keys and values of $N$ tokens.
    cache_size : int
        $k$; ``cache_size >= N`` is ordinary causal attention.
    prefill : int
        1 (default): token by token. $P$: the first $P$ tokens are one causal block (a prompt), cut to
        the top $k$ of the last prompt query's weights afterwards.
    scale : float > 0, optional
        Default $1/\sqrt d$.
    kv_group_map : {"contiguous", "strided"}
        Query head to kv head map for GQA.

    Returns
    -------
    out, cache
        ``out (B, H, N, dv)``; ``cache["keep"]`` is the visibility mask (B, N, N).
    """
    q, k, v, cache_size, prefill = _validate(q, k, v, cache_size, prefill, kv_group_map)
    dt = compute_dtype(q, k, v)
    q, k, v = (a.astype(dt, copy=False) for a in (q, k, v))
    keep, _ = tova_keep_mask(q, k, cache_size=cache_size, prefill=prefill, scale=scale, kv_group_map=kv_group_map)
    out, core = attention_core_forward(q, k, v, attn_mask=keep[:, None], scale=scale, kv_group_map=kv_group_map)
    return out.copy(), {"core": core, "keep": keep, "shape": out.shape, "dtype": dt}


def tova_attention_backward(dout, cache):
    r"""Gradient of :func:`tova_attention_forward` for ``q``, ``k``, ``v`` with the eviction held fixed:
    the masked-attention VJP under the recorded visibility mask."""
    g = as_dout(dout, cache["shape"], cache["dtype"])
    return attention_core_backward(g, cache["core"])


def tova_attention(q, k, v, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`tova_attention_forward`."""
    return tova_attention_forward(q, k, v, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _eviction_gap(q, k, cache_size, prefill, scale=None):
    # smallest gap between the k-th and (k+1)-th largest head-mean weight over all evictions
    b, h, n, d = q.shape
    s = d ** -0.5 if scale is None else scale
    ke = expand_kv(k, h // k.shape[1])
    _, hist = tova_keep_mask(q, k, cache_size=cache_size, prefill=prefill, scale=scale)
    gap = np.inf
    for bb in range(b):
        for t in range(prefill - 1, n):
            cand = np.arange(prefill) if t == prefill - 1 else np.append(hist[bb][t - 1], t)
            if cand.size <= cache_size:
                continue
            w, _ = softmax_lse(s * np.einsum("hd,hjd->hj", q[bb, :, t], ke[bb][:, cand]), axis=-1)
            a = np.sort(w.mean(0))[::-1]
            gap = min(gap, a[cache_size - 1] - a[cache_size])
    return gap


def _sample(rng, size):
    n, hkv, group, d = (int(rng.integers(4, 6)), 1, 2, 2) if size == "tiny" else (int(rng.integers(6, 10)), 2, 2, 4)
    cache_size = int(rng.integers(2, n - 1))
    prefill = int(rng.integers(1, cache_size + 2))
    for _ in range(100):
        q = rng.standard_normal((2, hkv * group, n, d))
        k = rng.standard_normal((2, hkv, n, d))
        if _eviction_gap(q, k, cache_size, prefill) > 0.02:
            break
    v = rng.standard_normal((2, hkv, n, d))
    return Sample(inputs={"q": q, "k": k, "v": v}, config={"cache_size": cache_size, "prefill": prefill})


def _reference(q, k, v, *, cache_size, prefill=1, scale=None, kv_group_map="contiguous"):
    # an explicit decode loop with a Python-list cache; token by token it evicts the argmin of the
    # head-mean weights (one entry per step), the prefill block is cut to the top k at once
    b, h, n, d = q.shape
    s = d ** -0.5 if scale is None else scale
    g = h // k.shape[1]
    out = np.zeros(q.shape[:-1] + (v.shape[-1],))
    for bb in range(b):
        kv_of = [hh // g for hh in range(h)]
        cache = []
        for t in range(n):
            cache.append(t)
            vis = list(range(t + 1)) if t < prefill else list(cache)
            ws = []
            for hh in range(h):
                sc = np.array([s * q[bb, hh, t] @ k[bb, kv_of[hh], j] for j in vis])
                w = np.exp(sc - sc.max())
                w /= w.sum()
                ws.append(w)
                out[bb, hh, t] = sum(w[i] * v[bb, kv_of[hh], j] for i, j in enumerate(vis))
            if t < prefill - 1:
                continue
            a = np.mean(ws, axis=0)
            if t == prefill - 1 and len(cache) > cache_size:
                cache = sorted(np.argsort(-a, kind="stable")[:cache_size].tolist())
            while len(cache) > cache_size:
                del cache[int(np.argmin(a))]
    return out


def _check_large_cache_is_causal(rng):
    from .core import sdpa_reference

    q, k, v = (rng.standard_normal((2, 2, 6, 3)) for _ in range(3))
    y = tova_attention(q, k, v, cache_size=6, prefill=int(rng.integers(1, 7)))
    err = float(np.abs(y - sdpa_reference(q, k, v, is_causal=True)).max())
    assert err < 1e-12, err
    return err


def _check_cache_size_invariant(rng):
    # every query after the prefill block sees exactly min(t+1, k+1) keys; the prefill block is causal
    q, k = rng.standard_normal((2, 4, 9, 3)), rng.standard_normal((2, 2, 9, 3))
    keep, _ = tova_keep_mask(q, k, cache_size=3, prefill=5)
    counts = keep.sum(-1)
    want = np.array([1, 2, 3, 4, 5, 4, 4, 4, 4])
    assert (counts == want).all() and keep[:, np.arange(9), np.arange(9)].all(), counts
    return 0.0


register(
    Mechanism(
        slug="tova_kv_eviction", family="1-softmax", tier="T2",
        title="TOVA: KV-cache eviction by the current query's head-averaged attention (selection fixed)",
        paper="M. Oren, M. Hassid, N. Yarden, Y. Adi, R. Schwartz, Transformers are Multi-State RNNs, "
              "EMNLP 2024, arXiv 2401.06104",
        official_code="schwartz-lab-NLP/TOVA",
        forward=tova_attention_forward, backward=tova_attention_backward, sample=_sample, reference=_reference,
        docs="softmax/masks-and-selection.md#tova-kv-cache-eviction",
        checks={"large_cache_is_causal": _check_large_cache_is_causal,
                "cache_size_invariant": _check_cache_size_invariant},
    ),
)
