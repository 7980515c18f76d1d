r"""Sinkformer: doubly stochastic attention via log-domain Sinkhorn iterations.

Sander, Ablin, Blondel, Peyré, "Sinkformers: Transformers with Doubly Stochastic Attention",
AISTATS 2022, arXiv 2110.11773. Upstream: michaelsdr/sinkformers @ 045d933490f396c068cba6d7668bb1707a94c7aa
``vit-pytorch/vit_pytorch/sinkhorn.py`` (``SinkhornDistance``) and ``vit.py`` (``Attention``). The full
layer ``sinkformer_layer_forward`` is that ``Attention`` (fused ``to_qkv``, ``to_out``); a module
written from it agrees in float64 within $1.4\times10^{-15}$ relative, output and every gradient.

Forward
-------
Scores $S = s\,QK^\top$ ($s = d^{-1/2}$), $L_0 = S/\varepsilon$. Iteration $t = 0..T-1$
normalises rows when $t$ is even and columns when $t$ is odd, in the log domain:

$$L_{t+1} = L_t - \mathrm{lse}_{\text{axis}_t}(L_t) + \log\mu_{\text{axis}_t},\qquad
\mu_{\text{rows}} = 1/N,\ \mu_{\text{cols}} = 1/M.$$

This is upstream's dual-potential update $u \leftarrow \varepsilon(\log\mu -
\mathrm{lse}(M(C,u,v))) + u$ with $M = (S + u\oplus v)/\varepsilon$ written on $L = M$ directly.
Then $A = M\,e^{L_T}$ (upstream multiplies the transport plan by ``attn.shape[-1]``) and
$Y = AV$. For $N = M$ after a row step every row of $A$ sums to 1, after a column step every
column does; $T = 1$ (one row step) is exactly softmax attention.

Backward (unrolled, hand-derived)
---------------------------------
$dV = A^\top G$, $dA = GV^\top$, $dL_T = dA\odot A$. Each step
$L' = L - \mathrm{lse}_{ax}(L) + c$ has Jacobian $I - P\,\mathbf 1^\top$ along the axis with
$P = \mathrm{softmax}_{ax}(L)$ (since $\partial\,\mathrm{lse}/\partial L = P$), so

$$dL = dL' - P\odot\textstyle\sum_{ax} dL'$$

(the sum broadcast back along the normalised axis). The $T$ softmaxes are stored
($T\,N M$ memory, a reference choice). Finally $dS = dL_0/\varepsilon$,
$dQ = s\,dS\,K$, $dK = s\,dS^\top Q$.

Conventions
-----------
* ``n_iter``: upstream's ``Attention`` class defaults to ``max_iter=3`` (row, column, row),
  the ``Transformer``/``ViT`` wrappers to ``max_iter=1`` (the softmax baseline). refattn's default
  is 3, the mechanism's own default; always pass it explicitly.
* Upstream stops early when a row update changes $u$ by less than ``1e-12`` (summed, batch
  mean); refattn always runs exactly ``n_iter`` steps (the difference is below that threshold).
* Non-square ($N\neq M$) follows upstream literally: marginals $1/N$ and $1/M$ and the final
  factor $M$, so after a row step rows sum to $M/N$.
* No masks: a mask breaks double stochasticity (non-causal by construction).
"""

from __future__ import annotations

import math

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_dim, check_int, check_params, check_positive, compute_dtype
from ...nn.linear import linear_prefixed, linear_prefixed_vjp, linear_vjp, merge_heads, split_heads
from ...nn.softmax import softmax_lse
from ...registry import Mechanism, Sample, register
from .core import mT

__all__ = ["sinkformer_forward", "sinkformer_backward", "sinkformer_attention", "sinkhorn_log", "sinkhorn_log_vjp",
           "sinkformer_layer_forward", "sinkformer_layer_backward", "sinkformer_layer"]


def sinkhorn_log(L0: np.ndarray, n_iter: int):
    r"""Unvalidated log-domain Sinkhorn on ``L0 (..., N, M)``: returns ``(L_T, Ps)`` with the
    softmax of every step (for the backward). Row step when ``t`` is even, column step when odd,
    marginals $1/N$ (rows) and $1/M$ (columns)."""
    n, m = L0.shape[-2], L0.shape[-1]
    L = L0
    Ps = []
    for t in range(n_iter):
        axis = -1 if t % 2 == 0 else -2
        P, lse = softmax_lse(L, axis=axis)
        Ps.append(P)
        L = L - np.expand_dims(lse, axis) - math.log(n if axis == -1 else m)  # a Python float keeps float32
    return L, Ps


def sinkhorn_log_vjp(dL: np.ndarray, Ps) -> np.ndarray:
    r"""Unrolled VJP of :func:`sinkhorn_log`: $\partial\mathcal L/\partial L_0$ from
    $\partial\mathcal L/\partial L_T$ and the stored softmaxes ``Ps``. Each step
    $L' = L - \mathrm{lse}_{ax}(L) + c$ gives $dL = dL' - P\odot\sum_{ax}dL'$ (reverse order).
    Shared with the operator family (MoNo CoTAP, AOT-POT stream mixing)."""
    for t in range(len(Ps) - 1, -1, -1):
        axis = -1 if t % 2 == 0 else -2
        dL = dL - Ps[t] * np.sum(dL, axis=axis, keepdims=True)
    return dL


def sinkformer_forward(q, k, v, *, n_iter: int = 3, eps: float = 1.0, scale: float | None = None):
    r"""Sinkformer attention $Y = AV$, $A = M\exp(\mathrm{Sinkhorn}_T(sQK^\top/\varepsilon))$.

    Parameters
    ----------
    q : (..., N, d); k : (..., M, d); v : (..., M, dv)
        Equal leading axes.
    n_iter : int >= 1
        Sinkhorn steps (upstream ``max_iter``; ``Attention`` default 3, ``ViT`` default 1).
    eps : float > 0
        Entropic regularisation (upstream ``eps``, default 1).
    scale : float or None
        Score scale $s$; default $d^{-1/2}$ (upstream ``dim_head ** -0.5``).

    Returns
    -------
    out : (..., N, dv), cache

    See the module docstring for the derivation of :func:`sinkformer_backward`.
    """
    n_iter = check_int(n_iter, "n_iter", minimum=1)
    eps = check_positive(eps, "eps")
    scale = check_positive(scale, "scale", allow_none=True)
    q = as_float(q, "q", min_ndim=3)
    k = as_float(k, "k", min_ndim=3)
    v = as_float(v, "v", min_ndim=3)
    for name, a in (("k", k), ("v", v)):
        if a.shape[:-2] != q.shape[:-2]:
            raise ValueError(f"{name} must have q's leading axes {q.shape[:-2]}; got {name} of shape {a.shape}")
    check_dim("q", q.shape[-1], "k", k.shape[-1], "the feature size (last axis)")
    check_dim("k", k.shape[-2], "v", v.shape[-2], "the sequence length (axis -2)")
    dt = compute_dtype(q, k, v)
    q, k, v = (a.astype(dt, copy=False) for a in (q, k, v))
    s = q.shape[-1] ** -0.5 if scale is None else scale
    L0 = (s / eps) * (q @ mT(k))
    L, Ps = sinkhorn_log(L0, n_iter)
    A = k.shape[-2] * np.exp(L)
    out = A @ v
    return out, {"q": q, "k": k, "v": v, "A": A, "Ps": Ps, "s": s, "eps": eps, "out_shape": out.shape}


def sinkformer_backward(dout, cache):
    r"""Gradients ``{"q", "k", "v"}`` of :func:`sinkformer_forward` through the unrolled
    iterations: $dL = dL' - P_t\odot\sum_{ax_t}dL'$ per step, in reverse."""
    A, q, k, v = cache["A"], cache["q"], cache["k"], cache["v"]
    g = as_dout(dout, cache["out_shape"], A.dtype)
    dv = mT(A) @ g
    dL = sinkhorn_log_vjp((g @ mT(v)) * A, cache["Ps"])
    dS = dL * (cache["s"] / cache["eps"])
    return {"q": dS @ k, "k": mT(dS) @ q, "v": dv}


def sinkformer_attention(q, k, v, *, n_iter: int = 3, eps: float = 1.0, scale: float | None = None):
    """Convenience wrapper: the output of :func:`sinkformer_forward`."""
    return sinkformer_forward(q, k, v, n_iter=n_iter, eps=eps, scale=scale)[0]


# --------------------------------------------------------------------------------------------
# The full layer (upstream vit.py Attention)


def sinkformer_layer_forward(x, params, *, heads: int, n_iter: int = 3, eps: float = 1.0, scale=None):
    r"""Sinkformer attention layer: upstream ``Attention`` of michaelsdr/sinkformers
    ``vit-pytorch/vit_pytorch/vit.py``.

    $$[Q\,K\,V] = X W_{qkv},\qquad Y = \big[\mathrm{Sinkformer}(Q_h, K_h, V_h)\big]_h\,W_o + b_o,$$

    the fused bias-free ``to_qkv`` chunked into $Q, K, V$ (in that order), heads split as
    ``'b n (h d) -> b h n d'``, the core :func:`sinkformer_forward` (scale ``dim_head ** -0.5``),
    heads merged and ``to_out`` (a biased linear; upstream replaces it with the identity when
    ``heads == 1`` and ``dim_head == dim``: leave the ``to_out.0`` keys out).

    Parameters
    ----------
    x : array (B.., N, C)
    params : dict
        Upstream ``state_dict`` names, ``nn.Linear`` weights ``(in, out)`` (PyTorch ``weight.T``):
        ``to_qkv.weight (C, 3 h d)``, ``to_out.0.weight (h d, C_out)``, ``to_out.0.bias (C_out,)``
        (both optional together: absent = identity output).
    heads : int
        $h$; $d$ = ``to_qkv.weight.shape[1] / (3h)``.
    n_iter, eps, scale
        As :func:`sinkformer_forward`: upstream ``max_iter`` (``Attention`` default 3; ``ViT``
        passes 1), ``eps`` (1), $d^{-1/2}$.

    Backward
    --------
    $dW_o = Z^\top G$, $db_o = \sum G$; the core's unrolled backward; then
    $dW_{qkv} = X^\top[dQ\,dK\,dV]$ and $dX = [dQ\,dK\,dV]\,W_{qkv}^\top$.
    """
    x = as_float(x, "x", min_ndim=2)
    h = check_int(heads, "heads", minimum=1)
    c = x.shape[-1]
    if not isinstance(params, dict) or "to_qkv.weight" not in params:
        raise ValueError("params must be a dict containing 'to_qkv.weight' of shape (C, 3 * heads * dim_head)")
    wq = np.shape(params["to_qkv.weight"])
    if len(wq) != 2 or wq[0] != c or wq[1] % (3 * h):
        raise ValueError(f"to_qkv.weight must have shape (C={c}, 3 * heads * dim_head) with heads={h}; got {wq}")
    inner = wq[1] // 3
    ow = np.shape(params.get("to_out.0.weight", ()))
    c_out = ow[1] if len(ow) == 2 else c
    spec = {"to_qkv.weight": (c, 3 * inner), "to_out.0.weight": (inner, c_out), "to_out.0.bias": (c_out,)}
    p = check_params(params, spec, optional=("to_out.0.weight", "to_out.0.bias"), where="sinkformer_layer")
    if "to_out.0.bias" in p and "to_out.0.weight" not in p:
        raise ValueError("to_out.0.bias is given without to_out.0.weight")
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    qkv = x @ p["to_qkv.weight"]
    q, k, v = (split_heads(qkv[..., i * inner:(i + 1) * inner], h) for i in range(3))
    o, core = sinkformer_forward(q, k, v, n_iter=n_iter, eps=eps, scale=scale)
    merged = merge_heads(o)
    y = linear_prefixed(p, "to_out.0", merged) if "to_out.0.weight" in p else merged
    return y, {"x": x, "p": p, "core": core, "merged": merged, "h": h, "shape": y.shape}


def sinkformer_layer_backward(dout, cache):
    """Gradients of :func:`sinkformer_layer_forward` for ``x`` and every params key."""
    x, p, h = cache["x"], cache["p"], cache["h"]
    g = as_dout(dout, cache["shape"], x.dtype)
    grads: dict = {}
    dm = linear_prefixed_vjp(grads, p, "to_out.0", g, cache["merged"]) if "to_out.0.weight" in p else g
    gc = sinkformer_backward(split_heads(dm, h), cache["core"])
    dqkv = np.concatenate([merge_heads(gc[key]) for key in "qkv"], axis=-1)
    grads["to_qkv.weight"] = linear_vjp(dqkv, x, p["to_qkv.weight"], has_bias=False)["weight"]
    grads["x"] = dqkv @ p["to_qkv.weight"].T
    return grads


def sinkformer_layer(x, params, **config):
    """Convenience wrapper: the output of :func:`sinkformer_layer_forward`."""
    return sinkformer_layer_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _reference(q, k, v, *, n_iter=3, eps=1.0, scale=None):
    """Upstream's dual-potential form, in NumPy: u, v potentials and $\\pi = \\exp((S+u\\oplus v)/\\varepsilon)$."""
    s = q.shape[-1] ** -0.5 if scale is None else scale
    S = s * (q @ mT(k))
    n, m = S.shape[-2:]
    u = np.zeros(S.shape[:-1])
    w = np.zeros(S.shape[:-2] + (m,))

    def lse(x, axis):
        mx = x.max(axis=axis, keepdims=True)
        return np.squeeze(mx, axis) + np.log(np.exp(x - mx).sum(axis=axis))

    for t in range(n_iter):
        Mx = (S + u[..., :, None] + w[..., None, :]) / eps
        if t % 2 == 0:
            u = eps * (np.log(1.0 / n) - lse(Mx, -1)) + u
        else:
            w = eps * (np.log(1.0 / m) - lse(Mx, -2)) + w
    pi = np.exp((S + u[..., :, None] + w[..., None, :]) / eps)
    return (m * pi) @ v


def _qkv(rng, size):
    if size == "tiny":
        n, d, dv, lead = int(rng.integers(3, 6)), 3, 2, (2, 2)
    else:
        n, d, dv, lead = int(rng.integers(8, 15)), 6, 4, (2, 3)
    return (rng.standard_normal(lead + (n, d)), rng.standard_normal(lead + (n, d)),
            rng.standard_normal(lead + (n, dv)))


def _sample(rng, size):
    q, k, v = _qkv(rng, size)
    return Sample(inputs={"q": q, "k": k, "v": v},
                  config={"n_iter": int(rng.integers(1, 6)), "eps": float(rng.choice([1.0, 0.7]))})


def _check_one_iteration_is_softmax(rng):
    q, k, v = _qkv(rng, "small")
    s = q @ mT(k) / np.sqrt(q.shape[-1])
    p, _ = softmax_lse(s, axis=-1)
    err = float(np.max(np.abs(sinkformer_attention(q, k, v, n_iter=1) - p @ v)))
    assert err < 1e-12, f"n_iter=1 differs from softmax attention by {err}"
    return err


def _check_doubly_stochastic(rng):
    """After many steps rows and columns of A sum to 1 (N = M); after an odd count rows exactly."""
    q, k, v = _qkv(rng, "small")
    _, c = sinkformer_forward(q, k, v, n_iter=201)
    A = c["A"]
    e_rows = float(np.max(np.abs(A.sum(-1) - 1)))
    e_cols = float(np.max(np.abs(A.sum(-2) - 1)))
    assert e_rows < 1e-12 and e_cols < 1e-9, (e_rows, e_cols)
    _, c = sinkformer_forward(q, k, v, n_iter=2)
    e2 = float(np.max(np.abs(c["A"].sum(-2) - 1)))
    assert e2 < 1e-12, e2
    return max(e_rows, e_cols, e2)


def _implicit_grad_scores(P: np.ndarray, Gbar: np.ndarray, eps: float) -> np.ndarray:
    r"""Implicit-function VJP of the Sinkhorn fixed point for one ``(N, M)`` plan $P$ (balanced).

    $P_{ij} = e^{L_{ij}+u_i+v_j}$ with fixed marginals: $dP = P\odot(dL + du\oplus dv)$ and the
    row/column sums of $dP$ vanish. For any $\alpha,\beta$,
    $\sum_{ij}(\alpha_i+\beta_j)dP_{ij} = 0$, so choosing them to cancel the $du, dv$
    coefficients, $\sum_j P_{ij}(\bar G_{ij}+\alpha_i+\beta_j) = 0$ and
    $\sum_i P_{ij}(\bar G_{ij}+\alpha_i+\beta_j) = 0$ (a singular but consistent
    $(N+M)$-system, null vector $(\mathbf 1, -\mathbf 1)$), gives
    $\partial\mathcal L/\partial L = P\odot(\bar G + \alpha\oplus\beta)$ and $dS = $ that $/\varepsilon$.
    """
    n, m = P.shape
    top = np.hstack([np.diag(P.sum(1)), P])
    bot = np.hstack([P.T, np.diag(P.sum(0))])
    rhs = -np.concatenate([(P * Gbar).sum(1), (P * Gbar).sum(0)])
    sol = np.linalg.lstsq(np.vstack([top, bot]), rhs, rcond=None)[0]
    alpha, beta = sol[:n], sol[n:]
    return P * (Gbar + alpha[:, None] + beta[None, :]) / eps


def _check_unrolled_equals_implicit(rng):
    """At convergence the unrolled backward equals implicit differentiation of the fixed point
    (catalogue: the instructive alternative must agree at convergence)."""
    q = rng.standard_normal((1, 1, 6, 3))
    k = rng.standard_normal((1, 1, 6, 3))
    v = rng.standard_normal((1, 1, 6, 2))
    eps = 0.9
    out, cache = sinkformer_forward(q, k, v, n_iter=401, eps=eps)
    g = rng.standard_normal(out.shape)
    unrolled = sinkformer_backward(g, cache)
    A = cache["A"][0, 0]
    m = A.shape[-1]
    # A = M P, out = A v: dL/dP = M g v^T
    dS = _implicit_grad_scores(A / m, m * (g[0, 0] @ v[0, 0].T), eps)
    s = cache["s"]
    dq, dk = s * dS @ k[0, 0], s * dS.T @ q[0, 0]
    err = max(float(np.abs(dq - unrolled["q"][0, 0]).max()), float(np.abs(dk - unrolled["k"][0, 0]).max()))
    scale = max(float(np.abs(unrolled["q"]).max()), float(np.abs(unrolled["k"]).max()))
    assert err < 1e-8 * max(scale, 1.0), f"unrolled and implicit gradients differ by {err}"
    return err


def _check_fd_non_square(rng):
    """FD gradcheck with N != M (upstream marginals 1/N, 1/M) and several iteration counts."""
    from ...testing import gradcheck

    errs = []
    for n_iter in (2, 3):
        q = rng.standard_normal((2, 1, 3, 3))
        k = rng.standard_normal((2, 1, 5, 3))
        v = rng.standard_normal((2, 1, 5, 2))
        s = Sample(inputs={"q": q, "k": k, "v": v}, config={"n_iter": n_iter, "scale": 0.8})
        errs.append(gradcheck(sinkformer_forward, sinkformer_backward, s).max_rel)
    return max(errs)


def _check_layer_gradcheck(rng):
    """The full layer (fused to_qkv, to_out linear; and the identity to_out): FD gradcheck of x and
    every parameter, 3 Sinkhorn steps."""
    from ...testing import gradcheck

    worst = 0.0
    for heads, c, d in ((2, 3, 2), (1, 2, 2)):
        params = {"to_qkv.weight": 0.7 * rng.standard_normal((c, 3 * heads * d))}
        if heads * d != c:
            params["to_out.0.weight"] = 0.7 * rng.standard_normal((heads * d, c))
            params["to_out.0.bias"] = 0.2 * rng.standard_normal(c)
        s = Sample(inputs={"x": rng.standard_normal((2, 3, c))}, params=params, config={"heads": heads, "n_iter": 3})
        worst = max(worst, gradcheck(sinkformer_layer_forward, sinkformer_layer_backward, s).max_rel)
    return worst


register(
    Mechanism(
        slug="sinkformer_attention", family="4-linear-kernel-sparse", tier="T1",
        title="Sinkformer: doubly stochastic attention via log-domain Sinkhorn (unrolled backward)",
        paper="Sander, Ablin, Blondel, Peyré, 'Sinkformers: Transformers with Doubly Stochastic "
              "Attention', AISTATS 2022, arXiv 2110.11773",
        forward=sinkformer_forward, backward=sinkformer_backward, sample=_sample, reference=_reference,
        checks={"one_iteration_is_softmax_attention": _check_one_iteration_is_softmax,
                "doubly_stochastic_at_convergence": _check_doubly_stochastic,
                "unrolled_equals_implicit_at_convergence": _check_unrolled_equals_implicit,
                "gradcheck_non_square": _check_fd_non_square, "layer_gradcheck": _check_layer_gradcheck},
        docs="linear-attention.md#sinkformer",
    ),
)
