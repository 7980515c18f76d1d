r"""Chiral-RoPE: a rotary encoding whose relative rotation is signed by a handedness pseudoscalar.

Paper: GSF-$\chi$ (a graph transformer for chiral molecules, catalogue seed [2-68], 2025/26). Its
abstract is the only source refattn could read: "each central or axial stereogenic unit creates a
reflection-even phase field over all atoms, a handedness pseudoscalar $\chi$ sets the direction of a
relative rotation on latent query–key blocks, giving a Chiral-RoPE that reflection inverts rather
than leaves fixed". No code is public.

What is implemented (reconstruction)
------------------------------------
The abstract fixes the structure — RoPE-style rotations of query/key channel pairs by per-token
phases, with the *direction* of the relative rotation set by $\chi$ — but not how the phase field
is built from the stereogenic units. So the phases are an input (a learned or precomputed field,
differentiated), and the simplest reading of "$\chi$ sets the direction" is used: for token phases
$\vartheta_{i,m}$ (one per rotary plane $m$) and $\chi\in\{-1, +1\}$ per sample (a molecule and its
mirror image differ only in the sign of $\chi$),

$$S_{ij} = s\,q_i^\top R\big(\chi(\vartheta_j - \vartheta_i)\big)\,k_j
        = s\,\big(R(\chi\vartheta_i)q_i\big)^\top\big(R(\chi\vartheta_j)k_j\big),$$

with $R(\phi)$ the block rotation of `refattn.nn.rope` (pairs $(m, m+r/2)$ by default,
``interleaved=True`` for $(2m, 2m+1)$), then $O = \mathrm{softmax}(S)V$ through the attention core.
Consequences, checked by the record: $\chi = +1$ is RoPE with angles $\vartheta$ (with
$\vartheta_{i,m} = p_i\theta_m$ it is exactly `refattn.nn.rope`); $\chi\to-\chi$ maps the scores to
$q_i^\top R(\vartheta_i-\vartheta_j)k_j$ (reflection inverts the relative rotation); $\chi = 0$ (no
stereogenic unit) leaves $q, k$ unrotated. $\chi$ is a configuration array (a sign, not
differentiated); any finite real value is accepted and simply scales the phases.

Backward (derivation)
---------------------
With $\phi = \chi\vartheta$, $\tilde q = R(\phi)q$, $\tilde k = R(\phi)k$ and the attention VJP
(`refattn.attention.softmax.attention_core_backward`) giving $d\tilde q, d\tilde k, dv$:
RoPE is orthogonal, so $dq = R(-\phi)\,d\tilde q$, $dk = R(-\phi)\,d\tilde k$; the phase enters
through the generator $J$ ($\partial\tilde x/\partial\phi_m = J\tilde x^{(m)}$), so per plane
$\partial L/\partial\phi_m = \tilde x_a\,d\tilde x_b - \tilde x_b\,d\tilde x_a$
(`refattn.nn.rope.rope_angles_vjp`) from both $\tilde q$ and $\tilde k$, and
$d\vartheta = \chi\,(\partial L/\partial\phi)$, summed over the axes along which the phases were
broadcast (heads). Channels beyond ``rotary_dim`` pass through.

Shapes: ``q (B, H, N, d)``, ``k (B, H_kv, N, d)``, ``v (B, H_kv, N, dv)`` (self-attention over the
tokens/atoms that carry the phases), ``phases (B, N, r/2)`` shared by the heads or
``(B, H, N, r/2)`` per head, ``chirality (B,)``.
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, check_int, compute_dtype, validate_qkv
from ...nn.rope import apply_rope, rope_angles_vjp
from ...registry import Mechanism, Sample, register
from ._samples import random_qkv_heads
from .core import attention_core_backward, attention_core_forward, sum_to_shape

__all__ = ["validate_chirality", "chiral_rope_attention_forward", "chiral_rope_attention_backward",
           "chiral_rope_attention"]


def validate_chirality(chirality, batch: int) -> np.ndarray:
    """``chirality`` as a float64 array of shape ``(B,)`` (a scalar is broadcast), finite."""
    if chirality is None:
        raise TypeError("chirality is required: an array (B,) of handedness signs (+1 / -1)")
    c = np.asarray(chirality)
    if c.dtype.kind not in "iuf" or c.dtype == np.bool_:
        raise TypeError(f"chirality must be a real (or integer) array of signs; got dtype {c.dtype}")
    if c.ndim == 0:
        c = np.full(batch, float(c))
    if c.shape != (batch,):
        raise ValueError(f"chirality must have shape (B,) = ({batch},); got {c.shape}")
    c = c.astype(np.float64)
    if not np.isfinite(c).all():
        raise ValueError("chirality contains NaN or infinite values")
    return c


def chiral_rope_attention_forward(q, k, v, phases, *, chirality, rotary_dim=None, interleaved: bool = False,
                                  scale=None, is_causal: bool = False, attn_mask=None,
                                  kv_group_map: str = "contiguous"):
    r"""Softmax attention with Chiral-RoPE (see the module docstring; reconstruction).

    Parameters
    ----------
    q : array (B, H, N, d)
    k : array (B, H_kv, N, d)
    v : array (B, H_kv, N, dv)
    phases : array (B, N, r/2) or (B, H, N, r/2)
        The phase field $\vartheta$ (differentiated); ``r = rotary_dim`` (default ``d``, even).
    chirality : array (B,) or scalar
        Handedness $\chi$ (+1 / -1; 0 = no rotation). Not differentiated.
    rotary_dim : int, optional
        Rotate only the first ``r`` channels (must equal ``2 * phases.shape[-1]``).
    interleaved : bool
        Channel pairing: ``False`` (default) $(m, m + r/2)$, ``True`` $(2m, 2m+1)$.
    scale, is_causal, attn_mask, kv_group_map
        As `refattn.attention.softmax.sdpa_forward` (scale default $d^{-1/2}$).

    Returns
    -------
    out, cache
        ``out (B, H, N, dv)``.
    """
    q, k, v = validate_qkv(q, k, v)
    if q.ndim != 4:
        raise ValueError(f"q must have shape (B, H, N, d); got {q.shape}")
    b, h, n, d = q.shape
    if k.shape[-2] != n:
        raise ValueError(f"k must have the N={n} tokens of q (self-attention over the phase-carrying tokens); "
                         f"got k of shape {k.shape}")
    phases = as_float(phases, "phases")
    if not isinstance(interleaved, (bool, np.bool_)):
        raise TypeError(f"interleaved must be a bool; got {type(interleaved).__name__}")
    r = d if rotary_dim is None else check_int(rotary_dim, "rotary_dim", minimum=2)
    if r % 2 or r > d:
        raise ValueError(f"rotary_dim must be even and <= the head dim {d}; got {r}")
    if phases.shape not in ((b, n, r // 2), (b, h, n, r // 2)):
        raise ValueError(f"phases must have shape (B, N, r/2) = ({b}, {n}, {r // 2}) or (B, H, N, r/2) = "
                         f"({b}, {h}, {n}, {r // 2}); got {phases.shape}")
    if phases.ndim == 4 and k.shape[1] != h:
        raise ValueError(f"per-head phases (B, H, N, r/2) need one kv head per query head; got H={h} query and "
                         f"{k.shape[1]} kv heads (pass phases (B, N, r/2) shared by the heads with GQA)")
    chi = validate_chirality(chirality, b)
    dt = compute_dtype(q, k, v, phases)
    q, k, v, phases = (a.astype(dt, copy=False) for a in (q, k, v, phases))
    th = phases[:, None] if phases.ndim == 3 else phases                     # (B, 1 or H, N, r/2)
    phi = chi.astype(dt)[:, None, None, None] * th
    cos, sin = np.cos(phi), np.sin(phi)
    qr = apply_rope(q, cos, sin, bool(interleaved))
    kr = apply_rope(k, cos, sin, bool(interleaved))
    out, core = attention_core_forward(qr, kr, v, attn_mask=attn_mask, is_causal=is_causal, scale=scale,
                                       kv_group_map=kv_group_map)
    cache = {"core": core, "qr": qr, "kr": kr, "cos": cos, "sin": sin, "chi": chi.astype(dt), "r": r,
             "interleaved": bool(interleaved), "phases_shape": phases.shape, "out_shape": out.shape}
    return out, cache


def chiral_rope_attention_backward(dout, cache):
    """Gradient of :func:`chiral_rope_attention_forward`: ``q, k, v, phases`` (derivation in the module docstring)."""
    core, cos, sin, inter, r = cache["core"], cache["cos"], cache["sin"], cache["interleaved"], cache["r"]
    g = as_dout(dout, cache["out_shape"], cos.dtype)
    gc = attention_core_backward(g, core)
    dqr, dkr = gc["q"], gc["k"]
    dq = apply_rope(dqr, cos, -sin, inter)
    dk = apply_rope(dkr, cos, -sin, inter)
    # d phi per head from the rotated queries and keys, then summed over the heads the phases broadcast along
    dphi = sum_to_shape(rope_angles_vjp(dqr, cache["qr"], r, inter), cos.shape) \
        + sum_to_shape(rope_angles_vjp(dkr, cache["kr"], r, inter), cos.shape)
    dth = cache["chi"][:, None, None, None] * dphi
    return {"q": dq, "k": dk, "v": gc["v"], "phases": dth.reshape(cache["phases_shape"])}


def chiral_rope_attention(q, k, v, phases, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`chiral_rope_attention_forward`."""
    return chiral_rope_attention_forward(q, k, v, phases, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size):
    if size == "tiny":
        h, n, d = 2, int(rng.integers(2, 4)), 4
        hkv = int(rng.choice([1, 2]))
    else:
        h, n, d = 4, int(rng.integers(4, 8)), 6
        hkv = int(rng.choice([1, 2, 4]))
    q, k, v = random_qkv_heads(rng, 2, h, hkv, n, n, d, 2 if size == "tiny" else 3)
    r = d if rng.random() < 0.6 else d - 2
    per_head = hkv == h and rng.random() < 0.5
    phases = rng.uniform(-np.pi, np.pi, (2, h, n, r // 2) if per_head else (2, n, r // 2))
    cfg = {"chirality": np.array([1.0, -1.0]), "interleaved": bool(rng.random() < 0.5),
           "is_causal": bool(rng.random() < 0.3)}
    if r != d:
        cfg["rotary_dim"] = r
    return Sample(inputs={"q": q, "k": k, "v": v, "phases": phases}, config=cfg)


def _block_rotation(phi, d, r, interleaved):
    # explicit (d, d) rotation matrix with 2x2 blocks on the rotary pairs
    m = np.eye(d)
    for j, a in enumerate(phi):
        i0, i1 = (2 * j, 2 * j + 1) if interleaved else (j, j + r // 2)
        m[i0, i0], m[i0, i1], m[i1, i0], m[i1, i1] = np.cos(a), -np.sin(a), np.sin(a), np.cos(a)
    return m


def _scores_explicit(q, k, th_q, th_k, chi, r, interleaved):
    # S_ij = q_i^T R(chi (theta_j - theta_i)) k_j with explicit rotation matrices
    n, d = q.shape
    return np.array([[q[i] @ _block_rotation(chi * (th_k[j] - th_q[i]), d, r, interleaved) @ k[j]
                      for j in range(n)] for i in range(n)])


def _reference(q, k, v, phases, *, chirality, rotary_dim=None, interleaved=False, scale=None, is_causal=False,
               attn_mask=None, kv_group_map="contiguous"):
    b, h, n, d = q.shape
    hkv = k.shape[1]
    r = d if rotary_dim is None else rotary_dim
    s = d ** -0.5 if scale is None else scale
    chi = np.broadcast_to(np.asarray(chirality, float), (b,))
    out = np.zeros(q.shape[:-1] + (v.shape[-1],))
    for bb in range(b):
        for hh in range(h):
            g = hh // (h // hkv) if kv_group_map == "contiguous" else hh % hkv
            thq = phases[bb] if phases.ndim == 3 else phases[bb, hh]
            thk = phases[bb] if phases.ndim == 3 else phases[bb, g]
            e = s * _scores_explicit(q[bb, hh], k[bb, g], thq, thk, chi[bb], r, interleaved)
            if is_causal:
                e = np.where(np.tri(n, dtype=bool), e, -np.inf)
            w = np.exp(e - e.max(-1, keepdims=True))
            out[bb, hh] = (w / w.sum(-1, keepdims=True)) @ v[bb, g]
    return out


def _check_chi_plus_one_is_rope(rng):
    # chi = +1 with phases p_i theta_m is RoPE: equals sdpa(rope(q), rope(k), v) of refattn.nn.rope.
    from ...nn.rope import rope, rope_angles
    from .sdpa import sdpa
    q, k, v = random_qkv_heads(rng, 2, 2, 2, 5, 5, 6, 3)
    pos = np.sort(rng.uniform(0, 20, 5))
    errs = []
    for inter in (False, True):
        got = chiral_rope_attention(q, k, v, np.broadcast_to(rope_angles(pos, 6, base=100.0), (2, 5, 3)),
                                    chirality=np.ones(2), interleaved=inter)
        want = sdpa(rope(q, positions=pos, base=100.0, interleaved=inter),
                    rope(k, positions=pos, base=100.0, interleaved=inter), v)
        errs.append(float(np.abs(got - want).max()))
    err = max(errs)
    assert err < 1e-12, err
    return err


def _check_reflection_inverts_rotation(rng):
    # chi -> -chi maps the scores q_i^T R(theta_j - theta_i) k_j to q_i^T R(theta_i - theta_j) k_j, and
    # with the phase field negated instead the two mirror images agree (chi theta is what enters).
    q, k, v = random_qkv_heads(rng, 2, 2, 2, 4, 4, 4, 2)
    th = rng.uniform(-3, 3, (2, 4, 2))
    errs = []
    for bb in range(2):
        mirror = _scores_explicit(q[bb, 0], k[bb, 0], th[bb], th[bb], -1.0, 4, False)
        want = np.array([[q[bb, 0, i] @ _block_rotation(th[bb, i] - th[bb, j], 4, 4, False) @ k[bb, 0, j]
                          for j in range(4)] for i in range(4)])
        errs.append(float(np.abs(mirror - want).max()))
    a = chiral_rope_attention(q, k, v, th, chirality=np.array([-1.0, -1.0]))
    b_ = chiral_rope_attention(q, k, v, -th, chirality=np.array([1.0, 1.0]))
    c = chiral_rope_attention(q, k, v, th, chirality=np.array([1.0, 1.0]))
    errs.append(float(np.abs(a - b_).max()))
    assert max(errs) < 1e-12 and np.abs(a - c).max() > 1e-3, errs
    return max(errs)


def _check_relative_phase_invariance(rng):
    # Adding one constant to every token's phase leaves the output unchanged (only differences enter).
    q, k, v = random_qkv_heads(rng, 2, 2, 1, 5, 5, 4, 2)
    th = rng.uniform(-3, 3, (2, 5, 2))
    shift = rng.uniform(-5, 5, (2, 1, 2))
    a = chiral_rope_attention(q, k, v, th, chirality=np.array([1.0, -1.0]))
    b_ = chiral_rope_attention(q, k, v, th + shift, chirality=np.array([1.0, -1.0]))
    err = float(np.abs(a - b_).max())
    assert err < 1e-12, err
    return err


register(
    Mechanism(
        slug="chiral_rope", family="1-softmax", tier="T2",
        title="Chiral-RoPE (handedness-signed rotary encoding)",
        paper="GSF-chi graph transformer with Chiral-RoPE (stereogenic phase fields, handedness pseudoscalar), "
              "2025/26, catalogue seed [2-68] (abstract only; no arXiv id could be verified)",
        forward=chiral_rope_attention_forward, backward=chiral_rope_attention_backward, sample=_sample,
        reference=_reference, docs="softmax/positional-encodings.md#chiral-rope",
        checks={"chi_plus_one_is_rope": _check_chi_plus_one_is_rope,
                "reflection_inverts_rotation": _check_reflection_inverts_rotation,
                "relative_phase_invariance": _check_relative_phase_invariance},
    ),
)
