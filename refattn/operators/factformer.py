r"""FactFormer's axial factorised kernel integral and IFactFormer-m's parallel variant.

Papers: Li, Shu, Barati Farimani, "Scalable Transformer for PDE Surrogate Modeling" (FactFormer),
NeurIPS 2023; "IFactFormer-m" (modified implicit factorised transformer), 2024.
Upstream: BaratiLab/FactFormer ``libs/factorization_module.py`` (``FABlock2D.forward``) and
``libs/attention.py`` (``LowRankKernel``); the parallel form as in ``FABlock2D_m`` of
``libs/factorization_module.py`` in EntropyXi/IFactFormer-m (a public copy of the IFactFormer-m
code; the catalogue names huiyu-2002/IFactFormer-m, which the index does not hold).

Mechanism (per batch element and head)
--------------------------------------
Axis kernels from pooled features (the pooling, projections and RoPE happen before this core;
``LowRankKernel`` applies 1-D RoPE to $q, k$ and then)

$$K_x = s_x\,q_x k_x^\top\in\mathbb{R}^{n_x\times n_x},\qquad K_y = s_y\,q_y k_y^\top\in\mathbb{R}^{n_y\times n_y}$$

(no softmax: ``use_softmax = False`` in ``FABlock2D``). FactFormer chains the two axis integrals,

$$u'(i, l, c) = \sum_m K_y(l, m)\sum_j K_x(i, j)\,v(j, m, c)
\quad(\texttt{einsum('bhij,bhjmc->bhimc')}\text{ then }\texttt{einsum('bhlm,bhimc->bhilc')}),$$

a rank-factorised version of the full 4-index kernel $K_x(i,j)K_y(l,m)$ at cost
$O(n_xn_y(n_x+n_y)c)$. IFactFormer-m applies the two axis integrals to the *same* $v$ in parallel
and concatenates them on the channel axis (per head):

$$u'_{\parallel} = \big[\,K_x\times_x v \;\big\|\; K_y\times_y v\,\big]\in\mathbb{R}^{n_x\times n_y\times 2c}.$$

Scaling: ``FABlock2D`` builds ``low_rank_kernel_x`` with ``scaling = 1/sqrt(dim_head *
kernel_multiplier) if kernel_multiplier > 4 else 1`` and ``low_rank_kernel_y`` with ``... else
scaling_factor`` — the two axes can differ upstream, hence two keywords ``scaling_x``,
``scaling_y`` (default 1, upstream's default for ``kernel_multiplier=3``, ``scaling_factor=1``).
``LowRankKernel(residual=True)`` would add $\gamma I/n$; ``FABlock2D`` passes ``residual=False``.

Backward
--------
Chained, with $T = K_x\times_x v$ and $G = \partial L/\partial u'$:
$dT(i,m,c) = \sum_l K_y(l,m)G(i,l,c)$, $dK_y(l,m) = \sum_{i,c}G(i,l,c)T(i,m,c)$,
$dv(j,m,c) = \sum_i K_x(i,j)dT(i,m,c)$, $dK_x(i,j) = \sum_{m,c}dT(i,m,c)v(j,m,c)$;
then $dq_x = s_x\,dK_x\,k_x$, $dk_x = s_x\,dK_x^\top q_x$ (same for $y$).
Parallel: split $G = [G_x\|G_y]$; each branch is one axis contraction and $dv$ is the sum of the
two branch gradients.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_float, check_choice, check_positive, compute_dtype
from ..registry import Mechanism, Sample, register

__all__ = ["factformer_attention_forward", "factformer_attention_backward", "factformer_attention",
           "ifactformer_m_attention_forward", "ifactformer_m_attention_backward", "ifactformer_m_attention"]


def _validate(v, q_x, k_x, q_y, k_y, scaling_x, scaling_y):
    v = as_float(v, "v", ndim=5)
    b, h, nx, ny, _ = v.shape
    arrs = {}
    for name, arr, n in (("q_x", q_x, nx), ("k_x", k_x, nx), ("q_y", q_y, ny), ("k_y", k_y, ny)):
        a = as_float(arr, name, ndim=4)
        if a.shape[:3] != (b, h, n):
            raise ValueError(f"{name} must have shape (B={b}, H={h}, {n}, d) to match v of shape {v.shape}; "
                             f"got {a.shape}")
        arrs[name] = a
    for ax in "xy":
        if arrs[f"q_{ax}"].shape[-1] != arrs[f"k_{ax}"].shape[-1]:
            raise ValueError(f"feature sizes of q_{ax} ({arrs[f'q_{ax}'].shape[-1]}) and k_{ax} "
                             f"({arrs[f'k_{ax}'].shape[-1]}) must agree")
    sx = check_positive(scaling_x, "scaling_x")
    sy = check_positive(scaling_y, "scaling_y")
    dt = compute_dtype(v, *arrs.values())
    return v.astype(dt, copy=False), {k: a.astype(dt, copy=False) for k, a in arrs.items()}, sx, sy, dt


def _kernels(a, sx, sy):
    kx = sx * (a["q_x"] @ np.swapaxes(a["k_x"], -1, -2))
    ky = sy * (a["q_y"] @ np.swapaxes(a["k_y"], -1, -2))
    return kx, ky


def _kernel_grads(a, dkx, dky, sx, sy):
    return {"q_x": sx * (dkx @ a["k_x"]), "k_x": sx * (np.swapaxes(dkx, -1, -2) @ a["q_x"]),
            "q_y": sy * (dky @ a["k_y"]), "k_y": sy * (np.swapaxes(dky, -1, -2) @ a["q_y"])}


def _check_dout(dout, shape, dt):
    dout = as_float(dout, "dout", finite=False)
    if dout.shape != tuple(shape):
        raise ValueError(f"dout must have the output's shape {tuple(shape)}; got {dout.shape}")
    return dout.astype(dt, copy=False)


def factformer_attention_forward(v, q_x, k_x, q_y, k_y, *, scaling_x: float = 1.0, scaling_y: float = 1.0,
                                 order: str = "xy"):
    r"""FactFormer chained axial kernel integral $u' = K_y\times_y(K_x\times_x v)$.

    Parameters
    ----------
    v : array (B, H, nx, ny, c)
        Values per head (upstream ``rearrange(to_v(u), 'b i l (h c) -> b h i l c')``).
    q_x, k_x : array (B, H, nx, d)
        Axis-x query/key features (``LowRankKernel`` ``to_q``/``to_k`` of the x-pooled features,
        after RoPE); ``q_y, k_y`` likewise (B, H, ny, d).
    scaling_x, scaling_y : float
        Kernel scales (upstream 1 and ``scaling_factor``; see the module docstring).
    order : {"xy", "yx"}
        Contraction order; upstream ``"xy"``. Mathematically identical (the ``order_independent``
        check), kept to let users match upstream rounding bit-for-bit-ish in float32.

    Returns
    -------
    out, cache
        ``out (B, H, nx, ny, c)``.
    """
    v, a, sx, sy, dt = _validate(v, q_x, k_x, q_y, k_y, scaling_x, scaling_y)
    check_choice(order, "order", ("xy", "yx"))
    kx, ky = _kernels(a, sx, sy)
    if order == "xy":
        t = np.einsum("bhij,bhjmc->bhimc", kx, v)
        out = np.einsum("bhlm,bhimc->bhilc", ky, t)
    else:
        t = np.einsum("bhlm,bhimc->bhilc", ky, v)
        out = np.einsum("bhij,bhjmc->bhimc", kx, t)
    return out, {"v": v, "a": a, "kx": kx, "ky": ky, "t": t, "sx": sx, "sy": sy, "order": order, "dt": dt}


def factformer_attention_backward(dout, cache):
    """Gradients ``{"v", "q_x", "k_x", "q_y", "k_y"}`` (derivation in the module docstring)."""
    v, kx, ky, t = cache["v"], cache["kx"], cache["ky"], cache["t"]
    g = _check_dout(dout, v.shape, cache["dt"])
    if cache["order"] == "xy":
        dt_ = np.einsum("bhlm,bhilc->bhimc", ky, g)
        dky = np.einsum("bhilc,bhimc->bhlm", g, t)
        dv = np.einsum("bhij,bhimc->bhjmc", kx, dt_)
        dkx = np.einsum("bhimc,bhjmc->bhij", dt_, v)
    else:
        dt_ = np.einsum("bhij,bhimc->bhjmc", kx, g)
        dkx = np.einsum("bhimc,bhjmc->bhij", g, t)
        dv = np.einsum("bhlm,bhilc->bhimc", ky, dt_)
        dky = np.einsum("bhilc,bhimc->bhlm", dt_, v)
    return {"v": dv, **_kernel_grads(cache["a"], dkx, dky, cache["sx"], cache["sy"])}


def factformer_attention(v, q_x, k_x, q_y, k_y, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`factformer_attention_forward`."""
    return factformer_attention_forward(v, q_x, k_x, q_y, k_y, **config)[0]


def ifactformer_m_attention_forward(v, q_x, k_x, q_y, k_y, *, scaling_x: float = 1.0, scaling_y: float = 1.0,
                                    combine: str = "concat"):
    r"""IFactFormer-m parallel axial integrals $[K_x\times_x v\,\|\,K_y\times_y v]$.

    Same arguments as :func:`factformer_attention_forward`. ``combine="concat"`` (upstream
    ``FABlock2D_m``: ``torch.cat([u_phi_x, u_phi_y], dim=4)`` per head, giving ``(B, H, nx, ny,
    2c)``; after ``rearrange('b h i l c -> b (h c) i l')`` the channel order is head-major with the
    x-branch first inside each head); ``"sum"`` adds the branches instead (``(B, H, nx, ny, c)``),
    the other reading of the paper's "parallel" wording.
    """
    v, a, sx, sy, dt = _validate(v, q_x, k_x, q_y, k_y, scaling_x, scaling_y)
    check_choice(combine, "combine", ("concat", "sum"))
    kx, ky = _kernels(a, sx, sy)
    ux = np.einsum("bhij,bhjlc->bhilc", kx, v)
    uy = np.einsum("bhlm,bhimc->bhilc", ky, v)
    out = np.concatenate([ux, uy], axis=-1) if combine == "concat" else ux + uy
    return out, {"v": v, "a": a, "kx": kx, "ky": ky, "sx": sx, "sy": sy, "combine": combine, "dt": dt,
                 "out_shape": out.shape}


def ifactformer_m_attention_backward(dout, cache):
    """Gradients ``{"v", "q_x", "k_x", "q_y", "k_y"}``: the concat VJP is a split, then two
    independent axis contractions whose ``v`` gradients add."""
    v, kx, ky = cache["v"], cache["kx"], cache["ky"]
    g = _check_dout(dout, cache["out_shape"], cache["dt"])
    c = v.shape[-1]
    gx, gy = (g[..., :c], g[..., c:]) if cache["combine"] == "concat" else (g, g)
    dv = np.einsum("bhij,bhilc->bhjlc", kx, gx) + np.einsum("bhlm,bhilc->bhimc", ky, gy)
    dkx = np.einsum("bhilc,bhjlc->bhij", gx, v)
    dky = np.einsum("bhilc,bhimc->bhlm", gy, v)
    return {"v": dv, **_kernel_grads(cache["a"], dkx, dky, cache["sx"], cache["sy"])}


def ifactformer_m_attention(v, q_x, k_x, q_y, k_y, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`ifactformer_m_attention_forward`."""
    return ifactformer_m_attention_forward(v, q_x, k_x, q_y, k_y, **config)[0]


# --------------------------------------------------------------------------------------------
# Records


def _sample(rng, size, **config):
    if size == "tiny":
        b, h, nx, ny, c, d = 2, 1, int(rng.integers(2, 4)), int(rng.integers(2, 4)), 2, 2
    else:
        b, h, nx, ny, c, d = 2, 2, int(rng.integers(4, 7)), int(rng.integers(4, 8)), 3, 4
    return Sample(inputs={"v": rng.standard_normal((b, h, nx, ny, c)),
                          "q_x": rng.standard_normal((b, h, nx, d)), "k_x": rng.standard_normal((b, h, nx, d)),
                          "q_y": rng.standard_normal((b, h, ny, d)), "k_y": rng.standard_normal((b, h, ny, d))},
                  config={"scaling_x": 0.7, "scaling_y": 1.3, **config})


def _explicit_factformer(v, q_x, k_x, q_y, k_y, *, scaling_x=1.0, scaling_y=1.0, order="xy"):
    # The full 4-index kernel K(i,l; j,m) = K_x(i,j) K_y(l,m), contracted in one go.
    kx = scaling_x * np.einsum("bhid,bhjd->bhij", q_x, k_x)
    ky = scaling_y * np.einsum("bhld,bhmd->bhlm", q_y, k_y)
    return np.einsum("bhij,bhlm,bhjmc->bhilc", kx, ky, v)


def _explicit_parallel(v, q_x, k_x, q_y, k_y, *, scaling_x=1.0, scaling_y=1.0, combine="concat"):
    kx = scaling_x * np.einsum("bhid,bhjd->bhij", q_x, k_x)
    ky = scaling_y * np.einsum("bhld,bhmd->bhlm", q_y, k_y)
    ux = np.einsum("bhij,bhjlc->bhilc", kx, v)
    uy = np.einsum("bhlm,bhimc->bhilc", ky, v)
    return np.concatenate([ux, uy], -1) if combine == "concat" else ux + uy


def _check_order(rng):
    s = _sample(rng, "small")
    a = factformer_attention(**s.inputs, **s.config)
    b = factformer_attention(**s.inputs, **{**s.config, "order": "yx"})
    err = float(np.abs(a - b).max())
    assert err < 1e-12 * max(1.0, float(np.abs(a).max())), f"xy and yx orders differ by {err:.2e}"
    from ..testing.gradcheck import gradcheck

    s2 = _sample(rng, "tiny", order="yx")
    gradcheck(factformer_attention_forward, factformer_attention_backward, s2)
    return err


def _check_x_permutation(rng):
    s = _sample(rng, "small")
    i = s.inputs
    perm = rng.permutation(i["v"].shape[2])
    base = factformer_attention(**i, **s.config)
    moved = factformer_attention(i["v"][:, :, perm], i["q_x"][:, :, perm], i["k_x"][:, :, perm],
                                 i["q_y"], i["k_y"], **s.config)
    err = float(np.abs(moved - base[:, :, perm]).max())
    assert err < 1e-12, f"permuting the x axis does not permute the output (err {err:.2e})"
    return err


def _check_branches(rng):
    # Each parallel branch is a single-axis FactFormer contraction: with q_y = k_y = I (K_y = I)
    # the chained FactFormer equals the x branch, and with K_x = I it equals the y branch.
    s = _sample(rng, "small")
    i = dict(s.inputs)
    b, h, nx, ny, c = i["v"].shape
    par = ifactformer_m_attention(**i, scaling_x=0.7, scaling_y=1.3)
    eye_y = np.broadcast_to(np.eye(ny), (b, h, ny, ny))
    eye_x = np.broadcast_to(np.eye(nx), (b, h, nx, nx))
    x_only = factformer_attention(i["v"], i["q_x"], i["k_x"], eye_y, eye_y, scaling_x=0.7, scaling_y=1.0)
    y_only = factformer_attention(i["v"], eye_x, eye_x, i["q_y"], i["k_y"], scaling_x=1.0, scaling_y=1.3)
    err = max(float(np.abs(par[..., :c] - x_only).max()), float(np.abs(par[..., c:] - y_only).max()))
    assert err < 1e-12, f"parallel branches differ from single-axis contractions by {err:.2e}"
    summed = ifactformer_m_attention(**i, scaling_x=0.7, scaling_y=1.3, combine="sum")
    err2 = float(np.abs(summed - (x_only + y_only)).max())
    assert err2 < 1e-12
    from ..testing.gradcheck import gradcheck

    gradcheck(ifactformer_m_attention_forward, ifactformer_m_attention_backward, _sample(rng, "tiny", combine="sum"))
    return max(err, err2)


register(
    Mechanism(
        slug="factformer_factorized_attention", family="3-operator", tier="T1",
        title="FactFormer axial factorised kernel integral K_y x_y (K_x x_x v), softmax-free",
        paper="Li, Shu, Barati Farimani, Scalable Transformer for PDE Surrogate Modeling, NeurIPS 2023",
        forward=factformer_attention_forward, backward=factformer_attention_backward, sample=_sample,
        reference=_explicit_factformer, docs="neural-operators.md#factformer-axial-factorised-attention",
        checks={"order_independent": _check_order, "x_permutation_equivariance": _check_x_permutation},
    ),
    Mechanism(
        slug="ifactformer_m_parallel_attention", family="3-operator", tier="T1",
        title="IFactFormer-m parallel axial integrals [K_x x_x v || K_y x_y v]",
        paper="IFactFormer-m: modified implicit factorized transformer for turbulent channel flow, 2024",
        forward=ifactformer_m_attention_forward, backward=ifactformer_m_attention_backward,
        sample=_sample, reference=_explicit_parallel,
        docs="neural-operators.md#ifactformer-m-parallel-axial-attention",
        checks={"branches_are_single_axis_contractions": _check_branches},
    ),
)
