r"""ANIE: attentional neural integral equations, solved by (smoothed) fixed-point iteration.

Paper: Zappala, Fonseca, Caro, Moberly, Higley, Cardin, van Dijk, "Learning integral operators via
neural integral equations", Nature Machine Intelligence 6 (2024); arXiv 2209.15190 ("Neural
Integral Equations" / "Attentional Neural Integral Equations").
Upstream: emazap7/ANIE ``IE_source/Attentional_IE_solver.py`` (``Integral_attention_solver_multbatch``,
``Integral_spatial_attention_solver_multbatch``), ``IE_source/kernels.py`` (``model_blocks``),
``IE_source/Galerkin_transformer.py`` (``SimpleTransformerEncoderLayer``, ``SimpleAttention``,
``linear_attention``, ``attention``) @ 2071ad709b260a6c305450affcf7168fd825f692.

The equation
------------
A second-kind integral equation on tokens $t_i$ (time, or space-time points with coordinates
$x_i$), free term $f$ (upstream ``c``, e.g. the initial value repeated on every token):

$$y(t) = f(t) + \lambda\int_\Omega G_\theta\big(y(s), t, s\big)\,ds,$$

where ANIE replaces the integral by self-attention over the tokens. Upstream's operator is
$\mathcal A_\theta(y) = \big(T_\theta(\hat y) + \hat y\big)_{[:,\,:m]}$ with $\hat y = [y, x]$
(the coordinates appended as channels, $m$ = the width of $y$) and $T_\theta$ = ``model_blocks``:
a Linear lift, $n$ post-norm encoder layers
$h \leftarrow \mathrm{LN}_2\big(h' + \mathrm{FFN}(h')\big)$, $h' = \mathrm{LN}_1(h + \mathrm{Attn}(h))$
(FFN = ``lr2(act(lr1 h))``), and a Linear back to the width of $\hat y$. ``Attn`` is
softmax-free (``"galerkin"``: $Q(K^\top V)/N$, the ANIE experiments; ``"fourier"``:
$(QK^\top/\sqrt{d})V/N$) or ``"softmax"``; heads are merged without an output projection, as
``SimpleAttention`` without positions. Both $1/N$ forms are quadratures of the integral.

With $G(y) = f + \lambda\,\mathcal A_\theta(y)$, the solver (``solve``) iterates with smoothing
$s$ (``smoothing_factor``, 0.5):

$$y^0 = f,\quad g^0 = G(y^0),\qquad y^k = s\,y^{k-1} + (1-s)\,g^{k-1},\quad g^k = G(y^k),\quad k = 1..K,$$

stopping early once $\lVert y^k - g^k\rVert \le$ ``tol``, and returns $g^K$.

Backward (``gradient=``)
------------------------
* ``"unrolled"`` (default; upstream ``accumulate_grads=True``, the PDE experiments): the exact
  derivative of the computed iterate. Going backwards with $\bar g^K = \partial L/\partial g^K$:
  $\bar y^k = J_k^\top\bar g^k$ (the VJP of $G$ at $y^k$, which also accumulates
  $\partial L/\partial\theta$ and $\partial L/\partial x$, and $\bar f \mathrel{+}= \bar g^k$), then
  $\bar y^{k-1} \mathrel{+}= s\,\bar y^k$, $\bar g^{k-1} \mathrel{+}= (1-s)\,\bar y^k$; finally $\bar f \mathrel{+}= \bar y^0$.
  A batch element that stopped early is held fixed (its later steps are identities).
* ``"implicit"``: differentiate the fixed point $y^* = G(y^*)$ instead: solve the adjoint
  equation $\lambda = \bar g + J^\top\lambda$ by iteration (needs $\rho(J) < 1$), then one VJP of
  $G$ with $\lambda$ gives $\partial L/\partial\theta$, $\partial L/\partial x$ and
  $\bar f = \lambda$. Memory independent of $K$; it agrees with ``"unrolled"`` at convergence (checked).
* ``"one_step"``: upstream's default ``accumulate_grads=False`` (the input of every $G$ is
  detached): only the last application of $G$ is differentiated, $\bar f = \bar g^K$ — the first
  term of the Neumann series of ``"implicit"``.

Conventions
-----------
* ``residual=True``: upstream's $T_\theta(\hat y) + \hat y$ inside the operator; note that
  $\partial G/\partial y$ then contains $\lambda I$, so with $\lambda = 1$ the map is no contraction
  (upstream runs a fixed number of iterations, 3 in the Burgers notebook).
* ``lam`` is upstream's ``d(x)`` (default 1). ``tol`` is checked per batch element (upstream
  takes one norm over the whole batch, which couples the batch elements).
* Volterra masks (``lower_bound``/``upper_bound``) and the spline interpolation onto support
  points (``use_support``) are not part of this layer; the tokens are the quadrature nodes.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_choice, check_int, check_params, check_positive, compute_dtype
from ..attention.softmax import attention_core_backward, attention_core_forward
from ..nn.activations import gelu, gelu_grad, silu, silu_grad
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

__all__ = ["anie_forward", "anie_backward", "anie_solve", "init_anie_params"]

_ACT = {"relu": (lambda z: np.maximum(z, 0.0), lambda z: (z > 0).astype(z.dtype)),
        "gelu": (gelu, gelu_grad), "silu": (silu, silu_grad)}


def _count_blocks(params) -> int:
    n = 0
    while f"blocks.{n}.attn.linears.0.weight" in params:
        n += 1
    return n


def _validate(f, coords, params, n_head, attention_type, activation, n_iterations, smoothing_factor, tol, lam,
              gradient, implicit_iterations, implicit_tol, eps):
    f = as_float(f, "f", ndim=3)
    coords = as_float(coords, "coords", ndim=3)
    if coords.shape[:2] != f.shape[:2]:
        raise ValueError(f"coords must have shape (B, N) = {f.shape[:2]} + (p,) to match f; got {coords.shape}")
    n_head = check_int(n_head, "n_head", minimum=1)
    check_choice(attention_type, "attention_type", ("galerkin", "fourier", "softmax"))
    check_choice(activation, "activation", tuple(_ACT))
    check_choice(gradient, "gradient", ("unrolled", "implicit", "one_step"))
    check_int(n_iterations, "n_iterations", minimum=0)
    check_int(implicit_iterations, "implicit_iterations", minimum=1)
    s = check_positive(smoothing_factor, "smoothing_factor", allow_zero=True)
    if s >= 1.0:
        raise ValueError(f"smoothing_factor must be in [0, 1); got {smoothing_factor!r}")
    check_positive(tol, "tol", allow_zero=True)
    check_positive(implicit_tol, "implicit_tol", allow_zero=True)
    check_positive(eps, "eps")
    if isinstance(lam, bool) or not isinstance(lam, (int, float, np.floating, np.integer)) or not np.isfinite(lam):
        raise TypeError(f"lam must be a finite real number; got {lam!r}")
    if not isinstance(params, dict) or "first.weight" not in params:
        raise ValueError("params must be a dict with 'first.weight' (the lift), 'blocks.{l}.*' and 'last_block.*'")
    width = f.shape[2] + coords.shape[2]
    e = as_float(params["first.weight"], "first.weight", ndim=2).shape[1]
    if e % n_head:
        raise ValueError(f"the embedding width ({e}, first.weight's columns) must be divisible by n_head ({n_head})")
    n_blocks = _count_blocks(params)
    spec = {**linear_prefixed_spec("first", width, e), **linear_prefixed_spec("last_block", e, width)}
    for b in range(n_blocks):
        pre = f"blocks.{b}"
        for i in range(3):
            spec.update(linear_prefixed_spec(f"{pre}.attn.linears.{i}", e, e))
        hidden = as_float(params.get(f"{pre}.ff.lr1.weight", np.zeros((e, 1))), f"{pre}.ff.lr1.weight", ndim=2).shape[1]
        spec.update({**linear_prefixed_spec(f"{pre}.ff.lr1", e, hidden), **linear_prefixed_spec(f"{pre}.ff.lr2", hidden, e),
                     f"{pre}.layer_norm1.weight": (e,), f"{pre}.layer_norm1.bias": (e,),
                     f"{pre}.layer_norm2.weight": (e,), f"{pre}.layer_norm2.bias": (e,)})
    p = check_params(params, spec)
    dt = compute_dtype(f, coords, *p.values())
    return f.astype(dt, copy=False), coords.astype(dt, copy=False), cast_all(dt, p), n_blocks


# --------------------------------------------------------------------------------------------
# The operator G(y) = f + lam * (T([y, x]) + [y, x])[:, :, :m] and its VJP


def _attn_forward(h, p, pre, n_head, attention_type):
    q, k, v = (split_heads(linear_prefixed(p, f"{pre}.attn.linears.{i}", h), n_head) for i in range(3))
    n = h.shape[1]
    c = {"q": q, "k": k, "v": v}
    if attention_type == "galerkin":
        c["m"] = np.swapaxes(k, -1, -2) @ v / n
        o = q @ c["m"]
    elif attention_type == "fourier":
        c["a"] = (q @ np.swapaxes(k, -1, -2)) * (float(1.0 / np.sqrt(q.shape[-1])) / n)
        o = c["a"] @ v
    else:
        o, c["core"] = attention_core_forward(q, k, v)
    return merge_heads(o), c


def _attn_backward(dout, h, c, p, pre, n_head, attention_type, grads):
    do = split_heads(dout, n_head)
    q, k, v = c["q"], c["k"], c["v"]
    n = h.shape[1]
    if attention_type == "galerkin":
        dq = do @ np.swapaxes(c["m"], -1, -2)
        dm = np.swapaxes(q, -1, -2) @ do
        dk, dv = v @ np.swapaxes(dm, -1, -2) / n, k @ dm / n
    elif attention_type == "fourier":
        s = float(1.0 / np.sqrt(q.shape[-1])) / n
        dv = np.swapaxes(c["a"], -1, -2) @ do
        da = do @ np.swapaxes(v, -1, -2)
        dq, dk = da @ k * s, np.swapaxes(da, -1, -2) @ q * s
    else:
        g = attention_core_backward(do, c["core"])
        dq, dk, dv = g["q"], g["k"], g["v"]
    dh = np.zeros_like(h)
    for i, d in enumerate((dq, dk, dv)):
        dh = dh + linear_prefixed_vjp(grads, p, f"{pre}.attn.linears.{i}", merge_heads(d), h)
    return dh


def _ln(x, p, key, eps):
    xhat, stats = normalize_forward(x, (2,), eps)
    return xhat * p[f"{key}.weight"] + p[f"{key}.bias"], (xhat, stats)


def _ln_vjp(dy, p, key, c, grads):
    xhat, stats = c
    for name, val in ((f"{key}.weight", np.sum(dy * xhat, axis=(0, 1))), (f"{key}.bias", np.sum(dy, axis=(0, 1)))):
        grads[name] = grads[name] + val if name in grads else val
    return normalize_backward(dy * p[f"{key}.weight"], xhat, stats)


def _g_forward(y, f, coords, p, cfg):
    yhat = np.concatenate([y, coords], axis=-1)
    h0 = linear_prefixed(p, "first", yhat)
    h, blocks = h0, []
    act = _ACT[cfg["activation"]]
    for b in range(cfg["n_blocks"]):
        pre = f"blocks.{b}"
        a, ac = _attn_forward(h, p, pre, cfg["n_head"], cfg["attention_type"])
        h1, ln1 = _ln(h + a, p, f"{pre}.layer_norm1", cfg["eps"])
        z = linear_prefixed(p, f"{pre}.ff.lr1", h1)
        r = act[0](z)
        h2, ln2 = _ln(h1 + linear_prefixed(p, f"{pre}.ff.lr2", r), p, f"{pre}.layer_norm2", cfg["eps"])
        blocks.append(dict(h=h, ac=ac, h1=h1, ln1=ln1, z=z, r=r, ln2=ln2))
        h = h2
    t = linear_prefixed(p, "last_block", h)
    if cfg["residual"]:
        t = t + yhat
    g = f + cfg["lam"] * t[..., :y.shape[-1]]
    return g, dict(yhat=yhat, blocks=blocks, h_last=h)


def _g_vjp(lam_bar, c, p, cfg, grads, with_params=True):
    """VJP of G at the cached point: returns (dy, dcoords); adds parameter grads when asked."""
    m = lam_bar.shape[-1]
    dt = np.zeros_like(c["yhat"])
    dt[..., :m] = cfg["lam"] * lam_bar
    g_local = grads if with_params else {}
    act = _ACT[cfg["activation"]]
    dh = linear_prefixed_vjp(g_local, p, "last_block", dt, c["h_last"])
    for b in reversed(range(cfg["n_blocks"])):
        pre, bc = f"blocks.{b}", c["blocks"][b]
        dsum2 = _ln_vjp(dh, p, f"{pre}.layer_norm2", bc["ln2"], g_local)
        dr = linear_prefixed_vjp(g_local, p, f"{pre}.ff.lr2", dsum2, bc["r"])
        dh1 = dsum2 + linear_prefixed_vjp(g_local, p, f"{pre}.ff.lr1", dr * act[1](bc["z"]), bc["h1"])
        dsum1 = _ln_vjp(dh1, p, f"{pre}.layer_norm1", bc["ln1"], g_local)
        dh = dsum1 + _attn_backward(dsum1, bc["h"], bc["ac"], p, pre, cfg["n_head"], cfg["attention_type"], g_local)
    dyhat = linear_prefixed_vjp(g_local, p, "first", dh, c["yhat"])
    if cfg["residual"]:
        dyhat = dyhat + dt
    return dyhat[..., :m], dyhat[..., m:]


# --------------------------------------------------------------------------------------------
# The solver


def anie_forward(f, coords, params, *, n_head: int = 2, attention_type: str = "galerkin", activation: str = "relu",
                 n_iterations: int = 3, smoothing_factor: float = 0.5, tol: float = 1e-6, lam: float = 1.0,
                 residual: bool = True, gradient: str = "unrolled", implicit_iterations: int = 200,
                 implicit_tol: float = 1e-12, eps: float = 1e-5):
    r"""Solve $y = f + \lambda\,\mathcal A_\theta(y)$ by smoothed fixed-point iteration; return $g^K$.

    Parameters
    ----------
    f : array (B, N, m)
        Free term on the N tokens (upstream ``c``: the initial condition repeated).
    coords : array (B, N, p)
        Token coordinates (time, or space and time), appended to $y$ as channels.
    params : dict
        ``model_blocks`` parameters: ``first.weight (m + p, E)``, ``blocks.{l}.attn.linears.{0,1,2}``
        ``(E, E)``, ``blocks.{l}.layer_norm{1,2}``, ``blocks.{l}.ff.lr1 (E, F)``, ``blocks.{l}.ff.lr2 (F, E)``,
        ``last_block.weight (E, m + p)`` (and ``.bias`` for every Linear; weights are
        ``nn.Linear.weight.T``). :func:`init_anie_params` builds them as upstream.
    n_head : int
    attention_type : {"galerkin", "fourier", "softmax"}
    activation : {"relu", "gelu", "silu"}
        FFN activation (upstream ``relu``).
    n_iterations : int
        $K$, upstream ``max_iterations`` (3 in the Burgers notebook).
    smoothing_factor : float in [0, 1)
        $s$ (upstream 0.5).
    tol : float
        Per-element early stop on $\lVert y^k - g^k\rVert_2$ (upstream ``global_error_tolerance``, 1e-6).
    lam : float
        Multiplier of the integral (upstream ``d``).
    residual : bool
        Upstream's $T_\theta(\hat y) + \hat y$.
    gradient : {"unrolled", "implicit", "one_step"}
        Backward mode (module docstring).
    implicit_iterations, implicit_tol
        Adjoint fixed-point solve of ``gradient="implicit"``.
    eps : float
        LayerNorm epsilon (1e-5).

    Returns
    -------
    out, cache
        ``out (B, N, m)`` $= g^K$; ``cache["iterations"]`` holds each element's iteration count and
        ``cache["residual_norm"]`` its final $\lVert y^K - g^K\rVert$.
    """
    f, coords, p, n_blocks = _validate(f, coords, params, n_head, attention_type, activation, n_iterations,
                                       smoothing_factor, tol, lam, gradient, implicit_iterations, implicit_tol, eps)
    cfg = dict(n_head=n_head, attention_type=attention_type, activation=activation, n_blocks=n_blocks,
               lam=float(lam), residual=bool(residual), eps=eps, s=float(smoothing_factor))
    y = f
    g, c = _g_forward(y, f, coords, p, cfg)
    steps = [dict(c=c, active=np.ones(f.shape[0], dtype=bool))]
    err = np.linalg.norm((y - g).reshape(f.shape[0], -1), axis=1)
    iters = np.zeros(f.shape[0], dtype=np.int64)
    for _ in range(n_iterations):
        active = err > tol
        if not active.any():
            break
        y_new = cfg["s"] * y + (1.0 - cfg["s"]) * g
        g_new, c = _g_forward(y_new, f, coords, p, cfg)
        keep = active[:, None, None]
        y, g = np.where(keep, y_new, y), np.where(keep, g_new, g)
        err = np.where(active, np.linalg.norm((y - g).reshape(f.shape[0], -1), axis=1), err)
        iters = iters + active
        steps.append(dict(c=c, active=active))
    cache = dict(f=f, coords=coords, p=p, cfg=cfg, steps=steps, y_last=y, gradient=gradient,
                 implicit=(implicit_iterations, implicit_tol), iterations=iters, residual_norm=err,
                 out_shape=g.shape)
    return g, cache


def anie_backward(dout, cache):
    r"""Gradients of :func:`anie_forward` for the chosen ``gradient`` mode: ``f``, ``coords`` and every params key."""
    f, p, cfg, steps = cache["f"], cache["p"], cache["cfg"], cache["steps"]
    gbar = as_dout(dout, cache["out_shape"], f.dtype)
    grads = {}
    dcoords = np.zeros_like(cache["coords"])
    if cache["gradient"] != "unrolled":
        # linearise at every element's own last iterate y^K (an element that stopped early kept its y)
        c_last = _g_forward(cache["y_last"], f, cache["coords"], p, cfg)[1]
        lam_bar = gbar
        if cache["gradient"] == "implicit":
            n_max, tol = cache["implicit"]
            for _ in range(n_max):
                jt, _ = _g_vjp(lam_bar, c_last, p, cfg, grads, with_params=False)
                new = gbar + jt
                done = np.abs(new - lam_bar).max() <= tol * max(np.abs(new).max(), 1e-300)
                lam_bar = new
                if done:
                    break
        _, dc = _g_vjp(lam_bar, c_last, p, cfg, grads)
        grads["f"], grads["coords"] = lam_bar, dc
        return grads
    s = cfg["s"]
    df = np.zeros_like(f)
    dy_next = np.zeros_like(f)     # dL/dy^k flowing from step k+1's smoothing
    for k in reversed(range(len(steps))):
        active = steps[k]["active"][:, None, None]
        # g^k = G(y^k) on active elements (else g^k = g^{k-1}, an identity)
        gb_active = np.where(active, gbar, 0.0)
        dy_k, dc = _g_vjp(gb_active, steps[k]["c"], p, cfg, grads)
        dcoords += dc
        df += gb_active
        dy_k = dy_k + dy_next
        if k == 0:
            df += dy_k
            break
        # y^k = s y^{k-1} + (1 - s) g^{k-1} on active elements (else y^k = y^{k-1})
        dy_next = np.where(active, s * dy_k, dy_k)
        gbar = np.where(active, (1.0 - s) * dy_k, gbar)
    grads["f"], grads["coords"] = df, dcoords
    return grads


def anie_solve(f, coords, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`anie_forward`."""
    return anie_forward(f, coords, params, **config)[0]


def init_anie_params(rng, m: int, p: int, *, dim_emb: int = 32, n_blocks: int = 2, n_ff: int = 64,
                     xavier_init: float = 1e-2, diagonal_weight: float = 1e-2, dtype=np.float64) -> dict:
    r"""``model_blocks(m + p - 1, dim_emb, n_head, n_blocks, n_ff, ...)`` parameters as upstream:
    ``first``/``last_block``/FFN Linears with PyTorch's default init; attention ``linears``
    Xavier-uniform with gain ``xavier_init`` plus ``diagonal_weight`` I, zero bias
    (``SimpleAttention._reset_parameters``); LayerNorms weight 1, bias 0."""
    width = m + p
    out = {**init_linear_prefixed(rng, width, dim_emb, "first")}
    bound = xavier_init * np.sqrt(6.0 / (2 * dim_emb))
    for b in range(n_blocks):
        pre = f"blocks.{b}"
        for i in range(3):
            out[f"{pre}.attn.linears.{i}.weight"] = (rng.uniform(-bound, bound, (dim_emb, dim_emb))
                                                     + diagonal_weight * np.eye(dim_emb))
            out[f"{pre}.attn.linears.{i}.bias"] = np.zeros(dim_emb)
        out.update(init_linear_prefixed(rng, dim_emb, n_ff, f"{pre}.ff.lr1"))
        out.update(init_linear_prefixed(rng, n_ff, dim_emb, f"{pre}.ff.lr2"))
        for ln in ("layer_norm1", "layer_norm2"):
            out[f"{pre}.{ln}.weight"], out[f"{pre}.{ln}.bias"] = np.ones(dim_emb), np.zeros(dim_emb)
    out.update(init_linear_prefixed(rng, dim_emb, width, "last_block"))
    return {k: v.astype(dtype) for k, v in out.items()}


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size, *, attention_type="galerkin"):
    if size == "tiny":
        n, m, e, ff, blocks, heads = 3, 1, 3, 2, 1, 1
    else:
        n, m, e, ff, blocks, heads = int(rng.integers(5, 9)), 2, 4, 6, 2, 2
    p = init_anie_params(rng, m, 1, dim_emb=e, n_blocks=blocks, n_ff=ff, xavier_init=1.0, diagonal_weight=0.5)
    for k in p:
        if "layer_norm" in k or k.endswith("bias"):
            p[k] = p[k] + 0.3 * rng.standard_normal(p[k].shape)
    t = np.sort(rng.uniform(0, 1, (2, n, 1)), axis=1)
    return Sample(inputs={"f": rng.standard_normal((2, n, m)), "coords": t}, params=p,
                  config={"n_head": heads, "attention_type": attention_type, "activation": "gelu",
                          "n_iterations": 2, "tol": 0.0, "lam": 0.5})


def _reference(f, coords, params, *, n_head=2, attention_type="galerkin", activation="relu", n_iterations=3,
               smoothing_factor=0.5, tol=1e-6, lam=1.0, residual=True, gradient="unrolled",
               implicit_iterations=200, implicit_tol=1e-12, eps=1e-5):
    # The solver loop of Integral_attention_solver_multbatch with an explicit per-head encoder.
    act = _ACT[activation][0]

    def ln(x, key):
        xc = x - x.mean(-1, keepdims=True)
        return xc / np.sqrt((xc ** 2).mean(-1, keepdims=True) + eps) * params[f"{key}.weight"] + params[f"{key}.bias"]

    def lin(key, x):
        return x @ params[f"{key}.weight"] + params[f"{key}.bias"]

    def big_g(y):
        yhat = np.concatenate([y, coords], -1)
        h = lin("first", yhat)
        for b in range(_count_blocks(params)):
            pre = f"blocks.{b}"
            q, k, v = (lin(f"{pre}.attn.linears.{i}", h) for i in range(3))
            d = q.shape[-1] // n_head
            heads = []
            for hd in range(n_head):
                sl = slice(hd * d, (hd + 1) * d)
                s = q[..., sl] @ np.swapaxes(k[..., sl], 1, 2) / np.sqrt(d)
                if attention_type == "softmax":
                    w = np.exp(s - s.max(-1, keepdims=True))
                    w = w / w.sum(-1, keepdims=True)
                elif attention_type == "fourier":
                    w = s / h.shape[1]
                else:
                    w = s * np.sqrt(d) / h.shape[1]
                heads.append(w @ v[..., sl])
            h = ln(h + np.concatenate(heads, -1), f"{pre}.layer_norm1")
            h = ln(h + lin(f"{pre}.ff.lr2", act(lin(f"{pre}.ff.lr1", h))), f"{pre}.layer_norm2")
        t = lin("last_block", h) + (yhat if residual else 0.0)
        return f + lam * t[..., :f.shape[-1]]

    outs = []
    for b in range(f.shape[0]):
        def gb(y, b=b):
            full = np.repeat(y[None], f.shape[0], axis=0)
            return big_g(full)[b]
        y = f[b]
        g = gb(y)
        for _ in range(n_iterations):
            if np.linalg.norm(y - g) <= tol:
                break
            y = smoothing_factor * y + (1 - smoothing_factor) * g
            g = gb(y)
        outs.append(g)
    return np.stack(outs)


def _contractive(rng, n=6):
    # A small-weight operator without the upstream residual: rho(J) < 1, so the iteration converges.
    s = _sample(rng, "small")
    p = {k: (0.3 * v if k.endswith("weight") and "layer_norm" not in k else v) for k, v in s.params.items()}
    cfg = dict(s.config, residual=False, lam=0.4, n_iterations=n, smoothing_factor=0.0)
    return s, p, cfg


def _check_fixed_point_residual(rng):
    # With enough iterations the returned g^K solves y = f + lam A(y) to the tolerance.
    s, p, cfg = _contractive(rng, n=60)
    cfg = dict(cfg, smoothing_factor=0.5)        # the upstream smoothing converges to the same point
    out, cache = anie_forward(**s.inputs, params=p, **dict(cfg, tol=1e-11))
    again = anie_forward(out, s.inputs["coords"], p, **dict(cfg, n_iterations=0))[0] - out + s.inputs["f"]
    err = float(np.abs(again - out).max())
    assert cache["iterations"].max() < 60 and err < 1e-9, f"fixed point residual {err:.2e}"
    return err


def _check_implicit_equals_unrolled(rng):
    # At convergence the implicit (adjoint fixed point) and unrolled gradients agree; the one-step
    # gradient does not (it drops the Neumann series beyond its first term).
    s, p, cfg = _contractive(rng, n=40)
    cfg = dict(cfg, tol=1e-14)
    g = rng.standard_normal(s.inputs["f"].shape)
    res = {}
    for mode in ("unrolled", "implicit", "one_step"):
        out, cache = anie_forward(**s.inputs, params=p, **dict(cfg, gradient=mode))
        res[mode] = anie_backward(g, cache)
    err = max(float(np.abs(res["implicit"][k] - res["unrolled"][k]).max() / np.abs(res["unrolled"][k]).max())
              for k in res["unrolled"])
    gap = max(float(np.abs(res["one_step"][k] - res["unrolled"][k]).max() / np.abs(res["unrolled"][k]).max())
              for k in ("f", "first.weight"))
    assert err < 1e-8, f"implicit and unrolled gradients differ by {err:.2e} at convergence"
    assert gap > 1e-3, "the one-step gradient unexpectedly matches the full gradient"
    return err


def _check_early_stop_per_element(rng):
    # An element that reached the tolerance is frozen (its output no longer changes), others go on;
    # the unrolled gradient stays exact (finite differences on f).
    s, p, cfg = _contractive(rng, n=40)
    f = s.inputs["f"].copy()
    f[1] *= 30.0
    out_all, cache = anie_forward(f, s.inputs["coords"], p, **dict(cfg, tol=1e-6))
    its = cache["iterations"]
    assert its.max() < 40 and its[0] != its[1], f"iteration counts {its}: no element stopped before another"
    gb = rng.standard_normal(out_all.shape)
    grad = anie_backward(gb, cache)["f"]
    eps, i = 1e-6, (0, 1, 0)
    fp, fm = f.copy(), f.copy()
    fp[i] += eps
    fm[i] -= eps
    up = anie_forward(fp, s.inputs["coords"], p, **dict(cfg, tol=1e-6))
    dn = anie_forward(fm, s.inputs["coords"], p, **dict(cfg, tol=1e-6))
    assert np.array_equal(up[1]["iterations"], cache["iterations"]) and np.array_equal(dn[1]["iterations"],
                                                                                       cache["iterations"])
    fd = float(np.sum((up[0] - dn[0]) * gb) / (2 * eps))
    err = abs(fd - grad[i]) / max(abs(fd), 1e-12)
    assert err < 1e-6, f"unrolled gradient with early stopping off by {err:.2e}"
    return float(err)


def _check_discretisation_convergence(rng):
    # The 1/N attention forms are midpoint quadratures: the same f on N and 3N midpoint tokens of
    # [0, 1] gives outputs that agree at the common tokens to O(h^2) (ratio ~9 per refinement).
    p = init_anie_params(np.random.default_rng(2), 1, 1, dim_emb=4, n_blocks=1, n_ff=6, xavier_init=1.0,
                         diagonal_weight=0.5)

    def run(n):
        t = (np.arange(n) + 0.5) / n
        return anie_solve(np.sin(2 * np.pi * t)[None, :, None], t[None, :, None], p, n_iterations=2,
                          activation="gelu", lam=0.5, tol=0.0)

    gaps = [float(np.abs(run(n) - run(3 * n)[:, 1::3]).max()) for n in (12, 36)]
    assert gaps[1] < gaps[0] / 6, f"gaps {gaps} do not fall at second order"
    return gaps[1]


register(
    Mechanism(
        slug="anie_attentional_integral_equation", family="3-operator", tier="T2",
        title="NIE/ANIE: (attentional) neural integral equations",
        paper="Zappala, Fonseca, Caro, Moberly, Higley, Cardin, van Dijk, Learning integral operators via neural "
              "integral equations, Nature Machine Intelligence 6 (2024), arXiv 2209.15190",
        forward=anie_forward, backward=anie_backward, sample=_sample, reference=_reference,
        docs="operators/kernel-integrals-and-scans.md#anie-attentional-neural-integral-equations",
        checks={"fixed_point_residual": _check_fixed_point_residual,
                "implicit_equals_unrolled": _check_implicit_equals_unrolled,
                "early_stop_per_element": _check_early_stop_per_element,
                "discretisation_convergence": _check_discretisation_convergence},
    ),
)
