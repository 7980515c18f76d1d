r"""VCC: VIP-token centric compression around one transformer layer.

Zeng, Hawkins, Hong, Zhang, Pappas, Singh, Zheng, "VCC: Scaling Transformers to 128K Tokens or More
by Prioritizing Important Tokens", NeurIPS 2023, arXiv 2305.04241. Follows mlpen/VCC
@``356f8066c0df714eacfc15317cbf4d5d9acd9416``: ``src/roberta/models/vcc.py`` (``WeightedAttention``,
``VccEncoderLayer``) and ``src/roberta/models/mra_projection/`` (``formatter.py``, ``coarser.py``,
``selector.py``, ``finer.py``).

The layer (one ``VccEncoderLayer`` between ``Formatter.to_vcc_input`` and ``from_vcc_input``)
------------------------------------------------------------------------------------------
Tokens $X\in\mathbb R^{N\times C}$ with a 0/1 ``importance_mask``; a stable sort puts the VIP tokens first
and the first $r$ (``num_important_tokens``) sorted tokens are kept uncompressed, the remaining
$N - r = n_bb$ tokens are cut (in their original order) into $n_b$ blocks of $b$ (``block_size``).

1. **Coarsen** (``Coarser``): $c_J = \sum_{j\in J}x_j/(b + 10^{-4})$ (upstream's ``+1e-4``).
2. **Select** (``attention_based_selector``, evaluation mode): the layer's own attention of the
   layer-normalised VIP tokens (queries) on the layer-normalised coarse tokens (keys),
   $P = \mathrm{softmax}(QK^\top/\sqrt d)$, averaged over heads and (importance-masked) over the $r$
   queries: $\bar p_J$. The ``num_fine_blocks`` $m$ blocks of largest $\bar p_J$ are decompressed
   (their $b$ tokens are used as they are), the other $n_b - m$ stay coarse. Block scores
   $\pi = \mathrm{softmax}(\log(\bar p + 10^{-5}))$ enter as straight-through factors
   $\sigma_J = 1 + \pi_J - \mathrm{sg}(\pi_J)$ (fine) and $1 + (1-\pi_J) - \mathrm{sg}(1-\pi_J)$
   (coarse): exactly 1 in value.
3. **Run the layer** on the compressed sequence $S = CX$ = [fine tokens; coarse tokens; VIP tokens]
   ($M = mb + n_b - m + r$ rows), with per-key log weights: pre-norm ``WeightedAttention``
   $A = \mathrm{softmax}(QK^\top/\sqrt d + \log(\sigma + 10^{-4}) + \log(\nu + 10^{-4}))V\,W_O$, where
   $\nu = b$ for a coarse token (it stands for $b$ tokens: ``scale_correction``) and 1 otherwise,
   then $f(S) = S + (\mathrm{FFN}(A + S) + A)\odot\sigma$ (``VccEncoderLayer.encode``; FFN = LayerNorm,
   Linear, GELU, Linear).
4. **Decompress** (``Coarser`` then ``Finer`` of ``from_vcc_input``): VIP and decompressed tokens take
   their new states; a token $j$ of a coarse block $J$ becomes $x_j + f(S)_J - c_J$ (the difference
   cache keeps $c_J - x_j$). Together:

$$X' = X + D\,\big(f(CX) - CX\big)$$

with $C$ ($M\times N$) the selection-dependent compression and $D$ ($N\times M$) the one-hot map of
every token to the compressed row it is represented by — the paper's update, and the record's
explicit reference (dense $C$, $D$ from a brute-force block ranking, the layer by loops). With
$m = n_b$ nothing is compressed and the layer is the plain pre-norm transformer layer (named check).

Backward
--------
The ranking (the sort of $\bar p$) is held fixed. Through $D$ and $C$ (one-hot gathers, and the block
sum for $c_J$), the pre-norm layer (LayerNorm, projections, the attention core with its key-bias
gradient, GELU), and the factors $\sigma$: they appear in the key bias ($d\sigma \mathrel{+}=
d\mathrm{bias}/(\sigma + 10^{-4})$) and in the gated residual ($d\sigma \mathrel{+}=
\sum_c g\odot(\mathrm{FFN} + A)$). ``score_gradient="straight_through"`` (upstream, default) passes
$d\sigma$ on to $\pi$ ($+$ for fine blocks, $-$ for coarse ones), then through the block softmax,
the averages and the selector attention to the VIP tokens, the coarse tokens, the LayerNorm and the
query/key projections; ``"exact"`` is the true derivative of the forward, in which $\sigma \equiv 1$.
``score_anchor`` (the value of $\mathrm{sg}(\pi)$, default the current $\pi$) evaluates the
straight-through surrogate away from its anchor; its finite differences at the anchor equal the
straight-through gradient (named check).

Conventions and what is not implemented
---------------------------------------
Parameter names as ``VccEncoderLayer``'s state dict: ``attention.LayerNorm.{weight,bias}``,
``attention.{query,key,value,dense}.{weight,bias}`` (torch ``weight.T``), ``FFN.0.{weight,bias}``
(LayerNorm), ``FFN.1`` and ``FFN.3`` (the two Linear layers). ``layer_norm_eps`` 1e-5. Not
implemented: the padding mask (all tokens valid), the training-time exploration (with probability
``explore_prob`` a random block ranking), the ``"random"`` selector, dropout, position ids, and the
multi-layer state (a stack keeps the difference cache between VCC layers: a single layer is the unit
here). Upstream runs the decompressed tokens as $c_J - (c_J - x_j)$; here $x_j$ directly (equal up to
round-off, identical gradients).

Agreement with upstream: ``Formatter``, ``Coarser``, ``Selector`` (evaluation mode), ``Finer``,
``WeightedAttention`` and ``VccEncoderLayer`` run from the repository files (CPU, dropout 0;
upstream casts attention and the coarse sums to float32 with ``.float()``, changed to float64 for
the comparison), 8 configurations ($r$ = 2, 3 with VIP and filler tokens, $b$ = 2, 3, $m$ = 1, 2,
with and without ``scale_correction``): output 5.3e-15, every gradient (upstream's autograd, i.e.
straight-through scores) <= 1.6e-15 relative; the ``attention.key.bias`` gradient is analytically
zero (round-off on both sides).
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_choice, check_int, check_params, check_positive, compute_dtype
from ...nn.activations import gelu, gelu_grad
from ...nn.linear import linear_prefixed, linear_prefixed_vjp, merge_heads, split_heads
from ...nn.norms import normalize_backward, normalize_forward
from ...nn.softmax import softmax_lse, softmax_vjp
from ...registry import Mechanism, Sample, register
from ..softmax.core import attention_core_backward, attention_core_forward

__all__ = ["VCC_SCORE_GRADIENTS", "vcc_sort_tokens", "vcc_block_relevance", "vcc_layer_forward",
           "vcc_layer_backward", "vcc_layer"]

VCC_SCORE_GRADIENTS = ("straight_through", "exact")
_COUNT_EPS = 1e-4   # Coarser: sum / (count + 1e-4)
_SCORE_EPS = 1e-4   # WeightedAttention: log(scores + 1e-4), log(num_dups + 1e-4)
_PROB_EPS = 1e-5    # Selector: log(mean prob + 1e-5)


def vcc_sort_tokens(importance_mask: np.ndarray) -> np.ndarray:
    """``Formatter``'s order: a stable descending sort of the 0/1 ``importance_mask (B, N)``."""
    return np.argsort(-np.asarray(importance_mask, dtype=np.int64), axis=-1, kind="stable")


def _ln(x, p, prefix, eps):
    xhat, stats = normalize_forward(x, (x.ndim - 1,), eps)
    return xhat * p[f"{prefix}.weight"] + p[f"{prefix}.bias"], (xhat, stats, prefix)


def _ln_vjp(dy, st, p, grads):
    xhat, stats, prefix = st
    for k, v in ((f"{prefix}.weight", np.sum(dy * xhat, axis=tuple(range(dy.ndim - 1)))),
                 (f"{prefix}.bias", np.sum(dy, axis=tuple(range(dy.ndim - 1))))):
        grads[k] = grads[k] + v if k in grads else v
    return normalize_backward(dy * p[f"{prefix}.weight"], xhat, stats)


def vcc_block_relevance(vip, coarse, imp, p, num_heads, eps=1e-5):
    r"""The selector: head- and VIP-averaged attention $\bar p$ ``(B, n_b)`` of the layer-normalised VIP
    tokens on the layer-normalised coarse tokens (unvalidated). Returns ``(pbar, state)``."""
    hv, sv = _ln(vip, p, "attention.LayerNorm", eps)
    hc, sc = _ln(coarse, p, "attention.LayerNorm", eps)
    qh = split_heads(linear_prefixed(p, "attention.query", hv), num_heads)
    kh = split_heads(linear_prefixed(p, "attention.key", hc), num_heads)
    probs, _ = softmax_lse((qh @ np.swapaxes(kh, -1, -2)) / np.sqrt(qh.shape[-1]), axis=-1)  # (B, H, r, nb)
    pbar = np.mean(np.mean(probs, axis=1) * imp[:, :, None], axis=1)
    return pbar, (hv, sv, hc, sc, qh, kh, probs)


def _validate(x, params, importance_mask, num_important_tokens, block_size, num_fine_blocks, num_heads,
              scale_correction, score_gradient, score_anchor, layer_norm_eps):
    x = as_float(x, "x", ndim=3)
    b_, n, c = x.shape
    r = check_int(num_important_tokens, "num_important_tokens", minimum=1)
    bs = check_int(block_size, "block_size", minimum=1)
    h = check_int(num_heads, "num_heads", minimum=1)
    if r >= n or (n - r) % bs:
        raise ValueError(f"x has N={n} tokens (axis 1): N - num_important_tokens ({n} - {r}) must be a positive "
                         f"multiple of block_size={bs}")
    nb = (n - r) // bs
    m = check_int(num_fine_blocks, "num_fine_blocks", minimum=0)
    if m > nb:
        raise ValueError(f"num_fine_blocks={m} exceeds the number of blocks {nb} = (N - num_important_tokens) / block_size")
    imp = np.asarray(importance_mask)
    if imp.dtype != np.bool_:
        raise TypeError(f"importance_mask must be a boolean array (True = VIP token); got dtype {imp.dtype}")
    if imp.shape != (b_, n):
        raise ValueError(f"importance_mask must have x's (batch, tokens) shape {(b_, n)}; got {imp.shape}")
    if c % h:
        raise ValueError(f"the embedding size of x ({c}, axis -1) must be a multiple of num_heads={h}")
    if not isinstance(scale_correction, (bool, np.bool_)):
        raise TypeError(f"scale_correction must be a bool; got {type(scale_correction).__name__}")
    check_choice(score_gradient, "score_gradient", VCC_SCORE_GRADIENTS)
    eps = check_positive(layer_norm_eps, "layer_norm_eps")
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of arrays; got {type(params).__name__}")
    f1 = np.shape(params.get("FFN.1.weight", ()))
    if len(f1) != 2:
        raise ValueError(f"params['FFN.1.weight'] must be (C, intermediate); got {f1}")
    inter = f1[1]
    spec = {"attention.LayerNorm.weight": (c,), "attention.LayerNorm.bias": (c,)}
    for nm in ("query", "key", "value", "dense"):
        spec[f"attention.{nm}.weight"], spec[f"attention.{nm}.bias"] = (c, c), (c,)
    spec.update({"FFN.0.weight": (c,), "FFN.0.bias": (c,), "FFN.1.weight": (c, inter), "FFN.1.bias": (inter,),
                 "FFN.3.weight": (inter, c), "FFN.3.bias": (c,)})
    p = check_params(params, spec, where="vcc_layer")
    dt = compute_dtype(x, *p.values())
    if score_anchor is not None:
        score_anchor = as_float(score_anchor, "score_anchor", ndim=2)
        if score_anchor.shape != (b_, nb):
            raise ValueError(f"score_anchor must be (B, n_blocks) = {(b_, nb)}; got {score_anchor.shape}")
        score_anchor = score_anchor.astype(dt, copy=False)
    return x.astype(dt, copy=False), cast_all(dt, p), imp, r, bs, nb, m, h, eps, score_anchor


def vcc_layer_forward(x, params, *, importance_mask, num_important_tokens: int, block_size: int,
                      num_fine_blocks: int, num_heads: int, scale_correction: bool = True,
                      score_gradient: str = "straight_through", score_anchor=None, layer_norm_eps: float = 1e-5):
    r"""One VCC layer: compress the non-VIP tokens, run the pre-norm transformer layer on the compressed
    sequence, decompress (module docstring).

    Parameters
    ----------
    x : (B, N, C)
    params : dict
        ``VccEncoderLayer``'s parameters (module docstring; Linear weights ``(in, out)``).
    importance_mask : bool (B, N)
        True for the VIP tokens.
    num_important_tokens : int
        $r$: tokens kept uncompressed (the VIP tokens first, then filler in order).
    block_size, num_fine_blocks : int
        $b$ and $m$; ``N - r`` must be a multiple of ``b``.
    num_heads : int
    scale_correction : bool
        Add $\log(\nu + 10^{-4})$ to the keys (a coarse token counts $b$ times; upstream configs: True).
    score_gradient : {"straight_through", "exact"}
        The backward of the score factors (module docstring).
    score_anchor : (B, n_b) array, optional
        $\mathrm{sg}(\pi)$ per block (block order); default the current $\pi$ (factors exactly 1).
    layer_norm_eps : float

    Returns
    -------
    out : (B, N, C), cache
    """
    x, p, imp, r, bs, nb, m, h, eps, anchor = _validate(
        x, params, importance_mask, num_important_tokens, block_size, num_fine_blocks, num_heads,
        scale_correction, score_gradient, score_anchor, layer_norm_eps)
    bsz, n, c = x.shape
    order = vcc_sort_tokens(imp)
    xs = np.take_along_axis(x, order[..., None], axis=1)
    imp_vip = np.take_along_axis(imp, order, axis=1)[:, :r].astype(x.dtype)
    vip, rest = xs[:, :r], xs[:, r:].reshape(bsz, nb, bs, c)
    coarse = rest.sum(axis=2) / (bs + _COUNT_EPS)
    pbar, sel_st = vcc_block_relevance(vip, coarse, imp_vip, p, h, eps)
    blocks = np.argsort(-np.log(pbar + _PROB_EPS), axis=-1, kind="stable")
    fine, crs = blocks[:, :m], blocks[:, m:]
    z = np.sum(pbar + _PROB_EPS, axis=-1, keepdims=True)
    pi = (pbar + _PROB_EPS) / z  # softmax(log(pbar + 1e-5)), block order
    anc = pi if anchor is None else anchor
    is_fine = np.zeros((bsz, nb), dtype=bool)
    np.put_along_axis(is_fine, fine, True, axis=1)
    sig_blk = np.where(is_fine, 1.0 + pi - anc, 1.0 + (1.0 - pi) - (1.0 - anc))  # exactly 1 at the anchor
    xf = np.take_along_axis(rest, fine[:, :, None, None], axis=1).reshape(bsz, m * bs, c)
    xc = np.take_along_axis(coarse, crs[:, :, None], axis=1)
    seq = np.concatenate([xf, xc, vip], axis=1)  # (B, M, C)
    sig = np.concatenate([np.repeat(np.take_along_axis(sig_blk, fine, axis=1), bs, axis=1),
                          np.take_along_axis(sig_blk, crs, axis=1), np.ones((bsz, r))], axis=1).astype(x.dtype)
    dups = np.concatenate([np.ones(m * bs), np.full(nb - m, float(bs)), np.ones(r)])
    kbias = np.log(sig + _SCORE_EPS)
    if scale_correction:
        kbias = kbias + np.log(dups + _SCORE_EPS)
    # pre-norm WeightedAttention + FFN, gated residual (VccEncoderLayer.encode)
    hh, ln1 = _ln(seq, p, "attention.LayerNorm", eps)
    q, k, v = (split_heads(linear_prefixed(p, f"attention.{nm}", hh), h) for nm in ("query", "key", "value"))
    ctx, core = attention_core_forward(q, k, v, kbias[:, None, None, :].astype(x.dtype))
    merged = merge_heads(ctx)
    att = linear_prefixed(p, "attention.dense", merged)
    fin = att + seq
    hf, ln2 = _ln(fin, p, "FFN.0", eps)
    u1 = linear_prefixed(p, "FFN.1", hf)
    a1 = gelu(u1)
    ffn = linear_prefixed(p, "FFN.3", a1)
    fseq = seq + (ffn + att) * sig[:, :, None]
    # decompress: X' = X + D (f(S) - S), back to the original token order
    delta = fseq - seq
    dfine = delta[:, :m * bs].reshape(bsz, m, bs, c)
    dcoarse = delta[:, m * bs:m * bs + nb - m]
    rest_new = rest.copy()
    np.put_along_axis(rest_new, fine[:, :, None, None], np.take_along_axis(rest, fine[:, :, None, None], axis=1) + dfine,
                      axis=1)
    np.put_along_axis(rest_new, crs[:, :, None, None], np.take_along_axis(rest, crs[:, :, None, None], axis=1)
                      + dcoarse[:, :, None, :], axis=1)
    out_sorted = np.concatenate([fseq[:, m * bs + nb - m:], rest_new.reshape(bsz, nb * bs, c)], axis=1)
    out = np.empty_like(out_sorted)
    np.put_along_axis(out, order[..., None], out_sorted, axis=1)
    cache = {"p": p, "h": h, "bs": bs, "nb": nb, "m": m, "r": r, "order": order, "imp_vip": imp_vip, "fine": fine,
             "crs": crs, "is_fine": is_fine, "pbar": pbar, "pi": pi, "z": z, "sel_st": sel_st, "sig": sig, "seq": seq,
             "ln1": ln1, "ln2": ln2, "hh": hh, "core": core, "merged": merged, "att": att, "ffn": ffn, "hf": hf,
             "u1": u1, "a1": a1, "straight": score_gradient == "straight_through", "x_shape": x.shape,
             "dtype": x.dtype}
    return out, cache


def vcc_layer_backward(dout, cache):
    r"""Gradients ``{"x"}`` and of every params key of `vcc_layer_forward` (ranking held fixed; the score
    factors per ``score_gradient``; module docstring)."""
    p, h, bs, nb, m, r = cache["p"], cache["h"], cache["bs"], cache["nb"], cache["m"], cache["r"]
    bsz, n, c = cache["x_shape"]
    order, fine, crs = cache["order"], cache["fine"], cache["crs"]
    g = as_dout(dout, cache["x_shape"], cache["dtype"])
    gs = np.take_along_axis(g, order[..., None], axis=1)
    g_vip, g_rest = gs[:, :r], gs[:, r:].reshape(bsz, nb, bs, c)
    grads: dict = {}
    # X' = X + D (f(S) - S): dX = g, dS_out = D^T g, dS = -D^T g
    dfs = np.concatenate([np.take_along_axis(g_rest, fine[:, :, None, None], axis=1).reshape(bsz, m * bs, c),
                          np.take_along_axis(g_rest, crs[:, :, None, None], axis=1).sum(axis=2), g_vip], axis=1)
    drest = g_rest.copy()
    dvip = g_vip.copy()
    # f(S) - S = (ffn + att) * sig: the identity parts of f(S) and -S cancel
    sig = cache["sig"]
    dseq = np.zeros_like(dfs)
    dgate = dfs * sig[:, :, None]
    dsig = np.sum(dfs * (cache["ffn"] + cache["att"]), axis=-1)
    da1 = linear_prefixed_vjp(grads, p, "FFN.3", dgate, cache["a1"])
    dhf = linear_prefixed_vjp(grads, p, "FFN.1", da1 * gelu_grad(cache["u1"]), cache["hf"])
    dfin = _ln_vjp(dhf, cache["ln2"], p, grads)
    datt = dgate + dfin
    dseq += dfin
    dmerged = linear_prefixed_vjp(grads, p, "attention.dense", datt, cache["merged"])
    dcore = attention_core_backward(split_heads(dmerged, h), cache["core"])
    dsig += np.sum(dcore["bias"], axis=(1, 2)) / (sig + _SCORE_EPS)
    dhh = sum(linear_prefixed_vjp(grads, p, f"attention.{nm}", merge_heads(dcore[key]), cache["hh"])
              for nm, key in (("query", "q"), ("key", "k"), ("value", "v")))
    dseq += _ln_vjp(dhh, cache["ln1"], p, grads)
    # S = [fine tokens; coarse tokens; VIP tokens]
    np.put_along_axis(drest, fine[:, :, None, None], np.take_along_axis(drest, fine[:, :, None, None], axis=1)
                      + dseq[:, :m * bs].reshape(bsz, m, bs, c), axis=1)
    dcoarse = np.zeros((bsz, nb, c), dtype=g.dtype)
    np.put_along_axis(dcoarse, crs[:, :, None], dseq[:, m * bs:m * bs + nb - m], axis=1)
    dvip += dseq[:, m * bs + nb - m:]
    if cache["straight"]:
        # sigma = 1 + pi - sg(pi) (fine) or 1 + (1 - pi) - sg(1 - pi) (coarse)
        dsig_blk = np.zeros((bsz, nb), dtype=g.dtype)
        np.put_along_axis(dsig_blk, fine, dsig[:, :m * bs].reshape(bsz, m, bs).sum(-1), axis=1)
        np.put_along_axis(dsig_blk, crs, dsig[:, m * bs:m * bs + nb - m], axis=1)
        dpi = np.where(cache["is_fine"], dsig_blk, -dsig_blk)
        pi = cache["pi"]
        dpbar = (dpi - np.sum(dpi * pi, axis=-1, keepdims=True)) / cache["z"]
        hv, sv, hc, sc, qh, kh, probs = cache["sel_st"]
        dprobs = np.broadcast_to((dpbar[:, None, :] * cache["imp_vip"][:, :, None] / (r * h))[:, None], probs.shape)
        dsc = softmax_vjp(probs, dprobs) / np.sqrt(qh.shape[-1])
        dqh, dkh = dsc @ kh, np.swapaxes(dsc, -1, -2) @ qh
        dhv = linear_prefixed_vjp(grads, p, "attention.query", merge_heads(dqh), hv)
        dhc = linear_prefixed_vjp(grads, p, "attention.key", merge_heads(dkh), hc)
        dvip += _ln_vjp(dhv, sv, p, grads)
        dcoarse += _ln_vjp(dhc, sc, p, grads)
    drest += (dcoarse / (bs + _COUNT_EPS))[:, :, None, :]
    dxs = np.concatenate([dvip, drest.reshape(bsz, nb * bs, c)], axis=1)
    dx = np.empty_like(dxs)
    np.put_along_axis(dx, order[..., None], dxs, axis=1)
    grads["x"] = dx
    return grads


def vcc_layer(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of `vcc_layer_forward`."""
    return vcc_layer_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _erf(a):
    from math import erf

    return np.vectorize(erf)(a)


def _plain_layer(seq, p, num_heads, kbias, eps):
    """The pre-norm layer on rows ``seq (M, C)`` with key bias ``kbias (M,)``, by explicit formulas."""
    def ln(z, pre):
        mu = z.mean(-1, keepdims=True)
        var = ((z - mu) ** 2).mean(-1, keepdims=True)
        return (z - mu) / np.sqrt(var + eps) * p[f"{pre}.weight"] + p[f"{pre}.bias"]

    def lin(z, pre):
        return z @ p[f"{pre}.weight"] + p[f"{pre}.bias"]

    hh = ln(seq, "attention.LayerNorm")
    q, k, v = (lin(hh, f"attention.{nm}") for nm in ("query", "key", "value"))
    d = q.shape[-1] // num_heads
    heads = []
    for i in range(num_heads):
        sl = slice(i * d, (i + 1) * d)
        sc = q[:, sl] @ k[:, sl].T / np.sqrt(d) + kbias[None, :]
        w = np.exp(sc - sc.max(1, keepdims=True))
        heads.append((w / w.sum(1, keepdims=True)) @ v[:, sl])
    att = lin(np.concatenate(heads, 1), "attention.dense")
    u = lin(ln(att + seq, "FFN.0"), "FFN.1")
    return seq + lin(0.5 * u * (1.0 + _erf(u / np.sqrt(2.0))), "FFN.3") + att


def _reference(x, params, *, importance_mask, num_important_tokens, block_size, num_fine_blocks, num_heads,
               scale_correction=True, score_gradient="straight_through", score_anchor=None, layer_norm_eps=1e-5):
    """X' = X + D (f(CX) - CX) with explicit C, D from a Python sort of the block relevance (anchor:
    the scores are exactly 1)."""
    bsz, n, c = x.shape
    r, b, m = num_important_tokens, block_size, num_fine_blocks
    nb = (n - r) // b
    out = np.zeros_like(x)
    for bi in range(bsz):
        order = sorted(range(n), key=lambda t: (not importance_mask[bi, t], t))
        vip, rest = order[:r], order[r:]
        blocks = [rest[j * b:(j + 1) * b] for j in range(nb)]
        coarse = np.array([x[bi, blk].sum(0) / (b + 1e-4) for blk in blocks])
        imp = np.array([float(importance_mask[bi, t]) for t in vip])
        pbar = np.zeros(nb)
        for i, t in enumerate(vip):  # the selector attention, one VIP token at a time
            def ln(z):
                return ((z - z.mean(-1, keepdims=True)) / np.sqrt(z.var(-1, keepdims=True) + layer_norm_eps)
                        * params["attention.LayerNorm.weight"] + params["attention.LayerNorm.bias"])
            qv = ln(x[bi, t]) @ params["attention.query.weight"] + params["attention.query.bias"]
            kc = ln(coarse) @ params["attention.key.weight"] + params["attention.key.bias"]
            d = c // num_heads
            for hh in range(num_heads):
                sl = slice(hh * d, (hh + 1) * d)
                sc = kc[:, sl] @ qv[sl] / np.sqrt(d)
                w = np.exp(sc - sc.max())
                pbar += imp[i] * w / w.sum() / (num_heads * r)
        ranked = sorted(range(nb), key=lambda j: -np.log(pbar[j] + 1e-5))
        fine, crs = ranked[:m], ranked[m:]
        rows = ([("token", [t]) for j in fine for t in blocks[j]] + [("block", blocks[j]) for j in crs]
                + [("token", [t]) for t in vip])
        cmat = np.zeros((len(rows), n))
        dmat = np.zeros((n, len(rows)))
        dups = []
        for ri, (kind, toks) in enumerate(rows):
            cmat[ri, toks] = 1.0 if kind == "token" else 1.0 / (b + 1e-4)
            dups.append(1.0 if kind == "token" else float(b))
            dmat[toks, ri] = 1.0
        s_rows = cmat @ x[bi]
        kb = np.log(np.ones(len(rows)) + 1e-4) + (np.log(np.array(dups) + 1e-4) if scale_correction else 0.0)
        out[bi] = x[bi] + dmat @ (_plain_layer(s_rows, params, num_heads, kb, layer_norm_eps) - s_rows)
    return out


def _init_params(rng, c, inter):
    p = {"attention.LayerNorm.weight": 1.0 + 0.1 * rng.standard_normal(c),
         "attention.LayerNorm.bias": 0.1 * rng.standard_normal(c),
         "FFN.0.weight": 1.0 + 0.1 * rng.standard_normal(c), "FFN.0.bias": 0.1 * rng.standard_normal(c),
         "FFN.1.weight": rng.standard_normal((c, inter)) / np.sqrt(c), "FFN.1.bias": 0.1 * rng.standard_normal(inter),
         "FFN.3.weight": rng.standard_normal((inter, c)) / np.sqrt(inter), "FFN.3.bias": 0.1 * rng.standard_normal(c)}
    for nm in ("query", "key", "value", "dense"):
        p[f"attention.{nm}.weight"] = 1.5 * rng.standard_normal((c, c)) / np.sqrt(c)
        p[f"attention.{nm}.bias"] = 0.1 * rng.standard_normal(c)
    return p


def _ranking_margin(x, p, cfg):
    """The smallest gap between the m-th and (m+1)-th block relevance logits (the ranking's stability)."""
    order = vcc_sort_tokens(cfg["importance_mask"])
    r, b, m = cfg["num_important_tokens"], cfg["block_size"], cfg["num_fine_blocks"]
    xs = np.take_along_axis(x, order[..., None], axis=1)
    nb = (x.shape[1] - r) // b
    imp = np.take_along_axis(cfg["importance_mask"], order, axis=1)[:, :r].astype(float)
    coarse = xs[:, r:].reshape(x.shape[0], nb, b, -1).sum(2) / (b + _COUNT_EPS)
    pbar, _ = vcc_block_relevance(xs[:, :r], coarse, imp, p, cfg["num_heads"])
    lg = -np.sort(-np.log(pbar + _PROB_EPS), axis=-1)
    if m == 0 or m == nb:
        return np.inf
    return float(np.min(lg[:, m - 1] - lg[:, m]))


def _draw(rng, size, m=None, score_gradient="exact", anchor=False):
    c, h, inter = (4, 2, 4) if size == "tiny" else (8, 2, 12)
    r, b, nb = (2, 2, 3) if size == "tiny" else (int(rng.integers(2, 4)), int(rng.integers(2, 4)), 4)
    n = r + nb * b
    m = (1 if size == "tiny" else int(rng.integers(1, 3))) if m is None else m
    p = _init_params(rng, c, inter)
    for _ in range(2000):
        x = rng.standard_normal((2, n, c))
        imp = np.zeros((2, n), dtype=bool)
        for bi in range(2):
            nvip = int(rng.integers(1, r + 1))  # fewer VIP tokens than r: non-VIP filler is kept too
            imp[bi, rng.choice(n, nvip, replace=False)] = True
        cfg = {"importance_mask": imp, "num_important_tokens": r, "block_size": b, "num_fine_blocks": m,
               "num_heads": h, "scale_correction": bool(rng.integers(0, 2)), "score_gradient": score_gradient}
        if _ranking_margin(x, p, cfg) >= 0.05:
            break
    if anchor:
        cfg["score_anchor"] = vcc_layer_forward(x, p, **cfg)[1]["pi"].copy()
    return Sample(inputs={"x": x}, params=p, config=cfg)


def _sample(rng, size):
    return _draw(rng, size)


def _check_no_compression_is_plain_layer(rng):
    """m = n_b (every block decompressed): the VCC layer is the plain pre-norm transformer layer on X."""
    s = _draw(rng, "small", m=4)
    x, p, cfg = s.inputs["x"], s.params, s.config
    out = vcc_layer(x, p, **cfg)
    kb = np.full(x.shape[1], np.log(1.0 + 1e-4) * (2.0 if cfg["scale_correction"] else 1.0))
    want = np.stack([_plain_layer(x[i], p, cfg["num_heads"], kb, 1e-5) for i in range(x.shape[0])])
    err = float(np.max(np.abs(out - want)))
    assert err < 1e-12, f"uncompressed VCC differs from the plain layer by {err}"
    return err


def _check_straight_through(rng):
    """The straight-through backward equals the finite differences of the surrogate with sg(pi) pinned at
    the anchor (upstream's 1 + pi - pi.detach()), for fine and coarse factors alike."""
    from ...testing import directional_check  # lazy: testing imports the registry

    err = 0.0
    for size in ("tiny", "small"):
        s = _draw(rng, size, score_gradient="straight_through", anchor=True)
        err = max(err, directional_check(vcc_layer_forward, vcc_layer_backward, s).max_rel)
        base = vcc_layer_forward(s.inputs["x"], s.params, **dict(s.config, score_gradient="exact"))[1]
        grads_st = vcc_layer_backward(np.ones(s.inputs["x"].shape), vcc_layer_forward(
            s.inputs["x"], s.params, **s.config)[1])
        grads_ex = vcc_layer_backward(np.ones(s.inputs["x"].shape), base)
        assert np.max(np.abs(grads_st["attention.query.weight"] - grads_ex["attention.query.weight"])) > 1e-8, \
            "the straight-through term is missing"
    return err


def _check_vip_error_vs_decompression(rng):
    """Fixed seed: the VIP tokens' outputs approach those of the uncompressed layer as more blocks are
    decompressed (the RMS error never grows by more than 5 % per block and vanishes at m = n_b)."""
    rng = np.random.default_rng(4)
    c, nb, b, r = 8, 8, 4, 4
    p = _init_params(rng, c, 16)
    x = rng.standard_normal((2, r + nb * b, c))
    imp = np.zeros(x.shape[:2], dtype=bool)
    imp[:, :r] = True
    errs = []
    full = vcc_layer(x, p, importance_mask=imp, num_important_tokens=r, block_size=b, num_fine_blocks=nb, num_heads=2)
    for m in range(nb + 1):
        out = vcc_layer(x, p, importance_mask=imp, num_important_tokens=r, block_size=b, num_fine_blocks=m,
                        num_heads=2)
        errs.append(float(np.sqrt(np.mean((out[:, :r] - full[:, :r]) ** 2))))
    assert all(e2 <= 1.05 * e1 for e1, e2 in zip(errs, errs[1:])) and errs[-1] < 1e-13 and errs[0] > 1e-3, errs
    return errs[-1]


register(
    Mechanism(
        slug="vcc_vip_token_compression", family="4-linear-kernel-sparse", tier="T3",
        title="VCC: VIP-token centric compression",
        paper="Zeng, Hawkins, Hong, Zhang, Pappas, Singh, Zheng, 'VCC: Scaling Transformers to 128K Tokens or More "
              "by Prioritizing Important Tokens', NeurIPS 2023, arXiv 2305.04241",
        official_code="mlpen/VCC",
        forward=vcc_layer_forward, backward=vcc_layer_backward, sample=_sample, reference=_reference,
        checks={"no_compression_is_plain_layer": _check_no_compression_is_plain_layer,
                "straight_through_equals_surrogate_fd": _check_straight_through,
                "vip_error_falls_with_decompression": _check_vip_error_vs_decompression},
        docs="linear/low-rank-and-structured.md#vcc-vip-token-compression",
    ),
)
