r"""MALA magnitude-aware linear attention: signed token weights $(1 + 1/z_i)a_{ij} - z_i/N$ that sum to one.

Without RoPE the output is $y_i = \sum_j w_{ij}v_j$ with $a_{ij} = \frac sN\phi(q_i)\cdot\phi(k_j)$,
$z_i = \sum_ja_{ij}$ and signed weights $w_{ij} = (1 + 1/(z_i+\epsilon))a_{ij} - z_i/N$: the
query's magnitude changes how peaked the weights are, and weights of keys with below-average
$a_{ij}$ can become negative — a relative of differential attention computed in linear time.

Backward: through $\nu_i = \theta(\phi(q_i))^\top M$, $z_i$ and $\bar v$ to the RoPE adjoint and
$\phi'$ (derivation in `mala_linear_attention_forward`).

The full layer (`mala_layer_forward`) is upstream's ``AddLinearAttention`` on an image
``x (B, C, H, W)``: a 1x1 convolution ``qkvo`` to $[Q\,K\,V\,O]$, the core with MALA's 2-D RoPE,
plus LePE (a depthwise 5x5 convolution of $V$), gated by $O$, then the 1x1 ``proj``:
$Y = \mathrm{proj}\big((\mathrm{MALA}(Q, K, V) + \mathrm{LePE}(V))\odot O\big)$.

Paper: Q. Fan et al., "Rectifying Magnitude Neglect in Linear Attention", ICCV 2025 (MALA).
Upstream: qhfan/MALA @ 7114e6391e16a79e52382cbbcaa7f035705f3449 ``classfication_release/model.py``
(``AddLinearAttention``, ``RoPE``, ``theta_shift``, ``rotate_every_two``).

Agreement with upstream: ``AddLinearAttention`` and ``RoPE`` from that file (unchanged; timm and
fvcore imports stubbed) run in float64 on CPU (C = 16, 2 heads, 3x4 and 4x4 images): output and
the gradients of ``x`` and every parameter (``qkvo``, ``lepe``, ``proj`` weights and biases)
agree within $2\times10^{-15}$ relative (`tests/test_fidelity_layers.py`).

Layouts: PyTorch SDPA for attention cores (``q (B, H, N, d)``), token-major ``x (B, N, C)`` for
layers; weights ``(in, out)`` (PyTorch: ``linear.weight.T``; a 1x1 ``Conv1d``/``Conv2d`` weight
``w[:, :, 0].T``); parameter keys are the upstream modules' ``state_dict`` names so a checkpoint
maps over key by key. Every forward returns ``(out, cache)`` and every backward a ``dict`` of
gradients for all inputs and parameters; see also ``docs/differential-relatives.md``.
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_int, check_params, check_positive, compute_dtype
from ...nn.activations import elu_plus_one, elu_plus_one_grad
from ...nn.conv import conv_apply, conv_vjp
from ...registry import Mechanism, Sample, register
from ._samples import rand_qkv
from .core import resolve_scale, validate_qkv

__all__ = [
    "mala_rope_tables",
    "mala_linear_attention_forward",
    "mala_linear_attention_backward",
    "mala_linear_attention",
    "mala_layer_forward",
    "mala_layer_backward",
    "mala_layer",
]


_PAPER_MALA = "Q. Fan et al., 'Rectifying Magnitude Neglect in Linear Attention', ICCV 2025 (MALA)"


def mala_rope_tables(height: int, width: int, head_dim: int, dtype=np.float64):
    r"""MALA's 2-D RoPE tables ``(sin, cos)``, each ``(height*width, head_dim)``.

    As upstream ``RoPE`` (qhfan/MALA ``classfication_release/model.py``): angles
    $\theta_m = 10000^{-m/(d/4-1)}$, $m = 0..d/4-1$ (``linspace(0, 1, d//4)``), each repeated twice;
    the first $d/2$ features rotate with the row index, the last $d/2$ with the column index.
    ``head_dim`` must be a multiple of 4.
    """
    height = check_int(height, "height", minimum=1)
    width = check_int(width, "width", minimum=1)
    head_dim = check_int(head_dim, "head_dim", minimum=4)
    if head_dim % 4:
        raise ValueError(f"head_dim must be a multiple of 4 for MALA's 2-D RoPE; got {head_dim}")
    angle = 1.0 / (10000.0 ** np.linspace(0, 1, head_dim // 4))
    angle = np.repeat(angle, 2)
    ih = np.arange(height, dtype=np.float64)[:, None] * angle[None, :]
    iw = np.arange(width, dtype=np.float64)[:, None] * angle[None, :]
    ang = np.concatenate([np.repeat(ih[:, None, :], width, axis=1), np.repeat(iw[None, :, :], height, axis=0)], -1)
    ang = ang.reshape(height * width, head_dim)
    return np.sin(ang).astype(dtype), np.cos(ang).astype(dtype)


def _rot2(x):
    r"""``rotate_every_two``: pairs $(x_{2i}, x_{2i+1}) \mapsto (-x_{2i+1}, x_{2i})$; its adjoint is $-$itself."""
    out = np.empty_like(x)
    out[..., 0::2] = -x[..., 1::2]
    out[..., 1::2] = x[..., 0::2]
    return out


def _theta(x, sin, cos):
    return x if sin is None else x * cos + _rot2(x) * sin


def _theta_t(y, sin, cos):
    return y if sin is None else y * cos - _rot2(y * sin)


def mala_linear_attention_forward(q, k, v, *, sin=None, cos=None, scale=None, eps=1e-6):
    r"""MALA magnitude-aware linear attention core (Fan et al., ICCV 2025), per head.

    With $\phi(x) = \mathrm{elu}(x)+1$, $s = d^{-1/2}$, $N$ tokens, RoPE $\theta(\cdot)$ (optional):

    $$z_i = s\,\phi(q_i)\cdot\bar k,\quad \bar k = \tfrac1N\textstyle\sum_j\phi(k_j)\qquad(\text{before RoPE})$$
    $$M = \tfrac sN\textstyle\sum_j\theta(\phi(k_j))\,v_j^\top,\qquad
    y_i = \big(1 + \tfrac{1}{z_i+\epsilon}\big)\,\theta(\phi(q_i))^\top M - z_i\,\bar v,\quad \bar v = \tfrac1N\textstyle\sum_jv_j.$$

    Without RoPE this is $y_i = \sum_j w_{ij}v_j$ with $a_{ij} = \frac sN\phi(q_i)\cdot\phi(k_j)$,
    $z_i = \sum_ja_{ij}$ and signed weights $w_{ij} = (1 + 1/(z_i+\epsilon))a_{ij} - z_i/N$ with
    $\sum_j w_{ij} = z_i/(z_i+\epsilon)$ (exactly 1 for $\epsilon = 0$): the query's magnitude now
    changes how peaked the weights are (it cancels in plain linear attention), and weights of keys
    with below-average $a_{ij}$ can become negative.

    Upstream: qhfan/MALA ``classfication_release/model.py`` (``AddLinearAttention.forward``):
    ``z`` uses the pre-RoPE features, RoPE (``theta_shift`` with ``rotate_every_two``, interleaved
    pairs) only in the numerator, the $s/N$ factor split as $\sqrt{s/N}$ on $K$ and $V$, ``eps=1e-6``.
    This function is the attention core: the surrounding layer adds LePE (a depthwise 5x5 conv of
    $V$), multiplies by a fourth 1x1-conv branch $o$ and projects, ``proj((res + lepe) * o)``.
    ``sin``/``cos`` are ``(N, d)`` tables (:func:`mala_rope_tables`) or ``None`` (no RoPE).

    Backward
    --------
    $G = \partial L/\partial y$, $\beta_i = 1 + 1/(z_i+\epsilon)$, $\nu_i = \theta(\phi(q_i))^\top M$:
    $d\nu_i = \beta_iG_i$, $dz_i = -\frac{\nu_i\cdot G_i}{(z_i+\epsilon)^2} - \bar v\cdot G_i$,
    $d\bar v = -\sum_i z_iG_i$; $d\theta(\phi(q)) = d\nu\,M^\top$, $dM = \theta(\phi(Q))^\top d\nu$,
    $d\theta(\phi(k_j)) = \frac sN M'$ with $M' = V\,dM^\top$, $dV = \frac sN\theta(\phi(K))\,dM + \frac1N d\bar v$;
    RoPE adjoint $\theta^\top(y) = y\cos - \mathrm{rot}(y\sin)$; $d\phi(q_i) \mathrel{+}= s\,dz_i\,\bar k$,
    $d\bar k = s\sum_i dz_i\phi(q_i)$, $d\phi(k_j) \mathrel{+}= d\bar k/N$; finally $\phi'$.
    """
    q, k, v, dt = validate_qkv(q, k, v, self_attention=True)
    n, d = q.shape[-2], q.shape[-1]
    if (sin is None) != (cos is None):
        raise ValueError("sin and cos must be given together (or both None for no RoPE)")
    if sin is not None:
        sin = as_float(sin, "sin", ndim=2)
        cos = as_float(cos, "cos", ndim=2)
        if sin.shape != (n, d) or cos.shape != (n, d):
            raise ValueError(f"sin and cos must have shape (N, d) = ({n}, {d}); got {sin.shape}, {cos.shape}")
        if d % 2:
            raise ValueError(f"RoPE rotates feature pairs: the head width d must be even; got {d}")
        sin, cos = sin.astype(dt, copy=False), cos.astype(dt, copy=False)
    sc = resolve_scale(scale, d)
    eps = check_positive(eps, "eps", allow_zero=True)
    fq, dfq = elu_plus_one(q), elu_plus_one_grad(q)
    fk, dfk = elu_plus_one(k), elu_plus_one_grad(k)
    kbar = fk.mean(axis=-2, keepdims=True)  # (..., 1, d)
    z = sc * (fq @ np.swapaxes(kbar, -1, -2))  # (..., N, 1)
    tq, tk = _theta(fq, sin, cos), _theta(fk, sin, cos)
    m = (sc / n) * (np.swapaxes(tk, -1, -2) @ v)  # (..., d, dv)
    nu = tq @ m
    beta = 1.0 + 1.0 / (z + eps)
    vbar = v.mean(axis=-2, keepdims=True)
    y = nu * beta - z * vbar
    cache = {"v": v, "fq": fq, "dfq": dfq, "dfk": dfk, "kbar": kbar, "z": z, "tq": tq, "tk": tk, "m": m,
             "nu": nu, "beta": beta, "vbar": vbar, "sin": sin, "cos": cos, "scale": sc, "eps": eps}
    return y, cache


def mala_linear_attention_backward(dout, cache):
    """Gradients of :func:`mala_linear_attention_forward` (derivation in its docstring)."""
    v, z, m = cache["v"], cache["z"], cache["m"]
    g = as_dout(dout, cache["nu"].shape, v.dtype)
    n = v.shape[-2]
    sc, sin, cos = cache["scale"], cache["sin"], cache["cos"]
    dnu = g * cache["beta"]
    dz = -np.sum(cache["nu"] * g, axis=-1, keepdims=True) / (z + cache["eps"]) ** 2 \
        - np.sum(cache["vbar"] * g, axis=-1, keepdims=True)
    dvbar = -np.sum(z * g, axis=-2, keepdims=True)
    dtq = dnu @ np.swapaxes(m, -1, -2)
    dm = np.swapaxes(cache["tq"], -1, -2) @ dnu
    dtk = (sc / n) * (v @ np.swapaxes(dm, -1, -2))
    dv = (sc / n) * (cache["tk"] @ dm) + dvbar / n
    dfq = _theta_t(dtq, sin, cos) + sc * dz * cache["kbar"]
    dkbar = sc * np.sum(dz * cache["fq"], axis=-2, keepdims=True)
    dfk = _theta_t(dtk, sin, cos) + dkbar / n
    return {"q": dfq * cache["dfq"], "k": dfk * cache["dfk"], "v": dv}


def mala_linear_attention(q, k, v, **config):
    """Convenience wrapper: the output of :func:`mala_linear_attention_forward`."""
    return mala_linear_attention_forward(q, k, v, **config)[0]


# --------------------------------------------------------------------------------------------
# The full layer (upstream AddLinearAttention)


def mala_layer_forward(x, params, *, num_heads: int, rope: bool = True, scale=None, eps=1e-6):
    r"""MALA layer: upstream ``AddLinearAttention`` (qhfan/MALA ``classfication_release/model.py``).

    On an image $x$ ``(B, C, H, W)`` with $C = n_h d$:

    $$[Q\,K\,V\,O] = \mathrm{qkvo}(x)\ (\text{1x1 conv}),\quad
    Y = \mathrm{proj}\big((\mathrm{MALA}(Q, K, V) + \mathrm{lepe}(V))\odot O\big),$$

    heads split from the channels as ``'b (m n d) h w -> m b n (h w) d'`` (tokens in row-major
    ``(h w)`` order), MALA the core :func:`mala_linear_attention_forward` with the tables of
    :func:`mala_rope_tables` ``(H, W, d)`` (upstream ``RoPE``, built per stage from the feature
    map size), ``lepe`` the depthwise 5x5 convolution (padding 2) of $V$'s channels and
    ``proj`` a 1x1 convolution; the result is merged back as ``'b n (h w) d -> b (n d) h w'``.

    Parameters
    ----------
    x : array (B, C, H, W)
    params : dict
        Conv weights in PyTorch's layout (`refattn.nn.conv`), upstream names:
        ``qkvo.weight (4C, C, 1, 1)``, ``qkvo.bias (4C,)``, ``lepe.weight (C, 1, 5, 5)``,
        ``lepe.bias (C,)``, ``proj.weight (C, C, 1, 1)``, ``proj.bias (C,)`` (biases optional;
        upstream has them).
    num_heads : int
        $n_h$; $d = C/n_h$ must be a multiple of 4 for the 2-D RoPE.
    rope : bool
        Upstream: True. False runs the core without RoPE.
    scale, eps
        As :func:`mala_linear_attention_forward` (upstream $d^{-1/2}$, ``1e-6``).

    Backward
    --------
    $dZ$ from the ``proj`` VJP; $d(\mathrm{res}) = d(\mathrm{lepe}) = dZ\odot O$, $dO = dZ\odot(\mathrm{res} +
    \mathrm{lepe})$; the core's VJP gives $dQ, dK, dV$; the LePE convolution's VJP adds into $dV$;
    the ``qkvo`` VJP of $[dQ\,dK\,dV\,dO]$ gives $dx$ (convolution VJPs: `refattn.nn.conv`).
    """
    x = as_float(x, "x", ndim=4)
    nh = check_int(num_heads, "num_heads", minimum=1)
    b, c, hh, ww = x.shape
    if c % nh:
        raise ValueError(f"num_heads={nh} must divide the channels C={c} of x (B, C, H, W)")
    d = c // nh
    if not isinstance(rope, (bool, np.bool_)):
        raise TypeError(f"rope must be a bool; got {type(rope).__name__}")
    spec = {"qkvo.weight": (4 * c, c, 1, 1), "qkvo.bias": (4 * c,), "lepe.weight": (c, 1, 5, 5), "lepe.bias": (c,),
            "proj.weight": (c, c, 1, 1), "proj.bias": (c,)}
    p = check_params(params, spec, optional=("qkvo.bias", "lepe.bias", "proj.bias"), where="mala_layer")
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    sin = cos = None
    if rope:
        if d % 4:
            raise ValueError(f"MALA's 2-D RoPE needs a head width d = C/num_heads divisible by 4; got d={d}")
        sin, cos = mala_rope_tables(hh, ww, d, dtype=dt)
    u = conv_apply(x, p["qkvo.weight"], p.get("qkvo.bias"))
    vmap = u[:, 2 * c:3 * c]
    lepe = conv_apply(vmap, p["lepe.weight"], p.get("lepe.bias"), padding=2, groups=c)
    heads = u[:, :3 * c].reshape(b, 3, nh, d, hh * ww).transpose(1, 0, 2, 4, 3)  # (3, B, n, HW, d)
    res, core = mala_linear_attention_forward(heads[0], heads[1], heads[2], sin=sin, cos=cos, scale=scale, eps=eps)
    res_map = res.transpose(0, 1, 3, 2).reshape(b, c, hh, ww)
    gate = u[:, 3 * c:]
    z = (res_map + lepe) * gate
    y = conv_apply(z, p["proj.weight"], p.get("proj.bias"))
    cache = {"x": x, "p": p, "u": u, "pre": res_map + lepe, "z": z, "core": core, "nh": nh, "shape": y.shape}
    return y, cache


def mala_layer_backward(dout, cache):
    """Gradients of :func:`mala_layer_forward` for ``x`` and every params key (see its docstring)."""
    x, p, u = cache["x"], cache["p"], cache["u"]
    g = as_dout(dout, cache["shape"], x.dtype)
    b, c, hh, ww = x.shape
    nh = cache["nh"]
    d = c // nh
    grads = {}
    gp = conv_vjp(g, cache["z"], p["proj.weight"], has_bias="proj.bias" in p)
    dz = gp["x"]
    dpre = dz * u[:, 3 * c:]
    du = np.empty_like(u)
    du[:, 3 * c:] = dz * cache["pre"]
    gl = conv_vjp(dpre, u[:, 2 * c:3 * c], p["lepe.weight"], padding=2, groups=c, has_bias="lepe.bias" in p)
    dres = dpre.reshape(b, nh, d, hh * ww).transpose(0, 1, 3, 2)
    gc = mala_linear_attention_backward(dres, cache["core"])
    for i, key in enumerate("qkv"):
        du[:, i * c:(i + 1) * c] = gc[key].transpose(0, 1, 3, 2).reshape(b, c, hh, ww)
    du[:, 2 * c:3 * c] += gl["x"]
    gq = conv_vjp(du, x, p["qkvo.weight"], has_bias="qkvo.bias" in p)
    for name, gg in (("qkvo", gq), ("lepe", gl), ("proj", gp)):
        grads[f"{name}.weight"] = gg["weight"]
        if f"{name}.bias" in p:
            grads[f"{name}.bias"] = gg["bias"]
    grads["x"] = gq["x"]
    return grads


def mala_layer(x, params, **config):
    """Convenience wrapper: the output of :func:`mala_layer_forward`."""
    return mala_layer_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample_mala(rng, size):
    q, k, v = rand_qkv(rng, size)
    if size == "tiny":
        return Sample(inputs={"q": q, "k": k, "v": v})
    n = q.shape[-2]
    hgt = 2 if n % 2 == 0 else 1
    sin, cos = mala_rope_tables(hgt, n // hgt, q.shape[-1])
    return Sample(inputs={"q": q, "k": k, "v": v}, config={"sin": sin, "cos": cos})


def _reference_mala(q, k, v, *, sin=None, cos=None, scale=None, eps=1e-6):
    # The explicit N x N signed-weight form: y_i = sum_j [(1 + 1/(z_i+eps)) a~_ij - z_i/N] v_j,
    # a~ with RoPE'd features (numerator), z without.
    n, d = q.shape[-2], q.shape[-1]
    sc = d**-0.5 if scale is None else scale
    phi = lambda x: np.where(x > 0, x + 1, np.exp(np.minimum(x, 0)))  # noqa: E731
    fq, fk = phi(q), phi(k)
    a = (sc / n) * np.einsum("...id,...jd->...ij", fq, fk)
    z = a.sum(-1, keepdims=True)
    if sin is not None:
        def rope(x):
            r = np.stack([-x[..., 1::2], x[..., 0::2]], -1).reshape(x.shape)
            return x * cos + r * sin
        a = (sc / n) * np.einsum("...id,...jd->...ij", rope(fq), rope(fk))
    w = (1 + 1 / (z + eps)) * a - z / n
    return w @ v


def _check_mala_weights_sum(rng):
    q, k, v = rand_qkv(rng, "small")
    n = q.shape[-2]
    eye = np.broadcast_to(np.eye(n), q.shape[:-2] + (n, n))
    # Feeding V = I reads the weight matrix W itself.
    w = mala_linear_attention(q, k, np.ascontiguousarray(eye), eps=0.0)
    err = float(np.abs(w.sum(-1) - 1).max())
    assert err < 1e-12, f"MALA weights do not sum to 1 (eps = 0): {err}"
    assert (w < 0).any(), "expected some negative weights"
    return err


def _check_mala_layer_gradcheck(rng):
    """The full layer (qkvo, LePE, gate, proj around the core): FD gradcheck of x and every
    parameter, without RoPE (C = 2, 2 heads) and with MALA's 2-D RoPE (C = 8, 2 heads of d = 4,
    a 2x2 map; about 2 s)."""
    from ...testing import gradcheck

    worst = 0.0
    for c, rope, hw, bsz in ((2, False, (2, 3), 2), (8, True, (2, 2), 1)):
        params = {"qkvo.weight": 0.5 * rng.standard_normal((4 * c, c, 1, 1)),
                  "qkvo.bias": 0.2 * rng.standard_normal(4 * c),
                  "lepe.weight": 0.3 * rng.standard_normal((c, 1, 5, 5)), "lepe.bias": 0.1 * rng.standard_normal(c),
                  "proj.weight": 0.5 * rng.standard_normal((c, c, 1, 1)), "proj.bias": 0.1 * rng.standard_normal(c)}
        s = Sample(inputs={"x": rng.standard_normal((bsz, c, *hw))}, params=params,
                   config={"num_heads": 2, "rope": rope})
        worst = max(worst, gradcheck(mala_layer_forward, mala_layer_backward, s).max_rel)
    return worst


register(
    Mechanism(
        slug="mala_linear_attention", family="2-differential", tier="T1",
        title="MALA magnitude-aware linear attention (signed weights summing to 1)",
        paper=_PAPER_MALA, forward=mala_linear_attention_forward, backward=mala_linear_attention_backward,
        sample=_sample_mala, reference=_reference_mala, docs="differential-relatives.md#mala-linear-attention",
        checks={"weights_sum_to_one": _check_mala_weights_sum, "layer_gradcheck": _check_mala_layer_gradcheck},
    ),
)
