r"""Reformer LSH self-attention: angular LSH with random rotations, sort by bucket, chunked
attention to the own and previous chunk, shared QK with self-masking, several hash rounds.

Kitaev, Kaiser, Levskaya, "Reformer: The Efficient Transformer", ICLR 2020, arXiv 2001.04451.
Official code: google/trax ``trax/layers/research/efficient_attention.py@7c189c2c3a37851df7fc641b322a99bbe9f8aa10``
(``LSHSelfAttention.forward_unbatched`` and ``hash_vectors``; ``hash_vecs``, ``attend``,
``look_adjacent``, ``mask_self_attention``, ``length_normalized``).

Forward (per batch element and head)
------------------------------------
Shared query/key $x_i = (XW_q)_i$ and values $v_i = (XW_v)_i$. **Hashing** (angular LSH): with a
random rotation $R^{(r)}\in\mathbb R^{d\times b/2}$ per round $r$ (standard normal entries),
$h_r(x) = \arg\max([xR^{(r)};\ -xR^{(r)}])\in\{0..b-1\}$. **Sorting**: the $n_rN$ (round,
position) slots are sorted by the key $N(rb + h_r(x_i)) + i$ (round, then bucket, then position).
**Chunking**: the sorted sequence is cut into chunks of $m$ = ``chunk_len`` slots; a query slot
attends to the key slots of its chunk and of the ``n_chunks_before`` previous (and
``n_chunks_after`` next) chunks, cyclically (trax's ``look_adjacent`` rolls the chunk axis, so the
first chunk sees the last one). **Scores**: keys are the length-normalised queries,
$\hat k_j = x_j/\sqrt{\mathrm{mean}(x_j^2)+\epsilon}/\sqrt d\ (\approx x_j/\|x_j\|)$, and
$s_{ij} = x_i\cdot\hat k_j$, minus $10^5$ where the key is the query's own position (any round;
"self-attention excluded unless no other target"), $-\infty$ for $j > i$ when ``causal``. With
$P$ the softmax of a slot's row and $z$ its log-sum-exp, **the rounds combine** as
$o_i = \sum_r e^{z^{(r)}_i - z_i}o^{(r)}_i$, $z_i = \mathrm{logsumexp}_r z^{(r)}_i$.

Explicit form. The combination is one softmax over the union of all (round, key slot) pairs of
query $i$, with multiplicities: with $c_{ij}$ the number of times position $j$ appears in those
rows (adjacent chunks and rounds can repeat a key),

$$o_i = \frac{\sum_j c_{ij}\,e^{s_{ij}}v_j}{\sum_j c_{ij}\,e^{s_{ij}}},$$

dense attention with the additive bias $\log c_{ij}$ (the record's reference builds $c$ with an
explicit Python sort). trax does not correct the multiplicities; the paper's count correction
(subtract $\log c_{ij}$, so that every key counts once) is ``dedup=True``. With one chunk and one
round the mechanism is dense shared-QK attention with self-masking.

Backward (hashing, sorting and chunking held fixed)
---------------------------------------------------
Buckets, the sort and the chunk windows are piecewise constant (a bucket changes where two
rotated coordinates tie; the sampler keeps them apart). With $w_r = e^{z^{(r)} - z}$ and $g_i$ the
upstream gradient: $do^{(r)}_i = w_rg_i$ and, through the round softmax,
$dz^{(r)}_i = w_r(g_i\cdot o^{(r)}_i - g_i\cdot o_i)$. Each chunk is softmax attention with an extra
gradient on its log-sum-exp ($\partial z/\partial s_{ij} = P_{ij}$): the attention core VJP with
``dlse`` (`refattn.attention.softmax.core`). The adjacent-chunk copies are rolled back and summed,
$\hat k$ goes through the RMS-normalisation VJP (`refattn.nn.norms`), and the gathers of the sort
scatter-add back to the positions (every position has $n_r$ slots). The layer adds the projections:
$dW_q = X^\top dx$, $dW_v = X^\top dv$, $dW_o = o^\top g$ per head, $dX$ summed over heads.

Conventions
-----------
Weights as trax stores them (JAX, already ``(in, out)``), stacked over heads: ``w_q (H, C, d_qk)``,
``w_v (H, C, d_v)``, ``w_o (H, d_v, C)``, optional ``b_q (H, d_qk)`` and ``b_v (H, d_v)``
(``bias=True``); the output sums the heads' $o_hW_{o,h}$. ``rotations (H, d_qk, n_hashes, b/2)``
(or with a leading batch axis: trax draws one per example and head from its state RNG) fixes the
hash functions; without it they are drawn from ``numpy.random.default_rng(seed)``, shared by the
batch. ``n_buckets=None`` is trax's $2\max(1, N/m)$ (trax factorises it above 128; here that raises).
Not implemented: trax's padding mask (``masked=True``), dropout and incremental decoding.

Agreement with upstream: trax needs JAX (not installed), so its ``hash_vecs``, ``look_adjacent``,
``mask_self_attention``, ``attend`` and ``forward_unbatched`` were transcribed to PyTorch with the
same rotations: output 5.5e-12, gradients <= 2.3e-12 relative over 8 configurations; the gap is the
float64 resolution of $s - 10^5$ (with self-mask value 0 in both: 1.8e-15).
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_int, check_params, check_positive, compute_dtype
from ...nn.norms import normalize_backward, normalize_forward
from ...registry import Mechanism, Sample, register
from ..softmax.core import attention_core_backward, attention_core_forward
from ._samples import draw_until, fd_max_rel, topk_margin
from .core import gather_rows, scatter_add_rows

__all__ = ["lsh_random_rotations", "lsh_hash", "lsh_attention_core_forward", "lsh_attention_core_backward",
           "reformer_lsh_attention_forward", "reformer_lsh_attention_backward", "reformer_lsh_attention"]


def lsh_random_rotations(d: int, n_hashes: int, n_buckets: int, *, n_heads: int | None = None, seed: int = 0):
    """Standard-normal rotations ``(d, n_hashes, n_buckets // 2)`` (``(n_heads, ...)`` when given)
    from ``numpy.random.default_rng(seed)``."""
    shape = (d, n_hashes, n_buckets // 2)
    return np.random.default_rng(seed).standard_normal(shape if n_heads is None else (n_heads,) + shape)


def lsh_hash(x: np.ndarray, rotations: np.ndarray) -> np.ndarray:
    r"""Angular LSH buckets ``(..., n_hashes, N)`` of ``x (..., N, d)`` with ``rotations
    (..., d, n_hashes, b/2)`` (leading axes broadcast): $\arg\max([xR;\,-xR])$. Unvalidated."""
    rot = np.einsum("...nd,...drb->...rnb", x, rotations)
    return np.argmax(np.concatenate([rot, -rot], axis=-1), axis=-1)


def _adjacent(x, offsets):
    """trax ``look_adjacent`` on the chunk axis -3: concatenate the chunks ``c + o`` (cyclic) along -2."""
    return np.concatenate([np.roll(x, -o, axis=-3) for o in offsets], axis=-2)


def _adjacent_vjp(g, offsets, m):
    return sum(np.roll(g[..., i * m:(i + 1) * m, :], o, axis=-3) for i, o in enumerate(offsets))


def lsh_attention_core_forward(qk, v, buckets, *, chunk_len: int, n_chunks_before: int = 1,
                               n_chunks_after: int = 0, causal: bool = False, self_mask_value: float = 1e5,
                               dedup: bool = False, eps: float = 1e-6):
    r"""LSH attention of shared ``qk (..., N, d)`` and ``v (..., N, d_v)`` given the buckets
    ``(..., n_hashes, N)`` (sort, chunk, attend, combine the rounds; module docstring).
    Unvalidated; ``n_hashes * N`` must be a multiple of ``chunk_len``. Returns ``(out, cache)``."""
    n, d = qk.shape[-2:]
    n_r = buckets.shape[-2]
    total, m = n_r * n, chunk_len
    nc = total // m
    lead = qk.shape[:-2]
    nb = int(buckets.max()) + 1
    rounds = np.arange(n_r)[:, None]
    keys = (n * (rounds * nb + buckets) + np.arange(n)).reshape(buckets.shape[:-2] + (total,))
    keys = np.broadcast_to(keys, lead + (total,))
    sticker = np.argsort(keys, axis=-1, kind="stable")
    st = sticker % n
    sq = gather_rows(qk, st)
    sv = gather_rows(v, st)
    xhat, stats = normalize_forward(sq, (sq.ndim - 1,), eps, center=False)
    rd = float(np.sqrt(d))
    offsets = tuple(range(-n_chunks_before, n_chunks_after + 1))
    chunk = lead + (nc, m)
    pos_q = st.reshape(chunk)
    pos_k = _adjacent(pos_q[..., None], offsets)[..., 0]
    bias = np.where(pos_q[..., :, None] == pos_k[..., None, :], -self_mask_value, 0.0).astype(qk.dtype)
    if causal:
        bias = np.where(pos_q[..., :, None] < pos_k[..., None, :], -np.inf, bias)
    if dedup:
        chunk_of = (np.argsort(sticker, axis=-1) // m).reshape(lead + (n_r, n))     # chunk of (round, position)
        cq = np.take_along_axis(chunk_of, pos_q.reshape(lead + (1, nc * m)), axis=-1).reshape(lead + (n_r, nc, m))
        ck = np.take_along_axis(chunk_of, pos_k.reshape(lead + (1, -1)), axis=-1).reshape(lead + (n_r,) + pos_k.shape[-2:])
        # every round r of the query against every round r' of the key (the first chunk's previous
        # chunk is the last chunk of the last round): (..., R, R', nc, m, L)
        diff = (ck[..., None, :, :, None, :] - cq[..., :, None, :, :, None]) % nc
        count = sum(np.sum(diff == o % nc, axis=(-4, -5)) for o in offsets)
        bias = bias - np.log(count)
    so, core = attention_core_forward(sq.reshape(chunk + (d,)), _adjacent((xhat / rd).reshape(chunk + (d,)), offsets),
                                      _adjacent(sv.reshape(chunk + (v.shape[-1],)), offsets), attn_mask=bias, scale=1.0)
    undo = np.argsort(sticker, axis=-1)
    o_r = gather_rows(so.reshape(lead + (total, v.shape[-1])), undo).reshape(lead + (n_r, n, v.shape[-1]))
    lse_r = np.take_along_axis(core["lse"].reshape(lead + (total,)), undo, axis=-1).reshape(lead + (n_r, n))
    zmax = np.max(lse_r, axis=-2, keepdims=True)
    w = np.exp(lse_r - zmax)
    w = w / np.sum(w, axis=-2, keepdims=True)
    out = np.sum(w[..., None] * o_r, axis=-3)
    cache = {"core": core, "sticker": sticker, "st": st, "xhat": xhat, "stats": stats, "rd": rd, "offsets": offsets,
             "o_r": o_r, "w": w, "out": out, "n": n, "m": m}
    return out, cache


def lsh_attention_core_backward(g, cache):
    """Gradients ``(dqk, dv)`` of `lsh_attention_core_forward` for the upstream gradient ``g``
    (hashing, sort and chunks held fixed; module docstring). Unvalidated."""
    w, o_r, core = cache["w"], cache["o_r"], cache["core"]
    n, m, offsets, sticker = cache["n"], cache["m"], cache["offsets"], cache["sticker"]
    do_r = w[..., None] * g[..., None, :, :]
    dwr = np.sum(g[..., None, :, :] * o_r, axis=-1)
    dlse = w * (dwr - np.sum(w * dwr, axis=-2, keepdims=True))
    lead, total = sticker.shape[:-1], sticker.shape[-1]
    dv_dim = o_r.shape[-1]
    dso = gather_rows(do_r.reshape(lead + (total, dv_dim)), sticker)
    dslse = np.take_along_axis(dlse.reshape(lead + (total,)), sticker, axis=-1)
    chunk = lead + (total // m, m)
    gr = attention_core_backward(dso.reshape(chunk + (dv_dim,)), core, dlse=dslse.reshape(chunk))
    d = cache["xhat"].shape[-1]
    dk = _adjacent_vjp(gr["k"], offsets, m).reshape(lead + (total, d))
    dsq = gr["q"].reshape(lead + (total, d)) + normalize_backward(dk / cache["rd"], cache["xhat"], cache["stats"])
    dsv = _adjacent_vjp(gr["v"], offsets, m).reshape(lead + (total, dv_dim))
    return scatter_add_rows(dsq, cache["st"], n), scatter_add_rows(dsv, cache["st"], n)


def reformer_lsh_attention_forward(x, params, *, chunk_len: int, n_hashes: int = 1, n_buckets: int | None = None,
                                   causal: bool = False, n_chunks_before: int = 1, n_chunks_after: int = 0,
                                   rotations=None, seed: int = 0, dedup: bool = False,
                                   self_mask_value: float = 1e5, eps: float = 1e-6):
    r"""The Reformer ``LSHSelfAttention`` layer on ``x (B, N, C)``.

    Parameters
    ----------
    x : (B, N, C)
    params : dict
        ``w_q (H, C, d_qk)``, ``w_v (H, C, d_v)``, ``w_o (H, d_v, C)``; optional ``b_q (H, d_qk)``,
        ``b_v (H, d_v)``.
    chunk_len : int
        Slots per chunk $m$; ``n_hashes * N`` must be a multiple of it.
    n_hashes : int
        Hash rounds $n_r$.
    n_buckets : int (even), optional
        Buckets per round $b$; default $2\max(1, N // m)$.
    causal : bool
        Mask keys after the query.
    n_chunks_before, n_chunks_after : int
        Adjacent chunks attended (trax defaults 1 and 0).
    rotations : array (H, d_qk, n_hashes, b/2) or (B, H, d_qk, n_hashes, b/2), optional
        The random rotations; default drawn from ``numpy.random.default_rng(seed)``.
    dedup : bool
        The paper's duplicate-count correction (trax: off).
    self_mask_value : float
        Subtracted from a query's score with its own position (trax: 1e5).
    eps : float
        ``length_normalized`` epsilon (1e-6).

    Returns
    -------
    out : (B, N, C), cache
    """
    x = as_float(x, "x", ndim=3)
    b, n, c = x.shape
    if not isinstance(params, dict) or np.ndim(params.get("w_q")) != 3 or np.ndim(params.get("w_v")) != 3:
        raise ValueError("params must hold w_q (H, C, d_qk), w_v (H, C, d_v) and w_o (H, d_v, C)")
    h, _, dqk = np.shape(params["w_q"])
    dv = np.shape(params["w_v"])[-1]
    p = check_params(params, {"w_q": (h, c, dqk), "w_v": (h, c, dv), "w_o": (h, dv, c), "b_q": (h, dqk),
                              "b_v": (h, dv)}, optional=("b_q", "b_v"), where="reformer_lsh_attention")
    chunk_len = check_int(chunk_len, "chunk_len", minimum=1)
    n_hashes = check_int(n_hashes, "n_hashes", minimum=1)
    n_chunks_before = check_int(n_chunks_before, "n_chunks_before", minimum=0)
    n_chunks_after = check_int(n_chunks_after, "n_chunks_after", minimum=0)
    seed = check_int(seed, "seed", minimum=0)
    if (n_hashes * n) % chunk_len:
        raise ValueError(f"n_hashes * N = {n_hashes * n} must be a multiple of chunk_len={chunk_len}")
    n_buckets = 2 * max(1, n // chunk_len) if n_buckets is None else check_int(n_buckets, "n_buckets", minimum=2)
    if n_buckets % 2 or n_buckets > 128:
        raise ValueError(f"n_buckets must be even and at most 128 (factorised hashing is not implemented); got "
                         f"{n_buckets}")
    for name, flag in (("causal", causal), ("dedup", dedup)):
        if not isinstance(flag, (bool, np.bool_)):
            raise TypeError(f"{name} must be a bool; got {type(flag).__name__}")
    self_mask_value = check_positive(self_mask_value, "self_mask_value", allow_zero=True)
    eps = check_positive(eps, "eps")
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    shape = (h, dqk, n_hashes, n_buckets // 2)
    if rotations is None:
        rot = lsh_random_rotations(dqk, n_hashes, n_buckets, n_heads=h, seed=seed)
    else:
        rot = as_float(rotations, "rotations")
        if rot.shape not in (shape, (b,) + shape):
            raise ValueError(f"rotations must have shape (H, d_qk, n_hashes, n_buckets/2) = {shape} (or with a "
                             f"leading batch axis of {b}); got {rot.shape}")
    qk = np.einsum("bnc,hcd->bhnd", x, p["w_q"]) + (p["b_q"][:, None, :] if "b_q" in p else 0.0)
    v = np.einsum("bnc,hcd->bhnd", x, p["w_v"]) + (p["b_v"][:, None, :] if "b_v" in p else 0.0)
    buckets = lsh_hash(qk, rot.astype(dt, copy=False))
    o, core = lsh_attention_core_forward(qk, v, buckets, chunk_len=chunk_len, n_chunks_before=n_chunks_before,
                                         n_chunks_after=n_chunks_after, causal=bool(causal), dedup=bool(dedup),
                                         self_mask_value=self_mask_value, eps=eps)
    out = np.einsum("bhne,hec->bnc", o, p["w_o"])
    cache = {"x": x, "p": p, "o": o, "core": core, "buckets": buckets, "out_shape": out.shape}
    return out, cache


def reformer_lsh_attention_backward(dout, cache):
    """Gradients ``{"x", "w_q", "w_v", "w_o"[, "b_q", "b_v"]}`` of `reformer_lsh_attention_forward`
    (hashing, sort and chunks held fixed)."""
    x, p, o = cache["x"], cache["p"], cache["o"]
    g = as_dout(dout, cache["out_shape"], x.dtype)
    grads = {"w_o": np.einsum("bhne,bnc->hec", o, g)}
    dqk, dv = lsh_attention_core_backward(np.einsum("bnc,hec->bhne", g, p["w_o"]), cache["core"])
    grads["w_q"] = np.einsum("bnc,bhnd->hcd", x, dqk)
    grads["w_v"] = np.einsum("bnc,bhnd->hcd", x, dv)
    if "b_q" in p:
        grads["b_q"] = np.sum(dqk, axis=(0, 2))
    if "b_v" in p:
        grads["b_v"] = np.sum(dv, axis=(0, 2))
    grads["x"] = np.einsum("bhnd,hcd->bnc", dqk, p["w_q"]) + np.einsum("bhnd,hcd->bnc", dv, p["w_v"])
    return grads


def reformer_lsh_attention(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of `reformer_lsh_attention_forward`."""
    return reformer_lsh_attention_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _brute_hash(x, rot):
    """Buckets by an explicit argmax over [xR, -xR], one vector and round at a time."""
    n_r = rot.shape[-2]
    out = np.zeros((n_r, x.shape[0]), int)
    for r in range(n_r):
        for i, xi in enumerate(x):
            proj = [float(xi @ rot[:, r, t]) for t in range(rot.shape[-1])]
            vals = proj + [-z for z in proj]
            out[r, i] = max(range(len(vals)), key=lambda t: vals[t])
    return out


def _reference(x, params, *, chunk_len, n_hashes=1, n_buckets=None, causal=False, n_chunks_before=1,
               n_chunks_after=0, rotations=None, seed=0, dedup=False, self_mask_value=1e5, eps=1e-6):
    """The explicit form: per (batch, head) a Python sort of the (round, bucket, position) slots, the
    multiplicities c_ij of every key in every query's rows, dense softmax with the bias log c_ij."""
    b, n, _ = x.shape
    h, _, dqk = params["w_q"].shape
    n_buckets = 2 * max(1, n // chunk_len) if n_buckets is None else n_buckets
    rot = lsh_random_rotations(dqk, n_hashes, n_buckets, n_heads=h, seed=seed) if rotations is None else rotations
    out = np.zeros(x.shape)
    for bi in range(b):
        for hi in range(h):
            qk = x[bi] @ params["w_q"][hi] + params.get("b_q", np.zeros((h, dqk)))[hi]
            v = x[bi] @ params["w_v"][hi] + params.get("b_v", np.zeros((h, params["w_v"].shape[-1])))[hi]
            bk = _brute_hash(qk, rot[hi] if rot.ndim == 4 else rot[bi, hi])
            slots = sorted(((r, i) for r in range(n_hashes) for i in range(n)), key=lambda t: (t[0], bk[t[0], t[1]], t[1]))
            nc = len(slots) // chunk_len
            chunk_of = {s: t // chunk_len for t, s in enumerate(slots)}
            count = np.zeros((n, n))
            for (_, i), ci in chunk_of.items():
                for o in range(-n_chunks_before, n_chunks_after + 1):
                    cc = (ci + o) % nc
                    for _, j in slots[cc * chunk_len:(cc + 1) * chunk_len]:
                        count[i, j] += 1
            khat = qk / np.sqrt(np.mean(qk ** 2, -1, keepdims=True) + eps) / np.sqrt(dqk)
            o_h = np.zeros((n, v.shape[-1]))
            for i in range(n):
                js = [j for j in range(n) if count[i, j] > 0 and not (causal and j > i)]
                sc = np.array([qk[i] @ khat[j] - (self_mask_value if j == i else 0.0) for j in js])
                c = np.array([1.0 if dedup else count[i, j] for j in js])
                wgt = c * np.exp(sc - sc.max())
                o_h[i] = (wgt / wgt.sum()) @ v[js]
            out[bi] += o_h @ params["w_o"][hi]
    return out


def _draw(rng, size, causal=None, dedup=None, n_hashes=2, chunk_len=None, n_chunks_after=0, bias=False):
    c, h, dqk, dv, n = (4, 2, 3, 2, 8) if size == "tiny" else (6, 2, 4, 3, 16)
    chunk_len = (2 if size == "tiny" else 4) if chunk_len is None else chunk_len
    n_buckets = 4
    causal = bool(rng.integers(0, 2)) if causal is None else causal
    dedup = bool(rng.integers(0, 2)) if dedup is None else dedup
    params = {"w_q": rng.standard_normal((h, c, dqk)) / np.sqrt(c), "w_v": rng.standard_normal((h, c, dv)) / np.sqrt(c),
              "w_o": rng.standard_normal((h, dv, c)) / np.sqrt(dv)}
    if bias:
        params.update(b_q=0.2 * rng.standard_normal((h, dqk)), b_v=0.2 * rng.standard_normal((h, dv)))
    rot = rng.standard_normal((h, dqk, n_hashes, n_buckets // 2))

    def margin(x):
        qk = np.einsum("bnc,hcd->bhnd", x, params["w_q"]) + (params["b_q"][:, None] if bias else 0.0)
        r = np.einsum("...nd,...drb->...rnb", qk, rot)
        return topk_margin(np.concatenate([r, -r], axis=-1), 1)

    x = draw_until(rng, lambda r: r.standard_normal((2, n, c)), margin, 0.02)
    return Sample(inputs={"x": x}, params=params,
                  config={"chunk_len": chunk_len, "n_hashes": n_hashes, "n_buckets": n_buckets, "causal": causal,
                          "rotations": rot, "dedup": dedup, "n_chunks_after": n_chunks_after})


def _sample(rng, size):
    return _draw(rng, size)


def _check_one_chunk_is_dense(rng):
    """One round, one chunk: dense shared-QK attention with self-masking (causal or not)."""
    qk, v = rng.standard_normal((2, 2, 6, 3)), rng.standard_normal((2, 2, 6, 2))
    buckets = rng.integers(0, 4, (2, 2, 1, 6))
    khat = qk / np.linalg.norm(qk, axis=-1, keepdims=True)
    err = 0.0
    for causal in (False, True):
        for dedup in (False, True):
            out = lsh_attention_core_forward(qk, v, buckets, chunk_len=6, causal=causal, dedup=dedup, eps=0.0)[0]
            s = qk @ np.swapaxes(khat, -1, -2) - 1e5 * np.eye(6)
            if causal:
                s = np.where(np.tri(6, dtype=bool), s, -np.inf)
            e = np.exp(s - s.max(-1, keepdims=True))
            err = max(err, float(np.max(np.abs(out - (e / e.sum(-1, keepdims=True)) @ v))))
    assert err < 1e-12, f"one chunk differs from dense shared-QK attention by {err}"
    return err


def _check_hash_brute_force(rng):
    x = rng.standard_normal((2, 3, 9, 4))
    rot = rng.standard_normal((3, 4, 2, 3))
    bk = lsh_hash(x, rot)
    for bi in range(2):
        for hi in range(3):
            assert (bk[bi, hi] == _brute_hash(x[bi, hi], rot[hi])).all(), "LSH buckets differ from the brute force"
    return 0.0


def _check_gradcheck_options(rng):
    """Dedup, the next chunk too, one round and biases."""
    s = _draw(rng, "tiny", causal=False, dedup=True, n_hashes=1, chunk_len=2, n_chunks_after=1, bias=True)
    return fd_max_rel(reformer_lsh_attention_forward, reformer_lsh_attention_backward, s)


register(
    Mechanism(
        slug="reformer_lsh_attention", family="4-linear-kernel-sparse", tier="T2",
        title="Reformer LSH attention",
        paper="Kitaev, Kaiser, Levskaya, 'Reformer: The Efficient Transformer', ICLR 2020, arXiv 2001.04451",
        forward=reformer_lsh_attention_forward, backward=reformer_lsh_attention_backward, sample=_sample,
        reference=_reference,
        checks={"one_chunk_equals_dense_self_masked": _check_one_chunk_is_dense,
                "hash_equals_brute_force_argmax": _check_hash_brute_force,
                "gradcheck_dedup_next_chunk_biases": _check_gradcheck_options},
        docs="linear/sparse-attention.md#reformer-lsh-attention",
    ),
)
