r"""Relational attention and the dual attention layer of the Dual Attention Transformer (DAT):
heads that retrieve *relations* tagged with *symbols* next to ordinary (sensory) heads.

Relational attention, per head $h$ (width $d$), with $d_r$ relations:

$$\alpha^h = \mathrm{softmax}\big(s\,(xW_q^{attn,h})(xW_k^{attn,h})^\top + M\big),\qquad
r_{ij\ell} = s_r\,\langle x_iW^{rel}_{q,\ell},\,x_jW^{rel}_{k,\ell}\rangle,$$
$$\mathrm{RA}^h_i = \sum_j \alpha^h_{ij}\big(W_r^h\,r_{ij} + W_v^h s_{j}\big),\qquad \mathrm{RA} = [\mathrm{RA}^1\|\dots\|\mathrm{RA}^H]\,W_o,$$

$s = d^{-1/2}$, $s_r = d_{rel}^{-1/2}$. The value of a head is the relation vector between receiver
and sender mapped by $W_r^h$ (``wr`` $(H, d, d_r)$) plus a *symbol* $s_j$ identifying the sender.
Upstream never forms the $N\times N\times d$ tensor: it attends over the $N\times N\times d_r$
relations first ($\bar r^h_i = \sum_j\alpha^h_{ij}r_{ij}$), then maps by $W_r^h$ — as here.
``symmetric_rels`` ties $W^{rel}_k = W^{rel}_q$, so $r_{ij} = r_{ji}$. With position-relative symbols
the symbol depends on the pair, $s_{j-i}$ (a table $(N, N, C)$).

Symbols come from a symbol retriever applied to the layer input (upstream runs it on the block
input, before the block's norm; pass ``symbols`` to supply them yourself):

* ``"positional_symbols"``: $s_j = S[j]$ (``symbol_library.weight`` $(L_{max}, C)$);
* ``"position_relative"``: $s_{ij} = E[\mathrm{clip}(j - i, \pm\Delta) + \Delta]$
  (``rel_pos_enc.rel_pos_embeddings`` $(2\Delta+1, C)$);
* ``"symbolic_attention"``: multi-head attention from $q = xW_q + b$ over learned template
  features (keys) and a symbol library (values), both $(n_s, C)$, split into heads.

Dual attention = the concatenation of $H_{sa}$ self-attention heads and $H_{ra}$ relational heads,
each branch with its own output projection of width $(C/H_{tot})\,H_{\cdot}$, so that the concatenation has
width $C$ (upstream ``DualAttention``; equivalently one block-diagonal $W_O$).

Backward
--------
With $G^h$ the gradient of $\mathrm{RA}^h$: $dW_r^h = \sum \bar r^{h}_i\,{G^h_i}^\top$,
$d\bar r^h_i = W_r^{h\top}G^h_i$; the relation path adds $d\alpha^h_{ij} \mathrel{+}= \langle d\bar r^h_i, r_{ij}\rangle$
and gives $dr_{ij} = \sum_h\alpha^h_{ij}\,d\bar r^h_i$, then $dq^{rel} = s_r\,dR\,k^{rel}$,
$dk^{rel} = s_r\,dR^\top q^{rel}$ (added when tied). The symbol path is the attention core's value
path (or, for relative symbols, $d\alpha^h_{ij} \mathrel{+}= \langle G^h_i, W_v^h s_{ij}\rangle$ and
$d(W_vs)_{ij} = \alpha^h_{ij}G^h_i$); the core's backward (with ``dp``) turns $d\alpha$ into the
query/key gradients. The retrievers: a row scatter (positional), a clipped-index scatter-add
(relative), an attention VJP summed over the batch for the shared templates and library
(symbolic). The self-attention branch is `mha_forward`/`mha_backward`.

Sources
-------
Paper: Altabaa & Lafferty, "Disentangling and Integrating Relational and Sensory Information in
Transformer Architectures", arXiv 2405.16727 (2024). Upstream: Awni00/abstract_transformer
``relational_attention.py`` (``RelationalAttention``), ``dual_attention.py`` (``DualAttention``),
``attention.py`` (``Attention``), ``symbol_retrieval.py`` (``SymbolicAttention``,
``PositionalSymbolRetriever``, ``PositionRelativeSymbolRetriever``) and ``positional_encoding.py``
(``RelativePositionalEncoding``) @ b7da58354763a97ceff5ddabdb3ebe49a3bbf506. Not implemented
here: RoPE inside the heads, ``symmetric_attn``, ``share_attn_params``, relation activations other
than the default identity, and the ablation variants (RCA, disentangled RCA).
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_choice, check_param_keys, check_params, compute_dtype
from ...nn.linear import linear_prefixed, linear_prefixed_vjp, merge_heads, split_heads
from ...registry import Mechanism, Sample, register
from .core import attention_core_backward, attention_core_forward, check_size, expand_kv, reduce_kv
from .mha import mha_backward, mha_forward

__all__ = ["SYMBOL_RETRIEVERS", "relational_attention_forward", "relational_attention_backward",
           "symbol_retrieval_forward", "symbol_retrieval_backward", "dual_attention_forward",
           "dual_attention_backward", "dual_attention"]

SYMBOL_RETRIEVERS = ("symbolic_attention", "positional_symbols", "position_relative")
_RA_KEYS = ("wq_attn", "wk_attn", "wq_rel", "wk_rel", "wv", "wo")


# --------------------------------------------------------------------------------------------
# Relational attention (unvalidated core, shared by the public functions below)


def _ra_forward(x, symbols, p, pre, h, hkv, nrel, relative, symmetric_rels, mask_cfg):
    wq = p[pre + "wq_attn.weight"]
    kd = wq.shape[1] // h
    hd = p[pre + "wv.weight"].shape[1] // hkv
    rd = p[pre + "wq_rel.weight"].shape[1] // nrel
    qa = split_heads(linear_prefixed(p, pre + "wq_attn", x), h, kd)
    ka = split_heads(linear_prefixed(p, pre + "wk_attn", x), hkv, kd)
    qr = split_heads(linear_prefixed(p, pre + "wq_rel", x), nrel, rd)
    kr = qr if symmetric_rels else split_heads(linear_prefixed(p, pre + "wk_rel", x), nrel, rd)
    s_r = float(rd ** -0.5)
    rel = s_r * (qr @ np.swapaxes(kr, -1, -2))                               # (B.., R, N, N)
    sv = linear_prefixed(p, pre + "wv", symbols)
    scale = float(hd ** -0.5)
    if relative:
        svh = np.swapaxes(sv.reshape(sv.shape[:-1] + (hkv, hd)), -2, -3)     # (N_i, Hkv, N_j, hd)
        sve = expand_kv(svh, h // hkv)
        dummy = np.zeros(x.shape[:-2] + (hkv, x.shape[-2], 1), x.dtype)
        _, core = attention_core_forward(qa, ka, dummy, scale=scale, **mask_cfg)
        alpha = core["p"]
        att_sym = np.einsum("...hij,ihjd->...hid", alpha, sve)
    else:
        sve = None
        att_sym, core = attention_core_forward(qa, ka, split_heads(sv, hkv, hd), scale=scale, **mask_cfg)
        alpha = core["p"]
    att_rel = np.einsum("...hij,...rij->...hir", alpha, rel)                 # (B.., H, N, R)
    out_h = att_sym + np.einsum("...hir,hdr->...hid", att_rel, p[pre + "wr"])
    oc = merge_heads(out_h)
    y = linear_prefixed(p, pre + "wo", oc)
    return y, {"x": x, "symbols": symbols, "pre": pre, "qr": qr, "kr": kr, "s_r": s_r, "rel": rel, "sve": sve,
               "core": core, "att_rel": att_rel, "oc": oc, "dims": (h, hkv, nrel, kd, hd, rd),
               "relative": relative, "symmetric_rels": symmetric_rels}


def _ra_backward(g, c, p, grads):
    pre, x = c["pre"], c["x"]
    h, hkv, nrel, kd, hd, rd = c["dims"]
    dout_h = split_heads(linear_prefixed_vjp(grads, p, pre + "wo", g, c["oc"]), h, hd)
    core, rel = c["core"], c["rel"]
    alpha = core["p"]
    flat = lambda t: t.reshape((-1,) + t.shape[-3:])   # noqa: E731  (leading axes -> one batch axis)
    grads[pre + "wr"] = np.einsum("bhir,bhid->hdr", flat(c["att_rel"]), flat(dout_h))
    datt_rel = np.einsum("...hid,hdr->...hir", dout_h, p[pre + "wr"])
    dalpha = np.einsum("...hir,...rij->...hij", datt_rel, rel)
    drel = np.einsum("...hij,...hir->...rij", alpha, datt_rel)
    if c["relative"]:
        sve = c["sve"]
        dalpha = dalpha + np.einsum("...hid,ihjd->...hij", dout_h, sve)
        dsve = np.einsum("bhij,bhid->ihjd", flat(alpha), flat(dout_h))
        gc = attention_core_backward(np.zeros(core["out"].shape, x.dtype), core, dp=dalpha)
        dsv = np.swapaxes(reduce_kv(dsve, h // hkv), -2, -3)                 # (N_i, N_j, Hkv, hd)
        dsv = dsv.reshape(dsv.shape[:-2] + (hkv * hd,))
    else:
        gc = attention_core_backward(dout_h, core, dp=dalpha)
        dsv = merge_heads(gc["v"])
    dsym = linear_prefixed_vjp(grads, p, pre + "wv", dsv, c["symbols"])
    dqr = c["s_r"] * (drel @ c["kr"])
    dkr = c["s_r"] * (np.swapaxes(drel, -1, -2) @ c["qr"])
    if c["symmetric_rels"]:
        dx = linear_prefixed_vjp(grads, p, pre + "wq_rel", merge_heads(dqr + dkr), x)
    else:
        dx = linear_prefixed_vjp(grads, p, pre + "wq_rel", merge_heads(dqr), x)
        dx = dx + linear_prefixed_vjp(grads, p, pre + "wk_rel", merge_heads(dkr), x)
    dx = dx + linear_prefixed_vjp(grads, p, pre + "wq_attn", merge_heads(gc["q"]), x)
    dx = dx + linear_prefixed_vjp(grads, p, pre + "wk_attn", merge_heads(gc["k"]), x)
    return dx, dsym


def _ra_spec(pre, c, h, hkv, nrel, kd, hd, rd, symmetric_rels):
    spec = {pre + "wq_attn.weight": (c, h * kd), pre + "wk_attn.weight": (c, hkv * kd), pre + "wk_attn.bias": (hkv * kd,),
            pre + "wq_rel.weight": (c, nrel * rd), pre + "wr": (h, hd, nrel), pre + "wv.weight": (c, hkv * hd),
            pre + "wv.bias": (hkv * hd,), pre + "wo.weight": (h * hd, h * hd), pre + "wo.bias": (h * hd,)}
    if not symmetric_rels:
        spec[pre + "wk_rel.weight"] = (c, nrel * rd)
    return spec


def _ra_dims(params, pre, c, h, hkv, nrel, total):
    if c % total:
        raise ValueError(f"the model width C={c} must be a multiple of the total number of heads {total}")
    hd = c // total
    wq = as_float(params[pre + "wq_attn.weight"], pre + "wq_attn.weight", ndim=2)
    wqr = as_float(params[pre + "wq_rel.weight"], pre + "wq_rel.weight", ndim=2)
    if wq.shape[1] % h or wqr.shape[1] % nrel:
        raise ValueError(f"{pre}wq_attn.weight must have H*key_dim columns (H={h}) and {pre}wq_rel.weight "
                         f"R*rel_dim columns (R={nrel}); got {wq.shape}, {wqr.shape}")
    return wq.shape[1] // h, hd, wqr.shape[1] // nrel


_RA_OPT = ("wk_attn.bias", "wv.bias", "wo.bias")


def relational_attention_forward(x, symbols, params, *, n_heads: int, n_relations=None, n_kv_heads=None,
                                 total_n_heads=None, symmetric_rels: bool = False, relative_symbols: bool = False,
                                 attn_mask=None, is_causal: bool = False):
    r"""Relational attention (upstream ``RelationalAttention``): $\sum_j\alpha_{ij}(W_r r_{ij} + W_v s_j)$ per head.

    Parameters
    ----------
    x : array (B.., N, C)
    symbols : array (B.., N, C), or (N, N, C) with ``relative_symbols``
    params : dict
        ``"wq_attn.weight" (C, H*kd)``, ``"wk_attn.weight" (C, Hkv*kd)``, ``"wq_rel.weight" (C, R*rd)``,
        ``"wk_rel.weight"`` (absent with ``symmetric_rels``), ``"wr" (H, d, R)``, ``"wv.weight" (C, Hkv*d)``,
        ``"wo.weight" (H*d, H*d)``; optional ``"wk_attn.bias"``, ``"wv.bias"`` (``add_bias_kv``),
        ``"wo.bias"``. $d = C/$``total_n_heads``.
    n_heads, n_relations, n_kv_heads, total_n_heads : int
        $H$, $R$ (default $H$), key/value heads (default $H$), heads of the whole dual layer (default $H$).
    symmetric_rels, relative_symbols : bool
    attn_mask, is_causal
        As :func:`sdpa_forward` (upstream: True = attend).

    Returns
    -------
    out, cache
        ``out (B.., N, H*d)``; ``cache["rel"]`` holds the relations $r$ (B.., R, N, N).
    """
    x = as_float(x, "x", min_ndim=2)
    h = check_size(n_heads, "n_heads")
    nrel = h if n_relations is None else check_size(n_relations, "n_relations")
    hkv = h if n_kv_heads is None else check_size(n_kv_heads, "n_kv_heads")
    total = h if total_n_heads is None else check_size(total_n_heads, "total_n_heads")
    if h % hkv:
        raise ValueError(f"n_heads ({h}) must be a multiple of n_kv_heads ({hkv})")
    symbols = as_float(symbols, "symbols", ndim=3 if relative_symbols else x.ndim)
    n, c = x.shape[-2], x.shape[-1]
    want = (n, n, c) if relative_symbols else x.shape
    if symbols.shape != want:
        raise ValueError(f"symbols must have shape {want}; got {symbols.shape}")
    if params is None:
        raise TypeError("params is required: wq_attn, wk_attn, wq_rel, wk_rel, wr, wv, wo")
    req = [k + ".weight" for k in _RA_KEYS if not (symmetric_rels and k == "wk_rel")] + ["wr"]
    check_param_keys(params, req, list(_RA_OPT), where="relational_attention (weights (in, out); PyTorch: weight.T)")
    kd, hd, rd = _ra_dims(params, "", c, h, hkv, nrel, total)
    p = check_params(params, _ra_spec("", c, h, hkv, nrel, kd, hd, rd, symmetric_rels), optional=list(_RA_OPT),
                     where="relational_attention")
    dt = compute_dtype(x, symbols, *p.values())
    x, symbols, p = x.astype(dt, copy=False), symbols.astype(dt, copy=False), cast_all(dt, p)
    y, cache = _ra_forward(x, symbols, p, "", h, hkv, nrel, relative_symbols, symmetric_rels,
                           {"attn_mask": attn_mask, "is_causal": is_causal})
    cache.update(p=p, y_shape=y.shape)
    return y, cache


def relational_attention_backward(dout, cache):
    """Gradient of :func:`relational_attention_forward`: ``x``, ``symbols`` and every params key."""
    g = as_dout(dout, cache["y_shape"], cache["x"].dtype)
    grads = {}
    dx, dsym = _ra_backward(g, cache, cache["p"], grads)
    grads["x"], grads["symbols"] = dx, dsym
    return grads


# --------------------------------------------------------------------------------------------
# Symbol retrievers


def _retriever_spec(kind, c, params, symbolic_n_heads):
    pre = "symbol_retriever."
    if kind == "positional_symbols":
        lib = as_float(params.get(pre + "symbol_library.weight"), pre + "symbol_library.weight", ndim=2)
        return {pre + "symbol_library.weight": (lib.shape[0], c)}, []
    if kind == "position_relative":
        tab = as_float(params.get(pre + "rel_pos_enc.rel_pos_embeddings"), pre + "rel_pos_enc.rel_pos_embeddings", ndim=2)
        if tab.shape[0] % 2 == 0:
            raise ValueError(f"{pre}rel_pos_enc.rel_pos_embeddings must have 2*max_rel_pos+1 rows; got {tab.shape}")
        return {pre + "rel_pos_enc.rel_pos_embeddings": (tab.shape[0], c)}, []
    if c % symbolic_n_heads:
        raise ValueError(f"the width C={c} must be a multiple of symbolic_n_heads={symbolic_n_heads}")
    ns = as_float(params.get(pre + "template_features"), pre + "template_features", ndim=2).shape[0]
    return {pre + "q_proj.weight": (c, c), pre + "q_proj.bias": (c,), pre + "template_features": (ns, c),
            pre + "symbol_library": (ns, c)}, [pre + "q_proj.bias"]


def symbol_retrieval_forward(x, p, kind, symbolic_n_heads=1):
    """Symbols for :func:`relational_attention_forward` from validated params (unvalidated helper):
    ``(B.., N, C)``, or ``(N, N, C)`` for ``"position_relative"``; returns ``(symbols, cache)``."""
    pre = "symbol_retriever."
    n, c = x.shape[-2], x.shape[-1]
    if kind == "positional_symbols":
        lib = p[pre + "symbol_library.weight"]
        if n > lib.shape[0]:
            raise ValueError(f"x has N={n} tokens but {pre}symbol_library.weight only {lib.shape[0]} rows")
        return np.broadcast_to(lib[:n], x.shape).copy(), {"kind": kind, "n": n, "lead": x.shape[:-2]}
    if kind == "position_relative":
        tab = p[pre + "rel_pos_enc.rel_pos_embeddings"]
        delta = tab.shape[0] // 2
        idx = np.clip(np.arange(n)[None, :] - np.arange(n)[:, None], -delta, delta) + delta
        return tab[idx], {"kind": kind, "idx": idx, "rows": tab.shape[0]}
    hs = symbolic_n_heads
    q = split_heads(linear_prefixed(p, pre + "q_proj", x), hs, c // hs)
    key = np.swapaxes(p[pre + "template_features"].reshape(-1, hs, c // hs), 0, 1)
    val = np.swapaxes(p[pre + "symbol_library"].reshape(-1, hs, c // hs), 0, 1)
    lead = x.shape[:-2]
    o, core = attention_core_forward(q, np.broadcast_to(key, lead + key.shape), np.broadcast_to(val, lead + val.shape))
    return merge_heads(o), {"kind": kind, "x": x, "core": core, "hs": hs}


def symbol_retrieval_backward(dsym, rc, p, grads):
    """Backward of :func:`symbol_retrieval_forward`: adds the retriever's param gradients to ``grads``
    and returns the gradient of its input ``x`` (``None`` for the input-independent retrievers)."""
    pre = "symbol_retriever."
    kind = rc["kind"]
    if kind == "positional_symbols":
        lib = np.zeros_like(p[pre + "symbol_library.weight"])
        lib[:rc["n"]] = dsym.reshape((-1,) + dsym.shape[-2:]).sum(axis=0)
        grads[pre + "symbol_library.weight"] = lib
        return None
    if kind == "position_relative":
        tab = np.zeros((rc["rows"], dsym.shape[-1]), dsym.dtype)
        np.add.at(tab, rc["idx"], dsym)
        grads[pre + "rel_pos_enc.rel_pos_embeddings"] = tab
        return None
    hs, x = rc["hs"], rc["x"]
    c = x.shape[-1]
    gc = attention_core_backward(split_heads(dsym, hs, c // hs), rc["core"])
    for name, key in (("template_features", "k"), ("symbol_library", "v")):
        gsum = gc[key].reshape((-1,) + gc[key].shape[-3:]).sum(axis=0)          # (Hs, n_s, C/Hs)
        grads[pre + name] = np.swapaxes(gsum, 0, 1).reshape(-1, c)
    return linear_prefixed_vjp(grads, p, pre + "q_proj", merge_heads(gc["q"]), x)


# --------------------------------------------------------------------------------------------
# Dual attention


def dual_attention_forward(x, params, symbols=None, *, n_heads_sa: int, n_heads_ra: int,
                           symbol_retrieval: str = "symbolic_attention", symbolic_n_heads: int = 1,
                           n_relations=None, n_kv_heads=None, symmetric_rels: bool = False,
                           attn_mask=None, is_causal: bool = False):
    r"""Dual attention layer (DAT): $[\mathrm{SA}(x)\,\|\,\mathrm{RA}(x, s)]$ with symbols $s$ retrieved from $x$.

    Parameters
    ----------
    x : array (B.., N, C)
    params : dict
        ``"self_attention.{wq,wk,wv,wo}.weight"`` (optional ``wk``/``wv``/``wo`` biases),
        ``"relational_attention.<...>"`` as :func:`relational_attention_forward`, and, unless
        ``symbols`` is given, the retriever's ``"symbol_retriever.<...>"``: ``symbol_library.weight
        (L_max, C)`` (positional), ``rel_pos_enc.rel_pos_embeddings (2Δ+1, C)`` (relative) or
        ``q_proj.weight (C, C)``, optional ``q_proj.bias``, ``template_features (n_s, C)``,
        ``symbol_library (n_s, C)`` (symbolic attention). Upstream names, weights ``(in, out)``.
    symbols : array (B.., N, C), optional
        Given symbols (then no retriever params); a differentiable input.
    n_heads_sa, n_heads_ra : int
        Sensory and relational heads (one of them may be 0); $d = C/(H_{sa}+H_{ra})$.
    symbol_retrieval : {"symbolic_attention", "positional_symbols", "position_relative"}
    symbolic_n_heads : int
        Heads of the symbolic-attention retriever.
    n_relations, n_kv_heads, symmetric_rels
        Of the relational branch (defaults $H_{ra}$, $H_{ra}$, False); the sensory branch is MHA.
    attn_mask, is_causal
        Shared by both branches.

    Returns
    -------
    out, cache
        ``out (B.., N, C)``.
    """
    x = as_float(x, "x", min_ndim=2)
    hsa, hra = check_size(n_heads_sa, "n_heads_sa", 0), check_size(n_heads_ra, "n_heads_ra", 0)
    if hsa + hra == 0:
        raise ValueError("at least one of n_heads_sa and n_heads_ra must be positive")
    check_choice(symbol_retrieval, "symbol_retrieval", SYMBOL_RETRIEVERS)
    hs = check_size(symbolic_n_heads, "symbolic_n_heads")
    c = x.shape[-1]
    total = hsa + hra
    if c % total:
        raise ValueError(f"the width C={c} of x must be a multiple of n_heads_sa + n_heads_ra = {total}")
    hd = c // total
    if params is None:
        raise TypeError("params is required: self_attention.*, relational_attention.* and symbol_retriever.*")
    if not isinstance(params, dict):
        raise TypeError(f"params must be a dict of arrays; got {type(params).__name__}")
    spec, optional = {}, []
    if hsa:
        spec.update({"self_attention.wq.weight": (c, hsa * hd), "self_attention.wk.weight": (c, hsa * hd),
                     "self_attention.wv.weight": (c, hsa * hd), "self_attention.wo.weight": (hsa * hd, hsa * hd),
                     "self_attention.wk.bias": (hsa * hd,), "self_attention.wv.bias": (hsa * hd,),
                     "self_attention.wo.bias": (hsa * hd,)})
        optional += ["self_attention.wk.bias", "self_attention.wv.bias", "self_attention.wo.bias"]
    nrel = hra if n_relations is None else check_size(n_relations, "n_relations")
    hkv = hra if n_kv_heads is None else check_size(n_kv_heads, "n_kv_heads")
    relative = symbol_retrieval == "position_relative" and symbols is None
    if hra:
        if hra % hkv:
            raise ValueError(f"n_heads_ra ({hra}) must be a multiple of n_kv_heads ({hkv})")
        pre = "relational_attention."
        for k in ("wq_attn.weight", "wq_rel.weight"):
            if pre + k not in params:
                raise ValueError(f"params is missing keys ['{pre + k}'] for dual_attention")
        kd, _, rd = _ra_dims(params, pre, c, hra, hkv, nrel, total)
        spec.update(_ra_spec(pre, c, hra, hkv, nrel, kd, hd, rd, symmetric_rels))
        optional += [pre + k for k in _RA_OPT]
    if symbols is None and hra:
        rs, ropt = _retriever_spec(symbol_retrieval, c, params, hs)
        spec.update(rs)
        optional += ropt
    elif symbols is not None:
        symbols = as_float(symbols, "symbols", ndim=x.ndim)
        if symbols.shape != x.shape:
            raise ValueError(f"symbols must have x's shape {x.shape}; got {symbols.shape}")
    p = check_params(params, spec, optional=optional, where="dual_attention")
    dt = compute_dtype(x, symbols, *p.values())
    x, p = x.astype(dt, copy=False), cast_all(dt, p)
    mask_cfg = {"attn_mask": attn_mask, "is_causal": is_causal}
    parts, cache = [], {"p": p, "x": x, "hsa": hsa, "hra": hra, "given": symbols is not None}
    if hsa:
        pm = {"q_proj": p["self_attention.wq.weight"], "k_proj": p["self_attention.wk.weight"],
              "v_proj": p["self_attention.wv.weight"], "out_proj": p["self_attention.wo.weight"]}
        pm.update({m + "_bias": p[f"self_attention.{w}.bias"] for m, w in (("k_proj", "wk"), ("v_proj", "wv"),
                                                                           ("out_proj", "wo"))
                   if f"self_attention.{w}.bias" in p})
        e, cache["sa"] = mha_forward(x, params=pm, num_heads=hsa, **mask_cfg)
        parts.append(e)
    if hra:
        if symbols is None:
            sym, cache["retriever"] = symbol_retrieval_forward(x, p, symbol_retrieval, hs)
        else:
            sym = symbols.astype(dt, copy=False)
        a, cache["ra"] = _ra_forward(x, sym, p, "relational_attention.", hra, hkv, nrel, relative, symmetric_rels,
                                     mask_cfg)
        parts.append(a)
    y = np.concatenate(parts, axis=-1)
    cache["y_shape"], cache["hd"] = y.shape, hd
    return y, cache


def dual_attention_backward(dout, cache):
    """Gradient of :func:`dual_attention_forward`: ``x`` (and ``symbols`` when given), both
    branches' params and the retriever's."""
    p, x = cache["p"], cache["x"]
    g = as_dout(dout, cache["y_shape"], x.dtype)
    grads = {}
    wsa = cache["hsa"] * cache["hd"]
    dx = np.zeros_like(x)
    if cache["hsa"]:
        gs = mha_backward(g[..., :wsa], cache["sa"])
        dx = dx + gs["x"]
        for m, w in (("q_proj", "wq"), ("k_proj", "wk"), ("v_proj", "wv"), ("out_proj", "wo")):
            grads[f"self_attention.{w}.weight"] = gs[m]
            if m + "_bias" in gs:
                grads[f"self_attention.{w}.bias"] = gs[m + "_bias"]
    if cache["hra"]:
        dxr, dsym = _ra_backward(g[..., wsa:], cache["ra"], p, grads)
        dx = dx + dxr
        if cache["given"]:
            grads["symbols"] = dsym
        else:
            dxs = symbol_retrieval_backward(dsym, cache["retriever"], p, grads)
            if dxs is not None:
                dx = dx + dxs
    grads["x"] = dx
    return grads


def dual_attention(x, params, symbols=None, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`dual_attention_forward`."""
    return dual_attention_forward(x, params, symbols, **config)[0]


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _init(rng, c, hsa, hra, *, retrieval="symbolic_attention", n_symbols=3, max_len=8, max_rel=2, nrel=None,
          symmetric_rels=False, bias=False, hs=1):
    total = hsa + hra
    hd = c // total
    nrel = hra if nrel is None else nrel
    p = {}

    def w(i, o):
        return rng.uniform(-1, 1, (i, o)) / np.sqrt(i)

    if hsa:
        for n in ("wq", "wk", "wv"):
            p[f"self_attention.{n}.weight"] = w(c, hsa * hd)
        p["self_attention.wo.weight"] = w(hsa * hd, hsa * hd)
        if bias:
            p["self_attention.wv.bias"] = 0.1 * rng.standard_normal(hsa * hd)
    if hra:
        pre = "relational_attention."
        rd = hd * hra // nrel
        p[pre + "wq_attn.weight"], p[pre + "wk_attn.weight"] = w(c, hra * hd), w(c, hra * hd)
        p[pre + "wq_rel.weight"] = w(c, nrel * rd)
        if not symmetric_rels:
            p[pre + "wk_rel.weight"] = w(c, nrel * rd)
        p[pre + "wr"] = rng.uniform(-1, 1, (hra, hd, nrel)) / np.sqrt(nrel)
        p[pre + "wv.weight"], p[pre + "wo.weight"] = w(c, hra * hd), w(hra * hd, hra * hd)
        if bias:
            p[pre + "wv.bias"], p[pre + "wo.bias"] = 0.1 * rng.standard_normal(hra * hd), 0.1 * rng.standard_normal(hra * hd)
        r = "symbol_retriever."
        if retrieval == "positional_symbols":
            p[r + "symbol_library.weight"] = rng.standard_normal((max_len, c))
        elif retrieval == "position_relative":
            p[r + "rel_pos_enc.rel_pos_embeddings"] = rng.standard_normal((2 * max_rel + 1, c))
        else:
            p[r + "q_proj.weight"], p[r + "q_proj.bias"] = w(c, c), 0.1 * rng.standard_normal(c)
            p[r + "template_features"] = rng.standard_normal((n_symbols, c))
            p[r + "symbol_library"] = rng.standard_normal((n_symbols, c))
    return p


def _sample(rng, size):
    retrieval = str(rng.choice(SYMBOL_RETRIEVERS))
    if size == "tiny":
        n, c, hsa, hra = int(rng.integers(2, 4)), 4, 1, 1
    else:
        n, c, hsa, hra = int(rng.integers(4, 7)), 8, 2, 2
    sym = bool(rng.random() < 0.3)
    params = _init(rng, c, hsa, hra, retrieval=retrieval, n_symbols=2 if size == "tiny" else 4, max_rel=1 if size == "tiny" else 2,
                   symmetric_rels=sym, bias=bool(rng.random() < 0.5), hs=1 if size == "tiny" else 2)
    cfg = {"n_heads_sa": hsa, "n_heads_ra": hra, "symbol_retrieval": retrieval, "symmetric_rels": sym,
           "symbolic_n_heads": 1 if size == "tiny" else 2, "is_causal": bool(rng.random() < 0.5)}
    return Sample(inputs={"x": rng.standard_normal((2, n, c))}, params=params, config=cfg)


def _check_wr_zero_is_attention_over_symbols(rng):
    # W_r = 0 and positional symbols: relational heads attend over the fixed value table S W_v
    from .sdpa import sdpa

    x = rng.standard_normal((2, 5, 4))
    p = _init(rng, 4, 0, 2, retrieval="positional_symbols")
    pre = "relational_attention."
    p[pre + "wr"] = np.zeros_like(p[pre + "wr"])
    y = dual_attention(x, p, n_heads_sa=0, n_heads_ra=2, symbol_retrieval="positional_symbols", is_causal=True)
    table = p["symbol_retriever.symbol_library.weight"][:5] @ p[pre + "wv.weight"]
    q = split_heads(x @ p[pre + "wq_attn.weight"], 2, 2)
    k = split_heads(x @ p[pre + "wk_attn.weight"], 2, 2)
    o = sdpa(q, k, np.broadcast_to(split_heads(table, 2, 2), q.shape), is_causal=True)
    err = float(np.abs(y - merge_heads(o) @ p[pre + "wo.weight"]).max())
    assert err < 1e-12, err
    return err


def _check_symmetric_relations(rng):
    x = rng.standard_normal((2, 5, 6))
    p = _init(rng, 6, 1, 2, symmetric_rels=True)
    _, c = dual_attention_forward(x, p, n_heads_sa=1, n_heads_ra=2, symmetric_rels=True)
    rel = c["ra"]["rel"]
    err = float(np.abs(rel - np.swapaxes(rel, -1, -2)).max())
    _, c2 = dual_attention_forward(x, _init(rng, 6, 1, 2), n_heads_sa=1, n_heads_ra=2)
    assert err < 1e-14 and np.abs(c2["ra"]["rel"] - np.swapaxes(c2["ra"]["rel"], -1, -2)).max() > 1e-3, err
    return err


def _check_sensory_only_is_mha(rng):
    x = rng.standard_normal((2, 4, 6))
    p = _init(rng, 6, 3, 0, bias=True)
    y = dual_attention(x, p, n_heads_sa=3, n_heads_ra=0, is_causal=True)
    pm = {"q_proj": p["self_attention.wq.weight"], "k_proj": p["self_attention.wk.weight"],
          "v_proj": p["self_attention.wv.weight"], "out_proj": p["self_attention.wo.weight"],
          "v_proj_bias": p["self_attention.wv.bias"]}
    err = float(np.abs(y - mha_forward(x, params=pm, num_heads=3, is_causal=True)[0]).max())
    assert err < 1e-12, err
    return err


def _check_relative_symbols_translation(rng):
    # with position-relative symbols and no other position signal the layer is shift-equivariant
    # away from the clipping boundary: permuting nothing, compare to an explicit per-pair loop
    x = rng.standard_normal((2, 4, 4))
    p = _init(rng, 4, 0, 1, retrieval="position_relative", max_rel=1)
    y = dual_attention(x, p, n_heads_sa=0, n_heads_ra=1, symbol_retrieval="position_relative")
    pre = "relational_attention."
    tab = p["symbol_retriever.rel_pos_enc.rel_pos_embeddings"] @ p[pre + "wv.weight"]
    q, k = x @ p[pre + "wq_attn.weight"], x @ p[pre + "wk_attn.weight"]
    qr, kr = x @ p[pre + "wq_rel.weight"], x @ p[pre + "wk_rel.weight"]
    ref = np.zeros((2, 4, 4))
    for b in range(2):
        for i in range(4):
            lg = q[b, i] @ k[b].T / 2.0
            a = np.exp(lg - lg.max())
            a /= a.sum()
            for j in range(4):
                r = qr[b, i] @ kr[b, j] / 2.0
                ref[b, i] += a[j] * (p[pre + "wr"][0, :, 0] * r + tab[np.clip(j - i, -1, 1) + 1])
    err = float(np.abs(y - ref @ p[pre + "wo.weight"]).max())
    assert err < 1e-12, err
    return err


register(
    Mechanism(
        slug="relational_attention", family="1-softmax", tier="T2",
        title="Relational attention heads with symbols, and the dual (sensory + relational) attention layer",
        paper="Altabaa & Lafferty, Disentangling and Integrating Relational and Sensory Information in Transformer "
              "Architectures, arXiv 2405.16727 (2024)",
        forward=dual_attention_forward, backward=dual_attention_backward, sample=_sample,
        docs="softmax/qkv-variants.md#relational-attention",
        checks={"wr_zero_is_attention_over_symbols": _check_wr_zero_is_attention_over_symbols,
                "symmetric_relations": _check_symmetric_relations, "sensory_only_is_mha": _check_sensory_only_is_mha,
                "relative_symbols_loop": _check_relative_symbols_translation},
    ),
)
