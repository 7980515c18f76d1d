r"""Shaped attention: $A = \beta\,\mathrm{softmax}(S) + \alpha I - \gamma C$ (He & Hofmann; Noci et al.).

A relative of differential attention: a softmax map centred by subtracting a fixed
"common-mode" map $C$ (the softmax of all-equal logits under the causal mask, or uniform), plus
a scaled identity, per head:

$$A_h = \beta_h\,\mathrm{softmax}(s\,Q_hK_h^\top + M) + \alpha_h I - \gamma_h C,\qquad O_h = A_h V_h .$$

Backward: $dA = GV^\top$, $dV = A^\top G$, $d\beta_h = \langle dA_h, P_h\rangle$,
$d\alpha_h = \langle dA_h, I\rangle$, $d\gamma_h = -\langle dA_h, C\rangle$, then the softmax VJP
of $\beta\,dA$ (details in `shaped_attention_forward`).

Papers: B. He, T. Hofmann, "Simplifying Transformer Blocks", ICLR 2024, arXiv 2311.01906;
L. Noci et al., "The Shaped Transformer", NeurIPS 2023, arXiv 2306.17759. Upstream:
bobby-he/simplified_transformers @ 8d4ea7965f61c61259123a37ff06cdef636845c0
``simplified_transformers/model_utils.py`` (``myGPT2Attention._attn``). The full layer
``shaped_attention_layer_forward`` is ``myGPT2Attention`` (``qk_attn``, ``MyConv1D`` ``v_attn`` /
``c_proj`` or identities, optional q/k ``RMSNorm``); a module written from it agrees in float64
within $9\times10^{-16}$ relative, output and every gradient (``tests/test_fidelity_layers.py``).

Layouts: PyTorch SDPA for attention cores (``q (B, H, N, d)``), token-major ``x (B, N, C)`` for
layers; weights ``(in, out)`` (PyTorch: ``linear.weight.T``; a 1x1 ``Conv1d``/``Conv2d`` weight
``w[:, :, 0].T``); parameter keys are the upstream modules' ``state_dict`` names so a checkpoint
maps over key by key. Every forward returns ``(out, cache)`` and every backward a ``dict`` of
gradients for all inputs and parameters; see also ``docs/differential-relatives.md``.
"""

from __future__ import annotations

import numpy as np

from ..._checks import (
    as_dout,
    as_float,
    cast_all,
    check_choice,
    check_int,
    check_param_keys,
    check_params,
    check_positive,
    compute_dtype,
)
from ...nn.linear import linear_apply, linear_vjp, merge_heads, split_heads
from ...registry import Mechanism, Sample, register
from ._samples import explicit_softmax, rand_qkv
from .core import additive_mask, per_head_param, resolve_scale, softmax_map_backward, softmax_map_forward, validate_qkv

__all__ = [
    "shaped_attention_forward",
    "shaped_attention_backward",
    "shaped_attention",
    "shaped_attention_layer_forward",
    "shaped_attention_layer_backward",
    "shaped_attention_layer",
]


_PAPER_SHAPED = ("B. He, T. Hofmann, 'Simplifying Transformer Blocks', ICLR 2024, arXiv 2311.01906; "
                 "L. Noci et al., 'The Shaped Transformer', NeurIPS 2023, arXiv 2306.17759")


def _shaped_centre(centre, n, m, dt):
    if centre == "uniform_causal":
        # softmax of all-equal logits under the bottom-right causal mask: C_ij = 1/(i+1+M-N), j <= i+M-N
        off = m - n
        keep = np.arange(m)[None, :] <= np.arange(n)[:, None] + off
        return np.where(keep, 1.0 / (np.arange(n)[:, None] + 1.0 + off), 0.0).astype(dt)
    if centre == "uniform":
        return np.full((n, m), 1.0 / m, dtype=dt)
    return np.zeros((n, m), dtype=dt)


def shaped_attention_forward(q, k, v, params, *, attn_mask=None, is_causal=True, scale=None,
                             centre="uniform_causal"):
    r"""Shaped attention: an identity-centred softmax map (He & Hofmann 2024; Noci et al. 2023).

    $$A_h = \beta_h\,\mathrm{softmax}(s\,Q_hK_h^\top + M) + \alpha_h I - \gamma_h C,\qquad O_h = A_h V_h$$

    with per-head gains $\beta$ = ``attn_mat_resid_gain``, $\alpha$ = ``attn_mat_skip_gain``,
    $\gamma$ = ``centre_attn_gain`` (the upstream parameter names, shape ``(H,)``; upstream stores
    them as ``(1, H, 1, 1)``: pass ``p.reshape(-1)``). $C$ is the softmax of all-equal logits
    under the causal mask, $C_{ij} = 1/(i+1)$ for $j\le i$ (``centre="uniform_causal"``, the
    upstream buffer ``uniform_causal_attn_mat``), or $\frac1M\mathbf 1\mathbf 1^\top$
    (``centre="uniform"``, Noci et al.), or 0 (``"none"``).

    Upstream: bobby-he/simplified_transformers ``simplified_transformers/model_utils.py``
    (``myGPT2Attention._attn``). Conventions there: causal (GPT-2), logits divided by
    $\sqrt{d_v}$ (``value.size(-1)``; equal to $d$ in GPT-2 — refattn's ``scale`` defaults to
    $d^{-1/2}$), causal mask and $I$, $C$ aligned bottom-right ($j \le i + M - N$; upstream
    slices ``diag[:M, :M]``, which only broadcasts when $N = M$ — refattn uses the identity shifted
    by $M-N$ so that $I$ marks each query's own key). A padding ``attn_mask`` does not change $C$
    (as upstream). Noci et al.'s shaped attention is ``alpha = beta = gamma = 1``,
    ``centre="uniform"``, ``is_causal=False`` and ``scale`` $=1/\tau$ with a width-dependent
    temperature $\tau$.

    Parameters
    ----------
    q : (..., H, N, d); k : (..., H, M, d); v : (..., H, M, dv)
    params : dict with ``attn_mat_resid_gain``, ``attn_mat_skip_gain``, ``centre_attn_gain``, each ``(H,)``.
    attn_mask : bool (True keeps) or additive float, broadcastable to ``(..., H, N, M)``.
    is_causal : bool, default True (upstream is a causal LM).
    scale : float, default $d^{-1/2}$.
    centre : {"uniform_causal", "uniform", "none"}.

    Backward
    --------
    With $dA = G V^\top$: $dV = A^\top G$; $d\beta_h = \langle dA_h, P_h\rangle$,
    $d\alpha_h = \langle dA_h, I\rangle$, $d\gamma_h = -\langle dA_h, C\rangle$ (summed over the
    batch); $dP = \beta\,dA$ then the softmax VJP, $dQ = s\,dS K$, $dK = s\,dS^\top Q$. The
    constant maps $I$, $C$ carry no input gradient.
    """
    q, k, v, dt = validate_qkv(q, k, v, self_attention=False)
    h, n, m = q.shape[-3], q.shape[-2], k.shape[-2]
    check_param_keys(params, ("attn_mat_resid_gain", "attn_mat_skip_gain", "centre_attn_gain"))
    beta = per_head_param(params, "attn_mat_resid_gain", h, dt)
    alpha = per_head_param(params, "attn_mat_skip_gain", h, dt)
    gamma = per_head_param(params, "centre_attn_gain", h, dt)
    check_choice(centre, "centre", ("uniform_causal", "uniform", "none"))
    if m < n:
        raise ValueError(f"shaped attention needs at least as many keys as queries (M >= N) to place the "
                         f"identity; got N={n}, M={m}")
    sc = resolve_scale(scale, q.shape[-1])
    mask = additive_mask(attn_mask, is_causal, q.shape[:-1] + (m,), align="bottom_right")
    p = softmax_map_forward(q, k, mask, sc)
    eye = np.eye(n, m, k=m - n, dtype=dt)
    c = _shaped_centre(centre, n, m, dt)
    a = beta[:, None, None] * p + alpha[:, None, None] * eye - gamma[:, None, None] * c
    out = a @ v
    cache = {"q": q, "k": k, "v": v, "p": p, "a": a, "eye": eye, "c": c, "beta": beta, "scale": sc}
    return out, cache


def shaped_attention_backward(dout, cache):
    """Gradients of :func:`shaped_attention_forward` (derivation in its docstring)."""
    q, k, v, p, a = cache["q"], cache["k"], cache["v"], cache["p"], cache["a"]
    g = as_dout(dout, q.shape[:-1] + (v.shape[-1],), q.dtype)
    da = g @ np.swapaxes(v, -1, -2)
    dv = np.swapaxes(a, -1, -2) @ g
    axes = tuple(range(da.ndim - 3)) + (da.ndim - 2, da.ndim - 1)
    dbeta = np.sum(da * p, axis=axes)
    dalpha = np.sum(da * cache["eye"], axis=axes)
    dgamma = -np.sum(da * cache["c"], axis=axes)
    dq, dk, _ = softmax_map_backward(cache["beta"][:, None, None] * da, p, q, k, cache["scale"])
    return {"q": dq, "k": dk, "v": dv, "attn_mat_resid_gain": dbeta, "attn_mat_skip_gain": dalpha,
            "centre_attn_gain": dgamma}


def shaped_attention(q, k, v, params, **config):
    """Convenience wrapper: the output of :func:`shaped_attention_forward`."""
    return shaped_attention_forward(q, k, v, params, **config)[0]


# --------------------------------------------------------------------------------------------
# The full layer (upstream myGPT2Attention)

_GAINS = ("attn_mat_resid_gain", "attn_mat_skip_gain", "centre_attn_gain")


def _reparam_linear(p, name, ident):
    """Effective weight of upstream ``MyConv1D`` ``name``: ``weight`` or ``resid_gain * weight + skip_gain * id``."""
    w = p[f"{name}.weight"]
    if f"{name}.skip_gain" in p:
        w = p[f"{name}.resid_gain"][0] * w + p[f"{name}.skip_gain"][0] * ident
    return w


def _reparam_linear_vjp(grads, p, name, ident, dy, x):
    """Gradients of :func:`_reparam_linear` applied to ``x``: fills ``grads``, returns ``dx``."""
    lead = x.reshape(-1, x.shape[-1]).T @ dy.reshape(-1, dy.shape[-1])  # X^T dY, the effective weight's gradient
    w = _reparam_linear(p, name, ident)
    if f"{name}.skip_gain" in p:
        grads[f"{name}.weight"] = p[f"{name}.resid_gain"][0] * lead
        grads[f"{name}.resid_gain"] = np.array([np.sum(lead * p[f"{name}.weight"])])
        grads[f"{name}.skip_gain"] = np.array([np.sum(lead * ident)])
    else:
        grads[f"{name}.weight"] = lead
    if f"{name}.bias" in p:
        grads[f"{name}.bias"] = dy.reshape(-1, dy.shape[-1]).sum(axis=0)
    return dy @ w.T


def _bz_rms_forward(x, scale, eps):
    """bzhang RMSNorm (upstream ``RMSNorm``): ``scale * x / (||x|| d^{-1/2} + eps)`` over the last axis."""
    nrm = np.linalg.norm(x, axis=-1, keepdims=True)
    r = nrm * x.shape[-1] ** -0.5 + eps
    xn = x / r
    return scale * xn, (x, xn, nrm, r, scale)


def _bz_rms_backward(g, cache):
    x, xn, nrm, r, scale = cache
    u = g * scale
    dx = u / r - np.sum(u * x, axis=-1, keepdims=True) / (r**2 * nrm * np.sqrt(x.shape[-1])) * x
    return dx, np.sum((g * xn).reshape(-1, x.shape[-1]), axis=0)


def shaped_attention_layer_forward(x, params, *, num_heads: int, centre_attn: bool = True, attn_mask=None,
                                   is_causal=True, scale=None, qk_norm_eps: float = 1e-5,
                                   v_attn_id=None, c_proj_id=None):
    r"""Shaped attention layer: upstream ``myGPT2Attention`` (bobby-he/simplified_transformers
    ``simplified_transformers/model_utils.py``), without cache or dropout.

    $$[Q\,K] = XW_{qk} + b_{qk},\quad V = X\,\tilde W_v,\quad
    Q_h, K_h \leftarrow \mathrm{rms}(Q_h), \mathrm{rms}(K_h)\ (\text{optional}),\quad
    Y = \big[A_hV_h\big]_h\,\tilde W_o,$$

    $A_h$ the shaped map of :func:`shaped_attention_forward` (``centre_attn=True``:
    $\beta\,\mathrm{softmax} + \alpha I - \gamma C$ with the causal uniform $C$; ``False``:
    $\beta\,\mathrm{softmax}$ only, as upstream, the skip and centre gains then unused and their
    gradients zero). $\tilde W$ is upstream's ``MyConv1D``: a plain weight, or, with
    ``skip_gain``, $\rho W + \sigma\,\mathrm{Id}$ (``resid_gain`` $\rho$, ``skip_gain`` $\sigma$,
    ``Id`` the non-persistent ``id`` matrix: the identity for ``init_type="id"``; pass
    ``v_attn_id`` / ``c_proj_id`` for the random ``"orth"``/``"normal"`` ones, which a checkpoint
    does not store); absent ``v_attn`` / ``c_proj`` keys are upstream's ``nn.Identity`` (the
    simplified "SAS" block). ``rms`` is upstream's ``RMSNorm`` (bzhang form
    $s\odot x/(\lVert x\rVert d^{-1/2} + \epsilon)$) on each head's $d$ features.
    Upstream's ``dot_norm_type="tanh"`` (a soft cap computed in float32) is not supported.

    Parameters
    ----------
    x : array (B.., N, C)
    params : dict
        Upstream ``state_dict`` names; ``MyConv1D`` weights are already ``(in, out)`` (no
        transpose): ``qk_attn.weight (C, 2C)``, ``qk_attn.bias (2C,)`` (optional); optional
        ``v_attn.weight (C, C)``, ``v_attn.bias (C,)``, ``v_attn.resid_gain (1,)``,
        ``v_attn.skip_gain (1,)`` and the same for ``c_proj``; optional ``q_norm.scale (d,)``,
        ``k_norm.scale (d,)`` (``qk_norm_type="rmsnorm"``); the three gains
        ``attn_mat_resid_gain``, ``attn_mat_skip_gain``, ``centre_attn_gain`` as ``(H,)``
        (upstream ``(1, H, 1, 1)``: ``reshape(-1)``).
    num_heads : int
        $H$; $d = C/H$.
    centre_attn : bool
        Upstream ``config.centre_attn``.
    attn_mask, is_causal
        As :func:`shaped_attention_forward` (upstream: causal; its additive ``attention_mask``).
    scale : float, optional
        Default $d^{-1/2}$ (upstream divides by $\sqrt{d_v}$, the same in GPT-2); upstream's
        ``scale_attn_by_inverse_layer_idx`` is ``scale = d**-0.5 / (layer_idx + 1)``.
    qk_norm_eps : float
        The q/k RMSNorm's $\epsilon$ (upstream ``config.layer_norm_epsilon``; GPT-2's 1e-5).
    v_attn_id, c_proj_id : array (C, C), optional
        ``MyConv1D.id`` of the reparameterised layers (default: the identity).

    Backward
    --------
    $d\tilde W_o = Z^\top G$ (then $dW = \rho\,d\tilde W$, $d\rho = \langle d\tilde W, W\rangle$,
    $d\sigma = \langle d\tilde W, \mathrm{Id}\rangle$); the core's backward; the RMSNorm VJP
    $dx = u/r - \frac{(u\cdot x)}{r^2\lVert x\rVert\sqrt d}x$ with $u = s\odot g$,
    $ds = \sum g\odot\hat x$; then the ``qk_attn`` and ``v_attn`` VJPs summed into $dX$.
    """
    x = as_float(x, "x", min_ndim=2)
    h = check_int(num_heads, "num_heads", minimum=1)
    c = x.shape[-1]
    if c % h:
        raise ValueError(f"num_heads={h} must divide the embedding width C={c} of x")
    d = c // h
    if not isinstance(centre_attn, (bool, np.bool_)):
        raise TypeError(f"centre_attn must be a bool; got {type(centre_attn).__name__}")
    spec = {"qk_attn.weight": (c, 2 * c), "qk_attn.bias": (2 * c,)}
    for name in ("v_attn", "c_proj"):
        spec.update({f"{name}.weight": (c, c), f"{name}.bias": (c,), f"{name}.resid_gain": (1,),
                     f"{name}.skip_gain": (1,)})
    spec.update({"q_norm.scale": (d,), "k_norm.scale": (d,)})
    spec.update({g: (h,) for g in _GAINS})
    optional = tuple(k for k in spec if k != "qk_attn.weight" and k not in _GAINS)
    p = check_params(params, spec, optional=optional, where="shaped_attention_layer")
    for name in ("v_attn", "c_proj"):
        present = [k for k in p if k.startswith(name + ".")]
        if present and f"{name}.weight" not in p:
            raise ValueError(f"{name}: {present} given without {name}.weight")
        if (f"{name}.resid_gain" in p) != (f"{name}.skip_gain" in p):
            raise ValueError(f"{name}.resid_gain and {name}.skip_gain come together (upstream skip_gain set)")
    if ("q_norm.scale" in p) != ("k_norm.scale" in p):
        raise ValueError("q_norm.scale and k_norm.scale come together (upstream qk_norm_type='rmsnorm')")
    eps = check_positive(qk_norm_eps, "qk_norm_eps")
    dt = compute_dtype(x, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    ids = {}
    for name, ident in (("v_attn", v_attn_id), ("c_proj", c_proj_id)):
        if ident is None:
            ids[name] = np.eye(c, dtype=dt)
        else:
            ids[name] = as_float(ident, f"{name}_id", ndim=2).astype(dt)
            if ids[name].shape != (c, c):
                raise ValueError(f"{name}_id must have shape ({c}, {c}); got {ids[name].shape}")
    qk = linear_apply(x, p["qk_attn.weight"], p.get("qk_attn.bias"))
    vin = x @ _reparam_linear(p, "v_attn", ids["v_attn"]) + p.get("v_attn.bias", 0) if "v_attn.weight" in p else x
    q, k, v = split_heads(qk[..., :c], h), split_heads(qk[..., c:], h), split_heads(vin, h)
    norms = None
    if "q_norm.scale" in p:
        q, cq = _bz_rms_forward(q, p["q_norm.scale"], eps)
        k, ck = _bz_rms_forward(k, p["k_norm.scale"], eps)
        norms = (cq, ck)
    gains = {g: p[g] for g in _GAINS}
    if not centre_attn:
        gains["attn_mat_skip_gain"] = np.zeros(h, dtype=dt)
        gains["centre_attn_gain"] = np.zeros(h, dtype=dt)
    o, core = shaped_attention_forward(q, k, v, gains, attn_mask=attn_mask, is_causal=is_causal, scale=scale,
                                       centre="uniform_causal" if centre_attn else "none")
    merged = merge_heads(o)
    y = merged @ _reparam_linear(p, "c_proj", ids["c_proj"]) + p.get("c_proj.bias", 0) \
        if "c_proj.weight" in p else merged
    return y, {"x": x, "p": p, "ids": ids, "vin": vin, "core": core, "norms": norms, "merged": merged, "h": h,
               "centre_attn": bool(centre_attn), "shape": y.shape}


def shaped_attention_layer_backward(dout, cache):
    """Gradients of :func:`shaped_attention_layer_forward` for ``x`` and every params key."""
    x, p, ids, h = cache["x"], cache["p"], cache["ids"], cache["h"]
    g = as_dout(dout, cache["shape"], x.dtype)
    grads: dict = {}
    dm = _reparam_linear_vjp(grads, p, "c_proj", ids["c_proj"], g, cache["merged"]) if "c_proj.weight" in p else g
    gc = shaped_attention_backward(split_heads(dm, h), cache["core"])
    for gname in _GAINS:
        grads[gname] = gc[gname]
    if not cache["centre_attn"]:
        grads["attn_mat_skip_gain"] = np.zeros_like(gc["attn_mat_skip_gain"])
        grads["centre_attn_gain"] = np.zeros_like(gc["centre_attn_gain"])
    dq, dk = gc["q"], gc["k"]
    if cache["norms"] is not None:
        dq, grads["q_norm.scale"] = _bz_rms_backward(dq, cache["norms"][0])
        dk, grads["k_norm.scale"] = _bz_rms_backward(dk, cache["norms"][1])
    dvin = merge_heads(gc["v"])
    gq = linear_vjp(np.concatenate([merge_heads(dq), merge_heads(dk)], axis=-1), x, p["qk_attn.weight"],
                    "qk_attn.bias" in p)
    grads["qk_attn.weight"] = gq["weight"]
    if "qk_attn.bias" in p:
        grads["qk_attn.bias"] = gq["bias"]
    if "v_attn.weight" in p:
        dvin = _reparam_linear_vjp(grads, p, "v_attn", ids["v_attn"], dvin, x)
    grads["x"] = gq["x"] + dvin
    return grads


def shaped_attention_layer(x, params, **config):
    """Convenience wrapper: the output of :func:`shaped_attention_layer_forward`."""
    return shaped_attention_layer_forward(x, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample_shaped(rng, size):
    q, k, v = rand_qkv(rng, size, same_len=False)
    h = q.shape[1]
    params = {"attn_mat_resid_gain": 1.0 + 0.3 * rng.standard_normal(h),
              "attn_mat_skip_gain": 1.0 + 0.3 * rng.standard_normal(h),
              "centre_attn_gain": 1.0 + 0.3 * rng.standard_normal(h)}
    return Sample(inputs={"q": q, "k": k, "v": v}, params=params,
                  config={"is_causal": True, "centre": "uniform_causal"})


def _reference_shaped(q, k, v, params, *, attn_mask=None, is_causal=True, scale=None, centre="uniform_causal"):
    # Row by row with explicit loops over the causal prefix (independent of the vectorised path).
    assert attn_mask is None
    n, m, d = q.shape[-2], k.shape[-2], q.shape[-1]
    sc = 1 / np.sqrt(d) if scale is None else scale
    out = np.zeros(q.shape[:-1] + (v.shape[-1],))
    for idx in np.ndindex(q.shape[:-2]):
        hh = idx[-1]
        for i in range(n):
            last = i + m - n if is_causal else m - 1
            logits = np.array([sc * q[idx][i] @ k[idx][j] for j in range(last + 1)])
            p = explicit_softmax(logits)
            row = np.zeros(m)
            row[: last + 1] = params["attn_mat_resid_gain"][hh] * p
            row[i + m - n] += params["attn_mat_skip_gain"][hh]
            if centre == "uniform_causal":
                row[: i + m - n + 1] -= params["centre_attn_gain"][hh] / (i + m - n + 1)
            elif centre == "uniform":
                row -= params["centre_attn_gain"][hh] / m
            out[idx][i] = row @ v[idx]
    return out


def _check_shaped_identity_at_init(rng):
    # beta = gamma and Q = 0 (upstream's zero-query init): the causal softmax equals C, so A = alpha I.
    _, k, v = rand_qkv(rng, "small")
    q = np.zeros_like(k)
    h = q.shape[1]
    g = rng.random(h) + 0.5
    params = {"attn_mat_resid_gain": g, "attn_mat_skip_gain": rng.random(h) + 0.5, "centre_attn_gain": g.copy()}
    out = shaped_attention(q, k, v, params)
    err = float(np.abs(out - params["attn_mat_skip_gain"][:, None, None] * v).max())
    assert err < 1e-12, f"A != alpha I at init: {err}"
    return err


def _check_shaped_row_sums(rng):
    q, k, v = rand_qkv(rng, "small")
    h = q.shape[1]
    params = {n_: rng.standard_normal(h) for n_ in ("attn_mat_resid_gain", "attn_mat_skip_gain", "centre_attn_gain")}
    _, cache = shaped_attention_forward(q, k, v, params)
    want = params["attn_mat_resid_gain"] + params["attn_mat_skip_gain"] - params["centre_attn_gain"]
    err = float(np.abs(cache["a"].sum(-1) - want[:, None]).max())
    assert err < 1e-12, f"rows do not sum to alpha + beta - gamma: {err}"
    return err


def _check_shaped_noci_temperature(rng):
    # Noci et al.: alpha = beta = gamma = 1, uniform centre; tau -> infinity (scale -> 0) gives A -> I.
    q, k, v = rand_qkv(rng, "small")
    h = q.shape[1]
    ones = {n_: np.ones(h) for n_ in ("attn_mat_resid_gain", "attn_mat_skip_gain", "centre_attn_gain")}
    out = shaped_attention(q, k, v, ones, is_causal=False, centre="uniform", scale=1e-9)
    err = float(np.abs(out - v).max())
    assert err < 1e-7, f"A does not tend to I as tau -> infinity: {err}"
    return err


def _check_shaped_layer_gradcheck(rng):
    """The full layer: FD gradcheck of x and every parameter, (a) the SAS block (identity v_attn
    and c_proj, centred), (b) reparameterised v_attn/c_proj with a random id matrix, q/k RMSNorm,
    no centring."""
    from ...testing import gradcheck

    c, h, worst = 4, 2, 0.0
    for full in (False, True):
        params = {"qk_attn.weight": 0.7 * rng.standard_normal((c, 2 * c)), "qk_attn.bias": 0.2 * rng.standard_normal(2 * c)}
        params.update({g: 1.0 + 0.3 * rng.standard_normal(h) for g in _GAINS})
        cfg = {"num_heads": h}
        if full:
            for name in ("v_attn", "c_proj"):
                params.update({f"{name}.weight": 0.5 * rng.standard_normal((c, c)), f"{name}.bias": 0.1 * rng.standard_normal(c),
                               f"{name}.resid_gain": rng.uniform(0.5, 1.5, 1), f"{name}.skip_gain": rng.uniform(0.5, 1.5, 1)})
            params.update({"q_norm.scale": rng.uniform(0.5, 1.5, c // h), "k_norm.scale": rng.uniform(0.5, 1.5, c // h)})
            cfg.update(centre_attn=False, v_attn_id=rng.standard_normal((c, c)))
        s = Sample(inputs={"x": rng.standard_normal((2, 3, c))}, params=params, config=cfg)
        worst = max(worst, gradcheck(shaped_attention_layer_forward, shaped_attention_layer_backward, s).max_rel)
    return worst


register(
    Mechanism(
        slug="shaped_attention", family="2-differential", tier="T1",
        title="Shaped attention: beta softmax + alpha I - gamma C (He & Hofmann; Noci et al.)",
        paper=_PAPER_SHAPED, forward=shaped_attention_forward, backward=shaped_attention_backward,
        sample=_sample_shaped, reference=_reference_shaped, docs="differential-relatives.md#shaped-attention",
        checks={"identity_at_init": _check_shaped_identity_at_init, "row_sums": _check_shaped_row_sums,
                "noci_tau_to_infinity": _check_shaped_noci_temperature,
                "layer_gradcheck": _check_shaped_layer_gradcheck},
    ),
)
