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
# # 5. Linear and kernel attention: accuracy versus cost
#
# Softmax attention costs $O(N M d)$ time and, without the tricks of
# [tutorial 2](02_flash_attention.ipynb), $O(NM)$ memory. Linear attention replaces the
# exponential kernel $e^{q\cdot k}$ by an inner product of non-negative features,
# $\phi(q)\cdot\phi(k)$, and then uses associativity:
#
# $$O = \frac{\big(\Phi_Q\Phi_K^\top\big)V}{\big(\Phi_Q\Phi_K^\top\big)\mathbf 1}
#     = \frac{\Phi_Q\,\big(\Phi_K^\top V\big)}{\Phi_Q\,\big(\Phi_K^\top\mathbf 1\big)},$$
#
# where $\Phi_K^\top V$ is only $r\times d_v$ for $r$ features: $O(N r d_v)$ time, no
# $N\times M$ matrix. The mechanisms differ in $\phi$:
#
# * **Katharopoulos et al.** (linear transformer): $\phi(x) = \mathrm{elu}(x) + 1$, $r = d$. A
#   *different* attention, not an approximation of softmax.
# * **Performer (FAVOR+)**: positive random features with
#   $\mathbb E[\phi(q)\cdot\phi(k)] = e^{q\cdot k/\sqrt d}$, so it *estimates* softmax attention,
#   with an error that shrinks as the number of features $r$ grows.
#
# We measure both sides of the trade: how far each is from softmax attention, and how the run time
# grows with $N$. Modules: `refattn.attention.linear.katharopoulos` and
# `refattn.attention.linear.performer` (both re-exported by the `refattn.attention.linear` package).

# %%
import os

# One BLAS thread: the timings below then compare algorithms, not how well several BLAS threads
# cope with a busy shared machine (set before NumPy is imported).
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import time

import matplotlib.pyplot as plt
import numpy as np

from refattn.attention.linear import (
    feature_map_forward,
    linear_attention,
    linear_attention_explicit,
    linear_attention_forward,
    performer,
    performer_projection_matrix,
)
from refattn.attention.softmax import sdpa

rng = np.random.default_rng(0)


def rel_err(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))

# %% [markdown]
# ## The linear form is exact for its own kernel
#
# `linear_attention` uses the associative form; `linear_attention_explicit` builds
# $A = \Phi_Q\Phi_K^\top$ and normalises its rows. They agree to round-off, also in the causal
# case, where the sums over $j\le i$ become a prefix scan over a $d\times d_v$ state — an RNN.

# %%
B, H, N, d = 2, 2, 128, 16
q, k, v = (rng.standard_normal((B, H, N, d)) for _ in range(3))
for causal in (False, True):
    fast = linear_attention(q, k, v, causal=causal)
    slow = linear_attention_explicit(q, k, v, causal=causal)
    print(f"causal={causal!s:5}  max |linear - explicit| = {np.abs(fast - slow).max():.2e}")

# %% [markdown]
# ## What the two kernels attend to
#
# The elu+1 kernel is much flatter than the softmax kernel: it is a polynomial-like similarity,
# so each query spreads its weight over many keys. Here are the normalised weight rows of the
# first 32 queries of one head.

# %%
qs, ks = q[0, 0, :32], k[0, 0, :32]
soft_w = np.exp(qs @ ks.T / np.sqrt(d))
soft_w /= soft_w.sum(1, keepdims=True)
lin_w = feature_map_forward(qs, "elu_plus_one") @ feature_map_forward(ks, "elu_plus_one").T
lin_w /= lin_w.sum(1, keepdims=True)
fig, axes = plt.subplots(1, 2, figsize=(7, 3.2))
for ax, w, title in zip(axes, (soft_w, lin_w), ("softmax $e^{q\\cdot k/\\sqrt{d}}$", "linear $\\phi(q)\\cdot\\phi(k)$, elu+1")):
    im = ax.imshow(w, cmap="magma", vmin=0, vmax=soft_w.max())
    ax.set(title=title, xlabel="key", ylabel="query")
fig.colorbar(im, ax=axes, fraction=0.025)
plt.show()
out_soft = sdpa(q, k, v)
print("relative error of elu+1 linear attention w.r.t. softmax attention:",
      f"{rel_err(linear_attention(q, k, v), out_soft):.3f}")

# %% [markdown]
# ## Performer: an estimate of softmax attention
#
# FAVOR+ draws $r$ random directions $w_l$ (blocks of orthogonal rows, the Performer default)
# and uses
#
# $$\phi(x)_l = \tfrac{1}{\sqrt r}\exp\!\big(w_l\cdot\tilde x - \tfrac12\|\tilde x\|^2\big),
# \qquad \tilde x = d^{-1/4}x,$$
#
# for which $\mathbb E_w[\phi(q)\cdot\phi(k)] = e^{q\cdot k/\sqrt d}$. The ratio of two
# estimates is not unbiased, but its error falls roughly as $1/\sqrt r$ — with a constant that
# grows like $e^{\|\tilde q + \tilde k\|^2}$, so the estimator is only useful for moderate
# logits. We average the relative error over a few projection seeds, for orthogonal and for
# i.i.d. Gaussian features, at two input scales (`feature_eps=0`: the exact estimator without the
# numerical stabiliser).

# %%
features = [4, 16, 64, 256, 1024, 4096]
seeds = range(4)


def performer_error(scale, orthogonal):
    qs, ks = scale * q, scale * k
    exact = sdpa(qs, ks, v)
    return [np.mean([rel_err(performer(qs, ks, v, feature_eps=0.0,
                                       projection=performer_projection_matrix(r, d, seed=s, orthogonal=orthogonal)),
                             exact) for s in seeds])
            for r in features]


t0 = time.perf_counter()
curves = {"orthogonal, q, k scaled by 0.5": performer_error(0.5, True),
          "i.i.d., q, k scaled by 0.5": performer_error(0.5, False),
          "orthogonal, unscaled q, k": performer_error(1.0, True)}
print(f"computed in {time.perf_counter() - t0:.1f} s")
print(f"{'r':>6}" + "".join(f"{name:>34}" for name in curves))
for i, r in enumerate(features):
    print(f"{r:>6}" + "".join(f"{curves[name][i]:>34.3f}" for name in curves))

fig, ax = plt.subplots(figsize=(5.2, 3.5))
for (name, errs), style in zip(curves.items(), ("o-", "s--", "^-")):
    ax.loglog(features, errs, style, label="Performer, " + name)
first = curves["orthogonal, q, k scaled by 0.5"][0]
ax.loglog(features, first * (np.array(features) / features[0]) ** -0.5, "k:", label=r"$\propto r^{-1/2}$")
ax.axhline(rel_err(linear_attention(0.5 * q, 0.5 * k, v), sdpa(0.5 * q, 0.5 * k, v)), color="C3",
           label="elu+1 linear attention (scale 0.5)")
ax.set(xlabel="number of random features r", ylabel="relative error vs softmax", title=f"N = {N}, d = {d}")
ax.legend(fontsize=7)
ax.grid(True, which="both", alpha=0.3)
plt.show()

# %% [markdown]
# ## Cost versus sequence length
#
# Now the other side: wall-clock time of one forward for one head ($d = d_v = 32$) as $N$ grows.
# Softmax attention (the NumPy reference `sdpa`) does $\approx 2N^2(d + d_v)$ flops; linear
# attention $\approx 4Nrd_v$. Timings are single-threaded, the best of a few runs (the notebook's
# CI has 2 shared cores, so treat the numbers as shapes, not benchmarks).

# %%
def best_time(fn, *args, min_repeat=3, budget=0.3, **kwargs):
    """Best time of ``fn(*args, **kwargs)`` over at least ``min_repeat`` runs and ``budget`` seconds."""
    times = []
    while len(times) < min_repeat or sum(times) < budget:
        t = time.perf_counter()
        fn(*args, **kwargs)
        times.append(time.perf_counter() - t)
    return min(times)


lengths = [256, 512, 1024, 2048, 4096]
proj64 = performer_projection_matrix(64, 32, seed=0)
timings = {"softmax (sdpa)": [], "linear, elu+1": [], "Performer, r = 64": []}
for n in lengths:
    q1, k1, v1 = (rng.standard_normal((1, 1, n, 32)) for _ in range(3))
    timings["softmax (sdpa)"].append(best_time(sdpa, q1, k1, v1))
    timings["linear, elu+1"].append(best_time(linear_attention_forward, q1, k1, v1))
    timings["Performer, r = 64"].append(best_time(performer, q1, k1, v1, projection=proj64))
print(f"{'N':>6}" + "".join(f"{name:>22}" for name in timings))
for i, n in enumerate(lengths):
    print(f"{n:>6}" + "".join(f"{timings[name][i] * 1e3:>19.2f} ms" for name in timings))

fig, ax = plt.subplots(figsize=(4.8, 3.3))
for name, ts in timings.items():
    ax.loglog(lengths, ts, "o-", label=name)
ax.set(xlabel="sequence length N", ylabel="seconds per forward", title="one head, d = 32")
ax.legend(fontsize=8)
ax.grid(True, which="both", alpha=0.3)
plt.show()

# %% [markdown]
# The softmax curve bends to slope 2 on the log-log plot, the linear ones stay at slope 1. The
# flop counts cross where $N$ is of the order of $r$ (a few dozen here, below the lengths shown);
# in practice constant factors — BLAS efficiency, the feature map, Performer's exponentials —
# move the crossover, so measure at your sizes.
#
# ## Summary
#
# * Linear attention is exact for its own kernel $\phi(q)\cdot\phi(k)$ and costs $O(Nrd_v)$; the
#   elu+1 kernel is a different, much flatter attention than softmax.
# * Performer's positive random features approximate softmax attention, with an error that falls
#   roughly as $r^{-1/2}$ (orthogonal features do better than i.i.d. ones) and grows quickly with
#   the size of the logits.
# * The conventions where linear-attention codebases disagree (the $\epsilon$ placement, Performer's
#   stabilisers, $1/\sqrt d$ in the features) are listed on the
#   [conventions page](../conventions.md#linear-kernel-and-set-attention).
