r"""DiffQKV attention (Sigma): differently compressed K and V heads and an augmented query.

"Differential" here means *different rescaling* of Q, K and V, not a subtraction. With $H_q$ query,
$H_k$ key and $H_v$ value heads ($H_k, H_v$ divide $H_q$; Sigma-1.5B: 32, 4, 16):

$$\bar Q = XW_q,\quad \hat Q = \big(\mathrm{act}(\bar QW_{gate})\odot(\bar QW_{up})\big)W_{down}\ \ (\text{augmented Q}),\quad
K = XW_k,\quad V = XW_v,$$
$$O_i = \mathrm{softmax}\big(s\,\hat Q_iK_{\kappa(i)}^\top + M\big)\,V_{\nu(i)},\qquad
\kappa(i) = \lfloor iH_k/H_q\rfloor,\ \ \nu(i) = \lfloor iH_v/H_q\rfloor,\qquad Y = [O_1\|\dots\|O_{H_q}]\,W_o .$$

Query head $i$ reads key head $\kappa(i)$ and value head $\nu(i)$ independently (the paper's Eq. 3,
FlexHeadFA's address rule; upstream's ``kv_group_sharing`` followed by GQA gives the same map).
Augmented Q is the paper's Appendix E: a gated MLP on the query, ``q_down_proj(act_fn(q_gate_proj(q))
* q_up_proj(q))`` with intermediate width $D$ ("Aug Q dimension", 3072 for Sigma-1.5B) and
``act_fn`` SiLU (Llama's ``hidden_act``). RoPE (rotate-half, base ``rope_theta``) is applied to
$\hat Q$ and $K$ after the projections, as upstream. The default is causal (a decoder).

Compressed key width (paper §2, Table 2; not used by the Sigma models): when the key heads are
narrower than the query heads ($d_k < d$), "the dimension of K is transformed through another
feed-forward layer"; here a ``k_up_proj`` $(d_k, d)$ shared by the key heads, applied before RoPE
(**reconstruction**: the paper gives no placement or shape).

Backward
--------
The attention core on the expanded heads gives $dQ, dK^{(e)}, dV^{(e)}$; the two head maps have
independent adjoints, $dK = $ `reduce_kv` $(dK^{(e)}, H_q/H_k)$ and $dV = $ `reduce_kv`
$(dV^{(e)}, H_q/H_v)$; RoPE's VJP is the rotation by $-\theta$; ``k_up_proj``: $dW = \sum K_{pre}^\top dK$;
augmented Q: $dA = d\hat QW_{down}^\top$, $dG = dA\odot U\odot\mathrm{act}'(G)$,
$dU = dA\odot\mathrm{act}(G)$, $d\bar Q = dGW_{gate}^\top + dUW_{up}^\top$; then the projections.

Paper: Lin et al. (Microsoft Sigma team), "Sigma: Differential Rescaling of Query, Key and Value
for Efficient Language Models", arXiv 2501.13629 (2025). No repository; the paper's Appendix E
prints the official attention forward (``kv_group_sharing`` and the augmented-Q line), which is
what this module follows. Not implemented: selective V-cache fetching (an inference-time top-k
approximation whose renormalisation the paper leaves open).
"""

from __future__ import annotations

import numpy as np

from ..._checks import (
    as_dout,
    as_float,
    cast_all,
    check_choice,
    check_param_keys,
    check_params,
    check_positive,
    check_weight_in,
    compute_dtype,
)
from ...nn.activations import gelu, gelu_grad, silu, silu_grad
from ...nn.linear import linear_prefixed, linear_prefixed_vjp, merge_heads, split_heads
from ...nn.rope import apply_rope, rope_angles
from ...registry import Mechanism, Sample, register
from .core import attention_core_backward, attention_core_forward, check_size, expand_kv, reduce_kv

__all__ = ["DIFFQKV_ACTIVATIONS", "diffqkv_attention_forward", "diffqkv_attention_backward", "diffqkv_attention",
           "init_diffqkv_params"]

DIFFQKV_ACTIVATIONS = {"silu": (silu, silu_grad), "gelu": (gelu, gelu_grad)}
_AUG = ("q_gate_proj", "q_up_proj", "q_down_proj")


def _validate(x, params, hq, hk, hv, augmented_q):
    c = x.shape[-1]
    names = ["q_proj", "k_proj", "v_proj", "o_proj"] + (list(_AUG) if augmented_q else [])
    optional = [n + ".bias" for n in names] + ["k_up_proj.weight"]
    check_param_keys(params, [n + ".weight" for n in names], optional,
                     where="diffqkv_asymmetric_heads (weights (in, out); PyTorch: weight.T)")
    for n in ("q_proj", "k_proj", "v_proj"):
        check_weight_in(params, n + ".weight", c, input_name="x")
    w = {n: as_float(params[n + ".weight"], n + ".weight", ndim=2) for n in ("q_proj", "k_proj", "v_proj", "o_proj")}
    for n, heads in (("q_proj", hq), ("k_proj", hk), ("v_proj", hv)):
        if w[n].shape[0] != c or w[n].shape[1] % heads:
            raise ValueError(f"{n}.weight must have shape (C={c}, heads*width) with {heads} heads dividing its "
                             f"second axis; got {w[n].shape}")
    d, dk, dv = w["q_proj"].shape[1] // hq, w["k_proj"].shape[1] // hk, w["v_proj"].shape[1] // hv
    co = w["o_proj"].shape[1]
    spec = {"q_proj.weight": (c, hq * d), "k_proj.weight": (c, hk * dk), "v_proj.weight": (c, hv * dv),
            "o_proj.weight": (hq * dv, co), "q_proj.bias": (hq * d,), "k_proj.bias": (hk * dk,),
            "v_proj.bias": (hv * dv,), "o_proj.bias": (co,)}
    if augmented_q:
        aug = as_float(params["q_gate_proj.weight"], "q_gate_proj.weight", ndim=2).shape[1]
        spec.update({"q_gate_proj.weight": (hq * d, aug), "q_up_proj.weight": (hq * d, aug),
                     "q_down_proj.weight": (aug, hq * d), "q_gate_proj.bias": (aug,), "q_up_proj.bias": (aug,),
                     "q_down_proj.bias": (hq * d,)})
    if dk != d or "k_up_proj.weight" in params:
        spec["k_up_proj.weight"] = (dk, d)
        if "k_up_proj.weight" not in params:
            raise ValueError(f"k_proj.weight gives key heads of width {dk} but q_proj.weight query heads of width "
                             f"{d}: k_up_proj.weight ({dk}, {d}) is required")
    return check_params(params, spec, optional=[k for k in spec if k.endswith(".bias")],
                        where="diffqkv_asymmetric_heads"), d, dk, dv


def diffqkv_attention_forward(x, params, *, num_heads: int, num_key_heads: int, num_value_heads: int,
                              augmented_q: bool = True, aug_q_act: str = "silu", rope_theta=None,
                              is_causal: bool = True, causal_alignment: str = "top_left", attn_mask=None, scale=None):
    r"""DiffQKV attention layer: $H_k$ key heads, $H_v$ value heads, augmented query.

    Parameters
    ----------
    x : array (B.., N, C)
    params : dict
        Sigma/Llama names, weights ``(in, out)``: ``"q_proj.weight" (C, Hq*d)``, ``"k_proj.weight"
        (C, Hk*dk)``, ``"v_proj.weight" (C, Hv*dv)``, ``"o_proj.weight" (Hq*dv, C_out)``; with
        ``augmented_q``: ``"q_gate_proj.weight" (Hq*d, D)``, ``"q_up_proj.weight" (Hq*d, D)``,
        ``"q_down_proj.weight" (D, Hq*d)``; ``"k_up_proj.weight" (dk, d)`` when ``dk != d``; every
        ``"<name>.bias"`` optional (Sigma has none).
    num_heads, num_key_heads, num_value_heads : int
        $H_q$, $H_k$, $H_v$; $H_k$ and $H_v$ must divide $H_q$.
    augmented_q : bool
        Apply the gated query MLP (Sigma: True).
    aug_q_act : {"silu", "gelu"}
        Its activation (Llama ``hidden_act`` "silu").
    rope_theta : float, optional
        RoPE base (rotate-half on the full head width, positions $0..N-1$); None = no RoPE.
    is_causal, causal_alignment, attn_mask, scale
        As :func:`sdpa_forward`; causal by default; scale $d^{-1/2}$.

    Returns
    -------
    out, cache
        ``out (B.., N, C_out)``.
    """
    x = as_float(x, "x", min_ndim=2)
    hq = check_size(num_heads, "num_heads")
    hk = check_size(num_key_heads, "num_key_heads")
    hv = check_size(num_value_heads, "num_value_heads")
    for name, heads in (("num_key_heads", hk), ("num_value_heads", hv)):
        if hq % heads:
            raise ValueError(f"{name} ({heads}) must divide num_heads ({hq})")
    if not isinstance(augmented_q, (bool, np.bool_)):
        raise TypeError(f"augmented_q must be a bool; got {type(augmented_q).__name__}")
    check_choice(aug_q_act, "aug_q_act", tuple(DIFFQKV_ACTIVATIONS))
    rope_theta = check_positive(rope_theta, "rope_theta", allow_none=True)
    if params is None:
        raise TypeError("params is required: q_proj/k_proj/v_proj/o_proj weights (and the augmented-Q MLP)")
    p, d, dk, dv = _validate(x, params, hq, hk, hv, augmented_q)
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    n = x.shape[-2]
    q0 = linear_prefixed(p, "q_proj", x)
    aug = None
    if augmented_q:
        act = DIFFQKV_ACTIVATIONS[aug_q_act][0]
        gate, up = linear_prefixed(p, "q_gate_proj", q0), linear_prefixed(p, "q_up_proj", q0)
        a = act(gate) * up
        q1 = linear_prefixed(p, "q_down_proj", a)
        aug = {"gate": gate, "up": up, "a": a, "act": aug_q_act}
    else:
        q1 = q0
    q = split_heads(q1, hq, d)
    k_pre = split_heads(linear_prefixed(p, "k_proj", x), hk, dk)
    k = k_pre @ p["k_up_proj.weight"] if "k_up_proj.weight" in p else k_pre
    v = split_heads(linear_prefixed(p, "v_proj", x), hv, dv)
    rope = None
    if rope_theta is not None:
        ang = rope_angles(np.arange(n), d, base=rope_theta)
        rope = (np.cos(ang).astype(dt), np.sin(ang).astype(dt))
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)
    o, core = attention_core_forward(q, expand_kv(k, hq // hk), expand_kv(v, hq // hv), attn_mask=attn_mask,
                                     is_causal=is_causal, causal_alignment=causal_alignment, scale=scale)
    oc = merge_heads(o)
    y = linear_prefixed(p, "o_proj", oc)
    cache = {"x": x, "p": p, "q0": q0, "aug": aug, "k_pre": k_pre, "rope": rope, "core": core, "oc": oc,
             "heads": (hq, hk, hv), "d": d, "dv": dv, "y_shape": y.shape}
    return y, cache


def diffqkv_attention_backward(dout, cache):
    """Gradient of :func:`diffqkv_attention_forward`: ``x`` and every params key (two independent
    GQA adjoints for the key and the value heads)."""
    p, x, core, aug, rope = cache["p"], cache["x"], cache["core"], cache["aug"], cache["rope"]
    hq, hk, hv = cache["heads"]
    g = as_dout(dout, cache["y_shape"], x.dtype)
    grads = {}
    do = linear_prefixed_vjp(grads, p, "o_proj", g, cache["oc"])
    gc = attention_core_backward(split_heads(do, hq, cache["dv"]), core)
    dq, dk = gc["q"], reduce_kv(gc["k"], hq // hk)
    dv = reduce_kv(gc["v"], hq // hv)
    if rope is not None:
        dq, dk = apply_rope(dq, rope[0], -rope[1]), apply_rope(dk, rope[0], -rope[1])
    if "k_up_proj.weight" in p:
        k_pre = cache["k_pre"]
        grads["k_up_proj.weight"] = k_pre.reshape(-1, k_pre.shape[-1]).T @ dk.reshape(-1, dk.shape[-1])
        dk = dk @ p["k_up_proj.weight"].T
    dq1 = merge_heads(dq)
    if aug is not None:
        act, act_grad = DIFFQKV_ACTIVATIONS[aug["act"]]
        da = linear_prefixed_vjp(grads, p, "q_down_proj", dq1, aug["a"])
        dgate = da * aug["up"] * act_grad(aug["gate"])
        dup = da * act(aug["gate"])
        dq0 = linear_prefixed_vjp(grads, p, "q_gate_proj", dgate, cache["q0"])
        dq0 = dq0 + linear_prefixed_vjp(grads, p, "q_up_proj", dup, cache["q0"])
    else:
        dq0 = dq1
    dx = linear_prefixed_vjp(grads, p, "q_proj", dq0, x)
    dx = dx + linear_prefixed_vjp(grads, p, "k_proj", merge_heads(dk), x)
    grads["x"] = dx + linear_prefixed_vjp(grads, p, "v_proj", merge_heads(dv), x)
    return grads


def diffqkv_attention(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`diffqkv_attention_forward`."""
    return diffqkv_attention_forward(x, params, **config)[0]


def init_diffqkv_params(rng, c: int, num_heads: int, num_key_heads: int, num_value_heads: int, head_dim: int, *,
                        key_dim=None, value_dim=None, aug_dim=None, c_out=None, bias: bool = False) -> dict:
    """Random parameters (PyTorch-default-like uniform weights); ``aug_dim=None`` omits the augmented-Q MLP."""
    dk = head_dim if key_dim is None else key_dim
    dv = head_dim if value_dim is None else value_dim
    co = c if c_out is None else c_out
    shapes = {"q_proj": (c, num_heads * head_dim), "k_proj": (c, num_key_heads * dk),
              "v_proj": (c, num_value_heads * dv), "o_proj": (num_heads * dv, co)}
    if aug_dim is not None:
        shapes.update({"q_gate_proj": (num_heads * head_dim, aug_dim), "q_up_proj": (num_heads * head_dim, aug_dim),
                       "q_down_proj": (aug_dim, num_heads * head_dim)})
    p = {}
    for n, (i, o) in shapes.items():
        p[n + ".weight"] = rng.uniform(-1, 1, (i, o)) / np.sqrt(i)
        if bias:
            p[n + ".bias"] = rng.uniform(-1, 1, o) / np.sqrt(i)
    if dk != head_dim:
        p["k_up_proj.weight"] = rng.uniform(-1, 1, (dk, head_dim)) / np.sqrt(dk)
    return p


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size):
    if size == "tiny":
        n, c, hq, d = int(rng.integers(2, 4)), 3, 2, 2
        hk, hv = (1, 2) if rng.random() < 0.5 else (2, 1)
        aug = 3
    else:
        n, c, hq, d = int(rng.integers(4, 8)), 6, 4, 4
        hk, hv = int(rng.choice([1, 2])), int(rng.choice([2, 4]))
        aug = 6
    dk = d if rng.random() < 0.6 else d // 2
    augmented = bool(rng.random() < 0.7)
    params = init_diffqkv_params(rng, c, hq, hk, hv, d, key_dim=dk, aug_dim=aug if augmented else None,
                                 bias=bool(rng.random() < 0.3))
    cfg = {"num_heads": hq, "num_key_heads": hk, "num_value_heads": hv, "augmented_q": augmented,
           "is_causal": bool(rng.random() < 0.7)}
    if rng.random() < 0.5:
        cfg["rope_theta"] = 10000.0
    return Sample(inputs={"x": rng.standard_normal((2, n, c))}, params=params, config=cfg)


def _duplicated_mha(p, hq, hk, hv, d):
    # MHA whose k/v projections repeat each key/value head for the query heads that read it
    def dup(w, heads):
        e = w.shape[-1] // heads
        return np.repeat(w.reshape(w.shape[:-1] + (heads, e)), hq // heads, axis=-2).reshape(w.shape[:-1] + (hq * e,))

    out = {"q_proj": p["q_proj.weight"], "k_proj": dup(p["k_proj.weight"], hk), "v_proj": dup(p["v_proj.weight"], hv),
           "out_proj": p["o_proj.weight"]}
    for n, src, heads in (("q_proj", "q_proj", hq), ("k_proj", "k_proj", hk), ("v_proj", "v_proj", hv),
                          ("out_proj", "o_proj", None)):
        if src + ".bias" in p:
            out[n + "_bias"] = p[src + ".bias"] if heads in (None, hq) else dup(p[src + ".bias"], heads)
    return out


def _check_equal_heads_is_mha(rng):
    from .mha import mha

    x = rng.standard_normal((2, 5, 6))
    p = init_diffqkv_params(rng, 6, 3, 3, 3, 2, bias=True)
    err = 0.0
    for causal in (False, True):
        y = diffqkv_attention(x, p, num_heads=3, num_key_heads=3, num_value_heads=3, augmented_q=False,
                              is_causal=causal)
        err = max(err, float(np.abs(y - mha(x, params=_duplicated_mha(p, 3, 3, 3, 2), num_heads=3,
                                              is_causal=causal)).max()))
    assert err < 1e-12, err
    return err


def _check_equal_kv_heads_is_gqa(rng):
    from .mha import mha_backward, mha_forward

    x = rng.standard_normal((2, 5, 6))
    p = init_diffqkv_params(rng, 6, 4, 2, 2, 3)
    y, c = diffqkv_attention_forward(x, p, num_heads=4, num_key_heads=2, num_value_heads=2, augmented_q=False)
    pm = {"q_proj": p["q_proj.weight"], "k_proj": p["k_proj.weight"], "v_proj": p["v_proj.weight"],
          "out_proj": p["o_proj.weight"]}
    y2, c2 = mha_forward(x, params=pm, num_heads=4, num_kv_heads=2, is_causal=True)
    G = rng.standard_normal(y.shape)
    g, g2 = diffqkv_attention_backward(G, c), mha_backward(G, c2)
    err = max(float(np.abs(y - y2).max()), float(np.abs(g["x"] - g2["x"]).max()),
              float(np.abs(g["k_proj.weight"] - g2["k_proj"]).max()),
              float(np.abs(g["v_proj.weight"] - g2["v_proj"]).max()))
    assert err < 1e-12, err
    return err


def _check_independent_head_maps(rng):
    # H_k != H_v: equal to MHA with each key head and each value head duplicated on its own, and the
    # shared weights' gradients are the group sums of the duplicated model's (two independent adjoints)
    from .mha import mha_backward, mha_forward

    x = rng.standard_normal((2, 4, 5))
    hq, hk, hv, d = 4, 1, 2, 2
    p = init_diffqkv_params(rng, 5, hq, hk, hv, d)
    y, c = diffqkv_attention_forward(x, p, num_heads=hq, num_key_heads=hk, num_value_heads=hv, augmented_q=False)
    y2, c2 = mha_forward(x, params=_duplicated_mha(p, hq, hk, hv, d), num_heads=hq, is_causal=True)
    G = rng.standard_normal(y.shape)
    g, g2 = diffqkv_attention_backward(G, c), mha_backward(G, c2)
    err = max(float(np.abs(y - y2).max()), float(np.abs(g["x"] - g2["x"]).max()))
    for name, heads in (("k_proj", hk), ("v_proj", hv)):
        red = g2[name].reshape(5, heads, hq // heads, d).sum(axis=2).reshape(5, heads * d)
        err = max(err, float(np.abs(g[name + ".weight"] - red).max()))
    assert err < 1e-12, err
    return err


register(
    Mechanism(
        slug="diffqkv_asymmetric_heads", family="1-softmax", tier="T2",
        title="DiffQKV (Sigma): differently compressed K and V heads with an augmented query",
        paper="Lin et al., Sigma: Differential Rescaling of Query, Key and Value for Efficient Language Models, "
              "arXiv 2501.13629 (2025)",
        forward=diffqkv_attention_forward, backward=diffqkv_attention_backward, sample=_sample,
        docs="softmax/qkv-variants.md#diffqkv-asymmetric-heads",
        checks={"equal_heads_is_mha": _check_equal_heads_is_mha, "equal_kv_heads_is_gqa": _check_equal_kv_heads_is_gqa,
                "independent_head_maps": _check_independent_head_maps},
    ),
)
