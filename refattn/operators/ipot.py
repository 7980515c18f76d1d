r"""IPOT: Inducing Point Operator Transformer (encode -> process latents -> decode anywhere).

Paper: Lee & Oh, "Inducing Point Operator Transformer: A Flexible and Scalable Architecture for
Solving PDEs", AAAI 2024. Upstream: 7tl7qns7ch/IPOT @ 18c177846267505ee9503445a146dfd7dee34c41
``models/ipot/layers.py`` (``PreNorm``,
``GEGLU``, ``FeedForward``, ``Attention``), ``ipot_encoder.py``, ``ipot_processor.py``,
``ipot_decoder.py``.

Forward
-------
Learned latents $Z_0\in\mathbb R^{M\times D}$ (the inducing points), inputs
$X\in\mathbb R^{N\times C_{in}}$ (the discretised input function, positional features already
concatenated), decoder queries $P\in\mathbb R^{N_{out}\times C_q}$ (encoded output positions):

$$Z_1 = \mathrm{CA}_{enc}(\mathrm{LN}Z_0,\ \mathrm{LN}X) + Z_0,$$
$$Z_{l+1}' = \mathrm{SA}(\mathrm{LN}Z_l;\ \text{keys/values from } Z_l) + Z_l,\qquad
Z_{l+1} = \mathrm{FF}(\mathrm{LN}Z_{l+1}') + Z_{l+1}'\quad(l = 1..L),$$
$$O = \mathrm{CA}_{dec}(\mathrm{LN}P,\ \mathrm{LN}Z_{L+1}),\qquad Y = s\,\big(\mathrm{FF}(\mathrm{LN}O) + O\big),$$

with softmax attention $\mathrm{CA}(a, c) = \mathrm{softmax}(aW_q(cW_k)^\top/\sqrt{d_h})\,cW_v\,W_o + b_o$
(``to_q``, ``to_kv`` without bias, ``to_out`` with bias), GEGLU feed-forward
$\mathrm{FF}(x) = (u\odot\mathrm{GELU}(g))W_2 + b_2$ with $[u, g] = xW_1 + b_1$, and
$s$ = ``output_scale`` (0.1). Cost $O(NM + LM^2 + N_{out}M)$: the input and output
discretisations are decoupled by the $M$ latents.

Backward
--------
Reverse-mode through the chain: the softmax-attention VJP
(:func:`refattn.attention.softmax.attention_core_backward`), LayerNorm VJPs
(:mod:`refattn.nn.norms`), GEGLU ($du = dh\odot\mathrm{GELU}(g)$,
$dg = dh\odot u\odot\mathrm{GELU}'(g)$), residual branches add their gradients; the processor's
self-attention receives gradient through both its query path (via the LayerNorm) and its key/value
path (raw latents); with shared processor weights the per-layer parameter gradients are summed,
and ``latents`` receive the sum over the batch.

Upstream conventions made explicit
----------------------------------
* ``share_processor_weights=True``: ``IPOTProcessor`` appends the **same** ``processor_self_attn``
  / ``processor_ff`` modules for every layer, so all processor layers share weights whatever
  ``weight_tie_layers`` says (observed in the code). ``False`` gives independent layers
  (params ``layers.{l}.0.*`` / ``layers.{l}.1.*``).
* Processor keys/values come from the **un-normalised** latents: ``PreNorm`` without
  ``context_channel`` normalises only ``x``, and the processor calls ``self_attn(z, context=z)``.
  ``processor_kv_norm=True`` would feed the normalised latents instead (not upstream).
* ``IPOTEncoder.encoder_ff`` is constructed but never used in ``forward``; it is not a parameter here.
* Residuals: encoder/processor ``use_query_residual=True``; decoder ``use_qeury_residual=False``.
* Masks: ``mask`` (B, N) marks real input points (upstream fills masked scores with
  ``-finfo.max``; refattn removes them; a batch element needs at least one real point).
* The whole model, with the ``pos2fourier`` position features computed here (gradients to the
  input and query coordinates) and the model's full state-dict names (``encoder.``,
  ``processor.``, ``decoder.`` prefixes), is :func:`ipot_model_forward`; upstream @ 18c1778
  ``models/epd.py``, ``models/ipot/position_encoding.py``, ``models/ipot/preprocessings.py``.
  Measured agreement with the real model in float64: <= 1.3e-16, output and every gradient (docs).
"""

from __future__ import annotations

import numpy as np

from .._checks import as_dout, as_float, cast_all, check_int, check_params, check_positive, compute_dtype
from ..attention.softmax import attention_core_backward, attention_core_forward
from ..nn.activations import gelu, gelu_grad
from ..nn.linear import init_linear_prefixed, linear_prefixed, linear_prefixed_vjp, merge_heads, split_heads
from ..nn.norms import normalize_backward, normalize_forward
from ..registry import Mechanism, Sample, register

__all__ = [
    "ipot_inducing_point_operator_forward",
    "ipot_inducing_point_operator_backward",
    "ipot_inducing_point_operator",
    "ipot_init_params",
    "pos2fourier_forward",
    "pos2fourier_backward",
    "ipot_model_forward",
    "ipot_model_backward",
]

_EPS = 1e-5


def _acc(grads, key, g):
    grads[key] = grads[key] + g if key in grads else g


def _ln(p, prefix, x):
    xhat, stats = normalize_forward(x, (x.ndim - 1,), _EPS)
    return xhat * p[f"{prefix}.weight"] + p[f"{prefix}.bias"], (xhat, stats)


def _ln_back(grads, p, prefix, dy, c):
    xhat, stats = c
    _acc(grads, f"{prefix}.weight", np.sum(dy * xhat, axis=(0, 1)))
    _acc(grads, f"{prefix}.bias", np.sum(dy, axis=(0, 1)))
    return normalize_backward(dy * p[f"{prefix}.weight"], xhat, stats)


def _attn(p, prefix, xq, ctx, heads, mask=None):
    inner = p[f"{prefix}.to_q.weight"].shape[1]
    q = split_heads(xq @ p[f"{prefix}.to_q.weight"], heads)
    kv = ctx @ p[f"{prefix}.to_kv.weight"]
    k, v = split_heads(kv[..., :inner], heads), split_heads(kv[..., inner:], heads)
    am = None if mask is None else mask[:, None, None, :]
    o, ac = attention_core_forward(q, k, v, attn_mask=am)
    om = merge_heads(o)
    out = linear_prefixed(p, f"{prefix}.to_out", om)
    return out, {"xq": xq, "ctx": ctx, "ac": ac, "om": om, "inner": inner}


def _attn_back(grads, p, prefix, dy, c, heads):
    dom = linear_prefixed_vjp(grads, p, f"{prefix}.to_out", dy, c["om"])
    g = attention_core_backward(split_heads(dom, heads), c["ac"])
    dq, dk, dv = merge_heads(g["q"]), merge_heads(g["k"]), merge_heads(g["v"])
    _acc(grads, f"{prefix}.to_q.weight", np.einsum("bni,bno->io", c["xq"], dq))
    dkv = np.concatenate([dk, dv], -1)
    _acc(grads, f"{prefix}.to_kv.weight", np.einsum("bni,bno->io", c["ctx"], dkv))
    return dq @ p[f"{prefix}.to_q.weight"].T, dkv @ p[f"{prefix}.to_kv.weight"].T


def _ff(p, prefix, x):
    a = linear_prefixed(p, f"{prefix}.net.0", x)
    h2 = a.shape[-1] // 2
    u, g = a[..., :h2], a[..., h2:]
    hh = u * gelu(g)
    return linear_prefixed(p, f"{prefix}.net.3", hh), {"x": x, "u": u, "g": g, "h": hh}


def _ff_back(grads, p, prefix, dy, c):
    dh = linear_prefixed_vjp(grads, p, f"{prefix}.net.3", dy, c["h"])
    da = np.concatenate([dh * gelu(c["g"]), dh * c["u"] * gelu_grad(c["g"])], -1)
    return linear_prefixed_vjp(grads, p, f"{prefix}.net.0", da, c["x"])


def _attn_spec(prefix, c_q, c_ctx, inner, c_out):
    return {f"{prefix}.to_q.weight": (c_q, inner), f"{prefix}.to_kv.weight": (c_ctx, 2 * inner),
            f"{prefix}.to_out.weight": (inner, c_out), f"{prefix}.to_out.bias": (c_out,)}


def _ln_spec(prefix, c):
    return {f"{prefix}.weight": (c,), f"{prefix}.bias": (c,)}


def _ff_spec(prefix, c, hidden):
    return {f"{prefix}.net.0.weight": (c, 2 * hidden), f"{prefix}.net.0.bias": (2 * hidden,),
            f"{prefix}.net.3.weight": (hidden, c), f"{prefix}.net.3.bias": (c,)}


def _proc_prefixes(l, shared):
    if shared:
        return "processor_self_attn", "processor_ff"
    return f"layers.{l}.0", f"layers.{l}.1"


def _shape_of(params, key, ndim):
    a = params.get(key) if isinstance(params, dict) else None
    if a is None or np.ndim(a) != ndim:
        raise ValueError(f"params must contain {key!r} with {ndim} dimensions")
    return np.shape(a)


def ipot_inducing_point_operator_forward(inputs, query, params, *, num_layers: int = 1,
                                         encoder_heads: int = 8, processor_heads: int = 8,
                                         decoder_heads: int = 8, output_scale: float = 0.1,
                                         share_processor_weights: bool = True,
                                         use_query_residual: bool = True,
                                         decoder_query_residual: bool = False,
                                         processor_kv_norm: bool = False, mask=None):
    r"""IPOT encoder -> processor -> decoder (see the module docstring).

    Parameters
    ----------
    inputs : array (B, N, C_in)
        Input function at N points (data channels and positional features).
    query : array (B, N_out, C_q)
        Encoded output positions.
    params : dict
        ``latents`` (M, D); ``encoder_cross_attn.norm.*`` (D), ``.norm_context.*`` (C_in),
        ``.fn.to_q.weight`` (D, I_e), ``.fn.to_kv.weight`` (C_in, 2 I_e), ``.fn.to_out.weight``
        (I_e, D), ``.fn.to_out.bias``; processor ``processor_self_attn.norm.*``,
        ``processor_self_attn.fn.{to_q,to_kv,to_out}.*`` (D -> I_p), ``processor_ff.norm.*``,
        ``processor_ff.fn.net.0.*`` (D, 2 F), ``processor_ff.fn.net.3.*`` (F, D) (or per-layer
        ``layers.{l}.0.*`` / ``layers.{l}.1.*`` when not shared); decoder
        ``decoder_cross_attn.norm.*`` (C_q), ``.norm_context.*`` (D), ``.fn.to_q.weight``
        (C_q, I_d), ``.fn.to_kv.weight`` (D, 2 I_d), ``.fn.to_out.*`` (I_d -> C_out),
        ``decoder_ff.norm.*`` (C_out), ``decoder_ff.fn.net.0.*``, ``decoder_ff.fn.net.3.*``.
        State-dict names relative to the ``IPOTEncoder``/``IPOTProcessor``/``IPOTDecoder``
        submodules (the whole model's prefixed names: :func:`ipot_model_forward`); linear weights
        transposed.
    num_layers : int
        Processor depth L (upstream ``self_per_cross_attn``, default 6).
    encoder_heads, processor_heads, decoder_heads : int
        Head counts (upstream default 8; head width = inner width / heads).
    output_scale : float
        Final scale (upstream 0.1).
    share_processor_weights, use_query_residual, decoder_query_residual, processor_kv_norm
        Conventions (module docstring); upstream values True, True, False, False.
    mask : bool array (B, N), optional
        True = real input point.

    Returns
    -------
    out (B, N_out, C_out), cache
    """
    for name, val in (("share_processor_weights", share_processor_weights),
                      ("use_query_residual", use_query_residual),
                      ("decoder_query_residual", decoder_query_residual),
                      ("processor_kv_norm", processor_kv_norm)):
        if not isinstance(val, (bool, np.bool_)):
            raise TypeError(f"{name} must be a bool; got {type(val).__name__}")
    inputs = as_float(inputs, "inputs", ndim=3)
    query = as_float(query, "query", ndim=3)
    b, n, c_in = inputs.shape
    if query.shape[0] != b:
        raise ValueError(f"query must have batch size {b} like inputs; got {query.shape}")
    c_q = query.shape[2]
    num_layers = check_int(num_layers, "num_layers", minimum=0)
    heads = {k: check_int(v, k, minimum=1) for k, v in
             (("encoder_heads", encoder_heads), ("processor_heads", processor_heads),
              ("decoder_heads", decoder_heads))}
    output_scale = check_positive(output_scale, "output_scale")
    if mask is not None:
        mask = np.asarray(mask)
        if mask.dtype != np.bool_:
            raise TypeError(f"mask must be a boolean array (True = real point); got dtype {mask.dtype}")
        if mask.shape != (b, n):
            raise ValueError(f"mask must have shape (B={b}, N={n}); got {mask.shape}")
        if not mask.any(axis=1).all():
            raise ValueError("mask must keep at least one input point per batch element")
    m, d = _shape_of(params, "latents", 2)
    i_e = _shape_of(params, "encoder_cross_attn.fn.to_q.weight", 2)[1]
    i_d = _shape_of(params, "decoder_cross_attn.fn.to_q.weight", 2)[1]
    c_out = _shape_of(params, "decoder_cross_attn.fn.to_out.weight", 2)[1]
    f_d = _shape_of(params, "decoder_ff.fn.net.3.weight", 2)[0]
    spec = {"latents": (m, d)}
    spec.update(_ln_spec("encoder_cross_attn.norm", d))
    spec.update(_ln_spec("encoder_cross_attn.norm_context", c_in))
    spec.update(_attn_spec("encoder_cross_attn.fn", d, c_in, i_e, d))
    if num_layers:
        sa0, ff0 = _proc_prefixes(0, share_processor_weights)
        i_p = _shape_of(params, f"{sa0}.fn.to_q.weight", 2)[1]
        f_p = _shape_of(params, f"{ff0}.fn.net.3.weight", 2)[0]
        for l in range(1 if share_processor_weights else num_layers):
            sa, ff = _proc_prefixes(l, share_processor_weights)
            spec.update(_ln_spec(f"{sa}.norm", d))
            spec.update(_attn_spec(f"{sa}.fn", d, d, i_p, d))
            spec.update(_ln_spec(f"{ff}.norm", d))
            spec.update(_ff_spec(f"{ff}.fn", d, f_p))
        if i_p % heads["processor_heads"]:
            raise ValueError(f"processor inner width {i_p} must be divisible by processor_heads")
    spec.update(_ln_spec("decoder_cross_attn.norm", c_q))
    spec.update(_ln_spec("decoder_cross_attn.norm_context", d))
    spec.update(_attn_spec("decoder_cross_attn.fn", c_q, d, i_d, c_out))
    spec.update(_ln_spec("decoder_ff.norm", c_out))
    spec.update(_ff_spec("decoder_ff.fn", c_out, f_d))
    for key, inner in (("encoder_heads", i_e), ("decoder_heads", i_d)):
        if inner % heads[key]:
            raise ValueError(f"{key.split('_')[0]} inner width {inner} must be divisible by {key} ({heads[key]})")
    if decoder_query_residual and c_q != c_out:
        raise ValueError(f"decoder_query_residual needs C_q == C_out; got {c_q} and {c_out}")
    p = check_params(params, spec)
    dt = compute_dtype(inputs, query, *p.values())
    inputs, query, p = inputs.astype(dt, copy=False), query.astype(dt, copy=False), cast_all(dt, p)

    cache = {"inputs": inputs, "query": query, "p": p, "heads": heads, "L": num_layers,
             "shared": share_processor_weights, "res": use_query_residual,
             "dres": decoder_query_residual, "kvnorm": processor_kv_norm, "scale": output_scale}
    z0 = np.broadcast_to(p["latents"], (b, m, d))
    lq, cache["enc_lnq"] = _ln(p, "encoder_cross_attn.norm", z0)
    lc, cache["enc_lnc"] = _ln(p, "encoder_cross_attn.norm_context", inputs)
    a, cache["enc_att"] = _attn(p, "encoder_cross_attn.fn", lq, lc, heads["encoder_heads"], mask)
    z = a + z0 if use_query_residual else a
    layers = []
    for l in range(num_layers):
        sa, ff = _proc_prefixes(l, share_processor_weights)
        lc_ = {}
        ln, lc_["ln1"] = _ln(p, f"{sa}.norm", z)
        a, lc_["att"] = _attn(p, f"{sa}.fn", ln, ln if processor_kv_norm else z, heads["processor_heads"])
        z = a + z if use_query_residual else a
        ln2, lc_["ln2"] = _ln(p, f"{ff}.norm", z)
        f, lc_["ff"] = _ff(p, f"{ff}.fn", ln2)
        z = f + z
        layers.append(lc_)
    cache["layers"] = layers
    lq, cache["dec_lnq"] = _ln(p, "decoder_cross_attn.norm", query)
    lc, cache["dec_lnc"] = _ln(p, "decoder_cross_attn.norm_context", z)
    o, cache["dec_att"] = _attn(p, "decoder_cross_attn.fn", lq, lc, heads["decoder_heads"])
    if decoder_query_residual:
        o = o + query
    ln, cache["dec_lnf"] = _ln(p, "decoder_ff.norm", o)
    f, cache["dec_ff"] = _ff(p, "decoder_ff.fn", ln)
    out = (f + o) * output_scale
    cache["out_shape"] = out.shape
    return out, cache


def ipot_inducing_point_operator_backward(dout, cache):
    """Gradients of :func:`ipot_inducing_point_operator_forward`: ``inputs``, ``query`` and every params key."""
    p, heads, inputs = cache["p"], cache["heads"], cache["inputs"]
    dout = as_dout(dout, cache["out_shape"], inputs.dtype)
    grads = {}
    do = dout * cache["scale"]
    dln = _ff_back(grads, p, "decoder_ff.fn", do, cache["dec_ff"])
    do = do + _ln_back(grads, p, "decoder_ff.norm", dln, cache["dec_lnf"])
    dquery = do.copy() if cache["dres"] else 0.0
    dlq, dlc = _attn_back(grads, p, "decoder_cross_attn.fn", do, cache["dec_att"], heads["decoder_heads"])
    dquery = dquery + _ln_back(grads, p, "decoder_cross_attn.norm", dlq, cache["dec_lnq"])
    dz = _ln_back(grads, p, "decoder_cross_attn.norm_context", dlc, cache["dec_lnc"])
    for l in reversed(range(cache["L"])):
        sa, ff = _proc_prefixes(l, cache["shared"])
        lc_ = cache["layers"][l]
        dln2 = _ff_back(grads, p, f"{ff}.fn", dz, lc_["ff"])
        dz = dz + _ln_back(grads, p, f"{ff}.norm", dln2, lc_["ln2"])
        dq_in, dctx = _attn_back(grads, p, f"{sa}.fn", dz, lc_["att"], heads["processor_heads"])
        if cache["kvnorm"]:
            dln = dq_in + dctx
            dz_new = _ln_back(grads, p, f"{sa}.norm", dln, lc_["ln1"])
        else:
            dz_new = _ln_back(grads, p, f"{sa}.norm", dq_in, lc_["ln1"]) + dctx
        dz = dz_new + dz if cache["res"] else dz_new
    dlq, dlc = _attn_back(grads, p, "encoder_cross_attn.fn", dz, cache["enc_att"], heads["encoder_heads"])
    dz0 = _ln_back(grads, p, "encoder_cross_attn.norm", dlq, cache["enc_lnq"])
    if cache["res"]:
        dz0 = dz0 + dz
    grads["latents"] = dz0.sum(axis=0)
    grads["inputs"] = _ln_back(grads, p, "encoder_cross_attn.norm_context", dlc, cache["enc_lnc"])
    grads["query"] = dquery
    return grads


def ipot_inducing_point_operator(inputs, query, params, **config):
    """Convenience wrapper: the output of :func:`ipot_inducing_point_operator_forward`."""
    return ipot_inducing_point_operator_forward(inputs, query, params, **config)[0]


def ipot_init_params(rng, input_channel: int, query_channel: int, output_channel: int, *,
                     num_latents: int = 64, latent_channel: int = 64, num_layers: int = 1,
                     share_processor_weights: bool = True, ff_mult: int = 4,
                     latent_init_scale: float = 0.02, dtype=np.float64) -> dict:
    """Upstream initialisation: ``latents = randn * 0.02``; PyTorch default linears; LayerNorm
    weight 1 / bias 0. Inner attention widths equal ``latent_channel`` (upstream
    ``heads_channel = latent_channel // heads``)."""
    d = latent_channel

    def lin(n_in, n_out, key, bias=True):
        return init_linear_prefixed(rng, n_in, n_out, key, bias)

    def ln(key, c):
        return {f"{key}.weight": np.ones(c), f"{key}.bias": np.zeros(c)}

    def attn(prefix, c_q, c_ctx, c_o):
        out = lin(c_q, d, f"{prefix}.to_q", bias=False)
        out.update(lin(c_ctx, 2 * d, f"{prefix}.to_kv", bias=False))
        out.update(lin(d, c_o, f"{prefix}.to_out"))
        return out

    def ffp(prefix, c):
        out = lin(c, 2 * c * ff_mult, f"{prefix}.net.0")
        out.update(lin(c * ff_mult, c, f"{prefix}.net.3"))
        return out

    p = {"latents": rng.standard_normal((num_latents, d)) * latent_init_scale}
    p.update(ln("encoder_cross_attn.norm", d))
    p.update(ln("encoder_cross_attn.norm_context", input_channel))
    p.update(attn("encoder_cross_attn.fn", d, input_channel, d))
    for l in range(1 if share_processor_weights else num_layers):
        sa, ff = _proc_prefixes(l, share_processor_weights)
        p.update(ln(f"{sa}.norm", d))
        p.update(attn(f"{sa}.fn", d, d, d))
        p.update(ln(f"{ff}.norm", d))
        p.update(ffp(f"{ff}.fn", d))
    p.update(ln("decoder_cross_attn.norm", query_channel))
    p.update(ln("decoder_cross_attn.norm_context", d))
    p.update(attn("decoder_cross_attn.fn", query_channel, d, output_channel))
    p.update(ln("decoder_ff.norm", output_channel))
    p.update(ffp("decoder_ff.fn", output_channel))
    return {k: v.astype(dtype) for k, v in p.items()}



# --------------------------------------------------------------------------------------------
# The whole model: pos2fourier features and EncoderProcessorDecoder's full state-dict names


def pos2fourier_forward(pos, *, num_bands, max_resolution, concat_pos: bool = True, sine_only: bool = False):
    r"""IPOT's ``pos2fourier`` features (``models/ipot/position_encoding.py``,
    ``generate_fourier_features``).

    For positions $p\in\mathbb R^{d}$ and bands $\nu_{a,k} = \mathrm{linspace}(1, r_a/2, K)_k$
    ($r_a$ = ``max_resolution[a]``): $f_{ak} = p_a\nu_{ak}$ flattened axis-major to $dK$ features,
    output $[\,p\,\|\,\sin(\pi f)\,\|\,\cos(\pi f)\,]$ (``concat_pos``; ``sine_only`` drops the
    cosines). Backward: $\bar p_a = \bar y_{p,a} + \pi\sum_k\nu_{ak}\big(\cos(\pi f_{ak})\,\bar y_{\sin,ak}
    - \sin(\pi f_{ak})\,\bar y_{\cos,ak}\big)$.

    Parameters
    ----------
    pos : array (..., d)
    num_bands : int or sequence of d ints
        Bands per axis $K$ (upstream stacks the per-axis ``linspace`` rows, so all must be equal;
        an int applies to every axis).
    max_resolution : int or sequence of d ints

    Returns
    -------
    feats (..., [d +] (2|1) d K), cache
    """
    pos = as_float(pos, "pos", min_ndim=1)
    d = pos.shape[-1]
    bands = [check_int(k, "num_bands", minimum=1) for k in
             (np.atleast_1d(num_bands).tolist() if np.ndim(num_bands) else [num_bands] * d)]
    res = [check_positive(r, "max_resolution") for r in
           (np.atleast_1d(max_resolution).tolist() if np.ndim(max_resolution) else [max_resolution] * d)]
    if len(bands) != d or len(res) != d:
        raise ValueError(f"num_bands and max_resolution need one entry per position axis (d={d}); "
                         f"got {len(bands)} and {len(res)}")
    if len(set(bands)) != 1:
        raise ValueError(f"upstream stacks one linspace per axis: num_bands must be equal; got {bands}")
    for name, val in (("concat_pos", concat_pos), ("sine_only", sine_only)):
        if not isinstance(val, (bool, np.bool_)):
            raise TypeError(f"{name} must be a bool; got {type(val).__name__}")
    freq = np.stack([np.linspace(1.0, r / 2, bands[0]) for r in res]).astype(pos.dtype)   # (d, K)
    f = (pos[..., :, None] * freq).reshape(pos.shape[:-1] + (d * bands[0],))
    parts = ([pos] if concat_pos else []) + [np.sin(np.pi * f)] + ([] if sine_only else [np.cos(np.pi * f)])
    out = np.concatenate(parts, axis=-1)
    return out, {"pos": pos, "f": f, "freq": freq, "concat_pos": concat_pos, "sine_only": sine_only,
                 "out_shape": out.shape}


def pos2fourier_backward(dout, cache):
    """Gradient ``{"pos"}`` of :func:`pos2fourier_forward` (formula in its docstring)."""
    pos, f, freq = cache["pos"], cache["f"], cache["freq"]
    g = as_dout(dout, cache["out_shape"], pos.dtype)
    d, nf = pos.shape[-1], f.shape[-1]
    i = d if cache["concat_pos"] else 0
    dpos = g[..., :d].copy() if cache["concat_pos"] else np.zeros_like(pos)
    df = np.pi * np.cos(np.pi * f) * g[..., i:i + nf]
    if not cache["sine_only"]:
        df = df - np.pi * np.sin(np.pi * f) * g[..., i + nf:i + 2 * nf]
    return {"pos": dpos + np.sum(df.reshape(f.shape[:-1] + freq.shape) * freq, axis=-1)}


_MODEL_PREFIX = (("latents", "encoder."), ("encoder_", "encoder."), ("processor_", "processor."),
                 ("layers.", "processor."), ("decoder_", "decoder."))


def _model_key(core_key):
    return next(pre for head, pre in _MODEL_PREFIX if core_key.startswith(head)) + core_key


def ipot_model_forward(inputs, decoder_query, params, *, in_channel: int, num_bands, max_resolution,
                       **config):
    r"""IPOT as a whole model (``models/epd.py`` ``EncoderProcessorDecoder`` with
    ``IPOTBasicPreprocessor`` and ``IPOTDecoder``, ``position_encoding_type="pos2fourier"``).

    The input ``(B, *index_dims, in_channel + d)`` carries the function values in its first
    ``in_channel`` channels and the positions in the last $d$; the preprocessor flattens the index
    dims and feeds $[\,u\,\|\,\mathrm{pos2fourier}(x)\,]$ to the encoder; the decoder encodes
    ``decoder_query`` positions ``(*out_dims, d)`` (shared by the batch, as upstream repeats them)
    with the same ``pos2fourier`` and decodes every output point; then
    :func:`ipot_inducing_point_operator_forward`. Gradients reach the function values, the input
    positions and the query positions.

    Parameters
    ----------
    inputs : array (B, *index_dims, in_channel + d)
    decoder_query : array (*out_dims, d)
    params : dict
        The model's full state-dict names: ``encoder.latents``, ``encoder.encoder_cross_attn.*``,
        ``processor.processor_self_attn.*``, ``processor.processor_ff.*`` (or, unshared,
        ``processor.layers.{l}.{0,1}.*``), ``decoder.decoder_cross_attn.*``, ``decoder.decoder_ff.*``
        (linear weights transposed). Also accepted, as ``model.state_dict()`` holds them: the
        ``processor.layers.{l}.*`` aliases of the shared modules (must equal them; no gradient
        entry of their own) and the unused ``encoder.encoder_ff.*`` (zero gradient: upstream never
        calls it).
    in_channel : int
        Function channels (upstream ``input_channel``).
    num_bands, max_resolution
        ``pos2fourier`` settings (upstream ``--num_bands``, ``--max_resolution``, default 64, 64).
    **config
        The core's keywords (``num_layers``, heads, ``output_scale``, ...).

    Returns
    -------
    out (B, N_out, C_out), cache
    """
    inputs = as_float(inputs, "inputs", min_ndim=3)
    in_channel = check_int(in_channel, "in_channel", minimum=1)
    if inputs.shape[-1] <= in_channel:
        raise ValueError(f"inputs must carry in_channel={in_channel} function channels and the positions; "
                         f"got {inputs.shape[-1]} channels")
    decoder_query = as_float(decoder_query, "decoder_query", min_ndim=1)
    if decoder_query.shape[-1] != inputs.shape[-1] - in_channel:
        raise ValueError(f"decoder_query must have {inputs.shape[-1] - in_channel} position channels like the "
                         f"inputs; got shape {decoder_query.shape}")
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict; got {type(params).__name__}")
    shared = config.get("share_processor_weights", True)
    core, ignored = {}, []
    for key, val in params.items():
        if key.startswith("encoder.encoder_ff."):
            ignored.append(key)
            continue
        if shared and key.startswith("processor.layers."):
            ignored.append(key)
            continue
        pre, _, rest = key.partition(".")
        if pre not in ("encoder", "processor", "decoder") or _model_key(rest) != key:
            raise ValueError(f"unexpected parameter {key!r}: IPOT model keys start with 'encoder.', "
                             f"'processor.' or 'decoder.' (full state-dict names)")
        core[rest] = val
    for key in ignored:
        if key.startswith("processor.layers."):
            sub = key.split(".", 4)
            alias = {"0": "processor.processor_self_attn.", "1": "processor.processor_ff."}.get(sub[3])
            target = None if alias is None else alias + sub[4]
            if target not in params or np.shape(params[key]) != np.shape(params[target]) or \
                    not np.array_equal(params[key], params[target]):
                raise ValueError(f"{key} must be the alias of {target} (upstream shares one processor layer)")
    b = inputs.shape[0]
    flat = inputs.reshape(b, -1, inputs.shape[-1])
    enc_in, c_in = pos2fourier_forward(flat[..., in_channel:], num_bands=num_bands, max_resolution=max_resolution)
    q_flat = decoder_query.reshape(-1, decoder_query.shape[-1])
    q_enc, c_q = pos2fourier_forward(q_flat, num_bands=num_bands, max_resolution=max_resolution)
    x = np.concatenate([flat[..., :in_channel], enc_in.astype(flat.dtype, copy=False)], axis=-1)
    out, c_core = ipot_inducing_point_operator_forward(x, np.broadcast_to(q_enc, (b,) + q_enc.shape), core, **config)
    return out, {"core": c_core, "c_in": c_in, "c_q": c_q, "in_channel": in_channel, "in_shape": inputs.shape,
                 "q_shape": decoder_query.shape,
                 "unused": {k: np.shape(params[k]) for k in ignored if k.startswith("encoder.encoder_ff.")}}


def ipot_model_backward(dout, cache):
    """Gradients ``{"inputs", "decoder_query", <every params key given>}`` of :func:`ipot_model_forward`
    (full state-dict names; ``encoder.encoder_ff.*`` gets zeros; the ``processor.layers.*``
    aliases get no entry: their gradient is that of the shared ``processor.processor_*`` keys)."""
    g = ipot_inducing_point_operator_backward(dout, cache["core"])
    c = cache["in_channel"]
    dx = g.pop("inputs")
    dpos = pos2fourier_backward(dx[..., c:], cache["c_in"])["pos"]
    dq = pos2fourier_backward(g.pop("query").sum(axis=0), cache["c_q"])["pos"]
    grads = {_model_key(k): v for k, v in g.items()}
    grads.update({k: np.zeros(shp, dtype=dx.dtype) for k, shp in cache["unused"].items()})
    grads["inputs"] = np.concatenate([dx[..., :c], dpos], axis=-1).reshape(cache["in_shape"])
    grads["decoder_query"] = dq.reshape(cache["q_shape"])
    return grads


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _perturbed(rng, p, latent_scale=0.7):
    out = {}
    for k, v in p.items():
        if k == "latents":
            out[k] = rng.standard_normal(v.shape) * latent_scale
        elif k.endswith("norm.weight") or k.endswith("norm_context.weight"):
            out[k] = v + 0.3 * rng.standard_normal(v.shape)
        elif k.endswith("bias"):
            out[k] = v + 0.3 * rng.standard_normal(v.shape)
        else:
            out[k] = v * 1.5
    return out


def _sample(rng, size, shared=True, num_layers=1):
    if size == "tiny":
        n, c_in, n_out, c_q, c_out, m, d, mult, h = int(rng.integers(2, 4)), 2, 2, 2, 2, 2, 4, 1, 2
    else:
        n, c_in, n_out, c_q, c_out, m, d, mult, h = int(rng.integers(6, 10)), 3, 5, 3, 2, 4, 6, 2, 2
    p = ipot_init_params(rng, c_in, c_q, c_out, num_latents=m, latent_channel=d,
                         num_layers=num_layers, share_processor_weights=shared, ff_mult=mult)
    return Sample(inputs={"inputs": rng.standard_normal((2, n, c_in)),
                          "query": rng.standard_normal((2, n_out, c_q))},
                  params=_perturbed(rng, p),
                  config={"num_layers": num_layers, "encoder_heads": h, "processor_heads": h,
                          "decoder_heads": 1, "share_processor_weights": shared})


def _check_variants_fd(rng):
    from ..testing.gradcheck import gradcheck
    errs = []
    s = _sample(rng, "tiny", shared=False, num_layers=2)
    errs.append(gradcheck(ipot_inducing_point_operator_forward, ipot_inducing_point_operator_backward, s).max_rel)
    s = _sample(rng, "tiny", shared=True, num_layers=2)
    s.config.update(processor_kv_norm=True, decoder_query_residual=True, use_query_residual=False)
    pm = np.ones(s.inputs["inputs"].shape[:2], bool)
    pm[1, 0] = False
    s.config["mask"] = pm
    errs.append(gradcheck(ipot_inducing_point_operator_forward, ipot_inducing_point_operator_backward, s).max_rel)
    return max(errs)


def _check_input_permutation_invariance(rng):
    s = _sample(rng, "small")
    out = ipot_inducing_point_operator(**s.inputs, params=s.params, **s.config)
    perm = rng.permutation(s.inputs["inputs"].shape[1])
    out_p = ipot_inducing_point_operator(s.inputs["inputs"][:, perm], s.inputs["query"], s.params, **s.config)
    err = float(np.abs(out_p - out).max())
    assert err < 1e-12, f"output depends on the order of the input points: {err}"
    qp = rng.permutation(s.inputs["query"].shape[1])
    out_q = ipot_inducing_point_operator(s.inputs["inputs"], s.inputs["query"][:, qp], s.params, **s.config)
    err = max(err, float(np.abs(out_q - out[:, qp]).max()))
    assert err < 1e-12, f"not equivariant in the query points: {err}"
    return err


def _check_query_independence(rng):
    # Decoding is pointwise in the queries: a query's output does not depend on the other queries
    # (evaluate anywhere, any number of points), and the latent size is fixed while N varies.
    s = _sample(rng, "small")
    out = ipot_inducing_point_operator(**s.inputs, params=s.params, **s.config)
    one = ipot_inducing_point_operator(s.inputs["inputs"], s.inputs["query"][:, 2:3], s.params, **s.config)
    err = float(np.abs(one - out[:, 2:3]).max())
    assert err < 1e-12, f"a query's output depends on the other queries: {err}"
    return err


def _check_discretisation(rng):
    # Resolution change of a smooth input function: input points with duplicated entries are a
    # finer quadrature of the same function only when each point carries a weight; with plain
    # softmax attention, duplicating every input point exactly leaves the output unchanged
    # (softmax attention is a normalised average over points).
    s = _sample(rng, "small")
    out = ipot_inducing_point_operator(**s.inputs, params=s.params, **s.config)
    dup = np.repeat(s.inputs["inputs"], 3, axis=1)
    out_d = ipot_inducing_point_operator(dup, s.inputs["query"], s.params, **s.config)
    err = float(np.abs(out_d - out).max())
    assert err < 1e-12, f"uniform refinement (each point repeated) changes the output: {err}"
    return err


def _check_mask(rng):
    s = _sample(rng, "small")
    x = s.inputs["inputs"]
    pad = np.concatenate([x, rng.standard_normal((2, 3, x.shape[2])) * 5], axis=1)
    mask = np.ones(pad.shape[:2], bool)
    mask[:, -3:] = False
    a = ipot_inducing_point_operator(pad, s.inputs["query"], s.params, **s.config, mask=mask)
    b = ipot_inducing_point_operator(x, s.inputs["query"], s.params, **s.config)
    err = float(np.abs(a - b).max())
    assert err < 1e-12, f"masked padding changes the output: {err}"
    return err


def _check_model_fd(rng):
    # The whole model (pos2fourier on input and query positions, full state-dict names) by finite
    # differences: function values, input positions, query positions and every parameter; the
    # unused encoder_ff gets a zero gradient. Then pos2fourier alone, sine-only and without pos.
    from ..testing.gradcheck import gradcheck
    core = _perturbed(rng, ipot_init_params(rng, 1 + 6, 6, 1, num_latents=2, latent_channel=2, ff_mult=1))
    params = {_model_key(k): v for k, v in core.items()}
    params["encoder.encoder_ff.norm.weight"] = np.ones(2)
    x = np.concatenate([rng.standard_normal((2, 3, 1)), rng.random((2, 3, 2))], axis=-1)
    s = Sample(inputs={"inputs": x, "decoder_query": rng.random((2, 2))}, params=params,
               config={"in_channel": 1, "num_bands": [1, 1], "max_resolution": [4, 3], "num_layers": 1,
                       "encoder_heads": 1, "processor_heads": 1, "decoder_heads": 1})
    worst = gradcheck(ipot_model_forward, ipot_model_backward, s).max_rel
    for cp, so in ((True, True), (False, False)):
        s = Sample(inputs={"pos": rng.random((2, 3, 2))}, params={},
                   config={"num_bands": 3, "max_resolution": [8, 8], "concat_pos": cp, "sine_only": so})
        worst = max(worst, gradcheck(lambda pos, params=None, **c: pos2fourier_forward(pos, **c),
                                     pos2fourier_backward, s).max_rel)
    return worst


register(
    Mechanism(
        slug="ipot_inducing_point_operator", family="3-operator", tier="T1",
        title="IPOT: inducing-point (latent) operator transformer",
        paper="Lee & Oh, Inducing Point Operator Transformer, AAAI 2024",
        forward=ipot_inducing_point_operator_forward, backward=ipot_inducing_point_operator_backward,
        sample=_sample, docs="operator-attention.md#ipot-inducing-point-operator",
        checks={"variants_gradcheck": _check_variants_fd,
                "input_permutation_invariance": _check_input_permutation_invariance,
                "query_pointwise": _check_query_independence,
                "uniform_refinement_invariance": _check_discretisation,
                "mask_equals_unpadded": _check_mask, "whole_model_pos2fourier_gradcheck": _check_model_fd},
    ),
)
