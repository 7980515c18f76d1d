r"""CoDA-NO codomain attention: softmax attention among physical variables (function-valued tokens).

Paper: Rahman et al., "Pretraining Codomain Attention Neural Operators for Solving Multiphysics
PDEs", NeurIPS 2024. Upstream: ashiq24/CoDA-NO ``layers/codano_block_nd.py`` @ 12a4acf (unchanged
since d313bee) (``CodanoBlockND.compute_attention``; ``_forward_equivariant``); neuraloperator/neuraloperator
``neuralop/layers/coda_layer.py`` @ 93d3f0633e048c915004cd782cb339acf06e1157 (``CODALayer``,
also in PyPI ``neuraloperator`` 2.0.0).

Mechanism
---------
Each physical variable $c = 1..V$ is a token whose value is a function on the grid. The block
computes $Q, K, V$ with per-variable FNO blocks (shared weights across variables: permutation
equivariance), then, per head $a$, with $q_c, k_c\in\mathbb{R}^{d\times N}$ flattened over the
token channels $d$ and the $N$ grid points,

$$S_{cc'} = \frac{\langle q_c, k_{c'}\rangle}{\tau\sqrt{dN}},\qquad
P = \mathrm{softmax}_{c'}(S),\qquad o_c = \sum_{c'}P_{cc'}v_{c'}$$

(upstream: ``dprod = q @ k.T / (temperature * sqrt(k.shape[-1]))`` after
``rearrange('(b k) (a d) d0 d1 -> b a k (d d0 d1)')``, so ``k.shape[-1] = d * N``). The rest of
the block (instance norms, the output projection, the residual and the FNO mixer) surrounds this
core and is built from the FNO and norm layers.

Grids. The scores only involve $q$ and $k$, so $v$ may live on another grid: neuraloperator's
``CODALayer`` (``neuralop/layers/coda_layer.py``) with its defaults ``per_channel_attention=True``
and ``scale=None -> 0.5`` computes K and Q with FNO blocks of ``resolution_scaling_factor=0.5``
(a half-resolution grid) and V at full resolution; then ``k.shape[-1] = d\,N_{qk}`` counts the
*coarse* points in $\sqrt{dN}$ (keyword-free: $N$ is always q/k's point count).

Score scaling — a discretisation convention (keyword ``score_scaling``)
-----------------------------------------------------------------------
Upstream's $\langle q,k\rangle/\sqrt{dN}$ is a grid *sum* divided by $\sqrt N$: on a grid twice as
fine it grows by $\sqrt 2$, so the attention sharpens with resolution (the scores are not a
discretisation of a function-space quantity). The paper's intent — an $L^2(\Omega)$ inner product
— is ``score_scaling="quadrature"``:
$S_{cc'} = \sum_x w_x\,q_c(x)\cdot k_{c'}(x)/(\tau\sqrt d)$ with quadrature weights $w_x$
(default $1/N$, the mean), which converges under refinement (the ``discretisation`` check shows
both behaviours).

Backward
--------
The attention VJP of :func:`refattn.attention.softmax.attention_core_backward` on the flattened
tokens: $dv = P^\top G$, $dS = P\odot(GV^\top - \mathrm{rowsum}(P\odot GV^\top))$,
$dq = s\,dS\,k$, $dk = s\,dS^\top q$; in quadrature mode $q$ enters as $w\odot q$, so its
gradient is multiplied by $w$.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, check_choice, check_positive, compute_dtype
from ..attention.softmax import attention_core_backward, attention_core_forward
from ..registry import Mechanism, Sample, register

__all__ = ["codomain_attention_forward", "codomain_attention_backward", "codomain_attention"]


def _validate(q, k, v, temperature, score_scaling, quad_weights):
    q = as_float(q, "q", min_ndim=5, max_ndim=7)
    k = as_float(k, "k", min_ndim=5, max_ndim=7)
    v = as_float(v, "v", min_ndim=5, max_ndim=7)
    if k.shape != q.shape:
        raise ValueError(f"k must have the shape of q {q.shape} (B, heads, variables, d, *grid); got {k.shape}")
    if v.shape[:3] != q.shape[:3] or v.ndim != q.ndim:
        raise ValueError(f"v must have shape (B, heads, variables, dv, *grid_v) with (B, heads, variables) = "
                         f"{q.shape[:3]} and {q.ndim - 4} grid axes (its grid may differ from q's); got {v.shape}")
    temperature = check_positive(temperature, "temperature")
    check_choice(score_scaling, "score_scaling", ("sqrt_numel", "quadrature"))
    grid = q.shape[4:]
    n = int(np.prod(grid))
    w = None
    if score_scaling == "quadrature":
        if quad_weights is None:
            w = np.full(grid, 1.0 / n)
        else:
            w = as_float(quad_weights, "quad_weights")
            if w.shape != grid:
                raise ValueError(f"quad_weights must have the grid shape {grid}; got {w.shape}")
            if not np.all(w > 0):
                raise ValueError("quad_weights must be > 0")
    elif quad_weights is not None:
        raise ValueError('quad_weights is only used with score_scaling="quadrature"')
    dt = compute_dtype(q, k, v, w)
    return (q.astype(dt, copy=False), k.astype(dt, copy=False), v.astype(dt, copy=False),
            None if w is None else w.astype(dt, copy=False), temperature, dt)


def codomain_attention_forward(q, k, v, *, temperature: float = 1.0, score_scaling: str = "sqrt_numel",
                               quad_weights=None):
    r"""Codomain attention among variables: $o_c = \sum_{c'}\mathrm{softmax}_{c'}(S)_{cc'}v_{c'}$.

    Parameters
    ----------
    q, k : array (B, heads, V, d, *grid)
        Per-variable query/key functions (outputs of the Q/K FNO blocks), ``grid`` 1-3 axes.
    v : array (B, heads, V, dv, *grid_v)
        Values; ``grid_v`` may differ from the q/k grid: neuraloperator's ``CODALayer`` builds
        K and Q on a coarser grid (``scale=0.5`` with ``per_channel_attention``) and V at full
        resolution. The scores only see q and k; the output has v's grid.
    temperature : float
        Upstream ``temperature`` (default 1).
    score_scaling : {"sqrt_numel", "quadrature"}
        Upstream ``1/(temperature*sqrt(d*N))`` on the grid sum (default), or the $L^2$ inner
        product by quadrature divided by ``temperature*sqrt(d)`` (see the module docstring).
    quad_weights : array (*grid), optional
        Quadrature weights for ``"quadrature"`` (default uniform ``1/N``).

    Returns
    -------
    out, cache
        ``out (B, heads, V, dv, *grid)``.
    """
    q, k, v, w, temp, dt = _validate(q, k, v, temperature, score_scaling, quad_weights)
    b, h, nv, d = q.shape[:4]
    n = int(np.prod(q.shape[4:]))
    qf, kf, vf = q.reshape(b, h, nv, -1), k.reshape(b, h, nv, -1), v.reshape(b, h, nv, -1)
    if w is None:
        scale = 1.0 / (temp * np.sqrt(d * n))
        qin = qf
        wf = None
    else:
        scale = 1.0 / (temp * np.sqrt(d))
        wf = np.broadcast_to(w.reshape(1, -1), (d, n)).reshape(-1)
        qin = qf * wf
    out, cache = attention_core_forward(qin, kf, vf, scale=float(scale))
    return out.reshape(v.shape), {"core": cache, "wf": wf, "qshape": q.shape, "vshape": v.shape}


def codomain_attention_backward(dout, cache):
    """Gradients ``{"q", "k", "v"}`` (the attention VJP on flattened variable tokens)."""
    vshape = cache["vshape"]
    gr = cache["core"]
    g = as_dout(dout, vshape, gr["p"].dtype)
    grads = attention_core_backward(g.reshape(*vshape[:3], -1), gr)
    dq = grads["q"] if cache["wf"] is None else grads["q"] * cache["wf"]
    return {"q": dq.reshape(cache["qshape"]), "k": grads["k"].reshape(cache["qshape"]),
            "v": grads["v"].reshape(vshape)}


def codomain_attention(q, k, v, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`codomain_attention_forward`."""
    return codomain_attention_forward(q, k, v, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size, **config):
    if size == "tiny":
        b, h, nv, d, grid = 2, 1, int(rng.integers(2, 4)), 1, (int(rng.integers(3, 5)), 3)
    else:
        b, h, nv, d, grid = 2, 2, int(rng.integers(3, 6)), 2, (int(rng.integers(4, 7)), 5)
    shape = (b, h, nv, d) + grid
    return Sample(inputs={"q": rng.standard_normal(shape), "k": rng.standard_normal(shape),
                          "v": rng.standard_normal(shape)}, config={"temperature": 0.5, **config})


def _explicit(q, k, v, *, temperature=1.0, score_scaling="sqrt_numel", quad_weights=None):
    b, h, nv, d = q.shape[:4]
    n = int(np.prod(q.shape[4:]))
    qf, kf, vf = (a.reshape(b, h, nv, a.shape[3], -1) for a in (q, k, v))
    if score_scaling == "sqrt_numel":
        s = np.einsum("bhcdx,bhedx->bhce", qf, kf) / (temperature * np.sqrt(d * n))
    else:
        w = np.full(n, 1.0 / n) if quad_weights is None else np.reshape(quad_weights, n)
        s = np.einsum("bhcdx,bhedx,x->bhce", qf, kf, w) / (temperature * np.sqrt(d))
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("bhce,bhedx->bhcdx", p, vf).reshape(v.shape)


def _check_variable_permutation(rng):
    s = _sample(rng, "small")
    q, k, v = (s.inputs[n] for n in "qkv")
    perm = rng.permutation(q.shape[2])
    base = codomain_attention(q, k, v, **s.config)
    moved = codomain_attention(q[:, :, perm], k[:, :, perm], v[:, :, perm], **s.config)
    err = float(np.abs(moved - base[:, :, perm]).max())
    assert err < 1e-13, f"permuting the variables does not permute the output ({err:.2e})"
    return err


def _check_quadrature_mode(rng):
    from ..testing.gradcheck import gradcheck

    s = _sample(rng, "tiny", score_scaling="quadrature", quad_weights=rng.uniform(0.1, 1.0, (3, 3)))
    s.inputs = {n: a[..., :3, :] for n, a in s.inputs.items()}
    return gradcheck(codomain_attention_forward, codomain_attention_backward, s).max_rel


def _check_coarse_qk_grid(rng):
    # q/k on a coarser grid than v (neuraloperator CODALayer, scale=0.5): explicit form and FD.
    from ..testing.gradcheck import gradcheck

    s = _sample(rng, "tiny")
    b, h, nv = s.inputs["q"].shape[:3]
    s.inputs["q"] = rng.standard_normal((b, h, nv, 1, 2, 2))
    s.inputs["k"] = rng.standard_normal((b, h, nv, 1, 2, 2))
    s.inputs["v"] = rng.standard_normal((b, h, nv, 2, 4, 3))
    out = codomain_attention(**s.inputs, **s.config)
    qf, kf = s.inputs["q"].reshape(b, h, nv, -1), s.inputs["k"].reshape(b, h, nv, -1)
    sc = qf @ np.swapaxes(kf, -1, -2) / (s.config["temperature"] * np.sqrt(qf.shape[-1]))
    pm = np.exp(sc - sc.max(-1, keepdims=True))
    pm /= pm.sum(-1, keepdims=True)
    ref = (pm @ s.inputs["v"].reshape(b, h, nv, -1)).reshape(out.shape)
    err = float(np.abs(out - ref).max())
    assert out.shape == s.inputs["v"].shape and err < 1e-13, f"coarse q/k grid: {err:.2e}"
    return max(err, gradcheck(codomain_attention_forward, codomain_attention_backward, s).max_rel)


def _check_discretisation(rng):
    # Smooth variable functions sampled on 16 and 64 points of [0, 1): quadrature scores converge
    # (outputs at shared points agree to ~1e-12: the midpoint rule is spectrally accurate for
    # periodic functions), while upstream's 1/sqrt(dN) scores sharpen with resolution.
    coef = rng.standard_normal((3, 2, 3))

    def fields(n):
        x = np.arange(n) / n
        f = (coef[..., 0:1] + coef[..., 1:2] * np.sin(2 * np.pi * x) + coef[..., 2:3] * np.cos(2 * np.pi * x))
        return f[None, None]          # (1, 1, V=3, d=2, n)

    fc, ff = fields(16), fields(64)
    quad_c = codomain_attention(fc, fc, fc, score_scaling="quadrature")
    quad_f = codomain_attention(ff, ff, ff, score_scaling="quadrature")
    up_c = codomain_attention(fc, fc, fc)
    up_f = codomain_attention(ff, ff, ff)
    err_q = float(np.abs(quad_f[..., ::4] - quad_c).max())
    err_u = float(np.abs(up_f[..., ::4] - up_c).max())
    assert err_q < 1e-12, f"quadrature scores are not resolution-independent ({err_q:.2e})"
    assert err_u > 1e-3, f"upstream scaling unexpectedly resolution-independent ({err_u:.2e})"
    return err_q


register(
    Mechanism(
        slug="coda_no_codomain_attention", family="3-operator", tier="T2",
        title="CoDA-NO codomain attention: softmax attention among physical variables (function-valued tokens)",
        paper="Rahman et al., Pretraining Codomain Attention Neural Operators for Solving Multiphysics PDEs, NeurIPS 2024",
        forward=codomain_attention_forward, backward=codomain_attention_backward, sample=_sample,
        reference=_explicit, docs="neural-operators.md#coda-no-codomain-attention",
        checks={"variable_permutation_equivariance": _check_variable_permutation,
                "quadrature_mode_gradcheck": _check_quadrature_mode,
                "coarse_qk_grid": _check_coarse_qk_grid,
                "discretisation": _check_discretisation},
    ),
)
