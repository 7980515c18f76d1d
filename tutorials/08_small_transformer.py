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
# # 8. A small transformer from refattn's blocks, trained with its backwards
#
# Every refattn layer is a pair `xxx_forward(...) -> (out, cache)`, `xxx_backward(dout, cache) ->
# grads`. That is all a training loop needs: this notebook stacks the library's own layers into a
# two-layer decoder-only transformer of the LLaMA kind,
#
# * a token embedding (a table lookup, the one piece written here),
# * **RMSNorm** (`refattn.nn.norms.rms_norm_forward`) in the **pre-norm residual scheme**,
# * causal **multi-head attention with rotary positions** (`refattn.attention.softmax.mha.mha_forward`
#   with `is_causal=True, rope=True`),
# * a **SwiGLU feed-forward** layer (`refattn.blocks.glu_ffn.glu_ffn_forward`),
# * a final RMSNorm, an output projection (`refattn.nn.linear.linear_forward`) and a
#   log-softmax cross-entropy (`refattn.nn.softmax.log_softmax_forward`),
#
# checks the composed backward of the *whole model* against finite differences, and trains it with
# `refattn.optim.Adam` to reverse sequences of digits — no autograd anywhere.

# %%
import os

# Small matrices: one BLAS thread is faster than several competing for two shared cores.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("OMP_NUM_THREADS", "1")

import time

import matplotlib.pyplot as plt
import numpy as np

from refattn.attention.softmax.mha import init_mha_params, mha_backward, mha_forward
from refattn.blocks.glu_ffn import glu_ffn_backward, glu_ffn_forward
from refattn.nn.linear import linear_backward, linear_forward
from refattn.nn.norms import rms_norm_backward, rms_norm_forward
from refattn.nn.rope import rope_forward
from refattn.nn.softmax import log_softmax_backward, log_softmax_forward, softmax
from refattn.optim import Adam
from refattn.registry import Sample
from refattn.testing import gradcheck

# %% [markdown]
# ## The model
#
# With $x^{(0)} = E[t]$ (the embedding rows of the tokens $t$), each of the $L$ layers updates the
# **residual stream** $x$ twice (pre-norm, as GPT-2 and LLaMA):
#
# $$u^{(l)} = x^{(l)} + \mathrm{MHA}\big(\mathrm{RMSNorm}_1(x^{(l)})\big),\qquad
# x^{(l+1)} = u^{(l)} + \mathrm{SwiGLU}\big(\mathrm{RMSNorm}_2(u^{(l)})\big),$$
#
# then $z = \mathrm{RMSNorm}_f(x^{(L)})\,W_{\text{out}}$ are the logits, and the loss is the mean
# cross-entropy $\mathcal L = -\frac{1}{\sum w}\sum_{b,i} w_{bi}\,\log\operatorname{softmax}(z_{bi})_{y_{bi}}$
# over the positions with weight $w_{bi} = 1$.
#
# All parameters live in one flat dict with PyTorch-like dotted names (`l0.attn.q_proj`,
# `l1.ffn.gate_proj.weight` ...); each layer receives its own slice with the prefix stripped,
# which is exactly the params dict its refattn forward expects.

# %%
def sub(params, prefix):
    """The entries of ``params`` under ``prefix``, with the prefix stripped."""
    return {k[len(prefix):]: v for k, v in params.items() if k.startswith(prefix)}


def init_params(rng, vocab, width, num_layers, num_heads, hidden):
    p = {"embed": rng.standard_normal((vocab, width))}
    for i in range(num_layers):
        p[f"l{i}.norm1"] = np.ones(width)
        for k, v in init_mha_params(rng, width, num_heads, width // num_heads, bias=False).items():
            p[f"l{i}.attn.{k}"] = v
        p[f"l{i}.norm2"] = np.ones(width)
        for name, (n_in, n_out) in {"gate_proj": (width, hidden), "up_proj": (width, hidden),
                                    "down_proj": (hidden, width)}.items():
            p[f"l{i}.ffn.{name}.weight"] = rng.standard_normal((n_in, n_out)) / np.sqrt(n_in)
    p["norm_f"] = np.ones(width)
    p["lm_head"] = rng.standard_normal((width, vocab)) / np.sqrt(width)
    return p


def model_forward(params, tokens, *, num_heads, num_layers):
    """Logits ``(B, N, vocab)`` of the token ids ``tokens (B, N)``, and the cache of every layer."""
    x = params["embed"][tokens]
    layers = []
    for i in range(num_layers):
        h, c_norm1 = rms_norm_forward(x, {"weight": params[f"l{i}.norm1"]})
        a, c_attn = mha_forward(h, params=sub(params, f"l{i}.attn."), num_heads=num_heads,
                                is_causal=True, rope=True)
        x = x + a
        h, c_norm2 = rms_norm_forward(x, {"weight": params[f"l{i}.norm2"]})
        f, c_ffn = glu_ffn_forward(h, sub(params, f"l{i}.ffn."), variant="swiglu")
        x = x + f
        layers.append((c_norm1, c_attn, c_norm2, c_ffn))
    h, c_normf = rms_norm_forward(x, {"weight": params["norm_f"]})
    logits, c_head = linear_forward(h, {"weight": params["lm_head"]})
    return logits, {"tokens": tokens, "vocab": params["embed"].shape[0], "layers": layers,
                    "normf": c_normf, "head": c_head}

# %% [markdown]
# ## The backward: the chain rule down the residual stream
#
# The backward visits the layers in reverse and needs no knowledge of what is inside them: each
# `xxx_backward(dy, cache)` returns $dx = J^\top dy$ for its input and the gradient of each of its
# own parameters. The only model-level rule is the residual one. For $u = x + F(\mathrm{N}(x))$,
#
# $$\frac{\partial \mathcal L}{\partial x} = \frac{\partial \mathcal L}{\partial u}
# + J_{\mathrm N}^\top\, J_F^\top\, \frac{\partial \mathcal L}{\partial u}:$$
#
# the gradient arriving at $u$ is passed *unchanged* down the identity path and *added* to what
# comes back through the branch (`glu_ffn_backward`, then `rms_norm_backward`; or `mha_backward`,
# then `rms_norm_backward`). That identity path is why pre-norm stacks train easily: every layer
# sees the loss gradient directly, plus corrections.
#
# The two ends:
#
# * **Cross-entropy + log-softmax.** $\partial\mathcal L/\partial \log p_{bi,v} = -w_{bi}[v = y_{bi}]/\sum w$;
#   `log_softmax_backward` turns it into $\partial\mathcal L/\partial z = (p - \mathrm{onehot}(y))\,w/\sum w$.
# * **Embedding.** $x^{(0)}_{bi} = E[t_{bi}]$ is a row gather, so its adjoint is a scatter-add:
#   $dE[v] = \sum_{b,i:\,t_{bi}=v} dx^{(0)}_{bi}$ (`np.add.at`, which accumulates repeated tokens).
#
# Inside the layers the derivations are on their pages: MHA with RoPE (the SDPA VJP per head, then
# $R_\Theta^\top$ on $dQ, dK$ because the rotation is orthogonal), SwiGLU
# ($da = dh\odot v\odot\mathrm{silu}'(a)$, $dv = dh\odot\mathrm{silu}(a)$) and RMSNorm
# ($dx = r\,(d\hat x - \hat x\,\overline{d\hat x\odot\hat x})$).

# %%
def model_backward(dlogits, cache):
    """Gradients of every parameter of `model_forward`, keyed like ``params``."""
    grads = {}
    d = linear_backward(dlogits, cache["head"])
    grads["lm_head"] = d["weight"]
    d = rms_norm_backward(d["x"], cache["normf"])
    grads["norm_f"] = d["weight"]
    dx = d["x"]  # dL/dx on the residual stream
    for i in reversed(range(len(cache["layers"]))):
        c_norm1, c_attn, c_norm2, c_ffn = cache["layers"][i]
        # x_{l+1} = u + SwiGLU(RMSNorm2(u)): identity path + branch path
        d = glu_ffn_backward(dx, c_ffn)
        grads.update({f"l{i}.ffn.{k}": v for k, v in d.items() if k != "x"})
        d = rms_norm_backward(d["x"], c_norm2)
        grads[f"l{i}.norm2"] = d["weight"]
        dx = dx + d["x"]
        # u = x_l + MHA(RMSNorm1(x_l))
        d = mha_backward(dx, c_attn)
        grads.update({f"l{i}.attn.{k}": v for k, v in d.items() if k != "x"})
        d = rms_norm_backward(d["x"], c_norm1)
        grads[f"l{i}.norm1"] = d["weight"]
        dx = dx + d["x"]
    dembed = np.zeros((cache["vocab"], dx.shape[-1]), dtype=dx.dtype)
    np.add.at(dembed, cache["tokens"], dx)  # adjoint of the row gather
    grads["embed"] = dembed
    return grads


def loss_forward(params, tokens, targets, weights, *, num_heads, num_layers):
    """Weighted mean next-token cross-entropy (a 0-d array) and its cache."""
    logits, c_model = model_forward(params, tokens, num_heads=num_heads, num_layers=num_layers)
    logp, c_lsm = log_softmax_forward(logits)
    nll = -np.take_along_axis(logp, targets[..., None], axis=-1)[..., 0]
    loss = np.sum(weights * nll) / np.sum(weights)
    return np.asarray(loss), {"model": c_model, "lsm": c_lsm, "logits": logits, "targets": targets,
                              "weights": weights}


def loss_backward(dloss, cache):
    w = cache["weights"]
    dlogp = np.zeros_like(cache["logits"])
    np.put_along_axis(dlogp, cache["targets"][..., None], (-float(dloss) * w / w.sum())[..., None], axis=-1)
    return model_backward(log_softmax_backward(dlogp, cache["lsm"])["x"], cache["model"])

# %% [markdown]
# ## Checking the whole model's backward
#
# `refattn.testing.gradcheck` perturbs every entry of every parameter by $\pm\varepsilon$ and
# compares the central difference of the loss with `loss_backward`. A tiny instance (vocabulary 5,
# width 4, two heads, two layers, random weights on the positions) keeps that to a few hundred
# forward passes. Every parameter of the composed model agrees to about $10^{-9}$ relative:
# the layers' backwards and the glue between them (residual sums, the embedding scatter, the
# cross-entropy) are all right.

# %%
rng = np.random.default_rng(0)
tiny = Sample(inputs={}, params=init_params(rng, vocab=5, width=4, num_layers=2, num_heads=2, hidden=6),
              config={"tokens": rng.integers(0, 5, (2, 5)), "targets": rng.integers(0, 5, (2, 5)),
                      "weights": rng.random((2, 5)), "num_heads": 2, "num_layers": 2})
print(gradcheck(loss_forward, loss_backward, tiny))

# %% [markdown]
# ## The task: reversing a sequence
#
# A sequence is $K = 6$ random digits, a separator `|`, then the same digits reversed:
# `3 1 4 1 5 9 | 9 5 1 4 1 3`. The model reads it left to right (causal attention) and is trained
# to predict each next token; the loss counts only the $K$ digits after the separator (the first
# half is random and cannot be predicted). To emit the $j$-th reversed digit the model must find
# the digit at the mirrored position, a distance that changes with $j$: rotary positions give
# attention the relative offsets, and the model must work out where the mirror is.

# %%
K, DIGITS = 6, 10
SEP = DIGITS  # token id of the separator; the vocabulary is 0..9 and |
VOCAB = DIGITS + 1


def make_batch(rng, batch):
    digits = rng.integers(0, DIGITS, (batch, K))
    seq = np.concatenate([digits, np.full((batch, 1), SEP), digits[:, ::-1]], axis=1)
    weights = np.zeros((batch, 2 * K))
    weights[:, K:] = 1.0  # targets seq[K+1:]: the reversed digits
    return seq[:, :-1], seq[:, 1:], weights


def show(seq):
    return " ".join("|" if t == SEP else str(t) for t in seq)


tokens, targets, weights = make_batch(np.random.default_rng(1), 2)
for t, y, w in zip(tokens, targets, weights):
    print("input :", show(t))
    print("target:", " ".join(str(v) if wi else "." for v, wi in zip(y, w)))

# %% [markdown]
# ## Training
#
# Width 32, four heads of width 8, SwiGLU hidden width 64, two layers: about 21 000 parameters.
# 500 Adam steps on batches of 64 fresh sequences, the learning rate decaying from
# $6\times10^{-3}$ to 0 on a cosine schedule (the optimiser's `lr` attribute is set before each
# step), float64 throughout.

# %%
config = {"num_heads": 4, "num_layers": 2}
params = init_params(np.random.default_rng(2), vocab=VOCAB, width=32, hidden=64, **config)
print("parameters:", sum(v.size for v in params.values()))
steps, lr_max = 500, 6e-3
opt = Adam(params, lr=lr_max)
data_rng = np.random.default_rng(3)
losses, accs = [], []
t0 = time.perf_counter()
for step in range(steps):
    opt.lr = lr_max * 0.5 * (1 + np.cos(np.pi * step / steps))
    tokens, targets, weights = make_batch(data_rng, 64)
    loss, cache = loss_forward(params, tokens, targets, weights, **config)
    opt.step(loss_backward(1.0, cache))
    losses.append(float(loss))
    accs.append(float(np.sum((cache["logits"].argmax(-1) == targets) * weights) / np.sum(weights)))
print(f"{len(losses)} steps in {time.perf_counter() - t0:.1f} s; final loss {np.mean(losses[-20:]):.2e}")

fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 3.2))
ax1.plot(losses, lw=0.8)
ax1.set(xlabel="Adam step", ylabel="cross-entropy (nats)", yscale="log", title="training loss")
ax2.plot(accs, lw=0.8)
ax2.set(xlabel="Adam step", ylabel="accuracy", title="next-digit accuracy (teacher forcing)", ylim=(0, 1.02))
plt.show()

# %% [markdown]
# The loss starts near $\log 11 \approx 2.4$ (a uniform guess over the vocabulary) and falls by
# about three orders of magnitude as the attention learns to find the mirrored positions; the
# curve is noisy because every step sees a fresh random batch.
#
# ## Predictions, generated token by token
#
# The real test is free-running generation: feed the first half and the separator, append the
# model's most likely next token, and repeat $K$ times, so a mistake early on would propagate. On
# 1000 unseen sequences:

# %%
def generate(params, prefix, n_new):
    seq = prefix.copy()
    for _ in range(n_new):
        logits, _ = model_forward(params, seq, **config)
        seq = np.concatenate([seq, logits[:, -1].argmax(-1)[:, None]], axis=1)
    return seq


test_tokens, test_targets, test_weights = make_batch(np.random.default_rng(4), 1000)
test_loss, _ = loss_forward(params, test_tokens, test_targets, test_weights, **config)
print(f"held-out loss (teacher forcing): {float(test_loss):.2e}")
prefix = test_tokens[:, :K + 1]
out = generate(params, prefix, K)
exact = np.all(out[:, K + 1:] == prefix[:, :K][:, ::-1], axis=1)
print(f"sequences reversed exactly: {exact.mean():.1%}")
for seq in out[:5]:
    print(show(seq))

# %% [markdown]
# ## What the attention learned
#
# The attention weights of the trained model on one sequence, recomputed from public pieces (the
# projections, `rope_forward` on each head, and a causal `softmax`). Rows are the query positions,
# columns the keys; the rows after the separator are the ones the loss trains.

# %%
def attention_maps(params, tokens, layer):
    """Per-head attention weights (H, N, N) of ``layer`` on one sequence."""
    h = config["num_heads"]
    x = params["embed"][tokens][None]
    for i in range(layer + 1):
        xn = rms_norm_forward(x, {"weight": params[f"l{i}.norm1"]})[0]
        p = sub(params, f"l{i}.attn.")
        if i == layer:
            n, c = xn.shape[-2:]
            q = rope_forward((xn @ p["q_proj"]).reshape(n, h, c // h).transpose(1, 0, 2))[0]
            k = rope_forward((xn @ p["k_proj"]).reshape(n, h, c // h).transpose(1, 0, 2))[0]
            causal = np.tril(np.ones((n, n), dtype=bool))
            return softmax(q @ k.transpose(0, 2, 1) / np.sqrt(c // h), mask=causal)
        x = x + mha_forward(xn, params=p, num_heads=h, is_causal=True, rope=True)[0]
        x = x + glu_ffn_forward(rms_norm_forward(x, {"weight": params[f"l{i}.norm2"]})[0],
                                sub(params, f"l{i}.ffn."))[0]


seq = out[0, :-1]
labels = ["|" if t == SEP else str(t) for t in seq]
fig, axes = plt.subplots(2, config["num_heads"], figsize=(12, 6.2))
for layer in range(2):
    maps = attention_maps(params, seq, layer)
    for hd, ax in enumerate(axes[layer]):
        ax.imshow(maps[hd], cmap="viridis", vmin=0, vmax=1)
        ax.set_xticks(range(len(seq)), labels, fontsize=7)
        ax.set_yticks(range(len(seq)), labels, fontsize=7)
        ax.set_title(f"layer {layer}, head {hd}", fontsize=9)
plt.tight_layout()
plt.show()

# %% [markdown]
# The query at position $i \ge K$ predicts the digit at $i+1$, the mirror of position $2K-1-i$.
# In layer 0, head 0, every query after the separator attends to the separator itself: its
# distance to it, which the rotary positions make visible to attention, is what locates the
# mirror. In layer 1 the lookups of the mirrored digits are split among the heads (the first
# queries after the separator in heads 1 and 2, the last one in head 0): no single head holds the
# whole anti-diagonal, but together they do the reversal.
#
# ## Summary
#
# * A decoder-only transformer is a composition of refattn layers; its backward is their
#   backwards in reverse order, with the residual rule "pass the gradient through, add the
#   branch's" and two small adjoints written here (embedding scatter, cross-entropy seed).
# * `gradcheck` on the composed loss verifies all of it at once, on every parameter.
# * Swapping a block is a one-line change in `model_forward`/`model_backward`: LayerNorm
#   (`layer_norm_forward`) or Dynamic Tanh (`refattn.blocks.dyt.dynamic_tanh_forward`) for RMSNorm,
#   another GLU `variant` for SwiGLU, or another attention with the same `(x, params=...)`
#   contract (e.g. `diff_attention_v1_forward` in `refattn/attention/differential/v1.py`). The
#   ready-made blocks of `refattn.blocks` (parallel attention/MLP, Macaron, LayerScale, nGPT ...)
#   take the attention as a registry slug and do this chaining internally; see the
#   [building blocks page](../building-blocks.md).
