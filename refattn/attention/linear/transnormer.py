r"""TransNormer: NormAttention (linear attention with a norm instead of the row-sum denominator),
its full layer as trained (``transnormer_t1``), and DiagAttention (softmax attention inside
non-overlapping blocks).

Qin, Han, Sun, Li, Kong, Barnes, Zhong, "The Devil in Linear Transformer", EMNLP 2022,
arXiv 2210.10340. Upstream: OpenNLPLab/fairseq-evo @ 38fa81f233c4e5b4376fb52d86eaa1a80d42bf6a
(the authors' fairseq fork that OpenNLPLab/Transnormer trains with):
``fairseq/modules/x_attention/norm_linear_attention.py`` (``NormLinearAttention``),
``fairseq/models/lm_x_attention/norm_transformer_lm.py`` (arch ``transnormer_t1``),
``fairseq/modules/positional_encoding/urpe.py`` (``Urpe``), ``fairseq/modules/norm/rms_norm.py``
(``SimpleRMSNorm``) and ``fairseq/modules/helpers/helpers.py`` (``get_activation_fn``).

NormAttention
-------------
$$O = \mathrm{Norm}\big(\phi(Q)(\phi(K)^\top V)\big),\qquad
O_i = \mathrm{Norm}\Big(\phi(q_i)^\top\sum_{j\le i}\phi(k_j)v_j^\top\Big)\ \text{(causal)},$$

the un-normalised feature-space core of `refattn.attention.linear.core` followed by a norm over
the concatenated heads (upstream) or each head. With URPE (``urpe.theta``/``urpe.v`` present) the
features are rotated per position first, $\phi(q_i) \to R_i\,H\phi(q_i)$, $\phi(k_j) \to R_jH\phi(k_j)$
with the Householder reflection $H = I - 2vv^\top$ and the interleaved rotation $R_t$ of feature
pair $j$ by $t\,\theta_j$ (upstream ``Urpe(core_matrix=1, p_matrix=3)``: ``rope`` after
``householder``, no transpose back), so $(R_iH\phi_i)\cdot(R_jH\phi_j)$ depends on $i - j$.

Backward: the norm VJP, then the core's VJP with $\mathrm{den} = 1$ (no quotient rule: $c = 0$),
then the URPE VJP and the feature-map VJP. SimpleRMSNorm $y = x/s$, $s = \|x\|/\sqrt E + \epsilon$
(eps outside the root, no parameters): $\partial s/\partial x_j = x_j/(E r)$ with $r = \|x\|/\sqrt E$,
so $dx = \big(g - x\,\frac{\sum_i g_iy_i}{E\,r}\big)/s$. URPE: the rotation's adjoint is the
rotation by $-t\theta$, $\bar x = g\cos - \mathrm{rot}(g\sin)$ ($\mathrm{rot}(a, b) = (-b, a)$ per
pair); $d\theta_j = \sum_t t\,\langle g_{t,j}, \mathrm{rot}(x_{t,j})\cos(t\theta_j) - x_{t,j}\sin(t\theta_j)\rangle$
(pair $j$'s two channels); the reflection is its own adjoint, $\bar x = g - 2(g\cdot v)v$, and
$dv = -2\sum_t\big((x_t\cdot v)\,g_t + (g_t\cdot v)\,x_t\big)$.

The layer
---------
`transnormer_layer_forward` is upstream's ``NormLinearAttention`` as a self-attention layer:
$Q, K, V = XW_{q,k,v} + b$ (``q_proj``, ``k_proj``, ``v_proj``), heads split head-major, the
NormAttention above, ``out_proj``. Its defaults are the ``transnormer_t1`` arch (the trained
TransNormer's linear layers): ``act_fun="elu"`` ($\phi$ = ELU, no $+1$: features may be negative,
which is fine without a denominator), ``norm_type="simplermsnorm"``, ``causal=True``,
``has_out=True`` and URPE with learned $\theta$ and a fixed Householder vector.

DiagAttention
-------------
$P = \mathrm{softmax}(sQK^\top + \log M)$, $O = PV$ with the block-diagonal mask
$M_{ij} = [\lfloor i/w\rfloor = \lfloor j/w\rfloor]$ (and $j\le i$ when causal). Backward:
$dV = P^\top G$, $dS = P\odot(GV^\top - \mathrm{rowsum}(P\odot GV^\top))$, $dQ = s\,dS\,K$,
$dK = s\,dS^\top Q$. It is the ``use_softmax=True`` form of upstream's ``NormLocalAttention``
(``forward_chunk``); ``transnormer_t1`` runs that module with ``use_softmax=False`` (ReLU scores
inside chunks of 64, then SimpleRMSNorm), which refattn does not implement. It is checked inside
the ``transnormer_norm_attention`` record (``diag_attention``).

Conventions (who does what) are in `transnormer_forward`: ``feature_map`` (upstream ``act_fun``),
``norm`` (upstream ``norm_type``; its ``"rmsnorm"`` puts eps outside the root), ``norm_over``.
"""

from __future__ import annotations

import numpy as np

from ..._checks import (
    as_dout,
    as_float,
    cast_all,
    check_choice,
    check_int,
    check_params,
    check_positive,
    compute_dtype,
)
from ...nn.activations import elu_plus_one, elu_plus_one_grad, gelu, gelu_grad
from ...nn.linear import linear_prefixed, linear_prefixed_spec, linear_prefixed_vjp, merge_heads, split_heads
from ...nn.norms import layer_norm_backward, layer_norm_forward, rms_norm_backward, rms_norm_forward
from ...nn.softmax import softmax_lse, softmax_vjp
from ...registry import Mechanism, Sample, register
from ._samples import fd_max_rel, random_qkv, softmax_attention_reference
from .core import (
    linear_core_backward,
    linear_core_forward,
    mT,
    validate_linear_qkv,
)

__all__ = [
    "TRANSNORMER_FEATURE_MAPS",
    "TRANSNORMER_NORMS",
    "transnormer_forward",
    "transnormer_backward",
    "transnormer",
    "transnormer_layer_forward",
    "transnormer_layer_backward",
    "transnormer_layer",
    "diag_attention_forward",
    "diag_attention_backward",
]

TRANSNORMER_FEATURE_MAPS = ("elu_plus_one", "elu", "gelu", "identity")
TRANSNORMER_NORMS = ("layernorm", "rmsnorm", "simplermsnorm")
_NORM_KEYS = {"layernorm": ("weight", "bias"), "rmsnorm": ("weight",), "simplermsnorm": ()}
_NORM_EPS = {"layernorm": 1e-5, "rmsnorm": 1e-5, "simplermsnorm": 1e-8}
_URPE_KEYS = ("urpe.theta", "urpe.v")


# --------------------------------------------------------------------------------------------
# Feature maps, SimpleRMSNorm and URPE (private math of this module)


def _phi(x, name):
    """``act_fun``: 1+elu, elu (``F.elu``, via expm1 as PyTorch), gelu (exact) or identity."""
    if name == "elu_plus_one":
        return elu_plus_one(x)
    if name == "elu":
        return np.where(x > 0, x, np.expm1(np.minimum(x, 0.0)))
    if name == "gelu":
        return gelu(x)
    return x


def _phi_vjp(g, x, name):
    if name in ("elu_plus_one", "elu"):
        return g * elu_plus_one_grad(x)
    if name == "gelu":
        return g * gelu_grad(x)
    return g


def _simple_rms_forward(x, axis, eps):
    r"""$y = x/(r + \epsilon)$, $r = \|x\|/\sqrt E$ over ``axis`` (upstream ``SimpleRMSNorm``)."""
    e = int(np.prod([x.shape[a] for a in axis]))
    r = np.sqrt(np.sum(x * x, axis=axis, keepdims=True) / e)
    s = r + eps
    return x / s, {"y": x / s, "x": x, "r": r, "s": s, "e": e, "axis": axis}


def _simple_rms_backward(g, c):
    r"""$dx = (g - x\,\sum_i g_iy_i/(E\,r))/s$; at $r = 0$ ($x = 0$) $dx = g/\epsilon$."""
    gy = np.sum(g * c["y"], axis=c["axis"], keepdims=True)
    r = c["r"]
    coef = np.divide(gy, c["e"] * r, out=np.zeros_like(gy), where=r > 0)
    return (g - c["x"] * coef) / c["s"]


def _rot(x):
    """Per feature pair $(a, b) \\mapsto (-b, a)$ (upstream ``x_half``); its adjoint is $-$itself."""
    out = np.empty_like(x)
    out[..., 0::2] = -x[..., 1::2]
    out[..., 1::2] = x[..., 0::2]
    return out


def _urpe_forward(x, theta, v):
    """Householder reflection (``urpe.v``; skipped when None) then the interleaved rotation of pair
    ``j`` at position ``t`` by ``t * theta[j]`` over the token axis -2."""
    h = x if v is None else x - 2.0 * (x @ v)[..., None] * v
    t = np.arange(x.shape[-2], dtype=x.dtype)[:, None]
    ang = np.repeat(t * theta, 2, axis=-1)  # (N, d): pair j's angle on channels 2j, 2j+1
    cos, sin = np.cos(ang), np.sin(ang)
    return h * cos + _rot(h) * sin, {"x": x, "h": h, "cos": cos, "sin": sin, "t": t}


def _urpe_backward(g, c, v):
    """Returns ``(dx, dtheta, dv)`` of :func:`_urpe_forward` (derivation in the module docstring)."""
    h, cos, sin = c["h"], c["cos"], c["sin"]
    dh = g * cos - _rot(g * sin)
    dang = g * (_rot(h) * cos - h * sin)
    lead = tuple(range(g.ndim - 2))
    dang = np.sum(dang, axis=lead) if lead else dang  # (N, d)
    dtheta = np.sum(c["t"] * (dang[:, 0::2] + dang[:, 1::2]), axis=0)
    if v is None:
        return dh, dtheta, None
    x = c["x"]
    dx = dh - 2.0 * (dh @ v)[..., None] * v
    xv, gv = x @ v, dh @ v
    dv = -2.0 * (np.tensordot(xv, dh, axes=(tuple(range(xv.ndim)),) * 2)
                 + np.tensordot(gv, x, axes=(tuple(range(gv.ndim)),) * 2))
    return dx, dtheta, dv


# --------------------------------------------------------------------------------------------
# NormAttention


def transnormer_forward(q, k, v, params=None, *, causal: bool = False, feature_map: str = "elu_plus_one",
                        norm: str = "layernorm", norm_over: str = "concat_heads", norm_eps: float | None = None):
    r"""TransNormer NormAttention (Qin et al., "The Devil in Linear Transformer", EMNLP 2022,
    arXiv 2210.10340): linear attention **without** the row-sum denominator, followed by a norm,

    $$O = \mathrm{Norm}\big(\phi(Q)(\phi(K)^\top V)\big),\qquad
    O_i = \mathrm{Norm}\Big(\phi(q_i)^\top\sum_{j\le i}\phi(k_j)v_j^\top\Big)\ \text{(causal)},$$

    with optional URPE on the features (module docstring). Upstream: OpenNLPLab/fairseq-evo
    ``fairseq/modules/x_attention/norm_linear_attention.py`` (``NormLinearAttention.forward``:
    ``q = act(q_proj(x))``, ``k = act(k_proj(x))``, ``urpe``, ``o1 = k^T v``, ``output = q o1``
    (causal: masked ``q k^T`` then ``@ v``), heads concatenated, ``layer_norm`` over the full
    ``embed_dim``, ``out_proj``). Projections are outside this core
    (`transnormer_layer_forward` adds them).

    Parameters
    ----------
    q (..., N, d), k (..., M, d), v (..., M, dv)
    params : dict or None
        Upstream names: the norm's affine ``"layer_norm.weight"`` (and ``"layer_norm.bias"`` for
        LayerNorm), shape ``(H*dv,)`` for ``norm_over="concat_heads"`` (PyTorch's as-is; head ``h``
        owns entries ``h*dv:(h+1)*dv``) or ``(dv,)`` for ``"head"`` (none for ``"simplermsnorm"``);
        URPE's ``"urpe.theta"`` ``(d/2,)`` (upstream ``(1, 1, d/2)``: pass ``reshape(-1)``) and
        optional ``"urpe.v"`` ``(d,)`` (the Householder vector, used as stored: upstream keeps it
        unit-norm and frozen; its gradient is returned anyway). ``None``: no affine, no URPE.
    causal : bool
    feature_map : {"elu_plus_one", "elu", "gelu", "identity"}
        The kernel $\phi$, upstream ``act_fun``: ``"1+elu"``, ``"elu"`` (``F.elu``, the
        ``transnormer_t1`` arch's ``linear_act_fun``), ``"gelu"`` (the constructor default);
        ``"identity"`` takes $q, k$ as features. refattn's core default stays ``"elu_plus_one"``.
    norm : {"layernorm", "rmsnorm", "simplermsnorm"}
        Upstream ``norm_type`` (constructor default ``"layernorm"``; ``transnormer_t1``:
        ``"simplermsnorm"``, $x/(\|x\|/\sqrt E + \epsilon)$ with no parameters). Upstream's
        ``"rmsnorm"`` is $x/(\mathrm{rms} + 10^{-8})\cdot$``scale``, eps outside the root; refattn's
        ``"rmsnorm"`` is `refattn.nn.norms.rms_norm_forward` (eps inside) with ``layer_norm.weight``.
    norm_over : {"concat_heads", "head"}
        Statistics over the concatenated heads ($H\,d_v$ values per token; upstream, needs the
        layout ``(B, H, N, dv)``) or over each head's $d_v$ values.
    norm_eps : float, optional
        Default: the upstream norm's own (LayerNorm 1e-5, ``SimpleRMSNorm`` 1e-8; ``"rmsnorm"``
        1e-5 as refattn's RMSNorm).

    Notes
    -----
    Backward: the norm VJP, then the feature-space core without the denominator ($\mathrm{den}=1$,
    no quotient rule), then the URPE VJP and the feature-map VJP.
    """
    check_choice(norm, "norm", TRANSNORMER_NORMS)
    check_choice(norm_over, "norm_over", ("concat_heads", "head"))
    check_choice(feature_map, "feature_map", TRANSNORMER_FEATURE_MAPS)
    norm_eps = _NORM_EPS[norm] if norm_eps is None else check_positive(norm_eps, "norm_eps")
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be a bool; got {type(causal).__name__}")
    q, k, v = validate_linear_qkv(q, k, v, same_length=bool(causal))
    if norm_over == "concat_heads" and q.ndim < 4:
        raise ValueError(f"norm_over='concat_heads' needs q of layout (B, H, N, d); got q of shape {q.shape}")
    width = q.shape[-3] * v.shape[-1] if norm_over == "concat_heads" else v.shape[-1]
    spec = {f"layer_norm.{x}": (width,) for x in _NORM_KEYS[norm]}
    d = q.shape[-1]
    spec.update({"urpe.theta": (d // 2,), "urpe.v": (d,)})
    checked = {}
    if params is not None:
        checked = check_params(params, spec, optional=tuple(spec),
                               where=f"transnormer (norm={norm!r}, norm_over={norm_over!r})")
    if "layer_norm.bias" in checked and "layer_norm.weight" not in checked:
        raise ValueError("params has 'layer_norm.bias' but no 'layer_norm.weight' (the norm's affine needs both)")
    if "urpe.v" in checked and "urpe.theta" not in checked:
        raise ValueError("params has 'urpe.v' (the Householder vector) but no 'urpe.theta': URPE needs its angles")
    if "urpe.theta" in checked and d % 2:
        raise ValueError(f"URPE rotates feature pairs: the head width d must be even; got q of shape {q.shape}")
    if "urpe.theta" in checked and not causal and q.shape[-2] != k.shape[-2]:
        raise ValueError(f"URPE needs queries and keys at the same positions (N == M); got q {q.shape}, k {k.shape}")
    checked = cast_all(q.dtype, checked)
    nparams = None
    for key in _NORM_KEYS[norm]:
        a = checked.get(f"layer_norm.{key}")
        if a is not None:
            nparams = nparams or {}
            nparams[key] = a.reshape(q.shape[-3], 1, v.shape[-1]) if norm_over == "concat_heads" else a
    fq, fk = _phi(q, feature_map), _phi(k, feature_map)
    urpe = None
    if "urpe.theta" in checked:
        theta, uv = checked["urpe.theta"], checked.get("urpe.v")
        (fq, cq), (fk, ck) = _urpe_forward(fq, theta, uv), _urpe_forward(fk, theta, uv)
        urpe = (cq, ck, uv)
    h, state = linear_core_forward(fq, fk, v, causal=bool(causal), eps=0.0, normalise=False)
    axis = (-3, -1) if norm_over == "concat_heads" else (-1,)
    if norm == "simplermsnorm":
        out, ncache = _simple_rms_forward(h, axis, norm_eps)
    else:
        fwd = layer_norm_forward if norm == "layernorm" else rms_norm_forward
        out, ncache = fwd(h, nparams, axis=axis, eps=norm_eps)
    return out, {"q": q, "k": k, "v": v, "fq": fq, "fk": fk, "h": h, "state": state, "ncache": ncache,
                 "norm": norm, "causal": bool(causal), "feature_map": feature_map, "urpe": urpe,
                 "param_shapes": {key: np.shape(params[key]) for key in checked}}


def transnormer_backward(dout, cache):
    r"""Gradients ``{"q", "k", "v"}`` (and every params key) of :func:`transnormer_forward`: norm
    VJP, core VJP with $\mathrm{den}=1$, URPE VJP, feature-map VJP."""
    h = cache["h"]
    g = as_dout(dout, h.shape, h.dtype)
    norm = cache["norm"]
    if norm == "simplermsnorm":
        ng = {"x": _simple_rms_backward(g, cache["ncache"])}
    else:
        ng = (layer_norm_backward if norm == "layernorm" else rms_norm_backward)(g, cache["ncache"])
    dfq, dfk, dv = linear_core_backward(ng["x"], cache["fq"], cache["fk"], cache["v"], h, cache["state"],
                                        causal=cache["causal"], normalise=False)
    grads = {}
    if cache["urpe"] is not None:
        cq, ck, uv = cache["urpe"]
        dfq, dtq, dvq = _urpe_backward(dfq, cq, uv)
        dfk, dtk, dvk = _urpe_backward(dfk, ck, uv)
        grads["urpe.theta"] = dtq + dtk
        if uv is not None:
            grads["urpe.v"] = dvq + dvk
    fm = cache["feature_map"]
    grads.update({"q": _phi_vjp(dfq, cache["q"], fm), "k": _phi_vjp(dfk, cache["k"], fm), "v": dv})
    for key, shape in cache["param_shapes"].items():
        if key.startswith("layer_norm."):
            grads[key] = np.asarray(ng[key.split(".", 1)[1]]).reshape(shape)
    return grads


def transnormer(q, k, v, params=None, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`transnormer_forward`."""
    return transnormer_forward(q, k, v, params, **config)[0]


# --------------------------------------------------------------------------------------------
# The full layer (upstream NormLinearAttention, self-attention)


def transnormer_layer_forward(x, params, *, num_heads: int, causal: bool = True, feature_map: str = "elu",
                              norm: str = "simplermsnorm", norm_eps: float | None = None):
    r"""TransNormer's ``NormLinearAttention`` layer (self-attention), defaults = ``transnormer_t1``.

    $$[Q\,|\,K\,|\,V] = [XW_q + b_q\,|\,XW_k + b_k\,|\,XW_v + b_v],\quad
    Y = \mathrm{NormAttention}(Q_h, K_h, V_h)\,W_o + b_o$$

    (heads split head-major, ``view(L, B*H, d)`` upstream; NormAttention as
    :func:`transnormer_forward` with ``norm_over="concat_heads"``). Upstream: OpenNLPLab/fairseq-evo
    ``fairseq/modules/x_attention/norm_linear_attention.py`` with the ``transnormer_t1`` arch of
    ``fairseq/models/lm_x_attention/norm_transformer_lm.py`` (``linear_act_fun="elu"``,
    ``norm_type="simplermsnorm"``, ``has_out=True``, decoder ``causal``, URPE
    ``core_matrix=1, p_matrix=3, theta_learned=True``).

    Parameters
    ----------
    x : array (B.., N, E)
    params : dict
        Upstream ``state_dict`` names, linear weights ``(in, out)`` (PyTorch ``weight.T``):
        ``q_proj.weight``, ``k_proj.weight``, ``v_proj.weight``, ``out_proj.weight`` ``(E, E)`` with
        optional ``.bias`` ``(E,)`` (upstream ``bias=True``); the core's keys
        (:func:`transnormer_forward`: ``layer_norm.*`` for LayerNorm/RMSNorm, ``urpe.theta``
        ``(d/2,)``, ``urpe.v`` ``(d,)``).
    num_heads : int
        $H$; $d = E/H$.
    causal, feature_map, norm, norm_eps
        As :func:`transnormer_forward`; defaults ``transnormer_t1``.

    Returns
    -------
    out, cache
        ``out (B.., N, E)``; :func:`transnormer_layer_backward` returns ``"x"`` and every params key.
    """
    x = as_float(x, "x", min_ndim=2)
    nh = check_int(num_heads, "num_heads", minimum=1)
    e = x.shape[-1]
    if e % nh:
        raise ValueError(f"num_heads={nh} must divide the embedding width E={e} of x")
    spec = {}
    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
        spec.update(linear_prefixed_spec(name, e, e))
    d = e // nh
    spec.update({"layer_norm.weight": (e,), "layer_norm.bias": (e,), "urpe.theta": (d // 2,), "urpe.v": (d,)})
    optional = tuple(key for key in spec if not key.endswith("proj.weight"))
    p = check_params(params, spec, optional=optional, where="transnormer_layer")
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    q, k, v = (split_heads(linear_prefixed(p, name, x), nh) for name in ("q_proj", "k_proj", "v_proj"))
    core_keys = [key for key in p if not key.endswith(("proj.weight", "proj.bias"))]
    o, core = transnormer_forward(q, k, v, {key: p[key] for key in core_keys} or None, causal=causal,
                                  feature_map=feature_map, norm=norm, norm_over="concat_heads", norm_eps=norm_eps)
    merged = merge_heads(o)
    y = linear_prefixed(p, "out_proj", merged)
    return y, {"x": x, "p": p, "core": core, "merged": merged, "nh": nh, "shape": y.shape}


def transnormer_layer_backward(dout, cache):
    r"""Gradients of :func:`transnormer_layer_forward` for ``x`` and every params key:
    $dW_o = Z^\top G$, the core's backward per head, then $dX = \sum_p dP\,W_p^\top$ over the
    three input projections."""
    x, p, nh = cache["x"], cache["p"], cache["nh"]
    g = as_dout(dout, cache["shape"], x.dtype)
    grads: dict = {}
    dm = linear_prefixed_vjp(grads, p, "out_proj", g, cache["merged"])
    gc = transnormer_backward(split_heads(dm, nh), cache["core"])
    dx = np.zeros_like(x)
    for name, key in (("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v")):
        dx = dx + linear_prefixed_vjp(grads, p, name, merge_heads(gc.pop(key)), x)
    grads.update(gc)
    grads["x"] = dx
    return grads


def transnormer_layer(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`transnormer_layer_forward`."""
    return transnormer_layer_forward(x, params, **config)[0]


def diag_attention_forward(q, k, v, *, block_size: int, causal: bool = False, scale: float | None = None):
    r"""TransNormer DiagAttention: softmax attention restricted to non-overlapping blocks of
    ``block_size`` consecutive positions (block-diagonal mask, optionally causal inside blocks),

    $P = \mathrm{softmax}(sQK^\top + \log M)$, $O = PV$, $M_{ij} = [\lfloor i/w\rfloor =
    \lfloor j/w\rfloor]$ (and $j\le i$), $s = 1/\sqrt d$ by default. Used in TransNormer's early
    layers against attention dilution. Dense reference with an $N\times N$ mask.

    Backward: $dV = P^\top G$, $dS = P\odot(GV^\top - \mathrm{rowsum}(P\odot GV^\top))$,
    $dQ = s\,dS\,K$, $dK = s\,dS^\top Q$.
    """
    w = check_int(block_size, "block_size", minimum=1)
    q, k, v = validate_linear_qkv(q, k, v, same_length=True)
    scale = check_positive(scale, "scale", allow_none=True)
    s = q.shape[-1] ** -0.5 if scale is None else scale
    n = q.shape[-2]
    blk = np.arange(n) // w
    keep = blk[:, None] == blk[None, :]
    if causal:
        keep &= np.tri(n, dtype=bool)
    S = np.where(keep, s * (q @ mT(k)), -np.inf)
    P, _ = softmax_lse(S, axis=-1)
    out = P @ v
    return out, {"q": q, "k": k, "v": v, "P": P, "s": s, "out_shape": out.shape}


def diag_attention_backward(dout, cache):
    """Gradients ``{"q", "k", "v"}`` of :func:`diag_attention_forward` (see its docstring)."""
    P, q, k, v, s = cache["P"], cache["q"], cache["k"], cache["v"], cache["s"]
    g = as_dout(dout, cache["out_shape"], P.dtype)
    dS = softmax_vjp(P, g @ mT(v), axis=-1)
    return {"q": s * (dS @ k), "k": s * (mT(dS) @ q), "v": mT(P) @ g}


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _explicit(fq, fk, v, *, causal: bool, eps: float, normalise: bool = True):
    """The explicit $O(N^2)$ form $\\mathrm{diag}(A1+\\epsilon)^{-1}AV$, $A = \\Phi_Q\\Phi_K^\\top$."""
    A = fq @ mT(fk)
    if causal:
        A = np.tril(A)
    num = A @ v
    if not normalise:
        return num
    return num / (np.sum(A, axis=-1, keepdims=True) + eps)


def _urpe_params(rng, d):
    v = rng.standard_normal(d)
    return {"urpe.theta": 10000.0 ** (-2.0 / d * np.arange(d // 2)) + 0.1 * rng.standard_normal(d // 2),
            "urpe.v": v / np.linalg.norm(v)}


def _sample_transnormer(rng, size):
    q, k, v = random_qkv(rng, size, d=4 if size == "tiny" else 6)
    causal = bool(rng.integers(0, 2))
    width = q.shape[1] * v.shape[-1]
    if rng.random() < 0.5:
        params = {"layer_norm.weight": 1.0 + 0.3 * rng.standard_normal(width),
                  "layer_norm.bias": 0.3 * rng.standard_normal(width)}
        return Sample(inputs={"q": q, "k": k, "v": v}, params=params, config={"causal": causal})
    # the transnormer_t1 configuration: ELU features, SimpleRMSNorm, URPE
    return Sample(inputs={"q": q, "k": k, "v": v}, params=_urpe_params(rng, q.shape[-1]),
                  config={"causal": causal, "feature_map": "elu", "norm": "simplermsnorm"})


def _transnormer_reference(q, k, v, params=None, *, causal=False, feature_map="elu_plus_one",
                           norm="layernorm", norm_over="concat_heads", norm_eps=None):
    # Explicit O(N^2) form; URPE as explicit 2x2 rotation matrices and the Householder matrix.
    q, k, v = validate_linear_qkv(q, k, v, same_length=causal)
    params = params or {}
    phi = {"elu_plus_one": lambda x: np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0))),
           "elu": lambda x: np.where(x > 0, x, np.exp(np.minimum(x, 0)) - 1.0),
           "gelu": lambda x: x * 0.5 * (1.0 + np.vectorize(__import__("math").erf)(x / np.sqrt(2.0))),
           "identity": lambda x: x}[feature_map]
    fq, fk = phi(q), phi(k)
    if "urpe.theta" in params:
        d = q.shape[-1]
        hmat = np.eye(d) - 2.0 * np.outer(params["urpe.v"], params["urpe.v"]) if "urpe.v" in params else np.eye(d)

        def urpe(f):
            out = np.empty_like(f)
            for t in range(f.shape[-2]):
                rot = np.zeros((d, d))
                for j, th in enumerate(params["urpe.theta"]):
                    c, s_ = np.cos(t * th), np.sin(t * th)
                    rot[2 * j:2 * j + 2, 2 * j:2 * j + 2] = [[c, -s_], [s_, c]]
                out[..., t, :] = f[..., t, :] @ (rot @ hmat).T
            return out
        fq, fk = urpe(fq), urpe(fk)
    h = _explicit(fq, fk, v, causal=causal, eps=0.0, normalise=False)
    ax = (-3, -1) if norm_over == "concat_heads" else (-1,)
    eps = {"layernorm": 1e-5, "rmsnorm": 1e-5, "simplermsnorm": 1e-8}[norm] if norm_eps is None else norm_eps
    if norm == "simplermsnorm":
        return h / (np.sqrt((h ** 2).mean(axis=ax, keepdims=True)) + eps)
    mu = h.mean(axis=ax, keepdims=True) if norm == "layernorm" else 0.0
    var = ((h - mu) ** 2).mean(axis=ax, keepdims=True)
    y = (h - mu) / np.sqrt(var + eps)
    if "layer_norm.weight" in params:
        shp = (q.shape[-3], 1, v.shape[-1]) if norm_over == "concat_heads" else (v.shape[-1],)
        y = y * params["layer_norm.weight"].reshape(shp)
        if "layer_norm.bias" in params:
            y = y + params["layer_norm.bias"].reshape(shp)
    return y


def _check_transnormer_scale_invariance(rng):
    """The norm absorbs a positive rescaling of phi(Q) (identity map, scaled non-negative q):
    without affine and with a tiny norm eps the output is unchanged."""
    q, k, v = random_qkv(rng, "small")
    q, k = np.abs(q) + 0.1, np.abs(k) + 0.1
    kw = {"feature_map": "identity", "norm_eps": 1e-12, "norm_over": "head"}
    a = transnormer(q, k, v, **kw)
    b = transnormer(3.7 * q, k, v, **kw)
    err = float(np.max(np.abs(a - b)))
    assert err < 1e-8, f"not invariant to rescaling phi(Q): {err}"
    return err


def _check_transnormer_fd_variants(rng):
    errs = []
    for causal, norm, over, fm in ((True, "rmsnorm", "head", "elu_plus_one"), (False, "layernorm", "head", "gelu"),
                                   (True, "layernorm", "concat_heads", "elu"),
                                   (False, "simplermsnorm", "head", "elu")):
        # dv = 3: a LayerNorm over 2 values is nearly a sign function (ill-conditioned FD)
        q, k, v = random_qkv(rng, "tiny", dv=3, d=2)
        width = v.shape[-1] if over == "head" else q.shape[1] * v.shape[-1]
        params = {} if norm == "simplermsnorm" else {"layer_norm.weight": 1.0 + 0.2 * rng.standard_normal(width)}
        if fm == "elu":
            params.update(_urpe_params(rng, 2))
        cfg = {"causal": causal, "norm": norm, "norm_over": over, "feature_map": fm}
        errs.append(fd_max_rel(transnormer_forward, transnormer_backward,
                               Sample(inputs={"q": q, "k": k, "v": v}, params=params, config=cfg)))
        errs.append(fd_max_rel(transnormer_forward, transnormer_backward,
                               Sample(inputs={"q": q, "k": k, "v": v}, config=cfg)))
    return max(errs)


def _check_urpe_relative(rng):
    """URPE makes the feature products depend on i - j only: shifting all positions (prepending
    tokens whose values are 0 in a causal run) leaves the later outputs unchanged."""
    q, k, v = random_qkv(rng, "small", d=6)
    prm = _urpe_params(rng, 6)
    cfg = {"causal": True, "feature_map": "elu", "norm": "simplermsnorm", "norm_over": "head"}
    out = transnormer(q, k, v, prm, **cfg)
    pad = 3
    q2, k2, v2 = (np.concatenate([rng.standard_normal(a.shape[:-2] + (pad, a.shape[-1])), a], axis=-2)
                  for a in (q, k, v))
    v2[..., :pad, :] = 0.0
    out2 = transnormer(q2, k2, v2, prm, **cfg)
    err = float(np.abs(out2[..., pad:, :] - out).max())
    assert err < 1e-11, f"URPE outputs changed under a position shift: {err}"
    return err


def _layer_sample(rng, heads=2, d=2, n=3, b=2, t1=True):
    e = heads * d
    x = rng.standard_normal((b, n, e))
    params = {}
    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
        params[f"{name}.weight"] = rng.standard_normal((e, e)) / np.sqrt(e)
        params[f"{name}.bias"] = 0.2 * rng.standard_normal(e)
    if t1:
        params.update(_urpe_params(rng, d))
        return Sample(inputs={"x": x}, params=params, config={"num_heads": heads})
    params.update({"layer_norm.weight": 1.0 + 0.2 * rng.standard_normal(e),
                   "layer_norm.bias": 0.2 * rng.standard_normal(e)})
    return Sample(inputs={"x": x}, params=params,
                  config={"num_heads": heads, "causal": False, "feature_map": "gelu", "norm": "layernorm"})


def _check_layer_gradcheck(rng):
    """The full layer (q/k/v/out projections, URPE, SimpleRMSNorm; and the LayerNorm/GELU
    non-causal variant): FD gradcheck of x and every parameter."""
    return max(fd_max_rel(transnormer_layer_forward, transnormer_layer_backward, _layer_sample(rng, t1=t1))
               for t1 in (True, False))


def _check_diag_attention(rng):
    """DiagAttention: FD gradcheck (causal and not); block_size >= N equals full softmax attention;
    block_size 1 returns v."""
    errs = []
    for causal in (False, True):
        q, k, v = random_qkv(rng, "tiny")
        s = Sample(inputs={"q": q, "k": k, "v": v}, config={"block_size": 2, "causal": causal})
        errs.append(fd_max_rel(diag_attention_forward, diag_attention_backward, s))
    q, k, v = random_qkv(rng, "small")
    full, _ = diag_attention_forward(q, k, v, block_size=q.shape[-2])
    e1 = float(np.max(np.abs(full - softmax_attention_reference(q, k, v))))
    one, _ = diag_attention_forward(q, k, v, block_size=1)
    e2 = float(np.max(np.abs(one - v)))
    assert e1 < 1e-12 and e2 < 1e-12, (e1, e2)
    return max(errs + [e1, e2])


register(
    Mechanism(
        slug="transnormer_norm_attention", family="4-linear-kernel-sparse", tier="T1",
        title="TransNormer NormAttention (norm instead of the denominator) and DiagAttention",
        paper="Qin, Han, Sun, Li, Kong, Barnes, Zhong, 'The Devil in Linear Transformer', EMNLP 2022, "
              "arXiv 2210.10340",
        forward=transnormer_forward, backward=transnormer_backward, sample=_sample_transnormer,
        reference=_transnormer_reference,
        checks={"invariant_to_rescaled_query_features": _check_transnormer_scale_invariance,
                "gradcheck_variants": _check_transnormer_fd_variants,
                "urpe_depends_on_relative_position": _check_urpe_relative,
                "layer_gradcheck": _check_layer_gradcheck,
                "diag_attention": _check_diag_attention},
        docs="linear-attention.md#transnormer",
    ),
)
