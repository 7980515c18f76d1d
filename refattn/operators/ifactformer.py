r"""IFactFormer-m's parallel axial attention: two axis integrals of the same values, concatenated.

Paper: "IFactFormer-m: modified implicit factorized transformer for turbulent channel flow", 2024.
Upstream: huiyu-2002/IFactFormer-m ``libs/factorization_module.py`` (``FABlock3D_m``, commit
3f110da: three axis branches concatenated per head, ``torch.cat([u_phi_x, u_phi_y, u_phi_z],
dim=5)``) and its 2-D form ``FABlock2D_m`` in the EntropyXi/IFactFormer-m copy, which this module
follows.

Mechanism (per batch element and head)
--------------------------------------
The axis kernels are FactFormer's (``refattn.operators.factformer``, helpers in
``refattn.operators.common``): $K_x = s_x\,q_x k_x^\top$, $K_y = s_y\,q_y k_y^\top$, no softmax,
the same two scales ``scaling_x``, ``scaling_y``. Instead of chaining the two axis integrals,
IFactFormer-m applies them to the *same* $v$ in parallel and concatenates them on the channel
axis (per head):

$$u'_{\parallel} = \big[\,K_x\times_x v \;\big\|\; K_y\times_y v\,\big]\in\mathbb{R}^{n_x\times n_y\times 2c}.$$

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

from .._checks import as_dout, check_choice
from ..registry import Mechanism, register
from ._samples import sample_axial
from .common import axial_kernel_grads, axial_kernels, validate_axial_operands
from .factformer import factformer_attention

__all__ = ["ifactformer_m_attention_forward", "ifactformer_m_attention_backward", "ifactformer_m_attention"]


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


register(
    Mechanism(
        slug="ifactformer_m_parallel_attention", family="3-operator", tier="T1",
        title="IFactFormer-m parallel axial integrals [K_x x_x v || K_y x_y v]",
        paper="IFactFormer-m: modified implicit factorized transformer for turbulent channel flow, 2024",
        forward=ifactformer_m_attention_forward, backward=ifactformer_m_attention_backward,
        sample=sample_axial, reference=_explicit_parallel,
        docs="neural-operators.md#ifactformer-m-parallel-axial-attention",
        checks={"branches_are_single_axis_contractions": _check_branches},
    ),
)
