r"""Exact memory-efficient forms of softmax attention: FlashAttention-2 recurrences, Rabe–Staats
chunking with a checkpointed backward, and the associative (tree) merge of chunk summaries.

All three compute exactly :func:`refattn.attention.softmax.sdpa_forward` (same arguments: masks,
``is_causal``/``causal_alignment``, ``scale``, ``softcap``, GQA ``kv_group_map``) while only ever
materialising score tiles, and agree with it to round-off (checked to $10^{-12}$ in float64).
They are NumPy readings of the algorithms, vectorised over the batch and head axes; the loops are
over tiles. Score tile $(I, J)$: $S_{IJ} = \mathrm{cap}(s\,Q_IK_J^\top) + M_{IJ}$.

One module for three mechanisms, because they share one derivation: each splits the scores into
tiles (the shared `_Tiles` context builds any tile $S_{IJ}$ with softcap and masks), summarises a
tile by its running max, sum and weighted values $(m, \ell, \tilde O)$, combines summaries with
the same rescaling $e^{m - m'}$ (online in FlashAttention-2, one combine per query chunk in
Rabe–Staats, a binary tree in tree attention) and differentiates through the stored
$L = m + \log\ell$ with the one FlashAttention-2 backward below (Rabe–Staats also has the
paper's checkpointed backward, which reduces to it). Split apart, each module would import the
others' private tiling helpers.

FlashAttention-2 forward (online softmax)
-----------------------------------------
Dao et al., "FlashAttention", NeurIPS 2022, arXiv 2205.14135; Dao, "FlashAttention-2",
arXiv 2307.08691. Readable references: labmlai/annotated_deep_learning_paper_implementations
``labml_nn/transformers/flash/__init__.py``@9262c57 (Triton, log2 base), pytorch
``aten/src/ATen/native/cpu/FlashAttentionKernel.cpp`` (``lse = qk_max + log(qk_sum)``).
For each query block $I$ keep $m_I$ (running max), $\ell_I$ (running sum) and $\tilde O_I$; for
each key block $J$:

$$m' = \max(m_I, \mathrm{rowmax}\,S_{IJ}),\quad \tilde P = e^{S_{IJ} - m'},\quad
\ell_I \leftarrow e^{m_I - m'}\ell_I + \mathrm{rowsum}\,\tilde P,\quad
\tilde O_I \leftarrow e^{m_I-m'}\tilde O_I + \tilde P V_J,\quad m_I \leftarrow m'.$$

Finally $O_I = \tilde O_I/\ell_I$ and only $L_I = m_I + \log\ell_I$ is stored. With
``lse_base="2"`` the recurrence runs in base 2 (scores times $\log_2 e$, ``exp2``; labml's
``RCP_LN2``) and $L$ is stored as $\log_2\sum_j 2^{S_{ij}\log_2 e}$ = $L/\ln 2$; the output is the
same. Causal tiles that lie entirely above the diagonal are skipped.

FlashAttention-2 backward
-------------------------
$D_i = \mathrm{rowsum}(dO_i\odot O_i)$; for each key block $J$ (accumulating $dK_J, dV_J$) and
query block $I$: recompute $P_{IJ} = e^{S_{IJ} - L_I}$, then

$$dV_J \mathrel{+}= P_{IJ}^\top dO_I,\quad dP_{IJ} = dO_IV_J^\top,\quad dS_{IJ} = P_{IJ}\odot(dP_{IJ} - D_I),$$
$$dQ_I \mathrel{+}= s\,dS^0_{IJ}K_J,\quad dK_J \mathrel{+}= s\,(dS^0_{IJ})^\top Q_I,$$

with $dS^0 = dS\odot(1-\tanh^2)$ under softcap. This is the SDPA VJP (``sdpa.md``) with
$\mathrm{rowsum}(P\odot dP) = D$ and $P$ recomputed from $L$, so nothing of size $N\times M$ is
kept. Fully masked rows have $L = -\infty$; $P$ is then taken as 0 (no NaN).

Rabe–Staats
-----------
Rabe & Staats, "Self-attention Does Not Need O(n²) Memory", arXiv 2112.05682 (JAX listing in the
paper). Per query chunk, a *map* over key chunks $c$ produces summaries with the chunk's own max
$m_c$: $v_c = \sum_{j\in c} e^{s_{ij}-m_c}v_j$, $\ell_c = \sum_{j\in c}e^{s_{ij}-m_c}$; then one
combine with the global max $m = \max_c m_c$, $\alpha_c = e^{m_c - m}$:

$$O_i = \frac{\sum_c \alpha_c v_c}{Z},\qquad Z = \sum_c\alpha_c\ell_c.$$

The paper differentiates by *checkpointing* each chunk (recompute in the backward) with
``stop_gradient`` on the maxima. :func:`rabe_staats_backward` does exactly that by hand: per
query chunk it recomputes the chunk summaries, back-propagates through the combine,
$dv_c = \alpha_cG/Z$, $d\ell_c = -\alpha_c(G\cdot O)/Z$, then through each chunk:
$ds_j = e^{s_j - m_c}(dv_c\cdot v_j + d\ell_c)$, $dv_j = e^{s_j-m_c}dv_c$. Since
$e^{s_j-m_c}\alpha_c/Z = P_j$ this is $P_j(dP_j - D)$ — the flash backward, which
``backward_mode="flash"`` uses instead (both are checked equal). The maxima need no gradient:
$O$ does not depend on them.

Tree merge
----------
Shyam et al. (Zyphra), "Tree Attention: Topology-aware Decoding for Long-Context Attention on GPU
clusters", 2024 (code Zyphra/tree_attention ``tree_shard_test.py``@17a165e). Energy $F(\zeta) = \sum_i\log\sum_j e^{s_{ij} + \zeta_i\cdot v_j}$,
$O_i = \partial F/\partial\zeta_i|_{\zeta=0}$. Chunk summary $(m_b, \ell_b, o_b)$ with $o_b$
normalised; merge

$$m = \max(m_a, m_b),\quad \ell = \ell_ae^{m_a-m} + \ell_be^{m_b-m},\quad
o = (\ell_ae^{m_a-m}o_a + \ell_be^{m_b-m}o_b)/\ell,$$

associative and commutative with identity $(-\infty, 0, 0)$, reduced as a binary tree in
$\lceil\log_2 P\rceil$ rounds (split-KV / flash-decoding). Backward: flash-style from
$L = m + \log\ell$.
"""

from __future__ import annotations

import math

import numpy as np

from ..._checks import as_dout, check_choice, validate_qkv
from ...registry import Mechanism, Sample, register
from .core import (
    KV_GROUP_MAPS,
    causal_keep,
    check_size,
    expand_kv,
    reduce_kv,
    sdpa_reference,
    validate_qkv_config,
)
from .sdpa import sdpa, sdpa_backward, sdpa_forward

__all__ = [
    "LOG2E",
    "flash_attention_forward",
    "flash_attention_backward",
    "flash_attention",
    "rabe_staats_forward",
    "rabe_staats_backward",
    "chunk_summary",
    "merge_summaries",
    "tree_reduce",
    "tree_attention_forward",
    "tree_attention_backward",
    "attention_energy",
]

LOG2E = 1.4426950408889634  # labml's RCP_LN2 = 1 / ln 2


# --------------------------------------------------------------------------------------------
# Shared tiling context


class _Tiles:
    """Validated arguments and the score tile $S_{IJ}$ (with softcap and masks) of any block."""

    def __init__(self, q, k, v, attn_mask, is_causal, causal_alignment, scale, softcap, kv_group_map):
        q, k, v = validate_qkv(q, k, v)
        attn_mask, is_causal, scale, softcap = validate_qkv_config(
            q, k, attn_mask, is_causal, causal_alignment, scale, softcap, kv_group_map)
        dt = np.result_type(q, k, v)
        self.q, self.k, self.v = (a.astype(dt, copy=False) for a in (q, k, v))
        self.group = q.shape[-3] // k.shape[-3]
        self.kv_group_map = kv_group_map
        self.ke = expand_kv(self.k, self.group, kv_group_map)
        self.ve = expand_kv(self.v, self.group, kv_group_map)
        self.n, self.m = q.shape[-2], k.shape[-2]
        self.scale = float(1.0 / np.sqrt(q.shape[-1])) if scale is None else scale
        self.softcap = softcap
        self.causal = is_causal
        self.offset = 0 if causal_alignment == "top_left" else self.m - self.n
        target = q.shape[:-1] + (self.m,)
        if attn_mask is not None and attn_mask.dtype != np.bool_:
            attn_mask = attn_mask.astype(dt, copy=False)
        self.mask = None if attn_mask is None else np.broadcast_to(attn_mask, target)
        self.dtype = dt

    def skip(self, i0, i1, j0, j1):
        """True when the causal mask removes the whole tile (every key after every query's limit)."""
        return self.causal and j0 > (i1 - 1) + self.offset

    def scores(self, i0, i1, j0, j1):
        s0 = self.scale * (self.q[..., i0:i1, :] @ np.swapaxes(self.ke[..., j0:j1, :], -1, -2))
        th = None
        if self.softcap is not None:
            th = np.tanh(s0 / self.softcap)
            s0 = self.softcap * th
        if self.mask is not None:
            mk = self.mask[..., i0:i1, j0:j1]
            s0 = np.where(mk, s0, -np.inf) if mk.dtype == np.bool_ else s0 + mk
        if self.causal:
            keep = np.arange(j0, j1)[None, :] <= (np.arange(i0, i1)[:, None] + self.offset)
            if not keep.all():
                s0 = np.where(keep, s0, -np.inf)
        return s0, th


def _blocks(total, size):
    return [(a, min(a + size, total)) for a in range(0, total, size)]


def _split_sizes(total, sizes, name):
    sizes = [check_size(int(s) if isinstance(s, np.integer) else s, name) for s in sizes]
    if sum(sizes) != total:
        raise ValueError(f"{name} must sum to {total}; got {sizes} (sum {sum(sizes)})")
    out, a = [], 0
    for s in sizes:
        out.append((a, a + s))
        a += s
    return out


def _lse_to_natural(lse, base):
    return lse if base == "e" else lse / LOG2E


def _flash_backward_tiles(t: _Tiles, out, lse, g, qblocks, kblocks):
    """FA-2 backward over the given tilings; ``lse`` natural base. Returns ``{"q", "k", "v"}``."""
    d_row = np.sum(g * out, axis=-1)  # D_i = rowsum(dO * O)
    lse_safe = np.where(np.isfinite(lse), lse, np.inf)  # fully masked rows: P = exp(-inf) = 0
    dq = np.zeros_like(t.q)
    dke = np.zeros(t.ke.shape, t.dtype)
    dve = np.zeros(t.ve.shape, t.dtype)
    for j0, j1 in kblocks:
        kj, vj = t.ke[..., j0:j1, :], t.ve[..., j0:j1, :]
        for i0, i1 in qblocks:
            if t.skip(i0, i1, j0, j1):
                continue
            s, th = t.scores(i0, i1, j0, j1)
            p = np.exp(s - lse_safe[..., i0:i1, None])
            gi = g[..., i0:i1, :]
            dve[..., j0:j1, :] += np.swapaxes(p, -1, -2) @ gi
            ds = p * (gi @ np.swapaxes(vj, -1, -2) - d_row[..., i0:i1, None])
            if th is not None:
                ds = ds * (1.0 - th**2)
            dq[..., i0:i1, :] += t.scale * (ds @ kj)
            dke[..., j0:j1, :] += t.scale * (np.swapaxes(ds, -1, -2) @ t.q[..., i0:i1, :])
    return {"q": dq, "k": reduce_kv(dke, t.group, t.kv_group_map), "v": reduce_kv(dve, t.group, t.kv_group_map)}


# --------------------------------------------------------------------------------------------
# FlashAttention-2


def flash_attention_forward(q, k, v, *, block_q: int = 32, block_k: int = 64, attn_mask=None, is_causal: bool = False,
                            causal_alignment: str = "top_left", scale=None, softcap=None,
                            kv_group_map: str = "contiguous", lse_base: str = "e"):
    r"""FlashAttention-2 forward: online softmax over key blocks, storing only $O$ and $L$.

    Parameters
    ----------
    q, k, v, attn_mask, is_causal, causal_alignment, scale, softcap, kv_group_map
        As :func:`refattn.attention.softmax.sdpa_forward`.
    block_q, block_k : int
        Tile sizes $B_q, B_k$ (any positive sizes; ragged last blocks are fine). PyTorch's CPU
        kernel uses $B_k = 512$ and $B_q \in \{32, 64, 256\}$ by length.
    lse_base : {"e", "2"}
        Base of the stored log-sum-exp and of the exponentials in the recurrence (labml/Triton
        use base 2). ``cache["lse"]`` is in this base.

    Returns
    -------
    out, cache
        ``out`` (..., H, N, dv); ``cache["lse"]`` (..., H, N); ``cache["skipped_tiles"]`` counts
        causal tiles never computed.
    """
    block_q, block_k = check_size(block_q, "block_q"), check_size(block_k, "block_k")
    check_choice(lse_base, "lse_base", ("e", "2"))
    t = _Tiles(q, k, v, attn_mask, is_causal, causal_alignment, scale, softcap, kv_group_map)
    lead = t.q.shape[:-1]
    out = np.empty(lead + (t.v.shape[-1],), t.dtype)
    lse = np.empty(lead, t.dtype)
    skipped = 0
    c = LOG2E if lse_base == "2" else 1.0
    expf = np.exp2 if lse_base == "2" else np.exp
    logf = np.log2 if lse_base == "2" else np.log
    for i0, i1 in _blocks(t.n, block_q):
        mi = np.full(lead[:-1] + (i1 - i0,), -np.inf, t.dtype)
        li = np.zeros_like(mi)
        acc = np.zeros(lead[:-1] + (i1 - i0, t.v.shape[-1]), t.dtype)
        for j0, j1 in _blocks(t.m, block_k):
            if t.skip(i0, i1, j0, j1):
                skipped += 1
                continue
            s, _ = t.scores(i0, i1, j0, j1)
            if c != 1.0:
                s = s * c
            m_new = np.maximum(mi, s.max(axis=-1))
            m_safe = np.where(np.isfinite(m_new), m_new, 0.0)
            alpha = expf(mi - m_safe)  # exp(-inf) = 0 for the first block / masked rows
            p = expf(s - m_safe[..., None])
            li = alpha * li + p.sum(axis=-1)
            acc = alpha[..., None] * acc + p @ t.ve[..., j0:j1, :]
            mi = m_new
        empty = li == 0
        out[..., i0:i1, :] = acc / np.where(empty, 1.0, li)[..., None]
        lse[..., i0:i1] = np.where(empty, -np.inf, mi + logf(np.where(empty, 1.0, li)))
    # the cache keeps its own copy of out: a caller may update the returned array in place
    cache = {"tiles": t, "out": out.copy(), "lse": lse, "lse_base": lse_base, "block_q": block_q, "block_k": block_k,
             "skipped_tiles": skipped}
    return out, cache


def flash_attention_backward(dout, cache):
    """FlashAttention-2 backward (recompute $P$ from $L$, $D = \\mathrm{rowsum}(dO\\odot O)$): ``{"q","k","v"}``."""
    t: _Tiles = cache["tiles"]
    g = as_dout(dout, cache["out"].shape, t.dtype)
    lse = _lse_to_natural(cache["lse"], cache["lse_base"])
    return _flash_backward_tiles(t, cache["out"], lse, g, _blocks(t.n, cache["block_q"]),
                                 _blocks(t.m, cache["block_k"]))


def flash_attention(q, k, v, *, return_lse: bool = False, **config):
    """Convenience wrapper: ``out`` or ``(out, lse)`` of :func:`flash_attention_forward`."""
    out, cache = flash_attention_forward(q, k, v, **config)
    return (out, cache["lse"]) if return_lse else out


# --------------------------------------------------------------------------------------------
# Rabe–Staats


def _rs_chunk(t: _Tiles, i0, i1, j0, j1):
    """Summary of one key chunk for one query chunk: (p_tilde, m_c, l_c, v_c) and the softcap tanh."""
    s, th = t.scores(i0, i1, j0, j1)
    mc = s.max(axis=-1)
    m_safe = np.where(np.isfinite(mc), mc, 0.0)
    p = np.exp(s - m_safe[..., None])
    return p, mc, p.sum(axis=-1), p @ t.ve[..., j0:j1, :], th


def rabe_staats_forward(q, k, v, *, query_chunk_size: int = 1024, key_chunk_size: int = 4096, attn_mask=None,
                        is_causal: bool = False, causal_alignment: str = "top_left", scale=None, softcap=None,
                        kv_group_map: str = "contiguous", backward_mode: str = "checkpoint"):
    r"""Rabe–Staats chunked attention (paper defaults: query chunks 1024, key chunks 4096).

    Per query chunk: map over key chunks to summaries $(v_c, \ell_c, m_c)$, then one combine with
    the global max (see the module docstring). ``backward_mode="checkpoint"`` (the paper:
    recompute each chunk and differentiate through the combine) or ``"flash"`` (FA-2 backward
    from the stored $L = m + \log Z$).

    Returns
    -------
    out, cache
        ``cache["lse"]`` (natural base).
    """
    qc, kc = check_size(query_chunk_size, "query_chunk_size"), check_size(key_chunk_size, "key_chunk_size")
    check_choice(backward_mode, "backward_mode", ("checkpoint", "flash"))
    t = _Tiles(q, k, v, attn_mask, is_causal, causal_alignment, scale, softcap, kv_group_map)
    lead = t.q.shape[:-1]
    out = np.empty(lead + (t.v.shape[-1],), t.dtype)
    lse = np.empty(lead, t.dtype)
    for i0, i1 in _blocks(t.n, qc):
        summ = [_rs_chunk(t, i0, i1, j0, j1)[1:4] for j0, j1 in _blocks(t.m, kc)]
        mcs = np.stack([s_[0] for s_ in summ])
        m = mcs.max(axis=0)
        m_safe = np.where(np.isfinite(m), m, 0.0)
        alpha = np.exp(mcs - m_safe)
        z = np.sum(alpha * np.stack([s_[1] for s_ in summ]), axis=0)
        num = np.sum(alpha[..., None] * np.stack([s_[2] for s_ in summ]), axis=0)
        empty = z == 0
        out[..., i0:i1, :] = num / np.where(empty, 1.0, z)[..., None]
        lse[..., i0:i1] = np.where(empty, -np.inf, m + np.log(np.where(empty, 1.0, z)))
    cache = {"tiles": t, "out": out.copy(), "lse": lse, "qc": qc, "kc": kc, "backward_mode": backward_mode}
    return out, cache


def rabe_staats_backward(dout, cache):
    r"""Backward of :func:`rabe_staats_forward`: checkpointed (recompute each chunk, chain rule
    through the combine) or the flash backward, per ``backward_mode``. ``{"q", "k", "v"}``."""
    t: _Tiles = cache["tiles"]
    g = as_dout(dout, cache["out"].shape, t.dtype)
    qb, kb = _blocks(t.n, cache["qc"]), _blocks(t.m, cache["kc"])
    if cache["backward_mode"] == "flash":
        return _flash_backward_tiles(t, cache["out"], cache["lse"], g, qb, kb)
    dq = np.zeros_like(t.q)
    dke = np.zeros(t.ke.shape, t.dtype)
    dve = np.zeros(t.ve.shape, t.dtype)
    for i0, i1 in qb:
        chunks = [_rs_chunk(t, i0, i1, j0, j1) for j0, j1 in kb]  # recomputation (checkpointing)
        mcs = np.stack([c_[1] for c_ in chunks])
        m = mcs.max(axis=0)
        alpha = np.exp(mcs - np.where(np.isfinite(m), m, 0.0))
        z = np.sum(alpha * np.stack([c_[2] for c_ in chunks]), axis=0)
        z_safe = np.where(z == 0, 1.0, z)
        gi, oi = g[..., i0:i1, :], cache["out"][..., i0:i1, :]
        go = np.sum(gi * oi, axis=-1)
        qi = t.q[..., i0:i1, :]
        for (j0, j1), (p, _, _, _, th), a in zip(kb, chunks, alpha, strict=True):
            dvc = (a / z_safe)[..., None] * gi  # dL/dv_c
            dlc = -(a / z_safe) * go  # dL/dl_c
            vj = t.ve[..., j0:j1, :]
            ds = p * (dvc @ np.swapaxes(vj, -1, -2) + dlc[..., None])
            dve[..., j0:j1, :] += np.swapaxes(p, -1, -2) @ dvc
            if th is not None:
                ds = ds * (1.0 - th**2)
            dq[..., i0:i1, :] += t.scale * (ds @ t.ke[..., j0:j1, :])
            dke[..., j0:j1, :] += t.scale * (np.swapaxes(ds, -1, -2) @ qi)
    return {"q": dq, "k": reduce_kv(dke, t.group, t.kv_group_map), "v": reduce_kv(dve, t.group, t.kv_group_map)}


# --------------------------------------------------------------------------------------------
# Tree merge


def chunk_summary(s: np.ndarray, v: np.ndarray):
    r"""Summary $(m, \ell, o)$ of masked scores ``s`` (..., N, c) against values ``v`` (..., c, dv).

    $o$ is normalised ($\sum_j e^{s_j - m}v_j/\ell$). A fully masked chunk gives the identity
    $(-\infty, 0, 0)$.
    """
    m = s.max(axis=-1)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    p = np.exp(s - m_safe[..., None])
    ell = p.sum(axis=-1)
    o = (p @ v) / np.where(ell == 0, 1.0, ell)[..., None]
    return m, ell, o


def merge_summaries(a, b):
    r"""The associative, commutative merge $\oplus$ of two summaries $(m, \ell, o)$ (identity $(-\infty, 0, 0)$)."""
    ma, la, oa = a
    mb, lb, ob = b
    m = np.maximum(ma, mb)
    m_safe = np.where(np.isfinite(m), m, 0.0)
    wa = la * np.exp(ma - m_safe)
    wb = lb * np.exp(mb - m_safe)
    ell = wa + wb
    o = (wa[..., None] * oa + wb[..., None] * ob) / np.where(ell == 0, 1.0, ell)[..., None]
    return m, ell, o


def tree_reduce(summaries):
    """Reduce a list of summaries with :func:`merge_summaries` in ``ceil(log2 P)`` pairwise rounds.

    Returns ``(summary, rounds)``.
    """
    level = list(summaries)
    if not level:
        raise ValueError("summaries must not be empty")
    rounds = 0
    while len(level) > 1:
        level = [merge_summaries(level[i], level[i + 1]) if i + 1 < len(level) else level[i]
                 for i in range(0, len(level), 2)]
        rounds += 1
    return level[0], rounds


def tree_attention_forward(q, k, v, *, num_chunks: int = 4, chunk_sizes=None, attn_mask=None, is_causal: bool = False,
                           causal_alignment: str = "top_left", scale=None, softcap=None,
                           kv_group_map: str = "contiguous"):
    r"""Attention as a tree reduction of key-chunk summaries (split-KV / tree attention).

    Keys are split into ``num_chunks`` nearly equal chunks (``np.array_split`` sizes) or the
    explicit ragged ``chunk_sizes`` (summing to M); each chunk gives $(m_b, \ell_b, o_b)$ and
    :func:`tree_reduce` merges them. ``cache["lse"] = m + \log\ell``; ``cache["rounds"]``.
    """
    t = _Tiles(q, k, v, attn_mask, is_causal, causal_alignment, scale, softcap, kv_group_map)
    if chunk_sizes is None:
        num_chunks = check_size(num_chunks, "num_chunks")
        if num_chunks > t.m:
            raise ValueError(f"num_chunks ({num_chunks}) must not exceed the number of keys M={t.m}")
        sizes = [len(a) for a in np.array_split(np.arange(t.m), num_chunks)]
    else:
        sizes = list(chunk_sizes)
    kb = _split_sizes(t.m, sizes, "chunk_sizes")
    summaries = []
    for j0, j1 in kb:
        s, _ = t.scores(0, t.n, j0, j1)
        summaries.append(chunk_summary(s, t.ve[..., j0:j1, :]))
    (m, ell, o), rounds = tree_reduce(summaries)
    empty = ell == 0
    lse = np.where(empty, -np.inf, m + np.log(np.where(empty, 1.0, ell)))
    cache = {"tiles": t, "out": o.copy(), "lse": lse, "kb": kb, "rounds": rounds}
    return o, cache


def tree_attention_backward(dout, cache):
    """Flash-style backward of :func:`tree_attention_forward` from $L = m + \\log\\ell$: ``{"q","k","v"}``."""
    t: _Tiles = cache["tiles"]
    g = as_dout(dout, cache["out"].shape, t.dtype)
    return _flash_backward_tiles(t, cache["out"], cache["lse"], g, [(0, t.n)], cache["kb"])


def attention_energy(q, k, v, zeta, *, scale=None) -> float:
    r"""$F(\zeta) = \sum \log\sum_j \exp(s\,q_i\cdot k_j + \zeta_i\cdot v_j)$ summed over every batch,
    head and query; $\partial F/\partial\zeta|_{0}$ is the attention output (one kv head per query head)."""
    s = float(1.0 / np.sqrt(q.shape[-1])) if scale is None else scale
    x = s * (q @ np.swapaxes(k, -1, -2)) + zeta @ np.swapaxes(v, -1, -2)
    mx = x.max(axis=-1, keepdims=True)
    return float(np.sum(np.log(np.exp(x - mx).sum(axis=-1)) + mx[..., 0]))


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample_base(rng, size):
    if size == "tiny":
        b, h, hkv, n, m, d, dv = 2, 2, int(rng.choice([1, 2])), int(rng.integers(2, 5)), int(rng.integers(2, 6)), 2, 2
    else:
        b, h, hkv = 2, 4, int(rng.choice([1, 2, 4]))
        n, m, d, dv = int(rng.integers(5, 13)), int(rng.integers(5, 15)), 4, 3
    q = rng.standard_normal((b, h, n, d))
    k = rng.standard_normal((b, hkv, m, d))
    v = rng.standard_normal((b, hkv, m, dv))
    cfg = {"is_causal": bool(rng.random() < 0.5), "causal_alignment": "bottom_right" if m >= n else "top_left",
           "scale": float(rng.uniform(0.3, 1.0)), "kv_group_map": str(rng.choice(KV_GROUP_MAPS))}
    if rng.random() < 0.3:
        cfg["softcap"] = float(rng.uniform(1.0, 3.0))
    return q, k, v, cfg


def _sample_flash(rng, size):
    q, k, v, cfg = _sample_base(rng, size)
    cfg.update(block_q=int(rng.integers(1, q.shape[-2] + 1)), block_k=int(rng.integers(1, k.shape[-2] + 1)),
               lse_base=str(rng.choice(["e", "2"])))
    return Sample(inputs={"q": q, "k": k, "v": v}, config=cfg)


def _sample_rs(rng, size):
    q, k, v, cfg = _sample_base(rng, size)
    cfg.update(query_chunk_size=int(rng.integers(1, q.shape[-2] + 1)),
               key_chunk_size=int(rng.integers(1, k.shape[-2] + 1)),
               backward_mode=str(rng.choice(["checkpoint", "flash"])))
    return Sample(inputs={"q": q, "k": k, "v": v}, config=cfg)


def _sample_tree(rng, size):
    q, k, v, cfg = _sample_base(rng, size)
    m = k.shape[-2]
    cuts = np.sort(rng.choice(np.arange(1, m), size=min(int(rng.integers(1, 4)), m - 1), replace=False)) if m > 1 else []
    cfg["chunk_sizes"] = [int(x) for x in np.diff(np.concatenate([[0], cuts, [m]]))]
    return Sample(inputs={"q": q, "k": k, "v": v}, config=cfg)


_SDPA_KEYS = ("attn_mask", "is_causal", "causal_alignment", "scale", "softcap", "kv_group_map")


def _sdpa_cfg(cfg):
    return {k_: v_ for k_, v_ in cfg.items() if k_ in _SDPA_KEYS}


def _exact_reference(q, k, v, **cfg):
    return sdpa_reference(q, k, v, **_sdpa_cfg(cfg))


def _random_case(rng, n=None, m=None):
    n = n or int(rng.integers(3, 12))
    m = m or int(rng.integers(3, 14))
    q = rng.standard_normal((2, 4, n, 3)) * 2
    k = rng.standard_normal((2, 2, m, 3)) * 2
    v = rng.standard_normal((2, 2, m, 2))
    keep = rng.random((n, m)) > 0.2
    keep[2] = False  # a fully masked row
    return q, k, v, keep


def _exactness_check(forward, backward, block_keys):
    """Forward, LSE and backward equal plain SDPA to 1e-12 for random ragged tilings and masks."""
    def check(rng):
        err = 0.0
        for trial in range(6):
            q, k, v, keep = _random_case(rng)
            n, m = q.shape[-2], k.shape[-2]
            cfg = {"is_causal": trial % 2 == 0, "causal_alignment": ("top_left", "bottom_right")[trial % 3 == 0],
                   "attn_mask": keep if trial % 3 != 2 else np.where(keep, 0.3, -np.inf),
                   "softcap": 2.0 if trial == 4 else None, "kv_group_map": KV_GROUP_MAPS[trial % 2]}
            blocks = {block_keys[0]: int(rng.integers(1, n + 1)), block_keys[1]: int(rng.integers(1, m + 1))}
            if block_keys[0] == "chunk_sizes":
                cuts = np.sort(rng.choice(np.arange(1, m), size=min(3, m - 1), replace=False))
                blocks = {"chunk_sizes": list(np.diff(np.concatenate([[0], cuts, [m]])))}
            out, c = forward(q, k, v, **blocks, **cfg)
            ref, rc = sdpa_forward(q, k, v, **cfg)
            lse = c["lse"] / LOG2E if c.get("lse_base") == "2" else c["lse"]
            G = rng.standard_normal(out.shape)
            g, gr = backward(G, c), sdpa_backward(G, rc)
            fin = np.isfinite(rc["lse"])
            assert np.array_equal(fin, np.isfinite(lse)), "fully masked rows differ"
            err = max(err, float(np.abs(out - ref).max()), float(np.abs(lse[fin] - rc["lse"][fin]).max()),
                      *(float(np.abs(g[x] - gr[x]).max()) for x in "qkv"))
        assert err < 1e-12, err
        return err
    return check


def _check_flash_skips_causal_tiles(rng):
    q, k, v, _ = _random_case(rng, n=12, m=12)
    out, c = flash_attention_forward(q, k, v, block_q=3, block_k=4, is_causal=True)
    assert c["skipped_tiles"] > 0
    err = float(np.abs(out - sdpa(q, k, v, is_causal=True)).max())
    assert err < 1e-12, err
    return err


def _check_flash_lse_base(rng):
    q, k, v, _ = _random_case(rng)
    o1, c1 = flash_attention_forward(q, k, v, block_q=2, block_k=3)
    o2, c2 = flash_attention_forward(q, k, v, block_q=2, block_k=3, lse_base="2")
    err = max(float(np.abs(o1 - o2).max()), float(np.abs(c2["lse"] * math.log(2) - c1["lse"]).max()))
    assert err < 1e-12, err
    return err


def _float32_budget(forward, block_kw):
    def check(rng):
        q = rng.standard_normal((2, 4, 37, 16)) * 2
        k = rng.standard_normal((2, 2, 45, 16)) * 2
        v = rng.standard_normal((2, 2, 45, 16))
        ref = sdpa(q, k, v, is_causal=True)
        q32, k32, v32 = (a.astype(np.float32) for a in (q, k, v))
        ke, ve = np.repeat(k32, 2, axis=1), np.repeat(v32, 2, axis=1)
        s = q32 @ np.swapaxes(ke, -1, -2) * np.float32(0.25)
        s = np.where(causal_keep(37, 45), s, -np.inf)
        e = np.exp(s - s.max(-1, keepdims=True))
        naive = (e / e.sum(-1, keepdims=True)) @ ve
        got = forward(q32, k32, v32, is_causal=True, **block_kw)[0]
        assert got.dtype == np.float32
        e_got, e_naive = float(np.abs(got - ref).max()), float(np.abs(naive - ref).max())
        assert e_got <= 2 * e_naive + 1e-7, (e_got, e_naive)
        return e_got
    return check


def _check_rs_backward_modes_agree(rng):
    q, k, v, keep = _random_case(rng)
    cfg = {"query_chunk_size": 3, "key_chunk_size": 4, "attn_mask": keep, "is_causal": True}
    o, c1 = rabe_staats_forward(q, k, v, **cfg)
    _, c2 = rabe_staats_forward(q, k, v, backward_mode="flash", **cfg)
    G = rng.standard_normal(o.shape)
    g1, g2 = rabe_staats_backward(G, c1), rabe_staats_backward(G, c2)
    err = max(float(np.abs(g1[x] - g2[x]).max()) for x in "qkv")
    assert err < 1e-12, err
    return err


def _summary(rng, n=4, c=None, dv=3):
    c = c or int(rng.integers(1, 6))
    return chunk_summary(rng.standard_normal((n, c)) * 3, rng.standard_normal((c, dv)))


def _sum_err(a, b):
    fa, fb = np.isfinite(a[0]), np.isfinite(b[0])
    assert np.array_equal(fa, fb)
    return max(float(np.abs(a[0][fa] - b[0][fa]).max(initial=0.0)), float(np.abs(a[1] - b[1]).max() / max(1.0, np.abs(b[1]).max())),
               float(np.abs(a[2] - b[2]).max()))


def _check_tree_monoid(rng):
    a, b, c = _summary(rng), _summary(rng), _summary(rng)
    ident = (np.full(4, -np.inf), np.zeros(4), np.zeros((4, 3)))
    err = max(_sum_err(merge_summaries(merge_summaries(a, b), c), merge_summaries(a, merge_summaries(b, c))),
              _sum_err(merge_summaries(a, b), merge_summaries(b, a)),
              _sum_err(merge_summaries(a, ident), a), _sum_err(merge_summaries(ident, ident), ident))
    assert err < 1e-12, err
    return err


def _check_tree_equals_flat(rng):
    q, k, v, keep = _random_case(rng, m=13)
    ref = sdpa(q, k, v, attn_mask=keep)
    err = 0.0
    for sizes in ([13], [1] * 13, [5, 8], [2, 3, 1, 7]):
        out, c = tree_attention_forward(q, k, v, chunk_sizes=sizes, attn_mask=keep)
        assert c["rounds"] == math.ceil(math.log2(len(sizes)))
        err = max(err, float(np.abs(out - ref).max()))
    assert err < 1e-12, err
    return err


def _check_energy_identity(rng):
    q = rng.standard_normal((2, 2, 4, 3))
    k = rng.standard_normal((2, 2, 5, 3))
    v = rng.standard_normal((2, 2, 5, 2))
    out = tree_attention_forward(q, k, v, num_chunks=2)[0]
    eps = 1e-6
    num = np.zeros_like(out)
    for i in np.ndindex(out.shape):
        z = np.zeros_like(out)
        z[i] = eps
        num[i] = (attention_energy(q, k, v, z) - attention_energy(q, k, v, -z)) / (2 * eps)
    err = float(np.abs(num - out).max())
    assert err < 1e-7, err
    return err


def _check_rs_chunk_sizes(rng):
    # chunk sizes dividing and not dividing N and M, including 1 and > N
    q, k, v, keep = _random_case(rng, n=8, m=12)
    ref = sdpa(q, k, v, attn_mask=keep)
    err = max(float(np.abs(rabe_staats_forward(q, k, v, query_chunk_size=a, key_chunk_size=b, attn_mask=keep)[0]
                           - ref).max()) for a, b in ((4, 3), (3, 5), (1, 1), (100, 100), (8, 12)))
    assert err < 1e-12, err
    return err


register(
    Mechanism(
        slug="online_softmax_flash_attention", family="1-softmax", tier="T1",
        title="FlashAttention-2 online-softmax forward and backward recurrences (NumPy, tiled)",
        paper="Dao et al., FlashAttention, NeurIPS 2022, arXiv 2205.14135; Dao, FlashAttention-2, arXiv 2307.08691",
        forward=flash_attention_forward, backward=flash_attention_backward, sample=_sample_flash,
        reference=_exact_reference, docs="softmax-attention.md#online-softmax-flash-attention",
        checks={"equals_sdpa_ragged_blocks": _exactness_check(flash_attention_forward, flash_attention_backward,
                                                              ("block_q", "block_k")),
                "skips_causal_tiles": _check_flash_skips_causal_tiles, "lse_base": _check_flash_lse_base,
                "float32_error_budget": _float32_budget(flash_attention_forward, {"block_q": 8, "block_k": 16})},
    ),
    Mechanism(
        slug="memory_efficient_attention_rabe_staats", family="1-softmax", tier="T1",
        title="Rabe-Staats chunked attention with a checkpointed backward",
        paper="Rabe & Staats, Self-attention Does Not Need O(n^2) Memory, arXiv 2112.05682",
        forward=rabe_staats_forward, backward=rabe_staats_backward, sample=_sample_rs,
        reference=_exact_reference, docs="softmax-attention.md#memory-efficient-attention-rabe-staats",
        checks={"equals_sdpa_ragged_chunks": _exactness_check(rabe_staats_forward, rabe_staats_backward,
                                                              ("query_chunk_size", "key_chunk_size")),
                "backward_modes_agree": _check_rs_backward_modes_agree, "chunk_sizes": _check_rs_chunk_sizes,
                "float32_error_budget": _float32_budget(rabe_staats_forward,
                                                        {"query_chunk_size": 8, "key_chunk_size": 16})},
    ),
    Mechanism(
        slug="tree_attention_merge", family="1-softmax", tier="T1",
        title="Tree attention: associative merge of chunk summaries (m, l, o), energy identity",
        paper="Shyam et al. (Zyphra), Tree Attention: Topology-aware Decoding for Long-Context Attention, 2024",
        forward=tree_attention_forward, backward=tree_attention_backward, sample=_sample_tree,
        reference=_exact_reference, docs="softmax-attention.md#tree-attention-merge",
        checks={"equals_sdpa_ragged_chunks": _exactness_check(tree_attention_forward, tree_attention_backward,
                                                              ("chunk_sizes", None)),
                "monoid": _check_tree_monoid, "tree_equals_flat": _check_tree_equals_flat,
                "energy_identity": _check_energy_identity},
    ),
)
