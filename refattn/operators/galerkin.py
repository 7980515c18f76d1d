r"""Galerkin-type and Fourier-type attention (Cao, NeurIPS 2021): one layer, two associations.

Paper: S. Cao, "Choose a Transformer: Fourier or Galerkin", NeurIPS 2021, arXiv 2105.14995.
Upstream: scaomath/galerkin-transformer ``libs/layers.py`` @ f9e7d6abc24e958b1165f48b22625c5bab688043
(``SimpleAttention``, ``linear_attention``, ``attention``).

The two mechanisms share this module because they share one derivation: the same upstream layer
(projections, per-head norm, coordinate concatenation, ``fc``) in which the softmax-free product
$\hat Q\hat K^\top\hat V$ is associated as $\hat Q(\hat K^\top\hat V)$ (Galerkin, linear in the
number of points) or as $(\hat Q\hat K^\top)\hat V$ (Fourier, quadratic), with a different pair of
normalised operands. Forward and backward are one code path for both. OFormer's linear attention
(the same two types with quadrature weights, masks and RoPE) is in ``refattn.operators.oformer``.

Layer (``SimpleAttention`` of the upstream file)
------------------------------------------------
Input $x\in\mathbb{R}^{B\times N\times C}$, $H$ heads of width $d = C/H$, optional point
coordinates $p\in\mathbb{R}^{B\times N\times P}$:

$$Q,K,V = xW_{Q,K,V} + b_{Q,K,V}\quad(\text{split into heads } (B,H,N,d)).$$

Galerkin type normalises **K and V** per head, Fourier type **Q and K**
(``norm_type="layer"``: ``nn.LayerNorm(d)`` per head over the $d$ channels of each point, with
affine weight/bias per head; ``norm_type="instance"``: upstream transposes each head to
``(b, d, n)`` before ``nn.InstanceNorm1d(d, affine=True)``, so each channel is standardised over
the $N$ points, then scaled by the optional affine ``norm_*.weight``/``.bias`` of shape (H, d) —
omit them for the plain norm; ``None``: no norm). This per-channel-over-points norm is *not*
what BaratiLab/OFormer's unpadded branch or neuraloperator's ``AttentionKernelIntegral``
compute: both apply ``InstanceNorm1d`` to a ``(b h, n, d)`` tensor, which normalises each point
over its channels (``refattn.operators.oformer``, ``norm_axis="channels"``).

Cross-attention: upstream ``SimpleAttention.forward(query, key, value, pos)`` takes a separate
query input. ``query`` (B, N_q, C) gives $Q = \text{query}\,W_Q + b_Q$ while $K, V$ come from
``x`` (B, N, C). **Quirk (upstream, Galerkin type):** ``linear_attention`` divides by
``seq_len = query.size(-2)``, the number of *query* points, not the $N$ key points of the
quadrature $\hat K^\top\hat V/N$; ``galerkin_length="query"`` (default) reproduces it,
``"key"`` divides by $N$ (resolution-independent when the query set changes). The Fourier type
divides by the key length (``scores.size(-1)``) upstream. Coordinates are concatenated to q, k
and v alike, so ``pos`` needs $N_q = N$.
Then the coordinates are concatenated **in front of** every head: $\hat Q = [p, Q_h]$, etc.
(width $d_c = P + d$), and

$$\text{Galerkin:}\quad Z_h = \hat Q\,\big(\hat K^\top \hat V\big)/n,\qquad
\text{Fourier:}\quad Z_h = \big(s\,\hat Q\hat K^\top\big)\hat V / n,$$

with $n$ the number of points and $s = 1/\sqrt{d_c}$ by default (Fourier only; OFormer uses
$s=1$). The heads are merged back to $(B, N, H d_c)$ and, **only when coordinates are given**,
mapped by ``fc``: $\mathbb{R}^{C + HP}\to\mathbb{R}^C$ (upstream returns the merged heads
unchanged when ``pos is None``). No softmax and no norm after the attention (upstream README).

Backward
--------
Galerkin, with $M = \hat K^\top\hat V/n$ and $G = \partial L/\partial Z_h$:
$d\hat Q = G M^\top$, $dM = \hat Q^\top G$, $d\hat K = \hat V\,dM^\top/n$,
$d\hat V = \hat K\,dM/n$.
Fourier, with $A = s\hat Q\hat K^\top/n$: $d\hat V = A^\top G$, $dA = G\hat V^\top$,
$d\hat Q = s\,dA\,\hat K/n$, $d\hat K = s\,dA^\top\hat Q/n$.
The first $P$ columns of $d\hat Q, d\hat K, d\hat V$ are the coordinate gradient (summed over
the three operands and the heads, so ``pos`` is differentiable: learned coordinates work); the
rest flows through the norm and then the projections.

Norm VJP. With $\hat x = (x-\mu)r$, $r = (\sigma^2+\epsilon)^{-1/2}$ over $m$ entries and
$y = \gamma\hat x + \beta$: $d\gamma = \sum dy\,\hat x$, $d\beta = \sum dy$, and with
$g = \gamma\,dy$, $dx = r\,(g - \overline{g} - \hat x\,\overline{g\hat x})$ (bars = means over
the normalised axis). Linear VJPs as in :mod:`refattn.nn.linear`.

Upstream conventions made explicit here
---------------------------------------
* ``norm_type`` (``SimpleAttention(norm_type='layer')``; ``norm=False`` upstream is
  ``norm_type=None``; the Galerkin Transformer encoder layer turns the norm on by default).
* Layer-norm ``eps`` (upstream 1e-5; results are eps-sensitive in float32, galerkin-transformer#3).
* Fourier ``scale`` (upstream $1/\sqrt{d_c}$ where $d_c$ includes the coordinate columns).
* Dropout is not applied (eval mode). Upstream pitfall: ``libs/layers.py`` calls
  ``F.dropout(p_attn)`` with PyTorch's defaults ``p=0.5, training=True`` whenever a dropout
  module is passed, so upstream outputs are random even in ``eval()``; refattn is deterministic.
* Instance-norm typo upstream: for non-Galerkin types with ``norm_type='instance'`` the code
  restores the layout with ``key, query = key.T, value.T`` (``query`` is overwritten by the
  un-normalised ``value``); refattn implements the intended instance norm of Q and K.

Weights
-------
``y = x W + b`` with ``W (in, out)``. From a PyTorch ``SimpleAttention`` ``m``::

    params = {f"linears.{i}.weight": m.linears[i].weight.detach().numpy().T for i in range(3)}
    params |= {f"linears.{i}.bias": m.linears[i].bias.detach().numpy() for i in range(3)}
    params["norm_K.weight"] = np.stack([n.weight.detach().numpy() for n in m.norm_K])  # (H, d)
    ...  # norm_K.bias, norm_V.* (Galerkin) or norm_Q.* (Fourier); fc.weight (= m.fc.weight.T), fc.bias
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_choice, check_int, check_params, check_positive, compute_dtype
from ..nn.linear import (
    init_linear_prefixed,
    linear_prefixed,
    linear_prefixed_spec,
    linear_prefixed_vjp,
    merge_heads,
    split_heads,
)
from ..nn.norms import normalize_backward, normalize_forward
from ..registry import Mechanism, Sample, register
from .common import xavier_uniform

__all__ = [
    "galerkin_attention_forward",
    "galerkin_attention_backward",
    "galerkin_attention",
    "fourier_type_attention_forward",
    "fourier_type_attention_backward",
    "fourier_type_attention",
    "init_params",
]

_NORMED = {"galerkin": ("k", "v"), "fourier": ("q", "k")}
_NORM_KEY = {"q": "norm_Q", "k": "norm_K", "v": "norm_V"}


def _validate_simple(x, params, pos, n_head, attention_type, norm_type, eps, scale, query, galerkin_length):
    x = as_float(x, "x", ndim=3)
    b, n, c = x.shape
    check_choice(galerkin_length, "galerkin_length", ("query", "key"))
    if query is not None:
        query = as_float(query, "query", ndim=3)
        if query.shape[0] != b or query.shape[2] != c:
            raise ValueError(f"query must have shape (B={b}, N_q, C={c}) like x; got {query.shape}")
    n_head = check_int(n_head, "n_head", minimum=1)
    if c % n_head:
        raise ValueError(f"the channel count of x ({c}) must be divisible by n_head ({n_head})")
    d = c // n_head
    check_choice(norm_type, "norm_type", ("layer", "instance", None))
    eps = check_positive(eps, "eps")
    scale = check_positive(scale, "scale", allow_none=True)
    npos = 0
    if pos is not None:
        pos = as_float(pos, "pos", ndim=3)
        if pos.shape[:2] != (b, n):
            raise ValueError(f"pos must have shape (B={b}, N={n}, P) to match x; got {pos.shape}")
        if query is not None and query.shape[1] != n:
            raise ValueError(f"pos is concatenated to q, k and v alike (upstream): query must then have "
                             f"N_q = N = {n} points; got {query.shape[1]}")
        npos = pos.shape[2]
    spec = {}
    for i in range(3):
        spec.update(linear_prefixed_spec(f"linears.{i}", c, c))
    optional = []
    if norm_type is not None:
        for t in _NORMED[attention_type]:
            spec[f"{_NORM_KEY[t]}.weight"] = (n_head, d)
            spec[f"{_NORM_KEY[t]}.bias"] = (n_head, d)
            if norm_type == "instance":    # upstream InstanceNorm1d(affine=True); absent = plain norm
                optional += [f"{_NORM_KEY[t]}.weight", f"{_NORM_KEY[t]}.bias"]
    if pos is not None:
        spec.update(linear_prefixed_spec("fc", c + n_head * npos, c))
    p = check_params(params, spec, optional=optional)
    dt = compute_dtype(x, pos, query, *p.values())
    x = x.astype(dt, copy=False)
    pos = None if pos is None else pos.astype(dt, copy=False)
    query = None if query is None else query.astype(dt, copy=False)
    return x, cast_all(dt, p), pos, n_head, d, eps, scale, query


def _simple_forward(x, params, pos, *, n_head, attention_type, norm_type, eps, scale, query=None,
                    galerkin_length="query"):
    x, p, pos, n_head, d, eps, scale, query = _validate_simple(
        x, params, pos, n_head, attention_type, norm_type, eps, scale, query, galerkin_length)
    b, n, c = x.shape
    srcs = {"q": x if query is None else query, "k": x, "v": x}
    qkv = {t: split_heads(linear_prefixed(p, f"linears.{i}", srcs[t]), n_head) for i, t in enumerate("qkv")}
    norm_cache = {}
    for t in _NORMED[attention_type] if norm_type is not None else ():
        xhat, stats = normalize_forward(qkv[t], (3,) if norm_type == "layer" else (2,), eps)
        key = _NORM_KEY[t]
        if f"{key}.weight" in p:
            qkv[t] = xhat * p[f"{key}.weight"][:, None, :] + p[f"{key}.bias"][:, None, :]
        else:
            qkv[t] = xhat
        norm_cache[t] = (xhat, stats)
    npos = 0 if pos is None else pos.shape[-1]
    if pos is not None:
        pb = np.broadcast_to(pos[:, None], (b, n_head, n, npos))
        hat = {t: np.concatenate([pb, qkv[t]], axis=-1) for t in "qkv"}
    else:
        hat = qkv
    dc = d + npos
    if attention_type == "galerkin":
        # upstream linear_attention divides by query.size(-2) (the query length; N in self-attention)
        n_div = srcs["q"].shape[1] if galerkin_length == "query" else n
        m = np.swapaxes(hat["k"], -1, -2) @ hat["v"] / n_div
        z = hat["q"] @ m
        core = {"m": m, "n_div": n_div}
    else:
        s = float(1.0 / np.sqrt(dc)) if scale is None else scale  # a Python float keeps float32
        a = (hat["q"] @ np.swapaxes(hat["k"], -1, -2)) * (s / n)
        z = a @ hat["v"]
        core = {"a": a, "s": s}
    zm = merge_heads(z)
    out = linear_prefixed(p, "fc", zm) if pos is not None else zm
    cache = dict(x=x, query=query, p=p, pos=pos, n_head=n_head, type=attention_type, norm_type=norm_type,
                 norm=norm_cache, hat=hat, zm=zm, npos=npos, out_shape=out.shape, **core)
    return out, cache


def _simple_backward(dout, cache):
    x, p, pos, n_head, npos = cache["x"], cache["p"], cache["pos"], cache["n_head"], cache["npos"]
    hat = cache["hat"]
    b, n, c = x.shape
    dout = as_dout(dout, cache["out_shape"], x.dtype)
    grads = {}
    dzm = linear_prefixed_vjp(grads, p, "fc", dout, cache["zm"]) if pos is not None else dout
    dz = split_heads(dzm, n_head)
    if cache["type"] == "galerkin":
        m, n_div = cache["m"], cache["n_div"]
        dhat = {"q": dz @ np.swapaxes(m, -1, -2)}
        dm = np.swapaxes(hat["q"], -1, -2) @ dz
        dhat["k"] = hat["v"] @ np.swapaxes(dm, -1, -2) / n_div
        dhat["v"] = hat["k"] @ dm / n_div
    else:
        a, s = cache["a"], cache["s"]
        dhat = {"v": np.swapaxes(a, -1, -2) @ dz}
        da = dz @ np.swapaxes(hat["v"], -1, -2)
        dhat["q"] = da @ hat["k"] * (s / n)
        dhat["k"] = np.swapaxes(da, -1, -2) @ hat["q"] * (s / n)
    if pos is not None:
        grads_pos = sum(dhat[t][..., :npos] for t in "qkv").sum(axis=1)
        dhat = {t: dhat[t][..., npos:] for t in "qkv"}
    for t, (xhat, stats) in cache["norm"].items():
        key = _NORM_KEY[t]
        if f"{key}.weight" in p:
            grads[f"{key}.weight"] = np.sum(dhat[t] * xhat, axis=(0, 2))
            grads[f"{key}.bias"] = np.sum(dhat[t], axis=(0, 2))
            dhat[t] = normalize_backward(dhat[t] * p[f"{key}.weight"][:, None, :], xhat, stats)
        else:
            dhat[t] = normalize_backward(dhat[t], xhat, stats)
    query = cache["query"]
    dx = np.zeros_like(x)
    for i, t in enumerate("qkv"):
        src = query if (t == "q" and query is not None) else x
        g = linear_prefixed_vjp(grads, p, f"linears.{i}", merge_heads(dhat[t]), src)
        if src is x:
            dx = dx + g
        else:
            grads["query"] = g
    grads["x"] = dx
    if pos is not None:
        grads["pos"] = grads_pos
    return grads


def galerkin_attention_forward(x, params, pos=None, *, n_head: int, norm_type="layer",
                               eps: float = 1e-5, query=None, galerkin_length="query"):
    r"""Galerkin-type attention layer: $Z_h = \hat Q(\hat K^\top\hat V)/n$ with K, V normalised.

    Parameters
    ----------
    x : array (B, N, C)
        Point features (the discretised input function), ``C`` divisible by ``n_head``.
    params : dict
        ``linears.{0,1,2}.weight`` (C, C) and ``.bias`` (C,) for Q, K, V
        (PyTorch: ``m.linears[i].weight.T``); with ``norm_type="layer"`` also
        ``norm_K.weight``, ``norm_K.bias``, ``norm_V.weight``, ``norm_V.bias`` of shape (H, d)
        (the per-head LayerNorms stacked); with ``pos`` also ``fc.weight`` (C + H P, C) and
        ``fc.bias`` (C,). :func:`init_params` builds them.
    pos : array (B, N, P), optional
        Point coordinates, concatenated in front of every head's q, k, v (differentiable).
    n_head : int
    norm_type : {"layer", "instance", None}
        Per-head LayerNorm over channels (upstream default), per-head InstanceNorm of each channel
        over the points (upstream ``InstanceNorm1d(affine=True)`` after transposing; the affine
        ``norm_*`` params are optional) or no norm.
    eps : float
        Norm epsilon (upstream 1e-5).
    query : array (B, N_q, C), optional
        Separate query input (cross-attention, upstream ``forward(query, key, value)`` with
        ``key = value = x``); its gradient is returned as ``"query"``.
    galerkin_length : {"query", "key"}
        Divide $\hat K^\top\hat V$ by the query length (upstream quirk, default) or by the
        key length $N$. Equal in self-attention.

    Returns
    -------
    out, cache
        ``out`` (B, N_q, C) when ``pos`` is given (after ``fc``), else (B, N_q, C) merged heads.
    """
    return _simple_forward(x, params, pos, n_head=n_head, attention_type="galerkin",
                           norm_type=norm_type, eps=eps, scale=None, query=query,
                           galerkin_length=galerkin_length)


def galerkin_attention_backward(dout, cache):
    """Gradients of :func:`galerkin_attention_forward`: ``x``, ``pos`` (if given) and every params key."""
    return _simple_backward(dout, cache)


def galerkin_attention(x, params, pos=None, **config):
    """Convenience wrapper: the output of :func:`galerkin_attention_forward`."""
    return galerkin_attention_forward(x, params, pos, **config)[0]


def fourier_type_attention_forward(x, params, pos=None, *, n_head: int, norm_type="layer",
                                   eps: float = 1e-5, scale=None, query=None):
    r"""Fourier-type attention layer: $Z_h = (s\hat Q\hat K^\top)\hat V/n$ with Q, K normalised.

    Same arguments as :func:`galerkin_attention_forward`, except that the norm parameters are
    ``norm_Q.*`` and ``norm_K.*`` and ``scale`` $s$ defaults to $1/\sqrt{d + P}$ (upstream
    ``attention()``: ``d_k = query.size(-1)`` after the coordinate concatenation; OFormer uses
    ``scale=1``). Cost $O(N^2 d)$; no row-stochasticity. ``query`` (B, N_q, C) is a separate
    query input (cross-attention); the Fourier type divides by the key length $N$ as upstream.
    """
    return _simple_forward(x, params, pos, n_head=n_head, attention_type="fourier",
                           norm_type=norm_type, eps=eps, scale=scale, query=query)


def fourier_type_attention_backward(dout, cache):
    """Gradients of :func:`fourier_type_attention_forward`."""
    return _simple_backward(dout, cache)


def fourier_type_attention(x, params, pos=None, **config):
    """Convenience wrapper: the output of :func:`fourier_type_attention_forward`."""
    return fourier_type_attention_forward(x, params, pos, **config)[0]


def init_params(rng, d_model: int, n_head: int, *, pos_dim: int = 0, attention_type="galerkin",
                norm_type="layer", xavier_init: float = 1e-2, diagonal_weight: float = 1e-2,
                dtype=np.float64) -> dict:
    r"""Parameters of a Galerkin/Fourier ``SimpleAttention`` layer, initialised as upstream.

    Q/K/V weights: ``xavier_uniform_(gain=xavier_init) + diagonal_weight * I`` and zero biases
    (upstream ``SimpleAttention._initialize``, defaults 1e-2 / 1e-2); norms (layer and the
    affine instance norm): weight 1, bias 0;
    ``fc`` (only when ``pos_dim > 0``): PyTorch's default ``nn.Linear`` init.
    """
    d_model = check_int(d_model, "d_model", minimum=1)
    n_head = check_int(n_head, "n_head", minimum=1)
    pos_dim = check_int(pos_dim, "pos_dim", minimum=0)
    check_choice(attention_type, "attention_type", tuple(_NORMED))
    check_choice(norm_type, "norm_type", ("layer", "instance", None))
    if d_model % n_head:
        raise ValueError(f"d_model ({d_model}) must be divisible by n_head ({n_head})")
    d = d_model // n_head
    p = {}
    for i in range(3):
        p[f"linears.{i}.weight"] = (xavier_uniform(rng, d_model, d_model, xavier_init)
                                    + diagonal_weight * np.eye(d_model))
        p[f"linears.{i}.bias"] = np.zeros(d_model)
    if norm_type is not None:      # LayerNorm and InstanceNorm1d(affine=True) upstream
        for t in _NORMED[attention_type]:
            p[f"{_NORM_KEY[t]}.weight"] = np.ones((n_head, d))
            p[f"{_NORM_KEY[t]}.bias"] = np.zeros((n_head, d))
    if pos_dim > 0:
        p.update(init_linear_prefixed(rng, d_model + n_head * pos_dim, d_model, "fc"))
    return {k: v.astype(dtype) for k, v in p.items()}


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample_simple(attention_type, norm_type="layer"):
    def sample(rng, size):
        if size == "tiny":
            n, h, d, npos = int(rng.integers(3, 5)), 2, 3, 1
        else:
            n, h, d, npos = int(rng.integers(7, 12)), 2, 4, 2
        c = h * d
        x = rng.standard_normal((2, n, c))
        pos = rng.uniform(0.0, 1.0, (2, n, npos))
        # O(1) projections (not the 1e-2 upstream init) so that every term is exercised
        params = init_params(rng, c, h, pos_dim=npos, attention_type=attention_type,
                             norm_type=norm_type, xavier_init=1.0, diagonal_weight=0.5)
        for k in params:
            if k.startswith("norm") or k.endswith("bias"):
                params[k] = params[k] + 0.3 * rng.standard_normal(params[k].shape)
        return Sample(inputs={"x": x, "pos": pos}, params=params,
                      config={"n_head": h, "norm_type": norm_type})
    return sample


def _galerkin_reference(x, params, pos=None, **config):
    # Explicit O(N^2) form (Q K^T) V / n from the same normalised operands.
    _, cache = galerkin_attention_forward(x, params, pos, **config)
    hat, n = cache["hat"], x.shape[1]
    z = (hat["q"] @ np.swapaxes(hat["k"], -1, -2)) @ hat["v"] / n
    zm = merge_heads(z)
    return linear_prefixed(cache["p"], "fc", zm) if pos is not None else zm


def _fourier_reference(x, params, pos=None, **config):
    # Linear-cost reassociation s Q (K^T V) / n of the quadratic form.
    _, cache = fourier_type_attention_forward(x, params, pos, **config)
    hat, n, s = cache["hat"], x.shape[1], cache["s"]
    z = hat["q"] @ (np.swapaxes(hat["k"], -1, -2) @ hat["v"]) * (s / n)
    zm = merge_heads(z)
    return linear_prefixed(cache["p"], "fc", zm) if pos is not None else zm


def _check_permutation(fwd, sample):
    def check(rng):
        s = sample(rng, "small")
        out = fwd(**s.inputs, params=s.params, **s.config)[0]
        perm = rng.permutation(s.inputs["x"].shape[1])
        inp = {k: v[:, perm] for k, v in s.inputs.items()}
        out_p = fwd(**inp, params=s.params, **s.config)[0]
        err = float(np.abs(out_p - out[:, perm]).max())
        assert err < 1e-12, f"not permutation-equivariant over points: {err}"
        return err
    return check


def _check_explicit_norm(attention_type):
    # The normalised operands equal an explicit NumPy LayerNorm / InstanceNorm.
    def check(rng):
        x = rng.standard_normal((2, 6, 4))
        err = 0.0
        for norm_type in ("layer", "instance"):
            params = init_params(rng, 4, 2, attention_type=attention_type, norm_type=norm_type,
                                 xavier_init=1.0, diagonal_weight=0.5)
            _, cache = _simple_forward(x, params, None, n_head=2, attention_type=attention_type,
                                       norm_type=norm_type, eps=1e-5, scale=None)
            t = _NORMED[attention_type][0]
            raw = split_heads(x @ params[f"linears.{'qkv'.index(t)}.weight"]
                              + params[f"linears.{'qkv'.index(t)}.bias"], 2)
            ax = -1 if norm_type == "layer" else -2
            ref = (raw - raw.mean(ax, keepdims=True)) / np.sqrt(raw.var(ax, keepdims=True) + 1e-5)
            err = max(err, float(np.abs(cache["hat"][t] - ref).max()))
        assert err < 1e-12, f"norm differs from the explicit formula: {err}"
        return err
    return check


def _check_quadrature(rng):
    # Discretisation invariance of the Galerkin layer (instance norm: point statistics are
    # integrals too). A smooth function on [0,1] sampled at midpoints of n and 2n cells: every
    # point average is a midpoint-rule integral, error O(h^2); the outputs, evaluated at the
    # common points, must agree to within C h^2. Bound checked: 4 (h_coarse)^2 max|out|.
    def feats(t):
        return np.stack([np.sin(2 * np.pi * t), np.cos(np.pi * t), t ** 2, np.exp(-t)], -1)[None]
    params = init_params(rng, 4, 2, pos_dim=1, norm_type="instance", xavier_init=1.0,
                         diagonal_weight=0.5)
    errs = []
    for n in (32, 64, 128):
        tc = (np.arange(n) + 0.5) / n
        tf = (np.arange(3 * n) + 0.5) / (3 * n)  # refinement by 3 keeps the coarse midpoints
        oc = galerkin_attention(feats(tc), params, tc[None, :, None], n_head=2, norm_type="instance")
        of = galerkin_attention(feats(tf), params, tf[None, :, None], n_head=2, norm_type="instance")
        e = float(np.abs(oc - of[:, 1::3]).max())
        scale = float(np.abs(of).max())
        assert e <= 4.0 * scale / n ** 2, f"n={n}: resolution gap {e} exceeds 4 max|out|/n^2"
        errs.append(e)
    # second-order convergence: halving h divides the gap by about 4
    assert errs[2] < errs[0] / 8, f"gaps {errs} do not converge at second order"
    return errs[-1]


def _check_cross_attention_fd(rng):
    # Cross-attention (separate query, both length conventions) and the affine instance norm by FD.
    from ..testing.gradcheck import gradcheck
    errs = []
    for att, norm_type, length in (("galerkin", "layer", "query"), ("galerkin", "instance", "key"),
                                   ("fourier", "instance", "query")):
        s = _sample_simple(att, norm_type)(rng, "tiny")
        s.inputs = {"x": s.inputs["x"], "query": rng.standard_normal((2, 2, s.inputs["x"].shape[2]))}
        s.params = {k: v for k, v in s.params.items() if not k.startswith("fc")}
        if att == "galerkin":
            s.config["galerkin_length"] = length
        fwd, bwd = ((galerkin_attention_forward, galerkin_attention_backward) if att == "galerkin"
                    else (fourier_type_attention_forward, fourier_type_attention_backward))
        errs.append(gradcheck(fwd, bwd, s).max_rel)
    return max(errs)


register(
    Mechanism(
        slug="galerkin_attention", family="3-operator", tier="T1",
        title="Galerkin-type (softmax-free, linear-cost) attention",
        paper="S. Cao, Choose a Transformer: Fourier or Galerkin, NeurIPS 2021, arXiv 2105.14995",
        forward=galerkin_attention_forward, backward=galerkin_attention_backward,
        sample=_sample_simple("galerkin"), reference=_galerkin_reference,
        docs="operator-attention.md#galerkin-attention",
        checks={"permutation_equivariance": _check_permutation(galerkin_attention_forward,
                                                               _sample_simple("galerkin")),
                "norm_matches_explicit": _check_explicit_norm("galerkin"),
                "cross_attention_gradcheck": _check_cross_attention_fd,
                "discretisation_invariance": _check_quadrature},
    ),
    Mechanism(
        slug="fourier_type_attention", family="3-operator", tier="T1",
        title="Fourier-type (softmax-free, quadratic) attention",
        paper="S. Cao, Choose a Transformer: Fourier or Galerkin, NeurIPS 2021, arXiv 2105.14995",
        forward=fourier_type_attention_forward, backward=fourier_type_attention_backward,
        sample=_sample_simple("fourier"), reference=_fourier_reference,
        docs="operator-attention.md#fourier-type-attention",
        checks={"permutation_equivariance": _check_permutation(fourier_type_attention_forward,
                                                               _sample_simple("fourier")),
                "norm_matches_explicit": _check_explicit_norm("fourier")},
    ),
)
