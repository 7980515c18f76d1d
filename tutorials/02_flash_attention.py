# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 2. Flash attention: the online softmax and the log-sum-exp trick
#
# Plain attention materialises the $N\times M$ score matrix; for long sequences that matrix, not
# the arithmetic, is the limit. FlashAttention computes *exactly* the same output while only ever
# holding a tile of scores, by (1) a softmax that is updated one block of keys at a time and
# (2) storing a single number per query — the log-sum-exp — from which the backward recomputes
# the weights. This tutorial builds both ideas up from a single row and then uses
# `refattn.attention.softmax.memory_efficient`, which implements the FlashAttention-2 recurrences in
# NumPy.

# %%
import time
import tracemalloc

import matplotlib.pyplot as plt
import numpy as np

from refattn.attention.softmax import sdpa_backward, sdpa_forward
from refattn.attention.softmax.memory_efficient import (
    chunk_summary,
    flash_attention_backward,
    flash_attention_forward,
    merge_summaries,
    rabe_staats_backward,
    rabe_staats_forward,
)

rng = np.random.default_rng(0)

# %% [markdown]
# ## The log-sum-exp trick
#
# $\operatorname{softmax}(x)_j = e^{x_j}/\sum_k e^{x_k}$ overflows as soon as a logit exceeds
# about 709 in float64 (88 in float32). Softmax is invariant to a shift of all logits, so one
# subtracts the maximum $m = \max_k x_k$:
#
# $$\operatorname{softmax}(x)_j = \frac{e^{x_j - m}}{\sum_k e^{x_k - m}},\qquad
# \mathrm{LSE}(x) = \log\sum_k e^{x_k} = m + \log\sum_k e^{x_k - m}.$$
#
# Every term is now at most 1 and the sum is at least 1.

# %%
x = np.array([1000.0, 999.0, 990.0])
with np.errstate(over="ignore", invalid="ignore"):
    naive = np.exp(x) / np.exp(x).sum()
m = x.max()
stable = np.exp(x - m) / np.exp(x - m).sum()
print("naive :", naive)
print("stable:", stable, " LSE =", m + np.log(np.exp(x - m).sum()))

# %% [markdown]
# ## The online softmax
#
# Suppose the logits of one query arrive in blocks $x^{(1)}, x^{(2)}, \dots$ with their value
# rows $V^{(1)}, V^{(2)},\dots$ We keep three running quantities: the max so far $m$, the sum
# $\ell = \sum e^{x_j - m}$ and the unnormalised output $\tilde o = \sum e^{x_j - m} v_j$. When a
# new block arrives with a larger max $m'$, everything accumulated so far was scaled by
# $e^{-m}$ instead of $e^{-m'}$ and is simply rescaled by $\alpha = e^{m - m'}$:
#
# $$m' = \max(m, \max_j x^{(b)}_j),\quad \alpha = e^{m - m'},\quad
# \ell \leftarrow \alpha\ell + \sum_j e^{x^{(b)}_j - m'},\quad
# \tilde o \leftarrow \alpha\tilde o + \sum_j e^{x^{(b)}_j - m'}\,v^{(b)}_j .$$
#
# At the end $o = \tilde o/\ell$ and $\mathrm{LSE} = m + \log\ell$. Nothing of length $M$ is kept.

# %%
def online_attention_row(x, V, block):
    m, ell, acc = -np.inf, 0.0, np.zeros(V.shape[1])
    for j0 in range(0, len(x), block):
        xb, vb = x[j0:j0 + block], V[j0:j0 + block]
        m_new = max(m, xb.max())
        alpha = np.exp(m - m_new)            # 0 on the first block (m = -inf)
        p = np.exp(xb - m_new)
        ell = alpha * ell + p.sum()
        acc = alpha * acc + p @ vb
        m = m_new
    return acc / ell, m + np.log(ell)


x = 30 * rng.standard_normal(50)
V = rng.standard_normal((50, 4))
p = np.exp(x - x.max())
p /= p.sum()
o_stream, lse_stream = online_attention_row(x, V, block=7)
print("max |online - softmax(x) V| =", np.abs(o_stream - p @ V).max())
print("LSE online - LSE direct     =", lse_stream - (x.max() + np.log(np.exp(x - x.max()).sum())))

# %% [markdown]
# The running state after each block is a *summary* $(m, \ell, o)$ of the keys seen so far, and two
# summaries of disjoint key sets merge with the same rescaling. The merge is associative, which is
# what split-KV ("flash-decoding") and tree attention exploit: key chunks can be summarised in
# parallel and combined in any bracketing. refattn exposes it as `chunk_summary` /
# `merge_summaries`:

# %%
halves = [chunk_summary(x[None, :20], V[:20]), chunk_summary(x[None, 20:], V[20:])]
m_, ell_, o_ = merge_summaries(*halves)
print("merged output error:", np.abs(o_[0] - p @ V).max(), " merged LSE:", (m_ + np.log(ell_))[0])

# %% [markdown]
# ## FlashAttention-2 on whole tensors
#
# `flash_attention_forward` runs the recurrence over tiles of $B_q$ queries × $B_k$ keys, for all
# batch elements and heads at once, and returns the same output as `sdpa_forward` plus the
# log-sum-exp $L$ (shape `(B, H, N)`) in its cache. With a causal mask, tiles entirely above the
# diagonal are skipped.

# %%
B, H, N, d = 2, 4, 300, 32
q, k, v = (rng.standard_normal((B, H, N, d)) for _ in range(3))
ref, ref_cache = sdpa_forward(q, k, v, is_causal=True)
out, cache = flash_attention_forward(q, k, v, is_causal=True, block_q=64, block_k=64)
print("max |flash - sdpa|  =", np.abs(out - ref).max())
print("max |L_flash - L|   =", np.abs(cache["lse"] - ref_cache["lse"]).max())
n_tiles = int(np.ceil(N / 64)) ** 2
print(f"causal tiles skipped: {cache['skipped_tiles']} of {n_tiles}")

# %% [markdown]
# ## The backward from the log-sum-exp
#
# The softmax backward of [tutorial 1](01_softmax_attention_backward.ipynb) needs $P$. Flash
# attention does not store it: it recomputes each tile from the stored $L_i$,
#
# $$P_{ij} = e^{S_{ij} - L_i},$$
#
# which is exact (no running max needed any more — $L_i$ is already the final normaliser), and
# uses $D_i = dO_i\cdot O_i$ instead of the row sum over $P\odot dP$:
#
# $$dV_J \mathrel{+}= P_{IJ}^\top dO_I,\quad dS_{IJ} = P_{IJ}\odot(dO_I V_J^\top - D_I),\quad
# dQ_I \mathrel{+}= s\,dS_{IJ}K_J,\quad dK_J \mathrel{+}= s\,dS_{IJ}^\top Q_I.$$
#
# The result equals the reference backward to round-off:

# %%
dout = rng.standard_normal(out.shape)
g_flash = flash_attention_backward(dout, cache)
g_ref = sdpa_backward(dout, ref_cache)
for name in "qkv":
    print(f"d{name}: max |flash - sdpa| = {np.abs(g_flash[name] - g_ref[name]).max():.2e}")

# %% [markdown]
# FlashAttention's Triton kernels work in base 2 (`exp2` is one instruction): scores are multiplied
# by $\log_2 e$ and the stored statistic is $L/\ln 2$. The output is unchanged —
# `lse_base="2"` reproduces that convention (useful when comparing against a Triton kernel's
# saved LSE).

# %%
out2, cache2 = flash_attention_forward(q, k, v, is_causal=True, lse_base="2")
print("outputs equal:", np.allclose(out2, ref, rtol=0, atol=1e-12),
      " L2 * ln2 == L:", np.allclose(cache2["lse"] * np.log(2), ref_cache["lse"]))

# %% [markdown]
# ## Memory versus sequence length
#
# NumPy reports its allocations to Python's `tracemalloc`, so we can measure the peak memory of
# forward + backward for one head with $d = 32$. The reference keeps $P$ ($N^2$ floats) in its
# cache; flash attention keeps $O$ and $L$ and a few tiles; Rabe–Staats chunking (the other exact
# memory-efficient form, with a checkpointed backward) keeps chunk-sized buffers.

# %%
def peak_mib(fwd, bwd, q, k, v, **kw):
    tracemalloc.start()
    out, cache = fwd(q, k, v, **kw)
    bwd(np.ones_like(out), cache)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak / 2**20


sizes = [256, 512, 1024, 2048]
rows = {"reference sdpa": [], "flash (64x128 tiles)": [], "Rabe-Staats (128/256 chunks)": []}
t0 = time.perf_counter()
for n in sizes:
    q1, k1, v1 = (rng.standard_normal((1, 1, n, 32)) for _ in range(3))
    rows["reference sdpa"].append(peak_mib(sdpa_forward, sdpa_backward, q1, k1, v1))
    rows["flash (64x128 tiles)"].append(
        peak_mib(flash_attention_forward, flash_attention_backward, q1, k1, v1, block_q=64, block_k=128))
    rows["Rabe-Staats (128/256 chunks)"].append(
        peak_mib(rabe_staats_forward, rabe_staats_backward, q1, k1, v1, query_chunk_size=128, key_chunk_size=256))
print(f"measured in {time.perf_counter() - t0:.1f} s")
print(f"{'N':>6}" + "".join(f"{name:>30}" for name in rows))
for i, n in enumerate(sizes):
    print(f"{n:>6}" + "".join(f"{rows[name][i]:>26.2f} MiB" for name in rows))

fig, ax = plt.subplots(figsize=(5, 3.4))
for name, vals in rows.items():
    ax.loglog(sizes, vals, "o-", label=name)
ax.loglog(sizes, [8 * n * n / 2**20 for n in sizes], "k:", label=r"one $N\times N$ float64 matrix")
ax.set(xlabel="sequence length N", ylabel="peak traced memory (MiB)", title="forward + backward, one head, d = 32")
ax.legend(fontsize=8)
ax.grid(True, which="both", alpha=0.3)
plt.show()

# %% [markdown]
# The reference grows as $N^2$ (a few $N\times N$ matrices live at once in the backward); the
# tiled forms grow linearly, with a constant set by the tile sizes.
#
# ## Summary
#
# * Subtract the max before exponentiating; keep $L = m + \log\ell$.
# * Online softmax: rescale the running sum and output by $e^{m - m'}$ whenever the max grows;
#   summaries of key chunks merge associatively.
# * The backward needs only $O$, $L$ and $D = \mathrm{rowsum}(dO\odot O)$, recomputing
#   $P = e^{S - L}$ tile by tile.
# * The fused Numba version of this loop is [tutorial 6](06_kernels.ipynb).
