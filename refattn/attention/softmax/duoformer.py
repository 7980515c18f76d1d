r"""DuoFormer: scale-wise attention inside each patch, patch-wise attention across patches.

Paper: Tang, Zhang, Ho, Knudsen, Tasdizen, "DuoFormer: Leveraging Hierarchical Visual Representations
by Local and Global Attention", MIDL 2025 (PMLR 301), arXiv 2506.12982. Official repository xiaoyatang/DuoFormer (not
reachable here); the code read is the authors' release copy AliSerwat/duoformer_TCGA
``models/multiscale_attn.py`` and ``models/multi_vision_transformer.py``
@3b207c2a122b557566366bff6cfb08fa61fef033 (``MultiScaleAttention``, a subclass of timm 0.9's
``Attention``; ``MultiscaleBlock``; ``MultiscaleTransformer.forward``).

Tokens
------
A CNN backbone gives features at several scales; every patch (region) $p$ of the coarsest map
collects its tokens from all scales: $1 + 4 + 16 + \dots$ tokens ($S$ = 2, 6, 22, 86 for 2–4 scales,
the first a patch token), projected to width $C$: ``x (B, P, S, C)``. The tokenisation is
the backbone's and is not part of this layer.

Scale-wise attention (``forward_with_scale``)
---------------------------------------------
Per patch, multi-head attention over its $S$ scale tokens (local), with the layer's first set of
projections ``qkv1`` (``(C, 3C)``, torch ``weight.T``) and ``proj1``:

$$Y_{p} = \mathrm{MHA}_{\mathrm{qkv1},\,\mathrm{proj1}}\big(x_{p,1..S}\big),\qquad
\mathrm{softmax}\big(s\,Q_hK_h^\top\big),\quad s = 2/\sqrt{C}.$$

Note the scale: the code sets ``self.scale = 2 * dim ** -0.5`` with ``dim`` the *embedding* width
$C$ (not $d^{-1/2}$ with the head width); ``scale`` overrides it.

Patch-wise attention (``forward_with_region``)
----------------------------------------------
The first scale token of every patch, $z_p = x_{p,0}$, optionally preceded by a class token and
plus a positional embedding (``pos_embed``, the ViT's, here an optional parameter of shape
``(1, P[+1], C)``), attends over the patches (global) with the second projections ``qkv``/``proj``
and the same scale: output ``(B, [1+]P, C)``.

``stage`` picks ``"scale"``, ``"patch"`` or ``"both"`` (patch-wise attention applied to the
scale-wise output: the axial composition of the catalogue; **reconstruction**, since the model
puts full pre-norm blocks, LayerScale and an MLP around the scale-wise attention and stacks twelve
of them before the patch stage). In the released model the patch stage has no residual or MLP:
block 0 applies ``forward_with_region`` with the class token and ``pos_embed``, and each later block
reapplies its own region attention to block 0's output, of which only the last block's class token
is read (as written in ``MultiscaleTransformer.forward``); that wiring is model-level and is not
reproduced. With timm >= 1.0, ``MultiScaleAttention.__init__``'s positional arguments no longer
line up with ``Attention``'s (the layer breaks); timm 0.9 is the version the code was written for.

Backward
--------
Two batched attentions and reshapes: the attention VJP of the core
(`refattn.attention.softmax.attention_core_backward`) for each, `refattn.nn.linear.linear_vjp` for the
projections; selecting the first scale token is a gather whose VJP scatters into
$dx_{:, :, 0}$ (the other scale tokens get gradient only through the scale stage).
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_choice, check_params, check_positive, compute_dtype
from ...nn.linear import linear_apply, linear_vjp, merge_heads, split_heads
from ...registry import Mechanism, Sample, register
from .core import attention_core_backward, attention_core_forward, check_size

__all__ = [
    "DUOFORMER_STAGES",
    "duoformer_param_spec",
    "init_duoformer_params",
    "duoformer_attention_forward",
    "duoformer_attention_backward",
    "duoformer_attention",
]

DUOFORMER_STAGES = ("scale", "patch", "both")


def duoformer_param_spec(dim: int, *, stage: str = "both", num_tokens=None) -> tuple[dict, tuple]:
    """``(spec, optional)``: ``qkv1``/``proj1`` (scale stage), ``qkv``/``proj`` (patch stage) and the
    optional ``pos_embed (1, num_tokens, C)`` (``num_tokens`` = patches [+ 1 with a class token])."""
    check_choice(stage, "stage", DUOFORMER_STAGES)
    c = dim
    spec, optional = {}, []
    for sfx, st in (("1", "scale"), ("", "patch")):
        if stage in (st, "both"):
            spec.update({f"qkv{sfx}.weight": (c, 3 * c), f"qkv{sfx}.bias": (3 * c,), f"proj{sfx}.weight": (c, c),
                         f"proj{sfx}.bias": (c,)})
            optional += [f"qkv{sfx}.bias", f"proj{sfx}.bias"]
    if stage != "scale":
        spec["pos_embed"] = (1, num_tokens or 1, c)
        optional.append("pos_embed")
    return spec, tuple(optional)


def init_duoformer_params(rng, dim: int, *, stage: str = "both", qkv_bias: bool = True, num_tokens=None) -> dict:
    """Random parameters (weights $U(\\pm1/\\sqrt C)$, biases $0.1\\mathcal N$; ``pos_embed`` when ``num_tokens``)."""
    spec, _ = duoformer_param_spec(dim, stage=stage, num_tokens=num_tokens)
    p = {}
    for k, shp in spec.items():
        if (k.startswith("qkv") and k.endswith("bias") and not qkv_bias) or (k == "pos_embed" and num_tokens is None):
            continue
        p[k] = rng.uniform(-1, 1, shp) / np.sqrt(shp[0]) if len(shp) == 2 else 0.1 * rng.standard_normal(shp)
    return p


def _mha(x, p, sfx, nh, s):
    c = x.shape[-1]
    qkv = linear_apply(x, p[f"qkv{sfx}.weight"], p.get(f"qkv{sfx}.bias"))
    q, k, v = (split_heads(qkv[..., i * c:(i + 1) * c], nh) for i in range(3))
    o, core = attention_core_forward(q, k, v, scale=s)
    om = merge_heads(o)
    return linear_apply(om, p[f"proj{sfx}.weight"], p.get(f"proj{sfx}.bias")), (x, core, om, sfx)


def _mha_vjp(g, p, cache, nh, grads):
    x, core, om, sfx = cache
    lo = linear_vjp(g, om, p[f"proj{sfx}.weight"], f"proj{sfx}.bias" in p)
    grads[f"proj{sfx}.weight"] = lo["weight"]
    if f"proj{sfx}.bias" in p:
        grads[f"proj{sfx}.bias"] = lo["bias"]
    gc = attention_core_backward(split_heads(lo["x"], nh), core)
    dqkv = np.concatenate([merge_heads(gc[n]) for n in ("q", "k", "v")], axis=-1)
    lq = linear_vjp(dqkv, x, p[f"qkv{sfx}.weight"], f"qkv{sfx}.bias" in p)
    grads[f"qkv{sfx}.weight"] = lq["weight"]
    if f"qkv{sfx}.bias" in p:
        grads[f"qkv{sfx}.bias"] = lq["bias"]
    return lq["x"]


def duoformer_attention_forward(x, cls_token=None, params=None, *, num_heads: int, stage: str = "both", scale=None):
    r"""DuoFormer's scale-wise and/or patch-wise attention (``MultiScaleAttention``; see the module docstring).

    Parameters
    ----------
    x : array (B, P, S, C)
        Scale tokens per patch (``stage="patch"`` also takes ``(B, P, C)``: one token per patch).
    cls_token : array (B, 1, C), optional
        Prepended to the patch tokens in the patch stage.
    params : dict
        Keys of `duoformer_param_spec` (biases and ``pos_embed`` optional).
    num_heads : int
    stage : {"scale", "patch", "both"}
    scale : float, optional
        Default $2/\sqrt C$ (the code's ``2 * dim ** -0.5``).

    Returns
    -------
    out, cache
        ``(B, P, S, C)`` for ``"scale"``; ``(B, [1+]P, C)`` otherwise.
    """
    check_choice(stage, "stage", DUOFORMER_STAGES)
    x = as_float(x, "x", ndim=3 if (stage == "patch" and np.ndim(x) == 3) else 4)
    b, c = x.shape[0], x.shape[-1]
    nh = check_size(num_heads, "num_heads")
    if c % nh:
        raise ValueError(f"channels of x ({c}) must be divisible by num_heads ({nh})")
    scale = check_positive(scale, "scale", allow_none=True)
    s = float(2.0 * c ** -0.5) if scale is None else scale
    if cls_token is not None:
        if stage == "scale":
            raise ValueError("cls_token is only used by the patch stage (stage='patch' or 'both')")
        cls_token = as_float(cls_token, "cls_token", ndim=3)
        if cls_token.shape != (b, 1, c):
            raise ValueError(f"cls_token must have shape (B, 1, C) = {(b, 1, c)}; got {cls_token.shape}")
    ntok = x.shape[1] + (cls_token is not None)
    spec, optional = duoformer_param_spec(c, stage=stage, num_tokens=ntok)
    p = check_params(params, spec, optional=optional, where=f"duoformer_attention (stage={stage!r})")
    dt = compute_dtype(x, *(() if cls_token is None else (cls_token,)), *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    cache = {"p": p, "nh": nh, "stage": stage, "x_shape": x.shape, "cls": cls_token is not None}
    y = x
    if stage in ("scale", "both"):
        y, cache["scale"] = _mha(x, p, "1", nh, s)
    if stage in ("patch", "both"):
        z = y[:, :, 0] if y.ndim == 4 else y                              # the first scale token of each patch
        if cls_token is not None:
            z = np.concatenate([cls_token.astype(dt, copy=False), z], axis=1)
        if "pos_embed" in p:
            z = z + p["pos_embed"]
        y, cache["patch"] = _mha(z, p, "", nh, s)
    cache["shape"] = y.shape
    return y, cache


def duoformer_attention_backward(dout, cache):
    """Gradient of :func:`duoformer_attention_forward`: ``x`` (and ``cls_token``) and every parameter."""
    p, nh = cache["p"], cache["nh"]
    g = as_dout(dout, cache["shape"], next(iter(p.values())).dtype)
    grads, out = {}, {}
    if "patch" in cache:
        dz = _mha_vjp(g, p, cache["patch"], nh, grads)
        if "pos_embed" in p:
            grads["pos_embed"] = dz.sum(0, keepdims=True)
        if cache["cls"]:
            out["cls_token"], dz = dz[:, :1], dz[:, 1:]
        if len(cache["x_shape"]) == 4:
            g = np.zeros(cache["x_shape"], dtype=dz.dtype)
            g[:, :, 0] = dz
        else:
            g = dz
    if "scale" in cache:
        g = _mha_vjp(g, p, cache["scale"], nh, grads)
    return {"x": g, **out, **{k: grads[k] for k in p}}


def duoformer_attention(x, cls_token=None, params=None, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`duoformer_attention_forward`."""
    return duoformer_attention_forward(x, cls_token, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size, stage=None):
    stage = stage or str(rng.choice(DUOFORMER_STAGES))
    b, pp, ss, c, nh = (2, 3, 2, 4, 2) if size == "tiny" else (2, int(rng.integers(3, 6)), 6, 6, 3)
    use_cls = stage != "scale" and rng.random() < 0.6
    inputs = {"x": rng.standard_normal((b, pp, ss, c))}
    if use_cls:
        inputs["cls_token"] = rng.standard_normal((b, 1, c))
    ntok = pp + use_cls if (stage != "scale" and rng.random() < 0.6) else None
    p = init_duoformer_params(rng, c, stage=stage, qkv_bias=bool(rng.random() < 0.7), num_tokens=ntok)
    return Sample(inputs=inputs, params=p, config={"num_heads": nh, "stage": stage})


def _block_masked(tokens, p, sfx, nh, s, keep):
    # global multi-head attention over the given tokens with a boolean keep mask (N, N)
    from .core import naive_attention
    c = tokens.shape[-1]
    qkv = tokens @ p[f"qkv{sfx}.weight"] + p.get(f"qkv{sfx}.bias", 0.0)
    q, k, v = (split_heads(qkv[..., i * c:(i + 1) * c], nh) for i in range(3))
    o = merge_heads(naive_attention(q, k, v, keep=keep, scale=s))
    return o @ p[f"proj{sfx}.weight"] + p.get(f"proj{sfx}.bias", 0.0)


def _reference(x, cls_token=None, params=None, *, num_heads, stage="both", scale=None):
    # The axial attentions as global attention over all tokens with block masks: scale stage = tokens of
    # one patch see each other; patch stage = the first scale tokens (and the class token) see each other.
    p = params
    c = x.shape[-1]
    s = 2.0 * c ** -0.5 if scale is None else scale
    y = x
    if stage in ("scale", "both"):
        b, pp, ss, _ = x.shape
        patch = np.repeat(np.arange(pp), ss)
        y = _block_masked(x.reshape(b, pp * ss, c), p, "1", num_heads, s,
                          patch[:, None] == patch[None]).reshape(x.shape)
    if stage == "scale":
        return y
    tok = y.reshape(y.shape[0], -1, c) if y.ndim == 4 else y
    first = np.arange(tok.shape[1]) % (y.shape[2] if y.ndim == 4 else 1) == 0
    if cls_token is not None:
        tok, first = np.concatenate([cls_token, tok], 1), np.concatenate([[True], first])
    if "pos_embed" in p:
        tok = tok.copy()
        tok[:, first] += p["pos_embed"][0]
    out = _block_masked(tok, p, "", num_heads, s, first[:, None] & first[None])
    return out[:, first]


def _check_scale_stage_is_per_patch(rng):
    # Perturbing the tokens of one patch changes only that patch's scale-stage output.
    s = _sample(rng, "small", "scale")
    x = s.inputs["x"]
    y = duoformer_attention(x, params=s.params, **s.config)
    x2 = x.copy()
    x2[:, 1] += 1.0
    d = np.abs(duoformer_attention(x2, params=s.params, **s.config) - y).max(axis=(0, 2, 3))
    assert d[1] > 0 and np.delete(d, 1).max() == 0.0, d
    return 0.0


def _check_patch_stage_reads_first_token(rng):
    # The patch stage reads only scale token 0 of each patch: its gradient on the others is exactly 0.
    s = _sample(rng, "small", "patch")
    y, c = duoformer_attention_forward(**s.inputs, params=s.params, **s.config)
    g = duoformer_attention_backward(rng.standard_normal(y.shape), c)["x"]
    err = float(np.abs(g[:, :, 1:]).max())
    assert err == 0.0 and np.abs(g[:, :, 0]).max() > 0, err
    return err


register(
    Mechanism(
        slug="duoformer_scale_wise_attention", family="1-softmax", tier="T2",
        title="DuoFormer scale-wise + patch-wise attention",
        paper="Tang, Zhang, Ho, Knudsen, Tasdizen, DuoFormer: Leveraging Hierarchical Visual Representations by Local "
              "and Global Attention, MIDL 2025 (PMLR 301), arXiv 2506.12982",
        forward=duoformer_attention_forward, backward=duoformer_attention_backward, sample=_sample,
        reference=_reference, docs="softmax/vision-attention.md#duoformer-scale-wise-attention",
        checks={"scale_stage_is_per_patch": _check_scale_stage_is_per_patch,
                "patch_stage_reads_first_token": _check_patch_stage_reads_first_token},
    ),
)
