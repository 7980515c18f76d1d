r"""ETC global–local attention: a few global tokens attend to everything, long tokens attend to
a band of radius $r$ of long tokens plus all global tokens, with Shaw-style relative position
ids in every piece (g2g, g2l, l2g, l2l) — upstream's ``FusedGlobalLocalAttention``.

Ainslie, Ontañón, Alberti, Cvicek, Fisher, Pham, Ravula, Sanghai, Wang, Yang, "ETC: Encoding Long
and Structured Inputs in Transformers", EMNLP 2020, arXiv 2004.08483. Upstream read (TensorFlow):
``google-research/google-research etcmodel/layers/attention.py``
@0c1bbe5fc971a1de1a427debc814e66ab4f1e7fa (``FusedGlobalLocalAttention``,
``QkvRelativeAttention``, ``QkvRelativeLocalAttention`` with its blocked "sparse" and "full"
implementations, ``ProjectAttentionHeads``), ``etcmodel/tensor_utils.py`` (``split_into_blocks``,
``concat_3_blocks``, ``skew_elements_right``) and ``etcmodel/feature_utils.py``
(``RelativePositionGenerator``) at the same commit. Parameter names are upstream's Keras layer
names with ``kernel`` called ``weight`` (a Keras kernel is already ``(in, out)``: no transpose).

Forward
-------
Long input $x^l\in\mathbb R^{B\times N_l\times C}$, global input $x^g\in\mathbb R^{B\times N_g\times C}$;
per head $h$ (width $d$), with $q, k, v$ from the role's projection (``long_query_projection``,
``l2l_key_projection``, ``l2g_key_projection`` …) and relative tables $E\in\mathbb R^{V\times H\times d}$,
$\beta\in\mathbb R^{V\times H}$ (one pair for the long side, one for the global side):

$$
s_{ij} = \frac{q_i^\top k_j + q_i^\top E_{\mathrm{id}_{ij}} + \beta_{\mathrm{id}_{ij}}}{\sqrt d}
 - 10^4\,(1 - m_{ij}),
$$

long queries take the softmax over $[\,\text{l2l band } j\in[i-r, i+r]\ \Vert\ \text{l2g: all global}\,]$,
global queries over $[\,\text{g2g: all global}\ \Vert\ \text{g2l: all long}\,]$; then
$o_i = \sum_j p_{ij}v_j$ and the output projections (``long_output_projection``,
``global_output_projection``). Masks $m$ (0/1) and ids are optional inputs; the l2l ones are in
band storage ``(B, N_l, 2r+1)`` (slot $w$ is key $i - r + w$). Band slots outside the sequence
are excluded. The output is the one array $[\,\text{global}\ ;\ \text{long}\,]$ of shape
``(B, N_g + N_l, C)`` (the layout of the equivalent standard transformer).

Fast form and explicit form. The band is stored as ``(N_l, 2r+1)`` (keys gathered per query:
cost $O(N_g^2 + N_gN_l + N_l(2r+1+N_g))$). Upstream's sparse path cuts the sequence into blocks
of $r+1$ and lets each block see 3 blocks with the band mask; its full path skews the band mask
to $N_l\times N_l$. Both put $-10^4$ on every non-band long key, whose weight $e^{-10^4}$
underflows to exactly 0 — so all three equal the dense masked attention that the registry's
reference evaluates (tested to round-off, forward and gradients).

Backward
--------
Per branch, with keys gathered per query ($K_{i,\cdot}$): $\bar p_{ij} = \bar o_i^\top v_j$,
$\bar s = \mathrm{softmax\_vjp}(p, \bar p)/\sqrt d$, $\bar q_i = \sum_j\bar s_{ij}(k_j + E_{\mathrm{id}_{ij}})$,
$\bar k_j \mathrel{+}= \bar s_{ij}q_i$, $\bar v_j \mathrel{+}= p_{ij}\bar o_i$; the band gather's adjoint
is an overlap-add into the long keys/values (a key is in $2r+1$ bands), the broadcast side
keys' adjoint a sum over queries; the id lookup's adjoint accumulates
$\bar a_{iv} = \sum_{j:\mathrm{id}_{ij}=v}\bar s_{ij}$, giving $\bar E_v = \sum_i\bar a_{iv}q_i$,
$\bar\beta_v = \sum_i\bar a_{iv}$ and $\bar q_i \mathrel{+}= \sum_v\bar a_{iv}E_v$. Shared projections
(``share_kv_projections``, ``share_qkv_projections``, ``share_att_output_projection``) add the
gradients of every role that uses them. Masks and ids are integer inputs (not differentiated).

Conventions (keywords, upstream defaults): mask fill $-10^4$ added (``mask_value``), scale
$1/\sqrt d$ applied after adding the relative terms, no sharing, no dropout. A long query whose
every key is masked gets a near-uniform average of its in-range keys here; upstream's result
then depends on its implementation (padding keys of the blocked path) — give every query one
unmasked key. refattn requires equal long and global hidden sizes (one output array); upstream
allows them to differ.

Measured agreement with upstream: the TensorFlow code cannot run here (no TensorFlow). Its
blocked sparse path (``split_into_blocks``, ``concat_3_blocks``, ``skew_elements_right``,
``_expand_local_ids_to_blocks`` with padding masks, side-key tiling) and
``QkvRelativeAttention`` were transcribed into a torch scratch script and differentiated by
autograd. Float64, $B=2$, $N_l=11$, $N_g=3$, $C=8$, 2 heads, $r=2$ (blocks of 3, a partial last
block), random 0/1 masks on all four pieces (one key kept per row), relative ids from
``RelativePositionGenerator(max_distance=3)`` for l2l/g2g and random ids elsewhere, no sharing:
output max abs error 1.0e-15 (rel 3.4e-16); gradients of both inputs, the 12 projections'
weights and biases and the 4 relative tables max rel error 9.3e-16.
"""

from __future__ import annotations

import numpy as np

from ..._checks import as_dout, as_float, cast_all, check_int, check_params
from ...nn.linear import linear_prefixed, linear_prefixed_vjp, merge_heads, split_heads
from ...nn.softmax import softmax_lse, softmax_vjp
from ...registry import Mechanism, Sample, register

__all__ = ["etc_global_local_attention_forward", "etc_global_local_attention_backward", "etc_global_local_attention",
           "etc_relative_position_ids", "etc_local_relative_position_ids", "etc_band_indices",
           "init_etc_params", "ETC_ROLES"]

ETC_ROLES = ("long_query_projection", "l2l_key_projection", "l2g_key_projection", "l2l_value_projection",
             "l2g_value_projection", "global_query_projection", "g2g_key_projection", "g2l_key_projection",
             "g2g_value_projection", "g2l_value_projection")
_LONG_REL, _GLOBAL_REL = "long_qkv_attention.qkv_relative_attention", "global_qkv_attention"


def etc_relative_position_ids(n: int, max_distance: int, *, ignore_direction: bool = False) -> np.ndarray:
    r"""Upstream ``RelativePositionGenerator.make_relative_att_ids`` for one sequence: ``(n, n)``
    ids of $\delta = j - i$: $\min(\delta, D)$ for $\delta\ge 0$, $D + \min(-\delta, D)$ for
    $\delta<0$ ($\min(|\delta|, D)$ with ``ignore_direction``); vocabulary $2D+1$ (or $D+1$)."""
    n, D = check_int(n, "n", minimum=1), check_int(max_distance, "max_distance", minimum=0)
    return _rel_id(np.arange(n)[None, :] - np.arange(n)[:, None], D, ignore_direction)


def etc_local_relative_position_ids(n: int, local_radius: int, max_distance: int, *,
                                    ignore_direction: bool = False) -> np.ndarray:
    """Upstream ``make_local_relative_att_ids``: ``(n, 2r+1)`` band ids (slot ``w`` is offset ``w - r``)."""
    n, r = check_int(n, "n", minimum=1), check_int(local_radius, "local_radius", minimum=1)
    D = check_int(max_distance, "max_distance", minimum=0)
    return np.broadcast_to(_rel_id(np.arange(-r, r + 1), D, ignore_direction), (n, 2 * r + 1)).copy()


def _rel_id(delta, D, ignore_direction):
    if ignore_direction:
        return np.minimum(np.abs(delta), D)
    return np.where(delta >= 0, np.minimum(delta, D), D + np.minimum(-delta, D))


def etc_band_indices(n: int, local_radius: int):
    """Band storage of local attention: ``idx (n, 2r+1)`` = ``i - r + w`` clipped into range, and
    ``inside (n, 2r+1)``, False where the key falls outside the sequence."""
    off = np.arange(-local_radius, local_radius + 1)
    raw = np.arange(n)[:, None] + off[None, :]
    inside = (raw >= 0) & (raw < n)
    return np.clip(raw, 0, n - 1), inside


def _role_keys(share_kv, share_qkv, share_out):
    m = {r: r for r in ETC_ROLES}
    if share_qkv or share_kv:
        m["l2g_key_projection"], m["l2g_value_projection"] = "l2l_key_projection", "l2l_value_projection"
    if share_qkv:
        m.update(global_query_projection="long_query_projection", g2g_key_projection="l2l_key_projection",
                 g2l_key_projection="l2l_key_projection", g2g_value_projection="l2l_value_projection",
                 g2l_value_projection="l2l_value_projection")
    elif share_kv:
        m["g2l_key_projection"], m["g2l_value_projection"] = "g2g_key_projection", "g2g_value_projection"
    out = {"long_output_projection": "long_output_projection",
           "global_output_projection": "long_output_projection" if share_out else "global_output_projection"}
    return m, out


def _spec(C, A, num_heads, vocab, roles, outs):
    spec = {}
    for key in sorted(set(roles.values()), key=ETC_ROLES.index):
        spec[f"{key}.linear.weight"], spec[f"{key}.linear.bias"] = (C, A), (A,)
    for key in dict.fromkeys(outs.values()):
        spec[f"{key}.weight"], spec[f"{key}.bias"] = (A, C), (C,)
    if vocab:
        for pre in (_LONG_REL, _GLOBAL_REL):
            spec[f"{pre}.relative_emb_table"] = (vocab, num_heads, A // num_heads)
            spec[f"{pre}.relative_bias_table"] = (vocab, num_heads)
    return spec


def _ids(a, name, shape, vocab):
    if a is None:
        return None
    a = np.asarray(a)
    if not np.issubdtype(a.dtype, np.integer):
        raise TypeError(f"{name} must be an integer array; got dtype {a.dtype}")
    if a.shape != shape:
        raise ValueError(f"{name} must have shape {shape}; got {a.shape}")
    if vocab is not None and (a.min() < 0 or a.max() >= vocab):
        raise ValueError(f"{name} must hold ids in [0, {vocab}); got [{a.min()}, {a.max()}]")
    return a.astype(np.int64)


def _attend(q, K, V, ids, add, table, scale):
    """Softmax attention with per-query key sets: ``q (B,h,N,d)``, ``K``/``V (B,h,N,M,d)``,
    ``ids (B,N,M)`` or None, ``add (B,N,M)`` additive mask (-inf excludes)."""
    s = np.einsum("bhnd,bhnmd->bhnm", q, K)
    if ids is not None:
        E, beta = table
        allrel = np.einsum("bhnd,vhd->bhnv", q, E) + beta.T[None, :, None, :]
        s = s + np.take_along_axis(allrel, np.broadcast_to(ids[:, None], s.shape), axis=-1)
    p, _ = softmax_lse(s * scale + add[:, None], axis=-1)
    return np.einsum("bhnm,bhnmd->bhnd", p, V), p


def _attend_backward(do, q, K, V, ids, p, table, scale, vocab):
    dp = np.einsum("bhnd,bhnmd->bhnm", do, V)
    dV = p[..., None] * do[:, :, :, None, :]
    ds = softmax_vjp(p, dp) * scale
    dq = np.einsum("bhnm,bhnmd->bhnd", ds, K)
    dK = ds[..., None] * q[:, :, :, None, :]
    dtab = None
    if ids is not None:
        E, _ = table
        onehot = (ids[..., None] == np.arange(vocab)).astype(q.dtype)          # (B, N, M, V)
        dall = np.einsum("bhnm,bnmv->bhnv", ds, onehot)
        dq = dq + np.einsum("bhnv,vhd->bhnd", dall, E)
        dtab = (np.einsum("bhnv,bhnd->vhd", dall, q), np.einsum("bhnv->vh", dall))
    return dq, dK, dV, dtab


def etc_global_local_attention_forward(long_input, global_input, params, *, num_heads: int, local_radius: int,
                                       l2l_att_mask=None, g2g_att_mask=None, l2g_att_mask=None, g2l_att_mask=None,
                                       l2l_relative_att_ids=None, g2g_relative_att_ids=None,
                                       l2g_relative_att_ids=None, g2l_relative_att_ids=None,
                                       share_kv_projections: bool = False, share_qkv_projections: bool = False,
                                       share_att_output_projection: bool = False, mask_value: float = -10000.0):
    r"""ETC fused global–local attention (upstream ``FusedGlobalLocalAttention.call``).

    ``long_input (B, N_l, C)``, ``global_input (B, N_g, C)``; masks (0/1 ints or bools) and
    relative ids (ints) as upstream: ``l2l_*`` in band storage ``(B, N_l, 2r+1)``, ``g2g_*``
    ``(B, N_g, N_g)``, ``l2g_*`` ``(B, N_l, N_g)``, ``g2l_*`` ``(B, N_g, N_l)``. Ids need the
    relative tables in ``params`` (see :func:`init_etc_params`); the long pair and the global pair
    of ids are each both given or both omitted. Returns ``(out (B, N_g + N_l, C), cache)`` with
    ``out[:, :N_g]`` the global and ``out[:, N_g:]`` the long output."""
    xl = as_float(long_input, "long_input", ndim=3)
    xg = as_float(global_input, "global_input", ndim=3)
    B, Nl, C = xl.shape
    if xg.shape[0] != B or xg.shape[2] != C:
        raise ValueError(f"global_input must have shape (B={B}, N_g, C={C}); got {xg.shape} "
                         "(refattn needs equal long and global hidden sizes)")
    Ng = xg.shape[1]
    h = check_int(num_heads, "num_heads", minimum=1)
    r = check_int(local_radius, "local_radius", minimum=1)
    roles, outs = _role_keys(bool(share_kv_projections), bool(share_qkv_projections), bool(share_att_output_projection))
    if not isinstance(params, dict) or "long_query_projection.linear.weight" not in params:
        raise ValueError("params must be a dict with 'long_query_projection.linear.weight' (C, A) and the other "
                         "projections (see init_etc_params)")
    wq = np.shape(params["long_query_projection.linear.weight"])
    if len(wq) != 2 or wq[0] != C:
        raise ValueError(f"long_query_projection.linear.weight must have shape (C={C}, A); got {wq}")
    A = wq[1]
    if A % h:
        raise ValueError(f"num_heads ({h}) must divide the attention width A = {A}")
    vocab = 0
    if f"{_LONG_REL}.relative_emb_table" in params:
        ts = np.shape(params[f"{_LONG_REL}.relative_emb_table"])
        if len(ts) != 3 or ts[0] < 1:
            raise ValueError(f"{_LONG_REL}.relative_emb_table must have shape (V, {h}, {A // h}); got {ts}")
        vocab = ts[0]
    dt = np.result_type(xl.dtype, xg.dtype)
    p = cast_all(dt, check_params(params, _spec(C, A, h, vocab, roles, outs), where="etc_global_local_attention"))
    W = 2 * r + 1
    ids = {"l2l": _ids(l2l_relative_att_ids, "l2l_relative_att_ids", (B, Nl, W), vocab),
           "l2g": _ids(l2g_relative_att_ids, "l2g_relative_att_ids", (B, Nl, Ng), vocab),
           "g2g": _ids(g2g_relative_att_ids, "g2g_relative_att_ids", (B, Ng, Ng), vocab),
           "g2l": _ids(g2l_relative_att_ids, "g2l_relative_att_ids", (B, Ng, Nl), vocab)}
    for a, b_ in (("l2l", "l2g"), ("g2g", "g2l")):
        if (ids[a] is None) != (ids[b_] is None):
            raise ValueError(f"{a}_relative_att_ids and {b_}_relative_att_ids must be both given or both omitted")
    if any(v is not None for v in ids.values()) and not vocab:
        raise ValueError(f"relative ids need params '{_LONG_REL}.relative_emb_table' and the other tables")
    masks = {}
    for name, m, shape in (("l2l", l2l_att_mask, (B, Nl, W)), ("l2g", l2g_att_mask, (B, Nl, Ng)),
                           ("g2g", g2g_att_mask, (B, Ng, Ng)), ("g2l", g2l_att_mask, (B, Ng, Nl))):
        if m is None:
            masks[name] = np.ones(shape, dtype=bool)
            continue
        m = np.asarray(m)
        if m.shape != shape:
            raise ValueError(f"{name}_att_mask must have shape {shape}; got {m.shape}")
        if not (m.dtype == np.bool_ or np.issubdtype(m.dtype, np.integer)) or not ((m == 0) | (m == 1)).all():
            raise ValueError(f"{name}_att_mask must hold only 0/1 (or bool) values")
        masks[name] = m.astype(bool)
    mv = dt.type(mask_value)
    band, inside = etc_band_indices(Nl, r)

    proj = {role: split_heads(linear_prefixed(p, f"{key}.linear", xl if role in (
        "long_query_projection", "l2l_key_projection", "l2l_value_projection", "g2l_key_projection",
        "g2l_value_projection") else xg), h) for role, key in roles.items()}
    scale = dt.type(1.0 / np.sqrt(A // h))
    # long queries: [band of long keys || all global keys]
    kl, vl = proj["l2l_key_projection"], proj["l2l_value_projection"]
    kg, vg = proj["l2g_key_projection"], proj["l2g_value_projection"]
    KL = np.concatenate([kl[:, :, band], np.broadcast_to(kg[:, :, None], (B, h, Nl, Ng, A // h))], axis=3)
    VL = np.concatenate([vl[:, :, band], np.broadcast_to(vg[:, :, None], (B, h, Nl, Ng, A // h))], axis=3)
    addL = np.concatenate([np.where(inside, np.where(masks["l2l"], 0.0, mv), -np.inf),
                           np.where(masks["l2g"], 0.0, mv)], axis=-1).astype(dt)
    idsL = None if ids["l2l"] is None else np.concatenate([ids["l2l"], ids["l2g"]], axis=-1)
    tabL = None if not vocab else (p[f"{_LONG_REL}.relative_emb_table"], p[f"{_LONG_REL}.relative_bias_table"])
    qL = proj["long_query_projection"]
    oL, pL = _attend(qL, KL, VL, idsL, addL, tabL, scale)
    # global queries: [all global keys || all long keys]
    kgg, vgg = proj["g2g_key_projection"], proj["g2g_value_projection"]
    kgl, vgl = proj["g2l_key_projection"], proj["g2l_value_projection"]
    KG = np.broadcast_to(np.concatenate([kgg, kgl], axis=2)[:, :, None], (B, h, Ng, Ng + Nl, A // h))
    VG = np.broadcast_to(np.concatenate([vgg, vgl], axis=2)[:, :, None], (B, h, Ng, Ng + Nl, A // h))
    addG = np.concatenate([np.where(masks["g2g"], 0.0, mv), np.where(masks["g2l"], 0.0, mv)], axis=-1).astype(dt)
    idsG = None if ids["g2g"] is None else np.concatenate([ids["g2g"], ids["g2l"]], axis=-1)
    tabG = None if not vocab else (p[f"{_GLOBAL_REL}.relative_emb_table"], p[f"{_GLOBAL_REL}.relative_bias_table"])
    qG = proj["global_query_projection"]
    oG, pG = _attend(qG, KG, VG, idsG, addG, tabG, scale)
    mL, mG = merge_heads(oL), merge_heads(oG)
    yl = linear_prefixed(p, outs["long_output_projection"], mL)
    yg = linear_prefixed(p, outs["global_output_projection"], mG)
    out = np.concatenate([yg, yl], axis=1)
    cache = {"p": p, "xl": xl, "xg": xg, "roles": roles, "outs": outs, "proj": proj, "band": band, "h": h,
             "KL": KL, "VL": VL, "KG": KG, "VG": VG, "pL": pL, "pG": pG, "idsL": idsL, "idsG": idsG,
             "tabL": tabL, "tabG": tabG, "scale": scale, "vocab": vocab, "mL": mL, "mG": mG,
             "dtype": dt, "shape": out.shape, "Ng": Ng}
    return out, cache


def etc_global_local_attention_backward(dout, cache) -> dict:
    """Gradients of :func:`etc_global_local_attention_forward` w.r.t. ``long_input``,
    ``global_input`` and every parameter (shared projections accumulate all their roles)."""
    dt = cache["dtype"]
    dout = as_dout(dout, cache["shape"], dt)
    p, roles, outs, proj, h, Ng = (cache[k] for k in ("p", "roles", "outs", "proj", "h", "Ng"))
    xl, xg = cache["xl"], cache["xg"]
    B, Nl, _ = xl.shape
    grads: dict = {}
    dmG = linear_prefixed_vjp(grads, p, outs["global_output_projection"], dout[:, :Ng], cache["mG"])
    dmL = linear_prefixed_vjp(grads, p, outs["long_output_projection"], dout[:, Ng:], cache["mL"])
    vocab, scale = cache["vocab"], cache["scale"]
    dqL, dKL, dVL, dtabL = _attend_backward(split_heads(dmL, h), proj["long_query_projection"], cache["KL"],
                                            cache["VL"], cache["idsL"], cache["pL"], cache["tabL"], scale, vocab)
    dqG, dKG, dVG, dtabG = _attend_backward(split_heads(dmG, h), proj["global_query_projection"], cache["KG"],
                                            cache["VG"], cache["idsG"], cache["pG"], cache["tabG"], scale, vocab)
    W = cache["band"].shape[1]
    dproj = {"long_query_projection": dqL, "global_query_projection": dqG}
    for role, src in (("l2l_key_projection", dKL), ("l2l_value_projection", dVL)):
        acc = np.zeros(proj[role].shape, dtype=dt)
        np.add.at(acc, (slice(None), slice(None), cache["band"]), src[:, :, :, :W])   # overlap-add of the band
        dproj[role] = acc
    dproj["l2g_key_projection"] = dKL[:, :, :, W:].sum(axis=2)
    dproj["l2g_value_projection"] = dVL[:, :, :, W:].sum(axis=2)
    dKGs, dVGs = dKG.sum(axis=2), dVG.sum(axis=2)
    dproj["g2g_key_projection"], dproj["g2l_key_projection"] = dKGs[:, :, :Ng], dKGs[:, :, Ng:]
    dproj["g2g_value_projection"], dproj["g2l_value_projection"] = dVGs[:, :, :Ng], dVGs[:, :, Ng:]
    dxl = np.zeros_like(xl)
    dxg = np.zeros_like(xg)
    for role, key in roles.items():
        reads_long = role in ("long_query_projection", "l2l_key_projection", "l2l_value_projection",
                              "g2l_key_projection", "g2l_value_projection")
        d = linear_prefixed_vjp(grads, p, f"{key}.linear", merge_heads(dproj[role]), xl if reads_long else xg)
        if reads_long:
            dxl += d
        else:
            dxg += d
    if vocab:
        for pre, dtab in ((_LONG_REL, dtabL), (_GLOBAL_REL, dtabG)):
            grads[f"{pre}.relative_emb_table"] = dtab[0] if dtab is not None else np.zeros_like(p[f"{pre}.relative_emb_table"])
            grads[f"{pre}.relative_bias_table"] = dtab[1] if dtab is not None else np.zeros_like(p[f"{pre}.relative_bias_table"])
    out = {"long_input": dxl, "global_input": dxg}
    out.update({k: np.asarray(grads[k], dtype=dt) for k in p})
    return out


def etc_global_local_attention(long_input, global_input, params, **config) -> np.ndarray:
    """Convenience wrapper: the output of :func:`etc_global_local_attention_forward`."""
    return etc_global_local_attention_forward(long_input, global_input, params, **config)[0]


def init_etc_params(rng, C: int, num_heads: int, *, relative_vocab_size: int | None = None,
                    share_kv_projections: bool = False, share_qkv_projections: bool = False,
                    share_att_output_projection: bool = False, scale: float = 1.0) -> dict:
    """Random parameters with upstream's layer names (attention width = ``C``); relative tables
    ``(V, H, C/H)`` and ``(V, H)`` when ``relative_vocab_size`` is given."""
    roles, outs = _role_keys(share_kv_projections, share_qkv_projections, share_att_output_projection)
    spec = _spec(C, C, num_heads, relative_vocab_size or 0, roles, outs)
    return {k: scale * rng.standard_normal(s) / (np.sqrt(s[0]) if k.endswith("weight") else 2.0)
            for k, s in spec.items()}


# =============================================================================================
# Registry record: sampler, explicit reference and identity checks (verification, not the math)
# =============================================================================================


def _sample_etc(rng, size):
    B, Nl, Ng, C, h, r, D = (2, 4, 2, 4, 2, 1, 1) if size == "tiny" else (2, 11, 3, 8, 2, 2, 3)
    vocab = 2 * D + 1
    if size == "tiny":
        p = init_etc_params(rng, C, h, relative_vocab_size=vocab, share_kv_projections=True)
    else:
        p = init_etc_params(rng, C, h, relative_vocab_size=vocab)
    keep = lambda shape: (rng.random(shape) < 0.7).astype(np.int64)  # noqa: E731
    m = {"l2l_att_mask": keep((B, Nl, 2 * r + 1)), "l2g_att_mask": keep((B, Nl, Ng)),
         "g2g_att_mask": keep((B, Ng, Ng)), "g2l_att_mask": keep((B, Ng, Nl))}
    m["l2l_att_mask"][:, :, r] = 1      # every long query sees itself; every global query one global key
    m["g2g_att_mask"][:, np.arange(Ng), np.arange(Ng)] = 1
    cfg = {"num_heads": h, "local_radius": r, **m,
           "l2l_relative_att_ids": np.broadcast_to(etc_local_relative_position_ids(Nl, r, D), (B, Nl, 2 * r + 1)).copy(),
           "g2g_relative_att_ids": np.broadcast_to(etc_relative_position_ids(Ng, D), (B, Ng, Ng)).copy(),
           "l2g_relative_att_ids": rng.integers(0, vocab, (B, Nl, Ng)),
           "g2l_relative_att_ids": rng.integers(0, vocab, (B, Ng, Nl))}
    if size == "tiny":
        cfg["share_kv_projections"] = True
    return Sample(inputs={"long_input": rng.standard_normal((B, Nl, C)),
                          "global_input": rng.standard_normal((B, Ng, C))}, params=p, config=cfg)


def _dense_etc(long_input, global_input, params, *, num_heads, local_radius, l2l_att_mask=None, g2g_att_mask=None,
               l2g_att_mask=None, g2l_att_mask=None, l2l_relative_att_ids=None, g2g_relative_att_ids=None,
               l2g_relative_att_ids=None, g2l_relative_att_ids=None, share_kv_projections=False,
               share_qkv_projections=False, share_att_output_projection=False, mask_value=-10000.0):
    """Explicit form: one dense (N_g + N_l)^2 score matrix per head with upstream's full-path
    conventions — the band mask skewed to N_l x N_l (non-band keys get mask_value), band ids
    skewed likewise — and plain loops over heads."""
    xl, xg = long_input, global_input
    B, Nl, C = xl.shape
    Ng = xg.shape[1]
    h, r = num_heads, local_radius
    roles, outs = _role_keys(share_kv_projections, share_qkv_projections, share_att_output_projection)
    lin = lambda role, x: x @ params[f"{roles[role]}.linear.weight"] + params[f"{roles[role]}.linear.bias"]  # noqa: E731
    one = lambda m, s: np.ones(s, dtype=int) if m is None else np.asarray(m)  # noqa: E731
    full_mask = np.zeros((B, Nl, Nl), dtype=int)
    full_ids = np.zeros((B, Nl, Nl), dtype=int)
    lm = one(l2l_att_mask, (B, Nl, 2 * r + 1))
    for i in range(Nl):
        for w in range(2 * r + 1):
            j = i - r + w
            if 0 <= j < Nl:
                full_mask[:, i, j] = lm[:, i, w]
                if l2l_relative_att_ids is not None:
                    full_ids[:, i, j] = l2l_relative_att_ids[:, i, w]
    A = params["long_query_projection.linear.weight"].shape[1]
    d = A // h
    out_g, out_l = np.zeros((B, Ng, A)), np.zeros((B, Nl, A))
    for side, q, keys, vals, mask, ids, pre in (
            ("long", lin("long_query_projection", xl), (lin("l2l_key_projection", xl), lin("l2g_key_projection", xg)),
             (lin("l2l_value_projection", xl), lin("l2g_value_projection", xg)),
             np.concatenate([full_mask, one(l2g_att_mask, (B, Nl, Ng))], -1),
             None if l2l_relative_att_ids is None else np.concatenate([full_ids, l2g_relative_att_ids], -1), _LONG_REL),
            ("global", lin("global_query_projection", xg), (lin("g2g_key_projection", xg), lin("g2l_key_projection", xl)),
             (lin("g2g_value_projection", xg), lin("g2l_value_projection", xl)),
             np.concatenate([one(g2g_att_mask, (B, Ng, Ng)), one(g2l_att_mask, (B, Ng, Nl))], -1),
             None if g2g_relative_att_ids is None else np.concatenate([g2g_relative_att_ids, g2l_relative_att_ids], -1),
             _GLOBAL_REL)):
        k, v = np.concatenate(keys, 1), np.concatenate(vals, 1)
        o = out_l if side == "long" else out_g
        for hh in range(h):
            sl = slice(hh * d, (hh + 1) * d)
            s = q[..., sl] @ np.swapaxes(k[..., sl], 1, 2)
            if ids is not None:
                s = s + np.einsum("bnd,bnmd->bnm", q[..., sl], params[f"{pre}.relative_emb_table"][ids, hh]) \
                    + params[f"{pre}.relative_bias_table"][ids, hh]
            s = s / np.sqrt(d) + mask_value * (1 - mask)
            e = np.exp(s - s.max(-1, keepdims=True))
            o[..., sl] = (e / e.sum(-1, keepdims=True)) @ v[..., sl]
    yl = out_l @ params[f"{outs['long_output_projection']}.weight"] + params[f"{outs['long_output_projection']}.bias"]
    yg = out_g @ params[f"{outs['global_output_projection']}.weight"] + params[f"{outs['global_output_projection']}.bias"]
    return np.concatenate([yg, yl], axis=1)


def _check_full_radius_shared_is_standard_attention(rng):
    """Upstream's stated special case: r >= N_l - 1, shared q/k/v and output projections, no ids,
    no masks give standard multi-head attention over [global ; long]."""
    from ..softmax.mha import mha

    B, Nl, Ng, C, h = 2, 6, 2, 8, 2
    p = init_etc_params(rng, C, h, share_qkv_projections=True, share_att_output_projection=True)
    xl, xg = rng.standard_normal((B, Nl, C)), rng.standard_normal((B, Ng, C))
    cfg = {"num_heads": h, "share_qkv_projections": True, "share_att_output_projection": True}
    ours = etc_global_local_attention(xl, xg, p, local_radius=Nl - 1, **cfg)
    mp = {"q_proj": p["long_query_projection.linear.weight"], "q_proj_bias": p["long_query_projection.linear.bias"],
          "k_proj": p["l2l_key_projection.linear.weight"], "k_proj_bias": p["l2l_key_projection.linear.bias"],
          "v_proj": p["l2l_value_projection.linear.weight"], "v_proj_bias": p["l2l_value_projection.linear.bias"],
          "out_proj": p["long_output_projection.weight"], "out_proj_bias": p["long_output_projection.bias"]}
    ref = mha(np.concatenate([xg, xl], 1), None, mp, num_heads=h)
    err = float(np.max(np.abs(ours - ref)))
    shorter = etc_global_local_attention(xl, xg, p, local_radius=2, **cfg)
    assert err < 1e-12 and np.max(np.abs(shorter - ref)) > 1e-3, err
    return err


def _check_relative_ids_match_upstream_examples(rng):
    """The id patterns of upstream's docstrings (max_distance 3): full ids for seq_len 6 and the
    band pattern [6, 6, 6, 5, 4, 0, 1, 2, 3, 3, 3] for local_radius 5."""
    full = etc_relative_position_ids(6, 3)
    want = np.array([[0, 1, 2, 3, 3, 3], [4, 0, 1, 2, 3, 3], [5, 4, 0, 1, 2, 3], [6, 5, 4, 0, 1, 2],
                     [6, 6, 5, 4, 0, 1], [6, 6, 6, 5, 4, 0]])
    band = etc_local_relative_position_ids(4, 5, 3)
    assert np.array_equal(full, want) and np.array_equal(band[0], [6, 6, 6, 5, 4, 0, 1, 2, 3, 3, 3])
    assert np.array_equal(etc_relative_position_ids(4, 2, ignore_direction=True)[3], [2, 2, 1, 0])
    return 0.0


def _check_gradients_equal_dense_form(rng):
    """The band (fast) form's gradients equal the dense form's, by central differences of the
    dense reference along a random direction (forward equality is the registry reference)."""
    from ._samples import reference_gradient_error

    err = reference_gradient_error(etc_global_local_attention_forward, etc_global_local_attention_backward, _dense_etc,
                                   _sample_etc(rng, "small"), rng)
    assert err < 1e-6, err
    return err


register(
    Mechanism(
        slug="etc_global_local_attention", family="4-linear-kernel-sparse", tier="T2",
        title="ETC global–local attention",
        paper="Ainslie, Ontañón, Alberti, Cvicek, Fisher, Pham, Ravula, Sanghai, Wang, Yang, 'ETC: Encoding Long "
              "and Structured Inputs in Transformers', EMNLP 2020, arXiv 2004.08483",
        seeds=("5-53",),
        official_code="google-research/google-research etcmodel/layers/attention.py"
                      "@0c1bbe5fc971a1de1a427debc814e66ab4f1e7fa",
        forward=etc_global_local_attention_forward, backward=etc_global_local_attention_backward,
        sample=_sample_etc, reference=_dense_etc,
        checks={"full_radius_shared_projections_is_standard_mha": _check_full_radius_shared_is_standard_attention,
                "relative_ids_match_upstream_examples": _check_relative_ids_match_upstream_examples,
                "band_gradients_equal_dense_form": _check_gradients_equal_dense_form},
        docs="linear/l6a.md#etc-global-local-attention",
    ),
)
