r"""TransNormer: NormAttention (linear attention with a norm instead of the row-sum denominator) and
DiagAttention (softmax attention inside non-overlapping blocks), the two attentions of its layers.

Qin, Han, Sun, Li, Kong, Barnes, Zhong, "The Devil in Linear Transformer", EMNLP 2022,
arXiv 2210.10340. Upstream: the ``NormLinearAttention`` module of the authors' fairseq fork
(OpenNLPLab/fairseq-evo, referenced by OpenNLPLab/Transnormer).

NormAttention
-------------
$$O = \mathrm{Norm}\big(\phi(Q)(\phi(K)^\top V)\big),\qquad
O_i = \mathrm{Norm}\Big(\phi(q_i)^\top\sum_{j\le i}\phi(k_j)v_j^\top\Big)\ \text{(causal)},$$

the un-normalised feature-space core of `refattn.attention.linear.core` followed by LayerNorm or
RMSNorm over the concatenated heads (upstream) or each head. Backward: the norm VJP
(`refattn.nn.norms`), then the core's VJP with $\mathrm{den} = 1$ (no quotient rule: $c = 0$),
then the feature-map VJP.

DiagAttention
-------------
$P = \mathrm{softmax}(sQK^\top + \log M)$, $O = PV$ with the block-diagonal mask
$M_{ij} = [\lfloor i/w\rfloor = \lfloor j/w\rfloor]$ (and $j\le i$ when causal), used in
TransNormer's early layers against attention dilution. Backward: $dV = P^\top G$,
$dS = P\odot(GV^\top - \mathrm{rowsum}(P\odot GV^\top))$, $dQ = s\,dS\,K$, $dK = s\,dS^\top Q$.
It is checked inside the ``transnormer_norm_attention`` record (``diag_attention``).

Conventions (who does what) are in `transnormer_forward`: ``feature_map`` (upstream ``act_fun``),
``norm`` (upstream ``norm_type``; its ``"rmsnorm"`` puts eps outside the root), ``norm_over``.
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, check_choice, check_int, check_params, check_positive
from ...nn.norms import layer_norm_backward, layer_norm_forward, rms_norm_backward, rms_norm_forward
from ...nn.softmax import softmax_lse, softmax_vjp
from ...registry import Mechanism, Sample, register
from ._samples import fd_max_rel, random_qkv, softmax_attention_reference
from .core import (
    FEATURE_MAPS,
    feature_map_backward,
    feature_map_forward,
    linear_core_backward,
    linear_core_forward,
    mT,
    validate_linear_qkv,
)

__all__ = [
    "transnormer_forward",
    "transnormer_backward",
    "transnormer",
    "diag_attention_forward",
    "diag_attention_backward",
]

_NORMS = {"layernorm": (layer_norm_forward, layer_norm_backward, ("weight", "bias")),
          "rmsnorm": (rms_norm_forward, rms_norm_backward, ("weight",))}


def transnormer_forward(q, k, v, params=None, *, causal: bool = False, feature_map: str = "elu_plus_one",
                        norm: str = "layernorm", norm_over: str = "concat_heads", norm_eps: float = 1e-5):
    r"""TransNormer NormAttention (Qin et al., "The Devil in Linear Transformer", EMNLP 2022,
    arXiv 2210.10340): linear attention **without** the row-sum denominator, followed by a norm,

    $$O = \mathrm{Norm}\big(\phi(Q)(\phi(K)^\top V)\big),\qquad
    O_i = \mathrm{Norm}\Big(\phi(q_i)^\top\sum_{j\le i}\phi(k_j)v_j^\top\Big)\ \text{(causal)}.$$

    Upstream: the ``NormLinearAttention`` module of the authors' fairseq fork
    (OpenNLPLab/fairseq-evo, referenced by OpenNLPLab/Transnormer): ``q = act(q_proj(x))``,
    ``k = act(k_proj(x))``, ``o1 = k^T v``, ``output = q o1`` (causal: masked ``q k^T`` then
    ``@ v``), heads concatenated, then ``layer_norm`` over the full ``embed_dim`` and
    ``out_proj``. Projections are outside this core.

    Parameters
    ----------
    q (..., N, d), k (..., M, d), v (..., M, dv)
    params : dict or None
        The norm's affine parameters under upstream names ``"layer_norm.weight"`` (and
        ``"layer_norm.bias"`` for LayerNorm), shape ``(H*dv,)`` for ``norm_over="concat_heads"``
        (PyTorch's ``layer_norm.weight`` as-is; head ``h`` owns entries ``h*dv:(h+1)*dv``) or
        ``(dv,)`` for ``"head"``. ``None``: no affine.
    causal : bool
    feature_map : {"elu_plus_one", "identity"}
        The kernel $\phi$. Upstream's ``act_fun`` is configurable (``"1+elu"``, ``"elu"``,
        ``"relu"``, ``"gelu"`` …; constructor default ``"gelu"``); [recon] the transnormer arches'
        setting is not visible in the stored code — ``"elu_plus_one"`` keeps $\phi>0$ and smooth.
    norm : {"layernorm", "rmsnorm"}
        Upstream ``norm_type`` (default ``"layernorm"``; ``"rmsnorm"`` there uses
        ``x / (rms + eps)`` with eps 1e-8 outside the root — refattn's RMSNorm puts eps inside).
    norm_over : {"concat_heads", "head"}
        Statistics over the concatenated heads ($H\,d_v$ values per token; upstream, needs the
        layout ``(B, H, N, dv)``) or over each head's $d_v$ values.
    norm_eps : float
        PyTorch ``LayerNorm`` default 1e-5.

    Notes
    -----
    Backward: the norm VJP (:mod:`refattn.nn.norms`), then the feature-space core without the
    denominator ($\mathrm{den}=1$, no quotient rule), then the feature-map VJP.
    """
    check_choice(norm, "norm", tuple(_NORMS))
    check_choice(norm_over, "norm_over", ("concat_heads", "head"))
    check_choice(feature_map, "feature_map", FEATURE_MAPS)
    norm_eps = check_positive(norm_eps, "norm_eps")
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be a bool; got {type(causal).__name__}")
    q, k, v = validate_linear_qkv(q, k, v, same_length=bool(causal))
    if norm_over == "concat_heads" and q.ndim < 4:
        raise ValueError(f"norm_over='concat_heads' needs q of layout (B, H, N, d); got q of shape {q.shape}")
    fwd, _, keys = _NORMS[norm]
    width = q.shape[-3] * v.shape[-1] if norm_over == "concat_heads" else v.shape[-1]
    nparams = None
    if params is not None:
        spec = {f"layer_norm.{x}": (width,) for x in keys}
        checked = check_params(params, spec, optional=[k for k in spec if k != "layer_norm.weight"],
                               where=f"norm={norm!r}, norm_over={norm_over!r}")
        nparams = {}
        for key, a in checked.items():
            a = a.astype(q.dtype, copy=False)
            if norm_over == "concat_heads":
                a = a.reshape(q.shape[-3], 1, v.shape[-1])
            nparams[key.split(".", 1)[1]] = a
    fq = feature_map_forward(q, feature_map)
    fk = feature_map_forward(k, feature_map)
    h, state = linear_core_forward(fq, fk, v, causal=bool(causal), eps=0.0, normalise=False)
    axis = (-3, -1) if norm_over == "concat_heads" else -1
    out, ncache = fwd(h, nparams, axis=axis, eps=norm_eps)
    return out, {"q": q, "k": k, "v": v, "fq": fq, "fk": fk, "h": h, "state": state, "ncache": ncache,
                 "norm": norm, "causal": bool(causal), "feature_map": feature_map,
                 "param_shapes": None if params is None else {key: np.shape(params[key]) for key in params}}


def transnormer_backward(dout, cache):
    r"""Gradients ``{"q", "k", "v"}`` (+ ``"layer_norm.weight"``/``"layer_norm.bias"``) of
    :func:`transnormer_forward`: norm VJP, core VJP with $\mathrm{den}=1$, feature-map VJP."""
    h = cache["h"]
    g = as_dout(dout, h.shape, h.dtype)
    ng = _NORMS[cache["norm"]][1](g, cache["ncache"])
    dfq, dfk, dv = linear_core_backward(ng["x"], cache["fq"], cache["fk"], cache["v"], h, cache["state"],
                                  causal=cache["causal"], normalise=False)
    fm = cache["feature_map"]
    grads = {"q": feature_map_backward(dfq, cache["q"], fm), "k": feature_map_backward(dfk, cache["k"], fm),
             "v": dv}
    for key, shape in (cache["param_shapes"] or {}).items():
        grads[key] = np.asarray(ng[key.split(".", 1)[1]]).reshape(shape)
    return grads


def transnormer(q, k, v, params=None, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`transnormer_forward`."""
    return transnormer_forward(q, k, v, params, **config)[0]


def diag_attention_forward(q, k, v, *, block_size: int, causal: bool = False, scale: float | None = None):
    r"""TransNormer DiagAttention: softmax attention restricted to non-overlapping blocks of
    ``block_size`` consecutive positions (block-diagonal mask, optionally causal inside blocks),

    $P = \mathrm{softmax}(sQK^\top + \log M)$, $O = PV$, $M_{ij} = [\lfloor i/w\rfloor =
    \lfloor j/w\rfloor]$ (and $j\le i$), $s = 1/\sqrt d$ by default. Used in TransNormer's early
    layers against attention dilution. Dense reference with an $N\times N$ mask.

    Backward: $dV = P^\top G$, $dS = P\odot(GV^\top - \mathrm{rowsum}(P\odot GV^\top))$,
    $dQ = s\,dS\,K$, $dK = s\,dS^\top Q$.
    """
    w = check_int(block_size, "block_size", minimum=1)
    q, k, v = validate_linear_qkv(q, k, v, same_length=True)
    scale = check_positive(scale, "scale", allow_none=True)
    s = q.shape[-1] ** -0.5 if scale is None else scale
    n = q.shape[-2]
    blk = np.arange(n) // w
    keep = blk[:, None] == blk[None, :]
    if causal:
        keep &= np.tri(n, dtype=bool)
    S = np.where(keep, s * (q @ mT(k)), -np.inf)
    P, _ = softmax_lse(S, axis=-1)
    out = P @ v
    return out, {"q": q, "k": k, "v": v, "P": P, "s": s, "out_shape": out.shape}


def diag_attention_backward(dout, cache):
    """Gradients ``{"q", "k", "v"}`` of :func:`diag_attention_forward` (see its docstring)."""
    P, q, k, v, s = cache["P"], cache["q"], cache["k"], cache["v"], cache["s"]
    g = as_dout(dout, cache["out_shape"], P.dtype)
    dS = softmax_vjp(P, g @ mT(v), axis=-1)
    return {"q": s * (dS @ k), "k": s * (mT(dS) @ q), "v": mT(P) @ g}


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _explicit(fq, fk, v, *, causal: bool, eps: float, normalise: bool = True):
    """The explicit $O(N^2)$ form $\\mathrm{diag}(A1+\\epsilon)^{-1}AV$, $A = \\Phi_Q\\Phi_K^\\top$."""
    A = fq @ mT(fk)
    if causal:
        A = np.tril(A)
    num = A @ v
    if not normalise:
        return num
    return num / (np.sum(A, axis=-1, keepdims=True) + eps)


def _sample_transnormer(rng, size):
    q, k, v = random_qkv(rng, size)
    causal = bool(rng.integers(0, 2))
    width = q.shape[1] * v.shape[-1]
    params = {"layer_norm.weight": 1.0 + 0.3 * rng.standard_normal(width),
              "layer_norm.bias": 0.3 * rng.standard_normal(width)}
    return Sample(inputs={"q": q, "k": k, "v": v}, params=params, config={"causal": causal})


def _transnormer_reference(q, k, v, params=None, *, causal=False, feature_map="elu_plus_one",
                           norm="layernorm", norm_over="concat_heads", norm_eps=1e-5):
    q, k, v = validate_linear_qkv(q, k, v, same_length=causal)
    h = _explicit(feature_map_forward(q, feature_map), feature_map_forward(k, feature_map), v,
                  causal=causal, eps=0.0, normalise=False)
    ax = (-3, -1) if norm_over == "concat_heads" else (-1,)
    mu = h.mean(axis=ax, keepdims=True) if norm == "layernorm" else 0.0
    var = ((h - mu) ** 2).mean(axis=ax, keepdims=True)
    y = (h - mu) / np.sqrt(var + norm_eps)
    if params:
        shp = (q.shape[-3], 1, v.shape[-1]) if norm_over == "concat_heads" else (v.shape[-1],)
        y = y * params["layer_norm.weight"].reshape(shp)
        if "layer_norm.bias" in params:
            y = y + params["layer_norm.bias"].reshape(shp)
    return y


def _check_transnormer_scale_invariance(rng):
    """The norm absorbs a positive rescaling of phi(Q) (identity map, scaled non-negative q):
    without affine and with a tiny norm eps the output is unchanged."""
    q, k, v = random_qkv(rng, "small")
    q, k = np.abs(q) + 0.1, np.abs(k) + 0.1
    kw = {"feature_map": "identity", "norm_eps": 1e-12, "norm_over": "head"}
    a = transnormer(q, k, v, **kw)
    b = transnormer(3.7 * q, k, v, **kw)
    err = float(np.max(np.abs(a - b)))
    assert err < 1e-8, f"not invariant to rescaling phi(Q): {err}"
    return err


def _check_transnormer_fd_variants(rng):
    errs = []
    for causal, norm, over in ((True, "rmsnorm", "head"), (False, "layernorm", "head"),
                               (True, "layernorm", "concat_heads")):
        # dv = 3: a LayerNorm over 2 values is nearly a sign function (ill-conditioned FD)
        q, k, v = random_qkv(rng, "tiny", dv=3)
        width = v.shape[-1] if over == "head" else q.shape[1] * v.shape[-1]
        params = {"layer_norm.weight": 1.0 + 0.2 * rng.standard_normal(width)}
        s = Sample(inputs={"q": q, "k": k, "v": v}, params=params,
                   config={"causal": causal, "norm": norm, "norm_over": over})
        errs.append(fd_max_rel(transnormer_forward, transnormer_backward, s))
        s = Sample(inputs={"q": q, "k": k, "v": v}, config={"causal": causal, "norm": norm, "norm_over": over})
        errs.append(fd_max_rel(transnormer_forward, transnormer_backward, s))
    return max(errs)


def _check_diag_attention(rng):
    """DiagAttention: FD gradcheck (causal and not); block_size >= N equals full softmax attention;
    block_size 1 returns v."""
    errs = []
    for causal in (False, True):
        q, k, v = random_qkv(rng, "tiny")
        s = Sample(inputs={"q": q, "k": k, "v": v}, config={"block_size": 2, "causal": causal})
        errs.append(fd_max_rel(diag_attention_forward, diag_attention_backward, s))
    q, k, v = random_qkv(rng, "small")
    full, _ = diag_attention_forward(q, k, v, block_size=q.shape[-2])
    e1 = float(np.max(np.abs(full - softmax_attention_reference(q, k, v))))
    one, _ = diag_attention_forward(q, k, v, block_size=1)
    e2 = float(np.max(np.abs(one - v)))
    assert e1 < 1e-12 and e2 < 1e-12, (e1, e2)
    return max(errs + [e1, e2])


register(
    Mechanism(
        slug="transnormer_norm_attention", family="4-linear-kernel-sparse", tier="T1",
        title="TransNormer NormAttention (norm instead of the denominator) and DiagAttention",
        paper="Qin, Han, Sun, Li, Kong, Barnes, Zhong, 'The Devil in Linear Transformer', EMNLP 2022, "
              "arXiv 2210.10340",
        forward=transnormer_forward, backward=transnormer_backward, sample=_sample_transnormer,
        reference=_transnormer_reference,
        checks={"invariant_to_rescaled_query_features": _check_transnormer_scale_invariance,
                "gradcheck_variants": _check_transnormer_fd_variants,
                "diag_attention": _check_diag_attention},
        docs="linear-attention.md#transnormer",
    ),
)
