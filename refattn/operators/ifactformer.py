r"""IFactFormer-m's parallel axial attention: two axis integrals of the same values, concatenated.

Paper: "IFactFormer-m: modified implicit factorized transformer for turbulent channel flow", 2024.
Upstream (official): huiyu-2002/IFactFormer-m ``libs/factorization_module.py`` @
3f110da556d439601866bf809cd14dd0936a4cf7 (``FABlock3D_m``: three axis branches concatenated per
head, ``torch.cat([u_phi_x, u_phi_y, u_phi_z], dim=5)``); its 2-D form ``FABlock2D_m`` is in the
third-party EntropyXi/IFactFormer-m copy. :func:`ifactformer_m_axial_forward` takes any number
of axes (3 = the official block); :func:`ifactformer_m_attention_forward` is its 2-D form.

Mechanism (per batch element and head)
--------------------------------------
The axis kernels are FactFormer's (``refattn.operators.factformer``, helpers in
``refattn.operators.common``): $K_x = s_x\,q_x k_x^\top$, $K_y = s_y\,q_y k_y^\top$, no softmax,
the same two scales ``scaling_x``, ``scaling_y``. Instead of chaining the two axis integrals,
IFactFormer-m applies them to the *same* $v$ in parallel and concatenates them on the channel
axis (per head):

$$u'_{\parallel} = \big[\,K_x\times_x v \;\big\|\; K_y\times_y v\,\big]\in\mathbb{R}^{n_x\times n_y\times 2c},$$

and with $A$ axes (official 3-D: $x, y, z$) $u' = [K_1\times_1 v\,\|\,\dots\,\|\,K_A\times_A v]$,
$K_a = s_a\,q_a k_a^\top$, of width $Ac$ per head.

``combine="sum"`` adds the branches instead (the other reading of the paper's "parallel"). The
"implicit" part (``libs/model.py``, ``FactorizedTransformer.forward``) is a model-level loop around
the block, $u \leftarrow u + \mathrm{block}(u)/n$ repeated $n$ = ``n_layer`` times with the same
weights, and not part of this layer.

Backward
--------
Parallel: split $G = [G_x\|G_y]$; each branch is one axis contraction and $dv$ is the sum of the
two branch gradients; then $dq_x = s_x\,dK_x\,k_x$, $dk_x = s_x\,dK_x^\top q_x$ (same for $y$).
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, check_choice, check_positive, compute_dtype
from ..registry import Mechanism, register
from ._samples import sample_axial
from .common import axial_kernel_grads, axial_kernels, validate_axial_operands
from .factformer import factformer_attention

__all__ = ["ifactformer_m_attention_forward", "ifactformer_m_attention_backward", "ifactformer_m_attention",
           "ifactformer_m_axial_forward", "ifactformer_m_axial_backward", "ifactformer_m_axial"]


def _validate_axes(v, qs, ks, scalings):
    v = as_float(v, "v", min_ndim=4)
    n_axes = v.ndim - 3
    if not isinstance(qs, (list, tuple)) or not isinstance(ks, (list, tuple)):
        raise TypeError("qs and ks must be lists (one array per spatial axis)")
    if len(qs) != n_axes or len(ks) != n_axes:
        raise ValueError(f"v of shape {v.shape} has {n_axes} spatial axes: qs and ks need {n_axes} entries each; "
                         f"got {len(qs)} and {len(ks)}")
    b, h = v.shape[:2]
    outs = []
    for a in range(n_axes):
        n = v.shape[2 + a]
        pair = []
        for name, arr in ((f"qs[{a}]", qs[a]), (f"ks[{a}]", ks[a])):
            t = as_float(arr, name, ndim=4)
            if t.shape[:3] != (b, h, n):
                raise ValueError(f"{name} must have shape (B={b}, H={h}, {n}, d) to match axis {a} of v "
                                 f"{v.shape}; got {t.shape}")
            pair.append(t)
        if pair[0].shape[3] != pair[1].shape[3]:
            raise ValueError(f"qs[{a}] and ks[{a}] must have the same feature size; got {pair[0].shape[3]} "
                             f"and {pair[1].shape[3]}")
        outs.append(pair)
    if scalings is None:
        scalings = (1.0,) * n_axes
    if not isinstance(scalings, (list, tuple)) or len(scalings) != n_axes:
        raise ValueError(f"scalings must be a sequence of {n_axes} positive numbers; got {scalings!r}")
    sc = tuple(check_positive(x, f"scalings[{a}]") for a, x in enumerate(scalings))
    dt = compute_dtype(v, *(t for pair in outs for t in pair))
    return (v.astype(dt, copy=False), [p[0].astype(dt, copy=False) for p in outs],
            [p[1].astype(dt, copy=False) for p in outs], sc, dt)


def _apply_axis(kern, t, axis):
    r"""$K\times_a t$: contract ``kern (B, H, n, n)`` with spatial axis ``axis`` of ``t (B, H, ..., c)``."""
    tm = np.moveaxis(t, 2 + axis, 2)
    shp = tm.shape
    out = (kern @ tm.reshape(shp[0], shp[1], shp[2], -1)).reshape(shp)
    return np.moveaxis(out, 2, 2 + axis)


def ifactformer_m_axial_forward(v, qs, ks, *, scalings=None, combine: str = "concat"):
    r"""IFactFormer-m parallel axial integrals over any number $A$ of axes:
    $[K_1\times_1 v\,\|\,\dots\,\|\,K_A\times_A v]$, $K_a = s_a\,q_a k_a^\top$ (no softmax).

    Parameters
    ----------
    v : array (B, H, n_1, ..., n_A, c)
        Values per head (``rearrange(to_v(u), 'b i l r (h c) -> b h i l r c')`` for $A = 3$).
    qs, ks : lists of A arrays (B, H, n_a, d_a)
        Per-axis query/key features (``low_rank_kernel_{x,y,z}`` ``to_q``/``to_k`` after RoPE).
    scalings : sequence of A floats, optional
        Kernel scales $s_a$ (default 1).
    combine : {"concat", "sum"}
        ``"concat"``: upstream ``torch.cat([u_phi_x, u_phi_y, u_phi_z], dim=5)`` — per head the
        branches in axis order along the channel axis, ``(B, H, ..., A c)``; ``"sum"`` adds them.

    Returns
    -------
    out, cache
    """
    v, qs, ks, sc, dt = _validate_axes(v, qs, ks, scalings)
    check_choice(combine, "combine", ("concat", "sum"))
    kerns = [s * (q @ np.swapaxes(k, -1, -2)) for s, q, k in zip(sc, qs, ks)]
    branches = [_apply_axis(kern, v, a) for a, kern in enumerate(kerns)]
    out = np.concatenate(branches, axis=-1) if combine == "concat" else sum(branches)
    return out, {"v": v, "qs": qs, "ks": ks, "kerns": kerns, "sc": sc, "combine": combine, "dt": dt,
                 "out_shape": out.shape}


def ifactformer_m_axial_backward(dout, cache):
    r"""Gradients ``{"v", "qs": [...], "ks": [...]}``: split (or copy) the output gradient per
    branch; $dv = \sum_a K_a^\top\times_a G_a$, $dK_a = G_a\times_{\neg a} v$, then
    $dq_a = s_a\,dK_a k_a$, $dk_a = s_a\,dK_a^\top q_a$."""
    v, kerns, sc = cache["v"], cache["kerns"], cache["sc"]
    g = as_dout(dout, cache["out_shape"], cache["dt"])
    c = v.shape[-1]
    n_axes = len(kerns)
    gs = [g[..., a * c:(a + 1) * c] for a in range(n_axes)] if cache["combine"] == "concat" else [g] * n_axes
    dv = 0.0
    dqs, dks = [], []
    for a, (kern, ga) in enumerate(zip(kerns, gs)):
        dv = dv + _apply_axis(np.swapaxes(kern, -1, -2), ga, a)
        gm = np.moveaxis(ga, 2 + a, 2)
        vm = np.moveaxis(v, 2 + a, 2)
        shp = gm.shape
        dk = gm.reshape(shp[0], shp[1], shp[2], -1) @ np.swapaxes(vm.reshape(shp[0], shp[1], shp[2], -1), -1, -2)
        dqs.append(sc[a] * (dk @ cache["ks"][a]))
        dks.append(sc[a] * (np.swapaxes(dk, -1, -2) @ cache["qs"][a]))
    return {"v": dv, "qs": dqs, "ks": dks}


def ifactformer_m_axial(v, qs, ks, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`ifactformer_m_axial_forward`."""
    return ifactformer_m_axial_forward(v, qs, ks, **config)[0]


def ifactformer_m_attention_forward(v, q_x, k_x, q_y, k_y, *, scaling_x: float = 1.0, scaling_y: float = 1.0,
                                    combine: str = "concat"):
    r"""IFactFormer-m parallel axial integrals $[K_x\times_x v\,\|\,K_y\times_y v]$.

    Same arguments as
    [`factformer_attention_forward`][refattn.operators.factformer.factformer_attention_forward].
    ``combine="concat"`` (upstream
    ``FABlock2D_m``: ``torch.cat([u_phi_x, u_phi_y], dim=4)`` per head, giving ``(B, H, nx, ny,
    2c)``; after ``rearrange('b h i l c -> b (h c) i l')`` the channel order is head-major with the
    x-branch first inside each head); ``"sum"`` adds the branches instead (``(B, H, nx, ny, c)``),
    the other reading of the paper's "parallel" wording.
    """
    v, a, sx, sy, dt = validate_axial_operands(v, q_x, k_x, q_y, k_y, scaling_x, scaling_y)
    check_choice(combine, "combine", ("concat", "sum"))
    kx, ky = axial_kernels(a, sx, sy)
    ux = np.einsum("bhij,bhjlc->bhilc", kx, v)
    uy = np.einsum("bhlm,bhimc->bhilc", ky, v)
    out = np.concatenate([ux, uy], axis=-1) if combine == "concat" else ux + uy
    return out, {"v": v, "a": a, "kx": kx, "ky": ky, "sx": sx, "sy": sy, "combine": combine, "dt": dt,
                 "out_shape": out.shape}


def ifactformer_m_attention_backward(dout, cache):
    """Gradients ``{"v", "q_x", "k_x", "q_y", "k_y"}``: the concat VJP is a split, then two
    independent axis contractions whose ``v`` gradients add."""
    v, kx, ky = cache["v"], cache["kx"], cache["ky"]
    g = as_dout(dout, cache["out_shape"], cache["dt"])
    c = v.shape[-1]
    gx, gy = (g[..., :c], g[..., c:]) if cache["combine"] == "concat" else (g, g)
    dv = np.einsum("bhij,bhilc->bhjlc", kx, gx) + np.einsum("bhlm,bhilc->bhimc", ky, gy)
    dkx = np.einsum("bhilc,bhjlc->bhij", gx, v)
    dky = np.einsum("bhilc,bhimc->bhlm", gy, v)
    return {"v": dv, **axial_kernel_grads(cache["a"], dkx, dky, cache["sx"], cache["sy"])}


def ifactformer_m_attention(v, q_x, k_x, q_y, k_y, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`ifactformer_m_attention_forward`."""
    return ifactformer_m_attention_forward(v, q_x, k_x, q_y, k_y, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _explicit_parallel(v, q_x, k_x, q_y, k_y, *, scaling_x=1.0, scaling_y=1.0, combine="concat"):
    kx = scaling_x * np.einsum("bhid,bhjd->bhij", q_x, k_x)
    ky = scaling_y * np.einsum("bhld,bhmd->bhlm", q_y, k_y)
    ux = np.einsum("bhij,bhjlc->bhilc", kx, v)
    uy = np.einsum("bhlm,bhimc->bhilc", ky, v)
    return np.concatenate([ux, uy], -1) if combine == "concat" else ux + uy


def _check_branches(rng):
    # Each parallel branch is a single-axis FactFormer contraction: with q_y = k_y = I (K_y = I)
    # the chained FactFormer equals the x branch, and with K_x = I it equals the y branch.
    s = sample_axial(rng, "small")
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

    gradcheck(ifactformer_m_attention_forward, ifactformer_m_attention_backward, sample_axial(rng, "tiny", combine="sum"))
    return max(err, err2)


def _check_nd_axes(rng):
    # The official 3-D block (and 1-D): FD gradcheck of the A-axis form through a named-input
    # wrapper; the 2-D form equals the A = 2 case.
    from ..registry import Sample
    from ..testing.gradcheck import gradcheck

    def fwd(v, q0, k0, **rest):
        qs = [q0] + [rest.pop(f"q{a}") for a in range(1, 3) if f"q{a}" in rest]
        ks = [k0] + [rest.pop(f"k{a}") for a in range(1, 3) if f"k{a}" in rest]
        return ifactformer_m_axial_forward(v, qs, ks, **rest)

    def bwd(dout, cache):
        g = ifactformer_m_axial_backward(dout, cache)
        out = {"v": g["v"]}
        for a, (dq, dk) in enumerate(zip(g["qs"], g["ks"])):
            out[f"q{a}"], out[f"k{a}"] = dq, dk
        return out

    worst = 0.0
    for grid, combine in (((2, 2, 2), "concat"), ((3,), "sum")):
        v = rng.standard_normal((2, 1, *grid, 1))
        inputs = {"v": v}
        for a, n in enumerate(grid):
            inputs[f"q{a}"] = rng.standard_normal((2, 1, n, 2))
            inputs[f"k{a}"] = rng.standard_normal((2, 1, n, 2))
        cfg = {"scalings": tuple(0.5 + a for a in range(len(grid))), "combine": combine}
        worst = max(worst, gradcheck(fwd, bwd, Sample(inputs=inputs, config=cfg)).max_rel)
    s = sample_axial(rng, "small")
    i = s.inputs
    two = ifactformer_m_attention(**i, scaling_x=0.7, scaling_y=1.3)
    gen = ifactformer_m_axial(i["v"], [i["q_x"], i["q_y"]], [i["k_x"], i["k_y"]], scalings=(0.7, 1.3))
    err = float(np.abs(two - gen).max())
    assert err < 1e-13, f"2-D form differs from the A-axis form: {err:.2e}"
    return max(worst, err)


register(
    Mechanism(
        slug="ifactformer_m_parallel_attention", family="3-operator", tier="T1",
        title="IFactFormer-m parallel axial integrals [K_x x_x v || K_y x_y v]",
        paper="IFactFormer-m: modified implicit factorized transformer for turbulent channel flow, 2024",
        forward=ifactformer_m_attention_forward, backward=ifactformer_m_attention_backward,
        sample=sample_axial, reference=_explicit_parallel,
        docs="neural-operators.md#ifactformer-m-parallel-axial-attention",
        checks={"branches_are_single_axis_contractions": _check_branches, "any_number_of_axes": _check_nd_axes},
    ),
)
