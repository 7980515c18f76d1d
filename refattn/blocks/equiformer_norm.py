r"""EquiformerV2 separable layer norm over spherical-harmonic degrees, and its attention re-normalisation.

Liao, Wood, Das, Smidt, "EquiformerV2: Improved Equivariant Transformer for Scaling to
Higher-Degree Representations", ICLR 2024, arXiv 2306.12059. Upstream:
atomicarchitects/equiformer_v2 ``nets/equiformer_v2/layer_norm.py`` (the three norms) and
``nets/equiformer_v2/transformer_block.py`` (``SO2EquivariantGraphAttention``: ``alpha_norm``,
``alpha_act``, ``alpha_dot``) with ``activation.py`` (``SmoothLeakyReLU``) @
cf45ee209abdceaa606c9a8dce50c9c753d470b2. One module: both are normalisations of irreps features
sharing one derivation (a scale $r = (S+\epsilon)^{-1/2}$ of a weighted mean square).

Separable layer norm
--------------------
Features $x\in\mathbb R^{(L+1)^2\times C}$ (rows: spherical-harmonic components $(l, m)$, row
$l^2 + l + m$; columns: channels). Degree-0 and degree>0 parts are normalised separately
(``norm_type="layer_norm_sh"``, the paper's SLN, upstream ``EquivariantLayerNormArraySphericalHarmonics``):

$$y_0 = \mathrm{LN}_C(x_0)\ \ (\texttt{norm\_l0.weight}, \texttt{.bias}),\qquad
y_{lm,c} = \frac{x_{lm,c}}{\sqrt{S + \epsilon}}\,\gamma_{l,c}\ (l>0),\qquad
S = \frac1C\sum_c\sum_{l>0,m}\beta_{l}\,x_{lm,c}^2,$$

one $S$ for all degrees $l>0$ jointly (no centring), so the relative size of degrees is kept.
$\beta_l = 1/((2l+1)L)$ with ``std_balance_degrees`` (upstream default: every degree weighs
equally), $1/((L+1)^2-1)$ for a plain component mean, $1$ for ``normalization="norm"``.
Every row of one degree shares $\gamma_{l,c}$ (``affine_weight``, ``(L, C)``), so the map commutes with
any rotation acting by Wigner-D matrices within each degree: it is equivariant.

``norm_type="rms_norm_sh"`` (``EquivariantRMSNormArraySphericalHarmonicsV2``, the OC20 model
default) centres the degree-0 row over channels, then uses one $S$ over all degrees $l\ge0$
($\beta_l = 1/((2l+1)(L+1))$), ``affine_weight`` ``(L+1, C)`` and ``affine_bias`` on row 0.
``norm_type="layer_norm"`` (``EquivariantLayerNormArray``) normalises each degree on its own
($\beta = 1/(2l+1)$ or 1; degree 0 centred), ``affine_weight (L+1, C)``, ``affine_bias``.

Attention re-normalisation
--------------------------
The attention logits of an edge come from its invariant features $a\in\mathbb R^{H\times A}$:
$\alpha_h = \sum_k \mathrm{SLReLU}(\mathrm{LN}_A(a_h))_k\,d_{hk}$ with ``alpha_norm`` a LayerNorm
over the $A$ channels of each head (the "re-normalisation"; ``use_attn_renorm=False`` skips it),
$\mathrm{SLReLU}(z) = \tfrac{1+\nu}2z + \tfrac{1-\nu}2z(2\sigma(z)-1)$, $\nu = 0.2$, and
``alpha_dot`` $d\in\mathbb R^{H\times A}$; then a softmax over the incoming edges of each node.
Upstream's edge list and ``torch_geometric.utils.softmax`` become here a dense neighbour axis
``(..., K, H, A)`` with the softmax over $K$ (equal for a graph whose nodes all have $K$ edges;
reconstruction of the layout only). `equiformer_attention_weights_forward` returns $\mathrm{softmax}_K\alpha$.

Backward
--------
For a group of rows with scale $r = (S+\epsilon)^{-1/2}$, $S = \frac1C\sum_{i,c}\beta_iz_{ic}^2$,
$y_{ic} = z_{ic}\,r\,\gamma_{ic}$ and $g = \partial L/\partial y$:

$$dz_{ic} = r\,g_{ic}\gamma_{ic} - \frac{r^3}{C}\,\beta_i z_{ic}\sum_{j,c'}g_{jc'}\gamma_{jc'}z_{jc'},
\qquad d\gamma_{l,c} = \sum_{i\in l}g_{ic}\,z_{ic}\,r,$$

and a centred row adds $dx_0 = dz_0 - \mathrm{mean}_c(dz_0)$ (the LayerNorm VJP). The attention
weights chain the softmax VJP ($d\alpha = p\odot(dp - \sum_K p\,dp)$), the dot product, the
SLReLU derivative $\tfrac{1+\nu}2 + \tfrac{1-\nu}2\,(2\sigma(z)-1 + 2z\sigma(z)(1-\sigma(z)))$ and
the LayerNorm VJP of `refattn.nn.norms`.

Agreement with upstream
-----------------------
The three upstream norm modules (``layer_norm.py`` imports only torch and runs as is) in float64
on CPU, $L\in\{1, 2, 3\}$, both normalisations and balance settings: output and the gradients of
the input and every affine parameter agree to $5.3\times10^{-16}$ relative. The attention path
(``alpha_norm`` = ``nn.LayerNorm``, upstream ``SmoothLeakyReLU``, the ``einsum`` with
``alpha_dot`` and a softmax over the edges of each node, transcribed from ``transformer_block.py``,
whose module needs ``torch_geometric`` and the eSCN SO(2) convolutions) agrees to
$7.9\times10^{-16}$ relative, with and without the re-normalisation.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_choice, check_params, check_positive, compute_dtype
from ..nn.activations import sigmoid
from ..nn.norms import normalize_backward, normalize_forward
from ..nn.softmax import softmax_lse, softmax_vjp
from ..registry import Mechanism, Sample, register

__all__ = ["separable_layer_norm_forward", "separable_layer_norm_backward", "separable_layer_norm",
           "equiformer_attention_weights_forward", "equiformer_attention_weights_backward",
           "degree_index", "SLN_NORM_TYPES"]

SLN_NORM_TYPES = ("layer_norm_sh", "rms_norm_sh", "layer_norm")


def degree_index(lmax: int) -> np.ndarray:
    """The degree $l$ of each of the $(L+1)^2$ rows (upstream ``get_l_to_all_m_expand_index``)."""
    return np.concatenate([np.full(2 * l + 1, l) for l in range(lmax + 1)])


def _groups(lmax, norm_type, normalization, balance):
    """Rows of each normalisation group and their weights beta (module docstring)."""
    deg = degree_index(lmax)
    if norm_type == "layer_norm":
        return [(np.arange(l * l, (l + 1) ** 2), np.full(2 * l + 1, 1.0 / (2 * l + 1) if normalization == "component"
                                                        else 1.0)) for l in range(lmax + 1)]
    first = 0 if norm_type == "rms_norm_sh" else 1
    rows = np.arange(first, (lmax + 1) ** 2)
    if normalization == "norm":
        beta = np.ones(rows.size)
    elif balance:
        beta = 1.0 / ((2 * deg[rows] + 1) * (lmax + 1 - first))
    else:
        beta = np.full(rows.size, 1.0 / rows.size)
    groups = [(rows, beta)] if rows.size else []
    return ([(np.arange(1), np.ones(1))] if first else []) + groups


def separable_layer_norm_forward(x, params, *, norm_type: str = "layer_norm_sh", normalization: str = "component",
                                 std_balance_degrees: bool = True, eps: float = 1e-5):
    r"""EquiformerV2's equivariant layer norm of ``x (..., (L+1)^2, C)`` (module docstring).

    Parameters
    ----------
    x : array (..., (L+1)^2, C)
        Irreps features: rows are the spherical-harmonic components, $L$ is read from the shape.
    params : dict
        ``layer_norm_sh``: ``"norm_l0.weight" (C,)``, ``"norm_l0.bias" (C,)``, ``"affine_weight" (L, C)``
        (absent for $L = 0$). ``rms_norm_sh`` and ``layer_norm``: ``"affine_weight" (L+1, C)``,
        ``"affine_bias" (C,)``.
    norm_type : {"layer_norm_sh", "rms_norm_sh", "layer_norm"}
    normalization : {"component", "norm"}
    std_balance_degrees : bool
        Weigh every degree equally in the shared mean square (upstream default True).
    eps : float

    Returns
    -------
    y, cache
        ``y`` of the shape of ``x``.
    """
    x = as_float(x, "x", min_ndim=2)
    check_choice(norm_type, "norm_type", SLN_NORM_TYPES)
    check_choice(normalization, "normalization", ("component", "norm"))
    if not isinstance(std_balance_degrees, (bool, np.bool_)):
        raise TypeError(f"std_balance_degrees must be a bool; got {type(std_balance_degrees).__name__}")
    if normalization == "norm" and std_balance_degrees and norm_type == "rms_norm_sh":
        raise ValueError("normalization='norm' needs std_balance_degrees=False for rms_norm_sh (upstream asserts it)")
    eps = check_positive(eps, "eps", allow_zero=True)
    rows, c = x.shape[-2:]
    lmax = int(round(np.sqrt(rows))) - 1
    if (lmax + 1) ** 2 != rows:
        raise ValueError(f"x must have (L+1)^2 rows on axis -2 (spherical-harmonic components); got {rows}")
    if norm_type == "layer_norm_sh":
        spec = {"norm_l0.weight": (c,), "norm_l0.bias": (c,)}
        if lmax:
            spec["affine_weight"] = (lmax, c)
    else:
        spec = {"affine_weight": (lmax + 1, c), "affine_bias": (c,)}
    p = check_params(params, spec, where=f"separable_layer_norm ({norm_type})")
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    deg = degree_index(lmax)
    if norm_type == "layer_norm_sh":
        w_rows = np.concatenate([p["norm_l0.weight"][None], p["affine_weight"][deg[1:] - 1]]) if lmax \
            else p["norm_l0.weight"][None]
        bias = p["norm_l0.bias"]
    else:
        w_rows, bias = p["affine_weight"][deg], p["affine_bias"]
    z = x.copy()
    z[..., 0, :] = x[..., 0, :] - x[..., 0, :].mean(axis=-1, keepdims=True)
    y = np.empty_like(z)
    rs = []
    for rows_g, beta in _groups(lmax, norm_type, normalization, std_balance_degrees):
        zg = z[..., rows_g, :]
        s = np.sum(beta[:, None] * zg * zg, axis=(-2, -1), keepdims=True) / c
        r = 1.0 / np.sqrt(s + eps)
        y[..., rows_g, :] = zg * r * w_rows[rows_g]
        rs.append(r)
    y[..., 0, :] += bias
    cache = {"z": z, "rs": rs, "w_rows": w_rows, "deg": deg, "lmax": lmax, "norm_type": norm_type,
             "groups": _groups(lmax, norm_type, normalization, std_balance_degrees), "shape": x.shape, "dtype": dt}
    return y, cache


def separable_layer_norm_backward(dout, cache):
    r"""Gradients of `separable_layer_norm_forward` for ``x`` and its affine parameters."""
    z, rs, w_rows, deg, lmax = (cache[k] for k in ("z", "rs", "w_rows", "deg", "lmax"))
    g = as_dout(dout, cache["shape"], cache["dtype"])
    c = z.shape[-1]
    lead = tuple(range(g.ndim - 2))
    dz = np.empty_like(z)
    dw_rows = np.zeros_like(w_rows)
    for (rows_g, beta), r in zip(cache["groups"], rs):
        zg, gg = z[..., rows_g, :], g[..., rows_g, :] * w_rows[rows_g]
        t = np.sum(gg * zg, axis=(-2, -1), keepdims=True)
        dz[..., rows_g, :] = r * gg - (r**3 / c) * beta[:, None] * zg * t
        dw_rows[rows_g] = np.sum(g[..., rows_g, :] * zg * r, axis=lead)
    dz[..., 0, :] -= dz[..., 0, :].mean(axis=-1, keepdims=True)
    db = np.sum(g[..., 0, :], axis=lead)
    if cache["norm_type"] == "layer_norm_sh":
        grads = {"x": dz, "norm_l0.weight": dw_rows[0], "norm_l0.bias": db}
        if lmax:
            grads["affine_weight"] = np.stack([dw_rows[deg == l].sum(axis=0) for l in range(1, lmax + 1)])
        return grads
    return {"x": dz, "affine_weight": np.stack([dw_rows[deg == l].sum(axis=0) for l in range(lmax + 1)]),
            "affine_bias": db}


def separable_layer_norm(x, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of `separable_layer_norm_forward`."""
    return separable_layer_norm_forward(x, params, **config)[0]


def equiformer_attention_weights_forward(x_alpha, params, *, use_attn_renorm: bool = True,
                                         negative_slope: float = 0.2, eps: float = 1e-5):
    r"""Attention weights of an EquiformerV2 node from its ``K`` incoming edges (module docstring).

    Parameters
    ----------
    x_alpha : array (..., K, H, A)
        The invariant per-edge, per-head features (upstream ``x_0_alpha``).
    params : dict
        ``"alpha_dot" (H, A)`` and, with ``use_attn_renorm``, ``"alpha_norm.weight"/".bias" (A,)``.
    use_attn_renorm : bool
        Apply the LayerNorm over the A channels first (upstream default True).
    negative_slope : float
        $\nu$ of the smooth leaky ReLU (0.2).
    eps : float
        LayerNorm epsilon (``nn.LayerNorm`` default 1e-5).

    Returns
    -------
    p, cache
        ``p (..., K, H)``: softmax over the K edges of the logits.
    """
    x = as_float(x_alpha, "x_alpha", min_ndim=3)
    if not isinstance(use_attn_renorm, (bool, np.bool_)):
        raise TypeError(f"use_attn_renorm must be a bool; got {type(use_attn_renorm).__name__}")
    nu = check_positive(negative_slope, "negative_slope", allow_zero=True)
    eps = check_positive(eps, "eps", allow_zero=True)
    h, a = x.shape[-2:]
    spec = {"alpha_dot": (h, a)}
    if use_attn_renorm:
        spec.update({"alpha_norm.weight": (a,), "alpha_norm.bias": (a,)})
    p = check_params(params, spec, where="equiformer_attention_weights")
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    if use_attn_renorm:
        xhat, stats = normalize_forward(x, (x.ndim - 1,), eps)
        zin = xhat * p["alpha_norm.weight"] + p["alpha_norm.bias"]
    else:
        xhat, stats, zin = None, None, x
    sg = sigmoid(zin)
    act = 0.5 * (1 + nu) * zin + 0.5 * (1 - nu) * zin * (2 * sg - 1)
    logits = np.sum(act * p["alpha_dot"], axis=-1)
    probs, _ = softmax_lse(logits, axis=logits.ndim - 2)
    cache = {"x": x, "p": p, "xhat": xhat, "stats": stats, "zin": zin, "sg": sg, "act": act,
             "probs": probs, "nu": nu, "renorm": bool(use_attn_renorm)}
    return probs.copy(), cache


def equiformer_attention_weights_backward(dout, cache):
    r"""Gradients of `equiformer_attention_weights_forward` for ``x_alpha`` and its parameters."""
    x, p, probs, nu = cache["x"], cache["p"], cache["probs"], cache["nu"]
    g = as_dout(dout, probs.shape, x.dtype)
    dlogits = softmax_vjp(probs, g, axis=probs.ndim - 2)
    lead = tuple(range(x.ndim - 2))
    grads = {"alpha_dot": np.sum(dlogits[..., None] * cache["act"], axis=lead)}
    zin, sg = cache["zin"], cache["sg"]
    dact = 0.5 * (1 + nu) + 0.5 * (1 - nu) * (2 * sg - 1 + 2 * zin * sg * (1 - sg))
    dz = dlogits[..., None] * p["alpha_dot"] * dact
    if cache["renorm"]:
        every = tuple(range(x.ndim - 1))
        grads["alpha_norm.weight"] = np.sum(dz * cache["xhat"], axis=every)
        grads["alpha_norm.bias"] = np.sum(dz, axis=every)
        dz = normalize_backward(dz * p["alpha_norm.weight"], cache["xhat"], cache["stats"])
    grads["x_alpha"] = dz
    return grads


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _norm_params(rng, lmax, c, norm_type):
    if norm_type == "layer_norm_sh":
        p = {"norm_l0.weight": 1.0 + 0.3 * rng.standard_normal(c), "norm_l0.bias": 0.2 * rng.standard_normal(c)}
        if lmax:
            p["affine_weight"] = 1.0 + 0.3 * rng.standard_normal((lmax, c))
        return p
    return {"affine_weight": 1.0 + 0.3 * rng.standard_normal((lmax + 1, c)), "affine_bias": 0.2 * rng.standard_normal(c)}


def _sample(rng, size):
    norm_type = str(rng.choice(SLN_NORM_TYPES))
    lmax, c = (1, 2) if size == "tiny" else (int(rng.integers(2, 4)), 5)
    cfg = {"norm_type": norm_type}
    if rng.random() < 0.3:
        cfg.update(normalization="norm", std_balance_degrees=False)
    elif rng.random() < 0.3:
        cfg["std_balance_degrees"] = False
    x = rng.standard_normal((2, (lmax + 1) ** 2, c))
    return Sample(inputs={"x": x}, params=_norm_params(rng, lmax, c, norm_type), config=cfg)


def _reference(x, params, norm_type="layer_norm_sh", normalization="component", std_balance_degrees=True, eps=1e-5):
    # The upstream loops written out degree by degree (slices l^2 : (l+1)^2).
    rows, c = x.shape[-2:]
    lmax = int(round(np.sqrt(rows))) - 1
    out = np.empty_like(x)
    x0 = x[..., :1, :] - x[..., :1, :].mean(-1, keepdims=True)

    def sq(f, l, count):
        return (f**2).sum(-2, keepdims=True) if normalization == "norm" else (f**2).sum(-2, keepdims=True) / count

    if norm_type == "layer_norm":
        for l in range(lmax + 1):
            f = x0 if l == 0 else x[..., l * l:(l + 1) ** 2, :]
            r = 1 / np.sqrt(sq(f, l, 2 * l + 1).mean(-1, keepdims=True) + eps)
            out[..., l * l:(l + 1) ** 2, :] = f * r * params["affine_weight"][l]
        out[..., 0, :] += params["affine_bias"]
        return out
    if norm_type == "layer_norm_sh":
        r0 = 1 / np.sqrt((x0**2).mean(-1, keepdims=True) + eps)
        out[..., :1, :] = x0 * r0 * params["norm_l0.weight"] + params["norm_l0.bias"]
        first, feats = 1, x[..., 1:, :]
    else:
        first, feats = 0, np.concatenate([x0, x[..., 1:, :]], axis=-2)
    tot = 0.0
    for l in range(first, lmax + 1):
        f = feats[..., l * l - first:(l + 1) ** 2 - first, :]
        if normalization == "norm":
            tot = tot + (f**2).sum(-2, keepdims=True)
        elif std_balance_degrees:
            tot = tot + (f**2).sum(-2, keepdims=True) / ((2 * l + 1) * (lmax + 1 - first))
        else:
            tot = tot + (f**2).sum(-2, keepdims=True) / ((lmax + 1) ** 2 - first)
    if lmax + 1 > first:
        r = 1 / np.sqrt(tot.mean(-1, keepdims=True) + eps)
        for l in range(first, lmax + 1):
            w = params["affine_weight"][l - first]
            out[..., l * l:(l + 1) ** 2, :] = feats[..., l * l - first:(l + 1) ** 2 - first, :] * r * w
    if norm_type == "rms_norm_sh":
        out[..., 0, :] += params["affine_bias"]
    return out


def _real_wigner_d(rot: np.ndarray, lmax: int, rng) -> np.ndarray:
    """Block-diagonal real Wigner-D of ``rot`` in an orthonormal real spherical-harmonic basis,
    fitted from $Y(R^{-1}p) = D\\,Y(p)$ on random points (exact up to rounding)."""
    from scipy.special import sph_harm_y

    pts = rng.standard_normal((64, 3))
    pts /= np.linalg.norm(pts, axis=1, keepdims=True)

    def ylm(q):
        theta, phi = np.arccos(np.clip(q[:, 2], -1, 1)), np.arctan2(q[:, 1], q[:, 0])
        cols = []
        for l in range(lmax + 1):
            for m in range(-l, l + 1):
                y = sph_harm_y(l, abs(m), theta, phi)
                cols.append(np.sqrt(2) * (-1) ** m * (y.imag if m < 0 else y.real) if m else y.real)
        return np.stack(cols, axis=1)

    a, b = ylm(pts), ylm(pts @ rot)  # rows p_k; (R^T p_k) = p_k R for row vectors
    d = np.linalg.lstsq(a, b, rcond=None)[0].T
    return d


def _rotation(rng):
    q, r = np.linalg.qr(rng.standard_normal((3, 3)))
    q = q * np.sign(np.diag(r))
    return q if np.linalg.det(q) > 0 else -q


def _check_rotation_equivariance(rng):
    # N(D x) = D N(x) for the real Wigner-D of a random rotation, for every norm type; D is
    # checked to be orthogonal and block diagonal by degree first.
    lmax, c = 3, 4
    d = _real_wigner_d(_rotation(rng), lmax, rng)
    deg = degree_index(lmax)
    assert np.abs(d @ d.T - np.eye(d.shape[0])).max() < 1e-10
    assert np.abs(d[deg[:, None] != deg[None, :]]).max() < 1e-10
    err = 0.0
    x = rng.standard_normal((2, (lmax + 1) ** 2, c))
    for nt in SLN_NORM_TYPES:
        p = _norm_params(rng, lmax, c, nt)
        y = separable_layer_norm(x, p, norm_type=nt)
        yr = separable_layer_norm(np.einsum("ij,bjc->bic", d, x), p, norm_type=nt)
        err = max(err, float(np.abs(yr - np.einsum("ij,bjc->bic", d, y)).max()))
    assert err < 1e-10, f"separable layer norm is not rotation equivariant: {err}"
    return err


def _check_degree0_is_layernorm(rng):
    # L = 0 (scalars only): layer_norm_sh is nn.LayerNorm over the channels.
    from ..nn.norms import layer_norm

    x = rng.standard_normal((3, 1, 6))
    p = _norm_params(rng, 0, 6, "layer_norm_sh")
    y = separable_layer_norm(x, p)
    err = float(np.abs(y - layer_norm(x, {"weight": p["norm_l0.weight"], "bias": p["norm_l0.bias"]})).max())
    assert err < 1e-14, f"L = 0 separable norm is not LayerNorm: {err}"
    return err


def _check_degree_ratio_kept(rng):
    # SLN divides all degrees > 0 by one RMS: with unit affine weights the ratio of the norms of
    # two degrees is unchanged (a per-degree norm would equalise them).
    x = rng.standard_normal((2, 9, 3))
    x[..., 4:, :] *= 10.0
    p = {"norm_l0.weight": np.ones(3), "norm_l0.bias": np.zeros(3), "affine_weight": np.ones((2, 3))}
    y = separable_layer_norm(x, p)
    ratio_in = np.linalg.norm(x[..., 4:, :], axis=(-2, -1)) / np.linalg.norm(x[..., 1:4, :], axis=(-2, -1))
    ratio_out = np.linalg.norm(y[..., 4:, :], axis=(-2, -1)) / np.linalg.norm(y[..., 1:4, :], axis=(-2, -1))
    err = float(np.abs(ratio_in - ratio_out).max() / ratio_in.max())
    assert err < 1e-14, f"SLN changed the ratio between degrees: {err}"
    return err


def _sample_attention(rng, size="tiny", renorm=True):
    k, h, a = (3, 2, 3) if size == "tiny" else (5, 3, 6)
    p = {"alpha_dot": rng.uniform(-1, 1, (h, a)) / np.sqrt(a) * 3}
    if renorm:
        p.update({"alpha_norm.weight": 1.0 + 0.3 * rng.standard_normal(a), "alpha_norm.bias": 0.2 * rng.standard_normal(a)})
    return Sample(inputs={"x_alpha": rng.standard_normal((2, k, h, a))}, params=p, config={"use_attn_renorm": renorm})


def _check_attention_renorm_gradients(rng):
    # Finite-difference check of the attention re-normalisation path (both settings) and its
    # softmax: each node's weights over its K edges sum to one.
    from ..testing import gradcheck

    err = 0.0
    for renorm in (True, False):
        s = _sample_attention(rng, "tiny", renorm)
        gradcheck(equiformer_attention_weights_forward, equiformer_attention_weights_backward, s)
        p, _ = equiformer_attention_weights_forward(**s.inputs, params=s.params, **s.config)
        err = max(err, float(np.abs(p.sum(axis=-2) - 1.0).max()))
    assert err < 1e-14, f"attention weights do not sum to one over the edges: {err}"
    return err


register(
    Mechanism(
        slug="equiformerv2_separable_layernorm", family="5-building-blocks", tier="T2",
        title="EquiformerV2 separable layer norm over spherical-harmonic degrees (+ RMS-SH and per-degree "
              "variants) and the attention re-normalisation",
        paper="Liao, Wood, Das, Smidt, EquiformerV2: Improved Equivariant Transformer for Scaling to "
              "Higher-Degree Representations, ICLR 2024, arXiv 2306.12059",
        forward=separable_layer_norm_forward, backward=separable_layer_norm_backward, sample=_sample,
        reference=_reference, docs="blocks/norms-activations-init.md#equiformerv2-separable-layer-norm",
        checks={"rotation_equivariance": _check_rotation_equivariance,
                "degree0_is_layernorm": _check_degree0_is_layernorm,
                "degree_ratio_kept": _check_degree_ratio_kept,
                "attention_renorm_gradients": _check_attention_renorm_gradients},
    ),
)
