r"""Skip-Layer Attention (SLA): a chosen set of heads in layer $l$ attends with its queries to the
keys and values of layer $l - n_l$, the other heads to layer $l$'s own.

For layer $l$ with input $h_l$, projections $W^{(l)}$ and the set $\mathcal S$ of $n_h$ skip heads:

$$Q^{(l)} = h_lW_q^{(l)},\qquad (K, V)^{(l)} = h_l\,(W_k, W_v)^{(l)},\qquad
O^{(l)}_j = \begin{cases}\mathrm{sdpa}\big(Q^{(l)}_j, K^{(l-n_l)}_j, V^{(l-n_l)}_j\big) & j\in\mathcal S,\ l\ge n_l\\
\mathrm{sdpa}\big(Q^{(l)}_j, K^{(l)}_j, V^{(l)}_j\big) & \text{otherwise,}\end{cases}$$
$$y^{(l)} = [O^{(l)}_1\|\dots\|O^{(l)}_H]\,W_o^{(l)},\qquad h_{l+1} = h_l + y^{(l)} .$$

The earlier layer's keys and values are the ones it computed for itself (a KV-cache reuse: no new
parameters and no extra projection), so the gradient of a skip head flows into layer
$l - n_l$'s ``k_proj``/``v_proj`` — cross-layer gradient accumulation — and layer $l$'s own
``k_proj``/``v_proj`` columns of a skip head receive nothing from layer $l$.

Two public pieces:

* `skip_layer_attention_forward` / `skip_layer_attention_backward`: one layer, given the earlier
  layer's keys and values ``skip_k``, ``skip_v`` (``(B.., H, M, d)``, all heads; only the skip heads
  are read). Its cache holds the layer's own ``k``, ``v`` for later layers, and its backward takes
  extra upstream gradients ``dk``, ``dv`` on them (from the layers that skipped to it).
* `skip_layer_stack_forward` / `skip_layer_stack_backward`: $L$ such layers with residual
  connections, layer $l\ge n_l$ skipping to $l - n_l$ — the registry record, so the
  finite-difference check runs through two or more layers.

Backward
--------
Per layer, the attention core's VJP gives $dQ$ and, per head, $dK_j, dV_j$; for a skip head they
are sent back to layer $l-n_l$ (``"skip_k"``/``"skip_v"`` in the layer's gradients), for the
others they join any gradient that later layers sent to this layer's own $K, V$. The stack runs
the layers in reverse, $dh_l = dh_{l+1} + dx^{(l)}$, and hands each layer the key/value gradients
accumulated from the layers that read it.

Sources and reconstruction
--------------------------
Paper: Qian Chen et al. (Alibaba), "Skip-Layer Attention: Bridging Abstract and Detailed
Dependencies in Transformers", arXiv 2406.11274 (2024): queries in a layer "interact with keys
and values from both the current layer and one preceding layer", with $n_h$ skip heads and a
skip distance $n_l$; no code was released. **Reconstruction** (keywords): which heads skip
(``skip_heads``: an int $n_h$ takes the first $n_h$ heads, or give the indices), that a skip head
*replaces* its own K/V by the earlier layer's same-index head (rather than concatenating both),
and the block of the stack (attention only, with residual, no norm or MLP: the mechanism, not
GPT-2's block).
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_param_keys, check_params, compute_dtype
from ...nn.linear import linear_prefixed, linear_prefixed_vjp, merge_heads, split_heads
from ...registry import Mechanism, Sample, register
from .core import attention_core_backward, attention_core_forward, check_size

__all__ = ["skip_layer_attention_forward", "skip_layer_attention_backward", "skip_layer_stack_forward",
           "skip_layer_stack_backward", "skip_layer_stack", "init_skip_layer_params"]

_PROJ = ("q_proj", "k_proj", "v_proj", "out_proj")


def _skip_set(skip_heads, h):
    if isinstance(skip_heads, (int, np.integer)) and not isinstance(skip_heads, (bool, np.bool_)):
        if not 0 <= skip_heads <= h:
            raise ValueError(f"skip_heads must be between 0 and num_heads={h}; got {skip_heads}")
        return tuple(range(int(skip_heads)))
    try:
        heads = tuple(int(i) for i in skip_heads)
    except TypeError:
        raise TypeError(f"skip_heads must be an int or a sequence of head indices; got {type(skip_heads).__name__}") from None
    if len(set(heads)) != len(heads) or any(not 0 <= i < h for i in heads):
        raise ValueError(f"skip_heads must be distinct head indices in [0, {h}); got {heads}")
    return tuple(sorted(heads))


def _spec(prefix, c, h, d, co):
    spec = {}
    for n, (i, o) in {"q_proj": (c, h * d), "k_proj": (c, h * d), "v_proj": (c, h * d), "out_proj": (h * d, co)}.items():
        spec[f"{prefix}{n}.weight"], spec[f"{prefix}{n}.bias"] = (i, o), (o,)
    return spec


def _layer(x, p, prefix, h, d, heads, skip_k, skip_v, mask_cfg):
    q = split_heads(linear_prefixed(p, prefix + "q_proj", x), h, d)
    k = split_heads(linear_prefixed(p, prefix + "k_proj", x), h, d)
    v = split_heads(linear_prefixed(p, prefix + "v_proj", x), h, d)
    ku, vu = k, v
    if heads and skip_k is not None:
        ku, vu = k.copy(), v.copy()
        ku[..., heads, :, :] = skip_k[..., heads, :, :]
        vu[..., heads, :, :] = skip_v[..., heads, :, :]
    o, core = attention_core_forward(q, ku, vu, **mask_cfg)
    oc = merge_heads(o)
    y = linear_prefixed(p, prefix + "out_proj", oc)
    return y, {"x": x, "prefix": prefix, "k": k, "v": v, "core": core, "oc": oc, "heads": heads if skip_k is not None
               else (), "h": h, "d": d, "y_shape": y.shape}


def _layer_backward(g, c, p, grads, dk=None, dv=None):
    prefix, x, heads = c["prefix"], c["x"], c["heads"]
    do = linear_prefixed_vjp(grads, p, prefix + "out_proj", g, c["oc"])
    gc = attention_core_backward(split_heads(do, c["h"], c["d"]), c["core"])
    dku, dvu = gc["k"], gc["v"]
    skip = None
    if heads:
        skip = (np.zeros_like(dku), np.zeros_like(dvu))
        skip[0][..., heads, :, :] = dku[..., heads, :, :]
        skip[1][..., heads, :, :] = dvu[..., heads, :, :]
        dku, dvu = dku.copy(), dvu.copy()
        dku[..., heads, :, :] = 0.0
        dvu[..., heads, :, :] = 0.0
    if dk is not None:
        dku, dvu = dku + dk, dvu + dv
    dx = linear_prefixed_vjp(grads, p, prefix + "q_proj", merge_heads(gc["q"]), x)
    dx = dx + linear_prefixed_vjp(grads, p, prefix + "k_proj", merge_heads(dku), x)
    dx = dx + linear_prefixed_vjp(grads, p, prefix + "v_proj", merge_heads(dvu), x)
    return dx, skip


def _mask_cfg(attn_mask, is_causal, causal_alignment, scale):
    return {"attn_mask": attn_mask, "is_causal": is_causal, "causal_alignment": causal_alignment, "scale": scale}


def skip_layer_attention_forward(x, params, skip_k=None, skip_v=None, *, num_heads: int, skip_heads=0,
                                 attn_mask=None, is_causal: bool = False, causal_alignment: str = "top_left",
                                 scale=None):
    r"""One skip-layer attention layer: heads in ``skip_heads`` use ``skip_k``/``skip_v``.

    Parameters
    ----------
    x : array (B.., N, C)
    params : dict
        ``"q_proj.weight" (C, Hd)``, ``"k_proj.weight"``, ``"v_proj.weight" (C, Hd)``,
        ``"out_proj.weight" (Hd, C_out)``, optional ``"<name>.bias"``.
    skip_k, skip_v : array (B.., H, M, d), optional
        The earlier layer's keys and values (all heads; the skip heads are read). Without them the
        layer is plain MHA.
    num_heads : int
    skip_heads : int or sequence of int
        $n_h$ (the first $n_h$ heads) or the head indices.
    attn_mask, is_causal, causal_alignment, scale
        As :func:`sdpa_forward`.

    Returns
    -------
    out, cache
        ``out (B.., N, C_out)``; ``cache["k"]``, ``cache["v"]`` are the layer's own heads for later layers.
    """
    x = as_float(x, "x", min_ndim=2)
    h = check_size(num_heads, "num_heads")
    heads = _skip_set(skip_heads, h)
    if params is None:
        raise TypeError("params is required: q_proj/k_proj/v_proj/out_proj weights")
    check_param_keys(params, [n + ".weight" for n in _PROJ], [n + ".bias" for n in _PROJ],
                     where="skip_layer_attention (weights (in, out); PyTorch: weight.T)")
    wq = as_float(params["q_proj.weight"], "q_proj.weight", ndim=2)
    if wq.shape[0] != x.shape[-1] or wq.shape[1] % h:
        raise ValueError(f"q_proj.weight must have shape (C={x.shape[-1]}, H*d) with H={h}; got {wq.shape}")
    d = wq.shape[1] // h
    co = as_float(params["out_proj.weight"], "out_proj.weight", ndim=2).shape[1]
    p = check_params(params, _spec("", x.shape[-1], h, d, co), optional=[n + ".bias" for n in _PROJ],
                     where="skip_layer_attention")
    if (skip_k is None) != (skip_v is None):
        raise TypeError("skip_k and skip_v must be given together")
    if skip_k is not None:
        skip_k = as_float(skip_k, "skip_k", ndim=x.ndim + 1)
        skip_v = as_float(skip_v, "skip_v", ndim=x.ndim + 1)
        if skip_k.shape[:-3] != x.shape[:-2] or skip_k.shape[-3] != h or skip_k.shape[-1] != d:
            raise ValueError(f"skip_k must have shape {x.shape[:-2]} + (H={h}, M, d={d}); got {skip_k.shape}")
        if skip_v.shape != skip_k.shape:
            raise ValueError(f"skip_v must have skip_k's shape {skip_k.shape}; got {skip_v.shape}")
        if skip_k.shape[-2] != x.shape[-2]:
            raise ValueError(f"skip_k must have x's length N={x.shape[-2]} on axis -2 (self-attention); got "
                             f"{skip_k.shape}")
    dt = compute_dtype(x, skip_k, skip_v, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    if skip_k is not None:
        skip_k, skip_v = skip_k.astype(dt, copy=False), skip_v.astype(dt, copy=False)
    y, c = _layer(x, p, "", h, d, heads, skip_k, skip_v, _mask_cfg(attn_mask, is_causal, causal_alignment, scale))
    c["p"], c["skip_given"] = p, skip_k is not None
    return y, c


def skip_layer_attention_backward(dout, cache, *, dk=None, dv=None):
    """Gradient of :func:`skip_layer_attention_forward`: ``x``, every params key and, when given,
    ``skip_k``/``skip_v`` (nonzero on the skip heads only). ``dk``, ``dv`` (optional,
    ``(B.., H, N, d)``) are upstream gradients on the layer's own ``cache["k"]``, ``cache["v"]``."""
    x = cache["x"]
    g = as_dout(dout, cache["y_shape"], x.dtype)
    if (dk is None) != (dv is None):
        raise TypeError("dk and dv must be given together")
    if dk is not None:
        dk = as_dout(dk, cache["k"].shape, x.dtype, name="dk")
        dv = as_dout(dv, cache["v"].shape, x.dtype, name="dv")
    grads = {}
    dx, skip = _layer_backward(g, cache, cache["p"], grads, dk, dv)
    grads["x"] = dx
    if cache["skip_given"]:
        if skip is None:
            skip = (np.zeros_like(cache["k"]), np.zeros_like(cache["v"]))
        grads["skip_k"], grads["skip_v"] = skip
    return grads


def skip_layer_stack_forward(x, params, *, num_layers: int, num_heads: int, skip_heads=0, skip_distance: int = 1,
                             is_causal: bool = False, causal_alignment: str = "top_left", scale=None):
    r"""$L$ residual attention layers, $h_{l+1} = h_l + \mathrm{SLA}_l(h_l)$; layer $l\ge n_l$'s skip
    heads read layer $l - n_l$'s keys and values.

    Parameters
    ----------
    x : array (B.., N, C)
    params : dict
        ``"layers.{l}.q_proj.weight" (C, Hd)``, ``...k_proj``, ``...v_proj``, ``"layers.{l}.out_proj.weight"
        (Hd, C)`` for ``l = 0..L-1``, optional ``.bias`` entries.
    num_layers, num_heads : int
    skip_heads : int or sequence of int
        The skip heads (the same in every layer that skips).
    skip_distance : int >= 1
        $n_l$.
    is_causal, causal_alignment, scale
        As :func:`sdpa_forward`.

    Returns
    -------
    out, cache
        ``out (B.., N, C)``: $h_L$.
    """
    x = as_float(x, "x", min_ndim=2)
    n_layers = check_size(num_layers, "num_layers")
    h = check_size(num_heads, "num_heads")
    nl = check_size(skip_distance, "skip_distance")
    heads = _skip_set(skip_heads, h)
    if params is None:
        raise TypeError("params is required: layers.{l}.q_proj/k_proj/v_proj/out_proj weights")
    c = x.shape[-1]
    names = [f"layers.{i}.{n}" for i in range(n_layers) for n in _PROJ]
    check_param_keys(params, [n + ".weight" for n in names], [n + ".bias" for n in names],
                     where="skip_layer_attention (stack; weights (in, out))")
    wq = as_float(params["layers.0.q_proj.weight"], "layers.0.q_proj.weight", ndim=2)
    if wq.shape[0] != c or wq.shape[1] % h:
        raise ValueError(f"layers.0.q_proj.weight must have shape (C={c}, H*d) with H={h}; got {wq.shape}")
    d = wq.shape[1] // h
    spec = {}
    for i in range(n_layers):
        spec.update(_spec(f"layers.{i}.", c, h, d, c))
    p = check_params(params, spec, optional=[k for k in spec if k.endswith(".bias")], where="skip_layer_attention")
    dt = compute_dtype(x, *p.values())
    hcur, p = x.astype(dt, copy=False), cast_all(dt, p)
    mask_cfg = _mask_cfg(None, is_causal, causal_alignment, scale)
    layers = []
    for i in range(n_layers):
        src = layers[i - nl] if i >= nl else None
        y, lc = _layer(hcur, p, f"layers.{i}.", h, d, heads, None if src is None else src["k"],
                       None if src is None else src["v"], mask_cfg)
        layers.append(lc)
        hcur = hcur + y
    return hcur, {"p": p, "layers": layers, "nl": nl, "out_shape": hcur.shape, "dtype": dt}


def skip_layer_stack_backward(dout, cache):
    """Gradient of :func:`skip_layer_stack_forward`: ``x`` and every layer's params (with the
    key/value gradients of the skip heads accumulated into the earlier layers' projections)."""
    p, layers, nl = cache["p"], cache["layers"], cache["nl"]
    g = as_dout(dout, cache["out_shape"], cache["dtype"])
    grads = {}
    pending = {}
    for i in range(len(layers) - 1, -1, -1):
        dkv = pending.pop(i, (None, None))
        dx, skip = _layer_backward(g, layers[i], p, grads, *dkv)
        if skip is not None:
            pk, pv = pending.get(i - nl, (0.0, 0.0))
            pending[i - nl] = (pk + skip[0], pv + skip[1])
        g = g + dx
    grads["x"] = g
    return grads


def skip_layer_stack(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`skip_layer_stack_forward`."""
    return skip_layer_stack_forward(x, params, **config)[0]


def init_skip_layer_params(rng, c: int, num_heads: int, head_dim: int, *, num_layers=None, bias: bool = True) -> dict:
    """Random parameters (xavier-like) of one layer (``num_layers=None``) or of a stack (``layers.{l}.`` prefixes)."""
    def one(prefix):
        out = {}
        for n, (i, o) in {"q_proj": (c, num_heads * head_dim), "k_proj": (c, num_heads * head_dim),
                          "v_proj": (c, num_heads * head_dim), "out_proj": (num_heads * head_dim, c)}.items():
            out[f"{prefix}{n}.weight"] = rng.uniform(-1, 1, (i, o)) * np.sqrt(6.0 / (i + o))
            if bias:
                out[f"{prefix}{n}.bias"] = 0.1 * rng.standard_normal(o)
        return out

    if num_layers is None:
        return one("")
    p = {}
    for i in range(num_layers):
        p.update(one(f"layers.{i}."))
    return p


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size):
    if size == "tiny":
        n, c, h, d, nlay, nl = int(rng.integers(2, 4)), 2, 2, 1, 2, 1
    else:
        n, c, h, d, nlay, nl = int(rng.integers(4, 7)), 6, 3, 2, 3, int(rng.integers(1, 3))
    params = init_skip_layer_params(rng, c, h, d, num_layers=nlay, bias=bool(rng.random() < 0.5))
    cfg = {"num_layers": nlay, "num_heads": h, "skip_heads": 1 if size == "tiny" else int(rng.integers(1, h + 1)),
           "skip_distance": nl, "is_causal": bool(rng.random() < 0.5)}
    return Sample(inputs={"x": rng.standard_normal((2, n, c))}, params=params, config=cfg)


def _reference(x, params, *, num_layers, num_heads, skip_heads=0, skip_distance=1, is_causal=False,
               causal_alignment="top_left", scale=None):
    # explicit per-layer, per-head loop: skip heads of layer l read layer (l - n_l)'s projected K, V
    heads = _skip_set(skip_heads, num_heads)
    b, n, c = x.shape
    hcur = x
    kv = []
    for i in range(num_layers):
        def lin(name, t, i=i):
            return t @ params[f"layers.{i}.{name}.weight"] + params.get(f"layers.{i}.{name}.bias", 0.0)

        q, k, v = lin("q_proj", hcur), lin("k_proj", hcur), lin("v_proj", hcur)
        kv.append((k, v))
        e = q.shape[-1]
        d = e // num_heads
        s = d ** -0.5 if scale is None else scale
        o = np.zeros((b, n, e))
        for hh in range(num_heads):
            sl = slice(hh * d, (hh + 1) * d)
            kk, vv = kv[i - skip_distance] if (hh in heads and i >= skip_distance) else (k, v)
            for bb in range(b):
                lg = s * q[bb, :, sl] @ kk[bb, :, sl].T
                if is_causal:
                    lg = np.where(np.tri(n, dtype=bool), lg, -np.inf)
                w = np.exp(lg - lg.max(-1, keepdims=True))
                o[bb, :, sl] = (w / w.sum(-1, keepdims=True)) @ vv[bb, :, sl]
        hcur = hcur + lin("out_proj", o)
    return hcur


def _check_no_skip_heads_is_mha(rng):
    from .mha import mha

    x = rng.standard_normal((2, 5, 4))
    p = init_skip_layer_params(rng, 4, 2, 2, num_layers=3)
    ref = x
    for i in range(3):
        pm = {n: p[f"layers.{i}.{n}.weight"] for n in _PROJ}
        pm.update({n + "_bias": p[f"layers.{i}.{n}.bias"] for n in _PROJ})
        ref = ref + mha(ref, params=pm, num_heads=2, is_causal=True)
    err = float(np.abs(skip_layer_stack(x, p, num_layers=3, num_heads=2, skip_heads=0, is_causal=True) - ref).max())
    lp = {k.removeprefix("layers.0."): v for k, v in p.items() if k.startswith("layers.0.")}
    k0 = rng.standard_normal((2, 2, 5, 2))
    y = skip_layer_attention_forward(x, lp, k0, k0, num_heads=2, skip_heads=())[0]
    pm = {n: lp[n + ".weight"] for n in _PROJ}
    pm.update({n + "_bias": lp[n + ".bias"] for n in _PROJ})
    err = max(err, float(np.abs(y - mha(x, params=pm, num_heads=2)).max()))
    assert err < 1e-12, err
    return err


def _check_cross_layer_gradient(rng):
    # in a 2-layer stack with n_l = 1 and every head skipping, layer 1's own k/v projections get no
    # gradient and layer 0's get the sum of both layers' contributions
    x = rng.standard_normal((2, 4, 4))
    p = init_skip_layer_params(rng, 4, 2, 2, num_layers=2)
    y, c = skip_layer_stack_forward(x, p, num_layers=2, num_heads=2, skip_heads=2)
    g = skip_layer_stack_backward(rng.standard_normal(y.shape), c)
    err = max(float(np.abs(g["layers.1.k_proj.weight"]).max()), float(np.abs(g["layers.1.v_proj.bias"]).max()))
    assert err < 1e-14, err
    no_skip = skip_layer_stack_backward(np.ones_like(y), skip_layer_stack_forward(x, p, num_layers=2, num_heads=2)[1])
    assert np.abs(no_skip["layers.1.k_proj.weight"]).max() > 1e-6
    return err


register(
    Mechanism(
        slug="skip_layer_attention", family="1-softmax", tier="T2",
        title="Skip-Layer Attention: skip heads attend to an earlier layer's keys and values",
        paper="Qian Chen et al., Skip-Layer Attention: Bridging Abstract and Detailed Dependencies in Transformers, "
              "arXiv 2406.11274 (2024)",
        forward=skip_layer_stack_forward, backward=skip_layer_stack_backward, sample=_sample, reference=_reference,
        docs="softmax/qkv-variants.md#skip-layer-attention",
        checks={"no_skip_heads_is_mha": _check_no_skip_heads_is_mha,
                "cross_layer_gradient": _check_cross_layer_gradient},
    ),
)
