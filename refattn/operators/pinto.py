r"""PINTO: physics-informed transformer neural operator with cross-attention kernel-integral units.

Paper: Boya & Subramani, "PINTO: Physics-informed transformer neural operator for learning
generalized solutions of partial differential equations for any initial and boundary condition",
arXiv 2412.09009 (2024). Upstream: quest-lab-iisc/PINTO (TensorFlow/Keras),
``Burgers/Code/PINTO/be1d_model.py``, ``Lid-Driven/Code/PINTO/LDF_PINTO_model.py``,
``Advection/Code/PINTO/PINTO_model.py`` @ c534c099b94b0c4c480156136283d2a8b26f440a.

The operator maps the initial/boundary data $\{(x_b, u_b)\}$ (``xb``, ``ub``) to the solution at
query points $x$ (``xq``; space and time coordinates). Its three stages, all implemented here:

1. **Lifting** (Keras ``spatial_layer*``): $h^0 = \mathrm{MLP}_q(\rho(x))$; boundary position
   encoding (``bpe_layer*``) $P = \mathrm{MLP}_k(\rho(x_b))$ and boundary value encoding
   (``bve_layer*``) $V = \mathrm{MLP}_v(s_u u_b)$, every Dense followed by the activation;
   $\rho(c) = 2c - 1$ (``Rescaling(scale=2, offset=-1)``), $s_u$ the value scale (1; 1/3 for the
   lid-driven cavity).
2. **Kernel-integral units** (the paper's innovation), $\ell = 1..L$: the cross-attention is a
   kernel integral over the boundary points with a learned, data-dependent kernel,

   $$h \leftarrow h + \mathrm{MHA}_\ell(h, P, V),\qquad h \leftarrow h + \mathrm{FFN}_\ell(h),$$

   Keras ``MultiHeadAttention``: $q = hW_Q + b_Q$, $k = PW_K + b_K$, $v = VW_V + b_V$ per head
   (kernels $(d, H, d_k)$), $\mathrm{softmax}(qk^\top/\sqrt{d_k})v$, then $W_O$ $(H, d_v, d)$ $+\,b_O$;
   the FFN is two Dense layers each followed by the activation.
3. **Projection** (``ou*``, ``output_u``): an MLP with the activation after every layer but the
   last.

Conventions
-----------
* ``activation``: ``"tanh"`` (advection, Burgers) or ``"swish"`` (= SiLU; Navier–Stokes cases).
* The advection and Burgers scripts end their last unit with a single Dense+activation without
  residual: that is the first layer of their projection here (give ``projection.0`` that layer).
  The advection script adds the output of that layer to the input of the output layer
  (``ou = ou + residual``): ``projection_residual=True``.
* Each query point is processed independently (it attends to the boundary set only), so the
  backward with $\partial L/\partial u_i = 1$ gives every point's own $\partial u_i/\partial x_i$ at
  once — the derivative a physics loss needs.
* Keras ``kernel`` → ``weight`` with the same orientation (``(in, out)``; MHA kernels keep Keras's
  ``(d, H, d_k)`` / ``(H, d_v, d)``). Dropout is not used upstream.

Backward
--------
Reverse mode through the stages: Dense and activation VJPs; the attention VJP
(:func:`refattn.attention.softmax.attention_core_backward`) gives $dq, dk, dv$, then
$dW_Q = \sum h^\top dq$, $dh \mathrel{+}= dq\,W_Q^\top$ (per head), likewise $dP$ and $dV$ from
$dk$ and $dv$, accumulated over the units; the boundary encoders and the lifting MLP are then
back-propagated to $x_b$, $u_b$ and $x$ (times the rescaling factors).
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_choice, check_int, check_params, compute_dtype
from ..attention.softmax import attention_core_backward, attention_core_forward
from ..nn.activations import silu, silu_grad
from ..nn.linear import linear_prefixed, linear_prefixed_spec, linear_prefixed_vjp
from ..registry import Mechanism, Sample, register

__all__ = ["pinto_forward", "pinto_backward", "pinto", "init_pinto_params"]

_ACT = {"tanh": (np.tanh, lambda z: 1.0 - np.tanh(z) ** 2), "swish": (silu, silu_grad)}
_MLPS = ("lifting", "key_encoder", "value_encoder", "projection")


def _count(params, prefix):
    n = 0
    while f"{prefix}.{n}.weight" in params:
        n += 1
    return n


def _validate(xq, xb, ub, params, num_heads, activation, coord_scale, coord_offset, value_scale):
    xq = as_float(xq, "xq", ndim=3)
    xb = as_float(xb, "xb", ndim=3)
    ub = as_float(ub, "ub", ndim=3)
    if xb.shape[0] != xq.shape[0] or xb.shape[2] != xq.shape[2]:
        raise ValueError(f"xb must have shape (B={xq.shape[0]}, M, {xq.shape[2]}) like xq's coordinates; got {xb.shape}")
    if ub.shape[:2] != xb.shape[:2]:
        raise ValueError(f"ub must have shape (B, M) = {xb.shape[:2]} + (channels,) to match xb; got {ub.shape}")
    num_heads = check_int(num_heads, "num_heads", minimum=1)
    check_choice(activation, "activation", tuple(_ACT))
    for name, val in (("coord_scale", coord_scale), ("coord_offset", coord_offset), ("value_scale", value_scale)):
        if isinstance(val, bool) or not isinstance(val, (int, float, np.floating, np.integer)) or not np.isfinite(val):
            raise TypeError(f"{name} must be a finite real number; got {val!r}")
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of arrays; got {type(params).__name__}")
    layers = {m: _count(params, m) for m in _MLPS}
    for m, cnt in layers.items():
        if cnt == 0:
            raise ValueError(f"params is missing keys ['{m}.0.weight']")
    n_units = 0
    while f"units.{n_units}.attention.query.weight" in params:
        n_units += 1
    spec, widths = {}, {}
    for m, first in (("lifting", xq.shape[2]), ("key_encoder", xb.shape[2]), ("value_encoder", ub.shape[2])):
        w_in = first
        for i in range(layers[m]):
            w = as_float(params[f"{m}.{i}.weight"], f"{m}.{i}.weight", ndim=2)
            spec.update(linear_prefixed_spec(f"{m}.{i}", w_in, w.shape[1]))
            w_in = w.shape[1]
        widths[m] = w_in
    d = widths["lifting"]
    if n_units:
        wq = as_float(params["units.0.attention.query.weight"], "units.0.attention.query.weight", ndim=3)
        if wq.shape[1] != num_heads:
            raise ValueError(f"units.0.attention.query.weight must have shape (d, num_heads={num_heads}, key_dim); "
                             f"got {wq.shape}")
        dk = dv = wq.shape[2]
        if "units.0.attention.value.weight" in params:   # absent: check_params below reports it
            dv = as_float(params["units.0.attention.value.weight"], "units.0.attention.value.weight", ndim=3).shape[2]
    for u in range(n_units):
        pre = f"units.{u}.attention"
        spec.update({f"{pre}.query.weight": (d, num_heads, dk), f"{pre}.query.bias": (num_heads, dk),
                     f"{pre}.key.weight": (widths["key_encoder"], num_heads, dk), f"{pre}.key.bias": (num_heads, dk),
                     f"{pre}.value.weight": (widths["value_encoder"], num_heads, dv),
                     f"{pre}.value.bias": (num_heads, dv),
                     f"{pre}.output.weight": (num_heads, dv, d), f"{pre}.output.bias": (d,)})
        for i in range(_count(params, f"units.{u}.ffn")):
            spec.update(linear_prefixed_spec(f"units.{u}.ffn.{i}", d, d))
    w_in = d
    for i in range(layers["projection"]):
        w = as_float(params[f"projection.{i}.weight"], f"projection.{i}.weight", ndim=2)
        spec.update(linear_prefixed_spec(f"projection.{i}", w_in, w.shape[1]))
        w_in = w.shape[1]
    p = check_params(params, spec)
    dt = compute_dtype(xq, xb, ub, *p.values())
    return ((xq.astype(dt, copy=False), xb.astype(dt, copy=False), ub.astype(dt, copy=False)), cast_all(dt, p),
            layers, n_units)


def _mlp(p, prefix, t, n_layers, act, act_last):
    hs, pres = [t], []
    for i in range(n_layers):
        z = linear_prefixed(p, f"{prefix}.{i}", hs[-1])
        pres.append(z)
        hs.append(act[0](z) if (act_last or i < n_layers - 1) else z)
    return hs, pres


def _mlp_vjp(grads, p, prefix, g, hs, pres, act, act_last):
    n_layers = len(pres)
    for i in reversed(range(n_layers)):
        if act_last or i < n_layers - 1:
            g = g * act[1](pres[i])
        g = linear_prefixed_vjp(grads, p, f"{prefix}.{i}", g, hs[i])
    return g


def _proj(p, pre, t, w_name):
    return np.einsum("bnd,dhk->bhnk", t, p[f"{pre}.{w_name}.weight"]) + p[f"{pre}.{w_name}.bias"][:, None, :]


def pinto_forward(xq, xb, ub, params, *, num_heads: int = 2, activation: str = "tanh",
                  coord_scale: float = 2.0, coord_offset: float = -1.0, value_scale: float = 1.0,
                  projection_residual: bool = False):
    r"""PINTO operator: lifting, $L$ cross-attention kernel-integral units, projection.

    Parameters
    ----------
    xq : array (B, N, p)
        Query points (space/time coordinates) where the solution is wanted.
    xb : array (B, M, p)
        Initial/boundary points; ``ub (B, M, q)`` the initial/boundary values there.
    params : dict
        ``lifting.{i}``, ``key_encoder.{i}``, ``value_encoder.{i}``, ``projection.{i}``
        (``.weight (in, out)``, ``.bias``), and per unit ``units.{l}.attention.{query,key,value}.weight``
        ``(in, H, d_k)`` / ``.bias (H, d_k)``, ``units.{l}.attention.output.weight (H, d_v, d)`` / ``.bias (d,)``
        and ``units.{l}.ffn.{i}`` Dense layers ``(d, d)``. :func:`init_pinto_params` builds them.
    num_heads : int
        Attention heads (upstream 2, key_dim 64).
    activation : {"tanh", "swish"}
    coord_scale, coord_offset, value_scale : float
        Input rescaling $\rho(c) = s c + o$ of both coordinate sets (upstream $2c-1$) and of ``ub``.
    projection_residual : bool
        The advection script's skip from the first projection layer to the output layer.

    Returns
    -------
    out, cache
        ``out (B, N, out_channels)``.
    """
    (xq, xb, ub), p, layers, n_units = _validate(xq, xb, ub, params, num_heads, activation, coord_scale,
                                                 coord_offset, value_scale)
    act = _ACT[activation]
    c = {}
    c["lift"] = _mlp(p, "lifting", xq * coord_scale + coord_offset, layers["lifting"], act, True)
    c["key"] = _mlp(p, "key_encoder", xb * coord_scale + coord_offset, layers["key_encoder"], act, True)
    c["value"] = _mlp(p, "value_encoder", ub * value_scale, layers["value_encoder"], act, True)
    pe, ce, h = c["key"][0][-1], c["value"][0][-1], c["lift"][0][-1]
    units = []
    for u in range(n_units):
        pre = f"units.{u}.attention"
        q, k, v = _proj(p, pre, h, "query"), _proj(p, pre, pe, "key"), _proj(p, pre, ce, "value")
        o, acache = attention_core_forward(q, k, v)
        a = np.einsum("bhnk,hkd->bnd", o, p[f"{pre}.output.weight"]) + p[f"{pre}.output.bias"]
        h1 = h + a
        ffn = _mlp(p, f"units.{u}.ffn", h1, _count(p, f"units.{u}.ffn"), act, True)
        units.append(dict(h=h, o=o, acache=acache, h1=h1, ffn=ffn))
        h = h1 + ffn[0][-1] if ffn[1] else h1
    n_proj = layers["projection"]
    hs, pres = [h], []
    for i in range(n_proj):
        t = hs[-1] + hs[1] if (projection_residual and i == n_proj - 1 and n_proj > 2) else hs[-1]
        z = linear_prefixed(p, f"projection.{i}", t)
        pres.append(z)
        hs.append(act[0](z) if i < n_proj - 1 else z)
    out = hs.pop()          # the cache keeps the layer inputs only, never the returned array
    cache = dict(inputs=(xq, xb, ub), p=p, c=c, units=units, proj=(hs, pres), act=activation,
                 scales=(coord_scale, value_scale), residual=projection_residual and n_proj > 2, out_shape=out.shape)
    return out, cache


def pinto_backward(dout, cache):
    """Gradients of :func:`pinto_forward`: ``xq``, ``xb``, ``ub`` and every params key."""
    xq, xb, ub = cache["inputs"]
    p, act = cache["p"], _ACT[cache["act"]]
    g = as_dout(dout, cache["out_shape"], xq.dtype)
    grads = {}
    hs, pres = cache["proj"]
    n_proj = len(pres)
    skip = None
    for i in reversed(range(n_proj)):
        if i < n_proj - 1:
            g = g * act[1](pres[i])
        if cache["residual"] and i == n_proj - 1:
            g = linear_prefixed_vjp(grads, p, f"projection.{i}", g, hs[i] + hs[1])
            skip = g
            continue
        g = linear_prefixed_vjp(grads, p, f"projection.{i}", g, hs[i])
        if skip is not None and i == 1:
            g = g + skip
    dh = g
    dpe = np.zeros_like(cache["c"]["key"][0][-1])
    dce = np.zeros_like(cache["c"]["value"][0][-1])
    pe, ce = cache["c"]["key"][0][-1], cache["c"]["value"][0][-1]
    for u in reversed(range(len(cache["units"]))):
        un = cache["units"][u]
        pre = f"units.{u}.attention"
        fhs, fpres = un["ffn"]
        dh1 = dh + (_mlp_vjp(grads, p, f"units.{u}.ffn", dh, fhs, fpres, act, True) if fpres else 0.0)
        grads[f"{pre}.output.bias"] = dh1.sum(axis=(0, 1))
        grads[f"{pre}.output.weight"] = np.einsum("bhnk,bnd->hkd", un["o"], dh1)
        do = np.einsum("bnd,hkd->bhnk", dh1, p[f"{pre}.output.weight"])
        ga = attention_core_backward(do, un["acache"])
        for name, src, dg in (("query", un["h"], ga["q"]), ("key", pe, ga["k"]), ("value", ce, ga["v"])):
            grads[f"{pre}.{name}.weight"] = np.einsum("bnd,bhnk->dhk", src, dg)
            grads[f"{pre}.{name}.bias"] = dg.sum(axis=(0, 2))
        dh = dh1 + np.einsum("bhnk,dhk->bnd", ga["q"], p[f"{pre}.query.weight"])
        dpe = dpe + np.einsum("bhmk,dhk->bmd", ga["k"], p[f"{pre}.key.weight"])
        dce = dce + np.einsum("bhmk,dhk->bmd", ga["v"], p[f"{pre}.value.weight"])
    s_c, s_v = cache["scales"]
    grads["xq"] = _mlp_vjp(grads, p, "lifting", dh, *cache["c"]["lift"], act, True) * s_c
    grads["xb"] = _mlp_vjp(grads, p, "key_encoder", dpe, *cache["c"]["key"], act, True) * s_c
    grads["ub"] = _mlp_vjp(grads, p, "value_encoder", dce, *cache["c"]["value"], act, True) * s_v
    return grads


def pinto(xq, xb, ub, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`pinto_forward`."""
    return pinto_forward(xq, xb, ub, params, **config)[0]


def init_pinto_params(rng, coord_dim: int, value_dim: int, out_dim: int = 1, *, d_model: int = 64,
                      num_heads: int = 2, key_dim: int = 64, n_units: int = 2, encoder_layers: int = 2,
                      ffn_layers: int = 2, projection=(64, 64), dtype=np.float64) -> dict:
    """PINTO parameters (Burgers/lid-driven layout: uniform units). Dense and MHA kernels are
    Glorot-uniform as upstream's ``GlorotUniform``; biases 0."""
    def glorot(shape, fan_in, fan_out):
        bound = np.sqrt(6.0 / (fan_in + fan_out))
        return rng.uniform(-bound, bound, shape)

    def dense(prefix, n_in, n_out):
        return {f"{prefix}.weight": glorot((n_in, n_out), n_in, n_out), f"{prefix}.bias": np.zeros(n_out)}

    p = {}
    for name, n_in in (("lifting", coord_dim), ("key_encoder", coord_dim), ("value_encoder", value_dim)):
        for i in range(encoder_layers):
            p.update(dense(f"{name}.{i}", n_in if i == 0 else d_model, d_model))
    for u in range(n_units):
        pre = f"units.{u}.attention"
        for name in ("query", "key", "value"):
            p[f"{pre}.{name}.weight"] = glorot((d_model, num_heads, key_dim), d_model, num_heads * key_dim)
            p[f"{pre}.{name}.bias"] = np.zeros((num_heads, key_dim))
        p[f"{pre}.output.weight"] = glorot((num_heads, key_dim, d_model), num_heads * key_dim, d_model)
        p[f"{pre}.output.bias"] = np.zeros(d_model)
        for i in range(ffn_layers):
            p.update(dense(f"units.{u}.ffn.{i}", d_model, d_model))
    widths = [d_model, *projection, out_dim]
    for i in range(len(widths) - 1):
        p.update(dense(f"projection.{i}", widths[i], widths[i + 1]))
    return {k: v.astype(dtype) for k, v in p.items()}


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size, *, activation="tanh", residual=False):
    if size == "tiny":
        n, m, d, heads, dk, units, proj = 2, 3, 2, 2, 1, 1, (2,)
    else:
        n, m, d, heads, dk, units, proj = int(rng.integers(3, 6)), int(rng.integers(4, 8)), 6, 2, 3, 2, (5, 5)
    p = init_pinto_params(rng, 2, 1, 1, d_model=d, num_heads=heads, key_dim=dk, n_units=units, projection=proj)
    for k in p:
        if k.endswith("bias"):
            p[k] = p[k] + 0.2 * rng.standard_normal(p[k].shape)
        if k.endswith(("query.weight", "key.weight")):     # sharper attention: the score path matters
            p[k] = 3.0 * p[k]
    inputs = {"xq": rng.uniform(0, 1, (2, n, 2)), "xb": rng.uniform(0, 1, (2, m, 2)),
              "ub": rng.standard_normal((2, m, 1))}
    return Sample(inputs=inputs, params=p, config={"num_heads": heads, "activation": activation,
                                                   "projection_residual": residual})


def _reference(xq, xb, ub, params, *, num_heads=2, activation="tanh", coord_scale=2.0, coord_offset=-1.0,
               value_scale=1.0, projection_residual=False):
    # Keras graph written out: per-head loops, an explicit softmax over the boundary points.
    f = np.tanh if activation == "tanh" else (lambda z: z / (1.0 + np.exp(-z)))

    def mlp(prefix, t, act_last=True):
        i = 0
        while f"{prefix}.{i}.weight" in params:
            t = t @ params[f"{prefix}.{i}.weight"] + params[f"{prefix}.{i}.bias"]
            i += 1
            if act_last or f"{prefix}.{i}.weight" in params:
                t = f(t)
        return t

    h = mlp("lifting", coord_scale * xq + coord_offset)
    pe, ce = mlp("key_encoder", coord_scale * xb + coord_offset), mlp("value_encoder", value_scale * ub)
    u = 0
    while f"units.{u}.attention.query.weight" in params:
        w = {k: params[f"units.{u}.attention.{k}.weight"] for k in ("query", "key", "value", "output")}
        b = {k: params[f"units.{u}.attention.{k}.bias"] for k in ("query", "key", "value", "output")}
        att = np.zeros_like(h) + b["output"]
        for hd in range(num_heads):
            q, k = h @ w["query"][:, hd] + b["query"][hd], pe @ w["key"][:, hd] + b["key"][hd]
            v = ce @ w["value"][:, hd] + b["value"][hd]
            s = q @ np.swapaxes(k, 1, 2) / np.sqrt(q.shape[-1])
            e = np.exp(s - s.max(-1, keepdims=True))
            att = att + (e / e.sum(-1, keepdims=True)) @ v @ w["output"][hd]
        h = h + att
        h = h + mlp(f"units.{u}.ffn", h)
        u += 1
    i, hs = 0, [h]
    while f"projection.{i}.weight" in params:
        last = f"projection.{i + 1}.weight" not in params
        t = hs[-1] + hs[1] if (projection_residual and last and i > 1) else hs[-1]
        t = t @ params[f"projection.{i}.weight"] + params[f"projection.{i}.bias"]
        hs.append(t if last else f(t))
        i += 1
    return hs[-1]


def _check_boundary_permutation_invariance(rng):
    s = _sample(rng, "small")
    base = pinto(**s.inputs, params=s.params, **s.config)
    perm = rng.permutation(s.inputs["xb"].shape[1])
    out = pinto(s.inputs["xq"], s.inputs["xb"][:, perm], s.inputs["ub"][:, perm], s.params, **s.config)
    err = float(np.abs(out - base).max())
    assert err < 1e-13, f"permuting the boundary points changed the solution by {err:.2e}"
    return err


def _check_pointwise_coordinate_derivative(rng):
    # Query points do not interact: one backward with dL/du = 1 gives every point's own du_i/dx_i,
    # which must equal its finite-difference derivative (the physics-loss derivative).
    s = _sample(rng, "small", activation="swish")
    out, cache = pinto_forward(**s.inputs, params=s.params, **s.config)
    grad = pinto_backward(np.ones_like(out), cache)["xq"]
    eps, err = 1e-6, 0.0
    for a in range(2):
        step = np.zeros_like(s.inputs["xq"])
        step[..., a] = eps
        up = pinto(s.inputs["xq"] + step, s.inputs["xb"], s.inputs["ub"], s.params, **s.config)
        dn = pinto(s.inputs["xq"] - step, s.inputs["xb"], s.inputs["ub"], s.params, **s.config)
        fd = (up - dn)[..., 0] / (2 * eps)
        err = max(err, float(np.abs(fd - grad[..., a]).max() / np.abs(fd).max()))
    assert err < 1e-7, f"per-point derivative differs from finite differences by {err:.2e}"
    return err


def _check_projection_residual(rng):
    # The advection layout: out = W_L(P_{L-1}(...P_1(h_1)) + h_1) with h_1 the first projection output.
    s = _sample(rng, "small", residual=True)
    got = pinto(**s.inputs, params=s.params, **s.config)
    ref = _reference(**s.inputs, params=s.params, **s.config)
    plain = pinto(**s.inputs, params=s.params, **dict(s.config, projection_residual=False))
    err = float(np.abs(got - ref).max())
    assert err < 1e-12 and np.abs(plain - got).max() > 1e-6, f"projection residual wrong: {err:.2e}"
    return err


register(
    Mechanism(
        slug="pinto_cross_attention_kernel_integral", family="3-operator", tier="T2",
        title="PINTO: cross-attention kernel-integral units to IC/BC points",
        paper="Boya & Subramani, PINTO: Physics-informed transformer neural operator for learning generalized "
              "solutions of partial differential equations for any initial and boundary condition, arXiv 2412.09009",
        forward=pinto_forward, backward=pinto_backward, sample=_sample, reference=_reference,
        docs="operators/kernel-integrals-and-scans.md#pinto-cross-attention-kernel-integral-units",
        checks={"boundary_permutation_invariance": _check_boundary_permutation_invariance,
                "pointwise_coordinate_derivative": _check_pointwise_coordinate_derivative,
                "projection_residual": _check_projection_residual},
    ),
)
