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
# # 1. Softmax attention and its backward, by hand
#
# Scaled dot-product attention is three matrix products around a row-wise softmax. In this
# tutorial we derive its backward pass on paper, write it in a few lines of NumPy, compare it
# with refattn's `sdpa_backward`, and then let finite differences judge both
# (`refattn.testing.gradcheck`). Finally we break the backward on purpose and watch the check fail.
#
# Everything here is float64 NumPy; it runs in a couple of seconds.

# %%
import matplotlib.pyplot as plt
import numpy as np

from refattn.attention.softmax import sdpa_backward, sdpa_forward
from refattn.registry import Sample
from refattn.testing import directional_check, gradcheck

rng = np.random.default_rng(0)

# %% [markdown]
# ## The forward
#
# For one batch element and one head, with queries $Q\in\mathbb R^{N\times d}$, keys
# $K\in\mathbb R^{M\times d}$ and values $V\in\mathbb R^{M\times d_v}$:
#
# $$S = s\,QK^\top + M_{\text{mask}},\qquad P = \operatorname{softmax}_{\text{row}}(S),\qquad O = PV,$$
#
# with scale $s = 1/\sqrt d$ and an additive mask ($-\infty$ removes a key; with
# `is_causal=True` query $i$ sees keys $j\le i$). Row $i$ of $P$ is
# $P_{ij} = e^{S_{ij}} / \sum_{j'} e^{S_{ij'}}$.
#
# refattn uses PyTorch's `scaled_dot_product_attention` layout: `q (B, H, N, d)`,
# `k (B, Hkv, M, d)`, `v (B, Hkv, M, dv)`.

# %%
B, H, N, M, d, dv = 2, 3, 6, 6, 4, 5
q = rng.standard_normal((B, H, N, d))
k = rng.standard_normal((B, H, M, d))
v = rng.standard_normal((B, H, M, dv))


def my_forward(q, k, v, causal=False):
    """Plain NumPy softmax attention; returns the output and what the backward needs."""
    s = 1.0 / np.sqrt(q.shape[-1])
    S = s * q @ np.swapaxes(k, -1, -2)
    if causal:
        S = np.where(np.tril(np.ones((q.shape[-2], k.shape[-2]), dtype=bool)), S, -np.inf)
    S = S - S.max(axis=-1, keepdims=True)          # shift for stability (softmax is shift-invariant)
    P = np.exp(S)
    P /= P.sum(axis=-1, keepdims=True)
    return P @ v, (q, k, v, P, s)


out_mine, saved = my_forward(q, k, v, causal=True)
out_ref, cache = sdpa_forward(q, k, v, is_causal=True)
print("max |mine - refattn| =", np.abs(out_mine - out_ref).max())

# %% [markdown]
# The causal attention weights of one head: each row is a probability distribution over the keys
# the query may see.

# %%
fig, ax = plt.subplots(figsize=(3.2, 3))
im = ax.imshow(cache["p"][0, 0], cmap="viridis")
ax.set(xlabel="key $j$", ylabel="query $i$", title="$P$ (causal, one head)")
fig.colorbar(im, ax=ax, fraction=0.046)
plt.show()

# %% [markdown]
# ## The backward, derived
#
# Let $L$ be any scalar loss and write $dX = \partial L/\partial X$. We receive $dO$ and walk
# the forward in reverse.
#
# **Values.** $O = PV$ is linear in $V$ and in $P$:
#
# $$dV = P^\top dO,\qquad dP = dO\,V^\top.$$
#
# **Softmax.** For one row, $\partial P_j/\partial S_k = P_j(\delta_{jk} - P_k)$, so
#
# $$dS_{ik} = \sum_j dP_{ij}\,P_{ij}(\delta_{jk} - P_{ik})
#          = P_{ik}\Big(dP_{ik} - \sum_j P_{ij}\,dP_{ij}\Big).$$
#
# The row sum has a cheaper form that FlashAttention uses: since $dP = dO\,V^\top$ and $O = PV$,
#
# $$D_i := \sum_j P_{ij}\,dP_{ij} = \sum_j P_{ij}\,(dO_i\cdot v_j) = dO_i\cdot O_i,$$
#
# an $O(d_v)$ dot product per row instead of an $O(M)$ sum over the $N\times M$ matrix. Hence
#
# $$dS = P\odot(dP - D\,\mathbf 1^\top).$$
#
# Masked entries have $P_{ij}=0$, so they get no gradient — the mask needs no special case.
#
# **Scores.** $S = s\,QK^\top$ gives
#
# $$dQ = s\,dS\,K,\qquad dK = s\,dS^\top Q.$$

# %%
def my_backward(dout, saved):
    q, k, v, P, s = saved
    dv = np.swapaxes(P, -1, -2) @ dout
    dP = dout @ np.swapaxes(v, -1, -2)
    D = np.sum(dout * (P @ v), axis=-1, keepdims=True)     # D_i = dO_i . O_i
    dS = P * (dP - D)
    return {"q": s * dS @ k, "k": s * np.swapaxes(dS, -1, -2) @ q, "v": dv}


dout = rng.standard_normal(out_ref.shape)
mine = my_backward(dout, saved)
theirs = sdpa_backward(dout, cache)
for name in "qkv":
    print(f"d{name}: max |mine - refattn| = {np.abs(mine[name] - theirs[name]).max():.2e}")

# %% [markdown]
# ## A live finite-difference check
#
# Agreement between two hand-written backwards proves little: both could share a mistake.
# `refattn.testing.gradcheck` checks a backward against the definition of the derivative. It
# draws a fixed random upstream gradient $G$, defines $L(x) = \langle G, f(x)\rangle$, and
# compares every entry of `backward(G, cache)` with the central difference
#
# $$\frac{\partial L}{\partial x_n} \approx \frac{L(x + \varepsilon e_n) - L(x - \varepsilon e_n)}{2\varepsilon},
# \qquad \varepsilon = 10^{-6},$$
#
# whose error is $O(\varepsilon^2)$ truncation plus $O(\epsilon_{\text{mach}}/\varepsilon)$
# round-off — about $10^{-10}$ in float64. It reports a norm-wise relative error per argument
# and fails above $10^{-6}$.
#
# The arguments come as a `Sample`: differentiable `inputs` and everything else in `config`. We use
# a tiny size (two forwards per entry) with $N\ne M$, grouped-query attention (2 query heads per
# kv head), a causal mask and logit soft-capping.

# %%
tiny = Sample(
    inputs={"q": rng.standard_normal((2, 2, 3, 2)),
            "k": rng.standard_normal((2, 1, 4, 2)),
            "v": rng.standard_normal((2, 1, 4, 3))},
    config={"is_causal": True, "causal_alignment": "bottom_right", "softcap": 2.0},
)
print(gradcheck(sdpa_forward, sdpa_backward, tiny))

# %% [markdown]
# For larger sizes, a full Jacobian is too expensive; `directional_check` compares
# $\langle\nabla L, u\rangle$ with one central difference along a random direction $u$ through all
# arguments at once (and per argument).

# %%
small = Sample(inputs={"q": q, "k": k, "v": v}, config={"is_causal": True})
print(directional_check(sdpa_forward, sdpa_backward, small))

# %% [markdown]
# ## Our own backward under the same check
#
# `gradcheck` takes any forward/backward pair that follows refattn's contract
# (`forward(**inputs, **config) -> (out, cache)`, `backward(dout, cache) -> {name: grad}`),
# so we can hand it ours:

# %%
def fwd(q, k, v, is_causal=False):
    return my_forward(q, k, v, causal=is_causal)


plain = Sample(inputs={"q": rng.standard_normal((2, 2, 3, 2)), "k": rng.standard_normal((2, 2, 3, 2)),
                       "v": rng.standard_normal((2, 2, 3, 3))}, config={"is_causal": True})
print(gradcheck(fwd, my_backward, plain))

# %% [markdown]
# ## A bug the check catches
#
# A classic slip is to treat the softmax like an elementwise function and write $dS = P\odot dP$,
# dropping the $-D$ term. On some inputs the result even looks plausible. The check is not fooled:

# %%
def buggy_backward(dout, saved):
    q, k, v, P, s = saved
    dS = P * (dout @ np.swapaxes(v, -1, -2))     # missing "- D"
    return {"q": s * dS @ k, "k": s * np.swapaxes(dS, -1, -2) @ q, "v": np.swapaxes(P, -1, -2) @ dout}


report = gradcheck(fwd, buggy_backward, plain, raise_on_failure=False)
print(report)
assert not report.passed

# %% [markdown]
# Note which rows fail: `dv` is still right (it does not go through the softmax), `dq` and `dk`
# are wrong.
#
# ## How small should the step be?
#
# The step trades truncation error ($\propto\varepsilon^2$) against round-off
# ($\propto\epsilon_{\text{mach}}/\varepsilon$). Measuring the error of one directional derivative
# against the analytic value over a range of steps shows the familiar V shape. Balancing the two
# terms puts the minimum near $\epsilon_{\text{mach}}^{1/3}\approx 6\cdot10^{-6}$ times a
# problem-dependent factor — here around $10^{-6}$, the step refattn's checks use in float64. In
# float32 ($\epsilon_{\text{mach}}\approx10^{-7}$) the best achievable error is about
# $10^{-5}$, which is why the finite-difference checks always run in float64.

# %%
G = rng.standard_normal(out_ref.shape)
u = {n: rng.standard_normal(a.shape) for n, a in small.inputs.items()}
grads = sdpa_backward(G, sdpa_forward(q, k, v, is_causal=True)[1])
exact = sum(np.sum(grads[n] * u[n]) for n in "qkv")


def loss(t):
    out = sdpa_forward(*(small.inputs[n] + t * u[n] for n in "qkv"), is_causal=True)[0]
    return np.sum(G * out)


steps = np.logspace(-12, -1, 23)
errors = [abs((loss(h) - loss(-h)) / (2 * h) - exact) / abs(exact) for h in steps]
fig, ax = plt.subplots(figsize=(4.5, 3))
ax.loglog(steps, errors, "o-")
ax.set(xlabel=r"step $\varepsilon$", ylabel="relative error", title="central difference vs analytic")
ax.grid(True, which="both", alpha=0.3)
plt.show()

# %% [markdown]
# ## Summary
#
# * $dV = P^\top dO$, $dS = P\odot(dO\,V^\top - D)$ with $D_i = dO_i\cdot O_i$,
#   $dQ = s\,dS\,K$, $dK = s\,dS^\top Q$.
# * `refattn.testing.gradcheck` and `directional_check` verify any backward that follows the
#   `(out, cache)` / `{name: grad}` contract — refattn's own, or yours.
# * Next: [tutorial 2](02_flash_attention.ipynb) computes the same thing without ever storing
#   $P$.
