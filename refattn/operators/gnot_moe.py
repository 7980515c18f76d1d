r"""GNOT geometric gating: a mixture-of-experts FFN gated by the point coordinates.

Paper: Hao, Wang, Su, Ying, Dong, Liu, Cheng, Song, Zhu, "GNOT: A General Neural Operator
Transformer for Operator Learning", ICML 2023, arXiv 2302.14376 (soft domain decomposition).
Upstream: HaoZhongkai/GNOT @ 5ee2e69 ``models/mmgpt.py`` (``MIOECrossAttentionBlock``: ``gatenet``,
``moe_mlp1/2``); the thu-ml/GNOT repository named in the abstract carries the same code. GNOT's
attention is in ``refattn.operators.gnot``.

Forward and backward
--------------------
$$\mathrm{FFN}(x)(p) = \sum_{k=1}^{E}\pi_k(p)\,E_k(x),\qquad
\pi(p) = \mathrm{softmax}\big(\mathrm{gatenet}(p)\big),$$
gate from the point **coordinates** $p$ (not the features): ``gatenet`` = Linear(space_dim, I) –
act – Linear(I, I) – act – Linear(I, E); experts $E_k$ = Linear(C, I) – act – Linear(I, C)
(``moe_mlp1`` / ``moe_mlp2`` upstream, ``I = n_inner``). Backward: $dE_k = \pi_k\,dY$,
$d\pi_k = \langle dY, E_k(x)\rangle$, softmax VJP into the gate MLP, MLP VJPs.

Conventions
-----------
``act`` is the block activation (upstream ``config.act``, default ``'gelu'``, exact GELU). The
experts are stored stacked along a leading axis (``moe_mlp.0.weight (E, C, I)`` …). Upstream's
block applies a LayerNorm to this output before the residual (``x = x + ln3(x_moe)``); that norm is
not part of this layer.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_choice, check_params, compute_dtype
from ..nn.activations import gelu, gelu_grad, sigmoid, sigmoid_grad
from ..nn.linear import init_linear_prefixed, linear_prefixed, linear_prefixed_vjp
from ..nn.softmax import softmax_lse, softmax_vjp
from ..registry import Mechanism, Sample, register

__all__ = [
    "gnot_geometric_gating_moe_forward",
    "gnot_geometric_gating_moe_backward",
    "gnot_geometric_gating_moe",
    "gnot_moe_init_params",
]


def _act(kind):
    if kind == "gelu":
        return gelu, gelu_grad
    if kind == "tanh":
        return np.tanh, lambda t: 1.0 - np.tanh(t) ** 2
    if kind == "sigmoid":
        return sigmoid, sigmoid_grad
    return (lambda t: np.maximum(t, 0.0)), (lambda t: (t > 0).astype(t.dtype))


def gnot_geometric_gating_moe_forward(x, pos, params, *, act="gelu"):
    r"""GNOT geometric-gating mixture-of-experts FFN $\sum_k\pi_k(p)E_k(x)$.

    Parameters
    ----------
    x : array (B, N, C)
        Features (upstream: the block's residual stream).
    pos : array (B, N, P)
        Point coordinates (``space_dim`` = P) that drive the gate (differentiable).
    params : dict
        ``gatenet.0.*`` (P, I), ``gatenet.2.*`` (I, I), ``gatenet.4.*`` (I, E) (weights (in, out)
        and biases); experts stacked along a leading axis: ``moe_mlp.0.weight`` (E, C, I),
        ``moe_mlp.0.bias`` (E, I), ``moe_mlp.2.weight`` (E, I, C), ``moe_mlp.2.bias`` (E, C)
        (PyTorch: ``np.stack([m.moe_mlp1[k][0].weight.T for k in range(E)])`` …).
    act : {"gelu", "tanh", "sigmoid", "relu"}
        The block activation (upstream ``config.act``, default ``'gelu'``, exact GELU).

    Returns
    -------
    out (B, N, C), cache
        ``cache["gate"]`` holds $\pi$ (B, N, E). Upstream's block applies a LayerNorm to this
        output before the residual (``x = x + ln3(x_moe)``); that norm is not part of this layer.
    """
    check_choice(act, "act", ("gelu", "tanh", "sigmoid", "relu"))
    x = as_float(x, "x", ndim=3)
    pos = as_float(pos, "pos", ndim=3)
    b, n, c = x.shape
    if pos.shape[:2] != (b, n):
        raise ValueError(f"pos must have shape (B={b}, N={n}, P) to match x; got {pos.shape}")
    if not isinstance(params, dict) or np.ndim(params.get("moe_mlp.0.weight")) != 3:
        raise ValueError("params must contain 'moe_mlp.0.weight' of shape (E, C, I)")
    e, _, i = np.shape(params["moe_mlp.0.weight"])
    spec = {"gatenet.0.weight": (pos.shape[2], i), "gatenet.0.bias": (i,),
            "gatenet.2.weight": (i, i), "gatenet.2.bias": (i,),
            "gatenet.4.weight": (i, e), "gatenet.4.bias": (e,),
            "moe_mlp.0.weight": (e, c, i), "moe_mlp.0.bias": (e, i),
            "moe_mlp.2.weight": (e, i, c), "moe_mlp.2.bias": (e, c)}
    p = check_params(params, spec)
    dt = compute_dtype(x, pos, *p.values())
    x, pos, p = x.astype(dt, copy=False), pos.astype(dt, copy=False), cast_all(dt, p)
    f, _ = _act(act)
    a0 = linear_prefixed(p, "gatenet.0", pos)
    h0 = f(a0)
    a2 = linear_prefixed(p, "gatenet.2", h0)
    h2 = f(a2)
    logits = linear_prefixed(p, "gatenet.4", h2)
    gate, _ = softmax_lse(logits, -1)                                   # (B, N, E)
    ea = np.einsum("bnc,eci->bnei", x, p["moe_mlp.0.weight"]) + p["moe_mlp.0.bias"]
    eh = f(ea)
    eo = np.einsum("bnei,eic->bnec", eh, p["moe_mlp.2.weight"]) + p["moe_mlp.2.bias"]
    out = np.einsum("bne,bnec->bnc", gate, eo)
    cache = {"x": x, "pos": pos, "p": p, "act": act, "a0": a0, "h0": h0, "a2": a2, "h2": h2,
             "gate": gate, "ea": ea, "eh": eh, "eo": eo, "out_shape": out.shape}
    return out, cache


def gnot_geometric_gating_moe_backward(dout, cache):
    """Gradients of :func:`gnot_geometric_gating_moe_forward`: ``x``, ``pos`` and every params key."""
    x, p, gate, eo = cache["x"], cache["p"], cache["gate"], cache["eo"]
    dout = as_dout(dout, cache["out_shape"], x.dtype)
    _, fg = _act(cache["act"])
    grads = {}
    dgate = np.einsum("bnc,bnec->bne", dout, eo)
    deo = gate[..., None] * dout[:, :, None, :]
    grads["moe_mlp.2.weight"] = np.einsum("bnei,bnec->eic", cache["eh"], deo)
    grads["moe_mlp.2.bias"] = deo.sum(axis=(0, 1))
    dea = np.einsum("bnec,eic->bnei", deo, p["moe_mlp.2.weight"]) * fg(cache["ea"])
    grads["moe_mlp.0.weight"] = np.einsum("bnc,bnei->eci", x, dea)
    grads["moe_mlp.0.bias"] = dea.sum(axis=(0, 1))
    grads["x"] = np.einsum("bnei,eci->bnc", dea, p["moe_mlp.0.weight"])
    dlogits = softmax_vjp(gate, dgate, -1)
    dh2 = linear_prefixed_vjp(grads, p, "gatenet.4", dlogits, cache["h2"])
    dh0 = linear_prefixed_vjp(grads, p, "gatenet.2", dh2 * fg(cache["a2"]), cache["h0"])
    grads["pos"] = linear_prefixed_vjp(grads, p, "gatenet.0", dh0 * fg(cache["a0"]), cache["pos"])
    return grads


def gnot_geometric_gating_moe(x, pos, params, **config):
    """Convenience wrapper: the output of :func:`gnot_geometric_gating_moe_forward`."""
    return gnot_geometric_gating_moe_forward(x, pos, params, **config)[0]


def gnot_moe_init_params(rng, n_embd: int, space_dim: int, *, n_experts: int = 2, n_inner: int = 4,
                         dtype=np.float64) -> dict:
    """PyTorch default linears; ``n_inner`` is the multiplier of ``n_embd`` as in upstream's
    ``MoEGPTConfig`` (hidden width ``n_inner * n_embd``)."""
    i = n_inner * n_embd
    p = {}
    p.update(init_linear_prefixed(rng, space_dim, i, "gatenet.0"))
    p.update(init_linear_prefixed(rng, i, i, "gatenet.2"))
    p.update(init_linear_prefixed(rng, i, n_experts, "gatenet.4"))
    e1 = [init_linear_prefixed(rng, n_embd, i, "a") for _ in range(n_experts)]
    e2 = [init_linear_prefixed(rng, i, n_embd, "a") for _ in range(n_experts)]
    p["moe_mlp.0.weight"] = np.stack([t["a.weight"] for t in e1])
    p["moe_mlp.0.bias"] = np.stack([t["a.bias"] for t in e1])
    p["moe_mlp.2.weight"] = np.stack([t["a.weight"] for t in e2])
    p["moe_mlp.2.bias"] = np.stack([t["a.bias"] for t in e2])
    return {k: v.astype(dtype) for k, v in p.items()}


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample_moe(rng, size):
    if size == "tiny":
        n, c, sd, e, i = int(rng.integers(2, 4)), 3, 2, 2, 1
    else:
        n, c, sd, e, i = int(rng.integers(6, 10)), 4, 2, 3, 2
    params = {k: 1.5 * v for k, v in gnot_moe_init_params(rng, c, sd, n_experts=e, n_inner=i).items()}
    return Sample(inputs={"x": rng.standard_normal((2, n, c)), "pos": rng.uniform(-1, 1, (2, n, sd))},
                  params=params, config={"act": "gelu"})


def _check_moe_gate_sums(rng):
    s = _sample_moe(rng, "small")
    _, c = gnot_geometric_gating_moe_forward(**s.inputs, params=s.params)
    err = float(np.abs(c["gate"].sum(-1) - 1).max())
    assert err < 1e-14, f"gate does not sum to 1: {err}"
    return err


def _check_moe_one_expert(rng):
    s = _sample_moe(rng, "small")
    p = {k: (v[:1] if k.startswith("moe") else v) for k, v in s.params.items()}
    p["gatenet.4.weight"] = p["gatenet.4.weight"][:, :1]
    p["gatenet.4.bias"] = p["gatenet.4.bias"][:1]
    out = gnot_geometric_gating_moe(s.inputs["x"], s.inputs["pos"], p)
    ffn = gelu(s.inputs["x"] @ p["moe_mlp.0.weight"][0] + p["moe_mlp.0.bias"][0]) @ p["moe_mlp.2.weight"][0] \
        + p["moe_mlp.2.bias"][0]
    err = float(np.abs(out - ffn).max())
    assert err < 1e-13, f"E = 1 is not the plain FFN: {err}"
    return err


def _check_moe_identical_experts(rng):
    s = _sample_moe(rng, "small")
    p = dict(s.params)
    for k in ("moe_mlp.0.weight", "moe_mlp.0.bias", "moe_mlp.2.weight", "moe_mlp.2.bias"):
        p[k] = np.repeat(p[k][:1], p[k].shape[0], axis=0)
    out, c = gnot_geometric_gating_moe_forward(s.inputs["x"], s.inputs["pos"], p)
    g = gnot_geometric_gating_moe_backward(rng.standard_normal(out.shape), c)
    err = max(float(np.abs(g[k]).max()) for k in g if k.startswith("gatenet") or k == "pos")
    assert err < 1e-12, f"identical experts leave a gate gradient: {err}"
    return err


register(
    Mechanism(
        slug="gnot_geometric_gating_moe", family="3-operator", tier="T1",
        title="GNOT geometric gating (soft domain decomposition) mixture-of-experts FFN",
        paper="Hao et al., GNOT, ICML 2023, arXiv 2302.14376",
        forward=gnot_geometric_gating_moe_forward, backward=gnot_geometric_gating_moe_backward,
        sample=_sample_moe, docs="operator-attention.md#gnot-geometric-gating-moe",
        checks={"gate_sums_to_one": _check_moe_gate_sums, "one_expert_is_ffn": _check_moe_one_expert,
                "identical_experts_zero_gate_gradient": _check_moe_identical_experts},
    ),
)
