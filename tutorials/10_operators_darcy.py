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
# # 10. Three neural operators on Darcy flow
#
# [Tutorial 4](04_operator_attention.ipynb) learned a 1-D time-evolution operator (Burgers). Here
# the second classic benchmark of the neural-operator literature (Li et al., FNO, ICLR 2021):
# **2-D Darcy flow**, the steady pressure $u$ in a porous medium of permeability $a(x)$,
#
# $$-\nabla\cdot\big(a(x)\,\nabla u(x)\big) = 1 \quad\text{in } \Omega = (0,1)^2,\qquad u = 0 \text{ on } \partial\Omega .$$
#
# The operator to learn is $a \mapsto u$: a map from a rough, piecewise-constant coefficient to a
# smooth solution, non-local (a change of $a$ anywhere moves $u$ everywhere) and nonlinear in $a$.
#
# Three operators are trained on it, every layer with refattn's hand-derived backward and
# `refattn.optim.Adam`, inside one shared backbone so that only the *token mixer* differs:
#
# | operator | mixer | refattn module |
# |---|---|---|
# | FNO (Li et al. 2021) | 2-D spectral convolution (5×5 kept Fourier modes in each of two corners) + pointwise linear skip | `refattn.operators.fno` |
# | Transolver (Wu et al., ICML 2024) | Physics-Attention on a structured mesh: 3×3-conv slice front, softmax attention among $G$ slice tokens | `refattn.operators.transolver` (`mesh_shape`) |
# | FUNCATTN (Xiao et al. 2026) — new in this release | the same slice front, but the slice tokens are mixed by a ridge least-squares *functional map* instead of softmax attention | `refattn.operators.funcattn` (`mesh_shape`) |

# %%
import os

# Tiny matrices: one BLAS thread is faster than several competing for two shared cores.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import time

import matplotlib.pyplot as plt
import numpy as np
import scipy.sparse as sp
import scipy.sparse.linalg as spla

from refattn.nn.activations import gelu, gelu_grad
from refattn.nn.linear import linear_apply, linear_vjp
from refattn.nn.norms import layer_norm_backward, layer_norm_forward
from refattn.operators.fno import fno_spectral_conv_backward, fno_spectral_conv_forward, init_fno_params
from refattn.operators.funcattn import funcattn_backward, funcattn_forward, funcattn_init_params
from refattn.operators.transolver import (
    transolver_init_params,
    transolver_physics_attention_backward,
    transolver_physics_attention_forward,
)
from refattn.optim import Adam
from refattn.registry import Sample
from refattn.testing import directional_check

# %% [markdown]
# ## The data: a finite-volume Darcy solver in a dozen lines
#
# The coefficient follows the FNO benchmark's recipe: a Gaussian random field $g$ with covariance
# $(-\Delta + \tau^2)^{-\alpha}$ (sampled spectrally), thresholded to two values,
# $a = 12$ where $g > 0$ and $a = 3$ elsewhere. The equation is discretised on $n\times n$ square
# cells of side $h = 1/n$ with unknowns at the cell centres (a 5-point finite-volume scheme): the
# flux through a face between cells $P$ and $E$ is $a_f(u_E - u_P)/h$ with the *harmonic mean*
# $a_f = 2a_Pa_E/(a_P+a_E)$ (the exact effective conductivity of two half-cells in series), and a
# boundary face sees the wall value $u = 0$ half a cell away, i.e. coefficient $2a_P$. Summing the
# four fluxes gives one sparse symmetric positive-definite system $Au = h^2\mathbf 1$ per sample,
# solved by `scipy.sparse.linalg.spsolve`.

# %%
S = 16  # cells per side: N = 256 points per sample


def random_coefficient(rng, n, tau=3.0, alpha=2.0, low=3.0, high=12.0):
    """Thresholded Gaussian random field with spectrum (4 pi^2 |k|^2 + tau^2)^(-alpha)."""
    k = np.fft.fftfreq(n, 1.0 / n)
    k2 = k[:, None] ** 2 + k[None, :] ** 2
    amp = (4 * np.pi**2 * k2 + tau**2) ** (-alpha / 2)
    amp[0, 0] = 0.0  # zero mean, so the two phases are balanced on average
    g = np.fft.ifft2(amp * (rng.standard_normal((n, n)) + 1j * rng.standard_normal((n, n)))).real
    return np.where(g > 0, high, low)


def darcy_solve(a):
    """Cell-centred 5-point finite volumes for -div(a grad u) = 1, u = 0 on the boundary of (0,1)^2."""
    n = a.shape[0]
    idx = np.arange(n * n).reshape(n, n)
    diag = np.zeros((n, n))
    rows, cols, vals = [], [], []
    for axis in (0, 1):
        lo = [slice(None)] * 2
        hi = [slice(None)] * 2
        lo[axis], hi[axis] = slice(0, -1), slice(1, None)
        lo, hi = tuple(lo), tuple(hi)
        af = 2 * a[lo] * a[hi] / (a[lo] + a[hi])  # harmonic mean on interior faces
        diag[lo] += af
        diag[hi] += af
        rows += [idx[lo].ravel(), idx[hi].ravel()]
        cols += [idx[hi].ravel(), idx[lo].ravel()]
        vals += [-af.ravel(), -af.ravel()]
        # boundary faces: the wall (u = 0) is h/2 away -> coefficient 2 a
        first = [slice(None)] * 2
        last = [slice(None)] * 2
        first[axis], last[axis] = 0, -1
        diag[tuple(first)] += 2 * a[tuple(first)]
        diag[tuple(last)] += 2 * a[tuple(last)]
    rows.append(idx.ravel())
    cols.append(idx.ravel())
    vals.append(diag.ravel())
    A = sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(n * n, n * n))
    return spla.spsolve(A, np.full(n * n, 1.0 / n**2)).reshape(n, n)


# Sanity check of the solver: with a = 1 the solution of the Poisson problem has max ~0.0737.
print(f"a = 1: max u = {darcy_solve(np.ones((64, 64))).max():.4f} (exact 0.0737 for the continuous problem)")

n_train, n_test = 128, 48
rng = np.random.default_rng(0)
t0 = time.perf_counter()
coef = np.stack([random_coefficient(rng, S) for _ in range(n_train + n_test)])
sol = np.stack([darcy_solve(c) for c in coef])
print(f"{len(coef)} Darcy problems on a {S}x{S} grid solved in {time.perf_counter() - t0:.2f} s")

fig, axes = plt.subplots(2, 4, figsize=(10, 5))
for j in range(4):
    axes[0, j].imshow(coef[j], cmap="viridis", origin="lower")
    axes[1, j].imshow(sol[j], cmap="magma", origin="lower")
    axes[0, j].set_title(f"a (sample {j})")
    axes[1, j].set_title("u")
for ax in axes.ravel():
    ax.set_xticks([])
    ax.set_yticks([])
plt.tight_layout()
plt.show()

# %% [markdown]
# Inputs and targets are normalised with training-set statistics (the model sees $(a-\bar a)/s_a$
# and predicts $u/s_u$); errors are always measured on $u$ in its own units. Each sample becomes
# $N = S^2$ tokens (row-major cell order) with features $[\tilde a, x, y]$.

# %%
a_mean, a_std = coef[:n_train].mean(), coef[:n_train].std()
u_std = sol[:n_train].std()
xs = (np.arange(S) + 0.5) / S
grid = np.stack(np.meshgrid(xs, xs, indexing="ij"), axis=-1).reshape(S * S, 2)
feats = np.concatenate([((coef - a_mean) / a_std).reshape(-1, S * S, 1),
                        np.broadcast_to(grid, (len(coef), S * S, 2))], axis=-1)
target = sol.reshape(-1, S * S) / u_std
f_tr, y_tr, f_te, y_te = feats[:n_train], target[:n_train], feats[n_train:], target[n_train:]


def rel_l2(pred, truth):
    """Mean over samples of ||pred - truth|| / ||truth|| (scale-free, so u/s_u or u alike)."""
    return float(np.mean(np.linalg.norm(pred - truth, axis=1) / np.linalg.norm(truth, axis=1)))


# %% [markdown]
# ## One backbone, three mixers
#
# Every model is: lift $[\tilde a, x, y]\to$ 24 channels, then $L = 2$ pre-norm residual blocks
#
# $$h \leftarrow h + \mathrm{Mix}(\mathrm{LN}(h)),\qquad h \leftarrow h + W_2\,\mathrm{GELU}(W_1\,\mathrm{LN}(h)),$$
#
# then a pointwise GELU projection to one channel. A mixer is a refattn forward/backward pair
# acting on $(B, N, C)$ tokens; the three below only adapt the call signature:
#
# * **FNO**: reshape to $(B, S, S, C)$, spectral convolution with $5\times5$ kept modes in each of
#   the two corners (``weights1``/``weights2``), plus a pointwise linear skip.
# * **Transolver** and **FUNCATTN**: 4 heads of width 6, $G = 12$ slices; `mesh_shape=(S, S)`
#   makes the slice front a pair of $3\times3$ convolutions over the grid (upstream's
#   `*_Structured_Mesh_2D` layers).

# %%
WIDTH, LAYERS, HIDDEN, HEADS, DHEAD, SLICES, MODES = 24, 2, 48, 4, 6, 12, 5


def lin(p, name, x):
    return linear_apply(x, p[name + ".weight"], p[name + ".bias"])


def lin_back(g, p, name, dy, x):
    r = linear_vjp(dy, x, p[name + ".weight"])
    g[name + ".weight"], g[name + ".bias"] = r["weight"], r["bias"]
    return r["x"]


def sub(p, prefix):
    return {k[len(prefix):]: v for k, v in p.items() if k.startswith(prefix)}


def torch_linear(rng, n_in, n_out):
    bound = 1.0 / np.sqrt(n_in)
    return rng.uniform(-bound, bound, (n_in, n_out)), rng.uniform(-bound, bound, n_out)


# --- the three mixers: init(rng) -> params, fwd(h, p) -> (y, cache), bwd(dy, cache) -> grads incl. "x"
def fno_init(rng):
    p = init_fno_params(rng, WIDTH, WIDTH, (MODES, MODES))
    p["skip.weight"], p["skip.bias"] = torch_linear(rng, WIDTH, WIDTH)
    return p


def fno_fwd(h, p):
    s, cs = fno_spectral_conv_forward(h.reshape(-1, S, S, WIDTH), {k: v for k, v in p.items() if "skip" not in k})
    return s.reshape(h.shape) + lin(p, "skip", h), (cs, h, p)


def fno_bwd(dy, cache):
    cs, h, p = cache
    g = fno_spectral_conv_backward(dy.reshape(-1, S, S, WIDTH), cs)
    dx = g.pop("x").reshape(dy.shape)
    g["x"] = dx + lin_back(g, p, "skip", dy, h)
    return g


def transolver_init(rng):
    return transolver_init_params(rng, WIDTH, n_head=HEADS, dim_head=DHEAD, slice_num=SLICES, mesh_ndim=2)


def transolver_fwd(h, p):
    return transolver_physics_attention_forward(h, p, n_head=HEADS, tau_clamp=(0.1, 5.0), mesh_shape=(S, S))


def funcattn_init(rng):
    return funcattn_init_params(rng, WIDTH, n_head=HEADS, dim_head=DHEAD, basis_num=SLICES, mesh_ndim=2)


def funcattn_fwd(h, p):
    return funcattn_forward(h, p, n_head=HEADS, mesh_shape=(S, S))


MIXERS = {
    "FNO": (fno_init, fno_fwd, fno_bwd),
    "Transolver": (transolver_init, transolver_fwd, transolver_physics_attention_backward),
    "FUNCATTN": (funcattn_init, funcattn_fwd, funcattn_backward),
}


# --- the shared backbone
def init_model(name, seed):
    rng = np.random.default_rng(seed)
    p = {}
    p["lift.weight"], p["lift.bias"] = torch_linear(rng, 3, WIDTH)
    for i in range(LAYERS):
        pre = f"layers.{i}."
        p.update({pre + "mix." + k: v for k, v in MIXERS[name][0](rng).items()})
        for ln in ("ln_1", "ln_2"):
            p[pre + ln + ".weight"], p[pre + ln + ".bias"] = np.ones(WIDTH), np.zeros(WIDTH)
        p[pre + "ffn1.weight"], p[pre + "ffn1.bias"] = torch_linear(rng, WIDTH, HIDDEN)
        p[pre + "ffn2.weight"], p[pre + "ffn2.bias"] = torch_linear(rng, HIDDEN, WIDTH)
    p["proj1.weight"], p["proj1.bias"] = torch_linear(rng, WIDTH, HIDDEN)
    p["proj2.weight"], p["proj2.bias"] = torch_linear(rng, HIDDEN, 1)
    return p


def model_forward(name, p, f):
    fwd = MIXERS[name][1]
    h, caches = lin(p, "lift", f), []
    for i in range(LAYERS):
        pre = f"layers.{i}."
        n1, c1 = layer_norm_forward(h, sub(p, pre + "ln_1."))
        m, cm = fwd(n1, sub(p, pre + "mix."))
        h1 = h + m
        n2, c2 = layer_norm_forward(h1, sub(p, pre + "ln_2."))
        z = lin(p, pre + "ffn1", n2)
        h = h1 + lin(p, pre + "ffn2", gelu(z))
        caches.append((c1, cm, c2, n2, z))
    z = lin(p, "proj1", h)
    return lin(p, "proj2", gelu(z))[..., 0], (f, caches, h, z)


def model_backward(name, p, dout, cache):
    bwd = MIXERS[name][2]
    f, caches, h, z = cache
    g = {}
    dh = lin_back(g, p, "proj1", lin_back(g, p, "proj2", dout[..., None], gelu(z)) * gelu_grad(z), h)
    for i in reversed(range(LAYERS)):
        pre = f"layers.{i}."
        c1, cm, c2, n2, zi = caches[i]
        g2 = layer_norm_backward(lin_back(g, p, pre + "ffn1", lin_back(g, p, pre + "ffn2", dh, gelu(zi))
                                          * gelu_grad(zi), n2), c2)
        dh1 = dh + g2["x"]
        gm = bwd(dh1, cm)
        g1 = layer_norm_backward(gm.pop("x"), c1)
        dh = dh1 + g1["x"]
        g.update({pre + "mix." + k: v for k, v in gm.items()})
        for ln, gl in (("ln_1", g1), ("ln_2", g2)):
            g[pre + ln + ".weight"], g[pre + ln + ".bias"] = gl["weight"], gl["bias"]
    lin_back(g, p, "lift", dh, f)
    return g


# %% [markdown]
# ## Are the composed backwards right?
#
# Before training, each whole model's backward (through its mixers, layer norms, feed-forward
# blocks, lift and projection) is compared with a central difference along a random direction in
# parameter space, with `refattn.testing.directional_check` — the check that verifies single
# mechanisms also verifies a model assembled from them.

# %%
models = {}
for seed, name in enumerate(MIXERS):
    p = init_model(name, seed)
    models[name] = p
    rep = directional_check(lambda f, params, name=name: model_forward(name, params, f),
                            lambda dout, cache, name=name, p=p: model_backward(name, p, dout, cache),
                            Sample(inputs={}, params=p, config={"f": f_tr[:2]}))
    print(f"{name:<11} {sum(v.size for v in p.values()):6d} parameters; backward vs central difference: "
          f"relative error {rep.rows[0][3]:.1e} ({'PASS' if rep.passed else 'FAIL'})")

# %% [markdown]
# ## Training
#
# The same budget for all three: mean-squared error on the normalised solution, mini-batches of 16,
# `refattn.optim.Adam` with a learning rate decaying linearly from $3\cdot10^{-3}$ to 10 % of it,
# and a fixed number of epochs. The relative $L^2$ test error on the 48 held-out coefficients is
# recorded after every epoch.

# %%
EPOCHS, BATCH, LR = 12, 16, 4e-3


def fit(name, p, seed=0):
    rng = np.random.default_rng(100 + seed)
    opt = Adam(p, lr=LR)
    steps = n_train // BATCH
    total, step = EPOCHS * steps, 0
    losses, errs = [], []
    t0 = time.perf_counter()
    for _ in range(EPOCHS):
        order = rng.permutation(n_train)
        run = 0.0
        for s in range(steps):
            idx = order[s * BATCH:(s + 1) * BATCH]
            pred, cache = model_forward(name, p, f_tr[idx])
            diff = pred - y_tr[idx]
            run += float(np.mean(diff**2))
            opt.lr = LR * (1.0 - 0.9 * step / total)
            opt.step(model_backward(name, p, 2.0 * diff / diff.size, cache))
            step += 1
        losses.append(run / steps)
        errs.append(rel_l2(model_forward(name, p, f_te)[0], y_te))
    return losses, errs, time.perf_counter() - t0


history = {}
for seed, name in enumerate(MIXERS):
    history[name] = fit(name, models[name], seed)
    losses, errs, sec = history[name]
    print(f"{name:<11} train MSE {losses[0]:.2e} -> {losses[-1]:.2e}, test relative L2 {errs[-1]:.3f}  ({sec:.1f} s)")

# %% [markdown]
# ## Results

# %%
preds = {name: model_forward(name, models[name], f_te)[0] for name in MIXERS}
per_sample = {name: np.linalg.norm(preds[name] - y_te, axis=1) / np.linalg.norm(y_te, axis=1) for name in MIXERS}
print(f"{'operator':<11} {'params':>7} {'train MSE':>10} {'test rel. L2':>13} {'median':>7} {'worst':>7} {'time':>7}")
for name in MIXERS:
    losses, errs, sec = history[name]
    e = per_sample[name]
    print(f"{name:<11} {sum(v.size for v in models[name].values()):7d} {losses[-1]:10.2e} {e.mean():13.3f} "
          f"{np.median(e):7.3f} {e.max():7.3f} {sec:6.1f}s")

fig, axes = plt.subplots(1, 2, figsize=(10, 3.2))
for name in MIXERS:
    losses, errs, _ = history[name]
    ep = np.arange(1, EPOCHS + 1)
    axes[0].semilogy(ep, losses, label=name)
    axes[1].semilogy(ep, errs, label=name)
axes[0].set(xlabel="epoch", ylabel="training MSE (normalised u)", title="loss")
axes[1].set(xlabel="epoch", ylabel="relative $L^2$ error", title="48 held-out coefficients")
axes[1].legend()
plt.tight_layout()
plt.show()

# %% [markdown]
# One held-out sample: the coefficient, the finite-volume solution, and each operator's
# prediction with its pointwise error (same colour scale for the three error maps).

# %%
i = int(np.argsort(per_sample["FNO"])[len(y_te) // 2])  # a typical (median-error) sample
fig, axes = plt.subplots(2, 4, figsize=(12, 5.6))
truth = y_te[i].reshape(S, S) * u_std
err_max = max(np.abs(preds[n][i] - y_te[i]).max() for n in MIXERS) * u_std
axes[0, 0].imshow(coef[n_train + i], cmap="viridis", origin="lower")
axes[0, 0].set_title("coefficient a")
axes[1, 0].imshow(truth, cmap="magma", origin="lower")
axes[1, 0].set_title("truth u")
for j, name in enumerate(MIXERS, start=1):
    pr = preds[name][i].reshape(S, S) * u_std
    axes[0, j].imshow(pr, cmap="magma", origin="lower", vmin=truth.min(), vmax=truth.max())
    axes[0, j].set_title(f"{name}: rel. err {per_sample[name][i]:.3f}", fontsize=10)
    im = axes[1, j].imshow(pr - truth, cmap="RdBu_r", origin="lower", vmin=-err_max, vmax=err_max)
    axes[1, j].set_title(f"{name} - truth", fontsize=10)
for ax in axes.ravel():
    ax.set_xticks([])
    ax.set_yticks([])
fig.colorbar(im, ax=axes[1, 1:].tolist(), shrink=0.8)
plt.show()

# %% [markdown]
# ## What these numbers mean
#
# The budget is deliberately tiny so that the notebook runs in about a minute on one CPU core:
# 128 training samples on a $16\times16$ grid, width 24, two blocks, 12 epochs (96 Adam steps).
# The errors are therefore **not** the operators' attainable accuracy and not a ranking of the
# architectures — published Darcy results (1000+ samples, $85\times85$ grids, hundreds of epochs)
# reach about 1 % relative or less $L^2$ error for all three families. What the table does show:
#
# * every model, assembled from refattn forward/backward pairs, passes a directional derivative
#   check and learns part of the operator: the first-epoch training MSE on the normalised target
#   is 1.4–1.7 and every model ends below it — the FNO by more than an order of magnitude,
#   FUNCATTN by about 10×, Transolver only by about 3×;
# * at equal steps the FNO learns fastest here: its spectral convolution acts on the whole grid
#   from the first step, and a smooth elliptic solution is well represented by a few Fourier
#   modes. It also has the most parameters (the $2\times5\times5$ complex $24\times24$ mode
#   matrices per layer);
# * the two slice-based attentions first have to organise their soft assignment of points to
#   slices; with the same front, FUNCATTN's least-squares functional map between slice
#   coefficients trains faster than Transolver's softmax among slice tokens in this run
#   (Transolver sits on a plateau for the first half). Neither has converged: both curves are
#   still falling at the end (raise `EPOCHS` to see how far they go).
#
# Single runs from one seed differ by a few percentage points; compare curves, not the third
# digit.
