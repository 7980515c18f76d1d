r"""Anisotropic RBF field decoder: a continuous field, queried anywhere, from oriented Gaussian centres.

Paper: Bafghi, Thakur, Raissi, "From Centerlines to Hemodynamics: Anisotropic RBF Decoders for
Coronary Arteries", arXiv 2605.27578 (2026). No code is public. The paper's abstract is the
accessible source: a transformer encodes the 1-D vessel centreline and the inlet flow, and
"continuous wall-based fields" (pressure, wall shear stress) are predicted "via an anisotropic
Radial Basis Function decoder aligned with vessel morphology" (128 to 1024 centres). This module is
that decoder; the encoder is a standard transformer (e.g. :mod:`refattn.attention.softmax`'s MHA)
whose per-centre outputs supply the decoder's inputs below.

Decoder (reconstruction, as the catalogue states it)
----------------------------------------------------
For a query point $x$ (anywhere in space; the wall points of any mesh), centres $\mu_c$, per-axis
log-scales $\ell_c = \log s_c$, orthonormal frames $R_c$ (columns = local axes; aligned with the
vessel: first axis along the centreline tangent, see :func:`tangent_frames`) and per-centre
output weights $w_c\in\mathbb R^F$:

$$f(x) = \sum_c w_c\,\varphi_c(x),\qquad
\varphi_c(x) = \exp\Big(-\tfrac12\,(x-\mu_c)^\top R_c\,\mathrm{diag}(s_c^{-2})\,R_c^\top(x-\mu_c)\Big)
= \exp\Big(-\tfrac12\sum_a z_{ca}^2\Big),$$

$u_c = R_c^\top(x - \mu_c)$ (local coordinates), $z_{ca} = u_{ca}/s_{ca}$. Reconstruction choices
(the paper's method section is not available): Gaussian profile, log-parameterised scales,
unnormalised sum (no partition-of-unity division), frames given (from the geometry) rather than
predicted; ``frames=None`` means axis-aligned ($R_c = I$).

Backward
--------
With $g = \partial L/\partial f(x)$: $dw_c = \sum_x \varphi_c(x)\,g$,
$d\varphi_c = g\cdot w_c$, $dz_{ca} = -d\varphi_c\,\varphi_c\,z_{ca}$, $du_{ca} = dz_{ca}/s_{ca}$,
$d\ell_{ca} = -\sum_x dz_{ca}z_{ca}$ (since $\partial z/\partial\ell = -z$), and with
$\delta = x - \mu_c$: $d\delta = R_c\,du_c$, $dR_c = \sum_x \delta\,du_c^\top$,
$dx = \sum_c d\delta$, $d\mu_c = -\sum_x d\delta$. The frame gradient is that of the raw matrix
(a caller that parameterises $R_c$ chains it through its own map).
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, compute_dtype
from ..registry import Mechanism, Sample, register

__all__ = ["anisotropic_rbf_forward", "anisotropic_rbf_backward", "anisotropic_rbf", "tangent_frames"]


def tangent_frames(tangents) -> np.ndarray:
    r"""Orthonormal frames ``(..., 3, 3)`` whose first column is the unit tangent.

    The second axis is the normalised component of the coordinate axis least aligned with the
    tangent (so it is never degenerate), the third their cross product (right-handed). A geometry
    utility, not differentiated.
    """
    t = as_float(tangents, "tangents", min_ndim=1)
    if t.shape[-1] != 3:
        raise ValueError(f"tangents must have 3 components on the last axis; got shape {t.shape}")
    norm = np.linalg.norm(t, axis=-1, keepdims=True)
    if np.any(norm == 0):
        raise ValueError("tangents must be non-zero")
    t = t / norm
    e = np.eye(3, dtype=t.dtype)[np.argmin(np.abs(t), axis=-1)]
    n1 = e - np.sum(e * t, axis=-1, keepdims=True) * t
    n1 = n1 / np.linalg.norm(n1, axis=-1, keepdims=True)
    return np.stack([t, n1, np.cross(t, n1)], axis=-1)


def _validate(x, centers, log_scales, weights, frames):
    x = as_float(x, "x", ndim=3)
    b, _, d = x.shape
    centers = as_float(centers, "centers", ndim=3)
    if centers.shape[0] != b or centers.shape[2] != d:
        raise ValueError(f"centers must have shape (B={b}, C, d={d}); got {centers.shape}")
    c = centers.shape[1]
    log_scales = as_float(log_scales, "log_scales", ndim=3)
    if log_scales.shape != centers.shape:
        raise ValueError(f"log_scales must have centers' shape {centers.shape}; got {log_scales.shape}")
    weights = as_float(weights, "weights", ndim=3)
    if weights.shape[:2] != (b, c):
        raise ValueError(f"weights must have shape (B={b}, C={c}, F); got {weights.shape}")
    if frames is not None:
        frames = as_float(frames, "frames", ndim=4)
        if frames.shape != (b, c, d, d):
            raise ValueError(f"frames must have shape (B, C, d, d) = {(b, c, d, d)}; got {frames.shape}")
    dt = compute_dtype(x, centers, log_scales, weights, frames)
    return tuple(None if a is None else a.astype(dt, copy=False) for a in (x, centers, log_scales, weights, frames))


def anisotropic_rbf_forward(x, centers, log_scales, weights, frames=None):
    r"""$f(x) = \sum_c w_c \exp(-\tfrac12\lVert\mathrm{diag}(s_c^{-1})R_c^\top(x-\mu_c)\rVert^2)$.

    Parameters
    ----------
    x : array (B, Q, d)
        Query points.
    centers : array (B, C, d)
        Centres $\mu_c$.
    log_scales : array (B, C, d)
        $\log s_c$ per local axis.
    weights : array (B, C, F)
        Output weights of every centre ($F$ fields, e.g. pressure and WSS).
    frames : array (B, C, d, d), optional
        $R_c$, columns the local axes (:func:`tangent_frames`); default the identity.

    Returns
    -------
    out, cache
        ``out (B, Q, F)``.
    """
    x, centers, log_scales, weights, frames = _validate(x, centers, log_scales, weights, frames)
    delta = x[:, :, None, :] - centers[:, None, :, :]                       # (B, Q, C, d)
    u = delta if frames is None else np.einsum("bqci,bcia->bqca", delta, frames)
    z = u * np.exp(-log_scales)[:, None]
    phi = np.exp(-0.5 * np.sum(z * z, axis=-1))                            # (B, Q, C)
    out = phi @ weights
    cache = dict(delta=delta, z=z, phi=phi, log_scales=log_scales, weights=weights, frames=frames,
                 out_shape=out.shape)
    return out, cache


def anisotropic_rbf_backward(dout, cache):
    """Gradients of :func:`anisotropic_rbf_forward`: ``x``, ``centers``, ``log_scales``, ``weights``
    and ``frames`` (when given)."""
    phi, z, frames = cache["phi"], cache["z"], cache["frames"]
    g = as_dout(dout, cache["out_shape"], phi.dtype)
    grads = {"weights": np.swapaxes(phi, 1, 2) @ g}
    dphi = g @ np.swapaxes(cache["weights"], 1, 2)
    dz = -(dphi * phi)[..., None] * z
    grads["log_scales"] = -np.sum(dz * z, axis=1)
    du = dz * np.exp(-cache["log_scales"])[:, None]
    if frames is None:
        ddelta = du
    else:
        ddelta = np.einsum("bcia,bqca->bqci", frames, du)
        grads["frames"] = np.einsum("bqci,bqca->bcia", cache["delta"], du)
    grads["x"] = ddelta.sum(axis=2)
    grads["centers"] = -ddelta.sum(axis=1)
    return grads


def anisotropic_rbf(x, centers, log_scales, weights, frames=None) -> np.ndarray:
    """Convenience wrapper: the output of :func:`anisotropic_rbf_forward`."""
    return anisotropic_rbf_forward(x, centers, log_scales, weights, frames)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size):
    q, c, f = (3, 2, 2) if size == "tiny" else (int(rng.integers(6, 12)), int(rng.integers(4, 8)), 3)
    centers = rng.uniform(0, 1, (2, c, 3))
    tangents = rng.standard_normal((2, c, 3))
    inputs = {"x": centers[:, rng.integers(0, c, q)] + 0.3 * rng.standard_normal((2, q, 3)),
              "centers": centers, "log_scales": np.log(rng.uniform(0.2, 0.6, (2, c, 3))),
              "weights": rng.standard_normal((2, c, f)), "frames": tangent_frames(tangents)}
    return Sample(inputs=inputs)


def _reference(x, centers, log_scales, weights, frames=None):
    # Covariance form: Sigma_c^{-1} = R_c diag(s_c^{-2}) R_c^T and the quadratic form per (q, c).
    d = x.shape[-1]
    rot = np.broadcast_to(np.eye(d), centers.shape[:2] + (d, d)) if frames is None else frames
    prec = np.einsum("bcia,bca,bcja->bcij", rot, np.exp(-2 * log_scales), rot)
    delta = x[:, :, None] - centers[:, None]
    quad = np.einsum("bqci,bcij,bqcj->bqc", delta, prec, delta)
    return np.einsum("bqc,bcf->bqf", np.exp(-0.5 * quad), weights)


def _check_isotropic_is_standard_rbf(rng):
    # Equal scales on all axes: the frame drops out and the decoder is the standard Gaussian RBF.
    s = _sample(rng, "small")
    iso = np.repeat(s.inputs["log_scales"][..., :1], 3, axis=-1)
    got = anisotropic_rbf(s.inputs["x"], s.inputs["centers"], iso, s.inputs["weights"], s.inputs["frames"])
    r2 = np.sum((s.inputs["x"][:, :, None] - s.inputs["centers"][:, None]) ** 2, axis=-1)
    std = np.exp(-0.5 * r2 * np.exp(-2 * iso[..., 0])[:, None]) @ s.inputs["weights"]
    err = float(np.abs(got - std).max())
    assert err < 1e-14, f"isotropic decoder differs from the standard RBF by {err:.2e}"
    return err


def _check_rotation_equivariance(rng):
    # Rotating queries, centres and frames together leaves the field unchanged (frames carry the anisotropy).
    s = _sample(rng, "small")
    rot, _ = np.linalg.qr(rng.standard_normal((3, 3)))
    base = anisotropic_rbf(**s.inputs)
    moved = anisotropic_rbf(s.inputs["x"] @ rot.T, s.inputs["centers"] @ rot.T, s.inputs["log_scales"],
                            s.inputs["weights"], np.einsum("ij,bcja->bcia", rot, s.inputs["frames"]))
    err = float(np.abs(moved - base).max())
    assert err < 1e-13, f"rigid motion changed the field by {err:.2e}"
    return err


def _check_tangent_frames(rng):
    # Frames are orthonormal, right-handed, with the tangent as first axis; an elongated scale
    # along the tangent makes the kernel decay slower along the vessel than across it.
    t = rng.standard_normal((50, 3))
    t[0] = [0.0, 0.0, 2.0]
    fr = tangent_frames(t)
    err = max(float(np.abs(np.swapaxes(fr, -1, -2) @ fr - np.eye(3)).max()),
              float(np.abs(fr[..., 0] - t / np.linalg.norm(t, axis=-1, keepdims=True)).max()),
              float(np.abs(np.linalg.det(fr) - 1).max()))
    assert err < 1e-14, f"tangent frames not orthonormal/right-handed/aligned: {err:.2e}"
    ls = np.log(np.array([[[0.5, 0.1, 0.1]]]))
    c, w = np.zeros((1, 1, 3)), np.ones((1, 1, 1))
    along = anisotropic_rbf(0.3 * fr[None, :1, :, 0], c, ls, w, fr[None, :1])
    across = anisotropic_rbf(0.3 * fr[None, :1, :, 1], c, ls, w, fr[None, :1])
    assert along[0, 0, 0] > 10 * across[0, 0, 0], "tangent-aligned scale does not stretch the kernel along the vessel"
    return err


register(
    Mechanism(
        slug="anisotropic_rbf_field_decoder", family="3-operator", tier="T2",
        title="Anisotropic RBF field decoder (query-anywhere)",
        paper="Bafghi, Thakur, Raissi, From Centerlines to Hemodynamics: Anisotropic RBF Decoders for Coronary "
              "Arteries, arXiv 2605.27578 (2026)",
        forward=anisotropic_rbf_forward, backward=anisotropic_rbf_backward, sample=_sample, reference=_reference,
        docs="operators/kernel-integrals-and-scans.md#anisotropic-rbf-field-decoder",
        checks={"isotropic_is_standard_rbf": _check_isotropic_is_standard_rbf,
                "rotation_equivariance": _check_rotation_equivariance,
                "tangent_frames": _check_tangent_frames},
    ),
)
