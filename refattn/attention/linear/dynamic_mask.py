r"""DMA: trainable dynamic-mask sparse attention (flash-dmattn, now flash-sparse-attn).

Shi et al., "Trainable Dynamic Mask Sparse Attention", 2025, arXiv 2508.02124. The paper combines a
*content-aware* mask, generated from the value representations, with *position-aware* skipping of
the masked computation. Official code: SmallDoges/flash-dmattn (renamed flash-sparse-attn) at
``f024c28873f9b444a1c1f7f009dc3653b3d220f9``: the mask generator
``flash_sparse_attn/utils/mask.py`` (``topk_mask``, ``create_mask``), its Python reference
``benchmarks/forward_equivalence.py`` (``dynamic_mask_attention_python``) and the layer that feeds
it, ``examples/modeling/modeling_doge.py`` (``DogeAttention``). The CUDA/Triton kernels skip the
masked tiles; the numbers they compute are the reference's.

Forward
-------
For kv head $h$ with values $V_h\in\mathbb R^{M\times d_v}$, the *dynamic bias* is a function of all
kv heads' values of a token ($v_j = [v_{1j};\dots;v_{H_{kv}j}]$, ``dt_proj`` a linear map
$\mathbb R^{H_{kv}d_v}\to\mathbb R^{H_{kv}}$):

$$\delta_{hj} = A_h\,\mathrm{softplus}\big((v_jW_\Delta + b_\Delta)_h\big)\quad(\texttt{bias\_form="linear"},
\text{ the code}),\qquad \delta_{hj} = \exp\!\big(A_h\,\mathrm{softplus}(\cdot)\big)\quad(\texttt{"exp"}, \text{the paper}).$$

(The Doge code comments that the paper's $\exp(A\cdot\mathrm{softplus}(\Delta V))$ was replaced
by $A\cdot\mathrm{softplus}(\Delta V)$ for numerical stability.) The bias is the same for every
query. The *dynamic mask* keeps, for every query row, the ``window_size`` keys of largest
$\delta_{hj}$ among the row's visible keys (causal: $j \le i$), only when $M >$ ``window_size``
(``create_mask`` is skipped otherwise); then

$$o_i = \sum_{j\in K_i}\frac{\exp(s\,q_i\cdot k_j + \delta_{hj})}{\sum_{l\in K_i}\exp(s\,q_i\cdot k_l + \delta_{hl})}\,v_j ,$$

the SDPA core with an additive, differentiable bias and a boolean mask. Query heads share their kv
head's bias and mask (``repeat_kv``, contiguous groups).

Backward (mask held fixed)
--------------------------
The mask is a top-$k$ of $\delta$ (``attention_bias.detach()`` upstream): piecewise constant, no
gradient. Through the attention core (`refattn.attention.softmax.core`) we get $dq, dk, dv$ and the
bias gradient $d\delta_{hj} = \sum_{i,\text{heads in group}} dS_{ij}$. Then with $z = v_jW_\Delta + b_\Delta$,
$\sigma$ the logistic function ($\mathrm{softplus}' = \sigma$):

$$\text{linear: } dA_h = \sum_j d\delta_{hj}\,\mathrm{softplus}(z_{jh}),\quad dz_{jh} = d\delta_{hj}A_h\sigma(z_{jh});\qquad
\text{exp: } dA_h = \sum_j d\delta_{hj}\delta_{hj}\mathrm{softplus}(z_{jh}),\quad dz_{jh} = d\delta_{hj}\delta_{hj}A_h\sigma(z_{jh}),$$

and the linear layer's VJP gives $dW_\Delta$, $db_\Delta$ and a second contribution to $dv$.

Conventions and reconstruction
------------------------------
Parameter names follow ``DogeAttention``: ``A`` ``(H_kv,)`` and ``dt_proj.weight``
``(H_kv d_v, H_kv)`` (= torch ``weight.T``), optional ``dt_proj.bias``. ``scale`` defaults to
$1/\sqrt d$ (``self.scaling``). This record is the mechanism-level component: the rest of the
Doge layer (q/k/v/o projections, q/k RMSNorm, RoPE) is standard attention plumbing. Upstream's
optional ``block_size`` smoothing of the mask and its ``relu`` mask type are not implemented.
``bias_form`` is a keyword for the paper/code disagreement (default: the code).

Agreement with upstream (``dynamic_mask_attention_python`` and ``create_mask`` run, the Doge bias
in PyTorch autograd): output 8.9e-16, gradients <= 4.8e-15 relative.
"""

from __future__ import annotations

import numpy as np

from ..._checks import (
    as_dout,
    cast_all,
    check_choice,
    check_int,
    check_params,
    check_positive,
    compute_dtype,
    validate_qkv,
)
from ...nn.activations import sigmoid
from ...nn.linear import linear_apply, linear_vjp
from ...registry import Mechanism, Sample, register
from ..softmax.core import (
    CAUSAL_ALIGNMENTS,
    attention_core_backward,
    attention_core_forward,
    causal_keep,
    expand_kv,
    naive_attention,
    reduce_kv,
)
from ._samples import draw_until, fd_max_rel, topk_margin
from .core import topk_keep

__all__ = ["BIAS_FORMS", "dynamic_mask_bias", "dynamic_mask_attention_forward", "dynamic_mask_attention_backward",
           "dynamic_mask_attention"]

BIAS_FORMS = ("linear", "exp")


def _softplus(x):
    return np.logaddexp(0.0, x).astype(x.dtype, copy=False)


def dynamic_mask_bias(v, params, bias_form: str = "linear"):
    r"""The dynamic bias $\delta$ ``(..., H_kv, M)`` from values ``v (..., H_kv, M, d_v)`` and the
    validated, cast ``params`` (``A``, ``dt_proj.weight``, optional ``dt_proj.bias``), plus the
    intermediates ``(vflat, z, sp)`` the backward needs. Unvalidated."""
    vflat = np.swapaxes(v, -2, -3)
    vflat = vflat.reshape(vflat.shape[:-2] + (-1,))  # (..., M, H_kv d_v), head-major as upstream
    z = linear_apply(vflat, params["dt_proj.weight"], params.get("dt_proj.bias"))
    sp = _softplus(z)
    a = params["A"] * sp
    delta = np.exp(a) if bias_form == "exp" else a
    return np.swapaxes(delta, -1, -2), (vflat, z, sp)


def dynamic_mask_attention_forward(q, k, v, params, *, window_size: int, is_causal: bool = True, scale=None,
                                   bias_form: str = "linear", causal_alignment: str = "top_left"):
    r"""Dynamic-mask attention (DMA): value-generated bias $\delta$, top-``window_size`` key mask per
    query, softmax attention with the bias on the kept keys.

    Parameters
    ----------
    q : (..., H, N, d); k : (..., H_kv, M, d); v : (..., H_kv, M, d_v)
        SDPA layout; ``H`` a multiple of ``H_kv`` (contiguous groups, ``repeat_kv``).
    params : dict
        ``A`` ``(H_kv,)``, ``dt_proj.weight`` ``(H_kv d_v, H_kv)``, optional ``dt_proj.bias`` ``(H_kv,)``.
    window_size : int >= 1
        Keys kept per query (upstream ``window_size``); no mask when ``M <= window_size``.
    is_causal, causal_alignment
        Causal visibility $j \le i$ (``"top_left"``) or $j \le i + M - N$; the top-k runs over the
        visible keys (upstream passes the causal mask to ``create_mask``). Default causal (Doge).
    scale : float > 0, optional
        Default $1/\sqrt d$.
    bias_form : {"linear", "exp"}
        $A\,\mathrm{softplus}(\cdot)$ (the code, default) or $\exp(A\,\mathrm{softplus}(\cdot))$ (the paper).

    Returns
    -------
    out : (..., H, N, d_v), cache
        ``cache["keep"]`` is the dynamic mask ``(..., H_kv, N, M)`` (None when not applied).
    """
    q, k, v = validate_qkv(q, k, v)
    window_size = check_int(window_size, "window_size", minimum=1)
    check_choice(bias_form, "bias_form", BIAS_FORMS)
    check_choice(causal_alignment, "causal_alignment", CAUSAL_ALIGNMENTS)
    if not isinstance(is_causal, (bool, np.bool_)):
        raise TypeError(f"is_causal must be a bool; got {type(is_causal).__name__}")
    scale = check_positive(scale, "scale", allow_none=True)
    hkv, dv = k.shape[-3], v.shape[-1]
    p = check_params(params, {"A": (hkv,), "dt_proj.weight": (hkv * dv, hkv), "dt_proj.bias": (hkv,)},
                     optional=("dt_proj.bias",), where="dynamic_mask_attention")
    dt = compute_dtype(q, k, v, *p.values())
    q, k, v = (a.astype(dt, copy=False) for a in (q, k, v))
    p = cast_all(dt, p)
    delta, (vflat, z, sp) = dynamic_mask_bias(v, p, bias_form)
    n, m = q.shape[-2], k.shape[-2]
    bias = delta[..., None, :]  # (..., H_kv, 1, M): the same for every query
    keep = None
    if m > window_size:
        vis = causal_keep(n, m, causal_alignment) if is_causal else None
        keep = topk_keep(np.broadcast_to(bias, bias.shape[:-2] + (n, m)), window_size, vis)
    group = q.shape[-3] // hkv
    out, core = attention_core_forward(q, k, v, expand_kv(bias, group), attn_mask=None if keep is None
                                       else expand_kv(keep, group), is_causal=bool(is_causal),
                                       causal_alignment=causal_alignment, scale=scale)
    cache = {"core": core, "p": p, "vflat": vflat, "z": z, "sp": sp, "delta": delta, "group": group,
             "bias_form": bias_form, "keep": keep, "v_shape": v.shape}
    return out.copy(), cache


def dynamic_mask_attention_backward(dout, cache):
    r"""Gradients ``{"q", "k", "v", "A", "dt_proj.weight"[, "dt_proj.bias"]}`` of
    `dynamic_mask_attention_forward`, the mask held fixed (attention core VJP with its bias
    gradient, then the softplus bias and the ``dt_proj`` layer; see the module docstring)."""
    core = cache["core"]
    g = as_dout(dout, core["out"].shape, core["p"].dtype)
    grads = attention_core_backward(g, core)
    ddelta = reduce_kv(grads.pop("bias"), cache["group"])[..., 0, :]  # (..., H_kv, M)
    ddelta = np.swapaxes(ddelta, -1, -2)                                # (..., M, H_kv)
    p, sp, z = cache["p"], cache["sp"], cache["z"]
    if cache["bias_form"] == "exp":
        ddelta = ddelta * np.swapaxes(cache["delta"], -1, -2)
    da = np.sum((ddelta * sp).reshape(-1, sp.shape[-1]), axis=0)
    dz = ddelta * p["A"] * sigmoid(z)
    lin = linear_vjp(dz, cache["vflat"], p["dt_proj.weight"], "dt_proj.bias" in p)
    dvflat = lin["x"].reshape(lin["x"].shape[:-1] + (cache["v_shape"][-3], cache["v_shape"][-1]))
    grads["v"] = grads["v"] + np.swapaxes(dvflat, -2, -3)
    grads["A"] = da
    grads["dt_proj.weight"] = lin["weight"]
    if "dt_proj.bias" in p:
        grads["dt_proj.bias"] = lin["bias"]
    return grads


def dynamic_mask_attention(q, k, v, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of `dynamic_mask_attention_forward`."""
    return dynamic_mask_attention_forward(q, k, v, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _brute_keep(delta, n, window_size, is_causal, causal_alignment="top_left"):
    """Per query row, a full sort of the visible keys by their bias (one row at a time)."""
    m = delta.shape[-1]
    vis = causal_keep(n, m, causal_alignment) if is_causal else np.ones((n, m), bool)
    keep = np.zeros(delta.shape[:-1] + (n, m), bool)
    for idx in np.ndindex(*delta.shape[:-1]):
        for i in range(n):
            cand = sorted((j for j in range(m) if vis[i, j]), key=lambda j: -delta[idx + (j,)])
            keep[idx + (i, cand[:window_size])] = True
    return keep


def _reference(q, k, v, params, *, window_size, is_causal=True, scale=None, bias_form="linear",
               causal_alignment="top_left"):
    hkv = k.shape[-3]
    # the explicit bias: token j's values of all kv heads, one token at a time
    delta = np.zeros(k.shape[:-1])
    for idx in np.ndindex(*k.shape[:-3]):
        for j in range(k.shape[-2]):
            vj = np.concatenate([v[idx + (h, j)] for h in range(hkv)])
            z = vj @ params["dt_proj.weight"] + params.get("dt_proj.bias", 0.0)
            a = params["A"] * np.log1p(np.exp(z))
            delta[idx + (slice(None), j)] = np.exp(a) if bias_form == "exp" else a
    n, m = q.shape[-2], k.shape[-2]
    keep = _brute_keep(delta, n, window_size, is_causal, causal_alignment) if m > window_size else \
        np.ones(delta.shape[:-1] + (n, m), bool)
    if is_causal:
        keep &= causal_keep(n, m, causal_alignment)
    group = q.shape[-3] // hkv
    return naive_attention(q, k, v, bias=expand_kv(np.broadcast_to(delta[..., None, :], keep.shape), group),
                           keep=expand_kv(keep, group), scale=scale)


def _draw(rng, size, hkv=2, bias_form="linear", with_bias=True):
    b, h = 2, 2
    n = 4 if size == "tiny" else int(rng.integers(7, 11))
    d, dv = (2, 2) if size == "tiny" else (5, 4)
    causal = bool(rng.integers(0, 2))
    w = int(rng.integers(2, 4))
    params = {"A": rng.uniform(1.0, 3.0, hkv) * rng.choice([-1.0, 1.0], hkv),
              "dt_proj.weight": rng.standard_normal((hkv * dv, hkv)) / np.sqrt(hkv * dv)}
    if with_bias:
        params["dt_proj.bias"] = 0.3 * rng.standard_normal(hkv)

    def draw(r):
        return r.standard_normal((b, h, n, d)), r.standard_normal((b, hkv, n, d)), r.standard_normal((b, hkv, n, dv))

    def margin(t):
        delta = dynamic_mask_bias(t[2], params, bias_form)[0]
        vis = causal_keep(n, n) if causal else None
        return topk_margin(np.broadcast_to(delta[..., None, :], delta.shape[:-1] + (n, n)), w, vis)

    q, k, v = draw_until(rng, draw, margin, 0.02)
    return Sample(inputs={"q": q, "k": k, "v": v}, params=params,
                  config={"window_size": w, "is_causal": causal, "bias_form": bias_form})


def _sample(rng, size):
    return _draw(rng, size)


def _check_wide_window_is_biased_sdpa(rng):
    s = _draw(rng, "small")
    q, k, v = (s.inputs[x] for x in "qkv")
    cfg = dict(s.config, window_size=q.shape[-2])
    out = dynamic_mask_attention(q, k, v, s.params, **cfg)
    delta = dynamic_mask_bias(v, s.params)[0]
    ref = attention_core_forward(q, k, v, delta[..., None, :], is_causal=cfg["is_causal"])[0]
    err = float(np.max(np.abs(out - ref)))
    assert err < 1e-12, f"window_size >= M differs from SDPA with the dynamic bias by {err}"
    return err


def _check_mask_brute_force(rng):
    s = _draw(rng, "small", hkv=1)
    v = s.inputs["v"]
    _, cache = dynamic_mask_attention_forward(s.inputs["q"], s.inputs["k"], v, s.params, **s.config)
    delta = dynamic_mask_bias(v, s.params)[0]
    bf = _brute_keep(delta, v.shape[-2], s.config["window_size"], s.config["is_causal"])
    assert (cache["keep"] == bf).all(), "dynamic mask differs from the brute-force per-row sort"
    return 0.0


def _check_gradcheck_variants(rng):
    errs = []
    for hkv, form, with_bias in ((1, "exp", False),):
        s = _draw(rng, "tiny", hkv=hkv, bias_form=form, with_bias=with_bias)
        errs.append(fd_max_rel(dynamic_mask_attention_forward, dynamic_mask_attention_backward, s))
    return max(errs)


register(
    Mechanism(
        slug="dynamic_mask_attention", family="4-linear-kernel-sparse", tier="T3",
        title="DMA: trainable dynamic-mask sparse attention",
        paper="Shi, Wu, Wu, Peng, Wang, Liu, Luo, 'Trainable Dynamic Mask Sparse Attention', 2025, arXiv 2508.02124",
        forward=dynamic_mask_attention_forward, backward=dynamic_mask_attention_backward, sample=_sample,
        reference=_reference,
        checks={"window_ge_M_equals_biased_sdpa": _check_wide_window_is_biased_sdpa,
                "mask_equals_brute_force_sort": _check_mask_brute_force,
                "gradcheck_gqa_exp_form_no_bias": _check_gradcheck_variants},
        docs="linear/sparse-attention.md#dynamic-mask-attention",
    ),
)
