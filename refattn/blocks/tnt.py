r"""Transformer-in-Transformer (TNT) block: an inner block over the words of each patch, merged into
the outer block over the patches.

Han, Xiao, Wu, Guo, Xu, Wang, "Transformer in Transformer", NeurIPS 2021, arXiv 2103.00112.
Upstream: huawei-noah/CV-Backbones ``tnt_pytorch/tnt.py`` (``Block``, ``Attention``, ``Mlp``) @
25531f7fdcf61e300b47c52ba80973d0af8bb011.

Forward
-------
An image is cut into $n$ patches ("visual sentences"), each patch into $m$ sub-patches ("visual
words"). Inner tokens $Y \in \mathbb R^{B\times n\times m\times c}$ (upstream stores them as
``(B*n, m, c)``), outer tokens $Z\in\mathbb R^{B\times(n_{cls}+n)\times C}$ (a class token first).
One block is

$$Y' = Y + A_{in}(N_1Y),\qquad Y'' = Y' + \mathrm{MLP}_{in}(N_2Y')\qquad\text{(per patch, over its } m \text{ words)},$$
$$Z_{n_{cls}+i} \leftarrow Z_{n_{cls}+i} + N_{p2}\big(N_{p1}(\mathrm{vec}(Y''_i))\,W + b\big)\qquad (i = 1..n),$$
$$Z' = Z + A_{out}(N_3Z),\qquad Z'' = Z' + \mathrm{MLP}_{out}(N_4Z'),$$

$\mathrm{vec}(Y''_i)$ the row-major flattening of patch $i$'s $m\times c$ words (upstream
``inner_tokens.reshape(B, N-1, -1)``), $N$ LayerNorms, GELU MLPs. The block returns $(Y'', Z'')$.
$A_{in}$, $A_{out}$ are token mixers (see `refattn.blocks.core`), default
``"multi_head_attention"`` — upstream's ``Attention`` is multi-head attention with a fused
``qk`` projection (``q_proj = qk.weight[:c].T``, ``k_proj = qk.weight[c:].T``), ``v``, ``proj``
and ``qkv_bias=False``; scale $d^{-1/2}$; not causal.

Backward
--------
$dZ' = J_{out\text{-}block}^\top dZ''$ (the pre-norm block VJP, attention through its own
backward); $dZ = dZ'$; the merge: $de_i = dZ'_{n_{cls}+i}$, $N_{p2}^\top$, $dW = \sum h^\top de$,
$N_{p1}^\top$, then $\mathrm{vec}^{-1}$ (the adjoint of a reshape is the inverse reshape) added to
the upstream gradient of $Y''$; $dY = J_{in\text{-}block}^\top dY''$. The class token receives no
word gradient.

Conventions
-----------
``cls_tokens`` (1: upstream always prepends one class token; 0 for none), ``activation``
(``"gelu"``, ``nn.GELU``), ``eps`` (1e-5, ``nn.LayerNorm``), ``outputs`` (``"both"`` as upstream;
``"outer"`` returns only $Z''$, the form the registry's generated tests use, whose gradient still
reaches every inner parameter through the merge). Not reproduced: stochastic depth, dropout, the
optional SE module (``se > 0``), the patch/word embedding (``PatchEmbed``) and the position
embeddings (outside the block).

Agreement with upstream
-----------------------
Upstream ``Block`` (``timm`` stubbed) in float64 on CPU: both outputs and the gradients of both
inputs and every parameter agree to $1.7\times10^{-15}$.
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_choice, check_int, check_positive
from ..nn.linear import linear_prefixed, linear_prefixed_spec, linear_prefixed_vjp
from ..registry import Mechanism, Sample, register
from .core import (
    ACTIVATIONS,
    BlockNames,
    add_prefix,
    block_dtype,
    init_attention_params,
    norm_backward,
    norm_forward,
    norm_spec,
    param_dim,
    resolve_sublayer,
    split_block_params,
    transformer_block_backward,
    transformer_block_forward,
    transformer_block_spec,
)

__all__ = ["tnt_block_forward", "tnt_block_backward", "tnt_block", "TNT_INNER", "TNT_OUTER"]

TNT_INNER = BlockNames(norm1="inner_norm1", norm2="inner_norm2", fc1="inner_mlp.fc1", fc2="inner_mlp.fc2")
TNT_OUTER = BlockNames(norm1="outer_norm1", norm2="outer_norm2", fc1="outer_mlp.fc1", fc2="outer_mlp.fc2")


def tnt_block_forward(inner, outer, params, *, attention=None, inner_attention_config=None,
                      outer_attention_config=None, cls_tokens: int = 1, activation: str = "gelu", eps: float = 1e-5,
                      outputs: str = "both"):
    r"""TNT block (module docstring).

    Parameters
    ----------
    inner : array (B, n, m, c)
        Word tokens, patch by patch (upstream ``(B*n, m, c)``: ``inner.reshape(B, n, m, c)``).
    outer : array (B, n_cls + n, C)
        Sentence tokens, class token(s) first.
    params : dict
        Upstream names (linear weights ``(in, out)`` = PyTorch ``weight.T``):
        ``"inner_norm1.*"``, ``"inner_norm2.*"`` ``(c,)``, ``"inner_mlp.fc1.weight" (c, F_in)``,
        ``"inner_mlp.fc2.weight" (F_in, c)``, ``"proj_norm1.*" (m*c,)``, ``"proj.weight" (m*c, C)``
        (optional ``"proj.bias"``; upstream has none), ``"proj_norm2.*" (C,)``, ``"outer_norm1.*"``,
        ``"outer_norm2.*"`` ``(C,)``, ``"outer_mlp.fc1.weight" (C, F_out)``,
        ``"outer_mlp.fc2.weight" (F_out, C)`` (MLP biases optional), and the attentions' keys under
        ``"inner_attn."`` and ``"outer_attn."``.
    attention : str, (forward, backward) or Sublayer, optional
        The token mixer of both blocks; default ``"multi_head_attention"``.
    inner_attention_config, outer_attention_config : dict, optional
        Their configs (``{"num_heads": 4}`` and ``{"num_heads": 6}`` in TNT-S).
    cls_tokens : int
    activation : {"relu", "gelu", "gelu_tanh", "silu"}
    eps : float
    outputs : {"both", "outer"}

    Returns
    -------
    (inner'', outer'') or outer'', cache
    """
    inner = as_float(inner, "inner", ndim=4)
    outer = as_float(outer, "outer", ndim=3)
    ncls = check_int(cls_tokens, "cls_tokens", minimum=0)
    check_choice(activation, "activation", ACTIVATIONS)
    check_choice(outputs, "outputs", ("both", "outer"))
    eps = check_positive(eps, "eps", allow_zero=True)
    b, n, m, c = inner.shape
    if outer.shape[0] != b or outer.shape[1] != n + ncls:
        raise ValueError(f"outer must have shape (B={b}, cls_tokens + n = {ncls + n}, C) for inner of shape "
                         f"{inner.shape}; got {outer.shape}")
    big_c = outer.shape[-1]
    spec_attn = "multi_head_attention" if attention is None else attention
    a_in = resolve_sublayer(spec_attn, prefix="inner_attn", config=inner_attention_config, name="attention")
    a_out = resolve_sublayer(spec_attn, prefix="outer_attn", config=outer_attention_config, name="attention")
    f_in = param_dim(params, "inner_mlp.fc1.weight", 1, where="tnt_block", shape=("c", "F_in"))
    f_out = param_dim(params, "outer_mlp.fc1.weight", 1, where="tnt_block", shape=("C", "F_out"))
    spec = transformer_block_spec(TNT_INNER, c, f_in)
    spec.update(transformer_block_spec(TNT_OUTER, big_c, f_out))
    spec.update(norm_spec("proj_norm1", m * c))
    spec.update(linear_prefixed_spec("proj", m * c, big_c))
    spec.update(norm_spec("proj_norm2", big_c))
    optional = [k for k in spec if k.endswith(".bias") and ("mlp" in k or k == "proj.bias")]
    own, (ap_in, ap_out) = split_block_params(params, spec, (a_in, a_out), optional=optional, where="tnt_block")
    dt = block_dtype(inner, own, (ap_in, ap_out))
    dt = np.result_type(dt, outer.dtype)
    inner, outer = inner.astype(dt, copy=False), outer.astype(dt, copy=False)
    own, ap_in, ap_out = cast_all(dt, own), cast_all(dt, ap_in), cast_all(dt, ap_out)
    y, c_in = transformer_block_forward(inner, own, a_in, ap_in, names=TNT_INNER, eps=eps, activation=activation)
    h1, c_p1 = norm_forward(own, "proj_norm1", y.reshape(b, n, m * c), eps=eps)
    e, c_p2 = norm_forward(own, "proj_norm2", linear_prefixed(own, "proj", h1), eps=eps)
    z = outer.copy()
    z[:, ncls:] += e
    zo, c_out = transformer_block_forward(z, own, a_out, ap_out, names=TNT_OUTER, eps=eps, activation=activation)
    cache = {"params": own, "c_in": c_in, "c_p1": c_p1, "h1": h1, "c_p2": c_p2, "c_out": c_out, "ncls": ncls,
             "outputs": outputs, "inner_shape": inner.shape, "outer_shape": outer.shape, "dtype": dt}
    return ((y, zo) if outputs == "both" else zo), cache


def tnt_block_backward(dout, cache):
    r"""Gradients of `tnt_block_forward` for ``inner``, ``outer`` and every params key.

    ``dout`` is ``(d_inner, d_outer)`` for ``outputs="both"`` (either may be None: no upstream
    gradient) and ``d_outer`` for ``outputs="outer"``.
    """
    own, dt, ncls = cache["params"], cache["dtype"], cache["ncls"]
    b, n, m, c = cache["inner_shape"]
    if cache["outputs"] == "both":
        if not isinstance(dout, (tuple, list)) or len(dout) != 2:
            raise TypeError("dout must be a pair (d_inner, d_outer) for outputs='both'")
        d_in, d_out = dout
        d_in = np.zeros(cache["inner_shape"], dt) if d_in is None else as_dout(d_in, cache["inner_shape"], dt,
                                                                                 name="dout[0]")
        d_out = np.zeros(cache["outer_shape"], dt) if d_out is None else as_dout(d_out, cache["outer_shape"], dt,
                                                                                   name="dout[1]")
    else:
        d_in = np.zeros(cache["inner_shape"], dt)
        d_out = as_dout(dout, cache["outer_shape"], dt)
    grads = {}
    dz = transformer_block_backward(grads, own, d_out, cache["c_out"])
    de = norm_backward(grads, own, dz[:, ncls:], cache["c_p2"])
    dh1 = linear_prefixed_vjp(grads, own, "proj", de, cache["h1"])
    dy = d_in + norm_backward(grads, own, dh1, cache["c_p1"]).reshape(b, n, m, c)
    grads["inner"] = transformer_block_backward(grads, own, dy, cache["c_in"])
    grads["outer"] = dz
    return grads


def tnt_block(inner, outer, params, **config):
    """Convenience wrapper: the output of `tnt_block_forward` (a pair for ``outputs="both"``)."""
    return tnt_block_forward(inner, outer, params, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _params(rng, m, c, big_c, f_in, f_out, attention, h_in, h_out, bias):
    p = {}
    for names, w, f in ((TNT_INNER, c, f_in), (TNT_OUTER, big_c, f_out)):
        for nm in (names.norm1, names.norm2):
            p[f"{nm}.weight"] = 1.0 + 0.2 * rng.standard_normal(w)
            p[f"{nm}.bias"] = 0.1 * rng.standard_normal(w)
        p.update({f"{names.fc1}.weight": rng.standard_normal((w, f)) / np.sqrt(w), f"{names.fc1}.bias": 0.3 * rng.standard_normal(f),
                  f"{names.fc2}.weight": rng.standard_normal((f, w)) / np.sqrt(f), f"{names.fc2}.bias": 0.1 * rng.standard_normal(w)})
    for nm, w in (("proj_norm1", m * c), ("proj_norm2", big_c)):
        p[f"{nm}.weight"] = 1.0 + 0.2 * rng.standard_normal(w)
        p[f"{nm}.bias"] = 0.1 * rng.standard_normal(w)
    p["proj.weight"] = rng.standard_normal((m * c, big_c)) / np.sqrt(m * c)
    ai, ci = init_attention_params(rng, attention, c, h_in, bias=bias)
    ao, co = init_attention_params(rng, attention, big_c, h_out, bias=bias)
    p.update(add_prefix(ai, "inner_attn"))
    p.update(add_prefix(ao, "outer_attn"))
    return p, ci, co


def _sample(rng, size, attention="multi_head_attention", outputs="outer"):
    if size == "tiny":
        n, m, c, big_c, f_in, f_out, h_in, h_out = 2, 2, 3, 4, 3, 3, 1, 1
        if attention == "diff_attention_v1":
            c = 4
    else:
        n, m, c, big_c, f_in, f_out, h_in, h_out = int(rng.integers(3, 5)), 4, 4, 8, 8, 16, 1, 2
    p, ci, co = _params(rng, m, c, big_c, f_in, f_out, attention, h_in, h_out, bias=size != "tiny")
    cfg = {"attention": attention, "inner_attention_config": ci, "outer_attention_config": co, "outputs": outputs}
    return Sample(inputs={"inner": rng.standard_normal((2, n, m, c)), "outer": rng.standard_normal((2, n + 1, big_c))},
                  params=p, config=cfg)


def _reference(inner, outer, params, attention=None, inner_attention_config=None, outer_attention_config=None,
               cls_tokens=1, activation="gelu", eps=1e-5, outputs="both"):
    # Upstream's Block.forward written out; the word-to-sentence flattening as an explicit concatenation.
    from .. import registry
    from ..nn.norms import layer_norm
    from .core import activation_functions

    p, act = params, activation_functions(activation)[0]
    ln = lambda v, k: layer_norm(v, {"weight": p[f"{k}.weight"], "bias": p[f"{k}.bias"]}, eps=eps)  # noqa: E731
    attn = registry.get(attention or "multi_head_attention").forward

    def block(v, names, pre, cfg):
        sub = {k[len(pre) + 1:]: w for k, w in p.items() if k.startswith(pre + ".")}
        v = v + attn(ln(v, names.norm1), params=sub, **(cfg or {}))[0]
        hid = act(ln(v, names.norm2) @ p[f"{names.fc1}.weight"] + p.get(f"{names.fc1}.bias", 0.0))
        return v + hid @ p[f"{names.fc2}.weight"] + p.get(f"{names.fc2}.bias", 0.0)

    y = block(inner, TNT_INNER, "inner_attn", inner_attention_config)
    vec = np.concatenate([y[:, :, j, :] for j in range(y.shape[2])], axis=-1)  # word j occupies columns j*c..(j+1)*c
    z = outer.copy()
    z[:, cls_tokens:] += ln(ln(vec, "proj_norm1") @ p["proj.weight"] + p.get("proj.bias", 0.0), "proj_norm2")
    zo = block(z, TNT_OUTER, "outer_attn", outer_attention_config)
    return (y, zo) if outputs == "both" else zo


def _check_both_outputs_gradients(rng):
    # The two-output form: finite differences of <G_in, inner''> + <G_out, outer''> with respect to
    # both inputs (parameters fixed; the record's own gradcheck covers them through outer'').
    from ..testing import gradcheck

    s = _sample(rng, "tiny", outputs="both")
    params = s.params

    def fwd(inner, outer, **cfg):
        (y, z), cache = tnt_block_forward(inner, outer, params, **cfg)
        return np.concatenate([y.reshape(2, -1), z.reshape(2, -1)], axis=1), (cache, y.shape)

    def bwd(d, c):
        cache, ys = c
        k = int(np.prod(ys[1:]))
        g = tnt_block_backward((d[:, :k].reshape(ys), d[:, k:].reshape(cache["outer_shape"])), cache)
        return {"inner": g["inner"], "outer": g["outer"]}

    return gradcheck(fwd, bwd, Sample(s.inputs, None, s.config)).max_rel


def _check_class_token_gets_no_words(rng):
    # The merge adds word information to the patch tokens only: the class token's path is the outer
    # block alone, so with the outer attention removed (zero output projection) the class token's
    # output does not depend on the inner tokens.
    s = _sample(rng, "small")
    p = dict(s.params, **{"outer_attn.out_proj": np.zeros_like(s.params["outer_attn.out_proj"]),
                          "outer_attn.out_proj_bias": np.zeros_like(s.params["outer_attn.out_proj_bias"])})
    a = tnt_block(**s.inputs, params=p, **s.config)
    b = tnt_block(inner=s.inputs["inner"] + 1.0 + rng.standard_normal(s.inputs["inner"].shape), outer=s.inputs["outer"],
                  params=p, **s.config)
    err = float(np.abs(a[:, 0] - b[:, 0]).max())
    assert err < 1e-13 and np.abs(a[:, 1:] - b[:, 1:]).max() > 1e-6, f"the class token changed by {err}"
    return err


register(
    Mechanism(
        slug="tnt_block", family="5-building-blocks", tier="T2",
        title="Transformer-in-Transformer block: inner word block, word-to-sentence merge, outer block",
        paper="Han, Xiao, Wu, Guo, Xu, Wang, Transformer in Transformer, NeurIPS 2021, arXiv 2103.00112",
        forward=tnt_block_forward, backward=tnt_block_backward, sample=_sample, reference=_reference,
        docs="blocks/residual-blocks.md#tnt-block",
        checks={"both_outputs_gradients": _check_both_outputs_gradients,
                "class_token_gets_no_words": _check_class_token_gets_no_words},
    ),
)
