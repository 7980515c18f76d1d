r"""DenseFormer: depth-weighted averages (DWA) of all past block outputs after every block.

Pagliardini, Mohtashami, Fleuret, Jaggi, "DenseFormer: Enhancing Information Flow in Transformers
via Depth Weighted Averaging", NeurIPS 2024, arXiv 2402.02622. Upstream: epfml/DenseFormer
``denseformer/denseformer.py`` (``DWAModules``, ``InPlaceSetSlice``) @
c99a623bdb5f6611bf0d37e964c67ecbf15c3c19.

Forward
-------
With the embedding output $X_0 = x$, $L$ blocks $B_0,\dots,B_{L-1}$ (any shape-preserving
sublayer; parameters under ``"blocks.{i}.<key>"``) and the DWA input $Y_0 = X_0$:

$$X_{i+1} = B_i(Y_i),\qquad
Y_{i+1} = \begin{cases}\sum_{p=0}^{m_i-1}\alpha_{i,p}\,X_{r_i + p\,k} & (i+1)\bmod P = 0\\
X_{i+1} & \text{otherwise}\end{cases}$$

with dilation $k$ (``dilation``), period $P$ (``period``), $r_i = (i+1)\bmod k$ and
$m_i = \lfloor (i+1)/k\rfloor + 1$: the average after block $i$ reads only the past outputs whose
depth is congruent to $i+1$ modulo $k$ (upstream keeps one accumulator per residue), and only
every $P$-th block has DWA weights. $\alpha_i$ is ``"dwa_modules.alphas.{i}.weight"`` of shape
$(1, m_i)$ (upstream's bias-free ``nn.Linear(m_i, 1)``), its last entry weighting $X_{i+1}$. The
output is $Y_L$ (upstream then applies ``ln_f`` and the LM head, outside the mechanism). The
$X_j$ averaged are the raw block outputs, not the averaged $Y_j$.

Initialisation (`denseformer_dwa_init`): $\alpha_{i,m_i-1} = 1$, all other weights 0, so at
initialisation $Y_{i+1} = X_{i+1}$ and the DenseFormer is the plain stack of blocks.

Backward
--------
Reverse over the blocks with accumulators $dX_j$ (all zero) and $dY_L$ = ``dout``. For
$i = L-1,\dots,0$: if block $i$ averages,
$d\alpha_{i,p} = \langle dY_{i+1}, X_{r_i+pk}\rangle$ (summed over batch, tokens, channels) and
$dX_{r_i+pk} \mathrel{+}= \alpha_{i,p}\,dY_{i+1}$; otherwise $dX_{i+1} \mathrel{+}= dY_{i+1}$. Every
later step that reads $X_{i+1}$ has run, so $dX_{i+1}$ is complete and
$dY_i = J_{B_i}(Y_i)^\top dX_{i+1}$ (the block's own backward). Finally
$dx = dX_0 + dY_0$, because $X_0 = Y_0 = x$. Forward and backward store all $L+1$ block
outputs, as upstream does (its accumulators are the memory cost of the method).

Conventions
-----------
``block`` (a registry slug, a ``(forward, backward)`` pair or a `refattn.blocks.core.Sublayer`;
default ``"multi_head_attention"``, with ``block_config``). DWA is agnostic to the block:
upstream's models use pre-norm GPT blocks, which are available as e.g. ``"layerscale"`` with unit
gammas or ``"parallel_attention_mlp_block"``-style registry blocks; pass the block you need.
``dilation=1``, ``period=1`` (upstream defaults, the paper's plain DenseFormer; the paper's
"4x5-DenseFormer" is ``dilation=4, period=5``).

Agreement with upstream
-----------------------
``DWAModules`` run in float64 on CPU with ``L`` blocks $B_i(y) = \tanh(yW_i + b_i)$ (the same
blocks on both sides, a refattn ``(forward, backward)`` pair against ``torch.nn.Linear`` +
``tanh``), random DWA weights, for $(L,k,P) \in \{(4,1,1), (6,2,3), (5,3,2)\}$: output and the
gradients of $x$, every $\alpha_i$ and every block parameter agree to $1.1\times10^{-15}$ absolute
($7.3\times10^{-16}$ relative to the largest entry, max over the three configurations).
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_int
from ..registry import Mechanism, Sample, register
from .core import add_grad, add_prefix, block_dtype, init_attention_params, resolve_sublayer, split_block_params

__all__ = ["denseformer_dwa_forward", "denseformer_dwa_backward", "denseformer_dwa", "denseformer_dwa_init",
           "dwa_read_indices"]


def dwa_read_indices(block_idx: int, dilation: int = 1, period: int = 1):
    r"""The depths $j$ whose outputs $X_j$ the DWA after block ``block_idx`` averages, in weight order
    ($r, r+k, \dots, i+1$ with $r = (i+1)\bmod k$), or ``None`` when that block has no DWA
    (``(block_idx + 1) % period != 0``)."""
    i = check_int(block_idx, "block_idx", minimum=0)
    k = check_int(dilation, "dilation", minimum=1)
    p = check_int(period, "period", minimum=1)
    if (i + 1) % p:
        return None
    return list(range((i + 1) % k, i + 2, k))


def denseformer_dwa_init(n_blocks: int, dilation: int = 1, period: int = 1, dtype=np.float64) -> dict:
    r"""DWA weights at initialisation (upstream ``_init_weights``): for every averaging block $i$,
    ``"dwa_modules.alphas.{i}.weight"`` of shape $(1, m_i)$, zero except a 1 on $X_{i+1}$."""
    n = check_int(n_blocks, "n_blocks", minimum=1)
    out = {}
    for i in range(n):
        idx = dwa_read_indices(i, dilation, period)
        if idx is not None:
            w = np.zeros((1, len(idx)), dtype=dtype)
            w[0, -1] = 1.0
            out[f"dwa_modules.alphas.{i}.weight"] = w
    return out


def denseformer_dwa_forward(x, params, *, n_blocks: int, dilation: int = 1, period: int = 1, block=None,
                            block_config=None):
    r"""A DenseFormer stack: $X_{i+1} = B_i(Y_i)$, $Y_{i+1}$ = DWA of the past outputs (module docstring).

    Parameters
    ----------
    x : array (..., N, C)
        The embedding output $X_0$.
    params : dict
        ``"dwa_modules.alphas.{i}.weight" (1, m_i)`` for every averaging block $i$ and block $i$'s
        parameters under ``"blocks.{i}.<key>"``.
    n_blocks : int
        $L$.
    dilation, period : int
        DWA dilation $k$ and period $P$ (upstream's ``dilation``, ``period``; default 1, 1).
    block : str, (forward, backward) or Sublayer, optional
        The block; default ``"multi_head_attention"``.
    block_config : dict, optional
        Its keyword configuration (``{"num_heads": 2}`` ...).

    Returns
    -------
    y, cache
        $Y_L$, of the shape of ``x``.
    """
    x = as_float(x, "x", min_ndim=2)
    n = check_int(n_blocks, "n_blocks", minimum=1)
    k = check_int(dilation, "dilation", minimum=1)
    per = check_int(period, "period", minimum=1)
    blocks = [resolve_sublayer("multi_head_attention" if block is None else block, prefix=f"blocks.{i}",
                               config=block_config, name="block") for i in range(n)]
    reads = [dwa_read_indices(i, k, per) for i in range(n)]
    spec = {f"dwa_modules.alphas.{i}.weight": (1, len(r)) for i, r in enumerate(reads) if r is not None}
    own, subs = split_block_params(params, spec, blocks, where="denseformer_dwa")
    dt = block_dtype(x, own, subs)
    x, own = x.astype(dt, copy=False), cast_all(dt, own)
    subs = [cast_all(dt, s) for s in subs]
    xs, caches, y = [x], [], x
    for i in range(n):
        xi, ci = blocks[i].apply(y, subs[i])
        xs.append(xi)
        caches.append(ci)
        if reads[i] is None:
            y = xi
        else:
            a = own[f"dwa_modules.alphas.{i}.weight"][0]
            y = sum(a[p] * xs[j] for p, j in enumerate(reads[i]))
    if y is xs[-1]:
        y = y.copy()
    cache = {"xs": xs, "caches": caches, "blocks": blocks, "reads": reads, "params": own,
             "shape": x.shape, "dtype": dt}
    return y, cache


def denseformer_dwa_backward(dout, cache):
    r"""Gradients of `denseformer_dwa_forward` for ``x``, every DWA weight and every block
    parameter (``"blocks.{i}.<key>"``), module docstring."""
    g = as_dout(dout, cache["shape"], cache["dtype"])
    xs, reads, own, blocks = cache["xs"], cache["reads"], cache["params"], cache["blocks"]
    n = len(blocks)
    dxs = [None] * (n + 1)
    grads = {}

    def acc(j, v):
        dxs[j] = v if dxs[j] is None else dxs[j] + v

    dy = g
    for i in range(n - 1, -1, -1):
        if reads[i] is None:
            acc(i + 1, dy)
        else:
            key = f"dwa_modules.alphas.{i}.weight"
            a = own[key][0]
            ga = np.array([[np.sum(dy * xs[j]) for j in reads[i]]], dtype=cache["dtype"])
            add_grad(grads, key, ga)
            for p, j in enumerate(reads[i]):
                acc(j, a[p] * dy)
        dy = blocks[i].vjp(dxs[i + 1], cache["caches"][i], grads)
    grads["x"] = dy if dxs[0] is None else dxs[0] + dy
    return grads


def denseformer_dwa(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of `denseformer_dwa_forward`."""
    return denseformer_dwa_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _tanh_forward(x, params):
    z = x @ params["weight"] + params["bias"]
    t = np.tanh(z)
    return t, (x, params, t)


def _tanh_backward(dy, cache):
    x, p, t = cache
    dz = dy * (1.0 - t * t)
    lead = tuple(range(dz.ndim - 1))
    c = x.shape[-1]
    return {"x": dz @ p["weight"].T, "weight": x.reshape(-1, c).T @ dz.reshape(-1, dz.shape[-1]),
            "bias": dz.sum(axis=lead)}


def _random_params(rng, n, c, k, per, block):
    p = {key: w + 0.3 * rng.standard_normal(w.shape) for key, w in denseformer_dwa_init(n, k, per).items()}
    cfg = {}
    for i in range(n):
        if block == "tanh":
            p[f"blocks.{i}.weight"] = rng.standard_normal((c, c)) / np.sqrt(c)
            p[f"blocks.{i}.bias"] = 0.2 * rng.standard_normal(c)
        else:
            ap, cfg = init_attention_params(rng, block, c, 1)
            p.update(add_prefix(ap, f"blocks.{i}"))
    return p, cfg


def _config(block, cfg, n, k, per):
    spec = (_tanh_forward, _tanh_backward) if block == "tanh" else block
    return {"n_blocks": n, "dilation": k, "period": per, "block": spec, "block_config": cfg or None}


def _sample(rng, size):
    if size == "tiny":
        n, k, per, c, t = 3, int(rng.integers(1, 3)), int(rng.integers(1, 3)), 2, 2
        block = "tanh"
    else:
        n, k, per, c, t = 5, int(rng.integers(1, 4)), int(rng.integers(1, 3)), 4, 3
        block = str(rng.choice(["tanh", "multi_head_attention"]))
    p, cfg = _random_params(rng, n, c, k, per, block)
    return Sample(inputs={"x": rng.standard_normal((2, t, c))}, params=p, config=_config(block, cfg, n, k, per))


def _reference(x, params, n_blocks, dilation=1, period=1, block=None, block_config=None):
    # Dense form: every Y_{i+1} as a weighted sum over ALL past outputs with a full (i+2)-vector of
    # weights that is zero off the dilation residue class (the paper's alpha_{i,j} matrix).
    sub = resolve_sublayer("multi_head_attention" if block is None else block, prefix="b", config=block_config,
                           name="block")
    xs, y = [x], x
    for i in range(n_blocks):
        pi = {k[len(f"blocks.{i}."):]: v for k, v in params.items() if k.startswith(f"blocks.{i}.")}
        xs.append(sub.apply(y, pi)[0])
        full = np.zeros(i + 2)
        if (i + 1) % period == 0:
            w = params[f"dwa_modules.alphas.{i}.weight"][0]
            full[[j for j in range(i + 2) if j % dilation == (i + 1) % dilation]] = w
        else:
            full[i + 1] = 1.0
        y = np.tensordot(full, np.stack(xs), axes=1)
    return y


def _check_init_is_plain_stack(rng):
    # The catalogue identity: at initialisation the DenseFormer is the plain stack of blocks, and
    # dx is the plain chain's gradient.
    n, c = 4, 3
    for k, per in ((1, 1), (2, 3)):
        p, _ = _random_params(rng, n, c, k, per, "tanh")
        p.update(denseformer_dwa_init(n, k, per))
        x = rng.standard_normal((2, 3, c))
        y, cache = denseformer_dwa_forward(x, p, **_config("tanh", {}, n, k, per))
        z, chain = x, []
        for i in range(n):
            z, ci = _tanh_forward(z, {"weight": p[f"blocks.{i}.weight"], "bias": p[f"blocks.{i}.bias"]})
            chain.append(ci)
        dy = rng.standard_normal(y.shape)
        g, dz = denseformer_dwa_backward(dy, cache), dy
        for i in range(n - 1, -1, -1):
            dz = _tanh_backward(dz, chain[i])["x"]
        err = max(float(np.abs(y - z).max()), float(np.abs(g["x"] - dz).max()))
        assert err < 1e-14, f"DWA at init is not the plain stack: {err}"
    return err


def _check_weight_shapes(rng):
    # Upstream's nn.Linear((i+1+dilation)//dilation, 1) sizes, and None where (i+1) % period != 0.
    err = 0.0
    for n, k, per in ((12, 1, 1), (12, 4, 5), (7, 3, 2)):
        got = {int(key.split(".")[2]): w.shape for key, w in denseformer_dwa_init(n, k, per).items()}
        want = {i: (1, (i + 1 + k) // k) for i in range(n) if (i + 1) % per == 0}
        assert got == want, (n, k, per, got, want)
    return err


register(
    Mechanism(
        slug="denseformer_dwa", family="5-building-blocks", tier="T2",
        title="DenseFormer: depth-weighted average of all past block outputs after each block (dilation, period)",
        paper="Pagliardini, Mohtashami, Fleuret, Jaggi, DenseFormer: Enhancing Information Flow in Transformers "
              "via Depth Weighted Averaging, NeurIPS 2024, arXiv 2402.02622",
        forward=denseformer_dwa_forward, backward=denseformer_dwa_backward, sample=_sample, reference=_reference,
        docs="blocks/residual-and-linear.md#denseformer-depth-weighted-average",
        checks={"init_is_plain_stack": _check_init_is_plain_stack, "weight_shapes": _check_weight_shapes},
    ),
)
