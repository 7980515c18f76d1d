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
# # 7. Testing a PyTorch implementation against refattn
#
# You have written attention in PyTorch (or JAX, or Triton) and want to know whether it is right
# — forward *and* backward, with masks, $N\ne M$ and grouped-query heads, where most bugs live.
# `refattn.testing.compare_implementation` draws inputs from refattn's registry (or takes yours),
# runs your forward and your vector-Jacobian product on them, and compares every output and every
# gradient with refattn's hand-derived reference.
#
# Below: a hand-written GQA attention with two classic bugs, each caught, and the fixed version
# passing. This is the only tutorial that needs PyTorch (the CPU build is enough).

# %%
import numpy as np
import torch

from refattn.registry import Sample
from refattn.testing import compare_implementation

torch.manual_seed(0)
rng = np.random.default_rng(0)

# %% [markdown]
# ## The contract
#
# * `fn(**inputs, **params, **config) -> out`: your forward. For slug `"sdpa"` the inputs are
#   `q (B, H, N, d)`, `k (B, Hkv, M, d)`, `v (B, Hkv, M, dv)` (PyTorch SDPA layout), converted by
#   `convert` (here `torch.from_numpy`), and the config keywords are those of
#   `refattn.attention.softmax.sdpa_forward` (`is_causal`, `causal_alignment`, `scale`,
#   `kv_group_map`, …) — whatever you pass as `config=`.
# * `vjp(dout, **inputs, **params, **config) -> {name: grad}`: your backward; with autograd this
#   is three lines.
#
# We use a sample with $N = 5$ queries, $M = 7$ keys and 4 query heads sharing 2 key/value heads,
# because the conventions that differ between libraries only show up there.

# %%
sample = Sample(inputs={"q": rng.standard_normal((2, 4, 5, 8)),
                        "k": rng.standard_normal((2, 2, 7, 8)),
                        "v": rng.standard_normal((2, 2, 7, 6))})
config = {"is_causal": True, "causal_alignment": "bottom_right", "kv_group_map": "contiguous"}


def autograd_vjp(forward):
    """Turn a torch forward into the VJP compare_implementation expects."""
    def vjp(dout, q, k, v, **config):
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        out = forward(q, k, v, **config)
        dq, dk, dv = torch.autograd.grad(out, (q, k, v), dout)
        return {"q": dq, "k": dk, "v": dv}
    return vjp

# %% [markdown]
# ## Attempt 1: two convention bugs
#
# This implementation looks reasonable and even agrees with refattn when $N = M$ and
# $H = H_{kv}$. But
#
# 1. it builds the causal mask as `tril(ones(N, M))`, i.e. PyTorch's **top-left** alignment, while
#    we asked for **bottom-right** (flash-attn's and the KV-cache convention: the last query sees
#    every key, query $i$ sees keys $j\le i + M - N$);
# 2. it expands the key/value heads with `k.repeat(1, r, 1, 1)`, which *tiles* them (query head
#    $h$ gets kv head $h \bmod H_{kv}$), while Hugging Face's `repeat_kv`, flash-attn and PyTorch's
#    `enable_gqa` give query head $h$ the kv head $\lfloor h/r\rfloor$ (`repeat_interleave`).

# %%
def attention_v1(q, k, v, *, is_causal=False, causal_alignment="top_left", kv_group_map="contiguous"):
    r = q.shape[1] // k.shape[1]
    k, v = k.repeat(1, r, 1, 1), v.repeat(1, r, 1, 1)            # bug 2: tiles the kv heads
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if is_causal:
        n, m = s.shape[-2:]
        keep = torch.ones(n, m, dtype=torch.bool).tril()         # bug 1: always top-left
        s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


report = compare_implementation(attention_v1, "sdpa", sample=sample, config=config,
                                convert=torch.from_numpy, vjp=autograd_vjp(attention_v1))
print(report)
assert not report.passed

# %% [markdown]
# The forward is already wrong, so every gradient is too. Fixing the mask alone is not enough:

# %%
def attention_v2(q, k, v, *, is_causal=False, causal_alignment="top_left", kv_group_map="contiguous"):
    r = q.shape[1] // k.shape[1]
    k, v = k.repeat(1, r, 1, 1), v.repeat(1, r, 1, 1)            # bug 2 still here
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if is_causal:
        n, m = s.shape[-2:]
        offset = m - n if causal_alignment == "bottom_right" else 0
        keep = torch.ones(n, m, dtype=torch.bool).tril(diagonal=offset)
        s = s.masked_fill(~keep, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


report = compare_implementation(attention_v2, "sdpa", sample=sample, config=config,
                                convert=torch.from_numpy, vjp=autograd_vjp(attention_v2))
print(report)
assert not report.passed

# %% [markdown]
# Interestingly, refattn can confirm the *diagnosis*: the tiled expansion is exactly its
# `kv_group_map="strided"` convention, and under that configuration the same code passes.

# %%
report = compare_implementation(attention_v2, "sdpa", sample=sample,
                                config={**config, "kv_group_map": "strided"},
                                convert=torch.from_numpy, vjp=autograd_vjp(attention_v2))
print(report)
assert report.passed

# %% [markdown]
# ## Attempt 3: a hand-written backward with a bug
#
# Performance code often replaces autograd by a custom `torch.autograd.Function`. Here the forward
# is correct (`repeat_interleave`, bottom-right mask) but the backward drops the
# $-D_i = -dO_i\cdot O_i$ term of the softmax VJP (see
# [tutorial 1](01_softmax_attention_backward.ipynb)). The output matches; the gradients of $q$
# and $k$ do not — `dv` is unaffected, which localises the bug to the softmax.

# %%
def _scores(q, k, causal_alignment, is_causal):
    s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
    if is_causal:
        n, m = s.shape[-2:]
        offset = m - n if causal_alignment == "bottom_right" else 0
        s = s.masked_fill(~torch.ones(n, m, dtype=torch.bool).tril(diagonal=offset), float("-inf"))
    return s


class BuggyAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal, causal_alignment):
        r = q.shape[1] // k.shape[1]
        ke, ve = k.repeat_interleave(r, dim=1), v.repeat_interleave(r, dim=1)
        p = torch.softmax(_scores(q, ke, causal_alignment, is_causal), dim=-1)
        ctx.save_for_backward(q, ke, ve, p)
        ctx.r = r
        return p @ ve

    @staticmethod
    def backward(ctx, dout):
        q, ke, ve, p = ctx.saved_tensors
        scale = q.shape[-1] ** -0.5
        dve = p.transpose(-1, -2) @ dout
        ds = p * (dout @ ve.transpose(-1, -2))                       # bug: "- D" is missing
        dq = scale * ds @ ke
        dke = scale * ds.transpose(-1, -2) @ q
        b, h, m, _ = dke.shape                                        # sum each group of query heads
        dk = dke.reshape(b, h // ctx.r, ctx.r, m, -1).sum(2)
        dv = dve.reshape(b, h // ctx.r, ctx.r, m, -1).sum(2)
        return dq, dk, dv, None, None


def attention_v3(q, k, v, *, is_causal=False, causal_alignment="top_left", kv_group_map="contiguous"):
    return BuggyAttention.apply(q, k, v, is_causal, causal_alignment)


report = compare_implementation(attention_v3, "sdpa", sample=sample, config=config,
                                convert=torch.from_numpy, vjp=autograd_vjp(attention_v3))
print(report)
assert not report.passed

# %% [markdown]
# ## The correct implementation
#
# The fix for the custom backward is one line, `ds = p * (dp - (dout * out).sum(-1, keepdim=True))`;
# here we also check the simplest correct implementation, PyTorch's own
# `F.scaled_dot_product_attention` with `enable_gqa=True` and an explicit bottom-right mask
# (its `is_causal` is top-left, and it refuses `is_causal` together with a mask). We compare in
# float64 and in float32 — `compare_implementation` casts the sample to `dtype` and picks the
# tolerance from the dtype the function returns (float32: the FlashAttention rule, at most twice
# the error of refattn's own float32 computation).

# %%
def attention_torch(q, k, v, *, attn_mask=None, is_causal=False, causal_alignment="top_left",
                    kv_group_map="contiguous"):
    assert kv_group_map == "contiguous", "enable_gqa pairs query head h with kv head h // r"
    n, m = q.shape[-2], k.shape[-2]
    if is_causal:
        offset = m - n if causal_alignment == "bottom_right" else 0
        causal = torch.ones(n, m, dtype=torch.bool).tril(diagonal=offset)
        attn_mask = causal if attn_mask is None else attn_mask & causal
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, enable_gqa=True)


for dtype in (np.float64, np.float32):
    report = compare_implementation(attention_torch, "sdpa", sample=sample, config=config, dtype=dtype,
                                    convert=torch.from_numpy, vjp=autograd_vjp(attention_torch))
    print(report)
    assert report.passed

# %% [markdown]
# ## Many cases at once
#
# One passing sample proves little, so without `sample=` `compare_implementation` runs a
# battery of cases for the slug, each at seeds 0, 1 and 2: the registry sampler's own draw,
# $N < M$, $N > M$, a single decoding query, 6 query heads over 1–3 kv heads, odd sizes, and a
# boolean `attn_mask` with fully masked rows (refattn and PyTorch 2.13 both give 0 there). Here we
# also sweep the configurations the code claims to support:

# %%
for alignment in ("top_left", "bottom_right"):
    for causal in (False, True):
        cfg = {"is_causal": causal, "causal_alignment": alignment, "kv_group_map": "contiguous"}
        rep = compare_implementation(attention_torch, "sdpa", config=cfg,
                                     convert=torch.from_numpy, vjp=autograd_vjp(attention_torch))
        print(f"{cfg}: {'PASS' if rep.passed else 'FAIL'} ({len(rep.results)} runs)")
        assert rep.passed

# %% [markdown]
# The battery catches attempt 2 without a hand-made sample, and finds more than our sample did.
# The runs with grouped kv heads fail (the head pairing), and so does `n_gt_m`: with bottom-right
# alignment and $N > M$ the first $N - M$ queries see no key at all, and attempt 2's explicit
# softmax returns NaN there, where refattn (and flash-attn, and PyTorch's SDPA) return 0 — the
# `got nan, expected 0` entry and the `inf` rows say so. (Attempt 2 takes no `attn_mask`, so we
# leave out the `masked_row` case with `cases=`.)

# %%
rep = compare_implementation(attention_v2, "sdpa", config=config, convert=torch.from_numpy,
                             cases=["sampler", "n_lt_m", "n_gt_m", "decode", "gqa", "odd"])
print(rep)
failed = {r.case for r in rep.failures}
assert {"gqa", "n_gt_m"} <= failed <= {"gqa", "n_gt_m", "sampler"}

# %% [markdown]
# In a pytest suite, `refattn.testing.compare_cases` turns the battery into one test per slug,
# case and seed (`@pytest.mark.parametrize("case", compare_cases("sdpa"), ids=str)` and
# `case.check(fn, vjp=..., convert=...)`); see
# [testing your implementation](../testing-your-implementation.md).
#
# ## Summary
#
# * `compare_implementation(fn, slug, vjp=..., convert=torch.from_numpy, config=...)` returns a
#   report over a battery of cases and seeds: a per-array table with the worst entry, and each
#   failing case with its shapes; `.passed` for asserts. A gradient your vjp does not return is a
#   failure (`grads=` restricts the comparison explicitly).
# * $N\ne M$, GQA and masks are where conventions differ
#   (`causal_alignment`, `kv_group_map`, fully masked rows …; see the
#   [conventions page](../conventions.md)).
# * The same works for every registry slug (`refattn list`): differential attention, Galerkin
#   attention, Performer, …
