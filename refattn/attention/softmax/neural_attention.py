r"""Neural Attention: the dot-product score replaced by a small feed-forward network on each
(query, key) pair, in a multi-head self-attention layer.

Paper: DiGiugno, Mahmood, "Neural Attention: A Novel Mechanism for Enhanced Expressive Power in
Transformer Models", arXiv 2502.17206 (2025). Upstream: awayfromzel/neural-attention-research
``nlp_neural_attention/Models/NeuralAttention.py`` @f6572f573ec43ddf26b01d468557b1b6e5649cb7
(``NeuralAttention``; ``vision_neural_attention/Models/NeuralAttention.py`` is identical, used with
``causal=False``; the transformer puts it in the first block only, ``use_neural_attention``).

Forward
-------
$x\in\mathbb R^{N\times C}$; ``to_qkv`` (no bias) gives per head $h$ queries, keys and values of width
$d_h$, split as einops ``'b n (d k h) -> k b h n d'`` — the fused column of (feature $d$, part $k$,
head $h$) is $d\cdot3H + kH + h$ (feature-major, not the usual part-major layout). Queries and keys are
projected down to $d'$ (``projection_dim``, upstream default $d_h/32$) by ``q_proj``/``k_proj``
(shared over heads, with bias), and the score of a pair is an MLP of their concatenation:

$$e_{ij} = w_3^\top\,\mathrm{ReLU}\!\big(W_2^\top\,\mathrm{ReLU}(W_1^\top[\tilde q_i;\tilde k_j] + b_1) + b_2\big) + b_3,
\qquad \tilde q = qW_q + b_q,\ \tilde k = kW_k + b_k,$$

``linear1`` $2d'\to d'$, ``linear2`` $d'\to d'/2$, ``linear3`` $d'/2\to 1$. Then (causal by default,
upper triangle to $-\infty$) $A = \mathrm{softmax}_j(e)$, $O_h = AV_h$, heads merged
(``'b h n d -> b n (h d)'``) and ``W_out`` (no bias). The $1/\sqrt{d_h}$ ``scale_factor`` is defined
upstream but unused. The first layer is separable, $W_1^\top[\tilde q_i;\tilde k_j] = \tilde q_iW_1^{(q)} +
\tilde k_jW_1^{(k)}$, so the $N\times N\times 2d'$ concatenation is never formed. With ``tanh`` and one
hidden layer this would be the additive score of `refattn.attention.softmax.additive`.
``attn_mask`` (bool, True = keep, broadcastable to ``(B, H, N, N)``) is an addition; upstream's
``mask`` argument (True = masked) is overwritten by the causal mask when ``causal`` is on.

Backward
--------
$dV = A^\top dO$, $dA = dO\,V^\top$, $de = A\odot(dA - \sum_jA\,dA)$; through the MLP:
$dw_3 = \sum r_2\,de$, $dr_2 = de\,w_3^\top\odot[u_2>0]$, $dW_2 = \sum r_1^\top dr_2$,
$dr_1 = dr_2W_2^\top\odot[u_1>0]$, and $dW_1^{(q)} = \sum_i\tilde q_i^\top\sum_jdr_{1,ij}$,
$dW_1^{(k)} = \sum_j\tilde k_j^\top\sum_idr_{1,ij}$, $d\tilde q_i = \sum_jdr_{1,ij}W_1^{(q)\top}$,
$d\tilde k_j = \sum_idr_{1,ij}W_1^{(k)\top}$; then the down-projections, the column scatter back into
``to_qkv`` and the linear VJPs. ReLU derivatives are 0 at the kink (PyTorch's); samplers keep every
pre-activation away from it.

Agreement with upstream (measured)
---------------------------------
Upstream ``NeuralAttention`` run in float64 torch (CPU; a small einops ``rearrange`` shim) against
`neural_attention_forward`/`neural_attention_backward`, output and every gradient: worst abs
$8.9\cdot10^{-16}$ / rel $1.1\cdot10^{-15}$ (``causal=True``) and $8.9\cdot10^{-16}$ / $3.8\cdot10^{-16}$
(``causal=False``), with every ReLU pre-activation at least $8\cdot10^{-5}$ from its kink.
"""

from __future__ import annotations

import numpy as np

from ..._checks import (
    as_bool_or_float_mask,
    as_dout,
    as_float,
    cast_all,
    check_broadcastable,
    check_params,
    compute_dtype,
)
from ...nn.linear import merge_heads
from ...nn.softmax import softmax_lse, softmax_vjp
from ...registry import Mechanism, Sample, register
from .core import causal_keep, check_size

__all__ = [
    "neural_attention_param_spec",
    "init_neural_attention_params",
    "neural_attention_qkv_columns",
    "neural_attention_forward",
    "neural_attention_backward",
    "neural_attention",
]


def neural_attention_param_spec(dim: int, heads: int, dim_head: int, projection_dim: int) -> dict:
    """``check_params`` spec of ``NeuralAttention`` (weights ``(in, out)`` = torch ``weight.T``)."""
    inner, dp = heads * dim_head, projection_dim
    return {"to_qkv.weight": (dim, 3 * inner), "W_out.weight": (inner, dim),
            "q_proj.weight": (dim_head, dp), "q_proj.bias": (dp,), "k_proj.weight": (dim_head, dp), "k_proj.bias": (dp,),
            "linear1.weight": (2 * dp, dp), "linear1.bias": (dp,), "linear2.weight": (dp, dp // 2),
            "linear2.bias": (dp // 2,), "linear3.weight": (dp // 2, 1), "linear3.bias": (1,)}


def init_neural_attention_params(rng, dim: int, heads: int, dim_head: int, projection_dim: int, *,
                                 scale: float = 1.0) -> dict:
    """Random parameters in spec order (normal, std ``scale / sqrt(fan_in)``; biases small normal)."""
    spec = neural_attention_param_spec(dim, heads, dim_head, projection_dim)
    return {k: (scale / np.sqrt(s[0])) * rng.standard_normal(s) if len(s) == 2 else 0.3 * rng.standard_normal(s)
            for k, s in spec.items()}


def neural_attention_qkv_columns(heads: int, dim_head: int) -> np.ndarray:
    """``(3, H, d_h)`` integer array: the ``to_qkv`` output column of part $k$ (q, k, v), head $h$ and
    feature $d$ under einops ``'(d k h)'``, i.e. $d\\cdot3H + kH + h$."""
    d, k, h = np.meshgrid(np.arange(dim_head), np.arange(3), np.arange(heads), indexing="ij")
    return np.transpose(d * 3 * heads + k * heads + h, (1, 2, 0))


def neural_attention_forward(x, params, *, heads: int, causal: bool = True, attn_mask=None):
    r"""Upstream's ``NeuralAttention`` layer on ``x (B, N, C)`` (see the module docstring).

    Parameters
    ----------
    x : array (B, N, C)
    params : dict
        ``neural_attention_param_spec`` keys; $d_h$ and $d'$ are read from ``q_proj.weight``.
    heads : int
    causal : bool
        Upper triangle masked (upstream's default for language modelling; the vision model uses False).
    attn_mask : bool array broadcastable to (B, H, N, N), optional
        True = keep.

    Returns
    -------
    out, cache
        ``(B, N, C)``.
    """
    x = as_float(x, "x", ndim=3)
    nh = check_size(heads, "heads")
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be a bool; got {type(causal).__name__}")
    if not isinstance(params, dict) or np.ndim(params.get("q_proj.weight")) != 2:
        raise TypeError("params must be a dict with 'q_proj.weight' (dim_head, projection_dim) "
                        "(see neural_attention_param_spec)")
    dh, dp = np.shape(params["q_proj.weight"])
    if dp < 2:
        raise ValueError(f"projection_dim (q_proj.weight.shape[1]) must be >= 2 (linear2 maps it to d'//2); got {dp}")
    b, n, c = x.shape
    p = check_params(params, neural_attention_param_spec(c, nh, dh, dp), where="neural_attention (NeuralAttention)")
    if attn_mask is not None:
        attn_mask = as_bool_or_float_mask(attn_mask, "attn_mask")
        if attn_mask.dtype != np.bool_:
            raise TypeError("attn_mask must be boolean (True = keep)")
        check_broadcastable("attn_mask", attn_mask.shape, (b, nh, n, n), "the scores (B, H, N, N) of shape")
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    qkv = x @ p["to_qkv.weight"]
    cols = neural_attention_qkv_columns(nh, dh)
    q, k, v = (np.moveaxis(qkv[..., cols[i]], 1, 2) for i in range(3))        # (B, H, N, d_h)
    qt = q @ p["q_proj.weight"] + p["q_proj.bias"]
    kt = k @ p["k_proj.weight"] + p["k_proj.bias"]
    w1 = p["linear1.weight"]
    u1 = (qt @ w1[:dp])[..., :, None, :] + (kt @ w1[dp:])[..., None, :, :] + p["linear1.bias"]   # (B, H, N, N, d')
    r1 = np.maximum(u1, 0.0)
    u2 = r1 @ p["linear2.weight"] + p["linear2.bias"]
    r2 = np.maximum(u2, 0.0)
    e = r2 @ p["linear3.weight"][:, 0] + p["linear3.bias"][0]
    keep = None
    if causal:
        keep = causal_keep(n, n)
    if attn_mask is not None:
        keep = attn_mask if keep is None else keep & attn_mask
    if keep is not None:
        e = np.where(keep, e, -np.inf)
    a, _ = softmax_lse(e, axis=-1)
    o = merge_heads(a @ v)
    out = o @ p["W_out.weight"]
    cache = {"x": x, "p": p, "cols": cols, "q": q, "k": k, "v": v, "qt": qt, "kt": kt, "u1": u1, "r1": r1, "u2": u2,
             "r2": r2, "a": a, "o": o, "nh": nh, "dp": dp}
    return out, cache


def neural_attention_backward(dout, cache):
    """Gradient of :func:`neural_attention_forward`: ``x`` and every parameter."""
    x, p, nh, dp = cache["x"], cache["p"], cache["nh"], cache["dp"]
    g = as_dout(dout, x.shape, x.dtype)
    o, a, v = cache["o"], cache["a"], cache["v"]
    grads = {"W_out.weight": o.reshape(-1, o.shape[-1]).T @ g.reshape(-1, g.shape[-1])}
    do = np.swapaxes((g @ p["W_out.weight"].T).reshape(g.shape[:2] + (nh, -1)), 1, 2)    # (B, H, N, d_h)
    dv = np.swapaxes(a, -1, -2) @ do
    de = softmax_vjp(a, do @ np.swapaxes(v, -1, -2))
    r2, u2, r1, u1 = cache["r2"], cache["u2"], cache["r1"], cache["u1"]
    grads["linear3.weight"] = np.einsum("bhij,bhijc->c", de, r2)[:, None]
    grads["linear3.bias"] = np.reshape(de.sum(), (1,))
    du2 = (de[..., None] * p["linear3.weight"][:, 0]) * (u2 > 0)
    grads["linear2.weight"] = r1.reshape(-1, dp).T @ du2.reshape(-1, du2.shape[-1])
    grads["linear2.bias"] = du2.reshape(-1, du2.shape[-1]).sum(axis=0)
    du1 = (du2 @ p["linear2.weight"].T) * (u1 > 0)
    grads["linear1.bias"] = du1.reshape(-1, dp).sum(axis=0)
    dqs, dks = du1.sum(axis=-2), du1.sum(axis=-3)                                # (B, H, N, d')
    qt, kt, w1 = cache["qt"], cache["kt"], p["linear1.weight"]
    grads["linear1.weight"] = np.concatenate([qt.reshape(-1, dp).T @ dqs.reshape(-1, dp),
                                              kt.reshape(-1, dp).T @ dks.reshape(-1, dp)])
    dqt, dkt = dqs @ w1[:dp].T, dks @ w1[dp:].T
    q, k = cache["q"], cache["k"]
    dh = q.shape[-1]
    grads["q_proj.weight"] = q.reshape(-1, dh).T @ dqt.reshape(-1, dp)
    grads["q_proj.bias"] = dqt.reshape(-1, dp).sum(axis=0)
    grads["k_proj.weight"] = k.reshape(-1, dh).T @ dkt.reshape(-1, dp)
    grads["k_proj.bias"] = dkt.reshape(-1, dp).sum(axis=0)
    dqkv = np.zeros(x.shape[:2] + (p["to_qkv.weight"].shape[1],), x.dtype)
    for i, dpart in enumerate((dqt @ p["q_proj.weight"].T, dkt @ p["k_proj.weight"].T, dv)):
        dqkv[..., cache["cols"][i]] = np.moveaxis(dpart, 2, 1)
    grads["to_qkv.weight"] = x.reshape(-1, x.shape[-1]).T @ dqkv.reshape(-1, dqkv.shape[-1])
    return {"x": dqkv @ p["to_qkv.weight"].T, **{kk: grads[kk] for kk in p}}


def neural_attention(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`neural_attention_forward`."""
    return neural_attention_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size):
    if size == "tiny":
        n, c, nh, dh, dp = 3, 4, 2, 2, 2
    else:
        n, c, nh, dh, dp = int(rng.integers(3, 7)), 8, 2, 4, 4
    p = init_neural_attention_params(rng, c, nh, dh, dp, scale=1.5)
    causal = bool(rng.random() < 0.5)
    # Redraw x until every ReLU pre-activation of the score MLP is away from its kink.
    for _ in range(300):
        x = rng.standard_normal((2, n, c))
        _, cache = neural_attention_forward(x, p, heads=nh, causal=causal)
        if min(float(np.abs(cache["u1"]).min()), float(np.abs(cache["u2"]).min())) > 1e-3:
            return Sample(inputs={"x": x}, params=p, config={"heads": nh, "causal": causal})
    raise AssertionError("could not draw neural-attention inputs away from the ReLU kinks")


def _reference(x, params, *, heads, causal=True, attn_mask=None):
    # The upstream forms written out: einops '(d k h)' split by explicit index, the concatenation
    # [q_i; k_j] through the three linear layers pair by pair.
    p = params
    b, n, c = x.shape
    dh, dp = p["q_proj.weight"].shape
    qkv = x @ p["to_qkv.weight"]
    out = np.zeros((b, n, heads * dh))
    for bb in range(b):
        for h in range(heads):
            q = np.array([[qkv[bb, i, d * 3 * heads + 0 * heads + h] for d in range(dh)] for i in range(n)])
            k = np.array([[qkv[bb, i, d * 3 * heads + 1 * heads + h] for d in range(dh)] for i in range(n)])
            v = np.array([[qkv[bb, i, d * 3 * heads + 2 * heads + h] for d in range(dh)] for i in range(n)])
            qt, kt = q @ p["q_proj.weight"] + p["q_proj.bias"], k @ p["k_proj.weight"] + p["k_proj.bias"]
            for i in range(n):
                e = np.full(n, -np.inf)
                for j in range(n):
                    if causal and j > i:
                        continue
                    if attn_mask is not None and not np.broadcast_to(attn_mask, (b, heads, n, n))[bb, h, i, j]:
                        continue
                    z = np.maximum(np.concatenate([qt[i], kt[j]]) @ p["linear1.weight"] + p["linear1.bias"], 0.0)
                    z = np.maximum(z @ p["linear2.weight"] + p["linear2.bias"], 0.0)
                    e[j] = z @ p["linear3.weight"][:, 0] + p["linear3.bias"][0]
                w = np.exp(e - e.max())
                out[bb, i, h * dh:(h + 1) * dh] = (w / w.sum()) @ v
    return out @ p["W_out.weight"]


def _check_causal_blocks_the_future(rng):
    # Causal: output i does not depend on tokens j > i (their gradient from row i is exactly zero).
    s = _sample(rng, "small")
    y, c = neural_attention_forward(s.inputs["x"], s.params, heads=s.config["heads"], causal=True)
    g = np.zeros_like(y)
    g[:, 0] = rng.standard_normal(y.shape[-1])
    dx = neural_attention_backward(g, c)["x"]
    err = float(np.abs(dx[:, 1:]).max())
    assert err == 0.0, f"token 0's output depends on later tokens ({err:.2e})"
    return err


def _check_qkv_split_is_feature_major(rng):
    # '(d k h)': the column of (part k, head h, feature d) is d*3H + k*H + h, a permutation of 0..3Hd-1.
    cols = neural_attention_qkv_columns(3, 4)
    assert sorted(cols.ravel().tolist()) == list(range(36))
    assert cols[1, 2, 3] == 3 * 9 + 1 * 3 + 2
    return 0.0


register(
    Mechanism(
        slug="neural_attention_mlp_scores", family="1-softmax", tier="T3",
        title="Neural Attention: feed-forward (ReLU MLP) scores on query/key pairs",
        paper="DiGiugno, Mahmood, Neural Attention: A Novel Mechanism for Enhanced Expressive Power in Transformer "
              "Models, arXiv 2502.17206 (2025)",
        forward=neural_attention_forward, backward=neural_attention_backward, sample=_sample, reference=_reference,
        docs="softmax/additive-and-alignment-attention.md#neural-attention-mlp-scores",
        checks={"causal_blocks_the_future": _check_causal_blocks_the_future,
                "qkv_split_is_feature_major": _check_qkv_split_is_feature_major},
    ),
)
