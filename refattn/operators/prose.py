r"""PROSE multimodal operator decoding: data and symbol tokens are fused with modality-type
embeddings, and the solution is decoded by cross-attention from query embeddings (output time +
patch position) to the fused tokens.

Papers: Yuxuan Liu, Zecheng Zhang, Hayden Schaeffer, "PROSE: Predicting Multiple Operators and
Symbolic Expressions using Multimodal Transformers", Neural Networks 180 (2024), arXiv 2309.16816;
Yuxuan Liu, Jingmin Sun, Xinjie He, Griffin Pinney, Zecheng Zhang, Hayden Schaeffer, "PROSE-FD: A
Multimodal PDE Foundation Model for Learning Multiple Operators for Forecasting Fluid Dynamics",
arXiv 2409.09811 (2024). Upstream: felix-lyx/prose ``prose_fd/models/transformer.py``
(``TransformerFusion``, ``DataOperatorDecoder``) and ``prose_fd/models/attention_utils.py``
(``OperatorDecoderLayer``) @ eaf598d10202be34a590f7d474f461374b6bfe3c.

Which part of the model
-----------------------
PROSE-FD (``PROSE_2to1``) encodes data patches with a data encoder and the symbolic equation with a
symbol encoder, fuses the two token sets (type embeddings, concatenation, a fusion Transformer
encoder over the union), and decodes the fields with an *operator decoder*: cross-attention
layers without self-attention whose queries are the output times and patch positions. This module
is the fusion front (type embeddings + concatenation + joint key padding) and one operator-decoder
layer with its query embedding: the parts that make the model multimodal and mesh-query based.
The data/symbol encoders, the fusion encoder layers (standard pre-LN Transformer encoder layers,
``fusion.n_layer`` of them) and the patch un-embedding are standard layers left to the docs text;
with ``fusion.n_layer = 0`` this is exactly the first decoder layer acting on the fused tokens.

Forward
-------
Data tokens $X^{(0)}$ ``(B, S_0, C)``, symbol tokens $X^{(1)}$ ``(B, S_1, C)``, type embeddings
$E\in\mathbb R^{2\times C}$:

$$F = [X^{(0)} + E_0\,;\,X^{(1)} + E_1]\in\mathbb R^{(S_0+S_1)\times C},\qquad
\text{key padding } [m^{(0)}; m^{(1)}].$$

Queries for $L$ output times and $P$ patches, with ``time_embed="continuous"`` (query times
$t\in\mathbb R^{L\times q}$) or ``"learnable"`` (a table $T$):

$$Z_{(l,p)} = \tau_l + \pi_p,\qquad \tau = \mathrm{GELU}(tW_{0} + b_0)W_2 + b_2\ \text{ or }\ \tau_l = T_l,$$

and the operator-decoder layer (``norm_first=True``, the PROSE-FD default):

$$U = Z + \mathrm{MHA}\big(\mathrm{LN}_1(Z), F, F\big),\qquad
Y = U + W^{(2)}\,\mathrm{GELU}\big(W^{(1)}\mathrm{LN}_2(U) + b^{(1)}\big) + b^{(2)};$$

``norm_first=False`` is the post-norm order $U = \mathrm{LN}_1(Z + \mathrm{MHA}(Z, F, F))$,
$Y = \mathrm{LN}_2(U + \mathrm{FFN}(U))$. The fused tokens are not normalised before the
cross-attention (upstream normalises only the queries).

Backward
--------
A composition of existing VJPs: the FFN (Linear, exact-GELU derivative, Linear), LayerNorm
(``layer_norm_backward``), multi-head cross-attention (``mha_backward``, which returns the query-side
and the memory-side input gradients), the two residual branches adding their gradients. The memory
gradient $dF$ splits back into the modalities, $dX^{(m)} = dF_{S_m}$, and
$dE_m = \sum_{b,s} dF_{b,s}$ over modality $m$'s tokens. The query embedding receives
$dZ$: $d\pi_p = \sum_{b,l} dZ_{(l,p)}$, $d\tau_l = \sum_p dZ_{(l,p)}$, then the time MLP (``continuous``:
$dt$ and the MLP weights) or the table rows $T_{0:L}$ (``learnable``, summed over the batch).

Conventions
-----------
* Parameter names are upstream's: ``type_embeddings.weight (2, C)`` (fusion), ``time_proj.0``/
  ``time_proj.2`` or ``time_embed (1, max_time_len, 1, C)``, ``patch_position_embeddings (1, 1, P, C)``
  (decoder), and the layer's ``multihead_attn.in_proj_weight`` (stored ``(C, 3C)`` =
  ``in_proj_weight.T``, columns q, k, v), ``multihead_attn.in_proj_bias``,
  ``multihead_attn.out_proj.weight``/``.bias``, ``linear1``, ``linear2``, ``norm1``, ``norm2``. Linear
  weights ``(in, out)`` = ``weight.T``.
* ``time_embed`` default ``"learnable"`` (``prose_2to1.yaml``); ``norm_first`` default True;
  LayerNorm ``eps = 1e-5``; exact GELU; dropout 0 (the config's value).
* Key padding masks: True = padded token (upstream convention), one per modality.
* Output token order $(l, p)$ row-major, as upstream's ``reshape(bs, -1, dim)``.

Agreement with upstream
-----------------------
``OperatorDecoderLayer`` imported from the repository file (it needs only torch) and
``TransformerFusion``'s type-embedding/concatenation step and ``DataOperatorDecoder.get_query_emb``
transcribed into a PyTorch float64 scratch script. $B = 2$, $S_0 = 5$, $S_1 = 3$ (one padded
symbol token), $C = 8$, 2 heads, FFN width 12, $L = 2$, $P = 3$, parameters $\sim N(0, 0.25)$,
maximum error relative to $\max(1, \text{largest entry})$: continuous time, pre-norm: output
3.2e-16, gradients of every input and parameter <= 9.0e-16; learnable time: 2.9e-16 / 6.7e-16;
post-norm: 1.1e-15 / 1.7e-15. (``rotary_embedding_torch``, imported at the top of the upstream
file but unused by this layer, was stubbed.)
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_choice, check_int, check_params, compute_dtype
from ..attention.softmax import mha_backward, mha_forward
from ..nn.activations import gelu, gelu_grad
from ..nn.linear import linear_prefixed, linear_prefixed_vjp
from ..nn.norms import layer_norm_backward, layer_norm_forward
from ..registry import Mechanism, Sample, register

__all__ = ["prose_decoder_forward", "prose_decoder_backward", "prose_decoder", "init_prose_decoder_params",
           "PROSE_TIME_EMBEDS"]

PROSE_TIME_EMBEDS = ("learnable", "continuous")
_MHA = "multihead_attn"


def _mask(kp, b, s, name):
    if kp is None:
        return np.zeros((b, s), bool)
    kp = np.asarray(kp)
    if kp.dtype != np.bool_:
        raise TypeError(f"{name} must be boolean (True = padded token); got dtype {kp.dtype}")
    if kp.shape != (b, s):
        raise ValueError(f"{name} must have shape (B={b}, S={s}); got {kp.shape}")
    return kp


def _validate(times, x0, x1, params, num_heads, time_embed, output_len, norm_first, kp0, kp1):
    x0 = as_float(x0, "x0", ndim=3)
    x1 = as_float(x1, "x1", ndim=3)
    b, _, c = x0.shape
    if x1.shape[0] != b or x1.shape[2] != c:
        raise ValueError(f"x1 must have shape (B={b}, S1, C={c}) like x0; got {x1.shape}")
    h = check_int(num_heads, "num_heads", minimum=1)
    if c % h:
        raise ValueError(f"the width C={c} must be divisible by num_heads={h}")
    check_choice(time_embed, "time_embed", PROSE_TIME_EMBEDS)
    if not isinstance(norm_first, bool):
        raise TypeError(f"norm_first must be a bool; got {norm_first!r}")
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of arrays; got {type(params).__name__}")
    for key in ("patch_position_embeddings", "linear1.weight"):
        if key not in params:
            raise ValueError(f"params is missing {key!r}")
    pp = as_float(params["patch_position_embeddings"], "patch_position_embeddings", ndim=4)
    ff = as_float(params["linear1.weight"], "linear1.weight", ndim=2).shape[1]
    spec = {"type_embeddings.weight": (2, c), "patch_position_embeddings": (1, 1, pp.shape[2], c),
            f"{_MHA}.in_proj_weight": (c, 3 * c), f"{_MHA}.in_proj_bias": (3 * c,),
            f"{_MHA}.out_proj.weight": (c, c), f"{_MHA}.out_proj.bias": (c,), "linear1.weight": (c, ff),
            "linear1.bias": (ff,), "linear2.weight": (ff, c), "linear2.bias": (c,), "norm1.weight": (c,),
            "norm1.bias": (c,), "norm2.weight": (c,), "norm2.bias": (c,)}
    if time_embed == "continuous":
        if times is None:
            raise ValueError("time_embed='continuous' needs the query times (B, L, query_dim)")
        times = as_float(times, "times", ndim=3)
        if times.shape[0] != b:
            raise ValueError(f"times must have shape (B={b}, L, query_dim); got {times.shape}")
        if "time_proj.0.weight" not in params:
            raise ValueError("params is missing 'time_proj.0.weight' (time_embed='continuous')")
        spec.update({"time_proj.0.weight": (times.shape[2], c), "time_proj.0.bias": (c,),
                     "time_proj.2.weight": (c, c), "time_proj.2.bias": (c,)})
        nl = times.shape[1]
    else:
        if times is not None:
            raise ValueError("time_embed='learnable' takes no query times (pass times=None and output_len)")
        if "time_embed" not in params:
            raise ValueError("params is missing 'time_embed' (time_embed='learnable')")
        te = as_float(params["time_embed"], "time_embed", ndim=4)
        spec["time_embed"] = (1, te.shape[1], 1, c)
        nl = check_int(output_len, "output_len", minimum=1)
        if nl > te.shape[1]:
            raise ValueError(f"output_len={nl} exceeds the table's max_time_len={te.shape[1]} (time_embed's axis 1)")
    p = check_params(params, spec)
    kp = np.concatenate([_mask(kp0, b, x0.shape[1], "key_padding_mask0"),
                         _mask(kp1, b, x1.shape[1], "key_padding_mask1")], axis=1)
    if kp.all(axis=1).any():
        raise ValueError("the key padding masks pad every fused token of a sample; keep at least one")
    dt = compute_dtype(x0, x1, *p.values(), *(() if times is None else (times,)))
    times = None if times is None else times.astype(dt, copy=False)
    return times, x0.astype(dt, copy=False), x1.astype(dt, copy=False), cast_all(dt, p), h, nl, kp


def _mha_params(p, c):
    w, bb = p[f"{_MHA}.in_proj_weight"], p[f"{_MHA}.in_proj_bias"]
    return {"q_proj": w[:, :c], "k_proj": w[:, c:2 * c], "v_proj": w[:, 2 * c:], "q_proj_bias": bb[:c],
            "k_proj_bias": bb[c:2 * c], "v_proj_bias": bb[2 * c:], "out_proj": p[f"{_MHA}.out_proj.weight"],
            "out_proj_bias": p[f"{_MHA}.out_proj.bias"]}


def _ln(p, name, x):
    return layer_norm_forward(x, {"weight": p[f"{name}.weight"], "bias": p[f"{name}.bias"]})


def prose_decoder_forward(times, x0, x1, params, *, num_heads: int, time_embed: str = "learnable",
                          output_len=None, norm_first: bool = True, key_padding_mask0=None, key_padding_mask1=None):
    r"""PROSE's modality fusion and one operator-decoder layer (module docstring).

    Parameters
    ----------
    times : array (B, L, query_dim) or None
        Output query times (``time_embed="continuous"``); None for ``"learnable"``.
    x0, x1 : arrays (B, S0, C), (B, S1, C)
        Data tokens and symbol tokens (the encoders' outputs).
    params : dict
        See the module docstring (upstream names).
    num_heads : int
    time_embed : {"learnable", "continuous"}
    output_len : int
        Number of output times $L$ (``"learnable"`` only).
    norm_first : bool
        Pre-norm (default, PROSE-FD config) or post-norm decoder layer.
    key_padding_mask0, key_padding_mask1 : bool arrays (B, S0), (B, S1), optional
        True = padded token.

    Returns
    -------
    out, cache
        ``out (B, L*P, C)``, rows ordered (time, patch).
    """
    times, x0, x1, p, h, nl, kp = _validate(times, x0, x1, params, num_heads, time_embed, output_len, norm_first,
                                            key_padding_mask0, key_padding_mask1)
    b, c = x0.shape[0], x0.shape[2]
    te = p["type_embeddings.weight"]
    fused = np.concatenate([x0 + te[0], x1 + te[1]], axis=1)
    pos = p["patch_position_embeddings"][0, 0]                     # (P, C)
    cache = dict(p=p, h=h, nl=nl, s0=x0.shape[1], time_embed=time_embed, norm_first=norm_first, dtype=x0.dtype,
                 times=times)
    if time_embed == "continuous":
        u = linear_prefixed(p, "time_proj.0", times)
        gu = gelu(u)
        tau = linear_prefixed(p, "time_proj.2", gu)                 # (B, L, C)
        cache.update(u=u, gu=gu)
    else:
        tau = np.broadcast_to(p["time_embed"][0, :nl, 0], (b, nl, c))
    z = (tau[:, :, None, :] + pos[None, None]).reshape(b, -1, c)
    mp = _mha_params(p, c)
    if norm_first:
        a, cl1 = _ln(p, "norm1", z)
        m, cm = mha_forward(a, fused, mp, num_heads=h, key_padding_mask=~kp)
        uu = z + m
        a2, cl2 = _ln(p, "norm2", uu)
        f1 = linear_prefixed(p, "linear1", a2)
        out = uu + linear_prefixed(p, "linear2", gelu(f1))
        cache.update(cl1=cl1, cm=cm, a2=a2, f1=f1)
    else:
        m, cm = mha_forward(z, fused, mp, num_heads=h, key_padding_mask=~kp)
        uu, cl1 = _ln(p, "norm1", z + m)
        f1 = linear_prefixed(p, "linear1", uu)
        out, cl2 = _ln(p, "norm2", uu + linear_prefixed(p, "linear2", gelu(f1)))
        cache.update(cl1=cl1, cm=cm, a2=uu, f1=f1)
    cache.update(cl2=cl2, out_shape=out.shape)
    return out, cache


def prose_decoder_backward(dout, cache):
    """Gradients of :func:`prose_decoder_forward`: ``x0``, ``x1``, ``times`` (continuous) and every params key."""
    p, nl = cache["p"], cache["nl"]
    g = as_dout(dout, cache["out_shape"], cache["dtype"])
    b, _, c = g.shape
    grads = {}

    def ffn_vjp(gy):
        dgf = linear_prefixed_vjp(grads, p, "linear2", gy, gelu(cache["f1"]))
        return linear_prefixed_vjp(grads, p, "linear1", dgf * gelu_grad(cache["f1"]), cache["a2"])

    def ln_vjp(name, gy, cl):
        gl = layer_norm_backward(gy, cl)
        grads[f"{name}.weight"], grads[f"{name}.bias"] = gl["weight"], gl["bias"]
        return gl["x"]

    if cache["norm_first"]:
        du = g + ln_vjp("norm2", ffn_vjp(g), cache["cl2"])
        gm = mha_backward(du, cache["cm"])
        dz = du + ln_vjp("norm1", gm["x"], cache["cl1"])
    else:
        dv = ln_vjp("norm2", g, cache["cl2"])
        du = dv + ffn_vjp(dv)
        dzm = ln_vjp("norm1", du, cache["cl1"])
        gm = mha_backward(dzm, cache["cm"])
        dz = dzm + gm["x"]
    grads[f"{_MHA}.in_proj_weight"] = np.concatenate([gm["q_proj"], gm["k_proj"], gm["v_proj"]], axis=1)
    grads[f"{_MHA}.in_proj_bias"] = np.concatenate([gm["q_proj_bias"], gm["k_proj_bias"], gm["v_proj_bias"]])
    grads[f"{_MHA}.out_proj.weight"], grads[f"{_MHA}.out_proj.bias"] = gm["out_proj"], gm["out_proj_bias"]
    df = gm["context"]
    s0 = cache["s0"]
    grads["x0"], grads["x1"] = df[:, :s0].copy(), df[:, s0:].copy()
    grads["type_embeddings.weight"] = np.stack([df[:, :s0].sum(axis=(0, 1)), df[:, s0:].sum(axis=(0, 1))])
    dz4 = dz.reshape(b, nl, -1, c)
    grads["patch_position_embeddings"] = dz4.sum(axis=(0, 1))[None, None]
    dtau = dz4.sum(axis=2)                                          # (B, L, C)
    if cache["time_embed"] == "continuous":
        dgu = linear_prefixed_vjp(grads, p, "time_proj.2", dtau, cache["gu"])
        grads["times"] = linear_prefixed_vjp(grads, p, "time_proj.0", dgu * gelu_grad(cache["u"]), cache["times"])
    else:
        dte = np.zeros_like(p["time_embed"])
        dte[0, :nl, 0] = dtau.sum(axis=0)
        grads["time_embed"] = dte
    return grads


def prose_decoder(times, x0, x1, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`prose_decoder_forward`."""
    return prose_decoder_forward(times, x0, x1, params, **config)[0]


def init_prose_decoder_params(rng, c: int, dim_ffn: int, n_patch: int, *, time_embed: str = "learnable",
                              query_dim: int = 1, max_time_len: int = 10, dtype=np.float64) -> dict:
    """Parameters as upstream initialises them: embeddings $N(0, 1)$ (``get_embeddings``; the fusion
    ``Embedding`` $N(0, C^{-1})$), ``nn.MultiheadAttention`` (Xavier in-projection, zero biases),
    default ``nn.Linear``, LayerNorm weight 1 / bias 0."""
    check_choice(time_embed, "time_embed", PROSE_TIME_EMBEDS)
    c, ff = check_int(c, "c", minimum=1), check_int(dim_ffn, "dim_ffn", minimum=1)

    def lin(name, n_in, n_out):
        bd = 1.0 / np.sqrt(n_in)
        p[f"{name}.weight"] = rng.uniform(-bd, bd, (n_in, n_out))
        p[f"{name}.bias"] = rng.uniform(-bd, bd, n_out)

    p = {"type_embeddings.weight": rng.standard_normal((2, c)) / np.sqrt(c),
         "patch_position_embeddings": rng.standard_normal((1, 1, n_patch, c))}
    if time_embed == "continuous":
        lin("time_proj.0", query_dim, c)
        lin("time_proj.2", c, c)
    else:
        p["time_embed"] = rng.standard_normal((1, max_time_len, 1, c))
    bd = np.sqrt(6.0 / (c + 3 * c))
    p[f"{_MHA}.in_proj_weight"] = rng.uniform(-bd, bd, (c, 3 * c))
    p[f"{_MHA}.in_proj_bias"] = np.zeros(3 * c)
    lin(f"{_MHA}.out_proj", c, c)
    p[f"{_MHA}.out_proj.bias"] = np.zeros(c)
    lin("linear1", c, ff)
    lin("linear2", ff, c)
    for k in ("norm1", "norm2"):
        p[f"{k}.weight"], p[f"{k}.bias"] = np.ones(c), np.zeros(c)
    return {k: np.asarray(v, dtype=dtype) for k, v in p.items()}


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample(rng, size, *, time_embed="continuous", norm_first=True):
    s0, s1, c, ff, nl, npatch = (2, 2, 4, 4, 2, 2) if size == "tiny" else (5, 3, 8, 12, 2, 3)
    p = init_prose_decoder_params(rng, c, ff, npatch, time_embed=time_embed, max_time_len=3)
    for k in p:
        if k.endswith("bias"):
            p[k] = 0.3 * rng.standard_normal(p[k].shape)
        if k.startswith("norm") and k.endswith("weight"):
            p[k] = 1.0 + 0.3 * rng.standard_normal(c)
    kp1 = np.zeros((2, s1), bool)
    kp1[1, -1] = True
    cfg = {"num_heads": 2, "time_embed": time_embed, "norm_first": norm_first, "key_padding_mask1": kp1}
    if time_embed == "learnable":
        cfg["output_len"] = nl
    times = rng.uniform(0.0, 1.0, (2, nl, 1)) if time_embed == "continuous" else None
    return Sample(inputs={"times": times, "x0": rng.standard_normal((2, s0, c)), "x1": rng.standard_normal((2, s1, c))},
                  params=p, config=cfg)


def _ref_gelu(v):
    from scipy.special import erf
    return 0.5 * v * (1 + erf(v / np.sqrt(2)))


def _ref_ln(p, v, k):
    return (v - v.mean()) / np.sqrt(v.var() + 1e-5) * p[f"{k}.weight"] + p[f"{k}.bias"]


def _ref_attn(p, qin, f, pad, num_heads):
    c = f.shape[1]
    d = c // num_heads
    w, bi = p[f"{_MHA}.in_proj_weight"], p[f"{_MHA}.in_proj_bias"]
    q, k, v = qin @ w[:, :c] + bi[:c], f @ w[:, c:2 * c] + bi[c:2 * c], f @ w[:, 2 * c:] + bi[2 * c:]
    o = []
    for hh in range(num_heads):
        sl = slice(hh * d, (hh + 1) * d)
        sc = np.where(pad, -np.inf, k[:, sl] @ q[sl] / np.sqrt(d))
        e = np.exp(sc - sc.max())
        o.append((e / e.sum()) @ v[:, sl])
    return np.concatenate(o) @ p[f"{_MHA}.out_proj.weight"] + p[f"{_MHA}.out_proj.bias"]


def _ref_ffn(p, v):
    return _ref_gelu(v @ p["linear1.weight"] + p["linear1.bias"]) @ p["linear2.weight"] + p["linear2.bias"]


def _reference(times, x0, x1, params, *, num_heads, time_embed="learnable", output_len=None, norm_first=True,
               key_padding_mask0=None, key_padding_mask1=None):
    # Per-sample, per-query loops with explicit softmax, LayerNorm and the erf GELU.
    p = params
    b, s0, c = x0.shape
    pos = p["patch_position_embeddings"][0, 0]
    outs = []
    for bb in range(b):
        f = np.concatenate([x0[bb] + p["type_embeddings.weight"][0], x1[bb] + p["type_embeddings.weight"][1]])
        pad = np.concatenate([np.zeros(s0, bool) if key_padding_mask0 is None else key_padding_mask0[bb],
                              np.zeros(x1.shape[1], bool) if key_padding_mask1 is None else key_padding_mask1[bb]])
        if time_embed == "continuous":
            tau = _ref_gelu(times[bb] @ p["time_proj.0.weight"] + p["time_proj.0.bias"]) @ p["time_proj.2.weight"] \
                + p["time_proj.2.bias"]
        else:
            tau = p["time_embed"][0, :output_len, 0]
        rows = []
        for lt in range(tau.shape[0]):
            for pp in range(pos.shape[0]):
                z = tau[lt] + pos[pp]
                if norm_first:
                    u = z + _ref_attn(p, _ref_ln(p, z, "norm1"), f, pad, num_heads)
                    rows.append(u + _ref_ffn(p, _ref_ln(p, u, "norm2")))
                else:
                    u = _ref_ln(p, z + _ref_attn(p, z, f, pad, num_heads), "norm1")
                    rows.append(_ref_ln(p, u + _ref_ffn(p, u), "norm2"))
        outs.append(np.array(rows))
    return np.array(outs)


def _check_variants(rng):
    # Learnable time table and the post-norm order against the explicit formula.
    errs = []
    for te, nf in (("learnable", True), ("continuous", False), ("learnable", False)):
        s = _sample(rng, "small", time_embed=te, norm_first=nf)
        errs.append(float(np.abs(prose_decoder(**s.inputs, params=s.params, **s.config)
                                 - _reference(**s.inputs, params=s.params, **s.config)).max()))
    err = max(errs)
    assert err < 1e-12, f"a variant differs from the explicit formula by {err:.2e}"
    return err


def _check_padded_symbol_ignored(rng):
    # A padded symbol token does not influence the output (its values can be anything).
    s = _sample(rng, "small")
    x1 = s.inputs["x1"].copy()
    out = prose_decoder(**s.inputs, params=s.params, **s.config)
    x1[1, -1] += 100.0
    err = float(np.abs(prose_decoder(s.inputs["times"], s.inputs["x0"], x1, s.params, **s.config) - out).max())
    assert err == 0.0, f"a padded token changed the output by {err:.2e}"
    return err


def _check_token_permutation(rng):
    # Cross-attention reads the fused tokens as a set: permuting the data tokens leaves the output unchanged.
    s = _sample(rng, "small")
    perm = rng.permutation(s.inputs["x0"].shape[1])
    out = prose_decoder(**s.inputs, params=s.params, **s.config)
    o2 = prose_decoder(s.inputs["times"], s.inputs["x0"][:, perm], s.inputs["x1"], s.params, **s.config)
    err = float(np.abs(o2 - out).max())
    assert err < 1e-13, f"output depends on the data-token order: {err:.2e}"
    return err


register(
    Mechanism(
        slug="prose_multimodal_operator", family="3-operator", tier="T3",
        official_code="felix-lyx/prose prose_fd/models/transformer.py, attention_utils.py@eaf598d",
        title="PROSE / PROSE-FD: data-symbol token fusion and cross-attention operator decoding at query times",
        paper="Liu, Zhang, Schaeffer, PROSE: Predicting Multiple Operators and Symbolic Expressions using Multimodal "
              "Transformers, Neural Networks 2024, arXiv 2309.16816; Liu, Sun, He, Pinney, Zhang, Schaeffer, "
              "PROSE-FD, arXiv 2409.09811",
        forward=prose_decoder_forward, backward=prose_decoder_backward, sample=_sample, reference=_reference,
        docs="operators/o5a.md#prose-fusion-and-operator-decoder",
        checks={"variants": _check_variants, "padded_symbol_ignored": _check_padded_symbol_ignored,
                "token_permutation": _check_token_permutation},
    ),
)
