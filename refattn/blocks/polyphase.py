r"""Adaptive polyphase anchoring: a shift-equivariant (or invariant) ViT patch embedding.

Ding, Soselia, Armstrong, Su, Huang, "Reviving Shift Equivariance in Vision Transformers", arXiv
2306.07470 (2023) — the paper of the catalogue's seed abstract [2-47] and of the official code,
willding123/Shift-Equivariant-Vision-Transformers ``models/poly_utils.py`` (``PolyOrder``,
``PolyPatchEmbed``) @ c8cd2ef40b435d9615c790b2461694ba89a36be4. The catalogue cites Rojas-Gomez,
Lim, Do, Yeh, "Making Vision Transformers Truly Shift-Equivariant", CVPR 2024, arXiv 2305.16316,
a related work (adaptive tokenization, window attention and patch merging for Swin, SwinV2, CvT,
MViTv2) that is not the source of this algorithm or abstract.

Forward
-------
A stride-$P$ patch embedding sees only one of the $P_hP_w$ *polyphase components*
$X^{(a,b)} = X[:, :, a::P_h, b::P_w]$ at each patch corner, so shifting the image by less than a
patch changes the tokens. Anchoring picks the component of largest norm and rolls it to the
origin before the embedding:

$$(a^*, b^*) = \arg\max_{a,b}\ \|X^{(a,b)}\|_p\quad(\text{over all channels and patch-grid
positions; first maximum in row-major } (a, b)),$$

$$\tilde X = \mathrm{roll}(X, (-a^*, -b^*)),\qquad \tilde X_{i,j} = X_{(i+a^*)\bmod H,\ (j+b^*)\bmod W},$$

then the ViT patch embedding $t = \mathrm{Conv}_{P,\ \mathrm{stride}\ P}(\tilde X)$ flattened to tokens
``(B, N, D)`` (and the optional LayerNorm). A circular shift of $X$ permutes its polyphase
components (and circularly shifts each), so the same samples are anchored: the token grid of a
shifted image is a circular shift of the original token grid — shift *equivariance*, exactly.

With ``invariance=True`` (upstream's ``PolyOrder(..., invariance=True)``) the anchor is refined
to a whole patch too: among the tokens of the chosen component, the position $(g_h^*, g_w^*)$ of
largest per-token norm (over channels) is rolled to the origin as well, shift
$(a^* + g_h^*P_h,\ b^* + g_w^*P_w)$; the tokens are then *invariant* to circular shifts.

Backward (selection held fixed)
-------------------------------
The anchor is piecewise constant in $X$; with it fixed the map is linear: the conv VJP
(`refattn.nn.conv.conv_vjp`) gives $d\tilde X$, $dW$, $db$, and $dX = \mathrm{roll}(d\tilde X,
(a^*, b^*))$ (a roll's adjoint is the opposite roll). Upstream's ``PolyOrder.backward`` does the
same (a nearest-neighbour ``grid_sample`` by the opposite translation). The LayerNorm VJP comes
first when ``patch_norm``.

Conventions
-----------
``p`` (2: upstream always takes the $\ell_2$ norm, its ``norm`` argument is unused),
``invariance`` (False), ``patch_norm`` (False; upstream's ``norm_layer``, LayerNorm with ``eps``
1e-5), circular boundary (the anchoring roll is circular, as upstream's circular pad + crop).
``H`` and ``W`` must be multiples of the patch. Upstream reshapes with ``grid_size[0]`` on both
axes (square grids only) and casts to float32 inside ``PolyOrder``; refattn handles rectangular
grids and keeps the input's dtype. The paper's depthwise-conv positional encoding and its
anchoring inside window / subsampled attention (the same `polyphase_anchor` + roll with the
window as "patch") are not part of this record.

Agreement with upstream
-----------------------
Upstream's ``PolyOrder`` (run in a scratch script with ``use_gpu=False``; it casts to float32, so
the input is drawn float32-representable), patch 2 and 4 on square 3-channel images, with and
without ``invariance``: the anchored image is identical (0 error) and ``PolyOrder.backward``
(the opposite roll) equals ours exactly on float32 gradients. The full ``PolyPatchEmbed``
(``PolyOrder`` then the stride-$P$ projection in float64): tokens, ``proj.weight`` and
``proj.bias`` gradients agree to $1.1\times10^{-14}$ max abs ($4\times10^{-16}$ relative); the
``x`` gradient to $4.4\times10^{-7}$, which is upstream's backward casting the incoming gradient
to float32.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_params, check_positive, compute_dtype
from ..nn.conv import conv_apply, conv_vjp
from ..registry import Mechanism, Sample, register
from .core import norm_backward, norm_forward, norm_spec, param_dim

__all__ = ["polyphase_anchoring_forward", "polyphase_anchoring_backward", "polyphase_anchoring", "polyphase_anchor",
           "polyphase_norms"]

_PROJ, _NORM = "proj", "norm"


def polyphase_norms(x: np.ndarray, patch_size, p: float = 2.0) -> np.ndarray:
    r"""$\|X^{(a,b)}\|_p$ for every polyphase component: ``(B, P_h, P_w)`` from ``x (B, C, H, W)``."""
    ph, pw = patch_size
    b, c, h, w = x.shape
    comp = x.reshape(b, c, h // ph, ph, w // pw, pw)          # [b, c, gh, a, gw, b']
    return np.sum(np.abs(comp) ** p, axis=(1, 2, 4)) ** (1.0 / p)


def polyphase_anchor(x: np.ndarray, patch_size, *, p: float = 2.0, invariance: bool = False) -> np.ndarray:
    """The anchoring shifts ``(B, 2)`` (rows, columns): the arg-max polyphase component, plus the
    arg-max token of that component when ``invariance`` (module docstring). Unvalidated."""
    ph, pw = patch_size
    b = x.shape[0]
    idx = np.argmax(polyphase_norms(x, patch_size, p).reshape(b, -1), axis=1)
    shift = np.stack([idx // pw, idx % pw], axis=1)
    if invariance:
        gw = x.shape[3] // pw
        for i in range(b):
            comp = x[i, :, shift[i, 0]::ph, shift[i, 1]::pw]           # (C, gh, gw)
            j = int(np.argmax(np.sqrt(np.sum(comp * comp, axis=0)).reshape(-1)))
            shift[i] += (j // gw * ph, j % gw * pw)
    return shift


def _roll(x, shift, sign):
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        out[i] = np.roll(x[i], (sign * int(shift[i, 0]), sign * int(shift[i, 1])), axis=(1, 2))
    return out


def polyphase_anchoring_forward(x, params, *, invariance: bool = False, p: float = 2.0, patch_norm: bool = False,
                                eps: float = 1e-5):
    r"""Anchored patch embedding (upstream ``PolyPatchEmbed``; module docstring).

    Parameters
    ----------
    x : array (B, C, H, W)
        ``H``, ``W`` multiples of the patch size.
    params : dict
        ``"proj.weight"`` ``(D, C, P_h, P_w)`` (``nn.Conv2d`` layout, as is; the patch size is its
        kernel), optional ``"proj.bias"`` ``(D,)``; ``"norm.weight"``/``"norm.bias"`` ``(D,)`` when
        ``patch_norm``.
    invariance : bool
        Also anchor the patch grid (shift invariance instead of equivariance).
    p : float
        The norm that ranks the polyphase components (2).
    patch_norm : bool
        LayerNorm on the tokens (upstream ``norm_layer``).
    eps : float

    Returns
    -------
    tokens, cache
        ``tokens (B, N, D)``, row-major over the patch grid of the anchored image; the cache holds
        the anchoring ``shift (B, 2)``, held fixed by the backward.
    """
    x = as_float(x, "x", ndim=4)
    if not isinstance(invariance, (bool, np.bool_)):
        raise TypeError(f"invariance must be a bool; got {type(invariance).__name__}")
    if not isinstance(patch_norm, (bool, np.bool_)):
        raise TypeError(f"patch_norm must be a bool; got {type(patch_norm).__name__}")
    p = check_positive(p, "p")
    eps = check_positive(eps, "eps", allow_zero=True)
    param_dim(params, f"{_PROJ}.weight", 0, where="polyphase_anchoring", shape=("D", "C", "P_h", "P_w"))
    w = as_float(params[f"{_PROJ}.weight"], f"{_PROJ}.weight", ndim=4)
    d = w.shape[0]
    ph, pw = w.shape[2:]
    if x.shape[2] % ph or x.shape[3] % pw:
        raise ValueError(f"x spatial size {x.shape[2:]} must be a multiple of the patch size {(ph, pw)} "
                         f"(from {_PROJ}.weight)")
    spec = {f"{_PROJ}.weight": (d, x.shape[1], ph, pw), f"{_PROJ}.bias": (d,)}
    if patch_norm:
        spec.update(norm_spec(_NORM, d))
    own = check_params(params, spec, optional=(f"{_PROJ}.bias",), where="polyphase_anchoring")
    dt = compute_dtype(x, *own.values())
    x, own = x.astype(dt, copy=False), cast_all(dt, own)
    shift = polyphase_anchor(x, (ph, pw), p=p, invariance=bool(invariance))
    xa = _roll(x, shift, -1)
    y = conv_apply(xa, own[f"{_PROJ}.weight"], own.get(f"{_PROJ}.bias"), stride=(ph, pw))
    grid = y.shape[2:]
    t = y.reshape(y.shape[0], d, -1).transpose(0, 2, 1)
    t, cn = norm_forward(own, _NORM, t, eps=eps) if patch_norm else (t, None)
    cache = {"xa": xa, "shift": shift, "params": own, "cn": cn, "grid": grid, "out_shape": t.shape, "dtype": dt}
    return t, cache


def polyphase_anchoring_backward(dout, cache):
    r"""Gradients of `polyphase_anchoring_forward` with the anchor fixed: LayerNorm VJP, conv VJP,
    then the opposite roll (module docstring)."""
    g = as_dout(dout, cache["out_shape"], cache["dtype"])
    own = cache["params"]
    grads = {}
    if cache["cn"] is not None:
        g = norm_backward(grads, own, g, cache["cn"])
    b, n, d = g.shape
    dy = g.transpose(0, 2, 1).reshape((b, d) + cache["grid"])
    w = own[f"{_PROJ}.weight"]
    r = conv_vjp(dy, cache["xa"], w, stride=w.shape[2:], has_bias=f"{_PROJ}.bias" in own)
    grads["x"] = _roll(r["x"], cache["shift"], 1)
    grads[f"{_PROJ}.weight"] = r["weight"]
    if "bias" in r:
        grads[f"{_PROJ}.bias"] = r["bias"]
    return grads


def polyphase_anchoring(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of `polyphase_anchoring_forward`."""
    return polyphase_anchoring_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _separated_image(rng, shape, patch, invariance):
    """An image whose top polyphase component (and, for ``invariance``, its top token) wins by a
    clear margin: no arg-max flips under a finite-difference step."""
    x = rng.standard_normal(shape)
    ph, pw = patch
    for i in range(shape[0]):
        a, b = int(rng.integers(0, ph)), int(rng.integers(0, pw))
        x[i, :, a::ph, b::pw] *= 1.6
        if invariance:
            gh, gw = shape[2] // ph, shape[3] // pw
            r, c = int(rng.integers(0, gh)), int(rng.integers(0, gw))
            x[i, :, a + r * ph, b + c * pw] = 3.0 * np.sign(x[i, :, a + r * ph, b + c * pw] + 1e-3)
    return x


def _sample(rng, size):
    inv = bool(rng.random() < 0.5)
    patch_norm = bool(rng.random() < 0.3)
    if size == "tiny":
        c, d, patch, hw = 1, 2, (2, 2), (4, 4)
    else:
        c, d, patch, hw = 3, 6, (2, 3), (6, 9)
    x = _separated_image(rng, (2, c) + hw, patch, inv)
    params = {f"{_PROJ}.weight": rng.standard_normal((d, c) + patch) / np.sqrt(c * patch[0] * patch[1]),
              f"{_PROJ}.bias": 0.2 * rng.standard_normal(d)}
    if patch_norm:
        params[f"{_NORM}.weight"] = 1.0 + 0.2 * rng.standard_normal(d)
        params[f"{_NORM}.bias"] = 0.1 * rng.standard_normal(d)
    return Sample(inputs={"x": x}, params=params, config={"invariance": inv, "patch_norm": patch_norm})


def _reference(x, params, invariance=False, p=2.0, patch_norm=False, eps=1e-5):
    # Brute force: every polyphase component's norm by explicit slicing, the first arg-max, np.roll,
    # then every patch's dot product with the kernel.
    w = params[f"{_PROJ}.weight"]
    d, c, ph, pw = w.shape
    out = []
    for i in range(x.shape[0]):
        best, shift = -1.0, (0, 0)
        for a in range(ph):
            for b in range(pw):
                v = float(np.sum(np.abs(x[i, :, a::ph, b::pw]) ** p) ** (1 / p))
                if v > best:
                    best, shift = v, (a, b)
        if invariance:
            comp = x[i, :, shift[0]::ph, shift[1]::pw]
            best_t, tok = -1.0, (0, 0)
            for r in range(comp.shape[1]):
                for s in range(comp.shape[2]):
                    v = float(np.linalg.norm(comp[:, r, s]))
                    if v > best_t:
                        best_t, tok = v, (r, s)
            shift = (shift[0] + tok[0] * ph, shift[1] + tok[1] * pw)
        xa = np.roll(x[i], (-shift[0], -shift[1]), axis=(1, 2))
        toks = []
        for r in range(0, x.shape[2], ph):
            for s in range(0, x.shape[3], pw):
                toks.append(np.tensordot(w, xa[:, r:r + ph, s:s + pw], axes=3) + params.get(f"{_PROJ}.bias", 0.0))
        out.append(np.stack(toks))
    t = np.stack(out)
    if patch_norm:
        mu = t.mean(-1, keepdims=True)
        t = (t - mu) / np.sqrt(((t - mu) ** 2).mean(-1, keepdims=True) + eps) * params[f"{_NORM}.weight"] \
            + params[f"{_NORM}.bias"]
    return t


def _token_roll_match(a, b, grid):
    """Whether token grid ``b`` is a circular shift of ``a`` (both (N, D)), searched exhaustively."""
    ga, gb = a.reshape(grid + (-1,)), b.reshape(grid + (-1,))
    return min(float(np.abs(np.roll(ga, (r, s), axis=(0, 1)) - gb).max())
               for r in range(grid[0]) for s in range(grid[1]))


def _check_shift_equivariance(rng):
    # Every circular shift of the image gives a circular shift of the token grid (100% consistency).
    x = _separated_image(rng, (2, 3, 8, 6), (2, 3), False)
    params = {"proj.weight": rng.standard_normal((4, 3, 2, 3)), "proj.bias": rng.standard_normal(4)}
    t0 = polyphase_anchoring(x, params)
    err = 0.0
    for dy in range(8):
        for dx in range(6):
            t = polyphase_anchoring(np.roll(x, (dy, dx), axis=(2, 3)), params)
            err = max(err, max(_token_roll_match(t0[i], t[i], (4, 2)) for i in range(2)))
    assert err < 1e-12, f"anchored patch embedding is not shift-equivariant (err {err})"
    return err


def _check_shift_invariance(rng):
    # invariance=True: the tokens do not change at all under circular shifts.
    x = _separated_image(rng, (2, 2, 6, 6), (3, 3), True)
    params = {"proj.weight": rng.standard_normal((3, 2, 3, 3))}
    t0 = polyphase_anchoring(x, params, invariance=True)
    err = max(float(np.abs(polyphase_anchoring(np.roll(x, (dy, dx), axis=(2, 3)), params, invariance=True)
                           - t0).max()) for dy in range(6) for dx in range(6))
    assert err < 1e-12, f"invariant anchoring changes under a shift (err {err})"
    return err


def _check_plain_embedding_is_not_equivariant(rng):
    # Without anchoring (a plain stride-P conv) a one-pixel shift is not a token permutation: the
    # check above can fail, so it tests something.
    x = _separated_image(rng, (1, 2, 6, 6), (2, 2), False)
    w = rng.standard_normal((3, 2, 2, 2))
    t0 = conv_apply(x, w, stride=2).reshape(1, 3, -1).transpose(0, 2, 1)
    t1 = conv_apply(np.roll(x, (0, 1), axis=(2, 3)), w, stride=2).reshape(1, 3, -1).transpose(0, 2, 1)
    gap = _token_roll_match(t0[0], t1[0], (3, 3))
    assert gap > 1e-3, "a plain patch embedding looked shift-equivariant; the equivariance check is vacuous"
    return 0.0


register(
    Mechanism(
        slug="polyphase_anchoring", family="5-building-blocks", tier="T2",
        official_code="willding123/Shift-Equivariant-Vision-Transformers models/poly_utils.py@c8cd2ef",
        title="Adaptive polyphase anchoring: roll the max-norm polyphase component to the origin before patch embedding",
        paper="Ding, Soselia, Armstrong, Su, Huang, Reviving Shift Equivariance in Vision Transformers, "
              "arXiv 2306.07470 (2023) (the catalogue's citation, Rojas-Gomez et al. CVPR 2024, is a related work)",
        forward=polyphase_anchoring_forward, backward=polyphase_anchoring_backward, sample=_sample,
        reference=_reference, docs="blocks/vision-token-mixers.md#polyphase-anchoring",
        checks={"shift_equivariance": _check_shift_equivariance, "shift_invariance": _check_shift_invariance,
                "plain_embedding_is_not_equivariant": _check_plain_embedding_is_not_equivariant},
        notes="the anchor (an arg-max) is held fixed in the backward; the sampler makes the top polyphase "
              "component (and token) win by a clear margin",
    ),
)
